/* family.h — what distinguishes one decoder family from another, as data.
 * Every supported model_type is a llama-shaped decoder (embed → N × [norm,
 * attention, norm, MLP] → norm → lm_head) plus a few switches; family.c
 * holds one entry per model_type with the transformers file it follows. */
#ifndef HEARTH_MODEL_FAMILY_H
#define HEARTH_MODEL_FAMILY_H

#include <stdbool.h>

typedef struct model_family {
  const char *model_type;
  bool unit_offset_norm;   /* RMSNorm scales by (1 + w) (gemma) */
  bool sandwich_norms;     /* post-attention norm on the attention output, pre/post feed-forward norms (gemma2/3) */
  bool scale_embeddings;   /* embeddings × sqrt(hidden), rounded to the model dtype (gemma) */
  bool qk_norm;            /* RMSNorm over each q and k head before RoPE (qwen3, gemma3) */
  bool fused_qkv;          /* self_attn.qkv_proj and mlp.gate_up_proj (phi3) */
  bool query_pre_attn_scalar; /* attention scale = query_pre_attn_scalar^-0.5 (gemma) */
} model_family;

/* NULL when the type is not a supported decoder. */
const model_family *model_family_find(const char *model_type);

#endif
