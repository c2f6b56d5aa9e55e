/* End-to-end tests of `hearth logits`: runs the built binary on golden
 * fixtures (tests/fixtures/golden, from transformers via
 * tools/gen_golden.py) and compares the printed JSON with the reference
 * logits (also under an expert budget smaller than one layer's experts);
 * checks usage errors and bad ids exit with a message, --adapter
 * against the LoRA fixtures' PEFT reference, and --canvas on the
 * block-diffusion fixture: the first pass against transformers' decoder
 * logits, the self-conditioned passes against passes this test forms itself
 * (its own softmax over the temperature of transformers' schedule). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "base/buf.h"
#include "engine/kv_cache.h"
#include "model/model.h"
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
  CHECK(strstr(hbuf_str(&out), "--adapter [NAME=]DIR") != NULL);
  hbuf_free(&out);
  /* NAME=DIR, as serve takes it */
  double named = model_error("llama-f32", true, " --adapter 'plain=" LORA "plain'", LORA "logits_plain.bin");
  CHECK_MSG(named <= 1e-4, "--adapter plain=DIR: max abs error %g", named);
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

#define DIFF GOLDEN "diffusion_gemma-f32"

/* The fixture's generation_config.json leaves the schedule unset: transformers' defaults. */
#define DIFF_STEPS 48
#define DIFF_T_MIN 0.4
#define DIFF_T_MAX 0.8

static float *json_rows(const json_t *rows, size_t *n_rows, size_t V) {
  *n_rows = json_array_size(rows);
  float *x = calloc(*n_rows * V + 1, sizeof(float));
  for (size_t r = 0; r < *n_rows; r++) {
    const json_t *row = json_array_get(rows, r);
    CHECK_EQ_INT(json_array_size(row), V);
    for (size_t v = 0; v < V && v < json_array_size(row); v++) x[r * V + v] = (float)json_number_value(json_array_get(row, v));
  }
  return x;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
  double d = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - (double)b[i]);
    if (!(e <= d)) d = isnan(e) ? INFINITY : e;
  }
  return d;
}

/* What the denoiser's next pass takes: softmax(x / t) per row, in double. */
static void softmax_over(const float *x, float *p, size_t rows, size_t V, double t) {
  for (size_t r = 0; r < rows; r++) {
    double mx = -INFINITY, s = 0;
    for (size_t v = 0; v < V; v++) mx = fmax(mx, x[r * V + v] / t);
    for (size_t v = 0; v < V; v++) s += exp(x[r * V + v] / t - mx);
    for (size_t v = 0; v < V; v++) p[r * V + v] = (float)(exp(x[r * V + v] / t - mx) / s);
  }
}

/* steps canvas passes through the model itself, each self-conditioned on the last at its
 * step's temperature (the schedule counts down from DIFF_STEPS); out: the last pass's rows. */
static int own_passes(model *m, const int32_t *prompt, size_t np, const int32_t *canvas, size_t C, int steps, float *out) {
  model_kv_geometry g;
  model_kv_geometry_of(m, &g);
  size_t V = (size_t)model_vocab_size(m);
  herr err = {0};
  kv_cache *c = NULL;
  kv_seq *s = NULL;
  float *p = malloc(sizeof(float) * C * V);
  int rc = kv_cache_new(&g, (int64_t)(np + C), &c, &err);
  if (!rc) rc = kv_cache_seq_new(c, &s, &err);
  model_seq enc = {.kv = s, .tokens = prompt, .n_tokens = (int)np, .out = MODEL_OUT_NONE};
  model_batch be = {&enc, 1};
  if (!rc) rc = model_forward(m, &be, NULL, &err);
  model_seq dec = {.kv = s, .tokens = canvas, .n_tokens = (int)C, .all_logits = true, .canvas = true};
  model_batch bd = {&dec, 1};
  for (int k = 1; k <= steps && !rc; k++) {
    if (k > 1) {
      int step = DIFF_STEPS - (k - 1) + 1; /* the pass before's step number */
      softmax_over(out, p, C, V, DIFF_T_MIN + (DIFF_T_MAX - DIFF_T_MIN) * step / DIFF_STEPS);
      dec.self_cond = p;
    }
    rc = model_forward(m, &bd, out, &err);
  }
  CHECK_MSG(rc == 0, "own passes: %s", err.msg);
  free(p);
  if (s) kv_cache_seq_free(s);
  kv_cache_free(c);
  return rc;
}

/* --canvas: transformers' decoder logits for the fixture's cases; --steps 2 / 3 and
 * --self-condition-from-step 1 as this test's own self-conditioned passes. */
static void test_canvas(void) {
  herr e = {0};
  json_error_t je;
  json_t *doc = json_load_file(DIFF "/golden.json", 0, &je);
  model *m = NULL;
  model_load_opts opts = {.threads = 2};
  CHECK_MSG(doc && model_load(DIFF, &opts, &m, &e) == 0, "diffusion fixture: %s", e.msg);
  if (!doc || !m) {
    json_decref(doc);
    return;
  }
  size_t V = (size_t)model_vocab_size(m), C = (size_t)model_canvas_length(m);
  FILE *f = fopen(DIFF "/logits_f32.bin", "rb");
  const json_t *cases = json_object_get(doc, "decoder_cases");
  for (size_t k = 0; k < json_array_size(cases) && f; k++) {
    const json_t *cs = json_array_get(cases, k), *pr = json_object_get(cs, "prompt"), *cv = json_object_get(cs, "canvas");
    size_t np = json_array_size(pr), nc = json_array_size(cv);
    CHECK_EQ_INT(nc, C);
    int32_t *prompt = malloc(sizeof(int32_t) * np), *canvas = malloc(sizeof(int32_t) * (nc + 1));
    hbuf ids = {0}, cids = {0};
    for (size_t i = 0; i < np; i++) prompt[i] = (int32_t)json_integer_value(json_array_get(pr, i));
    for (size_t i = 0; i < nc; i++) canvas[i] = (int32_t)json_integer_value(json_array_get(cv, i));
    for (size_t i = 0; i < np; i++) hbuf_printf(&ids, "%s%d", i ? "," : "", (int)prompt[i]);
    for (size_t i = 0; i < nc; i++) hbuf_printf(&cids, "%s%d", i ? "," : "", (int)canvas[i]);
    /* the reference's first pass */
    float *ref = malloc(sizeof(float) * C * V);
    fseek(f, (long)(sizeof(float) * (size_t)json_integer_value(json_object_get(json_object_get(cs, "logits"), "offset"))), SEEK_SET);
    CHECK_EQ_INT(fread(ref, sizeof(float), C * V, f), C * V);
    double tol = 2e-4 * json_number_value(json_object_get(cs, "max_abs")) + 1e-4;
    static const char *const how[] = {"", " --self-condition-from-step 1", " --steps 2", " --steps 3"};
    static const int steps[] = {1, 2, 2, 3};
    for (size_t h = 0; h < sizeof how / sizeof how[0]; h++) {
      char args[4096];
      snprintf(args, sizeof args, "--model '" DIFF "' --ids %s --canvas %s%s", hbuf_str(&ids), hbuf_str(&cids), how[h]);
      hbuf out = {0}, err = {0};
      int st = run(args, &out, &err);
      CHECK_MSG(st == 0, "case %zu%s: exit %d: %s", k, how[h], st, hbuf_str(&err));
      json_t *res = json_loads(hbuf_str(&out), 0, &je);
      CHECK_MSG(res != NULL, "case %zu%s: output is not JSON", k, how[h]);
      size_t rows = 0;
      float *first = json_rows(json_object_get(res, "logits"), &rows, V);
      CHECK_EQ_INT(rows, C);
      CHECK_EQ_INT(json_array_size(json_object_get(res, "canvas")), C);
      double d = max_abs_diff(first, ref, C * V);
      CHECK_MSG(d <= tol, "case %zu%s: the first pass differs from transformers' by %g (tol %g)", k, how[h], d, tol);
      const json_t *sc = json_object_get(res, "self_conditioned");
      CHECK_MSG((steps[h] > 1) == (sc != NULL), "case %zu%s: self_conditioned %s", k, how[h], sc ? "present" : "missing");
      if (sc) {
        CHECK_EQ_INT(json_integer_value(json_object_get(sc, "step")), steps[h]);
        float *last = json_rows(json_object_get(sc, "logits"), &rows, V), *own = malloc(sizeof(float) * C * V);
        CHECK_EQ_INT(rows, C);
        if (!own_passes(m, prompt, np, canvas, C, steps[h], own)) {
          d = max_abs_diff(last, own, C * V);
          CHECK_MSG(d <= 1e-4, "case %zu%s: the self-conditioned pass differs from the test's by %g", k, how[h], d);
          CHECK_MSG(max_abs_diff(last, first, C * V) > 1e-3, "case %zu%s: self-conditioning changed nothing", k, how[h]);
        }
        free(last);
        free(own);
      }
      free(first);
      json_decref(res);
      hbuf_free(&out);
      hbuf_free(&err);
    }
    free(ref);
    free(prompt);
    free(canvas);
    hbuf_free(&ids);
    hbuf_free(&cids);
  }
  if (f) fclose(f);
  model_free(m);
  json_decref(doc);
  /* what is refused */
  static const struct {
    const char *args, *says;
    int status;
  } bad[] = {
      {"--model '" GOLDEN "llama-f32' --ids 1,2 --canvas 1,2,3,4,5,6,7,8", "block-diffusion", 1},
      {"--model '" DIFF "' --ids 1,2 --canvas 1,2,3", "canvas", 1},
      {"--model '" DIFF "' --ids 1,2 --steps 2", "--canvas", 2},
      {"--model '" DIFF "' --ids 1,2 --canvas 1,2,3,4,5,6,7,8 --steps 49", "max_denoising_steps", 1},
      {"--model '" DIFF "' --ids 1,2 --canvas 1,2,3,4,5,6,7,8 --self-condition-from-step 2", "--self-condition-from-step", 2},
      {"--model '" DIFF "' --ids 1,2 --canvas 1,2,3,4,5,6,7,999", "999", 1},
      {"--model '" DIFF "' --ids 1,2 --canvas 1,2,3,4,5,6,7,8 --all", "--all", 2},
  };
  for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
    hbuf out = {0}, err = {0};
    int st = run(bad[b].args, &out, &err);
    CHECK_MSG(st == bad[b].status && strstr(hbuf_str(&err), bad[b].says), "%s: exit %d: %s", bad[b].args, st, hbuf_str(&err));
    hbuf_free(&out);
    hbuf_free(&err);
  }
}

int main(void) {
  RUN(test_canvas);
  RUN(test_logits_match_reference);
  RUN(test_adapters);
  RUN(test_errors);
  TEST_MAIN_END();
}
