/* pool.c — parallel-for thread pool (see pool.h). Owns its worker threads;
 * knows nothing of what the work is. Workers take indices from an atomic
 * counter, so uneven items balance themselves. */
#include "base/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct hpool {
  int n;                 /* threads including the caller */
  pthread_t *threads;    /* owned: n - 1 workers */
  pthread_mutex_t mu;    /* guards the fields below */
  pthread_cond_t start, done;
  pthread_mutex_t run_mu;/* serialises hpool_for callers */
  unsigned long gen;     /* bumped for each job */
  int active;            /* workers still in the current job */
  int quit;
  /* current job */
  hpool_fn fn;
  void *ctx;
  int total;
  atomic_int next;
};

int hpool_cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

static void run_items(hpool *p, int tid) {
  for (;;) {
    int i = atomic_fetch_add(&p->next, 1);
    if (i >= p->total) break;
    p->fn(p->ctx, i, tid);
  }
}

typedef struct { hpool *p; int tid; } worker_arg;

static void *worker(void *arg) {
  worker_arg wa = *(worker_arg *)arg;
  free(arg);
  hpool *p = wa.p;
  unsigned long seen = 0;
  for (;;) {
    pthread_mutex_lock(&p->mu);
    while (!p->quit && p->gen == seen) pthread_cond_wait(&p->start, &p->mu);
    if (p->quit) {
      pthread_mutex_unlock(&p->mu);
      return NULL;
    }
    seen = p->gen;
    pthread_mutex_unlock(&p->mu);
    run_items(p, wa.tid);
    pthread_mutex_lock(&p->mu);
    if (--p->active == 0) pthread_cond_signal(&p->done);
    pthread_mutex_unlock(&p->mu);
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
  pthread_cond_init(&p->done, NULL);
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
  if (!p || p->n == 1 || n == 1) {
    for (int i = 0; i < n; i++) fn(ctx, i, 0);
    return;
  }
  pthread_mutex_lock(&p->run_mu);
  pthread_mutex_lock(&p->mu);
  p->fn = fn;
  p->ctx = ctx;
  p->total = n;
  atomic_store(&p->next, 0);
  p->active = p->n - 1;
  p->gen++;
  pthread_cond_broadcast(&p->start);
  pthread_mutex_unlock(&p->mu);
  run_items(p, 0);
  pthread_mutex_lock(&p->mu);
  while (p->active > 0) pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
  pthread_mutex_unlock(&p->run_mu);
}

void hpool_destroy(hpool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->quit = 1;
  pthread_cond_broadcast(&p->start);
  pthread_mutex_unlock(&p->mu);
  for (int t = 1; t < p->n; t++) pthread_join(p->threads[t - 1], NULL);
  free(p->threads);
  pthread_mutex_destroy(&p->mu);
  pthread_mutex_destroy(&p->run_mu);
  pthread_cond_destroy(&p->start);
  pthread_cond_destroy(&p->done);
  free(p);
}
