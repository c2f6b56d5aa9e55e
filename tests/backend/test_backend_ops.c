/* test_backend_ops.c — every op of the backend interface (backend.h), run
 * through bk_* calls on each backend that can be opened here, against a
 * plain reference computed on the host from the op's definition.
 *
 * Backends. The CPU backend always runs; it is opened with f32_activations
 * so that GGUF-quantized matmuls multiply f32 activations by the exactly
 * dequantized weights (no 8-bit activation repacking), which makes it
 * comparable to an exact reference. The device named by HEARTH_TEST_DEVICE
 * ("cuda" by default, e.g. "cuda:1") runs every case too when it opens;
 * when it cannot, one line says why and the run continues on the CPU alone.
 * HEARTH_TEST_REQUIRE_CUDA=1 turns "cannot open" into a failure (for the
 * GPU machine). Both backends are compared against the same host reference,
 * not against each other, so a fault in one never hides or fakes a fault in
 * the other.
 *
 * References. Elementwise ops, rmsnorm, rope, embed, get_rows and kv_write
 * are recomputed here in double. Matmul: every weight row dequantized with
 * bk_dequant_row, then double-precision dot products (plus bias). Attention:
 * op_attention_ref (scalar loops) over a kv_view built from host pointers
 * to the blocks that each sequence's block table names.
 *
 * Coverage. embed and matmul for every stored format (f32, f16, bf16, Q8_0,
 * Q4_0, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, FP8, MLX
 * affine 4/8-bit with group sizes 32/64/128 and
 * f32/f16/bf16 scales); matmul at 1, 2, 3, 7, 8, 9, 33 and 100 rows (the
 * GEMV and GEMM paths), with and without bias, odd output counts, long
 * rows, and x / y as row windows of larger tensors (the rows around y must
 * stay untouched); rmsnorm without weight, with weight, with unit offset,
 * in place, odd widths; rope rotate-half and interleaved, partial rotary
 * width, attn_scale != 1, unsorted non-contiguous positions; act_mul for
 * all four activations; add into a separate output and aliased onto either
 * input; softcap; get_rows with repeated and out-of-order rows; kv_write to
 * out-of-order slots with gaps (the untouched slots must keep their
 * contents), also into 8 / 4-bit and FP8 arenas (the rows must be the
 * reference quantizer's); attention with GQA ratios 1/2/4/8, head dims
 * 16/32/48/64/80/128/256, sliding windows, softcap, block_rows 1/16/64, block
 * tables with gaps and non-monotonic block ids, batches mixing sequences of
 * different lengths in decode (one query), prefill (all rows) and chunked
 * prefill (queries from row > 0 against rows already cached), each with
 * f32, 8-bit, 4-bit, FP8, 8-bit-K / 4-bit-V and FP8-K / 8-bit-V arenas
 * (the reference reads the same stored rows, dequantizing); scale and
 * get_cols; lora (two adapters of different ranks on two runs of rows,
 * the rows around them unchanged; also the plain op_lora); moe_route with exact logit ties (the lower id wins), with and
 * without renormalization and per-expert scale, ids compared exactly; moe
 * for every stored format and activation, at 1 to 200 tokens (an expert
 * chosen by more pairs than one tile of the grouped GEMM holds), with experts used by several
 * tokens, by none, and a slot whose id is out of range (it contributes
 * nothing), also checking the CPU's plain reference bk_moe_ref; moe with
 * LoRA deltas on the experts (bk_expert_lora) as layer_experts runs them —
 * every row plain, then runs of rows (row views) under stacked adapter sets
 * of ranks 0 to 16, rows without adapters between them —, f32, f16, Q8_0,
 * Q4_K and MLX weights, decode and batches past the GEMV path; conv1d
 * with state and the gated delta rule (against op_conv1d_state /
 * op_delta_rule_ref, token by token) over batches of fresh and continued
 * sequences in shuffled state slots — decode, prefill over several chunks,
 * mixes, and a prefill split in two steps —, outputs and the whole state
 * arena (unused slots unchanged); sigmoid_mul per element and per row;
 * set_cols
 * and set_rows (untouched elements must keep their values); layernorm with
 * and without weight and bias, in place; moe_route_group (sigmoid scores,
 * correction bias, groups, ties) against op_moe_route_group, itself checked
 * on a hand-made row; index_topk against op_index_topk (ids exactly, rows of
 * zeros and copied rows giving exact score ties, which go to the lower row),
 * the reference's choice checked against the scores recomputed here; and
 * attention_sparse against op_attention_sparse over the reference's choice,
 * on paged arenas with shuffled blocks and NaN in unowned ones.
 *
 * Checks. Inputs are fresh random values per case (seeded xorshift, never
 * zero). Every output tensor that is not also an input is filled with NaN
 * before the op, so an element the op fails to write fails the case. The
 * error measure is the normalized MSE, nmse = sum((got - ref)^2) / sum(ref^2);
 * any NaN or Inf in an output fails. Limits:
 *   elementwise, norms, rope, copies, embed   1e-9  (every backend)
 *   matmul, lora, attention on the CPU        1e-7
 *   matmul, lora on a GPU                     1e-6  (bf16 weights in the GEMM
 *       path multiply a two-term bf16 split of the activations: ~1e-5
 *       relative error per product, far below this after summation)
 *   attention on a GPU                        1e-7
 *   attention on a GPU, fast precision        1e-4  (bf16 Q, K, V and
 *       probabilities on tensor cores, f32 sums: ~1e-6 expected)
 *   FP8 matmul on a GPU, fast precision       1e-6  (against a reference
 *       that quantizes the activations' rows to E4M3 as the device does)
 * f32 arithmetic against an exact reference gives nmse around 1e-13 here;
 * a wrong kernel (a skipped block, a wrong scale, a misread row or slot)
 * gives 1e-4 or more, so these limits separate the two by orders of
 * magnitude. Unreferenced KV blocks hold NaN and the unused tail rows of a
 * sequence's last block hold large values, so attention reading a slot it
 * must not read fails.
 *
 * A summary table lists, per op (per format for matmul), the number of
 * cases and the largest nmse seen on each backend. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/formats.h"
#include "backend/ops.h"
#include "backend/cpu/pack.h"
#include "backend/weights.h"
#include "test.h"
#include "weight_formats.h"
#include "test_device.h"

/* ---- random inputs ---- */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}
/* uniform in (-1, 1), never exactly zero */
static float urand(void) { return (float)(((double)(next_u64() >> 11) + 0.5) / 9007199254740992.0 * 2.0 - 1.0); }
static int64_t irand(int64_t n) { return (int64_t)(next_u64() % (uint64_t)n); }

static float *rand_floats(int64_t n, float amp) {
  float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) p[i] = urand() * amp;
  return p;
}

static void shuffle_i64(int64_t *a, int64_t n) {
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = irand(i + 1), t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
}

/* ---- backends ---- */

#define MAX_DEVS 2
static bk_backend *devs[MAX_DEVS]; /* [0] the CPU, [1] the compared device when it opened */
static int n_devs = 0;
static char dev_label[32] = "cuda";

/* ---- per-op statistics and the comparison ---- */

typedef struct op_stat {
  char name[40];
  int cases;
  double max[MAX_DEVS];
} op_stat;
static op_stat stats[256];
static int n_stats = 0;

static op_stat *stat_for(const char *name) {
  for (int i = 0; i < n_stats; i++)
    if (!strcmp(stats[i].name, name)) return &stats[i];
  if (n_stats == (int)(sizeof stats / sizeof stats[0])) {
    fprintf(stderr, "test_backend_ops: too many op names\n");
    exit(1);
  }
  op_stat *s = &stats[n_stats++];
  memset(s, 0, sizeof *s);
  snprintf(s->name, sizeof s->name, "%s", name);
  return s;
}

#define LIM_ELEM 1e-9
#define LIM_CPU_MATMUL 1e-7
#define LIM_CPU_ATTN 1e-7
#define LIM_DEV_MATMUL 1e-6
#define LIM_DEV_ATTN 1e-7
/* the device's fast precision: attention over bf16 Q, K, V and probabilities on tensor cores */
#define LIM_DEV_ATTN_FAST 1e-4

typedef enum lim_kind { K_ELEM, K_MATMUL, K_ATTN, K_ATTN_FAST } lim_kind;

static double limit_for(lim_kind k, int di) {
  if (k == K_ELEM) return LIM_ELEM;
  if (k == K_ATTN_FAST) return LIM_DEV_ATTN_FAST;
  if (k == K_MATMUL) return di == 0 ? LIM_CPU_MATMUL : LIM_DEV_MATMUL;
  return di == 0 ? LIM_CPU_ATTN : LIM_DEV_ATTN;
}

/* nmse of got against ref; INFINITY when got has a NaN / Inf. */
static double nmse(const float *got, const double *ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(got[i])) return INFINITY;
    double d = (double)got[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return num / den;
}

/* One comparison of one case on backend di; prints a line when it fails. */
static void compare(op_stat *st, lim_kind kind, int di, const char *shape, const float *got, const double *ref, int64_t n) {
  double e = nmse(got, ref, n), lim = limit_for(kind, di);
  if (!(e <= st->max[di])) st->max[di] = isnan(e) ? INFINITY : e;
  test_checks++;
  if (!(e <= lim)) {
    test_failures++;
    fprintf(stderr, "FAIL %s [%s] on %s: nmse %.3g (limit %.0e)%s\n", st->name, shape, bk_backend_name(devs[di]), e, lim,
            isinf(e) ? " (NaN/Inf or unwritten output)" : "");
  }
}

/* ---- tensors ---- */

static void die(const char *what, const herr *err) {
  fprintf(stderr, "test_backend_ops: %s: %s\n", what, err->msg);
  exit(1);
}

static bk_tensor tnew(bk_backend *be, bk_dtype dt, int64_t rows, int64_t cols) {
  bk_tensor t;
  herr err = {0};
  if (bk_tensor_new(be, dt, rows, cols, &t, &err)) die("tensor", &err);
  return t;
}

/* Copies host bytes in and waits, so that src may be reused at once. */
static void tset(const bk_tensor *t, const void *src) {
  herr err = {0};
  if (bk_set(t, 0, src, bk_nbytes(t), &err) || bk_sync(t->buf->be, &err)) die("bk_set", &err);
}

static bk_tensor tfrom_f32(bk_backend *be, const float *src, int64_t rows, int64_t cols) {
  bk_tensor t = tnew(be, BK_DT_F32, rows, cols);
  tset(&t, src);
  return t;
}

static bk_tensor tfrom_i32(bk_backend *be, const int32_t *src, int64_t n) {
  bk_tensor t = tnew(be, BK_DT_I32, n, 1);
  tset(&t, src);
  return t;
}

/* Fills t with the NaN pattern 0x7fc00000. */
static void poison(const bk_tensor *t) {
  int64_t n = bk_nelem(t);
  uint32_t *p = malloc(sizeof(uint32_t) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) p[i] = 0x7fc00000u;
  tset(t, p);
  free(p);
}

/* Reads t back (waiting for the queued ops); an op error is a failure and
 * leaves NaN in dst so that the comparison fails too. */
static void tget(const bk_tensor *t, float *dst, const char *op) {
  herr err = {0};
  if (bk_get(t, 0, dst, bk_nbytes(t), &err)) {
    test_checks++;
    test_failures++;
    fprintf(stderr, "FAIL %s on %s: %s\n", op, bk_backend_name(t->buf->be), err.msg);
    for (int64_t i = 0; i < bk_nelem(t); i++) dst[i] = NAN;
  }
}

/* ---- weights of every stored format ---- */


static const char *scale_name(bk_type t) { return t == BK_F32 ? "f32" : t == BK_F16 ? "f16" : "bf16"; }

static void fmt_name(const fmt *f, char *buf, size_t n) {
  if (f->type == BK_MLX_AFFINE)
    snprintf(buf, n, "mlx%d/g%d/%s", f->bits, f->group_size, scale_name(f->scale_type));
  else
    snprintf(buf, n, "%s", bk_type_name(f->type));
}

/* Elements per block of the format (1 for f32 / f16 / bf16). */
static int64_t fmt_block(const fmt *f) { return f->type == BK_MLX_AFFINE ? f->group_size : bk_type_block(f->type); }

/* A host weight of the format (storage owned here) and its exact
 * dequantization, the reference's weights. */
typedef struct host_weight {
  bk_weight w;
  void *data, *scales, *biases; /* owned */
  float *deq;                   /* owned: rows x cols */
} host_weight;

static void make_weight(host_weight *h, const fmt *f, int64_t rows, int64_t cols) {
  memset(h, 0, sizeof *h);
  float *src = malloc(sizeof(float) * (size_t)(rows * cols));
  for (int64_t r = 0; r < rows; r++) {
    float amp = 0.5f + 0.25f * (float)(r % 5), off = 0.02f * (float)(r % 3);
    for (int64_t c = 0; c < cols; c++) src[r * cols + c] = urand() * amp + off;
  }
  h->w = (bk_weight){.type = f->type, .rows = rows, .cols = cols};
  herr err = {0};
  int rc;
  if (f->type == BK_MLX_AFFINE) {
    size_t sb = (size_t)(rows * (cols / f->group_size)) * (f->scale_type == BK_F32 ? 4 : 2);
    h->data = malloc(bk_row_bytes(f->type, cols, f->bits) * (size_t)rows);
    h->scales = malloc(sb);
    h->biases = malloc(sb);
    rc = bk_quantize_mlx(src, rows, cols, f->bits, f->group_size, f->scale_type, h->data, h->scales, h->biases, &err);
    h->w.bits = f->bits;
    h->w.group_size = f->group_size;
    h->w.scale_type = f->scale_type;
    h->w.scales = h->scales;
    h->w.biases = h->biases;
  } else if (f->type == BK_FP8) {
    h->data = malloc((size_t)(rows * cols));
    h->scales = malloc(sizeof(float) * (size_t)rows);
    rc = bk_quantize_fp8(src, rows, cols, h->data, h->scales, &err);
    h->w.scale_type = BK_F32;
    h->w.scales = h->scales;
  } else {
    h->data = malloc(bk_row_bytes(f->type, cols, 0) * (size_t)rows);
    rc = bk_quantize(f->type, src, rows, cols, h->data, &err);
  }
  h->w.data = h->data;
  if (rc) die("quantize", &err);
  h->deq = malloc(sizeof(float) * (size_t)(rows * cols));
  for (int64_t r = 0; r < rows; r++)
    if (bk_dequant_row(&h->w, r, h->deq + r * cols, &err)) die("dequant", &err);
  free(src);
}

static void free_weight(host_weight *h) {
  free(h->data);
  free(h->scales);
  free(h->biases);
  free(h->deq);
}

/* dst = a copy of the host descriptor made usable by be; false (and a
 * failure) when be refuses it. */
static bool load_weight(bk_backend *be, const host_weight *h, bk_weight *dst, const char *what) {
  *dst = h->w;
  herr err = {0};
  if (bk_weight_load(be, dst, BK_USE_MATMUL | BK_USE_EMBED, &err)) {
    test_checks++;
    test_failures++;
    fprintf(stderr, "FAIL %s on %s: weight load: %s\n", what, bk_backend_name(be), err.msg);
    return false;
  }
  return true;
}

/* ---- embed ---- */

static void test_embed(void) {
  static const int32_t ids[] = {5, 0, 39, 5, 12, 12, 1, 38, 20, 5, 7};
  const int64_t n = (int64_t)(sizeof ids / sizeof ids[0]), V = 40;
  for (int fi = 0; fi < N_FORMATS; fi++) {
    const fmt *f = &formats[fi];
    int64_t blk = fmt_block(f), cols = blk == 1 ? (fi == 0 ? 100 : fi == 1 ? 33 : 257) : blk * (blk >= 128 ? 2 : blk == 64 ? 3 : 5);
    char fname[32], name[48], shape[96];
    fmt_name(f, fname, sizeof fname);
    snprintf(name, sizeof name, "embed %s", fname);
    op_stat *st = stat_for("embed");
    host_weight h;
    make_weight(&h, f, V, cols);
    for (int with_scale = 0; with_scale < 2; with_scale++) {
      float scale = with_scale ? 7.25f : 0.0f;
      double *ref = malloc(sizeof(double) * (size_t)(n * cols));
      for (int64_t t = 0; t < n; t++)
        for (int64_t c = 0; c < cols; c++)
          ref[t * cols + c] = (double)h.deq[ids[t] * cols + c] * (with_scale ? (double)scale : 1.0);
      snprintf(shape, sizeof shape, "%s table [%lld, %lld], %lld ids, scale %g", fname, (long long)V, (long long)cols,
               (long long)n, scale);
      st->cases++;
      float *got = malloc(sizeof(float) * (size_t)(n * cols));
      for (int di = 0; di < n_devs; di++) {
        bk_backend *be = devs[di];
        bk_weight w;
        if (!load_weight(be, &h, &w, name)) continue;
        bk_tensor y = tnew(be, BK_DT_F32, n, cols), tid = tfrom_i32(be, ids, n);
        poison(&y);
        bk_embed(&y, &w, &tid, scale);
        tget(&y, got, name);
        compare(st, K_ELEM, di, shape, got, ref, n * cols);
        bk_tensor_free(&y), bk_tensor_free(&tid);
        bk_weight_release(be, &w);
      }
      free(got), free(ref);
    }
    free_weight(&h);
  }
}

/* ---- matmul ---- */

/* With in_view, x and y are row windows (nonzero byte offsets) of larger
 * tensors whose other rows hold NaN: they must stay untouched. */
static void matmul_case(const fmt *f, int64_t n, int64_t rows, int64_t cols, bool with_bias, bool in_view) {
  char fname[32], name[48], shape[128];
  fmt_name(f, fname, sizeof fname);
  snprintf(name, sizeof name, "matmul %s", fname);
  snprintf(shape, sizeof shape, "x [%lld, %lld] * %s [%lld, %lld]^T%s%s", (long long)n, (long long)cols, fname,
           (long long)rows, (long long)cols, with_bias ? " + bias" : "", in_view ? ", views" : "");
  op_stat *st = stat_for(name);
  st->cases++;
  host_weight h;
  make_weight(&h, f, rows, cols);
  float *x = rand_floats(n * cols, 1.0f), *bias = with_bias ? rand_floats(rows, 2.0f) : NULL;
  double *ref = malloc(sizeof(double) * (size_t)(n * rows));
  for (int64_t i = 0; i < n; i++)
    for (int64_t r = 0; r < rows; r++) {
      const float *xr = x + i * cols, *wr = h.deq + r * cols;
      double s = bias ? bias[r] : 0;
      for (int64_t k = 0; k < cols; k++) s += (double)xr[k] * wr[k];
      ref[i * rows + r] = s;
    }
  const int64_t xpad = in_view ? 2 : 0, ypad = in_view ? 1 : 0; /* rows before the window (and as many after) */
  float *got = malloc(sizeof(float) * (size_t)((n + 2 * ypad) * rows));
  for (int di = 0; di < n_devs; di++) {
    bk_backend *be = devs[di];
    bk_weight w;
    if (!load_weight(be, &h, &w, name)) continue;
    bk_tensor xall = tnew(be, BK_DT_F32, n + 2 * xpad, cols), yall = tnew(be, BK_DT_F32, n + 2 * ypad, rows), tb = {0};
    poison(&xall);
    poison(&yall);
    bk_tensor tx = bk_rows(&xall, xpad, n), ty = bk_rows(&yall, ypad, n);
    tset(&tx, x);
    if (bias) tb = tfrom_f32(be, bias, 1, rows);
    bk_matmul_t(&ty, &tx, &w, bias ? &tb : NULL);
    tget(&yall, got, name);
    compare(st, K_MATMUL, di, shape, got + ypad * rows, ref, n * rows);
    int64_t outside = 0;
    for (int64_t i = 0; i < ypad * rows; i++) outside += !isnan(got[i]) + !isnan(got[(ypad + n) * rows + i]);
    test_checks++;
    if (outside) {
      test_failures++;
      fprintf(stderr, "FAIL %s [%s] on %s: %lld elements written outside y\n", name, shape, bk_backend_name(be),
              (long long)outside);
    }
    bk_tensor_free(&xall), bk_tensor_free(&yall);
    if (bias) bk_tensor_free(&tb);
    bk_weight_release(be, &w);
  }
  free(got), free(ref), free(x), free(bias);
  free_weight(&h);
}

static void test_matmul(void) {
  static const int64_t ns[] = {1, 2, 3, 7, 8, 9, 33, 100};
  static const int64_t outs[] = {17, 1, 257, 33, 257, 1, 17, 64};
  static const int64_t float_cols[] = {100, 257, 31, 512, 64, 130, 7, 384};
  static const int64_t quant_cols[] = {96, 256, 32, 160, 512, 64, 224, 128};
  for (int fi = 0; fi < N_FORMATS; fi++) {
    const fmt *f = &formats[fi];
    int64_t blk = fmt_block(f);
    for (int ni = 0; ni < 8; ni++) {
      int64_t cols = blk == 1 ? float_cols[(ni + fi) % 8] : (quant_cols[(ni + fi) % 8] + blk - 1) / blk * blk;
      matmul_case(f, ns[ni], outs[(ni + fi) % 8], cols, ((ni + fi) & 1) != 0, (ni + fi) % 3 == 2);
    }
    /* larger: long rows for the GEMV, several GEMM tiles in every direction */
    matmul_case(f, 1, 96, blk == 1 ? 4099 : 4096, true, false);
    matmul_case(f, 4, 300, blk == 1 ? 1000 : 1024, false, true);
    matmul_case(f, 77, 200, blk == 1 ? 769 : 768, true, false);
    /* aligned dense rows long enough for the GEMV's unrolled 16-byte loads */
    matmul_case(f, 1, 70, 4096, false, false);
    matmul_case(f, 8, 33, 2048, true, true);
    /* enough rows for a GEMV that gives each warp several rows (Q4_K: four rows a warp at one or
     * two activation rows, two at three or four) on a GPU of 132 multiprocessors */
    matmul_case(f, 1, 4300, 512, true, false);
    matmul_case(f, 2, 4237, 256, false, true);
    matmul_case(f, 3, 2150, 768, false, false);
  }
}

/* y = x · Wᵀ (+ bias) on the device backend be, compared with ref (the matmul's limit). */
static void device_matmul_case(bk_backend *be, op_stat *st, const char *label, const char *shape, const host_weight *h,
                               const float *x, const float *bias, int64_t n, int64_t rows, int64_t cols, const double *ref) {
  bk_weight w;
  if (!load_weight(be, h, &w, label)) return;
  bk_tensor tx = tfrom_f32(be, x, n, cols), ty = tnew(be, BK_DT_F32, n, rows), tb = {0};
  poison(&ty);
  if (bias) tb = tfrom_f32(be, bias, 1, rows);
  bk_matmul_t(&ty, &tx, &w, bias ? &tb : NULL);
  float *got = malloc(sizeof(float) * (size_t)(n * rows));
  tget(&ty, got, label);
  compare(st, K_MATMUL, 1, shape, got, ref, n * rows);
  free(got);
  bk_tensor_free(&tx), bk_tensor_free(&ty);
  if (bias) bk_tensor_free(&tb);
  bk_weight_release(be, &w);
}

/* FP8 weights under --gpu-precision fast: the activations' rows are
 * quantized to E4M3 on the device (scale max|x| / 448, bk_quantize_fp8's
 * arithmetic) and multiplied on the tensor cores; the reference does the
 * same quantization on the host and sums in double, so the limit is the
 * matmul's. Shapes whose rows or columns are not multiples of 16 take the
 * dequantizing path: the plain reference. Device only (the CPU has no such mode). */
static void test_matmul_fp8_fast(void) {
  if (n_devs < 2) return;
  bk_open_opts opts = {.fast_matmul = true};
  bk_backend *be = NULL;
  herr err = {0};
  if (bk_backend_open(dev_label, &opts, &be, &err)) die("fast backend", &err);
  static const struct { int64_t n, rows, cols; } cases[] = {
      {9, 64, 256}, {33, 4096, 512}, {100, 272, 1024}, {300, 48, 4096}, {17, 40, 200}, {12, 33, 64}};
  op_stat *st = stat_for("matmul fp8 fast (dev)");
  const fmt f8 = {BK_FP8, 0, 0, BK_F32};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t n = cases[ci].n, rows = cases[ci].rows, cols = cases[ci].cols;
    bool tc = rows % 16 == 0 && cols % 16 == 0, with_bias = ci % 2 == 1;
    char shape[96];
    snprintf(shape, sizeof shape, "x [%lld, %lld] * fp8 [%lld, %lld]^T%s%s", (long long)n, (long long)cols, (long long)rows,
             (long long)cols, with_bias ? " + bias" : "", tc ? "" : " (dequantizing path)");
    st->cases++;
    host_weight h;
    make_weight(&h, &f8, rows, cols);
    float *x = rand_floats(n * cols, 1.0f), *bias = with_bias ? rand_floats(rows, 2.0f) : NULL;
    double *ref = malloc(sizeof(double) * (size_t)(n * rows));
    float *xd = malloc(sizeof(float) * (size_t)(n * cols)), *sx = malloc(sizeof(float) * (size_t)n);
    uint8_t *xq = malloc((size_t)(n * cols));
    if (tc) {
      if (bk_quantize_fp8(x, n, cols, xq, sx, &err)) die("quantize", &err);
      for (int64_t i = 0; i < n * cols; i++) xd[i] = bk_fp8_decode(xq[i]);
    }
    for (int64_t i = 0; i < n; i++)
      for (int64_t r = 0; r < rows; r++) {
        double s = 0;
        if (tc) {
          const uint8_t *wq = (const uint8_t *)h.data + r * cols;
          for (int64_t k = 0; k < cols; k++) s += (double)xd[i * cols + k] * bk_fp8_decode(wq[k]);
          s = s * sx[i] * ((const float *)h.scales)[r];
        } else {
          for (int64_t k = 0; k < cols; k++) s += (double)x[i * cols + k] * h.deq[r * cols + k];
        }
        ref[i * rows + r] = s + (bias ? bias[r] : 0);
      }
    device_matmul_case(be, st, "matmul fp8 fast", shape, &h, x, bias, n, rows, cols, ref);
    free(ref), free(xd), free(sx), free(xq), free(x), free(bias);
    free_weight(&h);
  }
  bk_backend_close(be);
}

/* f16 and quantized weights under --gpu-precision fast: each activation row
 * is scaled by a power of two (max |x 2^e| in [2^14, 2^15)), rounded to
 * f16 and multiplied on the tensor cores by the weights rounded to f16; the
 * reference rounds both the same way on the host and sums in double, so the
 * limit is the matmul's. FP8 shapes here have rows that are not multiples
 * of 16 (the others take the cuBLASLt FP8 path, tested above). Device only. */
static double round_f16(double v) {
  if (v == 0 || !isfinite(v)) return v;
  int e = ilogb(v);
  double q = ldexp(1.0, (e < -14 ? -14 : e) - 10); /* the spacing of f16 values near v */
  return nearbyint(v / q) * q;
}

static void test_matmul_half_fast(void) {
  if (n_devs < 2) return;
  bk_open_opts opts = {.fast_matmul = true};
  bk_backend *be = NULL;
  herr err = {0};
  if (bk_backend_open(dev_label, &opts, &be, &err)) die("fast backend", &err);
  static const fmt fs[] = {{BK_F16, 0, 0, 0},  {BK_Q8_0, 0, 0, 0}, {BK_Q4_0, 0, 0, 0},         {BK_Q4_K, 0, 0, 0},
                           {BK_Q6_K, 0, 0, 0}, {BK_FP8, 0, 0, BK_F32}, {BK_MLX_AFFINE, 4, 64, BK_BF16},
                           {BK_Q5_1, 0, 0, 0}, {BK_Q3_K, 0, 0, 0}, {BK_IQ4_XS, 0, 0, 0}};
  /* (more than 8 rows: fewer take the GEMV) */
  static const struct { int64_t n, rows, cols; } cases[] = {{9, 40, 256}, {17, 70, 512}, {33, 257, 768}, {100, 33, 1024}};
  op_stat *st = stat_for("matmul half fast (dev)");
  for (size_t fi = 0; fi < sizeof fs / sizeof fs[0]; fi++)
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
      const fmt *f = &fs[fi];
      int64_t n = cases[ci].n, rows = cases[ci].rows, cols = cases[ci].cols;
      bool with_bias = (ci + fi) % 2 == 1;
      char fname[32], shape[128];
      fmt_name(f, fname, sizeof fname);
      snprintf(shape, sizeof shape, "x [%lld, %lld] * %s [%lld, %lld]^T%s", (long long)n, (long long)cols, fname,
               (long long)rows, (long long)cols, with_bias ? " + bias" : "");
      st->cases++;
      host_weight h;
      make_weight(&h, f, rows, cols);
      /* activations over a wide range of sizes, one row far beyond f16's range */
      float *x = rand_floats(n * cols, 1.0f), *bias = with_bias ? rand_floats(rows, 2.0f) : NULL;
      for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < cols; k++) x[i * cols + k] *= i == 1 ? 3e6f : (float)(1 + (i % 5) * 7);
      double *ref = malloc(sizeof(double) * (size_t)(n * rows)), *xh = malloc(sizeof(double) * (size_t)cols);
      for (int64_t i = 0; i < n; i++) {
        float m = 0;
        for (int64_t k = 0; k < cols; k++) m = fmaxf(m, fabsf(x[i * cols + k]));
        int e = 14 - ilogbf(m);
        for (int64_t k = 0; k < cols; k++) xh[k] = round_f16(ldexp((double)x[i * cols + k], e));
        for (int64_t r = 0; r < rows; r++) {
          double s = 0;
          for (int64_t k = 0; k < cols; k++) s += xh[k] * round_f16(h.deq[r * cols + k]);
          ref[i * rows + r] = ldexp(s, -e) + (bias ? bias[r] : 0);
        }
      }
      device_matmul_case(be, st, "matmul half fast", shape, &h, x, bias, n, rows, cols, ref);
      free(ref), free(xh), free(x), free(bias);
      free_weight(&h);
    }
  bk_backend_close(be);
}

/* Q8_0 / Q4_0 / Q4_K GEMVs on 8-bit activations (a device opened without
 * f32_activations, as models are by default): the reference quantizes each
 * activation row with the CPU's own bk_qrows_fill and sums the products of
 * the dequantized weights and those activations in double, so the limit is
 * the matmul's. Shapes: 1 to 8 rows; enough output rows for several rows a
 * warp; widths that are and are not whole chunks of 32 blocks. Device only. */
static void test_matmul_q8act(void) {
  if (n_devs < 2) return;
  bk_open_opts opts = {0};
  bk_backend *be = NULL;
  herr err = {0};
  if (bk_backend_open(dev_label, &opts, &be, &err)) die("8-bit activation backend", &err);
  /* the last row: Q4_K by the kernel that reads straight from global memory (HEARTH_CUDA_Q4K=direct) */
  static const fmt fs[] = {{BK_Q8_0, 0, 0, 0}, {BK_Q4_0, 0, 0, 0}, {BK_Q4_K, 0, 0, 0}, {BK_Q4_K, 0, 0, 0}};
  static const struct { int64_t n, rows, cols; } cases[] = {{1, 70, 256},  {1, 4300, 1024}, {2, 4237, 768}, {3, 300, 2048},
                                                            {4, 9000, 512}, {5, 33, 1280},  {8, 257, 4096}, {7, 1, 256},
                                                            {1, 4099, 14336}, {6, 1031, 4352}};
  op_stat *st = stat_for("matmul 8-bit act (dev)");
  for (size_t fi = 0; fi < sizeof fs / sizeof fs[0]; fi++)
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
      const fmt *f = &fs[fi];
      bool direct = fi == sizeof fs / sizeof fs[0] - 1;
      if (direct) setenv("HEARTH_CUDA_Q4K", "direct", 1);
      else unsetenv("HEARTH_CUDA_Q4K");
      int64_t n = cases[ci].n, rows = cases[ci].rows, cols = cases[ci].cols, nb = cols / 32;
      bool with_bias = (ci + fi) % 2 == 0;
      char fname[32], shape[128];
      fmt_name(f, fname, sizeof fname);
      snprintf(shape, sizeof shape, "x [%lld, %lld] * %s [%lld, %lld]^T%s%s", (long long)n, (long long)cols, fname,
               (long long)rows, (long long)cols, with_bias ? " + bias" : "", direct ? " (direct)" : "");
      st->cases++;
      host_weight h;
      make_weight(&h, f, rows, cols);
      float *x = rand_floats(n * cols, 1.0f), *bias = with_bias ? rand_floats(rows, 2.0f) : NULL;
      bk_qrows qa = {.n = n, .cols = cols, .nb = nb, .q = malloc((size_t)(n * cols)), .d = malloc(sizeof(float) * (size_t)(n * nb)),
                     .s = malloc(sizeof(int32_t) * (size_t)(n * nb)), .s16 = malloc(sizeof(int32_t) * (size_t)(2 * n * nb)),
                     .nds = malloc(sizeof(float) * (size_t)(n * nb))};
      bk_qrows_fill(&qa, x, 0, n);
      double *ref = malloc(sizeof(double) * (size_t)(n * rows));
      for (int64_t i = 0; i < n; i++)
        for (int64_t r = 0; r < rows; r++) {
          double s = 0;
          for (int64_t k = 0; k < cols; k++) s += (double)h.deq[r * cols + k] * qa.q[i * cols + k] * qa.d[i * nb + k / 32];
          ref[i * rows + r] = s + (bias ? bias[r] : 0);
        }
      device_matmul_case(be, st, "matmul 8-bit act", shape, &h, x, bias, n, rows, cols, ref);
      free(ref), free(x), free(bias), free(qa.q), free(qa.d), free(qa.s), free(qa.s16), free(qa.nds);
      free_weight(&h);
    }
  unsetenv("HEARTH_CUDA_Q4K");
  bk_backend_close(be);
}

/* ---- rmsnorm ---- */

static void test_rmsnorm(void) {
  /* rows, cols, weight (0 none, 1 w, 2 1 + w), in place, eps */
  static const struct { int64_t rows, cols; int wmode; bool inplace; float eps; } cases[] = {
      {1, 1, 0, false, 1e-6f},  {3, 7, 1, false, 1e-5f},   {4, 64, 2, false, 1e-6f}, {2, 255, 1, true, 1e-5f},
      {5, 1000, 2, true, 1e-6f}, {8, 33, 0, true, 1e-5f},  {1, 4096, 1, false, 1e-6f}, {9, 130, 0, false, 0.0f},
  };
  op_stat *st = stat_for("rmsnorm");
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t R = cases[ci].rows, C = cases[ci].cols;
    int wmode = cases[ci].wmode;
    float *x = rand_floats(R * C, 1.5f), *w = wmode ? rand_floats(C, 1.0f) : NULL;
    double *ref = malloc(sizeof(double) * (size_t)(R * C));
    for (int64_t r = 0; r < R; r++) {
      double ss = 0;
      for (int64_t c = 0; c < C; c++) ss += (double)x[r * C + c] * x[r * C + c];
      double inv = 1.0 / sqrt(ss / (double)C + (double)cases[ci].eps);
      for (int64_t c = 0; c < C; c++) {
        double s = wmode == 0 ? 1.0 : wmode == 1 ? (double)w[c] : 1.0 + (double)w[c];
        ref[r * C + c] = x[r * C + c] * inv * s;
      }
    }
    char shape[96];
    snprintf(shape, sizeof shape, "[%lld, %lld], %s, %s, eps %g", (long long)R, (long long)C,
             wmode == 0 ? "no weight" : wmode == 1 ? "weight" : "unit offset", cases[ci].inplace ? "in place" : "y != x",
             (double)cases[ci].eps);
    st->cases++;
    float *got = malloc(sizeof(float) * (size_t)(R * C));
    for (int di = 0; di < n_devs; di++) {
      bk_backend *be = devs[di];
      bk_tensor tx = tfrom_f32(be, x, R, C), tw = {0}, ty = tx;
      if (w) tw = tfrom_f32(be, w, 1, C);
      if (!cases[ci].inplace) {
        ty = tnew(be, BK_DT_F32, R, C);
        poison(&ty);
      }
      bk_rmsnorm(&ty, &tx, w ? &tw : NULL, cases[ci].eps, wmode == 2);
      tget(&ty, got, "rmsnorm");
      compare(st, K_ELEM, di, shape, got, ref, R * C);
      if (!cases[ci].inplace) bk_tensor_free(&ty);
      bk_tensor_free(&tx);
      if (w) bk_tensor_free(&tw);
    }
    free(got), free(ref), free(x), free(w);
  }
}

/* ---- add_rmsnorm: a residual add and the norm after it ---- */

static void test_add_rmsnorm(void) {
  /* rows, cols, weight (0 none, 1 w, 2 1 + w), eps */
  static const struct { int64_t rows, cols; int wmode; float eps; } cases[] = {
      {1, 4096, 1, 1e-6f}, {3, 7, 2, 1e-5f}, {5, 1000, 0, 1e-6f}, {17, 2304, 2, 1e-6f}, {64, 256, 1, 1e-5f},
  };
  op_stat *st = stat_for("add_rmsnorm");
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t R = cases[ci].rows, C = cases[ci].cols;
    int wmode = cases[ci].wmode;
    float *x = rand_floats(R * C, 1.5f), *d = rand_floats(R * C, 0.5f), *w = wmode ? rand_floats(C, 1.0f) : NULL;
    double *ref = malloc(sizeof(double) * (size_t)(2 * R * C)), *refx = ref + R * C;
    for (int64_t r = 0; r < R; r++) {
      double ss = 0;
      for (int64_t c = 0; c < C; c++) {
        float v = x[r * C + c] + d[r * C + c];
        refx[r * C + c] = v;
        ss += (double)v * v;
      }
      double inv = 1.0 / sqrt(ss / (double)C + (double)cases[ci].eps);
      for (int64_t c = 0; c < C; c++) {
        double s = wmode == 0 ? 1.0 : wmode == 1 ? (double)w[c] : 1.0 + (double)w[c];
        ref[r * C + c] = refx[r * C + c] * inv * s;
      }
    }
    char shape[96];
    snprintf(shape, sizeof shape, "[%lld, %lld], %s, eps %g", (long long)R, (long long)C,
             wmode == 0 ? "no weight" : wmode == 1 ? "weight" : "unit offset", (double)cases[ci].eps);
    st->cases++;
    float *got = malloc(sizeof(float) * (size_t)(R * C));
    for (int di = 0; di < n_devs; di++) {
      bk_backend *be = devs[di];
      bk_tensor tx = tfrom_f32(be, x, R, C), td = tfrom_f32(be, d, R, C), tw = {0}, ty = tnew(be, BK_DT_F32, R, C);
      if (w) tw = tfrom_f32(be, w, 1, C);
      poison(&ty);
      bk_add_rmsnorm(&tx, &td, &ty, w ? &tw : NULL, cases[ci].eps, wmode == 2);
      tget(&ty, got, "add_rmsnorm");
      compare(st, K_ELEM, di, shape, got, ref, R * C);
      tget(&tx, got, "add_rmsnorm (the sum)");
      compare(st, K_ELEM, di, shape, got, refx, R * C);
      bk_tensor_free(&ty), bk_tensor_free(&tx), bk_tensor_free(&td);
      if (w) bk_tensor_free(&tw);
    }
    free(got), free(ref), free(x), free(d), free(w);
  }
}

/* ---- rope ---- */

static void test_rope(void) {
  static const struct { int64_t T, heads, hd, rot; bool interleaved; double scale, base; } cases[] = {
      {5, 4, 64, 64, false, 1.0, 10000},  {5, 4, 64, 64, true, 1.0, 10000},   {7, 2, 128, 64, false, 1.0, 1e6},
      {3, 8, 80, 40, true, 1.0, 10000},   {9, 3, 32, 32, false, 1.2, 500000}, {1, 1, 256, 256, false, 0.8, 10000},
      {17, 6, 48, 24, false, 1.1, 10000}, {4, 2, 96, 64, true, 1.3, 1e6},
  };
  op_stat *st = stat_for("rope");
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t T = cases[ci].T, H = cases[ci].heads, hd = cases[ci].hd, rot = cases[ci].rot, half = rot / 2, C = H * hd;
    double *inv = malloc(sizeof(double) * (size_t)half);
    for (int64_t i = 0; i < half; i++) inv[i] = 1.0 / pow(cases[ci].base, 2.0 * (double)i / (double)rot);
    if (ci % 2) /* a yarn-like ramp: the low frequencies slowed down */
      for (int64_t i = half / 2; i < half; i++) inv[i] /= 1.0 + 3.0 * (double)(i - half / 2) / (double)half;
    rope_table tab = {.rot_dim = rot, .inv_freq = inv, .attn_scale = cases[ci].scale, .interleaved = cases[ci].interleaved};
    /* unsorted, non-contiguous positions (0 among them when T > 1) */
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
    for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(t == 1 ? 0 : irand(8192));
    float *x = rand_floats(T * C, 1.0f);
    double *ref = malloc(sizeof(double) * (size_t)(T * C));
    for (int64_t i = 0; i < T * C; i++) ref[i] = x[i];
    for (int64_t t = 0; t < T; t++)
      for (int64_t i = 0; i < half; i++) {
        double a = (double)pos[t] * inv[i], c = cos(a) * cases[ci].scale, s = sin(a) * cases[ci].scale;
        int64_t i0 = cases[ci].interleaved ? 2 * i : i, i1 = cases[ci].interleaved ? 2 * i + 1 : i + half;
        for (int64_t h = 0; h < H; h++) {
          double *v = ref + t * C + h * hd, p = v[i0], q = v[i1];
          v[i0] = p * c - q * s;
          v[i1] = q * c + p * s;
        }
      }
    char shape[128];
    snprintf(shape, sizeof shape, "T %lld, %lld heads x %lld, rot_dim %lld, %s, attn_scale %g", (long long)T, (long long)H,
             (long long)hd, (long long)rot, cases[ci].interleaved ? "interleaved" : "rotate-half", cases[ci].scale);
    st->cases++;
    float *got = malloc(sizeof(float) * (size_t)(T * C));
    for (int di = 0; di < n_devs; di++) {
      bk_backend *be = devs[di];
      bk_tensor tx = tfrom_f32(be, x, T, C), tp = tfrom_i32(be, pos, T);
      bk_rope(&tx, H, hd, &tp, &tab);
      tget(&tx, got, "rope");
      compare(st, K_ELEM, di, shape, got, ref, T * C);
      bk_tensor_free(&tx), bk_tensor_free(&tp);
    }
    free(got), free(ref), free(x), free(pos), free(inv);
  }
}

/* ---- act_mul, add, softcap ---- */

static double act_ref(bk_act a, double v) {
  switch (a) {
    case BK_ACT_SILU: return v / (1.0 + exp(-v));
    case BK_ACT_GELU_TANH: return 0.5 * v * (1.0 + tanh(0.79788456080286535588 * (v + 0.044715 * v * v * v)));
    case BK_ACT_GELU: return 0.5 * v * (1.0 + erf(v * 0.70710678118654752440));
    default: return v > 0 ? v : 0;
  }
}

static void test_act_mul(void) {
  static const char *names[] = {"silu", "gelu_tanh", "gelu", "relu"};
  static const int64_t shapes[][2] = {{1, 1}, {3, 257}, {7, 1000}};
  op_stat *st = stat_for("act_mul");
  for (int a = 0; a < 4; a++)
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
      int64_t R = shapes[si][0], C = shapes[si][1], n = R * C;
      /* Gates reach deep into the negative tail, where silu and gelu are
       * small differences of nearly equal numbers and f32 keeps only a few
       * digits of them; over a whole tensor those elements weigh nothing,
       * but alone they would make nmse their squared relative error, so a
       * tensor of few elements draws its gates from (-2, 2). */
      float *g = rand_floats(n, n >= 64 ? 6.0f : 2.0f), *u = rand_floats(n, 2.0f);
      double *ref = malloc(sizeof(double) * (size_t)n);
      for (int64_t i = 0; i < n; i++) ref[i] = act_ref((bk_act)a, g[i]) * u[i];
      char shape[64];
      snprintf(shape, sizeof shape, "%s [%lld, %lld]", names[a], (long long)R, (long long)C);
      st->cases++;
      float *got = malloc(sizeof(float) * (size_t)n);
      for (int di = 0; di < n_devs; di++) {
        bk_backend *be = devs[di];
        bk_tensor tg = tfrom_f32(be, g, R, C), tu = tfrom_f32(be, u, R, C);
        bk_act_mul(&tg, &tu, (bk_act)a);
        tget(&tg, got, "act_mul");
        compare(st, K_ELEM, di, shape, got, ref, n);
        bk_tensor_free(&tg), bk_tensor_free(&tu);
      }
      free(got), free(ref), free(g), free(u);
    }
}

static void test_add(void) {
  /* rows, cols, output: 0 separate, 1 y == a, 2 y == b */
  static const int64_t cases[][3] = {{1, 1, 0}, {3, 257, 1}, {5, 1000, 2}, {2, 64, 0}, {16, 33, 1}};
  op_stat *st = stat_for("add");
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t R = cases[ci][0], C = cases[ci][1], mode = cases[ci][2], n = R * C;
    float *a = rand_floats(n, 3.0f), *b = rand_floats(n, 3.0f);
    double *ref = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) ref[i] = (double)a[i] + b[i];
    char shape[64];
    snprintf(shape, sizeof shape, "[%lld, %lld], %s", (long long)R, (long long)C,
             mode == 0 ? "y separate" : mode == 1 ? "y == a" : "y == b");
    st->cases++;
    float *got = malloc(sizeof(float) * (size_t)n);
    for (int di = 0; di < n_devs; di++) {
      bk_backend *be = devs[di];
      bk_tensor ta = tfrom_f32(be, a, R, C), tb = tfrom_f32(be, b, R, C), ty;
      if (mode == 0) {
        ty = tnew(be, BK_DT_F32, R, C);
        poison(&ty);
      } else
        ty = mode == 1 ? ta : tb;
      bk_add(&ty, &ta, &tb);
      tget(&ty, got, "add");
      compare(st, K_ELEM, di, shape, got, ref, n);
      if (mode == 0) bk_tensor_free(&ty);
      bk_tensor_free(&ta), bk_tensor_free(&tb);
    }
    free(got), free(ref), free(a), free(b);
  }
}

static void test_softcap(void) {
  static const struct { int64_t rows, cols; float cap; } cases[] = {{1, 7, 30.0f}, {4, 1000, 50.0f}, {2, 257, 1.5f}, {3, 64, 0.7f}};
  op_stat *st = stat_for("softcap");
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t R = cases[ci].rows, C = cases[ci].cols, n = R * C;
    float cap = cases[ci].cap, *x = rand_floats(n, 3.0f * cap); /* reaches well into saturation */
    double *ref = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) ref[i] = (double)cap * tanh((double)x[i] / cap);
    char shape[64];
    snprintf(shape, sizeof shape, "[%lld, %lld], cap %g", (long long)R, (long long)C, (double)cap);
    st->cases++;
    float *got = malloc(sizeof(float) * (size_t)n);
    for (int di = 0; di < n_devs; di++) {
      bk_tensor tx = tfrom_f32(devs[di], x, R, C);
      bk_softcap(&tx, cap);
      tget(&tx, got, "softcap");
      compare(st, K_ELEM, di, shape, got, ref, n);
      bk_tensor_free(&tx);
    }
    free(got), free(ref), free(x);
  }
}

/* ---- scale, get_cols ---- */

static void test_scale_get_cols(void) {
  op_stat *sc = stat_for("scale"), *gc = stat_for("get_cols");
  static const struct { int64_t rows, cols, c0, w; float s; } cases[] = {{1, 7, 0, 7, 0.5f}, {5, 64, 16, 16, -3.0f}, {9, 130, 127, 3, 1e-3f}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t R = cases[ci].rows, C = cases[ci].cols, c0 = cases[ci].c0, W = cases[ci].w;
    float *x = rand_floats(R * C, 2.0f), *got = malloc(sizeof(float) * (size_t)(R * C));
    double *ref = malloc(sizeof(double) * (size_t)(R * C)), *rc = malloc(sizeof(double) * (size_t)(R * W));
    for (int64_t i = 0; i < R * C; i++) ref[i] = (double)x[i] * cases[ci].s;
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = 0; c < W; c++) rc[r * W + c] = x[r * C + c0 + c];
    char shape[80];
    snprintf(shape, sizeof shape, "[%lld, %lld], cols %lld..+%lld", (long long)R, (long long)C, (long long)c0, (long long)W);
    sc->cases++, gc->cases++;
    for (int di = 0; di < n_devs; di++) {
      bk_tensor tx = tfrom_f32(devs[di], x, R, C), ty = tnew(devs[di], BK_DT_F32, R, W);
      poison(&ty);
      bk_get_cols(&ty, &tx, c0);
      tget(&ty, got, "get_cols");
      compare(gc, K_ELEM, di, shape, got, rc, R * W);
      bk_scale(&tx, cases[ci].s);
      tget(&tx, got, "scale");
      compare(sc, K_ELEM, di, shape, got, ref, R * C);
      bk_tensor_free(&tx), bk_tensor_free(&ty);
    }
    free(x), free(got), free(ref), free(rc);
  }
}

/* ---- LoRA deltas ---- */

/* Two adapters (different ranks and scales) on two runs of rows of one
 * batch, with a row before and after that no adapter touches: y starts
 * random (the op adds to it), so rows that must not change are checked too.
 * The reference is exact in double; the CPU's plain op_lora is checked
 * against it as well. */
static void lora_ref(double *y, const float *x, int64_t n, int64_t in, const float *a, int64_t r, const float *b, int64_t out,
                     float scale) {
  double *t = malloc(sizeof(double) * (size_t)r);
  for (int64_t i = 0; i < n; i++) {
    for (int64_t j = 0; j < r; j++) {
      t[j] = 0;
      for (int64_t k = 0; k < in; k++) t[j] += (double)x[i * in + k] * a[j * in + k];
    }
    for (int64_t o = 0; o < out; o++) {
      double acc = 0;
      for (int64_t j = 0; j < r; j++) acc += t[j] * b[o * r + j];
      y[i * out + o] += scale * acc;
    }
  }
  free(t);
}

static void test_lora(void) {
  /* rows of the first run, of the second, in, out, ranks, scales */
  static const struct { int64_t n1, n2, in, out, r1, r2; float s1, s2; } cases[] = {
      {1, 1, 64, 64, 8, 4, 2.0f, 4.0f},    {3, 5, 128, 96, 16, 8, 0.5f, 1.0f}, {9, 1, 257, 33, 4, 1, 1.5f, -2.0f},
      {40, 24, 64, 200, 64, 32, 0.25f, 1.0f}, {100, 3, 96, 130, 1, 7, 3.0f, 0.125f}};
  op_stat *st = stat_for("lora"), *sr = stat_for("lora (op_lora)");
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t n1 = cases[ci].n1, n2 = cases[ci].n2, in = cases[ci].in, out = cases[ci].out, r1 = cases[ci].r1, r2 = cases[ci].r2;
    int64_t N = n1 + n2 + 2;
    float *x = rand_floats(N * in, 1.0f), *y0 = rand_floats(N * out, 1.0f);
    float *a1 = rand_floats(r1 * in, 0.5f), *b1 = rand_floats(out * r1, 0.5f);
    float *a2 = rand_floats(r2 * in, 0.5f), *b2 = rand_floats(out * r2, 0.5f);
    double *ref = malloc(sizeof(double) * (size_t)(N * out));
    for (int64_t i = 0; i < N * out; i++) ref[i] = y0[i];
    lora_ref(ref + out, x + in, n1, in, a1, r1, b1, out, cases[ci].s1);
    lora_ref(ref + (1 + n1) * out, x + (1 + n1) * in, n2, in, a2, r2, b2, out, cases[ci].s2);
    char shape[96];
    snprintf(shape, sizeof shape, "runs %lld+%lld, [%lld -> %lld], ranks %lld/%lld", (long long)n1, (long long)n2, (long long)in,
             (long long)out, (long long)r1, (long long)r2);
    st->cases++, sr->cases++;
    float *got = malloc(sizeof(float) * (size_t)(N * out));
    /* the plain reference */
    memcpy(got, y0, sizeof(float) * (size_t)(N * out));
    float *tmp = malloc(sizeof(float) * (size_t)(r1 > r2 ? r1 : r2));
    op_lora(got + out, x + in, n1, in, a1, r1, b1, out, cases[ci].s1, tmp);
    op_lora(got + (1 + n1) * out, x + (1 + n1) * in, n2, in, a2, r2, b2, out, cases[ci].s2, tmp);
    compare(sr, K_MATMUL, 0, shape, got, ref, N * out);
    free(tmp);
    for (int di = 0; di < n_devs; di++) {
      bk_backend *be = devs[di];
      bk_tensor tx = tfrom_f32(be, x, N, in), ty = tfrom_f32(be, y0, N, out);
      bk_tensor ta1 = tfrom_f32(be, a1, r1, in), tb1 = tfrom_f32(be, b1, out, r1);
      bk_tensor ta2 = tfrom_f32(be, a2, r2, in), tb2 = tfrom_f32(be, b2, out, r2);
      bk_tensor y1 = bk_rows(&ty, 1, n1), x1 = bk_rows(&tx, 1, n1), y2 = bk_rows(&ty, 1 + n1, n2), x2 = bk_rows(&tx, 1 + n1, n2);
      bk_lora(&y1, &x1, &ta1, &tb1, cases[ci].s1);
      bk_lora(&y2, &x2, &ta2, &tb2, cases[ci].s2);
      tget(&ty, got, "lora");
      compare(st, K_MATMUL, di, shape, got, ref, N * out);
      bk_tensor_free(&tx), bk_tensor_free(&ty), bk_tensor_free(&ta1), bk_tensor_free(&tb1);
      bk_tensor_free(&ta2), bk_tensor_free(&tb2);
    }
    free(x), free(y0), free(a1), free(b1), free(a2), free(b2), free(ref), free(got);
  }
}

/* ---- mixture of experts ---- */

/* Routing against a double-precision recomputation from the definition
 * (top-k by logit, softmax weights, renormalized, scaled); ids must match
 * exactly. Logits include exact ties, which go to the lower id. */
static void test_moe_route(void) {
  static const struct { int64_t T, E, k; bool norm, scale; } cases[] = {
      {1, 8, 2, true, false}, {7, 8, 8, false, false}, {33, 128, 8, true, false}, {5, 4, 2, true, true}, {3, 60, 1, false, true}};
  op_stat *st = stat_for("moe_route");
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t T = cases[ci].T, E = cases[ci].E, k = cases[ci].k;
    float *l = rand_floats(T * E, 4.0f), *sc = cases[ci].scale ? rand_floats(E, 2.0f) : NULL;
    for (int64_t t = 0; t < T; t++) l[t * E + (t % E)] = l[t * E + (E - 1 - t % E)]; /* a tie per row */
    int32_t *rid = malloc(sizeof(int32_t) * (size_t)(T * k)), *gid = malloc(sizeof(int32_t) * (size_t)(T * k));
    double *rw = malloc(sizeof(double) * (size_t)(T * k));
    float *gw = malloc(sizeof(float) * (size_t)(T * k));
    for (int64_t t = 0; t < T; t++) {
      const float *r = l + t * E;
      bool *used = calloc((size_t)E, 1);
      double mx = -INFINITY, sum = 0, sel = 0;
      for (int64_t e = 0; e < E; e++) mx = r[e] > mx ? r[e] : mx;
      for (int64_t e = 0; e < E; e++) sum += exp((double)r[e] - mx);
      for (int64_t j = 0; j < k; j++) {
        int64_t b = -1;
        for (int64_t e = 0; e < E; e++)
          if (!used[e] && (b < 0 || r[e] > r[b])) b = e;
        used[b] = true;
        rid[t * k + j] = (int32_t)b;
        rw[t * k + j] = exp((double)r[b] - mx) / sum;
        sel += rw[t * k + j];
      }
      for (int64_t j = 0; j < k; j++) {
        if (cases[ci].norm) rw[t * k + j] /= sel;
        if (sc) rw[t * k + j] *= sc[rid[t * k + j]];
      }
      free(used);
    }
    char shape[80];
    snprintf(shape, sizeof shape, "%lld tokens, top %lld of %lld%s%s", (long long)T, (long long)k, (long long)E,
             cases[ci].norm ? ", norm" : "", sc ? ", scale" : "");
    st->cases++;
    for (int di = 0; di < n_devs; di++) {
      bk_backend *be = devs[di];
      bk_tensor tl = tfrom_f32(be, l, T, E), ti = tnew(be, BK_DT_I32, T, k), tw = tnew(be, BK_DT_F32, T, k), ts = {0};
      if (sc) ts = tfrom_f32(be, sc, 1, E);
      poison(&tw);
      bk_moe_route(&ti, &tw, &tl, cases[ci].norm, sc ? &ts : NULL);
      tget(&tw, gw, "moe_route");
      herr err = {0};
      if (bk_get(&ti, 0, gid, bk_nbytes(&ti), &err)) die("moe_route ids", &err);
      compare(st, K_ELEM, di, shape, gw, rw, T * k);
      int64_t wrong = 0;
      for (int64_t i = 0; i < T * k; i++) wrong += gid[i] != rid[i];
      test_checks++;
      if (wrong) {
        test_failures++;
        fprintf(stderr, "FAIL moe_route [%s] on %s: %lld expert ids differ\n", shape, bk_backend_name(be), (long long)wrong);
      }
      bk_tensor_free(&tl), bk_tensor_free(&ti), bk_tensor_free(&tw);
      if (sc) bk_tensor_free(&ts);
    }
    free(l), free(sc), free(rid), free(gid), free(rw), free(gw);
  }
}

static double act_ref(bk_act a, double v);

/* The experts against a double-precision recomputation from dequantized
 * weights, for every stored format; ids chosen so that some experts are
 * used by several tokens, some by none, and one slot is out of range (it
 * must contribute nothing). The CPU's plain reference (bk_moe_ref) is
 * checked against the same numbers. */
static void moe_case(const fmt *f, int64_t T, int64_t E, int64_t k, int64_t D, int64_t I, bk_act act) {
  char fname[32], name[48], shape[128];
  fmt_name(f, fname, sizeof fname);
  snprintf(name, sizeof name, "moe %s", fname);
  snprintf(shape, sizeof shape, "%lld tokens, top %lld of %lld, D %lld, I %lld", (long long)T, (long long)k, (long long)E,
           (long long)D, (long long)I);
  op_stat *st = stat_for(name), *rs = stat_for("moe (cpu reference)");
  st->cases++;
  host_weight *hg = malloc(sizeof *hg * (size_t)E), *hu = malloc(sizeof *hu * (size_t)E), *hd = malloc(sizeof *hd * (size_t)E);
  for (int64_t e = 0; e < E; e++) make_weight(&hg[e], f, I, D), make_weight(&hu[e], f, I, D), make_weight(&hd[e], f, D, I);
  float *x = rand_floats(T * D, 1.0f), *w = rand_floats(T * k, 1.0f);
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * k));
  for (int64_t i = 0; i < T * k; i++) ids[i] = (int32_t)((i * 7 + i / k) % (E > 2 ? E - 1 : E)); /* the last expert unused */
  if (T * k > 2) ids[1] = (int32_t)E; /* out of range */
  double *ref = calloc((size_t)(T * D), sizeof(double)), *h = malloc(sizeof(double) * (size_t)I);
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < k; j++) {
      int32_t e = ids[t * k + j];
      if (e < 0 || e >= E) continue;
      for (int64_t i = 0; i < I; i++) {
        double g = 0, u = 0;
        for (int64_t d = 0; d < D; d++) g += (double)hg[e].deq[i * D + d] * x[t * D + d], u += (double)hu[e].deq[i * D + d] * x[t * D + d];
        h[i] = act_ref(act, g) * u;
      }
      for (int64_t d = 0; d < D; d++) {
        double o = 0;
        for (int64_t i = 0; i < I; i++) o += (double)hd[e].deq[d * I + i] * h[i];
        ref[t * D + d] += (double)w[t * k + j] * o;
      }
    }
  float *got = malloc(sizeof(float) * (size_t)(T * D));
  {
    bk_experts hx = {.n = E};
    bk_weight *gw = malloc(sizeof *gw * (size_t)(3 * E));
    for (int64_t e = 0; e < E; e++) gw[e] = hg[e].w, gw[E + e] = hu[e].w, gw[2 * E + e] = hd[e].w;
    hx.gate = gw, hx.up = gw + E, hx.down = gw + 2 * E;
    herr err = {0};
    rs->cases++;
    if (bk_moe_ref(got, x, T, D, ids, w, k, &hx, act, &err)) die("bk_moe_ref", &err);
    compare(rs, K_MATMUL, 0, shape, got, ref, T * D);
    free(gw);
  }
  for (int di = 0; di < n_devs; di++) {
    bk_backend *be = devs[di];
    bk_weight *lw = calloc((size_t)(3 * E), sizeof *lw);
    bool ok = true;
    for (int64_t e = 0; e < E && ok; e++)
      ok = load_weight(be, &hg[e], &lw[e], name) && load_weight(be, &hu[e], &lw[E + e], name) &&
           load_weight(be, &hd[e], &lw[2 * E + e], name);
    if (ok) {
      bk_experts ex = {.n = E, .gate = lw, .up = lw + E, .down = lw + 2 * E};
      bk_tensor tx = tfrom_f32(be, x, T, D), ty = tnew(be, BK_DT_F32, T, D), tw = tfrom_f32(be, w, T, k);
      bk_tensor ti = tnew(be, BK_DT_I32, T, k);
      tset(&ti, ids);
      poison(&ty);
      bk_moe(&ty, &tx, &ti, &tw, &ex, act);
      tget(&ty, got, name);
      compare(st, K_MATMUL, di, shape, got, ref, T * D);
      bk_tensor_free(&tx), bk_tensor_free(&ty), bk_tensor_free(&tw), bk_tensor_free(&ti);
    }
    for (int64_t i = 0; i < 3 * E; i++)
      if (lw[i].data) bk_weight_release(be, &lw[i]);
    free(lw);
  }
  for (int64_t e = 0; e < E; e++) free_weight(&hg[e]), free_weight(&hu[e]), free_weight(&hd[e]);
  free(hg), free(hu), free(hd), free(x), free(w), free(ids), free(ref), free(h), free(got);
}

/* The experts with LoRA deltas (bk_expert_lora) as layer_experts runs them: bk_moe over every
 * row without deltas, then again over each run of rows that shares an adapter set (row views
 * of x, y, ids and w), with that set's deltas; rows outside the runs keep the plain experts.
 * Every routed slot's gate, up and down get each adapter of its row's set, in order,
 * (x · a_eᵀ) · b_eᵀ, against a double recomputation. Adapters of different ranks; the first
 * leaves expert 1 unchanged (zero B rows); a rank of 0 is an adapter without expert deltas
 * in a set (it adds nothing); one slot's id is out of range (it contributes nothing) and the
 * last expert is chosen by nobody. Every backend (one that ignored the deltas, or did
 * nothing, fails), and on the CPU its plain bk_moe_ref run the same way. */
typedef struct xlora_run {
  int64_t t0, rows;
  int n, which[4]; /* the run's adapters, in order */
} xlora_run;

static void moe_lora_case(const fmt *f, int64_t T, int64_t E, int64_t k, int64_t D, int64_t I, bk_act act, int na,
                          const int64_t *ranks, const xlora_run *runs, int n_runs) {
  char fname[32], shape[160];
  fmt_name(f, fname, sizeof fname);
  snprintf(shape, sizeof shape, "%s, %lld tokens, top %lld of %lld, D %lld, I %lld, %d adapters, %d runs", fname, (long long)T,
           (long long)k, (long long)E, (long long)D, (long long)I, na, n_runs);
  op_stat *st = stat_for("moe lora"), *rs = stat_for("moe lora (cpu reference)");
  st->cases++;
  rs->cases++;
  host_weight *hw = malloc(sizeof *hw * (size_t)(3 * E));
  for (int64_t e = 0; e < E; e++) make_weight(&hw[e], f, I, D), make_weight(&hw[E + e], f, I, D), make_weight(&hw[2 * E + e], f, D, I);
  float *x = rand_floats(T * D, 1.0f), *w = rand_floats(T * k, 1.0f);
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)(T * k));
  for (int64_t i = 0; i < T * k; i++) ids[i] = (int32_t)((i * 5 + i / k) % (E > 2 ? E - 1 : E)); /* the last expert unused */
  if (T * k > 2) ids[1] = (int32_t)E; /* out of range */
  int64_t in[3] = {D, D, I}, out[3] = {I, I, D};
  float *la[4][3] = {{0}}, *lb[4][3] = {{0}};
  for (int a = 0; a < na; a++)
    for (int p = 0; p < 3 && ranks[a]; p++) {
      la[a][p] = rand_floats(E * ranks[a] * in[p], 0.3f);
      lb[a][p] = rand_floats(E * out[p] * ranks[a], 0.3f);
      if (a == 0) /* expert 1 unchanged by the first adapter */
        memset(lb[a][p] + 1 * out[p] * ranks[a], 0, sizeof(float) * (size_t)(out[p] * ranks[a]));
    }
  /* the reference, and the same without any delta (the deltas must matter) */
  double *ref = calloc((size_t)(T * D), sizeof(double)), *plain = calloc((size_t)(T * D), sizeof(double));
  double *g = malloc(sizeof(double) * (size_t)I), *u = malloc(sizeof(double) * (size_t)I), *o = malloc(sizeof(double) * (size_t)D);
  for (int pass = 0; pass < 2; pass++)
    for (int64_t t = 0; t < T; t++) {
      const xlora_run *run = NULL;
      for (int q = 0; q < n_runs; q++)
        if (t >= runs[q].t0 && t < runs[q].t0 + runs[q].rows) run = &runs[q];
      int nset = pass == 0 && run ? run->n : 0;
      const float *xt = x + t * D;
      double *yt = (pass ? plain : ref) + t * D;
      for (int64_t j = 0; j < k; j++) {
        int32_t e = ids[t * k + j];
        if (e < 0 || e >= E) continue;
        for (int64_t i = 0; i < I; i++) {
          g[i] = u[i] = 0;
          for (int64_t d = 0; d < D; d++)
            g[i] += (double)hw[e].deq[i * D + d] * xt[d], u[i] += (double)hw[E + e].deq[i * D + d] * xt[d];
        }
        for (int s = 0; s < nset; s++) {
          int a = run->which[s];
          int64_t r = ranks[a];
          for (int p = 0; p < 2; p++)
            for (int64_t q = 0; q < r; q++) {
              double tq = 0;
              for (int64_t d = 0; d < D; d++) tq += (double)la[a][p][(e * r + q) * D + d] * xt[d];
              for (int64_t i = 0; i < I; i++) (p ? u : g)[i] += tq * lb[a][p][(e * I + i) * r + q];
            }
        }
        for (int64_t i = 0; i < I; i++) g[i] = act_ref(act, g[i]) * u[i];
        for (int64_t d = 0; d < D; d++) {
          o[d] = 0;
          for (int64_t i = 0; i < I; i++) o[d] += (double)hw[2 * E + e].deq[d * I + i] * g[i];
        }
        for (int s = 0; s < nset; s++) {
          int a = run->which[s];
          int64_t r = ranks[a];
          for (int64_t q = 0; q < r; q++) {
            double tq = 0;
            for (int64_t i = 0; i < I; i++) tq += (double)la[a][2][(e * r + q) * I + i] * g[i];
            for (int64_t d = 0; d < D; d++) o[d] += tq * lb[a][2][(e * D + d) * r + q];
          }
        }
        for (int64_t d = 0; d < D; d++) yt[d] += (double)w[t * k + j] * o[d];
      }
    }
  float *got = malloc(sizeof(float) * (size_t)(T * D));
  for (int64_t i = 0; i < T * D; i++) got[i] = (float)plain[i];
  test_checks++;
  if (!(nmse(got, ref, T * D) > 1e-3)) {
    test_failures++;
    fprintf(stderr, "FAIL moe lora [%s]: the deltas hardly change the output (nmse %.3g): the case tests nothing\n", shape,
            nmse(got, ref, T * D));
  }
  for (int di = 0; di < n_devs; di++) {
    bk_backend *be = devs[di];
    bk_weight *lw = calloc((size_t)(3 * E), sizeof *lw);
    bool ok = true;
    for (int64_t i = 0; i < 3 * E && ok; i++) ok = load_weight(be, &hw[i], &lw[i], "moe lora");
    bk_expert_lora xl[4];
    memset(xl, 0, sizeof xl);
    for (int a = 0; a < na && ok; a++) {
      xl[a].r = ranks[a];
      for (int p = 0; p < 3 && ranks[a]; p++)
        xl[a].a[p] = tfrom_f32(be, la[a][p], E * ranks[a], in[p]), xl[a].b[p] = tfrom_f32(be, lb[a][p], E * out[p], ranks[a]);
    }
    if (ok) {
      bk_experts ex = {.n = E, .gate = lw, .up = lw + E, .down = lw + 2 * E};
      if (bk_backend_is_cpu(be)) { /* the plain reference, run the same way */
        herr err = {0};
        if (bk_moe_ref(got, x, T, D, ids, w, k, &ex, act, &err)) die("bk_moe_ref", &err);
        for (int q = 0; q < n_runs; q++) {
          const bk_expert_lora *list[4];
          for (int s = 0; s < runs[q].n; s++) list[s] = &xl[runs[q].which[s]];
          bk_experts er = ex;
          er.lora = list, er.n_lora = runs[q].n;
          int64_t t0 = runs[q].t0;
          if (bk_moe_ref(got + t0 * D, x + t0 * D, runs[q].rows, D, ids + t0 * k, w + t0 * k, k, &er, act, &err))
            die("bk_moe_ref", &err);
        }
        compare(rs, K_MATMUL, di, shape, got, ref, T * D);
      }
      bk_tensor tx = tfrom_f32(be, x, T, D), ty = tnew(be, BK_DT_F32, T, D), tw = tfrom_f32(be, w, T, k);
      bk_tensor ti = tnew(be, BK_DT_I32, T, k);
      tset(&ti, ids);
      poison(&ty);
      bk_moe(&ty, &tx, &ti, &tw, &ex, act);
      for (int q = 0; q < n_runs; q++) {
        const bk_expert_lora *list[4];
        for (int s = 0; s < runs[q].n; s++) list[s] = &xl[runs[q].which[s]];
        bk_experts er = ex;
        er.lora = list, er.n_lora = runs[q].n;
        bk_tensor yr = bk_rows(&ty, runs[q].t0, runs[q].rows), xr = bk_rows(&tx, runs[q].t0, runs[q].rows);
        bk_tensor ir = bk_rows(&ti, runs[q].t0, runs[q].rows), wr = bk_rows(&tw, runs[q].t0, runs[q].rows);
        bk_moe(&yr, &xr, &ir, &wr, &er, act);
      }
      tget(&ty, got, "moe lora");
      compare(st, K_MATMUL, di, shape, got, ref, T * D);
      bk_tensor_free(&tx), bk_tensor_free(&ty), bk_tensor_free(&tw), bk_tensor_free(&ti);
    }
    for (int a = 0; a < na; a++)
      for (int p = 0; p < 3 && ranks[a]; p++)
        if (xl[a].a[p].buf) bk_tensor_free(&xl[a].a[p]), bk_tensor_free(&xl[a].b[p]);
    for (int64_t i = 0; i < 3 * E; i++)
      if (lw[i].data) bk_weight_release(be, &lw[i]);
    free(lw);
  }
  for (int64_t i = 0; i < 3 * E; i++) free_weight(&hw[i]);
  for (int a = 0; a < na; a++)
    for (int p = 0; p < 3; p++) free(la[a][p]), free(lb[a][p]);
  free(hw), free(x), free(w), free(ids), free(ref), free(plain), free(g), free(u), free(o), free(got);
}

static void test_moe_lora(void) {
  /* decode: one token under two stacked adapters */
  static const int64_t r2[] = {3, 2};
  static const xlora_run one[] = {{0, 1, 2, {0, 1}}};
  moe_lora_case(&formats[0], 1, 4, 2, 48, 40, BK_ACT_SILU, 2, r2, one, 1);
  /* two runs of different sets (one with an adapter of no expert deltas), rows without adapters around them */
  static const int64_t r3[] = {3, 2, 0};
  static const xlora_run mixed[] = {{1, 4, 3, {0, 2, 1}}, {6, 3, 1, {1}}};
  moe_lora_case(&formats[0], 11, 6, 3, 64, 96, BK_ACT_SILU, 3, r3, mixed, 2);
  /* f16 weights, inputs not whole sub-blocks of 32; a set in the reverse order */
  static const int64_t r4[] = {4, 1};
  static const xlora_run rev[] = {{0, 5, 2, {1, 0}}, {5, 4, 1, {0}}};
  moe_lora_case(&formats[1], 9, 8, 2, 48, 40, BK_ACT_GELU_TANH, 2, r4, rev, 2);
  /* quantized weights (Q8_0, Q4_K, MLX 4-bit), several adapters stacked */
  static const int64_t r8[] = {8, 5, 2};
  static const xlora_run three[] = {{2, 6, 3, {2, 0, 1}}};
  moe_lora_case(&formats[3], 8, 5, 2, 64, 96, BK_ACT_GELU, 3, r8, three, 1);
  static const int64_t r1[] = {6};
  static const xlora_run mid[] = {{1, 2, 1, {0}}};
  moe_lora_case(&formats[5], 4, 5, 2, 256, 256, BK_ACT_RELU, 1, r1, mid, 1);
  static const xlora_run tail[] = {{0, 3, 1, {1}}, {3, 3, 2, {0, 1}}};
  moe_lora_case(&formats[8], 7, 6, 3, 64, 64, BK_ACT_SILU, 2, r2, tail, 2);
  /* more tokens than the experts' GEMV path takes, four adapters of ranks up to 16 */
  static const int64_t r16[] = {16, 5, 2, 1};
  static const xlora_run many[] = {{0, 17, 1, {0}}, {17, 13, 2, {1, 2}}, {34, 6, 4, {3, 2, 1, 0}}};
  moe_lora_case(&formats[0], 40, 16, 4, 64, 32, BK_ACT_GELU, 4, r16, many, 3);
}

static void test_moe(void) {
  static const bk_act acts[] = {BK_ACT_SILU, BK_ACT_GELU_TANH, BK_ACT_GELU, BK_ACT_RELU};
  for (int fi = 0; fi < N_FORMATS; fi++) {
    const fmt *f = &formats[fi];
    int64_t blk = fmt_block(f);
    int64_t D = blk == 1 ? 48 : (256 + blk - 1) / blk * blk, I = blk == 1 ? 40 : (128 + blk - 1) / blk * blk;
    if (I % blk) I = blk;
    moe_case(f, 1, 8, 2, D, I, acts[fi % 4]);
    moe_case(f, 9, 6, 3, D, I, acts[(fi + 1) % 4]);
    /* inputs in whole sub-blocks of 32: CUDA's per-slot GEMV (up to 8 tokens) and grouped GEMM */
    if (blk == 1) D = 64, I = 96;
    moe_case(f, 3, 8, 2, D, I, acts[(fi + 2) % 4]);
    moe_case(f, 8, 10, 3, D, I, acts[(fi + 3) % 4]);
    moe_case(f, 12, 10, 3, D, I, acts[fi % 4]);
  }
  moe_case(&formats[0], 40, 16, 4, 64, 32, BK_ACT_SILU);
  /* experts chosen by more pairs than one tile holds, output rows not a whole number of tiles */
  moe_case(&formats[3], 200, 6, 2, 256, 96, BK_ACT_SILU);
  moe_case(&formats[2], 130, 6, 2, 96, 160, BK_ACT_GELU);
  moe_case(&formats[8], 100, 5, 2, 128, 96, BK_ACT_SILU);
  moe_case(&formats[5], 70, 4, 3, 256, 256, BK_ACT_GELU_TANH);
}

/* ---- get_rows, kv_write ---- */

static void test_get_rows(void) {
  static const int32_t r0[] = {7, 3, 3, 49, 0, 12, 7, 48, 1, 25, 25, 3};
  static const int32_t r1[] = {4, 0, 2, 2, 1, 4, 3, 0, 4};
  static const int32_t r2[] = {19, 2, 11, 0, 19, 5, 2};
  static const int32_t r3[] = {0, 0, 0};
  static const struct { int64_t R, C; const int32_t *rows; int64_t n; } cases[] = {
      {50, 33, r0, 12}, {5, 1, r1, 9}, {20, 1024, r2, 7}, {1, 64, r3, 3}};
  op_stat *st = stat_for("get_rows");
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t R = cases[ci].R, C = cases[ci].C, n = cases[ci].n;
    float *x = rand_floats(R * C, 2.0f);
    double *ref = malloc(sizeof(double) * (size_t)(n * C));
    for (int64_t t = 0; t < n; t++)
      for (int64_t c = 0; c < C; c++) ref[t * C + c] = x[cases[ci].rows[t] * C + c];
    char shape[64];
    snprintf(shape, sizeof shape, "%lld of [%lld, %lld]", (long long)n, (long long)R, (long long)C);
    st->cases++;
    float *got = malloc(sizeof(float) * (size_t)(n * C));
    for (int di = 0; di < n_devs; di++) {
      bk_backend *be = devs[di];
      bk_tensor tx = tfrom_f32(be, x, R, C), ty = tnew(be, BK_DT_F32, n, C), tr = tfrom_i32(be, cases[ci].rows, n);
      poison(&ty);
      bk_get_rows(&ty, &tx, &tr);
      tget(&ty, got, "get_rows");
      compare(st, K_ELEM, di, shape, got, ref, n * C);
      bk_tensor_free(&tx), bk_tensor_free(&ty), bk_tensor_free(&tr);
    }
    free(got), free(ref), free(x);
  }
}

static void test_kv_write(void) {
  static const int32_t s0[] = {9, 3, 40, 41, 63};
  static const int32_t s1[] = {11};
  static const int32_t s3[] = {6, 0, 4};
  int32_t s2[20];
  { /* 20 distinct slots of 128, shuffled */
    int64_t all[128];
    for (int64_t i = 0; i < 128; i++) all[i] = i;
    shuffle_i64(all, 128);
    for (int i = 0; i < 20; i++) s2[i] = (int32_t)all[i];
  }
  static const struct { int64_t slots, dim, T, block_rows; int which; } cases[] = {
      {64, 64, 5, 16, 0}, {16, 256, 1, 16, 1}, {128, 48, 20, 1, 2}, {7, 1, 3, 64, 3}};
  op_stat *st = stat_for("kv_write");
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t S = cases[ci].slots, D = cases[ci].dim, T = cases[ci].T;
    const int32_t *slot = cases[ci].which == 0 ? s0 : cases[ci].which == 1 ? s1 : cases[ci].which == 2 ? s2 : s3;
    float *k0 = rand_floats(S * D, 1.0f), *v0 = rand_floats(S * D, 1.0f); /* what the arenas held before */
    float *kn = rand_floats(T * D, 4.0f), *vn = rand_floats(T * D, 4.0f);
    double *rk = malloc(sizeof(double) * (size_t)(S * D)), *rv = malloc(sizeof(double) * (size_t)(S * D));
    for (int64_t i = 0; i < S * D; i++) rk[i] = k0[i], rv[i] = v0[i];
    for (int64_t t = 0; t < T; t++)
      for (int64_t c = 0; c < D; c++) rk[slot[t] * D + c] = kn[t * D + c], rv[slot[t] * D + c] = vn[t * D + c];
    char shape[64];
    snprintf(shape, sizeof shape, "%lld rows into [%lld, %lld]", (long long)T, (long long)S, (long long)D);
    st->cases++;
    float *got = malloc(sizeof(float) * (size_t)(S * D));
    for (int di = 0; di < n_devs; di++) {
      bk_backend *be = devs[di];
      bk_tensor tk = tfrom_f32(be, k0, S, D), tv = tfrom_f32(be, v0, S, D);
      bk_tensor tkn = tfrom_f32(be, kn, T, D), tvn = tfrom_f32(be, vn, T, D), ts = tfrom_i32(be, slot, T);
      bk_kv_layer kv = {.k = &tk, .v = &tv, .block_rows = cases[ci].block_rows};
      bk_kv_write(&kv, &tkn, &tvn, &ts);
      tget(&tk, got, "kv_write");
      compare(st, K_ELEM, di, shape, got, rk, S * D);
      tget(&tv, got, "kv_write");
      compare(st, K_ELEM, di, shape, got, rv, S * D);
      bk_tensor_free(&tk), bk_tensor_free(&tv), bk_tensor_free(&tkn), bk_tensor_free(&tvn), bk_tensor_free(&ts);
    }
    free(got), free(rk), free(rv), free(k0), free(v0), free(kn), free(vn);
  }
  /* quantized arenas: each written row must be op_kv_quantize_row's bytes
   * (compared dequantized: codes and scales alike), other rows untouched */
  static const struct { int64_t slots, dim, T; int which; bk_kv_fmt kf, vf; } qcases[] = {
      {64, 64, 5, 0, BK_KV_Q8, BK_KV_Q8}, {16, 256, 1, 1, BK_KV_Q4, BK_KV_Q4}, {128, 48, 20, 2, BK_KV_Q8, BK_KV_Q4},
      {7, 16, 3, 3, BK_KV_Q4, BK_KV_F32}, {128, 128, 20, 2, BK_KV_Q4, BK_KV_Q8}, {7, 80, 3, 3, BK_KV_Q8, BK_KV_Q8},
      {64, 64, 5, 0, BK_KV_FP8, BK_KV_FP8}, {128, 48, 20, 2, BK_KV_FP8, BK_KV_Q8}, {7, 16, 3, 3, BK_KV_FP8, BK_KV_F32},
      {16, 256, 1, 1, BK_KV_Q4, BK_KV_FP8}};
  for (size_t ci = 0; ci < sizeof qcases / sizeof qcases[0]; ci++) {
    int64_t S = qcases[ci].slots, D = qcases[ci].dim, T = qcases[ci].T;
    bk_kv_fmt kf = qcases[ci].kf, vf = qcases[ci].vf;
    int64_t kw = (int64_t)bk_kv_row_bytes(kf, D) / 4, vw = (int64_t)bk_kv_row_bytes(vf, D) / 4;
    const int32_t *slot = qcases[ci].which == 0 ? s0 : qcases[ci].which == 1 ? s1 : qcases[ci].which == 2 ? s2 : s3;
    float *src = rand_floats(S * D, 1.0f), *kn = rand_floats(T * D, 4.0f), *vn = rand_floats(T * D, 4.0f);
    float *k0 = malloc(sizeof(float) * (size_t)(S * kw)), *v0 = malloc(sizeof(float) * (size_t)(S * vw));
    for (int64_t r = 0; r < S; r++) op_kv_quantize_row(kf, k0 + r * kw, src + r * D, D), op_kv_quantize_row(vf, v0 + r * vw, src + r * D, D);
    kn[0] = 0.0f; /* a block with a zero, and (dim 16) a block that is padding past the row */
    if (D >= 32) for (int64_t c2 = 0; c2 < 32; c2++) vn[c2] = 0.0f; /* a block of zeros: scale 0 */
    float *ek = malloc(sizeof(float) * (size_t)(S * kw)), *ev = malloc(sizeof(float) * (size_t)(S * vw));
    memcpy(ek, k0, sizeof(float) * (size_t)(S * kw)), memcpy(ev, v0, sizeof(float) * (size_t)(S * vw));
    for (int64_t t = 0; t < T; t++) op_kv_quantize_row(kf, ek + slot[t] * kw, kn + t * D, D), op_kv_quantize_row(vf, ev + slot[t] * vw, vn + t * D, D);
    double *rk = malloc(sizeof(double) * (size_t)(S * D)), *rv = malloc(sizeof(double) * (size_t)(S * D));
    float *row = malloc(sizeof(float) * (size_t)D), *got = malloc(sizeof(float) * (size_t)(S * (kw > vw ? kw : vw)));
    float *gd = malloc(sizeof(float) * (size_t)(S * D));
    for (int64_t r = 0; r < S; r++) {
      op_kv_dequantize(kf, row, ek + r * kw, 0, D);
      for (int64_t c2 = 0; c2 < D; c2++) rk[r * D + c2] = row[c2];
      op_kv_dequantize(vf, row, ev + r * vw, 0, D);
      for (int64_t c2 = 0; c2 < D; c2++) rv[r * D + c2] = row[c2];
    }
    char shape[96];
    snprintf(shape, sizeof shape, "%lld rows into [%lld, %lld] as %s/%s", (long long)T, (long long)S, (long long)D,
             bk_kv_fmt_name(kf), bk_kv_fmt_name(vf));
    st->cases++;
    for (int di = 0; di < n_devs; di++) {
      bk_backend *be = devs[di];
      bk_tensor tk = tfrom_f32(be, k0, S, kw), tv = tfrom_f32(be, v0, S, vw);
      bk_tensor tkn = tfrom_f32(be, kn, T, D), tvn = tfrom_f32(be, vn, T, D), ts = tfrom_i32(be, slot, T);
      bk_kv_layer kv = {.k = &tk, .v = &tv, .block_rows = 16, .k_fmt = kf, .v_fmt = vf};
      bk_kv_write(&kv, &tkn, &tvn, &ts);
      tget(&tk, got, "kv_write");
      for (int64_t r = 0; r < S; r++) op_kv_dequantize(kf, gd + r * D, got + r * kw, 0, D);
      compare(st, K_ELEM, di, shape, gd, rk, S * D);
      tget(&tv, got, "kv_write");
      for (int64_t r = 0; r < S; r++) op_kv_dequantize(vf, gd + r * D, got + r * vw, 0, D);
      compare(st, K_ELEM, di, shape, gd, rv, S * D);
      bk_tensor_free(&tk), bk_tensor_free(&tv), bk_tensor_free(&tkn), bk_tensor_free(&tvn), bk_tensor_free(&ts);
    }
    free(src), free(kn), free(vn), free(k0), free(v0), free(ek), free(ev), free(rk), free(rv), free(row), free(got), free(gd);
  }
}

/* ---- attention ---- */

#define MAX_SEQS 6
typedef struct seq_spec {
  int64_t len; /* rows cached after this step */
  int64_t nq;  /* queries: rows [len - nq, len) */
} seq_spec;

typedef struct attn_case {
  const char *what;
  int64_t H, KVH, hd, B, window;
  float softcap;
  seq_spec seqs[MAX_SEQS]; /* until len == 0 */
  int64_t span;            /* > 0: the queries of each sequence in bidirectional spans of this many rows,
                              each query seeing up to its span's last row (bk_attn_index.last) */
} attn_case;

static const attn_case attn_cases[] = {
    {"decode, GQA 1", 8, 8, 64, 16, 0, 0, {{1, 1}, {17, 1}, {40, 1}, {100, 1}}, 0},
    {"decode, GQA 2", 4, 2, 128, 16, 0, 0, {{33, 1}, {5, 1}}, 0},
    {"decode, GQA 4", 8, 2, 80, 64, 0, 0, {{70, 1}, {64, 1}, {129, 1}}, 0},
    {"decode, GQA 8", 8, 1, 256, 1, 0, 0, {{20, 1}, {3, 1}}, 0},
    {"prefill", 4, 4, 32, 16, 0, 0, {{37, 37}}, 0},
    {"prefill, 3 sequences", 4, 1, 48, 16, 0, 0, {{20, 20}, {45, 45}, {1, 1}}, 0},
    {"chunked prefill + prefill + decode", 8, 4, 64, 16, 0, 0, {{50, 17}, {40, 40}, {70, 1}}, 0},
    {"window 8", 4, 2, 64, 16, 8, 0, {{60, 60}, {30, 1}, {45, 12}}, 0},
    {"softcap 5", 4, 4, 128, 64, 0, 5.0f, {{70, 30}, {9, 1}}, 0},
    {"window 5 + softcap 50", 8, 1, 256, 1, 5, 50.0f, {{25, 25}, {12, 1}, {40, 7}}, 0},
    {"block_rows 64, long", 2, 2, 80, 64, 0, 0, {{150, 40}, {130, 130}}, 0},
    {"query tiles crossing sequences", 2, 1, 48, 1, 0, 0, {{10, 10}, {30, 30}, {5, 3}}, 0},
    {"bidirectional spans", 4, 2, 64, 16, 0, 0, {{40, 40}, {50, 23}, {9, 1}}, 7},
    {"bidirectional spans, window 8", 4, 2, 64, 16, 8, 0, {{60, 60}, {30, 12}}, 5},
    {"bidirectional spans longer than the window", 8, 1, 128, 16, 6, 0, {{70, 48}, {33, 33}}, 20},
    {"GQA 8, hd 32", 8, 1, 32, 64, 0, 0, {{65, 65}}, 0},
    {"mixed decode and chunks", 4, 2, 64, 16, 3, 20.0f, {{30, 1}, {40, 6}, {50, 1}, {8, 8}, {2, 2}}, 0},
    {"GQA 2, hd 48, window 16", 6, 3, 48, 16, 16, 0, {{33, 33}, {18, 1}}, 0},
    {"long chunked prefill", 8, 2, 128, 16, 0, 0, {{300, 64}, {257, 1}, {200, 200}}, 0},
    {"long, window 40 + softcap 30", 4, 4, 256, 64, 40, 30.0f, {{180, 70}, {129, 1}}, 0},
    {"long decode batch", 16, 2, 64, 16, 0, 0, {{511, 1}, {1, 1}, {333, 1}, {64, 1}, {65, 1}, {200, 1}}, 0},
    {"hd 16, GQA 2, window 8", 4, 2, 16, 16, 8, 0, {{40, 40}, {20, 1}, {30, 7}}, 0},
    {"hd 16, GQA 4, decode", 4, 1, 16, 1, 0, 0, {{25, 1}, {3, 3}}, 0},
    {"decode alone, long, GQA 4 (split keys)", 8, 2, 128, 16, 0, 0, {{3000, 1}}, 0},
    {"decode alone, long, GQA 8, window 700", 16, 2, 64, 16, 700, 0, {{2000, 1}}, 0},
    {"decode, GQA 3 (a block per query head)", 6, 2, 32, 16, 0, 0, {{50, 1}, {9, 1}, {700, 1}}, 0},
};

/* When set: attention_case runs on this device backend opened with the fast
 * precision (tensor-core tiles of queries), against its own limit. */
static bk_backend *attn_fast;

/* Quantized KV (kf / vf not BK_KV_F32): the same K / V stored in that
 * format (op_kv_quantize_row), unowned rows all NaN words, and the reference
 * dequantizing as it reads, so backends are held to the same limits. */
static void attention_case(const attn_case *c, bk_kv_fmt kf, bk_kv_fmt vf) {
  const int64_t H = c->H, KVH = c->KVH, hd = c->hd, B = c->B, kvd = KVH * hd, qd = H * hd;
  const int64_t kw = (int64_t)bk_kv_row_bytes(kf, kvd) / 4, vw = (int64_t)bk_kv_row_bytes(vf, kvd) / 4;
  int ns = 0;
  int64_t T = 0, nb_used = 0, nb[MAX_SEQS];
  while (ns < MAX_SEQS && c->seqs[ns].len > 0) {
    nb[ns] = (c->seqs[ns].len + B - 1) / B;
    nb_used += nb[ns];
    T += c->seqs[ns].nq;
    ns++;
  }
  /* blocks: a shuffled pool with unused ones (NaN) between the used */
  const int64_t n_blocks = nb_used + 3, n_slots = n_blocks * B;
  int64_t *ids = malloc(sizeof(int64_t) * (size_t)n_blocks);
  for (int64_t i = 0; i < n_blocks; i++) ids[i] = i;
  shuffle_i64(ids, n_blocks);
  const int64_t unused = ids[nb_used]; /* a block no sequence owns */
  /* tables: [gap][seq 0's blocks][gap][seq 1's blocks]...; a gap entry names an unused block */
  int64_t n_tab = nb_used + ns + 1, tpos[MAX_SEQS];
  int32_t *tables = malloc(sizeof(int32_t) * (size_t)n_tab);
  int64_t ti = 0, bi = 0;
  for (int s = 0; s < ns; s++) {
    tables[ti++] = (int32_t)unused;
    tpos[s] = ti;
    for (int64_t j = 0; j < nb[s]; j++) tables[ti++] = (int32_t)ids[bi++];
  }
  tables[ti++] = (int32_t)unused;
  /* arenas: NaN in every block no sequence owns, large values past each sequence's end */
  float *K = malloc(sizeof(float) * (size_t)(n_slots * kvd)), *V = malloc(sizeof(float) * (size_t)(n_slots * kvd));
  for (int64_t i = 0; i < n_slots * kvd; i++) K[i] = V[i] = NAN;
  for (int s = 0; s < ns; s++)
    for (int64_t j = 0; j < nb[s] * B; j++) {
      int64_t slot = (int64_t)tables[tpos[s] + j / B] * B + j % B;
      float amp = j < c->seqs[s].len ? 1.0f : 1000.0f;
      for (int64_t d = 0; d < kvd; d++) {
        K[slot * kvd + d] = urand() * amp;
        V[slot * kvd + d] = urand() * amp;
      }
    }
  /* the arenas as stored: rows of kw / vw 4-byte words */
  float *KS = K, *VS = V;
  if (kf || vf) {
    KS = malloc(sizeof(float) * (size_t)(n_slots * kw)), VS = malloc(sizeof(float) * (size_t)(n_slots * vw));
    for (int64_t i = 0; i < n_slots * kw; i++) KS[i] = NAN;
    for (int64_t i = 0; i < n_slots * vw; i++) VS[i] = NAN;
    for (int s = 0; s < ns; s++)
      for (int64_t j = 0; j < nb[s] * B; j++) {
        int64_t slot = (int64_t)tables[tpos[s] + j / B] * B + j % B;
        op_kv_quantize_row(kf, KS + slot * kw, K + slot * kvd, kvd);
        op_kv_quantize_row(vf, VS + slot * vw, V + slot * kvd, kvd);
      }
  }
  /* queries and their index */
  float *q = rand_floats(T * qd, 2.0f);
  int32_t *row = malloc(sizeof(int32_t) * (size_t)T), *tab = malloc(sizeof(int32_t) * (size_t)T);
  int32_t *last = malloc(sizeof(int32_t) * (size_t)T);
  int64_t *row64 = malloc(sizeof(int64_t) * (size_t)T), *last64 = malloc(sizeof(int64_t) * (size_t)T);
  for (int s = 0, t = 0; s < ns; s++)
    for (int64_t j = c->seqs[s].len - c->seqs[s].nq, j0 = j; j < c->seqs[s].len; j++, t++) {
      row[t] = (int32_t)j, row64[t] = j;
      tab[t] = (int32_t)tpos[s];
      int64_t end = c->span > 0 ? j0 + ((j - j0) / c->span + 1) * c->span - 1 : j;
      if (end > c->seqs[s].len - 1) end = c->seqs[s].len - 1;
      last[t] = (int32_t)end, last64[t] = end;
    }
  attn_params p = {.n_heads = H, .n_kv_heads = KVH, .head_dim = hd, .scale = (float)(1.0 / sqrt((double)hd)),
                   .softcap = c->softcap, .window = c->window};
  /* reference: one op_attention_ref per sequence over host block pointers */
  float *refo = malloc(sizeof(float) * (size_t)(T * qd));
  for (int s = 0, t0 = 0; s < ns; s++) {
    const float **kb = malloc(sizeof(float *) * (size_t)nb[s]), **vb = malloc(sizeof(float *) * (size_t)nb[s]);
    for (int64_t j = 0; j < nb[s]; j++) {
      kb[j] = KS + (int64_t)tables[tpos[s] + j] * B * kw;
      vb[j] = VS + (int64_t)tables[tpos[s] + j] * B * vw;
    }
    kv_view view = {.k_blocks = kb, .v_blocks = vb, .block_rows = B, .row_stride = kw, .lo = 0, .hi = c->seqs[s].len,
                    .k_fmt = kf, .v_fmt = vf, .v_row_stride = vw, .last = c->span > 0 ? last64 + t0 : NULL};
    op_attention_ref(NULL, refo + t0 * qd, q + t0 * qd, c->seqs[s].nq, row64 + t0, &view, &p);
    t0 += (int)c->seqs[s].nq;
    free(kb), free(vb);
  }
  double *ref = malloc(sizeof(double) * (size_t)(T * qd));
  for (int64_t i = 0; i < T * qd; i++) ref[i] = refo[i];
  char shape[224];
  int o = snprintf(shape, sizeof shape, "%s, KV %s/%s: H %lld, KVH %lld, hd %lld, block_rows %lld, window %lld, softcap %g, span %lld, seqs",
                   c->what, bk_kv_fmt_name(kf), bk_kv_fmt_name(vf), (long long)H, (long long)KVH, (long long)hd, (long long)B, (long long)c->window,
                   (double)c->softcap, (long long)c->span);
  for (int s = 0; s < ns && o > 0 && (size_t)o < sizeof shape; s++)
    o += snprintf(shape + o, sizeof shape - (size_t)o, " %lld/%lld", (long long)c->seqs[s].nq, (long long)c->seqs[s].len);
  op_stat *st = stat_for(attn_fast ? "attention fast (dev)" : "attention");
  st->cases++;
  float *got = malloc(sizeof(float) * (size_t)(T * qd));
  for (int di = attn_fast ? 1 : 0; di < n_devs; di++) {
    bk_backend *be = di == 1 && attn_fast ? attn_fast : devs[di];
    bk_tensor tk = tfrom_f32(be, KS, n_slots, kw), tv = tfrom_f32(be, VS, n_slots, vw), tq = tfrom_f32(be, q, T, qd);
    bk_tensor tout = tnew(be, BK_DT_F32, T, qd), trow = tfrom_i32(be, row, T), ttab = tfrom_i32(be, tab, T),
              ttables = tfrom_i32(be, tables, n_tab), tlast = tfrom_i32(be, last, T);
    bk_kv_layer kv = {.k = &tk, .v = &tv, .block_rows = B, .k_fmt = kf, .v_fmt = vf};
    bk_attn_index ix = {.row = &trow, .tab = &ttab, .tables = &ttables, .last = c->span > 0 ? &tlast : NULL};
    poison(&tout);
    bk_attention(&tout, &tq, &kv, &ix, &p);
    tget(&tout, got, "attention");
    compare(st, attn_fast ? K_ATTN_FAST : K_ATTN, di, shape, got, ref, T * qd);
    bk_tensor_free(&tk), bk_tensor_free(&tv), bk_tensor_free(&tq), bk_tensor_free(&tout);
    bk_tensor_free(&trow), bk_tensor_free(&ttab), bk_tensor_free(&ttables), bk_tensor_free(&tlast);
  }
  if (KS != K) free(KS), free(VS);
  free(got), free(ref), free(refo), free(q), free(row), free(tab), free(row64), free(last), free(last64), free(K), free(V),
      free(tables), free(ids);
}

static void test_attention(void) {
  static const bk_kv_fmt fmts[][2] = {{BK_KV_F32, BK_KV_F32}, {BK_KV_Q8, BK_KV_Q8}, {BK_KV_Q4, BK_KV_Q4},
                                       {BK_KV_Q8, BK_KV_Q4},   {BK_KV_FP8, BK_KV_FP8}, {BK_KV_FP8, BK_KV_Q8}};
  for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
    for (size_t i = 0; i < sizeof attn_cases / sizeof attn_cases[0]; i++) attention_case(&attn_cases[i], fmts[f][0], fmts[f][1]);
}

/* The same cases on the device under the fast precision (head sizes 64 and
 * 128 go to tensor cores, the others to the f32 kernels), plus longer
 * prompts that cross several 64-row tiles of queries and keys. */
static void test_attention_fast(void) {
  if (n_devs < 2) return;
  bk_open_opts opts = {.fast_matmul = true};
  herr err = {0};
  if (bk_backend_open(dev_label, &opts, &attn_fast, &err)) die("fast backend", &err);
  static const attn_case more[] = {
      {"tc: long prompt, GQA 4, hd 128", 8, 2, 128, 16, 0, 0, {{300, 300}}, 0},
      {"tc: chunk after a prefix, hd 64, window 100", 4, 2, 64, 16, 100, 0, {{500, 130}, {70, 1}}, 0},
      {"tc: two prompts and a decode, hd 128, softcap 30", 4, 4, 128, 64, 0, 30.0f, {{129, 129}, {64, 64}, {200, 1}}, 0},
      {"tc: bidirectional spans across tiles, hd 128", 4, 2, 128, 16, 0, 0, {{150, 150}, {90, 40}}, 33},
      {"tc: a serving step (decodes, then prompts of 128), GQA 4", 8, 2, 128, 16, 0, 0,
       {{100, 1}, {50, 1}, {128, 128}, {128, 128}, {300, 90}, {7, 1}}, 0},
  };
  static const bk_kv_fmt fmts[][2] = {{BK_KV_F32, BK_KV_F32}, {BK_KV_Q8, BK_KV_Q4}, {BK_KV_FP8, BK_KV_FP8}};
  for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
    for (size_t i = 0; i < sizeof attn_cases / sizeof attn_cases[0]; i++) attention_case(&attn_cases[i], fmts[f][0], fmts[f][1]);
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) attention_case(&more[i], fmts[f][0], fmts[f][1]);
  }
  bk_backend_close(attn_fast);
  attn_fast = NULL;
}


/* ---- sample ---- */

static int cmp_desc_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x < y) - (x > y);
}

/* The reference of bk_sample's kept set in double precision (backend.h's
 * semantics): probabilities normalised over the kept tokens, 0 elsewhere.
 * x: the adjusted row. Returns the argmax. */
static int64_t sample_ref(const float *x, int64_t V, const bk_sample_row *w, double *prob) {
  int64_t best = -1;
  for (int64_t i = 0; i < V; i++)
    if (isfinite(x[i]) && (best < 0 || x[i] > x[best])) best = i;
  for (int64_t i = 0; i < V; i++) prob[i] = 0;
  if (w->temperature <= 0) {
    prob[best] = 1;
    return best;
  }
  double *tmp = malloc(sizeof(double) * (size_t)V), floor_v = -INFINITY;
  if (w->top_k > 0 && w->top_k < V) {
    for (int64_t i = 0; i < V; i++) tmp[i] = x[i];
    qsort(tmp, (size_t)V, sizeof(double), cmp_desc_double);
    floor_v = tmp[w->top_k - 1];
  }
  double total = 0;
  for (int64_t i = 0; i < V; i++) {
    prob[i] = x[i] >= floor_v ? exp(((double)x[i] - x[best]) / w->temperature) : 0;
    total += prob[i];
  }
  if (w->top_p < 1) {
    for (int64_t i = 0; i < V; i++) tmp[i] = prob[i];
    qsort(tmp, (size_t)V, sizeof(double), cmp_desc_double);
    double above = 0, cut = tmp[0];
    for (int64_t i = 0; i < V && above < w->top_p * total; i++) cut = tmp[i], above += tmp[i];
    for (int64_t i = 0; i < V; i++)
      if (prob[i] < cut) prob[i] = 0;
  }
  if (w->min_p > 0)
    for (int64_t i = 0; i < V; i++)
      if (prob[i] < w->min_p) prob[i] = 0;
  double mass = 0;
  for (int64_t i = 0; i < V; i++) mass += prob[i];
  for (int64_t i = 0; i < V; i++) prob[i] /= mass;
  free(tmp);
  return best;
}

/* ---- multi-head latent attention, DeepSeek sparse attention ---- */

static void test_set_cols_rows(void) {
  op_stat *sc = stat_for("set_cols"), *sr = stat_for("set_rows");
  static const struct { int64_t rows, cols, c0, w; } cases[] = {{1, 7, 0, 7}, {5, 64, 16, 16}, {9, 130, 127, 3}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t R = cases[ci].rows, C = cases[ci].cols, c0 = cases[ci].c0, W = cases[ci].w;
    float *y0 = rand_floats(R * C, 1.0f), *x = rand_floats(R * W, 3.0f), *got = malloc(sizeof(float) * (size_t)(R * C));
    double *ref = malloc(sizeof(double) * (size_t)(R * C));
    for (int64_t i = 0; i < R * C; i++) ref[i] = y0[i];
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = 0; c < W; c++) ref[r * C + c0 + c] = x[r * W + c];
    char shape[80];
    snprintf(shape, sizeof shape, "[%lld, %lld] into [%lld, %lld] at %lld", (long long)R, (long long)W, (long long)R,
             (long long)C, (long long)c0);
    sc->cases++;
    for (int di = 0; di < n_devs; di++) {
      bk_tensor ty = tfrom_f32(devs[di], y0, R, C), tx = tfrom_f32(devs[di], x, R, W);
      bk_set_cols(&ty, &tx, c0);
      tget(&ty, got, "set_cols");
      compare(sc, K_ELEM, di, shape, got, ref, R * C);
      bk_tensor_free(&ty), bk_tensor_free(&tx);
    }
    free(y0), free(x), free(got), free(ref);
  }
  static const int32_t r0[] = {9, 3, 40, 41, 63}, r1[] = {0}, r2[] = {6, 2, 4};
  static const struct { int64_t slots, dim, n; const int32_t *rows; } rc[] = {{64, 40, 5, r0}, {3, 576, 1, r1}, {7, 1, 3, r2}};
  for (size_t ci = 0; ci < sizeof rc / sizeof rc[0]; ci++) {
    int64_t S = rc[ci].slots, D = rc[ci].dim, n = rc[ci].n;
    float *y0 = rand_floats(S * D, 1.0f), *x = rand_floats(n * D, 3.0f), *got = malloc(sizeof(float) * (size_t)(S * D));
    double *ref = malloc(sizeof(double) * (size_t)(S * D));
    for (int64_t i = 0; i < S * D; i++) ref[i] = y0[i];
    for (int64_t t = 0; t < n; t++)
      for (int64_t c = 0; c < D; c++) ref[rc[ci].rows[t] * D + c] = x[t * D + c];
    char shape[80];
    snprintf(shape, sizeof shape, "%lld rows into [%lld, %lld]", (long long)n, (long long)S, (long long)D);
    sr->cases++;
    for (int di = 0; di < n_devs; di++) {
      bk_tensor ty = tfrom_f32(devs[di], y0, S, D), tx = tfrom_f32(devs[di], x, n, D), tr = tfrom_i32(devs[di], rc[ci].rows, n);
      bk_set_rows(&ty, &tx, &tr);
      tget(&ty, got, "set_rows");
      compare(sr, K_ELEM, di, shape, got, ref, S * D);
      bk_tensor_free(&ty), bk_tensor_free(&tx), bk_tensor_free(&tr);
    }
    free(y0), free(x), free(got), free(ref);
  }
}

static void test_layernorm(void) {
  op_stat *st = stat_for("layernorm");
  static const struct { int64_t rows, cols; bool w, b, inplace; } cases[] = {
      {1, 16, true, true, false}, {7, 128, true, true, true}, {3, 33, false, false, false}, {40, 1000, true, false, true}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t R = cases[ci].rows, C = cases[ci].cols;
    float *x = rand_floats(R * C, 3.0f), *w = rand_floats(C, 2.0f), *b = rand_floats(C, 1.0f);
    for (int64_t i = 0; i < R * C; i++) x[i] += 0.5f; /* a mean away from zero */
    double *ref = malloc(sizeof(double) * (size_t)(R * C));
    float *got = malloc(sizeof(float) * (size_t)(R * C));
    for (int64_t r = 0; r < R; r++) {
      double mean = 0, var = 0;
      for (int64_t c = 0; c < C; c++) mean += x[r * C + c];
      mean /= (double)C;
      for (int64_t c = 0; c < C; c++) var += (x[r * C + c] - mean) * (x[r * C + c] - mean);
      var /= (double)C;
      for (int64_t c = 0; c < C; c++)
        ref[r * C + c] = (x[r * C + c] - mean) / sqrt(var + 1e-6) * (cases[ci].w ? w[c] : 1.0) + (cases[ci].b ? b[c] : 0.0);
    }
    char shape[80];
    snprintf(shape, sizeof shape, "[%lld, %lld]%s%s%s", (long long)R, (long long)C, cases[ci].w ? ", w" : "",
             cases[ci].b ? ", b" : "", cases[ci].inplace ? ", in place" : "");
    st->cases++;
    for (int di = 0; di < n_devs; di++) {
      bk_tensor tx = tfrom_f32(devs[di], x, R, C), tw = tfrom_f32(devs[di], w, 1, C), tb = tfrom_f32(devs[di], b, 1, C);
      bk_tensor ty = cases[ci].inplace ? tx : tnew(devs[di], BK_DT_F32, R, C);
      if (!cases[ci].inplace) poison(&ty);
      bk_layernorm(&ty, &tx, cases[ci].w ? &tw : NULL, cases[ci].b ? &tb : NULL, 1e-6f);
      tget(&ty, got, "layernorm");
      compare(st, K_ELEM, di, shape, got, ref, R * C);
      if (!cases[ci].inplace) bk_tensor_free(&ty);
      bk_tensor_free(&tx), bk_tensor_free(&tw), bk_tensor_free(&tb);
    }
    free(x), free(w), free(b), free(ref), free(got);
  }
}

/* Grouped sigmoid routing against op_moe_route_group, and that reference
 * against a direct reading of the definition on one hand-made row. */
static void test_moe_route_group(void) {
  op_stat *st = stat_for("moe_route_group");
  { /* 8 experts in 4 groups of 2, open 2: groups {0,1}=0.9+0.1, {2,3}=0.6+0.6, {4,5}=0.95+0.001, {6,7}=0.4+0.4 */
    float lg[8];
    static const float sgm[8] = {0.9f, 0.1f, 0.6f, 0.6f, 0.95f, 0.001f, 0.4f, 0.4f};
    for (int e = 0; e < 8; e++) lg[e] = logf(sgm[e] / (1 - sgm[e]));
    int32_t id[3];
    float w[3];
    op_moe_route_group(id, w, lg, 1, 8, 3, NULL, 4, 2, true, 2.0f);
    /* open groups: {2,3} (1.2) and {0,1} (1.0); top 3 of experts 0..3: 0, 2, 3 */
    test_checks++;
    if (!(id[0] == 0 && id[1] == 2 && id[2] == 3 && fabsf(w[0] - 2.0f * 0.9f / 2.1f) < 1e-5f)) {
      test_failures++;
      fprintf(stderr, "FAIL moe_route_group reference: ids %d %d %d, w0 %g\n", id[0], id[1], id[2], (double)w[0]);
    }
  }
  static const struct { int64_t T, E, k, ng, tg; bool norm, bias; float scale; } cases[] = {
      {1, 8, 2, 4, 2, true, true, 2.5f}, {9, 16, 4, 1, 1, true, false, 1.0f}, {33, 256, 8, 8, 4, true, true, 2.5f},
      {5, 64, 6, 8, 3, false, true, 1.5f}, {3, 8, 8, 2, 2, true, true, 1.0f}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t T = cases[ci].T, E = cases[ci].E, k = cases[ci].k;
    float *l = rand_floats(T * E, 4.0f), *bias = rand_floats(E, 0.3f);
    for (int64_t t = 0; t < T; t++) l[t * E + (t % E)] = l[t * E + (E - 1 - t % E)]; /* a tie per row */
    int32_t *rid = malloc(sizeof(int32_t) * (size_t)(T * k)), *gid = malloc(sizeof(int32_t) * (size_t)(T * k));
    float *rwf = malloc(sizeof(float) * (size_t)(T * k)), *gw = malloc(sizeof(float) * (size_t)(T * k));
    double *rw = malloc(sizeof(double) * (size_t)(T * k));
    op_moe_route_group(rid, rwf, l, T, E, k, cases[ci].bias ? bias : NULL, cases[ci].ng, cases[ci].tg, cases[ci].norm,
                       cases[ci].scale);
    for (int64_t i = 0; i < T * k; i++) rw[i] = rwf[i];
    char shape[96];
    snprintf(shape, sizeof shape, "%lld tokens, top %lld of %lld in %lld of %lld groups%s%s", (long long)T, (long long)k,
             (long long)E, (long long)cases[ci].tg, (long long)cases[ci].ng, cases[ci].norm ? ", norm" : "",
             cases[ci].bias ? ", bias" : "");
    st->cases++;
    for (int di = 0; di < n_devs; di++) {
      bk_backend *be = devs[di];
      bk_tensor tl = tfrom_f32(be, l, T, E), ti = tnew(be, BK_DT_I32, T, k), tw = tnew(be, BK_DT_F32, T, k),
                tb = tfrom_f32(be, bias, 1, E);
      poison(&tw);
      bk_moe_route_group(&ti, &tw, &tl, cases[ci].bias ? &tb : NULL, cases[ci].ng, cases[ci].tg, cases[ci].norm, cases[ci].scale);
      tget(&tw, gw, "moe_route_group");
      herr err = {0};
      if (bk_get(&ti, 0, gid, bk_nbytes(&ti), &err)) die("moe_route_group ids", &err);
      compare(st, K_ELEM, di, shape, gw, rw, T * k);
      int64_t wrong = 0;
      for (int64_t i = 0; i < T * k; i++) wrong += gid[i] != rid[i];
      test_checks++;
      if (wrong) {
        test_failures++;
        fprintf(stderr, "FAIL moe_route_group [%s] on %s: %lld expert ids differ\n", shape, bk_backend_name(be), (long long)wrong);
      }
      bk_tensor_free(&tl), bk_tensor_free(&ti), bk_tensor_free(&tw), bk_tensor_free(&tb);
    }
    free(l), free(bias), free(rid), free(gid), free(rwf), free(gw), free(rw);
  }
}

/* A paged arena for the sparse ops: sequences of the given lengths, blocks
 * shuffled, NaN in unowned blocks; every query of every sequence from row
 * len - nq. */
typedef struct sparse_setup {
  int64_t T, n_slots, n_tab, width, B;
  float *arena;
  int32_t *tables, *row, *tab;
} sparse_setup;

static void sparse_make(sparse_setup *ss, const seq_spec *seqs, int ns, int64_t width, int64_t B, bool zero_rows) {
  memset(ss, 0, sizeof *ss);
  int64_t nb_used = 0, nb[MAX_SEQS];
  for (int s = 0; s < ns; s++) nb[s] = (seqs[s].len + B - 1) / B, nb_used += nb[s], ss->T += seqs[s].nq;
  int64_t n_blocks = nb_used + 2;
  int64_t *ids = malloc(sizeof(int64_t) * (size_t)n_blocks);
  for (int64_t i = 0; i < n_blocks; i++) ids[i] = i;
  shuffle_i64(ids, n_blocks);
  ss->n_slots = n_blocks * B, ss->width = width, ss->B = B, ss->n_tab = nb_used;
  ss->arena = malloc(sizeof(float) * (size_t)(ss->n_slots * width));
  for (int64_t i = 0; i < ss->n_slots * width; i++) ss->arena[i] = NAN;
  ss->tables = malloc(sizeof(int32_t) * (size_t)nb_used);
  ss->row = malloc(sizeof(int32_t) * (size_t)ss->T), ss->tab = malloc(sizeof(int32_t) * (size_t)ss->T);
  int64_t ti = 0, t = 0;
  for (int s = 0; s < ns; s++) {
    int64_t start = ti;
    for (int64_t j = 0; j < nb[s]; j++) ss->tables[ti++] = (int32_t)ids[start + j];
    for (int64_t j = 0; j < seqs[s].len; j++) {
      float *r = ss->arena + ((int64_t)ss->tables[start + j / B] * B + j % B) * width;
      bool zero = zero_rows && j % 7 == 3; /* whole rows of zeros: exact score ties */
      bool copy = j % 11 == 10;            /* copies of an earlier row: exact ties */
      for (int64_t d = 0; d < width; d++) r[d] = zero ? 0.0f : urand();
      if (copy) memcpy(r, ss->arena + ((int64_t)ss->tables[start] * B) * width, sizeof(float) * (size_t)width);
    }
    for (int64_t j = seqs[s].len - seqs[s].nq; j < seqs[s].len; j++, t++) ss->row[t] = (int32_t)j, ss->tab[t] = (int32_t)start;
  }
  free(ids);
}

static void sparse_free(sparse_setup *ss) { free(ss->arena), free(ss->tables), free(ss->row), free(ss->tab); }

typedef struct sparse_case {
  const char *what;
  int64_t Hi, di, H, hd, v_off, v_dim, topk, B;
  seq_spec seqs[MAX_SEQS];
} sparse_case;

static const sparse_case sparse_cases[] = {
    {"prefill under top-k", 4, 16, 4, 40, 8, 32, 8, 16, {{6, 6}}},
    {"prefill past top-k", 8, 16, 4, 40, 8, 32, 8, 16, {{40, 40}}},
    {"decode batch", 4, 32, 8, 72, 8, 64, 16, 16, {{100, 1}, {3, 1}, {17, 1}, {64, 1}}},
    {"chunks and decode", 2, 64, 2, 80, 16, 64, 32, 1, {{70, 20}, {33, 1}, {40, 40}}},
    {"long, top 64", 4, 32, 4, 48, 16, 32, 64, 64, {{300, 5}, {129, 129}}},
};

static void test_index_sparse_attention(void) {
  op_stat *si = stat_for("index_topk"), *sa = stat_for("attention_sparse");
  for (size_t ci = 0; ci < sizeof sparse_cases / sizeof sparse_cases[0]; ci++) {
    const sparse_case *c = &sparse_cases[ci];
    int ns = 0;
    while (ns < MAX_SEQS && c->seqs[ns].len > 0) ns++;
    sparse_setup ks, kvs;
    sparse_make(&ks, c->seqs, ns, c->di, c->B, true);
    sparse_make(&kvs, c->seqs, ns, c->hd, c->B, false);
    memcpy(kvs.tables, ks.tables, sizeof(int32_t) * (size_t)ks.n_tab); /* one block table for both arenas */
    int64_t T = ks.T, K = c->topk;
    float *q = rand_floats(T * c->Hi * c->di, 1.0f), *w = rand_floats(T * c->Hi, 1.0f);
    float *qa = rand_floats(T * c->H * c->hd, 1.0f);
    int32_t *rsel = malloc(sizeof(int32_t) * (size_t)(T * K)), *gsel = malloc(sizeof(int32_t) * (size_t)(T * K));
    /* the key rows of kvs must be finite where ks's are: rebuild kvs's rows on ks's table */
    for (int s = 0, t0 = 0; s < ns; s++) {
      for (int64_t j = 0; j < c->seqs[s].len; j++) {
        int64_t slot = (int64_t)ks.tables[ks.tab[t0] + j / c->B] * c->B + j % c->B;
        for (int64_t d = 0; d < c->hd; d++) kvs.arena[slot * c->hd + d] = urand();
      }
      t0 += (int)c->seqs[s].nq;
    }
    paged_rows pk = {ks.arena, c->di, c->B, ks.row, ks.tab, ks.tables};
    index_params ip = {c->Hi, c->di, K, (float)(1.0 / sqrt((double)c->di))};
    op_index_topk(NULL, rsel, q, w, T, &pk, &ip);
    paged_rows pa = {kvs.arena, c->hd, c->B, ks.row, ks.tab, ks.tables};
    sparse_attn_params sp = {c->H, c->hd, c->v_off, c->v_dim, K, (float)(1.0 / sqrt((double)c->hd))};
    float *refo = malloc(sizeof(float) * (size_t)(T * c->H * c->v_dim)), *got = malloc(sizeof(float) * (size_t)(T * c->H * c->v_dim));
    op_attention_sparse(NULL, refo, qa, T, rsel, &pa, &sp);
    double *ref = malloc(sizeof(double) * (size_t)(T * c->H * c->v_dim));
    for (int64_t i = 0; i < T * c->H * c->v_dim; i++) ref[i] = refo[i];
    /* the reference's choice: every row while there are fewer than top-k, else top-k distinct rows in order */
    int64_t bad = 0;
    for (int64_t t = 0; t < T; t++) {
      int64_t rows = ks.row[t] + 1, m = 0;
      for (int64_t j = 0; j < K; j++) {
        int32_t r = rsel[t * K + j];
        if (r >= 0) bad += (r >= rows) || (j > 0 && r <= rsel[t * K + j - 1]), m++;
      }
      bad += m != (rows < K ? rows : K);
      if (rows <= K) continue;
      /* every chosen row beats every other: a higher score, or the same and a lower row */
      double *sc = malloc(sizeof(double) * (size_t)rows);
      bool *in = calloc((size_t)rows, 1);
      for (int64_t j = 0; j < rows; j++) {
        const float *k = ks.arena + ((int64_t)ks.tables[ks.tab[t] + j / c->B] * c->B + j % c->B) * c->di;
        double sj = 0;
        for (int64_t h = 0; h < c->Hi; h++) {
          double d = 0;
          for (int64_t x = 0; x < c->di; x++) d += (double)q[(t * c->Hi + h) * c->di + x] * k[x];
          d *= ip.scale;
          if (d > 0) sj += (double)w[t * c->Hi + h] * d;
        }
        sc[j] = sj;
      }
      for (int64_t j = 0; j < K; j++)
        if (rsel[t * K + j] >= 0) in[rsel[t * K + j]] = true;
      for (int64_t a = 0; a < rows; a++)
        for (int64_t b = 0; in[a] && b < rows; b++)
          if (!in[b]) bad += !(sc[a] > sc[b] || (sc[a] == sc[b] && a < b));
      free(sc), free(in);
    }
    test_checks++;
    if (bad) test_failures++, fprintf(stderr, "FAIL index_topk reference [%s]: %lld bad rows\n", c->what, (long long)bad);
    char shape[160];
    snprintf(shape, sizeof shape, "%s: %lld index heads of %lld, %lld heads of %lld (values %lld..+%lld), top %lld, block %lld",
             c->what, (long long)c->Hi, (long long)c->di, (long long)c->H, (long long)c->hd, (long long)c->v_off,
             (long long)c->v_dim, (long long)K, (long long)c->B);
    si->cases++, sa->cases++;
    for (int di = 0; di < n_devs; di++) {
      bk_backend *be = devs[di];
      bk_tensor tk = tfrom_f32(be, ks.arena, ks.n_slots, c->di), tkv = tfrom_f32(be, kvs.arena, kvs.n_slots, c->hd);
      bk_tensor tq = tfrom_f32(be, q, T, c->Hi * c->di), tw = tfrom_f32(be, w, T, c->Hi), tqa = tfrom_f32(be, qa, T, c->H * c->hd);
      bk_tensor trow = tfrom_i32(be, ks.row, T), ttab = tfrom_i32(be, ks.tab, T), ttables = tfrom_i32(be, ks.tables, ks.n_tab);
      bk_tensor tsel = tnew(be, BK_DT_I32, T, K), tout = tnew(be, BK_DT_F32, T, c->H * c->v_dim), trs = tnew(be, BK_DT_I32, T, K);
      bk_attn_index ix = {.row = &trow, .tab = &ttab, .tables = &ttables};
      bk_kv_layer kk = {.k = &tk, .v = &tk, .block_rows = c->B}, kkv = {.k = &tkv, .v = &tkv, .block_rows = c->B};
      poison(&tsel), poison(&tout);
      bk_index_topk(&tsel, &tq, &tw, &kk, &ix, &ip);
      herr err = {0};
      if (bk_get(&tsel, 0, gsel, bk_nbytes(&tsel), &err)) die("index_topk", &err);
      int64_t wrong = 0;
      for (int64_t i = 0; i < T * K; i++) wrong += gsel[i] != rsel[i];
      test_checks++;
      if (wrong) {
        test_failures++;
        fprintf(stderr, "FAIL index_topk [%s] on %s: %lld of %lld chosen rows differ\n", shape, bk_backend_name(be),
                (long long)wrong, (long long)(T * K));
      }
      tset(&trs, rsel); /* the attention reads the reference's choice */
      bk_attention_sparse(&tout, &tqa, &kkv, &ix, &trs, &sp);
      tget(&tout, got, "attention_sparse");
      compare(sa, K_ATTN, di, shape, got, ref, T * c->H * c->v_dim);
      bk_tensor_free(&tk), bk_tensor_free(&tkv), bk_tensor_free(&tq), bk_tensor_free(&tw), bk_tensor_free(&tqa);
      bk_tensor_free(&trow), bk_tensor_free(&ttab), bk_tensor_free(&ttables), bk_tensor_free(&tsel), bk_tensor_free(&tout);
      bk_tensor_free(&trs);
    }
    free(q), free(w), free(qa), free(rsel), free(gsel), free(refo), free(got), free(ref);
    sparse_free(&ks), sparse_free(&kvs);
  }
}

static void test_sample(void) {
  static const struct {
    int64_t V;
    float temp, top_p, min_p;
    int32_t top_k, top;
    int n_pen, n_bias;
  } cases[] = {
      {1000, 0, 1, 0, 0, 0, 0, 0},        {50257, 0, 1, 0, 0, 20, 30, 3},   {1000, 1, 1, 0, 0, 5, 0, 0},
      {32000, 0.7f, 1, 0, 40, 0, 0, 0},   {32000, 1, 0.9f, 0, 0, 0, 0, 0},  {151936, 0.8f, 0.95f, 0.02f, 50, 20, 64, 4},
      {4097, 1.3f, 1, 0.1f, 0, 1, 10, 0}, {50257, 0.6f, 0.5f, 0, 1000, 3, 200, 2}, {7, 1, 1, 0, 3, 7, 2, 1},
      {65536, 2.0f, 0.99f, 0, 0, 0, 0, 0},
  };
  const int R = 3; /* rows per case, each with its own draw */
  op_stat *st = stat_for("sample");
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t V = cases[ci].V;
    float *x = rand_floats(R * V, 6.0f);
    bk_sample_row rows[3];
    bk_sample_adj *adj = malloc(sizeof(bk_sample_adj) * (size_t)(R * (cases[ci].n_pen + cases[ci].n_bias) + 1));
    int64_t n_adj = 0;
    float *xa = malloc(sizeof(float) * (size_t)(R * V)); /* the adjusted rows, by the spec */
    memcpy(xa, x, sizeof(float) * (size_t)(R * V));
    /* every other case masks its last row (a grammar's allowed tokens: about one in four), some with a
     * mask a word short, which leaves the last ids out */
    int32_t words = (int32_t)((V + 63) / 64);
    uint64_t *mask = calloc((size_t)words, sizeof(uint64_t));
    bool masked = ci % 2 == 0 && V >= 1000;
    if (masked) {
      if (ci % 4 == 0) words--;
      for (int64_t i = 0; i < (int64_t)words * 64; i++)
        if (irand(4) == 0) mask[i >> 6] |= 1ull << (i & 63);
      for (int64_t i = 0; i < V; i++)
        if (i >> 6 >= words || !(mask[i >> 6] >> (i & 63) & 1)) xa[(R - 1) * V + i] = -INFINITY;
    }
    for (int r = 0; r < R; r++) {
      bk_sample_row *w = &rows[r];
      *w = (bk_sample_row){.temperature = cases[ci].temp, .top_k = cases[ci].top_k, .top_p = cases[ci].top_p,
                           .min_p = cases[ci].min_p, .u = ((double)irand(1 << 30) + 0.5) / (double)(1 << 30),
                           .logprobs = 1, .top_logprobs = cases[ci].top};
      if (masked && r == R - 1) w->mask = mask, w->mask_words = words;
      w->pen_off = (int32_t)n_adj;
      int64_t start = irand(V); /* unique ids: a run from a random start */
      for (int i = 0; i < cases[ci].n_pen && i < V; i++) {
        bk_sample_adj a = {.id = (int32_t)((start + i) % V), .rep = i % 3 ? 1.3f : 1.0f, .sub = i % 2 ? 0.5f : 0.0f};
        adj[n_adj++] = a;
        float *v = &xa[r * V + a.id];
        if (a.rep != 1.0f) *v = *v < 0 ? *v * a.rep : *v / a.rep;
        *v -= a.sub;
      }
      w->n_pen = (int32_t)(n_adj - w->pen_off);
      w->bias_off = (int32_t)n_adj;
      for (int i = 0; i < cases[ci].n_bias; i++) {
        bk_sample_adj a = {.id = (int32_t)irand(V), .rep = 1, .add = urand() * 8.0f};
        adj[n_adj++] = a;
        xa[r * V + a.id] += a.add;
      }
      w->n_bias = (int32_t)(n_adj - w->bias_off);
    }
    double *prob = malloc(sizeof(double) * (size_t)V);
    char shape[96];
    snprintf(shape, sizeof shape, "V %lld, T %g, k %d, p %g, min_p %g, pen %d, bias %d", (long long)V,
             (double)cases[ci].temp, cases[ci].top_k, (double)cases[ci].top_p, (double)cases[ci].min_p, cases[ci].n_pen,
             cases[ci].n_bias);
    st->cases++;
    for (int di = 0; di < n_devs; di++) {
      bk_tensor tl = tfrom_f32(devs[di], x, R, V);
      bk_sample_out out[3];
      memset(out, 0x55, sizeof out);
      herr err = {0};
      if (bk_sample(&tl, rows, adj, n_adj, out, &err)) {
        test_checks++, test_failures++;
        fprintf(stderr, "FAIL sample [%s] on %s: %s\n", shape, bk_backend_name(devs[di]), err.msg);
        bk_tensor_free(&tl);
        continue;
      }
      double worst = 0;
      for (int r = 0; r < R; r++) {
        const float *row = xa + r * V;
        const bk_sample_row *w = &rows[r];
        int64_t best = sample_ref(row, V, w, prob);
        double mx = row[best], sum = 0;
        for (int64_t i = 0; i < V; i++) sum += exp((double)row[i] - mx);
        double lse = mx + log(sum);
        int64_t id = out[r].id;
        bool ok = id >= 0 && id < V;
        if (ok && w->temperature <= 0) ok = id == best;
        if (ok && w->temperature > 0) {
          /* u falls in id's share of the running sum of the kept mass (id order) */
          double lo = 0;
          for (int64_t i = 0; i < id; i++) lo += prob[i];
          ok = prob[id] > 0 && w->u >= lo - 1e-6 && w->u <= lo + prob[id] + 1e-6;
        }
        CHECK_MSG(ok, "sample [%s] on %s, row %d: token %lld is not the reference's choice", shape,
                  bk_backend_name(devs[di]), r, (long long)id);
        if (!ok) continue;
        double e = fabs(out[r].logprob - (row[id] - lse));
        if (e > worst) worst = e;
        CHECK_MSG(out[r].n_top == w->top_logprobs, "sample [%s] on %s: %d top logprobs, asked %d", shape,
                  bk_backend_name(devs[di]), out[r].n_top, w->top_logprobs);
        int64_t prev = -1;
        for (int k = 0; k < out[r].n_top && k < w->top_logprobs; k++) {
          int64_t t = out[r].top_ids[k];
          /* the k-th best: strictly below the previous, and nothing between */
          bool good = t >= 0 && t < V && (prev < 0 || row[t] < row[prev] || (row[t] == row[prev] && t > prev));
          for (int64_t i = 0; good && i < V; i++)
            if (i != t && (prev < 0 || row[i] < row[prev] || (row[i] == row[prev] && i > prev)) &&
                (row[i] > row[t] || (row[i] == row[t] && i < t)))
              good = false;
          CHECK_MSG(good, "sample [%s] on %s: top logprob %d is token %lld, not the %d-th best", shape,
                    bk_backend_name(devs[di]), k, (long long)t, k + 1);
          if (!good) break;
          double te = fabs(out[r].top_logprobs[k] - (row[t] - lse));
          if (te > worst) worst = te;
          prev = t;
        }
      }
      /* logprob error (absolute, nats) in the nmse column */
      if (!(worst <= st->max[di])) st->max[di] = worst;
      CHECK_MSG(worst < 1e-4, "sample [%s] on %s: logprob off by %.3g", shape, bk_backend_name(devs[di]), worst);
      bk_tensor_free(&tl);
    }
    free(prob), free(mask), free(xa), free(adj), free(x);
  }
}

/* ---- main ---- */

/* ---- recurrent layers: conv1d with state, gated delta rule, sigmoid_mul ---- */

/* A step of sequences of the given lengths over slots in shuffled order; odd
 * sequences continue a random state, even ones start fresh (their rows hold
 * garbage the op must ignore). Unused slots must keep their contents. */
typedef struct rec_case_seqs {
  int n;
  int32_t len[6];
} rec_case_seqs;

static int64_t rec_fill(const rec_case_seqs *c, rec_seq *seqs, int64_t n_slots) {
  int64_t slots[16], t = 0;
  for (int64_t i = 0; i < n_slots; i++) slots[i] = i;
  shuffle_i64(slots, n_slots);
  for (int s = 0; s < c->n; s++) {
    seqs[s] = (rec_seq){(int32_t)t, c->len[s], (int32_t)slots[s], s % 2 == 0};
    t += c->len[s];
  }
  return t;
}

static double *to_double(const float *x, int64_t n) {
  double *d = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

static void test_conv1d(void) {
  static const struct { int64_t c, k; rec_case_seqs q; } cases[] = {
      {8, 4, {1, {1}}},         {33, 4, {3, {1, 1, 1}}},        {64, 3, {2, {20, 1}}},
      {100, 4, {4, {2, 7, 1, 40}}}, {17, 2, {2, {5, 3}}},        {256, 5, {3, {1, 64, 2}}},
  };
  op_stat *sy = stat_for("conv1d"), *ss = stat_for("conv1d state");
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t C = cases[ci].c, K = cases[ci].k, n_slots = 8, off = 5, stride = off + (K - 1) * C + 3;
    rec_seq seqs[8];
    int64_t T = rec_fill(&cases[ci].q, seqs, n_slots);
    for (int silu = 0; silu < 2; silu++) {
      float *x = rand_floats(T * C, 2.0f), *w = rand_floats(C * K, 1.0f), *st0 = rand_floats(n_slots * stride, 1.5f);
      float *yr = malloc(sizeof(float) * (size_t)(T * C)), *str = malloc(sizeof(float) * (size_t)(n_slots * stride));
      memcpy(str, st0, sizeof(float) * (size_t)(n_slots * stride));
      op_conv1d_state(yr, x, C, w, K, str, stride, off, seqs, cases[ci].q.n, NULL, silu);
      double *ry = to_double(yr, T * C), *rs = to_double(str, n_slots * stride);
      char shape[96];
      snprintf(shape, sizeof shape, "c %lld, k %lld, %d seqs, %lld tokens%s", (long long)C, (long long)K, cases[ci].q.n,
               (long long)T, silu ? ", silu" : "");
      sy->cases++, ss->cases++;
      float *gy = malloc(sizeof(float) * (size_t)(T * C)), *gs = malloc(sizeof(float) * (size_t)(n_slots * stride));
      for (int di = 0; di < n_devs; di++) {
        bk_backend *be = devs[di];
        bk_tensor tx = tfrom_f32(be, x, T, C), tw = tfrom_f32(be, w, C, K), tst = tfrom_f32(be, st0, n_slots, stride);
        bk_tensor tq = tfrom_i32(be, (const int32_t *)seqs, 4 * cases[ci].q.n), ty = tnew(be, BK_DT_F32, T, C);
        tq = bk_reshape(&tq, cases[ci].q.n, 4);
        poison(&ty);
        bk_recurrent r = {&tst, off, &tq, NULL};
        bk_conv1d(&ty, &tx, &tw, &r, silu);
        tget(&ty, gy, "conv1d");
        tget(&tst, gs, "conv1d");
        compare(sy, K_ATTN, di, shape, gy, ry, T * C);
        compare(ss, K_ATTN, di, shape, gs, rs, n_slots * stride);
        bk_tensor_free(&tx), bk_tensor_free(&tw), bk_tensor_free(&tst), bk_tensor_free(&tq), bk_tensor_free(&ty);
      }
      free(x), free(w), free(st0), free(yr), free(str), free(ry), free(rs), free(gy), free(gs);
    }
  }
}

/* The gated delta rule against the token-by-token reference: decode
 * batches (one token per sequence), prefills over several 64-token chunks,
 * mixes, GQA-style value heads per key head, dk != dv; each case also run
 * on the device in two steps (a chunked prefill: the second continues the
 * first's state) and compared to the reference in one. */
static void test_delta_rule(void) {
  static const struct { int64_t nk, nv, dk, dv; rec_case_seqs q; } cases[] = {
      {1, 1, 16, 16, {1, {1}}},
      {2, 4, 16, 8, {3, {1, 1, 1}}},
      {2, 2, 32, 32, {1, {150}}},
      {1, 2, 64, 48, {4, {70, 1, 5, 130}}},
      {4, 8, 128, 128, {2, {1, 66}}},
      {2, 2, 128, 160, {2, {3, 9}}},
      {1, 1, 256, 32, {2, {65, 2}}},
  };
  op_stat *so = stat_for("delta_rule"), *ss = stat_for("delta_rule state");
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    delta_params p = {cases[ci].nk, cases[ci].nv, cases[ci].dk, cases[ci].dv};
    int64_t nv = p.n_v_heads, W = 2 * p.n_k_heads * p.dk + nv * p.dv, n_slots = 6, off = 7;
    int64_t stride = off + nv * p.dk * p.dv + 2;
    rec_seq seqs[8];
    int n_seqs = cases[ci].q.n;
    int64_t T = rec_fill(&cases[ci].q, seqs, n_slots);
    float *qkv = rand_floats(T * W, 1.0f), *a = rand_floats(T * nv, 2.0f), *b = rand_floats(T * nv, 3.0f);
    float *a_log = rand_floats(nv, 1.5f), *dtb = rand_floats(nv, 1.0f), *st0 = rand_floats(n_slots * stride, 0.5f);
    for (int64_t h = 0; h < nv; h++) a_log[h] -= 1.0f;
    float *orf = malloc(sizeof(float) * (size_t)(T * nv * p.dv)), *str = malloc(sizeof(float) * (size_t)(n_slots * stride));
    memcpy(str, st0, sizeof(float) * (size_t)(n_slots * stride));
    op_delta_rule_ref(orf, qkv, a, b, a_log, dtb, str, stride, off, seqs, n_seqs, &p);
    double *ro = to_double(orf, T * nv * p.dv), *rs = to_double(str, n_slots * stride);
    float *go = malloc(sizeof(float) * (size_t)(T * nv * p.dv)), *gs = malloc(sizeof(float) * (size_t)(n_slots * stride));
    for (int split = 0; split < 2; split++) {
      char shape[128];
      snprintf(shape, sizeof shape, "nk %lld, nv %lld, dk %lld, dv %lld, %d seqs, %lld tokens%s", (long long)p.n_k_heads,
               (long long)nv, (long long)p.dk, (long long)p.dv, n_seqs, (long long)T, split ? ", in two steps" : "");
      so->cases++, ss->cases++;
      for (int di = 0; di < n_devs; di++) {
        bk_backend *be = devs[di];
        bk_tensor tqkv = tfrom_f32(be, qkv, T, W), ta = tfrom_f32(be, a, T, nv), tb = tfrom_f32(be, b, T, nv);
        bk_tensor tal = tfrom_f32(be, a_log, 1, nv), tdt = tfrom_f32(be, dtb, 1, nv), tst = tfrom_f32(be, st0, n_slots, stride);
        bk_tensor to = tnew(be, BK_DT_F32, T, nv * p.dv);
        poison(&to);
        if (!split) {
          bk_tensor tq = tfrom_i32(be, (const int32_t *)seqs, 4 * n_seqs);
          tq = bk_reshape(&tq, n_seqs, 4);
          bk_recurrent r = {&tst, off, &tq, NULL};
          bk_delta_rule(&to, &tqkv, &ta, &tb, &tal, &tdt, &r, &p);
          tget(&to, go, "delta_rule");
          bk_tensor_free(&tq);
        } else { /* each sequence's first part (at least one token), then the rest */
          rec_seq s1[8], s2[8];
          int n2 = 0;
          for (int s = 0; s < n_seqs; s++) {
            int32_t first = (seqs[s].n + 1) / 2;
            s1[s] = seqs[s];
            s1[s].n = first;
            if (seqs[s].n > first) s2[n2++] = (rec_seq){seqs[s].t0 + first, seqs[s].n - first, seqs[s].slot, 0};
          }
          bk_tensor tq1 = tfrom_i32(be, (const int32_t *)s1, 4 * n_seqs);
          tq1 = bk_reshape(&tq1, n_seqs, 4);
          bk_recurrent r1 = {&tst, off, &tq1, NULL};
          bk_delta_rule(&to, &tqkv, &ta, &tb, &tal, &tdt, &r1, &p);
          bk_tensor tq2 = {0};
          if (n2) {
            tq2 = tfrom_i32(be, (const int32_t *)s2, 4 * n2);
            tq2 = bk_reshape(&tq2, n2, 4);
            bk_recurrent r2 = {&tst, off, &tq2, NULL};
            bk_delta_rule(&to, &tqkv, &ta, &tb, &tal, &tdt, &r2, &p);
          }
          tget(&to, go, "delta_rule");
          bk_tensor_free(&tq1);
          if (n2) bk_tensor_free(&tq2);
        }
        tget(&tst, gs, "delta_rule");
        compare(so, K_ATTN, di, shape, go, ro, T * nv * p.dv);
        compare(ss, K_ATTN, di, shape, gs, rs, n_slots * stride);
        bk_tensor_free(&tqkv), bk_tensor_free(&ta), bk_tensor_free(&tb), bk_tensor_free(&tal), bk_tensor_free(&tdt);
        bk_tensor_free(&tst), bk_tensor_free(&to);
      }
    }
    free(qkv), free(a), free(b), free(a_log), free(dtb), free(st0), free(orf), free(str), free(ro), free(rs), free(go), free(gs);
  }
}

static void test_sigmoid_mul(void) {
  static const int64_t cases[][3] = {{1, 7, 7}, {5, 64, 1}, {9, 130, 130}, {33, 48, 1}};
  op_stat *st = stat_for("sigmoid_mul");
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t R = cases[ci][0], C = cases[ci][1], G = cases[ci][2];
    float *y = rand_floats(R * C, 2.0f), *g = rand_floats(R * G, 6.0f), *got = malloc(sizeof(float) * (size_t)(R * C));
    double *ref = malloc(sizeof(double) * (size_t)(R * C));
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = 0; c < C; c++) ref[r * C + c] = (double)y[r * C + c] / (1.0 + exp(-(double)g[r * G + (G == 1 ? 0 : c)]));
    char shape[64];
    snprintf(shape, sizeof shape, "[%lld, %lld], gate [%lld, %lld]", (long long)R, (long long)C, (long long)R, (long long)G);
    st->cases++;
    for (int di = 0; di < n_devs; di++) {
      bk_tensor ty = tfrom_f32(devs[di], y, R, C), tg = tfrom_f32(devs[di], g, R, G);
      bk_sigmoid_mul(&ty, &tg);
      tget(&ty, got, "sigmoid_mul");
      compare(st, K_ELEM, di, shape, got, ref, R * C);
      bk_tensor_free(&ty), bk_tensor_free(&tg);
    }
    free(y), free(g), free(got), free(ref);
  }
}

/* ---- media encoders: multi-axis rope, act, clamp, embed_bag, attention_rel ---- */

static void test_rope_axes(void) {
  /* T, heads, head_dim, rot_dim, axes, interleaved sections (M-RoPE) or halves (2-D vision rope) */
  static const struct { int64_t T, heads, hd, rot, axes; bool mrope; } cases[] = {
      {7, 2, 32, 16, 3, true}, {5, 4, 64, 64, 2, false}, {33, 3, 16, 16, 2, false}, {3, 1, 128, 64, 3, true},
  };
  op_stat *st = stat_for("rope (axes)");
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t T = cases[ci].T, H = cases[ci].heads, hd = cases[ci].hd, rot = cases[ci].rot, half = rot / 2, C = H * hd;
    int64_t na = cases[ci].axes;
    double *inv = malloc(sizeof(double) * (size_t)half);
    int8_t *axis = malloc((size_t)half);
    for (int64_t i = 0; i < half; i++) {
      if (cases[ci].mrope) {
        inv[i] = 1.0 / pow(10000.0, 2.0 * (double)i / (double)rot);
        axis[i] = (int8_t)(i % 3 == 1 && i < 3 * (half / 3) ? 1 : i % 3 == 2 && i < 3 * (half / 3) ? 2 : 0);
      } else {
        int64_t q = half / 2;
        inv[i] = 1.0 / pow(10000.0, 2.0 * (double)(i % q) / (double)half);
        axis[i] = (int8_t)(i < q ? 0 : 1);
      }
    }
    rope_table tab = {.rot_dim = rot, .inv_freq = inv, .attn_scale = 1.0, .n_axes = na, .axis = axis};
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(T * na));
    for (int64_t i = 0; i < T * na; i++) pos[i] = (int32_t)irand(600);
    float *x = rand_floats(T * C, 1.0f);
    double *ref = malloc(sizeof(double) * (size_t)(T * C));
    for (int64_t i = 0; i < T * C; i++) ref[i] = x[i];
    for (int64_t t = 0; t < T; t++)
      for (int64_t i = 0; i < half; i++) {
        double a = (double)pos[t * na + axis[i]] * inv[i], c = cos(a), sn = sin(a);
        for (int64_t h = 0; h < H; h++) {
          double *v = ref + t * C + h * hd, p = v[i], q = v[i + half];
          v[i] = p * c - q * sn;
          v[i + half] = q * c + p * sn;
        }
      }
    char shape[128];
    snprintf(shape, sizeof shape, "T %lld, %lld heads x %lld, rot_dim %lld, %lld axes", (long long)T, (long long)H,
             (long long)hd, (long long)rot, (long long)na);
    st->cases++;
    float *got = malloc(sizeof(float) * (size_t)(T * C));
    for (int di = 0; di < n_devs; di++) {
      bk_tensor tx = tfrom_f32(devs[di], x, T, C), tp = tnew(devs[di], BK_DT_I32, T, na);
      tset(&tp, pos);
      bk_rope(&tx, H, hd, &tp, &tab);
      tget(&tx, got, "rope (axes)");
      compare(st, K_ELEM, di, shape, got, ref, T * C);
      bk_tensor_free(&tx), bk_tensor_free(&tp);
    }
    free(got), free(ref), free(x), free(pos), free(inv), free(axis);
  }
}

static void test_act_clamp(void) {
  static const char *names[] = {"silu", "gelu_tanh", "gelu", "relu"};
  op_stat *sa = stat_for("act"), *sc = stat_for("clamp");
  static const int64_t shapes[][2] = {{1, 5}, {3, 257}, {9, 1000}};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    int64_t R = shapes[si][0], C = shapes[si][1], n = R * C;
    float *x = rand_floats(n, n >= 64 ? 6.0f : 2.0f), *got = malloc(sizeof(float) * (size_t)n);
    double *ref = malloc(sizeof(double) * (size_t)n);
    for (int a = 0; a < 4; a++) {
      for (int64_t i = 0; i < n; i++) ref[i] = act_ref((bk_act)a, x[i]);
      char shape[64];
      snprintf(shape, sizeof shape, "%s [%lld, %lld]", names[a], (long long)R, (long long)C);
      sa->cases++;
      for (int di = 0; di < n_devs; di++) {
        bk_tensor tx = tfrom_f32(devs[di], x, R, C);
        bk_activate(&tx, (bk_act)a);
        tget(&tx, got, "act");
        compare(sa, K_ELEM, di, shape, got, ref, n);
        bk_tensor_free(&tx);
      }
    }
    float lo = -1.5f + (float)si, hi = 2.25f;
    for (int64_t i = 0; i < n; i++) ref[i] = x[i] < lo ? lo : x[i] > hi ? hi : x[i];
    char shape[64];
    snprintf(shape, sizeof shape, "[%lld, %lld] to [%g, %g]", (long long)R, (long long)C, (double)lo, (double)hi);
    sc->cases++;
    for (int di = 0; di < n_devs; di++) {
      bk_tensor tx = tfrom_f32(devs[di], x, R, C);
      bk_clamp(&tx, lo, hi);
      tget(&tx, got, "clamp");
      compare(sc, K_ELEM, di, shape, got, ref, n);
      bk_tensor_free(&tx);
    }
    free(x), free(got), free(ref);
  }
}

static void test_embed_bag(void) {
  /* table rows, width, output rows, taps */
  static const int64_t cases[][4] = {{16, 32, 48, 4}, {2304, 72, 300, 4}, {5, 7, 3, 1}, {64, 130, 33, 16}};
  op_stat *st = stat_for("embed_bag");
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t P = cases[ci][0], D = cases[ci][1], N = cases[ci][2], K = cases[ci][3];
    float *table = rand_floats(P * D, 1.0f), *w = rand_floats(N * K, 1.0f), *got = malloc(sizeof(float) * (size_t)(N * D));
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(N * K));
    for (int64_t i = 0; i < N * K; i++) ids[i] = (int32_t)(i % 17 == 5 ? -1 : irand(P)); /* -1: no contribution */
    double *ref = calloc((size_t)(N * D), sizeof(double));
    for (int64_t r = 0; r < N; r++)
      for (int64_t j = 0; j < K; j++)
        if (ids[r * K + j] >= 0)
          for (int64_t c = 0; c < D; c++) ref[r * D + c] += (double)w[r * K + j] * table[(int64_t)ids[r * K + j] * D + c];
    char shape[64];
    snprintf(shape, sizeof shape, "table [%lld, %lld], %lld rows x %lld taps", (long long)P, (long long)D, (long long)N,
             (long long)K);
    st->cases++;
    for (int di = 0; di < n_devs; di++) {
      bk_tensor tt = tfrom_f32(devs[di], table, P, D), tw = tfrom_f32(devs[di], w, N, K), ti = tnew(devs[di], BK_DT_I32, N, K);
      bk_tensor ty = tnew(devs[di], BK_DT_F32, N, D);
      tset(&ti, ids);
      poison(&ty);
      bk_embed_bag(&ty, &tt, &ti, &tw);
      tget(&ty, got, "embed_bag");
      compare(st, K_ELEM, di, shape, got, ref, N * D);
      bk_tensor_free(&tt), bk_tensor_free(&tw), bk_tensor_free(&ti), bk_tensor_free(&ty);
    }
    free(table), free(w), free(got), free(ids), free(ref);
  }
}

static void test_attention_rel(void) {
  /* T, valid, heads, head_dim, left, right, softcap, qscale */
  static const struct { int64_t T, valid, H, hd, left, right; float cap; bool qs; } cases[] = {
      {30, 30, 2, 16, 12, 0, 50.0f, true}, {40, 33, 8, 128, 12, 0, 50.0f, true}, {7, 7, 1, 8, 2, 2, 0.0f, false},
      {100, 100, 4, 64, 12, 0, 50.0f, true}, {5, 0, 2, 16, 12, 0, 50.0f, true},
  };
  op_stat *st = stat_for("attention_rel");
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t T = cases[ci].T, H = cases[ci].H, hd = cases[ci].hd, W = H * hd, span = cases[ci].left + cases[ci].right + 1;
    rel_attn_params p = {.n_heads = H, .head_dim = hd, .left = cases[ci].left, .right = cases[ci].right, .softcap = cases[ci].cap};
    float *q = rand_floats(T * W, 1.0f), *k = rand_floats(T * W, 1.0f), *v = rand_floats(T * W, 1.0f);
    float *rel = rand_floats(span * W, 1.0f), *qs = rand_floats(hd, 1.0f), *got = malloc(sizeof(float) * (size_t)(T * W));
    for (int64_t i = 0; i < T * W; i++) q[i] *= 2.0f; /* scores of a few units, past the cap's linear range */
    /* the reference in double */
    double *ref = malloc(sizeof(double) * (size_t)(T * W)), *sc = malloc(sizeof(double) * (size_t)span);
    for (int64_t i = 0; i < T; i++)
      for (int64_t h = 0; h < H; h++) {
        int64_t lo = i - p.left < 0 ? 0 : i - p.left, hi = i + p.right + 1 < cases[ci].valid ? i + p.right + 1 : cases[ci].valid;
        double m = -INFINITY, sum = 0;
        for (int64_t j = lo; j < hi; j++) {
          double a = 0;
          for (int64_t d = 0; d < hd; d++)
            a += (double)q[i * W + h * hd + d] * (cases[ci].qs ? qs[d] : 1.0) *
                 ((double)k[j * W + h * hd + d] + rel[(p.right + i - j) * W + h * hd + d]);
          if (p.softcap > 0) a = p.softcap * tanh(a / p.softcap);
          sc[j - lo] = a;
          if (a > m) m = a;
        }
        for (int64_t j = lo; j < hi; j++) sum += sc[j - lo] = exp(sc[j - lo] - m);
        for (int64_t d = 0; d < hd; d++) {
          double a = 0;
          for (int64_t j = lo; j < hi; j++) a += sc[j - lo] * v[j * W + h * hd + d];
          ref[i * W + h * hd + d] = hi > lo ? a / sum : 0.0;
        }
      }
    char shape[96];
    snprintf(shape, sizeof shape, "T %lld (%lld keys), %lld x %lld, window [-%lld, +%lld], cap %g", (long long)T,
             (long long)cases[ci].valid, (long long)H, (long long)hd, (long long)p.left, (long long)p.right, (double)p.softcap);
    st->cases++;
    for (int di = 0; di < n_devs; di++) {
      bk_backend *be = devs[di];
      bk_tensor tq = tfrom_f32(be, q, T, W), tk = tfrom_f32(be, k, T, W), tv = tfrom_f32(be, v, T, W);
      bk_tensor tr = tfrom_f32(be, rel, span, W), ts = tfrom_f32(be, qs, 1, hd), to = tnew(be, BK_DT_F32, T, W);
      poison(&to);
      bk_attention_rel(&to, &tq, &tk, &tv, &tr, cases[ci].qs ? &ts : NULL, cases[ci].valid, &p);
      tget(&to, got, "attention_rel");
      compare(st, K_ATTN, di, shape, got, ref, T * W);
      bk_tensor_free(&tq), bk_tensor_free(&tk), bk_tensor_free(&tv), bk_tensor_free(&tr), bk_tensor_free(&ts), bk_tensor_free(&to);
    }
    free(q), free(k), free(v), free(rel), free(qs), free(got), free(ref), free(sc);
  }
}

static void open_backends(void) {
  bk_open_opts opts = {.threads = 0, .f32_activations = true};
  herr err = {0};
  if (bk_backend_open("cpu", &opts, &devs[0], &err)) die("cpu backend", &err);
  n_devs = 1;
  const char *dev = test_device();
  if (!dev) dev = "cuda";
  snprintf(dev_label, sizeof dev_label, "%s", dev);
  const char *req = getenv("HEARTH_TEST_REQUIRE_CUDA");
  bool require = req && !strcmp(req, "1");
  bk_backend *be = NULL;
  herr_clear(&err);
  if (!strcmp(dev, "cpu")) {
    herr_set(&err, HEARTH_EINVAL, "HEARTH_TEST_DEVICE=cpu names no second device");
  } else if (bk_backend_open(dev, &opts, &be, &err) == 0 && bk_backend_is_cpu(be)) {
    bk_backend_close(be);
    be = NULL;
    herr_set(&err, HEARTH_EUNSUPPORTED, "device '%s' opened the CPU", dev);
  }
  if (be) {
    char desc[256];
    bk_backend_describe(be, desc, sizeof desc);
    fprintf(stderr, "test_backend_ops: %s: %s\n", dev, desc);
    snprintf(dev_label, sizeof dev_label, "%s", bk_backend_name(be));
    devs[n_devs++] = be;
  } else {
    fprintf(stderr, "test_backend_ops: %s: skipped (%s)\n", dev, err.msg);
    CHECK_MSG(!require, "HEARTH_TEST_REQUIRE_CUDA=1 but %s could not be opened", dev);
  }
  char desc[256];
  bk_backend_describe(devs[0], desc, sizeof desc);
  fprintf(stderr, "test_backend_ops: cpu: %s\n", desc);
}

static void print_summary(void) {
  char hdr[48];
  snprintf(hdr, sizeof hdr, "%s max nmse", dev_label);
  fprintf(stderr, "\n%-22s | %5s | %-13s | %s\n", "op", "cases", "cpu max nmse", hdr);
  fprintf(stderr, "-----------------------+-------+---------------+--------------\n");
  for (int i = 0; i < n_stats; i++) {
    char dv[32];
    if (n_devs > 1)
      snprintf(dv, sizeof dv, "%.3g", stats[i].max[1]);
    else
      snprintf(dv, sizeof dv, "skipped");
    fprintf(stderr, "%-22s | %5d | %-13.3g | %s\n", stats[i].name, stats[i].cases, stats[i].max[0], dv);
  }
  fprintf(stderr, "limits: elementwise/copies %.0e; matmul cpu %.0e, %s %.0e; attention cpu %.0e, %s %.0e (fast precision %.0e); sample: logprob within 1e-4 (the column), ids the reference's\n\n", LIM_ELEM,
          LIM_CPU_MATMUL, dev_label, LIM_DEV_MATMUL, LIM_CPU_ATTN, dev_label, LIM_DEV_ATTN, LIM_DEV_ATTN_FAST);
}

int main(void) {
  test_device_or_skip();
  open_backends();
  RUN(test_embed);
  RUN(test_matmul);
  RUN(test_matmul_fp8_fast);
  RUN(test_matmul_half_fast);
  RUN(test_matmul_q8act);
  RUN(test_rmsnorm);
  RUN(test_add_rmsnorm);
  RUN(test_rope);
  RUN(test_act_mul);
  RUN(test_add);
  RUN(test_softcap);
  RUN(test_get_rows);
  RUN(test_scale_get_cols);
  RUN(test_lora);
  RUN(test_moe_route);
  RUN(test_moe);
  RUN(test_moe_lora);
  RUN(test_kv_write);
  RUN(test_attention);
  RUN(test_attention_fast);
  RUN(test_set_cols_rows);
  RUN(test_layernorm);
  RUN(test_moe_route_group);
  RUN(test_index_sparse_attention);
  RUN(test_sample);
  RUN(test_conv1d);
  RUN(test_delta_rule);
  RUN(test_sigmoid_mul);
  RUN(test_rope_axes);
  RUN(test_act_clamp);
  RUN(test_embed_bag);
  RUN(test_attention_rel);
  print_summary();
  for (int i = n_devs - 1; i >= 0; i--) bk_backend_close(devs[i]);
  TEST_MAIN_END();
}
