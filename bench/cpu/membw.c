/* membw.c — a STREAM-like read benchmark: GB/s of summing a 512 MB array
 * with T threads (integer sums, so only memory limits the loop), best of
 * R passes. Used by compare.sh for decode's bandwidth roofline. The array is
 * in huge pages where the kernel gives them (as hearth's weights are): on
 * this VM a read of 4 KiB pages is up to 10% slower, and the roofline is the
 * faster figure.
 *   cc -O2 -pthread -o membw bench/cpu/membw.c && ./membw [THREADS=1] [R=5]
 * Prints one number: GB/s. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

typedef struct job {
  const uint64_t *p;
  size_t n;
  uint64_t sum;
} job;

static void *read_part(void *arg) {
  job *j = arg;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t k = 0; k + 4 <= j->n; k += 4) s0 += j->p[k], s1 += j->p[k + 1], s2 += j->p[k + 2], s3 += j->p[k + 3];
  j->sum = s0 + s1 + s2 + s3;
  return NULL;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1, reps = argc > 2 ? atoi(argv[2]) : 5;
  if (threads < 1 || threads > 64 || reps < 1) return 2;
  size_t n = (size_t)64 << 20; /* 64 M words = 512 MB */
  uint64_t *a = mmap(NULL, n * sizeof *a, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (a == MAP_FAILED) return 1;
#ifdef MADV_HUGEPAGE
  madvise(a, n * sizeof *a, MADV_HUGEPAGE);
#endif
  for (size_t i = 0; i < n; i++) a[i] = i;
  double best = 0;
  uint64_t total = 0;
  for (int r = 0; r < reps; r++) {
    pthread_t th[64];
    job jobs[64];
    double t0 = now_s();
    for (int t = 0; t < threads; t++) {
      jobs[t] = (job){a + n / threads * t, n / threads, 0};
      pthread_create(&th[t], NULL, read_part, &jobs[t]);
    }
    for (int t = 0; t < threads; t++) pthread_join(th[t], NULL), total += jobs[t].sum;
    double gbs = (double)(n / threads * threads) * 8 / (now_s() - t0) / 1e9;
    if (gbs > best) best = gbs;
  }
  printf("%.2f\n", best);
  fprintf(stderr, "(checksum %llu)\n", (unsigned long long)total);
  munmap(a, n * sizeof *a);
  return 0;
}
