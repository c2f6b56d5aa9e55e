/* test_expert_budget.c — expert offload: a mixture of experts loaded with
 * an expert budget smaller than one layer's experts gives exactly the
 * logits of the model with every expert resident (prefill in one piece and
 * in chunks, then decode), reads experts in and gives them back as it goes
 * (page-ins beyond the number of distinct experts), and never keeps more
 * than the budget between layers; a bad budget is refused by name. On the
 * device HEARTH_TEST_DEVICE names when set (tools/gpu_check.sh: cuda). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "engine/kv_cache.h"
#include "model/model.h"
#include "test.h"
#include "test_device.h"

#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden/"

/* prompt 1 of the fixture, all logits, fed in chunks of `chunk` (0: one piece), then 4 decode steps */
static int run(model *m, const int32_t *toks, int n, int chunk, float *out) {
  herr err = {0};
  model_kv_geometry geo;
  model_kv_geometry_of(m, &geo);
  kv_cache *c = NULL;
  kv_seq *s = NULL;
  if (kv_cache_new(&geo, 0, &c, &err) || kv_cache_seq_new(c, &s, &err)) return -1;
  int64_t V = model_vocab_size(m);
  int rc = 0;
  for (int i = 0; i < n && !rc;) {
    int k = chunk > 0 && n - i > chunk ? chunk : n - i;
    model_seq sq = {.kv = s, .tokens = toks + i, .n_tokens = k, .all_logits = true};
    model_batch b = {&sq, 1};
    rc = model_forward(m, &b, out + (size_t)i * V, &err);
    i += k;
  }
  for (int d = 0; d < 4 && !rc; d++) {
    model_seq sq = {.kv = s, .tokens = toks + d, .n_tokens = 1};
    model_batch b = {&sq, 1};
    rc = model_forward(m, &b, out + (size_t)(n + d) * V, &err);
  }
  if (rc) fprintf(stderr, "forward: %s\n", err.msg);
  kv_cache_seq_free(s);
  kv_cache_free(c);
  return rc;
}

static void check_budget(const char *name) {
  char dir[512], gp[600];
  snprintf(dir, sizeof dir, GOLDEN "%s", name);
  snprintf(gp, sizeof gp, "%s/golden.json", dir);
  herr err = {0};
  json_t *doc = hjson_load_file(gp, &err);
  CHECK_MSG(doc != NULL, "%s", err.msg);
  if (!doc) return;
  json_t *p1 = json_array_get(json_object_get(doc, "prompts"), 1);
  int n = (int)json_array_size(p1);
  int32_t toks[64];
  for (int i = 0; i < n && i < 64; i++) toks[i] = (int32_t)json_integer_value(json_array_get(p1, i));
  model *all = NULL, *few = NULL;
  CHECK(model_load(dir, &(model_load_opts){.threads = 2, .device = test_device()}, &all, &err) == 0);
  const model_config *c = all ? model_cfg(all) : NULL;
  int64_t total = all ? model_expert_bytes(all) : 0;
  int64_t layers_moe = 0;
  for (int64_t l = 0; c && l < c->num_hidden_layers; l++) layers_moe += c->moe_layer[l];
  CHECK(total > 0 && layers_moe > 0);
  /* two experts' worth: less than one layer's experts */
  int64_t per_expert = layers_moe && c ? total / (layers_moe * c->num_experts) : 0, budget = 2 * per_expert + per_expert / 2;
  CHECK(budget < total / (layers_moe ? layers_moe : 1));
  CHECK_MSG(model_load(dir, &(model_load_opts){.threads = 2, .device = test_device(), .expert_budget = budget}, &few, &err) == 0, "%s", err.msg);
  if (all && few) {
    model_expert_stats xs;
    model_expert_stats_of(few, &xs);
    CHECK_EQ_INT(xs.budget, budget);
    CHECK_EQ_INT(xs.total, total);
    CHECK_EQ_INT(xs.resident, 0); /* nothing read before the first step */
    int64_t V = model_vocab_size(all);
    size_t rows = (size_t)n + 4;
    float *a = malloc(sizeof(float) * rows * (size_t)V), *b = malloc(sizeof(float) * rows * (size_t)V);
    static const int chunks[] = {0, 7, 1};
    for (int ci = 0; ci < 3; ci++) {
      CHECK(run(all, toks, n, chunks[ci], a) == 0);
      CHECK(run(few, toks, n, chunks[ci], b) == 0);
      CHECK_MSG(memcmp(a, b, sizeof(float) * rows * (size_t)V) == 0, "%s: chunk %d: logits differ under an expert budget", name,
                chunks[ci]);
      model_expert_stats_of(few, &xs);
      CHECK_MSG(xs.resident <= budget, "%s: %lld bytes of experts resident over a budget of %lld", name, (long long)xs.resident,
                (long long)budget);
    }
    /* every expert is chosen somewhere in these steps, and was read again after being given back */
    CHECK_MSG(xs.page_ins > layers_moe * c->num_experts, "%s: %lld page-ins", name, (long long)xs.page_ins);
    CHECK(xs.evictions > 0 && xs.evictions >= xs.page_ins - budget / per_expert);
    free(a), free(b);
  }
  model_free(all);
  model_free(few);
  json_decref(doc);
}

static void test_qwen3_moe_budget(void) { check_budget("qwen3_moe-f32"), check_budget("qwen3_moe-bf16"); }
static void test_gemma4_moe_budget(void) { check_budget("gemma4_moe-f32"); }
static void test_glm5_budget(void) { check_budget("glm5-f32"); } /* grouped sigmoid routing, shared experts beside */

static void test_bad_budget(void) {
  herr err = {0};
  model *m = NULL;
  CHECK_EQ_INT(model_load(GOLDEN "qwen3_moe-f32", &(model_load_opts){.expert_budget = -1}, &m, &err), HEARTH_EINVAL);
  CHECK(strstr(err.msg, "expert_budget") != NULL);
  CHECK(m == NULL);
  CHECK_EQ_INT(model_load(GOLDEN "qwen3_moe-f32", &(model_load_opts){.expert_budget = 4096, .f32_as_bf16 = true}, &m, &err),
               HEARTH_EINVAL);
  CHECK(strstr(err.msg, "expert_budget") != NULL);
}

int main(void) {
  test_device_or_skip();
  RUN(test_qwen3_moe_budget);
  RUN(test_glm5_budget);
  RUN(test_gemma4_moe_budget);
  RUN(test_bad_budget);
  TEST_MAIN_END();
}
