/* qwen3_moe.c — Qwen3-MoE (transformers' models/qwen3_moe): the qwen3
 * decoder whose MLP is, on the layers decoder_sparse_step and
 * mlp_only_layers pick, a sparse MoE block: router = mlp.gate [experts,
 * hidden] → softmax → top num_experts_per_tok (renormalized when
 * norm_topk_prob) → the chosen experts' gated MLPs, weighted. Experts are
 * read per expert (mlp.experts.N.*_proj.weight) or stacked 3-D
 * (mlp.experts.gate_up_proj / down_proj). Attention is the llama
 * decoder's, with q/k norms. Owns its config keys (the experts' shape,
 * norm_topk_prob, decoder_sparse_step, mlp_only_layers), which it writes
 * into the shared experts' fields of the config. */
#include <stdio.h>

#include "base/json.h"
#include "model/internal.h"

/* Experts on layer l unless l is in mlp_only_layers or (l + 1) % decoder_sparse_step != 0. */
static int config(model *m, herr *err) {
  model_config *c = &m->cfg;
  const json_t *j = c->raw;
  const char *what = "config.json";
  c->num_experts = 128, c->num_experts_per_tok = 8, c->moe_intermediate_size = 768;
  int rc = config_experts(j, c, "num_experts_per_tok", what, err);
  if (rc) return rc;
  if ((rc = hjson_get_bool(j, "norm_topk_prob", false, &c->norm_topk_prob, what, err))) return rc;
  int64_t step = 1;
  if ((rc = config_int_range(j, "decoder_sparse_step", false, 1, CFG_MAX_LAYERS, &step, what, err))) return rc;
  for (int64_t l = 0; l < c->num_hidden_layers; l++) c->moe_layer[l] = (l + 1) % step == 0;
  const json_t *only = json_object_get(j, "mlp_only_layers");
  if (only && !json_is_null(only)) {
    if (!json_is_array(only)) return herr_set(err, HEARTH_EFORMAT, "%s: 'mlp_only_layers' must be a list of layer indices", what);
    size_t i;
    json_t *e;
    json_array_foreach(only, i, e) {
      if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= c->num_hidden_layers)
        return herr_set(err, HEARTH_EFORMAT, "%s: mlp_only_layers[%zu] is not a layer index (0 to %lld)", what, i,
                        (long long)c->num_hidden_layers - 1);
      c->moe_layer[json_integer_value(e)] = false;
    }
  }
  return 0;
}

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

const family_ops qwen3_moe_family_ops = {.config = config, .load_layer = load_layer, .layer = layer, .shard = tp_shard_layers};
