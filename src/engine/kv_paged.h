/* kv_paged.h — the paged KV cache: one pool of fixed-size blocks (each holds
 * block_tokens rows of K and V for every layer), per-sequence block tables,
 * and automatic prefix caching. Implements the kv_seq contract of model/kv.h.
 *
 * Prefix caching: a full block is keyed by a hash chained over the whole
 * token prefix up to its end (and an adapter id, 0 for the base model).
 * Published blocks are shared read-only between sequences and reference
 * counted; when the last user lets go, a published block stays cached and
 * becomes evictable, least recently used first. A block is never written
 * once full, so sharing needs no copy-on-write: a sequence only appends.
 *
 *   kv_pool *p; kv_pool_new(&geom, 16, n_blocks, &p, &err);
 *   kv_seq *s; kv_paged_seq_new(p, max_len, &s, &err);
 *   int64_t hit = kv_paged_seq_attach_prefix(s, prompt, n, 0);  // rows [0, hit) now cached
 *   ... model_forward with .kv = s (reserve takes blocks; ELIMIT when the pool is dry) ...
 *   kv_paged_seq_publish(s, tokens, s->len, 0);                  // full blocks become shareable
 *   kv_paged_seq_free(s);
 *
 * Recurrent layers (the geometry's state_dim): each sequence holds one row
 * of the pool's state arenas while it lives (kv_seq.state; the arenas grow
 * as sequences need rows). Its state can only go forward: truncating a
 * sequence to any length but 0 makes its next reserve fail. Prefix caching
 * then needs the state at the end of the matched prefix: when a publish
 * finds a sequence's length exactly at the end of a block it publishes, a
 * copy of its state (a snapshot) is kept with that block, and attaching a
 * prefix stops at the last matched block that has one and starts the
 * sequence from a copy of it. Speculative decoding cuts a sequence back
 * over rejected drafts through a mark (kv_paged_seq_mark, _rewind): a copy
 * of the state at the length before the drafts. Snapshots live in state rows, at most
 * kv_pool_set_snapshots of them (least recently made or used go first), and
 * go with their block when it is evicted.
 *
 * Not thread-safe: one thread (the scheduler's) drives a pool.
 */
#ifndef HEARTH_ENGINE_KV_PAGED_H
#define HEARTH_ENGINE_KV_PAGED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/kv.h"
#include "model/model.h"

typedef struct kv_pool kv_pool;

/* Bytes one block of block_tokens rows takes for geometry g (K and V, all
 * layers, each in its storage format g->k_fmt / v_fmt). */
size_t kv_block_bytes(const model_kv_geometry *g, int block_tokens);
/* The storage formats of g as a short, stable string: "f32", "q8", "q4"
 * when every layer stores K and V alike, "k:q8,v:q4" when K and V differ
 * the same way on every layer, else per layer "0:q8/q8,1:f32/q4,..."
 * (layer:K/V, layers that store nothing left out). */
void kv_format_describe(const model_kv_geometry *g, char *buf, size_t n);

/* Bytes of one sequence's recurrent state for geometry g (0 without recurrent layers). */
size_t kv_state_bytes(const model_kv_geometry *g);

/* The arenas are allocated through g->backend (a private CPU backend when it
 * is NULL), in one buffer. */
int kv_pool_new(const model_kv_geometry *g, int block_tokens, int64_t n_blocks, kv_pool **out, herr *err);
void kv_pool_free(kv_pool *p); /* sequences must be freed first */
/* A growable pool doubles itself (copying its arenas on the backend) when a
 * reserve needs more blocks than are available, instead of failing. */
void kv_pool_set_growable(kv_pool *p, bool growable);
/* Room for n state rows now (sequences and snapshots each take one; the
 * arenas also grow when they run out). */
int kv_pool_reserve_states(kv_pool *p, int64_t n, herr *err);
/* At most n state snapshots (default 8); the oldest beyond it are dropped now. */
void kv_pool_set_snapshots(kv_pool *p, int64_t n);
/* Whether the pool keeps recurrent states (its geometry has state_dim). */
bool kv_pool_recurrent(const kv_pool *p);
/* The pool's arenas (changes when a growable pool grows). */
const kv_store *kv_pool_store(const kv_pool *p);
/* The geometry the pool was made with (row sizes, storage formats). A block
 * is kv_pool_block_bytes bytes of opaque, format-specific contents:
 * kv_format_describe of this geometry names the format. */
const model_kv_geometry *kv_pool_geometry(const kv_pool *p);
size_t kv_pool_block_bytes(const kv_pool *p);

typedef struct kv_pool_counts {
  int64_t total;   /* blocks in the pool */
  int64_t used;    /* held by at least one sequence */
  int64_t cached;  /* held by none, kept for their prefix (evictable) */
  int64_t free;    /* held by none and not cached */
} kv_pool_counts;
void kv_pool_count(const kv_pool *p, kv_pool_counts *out);
int kv_pool_block_tokens(const kv_pool *p);
/* Blocks a sequence could still take now: free + cached. */
int64_t kv_pool_available(const kv_pool *p);

/* max_len: the most tokens the sequence may hold (0 = unlimited). */
int kv_paged_seq_new(kv_pool *p, int64_t max_len, kv_seq **out, herr *err);
/* Releases the sequence's blocks (published ones stay cached) and frees it. */
void kv_paged_seq_free(kv_seq *s);
/* Blocks the sequence holds. */
int64_t kv_paged_seq_blocks(const kv_seq *s);
/* Blocks needed to grow s to n_rows rows. */
int64_t kv_paged_seq_blocks_for(const kv_seq *s, int64_t n_rows);
/* The block ids of s's table (borrowed, kv_paged_seq_blocks entries). */
const int32_t *kv_paged_seq_table(const kv_seq *s);

/* On an empty sequence: takes the longest run of cached full blocks that
 * match tokens[0..n) (stopping before the block that holds token n-1, so the
 * last token is always computed; with recurrent layers, at the last of them
 * with a state snapshot, which becomes the sequence's state) and sets len to
 * the rows they cover, which it returns (a multiple of block_tokens, 0 when
 * nothing matched). */
int64_t kv_paged_seq_attach_prefix(kv_seq *s, const int32_t *tokens, int64_t n, uint64_t adapter_id);
/* tokens[0..n) are the tokens of rows [0, n) (n <= len): publishes every full
 * block not yet published, so later sequences can share it. */
void kv_paged_seq_publish(kv_seq *s, const int32_t *tokens, int64_t n, uint64_t adapter_id);
/* Forgets rows >= n (n <= len), releasing the blocks past them. Truncating
 * into published blocks makes the next publish walk the chain again. */
void kv_paged_seq_truncate(kv_seq *s, int64_t n);
/* Recurrent layers: keeps a copy of s's state at its current length (the
 * mark; one per sequence, the last one made), so that s can be cut back to
 * that length later: speculative decoding marks before it feeds drafts.
 * Truncating to exactly the mark's length restores the state kept there
 * (the sequence is not stale); the mark is forgotten once s is cut below it.
 * Without recurrent layers it does nothing; ENOMEM when no state row is left. */
int kv_paged_seq_mark(kv_seq *s, herr *err);
/* Recurrent layers: s's next forward (from its current length) keeps the
 * state after each of its first n tokens too, in n state rows of s's own
 * (kv_seq.keep; taken once, kept until s is freed): then truncating s to
 * any length in (len, len + n] installs the state there, and publishing a
 * block that ends there snapshots it, so speculative verification neither
 * feeds accepted tokens again nor stops drafts at a block's end. The states
 * stay valid for the tokens s keeps (cutting s shortens them). Without
 * recurrent layers, or with a stale state, it keeps nothing; ENOMEM when no
 * state row is left. */
int kv_paged_seq_keep(kv_seq *s, int n, herr *err);
/* Cuts s back to at most n rows, as far as its state allows, and returns
 * its new length: n without recurrent layers, or where a kept state
 * (kv_paged_seq_keep) is at n; else with recurrent layers the mark's length
 * when it is at most n (the state restored), else 0 (the sequence starts
 * afresh and its tokens are fed again). Nothing happens when n >= len. */
int64_t kv_paged_seq_rewind(kv_seq *s, int64_t n);

/* ---- persistence: what a store of blocks on disk needs (engine/kv_disk.h) ---- */

/* A published block's key in the prefix cache. */
typedef struct kv_block_key {
  uint64_t hash;          /* chained over the whole prefix up to the block's end (and the adapter id) */
  uint64_t parent;        /* the previous block's hash */
  int32_t depth;          /* its index in the chain */
  const int32_t *tokens;  /* borrowed: its block_tokens tokens */
} kv_block_key;

/* Hooks a persistent store sets on a pool; they run on the thread that drives the pool. */
typedef struct kv_pool_spill {
  void *user;
  /* A cached block is about to be reused for other rows (its rows still hold its KV). */
  void (*evict)(void *user, kv_pool *p, int32_t block);
  /* Whether the store holds the block (hash, parent): asked when the prefix cache has none. */
  bool (*has)(void *user, uint64_t hash, uint64_t parent);
  /* Fills `block` (taken for it) with the stored block (hash, parent, tokens): 0, or nonzero
   * when it cannot (the block goes back to the free list and the prefix ends there). */
  int (*load)(void *user, kv_pool *p, int32_t block, uint64_t hash, uint64_t parent, const int32_t *tokens);
} kv_pool_spill;
/* NULL removes them. */
void kv_pool_set_spill(kv_pool *p, const kv_pool_spill *sp);
int64_t kv_pool_blocks(const kv_pool *p);
/* Whether the arenas are in host memory (a CPU backend). */
bool kv_pool_on_host(const kv_pool *p);
/* The published blocks from the least to the most recently used: the cached
 * ones (nobody holds them) in LRU order, then those sequences hold. out has
 * room for kv_pool_blocks; returns how many it wrote. */
int64_t kv_pool_published_by_use(const kv_pool *p, int32_t *out);
/* Whether block b is published (in the prefix cache, held or not), and its key. */
bool kv_pool_block_published(const kv_pool *p, int32_t b, kv_block_key *out);
/* Bytes of one block's contents in every arena of the pool, in the order
 * kv_pool_block_read writes them (layer by layer, K then V). */
size_t kv_pool_block_payload(const kv_pool *p);
int kv_pool_block_read(kv_pool *p, int32_t b, void *dst, herr *err);
/* Overwrites block b's rows with kv_pool_block_payload bytes (waits for the copy). */
int kv_pool_block_write(kv_pool *p, int32_t b, const void *src, herr *err);
/* What a block's bytes are (element type, block size, per-layer row widths,
 * K/V where V's differs):
 * a text that two pools share exactly when their blocks are interchangeable. */
void kv_pool_format(const kv_pool *p, char *buf, size_t cap);

#endif
