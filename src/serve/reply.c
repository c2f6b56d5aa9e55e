/* reply.c — OpenAI response bodies and SSE chunks (see reply.h). Owns the
 * exact field layout of chat.completion(.chunk) and text_completion, the
 * logprobs shapes of both APIs, and keeping every string valid UTF-8. Knows
 * nothing of HTTP: callers get bytes to send. */
#include "serve/reply.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "base/hash.h"
#include "base/utf8.h"

#define FINGERPRINT "hearth-" HEARTH_VERSION

static json_t *completion_logprobs_new(void);

const char *serve_finish_name(serve_finish f) { return f == SERVE_FINISH_LENGTH ? "length" : "stop"; }

static uint64_t mix64(uint64_t x) { return hmix64(x + HMIX64_GAMMA); }

void serve_reply_init(serve_reply *r, serve_kind kind, const char *model, int64_t created, uint64_t id_seed,
                      bool logprobs) {
  memset(r, 0, sizeof *r);
  r->kind = kind;
  r->model = model;
  r->created = created;
  r->logprobs = logprobs;
  uint64_t a = mix64(id_seed ^ (uint64_t)created), b = mix64(a);
  snprintf(r->id, sizeof r->id, "%s-%016llx%08llx", kind == SERVE_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)a,
           (unsigned long long)(b >> 32));
  if (logprobs) {
    if (kind == SERVE_CHAT) {
      r->lp = json_array();
    } else {
      r->lp = completion_logprobs_new();
    }
  }
}

void serve_reply_free(serve_reply *r) {
  hbuf_free(&r->text);
  json_decref(r->lp);
  r->lp = NULL;
  tc_parser_free(r->tc);
  r->tc = NULL;
  hbuf_free(&r->reasoning);
  hbuf_free(&r->args);
  json_decref(r->calls);
  r->calls = NULL;
  json_decref(r->sse_lp);
  r->sse_lp = NULL;
  json_decref(r->prompt_ids);
  json_decref(r->out_ids);
  json_decref(r->sse_ids);
  r->prompt_ids = r->out_ids = r->sse_ids = NULL;
}

static json_t *ids_json(const int32_t *ids, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer(ids[i]));
  return a;
}

void serve_reply_token_ids(serve_reply *r, const int32_t *prompt, size_t n) {
  json_decref(r->prompt_ids);
  json_decref(r->out_ids);
  json_decref(r->sse_ids);
  r->prompt_ids = ids_json(prompt, n);
  r->out_ids = json_array();
  r->sse_ids = json_array();
  r->prompt_ids_sent = false;
}

int serve_reply_parse(serve_reply *r, const tc_opts *o, herr *err) {
  if (tc_parser_new(o, &r->tc, err)) return err ? err->code : HEARTH_EINTERNAL;
  r->calls = json_array();
  return r->calls ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
}

const char *serve_reply_finish_name(const serve_reply *r, serve_finish f) {
  return r->ncalls > 0 && f != SERVE_FINISH_LENGTH ? "tool_calls" : serve_finish_name(f);
}

void serve_random_id(char *out, size_t cap, const char *prefix, int len) {
  static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  size_t n = (size_t)snprintf(out, cap, "%s", prefix);
  if (n >= cap) n = cap ? cap - 1 : 0;
  unsigned char pool[64];
  size_t have = 0, used = 0;
  while (len > 0 && n + 1 < cap) {
    if (used == have) { /* refill from the kernel's CSPRNG */
      ssize_t got;
      do got = getrandom(pool, sizeof pool, 0);
      while (got < 0 && errno == EINTR);
      if (got <= 0) { /* no getrandom (never on a supported kernel): still distinct within the process */
        static _Atomic uint64_t counter;
        uint64_t x = hmix64((uint64_t)time(NULL) ^ (atomic_fetch_add(&counter, 1) + 1) * HMIX64_GAMMA);
        for (size_t i = 0; i < sizeof pool; i++, x >>= 8) {
          if (i % 8 == 0) x = hmix64(x + i);
          pool[i] = (unsigned char)x;
        }
        got = (ssize_t)sizeof pool;
      }
      have = (size_t)got;
      used = 0;
    }
    unsigned char b = pool[used++];
    if (b >= 248) continue; /* 248 = 4 × 62: keeps every letter equally likely */
    out[n++] = al[b % 62];
    len--;
  }
  if (cap) out[n] = 0;
}

/* "call_" and 24 letters and digits from the CSPRNG. */
static json_t *call_id(void) {
  char id[32];
  serve_random_id(id, sizeof id, "call_", 24);
  return json_string(id);
}

void serve_utf8_clean(const char *s, size_t n, hbuf *out) {
  size_t i = 0, run = 0; /* s[run..i) is valid and not yet appended */
  while (i < n) {
    uint32_t cp;
    int len = utf8_decode(s + i, n - i, &cp);
    if (len > 0) {
      i += (size_t)len;
      continue;
    }
    hbuf_append(out, s + run, i - run);
    hbuf_append(out, "\xEF\xBF\xBD", 3);
    run = ++i;
  }
  hbuf_append(out, s + run, n - run);
}

json_t *serve_json_text(const char *s, size_t n) {
  hbuf b = {0};
  serve_utf8_clean(s ? s : "", s ? n : 0, &b);
  json_t *j = json_stringn(b.data ? b.data : "", b.len);
  hbuf_free(&b);
  return j ? j : json_string("");
}

/* Log-probabilities are finite in JSON: -inf becomes a very small number. */
static json_t *logprob_json(float lp) { return json_real(isfinite(lp) ? (double)lp : -9999.0); }

static json_t *bytes_json(const char *s, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)s[i]));
  return a;
}

/* Chat: {"token","logprob","bytes","top_logprobs":[{"token","logprob","bytes"}]} */
static json_t *chat_logprob_entry(const serve_token *t) {
  json_t *e = json_object();
  json_object_set_new(e, "token", serve_json_text(t->token_text ? t->token_text : "", t->token_len));
  json_object_set_new(e, "logprob", logprob_json(t->logprob));
  json_object_set_new(e, "bytes", bytes_json(t->token_text ? t->token_text : "", t->token_len));
  json_t *top = json_array();
  for (int i = 0; i < t->ntop; i++) {
    json_t *a = json_object();
    json_object_set_new(a, "token", serve_json_text(t->top[i].text ? t->top[i].text : "", t->top[i].len));
    json_object_set_new(a, "logprob", logprob_json(t->top[i].logprob));
    json_object_set_new(a, "bytes", bytes_json(t->top[i].text ? t->top[i].text : "", t->top[i].len));
    json_array_append_new(top, a);
  }
  json_object_set_new(e, "top_logprobs", top);
  return e;
}

/* Completion: appends one token to {"tokens","token_logprobs","top_logprobs","text_offset"}. */
static void completion_logprob_add(json_t *lp, const serve_token *t, size_t offset) {
  json_array_append_new(json_object_get(lp, "tokens"), serve_json_text(t->token_text ? t->token_text : "", t->token_len));
  json_array_append_new(json_object_get(lp, "token_logprobs"), logprob_json(t->logprob));
  json_t *top = json_object();
  for (int i = 0; i < t->ntop; i++) {
    json_t *k = serve_json_text(t->top[i].text ? t->top[i].text : "", t->top[i].len);
    json_object_set_new(top, json_string_value(k), logprob_json(t->top[i].logprob));
    json_decref(k);
  }
  json_array_append_new(json_object_get(lp, "top_logprobs"), top);
  json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)offset));
}

void serve_reply_echo_token(serve_reply *r, const serve_token *t, bool first, const char *echo, size_t n, size_t *cursor) {
  if (!r->lp || r->kind == SERVE_CHAT) return;
  size_t at = *cursor;
  if (t->token_len && at + t->token_len <= n && !memcmp(echo + at, t->token_text, t->token_len)) *cursor += t->token_len;
  if (!first) {
    completion_logprob_add(r->lp, t, at);
    return;
  }
  json_array_append_new(json_object_get(r->lp, "tokens"), serve_json_text(t->token_text ? t->token_text : "", t->token_len));
  json_array_append_new(json_object_get(r->lp, "token_logprobs"), json_null());
  json_array_append_new(json_object_get(r->lp, "top_logprobs"), json_null());
  json_array_append_new(json_object_get(r->lp, "text_offset"), json_integer((json_int_t)at));
}

static json_t *completion_logprobs_new(void) {
  json_t *o = json_object();
  json_object_set_new(o, "tokens", json_array());
  json_object_set_new(o, "token_logprobs", json_array());
  json_object_set_new(o, "top_logprobs", json_array());
  json_object_set_new(o, "text_offset", json_array());
  return o;
}

/* Whole responses: the parser's events gathered into text, reasoning and calls. */
/* parallel_tool_calls false: a call after the first is not part of the reply. */
static bool dropped_call(const serve_reply *r, const tc_event *ev) {
  return r->one_call && ev->index >= 1 &&
         (ev->kind == TC_CALL_BEGIN || ev->kind == TC_CALL_ARGS || ev->kind == TC_CALL_END);
}

static int whole_event(void *ctx, const tc_event *ev) {
  serve_reply *r = ctx;
  if (dropped_call(r, ev)) return 0;
  switch (ev->kind) {
  case TC_TEXT: hbuf_append(&r->text, ev->text, ev->len); break;
  case TC_REASONING: hbuf_append(&r->reasoning, ev->text, ev->len); break;
  case TC_CALL_BEGIN: {
    json_t *fn = json_object();
    json_object_set_new(fn, "name", serve_json_text(ev->name, strlen(ev->name)));
    json_t *c = json_object();
    json_object_set_new(c, "id", call_id());
    json_object_set_new(c, "type", json_string("function"));
    json_object_set_new(c, "function", fn);
    json_array_append_new(r->calls, c);
    r->ncalls++;
    hbuf_clear(&r->args);
    break;
  }
  case TC_CALL_ARGS: hbuf_append(&r->args, ev->text, ev->len); break;
  case TC_CALL_END: {
    json_t *c = json_array_get(r->calls, json_array_size(r->calls) - 1);
    if (c) json_object_set_new(json_object_get(c, "function"), "arguments", serve_json_text(hbuf_str(&r->args), r->args.len));
    hbuf_clear(&r->args);
    break;
  }
  }
  return 0;
}

/* Ends the parser once (the engine's last step, or the reply's end). */
static void tc_end(serve_reply *r, tc_event_fn fn) {
  if (!r->tc || r->tc_done) return;
  r->tc_done = true;
  tc_parser_finish(r->tc, fn, r, NULL);
}

void serve_reply_end(serve_reply *r) { tc_end(r, whole_event); }

void serve_reply_add(serve_reply *r, const serve_token *tok) {
  if (r->out_ids && !tok->flush) json_array_append_new(r->out_ids, json_integer(tok->id));
  if (r->logprobs && r->lp && !tok->flush) {
    if (r->kind == SERVE_CHAT) json_array_append_new(r->lp, chat_logprob_entry(tok));
    else completion_logprob_add(r->lp, tok, r->text.len);
  }
  if (r->tc) {
    if (!r->tc_done) tc_parser_feed(r->tc, tok->text, tok->len, whole_event, r, NULL);
    if (tok->flush) tc_end(r, whole_event);
    return;
  }
  hbuf_append(&r->text, tok->text, tok->len);
}

static json_t *usage_json(const serve_result *res) {
  json_t *u = json_object();
  json_object_set_new(u, "prompt_tokens", json_integer(res->prompt_tokens));
  json_object_set_new(u, "completion_tokens", json_integer(res->completion_tokens));
  json_object_set_new(u, "total_tokens", json_integer(res->prompt_tokens + res->completion_tokens));
  json_t *d = json_object();
  json_object_set_new(d, "cached_tokens", json_integer(res->cached_tokens));
  json_object_set_new(u, "prompt_tokens_details", d);
  return u;
}

static json_t *envelope(const serve_reply *r, const char *object) {
  json_t *o = json_object();
  json_object_set_new(o, "id", json_string(r->id));
  json_object_set_new(o, "object", json_string(object));
  json_object_set_new(o, "created", json_integer(r->created));
  json_object_set_new(o, "model", serve_json_text(r->model ? r->model : "", r->model ? strlen(r->model) : 0));
  json_object_set_new(o, "system_fingerprint", json_string(FINGERPRINT));
  return o;
}

static void dump_to(json_t *j, hbuf *out) {
  char *s = json_dumps(j, JSON_COMPACT);
  if (s) hbuf_puts(out, s);
  else out->oom = true;
  free(s);
}

/* One choice of a whole response, as its reply r made it. */
static json_t *choice_json(serve_reply *r, serve_finish finish) {
  bool chat = r->kind == SERVE_CHAT;
  json_t *choice = json_object();
  json_object_set_new(choice, "index", json_integer(r->index));
  json_t *text = serve_json_text(r->text.data ? r->text.data : "", r->text.len);
  if (chat) {
    tc_end(r, whole_event);
    json_decref(text);
    text = serve_json_text(r->text.data ? r->text.data : "", r->text.len);
    json_t *msg = json_object();
    json_object_set_new(msg, "role", json_string("assistant"));
    if (r->ncalls > 0 && r->text.len == 0) {
      json_decref(text);
      text = json_null();
    }
    json_object_set_new(msg, "content", text);
    json_object_set_new(msg, "refusal", json_null());
    if (r->reasoning.len) json_object_set_new(msg, "reasoning_content", serve_json_text(r->reasoning.data, r->reasoning.len));
    if (r->ncalls > 0) json_object_set(msg, "tool_calls", r->calls);
    json_object_set_new(choice, "message", msg);
    if (r->logprobs && r->lp) {
      json_t *lp = json_object();
      json_object_set(lp, "content", r->lp);
      json_object_set_new(lp, "refusal", json_null());
      json_object_set_new(choice, "logprobs", lp);
    } else {
      json_object_set_new(choice, "logprobs", json_null());
    }
  } else {
    json_object_set_new(choice, "text", text);
    json_object_set(choice, "logprobs", r->logprobs && r->lp ? r->lp : json_null());
    if (r->prompt_ids) json_object_set(choice, "prompt_token_ids", r->prompt_ids);
  }
  json_object_set_new(choice, "finish_reason", json_string(serve_reply_finish_name(r, finish)));
  if (r->out_ids) json_object_set(choice, "token_ids", r->out_ids);
  return choice;
}

void serve_reply_body(serve_reply *r, const serve_result *res, hbuf *out) {
  serve_reply_body_n(&r, res, 1, res, out);
}

void serve_reply_body_n(serve_reply *const *r, const serve_result *res, int n, const serve_result *usage, hbuf *out) {
  json_t *o = envelope(r[0], r[0]->kind == SERVE_CHAT ? "chat.completion" : "text_completion");
  json_t *choices = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(choices, choice_json(r[i], res[i].finish));
  json_object_set_new(o, "choices", choices);
  json_object_set_new(o, "usage", usage_json(usage));
  if (r[0]->kind == SERVE_CHAT && r[0]->prompt_ids) json_object_set(o, "prompt_token_ids", r[0]->prompt_ids);
  dump_to(o, out);
  json_decref(o);
}

static void emit(json_t *j, hbuf *out) {
  hbuf_puts(out, "data: ");
  dump_to(j, out);
  hbuf_puts(out, "\n\n");
  json_decref(j);
}

/* One chunk with one choice; delta (chat) or text (completion) given by the caller.
 * With return_token_ids it takes the ids not yet sent (and the prompt's, first). */
static json_t *chunk(serve_reply *r, json_t *delta_or_text, json_t *logprobs, const char *finish) {
  bool chat = r->kind == SERVE_CHAT;
  json_t *o = envelope(r, chat ? "chat.completion.chunk" : "text_completion");
  json_t *choice = json_object();
  json_object_set_new(choice, "index", json_integer(r->index));
  json_object_set_new(choice, chat ? "delta" : "text", delta_or_text);
  json_object_set_new(choice, "logprobs", logprobs ? logprobs : json_null());
  json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
  json_t *choices = json_array();
  json_array_append_new(choices, choice);
  json_object_set_new(o, "choices", choices);
  if (r->usage_null) json_object_set_new(o, "usage", json_null());
  if (r->sse_ids) {
    if (!r->prompt_ids_sent) {
      json_object_set(chat ? o : choice, "prompt_token_ids", r->prompt_ids);
      r->prompt_ids_sent = true;
    }
    json_object_set_new(choice, "token_ids", r->sse_ids);
    r->sse_ids = json_array();
  }
  return o;
}

void serve_sse_start(serve_reply *r, hbuf *out) {
  if (r->kind != SERVE_CHAT) return;
  json_t *delta = json_object();
  json_object_set_new(delta, "role", json_string("assistant"));
  json_object_set_new(delta, "content", json_string(""));
  json_object_set_new(delta, "refusal", json_null());
  emit(chunk(r, delta, NULL, NULL), out);
}

static json_t *text_value(const serve_reply *r, const char *s, size_t n) {
  json_t *t = serve_json_text(s, n);
  if (r->kind != SERVE_CHAT) return t;
  json_t *delta = json_object();
  json_object_set_new(delta, "content", t);
  return delta;
}

static bool hidden_tool(const serve_reply *r, const char *name) {
  for (int i = 0; i < r->nhidden; i++)
    if (!strcmp(r->hidden[i], name)) return true;
  return false;
}

/* Streams keep every call in r->calls too (for the server's own tools, serve/tools.h); a hidden
 * one goes no further. True when the event is the hidden call's. */
static bool stream_call(serve_reply *r, const tc_event *ev) {
  switch (ev->kind) {
  case TC_CALL_BEGIN: {
    json_t *fn = json_object();
    json_object_set_new(fn, "name", serve_json_text(ev->name, strlen(ev->name)));
    json_object_set_new(fn, "arguments", json_string("{}"));
    json_t *c = json_object();
    json_object_set_new(c, "id", call_id());
    json_object_set_new(c, "type", json_string("function"));
    json_object_set_new(c, "function", fn);
    if (r->calls) json_array_append_new(r->calls, c);
    else json_decref(c);
    hbuf_clear(&r->args);
    r->hiding = hidden_tool(r, ev->name);
    if (r->hiding) r->nhidden_calls++;
    return r->hiding;
  }
  case TC_CALL_ARGS: hbuf_append(&r->args, ev->text, ev->len); return r->hiding;
  case TC_CALL_END: {
    json_t *c = json_array_get(r->calls, json_array_size(r->calls) - 1);
    if (c && r->args.len) json_object_set_new(json_object_get(c, "function"), "arguments", serve_json_text(hbuf_str(&r->args), r->args.len));
    hbuf_clear(&r->args);
    bool was = r->hiding;
    r->hiding = false;
    return was;
  }
  default: return false;
  }
}

/* Streams: each parser event becomes a chunk; the step's logprobs ride on its first. */
static int sse_event(void *ctx, const tc_event *ev) {
  serve_reply *r = ctx;
  if (dropped_call(r, ev)) return 0;
  if (stream_call(r, ev)) return 0;
  if (ev->kind == TC_TEXT && r->nhidden) hbuf_append(&r->text, ev->text, ev->len); /* a round's text (serve/tools.h) */
  json_t *delta = json_object();
  switch (ev->kind) {
  case TC_TEXT:
  case TC_REASONING:
    if (ev->len == 0) {
      json_decref(delta);
      return 0;
    }
    json_object_set_new(delta, ev->kind == TC_TEXT ? "content" : "reasoning_content", serve_json_text(ev->text, ev->len));
    break;
  case TC_CALL_BEGIN: {
    json_t *fn = json_object();
    json_object_set_new(fn, "name", serve_json_text(ev->name, strlen(ev->name)));
    json_object_set_new(fn, "arguments", json_string(""));
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(ev->index - r->nhidden_calls));
    json_t *kept = json_array_get(r->calls, json_array_size(r->calls) - 1); /* the id stream_call gave it */
    json_t *id = json_object_get(kept, "id");
    json_object_set_new(c, "id", id ? json_incref(id) : call_id());
    json_object_set_new(c, "type", json_string("function"));
    json_object_set_new(c, "function", fn);
    json_t *calls = json_array();
    json_array_append_new(calls, c);
    json_object_set_new(delta, "tool_calls", calls);
    r->ncalls++;
    break;
  }
  case TC_CALL_ARGS: {
    if (ev->len == 0) {
      json_decref(delta);
      return 0;
    }
    json_t *fn = json_object();
    json_object_set_new(fn, "arguments", serve_json_text(ev->text, ev->len));
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(ev->index - r->nhidden_calls));
    json_object_set_new(c, "function", fn);
    json_t *calls = json_array();
    json_array_append_new(calls, c);
    json_object_set_new(delta, "tool_calls", calls);
    break;
  }
  case TC_CALL_END: json_decref(delta); return 0;
  }
  json_t *lp = r->sse_lp;
  r->sse_lp = NULL;
  emit(chunk(r, delta, lp, NULL), r->sse);
  return 0;
}

static json_t *chat_logprobs_chunk(const serve_token *tok) {
  json_t *lp = json_object();
  json_t *content = json_array();
  json_array_append_new(content, chat_logprob_entry(tok));
  json_object_set_new(lp, "content", content);
  json_object_set_new(lp, "refusal", json_null());
  return lp;
}

void serve_reply_prime(serve_reply *r, const char *text, hbuf *out) {
  if (!r->tc || r->tc_done) return;
  r->sse = out;
  tc_parser_feed(r->tc, text, strlen(text), out ? sse_event : whole_event, r, NULL);
  r->sse = NULL;
}

void serve_sse_token(serve_reply *r, const serve_token *tok, hbuf *out) {
  if (r->sse_ids && !tok->flush) json_array_append_new(r->sse_ids, json_integer(tok->id));
  if (r->tc) {
    r->sse = out;
    if (r->logprobs && !tok->flush) r->sse_lp = chat_logprobs_chunk(tok);
    if (!r->tc_done) tc_parser_feed(r->tc, tok->text, tok->len, sse_event, r, NULL);
    if (tok->flush) tc_end(r, sse_event);
    if (r->sse_lp) { /* nothing to say this step but its logprobs */
      emit(chunk(r, json_object(), r->sse_lp, NULL), out);
      r->sse_lp = NULL;
    }
    r->sse = NULL;
    return;
  }
  bool lp_here = r->logprobs && !tok->flush;
  if (tok->len == 0 && !lp_here) return; /* its id (return_token_ids) goes with the next chunk */
  json_t *lp = NULL;
  if (lp_here) {
    if (r->kind == SERVE_CHAT) {
      lp = json_object();
      json_t *content = json_array();
      json_array_append_new(content, chat_logprob_entry(tok));
      json_object_set_new(lp, "content", content);
      json_object_set_new(lp, "refusal", json_null());
    } else {
      lp = completion_logprobs_new();
      completion_logprob_add(lp, tok, r->text_offset);
    }
  }
  r->text_offset += tok->len;
  emit(chunk(r, text_value(r, tok->text, tok->len), lp, NULL), out);
}

void serve_sse_text(serve_reply *r, const char *s, size_t n, hbuf *out) {
  json_t *lp = NULL;
  if (r->lp && r->kind != SERVE_CHAT && json_array_size(json_object_get(r->lp, "tokens")) > 0) {
    lp = r->lp; /* the echoed prompt's logprobs */
    r->lp = completion_logprobs_new();
  }
  if (n == 0 && !lp) return;
  r->text_offset += n;
  emit(chunk(r, text_value(r, s, n), lp, NULL), out);
}

void serve_sse_end(serve_reply *r, hbuf *out) {
  if (!r->tc || r->tc_done) return;
  r->sse = out;
  tc_end(r, sse_event);
  r->sse = NULL;
}

void serve_sse_tool_exchange(serve_reply *r, const json_t *exchange, hbuf *out) {
  json_t *o = envelope(r, "chat.completion.chunk");
  json_object_set_new(o, "choices", json_array());
  json_object_set(o, "tool_exchange", (json_t *)exchange);
  emit(o, out);
}

void serve_sse_finish(serve_reply *r, serve_finish finish, hbuf *out) {
  if (r->tc && !r->tc_done) {
    r->sse = out;
    tc_end(r, sse_event);
    r->sse = NULL;
  }
  json_t *v = r->kind == SERVE_CHAT ? json_object() : json_string("");
  emit(chunk(r, v, NULL, serve_reply_finish_name(r, finish)), out);
}

void serve_sse_usage(serve_reply *r, const serve_result *res, hbuf *out) {
  json_t *o = envelope(r, r->kind == SERVE_CHAT ? "chat.completion.chunk" : "text_completion");
  json_object_set_new(o, "choices", json_array());
  json_object_set_new(o, "usage", usage_json(res));
  emit(o, out);
}

void serve_sse_error(const serve_fail *f, hbuf *out) {
  char *s = serve_fail_json(f);
  hbuf_puts(out, "data: ");
  if (s) hbuf_puts(out, s);
  hbuf_puts(out, "\n\n");
  free(s);
}

void serve_sse_done(hbuf *out) { hbuf_puts(out, "data: [DONE]\n\n"); }
