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
 * multiply by w (not 1 + w); embeddings are scaled by sqrt(hidden).
 * Owns its config keys (per_layer_config, global_head_dim, per-layer inputs,
 * KV sharing, enable_moe_block and the experts), its per-layer inputs'
 * weights and the norms of its MoE branch (gemma4_state, in fam_state). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "model/gemma4.h"
#include "model/internal.h"

static gemma4_state *S(const model *m) { return (gemma4_state *)m->fam_state; }

/* gemma4_text's own keys from c->raw into s and the shared per-layer fields of m->cfg:
 * per_layer_config (or global_head_dim / num_global_key_value_heads on the full-attention
 * layers), per-layer inputs, KV sharing, the MoE block. DiffusionGemma's stack: full layers
 * always take keys as values (no v_proj there), every layer has the MoE branch, no per-layer
 * inputs and no KV sharing. */
int gemma4_read_config(model *m, gemma4_state *s, bool diffusion, herr *err) {
  model_config *c = &m->cfg;
  const json_t *j = c->raw;
  const char *what = "config.json";
  int rc;
  int64_t L = c->num_hidden_layers;
  c->layer_types[L - 1] = LAYER_FULL; /* transformers forces the last layer to full attention */
  s->k_eq_v = diffusion;
  if (diffusion) {
    const json_t *bi = json_object_get(j, "use_bidirectional_attention");
    if (json_is_string(bi) && !strcmp(json_string_value(bi), "all"))
      return herr_set(err, HEARTH_EUNSUPPORTED, "%s: use_bidirectional_attention 'all' (a bidirectional encoder) is not supported", what);
  }
  if ((!diffusion && (rc = hjson_get_bool(j, "attention_k_eq_v", false, &s->k_eq_v, what, err))) ||
      (rc = hjson_get_bool(j, "use_double_wide_mlp", false, &s->double_wide, what, err)))
    return rc;
  const json_t *plc = json_object_get(j, "per_layer_config");
  if (plc && !json_is_null(plc)) {
    if (!json_is_object(plc)) return herr_set(err, HEARTH_EFORMAT, "%s: 'per_layer_config' must be an object", what);
    const char *key;
    json_t *o;
    json_object_foreach((json_t *)plc, key, o) {
      char *end;
      long l = strtol(key, &end, 10);
      if (*end || end == key || l < 0 || l >= L)
        return herr_set(err, HEARTH_EFORMAT, "%s: per_layer_config key '%s' is not a layer index (0 to %lld)", what, key,
                        (long long)L - 1);
      if (!json_is_object(o)) return herr_set(err, HEARTH_EFORMAT, "%s: per_layer_config['%s'] must be an object", what, key);
      const char *f;
      json_t *v;
      json_object_foreach(o, f, v) {
        if (strcmp(f, "head_dim") && strcmp(f, "num_key_value_heads"))
          return herr_set(err, HEARTH_EUNSUPPORTED, "%s: per_layer_config['%s'] overrides '%s' (supported: head_dim, num_key_value_heads)",
                          what, key, f);
      }
      char sub[400];
      snprintf(sub, sizeof sub, "%s: per_layer_config['%s']", what, key);
      if ((rc = config_int_range(o, "head_dim", false, 2, 4096, &c->layer_head_dim[l], sub, err)) ||
          (rc = config_int_range(o, "num_key_value_heads", false, 1, c->num_attention_heads, &c->layer_kv_heads[l], sub, err)))
        return rc;
    }
  } else {
    int64_t ghd = 512, gkv = 0;
    if ((rc = config_int_range(j, "global_head_dim", false, 2, 4096, &ghd, what, err)) ||
        (rc = config_int_range(j, "num_global_key_value_heads", false, 1, c->num_attention_heads, &gkv, what, err)))
      return rc;
    for (int64_t l = 0; l < L; l++)
      if (c->layer_types[l] == LAYER_FULL) {
        c->layer_head_dim[l] = ghd;
        if (gkv > 0 && s->k_eq_v) c->layer_kv_heads[l] = gkv;
      }
  }
  for (int64_t l = 0; l < L; l++) {
    if (c->num_attention_heads % c->layer_kv_heads[l])
      return herr_set(err, HEARTH_EFORMAT, "%s: layer %lld: num_attention_heads %lld is not a multiple of its num_key_value_heads %lld", what,
                      (long long)l, (long long)c->num_attention_heads, (long long)c->layer_kv_heads[l]);
    if (c->layer_head_dim[l] % 2)
      return herr_set(err, HEARTH_EFORMAT, "%s: layer %lld: head_dim %lld is not even", what, (long long)l, (long long)c->layer_head_dim[l]);
  }
  s->ple_dim = diffusion ? 0 : 256;
  s->ple_vocab = 262144;
  if (!diffusion &&
      ((rc = config_int_range(j, "hidden_size_per_layer_input", false, 0, 1 << 16, &s->ple_dim, what, err)) ||
       (rc = config_int_range(j, "vocab_size_per_layer_input", false, 1, 1 << 24, &s->ple_vocab, what, err)) ||
       (rc = config_int_range(j, "num_kv_shared_layers", false, 0, L - 1, &s->kv_shared, what, err))))
    return rc;
  if (s->ple_dim && s->ple_vocab < c->vocab_size)
    return herr_set(err, HEARTH_EFORMAT, "%s: vocab_size_per_layer_input %lld is smaller than vocab_size %lld", what,
                    (long long)s->ple_vocab, (long long)c->vocab_size);
  /* a shared layer reads the last non-shared layer of its type, which must exist */
  int64_t first = L - s->kv_shared;
  for (int64_t l = first; l < L; l++) {
    bool found = false;
    for (int64_t k = 0; k < first; k++) found |= c->layer_types[k] == c->layer_types[l];
    if (!found)
      return herr_set(err, HEARTH_EFORMAT, "%s: num_kv_shared_layers %lld leaves layer %lld (%s) no earlier layer of its type to read", what,
                      (long long)s->kv_shared, (long long)l, c->layer_types[l] == LAYER_SLIDING ? "sliding" : "full");
  }
  bool moe = diffusion;
  if (!diffusion && (rc = hjson_get_bool(j, "enable_moe_block", false, &moe, what, err))) return rc;
  if (moe) {
    static const char *const need[] = {"num_experts", "top_k_experts", "moe_intermediate_size"};
    for (int i = 0; i < 3; i++)
      if (!json_is_integer(json_object_get(j, need[i])))
        return herr_set(err, HEARTH_EFORMAT, "%s: enable_moe_block needs an integer '%s'", what, need[i]);
    if ((rc = config_experts(j, c, "top_k_experts", what, err))) return rc;
    c->norm_topk_prob = true;
    for (int64_t l = 0; l < L; l++) c->moe_layer[l] = true;
  }
  if (!(s->layers = calloc((size_t)L, sizeof *s->layers))) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  return 0;
}

void gemma4_state_free(gemma4_state *s) {
  if (s) free(s->layers);
}

static int config(model *m, herr *err) {
  gemma4_state *s = calloc(1, sizeof *s);
  if (!s) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  m->fam_state = s;
  return gemma4_read_config(m, s, false, err);
}

static void free_state(model *m) {
  gemma4_state_free(S(m));
  free(m->fam_state);
  m->fam_state = NULL;
}

int gemma4_prepare(model *m, herr *err) {
  const model_config *c = &m->cfg;
  gemma4_state *s = S(m);
  int64_t L = c->num_hidden_layers, first = L - s->kv_shared;
  for (int64_t l = 0; l < L; l++) {
    layer_weights *lw = &m->layers[l];
    if (l >= first) { /* the last earlier layer of the same type (gemma4_read_config checked one exists) */
      for (int64_t k = first - 1; k >= 0; k--)
        if (c->layer_types[k] == c->layer_types[l]) {
          lw->kv_src = (int)k;
          break;
        }
      const layer_weights *sw = &m->layers[lw->kv_src];
      if (sw->head_dim != lw->head_dim || sw->kv_heads != lw->kv_heads)
        return herr_set(err, HEARTH_EFORMAT,
                        "layer %lld (head_dim %lld, %lld KV heads) shares the KV of layer %d (head_dim %lld, %lld KV heads)",
                        (long long)l, (long long)lw->head_dim, (long long)lw->kv_heads, lw->kv_src, (long long)sw->head_dim,
                        (long long)sw->kv_heads);
    }
    lw->inter = c->intermediate_size * (s->double_wide && l >= first && first > 0 ? 2 : 1);
    lw->moe = c->moe_layer[l];
    /* use_bidirectional_attention "vision": image and video soft tokens see their whole span on the
     * sliding layers (within the window); full layers stay causal */
    const char *bidir = json_string_value(json_object_get(c->raw, "use_bidirectional_attention"));
    lw->bidir_media = bidir && !strcmp(bidir, "vision") && c->layer_types[l] == LAYER_SLIDING;
  }
  int64_t dp = s->ple_dim;
  m->w_fam = (2 * L + 1) * dp; /* the per-layer inputs of both halves [2T, L dp], then this layer's [T, dp] */
  m->w_inter = dp; /* the per-layer gate runs in the MLP's scratch */
  if (dp) {
    float sc = sqrtf((float)dp);
    if (!strcmp(c->torch_dtype, "bfloat16")) sc = bk_round_bf16(sc);
    else if (!strcmp(c->torch_dtype, "float16")) sc = bk_round_f16(sc);
    s->ple_embed_scale = sc;
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
  gemma4_state *s = S(m);
  layer_weights *lw = &m->layers[l];
  gemma4_layer *gl = &s->layers[l];
  char name[256];
  int rc;
  int64_t H = c->num_attention_heads, KV = lw->kv_heads, hd = lw->head_dim, D = c->hidden_size, dp = s->ple_dim;
  bool own_kv = lw->kv_src == l, k_eq_v = s->k_eq_v && c->layer_types[l] == LAYER_FULL;
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
    LOAD("router.scale", true, D, (float)(1.0 / sqrt((double)D)), &gl->router_norm);
    LOAD("router.per_expert_scale", true, E, 1.0f, &lw->expert_scale);
    LOAD("pre_feedforward_layernorm_2.weight", true, D, 1.0f, &gl->pre_ffn_norm_2);
    LOAD("post_feedforward_layernorm_1.weight", true, D, 1.0f, &gl->post_ffn_norm_1);
    LOAD("post_feedforward_layernorm_2.weight", true, D, 1.0f, &gl->post_ffn_norm_2);
    snprintf(name, sizeof name, "model.layers.%d.experts", l);
    if ((rc = model_experts(m, src, name, E, c->moe_intermediate_size, lw, err))) return rc;
  }
  if (dp) {
    MAT("per_layer_input_gate.weight", true, dp, D, &gl->ple_gate);
    MAT("per_layer_projection.weight", true, D, dp, &gl->ple_proj);
    LOAD("post_per_layer_input_norm.weight", true, D, 1.0f, &gl->ple_norm);
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
  gemma4_state *s = S(m);
  int64_t dp = s->ple_dim, L = c->num_hidden_layers, D = c->hidden_size;
  if (!dp) return 0;
  int rc;
  if ((rc = model_matrix(m, src, "model.embed_tokens_per_layer.weight", s->ple_vocab, L * dp, true, BK_USE_EMBED, &s->ple_embed,
                         err)) ||
      (rc = model_matrix(m, src, "model.per_layer_model_projection.weight", L * dp, D, true, BK_USE_MATMUL, &s->ple_model_proj, err)) ||
      (rc = model_vector(m, src, "model.per_layer_projection_norm.weight", 1, dp, 0, true, 1.0f, &s->ple_proj_norm, err)))
    return rc;
  return 0;
}

/* The per-layer inputs of every layer, [T, layers × ple] at the start of st->fam:
 * (norm(embeddings · projᵀ × hidden^-0.5) + per-layer embedding × sqrt(ple)) × 2^-0.5. */
static void embedded(model *m, step *st) {
  const model_config *c = &m->cfg;
  gemma4_state *s = S(m);
  int64_t T = st->T, dp = s->ple_dim, W = c->num_hidden_layers * dp;
  if (!dp) return;
  bk_tensor both = step_view(&st->fam, 2 * T, W), proj = bk_rows(&both, 0, T), tok = bk_rows(&both, T, T);
  bk_matmul_t(&proj, &st->x, &s->ple_model_proj, NULL);
  bk_scale(&proj, (float)(1.0 / sqrt((double)c->hidden_size)));
  bk_tensor heads = bk_reshape(&proj, T * c->num_hidden_layers, dp);
  layer_norm(m, &heads, &heads, &s->ple_proj_norm);
  bk_embed(&tok, &s->ple_embed, &st->ids, s->ple_embed_scale);
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
  gemma4_state *s = S(m);
  int rc = tp_shard_layers(m, err);
  if (rc || !s->ple_dim) return rc;
  if (s->ple_vocab != c->vocab_size)
    return herr_set(err, HEARTH_EUNSUPPORTED,
                    "tensor parallelism: vocab_size_per_layer_input %lld differs from vocab_size %lld, so the per-layer "
                    "embedding table does not split with the vocabulary",
                    (long long)s->ple_vocab, (long long)c->vocab_size);
  return tp_vocab_rows(m, &s->ple_embed, "model.embed_tokens_per_layer.weight", err);
}

/* The feed-forward of layer l with its residual: x += post_ffn_norm(mlp(pre_ffn_norm(x)) [+ the MoE branch]). */
void gemma4_ffn(model *m, int l, step *st) {
  const model_config *c = &m->cfg;
  const layer_weights *lw = &m->layers[l];
  const gemma4_layer *gl = &S(m)->layers[l];
  bk_tensor o = step_view(&st->o, st->T, c->hidden_size);
  layer_norm(m, &st->xn, &st->x, &lw->pre_ffn_norm);
  layer_mlp(m, lw, st, &st->xn, &o);
  if (lw->moe) { /* the experts beside the MLP, both from the residual stream */
    layer_norm(m, &o, &o, &gl->post_ffn_norm_1);
    layer_norm(m, &st->xn, &st->x, &gl->router_norm);
    layer_route(m, lw, st, &st->xn);
    layer_norm(m, &st->xn, &st->x, &gl->pre_ffn_norm_2);
    layer_experts(m, lw, st, &st->xn, &st->x2);
    layer_norm(m, &st->x2, &st->x2, &gl->post_ffn_norm_2);
    bk_add(&o, &o, &st->x2);
  }
  layer_norm(m, &o, &o, &lw->post_ffn_norm);
  bk_add(&st->x, &st->x, &o);
}

static void layer(model *m, int l, const kv_store *kv, step *st) {
  const model_config *c = &m->cfg;
  const layer_weights *lw = &m->layers[l];
  const gemma4_state *s = S(m);
  const gemma4_layer *gl = &s->layers[l];
  int64_t T = st->T, D = c->hidden_size, dp = s->ple_dim, L = c->num_hidden_layers;
  layer_attention(m, l, kv, st); /* x += post_attn_norm(attention(input_norm(x))) */
  gemma4_ffn(m, l, st);
  if (dp) { /* x += norm(proj(act(gate(x)) * this layer's per-layer input)) */
    bk_tensor o = step_view(&st->o, T, D), g = step_view(&st->gate, T, dp), all = step_view(&st->fam, T, L * dp);
    bk_tensor rows = step_view(&st->fam, (2 * L + 1) * T, dp), pl = bk_rows(&rows, 2 * L * T, T);
    bk_matmul_t(&g, &st->x, &gl->ple_gate, NULL);
    bk_get_cols(&pl, &all, l * dp);
    bk_act_mul(&g, &pl, model_act(m));
    bk_matmul_t(&o, &g, &gl->ple_proj, NULL);
    layer_norm(m, &o, &o, &gl->ple_norm);
    bk_add(&st->x, &st->x, &o);
  }
  if (lw->scalar != 1.0f) bk_scale(&st->x, lw->scalar);
}

const family_ops gemma4_family_ops = {
    .config = config, .prepare = gemma4_prepare, .load_layer = gemma4_load_layer, .load_model = load_model, .embedded = embedded,
    .layer = layer, .shard = shard, .free = free_state};
