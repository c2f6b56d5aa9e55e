/* kv.h — the contract between a model's forward pass and whatever KV cache
 * the engine runs (contiguous today, paged block tables later).
 *
 * A sequence's cache state is a `kv_seq`: the engine's own struct embeds it
 * as its first member and fills `ops`. The forward only ever asks for room,
 * writes rows, reads views and commits the new length, so a cache with a
 * different layout replaces the contiguous one without touching model code.
 *
 * Rows are indexed by position in the sequence (0, 1, ...). A layer's row
 * holds n_kv_heads * head_dim floats for K and the same for V.
 */
#ifndef HEARTH_MODEL_KV_H
#define HEARTH_MODEL_KV_H

#include <stdint.h>

#include "backend/ops.h"
#include "base/status.h"

/* The view type (kv_view: rows [lo, hi) of one layer, in blocks) is the
 * backend's, since attention reads it; see backend/ops.h. */

typedef struct kv_seq kv_seq;

typedef struct kv_ops {
  /* Makes room for rows [len, len + n) in every layer (ELIMIT / ENOMEM on failure).
   * Existing row pointers and views may move. */
  int (*reserve)(kv_seq *s, int64_t n, herr *err);
  /* Where to write row `pos` of `layer` (pos in [len, len + reserved)). */
  float *(*k_row)(kv_seq *s, int layer, int64_t pos);
  float *(*v_row)(kv_seq *s, int layer, int64_t pos);
  /* A view of rows [?, hi) of layer, valid until the next reserve. */
  void (*view)(kv_seq *s, int layer, int64_t hi, kv_view *out);
  /* The forward wrote rows [len, len + n): the sequence is now n longer. */
  void (*commit)(kv_seq *s, int64_t n);
} kv_ops;

struct kv_seq {
  const kv_ops *ops; /* borrowed: the cache implementation */
  int64_t len;       /* tokens stored (= position of the next token) */
};

#endif
