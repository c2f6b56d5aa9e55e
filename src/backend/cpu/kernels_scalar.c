/* kernels_scalar.c — the portable matmul kernel level: the shared GEMV/GEMM
 * loops of kernels_body.h over plain floats, weights dequantized by the
 * reference code in formats.c (backend/). Runs on any CPU; HEARTH_CPU=scalar forces it.
 * Knows nothing of models or of how rows are spread over threads. */
#include "backend/cpu/kernels.h"
#include "backend/formats.h"

typedef float V;
#define VL 1
#define KNAME(x) x##_scalar
#define v_zero() 0.0f
#define v_load(p) (*(p))
#define v_store(p, v) (*(p) = (v))
#define v_set1(f) (f)
#define v_fma(a, b, c) ((a) * (b) + (c))
#define v_add(a, b) ((a) + (b))
#define v_hsum(v) (v)
#define GEMV_U 4
#define MR 4
#define NRV 4

static const float *scalar_dequant(const bk_weight *w, int64_t row, int64_t k0, int64_t len, float *buf) {
  if (w->type == BK_F32) return (const float *)w->data + row * w->cols + k0;
  bk_dequant_range(w, row, k0, len, buf);
  return buf;
}
#define DEQ scalar_dequant

#include "backend/cpu/kernels_body.h"
