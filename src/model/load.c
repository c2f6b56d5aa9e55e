/* load.c — describing a model's weights as stored: matrices (f32, f16,
 * bf16, GGUF block formats, MLX affine) and 3-D stacks of them (experts:
 * transformers' fused gate_up_proj, GGUF's, mlx-lm's switch_mlp, quantized
 * or not) are checked against the shapes the config implies and pointed at in the
 * file mapping (copied only when misaligned or converted); vectors become
 * f32 tensors of the backend. Names are Hugging Face's; a GGUF file or a
 * multimodal checkpoint's prefix is translated here. Knows nothing of what
 * a layer does with its weights. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/vec.h"
#include "model/gguf_model.h"
#include "model/internal.h"

static void shape_str(char *buf, size_t n, const int64_t *shape, int ndim) {
  size_t o = 0;
  o += snprintf(buf + o, n - o, "[");
  for (int i = 0; i < ndim && o < n; i++) o += snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (o < n) snprintf(buf + o, n - o, "]");
}

static const char *st_shape_of(const st_tensor *t, char *buf, size_t n) {
  shape_str(buf, n, t->shape, t->ndim);
  return buf;
}

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

/* The stored tensor `name` (Hugging Face name): shape, whichever file holds it. */
typedef struct found_tensor {
  const st_tensor *st;
  const gguf_tensor *gt;
  int64_t shape[4];
  int ndim;
  const char *name;      /* the name in the file */
} found_tensor;

static bool find_tensor(const weight_src *src, const char *name, char *buf, size_t n, found_tensor *f) {
  memset(f, 0, sizeof *f);
  f->name = name;
  if (src->gg) {
    f->gt = gguf_model_find(src->gg, name);
    if (!f->gt) return false;
    f->ndim = f->gt->ndim > 4 ? 4 : f->gt->ndim;
    for (int i = 0; i < f->ndim; i++) f->shape[i] = f->gt->dims[f->gt->ndim - 1 - i]; /* ggml order is reversed */
    f->name = f->gt->name;
    return true;
  }
  f->name = file_name(src, name, buf, n);
  f->st = st_find(src->st, f->name);
  if (!f->st) return false;
  f->ndim = f->st->ndim > 4 ? 4 : f->st->ndim;
  for (int i = 0; i < f->ndim; i++) f->shape[i] = f->st->shape[i];
  return true;
}

int model_vector(model *m, const weight_src *src, const char *name, int ndim, int64_t d0, int64_t d1, bool required, float mul,
                 bk_tensor *out, herr *err) {
  memset(out, 0, sizeof *out);
  char real[300];
  found_tensor f;
  if (!find_tensor(src, name, real, sizeof real, &f)) {
    if (!required) return 0;
    return herr_set(err, HEARTH_ENOTFOUND, "%s: tensor '%s' is missing from the weights (model_type %s)", src->what, f.name,
                    m->cfg.model_type);
  }
  const st_tensor *st = f.st;
  const gguf_tensor *gt = f.gt;
  name = st ? f.name : name;
  int64_t want[3] = {d0, ndim == 3 ? 1 : d1, d1}; /* ndim 3: [d0, 1, d1] (a depthwise convolution's kernel) */
  bool ok = f.ndim == ndim && (!st || st->ndim == ndim);
  for (int i = 0; ok && i < ndim; i++) ok = f.shape[i] == want[i];
  if (!ok) {
    char ws[64], hs[160];
    shape_str(ws, sizeof ws, want, ndim);
    shape_str(hs, sizeof hs, st ? st->shape : f.shape, st ? st->ndim : f.ndim);
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
  if (mul != 1)
    for (int64_t i = 0; i < numel; i++) buf[i] *= mul;
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

int model_host_floats(model *m, const weight_src *src, const char *name, int64_t n, float *out, herr *err) {
  char real[300];
  found_tensor f;
  if (!find_tensor(src, name, real, sizeof real, &f))
    return herr_set(err, HEARTH_ENOTFOUND, "%s: tensor '%s' is missing from the weights (model_type %s)", src->what, f.name,
                    m->cfg.model_type);
  int64_t numel = f.st ? f.st->numel : f.gt->nelements;
  if (numel != n) return herr_set(err, HEARTH_EFORMAT, "%s: expected %lld elements, file has %lld", f.name, (long long)n, (long long)numel);
  if (f.st && f.st->dtype != ST_F32 && f.st->dtype != ST_F16 && f.st->dtype != ST_BF16)
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s: dtype %s is not supported (F32, F16, BF16)", f.name, st_dtype_name(f.st->dtype));
  int rc = f.st ? st_to_f32(f.st, out, err) : gguf_model_read_f32(src->gg, f.gt, name, 0, out, err);
  return rc ? herr_wrap(err, "%s", f.name) : 0;
}

/* An MLX affine-quantized matrix NAME (= BASE.weight with BASE.scales and
 * BASE.biases beside it): packed uint32 words, one scale and bias per group. */
static int load_mlx_matrix(model *m, const weight_src *src, const char *name, const st_tensor *t, int64_t rows, int64_t cols,
                           bk_weight *out, herr *err) {
  const model_config *c = &m->cfg;
  char base[256], sn[280], bn[280], a[96], b[96];
  size_t nl = strlen(name), suffix = nl > 7 && !strcmp(name + nl - 7, ".weight") ? 7 : 0;
  snprintf(base, sizeof base, "%.*s", (int)(nl - suffix), name);
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

/* An FP8 (E4M3) matrix NAME with one f32 scale per output row beside it,
 * NAME_scale [rows, 1] or [rows] (the per-channel layout of `hearth convert
 * --quant fp8`, transformers' fbgemm_fp8 and compressed-tensors' channel
 * strategy): w = scale[row] * e4m3. */
static int load_fp8_matrix(const weight_src *src, const char *name, const st_tensor *t, int64_t rows, int64_t cols,
                           bk_weight *out, herr *err) {
  char sn[300], a[96];
  snprintf(sn, sizeof sn, "%s_scale", name);
  const st_tensor *sc = st_find(src->st, sn);
  if (!sc) {
    snprintf(sn, sizeof sn, "%s_scale_inv", name);
    if (st_find(src->st, sn))
      return herr_set(err, HEARTH_EUNSUPPORTED, "%s: block-wise FP8 scales (%s) are not supported; FP8 weights need one scale per "
                      "output row (NAME_scale [rows, 1], as `hearth convert --quant fp8` writes)", name, sn);
    return herr_set(err, HEARTH_ENOTFOUND, "%s: an F8_E4M3 weight needs its per-row scales %s_scale beside it", name, name);
  }
  if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
    return herr_set(err, HEARTH_EFORMAT, "%s: expected shape [%lld, %lld], file has %s", name, (long long)rows, (long long)cols,
                    st_shape_of(t, a, sizeof a));
  if (sc->dtype != ST_F32 || !((sc->ndim == 2 && sc->shape[0] == rows && sc->shape[1] == 1) || (sc->ndim == 1 && sc->shape[0] == rows)))
    return herr_set(err, HEARTH_EFORMAT, "%s: expected F32 [%lld, 1] (one scale per row), file has %s %s", sn, (long long)rows,
                    st_dtype_name(sc->dtype), st_shape_of(sc, a, sizeof a));
  *out = (bk_weight){.type = BK_FP8, .rows = rows, .cols = cols, .data = t->data, .scale_type = BK_F32, .scales = sc->data};
  return 0;
}

static int align_weight(model *m, bk_weight *w, int64_t rows, const char *name, herr *err) {
  size_t row_bytes = bk_row_bytes(w->type, w->cols, w->bits),
         elem = w->type == BK_F32 || w->type == BK_MLX_AFFINE ? 4 : w->type == BK_FP8 ? 1 : 2;
  int rc = align_copy(m, &w->data, row_bytes * (size_t)rows, elem, name, err);
  if (rc) return rc;
  if (w->type == BK_MLX_AFFINE) {
    size_t es = w->scale_type == BK_F32 ? 4 : 2, sb = (size_t)(rows * (w->cols / w->group_size)) * es;
    if ((rc = align_copy(m, &w->scales, sb, es, name, err)) || (rc = align_copy(m, &w->biases, sb, es, name, err))) return rc;
  }
  if (w->type == BK_FP8) return align_copy(m, &w->scales, (size_t)rows * 4, 4, name, err);
  return 0;
}

int model_describe_matrix(model *m, const weight_src *src, const char *name, int64_t rows, int64_t cols, bool required,
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
      return herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor type %s is not supported (" GGUF_MODEL_TYPES ")",
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
    } else if (t->dtype == ST_F8_E4M3) {
      if ((rc = load_fp8_matrix(src, name, t, rows, cols, out, err))) return rc;
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
  return src->gg ? 0 : align_weight(m, out, rows, name, err);
}

int model_keep(model *m, bk_weight *w, unsigned use, herr *err) {
  if (m->n_mats == m->cap_mats && !HGROW(m->mats, m->cap_mats, m->n_mats + 1))
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  m->mats[m->n_mats++] = (model_mat){w, use};
  return 0;
}

int model_matrix(model *m, const weight_src *src, const char *name, int64_t rows, int64_t cols, bool required, unsigned use,
                 bk_weight *out, herr *err) {
  int rc = model_describe_matrix(m, src, name, rows, cols, required, out, err);
  if (!rc && out->data) rc = model_keep(m, out, use, err);
  return rc;
}

/* A 3-D stack of n MLX affine-quantized matrices (mlx-lm's SwitchGLU:
 * BASE.weight U32 [n, rows, cols * bits / 32], BASE.scales and
 * BASE.biases [n, rows, cols / group_size]): seen as one matrix of n * rows
 * rows, cut into the experts' row ranges. */
static int load_mlx_stack(model *m, const weight_src *src, const st_tensor *t, int64_t n, int64_t rows, int64_t cols,
                          bk_weight *out, herr *err) {
  const model_config *c = &m->cfg;
  char base[256], sn[280], bn[280], a[96];
  const char *name = t->name;
  size_t nl = strlen(name), suffix = nl > 7 && !strcmp(name + nl - 7, ".weight") ? 7 : 0;
  snprintf(base, sizeof base, "%.*s", (int)(nl - suffix), name);
  snprintf(sn, sizeof sn, "%s.scales", base);
  snprintf(bn, sizeof bn, "%s.biases", base);
  const st_tensor *sc = st_find(src->st, sn), *bi = st_find(src->st, bn);
  if (!sc || !bi) return herr_set(err, HEARTH_ENOTFOUND, "%s: tensor '%s' is missing from the weights", src->what, sc ? bn : sn);
  int bits = c->quant_bits, gs = c->quant_group_size;
  int64_t words = cols * bits / 32, groups = gs > 0 ? cols / gs : 0;
  if (t->ndim != 3 || t->shape[0] != n || t->shape[1] != rows || t->shape[2] != words || cols * bits % 32)
    return herr_set(err, HEARTH_EFORMAT, "%s: expected U32 shape [%lld, %lld, %lld] (%d-bit MLX quantization of %lld inputs), file has %s",
                    name, (long long)n, (long long)rows, (long long)words, bits, (long long)cols, st_shape_of(t, a, sizeof a));
  for (int i = 0; i < 2; i++) {
    const st_tensor *x = i ? bi : sc;
    if (x->ndim != 3 || x->shape[0] != n || x->shape[1] != rows || x->shape[2] != groups || x->dtype != sc->dtype)
      return herr_set(err, HEARTH_EFORMAT, "%s: expected shape [%lld, %lld, %lld] (%s), file has %s %s", x->name, (long long)n,
                      (long long)rows, (long long)groups, st_dtype_name(sc->dtype), st_dtype_name(x->dtype), st_shape_of(x, a, sizeof a));
  }
  bk_type st_type;
  if (!model_bk_type_of_st(sc->dtype, &st_type))
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s: scales of dtype %s are not supported (F32, F16, BF16)", sn, st_dtype_name(sc->dtype));
  bk_weight all = {.type = BK_MLX_AFFINE, .rows = n * rows, .cols = cols, .data = t->data, .bits = bits, .group_size = gs,
                   .scale_type = st_type, .scales = sc->data, .biases = bi->data};
  int rc = bk_weight_validate(&all, err);
  if (rc) return herr_wrap(err, "%s", name);
  if ((rc = align_weight(m, &all, n * rows, name, err))) return rc;
  for (int64_t e = 0; e < n; e++) out[e] = model_sub_rows(&all, e * rows, rows);
  return 0;
}

int model_describe_stack(model *m, const weight_src *src, const char *name, int64_t n, int64_t rows, int64_t cols,
                         bk_weight *out, bool *found, herr *err) {
  char real[300], ws[96], hs[160];
  int64_t want[3] = {n, rows, cols};
  shape_str(ws, sizeof ws, want, 3);
  found_tensor f;
  *found = find_tensor(src, name, real, sizeof real, &f);
  if (!*found) return 0;
  if (f.st && f.st->dtype == ST_U32 && m->cfg.quant_bits > 0) return load_mlx_stack(m, src, f.st, n, rows, cols, out, err);
  if (f.ndim != 3 || f.shape[0] != n || f.shape[1] != rows || f.shape[2] != cols) {
    shape_str(hs, sizeof hs, f.shape, f.ndim);
    return herr_set(err, HEARTH_EFORMAT, "%s: expected shape %s, file has %s", f.name, ws, hs);
  }
  bk_type bt;
  const void *data;
  if (f.gt) {
    if (!model_bk_type_of_gguf(f.gt->type, &bt))
      return herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor type %s is not supported (" GGUF_MODEL_TYPES ")",
                      f.name, gguf_tensor_type_name(f.gt->type));
    data = f.gt->data;
  } else {
    if (!model_bk_type_of_st(f.st->dtype, &bt))
      return herr_set(err, HEARTH_EUNSUPPORTED, "%s: dtype %s is not supported for stacked experts (F32, F16, BF16)", f.name,
                      st_dtype_name(f.st->dtype));
    data = f.st->data;
  }
  bk_weight all = {.type = bt, .rows = n * rows, .cols = cols, .data = data};
  int rc = bk_weight_validate(&all, err);
  if (rc) return herr_wrap(err, "%s", f.name);
  if (!f.gt && (rc = align_weight(m, &all, n * rows, f.name, err))) return rc;
  for (int64_t e = 0; e < n; e++) out[e] = model_sub_rows(&all, e * rows, rows);
  return 0;
}

int model_own_floats(model *m, int64_t n, const char *what, float **out, herr *err) { return own_buffer(m, n, what, out, err); }

bk_weight model_sub_rows(const bk_weight *w, int64_t r0, int64_t n) {
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

int model_to_bf16(model *m, bk_weight *w, herr *err) {
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

int model_experts(model *m, const weight_src *src, const char *base, int64_t n, int64_t inter, layer_weights *lw, herr *err) {
  int64_t D = m->cfg.hidden_size, I = inter;
  lw->experts = calloc((size_t)(3 * n), sizeof *lw->experts);
  if (!lw->experts) return herr_set(err, HEARTH_ENOMEM, "out of memory for %lld experts", (long long)n);
  bk_weight *gate = lw->experts, *up = gate + n, *down = up + n;
  lw->ex = (bk_experts){.n = n, .gate = gate, .up = up, .down = down};
  char name[320], name2[320];
  int rc;
  bool found = false;
  /* one tensor per expert and matrix ({base}.{e}.gate_proj.weight: what most checkpoints hold) */
  snprintf(name, sizeof name, "%s.0.gate_proj.weight", base);
  bk_weight probe;
  if ((rc = model_describe_matrix(m, src, name, I, D, false, &probe, err))) return rc;
  if (probe.data) {
    static const char *const mats[] = {"gate_proj", "up_proj", "down_proj"};
    for (int k = 0; k < 3; k++)
      for (int64_t e = 0; e < n; e++) {
        snprintf(name, sizeof name, "%s.%lld.%s.weight", base, (long long)e, mats[k]);
        if ((rc = model_describe_matrix(m, src, name, k == 2 ? D : I, k == 2 ? I : D, true, &lw->experts[k * n + e], err)))
          return rc;
      }
  } else {
    /* stacked 3-D: gate and up fused ({base}.gate_up_proj [n, 2I, D], transformers 5) or apart (GGUF) */
    bk_weight *tmp = calloc((size_t)n, sizeof *tmp);
    if (!tmp) return herr_set(err, HEARTH_ENOMEM, "out of memory");
    snprintf(name, sizeof name, "%s.gate_up_proj", base);
    rc = model_describe_stack(m, src, name, n, 2 * I, D, tmp, &found, err);
    for (int64_t e = 0; !rc && found && e < n; e++) gate[e] = model_sub_rows(&tmp[e], 0, I), up[e] = model_sub_rows(&tmp[e], I, I);
    free(tmp);
    if (rc) return rc;
    if (!found) {
      snprintf(name2, sizeof name2, "%s.gate_proj", base);
      if ((rc = model_describe_stack(m, src, name2, n, I, D, gate, &found, err))) return rc;
      if (found) {
        snprintf(name2, sizeof name2, "%s.up_proj", base);
        if ((rc = model_describe_stack(m, src, name2, n, I, D, up, &found, err))) return rc;
      }
    }
    /* mlx-lm's SwitchGLU beside the router: {mlp}.switch_mlp.{gate,up,down}_proj.weight [n, out, in]
     * (U32 words with .scales and .biases when quantized) */
    char sw[300] = "";
    size_t bl = strlen(base);
    if (!found && bl > 8 && !strcmp(base + bl - 8, ".experts")) {
      snprintf(sw, sizeof sw, "%.*s.switch_mlp", (int)(bl - 8), base);
      snprintf(name2, sizeof name2, "%s.gate_proj.weight", sw);
      if ((rc = model_describe_stack(m, src, name2, n, I, D, gate, &found, err))) return rc;
      if (found) {
        snprintf(name2, sizeof name2, "%s.up_proj.weight", sw);
        if ((rc = model_describe_stack(m, src, name2, n, I, D, up, &found, err))) return rc;
        if (!found) return herr_set(err, HEARTH_ENOTFOUND, "%s: tensor '%s' is missing from the weights", src->what, name2);
      }
    }
    if (!found)
      return herr_set(err, HEARTH_ENOTFOUND, "%s: the experts are missing from the weights (looked for '%s.0.gate_proj.weight', '%s')",
                      src->what, base, name);
    if (sw[0]) snprintf(name, sizeof name, "%s.down_proj.weight", sw);
    else snprintf(name, sizeof name, "%s.down_proj", base);
    if ((rc = model_describe_stack(m, src, name, n, D, I, down, &found, err))) return rc;
    if (!found) return herr_set(err, HEARTH_ENOTFOUND, "%s: tensor '%s' is missing from the weights", src->what, name);
  }
  for (int64_t i = 0; i < 3 * n; i++)
    if ((rc = model_keep(m, &lw->experts[i], BK_USE_MATMUL | MODEL_USE_EXPERT, err))) return rc;
  return 0;
}
