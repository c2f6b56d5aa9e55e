/* dry_breakers.h — DRY's sequence breakers made from strings for a vocabulary,
 * as llama.cpp makes them: every token whose text holds the string is a
 * breaker on its own; a token whose text ends with the string's beginning is
 * the head of a breaker whose tail is the rest of the string, tokenized (at
 * most SAMPLE_DRY_MAX_TAIL tokens). A string is cut to its first 40 bytes. */
#ifndef HEARTH_ENGINE_DRY_BREAKERS_H
#define HEARTH_ENGINE_DRY_BREAKERS_H

#include "engine/sample.h"
#include "tokenizer/tokenizer.h"

#define DRY_BREAKER_MAX_BYTES 40

/* llama.cpp's default breakers: "\n", ":", "\"", "*". */
extern const char *const dry_default_breakers[4];

/* *out (malloc'd, *n entries) for the n_strs strings. An empty string is an
 * error naming dry_sequence_breakers. */
int dry_breakers_build(const tokenizer *t, const char *const *strs, int n_strs, sample_dry_breaker **out, size_t *n,
                       herr *err);

#endif
