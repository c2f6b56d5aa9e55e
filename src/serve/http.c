/* http.c — libmicrohttpd's epoll event loop with a small pool of polling
 * threads (an idle connection costs a socket, not a thread), each request's
 * state from its head to its last byte, the answering threads of slow
 * requests (defer), the request head's deadline, parked streams and the
 * watcher that wakes them, and the drain's count of requests in flight (see
 * http.h). The routes, their answers and the shapes of their errors are the
 * server's (server.c, through http_app).
 *
 * A client that goes away cancels its generation: every WAIT_MS the watcher
 * checks the sockets of parked streams and takes the hang-ups its epoll set
 * heard on those of whole replies being computed (a whole reply's client is
 * gone once it closes its side, a stream's once the socket is: see
 * http_client_gone).
 *
 * libmicrohttpd answers some protocol errors itself, before any handler
 * runs, with its own small HTML page and no way to replace it (0.9.75 builds
 * them from fixed strings in transmit_error_response_len, and no
 * MHD_OPTION_* reaches them): a malformed or huge Content-Length (400 / 413;
 * 0.9.75 also repeats the status line and headers), an over-long request
 * line or header block (414 / 431), an unsupported HTTP version (505) and
 * malformed chunked bodies (400). */
#include "serve/http.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"

#define WAIT_MS 20                 /* a waiting stream's client is checked this often */
#define KEEPALIVE ": keep-alive\n\n"      /* the SSE comment a waiting stream sends */
#define HEAD_SCAN_S 0.1            /* the watcher looks for late request heads this often */
#define POLL_THREADS 4             /* libmicrohttpd's polling threads (each an epoll loop over its connections) */

struct http_server {
  struct MHD_Daemon *daemon;
  http_app app;
  char *cors;           /* owned; NULL: no CORS headers */
  int idle_timeout_s;   /* a connection without a request is closed after this */
  int header_timeout_s;
  int body_timeout_s;
  double keepalive_s;   /* a stream with nothing to send this long sends a keep-alive comment */
  int port;
  atomic_uint_fast64_t keepalives;
  /* draining: new requests are refused; in_flight counts the requests being answered */
  atomic_int draining;
  atomic_long in_flight;
  /* answers off the polling threads: `workers` running (defer); `stopping` refuses new ones */
  pthread_mutex_t workers_mu;
  pthread_cond_t workers_cv;
  int workers;
  bool stopping;
  /* streams parked until they have something to send, and the watcher that wakes them */
  pthread_mutex_t park_mu;
  http_stream *parked;  /* borrowed */
  pthread_t watcher;
  bool watcher_started, watcher_stop;
  pthread_cond_t watcher_cv;
  http_watch *whole;    /* borrowed: whole replies being computed (under park_mu) */
  int whole_ep;         /* an epoll set of their sockets (hang-ups, one event each); -1: each is polled */
  /* connections whose request head is awaited, each with its deadline (head_watch) */
  pthread_mutex_t head_mu;
  struct head_watch *heads; /* borrowed: each is its connection's socket context */
  double next_head_scan;    /* the watcher's own */
};

/* The server answering on this thread (a polling thread or a request's own),
 * for the headers every response carries. */
static __thread http_server *tl_server;
/* The request this thread answers for a suspended connection (defer): its
 * response is kept for the polling thread to queue. */
static __thread http_req *tl_deferred;
static __thread unsigned tl_status; /* the status the polling thread's last queued answer had */

double http_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void http_cors_headers(struct MHD_Response *resp) {
  if (!tl_server || !tl_server->cors) return;
  MHD_add_response_header(resp, "Access-Control-Allow-Origin", tl_server->cors);
  if (strcmp(tl_server->cors, "*") != 0) MHD_add_response_header(resp, "Vary", "Origin");
}

enum MHD_Result http_queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *resp) {
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

enum MHD_Result http_send(struct MHD_Connection *c, unsigned status, const char *type, const char *data, size_t len,
                          const char *allow) {
  struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
  if (!resp) return MHD_NO;
  MHD_add_response_header(resp, "Content-Type", type);
  if (allow) MHD_add_response_header(resp, "Allow", allow);
  http_cors_headers(resp);
  return http_queue(c, status, resp);
}

enum MHD_Result http_send_json(struct MHD_Connection *c, unsigned status, json_t *j) {
  char *s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (!s) return MHD_NO;
  enum MHD_Result rc = http_send(c, status, "application/json", s, strlen(s), NULL);
  free(s);
  return rc;
}

enum MHD_Result http_send_hbuf(struct MHD_Connection *c, hbuf *b) {
  enum MHD_Result rc = b->oom ? MHD_NO : http_send(c, 200, "application/json", hbuf_str(b), b->len, NULL);
  hbuf_free(b);
  return rc;
}

enum MHD_Result http_send_fail(struct MHD_Connection *c, const serve_fail *f, const char *allow, http_fail_fn fail_json) {
  char *s = fail_json ? fail_json(f) : serve_fail_json(f);
  if (!s) return MHD_NO;
  HLOG_DEBUG("serve: %d %s", f->status, f->message);
  enum MHD_Result rc = http_send(c, (unsigned)f->status, "application/json", s, strlen(s), allow);
  free(s);
  return rc;
}

/* ---- client liveness ---- */

int http_conn_fd(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  return ci ? (int)ci->connect_fd : -1;
}

/* True when the client is gone. For a whole reply (whole): once the client
 * has closed its side (its FIN, POLLRDHUP), whether by close() or
 * shutdown(SHUT_WR) — a client waiting for an answer does not end its input,
 * and a closed socket would look the same until the answer is written, after
 * the whole generation; so the generation stops there, as nginx ends a
 * request whose client closed (499). For a stream: only once its connection
 * was reset or its socket no longer exists, so a client that half-closed
 * still reads its stream; streams write every token, and a failed write ends
 * the connection in libmicrohttpd and cancels. A stream that has nothing to
 * write yet gets TCP keepalive probes every second on POLLRDHUP: they are
 * answered while the peer's socket lives and reset once it is gone, which
 * shows here as POLLERR/POLLHUP. A client that resets the connection
 * (killed, or closed with unread data) is seen at once. */
bool http_client_gone(int fd, bool whole) {
  if (fd < 0) return false;
  struct pollfd p = {.fd = fd, .events = POLLRDHUP};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;
  if (p.revents & POLLRDHUP) {
    if (whole) return true;
    int one = 1, idle = 1, intvl = 1, cnt = 3;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  }
  return false;
}

static void cancel_set(volatile int *flag) {
  if (flag) __atomic_store_n(flag, 1, __ATOMIC_SEQ_CST);
}
static bool flag_on(volatile int *flag) { return flag && __atomic_load_n(flag, __ATOMIC_SEQ_CST) != 0; }
/* Cancelled because the client went away (not by a drain, which still answers). */
static bool abandoned(const http_stream *st) { return flag_on(st->cancel) && !flag_on(st->drained); }

/* While a whole reply is computed the watcher looks after its client every
 * WAIT_MS (whatever the engine is doing: a long prefill, a wait for a slot,
 * tokens): a client gone sets the cancel flag, which the engine reads before
 * every forward step. Its socket joins the watcher's epoll set, which hears a
 * hang-up (EPOLLRDHUP, HUP, ERR) once, so hundreds of whole replies in flight
 * cost the watcher nothing per tick (the socket is polled each tick only when
 * the set cannot take it). */
void http_watch_add(http_server *h, http_watch *w) {
  pthread_mutex_lock(&h->park_mu);
  w->prev = &h->whole;
  w->next = h->whole;
  if (h->whole) h->whole->prev = &w->next;
  h->whole = w;
  struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLONESHOT, .data.ptr = w};
  w->in_ep = w->fd >= 0 && h->whole_ep >= 0 && epoll_ctl(h->whole_ep, EPOLL_CTL_ADD, w->fd, &ev) == 0;
  pthread_mutex_unlock(&h->park_mu);
}

void http_watch_remove(http_server *h, http_watch *w) {
  pthread_mutex_lock(&h->park_mu);
  if (w->in_ep) epoll_ctl(h->whole_ep, EPOLL_CTL_DEL, w->fd, NULL);
  w->in_ep = false;
  if (w->prev) {
    *w->prev = w->next;
    if (w->next) w->next->prev = w->prev;
    w->next = NULL;
    w->prev = NULL;
  }
  pthread_mutex_unlock(&h->park_mu);
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

/* ---- streams ---- */

void http_stream_init(http_stream *st, http_server *h) {
  memset(st, 0, sizeof *st);
  st->srv = h;
  st->fd = -1;
  pthread_mutex_init(&st->mu, NULL);
}

void http_stream_free(http_stream *st) {
  hbuf_free(&st->out);
  pthread_mutex_destroy(&st->mu);
}

/* (park_mu held) */
static void park(http_stream *st) {
  http_server *h = st->srv;
  st->parked = true;
  st->pprev = &h->parked;
  st->pnext = h->parked;
  if (h->parked) h->parked->pprev = &st->pnext;
  h->parked = st;
  MHD_suspend_connection(st->c);
}

/* (park_mu held) */
static void unpark(http_stream *st, bool resume) {
  if (!st->parked) return;
  *st->pprev = st->pnext;
  if (st->pnext) st->pnext->pprev = st->pprev;
  st->parked = false;
  st->pnext = NULL;
  st->pprev = NULL;
  if (resume) MHD_resume_connection(st->c);
}

void http_stream_push(http_stream *st, const hbuf *b, bool done) {
  pthread_mutex_lock(&st->mu);
  if (st->orphan) { /* nobody reads it, and the server may be gone */
    pthread_mutex_unlock(&st->mu);
    return;
  }
  if (b->len) hbuf_append(&st->out, b->data, b->len);
  if (done) st->done = true;
  if (b->len || done) {
    pthread_mutex_lock(&st->srv->park_mu);
    unpark(st, true);
    pthread_mutex_unlock(&st->srv->park_mu);
  }
  pthread_mutex_unlock(&st->mu);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  http_stream *st = cls;
  http_server *h = st->srv;
  pthread_mutex_lock(&st->mu);
  ssize_t n;
  if (st->sent < st->out.len) {
    size_t left = st->out.len - st->sent;
    n = (ssize_t)(left < max ? left : max);
    memcpy(buf, st->out.data + st->sent, (size_t)n);
    st->sent += (size_t)n;
    if (st->sent == st->out.len) {
      hbuf_clear(&st->out);
      st->sent = 0;
    }
    st->idle_since = http_now();
  } else if (st->done) {
    n = MHD_CONTENT_READER_END_OF_STREAM;
  } else if (abandoned(st) || http_client_gone(st->fd, false) || __atomic_load_n(&h->stopping, __ATOMIC_SEQ_CST)) {
    cancel_set(st->cancel);
    n = MHD_CONTENT_READER_END_WITH_ERROR;
  } else if (st->keepalive && http_now() - st->idle_since >= h->keepalive_s && max >= sizeof KEEPALIVE - 1) {
    /* A long prefill or a queue: an SSE comment keeps proxies and clients patient. */
    atomic_fetch_add(&h->keepalives, 1);
    memcpy(buf, KEEPALIVE, sizeof KEEPALIVE - 1);
    n = (ssize_t)(sizeof KEEPALIVE - 1);
    st->idle_since = http_now();
  } else {
    /* nothing yet: parked until the producer or the watcher has something for it (a stream
     * without keep-alive comments, NDJSON, has its idle time start over, so the watcher
     * does not wake it every tick) */
    if (!st->keepalive && http_now() - st->idle_since >= h->keepalive_s) st->idle_since = http_now();
    pthread_mutex_lock(&h->park_mu);
    if (__atomic_load_n(&h->stopping, __ATOMIC_SEQ_CST)) {
      cancel_set(st->cancel);
      n = MHD_CONTENT_READER_END_WITH_ERROR;
    } else {
      park(st);
      n = 0;
    }
    pthread_mutex_unlock(&h->park_mu);
  }
  pthread_mutex_unlock(&st->mu);
  return n;
}

/* libmicrohttpd is done with the stream (finished, or the client went away). */
static void stream_release(void *cls) {
  http_stream *st = cls;
  cancel_set(st->cancel);
  pthread_mutex_lock(&st->srv->park_mu);
  unpark(st, false);
  pthread_mutex_unlock(&st->srv->park_mu);
  if (st->free_fn) st->free_fn(st->owner);
}

struct MHD_Response *http_stream_response(http_stream *st, struct MHD_Connection *c) {
  struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st, stream_release);
  if (!resp) return NULL;
  st->c = c;
  st->idle_since = http_now();
  return resp;
}

enum MHD_Result http_stream_queue(struct MHD_Connection *c, struct MHD_Response *resp, const char *type) {
  MHD_add_response_header(resp, "Content-Type", type);
  MHD_add_response_header(resp, "Cache-Control", "no-cache");
  MHD_add_response_header(resp, "X-Accel-Buffering", "no");
  http_cors_headers(resp);
  return http_queue(c, 200, resp);
}

uint64_t http_keepalives_sent(http_server *h) { return atomic_load(&h->keepalives); }

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
  double deadline; /* http_now by which the head must be in */
  struct head_watch *next, **prev;
} head_watch;

static void head_unlink(head_watch *hw) {
  if (!hw->prev) return;
  *hw->prev = hw->next;
  if (hw->next) hw->next->prev = hw->prev;
  hw->next = NULL;
  hw->prev = NULL;
}

/* Awaits hw's next request head until `deadline` (or no longer: deadline < 0). */
static void head_await(http_server *h, head_watch *hw, double deadline) {
  if (!hw) return;
  pthread_mutex_lock(&h->head_mu);
  head_unlink(hw);
  if (deadline >= 0) {
    hw->deadline = deadline;
    hw->prev = &h->heads;
    hw->next = h->heads;
    if (h->heads) h->heads->prev = &hw->next;
    h->heads = hw;
  }
  pthread_mutex_unlock(&h->head_mu);
}

static head_watch *head_of(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode toe) {
  http_server *h = cls;
  if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
    head_watch *hw = calloc(1, sizeof *hw); /* none (out of memory): that connection has the idle limit only */
    *socket_context = hw;
    if (!hw) return;
    hw->fd = http_conn_fd(c);
    head_await(h, hw, http_now() + h->header_timeout_s);
  } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
    head_watch *hw = *socket_context;
    if (!hw) return;
    head_await(h, hw, -1);
    free(hw);
    *socket_context = NULL;
  }
}

static void heads_expire(http_server *h, double now) {
  int closed = 0;
  pthread_mutex_lock(&h->head_mu);
  for (head_watch *hw = h->heads, *next; hw; hw = next) {
    next = hw->next;
    if (now < hw->deadline) continue;
    if (hw->fd >= 0) shutdown(hw->fd, SHUT_RDWR);
    head_unlink(hw);
    closed++;
  }
  pthread_mutex_unlock(&h->head_mu);
  if (closed)
    HLOG_INFO("serve: closed %d connection(s) whose request headers were not in within %d s", closed, h->header_timeout_s);
}

/* The watcher: every WAIT_MS, wakes the parked streams whose client is gone
 * (their generation is cancelled) or whose keep-alive comment is due,
 * cancels the whole replies whose client is gone, and every HEAD_SCAN_S
 * closes the connections whose request head is late; when the server stops,
 * wakes all the parked streams. */
static void *watcher_main(void *arg) {
  http_server *h = arg;
  pthread_mutex_lock(&h->park_mu);
  while (!h->watcher_stop) {
    wait_tick(&h->watcher_cv, &h->park_mu);
    double now = http_now();
    for (http_stream *st = h->parked, *next; st; st = next) {
      next = st->pnext;
      bool gone = abandoned(st) || http_client_gone(st->fd, false);
      if (gone) cancel_set(st->cancel);
      if (gone || now - st->idle_since >= h->keepalive_s) unpark(st, true);
    }
    struct epoll_event ev[64];
    int got = 64;
    while (h->whole_ep >= 0 && got == 64) { /* the whole replies' hang-ups heard since the last tick */
      got = epoll_wait(h->whole_ep, ev, 64, 0);
      for (int i = 0; i < got; i++) cancel_set(((http_watch *)ev[i].data.ptr)->cancel);
    }
    for (http_watch *w = h->whole; w; w = w->next)
      if (!w->in_ep && !flag_on(w->cancel) && http_client_gone(w->fd, true)) cancel_set(w->cancel);
    if (now >= h->next_head_scan) {
      heads_expire(h, now);
      h->next_head_scan = now + HEAD_SCAN_S;
    }
  }
  for (http_stream *st = h->parked, *next; st; st = next) { /* stopping */
    next = st->pnext;
    cancel_set(st->cancel);
    unpark(st, true);
  }
  pthread_mutex_unlock(&h->park_mu);
  return NULL;
}

/* ---- answering threads ---- */

static void *defer_main(void *arg) {
  http_req *rq = arg;
  http_server *h = rq->srv;
  struct MHD_Connection *c = rq->c;
  tl_server = h;
  tl_deferred = rq;
  rq->resp_rc = h->app.answer(h->app.ctx, c, rq);
  tl_deferred = NULL;
  rq->deferred = 2;
  /* the polling thread calls on_request again and queues rq->resp; rq is not ours after this */
  MHD_resume_connection(c);
  pthread_mutex_lock(&h->workers_mu);
  h->workers--;
  pthread_cond_broadcast(&h->workers_cv);
  pthread_mutex_unlock(&h->workers_mu);
  return NULL;
}

/* Suspends the connection and answers it on a new thread, so that a polling
 * thread never waits on a generation. */
static enum MHD_Result defer(http_server *h, struct MHD_Connection *c, http_req *rq) {
  pthread_mutex_lock(&h->workers_mu);
  bool stopping = h->stopping;
  if (!stopping) h->workers++;
  pthread_mutex_unlock(&h->workers_mu);
  if (stopping) {
    serve_fail f;
    serve_fail_set(&f, 503, "server_error", NULL, "shutting_down", "The server is stopping");
    return http_send_fail(c, &f, NULL, rq->fail_json);
  }
  rq->srv = h;
  rq->c = c;
  rq->deferred = 1;
  MHD_suspend_connection(c);
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  int e = pthread_create(&t, &at, defer_main, rq);
  pthread_attr_destroy(&at);
  if (e == 0) return MHD_YES;
  MHD_resume_connection(c);
  rq->deferred = 0;
  pthread_mutex_lock(&h->workers_mu);
  h->workers--;
  pthread_cond_broadcast(&h->workers_cv);
  pthread_mutex_unlock(&h->workers_mu);
  serve_fail f;
  serve_fail_set(&f, 503, "server_error", NULL, NULL, "could not start a thread for the request");
  return http_send_fail(c, &f, NULL, rq->fail_json);
}

/* ---- the request cycle ---- */

static enum MHD_Result on_request_in(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                     const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  (void)version;
  http_server *h = cls;
  http_req *rq = *con_cls;
  tl_server = h;
  if (!rq) head_await(h, head_of(c), -1); /* the head is in */
  if (!rq && h->cors && strcmp(method, "OPTIONS") == 0) { /* a browser's CORS preflight */
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    http_cors_headers(resp);
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
  if (!rq) {
    rq = calloc(1, sizeof *rq);
    if (!rq) return MHD_NO;
    *con_cls = rq;
    rq->t_start = http_now();
    snprintf(rq->method, sizeof rq->method, "%s", method);
    snprintf(rq->path, sizeof rq->path, "%s", url);
    size_t n = strlen(rq->path);
    if (n > 1 && rq->path[n - 1] == '/') rq->path[n - 1] = 0;
    rq->head = strcmp(method, "HEAD") == 0;
    h->app.classify(h->app.ctx, c, url, rq);
    if (!rq->failed) {
      rq->counted = true;
      atomic_fetch_add(&h->in_flight, 1);
    }
    /* A refusal (bad route, key, size) is answered now, before libmicrohttpd
     * sends "100 Continue" or reads a byte of the body; the connection is
     * then closed. */
    if (rq->failed) return http_send_fail(c, &rq->fail, rq->allow, rq->fail_json);
    /* headers are in: the body may take its time, up to body_timeout_s of silence */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)h->body_timeout_s);
    return MHD_YES;
  }
  if (*upload_size) {
    if (!rq->failed) {
      if (rq->body.len + *upload_size > rq->max_body) {
        rq->failed = true;
        serve_fail_set(&rq->fail, 413, "invalid_request_error", NULL, "request_too_large",
                       "The request body is over the limit of %zu bytes", rq->max_body);
        hbuf_free(&rq->body);
      } else {
        hbuf_append(&rq->body, upload, *upload_size);
        if (rq->body.oom) {
          rq->failed = true;
          serve_fail_set(&rq->fail, 500, "server_error", NULL, NULL, "out of memory reading the request");
          hbuf_free(&rq->body);
        }
      }
    }
    *upload_size = 0; /* consumed (or dropped) */
    return MHD_YES;
  }
  /* the whole request is in: no inactivity limit while it is answered (a
   * long generation before a whole reply sends nothing) */
  MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
  if (rq->failed) return http_send_fail(c, &rq->fail, rq->allow, rq->fail_json);
  if (rq->deferred == 2) { /* answered on its own thread (defer) */
    if (!rq->resp) return MHD_NO; /* nothing to send (the client went away, or out of memory): close */
    struct MHD_Response *resp = rq->resp;
    rq->resp = NULL;
    tl_status = rq->resp_status;
    enum MHD_Result rc = MHD_queue_response(c, rq->resp_status, resp);
    MHD_destroy_response(resp);
    return rc;
  }
  if (rq->slow) return defer(h, c, rq);
  return h->app.answer(h->app.ctx, c, rq);
}

/* on_request_in, noting the status of an answer it queued (for the request's log line and counter). */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  tl_status = 0;
  enum MHD_Result rc = on_request_in(cls, c, url, method, version, upload, upload_size, con_cls);
  http_req *rq = *con_cls;
  if (rq && tl_status) rq->status = tl_status;
  return rc;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why) {
  http_server *h = cls;
  http_req *rq = *con_cls;
  /* kept alive for the next request: it has the idle limit again */
  if (why == MHD_REQUEST_TERMINATED_COMPLETED_OK) {
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)h->idle_timeout_s);
    head_await(h, head_of(c), http_now() + h->idle_timeout_s + h->header_timeout_s);
  }
  if (!rq) return;
  if (h->app.done) h->app.done(h->app.ctx, rq);
  if (rq->counted) atomic_fetch_sub(&h->in_flight, 1);
  if (rq->resp) MHD_destroy_response(rq->resp); /* made, never sent (the client went away) */
  hbuf_free(&rq->body);
  free(rq);
  *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
  (void)cls;
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

int http_start(http_server **out, const http_config *cfg, const http_app *app, herr *err) {
  *out = NULL;
  http_server *h = calloc(1, sizeof *h);
  if (!h) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  h->app = *app;
  h->cors = cfg->cors && cfg->cors[0] ? strdup(cfg->cors) : NULL;
  h->idle_timeout_s = cfg->idle_timeout_s;
  h->header_timeout_s = cfg->header_timeout_s;
  h->body_timeout_s = cfg->body_timeout_s;
  h->keepalive_s = cfg->keepalive_s;
  raise_fd_limit(cfg->max_connections + 64);
  pthread_mutex_init(&h->workers_mu, NULL);
  pthread_cond_init(&h->workers_cv, NULL);
  pthread_mutex_init(&h->park_mu, NULL);
  pthread_mutex_init(&h->head_mu, NULL);
  h->whole_ep = epoll_create1(EPOLL_CLOEXEC);
  pthread_cond_init(&h->watcher_cv, NULL);
  atomic_init(&h->draining, 0);
  atomic_init(&h->in_flight, 0);
  if (pthread_create(&h->watcher, NULL, watcher_main, h) != 0) {
    http_stop(h);
    return herr_set(err, HEARTH_ENOMEM, "cannot start the server's watcher thread");
  }
  h->watcher_started = true;
  unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG; /* epoll on Linux */
  if (cfg->ipv6) flags |= MHD_USE_IPv6;
  h->daemon = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, h,                  /* */
                               MHD_OPTION_SOCK_ADDR, cfg->addr,                                       /* */
                               MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,                          /* */
                               MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,                        /* */
                               MHD_OPTION_THREAD_POOL_SIZE, (unsigned)POLL_THREADS,                   /* */
                               MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)h->idle_timeout_s,            /* */
                               MHD_OPTION_CONNECTION_LIMIT, cfg->max_connections,                     /* */
                               MHD_OPTION_PER_IP_CONNECTION_LIMIT, cfg->max_per_client,               /* */
                               MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, h,                             /* */
                               MHD_OPTION_END);
  if (!h->daemon) {
    int e = errno;
    http_stop(h);
    return herr_set(err, HEARTH_EIO, "cannot listen on %s:%d: %s", cfg->host, cfg->port,
                    e ? strerror(e) : "libmicrohttpd refused to start");
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
  h->port = di ? di->port : cfg->port;
  *out = h;
  return 0;
}

int http_port(const http_server *h) { return h->port; }

void http_halt(http_server *h) {
  pthread_mutex_lock(&h->workers_mu);
  __atomic_store_n(&h->stopping, true, __ATOMIC_SEQ_CST);
  pthread_mutex_unlock(&h->workers_mu);
}

bool http_stopping(http_server *h) { return __atomic_load_n(&h->stopping, __ATOMIC_SEQ_CST); }

void http_stop(http_server *h) {
  if (!h) return;
  /* No connection may be suspended when the daemon stops: new answering threads are refused,
   * the answering threads waited for (each resumes its connection), and the parked streams
   * woken, with nothing parked from then on. */
  http_halt(h);
  pthread_mutex_lock(&h->workers_mu);
  while (h->workers > 0) pthread_cond_wait(&h->workers_cv, &h->workers_mu);
  pthread_mutex_unlock(&h->workers_mu);
  if (h->watcher_started) {
    pthread_mutex_lock(&h->park_mu);
    h->watcher_stop = true;
    pthread_cond_signal(&h->watcher_cv);
    pthread_mutex_unlock(&h->park_mu);
    pthread_join(h->watcher, NULL);
  }
  if (h->daemon) MHD_stop_daemon(h->daemon);
  pthread_mutex_destroy(&h->workers_mu);
  pthread_cond_destroy(&h->workers_cv);
  pthread_mutex_destroy(&h->park_mu);
  pthread_mutex_destroy(&h->head_mu);
  pthread_cond_destroy(&h->watcher_cv);
  if (h->whole_ep >= 0) close(h->whole_ep);
  free(h->cors);
  free(h);
}

/* ---- draining ---- */

int http_draining(http_server *h) { return atomic_load(&h->draining); }

void http_drain_begin(http_server *h) {
  int was = 0;
  atomic_compare_exchange_strong(&h->draining, &was, 1);
}

void http_drain_set(http_server *h, int state) { atomic_store(&h->draining, state); }

int64_t http_in_flight(http_server *h) { return atomic_load(&h->in_flight); }

/* Waits up to `until` for the requests in flight to be answered; false when a signal of `sigs` came first. */
static bool wait_idle(http_server *h, const sigset_t *sigs, double until) {
  while (http_in_flight(h) > 0 && http_now() < until) {
    struct timespec ts = {.tv_sec = 0, .tv_nsec = 20 * 1000 * 1000};
    if (sigs) {
      if (sigtimedwait(sigs, NULL, &ts) > 0) return false;
    } else {
      nanosleep(&ts, NULL);
    }
  }
  return true;
}

int http_drain(http_server *h, double timeout_s, const sigset_t *sigs, double grace_s, int (*cut)(void *ctx),
               void *ctx) {
  if (wait_idle(h, sigs, http_now() + timeout_s) && http_in_flight(h) == 0) return 0;
  int n = cut(ctx);
  /* their ends, and replies still being written, get a few seconds to go out */
  wait_idle(h, NULL, http_now() + grace_s);
  return n;
}
