/* metrics.c — Prometheus histograms and request counters for the server's
 * /metrics: fixed buckets (vLLM's for the same quantities), cumulative as
 * the text format wants them, each histogram under its own lock (an
 * observation is a few additions). Knows nothing of HTTP or of the engine. */
#include "serve/metrics.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double ttft_le[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                 2.5,   5.0,   7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double itl_le[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                                20.0, 40.0, 80.0};
static const double e2e_le[] = {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,  2.5,   5.0,   10.0,  15.0,  20.0,  30.0,
                                40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
static const double queue_le[] = {0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                                  10.0,   30.0,  60.0,  120.0, 300.0, 600.0};

static const struct {
  const char *name, *help;
  const double *le;
  int n;
} hist_defs[SERVE_HIST_COUNT] = {
    {"time_to_first_token_seconds", "Seconds from a request's arrival to a choice's first generated token.", ttft_le,
     (int)(sizeof ttft_le / sizeof *ttft_le)},
    {"inter_token_latency_seconds", "Seconds between one generated token of a choice and the next.", itl_le,
     (int)(sizeof itl_le / sizeof *itl_le)},
    {"e2e_request_latency_seconds", "Seconds from a generating request's arrival to the end of its generation.", e2e_le,
     (int)(sizeof e2e_le / sizeof *e2e_le)},
    {"request_queue_time_seconds", "Seconds a choice waited in the engine's queue before it was first computed.",
     queue_le, (int)(sizeof queue_le / sizeof *queue_le)},
};

#define MAX_LE 32
#define MAX_SERIES 256

typedef struct hist {
  uint64_t counts[MAX_LE + 1]; /* per bucket (not cumulative); the last: above every bound */
  double sum;
  uint64_t count;
} hist;

typedef struct series {
  char route[64];
  int status;
  uint64_t n;
} series;

struct serve_metrics {
  pthread_mutex_t mu;
  hist h[SERVE_HIST_COUNT];
  series req[MAX_SERIES];
  int n_req;
  uint64_t req_dropped; /* series beyond MAX_SERIES, counted under route "other" */
};

serve_metrics *serve_metrics_new(void) {
  serve_metrics *m = calloc(1, sizeof *m);
  if (m) pthread_mutex_init(&m->mu, NULL);
  return m;
}

void serve_metrics_free(serve_metrics *m) {
  if (!m) return;
  pthread_mutex_destroy(&m->mu);
  free(m);
}

void serve_metrics_observe(serve_metrics *m, serve_hist_kind k, double v) {
  if (!m || k < 0 || k >= SERVE_HIST_COUNT || !(v >= 0)) return;
  int b = 0;
  while (b < hist_defs[k].n && v > hist_defs[k].le[b]) b++;
  pthread_mutex_lock(&m->mu);
  m->h[k].counts[b]++;
  m->h[k].sum += v;
  m->h[k].count++;
  pthread_mutex_unlock(&m->mu);
}

void serve_metrics_request(serve_metrics *m, const char *route, int status) {
  if (!m) return;
  if (!route) route = "other";
  pthread_mutex_lock(&m->mu);
  int i = 0;
  while (i < m->n_req && !(m->req[i].status == status && !strcmp(m->req[i].route, route))) i++;
  if (i == m->n_req && m->n_req < MAX_SERIES) {
    snprintf(m->req[i].route, sizeof m->req[i].route, "%s", route);
    m->req[i].status = status;
    m->n_req++;
  }
  if (i < m->n_req) m->req[i].n++;
  else m->req_dropped++;
  pthread_mutex_unlock(&m->mu);
}

void serve_metrics_write(serve_metrics *m, hbuf *out) {
  if (!m) return;
  pthread_mutex_lock(&m->mu);
  for (int k = 0; k < SERVE_HIST_COUNT; k++) {
    const char *name = hist_defs[k].name;
    hbuf_printf(out, "# HELP hearth_%s %s\n# TYPE hearth_%s histogram\n", name, hist_defs[k].help, name);
    uint64_t cum = 0;
    for (int b = 0; b < hist_defs[k].n; b++) {
      cum += m->h[k].counts[b];
      hbuf_printf(out, "hearth_%s_bucket{le=\"%g\"} %llu\n", name, hist_defs[k].le[b], (unsigned long long)cum);
    }
    cum += m->h[k].counts[hist_defs[k].n];
    hbuf_printf(out, "hearth_%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    hbuf_printf(out, "hearth_%s_sum %.17g\nhearth_%s_count %llu\n", name, m->h[k].sum, name,
                (unsigned long long)m->h[k].count);
  }
  hbuf_puts(out, "# HELP hearth_http_requests_total HTTP requests answered, by route and status.\n"
                 "# TYPE hearth_http_requests_total counter\n");
  for (int i = 0; i < m->n_req; i++)
    hbuf_printf(out, "hearth_http_requests_total{route=\"%s\",status=\"%d\"} %llu\n", m->req[i].route, m->req[i].status,
                (unsigned long long)m->req[i].n);
  if (m->req_dropped)
    hbuf_printf(out, "hearth_http_requests_total{route=\"other\",status=\"0\"} %llu\n", (unsigned long long)m->req_dropped);
  pthread_mutex_unlock(&m->mu);
}
