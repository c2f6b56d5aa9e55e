/* gemma4.c — Gemma 4's text decoder (transformers' models/gemma4,
 * Gemma4TextModel; also the text stack of Gemma4ForConditionalGeneration
 * checkpoints, under model.language_model.). Per layer: sliding or full
 * attention with its own head size and KV heads (per_layer_config) and
 * RoPE (rope_parameters per layer type; full layers use proportional
 * partial RoPE), RMSNorm over each q, k and (without scale) v head and an
 * attention scale of 1; full layers may take keys as values
 * (attention_k_eq_v); the last num_kv_shared_layers layers compute no keys
 * or values and read the cache rows of the last earlier layer of their
 * type. Feed-forward: the gated MLP (twice as wide on shared layers with
 * use_double_wide_mlp), and with enable_moe_block a MoE branch beside it
 * (router: unscaled RMSNorm × scale × hidden^-0.5 → softmax → top-k,
 * renormalized, × per_expert_scale), each branch with its own norms. Then
 * the per-layer input (a per-token embedding slice and a projection of the
 * embeddings, gated into the residual stream) and layer_scalar. Norms
 * multiply by w (not 1 + w); embeddings are scaled by sqrt(hidden). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/internal.h"

int gemma4_prepare(model *m, herr *err) {
  const model_config *c = &m->cfg;
  int64_t L = c->num_hidden_layers, first = L - c->num_kv_shared_layers;
  for (int64_t l = 0; l < L; l++) {
    layer_weights *lw = &m->layers[l];
    if (l >= first) { /* the last earlier layer of the same type (config.c checked one exists) */
      for (int64_t s = first - 1; s >= 0; s--)
        if (c->layer_types[s] == c->layer_types[l]) {
          lw->kv_src = (int)s;
          break;
        }
      const layer_weights *sw = &m->layers[lw->kv_src];
      if (sw->head_dim != lw->head_dim || sw->kv_heads != lw->kv_heads)
        return herr_set(err, HEARTH_EFORMAT,
                        "layer %lld (head_dim %lld, %lld KV heads) shares the KV of layer %d (head_dim %lld, %lld KV heads)",
                        (long long)l, (long long)lw->head_dim, (long long)lw->kv_heads, lw->kv_src, (long long)sw->head_dim,
                        (long long)sw->kv_heads);
    }
    lw->inter = c->intermediate_size * (c->use_double_wide_mlp && l >= first && first > 0 ? 2 : 1);
    lw->moe = c->moe_layer[l];
    /* use_bidirectional_attention "vision": image and video soft tokens see their whole span on the
     * sliding layers (within the window); full layers stay causal */
    const char *bidir = json_string_value(json_object_get(c->raw, "use_bidirectional_attention"));
    lw->bidir_media = bidir && !strcmp(bidir, "vision") && c->layer_types[l] == LAYER_SLIDING;
  }
  int64_t dp = c->hidden_size_per_layer_input;
  m->w_ple = dp;
  m->w_inter = dp; /* the per-layer gate runs in the MLP's scratch */
  if (dp) {
    float s = sqrtf((float)dp);
    if (!strcmp(c->torch_dtype, "bfloat16")) s = bk_round_bf16(s);
    else if (!strcmp(c->torch_dtype, "float16")) s = bk_round_f16(s);
    m->ple_embed_scale = s;
  }
  return 0;
}

#define MAT(field, req, a, b, dst)                                                                   \
  do {                                                                                               \
    snprintf(name, sizeof name, "model.layers.%d.%s", l, field);                                     \
    if ((rc = model_matrix(m, src, name, a, b, req, BK_USE_MATMUL, dst, err))) return rc;            \
  } while (0)

#define LOAD(field, req, a, mul, dst)                                                                 \
  do {                                                                                                \
    snprintf(name, sizeof name, "model.layers.%d.%s", l, field);                                      \
    if ((rc = model_vector(m, src, name, 1, a, 0, req, mul, dst, err))) return rc;                   \
  } while (0)

int gemma4_load_layer(model *m, const weight_src *src, int l, herr *err) {
  const model_config *c = &m->cfg;
  layer_weights *lw = &m->layers[l];
  char name[256];
  int rc;
  int64_t H = c->num_attention_heads, KV = lw->kv_heads, hd = lw->head_dim, D = c->hidden_size, dp = c->hidden_size_per_layer_input;
  bool own_kv = lw->kv_src == l, k_eq_v = c->attention_k_eq_v && c->layer_types[l] == LAYER_FULL;
  LOAD("input_layernorm.weight", true, D, 1.0f, &lw->attn_norm);
  MAT("self_attn.q_proj.weight", true, H * hd, D, &lw->q);
  LOAD("self_attn.q_norm.weight", true, hd, 1.0f, &lw->q_norm);
  if (own_kv) {
    MAT("self_attn.k_proj.weight", true, KV * hd, D, &lw->k);
    if (!k_eq_v) MAT("self_attn.v_proj.weight", true, KV * hd, D, &lw->v);
    LOAD("self_attn.k_norm.weight", true, hd, 1.0f, &lw->k_norm);
  }
  MAT("self_attn.o_proj.weight", true, D, H * hd, &lw->o);
  if (c->attention_bias) {
    LOAD("self_attn.q_proj.bias", true, H * hd, 1.0f, &lw->q_bias);
    if (own_kv) {
      LOAD("self_attn.k_proj.bias", true, KV * hd, 1.0f, &lw->k_bias);
      if (!k_eq_v) LOAD("self_attn.v_proj.bias", true, KV * hd, 1.0f, &lw->v_bias);
    }
    LOAD("self_attn.o_proj.bias", true, D, 1.0f, &lw->o_bias);
  }
  LOAD("post_attention_layernorm.weight", true, D, 1.0f, &lw->post_attn_norm);
  LOAD("pre_feedforward_layernorm.weight", true, D, 1.0f, &lw->pre_ffn_norm);
  LOAD("post_feedforward_layernorm.weight", true, D, 1.0f, &lw->post_ffn_norm);
  if ((rc = llama_load_mlp(m, src, l, lw->inter, err))) return rc;
  if (lw->moe) {
    int64_t E = c->num_experts;
    MAT("router.proj.weight", true, E, D, &lw->router);
    LOAD("router.scale", true, D, (float)(1.0 / sqrt((double)D)), &lw->router_norm);
    LOAD("router.per_expert_scale", true, E, 1.0f, &lw->expert_scale);
    LOAD("pre_feedforward_layernorm_2.weight", true, D, 1.0f, &lw->pre_ffn_norm_2);
    LOAD("post_feedforward_layernorm_1.weight", true, D, 1.0f, &lw->post_ffn_norm_1);
    LOAD("post_feedforward_layernorm_2.weight", true, D, 1.0f, &lw->post_ffn_norm_2);
    snprintf(name, sizeof name, "model.layers.%d.experts", l);
    if ((rc = model_experts(m, src, name, E, c->moe_intermediate_size, lw, err))) return rc;
  }
  if (dp) {
    MAT("per_layer_input_gate.weight", true, dp, D, &lw->ple_gate);
    MAT("per_layer_projection.weight", true, D, dp, &lw->ple_proj);
    LOAD("post_per_layer_input_norm.weight", true, D, 1.0f, &lw->ple_norm);
  }
  snprintf(name, sizeof name, "model.layers.%d.layer_scalar", l);
  rc = model_host_floats(m, src, name, 1, &lw->scalar, err);
  if (rc == HEARTH_ENOTFOUND) { /* a buffer of ones in transformers: absent means 1 */
    lw->scalar = 1.0f;
    herr_clear(err);
    rc = 0;
  }
  if (!rc && !isfinite(lw->scalar)) rc = herr_set(err, HEARTH_EFORMAT, "%s: is not a finite number", name);
  return rc;
}
#undef MAT
#undef LOAD

static int load_model(model *m, const weight_src *src, herr *err) {
  const model_config *c = &m->cfg;
  int64_t dp = c->hidden_size_per_layer_input, L = c->num_hidden_layers, D = c->hidden_size;
  if (!dp) return 0;
  int rc;
  if ((rc = model_matrix(m, src, "model.embed_tokens_per_layer.weight", c->vocab_size_per_layer_input, L * dp, true, BK_USE_EMBED,
                         &m->ple_embed, err)) ||
      (rc = model_matrix(m, src, "model.per_layer_model_projection.weight", L * dp, D, true, BK_USE_MATMUL, &m->ple_model_proj, err)) ||
      (rc = model_vector(m, src, "model.per_layer_projection_norm.weight", 1, dp, 0, true, 1.0f, &m->ple_proj_norm, err)))
    return rc;
  return 0;
}

/* The per-layer inputs of every layer, [T, layers × ple] in st->ple:
 * (norm(embeddings · projᵀ × hidden^-0.5) + per-layer embedding × sqrt(ple)) × 2^-0.5. */
static void embedded(model *m, step *st) {
  const model_config *c = &m->cfg;
  int64_t T = st->T, dp = c->hidden_size_per_layer_input, W = c->num_hidden_layers * dp;
  if (!dp) return;
  bk_tensor both = step_view(&st->ple, 2 * T, W), proj = bk_rows(&both, 0, T), tok = bk_rows(&both, T, T);
  bk_matmul_t(&proj, &st->x, &m->ple_model_proj, NULL);
  bk_scale(&proj, (float)(1.0 / sqrt((double)c->hidden_size)));
  bk_tensor heads = bk_reshape(&proj, T * c->num_hidden_layers, dp);
  layer_norm(m, &heads, &heads, &m->ple_proj_norm);
  bk_embed(&tok, &m->ple_embed, &st->ids, m->ple_embed_scale);
  model_reduce(m, &tok); /* vocabulary-parallel like the embedding: one rank holds each token's row */
  bk_add(&proj, &proj, &tok);
  bk_scale(&proj, (float)sqrt(0.5));
}

/* Tensor parallelism: attention by heads (KV-shared layers read their source's heads, split alike), the
 * MLP and the MoE branch by width (the router and its scales replicated), the per-layer input gate and
 * projection replicated (small; they run on the whole residual stream), and the per-layer embedding
 * table split by vocabulary rows like the embedding (it is the largest table: each rank keeps its ids'
 * rows and a zero row, and the lookups are summed by an all-reduce). */
static int shard(model *m, herr *err) {
  const model_config *c = &m->cfg;
  int rc = tp_shard_layers(m, err);
  if (rc || !c->hidden_size_per_layer_input) return rc;
  if (c->vocab_size_per_layer_input != c->vocab_size)
    return herr_set(err, HEARTH_EUNSUPPORTED,
                    "tensor parallelism: vocab_size_per_layer_input %lld differs from vocab_size %lld, so the per-layer "
                    "embedding table does not split with the vocabulary",
                    (long long)c->vocab_size_per_layer_input, (long long)c->vocab_size);
  return tp_vocab_rows(m, &m->ple_embed, "model.embed_tokens_per_layer.weight", err);
}

void gemma4_feed_forward(model *m, const layer_weights *lw, step *st, const bk_tensor *o, bool experts) {
  layer_norm(m, &st->xn, &st->x, &lw->pre_ffn_norm);
  layer_mlp(m, lw, st, &st->xn, o);
  if (experts) { /* the experts beside the MLP, both from the residual stream */
    layer_norm(m, o, o, &lw->post_ffn_norm_1);
    layer_norm(m, &st->xn, &st->x, &lw->router_norm);
    layer_route(m, lw, st, &st->xn);
    layer_norm(m, &st->xn, &st->x, &lw->pre_ffn_norm_2);
    layer_experts(m, lw, st, &st->xn, &st->x2);
    layer_norm(m, &st->x2, &st->x2, &lw->post_ffn_norm_2);
    bk_add(o, o, &st->x2);
  }
  layer_norm(m, o, o, &lw->post_ffn_norm);
  bk_add(&st->x, &st->x, o);
}

static void layer(model *m, int l, const kv_store *kv, step *st) {
  const model_config *c = &m->cfg;
  const layer_weights *lw = &m->layers[l];
  int64_t T = st->T, D = c->hidden_size, dp = c->hidden_size_per_layer_input;
  layer_attention(m, l, kv, st); /* x += post_attn_norm(attention(input_norm(x))) */
  bk_tensor o = step_view(&st->o, T, D);
  gemma4_feed_forward(m, lw, st, &o, lw->moe);
  if (dp) { /* x += norm(proj(act(gate(x)) * this layer's per-layer input)) */
    bk_tensor g = step_view(&st->gate, T, dp), pl = step_view(&st->pl, T, dp), all = step_view(&st->ple, T, c->num_hidden_layers * dp);
    bk_matmul_t(&g, &st->x, &lw->ple_gate, NULL);
    bk_get_cols(&pl, &all, l * dp);
    bk_act_mul(&g, &pl, model_act(m));
    bk_matmul_t(&o, &g, &lw->ple_proj, NULL);
    layer_norm(m, &o, &o, &lw->ple_norm);
    bk_add(&st->x, &st->x, &o);
  }
  if (lw->scalar != 1.0f) bk_scale(&st->x, lw->scalar);
}

const family_ops gemma4_family_ops = {
    .prepare = gemma4_prepare, .load_layer = gemma4_load_layer, .load_model = load_model, .embedded = embedded, .layer = layer,
    .shard = shard};
