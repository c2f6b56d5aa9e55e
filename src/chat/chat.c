/* chat.c — finds a model's chat template and special-token strings on disk
 * and renders messages through the Jinja2 engine with the context Hugging
 * Face's apply_chat_template builds. Knows nothing of tokenization or of the
 * template language itself. */
#include "chat/chat.h"

#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"

void chat_template_free(chat_template *t) {
  if (!t) return;
  free(t->source);
  free(t->bos);
  free(t->eos);
  free(t->origin);
  memset(t, 0, sizeof *t);
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* A special token: a string, or an AddedToken object with "content". */
static char *token_string(const json_t *cfg, const char *key) {
  const json_t *v = cfg ? json_object_get(cfg, key) : NULL;
  if (json_is_object(v)) v = json_object_get(v, "content");
  return strdup(json_is_string(v) ? json_string_value(v) : "");
}

/* tokenizer_config.json's chat_template: a string or [{name, template}] ("default" wins, else the first). */
static int template_from_config(const json_t *cfg, const char *path, char **out, herr *err) {
  const json_t *ct = json_object_get(cfg, "chat_template");
  if (json_is_string(ct)) {
    *out = strdup(json_string_value(ct));
    return *out ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  if (json_is_array(ct)) {
    const json_t *pick = NULL;
    size_t i;
    const json_t *item;
    json_array_foreach(ct, i, item) {
      const json_t *name = json_object_get(item, "name"), *tpl = json_object_get(item, "template");
      if (!json_is_string(tpl)) continue;
      if (!pick) pick = tpl;
      if (json_is_string(name) && strcmp(json_string_value(name), "default") == 0) {
        pick = tpl;
        break;
      }
    }
    if (pick) {
      *out = strdup(json_string_value(pick));
      return *out ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
    }
    return herr_set(err, HEARTH_EFORMAT, "%s: field 'chat_template' is a list without a usable template", path);
  }
  if (ct && !json_is_null(ct)) return herr_set(err, HEARTH_EFORMAT, "%s: field 'chat_template' must be a string or a list", path);
  return herr_set(err, HEARTH_ENOTFOUND, "%s: no chat_template", path);
}

int chat_template_load(const char *path, chat_template *out, herr *err) {
  memset(out, 0, sizeof *out);
  char *dir = NULL, *cfg_path = NULL, *jinja_path = NULL;
  int rc = 0;
  if (hfile_is_dir(path)) {
    dir = strdup(path);
  } else if (ends_with(path, ".jinja")) {
    dir = hpath_dir(path);
    jinja_path = strdup(path);
  } else {
    dir = hpath_dir(path);
    cfg_path = strdup(path);
  }
  if (!dir) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  if (!cfg_path) cfg_path = hpath_join(dir, "tokenizer_config.json");
  json_t *cfg = NULL;
  if (cfg_path && hfile_exists(cfg_path)) {
    /* integers as reals: configs hold values like model_max_length = 1e30 that overflow 64 bits */
    json_error_t je;
    cfg = json_load_file(cfg_path, JSON_DECODE_INT_AS_REAL, &je);
    if (!cfg) {
      rc = herr_set(err, HEARTH_EFORMAT, "%s:%d:%d: %s", cfg_path, je.line, je.column, je.text);
      goto done;
    }
  } else if (!hfile_is_dir(path) && !jinja_path) {
    rc = herr_set(err, HEARTH_ENOTFOUND, "%s: no such file", path);
    goto done;
  }
  if (!jinja_path && hfile_is_dir(path)) {
    char *cand = hpath_join(dir, "chat_template.jinja");
    if (cand && hfile_exists(cand)) jinja_path = cand;
    else free(cand);
  }
  if (jinja_path) {
    size_t len;
    if ((rc = hfile_read(jinja_path, &out->source, &len, err))) goto done;
    out->origin = strdup(jinja_path);
  } else if (cfg && json_object_get(cfg, "chat_template")) {
    if ((rc = template_from_config(cfg, cfg_path, &out->source, err))) goto done;
    out->origin = strdup(cfg_path);
  } else {
    char *cand = hpath_join(dir, "chat_template.json");
    json_t *cj = NULL;
    if (cand && hfile_exists(cand)) {
      herr e2 = {0};
      cj = hjson_load_file(cand, &e2);
    }
    if (cj && json_object_get(cj, "chat_template")) {
      rc = template_from_config(cj, cand, &out->source, err);
      out->origin = strdup(cand);
    } else {
      rc = herr_set(err, HEARTH_ENOTFOUND, "%s: no chat template (looked for chat_template.jinja, tokenizer_config.json's chat_template, chat_template.json)", path);
    }
    json_decref(cj);
    free(cand);
    if (rc) goto done;
  }
  out->bos = token_string(cfg, "bos_token");
  out->eos = token_string(cfg, "eos_token");
  if (!out->bos || !out->eos || !out->origin) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
done:
  json_decref(cfg);
  free(dir);
  free(cfg_path);
  free(jinja_path);
  if (rc) chat_template_free(out);
  return rc;
}

int chat_template_replace(chat_template *t, const char *file, herr *err) {
  char *src = NULL;
  size_t len = 0;
  herr e = {0};
  if (hfile_is_dir(file)) return herr_set(err, HEARTH_EINVAL, "chat template file %s: a folder, not a file", file);
  if (hfile_read(file, &src, &len, &e)) return herr_set(err, e.code, "chat template file %s", e.msg); /* e names the file */
  if (!len || strlen(src) != len) {
    free(src);
    return herr_set(err, HEARTH_EFORMAT, "chat template file %s: %s", file, len ? "holds a NUL byte" : "empty");
  }
  char *origin = strdup(file), *bos = t->bos ? NULL : strdup(""), *eos = t->eos ? NULL : strdup("");
  if (!origin || (!t->bos && !bos) || (!t->eos && !eos)) {
    free(src), free(origin), free(bos), free(eos);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  free(t->source);
  free(t->origin);
  t->source = src;
  t->origin = origin;
  if (bos) t->bos = bos;
  if (eos) t->eos = eos;
  return 0;
}

json_t *chat_context(const json_t *messages, const json_t *tools, bool add_generation_prompt,
                     const json_t *extra_kwargs, const char *bos, const char *eos) {
  json_t *ctx = json_object();
  if (!ctx) return NULL;
  int bad = 0;
  bad |= json_object_set_new(ctx, "messages", messages ? json_deep_copy(messages) : json_array());
  bad |= json_object_set_new(ctx, "tools", tools ? json_deep_copy(tools) : json_null());
  bad |= json_object_set_new(ctx, "documents", json_null());
  bad |= json_object_set_new(ctx, "add_generation_prompt", json_boolean(add_generation_prompt));
  bad |= json_object_set_new(ctx, "bos_token", json_string(bos ? bos : ""));
  bad |= json_object_set_new(ctx, "eos_token", json_string(eos ? eos : ""));
  if (json_is_object(extra_kwargs)) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)extra_kwargs, k, v) bad |= json_object_set(ctx, k, v);
  }
  if (bad) {
    json_decref(ctx);
    return NULL;
  }
  return ctx;
}

int chat_render_with(const char *template_src, const json_t *messages, const json_t *tools,
                     bool add_generation_prompt, const json_t *extra_kwargs, const char *bos, const char *eos,
                     const jinja_limits *lim, hbuf *out, herr *err) {
  jinja_template *t = NULL;
  int rc = jinja_parse(template_src, strlen(template_src), "chat_template", &t, err);
  if (rc) return rc;
  json_t *ctx = chat_context(messages, tools, add_generation_prompt, extra_kwargs, bos, eos);
  if (!ctx) {
    jinja_free(t);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  rc = jinja_render(t, ctx, lim, out, err);
  json_decref(ctx);
  jinja_free(t);
  return rc;
}

int chat_render(const char *template_src, const json_t *messages, const json_t *tools, bool add_generation_prompt,
                const json_t *extra_kwargs, const char *bos, const char *eos, hbuf *out, herr *err) {
  return chat_render_with(template_src, messages, tools, add_generation_prompt, extra_kwargs, bos, eos, NULL, out, err);
}

/* The calls as JSON text, {"tool_calls":[{"name":...,"arguments":{...}}]} (NULL on out of memory). */
static char *calls_text(const json_t *calls) {
  json_t *list = json_array();
  size_t k;
  json_t *call;
  json_array_foreach(calls, k, call) {
    json_t *fn = json_object_get(call, "function");
    json_t *args = json_object_get(fn, "arguments");
    json_t *o = json_object();
    json_object_set(o, "name", json_is_string(json_object_get(fn, "name")) ? json_object_get(fn, "name") : json_string(""));
    if (json_is_string(args)) {
      json_t *v = json_loads(json_string_value(args), JSON_DECODE_ANY, NULL);
      json_object_set_new(o, "arguments", v ? v : json_incref(args));
    } else {
      json_object_set_new(o, "arguments", args ? json_incref(args) : json_object());
    }
    json_array_append_new(list, o);
  }
  json_t *root = json_pack("{s:o}", "tool_calls", list);
  char *s = root ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(root);
  return s;
}

void chat_apply_call_shape(json_t *messages, chat_call_shape shape) {
  size_t i;
  json_t *m;
  json_array_foreach(messages, i, m) {
    json_t *calls = json_object_get(m, "tool_calls");
    if (!json_is_array(calls) || json_array_size(calls) == 0) continue;
    json_t *c = json_object_get(m, "content");
    bool empty = !c || json_is_null(c) || (json_is_string(c) && json_string_length(c) == 0);
    if (shape.calls_as_text) {
      char *t = calls_text(calls);
      if (!t) continue;
      if (empty || !json_is_string(c)) {
        if (empty) json_object_set_new(m, "content", json_string(t));
        else if (json_is_array(c)) json_array_append_new(c, json_pack("{s:s, s:s}", "type", "text", "text", t));
      } else {
        hbuf b = {0};
        hbuf_append(&b, json_string_value(c), json_string_length(c));
        hbuf_puts(&b, "\n");
        hbuf_puts(&b, t);
        if (!b.oom && b.data) json_object_set_new(m, "content", json_stringn(b.data, b.len));
        hbuf_free(&b);
      }
      free(t);
      continue;
    }
    if (empty) json_object_set_new(m, "content", shape.empty_content ? json_string("") : json_null());
    size_t k;
    json_t *call;
    json_array_foreach(calls, k, call) {
      json_t *fn = json_object_get(call, "function");
      json_t *args = json_object_get(fn, "arguments");
      if (shape.string_args && args && !json_is_string(args)) {
        char *s = json_dumps(args, JSON_ENCODE_ANY); /* ", " and ": ", as json.dumps */
        if (s) json_object_set_new(fn, "arguments", json_string(s));
        free(s);
      } else if (!shape.string_args && json_is_string(args)) {
        json_t *o = json_loads(json_string_value(args), 0, NULL);
        if (json_is_object(o)) json_object_set_new(fn, "arguments", o);
        else json_decref(o);
      }
    }
  }
}

chat_call_shape chat_tool_call_shape(const char *src, const char *bos, const char *eos) {
  static const chat_call_shape order[] = {{false, false, false}, {true, false, false}, {false, true, false}, {true, true, false}};
  json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"probe_tool\",\"description\":\"p\","
                             "\"parameters\":{\"type\":\"object\",\"properties\":{\"probe_arg\":{\"type\":\"string\"}}}}}]",
                             0, NULL);
  for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
    json_t *msgs = json_loads("[{\"role\":\"user\",\"content\":\"p\"},{\"role\":\"assistant\",\"content\":null,"
                              "\"tool_calls\":[{\"id\":\"call_probe0\",\"type\":\"function\",\"function\":"
                              "{\"name\":\"probe_tool\",\"arguments\":{\"probe_arg\":\"probe_value\"}}}]}]",
                              0, NULL);
    if (!msgs) break;
    chat_apply_call_shape(msgs, order[i]);
    hbuf out = {0};
    bool shown = chat_render(src, msgs, tools, false, NULL, bos, eos, &out, NULL) == 0 && out.data &&
                 strstr(out.data, "probe_tool") && strstr(out.data, "probe_value");
    hbuf_free(&out);
    json_decref(msgs);
    if (shown) {
      json_decref(tools);
      return order[i];
    }
  }
  json_decref(tools);
  return (chat_call_shape){.calls_as_text = true};
}

static bool py_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

int chat_continue_final(const char *rendered, const char *final_text, size_t *cut, herr *err) {
  const char *a = final_text, *z = final_text + strlen(final_text);
  while (a < z && py_space(*a)) a++;
  while (z > a && py_space(z[-1])) z--;
  size_t n = (size_t)(z - a); /* final_text.strip() */
  if (n == 0)
    return herr_set(err, HEARTH_EINVAL, "continue_final_message: the final message has no text to continue");
  const char *hit = NULL; /* rendered.rindex(final_text.strip()) */
  for (const char *q = rendered; *q; q++)
    if (!strncmp(q, a, n)) hit = q;
  if (!hit)
    return herr_set(err, HEARTH_EINVAL,
                    "continue_final_message: the chat template does not write the final message's text, so it "
                    "cannot be continued");
  size_t l = strlen(a); /* final_text.lstrip(): kept whole when the template kept its trailing space */
  bool kept = strlen(hit) >= l && !strncmp(hit, a, l) && a == final_text;
  *cut = (size_t)(hit - rendered) + (kept ? l : n);
  return 0;
}
