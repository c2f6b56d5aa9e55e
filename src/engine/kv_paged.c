/* kv_paged.c — the paged KV cache and its prefix cache (see kv_paged.h): a
 * pool of blocks in per-layer arenas of backend memory (one buffer), a free list, an LRU list of cached
 * blocks nobody holds, a hash index over published blocks, and per-sequence
 * block tables that attention reads. Knows
 * nothing of models beyond row sizes, nor of scheduling or threads. */
#include "engine/kv_paged.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/vec.h"

typedef struct block_meta {
  int32_t ref;          /* sequences holding it */
  bool hashed;          /* published: in the hash index */
  uint64_t hash;        /* chained over the whole prefix up to this block's end */
  uint64_t parent;      /* the previous block's hash (root: PREFIX_ROOT) */
  int32_t depth;        /* published: its index in the chain (0: the first block of a prompt) */
  int32_t hnext;        /* next block in the same hash bucket, -1 */
  int32_t prev, next;   /* LRU links (cached) or free-list link (next), -1 */
  int32_t snap;         /* published, of a model with recurrent layers: the state row holding the
                           recurrent state after this block's last token, or -1 */
  uint64_t snap_used;   /* when that snapshot was made or last taken (snapshot eviction order) */
} block_meta;

struct kv_pool {
  int n_layers;
  int64_t kv_dim[CFG_MAX_LAYERS];
  int64_t v_dim[CFG_MAX_LAYERS];  /* V row widths (model_kv_v_dim) */
  model_kv_geometry geom;     /* as made: per-layer row sizes and storage formats */
  int B;                      /* rows per block */
  int64_t n_blocks;
  bk_backend *be;             /* borrowed: where the arenas live */
  bk_backend *own_be;         /* owned: a CPU backend opened for a geometry that named none */
  bk_buf *buf;                /* owned: every layer's K and V arenas */
  kv_store store;             /* views of buf: layer l's arenas of n_blocks * B rows */
  bool growable;              /* reserve doubles the pool instead of failing */
  block_meta *meta;           /* owned [n_blocks] */
  int32_t *tokens;            /* owned [n_blocks * B]: a published block's tokens */
  int32_t *buckets;           /* owned [n_buckets] heads of hash chains, -1 */
  int64_t n_buckets;
  int32_t free_head;
  int64_t n_free;
  int32_t lru_head, lru_tail; /* head: least recently released */
  int64_t n_cached, n_used;
  /* recurrent layers: one state row per sequence, and snapshots at block ends */
  int64_t state_dim[CFG_MAX_LAYERS];
  bool has_state;
  bk_buf *sbuf;               /* owned: every recurrent layer's state arena (store.state) */
  int32_t *state_free;        /* owned: the free state rows (a stack) */
  int64_t n_state_free;
  int64_t max_snaps, n_snaps; /* snapshots kept at most / now */
  uint64_t snap_clock;
  kv_pool_spill spill;        /* a persistent store's hooks (all NULL: none) */
  /* tensor parallelism: ranks 1.. keep arenas of their own, same blocks (rank 0's are be, buf, sbuf, store) */
  int n_ranks;                /* 1: none */
  bk_backend *rbe[KV_MAX_RANKS];          /* borrowed */
  bk_buf *rbuf[KV_MAX_RANKS], *rsbuf[KV_MAX_RANKS]; /* owned */
  kv_store rst[KV_MAX_RANKS];
};

static bk_backend *rank_be(const kv_pool *p, int r) { return r ? p->rbe[r] : p->be; }
static kv_store *rank_st(kv_pool *p, int r) { return r ? &p->rst[r] : &p->store; }
static const kv_store *rank_cst(const kv_pool *p, int r) { return r ? &p->rst[r] : &p->store; }
static bk_buf **rank_buf(kv_pool *p, int r) { return r ? &p->rbuf[r] : &p->buf; }
static bk_buf **rank_sbuf(kv_pool *p, int r) { return r ? &p->rsbuf[r] : &p->sbuf; }
/* rank 0's store names the others' (the forward of rank r reads kv_store_rank(store, r)) */
static void link_ranks(kv_pool *p) {
  for (int r = 1; r < p->n_ranks; r++) p->store.rank[r] = &p->rst[r];
}

typedef struct paged_seq {
  kv_seq base;                /* must be first: the model sees this */
  kv_pool *pool;              /* borrowed */
  int64_t max_len;            /* 0 = unlimited */
  int32_t *table;             /* owned [cap] block ids */
  int64_t n_blocks, cap;
  int64_t n_published;        /* leading blocks already published or attached */
  uint64_t last_hash;         /* hash of block n_published - 1 (root when none) */
  bool stale;                 /* truncated to a length its recurrent state no longer matches */
  int32_t mark;               /* recurrent layers: a state row holding the state at length mark_len (-1: none) */
  int64_t mark_len;           /* -1: no mark */
  int32_t *keep_rows;         /* owned [n_keep_rows]: state rows for the states after a forward's tokens (kv_seq.keep) */
  int32_t n_keep_rows;
} paged_seq;

#define PREFIX_ROOT 0x6a09e667f3bcc909ull

static uint64_t block_hash(uint64_t parent, uint64_t adapter_id, const int32_t *toks, int n) {
  uint64_t h = hmix64(parent ^ hmix64(adapter_id + HMIX64_GAMMA));
  for (int i = 0; i < n; i++) h = hmix64(h ^ ((uint64_t)(uint32_t)toks[i] + ((uint64_t)i << 32)));
  return h;
}

size_t kv_state_bytes(const model_kv_geometry *g) {
  size_t b = 0;
  for (int l = 0; l < g->n_layers; l++) b += (size_t)g->state_dim[l] * sizeof(float);
  return b;
}

size_t kv_block_bytes(const model_kv_geometry *g, int block_tokens) {
  size_t b = 0;
  for (int l = 0; l < g->n_layers; l++)
    b += (size_t)block_tokens *
         (bk_kv_row_bytes(g->k_fmt[l], g->kv_dim[l]) + bk_kv_row_bytes(g->v_fmt[l], model_kv_v_dim(g, l)));
  return b * (size_t)(g->n_ranks > 1 ? g->n_ranks : 1); /* every rank's arenas */
}

void kv_format_describe(const model_kv_geometry *g, char *buf, size_t n) {
  bool uniform = true;
  int first = -1;
  for (int l = 0; l < g->n_layers; l++) {
    if (!g->kv_dim[l]) continue; /* stores nothing */
    if (first < 0) first = l;
    else if (g->k_fmt[l] != g->k_fmt[first] || g->v_fmt[l] != g->v_fmt[first]) uniform = false;
  }
  if (n == 0) return;
  buf[0] = 0;
  if (first < 0) {
    snprintf(buf, n, "f32");
  } else if (uniform && g->k_fmt[first] == g->v_fmt[first]) {
    snprintf(buf, n, "%s", bk_kv_fmt_name(g->k_fmt[first]));
  } else if (uniform) {
    snprintf(buf, n, "k:%s,v:%s", bk_kv_fmt_name(g->k_fmt[first]), bk_kv_fmt_name(g->v_fmt[first]));
  } else {
    size_t at = 0;
    for (int l = 0; l < g->n_layers && at < n; l++) {
      if (!g->kv_dim[l]) continue;
      int w = snprintf(buf + at, n - at, "%s%d:%s/%s", at ? "," : "", l, bk_kv_fmt_name(g->k_fmt[l]), bk_kv_fmt_name(g->v_fmt[l]));
      if (w < 0) break;
      at += (size_t)w;
    }
  }
}

/* ---- lists ---- */

static void lru_unlink(kv_pool *p, int32_t b) {
  block_meta *m = &p->meta[b];
  if (m->prev >= 0) p->meta[m->prev].next = m->next;
  else p->lru_head = m->next;
  if (m->next >= 0) p->meta[m->next].prev = m->prev;
  else p->lru_tail = m->prev;
  m->prev = m->next = -1;
  p->n_cached--;
}

static void lru_push_tail(kv_pool *p, int32_t b) {
  block_meta *m = &p->meta[b];
  m->next = -1;
  m->prev = p->lru_tail;
  if (p->lru_tail >= 0) p->meta[p->lru_tail].next = b;
  else p->lru_head = b;
  p->lru_tail = b;
  p->n_cached++;
}

static void free_push(kv_pool *p, int32_t b) {
  p->meta[b].next = p->free_head;
  p->meta[b].prev = -1;
  p->free_head = b;
  p->n_free++;
}

static void drop_snap(kv_pool *p, int32_t b) {
  block_meta *m = &p->meta[b];
  if (m->snap < 0) return;
  p->state_free[p->n_state_free++] = m->snap;
  m->snap = -1;
  p->n_snaps--;
}

static void unhash(kv_pool *p, int32_t b) {
  block_meta *m = &p->meta[b];
  drop_snap(p, b);
  if (!m->hashed) return;
  int32_t *at = &p->buckets[m->hash % (uint64_t)p->n_buckets];
  while (*at >= 0 && *at != b) at = &p->meta[*at].hnext;
  if (*at == b) *at = m->hnext;
  m->hnext = -1;
  m->hashed = false;
}

static int32_t lookup(const kv_pool *p, uint64_t hash, uint64_t parent, const int32_t *toks) {
  for (int32_t b = p->buckets[hash % (uint64_t)p->n_buckets]; b >= 0; b = p->meta[b].hnext) {
    const block_meta *m = &p->meta[b];
    if (m->hash == hash && m->parent == parent && memcmp(p->tokens + (int64_t)b * p->B, toks, sizeof(int32_t) * (size_t)p->B) == 0)
      return b;
  }
  return -1;
}

/* Puts block b in the hash index under (hash, parent, tokens). */
static void publish_block(kv_pool *p, int32_t b, uint64_t hash, uint64_t parent, int32_t depth, const int32_t *toks) {
  block_meta *m = &p->meta[b];
  m->hashed = true;
  m->hash = hash;
  m->parent = parent;
  m->depth = depth;
  memcpy(p->tokens + (int64_t)b * p->B, toks, sizeof(int32_t) * (size_t)p->B);
  int32_t *head = &p->buckets[hash % (uint64_t)p->n_buckets];
  m->hnext = *head;
  *head = b;
}

/* A block for a sequence: a free one, else the least recently used cached one. */
static int32_t take_block(kv_pool *p) {
  int32_t b = -1;
  if (p->free_head >= 0) {
    b = p->free_head;
    p->free_head = p->meta[b].next;
    p->n_free--;
  } else if (p->lru_head >= 0) {
    b = p->lru_head;
    if (p->spill.evict) p->spill.evict(p->spill.user, p, b); /* its rows still hold its KV */
    lru_unlink(p, b);
    unhash(p, b);
  } else {
    return -1;
  }
  p->meta[b].ref = 1;
  p->meta[b].prev = p->meta[b].next = -1;
  p->n_used++;
  return b;
}

static void hold_block(kv_pool *p, int32_t b) {
  if (p->meta[b].ref++ == 0) {
    lru_unlink(p, b);
    p->n_used++;
  }
}

static void release_block(kv_pool *p, int32_t b) {
  if (--p->meta[b].ref > 0) return;
  p->n_used--;
  if (p->meta[b].hashed) lru_push_tail(p, b);
  else free_push(p, b);
}

/* ---- the pool ---- */

/* Allocates the arenas of n_blocks blocks into each rank's buffer and store (nothing changed on failure). */
static int alloc_arenas(kv_pool *p, int64_t n_blocks, herr *err) {
  size_t bytes = (size_t)n_blocks * kv_block_bytes(&p->geom, p->B) / (size_t)p->n_ranks;
  bk_buf *bufs[KV_MAX_RANKS] = {0};
  kv_store sts[KV_MAX_RANKS];
  int rc = 0;
  for (int r = 0; r < p->n_ranks && !rc; r++) {
    if ((rc = bk_buf_new(rank_be(p, r), bytes, &bufs[r], err))) {
      herr_wrap(err, "KV pool: %lld blocks of %d tokens (%zu bytes)", (long long)n_blocks, p->B, bytes);
      break;
    }
    kv_store st = {.n_layers = p->n_layers, .block_rows = p->B, .n_slots = n_blocks * p->B, .n_states = p->store.n_states};
    memcpy(st.state, rank_st(p, r)->state, sizeof st.state); /* the state arenas live in a buffer of their own */
    size_t off = 0;
    for (int l = 0; l < p->n_layers; l++) { /* a row of a quantized arena: its stored bytes as 4-byte words */
      int64_t rows = n_blocks * p->B;
      int64_t kw = (int64_t)(bk_kv_row_bytes(p->geom.k_fmt[l], p->kv_dim[l]) / 4);
      int64_t vw = (int64_t)(bk_kv_row_bytes(p->geom.v_fmt[l], p->v_dim[l]) / 4);
      st.k[l] = (bk_tensor){.buf = bufs[r], .off = off, .dt = BK_DT_F32, .rows = rows, .cols = kw};
      off += (size_t)(rows * kw) * sizeof(float);
      st.v[l] = (bk_tensor){.buf = bufs[r], .off = off, .dt = BK_DT_F32, .rows = rows, .cols = vw};
      off += (size_t)(rows * vw) * sizeof(float);
      st.k_fmt[l] = p->geom.k_fmt[l];
      st.v_fmt[l] = p->geom.v_fmt[l];
    }
    if (p->buf) { /* growing: the old blocks keep their ids and contents */
      const kv_store *old = rank_st(p, r);
      for (int l = 0; l < p->n_layers; l++) {
        bk_copy(&st.k[l], 0, &old->k[l], 0, bk_nbytes(&old->k[l]));
        bk_copy(&st.v[l], 0, &old->v[l], 0, bk_nbytes(&old->v[l]));
      }
      rc = bk_sync(rank_be(p, r), err);
    }
    sts[r] = st;
  }
  if (rc) {
    for (int r = 0; r < p->n_ranks; r++) bk_buf_free(bufs[r]);
    return rc;
  }
  for (int r = 0; r < p->n_ranks; r++) {
    bk_buf_free(*rank_buf(p, r));
    *rank_buf(p, r) = bufs[r];
    *rank_st(p, r) = sts[r];
  }
  link_ranks(p);
  return 0;
}

/* Grows the state arenas to n rows (the old rows keep their contents); the new rows go on the free stack. */
static int alloc_states(kv_pool *p, int64_t n, herr *err) {
  int64_t old = p->store.n_states;
  size_t bytes = 0;
  for (int l = 0; l < p->n_layers; l++) bytes += (size_t)n * (size_t)p->state_dim[l] * sizeof(float);
  int32_t *fr = realloc(p->state_free, sizeof(int32_t) * (size_t)n);
  if (!fr) return herr_set(err, HEARTH_ENOMEM, "KV pool: out of memory for %lld recurrent states", (long long)n);
  p->state_free = fr;
  bk_buf *bufs[KV_MAX_RANKS] = {0};
  bk_tensor st[KV_MAX_RANKS][CFG_MAX_LAYERS];
  int rc = 0;
  for (int r = 0; r < p->n_ranks && !rc; r++) {
    if ((rc = bk_buf_new(rank_be(p, r), bytes, &bufs[r], err))) {
      herr_wrap(err, "KV pool: %lld recurrent states (%zu bytes)", (long long)n, bytes);
      break;
    }
    size_t off = 0;
    for (int l = 0; l < p->n_layers; l++) {
      st[r][l] = (bk_tensor){0};
      if (!p->state_dim[l]) continue;
      st[r][l] = (bk_tensor){.buf = bufs[r], .off = off, .dt = BK_DT_F32, .rows = n, .cols = p->state_dim[l]};
      if (old) bk_copy(&st[r][l], 0, &rank_st(p, r)->state[l], 0, bk_nbytes(&rank_st(p, r)->state[l]));
      off += (size_t)(n * p->state_dim[l]) * sizeof(float);
    }
    if (old) rc = bk_sync(rank_be(p, r), err);
  }
  if (rc) {
    for (int r = 0; r < p->n_ranks; r++) bk_buf_free(bufs[r]);
    return rc;
  }
  for (int r = 0; r < p->n_ranks; r++) {
    bk_buf_free(*rank_sbuf(p, r));
    *rank_sbuf(p, r) = bufs[r];
    memcpy(rank_st(p, r)->state, st[r], sizeof st[r]);
    rank_st(p, r)->n_states = n;
  }
  for (int64_t r = n - 1; r >= old; r--) p->state_free[p->n_state_free++] = (int32_t)r;
  return 0;
}

int kv_pool_reserve_states(kv_pool *p, int64_t n, herr *err) {
  if (!p->has_state || n <= p->store.n_states) return 0;
  return alloc_states(p, n, err);
}

/* A free state row, growing the arenas when none is left; -1 on failure (err set). */
static int32_t take_state(kv_pool *p, herr *err) {
  if (!p->n_state_free && alloc_states(p, p->store.n_states * 2, err)) return -1;
  return p->state_free[--p->n_state_free];
}

/* Copies state row src to row dst in every recurrent layer (queued on the backend). */
static void copy_state(kv_pool *p, int32_t dst, int32_t src) {
  for (int r = 0; r < p->n_ranks; r++)
    for (int l = 0; l < p->n_layers; l++) {
      size_t row = (size_t)p->state_dim[l] * sizeof(float);
      const bk_tensor *t = &rank_st(p, r)->state[l];
      if (row) bk_copy(t, (size_t)dst * row, t, (size_t)src * row, row);
    }
}

int kv_pool_new(const model_kv_geometry *g, int block_tokens, int64_t n_blocks, kv_pool **out, herr *err) {
  *out = NULL;
  if (g->n_layers <= 0 || g->n_layers > CFG_MAX_LAYERS)
    return herr_set(err, HEARTH_EINVAL, "KV pool: %d layers is out of range", g->n_layers);
  if (block_tokens < 1 || block_tokens > 4096)
    return herr_set(err, HEARTH_EINVAL, "KV pool: a block of %d tokens is out of range (1..4096)", block_tokens);
  if (n_blocks < 1 || n_blocks > INT32_MAX / 2)
    return herr_set(err, HEARTH_EINVAL, "KV pool: %lld blocks is out of range", (long long)n_blocks);
  kv_pool *p = calloc(1, sizeof *p);
  if (!p) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (int l = 0; l < g->n_layers; l++)
    if ((unsigned)g->k_fmt[l] > BK_KV_FMT_LAST || (unsigned)g->v_fmt[l] > BK_KV_FMT_LAST) {
      free(p);
      return herr_set(err, HEARTH_EINVAL, "KV pool: layer %d has an unknown storage format", l);
    }
  p->n_layers = g->n_layers;
  memcpy(p->kv_dim, g->kv_dim, sizeof p->kv_dim);
  for (int l = 0; l < g->n_layers; l++) p->v_dim[l] = model_kv_v_dim(g, l);
  p->geom = *g;
  p->B = block_tokens;
  p->n_blocks = n_blocks;
  p->n_buckets = n_blocks * 2 + 1;
  p->be = g->backend;
  p->n_ranks = g->n_ranks > 1 ? g->n_ranks : 1;
  if (p->n_ranks > KV_MAX_RANKS) {
    free(p);
    return herr_set(err, HEARTH_EINVAL, "KV pool: %d ranks is out of range (at most %d)", g->n_ranks, KV_MAX_RANKS);
  }
  for (int r = 1; r < p->n_ranks; r++) p->rbe[r] = g->rank_backend[r];
  int rc = 0;
  if (!p->be && (rc = bk_cpu_open(&(bk_open_opts){.threads = 1}, &p->own_be, err))) {
    free(p);
    return rc;
  }
  if (!p->be) p->be = p->own_be;
  p->meta = calloc((size_t)n_blocks, sizeof *p->meta);
  p->tokens = malloc(sizeof(int32_t) * (size_t)(n_blocks * block_tokens));
  p->buckets = malloc(sizeof(int32_t) * (size_t)p->n_buckets);
  if (!p->meta || !p->tokens || !p->buckets) {
    kv_pool_free(p);
    return herr_set(err, HEARTH_ENOMEM, "KV pool: out of memory for the tables of %lld blocks", (long long)n_blocks);
  }
  if ((rc = alloc_arenas(p, n_blocks, err))) {
    kv_pool_free(p);
    return rc;
  }
  memcpy(p->state_dim, g->state_dim, sizeof p->state_dim);
  for (int l = 0; l < p->n_layers; l++) p->has_state |= p->state_dim[l] > 0;
  p->max_snaps = 8;
  if (p->has_state && (rc = alloc_states(p, 4, err))) {
    kv_pool_free(p);
    return rc;
  }
  for (int64_t i = 0; i < p->n_buckets; i++) p->buckets[i] = -1;
  p->free_head = p->lru_head = p->lru_tail = -1;
  for (int64_t b = n_blocks - 1; b >= 0; b--) {
    p->meta[b].hnext = -1;
    p->meta[b].snap = -1;
    free_push(p, (int32_t)b);
  }
  *out = p;
  return 0;
}

void kv_pool_set_growable(kv_pool *p, bool growable) { p->growable = growable; }

/* Drops the least recently made or used snapshot. */
static void drop_oldest_snap(kv_pool *p) {
  int32_t old = -1;
  for (int64_t b = 0; b < p->n_blocks; b++)
    if (p->meta[b].snap >= 0 && (old < 0 || p->meta[b].snap_used < p->meta[old].snap_used)) old = (int32_t)b;
  if (old >= 0) drop_snap(p, old);
}

void kv_pool_set_snapshots(kv_pool *p, int64_t n) {
  p->max_snaps = n < 0 ? 0 : n;
  while (p->n_snaps > p->max_snaps) drop_oldest_snap(p);
}

bool kv_pool_recurrent(const kv_pool *p) { return p->has_state; }

/* Doubles the pool (at least to n_blocks + need): new blocks go on the free list. */
static int pool_grow(kv_pool *p, int64_t need, herr *err) {
  int64_t n = p->n_blocks * 2;
  if (n < p->n_blocks + need) n = p->n_blocks + need;
  if (n > INT32_MAX / 2) return herr_set(err, HEARTH_ELIMIT, "KV pool: cannot grow past %lld blocks", (long long)p->n_blocks);
  block_meta *meta = realloc(p->meta, sizeof *meta * (size_t)n);
  if (!meta) return herr_set(err, HEARTH_ENOMEM, "KV pool: out of memory growing to %lld blocks", (long long)n);
  p->meta = meta;
  int32_t *tokens = realloc(p->tokens, sizeof(int32_t) * (size_t)(n * p->B));
  if (!tokens) return herr_set(err, HEARTH_ENOMEM, "KV pool: out of memory growing to %lld blocks", (long long)n);
  p->tokens = tokens;
  int rc = alloc_arenas(p, n, err);
  if (rc) return rc;
  memset(p->meta + p->n_blocks, 0, sizeof *meta * (size_t)(n - p->n_blocks));
  for (int64_t b = n - 1; b >= p->n_blocks; b--) {
    p->meta[b].hnext = -1;
    p->meta[b].snap = -1;
    free_push(p, (int32_t)b);
  }
  p->n_blocks = n;
  return 0;
}

void kv_pool_free(kv_pool *p) {
  if (!p) return;
  for (int r = 0; r < p->n_ranks; r++) {
    bk_buf_free(*rank_buf(p, r));
    bk_buf_free(*rank_sbuf(p, r));
  }
  free(p->state_free);
  bk_backend_close(p->own_be);
  free(p->meta);
  free(p->tokens);
  free(p->buckets);
  free(p);
}

void kv_pool_count(const kv_pool *p, kv_pool_counts *out) {
  out->total = p->n_blocks;
  out->used = p->n_used;
  out->cached = p->n_cached;
  out->free = p->n_free;
}

int kv_pool_block_tokens(const kv_pool *p) { return p->B; }

int64_t kv_pool_available(const kv_pool *p) { return p->n_free + p->n_cached; }

/* ---- sequences ---- */

static int grow_table(paged_seq *ps, int64_t want) {
  return HGROW(ps->table, ps->cap, want) ? 0 : -1;
}

static void append_block(paged_seq *ps, int32_t b) { ps->table[ps->n_blocks++] = b; }

int64_t kv_paged_seq_blocks_for(const kv_seq *s, int64_t n_rows) {
  const paged_seq *ps = (const paged_seq *)s;
  int64_t need = (n_rows + ps->pool->B - 1) / ps->pool->B;
  return need > ps->n_blocks ? need - ps->n_blocks : 0;
}

static int paged_reserve(kv_seq *s, int64_t n, herr *err) {
  paged_seq *ps = (paged_seq *)s;
  kv_pool *p = ps->pool;
  if (ps->stale)
    return herr_set(err, HEARTH_EUNSUPPORTED,
                    "KV cache: the sequence was cut back to %lld tokens, but its recurrent state cannot go back; "
                    "start it over", (long long)s->len);
  int64_t rows = s->len + n;
  if (ps->max_len > 0 && rows > ps->max_len)
    return herr_set(err, HEARTH_ELIMIT, "KV cache: %lld tokens exceed the context limit of %lld", (long long)rows,
                    (long long)ps->max_len);
  int64_t need = kv_paged_seq_blocks_for(s, rows);
  if (need == 0) return 0;
  if (need > kv_pool_available(p) && p->growable) {
    int rc = pool_grow(p, need - kv_pool_available(p), err);
    if (rc) return rc;
  }
  if (need > kv_pool_available(p))
    return herr_set(err, HEARTH_ELIMIT, "KV pool: %lld more blocks needed, %lld available", (long long)need,
                    (long long)kv_pool_available(p));
  if (grow_table(ps, ps->n_blocks + need)) return herr_set(err, HEARTH_ENOMEM, "KV cache: out of memory for a block table");
  for (int64_t i = 0; i < need; i++) append_block(ps, take_block(p));
  return 0;
}

static const kv_store *paged_table(kv_seq *s, const int32_t **blocks, int64_t *n_blocks) {
  paged_seq *ps = (paged_seq *)s;
  *blocks = ps->table;
  *n_blocks = ps->n_blocks;
  return &ps->pool->store;
}

static void paged_commit(kv_seq *s, int64_t n) {
  if (s->len == s->keep_at && s->n_keep > n) s->n_keep = (int32_t)n; /* the states kept: only the tokens fed */
  s->len += n;
}

static const kv_ops paged_ops = {paged_reserve, paged_table, paged_commit};

int kv_paged_seq_new(kv_pool *p, int64_t max_len, kv_seq **out, herr *err) {
  *out = NULL;
  paged_seq *ps = calloc(1, sizeof *ps);
  if (!ps) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  ps->base.ops = &paged_ops;
  ps->base.state = -1;
  ps->mark = -1;
  ps->mark_len = -1;
  if (p->has_state && (ps->base.state = take_state(p, err)) < 0) {
    free(ps);
    return err ? err->code : HEARTH_ENOMEM;
  }
  ps->pool = p;
  ps->max_len = max_len;
  ps->last_hash = PREFIX_ROOT;
  *out = &ps->base;
  return 0;
}

void kv_paged_seq_free(kv_seq *s) {
  if (!s) return;
  paged_seq *ps = (paged_seq *)s;
  /* the tail first, so a chain's later blocks are evicted before its head */
  for (int64_t i = ps->n_blocks - 1; i >= 0; i--) release_block(ps->pool, ps->table[i]);
  if (s->state >= 0) ps->pool->state_free[ps->pool->n_state_free++] = s->state;
  if (ps->mark >= 0) ps->pool->state_free[ps->pool->n_state_free++] = ps->mark;
  for (int32_t i = 0; i < ps->n_keep_rows; i++) ps->pool->state_free[ps->pool->n_state_free++] = ps->keep_rows[i];
  free(ps->keep_rows);
  free(ps->table);
  free(ps);
}

int64_t kv_paged_seq_blocks(const kv_seq *s) { return ((const paged_seq *)s)->n_blocks; }

const int32_t *kv_paged_seq_table(const kv_seq *s) { return ((const paged_seq *)s)->table; }

/* A block the persistent store has for (hash, parent, tokens): taken, filled
 * and published, held once for the caller; -1 when the store has none. */
static int32_t spill_fetch(kv_pool *p, uint64_t hash, uint64_t parent, int32_t depth, const int32_t *toks) {
  if (!p->spill.has || !p->spill.has(p->spill.user, hash, parent)) return -1;
  int32_t b = take_block(p);
  if (b < 0) return -1;
  if (p->spill.load(p->spill.user, p, b, hash, parent, toks) != 0) {
    release_block(p, b); /* unhashed: back on the free list */
    return -1;
  }
  publish_block(p, b, hash, parent, depth, toks);
  return b;
}

int64_t kv_paged_seq_attach_prefix(kv_seq *s, const int32_t *tokens, int64_t n, uint64_t adapter_id) {
  paged_seq *ps = (paged_seq *)s;
  kv_pool *p = ps->pool;
  if (s->len != 0 || ps->n_blocks != 0) return 0;
  s->n_keep = 0;
  uint64_t parent = PREFIX_ROOT;
  int64_t i = 0;
  while ((i + 1) * p->B <= n - 1) {
    const int32_t *bt = tokens + i * p->B;
    uint64_t h = block_hash(parent, adapter_id, bt, p->B);
    if (grow_table(ps, i + 1)) break;
    int32_t b = lookup(p, h, parent, bt);
    if (b >= 0) hold_block(p, b);
    else if ((b = spill_fetch(p, h, parent, (int32_t)i, bt)) < 0) break;
    append_block(ps, b);
    parent = h;
    i++;
  }
  if (p->has_state) { /* only as far as the last block whose end has a state snapshot */
    int64_t keep = i;
    while (keep > 0 && p->meta[ps->table[keep - 1]].snap < 0) keep--;
    while (ps->n_blocks > keep) release_block(p, ps->table[--ps->n_blocks]);
    i = keep;
    parent = keep ? p->meta[ps->table[keep - 1]].hash : PREFIX_ROOT;
    if (keep) {
      block_meta *m = &p->meta[ps->table[keep - 1]];
      copy_state(p, s->state, m->snap);
      m->snap_used = ++p->snap_clock;
    }
  }
  ps->n_published = i;
  ps->last_hash = parent;
  s->len = i * p->B;
  return s->len;
}

/* A snapshot of state row src (s's state, or a kept one) as the state after block b. */
static void snapshot(kv_pool *p, paged_seq *ps, int32_t b, int32_t src) {
  if (p->max_snaps <= 0 || ps->stale || src < 0) return;
  while (p->n_snaps >= p->max_snaps) drop_oldest_snap(p);
  herr e = {0};
  int32_t row = take_state(p, &e);
  if (row < 0) return; /* no memory for one: this block just has none */
  copy_state(p, row, src);
  p->meta[b].snap = row;
  p->meta[b].snap_used = ++p->snap_clock;
  p->n_snaps++;
}

/* The state row kept for length n (kv_seq.keep: the state after token n - 1 of the last forward
 * that kept its states), or -1. */
static int32_t kept_row(const kv_seq *s, int64_t n) {
  return n > s->keep_at && n <= s->keep_at + s->n_keep ? s->keep[n - s->keep_at - 1] : -1;
}

void kv_paged_seq_publish(kv_seq *s, const int32_t *tokens, int64_t n, uint64_t adapter_id) {
  paged_seq *ps = (paged_seq *)s;
  kv_pool *p = ps->pool;
  if (n > s->len) n = s->len;
  while ((ps->n_published + 1) * p->B <= n) {
    int64_t i = ps->n_published;
    const int32_t *bt = tokens + i * p->B;
    uint64_t h = block_hash(ps->last_hash, adapter_id, bt, p->B);
    int32_t b = ps->table[i], same = p->meta[b].hashed ? -1 : lookup(p, h, ps->last_hash, bt);
    if (!p->meta[b].hashed && same < 0) publish_block(p, b, h, ps->last_hash, (int32_t)i, bt);
    /* the snapshot goes with the block a later match finds: this one, or the same prefix's published twin */
    int32_t keeper = same >= 0 ? same : b;
    /* the state at the block's end: the sequence's own when it ends there, else a kept one (kv_seq.keep) */
    int64_t end = (i + 1) * p->B;
    int32_t src = end == s->len ? s->state : kept_row(s, end);
    if (p->has_state && p->meta[keeper].snap < 0) snapshot(p, ps, keeper, src);
    ps->last_hash = h;
    ps->n_published++;
  }
}

void kv_paged_seq_truncate(kv_seq *s, int64_t n) {
  paged_seq *ps = (paged_seq *)s;
  if (n < 0 || n >= s->len) return;
  int64_t keep = (n + ps->pool->B - 1) / ps->pool->B;
  while (ps->n_blocks > keep) release_block(ps->pool, ps->table[--ps->n_blocks]);
  if (ps->n_published > n / ps->pool->B) { /* the next publish re-walks the chain from the root */
    ps->n_published = 0;
    ps->last_hash = PREFIX_ROOT;
  }
  int32_t kept = kept_row(s, n);
  if (ps->pool->has_state && kept >= 0) { /* a kept state: installed */
    copy_state(ps->pool, s->state, kept);
    ps->stale = false;
  } else if (ps->pool->has_state && n == ps->mark_len) { /* back to the mark: its state again */
    copy_state(ps->pool, s->state, ps->mark);
    ps->stale = false;
  } else if (ps->pool->has_state) {
    ps->stale = n > 0; /* from 0 it starts afresh; elsewhere its state is past n */
  }
  if (n < ps->mark_len) ps->mark_len = -1;
  if (n < s->keep_at + s->n_keep) s->n_keep = n > s->keep_at ? (int32_t)(n - s->keep_at) : 0; /* past n: no longer kept */
  s->len = n;
}

int kv_paged_seq_mark(kv_seq *s, herr *err) {
  paged_seq *ps = (paged_seq *)s;
  kv_pool *p = ps->pool;
  if (!p->has_state) return 0;
  ps->mark_len = -1;
  if (ps->stale || s->state < 0) return 0; /* no state worth keeping: a rewind goes to 0 */
  if (ps->mark < 0 && (ps->mark = take_state(p, err)) < 0) return err ? err->code : HEARTH_ENOMEM;
  copy_state(p, ps->mark, s->state);
  ps->mark_len = s->len;
  return 0;
}

int kv_paged_seq_keep(kv_seq *s, int n, herr *err) {
  paged_seq *ps = (paged_seq *)s;
  kv_pool *p = ps->pool;
  s->n_keep = 0;
  if (!p->has_state || n <= 0 || ps->stale || s->state < 0) return 0;
  if (n > ps->n_keep_rows) {
    int32_t *rows = realloc(ps->keep_rows, sizeof(int32_t) * (size_t)n);
    if (!rows) return herr_set(err, HEARTH_ENOMEM, "out of memory");
    ps->keep_rows = rows;
    while (ps->n_keep_rows < n) {
      int32_t r = take_state(p, err);
      if (r < 0) return err ? err->code : HEARTH_ENOMEM;
      ps->keep_rows[ps->n_keep_rows++] = r;
    }
  }
  s->keep = ps->keep_rows;
  s->n_keep = n;
  s->keep_at = s->len;
  return 0;
}

int64_t kv_paged_seq_rewind(kv_seq *s, int64_t n) {
  paged_seq *ps = (paged_seq *)s;
  if (n < 0 || n >= s->len) return s->len;
  if (ps->pool->has_state && kept_row(s, n) < 0)
    n = ps->mark_len >= 0 && ps->mark_len <= n ? ps->mark_len : 0;
  kv_paged_seq_truncate(s, n);
  return s->len;
}

const kv_store *kv_pool_store(const kv_pool *p) { return &p->store; }

/* ---- what a persistent store needs (kv_disk.h) ---- */

void kv_pool_set_spill(kv_pool *p, const kv_pool_spill *sp) {
  if (sp) p->spill = *sp;
  else memset(&p->spill, 0, sizeof p->spill);
}

int64_t kv_pool_blocks(const kv_pool *p) { return p->n_blocks; }

bool kv_pool_on_host(const kv_pool *p) { return bk_backend_is_cpu(p->be); }

int64_t kv_pool_published_by_use(const kv_pool *p, int32_t *out) {
  int64_t n = 0;
  for (int32_t b = p->lru_head; b >= 0; b = p->meta[b].next)
    if (p->meta[b].hashed) out[n++] = b;
  for (int64_t b = 0; b < p->n_blocks; b++)
    if (p->meta[b].hashed && p->meta[b].ref > 0) out[n++] = (int32_t)b;
  return n;
}

bool kv_pool_block_published(const kv_pool *p, int32_t b, kv_block_key *out) {
  if (b < 0 || b >= p->n_blocks || !p->meta[b].hashed) return false;
  const block_meta *m = &p->meta[b];
  *out = (kv_block_key){.hash = m->hash, .parent = m->parent, .depth = m->depth, .tokens = p->tokens + (int64_t)b * p->B};
  return true;
}

/* The arenas of a block, in payload order: layer by layer, K then V (layers
 * that store nothing have none). */
#define FOR_BLOCK_ARENAS(p, t)                                                   \
  for (int r_ = 0; r_ < (p)->n_ranks; r_++)                                      \
    for (int l_ = 0; l_ < (p)->n_layers; l_++)                                   \
      for (int kv_ = 0; kv_ < 2; kv_++)                                          \
        for (const bk_tensor *t = kv_ ? &rank_cst(p, r_)->v[l_] : &rank_cst(p, r_)->k[l_]; t; t = NULL) \
          if (t->rows > 0 && t->cols > 0)

static size_t arena_row_bytes(const bk_tensor *t) { return bk_nbytes(t) / (size_t)t->rows; }

size_t kv_pool_block_payload(const kv_pool *p) {
  size_t n = 0;
  FOR_BLOCK_ARENAS(p, t) n += arena_row_bytes(t) * (size_t)p->B;
  return n;
}

int kv_pool_block_read(kv_pool *p, int32_t b, void *dst, herr *err) {
  unsigned char *at = dst;
  FOR_BLOCK_ARENAS(p, t) {
    size_t n = arena_row_bytes(t) * (size_t)p->B;
    int rc = bk_get(t, (size_t)b * n, at, n, err);
    if (rc) return rc;
    at += n;
  }
  return 0;
}

int kv_pool_block_write(kv_pool *p, int32_t b, const void *src, herr *err) {
  const unsigned char *at = src;
  FOR_BLOCK_ARENAS(p, t) {
    size_t n = arena_row_bytes(t) * (size_t)p->B;
    int rc = bk_set(t, (size_t)b * n, at, n, err);
    if (rc) return rc;
    at += n;
  }
  for (int r = 0; r < p->n_ranks; r++) { /* the source may be a mapping the caller closes next */
    int rc = bk_sync(rank_be(p, r), err);
    if (rc) return rc;
  }
  return 0;
}

void kv_pool_format(const kv_pool *p, char *buf, size_t cap) {
  char fmt[128];
  kv_format_describe(&p->geom, fmt, sizeof fmt); /* "f32", or the quantized formats (a store of another format is not read) */
  char ranks[32] = ""; /* tensor parallelism: the dims are each rank's */
  if (p->n_ranks > 1) snprintf(ranks, sizeof ranks, " ranks=%d", p->n_ranks);
  size_t n = (size_t)snprintf(buf, cap, "kv=%s block=%d layers=%d%s dims=", fmt, p->B, p->n_layers, ranks);
  for (int l = 0; l < p->n_layers && n < cap; l++) {
    n += (size_t)snprintf(buf + n, cap - n, "%s%lld", l ? "," : "", (long long)p->kv_dim[l]);
    if (n < cap && p->v_dim[l] != p->kv_dim[l]) n += (size_t)snprintf(buf + n, cap - n, "/%lld", (long long)p->v_dim[l]);
  }
}

const model_kv_geometry *kv_pool_geometry(const kv_pool *p) { return &p->geom; }

size_t kv_pool_block_bytes(const kv_pool *p) { return kv_block_bytes(&p->geom, p->B); }
