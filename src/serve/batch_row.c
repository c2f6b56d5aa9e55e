/* batch_row.c — a Batch API row: the input line checked (a JSON object with a
 * non-empty custom_id, method POST, a url served here and, when the batch
 * names one, its endpoint, an object body that does not stream), posted over
 * HTTP/1.0 to a server of hearth's own, and the output line made from its
 * answer. A line that is not a request gets an output line with an `error`
 * object instead. Knows HTTP only as bytes on a socket and the server only
 * by its address and key. */
#include "serve/batch_row.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/buf.h"
#include "serve/reply.h"

int batch_row_target_set(batch_row_target *t, const char *host, int port, const char *key, herr *err) {
  memset(t, 0, sizeof *t);
  if (!host || !host[0] || !strcmp(host, "0.0.0.0")) host = "127.0.0.1";
  else if (!strcmp(host, "::") || !strcmp(host, "[::]")) host = "::1";
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  int e = getaddrinfo(host, ps, &hints, &ai);
  if (e || !ai) return herr_set(err, HEARTH_EINVAL, "cannot resolve %s: %s", host, gai_strerror(e));
  memcpy(&t->addr, ai->ai_addr, ai->ai_addrlen);
  t->addr_len = ai->ai_addrlen;
  freeaddrinfo(ai);
  if (key && strlen(key) >= sizeof t->key) return herr_set(err, HEARTH_EINVAL, "the API key is too long for batch rows");
  snprintf(t->key, sizeof t->key, "%s", key ? key : "");
  return 0;
}

bool batch_row_url_served(const char *url) {
  return strcmp(url, "/v1/chat/completions") == 0 || strcmp(url, "/v1/completions") == 0 ||
         strcmp(url, "/v1/embeddings") == 0;
}

/* A random id of the Batch API's shape (prefix + 24 letters and digits). */
static json_t *random_id(const char *prefix) {
  char id[64];
  serve_random_id(id, sizeof id, prefix, 24);
  return json_string(id);
}

json_t *batch_row_error_line(json_t *custom_id, const char *code, const char *message) {
  json_t *o = json_object();
  json_object_set_new(o, "id", random_id("batch_req_"));
  json_object_set(o, "custom_id", custom_id ? custom_id : json_null());
  json_object_set_new(o, "response", json_null());
  json_t *e = json_object();
  json_object_set_new(e, "code", json_string(code));
  json_object_set_new(e, "message", json_string(message));
  json_object_set_new(o, "error", e);
  return o;
}

static json_t *response_line(json_t *custom_id, int status, json_t *body /* consumed */) {
  json_t *o = json_object();
  json_object_set_new(o, "id", random_id("batch_req_"));
  json_object_set(o, "custom_id", custom_id);
  json_t *r = json_object();
  json_object_set_new(r, "status_code", json_integer(status));
  json_t *id = json_object_get(body, "id");
  json_object_set_new(r, "request_id", json_is_string(id) ? json_incref(id) : random_id("req_"));
  json_object_set_new(r, "body", body);
  json_object_set_new(o, "response", r);
  json_object_set_new(o, "error", json_null());
  return o;
}

json_t *batch_row_check(const char *text, size_t len, int line, bool dup, const char *endpoint, json_t **error_line) {
  char msg[512];
  json_error_t je;
  *error_line = NULL;
  json_t *o = json_loadb(text, len, 0, &je);
  if (!o || !json_is_object(o)) {
    if (o) snprintf(msg, sizeof msg, "line %d: the line must be a JSON object", line);
    else snprintf(msg, sizeof msg, "line %d: not valid JSON: %s at column %d", line, je.text, je.column);
    *error_line = batch_row_error_line(NULL, "invalid_json_line", msg);
    json_decref(o);
    return NULL;
  }
  json_t *cid = json_object_get(o, "custom_id");
  json_t *method = json_object_get(o, "method");
  json_t *url = json_object_get(o, "url");
  json_t *body = json_object_get(o, "body");
  json_t *stream = json_is_object(body) ? json_object_get(body, "stream") : NULL;
  if (!json_is_string(cid) || !json_string_length(cid)) {
    snprintf(msg, sizeof msg, "line %d: 'custom_id' must be a non-empty string", line);
    *error_line = batch_row_error_line(cid, "missing_custom_id", msg);
  } else if (dup) {
    snprintf(msg, sizeof msg, "line %d: custom_id '%.200s' is on an earlier line too: each row needs its own", line,
             json_string_value(cid));
    *error_line = batch_row_error_line(cid, "duplicate_custom_id", msg);
  } else if (!json_is_string(method) || strcmp(json_string_value(method), "POST") != 0) {
    snprintf(msg, sizeof msg, "line %d: 'method' must be \"POST\"", line);
    *error_line = batch_row_error_line(cid, "invalid_method", msg);
  } else if (!json_is_string(url) || !batch_row_url_served(json_string_value(url))) {
    snprintf(msg, sizeof msg, "line %d: 'url' must be /v1/chat/completions, /v1/completions or /v1/embeddings, not %.200s",
             line, json_is_string(url) ? json_string_value(url) : "(none)");
    *error_line = batch_row_error_line(cid, "invalid_url", msg);
  } else if (endpoint && strcmp(json_string_value(url), endpoint) != 0) {
    snprintf(msg, sizeof msg, "line %d: 'url' is %.200s but the batch's endpoint is %.200s", line,
             json_string_value(url), endpoint);
    *error_line = batch_row_error_line(cid, "mismatched_url", msg);
  } else if (!json_is_object(body)) {
    snprintf(msg, sizeof msg, "line %d: 'body' must be a JSON object", line);
    *error_line = batch_row_error_line(cid, "invalid_body", msg);
  } else if (json_is_true(stream)) {
    snprintf(msg, sizeof msg, "line %d: 'body.stream' must not be true: a batch's answers are whole", line);
    *error_line = batch_row_error_line(cid, "invalid_body", msg);
  } else {
    return o;
  }
  json_decref(o);
  return NULL;
}

/* POSTs body to path; *status and *resp (the response body, malloc'd) on
 * success, else nonzero with a message in err. */
static int post(const batch_row_target *t, const char *path, const char *body, atomic_int *fd_slot, int *status,
                char **resp, char *err, size_t cap) {
  int fd = socket(t->addr.ss_family, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (const struct sockaddr *)&t->addr, t->addr_len) != 0) {
    snprintf(err, cap, "cannot reach the batch's server: %s", strerror(errno));
    if (fd >= 0) close(fd);
    return 1;
  }
  if (fd_slot) atomic_store(fd_slot, fd);
  hbuf req = {0};
  hbuf_printf(&req, "POST %s HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n",
              path, strlen(body));
  if (t->key[0]) hbuf_printf(&req, "Authorization: Bearer %s\r\n", t->key);
  if (t->priority) hbuf_printf(&req, "X-Hearth-Priority: %s\r\n", t->priority);
  hbuf_puts(&req, "\r\n");
  hbuf_puts(&req, body);
  int rc = req.oom;
  for (size_t off = 0; !rc && off < req.len;) {
    ssize_t n = send(fd, req.data + off, req.len - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) rc = 1;
    else off += (size_t)n;
  }
  hbuf_free(&req);
  hbuf in = {0};
  char buf[16384];
  for (ssize_t n; !rc && (n = recv(fd, buf, sizeof buf, 0)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) rc = 1;
    else hbuf_append(&in, buf, (size_t)n);
  }
  if (fd_slot) atomic_store(fd_slot, -1);
  close(fd);
  const char *head_end = in.data && !in.oom ? strstr(hbuf_str(&in), "\r\n\r\n") : NULL;
  if (rc || !head_end || sscanf(in.data, "HTTP/1.%*d %d", status) != 1) {
    snprintf(err, cap, "the batch's server gave no answer");
    hbuf_free(&in);
    return 1;
  }
  *resp = strdup(head_end + 4);
  hbuf_free(&in);
  if (!*resp) snprintf(err, cap, "out of memory");
  return *resp ? 0 : 1;
}

json_t *batch_row_post(const batch_row_target *t, json_t *line, atomic_int *fd_slot, bool *transport_failed,
                       int64_t *completion_tokens) {
  char msg[512];
  *transport_failed = false;
  *completion_tokens = 0;
  json_t *cid = json_object_get(line, "custom_id");
  char *text = json_dumps(json_object_get(line, "body"), JSON_COMPACT);
  char *resp = NULL;
  int status = 0;
  json_t *o;
  if (!text) {
    o = batch_row_error_line(cid, "server_error", "out of memory");
  } else if (post(t, json_string_value(json_object_get(line, "url")), text, fd_slot, &status, &resp, msg, sizeof msg)) {
    *transport_failed = true;
    o = batch_row_error_line(cid, "server_error", msg);
  } else {
    json_error_t je;
    json_t *rb = json_loads(resp, 0, &je);
    if (!rb) rb = json_string(resp);
    json_t *u = json_object_get(rb, "usage");
    *completion_tokens = json_integer_value(json_object_get(u, "completion_tokens"));
    o = response_line(cid, status, rb);
  }
  free(text);
  free(resp);
  return o;
}

char *batch_row_custom_id(const char *text, size_t len) {
  json_t *o = json_loadb(text, len, 0, NULL);
  json_t *cid = json_object_get(o, "custom_id");
  char *s = json_is_string(cid) ? strdup(json_string_value(cid)) : NULL;
  json_decref(o);
  return s;
}
