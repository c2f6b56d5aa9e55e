/* kernels_body.h — the matmul loops shared by every CPU level, written once
 * over a small vector vocabulary that the including file defines (internal;
 * included by kernels_scalar.c, kernels_avx2.c, kernels_avx512.c and
 * kernels_neon.c only, after their target pragmas).
 *
 * The including file defines:
 *   KNAME(x)             x with the level's suffix
 *   V, VL                the vector type and its float lanes
 *   v_zero() v_load(p) v_store(p, v) v_set1(f) v_fma(a, b, c) = a*b+c
 *   v_add(a, b) v_hsum(v)
 *   GEMV_U               vectors per unrolled GEMV step (independent sums)
 *   MR, NRV              GEMM micro-tile: MR input rows x NRV vectors of output rows
 *   DEQ(w, row, k0, len, buf)  -> const float *: elements [k0, k0+len) of a
 *                        weight row as floats (into buf, or straight from f32 data)
 *   GEMV_FUSED (optional)  (w, row, k0, len, xk, xs, N, acc, tail): multiplies
 *                        the same elements into acc[N][GEMV_U] / tail[N] without
 *                        a buffer (dequantized in registers)
 *
 * GEMV (n <= 4): each weight row is streamed once, CH columns at a time
 * dequantized into a buffer that stays in L1, and multiplied into up to four
 * activation rows with GEMV_U independent sums each.
 * GEMM (n > 4): for a tile of NR = NRV*VL output rows and KB columns the
 * weights are dequantized once into a transposed panel [KB][NR]; an MR x NR
 * register tile of outputs accumulates broadcast(x) * panel row, and is
 * added into y after each column block.
 */

#define NR (NRV * VL)
#define KB 256
#define CH 512

#define KINLINE static inline __attribute__((always_inline))
/* the small loops over rows / vectors must unroll so the sums live in registers */
#define UNROLL _Pragma("GCC unroll 8")

KINLINE void KNAME(gemv_row)(const bk_weight *w, const float *x, const int N, float *y, int64_t r, const float *bias,
                             float *buf) {
  const int64_t cols = w->cols, rows = w->rows;
  V acc[4][GEMV_U];
  float tail[4] = {0, 0, 0, 0};
  UNROLL
  for (int i = 0; i < N; i++)
    UNROLL
    for (int u = 0; u < GEMV_U; u++) acc[i][u] = v_zero();
  for (int64_t k0 = 0; k0 < cols; k0 += CH) {
    int64_t len = cols - k0 < CH ? cols - k0 : CH;
    const float *xk = x + k0;
#ifdef GEMV_FUSED
    GEMV_FUSED(w, r, k0, len, xk, cols, N, acc, tail);
    (void)buf;
#else
    const float *p = DEQ(w, r, k0, len, buf);
    int64_t k = 0;
    for (; k + GEMV_U * VL <= len; k += GEMV_U * VL)
      UNROLL
      for (int u = 0; u < GEMV_U; u++) {
        V wv = v_load(p + k + u * VL);
        UNROLL
        for (int i = 0; i < N; i++) acc[i][u] = v_fma(wv, v_load(xk + i * cols + k + u * VL), acc[i][u]);
      }
    for (; k + VL <= len; k += VL) {
      V wv = v_load(p + k);
      UNROLL
      for (int i = 0; i < N; i++) acc[i][0] = v_fma(wv, v_load(xk + i * cols + k), acc[i][0]);
    }
    for (; k < len; k++)
      UNROLL
      for (int i = 0; i < N; i++) tail[i] += p[k] * xk[i * cols + k];
#endif
  }
  float b = bias ? bias[r] : 0.0f;
  UNROLL
  for (int i = 0; i < N; i++) {
    V s = acc[i][0];
    UNROLL
    for (int u = 1; u < GEMV_U; u++) s = v_add(s, acc[i][u]);
    y[i * rows + r] = v_hsum(s) + tail[i] + b;
  }
}

static void KNAME(gemv_rows)(const bk_weight *w, const float *x, int64_t n, float *y, int64_t r0, int64_t r1,
                             const float *bias) {
  float buf[CH] __attribute__((aligned(64)));
  for (int64_t r = r0; r < r1; r++) {
    switch (n) {
      case 1: KNAME(gemv_row)(w, x, 1, y, r, bias, buf); break;
      case 2: KNAME(gemv_row)(w, x, 2, y, r, bias, buf); break;
      case 3: KNAME(gemv_row)(w, x, 3, y, r, bias, buf); break;
      default: KNAME(gemv_row)(w, x, 4, y, r, bias, buf); break;
    }
  }
}

/* y[i, 0..nr) (+)= x[i, 0..len) · panel, for M input rows. */
KINLINE void KNAME(micro)(const int M, const float *panel, int64_t len, const float *x, int64_t xs, float *y,
                          int64_t ys, int nr, int first, const float *btile) {
  V acc[MR][NRV];
  float tmp[NR] __attribute__((aligned(64)));
  UNROLL
  for (int i = 0; i < M; i++) {
    const float *src = btile;
    if (!first) {
      if (nr == NR) {
        src = y + i * ys;
      } else {
        for (int j = 0; j < NR; j++) tmp[j] = j < nr ? y[i * ys + j] : 0.0f;
        src = tmp;
      }
    }
    UNROLL
    for (int v = 0; v < NRV; v++) acc[i][v] = v_load(src + v * VL);
  }
  for (int64_t k = 0; k < len; k++) {
    V b[NRV];
    UNROLL
    for (int v = 0; v < NRV; v++) b[v] = v_load(panel + k * NR + v * VL);
    UNROLL
    for (int i = 0; i < M; i++) {
      V xi = v_set1(x[i * xs + k]);
      UNROLL
      for (int v = 0; v < NRV; v++) acc[i][v] = v_fma(xi, b[v], acc[i][v]);
    }
  }
  UNROLL
  for (int i = 0; i < M; i++) {
    if (nr == NR) {
      UNROLL
      for (int v = 0; v < NRV; v++) v_store(y + i * ys + v * VL, acc[i][v]);
    } else {
      UNROLL
      for (int v = 0; v < NRV; v++) v_store(tmp + v * VL, acc[i][v]);
      for (int j = 0; j < nr; j++) y[i * ys + j] = tmp[j];
    }
  }
}

static void KNAME(gemm_rows)(const bk_weight *w, const float *x, int64_t n, float *y, int64_t r0, int64_t r1,
                             const float *bias) {
  static __thread float panel[KB * NR] __attribute__((aligned(64)));
  float tmp[KB] __attribute__((aligned(64)));
  float btile[NR] __attribute__((aligned(64)));
  const int64_t cols = w->cols, rows = w->rows;
  for (int64_t rt = r0; rt < r1; rt += NR) {
    int nr = r1 - rt < NR ? (int)(r1 - rt) : NR;
    for (int j = 0; j < NR; j++) btile[j] = (j < nr && bias) ? bias[rt + j] : 0.0f;
    for (int64_t k0 = 0; k0 < cols; k0 += KB) {
      int64_t len = cols - k0 < KB ? cols - k0 : KB;
      for (int j = 0; j < NR; j++) {
        if (j < nr) {
          const float *p = DEQ(w, rt + j, k0, len, tmp);
          for (int64_t k = 0; k < len; k++) panel[k * NR + j] = p[k];
        } else {
          for (int64_t k = 0; k < len; k++) panel[k * NR + j] = 0.0f;
        }
      }
      int first = k0 == 0;
      for (int64_t i0 = 0; i0 < n; i0 += MR) {
        int M = n - i0 < MR ? (int)(n - i0) : MR;
        const float *xi = x + i0 * cols + k0;
        float *yi = y + i0 * rows + rt;
        switch (M) {
          case 1: KNAME(micro)(1, panel, len, xi, cols, yi, rows, nr, first, btile); break;
          case 2: KNAME(micro)(2, panel, len, xi, cols, yi, rows, nr, first, btile); break;
          case 3: KNAME(micro)(3, panel, len, xi, cols, yi, rows, nr, first, btile); break;
#if MR >= 4
          case 4: KNAME(micro)(4, panel, len, xi, cols, yi, rows, nr, first, btile); break;
#endif
#if MR >= 5
          case 5: KNAME(micro)(5, panel, len, xi, cols, yi, rows, nr, first, btile); break;
#endif
#if MR >= 6
          case 6: KNAME(micro)(6, panel, len, xi, cols, yi, rows, nr, first, btile); break;
#endif
          default: break;
        }
      }
    }
  }
}

void KNAME(bk_rows)(const bk_weight *w, const float *x, int64_t n, float *y, int64_t r0, int64_t r1,
                    const float *bias) {
  if (n <= 4)
    KNAME(gemv_rows)(w, x, n, y, r0, r1, bias);
  else
    KNAME(gemm_rows)(w, x, n, y, r0, r1, bias);
}

#undef NR
#undef KB
#undef CH
#undef KINLINE
#undef UNROLL
