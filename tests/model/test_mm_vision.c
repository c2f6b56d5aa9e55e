/* test_mm_vision.c — Gemma 4's vision tower against transformers
 * (tests/fixtures/mm/gemma4_vision-f32, made by tools/gen_mm_golden.py):
 *   preprocessing exact: PIL's bicubic resize of the test images (one
 *   enlarged, one shrunk), the patches after rescaling and their positions,
 *   for the PNG's pixels and for the JPEG's pixels as PIL decoded them;
 *   the tower: the soft tokens after pooling, standardization and the
 *   embedder (the golden tolerance: 1e-4 of the larger of 1 and the
 *   reference's largest value);
 *   the language model: logits at every position of prompts holding one and
 *   two images, rendered by the processor (1e-4 absolute, as the text golden
 *   tests), with the images' rows spliced in (model_seq.embeds) and their
 *   bidirectional spans on the sliding layers (model_seq.bidir_last), in one
 *   forward and in chunks that keep each span whole; and the same prompt
 *   without the spans, against the reference run causally, to show the
 *   spans matter. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "engine/kv_cache.h"
#include "model/mm.h"
#include "model/model.h"
#include "test.h"
#include "test_device.h"

#define FX HEARTH_SOURCE_DIR "/tests/fixtures/mm/gemma4_vision-f32"

static json_t *doc;

/* The text golden tests' tolerance on f32 logits. */
#define LOGIT_TOL 1e-4

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

/* The fixture's array `name` (raw little-endian data, malloc'ed) and its element count. */
static void *arr(const char *name, int64_t *count, int64_t shape[4]) {
  const json_t *a = json_object_get(json_object_get(doc, "arrays"), name);
  if (!a) {
    CHECK_MSG(0, "no array '%s' in the fixture", name);
    return NULL;
  }
  const json_t *sh = json_object_get(a, "shape");
  int64_t c = 1;
  for (size_t i = 0; i < json_array_size(sh); i++) {
    int64_t d = json_integer_value(json_array_get(sh, i));
    if (shape && i < 4) shape[i] = d;
    c *= d;
  }
  char path[600];
  snprintf(path, sizeof path, "%s/%s", FX, json_string_value(json_object_get(a, "file")));
  size_t n;
  void *d = read_all(path, &n);
  CHECK_MSG(d != NULL, "%s: cannot read", path);
  *count = c;
  return d;
}

static bool image_of(const char *name, media *out) {
  memset(out, 0, sizeof *out);
  const json_t *im = json_object_get(json_object_get(doc, "images"), name);
  char path[600];
  snprintf(path, sizeof path, "%s/%s.rgb", FX, name);
  size_t n = 0;
  out->kind = MEDIA_IMAGE;
  out->image.w = (int32_t)json_integer_value(json_object_get(im, "w"));
  out->image.h = (int32_t)json_integer_value(json_object_get(im, "h"));
  out->image.rgb = read_all(path, &n);
  CHECK_MSG(out->image.rgb && n == (size_t)out->image.w * out->image.h * 3, "%s: %zu bytes for %dx%d", path, n,
            out->image.w, out->image.h);
  return out->image.rgb != NULL;
}

static double max_abs(const float *x, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
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

static model *load(void) {
  herr err = {0};
  model *m = NULL;
  model_load_opts o = {.threads = 2, .device = test_device()};
  CHECK_MSG(model_load(FX, &o, &m, &err) == 0, "%s", err.msg);
  return m;
}

static const char *const images[] = {"img_a", "img_b", "img_a_jpg"};

/* The pixels the fixture's tower and logits references were computed from: the model's own processor
 * (torchvision's, what mm_prepare does) unless golden.json says "reference_pixels": "pil". */
static void use_reference_pixels(const media *md, mm_prep *p) {
  const char *rp = json_string_value(json_object_get(doc, "reference_pixels"));
  if (rp && strcmp(rp, "pil")) return;
  if (!rp && json_object_get(doc, "reference_pixels")) return;
  if (!rp && !strstr(json_string_value(json_object_get(doc, "reference")) ? json_string_value(json_object_get(doc, "reference")) : "", "PIL")) return;
  const json_t *proc = json_object_get(doc, "processor");
  int P = (int)json_integer_value(json_object_get(proc, "patch_size")), K = (int)json_integer_value(json_object_get(proc, "pooling_kernel_size"));
  int64_t ms = json_integer_value(json_object_get(proc, "max_soft_tokens")), np;
  int h, w;
  herr err = {0};
  float *v;
  int32_t *ps;
  if (gemma4_image_patches(&md->image, P, K, ms, true, 1.0 / 255, &v, &ps, &np, &h, &w, &err) == 0) {
    free(p->values), free(p->pos);
    p->values = v, p->pos = ps;
  }
}

static void test_preprocess(void) {
  model *m = load();
  if (!m) return;
  const mm_tower *t = model_tower(m, MEDIA_IMAGE);
  CHECK(t != NULL);
  CHECK(model_tower(m, MEDIA_AUDIO) == NULL);
  CHECK_EQ_STR(mm_tower_name(t), "gemma4_vision");
  CHECK_EQ_STR(mm_placeholder(t, MEDIA_IMAGE), "<|image|>");
  const json_t *proc = json_object_get(doc, "processor");
  int P = (int)json_integer_value(json_object_get(proc, "patch_size")), K = (int)json_integer_value(json_object_get(proc, "pooling_kernel_size"));
  int64_t maxp = json_integer_value(json_object_get(proc, "max_soft_tokens")) * K * K;
  for (size_t i = 0; t && i < sizeof images / sizeof images[0]; i++) {
    media md;
    if (!image_of(images[i], &md)) continue;
    char name[96];
    int64_t cnt, sh[4];
    /* the resize alone, against PIL's */
    snprintf(name, sizeof name, "%s.resized", images[i]);
    uint8_t *ref = arr(name, &cnt, sh);
    int oh = 0, ow = 0;
    herr err = {0};
    CHECK_MSG(gemma4_image_size(md.image.h, md.image.w, P, maxp, K, &oh, &ow, &err) == 0, "%s", err.msg);
    CHECK_MSG(ref && sh[0] == oh && sh[1] == ow, "%s: resized to %dx%d, PIL to %lldx%lld", images[i], ow, oh, (long long)sh[1],
              (long long)sh[0]);
    if (ref && sh[0] == oh && sh[1] == ow) {
      uint8_t *got = malloc((size_t)oh * ow * 3);
      CHECK(mm_resize_pil(got, ow, oh, md.image.rgb, md.image.w, md.image.h, &err) == 0);
      int64_t bad = 0;
      for (int64_t k = 0; k < cnt; k++) bad += got[k] != ref[k];
      CHECK_MSG(bad == 0, "%s: %lld of %lld resized values differ from PIL's", images[i], (long long)bad, (long long)cnt);
      free(got);
    }
    free(ref);
    /* the processors' output: PIL's and torchvision's, each exact */
    for (int pil = 1; pil >= 0; pil--) {
      float *v = NULL;
      int32_t *ps = NULL;
      int64_t np = 0;
      int h2, w2;
      CHECK_MSG(gemma4_image_patches(&md.image, P, K, maxp / (K * K), pil, 1.0 / 255, &v, &ps, &np, &h2, &w2, &err) == 0, "%s",
                err.msg);
      snprintf(name, sizeof name, pil ? "%s.pixel_values" : "%s.pixel_values_tv", images[i]);
      if (!json_object_get(json_object_get(doc, "arrays"), name)) { /* (kept for one image: PIL's resize is checked above) */
        free(v), free(ps);
        continue;
      }
      float *pv = arr(name, &cnt, sh);
      CHECK_EQ_INT(np * 3 * P * P, cnt);
      int64_t bad = 0;
      for (int64_t k = 0; pv && v && k < cnt && k < np * 3 * P * P; k++) bad += memcmp(&pv[k], &v[k], sizeof(float)) != 0;
      CHECK_MSG(bad == 0, "%s: %lld of %lld pixel values differ", name, (long long)bad, (long long)cnt);
      snprintf(name, sizeof name, "%s.position_ids", images[i]);
      int32_t *pos = arr(name, &cnt, sh);
      CHECK_EQ_INT(np * 2, cnt);
      for (int64_t k = 0; pos && ps && k < cnt && k < np * 2; k++) bad += pos[k] != ps[k];
      CHECK_MSG(bad == 0, "%s: positions differ", name);
      fprintf(stderr, "  %-12s %s: %dx%d -> %dx%d, %lld patches, exact\n", images[i], pil ? "PIL" : "torchvision", md.image.w,
              md.image.h, w2, h2, (long long)np);
      free(pv), free(pos), free(v), free(ps);
    }
    mm_prep p;
    CHECK_MSG(mm_prepare(t, &md, &p, &err) == 0, "%s: %s", images[i], err.msg);
    snprintf(name, sizeof name, "%s.num_soft_tokens", images[i]);
    CHECK_EQ_INT(p.n_tokens, json_integer_value(json_object_get(doc, name)));
    CHECK_EQ_INT(p.soft_id, json_integer_value(json_object_get(json_object_get(doc, "token_ids"), "image")));
    use_reference_pixels(&md, &p);
    /* the tower */
    mm_embeds e;
    CHECK_MSG(mm_encode(m, &p, &e, &err) == 0, "%s: %s", images[i], err.msg);
    snprintf(name, sizeof name, "%s.soft_tokens", images[i]);
    float *st = arr(name, &cnt, sh);
    CHECK_EQ_INT(e.n_tokens * e.dim, cnt);
    if (st && e.rows && e.n_tokens * e.dim == cnt) {
      double scale = max_abs(st, cnt), d = max_diff(e.rows, st, cnt), lim = 1e-4 * (scale > 1 ? scale : 1);
      CHECK_MSG(d <= lim, "%s: max abs error %.3g > %.3g", name, d, lim);
      fprintf(stderr, "  %-24s max abs error %.3g (tol %.3g)\n", name, d, lim);
    }
    CHECK(e.bidirectional);
    free(st);
    mm_embeds_free(&e);
    mm_prep_free(&p);
    free(md.image.rgb);
  }
  model_free(m);
}

/* The logits of prompt `pname` at every position, the images' rows spliced in, in chunks of at most
 * `chunk` tokens that keep each image whole (0: one forward); with spans (bidir) or without. */
static void check_prompt(model *m, const char *pname, int chunk, bool bidir, const char *ref_name) {
  const json_t *pr = json_object_get(json_object_get(doc, "prompts"), pname);
  if (!pr) {
    CHECK_MSG(0, "no prompt %s in the fixture", pname);
    return;
  }
  const json_t *jids = json_object_get(pr, "ids"), *jimg = json_object_get(pr, "images");
  int n = (int)json_array_size(jids);
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)n), *last = malloc(sizeof(int32_t) * (size_t)n);
  const float **rows = calloc((size_t)n, sizeof *rows);
  int32_t image_id = (int32_t)json_integer_value(json_object_get(json_object_get(doc, "token_ids"), "image"));
  for (int i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(jids, (size_t)i));
  /* each image: prepared from its pixels, encoded, its rows on the next run of image tokens */
  mm_embeds enc[4];
  int n_img = (int)json_array_size(jimg), at = 0;
  const mm_tower *t = model_tower(m, MEDIA_IMAGE);
  for (int k = 0; k < n_img && k < 4; k++) {
    media md;
    memset(&enc[k], 0, sizeof enc[k]);
    if (!image_of(json_string_value(json_array_get(jimg, (size_t)k)), &md)) continue;
    mm_prep p;
    herr err = {0};
    CHECK_MSG(mm_prepare(t, &md, &p, &err) == 0, "%s", err.msg);
    use_reference_pixels(&md, &p);
    CHECK_MSG(mm_encode(m, &p, &enc[k], &err) == 0, "%s", err.msg);
    while (at < n && ids[at] != image_id) at++;
    for (int64_t r = 0; r < enc[k].n_tokens && at < n; r++, at++) {
      CHECK_MSG(ids[at] == image_id, "%s: image %d has %lld soft tokens, the prompt fewer", pname, k, (long long)enc[k].n_tokens);
      rows[at] = enc[k].rows + r * enc[k].dim;
    }
    mm_prep_free(&p);
    free(md.image.rgb);
  }
  for (int i = 0; i < n;) { /* spans: the runs of image rows */
    if (!rows[i] || !bidir) {
      last[i++] = -1;
      continue;
    }
    int e = i;
    while (e + 1 < n && rows[e + 1]) e++;
    for (int u = i; u <= e; u++) last[u] = e;
    i = e + 1;
  }
  int64_t V = model_vocab_size(m), cnt;
  float *ref = arr(ref_name, &cnt, NULL), *got = malloc(sizeof(float) * (size_t)(n * V));
  herr err = {0};
  model_kv_geometry geo;
  model_kv_geometry_of(m, &geo);
  kv_cache *kv = NULL;
  kv_seq *s = NULL;
  CHECK_MSG(kv_cache_new(&geo, 0, &kv, &err) == 0 && kv_cache_seq_new(kv, &s, &err) == 0, "%s", err.msg);
  int rc = 0, pieces = 0;
  for (int i0 = 0; s && i0 < n && !rc; pieces++) {
    int len = chunk > 0 && n - i0 > chunk ? chunk : n - i0;
    if (chunk > 0 && last[i0 + len - 1] > i0 + len - 1) { /* a span crosses the end: stop before it, or take it whole */
      int st = i0 + len - 1;
      while (st > i0 && last[st - 1] == last[i0 + len - 1]) st--;
      len = st > i0 ? st - i0 : last[i0 + len - 1] + 1 - i0;
    }
    model_seq sq = {.kv = s, .tokens = ids + i0, .n_tokens = len, .all_logits = true, .embeds = rows + i0,
                    .bidir_last = last + i0};
    model_batch b = {&sq, 1};
    rc = model_forward(m, &b, got + (int64_t)i0 * V, &err);
    CHECK_MSG(rc == 0, "%s: %s", pname, err.msg);
    i0 += len;
  }
  /* the rows the fixture keeps (logits_rows; all when absent), gathered */
  const json_t *kr = json_object_get(pr, "logits_rows");
  int64_t nk = kr ? (int64_t)json_array_size(kr) : n;
  for (int64_t r = 0; r < nk && kr; r++) {
    int64_t src = json_integer_value(json_array_get(kr, (size_t)r));
    if (src >= 0 && src < n) memmove(got + r * V, got + src * V, sizeof(float) * (size_t)V);
  }
  if (ref && cnt == nk * V && !rc) {
    double d = max_diff(got, ref, cnt);
    CHECK_MSG(d <= LOGIT_TOL, "%s (%s, %d pieces): max abs logit error %.3g > %g", pname, bidir ? "bidirectional" : "causal",
              pieces, d, LOGIT_TOL);
    fprintf(stderr, "  %-6s %s, %d tokens in %d piece%s: max abs logit error %.3g (max |logit| %.3g)\n", pname,
            bidir ? "bidirectional" : "causal", n, pieces, pieces == 1 ? "" : "s", d, max_abs(ref, cnt));
    /* greedy: the reference's first token is the argmax of the last row */
    const json_t *g = json_object_get(pr, "greedy");
    if (bidir && json_array_size(g) > 0) {
      const float *lr = got + (nk - 1) * V;
      int64_t best = 0;
      for (int64_t v = 1; v < V; v++) best = lr[v] > lr[best] ? v : best;
      CHECK_EQ_INT(best, json_integer_value(json_array_get(g, 0)));
    }
  } else if (ref) {
    CHECK_MSG(cnt == nk * V, "%s: %lld reference logits for %lld rows", ref_name, (long long)cnt, (long long)nk);
  }
  if (s) kv_cache_seq_free(s);
  if (kv) kv_cache_free(kv);
  for (int k = 0; k < n_img && k < 4; k++) mm_embeds_free(&enc[k]);
  free(ref), free(got), free(ids), free(last), free(rows);
}

static void test_logits(void) {
  model *m = load();
  if (!m) return;
  check_prompt(m, "p_img", 0, true, "p_img.logits");
  check_prompt(m, "p_img", 7, true, "p_img.logits");
  check_prompt(m, "p_two", 0, true, "p_two.logits");
  check_prompt(m, "p_two", 20, true, "p_two.logits");
  check_prompt(m, "p_jpg", 0, true, "p_jpg.logits");
  /* without the spans the sliding layer is causal over the image: transformers' run without
   * mm_token_type_ids; and the two differ, so the spans are tested */
  check_prompt(m, "p_img", 0, false, "p_img.logits_causal");
  int64_t c1, c2;
  float *a = arr("p_img.logits", &c1, NULL), *b = arr("p_img.logits_causal", &c2, NULL);
  if (a && b && c1 == c2) CHECK_MSG(max_diff(a, b, c1) > 1e-3, "the bidirectional spans change nothing (%.3g)", max_diff(a, b, c1));
  free(a), free(b);
  model_free(m);
}

int main(void) {
  test_device_or_skip();
  herr err = {0};
  doc = hjson_load_file(FX "/golden.json", &err);
  if (!doc) {
    fprintf(stderr, "FAIL: %s (tools/gen_mm_golden.py makes the fixture)\n", err.msg);
    return 1;
  }
  RUN(test_preprocess);
  RUN(test_logits);
  json_decref(doc);
  TEST_MAIN_END();
}
