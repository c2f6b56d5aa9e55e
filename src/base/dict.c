/* dict.c — string → int64 hash map with linear probing (see dict.h). */
#include "base/dict.h"

#include <stdlib.h>
#include <string.h>

#include "base/vec.h"

uint32_t hdict_hash(const char *key, size_t len) {
  /* FNV-1a, 32-bit */
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < len; i++) {
    h ^= (unsigned char)key[i];
    h *= 16777619u;
  }
  return h;
}

void hdict_init(hdict *d) { memset(d, 0, sizeof *d); }

void hdict_free(hdict *d) {
  for (size_t i = 0; i < d->nchunks; i++) free(d->chunks[i]);
  free(d->chunks);
  free(d->slots);
  memset(d, 0, sizeof *d);
}

static const char *arena_copy(hdict *d, const char *key, size_t len) {
  if (d->nchunks == 0 || d->chunk_used + len + 1 > d->chunk_cap) {
    size_t cap = len + 1 > 65536 ? len + 1 : 65536;
    if (d->nchunks == d->chunks_cap && !HGROW(d->chunks, d->chunks_cap, d->nchunks + 1)) return NULL;
    char *c = malloc(cap);
    if (!c) return NULL;
    d->chunks[d->nchunks++] = c;
    d->chunk_used = 0;
    d->chunk_cap = cap;
  }
  char *p = d->chunks[d->nchunks - 1] + d->chunk_used;
  if (len) memcpy(p, key, len);
  p[len] = 0;
  d->chunk_used += len + 1;
  return p;
}

static hdict_slot *find(const hdict_slot *slots, size_t cap, const char *key, size_t len, uint32_t h) {
  size_t mask = cap - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const hdict_slot *s = &slots[i];
    if (!s->key || (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0)) return (hdict_slot *)s;
  }
}

static bool grow(hdict *d) {
  size_t ncap = d->cap ? d->cap * 2 : 64;
  hdict_slot *ns = calloc(ncap, sizeof *ns);
  if (!ns) return false;
  for (size_t i = 0; i < d->cap; i++) {
    hdict_slot *s = &d->slots[i];
    if (s->key) *find(ns, ncap, s->key, s->len, s->hash) = *s;
  }
  free(d->slots);
  d->slots = ns;
  d->cap = ncap;
  return true;
}

bool hdict_put(hdict *d, const char *key, size_t len, int64_t val) {
  if ((d->count + 1) * 4 > d->cap * 3 && !grow(d)) return false;
  uint32_t h = hdict_hash(key, len);
  hdict_slot *s = find(d->slots, d->cap, key, len, h);
  if (s->key) {
    s->val = val;
    return true;
  }
  const char *k = arena_copy(d, key, len);
  if (!k) return false;
  s->key = k;
  s->len = (uint32_t)len;
  s->hash = h;
  s->val = val;
  d->count++;
  return true;
}

bool hdict_get(const hdict *d, const char *key, size_t len, int64_t *val) {
  if (!d->cap) return false;
  hdict_slot *s = find(d->slots, d->cap, key, len, hdict_hash(key, len));
  if (!s->key) return false;
  if (val) *val = s->val;
  return true;
}
