/* kernels.h — the per-CPU-level matmul kernels behind bk_matmul (internal to
 * backend/cpu). Each computes y[i, r] for every input row i < n and every
 * output row r in [r0, r1): a GEMV that streams each weight row once when
 * n <= 4, a tiled GEMM over dequantized weight panels otherwise. */
#ifndef HEARTH_BACKEND_CPU_KERNELS_H
#define HEARTH_BACKEND_CPU_KERNELS_H

#include "backend/weights.h"

typedef void (*bk_rows_fn)(const bk_weight *w, const float *x, int64_t n, float *y, int64_t r0, int64_t r1,
                           const float *bias);

void bk_rows_scalar(const bk_weight *w, const float *x, int64_t n, float *y, int64_t r0, int64_t r1, const float *bias);
#if defined(__x86_64__)
void bk_rows_avx2(const bk_weight *w, const float *x, int64_t n, float *y, int64_t r0, int64_t r1, const float *bias);
void bk_rows_avx512(const bk_weight *w, const float *x, int64_t n, float *y, int64_t r0, int64_t r1, const float *bias);
#endif
#if defined(__aarch64__)
void bk_rows_neon(const bk_weight *w, const float *x, int64_t n, float *y, int64_t r0, int64_t r1, const float *bias);
#endif

/* Output rows per task are a multiple of this (the widest GEMM panel). */
#define BK_ROW_TILE 32

#endif
