/* deltanet.c — the gated delta rule in its chunked (parallel) form, what the
 * CPU backend runs for bk_delta_rule (op_delta_rule_chunked in ops.h; the
 * token-by-token loop of ref.c is its spec). Within a chunk of L tokens,
 * with state S0 at its start, c_t the running sum of the log decays g and
 * A_ts = beta_t · exp(c_t - c_s) · (k_t · k_s) for s < t, the updates u
 * solve the unit lower-triangular system
 *   u_t = beta_t · (v_t - exp(c_t) · S0ᵀ k_t) - sum_{s<t} A_ts u_s,
 * and then
 *   o_t = exp(c_t) · S0ᵀ q_t + sum_{s<=t} exp(c_t - c_s) · (q_t · k_s) u_s,
 *   S   = exp(c_L) · S0 + sum_s exp(c_L - c_s) · k_s u_sᵀ.
 * The inner loops run over the value dimension, contiguous in the state.
 * One task per (sequence, value head). Knows nothing of models. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/ops.h"

/* The inner loops are plain loops over contiguous floats: let GCC vectorize them
 * (its -O2 cost model leaves loops of unknown length scalar). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic")
#endif

typedef struct delta_job {
  float *o;
  const float *qkv, *a, *b, *a_log, *dt_bias;
  float *state;
  int64_t stride, off, chunk;
  const rec_seq *seqs;
  const int32_t *keep;
  const delta_params *p;
} delta_job;

static float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* x[0..n) / sqrt(sum x² + 1e-6) times mul. */
static void l2norm(float *x, int64_t n, float mul) {
  double ss = 0;
  for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
  float f = (float)(1.0 / sqrt(ss + 1e-6)) * mul;
  for (int64_t i = 0; i < n; i++) x[i] *= f;
}

static void delta_task(void *ctx, int task, int tid) {
  (void)tid;
  const delta_job *j = ctx;
  const delta_params *p = j->p;
  int64_t nk = p->n_k_heads, nv = p->n_v_heads, dk = p->dk, dv = p->dv, W = 2 * nk * dk + nv * dv;
  int64_t h = task % nv, kh = h / (nv / nk), C = j->chunk;
  const rec_seq *sq = &j->seqs[task / nv];
  const int32_t *keep = j->keep && sq->n > 0 && j->keep[sq->t0] >= 0 ? j->keep + sq->t0 : NULL;
  if (keep) C = 1; /* the state after every position: chunks of one token (the token-by-token rule) */
  float *S = j->state + (int64_t)sq->slot * j->stride + j->off + h * dk * dv;
  if (sq->fresh) memset(S, 0, sizeof(float) * (size_t)(dk * dv));
  if (sq->n <= 0) return;
  int64_t L0 = sq->n < C ? sq->n : C;
  /* K, Q [L, dk]; V, U, WK, WQ [L, dv]; cum, beta, dec [L]; KK, QK [L, L]; Kt [dk, L] */
  size_t need = (size_t)(3 * L0 * dk + 4 * L0 * dv + 3 * L0 + 2 * L0 * L0);
  float *buf = malloc(sizeof(float) * need);
  if (!buf) return; /* the output keeps what it had; the backend reports nothing better here */
  float *K = buf, *Q = K + L0 * dk, *V = Q + L0 * dk, *U = V + L0 * dv, *WK = U + L0 * dv, *WQ = WK + L0 * dv;
  float *cum = WQ + L0 * dv, *beta = cum + L0, *dec = beta + L0, *KK = dec + L0, *QK = KK + L0 * L0, *Kt = QK + L0 * L0;
  float qscale = (float)(1.0 / sqrt((double)dk)), A = -expf(j->a_log[h]), dtb = j->dt_bias[h];
  for (int64_t c0 = 0; c0 < sq->n; c0 += C) {
    int64_t L = sq->n - c0 < C ? sq->n - c0 : C;
    float run = 0;
    for (int64_t t = 0; t < L; t++) {
      int64_t tok = sq->t0 + c0 + t;
      const float *row = j->qkv + tok * W;
      memcpy(Q + t * dk, row + kh * dk, sizeof(float) * (size_t)dk);
      memcpy(K + t * dk, row + nk * dk + kh * dk, sizeof(float) * (size_t)dk);
      memcpy(V + t * dv, row + 2 * nk * dk + h * dv, sizeof(float) * (size_t)dv);
      l2norm(Q + t * dk, dk, qscale);
      l2norm(K + t * dk, dk, 1.0f);
      run += A * softplusf(j->a[tok * nv + h] + dtb);
      cum[t] = run;
      beta[t] = 1.0f / (1.0f + expf(-j->b[tok * nv + h]));
    }
    /* S0ᵀ k_t and S0ᵀ q_t */
    for (int64_t t = 0; t < L; t++) {
      float *wk = WK + t * dv, *wq = WQ + t * dv;
      memset(wk, 0, sizeof(float) * (size_t)dv);
      memset(wq, 0, sizeof(float) * (size_t)dv);
      for (int64_t i = 0; i < dk; i++) {
        const float *Si = S + i * dv;
        float ki = K[t * dk + i], qi = Q[t * dk + i];
        for (int64_t e = 0; e < dv; e++) wk[e] += ki * Si[e], wq[e] += qi * Si[e];
      }
    }
    /* pairwise products with their decays (over Kᵀ, so the inner loops run along s) */
    for (int64_t t = 0; t < L; t++)
      for (int64_t i = 0; i < dk; i++) Kt[i * L + t] = K[t * dk + i];
    for (int64_t t = 0; t < L; t++) {
      float *kk = KK + t * L, *qk = QK + t * L;
      for (int64_t s = 0; s <= t; s++) kk[s] = qk[s] = 0;
      for (int64_t i = 0; i < dk; i++) {
        float a = K[t * dk + i], q = Q[t * dk + i];
        const float *kti = Kt + i * L;
        for (int64_t s = 0; s <= t; s++) kk[s] += a * kti[s], qk[s] += q * kti[s];
      }
      for (int64_t s = 0; s <= t; s++) {
        float d = expf(cum[t] - cum[s]);
        kk[s] *= beta[t] * d;
        qk[s] *= d;
      }
    }
    /* the updates by forward substitution, then the outputs */
    for (int64_t t = 0; t < L; t++) {
      float *u = U + t * dv, et = expf(cum[t]);
      for (int64_t e = 0; e < dv; e++) u[e] = beta[t] * (V[t * dv + e] - et * WK[t * dv + e]);
      for (int64_t s = 0; s < t; s++) {
        float f = KK[t * L + s];
        const float *us = U + s * dv;
        for (int64_t e = 0; e < dv; e++) u[e] -= f * us[e];
      }
      float *out = j->o + (sq->t0 + c0 + t) * nv * dv + h * dv;
      for (int64_t e = 0; e < dv; e++) out[e] = et * WQ[t * dv + e];
      for (int64_t s = 0; s <= t; s++) {
        float f = QK[t * L + s];
        const float *us = U + s * dv;
        for (int64_t e = 0; e < dv; e++) out[e] += f * us[e];
      }
    }
    /* the state at the chunk's end */
    float eL = expf(cum[L - 1]);
    for (int64_t s = 0; s < L; s++) dec[s] = expf(cum[L - 1] - cum[s]);
    for (int64_t i = 0; i < dk; i++) {
      float *Si = S + i * dv;
      for (int64_t e = 0; e < dv; e++) Si[e] *= eL;
      for (int64_t s = 0; s < L; s++) {
        float f = dec[s] * Kt[i * L + s];
        const float *us = U + s * dv;
        for (int64_t e = 0; e < dv; e++) Si[e] += f * us[e];
      }
    }
    if (keep && keep[c0] >= 0) /* the state after token c0 (chunks of one) */
      memcpy(j->state + (int64_t)keep[c0] * j->stride + j->off + h * dk * dv, S, sizeof(float) * (size_t)(dk * dv));
  }
  free(buf);
}

void op_delta_rule_chunked(hpool *pool, float *o, const float *qkv, const float *a, const float *b, const float *a_log,
                           const float *dt_bias, float *state, int64_t stride, int64_t off, const rec_seq *seqs,
                           int64_t n_seqs, const int32_t *keep, const delta_params *p, int64_t chunk) {
  delta_job j = {o, qkv, a, b, a_log, dt_bias, state, stride, off, chunk > 0 ? chunk : 64, seqs, keep, p};
  hpool_for(pool, (int)(n_seqs * p->n_v_heads), delta_task, &j);
}
