/* test_partial_backend.c — a backend that starts partial: a table with only
 * some entries (the CPU's, with entries taken out, and a supports_op that
 * says no to one it has). Ops with a host path run there and give what the
 * full backend gives, in order with the ops around them; one without is
 * refused at the next bk_sync with a message naming the op and the backend,
 * and leaves its output alone; bk_backend_require refuses such a backend up
 * front; sampling falls back to the host sampler. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "partial_backend.h"
#include "test.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float nrand(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 4.0 - 2.0);
}

static bool no_softcap(const bk_backend *be, bk_op op) { return (void)be, op != BK_OP_SOFTCAP; }

/* The CPU backend with rmsnorm, rope, sample and attention_rel taken out and softcap refused. */
static bk_backend_ops partial_ops;
static void strip(bk_backend_ops *t) {
  t->rmsnorm = NULL;
  t->rope = NULL;
  t->sample = NULL;
  t->attention_rel = NULL;
  t->supports_op = no_softcap;
}
static bk_backend *open_partial(void) {
  bk_backend *be = open_partial_cpu(&partial_ops, strip);
  if (be) be->is_cpu = false;
  return be;
}

static bk_backend *open_full(void) {
  bk_backend *be = NULL;
  herr err = {0};
  return bk_cpu_open(&(bk_open_opts){.threads = 2}, &be, &err) ? NULL : be;
}

static void fill(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = nrand();
}

static void test_supports(void) {
  bk_backend *full = open_full(), *part = open_partial();
  CHECK(full && part);
  if (!full || !part) return;
  for (int op = 0; op < BK_OP_COUNT; op++) {
    CHECK_MSG(bk_backend_supports(full, (bk_op)op), "the CPU lacks %s", bk_op_name((bk_op)op));
    CHECK(strcmp(bk_op_name((bk_op)op), "unknown") != 0);
    for (int o2 = 0; o2 < op; o2++) CHECK(strcmp(bk_op_name((bk_op)op), bk_op_name((bk_op)o2)) != 0);
  }
  CHECK(!bk_backend_supports(part, BK_OP_RMSNORM));
  CHECK(!bk_backend_supports(part, BK_OP_SOFTCAP)); /* has the entry, says no */
  CHECK(!bk_backend_supports(part, BK_OP_ATTENTION_REL));
  CHECK(bk_backend_supports(part, BK_OP_MATMUL));
  CHECK(bk_backend_supports(part, BK_OP_ADD));
  bk_backend_close(full);
  bk_backend_close(part);
}

/* rmsnorm (host), add (the backend), softcap (host), rope (host), in that order, on both backends. */
static void run_chain(bk_backend *be, const float *x, const float *w, const float *b, float *out, int64_t T, int64_t D) {
  herr err = {0};
  bk_tensor tx, tw, tb, ty, tp;
  CHECK(bk_tensor_new(be, BK_DT_F32, T, D, &tx, &err) == 0);
  CHECK(bk_tensor_new(be, BK_DT_F32, 1, D, &tw, &err) == 0);
  CHECK(bk_tensor_new(be, BK_DT_F32, T, D, &tb, &err) == 0);
  CHECK(bk_tensor_new(be, BK_DT_F32, T, D, &ty, &err) == 0);
  CHECK(bk_tensor_new(be, BK_DT_I32, T, 1, &tp, &err) == 0);
  int32_t pos[16];
  for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(3 + 2 * t);
  bk_set(&tx, 0, x, sizeof(float) * (size_t)(T * D), &err);
  bk_set(&tw, 0, w, sizeof(float) * (size_t)D, &err);
  bk_set(&tb, 0, b, sizeof(float) * (size_t)(T * D), &err);
  bk_set(&tp, 0, pos, sizeof(int32_t) * (size_t)T, &err);
  double inv[4] = {1.0, 0.1, 0.01, 0.001};
  rope_table rt = {.rot_dim = 8, .inv_freq = inv, .attn_scale = 1.0};
  bk_rmsnorm(&ty, &tx, &tw, 1e-6f, false);
  bk_add(&ty, &ty, &tb);
  bk_softcap(&ty, 1.5f);
  bk_rope(&ty, D / 8, 8, &tp, &rt);
  int rc = bk_sync(be, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  CHECK(bk_get(&ty, 0, out, sizeof(float) * (size_t)(T * D), &err) == 0);
  bk_tensor_free(&tx), bk_tensor_free(&tw), bk_tensor_free(&tb), bk_tensor_free(&ty), bk_tensor_free(&tp);
}

static void test_host_path(void) {
  enum { T = 5, D = 32 };
  float x[T * D], w[D], b[T * D], got[T * D], want[T * D];
  fill(x, T * D), fill(w, D), fill(b, T * D);
  bk_backend *full = open_full(), *part = open_partial();
  CHECK(full && part);
  if (!full || !part) return;
  run_chain(full, x, w, b, want, T, D);
  run_chain(part, x, w, b, got, T, D);
  int differ = 0;
  for (int i = 0; i < T * D; i++) differ += got[i] != want[i];
  CHECK_MSG(differ == 0, "%d of %d values differ from the full backend's", differ, T * D);
  bk_backend_close(full);
  bk_backend_close(part);
}

static void test_refused(void) {
  bk_backend *part = open_partial();
  CHECK(part != NULL);
  if (!part) return;
  herr err = {0};
  enum { T = 4, H = 1, HD = 8 };
  bk_tensor q, k, v, rel, out;
  CHECK(bk_tensor_new(part, BK_DT_F32, T, H * HD, &q, &err) == 0);
  CHECK(bk_tensor_new(part, BK_DT_F32, T, H * HD, &k, &err) == 0);
  CHECK(bk_tensor_new(part, BK_DT_F32, T, H * HD, &v, &err) == 0);
  CHECK(bk_tensor_new(part, BK_DT_F32, 3, H * HD, &rel, &err) == 0);
  CHECK(bk_tensor_new(part, BK_DT_F32, T, H * HD, &out, &err) == 0);
  float sentinel[T * H * HD];
  for (int i = 0; i < T * H * HD; i++) sentinel[i] = 42.0f;
  bk_set(&out, 0, sentinel, sizeof sentinel, &err);
  rel_attn_params p = {.n_heads = H, .head_dim = HD, .left = 1, .right = 1};
  bk_attention_rel(&out, &q, &k, &v, &rel, NULL, T, &p);
  int rc = bk_sync(part, &err);
  CHECK_EQ_INT(rc, HEARTH_EUNSUPPORTED);
  CHECK_MSG(strstr(err.msg, "'partial'") && strstr(err.msg, "'attention_rel'"), "message: %s", err.msg);
  herr again = {0};
  CHECK_EQ_INT(bk_sync(part, &again), 0); /* reported once */
  float back[T * H * HD];
  CHECK(bk_get(&out, 0, back, sizeof back, &err) == 0);
  CHECK(memcmp(back, sentinel, sizeof back) == 0);
  /* bk_get reports a refusal too */
  bk_attention_rel(&out, &q, &k, &v, &rel, NULL, T, &p);
  herr e2 = {0};
  CHECK_EQ_INT(bk_get(&out, 0, back, sizeof back, &e2), HEARTH_EUNSUPPORTED);
  CHECK(strstr(e2.msg, "attention_rel") != NULL);
  bk_tensor_free(&q), bk_tensor_free(&k), bk_tensor_free(&v), bk_tensor_free(&rel), bk_tensor_free(&out);
  bk_backend_close(part);
}

static void test_require(void) {
  bk_backend *part = open_partial();
  CHECK(part != NULL);
  if (!part) return;
  herr err = {0};
  CHECK_EQ_INT(bk_backend_require_core(part, &err), 0);
  bk_op host_ok[] = {BK_OP_RMSNORM, BK_OP_SOFTCAP, BK_OP_SAMPLE, BK_OP_ROPE};
  CHECK_EQ_INT(bk_backend_require(part, host_ok, 4, &err), 0);
  bk_op needs[] = {BK_OP_MATMUL, BK_OP_ATTENTION_REL};
  CHECK_EQ_INT(bk_backend_require(part, needs, 2, &err), HEARTH_EUNSUPPORTED);
  CHECK_MSG(strstr(err.msg, "'partial'") && strstr(err.msg, "'attention_rel'"), "message: %s", err.msg);
  partial_ops.attention = NULL;
  herr e2 = {0};
  CHECK_EQ_INT(bk_backend_require_core(part, &e2), HEARTH_EUNSUPPORTED);
  CHECK_MSG(strstr(e2.msg, "'partial'") && strstr(e2.msg, "'attention'"), "message: %s", e2.msg);
  int (*sync)(bk_backend *, herr *) = partial_ops.sync;
  partial_ops.sync = NULL;
  herr e3 = {0};
  CHECK_EQ_INT(bk_backend_require(part, NULL, 0, &e3), HEARTH_EUNSUPPORTED);
  CHECK_MSG(strstr(e3.msg, "'sync'") != NULL, "message: %s", e3.msg);
  partial_ops.sync = sync;
  bk_backend_close(part);
}

/* Greedy and sampled rows, with logprobs and a penalty: the host sampler gives what the CPU's gives. */
static void test_sample(void) {
  enum { R = 3, V = 200 };
  float logits[R * V];
  fill(logits, R * V);
  bk_sample_row rows[R] = {
      {.temperature = 0, .logprobs = 1, .top_logprobs = 3},
      {.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .u = 0.37, .logprobs = 1, .pen_off = 0, .n_pen = 1},
      {.temperature = 1.2f, .min_p = 0.05f, .u = 0.81, .top_logprobs = 5},
  };
  bk_sample_adj adj[1] = {{.id = 7, .rep = 1.3f, .sub = 0.5f}};
  bk_sample_out got[R], want[R];
  bk_backend *full = open_full(), *part = open_partial();
  CHECK(full && part);
  if (!full || !part) return;
  bk_backend *bes[2] = {full, part};
  bk_sample_out *outs[2] = {want, got};
  for (int i = 0; i < 2; i++) {
    herr err = {0};
    bk_tensor t;
    CHECK(bk_tensor_new(bes[i], BK_DT_F32, R, V, &t, &err) == 0);
    bk_set(&t, 0, logits, sizeof logits, &err);
    memset(outs[i], 0, sizeof(bk_sample_out) * R);
    int rc = bk_sample(&t, rows, adj, 1, outs[i], &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    bk_tensor_free(&t);
  }
  for (int r = 0; r < R; r++) {
    CHECK_EQ_INT(got[r].id, want[r].id);
    CHECK(got[r].id >= 0);
    CHECK(got[r].logprob == want[r].logprob);
    CHECK_EQ_INT(got[r].n_top, want[r].n_top);
    for (int j = 0; j < got[r].n_top && j < BK_SAMPLE_MAX_TOP; j++) CHECK_EQ_INT(got[r].top_ids[j], want[r].top_ids[j]);
  }
  bk_backend_close(full);
  bk_backend_close(part);
}

int main(void) {
  RUN(test_supports);
  RUN(test_host_path);
  RUN(test_refused);
  RUN(test_sample);
  RUN(test_require);
  TEST_MAIN_END();
}
