/* infill.h — POST /infill, llama.cpp's fill-in-the-middle endpoint (what
 * llama.vim and llama.vscode call): the request parsed into a completion
 * serve_request marked fim/infill, and the replies in llama.cpp's shapes.
 *   request  {"input_prefix", "input_suffix", "input_extra": [{"filename", "text"}],
 *             "prompt", "n_predict", "temperature", "top_k", "top_p", "min_p", "seed",
 *             "stop", "stream", "repeat_penalty", "presence_penalty", "frequency_penalty",
 *             "ignore_eos", "model", "cache_prompt"}
 *   reply    {"index": 0, "content", "stop": true, "model", "tokens_predicted",
 *             "tokens_evaluated", "tokens_cached", "truncated", "stop_type"
 *             ("eos" | "limit" | "word"), "stopping_word"}
 *   stream   data: {"index": 0, "content", "stop": false} per piece of text, then
 *            data: the reply above with "content": "" */
#ifndef HEARTH_SERVE_INFILL_H
#define HEARTH_SERVE_INFILL_H

#include <stddef.h>

#include "base/buf.h"
#include "serve/engine.h"
#include "serve/request.h"

/* On failure returns the HTTP status with f filled (param naming the field) and leaves *req empty. */
int infill_request_parse(const char *body, size_t len, serve_request *req, serve_fail *f);
/* The whole reply: text generated, r its result. */
void infill_body(const serve_request *req, const char *model, const char *text, size_t len, const serve_result *r,
                 hbuf *out);
void infill_sse_token(const char *text, size_t len, hbuf *out);
void infill_sse_finish(const serve_request *req, const char *model, const serve_result *r, hbuf *out);
void infill_sse_error(const serve_fail *f, hbuf *out);

#endif
