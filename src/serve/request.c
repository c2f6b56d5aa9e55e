/* request.c — OpenAI request bodies → serve_request, with every field checked
 * for type and range and every refusal naming the field in `param`. Owns the
 * error shape too. Knows nothing of sockets, models or templates: content
 * parts are flattened to text here and handed on as strings. */
#include "serve/request.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/vec.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"
#include "serve/reply.h"

#define MAX_STOP 16

int serve_fail_set(serve_fail *f, int status, const char *type, const char *param, const char *code, const char *fmt,
                   ...) {
  f->status = status;
  f->type = type;
  snprintf(f->param, sizeof f->param, "%s", param ? param : "");
  snprintf(f->code, sizeof f->code, "%s", code ? code : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->message, sizeof f->message, fmt, ap);
  va_end(ap);
  return status;
}

/* jansson refuses strings that are not valid UTF-8; a message may quote
 * client bytes, so cut it at the first invalid byte. */
static json_t *text_json(const char *s) {
  json_t *j = json_string(s);
  if (j) return j;
  size_t n = strlen(s);
  while (n > 0 && !(j = json_stringn(s, n))) n--;
  return j ? j : json_string("");
}

char *serve_fail_json(const serve_fail *f) {
  json_t *e = json_object();
  json_object_set_new(e, "message", text_json(f->message));
  json_object_set_new(e, "type", json_string(f->type ? f->type : "invalid_request_error"));
  json_object_set_new(e, "param", f->param[0] ? text_json(f->param) : json_null());
  json_object_set_new(e, "code", f->code[0] ? json_string(f->code) : json_null());
  json_t *root = json_object();
  json_object_set_new(root, "error", e);
  char *s = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  return s;
}

int serve_bad(serve_fail *f, const char *param, const char *fmt, ...) {
  f->status = 400;
  f->type = "invalid_request_error";
  snprintf(f->param, sizeof f->param, "%s", param ? param : "");
  f->code[0] = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->message, sizeof f->message, fmt, ap);
  va_end(ap);
  return 400;
}

/* A field, or NULL when absent or JSON null (both mean "not given"). */
json_t *serve_json_field(json_t *obj, const char *key) {
  json_t *v = json_object_get(obj, key);
  return (v && !json_is_null(v)) ? v : NULL;
}

/* An integer field within [lo, hi]; a real with an integral value counts. */
int serve_json_int(json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out, serve_fail *f) {
  json_t *v = serve_json_field(obj, key);
  if (!v) return 0;
  int64_t i;
  if (json_is_integer(v)) {
    i = (int64_t)json_integer_value(v);
  } else if (json_is_real(v)) {
    double d = json_real_value(v);
    if (d != floor(d)) return serve_bad(f, key, "'%s' must be an integer", key);
    if (!(d > -9.2e18 && d < 9.2e18)) return serve_bad(f, key, "'%s' is out of range", key);
    i = (int64_t)d;
  } else {
    return serve_bad(f, key, "'%s' must be an integer", key);
  }
  if (i < lo || i > hi) return serve_bad(f, key, "'%s' must be between %lld and %lld", key, (long long)lo, (long long)hi);
  *out = i;
  return 0;
}

int serve_json_num(json_t *obj, const char *key, double lo, double hi, double *out, serve_fail *f) {
  json_t *v = serve_json_field(obj, key);
  if (!v) return 0;
  if (!json_is_number(v)) return serve_bad(f, key, "'%s' must be a number", key);
  double d = json_number_value(v);
  if (!(d >= lo && d <= hi)) return serve_bad(f, key, "'%s' must be between %g and %g", key, lo, hi);
  *out = d;
  return 0;
}

int serve_json_bool(json_t *obj, const char *key, bool *out, serve_fail *f) {
  json_t *v = serve_json_field(obj, key);
  if (!v) return 0;
  if (!json_is_boolean(v)) return serve_bad(f, key, "'%s' must be a boolean", key);
  *out = json_is_true(v);
  return 0;
}

int serve_json_str(json_t *obj, const char *key, char **out, serve_fail *f) {
  json_t *v = serve_json_field(obj, key);
  if (!v) return 0;
  if (!json_is_string(v)) return serve_bad(f, key, "'%s' must be a string", key);
  *out = strdup(json_string_value(v));
  if (!*out) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  return 0;
}

int serve_media_add(serve_request *r, json_t **parts, hearth_media_kind kind, const char *url, const char *where,
                    serve_fail *f) {
  if (r->n_media >= 64) return serve_bad(f, where, "'%s': at most 64 media in a request", where);
  if (r->n_media == r->cap_media && !HGROW(r->media, r->cap_media, r->n_media + 1))
    return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  hearth_media *m = &r->media[r->n_media];
  memset(m, 0, sizeof *m);
  m->kind = kind;
  m->url = strdup(url);
  m->name = strdup(where);
  r->n_media++;
  if (!*parts) *parts = json_array();
  static const char *const types[] = {"image", "audio", "video"};
  json_array_append_new(*parts, json_pack("{s:s}", "type", types[kind]));
  if (!m->url || !m->name || !*parts) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  return 0;
}

void serve_text_part(json_t **parts, const char *text, size_t len) {
  if (!*parts) *parts = json_array();
  json_array_append_new(*parts, json_pack("{s:s, s:o}", "type", "text", "text", serve_json_text(text, len)));
}

/* An OpenAI media part (image_url, input_audio, video_url; or one named by a plain url / data):
 * 1 when it is one (added to r), 0 when it is not, else the failure's status. */
static int media_part(serve_request *r, json_t *part, const char *type, const char *param, json_t **parts, serve_fail *f) {
  hearth_media_kind kind;
  const char *key;
  if (!strcmp(type, "image_url") || !strcmp(type, "input_image")) kind = HEARTH_MEDIA_IMAGE, key = "image_url";
  else if (!strcmp(type, "video_url")) kind = HEARTH_MEDIA_VIDEO, key = "video_url";
  else if (!strcmp(type, "input_audio")) kind = HEARTH_MEDIA_AUDIO, key = "input_audio";
  else return 0;
  json_t *v = json_object_get(part, key);
  const char *url = NULL;
  if (kind == HEARTH_MEDIA_AUDIO) { /* {"data": base64, "format": "wav" | "mp3" | ...} */
    json_t *d = json_is_object(v) ? json_object_get(v, "data") : NULL;
    if (!json_is_string(d)) return serve_bad(f, param, "'%s.input_audio.data' must be a base64 string", param);
    url = json_string_value(d);
  } else {
    if (json_is_object(v)) v = json_object_get(v, "url");
    if (!json_is_string(v)) return serve_bad(f, param, "'%s.%s' must be a URL string or an object with a url", param, key);
    url = json_string_value(v);
  }
  int rc = serve_media_add(r, parts, kind, url, param, f);
  return rc ? rc : 1;
}

/* Content: a string, or an array of parts {"type":"text","text":...} and media parts; with media,
 * *parts holds them all in order for the template. */
static int flatten_content(serve_request *r, json_t *c, int mi, char **out, json_t **parts, serve_fail *f) {
  char param[96];
  snprintf(param, sizeof param, "messages[%d].content", mi);
  if (!c || json_is_null(c)) {
    *out = strdup("");
  } else if (json_is_string(c)) {
    *out = strdup(json_string_value(c));
  } else if (json_is_array(c)) {
    size_t i;
    json_t *part;
    int before = r->n_media;
    hbuf text = {0};
    json_array_foreach(c, i, part) {
      snprintf(param, sizeof param, "messages[%d].content[%zu]", mi, i);
      int rc = 0;
      json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
      if (!json_is_object(part)) rc = serve_bad(f, param, "'%s' must be an object with a type", param);
      else if (!json_is_string(type)) rc = serve_bad(f, param, "'%s.type' must be a string", param);
      else if ((rc = media_part(r, part, json_string_value(type), param, parts, f)) == 1) continue;
      else if (!rc && strcmp(json_string_value(type), "text") != 0)
        rc = serve_bad(f, param, "'%s' is of type '%s', which this server does not take (text, image_url, input_audio, "
                       "video_url)", param, json_string_value(type));
      json_t *t = rc ? NULL : json_object_get(part, "text");
      if (!rc && !json_is_string(t)) rc = serve_bad(f, param, "'%s.text' must be a string", param);
      if (rc) {
        hbuf_free(&text);
        return rc;
      }
      hbuf_append(&text, json_string_value(t), json_string_length(t));
      serve_text_part(parts, json_string_value(t), json_string_length(t));
    }
    if (r->n_media == before) { /* text only: the template gets the joined text */
      json_decref(*parts);
      *parts = NULL;
    }
    if (text.oom) {
      hbuf_free(&text);
      return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
    }
    *out = text.data ? hbuf_take(&text) : strdup("");
  } else {
    return serve_bad(f, param, "'%s' must be a string or an array of content parts", param);
  }
  if (!*out) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  return 0;
}

/* An arguments string as the templates want it: the JSON value it holds
 * (templates print it with tojson), or the string itself when it is not JSON. */
static json_t *arguments_value(json_t *a) {
  if (!json_is_string(a)) return json_incref(a);
  json_t *v = json_loadb(json_string_value(a), json_string_length(a), JSON_DECODE_ANY, NULL);
  return v ? v : json_incref(a);
}

/* The keys of a message besides role and content that templates read:
 * assistant tool_calls (arguments decoded to objects, as the templates
 * expect), reasoning_content; a tool result's tool_call_id and name. */
static int message_extra(json_t *m, const char *role, int mi, serve_message *out, serve_fail *f) {
  char param[128];
  json_t *extra = NULL;
  if (!strcmp(role, "assistant")) {
    json_t *calls = serve_json_field(m, "tool_calls");
    if (calls) {
      snprintf(param, sizeof param, "messages[%d].tool_calls", mi);
      if (!json_is_array(calls)) return serve_bad(f, param, "'%s' must be an array", param);
      json_t *norm = json_array();
      size_t k;
      json_t *c;
      json_array_foreach(calls, k, c) {
        snprintf(param, sizeof param, "messages[%d].tool_calls[%zu]", mi, k);
        json_t *fn = json_is_object(c) ? json_object_get(c, "function") : NULL;
        json_t *name = fn ? json_object_get(fn, "name") : NULL;
        json_t *type = json_is_object(c) ? json_object_get(c, "type") : NULL;
        if (!json_is_object(fn) || !json_is_string(name)) {
          json_decref(norm);
          return serve_bad(f, param, "'%s' must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}",
                     param);
        }
        if (type && !json_is_null(type) && (!json_is_string(type) || strcmp(json_string_value(type), "function"))) {
          json_decref(norm);
          return serve_bad(f, param, "'%s.type' must be \"function\"", param);
        }
        json_t *args = json_object_get(fn, "arguments");
        json_t *nfn = json_pack("{s:O}", "name", name);
        json_object_set_new(nfn, "arguments", args && !json_is_null(args) ? arguments_value(args) : json_object());
        json_t *nc = json_pack("{s:s, s:o}", "type", "function", "function", nfn);
        json_t *id = json_object_get(c, "id");
        if (json_is_string(id)) json_object_set(nc, "id", id);
        json_array_append_new(norm, nc);
      }
      extra = json_object();
      json_object_set_new(extra, "tool_calls", norm);
    }
    json_t *rc = serve_json_field(m, "reasoning_content");
    if (!rc) rc = serve_json_field(m, "reasoning");
    if (rc) {
      snprintf(param, sizeof param, "messages[%d].reasoning_content", mi);
      if (!json_is_string(rc)) {
        json_decref(extra);
        return serve_bad(f, param, "'%s' must be a string", param);
      }
      if (!extra) extra = json_object();
      json_object_set(extra, "reasoning_content", rc);
    }
  } else if (!strcmp(role, "tool")) {
    json_t *id = serve_json_field(m, "tool_call_id");
    snprintf(param, sizeof param, "messages[%d].tool_call_id", mi);
    if (id && !json_is_string(id)) return serve_bad(f, param, "'%s' must be a string", param);
    extra = json_object();
    if (id) json_object_set(extra, "tool_call_id", id);
  }
  json_t *name = serve_json_field(m, "name");
  if (name) {
    snprintf(param, sizeof param, "messages[%d].name", mi);
    if (!json_is_string(name)) {
      json_decref(extra);
      return serve_bad(f, param, "'%s' must be a string", param);
    }
    if (!extra) extra = json_object();
    json_object_set(extra, "name", name);
  }
  out->extra = extra;
  return 0;
}

static bool tool_name_ok(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > 64) return false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
          c == '.' || c == ':'))
      return false;
  }
  return true;
}

bool serve_tool_known(const serve_request *req, const char *name) {
  size_t i;
  json_t *t;
  json_array_foreach(req->tools, i, t) {
    const char *n = json_string_value(json_object_get(json_object_get(t, "function"), "name"));
    if (n && !strcmp(n, name)) return true;
  }
  return false;
}

int serve_tool_add(serve_request *req, const char *name, json_t *description, json_t *parameters, const char *at,
                   serve_fail *f) {
  if (!tool_name_ok(name))
    return serve_bad(f, at, "'%s' has the name '%.80s': a tool name is 1 to 64 of a-z, A-Z, 0-9, '_', '-', '.', ':'", at,
               name);
  if (description && !json_is_null(description) && !json_is_string(description))
    return serve_bad(f, at, "'%s.description' must be a string", at);
  if (parameters && !json_is_null(parameters) && !json_is_object(parameters))
    return serve_bad(f, at, "'%s.parameters' must be a JSON Schema object", at);
  if (parameters && json_is_object(parameters)) { /* checked as response_format's schema is */
    char *text = json_dumps(parameters, JSON_COMPACT);
    hbuf g = {0};
    herr e = {0};
    int rc = text ? json_schema_to_gbnf(text, strlen(text), &g, &e) : herr_set(&e, HEARTH_ENOMEM, "out of memory");
    free(text);
    hbuf_free(&g);
    /* a keyword the grammar cannot follow is no error in a tool: only a forced call's grammar needs it */
    if (rc && rc != HEARTH_EUNSUPPORTED) return serve_bad(f, at, "'%s.parameters': %s", at, e.msg);
  }
  if (req->tools && serve_tool_known(req, name)) return serve_bad(f, at, "'%s': the tool name '%s' is used twice", at, name);
  json_t *fn = json_object();
  json_object_set_new(fn, "name", json_string(name));
  if (description && json_is_string(description)) json_object_set(fn, "description", description);
  json_object_set_new(fn, "parameters",
                      parameters && json_is_object(parameters) ? json_incref(parameters)
                                                               : json_pack("{s:s, s:{}}", "type", "object", "properties"));
  if (!req->tools) req->tools = json_array();
  json_array_append_new(req->tools, json_pack("{s:s, s:o}", "type", "function", "function", fn));
  return 0;
}

/* One tool of dialect d at tools[i] (place `at`) into req->tools. */
static int tool_parse(json_t *t, const char *at, serve_request *req, const serve_tools_dialect *d, serve_fail *f) {
  json_t *type = json_is_object(t) ? json_object_get(t, "type") : NULL;
  if (d->untyped_ok && (!type || json_is_null(type))) {
    /* a tool of the served type */
  } else if (!json_is_string(type) && !d->untyped_ok) {
    return serve_bad(f, at, d->no_type, at);
  } else if (!json_is_string(type) || strcmp(json_string_value(type), d->type)) {
    return serve_bad(f, at, d->other_type, at, json_is_string(type) ? json_string_value(type) : "?");
  }
  json_t *fn = d->fn ? json_object_get(t, d->fn) : t;
  json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
  if (!json_is_string(name)) return serve_bad(f, at, d->no_name, at);
  json_t *schema = json_object_get(fn, d->schema);
  if (d->schema_required && !json_is_object(schema)) return serve_bad(f, at, d->no_schema, at);
  if (!serve_tool_add(req, json_string_value(name), json_object_get(fn, "description"), schema, at, f)) return 0;
  if (d->field_first && f->status == 400 && f->param[0]) { /* "tools.0: ..." */
    char msg[sizeof f->message];
    snprintf(msg, sizeof msg, "%s: %s", f->param, f->message);
    snprintf(f->message, sizeof f->message, "%s", msg);
  }
  return f->status;
}

/* tool_choice as dialect d writes it. */
static int tool_choice_parse(json_t *tc, serve_request *r, const serve_tools_dialect *d, serve_fail *f) {
  const char *bad_word = d->bad_word ? d->bad_word : d->bad_object;
  if (d->strings && json_is_string(tc)) {
    const char *v = json_string_value(tc);
    if (!strcmp(v, "auto")) r->tool_choice = SERVE_TOOLS_AUTO;
    else if (!strcmp(v, "none")) r->tool_choice = SERVE_TOOLS_NONE;
    else if (!strcmp(v, "required")) r->tool_choice = SERVE_TOOLS_REQUIRED;
    else return serve_bad(f, "tool_choice", "%s", d->bad_string);
  } else if (json_is_object(tc)) {
    serve_tool_choice choice = SERVE_TOOLS_NAMED;
    if (d->words) {
      const char *type = json_string_value(json_object_get(tc, "type"));
      if (!type) return serve_bad(f, "tool_choice", "%s", d->bad_object);
      int k = 0;
      while (d->words[k] && strcmp(d->words[k], type)) k++;
      if (!d->words[k]) return serve_bad(f, "tool_choice", "%s", bad_word);
      choice = d->choices[k];
    }
    r->tool_choice = choice;
    if (choice == SERVE_TOOLS_NAMED) {
      json_t *in = d->name_in ? json_object_get(tc, d->name_in) : tc;
      const char *name = json_string_value(json_is_object(in) ? json_object_get(in, "name") : NULL);
      if (!name) return serve_bad(f, "tool_choice", "%s", d->no_choice_name ? d->no_choice_name : d->bad_object);
      r->tool_name = strdup(name);
      if (!r->tool_name) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
      if (!serve_tool_known(r, name) && !(d->no_tools_first && !r->tools))
        return serve_bad(f, "tool_choice", d->unknown_name, name);
    }
  } else {
    return serve_bad(f, "tool_choice", "%s", d->strings ? d->not_either : d->bad_object);
  }
  if ((r->tool_choice == SERVE_TOOLS_REQUIRED || r->tool_choice == SERVE_TOOLS_NAMED) && !r->tools)
    return serve_bad(f, "tool_choice", "%s", d->no_tools);
  return 0;
}

int serve_tools_parse(json_t *root, serve_request *req, const serve_tools_dialect *d, serve_fail *f) {
  json_t *tools = serve_json_field(root, "tools");
  if (d->no_functions && serve_json_field(root, "functions")) return serve_bad(f, "functions", "%s", d->no_functions_msg);
  if (tools) {
    if (!json_is_array(tools)) return serve_bad(f, "tools", "%s", d->not_array);
    if (d->max && json_array_size(tools) > d->max) return serve_bad(f, "tools", "%s", d->too_many);
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
      char at[64];
      snprintf(at, sizeof at, d->at, i);
      int rc = tool_parse(t, at, req, d, f);
      if (rc) return rc;
    }
  }
  json_t *tc = serve_json_field(root, "tool_choice");
  return tc ? tool_choice_parse(tc, req, d, f) : 0;
}

/* tools: [{"type": "function", "function": {"name", "description", "parameters", "strict"}}] */
const serve_tools_dialect serve_tools_openai = {
    .at = "tools[%zu]",
    .fn = "function",
    .schema = "parameters",
    .type = "function",
    .max = 512,
    .no_functions = true,
    .not_array = "'tools' must be an array",
    .too_many = "'tools' may hold at most 512 tools",
    .no_functions_msg = "'functions' is the deprecated form of 'tools': send 'tools' instead",
    .no_type = "'%s' must be an object with a type",
    .other_type = "'%s' is of type '%.40s': this server calls only function tools",
    .no_name = "'%s.function.name' is required",
    .strings = true,
    .name_in = "function",
    .no_tools_first = true,
    .bad_string = "'tool_choice' must be \"auto\", \"none\", \"required\" or a function",
    .bad_object = "'tool_choice' must name a function: {\"type\": \"function\", \"function\": {\"name\": ...}}",
    .not_either = "'tool_choice' must be a string or an object",
    .unknown_name = "'tool_choice' names '%.80s', which is not among 'tools'",
    .no_tools = "'tool_choice' asks for a tool call, but no 'tools' were given",
};

/* chat_template_kwargs (an object handed to the template), reasoning_effort
 * (also handed on; "none" turns thinking off: enable_thinking = false). */
static int parse_template_kwargs(json_t *root, serve_request *r, serve_fail *f) {
  json_t *kw = serve_json_field(root, "chat_template_kwargs");
  if (kw && !json_is_object(kw)) return serve_bad(f, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
  json_t *effort = serve_json_field(root, "reasoning_effort");
  if (effort) {
    static const char *ok[] = {"none", "minimal", "low", "medium", "high"};
    bool known = false;
    for (size_t i = 0; json_is_string(effort) && i < sizeof ok / sizeof ok[0]; i++)
      known = known || !strcmp(json_string_value(effort), ok[i]);
    if (!known)
      return serve_bad(f, "reasoning_effort", "'reasoning_effort' must be one of none, minimal, low, medium, high");
  }
  if (!kw && !effort) return 0;
  r->template_kwargs = kw ? json_deep_copy(kw) : json_object();
  if (effort) {
    if (!json_object_get(r->template_kwargs, "reasoning_effort"))
      json_object_set(r->template_kwargs, "reasoning_effort", effort);
    if (!strcmp(json_string_value(effort), "none") && !json_object_get(r->template_kwargs, "enable_thinking"))
      json_object_set_new(r->template_kwargs, "enable_thinking", json_false());
  }
  return 0;
}

/* response_format {"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema", "strict"}}
 * and the `grammar` extension (GBNF text). */
static int parse_format(json_t *root, serve_request *r, serve_fail *f) {
  json_t *rf = serve_json_field(root, "response_format");
  if (rf) {
    json_t *type = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
    if (!json_is_string(type)) return serve_bad(f, "response_format", "'response_format' must be an object with a type");
    const char *t = json_string_value(type);
    if (!strcmp(t, "json_object")) {
      r->json_schema = json_pack("{s:s}", "type", "object");
    } else if (!strcmp(t, "json_schema")) {
      json_t *js = json_object_get(rf, "json_schema");
      json_t *schema = json_is_object(js) ? json_object_get(js, "schema") : NULL;
      if (!json_is_object(js)) return serve_bad(f, "response_format", "'response_format.json_schema' is required");
      if (!schema || json_is_null(schema))
        return serve_bad(f, "response_format",
                         "'response_format.json_schema.schema' is required: a json_schema format without a schema "
                         "would constrain nothing (send {\"type\": \"json_object\"} for any JSON object)");
      if (!json_is_object(schema) && !json_is_boolean(schema))
        return serve_bad(f, "response_format", "'response_format.json_schema.schema' must be a JSON Schema object");
      r->json_schema = json_is_object(schema) ? json_incref(schema) : json_pack("{s:s}", "type", "object");
    } else if (strcmp(t, "text")) {
      return serve_bad(f, "response_format", "'response_format' of type '%.40s' is not supported (text, json_object, json_schema)",
                 t);
    }
  }
  if (serve_json_str(root, "grammar", &r->grammar, f)) return f->status;
  if (r->grammar && r->json_schema)
    return serve_bad(f, "grammar", "'grammar' and a JSON 'response_format' cannot both be given");
  return serve_output_grammar(r, f);
}

int serve_output_grammar(serve_request *r, serve_fail *f) {
  herr e = {0};
  hbuf g = {0};
  const char *field = r->grammar ? "grammar" : "response_format";
  if (r->json_schema) {
    char *text = json_dumps(r->json_schema, JSON_COMPACT);
    int rc = text ? json_schema_to_gbnf(text, strlen(text), &g, &e) : herr_set(&e, HEARTH_ENOMEM, "out of memory");
    free(text);
    if (rc) {
      hbuf_free(&g);
      return serve_bad(f, field, "response_format: %s", e.msg);
    }
  } else if (r->grammar) {
    hbuf_append(&g, r->grammar, strlen(r->grammar));
  } else {
    return 0;
  }
  grammar *gr = NULL;
  int rc = g.oom ? herr_set(&e, HEARTH_ENOMEM, "out of memory") : grammar_compile(hbuf_str(&g), g.len, &gr, &e);
  grammar_free(gr);
  if (rc) {
    hbuf_free(&g);
    return serve_bad(f, field, "%s", e.msg);
  }
  free(r->gbnf);
  r->gbnf = strdup(hbuf_str(&g));
  hbuf_free(&g);
  if (!r->gbnf) return serve_bad(f, field, "out of memory");
  r->sampling.grammar = r->gbnf;
  return 0;
}

/* Fields that would change the output and that this server cannot honour are
 * refused by name; fields that change nothing here are accepted. */
static int refuse_unsupported(json_t *root, serve_fail *f) {
  json_t *mod = serve_json_field(root, "modalities");
  if (mod) {
    if (!json_is_array(mod)) return serve_bad(f, "modalities", "'modalities' must be an array");
    size_t i;
    json_t *v;
    json_array_foreach(mod, i, v) if (!json_is_string(v) || strcmp(json_string_value(v), "text"))
      return serve_bad(f, "modalities", "'modalities' may only hold \"text\": this server's models write text only");
  }
  if (serve_json_field(root, "audio")) return serve_bad(f, "audio", "'audio' output is not supported by this server");
  if (serve_json_field(root, "web_search_options"))
    return serve_bad(f, "web_search_options", "'web_search_options' is not supported: this server does not search the web");
  json_t *ptc = serve_json_field(root, "parallel_tool_calls");
  if (ptc && !json_is_boolean(ptc)) return serve_bad(f, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
  if (serve_json_field(root, "function_call"))
    return serve_bad(f, "function_call", "'function_call' is the deprecated form of 'tool_choice': send 'tool_choice' instead");
  if (serve_json_field(root, "prediction"))
    return serve_bad(f, "prediction", "'prediction' (predicted outputs) is not supported: speculative decoding drafts "
                                      "from the prompt itself with \"spec_method\": \"ngram\"");
  if (serve_json_field(root, "verbosity"))
    return serve_bad(f, "verbosity", "'verbosity' is not supported: ask for the length you want in the messages, or "
                                     "bound it with 'max_completion_tokens'");
  json_t *store = serve_json_field(root, "store");
  if (store && !json_is_boolean(store)) return serve_bad(f, "store", "'store' must be a boolean");
  if (store && json_is_true(store))
    return serve_bad(f, "store", "'store': this server keeps no chat completions (the Responses API, /v1/responses, "
                                 "stores responses)");
  json_t *tier = serve_json_field(root, "service_tier");
  if (tier && (!json_is_string(tier) || (strcmp(json_string_value(tier), "auto") && strcmp(json_string_value(tier), "default"))))
    return serve_bad(f, "service_tier", "'service_tier' may be \"auto\" or \"default\": this server has one tier");
  json_t *md = serve_json_field(root, "metadata");
  if (md) { /* tags for a stored completion: checked as OpenAI checks them, kept nowhere */
    if (!json_is_object(md) || json_object_size(md) > 16)
      return serve_bad(f, "metadata", "'metadata' must be an object of at most 16 string values");
    const char *k;
    json_t *v;
    json_object_foreach(md, k, v) if (!json_is_string(v) || strlen(k) > 64 || json_string_length(v) > 512)
      return serve_bad(f, "metadata", "'metadata' values must be strings (keys up to 64, values up to 512 characters)");
  }
  const char *ids[] = {"prompt_cache_key", "safety_identifier"};
  for (int i = 0; i < 2; i++) {
    json_t *v = serve_json_field(root, ids[i]);
    if (v && !json_is_string(v)) return serve_bad(f, ids[i], "'%s' must be a string", ids[i]);
  }
  return 0;
}

/* add_generation_prompt and continue_final_message (as vLLM's): a chat that
 * ends with an open generation prompt (the default), one that ends after its
 * last message, or one whose final message the model continues. */
static int parse_prefill(json_t *root, serve_request *r, serve_fail *f) {
  bool add = true;
  if (serve_json_bool(root, "add_generation_prompt", &add, f) ||
      serve_json_bool(root, "continue_final_message", &r->continue_final_message, f))
    return f->status;
  r->no_generation_prompt = !add;
  if (r->continue_final_message) {
    if (json_is_true(json_object_get(root, "add_generation_prompt")))
      return serve_bad(f, "continue_final_message",
                       "'continue_final_message' and 'add_generation_prompt' cannot both be true: the model either "
                       "continues the final message or starts a new one");
    r->no_generation_prompt = true;
  }
  return 0;
}

static int parse_messages(json_t *root, serve_request *r, serve_fail *f) {
  json_t *msgs = serve_json_field(root, "messages");
  if (!msgs) return serve_bad(f, "messages", "'messages' is required");
  if (!json_is_array(msgs)) return serve_bad(f, "messages", "'messages' must be an array");
  size_t n = json_array_size(msgs);
  if (n == 0) return serve_bad(f, "messages", "'messages' must not be empty");
  if (n > 100000) return serve_bad(f, "messages", "'messages' has too many entries");
  r->messages = calloc(n, sizeof *r->messages);
  if (!r->messages) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  for (size_t i = 0; i < n; i++) {
    json_t *m = json_array_get(msgs, i);
    char param[96];
    snprintf(param, sizeof param, "messages[%zu]", i);
    if (!json_is_object(m)) return serve_bad(f, param, "'%s' must be an object", param);
    json_t *role = json_object_get(m, "role");
    snprintf(param, sizeof param, "messages[%zu].role", i);
    if (!json_is_string(role)) return serve_bad(f, param, "'%s' must be a string", param);
    const char *rs = json_string_value(role);
    static const char *roles[] = {"system", "developer", "user", "assistant", "tool"};
    bool known = false;
    for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++) known = known || strcmp(rs, roles[k]) == 0;
    if (!known) return serve_bad(f, param, "'%s' must be one of system, developer, user, assistant, tool", param);
    r->messages[i].role = strdup(rs);
    r->nmessages = (int)i + 1;
    if (!r->messages[i].role) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
    json_t *content = json_object_get(m, "content");
    if (!content && strcmp(rs, "assistant") != 0) {
      snprintf(param, sizeof param, "messages[%zu].content", i);
      return serve_bad(f, param, "'%s' is required", param);
    }
    if (flatten_content(r, content, (int)i, &r->messages[i].content, &r->messages[i].parts, f)) return f->status;
    if (message_extra(m, rs, (int)i, &r->messages[i], f)) return f->status;
  }
  return 0;
}

/* One prompt: a string, or an array of token ids; param names it in errors. */
static int parse_one_prompt(json_t *p, const char *param, char **text, int32_t **ids, size_t *n_ids, serve_fail *f) {
  static const char what[] = "must be a string or an array of token ids";
  if (json_is_array(p)) { /* token ids */
    size_t n = json_array_size(p);
    if (n == 0) return serve_bad(f, param, "'%s' has no tokens", param);
    *ids = malloc(sizeof **ids * n);
    *text = strdup("");
    if (!*ids || !*text) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
      json_t *v = json_array_get(p, i);
      if (!json_is_integer(v)) return serve_bad(f, param, "'%s' %s", param, what);
      if (json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return serve_bad(f, param, "'%s' token %zu is %lld, not a token id", param, i, (long long)json_integer_value(v));
      (*ids)[i] = (int32_t)json_integer_value(v);
    }
    *n_ids = n;
    return 0;
  }
  if (!json_is_string(p)) return serve_bad(f, param, "'%s' %s", param, what);
  *text = strdup(json_string_value(p));
  if (!*text) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  return 0;
}

/* "prompt": a string, an array of token ids (one prompt, as OpenAI reads it), or
 * an array of strings or of token-id arrays (a batch: one choice per prompt). */
static int parse_prompt(json_t *root, serve_request *r, serve_fail *f) {
  json_t *p = serve_json_field(root, "prompt");
  if (!p) return serve_bad(f, "prompt", "'prompt' is required");
  r->n_prompts = 1;
  json_t *first = json_is_array(p) ? json_array_get(p, 0) : NULL;
  if (!first || (!json_is_string(first) && !json_is_array(first)))
    return parse_one_prompt(p, "prompt", &r->prompt, &r->prompt_ids, &r->n_prompt_ids, f);
  size_t n = json_array_size(p);
  if (n > SERVE_MAX_CHOICES)
    return serve_bad(f, "prompt", "'prompt' holds %zu prompts; at most %d are taken in one request", n, SERVE_MAX_CHOICES);
  char param[32] = "prompt[0]";
  if (parse_one_prompt(first, param, &r->prompt, &r->prompt_ids, &r->n_prompt_ids, f)) return f->status;
  if (n > 1) {
    r->prompts = calloc(n - 1, sizeof *r->prompts);
    if (!r->prompts) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  }
  for (size_t i = 1; i < n; i++) {
    snprintf(param, sizeof param, "prompt[%zu]", i);
    serve_prompt *q = &r->prompts[i - 1];
    r->n_prompts = (int)i + 1;
    if (parse_one_prompt(json_array_get(p, i), param, &q->text, &q->ids, &q->n_ids, f)) return f->status;
  }
  return 0;
}

void serve_request_prompt(const serve_request *req, int i, serve_prompt *out) {
  if (i == 0) *out = (serve_prompt){.text = req->prompt, .ids = req->prompt_ids, .n_ids = req->n_prompt_ids};
  else *out = req->prompts[i - 1];
}

int serve_json_stop(json_t *root, const char *key, bool allow_string, serve_sampling *s, serve_fail *f) {
  json_t *v = serve_json_field(root, key);
  if (!v) return 0;
  json_t *one = allow_string && json_is_string(v) ? v : NULL;
  size_t n = one ? 1 : json_is_array(v) ? json_array_size(v) : 0;
  if (!one && !json_is_array(v))
    return serve_bad(f, key, "'%s' must be %s", key, allow_string ? "a string or an array of strings" : "an array of strings");
  if (n > MAX_STOP) return serve_bad(f, key, "'%s' may hold at most %d strings", key, MAX_STOP);
  if (n == 0) return 0;
  char **stop = calloc(n, sizeof *stop); /* owned by the request (s->stop, read-only for the engine) */
  if (!stop) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  s->stop = (const char *const *)stop;
  for (size_t i = 0; i < n; i++) {
    json_t *e = one ? one : json_array_get(v, i);
    if (!json_is_string(e)) return serve_bad(f, key, "'%s[%zu]' must be a string", key, i);
    if (json_string_length(e) == 0) return serve_bad(f, key, "'%s[%zu]' must not be empty", key, i);
    stop[i] = strdup(json_string_value(e));
    s->n_stop = (int)i + 1;
    if (!stop[i]) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  }
  return 0;
}

static int parse_logit_bias(json_t *root, serve_sampling *s, serve_fail *f) {
  json_t *v = serve_json_field(root, "logit_bias");
  if (!v) return 0;
  if (!json_is_object(v)) return serve_bad(f, "logit_bias", "'logit_bias' must be an object of token id → bias");
  size_t n = json_object_size(v);
  if (n == 0) return 0;
  if (n > 1000000) return serve_bad(f, "logit_bias", "'logit_bias' has too many entries");
  hearth_logit_bias *bias = calloc(n, sizeof *bias); /* owned by the request */
  if (!bias) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  s->logit_bias = bias;
  const char *key;
  json_t *val;
  json_object_foreach(v, key, val) {
    char *end;
    long long id = strtoll(key, &end, 10);
    if (!key[0] || *end || id < 0 || id > INT32_MAX)
      return serve_bad(f, "logit_bias", "'logit_bias' key '%.64s' is not a token id", key);
    if (!json_is_number(val)) return serve_bad(f, "logit_bias", "'logit_bias[%s]' must be a number", key);
    double b = json_number_value(val);
    if (!(b >= -100 && b <= 100)) return serve_bad(f, "logit_bias", "'logit_bias[%s]' must be between -100 and 100", key);
    bias[s->n_logit_bias].id = (int32_t)id;
    bias[s->n_logit_bias].bias = (float)b;
    s->n_logit_bias++;
  }
  return 0;
}

int serve_json_adapter(json_t *root, serve_sampling *s, serve_fail *f) {
  json_t *v = serve_json_field(root, "adapter");
  if (!v) return 0;
  if (!json_is_string(v)) return serve_bad(f, "adapter", "'adapter' must be a string: an adapter's name, \"a+b\" or \"none\"");
  const char *a = json_string_value(v);
  size_t n = strlen(a);
  if (n > 4 * 64) return serve_bad(f, "adapter", "'adapter' is too long");
  for (size_t i = 0; i < n; i++) {
    char c = a[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-' || c == '+'))
      return serve_bad(f, "adapter", "'adapter' holds '%c': adapter names are letters, digits, '.', '_' and '-', joined by '+'", c);
  }
  char *copy = strdup(a);
  if (!copy) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  free((char *)s->adapter);
  s->adapter = copy;
  return 0;
}

void serve_sampling_defaults(serve_sampling *s) {
  /* as hearth_gen_params_init (the server's protocol layer does not link the engine) */
  memset(s, 0, sizeof *s);
  s->max_tokens = -1;
  s->temperature = s->top_p = s->min_p = NAN;
  s->presence_penalty = s->frequency_penalty = s->repetition_penalty = NAN;
  s->top_k = -1;
  s->skip_special = true;
  s->spec_tokens = -1;
  s->typical_p = 1.0;
  s->xtc_threshold = 0.1;
  s->dry_base = 1.75;
  s->dry_allowed_length = 2;
  s->dry_penalty_last_n = 64;
  s->mirostat_tau = 5.0;
  s->mirostat_eta = 0.1;
}

void serve_sampling_free(serve_sampling *s) {
  for (int i = 0; i < s->n_stop; i++) free((char *)s->stop[i]);
  free((void *)s->stop);
  free((void *)s->logit_bias);
  free((char *)s->adapter);
  for (int i = 0; i < s->n_dry_sequence_breakers; i++) free((char *)s->dry_sequence_breakers[i]);
  free((void *)s->dry_sequence_breakers);
  s->stop = NULL, s->n_stop = 0;
  s->logit_bias = NULL, s->n_logit_bias = 0;
  s->adapter = NULL;
  s->dry_sequence_breakers = NULL, s->n_dry_sequence_breakers = 0;
}

/* dry_sequence_breakers: an array of strings, or the same as JSON text (the
 * form text-generation-webui and SillyTavern send). */
static int parse_dry_breakers(json_t *obj, serve_sampling *s, serve_fail *f) {
  static const char key[] = "dry_sequence_breakers";
  json_t *v = serve_json_field(obj, key);
  if (!v) return 0;
  json_t *parsed = NULL;
  if (json_is_string(v)) {
    parsed = json_loads(json_string_value(v), 0, NULL);
    if (!json_is_array(parsed)) {
      json_decref(parsed);
      return serve_bad(f, key, "'%s' must be an array of strings (or that array as JSON text)", key);
    }
    v = parsed;
  }
  int rc = 0;
  size_t n = json_is_array(v) ? json_array_size(v) : 0;
  if (!json_is_array(v)) rc = serve_bad(f, key, "'%s' must be an array of strings", key);
  else if (n == 0) rc = serve_bad(f, key, "'%s' must hold at least one string", key);
  else if (n > SERVE_MAX_DRY_BREAKERS) rc = serve_bad(f, key, "'%s' may hold at most %d strings", key, SERVE_MAX_DRY_BREAKERS);
  char **out = rc ? NULL : calloc(n, sizeof *out);
  if (!rc && !out) rc = serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  if (!rc) {
    for (int i = 0; i < s->n_dry_sequence_breakers; i++) free((char *)s->dry_sequence_breakers[i]);
    free((void *)s->dry_sequence_breakers);
    s->dry_sequence_breakers = (const char *const *)out;
    s->n_dry_sequence_breakers = 0;
  }
  for (size_t i = 0; !rc && i < n; i++) {
    json_t *e = json_array_get(v, i);
    if (!json_is_string(e)) rc = serve_bad(f, key, "'%s[%zu]' must be a string", key, i);
    else if (json_string_length(e) == 0) rc = serve_bad(f, key, "'%s[%zu]' must not be empty", key, i);
    else if (!(out[i] = strdup(json_string_value(e)))) rc = serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
    else s->n_dry_sequence_breakers = (int)i + 1;
  }
  json_decref(parsed);
  return rc;
}

int serve_json_samplers(json_t *obj, serve_sampling *s, serve_fail *f) {
  int64_t miro = 0;
  if (serve_json_num(obj, "typical_p", 0, 1, &s->typical_p, f) ||
      serve_json_num(obj, "xtc_probability", 0, 1, &s->xtc_probability, f) ||
      serve_json_num(obj, "xtc_threshold", 0, 1, &s->xtc_threshold, f) ||
      serve_json_num(obj, "dry_multiplier", 0, 1e6, &s->dry_multiplier, f) ||
      serve_json_num(obj, "dry_base", 1, 1e6, &s->dry_base, f) ||
      serve_json_int(obj, "dry_allowed_length", 0, INT32_MAX, &s->dry_allowed_length, f) ||
      serve_json_int(obj, "dry_penalty_last_n", -1, INT32_MAX, &s->dry_penalty_last_n, f) ||
      parse_dry_breakers(obj, s, f) || serve_json_int(obj, "mirostat", 0, 2, &miro, f) ||
      serve_json_num(obj, "mirostat_tau", 0, 1e6, &s->mirostat_tau, f) ||
      serve_json_num(obj, "mirostat_eta", 0, 1e6, &s->mirostat_eta, f))
    return f->status;
  if (miro == 1)
    return serve_bad(f, "mirostat", "'mirostat' 1 (the first Mirostat) is not supported: use 2 (Mirostat 2.0)");
  s->mirostat = (int)miro;
  /* llama.cpp's other sampler fields: accepted at the values that leave sampling as it is (what
   * clients send by default), refused by name at any other */
  static const struct {
    const char *key;
    double lo, hi; /* the neutral range */
    const char *why;
  } neutral[] = {
      {"top_n_sigma", -INFINITY, 0, "top-n-sigma is not supported"},
      {"dynatemp_range", -INFINITY, 0, "dynamic temperature is not supported"},
      {"repeat_penalty", 1, 1, "llama.cpp's windowed repeat penalty is not supported: use 'repetition_penalty' (over the whole prompt and output)"},
      {"n_probs", -INFINITY, 0, "use 'logprobs' (and 'top_logprobs')"},
      {"min_keep", -INFINITY, 1, "a floor on the tokens each filter keeps is not supported"},
      {"adaptive_target", -INFINITY, -1e-300, "the adaptive-p sampler is not supported"},
  };
  for (size_t i = 0; i < sizeof neutral / sizeof neutral[0]; i++) {
    json_t *v = serve_json_field(obj, neutral[i].key);
    if (!v) continue;
    if (!json_is_number(v)) return serve_bad(f, neutral[i].key, "'%s' must be a number", neutral[i].key);
    double d = json_number_value(v);
    if (!(d >= neutral[i].lo && d <= neutral[i].hi)) return serve_bad(f, neutral[i].key, "'%s': %s", neutral[i].key, neutral[i].why);
  }
  if (serve_json_field(obj, "samplers"))
    return serve_bad(f, "samplers", "'samplers' (a custom sampler order) is not supported: the order is fixed (see the README)");
  return 0;
}

int serve_json_spec(json_t *obj, serve_sampling *s, serve_fail *f) {
  int64_t n = -1;
  if (serve_json_int(obj, "spec_tokens", 0, 16, &n, f)) return f->status;
  json_t *sp = serve_json_field(obj, "speculative");
  if (sp) {
    if (!json_is_object(sp)) return serve_bad(f, "speculative", "'speculative' must be an object like {\"tokens\": 4}");
    if (serve_json_int(sp, "tokens", 0, 16, &n, f)) {
      snprintf(f->param, sizeof f->param, "speculative.tokens");
      return f->status;
    }
  }
  if (n >= 0) s->spec_tokens = (int)n;
  /* the draft source: "spec_method", or "speculative": {"method": ...} */
  static const char *const methods[] = {"ngram", "draft", "mtp"};
  const char *names[] = {"spec_method", "speculative.method"};
  json_t *vals[] = {serve_json_field(obj, "spec_method"), sp ? serve_json_field(sp, "method") : NULL};
  for (int k = 0; k < 2; k++) {
    if (!vals[k]) continue;
    const char *v = json_is_string(vals[k]) ? json_string_value(vals[k]) : NULL;
    int i = 0;
    while (v && i < 3 && strcmp(v, methods[i])) i++;
    if (!v || i == 3) {
      serve_bad(f, names[k], "'%s' must be \"ngram\", \"draft\" or \"mtp\"", names[k]);
      return f->status;
    }
    s->spec_method = methods[i];
  }
  return 0;
}

static int parse_sampling(json_t *root, serve_kind kind, serve_sampling *s, serve_fail *f) {
  serve_sampling_defaults(s);
  /* max_completion_tokens is the newer name; it wins when both are given. */
  const int64_t big = (int64_t)1 << 40;
  if (serve_json_int(root, "max_tokens", 1, big, &s->max_tokens, f)) return f->status;
  if (kind == SERVE_CHAT && serve_json_int(root, "max_completion_tokens", 1, big, &s->max_tokens, f)) return f->status;
  if (serve_json_num(root, "temperature", 0, 2, &s->temperature, f)) return f->status;
  if (serve_json_num(root, "top_p", 0, 1, &s->top_p, f)) return f->status;
  if (serve_json_num(root, "min_p", 0, 1, &s->min_p, f)) return f->status;
  if (serve_json_int(root, "top_k", -1, INT32_MAX, &s->top_k, f)) return f->status;
  if (serve_json_num(root, "presence_penalty", -2, 2, &s->presence_penalty, f)) return f->status;
  if (serve_json_num(root, "frequency_penalty", -2, 2, &s->frequency_penalty, f)) return f->status;
  if (serve_json_num(root, "repetition_penalty", 1e-6, 100, &s->repetition_penalty, f)) return f->status;
  int64_t seed = 0;
  if (serve_json_field(root, "seed")) {
    if (serve_json_int(root, "seed", INT64_MIN, INT64_MAX, &seed, f)) return f->status;
    s->has_seed = true;
    s->seed = (uint64_t)seed;
  }
  if (serve_json_stop(root, "stop", true, s, f) || parse_logit_bias(root, s, f) || serve_json_spec(root, s, f))
    return f->status;
  /* (extension, as vLLM: keep going past end-of-sequence tokens until max_tokens) */
  if (serve_json_bool(root, "ignore_eos", &s->ignore_eos, f)) return f->status;
  if (serve_json_adapter(root, s, f) || serve_json_samplers(root, s, f)) return f->status;
  if (kind == SERVE_CHAT) {
    if (serve_json_bool(root, "logprobs", &s->logprobs, f)) return f->status;
    int64_t top = 0;
    if (serve_json_int(root, "top_logprobs", 0, 20, &top, f)) return f->status;
    if (serve_json_field(root, "top_logprobs") && !s->logprobs)
      return serve_bad(f, "top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
    s->top_logprobs = (int)top;
  } else {
    /* Completions: logprobs is the number of alternatives (0..5); 0 still
     * reports the sampled token's own log-probability. */
    int64_t lp = -1;
    if (serve_json_int(root, "logprobs", 0, 5, &lp, f)) return f->status;
    s->logprobs = lp >= 0;
    s->top_logprobs = lp > 0 ? (int)lp : 0;
  }
  return 0;
}

int serve_request_parse(const char *body, size_t len, serve_kind kind, serve_request *req, serve_fail *f) {
  memset(req, 0, sizeof *req);
  req->kind = kind;
  req->n = 1;
  json_error_t je;
  json_t *root = json_loadb(body, len, 0, &je);
  if (!root) {
    serve_bad(f, "", "the request body is not valid JSON: %s at line %d column %d", je.text, je.line, je.column);
    return f->status;
  }
  int rc = 0;
  if (!json_is_object(root)) {
    rc = serve_bad(f, "", "the request body must be a JSON object");
    goto out;
  }
  json_t *model = serve_json_field(root, "model");
  if (model && !json_is_string(model)) {
    rc = serve_bad(f, "model", "'model' must be a string");
    goto out;
  }
  int64_t n = 1;
  if ((rc = serve_json_str(root, "model", &req->model, f)) || (rc = serve_json_str(root, "user", &req->user, f)) ||
      (rc = serve_json_int(root, "n", 1, INT32_MAX, &n, f)) || (rc = serve_json_bool(root, "stream", &req->stream, f)) ||
      (rc = serve_json_bool(root, "return_token_ids", &req->return_token_ids, f)))
    goto out;
  /* vLLM's other token-level fields: not made here */
  if (serve_json_field(root, "prompt_logprobs")) {
    rc = serve_bad(f, "prompt_logprobs", "'prompt_logprobs' is not supported: on /v1/completions, 'echo' with 'logprobs' "
                                         "scores the prompt's tokens");
    goto out;
  }
  json_t *rtt = serve_json_field(root, "return_tokens_as_token_ids");
  if (rtt && !json_is_false(rtt)) {
    rc = serve_bad(f, "return_tokens_as_token_ids", "'return_tokens_as_token_ids' is not supported: ask for "
                                                    "'return_token_ids'");
    goto out;
  }
  req->n = (int)n;
  if (n > SERVE_MAX_CHOICES) {
    rc = serve_bad(f, "n", "'n' is %lld; at most %d choices are made in one request", (long long)n, SERVE_MAX_CHOICES);
    goto out;
  }
  /* best_of (completions): best_of continuations per prompt, the n of highest
   * cumulative logprob returned; equal to n, every continuation is returned */
  int64_t best_of = n;
  if ((rc = serve_json_int(root, "best_of", 1, INT32_MAX, &best_of, f))) goto out;
  if (best_of != n && kind != SERVE_COMPLETION) {
    rc = serve_bad(f, "best_of", "'best_of' is a /v1/completions parameter; a chat completion returns every "
                                 "continuation it makes (ask for them with 'n' and rank them by their logprobs)");
    goto out;
  }
  if (best_of < n) {
    rc = serve_bad(f, "best_of", "'best_of' is %lld but 'n' is %lld: best_of must be at least n", (long long)best_of,
                   (long long)n);
    goto out;
  }
  if (best_of > n && req->stream) {
    rc = serve_bad(f, "best_of", "'best_of' above 'n' cannot be streamed: the continuations are ranked once all are made");
    goto out;
  }
  if (best_of > SERVE_MAX_CHOICES) {
    rc = serve_bad(f, "best_of", "'best_of' is %lld; at most %d continuations are made in one request", (long long)best_of,
                   SERVE_MAX_CHOICES);
    goto out;
  }
  req->best_of = (int)best_of;
  json_t *so = serve_json_field(root, "stream_options");
  if (so) {
    if (!json_is_object(so)) {
      rc = serve_bad(f, "stream_options", "'stream_options' must be an object");
      goto out;
    }
    if (!req->stream) {
      rc = serve_bad(f, "stream_options", "'stream_options' is only allowed when 'stream' is true");
      goto out;
    }
    json_t *iu = serve_json_field(so, "include_usage");
    if (iu && !json_is_boolean(iu)) {
      rc = serve_bad(f, "stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
      goto out;
    }
    req->include_usage = iu && json_is_true(iu);
  }
  if (kind == SERVE_CHAT) {
    rc = parse_messages(root, req, f);
    if (!rc) rc = parse_prefill(root, req, f);
    if (!rc) rc = serve_tools_parse(root, req, &serve_tools_openai, f);
    if (!rc) rc = parse_template_kwargs(root, req, f);
    if (!rc) rc = refuse_unsupported(root, f);
    if (!rc) req->one_tool_call = json_is_false(json_object_get(root, "parallel_tool_calls"));
    if (!rc) rc = parse_format(root, req, f);
  } else {
    rc = parse_prompt(root, req, f);
    if (!rc) rc = serve_json_bool(root, "echo", &req->echo, f);
    if (!rc && serve_json_field(root, "suffix")) {
      rc = serve_json_str(root, "suffix", &req->suffix, f);
      req->fim = !rc;
      if (!rc && req->echo) rc = serve_bad(f, "suffix", "'suffix' and 'echo' cannot both be given");
    }
    if (!rc && (int64_t)req->n * req->n_prompts > SERVE_MAX_CHOICES)
      rc = serve_bad(f, "n", "%d prompts times 'n' %d is %lld choices; at most %d are made in one request",
                     req->n_prompts, req->n, (long long)req->n * req->n_prompts, SERVE_MAX_CHOICES);
    if (!rc && (int64_t)req->best_of * req->n_prompts > SERVE_MAX_CHOICES)
      rc = serve_bad(f, "best_of", "%d prompts times 'best_of' %d is %lld continuations; at most %d are made in one request",
                     req->n_prompts, req->best_of, (long long)req->best_of * req->n_prompts, SERVE_MAX_CHOICES);
    if (!rc) rc = parse_format(root, req, f);
  }
  if (!rc) rc = parse_sampling(root, kind, &req->sampling, f);
  if (!rc) req->sampling.grammar = req->gbnf;
out:
  json_decref(root);
  if (rc) serve_request_free(req);
  return rc;
}

void serve_request_free(serve_request *req) {
  if (!req) return;
  for (int i = 0; i < req->nmessages; i++) {
    free(req->messages[i].role);
    free(req->messages[i].content);
    json_decref(req->messages[i].extra);
    json_decref(req->messages[i].parts);
  }
  free(req->messages);
  for (int i = 0; i < req->n_media; i++) free((char *)req->media[i].url), free((char *)req->media[i].name);
  free(req->media);
  serve_sampling_free(&req->sampling);
  free(req->model);
  free(req->prompt);
  free(req->prompt_ids);
  for (int i = 0; req->prompts && i < req->n_prompts - 1; i++) free(req->prompts[i].text), free(req->prompts[i].ids);
  free(req->prompts);
  free(req->user);
  free(req->suffix);
  free(req->fim_prefix);
  for (int i = 0; i < req->n_fim_extra; i++) free((char *)req->fim_extra[i].filename), free((char *)req->fim_extra[i].text);
  free(req->fim_extra);
  json_decref(req->tools);
  free(req->tool_name);
  json_decref(req->template_kwargs);
  json_decref(req->json_schema);
  free(req->grammar);
  free(req->gbnf);
  serve_kind kind = req->kind;
  memset(req, 0, sizeof *req);
  req->kind = kind;
}
