/* host_path.c — ops run on the host for a backend that lacks them (see
 * host_path.h): the inputs read back through the backend's get, the plain
 * reference of ops.h run on host memory, the results written with set and
 * waited for. Slow and correct: it lets a new backend start with a few ops
 * and run every model meanwhile. Knows nothing of models. */
#include "backend/host_path.h"

#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"

void bk_backend_record(bk_backend *be, const herr *e) {
  if (!be->refused.code) be->refused = *e;
}

/* One host-path call: the host copies it made and its first error. */
typedef struct hcall {
  bk_backend *be;
  const char *op;
  herr err;
  void *mem[8];
  int n;
  bool wrote;
} hcall;

static void *h_alloc(hcall *h, size_t bytes) {
  if (h->err.code) return NULL;
  void *p = h->n < 8 ? malloc(bytes ? bytes : 1) : NULL;
  if (!p) {
    herr_set(&h->err, HEARTH_ENOMEM, "%s on the host for backend '%s': out of memory", h->op, h->be->name);
    return NULL;
  }
  h->mem[h->n++] = p;
  return p;
}

/* t's bytes on the host (t NULL: NULL). */
static void *h_in(hcall *h, const bk_tensor *t) {
  if (!t) return NULL;
  size_t n = bk_nbytes(t);
  void *p = h_alloc(h, n);
  if (p && n && h->be->ops->get(h->be, p, bk_addr(t), n, &h->err)) return NULL;
  return p;
}

/* A host buffer the size of t, for a result. */
static void *h_new(hcall *h, const bk_tensor *t) { return h_alloc(h, bk_nbytes(t)); }

static void h_out(hcall *h, const bk_tensor *t, const void *p) {
  size_t n = bk_nbytes(t);
  if (h->err.code || !n) return;
  h->wrote = true;
  h->be->ops->set(h->be, bk_addr(t), p, n, &h->err);
}

static void h_end(hcall *h) {
  if (!h->err.code && h->wrote) h->be->ops->sync(h->be, &h->err); /* set may read the host bytes later */
  if (h->err.code) bk_backend_record(h->be, &h->err);
  for (int i = 0; i < h->n; i++) free(h->mem[i]);
}

#define HCALL(name) hcall h = {.be = be, .op = name}

static void act_in_place(float *x, int64_t n, bk_act act) {
  switch (act) {
    case BK_ACT_SILU: op_silu(x, n); break;
    case BK_ACT_GELU: op_gelu(x, n); break;
    case BK_ACT_RELU: op_relu(x, n); break;
    default: op_gelu_tanh(x, n); break;
  }
}

void host_rmsnorm(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, float eps, bool unit_offset) {
  HCALL("rmsnorm");
  float *X = h_in(&h, x), *W = h_in(&h, w), *Y = h_new(&h, y);
  if (!h.err.code) op_rmsnorm(Y, X, x->rows, x->cols, W, eps, unit_offset);
  h_out(&h, y, Y);
  h_end(&h);
}

void host_rope(bk_backend *be, const bk_tensor *x, int64_t n_heads, int64_t head_dim, const bk_tensor *pos, const rope_table *t) {
  HCALL("rope");
  float *X = h_in(&h, x);
  int32_t *P = h_in(&h, pos);
  int64_t np = bk_nelem(pos), need = x->rows * (t->n_axes > 1 ? t->n_axes : 1);
  int64_t *P64 = h_alloc(&h, sizeof(int64_t) * (size_t)(np > need ? np : need));
  if (!h.err.code && np < need)
    herr_set(&h.err, HEARTH_EINTERNAL, "rope on the host: %lld positions for %lld", (long long)np, (long long)need);
  if (!h.err.code) {
    for (int64_t i = 0; i < np; i++) P64[i] = P[i];
    op_rope(X, x->rows, n_heads, head_dim, P64, t);
  }
  h_out(&h, x, X);
  h_end(&h);
}

void host_act_mul(bk_backend *be, const bk_tensor *gate, const bk_tensor *up, bk_act act) {
  HCALL("act_mul");
  float *G = h_in(&h, gate), *U = h_in(&h, up);
  if (!h.err.code) {
    act_in_place(G, bk_nelem(gate), act);
    op_mul(G, G, U, bk_nelem(gate));
  }
  h_out(&h, gate, G);
  h_end(&h);
}

void host_add(bk_backend *be, const bk_tensor *y, const bk_tensor *a, const bk_tensor *b) {
  HCALL("add");
  float *A = h_in(&h, a), *B = h_in(&h, b), *Y = h_new(&h, y);
  if (!h.err.code) op_add(Y, A, B, bk_nelem(y));
  h_out(&h, y, Y);
  h_end(&h);
}

void host_softcap(bk_backend *be, const bk_tensor *x, float cap) {
  HCALL("softcap");
  float *X = h_in(&h, x);
  if (!h.err.code) op_softcap(X, bk_nelem(x), cap);
  h_out(&h, x, X);
  h_end(&h);
}

void host_get_rows(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *rows) {
  HCALL("get_rows");
  float *X = h_in(&h, x), *Y = h_new(&h, y);
  int32_t *R = h_in(&h, rows);
  for (int64_t r = 0; !h.err.code && r < y->rows; r++) {
    if (R[r] < 0 || R[r] >= x->rows) {
      herr_set(&h.err, HEARTH_EINTERNAL, "get_rows on the host: row %d of %lld", (int)R[r], (long long)x->rows);
      break;
    }
    memcpy(Y + r * y->cols, X + (int64_t)R[r] * x->cols, (size_t)x->cols * sizeof(float));
  }
  h_out(&h, y, Y);
  h_end(&h);
}

void host_scale(bk_backend *be, const bk_tensor *x, float s) {
  HCALL("scale");
  float *X = h_in(&h, x);
  if (!h.err.code) op_scale(X, bk_nelem(x), s);
  h_out(&h, x, X);
  h_end(&h);
}

void host_get_cols(bk_backend *be, const bk_tensor *y, const bk_tensor *x, int64_t c0) {
  HCALL("get_cols");
  float *X = h_in(&h, x), *Y = h_new(&h, y);
  for (int64_t r = 0; !h.err.code && r < y->rows; r++)
    memcpy(Y + r * y->cols, X + r * x->cols + c0, (size_t)y->cols * sizeof(float));
  h_out(&h, y, Y);
  h_end(&h);
}

void host_moe_route(bk_backend *be, const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits, bool norm,
                    const bk_tensor *scale) {
  HCALL("moe_route");
  float *L = h_in(&h, logits), *S = h_in(&h, scale), *W = h_new(&h, w);
  int32_t *I = h_new(&h, ids);
  if (!h.err.code) op_moe_route(I, W, L, logits->rows, logits->cols, ids->cols, norm, S);
  h_out(&h, ids, I);
  h_out(&h, w, W);
  h_end(&h);
}

void host_sigmoid_mul(bk_backend *be, const bk_tensor *y, const bk_tensor *g) {
  HCALL("sigmoid_mul");
  float *Y = h_in(&h, y), *G = h_in(&h, g);
  if (!h.err.code) op_sigmoid_mul(Y, G, y->rows, y->cols, g->cols);
  h_out(&h, y, Y);
  h_end(&h);
}

void host_set_cols(bk_backend *be, const bk_tensor *y, const bk_tensor *x, int64_t c0) {
  HCALL("set_cols");
  float *Y = h_in(&h, y), *X = h_in(&h, x);
  for (int64_t r = 0; !h.err.code && r < x->rows; r++)
    memcpy(Y + r * y->cols + c0, X + r * x->cols, (size_t)x->cols * sizeof(float));
  h_out(&h, y, Y);
  h_end(&h);
}

void host_set_rows(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *rows) {
  HCALL("set_rows");
  float *Y = h_in(&h, y), *X = h_in(&h, x);
  int32_t *R = h_in(&h, rows);
  for (int64_t r = 0; !h.err.code && r < x->rows; r++) {
    if (R[r] < 0 || R[r] >= y->rows) {
      herr_set(&h.err, HEARTH_EINTERNAL, "set_rows on the host: row %d of %lld", (int)R[r], (long long)y->rows);
      break;
    }
    memcpy(Y + (int64_t)R[r] * y->cols, X + r * x->cols, (size_t)x->cols * sizeof(float));
  }
  h_out(&h, y, Y);
  h_end(&h);
}

void host_layernorm(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, const bk_tensor *b, float eps) {
  HCALL("layernorm");
  float *X = h_in(&h, x), *W = h_in(&h, w), *B = h_in(&h, b), *Y = h_new(&h, y);
  if (!h.err.code) op_layernorm(Y, X, x->rows, x->cols, W, B, eps);
  h_out(&h, y, Y);
  h_end(&h);
}

void host_moe_route_group(bk_backend *be, const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits,
                          const bk_tensor *bias, int64_t n_group, int64_t topk_group, bool norm, float scale) {
  HCALL("moe_route_group");
  float *L = h_in(&h, logits), *B = h_in(&h, bias), *W = h_new(&h, w);
  int32_t *I = h_new(&h, ids);
  if (!h.err.code) op_moe_route_group(I, W, L, logits->rows, logits->cols, ids->cols, B, n_group, topk_group, norm, scale);
  h_out(&h, ids, I);
  h_out(&h, w, W);
  h_end(&h);
}

void host_lora(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *a, const bk_tensor *b, float scale) {
  HCALL("lora");
  if (x->cols != a->cols || b->cols != a->rows || y->cols != b->rows || y->rows != x->rows)
    herr_set(&h.err, HEARTH_EINTERNAL, "lora on the host: y [%lld, %lld], x [%lld, %lld], a [%lld, %lld], b [%lld, %lld] do not fit",
             (long long)y->rows, (long long)y->cols, (long long)x->rows, (long long)x->cols, (long long)a->rows,
             (long long)a->cols, (long long)b->rows, (long long)b->cols);
  float *Y = h_in(&h, y), *X = h_in(&h, x), *A = h_in(&h, a), *B = h_in(&h, b);
  float *tmp = h_alloc(&h, sizeof(float) * (size_t)(a->rows > 0 ? a->rows : 1));
  if (!h.err.code) op_lora(Y, X, x->rows, x->cols, A, a->rows, B, y->cols, scale, tmp);
  h_out(&h, y, Y);
  h_end(&h);
}

void host_act(bk_backend *be, const bk_tensor *x, bk_act act) {
  HCALL("act");
  float *X = h_in(&h, x);
  if (!h.err.code) act_in_place(X, bk_nelem(x), act);
  h_out(&h, x, X);
  h_end(&h);
}

void host_clamp(bk_backend *be, const bk_tensor *x, float lo, float hi) {
  HCALL("clamp");
  float *X = h_in(&h, x);
  if (!h.err.code) op_clamp(X, bk_nelem(x), lo, hi);
  h_out(&h, x, X);
  h_end(&h);
}

void host_embed_bag(bk_backend *be, const bk_tensor *y, const bk_tensor *table, const bk_tensor *ids, const bk_tensor *w) {
  HCALL("embed_bag");
  float *T = h_in(&h, table), *W = h_in(&h, w), *Y = h_new(&h, y);
  int32_t *I = h_in(&h, ids);
  if (!h.err.code) op_embed_bag(Y, T, table->rows, table->cols, I, W, y->rows, ids->cols);
  h_out(&h, y, Y);
  h_end(&h);
}

/* The logits read back, then the host sampler (cpu/sample_cpu.c, the reference of bk_sample). */
int host_sample(bk_backend *be, const bk_tensor *logits, const bk_sample_row *rows, const bk_sample_adj *adj, int64_t n_adj,
                bk_sample_out *out, herr *err) {
  size_t n = bk_nbytes(logits);
  void *p = malloc(n ? n : 1);
  if (!p) return herr_set(err, HEARTH_ENOMEM, "sample on the host for backend '%s': out of memory", be->name);
  int rc = n ? be->ops->get(be, p, bk_addr(logits), n, err) : 0;
  if (!rc) {
    bk_buf hb = {.be = be, .base = p, .size = n};
    bk_tensor ht = {.buf = &hb, .off = 0, .dt = logits->dt, .rows = logits->rows, .cols = logits->cols};
    rc = bk_cpu_sample(be, &ht, rows, adj, n_adj, out, err);
  }
  free(p);
  return rc;
}
