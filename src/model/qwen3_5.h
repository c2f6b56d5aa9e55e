/* qwen3_5.h — Qwen3.5's layers shared by its dense and MoE files (defined
 * in qwen3_5.c, used by qwen3_5_moe.c): its config keys, per-layer geometry
 * and scratch widths, the token mixer of layer l (its gated attention or its
 * Gated DeltaNet) loaded and run, its tensor-parallel split, and the
 * multi-token-prediction layer. */
#ifndef HEARTH_MODEL_QWEN3_5_H
#define HEARTH_MODEL_QWEN3_5_H

#include "model/internal.h"

/* Its config keys (the linear attention's sizes; moe: Qwen3.5-MoE's experts and shared expert). */
int qwen3_5_config(model *m, bool moe, herr *err);
/* shared_expert_intermediate_size (Qwen3.5-MoE) */
int64_t qwen3_5_shared_inter(const model *m);
const model_mtp *qwen3_5_mtp_of(const model *m);
int qwen3_5_prepare(model *m, herr *err);
int qwen3_5_load_mixer(model *m, const weight_src *src, int l, herr *err);
/* A layer's token mixer's weights under prefix ("model.layers.N." or "mtp.layers.0.") into lw. */
int qwen3_5_load_mixer_at(model *m, const weight_src *src, const char *prefix, layer_weights *lw, herr *err);
void qwen3_5_mixer(model *m, int l, const kv_store *kv, step *st);
/* Its tensor-parallel split: each layer's token mixer by heads, its MLP or experts by width. */
int qwen3_5_shard(model *m, herr *err);
/* The multi-token-prediction layer (mtp.*), when the checkpoint has one: load_ffn loads its feed-forward
 * under a prefix, ffn runs it (x += ffn(post_attn_norm(x))). */
typedef int (*qwen3_5_load_ffn)(model *m, const weight_src *src, const char *prefix, layer_weights *lw, herr *err);
typedef void (*qwen3_5_ffn)(model *m, const layer_weights *lw, step *st);
int qwen3_5_load_mtp(model *m, const weight_src *src, qwen3_5_load_ffn load_ffn, qwen3_5_ffn ffn, herr *err);
void qwen3_5_mtp(model *m, const kv_store *kv, step *st, const bk_tensor *h);
void qwen3_5_free(model *m);

#endif
