/* test_mm_enc.c — the media encoders against transformers
 * (tests/fixtures/mm, made by tools/gen_mm_enc_golden.py):
 *   preprocessing: torchvision's uint8 antialiased resize (exact, on noise
 *   and on the test images), the Qwen3.5 image and video processors'
 *   patches (exact), Gemma-4's log-mel features (within 1e-5: numpy's
 *   float32 FFT rounds differently from the double one here) and frame mask
 *   (exact), the soft token count of a clip;
 *   the Qwen3.5 video sampling settings and frame times in the prompt text
 *   (transformers' _calculate_timestamps, worked out by hand);
 *   towers: the Qwen3.5 vision tower's merged tokens for two images and two
 *   videos, the Gemma-4 audio tower's soft tokens for two clips where the
 *   fixture's audio mask was built under sdpa (the golden tolerance: 1e-4
 *   of the larger of 1 and the reference's largest value);
 *   the language model: the three-axis positions of prompts with images
 *   and video (exact) and the logits at every position of prompts holding
 *   them (Qwen3.5 images and video; Gemma-4 audio with the reference's soft
 *   tokens, and with the tower's where they are compared; 1e-4 absolute as
 *   the text golden tests), with the media rows in model_seq.embeds. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "engine/kv_cache.h"
#include "model/internal.h"
#include "model/mm.h"
#include "model/mm_audio.h"
#include "model/mm_image.h"
#include "model/mm_positions.h"
#include "test.h"
#include "test_device.h"

#define MM_FX HEARTH_SOURCE_DIR "/tests/fixtures/mm"

/* ---- fixtures ---- */

typedef struct fx {
  json_t *doc;  /* owned */
  char dir[512];
} fx;

static bool fx_open(fx *f, const char *name) {
  snprintf(f->dir, sizeof f->dir, "%s/%s", MM_FX, name);
  char path[600];
  snprintf(path, sizeof path, "%s/golden.json", f->dir);
  herr err = {0};
  f->doc = hjson_load_file(path, &err);
  CHECK_MSG(f->doc != NULL, "%s", err.msg);
  return f->doc != NULL;
}

static void *read_all(const char *path, size_t *n) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  fseek(fp, 0, SEEK_END);
  long sz = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  void *buf = malloc(sz > 0 ? (size_t)sz : 1);
  size_t got = buf ? fread(buf, 1, (size_t)sz, fp) : 0;
  fclose(fp);
  if (got != (size_t)sz) {
    free(buf);
    return NULL;
  }
  *n = got;
  return buf;
}

/* Array `name` of the fixture (malloc'ed raw little-endian data) and its shape. */
static void *fx_arr(const fx *f, const char *name, int64_t shape[4], int *nd, int64_t *count) {
  memset(shape, 0, sizeof(int64_t) * 4);
  *nd = 0, *count = 0;
  const json_t *a = json_object_get(json_object_get(f->doc, "arrays"), name);
  if (!a) {
    CHECK_MSG(0, "%s: no array '%s'", f->dir, name);
    return NULL;
  }
  const json_t *sh = json_object_get(a, "shape");
  int64_t c = 1;
  *nd = (int)json_array_size(sh);
  for (int i = 0; i < *nd && i < 4; i++) c *= shape[i] = json_integer_value(json_array_get(sh, (size_t)i));
  char path[800];
  snprintf(path, sizeof path, "%s/%s", f->dir, json_string_value(json_object_get(a, "file")));
  size_t n;
  void *d = read_all(path, &n);
  CHECK_MSG(d != NULL, "%s: cannot read", path);
  *count = c;
  return d;
}

static double max_abs(const float *x, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++)
    if (fabs(x[i]) > m) m = fabs(x[i]);
  return m;
}

static double max_diff(const float *a, const float *b, int64_t n) {
  double d = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - (double)b[i]);
    if (!(e <= d)) d = isnan(e) ? INFINITY : e;
  }
  return d;
}

/* got against the fixture's array `name`: same count, max abs error within tol * max(1, max |ref|). */
static void check_close(const fx *f, const char *name, const float *got, int64_t n, double tol) {
  int64_t shape[4], count;
  int nd;
  float *ref = fx_arr(f, name, shape, &nd, &count);
  if (!ref) return;
  CHECK_MSG(count == n, "%s: %lld values, the reference has %lld", name, (long long)n, (long long)count);
  if (count == n) {
    double scale = max_abs(ref, n), d = max_diff(got, ref, n), lim = tol * (scale > 1 ? scale : 1);
    CHECK_MSG(d <= lim, "%s: max abs error %.3g > %.3g", name, d, lim);
    fprintf(stderr, "  %-28s max abs error %.3g (tol %.3g, max |ref| %.3g)\n", name, d, lim, scale);
  }
  free(ref);
}

/* ---- models with a tower (model_load loads it beside the language model) ---- */

typedef struct loaded {
  model *m;
  const mm_tower *t;
  kv_cache *kv;
} loaded;

static bool load_with_tower(const char *dir, media_kind kind, const char *want, loaded *L) {
  memset(L, 0, sizeof *L);
  herr err = {0};
  model_load_opts opts = {.threads = 2, .device = test_device()};
  int rc = model_load(dir, &opts, &L->m, &err);
  CHECK_MSG(rc == 0, "%s: %s", dir, err.msg);
  if (rc) return false;
  L->t = model_tower(L->m, kind);
  CHECK_MSG(L->t && !strcmp(mm_tower_name(L->t), want), "%s: no %s tower", dir, want);
  if (!L->t) return false;
  model_kv_geometry geo;
  model_kv_geometry_of(L->m, &geo);
  rc = kv_cache_new(&geo, 0, &L->kv, &err);
  CHECK_MSG(rc == 0, "kv cache: %s", err.msg);
  return rc == 0;
}

static void unload(loaded *L) {
  if (L->kv) kv_cache_free(L->kv);
  if (L->m) model_free(L->m);
}

static bool encode(loaded *L, const media *in, mm_prep *p, mm_embeds *e) {
  herr err = {0};
  memset(e, 0, sizeof *e);
  int rc = mm_prepare(L->t, in, p, &err);
  CHECK_MSG(rc == 0, "prepare: %s", err.msg);
  if (rc) return false;
  rc = mm_encode(L->m, p, e, &err);
  CHECK_MSG(rc == 0, "encode: %s", err.msg);
  return rc == 0;
}

/* All-position logits of ids with the media rows rows[i] (NULL for text) and positions3 (may be NULL), in
 * chunks of `chunk` tokens (0: one piece). */
static int forward_all(loaded *L, const int32_t *ids, int n, const float *const *rows, const int32_t *pos3, const int64_t *pos,
                       float *out, int chunk) {
  herr err = {0};
  kv_seq *s;
  if (kv_cache_seq_new(L->kv, &s, &err)) return -1;
  int64_t V = model_vocab_size(L->m);
  int rc = 0;
  for (int i = 0; i < n && !rc;) {
    int k = chunk > 0 && n - i > chunk ? chunk : n - i;
    model_seq sq = {.kv = s, .tokens = ids + i, .n_tokens = k, .all_logits = true, .embeds = rows ? rows + i : NULL,
                    .positions3 = pos3 ? pos3 + 3 * i : NULL, .positions = pos ? pos + i : NULL};
    model_batch b = {&sq, 1};
    rc = model_forward(L->m, &b, out + (size_t)i * V, &err);
    if (rc) fprintf(stderr, "forward: %s\n", err.msg);
    i += k;
  }
  kv_cache_seq_free(s);
  return rc;
}

/* ---- the resize ---- */

static void test_resize(void) {
  fx f;
  if (!fx_open(&f, "qwen3_5_vision-f32")) return;
  int64_t sh[4], cnt;
  int nd;
  uint8_t *noise = fx_arr(&f, "resize_noise", sh, &nd, &cnt);
  const json_t *cases = json_object_get(f.doc, "resize_cases");
  for (size_t i = 0; noise && i < json_array_size(cases); i++) {
    int oh = (int)json_integer_value(json_array_get(json_array_get(cases, i), 0));
    int ow = (int)json_integer_value(json_array_get(json_array_get(cases, i), 1));
    char name[64];
    snprintf(name, sizeof name, "resize_noise.%dx%d", oh, ow);
    int64_t s2[4], c2;
    uint8_t *ref = fx_arr(&f, name, s2, &nd, &c2), *got = malloc((size_t)(3 * oh * ow));
    herr err = {0};
    CHECK(mm_resize_u8(got, oh, ow, noise, 3, (int)sh[1], (int)sh[2], MM_RESAMPLE_BICUBIC, &err) == 0);
    int64_t bad = 0, worst = 0;
    for (int64_t k = 0; ref && k < c2; k++) {
      int d = abs((int)got[k] - (int)ref[k]);
      bad += d != 0;
      if (d > worst) worst = d;
    }
    CHECK_MSG(ref && bad == 0, "%s: %lld of %lld pixels differ (by up to %lld)", name, (long long)bad, (long long)c2, (long long)worst);
    free(ref), free(got);
  }
  free(noise);
  json_decref(f.doc);
}

/* ---- Qwen3.5 preprocessing ---- */

typedef struct qimg {
  const char *name;
  int h, w, frames;
} qimg;
/* the fixture's inputs (tools/gen_mm_enc_golden.py: make_image(rng, w, h)) */
static const qimg qimgs[] = {{"img_a", 21, 29, 0}, {"img_b", 80, 60, 0}, {"video_a", 21, 29, 4}, {"video_b", 21, 29, 3}};

static bool load_media(const fx *f, const qimg *q, media *out) {
  memset(out, 0, sizeof *out);
  char path[700];
  size_t n;
  if (!q->frames) {
    snprintf(path, sizeof path, "%s/%s.rgb", f->dir, q->name);
    out->kind = MEDIA_IMAGE;
    out->image = (media_image){.w = q->w, .h = q->h, .rgb = read_all(path, &n)};
    CHECK_MSG(out->image.rgb && n == (size_t)q->w * q->h * 3, "%s", path);
    return out->image.rgb != NULL;
  }
  out->kind = MEDIA_VIDEO;
  out->video.n_frames = q->frames;
  out->video.frames = calloc((size_t)q->frames, sizeof(media_image));
  out->video.t = calloc((size_t)q->frames, sizeof(double));
  out->video.fps = 2.0;
  for (int i = 0; i < q->frames; i++) {
    snprintf(path, sizeof path, "%s/%s.%d.rgb", f->dir, q->name, i);
    out->video.frames[i] = (media_image){.w = q->w, .h = q->h, .rgb = read_all(path, &n)};
    out->video.t[i] = i / 2.0;
    if (!out->video.frames[i].rgb) {
      CHECK_MSG(0, "%s", path);
      return false;
    }
  }
  return true;
}

static void free_media(media *m) {
  free(m->image.rgb);
  for (int i = 0; i < m->video.n_frames; i++) free(m->video.frames[i].rgb);
  free(m->video.frames);
  free(m->video.t);
  memset(m, 0, sizeof *m);
}

static void test_qwen_preprocess(void) {
  fx f;
  if (!fx_open(&f, "qwen3_5_vision-f32")) return;
  qwen_vision_prep p;
  qwen_vision_prep_default(&p);
  herr err = {0};
  CHECK_MSG(qwen_vision_prep_load(&p, f.dir, &err) == 0, "%s", err.msg);
  for (size_t i = 0; i < sizeof qimgs / sizeof qimgs[0]; i++) {
    const qimg *q = &qimgs[i];
    media md;
    if (!load_media(&f, q, &md)) continue;
    char name[64];
    int64_t sh[4], cnt;
    int nd;
    if (!q->frames) { /* the resized image itself */
      snprintf(name, sizeof name, "%s.resized", q->name);
      uint8_t *ref = fx_arr(&f, name, sh, &nd, &cnt);
      int oh, ow;
      CHECK(qwen_smart_resize(q->h, q->w, p.patch_size * p.merge_size, p.min_pixels, p.max_pixels, &oh, &ow, &err) == 0);
      CHECK_MSG(ref && sh[1] == oh && sh[2] == ow, "%s: smart resize %dx%d, reference %lldx%lld", q->name, oh, ow,
                (long long)sh[1], (long long)sh[2]);
      uint8_t *planar = malloc((size_t)3 * q->h * q->w), *got = malloc((size_t)3 * oh * ow);
      for (int y = 0; y < q->h; y++)
        for (int x = 0; x < q->w; x++)
          for (int c = 0; c < 3; c++) planar[((size_t)c * q->h + y) * q->w + x] = md.image.rgb[((size_t)y * q->w + x) * 3 + c];
      CHECK(mm_resize_u8(got, oh, ow, planar, 3, q->h, q->w, p.resample, &err) == 0);
      int64_t bad = 0;
      for (int64_t k = 0; ref && k < cnt && k < 3LL * oh * ow; k++) bad += got[k] != ref[k];
      CHECK_MSG(bad == 0, "%s: %lld resized pixels differ", q->name, (long long)bad);
      free(ref), free(planar), free(got);
    }
    const uint8_t **frames = malloc(sizeof(*frames) * (size_t)(q->frames ? q->frames : 1));
    if (q->frames)
      for (int k = 0; k < q->frames; k++) frames[k] = md.video.frames[k].rgb;
    else
      frames[0] = md.image.rgb;
    float *pv = NULL;
    int64_t grid[3];
    CHECK_MSG(qwen_vision_patches(&p, frames, q->frames ? q->frames : 1, q->h, q->w, q->frames > 0, &pv, grid, &err) == 0,
              "%s", err.msg);
    const json_t *rg = json_object_get(f.doc, (snprintf(name, sizeof name, "%s.grid_thw", q->name), name));
    for (int a = 0; a < 3; a++) CHECK_EQ_INT(grid[a], json_integer_value(json_array_get(rg, (size_t)a)));
    snprintf(name, sizeof name, "%s.pixel_values", q->name);
    float *ref = fx_arr(&f, name, sh, &nd, &cnt);
    int64_t n = grid[0] * grid[1] * grid[2] * 3 * p.temporal_patch_size * p.patch_size * p.patch_size, bad = 0;
    CHECK_EQ_INT(n, cnt);
    for (int64_t k = 0; ref && pv && k < n && k < cnt; k++) bad += pv[k] != ref[k];
    CHECK_MSG(bad == 0, "%s: %lld of %lld patch values differ", name, (long long)bad, (long long)n);
    fprintf(stderr, "  %-28s grid %lldx%lldx%lld, %lld values, %lld differ\n", name, (long long)grid[0], (long long)grid[1],
            (long long)grid[2], (long long)n, (long long)bad);
    free(ref), free(pv), free(frames);
    free_media(&md);
  }
  json_decref(f.doc);
}

/* ---- Qwen3.5: video sampling and frame times ---- */

/* The sampling the tower asks the decoder for comes from video_preprocessor_config.json (the fixture's
 * do_sample_frames is false: every frame, as transformers then takes them, up to max_frames; with it true,
 * fps 2 and 4 to 768 frames), and the prompt's frame times are transformers' _calculate_timestamps: a 3.52 s clip at 25 fps
 * sampled at frames 0, 14, 29, 44, 58, 72, 87 (7: padded with 87 to 8) has its 4 temporal patches at
 * (0 + 14) / 2 / 25 = 0.28, (29 + 44) / 50 = 1.46, (58 + 72) / 50 = 2.6 and 87 / 25 = 3.48 s. */
static void test_qwen_video_times(void) {
  fx f;
  if (!fx_open(&f, "qwen3_5_vision-f32")) return;
  loaded L;
  if (!load_with_tower(f.dir, MEDIA_VIDEO, "qwen3_5_vision", &L)) {
    unload(&L);
    json_decref(f.doc);
    return;
  }
  media_video_opts vo;
  mm_video_opts(L.t, &vo);
  CHECK(vo.fps == 0 && vo.min_frames == 0 && vo.max_frames == 768); /* every frame, up to max_frames */
  qwen_vision_prep p;
  qwen_vision_prep_default(&p);
  CHECK(p.video_fps == 2 && p.video_min_frames == 4 && p.video_max_frames == 768 && p.video_sample_frames);
  herr err = {0};
  CHECK_MSG(qwen_vision_prep_load(&p, f.dir, &err) == 0, "%s", err.msg);
  CHECK(p.video_fps == 2 && p.video_min_frames == 4 && p.video_max_frames == 768 && !p.video_sample_frames);
  media md;
  if (load_media(&f, &qimgs[0], &md)) {
    static const int64_t idx[7] = {0, 14, 29, 44, 58, 72, 87};
    media v = {.kind = MEDIA_VIDEO};
    v.video = (media_video){.n_frames = 7, .fps = 25, .src_frames = 88, .duration = 3.52};
    v.video.frames = calloc(7, sizeof(media_image));
    v.video.t = calloc(7, sizeof(double));
    v.video.index = calloc(7, sizeof(int64_t));
    for (int i = 0; i < 7; i++) {
      v.video.frames[i] = md.image;
      v.video.index[i] = idx[i];
      v.video.t[i] = idx[i] * 0.04 + 0.001; /* the decoded times: not what the text shows */
    }
    mm_prep pr = {0};
    int rc = mm_prepare(L.t, &v, &pr, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (!rc) {
      CHECK_EQ_INT(pr.grid[0], 4);
      const char *want[4] = {"<0.3 seconds><|vision_start|>", "<1.5 seconds><|vision_start|>", "<2.6 seconds><|vision_start|>",
                             "<3.5 seconds><|vision_start|>"};
      const char *at = pr.text;
      for (int k = 0; k < 4; k++) {
        const char *hit = at ? strstr(at, want[k]) : NULL;
        CHECK_MSG(hit != NULL, "temporal patch %d: no '%s' in the prompt text", k, want[k]);
        at = hit ? hit + 1 : at;
      }
      int n_times = 0;
      for (const char *q = pr.text; q && (q = strstr(q, " seconds>")); q++) n_times++;
      CHECK_EQ_INT(n_times, 4);
    }
    mm_prep_free(&pr);
    free(v.video.frames), free(v.video.t), free(v.video.index);
    free_media(&md);
  }
  unload(&L);
  json_decref(f.doc);
}

/* ---- Qwen3.5: tower, positions, logits ---- */

static void test_qwen_tower(void) {
  fx f;
  if (!fx_open(&f, "qwen3_5_vision-f32")) return;
  loaded L;
  if (!load_with_tower(f.dir, MEDIA_IMAGE, "qwen3_5_vision", &L)) {
    unload(&L);
    json_decref(f.doc);
    return;
  }
  mm_embeds emb[4] = {0};
  for (size_t i = 0; i < sizeof qimgs / sizeof qimgs[0]; i++) {
    media md;
    mm_prep p = {0};
    if (!load_media(&f, &qimgs[i], &md)) continue;
    if (encode(&L, &md, &p, &emb[i])) {
      char name[64];
      snprintf(name, sizeof name, "%s.tower", qimgs[i].name);
      check_close(&f, name, emb[i].rows, emb[i].n_tokens * emb[i].dim, 1e-4);
      CHECK_EQ_INT(emb[i].n_tokens, p.n_tokens);
    }
    mm_prep_free(&p);
    free_media(&md);
  }
  /* prompts: the soft tokens take the media rows in document order (a video: one run per temporal patch) */
  const json_t *prompts = json_object_get(f.doc, "prompts");
  const char *pk;
  const json_t *pe;
  int32_t img_id = (int32_t)json_integer_value(json_object_get(json_object_get(f.doc, "token_ids"), "image"));
  int32_t vid_id = (int32_t)json_integer_value(json_object_get(json_object_get(f.doc, "token_ids"), "video"));
  int64_t V = model_vocab_size(L.m);
  json_object_foreach((json_t *)prompts, pk, pe) {
    const json_t *ids = json_object_get(pe, "ids");
    int n = (int)json_array_size(ids);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n), *pos3 = malloc(sizeof(int32_t) * 3 * (size_t)n);
    int32_t *posv = malloc(sizeof(int32_t) * 3 * (size_t)n);
    int64_t *pos1 = malloc(sizeof(int64_t) * (size_t)n);
    bool *soft = calloc((size_t)n, 1);
    const float **rows = calloc((size_t)n, sizeof(float *));
    /* which medium each run takes its rows from */
    const json_t *imgs = json_object_get(pe, "images"), *vids = json_object_get(pe, "videos");
    size_t ni = 0, nv = 0;
    int64_t off_i = -1, off_v = -1, ns = 0;
    const mm_embeds *ci = NULL, *cv = NULL;
    bool ok = true;
    for (int i = 0; i < n; i++) {
      tok[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
      bool is_img = tok[i] == img_id, is_vid = tok[i] == vid_id;
      soft[i] = is_img || is_vid;
      if (is_img) {
        if (!ci || off_i >= ci->n_tokens) { /* the next image */
          const char *nm = json_string_value(json_array_get(imgs, ni++));
          ci = NULL;
          for (size_t k = 0; nm && k < 4; k++)
            if (!strcmp(qimgs[k].name, nm)) ci = &emb[k];
          off_i = 0;
        }
        if (!ci || !ci->rows || off_i >= ci->n_tokens) { ok = false; break; }
        rows[i] = ci->rows + off_i * ci->dim;
        memcpy(pos3 + 3 * ns, ci->pos3 + 3 * off_i, sizeof(int32_t) * 3);
        off_i++, ns++;
      } else if (is_vid) {
        if (!cv || off_v >= cv->n_tokens) {
          const char *nm = json_string_value(json_array_get(vids, nv++));
          cv = NULL;
          for (size_t k = 0; nm && k < 4; k++)
            if (!strcmp(qimgs[k].name, nm)) cv = &emb[k];
          off_v = 0;
        }
        if (!cv || !cv->rows || off_v >= cv->n_tokens) { ok = false; break; }
        rows[i] = cv->rows + off_v * cv->dim;
        memcpy(pos3 + 3 * ns, cv->pos3 + 3 * off_v, sizeof(int32_t) * 3);
        off_v++, ns++;
      }
    }
    CHECK_MSG(ok, "%s: the media rows do not cover its soft tokens", pk);
    if (ok) {
      int64_t next = mm_positions3(soft, pos3, n, posv);
      CHECK_EQ_INT(next - n, json_integer_value(json_object_get(pe, "rope_delta")));
      char name[64];
      snprintf(name, sizeof name, "%s.positions", pk);
      int64_t sh[4], cnt;
      int nd;
      int32_t *ref = fx_arr(&f, name, sh, &nd, &cnt);
      int64_t bad = 0;
      for (int i = 0; ref && cnt == 3LL * n && i < n; i++)
        for (int a = 0; a < 3; a++) bad += posv[3 * i + a] != ref[(int64_t)a * n + i];
      CHECK_MSG(ref && cnt == 3LL * n && bad == 0, "%s: %lld positions differ", name, (long long)bad);
      free(ref);
      for (int i = 0; i < n; i++) pos1[i] = posv[3 * i];
      float *lg = malloc(sizeof(float) * (size_t)(n * V));
      /* in one piece, then in chunks of 7 tokens (chunks end inside the media spans) */
      for (int chunk = 0; chunk <= 7; chunk += 7) {
        int rc = forward_all(&L, tok, n, rows, posv, pos1, lg, chunk);
        CHECK_MSG(rc == 0, "%s: forward failed", pk);
        if (rc) break;
        snprintf(name, sizeof name, "%s.logits", pk);
        int64_t s2[4], c2;
        float *rl = fx_arr(&f, name, s2, &nd, &c2);
        if (rl && c2 == n * V) {
          double d = max_diff(lg, rl, n * V);
          CHECK_MSG(d <= 1e-4, "%s (chunks of %d): max abs logit error %.3g > 1e-4", pk, chunk, d);
          fprintf(stderr, "  %-28s %d tokens, chunks of %d: max abs logit error %.3g (tol 1e-4)\n", pk, n, chunk, d);
        } else
          CHECK_MSG(0, "%s: no reference logits", pk);
        free(rl);
      }
      /* the greedy continuation of the image prompt: later tokens at their index plus the prompt's delta */
      const json_t *gr = json_object_get(json_object_get(pe, "greedy"), "ids");
      if (gr && json_array_size(gr) > 0) {
        int steps = (int)json_array_size(gr);
        int32_t *all = malloc(sizeof(int32_t) * (size_t)(n + steps));
        int32_t *p3 = malloc(sizeof(int32_t) * 3 * (size_t)(n + steps));
        int64_t *p1 = malloc(sizeof(int64_t) * (size_t)(n + steps)), delta = json_integer_value(json_object_get(pe, "rope_delta"));
        const float **rw = calloc((size_t)(n + steps), sizeof(float *));
        memcpy(all, tok, sizeof(int32_t) * (size_t)n);
        memcpy(p3, posv, sizeof(int32_t) * 3 * (size_t)n);
        memcpy(p1, pos1, sizeof(int64_t) * (size_t)n);
        memcpy(rw, rows, sizeof(float *) * (size_t)n);
        herr err = {0};
        kv_seq *sq;
        float *row = malloc(sizeof(float) * (size_t)V);
        int agree = 0;
        if (!kv_cache_seq_new(L.kv, &sq, &err)) {
          int cur = 0, len = n;
          for (int st = 0; st < steps; st++) {
            model_seq q = {.kv = sq, .tokens = all + cur, .n_tokens = len - cur, .embeds = rw + cur, .positions3 = p3 + 3 * cur,
                           .positions = p1 + cur};
            model_batch bb = {&q, 1};
            if (model_forward(L.m, &bb, row, &err)) break;
            int best = 0;
            for (int64_t v = 1; v < V; v++)
              if (row[v] > row[best]) best = (int)v;
            agree += best == json_integer_value(json_array_get(gr, (size_t)st));
            cur = len;
            all[len] = (int32_t)json_integer_value(json_array_get(gr, (size_t)st)); /* follow the reference */
            for (int a = 0; a < 3; a++) p3[3 * len + a] = (int32_t)(len + delta);
            p1[len] = len + delta;
            len++;
          }
          kv_cache_seq_free(sq);
        }
        CHECK_MSG(agree == steps, "%s: %d of %d greedy tokens agree", pk, agree, steps);
        fprintf(stderr, "  %-28s greedy: %d of %d tokens agree\n", pk, agree, steps);
        free(all), free(p3), free(p1), free(rw), free(row);
      }
      free(lg);
    }
    free(tok), free(pos3), free(posv), free(pos1), free(soft), free(rows);
  }
  for (int i = 0; i < 4; i++) mm_embeds_free(&emb[i]);
  unload(&L);
  json_decref(f.doc);
}

/* ---- Gemma-4 audio ---- */

static float *read_pcm(const fx *f, const char *name, int64_t *n) {
  char path[700];
  snprintf(path, sizeof path, "%s/%s.pcm", f->dir, name);
  size_t bytes;
  float *p = read_all(path, &bytes);
  CHECK_MSG(p != NULL, "%s", path);
  *n = (int64_t)(bytes / 4);
  return p;
}

static void test_gemma4_audio_features(void) {
  fx f;
  if (!fx_open(&f, "gemma4_audio-f32")) return;
  static const char *clips[] = {"clip_a", "clip_b"};
  for (int c = 0; c < 2; c++) {
    int64_t n;
    float *pcm = read_pcm(&f, clips[c], &n);
    if (!pcm) continue;
    /* the default extractor, one with preemphasis (HTK), FFT overdrive, scale and per-bin statistics, one plain preemphasis */
    for (int variant = 0; variant < 3; variant++) {
      gemma4_audio_prep p;
      gemma4_audio_prep_default(&p);
      herr err = {0};
      const char *tag = variant == 0 ? "features" : variant == 1 ? "features_alt" : "features_alt2";
      if (variant == 0) CHECK_MSG(gemma4_audio_prep_load(&p, f.dir, &err) == 0, "%s", err.msg);
      const json_t *alt = json_object_get(f.doc, variant == 1 ? "feature_extractor_alt" : "feature_extractor_alt2");
      if (variant > 0) {
        p.preemphasis = json_number_value(json_object_get(alt, "preemphasis"));
        p.preemphasis_htk_flavor = json_is_true(json_object_get(alt, "preemphasis_htk_flavor"));
      }
      if (variant == 1) {
        p.fft_overdrive = json_is_true(json_object_get(alt, "fft_overdrive"));
        p.input_scale_factor = json_number_value(json_object_get(alt, "input_scale_factor"));
        p.mel_floor = json_number_value(json_object_get(alt, "mel_floor"));
        const json_t *mn = json_object_get(alt, "per_bin_mean"), *sd = json_object_get(alt, "per_bin_stddev");
        for (int i = 0; i < p.feature_size; i++) {
          p.per_bin_mean[i] = json_number_value(json_array_get(mn, (size_t)i));
          p.per_bin_stddev[i] = json_number_value(json_array_get(sd, (size_t)i));
        }
        p.has_mean = p.has_std = true;
      }
      float *feat;
      uint8_t *mask;
      int64_t frames;
      CHECK_MSG(gemma4_audio_features(&p, pcm, n, &feat, &mask, &frames, &err) == 0, "%s", err.msg);
      char name[64];
      snprintf(name, sizeof name, "%s.%s", clips[c], tag);
      int64_t sh[4], cnt;
      int nd;
      float *ref = fx_arr(&f, name, sh, &nd, &cnt);
      CHECK_MSG(ref && sh[0] == frames && sh[1] == p.feature_size, "%s: %lld frames, the reference %lld", name,
                (long long)frames, (long long)sh[0]);
      if (ref && cnt == frames * p.feature_size) {
        double d = max_diff(feat, ref, cnt);
        CHECK_MSG(d <= 1e-6, "%s: max abs error %.3g > 1e-6", name, d);
        fprintf(stderr, "  %-28s %lld frames: max abs error %.3g (tol 1e-6)\n", name, (long long)frames, d);
      }
      snprintf(name, sizeof name, "%s.%s", clips[c], variant == 0 ? "mask" : variant == 1 ? "features_alt_mask" : "features_alt2_mask");
      int32_t *rm = fx_arr(&f, name, sh, &nd, &cnt);
      int64_t bad = 0;
      for (int64_t i = 0; rm && i < cnt && i < frames; i++) bad += (rm[i] != 0) != (mask[i] != 0);
      CHECK_MSG(rm && cnt == frames && bad == 0, "%s: %lld frames' mask differs", name, (long long)bad);
      if (variant == 0) /* the processor's count (Gemma4Processor._compute_audio_num_tokens) */
        CHECK_EQ_INT(gemma4_audio_num_tokens(&p, n),
                     json_integer_value(json_object_get(json_object_get(f.doc, "processor_audio_num_tokens"), clips[c])));
      free(ref), free(rm), free(feat), free(mask);
    }
    free(pcm);
  }
  json_decref(f.doc);
}

/* The logits at every position of the fixture's prompt p_audio, its audio tokens taking the rows
 * rows[0 .. n_rows) of dim floats in order, against the reference: in one piece, then in chunks of 7
 * tokens (1e-4 absolute, as the text golden tests). */
static void check_audio_prompt(loaded *L, const fx *f, const float *rows, int64_t n_rows, int64_t dim, const char *what) {
  const json_t *pe = json_object_get(json_object_get(f->doc, "prompts"), "p_audio");
  if (!pe) {
    fprintf(stderr, "  %-28s no reference prompt in the fixture: the logits are not compared\n", "p_audio");
    return;
  }
  int32_t aud = (int32_t)json_integer_value(json_object_get(json_object_get(f->doc, "token_ids"), "audio"));
  const json_t *ids = json_object_get(pe, "ids");
  int n = (int)json_array_size(ids);
  int64_t V = model_vocab_size(L->m), k = 0;
  CHECK_EQ_INT(dim, L->m->cfg.hidden_size);
  int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
  const float **in = calloc((size_t)n, sizeof(float *));
  for (int i = 0; i < n; i++) {
    tok[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
    if (tok[i] == aud && k < n_rows) in[i] = rows + (k++) * dim;
  }
  CHECK_EQ_INT(k, n_rows);
  float *lg = malloc(sizeof(float) * (size_t)(n * V));
  int64_t sh[4], cnt;
  int nd;
  float *rl = fx_arr(f, "p_audio.logits", sh, &nd, &cnt);
  CHECK_MSG(rl && cnt == n * V, "p_audio: no reference logits for %d tokens", n);
  for (int chunk = 0; rl && cnt == n * V && chunk <= 7; chunk += 7) {
    int rc = forward_all(L, tok, n, in, NULL, NULL, lg, chunk);
    CHECK_MSG(rc == 0, "p_audio: forward failed");
    if (rc) break;
    double d = max_diff(lg, rl, n * V);
    CHECK_MSG(d <= 1e-4, "p_audio (%s, chunks of %d): max abs logit error %.3g > 1e-4", what, chunk, d);
    fprintf(stderr, "  %-28s %d tokens, %s, chunks of %d: max abs logit error %.3g (tol 1e-4)\n", "p_audio", n, what, chunk, d);
  }
  free(rl), free(lg), free(tok), free(in);
}

static void test_gemma4_audio_tower(void) {
  fx f;
  if (!fx_open(&f, "gemma4_audio-f32")) return;
  loaded L;
  if (!load_with_tower(f.dir, MEDIA_AUDIO, "gemma4_audio", &L)) {
    unload(&L);
    json_decref(f.doc);
    return;
  }
  /* The tower's reference holds when transformers built its mask as a boolean (sdpa, its default):
   * Gemma4AudioAttention applies the mask with logical_not, which inverts the additive float mask
   * made under eager (each frame then attends to the keys it must not see). A fixture made under
   * eager still holds the features (test_gemma4_audio_features) and the language model's logits
   * given its soft tokens, compared below. */
  const json_t *ai = json_object_get(f.doc, "audio_attn_implementation");
  bool tower_ref = json_is_string(ai) && !strcmp(json_string_value(ai), "sdpa");
  static const char *clips[] = {"clip_a", "clip_b"};
  mm_embeds emb[2] = {0};
  for (int c = 0; c < 2; c++) {
    int64_t n;
    media md = {.kind = MEDIA_AUDIO};
    md.audio.pcm = read_pcm(&f, clips[c], &n);
    md.audio.n = n;
    mm_prep p = {0};
    if (md.audio.pcm && encode(&L, &md, &p, &emb[c])) {
      char name[64];
      snprintf(name, sizeof name, "%s.soft_tokens", clips[c]);
      CHECK_EQ_INT(emb[c].n_tokens,
                   json_integer_value(json_object_get(json_object_get(f.doc, "processor_audio_num_tokens"), clips[c])));
      bool finite = true;
      for (int64_t k = 0; k < emb[c].n_tokens * emb[c].dim; k++) finite &= isfinite(emb[c].rows[k]) != 0;
      CHECK_MSG(finite, "%s: non-finite soft tokens", name);
      if (!json_object_get(json_object_get(f.doc, "arrays"), name)) {
        fprintf(stderr, "  %-28s no reference in the fixture: the tower's values are not compared\n", name);
      } else if (!tower_ref) {
        fprintf(stderr, "  %-28s the reference's audio mask was built under eager (applied inverted): not compared\n", name);
      } else {
        /* the reference holds every frame's row; the tower keeps the valid ones (a prefix) */
        int64_t sh[4], cnt;
        int nd;
        float *ref = fx_arr(&f, name, sh, &nd, &cnt);
        if (ref) {
          CHECK_MSG(emb[c].n_tokens <= sh[0] && sh[1] == emb[c].dim, "%s: %lld rows of %lld", name,
                    (long long)emb[c].n_tokens, (long long)emb[c].dim);
          int64_t k = emb[c].n_tokens * emb[c].dim;
          double scale = max_abs(ref, k), d = max_diff(emb[c].rows, ref, k), lim = 1e-4 * (scale > 1 ? scale : 1);
          CHECK_MSG(d <= lim, "%s: max abs error %.3g > %.3g", name, d, lim);
          fprintf(stderr, "  %-28s %lld tokens: max abs error %.3g (tol %.3g)\n", name, (long long)emb[c].n_tokens, d, lim);
        }
        free(ref);
      }
    }
    mm_prep_free(&p);
    free(md.audio.pcm);
  }
  /* the prompt holding clip_a: with the reference's soft tokens (its valid rows, a prefix), then with the tower's */
  if (json_object_get(json_object_get(f.doc, "arrays"), "clip_a.soft_tokens")) {
    int64_t sh[4], cnt;
    int nd;
    float *ref = fx_arr(&f, "clip_a.soft_tokens", sh, &nd, &cnt);
    int64_t valid = json_integer_value(json_object_get(f.doc, "clip_a.num_soft_tokens"));
    CHECK_MSG(ref && nd == 2 && valid > 0 && valid <= sh[0], "clip_a.soft_tokens: %lld valid of %lld rows", (long long)valid,
              (long long)sh[0]);
    if (ref && nd == 2 && valid > 0 && valid <= sh[0]) check_audio_prompt(&L, &f, ref, valid, sh[1], "the reference's soft tokens");
    free(ref);
  }
  if (tower_ref && emb[0].rows) check_audio_prompt(&L, &f, emb[0].rows, emb[0].n_tokens, emb[0].dim, "the tower's soft tokens");
  for (int c = 0; c < 2; c++) mm_embeds_free(&emb[c]);
  unload(&L);
  json_decref(f.doc);
}

/* get_rope_index by hand: two text tokens, an image of 2 x 3 merged tokens, a video of two temporal
 * patches of 1 x 2 with a timestamp token between them, two text tokens. */
static void test_positions(void) {
  const bool s2[14] = {0, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0, 1, 0};
  int32_t pos3[] = {0, 0, 0, 0, 0, 1, 0, 0, 2, 0, 1, 0, 0, 1, 1, 0, 1, 2, /* the image */
                    0, 0, 0, 0, 0, 1,                                     /* video, first temporal patch */
                    0, 0, 0};                                             /* its second (one token of it) */
  int32_t out[14 * 3];
  int64_t next = mm_positions3(s2, pos3, 14, out);
  static const int32_t want[14][3] = {{0, 0, 0}, {1, 1, 1}, {2, 2, 2}, {2, 2, 3}, {2, 2, 4}, {2, 3, 2}, {2, 3, 3},
                                      {2, 3, 4}, {5, 5, 5}, {6, 6, 6}, {6, 6, 7}, {8, 8, 8}, {9, 9, 9}, {10, 10, 10}};
  for (int i = 0; i < 14; i++)
    for (int a = 0; a < 3; a++) CHECK_EQ_INT(out[3 * i + a], want[i][a]);
  CHECK_EQ_INT(next, 11);
}

int main(void) {
  test_device_or_skip();
  RUN(test_positions);
  RUN(test_resize);
  RUN(test_qwen_preprocess);
  RUN(test_qwen_video_times);
  RUN(test_qwen_tower);
  RUN(test_gemma4_audio_features);
  RUN(test_gemma4_audio_tower);
  TEST_MAIN_END();
}
