/* server.c — the HTTP layer: routing, API keys, body limits, JSON answers,
 * and SSE streams fed by a generation thread, on libmicrohttpd's epoll event
 * loop with a small pool of polling threads (POLL_THREADS): an idle
 * connection costs a socket, not a thread. Quick answers (health, models,
 * stats, the chat page, refusals) are made on the polling thread; a request
 * that may take long (generation, embeddings, token counts, adapters) is
 * answered on a thread of its own while its connection is suspended (defer),
 * and a stream whose generation has nothing new parks its connection until
 * the generation or the server's watcher (keep-alive comments, clients gone)
 * wakes it. A client that goes away cancels its generation: the watcher
 * checks the sockets of parked streams and of whole replies being computed
 * every WAIT_MS (a whole reply's client is gone once it closes its side, a
 * stream's once the socket is: see client_gone). No CORS headers:
 * only the chat page's own origin may read answers from a browser. Knows the
 * engine only through serve_engine (engine.h), and the JSON shapes only
 * through the protocol units: request.h / reply.h (OpenAI), anthropic.h
 * (Anthropic Messages, under /v1/messages, where every error, including
 * routing, key and size refusals, is an Anthropic error object) and ollama.h
 * (the Ollama API under /api/: NDJSON streams, {"error": ...} refusals). The
 * protocols share one generation path (answer_generate, job_generate). One
 * server may serve several engines, a request's "model" picking one.
 *
 * Connections: at most max_connections (4096), max_per_client (an eighth of
 * them, 512) per client address, so a few addresses cannot take them all;
 * one that sends no request for idle_timeout_s (10 s) is closed, one whose
 * request head (request line and headers) is not all in header_timeout_s
 * (10 s) after it opened — or after its previous answer, plus the idle
 * limit — is closed by the watcher however steadily its bytes trickle in
 * (heads_expire), and a request body that stalls for body_timeout_s (60 s) is
 * dropped, so idle or slow sockets cannot lock others out (/health keeps
 * answering). A refusal
 * decided from the headers (route, method, key, size) is answered before any
 * body is read, and before "100 Continue".
 *
 * Errors are one JSON object ({"error": {...}}, or Anthropic's
 * {"type": "error", "error": {...}} under /v1/messages) wherever the application
 * answers. libmicrohttpd answers some protocol errors itself, before any
 * handler runs, with its own small HTML page and no way to replace it: a
 * malformed or huge Content-Length (400 / 413; 0.9.75 also repeats the
 * status line and headers), an over-long request line or header block
 * (414 / 431), an unsupported HTTP version (505) and malformed chunked
 * bodies (400). */
#include "serve/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/hash.h"
#include "base/log.h"
#include "engine/grammar.h"
#include "serve/adapters.h"
#include "serve/anthropic.h"
#include "serve/batches.h"
#include "serve/files.h"
#include "serve/embeddings.h"
#include "serve/infill.h"
#include "serve/metrics.h"
#include "serve/signal.h"
#include "serve/tokenize.h"
#include "serve/reply.h"
#include "serve/forced.h"
#include "serve/ollama.h"
#include "serve/request.h"
#include "serve/responses.h"

#define DEFAULT_MAX_BODY ((size_t)16 << 20)
#define WAIT_MS 20                 /* a waiting stream's client is checked this often */
#define KEEPALIVE ": keep-alive\n\n"      /* the SSE comment a waiting stream sends */
#define DEFAULT_KEEPALIVE_MS 15000
#define DEFAULT_MAX_CONNECTIONS 4096
#define PER_CLIENT_SHARE 8         /* one client address may hold 1/8 of the connections (by default) */
#define DEFAULT_IDLE_TIMEOUT_S 10
#define DEFAULT_HEADER_TIMEOUT_S 10
#define HEAD_SCAN_S 0.1            /* the watcher looks for late request heads this often */
#define DEFAULT_BODY_TIMEOUT_S 60  /* a request body that stalls this long is dropped */
#define DRAIN_GRACE_S 10           /* after a drain cuts the generations, what is in flight gets this long */
#define POLL_THREADS 4             /* libmicrohttpd's polling threads (each an epoll loop over its connections) */

struct serve_server {
  struct MHD_Daemon *daemon;
  serve_engine *engine; /* borrowed: the first model's (engines[0]) */
  serve_engine **engines; /* owned array of borrowed engines: every served model, the first first */
  int nengines;
  serve_metrics *metrics; /* owned, may be NULL (out of memory): /metrics' histograms and request counts */
  char *api_key;        /* owned; NULL when none */
  int idle_timeout_s;   /* a connection without a request is closed after this */
  size_t max_body;
  double keepalive_s;   /* a stream with nothing to send this long sends a keep-alive comment */
  int port;
  pthread_mutex_t engine_lock; /* one generation at a time unless the engine is thread-safe */
  atomic_uint_fast64_t next_id;
  atomic_uint_fast64_t keepalives; /* keep-alive comments sent (serve_keepalives_sent) */
  char **names;         /* owned: aliases the model answers to (besides its id) */
  int nnames;
  bool any_name;        /* "*" among them: every model name is served */
  char *cors;           /* owned; NULL: no CORS headers */
  resp_store *responses; /* owned: stored Responses API responses */
  char *adapter_dir;    /* owned: the real path POST /v1/adapters loads under; NULL: it loads nothing */
  const serve_models *models; /* borrowed, may be NULL: the Ollama API's models beyond the served one */
  /* draining (serve_drain_begin): new requests are refused; in_flight counts the requests being
   * answered (from their headers to the last byte sent), jobs lists the generations running */
  atomic_int draining;
  atomic_long in_flight;
  pthread_mutex_t jobs_mu;
  struct job *jobs;     /* borrowed: each job is its connection's */
  /* answers off the polling threads: `workers` running (defer); `stopping` refuses new ones */
  pthread_mutex_t workers_mu;
  pthread_cond_t workers_cv;
  int workers;
  bool stopping;
  /* streams parked until they have something to send (stream_read), and the watcher that
   * wakes them for a keep-alive comment or when their client is gone */
  pthread_mutex_t park_mu;
  struct job *parked;   /* borrowed */
  pthread_t watcher;
  bool watcher_started, watcher_stop;
  pthread_cond_t watcher_cv;
  struct job *whole;    /* borrowed: whole replies being computed, whose clients the watcher checks (under park_mu) */
  /* connections whose request head is awaited, each with its deadline (head_watch) */
  pthread_mutex_t head_mu;
  struct head_watch *heads; /* borrowed: each is its connection's socket context */
  int header_timeout_s;
  int body_timeout_s;
  double next_head_scan;    /* the watcher's own */
  /* the Batch API (NULL without a state directory) */
  file_store *files;        /* owned */
  batch_store *batches;     /* owned */
  int state_lock;           /* the state directory's lock file, held while serving; -1: none */
  serve_tool tools[SERVE_MAX_TOOLS]; /* the tools the server runs itself (serve/tools.h) */
  int ntools;
  int tool_rounds;
};

/* The server answering on this thread (a polling thread or a request's own),
 * for the headers every response carries. */
static __thread serve_server *tl_server;
struct conn;
/* The request this thread answers for a suspended connection (defer): its
 * response is kept for the polling thread to queue. */
static __thread struct conn *tl_deferred;
static __thread unsigned tl_status; /* the status the polling thread's last queued answer had */

static double mono_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void cors_headers(struct MHD_Response *resp) {
  if (!tl_server || !tl_server->cors) return;
  MHD_add_response_header(resp, "Access-Control-Allow-Origin", tl_server->cors);
  if (strcmp(tl_server->cors, "*") != 0) MHD_add_response_header(resp, "Vary", "Origin");
}

/* Whether name (a request's "model") is e's model_id, or that with Ollama's default tag. */
static bool name_is(const serve_engine *e, const char *name) {
  size_t n = strlen(name), m = strlen(e->model_id);
  return !strcmp(name, e->model_id) || (n == m + 7 && !strncmp(name, e->model_id, m) && !strcmp(name + m, ":latest"));
}

/* The engine a request's "model" picks: one whose model_id it is, else the first for its
 * aliases (--served-model-name, "*") and for no name at all. NULL: none (nor an adapter's
 * name: the caller checks that). */
static serve_engine *engine_named(const serve_server *s, const char *name);

/* Whether `name` (a request's "model") is the first model (its id or an alias). */
static bool name_served(const serve_server *s, const char *name) {
  if (!name || s->any_name || strcmp(name, s->engine->model_id) == 0) return true;
  size_t n = strlen(name); /* Ollama's clients add the default tag to a bare name */
  if (n > 7 && !strcmp(name + n - 7, ":latest")) {
    char bare[512];
    snprintf(bare, sizeof bare, "%.*s", (int)(n - 7), name);
    if (name_served(s, bare)) return true;
  }
  for (int i = 0; i < s->nnames; i++)
    if (strcmp(name, s->names[i]) == 0) return true;
  return false;
}

typedef enum route {
  ROUTE_NONE = 0,
  ROUTE_PAGE,
  ROUTE_HEALTH,
  ROUTE_INDEX,
  ROUTE_MODELS,
  ROUTE_MODEL, /* /v1/models/{id} */
  ROUTE_CHAT,
  ROUTE_COMPLETIONS,
  ROUTE_MESSAGES,     /* Anthropic */
  ROUTE_COUNT_TOKENS, /* Anthropic */
  ROUTE_RESPONSES,    /* OpenAI Responses: POST /v1/responses */
  ROUTE_RESPONSE,     /* GET / DELETE /v1/responses/{id} */
  ROUTE_STATS,
  ROUTE_METRICS,
  ROUTE_EMBEDDINGS,
  ROUTE_SIGNAL,
  ROUTE_FIT,
  ROUTE_ADAPTERS,     /* GET / POST /v1/adapters */
  ROUTE_ADAPTER,      /* DELETE /v1/adapters/{id} */
  ROUTE_TOKENIZE,     /* POST /tokenize (llama.cpp's, vLLM's) */
  ROUTE_DETOKENIZE,   /* POST /detokenize */
  ROUTE_MODEL_LOAD,   /* POST /v1/models/load, /v1/models/unload */
  ROUTE_MODEL_UNLOAD,
  ROUTE_OLL_VERSION,  /* the Ollama API under /api/ */
  ROUTE_OLL_TAGS,
  ROUTE_OLL_SHOW,
  ROUTE_OLL_PS,
  ROUTE_OLL_CHAT,
  ROUTE_OLL_GENERATE,
  ROUTE_OLL_EMBED,
  ROUTE_OLL_EMBEDDINGS,
  ROUTE_OLL_PULL,
  ROUTE_OLL_DELETE,
  ROUTE_OLL_REFUSED,  /* Ollama routes hearth does not serve: create, copy, push, blobs */
  ROUTE_FILES,        /* POST / GET /v1/files */
  ROUTE_FILE,         /* GET / DELETE /v1/files/{id} */
  ROUTE_FILE_CONTENT, /* GET /v1/files/{id}/content */
  ROUTE_BATCHES,      /* POST / GET /v1/batches */
  ROUTE_BATCH,        /* GET /v1/batches/{id} */
  ROUTE_BATCH_CANCEL, /* POST /v1/batches/{id}/cancel */
  ROUTE_INFILL,       /* POST /infill (llama.cpp's fill-in-the-middle) */
} route;

/* The error shape of a route's protocol. */
enum { PROTO_OPENAI = 0, PROTO_ANTHROPIC = 1, PROTO_OLLAMA = 2 };

/* Per-request state, kept in MHD's con_cls between the calls for one request. */
typedef struct conn {
  route route;
  bool del;            /* DELETE (on /v1/responses/{id}) */
  bool post;           /* POST (on /v1/adapters) */
  bool head;           /* HEAD: answer as GET without the body */
  bool failed;         /* `fail` is the answer; the body is read and dropped */
  bool anthropic;      /* under /v1/messages: errors in Anthropic's shape */
  bool ollama;         /* under /api/: errors in Ollama's shape */
  int priority;        /* X-Hearth-Priority: 0 (normal), 1 (low: batch rows) */
  size_t max_body;     /* this request's body limit */
  serve_fail fail;
  const char *allow;   /* for 405 */
  char allow_buf[64];  /* the methods a path takes, when allow points here */
  char path[512];      /* the URL path without a trailing slash */
  hbuf body;           /* owned */
  bool counted;        /* in serve_server.in_flight until on_completed */
  /* answered on a thread of its own (defer): 1 while it runs, 2 once done */
  int deferred;
  struct MHD_Response *resp; /* owned: the answer made there, queued by the polling thread */
  unsigned resp_status;
  enum MHD_Result resp_rc;   /* MHD_NO: no answer (nobody to answer, or out of memory): close */
  serve_server *srv;         /* borrowed, for the answering thread */
  struct MHD_Connection *c;
  /* for /metrics and the request's log line */
  double t_start;            /* its head arrived (mono_seconds) */
  const char *route_path;    /* static: the route table's path; NULL: no route matched */
  char method[8];
  unsigned status;           /* the answer's; 0: none (the client went away) */
  bool job_owned;            /* a generation answers it and logs it itself when it ends */
} conn;

/* Queues `resp` (consumed) on `c`, or keeps it for the polling thread when
 * this thread answers a suspended connection. */
static enum MHD_Result queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *resp) {
  if (tl_deferred) {
    if (tl_deferred->resp) MHD_destroy_response(tl_deferred->resp);
    tl_deferred->resp = resp;
    tl_deferred->resp_status = status;
    return MHD_YES;
  }
  tl_status = status;
  enum MHD_Result rc = MHD_queue_response(c, status, resp);
  MHD_destroy_response(resp);
  return rc;
}

/* ---- plain responses ---- */

static enum MHD_Result send_bytes(struct MHD_Connection *c, unsigned status, const char *type, const char *data,
                                  size_t len, const char *allow) {
  struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
  if (!resp) return MHD_NO;
  MHD_add_response_header(resp, "Content-Type", type);
  if (allow) MHD_add_response_header(resp, "Allow", allow);
  cors_headers(resp);
  return queue(c, status, resp);
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *j /* consumed */) {
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (!s) return MHD_NO;
  enum MHD_Result rc = send_bytes(c, status, "application/json", s, strlen(s), NULL);
  free(s);
  return rc;
}

/* An error in the OpenAI shape, or the Anthropic or Ollama one (PROTO_*). */
static enum MHD_Result send_fail_as(struct MHD_Connection *c, const serve_fail *f, const char *allow, int proto) {
  char *s = proto == PROTO_OLLAMA ? oll_fail_json(f) : proto == PROTO_ANTHROPIC ? anth_fail_json(f) : serve_fail_json(f);
  if (!s) return MHD_NO;
  HLOG_DEBUG("serve: %d %s", f->status, f->message);
  enum MHD_Result rc = send_bytes(c, (unsigned)f->status, "application/json", s, strlen(s), allow);
  free(s);
  return rc;
}

static enum MHD_Result send_fail(struct MHD_Connection *c, const serve_fail *f, const char *allow) {
  return send_fail_as(c, f, allow, PROTO_OPENAI);
}

static int conn_proto(const struct conn *cn) {
  return cn->ollama ? PROTO_OLLAMA : cn->anthropic ? PROTO_ANTHROPIC : PROTO_OPENAI;
}

/* ---- informational endpoints ---- */

static json_t *model_object(const serve_engine *e, const char *id) {
  json_t *m = json_object();
  json_object_set_new(m, "id", json_string(id));
  json_object_set_new(m, "object", json_string("model"));
  json_object_set_new(m, "created", json_integer(e->created));
  json_object_set_new(m, "owned_by", json_string("hearth"));
  json_object_set_new(m, "context_length", json_integer(e->context_length));
  /* loaded now, or on the next request that names it (a model loaded on first use); what it takes and gives */
  json_object_set_new(m, "state", json_string(!e->is_loaded || e->is_loaded(e->impl) ? "loaded" : "unloaded"));
  json_t *caps = json_array();
  if (e->render_chat) json_array_append_new(caps, json_string("chat"));
  json_array_append_new(caps, json_string("completion"));
  if (e->embed && e->embed_dim > 0) json_array_append_new(caps, json_string("embeddings"));
  if (e->tool_format) json_array_append_new(caps, json_string("tools"));
  if (e->reasoning) json_array_append_new(caps, json_string("reasoning"));
  static const char *const kinds[] = {"vision", "audio", "video"};
  for (int k = HEARTH_MEDIA_IMAGE; k <= HEARTH_MEDIA_VIDEO; k++)
    if (e->media_kinds & (1u << k)) json_array_append_new(caps, json_string(kinds[k]));
  json_object_set_new(m, "capabilities", caps);
  return m;
}

/* The loaded LoRA adapters (malloc'd, *n of them; NULL when none or the engine takes none). */
static hearth_adapter_info *adapters_of(const serve_engine *e, int *n) {
  *n = 0;
  if (!e->adapter_list) return NULL;
  int want = e->adapter_list(e->impl, NULL, 0);
  hearth_adapter_info *a = want > 0 ? calloc((size_t)want, sizeof *a) : NULL;
  if (a) {
    int got = e->adapter_list(e->impl, a, want); /* fewer when some were unloaded meanwhile */
    *n = got < want ? got : want;
  }
  return a;
}

/* Whether a loaded adapter is called `name` (a request may name one as its model, as with vLLM). */
static bool adapter_named(const serve_engine *e, const char *name) {
  int n;
  hearth_adapter_info *a = adapters_of(e, &n);
  bool found = false;
  for (int i = 0; i < n && !found; i++) found = strcmp(a[i].name, name) == 0;
  free(a);
  return found;
}

/* An adapter as a model of /v1/models: the base's object with its parent. */
static json_t *adapter_model_object(const serve_engine *e, const hearth_adapter_info *a) {
  json_t *m = model_object(e, a->name);
  json_object_set_new(m, "parent", json_string(e->model_id));
  json_object_set_new(m, "root", json_string(a->path));
  return m;
}

/* The served names in /v1/models' order: the models, the first's other names, then the loaded
 * adapters. names[i] borrowed from s or from *a (malloc'd; free it). */
static int served_names(serve_server *s, hearth_adapter_info **a, const char ***names) {
  int na;
  *a = adapters_of(s->engine, &na);
  *names = calloc((size_t)(s->nengines + s->nnames + na), sizeof **names);
  if (!*names) return 0;
  int n = 0;
  for (int i = 0; i < s->nengines; i++) (*names)[n++] = s->engines[i]->model_id;
  for (int i = 0; i < s->nnames; i++)
    if (strcmp(s->names[i], "*") != 0 && strcmp(s->names[i], s->engine->model_id) != 0) (*names)[n++] = s->names[i];
  for (int i = 0; i < na; i++) (*names)[n++] = (*a)[i].name;
  return n;
}

/* A model in Anthropic's shape: {"type":"model","id","display_name","created_at" (RFC 3339)}. */
static json_t *anth_model_object(const serve_engine *e, const char *id) {
  char when[32];
  time_t t = (time_t)e->created;
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return json_pack("{s:s, s:s, s:s, s:s}", "type", "model", "id", id, "display_name", id, "created_at", when);
}

/* GET /v1/models for an Anthropic client: {"data", "has_more", "first_id", "last_id"}, paged by
 * limit (1..1000, default 20), after_id and before_id as Anthropic's API pages it. */
static enum MHD_Result answer_anth_models(struct MHD_Connection *c, serve_server *s) {
  hearth_adapter_info *a;
  const char **names;
  int n = served_names(s, &a, &names);
  serve_fail f = {0};
  const char *lim = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
  const char *after = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after_id");
  const char *before = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "before_id");
  long limit = 20;
  if (lim) {
    char *end;
    limit = strtol(lim, &end, 10);
    if (!lim[0] || *end || limit < 1 || limit > 1000)
      serve_fail_set(&f, 400, "invalid_request_error", "limit", NULL, "limit: must be an integer from 1 to 1000");
  }
  int from = 0, to = n; /* [from, to) before the limit */
  for (int k = 0; k < 2 && !f.status; k++) {
    const char *id = k ? before : after;
    if (!id) continue;
    int at = -1;
    for (int i = 0; i < n && at < 0; i++)
      if (!strcmp(names[i], id)) at = i;
    if (at < 0)
      serve_fail_set(&f, 400, "invalid_request_error", k ? "before_id" : "after_id", NULL,
                     "%s: '%.200s' is not a model this server lists", k ? "before_id" : "after_id", id);
    else if (k) to = at;
    else from = at + 1;
  }
  if (f.status) {
    free(names);
    free(a);
    return send_fail_as(c, &f, NULL, true);
  }
  bool has_more = false;
  if (to - from > limit) {
    has_more = true;
    if (before && !after) from = to - (int)limit; /* paging backwards: the page just before before_id */
    else to = from + (int)limit;
  }
  json_t *data = json_array();
  for (int i = from; i < to; i++) {
    serve_engine *e = engine_named(s, names[i]);
    json_array_append_new(data, anth_model_object(e ? e : s->engine, names[i]));
  }
  json_t *o = json_object();
  json_object_set_new(o, "data", data);
  json_object_set_new(o, "has_more", json_boolean(has_more));
  json_object_set_new(o, "first_id", from < to ? json_string(names[from]) : json_null());
  json_object_set_new(o, "last_id", from < to ? json_string(names[to - 1]) : json_null());
  free(names);
  free(a);
  return send_json(c, 200, o);
}

static enum MHD_Result answer_models(struct MHD_Connection *c, serve_server *s, bool anthropic) {
  if (anthropic) return answer_anth_models(c, s);
  json_t *o = json_object();
  json_object_set_new(o, "object", json_string("list"));
  json_t *data = json_array();
  for (int i = 0; i < s->nengines; i++) json_array_append_new(data, model_object(s->engines[i], s->engines[i]->model_id));
  for (int i = 0; i < s->nnames; i++)
    if (strcmp(s->names[i], "*") != 0 && strcmp(s->names[i], s->engine->model_id) != 0)
      json_array_append_new(data, model_object(s->engine, s->names[i]));
  int n;
  hearth_adapter_info *a = adapters_of(s->engine, &n);
  for (int i = 0; i < n; i++) json_array_append_new(data, adapter_model_object(s->engine, &a[i]));
  free(a);
  json_object_set_new(o, "data", data);
  return send_json(c, 200, o);
}

static enum MHD_Result answer_model(struct MHD_Connection *c, serve_server *s, const char *id, bool anthropic) {
  serve_engine *e = engine_named(s, id);
  if (e) return send_json(c, 200, anthropic ? anth_model_object(e, id) : model_object(e, id));
  int n;
  hearth_adapter_info *a = adapters_of(s->engine, &n);
  for (int i = 0; i < n; i++)
    if (!strcmp(a[i].name, id)) {
      json_t *m = anthropic ? anth_model_object(s->engine, id) : adapter_model_object(s->engine, &a[i]);
      free(a);
      return send_json(c, 200, m);
    }
  free(a);
  serve_fail f;
  serve_fail_set(&f, 404, "invalid_request_error", "model", "model_not_found", "The model '%.200s' does not exist",
                 id);
  return send_fail_as(c, &f, NULL, anthropic);
}

static json_t *route_index(void); /* the route table's listing, below */
static enum MHD_Result send_hbuf(struct MHD_Connection *c, hbuf *b);

static enum MHD_Result answer_index(struct MHD_Connection *c, const serve_server *s) {
  json_t *o = json_object();
  json_object_set_new(o, "object", json_string("list"));
  json_t *data = route_index();
  json_object_set_new(o, "data", data);
  /* what the served model can do through these routes */
  const serve_engine *e = s->engine;
  json_t *cap = json_object();
  json_object_set_new(cap, "model", json_string(e->model_id));
  json_object_set_new(cap, "tools", json_boolean(e->tool_format != TC_NONE));
  json_object_set_new(cap, "tool_call_format", json_string(tc_format_name((tc_format)e->tool_format)));
  json_object_set_new(cap, "reasoning", json_boolean(e->reasoning));
  json_object_set_new(cap, "embeddings", json_boolean(e->embed && e->embed_dim > 0));
  if (e->embed && e->embed_dim > 0) json_object_set_new(cap, "embedding_dimensions", json_integer(e->embed_dim));
  json_object_set_new(cap, "signal", json_boolean(e->signal != NULL));
  /* suffix on /v1/completions and POST /infill */
  json_object_set_new(cap, "fill_in_the_middle", json_boolean(e->fim_prompt != NULL && e->generate_ids != NULL));
  json_object_set_new(cap, "adapters", json_boolean(e->adapter_list != NULL));
  json_t *media = json_array(); /* the kinds of media messages may hold */
  static const char *const kinds[] = {"image", "audio", "video"};
  for (int k = 0; k < 3; k++)
    if (e->media_kinds & (1u << k)) json_array_append_new(media, json_string(kinds[k]));
  json_object_set_new(cap, "media", media);
  /* the generation methods: autoregressive (denoising for a block-diffusion model); speculative
     with the draft source loaded */
  json_t *methods = json_array();
  json_array_append_new(methods, json_string(e->denoising ? "denoising" : "autoregressive"));
  if (e->spec_method) json_array_append_new(methods, json_pack("{s:s, s:s}", "method", "speculative", "source", e->spec_method));
  json_object_set_new(cap, "methods", methods);
  json_object_set_new(cap, "context_length", json_integer(e->context_length));
  json_t *own = json_array(); /* the tools the server runs itself (serve/tools.h) */
  for (int i = 0; i < s->ntools; i++) json_array_append_new(own, json_string(s->tools[i].name));
  json_object_set_new(cap, "server_tools", own);
  json_object_set_new(o, "capabilities", cap);
  return send_json(c, 200, o);
}

static enum MHD_Result answer_health(struct MHD_Connection *c, serve_server *s) {
  json_t *o = json_object();
  json_object_set_new(o, "status", json_string("ok"));
  json_object_set_new(o, "model", json_string(s->engine->model_id));
  return send_json(c, 200, o);
}

/* ---- serving counters ---- */

static void engine_stats(const serve_server *s, serve_stats *st) {
  memset(st, 0, sizeof *st);
  if (s->engine->stats) s->engine->stats(s->engine->impl, st);
}

static double rate(int64_t n, double seconds) { return seconds > 0 ? (double)n / seconds : 0; }

static enum MHD_Result answer_stats(struct MHD_Connection *c, serve_server *s) {
  serve_stats st;
  engine_stats(s, &st);
  json_t *o = json_object();
  json_object_set_new(o, "model", json_string(s->engine->model_id));
  json_t *rq = json_object();
  json_object_set_new(rq, "running", json_integer(st.running));
  json_object_set_new(rq, "waiting", json_integer(st.waiting));
  json_object_set_new(rq, "finished", json_integer(st.requests_finished));
  json_object_set_new(rq, "cancelled", json_integer(st.requests_cancelled));
  json_object_set_new(rq, "refused", json_integer(st.requests_refused));
  json_object_set_new(rq, "preemptions", json_integer(st.preemptions));
  json_object_set_new(o, "requests", rq);
  json_t *kv = json_object();
  json_object_set_new(kv, "block_tokens", json_integer(st.kv_block_tokens));
  json_object_set_new(kv, "blocks_total", json_integer(st.kv_blocks_total));
  json_object_set_new(kv, "blocks_used", json_integer(st.kv_blocks_used));
  json_object_set_new(kv, "blocks_cached", json_integer(st.kv_blocks_cached));
  json_object_set_new(kv, "blocks_free", json_integer(st.kv_blocks_total - st.kv_blocks_used));
  json_object_set_new(kv, "format", json_string(st.kv_format[0] ? st.kv_format : "f32"));
  json_object_set_new(kv, "block_bytes", json_integer(st.kv_block_bytes));
  json_object_set_new(kv, "capacity_tokens", json_integer(st.kv_blocks_total * st.kv_block_tokens));
  json_object_set_new(o, "kv_cache", kv);
  json_t *pc = json_object();
  int64_t all = st.prefix_hit_tokens + st.prefix_miss_tokens;
  json_object_set_new(pc, "hit_tokens", json_integer(st.prefix_hit_tokens));
  json_object_set_new(pc, "miss_tokens", json_integer(st.prefix_miss_tokens));
  json_object_set_new(pc, "hit_rate", json_real(all ? (double)st.prefix_hit_tokens / (double)all : 0));
  json_object_set_new(o, "prefix_cache", pc);
  json_t *tk = json_object();
  json_object_set_new(tk, "prompt", json_integer(st.prompt_tokens));
  json_object_set_new(tk, "generated", json_integer(st.generated_tokens));
  json_object_set_new(tk, "prompt_per_second", json_real(rate(st.prompt_tokens, st.busy_seconds)));
  json_object_set_new(tk, "generation_per_second", json_real(rate(st.generated_tokens, st.busy_seconds)));
  json_object_set_new(tk, "busy_seconds", json_real(st.busy_seconds));
  json_object_set_new(tk, "steps", json_integer(st.steps));
  json_object_set_new(o, "tokens", tk);
  if (st.expert_budget > 0) {
    json_t *ex = json_object();
    json_object_set_new(ex, "budget_bytes", json_integer(st.expert_budget));
    json_object_set_new(ex, "resident_bytes", json_integer(st.expert_resident_bytes));
    json_object_set_new(ex, "page_ins", json_integer(st.expert_page_ins));
    json_object_set_new(o, "experts", ex);
  }
  if (st.kv_store) { /* the prefix cache on disk */
    json_t *ks = json_object();
    json_object_set_new(ks, "blocks", json_integer(st.kv_store_blocks));
    json_object_set_new(ks, "bytes", json_integer(st.kv_store_bytes));
    json_object_set_new(ks, "blocks_written", json_integer(st.kv_store_written));
    json_object_set_new(ks, "blocks_read", json_integer(st.kv_store_read));
    json_object_set_new(ks, "blocks_removed", json_integer(st.kv_store_removed));
    json_object_set_new(ks, "files_rejected", json_integer(st.kv_store_rejected));
    json_object_set_new(ks, "hit_tokens", json_integer(st.kv_store_hit_tokens));
    json_object_set_new(ks, "write_queue", json_integer(st.kv_store_pending));
    json_object_set_new(ks, "writes_dropped", json_integer(st.kv_store_dropped));
    json_object_set_new(o, "kv_store", ks);
  }
  /* speculative decoding, per draft source */
  json_t *sp = json_object();
  for (int k = 0; k < HEARTH_SPEC_SOURCES; k++) {
    json_t *one = json_object();
    json_object_set_new(one, "steps", json_integer(st.spec_steps[k]));
    json_object_set_new(one, "drafted", json_integer(st.spec_drafted[k]));
    json_object_set_new(one, "accepted", json_integer(st.spec_accepted[k]));
    json_object_set_new(one, "acceptance_rate",
                        json_real(st.spec_drafted[k] ? (double)st.spec_accepted[k] / (double)st.spec_drafted[k] : 0));
    json_object_set_new(sp, hearth_spec_source_name(k), one);
  }
  json_object_set_new(o, "speculative", sp);
  return send_json(c, 200, o);
}

static void metric(hbuf *b, const char *name, const char *type, const char *help, double v) {
  hbuf_printf(b, "# HELP hearth_%s %s\n# TYPE hearth_%s %s\nhearth_%s %.17g\n", name, help, name, type, name, v);
}

static enum MHD_Result answer_metrics(struct MHD_Connection *c, serve_server *s) {
  serve_stats st;
  engine_stats(s, &st);
  hbuf b = {0};
  metric(&b, "requests_running", "gauge", "Requests in the running batch.", (double)st.running);
  metric(&b, "requests_waiting", "gauge", "Requests waiting for a batch slot or KV blocks.", (double)st.waiting);
  metric(&b, "requests_finished_total", "counter", "Requests that finished (stop or length).", (double)st.requests_finished);
  metric(&b, "requests_cancelled_total", "counter", "Requests cancelled (client gone or shutdown).", (double)st.requests_cancelled);
  metric(&b, "requests_refused_total", "counter", "Requests refused by memory admission.", (double)st.requests_refused);
  metric(&b, "preemptions_total", "counter", "Sequences preempted for KV blocks and recomputed.", (double)st.preemptions);
  metric(&b, "kv_blocks_total", "gauge", "KV cache blocks in the pool.", (double)st.kv_blocks_total);
  metric(&b, "kv_blocks_used", "gauge", "KV cache blocks held by sequences.", (double)st.kv_blocks_used);
  metric(&b, "kv_blocks_cached", "gauge", "KV cache blocks kept for the prefix cache, evictable.", (double)st.kv_blocks_cached);
  metric(&b, "kv_block_tokens", "gauge", "Tokens per KV cache block.", (double)st.kv_block_tokens);
  metric(&b, "kv_block_bytes", "gauge", "Bytes of one KV cache block as stored (all layers, K and V).", (double)st.kv_block_bytes);
  metric(&b, "prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.", (double)st.prefix_hit_tokens);
  metric(&b, "prefix_cache_miss_tokens_total", "counter", "Prompt tokens not found in the prefix cache.", (double)st.prefix_miss_tokens);
  metric(&b, "prompt_tokens_total", "counter", "Prompt tokens computed.", (double)st.prompt_tokens);
  metric(&b, "generation_tokens_total", "counter", "Tokens generated.", (double)st.generated_tokens);
  metric(&b, "engine_busy_seconds_total", "counter", "Seconds the engine spent in forward steps.", st.busy_seconds);
  metric(&b, "engine_steps_total", "counter", "Batched forward steps run.", (double)st.steps);
  if (st.kv_store) {
    metric(&b, "kv_store_blocks", "gauge", "KV blocks stored on disk (--kv-store).", (double)st.kv_store_blocks);
    metric(&b, "kv_store_bytes", "gauge", "Bytes of the KV blocks stored on disk.", (double)st.kv_store_bytes);
    metric(&b, "kv_store_blocks_written_total", "counter", "KV blocks written to disk.", (double)st.kv_store_written);
    metric(&b, "kv_store_blocks_read_total", "counter", "KV blocks read back from disk into the cache.", (double)st.kv_store_read);
    metric(&b, "kv_store_blocks_removed_total", "counter", "KV block files removed to stay under --kv-store-max.",
           (double)st.kv_store_removed);
    metric(&b, "kv_store_files_rejected_total", "counter",
           "KV block files ignored or removed: another model, format or version, or damaged.", (double)st.kv_store_rejected);
    metric(&b, "kv_store_hit_tokens_total", "counter", "Prompt tokens whose KV was read back from disk instead of computed.",
           (double)st.kv_store_hit_tokens);
    metric(&b, "kv_store_write_queue", "gauge", "Evicted KV blocks waiting for the disk writer.", (double)st.kv_store_pending);
    metric(&b, "kv_store_writes_dropped_total", "counter", "Evicted KV blocks not written: the writer's queue was full.",
           (double)st.kv_store_dropped);
  }
  /* speculative decoding: one labelled series per draft source */
  static const struct {
    const char *name, *type, *help;
  } spec_metrics[] = {
      {"spec_steps_total", "counter", "Verification steps with drafted tokens, by draft source."},
      {"spec_drafted_tokens_total", "counter", "Tokens drafted for speculative decoding, by draft source."},
      {"spec_accepted_tokens_total", "counter", "Drafted tokens the model accepted, by draft source."},
      {"spec_acceptance_rate", "gauge", "Accepted over drafted tokens, by draft source."}};
  for (int m = 0; m < 4; m++) {
    hbuf_printf(&b, "# HELP hearth_%s %s\n# TYPE hearth_%s %s\n", spec_metrics[m].name, spec_metrics[m].help,
                spec_metrics[m].name, spec_metrics[m].type);
    for (int k = 0; k < HEARTH_SPEC_SOURCES; k++) {
      double v = m == 0 ? (double)st.spec_steps[k] : m == 1 ? (double)st.spec_drafted[k] : m == 2 ? (double)st.spec_accepted[k]
               : st.spec_drafted[k] ? (double)st.spec_accepted[k] / (double)st.spec_drafted[k] : 0;
      hbuf_printf(&b, "hearth_%s{source=\"%s\"} %.17g\n", spec_metrics[m].name, hearth_spec_source_name(k), v);
    }
  }
  serve_metrics_write(s->metrics, &b);
  enum MHD_Result rc = b.oom ? MHD_NO : send_bytes(c, 200, "text/plain; version=0.0.4", hbuf_str(&b), b.len, NULL);
  hbuf_free(&b);
  return rc;
}

/* GET /fit[?ctx=N&batch=B]: the engine's answer as it gives it. */
static enum MHD_Result answer_fit(struct MHD_Connection *c, serve_server *s) {
  serve_fail f;
  if (!s->engine->fit) {
    serve_fail_set(&f, 404, "invalid_request_error", NULL, "not_found", "This server's engine does not answer /fit");
    return send_fail(c, &f, NULL);
  }
  long long ctx = 0, batch = 0;
  const char *names[2] = {"ctx", "batch"};
  long long *vals[2] = {&ctx, &batch};
  for (int i = 0; i < 2; i++) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, names[i]);
    if (!v) continue;
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || errno || x < 1 || x > (i ? 1 << 20 : 1ll << 26)) {
      serve_fail_set(&f, 400, "invalid_request_error", names[i], NULL, "%s must be a positive integer, not '%.40s'",
                     names[i], v);
      return send_fail(c, &f, NULL);
    }
    *vals[i] = x;
  }
  char *json = NULL;
  herr err = {0};
  if (s->engine->fit(s->engine->impl, ctx, (int)batch, &json, &err)) {
    serve_fail_set(&f, 500, "server_error", NULL, NULL, "fit: %s", err.msg);
    return send_fail(c, &f, NULL);
  }
  enum MHD_Result rc = send_bytes(c, 200, "application/json", json, strlen(json), NULL);
  free(json);
  return rc;
}

/* ---- client liveness ---- */

static int conn_fd(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  return ci ? (int)ci->connect_fd : -1;
}

/* True when the client is gone. For a whole reply (ended_input_is_gone):
 * once the client has closed its side (its FIN, POLLRDHUP), whether by
 * close() or shutdown(SHUT_WR) — a client waiting for an answer does not end
 * its input, and a closed socket would look the same until the answer is
 * written, after the whole generation; so the generation stops there, as
 * nginx ends a request whose client closed (499). For a stream: only once its
 * connection was reset or its socket no longer exists, so a client that
 * half-closed still reads its stream; streams write every token, and a
 * failed write ends the connection in libmicrohttpd and cancels. A stream
 * that has nothing to write yet gets TCP keepalive probes every second on
 * POLLRDHUP: they are answered while the peer's socket lives and reset once
 * it is gone, which shows here as POLLERR/POLLHUP. A client that resets the
 * connection (killed, or closed with unread data) is seen at once. */
static bool client_gone_as(int fd, bool ended_input_is_gone) {
  if (fd < 0) return false;
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
  if (p.revents & POLLRDHUP) {
    if (ended_input_is_gone) return true;
    int one = 1, idle = 1, intvl = 1, cnt = 3;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  }
  return false;
}

static bool client_gone(int fd) { return client_gone_as(fd, false); }

/* ---- generation ---- */

struct job;

/* One choice of a generation: a prompt of the request and a copy of it (n > 1).
 * Choice 0 is the job's own reply, result and status; the others own theirs.
 * Each runs as a sequence of its own in the engine; the copies of a prompt
 * start once its first copy has a token, so they find its KV blocks in the
 * prefix cache instead of computing the prompt again. */
typedef struct slot {
  struct job *j;          /* borrowed */
  int prompt, copy;       /* which prompt of the request, which of its n copies */
  const char *text;       /* borrowed: the rendered or raw prompt ("" with ids, or echo_text) */
  char *echo_text;        /* owned, NULL unless echo with ids: the ids decoded */
  const int32_t *ids;     /* borrowed: the prompt's token ids; NULL: text */
  size_t n_ids;
  int64_t prompt_tokens;  /* counted before generating */
  serve_sampling sampling; /* the request's (its pointers borrowed), with this copy's seed */
  serve_reply *reply;     /* &j->reply for choice 0, else &own */
  serve_result *result;   /* &j->result for choice 0, else &own_result */
  int *rc;                /* &j->rc for choice 0, else &own_rc */
  herr *err;              /* &j->err for choice 0, else &own_err */
  serve_reply own;        /* owned (choices after the first) */
  serve_result own_result;
  int own_rc;
  herr own_err;
  bool started;           /* has a token or ended (under j->gen_mu): its copies may start */
  double cum_logprob;     /* the sum of its tokens' logprobs (best_of ranks by it) */
  double t_first, t_last; /* its first and latest generated token (mono_seconds; 0: none yet) */
  pthread_t thread;
  bool thread_started;
} slot;

/* What a generation needs, whole or streamed. */
typedef struct job {
  serve_server *srv;        /* borrowed */
  serve_engine *engine;     /* borrowed: the model the request named */
  bool held;                /* engine's model is held loaded for it (hold) until job_free */
  bool anthropic;           /* answered in the Anthropic Messages shapes (areply), else OpenAI's (reply) */
  bool responses;           /* answered as an OpenAI Responses response (rreply) */
  bool ollama;              /* answered in the Ollama API's shapes (oreply): NDJSON streams */
  oll_request oreq;         /* ollama */
  oll_reply oreply;         /* owned (ollama) */
  char *pull_name;          /* owned: an /api/pull job (no generation: the fetch's progress is the stream) */
  bool pull_running;        /* (under mu) its thread has not finished */
  bool pull_orphan;         /* (under mu) MHD let go of it first: the pull's thread frees it */
  resp_request rr;          /* owned (responses) */
  resp_reply rreply;        /* owned (responses) */
  json_t *history;          /* owned (responses): the conversation previous_response_id continues */
  serve_request req;        /* owned */
  char *prompt;             /* owned: rendered chat or raw prompt */
  int64_t prompt_tokens;    /* counted before generating */
  serve_reply reply;        /* owned */
  anth_reply areply;        /* owned */
  serve_result result;
  serve_result usage;       /* summed over the choices: prompts counted once each */
  slot *slots;              /* owned: the choices (prompts × n; one for Anthropic and Responses) */
  int nslots;
  serve_token_fn fn;        /* the token callback every choice runs with */
  pthread_mutex_t gen_mu;   /* the slots' started flags */
  pthread_cond_t gen_cv;
  bool parse;               /* chat: the reply is split by a tool-call / reasoning parser of `tc` */
  tc_opts tc;
  char *forced;             /* owned; NULL: none. The call opening the reply (tool_choice), already in the prompt */
  bool forced_gbnf;         /* req.gbnf is the forced call's grammar (not the request's own) */
  unsigned tools_added;     /* the server's tools (serve/tools.h) added to the request: bit i for tools[i] */
  json_t *exchange;         /* owned, NULL until a round of the server's tools ran: the messages it added */
  serve_result tool_usage;  /* the tokens of the rounds before the last */
  int rounds;               /* rounds of the server's tools run */
  bool tools_go_on;         /* a stream's round ended calling only the server's tools: another follows */
  const char *hidden[SERVE_MAX_TOOLS]; /* the names of the tools added (not streamed as calls) */
  int nhidden;
  int fd;                   /* the client's socket, watched for hang-ups */
  bool whole;               /* answered whole (not streamed): gone once the client ends its input */
  struct job *wnext, **wprev; /* in the server's list of whole replies being computed (under park_mu) */
  volatile int cancel;      /* set through cancel_set, read by the engine every step */
  int rc;                   /* generate's status */
  herr err;
  /* streams only */
  pthread_t thread;
  bool thread_started;
  pthread_mutex_t mu;
  hbuf out;                 /* owned: SSE bytes produced but not yet sent */
  size_t sent;              /* bytes of `out` already handed to MHD */
  bool done;                /* the producer finished: `out` is all there is */
  struct MHD_Connection *c; /* the stream's connection, suspended while it is parked */
  double idle_since;        /* when the stream last had bytes handed over (mono_seconds) */
  bool parked;              /* in the server's parked list, its connection suspended (under park_mu) */
  struct job *pnext, **pprev;
  /* the server's list of running generations (serve_drain_cancel) */
  struct job *jnext, **jprev;
  volatile int drained;     /* cancelled by the end of a drain: it ends as cut by length, not as a client gone */
  /* for /metrics and the request's log line */
  double t_start;           /* the request's head arrived (mono_seconds) */
  const char *route_path;   /* static */
} job;

static void forced_call_grammar(job *j);
static void request_done(serve_server *s, const char *method, const char *route, unsigned status, double t_start,
                         int64_t prompt_tokens, int64_t completion_tokens, double ttft);

/* A generated token's times: the choice's first (time to first token) or the gap since its last. */
static void token_times(slot *sl, const serve_token *tok) {
  if (tok->flush) return;
  double now = mono_seconds();
  serve_metrics *m = sl->j->srv->metrics;
  if (sl->t_first == 0) {
    sl->t_first = now;
    serve_metrics_observe(m, SERVE_HIST_TTFT, now - sl->j->t_start);
  } else {
    serve_metrics_observe(m, SERVE_HIST_ITL, now - sl->t_last);
  }
  sl->t_last = now;
}

/* A generation ends, answered with status (0: the client went away): its latency, queue waits,
 * count and log line. */
static void job_done(job *j, unsigned status) {
  serve_server *s = j->srv;
  if (status == 200) {
    serve_metrics_observe(s->metrics, SERVE_HIST_E2E, mono_seconds() - j->t_start);
    for (int i = 0; i < j->nslots; i++)
      if (*j->slots[i].rc == 0 && j->slots[i].result->queue_seconds >= 0)
        serve_metrics_observe(s->metrics, SERVE_HIST_QUEUE, j->slots[i].result->queue_seconds);
  }
  double ttft = j->nslots > 0 && j->slots[0].t_first > 0 ? j->slots[0].t_first - j->t_start : -1;
  request_done(s, "POST", j->route_path, status, j->t_start, j->usage.prompt_tokens, j->usage.completion_tokens, ttft);
}

/* The client of j is gone: as a whole reply's, or as a stream's (client_gone_as). */
static bool job_client_gone(const struct job *j) { return client_gone_as(j->fd, j->whole); }

static void cancel_set(job *j) { __atomic_store_n(&j->cancel, 1, __ATOMIC_SEQ_CST); }
static bool cancelled(job *j) { return __atomic_load_n(&j->cancel, __ATOMIC_SEQ_CST) != 0; }
static bool drained(job *j) { return __atomic_load_n(&j->drained, __ATOMIC_SEQ_CST) != 0; }
/* Cancelled because the client went away (not by a drain, which still answers). */
static bool abandoned(job *j) { return cancelled(j) && !drained(j); }

static void jobs_add(serve_server *s, job *j) {
  pthread_mutex_lock(&s->jobs_mu);
  j->jnext = s->jobs;
  j->jprev = &s->jobs;
  if (s->jobs) s->jobs->jprev = &j->jnext;
  s->jobs = j;
  pthread_mutex_unlock(&s->jobs_mu);
}

static void jobs_remove(serve_server *s, job *j) {
  pthread_mutex_lock(&s->jobs_mu);
  *j->jprev = j->jnext;
  if (j->jnext) j->jnext->jprev = j->jprev;
  j->jnext = NULL;
  j->jprev = NULL;
  pthread_mutex_unlock(&s->jobs_mu);
}

/* Holds e's model loaded for a request, loading it first when it is not (a model loaded on first use):
 * 0, or the refusal in f — memory_admission when it cannot fit the model memory budget. */
static int hold(serve_engine *e, serve_fail *f) {
  if (!e->acquire) return 0;
  herr err = {0};
  if (!e->acquire(e->impl, &err)) return 0;
  if (err.cause == HEARTH_CAUSE_MEMORY_ADMISSION)
    return serve_fail_set(f, 400, "memory_admission", "model", "memory_admission", "%s", err.msg);
  return serve_fail_set(f, 503, "server_error", "model", "model_unavailable", "model '%.200s' could not be loaded: %s",
                        e->model_id, err.msg);
}

static void unhold(serve_engine *e, double keep_alive_s) {
  if (e->release) e->release(e->impl, keep_alive_s);
}

static void job_free(job *j) {
  if (!j) return;
  if (j->held) unhold(j->engine, j->ollama ? j->oreq.keep_alive_s : -1);
  for (int i = 1; i < j->nslots; i++) serve_reply_free(&j->slots[i].own);
  for (int i = 0; i < j->nslots; i++) free(j->slots[i].echo_text);
  free(j->slots);
  pthread_mutex_destroy(&j->gen_mu);
  pthread_cond_destroy(&j->gen_cv);
  serve_request_free(&j->req);
  free(j->prompt);
  free(j->forced);
  json_decref(j->exchange);
  serve_reply_free(&j->reply);
  anth_reply_free(&j->areply);
  resp_reply_free(&j->rreply);
  oll_reply_free(&j->oreply);
  free(j->pull_name);
  resp_request_free(&j->rr);
  json_decref(j->history);
  hbuf_free(&j->out);
  pthread_mutex_destroy(&j->mu);
  free(j);
}

static const char *kind_word(hearth_media_kind k) {
  return k == HEARTH_MEDIA_IMAGE ? "image" : k == HEARTH_MEDIA_AUDIO ? "audio" : "video";
}

static void slot_started(slot *sl) {
  job *j = sl->j;
  pthread_mutex_lock(&j->gen_mu);
  if (!sl->started) {
    sl->started = true;
    pthread_cond_broadcast(&j->gen_cv);
  }
  pthread_mutex_unlock(&j->gen_mu);
}

static void stream_push(job *j, const hbuf *b, bool done);

/* Whether the reply just made calls only the server's own tools (serve/tools.h), which run and
 * the model goes on: an OpenAI chat of one choice, ended well, within the rounds allowed (its
 * parser ended: serve_reply_end / serve_sse_end). */
static bool tools_go_on(job *j) {
  if (!j->tools_added || j->nslots != 1 || j->anthropic || j->responses || j->ollama) return false;
  if (j->rc || j->result.finish == SERVE_FINISH_CANCELLED || cancelled(j) || j->rounds >= j->srv->tool_rounds) return false;
  return serve_tools_all_ours(j->srv->tools, j->srv->ntools, j->tools_added, j->reply.calls);
}

/* The reply's calls of the server's tools are kept out of a stream. */
static void reply_hide(const job *j, serve_reply *r) {
  r->hidden = j->hidden;
  r->nhidden = j->nhidden;
}

/* One choice through the engine. A stream's choice sends its finish chunk as it ends. */
static void slot_run(slot *sl) {
  job *j = sl->j;
  serve_engine *e = j->engine;
  sl->result->stop_index = -1;
  if (sl->ids)
    *sl->rc = e->generate_ids(e->impl, sl->ids, sl->n_ids, &sl->sampling, j->fn, sl, &j->cancel, sl->result, sl->err);
  else if (j->req.n_media > 0 && e->generate_media)
    *sl->rc = e->generate_media(e->impl, sl->text, j->req.kind == SERVE_COMPLETION, j->req.media, j->req.n_media,
                                &sl->sampling, j->fn, sl, &j->cancel, sl->result, sl->err);
  else if (j->req.n_media > 0)
    *sl->rc = herr_set_at(sl->err, HEARTH_EINVAL, j->req.media[0].name, 0, "%s: this server takes no %s input",
                          j->req.media[0].name, kind_word(j->req.media[0].kind));
  else
    *sl->rc = e->generate(e->impl, sl->text, j->req.kind == SERVE_COMPLETION, &sl->sampling, j->fn, sl, &j->cancel,
                          sl->result, sl->err);
  /* cut by the end of a drain: answered with what it has, ended as by a length limit */
  if (drained(j) && (*sl->rc == HEARTH_ECANCELLED || sl->result->finish == SERVE_FINISH_CANCELLED)) {
    *sl->rc = 0;
    sl->result->finish = SERVE_FINISH_LENGTH;
    HLOG_INFO("serve: %lld tokens in, cut by the drain timeout", (long long)sl->result->completion_tokens);
  }
  if (j->req.stream && !j->anthropic && !j->responses && !j->ollama && !j->req.infill && *sl->rc == 0 &&
      !abandoned(j)) {
    hbuf b = {0};
    serve_sse_end(sl->reply, &b);
    /* a round that called only the server's own tools does not end the stream: stream_main runs another */
    j->tools_go_on = sl == &j->slots[0] && tools_go_on(j);
    if (!j->tools_go_on) serve_sse_finish(sl->reply, sl->result->finish, &b);
    stream_push(j, &b, false);
    hbuf_free(&b);
  }
  slot_started(sl);
}

/* A choice on a thread of its own: a copy waits for its prompt's first copy. */
static void *slot_main(void *arg) {
  slot *sl = arg;
  job *j = sl->j;
  if (sl->copy > 0) {
    slot *first = sl - sl->copy;
    pthread_mutex_lock(&j->gen_mu);
    while (!first->started) pthread_cond_wait(&j->gen_cv, &j->gen_mu);
    pthread_mutex_unlock(&j->gen_mu);
  }
  slot_run(sl);
  return NULL;
}

/* Runs every choice through the engine under the server's lock (one after
 * another when the engine is not thread-safe, else side by side); a request
 * cancelled while it waited for the lock never starts. Then the usage is
 * summed and the first failing choice's status is the job's. */
static void job_generate(job *j, serve_token_fn fn) {
  serve_server *s = j->srv;
  serve_engine *e = j->engine;
  bool lock = !e->thread_safe;
  j->fn = fn;
  if (lock) pthread_mutex_lock(&s->engine_lock);
  if (cancelled(j) || job_client_gone(j) || __atomic_load_n(&s->stopping, __ATOMIC_SEQ_CST)) {
    cancel_set(j);
    j->rc = HEARTH_ECANCELLED;
    herr_set(&j->err, HEARTH_ECANCELLED, "the client went away");
  } else {
    jobs_add(s, j);
    if (atomic_load(&s->draining) > 1) __atomic_store_n(&j->drained, 1, __ATOMIC_SEQ_CST), cancel_set(j);
    if (__atomic_load_n(&s->stopping, __ATOMIC_SEQ_CST)) cancel_set(j); /* serve_stop's sweep may have missed it */
    for (int i = 1; i < j->nslots && !lock; i++)
      j->slots[i].thread_started = pthread_create(&j->slots[i].thread, NULL, slot_main, &j->slots[i]) == 0;
    slot_run(&j->slots[0]);
    for (int i = 1; i < j->nslots; i++) {
      if (j->slots[i].thread_started) pthread_join(j->slots[i].thread, NULL);
      else slot_main(&j->slots[i]);
    }
    jobs_remove(s, j);
  }
  if (lock) pthread_mutex_unlock(&s->engine_lock);
  j->usage = j->result;
  for (int i = 1; i < j->nslots; i++) {
    slot *sl = &j->slots[i];
    if (sl->copy == 0) {
      j->usage.prompt_tokens += sl->result->prompt_tokens;
      j->usage.cached_tokens += sl->result->cached_tokens;
    }
    j->usage.completion_tokens += sl->result->completion_tokens;
    if (j->rc == 0 && *sl->rc) {
      j->rc = *sl->rc;
      j->err = *sl->err;
    }
  }
}

/* An engine failure as the client sees it: by its code and typed cause, with
 * the field the engine named (never by parsing its message). */
static void fail_from_engine(const job *j, serve_fail *f) {
  const char *param = j->req.kind == SERVE_CHAT ? (j->responses ? "input" : "messages") : "prompt";
  const char *field = j->err.field[0] ? j->err.field : NULL;
  if (j->err.cause == HEARTH_CAUSE_MEMORY_ADMISSION) {
    serve_fail_set(f, 400, "memory_admission", param, "memory_admission", "%s", j->err.msg);
    return;
  }
  if (j->err.cause == HEARTH_CAUSE_CONTEXT_LENGTH) {
    serve_fail_set(f, 400, "invalid_request_error", param, "context_length_exceeded", "%s", j->err.msg);
    return;
  }
  switch (j->rc) {
  case HEARTH_ELIMIT:
  case HEARTH_EINVAL:
  case HEARTH_EFORMAT:
  case HEARTH_EUNSUPPORTED:
  case HEARTH_ENOTFOUND:
    serve_fail_set(f, 400, "invalid_request_error", field, NULL, "%s", j->err.msg);
    break;
  default:
    serve_fail_set(f, 500, "server_error", NULL, NULL, "generation failed: %s", j->err.msg);
  }
}

static const char *job_name(const job *j) {
  if (j->ollama) return j->oreq.chat ? "api/chat" : "api/generate";
  return j->responses ? "responses" : j->anthropic ? "messages" : j->req.kind == SERVE_CHAT ? "chat" : "completion";
}

/* Keeps a finished Responses response (and the conversation it ends) when asked to. */
static void store_response(job *j, const json_t *o) {
  if (!j->responses || !j->rr.store || !o || !j->srv->responses) return;
  json_t *conv = resp_reply_conversation(&j->rreply, j->history);
  resp_store_put(j->srv->responses, o, conv);
  json_decref(conv);
}

/* Whole responses: gather every step, stop when the client hangs up. */
static int whole_token(void *ctx, const serve_token *tok) {
  slot *sl = ctx;
  job *j = sl->j;
  if (!sl->started) slot_started(sl);
  if (!tok->flush) sl->cum_logprob += tok->logprob;
  token_times(sl, tok);
  if (j->responses) resp_reply_add(&j->rreply, tok);
  else if (j->ollama) oll_reply_add(&j->oreply, tok);
  else if (j->anthropic) anth_reply_add(&j->areply, tok);
  else serve_reply_add(sl->reply, tok);
  if (job_client_gone(j)) cancel_set(j);
  return cancelled(j) ? 1 : 0;
}

/* The forced opening of the reply goes through the parser first, as if generated. */
static void job_prime(job *j, hbuf *sse) {
  if (!j->forced) return;
  if (j->responses) resp_reply_prime(&j->rreply, j->forced, sse);
  else if (j->anthropic) anth_reply_prime(&j->areply, j->forced, sse);
  else
    for (int i = 0; i < j->nslots; i++) serve_reply_prime(j->slots[i].reply, j->forced, sse);
}

/* Waits on cv (mu held) for a signal or WAIT_MS, whichever comes first. */
static void wait_tick(pthread_cond_t *cv, pthread_mutex_t *mu) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_nsec += WAIT_MS * 1000 * 1000;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_cond_timedwait(cv, mu, &until);
}

/* A whole reply checks its client at each token (whole_token), and while it
 * is computed the server's watcher checks it every WAIT_MS too (a long
 * prefill, a wait for the engine, a block-diffusion model's tokens that come
 * a block at a time): a client gone sets the cancel flag, which the engine
 * reads before every forward step. */
static void whole_watch(job *j, bool on) {
  serve_server *s = j->srv;
  pthread_mutex_lock(&s->park_mu);
  if (on) {
    j->wprev = &s->whole;
    j->wnext = s->whole;
    if (s->whole) s->whole->wprev = &j->wnext;
    s->whole = j;
  } else if (j->wprev) {
    *j->wprev = j->wnext;
    if (j->wnext) j->wnext->wprev = j->wprev;
    j->wnext = NULL;
    j->wprev = NULL;
  }
  pthread_mutex_unlock(&s->park_mu);
}

/* The choices a whole reply returns, into r / res: every slot, or with
 * best_of > n the n of each prompt's best_of continuations with the highest
 * cumulative logprob (best first; ties to the earlier copy), re-indexed
 * prompt * n + k. Returns how many. */
static int best_of_choices(job *j, serve_reply **r, serve_result *res) {
  int n = j->req.n > 0 ? j->req.n : 1, copies = j->req.kind == SERVE_COMPLETION && j->req.best_of > n ? j->req.best_of : n;
  if (copies == n || j->anthropic || j->responses) {
    for (int i = 0; i < j->nslots; i++) r[i] = j->slots[i].reply, res[i] = *j->slots[i].result;
    return j->nslots;
  }
  int out = 0;
  for (int p = 0; p * copies < j->nslots; p++) {
    slot *base = &j->slots[p * copies];
    bool taken[SERVE_MAX_CHOICES] = {0};
    for (int k = 0; k < n; k++) {
      int best = -1;
      for (int c = 0; c < copies; c++)
        if (!taken[c] && (best < 0 || base[c].cum_logprob > base[best].cum_logprob)) best = c;
      taken[best] = true;
      base[best].reply->index = p * n + k;
      r[out] = base[best].reply;
      res[out++] = *base[best].result;
    }
  }
  return out;
}

static int chat_prompt(job *j, serve_fail *f);
static bool needs_specials(const tc_opts *o);

/* After a reply that called only the server's own tools (serve/tools.h):
 * runs them, appends the calls and their results to the conversation and
 * sets the next round up — prompt, parser, a new reply under the same id.
 * The tool_choice that forced the first call is the first round's only. */
static int tool_round(job *j, serve_fail *f) {
  serve_server *s = j->srv;
  herr err = {0};
  if (!j->exchange && !(j->exchange = json_array())) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  j->tool_usage.prompt_tokens += j->result.prompt_tokens;
  j->tool_usage.completion_tokens += j->result.completion_tokens;
  j->tool_usage.cached_tokens += j->result.cached_tokens;
  if (serve_tools_run(s->tools, s->ntools, &j->req, hbuf_str(&j->reply.text), j->reply.calls, j->exchange, &err))
    return serve_fail_set(f, 500, "server_error", NULL, NULL, "%s", err.msg);
  if (j->req.tool_choice == SERVE_TOOLS_REQUIRED || j->req.tool_choice == SERVE_TOOLS_NAMED)
    j->req.tool_choice = SERVE_TOOLS_AUTO;
  if (j->forced_gbnf) {
    free(j->req.gbnf);
    j->req.gbnf = NULL;
    j->req.sampling.grammar = NULL;
    j->forced_gbnf = false;
  }
  free(j->forced);
  j->forced = NULL;
  free(j->prompt);
  j->prompt = NULL;
  if (chat_prompt(j, f)) return f->status;
  serve_reply *r = &j->reply;
  char id[sizeof r->id];
  memcpy(id, r->id, sizeof id);
  int64_t created = r->created;
  const char *model = r->model;
  bool logprobs = r->logprobs;
  serve_reply_free(r);
  serve_reply_init(r, SERVE_CHAT, model, created, 0, logprobs);
  memcpy(r->id, id, sizeof id);
  r->one_call = j->req.one_tool_call;
  r->usage_null = j->req.stream && j->req.include_usage;
  reply_hide(j, r);
  if (j->parse && serve_reply_parse(r, &j->tc, &err)) return serve_fail_set(f, 500, "server_error", NULL, NULL, "%s", err.msg);
  if (j->parse) j->req.sampling.skip_special = !needs_specials(&j->tc);
  slot *sl = &j->slots[0];
  sl->text = j->prompt;
  sl->sampling = j->req.sampling;
  sl->started = false;
  sl->t_first = sl->t_last = 0;
  sl->cum_logprob = 0;
  memset(&j->result, 0, sizeof j->result);
  j->rc = 0;
  memset(&j->err, 0, sizeof j->err);
  job_prime(j, NULL);
  return 0;
}

/* The response with the server's tool exchange and the earlier rounds' tokens added. */
static void tool_body(job *j, hbuf *body) {
  if (!j->exchange || body->oom) return;
  json_t *o = json_loadb(body->data, body->len, 0, NULL);
  json_t *u = json_object_get(o, "usage");
  if (!o || !u) {
    json_decref(o);
    return;
  }
  int64_t p = j->usage.prompt_tokens + j->tool_usage.prompt_tokens, c = j->usage.completion_tokens + j->tool_usage.completion_tokens;
  json_object_set_new(u, "prompt_tokens", json_integer(p));
  json_object_set_new(u, "completion_tokens", json_integer(c));
  json_object_set_new(u, "total_tokens", json_integer(p + c));
  json_t *d = json_object_get(u, "prompt_tokens_details");
  if (d) json_object_set_new(d, "cached_tokens", json_integer(j->usage.cached_tokens + j->tool_usage.cached_tokens));
  json_object_set(o, "tool_exchange", j->exchange);
  char *txt = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  if (!txt) return;
  hbuf_clear(body);
  hbuf_puts(body, txt);
  free(txt);
}

static enum MHD_Result answer_whole(struct MHD_Connection *c, job *j) {
  for (int i = 0; j->req.echo && i < j->nslots; i++) hbuf_puts(&j->slots[i].reply->text, j->slots[i].text);
  job_prime(j, NULL);
  j->whole = true;
  whole_watch(j, true);
  job_generate(j, whole_token);
  /* the server's own tools: run while the reply calls only them (at most tool_rounds rounds; a
   * reply past those, or one calling the client's tools too, is answered as it is) */
  serve_fail tf = {0};
  bool tool_failed = false;
  while (j->tools_added) {
    serve_reply_end(&j->reply);
    if (!tools_go_on(j)) break;
    if (tool_round(j, &tf)) {
      tool_failed = true;
      break;
    }
    HLOG_INFO("serve: chat: round %d of the server's tools ran", ++j->rounds);
    job_generate(j, whole_token);
  }
  whole_watch(j, false);
  enum MHD_Result rc;
  if (tool_failed) {
    rc = send_fail_as(c, &tf, NULL, PROTO_OPENAI);
    job_done(j, (unsigned)tf.status);
  } else if (j->rc == 0 && j->result.finish != SERVE_FINISH_CANCELLED) {
    hbuf body = {0};
    if (j->responses) {
      json_t *o = resp_reply_object(&j->rreply, &j->result);
      char *txt = o ? json_dumps(o, JSON_COMPACT) : NULL;
      if (txt) hbuf_puts(&body, txt);
      else body.oom = true;
      free(txt);
      store_response(j, o);
      json_decref(o);
    } else if (j->ollama) {
      oll_reply_body(&j->oreply, &j->result, &body);
    } else if (j->anthropic) {
      anth_reply_body(&j->areply, &j->result, &body);
    } else if (j->req.infill) {
      infill_body(&j->req, j->reply.model ? j->reply.model : j->srv->engine->model_id, hbuf_str(&j->reply.text),
                  j->reply.text.len, &j->result, &body);
    } else {
      serve_reply **r = malloc(sizeof *r * (size_t)j->nslots);
      serve_result *res = malloc(sizeof *res * (size_t)j->nslots);
      int nr = j->nslots;
      if (r && res) nr = best_of_choices(j, r, res);
      if (r && res) serve_reply_body_n(r, res, nr, &j->usage, &body);
      else body.oom = true;
      free(r);
      free(res);
      tool_body(j, &body);
    }
    rc = body.oom ? MHD_NO : send_bytes(c, 200, "application/json", hbuf_str(&body), body.len, NULL);
    job_done(j, body.oom ? 500 : 200);
    HLOG_INFO("serve: %s 200: %d choice%s, %lld prompt + %lld completion tokens, %s", job_name(j), j->nslots,
              j->nslots == 1 ? "" : "s", (long long)j->usage.prompt_tokens, (long long)j->usage.completion_tokens,
              serve_finish_name(j->result.finish));
    hbuf_free(&body);
  } else if (abandoned(j)) {
    HLOG_INFO("serve: client went away; generation cancelled");
    rc = MHD_NO; /* nobody to answer */
    job_done(j, 0);
  } else {
    serve_fail f;
    fail_from_engine(j, &f);
    rc = send_fail_as(c, &f, NULL, j->ollama ? PROTO_OLLAMA : j->anthropic);
    job_done(j, (unsigned)f.status);
  }
  job_free(j);
  return rc;
}

/* Streams: the producer thread formats SSE into j->out; MHD's reader drains
 * it. A reader with nothing to hand over parks the connection (suspends it);
 * whoever has something for it — the producer, or the watcher with a
 * keep-alive due or a client gone — unparks it (under park_mu). */
static void park(job *j) {
  serve_server *s = j->srv;
  j->parked = true;
  j->pprev = &s->parked;
  j->pnext = s->parked;
  if (s->parked) s->parked->pprev = &j->pnext;
  s->parked = j;
  MHD_suspend_connection(j->c);
}

static void unpark(job *j, bool resume) {
  if (!j->parked) return;
  *j->pprev = j->pnext;
  if (j->pnext) j->pnext->pprev = j->pprev;
  j->parked = false;
  j->pnext = NULL;
  j->pprev = NULL;
  if (resume) MHD_resume_connection(j->c);
}

static void stream_push(job *j, const hbuf *b, bool done) {
  pthread_mutex_lock(&j->mu);
  if (j->pull_orphan) { /* nobody reads it, and the server may be gone */
    pthread_mutex_unlock(&j->mu);
    return;
  }
  if (b->len) hbuf_append(&j->out, b->data, b->len);
  if (done) j->done = true;
  if (b->len || done) {
    pthread_mutex_lock(&j->srv->park_mu);
    unpark(j, true);
    pthread_mutex_unlock(&j->srv->park_mu);
  }
  pthread_mutex_unlock(&j->mu);
}

static int stream_token(void *ctx, const serve_token *tok) {
  slot *sl = ctx;
  job *j = sl->j;
  if (!sl->started) slot_started(sl);
  token_times(sl, tok);
  hbuf b = {0};
  if (j->responses) resp_sse_token(&j->rreply, tok, &b);
  else if (j->ollama) oll_stream_token(&j->oreply, tok, &b);
  else if (j->anthropic) anth_sse_token(&j->areply, tok, &b);
  else if (j->req.infill) infill_sse_token(tok->text, tok->len, &b);
  else serve_sse_token(sl->reply, tok, &b);
  stream_push(j, &b, false);
  hbuf_free(&b);
  return cancelled(j) ? 1 : 0;
}

static void pull_main(job *j);

static void *stream_main(void *arg) {
  job *j = arg;
  hbuf b = {0};
  if (j->pull_name) {
    pull_main(j);
    return NULL;
  }
  if (j->responses) resp_sse_start(&j->rreply, &b);
  else if (j->ollama) (void)0; /* an Ollama stream opens with its first token's line */
  else if (j->anthropic) anth_sse_start(&j->areply, j->prompt_tokens, &b);
  else if (j->req.infill) (void)0; /* llama.cpp's stream opens with the first piece */
  else
    for (int i = 0; i < j->nslots; i++) {
      serve_sse_start(j->slots[i].reply, &b);
      if (j->req.echo) serve_sse_text(j->slots[i].reply, j->slots[i].text, strlen(j->slots[i].text), &b);
    }
  job_prime(j, &b);
  stream_push(j, &b, false);
  hbuf_clear(&b);
  job_generate(j, stream_token);
  while (j->tools_go_on) { /* the server's own tools were called: run, and the model goes on in the same stream */
    j->tools_go_on = false;
    serve_fail tf;
    if (tool_round(j, &tf)) {
      j->rc = herr_set(&j->err, HEARTH_EINTERNAL, "%s", tf.message);
      break;
    }
    HLOG_INFO("serve: chat stream: round %d of the server's tools ran", ++j->rounds);
    job_generate(j, stream_token);
  }
  job_done(j, abandoned(j) ? 0 : 200); /* (the stream's status went out with its first bytes) */
  if (abandoned(j)) {
    HLOG_INFO("serve: client went away; stream cancelled after %lld tokens", (long long)j->result.completion_tokens);
  } else if (j->rc) {
    serve_fail f;
    fail_from_engine(j, &f);
    if (j->responses) {
      resp_sse_error(&j->rreply, &f, &b);
    } else if (j->ollama) {
      oll_error_line(&f, &b);
    } else if (j->anthropic) {
      anth_sse_error(&f, &b);
    } else if (j->req.infill) {
      infill_sse_error(&f, &b);
    } else {
      serve_sse_error(&f, &b);
      serve_sse_done(&b);
    }
  } else {
    if (j->responses) {
      resp_sse_finish(&j->rreply, &j->result, &b);
      json_t *o = resp_reply_object(&j->rreply, &j->result);
      store_response(j, o);
      json_decref(o);
    } else if (j->ollama) {
      oll_stream_finish(&j->oreply, &j->result, &b);
    } else if (j->anthropic) {
      anth_sse_finish(&j->areply, &j->result, &b);
    } else if (j->req.infill) {
      infill_sse_finish(&j->req, j->reply.model ? j->reply.model : j->srv->engine->model_id, &j->result, &b);
    } else { /* each choice sent its finish chunk as it ended (slot_run) */
      serve_result u = j->usage; /* with the rounds of the server's tools */
      u.prompt_tokens += j->tool_usage.prompt_tokens;
      u.completion_tokens += j->tool_usage.completion_tokens;
      u.cached_tokens += j->tool_usage.cached_tokens;
      if (j->exchange) serve_sse_tool_exchange(&j->reply, j->exchange, &b);
      if (j->req.include_usage) serve_sse_usage(&j->reply, &u, &b);
      serve_sse_done(&b);
    }
    HLOG_INFO("serve: %s stream: %d choice%s, %lld prompt + %lld completion tokens, %s", job_name(j), j->nslots,
              j->nslots == 1 ? "" : "s", (long long)j->usage.prompt_tokens, (long long)j->usage.completion_tokens,
              serve_finish_name(j->result.finish));
  }
  stream_push(j, &b, true);
  hbuf_free(&b);
  return NULL;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  job *j = cls;
  serve_server *s = j->srv;
  pthread_mutex_lock(&j->mu);
  ssize_t n;
  if (j->sent < j->out.len) {
    size_t left = j->out.len - j->sent;
    n = (ssize_t)(left < max ? left : max);
    memcpy(buf, j->out.data + j->sent, (size_t)n);
    j->sent += (size_t)n;
    if (j->sent == j->out.len) {
      hbuf_clear(&j->out);
      j->sent = 0;
    }
    j->idle_since = mono_seconds();
  } else if (j->done) {
    n = MHD_CONTENT_READER_END_OF_STREAM;
  } else if (abandoned(j) || client_gone(j->fd) || __atomic_load_n(&s->stopping, __ATOMIC_SEQ_CST)) {
    cancel_set(j);
    n = MHD_CONTENT_READER_END_WITH_ERROR;
  } else if (!j->ollama && mono_seconds() - j->idle_since >= s->keepalive_s && max >= sizeof KEEPALIVE - 1) {
    /* A long prefill or a queue: an SSE comment keeps proxies and clients patient. */
    atomic_fetch_add(&s->keepalives, 1);
    memcpy(buf, KEEPALIVE, sizeof KEEPALIVE - 1);
    n = (ssize_t)(sizeof KEEPALIVE - 1);
    j->idle_since = mono_seconds();
  } else {
    /* nothing yet: parked until the producer or the watcher has something for it (an NDJSON
     * stream has no comment to keep alive with: its idle time starts over, so the watcher
     * does not wake it every tick) */
    if (j->ollama && mono_seconds() - j->idle_since >= s->keepalive_s) j->idle_since = mono_seconds();
    pthread_mutex_lock(&s->park_mu);
    if (__atomic_load_n(&s->stopping, __ATOMIC_SEQ_CST)) {
      cancel_set(j);
      n = MHD_CONTENT_READER_END_WITH_ERROR;
    } else {
      park(j);
      n = 0;
    }
    pthread_mutex_unlock(&s->park_mu);
  }
  pthread_mutex_unlock(&j->mu);
  return n;
}

/* MHD is done with the stream (finished, or the client went away). */
static void stream_free(void *cls) {
  job *j = cls;
  cancel_set(j);
  pthread_mutex_lock(&j->srv->park_mu);
  unpark(j, false);
  pthread_mutex_unlock(&j->srv->park_mu);
  if (j->pull_name && j->thread_started) { /* a pull is not cut: its thread finishes and frees the job */
    pthread_mutex_lock(&j->mu);
    bool running = j->pull_running;
    if (running) j->pull_orphan = true;
    pthread_mutex_unlock(&j->mu);
    if (running) {
      pthread_detach(j->thread);
      return;
    }
  }
  if (j->thread_started) pthread_join(j->thread, NULL);
  job_free(j);
}

static void heads_expire(serve_server *s, double now);

/* The server's watcher: every WAIT_MS, wakes the parked streams whose client
 * is gone (their generation is cancelled) or whose keep-alive comment is due,
 * cancels the whole replies whose client is gone, and every HEAD_SCAN_S
 * closes the connections whose request head is late; when the server stops,
 * wakes all the parked streams. */
static void *watcher_main(void *arg) {
  serve_server *s = arg;
  pthread_mutex_lock(&s->park_mu);
  while (!s->watcher_stop) {
    wait_tick(&s->watcher_cv, &s->park_mu);
    double now = mono_seconds();
    for (job *j = s->parked, *next; j; j = next) {
      next = j->pnext;
      bool gone = abandoned(j) || client_gone(j->fd);
      if (gone) cancel_set(j);
      if (gone || now - j->idle_since >= s->keepalive_s) unpark(j, true);
    }
    for (job *j = s->whole; j; j = j->wnext)
      if (!cancelled(j) && job_client_gone(j)) cancel_set(j);
    if (now >= s->next_head_scan) {
      heads_expire(s, now);
      s->next_head_scan = now + HEAD_SCAN_S;
    }
  }
  for (job *j = s->parked, *next; j; j = next) { /* stopping */
    next = j->pnext;
    cancel_set(j);
    unpark(j, true);
  }
  pthread_mutex_unlock(&s->park_mu);
  return NULL;
}

static enum MHD_Result answer_stream(struct MHD_Connection *c, job *j) {
  struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, j, stream_free);
  if (!resp) {
    job_free(j);
    return MHD_NO;
  }
  /* From here the response owns j: stream_free runs when MHD lets go of it. */
  j->c = c;
  j->idle_since = mono_seconds();
  if (pthread_create(&j->thread, NULL, stream_main, j) == 0) {
    j->thread_started = true;
  } else {
    j->done = true;
    if (j->ollama)
      hbuf_puts(&j->out, "{\"error\":\"could not start a thread\"}\n");
    else if (j->anthropic)
      hbuf_puts(&j->out, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\","
                         "\"message\":\"could not start a thread\"}}\n\n");
    else
      hbuf_puts(&j->out, "data: {\"error\":{\"message\":\"could not start a thread\",\"type\":\"server_error\","
                         "\"param\":null,\"code\":null}}\n\ndata: [DONE]\n\n");
  }
  MHD_add_response_header(resp, "Content-Type", j->ollama ? "application/x-ndjson" : "text/event-stream");
  MHD_add_response_header(resp, "Cache-Control", "no-cache");
  MHD_add_response_header(resp, "X-Accel-Buffering", "no");
  cors_headers(resp);
  return queue(c, 200, resp);
}

/* The generic tool-call format (a template without a call syntax of its own):
 * the tools and the shape of a call, as llama.cpp's generic handler tells
 * them, for the system message. Appended to b. */
static void generic_tools_text(const json_t *tools, hbuf *b) {
  hbuf_puts(b, "You can call these tools (each with its JSON schema of arguments):\n");
  size_t i;
  json_t *t;
  json_array_foreach(tools, i, t) {
    json_t *fn = json_object_get(t, "function");
    json_t *one = json_object();
    json_object_set(one, "name", json_object_get(fn, "name"));
    if (json_object_get(fn, "description")) json_object_set(one, "description", json_object_get(fn, "description"));
    json_t *params = json_object_get(fn, "parameters");
    json_object_set_new(one, "parameters", params ? json_incref(params) : json_pack("{s:s}", "type", "object"));
    char *js = json_dumps(one, JSON_COMPACT);
    json_decref(one);
    if (!js) {
      b->oom = true;
      return;
    }
    hbuf_printf(b, "%s\n", js);
    free(js);
  }
  hbuf_puts(b, "To call tools, reply with only a JSON object of this shape, the arguments following the tool's "
               "schema:\n{\"tool_calls\": [{\"name\": \"TOOL_NAME\", \"arguments\": {...}}]}");
}

/* The messages a chat is rendered from when the model uses the generic
 * tool-call format and its template does not render tools: the request's,
 * with the tools' description appended to the leading system message (or a
 * system message of it put first); in_user (for templates that refuse a
 * system role): put before the first user message's text instead. *msgs
 * (borrowing the request's strings) and *sys owned by the caller; *msgs NULL
 * when the request's own are used. Nonzero only when out of memory. */
static int generic_tools_messages(const serve_engine *e, const serve_request *req, bool in_user, serve_message **msgs,
                                  int *nmsgs, char **sys) {
  *msgs = NULL;
  *sys = NULL;
  *nmsgs = req->nmessages;
  if (e->tool_format != TC_GENERIC || e->template_tools || !json_array_size(req->tools) ||
      req->tool_choice == SERVE_TOOLS_NONE)
    return 0;
  int at = 0; /* the message that takes the description */
  bool merge = req->nmessages > 0 && !strcmp(req->messages[0].role, "system") && !req->messages[0].parts;
  if (in_user) {
    for (at = 0; at < req->nmessages && strcmp(req->messages[at].role, "user"); at++) {}
    if (at == req->nmessages || req->messages[at].parts) return 0; /* nowhere to say it */
    merge = true;
  }
  hbuf b = {0};
  if (merge && !in_user && req->messages[0].content[0]) hbuf_printf(&b, "%s\n\n", req->messages[0].content);
  generic_tools_text(req->tools, &b);
  if (in_user) hbuf_printf(&b, "\n\n%s", req->messages[at].content);
  int n = req->nmessages + (merge ? 0 : 1);
  serve_message *m = calloc((size_t)n, sizeof *m);
  if (!m || b.oom) {
    free(m);
    hbuf_free(&b);
    return -1;
  }
  memcpy(m + (merge ? 0 : 1), req->messages, (size_t)req->nmessages * sizeof *m);
  if (!merge) {
    m[0].extra = m[0].parts = NULL;
    m[0].role = (char *)"system";
  }
  m[at].content = *sys = hbuf_take(&b);
  *msgs = m;
  *nmsgs = n;
  return 0;
}

/* Renders a chat request's messages with the model's template into *prompt. */
static int render_prompt(serve_engine *e, const serve_request *req, char **prompt, serve_fail *f) {
  herr err = {0};
  for (int i = 0; i < req->n_media; i++) /* media the model cannot take: refused before the template sees them */
    if (!(e->media_kinds & (1u << req->media[i].kind))) {
      hearth_media_kind k = req->media[i].kind;
      return serve_fail_set(f, 400, "invalid_request_error", req->media[i].name, NULL,
                            "%s: model %s has no %s tower: it cannot take %s", req->media[i].name, e->model_id,
                            k == HEARTH_MEDIA_IMAGE ? "vision" : kind_word(k), k == HEARTH_MEDIA_IMAGE ? "images" : kind_word(k));
    }
  serve_chat_opts o = {.tools = req->tools,
                       .kwargs = req->template_kwargs,
                       .no_generation_prompt = req->no_generation_prompt,
                       .continue_final = req->continue_final_message};
  serve_message *msgs = NULL;
  char *sys = NULL;
  int nmsgs = 0, rc = 0;
  /* the generic format's tools description: in a system message, or, where the
   * template refuses that (Gemma 2 raises on a system role), in the first user turn */
  for (int in_user = 0; in_user < 2; in_user++) {
    if (generic_tools_messages(e, req, in_user, &msgs, &nmsgs, &sys))
      return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
    if (in_user && !msgs) break; /* the first try's failure stands */
    memset(&err, 0, sizeof err);
    rc = e->render_chat(e->impl, msgs ? msgs : req->messages, nmsgs, &o, prompt, &err);
    bool retry = rc == HEARTH_EINVAL && msgs && !in_user;
    free(msgs);
    free(sys);
    msgs = NULL, sys = NULL;
    if (!retry) break;
  }
  if (!rc) return 0;
  /* the template refusing these messages (raise_exception, a type error
   * on what was sent, a render limit) is the client's to fix; a template
   * that cannot be loaded or uses what the engine lacks is the server's */
  if (err.code == HEARTH_EINVAL && !strncmp(err.msg, "continue_final_message:", 23)) {
    serve_fail_set(f, 400, "invalid_request_error", "continue_final_message", NULL, "%s", err.msg);
  } else if (err.code == HEARTH_EINVAL || err.code == HEARTH_ELIMIT) {
    serve_fail_set(f, 400, "invalid_request_error", "messages", NULL, "the chat template failed: %s", err.msg);
  } else if (err.code == HEARTH_ENOTFOUND) {
    serve_fail_set(f, 400, "invalid_request_error", "messages", NULL,
                   "this model has no chat template: send a raw prompt to /v1/completions");
  } else {
    HLOG_WARN("serve: the chat template cannot be used: %s", err.msg);
    serve_fail_set(f, 500, "server_error", NULL, NULL,
                   "the model's chat template cannot be used (the server log says why)");
  }
  return f->status;
}

/* How a chat reply is split: tool calls in the template's syntax when the
 * request offers tools (and does not forbid calling them), reasoning blocks
 * when the template writes them. False when the text is all content. */
static bool output_parser(const serve_engine *e, const serve_request *req, const char *prompt, tc_opts *o) {
  memset(o, 0, sizeof *o);
  o->format = (tc_format)e->tool_format;
  o->tools = req->tools && req->tool_choice != SERVE_TOOLS_NONE;
  o->reasoning = e->reasoning;
  o->in_reasoning = e->reasoning && tc_prompt_opens_reasoning(prompt, strlen(prompt));
  return o->tools || o->reasoning;
}

/* Formats whose markers are special tokens, which the text must then keep. */
static bool needs_specials(const tc_opts *o) {
  switch (o->format) {
  case TC_HARMONY:
  case TC_GEMMA4: return true;
  case TC_LLAMA3:
  case TC_MISTRAL:
  case TC_DEEPSEEK:
  case TC_GLM: return o->tools;
  default: return false;
  }
}

/* A request naming a model this server does not serve: 404 model_not_found. A
 * loaded adapter's name is served: the request runs under it (unless it
 * names its adapter itself). */
static bool model_unknown(const serve_server *s, serve_request *req, int proto, serve_engine **picked, serve_fail *f) {
  bool anth = proto == PROTO_ANTHROPIC;
  serve_engine *e = engine_named(s, req->model);
  if (!e && adapter_named(s->engine, req->model)) {
    if (!req->sampling.adapter) req->sampling.adapter = strdup(req->model);
    e = s->engine;
  }
  if (e) {
    if (picked) *picked = e;
    return false;
  }
  char served[600] = "";
  for (int i = 0; i < s->nengines; i++) {
    size_t n = strlen(served);
    snprintf(served + n, sizeof served - n, "%s'%.200s'", i ? ", " : "", s->engines[i]->model_id);
  }
  if (anth)
    serve_fail_set(f, 404, "not_found_error", "model", "model_not_found", "model: %.200s", req->model);
  else if (proto == PROTO_OLLAMA)
    serve_fail_set(f, 404, "invalid_request_error", "model", "model_not_found",
                   "model '%.200s' not found: this server serves %s", req->model, served);
  else
    serve_fail_set(f, 404, "invalid_request_error", "model", "model_not_found",
                   "The model '%.200s' does not exist (this server serves %s)", req->model, served);
  return true;
}

static serve_engine *engine_named(const serve_server *s, const char *name) {
  if (!name) return s->engine;
  for (int i = 0; i < s->nengines; i++)
    if (name_is(s->engines[i], name)) return s->engines[i];
  return name_served(s, name) ? s->engine : NULL;
}

/* Fill-in-the-middle (`suffix`, /infill): each text prompt becomes the token ids the
 * engine lays out from prefix, suffix, the middle's start and the context before. */
static int fim_prompts(serve_engine *e, serve_request *req, serve_fail *f) {
  const char *field = req->infill ? "input_suffix" : "suffix";
  if (!e->fim_prompt || !e->generate_ids)
    return serve_fail_set(f, 400, "invalid_request_error", field, NULL,
                          "'%s': model %s has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, "
                          "<|fim_middle|> or their kin), so it cannot fill in text between a prefix and a suffix",
                          field, e->model_id);
  for (int i = 0; i < req->n_prompts; i++) {
    serve_prompt q;
    serve_request_prompt(req, i, &q);
    if (q.ids)
      return serve_fail_set(f, 400, "invalid_request_error", field, NULL,
                            "'%s' with a prompt of token ids is not supported: send the prefix as text", field);
    int32_t *ids = NULL;
    size_t n = 0;
    herr err = {0};
    const char *prefix = req->infill ? req->fim_prefix : q.text, *middle = req->infill ? q.text : "";
    if (e->fim_prompt(e->impl, prefix, req->suffix, middle, req->fim_extra, req->n_fim_extra, req->sampling.max_tokens,
                      &ids, &n, &err))
      return err.code == HEARTH_ENOMEM ? serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory")
                                       : serve_fail_set(f, 400, "invalid_request_error", field, NULL, "%s", err.msg);
    if (i == 0) req->prompt_ids = ids, req->n_prompt_ids = n;
    else req->prompts[i - 1].ids = ids, req->prompts[i - 1].n_ids = n;
  }
  return 0;
}

/* POST /v1/chat/completions, /v1/completions and /v1/messages: one path, the
 * protocol chosen by the route. */
/* A token's bytes as the engine decodes it (special tokens kept), malloc'd; NULL on failure. */
static char *token_text(serve_engine *e, int32_t id, size_t *len) {
  char *t = NULL;
  herr err = {0};
  if (e->detokenize(e->impl, &id, 1, &t, len, &err)) return NULL;
  return t;
}

/* echo: a token-id prompt's text (its ids decoded); with logprobs, the
 * prompt's tokens scored by the engine and put before the generated ones
 * (OpenAI's legacy completions). */
static int echo_setup(job *j, serve_fail *f) {
  serve_engine *e = j->srv->engine;
  for (int i = 0; i < j->nslots; i++) {
    slot *sl = &j->slots[i];
    herr err = {0};
    if (sl->ids) {
      if (!e->detokenize) return serve_bad(f, "echo", "'echo' with a prompt of token ids: this server cannot decode tokens");
      size_t len = 0;
      if (e->detokenize(e->impl, sl->ids, sl->n_ids, &sl->echo_text, &len, &err))
        return serve_fail_set(f, 500, "server_error", NULL, NULL, "%s", err.msg);
      sl->text = sl->echo_text;
    }
    if (!j->req.sampling.logprobs) continue;
    if (!e->prompt_logprobs || !e->tokenize || !e->detokenize)
      return serve_bad(f, "echo", "'echo' with 'logprobs': this server cannot score prompts");
    if (sl->copy > 0) { /* the prompt's first copy scored it already */
      json_t *lp = json_deep_copy(j->slots[i - sl->copy].reply->lp);
      if (!lp) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
      json_decref(sl->reply->lp);
      sl->reply->lp = lp;
      continue;
    }
    int32_t *owned = NULL;
    const int32_t *ids = sl->ids;
    size_t n = sl->n_ids;
    if (!ids) {
      if (e->tokenize(e->impl, sl->text, true, &owned, &n, &err))
        return serve_fail_set(f, 500, "server_error", NULL, NULL, "%s", err.msg);
      ids = owned;
    }
    hearth_prompt_logprob *lp = n ? calloc(n, sizeof *lp) : NULL;
    int rc = 0;
    if (n && !lp) rc = serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
    else if (n && e->prompt_logprobs(e->impl, ids, n, j->req.sampling.top_logprobs, &j->cancel, lp, &err))
      rc = err.code == HEARTH_ELIMIT         ? serve_bad(f, "prompt", "%s", err.msg)
           : err.code == HEARTH_EUNSUPPORTED ? serve_bad(f, "echo", "'echo' with 'logprobs': %s", err.msg)
                                             : serve_fail_set(f, 500, "server_error", NULL, NULL, "%s", err.msg);
    size_t cursor = 0, tl = strlen(sl->text);
    for (size_t k = 0; !rc && k < n; k++) {
      size_t len = 0, tlen[HEARTH_MAX_TOP_LOGPROBS] = {0};
      char *txt = token_text(e, lp[k].id, &len), *tops[HEARTH_MAX_TOP_LOGPROBS] = {0};
      serve_top_logprob top[HEARTH_MAX_TOP_LOGPROBS];
      for (int a = 0; a < lp[k].n_top; a++) {
        tops[a] = token_text(e, lp[k].top_ids[a], &tlen[a]);
        top[a] = (serve_top_logprob){.text = tops[a] ? tops[a] : "", .len = tops[a] ? tlen[a] : 0, .logprob = lp[k].top_logprobs[a]};
      }
      serve_token t = {.id = lp[k].id, .text = "", .token_text = txt ? txt : "", .token_len = txt ? len : 0,
                       .logprob = lp[k].logprob, .top = top, .ntop = lp[k].n_top};
      serve_reply_echo_token(sl->reply, &t, k == 0, sl->text, tl, &cursor);
      free(txt);
      for (int a = 0; a < lp[k].n_top; a++) free(tops[a]);
    }
    free(lp);
    free(owned);
    if (rc) return rc;
  }
  return 0;
}

/* return_token_ids: each choice's prompt as the engine reads it (text tokenized
 * as generate tokenizes it, or the ids given). */
static int reply_token_ids(job *j, serve_kind kind, serve_fail *f) {
  serve_engine *e = j->srv->engine;
  if (j->req.n_media > 0)
    return serve_bad(f, "return_token_ids", "'return_token_ids' is not supported with media in the prompt");
  for (int i = 0; i < j->nslots; i++) {
    slot *sl = &j->slots[i];
    if (sl->ids) {
      serve_reply_token_ids(sl->reply, sl->ids, sl->n_ids);
      continue;
    }
    if (!e->tokenize) return serve_bad(f, "return_token_ids", "'return_token_ids': this server has no tokenizer to show");
    int32_t *ids = NULL;
    size_t n = 0;
    herr err = {0};
    if (e->tokenize(e->impl, sl->text, kind == SERVE_COMPLETION, &ids, &n, &err))
      return serve_fail_set(f, 500, "server_error", NULL, NULL, "%s", err.msg);
    serve_reply_token_ids(sl->reply, ids, n);
    free(ids);
  }
  return 0;
}

/* A chat's prompt: the request's messages rendered, the parser of its reply
 * chosen, and under tool_choice required or a named function the reply's
 * opening call written into the prompt (fed to the parser as the reply's
 * start) with the grammar of the rest. */
static int chat_prompt(job *j, serve_fail *f) {
  if (render_prompt(j->engine, &j->req, &j->prompt, f)) return f->status;
  j->parse = output_parser(j->engine, &j->req, j->prompt, &j->tc);
  hbuf forced = {0};
  if (j->parse && j->tc.tools && !j->tc.in_reasoning &&
      (j->req.tool_choice == SERVE_TOOLS_REQUIRED || j->req.tool_choice == SERVE_TOOLS_NAMED) &&
      tc_forced_call(j->tc.format, j->req.tool_choice == SERVE_TOOLS_NAMED ? j->req.tool_name : NULL, &forced)) {
    size_t n = strlen(j->prompt);
    char *p = realloc(j->prompt, n + forced.len + 1);
    if (!p || forced.oom) {
      hbuf_free(&forced);
      return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
    }
    memcpy(p + n, forced.data, forced.len + 1);
    j->prompt = p;
    j->forced = hbuf_take(&forced);
    forced_call_grammar(j);
  }
  hbuf_free(&forced);
  return 0;
}

static enum MHD_Result answer_generate(struct MHD_Connection *c, serve_server *s, conn *cn) {
  bool anth = cn->route == ROUTE_MESSAGES;
  bool oll = cn->route == ROUTE_OLL_CHAT || cn->route == ROUTE_OLL_GENERATE;
  int proto = oll ? PROTO_OLLAMA : anth ? PROTO_ANTHROPIC : PROTO_OPENAI;
  double t0 = oll_now();
  serve_kind kind = cn->route == ROUTE_COMPLETIONS || cn->route == ROUTE_INFILL ? SERVE_COMPLETION : SERVE_CHAT;
  serve_engine *e = s->engine;
  job *j = calloc(1, sizeof *j);
  serve_fail f;
  if (!j) {
    serve_fail_set(&f, 500, "server_error", NULL, NULL, "out of memory");
    return send_fail_as(c, &f, NULL, proto);
  }
  pthread_mutex_init(&j->mu, NULL);
  pthread_mutex_init(&j->gen_mu, NULL);
  pthread_cond_init(&j->gen_cv, NULL);
  j->srv = s;
  j->t_start = cn->t_start;
  j->route_path = cn->route_path;
  j->anthropic = anth;
  j->responses = cn->route == ROUTE_RESPONSES;
  j->ollama = oll;
  j->fd = conn_fd(c);
  if (oll) {
    if (oll_request_parse(hbuf_str(&cn->body), cn->body.len, cn->route == ROUTE_OLL_CHAT, &j->req, &j->oreq, &f))
      goto refuse;
    kind = j->req.kind;
    if (j->oreq.load_only) { /* Ollama's "load the model": nothing to generate */
      if (model_unknown(s, &j->req, proto, &e, &f)) goto refuse;
      bool unload = j->oreq.keep_alive_s == 0; /* keep_alive 0 with no prompt: Ollama's unload request */
      if (!(unload && e->is_loaded && !e->is_loaded(e->impl))) {
        if (hold(e, &f)) goto refuse;
        unhold(e, j->oreq.keep_alive_s);
      }
      hbuf b = {0};
      oll_load_body(j->oreq.chat, j->req.model, unload ? "unload" : "load", &b);
      job_free(j);
      return send_hbuf(c, &b);
    }
  } else if (j->responses) {
    if (resp_request_parse(hbuf_str(&cn->body), cn->body.len, &j->req, &j->rr, &f)) goto refuse;
    if (j->rr.previous_id) {
      json_t *prev = s->responses ? resp_store_get(s->responses, j->rr.previous_id, &j->history) : NULL;
      if (!prev) {
        serve_fail_set(&f, 404, "invalid_request_error", "previous_response_id", "previous_response_not_found",
                       "Previous response with id '%.100s' not found.", j->rr.previous_id);
        goto refuse;
      }
      json_decref(prev);
    }
    if (resp_request_messages(&j->req, &j->rr, j->history, &f)) goto refuse;
  } else if (cn->route == ROUTE_INFILL) {
    if (infill_request_parse(hbuf_str(&cn->body), cn->body.len, &j->req, &f)) goto refuse;
  } else if (anth) {
    if (anth_request_parse(hbuf_str(&cn->body), cn->body.len, false, &j->req, &f)) goto refuse;
  } else {
    /* the server's own tools join the chat's tools (serve/tools.h) */
    char *body = NULL;
    herr ierr = {0};
    if (kind == SERVE_CHAT && s->ntools &&
        serve_tools_inject(s->tools, s->ntools, hbuf_str(&cn->body), cn->body.len, &body, &j->tools_added, &ierr)) {
      serve_fail_set(&f, 500, "server_error", NULL, NULL, "%s", ierr.msg);
      goto refuse;
    }
    int prc = serve_request_parse(body ? body : hbuf_str(&cn->body), body ? strlen(body) : cn->body.len, kind, &j->req, &f);
    free(body);
    if (prc) goto refuse;
    for (int i = 0; i < s->ntools; i++)
      if ((j->tools_added >> i) & 1u) j->hidden[j->nhidden++] = s->tools[i].name;
  }
  if (model_unknown(s, &j->req, proto, &e, &f)) goto refuse;
  j->engine = e;
  j->req.sampling.priority = cn->priority;
  double before_hold = oll_now();
  if (hold(e, &f)) goto refuse;
  j->held = e->acquire != NULL;
  double load_s = j->held ? oll_now() - before_hold : 0; /* a model loaded on first use: the wait for it */
  const char *param = kind == SERVE_CHAT && !(oll && !j->oreq.chat) ? "messages" : "prompt";
  if (kind == SERVE_CHAT) {
    if (chat_prompt(j, &f)) goto refuse;
  } else {
    j->prompt = strdup(j->req.prompt);
    if (!j->prompt) {
      serve_fail_set(&f, 500, "server_error", NULL, NULL, "out of memory");
      goto refuse;
    }
    if (j->req.fim && fim_prompts(e, &j->req, &f)) goto refuse;
  }
  /* Refuse what cannot work before any work, so a stream never starts for it. */
  for (int i = 0; i < j->req.sampling.n_logit_bias; i++)
    if (e->vocab_size > 0 && j->req.sampling.logit_bias[i].id >= e->vocab_size) {
      serve_fail_set(&f, 400, "invalid_request_error", "logit_bias", NULL,
                     "logit_bias: token id %d is outside the vocabulary (size %lld)", (int)j->req.sampling.logit_bias[i].id,
                     (long long)e->vocab_size);
      goto refuse;
    }
  herr err = {0};
  /* the choices: each prompt (a completion's prompt array; else the one) n times */
  int nprompts = kind == SERVE_COMPLETION && j->req.n_prompts > 1 ? j->req.n_prompts : 1;
  int copies = anth || j->responses || j->req.n < 1 ? 1 : j->req.n;
  if (kind == SERVE_COMPLETION && !anth && !j->responses && j->req.best_of > copies) copies = j->req.best_of;
  j->nslots = nprompts * copies;
  j->slots = calloc((size_t)j->nslots, sizeof *j->slots);
  if (!j->slots) {
    serve_fail_set(&f, 500, "server_error", NULL, NULL, "out of memory");
    goto refuse;
  }
  for (int p = 0; p < nprompts; p++) {
    serve_prompt q = {.text = j->prompt};
    if (kind == SERVE_COMPLETION) serve_request_prompt(&j->req, p, &q);
    if (p == 0) q.text = j->prompt;
    char at[32];
    if (nprompts > 1) snprintf(at, sizeof at, "prompt[%d]", p);
    else snprintf(at, sizeof at, "%s", param);
    int64_t ntok = (int64_t)q.n_ids;
    if (q.ids && !e->generate_ids) {
      serve_fail_set(&f, 400, "invalid_request_error", at, NULL, "this server takes text prompts only");
      goto refuse;
    }
    for (size_t i = 0; i < q.n_ids; i++)
      if (e->vocab_size > 0 && q.ids[i] >= e->vocab_size) {
        serve_fail_set(&f, 400, "invalid_request_error", at, NULL, "%s: token %zu is id %d, outside the vocabulary (size %lld)",
                       at, i, (int)q.ids[i], (long long)e->vocab_size);
        goto refuse;
      }
    if (!q.ids && e->count_tokens(e->impl, q.text, kind == SERVE_COMPLETION, &ntok, &err)) {
      serve_fail_set(&f, 400, "invalid_request_error", at, NULL, "%s", err.msg);
      goto refuse;
    }
    int64_t want = j->req.sampling.max_tokens > 0 ? j->req.sampling.max_tokens : 1;
    if (oll && j->oreq.num_ctx > 0 && ntok + want > j->oreq.num_ctx) {
      serve_fail_set(&f, 400, "invalid_request_error", "options.num_ctx", "context_length_exceeded",
                     "options.num_ctx is %lld tokens, but the prompt has %lld and num_predict asks for %lld",
                     (long long)j->oreq.num_ctx, (long long)ntok, (long long)(j->req.sampling.max_tokens > 0 ? want : 0));
      goto refuse;
    }
    if (e->context_length > 0 && ntok + want > e->context_length) {
      if (j->req.sampling.max_tokens > 0)
        serve_fail_set(&f, 400, "invalid_request_error", at, "context_length_exceeded",
                       "This model's maximum context length is %lld tokens. However, you requested %lld tokens "
                       "(%lld in the prompt, %lld for the completion). Please reduce the prompt or the completion length.",
                       (long long)e->context_length, (long long)(ntok + want), (long long)ntok, (long long)want);
      else
        serve_fail_set(&f, 400, "invalid_request_error", at, "context_length_exceeded",
                       "This model's maximum context length is %lld tokens, but the prompt has %lld tokens.",
                       (long long)e->context_length, (long long)ntok);
      goto refuse;
    }
    if (e->admit && e->admit(e->impl, ntok, j->req.sampling.max_tokens, &err)) {
      if (err.cause == HEARTH_CAUSE_MEMORY_ADMISSION)
        serve_fail_set(&f, 400, "memory_admission", at, "memory_admission", "%s", err.msg);
      else
        serve_fail_set(&f, 500, "server_error", NULL, NULL, "%s", err.msg);
      goto refuse;
    }
    for (int c2 = 0; c2 < copies; c2++) {
      slot *sl = &j->slots[p * copies + c2];
      sl->j = j;
      sl->prompt = p;
      sl->copy = c2;
      sl->text = q.text;
      sl->ids = q.ids;
      sl->n_ids = q.n_ids;
      sl->prompt_tokens = ntok;
      bool first = p == 0 && c2 == 0;
      sl->reply = first ? &j->reply : &sl->own;
      sl->result = first ? &j->result : &sl->own_result;
      sl->rc = first ? &j->rc : &sl->own_rc;
      sl->err = first ? &j->err : &sl->own_err;
    }
  }
  j->prompt_tokens = j->slots[0].prompt_tokens;
  uint64_t seq = atomic_fetch_add(&s->next_id, 1);
  uint64_t id_seed = seq * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)j;
  if (oll) {
    oll_reply_init(&j->oreply, j->oreq.chat, j->req.model, j->req.stream, t0, j->req.sampling.logprobs);
    j->oreply.load_s = load_s;
    if (j->parse) {
      if (oll_reply_parse(&j->oreply, &j->tc, &err)) {
        serve_fail_set(&f, 500, "server_error", NULL, NULL, "%s", err.msg);
        goto refuse;
      }
      j->req.sampling.skip_special = !needs_specials(&j->tc);
    }
  } else if (j->responses) {
    resp_reply_init(&j->rreply, e->model_id, id_seed ^ (uint64_t)time(NULL), &j->rr);
    if (j->parse && resp_reply_parse(&j->rreply, &j->tc, &err)) {
      serve_fail_set(&f, 500, "server_error", NULL, NULL, "%s", err.msg);
      goto refuse;
    }
    if (j->parse) j->req.sampling.skip_special = !needs_specials(&j->tc);
  } else if (anth) {
    anth_reply_init(&j->areply, e->model_id, id_seed ^ (uint64_t)time(NULL), j->req.sampling.stop, j->req.sampling.n_stop);
    if (j->parse) {
      if (anth_reply_parse(&j->areply, &j->tc, &err)) {
        serve_fail_set(&f, 500, "server_error", NULL, NULL, "%s", err.msg);
        goto refuse;
      }
      j->req.sampling.skip_special = !needs_specials(&j->tc);
    }
  } else {
    int64_t created = (int64_t)time(NULL);
    for (int i = 0; i < j->nslots; i++) { /* one reply per choice, all of one id */
      serve_reply *r = j->slots[i].reply;
      serve_reply_init(r, kind, e->model_id, created, id_seed, j->req.sampling.logprobs);
      r->index = i;
      r->usage_null = j->req.stream && j->req.include_usage;
      r->one_call = j->req.one_tool_call;
      reply_hide(j, r);
      if (j->parse && serve_reply_parse(r, &j->tc, &err)) {
        serve_fail_set(&f, 500, "server_error", NULL, NULL, "%s", err.msg);
        goto refuse;
      }
    }
    if (j->parse) j->req.sampling.skip_special = !needs_specials(&j->tc);
    if (j->req.return_token_ids && reply_token_ids(j, kind, &f)) goto refuse;
    if (kind == SERVE_COMPLETION && j->req.echo && echo_setup(j, &f)) goto refuse;
  }
  j->req.sampling.trace_label = anth ? j->areply.id : j->reply.id; /* names the request in a trace */
  /* Each choice samples with the request's parameters; with a seed, copy c > 0
   * of each prompt draws from a seed of its own derived from it, so the copies
   * differ, and copy 0 keeps the request's seed (n = 1 answers as before). */
  for (int i = 0; i < j->nslots; i++) {
    slot *sl = &j->slots[i];
    sl->sampling = j->req.sampling;
    if (j->req.best_of > j->req.n) sl->sampling.logprobs = true; /* best_of ranks by them */
    if (sl->sampling.has_seed && sl->copy > 0) sl->sampling.seed = hmix64(sl->sampling.seed + (uint64_t)sl->copy * HMIX64_GAMMA);
  }
  cn->job_owned = true; /* logged and counted by job_done */
  return j->req.stream ? answer_stream(c, j) : answer_whole(c, j);
refuse:
  job_free(j);
  return send_fail_as(c, &f, NULL, proto);
}

/* A forced call (tool_choice required / named) goes on under a grammar of the
 * template's call syntax over the request's tools, so the
 * call is well formed and names a tool; none when the format has no grammar
 * or the request already constrains the output (serve/forced.h). */
static void forced_call_grammar(job *j) {
  if (j->req.gbnf || !json_is_array(j->req.tools)) return;
  hbuf g = {0};
  grammar *gr = NULL;
  if (serve_forced_grammar(j->tc.format, j->req.tools, j->req.tool_choice == SERVE_TOOLS_NAMED ? j->req.tool_name : NULL,
                        &g) &&
      !g.oom && grammar_compile(hbuf_str(&g), g.len, &gr, NULL) == 0) {
    j->req.gbnf = hbuf_take(&g);
    j->req.sampling.grammar = j->req.gbnf;
    j->forced_gbnf = true;
  }
  grammar_free(gr);
  hbuf_free(&g);
}

/* GET / DELETE /v1/responses/{id}. */
static enum MHD_Result answer_stored_response(struct MHD_Connection *c, serve_server *s, const char *id, bool del) {
  serve_fail f;
  if (del ? s->responses && resp_store_delete(s->responses, id) : false) {
    json_t *o = json_pack("{s:s, s:s, s:b}", "id", id, "object", "response", "deleted", 1);
    return send_json(c, 200, o);
  }
  json_t *o = !del && s->responses ? resp_store_get(s->responses, id, NULL) : NULL;
  if (o) return send_json(c, 200, o);
  serve_fail_set(&f, 404, "invalid_request_error", NULL, "not_found", "Response with id '%.100s' not found.", id);
  return send_fail(c, &f, NULL);
}

/* An engine failure of a prompt-only request (embeddings, signal) as the client sees it. */
static void fail_probe(int rc, const herr *err, const char *param, serve_fail *f) {
  if (err->cause == HEARTH_CAUSE_MEMORY_ADMISSION)
    serve_fail_set(f, 400, "memory_admission", param, "memory_admission", "%s", err->msg);
  else if (err->cause == HEARTH_CAUSE_CONTEXT_LENGTH || rc == HEARTH_ELIMIT)
    serve_fail_set(f, 400, "invalid_request_error", param, "context_length_exceeded", "%s", err->msg);
  else if (rc == HEARTH_EINVAL || rc == HEARTH_EFORMAT || rc == HEARTH_EUNSUPPORTED || rc == HEARTH_ENOTFOUND)
    serve_fail_set(f, 400, "invalid_request_error", param, NULL, "%s", err->msg);
  else
    serve_fail_set(f, 500, "server_error", NULL, NULL, "%s", err->msg);
}

static enum MHD_Result send_hbuf(struct MHD_Connection *c, hbuf *b) {
  enum MHD_Result rc = b->oom ? MHD_NO : send_bytes(c, 200, "application/json", hbuf_str(b), b->len, NULL);
  hbuf_free(b);
  return rc;
}

/* POST /tokenize (serve/tokenize.c parses and replies). */
static enum MHD_Result answer_tokenize(struct MHD_Connection *c, serve_server *s, conn *cn) {
  serve_engine *e = s->engine;
  tokenize_request req;
  serve_fail f;
  if (tokenize_request_parse(hbuf_str(&cn->body), cn->body.len, &req, &f)) return send_fail(c, &f, NULL);
  const char *model = req.is_chat ? req.chat.model : req.model;
  char *prompt = NULL;
  if (model && !name_served(s, model)) {
    serve_fail_set(&f, 404, "invalid_request_error", "model", "model_not_found",
                   "The model '%.200s' does not exist (this server serves '%.200s')", model, e->model_id);
  } else if (!e->tokenize || !e->detokenize) {
    serve_fail_set(&f, 400, "invalid_request_error", NULL, NULL, "The model '%.200s' does not serve /tokenize", e->model_id);
  } else if (req.is_chat && req.chat.n_media > 0) { /* an image's soft tokens exist only once it is decoded */
    serve_fail_set(&f, 400, "invalid_request_error", req.chat.media[0].name, NULL,
                   "%s: tokenizing prompts that hold media is not supported", req.chat.media[0].name);
  } else if (!req.is_chat || !render_prompt(e, &req.chat, &prompt, &f)) {
    herr err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = e->tokenize(e->impl, req.is_chat ? prompt : req.content, req.add_special, &ids, &n, &err);
    free(prompt);
    char **pieces = NULL;
    size_t *plen = NULL;
    if (!rc && req.with_pieces) {
      pieces = calloc(n ? n : 1, sizeof *pieces);
      plen = calloc(n ? n : 1, sizeof *plen);
      if (!pieces || !plen) rc = herr_set(&err, HEARTH_ENOMEM, "out of memory");
      for (size_t i = 0; i < n && !rc; i++) rc = e->detokenize(e->impl, &ids[i], 1, &pieces[i], &plen[i], &err);
    }
    hbuf b = {0};
    if (!rc) tokenize_reply(ids, n, pieces, plen, e->context_length, &b);
    for (size_t i = 0; pieces && i < n; i++) free(pieces[i]);
    free(pieces);
    free(plen);
    free(ids);
    if (!rc) {
      tokenize_request_free(&req);
      return send_hbuf(c, &b);
    }
    hbuf_free(&b);
    fail_probe(rc, &err, req.is_chat ? "messages" : req.content ? "content" : "prompt", &f);
  }
  tokenize_request_free(&req);
  return send_fail(c, &f, NULL);
}

/* POST /detokenize. */
static enum MHD_Result answer_detokenize(struct MHD_Connection *c, serve_server *s, conn *cn) {
  serve_engine *e = s->engine;
  serve_fail f;
  int32_t *ids = NULL;
  size_t n = 0;
  char *model = NULL;
  if (detokenize_request_parse(hbuf_str(&cn->body), cn->body.len, e->vocab_size, &ids, &n, &model, &f))
    return send_fail(c, &f, NULL);
  if (model && !name_served(s, model)) {
    serve_fail_set(&f, 404, "invalid_request_error", "model", "model_not_found",
                   "The model '%.200s' does not exist (this server serves '%.200s')", model, e->model_id);
  } else if (!e->detokenize) {
    serve_fail_set(&f, 400, "invalid_request_error", NULL, NULL, "The model '%.200s' does not serve /detokenize", e->model_id);
  } else {
    herr err = {0};
    char *text = NULL;
    size_t len = 0;
    int rc = e->detokenize(e->impl, ids, n, &text, &len, &err);
    if (!rc) {
      hbuf b = {0};
      detokenize_reply(text, len, &b);
      free(text), free(ids), free(model);
      return send_hbuf(c, &b);
    }
    fail_probe(rc, &err, "tokens", &f);
  }
  free(ids), free(model);
  return send_fail(c, &f, NULL);
}

/* The embeddings of req's inputs by engine e (instruction: the query instruction, NULL: none) into
 * *vecs (malloc'd: req->n rows of *dim) and the tokens read into *toks; or nonzero with f filled
 * (field: what the inputs are called, for a failure of one of them). */
static int embed_run(serve_server *s, serve_engine *e, const embed_request *req, const char *instruction, const char *field,
                     float **vecs, int *dim, int64_t *toks, serve_fail *f) {
  *vecs = NULL;
  *dim = req->dimensions ? req->dimensions : (int)e->embed_dim;
  if (!e->embed || e->embed_dim <= 0)
    return serve_fail_set(f, 400, "invalid_request_error", "model", "embeddings_unsupported",
                          "The model '%.200s' does not serve embeddings", e->model_id);
  if (req->dimensions > e->embed_dim)
    return serve_fail_set(f, 400, "invalid_request_error", "dimensions", NULL,
                          "'dimensions' is %d but the model's embeddings have %lld values", req->dimensions,
                          (long long)e->embed_dim);
  float *v = malloc(sizeof(float) * (size_t)req->n * (size_t)*dim);
  if (!v) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory for %d embeddings", req->n);
  herr err = {0};
  volatile int cancel = 0;
  bool lock = !e->thread_safe;
  if (lock) pthread_mutex_lock(&s->engine_lock);
  int rc = e->embed(e->impl, req->inputs, req->n, instruction, req->dimensions, v, toks, (volatile int *)&cancel, &err);
  if (lock) pthread_mutex_unlock(&s->engine_lock);
  bool finite = true;
  for (size_t i = 0; !rc && i < (size_t)req->n * (size_t)*dim; i++) finite = finite && isfinite(v[i]);
  if (rc || !finite) {
    free(v);
    if (rc) fail_probe(rc, &err, field, f);
    else serve_fail_set(f, 500, "server_error", NULL, NULL, "the model gave an embedding with a non-finite value");
    return 1;
  }
  *vecs = v;
  return 0;
}

/* POST /v1/embeddings (serve/embeddings.c parses and replies). */
static enum MHD_Result answer_embeddings(struct MHD_Connection *c, serve_server *s, conn *cn) {
  serve_engine *e = s->engine;
  embed_request req;
  serve_fail f;
  if (embed_request_parse(hbuf_str(&cn->body), cn->body.len, e->vocab_size, &req, &f)) return send_fail(c, &f, NULL);
  float *vecs = NULL;
  bool known = !req.model || (e = engine_named(s, req.model)) != NULL;
  if (!e) e = s->engine;
  bool held = known && e->acquire;
  if (held && hold(e, &f)) {
    embed_request_free(&req);
    return send_fail(c, &f, NULL);
  }
  int dim = 0;
  int64_t toks = 0;
  if (!known) {
    serve_fail_set(&f, 404, "invalid_request_error", "model", "model_not_found",
                   "The model '%.200s' does not exist (this server serves '%.200s')", req.model, e->model_id);
  } else if (!embed_run(s, e, &req, req.instruction, "input", &vecs, &dim, &toks, &f)) {
    hbuf b = {0};
    embed_reply(&req, vecs, dim, req.model ? req.model : e->model_id, toks, &b);
    free(vecs);
    embed_request_free(&req);
    if (held) unhold(e, -1);
    return send_hbuf(c, &b);
  }
  embed_request_free(&req);
  if (held) unhold(e, -1);
  return send_fail(c, &f, NULL);
}

/* POST /v1/signal (serve/signal.c parses and replies). */
static enum MHD_Result answer_signal(struct MHD_Connection *c, serve_server *s, conn *cn) {
  serve_engine *e = s->engine;
  signal_request req;
  serve_fail f;
  if (signal_request_parse(hbuf_str(&cn->body), cn->body.len, e->vocab_size, &req, &f)) return send_fail(c, &f, NULL);
  const char *model = req.is_chat ? req.chat.model : req.model;
  char *prompt = NULL;
  if (model && !name_served(s, model)) {
    serve_fail_set(&f, 404, "invalid_request_error", "model", "model_not_found",
                   "The model '%.200s' does not exist (this server serves '%.200s')", model, e->model_id);
  } else if (!e->signal) {
    serve_fail_set(&f, 400, "invalid_request_error", "model", "signal_unsupported", "The model '%.200s' does not serve /v1/signal",
                   e->model_id);
  } else if (!req.is_chat || !render_prompt(e, &req.chat, &prompt, &f)) {
    herr err = {0};
    serve_signal sg;
    memset(&sg, 0, sizeof sg);
    volatile int cancel = 0;
    bool lock = !e->thread_safe;
    if (lock) pthread_mutex_lock(&s->engine_lock);
    int rc = e->signal(e->impl, req.is_chat ? prompt : req.prompt, !req.is_chat, req.ids, req.n_ids, req.bins, req.top, &sg,
                       (volatile int *)&cancel, &err);
    if (lock) pthread_mutex_unlock(&s->engine_lock);
    free(prompt);
    if (!rc) {
      hbuf b = {0};
      signal_reply(&sg, model ? model : e->model_id, &b);
      serve_signal_free(&sg);
      signal_request_free(&req);
      return send_hbuf(c, &b);
    }
    serve_signal_free(&sg);
    fail_probe(rc, &err, req.is_chat ? "messages" : "prompt", &f);
  }
  signal_request_free(&req);
  return send_fail(c, &f, NULL);
}

/* GET /v1/adapters (the list) and POST /v1/adapters (load one; serve/adapters.c parses and shapes). */
static enum MHD_Result answer_adapters(struct MHD_Connection *c, serve_server *s, conn *cn) {
  serve_engine *e = s->engine;
  serve_fail f;
  if (!e->adapter_list) {
    serve_fail_set(&f, 400, "invalid_request_error", NULL, "adapters_unsupported", "The model '%.200s' takes no LoRA adapters",
                   e->model_id);
    return send_fail(c, &f, NULL);
  }
  if (!cn->post) {
    int n = e->adapter_list(e->impl, NULL, 0);
    hearth_adapter_info *a = calloc((size_t)(n > 0 ? n : 1), sizeof *a);
    if (!a) return MHD_NO;
    n = e->adapter_list(e->impl, a, n);
    json_t *o = adapters_list_json(a, n);
    free(a);
    return send_json(c, 200, o);
  }
  char *name = NULL, *asked = NULL, *path = NULL;
  if (adapters_parse_load(hbuf_str(&cn->body), cn->body.len, &name, &asked, &f)) return send_fail(c, &f, NULL);
  int refused = adapters_resolve(s->adapter_dir, asked, &path, &f);
  free(asked);
  if (refused) {
    free(name);
    return send_fail(c, &f, NULL);
  }
  herr err = {0};
  int rc = e->adapter_load(e->impl, name, path, &err);
  enum MHD_Result r;
  if (rc) {
    if (rc == HEARTH_EINVAL || rc == HEARTH_EFORMAT || rc == HEARTH_EUNSUPPORTED || rc == HEARTH_ENOTFOUND || rc == HEARTH_EIO)
      serve_fail_set(&f, 400, "invalid_request_error", err.field[0] ? err.field : "path", NULL, "%s", err.msg);
    else
      serve_fail_set(&f, 500, "server_error", NULL, NULL, "%s", err.msg);
    r = send_fail(c, &f, NULL);
  } else {
    hearth_adapter_info info;
    memset(&info, 0, sizeof info);
    int n = e->adapter_list(e->impl, NULL, 0);
    hearth_adapter_info *a = calloc((size_t)(n > 0 ? n : 1), sizeof *a);
    if (a) n = e->adapter_list(e->impl, a, n);
    for (int i = 0; a && i < n; i++)
      if (!strcmp(a[i].name, name)) info = a[i];
    free(a);
    if (!info.name[0]) snprintf(info.name, sizeof info.name, "%s", name);
    r = send_json(c, 200, adapters_one_json(&info));
  }
  free(name), free(path);
  return r;
}

/* DELETE /v1/adapters/{id}: unloaded at once for new requests; running ones keep it to their end. */
static enum MHD_Result answer_adapter_delete(struct MHD_Connection *c, serve_server *s, const char *id) {
  serve_engine *e = s->engine;
  serve_fail f;
  herr err = {0};
  int in_use = 0;
  if (e->adapter_list) {
    int n = e->adapter_list(e->impl, NULL, 0);
    hearth_adapter_info *a = calloc((size_t)(n > 0 ? n : 1), sizeof *a);
    if (a) n = e->adapter_list(e->impl, a, n);
    for (int i = 0; a && i < n; i++)
      if (!strcmp(a[i].name, id)) in_use = a[i].in_use;
    free(a);
  }
  if (!e->adapter_unload || e->adapter_unload(e->impl, id, &err)) {
    serve_fail_set(&f, 404, "invalid_request_error", NULL, "not_found", "No adapter named '%.100s' is loaded", id);
    return send_fail(c, &f, NULL);
  }
  json_t *o = json_pack("{s:s, s:s, s:b, s:i}", "id", id, "object", "adapter", "deleted", 1, "in_use", in_use);
  return send_json(c, 200, o);
}

/* POST /v1/messages/count_tokens: the rendered prompt's token count. */
static enum MHD_Result answer_count_tokens(struct MHD_Connection *c, serve_server *s, conn *cn) {
  serve_engine *e = s->engine;
  serve_request req;
  serve_fail f;
  if (anth_request_parse(hbuf_str(&cn->body), cn->body.len, true, &req, &f)) return send_fail_as(c, &f, NULL, true);
  if (model_unknown(s, &req, PROTO_ANTHROPIC, &e, &f) || hold(e, &f)) {
    serve_request_free(&req);
    return send_fail_as(c, &f, NULL, true);
  }
  char *prompt = NULL;
  herr err = {0};
  int64_t n = 0;
  enum MHD_Result rc;
  if (req.n_media > 0) { /* an image's soft tokens are known only once it is decoded and prepared */
    serve_fail_set(&f, 400, "invalid_request_error", req.media[0].name, NULL,
                   "%s: token counts of prompts holding %s input are not supported", req.media[0].name,
                   kind_word(req.media[0].kind));
    rc = send_fail_as(c, &f, NULL, true);
  } else if (render_prompt(e, &req, &prompt, &f)) {
    rc = send_fail_as(c, &f, NULL, true);
  } else if (e->count_tokens(e->impl, prompt, false, &n, &err)) {
    serve_fail_set(&f, 400, "invalid_request_error", "messages", NULL, "%s", err.msg);
    rc = send_fail_as(c, &f, NULL, true);
  } else {
    hbuf b = {0};
    anth_count_body(n, &b);
    rc = b.oom ? MHD_NO : send_bytes(c, 200, "application/json", hbuf_str(&b), b.len, NULL);
    hbuf_free(&b);
  }
  unhold(e, -1);
  free(prompt);
  serve_request_free(&req);
  return rc;
}

/* ---- the Ollama API (serve/ollama.c formats) ---- */

/* Served model k's facts (the caller's, else its name alone): a new reference. */
static json_t *served_facts(const serve_server *s, int k) {
  const json_t *given = s->models && s->models->served ? json_array_get(s->models->served, (size_t)k) : NULL;
  json_t *f = json_is_object(given) ? json_deep_copy(given) : json_object();
  json_object_set_new(f, "name", json_string(s->engines[k]->model_id));
  if (!json_object_get(f, "modified")) json_object_set_new(f, "modified", json_integer(s->engines[k]->created));
  return f;
}

/* Every model hearth can name, the served ones first (a new array of facts). */
static json_t *all_facts(const serve_server *s) {
  json_t *all = json_array(), *more = s->models && s->models->list ? s->models->list(s->models->ctx) : NULL;
  for (int k = 0; k < s->nengines; k++) json_array_append_new(all, served_facts(s, k));
  size_t i;
  json_t *m;
  json_array_foreach(more, i, m) {
    const char *name = json_string_value(json_object_get(m, "name"));
    bool served = false;
    for (int k = 0; name && k < s->nengines; k++) served = served || !strcmp(name, s->engines[k]->model_id);
    if (name && !served) json_array_append(all, m);
  }
  json_decref(more);
  return all;
}

/* A body's "model" (or "name", as older clients send it); NULL with f filled when absent. */
static json_t *oll_body(conn *cn, const char **name, serve_fail *f) {
  json_error_t je;
  json_t *root = json_loadb(hbuf_str(&cn->body), cn->body.len, 0, &je);
  if (!json_is_object(root)) {
    json_decref(root);
    serve_bad(f, NULL, "the body must be a JSON object (%s)", root ? "not an object" : je.text);
    return NULL;
  }
  json_t *m = json_object_get(root, "model");
  if (!json_is_string(m)) m = json_object_get(root, "name");
  if (!json_is_string(m) || !json_string_length(m)) {
    json_decref(root);
    serve_bad(f, "model", "model is required");
    return NULL;
  }
  *name = json_string_value(m);
  return root;
}

static enum MHD_Result send_oll_fail(struct MHD_Connection *c, const serve_fail *f) {
  return send_fail_as(c, f, NULL, PROTO_OLLAMA);
}

static enum MHD_Result answer_oll_version(struct MHD_Connection *c) {
  return send_json(c, 200, json_pack("{s:s, s:s}", "version", OLL_API_VERSION, "hearth", HEARTH_VERSION));
}

static enum MHD_Result answer_oll_tags(struct MHD_Connection *c, serve_server *s) {
  json_t *all = all_facts(s), *models = json_array(), *m;
  size_t i;
  json_array_foreach(all, i, m)
    json_array_append_new(models, oll_model_object(m, json_string_value(json_object_get(m, "name")), false, 0));
  json_decref(all);
  return send_json(c, 200, json_pack("{s:o}", "models", models));
}

static enum MHD_Result answer_oll_ps(struct MHD_Connection *c, serve_server *s) {
  json_t *models = json_array();
  for (int k = 0; k < s->nengines; k++) {
    if (s->engines[k]->is_loaded && !s->engines[k]->is_loaded(s->engines[k]->impl)) continue;
    json_t *f = served_facts(s, k);
    json_array_append_new(models, oll_model_object(f, s->engines[k]->model_id, true, s->engines[k]->context_length));
    json_decref(f);
  }
  return send_json(c, 200, json_pack("{s:o}", "models", models));
}

static enum MHD_Result answer_oll_show(struct MHD_Connection *c, serve_server *s, conn *cn) {
  serve_fail f;
  const char *name;
  json_t *root = oll_body(cn, &name, &f), *o = NULL;
  if (!root) return send_oll_fail(c, &f);
  serve_engine *e = engine_named(s, name);
  for (int k = 0; e && k < s->nengines; k++)
    if (s->engines[k] == e) {
      json_t *facts = served_facts(s, k);
      o = oll_show_object(facts, e);
      json_decref(facts);
    }
  if (!e) {
    json_t *all = all_facts(s), *m;
    size_t i;
    json_array_foreach(all, i, m) if (!o && !strcmp(json_string_value(json_object_get(m, "name")), name)) o =
        oll_show_object(m, NULL);
    json_decref(all);
  }
  if (!o) serve_fail_set(&f, 404, "invalid_request_error", "model", "model_not_found", "model '%.200s' not found", name);
  json_decref(root);
  return o ? send_json(c, 200, o) : send_oll_fail(c, &f);
}

/* POST /api/embed and /api/embeddings (legacy). */
static enum MHD_Result answer_oll_embed(struct MHD_Connection *c, serve_server *s, conn *cn, bool legacy) {
  serve_engine *e = s->engine;
  double t0 = oll_now();
  embed_request req;
  serve_fail f;
  if (oll_embed_parse(hbuf_str(&cn->body), cn->body.len, legacy, e->vocab_size, &req, &f)) return send_oll_fail(c, &f);
  float *vecs = NULL;
  bool known = (e = engine_named(s, req.model)) != NULL;
  if (!e) e = s->engine;
  bool held = known && e->acquire;
  if (held && hold(e, &f)) {
    embed_request_free(&req);
    return send_oll_fail(c, &f);
  }
  int dim = 0;
  int64_t toks = 0;
  if (!known) {
    serve_fail_set(&f, 404, "invalid_request_error", "model", "model_not_found", "model '%.200s' not found", req.model);
  } else if (!embed_run(s, e, &req, NULL, legacy ? "prompt" : "input", &vecs, &dim, &toks, &f)) {
    hbuf b = {0};
    oll_embed_reply(&req, legacy, vecs, dim, req.model, toks, oll_now() - t0, &b);
    free(vecs);
    embed_request_free(&req);
    if (held) unhold(e, -1);
    return send_hbuf(c, &b);
  }
  embed_request_free(&req);
  if (held) unhold(e, -1);
  return send_oll_fail(c, &f);
}

/* DELETE /api/delete {"model"}: as `hearth rm`. */
static enum MHD_Result answer_oll_delete(struct MHD_Connection *c, serve_server *s, conn *cn) {
  serve_fail f;
  const char *name;
  json_t *root = oll_body(cn, &name, &f);
  if (!root) return send_oll_fail(c, &f);
  herr err = {0};
  if (!s->models || !s->models->remove)
    serve_fail_set(&f, 400, "invalid_request_error", NULL, NULL, "this server removes no models (it has no model registry)");
  else if (engine_named(s, name) && strcmp(name, "*"))
    serve_fail_set(&f, 400, "invalid_request_error", "model", NULL,
                   "model '%.200s' is the one being served: stop the server to remove it", name);
  else if (s->models->remove(s->models->ctx, name, &err))
    serve_fail_set(&f, err.code == HEARTH_ENOTFOUND ? 404 : 500, "invalid_request_error", "model", NULL, "%s", err.msg);
  else {
    HLOG_INFO("serve: api/delete: %s removed", name);
    json_decref(root);
    return send_bytes(c, 200, "application/json", "", 0, NULL);
  }
  json_decref(root);
  return send_oll_fail(c, &f);
}

/* A pull's progress: each line hearth get writes becomes {"status": line}. */
typedef struct pull_sink {
  job *j;
  hbuf line;
} pull_sink;

static ssize_t pull_write(void *cookie, const char *buf, size_t n) {
  pull_sink *p = cookie;
  for (size_t i = 0; i < n; i++) {
    if (buf[i] != '\n' && buf[i] != '\r') {
      hbuf_append(&p->line, buf + i, 1);
      continue;
    }
    if (!p->line.len) continue;
    if (p->j) {
      hbuf b = {0};
      json_t *o = json_pack("{s:o}", "status", serve_json_text(p->line.data, p->line.len));
      char *t = json_dumps(o, JSON_COMPACT);
      json_decref(o);
      if (t) hbuf_puts(&b, t), hbuf_puts(&b, "\n");
      free(t);
      stream_push(p->j, &b, false);
      hbuf_free(&b);
    }
    hbuf_clear(&p->line);
  }
  return (ssize_t)n;
}

/* Runs the pull, its progress to j's stream when j is streamed (else nowhere). 0 or the failure in f. */
static int run_pull(serve_server *s, const char *name, job *j, serve_fail *f) {
  pull_sink sink = {.j = j};
  cookie_io_functions_t io = {.write = pull_write};
  FILE *progress = fopencookie(&sink, "w", io);
  if (progress) setvbuf(progress, NULL, _IONBF, 0);
  herr err = {0};
  int rc = s->models->pull(s->models->ctx, name, progress, &err);
  if (progress) {
    fputc('\n', progress);
    fclose(progress);
  }
  hbuf_free(&sink.line);
  if (rc) serve_fail_set(f, err.code == HEARTH_ENOTFOUND || err.code == HEARTH_EINVAL ? 400 : 500, "invalid_request_error",
                         "model", NULL, "pull %.200s: %s", name, err.msg);
  else HLOG_INFO("serve: api/pull: %s fetched", name);
  return rc;
}

/* The stream of an /api/pull job (stream_main's, on its own thread). */
static void pull_main(job *j) {
  hbuf b = {0};
  serve_fail f;
  hbuf_puts(&b, "{\"status\":\"pulling manifest\"}\n");
  stream_push(j, &b, false);
  hbuf_clear(&b);
  if (run_pull(j->srv, j->pull_name, j, &f)) oll_error_line(&f, &b);
  else hbuf_puts(&b, "{\"status\":\"success\"}\n");
  pthread_mutex_lock(&j->mu);
  j->pull_running = false;
  bool orphan = j->pull_orphan;
  pthread_mutex_unlock(&j->mu);
  if (orphan) { /* its client went away and MHD let go of the stream: the job is this thread's */
    hbuf_free(&b);
    job_free(j);
    return;
  }
  stream_push(j, &b, true);
  hbuf_free(&b);
}

/* POST /api/pull {"model", "stream"}: as `hearth get`, progress streamed as NDJSON. */
static enum MHD_Result answer_oll_pull(struct MHD_Connection *c, serve_server *s, conn *cn) {
  serve_fail f;
  const char *name;
  json_t *root = oll_body(cn, &name, &f);
  if (!root) return send_oll_fail(c, &f);
  json_t *st = json_object_get(root, "stream"), *insecure = json_object_get(root, "insecure");
  enum MHD_Result rc;
  if (st && !json_is_boolean(st) && !json_is_null(st)) {
    serve_bad(&f, "stream", "stream must be a boolean");
    rc = send_oll_fail(c, &f);
  } else if (json_is_true(insecure)) {
    serve_bad(&f, "insecure", "insecure is not supported by hearth: the Hub is fetched over HTTPS only");
    rc = send_oll_fail(c, &f);
  } else if (!s->models || !s->models->pull) {
    serve_bad(&f, NULL, "this server fetches no models (it was started without the model hub)");
    rc = send_oll_fail(c, &f);
  } else if (json_is_false(st)) {
    rc = run_pull(s, name, NULL, &f) ? send_oll_fail(c, &f) : send_json(c, 200, json_pack("{s:s}", "status", "success"));
  } else {
    job *j = calloc(1, sizeof *j);
    if (!j || !(j->pull_name = strdup(name))) {
      free(j);
      serve_fail_set(&f, 500, "server_error", NULL, NULL, "out of memory");
      rc = send_oll_fail(c, &f);
    } else {
      pthread_mutex_init(&j->mu, NULL);
      pthread_mutex_init(&j->gen_mu, NULL);
      pthread_cond_init(&j->gen_cv, NULL);
      j->srv = s;
      j->ollama = true;
      j->fd = conn_fd(c);
      j->pull_running = true;
      rc = answer_stream(c, j);
    }
  }
  json_decref(root);
  return rc;
}

/* POST /v1/models/load and /v1/models/unload {"model"}: a model loaded on first use, now. */
static enum MHD_Result answer_model_load(struct MHD_Connection *c, serve_server *s, conn *cn, bool load) {
  serve_fail f;
  json_error_t je;
  json_t *root = json_loadb(hbuf_str(&cn->body), cn->body.len, 0, &je);
  const char *name = json_string_value(json_object_get(root, "model"));
  serve_engine *e = name ? engine_named(s, name) : NULL;
  enum MHD_Result rc;
  if (!json_is_object(root)) {
    serve_bad(&f, NULL, "the body must be a JSON object {\"model\": NAME}%s%s", root ? "" : ": ", root ? "" : je.text);
    rc = send_fail(c, &f, NULL);
  } else if (!name) {
    serve_bad(&f, "model", "'model' is required");
    rc = send_fail(c, &f, NULL);
  } else if (!e) {
    serve_fail_set(&f, 404, "invalid_request_error", "model", "model_not_found", "The model '%.200s' does not exist", name);
    rc = send_fail(c, &f, NULL);
  } else if (!load && !e->unload) {
    serve_bad(&f, "model", "model '%.200s' stays loaded: only models loaded on first use (--model-memory, --model-ttl, "
                           "--models-dir, after the first) unload", e->model_id);
    rc = send_fail(c, &f, NULL);
  } else if (load && hold(e, &f)) {
    rc = send_fail(c, &f, NULL);
  } else {
    if (load) unhold(e, -1);
    else e->unload(e->impl);
    rc = send_json(c, 200, model_object(e, e->model_id));
  }
  json_decref(root);
  return rc;
}

/* /api/create, /api/copy, /api/push, /api/blobs: named and refused, each with what hearth does instead. */
static enum MHD_Result answer_oll_refused(struct MHD_Connection *c, conn *cn) {
  serve_fail f;
  const char *p = cn->path + 5;
  const char *why = !strcmp(p, "create") ? "hearth makes no models from Modelfiles: hearth get ORG/NAME fetches one, "
                                           "hearth scan DIR registers folders and GGUF files, --chat-template-file "
                                           "replaces a template"
                    : !strcmp(p, "copy") ? "hearth names a model by its Hub id or its registry name (hearth scan); "
                                           "--served-model-name gives the served one more names"
                    : !strcmp(p, "push") ? "hearth pushes models to no registry"
                                         : "hearth takes no Modelfile blobs";
  serve_fail_set(&f, 400, "invalid_request_error", NULL, NULL, "/api/%.40s is not supported: %s", p, why);
  return send_oll_fail(c, &f);
}

/* ---- the Batch API (files.h, batches.h) ---- */

/* The {id} of a path matched by route_matches, into out. */
static void route_id(const conn *cn, const char *prefix, const char *suffix, char *out, size_t cap) {
  size_t pre = strlen(prefix), len = strlen(cn->path), suf = suffix ? strlen(suffix) : 0;
  size_t n = len > pre + suf ? len - pre - suf : 0;
  snprintf(out, cap, "%.*s", (int)n, cn->path + pre);
}

/* ?name=N as an integer in [lo, hi] (absent: def); 400 with f filled otherwise. */
static int query_int(struct MHD_Connection *c, const char *name, int64_t def, int64_t *out, serve_fail *f) {
  const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
  *out = def;
  if (!v) return 0;
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (!*v || *end || errno) return serve_bad(f, name, "'%s' is '%.40s'; it must be an integer", name, v);
  *out = x;
  return 0;
}

static enum MHD_Result answer_batch_api(struct MHD_Connection *c, serve_server *s, conn *cn) {
  serve_fail f;
  json_t *o = NULL;
  int st = 0;
  char id[256];
  if (!s->files || !s->batches) {
    serve_fail_set(&f, 400, "invalid_request_error", NULL, "batch_api_disabled",
                   "The Batch API keeps its files and batches on disk: start hearth serve with --state-dir DIR");
    return send_fail(c, &f, NULL);
  }
  int64_t limit;
  const char *after = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after");
  switch (cn->route) {
  case ROUTE_FILES:
    if (cn->post) {
      const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
      st = file_store_upload(s->files, ct, hbuf_str(&cn->body), cn->body.len, &o, &f);
    } else {
      const char *order = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order");
      if (order && strcmp(order, "asc") && strcmp(order, "desc"))
        st = serve_bad(&f, "order", "'order' is '%.40s'; it must be \"asc\" or \"desc\"", order);
      else if (!(st = query_int(c, "limit", 10000, &limit, &f)))
        st = file_store_list(s->files, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "purpose"), after, limit,
                             order && !strcmp(order, "asc"), &o, &f);
    }
    break;
  case ROUTE_FILE:
    route_id(cn, "/v1/files/", NULL, id, sizeof id);
    st = cn->del ? file_store_delete(s->files, id, &o, &f) : file_store_get(s->files, id, &o, &f);
    break;
  case ROUTE_FILE_CONTENT: {
    route_id(cn, "/v1/files/", "/content", id, sizeof id);
    char *data = NULL;
    size_t len = 0;
    if ((st = file_store_read(s->files, id, &data, &len, &f)) != 200) break;
    enum MHD_Result rc = send_bytes(c, 200, "application/octet-stream", data, len, NULL);
    free(data);
    return rc;
  }
  case ROUTE_BATCHES:
    if (cn->post) st = batch_store_create(s->batches, hbuf_str(&cn->body), cn->body.len, &o, &f);
    else if (!(st = query_int(c, "limit", 20, &limit, &f))) st = batch_store_list(s->batches, after, limit, &o, &f);
    break;
  case ROUTE_BATCH:
    route_id(cn, "/v1/batches/", NULL, id, sizeof id);
    st = batch_store_get(s->batches, id, &o, &f);
    break;
  case ROUTE_BATCH_CANCEL:
    route_id(cn, "/v1/batches/", "/cancel", id, sizeof id);
    st = batch_store_cancel(s->batches, id, &o, &f);
    break;
  default:
    return MHD_NO;
  }
  if (st == 200 && o) return send_json(c, 200, o);
  json_decref(o);
  if (st == 200) serve_fail_set(&f, 500, "server_error", NULL, NULL, "out of memory");
  return send_fail(c, &f, NULL);
}

/* ---- the request cycle ---- */

/* The key from "Authorization: Bearer KEY" or (Anthropic's clients) "x-api-key: KEY". */
static bool key_ok(serve_server *s, struct MHD_Connection *c) {
  if (!s->api_key) return true;
  const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
  const char *key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
  if (auth && strncasecmp(auth, "Bearer ", 7) == 0) {
    key = auth + 7;
    while (*key == ' ') key++;
  }
  if (!key) return false;
  size_t a = strlen(key), b = strlen(s->api_key);
  unsigned char diff = a != b;
  for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned char)(key[i] ^ s->api_key[i]);
  return diff == 0;
}

/* The one route table: what classify matches (path, method, key), what GET
 * /v1 lists, and the route on_request answers. A path ending in "/{id}"
 * matches its prefix followed by a non-empty rest. */
typedef struct route_def {
  const char *method;
  const char *path;
  route r;
  bool open; /* answered without an API key */
  const char *what;
} route_def;

static const route_def routes[] = {
    {"GET", "/", ROUTE_PAGE, true, "the chat page"},
    {"GET", "/health", ROUTE_HEALTH, true, "liveness"},
    {"GET", "/v1", ROUTE_INDEX, false, "this index"},
    {"GET", "/v1/models", ROUTE_MODELS, false, "the loaded model"},
    {"GET", "/v1/models/{id}", ROUTE_MODEL, false, "one served model name"},
    {"POST", "/v1/models/load", ROUTE_MODEL_LOAD, false,
     "loads a model loaded on first use now: {\"model\"} (waits for it; the model object with its state)"},
    {"POST", "/v1/models/unload", ROUTE_MODEL_UNLOAD, false,
     "unloads a model loaded on first use: {\"model\"} (now when idle, else once its requests are done)"},
    {"POST", "/v1/chat/completions", ROUTE_CHAT, false, "chat completions (JSON or SSE with stream: true)"},
    {"POST", "/v1/completions", ROUTE_COMPLETIONS, false, "text completions (JSON or SSE with stream: true)"},
    {"POST", "/v1/responses", ROUTE_RESPONSES, false,
     "OpenAI Responses API (JSON or SSE with stream: true; previous_response_id)"},
    {"GET", "/v1/responses/{id}", ROUTE_RESPONSE, false, "a stored response"},
    {"DELETE", "/v1/responses/{id}", ROUTE_RESPONSE, false, "deletes a stored response"},
    {"POST", "/v1/messages", ROUTE_MESSAGES, false, "Anthropic Messages API (JSON or SSE with stream: true)"},
    {"POST", "/v1/messages/count_tokens", ROUTE_COUNT_TOKENS, false, "Anthropic token count of a Messages request"},
    {"POST", "/v1/embeddings", ROUTE_EMBEDDINGS, false,
     "embeddings: the last token's final hidden state, L2-normalised (float or base64)"},
    {"POST", "/v1/signal", ROUTE_SIGNAL, false, "the next token's log-probability histogram, entropy and best tokens"},
    {"GET", "/v1/adapters", ROUTE_ADAPTERS, false, "the loaded LoRA adapters (a request picks one with \"adapter\")"},
    {"POST", "/v1/adapters", ROUTE_ADAPTERS, false, "loads a PEFT LoRA adapter folder: {\"name\", \"path\"}"},
    {"DELETE", "/v1/adapters/{id}", ROUTE_ADAPTER, false,
     "unloads an adapter (requests running under it finish first; its memory is freed after the last)"},
    {"GET", "/stats", ROUTE_STATS, false, "serving counters as JSON (requests, KV blocks, prefix cache, tokens/s)"},
    {"GET", "/metrics", ROUTE_METRICS, false, "serving counters in the Prometheus text format"},
    {"POST", "/infill", ROUTE_INFILL, false,
     "fill-in-the-middle as llama.cpp's (input_prefix, input_suffix, input_extra, prompt; models with FIM tokens)"},
    {"GET", "/fit", ROUTE_FIT, false,
     "the served model's memory contract: weights, KV bytes per token, fit, largest context, predicted tok/s "
     "(?ctx=N&batch=B)"},
    {"POST", "/tokenize", ROUTE_TOKENIZE, false,
     "text to token ids: {\"content\" (or \"prompt\", or chat \"messages\"), \"add_special\", \"with_pieces\"}"},
    {"POST", "/detokenize", ROUTE_DETOKENIZE, false, "token ids to text: {\"tokens\": [ids]}"},
    {"GET", "/api/version", ROUTE_OLL_VERSION, false, "Ollama API: the API version"},
    {"GET", "/api/tags", ROUTE_OLL_TAGS, false, "Ollama API: the models hearth can name (the served one first)"},
    {"POST", "/api/show", ROUTE_OLL_SHOW, false, "Ollama API: a model's details and capabilities"},
    {"GET", "/api/ps", ROUTE_OLL_PS, false, "Ollama API: the loaded model"},
    {"POST", "/api/chat", ROUTE_OLL_CHAT, false, "Ollama API: chat (NDJSON stream unless stream: false)"},
    {"POST", "/api/generate", ROUTE_OLL_GENERATE, false, "Ollama API: generate (NDJSON stream unless stream: false)"},
    {"POST", "/api/embed", ROUTE_OLL_EMBED, false, "Ollama API: embeddings of input"},
    {"POST", "/api/embeddings", ROUTE_OLL_EMBEDDINGS, false, "Ollama API: the embedding of prompt (legacy)"},
    {"POST", "/api/pull", ROUTE_OLL_PULL, false, "Ollama API: fetches a model as hearth get (progress as NDJSON)"},
    {"DELETE", "/api/delete", ROUTE_OLL_DELETE, false, "Ollama API: removes a model as hearth rm"},
    {"POST", "/api/create", ROUTE_OLL_REFUSED, false, "Ollama API: refused (hearth makes no models from Modelfiles)"},
    {"POST", "/api/copy", ROUTE_OLL_REFUSED, false, "Ollama API: refused (hearth scan names models)"},
    {"POST", "/api/push", ROUTE_OLL_REFUSED, false, "Ollama API: refused (hearth pushes to no registry)"},
    {"POST", "/api/blobs/{id}", ROUTE_OLL_REFUSED, false, "Ollama API: refused (no Modelfile blobs)"},
    {"GET", "/api/blobs/{id}", ROUTE_OLL_REFUSED, false, "Ollama API: refused (no Modelfile blobs)"},
    {"POST", "/v1/files", ROUTE_FILES, false,
     "uploads a Batch API input file: multipart/form-data with purpose \"batch\" and the JSONL file (--state-dir)"},
    {"GET", "/v1/files", ROUTE_FILES, false, "the stored files, newest first (?purpose, ?after, ?limit, ?order)"},
    {"GET", "/v1/files/{id}/content", ROUTE_FILE_CONTENT, false, "a file's content"},
    {"GET", "/v1/files/{id}", ROUTE_FILE, false, "a file object"},
    {"DELETE", "/v1/files/{id}", ROUTE_FILE, false, "deletes a file"},
    {"POST", "/v1/batches", ROUTE_BATCHES, false,
     "creates a batch: {\"input_file_id\", \"endpoint\", \"completion_window\": \"24h\", \"metadata\"}; its rows run "
     "at low priority"},
    {"GET", "/v1/batches", ROUTE_BATCHES, false, "the batches, newest first (?after, ?limit)"},
    {"POST", "/v1/batches/{id}/cancel", ROUTE_BATCH_CANCEL, false, "cancels a batch (rows answered so far are kept)"},
    {"GET", "/v1/batches/{id}", ROUTE_BATCH, false, "a batch object"},
};

/* "{id}" inside a path ("/v1/batches/{id}/cancel") matches one segment. */
static bool route_matches(const route_def *r, const char *path) {
  size_t n = strlen(r->path);
  if (n > 5 && !strcmp(r->path + n - 5, "/{id}")) return !strncmp(path, r->path, n - 4) && path[n - 4];
  const char *at = strstr(r->path, "/{id}/");
  if (at) {
    size_t pre = (size_t)(at - r->path) + 1, suf = strlen(at + 5), len = strlen(path);
    if (len <= pre + suf || strncmp(path, r->path, pre) != 0 || strcmp(path + len - suf, at + 5) != 0) return false;
    const char *slash = memchr(path + pre, '/', len - pre - suf);
    return slash == NULL;
  }
  return !strcmp(path, r->path);
}

static json_t *route_index(void) {
  json_t *data = json_array();
  for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
    json_array_append_new(data, json_pack("{s:s, s:s, s:s}", "method", routes[i].method, "path", routes[i].path,
                                          "description", routes[i].what));
  return data;
}

/* Decides on the first call, before any body: route, method, key, size. */
static void classify(serve_server *s, struct MHD_Connection *c, const char *url, const char *method, conn *cn) {
  char *path = cn->path;
  cn->t_start = mono_seconds();
  snprintf(cn->method, sizeof cn->method, "%s", method);
  snprintf(cn->path, sizeof cn->path, "%s", url);
  size_t n = strlen(path);
  if (n > 1 && path[n - 1] == '/') path[n - 1] = 0;
  cn->head = strcmp(method, "HEAD") == 0;
  cn->anthropic = strcmp(path, "/v1/messages") == 0 || strncmp(path, "/v1/messages/", 13) == 0;
  cn->ollama = strncmp(path, "/api/", 5) == 0;
  /* /v1/models asked by an Anthropic client (which always sends anthropic-version): its shapes */
  if ((strcmp(path, "/v1/models") == 0 || strncmp(path, "/v1/models/", 11) == 0) &&
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "anthropic-version"))
    cn->anthropic = true;
  if (atomic_load(&s->draining)) {
    cn->failed = true;
    serve_fail_set(&cn->fail, 503, "server_error", NULL, "shutting_down",
                   "The server is shutting down and takes no new requests; retry on another instance or later");
    return;
  }
  const char *m = cn->head ? "GET" : method;
  const route_def *rt = NULL;
  char allow[64] = "";
  for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
    if (!route_matches(&routes[i], path)) continue;
    if (!strcmp(m, routes[i].method)) {
      rt = &routes[i];
      break;
    }
    size_t n = strlen(allow);
    snprintf(allow + n, sizeof allow - n, "%s%s", n ? ", " : "", routes[i].method);
  }
  if (!rt && allow[0]) {
    cn->failed = true;
    snprintf(cn->allow_buf, sizeof cn->allow_buf, "%s", allow);
    cn->allow = cn->allow_buf;
    serve_fail_set(&cn->fail, 405, "invalid_request_error", NULL, "method_not_allowed", "%s is not allowed on %s (use %s)",
                   method, path, allow);
    return;
  }
  if (!rt) {
    cn->failed = true;
    serve_fail_set(&cn->fail, 404, "invalid_request_error", NULL, "not_found", "Unknown route: %s %.300s", method,
                   url);
    return;
  }
  bool open = rt->open;
  cn->route = rt->r;
  cn->route_path = rt->path;
  cn->del = !strcmp(m, "DELETE");
  cn->post = !strcmp(m, "POST");
  if (!open && !key_ok(s, c)) {
    cn->failed = true;
    serve_fail_set(&cn->fail, 401, "authentication_error", NULL, "invalid_api_key",
                   "Missing or incorrect API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'");
    return;
  }
  const char *prio = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Hearth-Priority");
  if (prio && strcasecmp(prio, "low") && strcasecmp(prio, "normal")) {
    cn->failed = true;
    serve_fail_set(&cn->fail, 400, "invalid_request_error", NULL, "invalid_priority",
                   "X-Hearth-Priority '%.40s' is not one of \"normal\" and \"low\"", prio);
    return;
  }
  cn->priority = prio && !strcasecmp(prio, "low") ? 1 : 0;
  cn->max_body = s->max_body;
  if (cn->route == ROUTE_FILES && cn->post && s->files) /* the file, and the form around it */
    cn->max_body = file_store_max_bytes(s->files) + ((size_t)64 << 10);
  const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
  if (cl) {
    /* digits only: strtoull would take "-1" as 2^64 - 1 and "abc" as 0 */
    bool digits = *cl != 0 && strspn(cl, "0123456789") == strlen(cl);
    errno = 0;
    unsigned long long v = digits ? strtoull(cl, NULL, 10) : 0;
    if (!digits || errno == ERANGE) {
      cn->failed = true;
      serve_fail_set(&cn->fail, 400, "invalid_request_error", NULL, "invalid_content_length",
                     "Content-Length '%.40s' is not a byte count", cl);
    } else if (v > cn->max_body && cn->route == ROUTE_FILES && s->files) {
      cn->failed = true;
      serve_fail_set(&cn->fail, 413, "invalid_request_error", "file", "file_too_large",
                     "The upload has %llu bytes; a file may have %zu (hearth serve --max-file-size)", v,
                     file_store_max_bytes(s->files));
    } else if (v > cn->max_body) {
      cn->failed = true;
      serve_fail_set(&cn->fail, 413, "invalid_request_error", NULL, "request_too_large",
                     "The request body has %llu bytes; the limit is %zu", v, s->max_body);
    }
  }
}

/* Answers a whole request (its body is in cn->body). */
static enum MHD_Result answer_route(struct MHD_Connection *c, serve_server *s, conn *cn) {
  switch (cn->route) {
  case ROUTE_PAGE:
    return send_bytes(c, 200, "text/html; charset=utf-8", serve_page_html, serve_page_html_len, NULL);
  case ROUTE_HEALTH:
    return answer_health(c, s);
  case ROUTE_INDEX:
    return answer_index(c, s);
  case ROUTE_MODELS:
    return answer_models(c, s, cn->anthropic);
  case ROUTE_MODEL:
    return answer_model(c, s, cn->path + 11, cn->anthropic);
  case ROUTE_MODEL_LOAD:
  case ROUTE_MODEL_UNLOAD:
    return answer_model_load(c, s, cn, cn->route == ROUTE_MODEL_LOAD);
  case ROUTE_STATS:
    return answer_stats(c, s);
  case ROUTE_METRICS:
    return answer_metrics(c, s);
  case ROUTE_FIT:
    return answer_fit(c, s);
  case ROUTE_CHAT:
  case ROUTE_COMPLETIONS:
  case ROUTE_MESSAGES:
  case ROUTE_RESPONSES:
  case ROUTE_INFILL:
    return answer_generate(c, s, cn);
  case ROUTE_RESPONSE:
    return answer_stored_response(c, s, cn->path + 14, cn->del);
  case ROUTE_COUNT_TOKENS:
    return answer_count_tokens(c, s, cn);
  case ROUTE_EMBEDDINGS:
    return answer_embeddings(c, s, cn);
  case ROUTE_SIGNAL:
    return answer_signal(c, s, cn);
  case ROUTE_ADAPTERS:
    return answer_adapters(c, s, cn);
  case ROUTE_ADAPTER:
    return answer_adapter_delete(c, s, cn->path + 13);
  case ROUTE_TOKENIZE:
    return answer_tokenize(c, s, cn);
  case ROUTE_DETOKENIZE:
    return answer_detokenize(c, s, cn);
  case ROUTE_OLL_VERSION:
    return answer_oll_version(c);
  case ROUTE_OLL_TAGS:
    return answer_oll_tags(c, s);
  case ROUTE_OLL_SHOW:
    return answer_oll_show(c, s, cn);
  case ROUTE_OLL_PS:
    return answer_oll_ps(c, s);
  case ROUTE_OLL_CHAT:
  case ROUTE_OLL_GENERATE:
    return answer_generate(c, s, cn);
  case ROUTE_OLL_EMBED:
  case ROUTE_OLL_EMBEDDINGS:
    return answer_oll_embed(c, s, cn, cn->route == ROUTE_OLL_EMBEDDINGS);
  case ROUTE_OLL_PULL:
    return answer_oll_pull(c, s, cn);
  case ROUTE_OLL_DELETE:
    return answer_oll_delete(c, s, cn);
  case ROUTE_OLL_REFUSED:
    return answer_oll_refused(c, cn);
  case ROUTE_FILES:
  case ROUTE_FILE:
  case ROUTE_FILE_CONTENT:
  case ROUTE_BATCHES:
  case ROUTE_BATCH:
  case ROUTE_BATCH_CANCEL:
    return answer_batch_api(c, s, cn);
  default:
    return MHD_NO;
  }
}

/* Routes whose answer may take long (a generation, the tokenizer, an
 * adapter read from disk): answered on a thread of their own (defer). */
static bool slow_route(route r) {
  switch (r) {
  case ROUTE_CHAT:
  case ROUTE_COMPLETIONS:
  case ROUTE_MESSAGES:
  case ROUTE_RESPONSES:
  case ROUTE_COUNT_TOKENS:
  case ROUTE_EMBEDDINGS:
  case ROUTE_SIGNAL:
  case ROUTE_ADAPTERS:
  case ROUTE_ADAPTER:
  case ROUTE_FIT:
  case ROUTE_TOKENIZE:
  case ROUTE_DETOKENIZE:
  case ROUTE_MODEL_LOAD:
  case ROUTE_MODEL_UNLOAD:
  case ROUTE_OLL_TAGS: /* the models' headers are read */
  case ROUTE_OLL_SHOW:
  case ROUTE_OLL_CHAT:
  case ROUTE_OLL_GENERATE:
  case ROUTE_OLL_EMBED:
  case ROUTE_OLL_EMBEDDINGS:
  case ROUTE_OLL_PULL:
  case ROUTE_OLL_DELETE:
  case ROUTE_FILES:
  case ROUTE_FILE:
  case ROUTE_FILE_CONTENT:
  case ROUTE_BATCHES:
  case ROUTE_BATCH:
  case ROUTE_BATCH_CANCEL:
  case ROUTE_INFILL:
    return true;
  default:
    return false;
  }
}

static void *defer_main(void *arg) {
  conn *cn = arg;
  serve_server *s = cn->srv;
  struct MHD_Connection *c = cn->c;
  tl_server = s;
  tl_deferred = cn;
  cn->resp_rc = answer_route(c, s, cn);
  tl_deferred = NULL;
  cn->deferred = 2;
  /* the polling thread calls on_request again and queues cn->resp; cn is not ours after this */
  MHD_resume_connection(c);
  pthread_mutex_lock(&s->workers_mu);
  s->workers--;
  pthread_cond_broadcast(&s->workers_cv);
  pthread_mutex_unlock(&s->workers_mu);
  return NULL;
}

/* Suspends the connection and answers it on a new thread, so that a polling
 * thread never waits on a generation. */
static enum MHD_Result defer(serve_server *s, struct MHD_Connection *c, conn *cn) {
  pthread_mutex_lock(&s->workers_mu);
  bool stopping = s->stopping;
  if (!stopping) s->workers++;
  pthread_mutex_unlock(&s->workers_mu);
  if (stopping) {
    serve_fail f;
    serve_fail_set(&f, 503, "server_error", NULL, "shutting_down", "The server is stopping");
    return send_fail_as(c, &f, NULL, conn_proto(cn));
  }
  cn->srv = s;
  cn->c = c;
  cn->deferred = 1;
  MHD_suspend_connection(c);
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  int e = pthread_create(&t, &at, defer_main, cn);
  pthread_attr_destroy(&at);
  if (e == 0) return MHD_YES;
  MHD_resume_connection(c);
  cn->deferred = 0;
  pthread_mutex_lock(&s->workers_mu);
  s->workers--;
  pthread_cond_broadcast(&s->workers_cv);
  pthread_mutex_unlock(&s->workers_mu);
  serve_fail f;
  serve_fail_set(&f, 503, "server_error", NULL, NULL, "could not start a thread for the request");
  return send_fail_as(c, &f, NULL, conn_proto(cn));
}

/* ---- the request head's deadline ----
 * libmicrohttpd's connection timeout counts silence, so a client that sends
 * a byte of its headers every few seconds would keep its connection forever.
 * Each connection's socket context is a head_watch, in the server's list
 * while its request head is awaited: from when it opens (deadline: now +
 * header_timeout_s) and again after each answer on a kept-alive connection
 * (now + idle + header timeouts), out of it once the head is in (on_request's
 * first call) or the connection closes. The watcher shuts the socket of
 * every one past its deadline down, which libmicrohttpd then sees as the
 * end of the connection and closes. The socket stays open while it is in
 * the list: libmicrohttpd closes it only after the CLOSED notice unlinks it
 * (under head_mu). */
typedef struct head_watch {
  int fd;
  double deadline; /* mono_seconds by which the head must be in */
  struct head_watch *next, **prev;
} head_watch;

static void head_unlink(head_watch *h) {
  if (!h->prev) return;
  *h->prev = h->next;
  if (h->next) h->next->prev = h->prev;
  h->next = NULL;
  h->prev = NULL;
}

/* Awaits h's next request head until `deadline` (or no longer: deadline < 0). */
static void head_await(serve_server *s, head_watch *h, double deadline) {
  if (!h) return;
  pthread_mutex_lock(&s->head_mu);
  head_unlink(h);
  if (deadline >= 0) {
    h->deadline = deadline;
    h->prev = &s->heads;
    h->next = s->heads;
    if (s->heads) s->heads->prev = &h->next;
    s->heads = h;
  }
  pthread_mutex_unlock(&s->head_mu);
}

static head_watch *head_of(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode toe) {
  serve_server *s = cls;
  if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
    head_watch *h = calloc(1, sizeof *h); /* none (out of memory): that connection has the idle limit only */
    *socket_context = h;
    if (!h) return;
    h->fd = conn_fd(c);
    head_await(s, h, mono_seconds() + s->header_timeout_s);
  } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
    head_watch *h = *socket_context;
    if (!h) return;
    head_await(s, h, -1);
    free(h);
    *socket_context = NULL;
  }
}

static void heads_expire(serve_server *s, double now) {
  int closed = 0;
  pthread_mutex_lock(&s->head_mu);
  for (head_watch *h = s->heads, *next; h; h = next) {
    next = h->next;
    if (now < h->deadline) continue;
    if (h->fd >= 0) shutdown(h->fd, SHUT_RDWR);
    head_unlink(h);
    closed++;
  }
  pthread_mutex_unlock(&s->head_mu);
  if (closed)
    HLOG_INFO("serve: closed %d connection(s) whose request headers were not in within %d s", closed, s->header_timeout_s);
}

static enum MHD_Result on_request_in(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                     const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  serve_server *s = cls;
  conn *cn = *con_cls;
  tl_server = s;
  if (!cn) head_await(s, head_of(c), -1); /* the head is in */
  if (!cn && s->cors && strcmp(method, "OPTIONS") == 0) { /* a browser's CORS preflight */
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    cors_headers(resp);
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
    MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                            "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta, "
                            "anthropic-dangerous-direct-browser-access, OpenAI-Organization, OpenAI-Project, "
                            "X-Stainless-Arch, X-Stainless-Lang, X-Stainless-OS, X-Stainless-Package-Version, "
                            "X-Stainless-Retry-Count, X-Stainless-Runtime, X-Stainless-Runtime-Version, "
                            "X-Stainless-Timeout, X-Stainless-Helper-Method, X-Hearth-Priority");
    MHD_add_response_header(resp, "Access-Control-Max-Age", "86400");
    enum MHD_Result rc = MHD_queue_response(c, 204, resp);
    MHD_destroy_response(resp);
    return rc;
  }
  if (!cn) {
    cn = calloc(1, sizeof *cn);
    if (!cn) return MHD_NO;
    *con_cls = cn;
    classify(s, c, url, method, cn);
    if (!cn->failed) {
      cn->counted = true;
      atomic_fetch_add(&s->in_flight, 1);
    }
    /* A refusal (bad route, key, size) is answered now, before libmicrohttpd
     * sends "100 Continue" or reads a byte of the body; the connection is
     * then closed. */
    if (cn->failed) return send_fail_as(c, &cn->fail, cn->allow, conn_proto(cn));
    /* headers are in: the body may take its time, up to body_timeout_s of silence */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->body_timeout_s);
    return MHD_YES;
  }
  if (*upload_size) {
    if (!cn->failed) {
      if (cn->body.len + *upload_size > cn->max_body) {
        cn->failed = true;
        serve_fail_set(&cn->fail, 413, "invalid_request_error", NULL, "request_too_large",
                       "The request body is over the limit of %zu bytes", cn->max_body);
        hbuf_free(&cn->body);
      } else {
        hbuf_append(&cn->body, upload, *upload_size);
        if (cn->body.oom) {
          cn->failed = true;
          serve_fail_set(&cn->fail, 500, "server_error", NULL, NULL, "out of memory reading the request");
          hbuf_free(&cn->body);
        }
      }
    }
    *upload_size = 0; /* consumed (or dropped) */
    return MHD_YES;
  }
  /* the whole request is in: no inactivity limit while it is answered (a
   * long generation before a whole reply sends nothing) */
  MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
  if (cn->failed) return send_fail_as(c, &cn->fail, cn->allow, conn_proto(cn));
  if (cn->deferred == 2) { /* answered on its own thread (defer) */
    if (!cn->resp) return MHD_NO; /* nothing to send (the client went away, or out of memory): close */
    struct MHD_Response *resp = cn->resp;
    cn->resp = NULL;
    tl_status = cn->resp_status;
    enum MHD_Result rc = MHD_queue_response(c, cn->resp_status, resp);
    MHD_destroy_response(resp);
    return rc;
  }
  if (slow_route(cn->route)) return defer(s, c, cn);
  return answer_route(c, s, cn);
}

/* on_request_in, noting the status of an answer it queued (for the request's log line and counter). */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  tl_status = 0;
  enum MHD_Result rc = on_request_in(cls, c, url, method, version, upload, upload_size, con_cls);
  conn *cn = *con_cls;
  if (cn && tl_status) cn->status = tl_status;
  return rc;
}

/* One line on stderr per request, and its count by route and status. */
static void request_done(serve_server *s, const char *method, const char *route, unsigned status, double t_start,
                         int64_t prompt_tokens, int64_t completion_tokens, double ttft) {
  serve_metrics_request(s->metrics, route, (int)(status ? status : 499));
  char ttft_s[32] = "-";
  if (ttft >= 0) snprintf(ttft_s, sizeof ttft_s, "%.1fms", ttft * 1000);
  HLOG_INFO("request: %s %s %u prompt_tokens=%lld completion_tokens=%lld ttft=%s duration=%.1fms", method,
            route ? route : "-", status ? status : 499, (long long)prompt_tokens, (long long)completion_tokens, ttft_s,
            (mono_seconds() - t_start) * 1000);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why) {
  serve_server *s = cls;
  conn *cn = *con_cls;
  /* kept alive for the next request: it has the idle limit again */
  if (why == MHD_REQUEST_TERMINATED_COMPLETED_OK) {
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->idle_timeout_s);
    head_await(s, head_of(c), mono_seconds() + s->idle_timeout_s + s->header_timeout_s);
  }
  if (!cn) return;
  if (!cn->job_owned) request_done(s, cn->method, cn->route_path, cn->status, cn->t_start, 0, 0, -1);
  if (cn->counted) atomic_fetch_sub(&s->in_flight, 1);
  if (cn->resp) MHD_destroy_response(cn->resp); /* made, never sent (the client went away) */
  hbuf_free(&cn->body);
  free(cn);
  *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  size_t n = strlen(msg);
  while (n && msg[n - 1] == '\n') msg[--n] = 0;
  HLOG_DEBUG("serve: libmicrohttpd: %s", msg);
}

/* Room for max_conn sockets: the soft descriptor limit raised toward the hard one. */
static void raise_fd_limit(unsigned want) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want) return;
  rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
}

/* The Batch API over cfg->state_dir: the folder locked for this server, its
 * files and batches read back, and the runner started (rows posted to this
 * server on host:port with its key). */
static int batch_api_start(serve_server *s, const serve_config *cfg, const char *host, herr *err) {
  if (mkdir(cfg->state_dir, 0700) != 0 && errno != EEXIST)
    return herr_set(err, HEARTH_EIO, "state directory %s: %s", cfg->state_dir, strerror(errno));
  char *lock = hpath_join(cfg->state_dir, "lock");
  s->state_lock = lock ? open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600) : -1;
  free(lock);
  if (s->state_lock < 0) return herr_set(err, HEARTH_EIO, "state directory %s: %s", cfg->state_dir, strerror(errno));
  if (flock(s->state_lock, LOCK_EX | LOCK_NB) != 0)
    return herr_set(err, HEARTH_EINVAL, "state directory %s is in use by another server: give each its own",
                    cfg->state_dir);
  batch_row_target t;
  int rc;
  if ((rc = file_store_open(&s->files, cfg->state_dir, cfg->max_file_bytes, err))) return rc;
  if ((rc = batch_row_target_set(&t, host, s->port, cfg->api_key, err))) return rc;
  if ((rc = batch_store_open(&s->batches, cfg->state_dir, s->files, &t, cfg->batch_concurrency, err))) return rc;
  return batch_store_start(s->batches, err);
}

int serve_start(serve_server **out, serve_engine *engine, const serve_config *cfg, herr *err) {
  *out = NULL;
  const char *host = cfg->host && cfg->host[0] ? cfg->host : "127.0.0.1";
  if (cfg->port < 0 || cfg->port > 65535) return herr_set(err, HEARTH_EINVAL, "port %d is out of range", cfg->port);
  if (cfg->n_tools < 0 || cfg->n_tools > SERVE_MAX_TOOLS)
    return herr_set(err, HEARTH_EINVAL, "at most %d tools the server runs itself", SERVE_MAX_TOOLS);
  for (int i = 0; i < cfg->n_more_engines; i++) { /* a name picks one model */
    const char *id = cfg->more_engines[i]->model_id;
    bool dup = !strcmp(id, engine->model_id);
    for (int k = 0; k < i; k++) dup = dup || !strcmp(id, cfg->more_engines[k]->model_id);
    if (dup)
      return herr_set(err, HEARTH_EINVAL, "two models are called '%s': a request's \"model\" could not tell them apart", id);
  }
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
  char port[16];
  snprintf(port, sizeof port, "%d", cfg->port);
  if (cfg->api_key && !cfg->api_key[0])
    return herr_set(err, HEARTH_EINVAL, "the API key is empty, which would let every client in: give a key, or none");
  char *adapter_dir = NULL; /* its real path: what POST /v1/adapters paths must lie inside */
  if (cfg->adapter_dir) {
    struct stat st;
    errno = 0;
    adapter_dir = realpath(cfg->adapter_dir, NULL);
    if (!adapter_dir || stat(adapter_dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
      int e = errno;
      free(adapter_dir);
      return herr_set(err, HEARTH_EINVAL, "the adapter directory '%s' is not a folder%s%s", cfg->adapter_dir,
                      e ? ": " : "", e ? strerror(e) : "");
    }
  }
  int gai = getaddrinfo(host, port, &hints, &ai);
  if (gai || !ai) {
    free(adapter_dir);
    return herr_set(err, HEARTH_EINVAL, "cannot resolve host '%s': %s", host, gai_strerror(gai));
  }
  serve_server *s = calloc(1, sizeof *s);
  if (!s) {
    free(adapter_dir);
    freeaddrinfo(ai);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  s->adapter_dir = adapter_dir;
  s->models = cfg->models;
  for (int i = 0; i < cfg->n_tools; i++) s->tools[i] = cfg->tools[i];
  s->ntools = cfg->n_tools;
  s->tool_rounds = cfg->tool_rounds > 0 ? cfg->tool_rounds : SERVE_TOOL_ROUNDS;
  s->state_lock = -1;
  s->engine = engine;
  s->engines = calloc((size_t)cfg->n_more_engines + 1, sizeof *s->engines);
  if (!s->engines) {
    free(adapter_dir);
    freeaddrinfo(ai);
    free(s);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  s->engines[s->nengines++] = engine;
  for (int i = 0; i < cfg->n_more_engines; i++) s->engines[s->nengines++] = cfg->more_engines[i];
  s->metrics = serve_metrics_new();
  s->max_body = cfg->max_body ? cfg->max_body : DEFAULT_MAX_BODY;
  s->keepalive_s = (cfg->keepalive_ms > 0 ? cfg->keepalive_ms : DEFAULT_KEEPALIVE_MS) / 1000.0;
  s->api_key = cfg->api_key ? strdup(cfg->api_key) : NULL;
  s->cors = cfg->cors_origin && cfg->cors_origin[0] ? strdup(cfg->cors_origin) : NULL;
  /* a store that cannot be made (out of memory) leaves responses unstored */
  if (resp_store_new(cfg->responses_max ? cfg->responses_max : 1000,
                     cfg->responses_max_bytes ? cfg->responses_max_bytes : (size_t)256 << 20,
                     cfg->responses_ttl_s == 0 ? 3600 : cfg->responses_ttl_s < 0 ? 0 : cfg->responses_ttl_s,
                     &s->responses, NULL))
    s->responses = NULL;
  if (cfg->n_served_names > 0) {
    s->names = calloc((size_t)cfg->n_served_names, sizeof *s->names);
    for (int i = 0; s->names && i < cfg->n_served_names; i++) {
      s->names[i] = strdup(cfg->served_names[i]);
      s->nnames = i + 1;
      if (!strcmp(cfg->served_names[i], "*")) s->any_name = true;
    }
  }
  s->idle_timeout_s = cfg->idle_timeout_s > 0 ? cfg->idle_timeout_s : DEFAULT_IDLE_TIMEOUT_S;
  unsigned max_conn = cfg->max_connections > 0 ? (unsigned)cfg->max_connections : DEFAULT_MAX_CONNECTIONS;
  unsigned per_client = cfg->max_per_client > 0         ? (unsigned)cfg->max_per_client
                        : max_conn / PER_CLIENT_SHARE > 0 ? max_conn / PER_CLIENT_SHARE
                                                          : 1;
  s->header_timeout_s = cfg->header_timeout_s > 0 ? cfg->header_timeout_s : DEFAULT_HEADER_TIMEOUT_S;
  s->body_timeout_s = cfg->body_timeout_s > 0 ? cfg->body_timeout_s : DEFAULT_BODY_TIMEOUT_S;
  raise_fd_limit(max_conn + 64);
  pthread_mutex_init(&s->engine_lock, NULL);
  pthread_mutex_init(&s->jobs_mu, NULL);
  pthread_mutex_init(&s->workers_mu, NULL);
  pthread_cond_init(&s->workers_cv, NULL);
  pthread_mutex_init(&s->park_mu, NULL);
  pthread_mutex_init(&s->head_mu, NULL);
  pthread_cond_init(&s->watcher_cv, NULL);
  if (pthread_create(&s->watcher, NULL, watcher_main, s) != 0) {
    freeaddrinfo(ai);
    serve_stop(s);
    return herr_set(err, HEARTH_ENOMEM, "cannot start the server's watcher thread");
  }
  s->watcher_started = true;
  atomic_init(&s->draining, 0);
  atomic_init(&s->in_flight, 0);
  atomic_init(&s->next_id, (uint64_t)time(NULL));
  unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG; /* epoll on Linux */
  if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  s->daemon = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, s,                  /* */
                               MHD_OPTION_SOCK_ADDR, ai->ai_addr,                                     /* */
                               MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,                          /* */
                               MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,                        /* */
                               MHD_OPTION_THREAD_POOL_SIZE, (unsigned)POLL_THREADS,                   /* */
                               MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->idle_timeout_s,            /* */
                               MHD_OPTION_CONNECTION_LIMIT, max_conn,                                 /* */
                               MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_client,                        /* */
                               MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,                             /* */
                               MHD_OPTION_END);
  freeaddrinfo(ai);
  if (!s->daemon) {
    int e = errno;
    serve_stop(s);
    return herr_set(err, HEARTH_EIO, "cannot listen on %s:%d: %s", host, cfg->port,
                    e ? strerror(e) : "libmicrohttpd refused to start");
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
  s->port = di ? di->port : cfg->port;
  if (cfg->state_dir && batch_api_start(s, cfg, host, err)) {
    serve_stop(s);
    return err->code ? err->code : HEARTH_EIO;
  }
  *out = s;
  return 0;
}

int serve_port(const serve_server *s) { return s->port; }

uint64_t serve_keepalives_sent(serve_server *s) { return atomic_load(&s->keepalives); }

void serve_stop(serve_server *s) {
  if (!s) return;
  /* the batch runner first: its rows in flight are cut, and kept for a restart */
  batch_store_close(s->batches);
  s->batches = NULL;
  /* No connection may be suspended when the daemon stops: new answering threads are refused,
   * the generations running are cancelled, the answering threads waited for (each resumes its
   * connection), and the parked streams woken, with nothing parked from then on. */
  pthread_mutex_lock(&s->workers_mu);
  __atomic_store_n(&s->stopping, true, __ATOMIC_SEQ_CST);
  pthread_mutex_unlock(&s->workers_mu);
  pthread_mutex_lock(&s->jobs_mu);
  for (job *j = s->jobs; j; j = j->jnext) cancel_set(j);
  pthread_mutex_unlock(&s->jobs_mu);
  pthread_mutex_lock(&s->workers_mu);
  while (s->workers > 0) pthread_cond_wait(&s->workers_cv, &s->workers_mu);
  pthread_mutex_unlock(&s->workers_mu);
  if (s->watcher_started) {
    pthread_mutex_lock(&s->park_mu);
    s->watcher_stop = true;
    pthread_cond_signal(&s->watcher_cv);
    pthread_mutex_unlock(&s->park_mu);
    pthread_join(s->watcher, NULL);
  }
  if (s->daemon) MHD_stop_daemon(s->daemon);
  pthread_mutex_destroy(&s->engine_lock);
  pthread_mutex_destroy(&s->jobs_mu);
  pthread_mutex_destroy(&s->workers_mu);
  pthread_cond_destroy(&s->workers_cv);
  pthread_mutex_destroy(&s->park_mu);
  pthread_mutex_destroy(&s->head_mu);
  pthread_cond_destroy(&s->watcher_cv);
  free(s->api_key);
  free(s->cors);
  free(s->adapter_dir);
  for (int i = 0; i < s->nnames; i++) free(s->names[i]);
  free(s->names);
  free(s->engines);
  resp_store_free(s->responses);
  file_store_close(s->files);
  if (s->state_lock >= 0) close(s->state_lock);
  serve_metrics_free(s->metrics);
  free(s);
}

void serve_drain_begin(serve_server *s) {
  if (s->batches) batch_store_halt(s->batches); /* its rows run again after the restart */
  int was = 0;
  atomic_compare_exchange_strong(&s->draining, &was, 1);
}

int64_t serve_in_flight(serve_server *s) { return atomic_load(&s->in_flight); }

int serve_drain_cancel(serve_server *s) {
  atomic_store(&s->draining, 2); /* a generation that starts from now is cut at once */
  int n = 0;
  pthread_mutex_lock(&s->jobs_mu);
  for (job *j = s->jobs; j; j = j->jnext) {
    __atomic_store_n(&j->drained, 1, __ATOMIC_SEQ_CST);
    cancel_set(j);
    n++;
  }
  pthread_mutex_unlock(&s->jobs_mu);
  return n;
}

/* Waits up to `until` for the requests in flight to be answered; false when a signal of `sigs` came first. */
static bool wait_idle(serve_server *s, const sigset_t *sigs, double until) {
  while (serve_in_flight(s) > 0 && mono_seconds() < until) {
    struct timespec ts = {.tv_sec = 0, .tv_nsec = 20 * 1000 * 1000};
    if (sigs) {
      if (sigtimedwait(sigs, NULL, &ts) > 0) return false;
    } else {
      nanosleep(&ts, NULL);
    }
  }
  return true;
}

int serve_drain(serve_server *s, double timeout_s, const sigset_t *sigs) {
  serve_drain_begin(s);
  if (wait_idle(s, sigs, mono_seconds() + timeout_s) && serve_in_flight(s) == 0) return 0;
  int cut = serve_drain_cancel(s);
  /* their ends, and replies still being written, get a few seconds to go out */
  wait_idle(s, NULL, mono_seconds() + DRAIN_GRACE_S);
  return cut;
}
