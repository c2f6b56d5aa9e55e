/* test_comm.c — the in-process communicator (backend/comm.h) between
 * threads on CPU backends: all-reduce gives every rank the same sum (the
 * ranks' values added in rank order), all-gather lays ranks out by rank,
 * broadcast copies the root's, a barrier holds every rank; sizes that
 * differ between ranks are a recorded error; an abort (or an injected
 * failure) wakes ranks waiting in a collective with the message instead of
 * leaving them waiting, and the group stays stopped. */
#include <pthread.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/comm.h"
#include "test.h"

#define N_MAX 4

typedef struct rank_ctx {
  bk_comm *c;
  bk_backend *be;
  int n_elems;
  int mode;          /* 0: the collectives; 1: a mismatched all-reduce; 2: rank 0 aborts, the others wait */
  int rc;
  herr err;
  float got_sum[37], got_gather[N_MAX * 5], got_bcast[6];
} rank_ctx;

static void *rank_main(void *arg) {
  rank_ctx *x = arg;
  int r = bk_comm_rank(x->c), n = bk_comm_size(x->c);
  bk_tensor a, g, y, b;
  bk_tensor_new(x->be, BK_DT_F32, 1, x->n_elems + (x->mode == 1 && r == 1), &a, NULL);
  bk_tensor_new(x->be, BK_DT_F32, 1, 5, &g, NULL);
  bk_tensor_new(x->be, BK_DT_F32, n, 5, &y, NULL);
  bk_tensor_new(x->be, BK_DT_F32, 1, 6, &b, NULL);
  float v[40], w[5], z[6];
  for (int i = 0; i < 40; i++) v[i] = (float)(r + 1) * 0.1f + (float)i;
  for (int i = 0; i < 5; i++) w[i] = (float)(10 * r + i);
  for (int i = 0; i < 6; i++) z[i] = (float)(100 * r + i);
  bk_set(&a, 0, v, bk_nbytes(&a), NULL);
  bk_set(&g, 0, w, sizeof w, NULL);
  bk_set(&b, 0, z, sizeof z, NULL);
  if (x->mode == 2) {
    if (r == 0) {
      bk_comm_abort(x->c, "rank 0 gave up");
    } else {
      bk_barrier(x->c); /* would wait for rank 0 forever without the abort */
    }
    bk_all_reduce_sum(x->c, &a);
  } else {
    bk_all_reduce_sum(x->c, &a);
    bk_all_gather(x->c, &y, &g);
    bk_broadcast(x->c, &b, n - 1);
    bk_barrier(x->c);
  }
  x->rc = bk_comm_status(x->c, &x->err);
  bk_get(&a, 0, x->got_sum, sizeof(float) * (size_t)x->n_elems, NULL);
  bk_get(&y, 0, x->got_gather, bk_nbytes(&y), NULL);
  bk_get(&b, 0, x->got_bcast, sizeof x->got_bcast, NULL);
  bk_tensor_free(&a);
  bk_tensor_free(&g);
  bk_tensor_free(&y);
  bk_tensor_free(&b);
  return NULL;
}

static void run(int n, int mode, rank_ctx *x) {
  bk_comm *c[N_MAX];
  herr e = {0};
  CHECK(bk_comm_inproc_new(n, c, &e) == 0);
  pthread_t th[N_MAX];
  for (int r = 0; r < n; r++) {
    memset(&x[r], 0, sizeof x[r]);
    x[r].c = c[r], x[r].n_elems = 37, x[r].mode = mode;
    CHECK(bk_cpu_open(&(bk_open_opts){.threads = 1}, &x[r].be, &e) == 0);
  }
  for (int r = 0; r < n; r++) pthread_create(&th[r], NULL, rank_main, &x[r]);
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < n; r++) {
    bk_comm_free(c[r]);
    bk_backend_close(x[r].be);
  }
}

static void test_collectives(void) {
  for (int n = 1; n <= N_MAX; n++) {
    rank_ctx x[N_MAX];
    run(n, 0, x);
    for (int r = 0; r < n; r++) {
      CHECK_MSG(x[r].rc == 0, "n=%d rank %d: %s", n, r, x[r].err.msg);
      for (int i = 0; i < 37; i++) {
        float s = 0;
        for (int k = 0; k < n; k++) s += (float)(k + 1) * 0.1f + (float)i;
        CHECK_MSG(x[r].got_sum[i] == s && !memcmp(&x[r].got_sum[i], &x[0].got_sum[i], 4), "n=%d rank %d element %d: %g vs %g", n,
                  r, i, x[r].got_sum[i], s);
      }
      for (int k = 0; k < n; k++)
        for (int i = 0; i < 5; i++) CHECK(x[r].got_gather[k * 5 + i] == (float)(10 * k + i));
      for (int i = 0; i < 6; i++) CHECK(x[r].got_bcast[i] == (float)(100 * (n - 1) + i));
    }
  }
}

static void test_mismatch(void) {
  rank_ctx x[3];
  run(3, 1, x);
  for (int r = 0; r < 3; r++) {
    CHECK(x[r].rc != 0);
    CHECK_MSG(strstr(x[r].err.msg, "all_reduce of"), "rank %d: %s", r, x[r].err.msg);
  }
}

static void test_abort_wakes(void) {
  rank_ctx x[4];
  run(4, 2, x);
  for (int r = 1; r < 4; r++) {
    CHECK(x[r].rc != 0);
    CHECK_MSG(strstr(x[r].err.msg, "rank 0 gave up"), "rank %d: %s", r, x[r].err.msg);
  }
}

int main(void) {
  RUN(test_collectives);
  RUN(test_mismatch);
  RUN(test_abort_wakes);
  TEST_MAIN_END();
}
