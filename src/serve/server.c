/* server.c — the OpenAI-compatible server over the HTTP machinery of http.c:
 * the route table (matching, API keys, body limits, the /v1 index), the
 * informational endpoints, and one generation path for every protocol
 * (answer_generate, job_generate): a request's choices each a sequence of
 * its own in the engine, whole replies or streams fed by a generation
 * thread, a client gone cancelling its generation. Knows the engine only
 * through serve_engine (engine.h), and the JSON shapes only through the
 * protocol units: request.h / reply.h (OpenAI), anthropic.h (Anthropic
 * Messages, under /v1/messages, where every error, including routing, key
 * and size refusals, is an Anthropic error object), responses.h, infill.h
 * and ollama.h (the Ollama API under /api/: NDJSON streams, {"error": ...}
 * refusals). The tools the server runs itself (tools.h) ride on the
 * protocol table: a chat protocol's tools dialect has them added to a
 * request, and a reply that calls only them is run again after them
 * (tool_round), in the same stream, each protocol showing the exchange in
 * its own way (its round_calls and round_next ops). One
 * server may serve several engines, a request's "model" picking one. No CORS headers unless asked: only the chat page's own
 * origin may read answers from a browser.
 *
 * Connections: at most max_connections (4096), max_per_client (an eighth of
 * them, 512) per client address; the idle, head and body deadlines, parked
 * streams and the drain are http.c's. A refusal decided from the headers
 * (route, method, key, size) is answered before any body is read, and
 * before "100 Continue".
 *
 * Errors are one JSON object ({"error": {...}}, or Anthropic's
 * {"type": "error", "error": {...}} under /v1/messages) wherever the
 * application answers; what libmicrohttpd answers itself is said in http.c. */
#include "serve/server.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/hash.h"
#include "base/log.h"
#include "structured/grammar.h"
#include "serve/adapters.h"
#include "serve/anthropic.h"
#include "serve/batches.h"
#include "serve/files.h"
#include "serve/embeddings.h"
#include "serve/http.h"
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
#define DEFAULT_KEEPALIVE_MS 15000
#define DEFAULT_MAX_CONNECTIONS 4096
#define PER_CLIENT_SHARE 8         /* one client address may hold 1/8 of the connections (by default) */
#define DEFAULT_IDLE_TIMEOUT_S 10
#define DEFAULT_HEADER_TIMEOUT_S 10
#define DEFAULT_BODY_TIMEOUT_S 60  /* a request body that stalls this long is dropped */
#define DRAIN_GRACE_S 10           /* after a drain cuts the generations, what is in flight gets this long */

struct serve_server {
  http_server *http;    /* owned: the connections */
  serve_engine *engine; /* borrowed: the first model's (engines[0]) */
  serve_engine **engines; /* owned array of borrowed engines: every served model, the first first */
  int nengines;
  serve_metrics *metrics; /* owned, may be NULL (out of memory): /metrics' histograms and request counts */
  char *api_key;        /* owned; NULL when none */
  size_t max_body;
  pthread_mutex_t engine_lock; /* one generation at a time unless the engine is thread-safe */
  atomic_uint_fast64_t next_id;
  char **names;         /* owned: aliases the model answers to (besides its id) */
  int nnames;
  bool any_name;        /* "*" among them: every model name is served */
  resp_store *responses; /* owned: stored Responses API responses */
  char *adapter_dir;    /* owned: the real path POST /v1/adapters loads under; NULL: it loads nothing */
  const serve_models *models; /* borrowed, may be NULL: the Ollama API's models beyond the served one */
  /* the generations running (serve_drain_cancel, serve_stop) */
  pthread_mutex_t jobs_mu;
  struct job *jobs;     /* borrowed: each job is its connection's */
  /* the Batch API (NULL without a state directory) */
  file_store *files;        /* owned */
  batch_store *batches;     /* owned */
  int state_lock;           /* the state directory's lock file, held while serving; -1: none */
  serve_tool tools[SERVE_MAX_TOOLS]; /* the tools the server runs itself (serve/tools.h) */
  int ntools;
  int tool_rounds;
};

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


/* The error shape of a route's protocol. */
enum { PROTO_OPENAI = 0, PROTO_ANTHROPIC = 1, PROTO_OLLAMA = 2 };

/* The one route table: what classify matches (path, method, key), what GET
 * /v1 lists, and each route's handler — dispatch is a lookup. A path ending
 * in "/{id}" matches its prefix followed by a non-empty rest. */
typedef struct http_req conn;
/* A route's answer to a whole request (its body in cn->body). */
typedef enum MHD_Result (*route_fn)(struct MHD_Connection *c, serve_server *s, conn *cn);
typedef struct route_def {
  const char *method;
  const char *path;
  route_fn answer;
  bool open;   /* answered without an API key */
  bool slow;   /* may take long (a generation, the tokenizer, an adapter or a file read from disk):
                * answered on a thread of its own */
  bool upload; /* the Files API's: a POST's body is an upload, under --max-file-size, not --max-body */
  const struct serve_protocol *proto; /* a generating route's shapes (answer_generate) */
  const char *what;
} route_def;

/* Per-request state (conn): http.c's, with the route and protocol classify gives it. */

static bool conn_del(const conn *cn) { return !strcmp(cn->method, "DELETE"); }
static bool conn_post(const conn *cn) { return !strcmp(cn->method, "POST"); }

/* The error body of a protocol (PROTO_*). */
static http_fail_fn proto_fail_fn(int proto) {
  return proto == PROTO_OLLAMA ? oll_fail_json : proto == PROTO_ANTHROPIC ? anth_fail_json : serve_fail_json;
}

/* An error in the OpenAI shape, or the Anthropic or Ollama one (PROTO_*). */
static enum MHD_Result send_fail_as(struct MHD_Connection *c, const serve_fail *f, const char *allow, int proto) {
  return http_send_fail(c, f, allow, proto_fail_fn(proto));
}

static enum MHD_Result send_fail(struct MHD_Connection *c, const serve_fail *f, const char *allow) {
  return send_fail_as(c, f, allow, PROTO_OPENAI);
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
  return http_send_json(c, 200, o);
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
  return http_send_json(c, 200, o);
}

static enum MHD_Result answer_model(struct MHD_Connection *c, serve_server *s, const char *id, bool anthropic) {
  serve_engine *e = engine_named(s, id);
  if (e) return http_send_json(c, 200, anthropic ? anth_model_object(e, id) : model_object(e, id));
  int n;
  hearth_adapter_info *a = adapters_of(s->engine, &n);
  for (int i = 0; i < n; i++)
    if (!strcmp(a[i].name, id)) {
      json_t *m = anthropic ? anth_model_object(s->engine, id) : adapter_model_object(s->engine, &a[i]);
      free(a);
      return http_send_json(c, 200, m);
    }
  free(a);
  serve_fail f;
  serve_fail_set(&f, 404, "invalid_request_error", "model", "model_not_found", "The model '%.200s' does not exist",
                 id);
  return send_fail_as(c, &f, NULL, anthropic);
}

static json_t *route_index(void); /* the route table's listing, below */

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
  return http_send_json(c, 200, o);
}

static enum MHD_Result answer_health(struct MHD_Connection *c, serve_server *s) {
  json_t *o = json_object();
  json_object_set_new(o, "status", json_string("ok"));
  json_object_set_new(o, "model", json_string(s->engine->model_id));
  return http_send_json(c, 200, o);
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
  return http_send_json(c, 200, o);
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
  enum MHD_Result rc = b.oom ? MHD_NO : http_send(c, 200, "text/plain; version=0.0.4", hbuf_str(&b), b.len, NULL);
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
  enum MHD_Result rc = http_send(c, 200, "application/json", json, strlen(json), NULL);
  free(json);
  return rc;
}

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
  double t_first, t_last; /* its first and latest generated token (http_now; 0: none yet) */
  pthread_t thread;
  bool thread_started;
} slot;

struct serve_protocol;

/* What a generation needs, whole or streamed. */
typedef struct job {
  serve_server *srv;        /* borrowed */
  serve_engine *engine;     /* borrowed: the model the request named */
  bool held;                /* engine's model is held loaded for it (hold) until job_free */
  double keep_alive_s;      /* how long a model loaded on first use stays once idle (< 0: its own TTL) */
  bool load_only;           /* nothing to generate: the model is to be loaded (or, keep_alive_s 0, unloaded) */
  int64_t num_ctx;          /* a context the request sets itself (Ollama's options.num_ctx); 0: none */
  double t0, load_s;        /* when the answer began (oll_now), and how long it waited for its model to load */
  const struct serve_protocol *proto; /* static: the shapes it is answered in */
  /* the protocols' own state: each table reads and writes its part */
  oll_request oreq;         /* ollama */
  oll_reply oreply;         /* owned (ollama) */
  char *pull_name;          /* owned: an /api/pull job (no generation: the fetch's progress is the stream) */
  bool pull_running;        /* (under st.mu) its thread has not finished; st.orphan: MHD let go of it
                             * first, and the pull's thread frees it */
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
  const char *hidden[SERVE_MAX_TOOLS]; /* the names of the tools added (OpenAI chat and Ollama streams
                                        * do not send their calls) */
  int nhidden;
  int fd;                   /* the client's socket, watched for hang-ups */
  bool whole;               /* answered whole (not streamed): gone once the client ends its input */
  volatile int cancel;      /* set through cancel_set, read by the engine every step */
  int rc;                   /* generate's status */
  herr err;
  http_watch watch;         /* a whole reply's, while it is computed */
  /* streams only */
  pthread_t thread;
  bool thread_started;
  http_stream st;           /* the bytes produced and the parked connection */
  /* the server's list of running generations (serve_drain_cancel) */
  struct job *jnext, **jprev;
  volatile int drained;     /* cancelled by the end of a drain: it ends as cut by length, not as a client gone */
  /* for /metrics and the request's log line */
  double t_start;           /* the request's head arrived (http_now) */
  const char *route_path;   /* static */
} job;

/* A protocol: the shapes a generating route reads and answers in, one table
 * each (OpenAI chat and completions, llama.cpp's infill, the Responses API,
 * Anthropic Messages, Ollama's chat and generate), filled below; the
 * generation path around them is one. */
typedef struct serve_protocol {
  const char *name;        /* in the log lines */
  int shape;               /* its errors' shape (PROTO_*) */
  const char *chat_param;  /* the field an engine failure of a chat names ("messages", "input") */
  const char *count_param; /* the field a chat's prompt refusals (count, context) name */
  bool ndjson;             /* an NDJSON stream (no keep-alive comments), else SSE */
  const char *thread_fail; /* a stream's whole body when its thread cannot start */
  /* the body into j->req (and the protocol's own request state) */
  int (*parse)(job *j, const char *body, size_t len, serve_fail *f);
  /* the replies, once the choices are laid out (a parser of j->tc when j->parse) */
  int (*reply_init)(job *j, uint64_t id_seed, serve_fail *f);
  /* the forced opening of the reply through its parser (into sse when streamed); NULL: none */
  void (*prime)(job *j, const char *text, hbuf *sse);
  /* whole replies: each step's output, then the body */
  void (*add)(slot *sl, const serve_token *tok);
  void (*body)(job *j, hbuf *out);
  /* streams: the opening, each step, a choice's end (NULL: nothing), an error, the end */
  void (*stream_start)(job *j, hbuf *out);
  void (*stream_token)(slot *sl, const serve_token *tok, hbuf *out);
  void (*choice_end)(slot *sl, hbuf *out);
  void (*stream_error)(job *j, const serve_fail *f, hbuf *out);
  void (*stream_finish)(job *j, hbuf *out);
  /* Ollama's load-only request (j->oreq.load_only): its answer; NULL: none */
  void (*load_body)(job *j, const char *reason, hbuf *out);
  /* The server's own tools (serve/tools.h): added to a request's tools in this dialect (NULL: not
   * offered on the route). At a round's end, round_calls ends the reply's parser (its last events
   * into sse when streamed, else sse NULL) and gives the round's calls in OpenAI's shape
   * ([{"id", "type", "function": {"name", "arguments"}}], borrowed; NULL: none) and its text; once
   * the calls ran, round_next shows the round (the assistant and tool messages it added, OpenAI's
   * shape) as the protocol shows a server's tool use (into sse when streamed) and sets the reply up
   * for the next round under j->tc. */
  const serve_tools_dialect *tools;
  const json_t *(*round_calls)(job *j, hbuf *sse, const char **text);
  int (*round_next)(job *j, const json_t *round, hbuf *sse, herr *err);
} serve_protocol;

static void forced_call_grammar(job *j);
static void request_done(serve_server *s, const char *method, const char *route, unsigned status, double t_start,
                         int64_t prompt_tokens, int64_t completion_tokens, double ttft);

/* A generated token's times: the choice's first (time to first token) or the gap since its last. */
static void token_times(slot *sl, const serve_token *tok) {
  if (tok->flush) return;
  double now = http_now();
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
    serve_metrics_observe(s->metrics, SERVE_HIST_E2E, http_now() - j->t_start);
    for (int i = 0; i < j->nslots; i++)
      if (*j->slots[i].rc == 0 && j->slots[i].result->queue_seconds >= 0)
        serve_metrics_observe(s->metrics, SERVE_HIST_QUEUE, j->slots[i].result->queue_seconds);
  }
  double ttft = j->nslots > 0 && j->slots[0].t_first > 0 ? j->slots[0].t_first - j->t_start : -1;
  request_done(s, "POST", j->route_path, status, j->t_start, j->usage.prompt_tokens, j->usage.completion_tokens, ttft);
}

/* The client of j is gone: as a whole reply's, or as a stream's (http_client_gone). */
static bool job_client_gone(const struct job *j) { return http_client_gone(j->fd, j->whole); }

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
  if (j->held) unhold(j->engine, j->keep_alive_s);
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
  http_stream_free(&j->st);
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

/* Whether the reply just made, whose calls are `calls` (its protocol's round_calls), called only
 * the server's own tools (serve/tools.h), which run and the model goes on: a chat of one choice
 * with those tools added, ended well, within the rounds allowed. */
static bool tools_go_on(job *j, const json_t *calls) {
  if (!j->tools_added || j->nslots != 1) return false;
  if (j->rc || j->result.finish == SERVE_FINISH_CANCELLED || cancelled(j) || j->rounds >= j->srv->tool_rounds) return false;
  return serve_tools_all_ours(j->srv->tools, j->srv->ntools, j->tools_added, calls);
}

/* r's token counts with those of the rounds of the server's tools before the last. */
static serve_result with_rounds(const job *j, const serve_result *r) {
  serve_result u = *r;
  u.prompt_tokens += j->tool_usage.prompt_tokens;
  u.completion_tokens += j->tool_usage.completion_tokens;
  u.cached_tokens += j->tool_usage.cached_tokens;
  return u;
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
  if (j->req.stream && j->proto->choice_end && *sl->rc == 0 && !abandoned(j)) {
    hbuf b = {0};
    j->proto->choice_end(sl, &b);
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
  if (cancelled(j) || job_client_gone(j) || http_stopping(s->http)) {
    cancel_set(j);
    j->rc = HEARTH_ECANCELLED;
    herr_set(&j->err, HEARTH_ECANCELLED, "the client went away");
  } else {
    jobs_add(s, j);
    if (http_draining(s->http) > 1) __atomic_store_n(&j->drained, 1, __ATOMIC_SEQ_CST), cancel_set(j);
    if (http_stopping(s->http)) cancel_set(j); /* serve_stop's sweep may have missed it */
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
  const char *param = j->req.kind == SERVE_CHAT ? j->proto->chat_param : "prompt";
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

/* Whole responses: gather every step, stop when the client hangs up (the watcher, whole_watch,
 * sets the cancel flag). */
static int whole_token(void *ctx, const serve_token *tok) {
  slot *sl = ctx;
  job *j = sl->j;
  if (!sl->started) slot_started(sl);
  if (!tok->flush) sl->cum_logprob += tok->logprob;
  token_times(sl, tok);
  j->proto->add(sl, tok);
  return cancelled(j) ? 1 : 0;
}

/* The forced opening of the reply goes through the parser first, as if generated. */
static void job_prime(job *j, hbuf *sse) {
  if (j->forced && j->proto->prime) j->proto->prime(j, j->forced, sse);
}

/* While a whole reply is computed the watcher (http.c) looks after its client: a hang-up
 * cancels it within a tick (and no token of it costs a system call). */
static void whole_watch(job *j, bool on) {
  if (on) {
    j->watch.fd = j->fd;
    j->watch.cancel = &j->cancel;
    http_watch_add(j->srv->http, &j->watch);
  } else {
    http_watch_remove(j->srv->http, &j->watch);
  }
}

/* The choices a whole reply returns, into r / res: every slot, or with
 * best_of > n the n of each prompt's best_of continuations with the highest
 * cumulative logprob (best first; ties to the earlier copy), re-indexed
 * prompt * n + k. Returns how many. */
static int best_of_choices(job *j, serve_reply **r, serve_result *res) {
  int n = j->req.n > 0 ? j->req.n : 1, copies = j->req.kind == SERVE_COMPLETION && j->req.best_of > n ? j->req.best_of : n;
  if (copies == n) {
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

/* After a reply that called only the server's own tools (serve/tools.h),
 * its calls and text those of its protocol's round_calls: runs them,
 * appends the calls and their results to the conversation and the
 * exchange, and sets the next round up — prompt, parser, the reply through
 * the protocol's round_next (into sse when streamed). The tool_choice that
 * forced the first call is the first round's only. */
static int tool_round(job *j, const json_t *calls, const char *text, hbuf *sse, serve_fail *f) {
  serve_server *s = j->srv;
  herr err = {0};
  json_t *round = json_array();
  if (!round || (!j->exchange && !(j->exchange = json_array()))) {
    json_decref(round);
    return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  }
  j->tool_usage.prompt_tokens += j->result.prompt_tokens;
  j->tool_usage.completion_tokens += j->result.completion_tokens;
  j->tool_usage.cached_tokens += j->result.cached_tokens;
  if (serve_tools_run(s->tools, s->ntools, &j->req, text, calls, round, &err)) {
    json_decref(round);
    return serve_fail_set(f, 500, "server_error", NULL, NULL, "%s", err.msg);
  }
  json_array_extend(j->exchange, round);
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
  if (chat_prompt(j, f)) {
    json_decref(round);
    return f->status;
  }
  if (!j->parse) { /* the first round's calls were parsed under these tools: so are the next round's */
    json_decref(round);
    return serve_fail_set(f, 500, "server_error", NULL, NULL, "the next round has no tool-call parser");
  }
  j->req.sampling.skip_special = !needs_specials(&j->tc);
  int rc = j->proto->round_next(j, round, sse, &err);
  json_decref(round);
  if (rc) return serve_fail_set(f, 500, "server_error", NULL, NULL, "%s", err.msg);
  slot *sl = &j->slots[0];
  sl->text = j->prompt;
  sl->sampling = j->req.sampling;
  sl->started = false;
  sl->t_first = sl->t_last = 0;
  sl->cum_logprob = 0;
  memset(&j->result, 0, sizeof j->result);
  j->rc = 0;
  memset(&j->err, 0, sizeof j->err);
  job_prime(j, sse);
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
  while (j->tools_added && j->rc == 0) {
    const char *text = NULL;
    const json_t *calls = j->proto->round_calls(j, NULL, &text);
    if (!tools_go_on(j, calls)) break;
    if (tool_round(j, calls, text, NULL, &tf)) {
      tool_failed = true;
      break;
    }
    HLOG_INFO("serve: %s: round %d of the server's tools ran", j->proto->name, ++j->rounds);
    job_generate(j, whole_token);
  }
  whole_watch(j, false);
  enum MHD_Result rc;
  if (tool_failed) {
    rc = send_fail_as(c, &tf, NULL, j->proto->shape);
    job_done(j, (unsigned)tf.status);
  } else if (j->rc == 0 && j->result.finish != SERVE_FINISH_CANCELLED) {
    hbuf body = {0};
    j->proto->body(j, &body);
    rc = body.oom ? MHD_NO : http_send(c, 200, "application/json", hbuf_str(&body), body.len, NULL);
    job_done(j, body.oom ? 500 : 200);
    HLOG_INFO("serve: %s 200: %d choice%s, %lld prompt + %lld completion tokens, %s", j->proto->name, j->nslots,
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
    rc = send_fail_as(c, &f, NULL, j->proto->shape);
    job_done(j, (unsigned)f.status);
  }
  job_free(j);
  return rc;
}

/* Streams: the producer thread formats SSE (NDJSON for Ollama) into j->st;
 * http.c hands it to the client, parking the connection while it waits. */
static void stream_push(job *j, const hbuf *b, bool done) { http_stream_push(&j->st, b, done); }

static int stream_token(void *ctx, const serve_token *tok) {
  slot *sl = ctx;
  job *j = sl->j;
  if (!sl->started) slot_started(sl);
  token_times(sl, tok);
  hbuf b = {0};
  j->proto->stream_token(sl, tok, &b);
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
  j->proto->stream_start(j, &b);
  job_prime(j, &b);
  stream_push(j, &b, false);
  hbuf_clear(&b);
  job_generate(j, stream_token);
  /* the server's own tools: while a round calls only them, they run and the model goes on in the same stream */
  while (j->tools_added && j->rc == 0 && !abandoned(j)) {
    const char *text = NULL;
    const json_t *calls = j->proto->round_calls(j, &b, &text);
    bool go = tools_go_on(j, calls);
    serve_fail tf;
    if (go && tool_round(j, calls, text, &b, &tf)) {
      j->rc = herr_set(&j->err, HEARTH_EINTERNAL, "%s", tf.message);
      go = false;
    }
    stream_push(j, &b, false);
    hbuf_clear(&b);
    if (!go) break;
    HLOG_INFO("serve: %s stream: round %d of the server's tools ran", j->proto->name, ++j->rounds);
    job_generate(j, stream_token);
  }
  job_done(j, abandoned(j) ? 0 : 200); /* (the stream's status went out with its first bytes) */
  if (abandoned(j)) {
    HLOG_INFO("serve: client went away; stream cancelled after %lld tokens", (long long)j->result.completion_tokens);
  } else if (j->rc) {
    serve_fail f;
    fail_from_engine(j, &f);
    j->proto->stream_error(j, &f, &b);
  } else {
    j->proto->stream_finish(j, &b);
    HLOG_INFO("serve: %s stream: %d choice%s, %lld prompt + %lld completion tokens, %s", j->proto->name, j->nslots,
              j->nslots == 1 ? "" : "s", (long long)j->usage.prompt_tokens, (long long)j->usage.completion_tokens,
              serve_finish_name(j->result.finish));
  }
  stream_push(j, &b, true);
  hbuf_free(&b);
  return NULL;
}

/* MHD is done with the stream (finished, or the client went away). */
static void stream_free(void *cls) {
  job *j = cls;
  if (j->pull_name && j->thread_started) { /* a pull is not cut: its thread finishes and frees the job */
    pthread_mutex_lock(&j->st.mu);
    bool running = j->pull_running;
    if (running) j->st.orphan = true;
    pthread_mutex_unlock(&j->st.mu);
    if (running) {
      pthread_detach(j->thread);
      return;
    }
  }
  if (j->thread_started) pthread_join(j->thread, NULL);
  job_free(j);
}

static enum MHD_Result answer_stream(struct MHD_Connection *c, job *j) {
  j->st.fd = j->fd;
  j->st.cancel = &j->cancel;
  j->st.drained = &j->drained;
  j->st.keepalive = !j->proto->ndjson;
  j->st.free_fn = stream_free;
  j->st.owner = j;
  struct MHD_Response *resp = http_stream_response(&j->st, c);
  if (!resp) {
    job_free(j);
    return MHD_NO;
  }
  /* From here the response owns j: stream_free runs when MHD lets go of it. */
  if (pthread_create(&j->thread, NULL, stream_main, j) == 0) {
    j->thread_started = true;
  } else {
    j->st.done = true;
    hbuf_puts(&j->st.out, j->proto->thread_fail);
  }
  return http_stream_queue(c, resp, j->proto->ndjson ? "application/x-ndjson" : "text/event-stream");
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
  if (!tc_syntax_of((tc_format)e->tool_format)->server_describes || e->template_tools || !json_array_size(req->tools) ||
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

/* Syntaxes whose markers are special tokens, which the text must then keep. */
static bool needs_specials(const tc_opts *o) {
  const tc_syntax *syn = tc_syntax_of(o->format);
  return syn->special_markers || (o->tools && syn->special_call_markers);
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

/* ---- the protocols ---- */

/* Keeps a finished Responses response (and the conversation it ends) when asked to. */
static void store_response(job *j, const json_t *o) {
  if (!j->rr.store || !o || !j->srv->responses) return;
  json_t *conv = resp_reply_conversation(&j->rreply, j->history);
  resp_store_put(j->srv->responses, o, conv);
  json_decref(conv);
}

#define THREAD_FAIL_OPENAI                                                                                            \
  "data: {\"error\":{\"message\":\"could not start a thread\",\"type\":\"server_error\",\"param\":null,"          \
  "\"code\":null}}\n\ndata: [DONE]\n\n"

/* OpenAI chat completions and completions: a reply per choice (serve_reply), SSE chunks. */
static int chat_parse(job *j, const char *body, size_t len, serve_fail *f) {
  return serve_request_parse(body, len, SERVE_CHAT, &j->req, f);
}
static int completions_parse(job *j, const char *body, size_t len, serve_fail *f) {
  return serve_request_parse(body, len, SERVE_COMPLETION, &j->req, f);
}
static int openai_reply_init(job *j, uint64_t id_seed, serve_fail *f) {
  herr err = {0};
  int64_t created = (int64_t)time(NULL);
  for (int i = 0; i < j->nslots; i++) { /* one reply per choice, all of one id */
    serve_reply *r = j->slots[i].reply;
    serve_reply_init(r, j->req.kind, j->engine->model_id, created, id_seed, j->req.sampling.logprobs);
    r->index = i;
    r->usage_null = j->req.stream && j->req.include_usage;
    r->one_call = j->req.one_tool_call;
    reply_hide(j, r);
    if (j->parse && serve_reply_parse(r, &j->tc, &err))
      return serve_fail_set(f, 500, "server_error", NULL, NULL, "%s", err.msg);
  }
  if (j->req.return_token_ids && reply_token_ids(j, j->req.kind, f)) return f->status;
  if (j->req.kind == SERVE_COMPLETION && j->req.echo && echo_setup(j, f)) return f->status;
  return 0;
}
static void openai_prime(job *j, const char *text, hbuf *sse) {
  for (int i = 0; i < j->nslots; i++) serve_reply_prime(j->slots[i].reply, text, sse);
}
static void openai_add(slot *sl, const serve_token *tok) { serve_reply_add(sl->reply, tok); }
static void openai_body(job *j, hbuf *out) {
  serve_reply **r = malloc(sizeof *r * (size_t)j->nslots);
  serve_result *res = malloc(sizeof *res * (size_t)j->nslots);
  if (r && res) serve_reply_body_n(r, res, best_of_choices(j, r, res), &j->usage, out);
  else out->oom = true;
  free(r);
  free(res);
}
static void openai_stream_start(job *j, hbuf *out) {
  for (int i = 0; i < j->nslots; i++) {
    serve_sse_start(j->slots[i].reply, out);
    if (j->req.echo) serve_sse_text(j->slots[i].reply, j->slots[i].text, strlen(j->slots[i].text), out);
  }
}
static void openai_stream_token(slot *sl, const serve_token *tok, hbuf *out) { serve_sse_token(sl->reply, tok, out); }
/* each choice sends its finish chunk as it ends */
static void openai_choice_end(slot *sl, hbuf *out) { serve_sse_finish(sl->reply, sl->result->finish, out); }
static void openai_stream_error(job *j, const serve_fail *f, hbuf *out) {
  (void)j;
  serve_sse_error(f, out);
  serve_sse_done(out);
}
static void openai_stream_finish(job *j, hbuf *out) {
  if (j->req.include_usage) serve_sse_usage(&j->reply, &j->usage, out);
  serve_sse_done(out);
}
/* A chat's whole reply and stream also carry the rounds of the server's own tools
 * (serve/tools.h; answer_whole and stream_main run them): the reply's end is
 * held back to the stream's finish while another round may follow, and the
 * exchange and the rounds' tokens go into the body, or into a chunk of their
 * own and the usage chunk. */
static void chat_body(job *j, hbuf *out) {
  openai_body(j, out);
  tool_body(j, out);
}
static void chat_choice_end(slot *sl, hbuf *out) {
  if (sl->j->tools_added) return; /* (one choice) its end is the stream's: chat_stream_finish */
  openai_choice_end(sl, out);
}
static void chat_stream_finish(job *j, hbuf *out) {
  serve_result u = with_rounds(j, &j->usage);
  if (j->tools_added) serve_sse_finish(&j->reply, j->result.finish, out);
  if (j->exchange) serve_sse_tool_exchange(&j->reply, j->exchange, out);
  if (j->req.include_usage) serve_sse_usage(&j->reply, &u, out);
  serve_sse_done(out);
}
static const json_t *chat_round_calls(job *j, hbuf *sse, const char **text) {
  if (sse) serve_sse_end(&j->reply, sse);
  else serve_reply_end(&j->reply);
  *text = hbuf_str(&j->reply.text);
  return j->reply.calls;
}
/* The next round's reply: a new one under the same id (the exchange goes out at the end). */
static int chat_round_next(job *j, const json_t *round, hbuf *sse, herr *err) {
  (void)round, (void)sse;
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
  return serve_reply_parse(r, &j->tc, err);
}

static const serve_protocol proto_chat = {
    .name = "chat", .shape = PROTO_OPENAI, .chat_param = "messages", .count_param = "messages",
    .thread_fail = THREAD_FAIL_OPENAI, .parse = chat_parse, .reply_init = openai_reply_init, .prime = openai_prime,
    .add = openai_add, .body = chat_body, .stream_start = openai_stream_start, .stream_token = openai_stream_token,
    .choice_end = chat_choice_end, .stream_error = openai_stream_error, .stream_finish = chat_stream_finish,
    .tools = &serve_tools_openai, .round_calls = chat_round_calls, .round_next = chat_round_next};
static const serve_protocol proto_completions = {
    .name = "completion", .shape = PROTO_OPENAI, .chat_param = "messages", .count_param = "messages",
    .thread_fail = THREAD_FAIL_OPENAI, .parse = completions_parse, .reply_init = openai_reply_init,
    .prime = openai_prime, .add = openai_add, .body = openai_body, .stream_start = openai_stream_start,
    .stream_token = openai_stream_token, .choice_end = openai_choice_end, .stream_error = openai_stream_error,
    .stream_finish = openai_stream_finish};

/* llama.cpp's /infill: a completion whose replies are llama.cpp's shapes (infill.h). */
static int infill_parse(job *j, const char *body, size_t len, serve_fail *f) {
  return infill_request_parse(body, len, &j->req, f);
}
static const char *infill_model(const job *j) { return j->reply.model ? j->reply.model : j->srv->engine->model_id; }
static void infill_whole(job *j, hbuf *out) {
  infill_body(&j->req, infill_model(j), hbuf_str(&j->reply.text), j->reply.text.len, &j->result, out);
}
static void infill_stream_start(job *j, hbuf *out) { (void)j, (void)out; } /* it opens with the first piece */
static void infill_stream_token(slot *sl, const serve_token *tok, hbuf *out) {
  (void)sl;
  infill_sse_token(tok->text, tok->len, out);
}
static void infill_stream_error(job *j, const serve_fail *f, hbuf *out) {
  (void)j;
  infill_sse_error(f, out);
}
static void infill_stream_finish(job *j, hbuf *out) { infill_sse_finish(&j->req, infill_model(j), &j->result, out); }

static const serve_protocol proto_infill = {
    .name = "completion", .shape = PROTO_OPENAI, .chat_param = "messages", .count_param = "messages",
    .thread_fail = THREAD_FAIL_OPENAI, .parse = infill_parse, .reply_init = openai_reply_init, .prime = openai_prime,
    .add = openai_add, .body = infill_whole, .stream_start = infill_stream_start, .stream_token = infill_stream_token,
    .stream_error = infill_stream_error, .stream_finish = infill_stream_finish};

/* The OpenAI Responses API: output items (resp_reply), typed events, the store. */
static int responses_parse(job *j, const char *body, size_t len, serve_fail *f) {
  if (resp_request_parse(body, len, &j->req, &j->rr, f)) return f->status;
  if (j->rr.previous_id) {
    resp_store *store = j->srv->responses;
    json_t *prev = store ? resp_store_get(store, j->rr.previous_id, &j->history) : NULL;
    if (!prev)
      return serve_fail_set(f, 404, "invalid_request_error", "previous_response_id", "previous_response_not_found",
                            "Previous response with id '%.100s' not found.", j->rr.previous_id);
    json_decref(prev);
  }
  return resp_request_messages(&j->req, &j->rr, j->history, f);
}
static int responses_reply_init(job *j, uint64_t id_seed, serve_fail *f) {
  herr err = {0};
  resp_reply_init(&j->rreply, j->engine->model_id, id_seed ^ (uint64_t)time(NULL), &j->rr);
  j->rreply.server_tools = j->hidden;
  j->rreply.n_server_tools = j->nhidden;
  if (j->parse && resp_reply_parse(&j->rreply, &j->tc, &err))
    return serve_fail_set(f, 500, "server_error", NULL, NULL, "%s", err.msg);
  return 0;
}
static void responses_prime(job *j, const char *text, hbuf *sse) { resp_reply_prime(&j->rreply, text, sse); }
static void responses_add(slot *sl, const serve_token *tok) { resp_reply_add(&sl->j->rreply, tok); }
static void responses_body(job *j, hbuf *out) {
  serve_result u = with_rounds(j, &j->result);
  json_t *o = resp_reply_object(&j->rreply, &u);
  char *txt = o ? json_dumps(o, JSON_COMPACT) : NULL;
  if (txt) hbuf_puts(out, txt);
  else out->oom = true;
  free(txt);
  store_response(j, o);
  json_decref(o);
}
static void responses_stream_start(job *j, hbuf *out) { resp_sse_start(&j->rreply, out); }
static void responses_stream_token(slot *sl, const serve_token *tok, hbuf *out) {
  resp_sse_token(&sl->j->rreply, tok, out);
}
static void responses_stream_error(job *j, const serve_fail *f, hbuf *out) { resp_sse_error(&j->rreply, f, out); }
static void responses_stream_finish(job *j, hbuf *out) {
  serve_result u = with_rounds(j, &j->result);
  resp_sse_finish(&j->rreply, &u, out);
  json_t *o = resp_reply_object(&j->rreply, &u);
  store_response(j, o);
  json_decref(o);
}
/* The server's own tools: NAME_call items, done with their output as the round ends. */
static const json_t *responses_round_calls(job *j, hbuf *sse, const char **text) {
  return resp_reply_round_calls(&j->rreply, sse, text);
}
static int responses_round_next(job *j, const json_t *round, hbuf *sse, herr *err) {
  return resp_reply_round_next(&j->rreply, round, &j->tc, sse, err);
}

static const serve_protocol proto_responses = {
    .name = "responses", .shape = PROTO_OPENAI, .chat_param = "input", .count_param = "messages",
    .thread_fail = THREAD_FAIL_OPENAI, .parse = responses_parse, .reply_init = responses_reply_init,
    .prime = responses_prime, .add = responses_add, .body = responses_body, .stream_start = responses_stream_start,
    .stream_token = responses_stream_token, .stream_error = responses_stream_error,
    .stream_finish = responses_stream_finish, .tools = &resp_tools_dialect, .round_calls = responses_round_calls,
    .round_next = responses_round_next};

/* Anthropic Messages: the message object (anth_reply), named SSE events. */
static int messages_parse(job *j, const char *body, size_t len, serve_fail *f) {
  return anth_request_parse(body, len, false, &j->req, f);
}
static int messages_reply_init(job *j, uint64_t id_seed, serve_fail *f) {
  herr err = {0};
  anth_reply_init(&j->areply, j->engine->model_id, id_seed ^ (uint64_t)time(NULL), j->req.sampling.stop,
                  j->req.sampling.n_stop);
  j->areply.server_tools = j->hidden;
  j->areply.n_server_tools = j->nhidden;
  j->req.sampling.trace_label = j->areply.id;
  if (j->parse && anth_reply_parse(&j->areply, &j->tc, &err))
    return serve_fail_set(f, 500, "server_error", NULL, NULL, "%s", err.msg);
  return 0;
}
static void messages_prime(job *j, const char *text, hbuf *sse) { anth_reply_prime(&j->areply, text, sse); }
static void messages_add(slot *sl, const serve_token *tok) { anth_reply_add(&sl->j->areply, tok); }
static void messages_body(job *j, hbuf *out) {
  serve_result u = with_rounds(j, &j->result);
  anth_reply_body(&j->areply, &u, out);
}
static void messages_stream_start(job *j, hbuf *out) { anth_sse_start(&j->areply, j->prompt_tokens, out); }
static void messages_stream_token(slot *sl, const serve_token *tok, hbuf *out) {
  anth_sse_token(&sl->j->areply, tok, out);
}
static void messages_stream_error(job *j, const serve_fail *f, hbuf *out) {
  (void)j;
  anth_sse_error(f, out);
}
static void messages_stream_finish(job *j, hbuf *out) {
  serve_result u = with_rounds(j, &j->result);
  anth_sse_finish(&j->areply, &u, out);
}
/* The server's own tools: server_tool_use blocks, and their results' blocks as the round ends. */
static const json_t *messages_round_calls(job *j, hbuf *sse, const char **text) {
  return anth_reply_round_calls(&j->areply, sse, text);
}
static int messages_round_next(job *j, const json_t *round, hbuf *sse, herr *err) {
  return anth_reply_round_next(&j->areply, round, &j->tc, sse, err);
}

static const serve_protocol proto_messages = {
    .name = "messages", .shape = PROTO_ANTHROPIC, .chat_param = "messages", .count_param = "messages",
    .thread_fail = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\","
                   "\"message\":\"could not start a thread\"}}\n\n",
    .parse = messages_parse, .reply_init = messages_reply_init, .prime = messages_prime, .add = messages_add,
    .body = messages_body, .stream_start = messages_stream_start, .stream_token = messages_stream_token,
    .stream_error = messages_stream_error, .stream_finish = messages_stream_finish, .tools = &anth_tools_dialect,
    .round_calls = messages_round_calls, .round_next = messages_round_next};

/* The Ollama API's chat and generate: oll_reply, NDJSON lines, load-only requests. */
static int ollama_parse(job *j, const char *body, size_t len, bool chat, serve_fail *f) {
  if (oll_request_parse(body, len, chat, &j->req, &j->oreq, f)) return f->status;
  j->load_only = j->oreq.load_only;
  j->keep_alive_s = j->oreq.keep_alive_s;
  j->num_ctx = j->oreq.num_ctx;
  return 0;
}
static int oll_chat_parse(job *j, const char *body, size_t len, serve_fail *f) { return ollama_parse(j, body, len, true, f); }
static int oll_generate_parse(job *j, const char *body, size_t len, serve_fail *f) {
  return ollama_parse(j, body, len, false, f);
}
static int ollama_reply_init(job *j, uint64_t id_seed, serve_fail *f) {
  (void)id_seed;
  herr err = {0};
  oll_reply_init(&j->oreply, j->oreq.chat, j->req.model, j->req.stream, j->t0, j->req.sampling.logprobs);
  j->oreply.load_s = j->load_s;
  j->oreply.hidden = j->hidden;
  j->oreply.nhidden = j->nhidden;
  if (j->parse && oll_reply_parse(&j->oreply, &j->tc, &err))
    return serve_fail_set(f, 500, "server_error", NULL, NULL, "%s", err.msg);
  return 0;
}
static void ollama_add(slot *sl, const serve_token *tok) { oll_reply_add(&sl->j->oreply, tok); }
static void ollama_body(job *j, hbuf *out) {
  serve_result u = with_rounds(j, &j->result);
  oll_reply_body(&j->oreply, &u, out);
}
static void ollama_stream_start(job *j, hbuf *out) { (void)j, (void)out; } /* it opens with its first token's line */
static void ollama_stream_token(slot *sl, const serve_token *tok, hbuf *out) {
  oll_stream_token(&sl->j->oreply, tok, out);
}
static void ollama_stream_error(job *j, const serve_fail *f, hbuf *out) {
  (void)j;
  oll_error_line(f, out);
}
static void ollama_stream_finish(job *j, hbuf *out) {
  serve_result u = with_rounds(j, &j->result);
  oll_stream_finish(&j->oreply, &u, out);
}
/* The server's own tools (/api/chat): their calls kept out of a stream, the exchange in the final object. */
static const json_t *ollama_round_calls(job *j, hbuf *sse, const char **text) {
  return oll_reply_round_calls(&j->oreply, sse, text);
}
static int ollama_round_next(job *j, const json_t *round, hbuf *sse, herr *err) {
  (void)sse;
  return oll_reply_round_next(&j->oreply, round, &j->tc, err);
}
static void ollama_load_body(job *j, const char *reason, hbuf *out) {
  oll_load_body(j->oreq.chat, j->req.model, reason, out);
}

#define OLLAMA_OPS                                                                                                    \
  .shape = PROTO_OLLAMA, .chat_param = "messages", .ndjson = true,                                                    \
  .thread_fail = "{\"error\":\"could not start a thread\"}\n", .reply_init = ollama_reply_init, .add = ollama_add,   \
  .body = ollama_body, .stream_start = ollama_stream_start, .stream_token = ollama_stream_token,                     \
  .stream_error = ollama_stream_error, .stream_finish = ollama_stream_finish, .load_body = ollama_load_body
static const serve_protocol proto_oll_chat = {.name = "api/chat", .count_param = "messages", .parse = oll_chat_parse,
                                              .tools = &serve_tools_openai, .round_calls = ollama_round_calls,
                                              .round_next = ollama_round_next, OLLAMA_OPS};
static const serve_protocol proto_oll_generate = {.name = "api/generate", .count_param = "prompt",
                                                  .parse = oll_generate_parse, OLLAMA_OPS};

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

/* POST on a generating route: the request in its protocol's shapes (the route's
 * serve_protocol), one generation path for all of them. */
static enum MHD_Result answer_generate(struct MHD_Connection *c, serve_server *s, conn *cn) {
  const serve_protocol *pr = cn->route->proto;
  int proto = pr->shape;
  double t0 = oll_now();
  serve_engine *e = s->engine;
  job *j = calloc(1, sizeof *j);
  serve_fail f;
  if (!j) {
    serve_fail_set(&f, 500, "server_error", NULL, NULL, "out of memory");
    return send_fail_as(c, &f, NULL, proto);
  }
  http_stream_init(&j->st, s->http);
  pthread_mutex_init(&j->gen_mu, NULL);
  pthread_cond_init(&j->gen_cv, NULL);
  j->srv = s;
  j->proto = pr;
  j->keep_alive_s = -1;
  j->t0 = t0;
  j->t_start = cn->t_start;
  j->route_path = cn->route_path;
  j->fd = http_conn_fd(c);
  /* the server's own tools (serve/tools.h) join the request's tools, in the protocol's dialect */
  char *own = NULL;
  herr ierr = {0};
  if (pr->tools && s->ntools &&
      serve_tools_inject(s->tools, s->ntools, pr->tools, hbuf_str(&cn->body), cn->body.len, &own, &j->tools_added, &ierr)) {
    serve_fail_set(&f, 500, "server_error", NULL, NULL, "%s", ierr.msg);
    goto refuse;
  }
  int prc = own ? pr->parse(j, own, strlen(own), &f) : pr->parse(j, hbuf_str(&cn->body), cn->body.len, &f);
  free(own);
  if (prc) goto refuse;
  for (int i = 0; i < s->ntools; i++)
    if ((j->tools_added >> i) & 1u) j->hidden[j->nhidden++] = s->tools[i].name;
  serve_kind kind = j->req.kind;
  if (j->load_only) { /* a request to load (or unload) the model: nothing to generate (Ollama's) */
    if (model_unknown(s, &j->req, proto, &e, &f)) goto refuse;
    bool unload = j->keep_alive_s == 0; /* keep_alive 0 with no prompt: Ollama's unload request */
    if (!(unload && e->is_loaded && !e->is_loaded(e->impl))) {
      if (hold(e, &f)) goto refuse;
      unhold(e, j->keep_alive_s);
    }
    hbuf b = {0};
    pr->load_body(j, unload ? "unload" : "load", &b);
    job_free(j);
    return http_send_hbuf(c, &b);
  }
  if (model_unknown(s, &j->req, proto, &e, &f)) goto refuse;
  j->engine = e;
  j->req.sampling.priority = cn->priority;
  double before_hold = oll_now();
  if (hold(e, &f)) goto refuse;
  j->held = e->acquire != NULL;
  j->load_s = j->held ? oll_now() - before_hold : 0; /* a model loaded on first use: the wait for it */
  const char *param = kind == SERVE_CHAT ? pr->count_param : "prompt";
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
  int copies = j->req.n < 1 ? 1 : j->req.n; /* (1 where the protocol has no n) */
  if (kind == SERVE_COMPLETION && j->req.best_of > copies) copies = j->req.best_of;
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
    if (j->num_ctx > 0 && ntok + want > j->num_ctx) {
      serve_fail_set(&f, 400, "invalid_request_error", "options.num_ctx", "context_length_exceeded",
                     "options.num_ctx is %lld tokens, but the prompt has %lld and num_predict asks for %lld",
                     (long long)j->num_ctx, (long long)ntok, (long long)(j->req.sampling.max_tokens > 0 ? want : 0));
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
  j->req.sampling.trace_label = j->reply.id; /* names the request in a trace (reply_init may name another) */
  if (pr->reply_init(j, id_seed, &f)) goto refuse;
  if (j->parse) j->req.sampling.skip_special = !needs_specials(&j->tc);
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
    return http_send_json(c, 200, o);
  }
  json_t *o = !del && s->responses ? resp_store_get(s->responses, id, NULL) : NULL;
  if (o) return http_send_json(c, 200, o);
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
      return http_send_hbuf(c, &b);
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
      return http_send_hbuf(c, &b);
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
    return http_send_hbuf(c, &b);
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
      return http_send_hbuf(c, &b);
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
  if (!conn_post(cn)) {
    int n = e->adapter_list(e->impl, NULL, 0);
    hearth_adapter_info *a = calloc((size_t)(n > 0 ? n : 1), sizeof *a);
    if (!a) return MHD_NO;
    n = e->adapter_list(e->impl, a, n);
    json_t *o = adapters_list_json(a, n);
    free(a);
    return http_send_json(c, 200, o);
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
    r = http_send_json(c, 200, adapters_one_json(&info));
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
  return http_send_json(c, 200, o);
}

/* POST /v1/messages/count_tokens: the rendered prompt's token count (with the server's own tools,
 * as /v1/messages would add them). */
static enum MHD_Result answer_count_tokens(struct MHD_Connection *c, serve_server *s, conn *cn) {
  serve_engine *e = s->engine;
  serve_request req;
  serve_fail f;
  char *own = NULL;
  unsigned added = 0;
  herr ierr = {0};
  if (s->ntools &&
      serve_tools_inject(s->tools, s->ntools, &anth_tools_dialect, hbuf_str(&cn->body), cn->body.len, &own, &added, &ierr)) {
    serve_fail_set(&f, 500, "server_error", NULL, NULL, "%s", ierr.msg);
    return send_fail_as(c, &f, NULL, PROTO_ANTHROPIC);
  }
  int prc = own ? anth_request_parse(own, strlen(own), true, &req, &f)
                : anth_request_parse(hbuf_str(&cn->body), cn->body.len, true, &req, &f);
  free(own);
  if (prc) return send_fail_as(c, &f, NULL, true);
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
    rc = b.oom ? MHD_NO : http_send(c, 200, "application/json", hbuf_str(&b), b.len, NULL);
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
  return http_send_json(c, 200, json_pack("{s:s, s:s}", "version", OLL_API_VERSION, "hearth", HEARTH_VERSION));
}

static enum MHD_Result answer_oll_tags(struct MHD_Connection *c, serve_server *s) {
  json_t *all = all_facts(s), *models = json_array(), *m;
  size_t i;
  json_array_foreach(all, i, m)
    json_array_append_new(models, oll_model_object(m, json_string_value(json_object_get(m, "name")), false, 0));
  json_decref(all);
  return http_send_json(c, 200, json_pack("{s:o}", "models", models));
}

static enum MHD_Result answer_oll_ps(struct MHD_Connection *c, serve_server *s) {
  json_t *models = json_array();
  for (int k = 0; k < s->nengines; k++) {
    if (s->engines[k]->is_loaded && !s->engines[k]->is_loaded(s->engines[k]->impl)) continue;
    json_t *f = served_facts(s, k);
    json_array_append_new(models, oll_model_object(f, s->engines[k]->model_id, true, s->engines[k]->context_length));
    json_decref(f);
  }
  return http_send_json(c, 200, json_pack("{s:o}", "models", models));
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
  return o ? http_send_json(c, 200, o) : send_oll_fail(c, &f);
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
    return http_send_hbuf(c, &b);
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
    return http_send(c, 200, "application/json", "", 0, NULL);
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
  pthread_mutex_lock(&j->st.mu);
  j->pull_running = false;
  bool orphan = j->st.orphan;
  pthread_mutex_unlock(&j->st.mu);
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
    rc = run_pull(s, name, NULL, &f) ? send_oll_fail(c, &f) : http_send_json(c, 200, json_pack("{s:s}", "status", "success"));
  } else {
    job *j = calloc(1, sizeof *j);
    if (!j || !(j->pull_name = strdup(name))) {
      free(j);
      serve_fail_set(&f, 500, "server_error", NULL, NULL, "out of memory");
      rc = send_oll_fail(c, &f);
    } else {
      http_stream_init(&j->st, s->http);
      pthread_mutex_init(&j->gen_mu, NULL);
      pthread_cond_init(&j->gen_cv, NULL);
      j->srv = s;
      j->proto = &proto_oll_generate;
      j->fd = http_conn_fd(c);
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
    rc = http_send_json(c, 200, model_object(e, e->model_id));
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

/* The Batch API's routes answer 400 batch_api_disabled without a state directory: true with that sent. */
static bool batch_api_off(struct MHD_Connection *c, serve_server *s, enum MHD_Result *rc) {
  if (s->files && s->batches) return false;
  serve_fail f;
  serve_fail_set(&f, 400, "invalid_request_error", NULL, "batch_api_disabled",
                 "The Batch API keeps its files and batches on disk: start hearth serve with --state-dir DIR");
  *rc = send_fail(c, &f, NULL);
  return true;
}

/* A store's answer: the object o (consumed) when st is 200, else the refusal in f. */
static enum MHD_Result batch_api_answer(struct MHD_Connection *c, int st, json_t *o, serve_fail *f) {
  if (st == 200 && o) return http_send_json(c, 200, o);
  json_decref(o);
  if (st == 200) serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  return send_fail(c, f, NULL);
}

/* POST /v1/files (an upload) and GET /v1/files (the list). */
static enum MHD_Result answer_files(struct MHD_Connection *c, serve_server *s, conn *cn) {
  enum MHD_Result rc;
  if (batch_api_off(c, s, &rc)) return rc;
  serve_fail f;
  json_t *o = NULL;
  int st;
  int64_t limit;
  if (conn_post(cn)) {
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    st = file_store_upload(s->files, ct, hbuf_str(&cn->body), cn->body.len, &o, &f);
  } else {
    const char *order = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order");
    const char *after = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after");
    if (order && strcmp(order, "asc") && strcmp(order, "desc"))
      st = serve_bad(&f, "order", "'order' is '%.40s'; it must be \"asc\" or \"desc\"", order);
    else if (!(st = query_int(c, "limit", 10000, &limit, &f)))
      st = file_store_list(s->files, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "purpose"), after, limit,
                           order && !strcmp(order, "asc"), &o, &f);
  }
  return batch_api_answer(c, st, o, &f);
}

/* GET / DELETE /v1/files/{id}. */
static enum MHD_Result answer_file(struct MHD_Connection *c, serve_server *s, conn *cn) {
  enum MHD_Result rc;
  if (batch_api_off(c, s, &rc)) return rc;
  serve_fail f;
  json_t *o = NULL;
  char id[256];
  route_id(cn, "/v1/files/", NULL, id, sizeof id);
  int st = conn_del(cn) ? file_store_delete(s->files, id, &o, &f) : file_store_get(s->files, id, &o, &f);
  return batch_api_answer(c, st, o, &f);
}

/* GET /v1/files/{id}/content. */
static enum MHD_Result answer_file_content(struct MHD_Connection *c, serve_server *s, conn *cn) {
  enum MHD_Result rc;
  if (batch_api_off(c, s, &rc)) return rc;
  serve_fail f;
  char id[256];
  route_id(cn, "/v1/files/", "/content", id, sizeof id);
  char *data = NULL;
  size_t len = 0;
  int st = file_store_read(s->files, id, &data, &len, &f);
  if (st != 200) return batch_api_answer(c, st, NULL, &f);
  rc = http_send(c, 200, "application/octet-stream", data, len, NULL);
  free(data);
  return rc;
}

/* POST /v1/batches (create) and GET /v1/batches (the list). */
static enum MHD_Result answer_batches(struct MHD_Connection *c, serve_server *s, conn *cn) {
  enum MHD_Result rc;
  if (batch_api_off(c, s, &rc)) return rc;
  serve_fail f;
  json_t *o = NULL;
  int st;
  int64_t limit;
  const char *after = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after");
  if (conn_post(cn)) st = batch_store_create(s->batches, hbuf_str(&cn->body), cn->body.len, &o, &f);
  else if (!(st = query_int(c, "limit", 20, &limit, &f))) st = batch_store_list(s->batches, after, limit, &o, &f);
  return batch_api_answer(c, st, o, &f);
}

/* GET /v1/batches/{id}. */
static enum MHD_Result answer_batch(struct MHD_Connection *c, serve_server *s, conn *cn) {
  enum MHD_Result rc;
  if (batch_api_off(c, s, &rc)) return rc;
  serve_fail f;
  json_t *o = NULL;
  char id[256];
  route_id(cn, "/v1/batches/", NULL, id, sizeof id);
  int st = batch_store_get(s->batches, id, &o, &f);
  return batch_api_answer(c, st, o, &f);
}

/* POST /v1/batches/{id}/cancel. */
static enum MHD_Result answer_batch_cancel(struct MHD_Connection *c, serve_server *s, conn *cn) {
  enum MHD_Result rc;
  if (batch_api_off(c, s, &rc)) return rc;
  serve_fail f;
  json_t *o = NULL;
  char id[256];
  route_id(cn, "/v1/batches/", "/cancel", id, sizeof id);
  int st = batch_store_cancel(s->batches, id, &o, &f);
  return batch_api_answer(c, st, o, &f);
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

/* The handlers of the routes whose answers take other arguments. */
static enum MHD_Result route_page(struct MHD_Connection *c, serve_server *s, conn *cn) {
  (void)s, (void)cn;
  return http_send(c, 200, "text/html; charset=utf-8", serve_page_html, serve_page_html_len, NULL);
}
static enum MHD_Result route_health(struct MHD_Connection *c, serve_server *s, conn *cn) {
  (void)cn;
  return answer_health(c, s);
}
static enum MHD_Result route_index_answer(struct MHD_Connection *c, serve_server *s, conn *cn) {
  (void)cn;
  return answer_index(c, s);
}
static enum MHD_Result route_models(struct MHD_Connection *c, serve_server *s, conn *cn) {
  return answer_models(c, s, cn->proto == PROTO_ANTHROPIC);
}
static enum MHD_Result route_model(struct MHD_Connection *c, serve_server *s, conn *cn) {
  return answer_model(c, s, cn->path + 11, cn->proto == PROTO_ANTHROPIC);
}
static enum MHD_Result route_model_load(struct MHD_Connection *c, serve_server *s, conn *cn) {
  return answer_model_load(c, s, cn, true);
}
static enum MHD_Result route_model_unload(struct MHD_Connection *c, serve_server *s, conn *cn) {
  return answer_model_load(c, s, cn, false);
}
static enum MHD_Result route_stats(struct MHD_Connection *c, serve_server *s, conn *cn) {
  (void)cn;
  return answer_stats(c, s);
}
static enum MHD_Result route_metrics(struct MHD_Connection *c, serve_server *s, conn *cn) {
  (void)cn;
  return answer_metrics(c, s);
}
static enum MHD_Result route_fit(struct MHD_Connection *c, serve_server *s, conn *cn) {
  (void)cn;
  return answer_fit(c, s);
}
static enum MHD_Result route_response(struct MHD_Connection *c, serve_server *s, conn *cn) {
  return answer_stored_response(c, s, cn->path + 14, conn_del(cn));
}
static enum MHD_Result route_adapter(struct MHD_Connection *c, serve_server *s, conn *cn) {
  return answer_adapter_delete(c, s, cn->path + 13);
}
static enum MHD_Result route_oll_version(struct MHD_Connection *c, serve_server *s, conn *cn) {
  (void)s, (void)cn;
  return answer_oll_version(c);
}
static enum MHD_Result route_oll_tags(struct MHD_Connection *c, serve_server *s, conn *cn) {
  (void)cn;
  return answer_oll_tags(c, s);
}
static enum MHD_Result route_oll_ps(struct MHD_Connection *c, serve_server *s, conn *cn) {
  (void)cn;
  return answer_oll_ps(c, s);
}
static enum MHD_Result route_oll_embed(struct MHD_Connection *c, serve_server *s, conn *cn) {
  return answer_oll_embed(c, s, cn, false);
}
static enum MHD_Result route_oll_embeddings(struct MHD_Connection *c, serve_server *s, conn *cn) {
  return answer_oll_embed(c, s, cn, true);
}
static enum MHD_Result route_oll_refused(struct MHD_Connection *c, serve_server *s, conn *cn) {
  (void)s;
  return answer_oll_refused(c, cn);
}

static const route_def routes[] = {
    {"GET", "/", route_page, .open = true, .what = "the chat page"},
    {"GET", "/health", route_health, .open = true, .what = "liveness"},
    {"GET", "/v1", route_index_answer, .what = "this index"},
    {"GET", "/v1/models", route_models, .what = "the loaded model"},
    {"GET", "/v1/models/{id}", route_model, .what = "one served model name"},
    {"POST", "/v1/models/load", route_model_load, .slow = true, .what =
     "loads a model loaded on first use now: {\"model\"} (waits for it; the model object with its state)"},
    {"POST", "/v1/models/unload", route_model_unload, .slow = true, .what =
     "unloads a model loaded on first use: {\"model\"} (now when idle, else once its requests are done)"},
    {"POST", "/v1/chat/completions", answer_generate, .proto = &proto_chat, .slow = true, .what = "chat completions (JSON or SSE with stream: true)"},
    {"POST", "/v1/completions", answer_generate, .proto = &proto_completions, .slow = true, .what = "text completions (JSON or SSE with stream: true)"},
    {"POST", "/v1/responses", answer_generate, .proto = &proto_responses, .slow = true, .what =
     "OpenAI Responses API (JSON or SSE with stream: true; previous_response_id)"},
    {"GET", "/v1/responses/{id}", route_response, .what = "a stored response"},
    {"DELETE", "/v1/responses/{id}", route_response, .what = "deletes a stored response"},
    {"POST", "/v1/messages", answer_generate, .proto = &proto_messages, .slow = true, .what = "Anthropic Messages API (JSON or SSE with stream: true)"},
    {"POST", "/v1/messages/count_tokens", answer_count_tokens, .slow = true, .what = "Anthropic token count of a Messages request"},
    {"POST", "/v1/embeddings", answer_embeddings, .slow = true, .what =
     "embeddings: the last token's final hidden state, L2-normalised (float or base64)"},
    {"POST", "/v1/signal", answer_signal, .slow = true, .what = "the next token's log-probability histogram, entropy and best tokens"},
    {"GET", "/v1/adapters", answer_adapters, .slow = true, .what = "the loaded LoRA adapters (a request picks one with \"adapter\")"},
    {"POST", "/v1/adapters", answer_adapters, .slow = true, .what = "loads a PEFT LoRA adapter folder: {\"name\", \"path\"}"},
    {"DELETE", "/v1/adapters/{id}", route_adapter, .slow = true, .what =
     "unloads an adapter (requests running under it finish first; its memory is freed after the last)"},
    {"GET", "/stats", route_stats, .what = "serving counters as JSON (requests, KV blocks, prefix cache, tokens/s)"},
    {"GET", "/metrics", route_metrics, .what = "serving counters in the Prometheus text format"},
    {"POST", "/infill", answer_generate, .proto = &proto_infill, .slow = true, .what =
     "fill-in-the-middle as llama.cpp's (input_prefix, input_suffix, input_extra, prompt; models with FIM tokens)"},
    {"GET", "/fit", route_fit, .slow = true, .what =
     "the served model's memory contract: weights, KV bytes per token, fit, largest context, predicted tok/s "
     "(?ctx=N&batch=B)"},
    {"POST", "/tokenize", answer_tokenize, .slow = true, .what =
     "text to token ids: {\"content\" (or \"prompt\", or chat \"messages\"), \"add_special\", \"with_pieces\"}"},
    {"POST", "/detokenize", answer_detokenize, .slow = true, .what = "token ids to text: {\"tokens\": [ids]}"},
    {"GET", "/api/version", route_oll_version, .what = "Ollama API: the API version"},
    {"GET", "/api/tags", route_oll_tags, .slow = true, .what = "Ollama API: the models hearth can name (the served one first)"},
    {"POST", "/api/show", answer_oll_show, .slow = true, .what = "Ollama API: a model's details and capabilities"},
    {"GET", "/api/ps", route_oll_ps, .what = "Ollama API: the loaded model"},
    {"POST", "/api/chat", answer_generate, .proto = &proto_oll_chat, .slow = true, .what = "Ollama API: chat (NDJSON stream unless stream: false)"},
    {"POST", "/api/generate", answer_generate, .proto = &proto_oll_generate, .slow = true, .what = "Ollama API: generate (NDJSON stream unless stream: false)"},
    {"POST", "/api/embed", route_oll_embed, .slow = true, .what = "Ollama API: embeddings of input"},
    {"POST", "/api/embeddings", route_oll_embeddings, .slow = true, .what = "Ollama API: the embedding of prompt (legacy)"},
    {"POST", "/api/pull", answer_oll_pull, .slow = true, .what = "Ollama API: fetches a model as hearth get (progress as NDJSON)"},
    {"DELETE", "/api/delete", answer_oll_delete, .slow = true, .what = "Ollama API: removes a model as hearth rm"},
    {"POST", "/api/create", route_oll_refused, .what = "Ollama API: refused (hearth makes no models from Modelfiles)"},
    {"POST", "/api/copy", route_oll_refused, .what = "Ollama API: refused (hearth scan names models)"},
    {"POST", "/api/push", route_oll_refused, .what = "Ollama API: refused (hearth pushes to no registry)"},
    {"POST", "/api/blobs/{id}", route_oll_refused, .what = "Ollama API: refused (no Modelfile blobs)"},
    {"GET", "/api/blobs/{id}", route_oll_refused, .what = "Ollama API: refused (no Modelfile blobs)"},
    {"POST", "/v1/files", answer_files, .slow = true, .upload = true, .what =
     "uploads a Batch API input file: multipart/form-data with purpose \"batch\" and the JSONL file (--state-dir)"},
    {"GET", "/v1/files", answer_files, .slow = true, .upload = true, .what = "the stored files, newest first (?purpose, ?after, ?limit, ?order)"},
    {"GET", "/v1/files/{id}/content", answer_file_content, .slow = true, .what = "a file's content"},
    {"GET", "/v1/files/{id}", answer_file, .slow = true, .what = "a file object"},
    {"DELETE", "/v1/files/{id}", answer_file, .slow = true, .what = "deletes a file"},
    {"POST", "/v1/batches", answer_batches, .slow = true, .what =
     "creates a batch: {\"input_file_id\", \"endpoint\", \"completion_window\": \"24h\", \"metadata\"}; its rows run "
     "at low priority"},
    {"GET", "/v1/batches", answer_batches, .slow = true, .what = "the batches, newest first (?after, ?limit)"},
    {"POST", "/v1/batches/{id}/cancel", answer_batch_cancel, .slow = true, .what = "cancels a batch (rows answered so far are kept)"},
    {"GET", "/v1/batches/{id}", answer_batch, .slow = true, .what = "a batch object"},
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
static void classify(void *ctx, struct MHD_Connection *c, const char *url, conn *cn) {
  serve_server *s = ctx;
  const char *path = cn->path, *method = cn->method;
  bool anthropic = strcmp(path, "/v1/messages") == 0 || strncmp(path, "/v1/messages/", 13) == 0;
  /* /v1/models asked by an Anthropic client (which always sends anthropic-version): its shapes */
  if ((strcmp(path, "/v1/models") == 0 || strncmp(path, "/v1/models/", 11) == 0) &&
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "anthropic-version"))
    anthropic = true;
  cn->proto = strncmp(path, "/api/", 5) == 0 ? PROTO_OLLAMA : anthropic ? PROTO_ANTHROPIC : PROTO_OPENAI;
  cn->fail_json = proto_fail_fn(cn->proto);
  if (http_draining(s->http)) {
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
  cn->route = rt;
  cn->route_path = rt->path;
  cn->slow = rt->slow;
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
  if (rt->upload && conn_post(cn) && s->files) /* the file, and the form around it */
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
    } else if (v > cn->max_body && rt->upload && s->files) {
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

/* Answers a whole request (its body is in cn->body): its route's handler. */
static enum MHD_Result answer_route(void *ctx, struct MHD_Connection *c, conn *cn) {
  return cn->route ? cn->route->answer(c, ctx, cn) : MHD_NO;
}

/* One line on stderr per request, and its count by route and status. */
static void request_done(serve_server *s, const char *method, const char *route, unsigned status, double t_start,
                         int64_t prompt_tokens, int64_t completion_tokens, double ttft) {
  serve_metrics_request(s->metrics, route, (int)(status ? status : 499));
  char ttft_s[32] = "-";
  if (ttft >= 0) snprintf(ttft_s, sizeof ttft_s, "%.1fms", ttft * 1000);
  HLOG_INFO("request: %s %s %u prompt_tokens=%lld completion_tokens=%lld ttft=%s duration=%.1fms", method,
            route ? route : "-", status ? status : 499, (long long)prompt_tokens, (long long)completion_tokens, ttft_s,
            (http_now() - t_start) * 1000);
}

/* A request is over: its log line and count, unless its generation gave them (job_done). */
static void request_over(void *ctx, conn *cn) {
  if (!cn->job_owned) request_done(ctx, cn->method, cn->route_path, cn->status, cn->t_start, 0, 0, -1);
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
  if ((rc = batch_row_target_set(&t, host, http_port(s->http), cfg->api_key, err))) return rc;
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
  s->api_key = cfg->api_key ? strdup(cfg->api_key) : NULL;
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
  unsigned max_conn = cfg->max_connections > 0 ? (unsigned)cfg->max_connections : DEFAULT_MAX_CONNECTIONS;
  http_config hc = {
      .addr = ai->ai_addr,
      .ipv6 = ai->ai_family == AF_INET6,
      .port = cfg->port,
      .host = host,
      .max_connections = max_conn,
      .max_per_client = cfg->max_per_client > 0         ? (unsigned)cfg->max_per_client
                        : max_conn / PER_CLIENT_SHARE > 0 ? max_conn / PER_CLIENT_SHARE
                                                          : 1,
      .idle_timeout_s = cfg->idle_timeout_s > 0 ? cfg->idle_timeout_s : DEFAULT_IDLE_TIMEOUT_S,
      .header_timeout_s = cfg->header_timeout_s > 0 ? cfg->header_timeout_s : DEFAULT_HEADER_TIMEOUT_S,
      .body_timeout_s = cfg->body_timeout_s > 0 ? cfg->body_timeout_s : DEFAULT_BODY_TIMEOUT_S,
      .keepalive_s = (cfg->keepalive_ms > 0 ? cfg->keepalive_ms : DEFAULT_KEEPALIVE_MS) / 1000.0,
      .cors = cfg->cors_origin,
  };
  http_app app = {.ctx = s, .classify = classify, .answer = answer_route, .done = request_over};
  pthread_mutex_init(&s->engine_lock, NULL);
  pthread_mutex_init(&s->jobs_mu, NULL);
  atomic_init(&s->next_id, (uint64_t)time(NULL));
  int rc = http_start(&s->http, &hc, &app, err);
  freeaddrinfo(ai);
  if (rc) {
    serve_stop(s);
    return rc;
  }
  if (cfg->state_dir && batch_api_start(s, cfg, host, err)) {
    serve_stop(s);
    return err->code ? err->code : HEARTH_EIO;
  }
  *out = s;
  return 0;
}

int serve_port(const serve_server *s) { return http_port(s->http); }

uint64_t serve_keepalives_sent(serve_server *s) { return http_keepalives_sent(s->http); }

void serve_stop(serve_server *s) {
  if (!s) return;
  /* the batch runner first: its rows in flight are cut, and kept for a restart */
  batch_store_close(s->batches);
  s->batches = NULL;
  /* No connection may be suspended when the daemon stops: new answering threads are refused,
   * the generations running are cancelled, then http_stop waits for the answering threads
   * (each resumes its connection) and wakes the parked streams. */
  if (s->http) http_halt(s->http);
  pthread_mutex_lock(&s->jobs_mu);
  for (job *j = s->jobs; j; j = j->jnext) cancel_set(j);
  pthread_mutex_unlock(&s->jobs_mu);
  http_stop(s->http);
  pthread_mutex_destroy(&s->engine_lock);
  pthread_mutex_destroy(&s->jobs_mu);
  free(s->api_key);
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
  http_drain_begin(s->http);
}

int64_t serve_in_flight(serve_server *s) { return http_in_flight(s->http); }

int serve_drain_cancel(serve_server *s) {
  http_drain_set(s->http, 2); /* a generation that starts from now is cut at once */
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

static int drain_cut(void *ctx) { return serve_drain_cancel(ctx); }

int serve_drain(serve_server *s, double timeout_s, const sigset_t *sigs) {
  serve_drain_begin(s);
  return http_drain(s->http, timeout_s, sigs, DRAIN_GRACE_S, drain_cut, s);
}
