/* deltanet.cu — the recurrent ops of linear-attention layers on the GPU:
 * the causal depthwise conv1d with its rolling state, the gated delta rule,
 * and sigmoid_mul. Semantics are cpu/ref.c's (ops.h); the per-sequence
 * table (t0, n, slot, fresh) is read on the device.
 *
 * conv1d: one thread per (sequence, channel), walking the sequence's tokens
 * with the last k - 1 inputs in registers.
 * delta_rule: one block per (sequence, value head, 32 value columns); four
 * adjacent threads share one column of the head's state (each holds every
 * fourth of its dk rows in registers) and walk the sequence's tokens: each
 * token's q and k go through shared memory, and a column's update and
 * output need only that column (Sᵀk and Sᵀq are per-column sums, finished
 * by two shuffles among its four threads). This is the token-by-token form
 * for decode and prefill alike; the sequential walk over a long prompt is
 * this kernel's cost. */
#include "backend/cuda/cuda_common.cuh"

#define CONV_MAX_K 16
#define CONV_THREADS 128

__global__ void conv1d_kernel(float *y, const float *__restrict__ x, int64_t c, const float *__restrict__ w, int k, float *state,
                              int64_t stride, int64_t off, const int32_t *__restrict__ seqs, int silu) {
  const int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  const int32_t *sq = seqs + 4 * (int64_t)blockIdx.y;
  const int64_t t0 = sq[0], n = sq[1], slot = sq[2];
  const int fresh = sq[3];
  float *st = state + slot * stride + off;
  float win[CONV_MAX_K], wk[CONV_MAX_K];
#pragma unroll
  for (int j = 0; j < CONV_MAX_K; j++) {
    wk[j] = j < k ? w[ch * k + j] : 0.0f;
    win[j] = j < k - 1 && !fresh ? st[(int64_t)j * c + ch] : 0.0f;
  }
  for (int64_t i = 0; i < n; i++) {
    const float in = x[(t0 + i) * c + ch];
    double acc = (double)wk[k - 1] * in;
#pragma unroll
    for (int j = 0; j < CONV_MAX_K - 1; j++)
      if (j < k - 1) acc += (double)wk[j] * win[j];
#pragma unroll
    for (int j = 0; j < CONV_MAX_K - 2; j++)
      if (j < k - 2) win[j] = win[j + 1];
#pragma unroll
    for (int j = 0; j < CONV_MAX_K - 1; j++)
      if (j == k - 2) win[j] = in;
    y[(t0 + i) * c + ch] = (float)(silu ? acc / (1.0 + exp(-acc)) : acc);
  }
#pragma unroll
  for (int j = 0; j < CONV_MAX_K - 1; j++)
    if (j < k - 1) st[(int64_t)j * c + ch] = win[j];
}

void cu_conv1d(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, const bk_recurrent *r, bool silu) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  int64_t c = x->cols, k = w->cols;
  if (y->rows != x->rows || y->cols != c || w->rows != c || k < 1 || k > CONV_MAX_K || r->off + (k - 1) * c > r->state->cols) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda conv1d: x [%lld, %lld], w [%lld, %lld] (at most %d taps), state row %lld", (long long)x->rows,
            (long long)c, (long long)w->rows, (long long)k, CONV_MAX_K, (long long)r->state->cols);
    return;
  }
  if (r->seqs->rows <= 0 || c <= 0) return;
  cudaSetDevice(b->device);
  dim3 grid(cu_blocks(c, CONV_THREADS), (unsigned)r->seqs->rows);
  conv1d_kernel<<<grid, CONV_THREADS, 0, b->stream>>>(cu_fw(y), cu_f(x), c, cu_f(w), (int)k, cu_fw(r->state), r->state->cols,
                                                       r->off, cu_i(r->seqs), silu ? 1 : 0);
  cu_check(b, "conv1d");
}

#define DELTA_LANES 4   /* threads sharing one state column, each with every 4th of its dk rows */
#define DELTA_COLS 32    /* columns per block: 128 threads */
#define DELTA_THREADS (DELTA_LANES * DELTA_COLS)

__device__ static float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* The sum of v over the DELTA_LANES consecutive lanes of a column (all lanes of the warp take part). */
__device__ static float lanes_sum(float v) {
#pragma unroll
  for (int o = 1; o < DELTA_LANES; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int MAXK>
__global__ void __launch_bounds__(DELTA_THREADS)
    delta_kernel(float *o, const float *__restrict__ qkv, const float *__restrict__ a, const float *__restrict__ bb,
                 const float *__restrict__ a_log, const float *__restrict__ dt_bias, float *state, int64_t stride, int64_t off,
                 const int32_t *__restrict__ seqs, int nk, int nv, int dk, int dv) {
  extern __shared__ float sh[]; /* q [dk], k [dk] of the current token */
  __shared__ float norms[2];
  float *qs = sh, *ks = sh + dk;
  constexpr int PER = MAXK / DELTA_LANES;
  const int h = blockIdx.y, kh = h / (nv / nk), lane = threadIdx.x % DELTA_LANES;
  const int j = blockIdx.z * DELTA_COLS + threadIdx.x / DELTA_LANES;
  const bool own = j < dv;
  const int32_t *sq = seqs + 4 * (int64_t)blockIdx.x;
  const int64_t t0 = sq[0], n = sq[1], slot = sq[2];
  const int fresh = sq[3];
  const int64_t W = 2 * (int64_t)nk * dk + (int64_t)nv * dv;
  float *S = state + slot * stride + off + (int64_t)h * dk * dv;
  float col[PER]; /* rows lane + DELTA_LANES * m of column j */
#pragma unroll
  for (int m = 0; m < PER; m++) {
    const int i = lane + DELTA_LANES * m;
    col[m] = own && i < dk && !fresh ? S[(int64_t)i * dv + j] : 0.0f;
  }
  const float A = -expf(a_log[h]), dtb = dt_bias[h], rdk = rsqrtf((float)dk);
  for (int64_t t = 0; t < n; t++) {
    const int64_t tok = t0 + t;
    const float *row = qkv + tok * W;
    __syncthreads(); /* the previous token's q, k and norms are read */
    for (int d = threadIdx.x; d < dk; d += blockDim.x) {
      qs[d] = row[(int64_t)kh * dk + d];
      ks[d] = row[(int64_t)nk * dk + (int64_t)kh * dk + d];
    }
    __syncthreads();
    if (threadIdx.x < 32) { /* the first warp: both squared norms */
      float q2 = 0, k2 = 0;
      for (int d = threadIdx.x; d < dk; d += 32) q2 += qs[d] * qs[d], k2 += ks[d] * ks[d];
#pragma unroll
      for (int w = 16; w > 0; w >>= 1) q2 += __shfl_xor_sync(0xffffffffu, q2, w), k2 += __shfl_xor_sync(0xffffffffu, k2, w);
      if (threadIdx.x == 0) norms[0] = rsqrtf(q2 + 1e-6f) * rdk, norms[1] = rsqrtf(k2 + 1e-6f);
    }
    __syncthreads();
    const float qn = norms[0], kn = norms[1];
    const float decay = expf(A * softplus_f(a[tok * nv + h] + dtb));
    const float beta = 1.0f / (1.0f + expf(-bb[tok * nv + h]));
    float mem = 0;
#pragma unroll
    for (int m = 0; m < PER; m++) {
      const int i = lane + DELTA_LANES * m;
      if (i < dk) {
        col[m] *= decay;
        mem += col[m] * ks[i];
      }
    }
    mem = lanes_sum(mem);
    const float v = own ? row[2 * (int64_t)nk * dk + (int64_t)h * dv + j] : 0.0f;
    const float u = beta * (v - mem * kn), ku = kn * u;
    float acc = 0;
#pragma unroll
    for (int m = 0; m < PER; m++) {
      const int i = lane + DELTA_LANES * m;
      if (i < dk) {
        col[m] += ks[i] * ku;
        acc += col[m] * qs[i];
      }
    }
    acc = lanes_sum(acc);
    if (own && lane == 0) o[tok * nv * dv + (int64_t)h * dv + j] = acc * qn;
  }
  if (own)
#pragma unroll
    for (int m = 0; m < PER; m++) {
      const int i = lane + DELTA_LANES * m;
      if (i < dk) S[(int64_t)i * dv + j] = col[m];
    }
}

void cu_delta_rule(bk_backend *be, const bk_tensor *o, const bk_tensor *qkv, const bk_tensor *a, const bk_tensor *b_,
                   const bk_tensor *a_log, const bk_tensor *dt_bias, const bk_recurrent *r, const delta_params *p) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  int64_t nk = p->n_k_heads, nv = p->n_v_heads, dk = p->dk, dv = p->dv;
  if (nk <= 0 || nv % nk || dk <= 0 || dk > 256 || dv <= 0 || qkv->cols != 2 * nk * dk + nv * dv || o->cols != nv * dv ||
      o->rows != qkv->rows || a->cols != nv || b_->cols != nv || r->off + nv * dk * dv > r->state->cols) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda delta_rule: %lld key heads, %lld value heads, dk %lld (at most 256), dv %lld do not fit "
            "qkv [%lld, %lld] / state row %lld", (long long)nk, (long long)nv, (long long)dk, (long long)dv,
            (long long)qkv->rows, (long long)qkv->cols, (long long)r->state->cols);
    return;
  }
  if (r->seqs->rows <= 0) return;
  cudaSetDevice(b->device);
  dim3 grid((unsigned)r->seqs->rows, (unsigned)nv, cu_blocks(dv, DELTA_COLS));
  size_t shm = sizeof(float) * 2 * (size_t)dk;
#define DELTA_LAUNCH(K)                                                                                                  \
  delta_kernel<K><<<grid, DELTA_THREADS, shm, b->stream>>>(cu_fw(o), cu_f(qkv), cu_f(a), cu_f(b_), cu_f(a_log),         \
                                                           cu_f(dt_bias), cu_fw(r->state), r->state->cols, r->off,      \
                                                           cu_i(r->seqs), (int)nk, (int)nv, (int)dk, (int)dv)
  if (dk <= 32) DELTA_LAUNCH(32);
  else if (dk <= 64) DELTA_LAUNCH(64);
  else if (dk <= 128) DELTA_LAUNCH(128);
  else DELTA_LAUNCH(256);
#undef DELTA_LAUNCH
  cu_check(b, "delta_rule");
}

__global__ void sigmoid_mul_kernel(float *y, const float *__restrict__ g, int64_t n, int64_t d, int64_t gd) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * d; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / d, c = i % d;
    const float gv = g[r * gd + (gd == 1 ? 0 : c)];
    y[i] = y[i] / (1.0f + expf(-gv));
  }
}

void cu_sigmoid_mul(bk_backend *be, const bk_tensor *y, const bk_tensor *g) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  if (g->rows != y->rows || (g->cols != y->cols && g->cols != 1)) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda sigmoid_mul: y [%lld, %lld], g [%lld, %lld]", (long long)y->rows, (long long)y->cols,
            (long long)g->rows, (long long)g->cols);
    return;
  }
  int64_t n = bk_nelem(y);
  if (n <= 0) return;
  cudaSetDevice(b->device);
  int64_t blocks = (n + 255) / 256;
  if (blocks > (1 << 20)) blocks = 1 << 20;
  sigmoid_mul_kernel<<<(unsigned)blocks, 256, 0, b->stream>>>(cu_fw(y), cu_f(g), y->rows, y->cols, g->cols);
  cu_check(b, "sigmoid_mul");
}
