/* train_view.h — a loaded llama-family decoder seen from the trainer
 * (src/train): its geometry, its matrices as host descriptors in their
 * stored format, its norm weights as host floats and its RoPE tables. The
 * trainer runs its own forward and backward over these; the model keeps
 * owning every byte they point into.
 *
 * Only what the trainer's layer knows is accepted: a model loaded on the
 * CPU with f32 activations (so the stored bytes stay in host memory),
 * the llama decoder's layers (embed [× a scale] → N × [RMSNorm, attention
 * with GQA, q / k / v / o biases, per-head q / k norms, RoPE, optional
 * sliding window and soft-capping, [a norm of its output], RMSNorm, gated
 * MLP (SiLU or tanh-GELU), [a norm of its output]] → RMSNorm → head
 * [soft-capped]): the llama, mistral, qwen2, qwen3, smollm3, gemma2, gemma3
 * and phi3 (fused qkv_proj / gate_up_proj, partial rotary) layouts. No MLP
 * biases, no per-family layer hooks (experts, linear attention, shared KV). Anything else is refused
 * with a message that names what is not trained yet. */
#ifndef HEARTH_MODEL_TRAIN_VIEW_H
#define HEARTH_MODEL_TRAIN_VIEW_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/ops.h"
#include "backend/weights.h"
#include "base/status.h"
#include "model/model.h"

typedef struct train_layer_view {
  bk_weight q, k, v, o, gate, up, down; /* borrowed from the model: stored format, host memory */
  bk_weight qkv, gate_up;               /* with fused projections (train_view.fused): the stored matrices q / k / v
                                           and gate / up are row ranges of; else zero */
  float *attn_norm, *mlp_norm;          /* owned by the view: [hidden]; mlp_norm is the MLP's input norm */
  float *attn_out_norm, *mlp_out_norm;  /* owned, NULL: none; [hidden]: the norms of the attention's and the MLP's
                                           outputs before they join the residual (gemma's sandwich) */
  float *q_bias, *k_bias, *v_bias, *o_bias; /* owned, NULL: none; [their projection's rows] */
  float *q_norm, *k_norm;               /* owned, NULL: none; [head_dim]: RMSNorm of each head's q / k before RoPE */
  const rope_table *rope;               /* borrowed; NULL: no RoPE on this layer */
  int64_t window;                       /* 0: full causal attention */
} train_layer_view;

typedef struct train_view {
  int64_t hidden, heads, kv_heads, head_dim, inter, n_layers, vocab;
  float eps, attn_scale, attn_softcap;
  float embed_scale;                    /* 0: none; else the embedding rows are multiplied by it */
  float final_softcap;                  /* 0: none; else logits = c · tanh(logits / c) */
  bool unit_offset;                     /* RMSNorm scales by (1 + w) */
  bool fused;                           /* q / k / v stored as one qkv_proj, gate / up as one gate_up_proj (phi3):
                                           a LoRA adapter adapts the fused matrices, as PEFT does */
  bk_act act;                           /* BK_ACT_SILU or BK_ACT_GELU_TANH */
  bk_weight embed, lm_head;             /* borrowed (lm_head may be embed's) */
  float *final_norm;                    /* owned: [hidden] */
  train_layer_view *layers;             /* owned: n_layers */
} train_view;

/* Fills v from m, or refuses what the trainer does not run (the message names it). */
int train_view_get(model *m, train_view *v, herr *err);
void train_view_free(train_view *v);

#endif
