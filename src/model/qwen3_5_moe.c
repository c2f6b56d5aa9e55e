/* qwen3_5_moe.c — Qwen3.5-MoE's text decoder (transformers' models/qwen3_5_moe,
 * Qwen3_5MoeTextModel): Qwen3.5's hybrid token mixers (qwen3_5.c) with a
 * sparse MoE block on every layer: router mlp.gate [experts, hidden] →
 * softmax → top num_experts_per_tok, renormalized → the chosen experts
 * (stacked mlp.experts.gate_up_proj / down_proj, or per expert), plus a
 * shared expert (a gated MLP of shared_expert_intermediate_size) scaled by
 * sigmoid(mlp.shared_expert_gate · x). */
#include <stdio.h>

#include "model/internal.h"
#include "model/qwen3_5.h"

/* The sparse block under prefix ("model.layers.N." or "mtp.layers.0."). */
static int load_moe_at(model *m, const weight_src *src, const char *prefix, layer_weights *lw, herr *err) {
  const model_config *c = &m->cfg;
  int rc;
  char name[256];
  int64_t D = c->hidden_size, I = qwen3_5_shared_inter(m);
  lw->inter = I;
  static const char *const shared[] = {"gate_proj", "up_proj", "down_proj"};
  bk_weight *dst[] = {&lw->gate, &lw->up, &lw->down};
  for (int i = 0; i < 3; i++) {
    snprintf(name, sizeof name, "%smlp.shared_expert.%s.weight", prefix, shared[i]);
    if ((rc = model_matrix(m, src, name, i == 2 ? D : I, i == 2 ? I : D, true, BK_USE_MATMUL, dst[i], err))) return rc;
  }
  snprintf(name, sizeof name, "%smlp.shared_expert_gate.weight", prefix);
  if ((rc = model_matrix(m, src, name, 1, D, true, BK_USE_MATMUL, &lw->shared_gate, err))) return rc;
  snprintf(name, sizeof name, "%smlp.gate.weight", prefix);
  if ((rc = model_matrix(m, src, name, c->num_experts, D, true, BK_USE_MATMUL, &lw->router, err))) return rc;
  snprintf(name, sizeof name, "%smlp.experts", prefix);
  lw->moe = true;
  return model_experts(m, src, name, c->num_experts, c->moe_intermediate_size, lw, err);
}

static int load_layer(model *m, const weight_src *src, int l, herr *err) {
  int rc = qwen3_5_load_mixer(m, src, l, err);
  if (rc) return rc;
  char prefix[64];
  snprintf(prefix, sizeof prefix, "model.layers.%d.", l);
  return load_moe_at(m, src, prefix, &m->layers[l], err);
}

static int prepare(model *m, herr *err) {
  int rc = qwen3_5_prepare(m, err);
  for (int l = 0; !rc && l < m->cfg.num_hidden_layers; l++) m->layers[l].inter = qwen3_5_shared_inter(m);
  return rc;
}

/* x += experts(norm(x)) + sigmoid(shared_gate · norm(x)) · shared(norm(x)) */
static void ffn(model *m, const layer_weights *lw, step *st) {
  int64_t T = st->T;
  layer_norm(m, &st->xn, &st->x, &lw->post_attn_norm);
  bk_tensor o = step_view(&st->o, T, m->cfg.hidden_size), g = step_view(&st->elog, T, 1);
  layer_moe(m, lw, st, &st->xn, &st->xn, &o);
  layer_mlp(m, lw, st, &st->xn, &st->x2);
  bk_matmul_t(&g, &st->xn, &lw->shared_gate, NULL);
  bk_sigmoid_mul(&st->x2, &g);
  bk_add(&o, &o, &st->x2);
  bk_add(&st->x, &st->x, &o);
}

/* x += mixer(norm(x)); x += ffn(x) */
static void layer(model *m, int l, const kv_store *kv, step *st) {
  qwen3_5_mixer(m, l, kv, st);
  ffn(m, &m->layers[l], st);
}

static int load_model(model *m, const weight_src *src, herr *err) { return qwen3_5_load_mtp(m, src, load_moe_at, ffn, err); }

static int config(model *m, herr *err) { return qwen3_5_config(m, true, err); }

const family_ops qwen3_5_moe_family_ops = {.config = config, .mtp_of = qwen3_5_mtp_of, .prepare = prepare, .load_layer = load_layer, .load_model = load_model,
                                           .layer = layer, .mtp = qwen3_5_mtp, .shard = qwen3_5_shard, .free = qwen3_5_free};
