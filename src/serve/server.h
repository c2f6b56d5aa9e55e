/* server.h — the HTTP server: OpenAI endpoints over one engine, SSE streams,
 * the chat page, API-key checks and body limits, connection limits and
 * deadlines, on libmicrohttpd's event loop. */
#ifndef HEARTH_SERVE_SERVER_H
#define HEARTH_SERVE_SERVER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "base/status.h"
#include "serve/engine.h"
#include "serve/tools.h"

/* What the server knows of models beyond the engine, from whoever starts it
 * (`hearth serve`: hearth's registry and the Hugging Face cache), for the
 * Ollama API. A model's facts are a JSON object {"name", "path", "format",
 * "architecture", "parameters", "quantization", "bytes", "modified" (unix
 * seconds), "revision"}, any key absent when unknown. Every member may be NULL. */
typedef struct serve_models {
  void *ctx;
  const json_t *served; /* borrowed: the served models' facts, an array in the engines' order (the first
                         * engine's, then serve_config.more_engines') */
  /* The models hearth can name (a new array of facts; NULL: none). */
  json_t *(*list)(void *ctx);
  /* Removes a model by name as `hearth rm` does; HEARTH_ENOTFOUND when there is none by that name. */
  int (*remove)(void *ctx, const char *name, herr *err);
  /* Fetches a model by name as `hearth get` does, its progress as lines of text written to progress
   * (it runs to its end even when the client has gone: what it fetched stays in the cache). */
  int (*pull)(void *ctx, const char *name, FILE *progress, herr *err);
} serve_models;

typedef struct serve_config {
  const char *host;    /* borrowed; "127.0.0.1" when NULL */
  int port;            /* 0: an ephemeral port (see serve_port) */
  const char *api_key; /* borrowed; NULL: no key needed ("" is refused: it would let everyone in) */
  size_t max_body;     /* request bodies above this get 413; 0: 16 MiB */
  int keepalive_ms;    /* a stream idle this long sends ": keep-alive"; 0: 15 s */
  int max_connections; /* open connections at most; 0: 4096 (more are refused) */
  int max_per_client;  /* open connections per client address at most; 0: an eighth of max_connections */
  int idle_timeout_s;  /* a connection that sends no request (headers) for this long is closed; 0: 10 s */
  int header_timeout_s; /* a request's head (request line and headers) must be all in this long after its
                         * connection opens (after the previous answer, plus idle_timeout_s, on a kept-alive
                         * one), however steadily it trickles in, or the connection is closed; 0: 10 s */
  int body_timeout_s;   /* a request body that sends nothing for this long is dropped; 0: 60 s */
  const char *const *served_names; /* borrowed: further names the model answers to ("*": any name); a
                                    * request naming another model gets 404 model_not_found */
  int n_served_names;
  const char *cors_origin; /* borrowed; NULL: no CORS headers. An origin ("*" for any) browsers may call from */
  size_t responses_max;       /* Responses API: stored responses at most; 0: 1000 (oldest dropped first) */
  size_t responses_max_bytes; /* ... their stored JSON in bytes at most; 0: 256 MiB */
  int64_t responses_ttl_s;    /* ... kept this long; 0: one hour; < 0: no expiry */
  const char *adapter_dir;    /* borrowed; NULL: POST /v1/adapters refuses every path (403). Else adapters load
                               * over the API only from folders inside it (adapters_resolve) */
  const serve_models *models; /* borrowed, may be NULL: /api/tags lists only the served model, /api/pull and
                               * /api/delete refuse */
  serve_engine *const *more_engines; /* borrowed: further models served beside the first (serve_start's), each
                                      * picked by a request's "model" naming its model_id; they must outlive the
                                      * server. The routes without a model (stats, metrics, fit, tokenize,
                                      * signal, adapters) and a request naming none answer for the first */
  int n_more_engines;
  const char *state_dir;      /* borrowed; NULL: the Batch API (/v1/files, /v1/batches) is refused (400
                               * batch_api_disabled). Else its files and batches are kept in this folder
                               * (made when missing; one server at a time: a second one is refused),
                               * and a restart resumes the batches that had not ended */
  size_t max_file_bytes;      /* an uploaded file's size at most; 0: 200 MiB (OpenAI's limit) */
  int batch_concurrency;      /* batch rows in flight at once; 0: 8. They run at low priority: the
                               * scheduler admits interactive requests before them */
  const serve_tool *tools;    /* borrowed (must outlive the server): tools the server runs itself
                               * (serve/tools.h; `hearth serve --memory`: memory_search), offered to
                               * the chat requests of every protocol (/v1/chat/completions of one
                               * choice, /v1/responses, /v1/messages, /api/chat) that define no tool
                               * of that name, whole or streamed; at most SERVE_MAX_TOOLS */
  int n_tools;
  int tool_rounds;            /* rounds of their calls one request may run; 0: SERVE_TOOL_ROUNDS */
} serve_config;

typedef struct serve_server serve_server;

/* Starts listening; requests are answered on the server's own threads until
 * serve_stop. The engine is borrowed and must outlive the server. Two engines
 * with one model_id are refused. */
int serve_start(serve_server **out, serve_engine *engine, const serve_config *cfg, herr *err);
/* The port actually bound. */
int serve_port(const serve_server *s);
/* SSE keep-alive comments sent so far (all streams). */
uint64_t serve_keepalives_sent(serve_server *s);
/* Draining, for a graceful stop: after serve_drain_begin every new request
 * (including /health) is refused with 503 "shutting_down" while those
 * already in are answered; serve_in_flight counts them (from their headers
 * to the last byte sent). serve_drain_cancel ends the running generations
 * within a step, each with a proper end — a whole reply, or a stream with
 * its finish event and [DONE] / message_stop — cut as if by a length limit
 * (finish_reason "length", stop_reason "max_tokens", status "incomplete");
 * it returns how many it cut. */
void serve_drain_begin(serve_server *s);
int64_t serve_in_flight(serve_server *s);
int serve_drain_cancel(serve_server *s);
/* The whole graceful stop: serve_drain_begin, then up to timeout_s for the
 * requests in flight (cut short when a signal of sigs arrives: the caller
 * blocks them; NULL: none), then serve_drain_cancel and up to 10 s for the
 * ends to go out. Returns the generations it cut. serve_stop follows. */
int serve_drain(serve_server *s, double timeout_s, const sigset_t *sigs);
/* Stops listening, ends every connection (cancelling their generations) and frees. */
void serve_stop(serve_server *s);

/* The chat page served at GET / (NUL-terminated HTML, serve_page_html_len bytes). */
extern const char *const serve_page_html;
extern const size_t serve_page_html_len;

#endif
