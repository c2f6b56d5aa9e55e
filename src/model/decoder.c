/* decoder.c — loading and running the llama-shaped decoder that every
 * supported family is (see family.h for the switches): weights from
 * safetensors or GGUF checked against the config and handed to the
 * backend in their stored format (f32, f16, bf16, GGUF and MLX quantized);
 * norms and biases as f32 tensors. The batched forward pass is built from
 * backend ops only (backend.h), on whichever device the model was loaded
 * for; each sequence's KV rows are written and read through its block
 * table (kv.h). Per step, one upload of the index tables and one download
 * of the requested logits (and of the final hidden states embedding
 * sequences ask for) cross between host and device. Knows nothing of
 * sampling, tokenizers or how the cache manages its blocks. */
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
#include "format/safetensors.h"
#include "format/gguf.h"
#include "model/family.h"
#include "model/gguf_model.h"
#include "model/model.h"
#include "model/rope.h"

typedef struct layer_weights {
  /* matrices, loaded into the backend (bk_weight_load) */
  bk_weight q, k, v, o, gate, up, down;
  /* vectors: f32 [1, n] tensors in buffers of model.bufs; .buf NULL = absent */
  bk_tensor attn_norm, q_bias, k_bias, v_bias, o_bias, q_norm, k_norm;
  bk_tensor post_attn_norm, pre_ffn_norm, post_ffn_norm;
  bk_tensor gate_bias, up_bias, down_bias;
  const rope_table *rope; /* NULL = this layer uses no RoPE */
  int64_t window;         /* 0 = full attention */
} layer_weights;

/* Activations of one forward, allocated once and grown to the largest batch seen. */
/* Steps of at most this many tokens are recorded and replayed (bk_graph_begin). */
#define FORWARD_GRAPH_MAX_T 8

typedef struct fwd_scratch {
  int64_t cap_t;          /* tokens the activation tensors hold */
  bk_buf *act;            /* owned: x, xn, q, k, v, att, o, gate, up */
  bk_tensor x, xn, q, k, v, att, o, gate, up;
  int64_t cap_idx;        /* int32 entries of idx */
  bk_buf *idx_buf;        /* owned */
  bk_tensor idx;          /* I32: the step's index tables (see forward) */
  int32_t *host_idx;      /* owned: their host staging, cap_idx entries */
  int64_t cap_r;          /* logits rows */
  bk_buf *logit_buf;      /* owned */
  bk_tensor logits;
} fwd_scratch;

struct model {
  model_config cfg;
  const model_family *fam;
  bk_backend *be;         /* owned: where weights, activations and the forward live */
  float **owned;          /* owned: host copies of misaligned matrices */
  int n_owned, cap_owned;
  bk_buf **bufs;          /* owned: the backend buffers of every f32 vector */
  int n_bufs, cap_bufs;
  st_set st;              /* owned when st_opened: the safetensors mapping the matrices point into */
  bool st_opened;
  gguf_file *gg;          /* owned, or NULL: the GGUF mapping the matrices point into */
  bk_weight embed, lm_head; /* lm_head shares embed's loaded weight when tied */
  bool tied;
  bool no_head;           /* a bare decoder's folder (no lm_head.weight, not tied): hidden states only */
  bk_tensor final_norm;
  layer_weights *layers;  /* owned, num_hidden_layers */
  rope_table rope_global, rope_local;
  float embed_scale;      /* 0 = none */
  float attn_scale;
  bool as_bf16;           /* f32 weights rounded to bf16 as loaded (model_load_opts.f32_as_bf16) */
  fwd_scratch f;
};

const model_config *model_cfg(const model *m) { return &m->cfg; }
bool model_has_head(const model *m) { return !m->no_head; }
int64_t model_vocab_size(const model *m) { return m->cfg.vocab_size; }

void model_kv_geometry_of(const model *m, model_kv_geometry *g) {
  memset(g, 0, sizeof *g);
  g->n_layers = (int)m->cfg.num_hidden_layers;
  for (int l = 0; l < g->n_layers; l++) {
    g->kv_dim[l] = m->cfg.num_key_value_heads * m->cfg.head_dim;
    g->window[l] = m->layers[l].window;
  }
  g->backend = m->be;
}

bk_backend *model_backend(const model *m) { return m->be; }

static size_t weight_bytes(const bk_weight *w) {
  size_t b = (size_t)w->rows * bk_row_bytes(w->type, w->cols, w->bits);
  if (w->type == BK_MLX_AFFINE) b += 2 * (size_t)(w->rows * (w->cols / w->group_size)) * (w->scale_type == BK_F32 ? 4 : 2);
  return b;
}

size_t model_weight_bytes(const model *m) {
  size_t total = weight_bytes(&m->embed) + (m->tied ? 0 : weight_bytes(&m->lm_head));
  for (int l = 0; m->layers && l < m->cfg.num_hidden_layers; l++) {
    const layer_weights *lw = &m->layers[l];
    const bk_weight *mats[] = {&lw->q, &lw->k, &lw->v, &lw->o, &lw->gate, &lw->up, &lw->down};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) total += weight_bytes(mats[i]);
  }
  for (int i = 0; i < m->n_bufs; i++) total += m->bufs[i]->size;
  return total;
}

static void scratch_free(fwd_scratch *f) {
  bk_buf_free(f->act);
  bk_buf_free(f->idx_buf);
  bk_buf_free(f->logit_buf);
  free(f->host_idx);
  memset(f, 0, sizeof *f);
}

void model_free(model *m) {
  if (!m) return;
  if (m->be) {
    for (int l = 0; m->layers && l < m->cfg.num_hidden_layers; l++) {
      layer_weights *lw = &m->layers[l];
      bk_weight *mats[] = {&lw->q, &lw->k, &lw->v, &lw->o, &lw->gate, &lw->up, &lw->down};
      for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) bk_weight_release(m->be, mats[i]);
    }
    bk_weight_release(m->be, &m->embed);
    if (!m->tied && !m->no_head) bk_weight_release(m->be, &m->lm_head);
    for (int i = 0; i < m->n_bufs; i++) bk_buf_free(m->bufs[i]);
    scratch_free(&m->f);
  }
  free(m->bufs);
  for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
  free(m->owned);
  free(m->layers);
  rope_table_free(&m->rope_global);
  rope_table_free(&m->rope_local);
  if (m->st_opened) st_close(&m->st);
  gguf_close(m->gg);
  bk_backend_close(m->be);
  config_free(&m->cfg);
  free(m);
}

/* ---- loading ---- */

static void shape_str(char *buf, size_t n, const int64_t *shape, int ndim) {
  size_t o = 0;
  o += snprintf(buf + o, n - o, "[");
  for (int i = 0; i < ndim && o < n; i++) o += snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (o < n) snprintf(buf + o, n - o, "]");
}

/* Where weights come from: a safetensors set or a GGUF file. */
typedef struct weight_src {
  const st_set *st;      /* borrowed, or NULL */
  const gguf_file *gg;   /* borrowed, or NULL */
  const char *what;      /* the folder or file, for messages */
  const char *prefix;    /* what "model." is called in the file ("language_model.model." in gemma3 checkpoints) */
} weight_src;

/* The name a safetensors file uses for Hugging Face decoder tensor `name`. */
static const char *file_name(const weight_src *src, const char *name, char *buf, size_t n) {
  if (!src->prefix || strcmp(src->prefix, "model.") == 0 || strncmp(name, "model.", 6) != 0) return name;
  snprintf(buf, n, "%s%s", src->prefix, name + 6);
  return buf;
}

static int own_buffer(model *m, int64_t numel, const char *name, float **out, herr *err) {
  if (m->n_owned == m->cap_owned && !HGROW(m->owned, m->cap_owned, m->n_owned + 1))
    return herr_set(err, HEARTH_ENOMEM, "out of memory loading %s", name);
  float *buf = aligned_alloc(64, ((size_t)(numel ? numel : 1) * sizeof(float) + 63) / 64 * 64);
  if (!buf) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory for %lld floats", name, (long long)numel);
  m->owned[m->n_owned++] = buf;
  *out = buf;
  return 0;
}

/* Safetensors data sits wherever the header length puts it; kernels read
 * whole elements, so a misaligned tensor is copied into an aligned buffer. */
static int align_copy(model *m, const void **data, size_t nbytes, size_t align, const char *name, herr *err) {
  if ((uintptr_t)*data % align == 0) return 0;
  float *buf = NULL;
  int rc = own_buffer(m, (int64_t)((nbytes + 3) / 4), name, &buf, err);
  if (rc) return rc;
  memcpy(buf, *data, nbytes);
  *data = buf;
  return 0;
}

/* Loads tensor `name` (its Hugging Face name) as an f32 [1, numel] tensor
 * of the backend after checking its shape; out->buf NULL when absent and
 * !required. */
static int load_tensor(model *m, const weight_src *src, const char *name, int ndim, int64_t d0, int64_t d1, bool required,
                       bk_tensor *out, herr *err) {
  memset(out, 0, sizeof *out);
  char real[300];
  int64_t shape[4] = {0};
  int have_ndim = 0;
  const st_tensor *st = NULL;
  const gguf_tensor *gt = NULL;
  if (src->gg) {
    gt = gguf_model_find(src->gg, name);
    if (gt) {
      have_ndim = gt->ndim;
      for (int i = 0; i < gt->ndim; i++) shape[i] = gt->dims[gt->ndim - 1 - i]; /* ggml order is reversed */
    }
  } else {
    name = file_name(src, name, real, sizeof real);
    st = st_find(src->st, name);
    if (st) {
      have_ndim = st->ndim > 4 ? 4 : st->ndim;
      for (int i = 0; i < have_ndim; i++) shape[i] = st->shape[i];
    }
  }
  if (!st && !gt) {
    if (!required) return 0;
    return herr_set(err, HEARTH_ENOTFOUND, "%s: tensor '%s' is missing from the weights (model_type %s)", src->what, name,
                    m->cfg.model_type);
  }
  int64_t want[2] = {d0, d1};
  bool ok = have_ndim == ndim && (!st || st->ndim == ndim);
  for (int i = 0; ok && i < ndim; i++) ok = shape[i] == want[i];
  if (!ok) {
    char ws[64], hs[160];
    shape_str(ws, sizeof ws, want, ndim);
    shape_str(hs, sizeof hs, st ? st->shape : shape, st ? st->ndim : have_ndim);
    return herr_set(err, HEARTH_EFORMAT, "%s: expected shape %s, file has %s", name, ws, hs);
  }
  if (st && st->dtype != ST_F32 && st->dtype != ST_F16 && st->dtype != ST_BF16)
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s: dtype %s is not supported (F32, F16, BF16)", name, st_dtype_name(st->dtype));
  int64_t numel = st ? st->numel : gt->nelements;
  float *buf = malloc((size_t)(numel ? numel : 1) * sizeof(float));
  if (!buf) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory for %lld floats", name, (long long)numel);
  int rc;
  if (st) rc = st_to_f32(st, buf, err);
  else {
    bool is_k = strstr(name, "k_proj.weight") != NULL;
    rc = gguf_model_read_f32(src->gg, gt, name, is_k ? m->cfg.num_key_value_heads : m->cfg.num_attention_heads, buf, err);
  }
  if (rc) {
    free(buf);
    return herr_wrap(err, "%s", name);
  }
  if (m->as_bf16 && st && st->dtype == ST_F32)
    for (int64_t i = 0; i < numel; i++) buf[i] = bk_round_bf16(buf[i]);
  if (m->n_bufs == m->cap_bufs && !HGROW(m->bufs, m->cap_bufs, m->n_bufs + 1)) {
    free(buf);
    return herr_set(err, HEARTH_ENOMEM, "out of memory loading %s", name);
  }
  if (!(rc = bk_tensor_new(m->be, BK_DT_F32, 1, numel, out, err))) {
    m->bufs[m->n_bufs++] = out->buf;
    rc = bk_set(out, 0, buf, (size_t)numel * sizeof(float), err);
  }
  free(buf);
  return rc ? herr_wrap(err, "%s", name) : 0;
}

static const char *st_shape_of(const st_tensor *t, char *buf, size_t n) {
  shape_str(buf, n, t->shape, t->ndim);
  return buf;
}


/* An MLX affine-quantized matrix NAME (= BASE.weight with BASE.scales and
 * BASE.biases beside it): packed uint32 words, one scale and bias per group. */
static int load_mlx_matrix(model *m, const weight_src *src, const char *name, const st_tensor *t, int64_t rows, int64_t cols,
                           bk_weight *out, herr *err) {
  const model_config *c = &m->cfg;
  char base[256], sn[280], bn[280], a[96], b[96];
  snprintf(base, sizeof base, "%.*s", (int)(strlen(name) - strlen(".weight")), name);
  snprintf(sn, sizeof sn, "%s.scales", base);
  snprintf(bn, sizeof bn, "%s.biases", base);
  const st_tensor *sc = st_find(src->st, sn), *bi = st_find(src->st, bn);
  if (!sc || !bi) return herr_set(err, HEARTH_ENOTFOUND, "%s: tensor '%s' is missing from the weights", src->what, sc ? bn : sn);
  int bits = c->quant_bits, gs = c->quant_group_size;
  int64_t words = cols * bits / 32, groups = gs > 0 ? cols / gs : 0;
  if (t->dtype != ST_U32 || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != words || cols * bits % 32)
    return herr_set(err, HEARTH_EFORMAT, "%s: expected U32 shape [%lld, %lld] (%d-bit MLX quantization of %lld inputs), file has %s %s",
                    name, (long long)rows, (long long)words, bits, (long long)cols, st_dtype_name(t->dtype), st_shape_of(t, a, sizeof a));
  for (int i = 0; i < 2; i++) {
    const st_tensor *x = i ? bi : sc;
    if (x->ndim != 2 || x->shape[0] != rows || x->shape[1] != groups || x->dtype != sc->dtype)
      return herr_set(err, HEARTH_EFORMAT, "%s: expected shape [%lld, %lld] (%s), file has %s %s", x->name, (long long)rows,
                      (long long)groups, st_dtype_name(sc->dtype), st_dtype_name(x->dtype), st_shape_of(x, b, sizeof b));
  }
  bk_type st_type;
  if (!model_bk_type_of_st(sc->dtype, &st_type))
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s: scales of dtype %s are not supported (F32, F16, BF16)", sn, st_dtype_name(sc->dtype));
  *out = (bk_weight){.type = BK_MLX_AFFINE, .rows = rows, .cols = cols, .data = t->data, .bits = bits, .group_size = gs,
                     .scale_type = st_type, .scales = sc->data, .biases = bi->data};
  return 0;
}

/* Describes matrix `name` (Hugging Face name, shape [rows, cols]) as stored,
 * without copying it. out->data stays NULL when absent and !required. */
static int load_matrix(model *m, const weight_src *src, const char *name, int64_t rows, int64_t cols, bool required,
                       bk_weight *out, herr *err) {
  memset(out, 0, sizeof *out);
  char ws[64], hs[160];
  int64_t want[2] = {rows, cols};
  shape_str(ws, sizeof ws, want, 2);
  int rc;
  if (src->gg) {
    const gguf_tensor *t = gguf_model_find(src->gg, name);
    if (!t) return required ? herr_set(err, HEARTH_ENOTFOUND, "%s: tensor '%s' is missing from the weights", src->what, name) : 0;
    int64_t shape[GGUF_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) shape[i] = t->dims[t->ndim - 1 - i];
    if (t->ndim != 2 || shape[0] != rows || shape[1] != cols) {
      shape_str(hs, sizeof hs, shape, t->ndim);
      return herr_set(err, HEARTH_EFORMAT, "%s (%s): expected shape %s, file has %s", name, t->name, ws, hs);
    }
    bk_type bt;
    if (!model_bk_type_of_gguf(t->type, &bt))
      return herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor type %s is not supported (f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K)",
                      t->name, gguf_tensor_type_name(t->type));
    *out = (bk_weight){.type = bt, .rows = rows, .cols = cols, .data = t->data};
  } else {
    char real[300];
    name = file_name(src, name, real, sizeof real);
    const st_tensor *t = st_find(src->st, name);
    if (!t) return required ? herr_set(err, HEARTH_ENOTFOUND, "%s: tensor '%s' is missing from the weights (model_type %s)", src->what,
                                       name, m->cfg.model_type) : 0;
    if (m->cfg.quant_bits > 0 && t->dtype == ST_U32) {
      if ((rc = load_mlx_matrix(m, src, name, t, rows, cols, out, err))) return rc;
    } else {
      if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return herr_set(err, HEARTH_EFORMAT, "%s: expected shape %s, file has %s", name, ws, st_shape_of(t, hs, sizeof hs));
      bk_type bt;
      if (!model_bk_type_of_st(t->dtype, &bt))
        return herr_set(err, HEARTH_EUNSUPPORTED, "%s: dtype %s is not supported (F32, F16, BF16)", name, st_dtype_name(t->dtype));
      *out = (bk_weight){.type = bt, .rows = rows, .cols = cols, .data = t->data};
    }
  }
  if ((rc = bk_weight_validate(out, err))) return herr_wrap(err, "%s", name);
  if (!src->gg) {
    size_t row_bytes = bk_row_bytes(out->type, cols, out->bits), elem = out->type == BK_F32 || out->type == BK_MLX_AFFINE ? 4 : 2;
    if ((rc = align_copy(m, &out->data, row_bytes * (size_t)rows, elem, name, err))) return rc;
    if (out->type == BK_MLX_AFFINE) {
      size_t es = out->scale_type == BK_F32 ? 4 : 2, sb = (size_t)(rows * (cols / out->group_size)) * es;
      if ((rc = align_copy(m, &out->scales, sb, es, name, err)) || (rc = align_copy(m, &out->biases, sb, es, name, err))) return rc;
    }
  }
  return 0;
}

/* An f32 matrix rounded to bf16 (round to nearest even) in a host copy the
 * model owns; other types stay as they are. */
static int to_bf16(model *m, bk_weight *w, herr *err) {
  if (w->type != BK_F32) return 0;
  int64_t n = w->rows * w->cols;
  float *buf = NULL;
  int rc = own_buffer(m, (n + 1) / 2, "bf16 weights", &buf, err);
  if (rc) return rc;
  uint16_t *out = (uint16_t *)buf;
  const float *in = w->data;
  for (int64_t i = 0; i < n; i++) {
    float r = bk_round_bf16(in[i]);
    uint32_t u;
    memcpy(&u, &r, sizeof u);
    out[i] = (uint16_t)(u >> 16);
  }
  w->type = BK_BF16;
  w->data = out;
  return 0;
}

/* Rows [r0, r0 + n) of w as a matrix of its own (fused projections). */
static bk_weight sub_rows(const bk_weight *w, int64_t r0, int64_t n) {
  bk_weight s = *w;
  s.rows = n;
  s.data = (const char *)w->data + (size_t)r0 * bk_row_bytes(w->type, w->cols, w->bits);
  if (w->type == BK_MLX_AFFINE) {
    size_t es = w->scale_type == BK_F32 ? 4 : 2, per_row = (size_t)(w->cols / w->group_size) * es;
    s.scales = (const char *)w->scales + (size_t)r0 * per_row;
    s.biases = (const char *)w->biases + (size_t)r0 * per_row;
  }
  return s;
}

#define MAT(field, req, a, b, dst)                                                                   \
  do {                                                                                               \
    snprintf(name, sizeof name, "model.layers.%d.%s", l, field);                                     \
    if ((rc = load_matrix(m, src, name, a, b, req, dst, err))) return rc;                            \
  } while (0)

#define LOAD(field, req, nd, a, b, dst)                                                               \
  do {                                                                                                \
    snprintf(name, sizeof name, "model.layers.%d.%s", l, field);                                      \
    if ((rc = load_tensor(m, src, name, nd, a, b, req, dst, err))) return rc;                        \
  } while (0)

static int load_layer(model *m, const weight_src *src, int l, herr *err) {
  const model_config *c = &m->cfg;
  layer_weights *lw = &m->layers[l];
  char name[256];
  int rc;
  int64_t H = c->num_attention_heads, KV = c->num_key_value_heads, hd = c->head_dim, D = c->hidden_size,
          I = c->intermediate_size;
  LOAD("input_layernorm.weight", true, 1, D, 0, &lw->attn_norm);
  if (m->fam->fused_qkv) {
    bk_weight fused;
    MAT("self_attn.qkv_proj.weight", true, (H + 2 * KV) * hd, D, &fused);
    lw->q = sub_rows(&fused, 0, H * hd);
    lw->k = sub_rows(&fused, H * hd, KV * hd);
    lw->v = sub_rows(&fused, (H + KV) * hd, KV * hd);
    MAT("mlp.gate_up_proj.weight", true, 2 * I, D, &fused);
    lw->gate = sub_rows(&fused, 0, I);
    lw->up = sub_rows(&fused, I, I);
  } else {
    MAT("self_attn.q_proj.weight", true, H * hd, D, &lw->q);
    MAT("self_attn.k_proj.weight", true, KV * hd, D, &lw->k);
    MAT("self_attn.v_proj.weight", true, KV * hd, D, &lw->v);
    MAT("mlp.gate_proj.weight", true, I, D, &lw->gate);
    MAT("mlp.up_proj.weight", true, I, D, &lw->up);
  }
  MAT("self_attn.o_proj.weight", true, D, H * hd, &lw->o);
  MAT("mlp.down_proj.weight", true, D, I, &lw->down);
  if (c->attention_bias) {
    bool qkv_req = true, o_req = strcmp(c->model_type, "qwen2") != 0; /* qwen2: q/k/v biases only */
    LOAD("self_attn.q_proj.bias", qkv_req, 1, H * hd, 0, &lw->q_bias);
    LOAD("self_attn.k_proj.bias", qkv_req, 1, KV * hd, 0, &lw->k_bias);
    LOAD("self_attn.v_proj.bias", qkv_req, 1, KV * hd, 0, &lw->v_bias);
    LOAD("self_attn.o_proj.bias", o_req, 1, D, 0, &lw->o_bias);
  }
  if (c->mlp_bias && !m->fam->fused_qkv) {
    LOAD("mlp.gate_proj.bias", true, 1, I, 0, &lw->gate_bias);
    LOAD("mlp.up_proj.bias", true, 1, I, 0, &lw->up_bias);
    LOAD("mlp.down_proj.bias", true, 1, D, 0, &lw->down_bias);
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
  bool sliding = c->layer_types[l] == LAYER_SLIDING;
  lw->window = sliding ? c->sliding_window : 0;
  lw->rope = c->no_rope[l] ? NULL : (sliding ? &m->rope_local : &m->rope_global);
  return 0;
}
#undef LOAD
#undef MAT

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

int model_load(const char *dir, const model_load_opts *opts, model **out, herr *err) {
  *out = NULL;
  model *m = calloc(1, sizeof *m);
  if (!m) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  bool is_gguf = gguf_model_is_gguf(dir);
  m->as_bf16 = opts && opts->f32_as_bf16;
  bk_open_opts bo = {.threads = opts ? opts->threads : 0, .f32_activations = opts && opts->f32_activations,
                     .cuda_lib = opts ? opts->cuda_lib : NULL, .cpu_level = opts ? opts->cpu_level : NULL,
                     .no_graphs = opts && opts->no_graphs};
  int rc = bk_backend_open(opts && opts->device ? opts->device : "cpu", &bo, &m->be, err);
  if (rc) goto fail;
  /* a backend that computes from host memory reads the weights into it; others map the
   * file only to upload from it */
  int mode = (opts && opts->mmap) || !bk_backend_is_cpu(m->be) ? HMMAP_MAP : HMMAP_RESIDENT;
  rc = is_gguf ? gguf_open_mode(&m->gg, dir, mode, err) : config_load(&m->cfg, dir, err);
  if (rc) goto fail;
  if (is_gguf && (rc = gguf_model_config(m->gg, &m->cfg, err))) goto fail;
  if (!is_gguf && (rc = model_config_check(&m->cfg, dir, err))) goto fail; /* absurd values refused for every caller */
  const model_config *c = &m->cfg;
  m->fam = model_family_find(c->model_type);
  if (!m->fam) {
    rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: model_type '%s' has no forward pass (supported: %s)", dir, c->model_type,
                  config_supported_types());
    goto fail;
  }
  if (strcmp(c->hidden_act, "silu") && strcmp(c->hidden_act, "swish") && strcmp(c->hidden_act, "gelu_pytorch_tanh") &&
      strcmp(c->hidden_act, "gelu_new") && strcmp(c->hidden_act, "gelu_fast") && strcmp(c->hidden_act, "gelu") &&
      strcmp(c->hidden_act, "relu")) {
    rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: unknown activation '%s'", dir, c->hidden_act);
    goto fail;
  }
  double msc = raw_rope_num(c, "mscale"), msc_all = raw_rope_num(c, "mscale_all_dim");
  if ((rc = rope_table_init(&m->rope_global, &c->rope, c->head_dim, c->max_position_embeddings, msc, msc_all, err))) goto fail;
  if ((rc = rope_table_init(&m->rope_local, &c->rope_local, c->head_dim, c->max_position_embeddings, msc, msc_all, err))) goto fail;
  m->layers = calloc((size_t)c->num_hidden_layers, sizeof *m->layers);
  if (!m->layers) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto fail;
  }
  if (!is_gguf) {
    if ((rc = st_open_mode(&m->st, dir, mode, err))) goto fail;
    m->st_opened = true;
  }
  /* llama.cpp stores llama's q/k rows permuted for RoPE on adjacent pairs */
  m->rope_global.interleaved = m->rope_local.interleaved = is_gguf && !strcmp(c->model_type, "llama");
  weight_src src = {is_gguf ? NULL : &m->st, m->gg, dir, "model."};
  /* gemma3 multimodal checkpoints keep the language model under another prefix; a bare
   * decoder's (Qwen3Model, as Qwen3-Embedding is saved) has none */
  static const char *const prefixes[] = {"language_model.model.", "model.language_model.", ""};
  for (size_t i = 0; !is_gguf && !st_find(&m->st, "model.embed_tokens.weight") && i < sizeof prefixes / sizeof prefixes[0]; i++) {
    char probe[128];
    snprintf(probe, sizeof probe, "%sembed_tokens.weight", prefixes[i]);
    if (st_find(&m->st, probe)) src.prefix = prefixes[i];
  }
  if ((rc = load_matrix(m, &src, "model.embed_tokens.weight", c->vocab_size, c->hidden_size, true, &m->embed, err))) goto fail;
  for (int l = 0; l < c->num_hidden_layers; l++)
    if ((rc = load_layer(m, &src, l, err))) goto fail;
  if ((rc = load_tensor(m, &src, "model.norm.weight", 1, c->hidden_size, 0, true, &m->final_norm, err))) goto fail;
  m->tied = c->tie_word_embeddings;
  /* a bare decoder's folder (Qwen3Model, as Qwen3-Embedding is saved: names without "model.", or
   * architectures naming a *Model) may have no head; a causal LM's must */
  bool bare = (src.prefix && !src.prefix[0]) || bare_architecture(c);
  if (!m->tied && (rc = load_matrix(m, &src, "lm_head.weight", c->vocab_size, c->hidden_size, !bare, &m->lm_head, err))) goto fail;
  if (!m->tied && !m->lm_head.data) {
    /* a bare decoder (an embedding model saved from Qwen3Model): hidden states, no logits */
    m->no_head = true;
    HLOG_INFO("%s: no lm_head.weight: the model gives hidden states (embeddings) only", dir);
  }
  if (m->as_bf16) { /* asked for: f32 matrices stored as bf16 (vectors were rounded as they were read) */
    for (int l = 0; l < c->num_hidden_layers; l++) {
      layer_weights *lw = &m->layers[l];
      bk_weight *mats[] = {&lw->q, &lw->k, &lw->v, &lw->o, &lw->gate, &lw->up, &lw->down};
      for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
        if ((rc = to_bf16(m, mats[i], err))) goto fail;
    }
    if ((rc = to_bf16(m, &m->embed, err)) || (!m->tied && !m->no_head && (rc = to_bf16(m, &m->lm_head, err)))) goto fail;
  }
  /* a device that cannot hold the weights refuses the model before any matrix is uploaded */
  size_t fr = 0, tot = 0, need = model_weight_bytes(m);
  if (!bk_backend_is_cpu(m->be) && bk_mem_info(m->be, &fr, &tot) == 0 && need + ((size_t)256 << 20) > fr) {
    rc = herr_set(err, HEARTH_ENOMEM, "%s: the weights need %.2f GiB of memory on %s, which has %.2f GiB free of %.2f GiB", dir,
                  (double)need / (1 << 30), bk_backend_name(m->be), (double)fr / (1 << 30), (double)tot / (1 << 30));
    goto fail;
  }
  /* hand the matrices to the backend; resident file bytes are ours to give back */
  unsigned priv = mode == HMMAP_RESIDENT ? BK_USE_PRIVATE : 0;
  for (int l = 0; l < c->num_hidden_layers; l++) {
    layer_weights *lw = &m->layers[l];
    bk_weight *mats[] = {&lw->q, &lw->k, &lw->v, &lw->o, &lw->gate, &lw->up, &lw->down};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
      if ((rc = bk_weight_load(m->be, mats[i], BK_USE_MATMUL | priv, err))) goto fail;
  }
  if ((rc = bk_weight_load(m->be, &m->embed, BK_USE_EMBED | (m->tied ? BK_USE_MATMUL : 0) | priv, err))) goto fail;
  if (m->tied) m->lm_head = m->embed;
  else if (!m->no_head && (rc = bk_weight_load(m->be, &m->lm_head, BK_USE_MATMUL | priv, err))) goto fail;

  if (m->fam->scale_embeddings) {
    float s = sqrtf((float)c->hidden_size);
    if (!strcmp(c->torch_dtype, "bfloat16")) s = bk_round_bf16(s);
    else if (!strcmp(c->torch_dtype, "float16")) s = bk_round_f16(s);
    m->embed_scale = s;
  }
  double qs = m->fam->query_pre_attn_scalar && c->query_pre_attn_scalar > 0 ? c->query_pre_attn_scalar : (double)c->head_dim;
  m->attn_scale = (float)(1.0 / sqrt(qs));
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

static bk_act act_of(const char *act) {
  if (!strcmp(act, "silu") || !strcmp(act, "swish")) return BK_ACT_SILU;
  if (!strcmp(act, "gelu")) return BK_ACT_GELU;
  if (!strcmp(act, "relu")) return BK_ACT_RELU;
  return BK_ACT_GELU_TANH; /* gelu_pytorch_tanh, gelu_new, gelu_fast */
}

static const bk_tensor *opt(const bk_tensor *t) { return t->buf ? t : NULL; }

/* Grows the scratch to hold T tokens, n_idx index entries and R logits rows. */
static int scratch_reserve(model *m, int64_t T, int64_t n_idx, int64_t R, herr *err) {
  const model_config *c = &m->cfg;
  fwd_scratch *f = &m->f;
  int rc;
  if (T > f->cap_t) {
    int64_t cap = f->cap_t ? f->cap_t : 16;
    while (cap < T) cap *= 2;
    int64_t H = c->num_attention_heads, KV = c->num_key_value_heads, hd = c->head_dim, D = c->hidden_size,
            I = c->intermediate_size, wide = H * hd > D ? H * hd : D;
    int64_t cols[] = {D, D, H * hd, KV * hd, KV * hd, H * hd, wide, I, I};
    bk_tensor *ts[] = {&f->x, &f->xn, &f->q, &f->k, &f->v, &f->att, &f->o, &f->gate, &f->up};
    size_t total = 0;
    for (int i = 0; i < 9; i++) total += ((size_t)(cap * cols[i]) * sizeof(float) + 255) / 256 * 256;
    bk_buf *buf;
    if ((rc = bk_buf_new(m->be, total, &buf, err)))
      return herr_wrap(err, "model_forward: activations for %lld tokens", (long long)cap);
    bk_buf_free(f->act);
    f->act = buf;
    size_t off = 0;
    for (int i = 0; i < 9; i++) {
      *ts[i] = (bk_tensor){.buf = buf, .off = off, .dt = BK_DT_F32, .rows = cap, .cols = cols[i]};
      off += ((size_t)(cap * cols[i]) * sizeof(float) + 255) / 256 * 256;
    }
    f->cap_t = cap;
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

/* The step's views: activations of T tokens and the index tables. */
typedef struct step {
  int64_t T, R;
  bk_tensor x, xn, q, k, v, att, o, gate, up;
  bk_tensor ids, pos, row, tab, slot, gather, tables;
} step;

static void attention_layer(model *m, int l, const kv_store *kv, step *st) {
  const model_config *c = &m->cfg;
  const layer_weights *lw = &m->layers[l];
  int64_t T = st->T, H = c->num_attention_heads, KV = c->num_key_value_heads, hd = c->head_dim;
  float eps = (float)c->rms_norm_eps;
  bool uo = m->fam->unit_offset_norm;
  bk_rmsnorm(&st->xn, &st->x, &lw->attn_norm, eps, uo);
  bk_matmul_t(&st->q, &st->xn, &lw->q, opt(&lw->q_bias));
  bk_matmul_t(&st->k, &st->xn, &lw->k, opt(&lw->k_bias));
  bk_matmul_t(&st->v, &st->xn, &lw->v, opt(&lw->v_bias));
  if (lw->q_norm.buf) {
    bk_tensor qh = bk_reshape(&st->q, T * H, hd), kh = bk_reshape(&st->k, T * KV, hd);
    bk_rmsnorm(&qh, &qh, &lw->q_norm, eps, uo);
    bk_rmsnorm(&kh, &kh, &lw->k_norm, eps, uo);
  }
  if (lw->rope) {
    bk_rope(&st->q, H, hd, &st->pos, lw->rope);
    bk_rope(&st->k, KV, hd, &st->pos, lw->rope);
  }
  bk_kv_layer kl = {&kv->k[l], &kv->v[l], kv->block_rows};
  bk_kv_write(&kl, &st->k, &st->v, &st->slot);
  attn_params ap = {H, KV, hd, m->attn_scale, (float)c->attn_logit_softcapping, lw->window};
  bk_attn_index ix = {&st->row, &st->tab, &st->tables};
  bk_attention(&st->att, &st->q, &kl, &ix, &ap);
  bk_tensor o = bk_reshape(&st->o, T, c->hidden_size);
  bk_matmul_t(&o, &st->att, &lw->o, opt(&lw->o_bias));
  if (m->fam->sandwich_norms) bk_rmsnorm(&o, &o, &lw->post_attn_norm, eps, true);
  bk_add(&st->x, &st->x, &o);
}

static void mlp_layer(model *m, int l, step *st) {
  const model_config *c = &m->cfg;
  const layer_weights *lw = &m->layers[l];
  float eps = (float)c->rms_norm_eps;
  const bk_tensor *pre = m->fam->sandwich_norms ? &lw->pre_ffn_norm : &lw->post_attn_norm;
  bk_rmsnorm(&st->xn, &st->x, pre, eps, m->fam->unit_offset_norm);
  bk_matmul_t(&st->gate, &st->xn, &lw->gate, opt(&lw->gate_bias));
  bk_matmul_t(&st->up, &st->xn, &lw->up, opt(&lw->up_bias));
  bk_act_mul(&st->gate, &st->up, act_of(c->hidden_act));
  bk_tensor o = bk_reshape(&st->o, st->T, c->hidden_size);
  bk_matmul_t(&o, &st->gate, &lw->down, opt(&lw->down_bias));
  if (m->fam->sandwich_norms) bk_rmsnorm(&o, &o, &lw->post_ffn_norm, eps, true);
  bk_add(&st->x, &st->x, &o);
}

static bool has_logits_row(const model_seq *sq) { return sq->out == MODEL_OUT_LOGITS || sq->out == MODEL_OUT_LOGITS_HOST; }

/* The forward pass up to the logits rows (left on the backend in *lg) and
 * the final hidden states of MODEL_OUT_HIDDEN sequences (*hid, in batch
 * order); no sequence's length changes (forward_commit does that once they
 * are read). */
static int forward_logits(model *m, const model_batch *b, bk_tensor *lg_out, bk_tensor *hid_out, herr *err) {
  const model_config *c = &m->cfg;
  if (!b || b->n_seqs <= 0) return herr_set(err, HEARTH_EINVAL, "model_forward: empty batch");
  int64_t T = 0, R = 0, P = 0;
  for (int s = 0; s < b->n_seqs; s++) {
    const model_seq *sq = &b->seqs[s];
    if (!sq->kv || !sq->kv->ops || sq->n_tokens <= 0 || !sq->tokens)
      return herr_set(err, HEARTH_EINVAL, "model_forward: sequence %d has no cache or no tokens", s);
    for (int s2 = 0; s2 < s; s2++)
      if (b->seqs[s2].kv == sq->kv) return herr_set(err, HEARTH_EINVAL, "model_forward: sequences %d and %d share one cache", s2, s);
    for (int i = 0; i < sq->n_tokens; i++)
      if (sq->tokens[i] < 0 || sq->tokens[i] >= c->vocab_size)
        return herr_set(err, HEARTH_EINVAL, "model_forward: token id %d is outside the vocabulary (size %lld)", (int)sq->tokens[i],
                        (long long)c->vocab_size);
    if (sq->out < MODEL_OUT_LOGITS || sq->out > MODEL_OUT_LOGITS_HOST)
      return herr_set(err, HEARTH_EINVAL, "model_forward: sequence %d asks for output %d, which does not exist", s, (int)sq->out);
    if (sq->out != MODEL_OUT_LOGITS && sq->all_logits)
      return herr_set(err, HEARTH_EINVAL, "model_forward: sequence %d sets all_logits without a logits output", s);
    if ((sq->out == MODEL_OUT_HIDDEN || sq->out == MODEL_OUT_LOGITS_HOST) && !sq->dest)
      return herr_set(err, HEARTH_EINVAL, "model_forward: sequence %d has nowhere to write its output", s);
    T += sq->n_tokens;
    if (has_logits_row(sq)) R += sq->all_logits ? sq->n_tokens : 1;
    if (sq->out == MODEL_OUT_HIDDEN) P++;
  }
  if (R > 0 && m->no_head)
    return herr_set(err, HEARTH_EUNSUPPORTED,
                    "model_forward: this model has no output head (no lm_head.weight): it gives hidden states "
                    "(embeddings) only, not logits");
  for (int s = 0; s < b->n_seqs; s++) {
    int rc = b->seqs[s].kv->ops->reserve(b->seqs[s].kv, b->seqs[s].n_tokens, err);
    if (rc) return rc;
  }
  /* block tables after every reserve: one store for the whole batch */
  const kv_store *kv = NULL;
  int64_t n_tables = 0;
  for (int s = 0; s < b->n_seqs; s++) {
    const int32_t *blocks;
    int64_t nb;
    const kv_store *st = b->seqs[s].kv->ops->table(b->seqs[s].kv, &blocks, &nb);
    if (kv && st != kv) return herr_set(err, HEARTH_EINVAL, "model_forward: the sequences of one batch must share one KV pool");
    if (st->n_layers != c->num_hidden_layers || st->k[0].buf->be != m->be)
      return herr_set(err, HEARTH_EINVAL, "model_forward: sequence %d's KV cache was not made for this model", s);
    kv = st;
    n_tables += nb;
  }
  /* index tables, one I32 upload: ids, pos, row, tab, slot [T] each, gather [R + P] (the logits
   * rows, then the hidden rows), tables [n_tables] */
  int64_t n_idx = 5 * T + R + P + n_tables;
  int rc = scratch_reserve(m, T, n_idx, R, err);
  if (rc) return rc;
  int32_t *h = m->f.host_idx, *ids = h, *pos = h + T, *row = h + 2 * T, *tab = h + 3 * T, *slot = h + 4 * T,
          *gather = h + 5 * T, *tables = gather + R + P;
  int64_t t = 0, r = 0, p = 0, toff = 0, B = kv->block_rows;
  for (int s = 0; s < b->n_seqs; s++) {
    const model_seq *sq = &b->seqs[s];
    const int32_t *blocks;
    int64_t nb;
    sq->kv->ops->table(sq->kv, &blocks, &nb);
    memcpy(tables + toff, blocks, sizeof(int32_t) * (size_t)nb);
    for (int i = 0; i < sq->n_tokens; i++, t++) {
      int64_t rw = sq->kv->len + i;
      ids[t] = sq->tokens[i];
      row[t] = (int32_t)rw;
      pos[t] = (int32_t)(sq->positions ? sq->positions[i] : rw);
      tab[t] = (int32_t)toff;
      slot[t] = (int32_t)(blocks[rw / B] * B + rw % B);
      if (has_logits_row(sq) && (sq->all_logits || i == sq->n_tokens - 1)) gather[r++] = (int32_t)t;
      if (sq->out == MODEL_OUT_HIDDEN && i == sq->n_tokens - 1) gather[R + p++] = (int32_t)t;
    }
    toff += nb;
  }
  fwd_scratch *f = &m->f;
  step st = {.T = T, .R = R};
  st.x = bk_rows(&f->x, 0, T), st.xn = bk_rows(&f->xn, 0, T), st.q = bk_rows(&f->q, 0, T);
  st.k = bk_rows(&f->k, 0, T), st.v = bk_rows(&f->v, 0, T), st.att = bk_rows(&f->att, 0, T);
  st.o = bk_rows(&f->o, 0, T), st.gate = bk_rows(&f->gate, 0, T), st.up = bk_rows(&f->up, 0, T);
  bk_tensor *parts[] = {&st.ids, &st.pos, &st.row, &st.tab, &st.slot};
  for (int i = 0; i < 5; i++) *parts[i] = bk_rows(&f->idx, i * T, T);
  st.gather = bk_rows(&f->idx, 5 * T, R + P);
  st.tables = bk_rows(&f->idx, 5 * T + R + P, n_tables);
  if ((rc = bk_set(&f->idx, 0, h, sizeof(int32_t) * (size_t)n_idx, err))) return rc;

  /* Decode-sized steps are recorded once per shape and replayed (bk_graph_begin):
   * everything that varies between steps is in the index tables and the KV
   * blocks; the key holds what the ops' arguments depend on. */
  bool record = T <= FORWARD_GRAPH_MAX_T;
  bool replay = false;
  if (record) {
    uint64_t key = hmix64((uint64_t)T * 0x10001u + (uint64_t)R + ((uint64_t)P << 40));
    key = hmix64(key ^ (uint64_t)(uintptr_t)f->x.buf->base);
    key = hmix64(key ^ (uint64_t)(uintptr_t)f->idx.buf->base);
    key = hmix64(key ^ (uint64_t)(uintptr_t)(f->logits.buf ? f->logits.buf->base : NULL));
    for (int l = 0; l < kv->n_layers; l++)
      key = hmix64(key ^ (uint64_t)(uintptr_t)bk_addr(&kv->k[l]) ^ ((uint64_t)(uintptr_t)bk_addr(&kv->v[l]) << 1));
    replay = bk_graph_begin(m->be, key);
  }
  bk_tensor lg = bk_rows(&f->logits, 0, R);
  bk_tensor xr = bk_rows(&st.xn, 0, R + P); /* the gathered rows after the final norm */
  for (int pass = 0; pass < 2 && !replay; pass++) {
    bk_embed(&st.x, &m->embed, &st.ids, m->embed_scale);
    for (int l = 0; l < c->num_hidden_layers; l++) {
      attention_layer(m, l, kv, &st);
      mlp_layer(m, l, &st);
    }
    /* the rows that need logits or hidden states, then the final norm, and lm_head on the first R */
    if (R + P > 0) {
      bk_get_rows(&xr, &st.x, &st.gather);
      bk_rmsnorm(&xr, &xr, &m->final_norm, (float)c->rms_norm_eps, m->fam->unit_offset_norm);
    }
    if (R > 0) {
      bk_tensor xl = bk_rows(&xr, 0, R);
      bk_matmul_t(&lg, &xl, &m->lm_head, NULL);
      if (c->final_logit_softcapping > 0) bk_softcap(&lg, (float)c->final_logit_softcapping);
    }
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
  int64_t r = 0, p = 0;
  int rc = 0;
  for (int s = 0; s < b->n_seqs && !rc; s++) {
    const model_seq *sq = &b->seqs[s];
    if (sq->out == MODEL_OUT_HIDDEN) rc = bk_get(hid, (size_t)p++ * D * sizeof(float), sq->dest, D * sizeof(float), err);
    else if (sq->out == MODEL_OUT_LOGITS_HOST) rc = bk_get(lg, (size_t)r * V * sizeof(float), sq->dest, V * sizeof(float), err);
    if (has_logits_row(sq)) r += sq->all_logits ? sq->n_tokens : 1;
  }
  return rc;
}

static void forward_commit(const model_batch *b) {
  for (int s = 0; s < b->n_seqs; s++) b->seqs[s].kv->ops->commit(b->seqs[s].kv, b->seqs[s].n_tokens);
}

int model_forward(model *m, const model_batch *b, float *logits_out, herr *err) {
  bk_tensor lg, hid;
  int rc = forward_logits(m, b, &lg, &hid, err);
  if (!rc && lg.rows > 0) rc = bk_get(&lg, 0, logits_out, bk_nbytes(&lg), err);
  if (!rc) rc = fetch_outputs(m, b, &lg, &hid, err);
  if (!rc) forward_commit(b);
  return rc;
}

int model_forward_sample(model *m, const model_batch *b, const bk_sample_row *rows, const bk_sample_adj *adj,
                         int64_t n_adj, bk_sample_out *out, herr *err) {
  for (int s = 0; s < b->n_seqs; s++)
    if (b->seqs[s].all_logits)
      return herr_set(err, HEARTH_EINVAL, "model_forward_sample: sequence %d asks for every token's logits", s);
  bk_tensor lg, hid;
  int rc = forward_logits(m, b, &lg, &hid, err);
  if (!rc) rc = fetch_outputs(m, b, &lg, &hid, err); /* before sampling adjusts the rows */
  if (!rc && lg.rows > 0) rc = bk_sample(&lg, rows, adj, n_adj, out, err);
  if (!rc) forward_commit(b);
  return rc;
}
