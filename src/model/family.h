/* family.h — what distinguishes one decoder family from another. Every
 * supported model_type is a decoder (embed → N × [norm, attention, norm,
 * feed-forward] → norm → lm_head) built from the shared layers of
 * layers.c; a family is one row of family.c — its names, its config.json's
 * defaults, the switches of the shared layers, its capabilities — and the
 * hooks (family_ops, internal.h) the row names: its own config keys and
 * state, its layers, and the code behind its capabilities (in its own file
 * where its layers are put together differently: qwen3_moe.c, gemma4.c).
 * family.c holds one row per model_type with the transformers file it
 * follows. */
#ifndef HEARTH_MODEL_FAMILY_H
#define HEARTH_MODEL_FAMILY_H

#include <stdbool.h>

#include "format/config.h"

struct family_ops;

typedef struct model_family {
  const char *model_type;
  const char *listed;      /* how the list of supported types names it (NULL: model_type, and for a
                              "T_text" type also "T (text part)", the multimodal checkpoint's text stack) */
  config_defaults cfg;     /* what its config.json means where it is silent, and which layers slide or are
                              linear (recurrent: cfg.linear, layers that keep a per-sequence state) */
  /* the shared layers' switches */
  bool unit_offset_norm;   /* RMSNorm scales by (1 + w) (gemma2/3) */
  bool sandwich_norms;     /* post-attention norm on the attention output, pre/post feed-forward norms (gemma) */
  bool scale_embeddings;   /* embeddings × sqrt(hidden), rounded to the model dtype (gemma) */
  bool qk_norm;            /* RMSNorm over each q and k head before RoPE (qwen3, gemma3, gemma4) */
  bool fused_qkv;          /* self_attn.qkv_proj and mlp.gate_up_proj (phi3) */
  bool query_pre_attn_scalar; /* attention scale = query_pre_attn_scalar^-0.5 (gemma2/3) */
  bool v_norm;             /* RMSNorm without scale over each value head; attention scale 1 (gemma4) */
  /* capabilities, each run by its hook */
  bool split;              /* tensor parallelism: ops->shard cuts it over ranks (false: refused at load) */
  bool canvas;             /* block diffusion: canvas passes, ops->canvas their length */
  const char *mtp;         /* a checkpoint's multi-token-prediction layer as messages name its tensors
                              (ops->mtp_of finds it, ops->mtp runs it); NULL: the family has none */
  const struct family_ops *ops; /* its hooks (llama_family_ops: the llama decoder's layers in decoder.c) */
} model_family;

/* NULL when the type is not a supported decoder. */
const model_family *model_family_find(const char *model_type);
/* The i-th row of the table; NULL past the last. */
const model_family *model_family_at(int i);

#endif
