/* test_kv_paged.c — the paged KV cache: block tables place rows where views
 * read them; exhaustion fails a reserve without changing anything; published
 * blocks are shared by reference count and found again by their chained
 * prefix hash; cached blocks are evicted least recently used first; and a
 * model forward through the paged cache (any block size, prefix attached or
 * not) gives exactly the logits of the contiguous cache on the golden llama
 * fixture, and on the gemma4 one, whose last two layers read earlier
 * layers' rows and have no arenas of their own. Recurrent layers: every
 * sequence holds its own state row (kept across the arenas' growth), a
 * publish at a block's end keeps a snapshot of the state that a later
 * prefix match resumes from (and only there), the snapshot limit drops the
 * oldest, a sequence cut back to a nonzero length refuses to go on, and
 * one cut back to its mark (kv_paged_seq_mark / _rewind) has the state it
 * had there, one cut back among its kept states (kv_paged_seq_keep) the
 * state after that token, which a block ending there is published with. And
 * the glm5 fixture, whose K rows are compressed latents and V rows the
 * sparse-attention indexer's keys, of another width. */
#include "engine/kv_cache.h"
#include "engine/kv_paged.h"
#include "model/model.h"
#include "test.h"
#include "test_device.h"

#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden/"

static model_kv_geometry small_geom(void) {
  model_kv_geometry g = {0};
  g.n_layers = 2;
  g.kv_dim[0] = 4;
  g.kv_dim[1] = 8;
  return g;
}

static void test_block_table(void) {
  model_kv_geometry g = small_geom();
  kv_pool *p;
  herr e = {0};
  CHECK_EQ_INT(kv_pool_new(&g, 4, 10, &p, &e), 0);
  CHECK_EQ_INT(kv_block_bytes(&g, 4), 2 * 4 * (4 + 8) * 4);
  kv_seq *s;
  CHECK_EQ_INT(kv_paged_seq_new(p, 0, &s, &e), 0);
  CHECK_EQ_INT(s->ops->reserve(s, 6, &e), 0);
  CHECK_EQ_INT(kv_paged_seq_blocks(s), 2);
  /* rows written through the table land in distinct slots of every layer's arena and read back */
  const int32_t *tbl;
  int64_t nb;
  const kv_store *st = s->ops->table(s, &tbl, &nb);
  CHECK_EQ_INT(nb, 2);
  CHECK(tbl[0] != tbl[1]);
  CHECK(st == kv_pool_store(p));
  CHECK_EQ_INT(st->block_rows, 4);
  CHECK_EQ_INT(st->n_slots, 40);
  for (int l = 0; l < 2; l++) {
    CHECK_EQ_INT(st->k[l].cols, g.kv_dim[l]);
    CHECK_EQ_INT(st->k[l].rows, 40);
    for (int64_t pos = 0; pos < 6; pos++) {
      int64_t slot = tbl[pos / 4] * 4 + pos % 4;
      float *k = (float *)bk_addr(&st->k[l]) + slot * g.kv_dim[l], *v = (float *)bk_addr(&st->v[l]) + slot * g.kv_dim[l];
      for (int d = 0; d < g.kv_dim[l]; d++) k[d] = (float)(l * 1000 + pos * 10 + d), v[d] = -(float)(l * 1000 + pos * 10 + d);
    }
  }
  s->ops->commit(s, 6);
  CHECK_EQ_INT(s->len, 6);
  /* the K and V arenas of all layers do not overlap */
  for (int l = 0; l < 2; l++)
    for (int64_t pos = 0; pos < 6; pos++) {
      int64_t slot = tbl[pos / 4] * 4 + pos % 4;
      const float *k = (const float *)bk_addr(&st->k[l]) + slot * g.kv_dim[l], *v = (const float *)bk_addr(&st->v[l]) + slot * g.kv_dim[l];
      for (int d = 0; d < g.kv_dim[l]; d++) {
        CHECK(k[d] == (float)(l * 1000 + pos * 10 + d));
        CHECK(v[d] == -(float)(l * 1000 + pos * 10 + d));
      }
    }
  /* growing within the last block takes no block; past it takes one */
  CHECK_EQ_INT(s->ops->reserve(s, 2, &e), 0);
  CHECK_EQ_INT(kv_paged_seq_blocks(s), 2);
  CHECK_EQ_INT(s->ops->reserve(s, 3, &e), 0);
  CHECK_EQ_INT(kv_paged_seq_blocks(s), 3);
  kv_pool_counts c;
  kv_pool_count(p, &c);
  CHECK_EQ_INT(c.total, 10);
  CHECK_EQ_INT(c.used, 3);
  CHECK_EQ_INT(c.free, 7);
  /* exhaustion: a reserve that cannot be met fails and takes nothing */
  kv_seq *t;
  CHECK_EQ_INT(kv_paged_seq_new(p, 0, &t, &e), 0);
  CHECK_EQ_INT(t->ops->reserve(t, 8 * 4, &e), HEARTH_ELIMIT);
  CHECK_EQ_INT(kv_paged_seq_blocks(t), 0);
  CHECK_EQ_INT(kv_pool_available(p), 7);
  CHECK_EQ_INT(t->ops->reserve(t, 7 * 4, &e), 0);
  CHECK_EQ_INT(kv_pool_available(p), 0);
  kv_paged_seq_free(t);
  /* a context limit */
  kv_seq *u;
  CHECK_EQ_INT(kv_paged_seq_new(p, 5, &u, &e), 0);
  CHECK_EQ_INT(u->ops->reserve(u, 6, &e), HEARTH_ELIMIT);
  kv_paged_seq_free(u);
  kv_paged_seq_free(s);
  kv_pool_count(p, &c);
  CHECK_EQ_INT(c.used, 0);
  CHECK_EQ_INT(c.free, 10);
  kv_pool_free(p);
}

/* Fills n rows of s for tokens (values don't matter here) and publishes them. */
static void fill_publish(kv_seq *s, const int32_t *toks, int64_t n) {
  herr e = {0};
  int64_t at = s->len;
  CHECK_EQ_INT(s->ops->reserve(s, n - at, &e), 0);
  s->ops->commit(s, n - at);
  kv_paged_seq_publish(s, toks, n, 0);
}

static void test_prefix_sharing(void) {
  model_kv_geometry g = small_geom();
  kv_pool *p;
  herr e = {0};
  CHECK_EQ_INT(kv_pool_new(&g, 4, 16, &p, &e), 0);
  int32_t toks[16];
  for (int i = 0; i < 16; i++) toks[i] = 100 + i;
  kv_seq *a, *b, *c2, *d;
  kv_paged_seq_new(p, 0, &a, &e);
  fill_publish(a, toks, 14); /* 3 full blocks published, a 4th partial */
  kv_pool_counts c;
  /* a second sequence shares the 3 full blocks while a still holds them */
  kv_paged_seq_new(p, 0, &b, &e);
  CHECK_EQ_INT(kv_paged_seq_attach_prefix(b, toks, 16, 0), 12);
  CHECK_EQ_INT(b->len, 12);
  for (int i = 0; i < 3; i++) CHECK_EQ_INT(kv_paged_seq_table(b)[i], kv_paged_seq_table(a)[i]);
  kv_pool_count(p, &c);
  CHECK_EQ_INT(c.used, 4); /* shared blocks count once */
  /* the last prompt token is always computed: 12 tokens attach 2 blocks */
  kv_paged_seq_new(p, 0, &c2, &e);
  CHECK_EQ_INT(kv_paged_seq_attach_prefix(c2, toks, 12, 0), 8);
  /* a different token in block 2 stops the match there; another adapter matches nothing */
  int32_t other[16];
  memcpy(other, toks, sizeof other);
  other[9] = 7;
  kv_paged_seq_new(p, 0, &d, &e);
  CHECK_EQ_INT(kv_paged_seq_attach_prefix(d, other, 16, 0), 8);
  kv_paged_seq_free(d);
  kv_paged_seq_new(p, 0, &d, &e);
  CHECK_EQ_INT(kv_paged_seq_attach_prefix(d, toks, 16, 1), 0);
  kv_paged_seq_free(d);
  /* the same token in a later block but a different earlier block: the chain differs */
  int32_t shifted[16];
  memcpy(shifted, toks, sizeof shifted);
  shifted[0] = 1;
  kv_paged_seq_new(p, 0, &d, &e);
  CHECK_EQ_INT(kv_paged_seq_attach_prefix(d, shifted, 16, 0), 0);
  kv_paged_seq_free(d);
  kv_paged_seq_free(a);
  kv_paged_seq_free(b);
  kv_paged_seq_free(c2);
  kv_pool_count(p, &c);
  CHECK_EQ_INT(c.used, 0);
  CHECK_EQ_INT(c.cached, 3);
  CHECK_EQ_INT(c.free, 13);
  kv_pool_free(p);
}

static void test_eviction_order(void) {
  model_kv_geometry g = small_geom();
  kv_pool *p;
  herr e = {0};
  CHECK_EQ_INT(kv_pool_new(&g, 4, 4, &p, &e), 0);
  int32_t A[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, C[9] = {11, 12, 13, 14, 15, 16, 17, 18, 19};
  kv_seq *a, *c, *x;
  kv_paged_seq_new(p, 0, &a, &e);
  fill_publish(a, A, 8);
  kv_paged_seq_free(a); /* released first: least recently used */
  kv_paged_seq_new(p, 0, &c, &e);
  fill_publish(c, C, 8);
  kv_paged_seq_free(c);
  kv_pool_counts k;
  kv_pool_count(p, &k);
  CHECK_EQ_INT(k.cached, 4);
  CHECK_EQ_INT(k.free, 0);
  /* one new block evicts A's tail block (a chain's tail goes before its head) */
  kv_paged_seq_new(p, 0, &x, &e);
  CHECK_EQ_INT(x->ops->reserve(x, 4, &e), 0);
  kv_seq *probe;
  kv_paged_seq_new(p, 0, &probe, &e);
  CHECK_EQ_INT(kv_paged_seq_attach_prefix(probe, A, 9, 0), 4);
  kv_paged_seq_free(probe); /* A's head is now the most recently used */
  /* two more blocks: C's tail, then C's head (older than A's head now) */
  CHECK_EQ_INT(x->ops->reserve(x, 12, &e), 0);
  kv_paged_seq_new(p, 0, &probe, &e);
  CHECK_EQ_INT(kv_paged_seq_attach_prefix(probe, C, 9, 0), 0);
  kv_paged_seq_free(probe);
  kv_paged_seq_new(p, 0, &probe, &e);
  CHECK_EQ_INT(kv_paged_seq_attach_prefix(probe, A, 9, 0), 4);
  kv_paged_seq_free(probe);
  /* the pool is dry while x and a holder of A's head have everything */
  kv_paged_seq_new(p, 0, &probe, &e);
  CHECK_EQ_INT(kv_paged_seq_attach_prefix(probe, A, 9, 0), 4);
  kv_seq *y;
  kv_paged_seq_new(p, 0, &y, &e);
  CHECK_EQ_INT(y->ops->reserve(y, 1, &e), HEARTH_ELIMIT);
  kv_paged_seq_free(y);
  kv_paged_seq_free(probe);
  kv_paged_seq_free(x);
  kv_pool_count(p, &k);
  CHECK_EQ_INT(k.used, 0);
  kv_pool_free(p);
}

/* Forward tokens in chunks through s; logits of the last token into out. */
static int run_chunks(model *m, kv_seq *s, const int32_t *toks, int n, int chunk, float *out) {
  herr e = {0};
  for (int at = s->len; at < n;) {
    int k = n - at < chunk ? n - at : chunk;
    model_seq ms = {.kv = s, .tokens = toks + at, .n_tokens = k};
    model_batch b = {.seqs = &ms, .n_seqs = 1};
    if (model_forward(m, &b, out, &e)) {
      fprintf(stderr, "forward: %s\n", e.msg);
      return -1;
    }
    at += k;
  }
  return 0;
}

static void paged_equals_contiguous(const char *fixture) {
  model *m;
  herr e = {0};
  model_load_opts mo = {.threads = 2, .device = test_device()};
  CHECK_EQ_INT(model_load(fixture, &mo, &m, &e), 0);
  if (!m) return;
  model_kv_geometry g;
  model_kv_geometry_of(m, &g);
  /* layers that share another layer's KV (gemma4 num_kv_shared_layers) take no cache memory */
  int64_t L = g.n_layers, shared = json_integer_value(json_object_get(model_cfg(m)->raw, "num_kv_shared_layers"));
  size_t row_bytes = 0;
  for (int64_t l = 0; l < L; l++) {
    if (l >= L - shared) CHECK_EQ_INT(g.kv_dim[l], 0);
    else CHECK(g.kv_dim[l] > 0);
    row_bytes += (size_t)(g.kv_dim[l] + model_kv_v_dim(&g, l)) * sizeof(float);
  }
  CHECK_EQ_INT(kv_block_bytes(&g, 16), 16 * row_bytes);
  int64_t V = model_vocab_size(m);
  int32_t toks[70];
  for (int i = 0; i < 70; i++) toks[i] = (int32_t)((i * 37 + 11) % V);
  float *ref = malloc(sizeof(float) * (size_t)V), *got = malloc(sizeof(float) * (size_t)V);
  int blocks[] = {1, 4, 16, 64};
  int chunks[] = {1, 7, 70};
  for (int ci = 0; ci < 3; ci++) {
    /* the reference: the contiguous cache fed in the same chunks */
    kv_cache *cc;
    kv_seq *cs;
    kv_cache_new(&g, 0, &cc, &e);
    kv_cache_seq_new(cc, &cs, &e);
    CHECK_EQ_INT(run_chunks(m, cs, toks, 70, chunks[ci], ref), 0);
    kv_cache_seq_free(cs);
    kv_cache_free(cc);
    for (int bi = 0; bi < 4; bi++) {
      kv_pool *p;
      CHECK_EQ_INT(kv_pool_new(&g, blocks[bi], 256, &p, &e), 0);
      kv_seq *s;
      kv_paged_seq_new(p, 0, &s, &e);
      CHECK_EQ_INT(run_chunks(m, s, toks, 70, chunks[ci], got), 0);
      CHECK_MSG(memcmp(ref, got, sizeof(float) * (size_t)V) == 0, "block %d chunk %d", blocks[bi], chunks[ci]);
      kv_paged_seq_publish(s, toks, 70, 0);
      /* a second sequence from the prefix cache computes only the tail (in
       * other chunks, so the kernels' summation order may differ slightly) */
      kv_seq *s2;
      kv_paged_seq_new(p, 0, &s2, &e);
      int64_t hit = kv_paged_seq_attach_prefix(s2, toks, 70, 0);
      CHECK_EQ_INT(hit, (69 / blocks[bi]) * blocks[bi]);
      memset(got, 0, sizeof(float) * (size_t)V);
      CHECK_EQ_INT(run_chunks(m, s2, toks, 70, chunks[ci], got), 0);
      double worst = 0;
      for (int64_t i = 0; i < V; i++) worst = fmax(worst, fabs((double)ref[i] - got[i]));
      CHECK_MSG(worst <= 1e-4, "prefix: block %d chunk %d: max |diff| %g", blocks[bi], chunks[ci], worst);
      kv_paged_seq_free(s2);
      kv_paged_seq_free(s);
      kv_pool_free(p);
    }
  }
  free(ref);
  free(got);
  model_free(m);
}

/* One float per state row: the row's first value of layer 1 (the recurrent one). */
static void state_set(kv_pool *p, const kv_seq *s, float v) {
  const kv_store *st = kv_pool_store(p);
  herr e = {0};
  float row[6] = {v, v, v, v, v, v};
  CHECK_EQ_INT(bk_set(&st->state[1], (size_t)s->state * sizeof row, row, sizeof row, &e), 0);
}
static float state_get(kv_pool *p, const kv_seq *s) {
  const kv_store *st = kv_pool_store(p);
  herr e = {0};
  float row[6] = {0};
  CHECK_EQ_INT(bk_get(&st->state[1], (size_t)s->state * sizeof row, row, sizeof row, &e), 0);
  return row[5];
}

static void test_recurrent_states(void) {
  model_kv_geometry g = small_geom();
  g.kv_dim[1] = 0, g.state_dim[1] = 6;
  kv_pool *p;
  herr e = {0};
  CHECK_EQ_INT(kv_pool_new(&g, 4, 32, &p, &e), 0);
  CHECK(kv_pool_recurrent(p));
  CHECK(kv_pool_store(p)->state[0].buf == NULL);
  /* ten sequences: distinct rows, each keeping its value while the arenas grow */
  kv_seq *q[10];
  for (int i = 0; i < 10; i++) {
    CHECK_EQ_INT(kv_paged_seq_new(p, 0, &q[i], &e), 0);
    state_set(p, q[i], (float)i + 0.5f);
    for (int j = 0; j < i; j++) CHECK(q[j]->state != q[i]->state);
  }
  for (int i = 0; i < 10; i++) CHECK(state_get(p, q[i]) == (float)i + 0.5f);
  for (int i = 0; i < 10; i++) kv_paged_seq_free(q[i]);
  int32_t toks[16];
  for (int i = 0; i < 16; i++) toks[i] = 200 + i;
  /* a publish at 8 tokens (the end of block 1) keeps a snapshot there; one at 14 none */
  kv_seq *a, *b, *c, *d;
  kv_paged_seq_new(p, 0, &a, &e);
  state_set(p, a, 6.0f);
  fill_publish(a, toks, 6);
  state_set(p, a, 8.0f);
  fill_publish(a, toks, 8);
  state_set(p, a, 14.0f);
  fill_publish(a, toks, 14);
  kv_paged_seq_new(p, 0, &b, &e);
  CHECK_EQ_INT(kv_paged_seq_attach_prefix(b, toks, 16, 0), 8); /* blocks 0..2 match; block 1 has the snapshot */
  CHECK(state_get(p, b) == 8.0f);
  CHECK_EQ_INT(kv_paged_seq_blocks(b), 2);
  /* it goes on from there; its publish at 12 snapshots block 2 (a's: the same prefix) */
  state_set(p, b, 12.5f);
  fill_publish(b, toks, 12);
  CHECK(state_get(p, a) == 14.0f);
  kv_paged_seq_new(p, 0, &c, &e);
  CHECK_EQ_INT(kv_paged_seq_attach_prefix(c, toks, 16, 0), 12);
  CHECK(state_get(p, c) == 12.5f);
  kv_paged_seq_free(c);
  kv_paged_seq_new(p, 0, &c, &e);
  state_set(p, c, 4.5f);
  fill_publish(c, toks, 4);
  kv_paged_seq_free(c);
  /* the limit: only the newest snapshot stays (block 0's, made last) */
  kv_pool_set_snapshots(p, 1);
  kv_paged_seq_new(p, 0, &d, &e);
  CHECK_EQ_INT(kv_paged_seq_attach_prefix(d, toks, 16, 0), 4);
  CHECK(state_get(p, d) == 4.5f);
  kv_paged_seq_free(d);
  kv_pool_set_snapshots(p, 0);
  kv_paged_seq_new(p, 0, &d, &e);
  CHECK_EQ_INT(kv_paged_seq_attach_prefix(d, toks, 16, 0), 0);
  CHECK_EQ_INT(d->len, 0);
  CHECK_EQ_INT(kv_paged_seq_blocks(d), 0);
  /* cut back: to 0 it starts over; anywhere else it cannot go on */
  kv_paged_seq_truncate(a, 5);
  CHECK_EQ_INT(a->ops->reserve(a, 1, &e), HEARTH_EUNSUPPORTED);
  kv_paged_seq_truncate(a, 0);
  CHECK_EQ_INT(a->ops->reserve(a, 1, &e), 0);
  /* a mark: the state at its length comes back when the sequence is cut back to it (speculation's
   * rejected drafts), not at any other length; a rewind goes to the mark at most n, else to 0 */
  state_set(p, a, 2.0f);
  fill_publish(a, toks, 5);
  CHECK_EQ_INT(kv_paged_seq_mark(a, &e), 0);
  state_set(p, a, 9.0f);
  fill_publish(a, toks, 9); /* drafts fed: past block 1's end, published without a snapshot */
  CHECK_EQ_INT(kv_paged_seq_rewind(a, 7), 5);
  CHECK(state_get(p, a) == 2.0f);
  CHECK_EQ_INT(a->ops->reserve(a, 1, &e), 0);
  state_set(p, a, 7.0f);
  fill_publish(a, toks, 7);
  CHECK_EQ_INT(kv_paged_seq_rewind(a, 6), 5); /* the mark again */
  CHECK(state_get(p, a) == 2.0f);
  fill_publish(a, toks, 8);
  kv_paged_seq_truncate(a, 5);                /* a truncation exactly to the mark restores it too */
  CHECK(state_get(p, a) == 2.0f);
  CHECK_EQ_INT(a->ops->reserve(a, 1, &e), 0);
  fill_publish(a, toks, 8);
  CHECK_EQ_INT(kv_paged_seq_rewind(a, 3), 0); /* below the mark: from the start, the mark forgotten */
  CHECK_EQ_INT(a->ops->reserve(a, 1, &e), 0);
  fill_publish(a, toks, 6);
  CHECK_EQ_INT(kv_paged_seq_rewind(a, 5), 0); /* no mark now */
  CHECK_EQ_INT(kv_paged_seq_rewind(a, 3), 0); /* nothing past n: unchanged */
  fill_publish(a, toks, 2);
  CHECK_EQ_INT(kv_paged_seq_rewind(a, 4), 2);
  kv_paged_seq_free(a);
  kv_paged_seq_free(b);
  kv_paged_seq_free(d);
  kv_pool_counts cnt;
  kv_pool_count(p, &cnt);
  CHECK_EQ_INT(cnt.used, 0);
  kv_pool_free(p);
  /* a growable pool that doubles its blocks keeps every state row as it was */
  CHECK_EQ_INT(kv_pool_new(&g, 4, 2, &p, &e), 0);
  kv_pool_set_growable(p, true);
  kv_paged_seq_new(p, 0, &a, &e);
  state_set(p, a, 3.25f);
  CHECK_EQ_INT(kv_pool_reserve_states(p, 40, &e), 0);
  CHECK_EQ_INT(kv_pool_store(p)->n_states, 40);
  fill_publish(a, toks, 16); /* 4 blocks: the pool grows */
  kv_pool_count(p, &cnt);
  CHECK(cnt.total >= 4);
  CHECK_EQ_INT(kv_pool_store(p)->n_states, 40);
  CHECK(state_get(p, a) == 3.25f);
  kv_paged_seq_free(a);
  kv_pool_free(p);
  /* without recurrent layers: no state rows, no state arenas */
  g = small_geom();
  CHECK_EQ_INT(kv_pool_new(&g, 4, 2, &p, &e), 0);
  CHECK(!kv_pool_recurrent(p));
  kv_paged_seq_new(p, 0, &a, &e);
  CHECK_EQ_INT(a->state, -1);
  CHECK(kv_pool_store(p)->state[0].buf == NULL && kv_pool_store(p)->n_states == 0);
  fill_publish(a, toks, 6);
  CHECK_EQ_INT(kv_paged_seq_mark(a, &e), 0); /* nothing to keep: rewinds go exactly where asked */
  CHECK_EQ_INT(kv_paged_seq_rewind(a, 3), 3);
  kv_paged_seq_free(a);
  kv_pool_free(p);
}

/* State row r of the store (a kept state) set to v. */
static void row_set(kv_pool *p, int32_t r, float v) {
  const kv_store *st = kv_pool_store(p);
  herr e = {0};
  float row[6] = {v, v, v, v, v, v};
  CHECK_EQ_INT(bk_set(&st->state[1], (size_t)r * sizeof row, row, sizeof row, &e), 0);
}

/* Kept states (kv_paged_seq_keep): the forward from the length they were asked at writes the
 * state after each of its tokens into the sequence's keep rows (here by hand); cutting back to
 * any of those lengths installs that state, a block ending among them is published with its
 * snapshot, and a forward of fewer tokens or a cut shortens what is kept. */
static void test_kept_states(void) {
  model_kv_geometry g = small_geom();
  g.kv_dim[1] = 0, g.state_dim[1] = 6;
  kv_pool *p;
  herr e = {0};
  CHECK_EQ_INT(kv_pool_new(&g, 4, 32, &p, &e), 0);
  int32_t toks[16];
  for (int i = 0; i < 16; i++) toks[i] = 300 + i;
  kv_seq *a, *b;
  CHECK_EQ_INT(kv_paged_seq_new(p, 0, &a, &e), 0);
  state_set(p, a, 6.0f);
  fill_publish(a, toks, 6);
  CHECK_EQ_INT(kv_paged_seq_keep(a, 4, &e), 0);
  CHECK_EQ_INT(a->n_keep, 4);
  CHECK_EQ_INT(a->keep_at, 6);
  for (int i = 0; i < 4; i++) {
    CHECK(a->keep[i] != a->state);
    for (int j = 0; j < i; j++) CHECK(a->keep[j] != a->keep[i]);
  }
  /* the verification forward: tokens 6..9, the state after each kept */
  for (int i = 0; i < 4; i++) row_set(p, a->keep[i], 7.0f + (float)i);
  state_set(p, a, 10.0f);
  CHECK_EQ_INT(a->ops->reserve(a, 4, &e), 0);
  a->ops->commit(a, 4);
  kv_paged_seq_publish(a, toks, 8, 0); /* block 1 ends at 8, inside the verified tokens */
  CHECK_EQ_INT(kv_paged_seq_rewind(a, 8), 8); /* two drafts rejected: the state after token 7 */
  CHECK(state_get(p, a) == 8.0f);
  CHECK_EQ_INT(a->n_keep, 2);
  CHECK_EQ_INT(a->ops->reserve(a, 1, &e), 0); /* not stale: it goes on */
  CHECK_EQ_INT(kv_paged_seq_new(p, 0, &b, &e), 0);
  CHECK_EQ_INT(kv_paged_seq_attach_prefix(b, toks, 16, 0), 8); /* block 1's snapshot, from the kept row */
  CHECK(state_get(p, b) == 8.0f);
  kv_paged_seq_free(b);
  CHECK_EQ_INT(kv_paged_seq_rewind(a, 7), 7); /* still kept */
  CHECK(state_get(p, a) == 7.0f);
  CHECK_EQ_INT(a->n_keep, 1);
  CHECK_EQ_INT(kv_paged_seq_rewind(a, 6), 0); /* before the kept states, no mark: from the start */
  CHECK_EQ_INT(a->n_keep, 0);
  /* a forward of fewer tokens than asked keeps only those */
  state_set(p, a, 3.0f);
  fill_publish(a, toks, 3);
  CHECK_EQ_INT(kv_paged_seq_keep(a, 5, &e), 0);
  fill_publish(a, toks, 5);
  CHECK_EQ_INT(a->n_keep, 2);
  kv_paged_seq_free(a);
  kv_pool_counts cnt;
  kv_pool_count(p, &cnt);
  CHECK_EQ_INT(cnt.used, 0);
  kv_pool_free(p);
  /* without recurrent layers nothing is kept */
  g = small_geom();
  CHECK_EQ_INT(kv_pool_new(&g, 4, 2, &p, &e), 0);
  kv_paged_seq_new(p, 0, &a, &e);
  fill_publish(a, toks, 2);
  CHECK_EQ_INT(kv_paged_seq_keep(a, 3, &e), 0);
  CHECK_EQ_INT(a->n_keep, 0);
  kv_paged_seq_free(a);
  kv_pool_free(p);
}

static void test_paged_equals_contiguous(void) {
  paged_equals_contiguous(GOLDEN "llama-f32");
  paged_equals_contiguous(GOLDEN "gemma4-f32");
  paged_equals_contiguous(GOLDEN "glm5-f32"); /* latent K rows, indexer keys as V rows */
}

/* V rows of their own width (multi-head latent attention: K the latent and
 * RoPE key, V the indexer's key): the arenas take each width, the block
 * size counts both, and a growing pool keeps every row of both. */
static void test_v_dim(void) {
  model_kv_geometry g = {0};
  g.n_layers = 2;
  g.kv_dim[0] = 40, g.v_dim[0] = 16;
  g.kv_dim[1] = 6; /* v_dim 0: as wide as K */
  CHECK_EQ_INT(model_kv_v_dim(&g, 0), 16);
  CHECK_EQ_INT(model_kv_v_dim(&g, 1), 6);
  CHECK_EQ_INT(kv_block_bytes(&g, 4), 4 * (40 + 16 + 6 + 6) * 4);
  kv_pool *p;
  herr e = {0};
  CHECK_EQ_INT(kv_pool_new(&g, 4, 1, &p, &e), 0);
  kv_pool_set_growable(p, true);
  kv_seq *s;
  CHECK_EQ_INT(kv_paged_seq_new(p, 0, &s, &e), 0);
  CHECK_EQ_INT(s->ops->reserve(s, 3, &e), 0);
  const int32_t *tbl;
  int64_t nb;
  const kv_store *st = s->ops->table(s, &tbl, &nb);
  CHECK_EQ_INT(st->k[0].cols, 40);
  CHECK_EQ_INT(st->v[0].cols, 16);
  CHECK_EQ_INT(st->v[1].cols, 6);
  for (int l = 0; l < 2; l++)
    for (int64_t r = 0; r < 3; r++) {
      int64_t slot = tbl[0] * 4 + r;
      float *k = (float *)bk_addr(&st->k[l]) + slot * st->k[l].cols, *v = (float *)bk_addr(&st->v[l]) + slot * st->v[l].cols;
      for (int64_t d = 0; d < st->k[l].cols; d++) k[d] = (float)(l * 1000 + r * 100 + d);
      for (int64_t d = 0; d < st->v[l].cols; d++) v[d] = -(float)(l * 1000 + r * 100 + d);
    }
  s->ops->commit(s, 3);
  CHECK_EQ_INT(s->ops->reserve(s, 6, &e), 0); /* grows the pool: the arenas move */
  st = s->ops->table(s, &tbl, &nb);
  for (int l = 0; l < 2; l++)
    for (int64_t r = 0; r < 3; r++) {
      int64_t slot = tbl[0] * 4 + r;
      const float *k = (const float *)bk_addr(&st->k[l]) + slot * st->k[l].cols,
                  *v = (const float *)bk_addr(&st->v[l]) + slot * st->v[l].cols;
      for (int64_t d = 0; d < st->k[l].cols; d++) CHECK(k[d] == (float)(l * 1000 + r * 100 + d));
      for (int64_t d = 0; d < st->v[l].cols; d++) CHECK(v[d] == -(float)(l * 1000 + r * 100 + d));
    }
  kv_paged_seq_free(s);
  kv_pool_free(p);
}

int main(void) {
  test_device_or_skip();
  RUN(test_block_table);
  RUN(test_v_dim);
  RUN(test_prefix_sharing);
  RUN(test_eviction_order);
  RUN(test_recurrent_states);
  RUN(test_kept_states);
  RUN(test_paged_equals_contiguous);
  TEST_MAIN_END();
}
