/* responses.h — the OpenAI Responses API as a protocol unit of the server:
 * a /v1/responses body parsed into the protocol-neutral serve_request (input
 * items and instructions become chat messages; function tools; tool_choice;
 * reasoning.effort; text.format), the response object and its stream of
 * typed events (response.created … response.completed, with output items,
 * content parts, text / reasoning / function-call-argument deltas and a
 * sequence_number on each), and the bounded store that keeps responses for
 * GET, DELETE and previous_response_id. Pure parsing, formatting and
 * bookkeeping: no sockets, no model. */
#ifndef HEARTH_SERVE_RESPONSES_H
#define HEARTH_SERVE_RESPONSES_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"
#include "chat/toolcall.h"
#include "serve/engine.h"
#include "serve/request.h"

/* ---- the store ---- */

/* Responses by id, with the conversation each ends (input and output items
 * of it and of the responses before it). Bounded by count, bytes (of the
 * stored JSON) and age; the oldest go first. Thread-safe. */
typedef struct resp_store resp_store;

/* max_count / max_bytes: 0 = unbounded; ttl_s <= 0: no expiry. */
int resp_store_new(size_t max_count, size_t max_bytes, int64_t ttl_s, resp_store **out, herr *err);
void resp_store_free(resp_store *s);
/* Keeps copies of the response (its "id" is the key) and the conversation.
 * An entry larger than max_bytes on its own is not kept. */
void resp_store_put(resp_store *s, const json_t *response, const json_t *conversation);
/* New references, or NULL when absent or expired; conversation may be NULL. */
json_t *resp_store_get(resp_store *s, const char *id, json_t **conversation);
/* Whether it was there. */
bool resp_store_delete(resp_store *s, const char *id);
void resp_store_counts(resp_store *s, size_t *count, size_t *bytes);

/* ---- requests ---- */

typedef struct resp_request {
  char *previous_id;   /* owned; NULL: a new conversation */
  bool store;          /* keep the response (default true) */
  json_t *input;       /* owned: this request's input as an array of items */
  json_t *echo;        /* owned: the request fields the response object repeats */
} resp_request;

/* Parses a Responses request: req gets the model, stream, sampling
 * (max_output_tokens, temperature, top_p), tools, tool_choice, template
 * kwargs (reasoning.effort) and the output grammar (text.format); rr the
 * rest. Messages come from resp_request_messages. On failure returns nonzero
 * with f filled (400, param naming the field, as "input[2].content[0]"). */
int resp_request_parse(const char *body, size_t len, serve_request *req, resp_request *rr, serve_fail *f);
/* The tools and tool_choice as Responses writes them ({"type": "function", "name", "parameters"}). */
extern const serve_tools_dialect resp_tools_dialect;
/* req->messages: the instructions (a system message), the history's items (a
 * stored conversation, may be NULL), then rr->input. A NAME_call item with a
 * call_id, name, arguments and output (a call of the server's own tools, as
 * this server answers it) is a call and its tool message. */
int resp_request_messages(serve_request *req, const resp_request *rr, const json_t *history, serve_fail *f);
void resp_request_free(resp_request *rr);

/* ---- replies ---- */

typedef struct resp_reply {
  char id[48];         /* "resp_…" */
  const char *model;   /* borrowed */
  const resp_request *rr; /* borrowed */
  int64_t created;
  uint64_t seed;       /* makes item ids */
  int n_ids;
  tc_parser *tc;       /* owned; NULL: all text */
  bool tc_done;
  bool cut;                /* the output ran out of budget: the item open at the end is "incomplete" */
  json_t *output;      /* owned: the finished output items */
  int open;            /* the open item's kind: -1 none, TC_TEXT, TC_REASONING, TC_CALL_BEGIN */
  json_t *item;        /* owned: the open item */
  hbuf cur;            /* owned: the open item's text or arguments */
  int ncalls;
  int64_t seq;         /* stream: the next sequence_number */
  hbuf *sse;           /* a stream's output while events are formatted */
  /* the server's own tools (serve/tools.h): a call of one is a NAME_call item {"id", "type",
   * "status", "call_id", "name", "arguments", "output"}, added as it begins, done (completed,
   * with its output) once it ran; one that never ran ends incomplete */
  const char *const *server_tools; /* borrowed: n_server_tools names (set before resp_reply_parse) */
  int n_server_tools;
  bool own_call;       /* the open call is a server tool's */
  json_t *pending;     /* owned: the output indexes of server tool calls not yet run */
  json_t *round_calls; /* owned: this round's calls, OpenAI's shape [{"id","type","function":{"name","arguments"}}] */
  hbuf round_text;     /* owned: this round's text */
} resp_reply;

void resp_reply_init(resp_reply *r, const char *model, uint64_t id_seed, const resp_request *rr);
void resp_reply_free(resp_reply *r);
/* Splits the output into reasoning, message and function_call items with a
 * parser of o's format (before the first token). */
int resp_reply_parse(resp_reply *r, const tc_opts *o, herr *err);
/* Text the reply starts with (a forced call's opening), before any token. */
void resp_reply_prime(resp_reply *r, const char *text, hbuf *out);
/* A round of the server's own tools: the round's end (the parser's last events into out when
 * streamed, else out NULL), its calls (borrowed) and *text; then, once they ran, their items
 * done with the round's results (OpenAI's tool messages: "tool_call_id", "content"; out as
 * above) and a parser of o for the next round. */
const json_t *resp_reply_round_calls(resp_reply *r, hbuf *out, const char **text);
int resp_reply_round_next(resp_reply *r, const json_t *round, const tc_opts *o, hbuf *out, herr *err);
/* Whole responses: every step's output; then the response object. */
void resp_reply_add(resp_reply *r, const serve_token *tok);
/* The response object (new reference); res NULL: in progress. */
json_t *resp_reply_object(resp_reply *r, const serve_result *res);
/* The conversation this response ends: history + rr->input + output (new reference). */
json_t *resp_reply_conversation(resp_reply *r, const json_t *history);

/* Stream events, "event: TYPE\ndata: {...}\n\n" each. */
void resp_sse_start(resp_reply *r, hbuf *out);
void resp_sse_token(resp_reply *r, const serve_token *tok, hbuf *out);
void resp_sse_finish(resp_reply *r, const serve_result *res, hbuf *out);
void resp_sse_error(resp_reply *r, const serve_fail *f, hbuf *out);

#endif
