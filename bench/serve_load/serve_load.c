/* serve_load.c — a load generator for an OpenAI-compatible server (hearth
 * serve, or any peer that takes token-id prompts and ignore_eos): streaming
 * /v1/completions requests of fixed input and output lengths, closed-loop at
 * a fixed concurrency or open-loop with Poisson arrivals, optionally with a
 * share of the requests starting with one common prefix. Prints one JSON
 * object: output tokens/s, requests/s, time to first token, inter-token
 * latency and time per output token (mean, p50, p90, p99, in ms).
 *
 *   serve_load --url URL [--model NAME] (--concurrency C | --rate R) --requests N
 *              --input L --output L [--shared-prefix P --shared-frac F] [--vocab V]
 *              [--seed S] [--label TEXT] [--timeout SECONDS] [--token-events 1]
 *
 * One thread drives every transfer through libcurl's multi interface, so
 * hundreds of streams cost no threads; times are taken as each SSE event
 * arrives. Prompts are random token ids in [10, V) (V defaults to 1000, so
 * any model's vocabulary holds them), distinct per request so the prefix
 * cache helps only where --shared-prefix says it should. Inter-token latency
 * is the gap between stream events: a token whose text is empty (an id the
 * tokenizer does not cover, as in a random model) or held back (part of a
 * character, a possible stop string) comes with the next, unless
 * --token-events 1 asks for each token's logprob, which gives every token an
 * event of its own. */
#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

typedef struct opts {
  const char *url, *model, *label;
  int concurrency;     /* closed loop; 0 with rate */
  double rate;         /* open loop: requests per second */
  int requests, input, output, shared_prefix, vocab;
  double shared_frac, timeout;
  bool token_events;
  uint64_t seed;
} opts;

typedef struct xfer {
  int idx;
  CURL *h;
  struct curl_slist *hdr;
  char *body;
  char *buf; /* unparsed SSE bytes */
  size_t len, cap;
  double t_start, t_first, t_last;
  double *gaps; /* between content events */
  int n_gaps, cap_gaps, events;
  int64_t prompt_tokens, completion_tokens, cached_tokens;
  bool failed;
  char err[160];
} xfer;

typedef struct result {
  double ttft, tpot, e2e;
  int64_t prompt_tokens, completion_tokens, cached_tokens;
  bool ok;
} result;

/* One SSE event's data: a chunk with text (a token or more) or the usage chunk. */
static void on_event(xfer *x, const char *data, size_t n, double t) {
  if (n == 6 && !memcmp(data, "[DONE]", 6)) return;
  json_error_t je;
  json_t *j = json_loadb(data, n, JSON_ALLOW_NUL, &je);
  if (!j) {
    x->failed = true;
    snprintf(x->err, sizeof x->err, "unreadable event (%.60s at %d): %.60s", je.text, je.position,
             je.position > 20 ? data + je.position - 20 : data);
    return;
  }
  json_t *err = json_object_get(j, "error");
  if (err) {
    x->failed = true;
    snprintf(x->err, sizeof x->err, "%.150s", json_string_value(json_object_get(err, "message")));
  }
  json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
  if (ch) {
    x->events++;
    if (x->t_first == 0) {
      x->t_first = t;
    } else {
      if (x->n_gaps == x->cap_gaps) {
        x->cap_gaps = x->cap_gaps ? 2 * x->cap_gaps : 256;
        x->gaps = realloc(x->gaps, sizeof *x->gaps * (size_t)x->cap_gaps);
      }
      x->gaps[x->n_gaps++] = t - x->t_last;
    }
    x->t_last = t;
  }
  json_t *u = json_object_get(j, "usage");
  if (json_is_object(u)) {
    x->prompt_tokens = json_integer_value(json_object_get(u, "prompt_tokens"));
    x->completion_tokens = json_integer_value(json_object_get(u, "completion_tokens"));
    x->cached_tokens = json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
  }
  json_decref(j);
}

static size_t on_data(char *p, size_t sz, size_t nm, void *user) {
  xfer *x = user;
  size_t n = sz * nm;
  double t = now();
  if (x->len + n + 1 > x->cap) {
    x->cap = (x->len + n + 1) * 2;
    x->buf = realloc(x->buf, x->cap);
  }
  memcpy(x->buf + x->len, p, n);
  x->len += n;
  x->buf[x->len] = 0;
  /* whole events: "data: ...\n\n" */
  char *start = x->buf, *end;
  while ((end = strstr(start, "\n\n")) != NULL) {
    for (char *line = start; line < end;) {
      char *nl = memchr(line, '\n', (size_t)(end - line));
      char *le = nl ? nl : end;
      if (le - line > 6 && !strncmp(line, "data: ", 6)) on_event(x, line + 6, (size_t)(le - line - 6), t);
      else if (le - line > 1 && line[0] == '{') on_event(x, line, (size_t)(le - line), t); /* a JSON error body */
      line = le + 1;
    }
    start = end + 2;
  }
  size_t rest = x->len - (size_t)(start - x->buf);
  memmove(x->buf, start, rest);
  x->len = rest;
  x->buf[x->len] = 0;
  return n;
}

static int32_t *g_prefix; /* the shared prefix's ids */

static xfer *start(CURLM *multi, const opts *o, int idx, char *endpoint) {
  xfer *x = calloc(1, sizeof *x);
  x->idx = idx;
  uint64_t r = o->seed * 1000003u + (uint64_t)idx;
  bool shared = o->shared_prefix > 0 && rng_unit(&r) < o->shared_frac;
  json_t *ids = json_array();
  for (int i = 0; i < o->input; i++) {
    int32_t id = shared && i < o->shared_prefix ? g_prefix[i] : (int32_t)(10 + rng_next(&r) % (uint64_t)(o->vocab - 10));
    json_array_append_new(ids, json_integer(id));
  }
  json_t *body = json_pack("{s:o, s:i, s:b, s:b, s:{s:b}, s:f}", "prompt", ids, "max_tokens", o->output, "ignore_eos", 1,
                           "stream", 1, "stream_options", "include_usage", 1, "temperature", 0.0);
  /* the sampled token's logprob: every token its own event, also one whose text is empty or held back */
  if (o->token_events) json_object_set_new(body, "logprobs", json_integer(0));
  if (o->model) json_object_set_new(body, "model", json_string(o->model));
  x->body = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  x->h = curl_easy_init();
  x->hdr = curl_slist_append(NULL, "Content-Type: application/json");
  curl_easy_setopt(x->h, CURLOPT_URL, endpoint);
  curl_easy_setopt(x->h, CURLOPT_HTTPHEADER, x->hdr);
  curl_easy_setopt(x->h, CURLOPT_POSTFIELDS, x->body);
  curl_easy_setopt(x->h, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(x->h, CURLOPT_WRITEDATA, x);
  curl_easy_setopt(x->h, CURLOPT_PRIVATE, x);
  curl_easy_setopt(x->h, CURLOPT_TIMEOUT_MS, (long)(o->timeout * 1000));
  curl_easy_setopt(x->h, CURLOPT_NOSIGNAL, 1L);
  x->t_start = now();
  curl_multi_add_handle(multi, x->h);
  return x;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* mean and percentiles (nearest rank) of v[0..n), sorted here, in ms */
static json_t *stats(double *v, size_t n) {
  if (n == 0) return json_null();
  qsort(v, n, sizeof *v, cmp_double);
  double sum = 0;
  for (size_t i = 0; i < n; i++) sum += v[i];
  double q[3] = {0.5, 0.9, 0.99};
  double p[3];
  for (int k = 0; k < 3; k++) {
    size_t rank = (size_t)ceil(q[k] * (double)n);
    p[k] = v[(rank ? rank : 1) - 1];
  }
  return json_pack("{s:f, s:f, s:f, s:f}", "mean", sum / (double)n * 1e3, "p50", p[0] * 1e3, "p90", p[1] * 1e3, "p99",
                   p[2] * 1e3);
}

static int usage(void) {
  fprintf(stderr, "usage: serve_load --url URL [--model NAME] (--concurrency C | --rate R) --requests N --input L "
                  "--output L [--shared-prefix P --shared-frac F] [--vocab V] [--seed S] [--label TEXT] [--timeout S] "
                  "[--token-events 0|1]\n");
  return 2;
}

int main(int argc, char **argv) {
  opts o = {.vocab = 1000, .seed = 1, .timeout = 600, .shared_frac = 1.0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) return usage();
    if (!strcmp(a, "--url")) o.url = v;
    else if (!strcmp(a, "--model")) o.model = v;
    else if (!strcmp(a, "--label")) o.label = v;
    else if (!strcmp(a, "--concurrency")) o.concurrency = atoi(v);
    else if (!strcmp(a, "--rate")) o.rate = atof(v);
    else if (!strcmp(a, "--requests")) o.requests = atoi(v);
    else if (!strcmp(a, "--input")) o.input = atoi(v);
    else if (!strcmp(a, "--output")) o.output = atoi(v);
    else if (!strcmp(a, "--shared-prefix")) o.shared_prefix = atoi(v);
    else if (!strcmp(a, "--shared-frac")) o.shared_frac = atof(v);
    else if (!strcmp(a, "--vocab")) o.vocab = atoi(v);
    else if (!strcmp(a, "--seed")) o.seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--timeout")) o.timeout = atof(v);
    else if (!strcmp(a, "--token-events")) o.token_events = atoi(v) != 0;
    else return usage();
    i++;
  }
  if (!o.url || o.requests < 1 || o.input < 1 || o.output < 1 || o.vocab <= 10 || (o.concurrency < 1) == (o.rate <= 0) ||
      o.shared_prefix > o.input || o.shared_frac < 0 || o.shared_frac > 1)
    return usage();
  char endpoint[512];
  snprintf(endpoint, sizeof endpoint, "%s/v1/completions", o.url);
  g_prefix = malloc(sizeof *g_prefix * (size_t)(o.shared_prefix + 1));
  uint64_t pr = o.seed ^ 0xABCDEF;
  for (int i = 0; i < o.shared_prefix; i++) g_prefix[i] = (int32_t)(10 + rng_next(&pr) % (uint64_t)(o.vocab - 10));
  /* open loop: the arrival times, a Poisson process */
  double *arrive = calloc((size_t)o.requests, sizeof *arrive);
  uint64_t ar = o.seed ^ 0x5151;
  for (int i = 1; i < o.requests && o.rate > 0; i++) arrive[i] = arrive[i - 1] - log(1.0 - rng_unit(&ar)) / o.rate;

  curl_global_init(CURL_GLOBAL_DEFAULT);
  CURLM *multi = curl_multi_init();
  curl_multi_setopt(multi, CURLMOPT_MAX_HOST_CONNECTIONS, 0L);
  result *res = calloc((size_t)o.requests, sizeof *res);
  double *gaps = NULL;
  size_t n_gaps = 0, cap_gaps = 0;
  int started = 0, finished = 0, running = 0, errors = 0;
  char first_err[200] = "";
  double t0 = now();
  while (finished < o.requests) {
    double t = now() - t0;
    while (started < o.requests && (o.rate > 0 ? arrive[started] <= t : running < o.concurrency)) {
      start(multi, &o, started++, endpoint);
      running++;
    }
    int still;
    curl_multi_perform(multi, &still);
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(multi, &left)) != NULL) {
      if (m->msg != CURLMSG_DONE) continue;
      xfer *x;
      curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
      long code = 0;
      curl_easy_getinfo(m->easy_handle, CURLINFO_RESPONSE_CODE, &code);
      double te = now();
      result *r = &res[x->idx];
      r->ok = m->data.result == CURLE_OK && code == 200 && !x->failed && x->t_first > 0;
      if (r->ok) {
        r->ttft = x->t_first - x->t_start;
        r->e2e = te - x->t_start;
        r->prompt_tokens = x->prompt_tokens;
        r->completion_tokens = x->completion_tokens;
        r->cached_tokens = x->cached_tokens;
        r->tpot = x->completion_tokens > 1 ? (x->t_last - x->t_first) / (double)(x->completion_tokens - 1) : 0;
        for (int g = 0; g < x->n_gaps; g++) {
          if (n_gaps == cap_gaps) {
            cap_gaps = cap_gaps ? 2 * cap_gaps : 4096;
            gaps = realloc(gaps, sizeof *gaps * cap_gaps);
          }
          gaps[n_gaps++] = x->gaps[g];
        }
      } else {
        errors++;
        if (!x->err[0] && x->len) { /* a JSON error body, not an event stream */
          json_t *j = json_loadb(x->buf, x->len, 0, NULL);
          const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
          snprintf(x->err, sizeof x->err, "%.150s", msg ? msg : x->buf);
          json_decref(j);
        }
        if (!first_err[0])
          snprintf(first_err, sizeof first_err, "HTTP %ld: %s", code,
                   m->data.result != CURLE_OK ? curl_easy_strerror(m->data.result) : x->err);
      }
      curl_multi_remove_handle(multi, x->h);
      curl_easy_cleanup(x->h);
      curl_slist_free_all(x->hdr);
      free(x->body);
      free(x->buf);
      free(x->gaps);
      free(x);
      finished++;
      running--;
    }
    /* wait for traffic, or for the next arrival */
    int wait_ms = 50;
    if (o.rate > 0 && started < o.requests) {
      double dt = arrive[started] - (now() - t0);
      wait_ms = dt <= 0 ? 0 : dt < 0.05 ? (int)(dt * 1e3) : 50;
    }
    if (running) curl_multi_poll(multi, NULL, 0, wait_ms, NULL);
    else if (wait_ms > 0) {
      struct timespec ts = {0, (long)wait_ms * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  double wall = now() - t0;
  int64_t out_tokens = 0, in_tokens = 0, cached = 0;
  double *ttft = malloc(sizeof(double) * (size_t)o.requests), *tpot = malloc(sizeof(double) * (size_t)o.requests),
         *e2e = malloc(sizeof(double) * (size_t)o.requests);
  size_t n_ok = 0;
  for (int i = 0; i < o.requests; i++) {
    if (!res[i].ok) continue;
    out_tokens += res[i].completion_tokens, in_tokens += res[i].prompt_tokens, cached += res[i].cached_tokens;
    ttft[n_ok] = res[i].ttft, tpot[n_ok] = res[i].tpot, e2e[n_ok] = res[i].e2e;
    n_ok++;
  }
  json_t *out = json_pack("{s:s, s:i, s:f, s:i, s:i, s:i, s:i, s:f, s:i, s:I, s:I, s:f, s:f, s:f, s:f}", "mode",
                          o.rate > 0 ? "open" : "closed", "concurrency", o.concurrency, "rate", o.rate, "requests",
                          o.requests, "input", o.input, "output", o.output, "shared_prefix", o.shared_prefix,
                          "shared_frac", o.shared_prefix ? o.shared_frac : 0.0, "errors", errors, "prompt_tokens",
                          (json_int_t)in_tokens, "output_tokens", (json_int_t)out_tokens, "duration_s", wall,
                          "output_tok_s", (double)out_tokens / wall, "total_tok_s", (double)(out_tokens + in_tokens) / wall,
                          "requests_s", (double)n_ok / wall);
  json_object_set_new(out, "cached_tokens", json_integer(cached));
  if (o.label) json_object_set_new(out, "label", json_string(o.label));
  json_object_set_new(out, "ttft_ms", stats(ttft, n_ok));
  json_object_set_new(out, "itl_ms", stats(gaps, n_gaps));
  json_object_set_new(out, "tpot_ms", stats(tpot, n_ok));
  json_object_set_new(out, "e2e_ms", stats(e2e, n_ok));
  if (first_err[0]) json_object_set_new(out, "first_error", json_string(first_err));
  char *s = json_dumps(out, JSON_COMPACT | JSON_REAL_PRECISION(6));
  puts(s);
  free(s);
  json_decref(out);
  curl_multi_cleanup(multi);
  curl_global_cleanup();
  free(ttft), free(tpot), free(e2e), free(gaps), free(res), free(arrive), free(g_prefix);
  return errors == o.requests ? 1 : 0;
}
