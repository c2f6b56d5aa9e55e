/* api.c — the public library API of include/hearth.h: a loaded model folder
 * or GGUF file (weights, tokenizer, chat template, generation defaults) behind one handle,
 * and generation with the model's defaults filled in, through the model's
 * scheduler (engine/sched.h), started by the first generation. Knows nothing of HTTP or the command line. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/json.h"
#include "base/log.h"
#include "base/vec.h"
#include "base/trace.h"
#include "chat/chat.h"
#include "chat/jinja.h"
#include "engine/request.h"
#include "engine/fit.h"
#include "structured/json_schema.h"
#include "engine/kv_disk.h"
#include "engine/kv_paged.h"
#include "engine/mm_prompt.h"
#include "engine/sched.h"
#include "engine/logit_signal.h"
#include "backend/ops.h"
#include "format/pooling.h"
#include "engine/denoise.h"
#include "engine/dry_breakers.h"
#include "format/config.h"
#include "format/gguf.h"
#include "hearth.h"
#include "model/gguf_model.h"
#include "tokenizer/fim.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

struct hearth_model {
  model *m;                    /* owned */
  tokenizer *tok;              /* owned, NULL when the folder has none */
  generation_config gen;       /* generation_config.json: its EOS ids (its sampling is in sampling) */
  sample_params sampling;      /* the model's sampling defaults (sample_params_model_default), which a
                                  request's fields go over */
  char *path;                  /* owned */
  bool is_gguf;                /* path is a .gguf file */
  char *id;                    /* owned */
  char *kv_store;              /* owned, NULL without hearth_load_opts.kv_store */
  int64_t context_length;
  int32_t eos[HEARTH_MAX_EOS];
  int n_eos;
  int32_t bos;
  chat_template chat_src;      /* owned (when has_chat_src): source, bos/eos strings */
  chat_call_shape call_shape;  /* how the template wants turns of only tool calls */
  bool has_chat_src;
  bool chat_fallback;          /* the model has no template: chats render with the built-in chatml */
  _Atomic bool chat_warned;    /* the fallback was logged (once, at the first chat) */
  jinja_template *chat;        /* owned, NULL when none or when it did not parse */
  herr chat_err;               /* why a template that exists did not parse */
  pthread_mutex_t gen_lock;    /* guards starting the scheduler */
  sched *sch;                  /* owned: started by the first generation */
  sched_config sch_cfg;
  htrace *trace;               /* owned, NULL without hearth_load_opts.trace_file */
  int threads;                 /* hearth_load_opts.threads: the CPU bandwidth test runs on as many */
  double fit_bandwidth;        /* bytes/s measured by the first hearth_model_fit (under gen_lock) */
  pooling_config pooling;      /* how embeddings pool (sentence-transformers files; last token by default) */
  model *draft;                /* owned, NULL without hearth_load_opts.draft_model */
  gen_method method;           /* how generations run (the scheduler borrows it) */
  denoise_params denoise;      /* a block-diffusion model's: generation_config.json over the defaults */
  pthread_mutex_t ad_lock;     /* guards the adapter table */
  struct api_adapter *ads;     /* owned [n_ads]: the loaded LoRA adapters by name */
  int n_ads, cap_ads;
  bool allow_local_media, allow_remote_media, allow_private_media_hosts; /* hearth_load_opts' */
  size_t max_media_bytes;      /* 0: the default */
  pthread_mutex_t dry_lock;    /* guards the default DRY breakers */
  sample_dry_breaker *dry_default; /* owned: DRY's default breakers for this vocabulary, made at first use */
  size_t n_dry_default;
  bool dry_default_built;
};

typedef struct api_adapter {
  char name[HEARTH_ADAPTER_NAME_MAX];
  model_lora *a;               /* one reference of ours; each running request holds another */
} api_adapter;

void hearth_free(void *p) { free(p); }

static void add_eos(hearth_model *hm, int64_t id) {
  if (id < 0 || id > INT32_MAX) return;
  for (int i = 0; i < hm->n_eos; i++)
    if (hm->eos[i] == id) return;
  if (hm->n_eos < HEARTH_MAX_EOS) hm->eos[hm->n_eos++] = (int32_t)id;
}

/* A GGUF file's tokenizer.chat_template, with the BOS/EOS token texts as the
 * strings templates print. HEARTH_ENOTFOUND when the file has none. */
static int gguf_chat_template(const hearth_model *hm, chat_template *out, herr *err) {
  memset(out, 0, sizeof *out);
  gguf_file *g = NULL;
  int rc = gguf_open_mode(&g, hm->path, HMMAP_MAP, err);
  if (rc) return rc;
  if (!gguf_has(g, "tokenizer.chat_template")) {
    gguf_close(g);
    return herr_set(err, HEARTH_ENOTFOUND, "%s: no tokenizer.chat_template", hm->path);
  }
  rc = gguf_get_strdup(g, "tokenizer.chat_template", &out->source, err);
  gguf_close(g);
  if (rc) return rc;
  const char *bos = hm->tok && hm->bos >= 0 ? tokenizer_id_to_token(hm->tok, hm->bos) : NULL;
  int32_t eos_id = hm->tok ? tokenizer_eos_id(hm->tok) : -1;
  const char *eos = eos_id >= 0 ? tokenizer_id_to_token(hm->tok, eos_id) : NULL;
  out->bos = strdup(bos ? bos : "");
  out->eos = strdup(eos ? eos : "");
  out->origin = strdup(hm->path);
  if (!out->bos || !out->eos || !out->origin) {
    chat_template_free(out);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  return 0;
}

/* Whether a GGUF file carries a vocabulary (tokenizer.ggml.tokens). */
static int gguf_has_vocab(const char *path, bool *yes, herr *err) {
  gguf_file *g = NULL;
  int rc = gguf_open_mode(&g, path, HMMAP_MAP, err);
  if (rc) return rc;
  *yes = gguf_has(g, "tokenizer.ggml.tokens");
  gguf_close(g);
  return 0;
}

/* The chat template (chat/chat.h finds it: chat_template.jinja,
 * tokenizer_config.json, chat_template.json), parsed once. file (a Jinja file)
 * or named (a built-in template's name, or a file) replace it. A model with a
 * vocabulary but no template of its own renders chats with the built-in chatml
 * (as llama.cpp does), logged at the first chat; without a vocabulary there is
 * nothing to chat with, and no template is not an error. One that does not
 * parse leaves the model usable for raw prompts: the parse error is logged and
 * returned by every hearth_chat_render. */
static int load_chat_template(hearth_model *hm, const char *file, const char *named, herr *err) {
  herr e = {0};
  if (file && named)
    return herr_set(err, HEARTH_EINVAL, "a chat template file (%s) and a chat template (%s): give one", file, named);
  int rc = hm->is_gguf ? gguf_chat_template(hm, &hm->chat_src, &e) : chat_template_load(hm->path, &hm->chat_src, &e);
  bool fallback = false;
  if (rc == HEARTH_ENOTFOUND && !file && !named && !hm->tok) return 0;
  if (rc == HEARTH_ENOTFOUND) {
    /* the model has none: the given one's, or chatml, with the tokenizer's BOS/EOS texts */
    memset(&hm->chat_src, 0, sizeof hm->chat_src);
    const char *bos = hm->tok && hm->bos >= 0 ? tokenizer_id_to_token(hm->tok, hm->bos) : NULL;
    int32_t eos_id = hm->tok ? tokenizer_eos_id(hm->tok) : -1;
    const char *eos = eos_id >= 0 ? tokenizer_id_to_token(hm->tok, eos_id) : NULL;
    hm->chat_src.bos = strdup(bos ? bos : "");
    hm->chat_src.eos = strdup(eos ? eos : "");
    if (!hm->chat_src.bos || !hm->chat_src.eos) rc = herr_set(&e, HEARTH_ENOMEM, "out of memory");
    else rc = 0;
    if (!file && !named) {
      named = "chatml";
      fallback = true;
    }
  }
  if (!rc && file) rc = chat_template_replace(&hm->chat_src, file, &e);
  else if (!rc && named) rc = chat_template_use(&hm->chat_src, named, &e);
  if (rc) {
    chat_template_free(&hm->chat_src);
    if (err) *err = e;
    return rc;
  }
  hm->has_chat_src = true;
  hm->chat_fallback = fallback;
  if (jinja_parse(hm->chat_src.source, strlen(hm->chat_src.source), hm->chat_src.origin, &hm->chat,
                  &hm->chat_err)) {
    if (file || named) { /* one given in place of the model's is refused now */
      hm->chat = NULL;
      return herr_set(err, hm->chat_err.code ? hm->chat_err.code : HEARTH_EFORMAT, "%s", hm->chat_err.msg);
    }
    HLOG_WARN("%s: the chat template cannot be used: %s", hm->path, hm->chat_err.msg);
    hm->chat = NULL;
  }
  if (hm->chat) hm->call_shape = chat_tool_call_shape(hm->chat_src.source, hm->chat_src.bos, hm->chat_src.eos);
  return 0;
}

static char *folder_name(const char *path) {
  size_t n = strlen(path);
  while (n > 1 && path[n - 1] == '/') n--;
  size_t start = n;
  while (start > 0 && path[start - 1] != '/') start--;
  if (n - start > 5 && !strncmp(path + n - 5, ".gguf", 5)) n -= 5; /* a GGUF file answers to its stem */
  return strndup(path + start, n - start);
}

/* The generation method of hearth_load_opts: speculative decoding's source,
 * and the draft model, loaded like the model and checked against its
 * vocabulary. */
static int load_method(hearth_model *hm, const hearth_load_opts *opts, const model_load_opts *mo, herr *err) {
  hm->method = (gen_method){.spec_tokens = opts->spec_tokens, .source = SPEC_NGRAM};
  if (opts->spec_tokens < 0 || opts->spec_tokens > GEN_MAX_SPEC_TOKENS)
    return herr_set(err, HEARTH_EINVAL, "spec_tokens %d must be from 0 to %d", opts->spec_tokens, GEN_MAX_SPEC_TOKENS);
  int rc = 0;
  if (opts->spec_method && (rc = spec_source_parse(opts->spec_method, &hm->method.source, err))) return rc;
  if (!opts->spec_method && opts->draft_model) hm->method.source = SPEC_DRAFT;
  if (hm->method.source == SPEC_DRAFT && !opts->draft_model)
    return herr_set(err, HEARTH_EINVAL, "speculative method draft needs a draft model (--draft-model)");
  if (opts->draft_model && hm->method.source != SPEC_DRAFT)
    return herr_set(err, HEARTH_EINVAL, "a draft model is only used by the speculative method draft, not %s",
                    spec_source_name(hm->method.source));
  if (opts->draft_model) {
    herr e = {0};
    model_load_opts dmo = *mo;
    dmo.backend = model_backend(hm->m); /* the same device, stream and threads as the model */
    if ((rc = model_load(opts->draft_model, &dmo, &hm->draft, &e)) ||
        (rc = model_config_check(model_cfg(hm->draft), opts->draft_model, &e)))
      return herr_set(err, rc, "draft model %s: %s", opts->draft_model, e.msg);
    tokenizer *dt = NULL;
    char *tj = hfile_is_dir(opts->draft_model) ? hpath_join(opts->draft_model, "tokenizer.json") : NULL;
    if (tj && hfile_exists(tj) && (rc = tokenizer_load(opts->draft_model, &dt, &e))) {
      free(tj);
      return herr_set(err, rc, "draft model %s: %s", opts->draft_model, e.msg);
    }
    free(tj);
    rc = gen_method_check_draft(hm->m, hm->tok, hm->draft, dt, err);
    if (dt) tokenizer_free(dt);
    if (rc) return rc;
    hm->method.draft = hm->draft;
    HLOG_INFO("%s: draft model %s (%.2f GiB)", hm->id, opts->draft_model,
              (double)model_weight_bytes(hm->draft) / (1 << 30));
  }
  if (hm->method.spec_tokens > 0 || opts->spec_method || opts->draft_model) {
    /* a source that cannot run is refused now, not at the first request */
    gen_method probe = hm->method;
    if (probe.spec_tokens == 0) probe.spec_tokens = 1;
    if ((rc = gen_method_check(&probe, hm->m, err))) return rc;
  }
  hm->sch_cfg.method = &hm->method;
  return 0;
}

/* A block-diffusion model's denoising settings: generation_config.json's over transformers' defaults. */
static int load_denoise(hearth_model *hm, herr *err) {
  return denoise_params_load(hm->path, &hm->denoise, err);
}

int hearth_model_load(const char *path, const hearth_load_opts *opts, hearth_model **out, hearth_error *err) {
  *out = NULL;
  if (!path) return herr_set(err, HEARTH_EINVAL, "hearth_model_load: no path");
  bool is_gguf = !hfile_is_dir(path);
  if (is_gguf && !hfile_exists(path)) return herr_set(err, HEARTH_ENOTFOUND, "%s: no such model folder or file", path);
  if (is_gguf && !gguf_model_is_gguf(path))
    return herr_set(err, HEARTH_EINVAL, "%s: not a model folder or a .gguf file", path);
  hearth_model *hm = calloc(1, sizeof *hm);
  if (!hm) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  pthread_mutex_init(&hm->gen_lock, NULL);
  pthread_mutex_init(&hm->ad_lock, NULL);
  pthread_mutex_init(&hm->dry_lock, NULL);
  hm->bos = -1;
  hm->is_gguf = is_gguf;
  int rc = 0;
  hm->path = strdup(path);
  hm->id = opts && opts->id ? strdup(opts->id) : folder_name(path);
  if (opts) {
    hm->allow_local_media = opts->allow_local_media;
    hm->allow_remote_media = opts->allow_remote_media;
    hm->allow_private_media_hosts = opts->allow_private_media_hosts;
    hm->max_media_bytes = opts->max_media_bytes > 0 ? (size_t)opts->max_media_bytes : 0;
  }
  if (!hm->path || !hm->id) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto fail;
  }
  model_load_opts mo = {0};
  if (opts)
    mo = (model_load_opts){.threads = opts->threads, .device = opts->device, .cpu_level = opts->cpu_level,
                           .mmap = opts->mmap, .f32_activations = opts->f32_activations,
                           .f32_as_bf16 = opts->f32_as_bf16, .no_graphs = opts->no_cuda_graphs,
                           .fast_matmul = opts->gpu_fast_matmul,
                           .expert_budget = opts->expert_budget, .tensor_parallel = opts->tensor_parallel};
  if ((rc = model_load(path, &mo, &hm->m, err))) goto fail;
  if ((rc = model_config_check(model_cfg(hm->m), path, err))) goto fail;
  char dev[256];
  bk_backend_describe(model_backend(hm->m), dev, sizeof dev);
  HLOG_INFO("%s: device %s; weights %.2f GiB", hm->id, dev, (double)model_weight_bytes(hm->m) / (1 << 30));
  bool has_tok = false;
  if (is_gguf) {
    /* a GGUF file holds no generation_config: HF's defaults */
    if ((rc = generation_config_load(&hm->gen, "", err))) goto fail;
    if ((rc = gguf_has_vocab(path, &has_tok, err))) goto fail;
  } else {
    if ((rc = generation_config_load(&hm->gen, path, err))) goto fail;
    char *tj = hpath_join(path, "tokenizer.json");
    has_tok = tj && hfile_exists(tj);
    free(tj);
  }
  if (has_tok && (rc = tokenizer_load(path, &hm->tok, err))) goto fail;
  if (!is_gguf && (rc = pooling_load(path, &hm->pooling, err))) goto fail;
  const model_config *cfg = model_cfg(hm->m);
  hm->bos = hm->tok ? tokenizer_bos_id(hm->tok) : -1;
  if (hm->bos < 0 && cfg->bos_token_id >= 0) hm->bos = (int32_t)cfg->bos_token_id;
  if ((rc = load_chat_template(hm, opts ? opts->chat_template_file : NULL, opts ? opts->chat_template : NULL, err)))
    goto fail;

  if (opts && opts->context_length > 0 && cfg->max_position_embeddings > 0 &&
      opts->context_length > cfg->max_position_embeddings) {
    rc = herr_set(err, HEARTH_EINVAL, "context length %lld is more than the model's context of %lld tokens",
                  (long long)opts->context_length, (long long)cfg->max_position_embeddings);
    goto fail;
  }
  hm->context_length = opts && opts->context_length > 0 ? opts->context_length : cfg->max_position_embeddings;
  if (opts) {
    hm->sch_cfg.max_batch = opts->max_batch;
    hm->sch_cfg.prefill_chunk = opts->prefill_chunk;
    hm->sch_cfg.step_tokens = opts->step_tokens;
    hm->sch_cfg.kv_bytes = opts->kv_cache_bytes > 0 ? (size_t)opts->kv_cache_bytes : 0;
    hm->sch_cfg.memory_budget = opts->memory_budget > 0 ? (size_t)opts->memory_budget : 0;
    hm->sch_cfg.gpu_memory_fraction = opts->gpu_memory_fraction;
  }
  if (opts && (rc = kv_quant_make(opts->kv_quant, opts->kv_quant_config, (int)cfg->num_hidden_layers,
                                  &hm->sch_cfg.kv_quant, err)))
    goto fail;
  hm->sch_cfg.context_length = hm->context_length;
  hm->threads = opts ? opts->threads : 0;
  if (opts && opts->kv_store && opts->kv_store[0]) {
    /* what else changes the KV's values: the device kind and rounding the weights to bf16 */
    char extra[128];
    snprintf(extra, sizeof extra, "device=%s bf16=%d", bk_backend_name(model_backend(hm->m)), opts->f32_as_bf16 ? 1 : 0);
    if ((rc = kv_disk_model_identity(path, extra, &hm->sch_cfg.kv_store_model, err))) goto fail;
    if (!(hm->kv_store = strdup(opts->kv_store))) {
      rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
      goto fail;
    }
    hm->sch_cfg.kv_store = hm->kv_store;
    hm->sch_cfg.kv_store_max = opts->kv_store_max;
  }
  if (model_canvas_length(hm->m) > 0) {
    if ((rc = load_denoise(hm, err))) goto fail;
    hm->sch_cfg.denoise = &hm->denoise;
  }
  if (opts && model_canvas_length(hm->m) <= 0 && (rc = load_method(hm, opts, &mo, err))) goto fail;
  if (opts && opts->trace_file) {
    if ((rc = htrace_open(opts->trace_file, opts->trace_max_bytes, &hm->trace, err))) goto fail;
    hm->sch_cfg.trace = hm->trace;
    HLOG_INFO("tracing to %s (Chrome trace-event JSON)", opts->trace_file);
  }
  for (int i = 0; i < cfg->n_eos; i++) add_eos(hm, cfg->eos_token_ids[i]);
  for (int i = 0; i < hm->gen.n_eos; i++) add_eos(hm, hm->gen.eos_token_ids[i]);
  sample_params_model_default(&hm->sampling, &hm->gen);
  if (hm->tok) add_eos(hm, tokenizer_eos_id(hm->tok));
  *out = hm;
  return 0;
fail:
  hearth_model_free(hm);
  return rc;
}

void hearth_model_free(hearth_model *hm) {
  if (!hm) return;
  sched_free(hm->sch);
  model_free(hm->draft); /* after the scheduler: its runs use it */
  htrace_close(hm->trace); /* after the scheduler: its last requests end in the trace */
  for (int i = 0; i < hm->n_ads; i++) model_lora_release(hm->ads[i].a);
  free(hm->ads);
  pthread_mutex_destroy(&hm->ad_lock);
  pthread_mutex_destroy(&hm->dry_lock);
  free(hm->dry_default);
  model_free(hm->m);
  if (hm->tok) tokenizer_free(hm->tok);
  jinja_free(hm->chat);
  if (hm->has_chat_src) chat_template_free(&hm->chat_src);
  free(hm->path);
  free(hm->id);
  free(hm->kv_store);
  pthread_mutex_destroy(&hm->gen_lock);
  free(hm);
}

void hearth_model_info(const hearth_model *hm, hearth_info *out) {
  memset(out, 0, sizeof *out);
  const model_config *cfg = model_cfg(hm->m);
  out->id = hm->id;
  out->path = hm->path;
  out->model_type = cfg->model_type;
  out->context_length = hm->context_length;
  out->vocab_size = (int32_t)model_vocab_size(hm->m);
  out->bos_id = hm->bos;
  memcpy(out->eos_ids, hm->eos, sizeof(int32_t) * (size_t)hm->n_eos);
  out->n_eos = hm->n_eos;
  out->has_tokenizer = hm->tok != NULL;
  out->has_chat_template = hm->chat != NULL;
  out->chat_template_fallback = hm->chat && hm->chat_fallback;
  out->chat_template = hm->chat && hm->has_chat_src ? hm->chat_src.source : NULL;
  out->hidden_size = (int32_t)model_cfg(hm->m)->hidden_size;
  out->can_generate = model_has_head(hm->m);
  out->can_embed = !hm->pooling.unsupported[0];
  out->canvas_length = model_canvas_length(hm->m);
  if (hm->tok) {
    tokenizer_fim f;
    tokenizer_fim_find(hm->tok, &f);
    out->can_fill = tokenizer_fim_ok(&f);
  }
}


static int need_tokenizer(const hearth_model *hm, herr *err) {
  if (hm->tok) return 0;
  return herr_set(err, HEARTH_ENOTFOUND, "%s: the model has no tokenizer (%s)", hm->path,
                  hm->is_gguf ? "no tokenizer.ggml.tokens" : "no tokenizer.json in the folder");
}

int hearth_fim_prompt(const hearth_model *hm, const char *prefix, const char *suffix, const char *prompt,
                      const hearth_fim_chunk *extra, int n_extra, int64_t n_predict, int32_t **ids, size_t *n,
                      hearth_error *err) {
  *ids = NULL;
  *n = 0;
  int rc = need_tokenizer(hm, err);
  if (rc) return rc;
  tokenizer_fim f;
  tokenizer_fim_find(hm->tok, &f);
  tokenizer_fim_chunk *chunks = n_extra > 0 ? calloc((size_t)n_extra, sizeof *chunks) : NULL;
  if (n_extra > 0 && !chunks) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (int i = 0; i < n_extra; i++) chunks[i] = (tokenizer_fim_chunk){.filename = extra[i].filename, .text = extra[i].text};
  rc = tokenizer_fim_prompt(hm->tok, &f, prefix, suffix, prompt, chunks, n_extra, hm->context_length, n_predict, ids,
                            n, err);
  free(chunks);
  return rc;
}

int hearth_tokenize(const hearth_model *hm, const char *text, size_t len, bool add_special, int32_t **ids, size_t *n,
                    hearth_error *err) {
  *ids = NULL;
  *n = 0;
  int rc = need_tokenizer(hm, err);
  if (rc) return rc;
  if (text && len == 0) len = strlen(text); /* the same rule as hearth_prompt.text_len */
  return tokenizer_encode(hm->tok, text ? text : "", text ? len : 0, add_special, true, ids, n, err);
}

int hearth_detokenize(const hearth_model *hm, const int32_t *ids, size_t n, bool skip_special, char **text,
                      size_t *len, hearth_error *err) {
  *text = NULL;
  if (len) *len = 0;
  int rc = need_tokenizer(hm, err);
  if (rc) return rc;
  hbuf out = {0};
  if ((rc = tokenizer_decode(hm->tok, ids, n, skip_special, &out, err))) {
    hbuf_free(&out);
    return rc;
  }
  if (out.oom) {
    hbuf_free(&out);
    return herr_set(err, HEARTH_ENOMEM, "out of memory decoding %zu tokens", n);
  }
  size_t l = out.len;
  *text = out.data ? hbuf_take(&out) : strdup("");
  if (!*text) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  if (len) *len = l;
  return 0;
}

/* ---- chat ----------------------------------------------------------------- */

static json_t *parse_json_arg(const char *text, const char *name, herr *err) {
  json_error_t je;
  json_t *j = json_loads(text, JSON_DECODE_ANY, &je);
  if (!j) herr_set(err, HEARTH_EINVAL, "%s: invalid JSON at line %d column %d: %s", name, je.line, je.column, je.text);
  return j;
}

const char *hearth_chat_template_name(size_t i) { return chat_builtin_name(i); }

int hearth_chat_render(const hearth_model *hm, const char *messages_json, const char *tools_json,
                       bool add_generation_prompt, const char *extra_kwargs_json, char **text, hearth_error *err) {
  *text = NULL;
  if (!hm->chat && hm->chat_err.code) {
    if (err) *err = hm->chat_err;
    return hm->chat_err.code;
  }
  if (!hm->chat) return herr_set(err, HEARTH_ENOTFOUND, "%s: the model has no chat template", hm->path);
  if (!messages_json) return herr_set(err, HEARTH_EINVAL, "chat: no messages");
  if (hm->chat_fallback && !atomic_exchange(&((hearth_model *)hm)->chat_warned, true))
    HLOG_WARN("%s has no chat template: chats are rendered as chatml (--chat-template NAME or FILE picks another)",
              hm->path);
  int rc = 0;
  json_t *ctx = NULL, *msgs = NULL, *tools = NULL, *extra = NULL;
  hbuf out = {0};
  if (!(msgs = parse_json_arg(messages_json, "messages", err))) {
    rc = HEARTH_EINVAL;
    goto out;
  }
  if (!json_is_array(msgs)) {
    rc = herr_set(err, HEARTH_EINVAL, "messages: must be a JSON array");
    goto out;
  }
  if (tools_json) {
    if (!(tools = parse_json_arg(tools_json, "tools", err))) {
      rc = HEARTH_EINVAL;
      goto out;
    }
    if (!json_is_array(tools) && !json_is_null(tools)) {
      rc = herr_set(err, HEARTH_EINVAL, "tools: must be a JSON array");
      goto out;
    }
  }
  if (extra_kwargs_json) {
    if (!(extra = parse_json_arg(extra_kwargs_json, "chat template kwargs", err))) {
      rc = HEARTH_EINVAL;
      goto out;
    }
    if (!json_is_object(extra)) {
      rc = herr_set(err, HEARTH_EINVAL, "chat template kwargs: must be a JSON object");
      goto out;
    }
  }
  chat_apply_call_shape(msgs, hm->call_shape); /* tool-call turns as this template wants them */
  ctx = chat_context(msgs, json_is_array(tools) ? tools : NULL, add_generation_prompt, extra, hm->chat_src.bos,
                     hm->chat_src.eos);
  if (!ctx) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto out;
  }
  if ((rc = jinja_render(hm->chat, ctx, NULL, &out, err))) goto out;
  if (out.oom) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory rendering the chat template");
    goto out;
  }
  *text = out.data ? hbuf_take(&out) : strdup("");
  if (!*text) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
out:
  hbuf_free(&out);
  json_decref(ctx);
  json_decref(msgs);
  json_decref(tools);
  json_decref(extra);
  return rc;
}

/* ---- generation ----------------------------------------------------------- */

void hearth_gen_params_init(hearth_gen_params *p) {
  memset(p, 0, sizeof *p);
  p->max_tokens = -1;
  p->temperature = NAN;
  p->top_p = NAN;
  p->top_k = -1;
  p->min_p = NAN;
  p->repetition_penalty = NAN;
  p->presence_penalty = NAN;
  p->frequency_penalty = NAN;
  p->skip_special = true;
  p->spec_tokens = -1;
  p->typical_p = SAMPLE_DEFAULT_TYPICAL_P;
  p->xtc_threshold = SAMPLE_DEFAULT_XTC_THRESHOLD;
  p->dry_base = SAMPLE_DEFAULT_DRY_BASE;
  p->dry_allowed_length = SAMPLE_DEFAULT_DRY_ALLOWED_LENGTH;
  p->dry_penalty_last_n = SAMPLE_DEFAULT_DRY_PENALTY_LAST_N;
  p->mirostat_tau = SAMPLE_DEFAULT_MIROSTAT_TAU;
  p->mirostat_eta = SAMPLE_DEFAULT_MIROSTAT_ETA;
}

static uint64_t random_seed(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  static _Atomic uint64_t counter;
  return ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32) ^
         (counter++ * 0x9E3779B97F4A7C15ull);
}

/* DRY's breakers for p: the model's cached default set, or the request's own
 * (*own, freed by the caller). */
static int dry_breakers_for(hearth_model *hm, const hearth_gen_params *p, sample_params *s, sample_dry_breaker **own,
                            herr *err) {
  if (p->dry_sequence_breakers) {
    if (p->n_dry_sequence_breakers < 0)
      return herr_set_at(err, HEARTH_EINVAL, "dry_sequence_breakers", 0, "dry_sequence_breakers: bad entry count %d",
                         p->n_dry_sequence_breakers);
    if (p->n_dry_sequence_breakers == 0) return 0; /* none */
  }
  if (!hm->tok)
    return herr_set_at(err, HEARTH_EUNSUPPORTED, "dry_sequence_breakers", 0,
                       "DRY's sequence breakers are strings, and the model has no tokenizer to match them (give none)");
  if (p->dry_sequence_breakers) {
    size_t n = 0;
    int rc = dry_breakers_build(hm->tok, p->dry_sequence_breakers, p->n_dry_sequence_breakers, own, &n, err);
    if (rc) return rc;
    s->dry_breakers = *own;
    s->n_dry_breakers = n;
    return 0;
  }
  pthread_mutex_lock(&hm->dry_lock);
  int rc = 0;
  if (!hm->dry_default_built) {
    rc = dry_breakers_build(hm->tok, dry_default_breakers, 4, &hm->dry_default, &hm->n_dry_default, err);
    hm->dry_default_built = rc == 0;
  }
  pthread_mutex_unlock(&hm->dry_lock);
  s->dry_breakers = hm->dry_default;
  s->n_dry_breakers = hm->n_dry_default;
  return rc;
}

/* The request's int field in [lo, hi] as an int32, else an error naming it. */
static int int_field(int64_t v, int64_t lo, int64_t hi, const char *name, int32_t *out, herr *err) {
  if (v < lo || v > hi) return herr_set_at(err, HEARTH_EINVAL, name, 0, "%s %lld must be from %lld to %lld", name, (long long)v,
                                          (long long)lo, (long long)hi);
  *out = (int32_t)v;
  return 0;
}

/* The request's fields over the model's defaults into the engine's request:
 * its sample_params is what the sampler takes. */
static int fill_request(hearth_model *hm, const hearth_gen_params *p, gen_request *r, sample_bias **bias,
                        sample_dry_breaker **breakers, herr *err) {
  sample_params *s = &r->sample;
  *s = hm->sampling;
  if (!isnan(p->temperature)) {
    s->temperature = (float)p->temperature;
    s->greedy = p->temperature == 0;
  }
  if (!isnan(p->top_p)) s->top_p = (float)p->top_p;
  if (p->top_k >= 0) s->top_k = p->top_k > INT32_MAX ? 0 : (int32_t)p->top_k;
  if (!isnan(p->min_p)) s->min_p = (float)p->min_p;
  if (!isnan(p->repetition_penalty)) s->repetition_penalty = (float)p->repetition_penalty;
  if (!isnan(p->presence_penalty)) s->presence_penalty = (float)p->presence_penalty;
  if (!isnan(p->frequency_penalty)) s->frequency_penalty = (float)p->frequency_penalty;
  s->seed = p->has_seed ? p->seed : random_seed();
  s->typical_p = (float)p->typical_p;
  s->xtc_probability = (float)p->xtc_probability;
  s->xtc_threshold = (float)p->xtc_threshold;
  s->dry_multiplier = (float)p->dry_multiplier;
  s->dry_base = (float)p->dry_base;
  int rc;
  if ((rc = int_field(p->dry_allowed_length, 0, INT32_MAX, "dry_allowed_length", &s->dry_allowed_length, err)) ||
      (rc = int_field(p->dry_penalty_last_n, -1, INT32_MAX, "dry_penalty_last_n", &s->dry_penalty_last_n, err)))
    return rc;
  s->mirostat = p->mirostat;
  s->mirostat_tau = (float)p->mirostat_tau;
  s->mirostat_eta = (float)p->mirostat_eta;
  if (p->dry_multiplier > 0 && p->dry_base >= 1 && p->dry_penalty_last_n != 0 &&
      (rc = dry_breakers_for(hm, p, s, breakers, err)))
    return rc;
  s->logprobs = p->logprobs;
  s->top_logprobs = p->logprobs ? p->top_logprobs : 0;
  if (p->n_logit_bias < 0 || (p->n_logit_bias && !p->logit_bias))
    return herr_set_at(err, HEARTH_EINVAL, "logit_bias", 0, "logit_bias: bad entry count %d", p->n_logit_bias);
  if (p->n_logit_bias) {
    *bias = malloc(sizeof(sample_bias) * (size_t)p->n_logit_bias);
    if (!*bias) return herr_set(err, HEARTH_ENOMEM, "out of memory");
    for (int i = 0; i < p->n_logit_bias; i++) {
      (*bias)[i].id = p->logit_bias[i].id;
      (*bias)[i].bias = p->logit_bias[i].bias;
    }
    s->logit_bias = *bias;
    s->n_logit_bias = (size_t)p->n_logit_bias;
  }
  if (p->n_stop < 0 || (p->n_stop && !p->stop)) return herr_set_at(err, HEARTH_EINVAL, "stop", 0, "stop: bad entry count %d", p->n_stop);
  r->stop = p->stop;
  r->n_stop = (size_t)p->n_stop;
  r->max_tokens = p->max_tokens;
  r->context_length = hm->context_length;
  memcpy(r->eos_ids, hm->eos, sizeof(int32_t) * (size_t)hm->n_eos);
  r->n_eos = hm->n_eos;
  r->ignore_eos = p->ignore_eos;
  r->skip_special = p->skip_special;
  r->prefill_chunk = p->prefill_chunk;
  r->cancel = p->cancel;
  r->trace_label = p->trace_label;
  r->priority = p->priority;
  if (p->spec_tokens < -1 || p->spec_tokens > GEN_MAX_SPEC_TOKENS)
    return herr_set_at(err, HEARTH_EINVAL, "spec_tokens", 0, "spec_tokens %d must be from 0 to %d", p->spec_tokens,
                       GEN_MAX_SPEC_TOKENS);
  r->spec_tokens = p->spec_tokens;
  r->spec_method = p->spec_method;
  return 0;
}

/* Bridges the engine's per-token callback to the public one, decoding the
 * token's own text and its alternatives when asked. */
typedef struct api_cb {
  const hearth_model *hm;
  hearth_token_fn fn;
  void *user;
  bool logprobs;
  hbuf texts;                 /* owned: the token and alternatives' bytes */
} api_cb;

static int forward_token(void *user, const char *delta, size_t len, const sample_token *st) {
  api_cb *cb = user;
  if (!cb->fn) return 0;
  if (!st) return cb->fn(cb->user, delta, len, NULL);
  hearth_top_logprob top[HEARTH_MAX_TOP_LOGPROBS];
  hearth_token t = {.id = st->id, .text = "", .len = 0, .logprob = st->logprob, .top = top, .n_top = 0};
  if (cb->hm->tok) {
    /* offsets first, pointers after: the buffer may move while it grows */
    size_t offs[HEARTH_MAX_TOP_LOGPROBS + 1], lens[HEARTH_MAX_TOP_LOGPROBS + 1];
    int n_top = cb->logprobs ? st->n_top : 0;
    hbuf_clear(&cb->texts);
    for (int i = 0; i <= n_top; i++) {
      int32_t id = i == 0 ? st->id : st->top_ids[i - 1];
      offs[i] = cb->texts.len;
      if (tokenizer_decode(cb->hm->tok, &id, 1, false, &cb->texts, NULL)) cb->texts.len = offs[i];
      lens[i] = cb->texts.len - offs[i];
    }
    const char *base = cb->texts.data ? cb->texts.data : "";
    if (cb->texts.oom) n_top = -1;
    if (n_top >= 0) {
      t.text = base + offs[0];
      t.len = lens[0];
      for (int i = 0; i < n_top; i++) {
        top[i].id = st->top_ids[i];
        top[i].logprob = st->top_logprobs[i];
        top[i].text = base + offs[i + 1];
        top[i].len = lens[i + 1];
      }
      t.n_top = n_top;
    }
  } else if (cb->logprobs) {
    for (int i = 0; i < st->n_top; i++)
      top[i] = (hearth_top_logprob){.id = st->top_ids[i], .logprob = st->top_logprobs[i], .text = "", .len = 0};
    t.n_top = st->n_top;
  }
  return cb->fn(cb->user, delta, len, &t);
}

/* The scheduler, started on first use. */
static int ensure_sched(hearth_model *hm, herr *err) {
  int rc = 0;
  pthread_mutex_lock(&hm->gen_lock);
  if (!hm->sch) rc = sched_new(hm->m, hm->tok, &hm->sch_cfg, &hm->sch, err);
  pthread_mutex_unlock(&hm->gen_lock);
  return rc;
}

int hearth_start(hearth_model *hm, hearth_error *err) {
  if (!hm) return herr_set(err, HEARTH_EINVAL, "hearth_start: no model");
  if (model_canvas_length(hm->m) > 0) return 0; /* denoising runs keep their KV in caches of their own */
  return ensure_sched(hm, err);
}

int hearth_admit(hearth_model *hm, int64_t prompt_tokens, int64_t max_tokens, hearth_error *err) {
  if (model_canvas_length(hm->m) > 0) return 0; /* denoising runs keep their KV in caches of their own */
  int rc = ensure_sched(hm, err);
  return rc ? rc : sched_admit(hm->sch, prompt_tokens, max_tokens, err);
}

/* ---- LoRA adapters ---- */

static bool adapter_name_ok(const char *name) {
  size_t n = name ? strlen(name) : 0;
  if (n == 0 || n >= HEARTH_ADAPTER_NAME_MAX || !strcmp(name, "none")) return false;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
      return false;
  }
  return true;
}

static int adapter_find(const hearth_model *hm, const char *name, size_t len) {
  for (int i = 0; i < hm->n_ads; i++)
    if (strlen(hm->ads[i].name) == len && !memcmp(hm->ads[i].name, name, len)) return i;
  return -1;
}

int hearth_adapter_load(hearth_model *hm, const char *name, const char *path, hearth_error *err) {
  if (!hm || !path) return herr_set(err, HEARTH_EINVAL, "hearth_adapter_load: no model or path");
  if (!adapter_name_ok(name))
    return herr_set_at(err, HEARTH_EINVAL, "name", 0,
                       "adapter name '%s': use 1 to %d letters, digits, '.', '_' or '-' (and not \"none\")", name ? name : "",
                       HEARTH_ADAPTER_NAME_MAX - 1);
  pthread_mutex_lock(&hm->ad_lock);
  bool taken = adapter_find(hm, name, strlen(name)) >= 0;
  pthread_mutex_unlock(&hm->ad_lock);
  if (taken) return herr_set_at(err, HEARTH_EINVAL, "name", 0, "an adapter named '%s' is already loaded", name);
  model_lora *a = NULL;
  int rc = model_lora_load(hm->m, path, &a, err);
  if (rc) return rc;
  pthread_mutex_lock(&hm->ad_lock);
  if (adapter_find(hm, name, strlen(name)) >= 0) rc = herr_set_at(err, HEARTH_EINVAL, "name", 0, "an adapter named '%s' is already loaded", name);
  else if (hm->n_ads == hm->cap_ads && !HGROW(hm->ads, hm->cap_ads, hm->n_ads + 1)) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
  else {
    api_adapter *d = &hm->ads[hm->n_ads++];
    snprintf(d->name, sizeof d->name, "%s", name);
    d->a = a;
    a = NULL;
  }
  pthread_mutex_unlock(&hm->ad_lock);
  model_lora_release(a); /* only when it was not kept */
  if (!rc) HLOG_INFO("adapter '%s' loaded from %s", name, path);
  return rc;
}

int hearth_adapter_unload(hearth_model *hm, const char *name, hearth_error *err) {
  if (!hm || !name) return herr_set(err, HEARTH_EINVAL, "hearth_adapter_unload: no model or name");
  pthread_mutex_lock(&hm->ad_lock);
  int i = adapter_find(hm, name, strlen(name));
  model_lora *a = NULL;
  if (i >= 0) {
    a = hm->ads[i].a;
    memmove(&hm->ads[i], &hm->ads[i + 1], sizeof hm->ads[0] * (size_t)(hm->n_ads - i - 1));
    hm->n_ads--;
  }
  pthread_mutex_unlock(&hm->ad_lock);
  if (!a) return herr_set_at(err, HEARTH_ENOTFOUND, "adapter", 0, "no adapter named '%s' is loaded", name);
  model_lora_release(a); /* freed now, or when the last request under it ends */
  HLOG_INFO("adapter '%s' unloaded", name);
  return 0;
}

int hearth_adapter_list(hearth_model *hm, hearth_adapter_info *out, int max) {
  if (!hm) return 0;
  pthread_mutex_lock(&hm->ad_lock);
  int n = hm->n_ads;
  for (int i = 0; i < n && i < max && out; i++) {
    hearth_adapter_info *o = &out[i];
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", hm->ads[i].name);
    snprintf(o->path, sizeof o->path, "%s", model_lora_path(hm->ads[i].a));
    o->rank = model_lora_rank(hm->ads[i].a);
    o->modules = model_lora_modules(hm->ads[i].a);
    o->in_use = model_lora_refs(hm->ads[i].a) - 1;
  }
  pthread_mutex_unlock(&hm->ad_lock);
  return n;
}

/* The adapters `spec` names ("a", "a+b"; NULL, "" or "none": none), each
 * with a reference the caller gives back (adapters_release). */
static int adapters_acquire(hearth_model *hm, const char *spec, model_lora **out, int *n, herr *err) {
  *n = 0;
  if (!spec || !*spec || !strcmp(spec, "none")) return 0;
  int rc = 0;
  pthread_mutex_lock(&hm->ad_lock);
  for (const char *p = spec; !rc;) {
    const char *e = strchr(p, '+');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    int i = adapter_find(hm, p, len);
    if (*n == MODEL_MAX_LORA)
      rc = herr_set_at(err, HEARTH_EINVAL, "adapter", 0, "adapter '%s': at most %d adapters stack", spec, MODEL_MAX_LORA);
    else if (i < 0)
      rc = herr_set_at(err, HEARTH_ENOTFOUND, "adapter", 0, "adapter '%.*s' is not loaded (GET /v1/adapters lists them)", (int)len, p);
    else {
      for (int j = 0; j < *n; j++)
        if (out[j] == hm->ads[i].a) rc = herr_set_at(err, HEARTH_EINVAL, "adapter", 0, "adapter '%.*s' is named twice", (int)len, p);
      if (!rc) {
        model_lora_retain(hm->ads[i].a);
        out[(*n)++] = hm->ads[i].a;
      }
    }
    if (!e) break;
    p = e + 1;
  }
  pthread_mutex_unlock(&hm->ad_lock);
  if (rc) {
    for (int j = 0; j < *n; j++) model_lora_release(out[j]);
    *n = 0;
  }
  return rc;
}

int hearth_generate(hearth_model *hm, const hearth_prompt *prompt, const hearth_gen_params *params, hearth_token_fn fn,
                    void *user, hearth_gen_result *result, hearth_error *err) {
  hearth_gen_result local;
  hearth_gen_result *res = result ? result : &local;
  memset(res, 0, sizeof *res);
  res->stop_index = -1;
  res->stop_token = -1;
  if (!hm || !prompt) return herr_set(err, HEARTH_EINVAL, "hearth_generate: no model or prompt");
  hearth_gen_params defaults;
  if (!params) {
    hearth_gen_params_init(&defaults);
    params = &defaults;
  }
  int rc = 0;
  int32_t *ids = NULL; /* owned when the prompt is text */
  size_t n_ids = 0;
  sample_bias *bias = NULL;
  sample_dry_breaker *breakers = NULL; /* a request's own DRY breakers */
  hbuf gbnf = {0}; /* a schema's grammar */
  api_cb cb = {.hm = hm, .fn = fn, .user = user, .logprobs = params->logprobs};
  gen_request req;
  gen_request_init(&req);
  model_lora *lora[MODEL_MAX_LORA];
  int n_lora = 0;
  mm_prompt mp = {0};
  if ((rc = fill_request(hm, params, &req, &bias, &breakers, err))) goto out;
  if ((rc = adapters_acquire(hm, params->adapter, lora, &n_lora, err))) goto out;
  req.lora = (const model_lora *const *)lora;
  req.n_lora = n_lora;
  if (params->grammar && params->json_schema) {
    rc = herr_set(err, HEARTH_EINVAL, "hearth_generate: give a grammar or a JSON schema, not both");
    goto out;
  }
  if (params->json_schema) {
    if ((rc = json_schema_to_gbnf(params->json_schema, strlen(params->json_schema), &gbnf, err))) goto out;
    req.grammar = hbuf_str(&gbnf);
    req.grammar_len = gbnf.len;
  } else if (params->grammar) {
    req.grammar = params->grammar;
    req.grammar_len = strlen(params->grammar);
  }
  if (prompt->n_media > 0) { /* images, sound, video: expanded, tokenized and encoded (mm_prompt.h) */
    if (!prompt->text || prompt->ids) {
      rc = herr_set(err, HEARTH_EINVAL, "hearth_generate: media go with a text prompt");
      goto out;
    }
    if ((rc = need_tokenizer(hm, err))) goto out;
    mm_prompt_opts mo = {.allow_local = hm->allow_local_media, .allow_remote = hm->allow_remote_media,
                         .allow_private_hosts = hm->allow_private_media_hosts, .max_bytes = hm->max_media_bytes};
    size_t tl = prompt->text_len ? prompt->text_len : strlen(prompt->text);
    if ((rc = mm_prompt_build(hm->m, hm->id, hm->tok, prompt->text, tl, prompt->add_special, prompt->media, prompt->n_media,
                              &mo, &mp, err)))
      goto out;
    req.prompt = mp.ids;
    req.n_prompt = mp.n;
    req.embeds = mp.embeds;
    req.bidir_last = mp.bidir_last;
    req.positions3 = mp.positions3;
    req.pos_delta = mp.pos_delta;
    req.prefix_keys = mp.keys;
    req.spec_tokens = 0; /* drafts know nothing of the media rows */
  } else if (prompt->ids) {
    req.prompt = prompt->ids;
    req.n_prompt = prompt->n_ids;
  } else if (prompt->text) {
    if ((rc = hearth_tokenize(hm, prompt->text, prompt->text_len, prompt->add_special, &ids, &n_ids, err))) goto out;
    req.prompt = ids;
    req.n_prompt = n_ids;
  } else {
    rc = herr_set(err, HEARTH_EINVAL, "hearth_generate: the prompt has neither text nor ids");
    goto out;
  }
  gen_result gr;
  memset(&gr, 0, sizeof gr);
  if (model_canvas_length(hm->m) > 0) { /* block diffusion: a denoising run in the scheduler */
    const char *host = sample_params_host_field(&req.sample);
    if (host) {
      rc = herr_set_at(err, HEARTH_EUNSUPPORTED, host, 0, "'%s' is not supported on a block-diffusion model, whose tokens are "
                       "not drawn one after another", host);
      goto out;
    }
    if (req.grammar) {
      rc = herr_set_at(err, HEARTH_EUNSUPPORTED, params->json_schema ? "response_format" : "grammar", 0,
                       "a grammar or JSON schema cannot constrain a block-diffusion model's output");
      goto out;
    }
  }
  if ((rc = ensure_sched(hm, err))) goto out;
  if (req.max_tokens < 0 && model_canvas_length(hm->m) <= 0) {
    /* "up to the context" stops where the KV cache is full too: a context the
     * machine cannot hold would otherwise never end */
    sched_stats st;
    sched_get_stats(hm->sch, &st);
    int64_t hold = st.blocks_total * (int64_t)st.block_tokens;
    int64_t ctx = hm->context_length > 0 ? hm->context_length : model_cfg(hm->m)->max_position_embeddings;
    if (hold > (int64_t)req.n_prompt && (ctx <= 0 || hold < ctx)) req.max_tokens = hold - (int64_t)req.n_prompt;
  }
  rc = sched_run(hm->sch, &req, forward_token, &cb, &gr, err);
  res->finish_reason = (hearth_finish)gr.finish;
  res->stop_index = gr.stop_index;
  res->stop_token = gr.stop_token;
  res->prompt_tokens = gr.prompt_tokens;
  res->completion_tokens = gr.completion_tokens;
  res->cached_tokens = gr.cached_tokens;
  res->prefill_seconds = gr.prefill_seconds;
  res->decode_seconds = gr.decode_seconds;
  res->queue_seconds = gr.queue_seconds;
out:
  for (int i = 0; i < n_lora; i++) model_lora_release(lora[i]); /* the last may free an unloaded adapter */
  hbuf_free(&cb.texts);
  hbuf_free(&gbnf);
  free(ids);
  free(bias);
  free(breakers);
  mm_prompt_free(&mp);
  return rc;
}

const char *hearth_media_placeholder(const hearth_model *hm, hearth_media_kind kind) {
  if (!hm || (unsigned)kind >= MEDIA_KINDS) return NULL;
  return mm_prompt_placeholder(hm->m, (media_kind)kind);
}

void hearth_get_stats(hearth_model *hm, hearth_stats *out) {
  memset(out, 0, sizeof *out);
  model_expert_stats xs;
  model_expert_stats_of(hm->m, &xs);
  out->expert_budget = xs.budget, out->expert_resident_bytes = xs.resident, out->expert_page_ins = xs.page_ins;
  pthread_mutex_lock(&hm->gen_lock);
  sched *s = hm->sch;
  pthread_mutex_unlock(&hm->gen_lock);
  if (!s) return;
  sched_stats st;
  sched_get_stats(s, &st);
  out->running = st.running;
  out->waiting = st.waiting;
  out->kv_blocks_total = st.blocks_total;
  out->kv_blocks_used = st.blocks_used;
  out->kv_blocks_cached = st.blocks_cached;
  out->kv_blocks_free = st.blocks_free;
  out->kv_block_tokens = st.block_tokens;
  out->kv_block_bytes = (int64_t)st.block_bytes;
  snprintf(out->kv_format, sizeof out->kv_format, "%s", st.kv_format);
  out->prefix_hit_tokens = st.prefix_hit_tokens;
  out->prefix_miss_tokens = st.prefix_miss_tokens;
  out->prompt_tokens = st.prompt_tokens;
  out->generated_tokens = st.generated_tokens;
  out->busy_seconds = st.busy_seconds;
  out->requests_finished = st.requests_finished;
  out->requests_cancelled = st.requests_cancelled;
  out->requests_refused = st.requests_refused;
  out->preemptions = st.preemptions;
  out->steps = st.steps;
  for (int i = 0; i < HEARTH_SPEC_SOURCES && i < SPEC_N_SOURCES; i++) {
    out->spec_steps[i] = st.spec_steps[i];
    out->spec_drafted[i] = st.spec_drafted[i];
    out->spec_accepted[i] = st.spec_accepted[i];
  }
  out->kv_store = st.kv_store;
  out->kv_store_blocks = st.store.files;
  out->kv_store_bytes = st.store.bytes;
  out->kv_store_written = st.store.saved;
  out->kv_store_read = st.store.loaded;
  out->kv_store_removed = st.store.removed;
  out->kv_store_rejected = st.store.rejected;
  out->kv_store_hit_tokens = st.store.hit_tokens;
  out->kv_store_pending = st.store.pending;
  out->kv_store_dropped = st.store.dropped;
}

_Static_assert(HEARTH_SPEC_SOURCES == SPEC_N_SOURCES, "hearth_stats' spec_* arrays are indexed by spec_source");

/* ---- embeddings and the next-token signal ------------------------------- */

/* The ids of one input: its own, or its text (with the instruction's query
 * form when given) tokenized. *owned: what to free. */
static int input_ids(const hearth_model *hm, const hearth_prompt *in, const char *instruction, const int32_t **ids,
                     size_t *n, int32_t **owned, herr *err) {
  *owned = NULL;
  if (in->ids) {
    *ids = in->ids;
    *n = in->n_ids;
    return 0;
  }
  if (!in->text) return herr_set(err, HEARTH_EINVAL, "the input has neither text nor ids");
  size_t len = in->text_len ? in->text_len : strlen(in->text);
  int rc;
  if (instruction) {
    hbuf b = {0};
    hbuf_printf(&b, "Instruct: %s\nQuery:", instruction);
    hbuf_append(&b, in->text, len);
    rc = b.oom ? herr_set(err, HEARTH_ENOMEM, "out of memory") : hearth_tokenize(hm, b.data, b.len, in->add_special, owned, n, err);
    hbuf_free(&b);
  } else {
    rc = hearth_tokenize(hm, in->text, len, in->add_special, owned, n, err);
  }
  *ids = *owned;
  return rc;
}

int hearth_embed(hearth_model *hm, const hearth_prompt *inputs, size_t n, const hearth_embed_opts *opts, float *out,
                 int64_t *prompt_tokens, hearth_error *err) {
  if (prompt_tokens) *prompt_tokens = 0;
  if (!hm || !inputs || !out) return herr_set(err, HEARTH_EINVAL, "hearth_embed: no model, inputs or output");
  if (n == 0) return herr_set(err, HEARTH_EINVAL, "hearth_embed: no inputs");
  if (n > INT32_MAX) return herr_set(err, HEARTH_ELIMIT, "hearth_embed: %zu inputs is too many", n);
  if (hm->pooling.unsupported[0]) return herr_set(err, HEARTH_EUNSUPPORTED, "%s", hm->pooling.unsupported);
  pool_mode mode = hm->pooling.mode;
  sched_pool pool = mode == POOL_MEAN || mode == POOL_MEAN_SQRT ? SCHED_POOL_SUM
                    : mode == POOL_WEIGHTED                   ? SCHED_POOL_WSUM
                    : mode == POOL_MAX                        ? SCHED_POOL_MAX
                                                              : SCHED_POOL_LAST;
  int64_t D = model_cfg(hm->m)->hidden_size;
  int dim = opts && opts->dimensions ? opts->dimensions : (int)D;
  if (dim < 1 || dim > D)
    return herr_set(err, HEARTH_EINVAL, "dimensions is %d but the model's embeddings have %lld (1 to %lld)", dim,
                    (long long)D, (long long)D);
  const char *instruction = opts ? opts->instruction : NULL;
  sched_probe *probes = calloc(n, sizeof *probes);
  int32_t **owned = calloc(n, sizeof *owned);
  float *hidden = malloc(sizeof(float) * n * (size_t)D);
  int rc = 0;
  if (!probes || !owned || !hidden) {
    rc = herr_set(err, HEARTH_ENOMEM, "hearth_embed: out of memory for %zu inputs", n);
    goto out;
  }
  int64_t total = 0;
  for (size_t i = 0; i < n && !rc; i++) {
    if ((rc = input_ids(hm, &inputs[i], instruction, &probes[i].ids, &probes[i].n_ids, &owned[i], err))) {
      herr_wrap(err, "input %zu", i);
      break;
    }
    probes[i].out = hidden + i * (size_t)D;
    probes[i].pool = pool;
    total += (int64_t)probes[i].n_ids;
    /* the first token's state: in a causal model it sees only that token */
    if (mode == POOL_CLS) probes[i].n_ids = 1;
  }
  if (!rc) rc = ensure_sched(hm, err);
  if (!rc) rc = sched_probe_run(hm->sch, SCHED_EMBED, probes, (int)n, opts ? opts->cancel : NULL, err);
  if (!rc) {
    for (size_t i = 0; i < n; i++) {
      float *v = out + i * (size_t)dim, *h = hidden + i * (size_t)D;
      double nt = (double)probes[i].n_ids;
      double div = mode == POOL_MEAN ? nt : mode == POOL_MEAN_SQRT ? sqrt(nt) : mode == POOL_WEIGHTED ? nt * (nt + 1) / 2 : 1;
      for (int64_t d = 0; d < D; d++) h[d] = (float)(h[d] / div);
      memcpy(v, h, sizeof(float) * (size_t)dim);
      op_l2_normalize(v, dim);
    }
    if (prompt_tokens) *prompt_tokens = total;
  }
out:
  for (size_t i = 0; owned && i < n; i++) free(owned[i]);
  free(owned);
  free(probes);
  free(hidden);
  return rc;
}

int hearth_signal(hearth_model *hm, const hearth_prompt *prompt, int n_bins, int n_top, const volatile int *cancel,
                  hearth_signal_result *out, hearth_error *err) {
  memset(out, 0, sizeof *out);
  if (!hm || !prompt) return herr_set(err, HEARTH_EINVAL, "hearth_signal: no model or prompt");
  if (n_bins < 1 || n_bins > HEARTH_SIGNAL_MAX_BINS)
    return herr_set(err, HEARTH_EINVAL, "bins must be between 1 and %d, not %d", HEARTH_SIGNAL_MAX_BINS, n_bins);
  if (n_top < 0 || n_top > HEARTH_MAX_TOP_LOGPROBS)
    return herr_set(err, HEARTH_EINVAL, "top must be between 0 and %d, not %d", HEARTH_MAX_TOP_LOGPROBS, n_top);
  if (!model_has_head(hm->m))
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s: the model has no output head (no lm_head.weight): it embeds only", hm->id);
  int64_t V = model_vocab_size(hm->m);
  sched_probe p = {0};
  int32_t *owned = NULL;
  float *logits = malloc(sizeof(float) * (size_t)V);
  int rc = logits ? 0 : herr_set(err, HEARTH_ENOMEM, "hearth_signal: out of memory for %lld logits", (long long)V);
  if (!rc) rc = input_ids(hm, prompt, NULL, &p.ids, &p.n_ids, &owned, err);
  p.out = logits;
  if (!rc) rc = ensure_sched(hm, err);
  if (!rc) rc = sched_probe_run(hm->sch, SCHED_NEXT_LOGITS, &p, 1, cancel, err);
  if (!rc) rc = logit_signal(logits, V, n_bins, n_top, out, err);
  if (!rc) {
    out->prompt_tokens = (int64_t)p.n_ids;
    out->cached_tokens = p.cached_tokens;
  }
  free(owned);
  free(logits);
  return rc;
}

int hearth_prompt_logprobs(hearth_model *hm, const int32_t *ids, size_t n_ids, int n_top, const volatile int *cancel,
                           hearth_prompt_logprob *out, hearth_error *err) {
  if (!hm || !ids || !out || n_ids == 0) return herr_set(err, HEARTH_EINVAL, "hearth_prompt_logprobs: no model or prompt");
  if (n_top < 0 || n_top > HEARTH_MAX_TOP_LOGPROBS)
    return herr_set(err, HEARTH_EINVAL, "top must be between 0 and %d, not %d", HEARTH_MAX_TOP_LOGPROBS, n_top);
  if (!model_has_head(hm->m))
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s: the model has no output head (no lm_head.weight): it embeds only", hm->id);
  if (model_canvas_length(hm->m) > 0)
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s: a block-diffusion model does not score a prompt token by token", hm->id);
  sample_token *lp = calloc(n_ids, sizeof *lp);
  if (!lp) return herr_set(err, HEARTH_ENOMEM, "hearth_prompt_logprobs: out of memory for %zu tokens", n_ids);
  sched_probe p = {.ids = ids, .n_ids = n_ids, .lp = lp, .n_top = n_top};
  int rc = ensure_sched(hm, err);
  if (!rc) rc = sched_probe_run(hm->sch, SCHED_PROMPT_LOGPROBS, &p, 1, cancel, err);
  for (size_t i = 0; !rc && i < n_ids; i++) {
    hearth_prompt_logprob *o = &out[i];
    memset(o, 0, sizeof *o);
    o->id = ids[i];
    o->logprob = i == 0 ? NAN : lp[i].logprob;
    o->n_top = i == 0 ? 0 : lp[i].n_top;
    for (int k = 0; k < o->n_top; k++) {
      o->top_ids[k] = lp[i].top_ids[k];
      o->top_logprobs[k] = lp[i].top_logprobs[k];
    }
  }
  free(lp);
  return rc;
}

int hearth_model_fit(hearth_model *hm, const hearth_fit_opts *opts, hearth_fit_result *out, hearth_error *err) {
  hearth_fit_opts o = opts ? *opts : (hearth_fit_opts){0};
  if (o.context <= 0) o.context = hm->context_length;
  if (o.threads <= 0) o.threads = hm->threads;
  /* what the model holds already counts as available to it: its weights and its KV pool */
  int64_t held = (int64_t)model_weight_bytes(hm->m);
  pthread_mutex_lock(&hm->gen_lock);
  if (hm->sch) {
    sched_stats st;
    sched_get_stats(hm->sch, &st);
    held += st.blocks_total * (int64_t)st.block_bytes; /* blocks as stored: quantized ones are smaller */
  }
  /* the KV formats the engine was loaded with, not the caller's */
  int rc = fit_model(hm->path, &o, &hm->sch_cfg.kv_quant, model_backend(hm->m), held, &hm->fit_bandwidth, out, err);
  pthread_mutex_unlock(&hm->gen_lock);
  if (!rc && hm->context_length < out->context_length) { /* the served context is the limit */
    out->context_length = hm->context_length;
    if (out->max_context > out->context_length) out->max_context = out->context_length;
  }
  return rc;
}

/* ---- batches: many generations from a few threads, order kept by index ---- */

typedef struct batch_run {
  hearth_model *m;
  hearth_batch_item *items;
  size_t n, next; /* next: the first item no thread has taken (under mu) */
  pthread_mutex_t mu;
} batch_run;

static int batch_token(void *user, const char *text, size_t len, const hearth_token *tok) {
  (void)tok;
  hbuf *b = user;
  hbuf_append(b, text, len);
  return 0;
}

static void *batch_main(void *arg) {
  batch_run *br = arg;
  for (;;) {
    pthread_mutex_lock(&br->mu);
    size_t i = br->next < br->n ? br->next++ : br->n;
    pthread_mutex_unlock(&br->mu);
    if (i == br->n) return NULL;
    hearth_batch_item *it = &br->items[i];
    hbuf b = {0};
    it->status = hearth_generate(br->m, &it->prompt, it->params, batch_token, &b, &it->result, &it->error);
    if (b.oom && !it->status) it->status = herr_set(&it->error, HEARTH_ENOMEM, "out of memory for item %zu's text", i);
    it->len = b.len;
    it->text = hbuf_take(&b);
    if (!it->text) it->text = calloc(1, 1), it->len = 0;
    hbuf_free(&b);
  }
}

int hearth_generate_batch(hearth_model *m, hearth_batch_item *items, size_t n, int max_in_flight, hearth_error *err) {
  if (!m || (!items && n)) return herr_set(err, HEARTH_EINVAL, "hearth_generate_batch: no model or items");
  for (size_t i = 0; i < n; i++) {
    items[i].text = NULL;
    items[i].len = 0;
    items[i].status = 0;
    memset(&items[i].error, 0, sizeof items[i].error);
  }
  if (n == 0) return 0;
  size_t nt = max_in_flight <= 0 ? 256 : (size_t)max_in_flight;
  if (nt > 256) nt = 256;
  if (nt > n) nt = n;
  batch_run br = {.m = m, .items = items, .n = n};
  pthread_mutex_init(&br.mu, NULL);
  pthread_t *th = calloc(nt, sizeof *th);
  size_t started = 0;
  for (size_t t = 0; th && t < nt; t++, started++)
    if (pthread_create(&th[t], NULL, batch_main, &br) != 0) break;
  if (started == 0) batch_main(&br); /* no threads to be had: one after another here */
  for (size_t t = 0; t < started; t++) pthread_join(th[t], NULL);
  free(th);
  pthread_mutex_destroy(&br.mu);
  return 0;
}

void hearth_batch_free(hearth_batch_item *items, size_t n) {
  for (size_t i = 0; items && i < n; i++) {
    free(items[i].text);
    items[i].text = NULL;
    items[i].len = 0;
  }
}
