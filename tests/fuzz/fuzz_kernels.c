/* fuzz_kernels.c — weight descriptors and weight bytes from the fuzzer:
 * bk_weight_validate must refuse bad descriptors with an error (never crash),
 * and for every valid one bk_matmul at each dispatch level must agree with
 * the reference (bk_dequant_row + double sums) on arbitrary block bytes,
 * including NaN / infinite scales. Types with a packed layout (pack.h) are
 * also packed: the VNNI kernel (where the CPU has it) must give the plain
 * reference's bits, and both must stay within the 8-bit activation bound of
 * the exact product. Input layout: byte 0 type, 1 rows,
 * 2 cols, 3 n, 4 bits / group_size / scale type, then weight bytes (repeated
 * to fill the matrix, scales and biases). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/pack.h"
#include "backend/formats.h"
#include "backend/cpu/cpu.h"
#include "backend/weights.h"

static void fill(uint8_t *dst, size_t n, const uint8_t *src, size_t m) {
  for (size_t i = 0; i < n; i++) dst[i] = m ? src[i % m] : (uint8_t)i;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 5) return 0;
  bk_weight w = {0};
  w.type = (bk_type)(data[0] % (BK_TYPE_COUNT + 1)); /* one past the end: an unknown type */
  w.rows = 1 + data[1] % 40;
  int64_t blk = (unsigned)w.type < BK_TYPE_COUNT && bk_type_block(w.type) == 256 ? 256 : 32;
  w.cols = (data[2] & 0x80) ? (int64_t)(data[2] & 0x7F) : blk * (1 + data[2] % 4); /* sometimes not whole blocks */
  int64_t n = 1 + data[3] % 9;
  w.bits = (data[4] & 1) ? 8 : 4;
  static const int groups[4] = {32, 64, 128, 48};
  w.group_size = groups[(data[4] >> 1) & 3];
  static const bk_type stypes[4] = {BK_F32, BK_F16, BK_BF16, BK_Q8_0};
  w.scale_type = stypes[(data[4] >> 3) & 3];
  const uint8_t *payload = data + 5;
  size_t plen = size - 5;

  size_t rb = (unsigned)w.type < BK_TYPE_COUNT ? bk_row_bytes(w.type, w.cols, w.bits) : 0;
  size_t wbytes = rb ? rb * (size_t)w.rows : 64;
  size_t sbytes = (size_t)w.rows * (size_t)(w.cols / 32 + 1) * 4;
  uint8_t *wdata = malloc(wbytes), *scales = malloc(sbytes), *biases = malloc(sbytes);
  fill(wdata, wbytes, payload, plen);
  fill(scales, sbytes, payload, plen);
  fill(biases, sbytes, payload + plen / 2, plen - plen / 2);
  w.data = wdata;
  w.scales = scales;
  w.biases = biases;

  herr err = {0};
  if (bk_weight_validate(&w, &err) != 0) {
    if (!err.msg[0]) abort(); /* a refusal always says why */
    free(wdata);
    free(scales);
    free(biases);
    return 0;
  }
  float *x = malloc(sizeof(float) * n * w.cols), *y = malloc(sizeof(float) * n * w.rows);
  float *deq = malloc(sizeof(float) * w.rows * w.cols);
  for (int64_t i = 0; i < n * w.cols; i++) x[i] = (float)((i * 37) % 17) / 8.0f - 1.0f;
  for (int64_t r = 0; r < w.rows; r++)
    if (bk_dequant_row(&w, r, deq + r * w.cols, NULL)) abort();
  bk_cpu_level best = bk_cpu_best();
  for (int l = BK_CPU_SCALAR; l <= (int)best; l++) {
    bk_cpu_set_level((bk_cpu_level)l);
    for (int64_t i = 0; i < n * w.rows; i++) y[i] = NAN;
    if (bk_matmul(NULL, y, x, n, &w, NULL, NULL)) abort();
    for (int64_t i = 0; i < n; i++)
      for (int64_t r = 0; r < w.rows; r++) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < w.cols; k++) {
          double p = (double)x[i * w.cols + k] * deq[r * w.cols + k];
          ref += p;
          mag += fabs(p);
        }
        float got = y[i * w.rows + r];
        if (!isfinite(mag) || mag > 1e30) continue; /* inf / NaN weights: order of summation decides */
        if (!(fabs(got - ref) <= 1e-4 * mag + 1e-30)) abort();
      }
  }
  bk_cpu_set_level(best);
  if (bk_pack_type_ok(w.type)) {
    int64_t groups = (w.rows + BK_PACK_ROWS - 1) / BK_PACK_ROWS, nb = w.cols / 32;
    void *packed = malloc(bk_pack_group_bytes(&w) * (size_t)groups);
    bk_pack_write(&w, packed);
    bk_weight pw = w;
    pw.packed = packed;
    bk_qrows qa = {.n = n, .cols = w.cols, .nb = nb, .q = malloc((size_t)(n * w.cols)), .d = malloc(sizeof(float) * n * nb),
                   .s = malloc(sizeof(int32_t) * n * nb), .s16 = malloc(sizeof(int32_t) * n * nb * 2),
                   .nds = malloc(sizeof(float) * n * nb)};
    bk_qrows_fill(&qa, x, 0, n);
    float *y2 = malloc(sizeof(float) * n * w.rows);
    bk_packed_rows_ref(&pw, &qa, y, 0, groups, NULL);
#if defined(__x86_64__)
    if (bk_cpu_has_int8_dot()) {
      bk_packed_rows_vnni(&pw, &qa, y2, 0, groups, NULL);
      for (int64_t i = 0; i < n * w.rows; i++)
        if (!(isnan(y[i]) && isnan(y2[i])) && memcmp(&y[i], &y2[i], 4)) abort();
    }
#endif
    for (int64_t i = 0; i < n; i++)
      for (int64_t r = 0; r < w.rows; r++) {
        double ref = 0, mag = 0, bound = 0;
        for (int64_t k = 0; k < w.cols; k++) {
          double wk = deq[r * w.cols + k];
          ref += (double)x[i * w.cols + k] * wk;
          mag += fabs((double)x[i * w.cols + k] * wk);
          bound += fabs(wk) * qa.d[i * nb + k / 32] * 0.5;
        }
        if (!isfinite(mag) || mag > 1e30 || !isfinite(bound)) continue;
        if (!(fabs(y[i * w.rows + r] - ref) <= bound * 1.001 + 1e-4 * mag + 1e-30)) abort();
      }
    free(packed), free(qa.q), free(qa.d), free(qa.s), free(qa.s16), free(qa.nds), free(y2);
  }
  free(x);
  free(y);
  free(deq);
  free(wdata);
  free(scales);
  free(biases);
  return 0;
}
