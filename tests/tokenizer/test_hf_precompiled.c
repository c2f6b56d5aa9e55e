/* test_hf_precompiled.c — the Precompiled normalizer (a SentencePiece
 * charsmap: a darts double-array trie plus replacement strings, base64 in
 * tokenizer.json). A hand-built trie maps "A" -> "a" and "e" U+0301 -> "é";
 * the rules checked are spm_precompiled's: grapheme clusters under 6 bytes are
 * looked up whole (first, i.e. shortest, matching key wins), otherwise each
 * character on its own; unmatched text passes through. */
#include "hf_check.h"

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64(const unsigned char *p, size_t n) {
  char *o = malloc(n / 3 * 4 + 8), *w = o;
  size_t i = 0;
  for (; i + 2 < n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
    *w++ = B64[v >> 18], *w++ = B64[(v >> 12) & 63], *w++ = B64[(v >> 6) & 63], *w++ = B64[v & 63];
  }
  if (n - i == 1) {
    uint32_t v = (uint32_t)p[i] << 16;
    *w++ = B64[v >> 18], *w++ = B64[(v >> 12) & 63], *w++ = '=', *w++ = '=';
  } else if (n - i == 2) {
    uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
    *w++ = B64[v >> 18], *w++ = B64[(v >> 12) & 63], *w++ = B64[(v >> 6) & 63], *w++ = '=';
  }
  *w = 0;
  return o;
}

/* Units of a darts trie: root offset 256; "A" (0x41) leaf -> 0; "e" 0xCC 0x81 leaf -> 2.
 * The node after 0xCC has its base (1961) past the end of the array: only the
 * positions actually read must be inside it. */
static char *charsmap(void) {
  enum { N = 1834 };
  static uint32_t u[N];
  memset(u, 0, sizeof u);
  u[0] = 256u << 10;
  u[321] = 0x41 | 1u << 8 | 1u << 10; /* 256^0x41 = 321, offset 1: leaf at 320 */
  u[320] = 0x80000000u | 0;
  u[357] = 0x65 | 512u << 10;         /* 256^0x65 = 357, offset 512 -> base 869 */
  u[937] = 0xCC | 1024u << 10;        /* 869^0xCC = 937, offset 1024 -> base 1961 */
  u[1832] = 0x81 | 1u << 8 | 1u << 10; /* 1961^0x81 = 1832, offset 1: leaf at 1833 */
  u[1833] = 0x80000000u | 2;
  static const char repl[] = "a\0\xC3\xA9"; /* "a", "é" (sizeof includes the final NUL) */
  size_t n = 4 + sizeof u + sizeof repl;
  unsigned char *blob = malloc(n);
  uint32_t size = sizeof u;
  for (int i = 0; i < 4; i++) blob[i] = (unsigned char)(size >> (8 * i));
  for (size_t k = 0; k < N; k++)
    for (int i = 0; i < 4; i++) blob[4 + 4 * k + i] = (unsigned char)(u[k] >> (8 * i));
  memcpy(blob + 4 + sizeof u, repl, sizeof repl);
  char *s = b64(blob, n);
  free(blob);
  return s;
}

static void test_precompiled(void) {
  char *map = charsmap();
  hbuf json = {0};
  hbuf_printf(&json,
              "{\"normalizer\":{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"%s\"},"
              "\"pre_tokenizer\":{\"type\":\"WhitespaceSplit\"},"
              "\"model\":{\"type\":\"WordLevel\",\"unk_token\":\"<unk>\",\"vocab\":{\"<unk>\":0,\"aBéa\":1,\"é\":2,\"e\":3,"
              "\"e\xCC\x81\xCC\x81\xCC\x81\":4,\"xay\":5}}}",
              map);
  tokenizer *t = NULL;
  herr e = {0};
  CHECK_MSG(tokenizer_load_json(json.data, json.len, NULL, 0, "precompiled", &t, &e) == 0, "%s", e.msg);
  if (t) {
    /* "ABéA" (é decomposed), "é" + a second accent in one 5-byte cluster (the first key wins
     * and replaces the whole cluster), "e", three accents (7 bytes: per character), "xAy" */
    const char *text = "ABe\xCC\x81" "A e\xCC\x81\xCC\x81 e e\xCC\x81\xCC\x81\xCC\x81 xAy";
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(tokenizer_encode(t, text, strlen(text), false, true, &ids, &n, &e) == 0);
    int32_t want[] = {1, 2, 3, 4, 5};
    CHECK_EQ_INT(n, 5);
    if (n == 5) CHECK(memcmp(ids, want, sizeof want) == 0);
    if (n != 5 || memcmp(ids, want, sizeof want)) print_ids("got", ids, n);
    free(ids);
    tokenizer_free(t);
  }
  /* a blob whose trie does not fit is an error that names it */
  hbuf_clear(&json);
  hbuf_puts(&json, "{\"normalizer\":{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"/////wAA\"},"
                   "\"model\":{\"type\":\"WordLevel\",\"vocab\":{\"<unk>\":0}}}");
  CHECK(tokenizer_load_json(json.data, json.len, NULL, 0, "precompiled", &t, &e) != 0);
  CHECK(strstr(e.msg, "precompiled_charsmap") != NULL);
  hbuf_clear(&json);
  hbuf_puts(&json, "{\"normalizer\":{\"type\":\"Precompiled\",\"precompiled_charsmap\":\"%%%\"},"
                   "\"model\":{\"type\":\"WordLevel\",\"vocab\":{\"<unk>\":0}}}");
  CHECK(tokenizer_load_json(json.data, json.len, NULL, 0, "precompiled", &t, &e) != 0);
  CHECK(strstr(e.msg, "base64") != NULL);
  hbuf_free(&json);
  free(map);
}

int main(void) {
  RUN(test_precompiled);
  TEST_MAIN_END();
}
