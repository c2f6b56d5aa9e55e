/* test_gguf_codepoints.c — llama.cpp's test-tokenizer-1 property on GGUF
 * vocabularies: every code point of the Basic Multilingual Plane (and a
 * stride through the others), encoded alone and decoded again, gives itself
 * back. Exceptions as llama.cpp's test: surrogates, U+FEFF, and U+2581
 * (SentencePiece's space marker, which decodes to a space). Vocabularies that
 * lack some byte-level symbols (falcon, starcoder: llama.cpp drops bytes it
 * has no token for) cannot pass and are not listed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/utf8.h"
#include "format/gguf.h"
#include "test.h"
#include "tokenizer/gguf_vocab.h"

#define SUITE HEARTH_DEPS_DIR "/llama.cpp/vocab/"

static void check_vocab(const char *file) {
  char path[512];
  snprintf(path, sizeof path, "%s%s", SUITE, file);
  gguf_file *g = NULL;
  gguf_vocab *v = NULL;
  herr err = {0};
  CHECK_MSG(gguf_open(&g, path, &err) == 0, "%s", err.msg);
  if (g) CHECK_MSG(gguf_vocab_load(g, file, &v, &err) == 0, "%s", err.msg);
  if (!v) {
    gguf_close(g);
    return;
  }
  int bad = 0, checked = 0;
  hbuf out = {0};
  for (uint32_t cp = 1; cp < 0x110000; cp += cp < 0x10000 ? 1 : 97) {
    if ((cp >= 0xd800 && cp <= 0xdfff) || cp == 0xfeff || cp == 0x2581) continue;
    char s[4];
    int l = utf8_encode(cp, s);
    int32_t *ids = NULL;
    size_t n = 0;
    herr e = {0};
    hbuf_clear(&out);
    bool ok = gguf_vocab_encode(v, s, (size_t)l, false, false, &ids, &n, &e) == 0 &&
              gguf_vocab_decode(v, ids, n, false, &out, &e) == 0 && out.len == (size_t)l && memcmp(out.data, s, (size_t)l) == 0;
    if (!ok && bad++ < 5) fprintf(stderr, "  %s: U+%04X comes back as '%s'\n", file, cp, hbuf_str(&out));
    checked++;
    free(ids);
  }
  hbuf_free(&out);
  fprintf(stderr, "%-30s %d code points, %d do not round-trip\n", file, checked, bad);
  CHECK_EQ_INT(bad, 0);
  gguf_vocab_free(v);
  gguf_close(g);
}

static void test_bpe(void) {
  check_vocab("ggml-vocab-gpt-2.gguf");
  check_vocab("ggml-vocab-deepseek-coder.gguf");
}

static void test_spm(void) { check_vocab("ggml-vocab-llama-spm.gguf"); }

int main(void) {
  RUN(test_bpe);
  RUN(test_spm);
  TEST_MAIN_END();
}
