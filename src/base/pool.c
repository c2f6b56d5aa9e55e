/* pool.c — parallel-for thread pool (see pool.h). Owns its worker threads;
 * knows nothing of what the work is. Workers take indices from an atomic
 * counter, so uneven items balance themselves.
 *
 * A forward pass runs hundreds of short parallel loops per token, so waking
 * threads through the kernel each time would cost more than some loops
 * take. Workers and the caller therefore spin for a short while (SPIN_NS)
 * on the job counter before sleeping on a condition variable; an idle pool
 * sleeps, so a server between requests costs nothing. */
#include "base/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* How long a thread spins for the next job (or the caller for the end of
 * one) before it sleeps; after PAUSE_NS it yields the CPU between checks,
 * so that a thread with work it was preempted from (another process busy on
 * the same cores) runs instead of the spinner. */
#define SPIN_NS 200000L
#define PAUSE_NS 20000L

hpool_fpmode hpool_flush_begin(void) {
#if defined(__x86_64__) || defined(__i386__)
  unsigned old = _mm_getcsr();
  _mm_setcsr(old | 0x8040u); /* FTZ (bit 15) | DAZ (bit 6) */
  return old;
#elif defined(__aarch64__)
  unsigned long fpcr;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
  __asm__ __volatile__("msr fpcr, %0" : : "r"(fpcr | (1ul << 24))); /* FZ */
  return fpcr;
#else
  return 0;
#endif
}

void hpool_flush_end(hpool_fpmode old) {
#if defined(__x86_64__) || defined(__i386__)
  _mm_setcsr((unsigned)old);
#elif defined(__aarch64__)
  __asm__ __volatile__("msr fpcr, %0" : : "r"(old));
#else
  (void)old;
#endif
}

int hpool_flushing(void) {
#if defined(__x86_64__) || defined(__i386__)
  return (_mm_getcsr() & 0x8040u) == 0x8040u;
#elif defined(__aarch64__)
  unsigned long fpcr;
  __asm__ __volatile__("mrs %0, fpcr" : "=r"(fpcr));
  return (fpcr >> 24) & 1;
#else
  return 0;
#endif
}

struct hpool {
  int n;                 /* threads including the caller */
  pthread_t *threads;    /* owned: n - 1 workers */
  pthread_mutex_t mu;    /* pairs with the condition variables */
  pthread_cond_t start, done_cv;
  pthread_mutex_t run_mu;/* serialises hpool_for callers */
  atomic_ulong gen;      /* bumped for each job (published after the job's fields) */
  atomic_int quit;
  /* current job: items are claimed from ticket = (total << 32 | next item),
   * reset whole by each job, so a claim is always of the job whose fields
   * are published (a late worker's claim on a finished job gets next >=
   * total; on a new job, a real item of it). The caller waits for items
   * done, not for workers: a worker the OS has descheduled (another busy
   * process on the cores) holds up nothing it has not started, and the
   * caller runs the rest itself. */
  hpool_fn fn;
  void *ctx;
  int total;
  _Alignas(64) atomic_uint_fast64_t ticket;
  _Alignas(64) atomic_int done; /* items of the current job finished */
  atomic_int sleeping;   /* the caller waits on `done_cv` */
};

int hpool_cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

static long elapsed_ns(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (t.tv_sec - t0->tv_sec) * 1000000000L + (t.tv_nsec - t0->tv_nsec);
}

/* Spins until cond(p, arg) holds or SPIN_NS pass; returns whether it holds. */
static int spin_until(hpool *p, int (*cond)(hpool *, unsigned long), unsigned long arg) {
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    for (int i = 0; i < 64; i++) {
      if (cond(p, arg)) return 1;
      cpu_relax();
    }
    long ns = elapsed_ns(&t0);
    if (ns > SPIN_NS) return cond(p, arg);
    if (ns > PAUSE_NS) sched_yield();
  }
}

static int job_posted(hpool *p, unsigned long seen) {
  return atomic_load_explicit(&p->gen, memory_order_acquire) != seen || atomic_load_explicit(&p->quit, memory_order_relaxed);
}

static int job_done(hpool *p, unsigned long total) {
  return atomic_load(&p->done) == (int)total; /* seq_cst: pairs with `sleeping` (see run_items) */
}

/* Claims and runs items of the current job until none is left. */
static void run_items(hpool *p, int tid) {
  for (;;) {
    uint_fast64_t t = atomic_fetch_add_explicit(&p->ticket, 1, memory_order_acq_rel);
    uint32_t i = (uint32_t)t, total = (uint32_t)(t >> 32);
    if (i >= total) return;
    /* item i is ours: its job cannot finish before it, so the fields are its job's */
    p->fn(p->ctx, (int)i, tid);
    if (atomic_fetch_add(&p->done, 1) + 1 == (int)total && atomic_load(&p->sleeping)) {
      pthread_mutex_lock(&p->mu);
      pthread_cond_signal(&p->done_cv);
      pthread_mutex_unlock(&p->mu);
    }
  }
}

typedef struct { hpool *p; int tid; } worker_arg;

static void *worker(void *arg) {
  worker_arg wa = *(worker_arg *)arg;
  free(arg);
  hpool *p = wa.p;
  unsigned long seen = 0;
  hpool_flush_begin(); /* a worker only computes: flushed for its life */
  for (;;) {
    if (!spin_until(p, job_posted, seen)) {
      pthread_mutex_lock(&p->mu);
      while (!job_posted(p, seen)) pthread_cond_wait(&p->start, &p->mu);
      pthread_mutex_unlock(&p->mu);
    }
    if (atomic_load(&p->quit)) return NULL;
    seen = atomic_load_explicit(&p->gen, memory_order_acquire);
    run_items(p, wa.tid);
  }
}

hpool *hpool_create(int nthreads) {
  if (nthreads <= 0) nthreads = hpool_cpu_count();
  hpool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n = nthreads;
  pthread_mutex_init(&p->mu, NULL);
  pthread_mutex_init(&p->run_mu, NULL);
  pthread_cond_init(&p->start, NULL);
  pthread_cond_init(&p->done_cv, NULL);
  p->threads = calloc(nthreads > 1 ? nthreads - 1 : 1, sizeof(pthread_t));
  if (!p->threads) {
    free(p);
    return NULL;
  }
  for (int t = 1; t < nthreads; t++) {
    worker_arg *wa = malloc(sizeof *wa);
    if (!wa) {
      p->n = t;
      break;
    }
    wa->p = p;
    wa->tid = t;
    if (pthread_create(&p->threads[t - 1], NULL, worker, wa) != 0) {
      free(wa);
      p->n = t;
      break;
    }
  }
  return p;
}

int hpool_size(const hpool *p) { return p ? p->n : 1; }

void hpool_for(hpool *p, int n, hpool_fn fn, void *ctx) {
  if (n <= 0) return;
  hpool_fpmode fp = hpool_flush_begin();
  if (!p || p->n == 1 || n == 1) {
    for (int i = 0; i < n; i++) fn(ctx, i, 0);
    hpool_flush_end(fp);
    return;
  }
  pthread_mutex_lock(&p->run_mu);
  p->fn = fn;
  p->ctx = ctx;
  p->total = n;
  atomic_store(&p->done, 0);
  atomic_store_explicit(&p->ticket, (uint_fast64_t)(uint32_t)n << 32, memory_order_release);
  atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
  /* wakes the workers that went to sleep (taking the lock after the bump
   * means none can be between its check and its wait) */
  pthread_mutex_lock(&p->mu);
  pthread_cond_broadcast(&p->start);
  pthread_mutex_unlock(&p->mu);
  run_items(p, 0);
  if (!spin_until(p, job_done, (unsigned long)n)) {
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->sleeping, 1);
    while (!job_done(p, (unsigned long)n)) pthread_cond_wait(&p->done_cv, &p->mu);
    atomic_store(&p->sleeping, 0);
    pthread_mutex_unlock(&p->mu);
  }
  pthread_mutex_unlock(&p->run_mu);
  hpool_flush_end(fp);
}

void hpool_destroy(hpool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->quit, 1);
  pthread_cond_broadcast(&p->start);
  pthread_mutex_unlock(&p->mu);
  for (int t = 1; t < p->n; t++) pthread_join(p->threads[t - 1], NULL);
  free(p->threads);
  pthread_mutex_destroy(&p->mu);
  pthread_mutex_destroy(&p->run_mu);
  pthread_cond_destroy(&p->start);
  pthread_cond_destroy(&p->done_cv);
  free(p);
}
