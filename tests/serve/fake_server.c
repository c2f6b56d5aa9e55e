/* fake_server.c — the HTTP server over the fake engine (fake_engine.h), so the
 * end-to-end tests can check the protocol without a model:
 *   serve_fake_server [--host ADDR] [--port N] [--api-key KEY] [--max-body BYTES]
 *                     [--context TOKENS] [--responses-max N] [--drain-timeout SECONDS]
 *                     [--state-dir DIR] [--max-file-size BYTES] [--batch-concurrency N]
 *                     [--fim 1] (the fake with fill-in-the-middle tokens and token-id prompts)
 *                     [--memory-tool 1] (a memory_search tool the server runs itself, whose result
 *                     is "memory-result-for-QUERY"; the fake calls it on "[memsearch]")
 * The Ollama API's models beyond the served one (serve_models) are fake too:
 * /api/tags lists "org/tiny" and "scanned-model", /api/delete removes either
 * once (anything else is not found), /api/pull of "org/tiny" writes three
 * progress lines 20 ms apart and succeeds, of anything else fails.
 * Prints "hearth: listening on http://HOST:PORT" and serves until
 * SIGINT/SIGTERM, draining first as `hearth serve` does (after printing
 * "fake_server: draining"). Test code only. */
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "fake_engine.h"
#include "serve/server.h"

static atomic_bool fake_gone[2];
static const char *const fake_names[2] = {"org/tiny", "scanned-model"};

static json_t *fake_list(void *ctx) {
  (void)ctx;
  json_t *a = json_array();
  if (!atomic_load(&fake_gone[0]))
    json_array_append_new(a, json_pack("{s:s, s:s, s:s, s:s, s:I, s:s, s:I, s:I, s:s}", "name", "org/tiny", "path",
                                       "/models/org/tiny", "format", "safetensors", "architecture", "qwen3", "parameters",
                                       (json_int_t)600000000, "quantization", "BF16", "bytes", (json_int_t)1200000000,
                                       "modified", (json_int_t)1700000000, "revision",
                                       "0123456789abcdef0123456789abcdef01234567"));
  if (!atomic_load(&fake_gone[1]))
    json_array_append_new(a, json_pack("{s:s, s:s, s:s, s:s, s:I, s:s, s:I, s:I}", "name", "scanned-model", "path",
                                       "/models/scanned.gguf", "format", "gguf", "architecture", "llama", "parameters",
                                       (json_int_t)8030000000, "quantization", "Q4_K", "bytes", (json_int_t)4900000000,
                                       "modified", (json_int_t)1700000100));
  return a;
}

static int fake_remove(void *ctx, const char *name, herr *err) {
  (void)ctx;
  for (int i = 0; i < 2; i++)
    if (!strcmp(name, fake_names[i]) && !atomic_exchange(&fake_gone[i], true)) return 0;
  return herr_set(err, HEARTH_ENOTFOUND, "%s is neither a registry name nor a Hub id (hearth ls lists both)", name);
}

static int fake_pull(void *ctx, const char *name, FILE *progress, herr *err) {
  (void)ctx;
  if (strcmp(name, "org/tiny")) return herr_set(err, HEARTH_ENOTFOUND, "%s: no such repository on the Hub", name);
  for (int i = 1; i <= 3; i++) {
    if (progress) fprintf(progress, "hearth: file%d.safetensors ok, %d/3 files\n", i, i);
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  atomic_store(&fake_gone[0], false);
  return 0;
}

/* The memory_search tool of --memory-tool: "memory-result-for-QUERY". */
static int fake_memory_run(void *ctx, const char *args, char **result, herr *err) {
  (void)ctx;
  json_t *a = json_loads(args, 0, NULL);
  const char *q = json_string_value(json_object_get(a, "query"));
  if (!q) {
    json_decref(a);
    return herr_set(err, HEARTH_EINVAL, "memory_search: the arguments have no \"query\" string");
  }
  hbuf b = {0};
  hbuf_printf(&b, "memory-result-for-%s", q);
  json_decref(a);
  *result = hbuf_take(&b);
  return *result ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
}

static const serve_tool fake_memory_tool = {
    .name = "memory_search", .description = "search the memory wiki",
    .parameters = "{\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\"}},\"required\":[\"query\"]}",
    .run = fake_memory_run};

int main(int argc, char **argv) {
  serve_config cfg = {.host = "127.0.0.1"};
  const char *names[16];
  double drain_timeout = 30;
  int names_n = 0;
  bool fim = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--port") == 0) cfg.port = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--api-key") == 0) cfg.api_key = argv[i + 1];
    else if (strcmp(argv[i], "--host") == 0) cfg.host = argv[i + 1];
    else if (strcmp(argv[i], "--max-body") == 0) cfg.max_body = (size_t)strtoull(argv[i + 1], NULL, 10);
    else if (strcmp(argv[i], "--context") == 0) fake_context = strtoll(argv[i + 1], NULL, 10);
    else if (strcmp(argv[i], "--cors") == 0) cfg.cors_origin = argv[i + 1];
    else if (strcmp(argv[i], "--served-model-name") == 0 && names_n < 16) names[names_n++] = argv[i + 1];
    else if (strcmp(argv[i], "--drain-timeout") == 0) drain_timeout = strtod(argv[i + 1], NULL);
    else if (strcmp(argv[i], "--fim") == 0) fim = atoi(argv[i + 1]) != 0;
    else if (strcmp(argv[i], "--responses-max") == 0) cfg.responses_max = (size_t)strtoull(argv[i + 1], NULL, 10);
    else if (strcmp(argv[i], "--state-dir") == 0) cfg.state_dir = argv[i + 1];
    else if (strcmp(argv[i], "--max-file-size") == 0) cfg.max_file_bytes = (size_t)strtoull(argv[i + 1], NULL, 10);
    else if (strcmp(argv[i], "--batch-concurrency") == 0) cfg.batch_concurrency = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--max-connections") == 0) cfg.max_connections = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--max-connections-per-address") == 0) cfg.max_per_client = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--idle-timeout") == 0) cfg.idle_timeout_s = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--body-timeout") == 0) cfg.body_timeout_s = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--memory-tool") == 0 && atoi(argv[i + 1])) cfg.tools = &fake_memory_tool, cfg.n_tools = 1;
  }
  serve_models models = {.served = NULL, .list = fake_list, .remove = fake_remove, .pull = fake_pull};
  cfg.models = &models;
  cfg.served_names = names;
  cfg.n_served_names = names_n;
  hlog_set_level(HLOG_LEVEL_INFO);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL); /* before any thread starts */
  signal(SIGPIPE, SIG_IGN);
  serve_engine engine;
  fake_engine_init(&engine);
  if (fim) fake_engine_fim(&engine);
  serve_server *srv;
  herr err = {0};
  if (serve_start(&srv, &engine, &cfg, &err)) {
    fprintf(stderr, "fake_server: %s\n", err.msg);
    return 1;
  }
  fake_server = srv;
  bool v6 = strchr(cfg.host, ':') != NULL;
  fprintf(stderr, "hearth: listening on http://%s%s%s:%d\n", v6 ? "[" : "", cfg.host, v6 ? "]" : "", serve_port(srv));
  int sig;
  sigwait(&set, &sig);
  fprintf(stderr, "fake_server: draining\n");
  int cut = serve_drain(srv, drain_timeout, &set);
  fprintf(stderr, "fake_server: drained (%d cut)\n", cut);
  serve_stop(srv);
  fprintf(stderr, "fake_server: stopped (%d generations, %d cancelled)\n", atomic_load(&fake_generations),
          atomic_load(&fake_cancelled));
  return 0;
}
