/* gemma4.h — Gemma 4's own state and layers (defined in gemma4.c), shared by
 * DiffusionGemma's stack (diffusion_gemma.c, whose state begins with
 * gemma4_state): its config keys, geometry, a layer's weights and its
 * feed-forward. */
#ifndef HEARTH_MODEL_GEMMA4_H
#define HEARTH_MODEL_GEMMA4_H

#include "model/internal.h"

typedef struct gemma4_layer {
  bk_tensor router_norm;                  /* router input scale (times hidden^-0.5) */
  bk_tensor pre_ffn_norm_2, post_ffn_norm_1, post_ffn_norm_2; /* the MoE branch beside the MLP */
  bk_weight ple_gate, ple_proj;           /* per-layer input: [ple, hidden], [hidden, ple] */
  bk_tensor ple_norm;
} gemma4_layer;
typedef struct gemma4_state {
  int64_t ple_dim, ple_vocab;             /* hidden_size_per_layer_input (0: no per-layer inputs), vocab_size_per_layer_input */
  int64_t kv_shared;                      /* num_kv_shared_layers: the last n read the KV of the last earlier layer of their type */
  bool k_eq_v;                            /* attention_k_eq_v: full-attention layers' values are the keys' projection */
  bool double_wide;                       /* use_double_wide_mlp: KV-shared layers' MLP twice intermediate_size */
  bk_weight ple_embed, ple_model_proj;    /* the per-layer inputs' table and projection */
  bk_tensor ple_proj_norm;
  float ple_embed_scale;
  gemma4_layer *layers;                   /* owned: num_hidden_layers */
} gemma4_state;
/* Its config keys into s and cfg (diffusion: DiffusionGemma's stack), its geometry, a layer's
 * weights, a layer's feed-forward with its residual (the MLP and the MoE branch beside it). */
int gemma4_read_config(model *m, gemma4_state *s, bool diffusion, herr *err);
void gemma4_state_free(gemma4_state *s);
int gemma4_prepare(model *m, herr *err);
int gemma4_load_layer(model *m, const weight_src *src, int l, herr *err);
void gemma4_ffn(model *m, int l, step *st);

#endif
