/* fuzz_anthropic — anth_request_parse over arbitrary bytes as a Messages and
 * as a count_tokens body: it must either refuse with a 400 naming the
 * problem (an Anthropic error object that is valid JSON), or hand out a
 * request whose invariants hold and whose message object and stream events
 * format as valid JSON. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/anthropic.h"

static void must_be_json(const char *s, size_t n) {
  json_t *j = json_loadb(s, n, 0, NULL);
  if (!j) abort();
  json_decref(j);
}

/* Every "data: " line of an SSE buffer is one JSON object. */
static void events_are_json(const hbuf *b) {
  const char *p = b->data, *end = b->data + b->len;
  while (p && p < end) {
    const char *d = strstr(p, "data: ");
    if (!d || d >= end) break;
    d += 6;
    const char *nl = memchr(d, '\n', (size_t)(end - d));
    if (!nl) abort();
    must_be_json(d, (size_t)(nl - d));
    p = nl + 1;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);
  for (int k = 0; k < 2; k++) {
    bool count_only = k == 1;
    serve_request r;
    serve_fail f;
    memset(&f, 0, sizeof f);
    if (anth_request_parse(copy, size, count_only, &r, &f) == 0) {
      if (r.kind != SERVE_CHAT || r.nmessages < 1 || !r.messages) abort();
      for (int i = 0; i < r.nmessages; i++)
        if (!r.messages[i].role || !r.messages[i].content) abort();
      const serve_sampling *s = &r.sampling;
      if (!count_only && s->max_tokens < 1) abort();
      if (!isnan(s->temperature) && !(s->temperature >= 0 && s->temperature <= 1)) abort();
      for (int i = 0; i < s->n_stop; i++)
        if (!s->stop[i]) abort();
      /* the request's text through a reply and a stream: valid JSON throughout */
      anth_reply rep;
      anth_reply_init(&rep, r.model ? r.model : "m", 7, s->stop, s->n_stop);
      const char *text = r.messages[r.nmessages - 1].content;
      serve_token t = {.text = text, .len = strlen(text), .token_text = text, .token_len = strlen(text)};
      serve_result res = {.finish = SERVE_FINISH_STOP, .prompt_tokens = 3, .completion_tokens = 1,
                          .stop_index = s->n_stop ? 0 : -1};
      hbuf out = {0};
      anth_reply_add(&rep, &t);
      anth_reply_body(&rep, &res, &out);
      must_be_json(out.data, out.len);
      hbuf_clear(&out);
      anth_sse_start(&rep, 3, &out);
      anth_sse_token(&rep, &t, &out);
      anth_sse_finish(&rep, &res, &out);
      events_are_json(&out);
      hbuf_free(&out);
      anth_reply_free(&rep);
      serve_request_free(&r);
    } else {
      if (f.status != 400 && f.status != 413 && f.status != 500) abort();
      if (!f.message[0]) abort();
      char *s = anth_fail_json(&f);
      if (!s) abort();
      must_be_json(s, strlen(s));
      free(s);
    }
  }
  free(copy);
  return 0;
}
