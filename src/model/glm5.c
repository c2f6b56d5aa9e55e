/* glm5.c — GLM-5 (transformers' models/glm_moe_dsa): multi-head latent
 * attention with DeepSeek sparse attention, and DeepSeek-V3's mixture of
 * experts.
 *
 * Attention of a layer, for hidden x (after input_layernorm):
 *   q_resid = rmsnorm(q_a_proj · x)                 [q_lora_rank]
 *   q_h     = q_b_proj_h · q_resid = [q_nope_h | q_rope_h]
 *   latent  = rmsnorm(kv_a_proj_with_mqa[:kv_lora_rank] · x)
 *   k_rope  = rope(kv_a_proj_with_mqa[kv_lora_rank:] · x)   (one head shared by all)
 *   kv_b_proj_h = [W_UK_h (nope rows) ; W_UV_h (v rows)] over the latent.
 * The cache keeps, per token, one K row [k_rope | latent] (RoPE first,
 * rope_dim + kv_lora_rank floats) and one V row holding the indexer's key.
 * The up-projections are absorbed: q_h · k_h = (W_UK_hᵀ q_nope_h) · latent +
 * q_rope_h · k_rope, so the query of head h becomes [rope(q_rope_h) |
 * W_UK_hᵀ q_nope_h] and attends the K rows directly (one KV head of
 * rope_dim + kv_lora_rank); the attention's output over the latents goes
 * through W_UV_h, then o_proj. Prefill and decode take the same path.
 * RoPE rotates interleaved pairs (2i, 2i + 1); transformers writes the
 * rotated halves apart afterwards, which permutes q and k alike and leaves
 * every dot product as it is. Softmax scale: qk_head_dim^-0.5, times
 * mscale(factor, mscale_all_dim)^2 under YaRN.
 *
 * The lightning indexer (DSA) picks, per query, the index_topk cached rows
 * attention may read: index query heads from wq_b · q_resid, one index key
 * per token from LayerNorm(wk · x) (both with RoPE on their first rope_dim
 * floats; the keys cached as the V rows), per-head weights from
 * weights_proj · x × heads^-0.5; score_j = Σ_h w_h relu(q_h · k_j /
 * sqrt(index_head_dim)), the best index_topk rows (every row while there
 * are fewer). A layer whose indexer_types entry is "shared" has no indexer
 * and reuses the previous layer's choice.
 *
 * Feed-forward: a dense gated MLP on the first first_k_dense_replace layers
 * (or where mlp_layer_types says "dense"), elsewhere the experts: sigmoid
 * router with e_score_correction_bias for the choice, group-limited
 * (n_group, topk_group), the chosen sigmoid scores renormalized
 * (norm_topk_prob) times routed_scaling_factor, plus the shared experts
 * (one MLP of n_shared_experts × moe_intermediate_size).
 *
 * The multi-token-prediction layer a checkpoint stores after the decoder
 * (model.layers.N.*: enorm, hnorm, eh_proj, shared_head and a decoder
 * layer) loads when present and drafts for speculative decoding, in MTP
 * batches (model_seq.mtp_hidden; decoder.c runs the head): row i takes the
 * model's final hidden state h_i (after the final norm, as SGLang's and
 * vLLM's GLM-4.5 / DeepSeek-V3 MTP take it) and token t_{i+1},
 * x = eh_proj([enorm(embed(t_{i+1})) | hnorm(h_i)]), then the decoder block
 * over a cache of its own (layer 0 of the MTP cache). The normal forward
 * does not run it.
 *
 * Owns its config keys (the experts and which layers have them, the latent
 * attention's and the indexer's sizes, the routing's groups and scale, the
 * MTP layers) and its state (glm5_state in fam_state). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "model/internal.h"

#define NORM_EPS 1e-6f /* q_a_layernorm, kv_a_layernorm (transformers' default) and the indexer's LayerNorm */

/* What a GLM-5 layer has beyond layer_weights. */
typedef struct glm5_layer {
  bk_weight q_a, kv_lat, kv_rope;        /* q_a_proj; kv_a_proj_with_mqa's latent and RoPE rows */
  bk_weight *q_nope, *q_rope;            /* owned arrays [H]: rows of q_b_proj */
  bk_weight *uk_t;                       /* owned array [H]: W_UK_hᵀ [kv_lora, nope] (host copy) */
  bk_weight *uv;                         /* owned array [H]: W_UV_h [v, kv_lora], rows of kv_b_proj */
  bk_tensor q_a_bias, kv_lat_bias, kv_rope_bias;
  bk_tensor q_a_norm, kv_a_norm;
  bool indexer;                          /* "full": picks its own rows */
  bk_weight ix_wq_b, ix_wk, ix_w;        /* [Hi * di, q_lora], [di, D], [Hi, D] */
  bk_tensor ix_norm_w, ix_norm_b;
  bk_tensor route_bias;                  /* e_score_correction_bias [1, E] */
} glm5_layer;

typedef struct glm5_state {
  int64_t q_lora, kv_lora, nope, rope, vdim;
  int64_t ix_heads, ix_dim, topk;
  int64_t n_group, topk_group, n_shared;
  float routed_scale;
  const rope_table *rope_t;
  /* multi-token prediction (layer index num_hidden_layers) */
  model_mtp mtp;
  bool has_mtp;
  layer_weights mtp_lw;
  bk_weight mtp_eh, mtp_head;
  bk_tensor mtp_enorm, mtp_hnorm, mtp_head_norm;
  glm5_layer *layers;                    /* owned: num_hidden_layers + 1 (the last: the MTP layer) */
} glm5_state;

static glm5_state *S(const model *m) { return (glm5_state *)m->fam_state; }

static void glm5_free(model *m) {
  glm5_state *s = S(m);
  if (!s) return;
  for (int64_t l = 0; s->layers && l <= m->cfg.num_hidden_layers; l++) {
    glm5_layer *g = &s->layers[l];
    free(g->q_nope), free(g->q_rope), free(g->uk_t), free(g->uv);
  }
  free(s->mtp_lw.experts);
  free(s->layers);
  free(s);
  m->fam_state = NULL;
}

static int get_int(const json_t *j, const char *key, int64_t def, int64_t lo, int64_t hi, int64_t *out, const char *what, herr *err) {
  *out = def;
  const json_t *v = json_object_get(j, key);
  if (v && json_is_null(v)) return 0;
  int rc = hjson_get_int(j, key, false, out, what, err);
  if (rc) return rc;
  if (*out < lo || *out > hi)
    return herr_set(err, HEARTH_EFORMAT, "%s: %s %lld is out of range (%lld to %lld)", what, key, (long long)*out, (long long)lo,
                    (long long)hi);
  return 0;
}

/* Which layers run their own indexer: indexer_types, else index_topk_pattern ("FSS..."), else
 * index_topk_freq / index_skip_topk_offset, as transformers derives them. */
static int read_indexer_types(const json_t *j, int64_t L, bool *full, herr *err) {
  const json_t *it = json_object_get(j, "indexer_types");
  if (!it || json_is_null(it)) it = json_object_get(j, "index_topk_pattern");
  if (it && !json_is_null(it)) {
    bool str = json_is_string(it);
    if ((!str && !json_is_array(it)) || (int64_t)(str ? strlen(json_string_value(it)) : json_array_size(it)) < L)
      return herr_set(err, HEARTH_EFORMAT, "config.json: 'indexer_types' must have one entry per layer");
    for (int64_t l = 0; l < L; l++) {
      const char *e = str ? NULL : json_string_value(json_array_get(it, (size_t)l));
      char ch = str ? json_string_value(it)[l] : 0;
      if (e ? !strcmp(e, "full") : ch == 'F') full[l] = true;
      else if (e ? !strcmp(e, "shared") : ch == 'S') full[l] = false;
      else return herr_set(err, HEARTH_EFORMAT, "config.json: indexer_types[%lld] must be \"full\" or \"shared\"", (long long)l);
    }
  } else {
    int64_t freq = 1, off = 2;
    int rc;
    if ((rc = get_int(j, "index_topk_freq", 1, -1000000, 1000000, &freq, "config.json", err)) ||
        (rc = get_int(j, "index_skip_topk_offset", 2, -1000000, 1000000, &off, "config.json", err)))
      return rc;
    if (freq < 1) freq = 1;
    for (int64_t l = 0; l < L; l++) {
      int64_t d = l - off + 1;
      full[l] = (d > 0 ? d : 0) % freq == 0;
    }
  }
  if (!full[0]) return herr_set(err, HEARTH_EFORMAT, "config.json: indexer_types[0] is \"shared\" but no earlier layer chooses rows");
  return 0;
}

/* The experts: n_routed_experts on the layers mlp_layer_types calls "sparse" (default: all but the
 * first first_k_dense_replace), into the shared fields of cfg. */
static int read_experts(const json_t *j, model_config *c, const char *what, herr *err) {
  c->num_experts = 256, c->num_experts_per_tok = 8, c->moe_intermediate_size = 2048, c->norm_topk_prob = true;
  int rc;
  if ((rc = config_int_range(j, "n_routed_experts", false, 1, 4096, &c->num_experts, what, err)) ||
      (rc = config_experts(j, c, "num_experts_per_tok", what, err)) ||
      (rc = hjson_get_bool(j, "norm_topk_prob", false, &c->norm_topk_prob, what, err)))
    return rc;
  int64_t dense = 3, L = c->num_hidden_layers;
  if ((rc = config_int_range(j, "first_k_dense_replace", false, 0, CFG_MAX_LAYERS, &dense, what, err))) return rc;
  for (int64_t l = 0; l < L; l++) c->moe_layer[l] = l >= dense;
  const json_t *mt = json_object_get(j, "mlp_layer_types");
  if (mt && !json_is_null(mt)) {
    if (!json_is_array(mt) || (int64_t)json_array_size(mt) < L)
      return herr_set(err, HEARTH_EFORMAT, "%s: 'mlp_layer_types' must be a list with one entry per layer", what);
    for (int64_t l = 0; l < L; l++) {
      const char *e = json_string_value(json_array_get(mt, (size_t)l));
      if (!e || (strcmp(e, "dense") && strcmp(e, "sparse")))
        return herr_set(err, HEARTH_EFORMAT, "%s: mlp_layer_types[%lld] must be \"dense\" or \"sparse\"", what, (long long)l);
      c->moe_layer[l] = !strcmp(e, "sparse");
    }
  }
  return 0;
}

/* glm_moe_dsa's own keys: the experts, the latent attention's ranks and head sizes, the indexer's,
 * the routing's groups and scale, the MTP layers. */
static int config(model *m, herr *err) {
  model_config *c = &m->cfg;
  const json_t *j = c->raw;
  const char *what = "config.json";
  int64_t L = c->num_hidden_layers;
  glm5_state *s = calloc(1, sizeof *s);
  if (!s) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  m->fam_state = s;
  s->layers = calloc((size_t)L + 1, sizeof *s->layers);
  if (!s->layers) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  const json_t *ql = json_object_get(j, "q_lora_rank");
  if (ql && json_is_null(ql))
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s: q_lora_rank null (a plain q_proj) is not supported for glm_moe_dsa", what);
  int rc;
  int64_t nextn = 0;
  double rs = 2.5;
  if ((rc = read_experts(j, c, what, err))) return rc;
  if ((rc = get_int(j, "q_lora_rank", 2048, 1, 1 << 16, &s->q_lora, what, err)) ||
      (rc = get_int(j, "kv_lora_rank", 512, 1, 1 << 16, &s->kv_lora, what, err)) ||
      (rc = get_int(j, "qk_nope_head_dim", 192, 1, 4096, &s->nope, what, err)) ||
      (rc = get_int(j, "qk_rope_head_dim", 64, 2, 4096, &s->rope, what, err)) ||
      (rc = get_int(j, "v_head_dim", 256, 1, 4096, &s->vdim, what, err)) ||
      (rc = get_int(j, "index_n_heads", 32, 1, 4096, &s->ix_heads, what, err)) ||
      (rc = get_int(j, "index_head_dim", 128, 2, 4096, &s->ix_dim, what, err)) ||
      (rc = get_int(j, "index_topk", 2048, 1, 1 << 20, &s->topk, what, err)) ||
      (rc = get_int(j, "n_group", 1, 1, 64, &s->n_group, what, err)) ||
      (rc = get_int(j, "topk_group", 1, 1, 64, &s->topk_group, what, err)) ||
      (rc = get_int(j, "n_shared_experts", 1, 0, 64, &s->n_shared, what, err)) ||
      (rc = get_int(j, "num_nextn_predict_layers", 0, 0, 16, &nextn, what, err)) ||
      (rc = hjson_get_num(j, "routed_scaling_factor", false, &rs, what, err)))
    return rc;
  s->routed_scale = (float)rs;
  int64_t E = c->num_experts;
  if (s->rope % 2 || s->rope > s->ix_dim)
    return herr_set(err, HEARTH_EFORMAT, "%s: qk_rope_head_dim %lld must be even and at most index_head_dim %lld", what,
                    (long long)s->rope, (long long)s->ix_dim);
  if (E % s->n_group || E / s->n_group < 2 || s->topk_group > s->n_group ||
      c->num_experts_per_tok > s->topk_group * (E / s->n_group))
    return herr_set(err, HEARTH_EFORMAT, "%s: %lld experts in n_group %lld (topk_group %lld) cannot give %lld per token", what,
                    (long long)E, (long long)s->n_group, (long long)s->topk_group, (long long)c->num_experts_per_tok);
  s->mtp.n_nextn = (int)nextn; /* counted again when the weights are found */
  return 0;
}

static int prepare(model *m, herr *err) {
  const model_config *c = &m->cfg;
  const json_t *j = c->raw;
  const char *what = "config.json";
  int64_t L = c->num_hidden_layers, H = c->num_attention_heads;
  glm5_state *s = S(m);
  int rc;
  bool full[CFG_MAX_LAYERS];
  if ((rc = read_indexer_types(j, L, full, err))) return rc;
  /* the RoPE slice: rope_dim wide, pairs interleaved */
  if ((rc = model_rope_for(m, false, s->rope, &s->rope_t, err))) return rc;
  for (int i = 0; i < m->n_ropes; i++) m->ropes[i].interleaved = true;
  double scale = 1.0 / sqrt((double)(s->nope + s->rope));
  const json_t *rp = json_object_get(j, "rope_parameters");
  if (!rp || json_is_null(rp)) rp = json_object_get(j, "rope_scaling");
  if (c->rope.kind != ROPE_DEFAULT && rp && json_is_object(rp)) {
    double mall = 0;
    if ((rc = hjson_get_num(rp, "mscale_all_dim", false, &mall, what, err))) return rc;
    if (mall != 0 && c->rope.factor > 1) {
      double ms = 0.1 * mall * log(c->rope.factor) + 1.0;
      scale *= ms * ms;
    }
  }
  int64_t R = s->rope, KL = s->kv_lora;
  for (int64_t l = 0; l < L; l++) {
    layer_weights *lw = &m->layers[l];
    lw->head_dim = R + KL; /* the absorbed query heads and the one K head */
    lw->kv_heads = 1;
    lw->kv_k_dim = R + KL;
    lw->kv_v_dim = s->ix_dim;
    lw->window = 0;
    lw->rope = s->rope_t;
    lw->attn_scale = (float)scale;
    lw->moe = c->moe_layer[l];
    lw->inter = lw->moe ? c->moe_intermediate_size * (s->n_shared ? s->n_shared : 1) : c->intermediate_size;
    s->layers[l].indexer = full[l];
  }
  int64_t tw = s->nope > R ? s->nope : R;
  if (s->vdim > tw) tw = s->vdim;
  m->w_fam = s->q_lora + tw + 2 * KL + R + H * s->vdim + s->ix_heads * s->ix_dim + s->ix_dim + s->ix_heads + s->topk;
  return 0;
}

#define NAME(field) snprintf(name, sizeof name, "model.layers.%d.%s", idx, field)

/* Layer idx's weights (idx == num_hidden_layers: the MTP layer) into lw and g. */
static int load_glm_layer(model *m, const weight_src *src, int idx, bool moe, layer_weights *lw, glm5_layer *g, herr *err) {
  const model_config *c = &m->cfg;
  glm5_state *s = S(m);
  int64_t D = c->hidden_size, H = c->num_attention_heads, QL = s->q_lora, KL = s->kv_lora, N = s->nope, R = s->rope,
          V = s->vdim, Hi = s->ix_heads, di = s->ix_dim;
  char name[256];
  int rc;
  NAME("input_layernorm.weight");
  if ((rc = model_vector(m, src, name, 1, D, 0, true, 1.0f, &lw->attn_norm, err))) return rc;
  NAME("post_attention_layernorm.weight");
  if ((rc = model_vector(m, src, name, 1, D, 0, true, 1.0f, &lw->post_attn_norm, err))) return rc;
  NAME("self_attn.q_a_proj.weight");
  if ((rc = model_matrix(m, src, name, QL, D, true, BK_USE_MATMUL, &g->q_a, err))) return rc;
  NAME("self_attn.q_a_layernorm.weight");
  if ((rc = model_vector(m, src, name, 1, QL, 0, true, 1.0f, &g->q_a_norm, err))) return rc;
  NAME("self_attn.kv_a_layernorm.weight");
  if ((rc = model_vector(m, src, name, 1, KL, 0, true, 1.0f, &g->kv_a_norm, err))) return rc;
  if (c->attention_bias) {
    bk_tensor kvb;
    NAME("self_attn.q_a_proj.bias");
    if ((rc = model_vector(m, src, name, 1, QL, 0, true, 1.0f, &g->q_a_bias, err))) return rc;
    NAME("self_attn.kv_a_proj_with_mqa.bias");
    if ((rc = model_vector(m, src, name, 1, KL + R, 0, true, 1.0f, &kvb, err))) return rc;
    g->kv_lat_bias = kvb, g->kv_lat_bias.cols = KL;
    g->kv_rope_bias = kvb, g->kv_rope_bias.cols = R, g->kv_rope_bias.off += (size_t)KL * sizeof(float);
    NAME("self_attn.o_proj.bias");
    if ((rc = model_vector(m, src, name, 1, D, 0, true, 1.0f, &lw->o_bias, err))) return rc;
  }
  bk_weight kva, qb, kvb;
  NAME("self_attn.kv_a_proj_with_mqa.weight");
  if ((rc = model_describe_matrix(m, src, name, KL + R, D, true, &kva, err))) return rc;
  g->kv_lat = model_sub_rows(&kva, 0, KL);
  g->kv_rope = model_sub_rows(&kva, KL, R);
  if ((rc = model_keep(m, &g->kv_lat, BK_USE_MATMUL, err)) || (rc = model_keep(m, &g->kv_rope, BK_USE_MATMUL, err))) return rc;
  NAME("self_attn.q_b_proj.weight");
  if ((rc = model_describe_matrix(m, src, name, H * (N + R), QL, true, &qb, err))) return rc;
  NAME("self_attn.kv_b_proj.weight");
  if ((rc = model_describe_matrix(m, src, name, H * (N + V), KL, true, &kvb, err))) return rc;
  g->q_nope = calloc((size_t)H, sizeof(bk_weight));
  g->q_rope = calloc((size_t)H, sizeof(bk_weight));
  g->uk_t = calloc((size_t)H, sizeof(bk_weight));
  g->uv = calloc((size_t)H, sizeof(bk_weight));
  if (!g->q_nope || !g->q_rope || !g->uk_t || !g->uv) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  /* W_UK_hᵀ of every head, exact f32 values of the stored weights */
  float *ukt = NULL, *row = malloc(sizeof(float) * (size_t)KL);
  if (!row) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  if ((rc = model_own_floats(m, H * KL * N, name, &ukt, err))) {
    free(row);
    return rc;
  }
  for (int64_t h = 0; h < H; h++)
    for (int64_t n = 0; n < N; n++) {
      if ((rc = bk_dequant_row(&kvb, h * (N + V) + n, row, err))) {
        free(row);
        return herr_wrap(err, "%s", name);
      }
      for (int64_t k = 0; k < KL; k++) ukt[(h * KL + k) * N + n] = row[k];
    }
  free(row);
  for (int64_t h = 0; h < H; h++) {
    g->q_nope[h] = model_sub_rows(&qb, h * (N + R), N);
    g->q_rope[h] = model_sub_rows(&qb, h * (N + R) + N, R);
    g->uv[h] = model_sub_rows(&kvb, h * (N + V) + N, V);
    g->uk_t[h] = (bk_weight){.type = BK_F32, .rows = KL, .cols = N, .data = ukt + h * KL * N};
    if ((rc = model_keep(m, &g->q_nope[h], BK_USE_MATMUL, err)) || (rc = model_keep(m, &g->q_rope[h], BK_USE_MATMUL, err)) ||
        (rc = model_keep(m, &g->uv[h], BK_USE_MATMUL, err)) || (rc = model_keep(m, &g->uk_t[h], BK_USE_MATMUL, err)))
      return rc;
  }
  NAME("self_attn.o_proj.weight");
  if ((rc = model_matrix(m, src, name, D, H * V, true, BK_USE_MATMUL, &lw->o, err))) return rc;
  if (g->indexer) {
    NAME("self_attn.indexer.wq_b.weight");
    if ((rc = model_matrix(m, src, name, Hi * di, QL, true, BK_USE_MATMUL, &g->ix_wq_b, err))) return rc;
    NAME("self_attn.indexer.wk.weight");
    if ((rc = model_matrix(m, src, name, di, D, true, BK_USE_MATMUL, &g->ix_wk, err))) return rc;
    NAME("self_attn.indexer.weights_proj.weight");
    if ((rc = model_matrix(m, src, name, Hi, D, true, BK_USE_MATMUL, &g->ix_w, err))) return rc;
    NAME("self_attn.indexer.k_norm.weight");
    if ((rc = model_vector(m, src, name, 1, di, 0, true, 1.0f, &g->ix_norm_w, err))) return rc;
    NAME("self_attn.indexer.k_norm.bias");
    if ((rc = model_vector(m, src, name, 1, di, 0, true, 1.0f, &g->ix_norm_b, err))) return rc;
  }
  lw->moe = moe;
  if (!moe) {
    lw->inter = c->intermediate_size;
    NAME("mlp.gate_proj.weight");
    if ((rc = model_matrix(m, src, name, lw->inter, D, true, BK_USE_MATMUL, &lw->gate, err))) return rc;
    NAME("mlp.up_proj.weight");
    if ((rc = model_matrix(m, src, name, lw->inter, D, true, BK_USE_MATMUL, &lw->up, err))) return rc;
    NAME("mlp.down_proj.weight");
    return model_matrix(m, src, name, D, lw->inter, true, BK_USE_MATMUL, &lw->down, err);
  }
  int64_t E = c->num_experts, I = c->moe_intermediate_size * s->n_shared;
  NAME("mlp.gate.weight");
  if ((rc = model_matrix(m, src, name, E, D, true, BK_USE_MATMUL, &lw->router, err))) return rc;
  NAME("mlp.gate.e_score_correction_bias");
  if ((rc = model_vector(m, src, name, 1, E, 0, false, 1.0f, &g->route_bias, err))) return rc;
  if (s->n_shared) {
    lw->inter = I;
    NAME("mlp.shared_experts.gate_proj.weight");
    if ((rc = model_matrix(m, src, name, I, D, true, BK_USE_MATMUL, &lw->gate, err))) return rc;
    NAME("mlp.shared_experts.up_proj.weight");
    if ((rc = model_matrix(m, src, name, I, D, true, BK_USE_MATMUL, &lw->up, err))) return rc;
    NAME("mlp.shared_experts.down_proj.weight");
    if ((rc = model_matrix(m, src, name, D, I, true, BK_USE_MATMUL, &lw->down, err))) return rc;
  }
  NAME("mlp.experts");
  return model_experts(m, src, name, E, c->moe_intermediate_size, lw, err);
}

static int load_layer(model *m, const weight_src *src, int l, herr *err) {
  return load_glm_layer(m, src, l, m->cfg.moe_layer[l], &m->layers[l], &S(m)->layers[l], err);
}

/* The multi-token-prediction layer, when the checkpoint has one. */
static int load_model(model *m, const weight_src *src, herr *err) {
  const model_config *c = &m->cfg;
  glm5_state *s = S(m);
  int idx = (int)c->num_hidden_layers;
  int64_t D = c->hidden_size;
  char name[256];
  int rc;
  NAME("eh_proj.weight");
  bk_weight probe;
  if ((rc = model_describe_matrix(m, src, name, D, 2 * D, false, &probe, err))) return rc;
  s->mtp.n_nextn = 0;
  if (!probe.data) return 0;
  if ((rc = model_matrix(m, src, name, D, 2 * D, true, BK_USE_MATMUL, &s->mtp_eh, err))) return rc;
  NAME("enorm.weight");
  if ((rc = model_vector(m, src, name, 1, D, 0, true, 1.0f, &s->mtp_enorm, err))) return rc;
  NAME("hnorm.weight");
  if ((rc = model_vector(m, src, name, 1, D, 0, true, 1.0f, &s->mtp_hnorm, err))) return rc;
  NAME("shared_head.norm.weight");
  if ((rc = model_vector(m, src, name, 1, D, 0, false, 1.0f, &s->mtp_head_norm, err))) return rc;
  NAME("shared_head.head.weight");
  if ((rc = model_matrix(m, src, name, c->vocab_size, D, false, BK_USE_MATMUL, &s->mtp_head, err))) return rc;
  NAME("mlp.gate.weight");
  bool moe = false;
  if ((rc = model_describe_matrix(m, src, name, c->num_experts, D, false, &probe, err))) return rc;
  moe = probe.data != NULL;
  glm5_layer *g = &s->layers[idx];
  g->indexer = true;
  NAME("self_attn.indexer.wk.weight");
  if ((rc = model_describe_matrix(m, src, name, s->ix_dim, D, false, &probe, err))) return rc;
  g->indexer = probe.data != NULL;
  layer_weights *lw = &s->mtp_lw, *last = &m->layers[c->num_hidden_layers - 1]; /* the decoder layers' geometry */
  lw->head_dim = last->head_dim, lw->kv_heads = last->kv_heads, lw->heads = last->heads;
  lw->kv_k_dim = last->kv_k_dim, lw->kv_v_dim = last->kv_v_dim, lw->window = 0;
  lw->rope = last->rope, lw->attn_scale = last->attn_scale, lw->scalar = 1.0f;
  if ((rc = load_glm_layer(m, src, idx, moe, lw, g, err))) return herr_wrap(err, "multi-token-prediction layer");
  s->has_mtp = true;
  s->mtp.n_nextn = 1;
  s->mtp.head = s->mtp_head.data ? &s->mtp_head : &m->lm_head; /* (lm_head is loaded after this) */
  s->mtp.norm = s->mtp_head_norm;
  if (!g->indexer) s->mtp.refused = "it has no indexer of its own to choose the rows it attends";
  else s->mtp.layer = lw;
  if (lw->inter > m->w_inter) m->w_inter = lw->inter;
  if (m->w_fam < 2 * D) m->w_fam = 2 * D; /* the [enorm(e) | hnorm(h)] rows */
  return 0;
}
#undef NAME

/* The step's share of st->fam, carved into the layer's working tensors. */
typedef struct glm5_act {
  bk_tensor qa, t1, t2, lat, kr, ov, qi, ki, iw, sel;
} glm5_act;

static bk_tensor carve(const step *st, size_t *off, int64_t cols, bk_dtype dt) {
  bk_tensor t = st->fam;
  t.off += *off;
  t.rows = st->T;
  t.cols = cols;
  t.dt = dt;
  *off += (size_t)(st->T * cols) * sizeof(float);
  return t;
}

static glm5_act acts(const model *m, const step *st) {
  const glm5_state *s = S(m);
  int64_t tw = s->nope > s->rope ? s->nope : s->rope, H = m->cfg.num_attention_heads;
  if (s->vdim > tw) tw = s->vdim;
  size_t off = 0;
  glm5_act a;
  a.qa = carve(st, &off, s->q_lora, BK_DT_F32);
  a.t1 = carve(st, &off, tw, BK_DT_F32);
  a.t2 = carve(st, &off, s->kv_lora, BK_DT_F32);
  a.lat = carve(st, &off, s->kv_lora, BK_DT_F32);
  a.kr = carve(st, &off, s->rope, BK_DT_F32);
  a.ov = carve(st, &off, H * s->vdim, BK_DT_F32);
  a.qi = carve(st, &off, s->ix_heads * s->ix_dim, BK_DT_F32);
  a.ki = carve(st, &off, s->ix_dim, BK_DT_F32);
  a.iw = carve(st, &off, s->ix_heads, BK_DT_F32);
  a.sel = carve(st, &off, s->topk, BK_DT_I32);
  return a;
}

static const bk_tensor *opt(const bk_tensor *t) { return t->buf ? t : NULL; }

/* x += o_proj(attention of the layer lw / g), with its cache rows (kv's layer l) written and, on a
 * "full" layer, the rows chosen. */
static void mla_attention(model *m, const layer_weights *lw, const glm5_layer *g, int l, const kv_store *kv, step *st) {
  const model_config *c = &m->cfg;
  const glm5_state *s = S(m);
  int64_t T = st->T, H = lw->heads, N = s->nope, R = s->rope, KL = s->kv_lora, V = s->vdim, W = R + KL;
  glm5_act a = acts(m, st);
  bk_tensor qf = step_view(&st->q, T, H * W), krow = step_view(&st->k, T, W), olat = step_view(&st->att, T, H * KL);
  bk_tensor tn = step_view(&a.t1, T, N), tr = step_view(&a.t1, T, R), tv = step_view(&a.t1, T, V), ov = step_view(&a.ov, T, H * V);
  layer_norm(m, &st->xn, &st->x, &lw->attn_norm);
  /* queries: [rope(q_rope_h) | W_UK_hᵀ q_nope_h] per head */
  bk_matmul_t(&a.qa, &st->xn, &g->q_a, opt(&g->q_a_bias));
  bk_rmsnorm(&a.qa, &a.qa, &g->q_a_norm, NORM_EPS, false);
  for (int64_t h = 0; h < H; h++) {
    bk_matmul_t(&tn, &a.qa, &g->q_nope[h], NULL);
    bk_matmul_t(&a.t2, &tn, &g->uk_t[h], NULL);
    bk_set_cols(&qf, &a.t2, h * W + R);
    bk_matmul_t(&tr, &a.qa, &g->q_rope[h], NULL);
    bk_set_cols(&qf, &tr, h * W);
  }
  bk_rope(&qf, H, W, &st->pos, s->rope_t);
  /* this step's K rows [rope(k_rope) | rmsnorm(latent)] into the cache */
  bk_matmul_t(&a.lat, &st->xn, &g->kv_lat, opt(&g->kv_lat_bias));
  bk_rmsnorm(&a.lat, &a.lat, &g->kv_a_norm, NORM_EPS, false);
  bk_matmul_t(&a.kr, &st->xn, &g->kv_rope, opt(&g->kv_rope_bias));
  bk_rope(&a.kr, 1, R, &st->pos, s->rope_t);
  bk_set_cols(&krow, &a.kr, 0);
  bk_set_cols(&krow, &a.lat, R);
  bk_set_rows(&kv->k[l], &krow, &st->slot);
  bk_attn_index ix = {.row = &st->row, .tab = &st->tab, .tables = &st->tables};
  if (g->indexer) { /* the lightning indexer: its key into the V rows, then each query's rows */
    int64_t Hi = s->ix_heads, di = s->ix_dim;
    bk_matmul_t(&a.qi, &a.qa, &g->ix_wq_b, NULL);
    bk_rope(&a.qi, Hi, di, &st->pos, s->rope_t);
    bk_matmul_t(&a.ki, &st->xn, &g->ix_wk, NULL);
    bk_layernorm(&a.ki, &a.ki, &g->ix_norm_w, &g->ix_norm_b, NORM_EPS);
    bk_rope(&a.ki, 1, di, &st->pos, s->rope_t);
    bk_set_rows(&kv->v[l], &a.ki, &st->slot);
    bk_matmul_t(&a.iw, &st->xn, &g->ix_w, NULL);
    bk_scale(&a.iw, (float)(1.0 / sqrt((double)Hi)));
    bk_kv_layer keys = {.k = &kv->v[l], .v = &kv->v[l], .block_rows = kv->block_rows};
    index_params ip = {Hi, di, s->topk, (float)(1.0 / sqrt((double)di))};
    bk_index_topk(&a.sel, &a.qi, &a.iw, &keys, &ix, &ip);
  }
  bk_kv_layer kl = {.k = &kv->k[l], .v = &kv->k[l], .block_rows = kv->block_rows};
  sparse_attn_params sp = {H, W, R, KL, s->topk, lw->attn_scale};
  bk_attention_sparse(&olat, &qf, &kl, &ix, &a.sel, &sp);
  /* values: W_UV_h over each head's latent mix, then o_proj */
  for (int64_t h = 0; h < H; h++) {
    bk_get_cols(&a.t2, &olat, h * KL);
    bk_matmul_t(&tv, &a.t2, &g->uv[h], NULL);
    bk_set_cols(&ov, &tv, h * V);
  }
  bk_tensor o = step_view(&st->o, T, c->hidden_size);
  bk_matmul_t(&o, &ov, &lw->o, opt(&lw->o_bias));
  model_reduce(m, &o); /* row-parallel: each rank's heads' share */
  bk_add(&st->x, &st->x, &o);
}

/* x += attention; x += (routed experts + shared experts, or the MLP)(norm(x)), for the layer lw / g
 * whose cache is kv's layer l */
static void glm_layer(model *m, const layer_weights *lw, const glm5_layer *g, int l, const kv_store *kv, step *st) {
  const model_config *c = &m->cfg;
  const glm5_state *s = S(m);
  mla_attention(m, lw, g, l, kv, st);
  layer_norm(m, &st->xn, &st->x, &lw->post_attn_norm);
  int64_t T = st->T;
  bk_tensor o = step_view(&st->o, T, c->hidden_size);
  if (lw->moe) {
    int64_t E = c->num_experts, K = c->num_experts_per_tok;
    bk_tensor logits = step_view(&st->elog, T, E), ids = step_view(&st->eids, T, K), w = step_view(&st->ew, T, K);
    bk_matmul_t(&logits, &st->xn, &lw->router, NULL);
    bk_moe_route_group(&ids, &w, &logits, opt(&g->route_bias), s->n_group, s->topk_group, c->norm_topk_prob,
                       s->routed_scale);
    layer_experts(m, lw, st, &st->xn, &o);
    if (s->n_shared) {
      bk_tensor sh = step_view(&st->x2, T, c->hidden_size);
      layer_mlp(m, lw, st, &st->xn, &sh);
      bk_add(&o, &o, &sh);
    }
  } else {
    layer_mlp(m, lw, st, &st->xn, &o);
  }
  bk_add(&st->x, &st->x, &o);
}

/* Tensor parallelism: attention by heads — a rank keeps its heads' rows of q_b_proj (q_nope_h,
 * q_rope_h) and of kv_b_proj (W_UK_h, W_UV_h): column-parallel per head; o_proj's columns of their
 * values: row-parallel, then the all-reduce (its bias on rank 0). q_a_proj, kv_a_proj_with_mqa and
 * their norms are replicated, so every rank writes the same latent K rows and holds the whole latent
 * cache; the DSA indexer is replicated too (every rank picks the same rows). The dense MLP, the
 * experts and the shared experts split by width. The MTP layer stays whole (it does not run on a
 * split model). */
static int shard(model *m, herr *err) {
  glm5_state *s = S(m);
  int N = m->tp_size, r = m->tp_rank, rc;
  int64_t H = m->cfg.num_attention_heads, Hl = H / N, V = s->vdim;
  if (H % N) return tp_refuse(m, "num_attention_heads", H, err);
  char what[160];
  for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
    layer_weights *lw = &m->layers[l];
    glm5_layer *g = &s->layers[l];
    for (int64_t h = 0; h < Hl && r; h++) { /* the kept descriptors take the rank's heads */
      g->q_nope[h] = g->q_nope[r * Hl + h], g->q_rope[h] = g->q_rope[r * Hl + h];
      g->uk_t[h] = g->uk_t[r * Hl + h], g->uv[h] = g->uv[r * Hl + h];
    }
    for (int64_t h = Hl; h < H; h++) tp_drop(m, &g->q_nope[h]), tp_drop(m, &g->q_rope[h]), tp_drop(m, &g->uk_t[h]), tp_drop(m, &g->uv[h]);
    snprintf(what, sizeof what, "model.layers.%d.self_attn.o_proj.weight", l);
    if ((rc = tp_keep_cols(m, &lw->o, r * Hl * V, Hl * V, what, err))) return rc;
    if (r) lw->o_bias = (bk_tensor){0}; /* added once, before the sum */
    lw->heads = Hl;
    if ((rc = tp_shard_ffn(m, lw, l, err))) return rc;
  }
  return 0;
}

static void layer(model *m, int l, const kv_store *kv, step *st) {
  glm_layer(m, &m->layers[l], &S(m)->layers[l], l, kv, st);
}

/* The multi-token-prediction layer over the rows of an MTP batch: x (their token embeddings) becomes
 * the decoder block's output on eh_proj([enorm(x) | hnorm(h)]), its cache kv's layer 0. */
static void mtp(model *m, const kv_store *kv, step *st, const bk_tensor *h) {
  glm5_state *s = S(m);
  layer_mtp_input(m, st, h, &s->mtp_enorm, &s->mtp_hnorm, &s->mtp_eh);
  glm_layer(m, &s->mtp_lw, &s->layers[m->cfg.num_hidden_layers], 0, kv, st);
}

static const model_mtp *mtp_of(const model *m) { return &S(m)->mtp; }

const family_ops glm5_family_ops = {.config = config, .mtp_of = mtp_of, .prepare = prepare, .load_layer = load_layer, .load_model = load_model,
                                    .layer = layer, .mtp = mtp, .shard = shard, .free = glm5_free};
