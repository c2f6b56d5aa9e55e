/* backend_cpu.c — the CPU backend: bk_backend_ops over host memory, with
 * the kernels of this folder (bk_matmul, op_attention, ...) spread over the
 * backend's own thread pool. Owns the pool and the small host scratch the
 * adapters need (int64 positions, per-sequence block pointers); everything
 * else is the kernels' business. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/cpu.h"
#include "backend/backend.h"
#include "backend/formats.h"
#include "base/pool.h"
#include "base/vec.h"

typedef struct cpu_backend {
  bk_backend base;         /* must be first */
  hpool *pool;             /* owned */
  bool f32_activations;
  herr first;              /* the first error an op recorded */
  int64_t *i64;            /* owned scratch */
  size_t i64_cap;
  const float **ptrs;      /* owned scratch: each sequence's K then V block pointers */
  size_t ptrs_cap;
  attn_seq *aseqs;         /* owned scratch: a step's sequences for op_attention_seqs */
  size_t aseqs_cap;
  float *moe;              /* owned scratch of bk_moe_grouped */
  size_t moe_cap;
  float *lora;             /* owned scratch of bk_lora: its two products */
  size_t lora_cap;
  bool prof_on;            /* bk_cpu_profile: collecting */
  int prof_n;
  bk_prof_entry prof[BK_PROF_MAX];
} cpu_backend;

static cpu_backend *cpu(bk_backend *be) { return (cpu_backend *)be; }

static void record(cpu_backend *c, const herr *e) {
  if (!c->first.code) c->first = *e;
}

static void cpu_close(bk_backend *be) {
  cpu_backend *c = cpu(be);
  hpool_destroy(c->pool);
  free(c->i64);
  free(c->ptrs);
  free(c->aseqs);
  free(c->moe);
  free(c->lora);
  free(c);
}

static int cpu_mem_info(bk_backend *be, size_t *free_bytes, size_t *total_bytes) {
  long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  *total_bytes = pages > 0 && size > 0 ? (size_t)pages * (size_t)size : (size_t)8 << 30;
  *free_bytes = avail > 0 && size > 0 ? (size_t)avail * (size_t)size : *total_bytes / 2;
  return 0;
}

static void cpu_describe(const bk_backend *be, char *buf, size_t n) {
  size_t fr, tot;
  cpu_mem_info((bk_backend *)be, &fr, &tot);
  snprintf(buf, n, "cpu (%d threads, %s kernels), %.1f GiB memory", hpool_size(((const cpu_backend *)be)->pool),
           bk_cpu_level_name(bk_cpu_level_now()), (double)tot / (1 << 30));
}

#define HUGE_BYTES ((size_t)2 << 20) /* a transparent huge page */

/* A buffer of at least HUGE_BYTES (the KV pool's arenas, scratch) is aligned to huge pages and
 * asks the kernel for them: the pages a run touches first (a batch's pass over the KV pool) fault
 * in 2 MiB at a time instead of 4 KiB. */
static int cpu_buf_new(bk_backend *be, size_t bytes, bk_buf **out, herr *err) {
  bk_buf *b = malloc(sizeof *b);
  bool huge = bytes >= HUGE_BYTES;
  size_t align = huge ? HUGE_BYTES : 64;
  void *p = aligned_alloc(align, (bytes + align - 1) / align * align);
#ifdef MADV_HUGEPAGE
  if (p && huge) madvise(p, (bytes + align - 1) / align * align, MADV_HUGEPAGE);
#endif
  if (!b || !p) {
    free(b), free(p);
    return herr_set(err, HEARTH_ENOMEM, "cpu: out of memory for %zu bytes", bytes);
  }
  *b = (bk_buf){.be = be, .base = p, .size = bytes};
  *out = b;
  return 0;
}

static void cpu_buf_free(bk_backend *be, bk_buf *b) {
  free(b->base);
  free(b);
}

static int cpu_set(bk_backend *be, void *dst, const void *src, size_t n, herr *err) {
  memcpy(dst, src, n);
  return 0;
}

static int cpu_sync(bk_backend *be, herr *err) {
  cpu_backend *c = cpu(be);
  if (!c->first.code) return 0;
  int code = c->first.code;
  if (err) *err = c->first;
  herr_clear(&c->first);
  return code;
}

static int cpu_get(bk_backend *be, void *dst, const void *src, size_t n, herr *err) {
  int rc = cpu_sync(be, err);
  if (rc) return rc;
  memcpy(dst, src, n);
  return 0;
}

static void cpu_copy(bk_backend *be, void *dst, const void *src, size_t n) { memmove(dst, src, n); }

static int cpu_weight_load(bk_backend *be, bk_weight *w, unsigned use, herr *err) {
  int rc = bk_weight_validate(w, err);
  if (rc || cpu(be)->f32_activations || !(use & BK_USE_MATMUL)) return rc;
  if ((rc = bk_weight_pack(w, err))) return rc;
  if ((use & BK_USE_PRIVATE) && !(use & BK_USE_EMBED)) bk_weight_drop_source(w); /* only the packed copy stays in memory */
  return 0;
}

static void cpu_weight_release(bk_backend *be, bk_weight *w) { bk_weight_unpack(w); }

static double prof_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Adds one call to the entry of (op, rows, cols); entries past BK_PROF_MAX are dropped. */
static void prof_add(cpu_backend *c, const char *op, int64_t rows, int64_t cols, double seconds, double bytes) {
  for (int i = 0; i < c->prof_n; i++) {
    bk_prof_entry *e = &c->prof[i];
    if (e->op == op && e->rows == rows && e->cols == cols) {
      e->calls++, e->seconds += seconds, e->bytes += bytes;
      return;
    }
  }
  if (c->prof_n < BK_PROF_MAX) c->prof[c->prof_n++] = (bk_prof_entry){op, rows, cols, 1, seconds, bytes};
}

int bk_cpu_profile(bk_backend *be, bool on) {
  if (!be || !bk_backend_is_cpu(be)) return -1;
  cpu_backend *c = cpu(be);
  if (on) c->prof_n = 0;
  c->prof_on = on;
  return 0;
}

int bk_cpu_profile_read(bk_backend *be, bk_prof_entry *out, int max) {
  if (!be || !bk_backend_is_cpu(be)) return 0;
  cpu_backend *c = cpu(be);
  for (int i = 0; i < c->prof_n && i < max; i++) out[i] = c->prof[i];
  return c->prof_n;
}

#define F(t) ((float *)bk_addr(t))
#define I(t) ((int32_t *)bk_addr(t))

static void cpu_embed_body(bk_backend *be, const bk_tensor *y, const bk_weight *table, const bk_tensor *ids, float scale) {
  cpu_backend *c = cpu(be);
  const int32_t *id = I(ids);
  for (int64_t t = 0; t < y->rows; t++) {
    herr e = {0};
    if (id[t] < 0 || id[t] >= table->rows) {
      herr_set(&e, HEARTH_EINVAL, "embed: token id %d outside a table of %lld rows", (int)id[t], (long long)table->rows);
      record(c, &e);
      return;
    }
    if (bk_dequant_row(table, id[t], F(y) + t * y->cols, &e)) {
      record(c, &e);
      return;
    }
  }
  if (scale != 0) op_scale(F(y), bk_nelem(y), scale);
}

static void cpu_matmul(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_weight *w, const bk_tensor *bias) {
  herr e = {0};
  cpu_backend *c = cpu(be);
  double t0 = c->prof_on ? prof_now() : 0;
  if (bk_matmul(c->pool, F(y), F(x), x->rows, w, bias ? F(bias) : NULL, &e)) record(c, &e);
  if (c->prof_on)
    prof_add(c, "matmul", w->rows, w->cols, prof_now() - t0, (double)bk_row_bytes(w->type, w->cols, w->bits) * (double)w->rows);
}

static void cpu_rmsnorm_body(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, float eps, bool unit_offset) {
  op_rmsnorm(F(y), F(x), x->rows, x->cols, w ? F(w) : NULL, eps, unit_offset);
}

static void cpu_rope_body(bk_backend *be, const bk_tensor *x, int64_t n_heads, int64_t head_dim, const bk_tensor *pos, const rope_table *t) {
  cpu_backend *c = cpu(be);
  if (!HGROW(c->i64, c->i64_cap, (size_t)x->rows)) {
    herr e = {0};
    herr_set(&e, HEARTH_ENOMEM, "rope: out of memory");
    record(c, &e);
    return;
  }
  int64_t n = x->rows * (t->n_axes > 1 ? t->n_axes : 1);
  if (n > x->rows && !HGROW(c->i64, c->i64_cap, (size_t)n)) {
    herr e = {0};
    herr_set(&e, HEARTH_ENOMEM, "rope: out of memory");
    record(c, &e);
    return;
  }
  for (int64_t r = 0; r < n; r++) c->i64[r] = I(pos)[r];
  op_rope(F(x), x->rows, n_heads, head_dim, c->i64, t);
}

static void cpu_act_mul_body(bk_backend *be, const bk_tensor *gate, const bk_tensor *up, bk_act act) {
  float *g = F(gate);
  int64_t n = bk_nelem(gate);
  switch (act) {
    case BK_ACT_SILU: op_silu(g, n); break;
    case BK_ACT_GELU: op_gelu(g, n); break;
    case BK_ACT_RELU: op_relu(g, n); break;
    default: op_gelu_tanh(g, n); break;
  }
  op_mul(g, g, F(up), n);
}

static void cpu_add_body(bk_backend *be, const bk_tensor *y, const bk_tensor *a, const bk_tensor *b) {
  op_add(F(y), F(a), F(b), bk_nelem(y));
}

static void cpu_softcap_body(bk_backend *be, const bk_tensor *x, float cap) { op_softcap(F(x), bk_nelem(x), cap); }

static void cpu_get_rows(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *rows) {
  size_t rb = (size_t)x->cols * sizeof(float);
  for (int64_t r = 0; r < y->rows; r++) memmove(F(y) + r * y->cols, F(x) + (int64_t)I(rows)[r] * x->cols, rb);
}

static void cpu_scale_body(bk_backend *be, const bk_tensor *x, float s) { op_scale(F(x), bk_nelem(x), s); }

static void cpu_get_cols(bk_backend *be, const bk_tensor *y, const bk_tensor *x, int64_t c0) {
  size_t rb = (size_t)y->cols * sizeof(float);
  for (int64_t r = 0; r < y->rows; r++) memmove(F(y) + r * y->cols, F(x) + r * x->cols + c0, rb);
}

static void cpu_moe_route_body(bk_backend *be, const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits, bool norm,
                               const bk_tensor *scale) {
  op_moe_route(I(ids), F(w), F(logits), logits->rows, logits->cols, ids->cols, norm, scale ? F(scale) : NULL);
}

static void cpu_moe(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *ids, const bk_tensor *w,
                    const bk_experts *ex, bk_act act) {
  cpu_backend *c = cpu(be);
  herr e = {0};
  hpool_fpmode fp = hpool_flush_begin();
  if (bk_moe_grouped(c->pool, F(y), F(x), x->rows, x->cols, I(ids), F(w), ids->cols, ex, act, &c->moe, &c->moe_cap, &e))
    record(c, &e);
  hpool_flush_end(fp);
}

static void cpu_kv_write(bk_backend *be, const bk_kv_layer *kv, const bk_tensor *k_new, const bk_tensor *v_new, const bk_tensor *slot) {
  int64_t d = k_new->cols, kw = kv->k->cols, vw = kv->v->cols;
  for (int64_t t = 0; t < k_new->rows; t++) {
    int64_t s = I(slot)[t];
    if (s < 0 || s >= kv->k->rows) continue;
    op_kv_quantize_row(kv->k_fmt, F(kv->k) + s * kw, F(k_new) + t * d, d);
    op_kv_quantize_row(kv->v_fmt, F(kv->v) + s * vw, F(v_new) + t * d, d);
  }
}

/* The step's sequences (runs of queries with the same table), each with its view of the
 * cache, through one op_attention_seqs. */
static void cpu_attention(bk_backend *be, const bk_tensor *out, const bk_tensor *q, const bk_kv_layer *kv, const bk_attn_index *ix,
                          const attn_params *p) {
  cpu_backend *c = cpu(be);
  double pt0 = c->prof_on ? prof_now() : 0;
  const int32_t *row = I(ix->row), *tab = I(ix->tab), *tables = I(ix->tables), *last = ix->last ? I(ix->last) : row;
  int64_t T = q->rows, kw = kv->k->cols, vw = kv->v->cols, B = kv->block_rows, width = p->n_heads * p->head_dim;
  if (!HGROW(c->i64, c->i64_cap, (size_t)(2 * T))) goto oom;
  for (int64_t t = 0; t < T; t++) c->i64[t] = row[t], c->i64[T + t] = last[t] > row[t] ? last[t] : row[t];
  /* the runs and the block pointers they need */
  int n_seqs = 0;
  int64_t n_ptrs = 0;
  for (int64_t t0 = 0; t0 < T; n_seqs++) {
    int64_t t1 = t0 + 1, hi = c->i64[T + t0] + 1;
    for (; t1 < T && tab[t1] == tab[t0]; t1++)
      if (c->i64[T + t1] + 1 > hi) hi = c->i64[T + t1] + 1;
    n_ptrs += 2 * ((hi + B - 1) / B);
    t0 = t1;
  }
  if (!HGROW(c->ptrs, c->ptrs_cap, (size_t)n_ptrs) || !HGROW(c->aseqs, c->aseqs_cap, (size_t)n_seqs)) goto oom;
  const float **ptrs = c->ptrs;
  int s = 0;
  for (int64_t t0 = 0; t0 < T; s++) {
    int64_t t1 = t0 + 1, hi = c->i64[T + t0] + 1;
    for (; t1 < T && tab[t1] == tab[t0]; t1++)
      if (c->i64[T + t1] + 1 > hi) hi = c->i64[T + t1] + 1;
    int64_t nb = (hi + B - 1) / B;
    for (int64_t i = 0; i < nb; i++) {
      int64_t blk = (int64_t)tables[tab[t0] + i] * B;
      ptrs[i] = F(kv->k) + blk * kw;
      ptrs[nb + i] = F(kv->v) + blk * vw;
    }
    kv_view view = {.k_blocks = ptrs, .v_blocks = ptrs + nb, .block_rows = B, .row_stride = kw, .lo = 0, .hi = hi,
                    .k_fmt = kv->k_fmt, .v_fmt = kv->v_fmt, .v_row_stride = vw, .last = ix->last ? c->i64 + T + t0 : NULL};
    c->aseqs[s] = (attn_seq){.out = F(out) + t0 * width, .q = F(q) + t0 * width, .n = t1 - t0, .q_row = c->i64 + t0, .kv = view};
    ptrs += 2 * nb;
    t0 = t1;
  }
  op_attention_seqs(c->pool, c->aseqs, n_seqs, p);
  if (c->prof_on) prof_add(c, "attention", 0, 0, prof_now() - pt0, 0);
  return;
oom: {
  herr e = {0};
  herr_set(&e, HEARTH_ENOMEM, "attention: out of memory");
  record(c, &e);
}
}

/* The recurrent ops read the step's per-sequence table from host memory. */
static const rec_seq *rec_seqs(const bk_recurrent *r) { return (const rec_seq *)bk_addr(r->seqs); }

static void cpu_conv1d(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, const bk_recurrent *r, bool silu) {
  hpool_fpmode fp = hpool_flush_begin();
  op_conv1d_state(F(y), F(x), x->cols, F(w), w->cols, F(r->state), r->state->cols, r->off, rec_seqs(r), r->seqs->rows, r->keep, silu);
  hpool_flush_end(fp);
}

static void cpu_delta_rule(bk_backend *be, const bk_tensor *o, const bk_tensor *qkv, const bk_tensor *a, const bk_tensor *b,
                           const bk_tensor *a_log, const bk_tensor *dt_bias, const bk_recurrent *r, const delta_params *p) {
  op_delta_rule_chunked(cpu(be)->pool, F(o), F(qkv), F(a), F(b), F(a_log), F(dt_bias), F(r->state), r->state->cols, r->off,
                        rec_seqs(r), r->seqs->rows, r->keep, p, 64);
}

static void cpu_sigmoid_mul(bk_backend *be, const bk_tensor *y, const bk_tensor *g) {
  hpool_fpmode fp = hpool_flush_begin();
  op_sigmoid_mul(F(y), F(g), y->rows, y->cols, g->cols);
  hpool_flush_end(fp);
}

/* bk_lora: t = x · aᵀ and u = t · bᵀ through bk_matmul's f32 kernels (the pool, SIMD), then
 * y += scale · u; op_lora is its plain reference. */
static void cpu_lora(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *a, const bk_tensor *b, float scale) {
  cpu_backend *c = cpu(be);
  herr e = {0};
  if (x->cols != a->cols || b->cols != a->rows || y->cols != b->rows || y->rows != x->rows) {
    herr_set(&e, HEARTH_EINTERNAL, "lora: y [%lld, %lld], x [%lld, %lld], a [%lld, %lld], b [%lld, %lld] do not fit",
             (long long)y->rows, (long long)y->cols, (long long)x->rows, (long long)x->cols, (long long)a->rows,
             (long long)a->cols, (long long)b->rows, (long long)b->cols);
    record(c, &e);
    return;
  }
  int64_t n = x->rows, r = a->rows, out = y->cols;
  if (n <= 0 || r <= 0) return;
  if (!HGROW(c->lora, c->lora_cap, (size_t)(n * (r + out)))) {
    herr_set(&e, HEARTH_ENOMEM, "lora: out of memory");
    record(c, &e);
    return;
  }
  float *t = c->lora, *u = c->lora + n * r;
  bk_weight wa = {.type = BK_F32, .rows = r, .cols = x->cols, .data = F(a)};
  bk_weight wb = {.type = BK_F32, .rows = out, .cols = r, .data = F(b)};
  if (bk_matmul(c->pool, t, F(x), n, &wa, NULL, &e) || bk_matmul(c->pool, u, t, n, &wb, NULL, &e)) {
    record(c, &e);
    return;
  }
  hpool_fpmode fp = hpool_flush_begin();
  float *yy = F(y);
  for (int64_t i = 0; i < n * out; i++) yy[i] += scale * u[i];
  hpool_flush_end(fp);
}

/* The ops above that run on the calling thread, with denormals flushed
 * (the pooled ones are flushed by hpool_for). */
static void cpu_embed(bk_backend *be, const bk_tensor *y, const bk_weight *table, const bk_tensor *ids, float scale) {
  hpool_fpmode fp = hpool_flush_begin();
  cpu_embed_body(be, y, table, ids, scale);
  hpool_flush_end(fp);
}
static void cpu_rmsnorm(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, float eps, bool unit_offset) {
  hpool_fpmode fp = hpool_flush_begin();
  cpu_rmsnorm_body(be, y, x, w, eps, unit_offset);
  hpool_flush_end(fp);
}
static void cpu_rope(bk_backend *be, const bk_tensor *x, int64_t n_heads, int64_t head_dim, const bk_tensor *pos, const rope_table *t) {
  hpool_fpmode fp = hpool_flush_begin();
  cpu_rope_body(be, x, n_heads, head_dim, pos, t);
  hpool_flush_end(fp);
}
static void cpu_act_mul(bk_backend *be, const bk_tensor *gate, const bk_tensor *up, bk_act act) {
  hpool_fpmode fp = hpool_flush_begin();
  cpu_act_mul_body(be, gate, up, act);
  hpool_flush_end(fp);
}
static void cpu_add(bk_backend *be, const bk_tensor *y, const bk_tensor *a, const bk_tensor *b) {
  hpool_fpmode fp = hpool_flush_begin();
  cpu_add_body(be, y, a, b);
  hpool_flush_end(fp);
}
/* the add, then the norm: the two ops' own code, so the numbers of bk_add then bk_rmsnorm */
static void cpu_add_rmsnorm(bk_backend *be, const bk_tensor *x, const bk_tensor *d, const bk_tensor *y, const bk_tensor *w,
                            float eps, bool unit_offset) {
  hpool_fpmode fp = hpool_flush_begin();
  cpu_add_body(be, x, x, d);
  cpu_rmsnorm_body(be, y, x, w, eps, unit_offset);
  hpool_flush_end(fp);
}
static void cpu_softcap(bk_backend *be, const bk_tensor *x, float cap) {
  hpool_fpmode fp = hpool_flush_begin();
  cpu_softcap_body(be, x, cap);
  hpool_flush_end(fp);
}

static void cpu_scale(bk_backend *be, const bk_tensor *x, float s) {
  hpool_fpmode fp = hpool_flush_begin();
  cpu_scale_body(be, x, s);
  hpool_flush_end(fp);
}
static void cpu_moe_route(bk_backend *be, const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits, bool norm,
                          const bk_tensor *scale) {
  hpool_fpmode fp = hpool_flush_begin();
  cpu_moe_route_body(be, ids, w, logits, norm, scale);
  hpool_flush_end(fp);
}

/* ---- multi-head latent attention, DeepSeek sparse attention (references in ref_sparse.c; attention_sparse's
 * f32 kernel in sparse.c) ---- */

static void cpu_set_cols(bk_backend *be, const bk_tensor *y, const bk_tensor *x, int64_t c0) {
  size_t rb = (size_t)x->cols * sizeof(float);
  for (int64_t r = 0; r < x->rows; r++) memmove(F(y) + r * y->cols + c0, F(x) + r * x->cols, rb);
}

static void cpu_set_rows(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *rows) {
  size_t rb = (size_t)x->cols * sizeof(float);
  for (int64_t r = 0; r < x->rows; r++) memmove(F(y) + (int64_t)I(rows)[r] * y->cols, F(x) + r * x->cols, rb);
}

static void cpu_layernorm(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, const bk_tensor *b, float eps) {
  hpool_fpmode fp = hpool_flush_begin();
  op_layernorm(F(y), F(x), x->rows, x->cols, w ? F(w) : NULL, b ? F(b) : NULL, eps);
  hpool_flush_end(fp);
}

static void cpu_moe_route_group(bk_backend *be, const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits,
                                const bk_tensor *bias, int64_t n_group, int64_t topk_group, bool norm, float scale) {
  hpool_fpmode fp = hpool_flush_begin();
  op_moe_route_group(I(ids), F(w), F(logits), logits->rows, logits->cols, ids->cols, bias ? F(bias) : NULL, n_group,
                     topk_group, norm, scale);
  hpool_flush_end(fp);
}

static void cpu_index_topk(bk_backend *be, const bk_tensor *sel, const bk_tensor *q, const bk_tensor *w, const bk_kv_layer *keys,
                           const bk_attn_index *ix, const index_params *p) {
  paged_rows pr = {F(keys->k), keys->k->cols, keys->block_rows, I(ix->row), I(ix->tab), I(ix->tables)};
  op_index_topk(cpu(be)->pool, (int32_t *)bk_addr(sel), F(q), F(w), q->rows, &pr, p);
}

static void cpu_attention_sparse(bk_backend *be, const bk_tensor *out, const bk_tensor *q, const bk_kv_layer *kv,
                                 const bk_attn_index *ix, const bk_tensor *sel, const sparse_attn_params *p) {
  paged_rows pr = {F(kv->k), kv->k->cols, kv->block_rows, I(ix->row), I(ix->tab), I(ix->tables)};
  bk_attention_sparse_cpu(cpu(be)->pool, F(out), F(q), q->rows, I(sel), &pr, p);
}

/* ---- media encoders (references in ref.c) ---- */

static void cpu_act(bk_backend *be, const bk_tensor *x, bk_act act) {
  (void)be;
  hpool_fpmode fp = hpool_flush_begin();
  float *v = F(x);
  int64_t n = bk_nelem(x);
  switch (act) {
    case BK_ACT_SILU: op_silu(v, n); break;
    case BK_ACT_GELU: op_gelu(v, n); break;
    case BK_ACT_RELU: op_relu(v, n); break;
    default: op_gelu_tanh(v, n); break;
  }
  hpool_flush_end(fp);
}

static void cpu_clamp(bk_backend *be, const bk_tensor *x, float lo, float hi) {
  (void)be;
  op_clamp(F(x), bk_nelem(x), lo, hi);
}

static void cpu_embed_bag(bk_backend *be, const bk_tensor *y, const bk_tensor *table, const bk_tensor *ids, const bk_tensor *w) {
  (void)be;
  hpool_fpmode fp = hpool_flush_begin();
  op_embed_bag(F(y), F(table), table->rows, table->cols, I(ids), F(w), y->rows, ids->cols);
  hpool_flush_end(fp);
}

static void cpu_attention_rel(bk_backend *be, const bk_tensor *out, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                              const bk_tensor *rel, const bk_tensor *qscale, int64_t n_valid, const rel_attn_params *p) {
  (void)be;
  hpool_fpmode fp = hpool_flush_begin();
  op_attention_rel(F(out), F(q), F(k), F(v), F(rel), qscale ? F(qscale) : NULL, q->rows, n_valid, p);
  hpool_flush_end(fp);
}

static const bk_backend_ops cpu_ops = {
    .close = cpu_close,
    .describe = cpu_describe,
    .mem_info = cpu_mem_info,
    .buf_new = cpu_buf_new,
    .buf_free = cpu_buf_free,
    .set = cpu_set,
    .get = cpu_get,
    .copy = cpu_copy,
    .sync = cpu_sync,
    .weight_load = cpu_weight_load,
    .weight_release = cpu_weight_release,
    .embed = cpu_embed,
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .act_mul = cpu_act_mul,
    .add = cpu_add,
    .add_rmsnorm = cpu_add_rmsnorm,
    .softcap = cpu_softcap,
    .get_rows = cpu_get_rows,
    .scale = cpu_scale,
    .get_cols = cpu_get_cols,
    .moe_route = cpu_moe_route,
    .moe = cpu_moe,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .conv1d = cpu_conv1d,
    .delta_rule = cpu_delta_rule,
    .sigmoid_mul = cpu_sigmoid_mul,
    .sample = bk_cpu_sample,
    .set_cols = cpu_set_cols,
    .set_rows = cpu_set_rows,
    .layernorm = cpu_layernorm,
    .moe_route_group = cpu_moe_route_group,
    .index_topk = cpu_index_topk,
    .attention_sparse = cpu_attention_sparse,
    .lora = cpu_lora,
    .act = cpu_act,
    .clamp = cpu_clamp,
    .embed_bag = cpu_embed_bag,
    .attention_rel = cpu_attention_rel,
};

int bk_cpu_open(const bk_open_opts *opts, bk_backend **out, herr *err) {
  *out = NULL;
  bk_cpu_level level = bk_cpu_best();
  if (opts && opts->cpu_level && *opts->cpu_level && !bk_cpu_level_parse(opts->cpu_level, &level))
    return herr_set(err, HEARTH_EINVAL, "cpu kernel level '%s': expected scalar, avx2 or avx512", opts->cpu_level);
  if (opts && opts->cpu_level && *opts->cpu_level) bk_cpu_set_level(level);
  cpu_backend *c = calloc(1, sizeof *c);
  if (!c) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  c->pool = hpool_create(opts && opts->threads > 0 ? opts->threads : 0);
  if (!c->pool) {
    free(c);
    return herr_set(err, HEARTH_ENOMEM, "could not start the thread pool");
  }
  c->base.ops = &cpu_ops;
  snprintf(c->base.name, sizeof c->base.name, "cpu");
  c->base.is_cpu = true;
  c->base.expert_lora = true;
  c->f32_activations = opts && opts->f32_activations;
  *out = &c->base;
  return 0;
}
