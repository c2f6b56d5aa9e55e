/* infill.c — POST /infill in llama.cpp's shapes: its fill-in-the-middle
 * fields and sampling names read into a completion serve_request (fim and
 * infill set; the engine lays the prompt out), every other field refused by
 * name, and the reply and its stream as llama.cpp writes them. Knows nothing
 * of sockets or models. */
#include "serve/infill.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/reply.h"

static int oom(serve_fail *f) { return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory"); }

/* Fields llama.cpp's clients send that change nothing here: the prefix cache is always on
 * (cache_prompt), and time limits, indentation hints, slots and response filters are not kept. */
static const char *const no_effect[] = {"cache_prompt", "t_max_prompt_ms", "t_max_predict_ms", "n_indent",
                                        "id_slot", "response_fields", "samplers", NULL};

static int parse_extra(json_t *root, serve_request *r, serve_fail *f) {
  json_t *ex = serve_json_field(root, "input_extra");
  if (!ex) return 0;
  if (!json_is_array(ex)) return serve_bad(f, "input_extra", "'input_extra' must be an array of {\"filename\", \"text\"}");
  size_t n = json_array_size(ex);
  if (n > 1024) return serve_bad(f, "input_extra", "'input_extra' may hold at most 1024 chunks");
  if (n == 0) return 0;
  r->fim_extra = calloc(n, sizeof *r->fim_extra);
  if (!r->fim_extra) return oom(f);
  for (size_t i = 0; i < n; i++) {
    json_t *c = json_array_get(ex, i);
    char at[48];
    snprintf(at, sizeof at, "input_extra[%zu]", i);
    if (!json_is_object(c)) return serve_bad(f, at, "'%s' must be an object {\"filename\", \"text\"}", at);
    const char *k;
    json_t *v;
    json_object_foreach(c, k, v) if (strcmp(k, "filename") && strcmp(k, "text"))
      return serve_bad(f, at, "'%s.%.40s' is not a field of an input_extra chunk (filename, text)", at, k);
    json_t *fn = serve_json_field(c, "filename"), *tx = serve_json_field(c, "text");
    if ((fn && !json_is_string(fn)) || (tx && !json_is_string(tx)))
      return serve_bad(f, at, "'%s.filename' and '%s.text' must be strings", at, at);
    r->n_fim_extra = (int)i + 1;
    if (fn && !(r->fim_extra[i].filename = strdup(json_string_value(fn)))) return oom(f);
    if (!(r->fim_extra[i].text = strdup(tx ? json_string_value(tx) : ""))) return oom(f);
  }
  return 0;
}

int infill_request_parse(const char *body, size_t len, serve_request *r, serve_fail *f) {
  memset(r, 0, sizeof *r);
  r->kind = SERVE_COMPLETION;
  r->n = 1;
  r->n_prompts = 1;
  r->fim = r->infill = true;
  serve_sampling_defaults(&r->sampling);
  json_error_t je;
  json_t *root = json_loadb(body, len, 0, &je);
  if (!root) return serve_bad(f, "", "the request body is not valid JSON: %s at line %d column %d", je.text, je.line, je.column);
  int rc = 0;
  if (!json_is_object(root)) {
    rc = serve_bad(f, "", "the request body must be a JSON object");
    goto out;
  }
  static const char *const known[] = {"input_prefix", "input_suffix", "input_extra", "prompt", "n_predict", "max_tokens",
                                      "temperature", "top_k", "top_p", "min_p", "seed", "stop", "stream",
                                      "repeat_penalty", "presence_penalty", "frequency_penalty", "ignore_eos", "model",
                                      NULL};
  const char *k;
  json_t *v;
  json_object_foreach(root, k, v) {
    bool ok = false;
    for (int i = 0; known[i] && !ok; i++) ok = !strcmp(k, known[i]);
    for (int i = 0; no_effect[i] && !ok; i++) ok = !strcmp(k, no_effect[i]);
    if (!ok) {
      rc = serve_bad(f, k, "'%.60s' is not a field /infill takes (input_prefix, input_suffix, input_extra, prompt, "
                           "n_predict, temperature, top_k, top_p, min_p, seed, stop, stream, repeat_penalty, "
                           "presence_penalty, frequency_penalty, ignore_eos)", k);
      goto out;
    }
  }
  if (serve_json_field(root, "prompt") && !json_is_string(json_object_get(root, "prompt"))) {
    rc = serve_bad(f, "prompt", "'prompt' must be a string (the start of the middle)");
    goto out;
  }
  int64_t n_predict = -1;
  serve_sampling *s = &r->sampling;
  if ((rc = serve_json_str(root, "input_prefix", &r->fim_prefix, f)) || (rc = serve_json_str(root, "input_suffix", &r->suffix, f)) ||
      (rc = serve_json_str(root, "prompt", &r->prompt, f)) || (rc = serve_json_str(root, "model", &r->model, f)) ||
      (rc = parse_extra(root, r, f)) || (rc = serve_json_int(root, "n_predict", -1, (int64_t)1 << 40, &n_predict, f)) ||
      (rc = serve_json_int(root, "max_tokens", 1, (int64_t)1 << 40, &n_predict, f)) ||
      (rc = serve_json_num(root, "temperature", 0, 2, &s->temperature, f)) ||
      (rc = serve_json_int(root, "top_k", -1, INT32_MAX, &s->top_k, f)) ||
      (rc = serve_json_num(root, "top_p", 0, 1, &s->top_p, f)) || (rc = serve_json_num(root, "min_p", 0, 1, &s->min_p, f)) ||
      (rc = serve_json_num(root, "repeat_penalty", 1e-6, 100, &s->repetition_penalty, f)) ||
      (rc = serve_json_num(root, "presence_penalty", -2, 2, &s->presence_penalty, f)) ||
      (rc = serve_json_num(root, "frequency_penalty", -2, 2, &s->frequency_penalty, f)) ||
      (rc = serve_json_bool(root, "ignore_eos", &s->ignore_eos, f)) || (rc = serve_json_bool(root, "stream", &r->stream, f)) ||
      (rc = serve_json_stop(root, "stop", false, s, f)))
    goto out;
  if (n_predict == 0) {
    rc = serve_bad(f, "n_predict", "'n_predict' must be -1 (no limit but the context) or at least 1");
    goto out;
  }
  s->max_tokens = n_predict;
  if (serve_json_field(root, "seed")) {
    int64_t seed = 0;
    if ((rc = serve_json_int(root, "seed", INT64_MIN, INT64_MAX, &seed, f))) goto out;
    if (seed != -1) s->has_seed = true, s->seed = (uint64_t)seed; /* -1: llama.cpp's "random" */
  }
  if (!r->suffix && !(r->suffix = strdup(""))) rc = oom(f);
  if (!rc && !r->fim_prefix && !(r->fim_prefix = strdup(""))) rc = oom(f);
  if (!rc && !r->prompt && !(r->prompt = strdup(""))) rc = oom(f);
out:
  json_decref(root);
  if (rc) serve_request_free(r);
  return rc;
}

static const char *stop_type(const serve_result *r) {
  if (r->finish == SERVE_FINISH_LENGTH) return "limit";
  return r->stop_index >= 0 ? "word" : "eos";
}

static json_t *final_object(const serve_request *req, const char *model, const char *text, size_t len,
                            const serve_result *r) {
  const char *word = r->stop_index >= 0 && r->stop_index < req->sampling.n_stop ? req->sampling.stop[r->stop_index] : "";
  json_t *o = json_object();
  json_object_set_new(o, "index", json_integer(0));
  json_object_set_new(o, "content", serve_json_text(text, len));
  json_object_set_new(o, "stop", json_true());
  json_object_set_new(o, "model", json_string(model));
  json_object_set_new(o, "tokens_predicted", json_integer(r->completion_tokens));
  json_object_set_new(o, "tokens_evaluated", json_integer(r->prompt_tokens));
  json_object_set_new(o, "tokens_cached", json_integer(r->cached_tokens));
  json_object_set_new(o, "truncated", json_false());
  json_object_set_new(o, "stop_type", json_string(stop_type(r)));
  json_object_set_new(o, "stopping_word", serve_json_text(word, strlen(word)));
  return o;
}

static void put(json_t *o, bool sse, hbuf *out) {
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (!s) {
    out->oom = true;
    return;
  }
  if (sse) hbuf_puts(out, "data: ");
  hbuf_puts(out, s);
  if (sse) hbuf_puts(out, "\n\n");
  free(s);
}

void infill_body(const serve_request *req, const char *model, const char *text, size_t len, const serve_result *r,
                 hbuf *out) {
  put(final_object(req, model, text, len, r), false, out);
}

void infill_sse_token(const char *text, size_t len, hbuf *out) {
  if (len == 0) return;
  put(json_pack("{s:i, s:o, s:b}", "index", 0, "content", serve_json_text(text, len), "stop", 0), true, out);
}

void infill_sse_finish(const serve_request *req, const char *model, const serve_result *r, hbuf *out) {
  put(final_object(req, model, "", 0, r), true, out);
}

void infill_sse_error(const serve_fail *f, hbuf *out) {
  char *s = serve_fail_json(f);
  if (!s) {
    out->oom = true;
    return;
  }
  hbuf_puts(out, "data: ");
  hbuf_puts(out, s);
  hbuf_puts(out, "\n\n");
  free(s);
}
