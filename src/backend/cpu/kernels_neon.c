/* kernels_neon.c — the arm64 NEON matmul kernel level: the shared GEMV/GEMM
 * loops of kernels_body.h on 4-float vectors, weights dequantized by the
 * reference code in formats.c (backend/). Compiled only on aarch64 (NEON is baseline
 * there). Knows nothing of models or of how rows are spread over threads. */
#include "backend/cpu/kernels.h"
#include "backend/formats.h"

#if defined(__aarch64__)
#include <arm_neon.h>

typedef float32x4_t V;
#define VL 4
#define KNAME(x) x##_neon
#define v_zero() vdupq_n_f32(0.0f)
#define v_load(p) vld1q_f32(p)
#define v_store(p, v) vst1q_f32((p), (v))
#define v_set1(f) vdupq_n_f32(f)
#define v_fma(a, b, c) vfmaq_f32((c), (a), (b))
#define v_add(a, b) vaddq_f32((a), (b))
#define v_hsum(v) vaddvq_f32(v)
#define GEMV_U 4
#define MR 6
#define NRV 4

static const float *neon_dequant(const bk_weight *w, int64_t row, int64_t k0, int64_t len, float *buf) {
  if (w->type == BK_F32) return (const float *)w->data + row * w->cols + k0;
  bk_dequant_range(w, row, k0, len, buf);
  return buf;
}
#define DEQ neon_dequant

#include "backend/cpu/kernels_body.h"

#else
typedef int bk_kernels_neon_unused; /* an empty translation unit is not C */
#endif
