/* test_pack.c — the 8-bit integer path for Q8_0 / Q4_0 / Q4_K / Q5_K / Q6_K weights (pack.h):
 *  - activation quantization: |q| <= 127, s = Σ q, |x - q·d| <= d/2; the
 *    AVX-512 version gives the reference's bytes;
 *  - the packed reference against a double-precision dot product of the
 *    dequantized weights and the dequantized activations;
 *  - the error against f32 activations stays within the quantization bound
 *    Σ_k |w_k| · d_block(k) / 2;
 *  - the AVX-512 VNNI kernel (when this CPU has it) and bk_matmul through the
 *    pool give exactly the reference's bits, every output written;
 *  - bk_weight_pack only packs what it should. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/pack.h"
#include "backend/formats.h"
#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/weights.h"
#include "base/pool.h"
#include "test.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t urand(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 32);
}
static float frand(void) { return (float)(urand() * (2.0 / 4294967296.0) - 1.0); }

typedef struct qw {
  bk_weight w;
  void *data;  /* owned */
  float *deq;  /* owned: rows x cols */
} qw;

static void make(qw *t, bk_type type, int64_t rows, int64_t cols) {
  float *src = malloc(sizeof(float) * rows * cols);
  for (int64_t i = 0; i < rows * cols; i++) src[i] = frand() * (1.0f + (float)(i % 5) * 0.4f);
  t->data = malloc(bk_row_bytes(type, cols, 0) * rows);
  CHECK_EQ_INT(bk_quantize(type, src, rows, cols, t->data, NULL), 0);
  t->w = (bk_weight){.type = type, .rows = rows, .cols = cols, .data = t->data};
  t->deq = malloc(sizeof(float) * rows * cols);
  for (int64_t r = 0; r < rows; r++) bk_dequant_row(&t->w, r, t->deq + r * cols, NULL);
  free(src);
}

static void *pack_copy(const bk_weight *w) {
  size_t size = bk_pack_group_bytes(w) * (size_t)((w->rows + 15) / 16);
  void *p = malloc(size);
  bk_pack_write(w, p);
  return p;
}

static bk_qrows qrows_new(int64_t n, int64_t cols) {
  bk_qrows qa = {.n = n, .cols = cols, .nb = cols / 32};
  qa.q = malloc((size_t)(n * cols));
  qa.d = malloc(sizeof(float) * n * qa.nb);
  qa.s = malloc(sizeof(int32_t) * n * qa.nb);
  qa.s16 = malloc(sizeof(int32_t) * n * qa.nb * 2);
  qa.nds = malloc(sizeof(float) * n * qa.nb);
  return qa;
}
static void qrows_free(bk_qrows *qa) { free(qa->q), free(qa->d), free(qa->s), free(qa->s16), free(qa->nds); }

static void test_quantize_activations(void) {
  int64_t n = 5, cols = 96;
  float *x = malloc(sizeof(float) * n * cols);
  for (int64_t i = 0; i < n * cols; i++) x[i] = frand() * (float)(1 + i % 13);
  for (int k = 32; k < 64; k++) x[cols + k] = 0; /* an all-zero block */
  bk_qrows qa = qrows_new(n, cols);
  bk_qrows_fill(&qa, x, 0, n);
  int bad = 0;
  for (int64_t i = 0; i < n; i++)
    for (int64_t b = 0; b < qa.nb; b++) {
      float d = qa.d[i * qa.nb + b], amax = 0;
      int32_t s = 0;
      for (int k = 0; k < 32; k++) {
        float v = x[i * cols + 32 * b + k];
        int q = qa.q[i * cols + 32 * b + k];
        amax = fmaxf(amax, fabsf(v));
        s += q;
        if (q < -127 || q > 127 || fabsf(v - q * d) > d * 0.5f * (1 + 1e-5f) + 1e-30f) bad++;
      }
      int32_t lo = 0;
      for (int k = 0; k < 16; k++) lo += qa.q[i * cols + 32 * b + k];
      if (s != qa.s[i * qa.nb + b] || d != amax / 127.0f || lo != qa.s16[2 * (i * qa.nb + b)] ||
          s - lo != qa.s16[2 * (i * qa.nb + b) + 1])
        bad++;
    }
  CHECK_MSG(bad == 0, "%d activation quantization errors", bad);
  CHECK(qa.d[qa.nb + 1] == 0 && qa.s[qa.nb + 1] == 0);
  x[3] = NAN; /* NaN in, NaN scale out (so the outputs that read it are NaN) */
  bk_qrows_fill(&qa, x, 0, 1);
  CHECK(isnan(qa.d[0]));
  qrows_free(&qa);
  free(x);
}

/* The AVX-512 activation quantization gives the reference's bytes: random
 * blocks, ties (x · 127/amax exactly halfway between integers, which both
 * round to even), an all-zero block, NaN and ±inf. */
static void test_quantize_activations_vnni(void) {
#if defined(__x86_64__)
  if (!bk_cpu_has_int8_dot()) return;
  int64_t n = 7, cols = 256;
  float *x = malloc(sizeof(float) * n * cols);
  for (int64_t i = 0; i < n * cols; i++) x[i] = frand() * (float)(1 + i % 13) * (i % 97 == 0 ? 1e-20f : 1.0f);
  for (int k = 0; k < 32; k++) x[cols + k] = k == 5 ? -127.0f : (float)(k - 16) + 0.5f; /* ties: id = 1 */
  for (int k = 32; k < 64; k++) x[cols + k] = 0;                                           /* all zero */
  x[2 * cols + 3] = NAN;
  x[3 * cols + 40] = INFINITY;
  x[3 * cols + 100] = -INFINITY;
  x[4 * cols + 7] = NAN, x[4 * cols + 8] = INFINITY;
  bk_qrows ref = qrows_new(n, cols), got = qrows_new(n, cols);
  bk_qrows_fill(&ref, x, 0, n);
  memset(got.q, 0x55, (size_t)(n * cols));
  bk_qrows_fill_vnni(&got, x, 0, 1);
  bk_qrows_fill_vnni(&got, x, 1, n);
  size_t nb = (size_t)(n * ref.nb);
  CHECK(memcmp(ref.q, got.q, (size_t)(n * cols)) == 0);
  CHECK(memcmp(ref.d, got.d, sizeof(float) * nb) == 0);
  CHECK(memcmp(ref.s, got.s, sizeof(int32_t) * nb) == 0);
  CHECK(memcmp(ref.s16, got.s16, sizeof(int32_t) * nb * 2) == 0);
  CHECK(memcmp(ref.nds, got.nds, sizeof(float) * nb) == 0);
  CHECK(isnan(got.d[2 * ref.nb]) && isinf(got.d[3 * ref.nb + 1])); /* the blocks went through the reference */
  qrows_free(&ref), qrows_free(&got);
  free(x);
#endif
}

static int ncases = 0;

static void check_case(hpool *pool, bk_type type, int64_t rows, int64_t cols, int64_t n, int with_bias) {
  qw t;
  make(&t, type, rows, cols);
  t.w.packed = pack_copy(&t.w);
  float *x = malloc(sizeof(float) * n * cols), *bias = NULL;
  for (int64_t i = 0; i < n * cols; i++) x[i] = frand() * (1.0f + (float)(i % 3));
  if (with_bias) {
    bias = malloc(sizeof(float) * rows);
    for (int64_t r = 0; r < rows; r++) bias[r] = frand() * 2;
  }
  bk_qrows qa = qrows_new(n, cols);
  bk_qrows_fill(&qa, x, 0, n);
  int64_t groups = (rows + 15) / 16;
  float *ref = malloc(sizeof(float) * n * rows), *got = malloc(sizeof(float) * n * rows);
  for (int64_t i = 0; i < n * rows; i++) ref[i] = got[i] = NAN;
  bk_packed_rows_ref(&t.w, &qa, ref, 0, groups, bias);

  int bad_ref = 0, bad_bound = 0;
  for (int64_t i = 0; i < n; i++)
    for (int64_t r = 0; r < rows; r++) {
      double exact = bias ? bias[r] : 0, deq = exact, mag = fabs(exact), bound = 0;
      for (int64_t k = 0; k < cols; k++) {
        double w = t.deq[r * cols + k], xd = (double)qa.q[i * cols + k] * qa.d[i * qa.nb + k / 32];
        deq += w * xd;
        exact += w * x[i * cols + k];
        mag += fabs(w * xd);
        bound += fabs(w) * qa.d[i * qa.nb + k / 32] * 0.5;
      }
      double y = ref[i * rows + r];
      if (!(fabs(y - deq) <= 1e-5 * mag + 1e-6)) {
        if (bad_ref++ < 3) fprintf(stderr, "  ref %s [%lld,%lld]: %.9g vs %.9g\n", bk_type_name(type), (long long)i, (long long)r, y, deq);
      }
      if (!(fabs(y - exact) <= bound * 1.001 + 1e-5 * mag + 1e-6)) bad_bound++;
    }
  CHECK_MSG(bad_ref == 0, "%s %lldx%lld n=%lld: %d packed reference outputs off the dequantized dot product", bk_type_name(type),
            (long long)rows, (long long)cols, (long long)n, bad_ref);
  CHECK_MSG(bad_bound == 0, "%s: %d outputs beyond the activation-quantization bound", bk_type_name(type), bad_bound);

#if defined(__x86_64__)
  if (bk_cpu_has_int8_dot()) {
    bk_packed_rows_vnni(&t.w, &qa, got, 0, groups, bias);
    CHECK_MSG(memcmp(got, ref, sizeof(float) * n * rows) == 0, "%s %lldx%lld n=%lld: VNNI kernel differs from the reference",
              bk_type_name(type), (long long)rows, (long long)cols, (long long)n);
  }
#endif
  /* through bk_matmul (pool, quantization split over threads for n >= 16) */
  for (int64_t i = 0; i < n * rows; i++) got[i] = NAN;
  herr err = {0};
  CHECK_EQ_INT(bk_matmul(pool, got, x, n, &t.w, bias, &err), 0);
  CHECK_MSG(memcmp(got, ref, sizeof(float) * n * rows) == 0, "%s %lldx%lld n=%lld: bk_matmul (packed) differs from the reference",
            bk_type_name(type), (long long)rows, (long long)cols, (long long)n);
  ncases++;
  qrows_free(&qa);
  free(t.w.packed);
  free(t.data), free(t.deq), free(x), free(bias), free(ref), free(got);
}

static void test_packed_matmul(void) {
  hpool *pool = hpool_create(3);
  static const bk_type types[] = {BK_Q8_0, BK_Q4_0, BK_Q4_K, BK_Q5_K, BK_Q6_K};
  static const int64_t shapes[][3] = {
      {1, 32, 1}, {13, 64, 1}, {16, 96, 2}, {40, 256, 3}, {67, 2080, 1}, {33, 160, 4},
      {17, 96, 5}, {48, 64, 8}, {31, 128, 9}, {20, 64, 37}, {45, 96, 70}, {16, 32, 130},
  };
  for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      int64_t cols = shapes[s][1];
      if (bk_type_block(types[ti]) == 256) cols = 256 * (1 + cols % 3); /* K-quants: whole super-blocks */
      check_case(s & 1 ? NULL : pool, types[ti], shapes[s][0], cols, shapes[s][2], (int)(s % 3 == 0));
    }
  hpool_destroy(pool);
  fprintf(stderr, "%d packed cases\n", ncases);
}

static void test_pack_selection(void) {
  qw a, f;
  make(&a, BK_Q4_0, 20, 64);
  make(&f, BK_Q8_0, 20, 64);
  bk_weight h = {.type = BK_F16, .rows = 2, .cols = 32, .data = a.data};
  herr err = {0};
  CHECK_EQ_INT(bk_weight_pack(&h, &err), 0);
  CHECK(h.packed == NULL); /* no integer layout for f16 */
  CHECK_EQ_INT(bk_weight_pack(&a.w, &err), 0);
  CHECK((a.w.packed != NULL) == bk_cpu_has_int8_dot());
  bk_weight_unpack(&a.w);
  CHECK(a.w.packed == NULL);
  /* a CPU backend opened for f32 activations leaves weights in their stored format */
  bk_backend *be = NULL;
  CHECK_EQ_INT(bk_cpu_open(&(bk_open_opts){.threads = 1, .f32_activations = true}, &be, &err), 0);
  if (be) {
    bk_weight copy = f.w;
    CHECK_EQ_INT(bk_weight_load(be, &copy, BK_USE_MATMUL | BK_USE_PRIVATE, &err), 0);
    CHECK(copy.packed == NULL && copy.data == f.w.data);
    bk_weight_release(be, &copy);
    bk_backend_close(be);
  }
  /* a packed weight still multiplies at a lower level (through the reference) */
  if (bk_cpu_has_int8_dot()) {
    CHECK_EQ_INT(bk_weight_pack(&f.w, &err), 0);
    float x[64], y1[20], y2[20];
    for (int k = 0; k < 64; k++) x[k] = frand();
    CHECK_EQ_INT(bk_matmul(NULL, y1, x, 1, &f.w, NULL, &err), 0);
    bk_cpu_set_level(BK_CPU_SCALAR);
    CHECK_EQ_INT(bk_matmul(NULL, y2, x, 1, &f.w, NULL, &err), 0);
    bk_cpu_set_level(bk_cpu_best());
    CHECK(memcmp(y1, y2, sizeof y1) == 0);
    /* without its stored bytes a packed weight still validates and multiplies the same */
    bk_weight_drop_source(&f.w);
    CHECK(f.w.data == NULL && f.w.packed != NULL);
    CHECK_EQ_INT(bk_weight_validate(&f.w, &err), 0);
    CHECK_EQ_INT(bk_matmul(NULL, y2, x, 1, &f.w, NULL, &err), 0);
    CHECK(memcmp(y1, y2, sizeof y1) == 0);
    bk_weight_unpack(&f.w);
    CHECK_EQ_INT(bk_weight_validate(&f.w, &err), HEARTH_EINVAL); /* neither stored nor packed bytes: refused */
  }
  free(a.data), free(a.deq), free(f.data), free(f.deq);
}

int main(void) {
  RUN(test_quantize_activations);
  RUN(test_quantize_activations_vnni);
  RUN(test_packed_matmul);
  RUN(test_pack_selection);
  TEST_MAIN_END();
}
