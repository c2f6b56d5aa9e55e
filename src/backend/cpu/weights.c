/* weights.c — bk_matmul: checks a weight descriptor, picks the kernel level
 * for this CPU (once, or as set by bk_cpu_set_level) and spreads output rows over the
 * thread pool in contiguous tiles so that each thread streams its own part of
 * the weights. The arithmetic lives in kernels_*.c; the formats (and the
 * descriptor check, bk_weight_validate) in backend/formats.c.
 * Knows nothing of models, files or tensor names.
 */
#include <pthread.h>
#include <stdatomic.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>
#include <unistd.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/pack.h"
#include "backend/formats.h"
#include "backend/cpu/cpu.h"
#include "backend/weights.h"

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

static bk_cpu_level cpu_best_probe(void) {
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

/* Probed once: the CPUID instruction traps to the hypervisor in a virtual
 * machine (microseconds), and the packed matmul asks on every call. */
static atomic_int level_best = -1;

bk_cpu_level bk_cpu_best(void) {
  int l = atomic_load_explicit(&level_best, memory_order_relaxed);
  if (l < 0) atomic_store_explicit(&level_best, l = (int)cpu_best_probe(), memory_order_relaxed);
  return (bk_cpu_level)l;
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
  return bk_cpu_set_level(bk_cpu_best());
}

bool bk_cpu_level_parse(const char *s, bk_cpu_level *out) {
  if (!strcmp(s, "scalar")) *out = BK_CPU_SCALAR;
  else if (!strcmp(s, "avx2")) *out = BK_CPU_AVX2;
  else if (!strcmp(s, "avx512")) *out = BK_CPU_AVX512;
  else return false;
  return true;
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

/* ---- packed weights ---- */

bool bk_cpu_has_int8_dot(void) {
#if defined(__x86_64__)
  static atomic_int has = -1; /* probed once, as bk_cpu_best */
  int h = atomic_load_explicit(&has, memory_order_relaxed);
  if (h < 0) {
    __builtin_cpu_init();
    h = bk_cpu_best() == BK_CPU_AVX512 && __builtin_cpu_supports("avx512vnni");
    atomic_store_explicit(&has, h, memory_order_relaxed);
  }
  return h;
#else
  return false;
#endif
}

int bk_weight_pack(bk_weight *w, herr *err) {
  int rc = bk_weight_validate(w, err);
  if (rc) return rc;
  if (w->packed || !bk_pack_type_ok(w->type) || bk_cpu_level_now() != BK_CPU_AVX512 ||
      !bk_cpu_has_int8_dot())
    return 0;
  size_t groups = (size_t)((w->rows + BK_PACK_ROWS - 1) / BK_PACK_ROWS), size = groups * bk_pack_group_bytes(w);
  const size_t huge = (size_t)2 << 20;
  size_t mapped = (size + huge - 1) / huge * huge;
  void *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return herr_set(err, HEARTH_ENOMEM, "weight %s: cannot allocate %zu bytes to repack it", bk_type_name(w->type), size);
#ifdef MADV_HUGEPAGE
  madvise(p, mapped, MADV_HUGEPAGE);
#endif
  bk_pack_write(w, p);
  w->packed = p;
  w->packed_size = mapped;
  return 0;
}

void bk_weight_drop_source(bk_weight *w) {
  if (!w || !w->packed || !w->data) return;
  size_t page = (size_t)sysconf(_SC_PAGESIZE), bytes = bk_row_bytes(w->type, w->cols, w->bits) * (size_t)w->rows;
  uintptr_t a = ((uintptr_t)w->data + page - 1) / page * page, b = ((uintptr_t)w->data + bytes) / page * page;
  if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
  w->data = NULL;
}

void bk_weight_unpack(bk_weight *w) {
  if (!w || !w->packed) return;
  munmap(w->packed, w->packed_size);
  w->packed = NULL;
  w->packed_size = 0;
}

/* The calling thread's activation buffer, kept between calls (prefill
 * would otherwise fault in megabytes per matmul); freed when it exits. */
static pthread_key_t qbuf_key;
static pthread_once_t qbuf_once = PTHREAD_ONCE_INIT;
typedef struct qbuf { void *p; size_t cap; } qbuf;
static void qbuf_free(void *v) {
  qbuf *b = v;
  if (b) free(b->p);
  free(b);
}
static void qbuf_init(void) { pthread_key_create(&qbuf_key, qbuf_free); }
static void *qbuf_get(size_t size) {
  pthread_once(&qbuf_once, qbuf_init);
  qbuf *b = pthread_getspecific(qbuf_key);
  if (!b) {
    b = calloc(1, sizeof *b);
    if (!b || pthread_setspecific(qbuf_key, b)) {
      free(b);
      return NULL;
    }
  }
  if (b->cap < size) {
    void *np = NULL;
    if (posix_memalign(&np, 64, size)) return NULL;
    free(b->p);
    b->p = np;
    b->cap = size;
  }
  return b->p;
}

typedef struct packed_job {
  bk_packed_fn fn;
  bk_qrows_fn fill;
  const bk_weight *w;  /* borrowed */
  const float *x;      /* borrowed */
  bk_qrows qa;         /* borrowed arrays */
  float *y;            /* borrowed */
  const float *bias;   /* borrowed */
  int64_t groups_per_task, rows_per_qtask;
} packed_job;

static void quant_task(void *ctx, int task, int tid) {
  (void)tid;
  const packed_job *j = ctx;
  int64_t i0 = (int64_t)task * j->rows_per_qtask, i1 = i0 + j->rows_per_qtask < j->qa.n ? i0 + j->rows_per_qtask : j->qa.n;
  j->fill(&j->qa, j->x, i0, i1);
}

static void packed_task(void *ctx, int task, int tid) {
  (void)tid;
  const packed_job *j = ctx;
  int64_t groups = (j->w->rows + BK_PACK_ROWS - 1) / BK_PACK_ROWS;
  int64_t g0 = (int64_t)task * j->groups_per_task, g1 = g0 + j->groups_per_task < groups ? g0 + j->groups_per_task : groups;
  j->fn(j->w, &j->qa, j->y, g0, g1, j->bias);
}

/* bk_matmul for a packed weight: activations to 8 bits, then groups of rows over the pool. */
static int matmul_packed(hpool *pool, float *y, const float *x, int64_t n, const bk_weight *w, const float *bias, herr *err) {
  int64_t nb = w->cols / 32;
  size_t qbytes = ((size_t)(n * w->cols) + 63) / 64 * 64, dbytes = ((size_t)(n * nb) * 4 + 63) / 64 * 64;
  unsigned char *buf = qbuf_get(qbytes + 5 * dbytes);
  if (!buf) return herr_set(err, HEARTH_ENOMEM, "matmul: out of memory for %lld quantized activation rows", (long long)n);
  packed_job j = {.w = w, .x = x, .y = y, .bias = bias};
  j.qa = (bk_qrows){.n = n, .cols = w->cols, .nb = nb, .q = (int8_t *)buf, .d = (float *)(buf + qbytes), .s = (int32_t *)(buf + qbytes + dbytes),
                      .s16 = (int32_t *)(buf + qbytes + 2 * dbytes), .nds = (float *)(buf + qbytes + 4 * dbytes)};
  int threads = hpool_size(pool);
#if defined(__x86_64__)
  bool vnni = bk_cpu_level_now() == BK_CPU_AVX512 && bk_cpu_has_int8_dot();
  j.fn = vnni ? bk_packed_rows_vnni : bk_packed_rows_ref;
  j.fill = vnni ? bk_qrows_fill_vnni : bk_qrows_fill;
#else
  j.fn = bk_packed_rows_ref;
  j.fill = bk_qrows_fill;
#endif
  if (n >= 16 && threads > 1) {
    j.rows_per_qtask = (n + threads * 2 - 1) / (threads * 2);
    hpool_for(pool, (int)((n + j.rows_per_qtask - 1) / j.rows_per_qtask), quant_task, &j);
  } else {
    j.fill(&j.qa, x, 0, n);
  }
  int64_t groups = (w->rows + BK_PACK_ROWS - 1) / BK_PACK_ROWS;
  int64_t want = (int64_t)threads * (n <= 4 ? 16 : 4); /* decode: small tasks, so that a thread held up elsewhere is caught up */
  j.groups_per_task = (groups + want - 1) / want;
  if (j.groups_per_task < 1) j.groups_per_task = 1;
  hpool_for(pool, (int)((groups + j.groups_per_task - 1) / j.groups_per_task), packed_task, &j);
  return 0;
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
  if (w->packed) return matmul_packed(pool, y, x, n, w, bias, err);
  /* Tiles of whole BK_ROW_TILE rows (one GEMM panel; 128 bytes of y per
   * input row, so threads never share a cache line of y except at the
   * very end), about four per thread so that a slow thread is caught up. */
  int threads = hpool_size(pool);
  int64_t want = (int64_t)threads * (n <= 4 ? 16 : 4);
  int64_t per = (w->rows + want - 1) / want;
  per = (per + BK_ROW_TILE - 1) / BK_ROW_TILE * BK_ROW_TILE;
  if (per < BK_ROW_TILE) per = BK_ROW_TILE;
  matmul_job j = {rows_fn(bk_cpu_level_now()), w, x, y, bias, n, per};
  int tasks = (int)((w->rows + per - 1) / per);
  hpool_for(pool, tasks, matmul_task, &j);
  return 0;
}
