/* kv_cache.c — the per-sequence KV cache for one-off generation, tests and
 * tools (see kv_cache.h): a growable block pool of its own, without prefix
 * sharing, through kv_paged. Knows nothing of attention or models beyond
 * the row sizes it was given. */
#include "engine/kv_cache.h"

#include <stdlib.h>

#include "engine/kv_paged.h"

#define KV_CACHE_BLOCK 16

struct kv_cache {
  kv_pool *pool;     /* owned */
  int64_t max_len;   /* 0 = unlimited */
};

int kv_cache_new(const model_kv_geometry *g, int64_t max_len, kv_cache **out, herr *err) {
  *out = NULL;
  if (g->n_layers <= 0 || g->n_layers > CFG_MAX_LAYERS) return herr_set(err, HEARTH_EINVAL, "KV cache: %d layers is out of range", g->n_layers);
  kv_cache *c = calloc(1, sizeof *c);
  if (!c) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  c->max_len = max_len;
  int64_t blocks = max_len > 0 ? (max_len + KV_CACHE_BLOCK - 1) / KV_CACHE_BLOCK : 4;
  int rc = kv_pool_new(g, KV_CACHE_BLOCK, blocks, &c->pool, err);
  if (rc) {
    free(c);
    return rc;
  }
  kv_pool_set_growable(c->pool, true);
  *out = c;
  return 0;
}

void kv_cache_free(kv_cache *c) {
  if (!c) return;
  kv_pool_free(c->pool);
  free(c);
}

int kv_cache_seq_new(kv_cache *c, kv_seq **out, herr *err) { return kv_paged_seq_new(c->pool, c->max_len, out, err); }

void kv_cache_seq_free(kv_seq *s) { kv_paged_seq_free(s); }

void kv_cache_seq_truncate(kv_seq *s, int64_t n) { kv_paged_seq_truncate(s, n); }

int kv_cache_seq_mark(kv_seq *s, herr *err) { return kv_paged_seq_mark(s, err); }

int64_t kv_cache_seq_rewind(kv_seq *s, int64_t n) { return kv_paged_seq_rewind(s, n); }
