/* fuzz_grammar — the GBNF compiler, the JSON Schema compiler and the matcher
 * over arbitrary input. Byte 0 picks the mode: even, the rest up to the first
 * 0x00 is GBNF; odd, it is a JSON Schema. After the 0x00 comes text fed to
 * the matcher byte by byte over a byte vocabulary. Whatever the input: no
 * crash, no leak; a compiled grammar's mask agrees with accept for every
 * token at every step; a refused byte leaves the state unchanged. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"

static grammar_vocab *vocab;

static void make_vocab(void) {
  static char bytes[256];
  const char *p[257];
  size_t l[257];
  for (int i = 0; i < 256; i++) bytes[i] = (char)i, p[i] = &bytes[i], l[i] = 1;
  p[256] = "", l[256] = 0; /* the end token */
  if (grammar_vocab_from_bytes(p, l, 257, &vocab, NULL)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!vocab) make_vocab();
  if (size < 1) return 0;
  const uint8_t *body = data + 1, *end = data + size;
  const uint8_t *nul = memchr(body, 0, (size_t)(end - body));
  size_t glen = nul ? (size_t)(nul - body) : (size_t)(end - body);
  const uint8_t *text = nul ? nul + 1 : end;
  size_t tlen = (size_t)(end - text);
  hbuf gbnf = {0};
  herr e = {0};
  if (data[0] & 1) {
    if (json_schema_to_gbnf((const char *)body, glen, &gbnf, &e)) {
      if (!e.msg[0]) abort(); /* a refusal always says why */
      hbuf_free(&gbnf);
      return 0;
    }
  } else {
    hbuf_append(&gbnf, (const char *)body, glen);
  }
  grammar *g = NULL;
  if (grammar_compile(hbuf_str(&gbnf), gbnf.len, &g, &e)) {
    if (!e.msg[0]) abort();
    /* a schema's grammar always compiles */
    if (data[0] & 1) abort();
    hbuf_free(&gbnf);
    return 0;
  }
  int32_t end_id = 256;
  grammar_matcher *m = NULL;
  if (grammar_matcher_new(g, vocab, &end_id, 1, &m, &e) == 0) {
    for (size_t i = 0; i < tlen && i < 64; i++) {
      const uint64_t *mask;
      int32_t n;
      if (grammar_matcher_mask(m, &mask, &n, &e)) break;
      int32_t counted = 0;
      for (int32_t id = 0; id <= 256; id++) counted += (int32_t)(mask[id / 64] >> (id % 64) & 1);
      if (counted != n) abort();
      int32_t id = text[i];
      bool allowed = mask[id / 64] >> (id % 64) & 1;
      if (allowed != grammar_matcher_allows(m, id)) abort();
      uint32_t before = grammar_matcher_distance(m);
      int rc = grammar_matcher_accept(m, id, &e);
      if ((rc == 0) != allowed) abort();
      if (rc && grammar_matcher_distance(m) != before) abort();
      const uint64_t *bm;
      if (grammar_matcher_mask_budget(m, (int64_t)(text[i] % 8), &bm, &n, &e)) break;
    }
    grammar_matcher_free(m);
  }
  grammar_free(g);
  hbuf_free(&gbnf);
  return 0;
}
