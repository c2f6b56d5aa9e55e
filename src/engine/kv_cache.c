/* kv_cache.c — the contiguous KV cache (see kv_cache.h): each sequence holds,
 * per layer, one array of K rows and one of V rows that grows by doubling.
 * Implements model/kv.h's kv_ops; knows nothing of attention or models
 * beyond the row sizes it was given. */
#include "engine/kv_cache.h"

#include <stdlib.h>
#include <string.h>

struct kv_cache {
  int n_layers;
  int64_t kv_dim[CFG_MAX_LAYERS];
  int64_t max_len;   /* 0 = unlimited */
};

typedef struct contig_seq {
  kv_seq base;       /* must be first: the model sees this */
  kv_cache *cache;   /* borrowed */
  int64_t cap;       /* rows allocated per layer */
  float **k, **v;    /* owned: per layer, cap * kv_dim floats */
} contig_seq;

static int contig_reserve(kv_seq *s, int64_t n, herr *err) {
  contig_seq *cs = (contig_seq *)s;
  kv_cache *c = cs->cache;
  int64_t need = s->len + n;
  if (c->max_len > 0 && need > c->max_len)
    return herr_set(err, HEARTH_ELIMIT, "KV cache: %lld tokens exceed the context limit of %lld", (long long)need, (long long)c->max_len);
  if (need <= cs->cap) return 0;
  int64_t cap = cs->cap ? cs->cap : 16;
  while (cap < need) cap *= 2;
  if (c->max_len > 0 && cap > c->max_len) cap = c->max_len;
  for (int l = 0; l < c->n_layers; l++) {
    size_t bytes = (size_t)(cap * c->kv_dim[l]) * sizeof(float);
    float *k = realloc(cs->k[l], bytes ? bytes : 1);
    if (!k) return herr_set(err, HEARTH_ENOMEM, "KV cache: out of memory for %lld tokens", (long long)cap);
    cs->k[l] = k;
    float *v = realloc(cs->v[l], bytes ? bytes : 1);
    if (!v) return herr_set(err, HEARTH_ENOMEM, "KV cache: out of memory for %lld tokens", (long long)cap);
    cs->v[l] = v;
  }
  cs->cap = cap;
  return 0;
}

static float *contig_k_row(kv_seq *s, int layer, int64_t pos) {
  contig_seq *cs = (contig_seq *)s;
  return cs->k[layer] + pos * cs->cache->kv_dim[layer];
}

static float *contig_v_row(kv_seq *s, int layer, int64_t pos) {
  contig_seq *cs = (contig_seq *)s;
  return cs->v[layer] + pos * cs->cache->kv_dim[layer];
}

static void contig_view(kv_seq *s, int layer, int64_t hi, kv_view *out) {
  contig_seq *cs = (contig_seq *)s;
  out->k_blocks = (const float *const *)&cs->k[layer];
  out->v_blocks = (const float *const *)&cs->v[layer];
  out->block_rows = cs->cap > 0 ? cs->cap : 1;
  out->row_stride = cs->cache->kv_dim[layer];
  out->lo = 0;
  out->hi = hi;
}

static void contig_commit(kv_seq *s, int64_t n) { s->len += n; }

static const kv_ops contig_ops = {contig_reserve, contig_k_row, contig_v_row, contig_view, contig_commit};

int kv_cache_new(const model_kv_geometry *g, int64_t max_len, kv_cache **out, herr *err) {
  *out = NULL;
  if (g->n_layers <= 0 || g->n_layers > CFG_MAX_LAYERS) return herr_set(err, HEARTH_EINVAL, "KV cache: %d layers is out of range", g->n_layers);
  kv_cache *c = calloc(1, sizeof *c);
  if (!c) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  c->n_layers = g->n_layers;
  memcpy(c->kv_dim, g->kv_dim, sizeof c->kv_dim);
  c->max_len = max_len;
  *out = c;
  return 0;
}

void kv_cache_free(kv_cache *c) { free(c); }

int kv_cache_seq_new(kv_cache *c, kv_seq **out, herr *err) {
  *out = NULL;
  contig_seq *cs = calloc(1, sizeof *cs);
  if (cs) {
    cs->k = calloc((size_t)c->n_layers, sizeof *cs->k);
    cs->v = calloc((size_t)c->n_layers, sizeof *cs->v);
  }
  if (!cs || !cs->k || !cs->v) {
    if (cs) free(cs->k), free(cs->v);
    free(cs);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  cs->base.ops = &contig_ops;
  cs->cache = c;
  *out = &cs->base;
  return 0;
}

void kv_cache_seq_free(kv_seq *s) {
  if (!s) return;
  contig_seq *cs = (contig_seq *)s;
  for (int l = 0; l < cs->cache->n_layers; l++) free(cs->k[l]), free(cs->v[l]);
  free(cs->k);
  free(cs->v);
  free(cs);
}

void kv_cache_seq_truncate(kv_seq *s, int64_t n) {
  if (n >= 0 && n < s->len) s->len = n;
}

size_t kv_cache_seq_bytes(const kv_seq *s) {
  const contig_seq *cs = (const contig_seq *)s;
  size_t total = 0;
  for (int l = 0; l < cs->cache->n_layers; l++) total += (size_t)(2 * cs->cap * cs->cache->kv_dim[l]) * sizeof(float);
  return total;
}
