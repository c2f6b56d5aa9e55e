/* comm_nccl.cu — the NCCL communicator (backend/comm.h) between CUDA ranks
 * of one process: libnccl.so.2 loaded at run time (HEARTH_NCCL_LIB, else
 * the loader's search), so the library builds and runs without NCCL where
 * no group is asked for; one ncclCommInitAll over the ranks' devices; each
 * collective queued on its rank's stream. An abort marks the group and
 * aborts every rank's NCCL communicator, so ranks waiting on the device for
 * a peer that failed return instead of spinning; later collectives record
 * the abort's message without touching NCCL. The handful of NCCL functions
 * used are declared here (their C ABI, NCCL 2.x). Internal to
 * libhearth_cuda.so but for its entry point hearth_cuda_nccl_open. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "backend/comm.h"
}

typedef struct nccl_comm_s *nccl_comm_t;
enum { NCCL_OK = 0, NCCL_IN_PROGRESS = 7, NCCL_FLOAT32 = 7, NCCL_SUM = 0 };

typedef struct nccl_api {
  void *lib;
  int (*init_all)(nccl_comm_t *comms, int ndev, const int *devlist);
  int (*all_reduce)(const void *send, void *recv, size_t count, int dt, int op, nccl_comm_t c, cudaStream_t s);
  int (*all_gather)(const void *send, void *recv, size_t count, int dt, nccl_comm_t c, cudaStream_t s);
  int (*broadcast)(const void *send, void *recv, size_t count, int dt, int root, nccl_comm_t c, cudaStream_t s);
  int (*abort)(nccl_comm_t c);
  int (*destroy)(nccl_comm_t c);
  int (*async_error)(nccl_comm_t c, int *result);
  const char *(*error_string)(int result);
  int (*version)(int *v);
} nccl_api;

typedef struct nccl_group {
  nccl_api api;
  pthread_mutex_t mu;
  int size, refs;
  bool aborted;
  char why[200];
  nccl_comm_t comms[BK_COMM_MAX_RANKS];  /* NULL once aborted or freed */
  cu_backend *bes[BK_COMM_MAX_RANKS];    /* borrowed */
  float *one[BK_COMM_MAX_RANKS];         /* owned: a float on each device (barrier) */
} nccl_group;

typedef struct nccl_rank {
  bk_comm base; /* must be first */
  nccl_group *g;
} nccl_rank;

static nccl_group *group_of(bk_comm *c) { return ((nccl_rank *)c)->g; }

static void record(bk_comm *c, const char *what, const char *msg) {
  if (!c->err.code) herr_set(&c->err, HEARTH_EIO, "tensor-parallel rank %d: NCCL %s: %s", c->rank, what, msg);
}

static void group_abort(nccl_group *g, const char *why) {
  pthread_mutex_lock(&g->mu);
  if (!g->aborted) {
    g->aborted = true;
    snprintf(g->why, sizeof g->why, "%.199s", why && why[0] ? why : "a rank failed");
    for (int r = 0; r < g->size; r++)
      if (g->comms[r]) {
        g->api.abort(g->comms[r]);
        g->comms[r] = NULL;
      }
  }
  pthread_mutex_unlock(&g->mu);
}

/* The rank's communicator and stream, its device current; NULL (recorded) once the group is aborted. */
static nccl_comm_t begin(bk_comm *c, const char *what, cudaStream_t *stream) {
  nccl_group *g = group_of(c);
  if (c->err.code) return NULL;
  pthread_mutex_lock(&g->mu);
  nccl_comm_t comm = g->aborted ? NULL : g->comms[c->rank];
  pthread_mutex_unlock(&g->mu);
  if (!comm) {
    record(c, what, g->why[0] ? g->why : "the group was stopped");
    return NULL;
  }
  cu_backend *b = g->bes[c->rank];
  cudaSetDevice(b->device);
  *stream = b->stream;
  return comm;
}

static void end(bk_comm *c, const char *what, int rc) {
  nccl_group *g = group_of(c);
  if (rc == NCCL_OK || rc == NCCL_IN_PROGRESS) return;
  record(c, what, g->api.error_string ? g->api.error_string(rc) : "failed");
  c->origin = true;
  group_abort(g, c->err.msg);
}

static void nccl_all_reduce(bk_comm *c, const bk_tensor *x) {
  cudaStream_t s;
  nccl_comm_t comm = begin(c, "all_reduce", &s);
  if (!comm) return;
  end(c, "all_reduce", group_of(c)->api.all_reduce(bk_addr(x), bk_addr(x), (size_t)bk_nelem(x), NCCL_FLOAT32, NCCL_SUM, comm, s));
}

static void nccl_all_gather(bk_comm *c, const bk_tensor *y, const bk_tensor *x) {
  cudaStream_t s;
  nccl_comm_t comm = begin(c, "all_gather", &s);
  if (!comm) return;
  if (bk_nelem(y) != bk_nelem(x) * c->size) {
    record(c, "all_gather", "the output is not size times the input");
    return;
  }
  end(c, "all_gather", group_of(c)->api.all_gather(bk_addr(x), bk_addr(y), (size_t)bk_nelem(x), NCCL_FLOAT32, comm, s));
}

static void nccl_broadcast(bk_comm *c, const bk_tensor *x, int root) {
  cudaStream_t s;
  nccl_comm_t comm = begin(c, "broadcast", &s);
  if (!comm) return;
  end(c, "broadcast", group_of(c)->api.broadcast(bk_addr(x), bk_addr(x), (size_t)bk_nelem(x), NCCL_FLOAT32, root, comm, s));
}

/* A one-float all-reduce, waited for: every rank has reached it. */
static void nccl_barrier(bk_comm *c) {
  cudaStream_t s;
  nccl_group *g = group_of(c);
  nccl_comm_t comm = begin(c, "barrier", &s);
  if (!comm) return;
  int rc = g->api.all_reduce(g->one[c->rank], g->one[c->rank], 1, NCCL_FLOAT32, NCCL_SUM, comm, s);
  end(c, "barrier", rc);
  if (rc != NCCL_OK) return;
  cudaError_t e = cudaStreamSynchronize(s);
  int async = NCCL_OK;
  if (e != cudaSuccess) record(c, "barrier", cudaGetErrorString(e));
  else if (g->api.async_error && g->api.async_error(comm, &async) == NCCL_OK && async != NCCL_OK && async != NCCL_IN_PROGRESS)
    end(c, "barrier", async);
}

static void nccl_abort(bk_comm *c, const char *why) { group_abort(group_of(c), why); }

static void nccl_free(bk_comm *c) {
  nccl_group *g = group_of(c);
  pthread_mutex_lock(&g->mu);
  bool last = --g->refs == 0;
  pthread_mutex_unlock(&g->mu);
  if (last) {
    for (int r = 0; r < g->size; r++) {
      if (g->comms[r]) g->api.destroy(g->comms[r]);
      if (g->one[r]) {
        cudaSetDevice(g->bes[r]->device);
        cudaFree(g->one[r]);
      }
    }
    if (g->api.lib) dlclose(g->api.lib);
    pthread_mutex_destroy(&g->mu);
    free(g);
  }
  free(c);
}

static const bk_comm_ops nccl_ops = {nccl_all_reduce, nccl_all_gather, nccl_broadcast, nccl_barrier, nccl_abort, nccl_free};

static int load_api(nccl_api *a, herr *err) {
  const char *env = getenv("HEARTH_NCCL_LIB"); /* when set, that file only */
  const char *cand[] = {env && env[0] ? env : "libnccl.so.2", env && env[0] ? NULL : "libnccl.so"};
  for (size_t i = 0; i < sizeof cand / sizeof cand[0] && !a->lib; i++)
    if (cand[i]) a->lib = dlopen(cand[i], RTLD_NOW | RTLD_LOCAL);
  if (!a->lib)
    return herr_set(err, HEARTH_EUNSUPPORTED, "tensor parallelism on GPUs needs NCCL: %s could not be loaded (%s)%s",
                    cand[0], dlerror(), env && env[0] ? "" : "; HEARTH_NCCL_LIB may name the file");
#define SYM(field, name)                                                                                          \
  if (!(*(void **)&a->field = dlsym(a->lib, name)))                                                              \
    return herr_set(err, HEARTH_EUNSUPPORTED, "libnccl.so.2 lacks %s (NCCL 2.x is needed)", name);
  SYM(init_all, "ncclCommInitAll");
  SYM(all_reduce, "ncclAllReduce");
  SYM(all_gather, "ncclAllGather");
  SYM(broadcast, "ncclBroadcast");
  SYM(abort, "ncclCommAbort");
  SYM(destroy, "ncclCommDestroy");
  SYM(error_string, "ncclGetErrorString");
  SYM(version, "ncclGetVersion");
#undef SYM
  *(void **)&a->async_error = dlsym(a->lib, "ncclCommGetAsyncError"); /* optional */
  return 0;
}

extern "C" __attribute__((visibility("default"))) int hearth_cuda_nccl_open(int abi, bk_backend *const *bes, int n, bk_comm **out,
                                                                            herr *err) {
  if (abi != BK_CUDA_ABI)
    return herr_set(err, HEARTH_EUNSUPPORTED, "libhearth_cuda.so speaks backend ABI %d but the program asked for %d", BK_CUDA_ABI, abi);
  if (n < 1 || n > BK_COMM_MAX_RANKS) return herr_set(err, HEARTH_EINVAL, "an NCCL group of %d ranks is out of range (1..%d)", n, BK_COMM_MAX_RANKS);
  nccl_group *g = (nccl_group *)calloc(1, sizeof *g);
  if (!g) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  pthread_mutex_init(&g->mu, NULL);
  g->size = n;
  int devs[BK_COMM_MAX_RANKS];
  int rc = load_api(&g->api, err);
  for (int r = 0; !rc && r < n; r++) {
    g->bes[r] = cu_be(bes[r]);
    devs[r] = g->bes[r]->device;
    for (int q = 0; q < r; q++)
      if (devs[q] == devs[r]) rc = herr_set(err, HEARTH_EINVAL, "ranks %d and %d are both on cuda:%d", q, r, devs[r]);
    if (!rc) {
      cudaSetDevice(devs[r]);
      if (cudaMalloc(&g->one[r], sizeof(float)) != cudaSuccess || cudaMemset(g->one[r], 0, sizeof(float)) != cudaSuccess)
        rc = herr_set(err, HEARTH_ENOMEM, "cuda:%d: no memory for the communicator", devs[r]);
    }
  }
  if (!rc) {
    int e = g->api.init_all(g->comms, n, devs);
    if (e != NCCL_OK) rc = herr_set(err, HEARTH_EIO, "ncclCommInitAll over %d GPUs: %s", n, g->api.error_string(e));
  }
  if (rc) {
    for (int r = 0; r < n; r++)
      if (g->one[r]) {
        cudaSetDevice(devs[r]);
        cudaFree(g->one[r]);
      }
    if (g->api.lib) dlclose(g->api.lib);
    pthread_mutex_destroy(&g->mu);
    free(g);
    return rc;
  }
  for (int r = 0; r < n; r++) {
    nccl_rank *c = (nccl_rank *)calloc(1, sizeof *c);
    if (!c) { /* the ranks made so far go; the group with the last of them */
      for (int q = 0; q < r; q++) nccl_free(out[q]);
      if (r == 0) {
        for (int q = 0; q < n; q++) g->api.destroy(g->comms[q]);
        free(g);
      }
      return herr_set(err, HEARTH_ENOMEM, "out of memory");
    }
    c->base.ops = &nccl_ops;
    c->base.rank = r;
    c->base.size = n;
    c->g = g;
    g->refs++;
    out[r] = &c->base;
  }
  int v = 0;
  g->api.version(&v);
  fprintf(stderr, "hearth: NCCL %d.%d.%d: a group of %d GPUs (cuda:%d..cuda:%d), NCCL_NVLS_ENABLE=%s\n", v / 10000, v / 100 % 100,
          v % 100, n, devs[0], devs[n - 1], getenv("NCCL_NVLS_ENABLE") ? getenv("NCCL_NVLS_ENABLE") : "(unset)");
  return 0;
}
