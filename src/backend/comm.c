/* comm.c — the collectives' dispatch (comm.h), the in-process communicator
 * (ranks are threads whose tensors are in host memory: pointers meet in the
 * group, each rank sums one slice of the elements over every rank in rank
 * order and writes it back to all, so every rank ends with the same bits),
 * and the NCCL communicator's entry into the CUDA library. Knows nothing of
 * models. */
#include "backend/comm.h"

#include <dlfcn.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

void bk_all_reduce_sum(bk_comm *c, const bk_tensor *x) { c->ops->all_reduce_sum(c, x); }
void bk_all_gather(bk_comm *c, const bk_tensor *y, const bk_tensor *x) { c->ops->all_gather(c, y, x); }
void bk_broadcast(bk_comm *c, const bk_tensor *x, int root) { c->ops->broadcast(c, x, root); }
void bk_barrier(bk_comm *c) { c->ops->barrier(c); }
void bk_comm_abort(bk_comm *c, const char *why) { c->ops->abort(c, why); }
void bk_comm_free(bk_comm *c) {
  if (c) c->ops->free(c);
}

int bk_comm_status(bk_comm *c, herr *err) {
  int rc = c->err.code;
  if (rc && err) *err = c->err;
  herr_clear(&c->err);
  c->origin = false;
  return rc;
}

/* ---- in-process ---- */

typedef struct inproc_group {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int size, refs;
  int arrived;              /* ranks at the current barrier */
  unsigned long gen;        /* barriers completed */
  bool aborted;
  char why[200];            /* the abort's message */
  void **ptr;               /* [size] each rank's published address */
  int64_t *n;               /* [size] its element count */
} inproc_group;

typedef struct inproc_comm {
  bk_comm base;             /* must be first */
  inproc_group *g;          /* shared */
  int fail_in;              /* testing: the fail_in-th collective from now fails (0: none) */
} inproc_comm;

static void record(bk_comm *c, const char *what) {
  inproc_comm *ic = (inproc_comm *)c;
  if (!c->err.code)
    herr_set(&c->err, HEARTH_EIO, "tensor-parallel rank %d: %s: %s", c->rank, what, ic->g->why[0] ? ic->g->why : "the group was stopped");
}

static void group_abort(inproc_group *g, const char *why) {
  pthread_mutex_lock(&g->mu);
  if (!g->aborted) {
    g->aborted = true;
    snprintf(g->why, sizeof g->why, "%s", why && why[0] ? why : "a rank failed");
  }
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* Waits for every rank; false when the group is (or becomes) aborted. */
static bool group_wait(inproc_group *g) {
  pthread_mutex_lock(&g->mu);
  if (g->aborted) {
    pthread_mutex_unlock(&g->mu);
    return false;
  }
  unsigned long gen = g->gen;
  if (++g->arrived == g->size) {
    g->arrived = 0;
    g->gen++;
    pthread_cond_broadcast(&g->cv);
  } else {
    while (gen == g->gen && !g->aborted) pthread_cond_wait(&g->cv, &g->mu);
  }
  bool ok = gen != g->gen; /* completed, even if an abort came right after */
  pthread_mutex_unlock(&g->mu);
  return ok;
}

/* Before a collective: the backend's queued work is done, no earlier failure, no injected one. */
static bool enter(bk_comm *c, const bk_tensor *x, const char *what) {
  inproc_comm *ic = (inproc_comm *)c;
  if (c->err.code) return false; /* a failed rank takes part in nothing more until its status is read */
  if (ic->fail_in > 0 && --ic->fail_in == 0) {
    char why[120];
    snprintf(why, sizeof why, "rank %d failed (injected) at %s", c->rank, what);
    group_abort(ic->g, why);
    record(c, what);
    c->origin = true;
    return false;
  }
  herr e = {0};
  if (x && bk_sync(x->buf->be, &e)) {
    char why[200];
    snprintf(why, sizeof why, "rank %d failed: %s", c->rank, e.msg);
    group_abort(ic->g, why);
    c->err = e;
    c->origin = true;
    return false;
  }
  return true;
}

/* Publishes p / n and waits for every rank's. */
static bool publish(bk_comm *c, void *p, int64_t n, const char *what) {
  inproc_group *g = ((inproc_comm *)c)->g;
  g->ptr[c->rank] = p;
  g->n[c->rank] = n;
  if (!group_wait(g)) {
    record(c, what);
    return false;
  }
  return true;
}

static void finish(bk_comm *c, const char *what) {
  if (!group_wait(((inproc_comm *)c)->g)) record(c, what);
}

static void inproc_all_reduce(bk_comm *c, const bk_tensor *x) {
  static const char what[] = "all_reduce";
  if (!enter(c, x, what)) return;
  int64_t n = bk_nelem(x);
  if (!publish(c, bk_addr(x), n, what)) return;
  inproc_group *g = ((inproc_comm *)c)->g;
  for (int r = 0; r < g->size; r++)
    if (g->n[r] != n) {
      char why[160];
      snprintf(why, sizeof why, "all_reduce of %lld elements on rank %d but %lld on rank %d", (long long)n, c->rank,
               (long long)g->n[r], r);
      group_abort(g, why);
      record(c, what);
      return;
    }
  int64_t lo = n * c->rank / g->size, hi = n * (c->rank + 1) / g->size;
  for (int64_t i = lo; i < hi; i++) {
    float s = 0.0f;
    for (int r = 0; r < g->size; r++) s += ((const float *)g->ptr[r])[i];
    for (int r = 0; r < g->size; r++) ((float *)g->ptr[r])[i] = s;
  }
  finish(c, what);
}

static void inproc_all_gather(bk_comm *c, const bk_tensor *y, const bk_tensor *x) {
  static const char what[] = "all_gather";
  if (!enter(c, x, what)) return;
  inproc_group *g = ((inproc_comm *)c)->g;
  int64_t n = bk_nelem(x);
  if (bk_nelem(y) != n * g->size || y->buf->be != x->buf->be) {
    group_abort(g, "all_gather: the output is not size times the input");
    record(c, what);
    return;
  }
  if (!publish(c, bk_addr(x), n, what)) return;
  for (int r = 0; r < g->size; r++)
    if (g->n[r] != n) {
      group_abort(g, "all_gather: ranks give different sizes");
      record(c, what);
      return;
    }
  for (int r = 0; r < g->size; r++) memcpy((float *)bk_addr(y) + r * n, g->ptr[r], (size_t)n * sizeof(float));
  finish(c, what);
}

static void inproc_broadcast(bk_comm *c, const bk_tensor *x, int root) {
  static const char what[] = "broadcast";
  if (!enter(c, x, what)) return;
  inproc_group *g = ((inproc_comm *)c)->g;
  int64_t n = bk_nelem(x);
  if (!publish(c, bk_addr(x), n, what)) return;
  if (root < 0 || root >= g->size || g->n[root] != n) {
    group_abort(g, "broadcast: no such root, or ranks give different sizes");
    record(c, what);
    return;
  }
  if (c->rank != root) memcpy(bk_addr(x), g->ptr[root], (size_t)n * sizeof(float));
  finish(c, what);
}

static void inproc_barrier(bk_comm *c) {
  if (!enter(c, NULL, "barrier")) return;
  if (!group_wait(((inproc_comm *)c)->g)) record(c, "barrier");
}

static void inproc_abort(bk_comm *c, const char *why) { group_abort(((inproc_comm *)c)->g, why); }

static void inproc_free(bk_comm *c) {
  inproc_group *g = ((inproc_comm *)c)->g;
  pthread_mutex_lock(&g->mu);
  bool last = --g->refs == 0;
  pthread_mutex_unlock(&g->mu);
  if (last) {
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->ptr);
    free(g->n);
    free(g);
  }
  free(c);
}

static const bk_comm_ops inproc_ops = {inproc_all_reduce, inproc_all_gather, inproc_broadcast, inproc_barrier, inproc_abort,
                                       inproc_free};

int bk_comm_inproc_new(int n, bk_comm **out, herr *err) {
  if (n < 1 || n > 1024) return herr_set(err, HEARTH_EINVAL, "a communicator of %d ranks is out of range (1..1024)", n);
  inproc_group *g = calloc(1, sizeof *g);
  if (!g) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  g->ptr = calloc((size_t)n, sizeof *g->ptr);
  g->n = calloc((size_t)n, sizeof *g->n);
  if (!g->ptr || !g->n) {
    free(g->ptr);
    free(g->n);
    free(g);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  g->size = n;
  for (int r = 0; r < n; r++) {
    inproc_comm *c = calloc(1, sizeof *c);
    if (!c) {
      for (int i = 0; i < r; i++) inproc_free(out[i]);
      if (r == 0) {
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
        free(g->ptr);
        free(g->n);
        free(g);
      }
      return herr_set(err, HEARTH_ENOMEM, "out of memory");
    }
    c->base = (bk_comm){.ops = &inproc_ops, .rank = r, .size = n};
    c->g = g;
    g->refs++;
    out[r] = &c->base;
  }
  return 0;
}

void bk_comm_inproc_fail_at(bk_comm *c, int nth) {
  if (c->ops == &inproc_ops) ((inproc_comm *)c)->fail_in = nth;
}

/* ---- NCCL, in the CUDA library ---- */

int bk_comm_nccl_new(bk_backend *const *bes, int n, bk_comm **out, herr *err) {
  if (n < 1) return herr_set(err, HEARTH_EINVAL, "an NCCL communicator needs at least one GPU");
  for (int r = 0; r < n; r++)
    if (!bes[r] || bk_backend_is_cpu(bes[r]) || !bes[r]->lib)
      return herr_set(err, HEARTH_EINVAL, "an NCCL communicator runs between CUDA devices (rank %d is on %s)", r,
                      bes[r] ? bk_backend_name(bes[r]) : "nothing");
  bk_cuda_nccl_fn fn = (bk_cuda_nccl_fn)dlsym(bes[0]->lib, BK_CUDA_NCCL_ENTRY);
  if (!fn) return herr_set(err, HEARTH_EUNSUPPORTED, "the CUDA library has no NCCL communicator (%s): rebuild it", BK_CUDA_NCCL_ENTRY);
  if (!getenv("NCCL_NVLS_ENABLE")) setenv("NCCL_NVLS_ENABLE", "0", 0); /* NVLink multicast stays off unless asked for */
  return fn(BK_CUDA_ABI, bes, n, out, err);
}
