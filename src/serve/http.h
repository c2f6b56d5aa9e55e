/* http.h — the HTTP machinery under the server: libmicrohttpd's epoll loop on
 * a pool of polling threads, each request's state from its head to its last
 * byte, refusals decided from the head answered before any body byte (and
 * before "100 Continue"), bodies read under a limit, slow answers made on
 * threads of their own while the connection is suspended (defer), the
 * request head's deadline, streams whose bytes a producer pushes and whose
 * connection is parked while there is nothing to send (woken by the producer,
 * or by the watcher for a keep-alive comment or a client gone), whole
 * replies whose client the watcher checks, and the drain's count of requests
 * in flight. Knows no route, protocol or engine: the server classifies and
 * answers each request through http_app. */
#ifndef HEARTH_SERVE_HTTP_H
#define HEARTH_SERVE_HTTP_H

#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "base/buf.h"
#include "base/status.h"
#include "serve/request.h"

typedef struct http_server http_server;
struct route_def;

/* The error body of a refusal in a protocol's shape (malloc'd; NULL: out of memory). */
typedef char *(*http_fail_fn)(const serve_fail *f);

/* One request, from its head to its last byte (libmicrohttpd's con_cls). */
typedef struct http_req {
  /* set by http before classify */
  char method[8];
  char path[512];            /* the URL path without a trailing slash */
  bool head;                 /* HEAD: answered as GET without the body */
  double t_start;            /* its head arrived (http_now) */
  /* set by the app's classify */
  bool failed;               /* `fail` is the answer; the body is read and dropped */
  serve_fail fail;
  const char *allow;         /* for 405 */
  char allow_buf[64];        /* the methods a path takes, when allow points here */
  http_fail_fn fail_json;    /* the shape of its errors; NULL: OpenAI's (serve_fail_json) */
  size_t max_body;           /* its body limit */
  bool slow;                 /* answered on a thread of its own (defer) */
  const struct route_def *route; /* the app's: the route it matched (NULL: none) */
  int proto;                 /* the app's: the protocol whose shapes answer it */
  const char *route_path;    /* static: the route table's path, for /metrics and the log line */
  int priority;              /* X-Hearth-Priority: 0 (normal), 1 (low: batch rows) */
  /* for the app's answer */
  hbuf body;                 /* owned */
  bool job_owned;            /* the app logs and counts it itself when it ends (a generation) */
  unsigned status;           /* the answer's; 0: none (the client went away) */
  /* http's own */
  bool counted;              /* in in_flight until it completes */
  int deferred;              /* answered on a thread of its own: 1 while it runs, 2 once done */
  struct MHD_Response *resp; /* owned: the answer made there, queued by the polling thread */
  unsigned resp_status;
  enum MHD_Result resp_rc;
  http_server *srv;          /* borrowed, for the answering thread */
  struct MHD_Connection *c;
} http_req;

/* What the server does with requests. */
typedef struct http_app {
  void *ctx;
  /* The head is in (method, path, head and t_start set; url as sent): route, key, size.
   * rq->failed (with rq->fail) refuses it. */
  void (*classify)(void *ctx, struct MHD_Connection *c, const char *url, http_req *rq);
  /* Answers a whole request (its body in rq->body): on a polling thread, or on a
   * thread of its own when rq->slow. */
  enum MHD_Result (*answer)(void *ctx, struct MHD_Connection *c, http_req *rq);
  /* The request is over (rq->status 0: the client went away). */
  void (*done)(void *ctx, http_req *rq);
} http_app;

typedef struct http_config {
  const struct sockaddr *addr; /* borrowed: where to listen */
  bool ipv6;
  int port;                    /* for the message when listening fails */
  const char *host;            /* likewise */
  unsigned max_connections, max_per_client;
  int idle_timeout_s, header_timeout_s, body_timeout_s;
  double keepalive_s;          /* a stream idle this long sends a keep-alive comment */
  const char *cors;            /* borrowed; NULL: no CORS headers */
} http_config;

/* Starts listening; requests go to app until http_stop. */
int http_start(http_server **out, const http_config *cfg, const http_app *app, herr *err);
/* The port actually bound. */
int http_port(const http_server *h);
/* Refuses new answering threads from now on; the caller then cancels what runs. */
void http_halt(http_server *h);
/* Whether http_halt was called. */
bool http_stopping(http_server *h);
/* Waits for the answering threads, wakes the parked streams, stops the loop and frees. */
void http_stop(http_server *h);
/* Keep-alive comments sent so far (all streams). */
uint64_t http_keepalives_sent(http_server *h);

/* Monotonic seconds. */
double http_now(void);

/* ---- answers (on a polling thread, or on a request's own: kept for the polling thread) ---- */

/* Queues resp (consumed) with status. */
enum MHD_Result http_queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *resp);
/* The CORS headers every answer carries (none without --cors). */
void http_cors_headers(struct MHD_Response *resp);
enum MHD_Result http_send(struct MHD_Connection *c, unsigned status, const char *type, const char *data, size_t len,
                          const char *allow);
/* j consumed. */
enum MHD_Result http_send_json(struct MHD_Connection *c, unsigned status, json_t *j);
/* b's bytes as a 200 JSON answer (MHD_NO when b ran out of memory); b freed. */
enum MHD_Result http_send_hbuf(struct MHD_Connection *c, hbuf *b);
/* An error in the shape of fail_json (NULL: OpenAI's). */
enum MHD_Result http_send_fail(struct MHD_Connection *c, const serve_fail *f, const char *allow, http_fail_fn fail_json);

/* ---- clients ---- */

/* The connection's socket (-1: unknown). */
int http_conn_fd(struct MHD_Connection *c);
/* Whether the client on fd is gone: for a whole reply (whole) once it closed its side,
 * for a stream once its connection was reset or its socket is gone. */
bool http_client_gone(int fd, bool whole);

/* A whole reply being computed: the watcher sets *cancel when its client goes away. */
typedef struct http_watch {
  int fd;
  volatile int *cancel;
  struct http_watch *next, **prev;
  bool in_ep;          /* (the watcher's) its socket is in the watcher's epoll set */
} http_watch;
void http_watch_add(http_server *h, http_watch *w);
void http_watch_remove(http_server *h, http_watch *w);

/* ---- streams ----
 * The producer pushes bytes (http_stream_push); libmicrohttpd's reader hands
 * them over. A reader with nothing to hand over parks the connection; the
 * producer, or the watcher (a keep-alive comment due, the client gone),
 * unparks it. */
typedef struct http_stream {
  http_server *srv;          /* borrowed */
  pthread_mutex_t mu;
  hbuf out;                  /* owned: bytes produced but not yet sent */
  size_t sent;               /* bytes of out already handed over */
  bool done;                 /* the producer finished: out is all there is */
  bool orphan;               /* (under mu) nobody reads it any more: pushes are dropped */
  bool keepalive;            /* send ": keep-alive" comments while idle (SSE; not NDJSON) */
  int fd;                    /* the client's socket */
  volatile int *cancel;      /* set when the client is gone or the server stops */
  volatile int *drained;     /* set by a drain: cancelled, yet still answered */
  void (*free_fn)(void *owner); /* libmicrohttpd let go of the stream (after it is unparked) */
  void *owner;
  struct MHD_Connection *c;  /* suspended while parked */
  double idle_since;         /* when it last had bytes handed over */
  bool parked;               /* (under the server's park lock) */
  struct http_stream *pnext, **pprev;
} http_stream;

/* mu initialised; the rest zero. */
void http_stream_init(http_stream *st, http_server *h);
/* Frees out and mu. */
void http_stream_free(http_stream *st);
/* Appends b's bytes (done: nothing more comes) and wakes the reader. */
void http_stream_push(http_stream *st, const hbuf *b, bool done);
/* The stream's answer: a 200 of content type `type` whose body is what is pushed. From here
 * the response owns the stream's owner: free_fn runs when libmicrohttpd lets go of it.
 * *resp NULL (out of memory): nothing owns it. */
struct MHD_Response *http_stream_response(http_stream *st, struct MHD_Connection *c);
enum MHD_Result http_stream_queue(struct MHD_Connection *c, struct MHD_Response *resp, const char *type);

/* ---- draining ---- */

/* 0: serving; 1: new requests refused; 2: the generations were cut. */
int http_draining(http_server *h);
void http_drain_begin(http_server *h);
void http_drain_set(http_server *h, int state);
/* Requests being answered, from their headers to their last byte. */
int64_t http_in_flight(http_server *h);
/* The graceful stop after http_drain_begin: up to timeout_s for the requests
 * in flight (cut short by a signal of sigs), then cut(ctx) and up to grace_s
 * for the ends to go out. Returns cut's count (0 when none was needed). */
int http_drain(http_server *h, double timeout_s, const sigset_t *sigs, double grace_s, int (*cut)(void *ctx),
               void *ctx);

#endif
