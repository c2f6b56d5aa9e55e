/* tokenize.h — POST /tokenize and POST /detokenize, in llama.cpp's shapes
 * (and vLLM's): the requests parsed and checked, and the replies as JSON.
 *   /tokenize    {"content": TEXT, "add_special": bool, "with_pieces": bool}
 *                (vLLM: "prompt" for content, "add_special_tokens", or chat
 *                "messages" rendered with the template) →
 *                {"tokens": [ids] or [{"id", "piece"}], "count", "max_model_len"}
 *   /detokenize  {"tokens": [ids]} → {"content": TEXT, "prompt": TEXT} */
#ifndef HEARTH_SERVE_TOKENIZE_H
#define HEARTH_SERVE_TOKENIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "serve/engine.h"
#include "serve/request.h"

typedef struct tokenize_request {
  char *model;        /* owned; NULL when absent */
  char *content;      /* owned: the text, or NULL with is_chat */
  serve_request chat; /* messages (tools, chat_template_kwargs) when is_chat */
  bool is_chat;
  bool add_special;   /* default: false for llama.cpp's "content" and for messages, true for vLLM's "prompt" */
  bool with_pieces;   /* each token as {"id", "piece"} */
} tokenize_request;

/* Exactly one of content / prompt (a string) and messages. On failure returns
 * the HTTP status with f filled and leaves *req empty. */
int tokenize_request_parse(const char *body, size_t len, tokenize_request *req, serve_fail *f);
void tokenize_request_free(tokenize_request *req);

/* The ids of "tokens" (each in [0, vocab)), *ids malloc'd; "model" into *model
 * (malloc'd, NULL when absent). */
int detokenize_request_parse(const char *body, size_t len, int64_t vocab, int32_t **ids, size_t *n, char **model,
                             serve_fail *f);

/* pieces[i] (may be NULL without with_pieces): the text of ids[i] alone, plen[i] bytes. */
void tokenize_reply(const int32_t *ids, size_t n, char *const *pieces, const size_t *plen, int64_t max_model_len,
                    hbuf *out);
void detokenize_reply(const char *text, size_t len, hbuf *out);

#endif
