/* metrics.h — the server's request metrics for /metrics: Prometheus
 * histograms of latency (time to first token, inter-token latency, end-to-end
 * request latency, queue wait) and a counter of requests by route and HTTP
 * status, safe to update from any thread; and the one log line per request. */
#ifndef HEARTH_SERVE_METRICS_H
#define HEARTH_SERVE_METRICS_H

#include <stdint.h>

#include "base/buf.h"

typedef enum serve_hist_kind {
  SERVE_HIST_TTFT = 0,   /* request arrival → first generated token, per choice */
  SERVE_HIST_ITL,        /* between one generated token and the next */
  SERVE_HIST_E2E,        /* request arrival → the generation's end */
  SERVE_HIST_QUEUE,      /* waiting in the engine's queue before the first step that computes it */
  SERVE_HIST_COUNT
} serve_hist_kind;

typedef struct serve_metrics serve_metrics;

serve_metrics *serve_metrics_new(void); /* NULL on out of memory */
void serve_metrics_free(serve_metrics *m);
void serve_metrics_observe(serve_metrics *m, serve_hist_kind h, double seconds);
/* One answered request: route (a route table path such as "/v1/chat/completions"; NULL: "other"). */
void serve_metrics_request(serve_metrics *m, const char *route, int status);
/* The histograms (hearth_*_seconds_bucket{le=...}, _sum, _count) and hearth_http_requests_total{route,status}. */
void serve_metrics_write(serve_metrics *m, hbuf *out);

#endif
