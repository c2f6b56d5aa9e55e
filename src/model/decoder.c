/* decoder.c — the model's life and its forward pass: loading (config,
 * family, weights described through load.c and handed to the backend in
 * their stored format), the KV geometry the engine builds its cache for,
 * and the batched forward: one upload of the step's index tables, the
 * embedding, each layer through its family's hook, final norm and head on
 * the rows that need logits (and the final norm on the rows whose final
 * hidden state embedding sequences ask for), one download (or sampling on
 * the device).
 * Also the llama-family decoder's layers (llama, mistral, qwen2, qwen3,
 * smollm3, phi3, gemma2, gemma3_text; granite through granite.c's
 * multipliers): attention then the dense MLP, from layers.c. Knows nothing
 * of sampling, tokenizers or how the cache manages its blocks; other
 * families' layers live in their own files. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/file.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/vec.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/family.h"
#include "model/gguf_model.h"
#include "model/internal.h"
#include "model/mm.h"
#include "model/model.h"
#include "model/rope.h"

const model_config *model_cfg(const model *m) { return &m->cfg; }
bool model_has_head(const model *m) { return !m->no_head; }
int64_t model_canvas_length(const model *m) {
  return m->fam && m->fam->canvas && m->fam_state ? m->fam->ops->canvas(m) : 0;
}
int64_t model_vocab_size(const model *m) { return m->cfg.vocab_size; }

void model_kv_geometry_of(const model *m, model_kv_geometry *g) {
  memset(g, 0, sizeof *g);
  g->n_layers = (int)m->cfg.num_hidden_layers;
  for (int l = 0; l < g->n_layers; l++) {
    const layer_weights *lw = &m->layers[l];
    int64_t kd = lw->kv_k_dim ? lw->kv_k_dim : lw->kv_heads * lw->head_dim;
    g->kv_dim[l] = lw->kv_src == l ? kd : 0; /* a shared layer stores nothing */
    g->v_dim[l] = lw->kv_src == l ? lw->kv_v_dim : 0;
    g->window[l] = lw->window ? lw->window + m->window_extra : 0;
    g->state_dim[l] = lw->state_dim;
    g->f32_only[l] = lw->kv_k_dim || lw->kv_v_dim; /* a family's own cache rows (set_rows, not kv_write) */
  }
  g->backend = m->be;
  if (m->tp) tp_geometry(m, g);
}

bk_backend *model_backend(const model *m) { return m->be; }

/* The family's multi-token-prediction layer (none: all zero). */
static const model_mtp *mtp_of(const model *m) {
  static const model_mtp none;
  return m->fam && m->fam->mtp && m->fam_state ? m->fam->ops->mtp_of(m) : &none;
}

int model_nextn_layers(const model *m) { return mtp_of(m)->n_nextn; }

int model_mtp_check(const model *m, herr *err) {
  const model_mtp *mt = mtp_of(m);
  if (mt->n_nextn <= 0) {
    if (!m->fam || !m->fam->mtp)
      return herr_set(err, HEARTH_EUNSUPPORTED, "the model has no multi-token-prediction layer (model_type '%s' has none)",
                      m->cfg.model_type);
    return herr_set(err, HEARTH_EUNSUPPORTED, "the model has no multi-token-prediction layer (%s: %s)", m->cfg.model_type,
                    m->fam->mtp);
  }
  if (!mt->layer)
    return herr_set(err, HEARTH_EUNSUPPORTED, "the model's multi-token-prediction layer cannot run%s%s",
                    mt->refused ? ": " : " in this family", mt->refused ? mt->refused : "");
  if (m->tp || m->tp_size)
    return herr_set(err, HEARTH_EUNSUPPORTED, "the multi-token-prediction layer does not run on a model split over ranks");
  if (m->xc.budget > 0)
    return herr_set(err, HEARTH_EUNSUPPORTED, "the multi-token-prediction layer does not run under an expert budget");
  return 0;
}

void model_mtp_geometry_of(const model *m, model_kv_geometry *g) {
  memset(g, 0, sizeof *g);
  g->n_layers = 1;
  g->backend = m->be;
  const layer_weights *lw = mtp_of(m)->layer;
  if (!lw) return;
  g->kv_dim[0] = lw->kv_k_dim ? lw->kv_k_dim : lw->kv_heads * lw->head_dim;
  g->v_dim[0] = lw->kv_v_dim;
  g->f32_only[0] = lw->kv_k_dim || lw->kv_v_dim;
}

static size_t weight_bytes(const bk_weight *w) {
  if (!w->rows) return 0;
  size_t b = (size_t)w->rows * bk_row_bytes(w->type, w->cols, w->bits);
  if (w->type == BK_MLX_AFFINE) b += 2 * (size_t)(w->rows * (w->cols / w->group_size)) * (w->scale_type == BK_F32 ? 4 : 2);
  if (w->type == BK_FP8) b += (size_t)w->rows * 4;
  return b;
}

size_t model_weight_bytes(const model *m) {
  size_t total = weight_bytes(&m->embed) + (m->tied ? 0 : weight_bytes(&m->lm_head));
  for (int i = 0; i < m->n_mats; i++) total += weight_bytes(m->mats[i].w);
  for (int i = 0; i < m->n_bufs; i++) total += m->bufs[i]->size;
  return total;
}

static void scratch_free(fwd_scratch *f) {
  bk_buf_free(f->act);
  bk_buf_free(f->idx_buf);
  bk_buf_free(f->logit_buf);
  bk_buf_free(f->media_buf);
  bk_buf_free(f->one_buf);
  free(f->host_idx);
  free(f->host_media);
  free(f->host_keep);
  memset(f, 0, sizeof *f);
}

/* ---- stacked projections ----
 *
 * On a device, a one-row step (batch-1 decode) spends much of its time in
 * launches and in matrices too small to fill the GPU: k and v are a quarter
 * of q's rows. Where q, k and v (gate and up) share a stored format and a
 * width and have no biases, they are uploaded as one matrix — their rows
 * one after another — and become its row ranges, so such a step multiplies
 * the three (two) in one pass into model.f.one and the layer reads them as
 * slices of that row (layers.c). Steps of more rows multiply the ranges one
 * by one, as before. Not on the CPU (whose repacked layout has no row views)
 * nor in a tensor-parallel group; HEARTH_STACK_PROJECTIONS=0 turns it off. */

static bool stackable(const bk_weight *const *p, int n) {
  for (int i = 0; i < n; i++) {
    const bk_weight *w = p[i];
    if (!w->data || !w->rows || w->type != p[0]->type || w->cols != p[0]->cols || w->bits != p[0]->bits) return false;
    if (w->type == BK_MLX_AFFINE || w->type == BK_FP8 || w->packed) return false; /* side arrays: not stacked */
    /* every range starts 256-byte aligned and its output slice 16-byte aligned */
    if (((size_t)w->rows * bk_row_bytes(w->type, w->cols, w->bits)) % 256 || w->rows % 4) return false;
  }
  return true;
}

/* The index in m->mats of w's entry (plain matmul use), or -1. */
static int mat_index(const model *m, const bk_weight *w) {
  for (int i = 0; i < m->n_mats; i++)
    if (m->mats[i].w == w) return m->mats[i].use == BK_USE_MATMUL ? i : -1;
  return -1;
}

static void mat_remove(model *m, int i) {
  memmove(&m->mats[i], &m->mats[i + 1], sizeof m->mats[0] * (size_t)(m->n_mats - i - 1));
  m->n_mats--;
}

/* Replaces the entries of parts[0..n) by one entry for dst (MODEL_USE_STACK) where they stack. */
static void stack_one(model *m, bk_weight *dst, bk_weight *const *parts, int n) {
  if (!stackable((const bk_weight *const *)parts, n)) return;
  for (int i = 0; i < n; i++)
    if (mat_index(m, parts[i]) < 0) return;
  int64_t rows = 0;
  for (int i = 0; i < n; i++) {
    mat_remove(m, mat_index(m, parts[i]));
    rows += parts[i]->rows;
  }
  *dst = (bk_weight){.type = parts[0]->type, .rows = rows, .cols = parts[0]->cols, .bits = parts[0]->bits};
  m->mats[m->n_mats++] = (model_mat){dst, BK_USE_MATMUL | MODEL_USE_STACK}; /* a slot freed above */
  if (rows > m->w_stack) m->w_stack = rows;
}

static void stack_projections(model *m) {
  const char *env = getenv("HEARTH_STACK_PROJECTIONS");
  if ((env && !strcmp(env, "0")) || bk_backend_is_cpu(m->be) || m->tp_size > 0) return;
  for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
    layer_weights *lw = &m->layers[l];
    if (!lw->linear && !lw->out_gate && lw->kv_src == l && lw->v.rows && !lw->q_bias.buf && !lw->k_bias.buf &&
        !lw->v_bias.buf)
      stack_one(m, &lw->qkv, (bk_weight *const[]){&lw->q, &lw->k, &lw->v}, 3);
    if (lw->inter && !lw->gate_bias.buf && !lw->up_bias.buf)
      stack_one(m, &lw->gate_up, (bk_weight *const[]){&lw->gate, &lw->up}, 2);
  }
}

/* Loads stacked matrix w from its parts' host bytes, then makes the parts its row ranges. */
static int load_stack(model *m, bk_weight *w, herr *err) {
  bk_weight *parts[3];
  int n = 0;
  for (int l = 0; l < m->cfg.num_hidden_layers && !n; l++) {
    layer_weights *lw = &m->layers[l];
    if (w == &lw->qkv) parts[0] = &lw->q, parts[1] = &lw->k, parts[2] = &lw->v, n = 3;
    else if (w == &lw->gate_up) parts[0] = &lw->gate, parts[1] = &lw->up, n = 2;
  }
  if (!n) return herr_set(err, HEARTH_EINTERNAL, "a stacked projection of no layer");
  size_t rb = bk_row_bytes(w->type, w->cols, w->bits), total = (size_t)w->rows * rb, off = 0;
  char *host = aligned_alloc(256, (total + 255) / 256 * 256);
  if (!host) return herr_set(err, HEARTH_ENOMEM, "out of memory stacking a [%lld, %lld] projection", (long long)w->rows,
                             (long long)w->cols);
  for (int i = 0; i < n; i++) {
    memcpy(host + off, parts[i]->data, (size_t)parts[i]->rows * rb);
    off += (size_t)parts[i]->rows * rb;
  }
  w->data = host;
  int rc = bk_weight_load(m->be, w, BK_USE_MATMUL, err);
  free(host); /* the device has its copy */
  if (rc) {
    w->data = NULL;
    return rc;
  }
  int64_t r0 = 0;
  for (int i = 0; i < n; i++) {
    int64_t rows = parts[i]->rows;
    *parts[i] = model_sub_rows(w, r0, rows);
    parts[i]->packed = NULL; /* a view: the stack owns the memory */
    r0 += rows;
  }
  return 0;
}

void model_free(model *m) {
  if (!m) return;
  tp_free(m);
  if (m->be) {
    for (int i = 0; i < m->n_mats; i++) bk_weight_release(m->be, m->mats[i].w);
    bk_weight_release(m->be, &m->embed);
    if (!m->tied && !m->no_head) bk_weight_release(m->be, &m->lm_head);
    for (int i = 0; i < m->n_bufs; i++) bk_buf_free(m->bufs[i]);
    scratch_free(&m->f);
  }
  experts_budget_free(m);
  mm_towers_free(m); /* after the release of their matrices, which point into their state */
  if (m->fam && m->fam->ops && m->fam->ops->free) m->fam->ops->free(m);
  free(m->lora_runs);
  pthread_mutex_destroy(&m->lock);
  free(m->mats);
  free(m->bufs);
  for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
  free(m->owned);
  for (int l = 0; m->layers && l < m->cfg.num_hidden_layers; l++) free(m->layers[l].experts);
  free(m->layers);
  for (int i = 0; i < m->n_ropes; i++) rope_table_free(&m->ropes[i]);
  if (m->st_opened) st_close(&m->st);
  gguf_close(m->gg);
  if (!m->be_borrowed) bk_backend_close(m->be);
  config_free(&m->cfg);
  free(m);
}

/* ---- loading ---- */

static double raw_rope_num(const model_config *c, const char *key) {
  const json_t *rs = json_object_get(c->raw, "rope_scaling");
  if (!rs || !json_is_object(rs)) rs = json_object_get(c->raw, "rope_parameters");
  if (rs && json_is_object(rs) && json_object_get(rs, "full_attention")) rs = json_object_get(rs, "full_attention");
  const json_t *v = rs ? json_object_get(rs, key) : NULL;
  return v && json_is_number(v) ? json_number_value(v) : 0;
}

/* config.json's architectures names a bare decoder ("Qwen3Model"), not a causal LM. */
static bool bare_architecture(const model_config *c) {
  const json_t *a = c->raw ? json_object_get(c->raw, "architectures") : NULL;
  const json_t *first = a && json_is_array(a) ? json_array_get(a, 0) : NULL;
  const char *name = first && json_is_string(first) ? json_string_value(first) : "";
  size_t n = strlen(name);
  return n > 5 && strcmp(name + n - 5, "Model") == 0;
}

int model_rope_for(model *m, bool sliding, int64_t head_dim, const rope_table **out, herr *err) {
  for (int i = 0; i < m->n_ropes; i++)
    if (m->rope_key[i][0] == (int)sliding && m->rope_key[i][1] == (int)head_dim) {
      *out = &m->ropes[i];
      return 0;
    }
  if (m->n_ropes == MODEL_MAX_ROPES) return herr_set(err, HEARTH_ELIMIT, "more than %d distinct RoPE tables", MODEL_MAX_ROPES);
  const model_config *c = &m->cfg;
  rope_table *t = &m->ropes[m->n_ropes];
  double msc = raw_rope_num(c, "mscale"), msc_all = raw_rope_num(c, "mscale_all_dim");
  int rc = rope_table_init(t, sliding ? &c->rope_local : &c->rope, head_dim, c->max_position_embeddings, msc, msc_all, err);
  if (rc) return rc;
  t->interleaved = m->rope_interleaved; /* llama.cpp stores llama's q/k rows permuted for RoPE on adjacent pairs */
  m->rope_key[m->n_ropes][0] = (int)sliding;
  m->rope_key[m->n_ropes][1] = (int)head_dim;
  m->n_ropes++;
  *out = t;
  return 0;
}

#define MAT(field, req, a, b, dst)                                                                   \
  do {                                                                                               \
    snprintf(name, sizeof name, "model.layers.%d.%s", l, field);                                     \
    if ((rc = model_matrix(m, src, name, a, b, req, BK_USE_MATMUL, dst, err))) return rc;            \
  } while (0)

#define LOAD(field, req, nd, a, b, dst)                                                               \
  do {                                                                                                \
    snprintf(name, sizeof name, "model.layers.%d.%s", l, field);                                      \
    if ((rc = model_vector(m, src, name, nd, a, b, req, 1.0f, dst, err))) return rc;                 \
  } while (0)

int llama_load_attention(model *m, const weight_src *src, int l, herr *err) {
  const model_config *c = &m->cfg;
  layer_weights *lw = &m->layers[l];
  char name[256];
  int rc;
  int64_t H = c->num_attention_heads, KV = lw->kv_heads, hd = lw->head_dim, D = c->hidden_size;
  LOAD("input_layernorm.weight", true, 1, D, 0, &lw->attn_norm);
  if (m->fam->fused_qkv) {
    bk_weight fused;
    snprintf(name, sizeof name, "model.layers.%d.self_attn.qkv_proj.weight", l);
    if ((rc = model_describe_matrix(m, src, name, (H + 2 * KV) * hd, D, true, &fused, err))) return rc;
    lw->q = model_sub_rows(&fused, 0, H * hd);
    lw->k = model_sub_rows(&fused, H * hd, KV * hd);
    lw->v = model_sub_rows(&fused, (H + KV) * hd, KV * hd);
    if ((rc = model_keep(m, &lw->q, BK_USE_MATMUL, err)) || (rc = model_keep(m, &lw->k, BK_USE_MATMUL, err)) ||
        (rc = model_keep(m, &lw->v, BK_USE_MATMUL, err)))
      return rc;
  } else {
    MAT("self_attn.q_proj.weight", true, H * hd, D, &lw->q);
    MAT("self_attn.k_proj.weight", true, KV * hd, D, &lw->k);
    MAT("self_attn.v_proj.weight", true, KV * hd, D, &lw->v);
  }
  MAT("self_attn.o_proj.weight", true, D, H * hd, &lw->o);
  if (c->attention_bias) {
    bool qkv_req = true, o_req = !m->fam->cfg.qkv_bias; /* q/k/v biases only (qwen2) */
    LOAD("self_attn.q_proj.bias", qkv_req, 1, H * hd, 0, &lw->q_bias);
    LOAD("self_attn.k_proj.bias", qkv_req, 1, KV * hd, 0, &lw->k_bias);
    LOAD("self_attn.v_proj.bias", qkv_req, 1, KV * hd, 0, &lw->v_bias);
    LOAD("self_attn.o_proj.bias", o_req, 1, D, 0, &lw->o_bias);
  }
  if (m->fam->qk_norm) {
    LOAD("self_attn.q_norm.weight", true, 1, hd, 0, &lw->q_norm);
    LOAD("self_attn.k_norm.weight", true, 1, hd, 0, &lw->k_norm);
  }
  LOAD("post_attention_layernorm.weight", true, 1, D, 0, &lw->post_attn_norm);
  if (m->fam->sandwich_norms) {
    LOAD("pre_feedforward_layernorm.weight", true, 1, D, 0, &lw->pre_ffn_norm);
    LOAD("post_feedforward_layernorm.weight", true, 1, D, 0, &lw->post_ffn_norm);
  }
  return 0;
}

int llama_load_mlp(model *m, const weight_src *src, int l, int64_t inter, herr *err) {
  const model_config *c = &m->cfg;
  layer_weights *lw = &m->layers[l];
  char name[256];
  int rc;
  int64_t D = c->hidden_size, I = inter;
  lw->inter = I;
  if (m->fam->fused_qkv) {
    bk_weight fused;
    snprintf(name, sizeof name, "model.layers.%d.mlp.gate_up_proj.weight", l);
    if ((rc = model_describe_matrix(m, src, name, 2 * I, D, true, &fused, err))) return rc;
    lw->gate = model_sub_rows(&fused, 0, I);
    lw->up = model_sub_rows(&fused, I, I);
    if ((rc = model_keep(m, &lw->gate, BK_USE_MATMUL, err)) || (rc = model_keep(m, &lw->up, BK_USE_MATMUL, err))) return rc;
  } else {
    MAT("mlp.gate_proj.weight", true, I, D, &lw->gate);
    MAT("mlp.up_proj.weight", true, I, D, &lw->up);
  }
  MAT("mlp.down_proj.weight", true, D, I, &lw->down);
  if (c->mlp_bias && !m->fam->fused_qkv) {
    LOAD("mlp.gate_proj.bias", true, 1, I, 0, &lw->gate_bias);
    LOAD("mlp.up_proj.bias", true, 1, I, 0, &lw->up_bias);
    LOAD("mlp.down_proj.bias", true, 1, D, 0, &lw->down_bias);
  }
  return 0;
}
#undef LOAD
#undef MAT

static int llama_load_layer(model *m, const weight_src *src, int l, herr *err) {
  int rc = llama_load_attention(m, src, l, err);
  return rc ? rc : llama_load_mlp(m, src, l, m->cfg.intermediate_size, err);
}

/* x += [post](attention) [× residual_scale]; x += [post](mlp(norm(x))) [× residual_scale] */
static void llama_layer(model *m, int l, const kv_store *kv, step *st) {
  const layer_weights *lw = &m->layers[l];
  /* each residual add runs with the norm after it: the FFN's, and the next layer's input norm */
  st->norm_after_attn = m->fam->sandwich_norms ? &lw->pre_ffn_norm : &lw->post_attn_norm;
  layer_attention(m, l, kv, st);
  bk_tensor o = step_view(&st->o, st->T, m->cfg.hidden_size);
  layer_mlp(m, lw, st, &st->xn, &o);
  if (m->fam->sandwich_norms) layer_norm(m, &o, &o, &lw->post_ffn_norm);
  if (m->residual_scale) bk_scale(&o, m->residual_scale);
  if (l + 1 < m->cfg.num_hidden_layers) {
    layer_add_norm(m, st, &o, &m->layers[l + 1].attn_norm);
    st->xn_ready = l + 1;
  } else {
    bk_add(&st->x, &st->x, &o);
  }
}

const family_ops llama_family_ops = {.load_layer = llama_load_layer, .layer = llama_layer, .shard = tp_shard_layers};

/* Per-layer geometry every family starts from: head size and KV heads
 * from the config, window and RoPE by layer type, attention scale. */
static int layer_geometry(model *m, herr *err) {
  const model_config *c = &m->cfg;
  for (int l = 0; l < c->num_hidden_layers; l++) {
    layer_weights *lw = &m->layers[l];
    bool sliding = c->layer_types[l] == LAYER_SLIDING;
    lw->head_dim = c->layer_head_dim[l];
    lw->kv_heads = c->layer_kv_heads[l];
    lw->heads = c->num_attention_heads;
    lw->window = sliding ? c->sliding_window : 0;
    lw->kv_src = l;
    lw->scalar = 1.0f;
    lw->inter = c->intermediate_size;
    lw->rope = NULL;
    int rc;
    if (!c->no_rope[l] && (rc = model_rope_for(m, sliding, lw->head_dim, &lw->rope, err))) return rc;
    double qs = m->fam->query_pre_attn_scalar && c->query_pre_attn_scalar > 0 ? c->query_pre_attn_scalar : (double)lw->head_dim;
    lw->attn_scale = m->fam->v_norm ? 1.0f : (float)(1.0 / sqrt(qs));
  }
  return 0;
}

int model_load(const char *dir, const model_load_opts *opts, model **out, herr *err) {
  if (opts && opts->tensor_parallel > 0) return tp_load(dir, opts, out, err);
  return model_load_rank(dir, opts, 0, 0, out, err);
}

int model_load_rank(const char *dir, const model_load_opts *opts, int rank, int size, model **out, herr *err) {
  *out = NULL;
  model *m = calloc(1, sizeof *m);
  if (!m) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  pthread_mutex_init(&m->lock, NULL);
  m->tp_rank = rank, m->tp_size = size;
  bool is_gguf = gguf_model_is_gguf(dir);
  m->as_bf16 = opts && opts->f32_as_bf16;
  bk_open_opts bo = {.threads = opts ? opts->threads : 0, .f32_activations = opts && opts->f32_activations,
                     .cuda_lib = opts ? opts->cuda_lib : NULL, .cpu_level = opts ? opts->cpu_level : NULL,
                     .no_graphs = opts && opts->no_graphs, .fast_matmul = opts && opts->fast_matmul};
  int rc = 0;
  if (opts && opts->backend) {
    m->be = opts->backend;
    m->be_borrowed = true;
  } else if ((rc = bk_backend_open(opts && opts->device ? opts->device : "cpu", &bo, &m->be, err))) {
    goto fail;
  }
  /* a partial backend runs the rest on the host, but these have no host path */
  if ((rc = bk_backend_require_core(m->be, err))) goto fail;
  /* a backend that computes from host memory reads the weights into it; others map the
   * file only to upload from it */
  int64_t budget = opts ? opts->expert_budget : 0;
  if (budget < 0 || (budget > 0 && m->as_bf16)) {
    rc = herr_set(err, HEARTH_EINVAL, "%s: expert_budget %lld: %s", dir, (long long)budget,
                  budget < 0 ? "must not be negative" : "cannot be combined with f32_as_bf16");
    goto fail;
  }
  /* an expert budget pages experts in and out of the file mapping */
  /* so does a rank of a tensor-parallel group: the ranks share the file's pages */
  int mode = (opts && (opts->mmap || opts->geometry_only)) || !bk_backend_is_cpu(m->be) || budget > 0 || size > 0
                 ? HMMAP_MAP
                 : HMMAP_RESIDENT;
  rc = is_gguf ? gguf_open_mode(&m->gg, dir, mode, err) : model_config_load(&m->cfg, dir, err);
  if (rc) goto fail;
  if (is_gguf && (rc = gguf_model_config(m->gg, &m->cfg, err))) goto fail;
  if (!is_gguf && (rc = model_config_check(&m->cfg, dir, err))) goto fail; /* absurd values refused for every caller */
  const model_config *c = &m->cfg;
  m->fam = model_family_find(c->model_type);
  if (!m->fam) {
    rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: model_type '%s' has no forward pass (supported: %s)", dir, c->model_type,
                  model_supported_types());
    goto fail;
  }
  if (size > 0 && !m->fam->split) {
    rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor parallelism: model_type '%s' is not split over ranks", dir, c->model_type);
    goto fail;
  }
  const family_ops *ops = m->fam->ops;
  if (strcmp(c->hidden_act, "silu") && strcmp(c->hidden_act, "swish") && strcmp(c->hidden_act, "gelu_pytorch_tanh") &&
      strcmp(c->hidden_act, "gelu_new") && strcmp(c->hidden_act, "gelu_fast") && strcmp(c->hidden_act, "gelu") &&
      strcmp(c->hidden_act, "relu")) {
    rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: unknown activation '%s'", dir, c->hidden_act);
    goto fail;
  }
  m->layers = calloc((size_t)c->num_hidden_layers, sizeof *m->layers);
  if (!m->layers) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto fail;
  }
  m->rope_interleaved = is_gguf && (!strcmp(c->model_type, "llama") || !strcmp(c->model_type, "granite")); /* q/k rows permuted */
  if ((ops->config && c->raw && (rc = ops->config(m, err))) || (rc = layer_geometry(m, err)) || (ops->prepare && (rc = ops->prepare(m, err)))) {
    herr_wrap(err, "%s", dir);
    goto fail;
  }
  if (opts && opts->geometry_only) {
    *out = m;
    return 0;
  }
  for (int l = 0; l < c->num_hidden_layers; l++) {
    const layer_weights *lw = &m->layers[l];
    int64_t q = c->num_attention_heads * lw->head_dim, kvw = lw->kv_heads * lw->head_dim;
    if (q > m->w_q) m->w_q = q;
    if (kvw > m->w_kv) m->w_kv = kvw;
    if (lw->inter > m->w_inter) m->w_inter = lw->inter;
  }
  if (!is_gguf) {
    if ((rc = st_open_mode(&m->st, dir, mode, err))) goto fail;
    m->st_opened = true;
  }
  weight_src src = {is_gguf ? NULL : &m->st, m->gg, dir, "model."};
  /* multimodal checkpoints keep the language model under another prefix; a bare
   * decoder's (Qwen3Model, as Qwen3-Embedding is saved) has none */
  static const char *const prefixes[] = {"language_model.model.", "model.language_model.", "model.decoder.",
                                         "model.encoder.language_model.", ""};
  for (size_t i = 0; !is_gguf && !st_find(&m->st, "model.embed_tokens.weight") && i < sizeof prefixes / sizeof prefixes[0]; i++) {
    char probe[128];
    snprintf(probe, sizeof probe, "%sembed_tokens.weight", prefixes[i]);
    if (st_find(&m->st, probe)) src.prefix = prefixes[i];
  }
  if ((rc = model_describe_matrix(m, &src, "model.embed_tokens.weight", c->vocab_size, c->hidden_size, true, &m->embed, err))) goto fail;
  for (int l = 0; l < c->num_hidden_layers; l++)
    if ((rc = ops->load_layer(m, &src, l, err))) goto fail;
  if (ops->load_model && (rc = ops->load_model(m, &src, err))) goto fail;
  if (!is_gguf && (rc = mm_towers_load(m, &src, dir, err))) goto fail; /* vision / audio encoders beside it */
  if ((rc = model_vector(m, &src, "model.norm.weight", 1, c->hidden_size, 0, true, 1.0f, &m->final_norm, err))) goto fail;
  m->tied = c->tie_word_embeddings;
  /* a bare decoder's folder (Qwen3Model, as Qwen3-Embedding is saved: names without "model.", or
   * architectures naming a *Model) may have no head; a causal LM's must */
  bool bare = (src.prefix && !src.prefix[0]) || bare_architecture(c);
  if (!m->tied && (rc = model_describe_matrix(m, &src, "lm_head.weight", c->vocab_size, c->hidden_size, !bare, &m->lm_head, err)))
    goto fail;
  if (!m->tied && !m->lm_head.data) {
    /* a bare decoder (an embedding model saved from Qwen3Model): hidden states, no logits */
    m->no_head = true;
    HLOG_INFO("%s: no lm_head.weight: the model gives hidden states (embeddings) only", dir);
  }
  if (size > 0 && (rc = tp_shard(m, err))) { /* a rank keeps its part */
    herr_wrap(err, "%s", dir);
    goto fail;
  }
  if (m->as_bf16) { /* asked for: f32 matrices stored as bf16 (vectors were rounded as they were read) */
    for (int i = 0; i < m->n_mats; i++)
      if ((rc = model_to_bf16(m, m->mats[i].w, err))) goto fail;
    if ((rc = model_to_bf16(m, &m->embed, err)) || (!m->tied && !m->no_head && (rc = model_to_bf16(m, &m->lm_head, err)))) goto fail;
  }
  stack_projections(m);
  /* a device that cannot hold the weights refuses the model before any matrix is uploaded */
  size_t fr = 0, tot = 0, need = model_weight_bytes(m);
  if (budget > 0 && c->num_experts > 0) { /* under a budget at most that many bytes of experts are on the device */
    size_t ex = (size_t)model_expert_bytes(m);
    need -= ex - ((size_t)budget < ex ? (size_t)budget : ex);
  }
  if (!bk_backend_is_cpu(m->be) && bk_mem_info(m->be, &fr, &tot) == 0 && need + ((size_t)256 << 20) > fr) {
    rc = herr_set(err, HEARTH_ENOMEM, "%s: the weights need %.2f GiB of memory on %s, which has %.2f GiB free of %.2f GiB", dir,
                  (double)need / (1 << 30), bk_backend_name(m->be), (double)fr / (1 << 30), (double)tot / (1 << 30));
    goto fail;
  }
  /* hand the matrices to the backend; resident file bytes are ours to give back */
  unsigned priv = mode == HMMAP_RESIDENT ? BK_USE_PRIVATE : 0;
  bool lazy = budget > 0 && c->num_experts > 0; /* experts load when first chosen (experts.c) */
  for (int i = 0; i < m->n_mats; i++) {
    if (lazy && (m->mats[i].use & MODEL_USE_EXPERT)) continue;
    if ((m->mats[i].use & MODEL_USE_STACK) ? (rc = load_stack(m, m->mats[i].w, err)) != 0
                                             : (rc = bk_weight_load(m->be, m->mats[i].w,
                                                                    (m->mats[i].use & ~(unsigned)MODEL_USE_EXPERT) | priv, err)) != 0) {
      m->n_mats = i; /* the ones not loaded have nothing to release */
      goto fail;
    }
  }
  if (lazy && (rc = experts_budget_init(m, budget, err))) goto fail;
  if ((rc = bk_weight_load(m->be, &m->embed, BK_USE_EMBED | (m->tied ? BK_USE_MATMUL : 0) | priv, err))) goto fail;
  if (m->tied) m->lm_head = m->embed;
  else if (!m->no_head && (rc = bk_weight_load(m->be, &m->lm_head, BK_USE_MATMUL | priv, err))) goto fail;

  if (m->fam->scale_embeddings) {
    float s = sqrtf((float)c->hidden_size);
    if (!strcmp(c->torch_dtype, "bfloat16")) s = bk_round_bf16(s);
    else if (!strcmp(c->torch_dtype, "float16")) s = bk_round_f16(s);
    m->embed_scale = s;
  }
  *out = m;
  return 0;
fail:
  model_free(m);
  return rc;
}

/* ---- forward ---- */

size_t model_batch_logit_rows(const model_batch *b) {
  size_t rows = 0;
  for (int s = 0; s < b->n_seqs; s++)
    if (b->seqs[s].out == MODEL_OUT_LOGITS || b->seqs[s].out == MODEL_OUT_LOGITS_HOST)
      rows += b->seqs[s].all_logits ? (size_t)b->seqs[s].n_tokens : 1;
  return rows;
}

/* Grows the scratch to hold T tokens, n_idx index entries, R logits rows and M media rows. */
static int scratch_reserve(model *m, int64_t T, int64_t n_idx, int64_t R, int64_t M, herr *err) {
  const model_config *c = &m->cfg;
  fwd_scratch *f = &m->f;
  int rc;
  if (T > f->cap_t) {
    int64_t cap = f->cap_t ? f->cap_t : 16;
    while (cap < T) cap *= 2;
    int64_t D = c->hidden_size, wide = m->w_q > D ? m->w_q : D, E = c->num_experts, K = c->num_experts_per_tok;
    int64_t cols[] = {D, D, m->w_q, m->w_kv, m->w_kv, m->w_q, wide, m->w_inter, m->w_inter, D, E, K, K, m->w_fam};
    bk_tensor *ts[] = {&f->x, &f->xn, &f->q, &f->k, &f->v, &f->att, &f->o, &f->gate, &f->up, &f->x2, &f->elog, &f->eids, &f->ew,
                       &f->fam};
    enum { N_ACT = sizeof cols / sizeof cols[0] };
    size_t total = 0;
    for (int i = 0; i < N_ACT; i++) total += ((size_t)(cap * cols[i]) * sizeof(float) + 255) / 256 * 256;
    bk_buf *buf;
    if ((rc = bk_buf_new(m->be, total, &buf, err)))
      return herr_wrap(err, "model_forward: activations for %lld tokens", (long long)cap);
    bk_buf_free(f->act);
    f->act = buf;
    size_t off = 0;
    for (int i = 0; i < N_ACT; i++) {
      *ts[i] = (bk_tensor){.buf = buf, .off = off, .dt = ts[i] == &f->eids ? BK_DT_I32 : BK_DT_F32, .rows = cap, .cols = cols[i]};
      off += ((size_t)(cap * cols[i]) * sizeof(float) + 255) / 256 * 256;
    }
    f->cap_t = cap;
  }
  if (m->w_stack > 0 && !f->one_buf) {
    if ((rc = bk_tensor_new(m->be, BK_DT_F32, 1, m->w_stack, &f->one, err))) return rc;
    f->one_buf = f->one.buf;
  }
  if (n_idx > f->cap_idx) {
    int64_t cap = f->cap_idx; /* host and device tables share it; at least 256 */
    if (!HGROW(f->host_idx, cap, n_idx > 256 ? n_idx : 256))
      return herr_set(err, HEARTH_ENOMEM, "model_forward: out of memory for %lld indices", (long long)n_idx);
    bk_buf_free(f->idx_buf);
    f->idx_buf = NULL;
    f->cap_idx = 0;
    if ((rc = bk_tensor_new(m->be, BK_DT_I32, cap, 1, &f->idx, err))) return rc;
    f->idx_buf = f->idx.buf;
    f->cap_idx = cap;
  }
  if (M > f->cap_media) {
    int64_t cap = f->cap_media ? f->cap_media : 64;
    while (cap < M) cap *= 2;
    float *h = malloc((size_t)(cap * c->hidden_size) * sizeof(float));
    if (!h) return herr_set(err, HEARTH_ENOMEM, "model_forward: out of memory for %lld media rows", (long long)cap);
    bk_buf_free(f->media_buf);
    free(f->host_media);
    f->media_buf = NULL, f->host_media = h, f->cap_media = 0;
    if ((rc = bk_tensor_new(m->be, BK_DT_F32, cap, c->hidden_size, &f->media, err)))
      return herr_wrap(err, "model_forward: media rows for %lld tokens", (long long)cap);
    f->media_buf = f->media.buf;
    f->cap_media = cap;
  }
  if (R > f->cap_r) {
    int64_t cap = f->cap_r ? f->cap_r : 4;
    while (cap < R) cap *= 2;
    bk_buf_free(f->logit_buf);
    f->logit_buf = NULL;
    f->cap_r = 0;
    if ((rc = bk_tensor_new(m->be, BK_DT_F32, cap, c->vocab_size, &f->logits, err)))
      return herr_wrap(err, "model_forward: logits for %lld rows", (long long)cap);
    f->logit_buf = f->logits.buf;
    f->cap_r = cap;
  }
  return 0;
}

static bool has_logits_row(const model_seq *sq) { return sq->out == MODEL_OUT_LOGITS || sq->out == MODEL_OUT_LOGITS_HOST; }

/* A forward step once checked (forward_check) and laid out (forward_tables): its sizes, its pool and
 * the views its layers and head read beyond the step's own. */
typedef struct fwd_plan {
  int64_t T, R, P, M, Q, S; /* tokens, logits rows, hidden rows, media rows, next_hidden rows, sequences */
  bool has_last, mtp, canvas;
  const kv_store *kv;       /* the batch's pool (this rank's arenas) */
  int n_runs;               /* runs of rows with adapters (m->lora_runs) */
  bk_tensor gq;             /* I32 [Q]: the next_hidden rows */
  bk_tensor mrow, media;    /* I32 [M]: the media rows' token indices; [M, hidden]: their rows (an MTP
                               batch: each row's hidden input) */
} fwd_plan;

/* The batch checked against the model and its sizes counted into p; each sequence's KV rows
 * reserved unless mode is FWD_RANK (a split model's other ranks: rank 0 reserved them). */
static int forward_check(model *m, const model_batch *b, int mode, fwd_plan *p, herr *err) {
  const model_config *c = &m->cfg;
  if (!b || b->n_seqs <= 0) return herr_set(err, HEARTH_EINVAL, "model_forward: empty batch");
  int64_t T = 0, R = 0, P = 0, M = 0, Q = 0;
  bool has_last = false, mtp = b && b->n_seqs > 0 && b->seqs[0].mtp_hidden;
  int rc0;
  if (mtp && (rc0 = model_mtp_check(m, err))) return herr_wrap(err, "model_forward");
  for (int s = 0; b && s < b->n_seqs; s++) {
    const model_seq *sq = &b->seqs[s];
    if (!sq->kv || !sq->kv->ops || sq->n_tokens <= 0 || !sq->tokens)
      return herr_set(err, HEARTH_EINVAL, "model_forward: sequence %d has no cache or no tokens", s);
    if (mtp != (sq->mtp_hidden != NULL))
      return herr_set(err, HEARTH_EINVAL, "model_forward: sequence %d: %s", s,
                      mtp ? "a multi-token-prediction batch needs each row's hidden input (mtp_hidden)"
                          : "hidden inputs (mtp_hidden) belong to a multi-token-prediction batch");
    if (mtp && ((sq->out != MODEL_OUT_LOGITS && sq->out != MODEL_OUT_NONE) || sq->embeds || sq->positions3 ||
                sq->bidir_last || sq->canvas || sq->n_lora))
      return herr_set(err, HEARTH_EINVAL,
                      "model_forward: sequence %d: a multi-token-prediction batch gives logits only, without media "
                      "or adapters", s);
    if (sq->next_hidden) Q += sq->n_tokens;
    for (int s2 = 0; s2 < s; s2++)
      if (b->seqs[s2].kv == sq->kv) return herr_set(err, HEARTH_EINVAL, "model_forward: sequences %d and %d share one cache", s2, s);
    for (int i = 0; i < sq->n_tokens; i++)
      if (sq->tokens[i] < 0 || sq->tokens[i] >= c->vocab_size)
        return herr_set(err, HEARTH_EINVAL, "model_forward: token id %d is outside the vocabulary (size %lld)", (int)sq->tokens[i],
                        (long long)c->vocab_size);
    if (sq->out < MODEL_OUT_LOGITS || sq->out > MODEL_OUT_HIDDEN_ALL)
      return herr_set(err, HEARTH_EINVAL, "model_forward: sequence %d asks for output %d, which does not exist", s, (int)sq->out);
    if (sq->canvas != b->seqs[0].canvas || (sq->canvas && sq->n_tokens != b->seqs[0].n_tokens))
      return herr_set(err, HEARTH_EINVAL, "model_forward: a batch is all canvas sequences of one length, or none");
    if (sq->self_cond && (!sq->canvas || !model_canvas_length(m)))
      return herr_set(err, HEARTH_EINVAL, "model_forward: sequence %d: self-conditioning needs a canvas pass of a diffusion model", s);
    if (sq->out != MODEL_OUT_LOGITS && sq->all_logits)
      return herr_set(err, HEARTH_EINVAL, "model_forward: sequence %d sets all_logits without a logits output", s);
    if ((sq->out == MODEL_OUT_HIDDEN || sq->out == MODEL_OUT_HIDDEN_ALL || sq->out == MODEL_OUT_LOGITS_HOST) && !sq->dest)
      return herr_set(err, HEARTH_EINVAL, "model_forward: sequence %d has nowhere to write its output", s);
    for (int i = 0; sq->embeds && i < sq->n_tokens; i++) M += sq->embeds[i] != NULL;
    for (int i = 0; sq->bidir_last && i < sq->n_tokens; i++) {
      int64_t last = sq->bidir_last[i], rw = sq->kv->len + i;
      if (last < 0) continue;
      if (last < rw || last >= sq->kv->len + sq->n_tokens)
        return herr_set(err, HEARTH_EINVAL,
                        "model_forward: sequence %d: token %d's bidirectional span ends at row %lld, outside this forward "
                        "(rows %lld to %lld)",
                        s, i, (long long)last, (long long)rw, (long long)(sq->kv->len + sq->n_tokens - 1));
      has_last = true;
    }
    T += sq->n_tokens;
    if (has_logits_row(sq)) R += sq->all_logits ? sq->n_tokens : 1;
    if (sq->out == MODEL_OUT_HIDDEN) P++;
    if (sq->out == MODEL_OUT_HIDDEN_ALL) P += sq->n_tokens;
  }
  if (R > 0 && m->no_head)
    return herr_set(err, HEARTH_EUNSUPPORTED,
                    "model_forward: this model has no output head (no lm_head.weight): it gives hidden states "
                    "(embeddings) only, not logits");
  bool recurrent = false;
  for (int l = 0; !mtp && l < c->num_hidden_layers; l++) recurrent |= m->layers[l].state_dim > 0;
  for (int s = 0; s < b->n_seqs; s++) {
    if (recurrent && b->seqs[s].kv->state < 0)
      return herr_set(err, HEARTH_EINVAL, "model_forward: sequence %d's cache keeps no recurrent state, which this model needs", s);
    int rc = mode == FWD_RANK ? 0 : b->seqs[s].kv->ops->reserve(b->seqs[s].kv, b->seqs[s].n_tokens, err);
    if (rc) return rc;
  }
  p->T = T, p->R = R, p->P = P, p->M = M, p->Q = Q, p->has_last = has_last, p->mtp = mtp;
  return 0;
}

/* The step's index tables, one upload: the batch's pool, each token's id, position, KV row and slot,
 * the rows that need outputs, the recurrent ops' sequences, the block tables, media rows; the runs of
 * rows that use adapters; the family's own inputs (family_ops.inputs); st's views of the scratch. */
static int forward_tables(model *m, const model_batch *b, fwd_plan *plan, step *st, herr *err) {
  const model_config *c = &m->cfg;
  int64_t T = plan->T, R = plan->R, P = plan->P, M = plan->M, Q = plan->Q;
  bool has_last = plan->has_last, mtp = plan->mtp;
  /* block tables after every reserve: one store for the whole batch */
  const kv_store *kv = NULL;
  int64_t n_tables = 0;
  for (int s = 0; s < b->n_seqs; s++) {
    const int32_t *blocks;
    int64_t nb;
    const kv_store *pool = kv_store_rank(b->seqs[s].kv->ops->table(b->seqs[s].kv, &blocks, &nb), m->tp_rank);
    if (kv && pool != kv) return herr_set(err, HEARTH_EINVAL, "model_forward: the sequences of one batch must share one KV pool");
    bool fits = pool->n_layers == (mtp ? 1 : c->num_hidden_layers) && pool->k[0].buf->be == m->be;
    if (mtp && fits) { /* the MTP layer's own cache */
      model_kv_geometry mg;
      model_mtp_geometry_of(m, &mg);
      fits = pool->k[0].cols * 4 == (int64_t)bk_kv_row_bytes(pool->k_fmt[0], mg.kv_dim[0]);
    }
    for (int l = 0; fits && !mtp && l < c->num_hidden_layers; l++) {
      int64_t kd = m->layers[l].kv_k_dim ? m->layers[l].kv_k_dim : m->layers[l].kv_heads * m->layers[l].head_dim;
      fits = (m->layers[l].kv_src != l || pool->k[l].cols * 4 == (int64_t)bk_kv_row_bytes(pool->k_fmt[l], kd)) &&
             (!m->layers[l].state_dim || (pool->state[l].buf && pool->state[l].cols == m->layers[l].state_dim &&
                                          b->seqs[s].kv->state < pool->n_states));
    }
    if (!fits) return herr_set(err, HEARTH_EINVAL, "model_forward: sequence %d's KV cache was not made for this model", s);
    kv = pool;
    n_tables += nb;
  }
  /* index tables, one I32 upload: ids, pos, row, tab, slot [T] each, gather [R + P + Q] (the logits
   * rows, then the hidden rows, then the next_hidden rows), the recurrent ops' sequences [S, 4], with multimodal RoPE each
   * token's three positions [T, 3], tables [n_tables], then the media rows' token indices [M] and,
   * with bidirectional spans, each token's last row [T] */
  int64_t PA = m->pos_axes > 1 ? m->pos_axes : 0;
  int64_t S = b->n_seqs, L = has_last ? T : 0, n_idx;
  if (mtp) M = T; /* the rows' hidden inputs travel as media rows do (an MTP batch has no media) */
  n_idx = 5 * T + R + P + Q + n_tables + 4 * S + M + L + PA * T;
  int rc = scratch_reserve(m, T, n_idx, R, M, err);
  if (!rc && m->comm) rc = tp_reserve(m, R, err);
  if (rc) return rc;
  int32_t *h = m->f.host_idx, *ids = h, *pos = h + T, *row = h + 2 * T, *tab = h + 3 * T, *slot = h + 4 * T,
          *gather = h + 5 * T, *rseqs = gather + R + P + Q, *posv = rseqs + 4 * S, *tables = posv + PA * T,
          *mrows = tables + n_tables, *lastv = mrows + M;
  int64_t mi = 0, D = c->hidden_size;
  int64_t t = 0, r = 0, p = 0, q = 0, toff = 0, B = kv->block_rows;
  bool keeps = false; /* some sequence keeps its state after each token (kv_seq.keep) */
  for (int s = 0; s < b->n_seqs; s++) keeps |= b->seqs[s].kv->n_keep > 0 && b->seqs[s].kv->len == b->seqs[s].kv->keep_at;
  if (keeps && !HGROW(m->f.host_keep, m->f.cap_keep, (size_t)T)) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (int s = 0; s < b->n_seqs; s++) {
    const model_seq *sq = &b->seqs[s];
    const int32_t *blocks;
    int64_t nb;
    sq->kv->ops->table(sq->kv, &blocks, &nb);
    memcpy(tables + toff, blocks, sizeof(int32_t) * (size_t)nb);
    int32_t *rs = rseqs + 4 * s; /* rec_seq: t0, n, state row, fresh */
    rs[0] = (int32_t)t, rs[1] = sq->n_tokens, rs[2] = sq->kv->state < 0 ? 0 : sq->kv->state, rs[3] = sq->kv->len == 0;
    const kv_seq *ks = sq->kv;
    for (int i = 0; keeps && i < sq->n_tokens; i++)
      m->f.host_keep[t + i] = ks->len == ks->keep_at && i < ks->n_keep ? ks->keep[i] : -1;
    for (int i = 0; i < sq->n_tokens; i++, t++) {
      int64_t rw = sq->kv->len + i;
      ids[t] = m->tp_size ? tp_local_token(m, sq->tokens[i]) : sq->tokens[i];
      if (sq->embeds && sq->embeds[i]) { /* a media row: its embedding comes from the tower; the pad token's
                                             stands in for everything keyed on the id (per-layer inputs) */
        int32_t pad = c->pad_token_id >= 0 && c->pad_token_id < c->vocab_size ? (int32_t)c->pad_token_id : 0;
        ids[t] = m->tp_size ? tp_local_token(m, pad) : pad;
        memcpy(m->f.host_media + mi * D, sq->embeds[i], sizeof(float) * (size_t)D);
        mrows[mi++] = (int32_t)t;
      }
      if (has_last) lastv[t] = (int32_t)(sq->bidir_last && sq->bidir_last[i] >= 0 ? sq->bidir_last[i] : rw);
      row[t] = (int32_t)(sq->canvas ? sq->kv->len + sq->n_tokens - 1 : rw); /* a canvas sees all of itself */
      pos[t] = (int32_t)(sq->positions ? sq->positions[i] : rw);
      for (int64_t a = 0; a < PA; a++) posv[t * PA + a] = sq->positions3 ? sq->positions3[3 * i + a] : pos[t];
      tab[t] = (int32_t)toff;
      slot[t] = (int32_t)(blocks[rw / B] * B + rw % B);
      if (has_logits_row(sq) && (sq->all_logits || i == sq->n_tokens - 1)) gather[r++] = (int32_t)t;
      if ((sq->out == MODEL_OUT_HIDDEN && i == sq->n_tokens - 1) || sq->out == MODEL_OUT_HIDDEN_ALL) gather[R + p++] = (int32_t)t;
      if (sq->next_hidden) gather[R + P + q++] = (int32_t)t;
      if (mtp) { /* row t's hidden input */
        memcpy(m->f.host_media + mi * D, sq->mtp_hidden + (size_t)i * (size_t)D, sizeof(float) * (size_t)D);
        mrows[mi++] = (int32_t)t;
      }
    }
    toff += nb;
  }
  /* runs of rows whose sequences use the same adapters */
  int n_runs = 0;
  t = 0;
  for (int s = 0; s < b->n_seqs; s++) {
    const model_seq *sq = &b->seqs[s];
    if (sq->n_lora > 0) {
      if (sq->n_lora > MODEL_MAX_LORA || !sq->lora)
        return herr_set(err, HEARTH_EINVAL, "model_forward: sequence %d stacks %d adapters (at most %d)", s, sq->n_lora, MODEL_MAX_LORA);
      for (int j = 0; j < sq->n_lora; j++)
        if (!sq->lora[j] || tp_rank_model(model_lora_model(sq->lora[j]), m->tp_rank) != m) /* (a split model's: rank 0's) */
          return herr_set(err, HEARTH_EINVAL, "model_forward: sequence %d uses an adapter loaded onto another model", s);
      lora_run *prev = n_runs ? &m->lora_runs[n_runs - 1] : NULL;
      bool same = prev && prev->t0 + prev->rows == t && prev->n == sq->n_lora &&
                  !memcmp(prev->a, sq->lora, sizeof(sq->lora[0]) * (size_t)sq->n_lora);
      if (same) prev->rows += sq->n_tokens;
      else {
        if (n_runs == m->cap_lora_runs && !HGROW(m->lora_runs, m->cap_lora_runs, n_runs + 1))
          return herr_set(err, HEARTH_ENOMEM, "model_forward: out of memory");
        lora_run *r = &m->lora_runs[n_runs++];
        memset(r, 0, sizeof *r);
        r->t0 = t, r->rows = sq->n_tokens, r->n = sq->n_lora;
        memcpy(r->a, sq->lora, sizeof(sq->lora[0]) * (size_t)sq->n_lora);
      }
    }
    t += sq->n_tokens;
  }
  fwd_scratch *f = &m->f;
  *st = (step){.T = T, .R = R, .lora = m->lora_runs, .n_lora = n_runs, .tp_rank = m->tp_rank, .keep = keeps ? f->host_keep : NULL};
  plan->canvas = b->seqs[0].canvas;
  if (plan->canvas) {
    st->canvas = true;
    st->window_extra = b->seqs[0].n_tokens - 1;
  }
  const family_ops *ops = m->fam->ops;
  if (ops->inputs && (rc = ops->inputs(m, b, st, err))) return rc;
  st->x = bk_rows(&f->x, 0, T), st->xn = bk_rows(&f->xn, 0, T), st->q = bk_rows(&f->q, 0, T);
  st->k = bk_rows(&f->k, 0, T), st->v = bk_rows(&f->v, 0, T), st->att = bk_rows(&f->att, 0, T);
  st->o = bk_rows(&f->o, 0, T), st->gate = bk_rows(&f->gate, 0, T), st->up = bk_rows(&f->up, 0, T);
  st->x2 = bk_rows(&f->x2, 0, T), st->elog = bk_rows(&f->elog, 0, T), st->eids = bk_rows(&f->eids, 0, T);
  st->ew = bk_rows(&f->ew, 0, T);
  st->fam = bk_rows(&f->fam, 0, T);
  if (T == 1 && f->one_buf) st->one = f->one;
  bk_tensor *parts[] = {&st->ids, &st->pos, &st->row, &st->tab, &st->slot};
  for (int i = 0; i < 5; i++) *parts[i] = bk_rows(&f->idx, i * T, T);
  st->gather = bk_rows(&f->idx, 5 * T, R + P);
  plan->gq = bk_rows(&f->idx, 5 * T + R + P, Q);
  st->rseqs = bk_rows(&f->idx, 5 * T + R + P + Q, 4 * S);
  st->rseqs = bk_reshape(&st->rseqs, S, 4);
  /* with multimodal RoPE each token's positions [T, PA] sit before the tables: at an offset a recorded
   * step's key fixes (the tables' length changes as sequences grow) */
  const int64_t tab0 = 5 * T + R + P + Q + 4 * S + PA * T;
  st->tables = bk_rows(&f->idx, tab0, n_tables);
  plan->mrow = bk_rows(&f->idx, tab0 + n_tables, M);
  plan->media = bk_rows(&f->media, 0, M);
  st->has_last = has_last;
  if (has_last) st->last = bk_rows(&f->idx, tab0 + n_tables + M, T);
  if (PA > 0) { /* the rope reads [T, PA] positions */
    st->pos = bk_rows(&f->idx, 5 * T + R + P + Q + 4 * S, PA * T);
    st->pos = bk_reshape(&st->pos, T, PA);
  }
  if ((rc = bk_set(&f->idx, 0, h, sizeof(int32_t) * (size_t)n_idx, err))) return rc;
  if (M > 0 && (rc = bk_set(&plan->media, 0, f->host_media, sizeof(float) * (size_t)(M * D), err))) return rc;
  plan->kv = kv, plan->n_runs = n_runs, plan->M = M, plan->S = S;
  return 0;
}

/* The embedding, then the family's layers (an MTP batch: its multi-token-prediction layer) over the
 * step's rows, into st->x. */
static void forward_layers(model *m, const fwd_plan *p, step *st) {
  const family_ops *ops = m->fam->ops;
  st->norm_after_attn = NULL, st->xn_ready = -1;
  bk_embed(&st->x, &m->embed, &st->ids, m->embed_scale);
  model_reduce(m, &st->x); /* vocabulary-parallel: one rank holds each token's row, the others add zeros */
  if (p->mtp) {
    ops->mtp(m, p->kv, st, &p->media); /* media: the rows' hidden inputs */
    return;
  }
  if (p->M > 0) bk_set_rows(&st->x, &p->media, &p->mrow); /* media rows: the tower's, unscaled (after the reduce: whole rows) */
  if (ops->embedded) ops->embedded(m, st);
  for (int l = 0; l < m->cfg.num_hidden_layers; l++) ops->layer(m, l, p->kv, st);
}

/* The head: the rows that need logits or hidden states gathered into xr and through the final norm
 * (an MTP batch: its head's norm), the next_hidden rows likewise into m->f.nh, and lg = the first R
 * rows through lm_head (an MTP batch: its head), times logit_scale, softcapped. */
static int forward_head(model *m, const fwd_plan *p, const step *st, const bk_tensor *lg, const bk_tensor *xr, herr *err) {
  const model_config *c = &m->cfg;
  const model_mtp *mt = mtp_of(m);
  const bk_tensor *fnorm = p->mtp && mt->norm.buf ? &mt->norm : &m->final_norm;
  if (p->R + p->P > 0) {
    bk_get_rows(xr, &st->x, &st->gather);
    bk_rmsnorm(xr, xr, fnorm, (float)c->rms_norm_eps, m->fam->unit_offset_norm);
  }
  if (p->Q > 0) {
    bk_get_rows(&m->f.nh, &st->x, &p->gq);
    bk_rmsnorm(&m->f.nh, &m->f.nh, fnorm, (float)c->rms_norm_eps, m->fam->unit_offset_norm);
  }
  if (p->R > 0) {
    bk_tensor xl = bk_rows(xr, 0, p->R);
    int rc;
    if (p->mtp) bk_matmul_t(lg, &xl, mt->head, NULL);
    else if ((rc = model_head(m, lg, &xl, err))) return rc;
    if (m->logit_scale) bk_scale(lg, m->logit_scale);
    if (c->final_logit_softcapping > 0) bk_softcap(lg, (float)c->final_logit_softcapping);
  }
  return 0;
}

/* The forward pass up to the logits rows (left on the backend in *lg) and
 * the final hidden states of MODEL_OUT_HIDDEN sequences (*hid, in batch
 * order); no sequence's length changes (forward_commit does that once they
 * are read): forward_check, forward_tables, then forward_layers and
 * forward_head, recorded and replayed for decode-sized steps. */
int model_forward_rank(model *m, const model_batch *b, bk_tensor *lg_out, bk_tensor *hid_out, int mode, herr *err) {
  fwd_plan pl = {0};
  step st;
  int rc = forward_check(m, b, mode, &pl, err);
  if (rc || mode == FWD_CHECK) return rc; /* FWD_CHECK: a group's ranks run the rest */
  if ((rc = forward_tables(m, b, &pl, &st, err))) return rc;
  fwd_scratch *f = &m->f;
  int64_t T = pl.T, R = pl.R, P = pl.P, M = pl.M, Q = pl.Q, S = pl.S;
  const kv_store *kv = pl.kv;
  int n_runs = pl.n_runs;
  bool has_last = pl.has_last, canvas = pl.canvas, mtp = pl.mtp;
  /* Decode-sized steps are recorded once per shape and replayed (bk_graph_begin):
   * everything that varies between steps is in the index tables and the KV
   * blocks; the key holds what the ops' arguments depend on. */
  /* (under an expert budget the experts a step reads are loaded as its routing chooses them: never recorded) */
  bool record = T <= FORWARD_GRAPH_MAX_T && m->xc.budget == 0 && M == 0 && !has_last && !canvas && !mtp;
  bool replay = false;
  if (record) {
    uint64_t key = hmix64((uint64_t)T * 0x10001u + (uint64_t)R + ((uint64_t)P << 40) + ((uint64_t)Q << 52));
    key = hmix64(key ^ (uint64_t)(uintptr_t)f->x.buf->base);
    key = hmix64(key ^ (uint64_t)(uintptr_t)f->idx.buf->base);
    key = hmix64(key ^ (uint64_t)(uintptr_t)(f->logits.buf ? f->logits.buf->base : NULL));
    key = hmix64(key ^ (uint64_t)(uintptr_t)(m->tp_buf ? m->tp_buf->base : NULL)); /* a split model's head */
    for (int l = 0; l < kv->n_layers; l++)
      key = hmix64(key ^ (uint64_t)(uintptr_t)bk_addr(&kv->k[l]) ^ ((uint64_t)(uintptr_t)bk_addr(&kv->v[l]) << 1) ^
                   (kv->state[l].buf ? (uint64_t)(uintptr_t)bk_addr(&kv->state[l]) << 2 : 0));
    key = hmix64(key ^ (uint64_t)S); /* where the tables start */
    /* adapters: which rows get whose delta (load serials are never reused, so a recording that read
     * an adapter since freed is never replayed) */
    for (int i = 0; i < n_runs; i++) {
      key = hmix64(key ^ ((uint64_t)m->lora_runs[i].t0 << 32 | (uint64_t)m->lora_runs[i].rows) ^ 0x4c6f5241ull);
      for (int j = 0; j < m->lora_runs[i].n; j++) key = hmix64(key ^ model_lora_serial(m->lora_runs[i].a[j]));
    }
    replay = bk_graph_begin(m->be, key);
  }
  bk_tensor lg = bk_rows(&f->logits, 0, R);
  bk_tensor xr = bk_rows(&st.xn, 0, R + P); /* the gathered rows after the final norm */
  f->nh = bk_rows(&st.x2, 0, Q);            /* the next_hidden rows, likewise */
  for (int pass = 0; pass < 2 && !replay; pass++) {
    forward_layers(m, &pl, &st);
    if (m->xc.err.code) { /* an expert could not be loaded (expert budget) */
      if (err) *err = m->xc.err;
      rc = m->xc.err.code;
      herr_clear(&m->xc.err);
      bk_sync(m->be, NULL);
      return rc;
    }
    if ((rc = forward_head(m, &pl, &st, &lg, &xr, err))) return rc;
    if (!record) break;
    rc = bk_graph_end(m->be, err);
    record = false;
    if (rc == BK_GRAPH_REDO) continue; /* the recording failed and did not run: issue the ops again */
    if (rc) return rc;
    break;
  }
  if (replay && (rc = bk_graph_end(m->be, err))) return rc;
  *lg_out = lg;
  *hid_out = bk_rows(&xr, R, P);
  return 0;
}

/* The hidden rows and whole logits rows that sequences asked for, to their dest. */
static int fetch_outputs(const model *m, const model_batch *b, const bk_tensor *lg, const bk_tensor *hid, herr *err) {
  size_t D = (size_t)m->cfg.hidden_size, V = (size_t)m->cfg.vocab_size;
  int64_t r = 0, p = 0, q = 0;
  int rc = 0;
  for (int s = 0; s < b->n_seqs && !rc; s++) {
    const model_seq *sq = &b->seqs[s];
    if (sq->next_hidden) {
      rc = bk_get(&m->f.nh, (size_t)q * D * sizeof(float), sq->next_hidden, (size_t)sq->n_tokens * D * sizeof(float), err);
      q += sq->n_tokens;
      if (rc) break;
    }
    if (sq->out == MODEL_OUT_HIDDEN) rc = bk_get(hid, (size_t)p++ * D * sizeof(float), sq->dest, D * sizeof(float), err);
    else if (sq->out == MODEL_OUT_HIDDEN_ALL) {
      rc = bk_get(hid, (size_t)p * D * sizeof(float), sq->dest, (size_t)sq->n_tokens * D * sizeof(float), err);
      p += sq->n_tokens;
    }
    else if (sq->out == MODEL_OUT_LOGITS_HOST) rc = bk_get(lg, (size_t)r * V * sizeof(float), sq->dest, V * sizeof(float), err);
    if (has_logits_row(sq)) r += sq->all_logits ? sq->n_tokens : 1;
  }
  return rc;
}

static void forward_commit(const model_batch *b) {
  for (int s = 0; s < b->n_seqs; s++)
    if (!b->seqs[s].canvas) b->seqs[s].kv->ops->commit(b->seqs[s].kv, b->seqs[s].n_tokens);
}

int model_forward(model *m, const model_batch *b, float *logits_out, herr *err) {
  bk_tensor lg, hid;
  pthread_mutex_lock(&m->lock);
  int rc = m->tp ? tp_forward(m, b, &lg, &hid, err) : model_forward_rank(m, b, &lg, &hid, FWD_ALL, err);
  if (!rc && lg.rows > 0) rc = bk_get(&lg, 0, logits_out, bk_nbytes(&lg), err);
  if (!rc) rc = fetch_outputs(m, b, &lg, &hid, err);
  pthread_mutex_unlock(&m->lock);
  if (!rc) forward_commit(b);
  return rc;
}

int model_forward_sample(model *m, const model_batch *b, const bk_sample_row *rows, const bk_sample_adj *adj,
                         int64_t n_adj, bk_sample_out *out, herr *err) {
  bk_tensor lg, hid;
  pthread_mutex_lock(&m->lock);
  int rc = m->tp ? tp_forward(m, b, &lg, &hid, err) : model_forward_rank(m, b, &lg, &hid, FWD_ALL, err);
  if (!rc) rc = fetch_outputs(m, b, &lg, &hid, err); /* before sampling adjusts the rows */
  if (!rc && lg.rows > 0) rc = bk_sample(&lg, rows, adj, n_adj, out, err);
  pthread_mutex_unlock(&m->lock);
  if (!rc) forward_commit(b);
  return rc;
}
