/* test_fim.c — fill-in-the-middle prompts (tokenizer/fim.h) on real
 * vocabularies: Qwen3's FIM and repository tokens found at their ids, the
 * prompt laid out token for token as llama.cpp's /infill lays it out (checked
 * against the ids assembled here and against its decoded text), the FIM
 * tokens' strings in the texts read as text, llama.cpp's truncation, DeepSeek V3's tokens and
 * BOS, and a vocabulary without FIM tokens refused. */
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "test.h"
#include "tokenizer/fim.h"
#include "tokenizer/tokenizer.h"

static tokenizer *load(const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/tokenizers/%s", HEARTH_DEPS_DIR, name);
  tokenizer *t = NULL;
  herr e = {0};
  CHECK_MSG(tokenizer_load(path, &t, &e) == 0, "%s (run tools/fetch_test_deps.sh?)", e.msg);
  return t;
}

typedef struct seq {
  int32_t v[4096];
  size_t n;
} seq;

static void add_text(const tokenizer *t, seq *s, const char *text) {
  int32_t *ids = NULL;
  size_t n = 0;
  herr e = {0};
  CHECK(tokenizer_encode(t, text, strlen(text), false, false, &ids, &n, &e) == 0);
  for (size_t i = 0; i < n && s->n < 4096; i++) s->v[s->n++] = ids[i];
  free(ids);
}

static void add_id(seq *s, int32_t id) { s->v[s->n++] = id; }

static char *decode(const tokenizer *t, const int32_t *ids, size_t n) {
  hbuf b = {0};
  herr e = {0};
  CHECK(tokenizer_decode(t, ids, n, false, &b, &e) == 0);
  return b.data ? hbuf_take(&b) : strdup("");
}

static int count(const int32_t *ids, size_t n, int32_t id) {
  int k = 0;
  for (size_t i = 0; i < n; i++) k += ids[i] == id;
  return k;
}

static const char PREFIX[] = "def add(a, b):\n    ";
static const char SUFFIX[] = "\n\nprint(add(1, 2))\n";

static void test_qwen3(void) {
  tokenizer *t = load("qwen3");
  if (!t) return;
  tokenizer_fim f;
  tokenizer_fim_find(t, &f);
  /* Qwen's added tokens, at the ids its tokenizer.json gives them */
  CHECK_EQ_INT(f.pre, 151659);
  CHECK_EQ_INT(f.mid, 151660);
  CHECK_EQ_INT(f.suf, 151661);
  CHECK_EQ_INT(f.pad, 151662);
  CHECK_EQ_INT(f.rep, 151663);
  CHECK_EQ_INT(f.sep, 151664);
  CHECK(tokenizer_fim_ok(&f));

  tokenizer_fim_chunk extra[] = {{"util.py", "import math\n"}, {NULL, "X = 1\n"}};
  int32_t *ids = NULL;
  size_t n = 0;
  herr e = {0};
  CHECK(tokenizer_fim_prompt(t, &f, PREFIX, SUFFIX, "return", extra, 2, 32768, 64, &ids, &n, &e) == 0);
  seq want = {0};
  add_id(&want, 151663), add_text(t, &want, "myproject\n");
  add_id(&want, 151664), add_text(t, &want, "util.py\n"), add_text(t, &want, "import math\n");
  add_id(&want, 151664), add_text(t, &want, "tmp\n"), add_text(t, &want, "X = 1\n");
  add_id(&want, 151664), add_text(t, &want, "filename\n");
  add_id(&want, 151659), add_text(t, &want, PREFIX), add_text(t, &want, "return");
  add_id(&want, 151661), add_text(t, &want, SUFFIX);
  add_id(&want, 151660);
  CHECK_EQ_INT((int)n, (int)want.n);
  CHECK(n == want.n && !memcmp(ids, want.v, n * sizeof *ids));
  CHECK_EQ_INT(count(ids, n, 151659) + count(ids, n, 151660) + count(ids, n, 151661), 3);
  CHECK_EQ_INT(count(ids, n, 151664), 3);
  char *text = decode(t, ids, n);
  CHECK_EQ_STR(text, "<|repo_name|>myproject\n<|file_sep|>util.py\nimport math\n<|file_sep|>tmp\nX = 1\n"
                     "<|file_sep|>filename\n<|fim_prefix|>def add(a, b):\n    return<|fim_suffix|>\n\nprint(add(1, 2))\n"
                     "<|fim_middle|>");
  free(text);
  free(ids);

  /* a text that spells a FIM token is text (llama.cpp reads FIM tokens as control tokens):
   * the prompt holds each FIM token once, and the spelled one decodes back as written */
  CHECK(tokenizer_fim_prompt(t, &f, "x = '<|fim_middle|>'", "<|fim_suffix|>", "", NULL, 0, 32768, -1, &ids, &n, &e) == 0);
  CHECK_EQ_INT(count(ids, n, 151660), 1);
  CHECK_EQ_INT(count(ids, n, 151661), 1);
  CHECK_EQ_INT(ids[n - 1], 151660);
  text = decode(t, ids, n);
  CHECK(strstr(text, "<|fim_prefix|>x = '<|fim_middle|>'<|fim_suffix|><|fim_suffix|><|fim_middle|>") != NULL);
  free(text);
  free(ids);
  /* elsewhere the tokenizer reads them as Hugging Face does */
  int32_t *plain = NULL;
  size_t np = 0;
  CHECK(tokenizer_encode(t, "<|fim_middle|>", 14, false, false, &plain, &np, &e) == 0);
  CHECK(np == 1 && plain[0] == 151660);
  free(plain);

  /* llama.cpp's budget: at a context of 1024 (its batch too) nothing before the prefix fits,
   * and of a long prefix the last 3/4 of the batch is kept */
  CHECK(tokenizer_fim_prompt(t, &f, PREFIX, SUFFIX, "", extra, 2, 1024, 16, &ids, &n, &e) == 0);
  CHECK_EQ_INT(ids[0], 151659);
  free(ids);
  hbuf big = {0};
  for (int i = 0; i < 3000; i++) hbuf_printf(&big, "v%d = %d\n", i, i);
  CHECK(tokenizer_fim_prompt(t, &f, hbuf_str(&big), SUFFIX, "", NULL, 0, 32768, -1, &ids, &n, &e) == 0);
  size_t at_suf = 0;
  while (at_suf < n && ids[at_suf] != 151661) at_suf++;
  size_t at_pre = 0;
  while (at_pre < n && ids[at_pre] != 151659) at_pre++;
  CHECK_EQ_INT((int)(at_suf - at_pre - 1), 3 * (2048 / 4));
  char *tail = decode(t, ids + at_pre + 1, at_suf - at_pre - 1);
  CHECK(strlen(tail) < big.len && !strcmp(tail, hbuf_str(&big) + big.len - strlen(tail))); /* the prefix's end */
  free(tail);
  free(ids);
  hbuf_free(&big);
  tokenizer_free(t);
}

static void test_deepseek(void) {
  tokenizer *t = load("deepseek_v3");
  if (!t) return;
  tokenizer_fim f;
  tokenizer_fim_find(t, &f);
  CHECK_EQ_INT(f.pre, 128801);
  CHECK_EQ_INT(f.suf, 128800);
  CHECK_EQ_INT(f.mid, 128802);
  CHECK_EQ_INT(f.rep, -1);
  CHECK_EQ_INT(f.sep, -1);
  int32_t *ids = NULL;
  size_t n = 0;
  herr e = {0};
  CHECK(tokenizer_fim_prompt(t, &f, PREFIX, SUFFIX, "", NULL, 0, 32768, -1, &ids, &n, &e) == 0);
  char *text = decode(t, ids, n);
  /* its BOS first (the tokenizer adds one), then prefix, hole, suffix, end */
  CHECK_EQ_STR(text, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c><\xef\xbd\x9c" "fim\xe2\x96\x81"
                     "begin\xef\xbd\x9c>def add(a, b):\n    <\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>\n\nprint(add(1, 2))\n"
                     "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>");
  free(text);
  free(ids);
  tokenizer_free(t);
}

static void test_none(void) {
  tokenizer *t = load("llama3_1");
  if (!t) return;
  tokenizer_fim f;
  tokenizer_fim_find(t, &f);
  CHECK(!tokenizer_fim_ok(&f));
  int32_t *ids = NULL;
  size_t n = 0;
  herr e = {0};
  CHECK_EQ_INT(tokenizer_fim_prompt(t, &f, "a", "b", "", NULL, 0, 4096, -1, &ids, &n, &e), HEARTH_EUNSUPPORTED);
  CHECK(ids == NULL && n == 0);
  tokenizer_free(t);
}

int main(void) {
  test_need_tokenizers();
  RUN(test_qwen3);
  RUN(test_deepseek);
  RUN(test_none);
  TEST_MAIN_END();
}
