/* fuzz_tokenizer_encode.c — encoding arbitrary text with small tokenizers of
 * every model kind (the synth_* fixtures: byte-level BPE with added tokens,
 * WordPiece, Unigram with byte fallback, BPE with a suffix): the first byte
 * picks the tokenizer and the flags; invalid UTF-8 must be refused cleanly;
 * valid text encodes, decodes and streams without trouble. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static const char *names[] = {"bytelevel_roberta", "wordpiece_bert", "unigram_bytefallback", "bpe_suffix",
                              "unigram_metaspace", "bytelevel_ignore_merges"};
#define NTOK (sizeof names / sizeof names[0])
static tokenizer *toks[NTOK];

static void cleanup(void) {
  for (size_t i = 0; i < NTOK; i++) tokenizer_free(toks[i]);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  for (size_t i = 0; i < NTOK; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer/synth_%s.tokenizer.json", HEARTH_SOURCE_DIR, names[i]);
    herr e = {0};
    if (tokenizer_load(path, &toks[i], &e)) {
      fprintf(stderr, "fuzz_tokenizer_encode: %s\n", e.msg);
      exit(1);
    }
  }
  atexit(cleanup);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const tokenizer *t = toks[data[0] % NTOK];
  bool add_special = data[0] & 0x40, parse_special = data[0] & 0x80;
  int32_t *ids = NULL;
  size_t n = 0;
  herr e = {0};
  if (tokenizer_encode(t, (const char *)data + 1, size - 1, add_special, parse_special, &ids, &n, &e)) return 0;
  hbuf out = {0}, sout = {0};
  tokenizer_decode(t, ids, n, false, &out, &e);
  tokenizer_stream *s = tokenizer_stream_new(t, false);
  for (size_t i = 0; i < n; i++) tokenizer_stream_put(s, ids[i], &sout, &e);
  tokenizer_stream_flush(s, &sout, &e);
  tokenizer_stream_free(s);
  hbuf_free(&out);
  hbuf_free(&sout);
  free(ids);
  return 0;
}
