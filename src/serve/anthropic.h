/* anthropic.h — the Anthropic Messages API as a protocol unit of the server:
 * a /v1/messages (or /v1/messages/count_tokens) body parsed and validated
 * into the protocol-neutral serve_request, the message object and the SSE
 * events of a stream in Anthropic's exact shapes, and errors as Anthropic
 * error objects. Pure parsing and formatting: no sockets, no model. */
#ifndef HEARTH_SERVE_ANTHROPIC_H
#define HEARTH_SERVE_ANTHROPIC_H

#include <stdbool.h>
#include <stdint.h>

#include "base/buf.h"
#include "chat/toolcall.h"
#include "serve/engine.h"
#include "serve/request.h"

/* Parses a Messages request into req (kind SERVE_CHAT: the system prompt, when
 * given, becomes a first "system" message). count_only: a count_tokens body
 * (max_tokens and the sampling fields are not read). On failure returns
 * nonzero with f filled (status 400; the message and param name the field,
 * as "messages.0.content.1") and leaves *req empty. */
int anth_request_parse(const char *body, size_t len, bool count_only, serve_request *req, serve_fail *f);
/* The tools and tool_choice as Messages writes them ({name, description, input_schema}). */
extern const serve_tools_dialect anth_tools_dialect;

/* The Anthropic error type for an HTTP status: invalid_request_error (400 and
 * other 4xx), authentication_error (401), permission_error (403),
 * not_found_error (404), request_too_large (413), rate_limit_error (429),
 * api_error (500 and other 5xx), overloaded_error (529). */
const char *anth_error_type(int status);
/* {"type":"error","error":{"type":…,"message":…}} (malloc'd; NULL on out of memory). */
char *anth_fail_json(const serve_fail *f);

/* "end_turn", "max_tokens" or "stop_sequence" (when a stop sequence ended it);
 * a reply's also "tool_use" when it called a tool, and "pause_turn" when its
 * last calls were the server's own tools' and did not run (the rounds ran out). */
const char *anth_stop_reason(const serve_result *res);

typedef struct anth_reply {
  char id[48];            /* "msg_…" */
  const char *model;      /* borrowed */
  const char *const *stop;      /* borrowed: the request's stop sequences, to name the one that matched */
  int nstop;
  hbuf text;              /* owned: the text so far (whole responses) */
  /* with tools or reasoning: the output split by a tool-call parser into
   * thinking, text and tool_use blocks, opened as they come */
  tc_parser *tc;          /* owned; NULL: one text block */
  bool tc_done;
  json_t *blocks;         /* owned: the finished blocks (whole responses) */
  int open;               /* the open block's kind: -1 none, else a tc_event_kind (TC_TEXT, TC_REASONING, TC_CALL_BEGIN) */
  int index;              /* stream: blocks started so far */
  json_t *block;          /* owned: the open block (whole responses) */
  hbuf cur;               /* owned: the open block's text, thinking or input JSON */
  int ncalls;
  bool ping_due;          /* stream: the ping follows the first content_block_start */
  hbuf *sse;              /* a stream's output while events are formatted */
  /* the server's own tools (serve/tools.h): their calls are server_tool_use blocks, their results
   * NAME_tool_result blocks ({"tool_use_id", "content": [text block]}) after them, the rounds'
   * blocks one message, usage.server_tool_use {"NAME_requests": n} */
  const char *const *server_tools; /* borrowed: n_server_tools names (set before anth_reply_parse) */
  int n_server_tools;
  json_t *round_calls;    /* owned: this round's calls, OpenAI's shape [{"id","type","function":{"name","arguments"}}] */
  hbuf round_text;        /* owned: this round's text */
  int unrun;              /* this round's calls of the server's tools (none has run yet) */
  json_t *server_use;     /* owned, NULL until one ran: {"NAME_requests": n} */
} anth_reply;

/* Splits the output into thinking, text and tool_use blocks with a parser of
 * o's format (before the first token). */
int anth_reply_parse(anth_reply *r, const tc_opts *o, herr *err);
/* Feeds text the reply starts with (a forced call's opening) to the parser
 * before any token: into the whole message (out NULL) or as stream events. */
void anth_reply_prime(anth_reply *r, const char *text, hbuf *out);
/* A round of the server's own tools: the round's end (the parser's last events into out when
 * streamed, else out NULL), its calls (borrowed) and *text; then, once they ran, the round's
 * exchange (OpenAI's messages: the tool messages carry "tool_call_id", "name", "content") as
 * result blocks (out as above) and a parser of o for the next round. */
const json_t *anth_reply_round_calls(anth_reply *r, hbuf *out, const char **text);
int anth_reply_round_next(anth_reply *r, const json_t *round, const tc_opts *o, hbuf *out, herr *err);

/* id_seed makes the id unique (any varying number). stop/nstop: the request's
 * stop sequences (borrowed; they must outlive the reply). */
void anth_reply_init(anth_reply *r, const char *model, uint64_t id_seed, const char *const *stop, int nstop);
void anth_reply_free(anth_reply *r);

/* Whole responses: add every step's output, then format the message once. */
void anth_reply_add(anth_reply *r, const serve_token *tok);
void anth_reply_body(anth_reply *r, const serve_result *res, hbuf *out);

/* Stream events, each appended as "event: NAME\ndata: {...}\n\n".
 * start: message_start (input_tokens known before generation), content_block_start, ping;
 * token: content_block_delta (text_delta), nothing for an empty step;
 * finish: content_block_stop, message_delta (stop_reason, stop_sequence, usage), message_stop;
 * error: an error event carrying an Anthropic error object. */
void anth_sse_start(anth_reply *r, int64_t input_tokens, hbuf *out);
void anth_sse_token(anth_reply *r, const serve_token *tok, hbuf *out);
void anth_sse_finish(anth_reply *r, const serve_result *res, hbuf *out);
void anth_sse_error(const serve_fail *f, hbuf *out);

/* {"input_tokens": n} */
void anth_count_body(int64_t n, hbuf *out);

#endif
