/* qwen3_5_vision.c — Qwen3.5's vision tower (transformers' models/qwen3_5,
 * Qwen3_5VisionModel, which follows Qwen3-VL without its deepstack
 * features), for images and video frames:
 *   patches (mm_image.c: smart resize, normalize, (C, T, p, p) vectors in
 *   spatial-merge order) → the Conv3d patch embedding as one matrix
 *   product → plus the learned position table resampled to the grid
 *   (bilinear, align_corners, 4 taps: bk_embed_bag) → depth blocks of
 *   LayerNorm, attention with the 2-D rotary (row and column halves of the
 *   frequencies, bk_rope over 2 axes) inside each image or temporal slice of
 *   a video (bidirectional: bk_attention with every query at its span's
 *   last row), LayerNorm, MLP → the patch merger (LayerNorm, the 2x2 merge
 *   as a reshape, Linear, GELU, Linear) into the text model's width.
 * The language model places the merged tokens with multimodal RoPE: each
 * token's (t, h, w) offset in its run (mm_embeds.pos3; mm_positions.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "model/internal.h"
#include "model/mm.h"
#include "model/mm_image.h"

typedef struct qv_block {
  bk_tensor n1_w, n1_b, n2_w, n2_b, qkv_b, proj_b, fc1_b, fc2_b;
  bk_weight qkv, proj, fc1, fc2;
} qv_block;

typedef struct qv_state {
  int64_t depth, D, heads, hd, inter, out, P, TP, M, C, npos, side;
  double theta;
  bk_act act;
  bk_weight patch;           /* Conv3d weight as [D, C * TP * P * P] */
  bk_tensor patch_b, pos_embed; /* [1, D], [npos, D] */
  qv_block *blk;             /* owned: depth */
  bk_tensor m_nw, m_nb, m_fc1_b, m_fc2_b;
  bk_weight m_fc1, m_fc2;
  rope_table rope;           /* owned: 2 axes (row, column) */
  int32_t image_id, video_id;
  qwen_vision_prep prep;
} qv_state;

static int64_t jint(const json_t *o, const char *key, int64_t def) {
  const json_t *v = json_object_get(o, key);
  return v && json_is_integer(v) ? json_integer_value(v) : def;
}

static bool qv_match(const json_t *root) {
  const json_t *mt = json_object_get(root, "model_type"), *vc = json_object_get(root, "vision_config");
  const char *t = json_is_string(mt) ? json_string_value(mt) : "";
  return json_is_object(vc) && (!strcmp(t, "qwen3_5") || !strcmp(t, "qwen3_5_moe"));
}

#define QV_MAT(nm, r, c, dst)                                                                              \
  do {                                                                                                     \
    snprintf(name, sizeof name, "model.visual.%s", nm);                                                  \
    if ((rc = model_matrix(m, src, name, r, c, true, BK_USE_MATMUL, dst, err))) goto fail;                \
  } while (0)
#define QV_VEC(nm, n, dst)                                                                                 \
  do {                                                                                                     \
    snprintf(name, sizeof name, "model.visual.%s", nm);                                                  \
    if ((rc = model_vector(m, src, name, 1, n, 0, true, 1.0f, dst, err))) goto fail;                      \
  } while (0)

static void qv_free(model *m, void *state) {
  (void)m;
  qv_state *s = state;
  if (!s) return;
  free(s->blk);
  free(s->rope.inv_freq);
  free(s->rope.axis);
  free(s);
}

static int qv_load(model *m, const weight_src *src, const json_t *root, void **state, herr *err) {
  const json_t *vc = json_object_get(root, "vision_config");
  qv_state *s = calloc(1, sizeof *s);
  if (!s) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  int rc = 0;
  char name[256];
  s->depth = jint(vc, "depth", 27), s->D = jint(vc, "hidden_size", 1152), s->heads = jint(vc, "num_heads", 16);
  s->inter = jint(vc, "intermediate_size", 4304), s->out = jint(vc, "out_hidden_size", 3584);
  s->P = jint(vc, "patch_size", 16), s->TP = jint(vc, "temporal_patch_size", 2), s->M = jint(vc, "spatial_merge_size", 2);
  s->C = jint(vc, "in_channels", 3), s->npos = jint(vc, "num_position_embeddings", 2304);
  s->image_id = (int32_t)jint(root, "image_token_id", 248056), s->video_id = (int32_t)jint(root, "video_token_id", 248057);
  s->theta = 10000.0;
  const json_t *rp = json_object_get(vc, "rope_parameters"), *th = rp ? json_object_get(rp, "rope_theta") : NULL;
  if (th && json_is_number(th)) s->theta = json_number_value(th);
  const json_t *act = json_object_get(vc, "hidden_act");
  const char *an = json_is_string(act) ? json_string_value(act) : "gelu_pytorch_tanh";
  s->act = !strcmp(an, "silu") ? BK_ACT_SILU : !strcmp(an, "gelu") ? BK_ACT_GELU : BK_ACT_GELU_TANH;
  s->side = (int64_t)sqrt((double)s->npos);
  if (s->depth <= 0 || s->depth > 256 || s->D <= 0 || s->heads <= 0 || s->D % s->heads || s->C != 3 || s->P <= 0 ||
      s->TP <= 0 || s->M <= 0 || s->side * s->side != s->npos || s->out != m->cfg.hidden_size || (s->D / s->heads) % 4) {
    rc = herr_set(err, HEARTH_EFORMAT,
                  "vision_config: depth %lld, hidden %lld in %lld heads, %lld channels, %lld position embeddings "
                  "(a square), out_hidden_size %lld (the text model's %lld)",
                  (long long)s->depth, (long long)s->D, (long long)s->heads, (long long)s->C, (long long)s->npos,
                  (long long)s->out, (long long)m->cfg.hidden_size);
    goto fail;
  }
  s->hd = s->D / s->heads;
  const int64_t D = s->D, K = s->C * s->TP * s->P * s->P, MD = D * s->M * s->M;
  /* the Conv3d kernel [D, C, TP, P, P] is a [D, C * TP * P * P] matrix over the patches' layout */
  float *pw;
  if ((rc = model_own_floats(m, D * K, "model.visual.patch_embed.proj.weight", &pw, err)) ||
      (rc = model_host_floats(m, src, "model.visual.patch_embed.proj.weight", D * K, pw, err)))
    goto fail;
  s->patch = (bk_weight){.type = BK_F32, .rows = D, .cols = K, .data = pw};
  if ((rc = model_keep(m, &s->patch, BK_USE_MATMUL, err))) goto fail;
  QV_VEC("patch_embed.proj.bias", D, &s->patch_b);
  snprintf(name, sizeof name, "model.visual.pos_embed.weight");
  if ((rc = model_vector(m, src, name, 2, s->npos, D, true, 1.0f, &s->pos_embed, err))) goto fail;
  s->pos_embed = bk_reshape(&s->pos_embed, s->npos, D);
  if (!(s->blk = calloc((size_t)s->depth, sizeof *s->blk))) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto fail;
  }
  for (int64_t l = 0; l < s->depth; l++) {
    qv_block *b = &s->blk[l];
    char f[96];
#define BF(x) (snprintf(f, sizeof f, "blocks.%lld.%s", (long long)l, x), f)
    QV_VEC(BF("norm1.weight"), D, &b->n1_w);
    QV_VEC(BF("norm1.bias"), D, &b->n1_b);
    QV_VEC(BF("norm2.weight"), D, &b->n2_w);
    QV_VEC(BF("norm2.bias"), D, &b->n2_b);
    QV_MAT(BF("attn.qkv.weight"), 3 * D, D, &b->qkv);
    QV_VEC(BF("attn.qkv.bias"), 3 * D, &b->qkv_b);
    QV_MAT(BF("attn.proj.weight"), D, D, &b->proj);
    QV_VEC(BF("attn.proj.bias"), D, &b->proj_b);
    QV_MAT(BF("mlp.linear_fc1.weight"), s->inter, D, &b->fc1);
    QV_VEC(BF("mlp.linear_fc1.bias"), s->inter, &b->fc1_b);
    QV_MAT(BF("mlp.linear_fc2.weight"), D, s->inter, &b->fc2);
    QV_VEC(BF("mlp.linear_fc2.bias"), D, &b->fc2_b);
#undef BF
  }
  QV_VEC("merger.norm.weight", D, &s->m_nw);
  QV_VEC("merger.norm.bias", D, &s->m_nb);
  QV_MAT("merger.linear_fc1.weight", MD, MD, &s->m_fc1);
  QV_VEC("merger.linear_fc1.bias", MD, &s->m_fc1_b);
  QV_MAT("merger.linear_fc2.weight", s->out, MD, &s->m_fc2);
  QV_VEC("merger.linear_fc2.bias", s->out, &s->m_fc2_b);
  /* the 2-D rotary: head_dim / 4 frequencies over head_dim / 2, the first half turned by the row, the
   * second by the column, rotated over the whole head (rotate-half pairs i, i + head_dim / 2) */
  int64_t half = s->hd / 2, q = half / 2;
  s->rope.rot_dim = s->hd;
  s->rope.attn_scale = 1.0;
  s->rope.n_axes = 2;
  s->rope.inv_freq = calloc((size_t)half, sizeof(double));
  s->rope.axis = calloc((size_t)half, 1);
  if (!s->rope.inv_freq || !s->rope.axis) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto fail;
  }
  for (int64_t i = 0; i < half; i++) {
    float e = (float)(2 * (i % q)) / (float)half, f = 1.0f / powf((float)s->theta, e); /* as torch: in float32 */
    s->rope.inv_freq[i] = (double)f;
    s->rope.axis[i] = (int8_t)(i < q ? 0 : 1);
  }
  qwen_vision_prep_default(&s->prep);
  s->prep.patch_size = (int)s->P, s->prep.temporal_patch_size = (int)s->TP, s->prep.merge_size = (int)s->M;
  if ((rc = qwen_vision_prep_load(&s->prep, src->what, err))) goto fail;
  if (s->prep.patch_size != s->P || s->prep.temporal_patch_size != s->TP || s->prep.merge_size != s->M) {
    rc = herr_set(err, HEARTH_EFORMAT, "%s: the processor's patch %d / temporal %d / merge %d differ from vision_config's",
                  src->what, s->prep.patch_size, s->prep.temporal_patch_size, s->prep.merge_size);
    goto fail;
  }
  *state = s;
  return 0;
fail:
  qv_free(m, s);
  return rc;
}
#undef QV_MAT
#undef QV_VEC

static const char *qv_placeholder(const void *state, media_kind k) {
  (void)state;
  return k == MEDIA_VIDEO ? "<|video_pad|>" : "<|image_pad|>";
}

/* Qwen3VLVideoProcessor.sample_frames: fps frames a second, min_frames to max_frames of them. When the
 * processor does not sample (do_sample_frames false) it takes every frame; here still at most max_frames,
 * spread evenly, so that a long video cannot hold more frames than memory. */
static void qv_video_opts(const void *state, media_video_opts *out) {
  const qv_state *s = state;
  if (!s->prep.video_sample_frames) {
    *out = (media_video_opts){.max_frames = s->prep.video_max_frames};
    return;
  }
  out->fps = s->prep.video_fps;
  out->min_frames = s->prep.video_min_frames;
  out->max_frames = s->prep.video_max_frames;
}

static char *repeat_str(const char *pre, const char *unit, int64_t n, const char *post) {
  size_t lp = strlen(pre), lu = strlen(unit), lq = strlen(post);
  char *s = malloc(lp + lu * (size_t)n + lq + 1);
  if (!s) return NULL;
  char *o = s;
  memcpy(o, pre, lp), o += lp;
  for (int64_t i = 0; i < n; i++) memcpy(o, unit, lu), o += lu;
  memcpy(o, post, lq), o += lq;
  *o = 0;
  return s;
}

static int qv_prepare(const void *state, const media *in, mm_prep *out, herr *err) {
  const qv_state *s = state;
  memset(out, 0, sizeof *out);
  out->kind = in->kind;
  int rc;
  float *pv = NULL;
  int64_t grid[3];
  if (in->kind == MEDIA_IMAGE) {
    const uint8_t *f = in->image.rgb;
    rc = qwen_vision_patches(&s->prep, &f, 1, in->image.h, in->image.w, false, &pv, grid, err);
  } else if (in->kind == MEDIA_VIDEO) {
    const media_video *v = &in->video;
    if (v->n_frames <= 0) return herr_set(err, HEARTH_EINVAL, "video without frames");
    const uint8_t **fr = malloc(sizeof(*fr) * (size_t)v->n_frames);
    if (!fr) return herr_set(err, HEARTH_ENOMEM, "out of memory");
    rc = 0;
    for (int i = 0; i < v->n_frames && !rc; i++) {
      fr[i] = v->frames[i].rgb;
      if (v->frames[i].w != v->frames[0].w || v->frames[i].h != v->frames[0].h)
        rc = herr_set(err, HEARTH_EINVAL, "video frames of different sizes");
    }
    if (!rc) rc = qwen_vision_patches(&s->prep, fr, v->n_frames, v->frames[0].h, v->frames[0].w, true, &pv, grid, err);
    free(fr);
  } else
    return herr_set(err, HEARTH_EINVAL, "the Qwen3.5 vision tower takes images and video only (medium kind %d)", (int)in->kind);
  if (rc) return rc;
  int64_t per = grid[1] / s->M * (grid[2] / s->M);
  out->values = pv;
  out->rows = grid[0] * grid[1] * grid[2];
  out->cols = s->C * s->TP * s->P * s->P;
  memcpy(out->grid, grid, sizeof grid);
  out->n_tokens = grid[0] * per;
  if (in->kind == MEDIA_IMAGE) {
    out->soft_id = s->image_id;
    out->text = repeat_str("", "<|image_pad|>", per, "");
  } else {
    /* the processor's frame timestamps (_calculate_timestamps): each frame at its index over the stream's
     * average rate, the indices padded with the last to whole temporal patches, each patch at the mean of
     * its first and last frame's time (the decoded times where the indices are unknown) */
    out->soft_id = s->video_id;
    const media_video *v = &in->video;
    size_t cap = (size_t)grid[0] * (64 + (size_t)per * 13) + 1, len = 0;
    out->text = malloc(cap);
    for (int64_t t = 0; out->text && t < grid[0]; t++) {
      int64_t a = t * s->TP, b = a + s->TP - 1;
      if (a >= v->n_frames) a = v->n_frames - 1;
      if (b >= v->n_frames) b = v->n_frames - 1;
      double ts = v->index && v->fps > 0 ? ((double)v->index[a] / v->fps + (double)v->index[b] / v->fps) / 2
                  : v->t               ? (v->t[a] + v->t[b]) / 2
                                       : 0.0;
      len += (size_t)snprintf(out->text + len, cap - len, "<%.1f seconds><|vision_start|>", ts);
      for (int64_t i = 0; i < per; i++) len += (size_t)snprintf(out->text + len, cap - len, "<|video_pad|>");
      len += (size_t)snprintf(out->text + len, cap - len, "<|vision_end|>");
    }
  }
  if (!out->text) {
    free(out->values);
    memset(out, 0, sizeof *out);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  return 0;
}

/* The bilinear taps (align_corners) of patch (row, col) of an h x w grid into the side x side table, as
 * transformers' vision_utils computes them in float32. */
static void pos_taps(int64_t row, int64_t col, int64_t h, int64_t w, int64_t side, int32_t ids[4], float wt[4]) {
  int32_t ti[2][2];
  float tw[2][2];
  int64_t idx[2] = {row, col}, sz[2] = {h, w};
  for (int a = 0; a < 2; a++) {
    float src = (float)idx[a] * (float)(side - 1) / (float)(sz[a] - 1 > 1 ? sz[a] - 1 : 1);
    float fl = floorf(src);
    for (int o = 0; o < 2; o++) {
      int64_t tap = (int64_t)fl + o;
      ti[a][o] = (int32_t)(tap < 0 ? 0 : tap > side - 1 ? side - 1 : tap);
      float d = fabsf(src - fl - (float)o), wv = 1.0f - d;
      tw[a][o] = wv > 0.0f ? wv : 0.0f;
    }
  }
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++) {
      ids[i * 2 + j] = ti[0][i] * (int32_t)side + ti[1][j];
      wt[i * 2 + j] = tw[0][i] * tw[1][j];
    }
}

typedef struct qv_bufs {
  bk_tensor t[24];
  int n;
} qv_bufs;

static bk_tensor *qv_new(qv_bufs *b, bk_backend *be, bk_dtype dt, int64_t rows, int64_t cols, int *rc, herr *err) {
  bk_tensor *t = &b->t[b->n];
  if (*rc) return t;
  if ((*rc = bk_tensor_new(be, dt, rows, cols, t, err)) == 0) b->n++;
  return t;
}

static int qv_encode(model *m, void *state, const mm_prep *p, mm_embeds *out, herr *err) {
  qv_state *s = state;
  memset(out, 0, sizeof *out);
  const int64_t N = p->rows, D = s->D, M = s->M, gt = p->grid[0], gh = p->grid[1], gw = p->grid[2];
  const int64_t Nm = N / (M * M), MD = D * M * M, per = gh * gw;
  if (N <= 0 || N != gt * gh * gw || p->cols != s->patch.cols || gh % M || gw % M)
    return herr_set(err, HEARTH_EINVAL, "vision tower: %lld patches of %lld values for a %lldx%lldx%lld grid",
                    (long long)N, (long long)p->cols, (long long)gt, (long long)gh, (long long)gw);
  bk_backend *be = m->be;
  qv_bufs b = {0};
  int rc = 0;
  /* host index tables: position taps, rotary positions, attention rows and tables */
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)N * 4), *rp = malloc(sizeof(int32_t) * (size_t)N * 2);
  int32_t *row = malloc(sizeof(int32_t) * (size_t)N), *tab = malloc(sizeof(int32_t) * (size_t)N);
  int32_t *tables = malloc(sizeof(int32_t) * (size_t)N);
  float *wt = malloc(sizeof(float) * (size_t)N * 4);
  float *hrows = NULL;
  if (!ids || !rp || !row || !tab || !tables || !wt) {
    rc = herr_set(err, HEARTH_ENOMEM, "vision tower: out of memory");
    goto done;
  }
  for (int64_t k = 0; k < N; k++) {
    int64_t within = k % per, t0 = k - within;
    int64_t in_col = within % M, in_row = (within / M) % M, bcol = (within / (M * M)) % (gw / M), brow = within / (M * M * (gw / M));
    int64_t r = brow * M + in_row, c = bcol * M + in_col;
    pos_taps(r, c, gh, gw, s->side, ids + 4 * k, wt + 4 * k);
    rp[2 * k] = (int32_t)r, rp[2 * k + 1] = (int32_t)c;
    row[k] = (int32_t)(per - 1); /* every patch sees its whole image / temporal slice */
    tab[k] = (int32_t)t0;
    tables[k] = (int32_t)k;
  }
  bk_tensor *x = qv_new(&b, be, BK_DT_F32, N, p->cols, &rc, err), *h = qv_new(&b, be, BK_DT_F32, N, D, &rc, err);
  bk_tensor *xn = qv_new(&b, be, BK_DT_F32, N, D, &rc, err), *qkv = qv_new(&b, be, BK_DT_F32, N, 3 * D, &rc, err);
  bk_tensor *q = qv_new(&b, be, BK_DT_F32, N, D, &rc, err), *k = qv_new(&b, be, BK_DT_F32, N, D, &rc, err);
  bk_tensor *v = qv_new(&b, be, BK_DT_F32, N, D, &rc, err), *att = qv_new(&b, be, BK_DT_F32, N, D, &rc, err);
  bk_tensor *o = qv_new(&b, be, BK_DT_F32, N, D, &rc, err), *f1 = qv_new(&b, be, BK_DT_F32, N, s->inter, &rc, err);
  bk_tensor *tid = qv_new(&b, be, BK_DT_I32, N, 4, &rc, err), *tw = qv_new(&b, be, BK_DT_F32, N, 4, &rc, err);
  bk_tensor *trp = qv_new(&b, be, BK_DT_I32, N, 2, &rc, err), *trow = qv_new(&b, be, BK_DT_I32, N, 1, &rc, err);
  bk_tensor *ttab = qv_new(&b, be, BK_DT_I32, N, 1, &rc, err), *ttables = qv_new(&b, be, BK_DT_I32, N, 1, &rc, err);
  bk_tensor *m1 = qv_new(&b, be, BK_DT_F32, Nm, MD, &rc, err);
  bk_tensor *y = qv_new(&b, be, BK_DT_F32, Nm, s->out, &rc, err);
  if (rc) goto done;
  if ((rc = bk_set(x, 0, p->values, sizeof(float) * (size_t)(N * p->cols), err)) ||
      (rc = bk_set(tid, 0, ids, sizeof(int32_t) * (size_t)N * 4, err)) ||
      (rc = bk_set(tw, 0, wt, sizeof(float) * (size_t)N * 4, err)) ||
      (rc = bk_set(trp, 0, rp, sizeof(int32_t) * (size_t)N * 2, err)) ||
      (rc = bk_set(trow, 0, row, sizeof(int32_t) * (size_t)N, err)) ||
      (rc = bk_set(ttab, 0, tab, sizeof(int32_t) * (size_t)N, err)) ||
      (rc = bk_set(ttables, 0, tables, sizeof(int32_t) * (size_t)N, err)))
    goto done;
  /* patch embedding + resampled learned positions */
  bk_matmul_t(h, x, &s->patch, &s->patch_b);
  bk_embed_bag(xn, &s->pos_embed, tid, tw);
  bk_add(h, h, xn);
  bk_kv_layer kvl = {.k = k, .v = v, .block_rows = 1, .k_fmt = BK_KV_F32, .v_fmt = BK_KV_F32};
  bk_attn_index ix = {.row = trow, .tab = ttab, .tables = ttables};
  attn_params ap = {.n_heads = s->heads, .n_kv_heads = s->heads, .head_dim = s->hd, .scale = (float)(1.0 / sqrt((double)s->hd)),
                    .softcap = 0.0f, .window = 0};
  for (int64_t l = 0; l < s->depth; l++) {
    const qv_block *bl = &s->blk[l];
    bk_layernorm(xn, h, &bl->n1_w, &bl->n1_b, 1e-6f);
    bk_matmul_t(qkv, xn, &bl->qkv, &bl->qkv_b);
    bk_get_cols(q, qkv, 0);
    bk_get_cols(k, qkv, D);
    bk_get_cols(v, qkv, 2 * D);
    bk_rope(q, s->heads, s->hd, trp, &s->rope);
    bk_rope(k, s->heads, s->hd, trp, &s->rope);
    bk_attention(att, q, &kvl, &ix, &ap);
    bk_matmul_t(o, att, &bl->proj, &bl->proj_b);
    bk_add(h, h, o);
    bk_layernorm(xn, h, &bl->n2_w, &bl->n2_b, 1e-6f);
    bk_matmul_t(f1, xn, &bl->fc1, &bl->fc1_b);
    bk_activate(f1, s->act);
    bk_matmul_t(o, f1, &bl->fc2, &bl->fc2_b);
    bk_add(h, h, o);
  }
  /* the merger: LayerNorm per patch, then each merge block's M * M patches as one row */
  bk_layernorm(xn, h, &s->m_nw, &s->m_nb, 1e-6f);
  bk_tensor xm = bk_reshape(xn, Nm, MD);
  bk_matmul_t(m1, &xm, &s->m_fc1, &s->m_fc1_b);
  bk_activate(m1, BK_ACT_GELU);
  bk_matmul_t(y, m1, &s->m_fc2, &s->m_fc2_b);
  hrows = malloc(sizeof(float) * (size_t)(Nm * s->out));
  out->pos3 = malloc(sizeof(int32_t) * (size_t)Nm * 3);
  if (!hrows || !out->pos3) {
    rc = herr_set(err, HEARTH_ENOMEM, "vision tower: out of memory");
    goto done;
  }
  if ((rc = bk_get(y, 0, hrows, sizeof(float) * (size_t)(Nm * s->out), err))) goto done;
  /* each temporal slice is a run of its own: (0, row, column) of the merged grid */
  int64_t mh = gh / M, mw = gw / M;
  for (int64_t i = 0; i < Nm; i++) {
    int64_t w = i % (mh * mw);
    out->pos3[3 * i] = 0, out->pos3[3 * i + 1] = (int32_t)(w / mw), out->pos3[3 * i + 2] = (int32_t)(w % mw);
  }
  out->n_tokens = Nm;
  out->dim = s->out;
  out->rows = hrows;
  hrows = NULL;
  out->pos_span = gt * (mh > mw ? mh : mw);
  out->bidirectional = false;
done:
  if (rc) {
    free(out->pos3);
    memset(out, 0, sizeof *out);
  }
  free(hrows);
  for (int i = 0; i < b.n; i++) bk_tensor_free(&b.t[i]);
  free(ids), free(rp), free(row), free(tab), free(tables), free(wt);
  return rc;
}

static void qv_prep_free(mm_prep *p) { (void)p; }

const mm_tower_ops qwen3_5_vision_tower = {
    .name = "qwen3_5_vision",
    .config_key = "vision_config",
    .kinds = MEDIA_BIT(MEDIA_IMAGE) | MEDIA_BIT(MEDIA_VIDEO),
    .match = qv_match,
    .load = qv_load,
    .placeholder = qv_placeholder,
    .video_opts = qv_video_opts,
    .prepare = qv_prepare,
    .prep_free = qv_prep_free,
    .encode = qv_encode,
    .free = qv_free,
};
