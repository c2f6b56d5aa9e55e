/* emit.h — what happens to each sampled token, shared by the scheduler and
 * block diffusion's denoising runs: EOS ids end the request, the token is detokenized
 * (streaming, UTF-8 held back until whole), stop strings are matched on the
 * text with hold-back of a possible partial match, max_tokens ends it; at
 * the end what is held back is released (or ends in a stop string).
 * The text that became final in a step is in delta. */
#ifndef HEARTH_ENGINE_EMIT_H
#define HEARTH_ENGINE_EMIT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"
#include "engine/request.h"
#include "engine/stop.h"
#include "tokenizer/tokenizer.h"

typedef struct gen_emit {
  tokenizer_stream *detok;  /* owned, NULL without a tokenizer (then no text) */
  stop_matcher *stops;      /* owned, NULL without a tokenizer */
  hbuf piece;               /* owned: this step's detokenized bytes */
  hbuf delta;               /* owned: the text released by the last call */
} gen_emit;

/* tok may be NULL (ids only; stop strings are then an error). */
int gen_emit_init(gen_emit *e, const tokenizer *tok, const gen_request *req, herr *err);
void gen_emit_free(gen_emit *e);

/* One sampled token id: counts it in res->completion_tokens, fills delta,
 * and sets *ended (with res->finish, stop_index / stop_token) when it ends
 * the request: an EOS id, a stop string, or max_new tokens. */
int gen_emit_token(gen_emit *e, const gen_request *req, int32_t id, int64_t max_new, gen_result *res, bool *ended,
                   herr *err);

/* The end of a run that did not end in a stop string: releases the
 * detokenizer's and the stop matcher's held-back text into delta (a stop
 * string completed by it ends the request there). */
int gen_emit_flush(gen_emit *e, gen_result *res, herr *err);

#endif
