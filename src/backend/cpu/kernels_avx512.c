/* kernels_avx512.c — the AVX-512 (F, BW, VL) matmul kernel level: the shared
 * GEMV/GEMM loops of kernels_body.h on 16-float vectors, weights unpacked by
 * kernels_x86.h. Compiled for those instructions by a pragma here, so the
 * rest of the build needs no flags; chosen at run time only when the CPU has
 * them. Knows nothing of models or of how rows are spread over threads. */
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/formats.h"

#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#endif

#include <immintrin.h>

typedef __m512 V;
#define VL 16
#define KNAME(x) x##_avx512
#define v_zero() _mm512_setzero_ps()
#define v_load(p) _mm512_loadu_ps(p)
#define v_store(p, v) _mm512_storeu_ps((p), (v))
#define v_set1(f) _mm512_set1_ps(f)
#define v_fma(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define v_add(a, b) _mm512_add_ps((a), (b))
#define v_hsum(v) _mm512_reduce_add_ps(v)
#define GEMV_U 4
#define MR 6
#define NRV 2

static inline void emit16_i8(float *out, __m128i q, float d, float m) {
  _mm512_storeu_ps(out, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(d)), _mm512_set1_ps(m)));
}
static inline void emit16_u8(float *out, __m128i q, float d, float m) {
  _mm512_storeu_ps(out, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q)), _mm512_set1_ps(d)), _mm512_set1_ps(m)));
}
static inline void emit16_f16(float *out, const uint16_t *p) {
  _mm512_storeu_ps(out, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)));
}
static inline void emit16_bf16(float *out, const uint16_t *p) {
  __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
  _mm512_storeu_ps(out, _mm512_castsi512_ps(_mm512_slli_epi32(a, 16)));
}

/* The dequantizing copy: weights into out[0..len). */
#define X86_RET static const float *
#define X86_FN x86_dequant
#define X86_PARAMS , float *out
#define X86_F32(p) return (p)
#define X86_DONE return out
#define EMIT_I8(s_, o_, q_, d_, m_) emit16_i8(out + (o_), (q_), (d_), (m_))
#define EMIT_U8(s_, o_, q_, d_, m_) emit16_u8(out + (o_), (q_), (d_), (m_))
#define EMIT_F16(s_, o_, p_) emit16_f16(out + (o_), (p_))
#define EMIT_BF16(s_, o_, p_) emit16_bf16(out + (o_), (p_))
#define EMIT_ONE(o_, v_) (out[o_] = (v_))
#include "backend/cpu/kernels_x86.h"
#undef X86_RET
#undef X86_FN
#undef X86_PARAMS
#undef X86_F32
#undef X86_DONE
#undef EMIT_I8
#undef EMIT_U8
#undef EMIT_F16
#undef EMIT_BF16
#undef EMIT_ONE
#define DEQ x86_dequant

/* The fused GEMV step: each group of 16 weights is multiplied into the
 * accumulators of the N activation rows while still in a register. */
#define X86_RET static inline __attribute__((always_inline)) void
#define X86_GEMV_PF(p_) X86_PREFETCH(p_, 128)
#define X86_FN x86_gemv_chunk
#define X86_PARAMS , const float *xk, int64_t xs, const int N, __m512 (*acc)[GEMV_U], float *tail
#define FUSE(s_, o_, wv_)                                                                     \
  do {                                                                                        \
    __m512 w__ = (wv_);                                                                       \
    _Pragma("GCC unroll 8")                                                                   \
    for (int i_ = 0; i_ < N; i_++)                                                            \
      acc[i_][s_] = _mm512_fmadd_ps(w__, _mm512_loadu_ps(xk + i_ * xs + (o_)), acc[i_][s_]); \
  } while (0)
#define EMIT_I8(s_, o_, q_, d_, m_) \
  FUSE(s_, o_, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q_)), _mm512_set1_ps(d_)), _mm512_set1_ps(m_)))
#define EMIT_U8(s_, o_, q_, d_, m_) \
  FUSE(s_, o_, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q_)), _mm512_set1_ps(d_)), _mm512_set1_ps(m_)))
#define EMIT_F16(s_, o_, p_) FUSE(s_, o_, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p_))))
#define EMIT_BF16(s_, o_, p_) \
  FUSE(s_, o_, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p_))), 16)))
#define EMIT_ONE(o_, v_)                                          \
  do {                                                            \
    float v__ = (v_);                                             \
    _Pragma("GCC unroll 8")                                       \
    for (int i_ = 0; i_ < N; i_++) tail[i_] += v__ * xk[i_ * xs + (o_)]; \
  } while (0)
#define X86_F32(p)                                     \
  do {                                                 \
    const float *p_ = (p);                             \
    int64_t k_ = 0;                                    \
    for (; k_ + 64 <= len; k_ += 64) {                 \
      FUSE(0, k_, _mm512_loadu_ps(p_ + k_));           \
      FUSE(1, k_ + 16, _mm512_loadu_ps(p_ + k_ + 16)); \
      FUSE(2, k_ + 32, _mm512_loadu_ps(p_ + k_ + 32)); \
      FUSE(3, k_ + 48, _mm512_loadu_ps(p_ + k_ + 48)); \
    }                                                  \
    for (; k_ + 16 <= len; k_ += 16) FUSE(0, k_, _mm512_loadu_ps(p_ + k_)); \
    for (; k_ < len; k_++) EMIT_ONE(k_, p_[k_]);       \
    return;                                            \
  } while (0)
#define X86_DONE return
#include "backend/cpu/kernels_x86.h"
#undef X86_GEMV_PF
#define GEMV_FUSED x86_gemv_chunk

#include "backend/cpu/kernels_body.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif /* __x86_64__ */
