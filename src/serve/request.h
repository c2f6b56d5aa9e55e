/* request.h — an OpenAI request body (chat or text completion) parsed and
 * validated into a plain struct, and errors in OpenAI's shape
 * {"error": {"message", "type", "param", "code"}} with their HTTP status. */
#ifndef HEARTH_SERVE_REQUEST_H
#define HEARTH_SERVE_REQUEST_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "serve/engine.h"

typedef enum serve_kind { SERVE_CHAT = 0, SERVE_COMPLETION = 1 } serve_kind;

/* An error answered to the client. */
typedef struct serve_fail {
  int status;       /* HTTP status */
  const char *type; /* static: "invalid_request_error", "authentication_error", ... */
  char param[128];  /* "" when no single field is at fault */
  char code[64];    /* "" when none */
  char message[1024];
} serve_fail;

/* Fills f and returns status. */
int serve_fail_set(serve_fail *f, int status, const char *type, const char *param, const char *code, const char *fmt,
                   ...) __attribute__((format(printf, 6, 7)));
/* The error as a JSON body (malloc'd, caller frees; NULL on out of memory). */
char *serve_fail_json(const serve_fail *f);

typedef struct serve_request {
  serve_kind kind;
  char *model;             /* owned; NULL when absent */
  serve_message *messages; /* owned (chat) */
  int nmessages;
  char *prompt;            /* owned (completion) */
  bool stream;
  bool include_usage;      /* stream_options.include_usage */
  bool echo;               /* completion: prepend the prompt to the text */
  serve_sampling sampling; /* stop and bias arrays owned here */
  int n;
  char *user;              /* owned; NULL when absent */
} serve_request;

/* Parses body[0..len) as a request of `kind`. On failure returns nonzero with
 * f filled (status 400, param naming the field) and leaves *req empty. */
int serve_request_parse(const char *body, size_t len, serve_kind kind, serve_request *req, serve_fail *f);
void serve_request_free(serve_request *req);

/* Shared by the protocol parsers (OpenAI here, Anthropic in anthropic.c). */

/* Every sampling field unset: the model's defaults. */
void serve_sampling_defaults(serve_sampling *s);
/* obj[key], or NULL when absent or JSON null (both mean "not given"). */
json_t *serve_json_field(json_t *obj, const char *key);
/* Typed fields: absent or null leaves *out as it is; a wrong type or range
 * returns 400 with f filled, param = key and a message naming it. An integer
 * may be sent as a real with an integral value. */
int serve_json_int(json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out, serve_fail *f);
int serve_json_num(json_t *obj, const char *key, double lo, double hi, double *out, serve_fail *f);
int serve_json_bool(json_t *obj, const char *key, bool *out, serve_fail *f);
int serve_json_str(json_t *obj, const char *key, char **out, serve_fail *f); /* *out malloc'd */
/* Stop strings at obj[key] into s->stop / s->nstop: an array of non-empty
 * strings (at most 16), or one string too when allow_string. */
int serve_json_stop(json_t *obj, const char *key, bool allow_string, serve_sampling *s, serve_fail *f);

#endif
