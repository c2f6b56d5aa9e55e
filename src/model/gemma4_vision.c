/* gemma4_vision.c — Gemma 4's vision tower (Gemma4VisionModel of transformers'
 * modeling_gemma4.py) and its image processor (image_processing_pil_gemma4.py),
 * on the mm.h contract.
 *
 * Preprocessing: the image is resized, aspect ratio kept, to the largest size
 * whose sides are multiples of pooling_kernel_size * patch_size and whose patches
 * fit max_soft_tokens * pooling_kernel_size^2 — with PIL's bicubic resampling,
 * bit for bit (Pillow's Resample.c: separable passes with fixed-point weights of
 * 22 fraction bits) —, rescaled by 1/255 (in double, stored as f32), cut into
 * patch_size^2 * 3 vectors (row, column, channel) in row-major patch order with
 * their (x, y) positions. Soft tokens: patches / pooling_kernel_size^2.
 *
 * Tower: 2 (p - 0.5) through the patch projection plus the x and y rows of the
 * learned position table; layers of RMSNorm (w), attention with q / k RMSNorm
 * and a scale-free v norm, a 2-D RoPE (the first half of each head turned by x,
 * the second by y, each half rotated over itself), attention scale 1, every patch
 * seeing every other; sandwich norms and a gated GELU MLP; linears clipped to
 * their stored input / output ranges when use_clipped_linears. Then the k x k
 * average pooling by position, times sqrt(hidden), standardization ((h - bias) *
 * scale) when configured, and the embedder: RMSNorm without scale and the
 * projection into the text model's width. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "base/vec.h"
#include "format/safetensors.h"
#include "model/internal.h"
#include "model/mm.h"
#include "model/mm_image.h"

typedef struct g4v_clip {
  float in_lo, in_hi, out_lo, out_hi;
} g4v_clip;

typedef struct g4v_lin {
  bk_weight w;
  g4v_clip c;
} g4v_lin;

typedef struct g4v_layer {
  g4v_lin q, k, v, o, gate, up, down;
  bk_tensor q_norm, k_norm, in_norm, post_attn_norm, pre_ffn_norm, post_ffn_norm;
} g4v_layer;

typedef struct g4v_state {
  int64_t D, inter, L, H, KVH, hd, P, K, npos, text_D;
  double eps, theta;
  bool clipped, standardize;
  bk_act act;
  bk_weight patch;              /* [D, 3 P P] */
  bk_weight pos_x, pos_y;       /* [npos, D] each */
  g4v_layer *layers;            /* owned: L */
  bk_weight std;                /* standardize as one matmul: diag(scale), bias -bias * scale */
  bk_tensor std_b;
  bk_weight proj;               /* embed_vision.embedding_projection [text_D, D] */
  rope_table rope;              /* owned: head_dim / 2 rotated over itself, one position per row */
  /* the processor */
  int64_t max_soft, proc_patch, proc_k;
  double rescale;
  bool do_resize, do_rescale, do_normalize;
  bool pil;                     /* the PIL processor (Gemma4ImageProcessorPil); else torchvision's (Gemma4ImageProcessor) */
  double mean[3], std_dev[3];
  int32_t image_id;
  char image_tok[64], boi_tok[64], eoi_tok[64];
} g4v_state;

/* ---- PIL's bicubic resampling (Pillow src/libImaging/Resample.c), exactly ---- */

#define PIL_PRECISION_BITS (32 - 8 - 2)

static double pil_bicubic(double x) {
  const double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

/* The fixed-point weights of out_size outputs over in_size inputs: bounds[2 i] the first input, bounds[2 i + 1]
 * how many; k[i * ksize + j] the weights. Returns ksize (0: out of memory). */
static int pil_coeffs(int in_size, int out_size, int **bounds_out, int32_t **k_out) {
  double scale = (double)((float)in_size - 0.0f) / out_size, filterscale = scale < 1.0 ? 1.0 : scale;
  double support = 2.0 * filterscale;
  int ksize = (int)ceil(support) * 2 + 1;
  double *kk = malloc(sizeof(double) * (size_t)out_size * ksize);
  int *bounds = malloc(sizeof(int) * (size_t)out_size * 2);
  int32_t *k = malloc(sizeof(int32_t) * (size_t)out_size * ksize);
  if (!kk || !bounds || !k) {
    free(kk), free(bounds), free(k);
    return 0;
  }
  for (int xx = 0; xx < out_size; xx++) {
    double center = 0.0 + (xx + 0.5) * scale, ww = 0.0, ss = 1.0 / filterscale;
    int xmin = (int)(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = (int)(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double *w = &kk[xx * ksize];
    int x = 0;
    for (; x < xmax; x++) {
      double v = pil_bicubic((x + xmin - center + 0.5) * ss);
      w[x] = v;
      ww += v;
    }
    for (x = 0; x < xmax; x++)
      if (ww != 0.0) w[x] /= ww;
    for (; x < ksize; x++) w[x] = 0;
    bounds[xx * 2] = xmin;
    bounds[xx * 2 + 1] = xmax;
  }
  for (int i = 0; i < out_size * ksize; i++)
    k[i] = kk[i] < 0 ? (int32_t)(-0.5 + kk[i] * (1 << PIL_PRECISION_BITS)) : (int32_t)(0.5 + kk[i] * (1 << PIL_PRECISION_BITS));
  free(kk);
  *bounds_out = bounds;
  *k_out = k;
  return ksize;
}

static inline uint8_t pil_clip8(int64_t in) {
  if (in >= ((int64_t)1 << PIL_PRECISION_BITS << 8)) return 255;
  if (in <= 0) return 0;
  return (uint8_t)(in >> PIL_PRECISION_BITS);
}

int mm_resize_pil(uint8_t *dst, int ow, int oh, const uint8_t *src, int iw, int ih, herr *err) {
  if (ow == iw && oh == ih) {
    memcpy(dst, src, (size_t)iw * ih * 3);
    return 0;
  }
  int *bh = NULL, *bv = NULL;
  int32_t *kh = NULL, *kv = NULL;
  int ksh = pil_coeffs(iw, ow, &bh, &kh), ksv = pil_coeffs(ih, oh, &bv, &kv);
  uint8_t *tmp = NULL;
  int rc = 0;
  if (!ksh || !ksv) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory resizing an image");
    goto done;
  }
  bool need_h = ow != iw, need_v = oh != ih;
  /* the rows the vertical pass reads */
  int y_first = bv[0], y_last = bv[oh * 2 - 2] + bv[oh * 2 - 1];
  const uint8_t *in = src;
  int in_h = ih;
  if (need_h) {
    int rows = need_v ? y_last - y_first : ih, off = need_v ? y_first : 0;
    if (need_v)
      for (int i = 0; i < oh; i++) bv[i * 2] -= y_first;
    tmp = malloc((size_t)ow * rows * 3);
    if (!tmp) {
      rc = herr_set(err, HEARTH_ENOMEM, "out of memory resizing an image");
      goto done;
    }
    for (int yy = 0; yy < rows; yy++) {
      const uint8_t *r = src + (size_t)(yy + off) * iw * 3;
      for (int xx = 0; xx < ow; xx++) {
        int xmin = bh[xx * 2], xmax = bh[xx * 2 + 1];
        const int32_t *k = &kh[xx * ksh];
        int64_t s0 = 1 << (PIL_PRECISION_BITS - 1), s1 = s0, s2 = s0;
        for (int x = 0; x < xmax; x++) {
          const uint8_t *px = r + (size_t)(x + xmin) * 3;
          s0 += (int64_t)px[0] * k[x], s1 += (int64_t)px[1] * k[x], s2 += (int64_t)px[2] * k[x];
        }
        uint8_t *o = (need_v ? tmp : dst) + ((size_t)yy * ow + xx) * 3;
        o[0] = pil_clip8((int32_t)s0), o[1] = pil_clip8((int32_t)s1), o[2] = pil_clip8((int32_t)s2);
      }
    }
    if (!need_v) goto done;
    in = tmp;
    in_h = rows;
  }
  (void)in_h;
  for (int yy = 0; yy < oh; yy++) {
    int ymin = bv[yy * 2], ymax = bv[yy * 2 + 1];
    const int32_t *k = &kv[yy * ksv];
    for (int xx = 0; xx < ow; xx++) {
      int64_t s0 = 1 << (PIL_PRECISION_BITS - 1), s1 = s0, s2 = s0;
      for (int y = 0; y < ymax; y++) {
        const uint8_t *px = in + ((size_t)(y + ymin) * ow + xx) * 3;
        s0 += (int64_t)px[0] * k[y], s1 += (int64_t)px[1] * k[y], s2 += (int64_t)px[2] * k[y];
      }
      uint8_t *o = dst + ((size_t)yy * ow + xx) * 3;
      o[0] = pil_clip8((int32_t)s0), o[1] = pil_clip8((int32_t)s1), o[2] = pil_clip8((int32_t)s2);
    }
  }
done:
  free(bh), free(bv), free(kh), free(kv), free(tmp);
  return rc;
}

/* get_aspect_ratio_preserving_size of image_processing_pil_gemma4.py: (height, width). */
int gemma4_image_size(int h, int w, int patch, int64_t max_patches, int k, int *oh, int *ow, herr *err) {
  double total = (double)h * w, target = (double)max_patches * patch * patch;
  double factor = sqrt(target / total), ih = factor * h, iw = factor * w;
  int64_t side = (int64_t)k * patch;
  int64_t th = (int64_t)floor(ih / side) * side, tw = (int64_t)floor(iw / side) * side;
  if (th == 0 && tw == 0)
    return herr_set(err, HEARTH_EINVAL, "image of %d x %d pixels would be resized to nothing (sides must be multiples of %lld)",
                    w, h, (long long)side);
  int64_t max_side = (max_patches / ((int64_t)k * k)) * side;
  if (th == 0) {
    th = side;
    tw = (int64_t)floor((double)w / h) * side;
    if (tw > max_side) tw = max_side;
  } else if (tw == 0) {
    tw = side;
    th = (int64_t)floor((double)h / w) * side;
    if (th > max_side) th = max_side;
  }
  if ((double)th * tw > target)
    return herr_set(err, HEARTH_EINVAL, "image of %d x %d pixels: resizing to %lld x %lld exceeds %lld patches", w, h,
                    (long long)tw, (long long)th, (long long)max_patches);
  *oh = (int)th, *ow = (int)tw;
  return 0;
}

/* ---- config ---- */

static int64_t jint(const json_t *o, const char *key, int64_t def) {
  const json_t *v = json_object_get(o, key);
  return v && json_is_integer(v) ? json_integer_value(v) : def;
}

static double jnum(const json_t *o, const char *key, double def) {
  const json_t *v = json_object_get(o, key);
  return v && json_is_number(v) ? json_number_value(v) : def;
}

static bool jbool(const json_t *o, const char *key, bool def) {
  const json_t *v = json_object_get(o, key);
  return v && json_is_boolean(v) ? json_is_true(v) : def;
}

static bool g4v_match(const json_t *root) {
  const json_t *mt = json_object_get(root, "model_type"), *vc = json_object_get(root, "vision_config");
  return json_is_object(vc) && json_is_string(mt) && !strcmp(json_string_value(mt), "gemma4");
}

/* The processor's settings: processor_config.json's "image_processor", else preprocessor_config.json. */
static int g4v_load_processor(g4v_state *s, const char *dir, herr *err) {
  s->max_soft = 280, s->proc_patch = s->P, s->proc_k = s->K;
  s->rescale = 1.0 / 255, s->do_resize = s->do_rescale = true, s->do_normalize = false;
  for (int c = 0; c < 3; c++) s->mean[c] = 0, s->std_dev[c] = 1;
  const json_t *ip = NULL;
  json_t *doc = NULL;
  static const char *const files[] = {"processor_config.json", "preprocessor_config.json"};
  for (int i = 0; i < 2 && !ip; i++) {
    char *p = hpath_join(dir, files[i]);
    if (!p) return herr_set(err, HEARTH_ENOMEM, "out of memory");
    if (hfile_exists(p)) {
      doc = hjson_load_file(p, err);
      if (!doc) {
        free(p);
        return err ? err->code : HEARTH_EFORMAT;
      }
      ip = i == 0 ? json_object_get(doc, "image_processor") : doc;
      if (!json_is_object(ip)) {
        json_decref(doc);
        doc = NULL;
        ip = NULL;
      }
    }
    free(p);
  }
  if (ip) {
    s->max_soft = jint(ip, "max_soft_tokens", s->max_soft);
    s->proc_patch = jint(ip, "patch_size", s->proc_patch);
    s->proc_k = jint(ip, "pooling_kernel_size", s->proc_k);
    s->rescale = jnum(ip, "rescale_factor", s->rescale);
    s->do_resize = jbool(ip, "do_resize", true);
    s->do_rescale = jbool(ip, "do_rescale", true);
    s->do_normalize = jbool(ip, "do_normalize", false);
    const json_t *ty = json_object_get(ip, "image_processor_type");
    const char *tn = json_is_string(ty) ? json_string_value(ty) : "";
    s->pil = strlen(tn) >= 3 && !strcmp(tn + strlen(tn) - 3, "Pil");
    const json_t *mean = json_object_get(ip, "image_mean"), *sd = json_object_get(ip, "image_std");
    for (int c = 0; c < 3; c++) {
      if (json_is_array(mean) && json_array_size(mean) == 3) s->mean[c] = json_number_value(json_array_get(mean, c));
      if (json_is_array(sd) && json_array_size(sd) == 3) s->std_dev[c] = json_number_value(json_array_get(sd, c));
    }
  }
  json_decref(doc);
  if (s->proc_patch != s->P || s->proc_k != s->K || s->max_soft <= 0 || s->max_soft > 1 << 20)
    return herr_set(err, HEARTH_EFORMAT, "the image processor's patch_size %lld / pooling_kernel_size %lld / max_soft_tokens %lld "
                    "do not fit vision_config (patch_size %lld, pooling_kernel_size %lld)",
                    (long long)s->proc_patch, (long long)s->proc_k, (long long)s->max_soft, (long long)s->P, (long long)s->K);
  return 0;
}

/* A special token's string: tokenizer_config.json's `key` (top level or in extra_special_tokens), else def. */
static void token_string(const json_t *tc, const char *key, const char *def, char *out, size_t n) {
  const json_t *v = tc ? json_object_get(tc, key) : NULL;
  const json_t *extra = tc ? json_object_get(tc, "extra_special_tokens") : NULL;
  if (!v && json_is_object(extra)) v = json_object_get(extra, key);
  if (json_is_object(v)) v = json_object_get(v, "content");
  snprintf(out, n, "%s", json_is_string(v) ? json_string_value(v) : def);
}

static void g4v_free(model *m, void *state) {
  (void)m;
  g4v_state *s = state;
  if (!s) return;
  free(s->layers);
  free(s->rope.inv_freq);
  free(s);
}

static int load_clip(model *m, const weight_src *src, const char *base, g4v_clip *c, herr *err) {
  static const char *const names[] = {"input_min", "input_max", "output_min", "output_max"};
  float *v[] = {&c->in_lo, &c->in_hi, &c->out_lo, &c->out_hi};
  char name[256];
  for (int i = 0; i < 4; i++) {
    snprintf(name, sizeof name, "%s.%s", base, names[i]);
    int rc = model_host_floats(m, src, name, 1, v[i], err);
    if (rc) return rc;
  }
  return 0;
}

static int load_lin(model *m, const weight_src *src, const g4v_state *s, const char *base, int64_t rows, int64_t cols,
                    g4v_lin *l, herr *err) {
  char name[256];
  snprintf(name, sizeof name, "%s.linear.weight", base);
  int rc = model_matrix(m, src, name, rows, cols, true, BK_USE_MATMUL, &l->w, err);
  l->c = (g4v_clip){-INFINITY, INFINITY, -INFINITY, INFINITY};
  if (!rc && s->clipped) rc = load_clip(m, src, base, &l->c, err);
  return rc;
}

static int g4v_load(model *m, const weight_src *src, const json_t *root, void **state, herr *err) {
  const json_t *vc = json_object_get(root, "vision_config");
  *state = NULL;
  if (!src->st || !st_find(src->st, "model.vision_tower.patch_embedder.input_proj.weight"))
    return 0; /* a folder without the tower's weights: the language model alone */
  g4v_state *s = calloc(1, sizeof *s);
  if (!s) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  int rc = 0;
  char name[256], base[200];
  s->D = jint(vc, "hidden_size", 768), s->inter = jint(vc, "intermediate_size", 3072), s->L = jint(vc, "num_hidden_layers", 16);
  s->H = jint(vc, "num_attention_heads", 12), s->KVH = jint(vc, "num_key_value_heads", s->H), s->hd = jint(vc, "head_dim", 64);
  s->P = jint(vc, "patch_size", 16), s->K = jint(vc, "pooling_kernel_size", 3), s->npos = jint(vc, "position_embedding_size", 10240);
  s->eps = jnum(vc, "rms_norm_eps", 1e-6);
  s->clipped = jbool(vc, "use_clipped_linears", false), s->standardize = jbool(vc, "standardize", false);
  s->theta = 100.0;
  const json_t *rp = json_object_get(vc, "rope_parameters");
  if (json_is_object(rp)) {
    s->theta = jnum(rp, "rope_theta", s->theta);
    const json_t *rt = json_object_get(rp, "rope_type");
    if (json_is_string(rt) && strcmp(json_string_value(rt), "axial")) {
      rc = herr_set(err, HEARTH_EUNSUPPORTED, "vision_config: rope_type '%s' (only axial)", json_string_value(rt));
      goto fail;
    }
  }
  const json_t *act = json_object_get(vc, "hidden_activation");
  const char *an = json_is_string(act) ? json_string_value(act) : "gelu_pytorch_tanh";
  s->act = !strcmp(an, "silu") ? BK_ACT_SILU : !strcmp(an, "gelu") ? BK_ACT_GELU : !strcmp(an, "relu") ? BK_ACT_RELU : BK_ACT_GELU_TANH;
  s->text_D = m->cfg.hidden_size;
  s->image_id = (int32_t)jint(root, "image_token_id", 258880);
  if (s->L <= 0 || s->L > 256 || s->D <= 0 || s->H <= 0 || s->KVH <= 0 || s->H % s->KVH || s->hd <= 0 || s->hd % 4 ||
      s->P <= 0 || s->P > 64 || s->K <= 0 || s->K > 8 || s->npos <= 0 || s->inter <= 0 || s->image_id < 0 ||
      s->image_id >= m->cfg.vocab_size) {
    rc = herr_set(err, HEARTH_EFORMAT,
                  "vision_config: %lld layers, hidden %lld, %lld heads / %lld kv heads of %lld, patch %lld, pooling %lld, "
                  "image_token_id %d",
                  (long long)s->L, (long long)s->D, (long long)s->H, (long long)s->KVH, (long long)s->hd, (long long)s->P,
                  (long long)s->K, (int)s->image_id);
    goto fail;
  }
  const char *vt = "model.vision_tower";
  snprintf(name, sizeof name, "%s.patch_embedder.input_proj.weight", vt);
  if ((rc = model_matrix(m, src, name, s->D, 3 * s->P * s->P, true, BK_USE_MATMUL, &s->patch, err))) goto fail;
  {
    bk_weight tabs[2];
    bool found = false;
    snprintf(name, sizeof name, "%s.patch_embedder.position_embedding_table", vt);
    if ((rc = model_describe_stack(m, src, name, 2, s->npos, s->D, tabs, &found, err))) goto fail;
    if (!found) {
      rc = herr_set(err, HEARTH_ENOTFOUND, "%s: not found", name);
      goto fail;
    }
    s->pos_x = tabs[0], s->pos_y = tabs[1];
    if ((rc = model_keep(m, &s->pos_x, BK_USE_EMBED, err)) || (rc = model_keep(m, &s->pos_y, BK_USE_EMBED, err))) goto fail;
  }
  if (!(s->layers = calloc((size_t)s->L, sizeof *s->layers))) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto fail;
  }
  for (int64_t l = 0; l < s->L; l++) {
    g4v_layer *ly = &s->layers[l];
    int64_t qd = s->H * s->hd, kd = s->KVH * s->hd;
#define LIN(part, r, c, dst)                                                                         \
  do {                                                                                               \
    snprintf(base, sizeof base, "%s.encoder.layers.%lld.%s", vt, (long long)l, part);              \
    if ((rc = load_lin(m, src, s, base, r, c, dst, err))) goto fail;                                 \
  } while (0)
#define VEC(part, n, dst)                                                                            \
  do {                                                                                               \
    snprintf(name, sizeof name, "%s.encoder.layers.%lld.%s", vt, (long long)l, part);              \
    if ((rc = model_vector(m, src, name, 1, n, 0, true, 1.0f, dst, err))) goto fail;                \
  } while (0)
    LIN("self_attn.q_proj", qd, s->D, &ly->q);
    LIN("self_attn.k_proj", kd, s->D, &ly->k);
    LIN("self_attn.v_proj", kd, s->D, &ly->v);
    LIN("self_attn.o_proj", s->D, qd, &ly->o);
    LIN("mlp.gate_proj", s->inter, s->D, &ly->gate);
    LIN("mlp.up_proj", s->inter, s->D, &ly->up);
    LIN("mlp.down_proj", s->D, s->inter, &ly->down);
    VEC("self_attn.q_norm.weight", s->hd, &ly->q_norm);
    VEC("self_attn.k_norm.weight", s->hd, &ly->k_norm);
    VEC("input_layernorm.weight", s->D, &ly->in_norm);
    VEC("post_attention_layernorm.weight", s->D, &ly->post_attn_norm);
    VEC("pre_feedforward_layernorm.weight", s->D, &ly->pre_ffn_norm);
    VEC("post_feedforward_layernorm.weight", s->D, &ly->post_ffn_norm);
#undef LIN
#undef VEC
  }
  if (s->standardize) { /* (h - bias) * scale as h · diag(scale) + (-bias * scale) */
    float *sc = NULL, *bi = NULL, *w = NULL, *b = NULL;
    if ((rc = model_own_floats(m, s->D, "std_scale", &sc, err)) || (rc = model_own_floats(m, s->D, "std_bias", &bi, err)) ||
        (rc = model_own_floats(m, s->D * s->D, "std", &w, err)) || (rc = model_own_floats(m, s->D, "std", &b, err)))
      goto fail;
    snprintf(name, sizeof name, "%s.std_scale", vt);
    if ((rc = model_host_floats(m, src, name, s->D, sc, err))) goto fail;
    snprintf(name, sizeof name, "%s.std_bias", vt);
    if ((rc = model_host_floats(m, src, name, s->D, bi, err))) goto fail;
    memset(w, 0, sizeof(float) * (size_t)(s->D * s->D));
    for (int64_t i = 0; i < s->D; i++) w[i * s->D + i] = sc[i], b[i] = -bi[i] * sc[i];
    s->std = (bk_weight){.type = BK_F32, .rows = s->D, .cols = s->D, .data = w};
    if ((rc = model_keep(m, &s->std, BK_USE_MATMUL, err))) goto fail;
    if ((rc = bk_tensor_new(m->be, BK_DT_F32, 1, s->D, &s->std_b, err))) goto fail;
    if (m->n_bufs == m->cap_bufs && !HGROW(m->bufs, m->cap_bufs, m->n_bufs + 1)) {
      bk_tensor_free(&s->std_b);
      rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
      goto fail;
    }
    m->bufs[m->n_bufs++] = s->std_b.buf; /* freed with the model's vectors */
    if ((rc = bk_set(&s->std_b, 0, b, sizeof(float) * (size_t)s->D, err))) goto fail;
  }
  if ((rc = model_matrix(m, src, "model.embed_vision.embedding_projection.weight", s->text_D, s->D, true, BK_USE_MATMUL,
                         &s->proj, err)))
    goto fail;
  /* RoPE: each half head (head_dim / 2) rotated over itself with head_dim / 4 frequencies (float32, as torch) */
  int64_t half = s->hd / 2, nf = half / 2;
  s->rope.rot_dim = half;
  s->rope.attn_scale = 1.0;
  if (!(s->rope.inv_freq = calloc((size_t)nf, sizeof(double)))) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto fail;
  }
  for (int64_t i = 0; i < nf; i++) {
    float e = (float)(2 * i) / (float)half;
    s->rope.inv_freq[i] = (double)(1.0f / powf((float)s->theta, e));
  }
  if ((rc = g4v_load_processor(s, src->what, err))) goto fail;
  /* the marker strings the processor writes around the soft tokens */
  char *tp = hpath_join(src->what, "tokenizer_config.json");
  json_t *tc = tp && hfile_exists(tp) ? hjson_load_file(tp, NULL) : NULL;
  free(tp);
  token_string(tc, "image_token", "<|image|>", s->image_tok, sizeof s->image_tok);
  token_string(tc, "boi_token", "<|image>", s->boi_tok, sizeof s->boi_tok);
  token_string(tc, "eoi_token", "<image|>", s->eoi_tok, sizeof s->eoi_tok);
  json_decref(tc);
  *state = s;
  return 0;
fail:
  g4v_free(m, s);
  return rc;
}

static const char *g4v_placeholder(const void *state, media_kind k) {
  const g4v_state *s = state;
  (void)k;
  return s->image_tok;
}

int gemma4_image_patches(const media_image *im, int P, int K, int64_t max_soft, bool pil, double rescale, float **values,
                         int32_t **pos, int64_t *n_patches, int *oh, int *ow, herr *err) {
  *values = NULL, *pos = NULL;
  int64_t max_patches = max_soft * K * K;
  int th, tw, rc;
  if ((rc = gemma4_image_size(im->h, im->w, P, max_patches, K, &th, &tw, err))) return rc;
  uint8_t *px = malloc((size_t)tw * th * 3);
  if (!px) return herr_set(err, HEARTH_ENOMEM, "out of memory for an image");
  if (pil) {
    rc = mm_resize_pil(px, tw, th, im->rgb, im->w, im->h, err);
  } else { /* torchvision on the uint8 (channel, row, column) tensor */
    uint8_t *pl = malloc((size_t)im->w * im->h * 3), *po = malloc((size_t)tw * th * 3);
    if (!pl || !po) rc = herr_set(err, HEARTH_ENOMEM, "out of memory for an image");
    for (int64_t i = 0; !rc && i < (int64_t)im->w * im->h; i++)
      for (int c = 0; c < 3; c++) pl[(int64_t)c * im->w * im->h + i] = im->rgb[i * 3 + c];
    if (!rc) rc = mm_resize_u8(po, th, tw, pl, 3, im->h, im->w, MM_RESAMPLE_BICUBIC, err);
    for (int64_t i = 0; !rc && i < (int64_t)tw * th; i++)
      for (int c = 0; c < 3; c++) px[i * 3 + c] = po[(int64_t)c * tw * th + i];
    free(pl), free(po);
  }
  if (rc) {
    free(px);
    return rc;
  }
  int64_t ph = th / P, pw = tw / P, N = ph * pw, C = 3 * (int64_t)P * P;
  float *v = malloc(sizeof(float) * (size_t)(N * C));
  int32_t *ps = malloc(sizeof(int32_t) * (size_t)N * 2);
  if (!v || !ps) {
    free(px), free(v), free(ps);
    return herr_set(err, HEARTH_ENOMEM, "out of memory for an image's patches");
  }
  float fscale = (float)rescale;
  for (int64_t py = 0; py < ph; py++)
    for (int64_t pxi = 0; pxi < pw; pxi++) {
      int64_t n = py * pw + pxi;
      for (int64_t r = 0; r < P; r++)
        for (int64_t c = 0; c < P; c++)
          for (int ch = 0; ch < 3; ch++) {
            uint8_t u = px[((size_t)(py * P + r) * tw + (size_t)(pxi * P + c)) * 3 + ch];
            /* numpy rescales in double, then stores f32; torch multiplies in f32 */
            v[n * C + (r * P + c) * 3 + ch] = rescale == 1.0 ? (float)u : pil ? (float)((double)u * rescale) : (float)u * fscale;
          }
      ps[2 * n] = (int32_t)pxi;
      ps[2 * n + 1] = (int32_t)py;
    }
  free(px);
  *values = v, *pos = ps, *n_patches = N, *oh = th, *ow = tw;
  return 0;
}

static int g4v_prepare(const void *state, const media *in, mm_prep *out, herr *err) {
  const g4v_state *s = state;
  if (in->kind != MEDIA_IMAGE) return herr_set(err, HEARTH_EINVAL, "the Gemma 4 vision tower takes images only");
  if (!s->do_resize || s->do_normalize)
    return herr_set(err, HEARTH_EUNSUPPORTED, "the image processor's do_resize false / do_normalize true are not supported");
  int64_t N = 0;
  int th = 0, tw = 0;
  int rc = gemma4_image_patches(&in->image, (int)s->P, (int)s->K, s->max_soft, s->pil, s->do_rescale ? s->rescale : 1.0,
                                &out->values, &out->pos, &N, &th, &tw, err);
  if (rc) return rc;
  out->rows = N, out->cols = 3 * s->P * s->P, out->pos_cols = 2;
  out->grid[0] = 1, out->grid[1] = th / s->P, out->grid[2] = tw / s->P;
  out->n_tokens = N / (s->K * s->K);
  out->soft_id = s->image_id;
  size_t lb = strlen(s->boi_tok), li = strlen(s->image_tok), le = strlen(s->eoi_tok);
  out->text = malloc(lb + li * (size_t)out->n_tokens + le + 1);
  if (!out->text) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  char *o = out->text;
  memcpy(o, s->boi_tok, lb), o += lb;
  for (int64_t i = 0; i < out->n_tokens; i++) memcpy(o, s->image_tok, li), o += li;
  memcpy(o, s->eoi_tok, le), o += le;
  *o = 0;
  return 0;
}

typedef struct g4v_bufs {
  bk_tensor t[32];
  int n;
} g4v_bufs;

static bk_tensor *g4v_new(g4v_bufs *b, bk_backend *be, bk_dtype dt, int64_t rows, int64_t cols, int *rc, herr *err) {
  bk_tensor *t = &b->t[b->n];
  if (*rc) return t;
  if ((*rc = bk_tensor_new(be, dt, rows, cols, t, err))) return t;
  b->n++;
  return t;
}

/* y = clip(clip(x) · wᵀ), x clipped in tmp (same shape as x) when the layer clips its input. */
static void clip_lin(const bk_tensor *y, const bk_tensor *x, const g4v_lin *l, const bk_tensor *tmp) {
  const bk_tensor *in = x;
  if (isfinite(l->c.in_lo) || isfinite(l->c.in_hi)) {
    bk_copy(tmp, 0, x, 0, bk_nbytes(x));
    bk_clamp(tmp, l->c.in_lo, l->c.in_hi);
    in = tmp;
  }
  bk_matmul_t(y, in, &l->w, NULL);
  if (isfinite(l->c.out_lo) || isfinite(l->c.out_hi)) bk_clamp(y, l->c.out_lo, l->c.out_hi);
}

static int g4v_encode(model *m, void *state, const mm_prep *p, mm_embeds *out, herr *err) {
  g4v_state *s = state;
  memset(out, 0, sizeof *out);
  const int64_t N = p->rows, D = s->D, H = s->H, KVH = s->KVH, hd = s->hd, K = s->K;
  const int64_t ph = p->grid[1], pw = p->grid[2], n_out = N / (K * K);
  int64_t wide = s->inter > H * hd ? s->inter : H * hd;
  if (D > wide) wide = D;
  if (N <= 0 || p->cols != 3 * s->P * s->P || N != ph * pw || ph % K || pw % K || !p->pos || n_out != p->n_tokens)
    return herr_set(err, HEARTH_EINVAL, "vision tower: %lld patches of %lld values for a %lld x %lld grid", (long long)N,
                    (long long)p->cols, (long long)pw, (long long)ph);
  for (int64_t i = 0; i < N; i++)
    if (p->pos[2 * i] < 0 || p->pos[2 * i] >= s->npos || p->pos[2 * i + 1] < 0 || p->pos[2 * i + 1] >= s->npos)
      return herr_set(err, HEARTH_EINVAL, "vision tower: patch position (%d, %d) is beyond the position table (%lld)",
                      p->pos[2 * i], p->pos[2 * i + 1], (long long)s->npos);
  bk_backend *be = m->be;
  g4v_bufs b = {0};
  int rc = 0;
  /* host tables: x / y positions; the rope position of each (patch, head, half) row; attention rows;
   * the patches of each pooled token */
  int64_t nq = N * H * 2, nk = N * KVH * 2;
  int32_t *ix = malloc(sizeof(int32_t) * (size_t)(2 * N + nq + nk + 3 * N + 1 + K * K * n_out));
  float *xin = malloc(sizeof(float) * (size_t)(N * p->cols));
  float *hrows = NULL;
  if (!ix || !xin) {
    rc = herr_set(err, HEARTH_ENOMEM, "vision tower: out of memory");
    goto done;
  }
  int32_t *px = ix, *py = px + N, *rq = py + N, *rk = rq + nq, *row = rk + nk, *tab = row + N, *tables = tab + N,
          *pool = tables + 1;
  for (int64_t i = 0; i < N; i++) {
    px[i] = p->pos[2 * i], py[i] = p->pos[2 * i + 1];
    for (int64_t h = 0; h < H; h++) rq[(i * H + h) * 2] = px[i], rq[(i * H + h) * 2 + 1] = py[i];
    for (int64_t h = 0; h < KVH; h++) rk[(i * KVH + h) * 2] = px[i], rk[(i * KVH + h) * 2 + 1] = py[i];
    row[i] = (int32_t)(N - 1); /* every patch sees the whole image */
    tab[i] = 0;
  }
  tables[0] = 0;
  /* pooling: output token (X, Y) of the (pw / K) x (ph / K) grid averages patches (K X + i, K Y + j); the
   * patch at grid position (x, y) is the one whose position is (x, y) */
  int32_t *at = malloc(sizeof(int32_t) * (size_t)N);
  if (!at) {
    rc = herr_set(err, HEARTH_ENOMEM, "vision tower: out of memory");
    goto done;
  }
  for (int64_t i = 0; i < N; i++) at[py[i] * pw + px[i]] = (int32_t)i;
  for (int64_t j = 0; j < K * K; j++)
    for (int64_t o = 0; o < n_out; o++) {
      int64_t X = o % (pw / K), Y = o / (pw / K);
      pool[j * n_out + o] = at[(Y * K + j / K) * pw + X * K + j % K];
    }
  free(at);
  for (int64_t i = 0; i < N * p->cols; i++) xin[i] = 2.0f * (p->values[i] - 0.5f);
  bk_tensor *x = g4v_new(&b, be, BK_DT_F32, N, p->cols, &rc, err), *h = g4v_new(&b, be, BK_DT_F32, N, D, &rc, err);
  bk_tensor *xn = g4v_new(&b, be, BK_DT_F32, N, D, &rc, err), *tmp = g4v_new(&b, be, BK_DT_F32, N, wide, &rc, err);
  bk_tensor *q = g4v_new(&b, be, BK_DT_F32, N, H * hd, &rc, err), *k = g4v_new(&b, be, BK_DT_F32, N, KVH * hd, &rc, err);
  bk_tensor *v = g4v_new(&b, be, BK_DT_F32, N, KVH * hd, &rc, err), *att = g4v_new(&b, be, BK_DT_F32, N, H * hd, &rc, err);
  bk_tensor *o = g4v_new(&b, be, BK_DT_F32, N, D, &rc, err), *g = g4v_new(&b, be, BK_DT_F32, N, s->inter, &rc, err);
  bk_tensor *u = g4v_new(&b, be, BK_DT_F32, N, s->inter, &rc, err);
  bk_tensor *tix = g4v_new(&b, be, BK_DT_I32, 2 * N + nq + nk + 3 * N + 1 + K * K * n_out, 1, &rc, err);
  bk_tensor *pooled = g4v_new(&b, be, BK_DT_F32, n_out, D, &rc, err), *pt = g4v_new(&b, be, BK_DT_F32, n_out, D, &rc, err);
  bk_tensor *y = g4v_new(&b, be, BK_DT_F32, n_out, s->text_D, &rc, err);
  if (rc) goto done;
  if ((rc = bk_set(x, 0, xin, sizeof(float) * (size_t)(N * p->cols), err)) ||
      (rc = bk_set(tix, 0, ix, sizeof(int32_t) * (size_t)tix->rows, err)))
    goto done;
  bk_tensor tpx = bk_rows(tix, 0, N), tpy = bk_rows(tix, N, N), trq = bk_rows(tix, 2 * N, nq), trk = bk_rows(tix, 2 * N + nq, nk);
  bk_tensor trow = bk_rows(tix, 2 * N + nq + nk, N), ttab = bk_rows(tix, 3 * N + nq + nk, N);
  bk_tensor ttables = bk_rows(tix, 4 * N + nq + nk, 1);
  int64_t pool0 = 4 * N + nq + nk + 1;
  /* patch embedding + the x and y rows of the position table */
  bk_matmul_t(h, x, &s->patch, NULL);
  bk_embed(xn, &s->pos_x, &tpx, 0);
  bk_add(h, h, xn);
  bk_embed(xn, &s->pos_y, &tpy, 0);
  bk_add(h, h, xn);
  bk_kv_layer kvl = {.k = k, .v = v, .block_rows = N, .k_fmt = BK_KV_F32, .v_fmt = BK_KV_F32};
  bk_attn_index aix = {.row = &trow, .tab = &ttab, .tables = &ttables};
  attn_params ap = {.n_heads = H, .n_kv_heads = KVH, .head_dim = hd, .scale = 1.0f, .softcap = 0.0f, .window = 0};
  float eps = (float)s->eps;
  for (int64_t l = 0; l < s->L; l++) {
    const g4v_layer *ly = &s->layers[l];
    bk_tensor tq = step_view(tmp, N, H * hd), td = step_view(tmp, N, D), ti = step_view(tmp, N, s->inter);
    bk_rmsnorm(xn, h, &ly->in_norm, eps, false);
    clip_lin(q, xn, &ly->q, &td);
    clip_lin(k, xn, &ly->k, &td);
    clip_lin(v, xn, &ly->v, &td);
    bk_tensor qh = bk_reshape(q, N * H, hd), kh = bk_reshape(k, N * KVH, hd), vh = bk_reshape(v, N * KVH, hd);
    bk_rmsnorm(&qh, &qh, &ly->q_norm, eps, false);
    bk_rmsnorm(&kh, &kh, &ly->k_norm, eps, false);
    bk_rmsnorm(&vh, &vh, NULL, eps, false);
    bk_tensor qr = bk_reshape(q, nq, hd / 2), kr = bk_reshape(k, nk, hd / 2);
    bk_rope(&qr, 1, hd / 2, &trq, &s->rope);
    bk_rope(&kr, 1, hd / 2, &trk, &s->rope);
    bk_attention(att, q, &kvl, &aix, &ap);
    clip_lin(o, att, &ly->o, &tq);
    bk_rmsnorm(o, o, &ly->post_attn_norm, eps, false);
    bk_add(h, h, o);
    bk_rmsnorm(xn, h, &ly->pre_ffn_norm, eps, false);
    clip_lin(g, xn, &ly->gate, &td);
    clip_lin(u, xn, &ly->up, &td);
    bk_act_mul(g, u, s->act);
    clip_lin(o, g, &ly->down, &ti);
    bk_rmsnorm(o, o, &ly->post_ffn_norm, eps, false);
    bk_add(h, h, o);
  }
  /* K x K average pooling by position, times sqrt(hidden) */
  for (int64_t j = 0; j < K * K; j++) {
    bk_tensor sel = bk_rows(tix, pool0 + j * n_out, n_out);
    if (j == 0) bk_get_rows(pooled, h, &sel);
    else {
      bk_get_rows(pt, h, &sel);
      bk_add(pooled, pooled, pt);
    }
  }
  bk_scale(pooled, (float)(1.0 / (double)(K * K)));
  bk_scale(pooled, (float)sqrt((double)D));
  if (s->standardize) {
    bk_matmul_t(pt, pooled, &s->std, &s->std_b);
    bk_copy(pooled, 0, pt, 0, bk_nbytes(pt));
  }
  /* the embedder: RMSNorm without scale, projection into the text model */
  bk_rmsnorm(pooled, pooled, NULL, eps, false);
  bk_matmul_t(y, pooled, &s->proj, NULL);
  hrows = malloc(sizeof(float) * (size_t)(n_out * s->text_D));
  if (!hrows) {
    rc = herr_set(err, HEARTH_ENOMEM, "vision tower: out of memory");
    goto done;
  }
  if ((rc = bk_get(y, 0, hrows, sizeof(float) * (size_t)(n_out * s->text_D), err))) goto done;
  out->n_tokens = n_out;
  out->dim = s->text_D;
  out->rows = hrows;
  hrows = NULL;
  out->pos_span = n_out;
  out->bidirectional = true;
done:
  free(hrows);
  for (int i = 0; i < b.n; i++) bk_tensor_free(&b.t[i]);
  free(ix), free(xin);
  return rc;
}

const mm_tower_ops gemma4_vision_tower = {
    .name = "gemma4_vision",
    .config_key = "vision_config",
    .kinds = MEDIA_BIT(MEDIA_IMAGE),
    .match = g4v_match,
    .load = g4v_load,
    .placeholder = g4v_placeholder,
    .video_opts = NULL,
    .prepare = g4v_prepare,
    .prep_free = NULL,
    .encode = g4v_encode,
    .free = g4v_free,
};
