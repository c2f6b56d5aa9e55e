/* serve.c — `hearth serve`: load one model and answer OpenAI-compatible HTTP
 * requests (and the chat page) until interrupted. Owns the options and the
 * process's signal handling; the server itself is src/serve/. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "cli/cli.h"
#include "serve/engine.h"
#include "serve/server.h"

static void serve_usage(void) {
  printf("usage: hearth serve [--model DIR] [--host ADDR] [--port N] [--api-key KEY] [--max-body BYTES] [--threads N]\n\n"
         "Serves one model over HTTP: /v1/chat/completions, /v1/completions, /v1/models,\n"
         "/health, /v1 and a chat page at /.\n\n"
         "  --model DIR        a Hugging Face model folder (default: the built-in model)\n"
         "  --host ADDR        address to listen on (default 127.0.0.1)\n"
         "  --port N           port (default 8080; 0 picks a free one)\n"
         "  --api-key KEY      require 'Authorization: Bearer KEY' (also $HEARTH_API_KEY)\n"
         "  --max-body BYTES   largest request body accepted (default 16777216)\n"
         "  --threads N        compute threads (default: one per core)\n");
}

static int parse_count(const char *s, long long lo, long long hi, long long *out) {
  char *end;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

int cli_serve(int argc, char **argv) {
  const char *model = NULL, *host = "127.0.0.1", *key = getenv("HEARTH_API_KEY"), *v;
  long long port = 8080, max_body = 16 << 20, threads = 0;
  for (int i = 1; i < argc; i++) {
    int r;
    if (cli_is_help(argv[i])) {
      serve_usage();
      return 0;
    }
    if ((r = cli_opt(argc, argv, &i, "--model", &model))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt(argc, argv, &i, "--host", &host))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt(argc, argv, &i, "--api-key", &key))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt(argc, argv, &i, "--port", &v))) {
      if (r < 0) return 2;
      if (parse_count(v, 0, 65535, &port)) return cli_usage_error("serve", "--port must be 0..65535, not '%s'", v);
    } else if ((r = cli_opt(argc, argv, &i, "--max-body", &v))) {
      if (r < 0) return 2;
      if (parse_count(v, 1, (long long)1 << 40, &max_body))
        return cli_usage_error("serve", "--max-body must be a positive byte count, not '%s'", v);
    } else if ((r = cli_opt(argc, argv, &i, "--threads", &v))) {
      if (r < 0) return 2;
      if (parse_count(v, 0, 4096, &threads)) return cli_usage_error("serve", "--threads must be 0..4096, not '%s'", v);
    } else {
      return cli_usage_error("serve", "unknown option '%s'", argv[i]);
    }
  }
  if (!model) model = cli_default_model();
  if (!model) return cli_fail("serve: no --model given and no built-in model found (models/default)");
  if (hlog_get_level() == HLOG_LEVEL_WARN) hlog_set_level(HLOG_LEVEL_INFO); /* a server logs its requests */

  /* Signals go to this thread only: block them before any server thread starts. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);

  herr err = {0};
  serve_engine engine;
  if (serve_engine_open(model, (int)threads, &engine, &err)) return cli_fail("serve: %s", err.msg);
  serve_config cfg = {.host = host, .port = (int)port, .api_key = key, .max_body = (size_t)max_body};
  serve_server *srv;
  if (serve_start(&srv, &engine, &cfg, &err)) {
    serve_engine_close(&engine);
    return cli_fail("serve: %s", err.msg);
  }
  char addr[300];
  if (strchr(host, ':')) snprintf(addr, sizeof addr, "[%s]", host);
  else snprintf(addr, sizeof addr, "%s", host);
  fprintf(stderr, "hearth: serving %s\n", engine.model_id);
  fprintf(stderr, "hearth: listening on http://%s:%d\n", addr, serve_port(srv));
  fflush(stderr);
  int sig;
  sigwait(&set, &sig);
  fprintf(stderr, "hearth: stopping\n");
  serve_stop(srv);
  serve_engine_close(&engine);
  return 0;
}
