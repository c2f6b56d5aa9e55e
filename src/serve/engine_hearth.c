/* engine_hearth.c — serve_engine over the public library API (include/hearth.h):
 * loading a model folder, rendering chats with its template, counting tokens,
 * and generating with a per-token callback. The only file of the server that
 * knows the library; knows nothing of HTTP. */
#include <stdio.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat/chat.h"
#include "chat/toolcall.h"
#include "hearth.h"
#include "serve/engine.h"

typedef struct hearth_engine {
  hearth_model *model; /* owned */
  hearth_info info;
} hearth_engine;

static int copy_err(herr *err, const hearth_error *e) {
  if (err) *err = *e;
  return e->code ? e->code : HEARTH_EINTERNAL;
}

/* Error text for a client: the model folder's path (which names the
 * server's file system) becomes "<model>". */
static void scrub_path(char *msg, size_t cap, const char *path) {
  size_t n = path ? strlen(path) : 0;
  while (n > 1 && path[n - 1] == '/') n--;
  if (n < 2) return;
  char out[sizeof ((herr *)0)->msg];
  size_t o = 0;
  for (const char *p = msg; *p && o + 1 < sizeof out;) {
    if (!strncmp(p, path, n)) {
      o += (size_t)snprintf(out + o, sizeof out - o, "<model>");
      if (o >= sizeof out) o = sizeof out - 1;
      p += n;
    } else {
      out[o++] = *p++;
    }
  }
  out[o] = 0;
  snprintf(msg, cap, "%s", out);
}

static int render_chat(void *impl, const serve_message *msgs, int nmsgs, const serve_chat_opts *o, char **prompt,
                       herr *err) {
  hearth_engine *h = impl;
  json_t *arr = json_array();
  for (int i = 0; i < nmsgs; i++) {
    json_t *m = json_object();
    json_object_set_new(m, "role", json_string(msgs[i].role));
    /* (a turn of only tool calls is given the content and argument shape the
     * template wants by hearth_chat_render) */
    json_t *c = msgs[i].parts ? json_incref(msgs[i].parts) : json_string(msgs[i].content);
    if (!c) { /* not valid UTF-8: the template sees what jansson can carry */
      json_decref(m);
      json_decref(arr);
      return herr_set(err, HEARTH_EINVAL, "messages[%d].content is not valid UTF-8", i);
    }
    json_object_set_new(m, "content", c);
    if (msgs[i].extra) json_object_update(m, msgs[i].extra);
    json_array_append_new(arr, m);
  }
  char *js = json_dumps(arr, JSON_COMPACT);
  json_decref(arr);
  char *tools = o && o->tools ? json_dumps(o->tools, JSON_COMPACT) : NULL;
  char *kwargs = o && o->kwargs ? json_dumps(o->kwargs, JSON_COMPACT) : NULL;
  if (!js || (o && o->tools && !tools) || (o && o->kwargs && !kwargs)) {
    free(js);
    free(tools);
    free(kwargs);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  char *text = NULL;
  hearth_error e = {0};
  bool gen_prompt = !(o && (o->no_generation_prompt || o->continue_final));
  int rc = hearth_chat_render(h->model, js, tools, gen_prompt, kwargs, &text, &e);
  free(js);
  free(tools);
  free(kwargs);
  if (rc) {
    rc = copy_err(err, &e);
    if (err) scrub_path(err->msg, sizeof err->msg, h->info.path);
    return rc;
  }
  if (o && o->continue_final && nmsgs > 0) { /* cut after the final message's text */
    const serve_message *last = &msgs[nmsgs - 1];
    const char *final_text = last->content;
    size_t k;
    json_t *part;
    json_array_foreach(last->parts, k, part) { /* with media: its last text part, as transformers */
      json_t *t = json_object_get(part, "text");
      if (json_is_string(t)) final_text = json_string_value(t);
    }
    size_t cut = 0;
    if ((rc = chat_continue_final(text, final_text, &cut, err))) {
      hearth_free(text);
      return rc;
    }
    text[cut] = 0;
  }
  *prompt = strdup(text);
  hearth_free(text);
  return *prompt ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
}

/* Whether a chat template writes reasoning blocks the output may hold:
 * <think> (Qwen3, DeepSeek-R1, GLM), the harmony analysis channel (gpt-oss),
 * Gemma 4's thought channel. */
static bool template_reasons(const char *src) {
  return src && (strstr(src, "<think>") || strstr(src, "reasoning_content") || strstr(src, "<|channel|>analysis") ||
                 strstr(src, "<|channel>"));
}

static int fim_prompt(void *impl, const char *prefix, const char *suffix, const char *prompt,
                      const hearth_fim_chunk *extra, int n_extra, int64_t n_predict, int32_t **ids, size_t *n,
                      herr *err) {
  hearth_engine *h = impl;
  int32_t *got = NULL;
  hearth_error e = {0};
  *ids = NULL;
  *n = 0;
  if (hearth_fim_prompt(h->model, prefix, suffix, prompt, extra, n_extra, n_predict, &got, n, &e)) return copy_err(err, &e);
  *ids = malloc(sizeof(int32_t) * (*n ? *n : 1));
  if (*ids) memcpy(*ids, got, sizeof(int32_t) * *n);
  hearth_free(got);
  return *ids ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
}

static int count_tokens(void *impl, const char *prompt, bool raw, int64_t *n, herr *err) {
  hearth_engine *h = impl;
  int32_t *ids = NULL;
  size_t nids = 0;
  hearth_error e = {0};
  if (hearth_tokenize(h->model, prompt, strlen(prompt), raw, &ids, &nids, &e)) return copy_err(err, &e);
  hearth_free(ids);
  *n = (int64_t)nids;
  return 0;
}

static int tokenize(void *impl, const char *text, bool add_special, int32_t **ids, size_t *n, herr *err) {
  hearth_engine *h = impl;
  int32_t *got = NULL;
  hearth_error e = {0};
  *ids = NULL;
  *n = 0;
  if (hearth_tokenize(h->model, text, strlen(text), add_special, &got, n, &e)) return copy_err(err, &e);
  *ids = malloc(sizeof(int32_t) * (*n ? *n : 1));
  if (*ids) memcpy(*ids, got, sizeof(int32_t) * *n);
  hearth_free(got);
  return *ids ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
}

static int detokenize(void *impl, const int32_t *ids, size_t n, char **text, size_t *len, herr *err) {
  hearth_engine *h = impl;
  char *got = NULL;
  hearth_error e = {0};
  *text = NULL;
  if (hearth_detokenize(h->model, ids, n, false, &got, len, &e)) return copy_err(err, &e);
  *text = malloc(*len + 1);
  if (*text) memcpy(*text, got, *len + 1);
  hearth_free(got);
  return *text ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
}

typedef struct relay {
  serve_token_fn fn;
  void *ctx;
} relay;

static int on_token(void *user, const char *text, size_t len, const hearth_token *tok) {
  relay *r = user;
  serve_token t = {.text = text, .len = len, .id = -1};
  serve_top_logprob top[HEARTH_MAX_TOP_LOGPROBS];
  if (tok) {
    t.id = tok->id;
    t.token_text = tok->text;
    t.token_len = tok->len;
    t.logprob = tok->logprob;
    int n = tok->n_top < HEARTH_MAX_TOP_LOGPROBS ? tok->n_top : HEARTH_MAX_TOP_LOGPROBS;
    for (int i = 0; i < n; i++) {
      top[i].text = tok->top[i].text;
      top[i].len = tok->top[i].len;
      top[i].logprob = tok->top[i].logprob;
    }
    t.top = top;
    t.ntop = n > 0 ? n : 0;
  } else {
    t.flush = true;
  }
  return r->fn(r->ctx, &t);
}

static int run(hearth_engine *h, const hearth_prompt *hp, const serve_sampling *s, serve_token_fn fn, void *ctx,
               volatile int *cancel, serve_result *res, herr *err);

static int generate(void *impl, const char *prompt, bool raw, const serve_sampling *s, serve_token_fn fn, void *ctx,
                    volatile int *cancel, serve_result *res, herr *err) {
  hearth_prompt hp = {.text = prompt, .text_len = strlen(prompt), .add_special = raw};
  return run(impl, &hp, s, fn, ctx, cancel, res, err);
}

static int generate_media(void *impl, const char *prompt, bool raw, const hearth_media *media, int n_media,
                          const serve_sampling *s, serve_token_fn fn, void *ctx, volatile int *cancel, serve_result *res,
                          herr *err) {
  hearth_prompt hp = {.text = prompt, .text_len = strlen(prompt), .add_special = raw, .media = media, .n_media = n_media};
  return run(impl, &hp, s, fn, ctx, cancel, res, err);
}

static int prompt_logprobs(void *impl, const int32_t *ids, size_t n, int n_top, volatile int *cancel,
                           hearth_prompt_logprob *out, herr *err) {
  hearth_engine *h = impl;
  hearth_error e = {0};
  if (hearth_prompt_logprobs(h->model, ids, n, n_top, cancel, out, &e)) return copy_err(err, &e);
  return 0;
}

static int generate_ids(void *impl, const int32_t *ids, size_t n_ids, const serve_sampling *s, serve_token_fn fn,
                        void *ctx, volatile int *cancel, serve_result *res, herr *err) {
  hearth_prompt hp = {.ids = ids, .n_ids = n_ids};
  return run(impl, &hp, s, fn, ctx, cancel, res, err);
}

static int run(hearth_engine *h, const hearth_prompt *hp, const serve_sampling *s, serve_token_fn fn, void *ctx,
               volatile int *cancel, serve_result *res, herr *err) {
  hearth_gen_params p = *s; /* the request's parameters as parsed, plus what only the engine sets */
  p.cancel = cancel;
  relay r = {fn, ctx};
  hearth_gen_result gr;
  memset(&gr, 0, sizeof gr);
  hearth_error e = {0};
  int rc = hearth_generate(h->model, hp, &p, on_token, &r, &gr, &e);
  res->prompt_tokens = gr.prompt_tokens;
  res->completion_tokens = gr.completion_tokens;
  res->cached_tokens = gr.cached_tokens;
  res->queue_seconds = gr.queue_seconds;
  res->stop_index = gr.finish_reason == HEARTH_FINISH_STOP && gr.stop_index >= 0 && gr.stop_index < s->n_stop ? gr.stop_index : -1;
  res->finish = gr.finish_reason == HEARTH_FINISH_LENGTH      ? SERVE_FINISH_LENGTH
                : gr.finish_reason == HEARTH_FINISH_CANCELLED ? SERVE_FINISH_CANCELLED
                                                              : SERVE_FINISH_STOP;
  if (rc) return copy_err(err, &e);
  return 0;
}

static int embed(void *impl, const serve_embed_input *in, int n, const char *instruction, int dimensions, float *out,
                 int64_t *prompt_tokens, volatile int *cancel, herr *err) {
  hearth_engine *h = impl;
  hearth_prompt *ps = calloc((size_t)(n > 0 ? n : 1), sizeof *ps);
  if (!ps) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (int i = 0; i < n; i++)
    ps[i] = in[i].ids ? (hearth_prompt){.ids = in[i].ids, .n_ids = in[i].n_ids}
                      : (hearth_prompt){.text = in[i].text, .text_len = in[i].len, .add_special = true};
  hearth_embed_opts o = {.instruction = instruction, .dimensions = dimensions, .cancel = cancel};
  hearth_error e = {0};
  int rc = hearth_embed(h->model, ps, (size_t)n, &o, out, prompt_tokens, &e);
  free(ps);
  if (!rc) return 0;
  rc = copy_err(err, &e);
  if (err) scrub_path(err->msg, sizeof err->msg, h->info.path);
  return rc;
}

static int next_signal(void *impl, const char *prompt, bool raw, const int32_t *ids, size_t n_ids, int bins, int top,
                       serve_signal *out, volatile int *cancel, herr *err) {
  hearth_engine *h = impl;
  memset(out, 0, sizeof *out);
  hearth_prompt p = ids ? (hearth_prompt){.ids = ids, .n_ids = n_ids}
                        : (hearth_prompt){.text = prompt ? prompt : "", .text_len = prompt ? strlen(prompt) : 0, .add_special = raw};
  hearth_error e = {0};
  if (hearth_signal(h->model, &p, bins, top, cancel, &out->r, &e)) {
    int rc = copy_err(err, &e);
    if (err) scrub_path(err->msg, sizeof err->msg, h->info.path);
    return rc;
  }
  for (int i = 0; i < out->r.n_top; i++) {
    char *text = NULL;
    size_t len = 0;
    if (hearth_detokenize(h->model, &out->r.top_ids[i], 1, false, &text, &len, &e) == 0) {
      out->top_text[i] = malloc(len + 1);
      if (out->top_text[i]) memcpy(out->top_text[i], text, len + 1), out->top_len[i] = len;
      hearth_free(text);
    }
  }
  return 0;
}

static void destroy(void *impl) {
  hearth_engine *h = impl;
  if (!h) return;
  hearth_model_free(h->model);
  free(h);
}

static void stats(void *impl, serve_stats *out) {
  hearth_engine *h = impl;
  hearth_stats st;
  hearth_get_stats(h->model, &st);
  *out = (serve_stats){.running = st.running,
                       .waiting = st.waiting,
                       .kv_blocks_total = st.kv_blocks_total,
                       .kv_blocks_used = st.kv_blocks_used,
                       .kv_blocks_cached = st.kv_blocks_cached,
                       .kv_blocks_free = st.kv_blocks_free,
                       .kv_block_tokens = st.kv_block_tokens,
                       .kv_block_bytes = st.kv_block_bytes,
                       .prefix_hit_tokens = st.prefix_hit_tokens,
                       .prefix_miss_tokens = st.prefix_miss_tokens,
                       .prompt_tokens = st.prompt_tokens,
                       .generated_tokens = st.generated_tokens,
                       .busy_seconds = st.busy_seconds,
                       .requests_finished = st.requests_finished,
                       .requests_cancelled = st.requests_cancelled,
                       .requests_refused = st.requests_refused,
                       .preemptions = st.preemptions,
                       .steps = st.steps,
                       .expert_budget = st.expert_budget,
                       .expert_resident_bytes = st.expert_resident_bytes,
                       .expert_page_ins = st.expert_page_ins,
                       .kv_store = st.kv_store,
                       .kv_store_blocks = st.kv_store_blocks,
                       .kv_store_bytes = st.kv_store_bytes,
                       .kv_store_written = st.kv_store_written,
                       .kv_store_read = st.kv_store_read,
                       .kv_store_removed = st.kv_store_removed,
                       .kv_store_rejected = st.kv_store_rejected,
                       .kv_store_hit_tokens = st.kv_store_hit_tokens,
                       .kv_store_pending = st.kv_store_pending,
                       .kv_store_dropped = st.kv_store_dropped};
  for (int k = 0; k < HEARTH_SPEC_SOURCES; k++) {
    out->spec_steps[k] = st.spec_steps[k];
    out->spec_drafted[k] = st.spec_drafted[k];
    out->spec_accepted[k] = st.spec_accepted[k];
  }
  snprintf(out->kv_format, sizeof out->kv_format, "%s", st.kv_format);
}

static int fit(void *impl, int64_t context, int batch, char **json, herr *err) {
  hearth_engine *h = impl;
  hearth_fit_opts o = {.context = context, .batch = batch};
  hearth_fit_result r;
  hearth_error e = {0};
  if (hearth_model_fit(h->model, &o, &r, &e) || hearth_fit_json(&r, json, &e)) return copy_err(err, &e);
  return 0;
}

static int admit(void *impl, int64_t n_prompt, int64_t max_tokens, herr *err) {
  hearth_engine *h = impl;
  hearth_error e = {0};
  if (hearth_admit(h->model, n_prompt, max_tokens, &e)) return copy_err(err, &e);
  return 0;
}

static int adapter_load(void *impl, const char *name, const char *path, herr *err) {
  hearth_engine *h = impl;
  hearth_error e = {0};
  if (hearth_adapter_load(h->model, name, path, &e)) return copy_err(err, &e);
  return 0;
}

static int adapter_unload(void *impl, const char *name, herr *err) {
  hearth_engine *h = impl;
  hearth_error e = {0};
  if (hearth_adapter_unload(h->model, name, &e)) return copy_err(err, &e);
  return 0;
}

static int adapter_list(void *impl, hearth_adapter_info *out, int max) {
  return hearth_adapter_list(((hearth_engine *)impl)->model, out, max);
}

int serve_engine_open(const char *model_dir, int threads, serve_engine *out, herr *err) {
  serve_engine_opts o = {.threads = threads};
  return serve_engine_open_opts(model_dir, &o, out, err);
}

int serve_engine_open_opts(const char *model_dir, const serve_engine_opts *o, serve_engine *out, herr *err) {
  memset(out, 0, sizeof *out);
  hearth_engine *h = calloc(1, sizeof *h);
  if (!h) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  hearth_load_opts opts = o->load;
  /* opts.id: the name the model answers to (NULL: its folder's or file's name) */
  opts.threads = o->threads;
  opts.max_batch = o->max_batch;
  opts.prefill_chunk = o->prefill_chunk;
  opts.step_tokens = o->step_tokens;
  opts.kv_cache_bytes = o->kv_cache_bytes;
  opts.memory_budget = o->memory_budget;
  hearth_error e = {0};
  if (hearth_model_load(model_dir, &opts, &h->model, &e)) {
    free(h);
    return copy_err(err, &e);
  }
  hearth_model_info(h->model, &h->info);
  if (!h->info.has_tokenizer) {
    destroy(h);
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s: the model has no tokenizer.json, so it cannot serve text", model_dir);
  }
  if (hearth_start(h->model, &e)) { /* the KV pool and store now, not at the first request */
    destroy(h);
    return copy_err(err, &e);
  }
  out->impl = h;
  out->model_id = h->info.id;
  out->context_length = h->info.context_length;
  out->vocab_size = h->info.vocab_size;
  out->created = (int64_t)time(NULL);
  out->thread_safe = true; /* the library's scheduler batches concurrent generations */
  out->chat_template = h->info.chat_template;
  /* a template without a call syntax of its own gets the generic one, and
   * the server describes the tools to the model when the template does not */
  out->tool_format = h->info.chat_template ? (int)tc_format_detect(h->info.chat_template) : TC_NONE;
  if (h->info.chat_template && out->tool_format == TC_NONE) {
    out->tool_format = TC_GENERIC;
    out->template_tools = strstr(h->info.chat_template, "tools") != NULL;
  }
  out->reasoning = template_reasons(h->info.chat_template);
  out->denoising = h->info.canvas_length > 0;
  if (o->load.spec_tokens > 0 && !out->denoising) out->spec_method = o->load.spec_method ? o->load.spec_method : "ngram";
  out->render_chat = render_chat;
  if (h->info.can_fill) out->fim_prompt = fim_prompt;
  out->count_tokens = count_tokens;
  out->tokenize = tokenize;
  out->detokenize = detokenize;
  out->generate = generate;
  for (int k = HEARTH_MEDIA_IMAGE; k <= HEARTH_MEDIA_VIDEO; k++)
    if (hearth_media_placeholder(h->model, (hearth_media_kind)k)) out->media_kinds |= 1u << k;
  out->generate_media = generate_media;
  out->generate_ids = generate_ids;
  out->prompt_logprobs = prompt_logprobs;
  out->destroy = destroy;
  out->stats = stats;
  out->admit = admit;
  out->fit = fit;
  if (h->info.can_embed) {
    out->embed = embed;
    out->embed_dim = h->info.hidden_size;
  }
  if (h->info.can_generate) {
    out->signal = next_signal;
    out->adapter_load = adapter_load;
    out->adapter_unload = adapter_unload;
    out->adapter_list = adapter_list;
  }
  return 0;
}

void serve_engine_close(serve_engine *e) {
  if (e && e->destroy) e->destroy(e->impl);
  if (e) memset(e, 0, sizeof *e);
}
