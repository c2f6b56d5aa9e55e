/* signal.h — POST /v1/signal (hearth's own endpoint): the request (a prompt
 * as text or token ids, or chat messages to render) parsed and checked, and
 * the reply: the next token's log-probability histogram, entropy and best
 * tokens as JSON. */
#ifndef HEARTH_SERVE_SIGNAL_H
#define HEARTH_SERVE_SIGNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "serve/engine.h"
#include "serve/request.h"

#define SIGNAL_DEFAULT_BINS 20
#define SIGNAL_DEFAULT_TOP 5

typedef struct signal_request {
  char *model;          /* owned; NULL when absent */
  char *prompt;         /* owned: a raw prompt, or NULL */
  int32_t *ids;         /* owned: the prompt as ids, or NULL */
  size_t n_ids;
  serve_request chat;   /* messages (and tools, chat_template_kwargs) when chat is set */
  bool is_chat;
  int bins;             /* 1..HEARTH_SIGNAL_MAX_BINS (default SIGNAL_DEFAULT_BINS) */
  int top;              /* 0..HEARTH_MAX_TOP_LOGPROBS (default SIGNAL_DEFAULT_TOP) */
} signal_request;

/* Exactly one of prompt (a non-empty string, or an array of token ids below
 * vocab when vocab > 0) and messages (parsed as a chat completion's);
 * bins, top, model. On failure returns the HTTP status with f filled and
 * leaves *req empty. */
int signal_request_parse(const char *body, size_t len, int64_t vocab, signal_request *req, serve_fail *f);
void signal_request_free(signal_request *req);

/* {"object":"signal","model":...,"bins":[{"lo","hi","count","mass"}...],
 *  "range":[lo,hi],"entropy":...,"max_logprob":...,"min_logprob":...,
 *  "tokens":n,"top":[{"id","token","logprob"}...],"usage":{...}} */
void signal_reply(const serve_signal *s, const char *model, hbuf *out);

#endif
