/* dict.h — an open-addressing hash map from byte strings to int64 values.
 * Keys are copied into the dict's own arena. Used for vocabularies, tensor
 * names and other lookups by name. */
#ifndef HEARTH_BASE_DICT_H
#define HEARTH_BASE_DICT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct hdict_slot {
  const char *key; /* points into the arena; NULL = empty */
  uint32_t len;
  uint32_t hash;
  int64_t val;
} hdict_slot;

typedef struct hdict {
  hdict_slot *slots; /* owned */
  size_t cap, count;
  char **chunks;     /* owned key arena */
  size_t nchunks, chunks_cap, chunk_used, chunk_cap;
} hdict;

void hdict_init(hdict *d);
void hdict_free(hdict *d);
/* Inserts or overwrites. Returns false on out of memory. */
bool hdict_put(hdict *d, const char *key, size_t len, int64_t val);
/* Returns true and sets *val when present. */
bool hdict_get(const hdict *d, const char *key, size_t len, int64_t *val);
uint32_t hdict_hash(const char *key, size_t len);

#include <string.h>
static inline bool hdict_gets(const hdict *d, const char *key, int64_t *val) { return hdict_get(d, key, strlen(key), val); }

#endif
