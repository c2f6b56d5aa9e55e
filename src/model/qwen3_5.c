/* qwen3_5.c — Qwen3.5's text decoder (transformers' models/qwen3_5,
 * Qwen3_5TextModel; also the text stack of Qwen3_5ForConditionalGeneration
 * checkpoints, under model.language_model.): a hybrid whose layers are, per
 * layer_types, either linear attention or gated full attention, each
 * followed by the dense MLP (the MoE variant, qwen3_5_moe.c, swaps in its
 * sparse block and reuses the token mixers here).
 *   linear_attention: Gated DeltaNet (layers.c, layer_deltanet):
 *     in_proj_qkv → causal depthwise conv1d (linear_conv_kernel_dim taps,
 *     rolling state) → SiLU → q / k / v heads; the gated delta rule with
 *     decay g = -exp(A_log) · softplus(in_proj_a · x + dt_bias) and
 *     beta = sigmoid(in_proj_b · x), q and k L2-normalized; RMSNorm per
 *     value head times silu(in_proj_z · x); out_proj. The layer keeps a
 *     recurrent state per sequence (the conv's last inputs and every head's
 *     dk × dv matrix) instead of KV rows.
 *   full_attention: q_proj yields per head the query and an output gate;
 *     q / k RMSNorm per head, partial RoPE (partial_rotary_factor, default
 *     0.25; multimodal RoPE when the config has mrope_section: each
 *     frequency turns by the token's temporal, height or width position,
 *     interleaved, from model_seq.positions3 — text tokens have the three
 *     equal, which is plain RoPE); the attention output times sigmoid(gate)
 *     before o_proj.
 * RMSNorms scale by (1 + w), except the gated norm of linear attention (w).
 *
 * The multi-token-prediction layer a checkpoint stores beside the decoder
 * (mtp.*, mtp_num_hidden_layers 1; transformers does not load it, vLLM's
 * and SGLang's Qwen3-Next / Qwen3.5 MTP do) loads when present and drafts
 * for speculative decoding in MTP batches (model_seq.mtp_hidden; decoder.c
 * runs the head): row i takes the model's hidden state h_i after the final
 * norm (what those engines hand their MTP layer) and token t_{i+1},
 * x = fc([pre_fc_norm_embedding(embed(t_{i+1})) | pre_fc_norm_hidden(h_i)]),
 * then a gated full-attention decoder layer (mtp.layers.0.*, the family's
 * feed-forward: dense here, routed plus shared experts in qwen3_5_moe.c)
 * over a cache of its own (layer 0 of the MTP cache), then mtp.norm and the
 * model's lm_head. Its norms scale by (1 + w) too.
 *
 * Owns its config keys (the linear attention's sizes; for the MoE variant
 * the experts and the shared expert) and its state (qwen3_5_state in
 * fam_state: those sizes and the MTP layer), shared with qwen3_5_moe.c. */
#include <stdio.h>
#include <stdlib.h>

#include "base/json.h"
#include "model/internal.h"
#include "model/qwen3_5.h"

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Qwen3.5's own state (fam_state): its config keys and the multi-token-prediction layer's weights. */
typedef struct qwen3_5_state {
  int64_t conv_kernel, k_dim, v_dim, k_heads, v_heads; /* linear_conv_kernel_dim, linear_{key,value}_head_dim, linear_num_{key,value}_heads */
  int64_t shared_inter;         /* shared_expert_intermediate_size (the MoE variant; 0: none) */
  model_mtp mtp;
  layer_weights mtp_lw;
  bk_weight fc;                 /* mtp.fc [D, 2D] */
  bk_tensor enorm, hnorm;       /* mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden */
  qwen3_5_ffn ffn;
} qwen3_5_state;

static qwen3_5_state *S(const model *m) { return (qwen3_5_state *)m->fam_state; }

/* qwen3_5_text / qwen3_5_moe_text: the linear-attention layers' sizes; the MoE variant's experts (on
 * every layer, renormalized) and shared expert. */
int qwen3_5_config(model *m, bool moe, herr *err) {
  qwen3_5_state *s = calloc(1, sizeof *s);
  if (!s) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  m->fam_state = s;
  model_config *c = &m->cfg;
  const json_t *j = c->raw;
  const char *what = "config.json";
  int rc;
  s->conv_kernel = 4, s->k_dim = 128, s->v_dim = 128, s->k_heads = 16, s->v_heads = 32;
  if ((rc = config_int_range(j, "linear_conv_kernel_dim", false, 1, 16, &s->conv_kernel, what, err)) ||
      (rc = config_int_range(j, "linear_key_head_dim", false, 1, 256, &s->k_dim, what, err)) ||
      (rc = config_int_range(j, "linear_value_head_dim", false, 1, 4096, &s->v_dim, what, err)) ||
      (rc = config_int_range(j, "linear_num_key_heads", false, 1, 4096, &s->k_heads, what, err)) ||
      (rc = config_int_range(j, "linear_num_value_heads", false, 1, 4096, &s->v_heads, what, err)))
    return rc;
  if (s->v_heads % s->k_heads)
    return herr_set(err, HEARTH_EFORMAT, "%s: linear_num_value_heads %lld is not a multiple of linear_num_key_heads %lld", what,
                    (long long)s->v_heads, (long long)s->k_heads);
  if (!moe) return 0;
  c->num_experts = 256, c->num_experts_per_tok = 8, c->moe_intermediate_size = 512, s->shared_inter = 512;
  if ((rc = config_experts(j, c, "num_experts_per_tok", what, err)) ||
      (rc = config_int_range(j, "shared_expert_intermediate_size", false, 1, 1 << 22, &s->shared_inter, what, err)))
    return rc;
  c->norm_topk_prob = true;
  for (int64_t l = 0; l < c->num_hidden_layers; l++) c->moe_layer[l] = true;
  return 0;
}

int64_t qwen3_5_shared_inter(const model *m) { return S(m)->shared_inter; }

const model_mtp *qwen3_5_mtp_of(const model *m) { return &S(m)->mtp; }

/* mrope_section of the text config's RoPE settings (multimodal checkpoints), or NULL. */
static const json_t *mrope_section(const json_t *raw) {
  const json_t *cfgs[2] = {raw ? json_object_get(raw, "text_config") : NULL, raw};
  for (int i = 0; i < 2; i++) {
    if (!cfgs[i] || !json_is_object(cfgs[i])) continue;
    const char *keys[2] = {"rope_parameters", "rope_scaling"};
    for (int k = 0; k < 2; k++) {
      const json_t *rp = json_object_get(cfgs[i], keys[k]), *sec = rp ? json_object_get(rp, "mrope_section") : NULL;
      if (sec && json_is_array(sec)) return sec;
    }
  }
  return NULL;
}

/* Multimodal RoPE (Qwen3.5 always interleaves it): frequency j turns by the height position when
 * j % 3 == 1 and j < 3 * section[1], by the width position when j % 3 == 2 and j < 3 * section[2], else
 * by the temporal one. Text tokens have the three equal, which is plain RoPE. */
static int mrope_prepare(model *m, herr *err) {
  const json_t *sec = mrope_section(m->cfg.raw);
  if (!sec) return 0;
  int64_t s[3];
  if (json_array_size(sec) != 3) return herr_set(err, HEARTH_EFORMAT, "rope_parameters.mrope_section must hold 3 numbers");
  for (int a = 0; a < 3; a++) {
    const json_t *v = json_array_get(sec, (size_t)a);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
      return herr_set(err, HEARTH_EFORMAT, "rope_parameters.mrope_section must hold 3 numbers");
    s[a] = json_integer_value(v);
  }
  for (int i = 0; i < m->n_ropes; i++) {
    rope_table *t = &m->ropes[i];
    int64_t half = t->rot_dim / 2;
    if (t->n_axes > 1 || half <= 0) continue;
    if (!(t->axis = calloc((size_t)half, 1))) return herr_set(err, HEARTH_ENOMEM, "out of memory");
    for (int64_t j = 0; j < half; j++) t->axis[j] = (int8_t)(j % 3 == 1 && j < 3 * s[1] ? 1 : j % 3 == 2 && j < 3 * s[2] ? 2 : 0);
    t->n_axes = 3;
  }
  m->pos_axes = 3;
  return 0;
}

int qwen3_5_prepare(model *m, herr *err) {
  int rc = mrope_prepare(m, err);
  if (rc) return rc;
  const model_config *c = &m->cfg;
  const qwen3_5_state *s = S(m);
  int64_t H = c->num_attention_heads, nk = s->k_heads, nv = s->v_heads, dk = s->k_dim, dv = s->v_dim, K = s->conv_kernel;
  int64_t C = 2 * nk * dk + nv * dv;
  for (int l = 0; l < c->num_hidden_layers; l++) {
    layer_weights *lw = &m->layers[l];
    lw->linear = c->layer_types[l] == LAYER_LINEAR;
    lw->moe = c->moe_layer[l];
    if (lw->linear) {
      lw->kv_heads = 0; /* no KV rows: a state per sequence */
      lw->rope = NULL;
      lw->state_dim = (K - 1) * C + nv * dk * dv;
      lw->lin_k_heads = nk, lw->lin_v_heads = nv;
      lw->lin_k_dim = dk, lw->lin_v_dim = dv, lw->conv_kernel = K;
      m->w_q = max64(m->w_q, C);
      m->w_kv = max64(m->w_kv, nv);
      m->w_inter = max64(m->w_inter, nv * dv);
    } else {
      lw->out_gate = true;
      m->w_q = max64(m->w_q, 2 * H * lw->head_dim);
      m->w_inter = max64(m->w_inter, H * lw->head_dim);
    }
  }
  return 0;
}

#define MAT(field, a, b, dst)                                                                        \
  do {                                                                                               \
    snprintf(name, sizeof name, "%s%s", prefix, field);                                              \
    if ((rc = model_matrix(m, src, name, a, b, true, BK_USE_MATMUL, dst, err))) return rc;           \
  } while (0)

#define VEC(field, nd, a, b, dst)                                                                     \
  do {                                                                                                \
    snprintf(name, sizeof name, "%s%s", prefix, field);                                               \
    if ((rc = model_vector(m, src, name, nd, a, b, true, 1.0f, dst, err))) return rc;                \
  } while (0)

int qwen3_5_load_mixer(model *m, const weight_src *src, int l, herr *err) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "model.layers.%d.", l);
  return qwen3_5_load_mixer_at(m, src, prefix, &m->layers[l], err);
}

int qwen3_5_load_mixer_at(model *m, const weight_src *src, const char *prefix, layer_weights *lw, herr *err) {
  const model_config *c = &m->cfg;
  char name[256];
  int rc;
  int64_t D = c->hidden_size, H = c->num_attention_heads, KV = lw->kv_heads, hd = lw->head_dim;
  VEC("input_layernorm.weight", 1, D, 0, &lw->attn_norm);
  VEC("post_attention_layernorm.weight", 1, D, 0, &lw->post_attn_norm);
  if (lw->linear) {
    int64_t nk = lw->lin_k_heads, nv = lw->lin_v_heads, dk = lw->lin_k_dim, dv = lw->lin_v_dim, C = 2 * nk * dk + nv * dv;
    MAT("linear_attn.in_proj_qkv.weight", C, D, &lw->in_qkv);
    MAT("linear_attn.in_proj_z.weight", nv * dv, D, &lw->in_z);
    MAT("linear_attn.in_proj_a.weight", nv, D, &lw->in_a);
    MAT("linear_attn.in_proj_b.weight", nv, D, &lw->in_b);
    MAT("linear_attn.out_proj.weight", D, nv * dv, &lw->out_proj);
    VEC("linear_attn.conv1d.weight", 3, C, lw->conv_kernel, &lw->conv_w);
    VEC("linear_attn.A_log", 1, nv, 0, &lw->a_log);
    VEC("linear_attn.dt_bias", 1, nv, 0, &lw->dt_bias);
    VEC("linear_attn.norm.weight", 1, dv, 0, &lw->lin_norm);
    return 0;
  }
  MAT("self_attn.q_proj.weight", 2 * H * hd, D, &lw->q);
  MAT("self_attn.k_proj.weight", KV * hd, D, &lw->k);
  MAT("self_attn.v_proj.weight", KV * hd, D, &lw->v);
  MAT("self_attn.o_proj.weight", D, H * hd, &lw->o);
  VEC("self_attn.q_norm.weight", 1, hd, 0, &lw->q_norm);
  VEC("self_attn.k_norm.weight", 1, hd, 0, &lw->k_norm);
  if (c->attention_bias) {
    VEC("self_attn.q_proj.bias", 1, 2 * H * hd, 0, &lw->q_bias);
    VEC("self_attn.k_proj.bias", 1, KV * hd, 0, &lw->k_bias);
    VEC("self_attn.v_proj.bias", 1, KV * hd, 0, &lw->v_bias);
    VEC("self_attn.o_proj.bias", 1, D, 0, &lw->o_bias);
  }
  return 0;
}

/* The dense MLP under prefix (the MTP layer's). */
static int load_mlp_at(model *m, const weight_src *src, const char *prefix, layer_weights *lw, herr *err) {
  char name[256];
  int rc;
  int64_t D = m->cfg.hidden_size, I = m->cfg.intermediate_size;
  lw->inter = I;
  MAT("mlp.gate_proj.weight", I, D, &lw->gate);
  MAT("mlp.up_proj.weight", I, D, &lw->up);
  MAT("mlp.down_proj.weight", D, I, &lw->down);
  return 0;
}
#undef MAT
#undef VEC

void qwen3_5_free(model *m) {
  qwen3_5_state *s = m->fam_state;
  if (!s) return;
  free(s->mtp_lw.experts);
  free(s);
  m->fam_state = NULL;
}

/* The count of MTP layers the config names (mtp_num_hidden_layers, also under text_config), or -1. */
static int64_t mtp_layers(const json_t *raw) {
  const json_t *cfgs[2] = {raw ? json_object_get(raw, "text_config") : NULL, raw};
  for (int i = 0; i < 2; i++) {
    const json_t *v = cfgs[i] && json_is_object(cfgs[i]) ? json_object_get(cfgs[i], "mtp_num_hidden_layers") : NULL;
    if (v && json_is_integer(v)) return json_integer_value(v);
  }
  return -1;
}

int qwen3_5_load_mtp(model *m, const weight_src *src, qwen3_5_load_ffn load_ffn, qwen3_5_ffn ffn, herr *err) {
  const model_config *c = &m->cfg;
  int64_t D = c->hidden_size;
  int rc;
  qwen3_5_state *s = S(m);
  s->mtp.n_nextn = 0;
  bk_weight probe;
  if ((rc = model_describe_matrix(m, src, "mtp.fc.weight", D, 2 * D, false, &probe, err))) return rc;
  if (!probe.data || mtp_layers(c->raw) == 0) return 0;
  const layer_weights *full = NULL; /* the decoder's full-attention geometry */
  for (int l = 0; l < c->num_hidden_layers && !full; l++)
    if (!m->layers[l].linear) full = &m->layers[l];
  if (!full) return herr_set(err, HEARTH_EFORMAT, "multi-token-prediction layer: the model has no full-attention layer to take its shape from");
  s->ffn = ffn;
  if ((rc = model_matrix(m, src, "mtp.fc.weight", D, 2 * D, true, BK_USE_MATMUL, &s->fc, err)) ||
      (rc = model_vector(m, src, "mtp.pre_fc_norm_embedding.weight", 1, D, 0, true, 1.0f, &s->enorm, err)) ||
      (rc = model_vector(m, src, "mtp.pre_fc_norm_hidden.weight", 1, D, 0, true, 1.0f, &s->hnorm, err)) ||
      (rc = model_vector(m, src, "mtp.norm.weight", 1, D, 0, true, 1.0f, &s->mtp.norm, err)))
    return herr_wrap(err, "multi-token-prediction layer");
  layer_weights *lw = &s->mtp_lw;
  lw->heads = full->heads, lw->head_dim = full->head_dim, lw->kv_heads = full->kv_heads;
  lw->rope = full->rope, lw->attn_scale = full->attn_scale, lw->scalar = full->scalar;
  lw->out_gate = true, lw->kv_src = 0, lw->window = 0;
  if ((rc = qwen3_5_load_mixer_at(m, src, "mtp.layers.0.", lw, err)) || (rc = load_ffn(m, src, "mtp.layers.0.", lw, err)))
    return herr_wrap(err, "multi-token-prediction layer");
  s->mtp.n_nextn = 1;
  s->mtp.head = &m->lm_head; /* shared with the model (loaded after this) */
  if (mtp_layers(c->raw) > 1) s->mtp.refused = "it has more than one layer (mtp_num_hidden_layers), which drafting does not chain";
  else s->mtp.layer = lw;
  if (lw->inter > m->w_inter) m->w_inter = lw->inter;
  if (m->w_fam < 2 * D) m->w_fam = 2 * D; /* the [enorm(e) | hnorm(h)] rows */
  return 0;
}

/* The multi-token-prediction layer over the rows of an MTP batch: x (their token embeddings) becomes
 * the full-attention decoder block's output on fc([enorm(x) | hnorm(h)]), its cache kv's layer 0. */
void qwen3_5_mtp(model *m, const kv_store *kv, step *st, const bk_tensor *h) {
  qwen3_5_state *s = m->fam_state;
  layer_mtp_input(m, st, h, &s->enorm, &s->hnorm, &s->fc);
  layer_attention_of(m, &s->mtp_lw, 0, kv, st);
  s->ffn(m, &s->mtp_lw, st);
}

void qwen3_5_mixer(model *m, int l, const kv_store *kv, step *st) {
  if (m->layers[l].linear) layer_deltanet(m, l, kv, st);
  else layer_attention(m, l, kv, st);
}

/* Tensor parallelism: a Gated DeltaNet layer by heads (tp_shard_deltanet: each rank's conv channels and
 * recurrent state hold its heads), gated full attention by heads (a head's query and gate rows go
 * together), the MLP (or the experts and the shared expert) by width. The MTP layer stays whole: it does
 * not run on a split model (model_mtp_check). */
int qwen3_5_shard(model *m, herr *err) {
  int rc = 0;
  for (int l = 0; l < m->cfg.num_hidden_layers && !rc; l++) {
    rc = m->layers[l].linear ? tp_shard_deltanet(m, l, err) : tp_shard_attention(m, l, err);
    if (!rc) rc = tp_shard_ffn(m, &m->layers[l], l, err);
  }
  return rc;
}

static int load_layer(model *m, const weight_src *src, int l, herr *err) {
  int rc = qwen3_5_load_mixer(m, src, l, err);
  return rc ? rc : llama_load_mlp(m, src, l, m->cfg.intermediate_size, err);
}

/* x += mlp(norm(x)) */
static void ffn(model *m, const layer_weights *lw, step *st) {
  layer_norm(m, &st->xn, &st->x, &lw->post_attn_norm);
  bk_tensor o = step_view(&st->o, st->T, m->cfg.hidden_size);
  layer_mlp(m, lw, st, &st->xn, &o);
  bk_add(&st->x, &st->x, &o);
}

/* x += mixer(norm(x)); x += mlp(norm(x)) */
static void layer(model *m, int l, const kv_store *kv, step *st) {
  qwen3_5_mixer(m, l, kv, st);
  ffn(m, &m->layers[l], st);
}

static int load_model(model *m, const weight_src *src, herr *err) { return qwen3_5_load_mtp(m, src, load_mlp_at, ffn, err); }

static int config(model *m, herr *err) { return qwen3_5_config(m, false, err); }

const family_ops qwen3_5_family_ops = {.config = config, .mtp_of = qwen3_5_mtp_of, .prepare = qwen3_5_prepare, .load_layer = load_layer, .load_model = load_model,
                                       .layer = layer, .mtp = qwen3_5_mtp, .shard = qwen3_5_shard, .free = qwen3_5_free};
