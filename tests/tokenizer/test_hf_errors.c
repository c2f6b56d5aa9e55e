/* test_hf_errors.c — malformed tokenizer.json files and bad input give an
 * error code and a message that names the problem; nothing crashes. Also a
 * tiny hand-written tokenizer checks a few rules directly. */
#include "hf_check.h"

typedef struct bad_case {
  const char *json;
  const char *want; /* substring of the message */
} bad_case;

#define BPE_OK "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}"

static const bad_case cases[] = {
    {"{", "invalid JSON"},
    {"[1,2]", "must be a JSON object"},
    {"{\"normalizer\":null}", "missing 'model'"},
    {"{\"model\":{\"type\":\"Foo\",\"vocab\":{}}}", "unsupported model type 'Foo'"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"x\"},\"merges\":[]}}", "model.vocab['a'] must be an integer id"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-3},\"merges\":[]}}", "has id -3"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":[],\"merges\":[]}}", "model.vocab must be an object"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a z\"]}}", "merge 0 uses token 'z' which is not in the vocabulary"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}}", "merge 0 makes token 'ab'"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"ab\"]}}", "not two tokens separated by a space"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[[1,2]]}}", "merge 0 must be a string"},
    {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":{}}}", "model.merges must be an array"},
    {"{" BPE_OK ",\"normalizer\":{\"type\":\"Shout\"}}", "unsupported normalizer type 'Shout'"},
    {"{" BPE_OK ",\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"(\"},\"content\":\"x\"}}", "does not compile"},
    {"{" BPE_OK ",\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Glob\":\"x\"},\"content\":\"x\"}}", "must be {\"String\""},
    {"{" BPE_OK ",\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[a-\"},\"behavior\":\"Isolated\"}}", "does not compile"},
    {"{" BPE_OK ",\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"Sideways\"}}", "unknown split behavior 'Sideways'"},
    {"{" BPE_OK ",\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"ab\"}}", "one-character string"},
    {"{" BPE_OK ",\"pre_tokenizer\":{\"type\":\"Metaspace\",\"prepend_scheme\":\"sometimes\"}}", "prepend_scheme 'sometimes'"},
    {"{" BPE_OK ",\"pre_tokenizer\":{\"type\":\"Sequence\"}}", "needs an array 'pretokenizers'"},
    {"{" BPE_OK ",\"pre_tokenizer\":{\"kind\":\"ByteLevel\"}}", "pre_tokenizer has no 'type'"},
    {"{" BPE_OK ",\"decoder\":{\"type\":\"Telepathy\"}}", "unsupported decoder type 'Telepathy'"},
    {"{" BPE_OK ",\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}}],\"special_tokens\":{}}}",
     "special token '<s>' is not in special_tokens"},
    {"{" BPE_OK ",\"post_processor\":{\"type\":\"BertProcessing\",\"sep\":\"[SEP]\"}}", "field 'cls' must be [token, id]"},
    {"{" BPE_OK ",\"added_tokens\":[{\"content\":\"<x>\"}]}", "added_tokens[0] ('<x>') needs an integer 'id'"},
    {"{" BPE_OK ",\"added_tokens\":{}}", "'added_tokens' must be an array"},
    {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",-1.0]],\"unk_id\":5}}", "unk_id 5 is outside the vocabulary"},
    {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",\"high\"]]}}", "Unigram vocab entry 0 must be [string, number]"},
};

static void test_malformed(void) {
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tokenizer *t = NULL;
    herr e = {0};
    int rc = tokenizer_load_json(cases[i].json, strlen(cases[i].json), NULL, 0, "bad.json", &t, &e);
    CHECK_MSG(rc != 0, "case %zu loaded: %s", i, cases[i].json);
    CHECK(t == NULL);
    CHECK_MSG(strstr(e.msg, cases[i].want) != NULL, "case %zu: message \"%s\" lacks \"%s\"", i, e.msg, cases[i].want);
    CHECK_MSG(strstr(e.msg, "bad.json") != NULL, "case %zu: message \"%s\" does not name the file", i, e.msg);
    tokenizer_free(t);
  }
}

static void test_bad_config_and_paths(void) {
  tokenizer *t = NULL;
  herr e = {0};
  const char *json = "{" BPE_OK "}";
  CHECK(tokenizer_load_json(json, strlen(json), "{nope", 5, "tok.json", &t, &e) != 0);
  CHECK(strstr(e.msg, "tokenizer_config.json") != NULL);
  CHECK(t == NULL);
  herr_clear(&e);
  CHECK_EQ_INT(tokenizer_load("/nonexistent/tokenizer.json", &t, &e), HEARTH_ENOTFOUND);
  CHECK(strstr(e.msg, "/nonexistent/tokenizer.json") != NULL);
  CHECK_EQ_INT(tokenizer_load(HEARTH_SOURCE_DIR "/src", &t, &e), HEARTH_ENOTFOUND);
  CHECK(strstr(e.msg, "no tokenizer.json") != NULL);
}

static void test_small_tokenizer(void) {
  /* a by-hand BPE: merges in rank order, an added special token, a template */
  const char *json =
      "{\"added_tokens\":[{\"id\":3,\"content\":\"<s>\",\"special\":true,\"normalized\":false}],"
      "\"normalizer\":{\"type\":\"Lowercase\"},\"pre_tokenizer\":{\"type\":\"WhitespaceSplit\"},"
      "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
      "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[3],\"tokens\":[\"<s>\"]}}},"
      "\"model\":{\"type\":\"BPE\",\"unk_token\":\"?\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"?\":4,\"abab\":5},"
      "\"merges\":[[\"a\",\"b\"],\"ab ab\"]}}";
  tokenizer *t = NULL;
  herr e = {0};
  CHECK_MSG(tokenizer_load_json(json, strlen(json), NULL, 0, "small", &t, &e) == 0, "%s", e.msg);
  if (!t) return;
  int32_t *ids = NULL;
  size_t n = 0;
  CHECK(tokenizer_encode(t, "ABAB ab<s>x", 11, true, true, &ids, &n, &e) == 0);
  int32_t want[] = {3, 5, 2, 3, 4};
  CHECK_EQ_INT(n, 5);
  if (n == 5) CHECK(memcmp(ids, want, sizeof want) == 0);
  free(ids);
  CHECK(tokenizer_encode(t, "ab<s>", 5, false, false, &ids, &n, &e) == 0); /* <s> as text: <, s, > unknown */
  CHECK_EQ_INT(n, 4);
  free(ids);
  CHECK_EQ_INT(tokenizer_encode(t, "\xff", 1, false, true, &ids, &n, &e), HEARTH_EINVAL);
  CHECK(strstr(e.msg, "not valid UTF-8") != NULL);
  CHECK_EQ_INT(tokenizer_vocab_size(t), 6);
  CHECK_EQ_INT(tokenizer_token_to_id(t, "<s>"), 3);
  CHECK_EQ_INT(tokenizer_token_to_id(t, "abab"), 5);
  CHECK_EQ_INT(tokenizer_token_to_id(t, "zz"), -1);
  CHECK_EQ_STR(tokenizer_id_to_token(t, 2), "ab");
  CHECK(tokenizer_id_to_token(t, 99) == NULL);
  CHECK(tokenizer_is_special(t, 3));
  CHECK(!tokenizer_is_special(t, 2));
  CHECK_EQ_INT(tokenizer_bos_id(t), 3);
  /* no decoder: tokens joined by spaces; unknown ids dropped */
  int32_t dec[] = {3, 5, 2, 999};
  hbuf out = {0};
  CHECK(tokenizer_decode(t, dec, 4, false, &out, &e) == 0);
  CHECK_EQ_STR(hbuf_str(&out), "<s> abab ab");
  hbuf_clear(&out);
  CHECK(tokenizer_decode(t, dec, 4, true, &out, &e) == 0);
  CHECK_EQ_STR(hbuf_str(&out), "abab ab");
  hbuf_free(&out);
  tokenizer_free(t);
}

/* Streaming never hands out half a UTF-8 character, holds byte-fallback
 * tokens until their run ends (HF decodes a run all or nothing), and at the
 * end gives exactly the full decode. */
static void stream_case(const tokenizer *t, const int32_t *ids, size_t n, size_t *lens) {
  tokenizer_stream *s = tokenizer_stream_new(t, false);
  hbuf out = {0}, full = {0};
  herr e = {0};
  for (size_t i = 0; i < n; i++) {
    CHECK(tokenizer_stream_put(s, ids[i], &out, &e) == 0);
    lens[i] = out.len;
  }
  CHECK(tokenizer_stream_flush(s, &out, &e) == 0);
  CHECK(tokenizer_decode(t, ids, n, false, &full, &e) == 0);
  CHECK_EQ_STR(hbuf_str(&out), hbuf_str(&full));
  tokenizer_stream_free(s);
  hbuf_free(&out);
  hbuf_free(&full);
}

static void test_stream_bytes(void) {
  char path[1024];
  snprintf(path, sizeof path, "%s/tokenizers/llama2/tokenizer.json", HEARTH_DEPS_DIR);
  if (!hfile_exists(path)) return;
  tokenizer *t = load_tokenizer_json_only(path);
  CHECK(t != NULL);
  if (!t) return;
  /* byte tokens: <0xXX> has id XX + 3 in this vocabulary */
  int32_t a[] = {29871, 0xF0 + 3, 0x9F + 3, 0xA6 + 3, 0x99 + 3, 29871}; /* the bytes of U+1F999 */
  int32_t b[] = {29871, 0xF0 + 3, 0x9F + 3, 0xA6 + 3, 0x99 + 3, 0xE4 + 3, 0xBD + 3}; /* then a truncated one */
  size_t lens[8];
  stream_case(t, a, 6, lens);
  for (int i = 1; i <= 4; i++) CHECK_EQ_INT(lens[i], lens[0]); /* held while the run may go on */
  CHECK(lens[5] > lens[0] + 4);
  stream_case(t, b, 7, lens);
  CHECK_EQ_INT(lens[6], lens[0]);
  tokenizer_free(t);
}

/* \\w in a tokenizer.json regex means Oniguruma's word class: "½" (No) is not in it. */
static void test_word_class(void) {
  const char *json =
      "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\w+|[\\\\w\\\\-]\"},\"behavior\":\"Isolated\"},"
      "\"model\":{\"type\":\"WordLevel\",\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>\":0,\"ab\":1,\"\xc2\xbd\":2,\"cd\":3,\"-\":4}}}";
  tokenizer *t = NULL;
  herr e = {0};
  CHECK_MSG(tokenizer_load_json(json, strlen(json), NULL, 0, "word", &t, &e) == 0, "%s", e.msg);
  if (!t) return;
  int32_t *ids = NULL;
  size_t n = 0;
  CHECK(tokenizer_encode(t, "ab\xc2\xbd" "cd-", 7, false, true, &ids, &n, &e) == 0);
  int32_t want[] = {1, 2, 3, 4};
  CHECK_EQ_INT(n, 4);
  if (n == 4) CHECK(memcmp(ids, want, sizeof want) == 0);
  else print_ids("got", ids, n);
  free(ids);
  tokenizer_free(t);
}

int main(void) {
  test_need_tokenizers();
  RUN(test_word_class);
  RUN(test_malformed);
  RUN(test_bad_config_and_paths);
  RUN(test_small_tokenizer);
  RUN(test_stream_bytes);
  TEST_MAIN_END();
}
