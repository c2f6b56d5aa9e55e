/* request.h — an OpenAI request body (chat or text completion) parsed and
 * validated into a plain struct, and errors in OpenAI's shape
 * {"error": {"message", "type", "param", "code"}} with their HTTP status. */
#ifndef HEARTH_SERVE_REQUEST_H
#define HEARTH_SERVE_REQUEST_H

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

#endif
