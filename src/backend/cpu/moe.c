/* moe.c — the experts of a mixture-of-experts layer on the CPU (see
 * cpu.h): the plain reference, one token and one chosen expert at a time,
 * and the grouped version the backend runs, which gathers the tokens of
 * each active expert and multiplies that expert's matrices once for all of
 * them (bk_matmul over the pool, any stored format). Knows nothing of
 * routing (op_moe_route) or of the layers around it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/ops.h"
#include "base/vec.h"

static void act_inplace(float *x, int64_t n, bk_act act) {
  switch (act) {
    case BK_ACT_SILU: op_silu(x, n); break;
    case BK_ACT_GELU: op_gelu(x, n); break;
    case BK_ACT_RELU: op_relu(x, n); break;
    default: op_gelu_tanh(x, n); break;
  }
}

static bool valid(int32_t id, const bk_experts *ex) { return id >= 0 && id < ex->n; }

/* y[n, out] += expert e's LoRA deltas of projection p on x[n, in], for every adapter of ex
 * (op_lora, the scale already in b); tmp: the largest rank's floats. */
static void expert_lora(const bk_experts *ex, int p, int32_t e, float *y, const float *x, int64_t n, int64_t in, int64_t out,
                        float *tmp) {
  for (int i = 0; i < ex->n_lora; i++) {
    const bk_expert_lora *l = ex->lora[i];
    if (!l || !l->r) continue;
    const float *a = (const float *)bk_addr(&l->a[p]) + (int64_t)e * l->r * in;
    const float *b = (const float *)bk_addr(&l->b[p]) + (int64_t)e * out * l->r;
    op_lora(y, x, n, in, a, l->r, b, out, 1.0f, tmp);
  }
}

static int64_t lora_rank(const bk_experts *ex) {
  int64_t r = 1;
  for (int i = 0; i < ex->n_lora; i++)
    if (ex->lora[i] && ex->lora[i]->r > r) r = ex->lora[i]->r;
  return r;
}

int bk_moe_ref(float *y, const float *x, int64_t T, int64_t D, const int32_t *ids, const float *w, int64_t k,
               const bk_experts *ex, bk_act act, herr *err) {
  int rc = 0;
  int64_t I = ex->gate[0].rows;
  float *row = malloc(sizeof(float) * (size_t)(I > D ? I : D)), *h = malloc(sizeof(float) * (size_t)I),
        *u = malloc(sizeof(float) * (size_t)I), *o = malloc(sizeof(float) * (size_t)D),
        *tmp = malloc(sizeof(float) * (size_t)lora_rank(ex));
  if (!row || !h || !u || !o || !tmp) {
    free(row), free(h), free(u), free(o), free(tmp);
    return herr_set(err, HEARTH_ENOMEM, "moe: out of memory");
  }
  for (int64_t t = 0; t < T && !rc; t++) {
    const float *xt = x + t * D;
    float *yt = y + t * D;
    for (int64_t d = 0; d < D; d++) yt[d] = 0;
    for (int64_t j = 0; j < k && !rc; j++) {
      int32_t e = ids[t * k + j];
      if (!valid(e, ex)) continue;
      for (int64_t i = 0; i < I && !rc; i++) {
        float g = 0, v = 0;
        if ((rc = bk_dequant_row(&ex->gate[e], i, row, err))) break;
        for (int64_t d = 0; d < D; d++) g += row[d] * xt[d];
        if ((rc = bk_dequant_row(&ex->up[e], i, row, err))) break;
        for (int64_t d = 0; d < D; d++) v += row[d] * xt[d];
        h[i] = g;
        u[i] = v;
      }
      if (rc) break;
      expert_lora(ex, 0, e, h, xt, 1, D, I, tmp);
      expert_lora(ex, 1, e, u, xt, 1, D, I, tmp);
      act_inplace(h, I, act);
      op_mul(h, h, u, I);
      float wt = w[t * k + j];
      for (int64_t d = 0; d < D && !rc; d++) {
        o[d] = 0;
        if ((rc = bk_dequant_row(&ex->down[e], d, row, err))) break;
        for (int64_t i = 0; i < I; i++) o[d] += row[i] * h[i];
      }
      if (rc) break;
      expert_lora(ex, 2, e, o, h, 1, I, D, tmp);
      for (int64_t d = 0; d < D; d++) yt[d] += wt * o[d];
    }
  }
  free(row), free(h), free(u), free(o), free(tmp);
  return rc;
}

int bk_moe_grouped(hpool *pool, float *y, const float *x, int64_t T, int64_t D, const int32_t *ids, const float *w,
                   int64_t k, const bk_experts *ex, bk_act act, float **scratch, size_t *scratch_cap, herr *err) {
  int rc = 0;
  int64_t I = ex->gate[0].rows, E = ex->n, TK = T * k;
  /* per expert, the (token, slot) pairs that chose it, in token order */
  int64_t *start = calloc((size_t)E + 1, sizeof *start), *pair = malloc(sizeof *pair * (size_t)(TK ? TK : 1));
  if (!start || !pair) {
    free(start), free(pair);
    return herr_set(err, HEARTH_ENOMEM, "moe: out of memory");
  }
  for (int64_t i = 0; i < TK; i++)
    if (valid(ids[i], ex)) start[ids[i] + 1]++;
  int64_t most = 0;
  for (int64_t e = 0; e < E; e++) {
    if (start[e + 1] > most) most = start[e + 1];
    start[e + 1] += start[e];
  }
  int64_t *fill = malloc(sizeof *fill * (size_t)(E ? E : 1));
  if (!fill) {
    free(start), free(pair);
    return herr_set(err, HEARTH_ENOMEM, "moe: out of memory");
  }
  memcpy(fill, start, sizeof *fill * (size_t)E);
  for (int64_t i = 0; i < TK; i++)
    if (valid(ids[i], ex)) pair[fill[ids[i]]++] = i;
  free(fill);
  /* scratch: gathered x [most, D], gate and up [most, I], expert out [most, D], slot outputs [TK, D] */
  size_t need = (size_t)(most * D * 2 + most * I * 2 + TK * D);
  if (need > *scratch_cap && !HGROW(*scratch, *scratch_cap, need)) {
    free(start), free(pair);
    return herr_set(err, HEARTH_ENOMEM, "moe: out of memory for %zu floats of scratch", need);
  }
  size_t need_lora = ex->n_lora > 0 ? (size_t)lora_rank(ex) : 0;
  if (need + need_lora > *scratch_cap && !HGROW(*scratch, *scratch_cap, need + need_lora)) {
    free(start), free(pair);
    return herr_set(err, HEARTH_ENOMEM, "moe: out of memory for %zu floats of scratch", need + need_lora);
  }
  float *xs = *scratch, *g = xs + most * D, *u = g + most * I, *o = u + most * I, *slots = o + most * D, *tmp = slots + TK * D;
  for (int64_t e = 0; e < E && !rc; e++) {
    int64_t n = start[e + 1] - start[e];
    if (!n) continue; /* an expert nobody chose is never read */
    const int64_t *p = pair + start[e];
    for (int64_t r = 0; r < n; r++) memcpy(xs + r * D, x + (p[r] / k) * D, sizeof(float) * (size_t)D);
    if ((rc = bk_matmul(pool, g, xs, n, &ex->gate[e], NULL, err)) || (rc = bk_matmul(pool, u, xs, n, &ex->up[e], NULL, err)))
      break;
    expert_lora(ex, 0, (int32_t)e, g, xs, n, D, I, tmp);
    expert_lora(ex, 1, (int32_t)e, u, xs, n, D, I, tmp);
    act_inplace(g, n * I, act);
    op_mul(g, g, u, n * I);
    if ((rc = bk_matmul(pool, o, g, n, &ex->down[e], NULL, err))) break;
    expert_lora(ex, 2, (int32_t)e, o, g, n, I, D, tmp);
    for (int64_t r = 0; r < n; r++) memcpy(slots + p[r] * D, o + r * D, sizeof(float) * (size_t)D);
  }
  if (!rc)
    for (int64_t t = 0; t < T; t++) {
      float *yt = y + t * D;
      for (int64_t d = 0; d < D; d++) yt[d] = 0;
      for (int64_t j = 0; j < k; j++) {
        if (!valid(ids[t * k + j], ex)) continue;
        float wt = w[t * k + j];
        const float *s = slots + (t * k + j) * D;
        for (int64_t d = 0; d < D; d++) yt[d] += wt * s[d];
      }
    }
  free(start), free(pair);
  return rc;
}
