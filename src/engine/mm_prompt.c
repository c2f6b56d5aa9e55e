/* mm_prompt.c — a prompt holding media made ready for the scheduler (mm_prompt.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/hash.h"
#include "engine/mm_prompt.h"
#include "media/media.h"
#include "model/mm_positions.h"

static const char *tower_word(media_kind k) { return k == MEDIA_IMAGE ? "vision" : k == MEDIA_AUDIO ? "audio" : "video"; }

const char *mm_prompt_placeholder(const model *m, media_kind k) {
  const mm_tower *t = model_tower(m, k);
  return t ? mm_placeholder(t, k) : NULL;
}

void mm_prompt_free(mm_prompt *p) {
  if (!p) return;
  free(p->ids);
  free(p->embeds);
  free(p->bidir_last);
  free(p->positions3);
  free(p->keys);
  for (int i = 0; i < p->n_enc; i++) mm_embeds_free(&p->enc[i]);
  free(p->enc);
  memset(p, 0, sizeof *p);
}

/* The medium's message and field: "name: message". */
static int media_fail(herr *err, const hearth_media *md, int i, int code, const char *msg) {
  char where[48];
  if (md->name) snprintf(where, sizeof where, "%s", md->name);
  else snprintf(where, sizeof where, "given[%d]", i);
  return herr_set_at(err, code, where, HEARTH_CAUSE_NONE, "%s: %s", where, msg);
}

int mm_prompt_build(model *m, const char *model_name, const tokenizer *tok, const char *text, size_t len, bool add_special,
                    const hearth_media *given, int n_media, const mm_prompt_opts *o, mm_prompt *out, herr *err) {
  memset(out, 0, sizeof *out);
  int rc = 0;
  herr e = {0};
  media *dec = calloc((size_t)n_media, sizeof *dec);
  mm_prep *prep = calloc((size_t)n_media, sizeof *prep);
  hbuf text_out = {0};
  out->enc = calloc((size_t)n_media, sizeof *out->enc);
  if (!dec || !prep || !out->enc) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto done;
  }
  media_limits lim;
  media_limits_default(&lim);
  if (o && o->max_bytes) lim.max_bytes = o->max_bytes;
  media_source_opts so = {.allow_files = o && o->allow_local, .allow_remote = o && o->allow_remote, .bare_base64 = true,
                          .allow_private_hosts = o && o->allow_private_hosts, .lim = &lim};
  /* decode and prepare each medium (a medium the model cannot take is refused before it is read) */
  for (int i = 0; i < n_media; i++) {
    const hearth_media *md = &given[i];
    if ((unsigned)md->kind >= MEDIA_KINDS) {
      rc = media_fail(err, md, i, HEARTH_EINVAL, "unknown media kind");
      goto done;
    }
    media_kind k = (media_kind)md->kind;
    const mm_tower *t = model_tower(m, k);
    if (!t) {
      char msg[200];
      snprintf(msg, sizeof msg, "model %s has no %s tower: it cannot take %s", model_name, tower_word(k),
               k == MEDIA_IMAGE ? "images" : k == MEDIA_AUDIO ? "audio" : "video");
      rc = media_fail(err, md, i, HEARTH_EINVAL, msg);
      goto done;
    }
    media_video_opts vo;
    mm_video_opts(t, &vo);
    herr_clear(&e);
    if (md->url) rc = media_load(k, md->url, &so, &vo, &dec[i], &e);
    else if (!md->data || md->len == 0) rc = herr_set(&e, HEARTH_EINVAL, "no data");
    else if (k == MEDIA_IMAGE) rc = media_decode_image(md->data, md->len, &lim, &dec[i], &e);
    else if (k == MEDIA_AUDIO) rc = media_decode_audio(md->data, md->len, &lim, &dec[i], &e);
    else rc = media_decode_video(md->data, md->len, &lim, &vo, &dec[i], &e);
    if (!rc) rc = mm_prepare(t, &dec[i], &prep[i], &e);
    if (rc) {
      rc = media_fail(err, md, i, rc == HEARTH_ENOMEM ? HEARTH_ENOMEM : rc == HEARTH_EUNSUPPORTED ? HEARTH_EUNSUPPORTED : HEARTH_EINVAL,
                      e.msg);
      goto done;
    }
  }
  /* the placeholders, in document order, each replaced by its medium's text */
  {
    const char *ph[MEDIA_KINDS];
    for (int k = 0; k < MEDIA_KINDS; k++) ph[k] = mm_prompt_placeholder(m, (media_kind)k);
    size_t at = 0, last = 0;
    int next = 0;
    while (at < len) {
      int hit = -1;
      size_t hl = 0;
      const char *hp = "";
      for (int k = 0; k < MEDIA_KINDS; k++) {
        size_t l = ph[k] ? strlen(ph[k]) : 0;
        if (l && l > hl && at + l <= len && !memcmp(text + at, ph[k], l)) hit = k, hl = l, hp = ph[k];
      }
      if (hit < 0) {
        at++;
        continue;
      }
      if (next >= n_media || (int)given[next].kind != hit) {
        char msg[300];
        snprintf(msg, sizeof msg, "the prompt's %s placeholder %d ('%s') has no %s given for it in that place", media_kind_name((media_kind)hit),
                 next + 1, hp, media_kind_name((media_kind)hit));
        rc = next < n_media ? media_fail(err, &given[next], next, HEARTH_EINVAL, msg) : herr_set(err, HEARTH_EINVAL, "%s", msg);
        goto done;
      }
      hbuf_append(&text_out, text + last, at - last);
      hbuf_puts(&text_out, prep[next].text);
      next++;
      at += hl;
      last = at;
    }
    hbuf_append(&text_out, text + last, len - last);
    if (next < n_media) {
      char msg[300];
      const char *p = ph[given[next].kind];
      snprintf(msg, sizeof msg, "the prompt has no place for this %s: %d placeholder%s ('%s' and the like) for %d media",
               media_kind_name((media_kind)given[next].kind), next, next == 1 ? "" : "s", p ? p : "?", n_media);
      rc = media_fail(err, &given[next], next, HEARTH_EINVAL, msg);
      goto done;
    }
    if (text_out.oom) {
      rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
      goto done;
    }
  }
  if ((rc = tokenizer_encode(tok, text_out.data ? text_out.data : "", text_out.len, add_special, true, &out->ids, &out->n, err)))
    goto done;
  /* encode each medium */
  for (int i = 0; i < n_media; i++) {
    herr_clear(&e);
    if ((rc = mm_encode(m, &prep[i], &out->enc[i], &e))) {
      rc = media_fail(err, &given[i], i, rc, e.msg);
      goto done;
    }
    out->n_enc = i + 1;
  }
  /* per token: each medium's rows go to the next rows with its soft token's id, in order */
  size_t n = out->n;
  out->embeds = calloc(n ? n : 1, sizeof *out->embeds);
  out->keys = malloc(sizeof(int32_t) * (n ? n : 1));
  bool *soft = calloc(n ? n : 1, sizeof *soft);
  int *owner = malloc(sizeof(int) * (n ? n : 1));
  if (!out->embeds || !out->keys || !soft || !owner) {
    free(soft), free(owner);
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto done;
  }
  memcpy(out->keys, out->ids, sizeof(int32_t) * n);
  bool any_bidir = false, any_pos3 = false;
  {
    size_t cursor[MEDIA_KINDS] = {0};
    for (int i = 0; i < n_media && !rc; i++) {
      media_kind k = prep[i].kind;
      int64_t got = 0;
      size_t t = cursor[k];
      for (; t < n && got < prep[i].n_tokens; t++) {
        if (out->ids[t] != prep[i].soft_id) continue;
        out->embeds[t] = out->enc[i].rows + got * out->enc[i].dim;
        /* the key: the medium's content hash and the row's place in it; negative, never a token id */
        uint64_t h = hmix64(dec[i].hash ^ hmix64((uint64_t)got + HMIX64_GAMMA));
        out->keys[t] = (int32_t)(0x80000000u | (uint32_t)(h & 0x7fffffffu));
        soft[t] = true;
        owner[t] = i;
        got++;
      }
      cursor[k] = t;
      if (got != prep[i].n_tokens) {
        char msg[200];
        snprintf(msg, sizeof msg, "the tokenized prompt holds %lld of its %lld soft tokens", (long long)got,
                 (long long)prep[i].n_tokens);
        rc = media_fail(err, &given[i], i, HEARTH_EINTERNAL, msg);
      }
      any_bidir |= out->enc[i].bidirectional;
      any_pos3 |= out->enc[i].pos3 != NULL;
    }
    /* soft tokens of a kind beyond its media: the text itself wrote the soft token */
    for (size_t t = 0; t < n && !rc; t++)
      if (!soft[t])
        for (int i = 0; i < n_media; i++)
          if (out->ids[t] == prep[i].soft_id) {
            rc = herr_set(err, HEARTH_EINVAL, "the prompt's text holds %s soft tokens of its own (token %zu)",
                          media_kind_name(prep[i].kind), t);
            break;
          }
  }
  if (!rc && any_bidir) { /* each run of a bidirectional medium's rows sees up to the run's end */
    if (!(out->bidir_last = malloc(sizeof(int32_t) * n))) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    for (size_t t = 0; !rc && t < n;) {
      if (!soft[t] || !out->enc[owner[t]].bidirectional) {
        out->bidir_last[t++] = -1;
        continue;
      }
      size_t e2 = t;
      while (e2 + 1 < n && soft[e2 + 1] && owner[e2 + 1] == owner[t]) e2++;
      for (size_t u = t; u <= e2; u++) out->bidir_last[u] = (int32_t)e2;
      t = e2 + 1;
    }
  }
  if (!rc && any_pos3) { /* multimodal RoPE over the whole prompt */
    int64_t n_soft = 0;
    for (size_t t = 0; t < n; t++) n_soft += soft[t];
    int32_t *p3 = malloc(sizeof(int32_t) * 3 * (size_t)(n_soft ? n_soft : 1));
    out->positions3 = malloc(sizeof(int32_t) * 3 * (n ? n : 1));
    if (!p3 || !out->positions3) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    for (size_t t = 0, j = 0; !rc && t < n; t++) {
      if (!soft[t]) continue;
      const mm_embeds *en = &out->enc[owner[t]];
      int64_t r = (out->embeds[t] - en->rows) / en->dim;
      for (int a = 0; a < 3; a++) p3[3 * j + a] = en->pos3 ? en->pos3[3 * r + a] : (int32_t)r;
      j++;
    }
    if (!rc) out->pos_delta = mm_positions3(soft, p3, (int64_t)n, out->positions3) - (int64_t)n;
    free(p3);
  }
  free(soft), free(owner);
done:
  for (int i = 0; i < n_media && dec; i++) media_free(&dec[i]);
  for (int i = 0; i < n_media && prep; i++) mm_prep_free(&prep[i]);
  free(dec), free(prep);
  hbuf_free(&text_out);
  if (rc) mm_prompt_free(out);
  return rc;
}
