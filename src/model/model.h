/* model.h — the one interface the engine uses to run a model: load a folder,
 * read its config, run a batched forward pass that returns logits.
 *
 * Batching: a batch is a list of sequences, each with its own KV state
 * (kv.h), its new tokens and, optionally, their positions. The forward
 * appends the new tokens' keys/values to each sequence's cache, advances its
 * length, and writes logits for the last new token of each sequence (or for
 * every new token when the sequence sets all_logits). A prompt fed in chunks
 * of any size gives the same logits as in one piece.
 *
 * Weights: a model folder's safetensors (f32, f16, bf16, or MLX affine
 * 4/8-bit with a "quantization" block in config.json), or a GGUF file
 * (llama, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3, granite; the tensor types of
 * GGUF_MODEL_TYPES in gguf_model.h).
 * Matrices stay in their stored format, in the memory of the backend the
 * model was loaded for (model_load_opts.device); activations, norms and
 * the KV cache are f32 there too. Only token ids and index tables go in,
 * and logits (or the final hidden states a sequence asks for) come out,
 * per forward.
 */
#ifndef HEARTH_MODEL_H
#define HEARTH_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "format/config.h"
#include "model/kv.h"

typedef struct model model;

typedef struct model_load_opts {
  int threads;      /* worker threads for the ops; <= 0 = one per CPU */
  bool mmap;        /* map the weight files instead of reading them into
                       huge-page memory: less memory, slower matmuls */
  bool f32_activations; /* keep activations f32 for Q8_0 / Q4_0 / Q4_K / Q5_K / Q6_K weights:
                       exact to the dequantized weights but
                       slower; by default they are quantized to 8 bits per
                       block of 32 for integer dot products, as llama.cpp does */
  const char *device;   /* "cpu" (NULL), "cuda", "cuda:N" or "auto": see bk_backend_open */
  const char *cuda_lib; /* path of libhearth_cuda.so; NULL = next to the program */
  const char *cpu_level; /* "scalar", "avx2", "avx512": caps the CPU kernels (NULL: the best) */
  bool no_graphs;        /* GPU: launch every op of every step (no recorded steps) */
  bool fast_matmul;      /* GPU: bf16 activations for bf16 weights (bk_open_opts.fast_matmul) */
  bool f32_as_bf16;     /* run an f32 model as if stored in bf16: matrices stored as bf16 on the
                           device (half the memory and bandwidth), norms and biases rounded to
                           bf16 values (off: f32 stays f32) */
  bool geometry_only;    /* read the config and lay out the layers, but no weights (nothing of the
                           weight files is read): model_cfg and model_kv_geometry_of answer, forwards
                           must not be run (what a memory estimate needs before loading) */
  int64_t expert_budget; /* mixture of experts: at most this many bytes of expert weights stay
                           resident (in RAM, or on the GPU) between layers; the rest stays mapped
                           from the file and is read in (uploaded) when a token is routed to it,
                           least recently used first out (0: every expert resident). The logits
                           do not change; steps under a budget are not recorded as CUDA graphs. */
  bk_backend *backend;   /* borrowed, may be NULL: run on this already open backend (another model's:
                           a speculative draft shares the target's device, stream and CPU threads)
                           instead of opening one; device, threads, cuda_lib, cpu_level, no_graphs,
                           f32_activations and fast_matmul are then the backend's. It must outlive the
                           model. */
  int tensor_parallel;   /* > 0: the model spread over this many ranks (one thread each, on devices
                           cpu, or cuda:N, cuda:N+1, ...: see tp.c), driven as one model through this
                           interface; 0: not spread */
} model_load_opts;

/* The cache layout the model needs: one row of kv_dim[l] floats (each of K
 * and V) per token and layer; sliding layers need at most window[l] rows
 * back from the newest (0 = every row). kv_dim[l] is 0 for a layer that
 * stores nothing and reads an earlier layer's rows (gemma4's KV sharing):
 * the cache gives it no memory. A recurrent layer (linear attention) keeps
 * instead one state of state_dim[l] floats per sequence (kv_dim[l] 0): the
 * cache keeps a row of each such layer's state arena for every sequence.
 * v_dim[l], when not 0, is the width of the V rows instead of kv_dim[l]
 * (multi-head latent attention: K holds the compressed latent and the RoPE
 * key, V the sparse-attention indexer's key). */
typedef struct model_kv_geometry {
  bk_backend *backend;      /* borrowed: where the cache's arenas must live (NULL: a CPU of the cache's own) */
  int n_layers;
  int64_t kv_dim[CFG_MAX_LAYERS];
  int64_t v_dim[CFG_MAX_LAYERS];  /* 0: kv_dim */
  int64_t window[CFG_MAX_LAYERS];
  int64_t state_dim[CFG_MAX_LAYERS]; /* floats of a sequence's recurrent state in layer l (0: none) */
  /* How the cache stores each layer's K and V rows (BK_KV_F32, the default,
   * or 8 / 4-bit or FP8 blocks: backend/ops.h). model_kv_geometry_of leaves f32;
   * the engine sets them from its KV quantization setting (kv_quant.h),
   * except on layers marked f32_only: rows a family reads and writes with
   * ops of its own (a latent cache), which stay f32. */
  bk_kv_fmt k_fmt[CFG_MAX_LAYERS], v_fmt[CFG_MAX_LAYERS];
  bool f32_only[CFG_MAX_LAYERS];
  /* tensor parallelism: the cache keeps one set of arenas per rank, rank r's on rank_backend[r]
   * (rank_backend[0] == backend), each of the widths above (one rank's heads); 0 or 1: one set */
  int n_ranks;
  bk_backend *rank_backend[KV_MAX_RANKS];
} model_kv_geometry;

/* What a sequence of a batch gets out of a forward. */
typedef enum model_out {
  MODEL_OUT_LOGITS = 0, /* a logits row for its last new token (every new token with all_logits) */
  MODEL_OUT_NONE,       /* nothing: only its KV rows are written (a prompt chunk before the last) */
  MODEL_OUT_HIDDEN,     /* the final hidden state of its last new token, after the model's last
                           norm (what an embedding pools): hidden_size floats to dest */
  MODEL_OUT_LOGITS_HOST, /* a logits row as LOGITS (sampled by model_forward_sample like any other),
                           and the whole row copied to dest (vocab floats) before sampling */
  MODEL_OUT_HIDDEN_ALL  /* the final hidden states of all its new tokens (as MODEL_OUT_HIDDEN):
                           n_tokens * hidden_size floats to dest, in order (mean / max pooling) */
} model_out;

/* A LoRA adapter loaded onto a model (lora.c). */
typedef struct model_lora model_lora;
/* Adapters one sequence may stack at most. */
#define MODEL_MAX_LORA 4

/* One sequence of a batch. */
typedef struct model_seq {
  kv_seq *kv;                /* borrowed: this sequence's cache state; kv->len = tokens already seen */
  const int32_t *tokens;     /* borrowed: the new tokens */
  int n_tokens;              /* >= 1 */
  const int64_t *positions;  /* borrowed, may be NULL: RoPE positions of the new tokens (default kv->len + i) */
  bool all_logits;           /* logits for every new token, else only for the last */
  model_out out;             /* default MODEL_OUT_LOGITS */
  float *dest;               /* borrowed: where MODEL_OUT_HIDDEN(_ALL) / MODEL_OUT_LOGITS_HOST write (host memory) */
  const model_lora *const *lora; /* borrowed, n_lora (<= MODEL_MAX_LORA) adapters of this model whose deltas
                                    are added (summed) on this sequence's rows; 0: the base model */
  int n_lora;
  /* Media in the prompt (mm.h). All borrowed, may be NULL; per new token. */
  const float *const *embeds;  /* NULL, or hidden_size host floats that replace the token's input embedding (a media
                                  soft token: not scaled by the embedding scale; Gemma-4's per-layer input is the pad
                                  token's). The token id is still given (the soft token's id) */
  const int32_t *positions3;   /* 3 per new token (t, h, w): multimodal RoPE positions (Qwen3.5); NULL: every
                                  axis is the token's position */
  const int32_t *bidir_last;   /* -1, or the KV row of the last token of the bidirectional span this token is in:
                                  it may also see the rows after it up to there, on the layers the model makes
                                  bidirectional over media (Gemma-4's sliding layers with
                                  use_bidirectional_attention "vision"); a forward must hold the whole span */
  /* A canvas pass (block diffusion's denoiser, model_is_diffusion): the new tokens attend to one
   * another (bidirectionally) and to every row already in the cache, and the cache is not
   * advanced (its rows past kv->len are scratch the next forward overwrites). A batch is all canvas
   * sequences, of one length, or none. self_cond (borrowed, may be NULL: none): the previous
   * step's probabilities over the vocabulary, n_tokens rows of vocab floats, which the model turns
   * into its self-conditioning input. */
  bool canvas;
  const float *self_cond;
  /* Multi-token prediction (speculative drafting with the model's MTP layer). next_hidden (borrowed,
   * may be NULL): n_tokens × hidden_size host floats written beside the sequence's other output, each
   * new token's hidden state as the MTP layer takes it: after the model's final norm (MODEL_OUT_HIDDEN's
   * value), or, in an MTP batch, the layer's own output after its head's norm (what its next drafted
   * position takes). mtp_hidden (borrowed, may be NULL): n_tokens × hidden_size host floats, the hidden
   * state h_i each new row takes beside its token t_{i+1}; sequences that give it make an MTP batch
   * (every sequence of the batch gives it, or none), which runs the model's multi-token-prediction
   * layer instead of the decoder (DeepSeek-V3's, GLM-5's): for row i (token t_{i+1}, hidden state h_i,
   * RoPE position i from positions) x = eh_proj([enorm(embed(t_{i+1})) | hnorm(h_i)]), then the layer's
   * decoder block over the sequence's cache in model_mtp_geometry_of's layout, then its head's norm and
   * head (the model's lm_head when it has none of its own): the logits of t_{i+2}. Its sequences give
   * LOGITS or NONE, no adapters or media; model_mtp_check says whether the model can. */
  float *next_hidden;
  const float *mtp_hidden;
} model_seq;

typedef struct model_batch {
  const model_seq *seqs;     /* borrowed */
  int n_seqs;
} model_batch;

/* The longest context a config may state (max_position_embeddings, sliding
 * windows, RoPE's original context): 2^26 tokens. */
#define MODEL_MAX_CONTEXT ((int64_t)1 << 26)

/* Refuses configs with absurd values that config.json parsing lets through:
 * a context beyond MODEL_MAX_CONTEXT or negative, non-finite or non-positive
 * RoPE bases and factors, an rms_norm_eps that is not finite or is >= 1,
 * non-finite softcapping. The message names the field and what = the file.
 * model_load's callers run it (hearth_model_load, the CLI); GGUF metadata
 * is checked when it is read. */
int model_config_check(const model_config *c, const char *what, herr *err);
/* config.json (a folder's, or the file given) read with the defaults of its model_type's family
 * (family.c's rows; format/config.c's config_load with them). */
int model_config_load(model_config *c, const char *path, herr *err);
/* The same from a parsed object (what names it in messages). */
int model_config_from_json(model_config *c, const json_t *j, const char *what, herr *err);
/* Whether hearth runs model_type (a family's, or a multimodal checkpoint's whose text part is one). */
bool model_type_supported(const char *model_type);
/* "llama, mistral, qwen2, ...": the supported types, for messages. */
const char *model_supported_types(void);

/* dir: a model folder (config.json + safetensors) or a .gguf file. opts may
 * be NULL. Every tensor's presence and shape is checked against the config;
 * errors name the tensor ("model.layers.3.mlp.up_proj.weight: expected shape
 * [256, 64], file has [64, 256]"). */
int model_load(const char *dir, const model_load_opts *opts, model **out, herr *err);
void model_free(model *m);
const model_config *model_cfg(const model *m);
int64_t model_vocab_size(const model *m);
void model_kv_geometry_of(const model *m, model_kv_geometry *g);
/* V row width of layer l of g (v_dim, or kv_dim when v_dim is 0). */
static inline int64_t model_kv_v_dim(const model_kv_geometry *g, int l) { return g->v_dim[l] ? g->v_dim[l] : g->kv_dim[l]; }
/* Multi-token-prediction layers loaded beside the decoder (GLM-5's
 * num_nextn_predict_layers, kept for speculative decoding; 0: none). */
int model_nextn_layers(const model *m);
/* Whether MTP batches (model_seq.mtp_hidden) can run: the model has a multi-token-prediction layer its family
 * can run, and is neither split over ranks nor under an expert budget; else HEARTH_EUNSUPPORTED
 * saying why. */
int model_mtp_check(const model *m, herr *err);
/* The cache layout of the multi-token-prediction layer (one layer; model_mtp_check must pass). */
void model_mtp_geometry_of(const model *m, model_kv_geometry *g);
/* The backend the model runs on (borrowed; lives as long as the model). */
bk_backend *model_backend(const model *m);
/* Bytes of the weight matrices and vectors as the backend holds them (stored format). */
size_t model_weight_bytes(const model *m);

/* Expert residency under model_load_opts.expert_budget (all 0 without a
 * budget). May be called from any thread while forwards run. */
typedef struct model_expert_stats {
  int64_t budget;       /* bytes */
  int64_t total;        /* bytes of all experts */
  int64_t resident;     /* bytes of the experts resident now */
  int64_t page_ins;     /* experts read in since load */
  int64_t evictions;    /* experts given back since load */
} model_expert_stats;
void model_expert_stats_of(const model *m, model_expert_stats *out);
/* Bytes of a mixture of experts' expert weights as stored (0 for a dense model). */
int64_t model_expert_bytes(const model *m);

/* Rows of logits model_forward writes for b: sum over the sequences whose
 * out is LOGITS or LOGITS_HOST of (all_logits ? n_tokens : 1). */
size_t model_batch_logit_rows(const model_batch *b);
/* logits_out: model_batch_logit_rows(b) × vocab floats, sequence by sequence
 * in batch order. On failure no sequence's length has changed (but with
 * recurrent layers, a failure after the layers ran leaves the sequences'
 * states advanced past their lengths: such sequences must start over). */
int model_forward(model *m, const model_batch *b, float *logits_out, herr *err);
/* The same forward, then one token per logits row chosen on the backend
 * (bk_sample: rows[i] for the i-th logits row — model_batch_logit_rows(b)
 * of them, in model_forward's order, so a sequence with all_logits has one
 * per new token —, out[i] its result): only the ids, the logprobs asked
 * for, and the rows of MODEL_OUT_LOGITS_HOST sequences leave the device. */
int model_forward_sample(model *m, const model_batch *b, const bk_sample_row *rows, const bk_sample_adj *adj,
                         int64_t n_adj, bk_sample_out *out, herr *err);
/* ---- LoRA adapters ----
 * A PEFT LoRA folder (adapter_config.json + adapter_model.safetensors; see
 * format/adapter.h for the fields honoured and refused) loaded onto m: each
 * targeted projection (attention q/k/v/o or fused qkv, the dense MLP's
 * gate/up/down or fused gate_up) of the layers it names gets
 * scale · B · A added to its output on the rows of sequences that use it
 * (model_seq.lora). A batch mixes sequences with different adapters or
 * none: the base matmuls run once over all rows. A recorded step
 * (bk_graph_begin) is keyed on which rows use which adapters. Shapes are checked against the base;
 * anything not mappable (experts, embeddings, the head, DoRA, biases) is
 * refused with a message naming the tensor or field.
 * Reference counted: load gives one reference; model_lora_retain /
 * model_lora_release may be called from any thread, and the last release
 * frees the backend memory, waiting for a running forward to end. Every
 * adapter must be released before model_free. */
int model_lora_load(model *m, const char *dir, model_lora **out, herr *err);
void model_lora_retain(model_lora *a);
void model_lora_release(model_lora *a);
/* A 64-bit identity of what the adapter computes (its weights and scales;
 * never 0): the prefix cache keys blocks on it. 0 for NULL. */
uint64_t model_lora_id(const model_lora *a);
/* The identity of a stack of n adapters in order (0 when n == 0). */
uint64_t model_lora_set_id(const model_lora *const *a, int n);
const char *model_lora_path(const model_lora *a);
int64_t model_lora_rank(const model_lora *a);    /* the largest rank over its modules */
int64_t model_lora_modules(const model_lora *a); /* modules in its file */
int model_lora_refs(const model_lora *a);
const model *model_lora_model(const model_lora *a);

/* Block diffusion (DiffusionGemma): tokens per denoised block; 0 for an autoregressive model. */
int64_t model_canvas_length(const model *m);

/* Whether the model has an output head (lm_head, or embeddings tied to it).
 * A folder saved from a bare decoder (Qwen3-Embedding's Qwen3Model: tensor
 * names without "model.", or config.json's architectures naming a *Model)
 * may lack lm_head.weight and loads without one (a causal LM's folder
 * without it is refused, naming the tensor); its forwards
 * then only give MODEL_OUT_HIDDEN / MODEL_OUT_NONE, and a logits row is
 * refused with a message saying so. */
bool model_has_head(const model *m);

#endif
