/* config.h — a model folder's config.json and generation_config.json as typed
 * structs. Knows the fields every decoder shares and how to read them; what
 * a model_type means where its config.json is silent (its defaults, which
 * layers slide) comes from the layer above as a config_defaults per type
 * (the family rows of src/model/family.c), so no model_type is named here.
 * A family's own keys stay in `raw` for its file in src/model. An
 * unsupported model_type is reported with the list of supported ones. */
#ifndef HEARTH_FORMAT_CONFIG_H
#define HEARTH_FORMAT_CONFIG_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

#define CFG_MAX_LAYERS 512
#define CFG_MAX_EOS 16

typedef enum rope_kind {
  ROPE_DEFAULT = 0, ROPE_LINEAR, ROPE_LLAMA3, ROPE_YARN, ROPE_DYNAMIC, ROPE_LONGROPE,
  ROPE_PROPORTIONAL, /* gemma4: the first partial_rotary_factor of the pairs rotate, at base^(-2i/head_dim); the rest pass */
  ROPE_FACTORS       /* llama.cpp's rope_freqs: frequency i divided by freq_factors[i] (a GGUF's llama3 scaling) */
} rope_kind;

#define ROPE_MAX_FACTORS 512 /* rotated pairs a rope_freqs tensor may give (head_dim 1024) */

typedef struct rope_config {
  rope_kind kind;
  double theta;                  /* rope_theta (default 10000) */
  double factor;                 /* rope_scaling.factor */
  double low_freq_factor, high_freq_factor;    /* llama3 */
  int64_t original_max_position; /* llama3 / yarn original_max_position_embeddings */
  double beta_fast, beta_slow;   /* yarn (defaults 32, 1) */
  double attention_factor;       /* yarn mscale override; 0 = derive */
  double partial_rotary_factor;  /* fraction of head_dim rotated (default 1) */
  int n_freq_factors;            /* ROPE_FACTORS: one divisor per rotated pair */
  float freq_factors[ROPE_MAX_FACTORS];
} rope_config;

/* LAYER_LINEAR: a linear-attention (Gated DeltaNet) layer with a recurrent state, no KV rows (qwen3_5) */
typedef enum layer_attn { LAYER_FULL = 0, LAYER_SLIDING = 1, LAYER_LINEAR = 2 } layer_attn;

typedef struct model_config {
  char model_type[64];
  char hidden_act[32];           /* "silu", "gelu_pytorch_tanh", ... */
  char torch_dtype[16];          /* "float32", "bfloat16", ... ("" if absent) */
  int64_t vocab_size, hidden_size, intermediate_size;
  int64_t num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim;
  int64_t max_position_embeddings;
  double rms_norm_eps;
  rope_config rope;
  rope_config rope_local;        /* sliding layers of gemma3 (rope_local_base_freq) and gemma4, else = rope */
  bool tie_word_embeddings;
  bool attention_bias, mlp_bias;
  int64_t sliding_window;        /* 0 = none */
  layer_attn layer_types[CFG_MAX_LAYERS];   /* per layer: full, sliding or linear */
  bool no_rope[CFG_MAX_LAYERS];  /* smollm3: layers that skip RoPE */
  /* per layer: attention head size and KV heads (= head_dim / num_key_value_heads
   * except where gemma4's per_layer_config overrides them) */
  int64_t layer_head_dim[CFG_MAX_LAYERS], layer_kv_heads[CFG_MAX_LAYERS];
  /* mixture of experts, num_experts 0 = none (qwen3_moe here; the families of src/model that have
   * experts set these from their own keys when the model is loaded) */
  int64_t num_experts, num_experts_per_tok, moe_intermediate_size;
  bool norm_topk_prob;           /* renormalize the top-k weights */
  bool moe_layer[CFG_MAX_LAYERS]; /* the layers with experts (decoder_sparse_step, mlp_only_layers) */
  /* gemma2 / gemma3 */
  double query_pre_attn_scalar;  /* 0 = head_dim */
  double attn_logit_softcapping, final_logit_softcapping;  /* 0 = off */
  /* token ids (-1 = absent); eos may be a list */
  int64_t bos_token_id, pad_token_id;
  int64_t eos_token_ids[CFG_MAX_EOS];
  int n_eos;
  /* quantization (MLX "quantization" block); bits 0 = none */
  int quant_bits, quant_group_size;
  json_t *raw;                   /* owned: the whole config.json (its text_config in a multimodal
                                    checkpoint) for anything else: a family's own keys */
  json_t *top;                   /* owned, NULL unless the fields came from text_config: the whole file */
} model_config;

typedef struct generation_config {
  bool present;                  /* the file existed */
  bool do_sample;
  double temperature, top_p, min_p, repetition_penalty;  /* HF defaults 1.0, 1.0, 0, 1.0 */
  int64_t top_k;                 /* HF default 50 */
  int64_t max_new_tokens;        /* 0 = absent */
  int64_t bos_token_id, pad_token_id;
  int64_t eos_token_ids[CFG_MAX_EOS];
  int n_eos;
} generation_config;

/* Which layers slide (or are linear) when config.json has no layer_types. */
typedef enum config_layer_rule {
  CFG_LAYERS_FULL = 0,   /* every layer full attention */
  CFG_LAYERS_WINDOW,     /* every layer sliding when there is a window */
  CFG_LAYERS_USE_WINDOW, /* every layer sliding under use_sliding_window */
  CFG_LAYERS_MAX_WINDOW, /* under use_sliding_window, the layers from max_window_layers on */
  CFG_LAYERS_NO_ROPE,    /* under use_sliding_window, the layers that skip RoPE (no_rope_every) */
  CFG_LAYERS_PATTERN     /* every `every`-th layer full (every_key may say another n), the rest sliding
                            (linear: linear attention); last_full: the last layer full too */
} config_layer_rule;

/* What one model_type's config.json means where it is silent (transformers'
 * defaults for the type) and the few ways types read the shared keys
 * differently. */
typedef struct config_defaults {
  const char *act;               /* hidden_act (NULL: silu) */
  bool hidden_activation;        /* hidden_activation is read before hidden_act */
  double theta;                  /* rope_theta */
  double local_theta;            /* != 0: sliding layers have a RoPE of their own (rope_local), this base */
  double eps;                    /* rms_norm_eps */
  bool tie;                      /* tie_word_embeddings */
  int64_t head_dim;              /* 0: hidden_size / num_attention_heads */
  double qpas;                   /* query_pre_attn_scalar (0: head_dim) */
  double attn_cap, final_cap;    /* attn_logit_softcapping, final_logit_softcapping (0: off) */
  int64_t window;                /* sliding_window */
  double partial;                /* partial_rotary_factor (0: 1) */
  bool proportional;             /* proportional partial RoPE (0.25 of the pairs) unless rope_parameters says otherwise */
  config_layer_rule layers;      /* which layers slide without layer_types */
  int64_t every;                 /* CFG_LAYERS_PATTERN: every n-th layer is full */
  const char *every_key;         /* the key that may give n instead (NULL: none) */
  bool last_full;                /* CFG_LAYERS_PATTERN: the last layer is full too */
  bool linear;                   /* linear-attention layers ("linear_attention" in layer_types; the pattern's other layers) */
  int64_t no_rope_every;         /* > 0: some layers skip RoPE (no_rope_layers, or every n-th: no_rope_layer_interval, this default) */
  bool qkv_bias;                 /* q / k / v biases always (attention_bias forced); o_proj's is optional */
  const char *inter_from;        /* intermediate_size may be absent: this key's value (default inter_default) stands in */
  int64_t inter_default;
} config_defaults;

/* The model types a config.json may name, as the layer above knows them. */
typedef struct config_types {
  /* a type's defaults; NULL: not one (a multimodal checkpoint's "T" whose "T_text" is one reads text_config) */
  const config_defaults *(*find)(const char *model_type);
  /* "llama, mistral, ..." for messages */
  const char *(*list)(void);
} config_types;

/* Reads DIR/config.json (or the file given) with the defaults of its model_type from types. Validates
 * that the sizes make sense for the architecture and that model_type is supported. */
int config_load(model_config *c, const char *path, const config_types *types, herr *err);
/* Same from an already parsed object (what names it in messages); takes no ownership of j. */
int config_from_json(model_config *c, const json_t *j, const char *what, const config_types *types, herr *err);
void config_free(model_config *c);
/* Reads DIR/generation_config.json; a missing file gives HF's defaults with present = false. */
int generation_config_load(generation_config *g, const char *dir, herr *err);
/* An integer field of j in [lo, hi]; absent or null leaves *v as it is unless required. */
int config_int_range(const json_t *j, const char *key, bool required, int64_t lo, int64_t hi, int64_t *v, const char *what, herr *err);
/* The experts' shape: num_experts (or num_local_experts), the top-k under k_key, moe_intermediate_size;
 * absent keys leave c's values. */
int config_experts(const json_t *j, model_config *c, const char *k_key, const char *what, herr *err);
/* Whether types has model_type, directly or as a multimodal checkpoint's text part. */
bool config_type_supported(const config_types *types, const char *model_type);

#endif
