/* attention.c — op_attention and op_attention_seqs: the kernels of
 * attn_body.h compiled for AVX-512, for AVX2+FMA and for the baseline target
 * (NEON on arm64), chosen by the CPU level in effect, with op_attention_ref
 * (ref.c) as the plain reference they are tested against. Rows are split
 * over the pool as (KV head, block of 16 query vectors) tasks, those of
 * every sequence of a step in one dispatch (a decode step's sequences have a
 * task or two each: dispatched one by one, the pool's other threads rarely
 * joined in). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
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

/* A dispatch's sequences: job i's tasks are [first[i], first[i + 1]). */
typedef struct attn_seqs_job {
  const attn_fast_job *jobs; /* borrowed */
  const int *first;          /* borrowed */
  int n;
} attn_seqs_job;

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
  attn_seq one = {.out = out, .q = q, .n = n, .q_row = q_row, .kv = *kv};
  op_attention_seqs(pool, &one, 1, p);
}

void op_attention_seqs(hpool *pool, const attn_seq *seqs, int n_seqs, const attn_params *p) {
  bk_cpu_level level = bk_cpu_level_now();
  if (level == BK_CPU_SCALAR || p->head_dim > ATT_MAX_HD || p->head_dim % 8 || p->n_kv_heads <= 0 ||
      p->n_heads % p->n_kv_heads) {
    for (int i = 0; i < n_seqs; i++)
      if (seqs[i].n > 0) op_attention_ref(pool, seqs[i].out, seqs[i].q, seqs[i].n, seqs[i].q_row, &seqs[i].kv, p);
    return;
  }
  int64_t G = p->n_heads / p->n_kv_heads;
  attn_fast_job one_job;
  int one_first[2];
  attn_fast_job *jobs = n_seqs > 1 ? malloc(sizeof *jobs * (size_t)n_seqs) : &one_job;
  int *first = n_seqs > 1 ? malloc(sizeof *first * (size_t)(n_seqs + 1)) : one_first;
  if (!jobs || !first) { /* out of memory for the table: a dispatch per sequence */
    if (jobs != &one_job) free(jobs);
    if (first != one_first) free(first);
    for (int i = 0; i < n_seqs; i++) op_attention(pool, seqs[i].out, seqs[i].q, seqs[i].n, seqs[i].q_row, &seqs[i].kv, p);
    return;
  }
  int n = 0, tasks = 0;
  for (int i = 0; i < n_seqs; i++) {
    if (seqs[i].n <= 0) continue;
    jobs[n] = (attn_fast_job){seqs[i].out, seqs[i].q, seqs[i].q_row, &seqs[i].kv, p, seqs[i].n};
    first[n++] = tasks;
    tasks += (int)(p->n_kv_heads * ((seqs[i].n * G + 15) / 16));
  }
  first[n] = tasks;
  attn_seqs_job sj = {jobs, first, n};
  hpool_fn fn = attn_task_generic;
#if defined(__x86_64__)
  fn = level == BK_CPU_AVX512 ? attn_task_avx512 : attn_task_avx2;
#endif
  if (tasks > 0) hpool_for(pool, tasks, fn, &sj);
  if (jobs != &one_job) free(jobs);
  if (first != one_first) free(first);
}
