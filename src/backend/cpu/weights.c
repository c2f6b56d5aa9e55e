/* weights.c — bk_matmul: checks a weight descriptor, picks the kernel level
 * for this CPU (once, honouring HEARTH_CPU) and spreads output rows over the
 * thread pool in contiguous tiles so that each thread streams its own part of
 * the weights. The arithmetic lives in kernels_*.c; the formats in quant.c.
 * Knows nothing of models, files or tensor names.
 */
#include <stdatomic.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/quant.h"
#include "backend/weights.h"

/* ---- validation ---- */

int bk_weight_validate(const bk_weight *w, herr *err) {
  if (!w) return herr_set(err, HEARTH_EINVAL, "weight: NULL descriptor");
  if ((unsigned)w->type >= BK_TYPE_COUNT) return herr_set(err, HEARTH_EINVAL, "weight: unknown type %d", (int)w->type);
  const char *tn = bk_type_name(w->type);
  if (w->rows <= 0 || w->cols <= 0)
    return herr_set(err, HEARTH_EINVAL, "weight %s: shape %lld x %lld is empty", tn, (long long)w->rows, (long long)w->cols);
  if (!w->data) return herr_set(err, HEARTH_EINVAL, "weight %s: no data", tn);
  if (w->type == BK_MLX_AFFINE) {
    if (w->bits != 4 && w->bits != 8) return herr_set(err, HEARTH_EINVAL, "weight mlx_affine: bits %d (want 4 or 8)", w->bits);
    if (w->group_size != 32 && w->group_size != 64 && w->group_size != 128)
      return herr_set(err, HEARTH_EINVAL, "weight mlx_affine: group_size %d (want 32, 64 or 128)", w->group_size);
    if (w->cols % w->group_size)
      return herr_set(err, HEARTH_EINVAL, "weight mlx_affine: %lld columns are not a whole number of %d-element groups",
                      (long long)w->cols, w->group_size);
    if (w->scale_type != BK_F32 && w->scale_type != BK_F16 && w->scale_type != BK_BF16)
      return herr_set(err, HEARTH_EINVAL, "weight mlx_affine: scales of type %s (want f32, f16 or bf16)",
                      bk_type_name(w->scale_type));
    if (!w->scales || !w->biases) return herr_set(err, HEARTH_EINVAL, "weight mlx_affine: missing scales or biases");
    return 0;
  }
  if (w->cols % bk_type_block(w->type))
    return herr_set(err, HEARTH_EINVAL, "weight %s: %lld columns are not a whole number of %lld-element blocks", tn,
                    (long long)w->cols, (long long)bk_type_block(w->type));
  return 0;
}

/* ---- dispatch ---- */

#if defined(__x86_64__)
/* F16C is CPUID leaf 1, ECX bit 29 (not every compiler's __builtin_cpu_supports knows it). */
static int cpu_has_f16c(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  return (c >> 29) & 1;
}
#endif

static atomic_int level_now = -1; /* -1: not chosen yet */

bk_cpu_level bk_cpu_best(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c())
    return BK_CPU_AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c())
    return BK_CPU_AVX2;
#endif
  return BK_CPU_SCALAR;
}

const char *bk_cpu_level_name(bk_cpu_level level) {
  switch (level) {
    case BK_CPU_AVX2: return "avx2";
    case BK_CPU_AVX512: return "avx512";
    default: return "scalar";
  }
}

bk_cpu_level bk_cpu_set_level(bk_cpu_level level) {
  bk_cpu_level best = bk_cpu_best();
  if ((int)level < 0) level = BK_CPU_SCALAR;
  if (level > best) level = best;
  atomic_store(&level_now, (int)level);
  return level;
}

bk_cpu_level bk_cpu_level_now(void) {
  int l = atomic_load(&level_now);
  if (l >= 0) return (bk_cpu_level)l;
  bk_cpu_level want = bk_cpu_best();
  const char *env = getenv("HEARTH_CPU");
  if (env && *env) {
    if (!strcmp(env, "scalar")) want = BK_CPU_SCALAR;
    else if (!strcmp(env, "avx2")) want = BK_CPU_AVX2;
    else if (!strcmp(env, "avx512")) want = BK_CPU_AVX512;
  }
  return bk_cpu_set_level(want);
}

static bk_rows_fn rows_fn(bk_cpu_level level) {
#if defined(__x86_64__)
  if (level == BK_CPU_AVX512) return bk_rows_avx512;
  if (level == BK_CPU_AVX2) return bk_rows_avx2;
#elif defined(__aarch64__)
  (void)level;
  return bk_rows_neon;
#endif
  (void)level;
  return bk_rows_scalar;
}

/* ---- threads ---- */

typedef struct matmul_job {
  bk_rows_fn fn;
  const bk_weight *w;  /* borrowed */
  const float *x;      /* borrowed */
  float *y;            /* borrowed */
  const float *bias;   /* borrowed */
  int64_t n, rows_per_task;
} matmul_job;

static void matmul_task(void *ctx, int task, int tid) {
  (void)tid;
  const matmul_job *j = ctx;
  int64_t r0 = (int64_t)task * j->rows_per_task;
  int64_t r1 = r0 + j->rows_per_task < j->w->rows ? r0 + j->rows_per_task : j->w->rows;
  j->fn(j->w, j->x, j->n, j->y, r0, r1, j->bias);
}

int bk_matmul(hpool *pool, float *y, const float *x, int64_t n, const bk_weight *w, const float *bias, herr *err) {
  int rc = bk_weight_validate(w, err);
  if (rc) return rc;
  if (n <= 0) return 0;
  /* Tiles of whole BK_ROW_TILE rows (one GEMM panel; 128 bytes of y per
   * input row, so threads never share a cache line of y except at the
   * very end), about four per thread so that a slow thread is caught up. */
  int threads = hpool_size(pool);
  int64_t per = (w->rows + (int64_t)threads * 4 - 1) / ((int64_t)threads * 4);
  per = (per + BK_ROW_TILE - 1) / BK_ROW_TILE * BK_ROW_TILE;
  if (per < BK_ROW_TILE) per = BK_ROW_TILE;
  matmul_job j = {rows_fn(bk_cpu_level_now()), w, x, y, bias, n, per};
  int tasks = (int)((w->rows + per - 1) / per);
  hpool_for(pool, tasks, matmul_task, &j);
  return 0;
}
