/* ref.c — the plain reference CPU implementation of every op in
 * backend/ops.h. Written for clarity first: these loops are the spec that
 * faster kernels are tested against. Matmul and attention run on the thread
 * pool. Knows nothing of models, layers or weights' names. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/half.h"

#include "backend/ops.h"
#include "backend/formats.h"

float *bk_alloc(size_t n_floats) {
  size_t bytes = (n_floats ? n_floats : 1) * sizeof(float);
  bytes = (bytes + 63) / 64 * 64;
  float *p = aligned_alloc(64, bytes);
  if (p) memset(p, 0, bytes);
  return p;
}

void bk_free(float *p) { free(p); }

/* ---- matmul ---- */

typedef struct matmul_job {
  float *y;
  const float *x, *w, *bias;
  int64_t n, in, out, cols_per_task;
} matmul_job;

static void matmul_task(void *ctx, int task, int tid) {
  (void)tid;
  const matmul_job *j = ctx;
  int64_t c0 = (int64_t)task * j->cols_per_task;
  int64_t c1 = c0 + j->cols_per_task < j->out ? c0 + j->cols_per_task : j->out;
  for (int64_t c = c0; c < c1; c++) {
    const float *wr = j->w + c * j->in;
    float b = j->bias ? j->bias[c] : 0.0f;
    for (int64_t r = 0; r < j->n; r++) {
      const float *xr = j->x + r * j->in;
      /* four partial sums: keeps the reference fast enough without changing its meaning */
      float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int64_t k = 0;
      for (; k + 4 <= j->in; k += 4) {
        s0 += xr[k] * wr[k];
        s1 += xr[k + 1] * wr[k + 1];
        s2 += xr[k + 2] * wr[k + 2];
        s3 += xr[k + 3] * wr[k + 3];
      }
      for (; k < j->in; k++) s0 += xr[k] * wr[k];
      j->y[r * j->out + c] = (s0 + s1) + (s2 + s3) + b;
    }
  }
}

void op_matmul(hpool *pool, float *y, const float *x, int64_t n, int64_t in, const float *w, int64_t out, const float *bias) {
  op_matmul_ref(pool, y, x, n, in, w, out, bias);
}

void op_matmul_ref(hpool *pool, float *y, const float *x, int64_t n, int64_t in, const float *w, int64_t out, const float *bias) {
  if (n <= 0 || out <= 0) return;
  int threads = hpool_size(pool);
  int64_t per = (out + threads * 4 - 1) / (threads * 4);
  if (per < 16) per = 16;
  matmul_job j = {y, x, w, bias, n, in, out, per};
  int tasks = (int)((out + per - 1) / per);
  hpool_for(pool, tasks, matmul_task, &j);
}

/* ---- norms and elementwise ---- */

void op_rmsnorm(float *y, const float *x, int64_t n, int64_t d, const float *w, float eps, bool unit_offset) {
  for (int64_t r = 0; r < n; r++) {
    const float *xr = x + r * d;
    float *yr = y + r * d;
    double ss = 0;
    for (int64_t i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
    float inv = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
    for (int64_t i = 0; i < d; i++) {
      float s = w ? (unit_offset ? 1.0f + w[i] : w[i]) : 1.0f;
      yr[i] = xr[i] * inv * s;
    }
  }
}

void op_rope(float *x, int64_t n, int64_t n_heads, int64_t head_dim, const int64_t *pos, const rope_table *t) {
  int64_t half = t->rot_dim / 2, na = t->n_axes > 1 ? t->n_axes : 1;
  for (int64_t r = 0; r < n; r++) {
    for (int64_t i = 0; i < half; i++) {
      double angle = (double)pos[r * na + (na > 1 ? t->axis[i] : 0)] * t->inv_freq[i];
      float c = (float)(cos(angle) * t->attn_scale), s = (float)(sin(angle) * t->attn_scale);
      int64_t i0 = t->interleaved ? 2 * i : i, i1 = t->interleaved ? 2 * i + 1 : i + half;
      for (int64_t h = 0; h < n_heads; h++) {
        float *v = x + (r * n_heads + h) * head_dim;
        float a = v[i0], b = v[i1];
        v[i0] = a * c - b * s;
        v[i1] = b * c + a * s;
      }
    }
  }
}

void op_moe_route(int32_t *ids, float *weights, const float *logits, int64_t n, int64_t e, int64_t k, bool norm,
                  const float *scale) {
  for (int64_t t = 0; t < n; t++) {
    const float *l = logits + t * e;
    int32_t *id = ids + t * k;
    float *w = weights + t * k;
    /* selection by logit: the same order as by probability, and exact */
    for (int64_t j = 0; j < k; j++) {
      int64_t best = -1;
      for (int64_t x = 0; x < e; x++) {
        bool taken = false;
        for (int64_t q = 0; q < j; q++) taken |= id[q] == x;
        if (!taken && (best < 0 || l[x] > l[best] || (isnan(l[best]) && !isnan(l[x])))) best = x;
      }
      id[j] = (int32_t)best;
    }
    float m = l[id[0]];
    double sum = 0, sel = 0;
    for (int64_t x = 0; x < e; x++) sum += exp((double)l[x] - m);
    for (int64_t j = 0; j < k; j++) sel += exp((double)l[id[j]] - m) / sum;
    for (int64_t j = 0; j < k; j++) {
      double p = exp((double)l[id[j]] - m) / sum;
      if (norm) p /= sel;
      if (scale) p *= scale[id[j]];
      w[j] = (float)p;
    }
  }
}

void op_clamp(float *x, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; i++) x[i] = x[i] < lo ? lo : x[i] > hi ? hi : x[i];
}

void op_embed_bag(float *y, const float *table, int64_t rows, int64_t d, const int32_t *ids, const float *w, int64_t n,
                  int64_t k) {
  for (int64_t r = 0; r < n; r++)
    for (int64_t c = 0; c < d; c++) {
      double acc = 0;
      for (int64_t j = 0; j < k; j++) {
        int32_t id = ids[r * k + j];
        if (id >= 0 && id < rows) acc += (double)w[r * k + j] * (double)table[(int64_t)id * d + c];
      }
      y[r * d + c] = (float)acc;
    }
}

void op_attention_rel(float *out, const float *q, const float *k, const float *v, const float *rel, const float *qscale,
                      int64_t T, int64_t n_valid, const rel_attn_params *p) {
  int64_t H = p->n_heads, hd = p->head_dim, W = H * hd, span = p->left + p->right + 1;
  double *s = malloc(sizeof(double) * (size_t)(span > 0 ? span : 1));
  double *qs = malloc(sizeof(double) * (size_t)(hd > 0 ? hd : 1));
  if (!s || !qs) { /* the reference's own scratch: an out-of-memory host gives zeros */
    memset(out, 0, sizeof(float) * (size_t)(T * W));
    free(s), free(qs);
    return;
  }
  for (int64_t i = 0; i < T; i++)
    for (int64_t h = 0; h < H; h++) {
      const float *qi = q + i * W + h * hd;
      float *o = out + i * W + h * hd;
      for (int64_t d = 0; d < hd; d++) qs[d] = (double)qi[d] * (qscale ? (double)qscale[d] : 1.0);
      int64_t lo = i - p->left < 0 ? 0 : i - p->left, hi = i + p->right + 1 < n_valid ? i + p->right + 1 : n_valid;
      double m = -INFINITY;
      for (int64_t j = lo; j < hi; j++) {
        const float *kj = k + j * W + h * hd, *rj = rel + (p->right + i - j) * W + h * hd;
        double acc = 0;
        for (int64_t d = 0; d < hd; d++) acc += qs[d] * ((double)kj[d] + (double)rj[d]);
        if (p->softcap > 0) acc = (double)p->softcap * tanh(acc / (double)p->softcap);
        s[j - lo] = acc;
        if (acc > m) m = acc;
      }
      double sum = 0;
      for (int64_t j = lo; j < hi; j++) sum += s[j - lo] = exp(s[j - lo] - m);
      for (int64_t d = 0; d < hd; d++) {
        double acc = 0;
        for (int64_t j = lo; j < hi; j++) acc += s[j - lo] * (double)v[j * W + h * hd + d];
        o[d] = hi > lo ? (float)(acc / sum) : 0.0f;
      }
    }
  free(s), free(qs);
}

void op_softmax(float *x, int64_t n, int64_t d) {
  for (int64_t r = 0; r < n; r++) {
    float *v = x + r * d;
    float m = -INFINITY;
    for (int64_t i = 0; i < d; i++) m = v[i] > m ? v[i] : m;
    double sum = 0;
    for (int64_t i = 0; i < d; i++) {
      v[i] = expf(v[i] - m);
      sum += v[i];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < d; i++) v[i] *= inv;
  }
}

void op_softcap(float *x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] / cap);
}

void op_silu(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = x[i] / (1.0f + expf(-x[i]));
}

void op_gelu_tanh(float *x, int64_t n) {
  const float k = 0.7978845608028654f; /* sqrt(2/pi) */
  for (int64_t i = 0; i < n; i++) {
    float v = x[i];
    x[i] = 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
  }
}

void op_gelu(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

void op_relu(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = x[i] > 0 ? x[i] : 0;
}

void op_mul(float *y, const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i];
}

void op_add(float *y, const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

void op_scale(float *x, int64_t n, float s) {
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}

void op_lora(float *y, const float *x, int64_t n, int64_t in, const float *a, int64_t r, const float *b, int64_t out,
             float scale, float *tmp) {
  for (int64_t i = 0; i < n; i++) {
    const float *xi = x + i * in;
    float *yi = y + i * out;
    for (int64_t j = 0; j < r; j++) {
      double t = 0;
      for (int64_t k = 0; k < in; k++) t += (double)xi[k] * a[j * in + k];
      tmp[j] = (float)t;
    }
    for (int64_t o = 0; o < out; o++) {
      double acc = 0;
      for (int64_t j = 0; j < r; j++) acc += (double)tmp[j] * b[o * r + j];
      yi[o] += (float)(scale * acc);
    }
  }
}

double op_l2_normalize(float *x, int64_t n) {
  double ss = 0;
  for (int64_t i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
  double norm = sqrt(ss);
  if (!(norm > 0) || !isfinite(norm)) return norm;
  for (int64_t i = 0; i < n; i++) x[i] = (float)((double)x[i] / norm);
  return norm;
}

/* ---- quantized KV rows ---- */

const char *bk_kv_fmt_name(bk_kv_fmt f) {
  return f == BK_KV_F32 ? "f32" : f == BK_KV_Q8 ? "q8" : f == BK_KV_Q4 ? "q4" : f == BK_KV_FP8 ? "fp8" : "?";
}

void op_kv_quantize_row(bk_kv_fmt f, void *dst, const float *src, int64_t dim) {
  if (f == BK_KV_F32) {
    memcpy(dst, src, (size_t)dim * sizeof(float));
    return;
  }
  const int qmax = f == BK_KV_Q8 ? 127 : 7;
  const size_t bb = bk_kv_row_bytes(f, BK_KV_QBLOCK);
  uint8_t *out = dst;
  for (int64_t b0 = 0; b0 < dim; b0 += BK_KV_QBLOCK, out += bb) {
    int64_t n = dim - b0 < BK_KV_QBLOCK ? dim - b0 : BK_KV_QBLOCK;
    float amax = 0;
    for (int64_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(src[b0 + i]));
    if (f == BK_KV_FP8) { /* x / d, not x * (1 / d): 1 / d overflows when d is a subnormal float */
      float d = amax / 448.0f;
      memcpy(out, &d, 4);
      memset(out + 4, 0, BK_KV_QBLOCK);
      if (d > 0)
        for (int64_t i = 0; i < n; i++) out[4 + i] = bk_fp8_encode(src[b0 + i] / d);
      continue;
    }
    float d = amax / (float)qmax, id = d > 0 ? 1.0f / d : 0.0f;
    memcpy(out, &d, 4);
    int8_t codes[BK_KV_QBLOCK] = {0};
    for (int64_t i = 0; i < n; i++) {
      float c = rintf(src[b0 + i] * id);
      codes[i] = (int8_t)(c > qmax ? qmax : c < -qmax ? -qmax : c);
    }
    if (f == BK_KV_Q8) {
      memcpy(out + 4, codes, BK_KV_QBLOCK);
    } else {
      for (int j = 0; j < BK_KV_QBLOCK / 2; j++)
        out[4 + j] = (uint8_t)((codes[j] + 8) | ((codes[j + BK_KV_QBLOCK / 2] + 8) << 4));
    }
  }
}

void op_kv_dequantize(bk_kv_fmt f, float *dst, const void *row, int64_t i0, int64_t n) {
  if (f == BK_KV_F32) {
    memcpy(dst, (const float *)row + i0, (size_t)n * sizeof(float));
    return;
  }
  const size_t bb = bk_kv_row_bytes(f, BK_KV_QBLOCK);
  for (int64_t k = 0; k < n; k++) {
    int64_t i = i0 + k, r = i % BK_KV_QBLOCK;
    const uint8_t *blk = (const uint8_t *)row + (size_t)(i / BK_KV_QBLOCK) * bb;
    float d;
    memcpy(&d, blk, 4);
    if (f == BK_KV_FP8) {
      dst[k] = d * bk_fp8_decode(blk[4 + r]);
      continue;
    }
    int code = f == BK_KV_Q8 ? (int)(int8_t)blk[4 + r] : (int)((blk[4 + r % 16] >> (4 * (r / 16))) & 15) - 8;
    dst[k] = d * (float)code;
  }
}

/* ---- attention ---- */

typedef struct attn_job {
  float *out;
  const float *q;
  const int64_t *q_row;
  const kv_view *kv;
  const attn_params *p;
  float *scratch; /* per task: a row of scores [kv->hi] and a dequantized K / V row [head_dim] */
  int64_t span;   /* floats of scratch a task uses */
  int64_t stride; /* floats from one task's scratch to the next's (0: one shared row) */
} attn_job;

static inline const float *kv_row(const float *const *blocks, const kv_view *kv, int64_t stride, int64_t r) {
  return blocks[r / kv->block_rows] + (r % kv->block_rows) * stride;
}

/* Head kvh's head_dim elements of stored row r, as floats (in buf when they must be dequantized). */
static const float *kv_head(const float *const *blocks, const kv_view *kv, bk_kv_fmt f, int64_t stride, int64_t r,
                            int64_t kvh, int64_t hd, float *buf) {
  const float *row = kv_row(blocks, kv, stride, r);
  if (f == BK_KV_F32) return row + kvh * hd;
  op_kv_dequantize(f, buf, row, kvh * hd, hd);
  return buf;
}

static void attn_task(void *ctx, int task, int tid) {
  (void)tid;
  const attn_job *j = ctx;
  const attn_params *p = j->p;
  const kv_view *kv = j->kv;
  int64_t i = task / p->n_heads, h = task % p->n_heads;
  int64_t group = p->n_heads / p->n_kv_heads, kvh = h / group, hd = p->head_dim;
  int64_t vstride = kv->v_row_stride ? kv->v_row_stride : kv->row_stride;
  const float *qv = j->q + (i * p->n_heads + h) * hd;
  float *o = j->out + (i * p->n_heads + h) * hd;
  int64_t hi = (kv->last ? kv->last[i] : j->q_row[i]) + 1;
  if (hi > kv->hi) hi = kv->hi;
  int64_t lo = kv->lo;
  if (p->window > 0 && j->q_row[i] - p->window + 1 > lo) lo = j->q_row[i] - p->window + 1;
  memset(o, 0, (size_t)hd * sizeof *o);
  if (hi <= lo) return;
  float *s = j->scratch + (int64_t)task * j->stride, *buf = s + (j->span - hd);
  for (int64_t r = lo; r < hi; r++) {
    const float *k = kv_head(kv->k_blocks, kv, kv->k_fmt, kv->row_stride, r, kvh, hd, buf);
    float dot = 0;
    for (int64_t d = 0; d < hd; d++) dot += qv[d] * k[d];
    dot *= p->scale;
    if (p->softcap > 0) dot = p->softcap * tanhf(dot / p->softcap);
    s[r - lo] = dot;
  }
  op_softmax(s, 1, hi - lo);
  for (int64_t r = lo; r < hi; r++) {
    const float *v = kv_head(kv->v_blocks, kv, kv->v_fmt, vstride, r, kvh, hd, buf);
    float w = s[r - lo];
    for (int64_t d = 0; d < hd; d++) o[d] += w * v[d];
  }
}

void op_attention_ref(hpool *pool, float *out, const float *q, int64_t n, const int64_t *q_row, const kv_view *kv,
                      const attn_params *p) {
  if (n <= 0) return;
  int64_t span = kv->hi - kv->lo;
  if (span < 1) span = 1;
  span += p->head_dim;
  float *scratch = malloc((size_t)(n * p->n_heads * span) * sizeof(float));
  if (!scratch) {
    /* no room for parallel scratch: run one task at a time in a single row */
    float *one = malloc((size_t)span * sizeof(float));
    attn_job j = {out, q, q_row, kv, p, one, span, 0};
    for (int64_t t = 0; one && t < n * p->n_heads; t++) attn_task(&j, (int)t, 0);
    free(one);
    return;
  }
  attn_job j = {out, q, q_row, kv, p, scratch, span, span};
  hpool_for(pool, (int)(n * p->n_heads), attn_task, &j);
  free(scratch);
}

/* ---- recurrent layers ---- */

void op_conv1d_state(float *y, const float *x, int64_t c, const float *w, int64_t k, float *state, int64_t stride,
                     int64_t off, const rec_seq *seqs, int64_t n_seqs, const int32_t *keep, bool silu) {
  for (int64_t s = 0; s < n_seqs; s++) {
    const rec_seq *sq = &seqs[s];
    float *st = state + (int64_t)sq->slot * stride + off; /* [k - 1, c] */
    if (sq->fresh) memset(st, 0, sizeof(float) * (size_t)((k - 1) * c));
    for (int64_t i = 0; keep && i < sq->n; i++) /* the state after token i: its k - 1 inputs up to i (st not yet overwritten) */
      if (keep[sq->t0 + i] >= 0)
        for (int64_t m = 0; m < k - 1; m++) {
          int64_t at = i + 1 - (k - 1) + m;
          const float *src = at >= 0 ? x + (sq->t0 + at) * c : st + (k - 1 + at) * c;
          memcpy(state + (int64_t)keep[sq->t0 + i] * stride + off + m * c, src, sizeof(float) * (size_t)c);
        }
    for (int64_t i = 0; i < sq->n; i++) {
      float *yr = y + (sq->t0 + i) * c;
      for (int64_t ch = 0; ch < c; ch++) {
        double acc = 0;
        for (int64_t j = 0; j < k; j++) {
          int64_t at = i - (k - 1) + j; /* the input's index in this step's tokens; < 0: in the state */
          float in = at >= 0 ? x[(sq->t0 + at) * c + ch] : st[(k - 1 + at) * c + ch];
          acc += (double)w[ch * k + j] * in;
        }
        yr[ch] = (float)(silu ? acc / (1.0 + exp(-acc)) : acc);
      }
    }
    /* the last k - 1 inputs; a source in the old state lies at or after the slot written */
    for (int64_t m = 0; m < k - 1; m++) {
      int64_t at = sq->n - (k - 1) + m;
      const float *src = at >= 0 ? x + (sq->t0 + at) * c : st + (k - 1 + at) * c;
      if (src != st + m * c) memmove(st + m * c, src, sizeof(float) * (size_t)c);
    }
  }
}

static double softplus(double x) { return x > 20 ? x : log1p(exp(x)); }

void op_delta_rule_ref(float *o, const float *qkv, const float *a, const float *b, const float *a_log, const float *dt_bias,
                       float *state, int64_t stride, int64_t off, const rec_seq *seqs, int64_t n_seqs, const delta_params *p) {
  int64_t nk = p->n_k_heads, nv = p->n_v_heads, dk = p->dk, dv = p->dv, W = 2 * nk * dk + nv * dv, rep = nv / nk;
  float *q = malloc(sizeof(float) * (size_t)(2 * dk));
  double *u = malloc(sizeof(double) * (size_t)dv);
  if (!q || !u) goto done;
  float *kk = q + dk;
  for (int64_t s = 0; s < n_seqs; s++) {
    const rec_seq *sq = &seqs[s];
    float *S0 = state + (int64_t)sq->slot * stride + off;
    if (sq->fresh) memset(S0, 0, sizeof(float) * (size_t)(nv * dk * dv));
    for (int64_t i = 0; i < sq->n; i++) {
      int64_t t = sq->t0 + i;
      const float *row = qkv + t * W;
      for (int64_t h = 0; h < nv; h++) {
        int64_t kh = h / rep;
        double qs = 0, ks = 0;
        for (int64_t d = 0; d < dk; d++) {
          q[d] = row[kh * dk + d], kk[d] = row[nk * dk + kh * dk + d];
          qs += (double)q[d] * q[d], ks += (double)kk[d] * kk[d];
        }
        double qn = 1.0 / sqrt(qs + 1e-6) / sqrt((double)dk), kn = 1.0 / sqrt(ks + 1e-6);
        for (int64_t d = 0; d < dk; d++) q[d] = (float)(q[d] * qn), kk[d] = (float)(kk[d] * kn);
        const float *v = row + 2 * nk * dk + h * dv;
        double g = -exp((double)a_log[h]) * softplus((double)a[t * nv + h] + dt_bias[h]);
        double beta = 1.0 / (1.0 + exp(-(double)b[t * nv + h])), decay = exp(g);
        float *S = S0 + h * dk * dv;
        for (int64_t e = 0; e < dk * dv; e++) S[e] = (float)(S[e] * decay);
        for (int64_t j = 0; j < dv; j++) {
          double mem = 0;
          for (int64_t d = 0; d < dk; d++) mem += (double)S[d * dv + j] * kk[d];
          u[j] = beta * ((double)v[j] - mem);
        }
        for (int64_t d = 0; d < dk; d++)
          for (int64_t j = 0; j < dv; j++) S[d * dv + j] = (float)(S[d * dv + j] + (double)kk[d] * u[j]);
        float *out = o + t * nv * dv + h * dv;
        for (int64_t j = 0; j < dv; j++) {
          double acc = 0;
          for (int64_t d = 0; d < dk; d++) acc += (double)S[d * dv + j] * q[d];
          out[j] = (float)acc;
        }
      }
    }
  }
done:
  free(q);
  free(u);
}

void op_sigmoid_mul(float *y, const float *g, int64_t n, int64_t d, int64_t gd) {
  for (int64_t r = 0; r < n; r++)
    for (int64_t c = 0; c < d; c++) {
      float gv = g[r * gd + (gd == 1 ? 0 : c)];
      y[r * d + c] = y[r * d + c] / (1.0f + expf(-gv));
    }
}

/* ---- conversions ---- */

void bk_bf16_to_f32(float *y, const uint16_t *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u = (uint32_t)x[i] << 16;
    memcpy(&y[i], &u, 4);
  }
}


void bk_f16_to_f32(float *y, const uint16_t *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = hf16_to_f32(x[i]);
}

float bk_round_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x; /* inf / nan */
  u += 0x7fffu + ((u >> 16) & 1);
  u &= 0xffff0000u;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float bk_round_f16(float x) {
  if (!isfinite(x)) return x;
  float a = fabsf(x);
  if (a >= 65520.0f) return x > 0 ? INFINITY : -INFINITY;
  int e;
  frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
  int ulp_exp = e - 11;
  if (ulp_exp < -24) ulp_exp = -24; /* subnormals */
  float q = ldexpf(nearbyintf(ldexpf(x, -ulp_exp)), ulp_exp);
  return q;
}
