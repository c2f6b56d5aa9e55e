/* test_hf_corpus.c — the six real tokenizer.json files (qwen3, gemma3,
 * llama3_1, deepseek_v3, gptoss, llama2/Mistral) against HF tokenizers on the
 * fixture corpus: encode with and without special tokens, decode keeping and
 * skipping special tokens, and streaming decode equal to the full decode.
 * Also loading a model folder, where tokenizer_config.json's add_bos_token
 * applies. Skips a tokenizer whose files tools/fetch_test_deps.sh has not fetched. */
#include "base/utf8.h"
#include "hf_check.h"

static const char *names[] = {"qwen3", "gemma3", "llama3_1", "deepseek_v3", "gptoss", "llama2"};

static void test_real_tokenizers(void) {
  json_t *corpus = load_json_file(FIX_DIR "corpus.json");
  CHECK(corpus && json_array_size(corpus) >= 500);
  if (!corpus) return;
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
    char path[1024], epath[1024];
    snprintf(path, sizeof path, "%s/tokenizers/%s/tokenizer.json", HEARTH_DEPS_DIR, names[k]);
    snprintf(epath, sizeof epath, FIX_DIR "expected_%s.json", names[k]);
    if (!hfile_exists(path)) {
      fprintf(stderr, "  %s: skipped (%s not fetched; run tools/fetch_test_deps.sh)\n", names[k], path);
      continue;
    }
    tokenizer *t = load_tokenizer_json_only(path);
    json_t *exp = load_json_file(epath);
    CHECK(t != NULL);
    CHECK(exp != NULL);
    if (t && exp) {
      hf_tally tl = {0};
      check_against(names[k], t, corpus, exp, &tl);
    }
    tokenizer_free(t);
    json_decref(exp);
  }
  json_decref(corpus);
}

/* A folder load reads tokenizer_config.json: add_bos_token/add_eos_token, when
 * present, make the post-processor "[bos] $A [eos]" (transformers' rule). */
static void test_folder_config(void) {
  json_t *corpus = load_json_file(FIX_DIR "corpus.json");
  if (!corpus) return;
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
    char dir[1024], epath[1024];
    snprintf(dir, sizeof dir, "%s/tokenizers/%s", HEARTH_DEPS_DIR, names[k]);
    snprintf(epath, sizeof epath, FIX_DIR "expected_%s.json", names[k]);
    if (!hfile_is_dir(dir)) continue;
    tokenizer *t = NULL;
    herr e = {0};
    CHECK_MSG(tokenizer_load(dir, &t, &e) == 0, "%s", e.msg);
    json_t *exp = load_json_file(epath);
    if (!t || !exp) {
      tokenizer_free(t);
      json_decref(exp);
      continue;
    }
    bool deepseek = !strcmp(names[k], "deepseek_v3"); /* add_bos_token: true, post-processor adds none */
    int bad = 0;
    for (size_t i = 0; i < json_array_size(corpus) && i < 120; i++) {
      const json_t *s = json_array_get(corpus, i);
      int32_t *ids = NULL;
      size_t n = 0;
      CHECK(tokenizer_encode(t, json_string_value(s), json_string_length(s), true, true, &ids, &n, &e) == 0);
      const json_t *want = json_array_get(json_object_get(exp, deepseek ? "encode_plain" : "encode_special"), i);
      bool ok = deepseek ? (n >= 1 && ids[0] == 0 && ids_equal(ids + 1, n - 1, want)) : ids_equal(ids, n, want);
      bad += !ok;
      free(ids);
    }
    CHECK_MSG(bad == 0, "%s folder load: %d strings differ", names[k], bad);
    /* BOS / EOS from the config */
    const char *eos = !strcmp(names[k], "qwen3") ? "<|im_end|>" : !strcmp(names[k], "gemma3") ? "<end_of_turn>"
                    : !strcmp(names[k], "llama3_1") ? "<|eot_id|>" : !strcmp(names[k], "gptoss") ? "<|return|>"
                    : !strcmp(names[k], "llama2") ? "</s>" : "<｜end▁of▁sentence｜>";
    CHECK_EQ_INT(tokenizer_eos_id(t), tokenizer_token_to_id(t, eos));
    CHECK(tokenizer_eos_id(t) >= 0);
    CHECK(tokenizer_is_special(t, tokenizer_eos_id(t)));
    tokenizer_free(t);
    json_decref(exp);
  }
  json_decref(corpus);
}

int main(void) {
  test_need_tokenizers();
  RUN(test_real_tokenizers);
  RUN(test_folder_config);
  TEST_MAIN_END();
}
