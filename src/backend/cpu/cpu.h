/* cpu.h — what only the CPU backend knows: the matmul over stored weight
 * formats spread over a thread pool, the repacking of GGUF blocks for the
 * 8-bit integer kernels, and the kernel level (scalar, AVX2+FMA+F16C,
 * AVX-512) chosen at run time for this CPU. Used by the CPU backend
 * (backend_cpu.c), its tests and its benchmarks; model code goes through
 * backend.h instead. */
#ifndef HEARTH_BACKEND_CPU_CPU_H
#define HEARTH_BACKEND_CPU_CPU_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/weights.h"
#include "base/pool.h"
#include "base/status.h"

/* y[n, rows] = x[n, cols] · Wᵀ (+ bias[rows] when bias != NULL), spread over
 * the pool's threads (pool may be NULL). y must not alias x. Every element of
 * y is written. Fails only when w does not validate (y untouched then). */
int bk_matmul(hpool *pool, float *y, const float *x, int64_t n, const bk_weight *w, const float *bias, herr *err);

/* Repacks w (Q8_0, Q4_0, Q4_K, Q5_K or Q6_K) into 16-row groups for the 8-bit integer
 * kernels, when the CPU level in effect has them (AVX-512 VNNI). bk_matmul
 * then quantizes activations to 8 bits per block of 32, as llama.cpp does
 * for these types, instead of multiplying f32 activations by the
 * dequantized weights: faster, but no longer exact to the dequantized
 * weights. Does nothing (returns 0) for other types, other CPUs, or when w
 * is packed already (the CPU backend skips it for f32_activations).
 * w->data stays as it was and stays in use for other levels. */
int bk_weight_pack(bk_weight *w, herr *err);
void bk_weight_unpack(bk_weight *w);
/* For a packed w whose stored bytes the caller owns privately and no longer
 * needs (nothing else reads them): gives their whole pages back to the
 * system and sets w->data to NULL, so that only the packed copy stays in
 * memory. No-op when w is not packed. */
void bk_weight_drop_source(bk_weight *w);
/* Whether this CPU (and build) has the integer kernels. */
bool bk_cpu_has_int8_dot(void);

/* Dispatch levels, lowest first. */
typedef enum bk_cpu_level { BK_CPU_SCALAR = 0, BK_CPU_AVX2 = 1, BK_CPU_AVX512 = 2 } bk_cpu_level;
/* The best level this CPU (and build) supports. */
bk_cpu_level bk_cpu_best(void);
/* The level bk_matmul uses now: the one set last (bk_cpu_set_level, or the
 * CPU backend's cpu_level option), else bk_cpu_best(). Process-wide: it is
 * what this CPU runs, whichever backend asks. */
bk_cpu_level bk_cpu_level_now(void);
/* Forces a level (clamped to bk_cpu_best()); returns the level in effect.
 * Not meant to be called while a matmul runs. */
bk_cpu_level bk_cpu_set_level(bk_cpu_level level);
const char *bk_cpu_level_name(bk_cpu_level level);

/* Parses "scalar", "avx2" or "avx512"; false when it is none of them. */
bool bk_cpu_level_parse(const char *s, bk_cpu_level *out);

/* The experts of a MoE layer on host memory (moe.c), as bk_moe defines them:
 * y[T, D] from x[T, D], ids / w [T, k]. bk_moe_ref is the plain reference
 * (per token and slot, weight rows dequantized one at a time, no grouping);
 * bk_moe_grouped is what the CPU backend runs: tokens grouped by expert,
 * each active expert's matrices multiplied once for all its tokens through
 * bk_matmul on the pool. scratch: grown as needed (owned by the caller,
 * free()). A slot whose id is outside the experts contributes nothing; both
 * fail only when out of memory or on a weight that does not validate. */
int bk_moe_ref(float *y, const float *x, int64_t T, int64_t D, const int32_t *ids, const float *w, int64_t k,
               const bk_experts *ex, bk_act act, herr *err);
int bk_moe_grouped(hpool *pool, float *y, const float *x, int64_t T, int64_t D, const int32_t *ids, const float *w,
                   int64_t k, const bk_experts *ex, bk_act act, float **scratch, size_t *scratch_cap, herr *err);

/* bk_sample on host memory (sample_cpu.c): the reference of the device sampler. */
int bk_cpu_sample(bk_backend *be, const bk_tensor *logits, const bk_sample_row *rows, const bk_sample_adj *adj,
                  int64_t n_adj, bk_sample_out *out, herr *err);

/* bk_attention_sparse on host memory (sparse.c): f32, one task per query
 * over the pool, as op_attention_sparse defines it. */
void bk_attention_sparse_cpu(hpool *pool, float *out, const float *q, int64_t n, const int32_t *sel, const paged_rows *kv,
                             const sparse_attn_params *p);

#endif
