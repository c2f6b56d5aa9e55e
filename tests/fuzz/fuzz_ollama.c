/* fuzz_ollama — oll_request_parse over arbitrary bytes as an /api/chat and an
 * /api/generate body, and oll_embed_parse as /api/embed and /api/embeddings:
 * each must refuse with a status and a message, or hand out a request whose
 * invariants hold and whose Ollama reply (whole and streamed) is JSON. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/ollama.h"

static void check(const serve_request *r, const oll_request *o) {
  if (!r->model) abort();
  if (o->load_only) return;
  if (r->kind == SERVE_CHAT && (r->nmessages < 1 || !r->messages)) abort();
  if (r->kind == SERVE_COMPLETION && (!r->prompt || !o->raw)) abort();
  const serve_sampling *s = &r->sampling;
  if (s->max_tokens == 0 || s->max_tokens < -1) abort();
  if (!isnan(s->temperature) && !(s->temperature >= 0 && s->temperature <= 2)) abort();
  if (o->num_ctx < 0) abort();
  for (int i = 0; i < s->n_stop; i++)
    if (!s->stop[i] || !s->stop[i][0]) abort();
  for (int i = 0; i < r->n_media; i++)
    if (!r->media[i].name || !r->media[i].url) abort();
}

static void reply(const serve_request *r, const oll_request *o, bool stream) {
  oll_reply rep;
  oll_reply_init(&rep, o->chat, r->model, stream, oll_now(), r->sampling.logprobs);
  const char *text = r->kind == SERVE_CHAT ? r->messages[0].content : r->prompt;
  serve_top_logprob top = {text, strlen(text), -1.0f};
  serve_token t = {.text = text, .len = strlen(text), .token_text = text, .token_len = strlen(text), .logprob = -0.5f,
                   .top = &top, .ntop = 1};
  serve_result res = {.finish = SERVE_FINISH_STOP, .prompt_tokens = 1, .completion_tokens = 1, .stop_index = -1};
  hbuf out = {0};
  if (stream) {
    oll_stream_token(&rep, &t, &out);
    oll_stream_finish(&rep, &res, &out);
  } else {
    oll_reply_add(&rep, &t);
    oll_reply_body(&rep, &res, &out);
  }
  for (const char *p = hbuf_str(&out), *nl; *p; p = nl + (stream ? 1 : 0)) {
    nl = stream ? strchr(p, '\n') : p + strlen(p);
    if (!nl) abort();
    json_t *j = json_loadb(p, (size_t)(nl - p), 0, NULL);
    if (!json_is_object(j)) abort();
    json_decref(j);
    if (!stream) break;
  }
  hbuf_free(&out);
  oll_reply_free(&rep);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);
  for (int k = 0; k < 2; k++) {
    serve_request r;
    oll_request o;
    serve_fail f;
    memset(&f, 0, sizeof f);
    if (oll_request_parse(copy, size, k == 0, &r, &o, &f) == 0) {
      check(&r, &o);
      if (!o.load_only) {
        reply(&r, &o, false);
        reply(&r, &o, true);
      }
      serve_request_free(&r);
    } else {
      if (f.status != 400 && f.status != 500) abort();
      if (!f.message[0]) abort();
      char *e = oll_fail_json(&f);
      json_t *j = e ? json_loads(e, 0, NULL) : NULL;
      if (!json_is_string(json_object_get(j, "error"))) abort();
      json_decref(j);
      free(e);
    }
    embed_request er;
    if (oll_embed_parse(copy, size, k == 1, 0, &er, &f) == 0) {
      if (er.n < 1 || !er.model) abort();
      embed_request_free(&er);
    } else if (!f.message[0]) {
      abort();
    }
  }
  free(copy);
  return 0;
}
