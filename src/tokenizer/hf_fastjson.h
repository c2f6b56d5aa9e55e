/* hf_fastjson.h — reading model.vocab and model.merges of a tokenizer.json
 * straight from the text (see hf_fastjson.c). Internal to the tokenizer module. */
#ifndef HEARTH_TOKENIZER_HF_FASTJSON_H
#define HEARTH_TOKENIZER_HF_FASTJSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

typedef struct hf_fast_ranges {
  const char *vocab, *vocab_end;   /* the model.vocab object (borrowed from the text) */
  const char *merges, *merges_end; /* the model.merges array, NULL when absent */
  char *rest;                      /* owned: the text with both replaced by null */
  size_t rest_len;
} hf_fast_ranges;

/* 0 when model.vocab is an object that could be located; -1 to use the plain path. */
int hf_fast_split(const char *json, size_t len, hf_fast_ranges *r);
/* Decodes a JSON string at *p into out (valid UTF-8 required); -1 when malformed. */
int hf_fast_string(const char **p, const char *end, hbuf *out);
int hf_fast_int(const char **p, const char *end, int64_t *v);
const char *hf_fast_ws(const char *p, const char *end);

#endif
