/* test_hf_synth.c — small tokenizer.json files trained with HF tokenizers on
 * the fixture corpus, covering what the real ones do not: WordPiece (BERT
 * normalizer and pre-tokenizer, Bert/Template post-processors, WordPiece
 * decoder), Unigram (Metaspace, byte fallback, prepend_scheme first), BPE with
 * end_of_word_suffix / continuing_subword_prefix / fuse_unk, Roberta with
 * added tokens using lstrip / rstrip / single_word / normalized, and
 * ignore_merges; then every normalizer and pre-tokenizer variant spliced into
 * one byte-level BPE (tests/fixtures/tokenizer/variants.json). */
#include "base/utf8.h"
#include "hf_check.h"

static const char *synth[] = {"wordpiece_bert",  "wordpiece_cased",   "unigram_metaspace",
                              "unigram_bytefallback", "unigram_first", "bpe_suffix",
                              "bpe_prefix_fuse", "bytelevel_roberta", "bytelevel_ignore_merges"};

static void test_synth(void) {
  json_t *corpus = load_json_file(FIX_DIR "corpus.json");
  CHECK(corpus != NULL);
  if (!corpus) return;
  for (size_t k = 0; k < sizeof synth / sizeof synth[0]; k++) {
    char path[1024], epath[1024];
    snprintf(path, sizeof path, FIX_DIR "synth_%s.tokenizer.json", synth[k]);
    snprintf(epath, sizeof epath, FIX_DIR "synth_%s.expected.json", synth[k]);
    tokenizer *t = load_tokenizer_json_only(path);
    json_t *exp = load_json_file(epath);
    CHECK(t != NULL);
    CHECK(exp != NULL);
    if (t && exp) {
      hf_tally tl = {0};
      check_against(synth[k], t, corpus, exp, &tl);
    }
    tokenizer_free(t);
    json_decref(exp);
  }
  json_decref(corpus);
}

static void test_variants(void) {
  json_t *corpus = load_json_file(FIX_DIR "corpus.json");
  json_t *base = load_json_file(FIX_DIR "variants.base.json");
  json_t *var = load_json_file(FIX_DIR "variants.json");
  CHECK(corpus && base && var);
  if (corpus && base && var) {
    size_t count = (size_t)json_integer_value(json_object_get(var, "count"));
    const json_t *list = json_object_get(var, "variants");
    CHECK(json_array_size(list) >= 40);
    for (size_t v = 0; v < json_array_size(list); v++) {
      const json_t *item = json_array_get(list, v);
      const char *name = json_string_value(json_object_get(item, "name"));
      json_object_set(base, "normalizer", json_object_get(item, "normalizer"));
      json_object_set(base, "pre_tokenizer", json_object_get(item, "pre_tokenizer"));
      char *text = json_dumps(base, JSON_COMPACT);
      tokenizer *t = NULL;
      herr e = {0};
      int rc = tokenizer_load_json(text, strlen(text), NULL, 0, name, &t, &e);
      free(text);
      CHECK_MSG(rc == 0, "%s: %s", name, e.msg);
      if (rc) continue;
      const json_t *want = json_object_get(item, "ids");
      int bad = 0;
      for (size_t i = 0; i < count && i < json_array_size(want); i++) {
        const json_t *s = json_array_get(corpus, i);
        int32_t *ids = NULL;
        size_t n = 0;
        rc = tokenizer_encode(t, json_string_value(s), json_string_length(s), false, true, &ids, &n, &e);
        if (rc || !ids_equal(ids, n, json_array_get(want, i))) {
          if (bad++ < 2) {
            fprintf(stderr, "  %s: corpus[%zu] \"%.60s\" differs %s\n", name, i, json_string_value(s), rc ? e.msg : "");
            print_ids("got ", ids, n);
            print_want(json_array_get(want, i));
          }
        }
        free(ids);
      }
      CHECK_MSG(bad == 0, "%s: %d of %zu strings differ", name, bad, count);
      tokenizer_free(t);
    }
  }
  json_decref(corpus);
  json_decref(base);
  json_decref(var);
}

int main(void) {
  RUN(test_synth);
  RUN(test_variants);
  TEST_MAIN_END();
}
