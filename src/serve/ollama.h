/* ollama.h — the Ollama API as a protocol unit of the server: /api/chat and
 * /api/generate bodies (Ollama's `options` names, `format`, `think`, `images`)
 * checked and turned into the protocol-neutral serve_request, the replies in
 * Ollama's exact shapes (NDJSON lines of a stream, the final object with its
 * counts and nanosecond durations), the /api/embed and /api/embeddings bodies,
 * the model objects of /api/tags, /api/show and /api/ps built from a model's
 * facts, and errors as {"error": "..."}. Pure parsing and formatting: no
 * sockets, no model. */
#ifndef HEARTH_SERVE_OLLAMA_H
#define HEARTH_SERVE_OLLAMA_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/buf.h"
#include "chat/toolcall.h"
#include "serve/embeddings.h"
#include "serve/engine.h"
#include "serve/request.h"

/* The Ollama API version whose shapes these routes follow (GET /api/version). */
#define OLL_API_VERSION "0.12.0"

/* What an Ollama request carries beyond serve_request. */
typedef struct oll_request {
  bool chat;        /* /api/chat, else /api/generate */
  bool raw;         /* generate: the prompt as it is, no template (a text completion) */
  bool load_only;   /* no prompt / no messages: Ollama's "load the model" request, answered done_reason "load" */
  int64_t num_ctx;  /* options.num_ctx; 0: not given. Prompt and num_predict must fit in it */
  double keep_alive_s; /* keep_alive in seconds: how long a model loaded on first use stays once idle
                        * (< 0: not given; 0: unload now; Ollama's negative "forever": a century) */
} oll_request;

/* Parses an /api/chat (chat) or /api/generate body into req (kind SERVE_CHAT,
 * or SERVE_COMPLETION for a raw generate, and for one with a suffix: req->fim,
 * the prompt the text before it) and o. stream is true unless the body says
 * false. Fields hearth cannot honour (template, context, options such as
 * mirostat) are refused by name. On failure returns the HTTP
 * status with f filled (param names the field: "options.mirostat",
 * "messages[1].images[0]") and leaves *req empty. */
int oll_request_parse(const char *body, size_t len, bool chat, serve_request *req, oll_request *o, serve_fail *f);

/* /api/embed ({model, input: string | [string], dimensions, truncate, options, keep_alive}) or, legacy,
 * /api/embeddings ({model, prompt}) as an embeddings request. */
int oll_embed_parse(const char *body, size_t len, bool legacy, int64_t vocab, embed_request *req, serve_fail *f);
/* {"model", "embeddings": [[...]], "total_duration", "load_duration", "prompt_eval_count"}, or legacy
 * {"embedding": [...]}; vecs: req->n vectors of dim floats; seconds: the time the request took. */
void oll_embed_reply(const embed_request *req, bool legacy, const float *vecs, int dim, const char *model,
                     int64_t prompt_tokens, double seconds, hbuf *out);

/* {"error": message} (malloc'd; NULL on out of memory). */
char *oll_fail_json(const serve_fail *f);
/* A stream's error line: {"error": message}\n */
void oll_error_line(const serve_fail *f, hbuf *out);

/* Now as Ollama writes times: RFC 3339 in UTC with microseconds ("2024-05-01T12:00:00.123456Z"). */
void oll_time_now(char *out, size_t cap);
/* A unix time the same way. */
void oll_time_at(int64_t unix_s, char *out, size_t cap);

typedef struct oll_reply {
  bool chat;
  const char *model;       /* borrowed */
  tc_parser *tc;           /* owned; NULL: all the text is content */
  bool tc_done;
  hbuf content, thinking;  /* owned: the whole reply's (whole replies) */
  json_t *calls;           /* owned: [{"function": {"name", "arguments": {...}}}] (whole replies) */
  char call_name[128];     /* the open call's */
  hbuf args;               /* owned: the open call's arguments */
  bool streaming;
  hbuf step_content, step_thinking; /* owned: a stream's deltas of this step */
  json_t *step_calls;      /* owned: a stream's calls ended in this step */
  bool logprobs;           /* report each token's log-probability (and its alternatives, as sampled) */
  json_t *lp;              /* owned: [{token, logprob, bytes, top_logprobs}]: the whole reply's, or a stream's not
                            * yet sent (they go with the next line) */
  double t0, t_first;      /* monotonic seconds: the request's arrival, its first token (0: none yet) */
  double load_s;           /* seconds the request waited for its model to load (load_duration) */
  /* the server's own tools (serve/tools.h): a stream does not send their calls; the messages of
   * their rounds go in the final object's "tool_exchange" (Ollama's message shape) */
  const char *const *hidden; /* borrowed: nhidden tool names */
  int nhidden;
  json_t *round_calls;     /* owned: this round's calls, OpenAI's shape [{"id","type","function":{"name","arguments"}}] */
  hbuf round_text;         /* owned: this round's content */
  json_t *exchange;        /* owned, NULL until a round ran */
} oll_reply;

/* t0: when the request arrived (monotonic seconds, as oll_now). logprobs: report the tokens' log-probabilities
 * ("logprobs": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]). */
void oll_reply_init(oll_reply *r, bool chat, const char *model, bool streaming, double t0, bool logprobs);
void oll_reply_free(oll_reply *r);
/* Splits chat output into content, thinking and tool calls (before the first token). */
int oll_reply_parse(oll_reply *r, const tc_opts *o, herr *err);
/* Monotonic seconds. */
double oll_now(void);

/* A round of the server's own tools: the round's end (a stream's held-back text as a line into
 * out; out NULL when whole), its calls (borrowed) and *text; then, once they ran, the round's
 * exchange (OpenAI's messages) kept for the final object, a whole reply's message begun anew
 * (the final one is the last round's), and a parser of o for the next round. */
const json_t *oll_reply_round_calls(oll_reply *r, hbuf *out, const char **text);
int oll_reply_round_next(oll_reply *r, const json_t *round, const tc_opts *o, herr *err);
/* Whole replies: every step's output, then the one object. */
void oll_reply_add(oll_reply *r, const serve_token *tok);
void oll_reply_body(oll_reply *r, const serve_result *res, hbuf *out);
/* Streams: a line per step with something to show (nothing for an empty step),
 * then the final line (done: true, done_reason, counts, durations). */
void oll_stream_token(oll_reply *r, const serve_token *tok, hbuf *out);
void oll_stream_finish(oll_reply *r, const serve_result *res, hbuf *out);
/* The answer to a load-only request: {"model", "created_at", ("message" | "response"), "done": true,
 * "done_reason": reason} ("load", or "unload" for keep_alive 0). */
void oll_load_body(bool chat, const char *model, const char *reason, hbuf *out);
/* Ollama's keep_alive: a number of seconds or a Go duration ("5m", "1h30m", "-1", "0"); *seconds: < 0
 * becomes a century ("forever"). false when it is neither. */
bool oll_keep_alive(const json_t *v, double *seconds);

/* A model's facts, as `hearth serve` gives them (serve_models): {"name", "path", "format",
 * "architecture", "parameters", "quantization", "bytes", "modified", "revision"} (any may be absent).
 * Ollama's model object of /api/tags: {name, model, modified_at, size, digest, details}; ps adds
 * expires_at, size_vram and context_length. */
json_t *oll_model_object(const json_t *facts, const char *name, bool ps, int64_t context_length);
/* Ollama's details object: {parent_model, format, family, families, parameter_size, quantization_level}. */
json_t *oll_details(const json_t *facts);
/* /api/show's body: details, model_info, capabilities (from what the engine serves when e is the
 * served model's, else "completion"), modelfile, parameters, template (the served model's Jinja chat
 * template), modified_at. */
json_t *oll_show_object(const json_t *facts, const serve_engine *e);

#endif
