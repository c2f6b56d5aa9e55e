/* anthropic.c — the Anthropic Messages API (see anthropic.h): request bodies
 * → serve_request with every field checked and every refusal naming the field
 * the way Anthropic does ("messages.0.content.1: ..."), the message object,
 * the stream's named SSE events, and Anthropic error objects. The sampling
 * fields are read with request.c's shared readers; the generation itself is
 * the server's, protocol-neutral. Knows nothing of HTTP. */
#include "serve/anthropic.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "serve/reply.h"

#define MAX_MESSAGES 100000

/* ---- errors ---- */

const char *anth_error_type(int status) {
  switch (status) {
  case 401: return "authentication_error";
  case 403: return "permission_error";
  case 404: return "not_found_error";
  case 413: return "request_too_large";
  case 429: return "rate_limit_error";
  case 529: return "overloaded_error";
  default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

/* A JSON string from arbitrary bytes (invalid UTF-8 becomes U+FFFD). */
static json_t *text_json(const char *s, size_t n) {
  hbuf b = {0};
  serve_utf8_clean(s ? s : "", s ? n : 0, &b);
  json_t *j = json_stringn(b.data ? b.data : "", b.len);
  hbuf_free(&b);
  return j ? j : json_string("");
}

static json_t *error_object(const serve_fail *f) {
  json_t *e = json_object();
  json_object_set_new(e, "type", json_string(anth_error_type(f->status)));
  json_object_set_new(e, "message", text_json(f->message, strlen(f->message)));
  json_t *root = json_object();
  json_object_set_new(root, "type", json_string("error"));
  json_object_set_new(root, "error", e);
  return root;
}

char *anth_fail_json(const serve_fail *f) {
  json_t *root = error_object(f);
  char *s = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  return s;
}

/* ---- requests ---- */

static int bad(serve_fail *f, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(serve_fail *f, const char *param, const char *fmt, ...) {
  f->status = 400;
  f->type = "invalid_request_error";
  snprintf(f->param, sizeof f->param, "%s", param);
  f->code[0] = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->message, sizeof f->message, fmt, ap);
  va_end(ap);
  return 400;
}

static int oom(serve_fail *f) { return serve_fail_set(f, 500, "api_error", NULL, NULL, "out of memory"); }

/* The text of content at `where`: a string, or an array of blocks of which
 * only text blocks are accepted (their texts joined). */
static int content_text(json_t *c, const char *where, bool system, hbuf *out, serve_fail *f) {
  if (json_is_string(c)) {
    hbuf_append(out, json_string_value(c), json_string_length(c));
    return 0;
  }
  if (!json_is_array(c))
    return bad(f, where, "%s: Input should be a string or an array of %s blocks", where, system ? "text" : "content");
  size_t i;
  json_t *b;
  json_array_foreach(c, i, b) {
    char at[160];
    snprintf(at, sizeof at, "%s.%zu", where, i);
    if (!json_is_object(b)) return bad(f, at, "%s: Input should be an object with a type", at);
    json_t *type = json_object_get(b, "type");
    if (!json_is_string(type)) {
      char tp[176];
      snprintf(tp, sizeof tp, "%s.type", at);
      return bad(f, tp, "%s: Field required (a string)", tp);
    }
    const char *t = json_string_value(type);
    if (strcmp(t, "text") == 0) {
      json_t *text = json_object_get(b, "text");
      if (!json_is_string(text)) {
        char tp[176];
        snprintf(tp, sizeof tp, "%s.text", at);
        return bad(f, tp, "%s: Input should be a string", tp);
      }
      hbuf_append(out, json_string_value(text), json_string_length(text));
    } else if (system) {
      return bad(f, at, "%s: system blocks must be of type 'text', not '%.40s'", at, t);
    } else if (!strcmp(t, "image") || !strcmp(t, "document")) {
      return bad(f, at, "%s: %s blocks are not supported: this server's models read text only", at, t);
    } else if (!strcmp(t, "tool_use") || !strcmp(t, "tool_result") || !strcmp(t, "server_tool_use")) {
      return bad(f, at, "%s: %s blocks are not supported: this server does not run tools yet", at, t);
    } else if (!strcmp(t, "thinking") || !strcmp(t, "redacted_thinking")) {
      return bad(f, at, "%s: %s blocks are not supported: this server does not do extended thinking", at, t);
    } else {
      return bad(f, at, "%s: unknown content block type '%.40s' (this server accepts text blocks)", at, t);
    }
  }
  return 0;
}

static int add_message(serve_request *r, const char *role, hbuf *text, serve_fail *f) {
  serve_message *m = &r->messages[r->nmessages];
  m->role = strdup(role);
  m->content = hbuf_take(text);
  if (!m->content) m->content = strdup("");
  r->nmessages++;
  return m->role && m->content ? 0 : oom(f);
}

static int parse_messages(json_t *root, serve_request *r, serve_fail *f) {
  json_t *sys = serve_json_field(root, "system");
  json_t *msgs = serve_json_field(root, "messages");
  if (!msgs) return bad(f, "messages", "messages: Field required");
  if (!json_is_array(msgs)) return bad(f, "messages", "messages: Input should be an array");
  size_t n = json_array_size(msgs);
  if (n == 0) return bad(f, "messages", "messages: at least one message is required");
  if (n > MAX_MESSAGES) return bad(f, "messages", "messages: too many entries (at most %d)", MAX_MESSAGES);
  r->messages = calloc(n + 1, sizeof *r->messages);
  if (!r->messages) return oom(f);
  hbuf text = {0};
  int rc = 0;
  if (sys) {
    if ((rc = content_text(sys, "system", true, &text, f))) goto out;
    if (text.oom) {
      rc = oom(f);
      goto out;
    }
    if ((rc = add_message(r, "system", &text, f))) goto out;
  }
  /* Consecutive turns of one role are combined into one, as Anthropic does. */
  const char *prev = NULL;
  for (size_t i = 0; i < n; i++) {
    json_t *m = json_array_get(msgs, i);
    char at[96];
    snprintf(at, sizeof at, "messages.%zu", i);
    if (!json_is_object(m)) {
      rc = bad(f, at, "%s: Input should be an object with a role and content", at);
      goto out;
    }
    json_t *role = json_object_get(m, "role");
    snprintf(at, sizeof at, "messages.%zu.role", i);
    if (!json_is_string(role)) {
      rc = bad(f, at, "%s: Field required (\"user\" or \"assistant\")", at);
      goto out;
    }
    const char *rs = json_string_value(role);
    if (strcmp(rs, "user") != 0 && strcmp(rs, "assistant") != 0) {
      rc = bad(f, at, "%s: Input should be 'user' or 'assistant'%s", at,
               strcmp(rs, "system") == 0 ? " (a system prompt goes in the top-level 'system' field)" : "");
      goto out;
    }
    json_t *content = json_object_get(m, "content");
    snprintf(at, sizeof at, "messages.%zu.content", i);
    if (!content || json_is_null(content)) {
      rc = bad(f, at, "%s: Field required", at);
      goto out;
    }
    bool merge = prev && strcmp(prev, rs) == 0;
    if (merge) {
      serve_message *last = &r->messages[r->nmessages - 1];
      hbuf_puts(&text, last->content);
      hbuf_puts(&text, "\n\n");
      free(last->content);
      free(last->role);
      r->nmessages--;
    }
    if ((rc = content_text(content, at, false, &text, f))) goto out;
    if (text.oom) {
      rc = oom(f);
      goto out;
    }
    if ((rc = add_message(r, rs, &text, f))) goto out;
    prev = r->messages[r->nmessages - 1].role;
  }
out:
  hbuf_free(&text);
  return rc;
}

/* Fields of the request this server does not do: refused, not silently dropped. */
static int refuse_unsupported(json_t *root, serve_fail *f) {
  json_t *tools = serve_json_field(root, "tools");
  if (tools && !json_is_array(tools)) return bad(f, "tools", "tools: Input should be an array");
  if (tools && json_array_size(tools) > 0)
    return bad(f, "tools", "tools: tool use is not supported by this server yet");
  json_t *th = serve_json_field(root, "thinking");
  if (th) {
    if (!json_is_object(th)) return bad(f, "thinking", "thinking: Input should be an object");
    json_t *t = json_object_get(th, "type");
    if (!json_is_string(t) || strcmp(json_string_value(t), "disabled") != 0)
      return bad(f, "thinking", "thinking: extended thinking is not supported by this server");
  }
  json_t *md = serve_json_field(root, "metadata");
  if (md && !json_is_object(md)) return bad(f, "metadata", "metadata: Input should be an object");
  return 0;
}

/* request.c's readers name the field in OpenAI's words ("'top_k' must be an
 * integer"); Anthropic's messages lead with the field's path. */
static int anth_style(serve_fail *f) {
  if (f->status != 400 || !f->param[0]) return f->status;
  char msg[sizeof f->message];
  snprintf(msg, sizeof msg, "%s: %s", f->param, f->message);
  snprintf(f->message, sizeof f->message, "%s", msg);
  return f->status;
}

static int parse_sampling(json_t *root, serve_sampling *s, serve_fail *f) {
  const int64_t big = (int64_t)1 << 40;
  if (!serve_json_field(root, "max_tokens")) return bad(f, "max_tokens", "max_tokens: Field required");
  if (serve_json_int(root, "max_tokens", 1, big, &s->max_tokens, f) ||
      serve_json_num(root, "temperature", 0, 1, &s->temperature, f) ||
      serve_json_num(root, "top_p", 0, 1, &s->top_p, f) ||
      serve_json_int(root, "top_k", 0, INT32_MAX, &s->top_k, f) ||
      serve_json_stop(root, "stop_sequences", false, s, f))
    return anth_style(f);
  return 0;
}

int anth_request_parse(const char *body, size_t len, bool count_only, serve_request *req, serve_fail *f) {
  memset(req, 0, sizeof *req);
  req->kind = SERVE_CHAT;
  req->n = 1;
  serve_sampling_defaults(&req->sampling);
  json_error_t je;
  json_t *root = json_loadb(body, len, 0, &je);
  if (!root) {
    bad(f, "", "the request body is not valid JSON: %s at line %d column %d", je.text, je.line, je.column);
    return f->status;
  }
  int rc = 0;
  if (!json_is_object(root)) {
    rc = bad(f, "", "the request body must be a JSON object");
    goto out;
  }
  json_t *model = serve_json_field(root, "model");
  if (!model) {
    rc = bad(f, "model", "model: Field required");
    goto out;
  }
  if (!json_is_string(model)) {
    rc = bad(f, "model", "model: Input should be a string");
    goto out;
  }
  if ((rc = serve_json_str(root, "model", &req->model, f))) goto out;
  if (!count_only && (rc = serve_json_bool(root, "stream", &req->stream, f))) {
    anth_style(f);
    goto out;
  }
  if ((rc = parse_messages(root, req, f))) goto out;
  if ((rc = refuse_unsupported(root, f))) goto out;
  if (!count_only) rc = parse_sampling(root, &req->sampling, f);
out:
  json_decref(root);
  if (rc) serve_request_free(req);
  return rc;
}

/* ---- replies ---- */

void anth_reply_init(anth_reply *r, const char *model, uint64_t id_seed, char *const *stop, int nstop) {
  memset(r, 0, sizeof *r);
  r->model = model;
  r->stop = stop;
  r->nstop = nstop;
  static const char digits[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  uint64_t state = id_seed, a = hsplitmix64(&state), b = hsplitmix64(&state);
  char *p = r->id;
  p += snprintf(r->id, sizeof r->id, "msg_01");
  for (int i = 0; i < 22; i++) {
    uint64_t *w = i < 11 ? &a : &b;
    *p++ = digits[*w % 62];
    *w /= 62;
  }
  *p = 0;
}

void anth_reply_free(anth_reply *r) { hbuf_free(&r->text); }

void anth_reply_add(anth_reply *r, const serve_token *tok) { hbuf_append(&r->text, tok->text, tok->len); }

const char *anth_stop_reason(const serve_result *res) {
  if (res->finish == SERVE_FINISH_LENGTH) return "max_tokens";
  return res->stop_index >= 0 ? "stop_sequence" : "end_turn";
}

static json_t *stop_sequence(const anth_reply *r, const serve_result *res) {
  if (res->finish != SERVE_FINISH_STOP || res->stop_index < 0 || res->stop_index >= r->nstop) return json_null();
  const char *s = r->stop[res->stop_index];
  return text_json(s, strlen(s));
}

static json_t *usage_json(int64_t input, int64_t output, int64_t cached) {
  json_t *u = json_object();
  json_object_set_new(u, "input_tokens", json_integer(input));
  json_object_set_new(u, "output_tokens", json_integer(output));
  json_object_set_new(u, "cache_read_input_tokens", json_integer(cached));
  json_object_set_new(u, "cache_creation_input_tokens", json_integer(0));
  return u;
}

/* Anthropic's input_tokens leave out the tokens read from the cache. */
static json_t *result_usage(const serve_result *res) {
  int64_t cached = res->cached_tokens > 0 ? res->cached_tokens : 0;
  if (cached > res->prompt_tokens) cached = res->prompt_tokens;
  return usage_json(res->prompt_tokens - cached, res->completion_tokens, cached);
}

static json_t *text_block(const char *s, size_t n) {
  json_t *b = json_object();
  json_object_set_new(b, "type", json_string("text"));
  json_object_set_new(b, "text", text_json(s, n));
  return b;
}

/* The message object; content NULL: [] (the start of a stream). */
static json_t *message(const anth_reply *r, json_t *content, json_t *stop_reason, json_t *stop_seq, json_t *usage) {
  json_t *o = json_object();
  json_object_set_new(o, "id", json_string(r->id));
  json_object_set_new(o, "type", json_string("message"));
  json_object_set_new(o, "role", json_string("assistant"));
  json_object_set_new(o, "model", text_json(r->model, r->model ? strlen(r->model) : 0));
  json_object_set_new(o, "content", content ? content : json_array());
  json_object_set_new(o, "stop_reason", stop_reason);
  json_object_set_new(o, "stop_sequence", stop_seq);
  json_object_set_new(o, "usage", usage);
  return o;
}

static void dump_to(json_t *j, hbuf *out) {
  char *s = json_dumps(j, JSON_COMPACT);
  if (s) hbuf_puts(out, s);
  else out->oom = true;
  free(s);
  json_decref(j);
}

void anth_reply_body(anth_reply *r, const serve_result *res, hbuf *out) {
  json_t *content = json_array();
  json_array_append_new(content, text_block(r->text.data, r->text.len));
  dump_to(message(r, content, json_string(anth_stop_reason(res)), stop_sequence(r, res), result_usage(res)), out);
}

static void event(const char *name, json_t *data /* consumed */, hbuf *out) {
  hbuf_printf(out, "event: %s\ndata: ", name);
  dump_to(data, out);
  hbuf_puts(out, "\n\n");
}

static json_t *typed(const char *type) {
  json_t *o = json_object();
  json_object_set_new(o, "type", json_string(type));
  return o;
}

void anth_sse_start(anth_reply *r, int64_t input_tokens, hbuf *out) {
  json_t *ms = typed("message_start");
  json_object_set_new(ms, "message", message(r, NULL, json_null(), json_null(), usage_json(input_tokens, 0, 0)));
  event("message_start", ms, out);
  json_t *cbs = typed("content_block_start");
  json_object_set_new(cbs, "index", json_integer(0));
  json_object_set_new(cbs, "content_block", text_block("", 0));
  event("content_block_start", cbs, out);
  event("ping", typed("ping"), out);
}

void anth_sse_token(anth_reply *r, const serve_token *tok, hbuf *out) {
  (void)r;
  if (tok->len == 0) return;
  json_t *d = typed("content_block_delta");
  json_object_set_new(d, "index", json_integer(0));
  json_t *delta = typed("text_delta");
  json_object_set_new(delta, "text", text_json(tok->text, tok->len));
  json_object_set_new(d, "delta", delta);
  event("content_block_delta", d, out);
}

void anth_sse_finish(anth_reply *r, const serve_result *res, hbuf *out) {
  json_t *cbs = typed("content_block_stop");
  json_object_set_new(cbs, "index", json_integer(0));
  event("content_block_stop", cbs, out);
  json_t *md = typed("message_delta");
  json_t *delta = json_object();
  json_object_set_new(delta, "stop_reason", json_string(anth_stop_reason(res)));
  json_object_set_new(delta, "stop_sequence", stop_sequence(r, res));
  json_object_set_new(md, "delta", delta);
  json_object_set_new(md, "usage", result_usage(res));
  event("message_delta", md, out);
  event("message_stop", typed("message_stop"), out);
}

void anth_sse_error(const serve_fail *f, hbuf *out) { event("error", error_object(f), out); }

void anth_count_body(int64_t n, hbuf *out) {
  json_t *o = json_object();
  json_object_set_new(o, "input_tokens", json_integer(n));
  dump_to(o, out);
}
