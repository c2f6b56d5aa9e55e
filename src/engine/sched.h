/* sched.h — continuous batching: one engine thread per model that, at every
 * step, assembles ONE batch from all active sequences (the decode token of
 * each running request plus prefill chunks of new ones, under a per-step
 * token budget), runs one model_forward for it, and samples every sequence
 * with its own settings. KV lives in a paged pool (kv_paged.h) with
 * automatic prefix caching; when the pool runs dry, new requests wait and
 * the newest running one is preempted (its blocks freed, its tokens
 * recomputed later), never an out-of-memory crash.
 *
 *   sched *s; sched_new(m, tok, &cfg, &s, &err);
 *   sched_run(s, &req, fn, user, &res, &err);   // any thread; blocks until done
 *   sched_free(s);
 *
 * Callbacks run on the thread that called sched_run, in order, never inside
 * the engine's step: the engine queues each token with its text and goes on,
 * so many requests' callbacks (a server's stream formatting) run beside the
 * next forward instead of before it. sched_run returns after the last one.
 * Cancellation (*req->cancel or a callback returning nonzero) takes effect
 * within a step or two and frees the sequence's blocks; tokens made after a
 * callback asked to stop are not delivered.
 */
#ifndef HEARTH_ENGINE_SCHED_H
#define HEARTH_ENGINE_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "base/trace.h"
#include "engine/denoise.h"
#include "engine/request.h"
#include "engine/method.h"
#include "engine/kv_disk.h"
#include "engine/kv_quant.h"

#define SCHED_DEFAULT_BLOCK_TOKENS 16

typedef struct sched_config {
  int max_batch;          /* running sequences at most; <= 0: 64 */
  int prefill_chunk;      /* prompt tokens one sequence feeds per step; <= 0: GEN_DEFAULT_PREFILL_CHUNK */
  int step_tokens;        /* tokens per step (decode + prefill; decode rows first, prompts' chunks in what
                             is left); <= 0: max(prefill_chunk, max_batch); at least max_batch */
  int block_tokens;       /* rows per KV block; <= 0: SCHED_DEFAULT_BLOCK_TOKENS */
  size_t kv_bytes;        /* KV pool size; 0: a quarter of physical memory, at most 4 GiB, at most what
                             max_batch full-context sequences need */
  size_t memory_budget;   /* 0: none; else the pool is at most this, and requests are admitted against it */
  int64_t context_length; /* <= 0: the model's */
  double gpu_memory_fraction; /* on a GPU, when kv_bytes is 0: the pool takes this share of the free
                             device memory (<= 0: 0.9), at most what max_batch full-context
                             sequences need */
  void (*step_hook)(void *user); /* may be NULL: called by the engine thread before each step, with
                             no lock held (tests hold the engine at a chosen point with it) */
  void *step_hook_user;
  int64_t state_snapshots; /* a model with recurrent layers: state snapshots kept at block ends for the
                             prefix cache (each as big as one sequence's state); 0: max_batch, < 0: none.
                             The states of max_batch sequences and these are allocated at start, and
                             come out of the pool's memory when kv_bytes is 0 */
  bool backend_sampling;  /* on the CPU too, tokens are picked by bk_sample (the device path, on its
                             reference): what a GPU does, checkable here; a device always samples so */
  const char *kv_store;   /* borrowed, may be NULL: a folder that keeps the prefix cache's full blocks
                             across restarts (engine/kv_disk.h): evicted blocks are written there, the
                             rest when the scheduler is freed; prefixes read them back. Not used
                             for a model with recurrent layers (a warning says so) */
  int64_t kv_store_max;   /* bytes the folder may hold (<= 0: 4 GiB), least recently used out */
  uint64_t kv_store_model; /* the model's identity (kv_disk_model_identity): other models' blocks are ignored */
  kv_quant kv_quant;      /* how each layer's K and V are stored (all f32 when zero): kv_quant.h */
  htrace *trace;          /* borrowed, may be NULL: per-request spans (queue wait, cache lookup, prefill
                             chunks, decode steps, detokenize, the whole request) on a track per request,
                             and step spans on an "engine" track */
  const gen_method *method; /* borrowed, may be NULL (autoregressive unless a request asks): how
                             generations run (engine/method.h); a speculative sequence feeds its
                             pending token and its drafts as one chunk with a logits row at each
                             position, in the same step as the others, and its rejected drafts'
                             KV rows are cut off (prefix-cache hashes only cover committed tokens) */
  const denoise_params *denoise; /* borrowed, may be NULL (denoise_params_default): a block-diffusion model's
                             settings. On such a model (model_canvas_length > 0) every generation is a
                             denoising run (engine/denoise.h) that the engine thread steps beside the
                             batch, one forward of its own a step, its KV in a one-off cache of its own
                             (no prefix cache); the pool serves prompt-only work (probes) alone */
} sched_config;

typedef struct sched_stats {
  int64_t running, waiting;
  int64_t blocks_total, blocks_used, blocks_cached, blocks_free;
  int block_tokens;
  size_t block_bytes;                             /* one block: K and V of every layer, as stored */
  char kv_format[128];                            /* kv_format_describe of the pool: "f32", "q8", ... */
  int64_t prefix_hit_tokens, prefix_miss_tokens;  /* prompt tokens served from / not in the prefix cache */
  int64_t prompt_tokens, generated_tokens;        /* computed prompt tokens, sampled tokens (totals) */
  double busy_seconds;                            /* time spent in steps */
  int64_t requests_finished, requests_cancelled, requests_refused, preemptions, steps;
  int64_t peak_batch;                             /* the most sequences one step has run */
  int64_t peak_step_tokens;                       /* the most tokens one step has fed (at most step_tokens) */
  /* speculative decoding, per draft source (spec_source): verification steps with drafts,
     tokens drafted, drafts accepted */
  int64_t spec_steps[SPEC_N_SOURCES], spec_drafted[SPEC_N_SOURCES], spec_accepted[SPEC_N_SOURCES];
  int64_t spec_refed;                             /* recurrent layers: accepted tokens a rejection leaves to be
                                                     fed again (0 while each verified token's state is kept) */
  bool kv_store;                                  /* a KV store on disk is in use: its counters in store */
  kv_disk_stats store;
} sched_stats;

typedef struct sched sched;

int sched_new(model *m, const tokenizer *tok, const sched_config *cfg, sched **out, herr *err);
/* Stops the engine thread (requests still running end cancelled first),
 * then writes the KV store. */
void sched_free(sched *s);

/* Submits a request and waits for it (the contract of engine/request.h,
 * plus res->cached_tokens). A request that can never fit the KV pool or the
 * memory budget fails with HEARTH_ELIMIT and a message starting
 * "memory_admission:" before any work. req->prefill_chunk, when set, may
 * only lower the scheduler's chunk for this request. */
int sched_run(sched *s, const gen_request *req, gen_token_fn fn, void *user, gen_result *res, herr *err);

/* The admission check alone: can a request of n_prompt tokens and
 * max_tokens (< 0: unknown, counted as 1) ever fit? Thread-safe. */
int sched_admit(sched *s, int64_t n_prompt, int64_t max_tokens, herr *err);

void sched_get_stats(sched *s, sched_stats *out);

/* Prompt-only work ("probes"): each sequence is prefilled like any prompt —
 * in the same steps as the generations running beside it, in chunks, with
 * the prefix cache — and gives one output at its last token instead of
 * generating. */
typedef enum sched_probe_kind {
  SCHED_EMBED = 1,       /* out: hidden_size floats, the final hidden state (after the model's last norm) */
  SCHED_NEXT_LOGITS = 2, /* out: vocab floats, the logits of the token after the prompt */
  SCHED_PROMPT_LOGPROBS = 3 /* lp: for each prompt token after the first, its log-probability after the
                               tokens before it and the n_top likeliest there (the raw model: the
                               log-softmax of its logits); computed whole, never from the prefix cache */
} sched_probe_kind;

/* How SCHED_EMBED pools the final hidden states of the prompt's tokens. */
typedef enum sched_pool {
  SCHED_POOL_LAST = 0,   /* the last token's */
  SCHED_POOL_SUM,        /* the sum over the tokens (mean: divide by the count) */
  SCHED_POOL_WSUM,       /* the sum weighted by position + 1 (weighted mean: divide by the weights' sum) */
  SCHED_POOL_MAX         /* the largest value of each dimension */
} sched_pool;

typedef struct sched_probe {
  const int32_t *ids;    /* borrowed: >= 1 ids */
  size_t n_ids;
  sched_pool pool;       /* SCHED_EMBED: how the tokens pool; the prompt is computed whole, never from
                            the prefix cache, unless SCHED_POOL_LAST */
  float *out;            /* borrowed: where the output goes (see the kind) */
  sample_token *lp;      /* borrowed, SCHED_PROMPT_LOGPROBS: n_ids entries; lp[0] is left as it is */
  int n_top;             /* SCHED_PROMPT_LOGPROBS: alternatives per token, 0..SAMPLE_MAX_TOP_LOGPROBS */
  int64_t cached_tokens; /* set: prompt tokens whose KV came from the prefix cache */
} sched_probe;

/* Runs n probes of one kind together and waits for all of them. Before any
 * work: HEARTH_EINVAL for an empty or out-of-vocabulary input, HEARTH_ELIMIT
 * "context_length_exceeded: input I has N tokens ..." for one longer than
 * the context, "memory_admission: ..." for one the KV pool can never hold
 * (messages name the input's index). Then the first failure of any probe;
 * HEARTH_ECANCELLED once *cancel is set (may be NULL). */
int sched_probe_run(sched *s, sched_probe_kind kind, sched_probe *p, int n, const volatile int *cancel, herr *err);

#endif
