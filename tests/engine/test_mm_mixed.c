/* test_mm_mixed.c — one message holding an image and a sound clip, in either
 * order, on a Gemma 4 with both a vision and an audio tower. The committed
 * fixtures have one tower each (tests/fixtures/mm/gemma4_vision-f32 and
 * gemma4_audio-f32, made by tools/gen_mm_golden.py) and different text
 * models, both 64 wide; the model here is assembled at run time in a
 * temporary folder: the vision fixture whole (text model, vision tower,
 * tokenizer, chat template) plus the audio fixture's audio tower and its
 * projection into the text width (model.audio_tower.*, model.embed_audio.*)
 * and its audio_config. What is checked, against the towers' own output in
 * the same run (not against reference values):
 *   mm_prompt_build — both placeholders expanded to the processors' markers
 *   and soft tokens in document order; the rows placed at the image span
 *   are the vision tower's output for the image, those at the audio span
 *   the audio tower's for the clip, row for row; text tokens carry no rows;
 *   the image span is bidirectional and the audio span is not; soft tokens'
 *   cache keys are the media's, not token ids;
 *   the public API — the chat template renders both parts in their order,
 *   generation runs in both orders with as many prompt tokens, the same
 *   greedy tokens come whether the prompt is fed whole, in chunks of 7 or
 *   from the prefix cache, and media given in the other order than their
 *   placeholders are refused; a HEIC image (the fuzz seed made from the
 *   same PNG) takes its place with the clip, and a damaged one is refused
 *   with its part named. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "base/file.h"
#include "engine/mm_prompt.h"
#include "format/safetensors.h"
#include "format/safetensors_write.h"
#include "hearth.h"
#include "media/media.h"
#include "model/mm.h"
#include "model/model.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

#define VIS HEARTH_SOURCE_DIR "/tests/fixtures/mm/gemma4_vision-f32"
#define AUD HEARTH_SOURCE_DIR "/tests/fixtures/mm/gemma4_audio-f32"

static char dir[] = "/tmp/hearth_mm_mixed_XXXXXX";

/* the tensors the assembled file holds: every one of the vision fixture's, the audio tower's of the other */
typedef struct merged {
  st_set vis, aud;
  const st_tensor **src; /* borrowed: one per tensor written */
  int n;
} merged;

static int fill(void *ctx, int i, void *dst, herr *err) {
  (void)err;
  merged *mg = ctx;
  memcpy(dst, mg->src[i]->data, mg->src[i]->nbytes);
  return 0;
}

static bool copy_file(const char *from, const char *to) {
  char *d = NULL;
  size_t n = 0;
  herr err = {0};
  if (hfile_read(from, &d, &n, &err)) return false;
  FILE *fp = fopen(to, "wb");
  bool ok = fp && fwrite(d, 1, n, fp) == n;
  if (fp) fclose(fp);
  free(d);
  return ok;
}

static bool assemble(void) {
  if (!mkdtemp(dir)) return false;
  char path[700];
  static const char *const from_vis[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                         "generation_config.json", "processor_config.json"};
  for (size_t i = 0; i < sizeof from_vis / sizeof *from_vis; i++) {
    char src[700];
    snprintf(src, sizeof src, "%s/%s", VIS, from_vis[i]);
    snprintf(path, sizeof path, "%s/%s", dir, from_vis[i]);
    if (!copy_file(src, path)) return false;
  }
  snprintf(path, sizeof path, "%s/preprocessor_config.json", dir);
  if (!copy_file(AUD "/preprocessor_config.json", path)) return false;
  /* config.json: the vision fixture's, with the audio fixture's audio_config */
  json_error_t je;
  json_t *cv = json_load_file(VIS "/config.json", 0, &je), *ca = json_load_file(AUD "/config.json", 0, &je);
  bool ok = cv && ca && json_is_object(json_object_get(ca, "audio_config"));
  if (ok) {
    json_object_set(cv, "audio_config", json_object_get(ca, "audio_config"));
    snprintf(path, sizeof path, "%s/config.json", dir);
    ok = json_dump_file(cv, path, JSON_INDENT(1)) == 0;
  }
  json_decref(cv), json_decref(ca);
  if (!ok) return false;
  /* model.safetensors */
  merged mg = {0};
  herr err = {0};
  if (st_open(&mg.vis, VIS "/model.safetensors", &err) || st_open(&mg.aud, AUD "/model.safetensors", &err)) {
    CHECK_MSG(0, "%s", err.msg);
    return false;
  }
  mg.src = malloc(sizeof *mg.src * (mg.vis.count + mg.aud.count));
  st_writer *w = st_writer_new();
  for (size_t i = 0; i < mg.vis.count; i++) mg.src[mg.n++] = &mg.vis.tensors[i];
  for (size_t i = 0; i < mg.aud.count; i++) {
    const char *nm = mg.aud.tensors[i].name;
    if (!strncmp(nm, "model.audio_tower.", 18) || !strncmp(nm, "model.embed_audio.", 18)) {
      CHECK_MSG(!st_find(&mg.vis, nm), "%s is in both fixtures", nm);
      mg.src[mg.n++] = &mg.aud.tensors[i];
    }
  }
  for (int i = 0; i < mg.n; i++) st_writer_tensor(w, mg.src[i]->name, mg.src[i]->dtype, mg.src[i]->ndim, mg.src[i]->shape, NULL);
  st_writer_meta(w, "format", "pt");
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  int rc = st_writer_write(w, path, fill, &mg, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  st_writer_free(w);
  free(mg.src);
  st_close(&mg.vis);
  st_close(&mg.aud);
  return rc == 0;
}

static void remove_assembled(void) {
  static const char *const files[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                      "generation_config.json", "processor_config.json", "preprocessor_config.json",
                                      "config.json", "model.safetensors"};
  char path[700];
  for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    unlink(path);
  }
  rmdir(dir);
}

/* A medium decoded and encoded by its tower alone: the reference for what the prompt splices in. */
typedef struct alone {
  mm_prep prep;
  mm_embeds emb;
  bool ok;
} alone;

static void encode_alone(model *m, media_kind k, const char *file, alone *a) {
  memset(a, 0, sizeof *a);
  media md;
  herr err = {0};
  media_source_opts so = {.allow_files = true};
  int rc = media_load(k, file, &so, NULL, &md, &err);
  CHECK_MSG(rc == 0, "%s: %s", file, err.msg);
  if (rc) return;
  const mm_tower *t = model_tower(m, k);
  CHECK_MSG(t != NULL, "no %s tower", media_kind_name(k));
  if (t && !(rc = mm_prepare(t, &md, &a->prep, &err))) rc = mm_encode(m, &a->prep, &a->emb, &err);
  CHECK_MSG(t && rc == 0, "%s: %s", file, err.msg);
  a->ok = t && rc == 0;
  media_free(&md);
}

static void free_alone(alone *a) {
  mm_prep_free(&a->prep);
  mm_embeds_free(&a->emb);
}

/* The index of the first token equal to id at or after from, or -1. */
static long find_id(const mm_prompt *p, int32_t id, size_t from) {
  for (size_t t = from; t < p->n; t++)
    if (p->ids[t] == id) return (long)t;
  return -1;
}

/* One prompt: text with both placeholders in the order image_first says. */
static void check_spliced(model *m, tokenizer *tok, const alone *img, const alone *aud, bool image_first) {
  const char *text = image_first ? "Look <|image|> and hear <|audio|> now." : "Hear <|audio|> and look <|image|> now.";
  hearth_media md[2];
  hearth_media im = {.kind = HEARTH_MEDIA_IMAGE, .url = VIS "/img_a.png", .name = "the image"};
  hearth_media au = {.kind = HEARTH_MEDIA_AUDIO, .url = AUD "/clip_a.wav", .name = "the clip"};
  md[0] = image_first ? im : au, md[1] = image_first ? au : im;
  mm_prompt p;
  herr err = {0};
  mm_prompt_opts o = {.allow_local = true};
  int rc = mm_prompt_build(m, "mixed", tok, text, strlen(text), true, md, 2, &o, &p, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (rc) return;
  CHECK_EQ_INT(p.n_enc, 2);
  /* the spans: each medium's soft tokens, as many as its tower gives rows, in the order of the text */
  const alone *first = image_first ? img : aud, *second = image_first ? aud : img;
  long s1 = find_id(&p, first->prep.soft_id, 0), s2 = find_id(&p, second->prep.soft_id, 0);
  CHECK_MSG(s1 >= 0 && s2 > s1, "soft tokens at %ld and %ld: not in document order", s1, s2);
  if (s1 < 0 || s2 <= s1) {
    mm_prompt_free(&p);
    return;
  }
  int64_t n1 = 0, n2 = 0, n_img = img->prep.n_tokens, n_aud = aud->prep.n_tokens;
  for (size_t t = 0; t < p.n; t++) n1 += p.ids[t] == first->prep.soft_id, n2 += p.ids[t] == second->prep.soft_id;
  CHECK_EQ_INT(n1, first->prep.n_tokens);
  CHECK_EQ_INT(n2, second->prep.n_tokens);
  CHECK(n_img > 0 && n_aud > 0 && img->emb.n_tokens == n_img && aud->emb.n_tokens == n_aud);
  /* contiguous spans; the first ends before the second starts */
  for (long t = s1; t < s1 + (long)first->prep.n_tokens; t++) CHECK_EQ_INT(p.ids[t], first->prep.soft_id);
  for (long t = s2; t < s2 + (long)second->prep.n_tokens; t++) CHECK_EQ_INT(p.ids[t], second->prep.soft_id);
  CHECK(s1 + (long)first->prep.n_tokens <= s2);
  /* every row at a span is the tower's own row, in order; nothing elsewhere */
  int64_t bad = 0, text_rows = 0;
  int64_t D = img->emb.dim;
  CHECK_EQ_INT(aud->emb.dim, D);
  for (size_t t = 0; t < p.n; t++) {
    const alone *a = NULL;
    int64_t r = 0;
    if ((long)t >= s1 && (long)t < s1 + (long)first->prep.n_tokens) a = first, r = (int64_t)t - s1;
    else if ((long)t >= s2 && (long)t < s2 + (long)second->prep.n_tokens) a = second, r = (int64_t)t - s2;
    if (!a) {
      text_rows += p.embeds[t] != NULL;
      CHECK_MSG(p.keys[t] == p.ids[t], "token %zu: key %d for id %d", t, p.keys[t], p.ids[t]);
      continue;
    }
    CHECK_MSG(p.keys[t] < 0, "soft token %zu: key %d", t, p.keys[t]);
    if (!p.embeds[t]) {
      bad++;
      continue;
    }
    for (int64_t d = 0; d < D; d++) bad += p.embeds[t][d] != a->emb.rows[r * D + d];
  }
  CHECK_MSG(bad == 0, "%lld values at the media spans differ from the towers' output", (long long)bad);
  CHECK_EQ_INT(text_rows, 0);
  /* the markers around each span: <|image> ... <image|>, <|audio> ... <audio|> */
  const alone *spans[2] = {first, second};
  long starts[2] = {s1, s2};
  for (int k = 0; k < 2; k++) {
    bool is_img = spans[k] == img;
    int32_t open = is_img ? 513 : 516, close = is_img ? 514 : 517;
    long e = starts[k] + (long)spans[k]->prep.n_tokens;
    CHECK_MSG(starts[k] > 0 && p.ids[starts[k] - 1] == open, "%s span: token before it is %d, want %d", is_img ? "image" : "audio",
              starts[k] > 0 ? p.ids[starts[k] - 1] : -1, open);
    CHECK_MSG((size_t)e < p.n && p.ids[e] == close, "%s span: token after it is %d, want %d", is_img ? "image" : "audio",
              (size_t)e < p.n ? p.ids[e] : -1, close);
  }
  /* bidirectional: the image's span sees to its end, the audio's is causal, text too */
  CHECK(p.bidir_last != NULL);
  long si = image_first ? s1 : s2, sa = image_first ? s2 : s1;
  for (size_t t = 0; p.bidir_last && t < p.n; t++) {
    bool in_img = (long)t >= si && (long)t < si + (long)n_img;
    int32_t want = in_img ? (int32_t)(si + n_img - 1) : -1;
    CHECK_MSG(p.bidir_last[t] == want, "token %zu (%s): bidir_last %d, want %d", t,
              in_img ? "image" : (long)t >= sa && (long)t < sa + (long)n_aud ? "audio" : "text", p.bidir_last[t], want);
  }
  CHECK(p.positions3 == NULL); /* Gemma 4: plain positions */
  fprintf(stderr, "  %s first: %zu tokens, image %lld rows at %ld, audio %lld rows at %ld, all equal to the towers'\n",
          image_first ? "image" : "audio", p.n, (long long)n_img, si, (long long)n_aud, sa);
  mm_prompt_free(&p);
}

static void test_splice(void) {
  model_load_opts mo = {.threads = 2};
  model *m = NULL;
  tokenizer *tok = NULL;
  herr err = {0};
  int rc = model_load(dir, &mo, &m, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (!rc) rc = tokenizer_load(dir, &tok, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (rc) {
    if (m) model_free(m);
    return;
  }
  CHECK(model_tower(m, MEDIA_IMAGE) && model_tower(m, MEDIA_AUDIO));
  alone img, aud;
  encode_alone(m, MEDIA_IMAGE, VIS "/img_a.png", &img);
  encode_alone(m, MEDIA_AUDIO, AUD "/clip_a.wav", &aud);
  if (img.ok && aud.ok) {
    CHECK(img.emb.bidirectional && !aud.emb.bidirectional);
    check_spliced(m, tok, &img, &aud, true);
    check_spliced(m, tok, &img, &aud, false);
  }
  free_alone(&img), free_alone(&aud);
  tokenizer_free(tok);
  model_free(m);
}

typedef struct collected {
  int32_t ids[32];
  int n;
} collected;

static int collect(void *user, const char *text, size_t len, const hearth_token *tok) {
  (void)text, (void)len;
  collected *c = user;
  if (tok && c->n < 32) c->ids[c->n++] = tok->id;
  return 0;
}

static int generate(hearth_model *hm, const char *text, const hearth_media *md, collected *out, hearth_gen_result *res,
                    hearth_error *err) {
  hearth_prompt p = {.text = text, .media = md, .n_media = 2};
  hearth_gen_params g;
  hearth_gen_params_init(&g);
  g.max_tokens = 6;
  g.temperature = 0;
  memset(out, 0, sizeof *out);
  return hearth_generate(hm, &p, &g, collect, out, res, err);
}

static void test_generate(void) {
  hearth_load_opts o = {.threads = 2, .allow_local_media = true};
  hearth_model *hm = NULL;
  hearth_error err = {0};
  CHECK_MSG(hearth_model_load(dir, &o, &hm, &err) == 0, "%s", err.msg);
  if (!hm) return;
  CHECK_EQ_STR(hearth_media_placeholder(hm, HEARTH_MEDIA_IMAGE), "<|image|>");
  CHECK_EQ_STR(hearth_media_placeholder(hm, HEARTH_MEDIA_AUDIO), "<|audio|>");
  hearth_media im = {.kind = HEARTH_MEDIA_IMAGE, .url = VIS "/img_a.png", .name = "messages[0].content[0]"};
  hearth_media au = {.kind = HEARTH_MEDIA_AUDIO, .url = AUD "/clip_a.wav", .name = "messages[0].content[1]"};
  static const char *const msgs[2] = {
      "[{\"role\":\"user\",\"content\":[{\"type\":\"image\"},{\"type\":\"audio\"},{\"type\":\"text\",\"text\":\"What is this?\"}]}]",
      "[{\"role\":\"user\",\"content\":[{\"type\":\"audio\"},{\"type\":\"image\"},{\"type\":\"text\",\"text\":\"What is this?\"}]}]"};
  collected whole[2], again;
  hearth_gen_result r[2], r2;
  for (int order = 0; order < 2; order++) {
    char *text = NULL;
    CHECK_MSG(hearth_chat_render(hm, msgs[order], NULL, true, NULL, &text, &err) == 0, "%s", err.msg);
    if (!text) continue;
    const char *pi = strstr(text, "<|image|>"), *pa = strstr(text, "<|audio|>");
    CHECK_MSG(pi && pa && (order == 0 ? pi < pa : pa < pi), "rendered: %s", text);
    hearth_media md[2] = {order == 0 ? im : au, order == 0 ? au : im};
    CHECK_MSG(generate(hm, text, md, &whole[order], &r[order], &err) == 0, "%s", err.msg);
    CHECK_EQ_INT(whole[order].n, 6);
    /* the same again: from the prefix cache, the same tokens */
    CHECK_MSG(generate(hm, text, md, &again, &r2, &err) == 0, "%s", err.msg);
    CHECK_EQ_INT(r2.prompt_tokens, r[order].prompt_tokens);
    CHECK_MSG(r2.cached_tokens > 0, "%lld cached", (long long)r2.cached_tokens);
    CHECK(again.n == whole[order].n && !memcmp(again.ids, whole[order].ids, sizeof(int32_t) * (size_t)again.n));
    /* the medium in the wrong place: refused, naming it */
    hearth_media swapped[2] = {md[1], md[0]};
    CHECK(generate(hm, text, swapped, &again, &r2, &err) == HEARTH_EINVAL);
    CHECK_MSG(strstr(err.msg, "placeholder"), "%s", err.msg);
    hearth_free(text);
  }
  CHECK_EQ_INT(r[0].prompt_tokens, r[1].prompt_tokens);
  /* a HEIC image with the clip (when built with libheif); a damaged one is refused, naming its part */
  {
    char *text = NULL;
    CHECK_MSG(hearth_chat_render(hm, msgs[0], NULL, true, NULL, &text, &err) == 0, "%s", err.msg);
    hearth_media md[2] = {im, au};
    md[0].url = HEARTH_SOURCE_DIR "/tests/fuzz/seeds/media_image/img.heic";
    collected heic;
    int rc = text ? generate(hm, text, md, &heic, &r2, &err) : HEARTH_EINVAL;
    if (rc != HEARTH_EUNSUPPORTED) {
      CHECK_MSG(rc == 0, "%s", err.msg);
      CHECK_EQ_INT(r2.prompt_tokens, r[0].prompt_tokens); /* as many soft tokens as the PNG it was made from */
    }
    char *d = NULL;
    size_t n = 0;
    herr he = {0};
    if (text && hfile_read(md[0].url, &d, &n, &he) == 0) {
      md[0] = (hearth_media){.kind = HEARTH_MEDIA_IMAGE, .data = d, .len = n / 2, .name = "messages[0].content[0]"};
      rc = generate(hm, text, md, &heic, &r2, &err);
      CHECK_MSG(rc == HEARTH_EINVAL || rc == HEARTH_EUNSUPPORTED, "rc %d", rc);
      CHECK_EQ_STR(err.field, "messages[0].content[0]");
      CHECK_MSG(!strncmp(err.msg, "messages[0].content[0]: ", 24) && strstr(err.msg, "HEIC"), "%s", err.msg);
      free(d);
    }
    hearth_free(text);
  }
  hearth_model_free(hm);
  /* fed in chunks of 7: the same tokens in both orders */
  o.prefill_chunk = 7;
  CHECK_MSG(hearth_model_load(dir, &o, &hm, &err) == 0, "%s", err.msg);
  if (!hm) return;
  for (int order = 0; order < 2; order++) {
    char *text = NULL;
    CHECK_MSG(hearth_chat_render(hm, msgs[order], NULL, true, NULL, &text, &err) == 0, "%s", err.msg);
    if (!text) continue;
    hearth_media md[2] = {order == 0 ? im : au, order == 0 ? au : im};
    collected chunked;
    CHECK_MSG(generate(hm, text, md, &chunked, &r2, &err) == 0, "%s", err.msg);
    CHECK(chunked.n == whole[order].n && !memcmp(chunked.ids, whole[order].ids, sizeof(int32_t) * (size_t)chunked.n));
    hearth_free(text);
  }
  hearth_model_free(hm);
}

int main(void) {
  bool ok = assemble();
  CHECK_MSG(ok, "could not assemble the two-tower model in %s", dir);
  if (ok) {
    RUN(test_splice);
    RUN(test_generate);
  }
  remove_assembled();
  TEST_MAIN_END();
}
