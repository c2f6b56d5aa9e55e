/* qwen3_moe.c — Qwen3-MoE (transformers' models/qwen3_moe): the qwen3
 * decoder whose MLP is, on the layers decoder_sparse_step and
 * mlp_only_layers pick, a sparse MoE block: router = mlp.gate [experts,
 * hidden] → softmax → top num_experts_per_tok (renormalized when
 * norm_topk_prob) → the chosen experts' gated MLPs, weighted. Experts are
 * read per expert (mlp.experts.N.*_proj.weight) or stacked 3-D
 * (mlp.experts.gate_up_proj / down_proj). Attention is the llama
 * decoder's, with q/k norms. */
#include <stdio.h>

#include "model/internal.h"

static int load_layer(model *m, const weight_src *src, int l, herr *err) {
  const model_config *c = &m->cfg;
  layer_weights *lw = &m->layers[l];
  int rc = llama_load_attention(m, src, l, err);
  if (rc) return rc;
  lw->moe = c->moe_layer[l];
  if (!lw->moe) return llama_load_mlp(m, src, l, c->intermediate_size, err);
  char name[256];
  snprintf(name, sizeof name, "model.layers.%d.mlp.gate.weight", l);
  if ((rc = model_matrix(m, src, name, c->num_experts, c->hidden_size, true, BK_USE_MATMUL, &lw->router, err))) return rc;
  snprintf(name, sizeof name, "model.layers.%d.mlp.experts", l);
  return model_experts(m, src, name, c->num_experts, c->moe_intermediate_size, lw, err);
}

/* x += attention; x += (experts or mlp)(norm(x)) */
static void layer(model *m, int l, const kv_store *kv, step *st) {
  const layer_weights *lw = &m->layers[l];
  layer_attention(m, l, kv, st);
  layer_norm(m, &st->xn, &st->x, &lw->post_attn_norm);
  bk_tensor o = step_view(&st->o, st->T, m->cfg.hidden_size);
  if (lw->moe) layer_moe(m, lw, st, &st->xn, &st->xn, &o);
  else layer_mlp(m, lw, st, &st->xn, &o);
  bk_add(&st->x, &st->x, &o);
}

const family_ops qwen3_moe_family_ops = {.load_layer = load_layer, .layer = layer, .shard = tp_shard_layers};
