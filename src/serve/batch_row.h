/* batch_row.h — one row of the OpenAI Batch API: an input line
 * ({"custom_id", "method", "url", "body"}) checked, posted to a server of
 * hearth's own over HTTP, and its output line ({"id", "custom_id",
 * "response": {"status_code", "request_id", "body"}, "error"}). `hearth batch`
 * and the server's /v1/batches both run their rows through it, so a row is
 * answered exactly as `hearth serve` answers its body. */
#ifndef HEARTH_SERVE_BATCH_ROW_H
#define HEARTH_SERVE_BATCH_ROW_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "base/status.h"

/* Where rows are posted. */
typedef struct batch_row_target {
  struct sockaddr_storage addr; /* the server's address */
  socklen_t addr_len;
  char key[256];                /* "": no Authorization header */
  const char *priority;         /* static, NULL: none; else sent as X-Hearth-Priority */
} batch_row_target;

/* The target for a server listening on host:port: a wildcard host
 * ("0.0.0.0", "::", "") is reached on its loopback address. */
int batch_row_target_set(batch_row_target *t, const char *host, int port, const char *key, herr *err);

/* Whether url is an endpoint rows may name. */
bool batch_row_url_served(const char *url);

/* Checks input line text[0..len) (1-based line number `line`; dup: its
 * custom_id came on an earlier line too; endpoint: NULL, or the one url every
 * row must name). Returns the parsed line (caller decrefs) when it is a
 * request to run, else NULL with *error_line set to its output line (an
 * `error` object {"code", "message"}; NULL only on out of memory). */
json_t *batch_row_check(const char *text, size_t len, int line, bool dup, const char *endpoint, json_t **error_line);

/* Runs a checked line (batch_row_check's): posts its body to its url and
 * returns the output line (NULL: out of memory). *fd_slot (may be NULL) holds
 * the socket while the request is in flight (-1 otherwise), so another thread
 * may shut it down to cut the row short. *transport_failed: the server could
 * not be reached or gave no answer (the line then has a "server_error"
 * error). *completion_tokens: the answer's usage.completion_tokens (0: none). */
json_t *batch_row_post(const batch_row_target *t, json_t *line, atomic_int *fd_slot, bool *transport_failed,
                       int64_t *completion_tokens);

/* An output line with an error object {"code", "message"} (custom_id may be NULL). */
json_t *batch_row_error_line(json_t *custom_id, const char *code, const char *message);

/* The custom_id a line gives (malloc'd; NULL: none), without checking the rest. */
char *batch_row_custom_id(const char *text, size_t len);

#endif
