/* mm.c — the media towers beside a language model (mm.h): which tower reads
 * which part of config.json, loading them with the model, and the calls the
 * engine makes (prepare, encode) dispatched to the tower's own functions. */
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "base/log.h"
#include "model/internal.h"
#include "model/mm.h"

struct mm_tower {
  const mm_tower_ops *ops;
  void *state;
};

/* Every tower hearth has. */
static const mm_tower_ops *const mm_tower_table[] = {
    &gemma4_vision_tower,
    &gemma4_audio_tower,
    &qwen3_5_vision_tower,
};

const mm_tower *model_tower(const model *m, media_kind kind) {
  if (!m || (unsigned)kind >= MEDIA_KINDS) return NULL;
  return m->towers[kind];
}

unsigned model_media_kinds(const model *m) {
  unsigned k = 0;
  for (int i = 0; m && i < MEDIA_KINDS; i++)
    if (m->towers[i]) k |= MEDIA_BIT(i);
  return k;
}

const char *mm_tower_name(const mm_tower *t) { return t ? t->ops->name : ""; }

const char *mm_placeholder(const mm_tower *t, media_kind k) { return t->ops->placeholder(t->state, k); }

void mm_video_opts(const mm_tower *t, media_video_opts *out) {
  memset(out, 0, sizeof *out);
  if (t->ops->video_opts) t->ops->video_opts(t->state, out);
}

int mm_prepare(const mm_tower *t, const media *in, mm_prep *out, herr *err) {
  memset(out, 0, sizeof *out);
  if (!(t->ops->kinds & MEDIA_BIT(in->kind)))
    return herr_set(err, HEARTH_EINVAL, "the %s tower takes no %s", t->ops->name, media_kind_name(in->kind));
  int rc = t->ops->prepare(t->state, in, out, err);
  out->tower = t;
  out->kind = in->kind;
  if (rc) mm_prep_free(out);
  return rc;
}

void mm_prep_free(mm_prep *p) {
  if (!p) return;
  if (p->tower && p->tower->ops->prep_free) p->tower->ops->prep_free(p);
  free(p->text);
  free(p->values);
  free(p->pos);
  memset(p, 0, sizeof *p);
}

int mm_encode(model *m, const mm_prep *p, mm_embeds *out, herr *err) {
  memset(out, 0, sizeof *out);
  if (!p->tower) return herr_set(err, HEARTH_EINVAL, "mm_encode: the medium was not prepared");
  pthread_mutex_lock(&m->lock);
  int rc = p->tower->ops->encode(m, p->tower->state, p, out, err);
  pthread_mutex_unlock(&m->lock);
  if (!rc && (out->n_tokens != p->n_tokens || out->dim != m->cfg.hidden_size)) {
    rc = herr_set(err, HEARTH_EINTERNAL, "%s: encoded %lld rows of %lld for %lld soft tokens of %lld", p->tower->ops->name,
                  (long long)out->n_tokens, (long long)out->dim, (long long)p->n_tokens, (long long)m->cfg.hidden_size);
  }
  if (rc) mm_embeds_free(out);
  return rc;
}

void mm_embeds_free(mm_embeds *e) {
  if (!e) return;
  free(e->rows);
  free(e->pos3);
  memset(e, 0, sizeof *e);
}

int mm_towers_load(model *m, const weight_src *src, const char *dir, herr *err) {
  char *path = hpath_join(dir, "config.json");
  if (!path) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  json_t *root = hjson_load_file(path, err);
  free(path);
  if (!root) return err ? err->code : HEARTH_EIO;
  int rc = 0;
  weight_src own = *src;
  own.prefix = NULL; /* towers name their tensors as stored */
  for (size_t i = 0; i < sizeof mm_tower_table / sizeof mm_tower_table[0]; i++) {
    const mm_tower_ops *ops = mm_tower_table[i];
    const json_t *sub = json_object_get(root, ops->config_key);
    if (!json_is_object(sub) || !ops->match(root)) continue;
    for (int k = 0; k < MEDIA_KINDS; k++)
      if ((ops->kinds & MEDIA_BIT(k)) && m->towers[k]) {
        rc = herr_set(err, HEARTH_EFORMAT, "%s: two towers for %s (%s and %s)", dir, media_kind_name((media_kind)k),
                      m->towers[k]->ops->name, ops->name);
        goto done;
      }
    mm_tower *t = calloc(1, sizeof *t);
    if (!t) {
      rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
      goto done;
    }
    t->ops = ops;
    if ((rc = ops->load(m, &own, root, &t->state, err))) {
      free(t);
      herr_wrap(err, "%s: %s", dir, ops->config_key);
      goto done;
    }
    if (!t->state) { /* its weights are not in the folder */
      HLOG_INFO("%s: %s has no weights in the folder: no %s tower", dir, ops->config_key, ops->name);
      free(t);
      continue;
    }
    m->tower_list[m->n_towers++] = t;
    for (int k = 0; k < MEDIA_KINDS; k++)
      if (ops->kinds & MEDIA_BIT(k)) m->towers[k] = t;
  }
done:
  json_decref(root);
  return rc;
}

void mm_towers_free(model *m) {
  for (int i = 0; i < m->n_towers; i++) {
    mm_tower *t = m->tower_list[i];
    if (t->ops->free) t->ops->free(m, t->state);
    free(t);
  }
  m->n_towers = 0;
  memset(m->towers, 0, sizeof m->towers);
}
