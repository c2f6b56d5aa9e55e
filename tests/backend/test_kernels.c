/* test_kernels.c — bk_matmul at every dispatch level this CPU has, for every
 * weight format, against the reference: the weights dequantized by
 * bk_dequant_row and a double-precision dot product. Shapes are odd (rows
 * not a multiple of any tile, columns crossing the kernels' chunk sizes),
 * n covers the GEMV (1..4) and GEMM paths, the output is poisoned with NaN
 * before each call so every element must be written, and NaN never passes.
 *
 * Error bound: the kernels multiply f32 activations by the exactly
 * dequantized weights in f32 (no activation quantization), so for every
 * format |y - ref| <= 1e-5 * (sum_k |x_k w_k| + |bias|). */
#include <stdint.h>
#include <stdlib.h>

#include "backend/formats.h"
#include "backend/cpu/cpu.h"
#include "backend/weights.h"
#include "base/pool.h"
#include "test.h"
#include "weight_formats.h"

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static uint32_t urand(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 32);
}
static float frand(void) { return (float)(urand() * (2.0 / 4294967296.0) - 1.0); }


/* A weight of the format with its storage (all owned by the struct). */
typedef struct test_weight {
  bk_weight w;
  void *data, *scales, *biases; /* owned */
  float *deq;                   /* owned: rows x cols, the reference weights */
} test_weight;

static int make_weight(test_weight *t, const fmt *f, int64_t rows, int64_t cols) {
  memset(t, 0, sizeof *t);
  float *src = malloc(sizeof(float) * rows * cols);
  for (int64_t i = 0; i < rows * cols; i++) src[i] = frand() * (1.0f + (float)(i % 7) * 0.3f) + 0.05f;
  t->w = (bk_weight){.type = f->type, .rows = rows, .cols = cols};
  int rc;
  if (f->type == BK_MLX_AFFINE) {
    t->data = malloc((size_t)(rows * cols * f->bits / 8));
    t->scales = malloc(sizeof(float) * rows * cols / f->group_size);
    t->biases = malloc(sizeof(float) * rows * cols / f->group_size);
    rc = bk_quantize_mlx(src, rows, cols, f->bits, f->group_size, f->scale_type, t->data, t->scales, t->biases, NULL);
    t->w.bits = f->bits;
    t->w.group_size = f->group_size;
    t->w.scale_type = f->scale_type;
    t->w.scales = t->scales;
    t->w.biases = t->biases;
  } else if (f->type == BK_FP8) {
    t->data = malloc((size_t)(rows * cols));
    t->scales = malloc(sizeof(float) * rows);
    rc = bk_quantize_fp8(src, rows, cols, t->data, t->scales, NULL);
    t->w.scale_type = BK_F32;
    t->w.scales = t->scales;
  } else {
    t->data = malloc(bk_row_bytes(f->type, cols, 0) * rows);
    rc = bk_quantize(f->type, src, rows, cols, t->data, NULL);
  }
  t->w.data = t->data;
  t->deq = malloc(sizeof(float) * rows * cols);
  for (int64_t r = 0; r < rows && !rc; r++) rc = bk_dequant_row(&t->w, r, t->deq + r * cols, NULL);
  free(src);
  return rc;
}

static void free_weight(test_weight *t) {
  free(t->data);
  free(t->scales);
  free(t->biases);
  free(t->deq);
}

static int case_count = 0;

/* Runs one shape; returns 0 when every output is within the bound. */
static int check_case(hpool *pool, const fmt *f, int64_t rows, int64_t cols, int64_t n, int with_bias) {
  test_weight t;
  CHECK_EQ_INT(make_weight(&t, f, rows, cols), 0);
  float *x = malloc(sizeof(float) * n * cols), *y = malloc(sizeof(float) * n * rows), *bias = NULL;
  for (int64_t i = 0; i < n * cols; i++) x[i] = frand();
  if (with_bias) {
    bias = malloc(sizeof(float) * rows);
    for (int64_t r = 0; r < rows; r++) bias[r] = frand() * 3;
  }
  for (int64_t i = 0; i < n * rows; i++) y[i] = NAN; /* poison: every element must be written */
  herr err = {0};
  int rc = bk_matmul(pool, y, x, n, &t.w, bias, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  int bad = 0;
  double worst = 0;
  for (int64_t i = 0; i < n && !rc; i++)
    for (int64_t r = 0; r < rows; r++) {
      double ref = bias ? bias[r] : 0, mag = bias ? fabs(bias[r]) : 0;
      for (int64_t k = 0; k < cols; k++) {
        double p = (double)x[i * cols + k] * t.deq[r * cols + k];
        ref += p;
        mag += fabs(p);
      }
      double e = fabs(y[i * rows + r] - ref) / (mag + 1e-30);
      if (!(e <= 1e-5)) {
        if (bad++ < 3)
          fprintf(stderr, "  %s%s rows %lld cols %lld n %lld at [%lld, %lld]: %.9g vs %.9g\n", bk_type_name(f->type),
                  f->bits == 4 ? "(4-bit)" : f->bits == 8 ? "(8-bit)" : "", (long long)rows, (long long)cols,
                  (long long)n, (long long)i, (long long)r, y[i * rows + r], ref);
      }
      if (e > worst || isnan(e)) worst = isnan(e) ? INFINITY : e;
    }
  CHECK_MSG(bad == 0, "%s at level %s: %d outputs beyond 1e-5 relative (worst %.3g)", bk_type_name(f->type),
            bk_cpu_level_name(bk_cpu_level_now()), bad, worst);
  case_count++;
  free(x);
  free(y);
  free(bias);
  free_weight(&t);
  return bad;
}

static void run_all_formats(hpool *pool) {
  static const int64_t ns[] = {1, 2, 3, 4, 7, 33, 64};
  for (int fi = 0; fi < N_FORMATS; fi++) {
    const fmt *f = &formats[fi];
    int64_t blk = f->type == BK_MLX_AFFINE ? f->group_size : bk_type_block(f->type);
    if (blk < 32) blk = 1;
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
      int64_t n = ns[ni];
      int64_t rows = 1 + urand() % (n > 7 ? 45 : 97);
      int64_t cols;
      if (blk == 1)
        cols = 1 + urand() % (n > 7 ? 300 : 700); /* any width, crossing the 256 / 512 chunks */
      else
        cols = blk * (1 + urand() % (blk >= 256 ? 3 : (n > 7 ? 6 : 20)));
      check_case(pool, f, rows, cols, n, (int)(ni & 1));
    }
    /* one fixed shape that spans whole GEMM panels and GEMV chunks plus ragged ends */
    int64_t cols = blk >= 256 ? 768 : blk == 1 ? 777 : 768;
    check_case(pool, f, 70, cols, 9, 1);
    check_case(pool, f, 70, cols, 1, 0);
    /* long rows: many GEMV chunks and GEMM column blocks, ending in a partial one */
    int64_t long_cols = blk == 1 ? 4100 : 4352;
    check_case(pool, f, 5, long_cols, 1, 1);
    check_case(pool, f, 3, long_cols, 3, 0);
  }
}

static void test_levels(void) {
  hpool *pool = hpool_create(2);
  CHECK(pool != NULL);
  bk_cpu_level best = bk_cpu_best();
  for (int l = BK_CPU_SCALAR; l <= (int)best; l++) {
    CHECK_EQ_INT(bk_cpu_set_level((bk_cpu_level)l), l);
    fprintf(stderr, "  level %s\n", bk_cpu_level_name((bk_cpu_level)l));
    run_all_formats(l & 1 ? NULL : pool);
  }
  bk_cpu_set_level(best);
  hpool_destroy(pool);
}

static void test_invalid_weight(void) {
  float x[64] = {0}, y[4] = {7, 7, 7, 7};
  uint8_t data[256] = {0};
  bk_weight w = {.type = BK_Q4_0, .rows = 2, .cols = 40, .data = data};
  herr err = {0};
  CHECK_EQ_INT(bk_matmul(NULL, y, x, 1, &w, NULL, &err), HEARTH_EINVAL);
  CHECK(strstr(err.msg, "q4_0") != NULL);
  CHECK(y[0] == 7 && y[1] == 7); /* untouched */
  herr_clear(&err);
  w = (bk_weight){.type = BK_F32, .rows = 2, .cols = 4, .data = NULL};
  CHECK_EQ_INT(bk_matmul(NULL, y, x, 1, &w, NULL, &err), HEARTH_EINVAL);
}

static void test_nan_propagates(void) {
  /* a NaN in the input reaches the outputs that read it, at every level */
  float w32[4 * 8], x[8], y[4];
  for (int i = 0; i < 32; i++) w32[i] = 1;
  for (int i = 0; i < 8; i++) x[i] = 1;
  x[5] = NAN;
  bk_weight w = {.type = BK_F32, .rows = 4, .cols = 8, .data = w32};
  for (int l = BK_CPU_SCALAR; l <= (int)bk_cpu_best(); l++) {
    bk_cpu_set_level((bk_cpu_level)l);
    CHECK_EQ_INT(bk_matmul(NULL, y, x, 1, &w, NULL, NULL), 0);
    for (int r = 0; r < 4; r++) CHECK(isnan(y[r]));
  }
  bk_cpu_set_level(bk_cpu_best());
}

int main(void) {
  CHECK_EQ_INT(bk_cpu_set_level(BK_CPU_SCALAR), BK_CPU_SCALAR);
  CHECK_EQ_INT(bk_cpu_level_now(), BK_CPU_SCALAR);
  bk_cpu_level parsed;
  CHECK(bk_cpu_level_parse("avx2", &parsed) && parsed == BK_CPU_AVX2);
  CHECK(!bk_cpu_level_parse("sse", &parsed));
  fprintf(stderr, "best level on this CPU: %s\n", bk_cpu_level_name(bk_cpu_best()));
  RUN(test_levels);
  RUN(test_invalid_weight);
  RUN(test_nan_propagates);
  fprintf(stderr, "%d matmul cases\n", case_count);
  TEST_MAIN_END();
}
