/* test_fuse.c — `hearth fuse BASE ADAPTER OUT`: the llama-f32 golden base
 * fused with PEFT's adapters (tests/fixtures/lora) gives the float64
 * reference logits of base + adapter (the same tolerance as the golden
 * test) and matches the base with the adapter applied at run time; every
 * tensor keeps its name, shape and dtype (f32, and bf16 for the bf16 base,
 * whose fused logits stay near base + adapter); the config and other files
 * are copied; a GGUF file, a quantized folder and an adapter that does not
 * fit the base are refused with messages that say why. On the MoE base
 * (qwen3_moe), an adapter made per expert module fuses into the stored
 * per-expert matrices and gives what the expert deltas give at run time
 * (two paths: the merge in double, the deltas in bk_moe); one on the fused
 * stacks (target_parameters) is refused. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "base/json.h"
#include "engine/kv_cache.h"
#include "format/safetensors.h"
#include "model/model.h"
#include "test.h"

#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden"
#define LORA HEARTH_SOURCE_DIR "/tests/fixtures/lora"

static char tmp[256];

static int run(const char *cmd) {
  char full[2048];
  snprintf(full, sizeof full, "%s 2>%s/stderr.txt", cmd, tmp);
  int rc = system(full);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static char *last_stderr(void) {
  char p[300], *s = NULL;
  size_t n;
  snprintf(p, sizeof p, "%s/stderr.txt", tmp);
  if (hfile_read(p, &s, &n, NULL)) return strdup("");
  return s;
}

/* Every position's logits of the golden prompt 0 (20 tokens) for the model at dir, with adapter
 * folder `adapter` applied at run time when not NULL. */
static float *logits_of(const char *dir, const char *adapter, const int32_t *toks, int n) {
  herr err = {0};
  model *m = NULL;
  model_load_opts o = {.threads = 2};
  if (model_load(dir, &o, &m, &err)) {
    fprintf(stderr, "%s: %s\n", dir, err.msg);
    return NULL;
  }
  model_lora *a = NULL;
  if (adapter && model_lora_load(m, adapter, &a, &err)) {
    fprintf(stderr, "%s: %s\n", adapter, err.msg);
    model_free(m);
    return NULL;
  }
  model_kv_geometry g;
  model_kv_geometry_of(m, &g);
  kv_cache *c = NULL;
  kv_seq *s = NULL;
  float *out = malloc(sizeof(float) * (size_t)n * (size_t)model_vocab_size(m));
  const model_lora *la[1] = {a};
  model_seq sq = {.tokens = toks, .n_tokens = n, .all_logits = true, .lora = la, .n_lora = a ? 1 : 0};
  model_batch b = {&sq, 1};
  if (kv_cache_new(&g, 0, &c, &err) || kv_cache_seq_new(c, &s, &err) || ((sq.kv = s), model_forward(m, &b, out, &err))) {
    fprintf(stderr, "forward: %s\n", err.msg);
    free(out);
    out = NULL;
  }
  kv_cache_seq_free(s);
  kv_cache_free(c);
  model_lora_release(a);
  model_free(m);
  return out;
}

static double max_diff(const float *a, const float *b, size_t n) {
  double d = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - (double)b[i]);
    if (!(e <= d)) d = isnan(e) ? INFINITY : e;
  }
  return d;
}

static int32_t *prompt0(int *n) {
  herr err = {0};
  json_t *doc = hjson_load_file(LORA "/llama-f32/golden.json", &err);
  if (!doc) return NULL;
  const json_t *a = json_array_get(json_object_get(doc, "prompts"), 0);
  *n = (int)json_array_size(a);
  int32_t *t = malloc(sizeof(int32_t) * (size_t)*n);
  for (int i = 0; i < *n; i++) t[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
  json_decref(doc);
  return t;
}

/* Same names, shapes and dtypes in both folders' safetensors; how many tensors differ in bytes. */
static int same_layout(const char *a, const char *b, int *changed) {
  st_set x, y;
  herr err = {0};
  memset(&x, 0, sizeof x);
  memset(&y, 0, sizeof y);
  int ok = !st_open(&x, a, &err) && !st_open(&y, b, &err) && x.count == y.count;
  *changed = 0;
  for (size_t i = 0; ok && i < x.count; i++) {
    const st_tensor *t = &x.tensors[i], *u = st_find(&y, t->name);
    ok = u && u->dtype == t->dtype && u->ndim == t->ndim && u->nbytes == t->nbytes;
    if (ok && memcmp(u->data, t->data, t->nbytes)) (*changed)++;
  }
  st_close(&x);
  st_close(&y);
  return ok;
}

static void test_fuse_f32(void) {
  int n = 0;
  int32_t *toks = prompt0(&n);
  CHECK(toks != NULL);
  if (!toks) return;
  char out[400], cmd[2048];
  snprintf(out, sizeof out, "%s/fused", tmp);
  snprintf(cmd, sizeof cmd, "'%s' fuse '%s/llama-f32' '%s/llama-f32/plain' '%s'", HEARTH_BINARY, GOLDEN, LORA, out);
  int rc = run(cmd);
  char *e = last_stderr();
  CHECK_MSG(rc == 0, "fuse failed: %s", e);
  free(e);
  char cfg[500];
  snprintf(cfg, sizeof cfg, "%s/config.json", out);
  CHECK(hfile_exists(cfg));
  int changed = 0;
  CHECK(same_layout(GOLDEN "/llama-f32", out, &changed));
  CHECK_EQ_INT(changed, 8); /* q, k, v, o of 2 layers */
  float *fused = logits_of(out, NULL, toks, n), *rt = logits_of(GOLDEN "/llama-f32", LORA "/llama-f32/plain", toks, n);
  size_t count = (size_t)n * 512;
  float *ref = malloc(sizeof(float) * count);
  FILE *f = fopen(LORA "/llama-f32/logits_plain.bin", "rb");
  CHECK(f && fread(ref, sizeof(float), count, f) == count);
  if (f) fclose(f);
  if (fused && rt) {
    double dr = max_diff(fused, ref, count), dt = max_diff(fused, rt, count);
    fprintf(stderr, "  fused llama-f32+plain: %.3g from the float64 reference, %.3g from the adapter at run time\n", dr, dt);
    CHECK(dr <= 1e-4 && dt <= 1e-4);
  } else
    CHECK(0);
  free(fused), free(rt), free(ref), free(toks);
}

static void test_fuse_experts(void) {
  int n = 12;
  int32_t toks[12];
  for (int i = 0; i < n; i++) toks[i] = (int32_t)((7 + 37 * i) % 512);
  char out[400], cmd[2048];
  snprintf(out, sizeof out, "%s/fused_moe", tmp);
  snprintf(cmd, sizeof cmd, "'%s' fuse '%s/qwen3_moe-f32' '%s/qwen3_moe-f32/per_expert' '%s'", HEARTH_BINARY, GOLDEN, LORA, out);
  int rc = run(cmd);
  char *e = last_stderr();
  CHECK_MSG(rc == 0, "fuse failed: %s", e);
  free(e);
  int changed = 0;
  CHECK(same_layout(GOLDEN "/qwen3_moe-f32", out, &changed));
  CHECK_EQ_INT(changed, 2 * 8 * 3); /* gate, up, down of 8 experts in 2 layers */
  float *fused = logits_of(out, NULL, toks, n), *rt = logits_of(GOLDEN "/qwen3_moe-f32", LORA "/qwen3_moe-f32/per_expert", toks, n);
  float *base = logits_of(GOLDEN "/qwen3_moe-f32", NULL, toks, n);
  if (fused && rt && base) {
    size_t count = (size_t)n * 512;
    double dt = max_diff(fused, rt, count), moved = max_diff(fused, base, count);
    fprintf(stderr, "  fused qwen3_moe-f32+per_expert: %.3g from the expert deltas at run time (they move the logits by %.3g)\n",
            dt, moved);
    CHECK(dt <= 1e-4 && moved > 0.05);
  } else
    CHECK(0);
  free(fused), free(rt), free(base);
  snprintf(cmd, sizeof cmd, "'%s' fuse '%s/qwen3_moe-f32' '%s/qwen3_moe-f32/experts' '%s/refused_moe'", HEARTH_BINARY, GOLDEN, LORA,
           tmp);
  CHECK_EQ_INT(run(cmd), 1);
  e = last_stderr();
  CHECK_MSG(strstr(e, "target_parameters") != NULL, "%s", e);
  free(e);
}

/* The ids `hearth generate` prints (greedy, 12 tokens) for a model and optional --adapter. */
static char *generate_ids(const char *model, const char *adapter) {
  char cmd[2048], path[400];
  snprintf(path, sizeof path, "%s/ids.txt", tmp);
  snprintf(cmd, sizeof cmd, "'%s' generate --model '%s' --ids 501,500,505,196,90 -n 12 --temp 0 --print-ids%s%s%s > '%s'",
           HEARTH_BINARY, model, adapter ? " --adapter '" : "", adapter ? adapter : "", adapter ? "'" : "", path);
  if (run(cmd) != 0) return strdup("(failed)");
  char *s = NULL;
  size_t n;
  if (hfile_read(path, &s, &n, NULL)) return strdup("(unread)");
  return s;
}

/* `hearth generate --adapter` gives the fused model's greedy ids, and not the base's. */
static void test_generate_adapter(void) {
  char out[400];
  snprintf(out, sizeof out, "%s/fused", tmp);
  char *base = generate_ids(GOLDEN "/llama-f32", NULL), *with = generate_ids(GOLDEN "/llama-f32", LORA "/llama-f32/plain"),
       *fused = generate_ids(out, NULL);
  fprintf(stderr, "  generate: base %s  --adapter %s  fused %s", base, with, fused);
  CHECK_MSG(strcmp(with, fused) == 0 && strcmp(with, base) != 0 && strstr(with, "failed") == NULL, "base %s with %s fused %s", base,
            with, fused);
  free(base), free(with), free(fused);
}

static void test_fuse_bf16(void) {
  int n = 0;
  int32_t *toks = prompt0(&n);
  if (!toks) return;
  char out[400], cmd[2048];
  snprintf(out, sizeof out, "%s/fused16", tmp);
  snprintf(cmd, sizeof cmd, "'%s' fuse '%s/llama-bf16' '%s/llama-f32/rs' '%s'", HEARTH_BINARY, GOLDEN, LORA, out);
  int rc = run(cmd);
  char *e = last_stderr();
  CHECK_MSG(rc == 0, "fuse failed: %s", e);
  free(e);
  int changed = 0;
  CHECK(same_layout(GOLDEN "/llama-bf16", out, &changed)); /* bf16 stays bf16 */
  CHECK_EQ_INT(changed, 6);                                 /* gate, up, down of 2 layers */
  float *fused = logits_of(out, NULL, toks, n), *rt = logits_of(GOLDEN "/llama-bf16", LORA "/llama-f32/rs", toks, n),
        *base = logits_of(GOLDEN "/llama-bf16", NULL, toks, n);
  if (fused && rt && base) {
    size_t count = (size_t)n * 512;
    double dt = max_diff(fused, rt, count), moved = max_diff(base, rt, count);
    fprintf(stderr, "  fused llama-bf16+rs: %.3g from the adapter at run time (which moves logits by %.3g)\n", dt, moved);
    CHECK(dt <= 0.05 && moved > 0.5); /* one bf16 rounding of the merged weights */
  } else
    CHECK(0);
  free(fused), free(rt), free(base), free(toks);
}

static void test_refusals(void) {
  char cmd[2048], out[400];
  snprintf(out, sizeof out, "%s/refused", tmp);
  /* a GGUF file */
  snprintf(cmd, sizeof cmd, "'%s' fuse '%s' '%s/llama-f32/plain' '%s'", HEARTH_BINARY,
           HEARTH_TINY_GGUF, LORA, out);
  CHECK_EQ_INT(run(cmd), 1);
  char *e = last_stderr();
  CHECK_MSG(strstr(e, "GGUF") != NULL, "%s", e);
  free(e);
  /* a quantized folder */
  char q[400];
  snprintf(q, sizeof q, "%s/quant", tmp);
  mkdir(q, 0755);
  snprintf(cmd, sizeof cmd, "echo '{\"model_type\": \"llama\", \"quantization\": {\"bits\": 4, \"group_size\": 64}}' > '%s/config.json'", q);
  CHECK(system(cmd) == 0);
  snprintf(cmd, sizeof cmd, "'%s' fuse '%s' '%s/llama-f32/plain' '%s'", HEARTH_BINARY, q, LORA, out);
  CHECK_EQ_INT(run(cmd), 1);
  e = last_stderr();
  CHECK_MSG(strstr(e, "quantized") != NULL, "%s", e);
  free(e);
  /* an adapter made for another base (qwen3's MLP is the same shape, its attention is not) */
  snprintf(cmd, sizeof cmd, "'%s' fuse '%s/llama-f32' '%s/qwen3-f32/plain' '%s'", HEARTH_BINARY, GOLDEN, LORA, out);
  CHECK_EQ_INT(run(cmd), 1);
  e = last_stderr();
  CHECK_MSG(strstr(e, "do not fit") != NULL, "%s", e);
  free(e);
  /* usage */
  snprintf(cmd, sizeof cmd, "'%s' fuse only-one", HEARTH_BINARY);
  CHECK_EQ_INT(run(cmd), 2);
}

int main(void) {
  snprintf(tmp, sizeof tmp, "/tmp/hearth_test_fuse_%d", (int)getpid());
  mkdir(tmp, 0755);
  RUN(test_fuse_f32);
  RUN(test_generate_adapter);
  RUN(test_fuse_bf16);
  RUN(test_fuse_experts);
  RUN(test_refusals);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmp);
  TEST_MAIN_END();
}
