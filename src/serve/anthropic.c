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

static json_t *error_object(const serve_fail *f) {
  json_t *e = json_object();
  json_object_set_new(e, "type", json_string(anth_error_type(f->status)));
  json_object_set_new(e, "message", serve_json_text(f->message, strlen(f->message)));
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

static int anth_style(serve_fail *f);

/* A message being assembled from one turn's blocks. */
typedef struct turn {
  hbuf text;
  json_t *calls;     /* assistant tool_use blocks as tool_calls */
  hbuf thinking;     /* assistant thinking blocks */
  json_t *parts;     /* the text and image blocks in order, for the template (kept when there are images) */
  int media_before;  /* the request's media before this turn */
} turn;

static int block_type(json_t *b, const char *at, const char **t, serve_fail *f) {
  if (!json_is_object(b)) return bad(f, at, "%s: Input should be an object with a type", at);
  json_t *type = json_object_get(b, "type");
  if (!json_is_string(type)) {
    char tp[176];
    snprintf(tp, sizeof tp, "%s.type", at);
    return bad(f, tp, "%s: Field required (a string)", tp);
  }
  *t = json_string_value(type);
  return 0;
}

/* Text of a string or of an array of text blocks (system prompts, tool results). */
static int plain_text(json_t *c, const char *where, bool system, hbuf *out, serve_fail *f) {
  if (json_is_string(c)) {
    hbuf_append(out, json_string_value(c), json_string_length(c));
    return 0;
  }
  if (!json_is_array(c)) return bad(f, where, "%s: Input should be a string or an array of text blocks", where);
  size_t i;
  json_t *b;
  json_array_foreach(c, i, b) {
    char at[160];
    const char *t;
    snprintf(at, sizeof at, "%s.%zu", where, i);
    if (block_type(b, at, &t, f)) return f->status;
    if (strcmp(t, "text") != 0) {
      if (!strcmp(t, "image") || !strcmp(t, "document"))
        return bad(f, at, "%s: %s blocks are not supported: this server's models read text only", at, t);
      return bad(f, at, "%s: %s blocks must be of type 'text', not '%.40s'", at, system ? "system" : "tool_result content", t);
    }
    json_t *text = json_object_get(b, "text");
    if (!json_is_string(text)) {
      char tp[176];
      snprintf(tp, sizeof tp, "%s.text", at);
      return bad(f, tp, "%s: Input should be a string", tp);
    }
    if (i > 0 && !system) hbuf_puts(out, "\n");
    hbuf_append(out, json_string_value(text), json_string_length(text));
  }
  return 0;
}

static int push_message(serve_request *r, const char *role, hbuf *text, json_t *extra /* consumed */, serve_fail *f) {
  serve_message *m = &r->messages[r->nmessages];
  memset(m, 0, sizeof *m);
  m->role = strdup(role);
  m->content = hbuf_take(text);
  if (!m->content) m->content = strdup("");
  m->extra = extra;
  r->nmessages++;
  return m->role && m->content ? 0 : oom(f);
}

/* An assistant turn's blocks so far as a message of their own (none when there are none): a
 * result of the server's own tools follows them. */
static int turn_flush(serve_request *r, turn *t, serve_fail *f) {
  if (!t->text.len && !t->calls && !t->thinking.len) return 0;
  json_t *extra = json_object();
  if (t->calls) json_object_set_new(extra, "tool_calls", t->calls);
  t->calls = NULL;
  if (t->thinking.len) json_object_set_new(extra, "reasoning_content", serve_json_text(t->thinking.data, t->thinking.len));
  hbuf_clear(&t->thinking);
  return push_message(r, "assistant", &t->text, extra, f);
}

/* Whether ty is a block type ending in "_tool_result" (a result of a server's own tool). */
static bool server_result_type(const char *ty) {
  size_t n = strlen(ty), k = strlen("_tool_result");
  return n > k && !strcmp(ty + n - k, "_tool_result");
}

/* One user or assistant turn: text, tool_use, tool_result and thinking blocks.
 * tool_result blocks become "tool" messages ahead of the user's text. An
 * assistant turn's server_tool_use blocks (the server's own tools, as this
 * server answers them) are its tool calls, and each NAME_tool_result block
 * after them a "tool" message that splits the turn there. */
static int parse_turn(serve_request *r, json_t *content, const char *rs, const char *where, serve_fail *f) {
  bool user = !strcmp(rs, "user");
  turn t = {0};
  t.media_before = r->n_media;
  int rc = 0;
  bool results = false, split = false;
  if (json_is_string(content)) {
    hbuf_append(&t.text, json_string_value(content), json_string_length(content));
  } else if (!json_is_array(content)) {
    return bad(f, where, "%s: Input should be a string or an array of content blocks", where);
  } else {
    size_t i;
    json_t *b;
    json_array_foreach(content, i, b) {
      char at[160];
      const char *ty;
      snprintf(at, sizeof at, "%s.%zu", where, i);
      if ((rc = block_type(b, at, &ty, f))) goto out;
      if (!strcmp(ty, "text")) {
        json_t *text = json_object_get(b, "text");
        if (!json_is_string(text)) {
          char tp[176];
          snprintf(tp, sizeof tp, "%s.text", at);
          rc = bad(f, tp, "%s: Input should be a string", tp);
          goto out;
        }
        hbuf_append(&t.text, json_string_value(text), json_string_length(text));
        serve_text_part(&t.parts, json_string_value(text), json_string_length(text));
      } else if (!strcmp(ty, "image") && user) {
        /* source: {"type": "base64", "media_type": "image/png", "data": ...} or {"type": "url", "url": ...} */
        json_t *src = json_object_get(b, "source");
        const char *st = json_is_object(src) ? json_string_value(json_object_get(src, "type")) : NULL;
        json_t *data = json_is_object(src) ? json_object_get(src, st && !strcmp(st, "url") ? "url" : "data") : NULL;
        if (!st || (strcmp(st, "base64") && strcmp(st, "url")) || !json_is_string(data)) {
          rc = bad(f, at, "%s: an image block's source is {type: base64, media_type, data} or {type: url, url}", at);
          goto out;
        }
        if ((rc = serve_media_add(r, &t.parts, HEARTH_MEDIA_IMAGE, json_string_value(data), at, f))) goto out;
      } else if (!strcmp(ty, "document")) {
        rc = bad(f, at, "%s: document blocks are not supported", at);
        goto out;
      } else if ((!strcmp(ty, "tool_use") || !strcmp(ty, "server_tool_use")) && !user) {
        json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"), *input = json_object_get(b, "input");
        if (!json_is_string(id) || !json_is_string(name) || (input && !json_is_object(input))) {
          rc = bad(f, at, "%s: a tool_use block has a string id, a string name and an object input", at);
          goto out;
        }
        json_t *fn = json_pack("{s:O, s:o}", "name", name, "arguments", input ? json_incref(input) : json_object());
        if (!t.calls) t.calls = json_array();
        json_array_append_new(t.calls, json_pack("{s:O, s:s, s:o}", "id", id, "type", "function", "function", fn));
      } else if (!strcmp(ty, "tool_result") && user) {
        json_t *id = json_object_get(b, "tool_use_id");
        if (!json_is_string(id)) {
          rc = bad(f, at, "%s: tool_use_id is required (a string)", at);
          goto out;
        }
        hbuf res = {0};
        json_t *c = json_object_get(b, "content");
        char cat[176];
        snprintf(cat, sizeof cat, "%s.content", at);
        if (c && !json_is_null(c) && (rc = plain_text(c, cat, false, &res, f))) {
          hbuf_free(&res);
          goto out;
        }
        if (json_is_true(json_object_get(b, "is_error"))) {
          hbuf e = {0};
          hbuf_puts(&e, "Error: ");
          hbuf_append(&e, res.data, res.len);
          hbuf_free(&res);
          res = e;
        }
        if ((rc = push_message(r, "tool", &res, json_pack("{s:O}", "tool_call_id", id), f))) {
          hbuf_free(&res);
          goto out;
        }
        results = true;
      } else if (!user && server_result_type(ty)) {
        json_t *id = json_object_get(b, "tool_use_id");
        if (!json_is_string(id)) {
          rc = bad(f, at, "%s: tool_use_id is required (a string)", at);
          goto out;
        }
        hbuf res = {0};
        json_t *c = json_object_get(b, "content");
        char cat[176];
        snprintf(cat, sizeof cat, "%s.content", at);
        if ((c && !json_is_null(c) && (rc = plain_text(c, cat, false, &res, f))) || (rc = turn_flush(r, &t, f))) {
          hbuf_free(&res);
          goto out;
        }
        json_t *extra = json_pack("{s:O}", "tool_call_id", id);
        json_object_set_new(extra, "name", json_stringn(ty, strlen(ty) - strlen("_tool_result")));
        if ((rc = push_message(r, "tool", &res, extra, f))) {
          hbuf_free(&res);
          goto out;
        }
        split = true;
      } else if ((!strcmp(ty, "thinking") || !strcmp(ty, "redacted_thinking")) && !user) {
        json_t *th = json_object_get(b, "thinking");
        if (json_is_string(th)) hbuf_append(&t.thinking, json_string_value(th), json_string_length(th));
      } else {
        rc = bad(f, at, "%s: a %s message cannot hold a '%.40s' block", at, rs, ty);
        goto out;
      }
    }
  }
  if (t.text.oom || t.thinking.oom) {
    rc = oom(f);
    goto out;
  }
  /* a user turn of only tool results has no text message of its own, nor an assistant turn's
   * rest after its last server tool result when there is none */
  if (!(results && t.text.len == 0) && !(split && !t.text.len && !t.calls && !t.thinking.len)) {
    json_t *extra = NULL;
    if (t.calls || t.thinking.len) extra = json_object();
    if (t.calls) json_object_set_new(extra, "tool_calls", t.calls);
    t.calls = NULL;
    if (t.thinking.len) json_object_set_new(extra, "reasoning_content", serve_json_text(t.thinking.data, t.thinking.len));
    rc = push_message(r, rs, &t.text, extra, f);
    if (!rc && r->n_media > t.media_before) { /* images: the template sees the blocks in order */
      r->messages[r->nmessages - 1].parts = t.parts;
      t.parts = NULL;
    }
  }
out:
  hbuf_free(&t.text);
  hbuf_free(&t.thinking);
  json_decref(t.calls);
  json_decref(t.parts);
  return rc;
}

static int parse_messages(json_t *root, serve_request *r, serve_fail *f) {
  json_t *sys = serve_json_field(root, "system");
  json_t *msgs = serve_json_field(root, "messages");
  if (!msgs) return bad(f, "messages", "messages: Field required");
  if (!json_is_array(msgs)) return bad(f, "messages", "messages: Input should be an array");
  size_t n = json_array_size(msgs);
  if (n == 0) return bad(f, "messages", "messages: at least one message is required");
  if (n > MAX_MESSAGES) return bad(f, "messages", "messages: too many entries (at most %d)", MAX_MESSAGES);
  size_t cap = 1; /* the system prompt; each message its own and one per tool_result block */
  for (size_t i = 0; i < n; i++) {
    json_t *c = json_object_get(json_array_get(msgs, i), "content");
    cap += 1 + (json_is_array(c) ? json_array_size(c) : 0);
  }
  r->messages = calloc(cap, sizeof *r->messages);
  if (!r->messages) return oom(f);
  hbuf text = {0};
  int rc = 0;
  if (sys) {
    if ((rc = plain_text(sys, "system", true, &text, f))) goto out;
    if (text.oom) {
      rc = oom(f);
      goto out;
    }
    if ((rc = push_message(r, "system", &text, NULL, f))) goto out;
  }
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
    int before = r->nmessages;
    if ((rc = parse_turn(r, content, rs, at, f))) goto out;
    /* Consecutive plain turns of one role are combined into one, as Anthropic does. */
    if (r->nmessages == before + 1 && before > 0) {
      serve_message *prev = &r->messages[before - 1], *cur = &r->messages[before];
      if (!strcmp(prev->role, cur->role) && !prev->extra && !cur->extra && !prev->parts && !cur->parts) {
        hbuf_puts(&text, prev->content);
        hbuf_puts(&text, "\n\n");
        hbuf_puts(&text, cur->content);
        if (text.oom) {
          rc = oom(f);
          goto out;
        }
        free(prev->content);
        prev->content = hbuf_take(&text);
        free(cur->role);
        free(cur->content);
        memset(cur, 0, sizeof *cur);
        r->nmessages--;
      }
    }
  }
out:
  hbuf_free(&text);
  return rc;
}

/* tools ([{name, description, input_schema}], type absent or "custom") and tool_choice ({type: auto | any
 * | tool | none, name}), read by serve_tools_parse. */
static const char *const choice_words[] = {"auto", "none", "any", "tool", NULL};
static const serve_tool_choice choice_of[] = {SERVE_TOOLS_AUTO, SERVE_TOOLS_NONE, SERVE_TOOLS_REQUIRED, SERVE_TOOLS_NAMED};
const serve_tools_dialect anth_tools_dialect = {
    .at = "tools.%zu",
    .schema = "input_schema",
    .schema_required = true,
    .type = "custom",
    .untyped_ok = true,
    .field_first = true,
    .not_array = "tools: Input should be an array",
    .other_type = "%s: tools of type '%.40s' are not supported: this server calls client tools (name, description, "
                  "input_schema)",
    .no_name = "%s: name is required (a string)",
    .no_schema = "%s: input_schema is required (a JSON Schema object)",
    .words = choice_words,
    .choices = choice_of,
    .bad_object = "tool_choice: Input should be an object with a type",
    .bad_word = "tool_choice: type should be 'auto', 'any', 'tool' or 'none'",
    .no_choice_name = "tool_choice: name is required for type 'tool'",
    .unknown_name = "tool_choice: '%.80s' is not among the tools",
    .no_tools = "tool_choice: 'any' needs tools",
};

/* thinking ({type: enabled, budget_tokens} | {type: disabled}: the template's
 * enable_thinking), metadata, service_tier, and the fields refused by name. */
static int parse_extras(json_t *root, serve_request *r, serve_fail *f) {
  json_t *th = serve_json_field(root, "thinking");
  if (th) {
    json_t *t = json_is_object(th) ? json_object_get(th, "type") : NULL;
    if (!json_is_string(t) || (strcmp(json_string_value(t), "enabled") && strcmp(json_string_value(t), "disabled")))
      return bad(f, "thinking", "thinking: Input should be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}");
    bool on = !strcmp(json_string_value(t), "enabled");
    if (on) {
      json_t *budget = json_object_get(th, "budget_tokens");
      if (!json_is_integer(budget) || json_integer_value(budget) < 1)
        return bad(f, "thinking", "thinking: budget_tokens is required (a positive integer)");
    }
    r->template_kwargs = json_pack("{s:b}", "enable_thinking", on);
  }
  json_t *md = serve_json_field(root, "metadata");
  if (md && !json_is_object(md)) return bad(f, "metadata", "metadata: Input should be an object");
  json_t *uid = md ? serve_json_field(md, "user_id") : NULL;
  if (uid && !json_is_string(uid)) return bad(f, "metadata.user_id", "metadata.user_id: Input should be a string");
  json_t *tier = serve_json_field(root, "service_tier");
  if (tier && (!json_is_string(tier) || (strcmp(json_string_value(tier), "auto") && strcmp(json_string_value(tier), "standard_only"))))
    return bad(f, "service_tier", "service_tier: Input should be 'auto' or 'standard_only'");
  static const char *const refused[][2] = {
      {"container", "container: code execution containers are not supported by this server"},
      {"mcp_servers", "mcp_servers: this server connects to no MCP servers (give the tools as 'tools')"},
      {"context_management", "context_management: this server does not edit the context (send the messages to keep)"},
  };
  for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
    if (serve_json_field(root, refused[i][0])) return bad(f, refused[i][0], "%s", refused[i][1]);
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
      serve_json_stop(root, "stop_sequences", false, s, f) || serve_json_spec(root, s, f) || serve_json_adapter(root, s, f) ||
      serve_json_samplers(root, s, f))
    return anth_style(f);
  json_t *rti = serve_json_field(root, "return_token_ids");
  if (rti && !json_is_false(rti)) return bad(f, "return_token_ids", "return_token_ids: not supported on this API (use /v1/chat/completions)");
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
  /* A final assistant turn of text is a prefill: the model continues it, and the reply holds
   * only the continuation (as Anthropic's API answers it). */
  serve_message *last = req->nmessages > 0 ? &req->messages[req->nmessages - 1] : NULL;
  if (last && !strcmp(last->role, "assistant") && !last->extra && !last->parts && last->content[0]) {
    char end = last->content[strlen(last->content) - 1];
    if (end == ' ' || end == '\t' || end == '\n' || end == '\r') {
      rc = bad(f, "messages", "messages: final assistant content cannot end with trailing whitespace");
      goto out;
    }
    req->continue_final_message = req->no_generation_prompt = true;
  }
  if ((rc = serve_tools_parse(root, req, &anth_tools_dialect, f)) || (rc = parse_extras(root, req, f))) goto out;
  if (!count_only) rc = parse_sampling(root, &req->sampling, f);
out:
  json_decref(root);
  if (rc) serve_request_free(req);
  return rc;
}

/* ---- replies ---- */

void anth_reply_init(anth_reply *r, const char *model, uint64_t id_seed, const char *const *stop, int nstop) {
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

void anth_reply_free(anth_reply *r) {
  hbuf_free(&r->text);
  hbuf_free(&r->round_text);
  json_decref(r->round_calls);
  json_decref(r->server_use);
  r->round_calls = r->server_use = NULL;
  tc_parser_free(r->tc);
  r->tc = NULL;
  json_decref(r->blocks);
  json_decref(r->block);
  r->blocks = r->block = NULL;
  hbuf_free(&r->cur);
}

int anth_reply_parse(anth_reply *r, const tc_opts *o, herr *err) {
  if (tc_parser_new(o, &r->tc, err)) return err ? err->code : HEARTH_EINTERNAL;
  r->blocks = json_array();
  r->round_calls = json_array();
  r->open = -1;
  return r->blocks && r->round_calls ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
}

const char *anth_stop_reason(const serve_result *res) {
  if (res->finish == SERVE_FINISH_LENGTH) return "max_tokens";
  return res->stop_index >= 0 ? "stop_sequence" : "end_turn";
}

static const char *reply_stop_reason(const anth_reply *r, const serve_result *res) {
  if (r->ncalls > 0 && res->finish != SERVE_FINISH_LENGTH) return "tool_use";
  if (r->unrun > 0 && res->finish != SERVE_FINISH_LENGTH) return "pause_turn";
  return anth_stop_reason(res);
}

enum { BLOCK_RESULT = 100 }; /* a tool result block's kind (beside the tc_event_kind ones) */

static bool server_tool(const anth_reply *r, const char *name) {
  for (int i = 0; name && i < r->n_server_tools; i++)
    if (!strcmp(r->server_tools[i], name)) return true;
  return false;
}

static json_t *typed(const char *type);
static json_t *text_block(const char *s, size_t n);
static void event(const char *name, json_t *data /* consumed */, hbuf *out);

/* "toolu_01" and 22 letters and digits from the CSPRNG. */
static json_t *tool_use_id(void) {
  char id[40];
  serve_random_id(id, sizeof id, "toolu_01", 22);
  return json_string(id);
}

/* A server tool call's: "srvtoolu_01" and 22 of them. */
static json_t *server_tool_use_id(void) {
  char id[40];
  serve_random_id(id, sizeof id, "srvtoolu_01", 22);
  return json_string(id);
}

/* Closes the open block: a stream says content_block_stop; a whole reply
 * fills in the block's text, thinking or input and keeps it. */
static void block_close(anth_reply *r) {
  if (r->open < 0) return;
  if (r->sse) {
    json_t *cbs = typed("content_block_stop");
    json_object_set_new(cbs, "index", json_integer(r->index - 1));
    event("content_block_stop", cbs, r->sse);
  } else if (r->block) {
    if (r->open == TC_TEXT) {
      json_object_set_new(r->block, "text", serve_json_text(r->cur.data, r->cur.len));
    } else if (r->open == TC_REASONING) {
      json_object_set_new(r->block, "thinking", serve_json_text(r->cur.data, r->cur.len));
    } else if (r->open != BLOCK_RESULT) {
      json_t *input = json_loadb(r->cur.data ? r->cur.data : "", r->cur.len, 0, NULL);
      json_object_set_new(r->block, "input", json_is_object(input) ? input : json_object());
      if (input && !json_is_object(input)) json_decref(input);
    }
    json_array_append_new(r->blocks, r->block);
    r->block = NULL;
  }
  hbuf_clear(&r->cur);
  r->open = -1;
}

/* Opens a block of `kind` (block: its start object, consumed). */
static void block_open(anth_reply *r, int kind, json_t *block) {
  block_close(r);
  r->open = kind;
  if (r->sse) {
    json_t *cbs = typed("content_block_start");
    json_object_set_new(cbs, "index", json_integer(r->index));
    json_object_set_new(cbs, "content_block", block);
    event("content_block_start", cbs, r->sse);
    if (r->ping_due) event("ping", typed("ping"), r->sse);
    r->ping_due = false;
  } else {
    r->block = block;
  }
  r->index++;
}

static void block_delta(anth_reply *r, const char *type, const char *key, const char *s, size_t n) {
  hbuf_append(&r->cur, s, n); /* (a stream's too: a call's arguments are the round's) */
  if (!r->sse) return;
  json_t *d = typed("content_block_delta");
  json_object_set_new(d, "index", json_integer(r->index - 1));
  json_t *delta = typed(type);
  json_object_set_new(delta, key, serve_json_text(s, n));
  json_object_set_new(d, "delta", delta);
  event("content_block_delta", d, r->sse);
}

static int on_event(void *ctx, const tc_event *ev) {
  anth_reply *r = ctx;
  switch (ev->kind) {
  case TC_TEXT:
    if (ev->len == 0) break;
    hbuf_append(&r->round_text, ev->text, ev->len);
    if (r->open != TC_TEXT) {
      json_t *b = typed("text");
      json_object_set_new(b, "text", json_string(""));
      block_open(r, TC_TEXT, b);
    }
    block_delta(r, "text_delta", "text", ev->text, ev->len);
    break;
  case TC_REASONING:
    if (ev->len == 0) break;
    if (r->open != TC_REASONING) {
      json_t *b = typed("thinking");
      json_object_set_new(b, "thinking", json_string(""));
      json_object_set_new(b, "signature", json_string(""));
      block_open(r, TC_REASONING, b);
    }
    block_delta(r, "thinking_delta", "thinking", ev->text, ev->len);
    break;
  case TC_CALL_BEGIN: {
    bool own = server_tool(r, ev->name);
    json_t *b = typed(own ? "server_tool_use" : "tool_use");
    json_t *id = own ? server_tool_use_id() : tool_use_id();
    json_object_set(b, "id", id);
    json_object_set_new(b, "name", serve_json_text(ev->name, strlen(ev->name)));
    json_object_set_new(b, "input", json_object());
    if (own) r->unrun++;
    else r->ncalls++;
    block_open(r, TC_CALL_BEGIN, b);
    json_array_append_new(r->round_calls, json_pack("{s:o, s:s, s:{s:o, s:s}}", "id", id, "type", "function", "function",
                                                    "name", serve_json_text(ev->name, strlen(ev->name)), "arguments", ""));
    break;
  }
  case TC_CALL_ARGS:
    if (ev->len) block_delta(r, "input_json_delta", "partial_json", ev->text, ev->len);
    break;
  case TC_CALL_END: {
    json_t *c = json_array_get(r->round_calls, json_array_size(r->round_calls) - 1);
    if (c) json_object_set_new(json_object_get(c, "function"), "arguments", serve_json_text(r->cur.data, r->cur.len));
    block_close(r);
    break;
  }
  }
  return 0;
}

static void tc_end(anth_reply *r) {
  if (!r->tc || r->tc_done) return;
  r->tc_done = true;
  tc_parser_finish(r->tc, on_event, r, NULL);
  block_close(r);
}

void anth_reply_prime(anth_reply *r, const char *text, hbuf *out) {
  if (!r->tc || r->tc_done) return;
  r->sse = out;
  tc_parser_feed(r->tc, text, strlen(text), on_event, r, NULL);
  r->sse = NULL;
}

const json_t *anth_reply_round_calls(anth_reply *r, hbuf *out, const char **text) {
  r->sse = out;
  tc_end(r);
  r->sse = NULL;
  *text = hbuf_str(&r->round_text);
  return r->round_calls;
}

int anth_reply_round_next(anth_reply *r, const json_t *round, const tc_opts *o, hbuf *out, herr *err) {
  r->sse = out;
  size_t i;
  json_t *m;
  json_array_foreach(round, i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role || strcmp(role, "tool")) continue;
    const char *name = json_string_value(json_object_get(m, "name"));
    const char *text = json_string_value(json_object_get(m, "content"));
    hbuf type = {0};
    hbuf_printf(&type, "%s_tool_result", name ? name : "server");
    json_t *b = typed(hbuf_str(&type));
    json_object_set(b, "tool_use_id", json_object_get(m, "tool_call_id"));
    json_t *content = json_array();
    json_array_append_new(content, text_block(text ? text : "", text ? strlen(text) : 0));
    json_object_set_new(b, "content", content);
    block_open(r, BLOCK_RESULT, b);
    block_close(r);
    hbuf_clear(&type);
    hbuf_printf(&type, "%s_requests", name ? name : "server");
    if (!r->server_use) r->server_use = json_object();
    json_t *n = json_object_get(r->server_use, hbuf_str(&type));
    json_object_set_new(r->server_use, hbuf_str(&type), json_integer(json_integer_value(n) + 1));
    hbuf_free(&type);
  }
  r->sse = NULL;
  r->unrun = 0;
  json_array_clear(r->round_calls);
  hbuf_clear(&r->round_text);
  tc_parser_free(r->tc);
  r->tc = NULL;
  r->tc_done = false;
  if (tc_parser_new(o, &r->tc, err)) return err ? err->code : HEARTH_EINTERNAL;
  return 0;
}

void anth_reply_add(anth_reply *r, const serve_token *tok) {
  if (!r->tc) {
    hbuf_append(&r->text, tok->text, tok->len);
    return;
  }
  if (!r->tc_done) tc_parser_feed(r->tc, tok->text, tok->len, on_event, r, NULL);
  if (tok->flush) tc_end(r);
}

static json_t *stop_sequence(const anth_reply *r, const serve_result *res) {
  if (res->finish != SERVE_FINISH_STOP || res->stop_index < 0 || res->stop_index >= r->nstop) return json_null();
  const char *s = r->stop[res->stop_index];
  return serve_json_text(s, strlen(s));
}

static json_t *usage_json(int64_t input, int64_t output, int64_t cached) {
  json_t *u = json_object();
  json_object_set_new(u, "input_tokens", json_integer(input));
  json_object_set_new(u, "output_tokens", json_integer(output));
  json_object_set_new(u, "cache_read_input_tokens", json_integer(cached));
  json_object_set_new(u, "cache_creation_input_tokens", json_integer(0));
  return u;
}

/* Anthropic's input_tokens leave out the tokens read from the cache; the server's own tools'
 * runs are counted in server_tool_use. */
static json_t *result_usage(const anth_reply *r, const serve_result *res) {
  int64_t cached = res->cached_tokens > 0 ? res->cached_tokens : 0;
  if (cached > res->prompt_tokens) cached = res->prompt_tokens;
  json_t *u = usage_json(res->prompt_tokens - cached, res->completion_tokens, cached);
  if (r->server_use) json_object_set(u, "server_tool_use", r->server_use);
  return u;
}

static json_t *text_block(const char *s, size_t n) {
  json_t *b = json_object();
  json_object_set_new(b, "type", json_string("text"));
  json_object_set_new(b, "text", serve_json_text(s, n));
  return b;
}

/* The message object; content NULL: [] (the start of a stream). */
static json_t *message(const anth_reply *r, json_t *content, json_t *stop_reason, json_t *stop_seq, json_t *usage) {
  json_t *o = json_object();
  json_object_set_new(o, "id", json_string(r->id));
  json_object_set_new(o, "type", json_string("message"));
  json_object_set_new(o, "role", json_string("assistant"));
  json_object_set_new(o, "model", serve_json_text(r->model, r->model ? strlen(r->model) : 0));
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
  json_t *content;
  if (r->tc) {
    tc_end(r);
    content = json_incref(r->blocks);
    if (json_array_size(content) == 0) json_array_append_new(content, text_block("", 0));
  } else {
    content = json_array();
    json_array_append_new(content, text_block(r->text.data, r->text.len));
  }
  dump_to(message(r, content, json_string(reply_stop_reason(r, res)), stop_sequence(r, res), result_usage(r, res)), out);
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
  if (r->tc) { /* blocks open as the output shows what they are */
    r->ping_due = true;
    return;
  }
  json_t *cbs = typed("content_block_start");
  json_object_set_new(cbs, "index", json_integer(0));
  json_object_set_new(cbs, "content_block", text_block("", 0));
  event("content_block_start", cbs, out);
  event("ping", typed("ping"), out);
}

void anth_sse_token(anth_reply *r, const serve_token *tok, hbuf *out) {
  if (r->tc) {
    r->sse = out;
    if (!r->tc_done) tc_parser_feed(r->tc, tok->text, tok->len, on_event, r, NULL);
    if (tok->flush) tc_end(r);
    r->sse = NULL;
    return;
  }
  if (tok->len == 0) return;
  json_t *d = typed("content_block_delta");
  json_object_set_new(d, "index", json_integer(0));
  json_t *delta = typed("text_delta");
  json_object_set_new(delta, "text", serve_json_text(tok->text, tok->len));
  json_object_set_new(d, "delta", delta);
  event("content_block_delta", d, out);
}

void anth_sse_finish(anth_reply *r, const serve_result *res, hbuf *out) {
  if (r->tc) {
    r->sse = out;
    tc_end(r);
    if (r->index == 0) { /* nothing came: one empty text block, as without a parser */
      json_t *b = typed("text");
      json_object_set_new(b, "text", json_string(""));
      block_open(r, TC_TEXT, b);
      block_close(r);
    }
    r->sse = NULL;
  } else {
    json_t *cbs = typed("content_block_stop");
    json_object_set_new(cbs, "index", json_integer(0));
    event("content_block_stop", cbs, out);
  }
  json_t *md = typed("message_delta");
  json_t *delta = json_object();
  json_object_set_new(delta, "stop_reason", json_string(reply_stop_reason(r, res)));
  json_object_set_new(delta, "stop_sequence", stop_sequence(r, res));
  json_object_set_new(md, "delta", delta);
  json_object_set_new(md, "usage", result_usage(r, res));
  event("message_delta", md, out);
  event("message_stop", typed("message_stop"), out);
}

void anth_sse_error(const serve_fail *f, hbuf *out) { event("error", error_object(f), out); }

void anth_count_body(int64_t n, hbuf *out) {
  json_t *o = json_object();
  json_object_set_new(o, "input_tokens", json_integer(n));
  dump_to(o, out);
}
