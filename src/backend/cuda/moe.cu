/* moe.cu — scale, get_cols, and the mixture-of-experts ops: routing (one
 * thread per token, the selection and the double-precision softmax of
 * op_moe_route) and the experts. bk_moe walks the experts on the host and,
 * per expert, runs one block per (token, slot) that returns at once unless
 * that slot chose the expert: only chosen experts' weights are read, once
 * per kernel, with no host round trip (the routing stays on the device, so
 * the step can be recorded). Each (token, slot) keeps its own output row
 * and a last kernel sums a token's slots in slot order, so the result does
 * not depend on scheduling. A first version: a grouped GEMM over the
 * tokens of each expert is the obvious next step. */
#include <math.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/quant_cuda.cuh"

static unsigned grid_for(int64_t n, int threads) {
  int64_t g = (n + threads - 1) / threads;
  if (g > (1 << 20)) g = 1 << 20;
  return (unsigned)(g < 1 ? 1 : g);
}

#define GRID_LOOP(i, n) \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* ---- scale, get_cols ---- */

__global__ void scale_kernel(float *x, int64_t n, float s) {
  GRID_LOOP(i, n) x[i] = __fmul_rn(x[i], s);
}

void cu_scale(bk_backend *be, const bk_tensor *x, float s) {
  cu_backend *b = cu_be(be);
  if (b->err.code || bk_nelem(x) <= 0) return;
  cudaSetDevice(b->device);
  scale_kernel<<<grid_for(bk_nelem(x), 256), 256, 0, b->stream>>>(cu_fw(x), bk_nelem(x), s);
  cu_check(b, "scale");
}

__global__ void get_cols_kernel(float *y, int64_t n, int64_t w, const float *x, int64_t ldx, int64_t c0) {
  GRID_LOOP(i, n * w) y[i] = x[(i / w) * ldx + c0 + i % w];
}

void cu_get_cols(bk_backend *be, const bk_tensor *y, const bk_tensor *x, int64_t c0) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  if (y->rows != x->rows || c0 < 0 || c0 + y->cols > x->cols) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda get_cols: y [%lld, %lld] from columns %lld.. of x [%lld, %lld]", (long long)y->rows,
            (long long)y->cols, (long long)c0, (long long)x->rows, (long long)x->cols);
    return;
  }
  if (bk_nelem(y) <= 0) return;
  cudaSetDevice(b->device);
  get_cols_kernel<<<grid_for(bk_nelem(y), 256), 256, 0, b->stream>>>(cu_fw(y), y->rows, y->cols, cu_f(x), x->cols, c0);
  cu_check(b, "get_cols");
}

/* ---- routing ---- */

__global__ void moe_route_kernel(int32_t *ids, float *w, const float *logits, int64_t T, int64_t E, int64_t k, int norm,
                                 const float *scale) {
  GRID_LOOP(t, T) {
    const float *l = logits + t * E;
    int32_t *id = ids + t * k;
    float *wt = w + t * k;
    for (int64_t j = 0; j < k; j++) {
      int64_t best = -1;
      for (int64_t x = 0; x < E; x++) {
        bool taken = false;
        for (int64_t q = 0; q < j; q++) taken |= id[q] == x;
        if (!taken && (best < 0 || l[x] > l[best] || (isnan(l[best]) && !isnan(l[x])))) best = x;
      }
      id[j] = (int32_t)best;
    }
    const double m = l[id[0]];
    double sum = 0, sel = 0;
    for (int64_t x = 0; x < E; x++) sum += exp((double)l[x] - m);
    for (int64_t j = 0; j < k; j++) sel += exp((double)l[id[j]] - m) / sum;
    for (int64_t j = 0; j < k; j++) {
      double p = exp((double)l[id[j]] - m) / sum;
      if (norm) p /= sel;
      if (scale) p *= scale[id[j]];
      wt[j] = (float)p;
    }
  }
}

void cu_moe_route(bk_backend *be, const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits, bool norm,
                  const bk_tensor *scale) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  const int64_t T = logits->rows, E = logits->cols, k = ids->cols;
  if (ids->rows != T || w->rows != T || w->cols != k || k < 1 || k > E || (scale && bk_nelem(scale) != E)) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda moe_route: logits [%lld, %lld] into ids [%lld, %lld], w [%lld, %lld]", (long long)T,
            (long long)E, (long long)ids->rows, (long long)k, (long long)w->rows, (long long)w->cols);
    return;
  }
  if (T <= 0) return;
  cudaSetDevice(b->device);
  moe_route_kernel<<<grid_for(T, 64), 64, 0, b->stream>>>((int32_t *)bk_addr(ids), cu_fw(w), cu_f(logits), T, E, k,
                                                          norm ? 1 : 0, scale ? cu_f(scale) : NULL);
  cu_check(b, "moe_route");
}

/* ---- experts ---- */

/* row · x for one row of a stored weight (any format), in f32. */
template <int T>
static __device__ float row_dot_t(const cu_wdesc &w, int64_t row, const float *x) {
  float acc = 0.0f;
  if constexpr (cu_has_tail<T>()) {
    for (int64_t k = 0; k < w.cols; k++) acc = fmaf(cu_load_elem<T>(w, row, k), x[k], acc);
  } else {
    for (int64_t s = 0; s < w.cols / 32; s++) {
      float v[32];
      cu_load_sub<T>(w, row, s, v);
      float a = 0.0f;
#pragma unroll
      for (int k = 0; k < 32; k++) a = fmaf(v[k], x[32 * s + k], a);
      acc += a;
    }
  }
  return acc;
}

static __device__ float row_dot(const cu_wdesc &w, int64_t row, const float *x) {
  switch (w.type) {
    case BK_F32: return row_dot_t<BK_F32>(w, row, x);
    case BK_F16: return row_dot_t<BK_F16>(w, row, x);
    case BK_BF16: return row_dot_t<BK_BF16>(w, row, x);
    case BK_Q8_0: return row_dot_t<BK_Q8_0>(w, row, x);
    case BK_Q4_0: return row_dot_t<BK_Q4_0>(w, row, x);
    case BK_Q4_K: return row_dot_t<BK_Q4_K>(w, row, x);
    case BK_Q5_K: return row_dot_t<BK_Q5_K>(w, row, x);
    case BK_Q6_K: return row_dot_t<BK_Q6_K>(w, row, x);
    case BK_MLX_AFFINE: return row_dot_t<BK_MLX_AFFINE>(w, row, x);
    default: return 0.0f;
  }
}

static __device__ float act_apply(int act, float v) {
  switch (act) {
    case BK_ACT_SILU: return v / (1.0f + expf(-v));
    case BK_ACT_GELU: return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    case BK_ACT_RELU: return v > 0 ? v : 0.0f;
    default: {
      const float k = 0.7978845608028654f;
      return 0.5f * v * (1.0f + tanhf(k * (v + 0.044715f * v * v * v)));
    }
  }
}

/* Block a = a (token, slot) pair of the chunk; h[a] = act(gate · x) * (up · x) when it chose expert e. */
__global__ void moe_up_kernel(float *h, const float *x, int64_t D, const int32_t *ids, int64_t k, int32_t e, cu_wdesc gate,
                              cu_wdesc up, int act) {
  const int64_t a = blockIdx.x;
  if (ids[a] != e) return;
  const float *xt = x + (a / k) * D;
  for (int64_t i = threadIdx.x; i < gate.rows; i += blockDim.x)
    h[a * gate.rows + i] = act_apply(act, row_dot(gate, i, xt)) * row_dot(up, i, xt);
}

/* out[a] = down · h[a] when pair a chose expert e. */
__global__ void moe_down_kernel(float *out, const float *h, int64_t I, const int32_t *ids, int32_t e, cu_wdesc down) {
  const int64_t a = blockIdx.x;
  if (ids[a] != e) return;
  for (int64_t d = threadIdx.x; d < down.rows; d += blockDim.x) out[a * down.rows + d] = row_dot(down, d, h + a * I);
}

/* y[t] = sum over slots j in order of w[t, j] * out[t * k + j] (slots with an id outside the experts: none). */
__global__ void moe_sum_kernel(float *y, const float *out, const float *w, const int32_t *ids, int64_t E, int64_t T,
                               int64_t k, int64_t D) {
  GRID_LOOP(i, T * D) {
    const int64_t t = i / D, d = i % D;
    float s = 0.0f;
    for (int64_t j = 0; j < k; j++)
      if (ids[t * k + j] >= 0 && ids[t * k + j] < E) s += w[t * k + j] * out[(t * k + j) * D + d];
    y[i] = s;
  }
}

void cu_moe(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *ids, const bk_tensor *w,
            const bk_experts *ex, bk_act act) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  const int64_t T = x->rows, D = x->cols, k = ids->cols;
  const int64_t I = ex->n > 0 ? ex->gate[0].rows : 0;
  if (y->rows != T || y->cols != D || ids->rows != T || w->rows != T || w->cols != k || ex->n <= 0 ||
      ex->gate[0].cols != D || ex->down[0].rows != D || ex->down[0].cols != I) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda moe: x [%lld, %lld], y [%lld, %lld], ids [%lld, %lld], %lld experts",
            (long long)T, (long long)D, (long long)y->rows, (long long)y->cols, (long long)ids->rows, (long long)k,
            (long long)ex->n);
    return;
  }
  if (T <= 0) return;
  cudaSetDevice(b->device);
  /* per pair: I floats of h and D of out; chunks of tokens fit the scratch */
  const size_t per_token = (size_t)k * (size_t)(I + D) * sizeof(float);
  int64_t chunk = (int64_t)(CU_SCRATCH_CAP / per_token);
  if (chunk < 1) {
    cu_fail(b, HEARTH_ELIMIT, "cuda moe: one token's %lld experts of %lld x %lld exceed the scratch", (long long)k,
            (long long)I, (long long)D);
    return;
  }
  if (chunk > T) chunk = T;
  float *scratch = (float *)cu_scratch(b, (size_t)chunk * per_token);
  if (!scratch) return;
  const int32_t *id = cu_i(ids);
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = T - t0 < chunk ? T - t0 : chunk;
    float *h = scratch, *out = scratch + n * k * I;
    for (int64_t e = 0; e < ex->n; e++) {
      cu_wdesc g = cu_make_wdesc(&ex->gate[e]), u = cu_make_wdesc(&ex->up[e]), dn = cu_make_wdesc(&ex->down[e]);
      moe_up_kernel<<<(unsigned)(n * k), 128, 0, b->stream>>>(h, cu_f(x) + t0 * D, D, id + t0 * k, k, (int32_t)e, g, u,
                                                             (int)act);
      moe_down_kernel<<<(unsigned)(n * k), 128, 0, b->stream>>>(out, h, I, id + t0 * k, (int32_t)e, dn);
    }
    moe_sum_kernel<<<grid_for(n * D, 256), 256, 0, b->stream>>>(cu_fw(y) + t0 * D, out, cu_f(w) + t0 * k, id + t0 * k,
                                                                  ex->n, n, k, D);
  }
  cu_check(b, "moe");
}
