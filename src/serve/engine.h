/* engine.h — what the HTTP server needs from a model, as a struct of function
 * pointers: the model's id and context, chat rendering, token counting, and
 * generation with a per-token callback and a cancel flag. `hearth serve` fills
 * it from the public API (engine_hearth.c); tests fill it with a fake. The
 * server never sees a tokenizer, a tensor or a sampler. */
#ifndef HEARTH_SERVE_ENGINE_H
#define HEARTH_SERVE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <stdlib.h>

#include "base/status.h"
#include "hearth.h"

/* One chat message, content already flattened to text. */
typedef struct serve_message {
  char *role;    /* owned */
  char *content; /* owned, never NULL ("" for an empty or null content) */
  json_t *extra; /* owned, may be NULL: further keys the template sees (tool_calls with
                  * arguments as objects, tool_call_id, name, reasoning_content) */
  json_t *parts; /* owned, may be NULL: when the message holds media, its content as the template
                  * sees it instead of `content`: [{"type":"text","text":...}, {"type":"image"}, ...]
                  * (the media themselves are the request's, serve_request.media, in order) */
} serve_message;

/* What a chat is rendered with besides its messages (all borrowed, may be NULL). */
typedef struct serve_chat_opts {
  const json_t *tools;  /* the request's tools, [{"type":"function","function":{...}}] */
  const json_t *kwargs; /* further template variables (enable_thinking, reasoning_effort, ...) */
  bool no_generation_prompt; /* add_generation_prompt false: the chat ends after its last message */
  bool continue_final;  /* continue_final_message: rendered without the generation prompt and cut
                         * after the final message's text (chat_continue_final), which the model continues */
} serve_chat_opts;

/* Sampling and limits: the public API's own struct (hearth.h), so one
 * request's parameters live in one shape from the HTTP parser to the engine.
 * Fields left unset (NAN for reals, -1 for integers, has_seed false) take the
 * model's generation_config.json defaults. A parsed request owns stop (and
 * its strings) and logit_bias. skip_special false keeps special tokens in the
 * text (tool-call and reasoning markers are parsed from it). */
typedef hearth_gen_params serve_sampling;

/* One alternative token and its log-probability. */
typedef struct serve_top_logprob {
  const char *text; /* borrowed for the callback */
  size_t len;
  float logprob;
} serve_top_logprob;

/* What one decode step releases. `text` is the output text that became final
 * in this step (possibly empty while a stop string or a UTF-8 sequence is held
 * back); the rest describes the sampled token itself, for logprobs. A last
 * call with `flush` set carries held-back text and no token. */
typedef struct serve_token {
  bool flush;
  const char *text; /* borrowed for the callback */
  size_t len;
  int32_t id;
  const char *token_text; /* borrowed: the token's own decoded bytes */
  size_t token_len;
  float logprob;
  const serve_top_logprob *top; /* borrowed; ntop entries */
  int ntop;
} serve_token;

/* Return nonzero to stop generating (the result is then "cancelled"). */
typedef int (*serve_token_fn)(void *ctx, const serve_token *tok);

typedef enum serve_finish { SERVE_FINISH_STOP = 0, SERVE_FINISH_LENGTH = 1, SERVE_FINISH_CANCELLED = 2 } serve_finish;

typedef struct serve_result {
  serve_finish finish;
  int64_t prompt_tokens, completion_tokens;
  int64_t cached_tokens; /* prompt tokens served from the prefix cache */
  int stop_index;        /* the entry of sampling.stop that ended it; -1: none (EOS, length) */
  double queue_seconds;  /* waiting in the engine's queue before it was first computed; < 0: unknown */
} serve_result;

/* One input of an embeddings request: text (tokenized as a raw prompt,
 * with the model's BOS/EOS as its tokenizer adds them) or token ids. */
typedef struct serve_embed_input {
  char *text;       /* owned, or NULL when ids */
  size_t len;       /* bytes of text */
  int32_t *ids;     /* owned, or NULL when text */
  size_t n_ids;
} serve_embed_input;

/* The next-token signal of a prompt (hearth_signal_result), with the top
 * tokens' text. */
typedef struct serve_signal {
  hearth_signal_result r;
  char *top_text[HEARTH_MAX_TOP_LOGPROBS]; /* owned (serve_signal_free): decoded bytes, may be NULL */
  size_t top_len[HEARTH_MAX_TOP_LOGPROBS];
} serve_signal;

static inline void serve_signal_free(serve_signal *s) {
  for (int i = 0; i < HEARTH_MAX_TOP_LOGPROBS; i++) free(s->top_text[i]), s->top_text[i] = NULL;
}

/* The engine's serving counters, for /stats and /metrics. */
typedef struct serve_stats {
  int64_t running, waiting;
  int64_t kv_blocks_total, kv_blocks_used, kv_blocks_cached, kv_blocks_free;
  int64_t kv_block_tokens;
  int64_t kv_block_bytes;
  char kv_format[128];
  int64_t prefix_hit_tokens, prefix_miss_tokens;
  int64_t prompt_tokens, generated_tokens;
  double busy_seconds;
  int64_t requests_finished, requests_cancelled, requests_refused, preemptions, steps;
  int64_t expert_budget, expert_resident_bytes, expert_page_ins; /* 0 without an expert budget */
  /* speculative decoding per draft source (hearth_spec_source_name): verification steps, drafted, accepted */
  int64_t spec_steps[HEARTH_SPEC_SOURCES], spec_drafted[HEARTH_SPEC_SOURCES], spec_accepted[HEARTH_SPEC_SOURCES];
  /* the KV store on disk (hearth_stats' kv_store_*): kv_store false without one */
  bool kv_store;
  int64_t kv_store_blocks, kv_store_bytes, kv_store_written, kv_store_read, kv_store_removed, kv_store_rejected,
      kv_store_hit_tokens, kv_store_pending, kv_store_dropped;
} serve_stats;

typedef struct serve_engine {
  void *impl;           /* owned by whoever made the engine */
  const char *model_id; /* borrowed from impl: answered as "model" */
  int64_t context_length;
  int64_t vocab_size;   /* token ids are below this; 0: unknown */
  int64_t created;      /* unix time the model was loaded */
  bool thread_safe;     /* false: the server runs one generation at a time */
  int tool_format;      /* the chat template's tool-call syntax (tc_format of chat/toolcall.h; 0: none;
                           TC_GENERIC for a template without one) */
  bool template_tools;  /* TC_GENERIC: the template renders the request's tools itself (else the
                           server describes them in a system message) */
  bool reasoning;       /* the template knows reasoning blocks: they are split from the content */
  unsigned media_kinds;  /* 1 << hearth_media_kind for each kind of media the model takes (0: text only) */
  bool denoising;       /* a block-diffusion model: generations denoise blocks instead (no speculation) */
  const char *chat_template; /* borrowed, may be NULL: the chat template's Jinja source (shown by /api/show) */
  const char *spec_method; /* NULL: generations are autoregressive unless a request asks; else the
                              speculative draft source the model was loaded with ("ngram", "draft", ...) */
  /* Renders messages with the chat template (generation prompt appended unless o
   * says otherwise) into a malloc'd string *prompt (caller frees). o may be NULL. */
  int (*render_chat)(void *impl, const serve_message *msgs, int nmsgs, const serve_chat_opts *o, char **prompt,
                     herr *err);
  /* Number of tokens the prompt encodes to (raw: a completion prompt, which
   * gets the model's BOS the way hearth_generate would add it). */
  int (*count_tokens)(void *impl, const char *prompt, bool raw, int64_t *n, herr *err);
  /* Text → ids (add_special: the tokenizer's BOS/EOS, as HF add_special_tokens),
   * *ids malloc'd (caller frees); and ids → text (special tokens kept), *text
   * malloc'd and NUL-terminated. NULL: the engine has no tokenizer to show. */
  int (*tokenize)(void *impl, const char *text, bool add_special, int32_t **ids, size_t *n, herr *err);
  int (*detokenize)(void *impl, const int32_t *ids, size_t n, char **text, size_t *len, herr *err);
  /* Generates from a rendered (raw false) or raw prompt. Calls on_token for
   * every step; returns once finished, stopped by on_token, or *cancel is set
   * (read with __atomic_load_n or as volatile, checked every step; another
   * thread sets it). HEARTH_ELIMIT when the prompt does not fit,
   * HEARTH_ECANCELLED when cancelled. */
  int (*generate)(void *impl, const char *prompt, bool raw, const serve_sampling *s, serve_token_fn on_token,
                  void *ctx, volatile int *cancel, serve_result *res, herr *err);
  /* May be NULL (media are then refused): as generate, for a prompt holding the placeholders of
   * n_media media (hearth_prompt.media). */
  int (*generate_media)(void *impl, const char *prompt, bool raw, const hearth_media *media, int n_media,
                        const serve_sampling *s, serve_token_fn on_token, void *ctx, volatile int *cancel,
                        serve_result *res, herr *err);
  /* May be NULL (token-id prompts are then refused): as generate, for a raw
   * prompt given as n_ids token ids. */
  int (*generate_ids)(void *impl, const int32_t *ids, size_t n_ids, const serve_sampling *s, serve_token_fn on_token,
                      void *ctx, volatile int *cancel, serve_result *res, herr *err);
  /* May be NULL (echo with logprobs is then refused): each of the n ids' log-probability after the
   * ones before it and its n_top likeliest alternatives (hearth_prompt_logprobs), into out[n]. */
  int (*prompt_logprobs)(void *impl, const int32_t *ids, size_t n, int n_top, volatile int *cancel,
                         hearth_prompt_logprob *out, herr *err);
  /* May be NULL: the vocabulary has no fill-in-the-middle tokens (`suffix` and /infill are
   * refused). As hearth_fim_prompt: the ids of a FIM prompt (*ids malloc'd, caller frees). */
  int (*fim_prompt)(void *impl, const char *prefix, const char *suffix, const char *prompt,
                    const hearth_fim_chunk *extra, int n_extra, int64_t n_predict, int32_t **ids, size_t *n,
                    herr *err);
  void (*destroy)(void *impl);
  /* May be NULL. Whether a request of n_prompt tokens and max_tokens (-1:
   * unset) can ever be served: HEARTH_ELIMIT "memory_admission: ..." if not. */
  int (*admit)(void *impl, int64_t n_prompt, int64_t max_tokens, herr *err);
  /* May be NULL: then /stats reports zeros. */
  void (*stats)(void *impl, serve_stats *out);
  /* May be NULL (with embed_dim 0): no embeddings. Embeds n inputs into out
   * (n × dim floats, dim = dimensions or embed_dim), each the last token's
   * final hidden state, L2-normalised; instruction (may be NULL) puts text
   * inputs in the form "Instruct: {instruction}\nQuery:{text}". Errors as
   * hearth_embed's ("input 2: ...", "context_length_exceeded: ..."). */
  int (*embed)(void *impl, const serve_embed_input *in, int n, const char *instruction, int dimensions, float *out,
               int64_t *prompt_tokens, volatile int *cancel, herr *err);
  int64_t embed_dim;    /* the embeddings' width; 0: none */
  /* May be NULL: no /v1/signal. The next token's distribution after a
   * rendered (raw false) or raw prompt, or after ids when ids is set. */
  int (*signal)(void *impl, const char *prompt, bool raw, const int32_t *ids, size_t n_ids, int bins, int top,
                serve_signal *out, volatile int *cancel, herr *err);
  /* May be NULL: no GET /fit. The memory contract of the served model (hearth_model_fit)
   * for context tokens (<= 0: the served context) and batch sequences (<= 0: 1), as JSON text
   * (*json: free). */
  int (*fit)(void *impl, int64_t context, int batch, char **json, herr *err);
  /* May be NULL (all three): no LoRA adapters. As hearth_adapter_load / _unload / _list; a
   * request names its adapters in serve_sampling.adapter. */
  int (*adapter_load)(void *impl, const char *name, const char *path, herr *err);
  int (*adapter_unload)(void *impl, const char *name, herr *err);
  int (*adapter_list)(void *impl, hearth_adapter_info *out, int max);
  /* May be NULL (all three): the model is always loaded. Else (a model loaded on first use,
   * serve_engine_lazy) acquire loads it when it is not — waiting while it or another is being loaded,
   * unloading the least recently used idle models to fit the pool's budget — and holds it loaded until
   * release; a request acquires its engine before it reads the fields above or calls any function.
   * acquire fails with HEARTH_ELIMIT (cause memory_admission) when the model cannot fit the budget.
   * release's keep_alive_s: how long the model stays loaded once idle — < 0: as the pool says (its time
   * to live, else for good), 0: it unloads as soon as it is idle, > 0: that long (a request's keep_alive).
   * is_loaded: whether it is loaded now. */
  int (*acquire)(void *impl, herr *err);
  void (*release)(void *impl, double keep_alive_s);
  bool (*is_loaded)(void *impl);
  /* May be NULL (always loaded): unloads the model now when it is idle, else as soon as it is. */
  void (*unload)(void *impl);
} serve_engine;

/* Models loaded on first use (engine_lazy.c): a pool of lazy engines sharing a budget of bytes (the
 * size of their files) and an idle time after which a model is unloaded. budget 0: no limit;
 * ttl_s 0: none; pinned_bytes: what models outside the pool (always loaded) take of the budget. */
typedef struct serve_lazy_pool serve_lazy_pool;
int serve_lazy_pool_new(int64_t budget, double ttl_s, int64_t pinned_bytes, serve_lazy_pool **out, herr *err);
/* After every engine of the pool is closed. */
void serve_lazy_pool_free(serve_lazy_pool *p);
/* An engine named id (the name a request picks it by) of bytes, whose model open() makes on first
 * acquire (and again after an unload); close (serve_engine_close) unloads it and frees. id and ctx are
 * borrowed and must outlive the engine; *out stays where it is (it follows the loaded model's facts). */
int serve_engine_lazy(serve_lazy_pool *p, const char *id, int64_t bytes,
                      int (*open)(void *ctx, serve_engine *out, herr *err), void *ctx, serve_engine *out, herr *err);

/* How `hearth serve` configures the engine; 0 takes the default. */
typedef struct serve_engine_opts {
  int threads;             /* <= 0: one per core */
  int max_batch;           /* running sequences at most */
  int prefill_chunk;       /* prompt tokens per sequence per step */
  int step_tokens;         /* tokens per step in all (decode rows first) */
  int64_t kv_cache_bytes;  /* KV pool size */
  int64_t memory_budget;   /* requests that cannot fit are refused (400 memory_admission) */
  hearth_load_opts load;   /* device, gpu_memory_fraction, cpu_level, mmap, f32_activations (the rest is set above) */
} serve_engine_opts;

/* Loads a model folder through the public API (include/hearth.h) as an
 * engine; threads <= 0 picks one per core. serve_engine_close frees it. */
int serve_engine_open(const char *model_dir, int threads, serve_engine *out, herr *err);
int serve_engine_open_opts(const char *model_dir, const serve_engine_opts *opts, serve_engine *out, herr *err);
void serve_engine_close(serve_engine *e);

#endif
