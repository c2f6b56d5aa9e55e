/* ollama.c — the Ollama API's bodies (see ollama.h). A chat or generate
 * request is rewritten as the OpenAI request it means and parsed by
 * request.c, so both protocols share every check; Ollama's own fields
 * (options, format, think, images) are checked here first, so refusals name
 * them as the client sent them. Replies are Ollama's NDJSON objects, their
 * tool calls whole (arguments as objects) as Ollama sends them. */
#include "serve/ollama.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "base/hash.h"
#include "serve/reply.h"

double oll_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void time_fmt(time_t secs, long usec, char *out, size_t cap) {
  struct tm tm;
  gmtime_r(&secs, &tm);
  char d[40];
  strftime(d, sizeof d, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out, cap, "%s.%06ldZ", d, usec);
}

void oll_time_now(char *out, size_t cap) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  time_fmt(tv.tv_sec, (long)tv.tv_usec, out, cap);
}

void oll_time_at(int64_t unix_s, char *out, size_t cap) { time_fmt((time_t)unix_s, 0, out, cap); }

/* ---- errors ---- */

char *oll_fail_json(const serve_fail *f) {
  json_t *o = json_object();
  json_object_set_new(o, "error", serve_json_text(f->message, strlen(f->message)));
  char *s = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return s;
}

void oll_error_line(const serve_fail *f, hbuf *out) {
  char *s = oll_fail_json(f);
  if (!s) {
    out->oom = true;
    return;
  }
  hbuf_puts(out, s);
  hbuf_puts(out, "\n");
  free(s);
}

/* ---- requests ---- */

/* Ollama's options: those hearth maps, those it accepts because they only
 * tune how the server runs (set when `hearth serve` starts), and those that
 * would change the output in ways hearth does not follow (refused unless at
 * their "off" value). */
typedef enum opt_kind { OPT_MAPPED, OPT_RUNTIME, OPT_REFUSED } opt_kind;
typedef struct opt_def {
  const char *name;
  opt_kind kind;
  double off; /* OPT_REFUSED: the value that changes nothing (NAN: none) */
  const char *why;
} opt_def;

static const opt_def opts[] = {
    {"temperature", OPT_MAPPED, 0, NULL},
    {"top_k", OPT_MAPPED, 0, NULL},
    {"top_p", OPT_MAPPED, 0, NULL},
    {"min_p", OPT_MAPPED, 0, NULL},
    {"num_predict", OPT_MAPPED, 0, NULL},
    {"stop", OPT_MAPPED, 0, NULL},
    {"seed", OPT_MAPPED, 0, NULL},
    {"repeat_penalty", OPT_MAPPED, 0, NULL},
    {"presence_penalty", OPT_MAPPED, 0, NULL},
    {"frequency_penalty", OPT_MAPPED, 0, NULL},
    {"num_ctx", OPT_MAPPED, 0, NULL},
    {"num_thread", OPT_RUNTIME, 0, NULL},
    {"num_gpu", OPT_RUNTIME, 0, NULL},
    {"main_gpu", OPT_RUNTIME, 0, NULL},
    {"num_batch", OPT_RUNTIME, 0, NULL},
    {"use_mmap", OPT_RUNTIME, 0, NULL},
    {"use_mlock", OPT_RUNTIME, 0, NULL},
    {"low_vram", OPT_RUNTIME, 0, NULL},
    {"numa", OPT_RUNTIME, 0, NULL},
    {"f16_kv", OPT_RUNTIME, 0, NULL},
    {"mirostat", OPT_REFUSED, 0, "Mirostat sampling is not implemented"},
    {"mirostat_tau", OPT_REFUSED, NAN, "Mirostat sampling is not implemented"},
    {"mirostat_eta", OPT_REFUSED, NAN, "Mirostat sampling is not implemented"},
    {"tfs_z", OPT_REFUSED, 1, "tail-free sampling is not implemented"},
    {"typical_p", OPT_REFUSED, 1, "locally typical sampling is not implemented"},
    {"repeat_last_n", OPT_REFUSED, -1, "the penalties look at the whole sequence (only -1 is followed)"},
    {"penalize_newline", OPT_REFUSED, 1, "newlines are penalized like any token (only true is followed)"},
    {"num_keep", OPT_REFUSED, NAN, "a prompt that does not fit is refused, never shifted"},
    {"logits_all", OPT_REFUSED, 0, "logits are not returned through this API"},
    {"vocab_only", OPT_REFUSED, 0, "the served model is loaded whole"},
    {"embedding_only", OPT_REFUSED, 0, "the served model is loaded whole"},
};

static const opt_def *opt_find(const char *name) {
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
    if (!strcmp(opts[i].name, name)) return &opts[i];
  return NULL;
}

/* A typed option check with the refusal naming "options.KEY". */
static int opt_num(json_t *o, const char *key, double lo, double hi, serve_fail *f) {
  json_t *v = serve_json_field(o, key);
  if (!v) return 0;
  char at[96];
  snprintf(at, sizeof at, "options.%s", key);
  if (!json_is_number(v)) return serve_bad(f, at, "%s must be a number", at);
  double d = json_number_value(v);
  if (!(d >= lo && d <= hi)) return serve_bad(f, at, "%s must be between %g and %g", at, lo, hi);
  return 0;
}

static int opt_int(json_t *o, const char *key, double lo, double hi, serve_fail *f) {
  if (opt_num(o, key, lo, hi, f)) return f->status;
  json_t *v = serve_json_field(o, key);
  if (v && json_number_value(v) != floor(json_number_value(v))) {
    char at[96];
    snprintf(at, sizeof at, "options.%s", key);
    return serve_bad(f, at, "%s must be an integer", at);
  }
  return 0;
}

/* options → the OpenAI fields of oa (and num_ctx into o). */
static int map_options(json_t *options, json_t *oa, oll_request *o, serve_fail *f) {
  if (!options) return 0;
  if (!json_is_object(options)) return serve_bad(f, "options", "options must be an object");
  const char *key;
  json_t *v;
  json_object_foreach(options, key, v) {
    char at[160];
    snprintf(at, sizeof at, "options.%.100s", key);
    const opt_def *d = opt_find(key);
    if (!d)
      return serve_bad(f, at, "%s is not an Ollama option hearth knows (it takes temperature, top_k, top_p, min_p, "
                              "num_predict, stop, seed, repeat_penalty, presence_penalty, frequency_penalty, num_ctx)",
                       at);
    if (json_is_null(v) || d->kind == OPT_RUNTIME) continue;
    if (d->kind == OPT_REFUSED) {
      double x = json_is_boolean(v) ? (json_is_true(v) ? 1 : 0) : json_is_number(v) ? json_number_value(v) : NAN;
      if (!isnan(d->off) && x == d->off) continue;
      return serve_bad(f, at, "%s is not supported by hearth: %s", at, d->why);
    }
  }
  if (opt_num(options, "temperature", 0, 2, f) || opt_num(options, "top_p", 0, 1, f) ||
      opt_num(options, "min_p", 0, 1, f) || opt_int(options, "top_k", -1, INT32_MAX, f) ||
      opt_num(options, "presence_penalty", -2, 2, f) || opt_num(options, "frequency_penalty", -2, 2, f) ||
      opt_num(options, "repeat_penalty", 1e-6, 100, f) || opt_int(options, "num_predict", -2, 1e12, f) ||
      opt_int(options, "seed", -9.2e18, 9.2e18, f) || opt_int(options, "num_ctx", 1, 1e12, f))
    return f->status;
  static const char *const same[][2] = {{"temperature", "temperature"}, {"top_p", "top_p"},
                                        {"min_p", "min_p"},             {"top_k", "top_k"},
                                        {"presence_penalty", "presence_penalty"},
                                        {"frequency_penalty", "frequency_penalty"},
                                        {"repeat_penalty", "repetition_penalty"}};
  for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
    if ((v = serve_json_field(options, same[i][0]))) json_object_set(oa, same[i][1], v);
  if ((v = serve_json_field(options, "num_predict"))) {
    json_int_t n = (json_int_t)json_number_value(v);
    if (n == 0) return serve_bad(f, "options.num_predict", "options.num_predict must be positive, or -1 (no limit)");
    if (n > 0) json_object_set_new(oa, "max_tokens", json_integer(n)); /* -1, -2: up to the context */
  }
  if ((v = serve_json_field(options, "seed")) && json_number_value(v) >= 0) /* Ollama's -1: a random seed */
    json_object_set_new(oa, "seed", json_integer((json_int_t)json_number_value(v)));
  if ((v = serve_json_field(options, "num_ctx"))) o->num_ctx = (int64_t)json_number_value(v);
  if ((v = serve_json_field(options, "stop"))) {
    if (json_is_string(v)) v = json_pack("[O]", v);
    else json_incref(v);
    bool ok = json_is_array(v) && json_array_size(v) <= 16;
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s) ok = ok && json_is_string(s) && json_string_length(s) > 0;
    if (!ok) {
      json_decref(v);
      return serve_bad(f, "options.stop", "options.stop must be an array of at most 16 non-empty strings");
    }
    if (json_array_size(v)) json_object_set(oa, "stop", v);
    json_decref(v);
  }
  return 0;
}

/* think: true / false (enable_thinking) or "high" / "medium" / "low" (reasoning_effort). */
static int map_think(json_t *root, json_t *oa, serve_fail *f) {
  json_t *t = serve_json_field(root, "think");
  if (!t) return 0;
  if (json_is_boolean(t)) {
    json_object_set_new(oa, "chat_template_kwargs", json_pack("{s:O}", "enable_thinking", t));
  } else if (json_is_string(t) && (!strcmp(json_string_value(t), "high") || !strcmp(json_string_value(t), "medium") ||
                                   !strcmp(json_string_value(t), "low"))) {
    json_object_set(oa, "reasoning_effort", t);
  } else {
    return serve_bad(f, "think", "think must be true, false, \"high\", \"medium\" or \"low\"");
  }
  return 0;
}

/* A message's images as OpenAI image parts before its text, into *content. */
static int content_with_images(json_t *m, const char *at, json_t *text, json_t **content, int *nimages, serve_fail *f) {
  json_t *imgs = serve_json_field(m, "images");
  *content = json_incref(text);
  if (!imgs) return 0;
  char where[128];
  snprintf(where, sizeof where, "%s.images", at);
  if (!json_is_array(imgs)) {
    json_decref(*content);
    *content = NULL;
    return serve_bad(f, where, "%s must be an array of base64 strings", where);
  }
  if (!json_array_size(imgs)) return 0;
  json_t *parts = json_array();
  size_t i;
  json_t *im;
  json_array_foreach(imgs, i, im) {
    if (!json_is_string(im) || !json_string_length(im)) {
      json_decref(parts);
      json_decref(*content);
      *content = NULL;
      snprintf(where, sizeof where, "%s.images[%zu]", at, i);
      return serve_bad(f, where, "%s must be a base64 string", where);
    }
    json_array_append_new(parts, json_pack("{s:s, s:{s:O}}", "type", "image_url", "image_url", "url", im));
    (*nimages)++;
  }
  if (json_is_string(text) && json_string_length(text))
    json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", text));
  json_decref(*content);
  *content = parts;
  return 0;
}

/* Ollama messages → OpenAI messages (tool_calls' arguments stay objects; tool_name is the
 * tool message's name; thinking is reasoning_content). */
static int map_messages(json_t *msgs, json_t *oa, json_t *names, serve_fail *f) {
  if (!json_is_array(msgs)) return serve_bad(f, "messages", "messages must be an array");
  json_t *out = json_array();
  json_object_set_new(oa, "messages", out);
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    char at[64];
    snprintf(at, sizeof at, "messages[%zu]", i);
    if (!json_is_object(m)) return serve_bad(f, at, "%s must be an object", at);
    json_t *role = json_object_get(m, "role"), *text = serve_json_field(m, "content");
    if (!json_is_string(role)) return serve_bad(f, at, "%s.role must be a string", at);
    if (text && !json_is_string(text)) return serve_bad(f, at, "%s.content must be a string", at);
    json_t *nm = json_pack("{s:O}", "role", role);
    json_array_append_new(out, nm);
    int nimg = 0;
    json_t *content = NULL, *empty = text ? NULL : json_string("");
    int rc = content_with_images(m, at, text ? text : empty, &content, &nimg, f);
    json_decref(empty);
    if (rc) return f->status;
    json_object_set_new(nm, "content", content);
    for (int k = 0; k < nimg; k++) json_array_append_new(names, json_sprintf("%s.images[%d]", at, k));
    json_t *v;
    if ((v = serve_json_field(m, "thinking"))) json_object_set(nm, "reasoning_content", v);
    if ((v = serve_json_field(m, "tool_name"))) json_object_set(nm, "name", v);
    if ((v = serve_json_field(m, "tool_calls"))) {
      if (!json_is_array(v)) return serve_bad(f, at, "%s.tool_calls must be an array", at);
      json_t *calls = json_array();
      size_t k;
      json_t *c;
      json_array_foreach(v, k, c) {
        json_t *fn = json_is_object(c) ? json_object_get(c, "function") : NULL;
        if (!json_is_object(fn)) {
          json_decref(calls);
          return serve_bad(f, at, "%s.tool_calls[%zu] must be {\"function\": {\"name\", \"arguments\"}}", at, k);
        }
        json_array_append_new(calls, json_pack("{s:s, s:O}", "type", "function", "function", fn));
      }
      json_object_set_new(nm, "tool_calls", calls);
    }
  }
  return 0;
}

/* A param of the OpenAI request back to the Ollama field it came from. */
static void rename_param(serve_fail *f, const char *from, const char *to) {
  size_t n = strlen(from);
  if (strncmp(f->param, from, n) || (f->param[n] && f->param[n] != '.' && f->param[n] != '[')) return;
  char rest[128];
  snprintf(rest, sizeof rest, "%s", f->param + n);
  snprintf(f->param, sizeof f->param, "%s%s", to, rest);
}

int oll_request_parse(const char *body, size_t len, bool chat, serve_request *req, oll_request *o, serve_fail *f) {
  memset(req, 0, sizeof *req);
  memset(o, 0, sizeof *o);
  o->chat = chat;
  json_error_t je;
  json_t *root = json_loadb(body, len, 0, &je);
  if (!root) return serve_bad(f, NULL, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
  json_t *oa = json_object(), *names = json_array(), *v;
  int rc = 0;
  bool fim = false; /* /api/generate's suffix */
  if (!json_is_object(root)) {
    rc = serve_bad(f, NULL, "the body must be a JSON object");
    goto done;
  }
  json_t *model = serve_json_field(root, "model");
  if (!model) model = serve_json_field(root, "name");
  if (!json_is_string(model) || !json_string_length(model)) {
    rc = serve_bad(f, "model", "model is required (a name /api/tags lists)");
    goto done;
  }
  json_object_set(oa, "model", model);
  /* fields of Ollama's API that hearth cannot honour */
  static const char *const refused[][2] = {
      {"template", "the model's own chat template is used (hearth serve --chat-template NAME|FILE replaces it)"},
      {"context", "the context of an earlier reply is not kept: send the whole conversation to /api/chat"},
      {"width", "this server does not make images"},
      {"height", "this server does not make images"},
      {"steps", "this server does not make images"},
  };
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    json_t *x = serve_json_field(root, refused[i][0]);
    bool empty = !x || (json_is_string(x) && !json_string_length(x)) || (json_is_array(x) && !json_array_size(x)) ||
                 json_is_false(x);
    if (!empty) {
      rc = serve_bad(f, refused[i][0], "%s is not supported by hearth: %s", refused[i][0], refused[i][1]);
      goto done;
    }
  }
  o->keep_alive_s = -1;
  if ((v = serve_json_field(root, "keep_alive")) && !oll_keep_alive(v, &o->keep_alive_s)) {
    rc = serve_bad(f, "keep_alive", "keep_alive must be a duration (\"5m\", \"1h30m\", \"-1\" for ever) or a number of seconds");
    goto done;
  }
  bool stream = true, logprobs = false;
  int64_t top = 0;
  if (serve_json_bool(root, "stream", &stream, f) || serve_json_bool(root, "logprobs", &logprobs, f) ||
      serve_json_int(root, "top_logprobs", 0, HEARTH_MAX_TOP_LOGPROBS, &top, f)) {
    rc = f->status;
    goto done;
  }
  if (top > 0 && !logprobs) {
    rc = serve_bad(f, "top_logprobs", "top_logprobs needs logprobs set to true");
    goto done;
  }
  json_object_set_new(oa, "stream", json_boolean(stream));
  if (map_options(serve_json_field(root, "options"), oa, o, f) || map_think(root, oa, f)) {
    rc = f->status;
    goto done;
  }
  if (chat) {
    json_t *sfx = serve_json_field(root, "suffix");
    if (sfx && !(json_is_string(sfx) && !json_string_length(sfx))) {
      rc = serve_bad(f, "suffix", "suffix (fill-in-the-middle) goes with /api/generate, not /api/chat");
      goto done;
    }
    json_t *msgs = serve_json_field(root, "messages");
    if (!msgs || (json_is_array(msgs) && !json_array_size(msgs))) {
      o->load_only = true;
      req->model = strdup(json_string_value(model));
      goto done;
    }
    if (map_messages(msgs, oa, names, f)) {
      rc = f->status;
      goto done;
    }
    if ((v = serve_json_field(root, "tools"))) json_object_set(oa, "tools", v);
  } else {
    json_t *prompt = serve_json_field(root, "prompt"), *system = serve_json_field(root, "system");
    if (prompt && !json_is_string(prompt)) {
      rc = serve_bad(f, "prompt", "prompt must be a string");
      goto done;
    }
    /* suffix: fill-in-the-middle, the prompt the text before it (as /v1/completions' suffix) */
    json_t *suffix = serve_json_field(root, "suffix");
    if (suffix && !json_is_string(suffix)) {
      rc = serve_bad(f, "suffix", "suffix must be a string");
      goto done;
    }
    fim = suffix && json_string_length(suffix);
    if (fim) {
      const char *other = system ? "system" : json_is_true(serve_json_field(root, "raw")) ? "raw" : NULL;
      json_t *im = serve_json_field(root, "images");
      if (!other && json_is_array(im) && json_array_size(im)) other = "images";
      if (other) {
        rc = serve_bad(f, "suffix", "suffix lays out the prompt with the model's fill-in-the-middle tokens: it "
                                    "takes no %s", other);
        goto done;
      }
      json_object_set_new(oa, "prompt", json_string(prompt ? json_string_value(prompt) : ""));
      json_object_set(oa, "suffix", suffix);
      goto parse;
    }
    if (system && !json_is_string(system)) {
      rc = serve_bad(f, "system", "system must be a string");
      goto done;
    }
    if (serve_json_bool(root, "raw", &o->raw, f)) {
      rc = f->status;
      goto done;
    }
    json_t *imgs = serve_json_field(root, "images");
    bool has_images = json_is_array(imgs) && json_array_size(imgs);
    if ((!prompt || !json_string_length(prompt)) && !has_images) {
      o->load_only = true;
      req->model = strdup(json_string_value(model));
      goto done;
    }
    if (o->raw) {
      if (has_images) {
        rc = serve_bad(f, "images", "images go with a templated prompt: raw prompts take no images");
        goto done;
      }
      if (system) {
        rc = serve_bad(f, "system", "system goes with a templated prompt: a raw prompt is sent as it is");
        goto done;
      }
      json_object_set(oa, "prompt", prompt);
    } else {
      json_t *msgs = json_array();
      if (system) json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", system));
      json_t *um = json_object();
      json_object_set_new(um, "role", json_string("user"));
      if (prompt) json_object_set(um, "content", prompt);
      if (imgs) json_object_set(um, "images", imgs);
      json_array_append_new(msgs, um);
      json_t *conv = json_object();
      size_t k;
      json_t *im;
      if (imgs && !json_is_array(imgs)) rc = serve_bad(f, "images", "images must be an array of base64 strings");
      json_array_foreach(imgs, k, im) if (!rc && (!json_is_string(im) || !json_string_length(im))) {
        char at[48];
        snprintf(at, sizeof at, "images[%zu]", k);
        rc = serve_bad(f, at, "%s must be a base64 string", at);
      }
      if (!rc) rc = map_messages(msgs, conv, names, f);
      json_decref(msgs);
      if (rc) {
        json_decref(conv);
        goto done;
      }
      json_object_set(oa, "messages", json_object_get(conv, "messages"));
      json_decref(conv);
      /* the medium names: images[k] */
      json_t *n;
      json_array_foreach(names, k, n) json_array_set_new(names, k, json_sprintf("images[%zu]", k));
    }
  }
parse:;
  char *text = json_dumps(oa, JSON_COMPACT);
  if (!text) {
    rc = serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
    goto done;
  }
  rc = serve_request_parse(text, strlen(text), (chat || !o->raw) && !fim ? SERVE_CHAT : SERVE_COMPLETION, req, f);
  free(text);
  if (rc) {
    rename_param(f, "max_tokens", "options.num_predict");
    rename_param(f, "stop", "options.stop");
    rename_param(f, "seed", "options.seed");
    rename_param(f, "reasoning_effort", "think");
    rename_param(f, "chat_template_kwargs", "think");
    goto done;
  }
  req->sampling.logprobs = logprobs;
  req->sampling.top_logprobs = (int)top;
  /* the media by the names the client gave them */
  for (int i = 0; i < req->n_media && i < (int)json_array_size(names); i++) {
    char *nm = strdup(json_string_value(json_array_get(names, i)));
    if (nm) {
      free((char *)req->media[i].name);
      req->media[i].name = nm;
    }
  }
  /* format: "json" (any JSON object) or a JSON Schema */
  json_t *fmt = serve_json_field(root, "format");
  if (fmt && !(json_is_string(fmt) && !json_string_length(fmt))) {
    if (json_is_string(fmt) && !strcmp(json_string_value(fmt), "json")) req->json_schema = json_pack("{s:s}", "type", "object");
    else if (json_is_object(fmt)) req->json_schema = json_incref(fmt);
    else {
      rc = serve_bad(f, "format", "format must be \"json\" or a JSON Schema object");
      serve_request_free(req);
      goto done;
    }
    if (serve_output_grammar(req, f)) {
      snprintf(f->param, sizeof f->param, "format");
      char msg[sizeof f->message];
      const char *m = f->message;
      if (!strncmp(m, "response_format: ", 17)) m += 17;
      snprintf(msg, sizeof msg, "format: %s", m);
      snprintf(f->message, sizeof f->message, "%s", msg);
      rc = f->status;
      serve_request_free(req);
      goto done;
    }
  }
done:
  if (rc) {
    free(req->model);
    req->model = NULL;
  }
  json_decref(names);
  json_decref(oa);
  json_decref(root);
  return rc;
}

/* ---- embeddings ---- */

int oll_embed_parse(const char *body, size_t len, bool legacy, int64_t vocab, embed_request *req, serve_fail *f) {
  memset(req, 0, sizeof *req);
  json_error_t je;
  json_t *root = json_loadb(body, len, 0, &je);
  if (!root) return serve_bad(f, NULL, "the body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
  int rc = 0;
  json_t *oa = json_object();
  if (!json_is_object(root)) {
    rc = serve_bad(f, NULL, "the body must be a JSON object");
    goto done;
  }
  json_t *model = serve_json_field(root, "model"), *v;
  if (!json_is_string(model) || !json_string_length(model)) {
    rc = serve_bad(f, "model", "model is required (a name /api/tags lists)");
    goto done;
  }
  json_object_set(oa, "model", model);
  const char *key = legacy ? "prompt" : "input";
  json_t *in = serve_json_field(root, key);
  if (!in || !(json_is_string(in) || json_is_array(in))) {
    rc = serve_bad(f, key, legacy ? "prompt must be a string" : "input must be a string or an array of strings");
    goto done;
  }
  if (legacy && !json_is_string(in)) {
    rc = serve_bad(f, key, "prompt must be a string");
    goto done;
  }
  if (json_is_array(in)) {
    size_t i;
    json_t *s;
    json_array_foreach(in, i, s) if (!json_is_string(s)) {
      char at[48];
      snprintf(at, sizeof at, "input[%zu]", i);
      rc = serve_bad(f, at, "%s must be a string", at);
      goto done;
    }
  }
  json_object_set(oa, "input", in);
  if (!legacy && (v = serve_json_field(root, "dimensions"))) json_object_set(oa, "dimensions", v);
  if (!legacy && json_is_true(serve_json_field(root, "truncate"))) {
    rc = serve_bad(f, "truncate", "truncate is not supported by hearth: an input longer than the context is refused, "
                                  "never cut (send \"truncate\": false)");
    goto done;
  }
  json_t *options = serve_json_field(root, "options");
  if (options && !json_is_object(options)) {
    rc = serve_bad(f, "options", "options must be an object");
    goto done;
  }
  const char *k;
  json_object_foreach(options, k, v) {
    const opt_def *d = opt_find(k);
    if (!d || d->kind == OPT_REFUSED) {
      char at[160];
      snprintf(at, sizeof at, "options.%.100s", k);
      rc = serve_bad(f, at, "%s does not apply to embeddings here", at);
      goto done;
    }
  }
  char *text = json_dumps(oa, JSON_COMPACT);
  rc = text ? embed_request_parse(text, strlen(text), vocab, req, f) : serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  free(text);
  if (rc && legacy) rename_param(f, "input", "prompt");
done:
  json_decref(oa);
  json_decref(root);
  return rc;
}

static json_int_t ns(double seconds) { return seconds > 0 ? (json_int_t)llround(seconds * 1e9) : 0; }

static void put_json(json_t *o, hbuf *out, bool line) {
  char *s = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  if (!s) {
    out->oom = true;
    return;
  }
  hbuf_puts(out, s);
  if (line) hbuf_puts(out, "\n");
  free(s);
}

void oll_embed_reply(const embed_request *req, bool legacy, const float *vecs, int dim, const char *model,
                     int64_t prompt_tokens, double seconds, hbuf *out) {
  json_t *all = json_array();
  for (int i = 0; i < req->n; i++) {
    json_t *v = json_array();
    for (int k = 0; k < dim; k++) json_array_append_new(v, json_real(vecs[(size_t)i * (size_t)dim + (size_t)k]));
    json_array_append_new(all, v);
  }
  json_t *o;
  if (legacy) {
    o = json_pack("{s:O}", "embedding", json_array_get(all, 0));
  } else {
    o = json_object();
    json_object_set_new(o, "model", json_string(model));
    json_object_set(o, "embeddings", all);
    json_object_set_new(o, "total_duration", json_integer(ns(seconds)));
    json_object_set_new(o, "load_duration", json_integer(0));
    json_object_set_new(o, "prompt_eval_count", json_integer(prompt_tokens));
  }
  json_decref(all);
  put_json(o, out, false);
}

/* ---- replies ---- */

void oll_reply_init(oll_reply *r, bool chat, const char *model, bool streaming, double t0, bool logprobs) {
  memset(r, 0, sizeof *r);
  r->logprobs = logprobs;
  r->lp = json_array();
  r->chat = chat;
  r->model = model;
  r->streaming = streaming;
  r->t0 = t0;
  r->calls = json_array();
  r->step_calls = json_array();
  r->round_calls = json_array();
}

void oll_reply_free(oll_reply *r) {
  tc_parser_free(r->tc);
  hbuf_free(&r->content);
  hbuf_free(&r->thinking);
  hbuf_free(&r->args);
  hbuf_free(&r->step_content);
  hbuf_free(&r->step_thinking);
  json_decref(r->calls);
  json_decref(r->step_calls);
  json_decref(r->lp);
  json_decref(r->round_calls);
  json_decref(r->exchange);
  hbuf_free(&r->round_text);
  memset(r, 0, sizeof *r);
}

int oll_reply_parse(oll_reply *r, const tc_opts *o, herr *err) { return tc_parser_new(o, &r->tc, err); }

static bool hidden_tool(const oll_reply *r, const char *name) {
  for (int i = 0; i < r->nhidden; i++)
    if (!strcmp(r->hidden[i], name)) return true;
  return false;
}

static int on_event(void *ctx, const tc_event *ev) {
  oll_reply *r = ctx;
  switch (ev->kind) {
  case TC_TEXT:
    hbuf_append(r->streaming ? &r->step_content : &r->content, ev->text, ev->len);
    if (r->nhidden) hbuf_append(&r->round_text, ev->text, ev->len);
    break;
  case TC_REASONING: hbuf_append(r->streaming ? &r->step_thinking : &r->thinking, ev->text, ev->len); break;
  case TC_CALL_BEGIN:
    snprintf(r->call_name, sizeof r->call_name, "%s", ev->name ? ev->name : "");
    hbuf_clear(&r->args);
    break;
  case TC_CALL_ARGS: hbuf_append(&r->args, ev->text, ev->len); break;
  case TC_CALL_END: {
    json_t *args = r->args.len ? json_loadb(r->args.data, r->args.len, 0, NULL) : json_object();
    if (!json_is_object(args)) {
      json_decref(args);
      args = json_object();
    }
    json_t *c = json_pack("{s:{s:s, s:o}}", "function", "name", r->call_name, "arguments", args);
    char id[48];
    serve_random_id(id, sizeof id, "call_", 24);
    json_array_append_new(r->round_calls, json_pack("{s:s, s:s, s:{s:s, s:o}}", "id", id, "type", "function", "function",
                                                    "name", r->call_name, "arguments",
                                                    serve_json_text(r->args.data, r->args.len)));
    if (r->streaming && hidden_tool(r, r->call_name)) json_decref(c); /* the server runs it: not sent */
    else json_array_append_new(r->streaming ? r->step_calls : r->calls, c);
    hbuf_clear(&r->args);
    break;
  }
  }
  return 0;
}

static void feed(oll_reply *r, const char *s, size_t n) {
  if (r->tc) tc_parser_feed(r->tc, s, n, on_event, r, NULL);
  else hbuf_append(r->streaming ? &r->step_content : &r->content, s, n);
}

static void finish_parser(oll_reply *r) {
  if (r->tc && !r->tc_done) {
    tc_parser_finish(r->tc, on_event, r, NULL);
    r->tc_done = true;
  }
}

/* {token, logprob, bytes} */
static json_t *token_lp(const char *text, size_t len, float logprob) {
  json_t *bytes = json_array();
  for (size_t i = 0; i < len; i++) json_array_append_new(bytes, json_integer((unsigned char)text[i]));
  return json_pack("{s:o, s:f, s:o}", "token", serve_json_text(text, len), "logprob", (double)logprob, "bytes", bytes);
}

static void mark_token(oll_reply *r, const serve_token *tok) {
  if (tok->flush) return;
  if (r->t_first == 0) r->t_first = oll_now();
  if (!r->logprobs) return;
  json_t *e = token_lp(tok->token_text ? tok->token_text : "", tok->token_text ? tok->token_len : 0, tok->logprob);
  json_t *top = json_array();
  for (int i = 0; i < tok->ntop; i++)
    json_array_append_new(top, token_lp(tok->top[i].text ? tok->top[i].text : "", tok->top[i].text ? tok->top[i].len : 0,
                                        tok->top[i].logprob));
  json_object_set_new(e, "top_logprobs", top);
  json_array_append_new(r->lp, e);
}

/* The log-probabilities gathered so far go with object o (then a stream starts gathering anew). */
static void put_logprobs(oll_reply *r, json_t *o) {
  if (!r->logprobs) return;
  json_object_set(o, "logprobs", r->lp);
  if (r->streaming) {
    json_decref(r->lp);
    r->lp = json_array();
  }
}

void oll_reply_add(oll_reply *r, const serve_token *tok) {
  mark_token(r, tok);
  if (tok->len) feed(r, tok->text, tok->len);
}

static void step_line(oll_reply *r, hbuf *out);

const json_t *oll_reply_round_calls(oll_reply *r, hbuf *out, const char **text) {
  finish_parser(r);
  if (out) step_line(r, out);
  *text = hbuf_str(&r->round_text);
  return r->round_calls;
}

/* An OpenAI message of the server's tool exchange in Ollama's shape: arguments as objects, the
 * tool message's name as tool_name. */
static json_t *oll_message_of(const json_t *m) {
  const char *role = json_string_value(json_object_get(m, "role"));
  json_t *content = json_object_get(m, "content");
  json_t *o = json_object();
  json_object_set_new(o, "role", json_string(role ? role : ""));
  json_object_set_new(o, "content", json_is_string(content) ? json_incref(content) : json_string(""));
  json_t *calls = json_object_get(m, "tool_calls"), *c;
  size_t i;
  if (json_is_array(calls)) {
    json_t *out = json_array();
    json_array_foreach(calls, i, c) {
      json_t *fn = json_object_get(c, "function");
      const char *a = json_string_value(json_object_get(fn, "arguments"));
      json_t *args = a ? json_loads(a, 0, NULL) : NULL;
      if (!json_is_object(args)) {
        json_decref(args);
        args = json_object();
      }
      json_array_append_new(out, json_pack("{s:{s:O, s:o}}", "function", "name", json_object_get(fn, "name"), "arguments", args));
    }
    json_object_set_new(o, "tool_calls", out);
  }
  if (json_is_string(json_object_get(m, "name"))) json_object_set(o, "tool_name", json_object_get(m, "name"));
  return o;
}

int oll_reply_round_next(oll_reply *r, const json_t *round, const tc_opts *o, herr *err) {
  if (!r->exchange) r->exchange = json_array();
  size_t i;
  json_t *m;
  json_array_foreach(round, i, m) json_array_append_new(r->exchange, oll_message_of(m));
  if (!r->streaming) { /* the final message is the last round's */
    hbuf_clear(&r->content);
    hbuf_clear(&r->thinking);
    json_array_clear(r->calls);
    json_array_clear(r->lp);
  }
  json_array_clear(r->round_calls);
  hbuf_clear(&r->round_text);
  tc_parser_free(r->tc);
  r->tc = NULL;
  r->tc_done = false;
  return tc_parser_new(o, &r->tc, err);
}

/* {"model", "created_at"} */
static json_t *head(const char *model) {
  char t[64];
  oll_time_now(t, sizeof t);
  return json_pack("{s:s, s:s}", "model", model, "created_at", t);
}

static json_t *message(const char *content, size_t n, const hbuf *thinking, const json_t *calls) {
  json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content", serve_json_text(content, n));
  if (thinking && thinking->len) json_object_set_new(m, "thinking", serve_json_text(thinking->data, thinking->len));
  if (calls && json_array_size(calls)) json_object_set(m, "tool_calls", (json_t *)calls);
  return m;
}

/* The text, thinking and calls of one object, in the route's shape. */
static void put_output(oll_reply *r, json_t *o, const hbuf *content, const hbuf *thinking, const json_t *calls) {
  const char *c = content->len ? content->data : "";
  if (r->chat) {
    json_object_set_new(o, "message", message(c, content->len, thinking, calls));
  } else {
    json_object_set_new(o, "response", serve_json_text(c, content->len));
    if (thinking->len) json_object_set_new(o, "thinking", serve_json_text(thinking->data, thinking->len));
  }
}

/* done, done_reason and the counts and durations of the final object. */
static void put_final(oll_reply *r, json_t *o, const serve_result *res) {
  double now = oll_now();
  double first = r->t_first > 0 ? r->t_first : now;
  json_object_set_new(o, "done", json_true());
  json_object_set_new(o, "done_reason", json_string(res->finish == SERVE_FINISH_LENGTH ? "length" : "stop"));
  json_object_set_new(o, "total_duration", json_integer(ns(now - r->t0)));
  json_object_set_new(o, "load_duration", json_integer(ns(r->load_s)));
  json_object_set_new(o, "prompt_eval_count", json_integer(res->prompt_tokens));
  json_object_set_new(o, "prompt_eval_duration", json_integer(ns(first - r->t0 - r->load_s)));
  json_object_set_new(o, "eval_count", json_integer(res->completion_tokens));
  json_object_set_new(o, "eval_duration", json_integer(ns(now - first)));
  if (r->exchange) json_object_set(o, "tool_exchange", r->exchange);
}

void oll_reply_body(oll_reply *r, const serve_result *res, hbuf *out) {
  finish_parser(r);
  json_t *o = head(r->model);
  put_output(r, o, &r->content, &r->thinking, r->calls);
  put_logprobs(r, o);
  put_final(r, o, res);
  put_json(o, out, false);
}

/* The step's deltas as one line (none when the step showed nothing). */
static void step_line(oll_reply *r, hbuf *out) {
  if (!r->step_content.len && !r->step_thinking.len && !json_array_size(r->step_calls)) return;
  json_t *o = head(r->model);
  put_output(r, o, &r->step_content, &r->step_thinking, r->step_calls);
  put_logprobs(r, o);
  json_object_set_new(o, "done", json_false());
  put_json(o, out, true);
  hbuf_clear(&r->step_content);
  hbuf_clear(&r->step_thinking);
  json_array_clear(r->step_calls);
}

void oll_stream_token(oll_reply *r, const serve_token *tok, hbuf *out) {
  mark_token(r, tok);
  if (tok->len) feed(r, tok->text, tok->len);
  step_line(r, out);
}

void oll_stream_finish(oll_reply *r, const serve_result *res, hbuf *out) {
  finish_parser(r);
  step_line(r, out);
  json_t *o = head(r->model);
  hbuf empty = {0};
  put_output(r, o, &empty, &empty, NULL);
  if (json_array_size(r->lp)) put_logprobs(r, o); /* tokens whose text was held back to the end */
  put_final(r, o, res);
  put_json(o, out, true);
}

bool oll_keep_alive(const json_t *v, double *seconds) {
  double t = 0;
  if (json_is_number(v)) {
    t = json_number_value(v);
  } else if (json_is_string(v)) {
    const char *p = json_string_value(v);
    bool neg = *p == '-';
    if (neg || *p == '+') p++;
    if (!*p) return false;
    while (*p) {
      char *end;
      double x = strtod(p, &end);
      if (end == p || !(x >= 0)) return false;
      p = end;
      double unit = 1; /* a bare number: seconds */
      if (!strncmp(p, "ns", 2)) unit = 1e-9, p += 2;
      else if (!strncmp(p, "us", 2)) unit = 1e-6, p += 2;
      else if (!strncmp(p, "\xc2\xb5s", 3)) unit = 1e-6, p += 3;
      else if (!strncmp(p, "ms", 2)) unit = 1e-3, p += 2;
      else if (*p == 's') p++;
      else if (*p == 'm') unit = 60, p++;
      else if (*p == 'h') unit = 3600, p++;
      else if (*p) return false;
      t += x * unit;
    }
    if (neg) t = -t;
  } else {
    return false;
  }
  if (!isfinite(t)) return false;
  *seconds = t < 0 ? 100.0 * 365 * 86400 : t;
  return true;
}

void oll_load_body(bool chat, const char *model, const char *reason, hbuf *out) {
  json_t *o = head(model);
  if (chat) json_object_set_new(o, "message", json_pack("{s:s, s:s}", "role", "assistant", "content", ""));
  else json_object_set_new(o, "response", json_string(""));
  json_object_set_new(o, "done", json_true());
  json_object_set_new(o, "done_reason", json_string(reason));
  put_json(o, out, false);
}

/* ---- models ---- */

/* "0.6B", "135M", "7B" as Ollama writes parameter counts. */
static void param_size(int64_t n, char *out, size_t cap) {
  if (n <= 0) snprintf(out, cap, "%s", "");
  else if (n >= 1000000000) snprintf(out, cap, "%.*fB", n >= 10000000000 ? 0 : 1, (double)n / 1e9);
  else if (n >= 1000000) snprintf(out, cap, "%.0fM", (double)n / 1e6);
  else snprintf(out, cap, "%.0fK", (double)n / 1e3);
}

static const char *str_of(const json_t *o, const char *key) {
  const char *s = json_string_value(json_object_get(o, key));
  return s ? s : "";
}

json_t *oll_details(const json_t *facts) {
  char ps[32];
  param_size((int64_t)json_integer_value(json_object_get(facts, "parameters")), ps, sizeof ps);
  const char *fam = str_of(facts, "architecture");
  json_t *d = json_object();
  json_object_set_new(d, "parent_model", json_string(""));
  json_object_set_new(d, "format", json_string(str_of(facts, "format")));
  json_object_set_new(d, "family", json_string(fam));
  json_object_set_new(d, "families", fam[0] ? json_pack("[s]", fam) : json_null());
  json_object_set_new(d, "parameter_size", json_string(ps));
  json_object_set_new(d, "quantization_level", json_string(str_of(facts, "quantization")));
  return d;
}

/* The revision when there is one (a Hub commit), else a stable hex of the path, size and time. */
static void digest_of(const json_t *facts, char *out, size_t cap) {
  const char *rev = str_of(facts, "revision");
  if (rev[0]) {
    snprintf(out, cap, "%s", rev);
    return;
  }
  uint64_t h = 0x9E3779B97F4A7C15ull;
  for (const char *p = str_of(facts, "path"); *p; p++) h = hmix64(h ^ (unsigned char)*p);
  h = hmix64(h ^ (uint64_t)json_integer_value(json_object_get(facts, "bytes")));
  uint64_t h2 = hmix64(h ^ (uint64_t)json_integer_value(json_object_get(facts, "modified")));
  snprintf(out, cap, "%016llx%016llx", (unsigned long long)h, (unsigned long long)h2);
}

json_t *oll_model_object(const json_t *facts, const char *name, bool ps, int64_t context_length) {
  char t[64], dg[80];
  oll_time_at((int64_t)json_integer_value(json_object_get(facts, "modified")), t, sizeof t);
  digest_of(facts, dg, sizeof dg);
  json_t *m = json_object();
  json_object_set_new(m, "name", json_string(name));
  json_object_set_new(m, "model", json_string(name));
  json_object_set_new(m, "modified_at", json_string(t));
  json_object_set_new(m, "size", json_integer(json_integer_value(json_object_get(facts, "bytes"))));
  json_object_set_new(m, "digest", json_string(dg));
  json_object_set_new(m, "details", oll_details(facts));
  if (ps) {
    oll_time_at((int64_t)time(NULL) + 100ll * 365 * 86400, t, sizeof t); /* loaded until the server stops */
    json_object_set_new(m, "expires_at", json_string(t));
    json_object_set_new(m, "size_vram", json_integer(0));
    json_object_set_new(m, "context_length", json_integer(context_length));
  }
  return m;
}

json_t *oll_show_object(const json_t *facts, const serve_engine *e) {
  const char *fam = str_of(facts, "architecture");
  json_t *info = json_object();
  json_object_set_new(info, "general.architecture", json_string(fam));
  json_object_set_new(info, "general.parameter_count", json_integer(json_integer_value(json_object_get(facts, "parameters"))));
  json_t *caps = json_array();
  if (e) {
    char key[160];
    snprintf(key, sizeof key, "%s.context_length", fam[0] ? fam : "model");
    json_object_set_new(info, key, json_integer(e->context_length));
    if (e->embed_dim > 0) {
      snprintf(key, sizeof key, "%s.embedding_length", fam[0] ? fam : "model");
      json_object_set_new(info, key, json_integer(e->embed_dim));
    }
    json_array_append_new(caps, json_string("completion"));
    if (e->tool_format) json_array_append_new(caps, json_string("tools"));
    if (e->reasoning) json_array_append_new(caps, json_string("thinking"));
    if (e->media_kinds & (1u << HEARTH_MEDIA_IMAGE)) json_array_append_new(caps, json_string("vision"));
    if (e->media_kinds & (1u << HEARTH_MEDIA_AUDIO)) json_array_append_new(caps, json_string("audio"));
    if (e->embed && e->embed_dim > 0) json_array_append_new(caps, json_string("embedding"));
  } else {
    json_array_append_new(caps, json_string("completion"));
  }
  char t[64];
  oll_time_at((int64_t)json_integer_value(json_object_get(facts, "modified")), t, sizeof t);
  json_t *o = json_object();
  const char *path = str_of(facts, "path");
  json_object_set_new(o, "modelfile", json_sprintf("# hearth serves this model from its own files\nFROM %s\n", path));
  json_object_set_new(o, "parameters", json_string(""));
  json_object_set_new(o, "template", serve_json_text(e && e->chat_template ? e->chat_template : "",
                                                     e && e->chat_template ? strlen(e->chat_template) : 0));
  json_object_set_new(o, "details", oll_details(facts));
  json_object_set_new(o, "model_info", info);
  json_object_set_new(o, "capabilities", caps);
  json_object_set_new(o, "modified_at", json_string(t));
  return o;
}
