/* test_golden.c — every architecture's forward pass against transformers'
 * float64 logits (tests/fixtures/golden, made by tools/gen_golden.py):
 * all-position logits of two prompts, the greedy continuation, and the
 * invariances of the batched interface (chunked prefill, incremental decode,
 * several sequences in one batch). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "engine/kv_cache.h"
#include "model/model.h"
#include "test.h"
#include "test_device.h"

#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden"

typedef struct golden {
  json_t *doc;            /* owned */
  int32_t *prompt[2];     /* owned */
  int plen[2];
  float *ref;             /* owned: [plen0 + plen1][vocab] */
  int32_t greedy[64];
  int n_greedy;
  double max_abs;
  bool bf16;
} golden;

static void golden_free(golden *g) {
  json_decref(g->doc);
  free(g->prompt[0]);
  free(g->prompt[1]);
  free(g->ref);
}

static int golden_load(const char *dir, golden *g) {
  memset(g, 0, sizeof *g);
  char path[512];
  snprintf(path, sizeof path, "%s/golden.json", dir);
  herr err = {0};
  g->doc = hjson_load_file(path, &err);
  if (!g->doc) {
    fprintf(stderr, "%s\n", err.msg);
    return -1;
  }
  json_t *prompts = json_object_get(g->doc, "prompts");
  size_t total = 0;
  for (int p = 0; p < 2; p++) {
    json_t *a = json_array_get(prompts, p);
    g->plen[p] = (int)json_array_size(a);
    g->prompt[p] = malloc(sizeof(int32_t) * (size_t)g->plen[p]);
    for (int i = 0; i < g->plen[p]; i++) g->prompt[p][i] = (int32_t)json_integer_value(json_array_get(a, i));
    total += (size_t)g->plen[p];
  }
  int64_t vocab = json_integer_value(json_object_get(g->doc, "vocab_size"));
  json_t *ids = json_object_get(json_object_get(g->doc, "greedy"), "ids");
  g->n_greedy = (int)json_array_size(ids);
  if (g->n_greedy > 64) g->n_greedy = 64;
  for (int i = 0; i < g->n_greedy; i++) g->greedy[i] = (int32_t)json_integer_value(json_array_get(ids, i));
  g->max_abs = json_number_value(json_object_get(g->doc, "max_abs_logit"));
  g->bf16 = strcmp(json_string_value(json_object_get(g->doc, "dtype")), "bf16") == 0;
  snprintf(path, sizeof path, "%s/logits_f32.bin", dir);
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  g->ref = malloc(total * (size_t)vocab * sizeof(float));
  size_t got = fread(g->ref, sizeof(float), total * (size_t)vocab, f);
  fclose(f);
  return got == total * (size_t)vocab ? 0 : -1;
}

/* Runs tokens through a fresh sequence in chunks of `chunk` (0 = one piece), all logits. */
static int run_chunked(model *m, kv_cache *c, const int32_t *toks, int n, int chunk, float *out) {
  herr err = {0};
  kv_seq *s;
  if (kv_cache_seq_new(c, &s, &err)) return -1;
  int64_t V = model_vocab_size(m);
  int rc = 0;
  for (int i = 0; i < n && !rc;) {
    int k = chunk > 0 && n - i > chunk ? chunk : n - i;
    model_seq sq = {.kv = s, .tokens = toks + i, .n_tokens = k, .all_logits = true};
    model_batch b = {&sq, 1};
    rc = model_forward(m, &b, out + (size_t)i * V, &err);
    if (rc) fprintf(stderr, "forward: %s\n", err.msg);
    i += k;
  }
  kv_cache_seq_free(s);
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

static int argmax(const float *x, int64_t n) {
  int best = 0;
  for (int64_t i = 1; i < n; i++)
    if (x[i] > x[best]) best = (int)i;
  return best;
}

static void check_folder(const char *name) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/%s", GOLDEN, name);
  golden g;
  if (golden_load(dir, &g)) {
    CHECK_MSG(0, "%s: could not read golden.json / logits_f32.bin", name);
    golden_free(&g);
    return;
  }
  herr err = {0};
  model *m = NULL;
  model_load_opts opts = {.threads = 2, .device = test_device()};
  int rc = model_load(dir, &opts, &m, &err);
  CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
  if (rc) {
    golden_free(&g);
    return;
  }
  int64_t V = model_vocab_size(m);
  model_kv_geometry geo;
  model_kv_geometry_of(m, &geo);
  kv_cache *c = NULL;
  CHECK(kv_cache_new(&geo, 0, &c, &err) == 0);
  double tol = g.bf16 ? 2e-3 * g.max_abs : 1e-4;
  /* Chunked, incremental and batched runs must agree up to float rounding:
   * the matmul kernels may sum in another order for 1 row than for many. */
  double same = 1e-5 * (g.max_abs > 1 ? g.max_abs : 1);

  /* 1. all-position logits of both prompts, in one piece */
  float *full[2];
  const float *ref = g.ref;
  for (int p = 0; p < 2; p++) {
    full[p] = malloc(sizeof(float) * (size_t)(g.plen[p] * V));
    CHECK(run_chunked(m, c, g.prompt[p], g.plen[p], 0, full[p]) == 0);
    double d = max_diff(full[p], ref, (size_t)(g.plen[p] * V));
    CHECK_MSG(d <= tol, "%s prompt %d: max abs error %.3g > %.3g", name, p, d, tol);
    fprintf(stderr, "  %-18s prompt %d (%2d tokens): max abs error %.3g (tol %.3g)\n", name, p, g.plen[p], d, tol);
    ref += (size_t)g.plen[p] * V;
  }

  /* 2. chunked prefill of the long prompt gives the same logits */
  int n1 = g.plen[1];
  float *chunked = malloc(sizeof(float) * (size_t)(n1 * V));
  static const int chunks[] = {1, 3, 7, 16};
  for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
    CHECK(run_chunked(m, c, g.prompt[1], n1, chunks[ci], chunked) == 0);
    double d = max_diff(chunked, full[1], (size_t)(n1 * V));
    CHECK_MSG(d <= same, "%s: chunk size %d differs from one piece by %.3g", name, chunks[ci], d);
  }
  free(chunked);

  /* 3. greedy: prefill prompt 0, then decode one token at a time through the cache */
  kv_seq *s;
  CHECK(kv_cache_seq_new(c, &s, &err) == 0);
  float *last = malloc(sizeof(float) * (size_t)V);
  int32_t seq[128];
  int n = g.plen[0];
  memcpy(seq, g.prompt[0], sizeof(int32_t) * (size_t)n);
  model_seq sq = {.kv = s, .tokens = seq, .n_tokens = n};
  model_batch b = {&sq, 1};
  CHECK(model_forward(m, &b, last, &err) == 0);
  int mismatches = 0;
  for (int i = 0; i < g.n_greedy; i++) {
    int next = argmax(last, V);
    if (next != g.greedy[i]) mismatches++;
    seq[n++] = g.greedy[i]; /* follow the reference so one slip does not cascade */
    model_seq d1 = {.kv = s, .tokens = &seq[n - 1], .n_tokens = 1};
    model_batch b1 = {&d1, 1};
    CHECK(model_forward(m, &b1, last, &err) == 0);
  }
  CHECK_MSG(mismatches == 0, "%s: %d of %d greedy tokens differ", name, mismatches, g.n_greedy);
  CHECK_EQ_INT(s->len, n);

  /* 4. incremental decode equals a full recompute of the whole sequence */
  float *whole = malloc(sizeof(float) * (size_t)(n * V));
  CHECK(run_chunked(m, c, seq, n, 0, whole) == 0);
  double dinc = max_diff(last, whole + (size_t)(n - 1) * V, (size_t)V);
  CHECK_MSG(dinc <= same, "%s: incremental decode differs from full recompute by %.3g", name, dinc);
  free(whole);
  kv_cache_seq_free(s);

  /* 5. a batch of three sequences equals each alone: prompt 0 (last logits),
   * prompt 1 (all logits), and prompt 0 continued after a prefix in its cache */
  kv_seq *a, *bb, *cc;
  CHECK(kv_cache_seq_new(c, &a, &err) == 0);
  CHECK(kv_cache_seq_new(c, &bb, &err) == 0);
  CHECK(kv_cache_seq_new(c, &cc, &err) == 0);
  int split = 5;
  model_seq pre = {.kv = cc, .tokens = g.prompt[0], .n_tokens = split};
  model_batch bpre = {&pre, 1};
  CHECK(model_forward(m, &bpre, last, &err) == 0);
  model_seq three[3] = {
      {.kv = a, .tokens = g.prompt[0], .n_tokens = g.plen[0]},
      {.kv = bb, .tokens = g.prompt[1], .n_tokens = n1, .all_logits = true},
      {.kv = cc, .tokens = g.prompt[0] + split, .n_tokens = g.plen[0] - split},
  };
  model_batch b3 = {three, 3};
  size_t rows = model_batch_logit_rows(&b3);
  CHECK_EQ_INT(rows, 1 + n1 + 1);
  float *out3 = malloc(sizeof(float) * rows * (size_t)V);
  CHECK(model_forward(m, &b3, out3, &err) == 0);
  const float *p0_last = full[0] + (size_t)(g.plen[0] - 1) * V;
  CHECK_MSG(max_diff(out3, p0_last, (size_t)V) <= same, "%s: batched sequence 0 differs", name);
  CHECK_MSG(max_diff(out3 + V, full[1], (size_t)(n1 * V)) <= same, "%s: batched sequence 1 differs", name);
  CHECK_MSG(max_diff(out3 + (size_t)(1 + n1) * V, p0_last, (size_t)V) <= same, "%s: batched sequence 2 differs", name);
  CHECK_EQ_INT(a->len, g.plen[0]);
  CHECK_EQ_INT(cc->len, g.plen[0]);
  free(out3);
  kv_cache_seq_free(a);
  kv_cache_seq_free(bb);
  kv_cache_seq_free(cc);

  free(last);
  free(full[0]);
  free(full[1]);
  kv_cache_free(c);
  model_free(m);
  golden_free(&g);
}

static void test_llama(void) { check_folder("llama-f32"), check_folder("llama-bf16"); }
static void test_llama_rope_scaling(void) { check_folder("llama_llama3-f32"), check_folder("llama_yarn-f32"); }
static void test_llama_sharded(void) { check_folder("llama-sharded"); }
static void test_mistral(void) { check_folder("mistral-f32"), check_folder("mistral-bf16"); }
static void test_qwen2(void) { check_folder("qwen2-f32"), check_folder("qwen2-bf16"); }
static void test_qwen3(void) { check_folder("qwen3-f32"), check_folder("qwen3-bf16"); }
static void test_smollm3(void) { check_folder("smollm3-f32"), check_folder("smollm3-bf16"); }
static void test_phi3(void) { check_folder("phi3-f32"), check_folder("phi3-bf16"); }
static void test_gemma2(void) { check_folder("gemma2-f32"), check_folder("gemma2-bf16"); }
static void test_gemma3(void) { check_folder("gemma3-f32"), check_folder("gemma3-bf16"); }
static void test_qwen3_moe(void) { check_folder("qwen3_moe-f32"), check_folder("qwen3_moe-bf16"); }
static void test_gemma4(void) { check_folder("gemma4-f32"), check_folder("gemma4-bf16"); }
static void test_gemma4_moe(void) { check_folder("gemma4_moe-f32"), check_folder("gemma4_moe-bf16"); }
static void test_gemma4_plain(void) { check_folder("gemma4_plain-f32"), check_folder("gemma4_plain-bf16"); }
static void test_qwen3_5(void) { check_folder("qwen3_5-f32"), check_folder("qwen3_5-bf16"); }
static void test_qwen3_5_moe(void) { check_folder("qwen3_5_moe-f32"), check_folder("qwen3_5_moe-bf16"); }
/* Qwen3_5ForConditionalGeneration: the text stack under model.language_model., a vision tower beside it */
static void test_qwen3_5_multimodal(void) { check_folder("qwen3_5_vl-f32"); }
static void test_glm5(void) { check_folder("glm5-f32"), check_folder("glm5-bf16"), check_folder("glm5_yarn-f32"); }
/* llama with embedding, attention, residual and logits multipliers, tied */
static void test_granite(void) { check_folder("granite-f32"), check_folder("granite-bf16"); }

/* GLM-5's cache holds per token one K row [RoPE key | latent] (8 + 32
 * floats in the fixture) and one V row (the indexer's key, 16), not the
 * heads' keys and values; the multi-token-prediction layer's weights load.
 * And the indexer's choice matters: the same weights with index_topk above
 * the prompt's length (every row attended) no longer give the reference's
 * logits once a prompt is longer than index_topk (8), while the first 8
 * positions, where both attend every row, stay the same. */
static void test_glm5_cache_and_selection(void) {
  golden g;
  if (golden_load(GOLDEN "/glm5-f32", &g)) {
    CHECK_MSG(0, "could not read the glm5-f32 fixture");
    golden_free(&g);
    return;
  }
  herr err = {0};
  model *m = NULL, *dense = NULL;
  CHECK(model_load(GOLDEN "/glm5-f32", &(model_load_opts){.threads = 2, .device = test_device()}, &m, &err) == 0);
  char tmp[] = "/tmp/hearth-glm5-XXXXXX";
  CHECK(mkdtemp(tmp) != NULL);
  char path[600];
  json_t *cfg = hjson_load_file(GOLDEN "/glm5-f32/config.json", &err);
  CHECK(cfg != NULL);
  if (cfg) {
    json_object_set_new(cfg, "index_topk", json_integer(1024));
    snprintf(path, sizeof path, "%s/config.json", tmp);
    CHECK(json_dump_file(cfg, path, 0) == 0);
    json_decref(cfg);
  }
  snprintf(path, sizeof path, "%s/model.safetensors", tmp);
  CHECK(symlink(GOLDEN "/glm5-f32/model.safetensors", path) == 0);
  CHECK(model_load(tmp, &(model_load_opts){.threads = 2, .device = test_device()}, &dense, &err) == 0);
  if (m && dense) {
    model_kv_geometry geo;
    model_kv_geometry_of(m, &geo);
    CHECK_EQ_INT(geo.n_layers, 3);
    for (int l = 0; l < 3; l++) {
      CHECK_EQ_INT(geo.kv_dim[l], 8 + 32);
      CHECK_EQ_INT(model_kv_v_dim(&geo, l), 16);
    }
    CHECK_EQ_INT(model_nextn_layers(m), 1);
    int64_t V = model_vocab_size(m);
    int n = g.plen[1];
    kv_cache *c = NULL;
    model_kv_geometry_of(dense, &geo);
    CHECK(kv_cache_new(&geo, 0, &c, &err) == 0);
    float *a = malloc(sizeof(float) * (size_t)(n * V));
    CHECK(run_chunked(dense, c, g.prompt[1], n, 0, a) == 0);
    const float *ref = g.ref + (size_t)g.plen[0] * V;
    double head = max_diff(a, ref, (size_t)(8 * V)), tail = max_diff(a + 8 * V, ref + 8 * V, (size_t)((n - 8) * V));
    fprintf(stderr, "  glm5 with every row attended: max abs error %.3g on the first 8 positions, %.3g after\n", head, tail);
    CHECK_MSG(head <= 1e-4, "the first 8 positions differ by %.3g without the indexer's choice", head);
    CHECK_MSG(tail > 1e-2, "attending every row gives the reference's logits (%.3g): the choice does not matter", tail);
    free(a);
    kv_cache_free(c);
  }
  snprintf(path, sizeof path, "%s/model.safetensors", tmp);
  unlink(path);
  snprintf(path, sizeof path, "%s/config.json", tmp);
  unlink(path);
  rmdir(tmp);
  model_free(m), model_free(dense);
  golden_free(&g);
}


/* --f32-as-bf16: the f32 llama run as if stored in bf16 is the llama-bf16
 * fixture (the same model cast to bf16 by transformers): its logits match
 * that fixture's reference within the bf16 tolerance and the bf16 folder's
 * own run up to float rounding, and no longer match the f32 run. */
static void test_f32_as_bf16(void) {
  golden g16, g32;
  if (golden_load(GOLDEN "/llama-bf16", &g16) || golden_load(GOLDEN "/llama-f32", &g32)) {
    CHECK_MSG(0, "could not read the llama fixtures");
    golden_free(&g16), golden_free(&g32);
    return;
  }
  herr err = {0};
  model *m = NULL, *m32 = NULL, *m16 = NULL;
  CHECK(model_load(GOLDEN "/llama-f32", &(model_load_opts){.threads = 2, .device = test_device(), .f32_as_bf16 = true}, &m, &err) == 0);
  CHECK(model_load(GOLDEN "/llama-f32", &(model_load_opts){.threads = 2, .device = test_device()}, &m32, &err) == 0);
  CHECK(model_load(GOLDEN "/llama-bf16", &(model_load_opts){.threads = 2, .device = test_device()}, &m16, &err) == 0);
  if (m && m32 && m16) {
    int64_t V = model_vocab_size(m);
    model_kv_geometry geo, geo32;
    model_kv_geometry_of(m, &geo);
    model_kv_geometry_of(m32, &geo32);
    kv_cache *c = NULL, *c32 = NULL;
    CHECK(kv_cache_new(&geo, 0, &c, &err) == 0);
    CHECK(kv_cache_new(&geo32, 0, &c32, &err) == 0);
    int n = g16.plen[1];
    float *a = malloc(sizeof(float) * (size_t)(n * V)), *b = malloc(sizeof(float) * (size_t)(n * V));
    CHECK(run_chunked(m, c, g16.prompt[1], n, 0, a) == 0);
    CHECK(run_chunked(m32, c32, g16.prompt[1], n, 0, b) == 0);
    const float *ref16 = g16.ref + (size_t)g16.plen[0] * V;
    double d16 = max_diff(a, ref16, (size_t)(n * V)), d32 = max_diff(a, b, (size_t)(n * V));
    fprintf(stderr, "  llama-f32 as bf16: max abs error %.3g against the bf16 reference (tol %.3g); %.3g from the f32 run\n", d16,
            2e-3 * g16.max_abs, d32);
    CHECK_MSG(d16 <= 2e-3 * g16.max_abs, "f32-as-bf16 differs from the bf16 reference by %.3g", d16);
    CHECK_MSG(d32 > 1e-5, "f32-as-bf16 gave the f32 logits: the weights were not rounded");
    kv_cache *c16 = NULL;
    model_kv_geometry geo16;
    model_kv_geometry_of(m16, &geo16);
    CHECK(kv_cache_new(&geo16, 0, &c16, &err) == 0);
    CHECK(run_chunked(m16, c16, g16.prompt[1], n, 0, b) == 0);
    double same = max_diff(a, b, (size_t)(n * V));
    CHECK_MSG(same <= 1e-5 * (g16.max_abs > 1 ? g16.max_abs : 1), "f32-as-bf16 differs from the bf16 folder's run by %.3g", same);
    free(a), free(b);
    kv_cache_free(c), kv_cache_free(c32), kv_cache_free(c16);
  }
  model_free(m), model_free(m32), model_free(m16);
  golden_free(&g16), golden_free(&g32);
}

/* The forward refuses bad batches without touching any sequence. */
static void test_bad_batches(void) {
  herr err = {0};
  model *m = NULL;
  CHECK(model_load(GOLDEN "/llama-f32", &(model_load_opts){.device = test_device()}, &m, &err) == 0);
  if (!m) return;
  model_kv_geometry geo;
  model_kv_geometry_of(m, &geo);
  kv_cache *c = NULL;
  CHECK(kv_cache_new(&geo, 8, &c, &err) == 0);
  kv_seq *s;
  CHECK(kv_cache_seq_new(c, &s, &err) == 0);
  float *logits = malloc(sizeof(float) * 2 * (size_t)model_vocab_size(m));
  int32_t bad[2] = {5, 512};
  model_seq sq = {.kv = s, .tokens = bad, .n_tokens = 2};
  model_batch b = {&sq, 1};
  CHECK_EQ_INT(model_forward(m, &b, logits, &err), HEARTH_EINVAL);
  CHECK(strstr(err.msg, "512") != NULL);
  CHECK_EQ_INT(s->len, 0);
  int32_t many[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  model_seq big = {.kv = s, .tokens = many, .n_tokens = 9};
  model_batch bb = {&big, 1};
  CHECK_EQ_INT(model_forward(m, &bb, logits, &err), HEARTH_ELIMIT);
  CHECK_EQ_INT(s->len, 0);
  model_seq twice[2] = {{.kv = s, .tokens = many, .n_tokens = 1}, {.kv = s, .tokens = many, .n_tokens = 1}};
  model_batch bt = {twice, 2};
  CHECK_EQ_INT(model_forward(m, &bt, logits, &err), HEARTH_EINVAL);
  /* truncation rolls back: re-running the same token gives the same logits */
  model_seq one = {.kv = s, .tokens = many, .n_tokens = 3};
  model_batch b1 = {&one, 1};
  CHECK(model_forward(m, &b1, logits, &err) == 0);
  kv_cache_seq_truncate(s, 2);
  CHECK_EQ_INT(s->len, 2);
  model_seq again = {.kv = s, .tokens = many + 2, .n_tokens = 1};
  model_batch b2 = {&again, 1};
  CHECK(model_forward(m, &b2, logits + model_vocab_size(m), &err) == 0);
  CHECK(max_diff(logits, logits + model_vocab_size(m), (size_t)model_vocab_size(m)) == 0);
  free(logits);
  kv_cache_seq_free(s);
  kv_cache_free(c);
  model_free(m);
}

int main(void) {
  test_device_or_skip();
  RUN(test_llama);
  RUN(test_llama_rope_scaling);
  RUN(test_llama_sharded);
  RUN(test_mistral);
  RUN(test_qwen2);
  RUN(test_qwen3);
  RUN(test_smollm3);
  RUN(test_phi3);
  RUN(test_gemma2);
  RUN(test_gemma3);
  RUN(test_qwen3_moe);
  RUN(test_gemma4);
  RUN(test_gemma4_moe);
  RUN(test_gemma4_plain);
  RUN(test_qwen3_5);
  RUN(test_qwen3_5_moe);
  RUN(test_qwen3_5_multimodal);
  RUN(test_glm5);
  RUN(test_glm5_cache_and_selection);
  RUN(test_granite);
  RUN(test_f32_as_bf16);
  RUN(test_bad_batches);
  TEST_MAIN_END();
}
