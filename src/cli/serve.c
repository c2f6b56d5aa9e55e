/* serve.c — `hearth serve`: load one model and answer OpenAI-compatible HTTP
 * requests (and the chat page) until interrupted. Owns the options and the
 * process's signal handling; the server itself is src/serve/ (serve/server.h,
 * serve/engine.h), which reaches the engine only through hearth.h. The Ollama
 * API's models beyond the served one (its list, pull and delete) come from
 * here (serve_models): hearth ls's list, hearth get, hearth rm (hub/); and
 * --memory's memory_search tool (memory/search.h over the first model's
 * embeddings), which the server runs itself (serve/tools.h). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "cli/cli.h"
#include "engine/kv_disk.h"
#include "hub/hub.h"
#include "memory/search.h"

#define SERVE_MAX_MODELS 64
#define SERVE_MAX_DIRS 8
#include "serve/engine.h"
#include "serve/server.h"

/* Every option serve takes: the usage line and the option list of --help are
 * printed from this table, and an option missing from it is refused as
 * unknown before its parser is reached. help: lines after the first are
 * indented under it. */
typedef struct serve_opt {
  const char *name, *arg; /* arg NULL: a switch */
  bool repeat;            /* may be given more than once */
  const char *help;
} serve_opt;

static const serve_opt OPTS[] = {
    {"--model", "PATH", true,
     "a Hugging Face model folder or a .gguf file, a registry name or a Hub id\n"
     "(default: the built-in model). Repeatable: every model is loaded and a\n"
     "request's \"model\" picks one by its name (the name --model gave, else the\n"
     "folder's or file's); a request naming none gets the first, and so do the\n"
     "routes that name no model (/stats, /metrics, /fit, /tokenize, /v1/signal,\n"
     "adapters); --kv-store and --trace-file go with one model only"},
    {"--models-dir", "DIR", true,
     "serve every model under DIR too (as hearth scan finds them: folders with\n"
     "config.json and safetensors, .gguf files), each named after its folder or\n"
     "file and loaded on first use (repeatable); without --model the first\n"
     "found stays loaded"},
    {"--model-memory", "BYTES", false,
     "with several --model: the first stays loaded and the others load on\n"
     "first use, the least recently used idle ones unloaded so that the loaded\n"
     "models' files take at most BYTES; a model that cannot fit is refused\n"
     "(400 memory_admission, with the numbers); a request for a model being\n"
     "loaded waits for it"},
    {"--model-ttl", "SECONDS", false,
     "with several --model: a model after the first unloads once idle this\n"
     "long (it loads again on its next request)"},
    {"--host", "ADDR", false, "address to listen on (default 127.0.0.1)"},
    {"--port", "N", false, "port (default 8080; 0 picks a free one)"},
    {"--api-key", "KEY", false, "require 'Authorization: Bearer KEY' (also $HEARTH_API_KEY)"},
    {"--max-body", "BYTES", false, "largest request body accepted (default 16777216)"},
    {"--threads", "N", false, "compute threads (default: one per core)"},
    {"--max-batch", "N", false, "requests running in one batch at most (default 64); more wait"},
    {"--prefill-chunk", "N", false, "prompt tokens one request feeds per step (default 512)"},
    {"--max-num-batched-tokens", "N", false,
     "tokens one step feeds in all: a row for every decoding\n"
     "request first, prompts' chunks in what is left (default: the larger\n"
     "of --prefill-chunk and --max-batch; at least --max-batch)"},
    {"--kv-cache-mem", "BYTES", false,
     "KV cache pool size (default: a quarter of physical memory,\n"
     "at most 4 GiB and at most max-batch full-context requests)"},
    {"--memory-budget", "BYTES", false,
     "the most the KV cache may use; a request that could never\n"
     "fit is refused with 400 memory_admission before any work"},
    {"--served-model-name", "NAME", true,
     "another name the model answers to (repeatable; '*' accepts any\n"
     "name); a request naming another model gets 404 model_not_found"},
    {"--cors", "ORIGIN", false,
     "let browser pages from ORIGIN ('*': any) call the API (CORS headers,\n"
     "preflight answered)"},
    {"--responses-max", "N", false,
     "Responses API: responses kept for GET and previous_response_id (default\n"
     "1000; the oldest go first)"},
    {"--responses-max-bytes", "BYTES", false, "... their stored JSON at most (default 256M)"},
    {"--responses-ttl", "SECONDS", false, "... kept this long (default 3600; 0 = forever)"},
    {"--trace-file", "PATH", false,
     "write per-request spans (queue wait, prefix-cache lookup, prefill chunks,\n"
     "decode steps, detokenize) and engine steps to PATH as Chrome trace-event\n"
     "JSON; open it in https://ui.perfetto.dev or chrome://tracing. Complete\n"
     "when the server stops (SIGINT/SIGTERM); loadable even if it dies"},
    {"--trace-max-bytes", "BYTES", false, "stop writing the trace past this size (default 256M)"},
    {"--kv-store", "DIR", false,
     "keep the prefix cache's full KV blocks in DIR across restarts: blocks\n"
     "evicted from the cache are written there, every cached block when the\n"
     "server stops; a prompt with a stored prefix reads them back (cached_tokens).\n"
     "Blocks of another model, KV format or store version are ignored.\n"
     "Writes run on a thread of the store's own; /stats and /metrics count\n"
     "them (kv_store)"},
    {"--kv-store-max", "BYTES", false, "the most DIR may hold (default 4G; least recently used out)"},
    {"--drain-timeout", "SECONDS", false,
     "on SIGTERM / SIGINT: new requests get 503, running ones get this\n"
     "long to finish (default 30), then end as cut by length (streams with\n"
     "their finish event and [DONE]); then the KV store is written and the\n"
     "server exits 0. A second signal cuts them at once"},
    {"--max-connections", "N", false,
     "open connections at most (default 4096); more are refused at once, and\n"
     "the process's descriptor limit is raised toward the hard limit to fit them"},
    {"--max-connections-per-address", "N", false,
     "open connections from one client address at most (default: an eighth\n"
     "of --max-connections), so a few addresses cannot take them all"},
    {"--idle-timeout", "SECONDS", false,
     "a connection that sends no request this long is closed (default 10)"},
    {"--header-timeout", "SECONDS", false,
     "a connection whose request line and headers are not all in this\n"
     "long after it opens is closed, however steadily they trickle in (default 10)"},
    {"--body-timeout", "SECONDS", false,
     "a request body that sends nothing this long is dropped (default 60)"},
    {"--adapter", "NAME=DIR", true,
     "load the PEFT LoRA adapter folder DIR as NAME (repeatable); a request picks\n"
     "it with \"adapter\": \"NAME\" (\"a+b\" stacks two); DIR may be anywhere"},
    {"--adapter-dir", "DIR", false,
     "POST /v1/adapters loads adapters from folders inside DIR only (a name relative\n"
     "to it or a path under it; symlinks may not lead out). Without it the API loads\n"
     "none (403); GET and DELETE /v1/adapters work either way"},
    {"--allow-local-media", NULL, false,
     "media parts (image_url, input_audio, video_url, Anthropic image\n"
     "sources) may name local files (a path or file:// URL); data URLs always work"},
    {"--allow-remote-media", NULL, false,
     "media parts may be http(s) URLs, which the server fetches from public\n"
     "addresses only (each redirect checked again, at most 5); any failure is\n"
     "one message to the client, the reason in the server's log"},
    {"--allow-private-media-hosts", NULL, false,
     "... and from loopback, private (10/8, 172.16/12, 192.168/16,\n"
     "100.64/10, fc00::/7), link-local (169.254/16, fe80::/10) and other\n"
     "non-public addresses: only where every client may reach them"},
    {"--max-media-bytes", "BYTES", false, "the largest encoded image, sound or video (default 32M)"},
    {"--state-dir", "DIR", false,
     "the OpenAI Batch API (/v1/files, /v1/batches) keeps its files and batches in\n"
     "DIR (made when missing; one server per DIR); a restart resumes the batches\n"
     "that had not ended, without running their answered rows again. Without it\n"
     "the Batch API answers 400 batch_api_disabled"},
    {"--max-file-size", "BYTES", false, "the largest file /v1/files takes (default 200M; larger: 413)"},
    {"--batch-concurrency", "N", false,
     "batch rows in flight at once (default 8, at most 256); they run at low priority:\n"
     "the scheduler admits interactive requests before them"},
    {"--memory", "DIR", false,
     "offer chat requests (/v1/chat/completions, /v1/responses, /v1/messages,\n"
     "/api/chat) the memory_search tool over the memory wiki DIR, ranked by the\n"
     "(first) model's embeddings: the server runs the model's calls of it and goes\n"
     "on to the answer, the calls and their results shown in the protocol's way\n"
     "(\"tool_exchange\"; Anthropic's server_tool_use blocks; Responses'\n"
     "memory_search_call items) (requests of one choice that define no tool of\n"
     "that name; a stream gets every round)"},
};
#define N_OPTS ((int)(sizeof OPTS / sizeof OPTS[0]))

/* The table's entry for argv's option ("--name" or "--name=value"); NULL when none. */
static const serve_opt *serve_opt_find(const char *arg) {
  size_t n = strcspn(arg, "=");
  for (int i = 0; i < N_OPTS; i++)
    if (strlen(OPTS[i].name) == n && !strncmp(OPTS[i].name, arg, n)) return &OPTS[i];
  return NULL;
}

static void serve_usage(void) {
  const char *lead = "usage: hearth serve";
  int col = printf("%s", lead);
  for (int i = 0; i < N_OPTS; i++) {
    char one[96];
    int n = snprintf(one, sizeof one, " [%s%s%s]%s", OPTS[i].name, OPTS[i].arg ? " " : "", OPTS[i].arg ? OPTS[i].arg : "",
                     OPTS[i].repeat ? "..." : "");
    if (col + n > 118) col = printf("\n%*s", (int)strlen(lead), "") - 1;
    col += printf("%s", one);
  }
  printf("\n\n"
         "Serves one model (or several) over HTTP: /v1/chat/completions, /v1/completions, /v1/responses,\n"
         "/v1/messages (Anthropic), /api/chat, /api/generate and the rest of the Ollama API, /v1/models,\n"
         "/v1/models/load, /v1/models/unload, /v1/embeddings, /v1/signal, /v1/adapters,\n"
         "/v1/files and /v1/batches (the Batch API, with --state-dir),\n"
         "/tokenize, /detokenize, /infill, /fit, /health, /stats, /metrics, /v1 (every route) and a chat page at /. Concurrent requests are\n"
         "batched into shared forward steps (continuous batching, paged KV cache,\n"
         "automatic prefix caching).\n\n");
  for (int i = 0; i < N_OPTS; i++) {
    char head[96];
    int n = snprintf(head, sizeof head, "  %s%s%s", OPTS[i].name, OPTS[i].arg ? " " : "", OPTS[i].arg ? OPTS[i].arg : "");
    printf("%s%*s", head, n < 20 ? 21 - n : 2, "");
    for (const char *h = OPTS[i].help; *h;) {
      size_t l = strcspn(h, "\n");
      printf("%.*s\n", (int)l, h);
      h += l;
      if (*h == '\n' && *++h) printf("%21s", "");
    }
  }
  printf("BYTES accept a K, M or G suffix (powers of 1024).\n");
}

/* ---- the models of the Ollama API (serve_models): hearth ls, rm and get ---- */

static json_t *models_list(void *ctx) {
  (void)ctx;
  return cli_model_list();
}

static int models_remove(void *ctx, const char *name, herr *err) {
  (void)ctx;
  char done[1200];
  int rc = cli_remove_model(name, done, sizeof done, err);
  if (!rc) HLOG_INFO("serve: %s", done);
  return rc;
}

/* Ollama's clients name Hub models "hf.co/ORG/NAME:QUANT" and add ":latest" to bare names. */
static int models_pull(void *ctx, const char *name, FILE *progress, herr *err) {
  (void)ctx;
  char id[600];
  if (!strncmp(name, "hf.co/", 6)) name += 6;
  else if (!strncmp(name, "huggingface.co/", 15)) name += 15;
  snprintf(id, sizeof id, "%s", name);
  size_t n = strlen(id);
  if (n > 7 && !strcmp(id + n - 7, ":latest")) id[n - 7] = 0;
  hub_ref ref;
  if (hub_ref_parse(id, &ref, err)) return err->code;
  hub_fetch_opts o = {.select = {.quant = ref.quant}, .progress = progress};
  char *snap = NULL;
  int rc = hub_fetch(&ref, &o, &snap, err);
  free(snap);
  return rc;
}

/* ---- --memory: the memory_search tool the server runs (serve/tools.h) over the first model's embeddings ---- */

static int memory_embed(void *ctx, const char *const *texts, int n, float *out, herr *err) {
  serve_engine *e = ctx;
  serve_embed_input *in = calloc((size_t)n, sizeof *in);
  if (!in) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (int i = 0; i < n; i++) in[i] = (serve_embed_input){.text = (char *)texts[i], .len = strlen(texts[i])};
  int rc = e->embed(e->impl, in, n, NULL, 0, out, NULL, NULL, err);
  free(in);
  return rc;
}

static int64_t memory_result_bytes; /* a result's size at most: half as many bytes as the first model's context has
                                     * tokens, at most 8 KiB */

static int memory_run(void *ctx, const char *args_json, char **result, herr *err) {
  return memsearch_tool_call(ctx, args_json, (int)memory_result_bytes, result, err);
}

/* The wiki at dir searched with e's embeddings (model_path: its files, the index's identity). */
static int memory_open(const char *dir, serve_engine *e, const char *model_path, memsearch **out, herr *err) {
  if (!e->embed || e->embed_dim <= 0) return herr_set(err, HEARTH_EUNSUPPORTED, "%s gives no embeddings", e->model_id);
  uint64_t h = 0;
  int rc = kv_disk_model_identity(model_path, NULL, &h, err);
  if (rc) return rc;
  char ident[64];
  snprintf(ident, sizeof ident, "%016llx %d", (unsigned long long)h, (int)e->embed_dim);
  /* pooled from words for a model that generates (it has the next-token signal), whole texts for an
   * embedding model: as hearth memory search and chat --memory pool them, so they share the index */
  memsearch_embedder emb = {.embed = memory_embed, .ctx = e, .dim = (int)e->embed_dim, .identity = ident,
                            .pool = e->signal ? MEMSEARCH_POOL_WORDS : MEMSEARCH_POOL_TEXT};
  memsearch_stats st;
  if ((rc = memsearch_open(dir, &emb, out, err)) || (rc = memsearch_update(*out, &st, err))) return rc;
  HLOG_INFO("serve: memory %s: %d articles (%d embedded, %d removed)", dir, st.articles, st.embedded, st.removed);
  return 0;
}

/* A model loaded on first use (--model-memory, --model-ttl): where it is and how it loads. */
typedef struct lazy_model {
  const char *path;
  serve_engine_opts eo;
  char id[512];
} lazy_model;

static int open_lazy(void *ctx, serve_engine *out, herr *err) {
  lazy_model *m = ctx;
  return serve_engine_open_opts(m->path, &m->eo, out, err);
}

/* The name a model answers to before it is loaded: what --model called it, else its folder's or
 * file's name (a GGUF file's without .gguf), as the library names it. */
static void model_id_of(const char *path, char *out, size_t cap) {
  const char *named = cli_model_name_of(path);
  if (named) {
    snprintf(out, cap, "%s", named);
    return;
  }
  size_t n = strlen(path);
  while (n > 1 && path[n - 1] == '/') n--;
  size_t start = n;
  while (start > 0 && path[start - 1] != '/') start--;
  if (n - start > 5 && !strncmp(path + n - 5, ".gguf", 5)) n -= 5;
  snprintf(out, cap, "%.*s", (int)(n - start), path + start);
}

/* The models --models-dir finds, appended to the --model ones (paths owned from `first` on). */
typedef struct found_models {
  const char **paths;  /* the --model values, then the paths found */
  int *n;
  int first;           /* the first found: paths from here are malloc'd */
  bool first_set;
  const char *dir;
} found_models;

static int found_add(void *ctx, const char *path) {
  found_models *f = ctx;
  if (!f->first_set) f->first = *f->n, f->first_set = true;
  char id[512], other[512];
  model_id_of(path, id, sizeof id);
  for (int i = 0; i < *f->n; i++) {
    model_id_of(f->paths[i], other, sizeof other);
    if (!strcmp(id, other)) {
      fprintf(stderr, "hearth: serve: --models-dir %s: %s is called '%s', as %s is: left out\n", f->dir, path, id,
              f->paths[i]);
      return 0;
    }
  }
  if (*f->n == SERVE_MAX_MODELS) {
    fprintf(stderr, "hearth: serve: --models-dir %s: at most %d models; %s left out\n", f->dir, SERVE_MAX_MODELS, path);
    return 0;
  }
  char *p = strdup(path);
  if (p) f->paths[(*f->n)++] = p;
  return 0;
}

static void found_free(found_models *f) {
  for (int i = f->first_set ? f->first : *f->n; i < *f->n; i++) free((char *)f->paths[i]);
}

int cli_serve(int argc, char **argv) {
  const char *model = NULL, *host = "127.0.0.1", *key = getenv("HEARTH_API_KEY"), *v;
  const char *names[64], *cors = NULL, *trace_file = NULL, *kv_store = NULL, *adapters[64], *adapter_dir = NULL;
  const char *state_dir = NULL, *memory = NULL;
  long long max_file = 0, batch_concurrency = 0;
  int nnames = 0, nadapters = 0, nmodels = 0;
  const char *models_given[SERVE_MAX_MODELS], *dirs[SERVE_MAX_DIRS];
  int ndirs = 0;
  long long port = 8080, max_body = 16 << 20, max_batch = 0, chunk = 0, step_tokens = 0, kv_mem = 0, budget = 0, trace_max = 0;
  long long resp_max = 1000, resp_bytes = 256ll << 20, resp_ttl = 3600, kv_store_max = 0, drain_timeout = 30;
  long long media_bytes = 0, header_timeout = 10, idle_timeout = 10, body_timeout = 60, max_conn = 4096, per_address = 0;
  long long model_memory = 0, model_ttl = 0;
  bool allow_local = false, allow_remote = false, allow_private = false;
  for (int i = 1; i < argc; i++) {
    int r;
    if (cli_is_help(argv[i])) {
      serve_usage();
      return 0;
    }
    if (!serve_opt_find(argv[i])) return cli_usage_error("serve", "unknown option '%s'", argv[i]);
    if ((r = cli_opt(argc, argv, &i, "--model", &model))) {
      if (r < 0) return 2;
      if (nmodels == SERVE_MAX_MODELS) return cli_usage_error("serve", "at most %d --model", SERVE_MAX_MODELS);
      models_given[nmodels++] = model;
    } else if ((r = cli_opt(argc, argv, &i, "--host", &host))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt(argc, argv, &i, "--api-key", &key))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt(argc, argv, &i, "--cors", &cors))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt(argc, argv, &i, "--trace-file", &trace_file))) {
      if (r < 0) return 2;
      if (!trace_file[0]) return cli_usage_error("serve", "--trace-file must not be empty");
    } else if (strcmp(argv[i], "--allow-local-media") == 0) {
      allow_local = true;
    } else if (strcmp(argv[i], "--allow-remote-media") == 0) {
      allow_remote = true;
    } else if (strcmp(argv[i], "--allow-private-media-hosts") == 0) {
      allow_private = true;
    } else if ((r = cli_opt(argc, argv, &i, "--max-media-bytes", &v))) {
      if (r < 0) return 2;
      if (!cli_parse_bytes(v, &media_bytes) || media_bytes <= 0)
        return cli_usage_error("serve", "--max-media-bytes must be a positive byte count, not '%s'", v);
    } else if ((r = cli_opt(argc, argv, &i, "--kv-store", &kv_store))) {
      if (r < 0) return 2;
      if (!kv_store[0]) return cli_usage_error("serve", "--kv-store must not be empty");
    } else if ((r = cli_opt(argc, argv, &i, "--kv-store-max", &v))) {
      if (r < 0) return 2;
      if (!cli_parse_bytes(v, &kv_store_max) || kv_store_max <= 0)
        return cli_usage_error("serve", "--kv-store-max must be a positive byte count, not '%s'", v);
    } else if ((r = cli_opt(argc, argv, &i, "--trace-max-bytes", &v))) {
      if (r < 0) return 2;
      if (!cli_parse_bytes(v, &trace_max) || trace_max <= 0)
        return cli_usage_error("serve", "--trace-max-bytes must be a positive byte count, not '%s'", v);
    } else if ((r = cli_opt(argc, argv, &i, "--adapter", &v))) {
      if (r < 0) return 2;
      const char *eq = strchr(v, '=');
      if (!eq || eq == v || !eq[1]) return cli_usage_error("serve", "--adapter takes NAME=DIR, not '%s'", v);
      if (nadapters == (int)(sizeof adapters / sizeof adapters[0])) return cli_usage_error("serve", "too many --adapter");
      adapters[nadapters++] = v;
    } else if ((r = cli_opt(argc, argv, &i, "--memory", &memory))) {
      if (r < 0) return 2;
      if (!memory[0]) return cli_usage_error("serve", "--memory must not be empty");
    } else if ((r = cli_opt(argc, argv, &i, "--state-dir", &state_dir))) {
      if (r < 0) return 2;
      if (!state_dir[0]) return cli_usage_error("serve", "--state-dir must not be empty");
    } else if ((r = cli_opt(argc, argv, &i, "--max-file-size", &v))) {
      if (r < 0) return 2;
      if (!cli_parse_bytes(v, &max_file) || max_file < 1)
        return cli_usage_error("serve", "--max-file-size must be a byte count, not '%s'", v);
    } else if ((r = cli_opt_int("serve", argc, argv, &i, "--batch-concurrency", 1, 256, &batch_concurrency))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt(argc, argv, &i, "--adapter-dir", &adapter_dir))) {
      if (r < 0) return 2;
      if (!adapter_dir[0]) return cli_usage_error("serve", "--adapter-dir must not be empty");
    } else if ((r = cli_opt(argc, argv, &i, "--served-model-name", &v))) {
      if (r < 0) return 2;
      if (!v[0]) return cli_usage_error("serve", "--served-model-name must not be empty");
      if (nnames == (int)(sizeof names / sizeof names[0])) return cli_usage_error("serve", "too many --served-model-name");
      names[nnames++] = v;
    } else if ((r = cli_opt_int("serve", argc, argv, &i, "--port", 0, 65535, &port)) ||
               (r = cli_opt_int("serve", argc, argv, &i, "--max-body", 1, (long long)1 << 40, &max_body)) ||
               (r = cli_opt_int("serve", argc, argv, &i, "--max-batch", 1, 4096, &max_batch)) ||
               (r = cli_opt_int("serve", argc, argv, &i, "--prefill-chunk", 1, 1 << 20, &chunk)) ||
               (r = cli_opt_int("serve", argc, argv, &i, "--max-num-batched-tokens", 1, 1 << 20, &step_tokens)) ||
               (r = cli_opt_int("serve", argc, argv, &i, "--responses-max", 1, 1 << 30, &resp_max)) ||
               (r = cli_opt_int("serve", argc, argv, &i, "--responses-ttl", 0, 1ll << 40, &resp_ttl)) ||
               (r = cli_opt_int("serve", argc, argv, &i, "--drain-timeout", 0, 1ll << 30, &drain_timeout)) ||
               (r = cli_opt_int("serve", argc, argv, &i, "--header-timeout", 1, 3600, &header_timeout)) ||
               (r = cli_opt_int("serve", argc, argv, &i, "--model-ttl", 1, 1 << 30, &model_ttl)) ||
               (r = cli_opt_int("serve", argc, argv, &i, "--idle-timeout", 1, 86400, &idle_timeout)) ||
               (r = cli_opt_int("serve", argc, argv, &i, "--body-timeout", 1, 86400, &body_timeout)) ||
               (r = cli_opt_int("serve", argc, argv, &i, "--max-connections", 1, 1 << 20, &max_conn)) ||
               (r = cli_opt_int("serve", argc, argv, &i, "--max-connections-per-address", 1, 1 << 20, &per_address))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt(argc, argv, &i, "--kv-cache-mem", &v))) {
      if (r < 0) return 2;
      if (!cli_parse_bytes(v, &kv_mem)) return cli_usage_error("serve", "--kv-cache-mem must be a byte count, not '%s'", v);
    } else if ((r = cli_opt(argc, argv, &i, "--responses-max-bytes", &v))) {
      if (r < 0) return 2;
      if (!cli_parse_bytes(v, &resp_bytes) || resp_bytes < 1)
        return cli_usage_error("serve", "--responses-max-bytes must be a byte count, not '%s'", v);
    } else if ((r = cli_opt(argc, argv, &i, "--models-dir", &v))) {
      if (r < 0) return 2;
      if (ndirs == SERVE_MAX_DIRS) return cli_usage_error("serve", "at most %d --models-dir", SERVE_MAX_DIRS);
      dirs[ndirs++] = v;
    } else if ((r = cli_opt(argc, argv, &i, "--model-memory", &v))) {
      if (r < 0) return 2;
      if (!cli_parse_bytes(v, &model_memory) || model_memory <= 0)
        return cli_usage_error("serve", "--model-memory must be a positive byte count, not '%s'", v);
    } else if ((r = cli_opt(argc, argv, &i, "--memory-budget", &v))) {
      if (r < 0) return 2;
      if (!cli_parse_bytes(v, &budget)) return cli_usage_error("serve", "--memory-budget must be a byte count, not '%s'", v);
    } else {
      return cli_usage_error("serve", "unknown option '%s'", argv[i]);
    }
  }
  if (per_address > max_conn)
    return cli_usage_error("serve", "--max-connections-per-address (%lld) is more than --max-connections (%lld)", per_address,
                           max_conn);
  if (allow_private && !allow_remote)
    return cli_usage_error("serve", "--allow-private-media-hosts goes with --allow-remote-media");
  /* --models-dir: the models found there too, each under a name no earlier model has */
  int ngiven = nmodels;
  found_models found = {.paths = models_given, .n = &nmodels};
  for (int d = 0; d < ndirs; d++) {
    struct stat st;
    if (stat(dirs[d], &st) || !S_ISDIR(st.st_mode)) return cli_fail("serve: --models-dir %s: no such folder", dirs[d]);
    found.dir = dirs[d];
    cli_find_models(dirs[d], found_add, &found);
  }
  if (ndirs && nmodels == ngiven)
    return cli_fail("serve: --models-dir: no model found in %s%s", dirs[0], ndirs > 1 ? " nor the others" : "");
  if (!nmodels) {
    if (!model) model = cli_default_model();
    if (!model) return cli_fail("serve: no --model given and no built-in model found (models/default)");
    models_given[nmodels++] = model;
  }
  if ((model_memory > 0 || model_ttl > 0) && nmodels < 2) {
    found_free(&found);
    return cli_usage_error("serve", "%s goes with several --model (the first stays loaded; the others load on first use)",
                           model_memory > 0 ? "--model-memory" : "--model-ttl");
  }
  bool lazy = (model_memory > 0 || model_ttl > 0 || ndirs > 0) && nmodels > 1;
  if (nmodels > 1 && (kv_store || trace_file)) {
    found_free(&found);
    return cli_usage_error("serve", "%s serves one model: give one --model with it", kv_store ? "--kv-store" : "--trace-file");
  }
  if (hlog_get_level() == HLOG_LEVEL_WARN) hlog_set_level(HLOG_LEVEL_INFO); /* a server logs its requests */

  /* Signals go to this thread only: block them before any server thread starts. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);

  herr err = {0};
  serve_engine_opts eo = {.threads = cli_load_opts()->threads,
                          .max_batch = (int)max_batch,
                          .prefill_chunk = (int)chunk, .step_tokens = (int)step_tokens,
                          .kv_cache_bytes = kv_mem,
                          .memory_budget = budget,
                          .load = {.device = cli_load_opts()->device,
                                   .gpu_memory_fraction = cli_load_opts()->gpu_memory_fraction,
                                   .cpu_level = cli_load_opts()->cpu_level,
                                   .mmap = cli_load_opts()->mmap,
                                   .f32_activations = cli_load_opts()->f32_activations,
                                   .f32_as_bf16 = cli_load_opts()->f32_as_bf16,
                                   .no_cuda_graphs = cli_load_opts()->no_cuda_graphs, .gpu_fast_matmul = cli_load_opts()->gpu_fast_matmul,
                                   .expert_budget = cli_load_opts()->expert_budget,
                                   .tensor_parallel = cli_load_opts()->tensor_parallel,
                                   .spec_tokens = cli_load_opts()->spec_tokens,
                                   .spec_method = cli_load_opts()->spec_method,
                                   .draft_model = cli_load_opts()->draft_model,
                                   .kv_quant = cli_load_opts()->kv_quant,
                                   .kv_quant_config = cli_load_opts()->kv_quant_config,
                                   .context_length = cli_load_opts()->context_length,
                                   .chat_template_file = cli_load_opts()->chat_template_file,
                                   .chat_template = cli_load_opts()->chat_template,
                                   .trace_file = trace_file,
                                   .trace_max_bytes = trace_max,
                                   .kv_store = kv_store,
                                   .kv_store_max = kv_store_max,
                                   .allow_local_media = allow_local,
                                   .allow_remote_media = allow_remote,
                                   .allow_private_media_hosts = allow_private,
                                   .max_media_bytes = media_bytes}};
  /* every model, each under the name its --model gave it (a registry name, a Hub id) or its folder's */
  serve_engine engines[SERVE_MAX_MODELS];
  serve_engine *more[SERVE_MAX_MODELS];
  lazy_model lazies[SERVE_MAX_MODELS];
  serve_lazy_pool *pool = NULL;
  json_t *served = json_array();
  int nopen = 0, rc = 0;
  for (; nopen < nmodels && !rc; nopen++) {
    eo.load.id = cli_model_name_of(models_given[nopen]);
    if (lazy && nopen > 0) { /* loaded on first use, in the pool */
      lazy_model *m = &lazies[nopen];
      m->path = models_given[nopen];
      m->eo = eo;
      model_id_of(m->path, m->id, sizeof m->id);
      m->eo.load.id = m->id;
      char *real = realpath(m->path, NULL);
      json_t *facts = cli_model_facts(m->id, real ? real : m->path);
      free(real);
      int64_t bytes = (int64_t)json_integer_value(json_object_get(facts, "bytes"));
      json_array_append_new(served, facts);
      if (!pool && serve_lazy_pool_new(model_memory, (double)model_ttl,
                                       (int64_t)json_integer_value(json_object_get(json_array_get(served, 0), "bytes")),
                                       &pool, &err)) {
        rc = cli_fail("serve: --model-memory: %s", err.msg);
        break;
      }
      if (serve_engine_lazy(pool, m->id, bytes, open_lazy, m, &engines[nopen], &err)) {
        rc = cli_fail("serve: %s", err.msg);
        break;
      }
      more[nopen] = &engines[nopen];
      continue;
    }
    if (serve_engine_open_opts(models_given[nopen], &eo, &engines[nopen], &err)) {
      rc = cli_fail("serve: %s%s%s", nmodels > 1 ? models_given[nopen] : "", nmodels > 1 ? ": " : "", err.msg);
      break;
    }
    char *real = realpath(models_given[nopen], NULL);
    json_array_append_new(served, cli_model_facts(engines[nopen].model_id, real ? real : models_given[nopen]));
    free(real);
    more[nopen] = &engines[nopen];
  }
  serve_engine *engine0 = &engines[0];
  for (int a = 0; a < nadapters && !rc; a++) { /* the first model's */
    const char *eq = strchr(adapters[a], '=');
    char name[HEARTH_ADAPTER_NAME_MAX];
    snprintf(name, sizeof name, "%.*s", (int)(eq - adapters[a]), adapters[a]);
    if (!engine0->adapter_load || engine0->adapter_load(engine0->impl, name, eq + 1, &err)) {
      if (!engine0->adapter_load) snprintf(err.msg, sizeof err.msg, "this model takes no adapters");
      rc = cli_fail("serve: --adapter %s: %s", adapters[a], err.msg);
    }
  }
  memsearch *mem = NULL;
  serve_tool mem_tool = {.name = MEMSEARCH_TOOL_NAME, .description = memsearch_tool_description,
                         .parameters = memsearch_tool_parameters, .run = memory_run};
  if (!rc && memory) {
    memory_result_bytes = engine0->context_length > 0 && engine0->context_length / 2 < 8192 ? engine0->context_length / 2 : 8192;
    if (memory_open(memory, engine0, models_given[0], &mem, &err)) rc = cli_fail("serve: --memory %s: %s", memory, err.msg);
    mem_tool.ctx = mem;
  }
  serve_models models = {.served = served, .list = models_list, .remove = models_remove, .pull = models_pull};
  serve_config cfg = {.host = host, .models = &models, .port = (int)port, .api_key = key, .max_body = (size_t)max_body,
                      .served_names = names, .n_served_names = nnames, .cors_origin = cors,
                      .responses_max = (size_t)resp_max, .responses_max_bytes = (size_t)resp_bytes,
                      .responses_ttl_s = resp_ttl ? resp_ttl : -1, .adapter_dir = adapter_dir,
                      .header_timeout_s = (int)header_timeout, .idle_timeout_s = (int)idle_timeout,
                      .body_timeout_s = (int)body_timeout, .max_connections = (int)max_conn,
                      .max_per_client = (int)per_address, .state_dir = state_dir,
                      .max_file_bytes = (size_t)max_file, .batch_concurrency = (int)batch_concurrency,
                      .more_engines = more + 1, .n_more_engines = nmodels - 1,
                      .tools = mem ? &mem_tool : NULL, .n_tools = mem ? 1 : 0};
  serve_server *srv = NULL;
  if (!rc && serve_start(&srv, engine0, &cfg, &err)) rc = cli_fail("serve: %s", err.msg);
  if (rc) {
    memsearch_close(mem);
    for (int k = 0; k < nopen; k++) serve_engine_close(&engines[k]);
    serve_lazy_pool_free(pool);
    json_decref(served);
    found_free(&found);
    return rc;
  }
  char addr[300];
  if (strchr(host, ':')) snprintf(addr, sizeof addr, "[%s]", host);
  else snprintf(addr, sizeof addr, "%s", host);
  for (int k = 0; k < nmodels; k++) fprintf(stderr, "hearth: serving %s\n", engines[k].model_id);
  fprintf(stderr, "hearth: listening on http://%s:%d\n", addr, serve_port(srv));
  fflush(stderr);
  int sig;
  sigwait(&set, &sig);
  fprintf(stderr, "hearth: %s: stopping; %lld request(s) in flight get up to %llds to finish (a second signal cuts them)\n",
          sig == SIGINT ? "SIGINT" : "SIGTERM", (long long)serve_in_flight(srv), drain_timeout);
  fflush(stderr);
  int cut = serve_drain(srv, (double)drain_timeout, &set);
  if (cut) fprintf(stderr, "hearth: %d running generation(s) cut by the drain timeout\n", cut);
  serve_stop(srv);
  memsearch_close(mem);
  for (int k = 0; k < nmodels; k++) serve_engine_close(&engines[k]); /* writes the KV store */
  serve_lazy_pool_free(pool);
  json_decref(served);
  found_free(&found);
  fprintf(stderr, "hearth: stopped\n");
  return 0;
}
