/* attention.c — op_attention: the blocked kernel of attn_body.h compiled for
 * AVX-512, for AVX2+FMA and for the baseline target (NEON on arm64), chosen
 * by the CPU level in effect, with op_attention_ref (ref.c) as the plain
 * reference it is tested against. Rows are split over the pool as (KV head,
 * block of 16 query vectors) tasks. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/ops.h"
#include "backend/cpu/cpu.h"
#include "backend/formats.h"
#include "backend/weights.h"

#define ATT_MAX_HD 256

typedef struct attn_fast_job {
  float *out;            /* borrowed */
  const float *q;        /* borrowed */
  const int64_t *q_row;  /* borrowed */
  const kv_view *kv;     /* borrowed */
  const attn_params *p;  /* borrowed */
  int64_t n;
} attn_fast_job;

static inline const float *kv_row_at(const float *const *blocks, const kv_view *kv, int64_t r) {
  return blocks[r / kv->block_rows] + (r % kv->block_rows) * kv->row_stride;
}

#define AN(x) x##_generic
#include "backend/cpu/attn_body.h"
#undef AN

#if defined(__x86_64__)
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
#define AN(x) x##_avx2
#include "backend/cpu/attn_body.h"
#undef AN
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")
#endif
#define AN(x) x##_avx512
#include "backend/cpu/attn_body.h"
#undef AN
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

void op_attention(hpool *pool, float *out, const float *q, int64_t n, const int64_t *q_row, const kv_view *kv,
                  const attn_params *p) {
  if (n <= 0) return;
  bk_cpu_level level = bk_cpu_level_now();
  if (level == BK_CPU_SCALAR || p->head_dim > ATT_MAX_HD || p->head_dim % 8 || p->n_kv_heads <= 0 ||
      p->n_heads % p->n_kv_heads) {
    op_attention_ref(pool, out, q, n, q_row, kv, p);
    return;
  }
  attn_fast_job j = {out, q, q_row, kv, p, n};
  int64_t G = p->n_heads / p->n_kv_heads, blocks = (n * G + 15) / 16;
  hpool_fn fn = attn_task_generic;
#if defined(__x86_64__)
  fn = level == BK_CPU_AVX512 ? attn_task_avx512 : attn_task_avx2;
#endif
  hpool_for(pool, (int)(p->n_kv_heads * blocks), fn, &j);
}
