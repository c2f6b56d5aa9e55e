/* kernels_avx2.c — the AVX2 + FMA + F16C matmul kernel level: the shared
 * GEMV/GEMM loops of kernels_body.h on 8-float vectors, weights unpacked by
 * kernels_x86.h. Compiled for those instructions by a pragma here, so the
 * rest of the build needs no flags; chosen at run time only when the CPU has
 * them. Knows nothing of models or of how rows are spread over threads. */
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/formats.h"

#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#include <immintrin.h>

typedef __m256 V;
#define VL 8
#define KNAME(x) x##_avx2
#define v_zero() _mm256_setzero_ps()
#define v_load(p) _mm256_loadu_ps(p)
#define v_store(p, v) _mm256_storeu_ps((p), (v))
#define v_set1(f) _mm256_set1_ps(f)
#define v_fma(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define v_add(a, b) _mm256_add_ps((a), (b))
#define GEMV_U 4
#define MR 6
#define NRV 2

static inline float v_hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline void emit16_i8(float *out, __m128i q, float d, float m) {
  __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), vd), vm));
  _mm256_storeu_ps(out + 8, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8))), vd), vm));
}
static inline void emit16_u8(float *out, __m128i q, float d, float m) {
  __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), vd), vm));
  _mm256_storeu_ps(out + 8, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8))), vd), vm));
}
static inline void emit16_f16(float *out, const uint16_t *p) {
  _mm256_storeu_ps(out, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)));
  _mm256_storeu_ps(out + 8, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8))));
}
static inline void emit16_bf16(float *out, const uint16_t *p) {
  __m256i a = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 8)));
  _mm256_storeu_ps(out, _mm256_castsi256_ps(_mm256_slli_epi32(a, 16)));
  _mm256_storeu_ps(out + 8, _mm256_castsi256_ps(_mm256_slli_epi32(b, 16)));
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

/* The fused GEMV step: each group of 16 weights (two vectors) is multiplied
 * into the accumulators of the N activation rows while still in registers. */
#define X86_RET static inline __attribute__((always_inline)) void
#define X86_GEMV_PF(p_) X86_PREFETCH(p_, 128)
#define X86_FN x86_gemv_chunk
#define X86_PARAMS , const float *xk, int64_t xs, const int N, __m256 (*acc)[GEMV_U], float *tail
#define FUSE2(s_, o_, lo_, hi_)                                                                           \
  do {                                                                                                    \
    __m256 l__ = (lo_), h__ = (hi_);                                                                      \
    _Pragma("GCC unroll 8")                                                                               \
    for (int i_ = 0; i_ < N; i_++) {                                                                      \
      acc[i_][(2 * (s_)) % 4] = _mm256_fmadd_ps(l__, _mm256_loadu_ps(xk + i_ * xs + (o_)), acc[i_][(2 * (s_)) % 4]); \
      acc[i_][(2 * (s_) + 1) % 4] =                                                                      \
          _mm256_fmadd_ps(h__, _mm256_loadu_ps(xk + i_ * xs + (o_) + 8), acc[i_][(2 * (s_) + 1) % 4]);    \
    }                                                                                                     \
  } while (0)
#define CVT8(e_, q_, d_, m_) _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(e_(q_)), d_), m_)
#define EMIT_I8(s_, o_, q_, d_, m_)                                                              \
  do {                                                                                           \
    __m128i q__ = (q_);                                                                          \
    __m256 d__ = _mm256_set1_ps(d_), m__ = _mm256_set1_ps(m_);                                   \
    FUSE2(s_, o_, CVT8(_mm256_cvtepi8_epi32, q__, d__, m__),                                     \
          CVT8(_mm256_cvtepi8_epi32, _mm_srli_si128(q__, 8), d__, m__));                         \
  } while (0)
#define EMIT_U8(s_, o_, q_, d_, m_)                                                              \
  do {                                                                                           \
    __m128i q__ = (q_);                                                                          \
    __m256 d__ = _mm256_set1_ps(d_), m__ = _mm256_set1_ps(m_);                                   \
    FUSE2(s_, o_, CVT8(_mm256_cvtepu8_epi32, q__, d__, m__),                                     \
          CVT8(_mm256_cvtepu8_epi32, _mm_srli_si128(q__, 8), d__, m__));                         \
  } while (0)
#define EMIT_F16(s_, o_, p_)                                            \
  FUSE2(s_, o_, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p_))), \
        _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((p_) + 8))))
#define BF8(p_) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p_))), 16))
#define EMIT_BF16(s_, o_, p_) FUSE2(s_, o_, BF8(p_), BF8((p_) + 8))
#define EMIT_ONE(o_, v_)                                                   \
  do {                                                                     \
    float v__ = (v_);                                                      \
    _Pragma("GCC unroll 8")                                                \
    for (int i_ = 0; i_ < N; i_++) tail[i_] += v__ * xk[i_ * xs + (o_)];   \
  } while (0)
#define X86_F32(p)                                                                     \
  do {                                                                                 \
    const float *p_ = (p);                                                             \
    int64_t k_ = 0;                                                                    \
    for (; k_ + 32 <= len; k_ += 32) {                                                 \
      FUSE2(0, k_, _mm256_loadu_ps(p_ + k_), _mm256_loadu_ps(p_ + k_ + 8));            \
      FUSE2(1, k_ + 16, _mm256_loadu_ps(p_ + k_ + 16), _mm256_loadu_ps(p_ + k_ + 24)); \
    }                                                                                  \
    for (; k_ + 16 <= len; k_ += 16) FUSE2(0, k_, _mm256_loadu_ps(p_ + k_), _mm256_loadu_ps(p_ + k_ + 8)); \
    for (; k_ < len; k_++) EMIT_ONE(k_, p_[k_]);                                       \
    return;                                                                            \
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
