/* lora.c — LoRA adapters on a loaded model: a PEFT adapter folder
 * (format/adapter.h) mapped onto the decoder's projections (attention
 * q/k/v/o, the dense MLP's gate/up/down — or a MoE layer's shared expert —,
 * and the fused qkv_proj / gate_up_proj of families that store them so — and the routed experts:
 * PEFT's target_parameters on the fused 3-D mlp.experts.gate_up_proj / down_proj (its
 * ParamWrapper: lora_A [E·r, in] holds expert e's rows e·r.., lora_B [out, r·E] its columns
 * k·E + e) or the older per-expert Linear modules mlp.experts.N.gate_proj / up_proj / down_proj),
 * its lora_A / lora_B held
 * as f32 tensors in the model's backend, checked against the base's
 * shapes; and the delta each projection of a forward adds on the rows of
 * the sequences that use the adapter (layer_lora, bk_lora per run of rows).
 * Adapters are reference counted; the last release frees the backend
 * memory under the model's lock, so never while a forward runs. What an
 * adapter asks that this cannot honour (embeddings, the output head, DoRA,
 * trained biases, expert deltas on a backend without them) is refused when it is loaded.
 *
 * On a model split over ranks (tp.c) each rank holds its part of every
 * module in its own backend, cut as the rank's projection was cut: for a
 * column-parallel projection (q / k / v, gate / up) A whole and B's rows of
 * the rank's outputs; for a row-parallel one (o, down) A's columns of the
 * rank's inputs and B whole, so each rank's delta is a share that the
 * projection's all-reduce sums with the rest. Expert deltas are refused
 * there. */
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
  int n_ranks;           /* the ranks of the model's group (1: not split) */
  lora_mod *mods;        /* owned: [n_ranks * layers * LORA_N_TARGETS], each rank's part; .a.buf NULL where the adapter has nothing */
  bk_buf *buf[KV_MAX_RANKS]; /* owned: every A and B, in each rank's backend */
  bk_expert_lora *xl;    /* owned: [layers]; r 0 where the adapter leaves the layer's experts alone */
  bk_buf *xbuf;          /* owned: the experts' A and B */
  atomic_int refs;
};

/* One module of the adapter file: its name, layer, which projections it feeds. */
typedef struct found_mod {
  char module[256];      /* "model.layers.3.self_attn.q_proj" */
  int layer;
  int first, count;      /* targets first..first+count (a fused projection feeds several) */
  const st_tensor *a, *b;
} found_mod;

/* A tensor pair on a layer's experts: the fused 3-D parameter (expert -1) or one expert's Linear. */
typedef struct found_x {
  int layer, expert;     /* expert -1: PEFT's ParamWrapper over the fused parameter */
  int proj;              /* 0 gate, 1 up, 2 down, 3 the fused gate_up (ParamWrapper) */
  char module[256];
  const st_tensor *a, *b;
} found_x;

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

/* REST after "layers.N." names a module on the experts: "mlp.experts.E.gate_proj" (one
 * expert's Linear) or "mlp.experts" followed by ".base_layer"s (PEFT's ParamWrappers, one per
 * targeted parameter, nested); *expert and *proj for the first, expert -1 and proj -1 (decided
 * by the shapes) for the second. */
static bool expert_module(const char *rest, int *expert, int *proj) {
  if (strncmp(rest, "mlp.experts", 11) != 0) return false;
  const char *p = rest + 11;
  if (!*p) return *expert = -1, *proj = -1, true;
  if (*p != '.') return false;
  p++;
  if (!strncmp(p, "base_layer", 10)) {
    while (!strncmp(p, "base_layer", 10)) {
      p += 10;
      if (!*p) return *expert = -1, *proj = -1, true;
      if (*p != '.') return false;
      p++;
    }
    return false;
  }
  char *end;
  long e = strtol(p, &end, 10);
  if (end == p || *end != '.' || e < 0 || e > 1 << 20) return false;
  static const char *const names[3] = {"gate_proj", "up_proj", "down_proj"};
  for (int k = 0; k < 3; k++)
    if (!strcmp(end + 1, names[k])) return *expert = (int)e, *proj = k, true;
  return false;
}

/* Whether adapter_config.json's target_parameters names parameter `param` of module `module`
 * (an entry equal to "module.param" or ending in "." + it, as PEFT matches). */
static bool targets_parameter(const adapter_config *cfg, const char *module, const char *param) {
  const json_t *tp = json_object_get(cfg->raw, "target_parameters");
  char full[320];
  snprintf(full, sizeof full, "%s.%s", module, param);
  size_t i, fl = strlen(full);
  const json_t *v;
  json_array_foreach(tp, i, v) {
    const char *t = json_string_value(v);
    size_t tl = t ? strlen(t) : 0;
    if (t && (!strcmp(full, t) || (fl > tl && full[fl - tl - 1] == '.' && !strcmp(full + fl - tl, t)))) return true;
  }
  return false;
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

/* The stored matrix of target t, as the rank's part records it (a model not split: its own shape). */
static int64_t full_rows(const layer_weights *lw, int t) { return lw->part[t].rows ? lw->part[t].rows : target_weight(lw, t)->rows; }
static int64_t full_cols(const layer_weights *lw, int t) { return lw->part[t].rows ? lw->part[t].cols : target_weight(lw, t)->cols; }

/* A module's part on a rank whose layer is lw: A's columns [c0, c0 + in) and, per target i of the
 * module, B's rows [b0[i], b0[i] + bn[i]) (out: their sum). */
typedef struct mod_part {
  int64_t c0, in, out, b0[3], bn[3];
} mod_part;

static mod_part module_part(const layer_weights *lw, int first, int count) {
  mod_part p = {.c0 = 0, .in = full_cols(lw, first)};
  int64_t at = 0;
  for (int i = 0; i < count; i++) {
    int t = first + i;
    const bk_weight *w = target_weight(lw, t);
    if (lw->part[t].rows && lw->part[t].cols != w->cols) p.c0 = lw->part[t].col0, p.in = w->cols; /* row-parallel */
    p.b0[i] = at + lw->part[t].row0, p.bn[i] = w->rows;
    p.out += w->rows;
    at += full_rows(lw, t);
  }
  return p;
}

static size_t align256(size_t n) { return (n + 255) / 256 * 256; }

static void lora_free(model_lora *a) {
  if (!a) return;
  for (int k = 0; k < KV_MAX_RANKS; k++)
    if (a->buf[k]) bk_buf_free(a->buf[k]);
  if (a->xbuf) bk_buf_free(a->xbuf);
  free(a->xl);
  free(a->mods);
  free(a->path);
  free(a);
}

static int tensor_f32(const st_tensor *t, float **out, const char *dir, const char *module, herr *err) {
  size_t n = 1;
  for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
  *out = malloc(sizeof(float) * (n ? n : 1));
  if (!*out) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  int rc = st_to_f32(t, *out, err);
  for (size_t i = 0; !rc && i < n; i++)
    if (!isfinite((*out)[i])) rc = herr_set(err, HEARTH_EFORMAT, "%s: '%s': a non-finite value", dir, module);
  return rc;
}

/* The adapter's expert deltas fx[0..nx) as per-layer stacks (bk_expert_lora): each expert's
 * A and its B times the scale, zero-padded to the layer's largest rank. */
static int load_experts(model *m, const char *dir, const adapter_config *cfg, found_x *fx, int nx, model_lora *a, uint64_t *h,
                        herr *err) {
  int64_t L = m->cfg.num_hidden_layers, D = m->cfg.hidden_size;
  if (!bk_backend_expert_lora(m->be))
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s: LoRA on the experts ('%s') is not supported on %s", dir, fx[0].module,
                    bk_backend_name(m->be));
  /* each pair complete, 2-D float, and which projection a fused one is by its shapes */
  for (int j = 0; j < nx; j++) {
    found_x *f = &fx[j];
    const layer_weights *lw = &m->layers[f->layer];
    int64_t I = lw->ex.gate[0].rows, E = lw->ex.n;
    if (!f->a || !f->b)
      return herr_set(err, HEARTH_EFORMAT, "%s: module '%s' has lora_%s but no lora_%s", dir, f->module, f->a ? "A" : "B",
                      f->a ? "B" : "A");
    if (f->a->ndim != 2 || f->b->ndim != 2 || !st_dtype_is_float(f->a->dtype) || !st_dtype_is_float(f->b->dtype))
      return herr_set(err, HEARTH_EFORMAT, "%s: '%s': lora_A and lora_B must be 2-D float tensors", dir, f->module);
    int64_t ar = f->a->shape[0], ain = f->a->shape[1], bout = f->b->shape[0], br = f->b->shape[1];
    char base[256];
    snprintf(base, sizeof base, "%s", f->module);
    for (char *p; (p = strstr(base, ".base_layer"));) *p = 0;
    if (f->expert < 0) { /* gate_up_proj [E, 2I, D] or down_proj [E, D, I], as PEFT swaps them: A [E·r, in], B [out, r·E] */
      if (ain == D && bout == 2 * I) f->proj = 3;
      else if (ain == I && bout == D) f->proj = 2;
      if (f->proj < 0 || ar != br || ar % E != 0)
        return herr_set(err, HEARTH_EFORMAT,
                        "%s: '%s': lora_A [%lld, %lld] and lora_B [%lld, %lld] fit neither the experts' gate_up_proj "
                        "(lora_A [%lld·r, %lld], lora_B [%lld, r·%lld]) nor their down_proj (lora_A [%lld·r, %lld], "
                        "lora_B [%lld, r·%lld])",
                        dir, f->module, (long long)ar, (long long)ain, (long long)bout, (long long)br, (long long)E, (long long)D,
                        (long long)(2 * I), (long long)E, (long long)E, (long long)I, (long long)D, (long long)E);
      const char *param = f->proj == 3 ? "gate_up_proj" : "down_proj";
      if (!targets_parameter(cfg, base, param))
        return herr_set(err, HEARTH_EFORMAT,
                        "%s: adapter_model.safetensors has a LoRA for '%s.%s', which adapter_config.json's "
                        "target_parameters does not name",
                        dir, base, param);
      int64_t want = adapter_config_rank(cfg, base);
      if (ar / E != want)
        return herr_set(err, HEARTH_EFORMAT, "%s: '%s': the tensors have rank %lld but adapter_config.json says %lld", dir,
                        f->module, (long long)(ar / E), (long long)want);
    } else {
      int64_t in = f->proj == 2 ? I : D, out = f->proj == 2 ? D : I;
      if (ain != in || bout != out || br != ar)
        return herr_set(err, HEARTH_EFORMAT,
                        "%s: '%s': lora_A [%lld, %lld] and lora_B [%lld, %lld] do not fit the expert's projection [%lld, %lld]",
                        dir, f->module, (long long)ar, (long long)ain, (long long)bout, (long long)br, (long long)out,
                        (long long)in);
      if (!adapter_config_targets(cfg, f->module, f->layer))
        return herr_set(err, HEARTH_EFORMAT,
                        "%s: adapter_model.safetensors has a LoRA for '%s', which adapter_config.json's target_modules / "
                        "layers_to_transform do not select",
                        dir, f->module);
      if (ar != adapter_config_rank(cfg, f->module))
        return herr_set(err, HEARTH_EFORMAT, "%s: '%s': the tensors have rank %lld but adapter_config.json says %lld", dir,
                        f->module, (long long)ar, (long long)adapter_config_rank(cfg, f->module));
    }
  }
  /* per layer: the rank of its stacks (every adapter expert's padded to the largest) and the bytes */
  int64_t *rank = calloc((size_t)L, sizeof *rank);
  a->xl = calloc((size_t)L, sizeof *a->xl);
  if (!rank || !a->xl) {
    free(rank);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  for (int j = 0; j < nx; j++) {
    int64_t r = fx[j].expert < 0 ? fx[j].a->shape[0] / m->layers[fx[j].layer].ex.n : fx[j].a->shape[0];
    if (r > rank[fx[j].layer]) rank[fx[j].layer] = r;
    if (r > a->max_rank) a->max_rank = r;
  }
  size_t total = 0;
  for (int64_t l = 0; l < L; l++) {
    if (!rank[l]) continue;
    int64_t E = m->layers[l].ex.n, I = m->layers[l].ex.gate[0].rows, R = rank[l];
    total += (size_t)(E * R * (D + D + I) + E * R * (I + I + D)) * 4 + 6 * 256;
  }
  int rc = bk_buf_new(m->be, total, &a->xbuf, err);
  size_t off = 0;
  for (int64_t l = 0; l < L && !rc; l++) {
    if (!rank[l]) continue;
    int64_t E = m->layers[l].ex.n, I = m->layers[l].ex.gate[0].rows, R = rank[l];
    int64_t in[3] = {D, D, I}, outd[3] = {I, I, D};
    float *ha[3] = {0}, *hb[3] = {0};
    for (int p = 0; p < 3; p++) {
      ha[p] = calloc((size_t)(E * R * in[p]), sizeof(float));
      hb[p] = calloc((size_t)(E * outd[p] * R), sizeof(float));
      if (!ha[p] || !hb[p]) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    }
    for (int j = 0; j < nx && !rc; j++) {
      found_x *f = &fx[j];
      if (f->layer != l) continue;
      float *A = NULL, *Bm = NULL;
      if (!(rc = tensor_f32(f->a, &A, dir, f->module, err)) && !(rc = tensor_f32(f->b, &Bm, dir, f->module, err))) {
        char base[256];
        snprintf(base, sizeof base, "%s", f->module);
        for (char *q; (q = strstr(base, ".base_layer"));) *q = 0;
        if (f->expert < 0) {
          int64_t r = f->a->shape[0] / E, bout = f->b->shape[0], ain = f->a->shape[1];
          float scale = (float)adapter_config_scale(cfg, base, r);
          /* expert e: A_e rows [e·r, e·r + r); B_e[o][k] = B[o][k·E + e]; gate_up's rows split as gate then up */
          for (int64_t e = 0; e < E; e++)
            for (int64_t k = 0; k < r; k++) {
              for (int p = f->proj == 3 ? 0 : 2; p <= (f->proj == 3 ? 1 : 2); p++) {
                memcpy(ha[p] + (e * R + k) * ain, A + (e * r + k) * ain, sizeof(float) * (size_t)ain);
                int64_t o0 = f->proj == 3 && p == 1 ? I : 0, on = outd[p];
                for (int64_t o = 0; o < on; o++) hb[p][(e * on + o) * R + k] = scale * Bm[(o0 + o) * (r * E) + k * E + e];
              }
            }
          (void)bout;
        } else {
          int64_t r = f->a->shape[0], e = f->expert, p = f->proj;
          float scale = (float)adapter_config_scale(cfg, f->module, r);
          for (int64_t k = 0; k < r; k++) memcpy(ha[p] + (e * R + k) * in[p], A + k * in[p], sizeof(float) * (size_t)in[p]);
          for (int64_t o = 0; o < outd[p]; o++)
            for (int64_t k = 0; k < r; k++) hb[p][(e * outd[p] + o) * R + k] = scale * Bm[o * r + k];
        }
      }
      free(A), free(Bm);
    }
    bk_expert_lora *x = &a->xl[l];
    x->r = R;
    for (int p = 0; p < 3 && !rc; p++) {
      x->a[p] = (bk_tensor){.buf = a->xbuf, .off = off, .dt = BK_DT_F32, .rows = E * R, .cols = in[p]};
      off += ((size_t)(E * R * in[p]) * 4 + 255) / 256 * 256;
      x->b[p] = (bk_tensor){.buf = a->xbuf, .off = off, .dt = BK_DT_F32, .rows = E * outd[p], .cols = R};
      off += ((size_t)(E * outd[p] * R) * 4 + 255) / 256 * 256;
      rc = bk_set(&x->a[p], 0, ha[p], bk_nbytes(&x->a[p]), err);
      if (!rc) rc = bk_set(&x->b[p], 0, hb[p], bk_nbytes(&x->b[p]), err);
      *h = hmix64(*h ^ ((uint64_t)l << 40 | (uint64_t)p << 32 | 0x58u));
      for (int64_t i = 0; !rc && i < E * R * in[p]; i++) {
        uint32_t u;
        memcpy(&u, &ha[p][i], 4);
        *h = hmix64(*h ^ u);
      }
      for (int64_t i = 0; !rc && i < E * outd[p] * R; i++) {
        uint32_t u;
        memcpy(&u, &hb[p][i], 4);
        *h = hmix64(*h ^ ((uint64_t)u << 7));
      }
    }
    if (!rc) rc = bk_sync(m->be, err);
    for (int p = 0; p < 3; p++) free(ha[p]), free(hb[p]);
  }
  a->n_mods += nx;
  free(rank);
  return rc;
}

static int load_mods(model *m, const char *dir, const adapter_config *cfg, const st_set *st, model_lora *a, herr *err) {
  const model_config *c = &m->cfg;
  int64_t L = c->num_hidden_layers;
  found_mod *fm = calloc(st->count ? st->count : 1, sizeof *fm);
  found_x *fx = calloc(st->count ? st->count : 1, sizeof *fx);
  if (!fm || !fx) {
    free(fm), free(fx);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  int n = 0, nx = 0, rc = 0;
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
      int xe, xp;
      if (expert_module(rest, &xe, &xp)) {
        if (layer >= L || !m->layers[layer].moe || !m->layers[layer].ex.n) {
          rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor '%s': layer %d of this model has no experts", dir, name, layer);
          goto out;
        }
        if (xe >= m->layers[layer].ex.n) {
          rc = herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s': expert %d, but layer %d has %lld", dir, name, xe, layer,
                        (long long)m->layers[layer].ex.n);
          goto out;
        }
        int j = 0;
        while (j < nx && strcmp(fx[j].module, module) != 0) j++;
        if (j == nx) {
          fx[nx] = (found_x){.layer = layer, .expert = xe, .proj = xp};
          snprintf(fx[nx].module, sizeof fx[nx].module, "%s", module);
          nx++;
        }
        if (is_a) fx[j].a = &st->tensors[i];
        else fx[j].b = &st->tensors[i];
        continue;
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
      bool has_shared = m->layers[layer].moe && m->layers[layer].shared_gate.rows > 0;
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
  size_t total[KV_MAX_RANKS] = {0};
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
    int64_t in = full_cols(lw, f->first), out = 0;
    for (int t = f->first; t < f->first + f->count; t++) {
      const bk_weight *w = target_weight(lw, t);
      if (!w->rows || ((t == LORA_K || t == LORA_V) && lw->kv_src != f->layer)) {
        rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: '%s': layer %d computes no %s of its own", dir, f->module, f->layer,
                      target_names[t]);
        goto out;
      }
      out += full_rows(lw, t);
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
    for (int k = 0; k < a->n_ranks; k++) {
      mod_part pt = module_part(&tp_rank_model(m, k)->layers[f->layer], f->first, f->count);
      total[k] += align256((size_t)(r * pt.in) * 4) + align256((size_t)(pt.out * r) * 4);
    }
  }
  if (n == 0 && nx == 0) {
    rc = herr_set(err, HEARTH_EFORMAT, "%s: adapter_model.safetensors holds no LoRA weights", dir);
    goto out;
  }
  if (nx && a->n_ranks > 1) {
    rc = herr_set(err, HEARTH_EUNSUPPORTED,
                  "%s: '%s': LoRA deltas on routed experts are not applied to a model split over ranks (--tensor-parallel)", dir,
                  fx[0].module);
    goto out;
  }
  a->n_mods += n;
  a->mods = calloc((size_t)(a->n_ranks * L * LORA_N_TARGETS), sizeof *a->mods);
  if (!a->mods) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto out;
  }
  for (int k = 0; k < a->n_ranks; k++)
    if (total[k] && (rc = bk_buf_new(tp_rank_model(m, k)->be, total[k], &a->buf[k], err))) goto out;
  size_t off[KV_MAX_RANKS] = {0};
  uint64_t h = hmix64(0x4c6f5241ull + (uint64_t)n);
  if (nx && (rc = load_experts(m, dir, cfg, fx, nx, a, &h, err))) goto out;
  for (int k = 0; k < n && !rc; k++) {
    found_mod *f = &fm[k];
    int64_t r = f->a->shape[0], in = f->a->shape[1], out = f->b->shape[0];
    float scale = (float)adapter_config_scale(cfg, f->module, r);
    float *ha = malloc(sizeof(float) * (size_t)(r * in)), *hb = malloc(sizeof(float) * (size_t)(out * r));
    float *pa = malloc(sizeof(float) * (size_t)(r * in)), *pb = malloc(sizeof(float) * (size_t)(out * r));
    if (!ha || !hb || !pa || !pb) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    if (!rc) rc = st_to_f32(f->a, ha, err);
    if (!rc) rc = st_to_f32(f->b, hb, err);
    for (int64_t i = 0; !rc && i < r * in; i++)
      if (!isfinite(ha[i])) rc = herr_set(err, HEARTH_EFORMAT, "%s: '%s': lora_A holds a non-finite value", dir, f->module);
    for (int64_t i = 0; !rc && i < out * r; i++)
      if (!isfinite(hb[i])) rc = herr_set(err, HEARTH_EFORMAT, "%s: '%s': lora_B holds a non-finite value", dir, f->module);
    /* each rank's part: A's columns of its inputs, B's rows of its outputs */
    for (int q = 0; q < a->n_ranks && !rc; q++) {
      model *mq = tp_rank_model(m, q);
      mod_part pt = module_part(&mq->layers[f->layer], f->first, f->count);
      bk_tensor ta = {.buf = a->buf[q], .off = off[q], .dt = BK_DT_F32, .rows = r, .cols = pt.in};
      off[q] += align256((size_t)(r * pt.in) * 4);
      bk_tensor tb = {.buf = a->buf[q], .off = off[q], .dt = BK_DT_F32, .rows = pt.out, .cols = r};
      off[q] += align256((size_t)(pt.out * r) * 4);
      for (int64_t i = 0; i < r; i++) memcpy(pa + i * pt.in, ha + i * in + pt.c0, sizeof(float) * (size_t)pt.in);
      int64_t at = 0;
      for (int i = 0; i < f->count; at += pt.bn[i], i++) memcpy(pb + at * r, hb + pt.b0[i] * r, sizeof(float) * (size_t)(pt.bn[i] * r));
      rc = bk_set(&ta, 0, pa, bk_nbytes(&ta), err);
      if (!rc) rc = bk_set(&tb, 0, pb, bk_nbytes(&tb), err);
      if (!rc) rc = bk_sync(mq->be, err); /* the host copies are reused next */
      at = 0;
      for (int i = 0; !rc && i < f->count; at += pt.bn[i], i++) {
        lora_mod *md = &a->mods[((int64_t)q * L + f->layer) * LORA_N_TARGETS + f->first + i];
        md->a = ta;
        md->b = bk_rows(&tb, at, pt.bn[i]);
        md->scale = scale;
      }
    }
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
    }
    free(ha), free(hb), free(pa), free(pb);
  }
  a->id = h ? h : 1; /* 0 is the base model's */
out:
  free(fm);
  free(fx);
  return rc;
}

int model_lora_load(model *m, const char *dir, model_lora **out, herr *err) {
  *out = NULL;
  if (m->tp_size && !m->tp)
    return herr_set(err, HEARTH_EINVAL, "%s: an adapter is loaded through rank 0 of a split model", dir);
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
  a->n_ranks = m->tp ? m->tp_size : 1;
  a->serial = atomic_fetch_add(&loads, 1) + 1;
  atomic_init(&a->refs, 1);
  if ((rc = adapter_open_weights(dir, &st, err))) goto fail;
  pthread_mutex_lock(&m->lock);
  rc = load_mods(m, dir, &cfg, &st, a, err);
  for (int k = 0; rc && k < KV_MAX_RANKS; k++)
    if (a->buf[k]) {
      bk_buf_free(a->buf[k]);
      a->buf[k] = NULL;
    }
  if (rc && a->xbuf) {
    bk_buf_free(a->xbuf);
    a->xbuf = NULL;
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
  for (int k = 0; k < KV_MAX_RANKS; k++) {
    if (a->buf[k]) bk_buf_free(a->buf[k]);
    a->buf[k] = NULL;
  }
  if (a->xbuf) bk_buf_free(a->xbuf);
  a->xbuf = NULL;
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

const bk_expert_lora *model_lora_experts(const model_lora *a, int l) {
  return a->xl && a->xl[l].r ? &a->xl[l] : NULL;
}

bool layer_lora_experts(const step *st, int l, int run, const bk_expert_lora **out, int *n) {
  *n = 0;
  const lora_run *rr = &st->lora[run];
  for (int j = 0; j < rr->n; j++) {
    const bk_expert_lora *x = model_lora_experts(rr->a[j], l);
    if (x) out[(*n)++] = x;
  }
  return *n > 0;
}

void layer_lora(const step *st, int l, lora_target t, const bk_tensor *y, const bk_tensor *x) {
  for (int i = 0; i < st->n_lora; i++) {
    const lora_run *run = &st->lora[i];
    for (int j = 0; j < run->n; j++) {
      const model_lora *ad = run->a[j];
      const lora_mod *md = &ad->mods[((int64_t)(st->tp_rank < ad->n_ranks ? st->tp_rank : 0) * ad->m->cfg.num_hidden_layers + l) * LORA_N_TARGETS + t];
      if (!md->a.buf) continue;
      bk_tensor yr = bk_rows(y, run->t0, run->rows), xr = bk_rows(x, run->t0, run->rows);
      bk_lora(&yr, &xr, &md->a, &md->b, md->scale);
    }
  }
}
