/* test_lora.c — LoRA adapters on a loaded model (model/lora.c, format/adapter.c):
 *   - PEFT's own adapters (tests/fixtures/lora, made by tools/gen_lora_golden.py:
 *     plain and rsLoRA, attention and MLP targets, layers_to_transform, a regex
 *     target_modules) on the llama and qwen3 golden bases, alone and stacked,
 *     against float64 reference logits (within the golden f32 tolerance);
 *   - with no adapter on a sequence the logits are bit-identical to the base
 *     model's, also with adapters loaded and beside a sequence that uses one in
 *     the same batch;
 *   - a batch mixing sequences with different adapters gives each sequence
 *     what it gets alone;
 *   - what cannot be honoured is refused with a message naming it: DoRA,
 *     modules_to_save, trained biases, shapes that do not fit the base,
 *     tensors the config does not target, modules outside the projections;
 *   - the routed experts of a MoE base (qwen3_moe): PEFT's target_parameters
 *     on the fused expert stacks and per-expert modules, alone and stacked,
 *     against the float64 reference of the fixture, on every device whose
 *     backend applies expert deltas (the CPU, CUDA); in a batch beside a
 *     sequence without adapters, which keeps its bits; expert tensors that
 *     fit neither stack, or that target_parameters does not name, refused. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json.h"
#include "engine/kv_cache.h"
#include "format/safetensors_write.h"
#include "model/model.h"
#include "test.h"
#include "test_device.h"

#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden"
#define LORA HEARTH_SOURCE_DIR "/tests/fixtures/lora"

static model *load_model(const char *dir) {
  herr err = {0};
  model *m = NULL;
  model_load_opts opts = {.threads = 2, .device = test_device()};
  if (model_load(dir, &opts, &m, &err)) {
    CHECK_MSG(0, "%s: %s", dir, err.msg);
    return NULL;
  }
  return m;
}

/* Every position's logits of n tokens in chunks of 7, with adapters a[0..na). */
static int run(model *m, const int32_t *toks, int n, model_lora *const *a, int na, float *out) {
  herr err = {0};
  model_kv_geometry geo;
  model_kv_geometry_of(m, &geo);
  kv_cache *c = NULL;
  kv_seq *s = NULL;
  if (kv_cache_new(&geo, 0, &c, &err) || kv_cache_seq_new(c, &s, &err)) {
    fprintf(stderr, "kv: %s\n", err.msg);
    kv_cache_free(c);
    return -1;
  }
  int64_t V = model_vocab_size(m);
  int rc = 0;
  for (int i = 0; i < n && !rc; i += 7) {
    int k = n - i < 7 ? n - i : 7;
    model_seq sq = {.kv = s, .tokens = toks + i, .n_tokens = k, .all_logits = true, .lora = (const model_lora *const *)a, .n_lora = na};
    model_batch b = {&sq, 1};
    rc = model_forward(m, &b, out + (size_t)i * V, &err);
    if (rc) fprintf(stderr, "forward: %s\n", err.msg);
  }
  kv_cache_seq_free(s);
  kv_cache_free(c);
  return rc;
}

static double max_diff(const float *a, const float *b, size_t n) {
  double d = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - (double)b[i]);
    if (!(e <= d)) d = isnan(e) ? INFINITY : e;
  }
  return d;
}

static int32_t *prompt_of(const json_t *doc, int p, int *n) {
  const json_t *a = json_array_get(json_object_get(doc, "prompts"), (size_t)p);
  *n = (int)json_array_size(a);
  int32_t *t = malloc(sizeof(int32_t) * (size_t)*n);
  for (int i = 0; i < *n; i++) t[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
  return t;
}

static float *read_floats(const char *path, size_t n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  float *x = malloc(sizeof(float) * n);
  size_t got = fread(x, sizeof(float), n, f);
  fclose(f);
  if (got != n) {
    free(x);
    return NULL;
  }
  return x;
}

/* LoRA on a MoE base's routed experts runs where the backend applies expert
 * deltas (bk_backend_expert_lora: the CPU and CUDA); on a backend that does
 * not, its loading is refused, which is then what is checked. True when
 * refused here. */
static bool experts_refused_here(model *m, const char *adapter) {
  const char *d = test_device();
  if (d && !strncmp(d, "cuda", 4))
    CHECK_MSG(bk_backend_expert_lora(model_backend(m)), "%s: the CUDA backend does not apply expert deltas", adapter);
  if (bk_backend_expert_lora(model_backend(m))) return false;
  herr err = {0};
  model_lora *a = NULL;
  int rc = model_lora_load(m, adapter, &a, &err);
  CHECK_MSG(rc != 0 && strstr(err.msg, "not supported"), "%s on %s: expected the experts' refusal, got %d (%s)", adapter,
            bk_backend_name(model_backend(m)), rc, err.msg);
  if (!rc) model_lora_release(a);
  return true;
}

/* ---- PEFT's adapters against the float64 references ---- */

static void check_fixture(const char *base) {
  char dir[512], path[600];
  snprintf(dir, sizeof dir, "%s/%s", LORA, base);
  snprintf(path, sizeof path, "%s/golden.json", dir);
  herr err = {0};
  json_t *doc = hjson_load_file(path, &err);
  CHECK_MSG(doc != NULL, "%s", err.msg);
  if (!doc) return;
  snprintf(path, sizeof path, "%s/%s", GOLDEN, base);
  model *m = load_model(path);
  if (!m) {
    json_decref(doc);
    return;
  }
  snprintf(path, sizeof path, "%s/experts", dir);
  if (!strcmp(base, "qwen3_moe-f32") && experts_refused_here(m, path)) {
    model_free(m);
    json_decref(doc);
    return;
  }
  int64_t V = model_vocab_size(m);
  int n0, n1;
  int32_t *p0 = prompt_of(doc, 0, &n0), *p1 = prompt_of(doc, 1, &n1);
  float *got = malloc(sizeof(float) * (size_t)(n0 + n1) * (size_t)V);
  float *base_logits = malloc(sizeof(float) * (size_t)(n0 + n1) * (size_t)V);
  CHECK(run(m, p0, n0, NULL, 0, base_logits) == 0 && run(m, p1, n1, NULL, 0, base_logits + (size_t)n0 * V) == 0);
  size_t i;
  const json_t *cs;
  json_array_foreach(json_object_get(doc, "cases"), i, cs) {
    const json_t *names = json_object_get(cs, "adapters");
    model_lora *a[MODEL_MAX_LORA] = {0};
    int na = 0;
    char label[64] = "";
    for (size_t j = 0; j < json_array_size(names) && j < MODEL_MAX_LORA; j++) {
      const char *nm = json_string_value(json_array_get(names, j));
      snprintf(path, sizeof path, "%s/%s", dir, nm);
      int rc = model_lora_load(m, path, &a[na], &err);
      CHECK_MSG(rc == 0, "%s: %s", path, err.msg);
      if (rc) break;
      na++;
      snprintf(label + strlen(label), sizeof label - strlen(label), "%s%s", j ? "+" : "", nm);
    }
    if (na == (int)json_array_size(names)) {
      snprintf(path, sizeof path, "%s/%s", dir, json_string_value(json_object_get(cs, "logits_file")));
      float *ref = read_floats(path, (size_t)(n0 + n1) * (size_t)V);
      CHECK_MSG(ref != NULL, "%s: cannot read", path);
      if (ref && run(m, p0, n0, a, na, got) == 0 && run(m, p1, n1, a, na, got + (size_t)n0 * V) == 0) {
        size_t total = (size_t)(n0 + n1) * (size_t)V;
        double d = max_diff(got, ref, total), moved = max_diff(base_logits, ref, total);
        fprintf(stderr, "  %-10s %-9s max abs error %.3g (tol 1e-4); the adapters move the logits by up to %.3g\n", base, label, d,
                moved);
        CHECK_MSG(d <= 1e-4, "%s %s: max abs error %.3g", base, label, d);
        CHECK_MSG(moved > 0.05, "%s %s: the adapter hardly changes the logits (%.3g): the fixture tests nothing", base, label, moved);
      } else
        CHECK_MSG(0, "%s %s: forward failed", base, label);
      free(ref);
    }
    for (int j = 0; j < na; j++) model_lora_release(a[j]);
  }
  free(got), free(base_logits), free(p0), free(p1);
  model_free(m);
  json_decref(doc);
}

static void test_peft_fixtures(void) {
  check_fixture("llama-f32");
  check_fixture("qwen3-f32");
  check_fixture("qwen3_moe-f32");
}

/* ---- refusals ---- */

static const char *tmp_root(void) {
  static char root[256];
  if (!root[0]) {
    snprintf(root, sizeof root, "/tmp/hearth_test_lora_%d", (int)getpid());
    mkdir(root, 0755);
  }
  return root;
}

/* An adapter folder with config text and one module's A [r, in] / B [out, r]. */
static void write_adapter(const char *dir, const char *config, const char *module, int64_t r, int64_t in, int64_t out,
                          const char *extra_tensor) {
  mkdir(dir, 0755);
  char path[700];
  snprintf(path, sizeof path, "%s/adapter_config.json", dir);
  FILE *f = fopen(path, "w");
  fputs(config, f);
  fclose(f);
  float *a = calloc((size_t)(r * in), sizeof(float)), *b = calloc((size_t)(out * r), sizeof(float));
  uint32_t x = 12345u + (uint32_t)(r * 7 + in * 3 + out);
  for (int64_t i = 0; i < r * in; i++) x = x * 1664525u + 1013904223u, a[i] = 0.6f * ((float)(x >> 8) / 16777216.0f - 0.5f);
  for (int64_t i = 0; i < out * r; i++) x = x * 1664525u + 1013904223u, b[i] = 0.6f * ((float)(x >> 8) / 16777216.0f - 0.5f);
  st_writer *w = st_writer_new();
  char na[400], nb[400];
  snprintf(na, sizeof na, "base_model.model.%s.lora_A.weight", module);
  snprintf(nb, sizeof nb, "base_model.model.%s.lora_B.weight", module);
  st_writer_tensor(w, na, ST_F32, 2, (int64_t[]){r, in}, a);
  st_writer_tensor(w, nb, ST_F32, 2, (int64_t[]){out, r}, b);
  if (extra_tensor) st_writer_tensor(w, extra_tensor, ST_F32, 1, (int64_t[]){4}, a);
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  herr err = {0};
  if (st_writer_write(w, path, NULL, NULL, &err)) fprintf(stderr, "write %s: %s\n", path, err.msg);
  st_writer_free(w);
  free(a), free(b);
}

/* ---- no adapter: bit-identical; mixed batches ---- */

static void test_base_unchanged_and_mixed(void) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/llama-f32", GOLDEN);
  model *m = load_model(dir);
  if (!m) return;
  int64_t V = model_vocab_size(m);
  int32_t toks[2][12];
  for (int i = 0; i < 12; i++) toks[0][i] = 3 + 37 * i % 500, toks[1][i] = 5 + 53 * i % 500;
  float *before = malloc(sizeof(float) * 12 * (size_t)V), *after = malloc(sizeof(float) * 12 * (size_t)V);
  CHECK(run(m, toks[0], 12, NULL, 0, before) == 0);
  herr err = {0};
  model_lora *a = NULL, *b = NULL;
  char path[600];
  snprintf(path, sizeof path, "%s/mixed_a", tmp_root());
  write_adapter(path, "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]}", "model.layers.0.self_attn.q_proj", 4, 64, 64,
                NULL);
  CHECK_MSG(model_lora_load(m, path, &a, &err) == 0, "%s", err.msg);
  snprintf(path, sizeof path, "%s/mixed_b", tmp_root());
  write_adapter(path, "{\"r\": 2, \"lora_alpha\": 4, \"use_rslora\": true, \"target_modules\": [\"down_proj\"]}",
                "model.layers.1.mlp.down_proj", 2, 128, 64, NULL);
  CHECK_MSG(model_lora_load(m, path, &b, &err) == 0, "%s", err.msg);
  if (!a || !b) goto out;
  CHECK(model_lora_id(a) != 0 && model_lora_id(b) != 0 && model_lora_id(a) != model_lora_id(b));
  CHECK(model_lora_set_id((const model_lora *const[]){a, b}, 2) != model_lora_set_id((const model_lora *const[]){a}, 1));
  CHECK(model_lora_refs(a) == 1);
  /* adapters loaded, none used: the very same bits */
  CHECK(run(m, toks[0], 12, NULL, 0, after) == 0);
  CHECK_MSG(memcmp(before, after, sizeof(float) * 12 * (size_t)V) == 0, "logits without an adapter changed once adapters were loaded");

  /* one batch: seq 0 with a, seq 1 with nothing, seq 2 with b; against each alone */
  {
    model_kv_geometry geo;
    model_kv_geometry_of(m, &geo);
    kv_cache *c = NULL;
    kv_seq *s[3] = {0};
    CHECK(kv_cache_new(&geo, 0, &c, &err) == 0);
    for (int i = 0; i < 3; i++) CHECK(kv_cache_seq_new(c, &s[i], &err) == 0);
    model_lora *la[1] = {a}, *lb[1] = {b};
    float *mixed = malloc(sizeof(float) * 36 * (size_t)V), *plain = malloc(sizeof(float) * 36 * (size_t)V);
    for (int pass = 0; pass < 2; pass++) {
      for (int i = 0; i < 3; i++) kv_cache_seq_truncate(s[i], 0);
      model_seq sq[3] = {
          {.kv = s[0], .tokens = toks[0], .n_tokens = 12, .all_logits = true, .lora = (const model_lora *const *)la, .n_lora = pass ? 0 : 1},
          {.kv = s[1], .tokens = toks[1], .n_tokens = 12, .all_logits = true},
          {.kv = s[2], .tokens = toks[1], .n_tokens = 12, .all_logits = true, .lora = (const model_lora *const *)lb, .n_lora = pass ? 0 : 1}};
      model_batch bt = {sq, 3};
      CHECK_MSG(model_forward(m, &bt, pass ? plain : mixed, &err) == 0, "%s", err.msg);
    }
    /* the sequence without an adapter: the same bits as in a batch where nobody uses one */
    CHECK_MSG(memcmp(mixed + 12 * V, plain + 12 * V, sizeof(float) * 12 * (size_t)V) == 0,
              "a sequence without an adapter changed beside sequences with one");
    float *alone = malloc(sizeof(float) * 12 * (size_t)V);
    CHECK(run(m, toks[0], 12, la, 1, alone) == 0);
    double da = max_diff(mixed, alone, 12 * (size_t)V), moved = max_diff(mixed, plain, 12 * (size_t)V);
    CHECK(run(m, toks[1], 12, lb, 1, alone) == 0);
    double db = max_diff(mixed + 24 * V, alone, 12 * (size_t)V);
    fprintf(stderr, "  mixed batch: adapter a %.3g, adapter b %.3g from each alone (a moves logits by %.3g)\n", da, db, moved);
    CHECK(da <= 1e-4 && db <= 1e-4 && moved > 0.05);
    free(alone), free(mixed), free(plain);
    for (int i = 0; i < 3; i++) kv_cache_seq_free(s[i]);
    kv_cache_free(c);
  }
out:
  model_lora_release(a);
  model_lora_release(b);
  free(before), free(after);
  model_free(m);
}

static void expect_refusal(model *m, const char *name, const char *config, const char *module, int64_t r, int64_t in, int64_t out,
                           const char *extra, const char *want);

/* Expert deltas in a mixed batch: the sequence without an adapter keeps the base's bits, the
 * one with the experts adapter gets what it gets alone; expert tensors that fit no stack or
 * that the config does not name are refused. */
static void test_experts(void) {
  char dir[512], path[700];
  snprintf(dir, sizeof dir, "%s/qwen3_moe-f32", GOLDEN);
  model *m = load_model(dir);
  if (!m) return;
  int64_t V = model_vocab_size(m);
  herr err = {0};
  model_lora *a = NULL;
  snprintf(path, sizeof path, "%s/qwen3_moe-f32/experts", LORA);
  if (experts_refused_here(m, path)) {
    model_free(m);
    return;
  }
  CHECK_MSG(model_lora_load(m, path, &a, &err) == 0, "%s", err.msg);
  if (a) {
    int32_t toks[2][10];
    for (int i = 0; i < 10; i++) toks[0][i] = 7 + 41 * i % 500, toks[1][i] = 11 + 29 * i % 500;
    float *base = malloc(sizeof(float) * 10 * (size_t)V), *alone = malloc(sizeof(float) * 10 * (size_t)V);
    float *mixed = malloc(sizeof(float) * 20 * (size_t)V), *plain = malloc(sizeof(float) * 20 * (size_t)V);
    CHECK(run(m, toks[1], 10, NULL, 0, base) == 0);
    model_lora *la[1] = {a};
    CHECK(run(m, toks[0], 10, la, 1, alone) == 0);
    model_kv_geometry geo;
    model_kv_geometry_of(m, &geo);
    kv_cache *c = NULL;
    kv_seq *s0 = NULL, *s1 = NULL;
    CHECK(kv_cache_new(&geo, 0, &c, &err) == 0 && kv_cache_seq_new(c, &s0, &err) == 0 && kv_cache_seq_new(c, &s1, &err) == 0);
    model_seq sq[2] = {{.kv = s0, .tokens = toks[0], .n_tokens = 10, .all_logits = true, .lora = (const model_lora *const *)la, .n_lora = 1},
                       {.kv = s1, .tokens = toks[1], .n_tokens = 10, .all_logits = true}};
    model_batch bt = {sq, 2};
    CHECK_MSG(model_forward(m, &bt, mixed, &err) == 0, "%s", err.msg);
    /* the same batch with nobody under an adapter: the second sequence's bits */
    kv_cache_seq_truncate(s0, 0), kv_cache_seq_truncate(s1, 0);
    sq[0].n_lora = 0;
    CHECK_MSG(model_forward(m, &bt, plain, &err) == 0, "%s", err.msg);
    CHECK_MSG(memcmp(mixed + 10 * V, plain + 10 * V, sizeof(float) * 10 * (size_t)V) == 0,
              "a sequence without an adapter changed beside one with expert deltas");
    CHECK(max_diff(plain + 10 * V, base, 10 * (size_t)V) <= 1e-4);
    double d = max_diff(mixed, alone, 10 * (size_t)V);
    CHECK_MSG(d <= 1e-4, "the experts adapter in a mixed batch: %.3g from alone", d);
    kv_cache_seq_free(s0), kv_cache_seq_free(s1), kv_cache_free(c);
    free(base), free(alone), free(mixed), free(plain);
    model_lora_release(a);
  }
  /* a fused expert pair of 8 experts × rank 2 that fits gate_up_proj [8, 64, 64] loads; one that fits nothing does not */
  static const char *cfg = "{\"r\": 2, \"lora_alpha\": 4, \"target_modules\": [], "
                           "\"target_parameters\": [\"mlp.experts.gate_up_proj\"]}";
  snprintf(path, sizeof path, "%s/fused_ok", tmp_root());
  write_adapter(path, cfg, "model.layers.1.mlp.experts", 16, 64, 64, NULL);
  a = NULL;
  CHECK_MSG(model_lora_load(m, path, &a, &err) == 0, "%s", err.msg);
  if (a) CHECK(model_lora_rank(a) == 2);
  model_lora_release(a);
  expect_refusal(m, "fused_shape", cfg, "model.layers.1.mlp.experts", 16, 64, 50, NULL, "fit neither");
  expect_refusal(m, "fused_unnamed",
                 "{\"r\": 2, \"lora_alpha\": 4, \"target_modules\": [], \"target_parameters\": [\"mlp.experts.down_proj\"]}",
                 "model.layers.1.mlp.experts", 16, 64, 64, NULL, "target_parameters");
  expect_refusal(m, "expert_index", "{\"r\": 2, \"lora_alpha\": 4, \"target_modules\": [\"gate_proj\"]}",
                 "model.layers.0.mlp.experts.9.gate_proj", 2, 64, 32, NULL, "expert 9");
  model_free(m);
}

static void expect_refusal(model *m, const char *name, const char *config, const char *module, int64_t r, int64_t in, int64_t out,
                           const char *extra, const char *needle) {
  char dir[400];
  snprintf(dir, sizeof dir, "%s/%s", tmp_root(), name);
  write_adapter(dir, config, module, r, in, out, extra);
  model_lora *a = NULL;
  herr err = {0};
  int rc = model_lora_load(m, dir, &a, &err);
  CHECK_MSG(rc != 0 && a == NULL, "%s: loaded", name);
  CHECK_MSG(strstr(err.msg, needle) != NULL, "%s: message '%s' does not name '%s'", name, err.msg, needle);
  if (a) model_lora_release(a);
}

static void test_refusals(void) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/llama-f32", GOLDEN);
  model *m = load_model(dir);
  if (!m) return;
  const char *q = "model.layers.0.self_attn.q_proj";
  expect_refusal(m, "dora", "{\"r\": 4, \"lora_alpha\": 8, \"use_dora\": true, \"target_modules\": [\"q_proj\"]}", q, 4, 64, 64, NULL,
                 "use_dora");
  expect_refusal(m, "save", "{\"r\": 4, \"lora_alpha\": 8, \"modules_to_save\": [\"lm_head\"], \"target_modules\": [\"q_proj\"]}", q, 4,
                 64, 64, NULL, "modules_to_save");
  expect_refusal(m, "bias", "{\"r\": 4, \"lora_alpha\": 8, \"bias\": \"all\", \"target_modules\": [\"q_proj\"]}", q, 4, 64, 64, NULL,
                 "bias");
  expect_refusal(m, "alora", "{\"r\": 4, \"lora_alpha\": 8, \"alora_invocation_tokens\": [5, 6], \"target_modules\": [\"q_proj\"]}", q, 4,
                 64, 64, NULL, "alora_invocation_tokens");
  expect_refusal(m, "shape", "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]}", q, 4, 32, 64, NULL, "do not fit");
  expect_refusal(m, "rank", "{\"r\": 8, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]}", q, 4, 64, 64, NULL, "rank 4");
  expect_refusal(m, "untargeted", "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"v_proj\"]}", q, 4, 64, 64, NULL, "target_modules");
  expect_refusal(m, "layers", "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], \"layers_to_transform\": [1]}", q, 4, 64,
                 64, NULL, "layers_to_transform");
  expect_refusal(m, "regex", "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": \".*\\\\.v_proj\"}", q, 4, 64, 64, NULL, "target_modules");
  expect_refusal(m, "embed", "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"embed_tokens\"]}", "model.embed_tokens", 4, 512, 64,
                 NULL, "outside the decoder layers");
  expect_refusal(m, "experts", "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"gate_proj\"]}", "model.layers.0.mlp.experts.3.gate_proj",
                 4, 64, 128, NULL, "expert");
  expect_refusal(m, "magnitude", "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]}", q, 4, 64, 64,
                 "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector", "DoRA");
  expect_refusal(m, "layer", "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]}", "model.layers.7.self_attn.q_proj", 4, 64,
                 64, NULL, "layer 7");
  /* and a good one loads */
  char good[400];
  snprintf(good, sizeof good, "%s/good", tmp_root());
  write_adapter(good, "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": \"model\\\\.layers\\\\.0\\\\.self_attn\\\\.q_proj\"}", q, 4, 64, 64, NULL);
  model_lora *a = NULL;
  herr err = {0};
  CHECK_MSG(model_lora_load(m, good, &a, &err) == 0, "%s", err.msg);
  if (a) {
    CHECK(model_lora_rank(a) == 4 && model_lora_modules(a) == 1);
    model_lora_retain(a);
    CHECK(model_lora_refs(a) == 2);
    model_lora_release(a);
    model_lora_release(a);
  }
  model_free(m);
}

/* A hybrid MoE base (qwen3.5-moe: linear-attention layers, a gated full-attention layer whose
 * q_proj holds query and gate rows, experts beside a shared expert): the shared expert and the
 * gated q_proj take adapters and change the logits; what the layers do not have is refused. */
static void test_hybrid_moe(void) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/qwen3_5_moe-f32", GOLDEN);
  model *m = load_model(dir);
  if (!m) return;
  expect_refusal(m, "dense", "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"gate_proj\"]}", "model.layers.1.mlp.gate_proj", 4, 64,
                 48, NULL, "has no");
  expect_refusal(m, "linear", "{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]}", "model.layers.0.self_attn.q_proj", 4, 64,
                 128, NULL, "computes no");
  const char *ok[][2] = {{"model.layers.1.mlp.shared_expert.gate_proj", "48"}, {"model.layers.1.self_attn.q_proj", "128"}};
  int64_t V = model_vocab_size(m);
  int32_t toks[9];
  for (int i = 0; i < 9; i++) toks[i] = 3 + 41 * i % 500;
  float *base = malloc(sizeof(float) * 9 * (size_t)V), *with = malloc(sizeof(float) * 9 * (size_t)V);
  CHECK(run(m, toks, 9, NULL, 0, base) == 0);
  for (int i = 0; i < 2; i++) {
    char ad[400];
    snprintf(ad, sizeof ad, "%s/hybrid%d", tmp_root(), i);
    write_adapter(ad, "{\"r\": 4, \"lora_alpha\": 8}", ok[i][0], 4, 64, atoi(ok[i][1]), NULL);
    model_lora *a = NULL;
    herr err = {0};
    CHECK_MSG(model_lora_load(m, ad, &a, &err) == 0, "%s: %s", ok[i][0], err.msg);
    if (!a) continue;
    CHECK(run(m, toks, 9, &a, 1, with) == 0);
    double moved = max_diff(base, with, 9 * (size_t)V);
    fprintf(stderr, "  qwen3_5_moe %s: the adapter moves the logits by %.3g\n", ok[i][0], moved);
    CHECK(moved > 1e-3 && isfinite(moved));
    model_lora_release(a);
  }
  free(base), free(with);
  model_free(m);
}

static void cleanup(void) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root());
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmp_root());
}

int main(void) {
  test_device_or_skip();
  RUN(test_refusals);
  RUN(test_base_unchanged_and_mixed);
  RUN(test_peft_fixtures);
  RUN(test_hybrid_moe);
  RUN(test_experts);
  cleanup();
  TEST_MAIN_END();
}
