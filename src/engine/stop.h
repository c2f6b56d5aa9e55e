/* stop.h — stop strings on streamed text, with hold-back.
 *
 * Text arrives in pieces (detokenized deltas). The matcher emits only text
 * that can no longer be part of a stop string: a tail that is a prefix of
 * some stop is held until the next piece settles it, and a tail that ends
 * inside a UTF-8 sequence is held until the sequence completes. When a stop
 * string appears, the text before it is emitted, the stop string and
 * everything after it are dropped, and the matcher reports which stop it was.
 * When several stops occur, the one that completes first wins (the occurrence
 * that ends earliest; then the one that starts earliest; then the one listed
 * first), so the result never depends on how the text was cut into pieces.
 */
#ifndef HEARTH_ENGINE_STOP_H
#define HEARTH_ENGINE_STOP_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"
#include "base/status.h"

typedef struct stop_matcher stop_matcher;

/* stops[0..n) are copied; empty strings are an error. n may be 0 (the matcher
 * then only holds back incomplete UTF-8). */
int stop_matcher_new(const char *const *stops, size_t n, stop_matcher **out, herr *err);
void stop_matcher_free(stop_matcher *m);

/* Feeds piece[0..len) and appends what is now final to out. Returns the index
 * of the stop string found (>= 0), or -1 when none yet. After a match the
 * matcher ignores further input. Returns -2 when out ran out of memory. */
int stop_matcher_put(stop_matcher *m, const char *piece, size_t len, hbuf *out);
/* At the end of generation (no stop matched): appends whatever is held. */
void stop_matcher_flush(stop_matcher *m, hbuf *out);
/* Bytes currently held back. */
size_t stop_matcher_held(const stop_matcher *m);
/* Length of the longest stop string. */
size_t stop_matcher_max_len(const stop_matcher *m);

#endif
