/* comm.h — collectives between the ranks of a tensor-parallel group: each
 * rank holds one bk_comm (its rank, the group's size) and calls the same
 * collectives in the same order on tensors of its own backend.
 *
 * Semantics (every implementation):
 *   all_reduce_sum  x (F32) becomes the elementwise sum of every rank's x;
 *                   every rank gets the same bits.
 *   all_gather      y [size * x.rows, x.cols] = every rank's x, rank r's at
 *                   rows [r * x.rows, (r + 1) * x.rows).
 *   broadcast       x becomes root's x.
 *   barrier         returns when every rank has called it.
 * Like backend ops, collectives are queued in order on the rank's stream
 * (the in-process one runs them at once, after the backend's queued work)
 * and a failure is recorded, not returned mid-forward: bk_comm_status
 * reports the first one. A rank that fails outside a collective calls
 * bk_comm_abort: every rank blocked in or later entering a collective of
 * the group returns with the abort's message instead of waiting for it, so
 * a failure stops the group instead of hanging it. An aborted group stays
 * aborted.
 *
 * Implementations:
 *   - in-process (comm.c): ranks are threads of one process whose tensors
 *     are in host memory (the CPU backend); pointers are exchanged through
 *     the group and each rank sums one slice of the elements, in rank order.
 *   - NCCL (cuda/comm_nccl.cu, in libhearth_cuda.so): ranks are GPUs of one
 *     process, one thread each; libnccl.so.2 is loaded at run time.
 */
#ifndef HEARTH_BACKEND_COMM_H
#define HEARTH_BACKEND_COMM_H

#include <stdbool.h>

#include "backend/backend.h"
#include "base/status.h"

typedef struct bk_comm bk_comm;

/* Ranks of one group at most. */
#define BK_COMM_MAX_RANKS 16

typedef struct bk_comm_ops {
  void (*all_reduce_sum)(bk_comm *c, const bk_tensor *x);
  void (*all_gather)(bk_comm *c, const bk_tensor *y, const bk_tensor *x);
  void (*broadcast)(bk_comm *c, const bk_tensor *x, int root);
  void (*barrier)(bk_comm *c);
  void (*abort)(bk_comm *c, const char *why);
  void (*free)(bk_comm *c); /* one rank's handle; the group goes with the last */
} bk_comm_ops;

/* Every implementation's rank handle starts with this. */
struct bk_comm {
  const bk_comm_ops *ops; /* borrowed (static) */
  int rank, size;
  herr err;               /* the first failure of this rank's collectives (code 0: none) */
  bool origin;            /* that failure was this rank's own (it aborted the group), not another's abort */
};

static inline int bk_comm_rank(const bk_comm *c) { return c->rank; }
static inline int bk_comm_size(const bk_comm *c) { return c->size; }
void bk_all_reduce_sum(bk_comm *c, const bk_tensor *x);
void bk_all_gather(bk_comm *c, const bk_tensor *y, const bk_tensor *x);
void bk_broadcast(bk_comm *c, const bk_tensor *x, int root);
void bk_barrier(bk_comm *c);
/* Stops the whole group (see above); why names the failure. */
void bk_comm_abort(bk_comm *c, const char *why);
/* The first failure recorded by this rank's collectives (and clears it). */
int bk_comm_status(bk_comm *c, herr *err);
void bk_comm_free(bk_comm *c);

/* n rank handles of one in-process group (out[0..n)), for ranks whose
 * tensors are in host memory. */
int bk_comm_inproc_new(int n, bk_comm **out, herr *err);
/* Testing: rank `rank`'s `nth` collective from now (1: the next) fails as a
 * rank failure does (it aborts the group). */
void bk_comm_inproc_fail_at(bk_comm *c, int nth);

/* n rank handles of one NCCL group over the CUDA backends bes[0..n) (one
 * GPU each, distinct), through the CUDA library's NCCL communicator
 * (libnccl.so.2, loaded at run time). NVLink multicast stays off
 * (NCCL_NVLS_ENABLE=0 unless the environment sets it). */
int bk_comm_nccl_new(bk_backend *const *bes, int n, bk_comm **out, herr *err);

/* The CUDA library's NCCL entry point (beside BK_CUDA_ENTRY). */
#define BK_CUDA_NCCL_ENTRY "hearth_cuda_nccl_open"
typedef int (*bk_cuda_nccl_fn)(int abi, bk_backend *const *bes, int n, bk_comm **out, herr *err);

#endif
