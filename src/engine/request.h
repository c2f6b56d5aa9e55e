/* request.h — one generation request as the engine takes it, its result,
 * and the per-token callback; the scheduler (sched.h) runs it.
 *
 *   prompt ids → prefill in chunks → decode (the request's method) → sample →
 *   detokenize (streaming) → stop-string hold-back → callback with the delta
 *
 * Ends on max_tokens (finish "length"), an EOS id or a stop string (finish
 * "stop"), or cancellation: *cancel set or the callback returning nonzero;
 * then the run returns HEARTH_ECANCELLED with the result filled and
 * everything it allocated freed.
 *
 * The prompt plus max_tokens must fit the context length; otherwise
 * HEARTH_ELIMIT before any work, with a message that starts
 * "context_length_exceeded:".
 */
#ifndef HEARTH_ENGINE_REQUEST_H
#define HEARTH_ENGINE_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/sample.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#define GEN_DEFAULT_PREFILL_CHUNK 512
#define GEN_MAX_EOS 32

typedef struct gen_request {
  const int32_t *prompt;        /* borrowed, n_prompt >= 1 ids */
  size_t n_prompt;
  int64_t max_tokens;           /* < 0: up to the context length */
  int64_t context_length;       /* <= 0: the model's max_position_embeddings */
  sample_params sample;
  const char *const *stop;      /* borrowed; matched on decoded text (needs a tokenizer) */
  size_t n_stop;
  int32_t eos_ids[GEN_MAX_EOS]; /* generating one of these ends with "stop" */
  int n_eos;
  bool ignore_eos;
  bool skip_special;            /* leave special tokens out of the text (default for serving) */
  int prefill_chunk;            /* tokens per prefill forward; <= 0: GEN_DEFAULT_PREFILL_CHUNK */
  const volatile int *cancel;   /* borrowed, may be NULL: nonzero cancels */
  const char *grammar;          /* borrowed, may be NULL: GBNF (structured/grammar.h) the output follows */
  size_t grammar_len;
  const char *trace_label;      /* borrowed, may be NULL: names the request's track in a trace
                                   ("req LABEL"; else "req N", N counting requests) */
  int spec_tokens;              /* speculative decoding (engine/method.h): tokens drafted per step; < 0: the
                                   scheduler's method decides, 0: off */
  const char *spec_method;      /* borrowed, may be NULL (the method's source): where this request's drafts
                                   come from, "ngram", "draft" or "mtp" (engine/method.h) */
  const model_lora *const *lora; /* borrowed, n_lora (<= MODEL_MAX_LORA) LoRA adapters of the model,
                                   their deltas summed (model_seq.lora); alive until the run returns */
  int n_lora;
  /* Media in the prompt (engine/mm_prompt.h). All borrowed, NULL: none. */
  const float *const *embeds;   /* n_prompt entries: NULL, or a soft token's embedding row (model_seq.embeds) */
  const int32_t *bidir_last;    /* n_prompt entries (model_seq.bidir_last); a prefill chunk never ends inside a span */
  const int32_t *positions3;    /* 3 per prompt token (model_seq.positions3); the tokens after the prompt take
                                   row + pos_delta on every axis */
  int64_t pos_delta;
  const int32_t *prefix_keys;   /* n_prompt entries the prefix cache hashes instead of the prompt's ids */
  int priority;                 /* the scheduler's admission order: a waiting request of a smaller priority is
                                   admitted before any of a larger one, equal ones in arrival order (0: the
                                   default; a server's batch rows run at 1, behind interactive requests) */
} gen_request;

/* Defaults: greedy-free neutral sampling, no stops, no EOS, skip_special true. */
void gen_request_init(gen_request *r);

typedef enum gen_finish { GEN_FINISH_STOP = 0, GEN_FINISH_LENGTH = 1, GEN_FINISH_CANCELLED = 2 } gen_finish;

typedef struct gen_result {
  gen_finish finish;
  int stop_index;               /* which stop string ended it; -1 otherwise */
  int32_t stop_token;           /* the EOS id that ended it; -1 otherwise */
  int64_t prompt_tokens, completion_tokens;  /* completion counts the EOS token when one ended it */
  int64_t cached_tokens;        /* prompt tokens whose KV came from the prefix cache */
  double prefill_seconds, decode_seconds;
  double queue_seconds;         /* waiting in the scheduler's queue before its first admission */
} gen_result;

/* Per step: delta is the text that became final (may be empty while held
 * back), tok the sampled token. At the end, held-back text comes in one last
 * call with tok == NULL. Return nonzero to cancel. */
typedef int (*gen_token_fn)(void *user, const char *delta, size_t len, const sample_token *tok);

/* Resolves max_tokens against the context (HEARTH_ELIMIT "context_length_exceeded: ..."
 * when the request cannot fit); fills *max_new. */
int gen_check_context(const model *m, const gen_request *req, int64_t *max_new, herr *err);

#endif
