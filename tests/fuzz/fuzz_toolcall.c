/* fuzz_toolcall — the tool-call / reasoning parser over arbitrary bytes. Input:
 * byte 0 picks the format (low nibble, modulo the count) and the options (bits
 * 4..6: tools, reasoning, in_reasoning), byte 1 seeds where the text is cut,
 * the rest is the model's text. Fed whole and in random pieces, the events must
 * be well ordered, agree, and every ended call's arguments must be one JSON
 * object that jansson reads with default flags. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "chat/toolcall.h"

typedef struct out {
  hbuf text, reasoning, calls, args; /* calls: "name\0args\0" per call */
  bool in_call;
  int index;
} out;

static int on_event(void *ctx, const tc_event *ev) {
  out *o = ctx;
  switch (ev->kind) {
    case TC_TEXT:
    case TC_REASONING:
      if (o->in_call || !ev->len) abort();
      hbuf_append(ev->kind == TC_TEXT ? &o->text : &o->reasoning, ev->text, ev->len);
      break;
    case TC_CALL_BEGIN:
      if (o->in_call || ev->index != o->index || !ev->name || !*ev->name) abort();
      o->in_call = true;
      hbuf_append(&o->calls, ev->name, strlen(ev->name) + 1);
      hbuf_clear(&o->args);
      break;
    case TC_CALL_ARGS:
      if (!o->in_call || ev->index != o->index || !ev->len) abort();
      hbuf_append(&o->args, ev->text, ev->len);
      break;
    case TC_CALL_END: {
      if (!o->in_call || ev->index != o->index) abort();
      json_error_t je;
      json_t *v = json_loadb(o->args.data ? o->args.data : "", o->args.len, 0, &je);
      if (!json_is_object(v)) abort();
      json_decref(v);
      hbuf_append(&o->calls, o->args.data ? o->args.data : "", o->args.len);
      hbuf_putc(&o->calls, 0);
      o->in_call = false;
      o->index++;
      break;
    }
  }
  return 0;
}

static void run(const tc_opts *opts, const char *text, size_t len, uint32_t seed, out *o) {
  tc_parser *p;
  if (tc_parser_new(opts, &p, NULL)) abort();
  size_t at = 0;
  while (at < len) {
    size_t n = len - at;
    if (seed) {
      seed = seed * 1103515245u + 12345u;
      n = 1 + (seed >> 16) % 24;
      if (n > len - at) n = len - at;
    }
    if (tc_parser_feed(p, text + at, n, on_event, o, NULL)) abort();
    at += n;
  }
  if (tc_parser_finish(p, on_event, o, NULL)) abort();
  if (o->in_call || tc_parser_calls(p) != o->index) abort();
  tc_parser_free(p);
}

static bool same(const hbuf *a, const hbuf *b) { return a->len == b->len && (!a->len || !memcmp(a->data, b->data, a->len)); }

static void out_free(out *o) {
  hbuf_free(&o->text);
  hbuf_free(&o->reasoning);
  hbuf_free(&o->calls);
  hbuf_free(&o->args);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  tc_opts opts = {.format = (tc_format)((data[0] & 15) % TC_FORMAT_COUNT),
                  .tools = data[0] & 16,
                  .reasoning = data[0] & 32,
                  .in_reasoning = data[0] & 64};
  const char *text = (const char *)data + 2;
  size_t len = size - 2;
  out whole = {0}, split = {0}, bytes = {0};
  run(&opts, text, len, 0, &whole);
  run(&opts, text, len, data[1] | 0x100u, &split);
  if (!same(&whole.text, &split.text) || !same(&whole.reasoning, &split.reasoning) || !same(&whole.calls, &split.calls))
    abort();
  if (len < 512) {
    tc_parser *p;
    if (tc_parser_new(&opts, &p, NULL)) abort();
    for (size_t i = 0; i < len; i++)
      if (tc_parser_feed(p, text + i, 1, on_event, &bytes, NULL)) abort();
    if (tc_parser_finish(p, on_event, &bytes, NULL)) abort();
    tc_parser_free(p);
    if (!same(&whole.text, &bytes.text) || !same(&whole.calls, &bytes.calls)) abort();
  }
  out_free(&whole);
  out_free(&split);
  out_free(&bytes);
  return 0;
}
