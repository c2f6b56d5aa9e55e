/* gguf_vocab_internal.h — pieces shared by gguf_vocab.c, gguf_vocab_pre.c and gguf_vocab_split.c:
 * code point classes as llama.cpp computes them, its lenient UTF-8 decoding,
 * and the pre-tokenizer that splits text into words by a list of regexes
 * applied one after another. Not an interface for other modules. */
#ifndef HEARTH_TOKENIZER_GGUF_VOCAB_INTERNAL_H
#define HEARTH_TOKENIZER_GGUF_VOCAB_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* Code point classes (llama.cpp's unicode_cpt_flags): a general-category
 * bit, plus the Unicode White_Space property. Code points past U+10FFFF have
 * no bits at all; unassigned ones have GV_UNDEFINED. */
enum {
  GV_UNDEFINED = 0x001,
  GV_NUMBER = 0x002,
  GV_LETTER = 0x004,
  GV_SEPARATOR = 0x008,
  GV_MARK = 0x010,
  GV_PUNCT = 0x020,
  GV_SYMBOL = 0x040,
  GV_CONTROL = 0x080,
  GV_CATEGORY_MASK = 0x0ff,
  GV_WHITESPACE = 0x100,
};

unsigned gv_cpt_flags(uint32_t cp);
uint32_t gv_tolower(uint32_t cp);
/* The first code point of cp's canonical decomposition (cp itself when it has none). */
uint32_t gv_nfd_first(uint32_t cp);

/* Decodes s[0..n) the way llama.cpp does: lenient about overlong forms and
 * surrogates, one U+FFFD per byte that cannot start a sequence. *out is
 * malloc'd (caller frees); returns false on out of memory. */
bool gv_decode(const char *s, size_t n, uint32_t **out, size_t *ncp);
/* Decodes one code point at s[0..n) the same lenient way; returns its byte
 * length, or 0 when the bytes there do not form one. */
size_t gv_decode_one(const char *s, size_t n, uint32_t *cp);
/* Encodes cp (up to 0x10FFFF, surrogates included) into out[0..4); code
 * points past U+10FFFF become U+FFFD. Returns the length. */
int gv_encode(uint32_t cp, char *out);

/* The pre-tokenizer: an ordered list of regexes, each splitting the pieces
 * the previous ones made (matches and the text between them both become
 * pieces). The GPT-2 and Llama-3 patterns run as hand-written scanners, the
 * rest through PCRE2 with the same rewriting llama.cpp applies. */
typedef struct gv_splitter gv_splitter;

int gv_splitter_new(const char *const *regexes, size_t n, gv_splitter **out, herr *err);
void gv_splitter_free(gv_splitter *s);
/* Splits cps[0..n) into pieces; *lens (malloc'd, caller frees) gets the
 * length in code points of each piece, in order. */
int gv_split(const gv_splitter *s, const uint32_t *cps, size_t n, size_t **lens, size_t *nlens, herr *err);

/* Pre-tokenizers by tokenizer.ggml.pre value. */
enum {
  GV_PRE_NOCLEAN = 1,        /* no space clean-up on decode */
  GV_PRE_IGNORE_MERGES = 2,  /* a word that is a token is not merged */
  GV_PRE_ADD_BOS = 4,
  GV_PRE_ADD_SEP = 8,
  GV_PRE_NO_BOS = 16,
  GV_PRE_ESCAPE_WS = 32,     /* spaces become U+2581 before splitting */
  GV_PRE_RAW_UTF8 = 64,      /* merges run on raw UTF-8, byte fallback through <0xXX> tokens */
  GV_PRE_NEWLINE_WORDS = 128 /* a run of newlines that is a token stays whole */
};

typedef struct gv_pre {
  const char *names;          /* '|'-separated tokenizer.ggml.pre values */
  const char *const *regexes; /* NULL-terminated, applied in order */
  int flags;                  /* GV_PRE_* */
} gv_pre;

/* NULL when name is not a known pre-tokenizer. */
const gv_pre *gv_find_pre(const char *name);

#endif
