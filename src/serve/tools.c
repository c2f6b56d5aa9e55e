/* tools.c — the server's own tools (tools.h): added to a chat request's
 * tools in its protocol's dialect, recognised in a reply's calls, run, and
 * their exchange appended to the conversation in the request's and in
 * OpenAI's message shapes. The server's loop over rounds is server.c's; how
 * each protocol shows the exchange, its unit's. */
#include "serve/tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "serve/reply.h"

/* The name of a tool t of the body as dialect d writes it. */
static const char *tool_name_in(const serve_tools_dialect *d, const json_t *t) {
  const json_t *holder = d->fn ? json_object_get(t, d->fn) : t;
  return json_string_value(json_object_get(holder, "name"));
}

int serve_tools_inject(const serve_tool *tools, int n, const serve_tools_dialect *d, const char *body, size_t len,
                       char **out, unsigned *added, herr *err) {
  *out = NULL;
  *added = 0;
  if (n <= 0) return 0;
  json_t *root = json_loadb(body, len, 0, NULL);
  if (!json_is_object(root)) { /* the request's parser says what is wrong with it */
    json_decref(root);
    return 0;
  }
  json_t *nj = json_object_get(root, "n");
  if (json_is_integer(nj) && json_integer_value(nj) > 1) {
    json_decref(root); /* several choices: answered without them */
    return 0;
  }
  json_t *list = json_object_get(root, "tools");
  if (list && !json_is_null(list) && !json_is_array(list)) {
    json_decref(root);
    return 0;
  }
  for (int i = 0; i < n && i < SERVE_MAX_TOOLS; i++) {
    bool defined = false;
    size_t k;
    json_t *t;
    json_array_foreach(list, k, t) {
      const char *nm = tool_name_in(d, t);
      if (nm && !strcmp(nm, tools[i].name)) defined = true;
    }
    if (defined) continue; /* the client's own tool of that name: the client runs it */
    json_t *params = tools[i].parameters ? json_loads(tools[i].parameters, 0, NULL) : NULL;
    json_t *fn = json_pack("{s:s}", "name", tools[i].name);
    if (tools[i].description) json_object_set_new(fn, "description", json_string(tools[i].description));
    json_object_set_new(fn, d->schema, params ? params : json_pack("{s:s}", "type", "object"));
    json_t *tool = fn;
    if (d->fn) tool = json_pack("{s:o}", d->fn, fn);
    json_object_set_new(tool, "type", json_string(d->type));
    if (!list || json_is_null(list)) {
      list = json_array();
      json_object_set_new(root, "tools", list);
    }
    json_array_append_new(list, tool);
    *added |= 1u << i;
  }
  if (*added) {
    *out = json_dumps(root, JSON_COMPACT);
    if (!*out) {
      json_decref(root);
      return herr_set(err, HEARTH_ENOMEM, "out of memory");
    }
  }
  json_decref(root);
  return 0;
}

/* The index of the added tool called name; -1 when none. */
static int tool_index(const serve_tool *tools, int n, unsigned added, const char *name) {
  for (int i = 0; name && i < n && i < SERVE_MAX_TOOLS; i++)
    if (((added >> i) & 1u) && !strcmp(tools[i].name, name)) return i;
  return -1;
}

static const char *call_name(const json_t *c) {
  return json_string_value(json_object_get(json_object_get(c, "function"), "name"));
}

bool serve_tools_all_ours(const serve_tool *tools, int n, unsigned added, const json_t *calls) {
  if (!added || json_array_size(calls) == 0) return false;
  size_t k;
  json_t *c;
  json_array_foreach(calls, k, c) if (tool_index(tools, n, added, call_name(c)) < 0) return false;
  return true;
}

/* Appends a message to req (role and content copied, extra taken). */
static int message_add(serve_request *req, const char *role, const char *content, json_t *extra) {
  serve_message *m = realloc(req->messages, sizeof *m * (size_t)(req->nmessages + 1));
  if (!m) {
    json_decref(extra);
    return HEARTH_ENOMEM;
  }
  req->messages = m;
  serve_message *x = &m[req->nmessages];
  memset(x, 0, sizeof *x);
  x->role = strdup(role);
  x->content = strdup(content ? content : "");
  x->extra = extra;
  req->nmessages++;
  return x->role && x->content ? 0 : HEARTH_ENOMEM;
}

int serve_tools_run(const serve_tool *tools, int n, serve_request *req, const char *content, const json_t *calls,
                    json_t *exchange, herr *err) {
  /* the assistant's turn: in the request (arguments as objects, as templates want them) and as OpenAI shows it */
  json_t *norm = json_array(), *shown = json_array();
  size_t k;
  json_t *c;
  json_array_foreach(calls, k, c) {
    json_t *fn = json_object_get(c, "function");
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    json_t *obj = args ? json_loads(args, JSON_DECODE_ANY, NULL) : NULL;
    json_t *nfn = json_pack("{s:s}", "name", call_name(c) ? call_name(c) : "");
    json_object_set_new(nfn, "arguments", obj ? obj : json_object());
    json_t *nc = json_pack("{s:s, s:o}", "type", "function", "function", nfn);
    if (json_object_get(c, "id")) json_object_set(nc, "id", json_object_get(c, "id"));
    json_array_append_new(norm, nc);
    json_array_append(shown, c);
  }
  json_t *extra = json_object();
  json_object_set_new(extra, "tool_calls", norm);
  int rc = message_add(req, "assistant", content, extra);
  json_t *am = json_pack("{s:s, s:o, s:o}", "role", "assistant", "content",
                         content && content[0] ? serve_json_text(content, strlen(content)) : json_null(), "tool_calls", shown);
  if (am) json_array_append_new(exchange, am);
  json_array_foreach(calls, k, c) {
    if (rc) break;
    const char *name = call_name(c);
    int t = tool_index(tools, n, ~0u, name);
    const char *args = json_string_value(json_object_get(json_object_get(c, "function"), "arguments"));
    char *result = NULL;
    herr terr = {0};
    if (t < 0 || tools[t].run(tools[t].ctx, args ? args : "{}", &result, &terr)) {
      free(result);
      hbuf b = {0};
      hbuf_printf(&b, "error: %s", t < 0 ? "no such tool" : terr.msg);
      result = hbuf_take(&b);
      if (!result) {
        rc = HEARTH_ENOMEM;
        break;
      }
    }
    json_t *id = json_object_get(c, "id");
    json_t *tx = json_pack("{s:s}", "name", name ? name : "");
    if (json_is_string(id)) json_object_set(tx, "tool_call_id", id);
    rc = message_add(req, "tool", result, tx);
    json_t *tm = json_pack("{s:s, s:s, s:o}", "role", "tool", "name", name ? name : "", "content",
                           serve_json_text(result, strlen(result)));
    if (tm && json_is_string(id)) json_object_set(tm, "tool_call_id", id);
    if (tm) json_array_append_new(exchange, tm);
    free(result);
  }
  return rc ? herr_set(err, HEARTH_ENOMEM, "out of memory") : 0;
}
