/* hearth.h — the public C API of hearth, a local LLM runtime.
 *
 * The HTTP server and the CLI's generate and chat are consumers of this
 * header like any other program; the CLI's low-level verbs (tokenize,
 * template, inspect, logits, bench, convert) reach below it, as
 * src/cli/cli.h lists. Every function that can fail returns 0 on success or a nonzero
 * hearth error code, and fills a hearth_error with a message that names the
 * problem ("model.safetensors: tensor 'x' ends at byte 9000 but the file has 8192").
 */
#ifndef HEARTH_H
#define HEARTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes. */
typedef enum hearth_code {
  HEARTH_OK = 0,
  HEARTH_EINVAL = 1,      /* bad argument or request */
  HEARTH_EIO = 2,         /* file or socket error */
  HEARTH_EFORMAT = 3,     /* malformed file or data */
  HEARTH_EUNSUPPORTED = 4,/* valid but not supported (model_type, dtype, feature) */
  HEARTH_ENOMEM = 5,      /* out of memory */
  HEARTH_ENOTFOUND = 6,   /* file, tensor, token or key not found */
  HEARTH_ELIMIT = 7,      /* a configured limit was hit (recursion, size, context) */
  HEARTH_ECANCELLED = 8,  /* the caller cancelled */
  HEARTH_EINTERNAL = 9    /* a bug: an invariant did not hold */
} hearth_code;

/* An error: a code and a human-readable message. Zero-initialise before use. */
/* What kind of refusal an error is, for callers that answer each kind in
 * its own way (an HTTP server's error codes); the message says the rest. */
typedef enum hearth_cause {
  HEARTH_CAUSE_NONE = 0,
  HEARTH_CAUSE_CONTEXT_LENGTH = 1,   /* prompt + max_tokens exceed the context */
  HEARTH_CAUSE_MEMORY_ADMISSION = 2  /* the request could never fit the KV cache (or its budget) */
} hearth_cause;

typedef struct hearth_error {
  int code;
  char msg[1024];
  int cause;       /* a hearth_cause; HEARTH_CAUSE_NONE when the code says it all */
  char field[48];  /* the request field at fault ("logit_bias", "stop", "temperature", ...); "" when none */
} hearth_error;

/* "0.1.0" */
const char *hearth_version(void);

/* The name of an error code ("invalid argument", ...). */
const char *hearth_code_name(int code);


/* ---- models ----------------------------------------------------------------
 *
 * Thread safety: a loaded model may be used from several threads.
 * hearth_model_info, hearth_tokenize, hearth_detokenize and hearth_chat_render
 * only read the model and run concurrently. hearth_generate may be called
 * from many threads at once: the model's scheduler (one engine thread,
 * started by the first generation) batches all of them into shared forward
 * steps, with a paged KV cache and automatic prefix caching. A generation's
 * callback runs on the thread that called hearth_generate.
 * hearth_model_free must not race with any other call.
 */

typedef struct hearth_model hearth_model;

typedef struct hearth_load_opts {
  const char *id;          /* the name the model answers to; NULL: the folder's name */
  int threads;             /* compute threads; <= 0: one per CPU */
  int64_t context_length;  /* <= 0: config.json's max_position_embeddings; more than it is refused */
  /* Serving (continuous batching); 0 takes the default. */
  int max_batch;           /* running sequences per step at most (default 64) */
  int prefill_chunk;       /* prompt tokens one sequence feeds per step (default 512) */
  int step_tokens;         /* tokens one step feeds in all, decode rows first and prompts' chunks in what is
                              left (vLLM's max_num_batched_tokens; default max(prefill_chunk, max_batch),
                              at least max_batch) */
  int64_t kv_cache_bytes;  /* KV pool size (default: a quarter of physical memory, at most 4 GiB,
                              at most max_batch full-context sequences) */
  int64_t memory_budget;   /* bytes the KV cache may use at most; a request that cannot fit is refused */
  const char *device;      /* "cpu" (NULL), "cuda", "cuda:N" or "auto" (the GPU when one is usable) */
  const char *cpu_level;   /* CPU kernels: "scalar", "avx2" or "avx512" caps the level (NULL: the best) */
  bool mmap;               /* map weight files instead of reading them into huge-page memory */
  bool f32_activations;    /* CPU: f32 activations for GGUF block types (exact, slower) */
  bool f32_as_bf16;        /* store f32 weight matrices as bf16 (half the GPU memory; the weights rounded) */
  bool no_cuda_graphs;     /* GPU: launch every kernel of every decode step instead of replaying
                              a recorded CUDA graph (for debugging and comparison) */
  bool gpu_fast_matmul;    /* GPU: bf16 weights multiply bf16-rounded activations in one pass, as most
                              GPU servers do (a third of the matrix work for prefill and large batches;
                              logits move by about 1e-3 of their range); default: f32-precise
                              activations in three bf16 terms */
  double gpu_memory_fraction; /* GPU: the share of free device memory the KV pool may take after the
                              weights are loaded (0: 0.9); ignored on the CPU */
  int64_t expert_budget;   /* mixture of experts on the CPU: bytes of expert weights kept resident; the
                              rest stays mapped from the file and is read in on use, least recently used
                              out (0: all resident). Same output either way. */
  int tensor_parallel;     /* > 0: split the model over this many ranks of this process, one thread each
                              (tensor parallelism: attention heads, MLP and expert width, vocabulary):
                              on a GPU device, that many GPUs from the device named on (cuda:K ..
                              cuda:K+N-1, NCCL between them); on the CPU, N shares of its threads.
                              Shapes that do not split are refused naming the dimension. 0: not split */
  const char *chat_template_file; /* NULL: the model's chat template. Else a Jinja file rendered in its place
                              (the model's BOS/EOS texts kept); one that cannot be read or parsed is refused */
  const char *chat_template; /* NULL: the model's chat template. Else the name of a template hearth ships
                              (hearth_chat_template_name: chatml, deepseek3, gemma, llama3, mistral-v7,
                              phi3) or, when it is no such name, a Jinja file, rendered in its place as
                              chat_template_file is; neither is refused listing the names. Not together
                              with chat_template_file. A model with a vocabulary but no chat template of
                              its own (and neither option) renders chats as chatml, with a warning at
                              the first chat (hearth_info.chat_template_fallback). */
  const char *trace_file;  /* NULL: no trace. Else a Chrome trace-event JSON file (Perfetto,
                              chrome://tracing) the serving engine writes while the model is loaded:
                              per request a track with its queue wait, prefix-cache lookup, prefill
                              chunks, decode steps, detokenization and the whole request (tokens,
                              finish reason); an "engine" track with every step. Created (truncated)
                              by hearth_model_load, closed — made complete JSON — by hearth_model_free;
                              a process that dies leaves it lacking only its closing bracket. */
  int64_t trace_max_bytes; /* events written at most (<= 0: 256 MiB); later ones are dropped, logged once */
  const char *kv_quant;    /* KV cache storage for every layer: "8" (8-bit blocks of 32 with an f32 scale),
                              "4" (4-bit), "fp8" (FP8 E4M3 blocks of 32 with an f32 scale), "off" / NULL (f32).
                              The pool holds proportionally more tokens. */
  const char *kv_quant_config; /* NULL, or a JSON file that sets layers or ranges of layers, K and V apart,
                              over kv_quant (format: docs/KV_QUANT.md) */
  const char *kv_store;    /* NULL: none. A folder (created when missing) that keeps the prefix cache's
                              full KV blocks across restarts: blocks the cache evicts are written there
                              (by a writer thread of the store's, so a step never waits on the disk),
                              and every cached block when the model is freed; a later prompt that starts
                              with a stored prefix reads its blocks back instead of computing them
                              (reported as cached tokens). Blocks of another model (config.json and
                              samples of the weight files), device kind, KV format or store version,
                              and damaged files, are ignored with a warning. */
  int64_t kv_store_max;    /* bytes the KV store may hold (<= 0: 4 GiB); least recently used blocks go first */
  /* Speculative decoding: each step, a generation drafts up to spec_tokens tokens and the model
     verifies them all in one batched forward (greedy output is plain decoding's token for token;
     sampled output keeps the model's distribution by rejection sampling). */
  int spec_tokens;         /* drafted tokens per step for requests that do not set their own
                              (0: off; at most 16) */
  const char *spec_method; /* "ngram" (prompt lookup: the continuation of the latest earlier match of
                              the last tokens; no extra model), "draft" (draft_model) or "mtp" (the
                              model's multi-token-prediction layer, GLM-5's: a model without one is
                              refused at load). NULL: "draft" with a draft_model, else "ngram" */
  const char *draft_model; /* a smaller model's folder or .gguf with the same tokenizer (checked: the
                              same vocabulary, token for token), loaded on the same device with its
                              own KV cache; NULL: none */
  /* Media in prompts (hearth_prompt.media): where their bytes may come from besides data URLs and
     bytes given directly. */
  bool allow_local_media;  /* local file paths and file:// URLs */
  bool allow_remote_media; /* http(s) URLs, fetched when the request runs: public addresses only */
  bool allow_private_media_hosts; /* ... and loopback, private, link-local and other non-public ones */
  int64_t max_media_bytes; /* encoded bytes of one medium at most (<= 0: 32 MiB) */
} hearth_load_opts;

/* Loads a model: a Hugging Face model folder (config.json + safetensors, and
 * when present tokenizer.json / tokenizer_config.json (tokenizer and chat
 * template) and generation_config.json (sampling defaults, EOS ids)), or a
 * .gguf file (its metadata, vocabulary and tokenizer.chat_template; HF's
 * sampling defaults, so greedy unless asked). A model without a tokenizer
 * loads, but only id prompts work. Configs with absurd values (a context
 * beyond 2^26 tokens, non-finite RoPE or norm values) are refused with
 * HEARTH_ELIMIT or HEARTH_EFORMAT. opts may be NULL. *out is owned by the
 * caller (hearth_model_free). */
int hearth_model_load(const char *path, const hearth_load_opts *opts, hearth_model **out, hearth_error *err);
void hearth_model_free(hearth_model *m);

#define HEARTH_MAX_EOS 32

typedef struct hearth_info {
  const char *id;           /* borrowed from the model */
  const char *path;         /* borrowed: the folder or .gguf file it was loaded from */
  const char *model_type;   /* borrowed: config.json's model_type */
  int64_t context_length;
  int32_t vocab_size;       /* rows of the model's logits */
  int32_t bos_id;           /* -1 when none */
  int32_t eos_ids[HEARTH_MAX_EOS];  /* config.json ∪ generation_config.json ∪ tokenizer */
  int n_eos;
  bool has_tokenizer;
  bool has_chat_template;
  bool chat_template_fallback; /* the model has none of its own: chats render as the built-in chatml */
  const char *chat_template; /* borrowed: the chat template's Jinja source; NULL when none */
  int32_t hidden_size;      /* the width of hearth_embed's vectors (before opts.dimensions) */
  bool can_generate;        /* false for a folder without an output head (embeddings only) */
  bool can_embed;           /* false when the folder's sentence-transformers pooling is one hearth does not run */
  int64_t canvas_length;    /* a block-diffusion model (DiffusionGemma): tokens per denoised block, which
                               generations commit (and stream) a block at a time; 0: autoregressive */
  bool can_fill;            /* the vocabulary has fill-in-the-middle tokens (hearth_fim_prompt) */
} hearth_info;

void hearth_model_info(const hearth_model *m, hearth_info *out);

/* Frees memory the API handed out (token arrays, strings). */
void hearth_free(void *p);

/* Text → ids. len: bytes of text; 0 with text set means strlen(text), as
 * hearth_prompt.text_len (so "" and NULL give only what add_special adds).
 * add_special: the tokenizer's BOS/EOS as HF add_special_tokens. Special
 * tokens written in the text become their ids. *ids: hearth_free. */
int hearth_tokenize(const hearth_model *m, const char *text, size_t len, bool add_special, int32_t **ids, size_t *n,
                    hearth_error *err);
/* Fill-in-the-middle: one file of context before the prefix. */
typedef struct hearth_fim_chunk {
  const char *filename; /* NULL: "tmp" */
  const char *text;
} hearth_fim_chunk;

/* The token ids of a fill-in-the-middle prompt, laid out as llama.cpp's
 * /infill lays them out (prefix-suffix-middle: [repository context] [BOS]
 * <|fim_prefix|> prefix prompt <|fim_suffix|> suffix <|fim_middle|>, trimmed
 * to the context as llama.cpp trims; src/tokenizer/fim.h has the details).
 * prefix, suffix, prompt may be NULL (""); n_predict: the tokens to generate
 * (-1: unset). HEARTH_EUNSUPPORTED when the vocabulary has no FIM tokens
 * (hearth_info.can_fill). *ids: hearth_free. */
int hearth_fim_prompt(const hearth_model *m, const char *prefix, const char *suffix, const char *prompt,
                      const hearth_fim_chunk *extra, int n_extra, int64_t n_predict, int32_t **ids, size_t *n,
                      hearth_error *err);
/* Ids → text (NUL-terminated, *len bytes). *text: hearth_free. */
int hearth_detokenize(const hearth_model *m, const int32_t *ids, size_t n, bool skip_special, char **text,
                      size_t *len, hearth_error *err);

/* Renders a conversation with the model's chat template, as transformers'
 * apply_chat_template(messages, tools=..., add_generation_prompt=..., **kwargs,
 * tokenize=False). messages_json: a JSON array of message objects; tools_json
 * (may be NULL): a JSON array; extra_kwargs_json (may be NULL): a JSON object
 * of further template variables (enable_thinking, reasoning_effort, ...).
 * *text: hearth_free. HEARTH_ENOTFOUND when the model has no chat template
 * (one with a vocabulary but no template of its own renders as the built-in
 * chatml: hearth_load_opts.chat_template), HEARTH_EINVAL for bad JSON or an
 * error the template raises. */
int hearth_chat_render(const hearth_model *m, const char *messages_json, const char *tools_json,
                       bool add_generation_prompt, const char *extra_kwargs_json, char **text, hearth_error *err);
/* The i-th name of the chat templates hearth ships (hearth_load_opts.chat_template), sorted; NULL past the
 * last. */
const char *hearth_chat_template_name(size_t i);

/* ---- generation ---------------------------------------------------------- */

typedef struct hearth_logit_bias {
  int32_t id;
  float bias;
} hearth_logit_bias;

/* Sampling and limits. hearth_gen_params_init sets every field to "unset":
 * NAN reals and -1 integers take the model's defaults (generation_config.json
 * where it has them; HF's otherwise). Sampling is greedy when temperature is
 * 0, or when it is unset and generation_config.json does not set do_sample.
 * Processing order: repetition penalty (prompt + output) → presence /
 * frequency penalties (output, OpenAI) → DRY → logit bias → temperature →
 * top-k → top-p → min-p → typical-p → XTC; or, under mirostat 2, temperature
 * → mirostat (top-k, top-p, min-p, typical-p and XTC are not applied, as in
 * llama.cpp). DRY, typical-p, XTC and mirostat follow llama.cpp's definitions
 * (src/engine/sample.h spells them out); a request using one is sampled on the
 * host (on a GPU its logits row is copied back) and decodes without
 * speculative drafts. Logprobs are
 * the log-softmax after penalties, DRY and bias, before temperature and
 * truncation (the same for greedy and sampled runs; without penalties or
 * bias, vLLM's default raw logprobs). */
typedef struct hearth_gen_params {
  int64_t max_tokens;          /* -1: up to the context length, or to what the KV cache holds
                                  when that is less */
  double temperature;          /* >= 0; 0 = greedy */
  double top_p;                /* (0, 1]; 1 = off */
  int64_t top_k;               /* 0 = off */
  double min_p;                /* [0, 1]; 0 = off */
  double repetition_penalty;   /* > 0; 1 = off (HF) */
  double presence_penalty;     /* 0 = off (OpenAI) */
  double frequency_penalty;    /* 0 = off (OpenAI) */
  bool has_seed;
  uint64_t seed;               /* same seed, prompt and params → same tokens; unset: a random seed */
  const char *const *stop;     /* borrowed: n_stop stop strings, matched on the decoded text */
  int n_stop;
  const hearth_logit_bias *logit_bias; /* borrowed: n_logit_bias entries */
  int n_logit_bias;
  double typical_p;            /* [0, 1]; 1 = off (locally typical sampling) */
  double xtc_probability;      /* [0, 1]; 0 = off (XTC: exclude top choices) */
  double xtc_threshold;        /* [0, 1]; above 0.5 = off (init: 0.1) */
  double dry_multiplier;       /* >= 0; 0 = off (DRY repetition penalty) */
  double dry_base;             /* >= 1 (init: 1.75) */
  int64_t dry_allowed_length;  /* >= 0 (init: 2) */
  int64_t dry_penalty_last_n;  /* tokens of prompt + output scanned: 0 = off, -1 = all (init: 64) */
  const char *const *dry_sequence_breakers; /* borrowed: n_dry_sequence_breakers strings (at most 40 bytes
                                  each are used), a repeat never reaching back past one; NULL: "\n", ":",
                                  "\"", "*"; non-NULL with n 0: none */
  int n_dry_sequence_breakers;
  int mirostat;                /* 0 = off, 2 = mirostat 2 (1 is refused, field "mirostat") */
  double mirostat_tau;         /* target surprise in bits (init: 5) */
  double mirostat_eta;         /* learning rate (init: 0.1) */
  bool logprobs;               /* fill logprob / top in the callback's token */
  int top_logprobs;            /* 0..20 alternatives per token */
  bool ignore_eos;             /* keep going past EOS ids */
  bool skip_special;           /* leave special tokens out of the text (init: true) */
  int prefill_chunk;           /* prompt tokens per step for this request, at most the model's
                                  (hearth_load_opts.prefill_chunk); <= 0: the model's */
  const volatile int *cancel;  /* borrowed, may be NULL: set *cancel nonzero (any thread) to stop */
  const char *grammar;         /* borrowed, may be NULL: a GBNF grammar (llama.cpp's notation, start
                                  rule `root`) the output must follow; HEARTH_EINVAL naming the line
                                  when it does not compile */
  const char *json_schema;     /* borrowed, may be NULL: a JSON Schema (JSON text) the output must
                                  follow — compiled to a grammar; HEARTH_EUNSUPPORTED naming a keyword
                                  that would narrow the output and is not compiled. Not with grammar. */
  const char *trace_label;     /* borrowed, may be NULL: with hearth_load_opts.trace_file, the request's
                                  track is named "req LABEL" (a response id, say); NULL: "req N" */
  int spec_tokens;             /* speculative decoding for this request: tokens drafted per step
                                  (0: off, 1..16); -1 (init): the model's hearth_load_opts.spec_tokens.
                                  Drafts come from spec_method, else the model's (prompt lookup when it
                                  has none); a request with a grammar or JSON schema decodes plainly */
  const char *adapter;         /* borrowed, may be NULL: the LoRA adapter(s) to run under, by the names
                                  hearth_adapter_load gave: "name", "a+b" (stacked: both deltas summed,
                                  at most 4), or NULL / "" / "none" for the base model. An adapter not
                                  loaded is HEARTH_ENOTFOUND (field "adapter") */
  const char *spec_method;     /* borrowed, may be NULL (the model's): this request's draft source,
                                  "ngram", "draft" (a model loaded with a draft_model) or "mtp" (a
                                  model with a multi-token-prediction layer); one the model cannot
                                  serve fails (HEARTH_EINVAL / HEARTH_EUNSUPPORTED, field
                                  "spec_method") */
  int priority;                /* admission order among waiting requests: one of a smaller priority is
                                  admitted before any of a larger one, equal ones in arrival order
                                  (0: init; `hearth serve` runs Batch API rows at 1) */
} hearth_gen_params;

void hearth_gen_params_init(hearth_gen_params *p);

/* An image, a sound or a video in a prompt. Images: JPEG, PNG, WebP, GIF (its first frame);
 * sound and video: any container and codec FFmpeg's libraries read (sound becomes 16 kHz mono,
 * video frames are sampled at the model's rate). */
typedef enum hearth_media_kind { HEARTH_MEDIA_IMAGE = 0, HEARTH_MEDIA_AUDIO = 1, HEARTH_MEDIA_VIDEO = 2 } hearth_media_kind;

typedef struct hearth_media {
  hearth_media_kind kind;
  const char *url;             /* borrowed: a data URL ("data:image/png;base64,..."), bare base64, a local
                                  path or file:// URL (hearth_load_opts.allow_local_media) or an http(s)
                                  URL (allow_remote_media); NULL: data / len */
  const void *data;            /* borrowed: the encoded bytes, when url is NULL */
  size_t len;
  const char *name;            /* borrowed, may be NULL: names the medium in errors and as the error's
                                  field ("messages[1].content[0]") */
} hearth_media;

/* The prompt: text (encoded with the model's tokenizer; add_special adds BOS
 * etc. as for a raw completion, a rendered chat already holds them) or ids.
 * With media, the text holds one placeholder per medium, in order — what the
 * chat template writes for an image / audio / video part (hearth_media_placeholder);
 * each becomes the model's begin marker, its soft tokens and end marker, and
 * the soft tokens' embeddings come from the model's encoder for that kind
 * (HEARTH_EINVAL naming the medium when it is bad, too large, or of a kind
 * the model has no encoder for). */
typedef struct hearth_prompt {
  const char *text;            /* borrowed; used when ids is NULL */
  size_t text_len;             /* bytes of text; 0 with text set = strlen (as hearth_tokenize) */
  bool add_special;
  const int32_t *ids;          /* borrowed */
  size_t n_ids;
  const hearth_media *media;   /* borrowed, n_media entries in document order (text prompts only) */
  int n_media;
} hearth_prompt;

/* The placeholder a prompt's text holds for one medium of this kind (the string
 * the chat template writes for it), or NULL when the model takes no such medium. */
const char *hearth_media_placeholder(const hearth_model *m, hearth_media_kind kind);

#define HEARTH_MAX_TOP_LOGPROBS 20

typedef struct hearth_top_logprob {
  int32_t id;
  float logprob;
  const char *text;            /* borrowed for the callback: the token's decoded bytes (not always valid UTF-8) */
  size_t len;
} hearth_top_logprob;

typedef struct hearth_token {
  int32_t id;
  const char *text;            /* borrowed for the callback: this token's own decoded bytes */
  size_t len;
  float logprob;               /* when params.logprobs */
  const hearth_top_logprob *top; /* borrowed: n_top alternatives, best first */
  int n_top;
} hearth_token;

/* Called once per generated token with the text that became final in this
 * step (text/len; may be empty while a partial stop string or UTF-8 sequence
 * is held back), and once more at the end with tok == NULL when held-back
 * text is released. Return nonzero to cancel. */
typedef int (*hearth_token_fn)(void *user, const char *text, size_t len, const hearth_token *tok);

typedef enum hearth_finish {
  HEARTH_FINISH_STOP = 0,      /* an EOS token or a stop string */
  HEARTH_FINISH_LENGTH = 1,    /* max_tokens */
  HEARTH_FINISH_CANCELLED = 2
} hearth_finish;

typedef struct hearth_gen_result {
  hearth_finish finish_reason;
  int stop_index;              /* the stop string that matched; -1 otherwise */
  int32_t stop_token;          /* the EOS id that ended it; -1 otherwise */
  int64_t prompt_tokens;
  int64_t completion_tokens;   /* includes the EOS token when one ended it */
  int64_t cached_tokens;       /* prompt tokens whose KV came from the prefix cache */
  double prefill_seconds, decode_seconds;
  double queue_seconds;        /* waiting in the scheduler's queue before it was first computed */
} hearth_gen_result;

/* Generates from prompt, streaming through fn (may be NULL). Returns 0 when it
 * finished (stop or length); HEARTH_ECANCELLED when cancelled (result still
 * filled, everything freed); HEARTH_ELIMIT with a message starting
 * "context_length_exceeded:" when the prompt plus max_tokens does not fit the
 * context, before any work; HEARTH_ELIMIT with a message starting
 * "memory_admission:" when the request can never fit the KV cache or the
 * memory budget, before any work; HEARTH_EINVAL for bad parameters (the message
 * names the field). result may be NULL. Callbacks run on the model's engine
 * thread while the caller waits. */
int hearth_generate(hearth_model *m, const hearth_prompt *prompt, const hearth_gen_params *params, hearth_token_fn fn,
                    void *user, hearth_gen_result *result, hearth_error *err);

/* One generation of a batch: its prompt and parameters in, its text and result out. */
typedef struct hearth_batch_item {
  hearth_prompt prompt;              /* borrowed */
  const hearth_gen_params *params;   /* borrowed; NULL: the model's defaults */
  char *text;                        /* out, owned (hearth_batch_free): the generated text, NUL-terminated */
  size_t len;                        /* out: bytes of text */
  hearth_gen_result result;          /* out */
  int status;                        /* out: what hearth_generate returned for this item */
  hearth_error error;                /* out: its error when status is nonzero */
} hearth_batch_item;

/* Generates every item's prompt, up to max_in_flight at once (<= 0: all of
 * them, at most 256), in the model's shared scheduler, so they share forward
 * steps and the prefix cache; item i's outputs are item i's whatever order
 * they finish in. Greedy items give the text a lone hearth_generate gives.
 * Returns 0 once every item ran (each item's own status says how it went), or
 * nonzero with err set when none could run (no model, no threads). */
int hearth_generate_batch(hearth_model *m, hearth_batch_item *items, size_t n, int max_in_flight, hearth_error *err);
/* Frees the items' text (the items themselves are the caller's). */
void hearth_batch_free(hearth_batch_item *items, size_t n);

/* ---- LoRA adapters -------------------------------------------------------
 * PEFT LoRA adapter folders (adapter_config.json + adapter_model.safetensors)
 * loaded onto the model by name; a generation picks them with
 * hearth_gen_params.adapter. Requests under different adapters (and none)
 * share the same batched steps: the base weights run once for the whole
 * batch, each sequence's low-rank delta is added on its own rows. The
 * prefix cache never shares KV between different adapters. Without an
 * adapter the output is exactly the base model's. All three may be called
 * from any thread while generations run. */

#define HEARTH_ADAPTER_NAME_MAX 64

/* Loads the adapter at path as `name` (letters, digits, '.', '_', '-'; not
 * "none"). HEARTH_EINVAL for a bad or taken name; the loader's errors for
 * an adapter that does not fit the model (shapes, modules it cannot run:
 * experts, embeddings, DoRA, trained biases, modules_to_save). */
int hearth_adapter_load(hearth_model *m, const char *name, const char *path, hearth_error *err);
/* Unloads adapter `name`: new requests can no longer name it; requests
 * running under it finish with it, and its memory is freed when the last
 * one ends. HEARTH_ENOTFOUND when no adapter has that name. */
int hearth_adapter_unload(hearth_model *m, const char *name, hearth_error *err);

typedef struct hearth_adapter_info {
  char name[HEARTH_ADAPTER_NAME_MAX];
  char path[1024];
  int64_t rank;             /* the largest rank of its modules */
  int64_t modules;          /* projections it changes */
  int in_use;               /* requests running under it now */
} hearth_adapter_info;

/* The loaded adapters in load order: fills up to max entries of out (may be
 * NULL with max 0) and returns how many are loaded. */
int hearth_adapter_list(hearth_model *m, hearth_adapter_info *out, int max);

/* Starts the serving engine now rather than at the first request: allocates
 * the KV pool (--kv-cache-mem / the default share of memory), opens the KV
 * store, starts the scheduler's thread. A server calls it before it listens,
 * so a pool that cannot be had or a store that cannot be opened stops it at
 * start-up with the reason. Safe to call again (nothing happens); a no-op
 * for block-diffusion models, whose requests take caches of their own. */
int hearth_start(hearth_model *m, hearth_error *err);

/* Whether a request of prompt_tokens and max_tokens (< 0: unset) can ever
 * fit the KV cache and memory budget: 0, or HEARTH_ELIMIT with a message
 * starting "memory_admission:". Starts the scheduler when needed. */
int hearth_admit(hearth_model *m, int64_t prompt_tokens, int64_t max_tokens, hearth_error *err);

#define HEARTH_SPEC_SOURCES 3

/* The serving engine's counters (zeros until the engine starts: hearth_start or the first request). */
typedef struct hearth_stats {
  int64_t running, waiting;            /* requests */
  int64_t kv_blocks_total, kv_blocks_used, kv_blocks_cached, kv_blocks_free;
  int kv_block_tokens;
  int64_t kv_block_bytes;              /* one block as stored (K and V of every layer) */
  char kv_format[128];                 /* how K / V are stored: "f32", "q8", "q4", "k:q8,v:q4" or per layer */
  int64_t prefix_hit_tokens, prefix_miss_tokens;
  int64_t prompt_tokens, generated_tokens;   /* computed prompt tokens, sampled tokens (totals) */
  double busy_seconds;                 /* time the engine spent in forward steps */
  int64_t requests_finished, requests_cancelled, requests_refused, preemptions, steps;
  int64_t expert_budget, expert_resident_bytes, expert_page_ins; /* bytes, bytes, experts read in (0 without a budget) */
  /* speculative decoding per draft source, [0] ngram, [1] draft model, [2] mtp: verification steps
     with drafts, tokens drafted, drafts accepted (acceptance rate = accepted / drafted) */
  int64_t spec_steps[HEARTH_SPEC_SOURCES], spec_drafted[HEARTH_SPEC_SOURCES], spec_accepted[HEARTH_SPEC_SOURCES];
  /* the KV store on disk (hearth_load_opts.kv_store; kv_store false and zeros without one) */
  bool kv_store;
  int64_t kv_store_blocks, kv_store_bytes;       /* block files in the folder now, and their bytes */
  int64_t kv_store_written, kv_store_read;       /* blocks written to disk, blocks read back into the cache */
  int64_t kv_store_removed;                      /* files removed to stay under kv_store_max */
  int64_t kv_store_rejected;                     /* files ignored or removed: another model, version or
                                                    format, or damaged */
  int64_t kv_store_hit_tokens;                   /* prompt tokens the blocks read back saved computing */
  int64_t kv_store_pending;                      /* evicted blocks waiting for the writer thread now */
  int64_t kv_store_dropped;                      /* evicted blocks not written: the writer's queue was full */
} hearth_stats;

/* The name of draft source i of hearth_stats' spec_* arrays ("ngram", "draft", "mtp"). */
static inline const char *hearth_spec_source_name(int i) {
  static const char *const names[HEARTH_SPEC_SOURCES] = {"ngram", "draft", "mtp"};
  return i >= 0 && i < HEARTH_SPEC_SOURCES ? names[i] : "?";
}

void hearth_get_stats(hearth_model *m, hearth_stats *out);

/* ---- the memory contract: will a model fit, with how much context, how fast? ----
 *
 * Computed from the model's files without loading its weights: config.json
 * (or GGUF metadata) for the layers and the KV cache the model would need
 * (the same geometry and block size the serving KV pool uses, so the KV
 * format — element type, KV sharing between layers — is the pool's own),
 * the weight files' tensor index for the weights as stored. Memory is the
 * host's MemAvailable, or the GPU's free memory for a CUDA device. The
 * decode speed is predicted from a memory bandwidth measured here and now
 * (a multi-threaded read of a buffer larger than the caches; on a GPU a
 * device-to-device copy): a decode step reads the active weights once and
 * each sequence's KV, so tok/s = batch × bandwidth / (active weights + batch ×
 * KV bytes per token × context). */

#define HEARTH_FIT_MAX_LAYERS 512

typedef struct hearth_fit_opts {
  int64_t context;        /* tokens per sequence (prompt + output); <= 0: the model's context length */
  int batch;              /* sequences decoding together; <= 0: 1 */
  const char *device;     /* "cpu" (NULL), "cuda", "cuda:N": whose memory and bandwidth */
  int threads;            /* CPU bandwidth test threads; <= 0: one per CPU */
  bool no_bandwidth;      /* skip measuring the bandwidth (no speed prediction) */
  const char *kv_quant;   /* the KV cache's storage as hearth_load_opts.kv_quant ("8", "4", "fp8", "off" / NULL);
                             hearth_model_fit ignores it and answers with the loaded model's own formats */
  const char *kv_quant_config; /* NULL, or the per-layer JSON of hearth_load_opts.kv_quant_config */
  int64_t memory_bytes;   /* > 0: the memory to fit into, instead of what the device has free now */
} hearth_fit_opts;

typedef struct hearth_fit_result {
  char model_type[64];
  char device[160];                /* the device described */
  int64_t context_length;          /* the model's */
  int64_t context, batch;          /* what was asked (context: the model's when not given) */
  /* weights, as stored in the files (vision / audio towers left out) */
  int64_t weight_bytes;
  int64_t active_weight_bytes;     /* read per decoded token: all weights for a dense model; for a
                                      mixture of experts, the rest plus experts_per_token / n_experts
                                      of the experts */
  int64_t expert_bytes, n_experts, experts_per_token;
  /* the KV cache */
  int n_layers, kv_layers;         /* layers, and those that store KV (the others read an earlier
                                      layer's: Gemma-4's shared layers) */
  int kv_block_tokens;             /* the pool's block size the bytes are counted in */
  char kv_format[64];              /* how the KV rows are stored: "f32", "q8", "q4", "k:q8,v:q4", or per
                                      layer ranges "0-1:q8,2:f32" when the layers differ */
  int64_t kv_bytes_per_token;      /* all layers, K and V (8 / 4-bit blocks with their scales) */
  int64_t kv_layer_bytes_per_token[HEARTH_FIT_MAX_LAYERS];
  int64_t kv_bytes;                /* context × batch tokens */
  int state_layers;                /* recurrent layers (Qwen3.5's DeltaNet): a fixed state per sequence */
  int64_t state_bytes_per_sequence;
  int64_t state_bytes;             /* batch sequences' states */
  /* runtime */
  int64_t activation_bytes;        /* the forward's scratch at the serving step size */
  int64_t runtime_bytes;           /* fixed: tables, tokenizer, thread stacks; a GPU's context */
  int64_t overhead_bytes;          /* the two above */
  int64_t need_bytes;              /* weights + KV + states + overhead */
  int64_t available_bytes;
  char memory_source[48];          /* "MemAvailable", "cuda free" (+ what a served model holds), or "given" */
  bool fits;                       /* need_bytes fit and the context is at most the model's */
  bool context_exceeds_model;      /* context > context_length: the model cannot take it in any memory */
  int64_t max_context;             /* the largest context per sequence that fits at this batch (at
                                      most the model's; 0 when even the weights do not fit) */
  int64_t max_batch;               /* the most sequences of `context` tokens that fit */
  double bandwidth;                /* bytes/s measured (0: not measured) */
  double decode_tok_s;             /* predicted, per sequence, at this batch and the full context */
  double decode_tok_s_total;       /* ... all sequences together */
  double decode_tok_s_short;       /* predicted for one sequence at a short context (weights only) */
} hearth_fit_result;

/* The fit of the model at path (a folder or .gguf file): HEARTH_ENOTFOUND /
 * HEARTH_EFORMAT / HEARTH_EUNSUPPORTED as hearth_model_load would say. */
int hearth_fit(const char *path, const hearth_fit_opts *opts, hearth_fit_result *out, hearth_error *err);
/* The same for a loaded model on its own device: the available memory counts
 * what the model holds already (its weights and KV pool) as its own, and the
 * KV formats are the ones the model was loaded with (opts' kv_quant fields
 * are not read). The bandwidth is measured on the first call and kept. */
int hearth_model_fit(hearth_model *m, const hearth_fit_opts *opts, hearth_fit_result *out, hearth_error *err);
/* A result as JSON text (what `hearth fit --json` prints and GET /fit
 * answers); *json: hearth_free. */
int hearth_fit_json(const hearth_fit_result *r, char **json, hearth_error *err);

/* ---- embeddings and the next-token signal --------------------------------
 *
 * Both are prompt-only work: the model's scheduler prefills each input in
 * the same forward steps as the generations running beside it (in chunks,
 * with the prefix cache) and takes one output at its last token instead of
 * generating. Either may be called from many threads at once. */

typedef struct hearth_embed_opts {
  const char *instruction;     /* borrowed, may be NULL: a text input becomes
                                  "Instruct: {instruction}\nQuery:{text}" (Qwen3-Embedding's query
                                  form) before it is tokenized; id inputs are used as they are */
  int dimensions;              /* 0: hidden_size; else the first `dimensions` values, renormalised
                                  (Matryoshka); more than hidden_size is HEARTH_EINVAL */
  const volatile int *cancel;  /* borrowed, may be NULL: nonzero (any thread) cancels */
} hearth_embed_opts;

/* Embeds n inputs (text, tokenized with its add_special, or ids) as
 * Qwen3-Embedding does: the final hidden state (after the model's last
 * norm) at the last token, L2-normalised. A folder with a
 * sentence-transformers Pooling module (modules.json, 1_Pooling/config.json)
 * must ask for pooling_mode_lasttoken: other modes, and modules besides
 * Transformer, Pooling and Normalize, are HEARTH_EUNSUPPORTED naming them.
 * out: n × dim floats (dim = opts->dimensions or hidden_size), input i at
 * out + i * dim. *prompt_tokens (may be NULL): the tokens of all inputs.
 * Errors name the input ("input 2: ..."); HEARTH_ELIMIT
 * "context_length_exceeded: ..." for one longer than the context. opts may be NULL. */
int hearth_embed(hearth_model *m, const hearth_prompt *inputs, size_t n, const hearth_embed_opts *opts, float *out,
                 int64_t *prompt_tokens, hearth_error *err);

#define HEARTH_SIGNAL_MAX_BINS 100
#define HEARTH_SIGNAL_LO (-30.0)

/* The next token's distribution after a prompt. The histogram has a fixed
 * range, so that prompts and models compare bin for bin: bin i covers
 * log-probabilities [lo + i w, lo + (i + 1) w) with w = (hi - lo) / n_bins,
 * lo = HEARTH_SIGNAL_LO, hi = 0; the first bin also holds everything below
 * lo and the last includes 0. Tokens whose logit is NaN or -inf are not counted. */
typedef struct hearth_signal_result {
  int n_bins;
  double lo, hi;
  int64_t counts[HEARTH_SIGNAL_MAX_BINS];  /* tokens per bin */
  double mass[HEARTH_SIGNAL_MAX_BINS];     /* their probability */
  int64_t n_tokens;                        /* tokens counted */
  double entropy;                          /* nats */
  double max_logprob, min_logprob;
  int n_top;                               /* the best tokens, best first (lower id first on ties) */
  int32_t top_ids[HEARTH_MAX_TOP_LOGPROBS];
  double top_logprobs[HEARTH_MAX_TOP_LOGPROBS];
  int64_t prompt_tokens, cached_tokens;
} hearth_signal_result;

/* The log-probabilities of the token after prompt (the raw model: no
 * sampling settings), in n_bins bins (1..HEARTH_SIGNAL_MAX_BINS) with the
 * n_top (0..HEARTH_MAX_TOP_LOGPROBS) best tokens. cancel may be NULL.
 * HEARTH_EUNSUPPORTED for a model without an output head. */
int hearth_signal(hearth_model *m, const hearth_prompt *prompt, int n_bins, int n_top, const volatile int *cancel,
                  hearth_signal_result *out, hearth_error *err);

/* One token of a prompt scored by hearth_prompt_logprobs. */
typedef struct hearth_prompt_logprob {
  int32_t id;
  float logprob;                               /* NAN for the first token (nothing comes before it) */
  int n_top;                                   /* the likeliest tokens at its place, best first */
  int32_t top_ids[HEARTH_MAX_TOP_LOGPROBS];
  float top_logprobs[HEARTH_MAX_TOP_LOGPROBS];
} hearth_prompt_logprob;

/* The log-probability of each token of a prompt (n_ids >= 1 ids) after the tokens before it — the raw
 * model's log-softmax, no sampling settings — with the n_top (0..HEARTH_MAX_TOP_LOGPROBS) likeliest
 * tokens at each place: what OpenAI's completions report for an echoed prompt. out: n_ids entries (the
 * caller's). The prompt is computed whole, never from the prefix cache, in the scheduler's steps beside
 * the generations running. cancel may be NULL. HEARTH_EUNSUPPORTED for a model without an output head
 * and for a block-diffusion model. */
int hearth_prompt_logprobs(hearth_model *m, const int32_t *ids, size_t n_ids, int n_top, const volatile int *cancel,
                           hearth_prompt_logprob *out, hearth_error *err);

#ifdef __cplusplus
}
#endif
#endif /* HEARTH_H */
