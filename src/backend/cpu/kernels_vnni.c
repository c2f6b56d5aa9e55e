/* kernels_vnni.c — the AVX-512 VNNI matmul over packed weights (pack.h):
 * 8-bit activations times 16 interleaved weight rows, one vpdpbusd per 4
 * columns of 16 rows. A tile is up to 8 activation rows × one 16-row group;
 * the unpacked weights of a block stay in registers across the tile's rows.
 * Activation rows are taken 64 at a time so that they stay in L2 while every
 * group of the task streams past them. Same arithmetic, in the same order, as
 * bk_packed_rows_ref. Compiled for those instructions by a pragma here;
 * chosen at run time only when the CPU has them. */
#include <math.h>
#include <string.h>

#include "backend/cpu/pack.h"

#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#endif

#include <immintrin.h>

#define KINLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
#define TILE_M 8
#define CHUNK_M 64

/* Software prefetch of the weight stream, PF_DIST bytes ahead of the block
 * being read, for tiles of up to PF_MAX_M activation rows (decode). The
 * weights are read once, front to back, and this VM's hardware prefetchers
 * alone keep too few lines in flight: a 128256 x 2048 Q4_K GEMV from memory
 * streams 24 GB/s on one thread without it and 45 GB/s with it. The address
 * may run past the end of the weights: a prefetch never faults. */
#define PF_DIST 4736
#define PF_MAX_M 4
KINLINE void prefetch_ahead(const uint8_t *p, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + PF_DIST + o, _MM_HINT_T0);
}

KINLINE __m512i bcast4(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

/* *s0 += Σ_k w[k] · xb[4k..4k+3] over k < 4 and *s1 += the same over
 * 4 <= k < 8 with xb[16..31]: one 32-column block, two independent chains. */
KINLINE void dot32(const __m512i *w, const int8_t *xb, __m512i *s0, __m512i *s1) {
  __m512i a = *s0, b = *s1;
  a = _mm512_dpbusd_epi32(a, w[0], bcast4(xb));
  b = _mm512_dpbusd_epi32(b, w[4], bcast4(xb + 16));
  a = _mm512_dpbusd_epi32(a, w[1], bcast4(xb + 4));
  b = _mm512_dpbusd_epi32(b, w[5], bcast4(xb + 20));
  a = _mm512_dpbusd_epi32(a, w[2], bcast4(xb + 8));
  b = _mm512_dpbusd_epi32(b, w[6], bcast4(xb + 24));
  a = _mm512_dpbusd_epi32(a, w[3], bcast4(xb + 12));
  b = _mm512_dpbusd_epi32(b, w[7], bcast4(xb + 28));
  *s0 = a, *s1 = b;
}

KINLINE void store_tile(float *y, int64_t ys, int M, __m512 *acc, int nr, const float *bias, int64_t row0) {
  __mmask16 mask = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
  __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + row0) : _mm512_setzero_ps();
  for (int i = 0; i < M; i++) {
    __m512 v = bias ? _mm512_add_ps(acc[i], b) : acc[i];
    _mm512_mask_storeu_ps(y + i * ys + row0, mask, v);
  }
}

/* Q4_0x16: M activation rows (from i0) × the group at grp. */
KINLINE void tile_q4_0(const uint8_t *grp, const bk_qrows *qa, int64_t i0, const int M, float *y, int64_t ys, int64_t row0,
                       int nr, const float *bias) {
  const int64_t nb = qa->nb;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512 acc[TILE_M];
  UNROLL
  for (int i = 0; i < M; i++) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *blk = grp + (size_t)b * 288;
    if (M <= PF_MAX_M) prefetch_ahead(blk, 288);
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
    __m512i w[8]; /* low nibbles (columns 0-15), then high (16-31) */
    UNROLL
    for (int c = 0; c < 4; c++) {
      __m512i l = _mm512_loadu_si512((const void *)(blk + 32 + 64 * c));
      w[c] = _mm512_and_si512(l, m4);
      w[4 + c] = _mm512_and_si512(_mm512_srli_epi16(l, 4), m4);
    }
    UNROLL
    for (int i = 0; i < M; i++) {
      const int8_t *xb = qa->q + (i0 + i) * qa->cols + 32 * b;
      __m512i s0 = _mm512_setzero_si512(), s1 = s0;
      dot32(w, xb, &s0, &s1);
      int64_t xi = (i0 + i) * nb + b;
      __m512i s = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), _mm512_set1_epi32(8 * qa->s[xi]));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(qa->d[xi])), acc[i]);
    }
  }
  store_tile(y, ys, M, acc, nr, bias, row0);
}

/* Q8_0x16: M activation rows (from i0) × the group at grp. */
KINLINE void tile_q8_0(const uint8_t *grp, const bk_qrows *qa, int64_t i0, const int M, float *y, int64_t ys, int64_t row0,
                       int nr, const float *bias) {
  const int64_t nb = qa->nb;
  __m512 acc[TILE_M];
  UNROLL
  for (int i = 0; i < M; i++) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *blk = grp + (size_t)b * 544;
    if (M <= PF_MAX_M) prefetch_ahead(blk, 544);
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
    __m512i u[8];
    UNROLL
    for (int c = 0; c < 8; c++) u[c] = _mm512_loadu_si512((const void *)(blk + 32 + 64 * c));
    UNROLL
    for (int i = 0; i < M; i++) {
      const int8_t *xb = qa->q + (i0 + i) * qa->cols + 32 * b;
      __m512i s0 = _mm512_setzero_si512(), s1 = s0;
      dot32(u, xb, &s0, &s1);
      int64_t xi = (i0 + i) * nb + b;
      __m512i s = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), _mm512_set1_epi32(128 * qa->s[xi]));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(qa->d[xi])), acc[i]);
    }
  }
  store_tile(y, ys, M, acc, nr, bias, row0);
}

/* Q4_K / Q5_K (five): M activation rows × the group at grp, super-block by
 * super-block; the two sub-blocks of a pair share one load of their bytes. */
KINLINE void tile_k(const uint8_t *grp, const int five, const bk_qrows *qa, int64_t i0, const int M, float *y, int64_t ys,
                    int64_t row0, int nr, const float *bias) {
  const int64_t nsb = qa->cols / 256, nb = qa->nb;
  const size_t sbytes = five ? BK_PACK_K5_BYTES : BK_PACK_K4_BYTES;
  const __m512i m4 = _mm512_set1_epi8(0x0F), b5 = _mm512_set1_epi8(0x10);
  __m512 acc[TILE_M];
  UNROLL
  for (int i = 0; i < M; i++) acc[i] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; sb++) {
    const uint8_t *blk = grp + (size_t)sb * sbytes;
    const uint8_t *sc = blk + 64, *mn = sc + 8 * BK_PACK_ROWS, *u = mn + 8 * BK_PACK_ROWS, *hb = u + 2048;
    if (M <= PF_MAX_M) prefetch_ahead(blk, sbytes);
    __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
    __m512 dmv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)));
    for (int p = 0; p < 4; p++) {
      __m512i l[8];
      UNROLL
      for (int c = 0; c < 8; c++) l[c] = _mm512_loadu_si512((const void *)(u + (size_t)(p * 8 + c) * 64));
      __m512i h0 = _mm512_setzero_si512(), h1 = h0;
      if (five) {
        h0 = _mm512_loadu_si512((const void *)(hb + (size_t)(p * 2) * 64));
        h1 = _mm512_loadu_si512((const void *)(hb + (size_t)(p * 2 + 1) * 64));
      }
      UNROLL
      for (int half = 0; half < 2; half++) {
        const int j = 2 * p + half;
        __m512i q[8];
        UNROLL
        for (int c = 0; c < 8; c++) {
          q[c] = half ? _mm512_and_si512(_mm512_srli_epi16(l[c], 4), m4) : _mm512_and_si512(l[c], m4);
          if (five) {
            __mmask64 k = _mm512_test_epi8_mask(c < 4 ? h0 : h1, _mm512_set1_epi8((char)(1 << (2 * (c % 4) + half))));
            q[c] = _mm512_or_si512(q[c], _mm512_maskz_mov_epi8(k, b5));
          }
        }
        __m512 a = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sc + j * BK_PACK_ROWS)))));
        __m512 b = _mm512_mul_ps(dmv, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(mn + j * BK_PACK_ROWS)))));
        UNROLL
        for (int i = 0; i < M; i++) {
          const int8_t *xb = qa->q + (i0 + i) * qa->cols + 256 * sb + 32 * j;
          __m512i s0 = _mm512_setzero_si512(), s1 = s0;
          dot32(q, xb, &s0, &s1);
          int64_t xi = (i0 + i) * nb + 8 * sb + j;
          acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_mul_ps(a, _mm512_set1_ps(qa->d[xi])), acc[i]);
          acc[i] = _mm512_fmadd_ps(b, _mm512_set1_ps(qa->nds[xi]), acc[i]);
        }
      }
    }
  }
  store_tile(y, ys, M, acc, nr, bias, row0);
}

/* Q6_K: M activation rows × the group at grp. */
KINLINE void tile_q6_k(const uint8_t *grp, const bk_qrows *qa, int64_t i0, const int M, float *y, int64_t ys, int64_t row0,
                       int nr, const float *bias) {
  const int64_t nsb = qa->cols / 256, nb = qa->nb;
  const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
  __m512 acc[TILE_M];
  UNROLL
  for (int i = 0; i < M; i++) acc[i] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; sb++) {
    const uint8_t *blk = grp + (size_t)sb * BK_PACK_K6_BYTES;
    if (M <= PF_MAX_M) prefetch_ahead(blk, BK_PACK_K6_BYTES);
    const int8_t *sc = (const int8_t *)(blk + 32);
    const uint8_t *u = blk + 32 + 256, *hb = u + 2048;
    __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
    for (int j = 0; j < 8; j++) {
      __m512i w[8]; /* columns 0-15 of the block, then 16-31 */
      __m512i h0 = _mm512_loadu_si512((const void *)(hb + (size_t)(j * 2) * 64));
      __m512i h1 = _mm512_loadu_si512((const void *)(hb + (size_t)(j * 2 + 1) * 64));
      /* top bits of chunk c moved to bits 4-5 */
      __m512i t0[4] = {_mm512_slli_epi16(h0, 4), _mm512_slli_epi16(h0, 2), h0, _mm512_srli_epi16(h0, 2)};
      __m512i t1[4] = {_mm512_slli_epi16(h1, 4), _mm512_slli_epi16(h1, 2), h1, _mm512_srli_epi16(h1, 2)};
      UNROLL
      for (int c = 0; c < 4; c++) {
        __m512i l = _mm512_loadu_si512((const void *)(u + (size_t)(j * 4 + c) * 64));
        w[c] = _mm512_ternarylogic_epi32(_mm512_and_si512(l, m4), t0[c], m30, 0xF8); /* a | (b & c) */
        w[4 + c] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4), t1[c], m30, 0xF8);
      }
      __m512i sl = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sc + (2 * j) * BK_PACK_ROWS)));
      __m512i sh = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sc + (2 * j + 1) * BK_PACK_ROWS)));
      UNROLL
      for (int i = 0; i < M; i++) {
        const int8_t *xb = qa->q + (i0 + i) * qa->cols + 256 * sb + 32 * j;
        int64_t xi = (i0 + i) * nb + 8 * sb + j;
        __m512i s0 = _mm512_set1_epi32(-32 * qa->s16[2 * xi]), s1 = _mm512_set1_epi32(-32 * qa->s16[2 * xi + 1]);
        dot32(w, xb, &s0, &s1);
        __m512i t = _mm512_add_epi32(_mm512_mullo_epi32(s0, sl), _mm512_mullo_epi32(s1, sh));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(dv, _mm512_set1_ps(qa->d[xi])), acc[i]);
      }
    }
  }
  store_tile(y, ys, M, acc, nr, bias, row0);
}

/* Tiles of 1, 2, 3, 4 or 8 rows (5..7 run as 4 and the rest), which keeps
 * the number of unrolled copies, and the build time, down. */
#define DISPATCH_M(fn, M, ...)                                            \
  switch (M) {                                                            \
    case 1: fn(__VA_ARGS__, i0, 1, y, ys, row0, nr, bias); break;         \
    case 2: fn(__VA_ARGS__, i0, 2, y, ys, row0, nr, bias); break;         \
    case 3: fn(__VA_ARGS__, i0, 3, y, ys, row0, nr, bias); break;         \
    case 4: fn(__VA_ARGS__, i0, 4, y, ys, row0, nr, bias); break;         \
    case 8: fn(__VA_ARGS__, i0, 8, y, ys, row0, nr, bias); break;         \
    default:                                                              \
      fn(__VA_ARGS__, i0, 4, y, ys, row0, nr, bias);                      \
      if (M == 5) fn(__VA_ARGS__, i0 + 4, 1, y + 4 * ys, ys, row0, nr, bias);      \
      if (M == 6) fn(__VA_ARGS__, i0 + 4, 2, y + 4 * ys, ys, row0, nr, bias);      \
      if (M == 7) fn(__VA_ARGS__, i0 + 4, 3, y + 4 * ys, ys, row0, nr, bias);      \
      break;                                                              \
  }

void bk_packed_rows_vnni(const bk_weight *w, const bk_qrows *qa, float *y, int64_t g0, int64_t g1, const float *bias) {
  const size_t gbytes = bk_pack_group_bytes(w);
  const int64_t ys = w->rows;
  for (int64_t ic = 0; ic < qa->n; ic += CHUNK_M) {
    int64_t ie = qa->n - ic < CHUNK_M ? qa->n : ic + CHUNK_M;
    for (int64_t g = g0; g < g1; g++) {
      const uint8_t *grp = (const uint8_t *)w->packed + (size_t)g * gbytes;
      int64_t row0 = g * BK_PACK_ROWS;
      int nr = w->rows - row0 < BK_PACK_ROWS ? (int)(w->rows - row0) : BK_PACK_ROWS;
      for (int64_t i0 = ic; i0 < ie; i0 += TILE_M) {
        int M = ie - i0 < TILE_M ? (int)(ie - i0) : TILE_M;
        float *yi = y + i0 * ys;
        float *y = yi;
        if (w->type == BK_Q4_0) {
          DISPATCH_M(tile_q4_0, M, grp, qa)
        } else if (w->type == BK_Q4_K) {
          DISPATCH_M(tile_k, M, grp, 0, qa)
        } else if (w->type == BK_Q5_K) {
          DISPATCH_M(tile_k, M, grp, 1, qa)
        } else if (w->type == BK_Q6_K) {
          DISPATCH_M(tile_q6_k, M, grp, qa)
        } else {
          DISPATCH_M(tile_q8_0, M, grp, qa)
        }
      }
    }
  }
}

/* bk_qrows_fill with 16 lanes: the same scale (the block's largest |x| over
 * 127), the same products x · (127 / amax) rounded to nearest-even in the
 * default rounding mode (as nearbyintf), the same sums, so exactly the
 * reference's bytes. A block holding a NaN or an infinity goes to the
 * reference, whose handling of them is the spec. */
void bk_qrows_fill_vnni(const bk_qrows *qa, const float *x, int64_t i0, int64_t i1) {
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (int64_t i = i0; i < i1; i++) {
    const float *xr = x + i * qa->cols;
    int8_t *q = qa->q + i * qa->cols;
    for (int64_t b = 0; b < qa->nb; b++) {
      const float *xb = xr + 32 * b;
      __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
      __m512 a0 = _mm512_abs_ps(x0), a1 = _mm512_abs_ps(x1);
      float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
      if (_mm512_cmp_ps_mask(a0, _mm512_set1_ps(INFINITY), _CMP_NLT_UQ) | _mm512_cmp_ps_mask(a1, _mm512_set1_ps(INFINITY), _CMP_NLT_UQ)) {
        bk_qrows_fill_block(qa, x, i, b); /* NaN or ±inf */
        continue;
      }
      float d = amax / 127.0f, id = d > 0.0f ? 127.0f / amax : 0.0f;
      __m512 vid = _mm512_set1_ps(id);
      __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, vid)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, vid));
      q0 = _mm512_min_epi32(_mm512_max_epi32(q0, lo), hi);
      q1 = _mm512_min_epi32(_mm512_max_epi32(q1, lo), hi);
      _mm_storeu_si128((__m128i *)(q + 32 * b), _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128((__m128i *)(q + 32 * b + 16), _mm512_cvtepi32_epi8(q1));
      int32_t s0 = _mm512_reduce_add_epi32(q0), s1 = _mm512_reduce_add_epi32(q1);
      int64_t k = i * qa->nb + b;
      qa->d[k] = d;
      qa->s[k] = s0 + s1;
      qa->s16[2 * k] = s0;
      qa->s16[2 * k + 1] = s1;
      qa->nds[k] = -(d * (float)(s0 + s1));
    }
  }
}

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif /* __x86_64__ */
