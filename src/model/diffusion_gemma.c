/* diffusion_gemma.c — DiffusionGemma's text stack (transformers'
 * models/diffusion_gemma, DiffusionGemmaForBlockDiffusion): one set of
 * Gemma 4 layers (sliding / full attention with per-layer head sizes,
 * keys as values on full layers, the MoE branch beside the dense MLP on
 * every layer) run two ways.
 *
 * The encoder pass is a causal forward over the prompt and each finished
 * block: it fills the KV cache and gives no logits. The decoder pass (a
 * canvas pass, model_seq.canvas) runs the same layers over a canvas of
 * canvas_length tokens that attend to one another bidirectionally and to
 * the encoder's cache, without adding to it: decoder.c lets every canvas
 * query see up to the canvas's last row, and a sliding layer sees
 * canvas_length - 1 rows more than its window — the reference's sliding
 * cache keeps the window's last sliding_window - 1 rows and the canvas is
 * appended to them whole. Before the layers, the canvas's embeddings get
 * the self-conditioning signal: the previous step's probabilities times
 * the embedding matrix (× sqrt(hidden)), through a gated MLP with a
 * pre-norm, added, then an unscaled RMSNorm (no probabilities: the signal
 * is zero and only the norm remains). Encoder and decoder share every
 * weight but layer_scalar, which each keeps its own. The head is the tied
 * embedding with the final softcap.
 *
 * Weights: the decoder's names (model.decoder.layers.N..., model.decoder.
 * self_conditioning...) or, where a checkpoint keeps the tied copy under
 * the encoder, model.encoder.language_model.layers.N...; the vision tower
 * is not loaded (text prompts only). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/internal.h"

typedef struct dg_state {
  float *enc_scalar, *dec_scalar;  /* per layer: layer_scalar of the encoder's and the decoder's copy */
  bk_weight embed_t;               /* [hidden, vocab]: the embedding transposed, for the soft embeddings */
  bool embed_t_loaded;
  bk_weight sc_gate, sc_up, sc_down;
  bk_tensor sc_pre_norm;
} dg_state;

static int prepare(model *m, herr *err) {
  int rc = gemma4_prepare(m, err);
  if (rc) return rc;
  if (m->cfg.canvas_length <= 0) return herr_set(err, HEARTH_EFORMAT, "diffusion_gemma: canvas_length must be positive");
  if (m->tp_size > 1) /* the soft embeddings would need every rank's vocabulary rows */
    return herr_set(err, HEARTH_EUNSUPPORTED, "diffusion_gemma: tensor parallelism is not supported for block diffusion");
  m->window_extra = m->cfg.canvas_length - 1;
  if (m->cfg.intermediate_size > m->w_inter) m->w_inter = m->cfg.intermediate_size; /* the self-conditioning MLP */
  return 0;
}

static dg_state *state(model *m, herr *err) {
  if (!m->fam_state) {
    dg_state *s = calloc(1, sizeof *s);
    int64_t L = m->cfg.num_hidden_layers;
    if (s) {
      s->enc_scalar = calloc((size_t)L, sizeof(float));
      s->dec_scalar = calloc((size_t)L, sizeof(float));
    }
    if (!s || !s->enc_scalar || !s->dec_scalar) {
      if (s) free(s->enc_scalar), free(s->dec_scalar);
      free(s);
      herr_set(err, HEARTH_ENOMEM, "out of memory");
      return NULL;
    }
    m->fam_state = s;
  }
  return m->fam_state;
}

/* A scalar under its full name (no prefix translation); absent: 1. */
static int scalar(model *m, const weight_src *src, const char *name, float *out, herr *err) {
  weight_src raw = *src;
  raw.prefix = "model.";
  int rc = model_host_floats(m, &raw, name, 1, out, err);
  if (rc == HEARTH_ENOTFOUND) {
    *out = 1.0f;
    herr_clear(err);
    return 0;
  }
  if (!rc && !isfinite(*out)) rc = herr_set(err, HEARTH_EFORMAT, "%s: is not a finite number", name);
  return rc;
}

static int load_layer(model *m, const weight_src *src, int l, herr *err) {
  dg_state *s = state(m, err);
  if (!s) return err ? err->code : HEARTH_ENOMEM;
  int rc = gemma4_load_layer(m, src, l, err);
  char name[160];
  snprintf(name, sizeof name, "model.encoder.language_model.layers.%d.layer_scalar", l);
  if (!rc) rc = scalar(m, src, name, &s->enc_scalar[l], err);
  snprintf(name, sizeof name, "model.decoder.layers.%d.layer_scalar", l);
  if (!rc) rc = scalar(m, src, name, &s->dec_scalar[l], err);
  return rc;
}

/* The embedding matrix transposed, in its stored format (f32, f16, bf16). */
static int transpose_embed(model *m, dg_state *s, herr *err) {
  const bk_weight *e = &m->embed;
  size_t es = e->type == BK_F32 ? 4 : e->type == BK_F16 || e->type == BK_BF16 ? 2 : 0;
  if (!es || !e->data)
    return herr_set(err, HEARTH_EUNSUPPORTED, "diffusion_gemma: embeddings stored as %s (self-conditioning needs f32, f16 or bf16)",
                    bk_type_name(e->type));
  int64_t V = e->rows, D = e->cols;
  float *buf;
  int rc = model_own_floats(m, (V * D * (int64_t)es + 3) / 4, "the transposed embeddings", &buf, err);
  if (rc) return rc;
  const unsigned char *src = e->data;
  unsigned char *dst = (unsigned char *)buf;
  for (int64_t v = 0; v < V; v++)
    for (int64_t d = 0; d < D; d++) memcpy(dst + ((size_t)d * (size_t)V + (size_t)v) * es, src + ((size_t)v * (size_t)D + (size_t)d) * es, es);
  s->embed_t = (bk_weight){.type = e->type, .rows = D, .cols = V, .data = buf};
  if ((rc = bk_weight_load(m->be, &s->embed_t, BK_USE_MATMUL, err))) return rc;
  s->embed_t_loaded = true;
  return 0;
}

static int load_model(model *m, const weight_src *src, herr *err) {
  dg_state *s = state(m, err);
  if (!s) return err ? err->code : HEARTH_ENOMEM;
  const model_config *c = &m->cfg;
  int64_t D = c->hidden_size, I = c->intermediate_size;
  weight_src raw = *src;
  raw.prefix = "model.";
  int rc;
  if ((rc = model_matrix(m, &raw, "model.decoder.self_conditioning.gate_proj.weight", I, D, true, BK_USE_MATMUL, &s->sc_gate, err)) ||
      (rc = model_matrix(m, &raw, "model.decoder.self_conditioning.up_proj.weight", I, D, true, BK_USE_MATMUL, &s->sc_up, err)) ||
      (rc = model_matrix(m, &raw, "model.decoder.self_conditioning.down_proj.weight", D, I, true, BK_USE_MATMUL, &s->sc_down, err)) ||
      (rc = model_vector(m, &raw, "model.decoder.self_conditioning.pre_norm.weight", 1, D, 0, true, 1.0f, &s->sc_pre_norm, err)))
    return rc;
  return transpose_embed(m, s, err);
}

/* The canvas's input: norm(embeddings + mlp(pre_norm(probabilities · embeddings × scale))). */
static void embedded(model *m, step *st) {
  if (!st->canvas) return;
  dg_state *s = m->fam_state;
  const model_config *c = &m->cfg;
  int64_t T = st->T, D = c->hidden_size, I = c->intermediate_size;
  if (st->sc.buf) {
    bk_tensor soft = step_view(&st->x2, T, D), gate = step_view(&st->gate, T, I), up = step_view(&st->up, T, I);
    bk_matmul_t(&soft, &st->sc, &s->embed_t, NULL);
    if (m->embed_scale) bk_scale(&soft, m->embed_scale);
    layer_norm(m, &st->xn, &soft, &s->sc_pre_norm);
    bk_matmul_t(&gate, &st->xn, &s->sc_gate, NULL);
    bk_matmul_t(&up, &st->xn, &s->sc_up, NULL);
    bk_act_mul(&gate, &up, model_act(m));
    bk_matmul_t(&soft, &gate, &s->sc_down, NULL);
    bk_add(&st->x, &st->x, &soft);
  }
  layer_norm(m, &st->x, &st->x, NULL);
}

static void layer(model *m, int l, const kv_store *kv, step *st) {
  const model_config *c = &m->cfg;
  const layer_weights *lw = &m->layers[l];
  const dg_state *s = m->fam_state;
  int64_t T = st->T, D = c->hidden_size;
  layer_attention(m, l, kv, st); /* x += post_attn_norm(attention(input_norm(x))) */
  bk_tensor o = step_view(&st->o, T, D);
  gemma4_feed_forward(m, lw, st, &o, true); /* the MoE branch on every layer */
  float scale = st->canvas ? s->dec_scalar[l] : s->enc_scalar[l];
  if (scale != 1.0f) bk_scale(&st->x, scale);
}

static void free_state(model *m) {
  dg_state *s = m->fam_state;
  if (!s) return;
  if (s->embed_t_loaded && m->be) bk_weight_release(m->be, &s->embed_t);
  free(s->enc_scalar);
  free(s->dec_scalar);
  free(s);
  m->fam_state = NULL;
}

const family_ops diffusion_gemma_family_ops = {
    .prepare = prepare, .load_layer = load_layer, .load_model = load_model, .embedded = embedded, .layer = layer, .free = free_state};
