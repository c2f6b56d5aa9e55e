/* gemma4_audio.c — Gemma-4's audio tower (transformers' models/gemma4,
 * Gemma4AudioModel, a USM-style conformer) and its embedder into the text
 * model (Gemma4MultimodalEmbedder):
 *   log-mel features (mm_audio.c) → two Conv2d 3x3 stride-2 layers over
 *   (time, frequency), each LayerNorm over channels and ReLU, the frames
 *   past the clip zeroed before each (an im2col gather and one matrix
 *   product per layer) → Linear into the tower's width → layers of
 *     ½ feed-forward (clamp, RMSNorm, Linear, SiLU, Linear, clamp, RMSNorm, ×½, residual)
 *     attention: local (each frame sees the 11 before it), relative
 *       positions (sinusoids through relative_k_proj, bk_attention_rel),
 *       queries scaled per dimension by softplus(per_dim_scale), logits
 *       softcapped at 50; RMSNorms around it, residual
 *     light conv: RMSNorm, Linear to 2x, GLU, causal depthwise conv
 *       (bk_conv1d), RMSNorm, SiLU, Linear, residual
 *     ½ feed-forward, clamp, RMSNorm
 *   → output_proj → the embedder's RMSNorm (no scale) and projection.
 * Every Linear of the tower may clip its input and output to ranges the
 * checkpoint stores (use_clipped_linears). The frames of the padding are
 * computed and dropped: the valid ones never see them (attention masks
 * them as keys, the convolutions are causal). The attention's window is
 * transformers' boolean mask (sdpa, its default); under eager transformers
 * 5.17 applies the additive mask through logical_not, inverted. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/vec.h"
#include "model/internal.h"
#include "model/mm.h"
#include "model/mm_audio.h"

/* A Linear of the tower with optional clipping of its input and output. */
typedef struct ga_lin {
  bk_weight w;
  float in_lo, in_hi, out_lo, out_hi;
  bool clip_in, clip_out;
} ga_lin;

typedef struct ga_ffn {
  ga_lin l1, l2;
  bk_tensor pre, post;
} ga_ffn;

typedef struct ga_layer {
  ga_ffn ff1, ff2;
  ga_lin q, k, v, post, start, end;
  bk_weight rel;             /* relative_k_proj [H, H] */
  bk_tensor qscale;          /* [1, hd]: head_dim^-0.5 / ln 2 · softplus(per_dim_scale) */
  bk_tensor conv_w;          /* [H, kernel] */
  bk_tensor n_pre_attn, n_post_attn, n_out, lc_pre, lc_conv;
} ga_layer;

typedef struct ga_state {
  int64_t H, L, heads, hd, ch0, ch1, kernel, left, right, outd, text_hidden, mel, w1, w2;
  double eps, gclip, resw, cap;
  bk_act act;
  bk_weight conv0, conv1, in_proj;  /* [ch0, 9], [ch1, 9 * ch0] (tap-major), [H, w2 * ch1] */
  bk_tensor n0, n1;                 /* LayerNorm weights [1, ch0], [1, ch1] */
  bk_tensor sinus;                  /* [left + right + 1, H]: the relative positions' sinusoids by distance */
  ga_layer *lay;                    /* owned */
  bk_weight out_proj, embed_proj;
  bk_tensor out_b;
  int32_t audio_id, boa_id, eoa_id;
  gemma4_audio_prep prep;
} ga_state;

static int64_t jint(const json_t *o, const char *key, int64_t def) {
  const json_t *v = json_object_get(o, key);
  return v && json_is_integer(v) ? json_integer_value(v) : def;
}
static double jnum(const json_t *o, const char *key, double def) {
  const json_t *v = json_object_get(o, key);
  return v && json_is_number(v) ? json_number_value(v) : def;
}

static bool ga_match(const json_t *root) {
  const json_t *mt = json_object_get(root, "model_type"), *ac = json_object_get(root, "audio_config");
  return json_is_object(ac) && json_is_string(mt) && !strcmp(json_string_value(mt), "gemma4");
}

static void ga_free(model *m, void *state) {
  (void)m;
  ga_state *s = state;
  if (!s) return;
  free(s->lay);
  free(s);
}

static int ga_scalar(model *m, const weight_src *src, const char *name, float *out, bool *found, herr *err) {
  char probe[300];
  snprintf(probe, sizeof probe, "%s", name);
  if (!src->st || !st_find(src->st, probe)) {
    *found = false;
    return 0;
  }
  *found = true;
  return model_host_floats(m, src, name, 1, out, err);
}

static int ga_linear(model *m, const weight_src *src, const char *base, int64_t rows, int64_t cols, ga_lin *l, herr *err) {
  char name[300];
  memset(l, 0, sizeof *l);
  snprintf(name, sizeof name, "%s.linear.weight", base);
  int rc = model_matrix(m, src, name, rows, cols, true, BK_USE_MATMUL, &l->w, err);
  if (rc) return rc;
  float lo = -INFINITY, hi = INFINITY;
  bool f1, f2;
  snprintf(name, sizeof name, "%s.input_min", base);
  if ((rc = ga_scalar(m, src, name, &lo, &f1, err))) return rc;
  snprintf(name, sizeof name, "%s.input_max", base);
  if ((rc = ga_scalar(m, src, name, &hi, &f2, err))) return rc;
  l->in_lo = f1 ? lo : -INFINITY, l->in_hi = f2 ? hi : INFINITY;
  l->clip_in = isfinite(l->in_lo) || isfinite(l->in_hi);
  lo = -INFINITY, hi = INFINITY;
  snprintf(name, sizeof name, "%s.output_min", base);
  if ((rc = ga_scalar(m, src, name, &lo, &f1, err))) return rc;
  snprintf(name, sizeof name, "%s.output_max", base);
  if ((rc = ga_scalar(m, src, name, &hi, &f2, err))) return rc;
  l->out_lo = f1 ? lo : -INFINITY, l->out_hi = f2 ? hi : INFINITY;
  l->clip_out = isfinite(l->out_lo) || isfinite(l->out_hi);
  return 0;
}

/* A 4-D convolution kernel [o, i, 3, 3] as a matrix over im2col rows laid out tap-major, channel-minor:
 * [o, 9 * i] with column tap * i + channel. */
static int ga_conv(model *m, const weight_src *src, const char *name, int64_t o, int64_t i, bk_weight *w, herr *err) {
  float *raw = malloc(sizeof(float) * (size_t)(o * i * 9)), *mat;
  if (!raw) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  int rc = model_host_floats(m, src, name, o * i * 9, raw, err);
  if (!rc) rc = model_own_floats(m, o * i * 9, name, &mat, err);
  if (!rc) {
    for (int64_t a = 0; a < o; a++)
      for (int64_t c = 0; c < i; c++)
        for (int t = 0; t < 9; t++) mat[a * 9 * i + t * i + c] = raw[(a * i + c) * 9 + t];
    *w = (bk_weight){.type = BK_F32, .rows = o, .cols = 9 * i, .data = mat};
    rc = model_keep(m, w, BK_USE_MATMUL, err);
  }
  free(raw);
  return rc;
}

static int ga_load(model *m, const weight_src *src, const json_t *root, void **state, herr *err) {
  const json_t *ac = json_object_get(root, "audio_config");
  ga_state *s = calloc(1, sizeof *s);
  if (!s) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  int rc = 0;
  char base[256];
  s->H = jint(ac, "hidden_size", 1024), s->L = jint(ac, "num_hidden_layers", 12), s->heads = jint(ac, "num_attention_heads", 8);
  /* the mask lets frame i see frames i - (attention_context_left - 2) .. i (sliding_window_mask_function of
   * (left - 1, right): distances 0 <= d < left - 1) */
  s->kernel = jint(ac, "conv_kernel_size", 5), s->left = jint(ac, "attention_context_left", 13) - 2;
  s->right = jint(ac, "attention_context_right", 0), s->outd = jint(ac, "output_proj_dims", 1536);
  s->eps = jnum(ac, "rms_norm_eps", 1e-6), s->gclip = jnum(ac, "gradient_clipping", 1e10);
  s->resw = jnum(ac, "residual_weight", 0.5), s->cap = jnum(ac, "attention_logit_cap", 50.0);
  const json_t *ch = json_object_get(ac, "subsampling_conv_channels");
  s->ch0 = ch && json_array_size(ch) == 2 ? json_integer_value(json_array_get(ch, 0)) : 128;
  s->ch1 = ch && json_array_size(ch) == 2 ? json_integer_value(json_array_get(ch, 1)) : 32;
  const json_t *act = json_object_get(ac, "hidden_act");
  const char *an = json_is_string(act) ? json_string_value(act) : "silu";
  s->act = !strcmp(an, "gelu_pytorch_tanh") ? BK_ACT_GELU_TANH : !strcmp(an, "gelu") ? BK_ACT_GELU : BK_ACT_SILU;
  s->text_hidden = m->cfg.hidden_size;
  s->audio_id = (int32_t)jint(root, "audio_token_id", 258881), s->boa_id = (int32_t)jint(root, "boa_token_id", 256000);
  s->eoa_id = (int32_t)jint(root, "eoa_token_index", 258883);
  gemma4_audio_prep_default(&s->prep);
  if ((rc = gemma4_audio_prep_load(&s->prep, src->what, err))) goto fail;
  s->mel = s->prep.feature_size;
  s->w1 = (s->mel + 1) / 2, s->w2 = (s->w1 + 1) / 2;
  if (s->H <= 0 || s->heads <= 0 || s->H % s->heads || s->L <= 0 || s->L > 256 || s->ch0 <= 0 || s->ch1 <= 0 ||
      s->kernel <= 0 || s->left < 0 || s->right != 0 || s->outd <= 0) {
    rc = herr_set(err, HEARTH_EFORMAT,
                  "audio_config: hidden %lld in %lld heads, %lld layers, context left %lld / right %lld (only 0 is "
                  "supported), conv kernel %lld",
                  (long long)s->H, (long long)s->heads, (long long)s->L, (long long)s->left + 2, (long long)s->right,
                  (long long)s->kernel);
    goto fail;
  }
  s->hd = s->H / s->heads;
  const int64_t H = s->H;
  if ((rc = ga_conv(m, src, "model.audio_tower.subsample_conv_projection.layer0.conv.weight", s->ch0, 1, &s->conv0, err)) ||
      (rc = ga_conv(m, src, "model.audio_tower.subsample_conv_projection.layer1.conv.weight", s->ch1, s->ch0, &s->conv1, err)) ||
      (rc = model_vector(m, src, "model.audio_tower.subsample_conv_projection.layer0.norm.weight", 1, s->ch0, 0, true, 1.0f,
                         &s->n0, err)) ||
      (rc = model_vector(m, src, "model.audio_tower.subsample_conv_projection.layer1.norm.weight", 1, s->ch1, 0, true, 1.0f,
                         &s->n1, err)) ||
      (rc = model_matrix(m, src, "model.audio_tower.subsample_conv_projection.input_proj_linear.weight", H, s->w2 * s->ch1,
                         true, BK_USE_MATMUL, &s->in_proj, err)) ||
      (rc = model_matrix(m, src, "model.audio_tower.output_proj.weight", s->outd, H, true, BK_USE_MATMUL, &s->out_proj, err)) ||
      (rc = model_vector(m, src, "model.audio_tower.output_proj.bias", 1, s->outd, 0, true, 1.0f, &s->out_b, err)) ||
      (rc = model_matrix(m, src, "model.embed_audio.embedding_projection.weight", s->text_hidden, s->outd, true, BK_USE_MATMUL,
                         &s->embed_proj, err)))
    goto fail;
  if (!(s->lay = calloc((size_t)s->L, sizeof *s->lay))) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto fail;
  }
  float *qs = malloc(sizeof(float) * (size_t)s->hd);
  if (!qs) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto fail;
  }
  for (int64_t l = 0; l < s->L && !rc; l++) {
    ga_layer *y = &s->lay[l];
#define P(x) (snprintf(base, sizeof base, "model.audio_tower.layers.%lld.%s", (long long)l, x), base)
#define VEC(x, n, dst) (rc = rc ? rc : model_vector(m, src, P(x), 1, n, 0, true, 1.0f, dst, err))
#define LIN(x, r, c, dst) (rc = rc ? rc : ga_linear(m, src, P(x), r, c, dst, err))
    ga_ffn *ff[2] = {&y->ff1, &y->ff2};
    const char *fn[2] = {"feed_forward1", "feed_forward2"};
    for (int f = 0; f < 2; f++) {
      char t[96];
      snprintf(t, sizeof t, "%s.ffw_layer_1", fn[f]);
      LIN(t, 4 * H, H, &ff[f]->l1);
      snprintf(t, sizeof t, "%s.ffw_layer_2", fn[f]);
      LIN(t, H, 4 * H, &ff[f]->l2);
      snprintf(t, sizeof t, "%s.pre_layer_norm.weight", fn[f]);
      VEC(t, H, &ff[f]->pre);
      snprintf(t, sizeof t, "%s.post_layer_norm.weight", fn[f]);
      VEC(t, H, &ff[f]->post);
    }
    LIN("self_attn.q_proj", H, H, &y->q);
    LIN("self_attn.k_proj", H, H, &y->k);
    LIN("self_attn.v_proj", H, H, &y->v);
    LIN("self_attn.post", H, H, &y->post);
    if (!rc) rc = model_matrix(m, src, P("self_attn.relative_k_proj.weight"), H, H, true, BK_USE_MATMUL, &y->rel, err);
    if (!rc) rc = model_host_floats(m, src, P("self_attn.per_dim_scale"), s->hd, qs, err);
    if (!rc) {
      /* q · (head_dim^-0.5 / ln 2) · softplus(per_dim_scale), folded into one factor per dimension */
      double qscale = pow((double)s->hd, -0.5) / log(2.0);
      for (int64_t d = 0; d < s->hd; d++) {
        double sp = qs[d] > 20 ? qs[d] : log1p(exp((double)qs[d]));
        qs[d] = (float)(qscale * sp);
      }
      rc = bk_tensor_new(m->be, BK_DT_F32, 1, s->hd, &y->qscale, err);
      if (!rc) {
        if (m->n_bufs == m->cap_bufs && !HGROW(m->bufs, m->cap_bufs, m->n_bufs + 1)) {
          bk_tensor_free(&y->qscale);
          rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
        } else {
          m->bufs[m->n_bufs++] = y->qscale.buf;
          rc = bk_set(&y->qscale, 0, qs, sizeof(float) * (size_t)s->hd, err);
        }
      }
    }
    LIN("lconv1d.linear_start", 2 * H, H, &y->start);
    LIN("lconv1d.linear_end", H, H, &y->end);
    if (!rc) rc = model_vector(m, src, P("lconv1d.depthwise_conv1d.weight"), 3, H, s->kernel, true, 1.0f, &y->conv_w, err);
    if (!rc) y->conv_w = bk_reshape(&y->conv_w, H, s->kernel);
    VEC("lconv1d.pre_layer_norm.weight", H, &y->lc_pre);
    VEC("lconv1d.conv_norm.weight", H, &y->lc_conv);
    VEC("norm_pre_attn.weight", H, &y->n_pre_attn);
    VEC("norm_post_attn.weight", H, &y->n_post_attn);
    VEC("norm_out.weight", H, &y->n_out);
#undef P
#undef VEC
#undef LIN
  }
  free(qs);
  if (rc) goto fail;
  /* the relative positions' sinusoids, row d for distance d: [sin(d / timescale_i), cos(d / timescale_i)] */
  {
    int64_t span = s->left + s->right + 1, nt = H / 2;
    float *sn = malloc(sizeof(float) * (size_t)(span * H));
    if (!sn) {
      rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
      goto fail;
    }
    double inc = log(10000.0) / (double)(nt - 1 > 1 ? nt - 1 : 1);
    for (int64_t d = 0; d < span; d++)
      for (int64_t i = 0; i < nt; i++) {
        double it = (double)expf((float)i * (float)-inc); /* torch: float32 inv_timescales */
        sn[d * H + i] = (float)sin((double)d * it);
        sn[d * H + nt + i] = (float)cos((double)d * it);
      }
    rc = bk_tensor_new(m->be, BK_DT_F32, span, H, &s->sinus, err);
    if (!rc && m->n_bufs == m->cap_bufs && !HGROW(m->bufs, m->cap_bufs, m->n_bufs + 1)) {
      bk_tensor_free(&s->sinus);
      rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    } else if (!rc) {
      m->bufs[m->n_bufs++] = s->sinus.buf;
      rc = bk_set(&s->sinus, 0, sn, sizeof(float) * (size_t)(span * H), err);
      if (!rc) rc = bk_sync(m->be, err);
    }
    free(sn);
    if (rc) goto fail;
  }
  *state = s;
  return 0;
fail:
  ga_free(m, s);
  return rc;
}

static const char *ga_placeholder(const void *state, media_kind k) {
  (void)state, (void)k;
  return "<|audio|>";
}

typedef struct ga_priv {
  int64_t valid_frames;
} ga_priv;

static void ga_prep_free(mm_prep *p) {
  free(p->priv);
  p->priv = NULL;
}

static int ga_prepare(const void *state, const media *in, mm_prep *out, herr *err) {
  const ga_state *s = state;
  memset(out, 0, sizeof *out);
  if (in->kind != MEDIA_AUDIO)
    return herr_set(err, HEARTH_EINVAL, "the Gemma-4 audio tower takes audio only (medium kind %d)", (int)in->kind);
  float *f;
  uint8_t *mask;
  int64_t frames;
  int rc = gemma4_audio_features(&s->prep, in->audio.pcm, in->audio.n, &f, &mask, &frames, err);
  if (rc) return rc;
  int64_t valid = 0;
  while (valid < frames && mask[valid]) valid++;
  free(mask);
  int64_t n = gemma4_audio_num_tokens(&s->prep, in->audio.n);
  if (n <= 0) {
    free(f);
    return herr_set(err, HEARTH_EINVAL, "audio of %lld samples is too short for one soft token", (long long)in->audio.n);
  }
  ga_priv *pv = malloc(sizeof *pv);
  size_t cap = 32 + (size_t)n * 10;
  char *text = malloc(cap);
  if (!pv || !text) {
    free(f), free(pv), free(text);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  pv->valid_frames = valid;
  size_t len = (size_t)snprintf(text, cap, "<|audio>");
  for (int64_t i = 0; i < n; i++) len += (size_t)snprintf(text + len, cap - len, "<|audio|>");
  snprintf(text + len, cap - len, "<audio|>");
  out->kind = MEDIA_AUDIO;
  out->n_tokens = n;
  out->text = text;
  out->soft_id = s->audio_id;
  out->values = f;
  out->rows = frames;
  out->cols = s->mel;
  out->priv = pv;
  return 0;
}

typedef struct ga_bufs {
  bk_tensor t[40];
  int n;
} ga_bufs;

static bk_tensor *ga_new(ga_bufs *b, bk_backend *be, bk_dtype dt, int64_t rows, int64_t cols, int *rc, herr *err) {
  bk_tensor *t = &b->t[b->n];
  if (*rc) return t;
  if ((*rc = bk_tensor_new(be, dt, rows, cols, t, err)) == 0) b->n++;
  return t;
}

static void lin(const bk_tensor *y, const bk_tensor *x, const ga_lin *l, const bk_tensor *tmp) {
  const bk_tensor *in = x;
  if (l->clip_in) {
    bk_copy(tmp, 0, x, 0, bk_nbytes(x));
    bk_tensor t = bk_reshape(tmp, x->rows, x->cols);
    bk_clamp(&t, l->in_lo, l->in_hi);
    bk_matmul_t(y, &t, &l->w, NULL);
  } else
    bk_matmul_t(y, in, &l->w, NULL);
  if (l->clip_out) bk_clamp(y, l->out_lo, l->out_hi);
}

static int ga_encode(model *m, void *state, const mm_prep *p, mm_embeds *out, herr *err) {
  ga_state *s = state;
  memset(out, 0, sizeof *out);
  const ga_priv *pv = p->priv;
  const int64_t F = p->rows, H = s->H, C0 = s->ch0, C1 = s->ch1, W0 = s->mel, W1 = s->w1, W2 = s->w2;
  if (F <= 0 || p->cols != s->mel || !pv) return herr_set(err, HEARTH_EINVAL, "audio tower: %lld frames of %lld bins", (long long)F, (long long)p->cols);
  const int64_t F1 = (F + 1) / 2, F2 = (F1 + 1) / 2;
  /* the valid frames after each halving (a prefix: the mask keeps every second frame) */
  const int64_t v0 = pv->valid_frames, v1 = (v0 + 1) / 2, v2 = (v1 + 1) / 2;
  bk_backend *be = m->be;
  ga_bufs b = {0};
  int rc = 0;
  int32_t *g0 = malloc(sizeof(int32_t) * (size_t)(F1 * W1 * 9)), *g1 = malloc(sizeof(int32_t) * (size_t)(F2 * W2 * 9));
  float *hrows = NULL;
  if (!g0 || !g1) {
    rc = herr_set(err, HEARTH_ENOMEM, "audio tower: out of memory");
    goto done;
  }
  /* im2col gathers: input (2t + dt - 1, 2f + df - 1), the zero row past the end for the padding and for
   * frames past the clip */
  for (int64_t t = 0; t < F1; t++)
    for (int64_t f = 0; f < W1; f++)
      for (int dt = 0; dt < 3; dt++)
        for (int df = 0; df < 3; df++) {
          int64_t it = 2 * t + dt - 1, jf = 2 * f + df - 1;
          bool ok = it >= 0 && it < F && it < v0 && jf >= 0 && jf < W0;
          g0[(t * W1 + f) * 9 + dt * 3 + df] = (int32_t)(ok ? it * W0 + jf : F * W0);
        }
  for (int64_t t = 0; t < F2; t++)
    for (int64_t f = 0; f < W2; f++)
      for (int dt = 0; dt < 3; dt++)
        for (int df = 0; df < 3; df++) {
          int64_t it = 2 * t + dt - 1, jf = 2 * f + df - 1;
          bool ok = it >= 0 && it < F1 && it < v1 && jf >= 0 && jf < W1;
          g1[(t * W2 + f) * 9 + dt * 3 + df] = (int32_t)(ok ? it * W1 + jf : F1 * W1);
        }
  const int64_t T = F2, span = s->left + s->right + 1;
  bk_tensor *x0 = ga_new(&b, be, BK_DT_F32, F * W0 + 1, 1, &rc, err);
  bk_tensor *tg0 = ga_new(&b, be, BK_DT_I32, F1 * W1 * 9, 1, &rc, err);
  bk_tensor *c0 = ga_new(&b, be, BK_DT_F32, F1 * W1 * 9, 1, &rc, err);
  bk_tensor *y0 = ga_new(&b, be, BK_DT_F32, F1 * W1 + 1, C0, &rc, err);
  bk_tensor *tg1 = ga_new(&b, be, BK_DT_I32, F2 * W2 * 9, 1, &rc, err);
  bk_tensor *c1 = ga_new(&b, be, BK_DT_F32, F2 * W2 * 9, C0, &rc, err);
  bk_tensor *y1 = ga_new(&b, be, BK_DT_F32, F2 * W2, C1, &rc, err);
  bk_tensor *x = ga_new(&b, be, BK_DT_F32, T, H, &rc, err), *xn = ga_new(&b, be, BK_DT_F32, T, H, &rc, err);
  bk_tensor *res = ga_new(&b, be, BK_DT_F32, T, H, &rc, err), *tmp = ga_new(&b, be, BK_DT_F32, T, 4 * H, &rc, err);
  bk_tensor *big = ga_new(&b, be, BK_DT_F32, T, 4 * H, &rc, err);
  bk_tensor *q = ga_new(&b, be, BK_DT_F32, T, H, &rc, err), *k = ga_new(&b, be, BK_DT_F32, T, H, &rc, err);
  bk_tensor *v = ga_new(&b, be, BK_DT_F32, T, H, &rc, err), *att = ga_new(&b, be, BK_DT_F32, T, H, &rc, err);
  bk_tensor *relk = ga_new(&b, be, BK_DT_F32, span, H, &rc, err), *gate = ga_new(&b, be, BK_DT_F32, T, H, &rc, err);
  bk_tensor *cst = ga_new(&b, be, BK_DT_F32, 1, (s->kernel - 1) * H + 1, &rc, err);
  bk_tensor *seqs = ga_new(&b, be, BK_DT_I32, 1, 4, &rc, err);
  bk_tensor *po = ga_new(&b, be, BK_DT_F32, T, s->outd, &rc, err), *emb = ga_new(&b, be, BK_DT_F32, T, s->text_hidden, &rc, err);
  if (rc) goto done;
  {
    float zero = 0.0f, *zrow = calloc((size_t)C0, sizeof(float)); /* the zero row the gathers read past the clip */
    int32_t sq[4] = {0, (int32_t)T, 0, 1};
    if (!zrow) {
      rc = herr_set(err, HEARTH_ENOMEM, "audio tower: out of memory");
      goto done;
    }
    rc = bk_set(y0, sizeof(float) * (size_t)(F1 * W1 * C0), zrow, sizeof(float) * (size_t)C0, err);
    if (!rc) rc = bk_sync(be, err);
    free(zrow);
    if (rc) goto done;
    if ((rc = bk_set(x0, 0, p->values, sizeof(float) * (size_t)(F * W0), err)) ||
        (rc = bk_set(x0, sizeof(float) * (size_t)(F * W0), &zero, sizeof(float), err)) ||
        (rc = bk_set(tg0, 0, g0, sizeof(int32_t) * (size_t)(F1 * W1 * 9), err)) ||
        (rc = bk_set(tg1, 0, g1, sizeof(int32_t) * (size_t)(F2 * W2 * 9), err)) ||
        (rc = bk_set(seqs, 0, sq, sizeof sq, err)) || (rc = bk_sync(be, err)))
      goto done;
  }
  /* subsampling: layer 0 over the single-channel spectrogram, layer 1 over its channels */
  bk_get_rows(c0, x0, tg0);
  bk_tensor c0m = bk_reshape(c0, F1 * W1, 9), y0r = bk_rows(y0, 0, F1 * W1);
  bk_matmul_t(&y0r, &c0m, &s->conv0, NULL);
  bk_layernorm(&y0r, &y0r, &s->n0, NULL, (float)s->eps);
  bk_activate(&y0r, BK_ACT_RELU);
  bk_get_rows(c1, y0, tg1);
  bk_tensor c1m = bk_reshape(c1, F2 * W2, 9 * C0);
  bk_matmul_t(y1, &c1m, &s->conv1, NULL);
  bk_layernorm(y1, y1, &s->n1, NULL, (float)s->eps);
  bk_activate(y1, BK_ACT_RELU);
  bk_tensor y1m = bk_reshape(y1, F2, W2 * C1);
  bk_matmul_t(x, &y1m, &s->in_proj, NULL);
  const float gc = (float)(s->gclip < 3e38 ? s->gclip : 3e38);
  rel_attn_params rp = {.n_heads = s->heads, .head_dim = s->hd, .left = s->left, .right = s->right, .softcap = (float)s->cap};
  bk_recurrent rec = {.state = cst, .off = 0, .seqs = seqs};
  bk_tensor h4 = bk_reshape(big, T, 4 * H), h2 = step_view(big, T, 2 * H);
  for (int64_t l = 0; l < s->L; l++) {
    const ga_layer *y = &s->lay[l];
    for (int f = 0; f < 2; f++) {
      const ga_ffn *ff = f == 0 ? &y->ff1 : &y->ff2;
      if (f == 1) { /* the light convolution between the attention and the second feed-forward */
        bk_copy(res, 0, x, 0, bk_nbytes(x));
        bk_rmsnorm(xn, x, &y->lc_pre, (float)s->eps, false);
        lin(&h2, xn, &y->start, tmp);
        bk_get_cols(gate, &h2, H);
        bk_get_cols(att, &h2, 0);
        bk_sigmoid_mul(att, gate);
        bk_conv1d(xn, att, &y->conv_w, &rec, false);
        bk_clamp(xn, -gc, gc);
        bk_rmsnorm(xn, xn, &y->lc_conv, (float)s->eps, false);
        bk_activate(xn, s->act);
        lin(x, xn, &y->end, tmp);
        bk_add(x, x, res);
      }
      /* ½ feed-forward */
      bk_copy(res, 0, x, 0, bk_nbytes(x));
      bk_clamp(x, -gc, gc);
      bk_rmsnorm(xn, x, &ff->pre, 1e-6f, false);
      lin(&h4, xn, &ff->l1, tmp);
      bk_activate(&h4, s->act);
      lin(xn, &h4, &ff->l2, tmp);
      bk_clamp(xn, -gc, gc);
      bk_rmsnorm(xn, xn, &ff->post, 1e-6f, false);
      bk_scale(xn, (float)s->resw);
      bk_add(x, xn, res);
      if (f == 0) { /* attention */
        bk_copy(res, 0, x, 0, bk_nbytes(x));
        bk_clamp(x, -gc, gc);
        bk_rmsnorm(xn, x, &y->n_pre_attn, 1e-6f, false);
        lin(q, xn, &y->q, tmp);
        lin(k, xn, &y->k, tmp);
        lin(v, xn, &y->v, tmp);
        bk_scale(k, (float)(log(1.0 + M_E) / log(2.0)));
        bk_matmul_t(relk, &s->sinus, &y->rel, NULL);
        bk_attention_rel(att, q, k, v, relk, &y->qscale, v2, &rp);
        lin(xn, att, &y->post, tmp);
        bk_clamp(xn, -gc, gc);
        bk_rmsnorm(xn, xn, &y->n_post_attn, 1e-6f, false);
        bk_add(x, xn, res);
      }
    }
    bk_clamp(x, -gc, gc);
    bk_rmsnorm(x, x, &y->n_out, 1e-6f, false);
  }
  bk_matmul_t(po, x, &s->out_proj, &s->out_b);
  bk_rmsnorm(po, po, NULL, (float)s->eps, false);
  bk_matmul_t(emb, po, &s->embed_proj, NULL);
  if (!(hrows = malloc(sizeof(float) * (size_t)(v2 * s->text_hidden)))) {
    rc = herr_set(err, HEARTH_ENOMEM, "audio tower: out of memory");
    goto done;
  }
  if (v2 > 0 && (rc = bk_get(emb, 0, hrows, sizeof(float) * (size_t)(v2 * s->text_hidden), err))) goto done;
  if ((rc = bk_sync(be, err))) goto done;
  if (v2 != p->n_tokens) {
    rc = herr_set(err, HEARTH_EINTERNAL, "audio tower: %lld valid frames after subsampling, %lld soft tokens", (long long)v2,
                  (long long)p->n_tokens);
    goto done;
  }
  out->n_tokens = v2;
  out->dim = s->text_hidden;
  out->rows = hrows;
  hrows = NULL;
  out->pos_span = v2;
done:
  free(hrows);
  for (int i = 0; i < b.n; i++) bk_tensor_free(&b.t[i]);
  free(g0), free(g1);
  return rc;
}

const mm_tower_ops gemma4_audio_tower = {
    .name = "gemma4_audio",
    .config_key = "audio_config",
    .kinds = MEDIA_BIT(MEDIA_AUDIO),
    .match = ga_match,
    .load = ga_load,
    .placeholder = ga_placeholder,
    .video_opts = NULL,
    .prepare = ga_prepare,
    .prep_free = ga_prep_free,
    .encode = ga_encode,
    .free = ga_free,
};
