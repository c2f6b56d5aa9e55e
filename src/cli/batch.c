/* batch.c — `hearth batch IN.jsonl [-o OUT.jsonl]`: the OpenAI Batch API's
 * input lines ({"custom_id", "method", "url", "body"}) run offline, and its
 * output lines ({"id", "custom_id", "response": {"status_code", "request_id",
 * "body"}, "error"}) written as rows finish. Each row is answered by the
 * server's own code (src/serve/): the model is served on a loopback port with a
 * key made for this run, and a few threads post the rows to it, so a row's
 * parsing, checks (its body.model against the loaded model included), choices
 * and answer are exactly what `hearth serve` gives for the same body, and as
 * many rows run at once as --concurrency lets the scheduler batch. A line that
 * is not a request (bad JSON, no custom_id, a method other than POST, a url
 * not served here, a streaming body) gets an `error` object and the run goes
 * on (the row itself is serve/batch_row.c's, shared with /v1/batches). Rows whose custom_id is already in OUT are skipped and OUT is appended
 * to, so a run cut short resumes. Knows the server through server.h and
 * engine.h only; the JSON through jansson. */
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/dict.h"
#include "base/file.h"
#include "base/log.h"
#include "base/vec.h"
#include "cli/cli.h"
#include "serve/batch_row.h"
#include "serve/engine.h"
#include "serve/reply.h"
#include "serve/server.h"

#define BATCH_MAX_CONCURRENCY 256

static void usage(FILE *f) {
  fprintf(f,
          "usage: hearth batch IN.jsonl [-o OUT.jsonl] [--model PATH] [--concurrency N] [--threads N]\n\n"
          "Runs OpenAI Batch API input lines offline: each line is {\"custom_id\", \"method\": \"POST\",\n"
          "\"url\", \"body\"} with url /v1/chat/completions, /v1/completions or /v1/embeddings, answered\n"
          "as `hearth serve` answers that body. Each output line is {\"id\", \"custom_id\", \"response\":\n"
          "{\"status_code\", \"request_id\", \"body\"}, \"error\"}, written as rows finish (match them by\n"
          "custom_id); a line that is not a request gets an \"error\" object and the run goes on.\n\n"
          "  -o, --output OUT      append the output lines to OUT (default: stdout); rows whose custom_id\n"
          "                        is already in OUT are skipped, so a run cut short resumes\n"
          "  --model PATH          model folder or .gguf file (default: the built-in model)\n"
          "  --concurrency N       rows in flight at once (default 64, at most %d); the scheduler\n"
          "                        batches them into shared forward steps\n"
          "  --threads N           CPU worker threads (default: one per CPU)\n\n"
          "On a terminal, a progress line (rows, output tokens/s, ETA) on stderr; at the end the\n"
          "throughput on stderr. Exits 0 when every row was answered or refused by line, 1 when the\n"
          "run could not start.\n",
          BATCH_MAX_CONCURRENCY);
}

typedef struct row {
  int line;        /* 1-based line of IN */
  const char *text; /* borrowed from the input file */
  size_t len;
  bool dup;        /* its custom_id came on an earlier line too */
} row;

typedef struct batch {
  row *rows;         /* owned: the rows to run */
  size_t nrows, cap, next; /* next: the first row no worker has taken (under mu) */
  batch_row_target target; /* the loopback server */
  char key[64];
  FILE *out;         /* borrowed */
  pthread_mutex_t mu; /* next, out */
  atomic_llong done, errors, tokens;
  double t0;
} batch;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One row: its output line (never NULL but on out of memory). */
static json_t *run_row(batch *b, const row *r) {
  json_t *o = NULL;
  json_t *line = batch_row_check(r->text, r->len, r->line, r->dup, NULL, &o);
  if (!line) return o;
  bool transport_failed;
  int64_t tokens;
  o = batch_row_post(&b->target, line, NULL, &transport_failed, &tokens);
  atomic_fetch_add(&b->tokens, (long long)tokens);
  json_decref(line);
  return o;
}

static void *worker_main(void *arg) {
  batch *b = arg;
  for (;;) {
    pthread_mutex_lock(&b->mu);
    size_t i = b->next < b->nrows ? b->next++ : b->nrows;
    pthread_mutex_unlock(&b->mu);
    if (i == b->nrows) return NULL;
    json_t *o = run_row(b, &b->rows[i]);
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL; /* float32 values exactly */
    if (!o || !json_is_null(json_object_get(o, "error"))) atomic_fetch_add(&b->errors, 1);
    pthread_mutex_lock(&b->mu);
    if (s) fprintf(b->out, "%s\n", s), fflush(b->out);
    pthread_mutex_unlock(&b->mu);
    atomic_fetch_add(&b->done, 1);
    free(s);
    json_decref(o);
  }
}

static void progress(batch *b, bool last) {
  double dt = now_s() - b->t0;
  long long done = atomic_load(&b->done), tok = atomic_load(&b->tokens);
  double rate = dt > 0 ? (double)tok / dt : 0, eta = done > 0 ? dt / (double)done * (double)((long long)b->nrows - done) : 0;
  fprintf(stderr, "\r\033[Kbatch: %lld/%zu rows, %.1f tok/s, ETA %.0fs", done, b->nrows, rate, eta);
  if (last) fputc('\n', stderr);
  fflush(stderr);
}

/* The custom_ids of OUT's lines (a missing OUT has none). */
static int read_done(const char *path, hdict *done, herr *err) {
  FILE *f = fopen(path, "r");
  if (!f) return errno == ENOENT ? 0 : herr_set(err, HEARTH_EIO, "%s: %s", path, strerror(errno));
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  while ((n = getline(&line, &cap, f)) > 0) {
    json_t *o = json_loadb(line, (size_t)n, 0, NULL);
    json_t *cid = json_object_get(o, "custom_id");
    if (json_is_string(cid)) hdict_put(done, json_string_value(cid), json_string_length(cid), 1);
    json_decref(o);
  }
  free(line);
  fclose(f);
  return 0;
}

int cli_batch(int argc, char **argv) {
  const char *in_path = NULL, *out_path = NULL, *model = NULL;
  long long concurrency = 64;
  for (int i = 1; i < argc; i++) {
    const char *v = NULL;
    int r;
    if (cli_is_help(argv[i])) {
      usage(stdout);
      return 0;
    }
    if ((r = cli_opt(argc, argv, &i, "-o", &v)) || (r = cli_opt(argc, argv, &i, "--output", &v))) {
      if (r < 0) return 2;
      out_path = v;
    } else if ((r = cli_opt(argc, argv, &i, "--model", &v))) {
      if (r < 0) return 2;
      model = v;
    } else if ((r = cli_opt_int("batch", argc, argv, &i, "--concurrency", 1, BATCH_MAX_CONCURRENCY, &concurrency))) {
      if (r < 0) return 2;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      return cli_usage_error("batch", "unknown option %s (see hearth batch --help)", argv[i]);
    } else if (in_path) {
      return cli_usage_error("batch", "one input file, not '%s' too", argv[i]);
    } else {
      in_path = argv[i];
    }
  }
  if (!in_path) return cli_usage_error("batch", "give the input JSONL file (see hearth batch --help)");
  if (!model) model = cli_default_model();
  if (!model) return cli_fail("batch: no --model given and no built-in model found (models/default)");

  herr err = {0};
  char *input = NULL;
  size_t in_len = 0;
  if (hfile_read(in_path, &input, &in_len, &err)) return cli_fail("batch: %s", err.msg);
  hdict done, seen;
  hdict_init(&done);
  hdict_init(&seen);
  batch b = {0};
  pthread_mutex_init(&b.mu, NULL);
  int status = 1;
  bool engine_open = false;
  serve_engine engine;
  serve_server *srv = NULL;
  FILE *out = NULL;
  pthread_t *th = NULL;
  size_t total = 0, skipped = 0, nth = 0;
  if (out_path && read_done(out_path, &done, &err)) {
    cli_fail("batch: %s", err.msg);
    goto end;
  }
  for (char *p = input, *end = input + in_len; p < end;) { /* the lines, each a row unless blank */
    char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
    total++;
    size_t k = 0;
    while (k < len && (p[k] == ' ' || p[k] == '\t' || p[k] == '\r')) k++;
    if (k < len) {
      row r = {.line = (int)total, .text = p, .len = len};
      char *cid = batch_row_custom_id(r.text, r.len);
      int64_t dummy;
      if (cid && hdict_gets(&done, cid, &dummy)) {
        skipped++;
      } else if (b.nrows == b.cap && !HGROW(b.rows, b.cap, b.nrows + 1)) {
        free(cid);
        cli_fail("batch: out of memory for the rows");
        goto end;
      } else {
        r.dup = cid && hdict_gets(&seen, cid, &dummy);
        if (cid && !r.dup) hdict_put(&seen, cid, strlen(cid), 1);
        b.rows[b.nrows++] = r;
      }
      free(cid);
    }
    p += len + 1;
  }
  out = out_path ? fopen(out_path, "a") : stdout;
  if (!out) {
    cli_fail("batch: %s: %s", out_path, strerror(errno));
    goto end;
  }
  b.out = out;
  signal(SIGPIPE, SIG_IGN);
  serve_engine_opts eo = {.threads = cli_load_opts()->threads, .max_batch = (int)concurrency};
  cli_hearth_load_opts(&eo.load);
  if (serve_engine_open_opts(model, &eo, &engine, &err)) {
    cli_fail("batch: %s", err.msg);
    goto end;
  }
  engine_open = true;
  serve_random_id(b.key, sizeof b.key, "sk-batch-", 32);
  serve_config cfg = {.host = "127.0.0.1", .port = 0, .api_key = b.key, .max_body = (size_t)1 << 30,
                      .max_connections = BATCH_MAX_CONCURRENCY * 2, .max_per_client = BATCH_MAX_CONCURRENCY * 2};
  if (serve_start(&srv, &engine, &cfg, &err)) {
    cli_fail("batch: %s", err.msg);
    goto end;
  }
  if (batch_row_target_set(&b.target, "127.0.0.1", serve_port(srv), b.key, &err)) {
    cli_fail("batch: %s", err.msg);
    goto end;
  }
  if (skipped) fprintf(stderr, "batch: %zu row(s) already in %s, skipped\n", skipped, out_path);
  int lvl = hlog_get_level();
  if (lvl == HLOG_LEVEL_INFO) hlog_set_level(HLOG_LEVEL_WARN); /* no log line per row */
  b.t0 = now_s();
  nth = b.nrows < (size_t)concurrency ? b.nrows : (size_t)concurrency;
  th = calloc(nth ? nth : 1, sizeof *th);
  size_t started = 0;
  for (; th && started < nth; started++)
    if (pthread_create(&th[started], NULL, worker_main, &b) != 0) break;
  if (started == 0) worker_main(&b);
  bool tty = isatty(STDERR_FILENO);
  while (tty && (size_t)atomic_load(&b.done) < b.nrows) {
    progress(&b, false);
    usleep(250 * 1000);
  }
  for (size_t t = 0; t < started; t++) pthread_join(th[t], NULL);
  if (tty) progress(&b, true);
  hlog_set_level(lvl);
  double dt = now_s() - b.t0;
  long long tok = atomic_load(&b.tokens), errs = atomic_load(&b.errors);
  fprintf(stderr, "batch: %zu row(s) in %.2fs (%lld refused by line, %zu skipped): %lld output tokens, %.1f tok/s, %.2f rows/s\n",
          b.nrows, dt, errs, skipped, tok, dt > 0 ? (double)tok / dt : 0, dt > 0 ? (double)b.nrows / dt : 0);
  status = 0;
end:
  free(th);
  if (srv) serve_stop(srv);
  if (engine_open) serve_engine_close(&engine);
  if (out && out != stdout) fclose(out);
  else if (out) fflush(out);
  free(b.rows);
  free(input);
  hdict_free(&done);
  hdict_free(&seen);
  pthread_mutex_destroy(&b.mu);
  return status;
}
