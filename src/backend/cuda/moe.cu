/* moe.cu — scale, get_cols, and the mixture-of-experts ops: routing (one
 * thread per token, the selection and the double-precision softmax of
 * op_moe_route) and the experts. The experts' matrices are found on the
 * device from the routed ids through a table of their descriptors (uploaded
 * when the set is first seen or changes), so only chosen experts' weights
 * are read and nothing waits for the host: a decode step can be recorded.
 * Up to 8 tokens: one warp per (token slot, output row) (GEMV); more: the
 * (token, slot) pairs are counted and laid out by expert on the device and
 * a tiled GEMM reads each chosen expert's weights once per 64 pairs. Each
 * pair keeps its own output row and a last kernel sums a token's slots in
 * slot order, so the result does not depend on scheduling. Sets whose
 * shapes or types differ between experts, or whose inputs are not whole
 * sub-blocks of 32, run one expert at a time (moe_per_expert). Sets with
 * LoRA deltas (bk_expert_lora) take plain kernels of their own (moe_lora). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/quant_cuda.cuh"

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
    case BK_Q5_0: return row_dot_t<BK_Q5_0>(w, row, x);
    case BK_Q5_1: return row_dot_t<BK_Q5_1>(w, row, x);
    case BK_Q2_K: return row_dot_t<BK_Q2_K>(w, row, x);
    case BK_Q3_K: return row_dot_t<BK_Q3_K>(w, row, x);
    case BK_IQ4_NL: return row_dot_t<BK_IQ4_NL>(w, row, x);
    case BK_IQ4_XS: return row_dot_t<BK_IQ4_XS>(w, row, x);
    case BK_MLX_AFFINE: return row_dot_t<BK_MLX_AFFINE>(w, row, x);
    case BK_FP8: return row_dot_t<BK_FP8>(w, row, x);
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


/* The experts one at a time (every format and shape): per expert, one block per (token, slot) pair. */
static void moe_per_expert(cu_backend *b, const bk_tensor *y, const bk_tensor *x, const bk_tensor *ids, const bk_tensor *w,
                           const bk_experts *ex, bk_act act) {
  const int64_t T = x->rows, D = x->cols, k = ids->cols, I = ex->gate[0].rows;
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
}

/* ---- the experts' descriptors on the device ----
 * The fast paths below find expert e's matrices from the routed ids on the
 * device: a table of 3n descriptors (gate[0..n), up[0..n), down[0..n)) per
 * expert set, uploaded when first seen and again whenever a descriptor
 * changes (an expert budget loads and releases experts between steps). A
 * recorded step reads the table uploaded by the plain run before it; a
 * change while recording fails the recording (the step then runs plainly). */
struct cu_moe_tab {
  const bk_weight *key; /* the set's gate array */
  int64_t n;
  cu_wdesc *host;       /* owned: what the device copy holds */
  cu_wdesc *dev;        /* owned */
};

void cu_moe_free(cu_backend *b) {
  for (int i = 0; i < b->n_moe_tabs; i++) {
    free(b->moe_tabs[i].host);
    if (b->moe_tabs[i].dev) cudaFree(b->moe_tabs[i].dev);
  }
  free(b->moe_tabs);
  free(b->moe_tmp);
  b->moe_tabs = NULL;
  b->moe_tmp = NULL;
  b->n_moe_tabs = 0;
}

static bool wdesc_eq(const cu_wdesc &a, const cu_wdesc &b) {
  return a.data == b.data && a.scales == b.scales && a.biases == b.biases && a.rows == b.rows && a.cols == b.cols &&
         a.row_bytes == b.row_bytes && a.type == b.type && a.bits == b.bits && a.group_size == b.group_size &&
         a.scale_type == b.scale_type && a.vec == b.vec;
}

static const cu_wdesc *moe_table(cu_backend *b, const bk_experts *ex) {
  const int64_t n = ex->n, bytes = 3 * n * (int64_t)sizeof(cu_wdesc);
  cu_wdesc *now = (cu_wdesc *)realloc(b->moe_tmp, (size_t)bytes);
  if (!now) {
    cu_fail(b, HEARTH_ENOMEM, "cuda moe: out of host memory");
    return NULL;
  }
  b->moe_tmp = now;
  for (int64_t e = 0; e < n; e++) {
    now[e] = cu_make_wdesc(&ex->gate[e]);
    now[n + e] = cu_make_wdesc(&ex->up[e]);
    now[2 * n + e] = cu_make_wdesc(&ex->down[e]);
  }
  cu_moe_tab *t = NULL;
  for (int i = 0; i < b->n_moe_tabs && !t; i++)
    if (b->moe_tabs[i].key == ex->gate) t = &b->moe_tabs[i];
  if (t && t->n == n) {
    bool same = true;
    for (int64_t i = 0; i < 3 * n && same; i++) same = wdesc_eq(t->host[i], now[i]);
    if (same) return t->dev;
  }
  if (b->graph_mode == 1) { /* recording: no uploads (the plain run before it made the table) */
    cu_fail(b, HEARTH_EINTERNAL, "cuda moe: expert table changed while recording");
    return NULL;
  }
  if (!t) {
    cu_moe_tab *grown = (cu_moe_tab *)realloc(b->moe_tabs, sizeof *grown * (size_t)(b->n_moe_tabs + 1));
    if (!grown) {
      cu_fail(b, HEARTH_ENOMEM, "cuda moe: out of host memory");
      return NULL;
    }
    b->moe_tabs = grown;
    t = &b->moe_tabs[b->n_moe_tabs++];
    memset(t, 0, sizeof *t);
    t->key = ex->gate;
  }
  if (t->n != n) {
    if (t->dev) {
      cudaStreamSynchronize(b->stream); /* queued work may read it */
      cudaFree(t->dev);
    }
    free(t->host);
    t->dev = NULL;
    t->host = (cu_wdesc *)malloc((size_t)bytes);
    t->n = 0;
    if (!t->host || cudaMalloc(&t->dev, (size_t)bytes) != cudaSuccess) {
      cudaGetLastError();
      free(t->host);
      t->host = NULL;
      t->dev = NULL;
      cu_fail(b, HEARTH_ENOMEM, "cuda moe: no memory for the expert table");
      return NULL;
    }
    t->n = n;
  }
  memcpy(t->host, now, (size_t)bytes);
  /* from pageable memory: staged before the call returns, ordered with the kernels on the stream */
  if (cudaMemcpyAsync(t->dev, t->host, (size_t)bytes, cudaMemcpyHostToDevice, b->stream) != cudaSuccess) {
    cu_check(b, "moe (expert table)");
    return NULL;
  }
  return t->dev;
}

/* ---- decode: one warp per (slot, output row) ----
 * Few tokens: grid (output rows / MV_WARPS, T * k); block y is a (token,
 * slot) pair, which reads its expert from the ids and returns at once when
 * the slot is empty. Only the chosen experts' rows are read. */
#define MV_WARPS 8

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int T>
static __device__ __forceinline__ float sub_dot(const cu_wdesc &w, int64_t row, int64_t s, const float *__restrict__ x) {
  float v[32];
  cu_load_sub<T>(w, row, s, v);
  const float4 *xv = (const float4 *)(x + 32 * s);
  float a = 0.0f;
#pragma unroll
  for (int q = 0; q < 8; q++) {
    const float4 f = __ldg(xv + q);
    a = fmaf(v[4 * q], f.x, a);
    a = fmaf(v[4 * q + 1], f.y, a);
    a = fmaf(v[4 * q + 2], f.z, a);
    a = fmaf(v[4 * q + 3], f.w, a);
  }
  return a;
}

template <int T>
__global__ void __launch_bounds__(MV_WARPS * 32)
    moe_gemv_up_kernel(const cu_wdesc *__restrict__ tab, int64_t E, const int32_t *__restrict__ ids, int64_t k,
                       const float *__restrict__ x, int64_t D, int64_t I, float *__restrict__ h, int act) {
  const int64_t a = blockIdx.y, row = (int64_t)blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
  const int32_t e = ids[a];
  if (e < 0 || e >= E || row >= I) return;
  const int lane = threadIdx.x & 31;
  const cu_wdesc g = tab[e], u = tab[E + e];
  const float *xt = x + (a / k) * D;
  float ag = 0.0f, au = 0.0f;
  for (int64_t s = lane; s < D / 32; s += 32) {
    ag += sub_dot<T>(g, row, s, xt);
    au += sub_dot<T>(u, row, s, xt);
  }
  ag = warp_sum(ag);
  au = warp_sum(au);
  if (lane == 0) h[a * I + row] = act_apply(act, ag) * au;
}

template <int T>
__global__ void __launch_bounds__(MV_WARPS * 32)
    moe_gemv_down_kernel(const cu_wdesc *__restrict__ tab, int64_t E, const int32_t *__restrict__ ids,
                         const float *__restrict__ h, int64_t I, int64_t D, float *__restrict__ out) {
  const int64_t a = blockIdx.y, row = (int64_t)blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
  const int32_t e = ids[a];
  if (e < 0 || e >= E || row >= D) return;
  const int lane = threadIdx.x & 31;
  const cu_wdesc dn = tab[2 * E + e];
  const float *ha = h + a * I;
  float acc = 0.0f;
  for (int64_t s = lane; s < I / 32; s += 32) acc += sub_dot<T>(dn, row, s, ha);
  acc = warp_sum(acc);
  if (lane == 0) out[a * D + row] = acc;
}

/* ---- many tokens: grouped by expert, tiled GEMM ----
 * moe_group_kernel (one block) counts the pairs of each expert, lays the
 * pairs out expert by expert (pair[start[e] ..)) and numbers the tiles of
 * GM pairs each expert needs (tile0[e] ..); the GEMM kernels' blocks are
 * (tile, GN output rows): a block finds its expert from the tile, gathers
 * its pairs' activation rows and decodes its GN weight rows 32 inputs at a
 * time into shared memory, and multiplies there. An expert's weights are
 * read once per tile of GM pairs that chose it. Every output element sums
 * its products in input order whichever pairs share its tile, so the
 * result does not depend on the grouping. */
#define GM 64
#define GN 64
#define GTHREADS 256

__global__ void moe_group_kernel(const int32_t *__restrict__ ids, int64_t TK, int64_t E, int32_t *__restrict__ start,
                                 int32_t *__restrict__ tile0, int32_t *__restrict__ pair) {
  extern __shared__ int32_t gsh[];
  int32_t *cnt = gsh, *fill = gsh + E, *st = gsh + 2 * E;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0, fill[e] = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < TK; i += blockDim.x) {
    const int32_t e = ids[i];
    if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t s = 0, t = 0;
    for (int64_t e = 0; e < E; e++) {
      st[e] = s, start[e] = s, tile0[e] = t;
      s += cnt[e];
      t += (cnt[e] + GM - 1) / GM;
    }
    start[E] = s, tile0[E] = t;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < TK; i += blockDim.x) {
    const int32_t e = ids[i];
    if (e >= 0 && e < E) pair[st[e] + atomicAdd(&fill[e], 1)] = (int32_t)i;
  }
}

/* The expert of tile `tile` (tile0[e] <= tile < tile0[e + 1]) or -1 past the last. */
static __device__ int32_t tile_expert(const int32_t *tile0, int64_t E, int64_t tile) {
  if (tile >= tile0[E]) return -1;
  int64_t lo = 0, hi = E - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (tile0[mid] <= tile) lo = mid;
    else hi = mid - 1;
  }
  return (int32_t)lo;
}

/* Rows n0.. of w, inputs [32 s, 32 s + 32), into bs[kk][n] (rows past w.rows: zeros). */
template <int T>
static __device__ __forceinline__ void load_b(float (*bs)[GN + 1], const cu_wdesc &w, int64_t n0, int64_t s, int n) {
  float v[32];
  if (n0 + n < w.rows) cu_load_sub<T>(w, n0 + n, s, v);
  else {
#pragma unroll
    for (int q = 0; q < 32; q++) v[q] = 0.0f;
  }
#pragma unroll
  for (int q = 0; q < 32; q++) bs[q][n] = v[q];
}

/* UP: h[p] = act(gate_e · x[p / k]) * (up_e · x[p / k]); else out[p] = down_e · h[p]. */
template <int T, bool UP>
__global__ void __launch_bounds__(GTHREADS)
    moe_gemm_kernel(const cu_wdesc *__restrict__ tab, int64_t E, const int32_t *__restrict__ start,
                    const int32_t *__restrict__ tile0, const int32_t *__restrict__ pair, int64_t k,
                    const float *__restrict__ a, int64_t K, float *__restrict__ out, int64_t N, int act) {
  __shared__ float as[32][GM + 1];
  __shared__ float bs[UP ? 2 : 1][32][GN + 1];
  __shared__ int32_t rows[GM];
  const int64_t tile = blockIdx.x, n0 = (int64_t)blockIdx.y * GN;
  const int32_t e = tile_expert(tile0, E, tile);
  if (e < 0) return;
  const int64_t m0 = start[e] + (tile - tile0[e]) * GM, m1 = start[e + 1];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  if (tid < GM) {
    const int64_t m = m0 + tid;
    rows[tid] = m < m1 ? pair[m] : -1;
  }
  const cu_wdesc w0 = tab[(UP ? 0 : 2) * E + e];
  cu_wdesc w1 = w0;
  if (UP) w1 = tab[E + e];
  float acc0[4][4], acc1[4][4];
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) acc0[i][j] = 0.0f, acc1[i][j] = 0.0f;
  __syncthreads();
  for (int64_t s = 0; s < K / 32; s++) {
    /* activations: GM rows x 32 inputs, thread -> (row idx % GM, input idx / GM) */
    for (int idx = tid; idx < GM * 32; idx += GTHREADS) {
      const int m = idx % GM, kk = idx / GM;
      const int32_t p = rows[m];
      as[kk][m] = p >= 0 ? a[(UP ? p / k : p) * K + 32 * s + kk] : 0.0f;
    }
    if (tid < GN) load_b<T>(bs[0], w0, n0, s, tid);
    else if (UP && tid < 2 * GN) load_b<T>(bs[UP ? 1 : 0], w1, n0, s, tid - GN);
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < 32; kk++) {
      float av[4], b0[4], b1[4];
#pragma unroll
      for (int i = 0; i < 4; i++) av[i] = as[kk][ty * 4 + i], b0[i] = bs[0][kk][tx * 4 + i];
      if (UP) {
#pragma unroll
        for (int i = 0; i < 4; i++) b1[i] = bs[UP ? 1 : 0][kk][tx * 4 + i];
      }
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
          acc0[i][j] = fmaf(av[i], b0[j], acc0[i][j]);
          if (UP) acc1[i][j] = fmaf(av[i], b1[j], acc1[i][j]);
        }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int32_t p = rows[ty * 4 + i];
    if (p < 0) continue;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int64_t n = n0 + tx * 4 + j;
      if (n < N) out[(int64_t)p * N + n] = UP ? act_apply(act, acc0[i][j]) * acc1[i][j] : acc0[i][j];
    }
  }
}

/* Whether the fast paths take this set: every gate and up of one type and
 * shape, every down of one type and shape, inputs whole sub-blocks of 32. */
static bool moe_uniform(const bk_experts *ex) {
  const bk_weight *g = &ex->gate[0], *d = &ex->down[0];
  if (g->cols % 32 || d->cols % 32) return false;
  for (int64_t e = 0; e < ex->n; e++) {
    const bk_weight *ws[3] = {&ex->gate[e], &ex->up[e], &ex->down[e]};
    for (int q = 0; q < 3; q++) {
      const bk_weight *r = q == 2 ? d : g, *w = ws[q];
      if (w->type != r->type || w->rows != r->rows || w->cols != r->cols || !w->data ||
          (w->type == BK_MLX_AFFINE && (w->bits != r->bits || w->group_size != r->group_size)))
        return false;
    }
  }
  return true;
}

#define MOE_GEMV_MAX_T 8

template <int T>
static void launch_up(cu_backend *b, bool gemv, const cu_wdesc *tab, int64_t E, const int32_t *ids, int64_t k,
                      const float *x, int64_t n, int64_t D, int64_t I, float *h, int act, const int32_t *start,
                      const int32_t *tile0, const int32_t *pair, int64_t tiles) {
  if (gemv) {
    dim3 grid(cu_blocks(I, MV_WARPS), (unsigned)(n * k));
    moe_gemv_up_kernel<T><<<grid, MV_WARPS * 32, 0, b->stream>>>(tab, E, ids, k, x, D, I, h, act);
  } else {
    dim3 grid((unsigned)tiles, cu_blocks(I, GN));
    moe_gemm_kernel<T, true><<<grid, GTHREADS, 0, b->stream>>>(tab, E, start, tile0, pair, k, x, D, h, I, act);
  }
}

template <int T>
static void launch_down(cu_backend *b, bool gemv, const cu_wdesc *tab, int64_t E, const int32_t *ids, int64_t k,
                        const float *h, int64_t n, int64_t I, int64_t D, float *out, const int32_t *start,
                        const int32_t *tile0, const int32_t *pair, int64_t tiles) {
  if (gemv) {
    dim3 grid(cu_blocks(D, MV_WARPS), (unsigned)(n * k));
    moe_gemv_down_kernel<T><<<grid, MV_WARPS * 32, 0, b->stream>>>(tab, E, ids, h, I, D, out);
  } else {
    dim3 grid((unsigned)tiles, cu_blocks(D, GN));
    moe_gemm_kernel<T, false><<<grid, GTHREADS, 0, b->stream>>>(tab, E, start, tile0, pair, k, h, I, out, D, 0);
  }
}

/* ---- the experts with LoRA deltas (bk_experts.lora) ----
 * As cpu/moe.c: each routed pair's gate and up products gain every adapter's
 * delta (adapters in order) before the activation, and its down product
 * gains every adapter's delta on the activated product; the pairs are then
 * summed in slot order (moe_sum_kernel). Plain kernels, nothing fused: the
 * base products one block per (token, slot) pair, the expert found through
 * the device table; each adapter's delta as op_lora computes it, t = x · a_eᵀ
 * (a thread per (pair, rank), summed in double, rounded to f32) then
 * y += t · b_eᵀ (a thread per (pair, output), summed in double), where
 * a_e = rows [e·r, e·r + r) of a[p] and b_e = rows [e·out, e·out + out) of
 * b[p] (the scale is already in b). */

/* g[a] = gate_e · x[a / k] and u[a] = up_e · x[a / k] for each pair a whose id e is an expert. */
__global__ void moe_lora_gate_up_kernel(float *g, float *u, const float *x, int64_t D, int64_t I, const int32_t *ids, int64_t k,
                                        int64_t E, const cu_wdesc *tab) {
  const int64_t a = blockIdx.x;
  const int32_t e = ids[a];
  if (e < 0 || e >= E) return;
  const cu_wdesc gw = tab[e], uw = tab[E + e];
  const float *xt = x + (a / k) * D;
  for (int64_t i = threadIdx.x; i < I; i += blockDim.x) {
    g[a * I + i] = row_dot(gw, i, xt);
    u[a * I + i] = row_dot(uw, i, xt);
  }
}

/* g[a] = act(g[a]) * u[a] for each of the n_pairs pairs whose id is an expert. */
__global__ void moe_lora_act_kernel(float *g, const float *u, int64_t I, const int32_t *ids, int64_t E, int64_t n_pairs, int act) {
  GRID_LOOP(i, n_pairs * I) {
    const int32_t e = ids[i / I];
    if (e >= 0 && e < E) g[i] = act_apply(act, g[i]) * u[i];
  }
}

/* out[a] = down_e · h[a] for each pair a whose id e is an expert. */
__global__ void moe_lora_down_kernel(float *out, const float *h, int64_t I, int64_t D, const int32_t *ids, int64_t E,
                                     const cu_wdesc *tab) {
  const int64_t a = blockIdx.x;
  const int32_t e = ids[a];
  if (e < 0 || e >= E) return;
  const cu_wdesc dw = tab[2 * E + e];
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) out[a * D + d] = row_dot(dw, d, h + a * I);
}

/* t[a, j] = x[a / div] · A[e·r + j] (rows of `in` floats) for j < r and each of the n_pairs pairs
 * a whose id e is an expert: the double sum in input order, rounded to f32 (op_lora). */
__global__ void expert_lora_t_kernel(float *t, const float *x, int64_t div, int64_t in, const int32_t *ids, int64_t E,
                                     const float *A, int64_t r, int64_t n_pairs) {
  GRID_LOOP(i, n_pairs * r) {
    const int64_t a = i / r, j = i % r;
    const int32_t e = ids[a];
    if (e < 0 || e >= E) continue;
    const float *xa = x + (a / div) * in, *aj = A + ((int64_t)e * r + j) * in;
    double s = 0.0;
    for (int64_t q = 0; q < in; q++) s += (double)xa[q] * (double)aj[q];
    t[i] = (float)s;
  }
}

/* y[a, o] += t[a] · B[e·out + o] (rows of r floats) for o < out and each of the n_pairs pairs a
 * whose id e is an expert: the double sum in rank order, rounded to f32 and added (op_lora). */
__global__ void expert_lora_y_kernel(float *y, const float *t, const int32_t *ids, int64_t E, const float *B, int64_t r,
                                     int64_t out, int64_t n_pairs) {
  GRID_LOOP(i, n_pairs * out) {
    const int64_t a = i / out, o = i % out;
    const int32_t e = ids[a];
    if (e < 0 || e >= E) continue;
    const float *ta = t + a * r, *bo = B + ((int64_t)e * out + o) * r;
    double s = 0.0;
    for (int64_t j = 0; j < r; j++) s += (double)ta[j] * (double)bo[j];
    y[i] += (float)s;
  }
}

/* y[a] (out floats per pair) += every adapter's delta of projection p on the pairs' inputs
 * x[a / div] (in floats each), adapters in order (cpu/moe.c's expert_lora); t: scratch of
 * n_pairs times the largest rank. */
static void expert_lora_add(cu_backend *b, const bk_experts *ex, int p, float *y, const float *x, int64_t div, int64_t in,
                            int64_t out, const int32_t *ids, int64_t n_pairs, float *t) {
  for (int i = 0; i < ex->n_lora; i++) {
    const bk_expert_lora *l = ex->lora[i];
    if (!l || !l->r) continue;
    expert_lora_t_kernel<<<grid_for(n_pairs * l->r, 128), 128, 0, b->stream>>>(t, x, div, in, ids, ex->n, cu_f(&l->a[p]), l->r,
                                                                              n_pairs);
    expert_lora_y_kernel<<<grid_for(n_pairs * out, 256), 256, 0, b->stream>>>(y, t, ids, ex->n, cu_f(&l->b[p]), l->r, out,
                                                                             n_pairs);
  }
}

static void moe_lora(cu_backend *b, const bk_tensor *y, const bk_tensor *x, const bk_tensor *ids, const bk_tensor *w,
                     const bk_experts *ex, bk_act act) {
  const int64_t T = x->rows, D = x->cols, k = ids->cols, I = ex->gate[0].rows, E = ex->n;
  const int64_t in[3] = {D, D, I}, outd[3] = {I, I, D};
  int64_t R = 1; /* the largest rank */
  for (int i = 0; i < ex->n_lora; i++) {
    const bk_expert_lora *l = ex->lora[i];
    if (!l || !l->r) continue;
    for (int p = 0; p < 3; p++)
      if (l->r < 0 || l->a[p].dt != BK_DT_F32 || l->b[p].dt != BK_DT_F32 || l->a[p].rows != E * l->r || l->a[p].cols != in[p] ||
          l->b[p].rows != E * outd[p] || l->b[p].cols != l->r) {
        cu_fail(b, HEARTH_EINTERNAL,
                "cuda moe: adapter %d, projection %d: a [%lld, %lld] and b [%lld, %lld] are not %lld experts' rank-%lld "
                "deltas of [%lld, %lld]",
                i, p, (long long)l->a[p].rows, (long long)l->a[p].cols, (long long)l->b[p].rows, (long long)l->b[p].cols,
                (long long)E, (long long)l->r, (long long)outd[p], (long long)in[p]);
        return;
      }
    if (l->r > R) R = l->r;
  }
  const cu_wdesc *tab = moe_table(b, ex);
  if (!tab) return;
  /* scratch per token: k pairs of gate and up [I], down's output [D] and t [R] floats */
  const size_t per_token = (size_t)k * (size_t)(2 * I + D + R) * sizeof(float);
  int64_t chunk = (int64_t)(CU_SCRATCH_CAP / per_token);
  if (chunk < 1) {
    cu_fail(b, HEARTH_ELIMIT, "cuda moe: one token's %lld experts of %lld x %lld with their deltas exceed the scratch",
            (long long)k, (long long)I, (long long)D);
    return;
  }
  if (chunk > T) chunk = T;
  float *g = (float *)cu_scratch(b, (size_t)chunk * per_token);
  if (!g) return;
  float *u = g + chunk * k * I, *out = u + chunk * k * I, *t = out + chunk * k * D;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = T - t0 < chunk ? T - t0 : chunk, P = n * k;
    const int32_t *id = cu_i(ids) + t0 * k;
    const float *xs = cu_f(x) + t0 * D;
    moe_lora_gate_up_kernel<<<(unsigned)P, 128, 0, b->stream>>>(g, u, xs, D, I, id, k, E, tab);
    expert_lora_add(b, ex, 0, g, xs, k, D, I, id, P, t);
    expert_lora_add(b, ex, 1, u, xs, k, D, I, id, P, t);
    moe_lora_act_kernel<<<grid_for(P * I, 256), 256, 0, b->stream>>>(g, u, I, id, E, P, (int)act);
    moe_lora_down_kernel<<<(unsigned)P, 128, 0, b->stream>>>(out, g, I, D, id, E, tab);
    expert_lora_add(b, ex, 2, out, g, 1, I, D, id, P, t);
    moe_sum_kernel<<<grid_for(n * D, 256), 256, 0, b->stream>>>(cu_fw(y) + t0 * D, out, cu_f(w) + t0 * k, id, E, n, k, D);
    if (cu_check(b, "moe (lora)")) return;
  }
}

#define MOE_DISPATCH(type, call)                         \
  switch (type) {                                        \
    case BK_F32: call(BK_F32); break;                    \
    case BK_F16: call(BK_F16); break;                    \
    case BK_BF16: call(BK_BF16); break;                  \
    case BK_Q8_0: call(BK_Q8_0); break;                  \
    case BK_Q4_0: call(BK_Q4_0); break;                  \
    case BK_Q4_K: call(BK_Q4_K); break;                  \
    case BK_Q5_K: call(BK_Q5_K); break;                  \
    case BK_Q6_K: call(BK_Q6_K); break;                  \
    case BK_Q5_0: call(BK_Q5_0); break;              \
    case BK_Q5_1: call(BK_Q5_1); break;              \
    case BK_Q2_K: call(BK_Q2_K); break;              \
    case BK_Q3_K: call(BK_Q3_K); break;              \
    case BK_IQ4_NL: call(BK_IQ4_NL); break;          \
    case BK_IQ4_XS: call(BK_IQ4_XS); break;          \
    case BK_MLX_AFFINE: call(BK_MLX_AFFINE); break;      \
    case BK_FP8: call(BK_FP8); break;                    \
    default: break;                                      \
  }

void cu_moe(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *ids, const bk_tensor *w,
            const bk_experts *ex, bk_act act) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  const int64_t T = x->rows, D = x->cols, k = ids->cols;
  const int64_t I = ex->n > 0 ? ex->gate[0].rows : 0, E = ex->n;
  if (y->rows != T || y->cols != D || ids->rows != T || w->rows != T || w->cols != k || ex->n <= 0 ||
      ex->gate[0].cols != D || ex->down[0].rows != D || ex->down[0].cols != I) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda moe: x [%lld, %lld], y [%lld, %lld], ids [%lld, %lld], %lld experts",
            (long long)T, (long long)D, (long long)y->rows, (long long)y->cols, (long long)ids->rows, (long long)k,
            (long long)ex->n);
    return;
  }
  if (T <= 0) return;
  cudaSetDevice(b->device);
  if (ex->n_lora > 0 && ex->lora) {
    moe_lora(b, y, x, ids, w, ex, act);
    return;
  }
  if (!moe_uniform(ex) || E > 2048 || (uintptr_t)cu_f(x) % 16) {
    moe_per_expert(b, y, x, ids, w, ex, act);
    cu_check(b, "moe");
    return;
  }
  const cu_wdesc *tab = moe_table(b, ex);
  if (!tab) return;
  /* scratch per token: k pairs of h [I] and out [D] floats, k pair indices; once: start, tile0 [E + 1] */
  const size_t per_token = (size_t)k * ((size_t)(I + D) * sizeof(float) + sizeof(int32_t));
  const size_t fixed = 2 * (size_t)(E + 1) * sizeof(int32_t) + 1024;
  int64_t chunk = (int64_t)((CU_SCRATCH_CAP - fixed) / per_token);
  if (chunk < 1) {
    cu_fail(b, HEARTH_ELIMIT, "cuda moe: one token's %lld experts of %lld x %lld exceed the scratch", (long long)k,
            (long long)I, (long long)D);
    return;
  }
  if (chunk > T) chunk = T;
  char *sc = (char *)cu_scratch(b, (size_t)chunk * per_token + fixed);
  if (!sc) return;
  float *h = (float *)sc, *out = h + chunk * k * I;
  int32_t *start = (int32_t *)(out + chunk * k * D), *tile0 = start + E + 1, *pair = tile0 + E + 1;
  const int32_t *id = cu_i(ids);
  const int gt = ex->gate[0].type, dt = ex->down[0].type;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = T - t0 < chunk ? T - t0 : chunk, TK = n * k;
    const bool gemv = n <= MOE_GEMV_MAX_T;
    const int64_t tiles = (TK + GM - 1) / GM + E; /* an upper bound of sum over e of ceil(count_e / GM) */
    if (!gemv) {
      moe_group_kernel<<<1, 1024, 3 * (size_t)E * sizeof(int32_t), b->stream>>>(id + t0 * k, TK, E, start, tile0, pair);
      if (cu_check(b, "moe (grouping)")) return;
    }
#define UP_CALL(TY) \
  launch_up<TY>(b, gemv, tab, E, id + t0 * k, k, cu_f(x) + t0 * D, n, D, I, h, (int)act, start, tile0, pair, tiles)
#define DOWN_CALL(TY) launch_down<TY>(b, gemv, tab, E, id + t0 * k, k, h, n, I, D, out, start, tile0, pair, tiles)
    MOE_DISPATCH(gt, UP_CALL)
    if (cu_check(b, "moe (gate, up)")) return;
    MOE_DISPATCH(dt, DOWN_CALL)
    if (cu_check(b, "moe (down)")) return;
#undef UP_CALL
#undef DOWN_CALL
    moe_sum_kernel<<<grid_for(n * D, 256), 256, 0, b->stream>>>(cu_fw(y) + t0 * D, out, cu_f(w) + t0 * k, id + t0 * k,
                                                                  E, n, k, D);
  }
  cu_check(b, "moe");
}
