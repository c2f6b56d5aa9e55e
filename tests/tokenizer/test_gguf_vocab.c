/* test_gguf_vocab.c — GGUF vocabularies beyond the conformance suite: the
 * llama-2 fixture's vocabulary (BOS, decode with and without special tokens,
 * byte fallback), special-token parsing and llama.cpp's strip rules,
 * vocabularies without cases (gpt-neox, baichuan) round-tripping, a small
 * t5 (UGM) vocabulary, and malformed vocabularies that must fail with a
 * message naming the key. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "format/gguf.h"
#include "test.h"
#include "tokenizer/gguf_vocab.h"

#define LLAMA2 HEARTH_TINY_GGUF
#define SUITE HEARTH_DEPS_DIR "/llama.cpp/vocab/"

static gguf_file *g_open(const char *path, gguf_vocab **v) {
  gguf_file *g = NULL;
  herr err = {0};
  *v = NULL;
  CHECK_MSG(gguf_open(&g, path, &err) == 0, "%s", err.msg);
  if (!g) return NULL;
  CHECK_MSG(gguf_vocab_load(g, NULL, v, &err) == 0, "%s", err.msg);
  return g;
}

static size_t enc(const gguf_vocab *v, const char *s, bool add_special, bool parse_special, int32_t *out, size_t cap) {
  int32_t *ids = NULL;
  size_t n = 0;
  herr err = {0};
  CHECK_MSG(gguf_vocab_encode(v, s, strlen(s), add_special, parse_special, &ids, &n, &err) == 0, "%s", err.msg);
  size_t k = n < cap ? n : cap;
  if (ids) memcpy(out, ids, k * sizeof *ids);
  free(ids);
  return n;
}

static char *dec(const gguf_vocab *v, const int32_t *ids, size_t n, bool skip_special) {
  hbuf b = {0};
  herr err = {0};
  CHECK_MSG(gguf_vocab_decode(v, ids, n, skip_special, &b, &err) == 0, "%s", err.msg);
  hbuf_putc(&b, 0);
  return hbuf_take(&b);
}

#define CHECK_IDS(got, ngot, ...)                                                  \
  do {                                                                             \
    const int32_t _want[] = {__VA_ARGS__};                                         \
    size_t _nw = sizeof _want / sizeof _want[0];                                   \
    CHECK_EQ_INT(ngot, _nw);                                                       \
    if ((ngot) == _nw) CHECK(memcmp(got, _want, sizeof _want) == 0);               \
  } while (0)

static void test_llama2_fixture(void) {
  gguf_vocab *v;
  gguf_file *g = g_open(LLAMA2, &v);
  if (!v) {
    gguf_close(g);
    return;
  }
  CHECK_EQ_INT(gguf_vocab_size(v), 32000);
  CHECK_EQ_INT(gguf_vocab_bos(v), 1);
  CHECK_EQ_INT(gguf_vocab_eos(v), 2);
  CHECK(gguf_vocab_add_bos(v) && !gguf_vocab_add_eos(v));
  CHECK_EQ_STR(gguf_vocab_model(v), "llama");
  CHECK_EQ_STR(gguf_vocab_token(v, 15043), "\xe2\x96\x81Hello");
  CHECK_EQ_INT(gguf_vocab_find(v, "\xe2\x96\x81world"), 3186);
  CHECK_EQ_INT(gguf_vocab_find(v, "no such token"), -1);
  CHECK(gguf_vocab_token(v, 32000) == NULL && gguf_vocab_token(v, -1) == NULL);
  CHECK(gguf_vocab_is_special(v, 1) && gguf_vocab_is_special(v, 0) && !gguf_vocab_is_special(v, 15043));
  CHECK(gguf_vocab_is_eog(v, 2) && !gguf_vocab_is_eog(v, 1));

  int32_t ids[64];
  size_t n = enc(v, "Hello world", true, false, ids, 64);
  CHECK_IDS(ids, n, 1, 15043, 3186);
  n = enc(v, "Hello world", false, false, ids, 64);
  CHECK_IDS(ids, n, 15043, 3186);

  const int32_t hw[] = {1, 15043, 3186};
  char *s = dec(v, hw, 3, false);
  CHECK_EQ_STR(s, "<s> Hello world");
  free(s);
  /* as llama.cpp: dropping BOS also keeps the first piece's leading space */
  s = dec(v, hw, 3, true);
  CHECK_EQ_STR(s, " Hello world");
  free(s);
  s = dec(v, hw + 1, 2, false);
  CHECK_EQ_STR(s, "Hello world");
  free(s);

  /* byte fallback: an emoji has no piece in this vocabulary (Llama 2: 29871 then its four bytes) */
  n = enc(v, "\xf0\x9f\x98\x80", false, false, ids, 64);
  CHECK_IDS(ids, n, 29871, 243, 162, 155, 131);
  s = dec(v, ids, n, false);
  CHECK_EQ_STR(s, "\xf0\x9f\x98\x80");
  free(s);

  /* special tokens in text: parsed only when asked */
  n = enc(v, "<s>Hello", false, true, ids, 64);
  CHECK_IDS(ids, n, 1, 15043);
  n = enc(v, "<s>Hello", false, false, ids, 64);
  CHECK(n > 2 && ids[0] != 1);
  s = dec(v, ids, n, false);
  CHECK_EQ_STR(s, "<s>Hello");
  free(s);
  n = enc(v, "Hello</s>", false, true, ids, 64);
  CHECK_IDS(ids, n, 15043, 2);
  n = enc(v, "", true, false, ids, 64);
  CHECK_IDS(ids, n, 1);
  n = enc(v, "", false, false, ids, 64);
  CHECK_EQ_INT(n, 0);

  /* ids outside the vocabulary are an error that names the id */
  hbuf b = {0};
  herr err = {0};
  const int32_t bad[] = {1, 32000};
  CHECK_EQ_INT(gguf_vocab_decode(v, bad, 2, false, &b, &err), HEARTH_EINVAL);
  CHECK(strstr(err.msg, "32000") != NULL);
  hbuf_free(&b);
  const char *piece;
  size_t plen;
  CHECK(gguf_vocab_piece(v, 15043, false, &piece, &plen, &err) == 0 && plen == 6 && memcmp(piece, " Hello", 6) == 0);
  CHECK(gguf_vocab_piece(v, 1, false, &piece, &plen, &err) == 0 && plen == 0);
  CHECK(gguf_vocab_piece(v, 1, true, &piece, &plen, &err) == 0 && plen == 3 && memcmp(piece, "<s>", 3) == 0);
  CHECK(gguf_vocab_piece(v, 40000, true, &piece, &plen, &err) == HEARTH_EINVAL);
  gguf_vocab_free(v);
  gguf_close(g);
}

static void test_special_tokens(void) {
  gguf_vocab *v;
  gguf_file *g = g_open(SUITE "ggml-vocab-gpt-2.gguf", &v);
  if (v) {
    int32_t ids[64];
    size_t n = enc(v, "a<|endoftext|>b", false, true, ids, 64);
    CHECK_EQ_INT(n, 3);
    if (n == 3) CHECK_EQ_INT(ids[1], 50256);
    n = enc(v, "a<|endoftext|>b", false, false, ids, 64);
    CHECK(n > 3);
    char *s = dec(v, ids, n, false);
    CHECK_EQ_STR(s, "a<|endoftext|>b");
    free(s);
    const int32_t eot[] = {50256};
    s = dec(v, eot, 1, true);
    CHECK_EQ_STR(s, "");
    free(s);
    CHECK(gguf_vocab_is_eog(v, 50256));
  }
  gguf_vocab_free(v);
  gguf_close(g);

  /* Phi-3: llama.cpp strips whitespace right of its special tokens */
  g = g_open(SUITE "ggml-vocab-phi-3.gguf", &v);
  if (v) {
    int32_t a[64], b[64];
    int32_t asst = gguf_vocab_find(v, "<|assistant|>");
    CHECK(asst > 0);
    size_t na = enc(v, "<|assistant|> \n Hi", false, true, a, 64);
    size_t nb = enc(v, "<|assistant|>Hi", false, true, b, 64);
    CHECK(na == nb && na >= 2 && memcmp(a, b, na * sizeof *a) == 0);
    CHECK_EQ_INT(a[0], asst);
  }
  gguf_vocab_free(v);
  gguf_close(g);

  /* BERT: add_special wraps in [CLS] ... [SEP] */
  g = g_open(SUITE "ggml-vocab-bert-bge.gguf", &v);
  if (v) {
    int32_t ids[64];
    size_t n = enc(v, "Hello world", true, false, ids, 64);
    CHECK(n == 4 && ids[0] == 101 && ids[3] == 102);
    char *s = dec(v, ids, n, true);
    CHECK_EQ_STR(s, " hello world");
    free(s);
  }
  gguf_vocab_free(v);
  gguf_close(g);
}

/* Vocabularies that ship without cases: decoding what was encoded gives the text back. */
static void test_round_trip(void) {
  static const char *const files[] = {"ggml-vocab-gpt-neox.gguf", "ggml-vocab-baichuan.gguf", "ggml-vocab-deepseek-llm.gguf",
                                      "ggml-vocab-starcoder.gguf", "ggml-vocab-llama-spm.gguf"};
  static const char *const texts[] = {
      "Hello world",
      "  leading spaces and   inner   runs\n\n\ttabs",
      "numbers 1234567 and 3.14159",
      "caf\xc3\xa9 na\xc3\xafve \xc3\x9c" "ber",
      "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c",
      "emoji \xf0\x9f\x98\x80\xf0\x9f\xa6\x99 mix",
      "code: for (int i = 0; i < n; i++) { x[i] = y[i]*2; }",
      "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xce\xb3\xce\xb5\xce\xb9\xce\xac",
  };
  for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
    char path[512];
    snprintf(path, sizeof path, "%s%s", SUITE, files[f]);
    gguf_vocab *v;
    gguf_file *g = g_open(path, &v);
    if (v) {
      for (size_t t = 0; t < sizeof texts / sizeof texts[0]; t++) {
        int32_t *ids = NULL;
        size_t n = 0;
        herr err = {0};
        CHECK_MSG(gguf_vocab_encode(v, texts[t], strlen(texts[t]), false, false, &ids, &n, &err) == 0, "%s", err.msg);
        char *s = dec(v, ids, n, false);
        CHECK_MSG(strcmp(s, texts[t]) == 0, "%s: '%s' came back as '%s'", files[f], texts[t], s);
        free(s);
        free(ids);
      }
    }
    gguf_vocab_free(v);
    gguf_close(g);
  }
}

/* ---- crafted vocabularies ---- */

typedef struct gb {
  unsigned char *d;
  size_t n, cap;
  uint64_t nkv;
} gb;

static void gb_bytes(gb *b, const void *p, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->d = realloc(b->d, b->cap);
  }
  memcpy(b->d + b->n, p, n);
  b->n += n;
}
static void gb_u32(gb *b, uint32_t v) { gb_bytes(b, &v, 4); }
static void gb_u64(gb *b, uint64_t v) { gb_bytes(b, &v, 8); }
static void gb_str(gb *b, const char *s) {
  gb_u64(b, strlen(s));
  gb_bytes(b, s, strlen(s));
}
static void gb_begin(gb *b) {
  b->n = 0;
  b->nkv = 0;
  gb_bytes(b, "GGUF", 4);
  gb_u32(b, 3);
  gb_u64(b, 0);
  gb_u64(b, 0); /* patched by gb_end */
}
static void gb_end(gb *b) { memcpy(b->d + 16, &b->nkv, 8); }
static void kv_str(gb *b, const char *k, const char *v) {
  gb_str(b, k), gb_u32(b, GGUF_TYPE_STRING), gb_str(b, v);
  b->nkv++;
}
static void kv_u32(gb *b, const char *k, uint32_t v) {
  gb_str(b, k), gb_u32(b, GGUF_TYPE_UINT32), gb_u32(b, v);
  b->nkv++;
}
static void kv_bool(gb *b, const char *k, bool v) {
  unsigned char c = v;
  gb_str(b, k), gb_u32(b, GGUF_TYPE_BOOL), gb_bytes(b, &c, 1);
  b->nkv++;
}
static void kv_strs(gb *b, const char *k, const char *const *v, size_t n) {
  gb_str(b, k), gb_u32(b, GGUF_TYPE_ARRAY), gb_u32(b, GGUF_TYPE_STRING), gb_u64(b, n);
  for (size_t i = 0; i < n; i++) gb_str(b, v[i]);
  b->nkv++;
}
static void kv_f32s(gb *b, const char *k, const float *v, size_t n) {
  gb_str(b, k), gb_u32(b, GGUF_TYPE_ARRAY), gb_u32(b, GGUF_TYPE_FLOAT32), gb_u64(b, n);
  gb_bytes(b, v, n * 4);
  b->nkv++;
}
static void kv_i32s(gb *b, const char *k, const int32_t *v, size_t n) {
  gb_str(b, k), gb_u32(b, GGUF_TYPE_ARRAY), gb_u32(b, GGUF_TYPE_INT32), gb_u64(b, n);
  gb_bytes(b, v, n * 4);
  b->nkv++;
}

static int load_crafted(gb *b, gguf_file **g, gguf_vocab **v, herr *err) {
  gb_end(b);
  *v = NULL;
  int rc = gguf_parse(b->d, b->n, "vocab.gguf", g, err);
  if (rc) return rc;
  return gguf_vocab_load(*g, "vocab.gguf", v, err);
}

static void expect_vocab_error(gb *b, const char *needle, const char *label) {
  gguf_file *g = NULL;
  gguf_vocab *v = NULL;
  herr err = {0};
  int rc = load_crafted(b, &g, &v, &err);
  CHECK_MSG(rc != 0, "%s: loaded", label);
  CHECK_MSG(v == NULL, "%s: returned a vocabulary on failure", label);
  CHECK_MSG(strstr(err.msg, needle) != NULL, "%s: message '%s' lacks '%s'", label, err.msg, needle);
  gguf_vocab_free(v);
  gguf_close(g);
}

static const char *const SPM_TOKENS[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "a", "ab"};

static void test_bad_vocabularies(void) {
  gb b = {0};
  float scores[8] = {0, 0, 0, -1, -2, -3, -4, -5};

  gb_begin(&b);
  kv_str(&b, "tokenizer.ggml.model", "llama");
  expect_vocab_error(&b, "tokenizer.ggml.tokens", "no tokens");

  gb_begin(&b);
  kv_strs(&b, "tokenizer.ggml.tokens", SPM_TOKENS, 8);
  expect_vocab_error(&b, "tokenizer.ggml.model", "no model");

  gb_begin(&b);
  kv_str(&b, "tokenizer.ggml.model", "rwkv");
  kv_strs(&b, "tokenizer.ggml.tokens", SPM_TOKENS, 8);
  expect_vocab_error(&b, "'rwkv' is not supported", "unsupported model");

  gb_begin(&b);
  kv_str(&b, "tokenizer.ggml.model", "gpt2");
  kv_str(&b, "tokenizer.ggml.pre", "no-such-pre");
  kv_strs(&b, "tokenizer.ggml.tokens", SPM_TOKENS, 8);
  kv_strs(&b, "tokenizer.ggml.merges", (const char *const[]){"a b"}, 1);
  expect_vocab_error(&b, "'no-such-pre'", "unknown pre-tokenizer");

  gb_begin(&b);
  kv_str(&b, "tokenizer.ggml.model", "gpt2");
  kv_strs(&b, "tokenizer.ggml.tokens", SPM_TOKENS, 8);
  expect_vocab_error(&b, "tokenizer.ggml.merges", "bpe without merges");

  gb_begin(&b);
  kv_str(&b, "tokenizer.ggml.model", "llama");
  kv_strs(&b, "tokenizer.ggml.tokens", (const char *const[]){"<unk>", "a", "a"}, 3);
  expect_vocab_error(&b, "'a' appears twice", "duplicate token");

  gb_begin(&b);
  kv_str(&b, "tokenizer.ggml.model", "llama");
  kv_strs(&b, "tokenizer.ggml.tokens", SPM_TOKENS, 8);
  kv_f32s(&b, "tokenizer.ggml.scores", scores, 4);
  expect_vocab_error(&b, "tokenizer.ggml.scores", "short scores");

  gb_begin(&b);
  kv_str(&b, "tokenizer.ggml.model", "llama");
  kv_strs(&b, "tokenizer.ggml.tokens", SPM_TOKENS, 8);
  kv_u32(&b, "tokenizer.ggml.token_type", 1);
  expect_vocab_error(&b, "tokenizer.ggml.token_type", "token types not an array");

  gb_begin(&b);
  kv_str(&b, "tokenizer.ggml.model", "llama");
  kv_strs(&b, "tokenizer.ggml.tokens", (const char *const[]){"x"}, 1);
  kv_bool(&b, "tokenizer.ggml.add_bos_token", true);
  expect_vocab_error(&b, "add_bos_token", "add_bos without bos");

  gb_begin(&b);
  kv_str(&b, "tokenizer.ggml.model", "llama");
  kv_strs(&b, "tokenizer.ggml.tokens", SPM_TOKENS, 8);
  kv_str(&b, "tokenizer.ggml.add_bos_token", "yes");
  expect_vocab_error(&b, "tokenizer.ggml.add_bos_token", "add_bos of wrong type");

  /* a small valid SPM vocabulary: merges by score, byte fallback absent → unknown */
  gb_begin(&b);
  kv_str(&b, "tokenizer.ggml.model", "llama");
  kv_strs(&b, "tokenizer.ggml.tokens", SPM_TOKENS, 8);
  kv_f32s(&b, "tokenizer.ggml.scores", scores, 8);
  kv_i32s(&b, "tokenizer.ggml.token_type", (const int32_t[]){2, 3, 3, 1, 1, 1, 1, 1}, 8);
  gguf_file *g = NULL;
  gguf_vocab *v = NULL;
  herr err = {0};
  CHECK_MSG(load_crafted(&b, &g, &v, &err) == 0, "%s", err.msg);
  if (v) {
    int32_t ids[16];
    /* "▁ab": "▁a" (-4) is the only merge of the first pair with a score... "ab" (-5) loses to "▁a" (-4) */
    size_t n = enc(v, "ab", false, false, ids, 16);
    CHECK_IDS(ids, n, 6, 5);
    n = enc(v, "c", true, false, ids, 16);
    CHECK_IDS(ids, n, 1, 3, 0); /* BOS, "▁", no byte token for 'c' → <unk> */
  }
  gguf_vocab_free(v);
  gguf_close(g);
  free(b.d);
}

/* t5 (UGM): Viterbi over token scores; user-defined pieces score 0; unknowns collapse. */
static void test_ugm(void) {
  static const char *const toks[] = {"<pad>", "</s>", "<unk>", "\xe2\x96\x81", "\xe2\x96\x81" "a", "b",
                                     "\xe2\x96\x81" "ab", "c", "\xe2\x96\x81" "abc", "<x>"};
  static const float sc[] = {0, 0, 0, -2, -2, -2, -3, -3, -9, 0};
  static const int32_t tt[] = {3, 3, 2, 1, 1, 1, 1, 1, 1, 4};
  gb b = {0};
  gb_begin(&b);
  kv_str(&b, "tokenizer.ggml.model", "t5");
  kv_strs(&b, "tokenizer.ggml.tokens", toks, 10);
  kv_f32s(&b, "tokenizer.ggml.scores", sc, 10);
  kv_i32s(&b, "tokenizer.ggml.token_type", tt, 10);
  kv_bool(&b, "tokenizer.ggml.add_space_prefix", true);
  kv_bool(&b, "tokenizer.ggml.remove_extra_whitespaces", true);
  gguf_file *g = NULL;
  gguf_vocab *v = NULL;
  herr err = {0};
  CHECK_MSG(load_crafted(&b, &g, &v, &err) == 0, "%s", err.msg);
  if (v) {
    int32_t ids[16];
    /* "▁abc": "▁ab"+"c" = -6 beats "▁abc" = -9 and "▁a"+"b"+"c" = -7 */
    size_t n = enc(v, "abc", false, false, ids, 16);
    CHECK_IDS(ids, n, 6, 7);
    /* extra spaces merge; EOS is added by default for t5 */
    n = enc(v, "  ab   c ", true, false, ids, 16);
    CHECK_IDS(ids, n, 6, 3, 7, 1);
    /* unknown characters collapse into one <unk> */
    n = enc(v, "a\xc3\xa9\xc3\xa9", false, false, ids, 16);
    CHECK_IDS(ids, n, 4, 2);
    /* a user-defined piece passes through normalization and scores 0 */
    n = enc(v, "a<x>", false, false, ids, 16);
    CHECK_IDS(ids, n, 4, 9);
    char *s = dec(v, (const int32_t[]){6, 3, 7}, 3, true);
    CHECK_EQ_STR(s, "ab c");
    free(s);
  }
  gguf_vocab_free(v);
  gguf_close(g);
  free(b.d);
}

/* Every tokenizer.ggml.pre value loads (its regexes compile) and, over a byte-level vocabulary
 * holding all 256 byte symbols, encodes text that decodes back unchanged. */
static void test_every_pre(void) {
  static const char *const pres[] = {
      "default", "minicpm5", "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
      "jina-v5-nano", "jais-2", "dbrx", "smaug-bpe", "deepseek-llm", "deepseek-coder", "deepseek-v3", "hunyuan-dense",
      "hy_v4", "joyai-llm", "spark2_5", "falcon", "mpt", "olmo", "jais", "trillion", "granite-docling", "starcoder", "refact",
      "codeshell", "exaone", "minerva-7b", "mellum2", "command-r", "smollm", "gpt-2", "phi-2", "jina-es", "jina-de",
      "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "exaone4", "jina-v1-en", "jina-v2-code",
      "roberta-bpe", "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open", "stablelm2", "megrez",
      "qwen35", "poro-chat", "bloom", "gpt3-finnish", "glm4", "chatglm-bpe", "viking", "tekken", "chameleon", "gpt-4o",
      "llama4", "kanana2", "talkie", "minimax-m2", "granite-embed-multi-97m", "tiny_aya", "cohere2moe", "superbpe",
      "bailingmoe", "bailingmoe2", "llada-moe", "seed-coder", "ufakzeka", "grok-2", "laguna", "exaone-moe"};
  /* the 256 byte symbols of byte-level BPE, then a few merged tokens and the specials */
  char sym[256][4];
  const char *toks[256 + 6];
  int extra = 0;
  for (int b = 0; b < 256; b++) {
    uint32_t cp = ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae)) ? (uint32_t)b : 256 + (uint32_t)extra++;
    memset(sym[b], 0, 4);
    if (cp < 0x80) sym[b][0] = (char)cp;
    else sym[b][0] = (char)(0xc0 | (cp >> 6)), sym[b][1] = (char)(0x80 | (cp & 0x3f));
    toks[b] = sym[b];
  }
  toks[256] = "\xc4\xa0H", toks[257] = "\xc4\xa0He", toks[258] = "ll", toks[259] = "<|endoftext|>", toks[260] = "<s>",
  toks[261] = "</s>";
  static const char *const merges[] = {"\xc4\xa0 H", "\xc4\xa0H e", "l l"};
  int32_t types[262];
  for (int i = 0; i < 262; i++) types[i] = i >= 259 ? 3 : 1;
  static const char text[] = "Hello World 123456789, it's caf\xc3\xa9  \t\n\n\xe4\xbd\xa0\xe5\xa5\xbd <s>IMGIMGABZ <sentinel:12> x";
  gb b = {0};
  for (size_t i = 0; i < sizeof pres / sizeof pres[0]; i++) {
    gb_begin(&b);
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_str(&b, "tokenizer.ggml.pre", pres[i]);
    kv_strs(&b, "tokenizer.ggml.tokens", toks, 262);
    kv_i32s(&b, "tokenizer.ggml.token_type", types, 262);
    kv_strs(&b, "tokenizer.ggml.merges", merges, 3);
    kv_u32(&b, "tokenizer.ggml.bos_token_id", 260);
    kv_u32(&b, "tokenizer.ggml.eos_token_id", 261);
    kv_u32(&b, "tokenizer.ggml.seperator_token_id", 261);
    gguf_file *g = NULL;
    gguf_vocab *v = NULL;
    herr err = {0};
    CHECK_MSG(load_crafted(&b, &g, &v, &err) == 0, "pre '%s': %s", pres[i], err.msg);
    if (v) {
      int32_t *ids = NULL;
      size_t n = 0;
      CHECK_MSG(gguf_vocab_encode(v, text, sizeof text - 1, false, false, &ids, &n, &err) == 0, "pre '%s': %s", pres[i], err.msg);
      char *s = dec(v, ids, n, false);
      CHECK_MSG(strcmp(s, text) == 0, "pre '%s': decoded '%s'", pres[i], s);
      free(s);
      free(ids);
    }
    gguf_vocab_free(v);
    gguf_close(g);
  }
  free(b.d);
}

int main(void) {
  RUN(test_llama2_fixture);
  RUN(test_special_tokens);
  RUN(test_round_trip);
  RUN(test_bad_vocabularies);
  RUN(test_ugm);
  RUN(test_every_pre);
  TEST_MAIN_END();
}
