/* ref_sparse.c — the plain references of the ops that multi-head latent
 * attention and DeepSeek sparse attention add (see ops.h): LayerNorm, the
 * grouped sigmoid routing of DeepSeek-V3 / GLM-5, the lightning indexer's
 * top-k choice of cached rows, and attention over the chosen rows of a
 * one-head latent cache. The CPU backend runs the first three as they are
 * (the indexer spread over the pool, one task per query) and has an f32
 * kernel for the attention (sparse.c); that kernel and the CUDA kernels are
 * tested against these. Knows nothing of models. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/ops.h"

void op_layernorm(float *y, const float *x, int64_t n, int64_t d, const float *w, const float *b, float eps) {
  for (int64_t r = 0; r < n; r++) {
    const float *xr = x + r * d;
    float *yr = y + r * d;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < d; i++) mean += xr[i];
    mean /= (double)d;
    for (int64_t i = 0; i < d; i++) var += ((double)xr[i] - mean) * ((double)xr[i] - mean);
    var /= (double)d;
    double inv = 1.0 / sqrt(var + (double)eps);
    for (int64_t i = 0; i < d; i++) {
      double v = ((double)xr[i] - mean) * inv;
      if (w) v *= w[i];
      if (b) v += b[i];
      yr[i] = (float)v;
    }
  }
}

void op_moe_route_group(int32_t *ids, float *weights, const float *logits, int64_t n, int64_t e, int64_t k,
                        const float *bias, int64_t n_group, int64_t topk_group, bool norm, float scale) {
  float *s = malloc(sizeof(float) * (size_t)e), *c = malloc(sizeof(float) * (size_t)e);
  double *gs = malloc(sizeof(double) * (size_t)n_group);
  bool *open = malloc((size_t)n_group), *taken = malloc((size_t)e);
  if (!s || !c || !gs || !open || !taken) goto done;
  int64_t per = e / n_group;
  for (int64_t t = 0; t < n; t++) {
    const float *l = logits + t * e;
    for (int64_t x = 0; x < e; x++) {
      s[x] = (float)(1.0 / (1.0 + exp(-(double)l[x])));
      c[x] = s[x] + (bias ? bias[x] : 0.0f);
    }
    for (int64_t g = 0; g < n_group; g++) { /* the two largest of the group */
      float a = -INFINITY, b2 = -INFINITY;
      for (int64_t x = g * per; x < (g + 1) * per; x++) {
        if (c[x] > a) b2 = a, a = c[x];
        else if (c[x] > b2) b2 = c[x];
      }
      gs[g] = (double)a + (double)b2;
      open[g] = false;
    }
    for (int64_t j = 0; j < topk_group; j++) {
      int64_t best = -1;
      for (int64_t g = 0; g < n_group; g++)
        if (!open[g] && (best < 0 || gs[g] > gs[best])) best = g;
      open[best] = true;
    }
    memset(taken, 0, (size_t)e);
    int32_t *id = ids + t * k;
    float *w = weights + t * k;
    double sum = 0;
    for (int64_t j = 0; j < k; j++) {
      int64_t best = -1;
      for (int64_t x = 0; x < e; x++)
        if (!taken[x] && open[x / per] && (best < 0 || c[x] > c[best])) best = x;
      taken[best] = true;
      id[j] = (int32_t)best;
      sum += s[best];
    }
    for (int64_t j = 0; j < k; j++) {
      double v = s[id[j]];
      if (norm) v /= sum + 1e-20;
      w[j] = (float)(v * scale);
    }
  }
done:
  free(s), free(c), free(gs), free(open), free(taken);
}

static inline const float *paged_row(const paged_rows *pr, int64_t i, int64_t j) {
  int64_t B = pr->block_rows;
  int64_t slot = (int64_t)pr->tables[pr->q_tab[i] + j / B] * B + j % B;
  return pr->arena + slot * pr->row_width;
}

typedef struct index_job {
  int32_t *sel;
  const float *q, *w;
  const paged_rows *keys;
  const index_params *p;
} index_job;

typedef struct scored_row {
  double s;
  int64_t j;
} scored_row;

/* higher score first, then the lower row */
static int by_score(const void *a, const void *b) {
  const scored_row *x = a, *y = b;
  if (x->s != y->s) return x->s > y->s ? -1 : 1;
  return (x->j > y->j) - (x->j < y->j);
}

static int by_row(const void *a, const void *b) {
  const scored_row *x = a, *y = b;
  return (x->j > y->j) - (x->j < y->j);
}

static void index_task(void *ctx, int i, int tid) {
  (void)tid;
  const index_job *jb = ctx;
  const index_params *p = jb->p;
  int64_t rows = (int64_t)jb->keys->q_row[i] + 1, K = p->topk, H = p->n_heads, hd = p->head_dim;
  int32_t *sel = jb->sel + (int64_t)i * K;
  for (int64_t j = 0; j < K; j++) sel[j] = j < rows ? (int32_t)j : -1;
  if (rows <= K) return;
  scored_row *sc = malloc(sizeof(scored_row) * (size_t)rows);
  if (!sc) return;
  const float *q = jb->q + (int64_t)i * H * hd, *w = jb->w + (int64_t)i * H;
  for (int64_t j = 0; j < rows; j++) {
    const float *k = paged_row(jb->keys, i, j);
    double s = 0;
    for (int64_t h = 0; h < H; h++) {
      double d = 0;
      for (int64_t x = 0; x < hd; x++) d += (double)q[h * hd + x] * k[x];
      d *= p->scale;
      if (d > 0) s += (double)w[h] * d;
    }
    sc[j] = (scored_row){s, j};
  }
  qsort(sc, (size_t)rows, sizeof *sc, by_score); /* the best K first */
  qsort(sc, (size_t)K, sizeof *sc, by_row);      /* in row order */
  for (int64_t m = 0; m < K; m++) sel[m] = (int32_t)sc[m].j;
  free(sc);
}

void op_index_topk(hpool *pool, int32_t *sel, const float *q, const float *w, int64_t n, const paged_rows *keys,
                   const index_params *p) {
  index_job jb = {sel, q, w, keys, p};
  hpool_for(pool, (int)n, index_task, &jb);
}

typedef struct sparse_job {
  float *out;
  const float *q;
  const int32_t *sel;
  const paged_rows *kv;
  const sparse_attn_params *p;
} sparse_job;

static void sparse_task(void *ctx, int i, int tid) {
  (void)tid;
  const sparse_job *jb = ctx;
  const sparse_attn_params *p = jb->p;
  int64_t K = p->topk, hd = p->head_dim, vd = p->v_dim;
  const int32_t *sel = jb->sel + (int64_t)i * K;
  double *sc = malloc(sizeof(double) * (size_t)(K ? K : 1)), *acc = malloc(sizeof(double) * (size_t)(vd ? vd : 1));
  if (!sc || !acc) {
    free(sc), free(acc);
    return;
  }
  for (int64_t h = 0; h < p->n_heads; h++) {
    const float *q = jb->q + ((int64_t)i * p->n_heads + h) * hd;
    float *o = jb->out + ((int64_t)i * p->n_heads + h) * vd;
    double mx = -INFINITY, sum = 0;
    for (int64_t m = 0; m < K; m++) {
      if (sel[m] < 0) continue;
      const float *k = paged_row(jb->kv, i, sel[m]);
      double d = 0;
      for (int64_t x = 0; x < hd; x++) d += (double)q[x] * k[x];
      sc[m] = d * p->scale;
      if (sc[m] > mx) mx = sc[m];
    }
    for (int64_t x = 0; x < vd; x++) acc[x] = 0;
    for (int64_t m = 0; m < K; m++) {
      if (sel[m] < 0) continue;
      const float *v = paged_row(jb->kv, i, sel[m]) + p->v_off;
      double e = exp(sc[m] - mx);
      sum += e;
      for (int64_t x = 0; x < vd; x++) acc[x] += e * v[x];
    }
    for (int64_t x = 0; x < vd; x++) o[x] = sum > 0 ? (float)(acc[x] / sum) : 0.0f;
  }
  free(sc), free(acc);
}

void op_attention_sparse(hpool *pool, float *out, const float *q, int64_t n, const int32_t *sel, const paged_rows *kv,
                         const sparse_attn_params *p) {
  sparse_job jb = {out, q, sel, kv, p};
  hpool_for(pool, (int)n, sparse_task, &jb);
}
