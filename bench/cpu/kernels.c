/* kernels.c — benchmark of bk_matmul: GEMV (decode, n = 1) weight streaming
 * rate in GB/s per weight format at the shapes of Llama-3.2-1B, at 1 and 2
 * threads, next to this machine's memory bandwidth measured in the same run
 * (a STREAM-like read and copy); and GEMM (prefill, n = 512) GFLOP/s.
 * Every figure is the median of several repetitions. Prints markdown tables.
 *
 *   bench/cpu/run_kernels.sh [BUILD_DIR] [--quick]
 * FORMATS="f16 q4_K" limits the GEMV table to those formats (and skips the
 * rest); a full run, not --quick, has the 128256x2048 shape, the only one
 * larger than this machine's L3 cache.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/formats.h"
#include "backend/cpu/cpu.h"
#include "backend/weights.h"
#include "base/pool.h"

static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)((rng >> 40) * (2.0 / 16777216.0) - 1.0);
}

/* ---- memory bandwidth ---- */

typedef struct mem_job {
  const float *src;
  float *dst;
  size_t n_per;
  double sums[64];
} mem_job;

static void read_task(void *ctx, int i, int tid) {
  (void)tid;
  mem_job *j = ctx;
  /* integer sums: independent of float rounding, so nothing limits the loop but memory */
  const uint64_t *p = (const uint64_t *)(j->src + (size_t)i * j->n_per);
  size_t words = j->n_per / 2;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
  for (size_t k = 0; k + 8 <= words; k += 8) {
    s0 += p[k], s1 += p[k + 1], s2 += p[k + 2], s3 += p[k + 3];
    s4 += p[k + 4], s5 += p[k + 5], s6 += p[k + 6], s7 += p[k + 7];
  }
  j->sums[i * 8 % 64] = (double)(s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7);
}

static void copy_task(void *ctx, int i, int tid) {
  (void)tid;
  mem_job *j = ctx;
  memcpy(j->dst + (size_t)i * j->n_per, j->src + (size_t)i * j->n_per, j->n_per * sizeof(float));
}

/* GB/s: read (bytes read) and copy (bytes read + written). */
static void memory_bandwidth(hpool *pool, int reps, double *read_gbs, double *copy_gbs) {
  const size_t n = (size_t)64 << 20; /* 256 MB per array */
  float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) a[i] = (float)(i & 1023), b[i] = 0;
  int tasks = hpool_size(pool);
  mem_job j = {.src = a, .dst = b, .n_per = n / tasks};
  double tr[16], tc[16];
  for (int r = 0; r < reps; r++) {
    double t0 = now_s();
    hpool_for(pool, tasks, read_task, &j);
    double t1 = now_s();
    hpool_for(pool, tasks, copy_task, &j);
    double t2 = now_s();
    tr[r] = n * 4.0 / (t1 - t0) / 1e9;
    tc[r] = n * 8.0 / (t2 - t1) / 1e9;
  }
  *read_gbs = median(tr, reps);
  *copy_gbs = median(tc, reps);
  free(a);
  free(b);
}

/* ---- weights ---- */

typedef struct fmt {
  const char *name;
  bk_type type;
  int bits, group_size;
} fmt;

static const fmt formats[] = {
    {"f32", BK_F32, 0, 0},   {"f16", BK_F16, 0, 0},   {"bf16", BK_BF16, 0, 0}, {"q8_0", BK_Q8_0, 0, 0},
    {"q4_0", BK_Q4_0, 0, 0}, {"q4_K", BK_Q4_K, 0, 0}, {"q5_K", BK_Q5_K, 0, 0}, {"q6_K", BK_Q6_K, 0, 0},
    {"q5_0", BK_Q5_0, 0, 0}, {"q5_1", BK_Q5_1, 0, 0}, {"q2_K", BK_Q2_K, 0, 0}, {"q3_K", BK_Q3_K, 0, 0},
    {"iq4_nl", BK_IQ4_NL, 0, 0}, {"iq4_xs", BK_IQ4_XS, 0, 0},
    {"mlx8 g64", BK_MLX_AFFINE, 8, 64}, {"mlx4 g64", BK_MLX_AFFINE, 4, 64},
};
#define N_FORMATS (int)(sizeof formats / sizeof formats[0])

typedef struct bench_weight {
  bk_weight w;
  void *data, *scales, *biases; /* owned */
  size_t bytes;                 /* weights + scales + biases */
} bench_weight;

/* Quantizes a slab of SLAB rows of random data and repeats it down the rows
 * (rows are independent, so the streaming rate is that of a real matrix). */
#define SLAB 64
static int make_weight(bench_weight *b, const fmt *f, int64_t rows, int64_t cols) {
  memset(b, 0, sizeof *b);
  float *src = malloc(sizeof(float) * SLAB * cols);
  for (int64_t i = 0; i < SLAB * cols; i++) src[i] = frand() * 0.05f;
  b->w = (bk_weight){.type = f->type, .rows = rows, .cols = cols, .bits = f->bits, .group_size = f->group_size,
                     .scale_type = BK_BF16};
  size_t rb = bk_row_bytes(f->type, cols, f->bits);
  b->data = aligned_alloc(64, (rb * rows + 63) / 64 * 64);
  if (!b->data) return 1;
  b->bytes = rb * rows;
  void *slab = malloc(rb * SLAB);
  size_t sb = 0;
  void *ss = NULL, *sbias = NULL;
  if (f->type == BK_MLX_AFFINE) {
    sb = (size_t)(cols / f->group_size) * 2; /* bf16 per row */
    ss = malloc(sb * SLAB);
    sbias = malloc(sb * SLAB);
    bk_quantize_mlx(src, SLAB, cols, f->bits, f->group_size, BK_BF16, slab, ss, sbias, NULL);
    b->scales = malloc(sb * rows);
    b->biases = malloc(sb * rows);
    b->bytes += 2 * sb * rows;
  } else {
    bk_quantize(f->type, src, SLAB, cols, slab, NULL);
  }
  for (int64_t r = 0; r < rows; r += SLAB) {
    int64_t nr = rows - r < SLAB ? rows - r : SLAB;
    memcpy((char *)b->data + r * rb, slab, rb * nr);
    if (ss) {
      memcpy((char *)b->scales + r * sb, ss, sb * nr);
      memcpy((char *)b->biases + r * sb, sbias, sb * nr);
    }
  }
  b->w.data = b->data;
  b->w.scales = b->scales;
  b->w.biases = b->biases;
  /* as a model load does: Q8_0 / Q4_0 / K-quants to the 8-bit integer kernels where the CPU has them */
  if (bk_weight_pack(&b->w, NULL)) return 1;
  free(src);
  free(slab);
  free(ss);
  free(sbias);
  return 0;
}

static void free_weight(bench_weight *b) {
  bk_weight_unpack(&b->w);
  free(b->data);
  free(b->scales);
  free(b->biases);
}

/* Median seconds per call of bk_matmul over reps timed batches (each at least min_s long). */
static double time_matmul(hpool *pool, float *y, const float *x, int64_t n, const bk_weight *w, int reps, double min_s) {
  double t[16];
  bk_matmul(pool, y, x, n, w, NULL, NULL); /* warm up */
  for (int r = 0; r < reps; r++) {
    int calls = 0;
    double t0 = now_s(), t1;
    do {
      bk_matmul(pool, y, x, n, w, NULL, NULL);
      calls++;
      t1 = now_s();
    } while (t1 - t0 < min_s);
    t[r] = (t1 - t0) / calls;
  }
  return median(t, reps);
}

int main(int argc, char **argv) {
  int quick = argc > 1 && !strcmp(argv[1], "--quick");
  int reps = quick ? 3 : 5;
  double min_s = quick ? 0.05 : 0.15;
  hpool *pools[2] = {hpool_create(1), hpool_create(2)};
  if (!pools[0] || !pools[1]) return 1;
  const char *env = getenv("HEARTH_CPU"); /* scalar | avx2 | avx512: a lower kernel level */
  bk_cpu_level want;
  if (env && *env && bk_cpu_level_parse(env, &want)) bk_cpu_set_level(want);
  printf("kernel level: %s (best on this CPU: %s)\n\n", bk_cpu_level_name(bk_cpu_level_now()),
         bk_cpu_level_name(bk_cpu_best()));

  /* Memory is measured before and after the kernels (the machine may be
   * shared); the percentages are of the first read median. */
  double rd[2], cp[2], rd2[2], cp2[2];
  for (int p = 0; p < 2; p++) memory_bandwidth(pools[p], reps, &rd[p], &cp[p]);

  static const int64_t shapes[4][2] = {{2048, 2048}, {8192, 2048}, {2048, 8192}, {128256, 2048}};
  int n_shapes = quick ? 3 : 4;
  printf("GEMV n = 1: weight GB/s streamed (%% of the first read bandwidth at the same thread count)\n\n");
  printf("| format | bytes/weight |");
  for (int s = 0; s < n_shapes; s++) printf(" %lldx%lld 1T | 2T |", (long long)shapes[s][0], (long long)shapes[s][1]);
  printf("\n|---|---:|");
  for (int s = 0; s < n_shapes; s++) printf("---:|---:|");
  printf("\n");
  float *x = malloc(sizeof(float) * 512 * 8192), *y = malloc(sizeof(float) * 512 * 128256);
  if (!x || !y) return 1;
  for (int64_t i = 0; i < 512 * 8192; i++) x[i] = frand();
  const char *only = getenv("FORMATS");
  for (int fi = 0; fi < N_FORMATS; fi++) {
    const fmt *f = &formats[fi];
    if (only && *only && !strstr(only, f->name)) continue;
    printf("| %s |", f->name);
    for (int s = 0; s < n_shapes; s++) {
      bench_weight b;
      if (make_weight(&b, f, shapes[s][0], shapes[s][1])) return 1;
      if (s == 0) printf(" %.3f |", (double)b.bytes / (shapes[s][0] * shapes[s][1]));
      for (int p = 0; p < 2; p++) {
        double t = time_matmul(pools[p], y, x, 1, &b.w, reps, min_s);
        double gbs = b.bytes / t / 1e9;
        printf(" %.1f (%.0f%%) |", gbs, 100 * gbs / rd[p]);
      }
      fflush(stdout);
      free_weight(&b);
    }
    printf("\n");
  }

  if (only && *only) return 0;
  printf("\nGEMM n = 512, 2048x2048 weights: GFLOP/s (2 * n * rows * cols per call)\n\n");
  printf("| format | 1 thread | 2 threads |\n|---|---:|---:|\n");
  for (int fi = 0; fi < N_FORMATS; fi++) {
    const fmt *f = &formats[fi];
    bench_weight b;
    if (make_weight(&b, f, 2048, 2048)) return 1;
    printf("| %s |", f->name);
    for (int p = 0; p < 2; p++) {
      double t = time_matmul(pools[p], y, x, 512, &b.w, quick ? 1 : 3, 0.0);
      printf(" %.1f |", 2.0 * 512 * 2048 * 2048 / t / 1e9);
    }
    printf("\n");
    fflush(stdout);
    free_weight(&b);
  }
  /* Compute rate, free of memory and of other processes: a 256 x 2048
   * matrix (in L2/L3), one thread, n = 1, timed in this thread's CPU time. */
  printf("\nGEMV n = 1 compute rate, 256x2048 weights in cache, 1 thread, CPU time: Gweights/s per level\n\n");
  printf("| format | scalar | avx2 | avx512 |\n|---|---:|---:|---:|\n");
  bk_cpu_level saved = bk_cpu_level_now();
  for (int fi = 0; fi < N_FORMATS; fi++) {
    bench_weight b;
    if (make_weight(&b, &formats[fi], 256, 2048)) return 1;
    printf("| %s |", formats[fi].name);
    for (int l = BK_CPU_SCALAR; l <= BK_CPU_AVX512; l++) {
      if (bk_cpu_set_level((bk_cpu_level)l) != (bk_cpu_level)l) {
        printf(" - |");
        continue;
      }
      double t[16];
      for (int r = 0; r < reps; r++) {
        int calls = 0;
        double t0 = cpu_s(), t1;
        do {
          bk_matmul(NULL, y, x, 1, &b.w, NULL, NULL);
          calls++;
          t1 = cpu_s();
        } while (t1 - t0 < min_s / 3);
        t[r] = (t1 - t0) / calls;
      }
      printf(" %.1f |", 256.0 * 2048 / median(t, reps) / 1e9);
    }
    printf("\n");
    free_weight(&b);
  }
  bk_cpu_set_level(saved);

  for (int p = 0; p < 2; p++) memory_bandwidth(pools[p], reps, &rd2[p], &cp2[p]);
  printf("\n| memory (256 MB arrays) | 1 thread | 2 threads |\n|---|---:|---:|\n");
  printf("| read GB/s, before / after | %.1f / %.1f | %.1f / %.1f |\n", rd[0], rd2[0], rd[1], rd2[1]);
  printf("| copy GB/s (read + write), before / after | %.1f / %.1f | %.1f / %.1f |\n", cp[0], cp2[0], cp[1], cp2[1]);
  free(x);
  free(y);
  hpool_destroy(pools[0]);
  hpool_destroy(pools[1]);
  return 0;
}
