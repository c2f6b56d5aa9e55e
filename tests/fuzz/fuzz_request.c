/* fuzz_request — serve_request_parse over arbitrary bytes as a chat and as a
 * completion body: it must either refuse with a 400 naming the problem, or
 * hand out a request whose invariants hold and whose reply formats as JSON. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/reply.h"
#include "serve/request.h"

static void check(const serve_request *r) {
  const serve_sampling *s = &r->sampling;
  if (r->n < 1 || r->n > SERVE_MAX_CHOICES) abort();
  if (r->kind == SERVE_COMPLETION && (r->n_prompts < 1 || (int64_t)r->n_prompts * r->n > SERVE_MAX_CHOICES)) abort();
  if (r->kind == SERVE_CHAT && (r->nmessages < 1 || !r->messages)) abort();
  for (int i = 0; i < r->nmessages; i++)
    if (!r->messages[i].role || !r->messages[i].content) abort();
  if (r->kind == SERVE_COMPLETION && !r->prompt) abort();
  if (s->max_tokens == 0 || s->max_tokens < -1) abort();
  if (!isnan(s->temperature) && !(s->temperature >= 0 && s->temperature <= 2)) abort();
  if (!isnan(s->top_p) && !(s->top_p >= 0 && s->top_p <= 1)) abort();
  if (s->top_logprobs < 0 || s->top_logprobs > 20) abort();
  for (int i = 0; i < s->n_stop; i++)
    if (!s->stop[i] || !s->stop[i][0]) abort();
  for (int i = 0; i < s->n_logit_bias; i++)
    if (s->logit_bias[i].id < 0 || !(s->logit_bias[i].bias >= -100 && s->logit_bias[i].bias <= 100)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);
  for (int k = 0; k < 2; k++) {
    serve_request r;
    serve_fail f;
    memset(&f, 0, sizeof f);
    if (serve_request_parse(copy, size, k ? SERVE_COMPLETION : SERVE_CHAT, &r, &f) == 0) {
      check(&r);
      /* Echo the request's text through a reply: the output must be valid JSON. */
      serve_reply rep;
      serve_reply_init(&rep, r.kind, r.model ? r.model : "m", 1, 2, r.sampling.logprobs);
      const char *text = r.kind == SERVE_CHAT ? r.messages[0].content : r.prompt;
      serve_top_logprob top = {text, strlen(text), -1.0f};
      serve_token t = {.text = text, .len = strlen(text), .token_text = text, .token_len = strlen(text),
                       .logprob = -0.5f, .top = &top, .ntop = 1};
      serve_reply_add(&rep, &t);
      serve_result res = {.finish = SERVE_FINISH_STOP, .prompt_tokens = 1, .completion_tokens = 1};
      hbuf out = {0};
      serve_reply_body(&rep, &res, &out);
      json_t *j = json_loadb(out.data, out.len, 0, NULL);
      if (!j) abort();
      json_decref(j);
      hbuf_free(&out);
      serve_reply_free(&rep);
      serve_request_free(&r);
    } else {
      if (f.status != 400 && f.status != 500) abort();
      if (!f.message[0]) abort();
      char *s = serve_fail_json(&f);
      if (!s) abort();
      json_t *j = json_loads(s, 0, NULL);
      if (!j) abort();
      json_decref(j);
      free(s);
      if (r.messages || r.prompt || r.sampling.stop || r.sampling.logit_bias || r.model) abort();
    }
  }
  free(copy);
  return 0;
}
