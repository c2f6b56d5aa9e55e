/* grad.c — the plain reference backward passes of grad.h: RMSNorm, RoPE,
 * causal attention (GQA, window, softcap), the SiLU-gated MLP product, a
 * frozen matmul's input gradient, LoRA's A / B / input gradients and the
 * chunked cross-entropy over the vocabulary. Knows nothing of models. */
#include "train/grad.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/ops.h"

void grad_rmsnorm(float *dx, float *dw, const float *dy, const float *x, int64_t n, int64_t d, const float *w, float eps,
                  bool unit_offset) {
  for (int64_t i = 0; i < n; i++) {
    const float *xr = x + i * d, *dyr = dy + i * d;
    float *dxr = dx + i * d;
    double ss = 0, dot = 0;
    for (int64_t j = 0; j < d; j++) ss += (double)xr[j] * xr[j];
    double r = 1.0 / sqrt(ss / (double)d + (double)eps);
    for (int64_t j = 0; j < d; j++) {
      double s = w ? (unit_offset ? 1.0 + w[j] : w[j]) : 1.0;
      dot += (double)dyr[j] * s * xr[j];
    }
    double k = dot * r * r * r / (double)d;
    for (int64_t j = 0; j < d; j++) {
      double s = w ? (unit_offset ? 1.0 + w[j] : w[j]) : 1.0;
      if (dw) dw[j] += (float)((double)dyr[j] * xr[j] * r);
      dxr[j] = (float)(r * s * dyr[j] - xr[j] * k);
    }
  }
}

void grad_rope(float *dx, int64_t n, int64_t n_heads, int64_t head_dim, const int64_t *pos, const rope_table *t) {
  int64_t half = t->rot_dim / 2, na = t->n_axes > 1 ? t->n_axes : 1;
  for (int64_t r = 0; r < n; r++) {
    for (int64_t i = 0; i < half; i++) {
      double angle = (double)pos[r * na + (na > 1 ? t->axis[i] : 0)] * t->inv_freq[i];
      float c = (float)(cos(angle) * t->attn_scale), s = (float)(sin(angle) * t->attn_scale);
      int64_t i0 = t->interleaved ? 2 * i : i, i1 = t->interleaved ? 2 * i + 1 : i + half;
      for (int64_t h = 0; h < n_heads; h++) {
        float *v = dx + (r * n_heads + h) * head_dim;
        float a = v[i0], b = v[i1];
        v[i0] = a * c + b * s;
        v[i1] = b * c - a * s;
      }
    }
  }
}

void grad_attention_fwd(hpool *pool, float *out, const float *q, const float *k, const float *v, int64_t T,
                        const attn_params *p) {
  if (T <= 0) return;
  int64_t *rows = malloc((size_t)T * sizeof *rows);
  if (!rows) return;
  for (int64_t i = 0; i < T; i++) rows[i] = i;
  const float *kb[1] = {k}, *vb[1] = {v};
  kv_view kv = {.k_blocks = kb, .v_blocks = vb, .block_rows = T, .row_stride = p->n_kv_heads * p->head_dim, .lo = 0, .hi = T};
  op_attention_ref(pool, out, q, T, rows, &kv, p);
  free(rows);
}

typedef struct attn_bwd_job {
  float *dq, *dk, *dv;
  const float *dout, *q, *k, *v;
  int64_t T;
  const attn_params *p;
} attn_bwd_job;

/* One KV head: every query head of its group over every query, so that its dk / dv rows are this task's alone. */
static void attn_bwd_task(void *ctx, int kvh, int tid) {
  (void)tid;
  const attn_bwd_job *j = ctx;
  const attn_params *p = j->p;
  int64_t T = j->T, H = p->n_heads, KVH = p->n_kv_heads, hd = p->head_dim, group = H / KVH;
  double *pr = malloc((size_t)T * sizeof *pr), *cap = malloc((size_t)T * sizeof *cap);
  double *dk = calloc((size_t)(T * hd), sizeof *dk), *dv = calloc((size_t)(T * hd), sizeof *dv);
  double *dq = malloc((size_t)hd * sizeof *dq), *dpa = malloc((size_t)T * sizeof *dpa);
  if (!pr || !cap || !dk || !dv || !dq || !dpa) goto out;
  for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
    for (int64_t i = 0; i < T; i++) {
      const float *qi = j->q + (i * H + h) * hd, *doi = j->dout + (i * H + h) * hd;
      int64_t lo = 0;
      if (p->window > 0 && i - p->window + 1 > lo) lo = i - p->window + 1;
      double m = -INFINITY;
      for (int64_t r = lo; r <= i; r++) {
        const float *kr = j->k + (r * KVH + kvh) * hd;
        double s = 0;
        for (int64_t d = 0; d < hd; d++) s += (double)qi[d] * kr[d];
        s *= p->scale;
        double th = 0;
        if (p->softcap > 0) {
          th = tanh(s / p->softcap);
          s = p->softcap * th;
        }
        cap[r] = 1 - th * th; /* d capped / d raw (1 without a cap) */
        pr[r] = s;
        if (s > m) m = s;
      }
      double sum = 0;
      for (int64_t r = lo; r <= i; r++) sum += (pr[r] = exp(pr[r] - m));
      double pdp = 0; /* Σ p · (dout · v) */
      for (int64_t r = lo; r <= i; r++) {
        pr[r] /= sum;
        const float *vr = j->v + (r * KVH + kvh) * hd;
        double dp = 0;
        for (int64_t d = 0; d < hd; d++) dp += (double)doi[d] * vr[d];
        dpa[r] = dp;
        pdp += pr[r] * dp;
        for (int64_t d = 0; d < hd; d++) dv[r * hd + d] += pr[r] * doi[d];
      }
      for (int64_t d = 0; d < hd; d++) dq[d] = 0;
      for (int64_t r = lo; r <= i; r++) {
        const float *kr = j->k + (r * KVH + kvh) * hd;
        double ds = pr[r] * (dpa[r] - pdp) * cap[r] * p->scale; /* through the softmax, the cap and the scale */
        for (int64_t d = 0; d < hd; d++) {
          dq[d] += ds * kr[d];
          dk[r * hd + d] += ds * qi[d];
        }
      }
      float *dqi = j->dq + (i * H + h) * hd;
      for (int64_t d = 0; d < hd; d++) dqi[d] = (float)dq[d];
    }
  }
  for (int64_t r = 0; r < T; r++)
    for (int64_t d = 0; d < hd; d++) {
      j->dk[(r * KVH + kvh) * hd + d] = (float)dk[r * hd + d];
      j->dv[(r * KVH + kvh) * hd + d] = (float)dv[r * hd + d];
    }
out:
  free(pr);
  free(cap);
  free(dk);
  free(dv);
  free(dq);
  free(dpa);
}

void grad_attention(hpool *pool, float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                    const float *v, int64_t T, const attn_params *p) {
  if (T <= 0) return;
  attn_bwd_job j = {dq, dk, dv, dout, q, k, v, T, p};
  hpool_for(pool, (int)p->n_kv_heads, attn_bwd_task, &j);
}

void grad_silu_mul(float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    double x = g[i], sg = 1.0 / (1.0 + exp(-x));
    double d = dh[i];
    dg[i] = (float)(d * u[i] * sg * (1.0 + x * (1.0 - sg)));
    du[i] = (float)(d * x * sg);
  }
}

void grad_gelu_tanh_mul(float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n) {
  const double k = 0.7978845608028654; /* sqrt(2/pi) */
  for (int64_t i = 0; i < n; i++) {
    double x = g[i], t = tanh(k * (x + 0.044715 * x * x * x)), d = dh[i];
    double gelu = 0.5 * x * (1.0 + t), dgelu = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * x * x);
    dg[i] = (float)(d * u[i] * dgelu);
    du[i] = (float)(d * gelu);
  }
}

int grad_matmul_dx_ref(float *dx, const float *dy, int64_t n, const bk_weight *w, herr *err) {
  int64_t out = w->rows, in = w->cols;
  float *row = malloc((size_t)in * sizeof *row);
  double *acc = calloc((size_t)(n * in), sizeof *acc);
  int rc = 0;
  if (!row || !acc) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto out;
  }
  for (int64_t o = 0; o < out; o++) {
    if ((rc = bk_dequant_row(w, o, row, err))) goto out;
    for (int64_t i = 0; i < n; i++) {
      double g = dy[i * out + o];
      if (g == 0) continue;
      double *a = acc + i * in;
      for (int64_t k = 0; k < in; k++) a[k] += g * row[k];
    }
  }
  for (int64_t i = 0; i < n * in; i++) dx[i] = (float)acc[i];
out:
  free(row);
  free(acc);
  return rc;
}

int grad_weight_t(const bk_weight *w, bk_weight *wt, float **data, herr *err) {
  *data = NULL;
  int rc = bk_weight_validate(w, err);
  if (rc) return rc;
  int64_t out = w->rows, in = w->cols;
  float *t = malloc((size_t)(out * in) * sizeof *t), *row = malloc((size_t)in * sizeof *row);
  if (!t || !row) {
    free(t);
    free(row);
    return herr_set(err, HEARTH_ENOMEM, "out of memory (a transposed weight of %lld x %lld)", (long long)in, (long long)out);
  }
  for (int64_t o = 0; o < out; o++) {
    if ((rc = bk_dequant_row(w, o, row, err))) {
      free(t);
      free(row);
      return rc;
    }
    for (int64_t k = 0; k < in; k++) t[k * out + o] = row[k];
  }
  free(row);
  memset(wt, 0, sizeof *wt);
  wt->type = BK_F32, wt->rows = in, wt->cols = out, wt->data = t;
  *data = t;
  return 0;
}

void grad_lora_fwd(float *y, float *t, const float *x, int64_t n, int64_t in, const float *a, int64_t r, const float *b,
                   int64_t out, float s) {
  /* op_lora row by row, each row's x · aᵀ kept in t for the backward */
  for (int64_t i = 0; i < n; i++) op_lora(y + i * out, x + i * in, 1, in, a, r, b, out, s, t + i * r);
}

void grad_lora(float *dx, float *da, float *db, const float *dy, const float *x, const float *t, int64_t n, int64_t in,
               const float *a, int64_t r, const float *b, int64_t out, float s) {
  double *dt = malloc((size_t)r * sizeof *dt);
  if (!dt) return;
  for (int64_t i = 0; i < n; i++) {
    const float *dyi = dy + i * out, *xi = x + i * in, *ti = t + i * r;
    for (int64_t j = 0; j < r; j++) dt[j] = 0;
    for (int64_t o = 0; o < out; o++) {
      double g = dyi[o];
      if (g == 0) continue;
      for (int64_t j = 0; j < r; j++) {
        dt[j] += s * g * b[o * r + j];
        db[o * r + j] += (float)(s * g * ti[j]);
      }
    }
    for (int64_t j = 0; j < r; j++) {
      float *daj = da + j * in;
      for (int64_t k = 0; k < in; k++) daj[k] += (float)(dt[j] * xi[k]);
    }
    if (dx)
      for (int64_t k = 0; k < in; k++) {
        double acc = 0;
        for (int64_t j = 0; j < r; j++) acc += dt[j] * a[j * in + k];
        dx[i * in + k] += (float)acc;
      }
  }
  free(dt);
}

int grad_cross_entropy(hpool *pool, double *loss_sum, int64_t *count, float *dh, const float *h, int64_t n, int64_t D,
                       const bk_weight *w, const bk_weight *wt, const int32_t *target, float dscale, int64_t chunk,
                       float *scratch, herr *err) {
  return grad_cross_entropy_capped(pool, loss_sum, count, dh, h, n, D, w, wt, target, dscale, 0, chunk, scratch, err);
}

int grad_cross_entropy_capped(hpool *pool, double *loss_sum, int64_t *count, float *dh, const float *h, int64_t n, int64_t D,
                              const bk_weight *w, const bk_weight *wt, const int32_t *target, float dscale, float softcap,
                              int64_t chunk, float *scratch, herr *err) {
  int64_t V = w->rows;
  if (w->cols != D || (dh && (!wt || wt->rows != D || wt->cols != V)) || chunk < 1)
    return herr_set(err, HEARTH_EINVAL, "cross-entropy: head [%lld, %lld] does not fit hidden %lld", (long long)V,
                    (long long)w->cols, (long long)D);
  int rc;
  for (int64_t i0 = 0; i0 < n; i0 += chunk) {
    int64_t c = n - i0 < chunk ? n - i0 : chunk;
    if ((rc = bk_matmul(pool, scratch, h + i0 * D, c, w, NULL, err))) return rc;
    for (int64_t i = 0; i < c; i++) {
      float *l = scratch + i * V;
      int32_t tg = target[i0 + i];
      if (tg < 0 || tg >= V) {
        if (tg >= V) return herr_set(err, HEARTH_EINVAL, "cross-entropy: target %d is outside the vocabulary (%lld)", tg, (long long)V);
        memset(l, 0, (size_t)V * sizeof *l);
        continue;
      }
      if (softcap > 0) /* as the model's head: logits = c · tanh(logits / c) */
        for (int64_t v = 0; v < V; v++) l[v] = softcap * tanhf(l[v] / softcap);
      double m = -INFINITY, sum = 0;
      for (int64_t v = 0; v < V; v++)
        if (l[v] > m) m = l[v];
      for (int64_t v = 0; v < V; v++) sum += exp((double)l[v] - m);
      double lse = m + log(sum);
      *loss_sum += lse - l[tg];
      *count += 1;
      if (dh) {
        for (int64_t v = 0; v < V; v++) {
          double p = dscale * exp((double)l[v] - lse) - (v == tg ? dscale : 0), z = softcap > 0 ? l[v] / softcap : 0;
          l[v] = (float)(p * (1.0 - z * z)); /* through the cap: d tanh = 1 − tanh² */
        }
      }
    }
    if (dh && (rc = bk_matmul(pool, dh + i0 * D, scratch, c, wt, NULL, err))) return rc;
  }
  return 0;
}
