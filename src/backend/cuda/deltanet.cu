/* deltanet.cu — the recurrent ops of linear-attention layers on the GPU:
 * the causal depthwise conv1d with its rolling state, the gated delta rule,
 * and sigmoid_mul. Semantics are cpu/ref.c's (ops.h); the per-sequence
 * table (t0, n, slot, fresh) is read on the device.
 *
 * conv1d: for decode steps (one token per sequence) one thread per
 * (sequence, channel), with the last k - 1 inputs in registers; for steps
 * with longer runs one thread per (channel, CONV_RUN tokens) computing
 * outputs straight from the inputs, then one per (sequence, channel)
 * writing the new state once every output has read the old one.
 * delta_rule: one block per (sequence, value head, 32 value columns); four
 * adjacent threads share one column of the head's state (each holds every
 * fourth of its dk rows in registers) and walk the sequence's tokens: each
 * token's q and k go through shared memory, and a column's update and
 * output need only that column (Sᵀk and Sᵀq are per-column sums, finished
 * by two shuffles among its four threads). This token-by-token form runs
 * decode and short runs (speculative drafts).
 * delta_chunk: the chunked form for a sequence's longer runs (prefill), the
 * same algebra as cpu/deltanet.c: one block per (sequence, value head, 32
 * value columns) walks the run in chunks of DCH_L tokens; per chunk the
 * pairwise products K Kᵀ and Q Kᵀ with their decays, S0ᵀk and S0ᵀq, the
 * updates by forward substitution (one warp, a lane per column), the outputs
 * and the state at the chunk's end are each a block-wide step through shared
 * memory. A step launches both kernels, each skipping the sequences the
 * other takes, when some sequence has more than one token. */
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

#define CONV_RUN 32

/* Input q of a sequence's run (q < 0: the state's last -q-th input, or 0 when fresh). */
__device__ static float conv_in(const float *__restrict__ x, int64_t c, int64_t ch, const float *st, int k, int64_t t0,
                                int64_t q, int fresh) {
  if (q >= 0) return x[(t0 + q) * c + ch];
  return fresh ? 0.0f : st[(int64_t)(k - 1 + q) * c + ch];
}

__global__ void conv1d_run_kernel(float *y, const float *__restrict__ x, int64_t c, const float *__restrict__ w, int k,
                                  const float *state, int64_t stride, int64_t off, const int32_t *__restrict__ seqs, int64_t S,
                                  int64_t T, int silu) {
  __shared__ int owner[CONV_RUN];
  const int64_t g0 = (int64_t)blockIdx.y * CONV_RUN;
  if (threadIdx.x < CONV_RUN) { /* which sequence holds each of this block's tokens (-1: none) */
    const int64_t g = g0 + threadIdx.x;
    int o = -1;
    for (int64_t s = 0; s < S && g < T; s++)
      if (g >= seqs[4 * s] && g < (int64_t)seqs[4 * s] + seqs[4 * s + 1]) { o = (int)s; break; }
    owner[threadIdx.x] = o;
  }
  __syncthreads();
  const int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  for (int i = 0; i < CONV_RUN; i++) {
    const int sidx = owner[i];
    if (sidx < 0) continue;
    const int32_t *sq = seqs + 4 * (int64_t)sidx;
    const int64_t t0 = sq[0], p = g0 + i - t0;
    const float *st = state + (int64_t)sq[2] * stride + off;
    double acc = 0;
    for (int j = 0; j < k; j++) acc += (double)w[ch * k + j] * conv_in(x, c, ch, st, k, t0, p - (k - 1) + j, sq[3]);
    y[(g0 + i) * c + ch] = (float)(silu ? acc / (1.0 + exp(-acc)) : acc);
  }
}

__global__ void conv1d_state_kernel(const float *__restrict__ x, int64_t c, int k, float *state, int64_t stride, int64_t off,
                                    const int32_t *__restrict__ seqs) {
  const int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (ch >= c) return;
  const int32_t *sq = seqs + 4 * (int64_t)blockIdx.y;
  const int64_t t0 = sq[0], n = sq[1];
  float *st = state + (int64_t)sq[2] * stride + off;
  float win[CONV_MAX_K];
#pragma unroll
  for (int j = 0; j < CONV_MAX_K - 1; j++)
    if (j < k - 1) win[j] = conv_in(x, c, ch, st, k, t0, n - (k - 1) + j, sq[3]);
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
  if (x->rows > r->seqs->rows) { /* some sequence has a run of tokens */
    conv1d_run_kernel<<<dim3(cu_blocks(c, CONV_THREADS), cu_blocks(x->rows, CONV_RUN)), CONV_THREADS, 0, b->stream>>>(
        cu_fw(y), cu_f(x), c, cu_f(w), (int)k, cu_f(r->state), r->state->cols, r->off, cu_i(r->seqs), r->seqs->rows, x->rows,
        silu ? 1 : 0);
    conv1d_state_kernel<<<dim3(cu_blocks(c, CONV_THREADS), (unsigned)r->seqs->rows), CONV_THREADS, 0, b->stream>>>(
        cu_f(x), c, (int)k, cu_fw(r->state), r->state->cols, r->off, cu_i(r->seqs));
    cu_check(b, "conv1d");
    return;
  }
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
                 const int32_t *__restrict__ seqs, int nk, int nv, int dk, int dv, int64_t long_run) {
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
  if (n >= long_run) return; /* delta_chunk_kernel's */
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

/* The chunked kernel takes runs of at least DCH_MIN tokens. */
#define DCH_MIN 16
#define DCH_COLS 32
#define DCH_THREADS 256
#define DCH_WARPS (DCH_THREADS / 32)

/* Shared floats for chunks of L tokens and dk key dims: Q, K [L][dk + 1];
 * KK, QK [L][L + 1]; S [dk][32]; U, WK, WQ [L][32]; cum, beta, dec [L]. */
static size_t dch_smem(int L, int dk) {
  return sizeof(float) * ((size_t)2 * L * (dk + 1) + (size_t)2 * L * (L + 1) + (size_t)dk * DCH_COLS + (size_t)3 * L * DCH_COLS + 3 * (size_t)L);
}

template <int L>
__global__ void __launch_bounds__(DCH_THREADS)
    delta_chunk_kernel(float *o, const float *__restrict__ qkv, const float *__restrict__ a, const float *__restrict__ bb,
                       const float *__restrict__ a_log, const float *__restrict__ dt_bias, float *state, int64_t stride,
                       int64_t off, const int32_t *__restrict__ seqs, int nk, int nv, int dk, int dv) {
  const int32_t *sq = seqs + 4 * (int64_t)blockIdx.x;
  const int64_t t0 = sq[0], n = sq[1], slot = sq[2];
  const int fresh = sq[3];
  if (n < DCH_MIN) return; /* delta_kernel's */
  extern __shared__ float sh[];
  const int dkp = dk + 1;
  float *Qs = sh, *Ks = Qs + L * dkp, *KK = Ks + L * dkp, *QK = KK + L * (L + 1), *Ss = QK + L * (L + 1);
  float *Us = Ss + dk * DCH_COLS, *WK = Us + L * DCH_COLS, *WQ = WK + L * DCH_COLS;
  float *cum = WQ + L * DCH_COLS, *beta = cum + L, *dec = beta + L;
  const int h = blockIdx.y, kh = h / (nv / nk), j0 = blockIdx.z * DCH_COLS;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const bool own = j0 + lane < dv;
  const int64_t W = 2 * (int64_t)nk * dk + (int64_t)nv * dv;
  float *S = state + slot * stride + off + (int64_t)h * dk * dv;
  for (int i = warp; i < dk; i += DCH_WARPS) Ss[i * DCH_COLS + lane] = own && !fresh ? S[(int64_t)i * dv + j0 + lane] : 0.0f;
  const float A = -expf(a_log[h]), dtb = dt_bias[h], rdk = rsqrtf((float)dk);
  for (int64_t c0 = 0; c0 < n; c0 += L) {
    const int Lc = (int)(n - c0 < L ? n - c0 : L);
    __syncthreads(); /* the previous chunk is done with Q, K, U */
    /* q and k of the chunk's tokens, l2-normalised (q also by 1/sqrt(dk)): a warp per token */
    for (int t = warp; t < Lc; t += DCH_WARPS) {
      const float *row = qkv + (t0 + c0 + t) * W;
      float q2 = 0, k2 = 0;
      for (int d = lane; d < dk; d += 32) {
        const float q = row[(int64_t)kh * dk + d], k = row[(int64_t)nk * dk + (int64_t)kh * dk + d];
        Qs[t * dkp + d] = q, Ks[t * dkp + d] = k;
        q2 += q * q, k2 += k * k;
      }
#pragma unroll
      for (int w = 16; w > 0; w >>= 1) q2 += __shfl_xor_sync(0xffffffffu, q2, w), k2 += __shfl_xor_sync(0xffffffffu, k2, w);
      const float qn = rsqrtf(q2 + 1e-6f) * rdk, kn = rsqrtf(k2 + 1e-6f);
      for (int d = lane; d < dk; d += 32) Qs[t * dkp + d] *= qn, Ks[t * dkp + d] *= kn;
    }
    if (warp == 0) { /* the running log decay (a warp-wide scan) and beta */
      for (int base = 0; base < Lc; base += 32) {
        const int t = base + lane;
        const int64_t tok = t0 + c0 + t;
        float g = t < Lc ? A * softplus_f(a[tok * nv + h] + dtb) : 0.0f;
#pragma unroll
        for (int w = 1; w < 32; w <<= 1) {
          const float v = __shfl_up_sync(0xffffffffu, g, w);
          if (lane >= w) g += v;
        }
        if (base) g += cum[base - 1];
        if (t < Lc) cum[t] = g, beta[t] = 1.0f / (1.0f + expf(-bb[tok * nv + h]));
        __syncwarp();
      }
    }
    __syncthreads();
    /* KK[t][s] = beta_t e^(c_t - c_s) k_t·k_s (s < t) and QK[t][s] = e^(c_t - c_s) q_t·k_s (s <= t) */
    for (int e = tid; e < Lc * Lc; e += DCH_THREADS) {
      const int t = e / Lc, s = e % Lc;
      if (s > t) continue;
      float kk = 0, qk = 0;
      const float *kt = Ks + t * dkp, *ks = Ks + s * dkp, *qt = Qs + t * dkp;
      for (int d = 0; d < dk; d++) kk += kt[d] * ks[d], qk += qt[d] * ks[d];
      const float dcy = expf(cum[t] - cum[s]);
      KK[t * (L + 1) + s] = beta[t] * dcy * kk;
      QK[t * (L + 1) + s] = dcy * qk;
    }
    /* S0ᵀk_t and S0ᵀq_t for this block's columns: a warp per token, a lane per column */
    for (int t = warp; t < Lc; t += DCH_WARPS) {
      float wk = 0, wq = 0;
      for (int i = 0; i < dk; i++) {
        const float sv = Ss[i * DCH_COLS + lane];
        wk += Ks[t * dkp + i] * sv, wq += Qs[t * dkp + i] * sv;
      }
      WK[t * DCH_COLS + lane] = wk, WQ[t * DCH_COLS + lane] = wq;
    }
    __syncthreads();
    if (warp == 0) { /* the updates: u_t = beta_t (v_t - e^c_t S0ᵀk_t) - sum_{s<t} KK[t][s] u_s */
      for (int t = 0; t < Lc; t++) {
        const float v = own ? qkv[(t0 + c0 + t) * W + 2 * (int64_t)nk * dk + (int64_t)h * dv + j0 + lane] : 0.0f;
        float u = beta[t] * (v - expf(cum[t]) * WK[t * DCH_COLS + lane]);
        const float *kr = KK + t * (L + 1);
        for (int s = 0; s < t; s++) u -= kr[s] * Us[s * DCH_COLS + lane];
        Us[t * DCH_COLS + lane] = u;
      }
    }
    __syncthreads();
    /* outputs: o_t = e^c_t S0ᵀq_t + sum_{s<=t} QK[t][s] u_s */
    for (int t = warp; t < Lc; t += DCH_WARPS) {
      float acc = expf(cum[t]) * WQ[t * DCH_COLS + lane];
      const float *qr = QK + t * (L + 1);
      for (int s = 0; s <= t; s++) acc += qr[s] * Us[s * DCH_COLS + lane];
      if (own) o[(t0 + c0 + t) * nv * dv + (int64_t)h * dv + j0 + lane] = acc;
    }
    if (tid < Lc) dec[tid] = expf(cum[Lc - 1] - cum[tid]);
    __syncthreads();
    /* the state at the chunk's end: e^c_L S0 + sum_s e^(c_L - c_s) k_s u_sᵀ */
    const float eL = expf(cum[Lc - 1]);
    for (int i = warp; i < dk; i += DCH_WARPS) {
      float acc = eL * Ss[i * DCH_COLS + lane];
      for (int s = 0; s < Lc; s++) acc += dec[s] * Ks[s * dkp + i] * Us[s * DCH_COLS + lane];
      Ss[i * DCH_COLS + lane] = acc;
    }
  }
  __syncthreads();
  if (own)
    for (int i = warp; i < dk; i += DCH_WARPS) S[(int64_t)i * dv + j0 + lane] = Ss[i * DCH_COLS + lane];
}

/* HEARTH_CUDA_DELTA_CHUNK=0 runs every run token by token (for comparison). */
static bool dch_on = true;

cudaError_t cu_deltanet_init(void) {
  const char *env = getenv("HEARTH_CUDA_DELTA_CHUNK");
  dch_on = !(env && env[0] == '0');
  cudaError_t e = cudaFuncSetAttribute(delta_chunk_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dch_smem(64, 128));
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(delta_chunk_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dch_smem(32, 256));
  return e;
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
  /* Only a step with more rows than sequences can hold a long run: then the
   * chunked kernel takes the runs of DCH_MIN tokens or more. */
  const bool chunked = dch_on && qkv->rows > r->seqs->rows;
  const int64_t long_run = chunked ? DCH_MIN : INT64_MAX;
  if (chunked) {
    dim3 cgrid((unsigned)r->seqs->rows, (unsigned)nv, cu_blocks(dv, DCH_COLS));
    if (dk <= 128)
      delta_chunk_kernel<64><<<cgrid, DCH_THREADS, dch_smem(64, (int)dk), b->stream>>>(
          cu_fw(o), cu_f(qkv), cu_f(a), cu_f(b_), cu_f(a_log), cu_f(dt_bias), cu_fw(r->state), r->state->cols, r->off,
          cu_i(r->seqs), (int)nk, (int)nv, (int)dk, (int)dv);
    else
      delta_chunk_kernel<32><<<cgrid, DCH_THREADS, dch_smem(32, (int)dk), b->stream>>>(
          cu_fw(o), cu_f(qkv), cu_f(a), cu_f(b_), cu_f(a_log), cu_f(dt_bias), cu_fw(r->state), r->state->cols, r->off,
          cu_i(r->seqs), (int)nk, (int)nv, (int)dk, (int)dv);
    cu_check(b, "delta_rule chunked");
  }
  dim3 grid((unsigned)r->seqs->rows, (unsigned)nv, cu_blocks(dv, DELTA_COLS));
  size_t shm = sizeof(float) * 2 * (size_t)dk;
#define DELTA_LAUNCH(K)                                                                                                  \
  delta_kernel<K><<<grid, DELTA_THREADS, shm, b->stream>>>(cu_fw(o), cu_f(qkv), cu_f(a), cu_f(b_), cu_f(a_log),         \
                                                           cu_f(dt_bias), cu_fw(r->state), r->state->cols, r->off,      \
                                                           cu_i(r->seqs), (int)nk, (int)nv, (int)dk, (int)dv, long_run)
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
