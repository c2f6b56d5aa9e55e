/* test_partial_backend.c — the built-in model (models/default, llama) on a
 * backend that starts partial: the CPU's table without rmsnorm, rope,
 * act_mul, add and sample. Those run on the host (backend.h's host paths)
 * and every step's logits and greedy tokens are the full CPU backend's; a
 * backend without attention, which has no host path, is refused when the
 * model loads, with a message naming the op and the backend. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/kv_cache.h"
#include "model/model.h"
#include "partial_backend.h"
#include "test.h"

#define MODEL HEARTH_SOURCE_DIR "/models/default"

static bk_backend_ops partial_ops;

static void strip_host_paths(bk_backend_ops *t) {
  t->rmsnorm = NULL;
  t->rope = NULL;
  t->act_mul = NULL;
  t->add = NULL;
  t->sample = NULL;
}
static void strip_attention(bk_backend_ops *t) {
  strip_host_paths(t);
  t->attention = NULL;
}

static bk_backend *open_partial(bool without_attention) {
  return open_partial_cpu(&partial_ops, without_attention ? strip_attention : strip_host_paths);
}

/* Four greedy steps of the model on be (NULL: its own CPU backend): each step's logits into logits[step], the
 * tokens into ids. */
static int run(bk_backend *be, float **logits, int32_t *ids, int64_t *vocab) {
  herr err = {0};
  model *m = NULL;
  int rc = model_load(MODEL, &(model_load_opts){.threads = 2, .backend = be}, &m, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (rc) return rc;
  int64_t V = *vocab = model_vocab_size(m);
  model_kv_geometry geo;
  model_kv_geometry_of(m, &geo);
  kv_cache *cache = NULL;
  kv_seq *s = NULL;
  CHECK(kv_cache_new(&geo, 64, &cache, &err) == 0);
  CHECK(kv_cache_seq_new(cache, &s, &err) == 0);
  int32_t prompt[4] = {1, 415, 1522, 302};
  int32_t tok = 0;
  for (int step = 0; step < 4 && !rc; step++) {
    model_seq sq = step == 0 ? (model_seq){.kv = s, .tokens = prompt, .n_tokens = 4, .out = MODEL_OUT_LOGITS_HOST}
                             : (model_seq){.kv = s, .tokens = &tok, .n_tokens = 1, .out = MODEL_OUT_LOGITS_HOST};
    logits[step] = malloc(sizeof(float) * (size_t)V);
    sq.dest = logits[step];
    model_batch b = {&sq, 1};
    bk_sample_row row = {.temperature = 0};
    bk_sample_out out = {0};
    rc = model_forward_sample(m, &b, &row, NULL, 0, &out, &err);
    CHECK_MSG(rc == 0, "step %d: %s", step, err.msg);
    ids[step] = tok = out.id;
  }
  kv_cache_seq_free(s);
  kv_cache_free(cache);
  model_free(m);
  return rc;
}

static void test_host_paths_match(void) {
  bk_backend *part = open_partial(false);
  CHECK(part != NULL);
  if (!part) return;
  float *want[4] = {0}, *got[4] = {0};
  int32_t want_ids[4] = {0}, got_ids[4] = {-1, -1, -1, -1};
  int64_t V = 0, V2 = 0;
  int rc = run(NULL, want, want_ids, &V);
  if (!rc) rc = run(part, got, got_ids, &V2);
  if (!rc) {
    CHECK_EQ_INT(V, V2);
    for (int step = 0; step < 4; step++) {
      CHECK_EQ_INT(got_ids[step], want_ids[step]);
      double worst = 0;
      for (int64_t i = 0; i < V; i++) {
        double d = fabs((double)got[step][i] - want[step][i]);
        if (!(d <= worst)) worst = d; /* NaN stays */
      }
      CHECK_MSG(worst <= 1e-4, "step %d: logits differ by %g from the full backend's", step, worst);
    }
  }
  for (int i = 0; i < 4; i++) free(want[i]), free(got[i]);
  bk_backend_close(part);
}

static void test_refused_at_load(void) {
  bk_backend *part = open_partial(true);
  CHECK(part != NULL);
  if (!part) return;
  herr err = {0};
  model *m = NULL;
  int rc = model_load(MODEL, &(model_load_opts){.threads = 2, .backend = part}, &m, &err);
  CHECK_EQ_INT(rc, HEARTH_EUNSUPPORTED);
  CHECK(m == NULL);
  CHECK_MSG(strstr(err.msg, "'partial'") && strstr(err.msg, "'attention'"), "message: %s", err.msg);
  model_free(m);
  bk_backend_close(part);
}

int main(void) {
  RUN(test_host_paths_match);
  RUN(test_refused_at_load);
  TEST_MAIN_END();
}
