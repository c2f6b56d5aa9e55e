/* fuzz_responses — the Responses API unit over arbitrary bytes: the body is
 * parsed (with the first byte choosing whether a stored history comes
 * before the input); it must either be refused with a 400 naming the problem
 * (an error object that is valid JSON) or give messages whose invariants
 * hold; then the rest of the input, fed as model output through a reply with
 * a tool-call / reasoning parser, must give a response object and events that
 * are valid JSON with consecutive sequence numbers. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/responses.h"

static void must_be_json(const char *s, size_t n) {
  json_t *j = json_loadb(s, n, JSON_ALLOW_NUL, NULL);
  if (!j) abort();
  json_decref(j);
}

/* Line by line (JSON strings hold no raw newline): each "data: " line is an
 * object with the next sequence number. */
static void check_events(const hbuf *b) {
  const char *p = b->data, *end = b->data + b->len;
  int64_t seq = 0;
  while (p && p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl) abort();
    if ((size_t)(nl - p) >= 6 && !memcmp(p, "data: ", 6)) {
      json_t *j = json_loadb(p + 6, (size_t)(nl - p - 6), JSON_ALLOW_NUL, NULL);
      if (!j || json_integer_value(json_object_get(j, "sequence_number")) != seq++) abort();
      json_decref(j);
    }
    p = nl + 1;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const char *body = (const char *)data + 1;
  const char *sep = memchr(body, 0, size - 1);
  size_t blen = sep ? (size_t)(sep - body) : size - 1;
  const char *out = sep ? sep + 1 : body + blen;
  size_t olen = (size_t)((const char *)data + size - out);
  serve_request r;
  resp_request rr;
  serve_fail f = {0};
  if (resp_request_parse(body, blen, &r, &rr, &f)) {
    if (f.status != 400 && f.status != 500) abort();
    char *j = serve_fail_json(&f);
    if (!j) abort();
    must_be_json(j, strlen(j));
    free(j);
    return 0;
  }
  json_t *hist = (data[0] & 1) ? json_loads("[{\"role\":\"user\",\"content\":\"q\"},{\"type\":\"function_call\",\"call_id\":\"c\","
                                             "\"name\":\"f\",\"arguments\":\"{}\"}]",
                                             0, NULL)
                               : NULL;
  if (resp_request_messages(&r, &rr, hist, &f) == 0) {
    if (r.nmessages < 1) abort();
    for (int i = 0; i < r.nmessages; i++)
      if (!r.messages[i].role || !r.messages[i].content) abort();
    resp_reply rep;
    resp_reply_init(&rep, "m", 7, &rr);
    tc_opts o = {.format = (tc_format)(data[0] % 8), .tools = (data[0] & 2) != 0, .reasoning = (data[0] & 4) != 0};
    hbuf b = {0};
    bool stream = (data[0] & 8) != 0;
    if (resp_reply_parse(&rep, &o, NULL) == 0) {
      if (stream) resp_sse_start(&rep, &b);
      for (size_t i = 0; i < olen; i += 3) {
        serve_token t = {.text = out + i, .len = olen - i < 3 ? olen - i : 3};
        if (stream) resp_sse_token(&rep, &t, &b);
        else resp_reply_add(&rep, &t);
      }
      serve_result res = {.finish = (data[0] & 16) ? SERVE_FINISH_LENGTH : SERVE_FINISH_STOP, .stop_index = -1};
      if (stream) {
        resp_sse_finish(&rep, &res, &b);
        check_events(&b);
      }
      json_t *obj = resp_reply_object(&rep, &res);
      char *s = json_dumps(obj, JSON_COMPACT);
      if (!s) abort();
      must_be_json(s, strlen(s));
      free(s);
      json_decref(obj);
      json_t *conv = resp_reply_conversation(&rep, hist);
      if (!json_is_array(conv)) abort();
      json_decref(conv);
    }
    hbuf_free(&b);
    resp_reply_free(&rep);
  } else {
    char *j = serve_fail_json(&f);
    if (!j) abort();
    free(j);
  }
  json_decref(hist);
  serve_request_free(&r);
  resp_request_free(&rr);
  return 0;
}
