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
 * is not loaded (text prompts only).
 *
 * Owns canvas_length (the top of config.json, 256 by default), the
 * self-conditioning weights and the step's probabilities buffer (dg_state,
 * which begins with the Gemma 4 stack's gemma4_state). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gemma4.h"
#include "model/internal.h"

typedef struct dg_state {
  gemma4_state g4;                 /* first: gemma4.c's functions read fam_state as theirs */
  int64_t canvas;                  /* canvas_length */
  bk_buf *sc_buf;                  /* owned: canvas passes' self-conditioning probabilities, sc_cap rows of vocab */
  bk_tensor sc;
  int64_t sc_cap;
  float *enc_scalar, *dec_scalar;  /* per layer: layer_scalar of the encoder's and the decoder's copy */
  bk_weight embed_t;               /* [hidden, vocab]: the embedding transposed, for the soft embeddings */
  bool embed_t_loaded;
  bk_weight sc_gate, sc_up, sc_down;
  bk_tensor sc_pre_norm;
} dg_state;

/* The Gemma 4 stack's keys (gemma4_read_config) and canvas_length from the top of a diffusion_gemma
 * config.json (absent there: 256; a bare diffusion_gemma_text config states none, which prepare refuses). */
static int config(model *m, herr *err) {
  dg_state *s = calloc(1, sizeof *s);
  if (!s) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  m->fam_state = s;
  int64_t L = m->cfg.num_hidden_layers;
  s->enc_scalar = calloc((size_t)L, sizeof(float));
  s->dec_scalar = calloc((size_t)L, sizeof(float));
  if (!s->enc_scalar || !s->dec_scalar) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  int rc = gemma4_read_config(m, &s->g4, true, err);
  if (rc || !m->cfg.top) return rc;
  s->canvas = 256;
  return config_int_range(m->cfg.top, "canvas_length", false, 1, 1 << 16, &s->canvas, "config.json", err);
}

static int64_t canvas_length(const model *m) { return ((const dg_state *)m->fam_state)->canvas; }

static int prepare(model *m, herr *err) {
  int rc = gemma4_prepare(m, err);
  if (rc) return rc;
  dg_state *s = m->fam_state;
  if (s->canvas <= 0) return herr_set(err, HEARTH_EFORMAT, "diffusion_gemma: canvas_length must be positive");
  m->window_extra = s->canvas - 1;
  if (m->cfg.intermediate_size > m->w_inter) m->w_inter = m->cfg.intermediate_size; /* the self-conditioning MLP */
  return 0;
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
  dg_state *s = m->fam_state;
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
  dg_state *s = m->fam_state;
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

/* A canvas pass's self-conditioning probabilities on the backend, st->sc [T, vocab] (zero rows for the
 * sequences without; none when no sequence gives them), in s->sc grown as needed. */
static int inputs(model *m, const model_batch *b, step *st, herr *err) {
  dg_state *s = m->fam_state;
  bool any_sc = false;
  for (int i = 0; i < b->n_seqs; i++) any_sc |= b->seqs[i].self_cond != NULL;
  if (!st->canvas || !any_sc) return 0;
  int64_t T = st->T, V = m->cfg.vocab_size;
  int rc = 0;
  if (T > s->sc_cap) {
    bk_buf_free(s->sc_buf);
    s->sc_buf = NULL;
    s->sc_cap = 0;
    if ((rc = bk_tensor_new(m->be, BK_DT_F32, T, V, &s->sc, err))) return herr_wrap(err, "model_forward: self-conditioning");
    s->sc_buf = s->sc.buf;
    s->sc_cap = T;
  }
  size_t row = (size_t)V * sizeof(float), off = 0;
  float *zeros = NULL;
  for (int i = 0; i < b->n_seqs && !rc; i++) {
    const model_seq *sq = &b->seqs[i];
    size_t n = (size_t)sq->n_tokens * row;
    if (sq->self_cond) rc = bk_set(&s->sc, off, sq->self_cond, n, err);
    else {
      if (!zeros && !(zeros = calloc(1, n))) return herr_set(err, HEARTH_ENOMEM, "out of memory");
      rc = bk_set(&s->sc, off, zeros, n, err);
    }
    off += n;
  }
  free(zeros);
  st->sc = bk_rows(&s->sc, 0, T);
  return rc;
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
  const dg_state *s = m->fam_state;
  layer_attention(m, l, kv, st); /* x += post_attn_norm(attention(input_norm(x))) */
  gemma4_ffn(m, l, st);          /* the MLP and the experts beside it (every layer has them) */
  float scale = st->canvas ? s->dec_scalar[l] : s->enc_scalar[l];
  if (scale != 1.0f) bk_scale(&st->x, scale);
}

static void free_state(model *m) {
  dg_state *s = m->fam_state;
  if (!s) return;
  if (s->embed_t_loaded && m->be) bk_weight_release(m->be, &s->embed_t);
  bk_buf_free(s->sc_buf);
  gemma4_state_free(&s->g4);
  free(s->enc_scalar);
  free(s->dec_scalar);
  free(s);
  m->fam_state = NULL;
}

const family_ops diffusion_gemma_family_ops = {.config = config, .prepare = prepare, .load_layer = load_layer,
                                               .load_model = load_model, .inputs = inputs, .embedded = embedded, .layer = layer,
                                               .canvas = canvas_length, .free = free_state};
