/* sample_cpu.c — bk_sample on the CPU: the plain reference of the device
 * sampler (backend.h states the semantics), row by row. The CUDA kernel is
 * checked against it on random rows (tests/backend/test_backend_ops.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu.h"

static bool usable(float x) { return x == x && x != -INFINITY; }

static int desc_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x < y) - (x > y);
}

/* The k-th largest of v[0..n) (1 <= k <= n); reorders v. */
static float kth_largest(float *v, int64_t n, int64_t k) {
  int64_t lo = 0, hi = n - 1, want = k - 1; /* index in descending order */
  while (lo < hi) {
    float pivot = v[lo + (hi - lo) / 2];
    int64_t i = lo, j = hi;
    while (i <= j) {
      while (v[i] > pivot) i++;
      while (v[j] < pivot) j--;
      if (i <= j) {
        float t = v[i];
        v[i] = v[j];
        v[j] = t;
        i++;
        j--;
      }
    }
    if (want <= j) hi = j;
    else if (want >= i) lo = i;
    else return v[want];
  }
  return v[want];
}

static void sample_row(float *x, int64_t V, const bk_sample_row *w, const bk_sample_adj *adj, bk_sample_out *o,
                       float *p, float *tmp) {
  memset(o, 0, sizeof *o);
  o->id = -1;
  if (w->mask)
    for (int64_t i = 0; i < V; i++)
      if (i >> 6 >= w->mask_words || !(w->mask[i >> 6] >> (i & 63) & 1)) x[i] = -INFINITY;
  for (int32_t i = 0; i < w->n_pen; i++) {
    const bk_sample_adj *a = &adj[w->pen_off + i];
    float v = x[a->id];
    if (a->rep != 1.0f) v = v < 0 ? v * a->rep : v / a->rep;
    x[a->id] = v - a->sub;
  }
  for (int32_t i = 0; i < w->n_bias; i++) x[adj[w->bias_off + i].id] += adj[w->bias_off + i].add;

  int64_t best = -1;
  float max = -INFINITY;
  for (int64_t i = 0; i < V; i++)
    if (x[i] > max) max = x[i], best = i;
  if (best < 0) return;

  double lse = 0;
  if (w->logprobs || w->top_logprobs > 0) {
    double sum = 0;
    for (int64_t i = 0; i < V; i++)
      if (usable(x[i])) sum += expf(x[i] - max);
    lse = (double)max + log(sum);
    /* top: repeated selection below the previous (value desc, id asc) */
    float pv = INFINITY;
    int64_t pid = -1;
    for (int k = 0; k < w->top_logprobs; k++) {
      int64_t b = -1;
      float bv = -INFINITY;
      for (int64_t i = 0; i < V; i++) {
        float v = x[i];
        if (!usable(v) || v > pv || (v == pv && i <= pid)) continue;
        if (b < 0 || v > bv) b = i, bv = v;
      }
      if (b < 0) break;
      o->top_ids[k] = (int32_t)b;
      o->top_logprobs[k] = (float)((double)bv - lse);
      o->n_top = k + 1;
      pv = bv;
      pid = b;
    }
  }

  int64_t pick = best;
  if (w->temperature > 0) {
    float floor_v = -INFINITY;
    if (w->top_k > 0) {
      int64_t n = 0;
      for (int64_t i = 0; i < V; i++)
        if (usable(x[i])) tmp[n++] = x[i];
      if (w->top_k < n) floor_v = kth_largest(tmp, n, w->top_k);
    }
    double inv_t = 1.0 / w->temperature, total = 0;
    for (int64_t i = 0; i < V; i++) {
      p[i] = usable(x[i]) && x[i] >= floor_v ? expf((float)(((double)x[i] - max) * inv_t)) : 0.0f;
      total += p[i];
    }
    if (w->top_p < 1.0f) {
      double target = (double)w->top_p * total;
      int64_t n = 0;
      for (int64_t i = 0; i < V; i++)
        if (p[i] > 0) tmp[n++] = p[i];
      qsort(tmp, (size_t)n, sizeof(float), desc_float);
      /* the smallest value whose strictly larger mass is below target */
      float cut = tmp[0];
      double above = 0;
      for (int64_t i = 0; i < n;) {
        int64_t j = i;
        double group = 0;
        while (j < n && tmp[j] == tmp[i]) group += tmp[j++];
        if (above >= target) break;
        cut = tmp[i];
        above += group;
        i = j;
      }
      for (int64_t i = 0; i < V; i++)
        if (p[i] < cut) p[i] = 0;
    }
    if (w->min_p > 0) {
      float thresh = w->min_p * 1.0f; /* the max token's p is exp(0) = 1 */
      for (int64_t i = 0; i < V; i++)
        if (p[i] < thresh) p[i] = 0;
    }
    double mass = 0;
    int64_t last = best;
    for (int64_t i = 0; i < V; i++)
      if (p[i] > 0) mass += p[i], last = i;
    double u = (double)w->u * mass, acc = 0;
    pick = last;
    for (int64_t i = 0; i < V; i++) {
      if (p[i] <= 0) continue;
      acc += p[i];
      if (u < acc) {
        pick = i;
        break;
      }
    }
  }
  o->id = (int32_t)pick;
  if (w->logprobs) o->logprob = usable(x[pick]) ? (float)((double)x[pick] - lse) : -INFINITY;
}

int bk_cpu_sample(bk_backend *be, const bk_tensor *logits, const bk_sample_row *rows, const bk_sample_adj *adj,
                  int64_t n_adj, bk_sample_out *out, herr *err) {
  (void)be;
  (void)n_adj;
  int64_t V = logits->cols;
  float *p = malloc(sizeof(float) * (size_t)V * 2);
  if (!p) return herr_set(err, HEARTH_ENOMEM, "sample: out of memory");
  float *x = bk_addr(logits);
  for (int64_t r = 0; r < logits->rows; r++) sample_row(x + r * V, V, &rows[r], adj, &out[r], p, p + V);
  free(p);
  return 0;
}
