/* mm_image.c — image preprocessing for the vision towers (see mm_image.h):
 * PyTorch's antialiased uint8 resize, the Qwen-VL smart resize, the
 * normalization and the patch layout. Knows nothing of decoding (the
 * pixels arrive as RGB8) nor of the towers (the patches leave as floats). */
#include "model/mm_image.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"

/* An int field that fits an int (absent: *out unchanged). */
static int get_small_int(const json_t *o, const char *key, int *out, const char *what, herr *err) {
  int64_t v = *out;
  int rc = hjson_get_int(o, key, false, &v, what, err);
  if (rc) return rc;
  if (v < -(1 << 30) || v > (1 << 30)) return herr_set(err, HEARTH_EFORMAT, "%s: '%s' out of range", what, key);
  *out = (int)v;
  return 0;
}

/* ---- the resize ---- */

static double filter_bilinear(double x) {
  x = fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

/* Keys' cubic convolution with a = -0.5 (PyTorch's antialiasing bicubic, as Pillow's). */
static double filter_bicubic(double x) {
  const double a = -0.5;
  x = fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
  return 0.0;
}

/* One axis's taps: for output i, the inputs [lo[i], lo[i] + n[i]) with int16 weights w[i * ksize + k] at
 * `prec` fractional bits (PyTorch's _compute_index_ranges_int16_weights over
 * _compute_indices_min_size_weights_aa, in double). */
typedef struct axis_taps {
  int ksize, prec;
  int *lo, *n;        /* owned */
  int32_t *w;         /* owned: [out * ksize] */
} axis_taps;

static void taps_free(axis_taps *t) {
  free(t->lo), free(t->n), free(t->w);
  memset(t, 0, sizeof *t);
}

static int taps_make(axis_taps *t, int in, int out, mm_resample how, herr *err) {
  memset(t, 0, sizeof *t);
  double (*filter)(double) = how == MM_RESAMPLE_BICUBIC ? filter_bicubic : filter_bilinear;
  int interp = how == MM_RESAMPLE_BICUBIC ? 4 : 2;
  double scale = (double)in / (double)out;
  double support = scale >= 1.0 ? (interp * 0.5) * scale : interp * 0.5;
  int ksize = (int)ceil(support) * 2 + 1;
  double *wd = calloc((size_t)out * (size_t)ksize, sizeof(double));
  t->lo = calloc((size_t)out, sizeof(int));
  t->n = calloc((size_t)out, sizeof(int));
  t->w = calloc((size_t)out * (size_t)ksize, sizeof(int32_t));
  if (!wd || !t->lo || !t->n || !t->w) {
    free(wd);
    taps_free(t);
    return herr_set(err, HEARTH_ENOMEM, "image resize: out of memory");
  }
  double wt_max = 0.0;
  for (int i = 0; i < out; i++) {
    double center = scale * (i + 0.5), total = 0.0, invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    int64_t xmin = (int64_t)(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int64_t xmax = (int64_t)(center + support + 0.5);
    if (xmax > in) xmax = in;
    int64_t xsize = xmax - xmin;
    if (xsize < 0) xsize = 0;
    if (xsize > ksize) xsize = ksize;
    double *w = wd + (size_t)i * (size_t)ksize;
    for (int64_t j = 0; j < xsize; j++) {
      w[j] = filter(((double)(j + xmin) - center + 0.5) * invscale);
      total += w[j];
    }
    if (total != 0.0)
      for (int64_t j = 0; j < xsize; j++) {
        w[j] /= total;
        if (w[j] > wt_max) wt_max = w[j];
      }
    t->lo[i] = (int)xmin;
    t->n[i] = (int)xsize;
  }
  int prec = 0;
  for (prec = 0; prec < 22; prec++) {
    int next = (int)(0.5 + wt_max * (double)(1 << (prec + 1)));
    if (next >= (1 << 15)) break;
  }
  for (size_t k = 0; k < (size_t)out * (size_t)ksize; k++) {
    double v = wd[k] * (double)(1 << prec);
    t->w[k] = (int16_t)(v < 0 ? (int)(-0.5 + v) : (int)(0.5 + v));
  }
  t->ksize = ksize;
  t->prec = prec;
  free(wd);
  return 0;
}

static uint8_t clamp_u8(int32_t v) { return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v); }

int mm_resize_u8(uint8_t *dst, int oh, int ow, const uint8_t *src, int c, int ih, int iw, mm_resample how, herr *err) {
  if (oh <= 0 || ow <= 0 || ih <= 0 || iw <= 0 || c <= 0)
    return herr_set(err, HEARTH_EINVAL, "image resize: %dx%d to %dx%d", iw, ih, ow, oh);
  if (oh == ih && ow == iw) {
    memcpy(dst, src, (size_t)c * (size_t)ih * (size_t)iw);
    return 0;
  }
  axis_taps tx = {0}, ty = {0};
  uint8_t *mid = NULL;
  int rc = 0;
  const uint8_t *cur = src;
  int cw = iw;
  if (ow != iw) { /* horizontal pass first, into uint8 */
    if ((rc = taps_make(&tx, iw, ow, how, err))) goto done;
    uint8_t *h = oh != ih ? (mid = malloc((size_t)c * (size_t)ih * (size_t)ow)) : dst;
    if (!h) {
      rc = herr_set(err, HEARTH_ENOMEM, "image resize: out of memory");
      goto done;
    }
    int32_t half = tx.prec > 0 ? 1 << (tx.prec - 1) : 0;
    for (int ch = 0; ch < c; ch++)
      for (int y = 0; y < ih; y++) {
        const uint8_t *row = src + ((size_t)ch * ih + y) * iw;
        uint8_t *o = h + ((size_t)ch * ih + y) * ow;
        for (int x = 0; x < ow; x++) {
          const int32_t *w = tx.w + (size_t)x * tx.ksize;
          int32_t s = half;
          for (int k = 0; k < tx.n[x]; k++) s += (int32_t)row[tx.lo[x] + k] * w[k];
          o[x] = clamp_u8(s >> tx.prec);
        }
      }
    cur = h;
    cw = ow;
  }
  if (oh != ih) {
    if ((rc = taps_make(&ty, ih, oh, how, err))) goto done;
    int32_t half = ty.prec > 0 ? 1 << (ty.prec - 1) : 0;
    for (int ch = 0; ch < c; ch++)
      for (int y = 0; y < oh; y++) {
        const int32_t *w = ty.w + (size_t)y * ty.ksize;
        uint8_t *o = dst + ((size_t)ch * oh + y) * ow;
        for (int x = 0; x < cw; x++) {
          int32_t s = half;
          for (int k = 0; k < ty.n[y]; k++) s += (int32_t)cur[((size_t)ch * ih + ty.lo[y] + k) * cw + x] * w[k];
          o[x] = clamp_u8(s >> ty.prec);
        }
      }
  }
done:
  free(mid);
  taps_free(&tx);
  taps_free(&ty);
  return rc;
}

/* ---- Qwen-VL ---- */

void qwen_vision_prep_default(qwen_vision_prep *p) {
  memset(p, 0, sizeof *p);
  p->patch_size = 16;
  p->temporal_patch_size = 2;
  p->merge_size = 2;
  p->min_pixels = 56 * 56;
  p->max_pixels = 28 * 28 * 1280;
  p->video_min_pixels = 128 * 32 * 32;
  p->video_max_pixels = 32 * 32 * 768;
  for (int i = 0; i < 3; i++) p->mean[i] = 0.5, p->std[i] = 0.5;
  p->rescale = 1.0 / 255.0;
  p->resample = MM_RESAMPLE_BICUBIC;
  p->video_fps = 2; /* Qwen3VLVideoProcessor's fps, min_frames, max_frames, do_sample_frames */
  p->video_min_frames = 4;
  p->video_max_frames = 768;
  p->video_sample_frames = true;
}

static int read_triple(const json_t *o, const char *key, double out[3], const char *what, herr *err) {
  const json_t *a = json_object_get(o, key);
  if (!a || json_is_null(a)) return 0;
  if (json_is_number(a)) {
    out[0] = out[1] = out[2] = json_number_value(a);
    return 0;
  }
  if (!json_is_array(a) || json_array_size(a) != 3) return herr_set(err, HEARTH_EFORMAT, "%s: '%s' must be 3 numbers", what, key);
  for (int i = 0; i < 3; i++) {
    const json_t *v = json_array_get(a, (size_t)i);
    if (!json_is_number(v)) return herr_set(err, HEARTH_EFORMAT, "%s: '%s' must be 3 numbers", what, key);
    out[i] = json_number_value(v);
  }
  return 0;
}

static int read_prep(qwen_vision_prep *p, const char *path, bool video, herr *err) {
  if (access(path, R_OK) != 0) return 0;
  json_t *o = hjson_load_file(path, err);
  if (!o) return err ? err->code : HEARTH_EFORMAT;
  int64_t v;
  int rc = 0;
  int64_t *mn = video ? &p->video_min_pixels : &p->min_pixels, *mx = video ? &p->video_max_pixels : &p->max_pixels;
  if (!rc) rc = get_small_int(o, "patch_size", &p->patch_size, path, err);
  if (!rc) rc = get_small_int(o, "temporal_patch_size", &p->temporal_patch_size, path, err);
  if (!rc) rc = get_small_int(o, "merge_size", &p->merge_size, path, err);
  if (!rc) rc = hjson_get_int(o, "min_pixels", false, mn, path, err);
  if (!rc) rc = hjson_get_int(o, "max_pixels", false, mx, path, err);
  const json_t *size = json_object_get(o, "size");
  if (!rc && size && json_is_object(size)) {
    rc = hjson_get_int(size, "shortest_edge", false, mn, path, err);
    if (!rc) rc = hjson_get_int(size, "longest_edge", false, mx, path, err);
  }
  if (!rc) rc = read_triple(o, "image_mean", p->mean, path, err);
  if (!rc) rc = read_triple(o, "image_std", p->std, path, err);
  if (!rc) rc = hjson_get_num(o, "rescale_factor", false, &p->rescale, path, err);
  v = -1;
  if (!rc && !(rc = hjson_get_int(o, "resample", false, &v, path, err)) && v >= 0) {
    if (v == 2) p->resample = MM_RESAMPLE_BILINEAR;
    else if (v == 3) p->resample = MM_RESAMPLE_BICUBIC;
    else rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: resample %lld (only bilinear 2 and bicubic 3)", path, (long long)v);
  }
  if (video) {
    int64_t mn_f = p->video_min_frames, mx_f = p->video_max_frames;
    if (!rc) rc = hjson_get_num(o, "fps", false, &p->video_fps, path, err);
    if (!rc) rc = hjson_get_int(o, "min_frames", false, &mn_f, path, err);
    if (!rc) rc = hjson_get_int(o, "max_frames", false, &mx_f, path, err);
    if (!rc) rc = hjson_get_bool(o, "do_sample_frames", false, &p->video_sample_frames, path, err);
    if (!rc && (!(p->video_fps > 0) || p->video_fps > 1000 || mn_f < 0 || mx_f < 1 || mn_f > mx_f || mx_f > 100000))
      rc = herr_set(err, HEARTH_EFORMAT, "%s: fps %g, min_frames %lld, max_frames %lld out of range", path, p->video_fps,
                    (long long)mn_f, (long long)mx_f);
    p->video_min_frames = (int)mn_f, p->video_max_frames = (int)mx_f;
  }
  if (!rc && (p->patch_size <= 0 || p->patch_size > 64 || p->temporal_patch_size <= 0 || p->temporal_patch_size > 8 ||
              p->merge_size <= 0 || p->merge_size > 8 || *mn <= 0 || *mx < *mn || !(p->rescale > 0)))
    rc = herr_set(err, HEARTH_EFORMAT, "%s: patch, merge or pixel sizes out of range", path);
  for (int i = 0; !rc && i < 3; i++)
    if (!(p->std[i] > 0) || !isfinite(p->mean[i])) rc = herr_set(err, HEARTH_EFORMAT, "%s: image_std must be positive", path);
  json_decref(o);
  return rc;
}

int qwen_vision_prep_load(qwen_vision_prep *p, const char *dir, herr *err) {
  char path[4096];
  snprintf(path, sizeof path, "%s/preprocessor_config.json", dir);
  int rc = read_prep(p, path, false, err);
  if (rc) return rc;
  snprintf(path, sizeof path, "%s/video_preprocessor_config.json", dir);
  return read_prep(p, path, true, err);
}

/* Python's round(): halves to even. */
static double round_half_even(double x) { return nearbyint(x); }

int qwen_smart_resize(int h, int w, int factor, int64_t min_pixels, int64_t max_pixels, int *oh, int *ow, herr *err) {
  if (h <= 0 || w <= 0 || factor <= 0) return herr_set(err, HEARTH_EINVAL, "image of %dx%d pixels", w, h);
  double lo = h < w ? h : w, hi = h < w ? w : h;
  if (hi / lo > 200) return herr_set(err, HEARTH_EINVAL, "image of %dx%d pixels: aspect ratio beyond 200", w, h);
  double hb = round_half_even((double)h / factor) * factor, wb = round_half_even((double)w / factor) * factor;
  if (hb * wb > (double)max_pixels) {
    double beta = sqrt((double)h * w / (double)max_pixels);
    hb = floor(h / beta / factor) * factor;
    wb = floor(w / beta / factor) * factor;
    if (hb < factor) hb = factor;
    if (wb < factor) wb = factor;
  } else if (hb * wb < (double)min_pixels) {
    double beta = sqrt((double)min_pixels / ((double)h * w));
    hb = ceil(h * beta / factor) * factor;
    wb = ceil(w * beta / factor) * factor;
  }
  if (hb < factor || wb < factor || hb > 1 << 20 || wb > 1 << 20)
    return herr_set(err, HEARTH_EINVAL, "image of %dx%d pixels resizes to %.0fx%.0f", w, h, wb, hb);
  *oh = (int)hb;
  *ow = (int)wb;
  return 0;
}

int qwen_smart_resize_video(int t, int h, int w, int temporal_factor, int factor, int64_t min_pixels, int64_t max_pixels,
                            int *oh, int *ow, herr *err) {
  if (t < temporal_factor) return herr_set(err, HEARTH_EINVAL, "video of %d frames: at least %d are needed", t, temporal_factor);
  if (h <= 0 || w <= 0 || factor <= 0) return herr_set(err, HEARTH_EINVAL, "video frames of %dx%d pixels", w, h);
  double hh = h, ww = w;
  if (h < factor || w < factor) {
    double s = fmax((double)factor / h, (double)factor / w);
    hh = (double)(int64_t)(h * s);
    ww = (double)(int64_t)(w * s);
  }
  double lo = fmin(hh, ww), hi = fmax(hh, ww);
  if (hi / lo > 200) return herr_set(err, HEARTH_EINVAL, "video frames of %dx%d pixels: aspect ratio beyond 200", w, h);
  double hb = round_half_even(hh / factor) * factor, wb = round_half_even(ww / factor) * factor;
  double tb = round_half_even((double)t / temporal_factor) * temporal_factor;
  if (tb * hb * wb > (double)max_pixels) {
    double beta = sqrt((double)t * hh * ww / (double)max_pixels);
    hb = fmax(factor, floor(hh / beta / factor) * factor);
    wb = fmax(factor, floor(ww / beta / factor) * factor);
  } else if (tb * hb * wb < (double)min_pixels) {
    double beta = sqrt((double)min_pixels / ((double)t * hh * ww));
    hb = ceil(hh * beta / factor) * factor;
    wb = ceil(ww * beta / factor) * factor;
  }
  if (hb < factor || wb < factor || hb > 1 << 20 || wb > 1 << 20)
    return herr_set(err, HEARTH_EINVAL, "video frames of %dx%d pixels resize to %.0fx%.0f", w, h, wb, hb);
  *oh = (int)hb;
  *ow = (int)wb;
  return 0;
}

int qwen_vision_patches(const qwen_vision_prep *p, const uint8_t *const *frames, int n_frames, int h, int w, bool video,
                        float **out, int64_t grid[3], herr *err) {
  *out = NULL;
  const int P = p->patch_size, M = p->merge_size, TP = p->temporal_patch_size, factor = P * M;
  if (n_frames <= 0 || (!video && n_frames != 1)) return herr_set(err, HEARTH_EINVAL, "%d frames for an image", n_frames);
  int oh, ow, rc;
  if (video) rc = qwen_smart_resize_video(n_frames, h, w, TP, factor, p->video_min_pixels, p->video_max_pixels, &oh, &ow, err);
  else rc = qwen_smart_resize(h, w, factor, p->min_pixels, p->max_pixels, &oh, &ow, err);
  if (rc) return rc;
  int gt = video ? (n_frames + TP - 1) / TP : 1, gh = oh / P, gw = ow / P;
  int64_t n_patch = (int64_t)gt * gh * gw, dim = 3LL * TP * P * P;
  /* the normalization as the processor fuses it, in f32: (x - mean / rescale) / (std / rescale) */
  float m[3], s[3];
  for (int c = 0; c < 3; c++) {
    float inv = (float)(1.0 / p->rescale);
    m[c] = (float)p->mean[c] * inv;
    s[c] = (float)p->std[c] * inv;
  }
  size_t plane = (size_t)oh * (size_t)ow;
  uint8_t *planar = malloc((size_t)3 * h * w), *res = malloc(3 * plane);
  float *norm = malloc(sizeof(float) * 3 * plane * (size_t)(video ? n_frames : 1));
  float *pv = malloc(sizeof(float) * (size_t)(n_patch * dim));
  if (!planar || !res || !norm || !pv) {
    rc = herr_set(err, HEARTH_ENOMEM, "image patches: out of memory");
    goto done;
  }
  for (int f = 0; f < n_frames; f++) {
    const uint8_t *px = frames[f];
    for (int y = 0; y < h; y++)
      for (int x = 0; x < w; x++)
        for (int c = 0; c < 3; c++) planar[((size_t)c * h + y) * w + x] = px[((size_t)y * w + x) * 3 + c];
    if ((rc = mm_resize_u8(res, oh, ow, planar, 3, h, w, p->resample, err))) goto done;
    float *nf = norm + (size_t)f * 3 * plane;
    for (int c = 0; c < 3; c++)
      for (size_t i = 0; i < plane; i++) nf[c * plane + i] = ((float)res[c * plane + i] - m[c]) / s[c];
  }
  /* patch (t, bh, bw, mh, mw) holds (c, tp, py, px); a frame past the end repeats the last one */
  int64_t k = 0;
  for (int t = 0; t < gt; t++)
    for (int bh = 0; bh < gh / M; bh++)
      for (int bw = 0; bw < gw / M; bw++)
        for (int mh = 0; mh < M; mh++)
          for (int mw = 0; mw < M; mw++, k++) {
            float *o = pv + k * dim;
            int y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
            for (int c = 0; c < 3; c++)
              for (int tp = 0; tp < TP; tp++) {
                int f = video ? t * TP + tp : 0;
                if (f >= n_frames) f = n_frames - 1;
                const float *nf = norm + ((size_t)f * 3 + c) * plane;
                for (int py = 0; py < P; py++)
                  for (int px2 = 0; px2 < P; px2++) *o++ = nf[(size_t)(y0 + py) * ow + x0 + px2];
              }
          }
  grid[0] = gt, grid[1] = gh, grid[2] = gw;
  *out = pv;
  pv = NULL;
done:
  free(planar), free(res), free(norm), free(pv);
  return rc;
}
