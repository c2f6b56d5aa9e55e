/* test_hf_cli.c — `hearth tokenize` / `hearth detokenize` as tools call them:
 * --batch in both directions, --no-special, single text and ids, output JSON
 * with non-ASCII characters written as UTF-8, checked against the HF fixtures
 * for qwen3 and llama2. Skips when the binary or the tokenizers are absent. */
#include <unistd.h>

#include "hf_check.h"

static char *run_capture(const char *cmd, int *status) {
  FILE *p = popen(cmd, "r");
  if (!p) return NULL;
  hbuf b = {0};
  char chunk[65536];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, p)) > 0) hbuf_append(&b, chunk, n);
  *status = pclose(p);
  return hbuf_take(&b);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

static void check_model(const char *name, json_t *corpus) {
  char dir[1024], epath[1024];
  snprintf(dir, sizeof dir, "%s/tokenizers/%s", HEARTH_DEPS_DIR, name);
  snprintf(epath, sizeof epath, FIX_DIR "expected_%s.json", name);
  if (!hfile_is_dir(dir)) return;
  json_t *exp = load_json_file(epath);
  CHECK(exp != NULL);
  if (!exp) return;
  /* the first 80 corpus strings as a batch */
  json_t *texts = json_array(), *ids = json_array();
  for (size_t i = 0; i < 80 && i < json_array_size(corpus); i++) {
    json_array_append(texts, json_array_get(corpus, i));
    json_array_append(ids, json_array_get(json_object_get(exp, "encode_special"), i));
  }
  char tfile[] = "/tmp/hearth_tok_cli_XXXXXX", ifile[] = "/tmp/hearth_tok_cli_XXXXXX";
  int fd1 = mkstemp(tfile), fd2 = mkstemp(ifile);
  if (fd1 >= 0) close(fd1);
  if (fd2 >= 0) close(fd2);
  json_dump_file(texts, tfile, JSON_COMPACT);
  json_dump_file(ids, ifile, JSON_COMPACT);
  char cmd[4096];
  int st;
  for (int special = 1; special >= 0; special--) {
    snprintf(cmd, sizeof cmd, "'%s' tokenize --model '%s' --batch '%s' %s", HEARTH_BINARY, dir, tfile,
             special ? "" : "--no-special");
    char *out = run_capture(cmd, &st);
    CHECK_EQ_INT(st, 0);
    json_t *got = out ? json_loads(out, 0, NULL) : NULL;
    CHECK_MSG(json_is_array(got), "%s: not a JSON array: %.200s", cmd, out ? out : "");
    const json_t *want = json_object_get(exp, special ? "encode_special" : "encode_plain");
    int bad = 0;
    for (size_t i = 0; i < json_array_size(texts); i++) {
      const json_t *g = json_array_get(got, i);
      size_t n = json_array_size(g);
      int32_t *v = json_ids(g, &n);
      bad += !ids_equal(v, n, json_array_get(want, i));
      free(v);
    }
    CHECK_MSG(bad == 0, "%s: %d of %zu differ", cmd, bad, json_array_size(texts));
    json_decref(got);
    free(out);
  }
  snprintf(cmd, sizeof cmd, "'%s' detokenize --model '%s' --batch '%s'", HEARTH_BINARY, dir, ifile);
  char *out = run_capture(cmd, &st);
  CHECK_EQ_INT(st, 0);
  json_t *got = out ? json_loads(out, JSON_ALLOW_NUL, NULL) : NULL;
  CHECK_MSG(json_is_array(got), "%s: not a JSON array", cmd);
  int bad = 0;
  for (size_t i = 0; i < json_array_size(ids); i++) {
    const json_t *g = json_array_get(got, i), *w = json_array_get(json_object_get(exp, "decode"), i);
    bad += !(json_is_string(g) && json_string_length(g) == json_string_length(w) &&
             memcmp(json_string_value(g), json_string_value(w), json_string_length(w)) == 0);
  }
  CHECK_MSG(bad == 0, "%s: %d strings differ", cmd, bad);
  /* non-ASCII is written as UTF-8, not \u escapes */
  CHECK(out && strstr(out, "\\u4f60") == NULL && strstr(out, "\\u4F60") == NULL);
  json_decref(got);
  free(out);
  unlink(tfile);
  unlink(ifile);
  json_decref(texts);
  json_decref(ids);
  json_decref(exp);
}

static void test_cli_batch(void) {
  if (access(HEARTH_BINARY, X_OK) != 0) {
    fprintf(stderr, "  skipped: %s not built\n", HEARTH_BINARY);
    return;
  }
  json_t *corpus = load_json_file(FIX_DIR "corpus.json");
  if (!corpus) return;
  check_model("qwen3", corpus);
  check_model("llama2", corpus);
  json_decref(corpus);
}

static void test_cli_single(void) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s/tokenizers/qwen3", HEARTH_DEPS_DIR);
  if (access(HEARTH_BINARY, X_OK) != 0 || !hfile_is_dir(dir)) return;
  char cmd[2048];
  int st;
  snprintf(cmd, sizeof cmd, "'%s' tokenize --model '%s' 'Hello world'", HEARTH_BINARY, dir);
  char *out = run_capture(cmd, &st);
  CHECK_EQ_INT(st, 0);
  CHECK_EQ_STR(out, "[9707,1879]\n");
  free(out);
  snprintf(cmd, sizeof cmd, "'%s' detokenize --model '%s' 9707 1879 220 108386", HEARTH_BINARY, dir);
  out = run_capture(cmd, &st);
  CHECK_EQ_INT(st, 0);
  CHECK_EQ_STR(out, "\"Hello world 你好\"\n");
  free(out);
  snprintf(cmd, sizeof cmd, "'%s' tokenize --model /nonexistent/model x 2>&1", HEARTH_BINARY);
  out = run_capture(cmd, &st);
  CHECK(st != 0);
  CHECK(out && strstr(out, "/nonexistent/model") != NULL);
  free(out);
  snprintf(cmd, sizeof cmd, "'%s' detokenize --model '%s' 12 abc 2>&1", HEARTH_BINARY, dir);
  out = run_capture(cmd, &st);
  CHECK(st != 0);
  CHECK(out && strstr(out, "abc") != NULL);
  free(out);
}

int main(void) {
  test_need_tokenizers();
  RUN(test_cli_batch);
  RUN(test_cli_single);
  TEST_MAIN_END();
}
