/* test_tp.c — tensor parallelism on the CPU (the in-process communicator):
 * a model split over N ranks gives the logits of the unsplit model within
 * f32 rounding and the same greedy tokens, on the golden models (llama,
 * qwen3 with tied embeddings, qwen2 with one KV head replicated, mistral,
 * phi3's fused projections, gemma3, granite's multipliers, and qwen3_moe,
 * whose experts are split by width; Gemma 4 dense, MoE and with per-layer
 * inputs; Qwen3.5 and Qwen3.5-MoE; GLM-5) at N = 2 and 4 (against
 * transformers' logits too), and on models made here (llama, Gemma 4, Qwen3.5, GLM-5) with 6 query
 * heads and 3 KV heads at N = 3 and 6 (KV heads, and Qwen3.5's key heads,
 * replicated) with a vocabulary that does not divide; LoRA
 * adapters (PEFT's on the golden bases, alone and stacked, and one made
 * here at N = 3 and 6) give the unsplit model's logits with them; batches
 * of several sequences, with and without adapters, and decoding through the
 * cache; shapes that do not split are refused by name (heads, KV heads,
 * linear-attention heads, a quantized block); a rank that fails stops the
 * group with its error instead of hanging it. With HEARTH_TEST_DEVICE=cuda
 * the same runs go through NCCL on GPUs, the splits over more than
 * HEARTH_TEST_TP_MAX ranks skipped (bench/cuda/tp.sh). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json.h"
#include "engine/kv_cache.h"
#include "format/safetensors_write.h"
#include "model/internal.h"
#include "model/model.h"
#include "test.h"
#include "test_device.h"

#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden/"

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

/* On a GPU (HEARTH_TEST_DEVICE), splits over more ranks than HEARTH_TEST_TP_MAX GPUs are skipped. */
static bool tp_runs(int n) {
  const char *mx = getenv("HEARTH_TEST_TP_MAX");
  if (mx && *mx) return n <= atoi(mx);
  const char *d = test_device();
  if (!d || !strncmp(d, "cpu", 3)) return true;
  /* without the limit: as many ranks as the machine has GPUs (cuda:n-1 opens) */
  char name[32];
  snprintf(name, sizeof name, "cuda:%d", n - 1);
  bk_backend *be = NULL;
  herr e = {0};
  if (bk_backend_open(name, NULL, &be, &e)) return false;
  bk_backend_close(be);
  return true;
}

static model *load(const char *dir, int tp, herr *err) {
  model *m = NULL;
  model_load_opts o = {.threads = 2, .tensor_parallel = tp, .device = test_device()};
  return model_load(dir, &o, &m, err) ? NULL : m;
}

/* What a model gives for a fixed workload: the all-position logits of two
 * prompts run as one batch (prompt a in chunks of 3 beside prompt b whole),
 * then `steps` greedy tokens decoded for both in batches of two. */
typedef struct run_out {
  float *logits;      /* owned: [na + nb][V] */
  int32_t greedy[2][16];
} run_out;

/* lo: the adapters prompt a runs with (n_lo of them; prompt b runs with none). */
static int run(model *m, const int32_t *a, int na, const int32_t *b, int nb, int steps, run_out *out, model_lora *const *lo, int n_lo) {
  const model_lora *const *la = (const model_lora *const *)lo;
  herr err = {0};
  int64_t V = model_vocab_size(m);
  model_kv_geometry geo;
  model_kv_geometry_of(m, &geo);
  kv_cache *c = NULL;
  kv_seq *sa = NULL, *sb = NULL;
  if (kv_cache_new(&geo, 0, &c, &err) || kv_cache_seq_new(c, &sa, &err) || kv_cache_seq_new(c, &sb, &err)) {
    fprintf(stderr, "cache: %s\n", err.msg);
    return -1;
  }
  out->logits = malloc(sizeof(float) * (size_t)((na + nb) * V));
  float *tmp = malloc(sizeof(float) * (size_t)((na + nb) * V));
  int rc = 0;
  /* prefill: a in chunks of 3, b whole in the first batch */
  for (int i = 0; i < na && !rc; i += 3) {
    int k = na - i < 3 ? na - i : 3;
    model_seq sq[2] = {{.kv = sa, .tokens = a + i, .n_tokens = k, .all_logits = true, .lora = la, .n_lora = n_lo},
                       {.kv = sb, .tokens = b, .n_tokens = nb, .all_logits = true}};
    model_batch bt = {sq, i == 0 ? 2 : 1};
    rc = model_forward(m, &bt, tmp, &err);
    if (!rc) memcpy(out->logits + (size_t)i * V, tmp, sizeof(float) * (size_t)(k * V));
    if (!rc && i == 0) memcpy(out->logits + (size_t)na * V, tmp + (size_t)k * V, sizeof(float) * (size_t)(nb * V));
  }
  int32_t next[2] = {argmax(out->logits + (size_t)(na - 1) * V, V), argmax(out->logits + (size_t)(na + nb - 1) * V, V)};
  for (int s = 0; s < steps && !rc; s++) {
    out->greedy[0][s] = next[0], out->greedy[1][s] = next[1];
    model_seq sq[2] = {{.kv = sa, .tokens = &next[0], .n_tokens = 1, .lora = la, .n_lora = n_lo},
                       {.kv = sb, .tokens = &next[1], .n_tokens = 1}};
    model_batch bt = {sq, 2};
    rc = model_forward(m, &bt, tmp, &err);
    if (!rc) next[0] = argmax(tmp, V), next[1] = argmax(tmp + V, V);
  }
  if (rc) fprintf(stderr, "forward: %s\n", err.msg);
  free(tmp);
  kv_cache_seq_free(sa);
  kv_cache_seq_free(sb);
  kv_cache_free(c);
  return rc;
}

/* lo1 / lon: the same n_lo adapters loaded on one and on split, for prompt a. */
static void compare_lora(const char *name, model *one, model *split, int tp, const int32_t *a, int na, const int32_t *b, int nb,
                         model_lora *const *lo1, model_lora *const *lon, int n_lo) {
  int64_t V = model_vocab_size(one);
  run_out r1 = {0}, rn = {0};
  int steps = 8;
  CHECK(run(one, a, na, b, nb, steps, &r1, lo1, n_lo) == 0);
  CHECK(run(split, a, na, b, nb, steps, &rn, lon, n_lo) == 0);
  if (r1.logits && rn.logits) {
    double scale = 0;
    for (size_t i = 0; i < (size_t)((na + nb) * V); i++) scale = fmax(scale, fabs(r1.logits[i]));
    /* (a GPU's matmuls may take another path for another shape) */
    double d = max_diff(r1.logits, rn.logits, (size_t)((na + nb) * V)), tol = (test_device() ? 1e-4 : 1e-5) * (scale > 1 ? scale : 1);
    CHECK_MSG(d <= tol, "%s at N=%d: logits differ from one rank by %.3g (tol %.3g)", name, tp, d, tol);
    fprintf(stderr, "  %-16s N=%d: max abs difference to one rank %.3g (logits up to %.3g)\n", name, tp, d, scale);
    CHECK_MSG(!memcmp(r1.greedy, rn.greedy, sizeof r1.greedy), "%s at N=%d: greedy tokens differ", name, tp);
  }
  free(r1.logits);
  free(rn.logits);
}

static void compare(const char *name, model *one, model *split, int tp, const int32_t *a, int na, const int32_t *b, int nb) {
  compare_lora(name, one, split, tp, a, na, b, nb, NULL, NULL, 0);
}

/* The golden fixtures: prompts from golden.json; transformers' logits too. */
static void golden(const char *name, int tp) {
  if (!tp_runs(tp)) return;
  char dir[512], path[600];
  snprintf(dir, sizeof dir, GOLDEN "%s", name);
  snprintf(path, sizeof path, "%s/golden.json", dir);
  herr err = {0};
  json_t *doc = hjson_load_file(path, &err);
  CHECK_MSG(doc, "%s: %s", name, err.msg);
  if (!doc) return;
  int32_t p[2][64];
  int n[2];
  for (int k = 0; k < 2; k++) {
    json_t *arr = json_array_get(json_object_get(doc, "prompts"), (size_t)k);
    n[k] = (int)json_array_size(arr) < 64 ? (int)json_array_size(arr) : 64;
    for (int i = 0; i < n[k]; i++) p[k][i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
  }
  double max_abs = json_number_value(json_object_get(doc, "max_abs_logit"));
  json_decref(doc);
  model *one = load(dir, 0, &err), *split = load(dir, tp, &err);
  CHECK_MSG(one && split, "%s at N=%d: %s", name, tp, err.msg);
  if (one && split) {
    compare(name, one, split, tp, p[0], n[0], p[1], n[1]);
    /* against transformers: prompt a's logits alone, in one piece */
    int64_t V = model_vocab_size(split);
    float *ref = malloc(sizeof(float) * (size_t)(n[0] * V)), *got = malloc(sizeof(float) * (size_t)(n[0] * V));
    snprintf(path, sizeof path, "%s/logits_f32.bin", dir);
    FILE *f = fopen(path, "rb");
    CHECK(f && fread(ref, sizeof(float), (size_t)(n[0] * V), f) == (size_t)(n[0] * V));
    if (f) fclose(f);
    model_kv_geometry geo;
    model_kv_geometry_of(split, &geo);
    CHECK_EQ_INT(geo.n_ranks, tp);
    kv_cache *c = NULL;
    kv_seq *s = NULL;
    CHECK(kv_cache_new(&geo, 0, &c, &err) == 0 && kv_cache_seq_new(c, &s, &err) == 0);
    model_seq sq = {.kv = s, .tokens = p[0], .n_tokens = n[0], .all_logits = true};
    model_batch bt = {&sq, 1};
    CHECK(model_forward(split, &bt, got, &err) == 0);
    double d = max_diff(got, ref, (size_t)(n[0] * V));
    CHECK_MSG(d <= 1e-4 * (max_abs > 1 ? max_abs : 1), "%s at N=%d: %.3g from transformers", name, tp, d);
    kv_cache_seq_free(s);
    kv_cache_free(c);
    free(ref);
    free(got);
  }
  model_free(one);
  model_free(split);
}

/* The golden families with layers of their own: Gemma 4 (per-layer inputs, KV-shared layers,
 * sliding / full attention; keys as values and the MoE branch beside the MLP), Qwen3.5 (Gated
 * DeltaNet and gated full attention; at N = 4 its two key heads replicated) and its MoE variant
 * (routed experts and the gated shared expert), GLM-5 (latent attention split by heads, the latent
 * cache and the DSA indexer replicated, the experts by width). */
static void test_gemma4(void) {
  static const char *names[] = {"gemma4-f32", "gemma4_moe-f32", "gemma4_plain-f32"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) golden(names[i], 2), golden(names[i], 4);
}

static void test_qwen3_5(void) {
  golden("qwen3_5-f32", 2);
  golden("qwen3_5-f32", 4);
  golden("qwen3_5_moe-f32", 2);
  golden("qwen3_5_vl-f32", 2); /* the text stack of a multimodal checkpoint (multimodal RoPE) */
}

static void test_glm5(void) {
  static const char *names[] = {"glm5-f32", "glm5_yarn-f32"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) golden(names[i], 2), golden(names[i], 4);
}

/* What the golden families refuse to split, by name: 4 query heads over 3 ranks; Qwen3.5-MoE's 2
 * linear-attention value heads over 4; DiffusionGemma at all (its row has no split). */
static void test_family_refusals(void) {
  static const struct {
    const char *name;
    int tp;
    const char *msg;
  } cases[] = {
      {"gemma4-f32", 3, "num_attention_heads 4 does not split over 3 ranks"},
      {"gemma4_moe-f32", 3, "num_attention_heads 4 does not split over 3 ranks"},
      {"qwen3_5-f32", 3, "linear_num_value_heads 4 does not split over 3 ranks"},
      {"qwen3_5_moe-f32", 3, "does not split over 3 ranks"},
      {"qwen3_5_moe-f32", 4, "linear_num_value_heads 2 does not split over 4 ranks"},
      {"glm5-f32", 3, "num_attention_heads 4 does not split over 3 ranks"},
      {"diffusion_gemma-f32", 2, "model_type 'diffusion_gemma_text' is not split over ranks"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char dir[512];
    snprintf(dir, sizeof dir, GOLDEN "%s", cases[i].name);
    herr err = {0};
    model *m = load(dir, cases[i].tp, &err);
    CHECK_MSG(!m, "%s at N=%d loaded", cases[i].name, cases[i].tp);
    CHECK_MSG(strstr(err.msg, cases[i].msg), "%s at N=%d: message: %s", cases[i].name, cases[i].tp, err.msg);
    model_free(m);
  }
}

static void test_golden_n1(void) {
  static const char *names[] = {"llama-f32", "qwen3-f32", "gemma3-f32", "qwen3_moe-f32"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) golden(names[i], 1);
}

static void test_golden_n2(void) {
  static const char *names[] = {"llama-f32", "qwen3-f32", "qwen2-f32", "mistral-f32", "phi3-f32", "gemma3-f32", "qwen3_moe-f32",
                                "granite-f32"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) golden(names[i], 2);
}

static void test_golden_n4(void) {
  static const char *names[] = {"llama-f32", "qwen3-f32", "qwen2-f32", "gemma3-f32", "qwen3_moe-f32"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) golden(names[i], 4);
}

/* ---- a model made here: llama, H query heads, KV heads, vocabulary V ---- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((rng >> 40) & 0xffffff) / (float)(1 << 24) - 0.5f;
}

typedef struct gen_model {
  int64_t H, KV, hd, D, I, V, L;
  int mlx_o_group;  /* > 0: o_proj stored MLX 8-bit with this group size */
  bool qwen3_5;     /* a Qwen3.5 instead: its layers alternate Gated DeltaNet and gated full attention */
  int64_t nk, nv, dk, dv; /* its linear attention's key and value heads and their sizes */
  bool glm5;        /* a GLM-5 instead: layer 0 dense with its indexer, the others experts reusing its rows */
  bool gemma4;      /* a Gemma 4 instead: sliding / full layers (full ones with twice the head size), the last
                       two reading the KV of earlier ones, double-wide MLPs there, per-layer inputs of 8 */
} gen_model;

typedef struct fill_ctx {
  float **bufs;
  int n;
} fill_ctx;

/* One random f32 tensor (shape [s0] or [s0, s1] or [s0, 1, s1]) added to w; its floats kept in bufs until written. */
static void add_random(st_writer *w, float **bufs, char (*names)[96], int *nb, const char *nm, int nd, int64_t s0, int64_t s1,
                       float amp) {
  snprintf(names[*nb], sizeof names[*nb], "%s", nm);
  int64_t shp[3] = {s0, nd == 3 ? 1 : s1, s1}, nel = s0 * (nd > 1 ? s1 : 1);
  bufs[*nb] = malloc(sizeof(float) * (size_t)nel);
  for (int64_t i = 0; i < nel; i++) bufs[*nb][i] = frand() * amp;
  st_writer_tensor(w, names[*nb], ST_F32, nd, shp, bufs[*nb]);
  (*nb)++;
}

/* A Qwen3.5 of g->L layers, even ones Gated DeltaNet, odd ones gated full attention. */
static int write_qwen3_5(const char *dir, const gen_model *g) {
  mkdir(dir, 0755);
  char path[600];
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fprintf(f,
          "{\"architectures\": [\"Qwen3_5ForCausalLM\"], \"model_type\": \"qwen3_5_text\", \"hidden_size\": %lld, "
          "\"intermediate_size\": %lld, \"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, \"head_dim\": %lld, "
          "\"num_hidden_layers\": %lld, \"vocab_size\": %lld, \"rms_norm_eps\": 1e-6, \"max_position_embeddings\": 256, "
          "\"hidden_act\": \"silu\", \"tie_word_embeddings\": false, \"torch_dtype\": \"float32\", "
          "\"linear_conv_kernel_dim\": 3, \"linear_num_key_heads\": %lld, \"linear_num_value_heads\": %lld, "
          "\"linear_key_head_dim\": %lld, \"linear_value_head_dim\": %lld, "
          "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.5}, "
          "\"layer_types\": [",
          (long long)g->D, (long long)g->I, (long long)g->H, (long long)g->KV, (long long)g->hd, (long long)g->L, (long long)g->V,
          (long long)g->nk, (long long)g->nv, (long long)g->dk, (long long)g->dv);
  for (int l = 0; l < g->L; l++) fprintf(f, "%s\"%s\"", l ? ", " : "", l % 2 ? "full_attention" : "linear_attention");
  fprintf(f, "]}\n");
  fclose(f);
  st_writer *w = st_writer_new();
  float *bufs[256];
  char names[256][96], nm[96];
  int nb = 0;
  int64_t D = g->D, C = 2 * g->nk * g->dk + g->nv * g->dv;
  add_random(w, bufs, names, &nb, "model.embed_tokens.weight", 2, g->V, D, 0.4f);
  add_random(w, bufs, names, &nb, "lm_head.weight", 2, g->V, D, 0.4f);
  add_random(w, bufs, names, &nb, "model.norm.weight", 1, D, 0, 0.4f);
  for (int l = 0; l < g->L; l++) {
#define T(field, nd, s0, s1)                                          \
  snprintf(nm, sizeof nm, "model.layers.%d.%s", l, field);            \
  add_random(w, bufs, names, &nb, nm, nd, s0, s1, 0.4f)
    T("input_layernorm.weight", 1, D, 0);
    T("post_attention_layernorm.weight", 1, D, 0);
    if (l % 2 == 0) {
      T("linear_attn.in_proj_qkv.weight", 2, C, D);
      T("linear_attn.in_proj_z.weight", 2, g->nv * g->dv, D);
      T("linear_attn.in_proj_a.weight", 2, g->nv, D);
      T("linear_attn.in_proj_b.weight", 2, g->nv, D);
      T("linear_attn.out_proj.weight", 2, D, g->nv * g->dv);
      T("linear_attn.conv1d.weight", 3, C, 3);
      T("linear_attn.A_log", 1, g->nv, 0);
      T("linear_attn.dt_bias", 1, g->nv, 0);
      T("linear_attn.norm.weight", 1, g->dv, 0);
    } else {
      T("self_attn.q_proj.weight", 2, 2 * g->H * g->hd, D);
      T("self_attn.k_proj.weight", 2, g->KV * g->hd, D);
      T("self_attn.v_proj.weight", 2, g->KV * g->hd, D);
      T("self_attn.o_proj.weight", 2, D, g->H * g->hd);
      T("self_attn.q_norm.weight", 1, g->hd, 0);
      T("self_attn.k_norm.weight", 1, g->hd, 0);
    }
    T("mlp.gate_proj.weight", 2, g->I, D);
    T("mlp.up_proj.weight", 2, g->I, D);
    T("mlp.down_proj.weight", 2, D, g->I);
#undef T
  }
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  herr err = {0};
  int rc = st_writer_write(w, path, NULL, NULL, &err);
  if (rc) fprintf(stderr, "write: %s\n", err.msg);
  st_writer_free(w);
  for (int i = 0; i < nb; i++) free(bufs[i]);
  return rc;
}

/* A GLM-5 of g->L layers (H heads of latent attention; q_lora = kv_lora = D / 2, nope = rope = v = hd; an
 * indexer of 4 heads of 16 choosing 8 rows on layer 0, shared after it), layer 0 a dense MLP of I, the
 * others 4 experts of I / 4 (2 per token in 2 groups) and one shared expert. */
static int write_glm5(const char *dir, const gen_model *g) {
  mkdir(dir, 0755);
  char path[600];
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  int64_t D = g->D, H = g->H, hd = g->hd, QL = D / 2, KL = D / 2, EI = g->I / 4;
  fprintf(f,
          "{\"architectures\": [\"GlmMoeDsaForCausalLM\"], \"model_type\": \"glm_moe_dsa\", \"hidden_size\": %lld, "
          "\"intermediate_size\": %lld, \"moe_intermediate_size\": %lld, \"num_attention_heads\": %lld, "
          "\"num_key_value_heads\": %lld, \"num_hidden_layers\": %lld, \"vocab_size\": %lld, \"rms_norm_eps\": 1e-6, "
          "\"max_position_embeddings\": 256, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false, "
          "\"torch_dtype\": \"float32\", \"q_lora_rank\": %lld, \"kv_lora_rank\": %lld, \"qk_nope_head_dim\": %lld, "
          "\"qk_rope_head_dim\": %lld, \"qk_head_dim\": %lld, \"v_head_dim\": %lld, \"index_n_heads\": 4, "
          "\"index_head_dim\": 16, \"index_topk\": 8, \"n_routed_experts\": 4, \"num_experts_per_tok\": 2, "
          "\"n_group\": 2, \"topk_group\": 2, \"n_shared_experts\": 1, \"norm_topk_prob\": true, "
          "\"routed_scaling_factor\": 2.5, \"first_k_dense_replace\": 1, \"num_nextn_predict_layers\": 0, "
          "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0}, \"indexer_types\": [",
          (long long)D, (long long)g->I, (long long)EI, (long long)H, (long long)H, (long long)g->L, (long long)g->V, (long long)QL,
          (long long)KL, (long long)hd, (long long)hd, (long long)(2 * hd), (long long)hd);
  for (int l = 0; l < g->L; l++) fprintf(f, "%s\"%s\"", l ? ", " : "", l ? "shared" : "full");
  fprintf(f, "], \"mlp_layer_types\": [");
  for (int l = 0; l < g->L; l++) fprintf(f, "%s\"%s\"", l ? ", " : "", l ? "sparse" : "dense");
  fprintf(f, "]}\n");
  fclose(f);
  st_writer *w = st_writer_new();
  float *bufs[256];
  char names[256][96], nm[96];
  int nb = 0;
  add_random(w, bufs, names, &nb, "model.embed_tokens.weight", 2, g->V, D, 0.4f);
  add_random(w, bufs, names, &nb, "lm_head.weight", 2, g->V, D, 0.4f);
  add_random(w, bufs, names, &nb, "model.norm.weight", 1, D, 0, 0.4f);
  for (int l = 0; l < g->L; l++) {
#define T(field, nd, s0, s1)                                          \
  snprintf(nm, sizeof nm, "model.layers.%d.%s", l, field);            \
  add_random(w, bufs, names, &nb, nm, nd, s0, s1, 0.4f)
    T("input_layernorm.weight", 1, D, 0);
    T("post_attention_layernorm.weight", 1, D, 0);
    T("self_attn.q_a_proj.weight", 2, QL, D);
    T("self_attn.q_a_layernorm.weight", 1, QL, 0);
    T("self_attn.kv_a_proj_with_mqa.weight", 2, KL + hd, D);
    T("self_attn.kv_a_layernorm.weight", 1, KL, 0);
    T("self_attn.q_b_proj.weight", 2, H * 2 * hd, QL);
    T("self_attn.kv_b_proj.weight", 2, H * 2 * hd, KL);
    T("self_attn.o_proj.weight", 2, D, H * hd);
    if (l == 0) {
      T("self_attn.indexer.wq_b.weight", 2, 4 * 16, QL);
      T("self_attn.indexer.wk.weight", 2, 16, D);
      T("self_attn.indexer.weights_proj.weight", 2, 4, D);
      T("self_attn.indexer.k_norm.weight", 1, 16, 0);
      T("self_attn.indexer.k_norm.bias", 1, 16, 0);
      T("mlp.gate_proj.weight", 2, g->I, D);
      T("mlp.up_proj.weight", 2, g->I, D);
      T("mlp.down_proj.weight", 2, D, g->I);
      continue;
    }
    T("mlp.gate.weight", 2, 4, D);
    T("mlp.gate.e_score_correction_bias", 1, 4, 0);
    T("mlp.shared_experts.gate_proj.weight", 2, EI, D);
    T("mlp.shared_experts.up_proj.weight", 2, EI, D);
    T("mlp.shared_experts.down_proj.weight", 2, D, EI);
    for (int e = 0; e < 4; e++) {
      char ex[64];
      snprintf(ex, sizeof ex, "mlp.experts.%d.gate_proj.weight", e);
      T(ex, 2, EI, D);
      snprintf(ex, sizeof ex, "mlp.experts.%d.up_proj.weight", e);
      T(ex, 2, EI, D);
      snprintf(ex, sizeof ex, "mlp.experts.%d.down_proj.weight", e);
      T(ex, 2, D, EI);
    }
#undef T
  }
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  herr err = {0};
  int rc = st_writer_write(w, path, NULL, NULL, &err);
  if (rc) fprintf(stderr, "write: %s\n", err.msg);
  st_writer_free(w);
  for (int i = 0; i < nb; i++) free(bufs[i]);
  return rc;
}

/* A Gemma 4 of 4 layers (see gen_model.gemma4); its norms' weights near 1 (they scale by w). */
static int write_gemma4(const char *dir, const gen_model *g) {
  mkdir(dir, 0755);
  char path[600];
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  int64_t D = g->D, H = g->H, KV = g->KV, hd = g->hd, L = 4, dp = 8;
  fprintf(f,
          "{\"architectures\": [\"Gemma4ForCausalLM\"], \"model_type\": \"gemma4_text\", \"hidden_size\": %lld, "
          "\"intermediate_size\": %lld, \"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, \"head_dim\": %lld, "
          "\"num_hidden_layers\": %lld, \"vocab_size\": %lld, \"vocab_size_per_layer_input\": %lld, "
          "\"hidden_size_per_layer_input\": %lld, \"rms_norm_eps\": 1e-6, \"max_position_embeddings\": 256, "
          "\"hidden_activation\": \"gelu_pytorch_tanh\", \"tie_word_embeddings\": true, \"torch_dtype\": \"float32\", "
          "\"final_logit_softcapping\": 30.0, \"sliding_window\": 4, \"num_kv_shared_layers\": 2, "
          "\"use_double_wide_mlp\": true, \"attention_k_eq_v\": false, \"enable_moe_block\": false, "
          "\"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\"], "
          "\"per_layer_config\": {\"1\": {\"head_dim\": %lld}, \"3\": {\"head_dim\": %lld}}, "
          "\"rope_parameters\": {\"full_attention\": {\"partial_rotary_factor\": 0.25, \"rope_theta\": 1000000.0, "
          "\"rope_type\": \"proportional\"}, \"sliding_attention\": {\"rope_theta\": 10000.0, \"rope_type\": \"default\"}}}\n",
          (long long)D, (long long)g->I, (long long)H, (long long)KV, (long long)hd, (long long)L, (long long)g->V, (long long)g->V,
          (long long)dp, (long long)(2 * hd), (long long)(2 * hd));
  fclose(f);
  st_writer *w = st_writer_new();
  float *bufs[256];
  char names[256][96], nm[96];
  int nb = 0;
#define NORM(name, n)                                                    \
  do {                                                                   \
    add_random(w, bufs, names, &nb, name, 1, n, 0, 0.4f);                \
    for (int64_t i_ = 0; i_ < (n); i_++) bufs[nb - 1][i_] += 1.0f;       \
  } while (0)
  add_random(w, bufs, names, &nb, "model.embed_tokens.weight", 2, g->V, D, 0.4f);
  add_random(w, bufs, names, &nb, "model.embed_tokens_per_layer.weight", 2, g->V, L * dp, 0.4f);
  add_random(w, bufs, names, &nb, "model.per_layer_model_projection.weight", 2, L * dp, D, 0.4f);
  NORM("model.per_layer_projection_norm.weight", dp);
  NORM("model.norm.weight", D);
  for (int l = 0; l < L; l++) {
    int64_t h = l % 2 ? 2 * hd : hd, I = l >= 2 ? 2 * g->I : g->I;
#define T(field, s0, s1)                                              \
  snprintf(nm, sizeof nm, "model.layers.%d.%s", l, field);            \
  add_random(w, bufs, names, &nb, nm, 2, s0, s1, 0.4f)
#define N(field, n)                                                   \
  snprintf(nm, sizeof nm, "model.layers.%d.%s", l, field);            \
  NORM(nm, n)
    N("input_layernorm.weight", D);
    N("post_attention_layernorm.weight", D);
    N("pre_feedforward_layernorm.weight", D);
    N("post_feedforward_layernorm.weight", D);
    N("post_per_layer_input_norm.weight", D);
    N("self_attn.q_norm.weight", h);
    T("self_attn.q_proj.weight", H * h, D);
    T("self_attn.o_proj.weight", D, H * h);
    if (l < 2) { /* the last two read these layers' KV */
      N("self_attn.k_norm.weight", h);
      T("self_attn.k_proj.weight", KV * h, D);
      T("self_attn.v_proj.weight", KV * h, D);
    }
    T("mlp.gate_proj.weight", I, D);
    T("mlp.up_proj.weight", I, D);
    T("mlp.down_proj.weight", D, I);
    T("per_layer_input_gate.weight", dp, D);
    T("per_layer_projection.weight", D, dp);
#undef T
#undef N
  }
#undef NORM
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  herr err = {0};
  int rc = st_writer_write(w, path, NULL, NULL, &err);
  if (rc) fprintf(stderr, "write: %s\n", err.msg);
  st_writer_free(w);
  for (int i = 0; i < nb; i++) free(bufs[i]);
  return rc;
}

static int write_model(const char *dir, const gen_model *g) {
  if (g->gemma4) return write_gemma4(dir, g);
  if (g->qwen3_5) return write_qwen3_5(dir, g);
  if (g->glm5) return write_glm5(dir, g);
  mkdir(dir, 0755);
  char path[600];
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fprintf(f,
          "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": %lld, \"intermediate_size\": %lld, "
          "\"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, \"head_dim\": %lld, \"num_hidden_layers\": %lld, "
          "\"vocab_size\": %lld, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, \"max_position_embeddings\": 256, "
          "\"hidden_act\": \"silu\", \"tie_word_embeddings\": false, \"torch_dtype\": \"float32\"%s}\n",
          (long long)g->D, (long long)g->I, (long long)g->H, (long long)g->KV, (long long)g->hd, (long long)g->L, (long long)g->V,
          g->mlx_o_group ? ", \"quantization\": {\"bits\": 8, \"group_size\": 64}" : "");
  fclose(f);
  st_writer *w = st_writer_new();
  float *bufs[256];
  int nb = 0;
  char names[256][96];
#define ADD(nm, dt, nd, s0, s1, nel)                                   \
  do {                                                                 \
    snprintf(names[nb], sizeof names[nb], "%s", nm);                   \
    int64_t shp[2] = {s0, s1};                                         \
    bufs[nb] = malloc(sizeof(float) * (size_t)(nel));                  \
    for (int64_t i_ = 0; i_ < (nel); i_++) bufs[nb][i_] = frand() * 0.4f; \
    st_writer_tensor(w, names[nb], dt, nd, shp, bufs[nb]);             \
    nb++;                                                              \
  } while (0)
  int64_t D = g->D, Q = g->H * g->hd, K = g->KV * g->hd;
  ADD("model.embed_tokens.weight", ST_F32, 2, g->V, D, g->V * D);
  ADD("lm_head.weight", ST_F32, 2, g->V, D, g->V * D);
  ADD("model.norm.weight", ST_F32, 1, D, 0, D);
  for (int l = 0; l < g->L; l++) {
    char nm[96];
#define L_ADD(field, dt, nd, s0, s1, nel)                             \
  snprintf(nm, sizeof nm, "model.layers.%d.%s", l, field);            \
  ADD(nm, dt, nd, s0, s1, nel)
    L_ADD("input_layernorm.weight", ST_F32, 1, D, 0, D);
    L_ADD("post_attention_layernorm.weight", ST_F32, 1, D, 0, D);
    L_ADD("self_attn.q_proj.weight", ST_F32, 2, Q, D, Q * D);
    L_ADD("self_attn.k_proj.weight", ST_F32, 2, K, D, K * D);
    L_ADD("self_attn.v_proj.weight", ST_F32, 2, K, D, K * D);
    if (g->mlx_o_group) { /* 8-bit words (4 per u32), a scale and a bias per group of 64 inputs */
      L_ADD("self_attn.o_proj.weight", ST_U32, 2, D, Q / 4, D * Q / 4);
      uint32_t *u = (uint32_t *)bufs[nb - 1];
      for (int64_t i = 0; i < D * Q / 4; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        u[i] = (uint32_t)(rng >> 32);
      }
      L_ADD("self_attn.o_proj.scales", ST_F32, 2, D, Q / 64, D * Q / 64);
      for (int64_t i = 0; i < D * Q / 64; i++) bufs[nb - 1][i] = 0.002f + 0.001f * frand();
      L_ADD("self_attn.o_proj.biases", ST_F32, 2, D, Q / 64, D * Q / 64);
      for (int64_t i = 0; i < D * Q / 64; i++) bufs[nb - 1][i] = -0.25f;
    } else {
      L_ADD("self_attn.o_proj.weight", ST_F32, 2, D, Q, D * Q);
    }
    L_ADD("mlp.gate_proj.weight", ST_F32, 2, g->I, D, g->I * D);
    L_ADD("mlp.up_proj.weight", ST_F32, 2, g->I, D, g->I * D);
    L_ADD("mlp.down_proj.weight", ST_F32, 2, D, g->I, D * g->I);
#undef L_ADD
  }
#undef ADD
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  herr err = {0};
  int rc = st_writer_write(w, path, NULL, NULL, &err);
  if (rc) fprintf(stderr, "write: %s\n", err.msg);
  st_writer_free(w);
  for (int i = 0; i < nb; i++) free(bufs[i]);
  return rc;
}

static char tmpdir[256];

static void made(const char *sub, const gen_model *g, const int *tps, int n_tp) {
  char dir[400];
  snprintf(dir, sizeof dir, "%s/%s", tmpdir, sub);
  CHECK(write_model(dir, g) == 0);
  herr err = {0};
  model *one = load(dir, 0, &err);
  CHECK_MSG(one, "%s: %s", sub, err.msg);
  int32_t a[11], b[6];
  for (int i = 0; i < 11; i++) a[i] = (int32_t)((i * 37 + 5) % g->V);
  for (int i = 0; i < 6; i++) b[i] = (int32_t)((i * 53 + 11) % g->V);
  for (int k = 0; one && k < n_tp; k++) {
    if (!tp_runs(tps[k])) continue;
    model *split = load(dir, tps[k], &err);
    CHECK_MSG(split, "%s at N=%d: %s", sub, tps[k], err.msg);
    if (split) compare(sub, one, split, tps[k], a, 11, b, 6);
    model_free(split);
  }
  model_free(one);
}

static void test_three_and_six(void) {
  /* 6 query heads, 3 KV heads: N=3 splits both; N=6 gives each KV head to two ranks; 100 tokens: 34, 34, 32 */
  gen_model g = {.H = 6, .KV = 3, .hd = 8, .D = 48, .I = 96, .V = 100, .L = 2};
  int tps[] = {1, 3, 6};
  made("h6kv3", &g, tps, 3);
}

static void test_gemma4_three_and_six(void) {
  /* 6 query heads, 3 KV heads (sliding layers head size 8, full ones 16), per-layer inputs over a vocabulary
   * of 100: N=3 splits heads and tables (34, 34, 32 ids); N=6 gives each KV head to two ranks */
  gen_model g = {.H = 6, .KV = 3, .hd = 8, .D = 48, .I = 96, .V = 100, .gemma4 = true};
  int tps[] = {1, 3, 6};
  made("gemma4_h6", &g, tps, 3);
}

static void test_qwen3_5_three_and_six(void) {
  /* 6 query heads, 3 KV heads; 6 linear-attention value heads reading 3 key heads: N=3 splits them all;
   * N=6 gives each KV head and each key head to two ranks (the key head's q / k conv channels replicated) */
  gen_model g = {.H = 6, .KV = 3, .hd = 8, .D = 48, .I = 96, .V = 100, .L = 4, .qwen3_5 = true, .nk = 3, .nv = 6, .dk = 8, .dv = 8};
  int tps[] = {1, 3, 6};
  made("qwen3_5_h6", &g, tps, 3);
}

static void test_glm5_three_and_six(void) {
  /* 6 latent-attention heads: N=3 and 6 give each rank 2 heads and 1; experts of 24 split into 8 and 4 */
  gen_model g = {.H = 6, .hd = 8, .D = 48, .I = 96, .V = 100, .L = 3, .glm5 = true};
  int tps[] = {1, 3, 6};
  made("glm5_h6", &g, tps, 3);
}

static void test_mlx_columns(void) {
  /* o_proj MLX 8-bit, groups of 64 over 128 inputs: N=2 splits at a group boundary (scales and biases
   * sliced with it); N=4 would cut groups in half and is refused */
  gen_model g = {.H = 8, .KV = 4, .hd = 16, .D = 64, .I = 128, .V = 64, .L = 1, .mlx_o_group = 64};
  int tps[] = {1, 2};
  made("mlx_o", &g, tps, 2);
  char dir[400];
  snprintf(dir, sizeof dir, "%s/mlx_o", tmpdir);
  herr err = {0};
  model *m = load(dir, 4, &err);
  CHECK(!m);
  CHECK_MSG(strstr(err.msg, "o_proj") && strstr(err.msg, "mlx_affine") && strstr(err.msg, "blocks of 64"), "message: %s", err.msg);
  model_free(m);
}

/* A PEFT adapter for a model made here: rank 4 on q/k/v/o and gate/up/down of every layer. */
static int write_adapter(const char *dir, const gen_model *g) {
  mkdir(dir, 0755);
  char path[600];
  snprintf(path, sizeof path, "%s/adapter_config.json", dir);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fprintf(f, "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"bias\": \"none\", \"target_modules\": "
             "[\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"]}\n");
  fclose(f);
  st_writer *w = st_writer_new();
  static const char *const mods[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                     "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  int64_t D = g->D, Q = g->H * g->hd, K = g->KV * g->hd, in[7] = {D, D, D, Q, D, D, g->I}, out[7] = {Q, K, K, D, g->I, g->I, D};
  float *bufs[64];
  char names[64][128];
  int nb = 0;
  for (int l = 0; l < g->L; l++)
    for (int t = 0; t < 7; t++)
      for (int ab = 0; ab < 2; ab++) {
        int64_t shp[2] = {ab ? out[t] : 4, ab ? 4 : in[t]};
        snprintf(names[nb], sizeof names[nb], "base_model.model.model.layers.%d.%s.lora_%c.weight", l, mods[t], ab ? 'B' : 'A');
        bufs[nb] = malloc(sizeof(float) * (size_t)(shp[0] * shp[1]));
        for (int64_t i = 0; i < shp[0] * shp[1]; i++) bufs[nb][i] = frand() * 0.5f;
        st_writer_tensor(w, names[nb], ST_F32, 2, shp, bufs[nb]);
        nb++;
      }
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  herr err = {0};
  int rc = st_writer_write(w, path, NULL, NULL, &err);
  if (rc) fprintf(stderr, "write: %s\n", err.msg);
  st_writer_free(w);
  for (int i = 0; i < nb; i++) free(bufs[i]);
  return rc;
}

/* Adapters dirs[0..n) loaded on one and on a split over tp ranks: the same logits and tokens with
 * them on prompt a (prompt b beside it without). */
static void lora_case(const char *name, const char *base, const char *const *dirs, int n, int tp, const int32_t *a, int na,
                      const int32_t *b, int nb) {
  if (!tp_runs(tp)) return;
  herr err = {0};
  model *one = load(base, 0, &err), *split = load(base, tp, &err);
  CHECK_MSG(one && split, "%s at N=%d: %s", name, tp, err.msg);
  model_lora *l1[2] = {0}, *ln[2] = {0};
  bool ok = one && split;
  for (int i = 0; ok && i < n; i++) {
    ok = model_lora_load(one, dirs[i], &l1[i], &err) == 0 && model_lora_load(split, dirs[i], &ln[i], &err) == 0;
    CHECK_MSG(ok, "%s at N=%d: %s", name, tp, err.msg);
  }
  if (ok) {
    CHECK_EQ_INT(model_lora_id(l1[0]) == model_lora_id(ln[0]), 1); /* what the prefix cache keys on does not depend on the split */
    compare_lora(name, one, split, tp, a, na, b, nb, l1, ln, n);
    /* the adapters do move the logits (else the comparison tests nothing) */
    run_out base = {0}, with = {0};
    int64_t V = model_vocab_size(one);
    CHECK(run(one, a, na, b, nb, 1, &base, NULL, 0) == 0 && run(one, a, na, b, nb, 1, &with, l1, n) == 0);
    if (base.logits && with.logits) {
      double moved = max_diff(base.logits, with.logits, (size_t)(na * V));
      CHECK_MSG(moved > 0.01, "%s: the adapters hardly move the logits (%.3g)", name, moved);
    }
    free(base.logits);
    free(with.logits);
  }
  for (int i = 0; i < n; i++) model_lora_release(l1[i]), model_lora_release(ln[i]);
  model_free(one);
  model_free(split);
}

/* LoRA adapters on split models: PEFT's adapters on the llama and qwen3 golden bases (alone and
 * stacked) at N = 2 and 4, and an adapter made here on the model made here at N = 3 and 6 (KV heads
 * replicated: each rank's k / v delta rows are its KV head's); deltas on routed experts refused. */
static void test_lora(void) {
  static const char *bases[] = {"llama-f32", "qwen3-f32"};
  for (size_t i = 0; i < sizeof bases / sizeof bases[0]; i++) {
    char base[512], plain[600], rs[600], path[700];
    snprintf(base, sizeof base, GOLDEN "%s", bases[i]);
    snprintf(plain, sizeof plain, HEARTH_SOURCE_DIR "/tests/fixtures/lora/%s/plain", bases[i]);
    snprintf(rs, sizeof rs, HEARTH_SOURCE_DIR "/tests/fixtures/lora/%s/rs", bases[i]);
    snprintf(path, sizeof path, "%s/golden.json", base);
    herr err = {0};
    json_t *doc = hjson_load_file(path, &err);
    CHECK_MSG(doc, "%s: %s", bases[i], err.msg);
    if (!doc) continue;
    int32_t p[2][64];
    int n[2];
    for (int k = 0; k < 2; k++) {
      json_t *arr = json_array_get(json_object_get(doc, "prompts"), (size_t)k);
      n[k] = (int)json_array_size(arr) < 64 ? (int)json_array_size(arr) : 64;
      for (int j = 0; j < n[k]; j++) p[k][j] = (int32_t)json_integer_value(json_array_get(arr, (size_t)j));
    }
    json_decref(doc);
    const char *both[2] = {plain, rs};
    char one_name[64], two_name[64];
    snprintf(one_name, sizeof one_name, "%s+plain", bases[i]);
    snprintf(two_name, sizeof two_name, "%s+plain+rs", bases[i]);
    for (int tp = 2; tp <= 4; tp += 2) {
      lora_case(one_name, base, both, 1, tp, p[0], n[0], p[1], n[1]);
      lora_case(two_name, base, both, 2, tp, p[0], n[0], p[1], n[1]);
    }
  }
  /* the model made here (6 heads, 3 KV heads) with an adapter made here */
  gen_model g = {.H = 6, .KV = 3, .hd = 8, .D = 48, .I = 96, .V = 100, .L = 2};
  char dir[400], ad[420];
  snprintf(dir, sizeof dir, "%s/h6kv3_lora", tmpdir);
  snprintf(ad, sizeof ad, "%s/adapter", tmpdir);
  CHECK(write_model(dir, &g) == 0 && write_adapter(ad, &g) == 0);
  int32_t a[11], b[6];
  for (int i = 0; i < 11; i++) a[i] = (int32_t)((i * 37 + 5) % g.V);
  for (int i = 0; i < 6; i++) b[i] = (int32_t)((i * 53 + 11) % g.V);
  const char *ads[1] = {ad};
  lora_case("h6kv3+lora", dir, ads, 1, 3, a, 11, b, 6);
  lora_case("h6kv3+lora", dir, ads, 1, 6, a, 11, b, 6);
  /* deltas on routed experts: refused on a split model, by name */
  if (tp_runs(2)) {
    herr err = {0};
    model *m = load(GOLDEN "qwen3_moe-f32", 2, &err);
    model_lora *lo = NULL;
    CHECK(m && model_lora_load(m, HEARTH_SOURCE_DIR "/tests/fixtures/lora/qwen3_moe-f32/experts", &lo, &err) != 0);
    CHECK_MSG(strstr(err.msg, "routed experts") && strstr(err.msg, "split over ranks"), "message: %s", err.msg);
    model_free(m);
  }
}

static void test_refusals(void) {
  herr err = {0};
  model *m = load(GOLDEN "llama-f32", 3, &err); /* 4 heads */
  CHECK(!m);
  CHECK_MSG(strstr(err.msg, "num_attention_heads 4 does not split over 3 ranks"), "message: %s", err.msg);
  model_free(m);
  char dir[400];
  snprintf(dir, sizeof dir, "%s/h6kv3", tmpdir);
  m = load(dir, 2, &err); /* 3 KV heads over 2 ranks */
  CHECK(!m);
  CHECK_MSG(strstr(err.msg, "num_key_value_heads 3"), "message: %s", err.msg);
  model_free(m);
  m = load(GOLDEN "diffusion_gemma-f32", 2, &err); /* a canvas pass's soft embeddings need every rank's vocabulary */
  CHECK(!m);
  CHECK_MSG(strstr(err.msg, "diffusion_gemma") || strstr(err.msg, "not split"), "message: %s", err.msg);
  model_free(m);
  model_load_opts o = {.threads = 2, .tensor_parallel = 2, .expert_budget = 1 << 20};
  CHECK(model_load(GOLDEN "qwen3_moe-f32", &o, &m, &err) != 0);
  CHECK_MSG(strstr(err.msg, "expert-budget"), "message: %s", err.msg);
}

/* A rank that fails mid-forward: the forward returns its error (no rank waits
 * forever in a collective), and the group refuses later forwards. */
static void test_rank_failure(void) {
  if (test_device()) return; /* failures are injected into the in-process communicator */
  herr err = {0};
  model *m = load(GOLDEN "llama-f32", 4, &err);
  CHECK_MSG(m, "%s", err.msg);
  if (!m) return;
  model_kv_geometry geo;
  model_kv_geometry_of(m, &geo);
  kv_cache *c = NULL;
  kv_seq *s = NULL;
  CHECK(kv_cache_new(&geo, 0, &c, &err) == 0 && kv_cache_seq_new(c, &s, &err) == 0);
  int32_t toks[4] = {1, 2, 3, 4};
  float *lg = malloc(sizeof(float) * (size_t)model_vocab_size(m));
  model_seq sq = {.kv = s, .tokens = toks, .n_tokens = 4};
  model_batch b = {&sq, 1};
  CHECK(model_forward(m, &b, lg, &err) == 0);
  bk_comm_inproc_fail_at(tp_rank_comm(m, 2), 3); /* rank 2's third collective of the next step */
  sq.tokens = toks + 3, sq.n_tokens = 1;
  CHECK(model_forward(m, &b, lg, &err) != 0);
  CHECK_MSG(strstr(err.msg, "rank 2") && strstr(err.msg, "injected"), "message: %s", err.msg);
  CHECK_EQ_INT(s->len, 4); /* nothing committed */
  herr e2 = {0};
  CHECK(model_forward(m, &b, lg, &e2) != 0);
  CHECK_MSG(strstr(e2.msg, "stopped"), "message: %s", e2.msg);
  free(lg);
  kv_cache_seq_free(s);
  kv_cache_free(c);
  model_free(m);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/hearth_test_tp_%d", (int)getpid());
  mkdir(tmpdir, 0755);
  test_device_or_skip();
  RUN(test_golden_n1);
  RUN(test_golden_n2);
  RUN(test_golden_n4);
  RUN(test_three_and_six);
  RUN(test_lora);
  RUN(test_gemma4);
  RUN(test_gemma4_three_and_six);
  RUN(test_qwen3_5);
  RUN(test_qwen3_5_three_and_six);
  RUN(test_glm5);
  RUN(test_glm5_three_and_six);
  RUN(test_family_refusals);
  RUN(test_mlx_columns);
  RUN(test_refusals);
  RUN(test_rank_failure);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
  TEST_MAIN_END();
}
