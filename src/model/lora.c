/* lora.c — LoRA adapters on a loaded model: a PEFT adapter folder
 * (format/adapter.h) mapped onto the decoder's projections (attention
 * q/k/v/o, the dense MLP's gate/up/down — or a MoE layer's shared expert —,
 * and the fused qkv_proj / gate_up_proj of families that store them so), its lora_A / lora_B held
 * as f32 tensors in the model's backend, checked against the base's
 * shapes; and the delta each projection of a forward adds on the rows of
 * the sequences that use the adapter (layer_lora, bk_lora per run of rows).
 * Adapters are reference counted; the last release frees the backend
 * memory under the model's lock, so never while a forward runs. What an
 * adapter asks that this cannot honour (expert weights, embeddings, the
 * output head, DoRA, trained biases) is refused when it is loaded. */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "format/adapter.h"
#include "model/internal.h"

static const char *const target_names[LORA_N_TARGETS] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                         "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                         "mlp.down_proj"};

struct model_lora {
  model *m;              /* borrowed */
  char *path;            /* owned */
  uint64_t id;
  uint64_t serial;       /* this load's number (process-wide, never reused) */
  int64_t max_rank, n_mods;
  lora_mod *mods;        /* owned: [layers * LORA_N_TARGETS]; .a.buf NULL where the adapter has nothing */
  bk_buf *buf;           /* owned: every A and B */
  atomic_int refs;
};

/* One module of the adapter file: its name, layer, which projections it feeds. */
typedef struct found_mod {
  char module[256];      /* "model.layers.3.self_attn.q_proj" */
  int layer;
  int first, count;      /* targets first..first+count (a fused projection feeds several) */
  const st_tensor *a, *b;
} found_mod;

/* "….layers.N.REST" → N and REST; false when the name is not in a layer. */
static bool split_layer(const char *module, int *layer, const char **rest) {
  const char *p = strstr(module, "layers.");
  while (p && p != module && p[-1] != '.') p = strstr(p + 1, "layers.");
  if (!p) return false;
  p += 7;
  char *end;
  long l = strtol(p, &end, 10);
  if (end == p || *end != '.' || l < 0 || l > 1 << 20) return false;
  *layer = (int)l;
  *rest = end + 1;
  return true;
}

static int find_target(const char *rest, int *first, int *count, bool *shared) {
  *shared = !strncmp(rest, "mlp.shared_expert.", 18);
  if (*shared) { /* a MoE layer's shared expert (qwen3.5-moe), held where a dense MLP would be */
    char dense[64];
    snprintf(dense, sizeof dense, "mlp.%s", rest + 18);
    for (int t = LORA_GATE; t <= LORA_DOWN; t++)
      if (!strcmp(dense, target_names[t])) {
        *first = t, *count = 1;
        return 0;
      }
    return -1;
  }
  for (int t = 0; t < LORA_N_TARGETS; t++)
    if (!strcmp(rest, target_names[t])) {
      *first = t, *count = 1;
      return 0;
    }
  if (!strcmp(rest, "self_attn.qkv_proj")) {
    *first = LORA_Q, *count = 3;
    return 0;
  }
  if (!strcmp(rest, "mlp.gate_up_proj")) {
    *first = LORA_GATE, *count = 2;
    return 0;
  }
  return -1;
}

/* The base weight under target t of layer l. */
static const bk_weight *target_weight(const layer_weights *lw, int t) {
  switch (t) {
    case LORA_Q: return &lw->q;
    case LORA_K: return &lw->k;
    case LORA_V: return &lw->v;
    case LORA_O: return &lw->o;
    case LORA_GATE: return &lw->gate;
    case LORA_UP: return &lw->up;
    default: return &lw->down;
  }
}

static void lora_free(model_lora *a) {
  if (!a) return;
  if (a->buf) bk_buf_free(a->buf);
  free(a->mods);
  free(a->path);
  free(a);
}

static int load_mods(model *m, const char *dir, const adapter_config *cfg, const st_set *st, model_lora *a, herr *err) {
  const model_config *c = &m->cfg;
  int64_t L = c->num_hidden_layers;
  found_mod *fm = calloc(st->count ? st->count : 1, sizeof *fm);
  if (!fm) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  int n = 0, rc = 0;
  /* every tensor must be a lora_A / lora_B of a projection we run */
  for (size_t i = 0; i < st->count; i++) {
    const char *name = st->tensors[i].name;
    const char *base = name;
    if (!strncmp(base, "base_model.model.", 17)) base += 17;
    const char *suf = strstr(base, ".lora_A.");
    bool is_a = suf != NULL;
    if (!suf) suf = strstr(base, ".lora_B.");
    if (!suf || strcmp(suf + 8, "weight") != 0) {
      if (strstr(name, "lora_magnitude_vector"))
        rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor '%s': DoRA adapters are not supported", dir, name);
      else if (strstr(name, "lora_embedding"))
        rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor '%s': LoRA on embeddings is not supported", dir, name);
      else
        rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor '%s' is not a LoRA lora_A / lora_B weight of a projection", dir, name);
      goto out;
    }
    size_t mlen = (size_t)(suf - base);
    if (mlen >= sizeof fm[0].module) {
      rc = herr_set(err, HEARTH_EFORMAT, "%s: tensor name '%s' is too long", dir, name);
      goto out;
    }
    char module[256];
    memcpy(module, base, mlen);
    module[mlen] = 0;
    int k = 0;
    while (k < n && strcmp(fm[k].module, module) != 0) k++;
    if (k == n) {
      const char *rest;
      int layer, first, count;
      bool shared;
      if (!split_layer(module, &layer, &rest)) {
        rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor '%s': LoRA on '%s' (outside the decoder layers) is not supported", dir,
                      name, module);
        goto out;
      }
      if (find_target(rest, &first, &count, &shared)) {
        rc = herr_set(err, HEARTH_EUNSUPPORTED,
                      "%s: tensor '%s': LoRA on '%s' is not supported (attention q/k/v/o_proj, qkv_proj and the dense MLP's "
                      "gate/up/down_proj, gate_up_proj are%s)",
                      dir, name, rest, strstr(rest, "experts") ? "; not expert weights" : "");
        goto out;
      }
      if (layer >= L) {
        rc = herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s' is for layer %d but the model has %lld layers", dir, name, layer,
                      (long long)L);
        goto out;
      }
      /* the MLP named must be the one the layer has: a shared expert's MLP where a MoE layer keeps one */
      bool has_shared = m->layers[layer].moe && c->shared_expert_intermediate_size > 0;
      if (first >= LORA_GATE && shared != has_shared) {
        rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor '%s': layer %d of this model has no '%s'", dir, name, layer, rest);
        goto out;
      }
      snprintf(fm[k].module, sizeof fm[k].module, "%s", module);
      fm[k].layer = layer, fm[k].first = first, fm[k].count = count;
      n++;
    }
    if (is_a) fm[k].a = &st->tensors[i];
    else fm[k].b = &st->tensors[i];
  }
  /* shapes against the base, the config's targets; sizes */
  size_t total = 0;
  for (int k = 0; k < n; k++) {
    found_mod *f = &fm[k];
    if (!f->a || !f->b) {
      rc = herr_set(err, HEARTH_EFORMAT, "%s: module '%s' has lora_%s but no lora_%s", dir, f->module, f->a ? "A" : "B", f->a ? "B" : "A");
      goto out;
    }
    if (!adapter_config_targets(cfg, f->module, f->layer)) {
      rc = herr_set(err, HEARTH_EFORMAT,
                    "%s: adapter_model.safetensors has a LoRA for '%s', which adapter_config.json's target_modules / "
                    "layers_to_transform do not select",
                    dir, f->module);
      goto out;
    }
    const layer_weights *lw = &m->layers[f->layer];
    if ((f->first == LORA_GATE || f->first == LORA_UP || f->first == LORA_DOWN) && lw->moe && !lw->gate.rows) {
      rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: '%s': layer %d has experts, not a dense MLP", dir, f->module, f->layer);
      goto out;
    }
    int64_t in = target_weight(lw, f->first)->cols, out = 0;
    for (int t = f->first; t < f->first + f->count; t++) {
      const bk_weight *w = target_weight(lw, t);
      if (!w->rows || ((t == LORA_K || t == LORA_V) && lw->kv_src != f->layer)) {
        rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: '%s': layer %d computes no %s of its own", dir, f->module, f->layer,
                      target_names[t]);
        goto out;
      }
      out += w->rows;
    }
    if (f->a->ndim != 2 || f->b->ndim != 2 || !st_dtype_is_float(f->a->dtype) || !st_dtype_is_float(f->b->dtype)) {
      rc = herr_set(err, HEARTH_EFORMAT, "%s: '%s': lora_A and lora_B must be 2-D float tensors", dir, f->module);
      goto out;
    }
    int64_t r = f->a->shape[0];
    if (f->a->shape[1] != in || f->b->shape[0] != out || f->b->shape[1] != r) {
      rc = herr_set(err, HEARTH_EFORMAT,
                    "%s: '%s': lora_A [%lld, %lld] and lora_B [%lld, %lld] do not fit the base projection [%lld, %lld] "
                    "(expected lora_A [r, %lld], lora_B [%lld, r])",
                    dir, f->module, (long long)f->a->shape[0], (long long)f->a->shape[1], (long long)f->b->shape[0],
                    (long long)f->b->shape[1], (long long)out, (long long)in, (long long)in, (long long)out);
      goto out;
    }
    int64_t want = adapter_config_rank(cfg, f->module);
    if (r != want) {
      rc = herr_set(err, HEARTH_EFORMAT, "%s: '%s': the tensors have rank %lld but adapter_config.json says %lld", dir, f->module,
                    (long long)r, (long long)want);
      goto out;
    }
    if (r > a->max_rank) a->max_rank = r;
    total += ((size_t)(r * in) * 4 + 255) / 256 * 256 + ((size_t)(out * r) * 4 + 255) / 256 * 256;
  }
  if (n == 0) {
    rc = herr_set(err, HEARTH_EFORMAT, "%s: adapter_model.safetensors holds no LoRA weights", dir);
    goto out;
  }
  a->n_mods = n;
  a->mods = calloc((size_t)L * LORA_N_TARGETS, sizeof *a->mods);
  if (!a->mods) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto out;
  }
  if ((rc = bk_buf_new(m->be, total, &a->buf, err))) goto out;
  size_t off = 0;
  uint64_t h = hmix64(0x4c6f5241ull + (uint64_t)n);
  for (int k = 0; k < n && !rc; k++) {
    found_mod *f = &fm[k];
    int64_t r = f->a->shape[0], in = f->a->shape[1], out = f->b->shape[0];
    float scale = (float)adapter_config_scale(cfg, f->module, r);
    float *ha = malloc(sizeof(float) * (size_t)(r * in)), *hb = malloc(sizeof(float) * (size_t)(out * r));
    bk_tensor ta = {.buf = a->buf, .off = off, .dt = BK_DT_F32, .rows = r, .cols = in};
    off += ((size_t)(r * in) * 4 + 255) / 256 * 256;
    bk_tensor tb = {.buf = a->buf, .off = off, .dt = BK_DT_F32, .rows = out, .cols = r};
    off += ((size_t)(out * r) * 4 + 255) / 256 * 256;
    if (!ha || !hb) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    if (!rc) rc = st_to_f32(f->a, ha, err);
    if (!rc) rc = st_to_f32(f->b, hb, err);
    for (int64_t i = 0; !rc && i < r * in; i++)
      if (!isfinite(ha[i])) rc = herr_set(err, HEARTH_EFORMAT, "%s: '%s': lora_A holds a non-finite value", dir, f->module);
    for (int64_t i = 0; !rc && i < out * r; i++)
      if (!isfinite(hb[i])) rc = herr_set(err, HEARTH_EFORMAT, "%s: '%s': lora_B holds a non-finite value", dir, f->module);
    if (!rc) rc = bk_set(&ta, 0, ha, bk_nbytes(&ta), err);
    if (!rc) rc = bk_set(&tb, 0, hb, bk_nbytes(&tb), err);
    if (!rc) rc = bk_sync(m->be, err); /* the host copies are freed next */
    if (!rc) {
      /* the identity the prefix cache keys on: what the adapter does, not where it came from */
      uint32_t sb;
      memcpy(&sb, &scale, 4);
      h = hmix64(h ^ ((uint64_t)f->layer << 32 | (uint64_t)f->first << 8 | (uint64_t)f->count) ^ ((uint64_t)sb << 1));
      for (int64_t i = 0; i < r * in; i++) {
        uint32_t u;
        memcpy(&u, &ha[i], 4);
        h = hmix64(h ^ u);
      }
      for (int64_t i = 0; i < out * r; i++) {
        uint32_t u;
        memcpy(&u, &hb[i], 4);
        h = hmix64(h ^ ((uint64_t)u << 7));
      }
      int64_t row = 0;
      for (int t = f->first; t < f->first + f->count; t++) {
        int64_t rows = target_weight(&m->layers[f->layer], t)->rows;
        lora_mod *md = &a->mods[(int64_t)f->layer * LORA_N_TARGETS + t];
        md->a = ta;
        md->b = bk_rows(&tb, row, rows);
        md->scale = scale;
        row += rows;
      }
    }
    free(ha), free(hb);
  }
  a->id = h ? h : 1; /* 0 is the base model's */
out:
  free(fm);
  return rc;
}

int model_lora_load(model *m, const char *dir, model_lora **out, herr *err) {
  *out = NULL;
  if (m->tp_size)
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s: LoRA adapters are not applied to a model split over ranks (--tensor-parallel)", dir);
  adapter_config cfg;
  int rc = adapter_config_load(dir, &cfg, err);
  if (rc) return rc;
  st_set st;
  memset(&st, 0, sizeof st);
  model_lora *a = calloc(1, sizeof *a);
  if (!a || !(a->path = strdup(dir))) {
    lora_free(a);
    adapter_config_free(&cfg);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  static atomic_uint_fast64_t loads;
  a->m = m;
  a->serial = atomic_fetch_add(&loads, 1) + 1;
  atomic_init(&a->refs, 1);
  if ((rc = adapter_open_weights(dir, &st, err))) goto fail;
  pthread_mutex_lock(&m->lock);
  rc = load_mods(m, dir, &cfg, &st, a, err);
  if (rc && a->buf) {
    bk_buf_free(a->buf);
    a->buf = NULL;
  }
  pthread_mutex_unlock(&m->lock);
  if (rc) goto fail;
  st_close(&st);
  adapter_config_free(&cfg);
  *out = a;
  return 0;
fail:
  st_close(&st);
  adapter_config_free(&cfg);
  lora_free(a);
  return rc;
}

void model_lora_retain(model_lora *a) {
  if (a) atomic_fetch_add(&a->refs, 1);
}

void model_lora_release(model_lora *a) {
  if (!a || atomic_fetch_sub(&a->refs, 1) != 1) return;
  model *m = a->m;
  pthread_mutex_lock(&m->lock); /* not while a forward runs */
  if (a->buf) bk_buf_free(a->buf);
  a->buf = NULL;
  pthread_mutex_unlock(&m->lock);
  lora_free(a);
}

uint64_t model_lora_id(const model_lora *a) { return a ? a->id : 0; }
uint64_t model_lora_serial(const model_lora *a) { return a->serial; }
const char *model_lora_path(const model_lora *a) { return a->path; }
int64_t model_lora_rank(const model_lora *a) { return a->max_rank; }
int64_t model_lora_modules(const model_lora *a) { return a->n_mods; }
int model_lora_refs(const model_lora *a) { return atomic_load(&((model_lora *)a)->refs); }
const model *model_lora_model(const model_lora *a) { return a->m; }

uint64_t model_lora_set_id(const model_lora *const *a, int n) {
  if (n <= 0) return 0;
  uint64_t h = 0;
  for (int i = 0; i < n; i++) h = hmix64(h ^ hmix64(model_lora_id(a[i]) + (uint64_t)i * HMIX64_GAMMA));
  return h ? h : 1;
}

void layer_lora(const step *st, int l, lora_target t, const bk_tensor *y, const bk_tensor *x) {
  for (int i = 0; i < st->n_lora; i++) {
    const lora_run *run = &st->lora[i];
    for (int j = 0; j < run->n; j++) {
      const lora_mod *md = &run->a[j]->mods[(int64_t)l * LORA_N_TARGETS + t];
      if (!md->a.buf) continue;
      bk_tensor yr = bk_rows(y, run->t0, run->rows), xr = bk_rows(x, run->t0, run->rows);
      bk_lora(&yr, &xr, &md->a, &md->b, md->scale);
    }
  }
}
