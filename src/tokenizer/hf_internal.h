/* hf_internal.h — the pieces of the Hugging Face tokenizer.json pipeline, shared
 * between the files of this module (never included from outside it):
 *   hf_unicode.c    character classes, case mapping, normalization forms, lossy UTF-8
 *   hf_normalize.c  normalizers          hf_pretok.c   pre-tokenizers
 *   hf_model.c      BPE / WordPiece / Unigram      hf_decode.c   decoders
 *   hf_tokenizer.c  loading, added tokens, post-processing, encode / decode
 */
#ifndef HEARTH_TOKENIZER_HF_INTERNAL_H
#define HEARTH_TOKENIZER_HF_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/buf.h"
#include "base/dict.h"
#include "base/status.h"

/* ---- unicode (hf_unicode.c) ---- */
bool hfu_is_whitespace(uint32_t c);   /* Rust char::is_whitespace */
bool hfu_is_punctuation(uint32_t c);  /* ASCII punctuation or Unicode P* */
bool hfu_is_numeric(uint32_t c);      /* Nd | Nl | No */
bool hfu_is_word_char(uint32_t c);    /* regex \w: alphabetic, marks, Nd, Pc, joiners */
bool hfu_is_control(uint32_t c);      /* BERT: C* except \t \n \r */
bool hfu_is_mark_nonspacing(uint32_t c);
bool hfu_is_combining_mark(uint32_t c);
bool hfu_is_chinese(uint32_t c);
/* Appends the lowercase of s[0..n) (Rust str::to_lowercase, with final sigma). */
void hfu_lowercase(const char *s, size_t n, hbuf *out);
/* Appends the normalization form of s[0..n): form is 'C', 'D', 'K' (NFKC) or 'k' (NFKD). */
int hfu_normalize_form(const char *s, size_t n, char form, hbuf *out);
/* Appends bytes as UTF-8, each maximal invalid subsequence replaced by U+FFFD. */
void hfu_append_lossy(hbuf *out, const unsigned char *b, size_t n);
/* Byte-level alphabet: the UTF-8 of the char standing for byte b, and back (-1 if none). */
const char *hfu_byte_char(unsigned b, int *len);
int hfu_char_byte(uint32_t c);

/* ---- a u64 → u64 open-addressing map (merges, tries) ---- */
typedef struct hf_u64map {
  uint64_t *keys; /* owned; key+1 stored, 0 = empty */
  uint64_t *vals; /* owned */
  size_t cap, count;
} hf_u64map;
bool hf_u64map_put(hf_u64map *m, uint64_t key, uint64_t val);
bool hf_u64map_get(const hf_u64map *m, uint64_t key, uint64_t *val);
void hf_u64map_free(hf_u64map *m);

/* ---- regex ---- */
typedef struct hf_regex {
  pcre2_code *code; /* owned */
} hf_regex;
int hf_regex_compile(hf_regex *r, const char *pattern, size_t len, bool literal, const char *what, herr *err);
void hf_regex_free(hf_regex *r);
/* Finds the next match at or after start in s[0..n); returns false when none. */
bool hf_regex_next(const hf_regex *r, pcre2_match_data *md, const char *s, size_t n, size_t start, size_t *mstart,
                   size_t *mend);

/* ---- splits: pieces of text being tokenized ---- */
typedef struct hf_split {
  size_t off, len;  /* into the owning hf_splits.text */
  int32_t id;       /* >= 0: already a token (added token); -1: text to tokenize */
  bool at_start;    /* begins at offset 0 of the original input */
} hf_split;

typedef struct hf_splits {
  hbuf text;
  hf_split *v; /* owned */
  size_t n, cap;
} hf_splits;

bool hf_splits_push(hf_splits *s, const char *p, size_t len, int32_t id, bool at_start);
void hf_splits_clear(hf_splits *s);
void hf_splits_free(hf_splits *s);

/* ---- normalizers (hf_normalize.c) ---- */
typedef struct hf_normalizer hf_normalizer;
int hf_normalizer_parse(const json_t *j, hf_normalizer **out, const char *what, herr *err);
void hf_normalizer_free(hf_normalizer *n);
/* Appends the normalized s[0..n) to out. */
int hf_normalize(const hf_normalizer *n, const char *s, size_t len, hbuf *out, herr *err);

/* ---- pre-tokenizers (hf_pretok.c) ---- */
enum { HF_SPLIT_REMOVED, HF_SPLIT_ISOLATED, HF_SPLIT_MERGED_PREV, HF_SPLIT_MERGED_NEXT, HF_SPLIT_CONTIGUOUS };
typedef struct hf_pretok hf_pretok;
int hf_pretok_parse(const json_t *j, hf_pretok **out, const char *what, herr *err);
void hf_pretok_free(hf_pretok *p);
/* Rewrites in into out (cleared first); splits with id >= 0 pass through unchanged. */
int hf_pretokenize(const hf_pretok *p, const hf_splits *in, hf_splits *out, herr *err);

/* ---- models (hf_model.c) ---- */
typedef struct hf_model hf_model;
struct hf_fast_ranges;
/* Returned by parsers fed the fast path when the text needs the plain path. */
#define HF_FAST_FALLBACK 1000
/* fast: model.vocab / model.merges located in the text (hf_fastjson.h), or NULL to read them from j. */
int hf_model_parse(const json_t *j, const struct hf_fast_ranges *fast, hf_model **out, const char *what, herr *err);
void hf_model_free(hf_model *m);
/* Appends the ids of one pre-tokenized word to *ids (grown with realloc). */
int hf_model_tokenize(const hf_model *m, const char *s, size_t len, int32_t **ids, size_t *n, size_t *cap, herr *err);
int32_t hf_model_vocab_size(const hf_model *m);     /* 1 + the largest id */
const char *hf_model_id_to_token(const hf_model *m, int32_t id, size_t *len);
int32_t hf_model_token_to_id(const hf_model *m, const char *tok, size_t len);

/* ---- decoders (hf_decode.c) ---- */
typedef struct hf_strlist {
  hbuf data;
  size_t *off, *len; /* owned */
  size_t n, cap;
} hf_strlist;
bool hf_strlist_push(hf_strlist *l, const char *s, size_t len);
void hf_strlist_clear(hf_strlist *l);
void hf_strlist_free(hf_strlist *l);

typedef struct hf_decoder hf_decoder;
int hf_decoder_parse(const json_t *j, hf_decoder **out, const char *what, herr *err);
void hf_decoder_free(hf_decoder *d);
/* Decodes the token strings and appends the joined text to out. */
int hf_decode_tokens(const hf_decoder *d, const hf_strlist *tokens, hbuf *out, herr *err);
/* The bytes one token adds in the middle of a text (no first/last-token rules, no UTF-8 repair). */
int hf_decode_token_raw(const hf_decoder *d, const char *tok, size_t len, hbuf *out, herr *err);

/* ---- the whole pipeline (hf_tokenizer.c) ---- */
typedef struct hf_tokenizer hf_tokenizer;
int hf_tokenizer_load(const char *json, size_t len, const char *config_json, size_t config_len, const char *what,
                      hf_tokenizer **out, herr *err);
void hf_tokenizer_free(hf_tokenizer *t);
int hf_tokenizer_encode(const hf_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                        int32_t **ids, size_t *n, herr *err);
/* As hf_tokenizer_encode; without parse_special the added tokens lit[0..nlit) are not read either. */
int hf_tokenizer_encode_ex(const hf_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                           const int32_t *lit, size_t nlit, int32_t **ids, size_t *n, herr *err);
int hf_tokenizer_decode(const hf_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, hbuf *out, herr *err);
int32_t hf_tokenizer_vocab_size(const hf_tokenizer *t);
int hf_tokenizer_token_bytes(const hf_tokenizer *t, int32_t id, hbuf *out, herr *err);
const char *hf_tokenizer_id_to_token(const hf_tokenizer *t, int32_t id);
int32_t hf_tokenizer_token_to_id(const hf_tokenizer *t, const char *tok);
bool hf_tokenizer_is_special(const hf_tokenizer *t, int32_t id);
int32_t hf_tokenizer_bos(const hf_tokenizer *t);
int32_t hf_tokenizer_eos(const hf_tokenizer *t);

/* JSON helpers shared by the parsers: a string field that may be {"String": s} / {"Regex": r}. */
int hf_json_pattern(const json_t *obj, const char *key, const char **pat, size_t *len, bool *literal, const char *what,
                    herr *err);

#endif
