/* kv.h — the contract between a model's forward pass and whatever KV cache
 * the engine runs (the paged block pool, or the contiguous per-sequence
 * cache built on it).
 *
 * A sequence's cache state is a `kv_seq`: the engine's own struct embeds it
 * as its first member and fills `ops`. Keys and values live in a kv_store:
 * per layer, one K and one V arena of slots in backend memory (the GPU's
 * when the model runs there), made of blocks of block_rows slots. A
 * sequence owns a block table: row r of the sequence is in slot
 * table[r / block_rows] * block_rows + r % block_rows of every layer. The
 * forward only ever asks for room, reads the table, and commits the new
 * length; it writes and reads the arenas through backend ops
 * (bk_kv_write, bk_attention), so the cache's memory never visits the host.
 *
 * A recurrent layer (the geometry's state_dim[l] > 0) has no rows: each
 * sequence owns one row of the layer's state arena (kv_seq.state), which the
 * forward reads and overwrites in place; a sequence of length 0 starts from
 * a zero state whatever its row holds.
 */
#ifndef HEARTH_MODEL_KV_H
#define HEARTH_MODEL_KV_H

#include <stdint.h>

#include "backend/backend.h"
#include "backend/comm.h"
#include "base/status.h"
#include "format/config.h"


/* Ranks of a tensor-parallel group a cache may hold arenas for (model.h). */
#define KV_MAX_RANKS BK_COMM_MAX_RANKS

/* The arenas of a cache: layer l's K rows are kv_store.k[l], n_slots rows
 * stored as k_fmt[l] ([n_slots, kv_dim[l]] f32 when BK_KV_F32; see
 * bk_kv_layer for the quantized formats), V likewise; a recurrent layer's
 * states are kv_store.state[l] ([n_states, state_dim[l]] f32). */
typedef struct kv_store {
  int n_layers;
  int64_t block_rows;
  int64_t n_slots;
  bk_tensor k[CFG_MAX_LAYERS], v[CFG_MAX_LAYERS]; /* views of the cache's one buffer */
  int64_t n_states;
  bk_tensor state[CFG_MAX_LAYERS];                /* views of the cache's state buffer (.buf NULL: none) */
  bk_kv_fmt k_fmt[CFG_MAX_LAYERS], v_fmt[CFG_MAX_LAYERS];
  /* tensor parallelism: rank r's arenas (its heads, on its backend) are rank[r]'s, same blocks and
   * slots; rank[0] and every entry of a single-rank cache are NULL: this store itself */
  const struct kv_store *rank[KV_MAX_RANKS];
} kv_store;

/* Rank r's arenas of st. */
static inline const kv_store *kv_store_rank(const kv_store *st, int r) { return r > 0 && st->rank[r] ? st->rank[r] : st; }

typedef struct kv_seq kv_seq;

typedef struct kv_ops {
  /* Makes room for rows [len, len + n) in every layer (ELIMIT / ENOMEM on failure).
   * The block table may move and grow. */
  int (*reserve)(kv_seq *s, int64_t n, herr *err);
  /* The store the sequence's rows live in, and its block table (*n_blocks
   * block ids, valid until the next reserve). */
  const kv_store *(*table)(kv_seq *s, const int32_t **blocks, int64_t *n_blocks);
  /* The forward wrote rows [len, len + n): the sequence is now n longer. */
  void (*commit)(kv_seq *s, int64_t n);
} kv_ops;

struct kv_seq {
  const kv_ops *ops; /* borrowed: the cache implementation */
  int64_t len;       /* tokens stored (= position of the next token) */
  int32_t state;     /* its row of the store's state arenas (-1: none; a model with recurrent layers needs one) */
  /* recurrent layers: a forward from length keep_at writes the state after its token i (i < n_keep)
   * into state row keep[i] too (speculative verification: the state after any accepted draft) */
  const int32_t *keep; /* borrowed, n_keep rows; NULL with n_keep 0 */
  int32_t n_keep;
  int64_t keep_at;
};

#endif
