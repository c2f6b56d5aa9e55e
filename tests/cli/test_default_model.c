/* Golden test of the built-in model (models/default) against transformers:
 * the prompts tokenize to the ids HF's tokenizer gave, the last prompt
 * position's logits match the float32 reference, and greedy decoding with
 * the KV cache reproduces transformers' 32 greedy ids for every case
 * (tests/fixtures/default_model/greedy.json, made by tools/train_default_model.py). */
#include <jansson.h>

#include "engine/kv_cache.h"
#include "model/model.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

static const char *model_dir = HEARTH_SOURCE_DIR "/models/default";

static int argmax(const float *x, int64_t n) {
  int best = 0;
  for (int64_t i = 1; i < n; i++)
    if (x[i] > x[best]) best = (int)i;
  return best;
}

static void test_cases(void) {
  json_error_t je;
  json_t *fx = json_load_file(HEARTH_SOURCE_DIR "/tests/fixtures/default_model/greedy.json", 0, &je);
  CHECK_MSG(fx != NULL, "fixture: %s", je.text);
  if (!fx) return;
  herr err = {0};
  tokenizer *tok = NULL;
  CHECK_MSG(tokenizer_load(model_dir, &tok, &err) == 0, "%s", err.msg);
  model *m = NULL;
  model_load_opts opts = {.threads = 2};
  CHECK_MSG(model_load(model_dir, &opts, &m, &err) == 0, "%s", err.msg);
  if (!tok || !m) goto out;
  int64_t vocab = model_vocab_size(m);
  float *logits = malloc((size_t)vocab * sizeof(float));
  model_kv_geometry geom;
  model_kv_geometry_of(m, &geom);

  json_t *last = json_object_get(fx, "last_logits");
  size_t ci;
  json_t *c;
  json_array_foreach(json_object_get(fx, "cases"), ci, c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    const char *kind = json_string_value(json_object_get(c, "kind"));
    const char *prompt = json_string_value(json_object_get(c, "prompt"));
    json_t *pids = json_object_get(c, "prompt_ids"), *gids = json_object_get(c, "greedy_ids");
    /* Tokenization: text prompts with special tokens added, chat prompts as rendered. */
    int32_t *ids = NULL;
    size_t n = 0;
    bool add_special = strcmp(kind, "chat") != 0;
    CHECK_MSG(tokenizer_encode(tok, prompt, strlen(prompt), add_special, true, &ids, &n, &err) == 0, "%s", err.msg);
    bool same = n == json_array_size(pids);
    for (size_t i = 0; same && i < n; i++) same = ids[i] == json_integer_value(json_array_get(pids, i));
    CHECK_MSG(same, "%s: prompt ids differ from HF's", name);
    free(ids);

    /* Greedy decoding from the reference prompt ids. */
    size_t np = json_array_size(pids), ng = json_array_size(gids);
    int32_t *seq = malloc((np + ng) * sizeof(int32_t));
    for (size_t i = 0; i < np; i++) seq[i] = (int32_t)json_integer_value(json_array_get(pids, i));
    kv_cache *cache = NULL;
    kv_seq *kv = NULL;
    CHECK(kv_cache_new(&geom, 0, &cache, &err) == 0 && kv_cache_seq_new(cache, &kv, &err) == 0);
    model_seq s = {.kv = kv, .tokens = seq, .n_tokens = (int)np};
    model_batch b = {.seqs = &s, .n_seqs = 1};
    int mismatches = 0;
    for (size_t step = 0; step < ng; step++) {
      if (model_forward(m, &b, logits, &err) != 0) {
        CHECK_MSG(0, "%s: forward: %s", name, err.msg);
        break;
      }
      if (step == 0 && last && strcmp(json_string_value(json_object_get(last, "case")), name) == 0) {
        size_t k;
        json_t *v;
        json_array_foreach(json_object_get(last, "top_values"), k, v) {
          int id = (int)json_integer_value(json_array_get(json_object_get(last, "top_ids"), k));
          CHECK_NEAR(logits[id], json_real_value(v), 1e-3);
        }
      }
      int next = argmax(logits, vocab);
      int want = (int)json_integer_value(json_array_get(gids, step));
      if (next != want) mismatches++;
      seq[np + step] = want; /* follow the reference so one slip does not cascade */
      s.tokens = &seq[np + step];
      s.n_tokens = 1;
    }
    CHECK_MSG(mismatches == 0, "%s: %d of %zu greedy ids differ from transformers", name, mismatches, ng);
    kv_cache_seq_free(kv);
    kv_cache_free(cache);
    free(seq);
  }
  free(logits);
out:
  model_free(m);
  tokenizer_free(tok);
  json_decref(fx);
}

int main(void) {
  RUN(test_cases);
  TEST_MAIN_END();
}
