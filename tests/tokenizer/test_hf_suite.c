/* test_hf_suite.c — llama.cpp's tokenizer test vectors (ggml-vocab-qwen2 and
 * ggml-vocab-llama-bpe .inp/.out, llama.cpp's, fetched into .deps) through the
 * corresponding tokenizer.json files (qwen3 and llama3_1): inputs separated
 * by "\n__ggml_vocab_test__\n", expected ids one line per input, encoded
 * without special tokens. */
#include "base/file.h"
#include "hf_check.h"

/* tok_name NULL: load the .gguf itself through tokenizer_load (the GGUF dispatch). */
static void run_suite(const char *vocab, const char *tok_name) {
  char inp[1024], outp[1024], tpath[1024];
  snprintf(inp, sizeof inp, "%s/llama.cpp/vocab/%s.inp", HEARTH_DEPS_DIR, vocab);
  snprintf(outp, sizeof outp, "%s/llama.cpp/vocab/%s.out", HEARTH_DEPS_DIR, vocab);
  if (tok_name) snprintf(tpath, sizeof tpath, "%s/tokenizers/%s/tokenizer.json", HEARTH_DEPS_DIR, tok_name);
  else snprintf(tpath, sizeof tpath, "%s/llama.cpp/vocab/%s", HEARTH_DEPS_DIR, vocab);
  if (!hfile_exists(inp) || !hfile_exists(tpath)) {
    fprintf(stderr, "  %s: skipped (missing %s)\n", vocab, hfile_exists(inp) ? tpath : inp);
    return;
  }
  char *in = NULL, *out = NULL;
  size_t inlen = 0, outlen = 0;
  herr e = {0};
  CHECK(hfile_read(inp, &in, &inlen, &e) == 0);
  CHECK(hfile_read(outp, &out, &outlen, &e) == 0);
  tokenizer *t = NULL;
  if (tok_name) t = load_tokenizer_json_only(tpath);
  else CHECK_MSG(tokenizer_load(tpath, &t, &e) == 0, "%s", e.msg);
  CHECK(t != NULL);
  if (!in || !out || !t) goto done;
  static const char sep[] = "\n__ggml_vocab_test__\n";
  const char *p = in, *end = in + inlen, *line = out, *oend = out + outlen;
  int count = 0, bad = 0;
  while (p < end) {
    const char *q = memmem(p, (size_t)(end - p), sep, sizeof sep - 1);
    if (!q) break;
    const char *nl = memchr(line, '\n', (size_t)(oend - line));
    if (!nl) nl = oend;
    /* expected ids */
    int32_t want[4096];
    size_t nwant = 0;
    for (const char *s = line; s < nl && nwant < 4096;) {
      while (s < nl && *s == ' ') s++;
      if (s >= nl) break;
      want[nwant++] = (int32_t)strtol(s, (char **)&s, 10);
    }
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tokenizer_encode(t, p, (size_t)(q - p), false, false, &ids, &n, &e);
    bool same = rc == 0 && n == nwant && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    if (!same && bad++ < 5) {
      fprintf(stderr, "  %s input %d \"%.*s\" differs\n", vocab, count, (int)(q - p > 80 ? 80 : q - p), p);
      print_ids("got ", ids, n);
    }
    free(ids);
    count++;
    p = q + sizeof sep - 1;
    line = nl < oend ? nl + 1 : oend;
  }
  fprintf(stderr, "  %s with %s: %d inputs, %d differ\n", vocab, tok_name ? tok_name : "its own vocabulary", count, bad);
  CHECK(count >= 40); /* the files hold 46 inputs */
  CHECK_EQ_INT(bad, 0);
done:
  free(in);
  free(out);
  tokenizer_free(t);
}

static void test_qwen2_suite(void) { run_suite("ggml-vocab-qwen2.gguf", "qwen3"); }
static void test_llama_bpe_suite(void) { run_suite("ggml-vocab-llama-bpe.gguf", "llama3_1"); }

/* tokenizer_load on a .gguf goes to the GGUF vocabulary (gguf_vocab.c). */
static void test_gguf_dispatch(void) {
  run_suite("ggml-vocab-gpt-2.gguf", NULL);
  run_suite("ggml-vocab-llama-spm.gguf", NULL);
}

int main(void) {
  test_need_tokenizers();
  RUN(test_qwen2_suite);
  RUN(test_llama_bpe_suite);
  RUN(test_gguf_dispatch);
  TEST_MAIN_END();
}
