/* End-to-end tests of `hearth logits`: runs the built binary on golden
 * fixtures (tests/fixtures/golden, from transformers via
 * tools/gen_golden.py) and compares the printed JSON with the reference
 * logits (also under an expert budget smaller than one layer's experts);
 * checks usage errors and bad ids exit with a message, and --adapter
 * against the LoRA fixtures' PEFT reference. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "base/buf.h"
#include "test.h"

#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden/"
#define LORA HEARTH_SOURCE_DIR "/tests/fixtures/lora/llama-f32/"

/* Runs the binary with args (shell-quoted by the caller); stdout into out, stderr into err. */
static int run(const char *args, hbuf *out, hbuf *err) {
  char cmd[8192], errpath[64];
  snprintf(errpath, sizeof errpath, "/tmp/hearth_logits_err_%d.txt", (int)getpid());
  snprintf(cmd, sizeof cmd, "'%s' logits %s 2>%s", HEARTH_BINARY, args, errpath);
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

/* Reads n floats from the start of path into rows. */
static int load_rows(const char *path, float *rows, size_t n) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  size_t got = fread(rows, sizeof(float), n, f);
  fclose(f);
  return got == n ? 0 : -1;
}

/* Reads the golden prompt 0 ids and its reference rows. */
static int load_golden(const char *name, json_t **doc, float **ref, int64_t *vocab) {
  char path[512];
  snprintf(path, sizeof path, GOLDEN "%s/golden.json", name);
  json_error_t je;
  *doc = json_load_file(path, 0, &je);
  if (!*doc) return -1;
  *vocab = json_integer_value(json_object_get(*doc, "vocab_size"));
  size_t n0 = json_array_size(json_array_get(json_object_get(*doc, "prompts"), 0));
  snprintf(path, sizeof path, GOLDEN "%s/logits_f32.bin", name);
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  *ref = malloc(n0 * (size_t)*vocab * sizeof(float));
  size_t got = fread(*ref, sizeof(float), n0 * (size_t)*vocab, f);
  fclose(f);
  return got == n0 * (size_t)*vocab ? 0 : -1;
}

/* Runs `hearth logits` on golden fixture name's prompt 0 (with extra
 * arguments) and returns the largest absolute difference from the reference
 * rows: the fixture's logits_f32.bin, or ref_file's first rows when given. */
static double model_error(const char *name, bool all, const char *extra, const char *ref_file) {
  json_t *doc = NULL;
  float *ref = NULL;
  int64_t V = 0;
  double worst = INFINITY;
  if (load_golden(name, &doc, &ref, &V) || (ref_file && load_rows(ref_file, ref, (size_t)V *
                                                  json_array_size(json_array_get(json_object_get(doc, "prompts"), 0))))) {
    CHECK_MSG(0, "%s: golden fixture unreadable", name);
    json_decref(doc);
    free(ref);
    return worst;
  }
  json_t *prompt = json_array_get(json_object_get(doc, "prompts"), 0);
  size_t n = json_array_size(prompt);
  hbuf ids = {0}, out = {0}, err = {0};
  for (size_t i = 0; i < n; i++) hbuf_printf(&ids, "%s%lld", i ? "," : "", (long long)json_integer_value(json_array_get(prompt, i)));
  char args[4096];
  snprintf(args, sizeof args, "--model '" GOLDEN "%s' --ids %s%s%s", name, hbuf_str(&ids), all ? " --all" : "", extra);
  int st = run(args, &out, &err);
  CHECK_MSG(st == 0, "%s: exit %d: %s", name, st, hbuf_str(&err));
  json_error_t je;
  json_t *res = json_loads(hbuf_str(&out), 0, &je);
  CHECK_MSG(res != NULL, "%s: output is not JSON: %s", name, je.text);
  if (res) {
    json_t *rows = json_object_get(res, "logits");
    CHECK_EQ_INT(json_array_size(rows), all ? n : 1);
    CHECK_EQ_INT(json_integer_value(json_object_get(res, "vocab_size")), V);
    CHECK_EQ_INT(json_array_size(json_object_get(res, "ids")), n);
    worst = 0;
    for (size_t r = 0; r < json_array_size(rows); r++) {
      json_t *row = json_array_get(rows, r);
      size_t ref_row = all ? r : n - 1;
      CHECK_EQ_INT(json_array_size(row), V);
      for (int64_t v = 0; v < V && v < (int64_t)json_array_size(row); v++) {
        double e = fabs(json_number_value(json_array_get(row, (size_t)v)) - ref[ref_row * (size_t)V + (size_t)v]);
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
      }
    }
  }
  json_decref(res);
  hbuf_free(&ids);
  hbuf_free(&out);
  hbuf_free(&err);
  json_decref(doc);
  free(ref);
  return worst;
}

static void check_model(const char *name, bool all, const char *extra) {
  double worst = model_error(name, all, extra, NULL);
  CHECK_MSG(worst <= 1e-4, "%s%s: max abs error %g", name, extra, worst);
}

/* --adapter: the logits under the LoRA fixtures' adapters (one, and two
 * stacked) match PEFT's merged float64 reference, and differ from the base's. */
static void test_adapters(void) {
  static const struct {
    const char *extra, *ref;
  } cases[] = {
      {" --adapter '" LORA "plain'", LORA "logits_plain.bin"},
      {" --adapter '" LORA "rs'", LORA "logits_rs.bin"},
      {" --adapter '" LORA "plain' --adapter '" LORA "rs'", LORA "logits_plain+rs.bin"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    double with = model_error("llama-f32", true, cases[c].extra, cases[c].ref);
    CHECK_MSG(with <= 1e-4, "%s: max abs error %g", cases[c].extra, with);
    double base = model_error("llama-f32", true, "", cases[c].ref);
    CHECK_MSG(base > 0.1 && isfinite(base), "%s: the base's logits are %g from the adapter's", cases[c].extra, base);
  }
  hbuf out = {0}, err = {0};
  CHECK_EQ_INT(run("--model '" GOLDEN "llama-f32' --ids 3 --adapter /nonexistent/adapter", &out, &err), 1);
  CHECK(strstr(hbuf_str(&err), "/nonexistent/adapter") != NULL);
  hbuf_clear(&out), hbuf_clear(&err);
  CHECK_EQ_INT(run("--help", &out, &err), 0);
  CHECK(strstr(hbuf_str(&out), "--adapter DIR") != NULL);
  hbuf_free(&out);
  hbuf_free(&err);
}

static void test_logits_match_reference(void) {
  check_model("llama-f32", true, "");
  check_model("gemma3-f32", false, "");
  check_model("phi3-f32", true, "");
  check_model("qwen3_moe-f32", true, "");
  check_model("gemma4-f32", true, "");
  check_model("gemma4_moe-f32", false, "");
  /* one expert of the fixture is 24 KiB, a layer's 8 experts 192 KiB */
  check_model("qwen3_moe-f32", true, " --expert-budget 30000");
}

static void test_errors(void) {
  hbuf out = {0}, err = {0};
  CHECK_EQ_INT(run("--model '" GOLDEN "llama-f32' --ids 1,x", &out, &err), 2);
  CHECK(strstr(hbuf_str(&err), "--ids") != NULL);
  hbuf_clear(&out), hbuf_clear(&err);
  CHECK_EQ_INT(run("--model '" GOLDEN "llama-f32'", &out, &err), 2);
  hbuf_clear(&out), hbuf_clear(&err);
  CHECK_EQ_INT(run("--model '" GOLDEN "llama-f32' --ids 3,512", &out, &err), 1);
  CHECK(strstr(hbuf_str(&err), "512") != NULL);
  hbuf_clear(&out), hbuf_clear(&err);
  CHECK_EQ_INT(run("--model /nonexistent/model --ids 3", &out, &err), 1);
  CHECK(strstr(hbuf_str(&err), "/nonexistent/model") != NULL);
  hbuf_clear(&out), hbuf_clear(&err);
  CHECK_EQ_INT(run("--model '" GOLDEN "qwen3_moe-f32' --ids 3 --expert-budget lots", &out, &err), 2);
  CHECK(strstr(hbuf_str(&err), "--expert-budget") != NULL);
  hbuf_clear(&out), hbuf_clear(&err);
  CHECK_EQ_INT(run("--help", &out, &err), 0);
  CHECK(strstr(hbuf_str(&out), "usage: hearth logits") != NULL);
  hbuf_free(&out);
  hbuf_free(&err);
}

int main(void) {
  RUN(test_logits_match_reference);
  RUN(test_adapters);
  RUN(test_errors);
  TEST_MAIN_END();
}
