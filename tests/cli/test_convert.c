/* test_convert.c — `hearth convert` round trips. The golden llama
 * (tests/fixtures/golden/llama-f32, with the 512-id tokenizer of
 * tests/fixtures/engine) is converted to every target and loaded back:
 * - f32 (GGUF and safetensors): logits equal to the source's within f32
 *   rounding, and to transformers' golden logits;
 * - f16, bf16, q8_0, q4_0, q4_k, mlx4, mlx8, fp8: logits equal, within f32
 *   rounding, to the f32 forward on weights quantized and dequantized by
 *   backend/formats.h (the quantized golden acceptance), and close to
 *   the f32 logits;
 * - the GGUF's metadata, tensor types, llama.cpp's q/k row order and the
 *   tokenizer (same ids as tokenizer.json) are checked, and GGUF → safetensors
 *   undoes the permutation;
 * - q4_k, q5_k and q6_k on a random model 256 wide (the golden one is too narrow for
 *   256-element blocks and falls back to q4_0), and the same for q5_0, q5_1,
 *   q2_k, q3_k, iq4_nl and iq4_xs (file types as llama.cpp numbers them);
 * - the tokenizers of .deps (llama2 SPM, llama3.1 and qwen3 BPE) written
 *   into GGUF give the tokenizer.json ids (skipped when .deps is missing);
 * - errors: unsupported architecture, MLX type to GGUF, missing source;
 * - when node-llama-cpp is in .deps/bench-node, llama.cpp loads and runs
 *   the converted GGUFs and tokenizes as hearth does. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/formats.h"
#include "base/file.h"
#include "engine/kv_cache.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "format/safetensors_write.h"
#include "model/model.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-f32"
#define ENGINE HEARTH_SOURCE_DIR "/tests/fixtures/engine"

static char tmp[256];
static const int32_t ids[20] = {501, 500, 505, 196, 90, 472, 56, 136, 73, 165, 275, 63, 408, 126, 403, 165, 406, 493, 490, 137};
#define NIDS 20

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

static void copy(const char *from, const char *to) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
  CHECK(system(cmd) == 0);
}

/* All-position logits of ids for the model at path (malloc'd NIDS × V), NULL on failure.
 * exact: f32 activations for every weight type (no 8-bit integer path). */
static float *forward_mode(const char *path, const int32_t *tok, int n, bool exact) {
  herr err = {0};
  model *m = NULL;
  model_load_opts o = {.threads = 1, .f32_activations = exact};
  if (model_load(path, &o, &m, &err)) {
    CHECK_MSG(0, "%s: %s", path, err.msg);
    return NULL;
  }
  model_kv_geometry g;
  model_kv_geometry_of(m, &g);
  kv_cache *c = NULL;
  kv_seq *s = NULL;
  float *out = malloc((size_t)n * (size_t)model_vocab_size(m) * sizeof(float));
  CHECK(kv_cache_new(&g, 0, &c, &err) == 0 && kv_cache_seq_new(c, &s, &err) == 0);
  model_seq sq = {.kv = s, .tokens = tok, .n_tokens = n, .all_logits = true};
  model_batch b = {&sq, 1};
  if (model_forward(m, &b, out, &err)) {
    CHECK_MSG(0, "%s: %s", path, err.msg);
    free(out);
    out = NULL;
  }
  kv_cache_seq_free(s);
  kv_cache_free(c);
  model_free(m);
  return out;
}

static float *forward(const char *path, const int32_t *tok, int n) { return forward_mode(path, tok, n, true); }

static double max_abs_diff(const float *a, const float *b, size_t n, double *amax) {
  double d = 0, m = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - (double)b[i]);
    if (!(e <= d)) d = e; /* NaN propagates */
    if (fabs(b[i]) > m) m = fabs(b[i]);
  }
  if (amax) *amax = m;
  return d;
}

/* How a reference model rounds its weights. */
typedef struct ref_kind {
  bk_type type;      /* for matrices (BK_F32 = unchanged) */
  bool gguf_fallback;/* GGUF's rule for rows that are not whole blocks */
  int mlx_bits, mlx_gs;
  bk_type vec_type;  /* for 1-D tensors (BK_F32 = unchanged) */
  bool fp8;          /* matrices but the embedding as FP8 E4M3 with per-row scales */
} ref_kind;

static void round_trip(bk_type t, float *x, int64_t rows, int64_t cols) {
  if (t == BK_F32) return;
  size_t rb = bk_row_bytes(t, cols, 0);
  void *q = malloc(rb * (size_t)rows);
  herr err = {0};
  CHECK(bk_quantize(t, x, rows, cols, q, &err) == 0);
  bk_weight w = {.type = t, .rows = rows, .cols = cols, .data = q};
  for (int64_t r = 0; r < rows; r++) CHECK(bk_dequant_row(&w, r, x + r * cols, &err) == 0);
  free(q);
}

/* Writes dir/model.safetensors (f32) with src_dir's weights rounded as k says, and copies config.json. */
static void make_ref(const char *src_dir, const char *dir, ref_kind k) {
  mkdir(dir, 0755);
  st_set s;
  herr err = {0};
  CHECK_MSG(st_open(&s, src_dir, &err) == 0, "%s", err.msg);
  st_writer *w = st_writer_new();
  float **bufs = calloc(s.count, sizeof *bufs);
  for (size_t i = 0; i < s.count; i++) {
    const st_tensor *t = &s.tensors[i];
    bufs[i] = malloc((size_t)t->numel * sizeof(float));
    CHECK(st_to_f32(t, bufs[i], &err) == 0);
    int64_t rows = t->ndim == 2 ? t->shape[0] : 1, cols = t->shape[t->ndim - 1];
    if (t->ndim == 1) round_trip(k.vec_type, bufs[i], 1, cols);
    else if (k.fp8) {
      if (!strstr(t->name, "embed_tokens")) {
        uint8_t *q = malloc((size_t)(rows * cols));
        float *sc = malloc((size_t)rows * 4);
        CHECK(bk_quantize_fp8(bufs[i], rows, cols, q, sc, &err) == 0);
        bk_weight fw = {.type = BK_FP8, .rows = rows, .cols = cols, .data = q, .scale_type = BK_F32, .scales = sc};
        for (int64_t r = 0; r < rows; r++) CHECK(bk_dequant_row(&fw, r, bufs[i] + r * cols, &err) == 0);
        free(q), free(sc);
      }
    } else if (k.mlx_bits) {
      if (cols % k.mlx_gs == 0) {
        int64_t groups = rows * cols / k.mlx_gs;
        uint32_t *wq = malloc((size_t)(rows * cols * k.mlx_bits / 32) * 4);
        float *sc = malloc((size_t)groups * 4), *bi = malloc((size_t)groups * 4);
        CHECK(bk_quantize_mlx(bufs[i], rows, cols, k.mlx_bits, k.mlx_gs, BK_F32, wq, sc, bi, &err) == 0);
        bk_weight mw = {.type = BK_MLX_AFFINE, .rows = rows, .cols = cols, .data = wq, .bits = k.mlx_bits, .group_size = k.mlx_gs,
                        .scale_type = BK_F32, .scales = sc, .biases = bi};
        for (int64_t r = 0; r < rows; r++) CHECK(bk_dequant_row(&mw, r, bufs[i] + r * cols, &err) == 0);
        free(wq), free(sc), free(bi);
      }
    } else {
      bk_type t2 = k.type;
      if (k.gguf_fallback && !bk_row_bytes(t2, cols, 0)) t2 = t2 == BK_Q4_K && cols % 32 == 0 ? BK_Q4_0 : BK_F16;
      round_trip(t2, bufs[i], rows, cols);
    }
    st_writer_tensor(w, t->name, ST_F32, t->ndim, t->shape, bufs[i]);
  }
  char p[512];
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  CHECK_MSG(st_writer_write(w, p, NULL, NULL, &err) == 0, "%s", err.msg);
  for (size_t i = 0; i < s.count; i++) free(bufs[i]);
  free(bufs);
  st_writer_free(w);
  st_close(&s);
  char from[512];
  snprintf(from, sizeof from, "%s/config.json", src_dir);
  snprintf(p, sizeof p, "%s/config.json", dir);
  copy(from, p);
}

static char src[300];
static float *src_logits; /* hearth's f32 forward of the source */

static void setup_source(void) {
  snprintf(src, sizeof src, "%s/src", tmp);
  mkdir(src, 0755);
  static const char *files[] = {GOLDEN "/config.json", GOLDEN "/model.safetensors", GOLDEN "/generation_config.json",
                                ENGINE "/tokenizer.json", ENGINE "/tokenizer_config.json"};
  for (int i = 0; i < 5; i++) {
    char to[512];
    snprintf(to, sizeof to, "%s/%s", src, strrchr(files[i], '/') + 1);
    copy(files[i], to);
  }
  src_logits = forward(src, ids, NIDS);
}

/* Converts src with `args`, loads DST, compares with the reference of kind k (tol_ref) and the f32 logits (tol_f32, relative to max |logit|). */
static void check_target(const char *dst_name, const char *args, ref_kind k, double tol_f32) {
  char dst[400], cmd[1200], ref[400];
  snprintf(dst, sizeof dst, "%s/%s", tmp, dst_name);
  snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' %s", HEARTH_BINARY, src, dst, args);
  int rc = run(cmd);
  char *se = last_stderr();
  CHECK_MSG(rc == 0, "%s: exit %d: %s", cmd, rc, se);
  free(se);
  if (rc || !src_logits) return;
  float *got = forward(dst, ids, NIDS);
  snprintf(ref, sizeof ref, "%s/ref-%s", tmp, dst_name);
  for (char *d = strrchr(ref, '/'); *d; d++)
    if (*d == '.') *d = '_'; /* a folder, not a .gguf */
  make_ref(src, ref, k);
  float *want = forward(ref, ids, NIDS);
  if (got && want) {
    double amax, d = max_abs_diff(got, want, (size_t)NIDS * 512, &amax);
    CHECK_MSG(d <= 2e-5 * (1 + amax), "%s: logits differ from the dequantized reference by %g (max |logit| %g)", dst_name, d, amax);
    double d32 = max_abs_diff(got, src_logits, (size_t)NIDS * 512, &amax);
    CHECK_MSG(d32 <= tol_f32 * amax, "%s: logits differ from f32 by %g (max |logit| %g, allowed %g)", dst_name, d32, amax, tol_f32 * amax);
    /* the default load: Q8_0 / Q4_0 multiply 8-bit activations where the CPU has the integer kernels */
    float *fast = forward_mode(dst, ids, NIDS, false);
    double df = fast ? max_abs_diff(fast, got, (size_t)NIDS * 512, NULL) : INFINITY;
    CHECK_MSG(df <= 0.02 * amax, "%s: 8-bit activations moved the logits by %g (max |logit| %g)", dst_name, df, amax);
    free(fast);
    fprintf(stderr, "  %-14s vs dequantized reference %.2g, vs f32 %.3g, 8-bit activations vs f32 activations %.3g (max |logit| %.3g)\n",
            dst_name, d, d32, df, amax);
  }
  free(got);
  free(want);
}

static void test_f32_matches_golden(void) {
  /* the source itself agrees with transformers (test_golden checks more) */
  char p[400], *data = NULL;
  size_t n = 0;
  snprintf(p, sizeof p, "%s/logits_f32.bin", GOLDEN);
  CHECK(hfile_read(p, &data, &n, NULL) == 0 && n >= NIDS * 512 * 4);
  ref_kind none = {.type = BK_F32, .vec_type = BK_F32};
  check_target("f32.gguf", "--quant f32", none, 1e-5);
  check_target("f32-st", "--to safetensors --quant f32", none, 1e-6);
  snprintf(p, sizeof p, "%s/f32.gguf", tmp);
  float *got = forward(p, ids, NIDS);
  if (got && data) {
    double amax, d = max_abs_diff(got, (const float *)data, (size_t)NIDS * 512, &amax);
    CHECK_MSG(d <= 1e-4 * (1 + amax), "f32.gguf vs transformers: %g", d);
  }
  free(got);
  free(data);
}

static void test_float_types(void) {
  check_target("f16.gguf", "--quant f16", (ref_kind){.type = BK_F16, .vec_type = BK_F32}, 0.01);
  check_target("bf16.gguf", "--quant bf16", (ref_kind){.type = BK_BF16, .vec_type = BK_F32}, 0.05);
  check_target("bf16-st", "--to safetensors --quant bf16", (ref_kind){.type = BK_BF16, .vec_type = BK_BF16}, 0.05);
  check_target("f16-st", "--quant f16", (ref_kind){.type = BK_F16, .vec_type = BK_F16}, 0.01);
}

static void test_quantized(void) {
  check_target("q8_0.gguf", "--quant q8_0", (ref_kind){.type = BK_Q8_0, .gguf_fallback = true, .vec_type = BK_F32}, 0.05);
  check_target("q4_0.gguf", "--quant q4_0", (ref_kind){.type = BK_Q4_0, .gguf_fallback = true, .vec_type = BK_F32}, 0.5);
  check_target("q4_k.gguf", "--quant q4_k", (ref_kind){.type = BK_Q4_K, .gguf_fallback = true, .vec_type = BK_F32}, 0.5);
  /* FP8 E4M3 (3 mantissa bits): between mlx8 and mlx4 */
  check_target("fp8", "--to safetensors --quant fp8", (ref_kind){.fp8 = true, .vec_type = BK_F32}, 0.1);
  check_target("mlx8", "--to safetensors --quant mlx8 --group-size 32", (ref_kind){.mlx_bits = 8, .mlx_gs = 32, .vec_type = BK_F32}, 0.05);
  check_target("mlx4", "--quant mlx4", (ref_kind){.mlx_bits = 4, .mlx_gs = 64, .vec_type = BK_F32}, 0.5);
  check_target("mlx4-g128", "--quant mlx4 --group-size 128", (ref_kind){.mlx_bits = 4, .mlx_gs = 128, .vec_type = BK_F32}, 0.5);
  /* the MLX folder's config and tensors */
  char p[400];
  snprintf(p, sizeof p, "%s/mlx4/config.json", tmp);
  model_config c;
  herr err = {0};
  CHECK_MSG(model_config_load(&c, p, &err) == 0, "%s", err.msg);
  CHECK_EQ_INT(c.quant_bits, 4);
  CHECK_EQ_INT(c.quant_group_size, 64);
  config_free(&c);
  snprintf(p, sizeof p, "%s/mlx4", tmp);
  st_set s;
  if (st_open(&s, p, &err) == 0) {
    const st_tensor *t = st_find(&s, "model.layers.0.mlp.down_proj.weight");
    CHECK(t && t->dtype == ST_U32 && t->shape[0] == 64 && t->shape[1] == 128 * 4 / 32);
    t = st_find(&s, "model.layers.0.mlp.down_proj.scales");
    CHECK(t && t->dtype == ST_F32 && t->shape[0] == 64 && t->shape[1] == 2);
    CHECK(st_find(&s, "model.layers.0.mlp.down_proj.biases") != NULL);
    t = st_find(&s, "model.norm.weight");
    CHECK(t && t->dtype == ST_F32);
    st_close(&s);
  } else {
    CHECK_MSG(0, "%s", err.msg);
  }
  snprintf(p, sizeof p, "%s/mlx4/tokenizer.json", tmp);
  CHECK(hfile_exists(p));
}

static int64_t get_int(const gguf_file *g, const char *key) {
  int64_t v = -1;
  herr err = {0};
  CHECK_MSG(gguf_get_int(g, key, &v, &err) == 0, "%s", err.msg);
  return v;
}

static void test_gguf_metadata(void) {
  char p[400];
  snprintf(p, sizeof p, "%s/q4_0.gguf", tmp);
  gguf_file *g = NULL;
  herr err = {0};
  CHECK_MSG(gguf_open(&g, p, &err) == 0, "%s", err.msg);
  if (!g) return;
  char *s = NULL;
  CHECK(gguf_get_strdup(g, "general.architecture", &s, &err) == 0);
  CHECK_EQ_STR(s, "llama");
  free(s);
  CHECK_EQ_INT(get_int(g, "llama.block_count"), 2);
  CHECK_EQ_INT(get_int(g, "llama.embedding_length"), 64);
  CHECK_EQ_INT(get_int(g, "llama.feed_forward_length"), 128);
  CHECK_EQ_INT(get_int(g, "llama.attention.head_count"), 4);
  CHECK_EQ_INT(get_int(g, "llama.attention.head_count_kv"), 2);
  CHECK_EQ_INT(get_int(g, "llama.context_length"), 128);
  CHECK_EQ_INT(get_int(g, "llama.rope.dimension_count"), 16);
  CHECK_EQ_INT(get_int(g, "general.file_type"), 2);
  double eps = 0, theta = 0;
  CHECK(gguf_get_float(g, "llama.attention.layer_norm_rms_epsilon", &eps, &err) == 0 && fabs(eps - 1e-6) < 1e-12);
  CHECK(gguf_get_float(g, "llama.rope.freq_base", &theta, &err) == 0 && theta == 10000);
  CHECK(gguf_get_strdup(g, "tokenizer.ggml.model", &s, &err) == 0);
  CHECK_EQ_STR(s, "gpt2");
  free(s);
  CHECK(gguf_get_strdup(g, "tokenizer.ggml.pre", &s, &err) == 0);
  CHECK_EQ_STR(s, "gpt-2");
  free(s);
  gguf_arr a;
  CHECK(gguf_get_arr(g, "tokenizer.ggml.tokens", &a, &err) == 0 && a.n == 512);
  CHECK(gguf_get_arr(g, "tokenizer.ggml.merges", &a, &err) == 0 && a.n == 253);
  CHECK(gguf_get_arr(g, "tokenizer.ggml.token_type", &a, &err) == 0 && gguf_arr_int(&a, 1) == 3 && gguf_arr_int(&a, 300) == 1);
  CHECK_EQ_INT(get_int(g, "tokenizer.ggml.bos_token_id"), 1);
  CHECK_EQ_INT(get_int(g, "tokenizer.ggml.eos_token_id"), 2);
  bool add_bos = true;
  CHECK(gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos, &err) == 0 && !add_bos);
  CHECK(gguf_has(g, "tokenizer.chat_template"));
  const gguf_tensor *t = gguf_find_tensor(g, "blk.0.attn_q.weight");
  CHECK(t && t->type == GGUF_TENSOR_Q4_0 && t->dims[0] == 64 && t->dims[1] == 64);
  t = gguf_find_tensor(g, "blk.1.attn_norm.weight");
  CHECK(t && t->type == GGUF_TENSOR_F32 && t->ndim == 1);
  t = gguf_find_tensor(g, "output.weight");
  CHECK(t && t->type == GGUF_TENSOR_Q4_0 && t->dims[1] == 512);
  CHECK(gguf_find_tensor(g, "token_embd.weight") != NULL);
  CHECK_EQ_INT(gguf_tensor_count(g), 3 + 2 * 9);
  gguf_close(g);

  /* f32: k_proj rows in llama.cpp's order: GGUF row h*hd + 2i + s = HF row h*hd + s*hd/2 + i */
  snprintf(p, sizeof p, "%s/f32.gguf", tmp);
  st_set st;
  CHECK(st_open(&st, GOLDEN, &err) == 0);
  if (gguf_open(&g, p, &err) == 0) {
    const gguf_tensor *k = gguf_find_tensor(g, "blk.1.attn_k.weight");
    const st_tensor *hk = st_find(&st, "model.layers.1.self_attn.k_proj.weight");
    bool same = k && hk && k->type == GGUF_TENSOR_F32;
    for (int h = 0; same && h < 2; h++)
      for (int i = 0; i < 8; i++)
        for (int s2 = 0; s2 < 2; s2++)
          same = same && !memcmp((const float *)k->data + (h * 16 + 2 * i + s2) * 64,
                                 (const char *)hk->data + (size_t)(h * 16 + s2 * 8 + i) * 64 * 4, 64 * 4);
    CHECK_MSG(same, "attn_k rows are not in llama.cpp's order");
    const gguf_tensor *v = gguf_find_tensor(g, "blk.1.attn_v.weight");
    const st_tensor *hv = st_find(&st, "model.layers.1.self_attn.v_proj.weight");
    CHECK(v && hv && !memcmp(v->data, hv->data, hv->nbytes));
    gguf_close(g);
  }
  st_close(&st);
}

/* tokenizer of the GGUF = tokenizer.json */
static void same_ids(const char *a_path, const char *b_path, const char *const *texts, int n, const char *what) {
  tokenizer *a = NULL, *b = NULL;
  herr err = {0};
  CHECK_MSG(tokenizer_load(a_path, &a, &err) == 0, "%s: %s", a_path, err.msg);
  CHECK_MSG(tokenizer_load(b_path, &b, &err) == 0, "%s: %s", b_path, err.msg);
  for (int i = 0; a && b && i < n; i++) {
    int32_t *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    CHECK(tokenizer_encode(a, texts[i], strlen(texts[i]), true, true, &x, &nx, &err) == 0);
    CHECK(tokenizer_encode(b, texts[i], strlen(texts[i]), true, true, &y, &ny, &err) == 0);
    CHECK_MSG(nx == ny && (!nx || !memcmp(x, y, nx * sizeof *x)), "%s: \"%s\": %zu ids from GGUF, %zu from tokenizer.json", what,
              texts[i], nx, ny);
    free(x);
    free(y);
  }
  tokenizer_free(a);
  tokenizer_free(b);
}

static const char *const texts[] = {"hello there, the cat sat on the mat.", "  leading spaces and\nnew lines\n\n",
                                    "Numbers 12345 and 3.14159!", "MiXeD CaSe don't won't I'll", "tabs\tand   runs    of spaces",
                                    "caf\xc3\xa9 na\xc3\xafve \xe2\x82\xac 100"};
#define NTEXTS (int)(sizeof texts / sizeof texts[0])

static void test_tokenizer_small(void) {
  char p[400];
  snprintf(p, sizeof p, "%s/q8_0.gguf", tmp);
  same_ids(p, src, texts, NTEXTS, "engine tokenizer");
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float frand(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((double)(rng >> 11) / 9007199254740992.0 * 2 - 1);
}

/* A random llama folder: hidden D, heads H (head_dim D/H), kv heads KV, ffn I, vocab V, L layers. */
static void make_random_llama(const char *dir, int D, int H, int KV, int I, int V, int L) {
  mkdir(dir, 0755);
  char p[512];
  snprintf(p, sizeof p, "%s/config.json", dir);
  FILE *f = fopen(p, "w");
  if (!f) {
    CHECK(0);
    return;
  }
  fprintf(f,
          "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": %d, \"intermediate_size\": %d,"
          " \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"num_hidden_layers\": %d, \"vocab_size\": %d,"
          " \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"hidden_act\": \"silu\","
          " \"tie_word_embeddings\": true, \"torch_dtype\": \"float32\", \"bos_token_id\": 1, \"eos_token_id\": 2}\n",
          D, I, H, KV, L, V);
  fclose(f);
  int hd = D / H;
  st_writer *w = st_writer_new();
  float *bufs[64];
  int nb = 0;
#define T2(name, r, c, scale)                                                          \
  do {                                                                                 \
    int64_t sh[2] = {r, c};                                                            \
    float *x = bufs[nb++] = malloc((size_t)(r) * (size_t)(c) * sizeof(float));          \
    for (int64_t q = 0; q < (int64_t)(r) * (c); q++) x[q] = frand() * (scale);          \
    st_writer_tensor(w, name, ST_F32, 2, sh, x);                                       \
  } while (0)
#define T1(name, n)                                                                    \
  do {                                                                                 \
    int64_t sh[1] = {n};                                                               \
    float *x = bufs[nb++] = malloc((size_t)(n) * sizeof(float));                        \
    for (int q = 0; q < (n); q++) x[q] = 1 + 0.1f * frand();                           \
    st_writer_tensor(w, name, ST_F32, 1, sh, x);                                       \
  } while (0)
  char nm[128];
  T2("model.embed_tokens.weight", V, D, 1.0f);
  T1("model.norm.weight", D);
  for (int l = 0; l < L && nb < 56; l++) {
    float s = 1.0f / sqrtf((float)D) * 1.7f;
    snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
    T1(nm, D);
    snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
    T1(nm, D);
    snprintf(nm, sizeof nm, "model.layers.%d.self_attn.q_proj.weight", l);
    T2(nm, H * hd, D, s);
    snprintf(nm, sizeof nm, "model.layers.%d.self_attn.k_proj.weight", l);
    T2(nm, KV * hd, D, s);
    snprintf(nm, sizeof nm, "model.layers.%d.self_attn.v_proj.weight", l);
    T2(nm, KV * hd, D, s);
    snprintf(nm, sizeof nm, "model.layers.%d.self_attn.o_proj.weight", l);
    T2(nm, D, H * hd, s);
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.gate_proj.weight", l);
    T2(nm, I, D, s);
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.up_proj.weight", l);
    T2(nm, I, D, s);
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.down_proj.weight", l);
    T2(nm, D, I, 1.7f / sqrtf((float)I));
  }
#undef T1
#undef T2
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  herr err = {0};
  CHECK_MSG(st_writer_write(w, p, NULL, NULL, &err) == 0, "%s", err.msg);
  st_writer_free(w);
  for (int i = 0; i < nb; i++) free(bufs[i]);
}

/* A block-quantized GGUF (Q4_K, Q5_K, Q6_K, Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL,
 * IQ4_XS) of a model 256 wide: tensor types, file type, and logits against
 * the dequantized reference (f32 activations) and through the 8-bit integer
 * kernels (where the type has them). */
static void check_k_wide(const char *quant, bk_type type, gguf_tensor_type gtype, int file_type) {
  char dir[400], dst[400], ref[400], cmd[1200];
  snprintf(dir, sizeof dir, "%s/wide", tmp);
  struct stat st;
  if (stat(dir, &st) != 0) make_random_llama(dir, 256, 4, 2, 512, 512, 2);
  snprintf(dst, sizeof dst, "%s/wide-%s.gguf", tmp, quant);
  snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' --quant %s", HEARTH_BINARY, dir, dst, quant);
  int rc = run(cmd);
  CHECK_MSG(rc == 0, "exit %d", rc);
  gguf_file *g = NULL;
  herr err = {0};
  if (!rc && gguf_open(&g, dst, &err) == 0) {
    const gguf_tensor *t = gguf_find_tensor(g, "blk.1.ffn_down.weight");
    CHECK(t && t->type == gtype);
    t = gguf_find_tensor(g, "token_embd.weight");
    CHECK(t && t->type == gtype);
    CHECK(gguf_find_tensor(g, "output.weight") == NULL); /* tied */
    CHECK_EQ_INT(get_int(g, "general.file_type"), file_type);
    gguf_close(g);
  }
  snprintf(ref, sizeof ref, "%s/wide-ref-%s", tmp, quant);
  make_ref(dir, ref, (ref_kind){.type = type, .vec_type = BK_F32});
  int32_t tok[12] = {1, 7, 99, 300, 511, 42, 8, 8, 250, 3, 77, 400};
  float *got = rc ? NULL : forward(dst, tok, 12), *want = forward(ref, tok, 12), *f32 = forward(dir, tok, 12);
  if (got && want && f32) {
    double amax, d = max_abs_diff(got, want, 12 * 512, &amax), d32 = max_abs_diff(got, f32, 12 * 512, NULL);
    CHECK_MSG(d <= 2e-5 * (1 + amax), "%s wide: %g from the dequantized reference", quant, d);
    CHECK_MSG(d32 <= 0.5 * amax, "%s wide: %g from f32 (max %g)", quant, d32, amax);
    float *fast = forward_mode(dst, tok, 12, false); /* through the 8-bit integer kernels */
    double df = fast ? max_abs_diff(fast, got, 12 * 512, NULL) : INFINITY;
    CHECK_MSG(df <= 0.02 * amax, "%s wide: 8-bit activations moved the logits by %g (max %g)", quant, df, amax);
    free(fast);
    fprintf(stderr, "  %s (256 wide) vs dequantized reference %.2g, vs f32 %.3g, 8-bit activations vs f32 activations %.3g (max |logit| %.3g)\n",
            quant, d, d32, df, amax);
  }
  free(got), free(want), free(f32);
}

static void test_k_quants_wide(void) {
  check_k_wide("q4_k", BK_Q4_K, GGUF_TENSOR_Q4_K, 14);
  check_k_wide("q5_k", BK_Q5_K, GGUF_TENSOR_Q5_K, 16);
  check_k_wide("q6_k", BK_Q6_K, GGUF_TENSOR_Q6_K, 18);
  check_k_wide("q5_0", BK_Q5_0, GGUF_TENSOR_Q5_0, 8);
  check_k_wide("q5_1", BK_Q5_1, GGUF_TENSOR_Q5_1, 9);
  check_k_wide("q2_k", BK_Q2_K, GGUF_TENSOR_Q2_K, 10);
  check_k_wide("q3_k", BK_Q3_K, GGUF_TENSOR_Q3_K, 11);
  check_k_wide("iq4_nl", BK_IQ4_NL, GGUF_TENSOR_IQ4_NL, 25);
  check_k_wide("iq4_xs", BK_IQ4_XS, GGUF_TENSOR_IQ4_XS, 30);
}

static void test_gguf_to_safetensors(void) {
  char from[400], dst[400], cmd[1200];
  snprintf(from, sizeof from, "%s/q8_0.gguf", tmp);
  snprintf(dst, sizeof dst, "%s/from-gguf", tmp);
  snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' --quant f32", HEARTH_BINARY, from, dst);
  int rc = run(cmd);
  char *se = last_stderr();
  CHECK_MSG(rc == 0, "exit %d: %s", rc, se);
  free(se);
  float *a = rc ? NULL : forward(dst, ids, NIDS), *b = forward(from, ids, NIDS);
  if (a && b) {
    double amax, d = max_abs_diff(a, b, (size_t)NIDS * 512, &amax);
    CHECK_MSG(d <= 2e-5 * (1 + amax), "GGUF → safetensors changed the logits by %g", d);
  }
  free(a), free(b);
  /* and back to GGUF, requantized from the GGUF */
  char back[400];
  snprintf(back, sizeof back, "%s/requant.gguf", tmp);
  snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' --quant q8_0", HEARTH_BINARY, from, back);
  CHECK(run(cmd) == 0);
  tokenizer *t = NULL;
  herr err = {0};
  CHECK_MSG(tokenizer_load(back, &t, &err) == 0, "%s", err.msg);
  tokenizer_free(t);
}

static void test_errors(void) {
  char cmd[1200], *se;
  snprintf(cmd, sizeof cmd, "'%s' convert '%s/tests/fixtures/golden/gemma2-f32' '%s/g.gguf'", HEARTH_BINARY, HEARTH_SOURCE_DIR, tmp);
  CHECK_EQ_INT(run(cmd), 1);
  se = last_stderr();
  CHECK_MSG(strstr(se, "gemma2") && strstr(se, "cannot be exported to GGUF"), "%s", se);
  free(se);
  snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s/x.gguf' --quant mlx4", HEARTH_BINARY, src, tmp);
  CHECK_EQ_INT(run(cmd), 2);
  snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s/x.gguf' --quant iq2_xs", HEARTH_BINARY, src, tmp);
  CHECK_EQ_INT(run(cmd), 1);
  se = last_stderr();
  CHECK_MSG(strstr(se, "iq2_xs"), "%s", se);
  free(se);
  snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s/x' --quant q4_0", HEARTH_BINARY, src, tmp);
  CHECK_EQ_INT(run(cmd), 1);
  snprintf(cmd, sizeof cmd, "'%s' convert '%s/nope' '%s/x.gguf'", HEARTH_BINARY, tmp, tmp);
  CHECK_EQ_INT(run(cmd), 1);
  snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s/x' --group-size 48", HEARTH_BINARY, src, tmp);
  CHECK_EQ_INT(run(cmd), 2);
  snprintf(cmd, sizeof cmd, "'%s' convert '%s'", HEARTH_BINARY, src);
  CHECK_EQ_INT(run(cmd), 2);
}

/* Llama-3 RoPE scaling goes into GGUF as llama.cpp's per-frequency factors
 * (rope_freqs.weight), which the GGUF loader applies: the converted file
 * gives the folder's logits and transformers' (the golden fixture's first
 * prompt); converted again to GGUF it keeps them; to safetensors it is
 * refused (config.json has no form for the factors). */
static void test_llama3_rope(void) {
  char from[400], dst[400], again[400], st[400], cmd[1200], p[500], *data = NULL;
  snprintf(from, sizeof from, "%s/tests/fixtures/golden/llama_llama3-f32", HEARTH_SOURCE_DIR);
  snprintf(dst, sizeof dst, "%s/llama3.gguf", tmp);
  snprintf(again, sizeof again, "%s/llama3-again.gguf", tmp);
  snprintf(st, sizeof st, "%s/llama3-st", tmp);
  snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' --quant f32", HEARTH_BINARY, from, dst);
  CHECK_EQ_INT(run(cmd), 0);
  gguf_file *g = NULL;
  CHECK(gguf_open(&g, dst, NULL) == 0);
  CHECK(g && gguf_find_tensor(g, "rope_freqs.weight") != NULL);
  gguf_close(g);
  float *want = forward(from, ids, NIDS), *got = forward(dst, ids, NIDS);
  size_t n = 0;
  snprintf(p, sizeof p, "%s/logits_f32.bin", from);
  CHECK(hfile_read(p, &data, &n, NULL) == 0 && n >= NIDS * 512 * 4);
  if (want && got && data) {
    double amax, d = max_abs_diff(got, want, (size_t)NIDS * 512, &amax);
    CHECK_MSG(d <= 1e-5 * (1 + amax), "llama3 GGUF vs its folder: logits differ by %g (max |logit| %g)", d, amax);
    double dt = max_abs_diff(got, (const float *)data, (size_t)NIDS * 512, &amax);
    CHECK_MSG(dt <= 1e-4 * (1 + amax), "llama3 GGUF vs transformers: %g", dt);
  }
  /* GGUF to GGUF keeps the factors */
  snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' --quant f32", HEARTH_BINARY, dst, again);
  CHECK_EQ_INT(run(cmd), 0);
  float *got2 = forward(again, ids, NIDS);
  if (got && got2) CHECK(max_abs_diff(got, got2, (size_t)NIDS * 512, NULL) == 0);
  snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' --to safetensors --quant f32", HEARTH_BINARY, dst, st);
  CHECK(run(cmd) != 0);
  char *se = last_stderr();
  CHECK_MSG(strstr(se, "rope_freqs.weight") != NULL, "%s", se);
  free(se);
  free(want);
  free(got);
  free(got2);
  free(data);
}

/* Real tokenizers written as GGUF vocabularies. */
static void test_tokenizers_deps(void) {
  static const struct { const char *dep; int vocab; } deps[] = {{"llama2", 32000}, {"llama3_1", 128256}, {"qwen3", 151936}};
  for (int i = 0; i < 3; i++) {
    char tdir[400], dir[400], dst[400], cmd[1200];
    snprintf(tdir, sizeof tdir, "%s/tokenizers/%s", HEARTH_DEPS_DIR, deps[i].dep);
    char tj[512];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", tdir);
    if (!hfile_exists(tj)) {
      fprintf(stderr, "NOT RUN: %s is missing (tools/fetch_test_deps.sh)\n", tj);
      continue;
    }
    snprintf(dir, sizeof dir, "%s/tok-%s", tmp, deps[i].dep);
    make_random_llama(dir, 32, 2, 1, 32, deps[i].vocab, 1);
    char to[512];
    snprintf(to, sizeof to, "%s/tokenizer.json", dir);
    copy(tj, to);
    snprintf(tj, sizeof tj, "%s/tokenizer_config.json", tdir);
    snprintf(to, sizeof to, "%s/tokenizer_config.json", dir);
    copy(tj, to);
    snprintf(dst, sizeof dst, "%s/tok-%s.gguf", tmp, deps[i].dep);
    snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' --quant q8_0", HEARTH_BINARY, dir, dst);
    int rc = run(cmd);
    char *se = last_stderr();
    CHECK_MSG(rc == 0, "%s: exit %d: %s", deps[i].dep, rc, se);
    free(se);
    if (!rc) same_ids(dst, dir, texts, NTEXTS, deps[i].dep);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, dst);
    CHECK(system(cmd) == 0);
  }
}

/* Optional: llama.cpp (node-llama-cpp in .deps/bench-node) loads the converted
 * GGUFs, runs a forward, and tokenizes like hearth. */
static void test_llamacpp_loads(void) {
  const char *nm = HEARTH_DEPS_DIR "/bench-node/node_modules";
  char probe[512];
  snprintf(probe, sizeof probe, "%s/node-llama-cpp/package.json", nm);
  if (!hfile_exists(probe) || system("node --version >/dev/null 2>&1")) {
    fprintf(stderr, "NOT RUN: node-llama-cpp is not installed in %s\n", nm);
    return;
  }
  char path[512], cmd[2048];
  snprintf(path, sizeof path, "%s/node_modules", tmp);
  if (symlink(nm, path)) {
    CHECK_MSG(0, "symlink %s", path);
    return;
  }
  snprintf(path, sizeof path, "%s/check.mjs", tmp);
  FILE *f = fopen(path, "w");
  if (!f) return;
  fputs("import {getLlama} from \"node-llama-cpp\";\n"
        "const llama = await getLlama({gpu: false, build: \"never\", logLevel: \"error\"});\n"
        "for (const f of process.argv.slice(2)) {\n"
        "  const model = await llama.loadModel({modelPath: f});\n"
        "  const ctx = await model.createContext({contextSize: 64, threads: 1});\n"
        "  await ctx.getSequence().evaluateWithoutGeneratingNewTokens([1, 5, 9, 300]);\n"
        "  console.log(JSON.stringify(Array.from(model.tokenize(\"hello there, the cat sat\", false))));\n"
        "  await ctx.dispose(); await model.dispose();\n"
        "}\n", f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "cd '%s' && node check.mjs f32.gguf q8_0.gguf q4_0.gguf q4_k.gguf bf16.gguf > lc.txt", tmp);
  int rc = run(cmd);
  char *se = last_stderr();
  CHECK_MSG(rc == 0, "llama.cpp could not load a converted GGUF: %s", se);
  free(se);
  tokenizer *t = NULL;
  herr err = {0};
  int32_t *x = NULL;
  size_t n = 0;
  snprintf(path, sizeof path, "%s/q8_0.gguf", tmp);
  CHECK(tokenizer_load(path, &t, &err) == 0 &&
        tokenizer_encode(t, "hello there, the cat sat", 24, false, false, &x, &n, &err) == 0);
  char want[1024] = "[";
  for (size_t i = 0; i < n; i++) snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", i ? "," : "", (int)x[i]);
  strcat(want, "]\n");
  free(x);
  tokenizer_free(t);
  snprintf(path, sizeof path, "%s/lc.txt", tmp);
  char *got = NULL;
  size_t glen = 0;
  if (!rc && hfile_read(path, &got, &glen, &err) == 0) {
    int lines = 0;
    for (char *l = got; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
      lines++;
      CHECK_MSG(!strncmp(l, want, strlen(want)), "llama.cpp ids %.*s, hearth %s", (int)(strchr(l, '\n') ? strchr(l, '\n') - l : 0), l, want);
    }
    CHECK_EQ_INT(lines, 5);
  }
  free(got);
}

/* The other exportable goldens (qwen2 with q/k/v biases, qwen3 with q/k norms, mistral, yarn RoPE) keep their logits in f32 GGUF. */
static void test_other_families(void) {
  static const char *const names[] = {"qwen2-f32", "qwen3-f32", "mistral-f32", "llama_yarn-f32"};
  int32_t tok[8] = {1, 5, 9, 30, 7, 8, 100, 3};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char from[400], dst[400], cmd[1200];
    snprintf(from, sizeof from, "%s/tests/fixtures/golden/%s", HEARTH_SOURCE_DIR, names[i]);
    snprintf(dst, sizeof dst, "%s/%s.gguf", tmp, names[i]);
    snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' --quant f32", HEARTH_BINARY, from, dst);
    int rc = run(cmd);
    CHECK_MSG(rc == 0, "%s: exit %d", names[i], rc);
    float *a = rc ? NULL : forward(dst, tok, 8), *b = forward(from, tok, 8);
    if (a && b) {
      char p[400];
      snprintf(p, sizeof p, "%s/config.json", from);
      model_config c;
      herr err = {0};
      CHECK(model_config_load(&c, p, &err) == 0);
      double amax, d = max_abs_diff(a, b, (size_t)(8 * c.vocab_size), &amax);
      CHECK_MSG(d <= 2e-5 * (1 + amax), "%s: f32 GGUF logits differ by %g", names[i], d);
      config_free(&c);
    }
    free(a), free(b);
  }
}

int main(void) {
  snprintf(tmp, sizeof tmp, "/tmp/hearth_convert_XXXXXX");
  CHECK(mkdtemp(tmp) != NULL);
  setup_source();
  CHECK(src_logits != NULL);
  RUN(test_f32_matches_golden);
  RUN(test_float_types);
  RUN(test_quantized);
  RUN(test_gguf_metadata);
  RUN(test_tokenizer_small);
  RUN(test_k_quants_wide);
  RUN(test_gguf_to_safetensors);
  RUN(test_other_families);
  RUN(test_llama3_rope);
  RUN(test_errors);
  RUN(test_tokenizers_deps);
  RUN(test_llamacpp_loads);
  free(src_logits);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmp);
  TEST_MAIN_END();
}
