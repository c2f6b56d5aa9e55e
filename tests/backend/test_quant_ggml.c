/* test_quant_ggml.c — the GGUF block types against llama.cpp itself: blocks
 * written by ggml's own quantizer (tests/fixtures/quants, made by
 * tools/gen_quant_fixtures.sh from a fixed 4 x 512 matrix) must dequantize
 * to ggml's own floats bit for bit, and bk_matmul of those blocks must equal
 * the f32 product of ggml's floats within the matmul bound of test_kernels
 * (1e-5 relative to sum |x w|) at every CPU kernel level. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/formats.h"
#include "backend/weights.h"
#include "base/pool.h"
#include "test.h"

#define ROWS 4
#define COLS 512
#define FIX HEARTH_SOURCE_DIR "/tests/fixtures/quants/"

static const struct {
  const char *name;
  bk_type type;
} types[] = {{"q2_K", BK_Q2_K}, {"q3_K", BK_Q3_K}, {"q5_0", BK_Q5_0}, {"q5_1", BK_Q5_1}, {"iq4_nl", BK_IQ4_NL}, {"iq4_xs", BK_IQ4_XS}};

/* The whole file, which must be exactly n bytes; NULL (and a failed check) otherwise. */
static void *read_exact(const char *name, size_t n) {
  char path[512];
  snprintf(path, sizeof path, FIX "%s", name);
  FILE *f = fopen(path, "rb");
  CHECK_MSG(f != NULL, "cannot open %s (tools/gen_quant_fixtures.sh writes it)", path);
  if (!f) return NULL;
  void *p = malloc(n + 1);
  size_t got = fread(p, 1, n + 1, f);
  fclose(f);
  CHECK_MSG(got == n, "%s: %zu bytes, expected %zu", path, got, n);
  if (got != n) {
    free(p);
    return NULL;
  }
  return p;
}

static void test_dequant_bit_exact(void) {
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
    size_t rb = bk_row_bytes(types[t].type, COLS, 0);
    CHECK(rb > 0);
    char name[64];
    snprintf(name, sizeof name, "%s.blocks", types[t].name);
    void *blocks = read_exact(name, rb * ROWS);
    snprintf(name, sizeof name, "%s.f32", types[t].name);
    float *want = read_exact(name, sizeof(float) * ROWS * COLS);
    if (!blocks || !want) {
      free(blocks);
      free(want);
      continue;
    }
    bk_weight w = {.type = types[t].type, .rows = ROWS, .cols = COLS, .data = blocks};
    float got[COLS];
    int bad = 0, first = -1;
    for (int r = 0; r < ROWS; r++) {
      herr err = {0};
      CHECK_MSG(bk_dequant_row(&w, r, got, &err) == 0, "%s: %s", types[t].name, err.msg);
      for (int k = 0; k < COLS; k++)
        if (memcmp(&got[k], &want[r * COLS + k], 4)) {
          if (first < 0) first = r * COLS + k;
          bad++;
        }
    }
    CHECK_MSG(bad == 0, "%s: %d of %d values differ from ggml's (first at %d)", types[t].name, bad, ROWS * COLS, first);
    /* a partial range (the kernels' chunks) decodes as the whole row does */
    int64_t blk = bk_type_block(types[t].type);
    float part[COLS];
    bk_dequant_range(&w, 2, blk, COLS - blk, part);
    CHECK_MSG(!memcmp(part, want + 2 * COLS + blk, sizeof(float) * (size_t)(COLS - blk)), "%s: range from %lld",
              types[t].name, (long long)blk);
    free(blocks);
    free(want);
  }
}

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static float frand(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((rng_state >> 40) * (2.0 / 16777216.0) - 1.0);
}

static void check_matmul(hpool *pool, const char *tname, const bk_weight *w, const float *deq, int64_t n) {
  float *x = malloc(sizeof(float) * n * COLS), *y = malloc(sizeof(float) * n * ROWS);
  for (int64_t i = 0; i < n * COLS; i++) x[i] = frand();
  for (int64_t i = 0; i < n * ROWS; i++) y[i] = NAN;
  herr err = {0};
  CHECK_MSG(bk_matmul(pool, y, x, n, w, NULL, &err) == 0, "%s: %s", tname, err.msg);
  int bad = 0;
  for (int64_t i = 0; i < n; i++)
    for (int r = 0; r < ROWS; r++) {
      double ref = 0, mag = 0;
      for (int k = 0; k < COLS; k++) {
        double p = (double)x[i * COLS + k] * deq[r * COLS + k];
        ref += p;
        mag += fabs(p);
      }
      double e = fabs(y[i * ROWS + r] - ref) / (mag + 1e-30);
      if (!(e <= 1e-5) && bad++ < 3)
        fprintf(stderr, "  %s n %lld at [%lld, %d]: %.9g vs %.9g\n", tname, (long long)n, (long long)i, r, y[i * ROWS + r], ref);
    }
  CHECK_MSG(bad == 0, "%s at level %s, n %lld: %d outputs beyond 1e-5 relative", tname,
            bk_cpu_level_name(bk_cpu_level_now()), (long long)n, bad);
  free(x);
  free(y);
}

static void test_matmul(void) {
  hpool *pool = hpool_create(2);
  CHECK(pool != NULL);
  bk_cpu_level best = bk_cpu_best();
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
    size_t rb = bk_row_bytes(types[t].type, COLS, 0);
    char name[64];
    snprintf(name, sizeof name, "%s.blocks", types[t].name);
    void *blocks = read_exact(name, rb * ROWS);
    snprintf(name, sizeof name, "%s.f32", types[t].name);
    float *deq = read_exact(name, sizeof(float) * ROWS * COLS);
    if (blocks && deq) {
      bk_weight w = {.type = types[t].type, .rows = ROWS, .cols = COLS, .data = blocks};
      herr err = {0};
      CHECK_MSG(bk_weight_pack(&w, &err) == 0, "%s: %s", types[t].name, err.msg);
      CHECK_MSG(w.packed == NULL, "%s: no integer kernel, so not repacked", types[t].name);
      for (int l = BK_CPU_SCALAR; l <= (int)best; l++) {
        bk_cpu_set_level((bk_cpu_level)l);
        static const int64_t ns[] = {1, 3, 9};
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) check_matmul(l & 1 ? NULL : pool, types[t].name, &w, deq, ns[ni]);
      }
      bk_cpu_set_level(best);
      bk_weight_unpack(&w);
    }
    free(blocks);
    free(deq);
  }
  hpool_destroy(pool);
}

/* hearth's own quantizer writes blocks ggml's layout reads: quantizing ggml's
 * dequantized floats again and decoding gives values near them. */
static void test_requantize(void) {
  float *x = read_exact("input.f32", sizeof(float) * ROWS * COLS);
  if (!x) return;
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
    size_t rb = bk_row_bytes(types[t].type, COLS, 0);
    void *q = malloc(rb * ROWS);
    herr err = {0};
    CHECK_MSG(bk_quantize(types[t].type, x, ROWS, COLS, q, &err) == 0, "%s: %s", types[t].name, err.msg);
    bk_weight w = {.type = types[t].type, .rows = ROWS, .cols = COLS, .data = q};
    float y[COLS];
    for (int r = 0; r < ROWS; r++) {
      CHECK_EQ_INT(bk_dequant_row(&w, r, y, &err), 0);
      double se = 0, sx = 0;
      for (int k = 0; k < COLS; k++) se += (y[k] - x[r * COLS + k]) * (double)(y[k] - x[r * COLS + k]), sx += (double)x[r * COLS + k] * x[r * COLS + k];
      /* relative RMS error: 2-bit ~0.3 at worst, the others well under */
      double rel = sqrt(se / (sx + 1e-30)), bound = types[t].type == BK_Q2_K ? 0.5 : types[t].type == BK_Q3_K ? 0.3 : 0.12;
      CHECK_MSG(rel < bound, "%s row %d: relative RMS error %.3f (bound %.2f)", types[t].name, r, rel, bound);
    }
    free(q);
  }
  free(x);
}

int main(void) {
  RUN(test_dequant_bit_exact);
  RUN(test_matmul);
  RUN(test_requantize);
  TEST_MAIN_END();
}
