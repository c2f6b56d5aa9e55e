/* kv_cache.h — the KV cache for one-off runs (generation of one request,
 * tools, tests): sequences in a block pool of their own that grows as they
 * do, in the memory of the geometry's backend. Implements the kv_seq
 * contract of model/kv.h, so the model's forward reads and writes it
 * without knowing its layout.
 *
 *   kv_cache *c; kv_cache_new(&geom, max_len, &c, &err);   // geom from model_kv_geometry_of
 *   kv_seq *s; kv_cache_seq_new(c, &s, &err);
 *   ... model_forward with .kv = s ...
 *   kv_cache_seq_truncate(s, n);    // drop rows >= n (rollback)
 *   kv_cache_seq_free(s); kv_cache_free(c);
 */
#ifndef HEARTH_ENGINE_KV_CACHE_H
#define HEARTH_ENGINE_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "model/kv.h"
#include "model/model.h"

typedef struct kv_cache kv_cache;

/* max_len: the most tokens one sequence may hold (0 = unlimited). */
int kv_cache_new(const model_kv_geometry *g, int64_t max_len, kv_cache **out, herr *err);
void kv_cache_free(kv_cache *c);   /* sequences must be freed first */
int kv_cache_seq_new(kv_cache *c, kv_seq **out, herr *err);
void kv_cache_seq_free(kv_seq *s);
/* Forgets rows >= n (n <= len). */
void kv_cache_seq_truncate(kv_seq *s, int64_t n);
/* kv_paged_seq_mark / kv_paged_seq_rewind: cutting back a sequence with
 * recurrent state (its state is kept at the mark). */
int kv_cache_seq_mark(kv_seq *s, herr *err);
int64_t kv_cache_seq_rewind(kv_seq *s, int64_t n);

#endif
