/* reply.h — the bodies the server answers with, in OpenAI's exact shapes:
 * whole responses (chat.completion, text_completion) and the Server-Sent
 * Events of a stream (chat.completion.chunk / text_completion chunks, the
 * usage chunk, "data: [DONE]"). Pure formatting: no sockets, no model. */
#ifndef HEARTH_SERVE_REPLY_H
#define HEARTH_SERVE_REPLY_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/buf.h"
#include "chat/toolcall.h"
#include "serve/engine.h"
#include "serve/request.h"

typedef struct serve_reply {
  serve_kind kind;
  char id[64];             /* "chatcmpl-…" / "cmpl-…" */
  int64_t created;
  const char *model;       /* borrowed */
  int index;               /* the choice's index in the response (0 unless several choices) */
  bool logprobs;           /* report per-token log-probabilities */
  bool usage_null;         /* stream with include_usage: chunks carry "usage": null */
  bool one_call;           /* parallel_tool_calls false: calls after the first are dropped */
  hbuf text;               /* owned: the text so far (whole responses) */
  json_t *lp;              /* owned: chat: array of content entries; completion: object of arrays */
  size_t text_offset;      /* completion logprobs: offset of the next token's text */
  /* chat with tools or reasoning: the output is split by a tool-call parser */
  tc_parser *tc;           /* owned; NULL: all the text is content */
  bool tc_done;            /* the parser was finished */
  hbuf reasoning;          /* owned: the reasoning so far (whole responses) */
  json_t *calls;           /* owned: [{"id","type","function":{"name","arguments"}}] (whole responses) */
  int ncalls;              /* calls begun */
  hbuf args;               /* owned: the open call's arguments (whole responses) */
  hbuf *sse;               /* a stream's output while the parser's events are turned into chunks */
  json_t *sse_lp;          /* the step's logprobs, for the first chunk of the step */
  /* return_token_ids (vLLM): NULL unless asked for */
  json_t *prompt_ids;      /* owned: the prompt's token ids */
  json_t *out_ids;         /* owned: the output's token ids (whole responses) */
  json_t *sse_ids;         /* owned: output ids not yet sent in a chunk (streams) */
  bool prompt_ids_sent;    /* a stream's first chunk carried prompt_ids */
  /* streams: calls of these tools (the server's own, serve/tools.h) are not sent but kept in calls,
   * as every call of a stream is; the others' chunks number them without the hidden ones */
  const char *const *hidden; /* borrowed: nhidden tool names */
  int nhidden;
  bool hiding;             /* the open call is a hidden one */
  int nhidden_calls;       /* hidden calls so far */
} serve_reply;

/* id_seed makes the id unique (any varying number: a counter, a time). */
void serve_reply_init(serve_reply *r, serve_kind kind, const char *model, int64_t created, uint64_t id_seed,
                      bool logprobs);
void serve_reply_free(serve_reply *r);

/* vLLM's return_token_ids: the reply carries the prompt's ids (a completion
 * choice's "prompt_token_ids"; a chat response's, top level) and the output's
 * ("token_ids" per choice: every generated token, an end-of-sequence token
 * too; in a stream, each chunk's choice holds the ids since the last chunk,
 * and the first chunk the prompt's). Call before the first token. */
void serve_reply_token_ids(serve_reply *r, const int32_t *prompt, size_t n);

/* A completion's echoed prompt token, before the first generated one (OpenAI's
 * legacy echo with logprobs): its text, log-probability and alternatives
 * (first: the prompt's first token, whose logprob and top_logprobs are null).
 * Its text_offset is where its text stands in echo[0..n) from *cursor on
 * (the cursor moves past it; a token whose text is not there, such as a BOS,
 * stands at the cursor). */
void serve_reply_echo_token(serve_reply *r, const serve_token *t, bool first, const char *echo, size_t n, size_t *cursor);

/* Chat: split the output into content, reasoning and tool calls with a
 * parser of o's format (before the first token). */
int serve_reply_parse(serve_reply *r, const tc_opts *o, herr *err);
/* Feeds text the reply starts with (a forced call's opening) to the parser
 * before any token: into the whole reply (out NULL) or as stream chunks. */
void serve_reply_prime(serve_reply *r, const char *text, hbuf *out);

/* out = prefix and len letters and digits drawn from the kernel's CSPRNG
 * (getrandom): tool-call ids, unique across requests and restarts. */
void serve_random_id(char *out, size_t cap, const char *prefix, int len);
/* Appends s[0..n) to out as UTF-8, each invalid byte replaced by U+FFFD. */
void serve_utf8_clean(const char *s, size_t n, hbuf *out);
/* A JSON string of s[0..n) cleaned so (never NULL; s may be NULL with n 0). */
json_t *serve_json_text(const char *s, size_t n);

/* Whole responses: add every step's output, then format once. */
void serve_reply_add(serve_reply *r, const serve_token *tok);
/* Ends a whole reply's parser (its last call completed into r->calls), as formatting it does;
 * for looking at the calls before the body is made. */
void serve_reply_end(serve_reply *r);
/* Appends the JSON body to out. */
void serve_reply_body(serve_reply *r, const serve_result *res, hbuf *out);
/* A response of n choices, choice i made by r[i] and ended as res[i], with usage
 * (already summed over the choices). */
void serve_reply_body_n(serve_reply *const *r, const serve_result *res, int n, const serve_result *usage, hbuf *out);

/* Stream events, each appended to out as "data: {...}\n\n". */
void serve_sse_end(serve_reply *r, hbuf *out);          /* ends the parser: what it held back, as chunks */
/* A chunk without choices that carries the server's tool exchange (serve/tools.h), as the usage chunk
 * carries the usage: {"id", "object": "chat.completion.chunk", ..., "choices": [], "tool_exchange": [...]}. */
void serve_sse_tool_exchange(serve_reply *r, const json_t *exchange, hbuf *out);
void serve_sse_start(serve_reply *r, hbuf *out);        /* chat: delta.role; completion: nothing */
void serve_sse_token(serve_reply *r, const serve_token *tok, hbuf *out); /* nothing when empty without logprobs */
void serve_sse_text(serve_reply *r, const char *s, size_t n, hbuf *out);  /* a bare text delta (echo); with
                                                                             echoed logprobs, they ride on it */
void serve_sse_finish(serve_reply *r, serve_finish finish, hbuf *out);
void serve_sse_usage(serve_reply *r, const serve_result *res, hbuf *out);
void serve_sse_error(const serve_fail *f, hbuf *out);
void serve_sse_done(hbuf *out);

const char *serve_finish_name(serve_finish f);
/* "tool_calls" when the reply called tools and was not cut by length, else serve_finish_name. */
const char *serve_reply_finish_name(const serve_reply *r, serve_finish f);

#endif
