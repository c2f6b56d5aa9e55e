/* serve_harness.h — what the server's C tests share to start a server and
 * talk to it over raw sockets (the node tests' counterpart is harness.cjs):
 * dialing 127.0.0.1 (from a chosen local address too), one request with
 * Connection: close and its whole response, the status and JSON body of a
 * response, waiting for a stream's first event, and a server over the real
 * engine on a model folder started and stopped as one. */
#ifndef HEARTH_TESTS_SERVE_HARNESS_H
#define HEARTH_TESTS_SERVE_HARNESS_H

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "serve/engine.h"
#include "serve/server.h"

/* A connection to the server from the local address `from` (NULL: any); -1 when refused. */
static inline int dial_from(const char *from, int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (from) {
    struct sockaddr_in me = {.sin_family = AF_INET};
    inet_pton(AF_INET, from, &me.sin_addr);
    if (bind(fd, (struct sockaddr *)&me, sizeof me) != 0) {
      close(fd);
      return -1;
    }
  }
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static inline int dial(int port) { return dial_from(NULL, port); }

static inline void send_all(int fd, const char *s, size_t n) {
  while (n) {
    ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
    if (w <= 0) return;
    s += w;
    n -= (size_t)w;
  }
}

/* A request with Connection: close: headers (each line ending in \r\n) and a JSON body may be NULL. */
static inline void send_request(int fd, const char *method, const char *path, const char *headers, const char *body) {
  hbuf req = {0};
  hbuf_printf(&req, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s", method, path, headers ? headers : "");
  if (body) hbuf_printf(&req, "Content-Type: application/json\r\nContent-Length: %zu\r\n", strlen(body));
  hbuf_puts(&req, "\r\n");
  if (body) hbuf_puts(&req, body);
  send_all(fd, req.data, req.len);
  hbuf_free(&req);
}

/* Everything the server sends until it closes; closes fd (caller frees). */
static inline char *read_all(int fd) {
  hbuf resp = {0};
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) hbuf_append(&resp, buf, (size_t)n);
  close(fd);
  char *out = hbuf_take(&resp);
  return out ? out : strdup("");
}

/* One request to the server on port; the whole response (caller frees; "" when refused). */
static inline char *http_at(int port, const char *method, const char *path, const char *headers, const char *body) {
  int fd = dial(port);
  if (fd < 0) return strdup("");
  send_request(fd, method, path, headers, body);
  return read_all(fd);
}

static inline int status_of(const char *resp) {
  int code = 0;
  sscanf(resp, "HTTP/1.1 %d", &code);
  return code;
}

/* The response's body as JSON, or NULL. */
static inline json_t *body_json(const char *resp) {
  const char *b = strstr(resp, "\r\n\r\n");
  return b ? json_loads(b + 4, 0, NULL) : NULL;
}

static inline void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Reads a stream until its first "data: " event has arrived. */
static inline bool await_first_token(int fd) {
  hbuf got = {0};
  char buf[512];
  ssize_t n;
  bool ok = false;
  while (!ok && (n = recv(fd, buf, sizeof buf, 0)) > 0) {
    hbuf_append(&got, buf, (size_t)n);
    ok = strstr(hbuf_str(&got), "data: ") != NULL;
  }
  hbuf_free(&got);
  return ok;
}

/* A server over the real engine on one model folder. */
typedef struct harness {
  serve_engine engine;
  serve_server *srv;
  int port;
} harness;

/* Opens the engine on model with eo and starts a server on it with cfg (NULL: any free port). */
static inline int harness_start(harness *h, const char *model, const serve_engine_opts *eo, const serve_config *cfg, herr *err) {
  memset(h, 0, sizeof *h);
  int rc = serve_engine_open_opts(model, eo, &h->engine, err);
  if (rc) return rc;
  serve_config any = {.port = 0};
  if ((rc = serve_start(&h->srv, &h->engine, cfg ? cfg : &any, err))) {
    serve_engine_close(&h->engine);
    return rc;
  }
  h->port = serve_port(h->srv);
  return 0;
}

static inline void harness_stop(harness *h) {
  serve_stop(h->srv);
  serve_engine_close(&h->engine);
}

#endif
