/* signal.c — hearth's /v1/signal request (prompt text or ids, or chat
 * messages; bins, top) parsed and checked, and its JSON reply: the
 * histogram of the next token's log-probabilities over the fixed range
 * [HEARTH_SIGNAL_LO, 0], entropy and best tokens. Knows nothing of models
 * or HTTP. */
#include "serve/signal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void signal_request_free(signal_request *req) {
  free(req->model);
  free(req->prompt);
  free(req->ids);
  if (req->is_chat) serve_request_free(&req->chat);
  memset(req, 0, sizeof *req);
}

int signal_request_parse(const char *body, size_t len, int64_t vocab, signal_request *req, serve_fail *f) {
  memset(req, 0, sizeof *req);
  req->bins = SIGNAL_DEFAULT_BINS;
  req->top = SIGNAL_DEFAULT_TOP;
  json_error_t je;
  json_t *root = json_loadb(body, len, 0, &je);
  if (!root) return serve_bad(f, "", "the request body is not valid JSON: %s at line %d column %d", je.text, je.line, je.column);
  int rc = 0;
  int64_t bins = req->bins, top = req->top;
  if (!json_is_object(root)) {
    rc = serve_bad(f, "", "the request body must be a JSON object");
    goto out;
  }
  if ((rc = serve_json_str(root, "model", &req->model, f)) ||
      (rc = serve_json_int(root, "bins", 1, HEARTH_SIGNAL_MAX_BINS, &bins, f)) ||
      (rc = serve_json_int(root, "top", 0, HEARTH_MAX_TOP_LOGPROBS, &top, f)))
    goto out;
  req->bins = (int)bins;
  req->top = (int)top;
  json_t *prompt = serve_json_field(root, "prompt"), *messages = serve_json_field(root, "messages");
  if (prompt && messages) {
    rc = serve_bad(f, "prompt", "give either 'prompt' or 'messages', not both");
  } else if (messages) {
    /* the chat completion parser reads messages, tools and template kwargs alike */
    if ((rc = serve_request_parse(body, len, SERVE_CHAT, &req->chat, f))) goto out;
    req->is_chat = true;
  } else if (!prompt) {
    rc = serve_bad(f, "prompt", "'prompt' (text or token ids) or 'messages' is required");
  } else if (json_is_string(prompt)) {
    if (json_string_length(prompt) == 0) rc = serve_bad(f, "prompt", "'prompt' is an empty string");
    else if (!(req->prompt = strdup(json_string_value(prompt)))) rc = serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  } else if (json_is_array(prompt)) {
    size_t n = json_array_size(prompt);
    if (n == 0) {
      rc = serve_bad(f, "prompt", "'prompt' is an empty array of token ids");
      goto out;
    }
    if (!(req->ids = malloc(sizeof(int32_t) * n))) {
      rc = serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
      goto out;
    }
    for (size_t i = 0; i < n && !rc; i++) {
      json_t *v = json_array_get(prompt, i);
      json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
      if (!json_is_integer(v)) rc = serve_bad(f, "prompt", "'prompt' must be a string or an array of token ids; item %zu is not an integer", i);
      else if (id < 0 || id > INT32_MAX || (vocab > 0 && id >= vocab))
        rc = serve_bad(f, "prompt", "'prompt': token id %lld at %zu is outside the vocabulary (0 to %lld)", (long long)id, i,
                 (long long)(vocab > 0 ? vocab - 1 : INT32_MAX));
      else req->ids[i] = (int32_t)id;
    }
    req->n_ids = n;
  } else {
    rc = serve_bad(f, "prompt", "'prompt' must be a string or an array of token ids");
  }
out:
  json_decref(root);
  if (rc) signal_request_free(req);
  return rc;
}

static double fin(double x) { return isfinite(x) ? x : 0; }

void signal_reply(const serve_signal *s, const char *model, hbuf *out) {
  const hearth_signal_result *r = &s->r;
  json_t *o = json_object();
  json_object_set_new(o, "object", json_string("signal"));
  json_object_set_new(o, "model", json_string(model ? model : ""));
  json_object_set_new(o, "range", json_pack("[f,f]", r->lo, r->hi));
  json_t *bins = json_array();
  double w = (r->hi - r->lo) / (r->n_bins > 0 ? r->n_bins : 1);
  for (int i = 0; i < r->n_bins; i++)
    json_array_append_new(bins, json_pack("{s:f,s:f,s:I,s:f}", "lo", r->lo + i * w, "hi", r->lo + (i + 1) * w, "count",
                                          (json_int_t)r->counts[i], "mass", fin(r->mass[i])));
  json_object_set_new(o, "bins", bins);
  json_object_set_new(o, "entropy", json_real(fin(r->entropy)));
  json_object_set_new(o, "max_logprob", json_real(fin(r->max_logprob)));
  json_object_set_new(o, "min_logprob", json_real(fin(r->min_logprob)));
  json_object_set_new(o, "tokens", json_integer(r->n_tokens));
  json_t *top = json_array();
  for (int i = 0; i < r->n_top; i++) {
    json_t *t = json_object();
    json_object_set_new(t, "id", json_integer(r->top_ids[i]));
    /* the token's bytes when they are UTF-8; else null (the id still names it) */
    json_t *txt = s->top_text[i] ? json_stringn(s->top_text[i], s->top_len[i]) : NULL;
    json_object_set_new(t, "token", txt ? txt : json_null());
    json_object_set_new(t, "logprob", json_real(fin(r->top_logprobs[i])));
    json_array_append_new(top, t);
  }
  json_object_set_new(o, "top", top);
  json_object_set_new(o, "usage", json_pack("{s:I,s:I,s:I}", "prompt_tokens", (json_int_t)r->prompt_tokens,
                                            "total_tokens", (json_int_t)r->prompt_tokens, "cached_tokens",
                                            (json_int_t)r->cached_tokens));
  char *js = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  if (js) hbuf_puts(out, js);
  else out->oom = true;
  free(js);
}
