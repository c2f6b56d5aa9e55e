/* sparse.c — the CPU kernel of bk_attention_sparse (attention over each
 * query's chosen rows of a one-head latent cache), in f32: one task per
 * query; each chosen row is read once for all heads (its key against every
 * head's query, then its value into every head's sum), dot products in
 * eight independent partial sums, the softmax's sum in double. Checked
 * against op_attention_sparse (cpu/ref_sparse.c) by the backend op harness. */
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu.h"

typedef struct sparse_cpu_job {
  float *out;
  const float *q;
  const int32_t *sel;
  const paged_rows *kv;
  const sparse_attn_params *p;
} sparse_cpu_job;

static float dot8(const float *a, const float *b, int64_t n) {
  float s[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
  float t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  for (; i < n; i++) t += a[i] * b[i];
  return t;
}

static const float *row_at(const paged_rows *pr, int64_t i, int64_t j) {
  int64_t B = pr->block_rows;
  return pr->arena + ((int64_t)pr->tables[pr->q_tab[i] + j / B] * B + j % B) * pr->row_width;
}

static void sparse_cpu_task(void *ctx, int i, int tid) {
  (void)tid;
  const sparse_cpu_job *jb = ctx;
  const sparse_attn_params *p = jb->p;
  int64_t K = p->topk, H = p->n_heads, hd = p->head_dim, vd = p->v_dim;
  const int32_t *sel = jb->sel + (int64_t)i * K;
  float *sc = malloc(sizeof(float) * (size_t)(H * (K ? K : 1)));
  if (!sc) return;
  const float *q = jb->q + (int64_t)i * H * hd;
  float *o = jb->out + (int64_t)i * H * vd;
  for (int64_t m = 0; m < K; m++) {
    if (sel[m] < 0) continue;
    const float *k = row_at(jb->kv, i, sel[m]);
    for (int64_t h = 0; h < H; h++) sc[h * K + m] = dot8(q + h * hd, k, hd) * p->scale;
  }
  double *sum = calloc((size_t)H, sizeof(double));
  if (!sum) {
    free(sc);
    return;
  }
  for (int64_t h = 0; h < H; h++) {
    float mx = -INFINITY;
    for (int64_t m = 0; m < K; m++)
      if (sel[m] >= 0 && sc[h * K + m] > mx) mx = sc[h * K + m];
    for (int64_t m = 0; m < K; m++)
      if (sel[m] >= 0) {
        sc[h * K + m] = expf(sc[h * K + m] - mx);
        sum[h] += sc[h * K + m];
      }
    for (int64_t x = 0; x < vd; x++) o[h * vd + x] = 0.0f;
  }
  for (int64_t m = 0; m < K; m++) {
    if (sel[m] < 0) continue;
    const float *v = row_at(jb->kv, i, sel[m]) + p->v_off;
    for (int64_t h = 0; h < H; h++) {
      float w = sc[h * K + m], *oh = o + h * vd;
      for (int64_t x = 0; x < vd; x++) oh[x] += w * v[x];
    }
  }
  for (int64_t h = 0; h < H; h++) {
    float inv = sum[h] > 0 ? (float)(1.0 / sum[h]) : 0.0f;
    for (int64_t x = 0; x < vd; x++) o[h * vd + x] *= inv;
  }
  free(sum);
  free(sc);
}

void bk_attention_sparse_cpu(hpool *pool, float *out, const float *q, int64_t n, const int32_t *sel, const paged_rows *kv,
                             const sparse_attn_params *p) {
  sparse_cpu_job jb = {out, q, sel, kv, p};
  hpool_for(pool, (int)n, sparse_cpu_task, &jb);
}
