/* media.cu — the ops the media encoders add (backend.h, "media encoders"):
 * an activation alone, clamp, the weighted sum of table rows (embed_bag)
 * and the conformer's local attention with relative-position logits.
 * Formulas follow cpu/ref.c (op_clamp, op_embed_bag, op_attention_rel);
 * embed_bag sums in double as the reference does. */
#include <math.h>

#include "backend/cuda/cuda_common.cuh"

static unsigned media_grid(int64_t n, int threads) {
  int64_t g = (n + threads - 1) / threads;
  if (g > (1 << 20)) g = 1 << 20;
  return (unsigned)(g < 1 ? 1 : g);
}

#define MEDIA_LOOP(i, n) \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* ---- act, clamp ---- */

__global__ void act_kernel(float *x, int64_t n, int act) {
  MEDIA_LOOP(i, n) {
    float v = x[i], a;
    switch (act) {
      case BK_ACT_SILU: a = v / (1.0f + expf(-v)); break;
      case BK_ACT_GELU_TANH: {
        const float k = 0.7978845608028654f;
        float inner = __fmul_rn(k, __fadd_rn(v, __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, v), v), v)));
        a = __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, tanhf(inner)));
        break;
      }
      case BK_ACT_GELU: a = __fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, erff(__fmul_rn(v, 0.70710678118654752f)))); break;
      default: a = v > 0 ? v : 0; break;
    }
    x[i] = a;
  }
}

void cu_act(bk_backend *be, const bk_tensor *x, bk_act act) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  const int64_t n = bk_nelem(x);
  if ((unsigned)act > BK_ACT_RELU) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda act: activation %d", (int)act);
    return;
  }
  if (n <= 0) return;
  cudaSetDevice(b->device);
  act_kernel<<<media_grid(n, 256), 256, 0, b->stream>>>(cu_fw(x), n, (int)act);
  cu_check(b, "act");
}

__global__ void clamp_kernel(float *x, int64_t n, float lo, float hi) {
  MEDIA_LOOP(i, n) {
    const float v = x[i];
    x[i] = v < lo ? lo : v > hi ? hi : v;
  }
}

void cu_clamp(bk_backend *be, const bk_tensor *x, float lo, float hi) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  const int64_t n = bk_nelem(x);
  if (n <= 0) return;
  cudaSetDevice(b->device);
  clamp_kernel<<<media_grid(n, 256), 256, 0, b->stream>>>(cu_fw(x), n, lo, hi);
  cu_check(b, "clamp");
}

/* ---- embed_bag ---- */

__global__ void embed_bag_kernel(float *__restrict__ y, const float *__restrict__ table, int64_t rows, int64_t d,
                                 const int32_t *__restrict__ ids, const float *__restrict__ w, int64_t n, int64_t k) {
  MEDIA_LOOP(i, n * d) {
    const int64_t r = i / d, c = i % d;
    double acc = 0;
    for (int64_t j = 0; j < k; j++) {
      const int32_t id = ids[r * k + j];
      if (id >= 0 && id < rows) acc += (double)w[r * k + j] * (double)table[(int64_t)id * d + c];
    }
    y[i] = (float)acc;
  }
}

void cu_embed_bag(bk_backend *be, const bk_tensor *y, const bk_tensor *table, const bk_tensor *ids, const bk_tensor *w) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  if (y->cols != table->cols || ids->rows != y->rows || w->rows != y->rows || w->cols != ids->cols || ids->dt != BK_DT_I32) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda embed_bag: y [%lld, %lld] from table [%lld, %lld], ids [%lld, %lld], w [%lld, %lld]",
            (long long)y->rows, (long long)y->cols, (long long)table->rows, (long long)table->cols, (long long)ids->rows,
            (long long)ids->cols, (long long)w->rows, (long long)w->cols);
    return;
  }
  if (y->rows <= 0 || y->cols <= 0) return;
  cudaSetDevice(b->device);
  embed_bag_kernel<<<media_grid(y->rows * y->cols, 256), 256, 0, b->stream>>>(
      cu_fw(y), cu_f(table), table->rows, table->cols, cu_i(ids), cu_f(w), y->rows, ids->cols);
  cu_check(b, "embed_bag");
}

/* ---- attention_rel ---- */

#define REL_MAX_HD 256
#define REL_DI (REL_MAX_HD / 32)

/* One warp per (query, head): lane l holds dims l, l + 32, ...; keys one at a time with an online softmax. */
__global__ void __launch_bounds__(32) attention_rel_kernel(float *__restrict__ out, const float *__restrict__ q,
                                                           const float *__restrict__ k, const float *__restrict__ v,
                                                           const float *__restrict__ rel, const float *__restrict__ qscale,
                                                           int64_t n_valid, int64_t H, int64_t hd, int64_t left,
                                                           int64_t right, float cap) {
  const int64_t i = blockIdx.x, h = blockIdx.y, W = H * hd;
  const int lane = threadIdx.x;
  float qs[REL_DI], o[REL_DI];
#pragma unroll
  for (int u = 0; u < REL_DI; u++) {
    const int64_t d = lane + 32 * u;
    qs[u] = d < hd ? __fmul_rn(q[i * W + h * hd + d], qscale ? qscale[d] : 1.0f) : 0.0f;
    o[u] = 0.0f;
  }
  const int64_t lo = i - left < 0 ? 0 : i - left, hi = i + right + 1 < n_valid ? i + right + 1 : n_valid;
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = lo; j < hi; j++) {
    const float *kj = k + j * W + h * hd, *rj = rel + (right + i - j) * W + h * hd;
    float dot = 0.0f;
#pragma unroll
    for (int u = 0; u < REL_DI; u++) {
      const int64_t d = lane + 32 * u;
      if (d < hd) dot = fmaf(qs[u], __fadd_rn(kj[d], rj[d]), dot);
    }
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, s);
    if (cap > 0) dot = __fmul_rn(cap, tanhf(dot / cap));
    const float mn = fmaxf(m, dot), alpha = expf(m - mn), p = expf(dot - mn);
    l = l * alpha + p;
#pragma unroll
    for (int u = 0; u < REL_DI; u++) {
      const int64_t d = lane + 32 * u;
      if (d < hd) o[u] = fmaf(p, v[j * W + h * hd + d], o[u] * alpha);
    }
    m = mn;
  }
#pragma unroll
  for (int u = 0; u < REL_DI; u++) {
    const int64_t d = lane + 32 * u;
    if (d < hd) out[i * W + h * hd + d] = hi > lo ? o[u] / l : 0.0f;
  }
}

void cu_attention_rel(bk_backend *be, const bk_tensor *out, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                      const bk_tensor *rel, const bk_tensor *qscale, int64_t n_valid, const rel_attn_params *p) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  const int64_t T = q->rows, W = p->n_heads * p->head_dim, span = p->left + p->right + 1;
  if (q->cols != W || k->cols != W || v->cols != W || out->cols != W || k->rows != T || v->rows != T || out->rows != T ||
      rel->cols != W || rel->rows < span || p->head_dim > REL_MAX_HD || p->left < 0 || p->right < 0 || n_valid > T ||
      (qscale && bk_nelem(qscale) != p->head_dim)) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda attention_rel: q [%lld, %lld] as %lld heads of %lld, rel [%lld, %lld], window [-%lld, +%lld]",
            (long long)q->rows, (long long)q->cols, (long long)p->n_heads, (long long)p->head_dim, (long long)rel->rows,
            (long long)rel->cols, (long long)p->left, (long long)p->right);
    return;
  }
  if (T <= 0 || p->n_heads <= 0) return;
  cudaSetDevice(b->device);
  dim3 grid((unsigned)T, (unsigned)p->n_heads);
  attention_rel_kernel<<<grid, 32, 0, b->stream>>>(cu_fw(out), cu_f(q), cu_f(k), cu_f(v), cu_f(rel),
                                                   qscale ? cu_f(qscale) : NULL, n_valid < 0 ? 0 : n_valid, p->n_heads,
                                                   p->head_dim, p->left, p->right, p->softcap);
  cu_check(b, "attention_rel");
}
