/* responses.c — the OpenAI Responses API (see responses.h): request items to
 * chat messages, output split into reasoning / message / function_call items,
 * the response object and the event stream, and the response store. Knows
 * the protocol's shapes; the server decides when each runs. */
#include "serve/responses.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/hash.h"
#include "base/vec.h"
#include "serve/reply.h"

/* ---- the store ---- */

typedef struct entry {
  char *id;
  char *response;     /* JSON text */
  char *conversation; /* JSON text */
  size_t bytes;
  double born;
  struct entry *prev, *next; /* oldest first */
} entry;

struct resp_store {
  pthread_mutex_t mu;
  size_t max_count, max_bytes;
  int64_t ttl_s;
  entry *head, *tail;
  size_t count, bytes;
};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int resp_store_new(size_t max_count, size_t max_bytes, int64_t ttl_s, resp_store **out, herr *err) {
  resp_store *s = calloc(1, sizeof *s);
  if (!s) return herr_set(err, HEARTH_ENOMEM, "responses: out of memory");
  pthread_mutex_init(&s->mu, NULL);
  s->max_count = max_count;
  s->max_bytes = max_bytes;
  s->ttl_s = ttl_s;
  *out = s;
  return 0;
}

static void unlink_entry(resp_store *s, entry *e) {
  if (e->prev) e->prev->next = e->next;
  else s->head = e->next;
  if (e->next) e->next->prev = e->prev;
  else s->tail = e->prev;
  s->count--;
  s->bytes -= e->bytes;
  free(e->id);
  free(e->response);
  free(e->conversation);
  free(e);
}

void resp_store_free(resp_store *s) {
  if (!s) return;
  while (s->head) unlink_entry(s, s->head);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

static void expire(resp_store *s) {
  if (s->ttl_s <= 0) return;
  double t = now_s();
  while (s->head && t - s->head->born > (double)s->ttl_s) unlink_entry(s, s->head);
}

static entry *find(resp_store *s, const char *id) {
  for (entry *e = s->tail; e; e = e->prev)
    if (!strcmp(e->id, id)) return e;
  return NULL;
}

void resp_store_put(resp_store *s, const json_t *response, const json_t *conversation) {
  const char *id = json_string_value(json_object_get(response, "id"));
  if (!id) return;
  entry *e = calloc(1, sizeof *e);
  if (!e) return;
  e->id = strdup(id);
  e->response = json_dumps(response, JSON_COMPACT);
  e->conversation = conversation ? json_dumps(conversation, JSON_COMPACT) : strdup("[]");
  if (!e->id || !e->response || !e->conversation) {
    free(e->id), free(e->response), free(e->conversation), free(e);
    return;
  }
  e->bytes = strlen(e->id) + strlen(e->response) + strlen(e->conversation);
  e->born = now_s();
  pthread_mutex_lock(&s->mu);
  entry *old = find(s, id);
  if (old) unlink_entry(s, old);
  if (s->max_bytes && e->bytes > s->max_bytes) {
    pthread_mutex_unlock(&s->mu);
    free(e->id), free(e->response), free(e->conversation), free(e);
    return;
  }
  expire(s);
  while (s->head && ((s->max_count && s->count + 1 > s->max_count) || (s->max_bytes && s->bytes + e->bytes > s->max_bytes)))
    unlink_entry(s, s->head);
  e->prev = s->tail;
  if (s->tail) s->tail->next = e;
  else s->head = e;
  s->tail = e;
  s->count++;
  s->bytes += e->bytes;
  pthread_mutex_unlock(&s->mu);
}

json_t *resp_store_get(resp_store *s, const char *id, json_t **conversation) {
  if (conversation) *conversation = NULL;
  pthread_mutex_lock(&s->mu);
  expire(s);
  entry *e = find(s, id);
  json_t *r = e ? json_loads(e->response, 0, NULL) : NULL;
  if (r && conversation) *conversation = json_loads(e->conversation, 0, NULL);
  pthread_mutex_unlock(&s->mu);
  return r;
}

bool resp_store_delete(resp_store *s, const char *id) {
  pthread_mutex_lock(&s->mu);
  expire(s);
  entry *e = find(s, id);
  if (e) unlink_entry(s, e);
  pthread_mutex_unlock(&s->mu);
  return e != NULL;
}

void resp_store_counts(resp_store *s, size_t *count, size_t *bytes) {
  pthread_mutex_lock(&s->mu);
  expire(s);
  *count = s->count;
  *bytes = s->bytes;
  pthread_mutex_unlock(&s->mu);
}

/* ---- requests ---- */

static int oom(serve_fail *f) { return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory"); }

void resp_request_free(resp_request *rr) {
  free(rr->previous_id);
  json_decref(rr->input);
  json_decref(rr->echo);
  memset(rr, 0, sizeof *rr);
}

/* tools: [{"type": "function", "name", "description", "parameters"}]; tool_choice: "auto" | "none" |
 * "required" | {"type": "function", "name"}. */
static const char *const choice_words[] = {"function", NULL};
static const serve_tool_choice choice_of[] = {SERVE_TOOLS_NAMED};
const serve_tools_dialect resp_tools_dialect = {
    .at = "tools[%zu]",
    .schema = "parameters",
    .type = "function",
    .not_array = "'tools' must be an array",
    .no_type = "'%s' must be an object with a type",
    .other_type = "'%s': tools of type '%.40s' are not supported by this server (function tools only)",
    .no_name = "'%s.name' is required (a string)",
    .strings = true,
    .words = choice_words,
    .choices = choice_of,
    .bad_string = "'tool_choice' must be auto, none, required or {\"type\": \"function\", \"name\"}",
    .bad_object = "'tool_choice' as an object must be {\"type\": \"function\", \"name\"}",
    .not_either = "'tool_choice' must be a string or an object",
    .unknown_name = "'tool_choice' names '%.64s', which is not among the tools",
    .no_tools = "'tool_choice' asks for a call but no tools are given",
};

static int parse_text_format(json_t *root, serve_request *req, serve_fail *f) {
  json_t *text = serve_json_field(root, "text");
  if (!text) return 0;
  if (!json_is_object(text)) return serve_bad(f, "text", "'text' must be an object");
  json_t *fmt = serve_json_field(text, "format");
  if (!fmt) return 0;
  const char *type = json_is_object(fmt) ? json_string_value(json_object_get(fmt, "type")) : NULL;
  if (!type) return serve_bad(f, "text.format", "'text.format' must be an object with a type");
  if (!strcmp(type, "json_object")) {
    req->json_schema = json_pack("{s:s}", "type", "object");
  } else if (!strcmp(type, "json_schema")) {
    json_t *schema = json_object_get(fmt, "schema");
    if (!json_is_object(schema) && !json_is_boolean(schema))
      return serve_bad(f, "text.format.schema", "'text.format.schema' must be a JSON Schema object");
    req->json_schema = json_is_object(schema) ? json_incref(schema) : json_pack("{s:s}", "type", "object");
  } else if (strcmp(type, "text")) {
    return serve_bad(f, "text.format", "'text.format' of type '%.40s' is not supported (text, json_object, json_schema)", type);
  }
  if (serve_output_grammar(req, f)) {
    snprintf(f->param, sizeof f->param, "text.format");
    return f->status;
  }
  return 0;
}

int resp_request_parse(const char *body, size_t len, serve_request *req, resp_request *rr, serve_fail *f) {
  memset(req, 0, sizeof *req);
  memset(rr, 0, sizeof *rr);
  req->kind = SERVE_CHAT;
  req->n = 1;
  serve_sampling_defaults(&req->sampling);
  rr->store = true;
  json_error_t je;
  json_t *root = json_loadb(body ? body : "", body ? len : 0, 0, &je);
  if (!root) return serve_bad(f, NULL, "The request body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
  int rc = 0;
  if (!json_is_object(root)) {
    rc = serve_bad(f, NULL, "The request body must be a JSON object");
    goto out;
  }
  static const char *refused[] = {"background", "conversation", "prompt", "modalities", "audio", "return_token_ids"};
  for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
    json_t *v = serve_json_field(root, refused[i]);
    if (v && !json_is_false(v)) {
      rc = serve_bad(f, refused[i], "'%s' is not supported by this server", refused[i]);
      goto out;
    }
  }
  json_t *model = serve_json_field(root, "model");
  if (model && !json_is_string(model)) {
    rc = serve_bad(f, "model", "'model' must be a string");
    goto out;
  }
  if ((rc = serve_json_str(root, "model", &req->model, f)) || (rc = serve_json_bool(root, "stream", &req->stream, f)) ||
      (rc = serve_json_bool(root, "store", &rr->store, f)) || (rc = serve_json_str(root, "previous_response_id", &rr->previous_id, f)))
    goto out;
  /* input: a string (one user message) or items */
  json_t *input = serve_json_field(root, "input");
  if (!input) {
    rc = serve_bad(f, "input", "'input' is required");
    goto out;
  }
  if (json_is_string(input)) {
    rr->input = json_pack("[{s:s, s:s, s:O}]", "type", "message", "role", "user", "content", input);
  } else if (json_is_array(input)) {
    rr->input = json_deep_copy(input);
  } else {
    rc = serve_bad(f, "input", "'input' must be a string or an array of items");
    goto out;
  }
  if (!rr->input) {
    rc = oom(f);
    goto out;
  }
  json_t *instr = serve_json_field(root, "instructions");
  if (instr && !json_is_string(instr)) {
    rc = serve_bad(f, "instructions", "'instructions' must be a string");
    goto out;
  }
  /* sampling */
  serve_sampling *s = &req->sampling;
  if ((rc = serve_json_int(root, "max_output_tokens", 1, INT32_MAX, &s->max_tokens, f)) ||
      (rc = serve_json_num(root, "temperature", 0, 2, &s->temperature, f)) ||
      (rc = serve_json_num(root, "top_p", 0, 1, &s->top_p, f)) || (rc = serve_json_spec(root, s, f)) ||
      (rc = serve_json_adapter(root, s, f)) || (rc = serve_json_samplers(root, s, f)))
    goto out;
  json_t *seed = serve_json_field(root, "seed"); /* an extension: reproducible sampling */
  if (seed) {
    if (!json_is_integer(seed)) {
      rc = serve_bad(f, "seed", "'seed' must be an integer");
      goto out;
    }
    s->has_seed = true;
    s->seed = (uint64_t)json_integer_value(seed);
  }
  if ((rc = serve_tools_parse(root, req, &resp_tools_dialect, f))) goto out;
  /* reasoning.effort reaches the template as chat completions' reasoning_effort does */
  json_t *reasoning = serve_json_field(root, "reasoning");
  if (reasoning) {
    if (!json_is_object(reasoning)) {
      rc = serve_bad(f, "reasoning", "'reasoning' must be an object");
      goto out;
    }
    json_t *effort = serve_json_field(reasoning, "effort");
    if (effort) {
      const char *e = json_string_value(effort);
      if (!e || (strcmp(e, "none") && strcmp(e, "minimal") && strcmp(e, "low") && strcmp(e, "medium") && strcmp(e, "high") &&
                 strcmp(e, "xhigh"))) {
        rc = serve_bad(f, "reasoning.effort", "'reasoning.effort' must be none, minimal, low, medium, high or xhigh");
        goto out;
      }
      req->template_kwargs = json_pack("{s:O}", "reasoning_effort", effort);
      if (!strcmp(e, "none")) json_object_set_new(req->template_kwargs, "enable_thinking", json_false());
    }
  }
  if ((rc = parse_text_format(root, req, f))) goto out;
  json_t *md = serve_json_field(root, "metadata");
  if (md && !json_is_object(md)) {
    rc = serve_bad(f, "metadata", "'metadata' must be an object");
    goto out;
  }
  /* what the response repeats */
  rr->echo = json_object();
  static const char *echo[] = {"instructions", "metadata", "tools", "tool_choice", "temperature", "top_p",
                               "max_output_tokens", "reasoning", "text", "parallel_tool_calls", "user", "truncation"};
  for (size_t i = 0; i < sizeof echo / sizeof *echo; i++) {
    json_t *v = serve_json_field(root, echo[i]);
    if (v) json_object_set(rr->echo, echo[i], v);
  }
out:
  json_decref(root);
  if (rc) {
    serve_request_free(req);
    resp_request_free(rr);
  }
  return rc;
}

/* Building messages from items. */
typedef struct builder {
  serve_request *req;
  int cap;
  /* the assistant turn being gathered */
  bool open;
  hbuf text, reasoning;
  json_t *calls;
} builder;

static int push(builder *b, const char *role, const char *content, size_t n, json_t *extra /* consumed */, serve_fail *f) {
  serve_request *r = b->req;
  if (r->nmessages == b->cap && !HGROW(r->messages, b->cap, r->nmessages + 1)) {
    json_decref(extra);
    return oom(f);
  }
  serve_message *m = &r->messages[r->nmessages];
  memset(m, 0, sizeof *m);
  m->role = strdup(role);
  m->content = malloc(n + 1);
  if (m->content) memcpy(m->content, content ? content : "", n), m->content[n] = 0;
  m->extra = extra;
  r->nmessages++;
  return m->role && m->content ? 0 : oom(f);
}

static int flush(builder *b, serve_fail *f) {
  if (!b->open) return 0;
  json_t *extra = NULL;
  if (b->calls || b->reasoning.len) extra = json_object();
  if (b->calls) json_object_set_new(extra, "tool_calls", b->calls);
  if (b->reasoning.len)
    json_object_set_new(extra, "reasoning_content", serve_json_text(b->reasoning.data, b->reasoning.len));
  b->calls = NULL;
  int rc = push(b, "assistant", b->text.data, b->text.len, extra, f);
  hbuf_clear(&b->text);
  hbuf_clear(&b->reasoning);
  b->open = false;
  return rc;
}

/* The text of a content field: a string, or parts of the given text types; with r, input_image
 * parts are media of r, and *parts the text and images in order for the template. */
static int content_text(json_t *c, const char *at, hbuf *out, serve_request *r, json_t **parts, serve_fail *f) {
  if (json_is_string(c)) {
    hbuf_append(out, json_string_value(c), json_string_length(c));
    if (parts) serve_text_part(parts, json_string_value(c), json_string_length(c));
    return 0;
  }
  if (!json_is_array(c)) return serve_bad(f, at, "'%s' must be a string or an array of content parts", at);
  size_t i;
  json_t *p;
  json_array_foreach(c, i, p) {
    char pat[160];
    snprintf(pat, sizeof pat, "%s[%zu]", at, i);
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type) return serve_bad(f, pat, "'%s' must be an object with a type", pat);
    if (!strcmp(type, "input_text") || !strcmp(type, "output_text") || !strcmp(type, "text") ||
        !strcmp(type, "reasoning_text") || !strcmp(type, "summary_text")) {
      json_t *t = json_object_get(p, "text");
      if (!json_is_string(t)) return serve_bad(f, pat, "'%s.text' must be a string", pat);
      hbuf_append(out, json_string_value(t), json_string_length(t));
      if (parts) serve_text_part(parts, json_string_value(t), json_string_length(t));
    } else if (!strcmp(type, "input_image") && r) {
      json_t *u = json_object_get(p, "image_url");
      if (json_is_object(u)) u = json_object_get(u, "url");
      if (!json_is_string(u))
        return serve_bad(f, pat, "'%s.image_url' must be a URL string (data: or http(s); file_id is not supported)", pat);
      int rc = serve_media_add(r, parts, HEARTH_MEDIA_IMAGE, json_string_value(u), pat, f);
      if (rc) return rc;
    } else if (!strcmp(type, "refusal")) {
      json_t *t = json_object_get(p, "refusal");
      if (json_is_string(t)) hbuf_append(out, json_string_value(t), json_string_length(t));
    } else if (!strcmp(type, "input_image") || !strcmp(type, "input_file") || !strcmp(type, "input_audio")) {
      return serve_bad(f, pat, "'%s': %s parts are not supported here", pat, type);
    } else {
      return serve_bad(f, pat, "'%s': unknown content part type '%.40s'", pat, type);
    }
  }
  return 0;
}

/* arguments (a JSON string) as the templates want them: an object */
static json_t *arguments_object(json_t *args) {
  if (json_is_object(args)) return json_incref(args);
  const char *s = json_string_value(args);
  json_t *o = s ? json_loads(s, 0, NULL) : NULL;
  if (json_is_object(o)) return o;
  json_decref(o);
  return s ? json_string(s) : json_object();
}

/* A NAME_call item of the server's own tools: 1 when it ran (string call_id, name and output),
 * -1 when it never did (output null: it is left out), 0 when it is no such item. */
static int server_call_item(const char *type, const json_t *it) {
  size_t n = strlen(type);
  if (n <= 5 || strcmp(type + n - 5, "_call") || !json_is_string(json_object_get(it, "call_id")) ||
      !json_is_string(json_object_get(it, "name")))
    return 0;
  json_t *out = json_object_get(it, "output");
  return json_is_string(out) ? 1 : json_is_null(out) ? -1 : 0;
}

static int add_items(builder *b, const json_t *items, const char *name, serve_fail *f) {
  size_t i;
  json_t *it;
  json_array_foreach(items, i, it) {
    char at[64];
    snprintf(at, sizeof at, "%s[%zu]", name, i);
    if (!json_is_object(it)) return serve_bad(f, at, "'%s' must be an object", at);
    const char *type = json_string_value(json_object_get(it, "type"));
    const char *role = json_string_value(json_object_get(it, "role"));
    if (!type && role) type = "message";
    if (!type) return serve_bad(f, at, "'%s' must have a type", at);
    int rc = 0;
    if (!strcmp(type, "message")) {
      if (!role) return serve_bad(f, at, "'%s.role' is required", at);
      char cat[96];
      snprintf(cat, sizeof cat, "%s.content", at);
      hbuf t = {0};
      json_t *parts = NULL;
      bool user = !strcmp(role, "user");
      int before = b->req->n_media;
      if ((rc = content_text(json_object_get(it, "content"), cat, &t, user ? b->req : NULL, user ? &parts : NULL, f))) {
        hbuf_free(&t);
        json_decref(parts);
        return rc;
      }
      if (b->req->n_media == before) {
        json_decref(parts);
        parts = NULL;
      }
      if (!strcmp(role, "assistant")) {
        if (b->open && b->calls && (rc = flush(b, f))) return hbuf_free(&t), rc;
        b->open = true;
        hbuf_append(&b->text, t.data, t.len);
      } else if (!strcmp(role, "user") || !strcmp(role, "system") || !strcmp(role, "developer")) {
        if (!(rc = flush(b, f))) rc = push(b, !strcmp(role, "developer") ? "system" : role, t.data, t.len, NULL, f);
        if (!rc && parts) b->req->messages[b->req->nmessages - 1].parts = parts, parts = NULL;
      } else {
        rc = serve_bad(f, at, "'%s.role' must be user, assistant, system or developer", at);
      }
      hbuf_free(&t);
      json_decref(parts);
      if (rc) return rc;
    } else if (!strcmp(type, "function_call")) {
      json_t *nm = json_object_get(it, "name"), *cid = json_object_get(it, "call_id");
      if (!json_is_string(nm) || !json_is_string(cid))
        return serve_bad(f, at, "'%s': a function_call has a string name, call_id and arguments", at);
      b->open = true;
      if (!b->calls) b->calls = json_array();
      json_t *fn = json_pack("{s:O, s:o}", "name", nm, "arguments", arguments_object(json_object_get(it, "arguments")));
      json_array_append_new(b->calls, json_pack("{s:O, s:s, s:o}", "id", cid, "type", "function", "function", fn));
    } else if (!strcmp(type, "function_call_output")) {
      json_t *cid = json_object_get(it, "call_id");
      if (!json_is_string(cid)) return serve_bad(f, at, "'%s.call_id' is required (a string)", at);
      char oat[96];
      snprintf(oat, sizeof oat, "%s.output", at);
      hbuf t = {0};
      if ((rc = flush(b, f)) || (rc = content_text(json_object_get(it, "output"), oat, &t, NULL, NULL, f))) {
        hbuf_free(&t);
        return rc;
      }
      rc = push(b, "tool", t.data, t.len, json_pack("{s:O}", "tool_call_id", cid), f);
      hbuf_free(&t);
      if (rc) return rc;
    } else if (server_call_item(type, it) < 0) { /* a call of the server's own tool that never ran */
    } else if (server_call_item(type, it) > 0) { /* the server's own tool: its call and its result */
      json_t *nm = json_object_get(it, "name"), *cid = json_object_get(it, "call_id");
      b->open = true;
      if (!b->calls) b->calls = json_array();
      json_t *fn = json_pack("{s:O, s:o}", "name", nm, "arguments", arguments_object(json_object_get(it, "arguments")));
      json_array_append_new(b->calls, json_pack("{s:O, s:s, s:o}", "id", cid, "type", "function", "function", fn));
      const char *out = json_string_value(json_object_get(it, "output"));
      if ((rc = flush(b, f)) ||
          (rc = push(b, "tool", out ? out : "", out ? strlen(out) : 0, json_pack("{s:O, s:O}", "tool_call_id", cid, "name", nm), f)))
        return rc;
    } else if (!strcmp(type, "reasoning")) {
      if (b->open && (b->text.len || b->calls) && (rc = flush(b, f))) return rc;
      b->open = true;
      json_t *c = json_object_get(it, "content");
      if (!c || json_is_null(c) || json_array_size(c) == 0) c = json_object_get(it, "summary");
      char cat[96];
      snprintf(cat, sizeof cat, "%s.content", at);
      if (c && !json_is_null(c) && (rc = content_text(c, cat, &b->reasoning, NULL, NULL, f))) return rc;
    } else if (!strcmp(type, "item_reference")) {
      return serve_bad(f, at, "'%s': item_reference is not supported; send the item itself", at);
    } else {
      return serve_bad(f, at, "'%s': items of type '%.40s' are not supported by this server", at, type);
    }
  }
  return 0;
}

int resp_request_messages(serve_request *req, const resp_request *rr, const json_t *history, serve_fail *f) {
  builder b = {.req = req, .cap = req->nmessages};
  int rc = 0;
  const char *instr = json_string_value(json_object_get(rr->echo, "instructions"));
  if (instr) rc = push(&b, "system", instr, strlen(instr), NULL, f);
  if (!rc && history) rc = add_items(&b, history, "previous_response", f);
  if (!rc) rc = add_items(&b, rr->input, "input", f);
  if (!rc) rc = flush(&b, f);
  hbuf_free(&b.text);
  hbuf_free(&b.reasoning);
  json_decref(b.calls);
  if (!rc && req->nmessages == 0) rc = serve_bad(f, "input", "'input' holds no messages");
  return rc;
}

/* ---- replies ---- */

static void make_id(char *out, size_t cap, const char *prefix, uint64_t x, int len) {
  static const char hex[] = "0123456789abcdef";
  size_t n = (size_t)snprintf(out, cap, "%s", prefix);
  for (int i = 0; i < len && n + 1 < cap; i++) {
    if (i % 16 == 0) x = hmix64(x + (uint64_t)i);
    out[n++] = hex[x & 15];
    x >>= 4;
  }
  out[n] = 0;
}

void resp_reply_init(resp_reply *r, const char *model, uint64_t id_seed, const resp_request *rr) {
  memset(r, 0, sizeof *r);
  r->model = model;
  r->rr = rr;
  r->created = (int64_t)time(NULL);
  r->seed = hmix64(id_seed ^ 0x5265737030ull);
  make_id(r->id, sizeof r->id, "resp_", r->seed, 40);
  r->output = json_array();
  r->open = -1;
}

void resp_reply_free(resp_reply *r) {
  tc_parser_free(r->tc);
  json_decref(r->pending);
  json_decref(r->round_calls);
  hbuf_free(&r->round_text);
  json_decref(r->output);
  json_decref(r->item);
  hbuf_free(&r->cur);
  memset(r, 0, sizeof *r);
}

int resp_reply_parse(resp_reply *r, const tc_opts *o, herr *err) {
  if (tc_parser_new(o, &r->tc, err)) return err ? err->code : HEARTH_EINTERNAL;
  if (!r->pending) r->pending = json_array();
  if (!r->round_calls) r->round_calls = json_array();
  return r->pending && r->round_calls ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
}

static bool server_tool(const resp_reply *r, const char *name) {
  for (int i = 0; name && i < r->n_server_tools; i++)
    if (!strcmp(r->server_tools[i], name)) return true;
  return false;
}

static json_t *next_id(resp_reply *r, const char *prefix) {
  char id[64];
  make_id(id, sizeof id, prefix, r->seed + (uint64_t)(++r->n_ids) * HMIX64_GAMMA, 32);
  return json_string(id);
}

static void emit(resp_reply *r, const char *type, json_t *data /* consumed */) {
  if (!data) data = json_object(); /* out of memory building it: the event still keeps the sequence */
  if (!r->sse) {
    json_decref(data);
    return;
  }
  json_object_set_new(data, "type", json_string(type));
  json_object_set_new(data, "sequence_number", json_integer(r->seq++));
  hbuf_printf(r->sse, "event: %s\ndata: ", type);
  char *s = json_dumps(data, JSON_COMPACT);
  if (s) hbuf_puts(r->sse, s);
  else r->sse->oom = true;
  free(s);
  hbuf_puts(r->sse, "\n\n");
  json_decref(data);
}

static json_t *text_part(const char *s, size_t n) {
  return json_pack("{s:s, s:o, s:[], s:[]}", "type", "output_text", "text", serve_json_text(s, n), "annotations", "logprobs");
}

static json_t *reasoning_part(const char *s, size_t n) {
  return json_pack("{s:s, s:o}", "type", "reasoning_text", "text", serve_json_text(s, n));
}

/* Closes the open item: fills in its text or arguments, marks it completed
 * (incomplete when the budget cut it), keeps it in output; a stream says
 * the *.done events. */
static void item_close(resp_reply *r) {
  if (r->open < 0) return;
  int index = (int)json_array_size(r->output);
  json_t *it = r->item;
  r->item = NULL;
  const char *id = json_string_value(json_object_get(it, "id"));
  if (r->open == TC_TEXT || r->open == TC_REASONING) {
    bool text = r->open == TC_TEXT;
    emit(r, text ? "response.output_text.done" : "response.reasoning_text.done",
         text ? json_pack("{s:s, s:i, s:i, s:o, s:[]}", "item_id", id, "output_index", index, "content_index", 0, "text",
                          serve_json_text(r->cur.data, r->cur.len), "logprobs")
              : json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", index, "content_index", 0, "text",
                          serve_json_text(r->cur.data, r->cur.len)));
    json_t *part = text ? text_part(r->cur.data, r->cur.len) : reasoning_part(r->cur.data, r->cur.len);
    emit(r, "response.content_part.done",
         json_pack("{s:s, s:i, s:i, s:O}", "item_id", id, "output_index", index, "content_index", 0, "part", part));
    json_t *content = json_array();
    json_array_append_new(content, part);
    json_object_set_new(it, "content", content);
  } else if (r->own_call) { /* a server tool's call: done once it ran (resp_reply_round_next) */
    json_object_set_new(it, "arguments", serve_json_text(r->cur.data, r->cur.len));
    json_array_append_new(r->pending, json_integer(index));
    json_array_append_new(r->output, it);
    hbuf_clear(&r->cur);
    r->open = -1;
    r->own_call = false;
    return;
  } else {
    json_t *args = serve_json_text(r->cur.data, r->cur.len);
    emit(r, "response.function_call_arguments.done",
         json_pack("{s:s, s:i, s:O, s:O}", "item_id", id, "output_index", index, "name", json_object_get(it, "name"),
                   "arguments", args));
    json_object_set_new(it, "arguments", args);
  }
  json_object_set_new(it, "status", json_string(r->cut ? "incomplete" : "completed"));
  emit(r, "response.output_item.done", json_pack("{s:i, s:O}", "output_index", index, "item", it));
  json_array_append_new(r->output, it);
  hbuf_clear(&r->cur);
  r->open = -1;
}

static void item_open(resp_reply *r, int kind, json_t *item /* consumed */) {
  item_close(r);
  r->open = kind;
  r->item = item;
  int index = (int)json_array_size(r->output);
  emit(r, "response.output_item.added", json_pack("{s:i, s:O}", "output_index", index, "item", item));
  if (kind == TC_TEXT || kind == TC_REASONING)
    emit(r, "response.content_part.added",
         json_pack("{s:O, s:i, s:i, s:o}", "item_id", json_object_get(item, "id"), "output_index", index, "content_index",
                   0, "part", kind == TC_TEXT ? text_part("", 0) : reasoning_part("", 0)));
}

static void item_delta(resp_reply *r, const char *s, size_t n) {
  hbuf_append(&r->cur, s, n);
  int index = (int)json_array_size(r->output);
  json_t *id = json_object_get(r->item, "id");
  if (r->open == TC_TEXT)
    emit(r, "response.output_text.delta",
         json_pack("{s:O, s:i, s:i, s:o, s:[]}", "item_id", id, "output_index", index, "content_index", 0, "delta",
                   serve_json_text(s, n), "logprobs"));
  else if (r->open == TC_REASONING)
    emit(r, "response.reasoning_text.delta",
         json_pack("{s:O, s:i, s:i, s:o}", "item_id", id, "output_index", index, "content_index", 0, "delta",
                   serve_json_text(s, n)));
  else if (!r->own_call)
    emit(r, "response.function_call_arguments.delta",
         json_pack("{s:O, s:i, s:o}", "item_id", id, "output_index", index, "delta", serve_json_text(s, n)));
}

static int on_event(void *ctx, const tc_event *ev) {
  resp_reply *r = ctx;
  switch (ev->kind) {
  case TC_TEXT:
  case TC_REASONING:
    if (ev->len == 0) break;
    if (ev->kind == TC_TEXT) hbuf_append(&r->round_text, ev->text, ev->len);
    if (r->open != (int)ev->kind) {
      json_t *it = ev->kind == TC_TEXT
                       ? json_pack("{s:o, s:s, s:s, s:s, s:[]}", "id", next_id(r, "msg_"), "type", "message", "status",
                                   "in_progress", "role", "assistant", "content")
                       : json_pack("{s:o, s:s, s:[], s:[], s:s}", "id", next_id(r, "rs_"), "type", "reasoning", "summary",
                                   "content", "status", "in_progress");
      item_open(r, ev->kind, it);
    }
    item_delta(r, ev->text, ev->len);
    break;
  case TC_CALL_BEGIN: {
    char call[48];
    serve_random_id(call, sizeof call, "call_", 24);
    json_t *name = serve_json_text(ev->name, ev->name ? strlen(ev->name) : 0);
    bool own = server_tool(r, ev->name);
    hbuf type = {0};
    if (own) hbuf_printf(&type, "%s_call", ev->name);
    else r->ncalls++;
    json_t *it = json_pack("{s:o, s:s, s:s, s:s, s:O, s:s}", "id", next_id(r, own ? "stc_" : "fc_"), "type",
                           own ? hbuf_str(&type) : "function_call", "status", "in_progress", "call_id", call, "name", name,
                           "arguments", "");
    if (own && it) json_object_set_new(it, "output", json_null());
    hbuf_free(&type);
    item_open(r, TC_CALL_BEGIN, it);
    r->own_call = own;
    json_array_append_new(r->round_calls,
                          json_pack("{s:s, s:s, s:{s:O, s:s}}", "id", call, "type", "function", "function", "name", name, "arguments", ""));
    json_decref(name);
    break;
  }
  case TC_CALL_ARGS:
    if (ev->len) item_delta(r, ev->text, ev->len);
    break;
  case TC_CALL_END: {
    json_t *c = json_array_get(r->round_calls, json_array_size(r->round_calls) - 1);
    if (c) json_object_set_new(json_object_get(c, "function"), "arguments", serve_json_text(r->cur.data, r->cur.len));
    item_close(r);
    break;
  }
  }
  return 0;
}

static void feed(resp_reply *r, const char *s, size_t n) {
  if (r->tc) {
    if (!r->tc_done) tc_parser_feed(r->tc, s, n, on_event, r, NULL);
    return;
  }
  if (!n) return;
  tc_event ev = {.kind = TC_TEXT, .text = s, .len = n};
  on_event(r, &ev);
}

/* The parser's last events (the engine flushed its held-back text). */
static void end_parse(resp_reply *r) {
  if (r->tc && !r->tc_done) {
    r->tc_done = true;
    tc_parser_finish(r->tc, on_event, r, NULL);
  }
}

/* A server tool's call item done: with its output (NULL: it never ran, incomplete). */
static void own_call_done(resp_reply *r, size_t index, const char *output) {
  json_t *it = json_array_get(r->output, index);
  if (!it) return;
  json_object_set_new(it, "output", output ? serve_json_text(output, strlen(output)) : json_null());
  json_object_set_new(it, "status", json_string(output ? "completed" : "incomplete"));
  emit(r, "response.output_item.done", json_pack("{s:i, s:O}", "output_index", (int)index, "item", it));
}

/* The output is over: res says whether it was cut (NULL: not known, not cut). */
static void end(resp_reply *r, const serve_result *res) {
  end_parse(r);
  if (res && res->finish == SERVE_FINISH_LENGTH) r->cut = true;
  item_close(r);
  size_t k;
  json_t *ix;
  json_array_foreach(r->pending, k, ix) own_call_done(r, (size_t)json_integer_value(ix), NULL);
  json_array_clear(r->pending);
}

const json_t *resp_reply_round_calls(resp_reply *r, hbuf *out, const char **text) {
  r->sse = out;
  end_parse(r);
  r->sse = NULL;
  *text = hbuf_str(&r->round_text);
  return r->round_calls;
}

int resp_reply_round_next(resp_reply *r, const json_t *round, const tc_opts *o, hbuf *out, herr *err) {
  r->sse = out;
  item_close(r); /* what the round wrote after its calls */
  size_t k, i;
  json_t *ix, *m;
  json_array_foreach(r->pending, k, ix) {
    size_t index = (size_t)json_integer_value(ix);
    const char *cid = json_string_value(json_object_get(json_array_get(r->output, index), "call_id"));
    const char *result = NULL;
    json_array_foreach(round, i, m) {
      const char *id = json_string_value(json_object_get(m, "tool_call_id"));
      if (cid && id && !strcmp(cid, id)) result = json_string_value(json_object_get(m, "content"));
    }
    own_call_done(r, index, result ? result : "");
  }
  json_array_clear(r->pending);
  r->sse = NULL;
  json_array_clear(r->round_calls);
  hbuf_clear(&r->round_text);
  tc_parser_free(r->tc);
  r->tc = NULL;
  r->tc_done = false;
  if (tc_parser_new(o, &r->tc, err)) return err ? err->code : HEARTH_EINTERNAL;
  return 0;
}

void resp_reply_prime(resp_reply *r, const char *text, hbuf *out) {
  r->sse = out;
  feed(r, text, strlen(text));
  r->sse = NULL;
}

void resp_reply_add(resp_reply *r, const serve_token *tok) {
  feed(r, tok->text, tok->len);
  if (tok->flush) end_parse(r); /* the open item stays open: only the result says whether it is complete */
}

static json_t *echoed(const resp_reply *r, const char *key, json_t *dflt /* consumed */) {
  json_t *v = r->rr ? json_object_get(r->rr->echo, key) : NULL;
  if (v) {
    json_decref(dflt);
    return json_incref(v);
  }
  return dflt;
}

json_t *resp_reply_object(resp_reply *r, const serve_result *res) {
  if (res) end(r, res);
  const char *status = !res ? "in_progress" : res->finish == SERVE_FINISH_LENGTH ? "incomplete" : "completed";
  json_t *o = json_object();
  json_object_set_new(o, "id", json_string(r->id));
  json_object_set_new(o, "object", json_string("response"));
  json_object_set_new(o, "created_at", json_integer(r->created));
  json_object_set_new(o, "status", json_string(status));
  json_object_set_new(o, "background", json_false());
  json_object_set_new(o, "error", json_null());
  json_object_set_new(o, "incomplete_details",
                      res && res->finish == SERVE_FINISH_LENGTH ? json_pack("{s:s}", "reason", "max_output_tokens")
                                                                : json_null());
  json_object_set_new(o, "instructions", echoed(r, "instructions", json_null()));
  json_object_set_new(o, "max_output_tokens", echoed(r, "max_output_tokens", json_null()));
  json_object_set_new(o, "model", json_string(r->model ? r->model : ""));
  json_object_set_new(o, "output", res ? json_incref(r->output) : json_array());
  json_object_set_new(o, "parallel_tool_calls", echoed(r, "parallel_tool_calls", json_true()));
  json_object_set_new(o, "previous_response_id",
                      r->rr && r->rr->previous_id ? json_string(r->rr->previous_id) : json_null());
  json_t *reasoning = echoed(r, "reasoning", json_object());
  if (!json_object_get(reasoning, "effort")) json_object_set_new(reasoning, "effort", json_null());
  if (!json_object_get(reasoning, "summary")) json_object_set_new(reasoning, "summary", json_null());
  json_object_set_new(o, "reasoning", reasoning);
  json_object_set_new(o, "store", json_boolean(!r->rr || r->rr->store));
  json_object_set_new(o, "temperature", echoed(r, "temperature", json_real(1.0)));
  json_object_set_new(o, "text", echoed(r, "text", json_pack("{s:{s:s}}", "format", "type", "text")));
  json_object_set_new(o, "tool_choice", echoed(r, "tool_choice", json_string("auto")));
  json_object_set_new(o, "tools", echoed(r, "tools", json_array()));
  json_object_set_new(o, "top_p", echoed(r, "top_p", json_real(1.0)));
  json_object_set_new(o, "truncation", echoed(r, "truncation", json_string("disabled")));
  json_object_set_new(o, "user", echoed(r, "user", json_null()));
  json_object_set_new(o, "metadata", echoed(r, "metadata", json_object()));
  if (res) {
    int64_t cached = res->cached_tokens > 0 ? res->cached_tokens : 0;
    json_object_set_new(o, "usage",
                        json_pack("{s:I, s:{s:I}, s:I, s:{s:i}, s:I}", "input_tokens", (json_int_t)res->prompt_tokens,
                                  "input_tokens_details", "cached_tokens", (json_int_t)cached, "output_tokens",
                                  (json_int_t)res->completion_tokens, "output_tokens_details", "reasoning_tokens", 0,
                                  "total_tokens", (json_int_t)(res->prompt_tokens + res->completion_tokens)));
  } else {
    json_object_set_new(o, "usage", json_null());
  }
  return o;
}

json_t *resp_reply_conversation(resp_reply *r, const json_t *history) {
  json_t *c = history ? json_deep_copy(history) : json_array();
  if (!c) return NULL;
  if (r->rr) json_array_extend(c, r->rr->input);
  json_array_extend(c, r->output);
  return c;
}

void resp_sse_start(resp_reply *r, hbuf *out) {
  r->sse = out;
  json_t *obj = resp_reply_object(r, NULL);
  emit(r, "response.created", json_pack("{s:O}", "response", obj));
  emit(r, "response.in_progress", json_pack("{s:o}", "response", obj));
  r->sse = NULL;
}

void resp_sse_token(resp_reply *r, const serve_token *tok, hbuf *out) {
  r->sse = out;
  resp_reply_add(r, tok);
  r->sse = NULL;
}

void resp_sse_finish(resp_reply *r, const serve_result *res, hbuf *out) {
  r->sse = out;
  end(r, res);
  json_t *obj = resp_reply_object(r, res);
  emit(r, res->finish == SERVE_FINISH_LENGTH ? "response.incomplete" : "response.completed",
       json_pack("{s:o}", "response", obj));
  r->sse = NULL;
}

void resp_sse_error(resp_reply *r, const serve_fail *f, hbuf *out) {
  r->sse = out;
  emit(r, "error",
       json_pack("{s:s?, s:o, s:s?}", "code", f->code[0] ? f->code : f->type, "message",
                 serve_json_text(f->message, strlen(f->message)), "param", f->param[0] ? f->param : NULL));
  r->sse = NULL;
}
