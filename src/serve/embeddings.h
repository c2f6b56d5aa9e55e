/* embeddings.h — POST /v1/embeddings: the OpenAI request parsed and checked
 * into inputs (text or token ids), and the reply (floats or base64 of
 * little-endian float32, as OpenAI sends them). */
#ifndef HEARTH_SERVE_EMBEDDINGS_H
#define HEARTH_SERVE_EMBEDDINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "serve/engine.h"
#include "serve/request.h"

#define EMBED_MAX_INPUTS 2048

typedef struct embed_request {
  char *model;               /* owned; NULL when absent */
  serve_embed_input *inputs; /* owned */
  int n;
  bool base64;               /* encoding_format "base64" */
  int dimensions;            /* 0: the model's width */
  char *instruction;         /* owned; NULL when absent (hearth's extension: Qwen3-Embedding's query form) */
} embed_request;

/* Parses body[0..len): input (a non-empty string, an array of them, an array
 * of token ids or an array of such arrays; ids below vocab when vocab > 0),
 * encoding_format (float, base64), dimensions (>= 1), instruction, model,
 * user. On failure returns the HTTP status with f filled (param names the
 * field, e.g. "input[2]") and leaves *req empty. */
int embed_request_parse(const char *body, size_t len, int64_t vocab, embed_request *req, serve_fail *f);
void embed_request_free(embed_request *req);

/* The reply: {"object":"list","data":[{"object":"embedding","index":i,
 * "embedding":[...] or "base64"}],"model":...,"usage":{...}}; vecs holds
 * req->n vectors of dim floats. */
void embed_reply(const embed_request *req, const float *vecs, int dim, const char *model, int64_t prompt_tokens, hbuf *out);

/* base64 (RFC 4648, padded) of n floats as little-endian float32, appended to out. */
void embed_base64(const float *v, size_t n, hbuf *out);

#endif
