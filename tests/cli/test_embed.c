/* End-to-end tests of `hearth embed`: runs the built binary on the golden
 * qwen3 model (tests/fixtures/golden/qwen3-f32) and compares the printed
 * vectors with transformers' reference embeddings (embedding.json, from
 * tools/gen_embed_golden.py); checks --dimensions, and that usage errors
 * exit 2 with a message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "base/buf.h"
#include "test.h"

#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden/qwen3-f32"

static int run(const char *args, hbuf *out, hbuf *err) {
  char cmd[8192], errpath[64];
  snprintf(errpath, sizeof errpath, "/tmp/hearth_embed_err_%d.txt", (int)getpid());
  snprintf(cmd, sizeof cmd, "'%s' embed %s 2>%s", HEARTH_BINARY, args, errpath);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) hbuf_append(out, buf, n);
  int st = pclose(p);
  FILE *e = fopen(errpath, "r");
  if (e) {
    while ((n = fread(buf, 1, sizeof buf, e)) > 0) hbuf_append(err, buf, n);
    fclose(e);
  }
  remove(errpath);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_reference(void) {
  json_error_t je;
  json_t *ref = json_load_file(GOLDEN "/embedding.json", 0, &je);
  CHECK_MSG(ref != NULL, "%s", je.text);
  if (!ref) return;
  json_t *inputs = json_object_get(ref, "inputs"), *embs = json_object_get(ref, "embeddings");
  hbuf args = {0};
  hbuf_printf(&args, "--model '%s'", GOLDEN);
  size_t n = json_array_size(inputs), total = 0, i;
  json_t *a;
  json_array_foreach(inputs, i, a) {
    hbuf_puts(&args, " --ids ");
    for (size_t j = 0; j < json_array_size(a); j++)
      hbuf_printf(&args, "%s%lld", j ? "," : "", (long long)json_integer_value(json_array_get(a, j)));
    total += json_array_size(a);
  }
  hbuf out = {0}, err = {0};
  CHECK_EQ_INT(run(hbuf_str(&args), &out, &err), 0);
  json_t *got = json_loads(hbuf_str(&out), 0, &je);
  CHECK_MSG(got != NULL, "output is not JSON: %s (stderr: %s)", hbuf_str(&out), hbuf_str(&err));
  if (got) {
    CHECK_EQ_INT(json_integer_value(json_object_get(got, "prompt_tokens")), total);
    json_t *ge = json_object_get(got, "embeddings");
    CHECK_EQ_INT(json_array_size(ge), n);
    for (i = 0; i < n && i < json_array_size(ge); i++) {
      json_t *g = json_array_get(ge, i), *r = json_array_get(embs, i);
      CHECK_EQ_INT(json_array_size(g), json_array_size(r));
      double d = 0;
      for (size_t j = 0; j < json_array_size(r); j++) {
        double e = fabs(json_number_value(json_array_get(g, j)) - json_number_value(json_array_get(r, j)));
        if (!(e <= d)) d = e;
      }
      CHECK_MSG(d <= 1e-4, "input %zu: max abs error %.3g", i, d);
    }
    json_decref(got);
  }
  /* --dimensions 8: eight values of unit norm */
  hbuf_clear(&out);
  hbuf_clear(&err);
  hbuf_clear(&args);
  hbuf_printf(&args, "--model '%s' --ids 1,17,230 --dimensions 8", GOLDEN);
  CHECK_EQ_INT(run(hbuf_str(&args), &out, &err), 0);
  got = json_loads(hbuf_str(&out), 0, &je);
  CHECK(got != NULL);
  if (got) {
    json_t *v = json_array_get(json_object_get(got, "embeddings"), 0);
    CHECK_EQ_INT(json_array_size(v), 8);
    double ss = 0;
    for (size_t j = 0; j < json_array_size(v); j++) ss += pow(json_number_value(json_array_get(v, j)), 2);
    CHECK_NEAR(ss, 1.0, 1e-5);
    json_decref(got);
  }
  json_decref(ref);
  hbuf_free(&args);
  hbuf_free(&out);
  hbuf_free(&err);
}

static void test_usage(void) {
  static const char *const cases[][3] = {
      {"--model '" GOLDEN "'", "at least one input", "2"},
      {"--model '" GOLDEN "' --ids 1 --dimensions 0", "--dimensions", "2"},
      {"--model '" GOLDEN "' --ids 1 --dimensions 65", "more than the model", "2"},
      {"--model '" GOLDEN "' --ids 1,x", "--ids", "2"},
      {"--model '" GOLDEN "' --ids 100000", "outside the vocabulary", "1"},
      {"--model '" GOLDEN "' --bogus", "unknown option", "2"},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    hbuf out = {0}, err = {0};
    int rc = run(cases[k][0], &out, &err);
    CHECK_MSG(rc == atoi(cases[k][2]), "case %zu: exit %d", k, rc);
    CHECK_MSG(strstr(hbuf_str(&err), cases[k][1]) != NULL, "case %zu: stderr '%s'", k, hbuf_str(&err));
    hbuf_free(&out);
    hbuf_free(&err);
  }
}

int main(void) {
  test_reference();
  test_usage();
  printf("test_embed (cli): %d checks, %d failures\n", test_checks, test_failures);
  return test_failures ? 1 : 0;
}
