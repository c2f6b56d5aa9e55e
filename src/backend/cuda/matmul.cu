/* matmul.cu — y[n, rows] = x[n, cols] · Wᵀ (+ bias) for every stored
 * weight format, and embedding lookups (rows of a weight table).
 *
 * n <= CU_GEMV_MAX_N: a GEMV kernel per format that reads the weights in
 * their stored format once for all n activation rows (one warp per output
 * row, f32 accumulation); dense f32 / f16 / bf16 rows stream through
 * coalesced 16-byte loads, four in flight per lane (gemv_dense_kernel);
 * Q8_0, Q4_0 and Q4_K meet activations quantized to 8 bits per block of 32 in
 * integer dot products, as on the CPU (gemv_q8act; f32_activations keeps
 * the f32 kernel).
 * n > CU_GEMV_MAX_N (bf16, f16: n > CU_GEMV_MAX_N_BF16): f32 weights go straight
 * to cublasSgemm (no TF32); bf16 weights multiply a three-term bf16 split of
 * the activations (x = hi + mid + lo, each bf16, exact to about 2^-24 of x),
 * the three terms stacked as 3n activation rows of one cublasGemmEx (f32
 * compute and output), so the weights are read once, then summed per row
 * (the smallest term first): the product stays at f32 precision on tensor
 * cores — a prompt fed in chunks of any size gives the logits of one piece
 * up to f32 rounding, as on the CPU — and a decode batch of a few dozen
 * sequences costs one pass over the weights. f16 weights (n > 2) go to the
 * f16 tensor cores as stored (half_gemm): each activation row is scaled by
 * a power of two into f16's range and split into three f16 terms (one under
 * --gpu-precision fast), the products summed per element, smallest first,
 * then unscaled — f32 precision in the default mode, as the bf16 path.
 * Under --gpu-precision fast every quantized format is dequantized a chunk
 * of rows at a time into f16 scratch and takes the same path; in the
 * default mode it is dequantized to f32 for cublasSgemm. FP8 weights under
 * --gpu-precision fast (fast_matmul) meet activations quantized per row to
 * E4M3 (scale max|x| / 448) in one cuBLASLt FP8 GEMM with f32 accumulation,
 * the two scales applied after.
 * Row-major y = x Wᵀ is column-major yᵀ = W xᵀ for cuBLAS. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/quant_cuda.cuh"

#define CU_GEMV_MAX_N 8
/* bf16: the GEMV's cost grows with n (every weight piece meets n activation
 * rows from cache), the stacked GEMM reads the weights once at any n */
#define CU_GEMV_MAX_N_BF16 2
#define CU_GEMV_WARPS 8 /* output rows per block */

cu_wdesc cu_make_wdesc(const bk_weight *w) {
  cu_wdesc d;
  d.data = (const uint8_t *)w->data;
  d.scales = w->scales;
  d.biases = w->biases;
  d.rows = w->rows;
  d.cols = w->cols;
  d.row_bytes = (int64_t)cu_row_bytes(w->type, w->cols, w->bits);
  d.type = (int)w->type;
  d.bits = w->bits;
  d.group_size = w->group_size;
  d.scale_type = (int)w->scale_type;
  d.vec = (d.row_bytes % 16 == 0) && ((uintptr_t)w->data % 16 == 0);
  return d;
}

/* ---- GEMV: n <= 8 ---- */

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* The block's warps take 8 consecutive output rows; the columns go by in
 * slices of 32 sub-blocks (1024 columns), each slice of all n activation
 * rows staged in shared memory with one float of padding per 32 (lane l
 * reads sub-block l without bank conflicts), and each lane multiplies one
 * sub-block of its warp's row. */
#define GV_SUBS 32
#define GV_PAD 33

template <int T, int NR>
__global__ void __launch_bounds__(CU_GEMV_WARPS * 32)
    gemv_kernel(cu_wdesc w, const float *__restrict__ x, int64_t ldx, float *__restrict__ y, int64_t ldy,
                const float *__restrict__ bias) {
  __shared__ float xs[NR * GV_SUBS * GV_PAD];
  const int lane = threadIdx.x & 31;
  const int64_t row = (int64_t)blockIdx.x * CU_GEMV_WARPS + (threadIdx.x >> 5);
  const bool active = row < w.rows;
  float acc[NR];
#pragma unroll
  for (int r = 0; r < NR; r++) acc[r] = 0.0f;
  const int64_t nsub = w.cols / 32;
  for (int64_t s0 = 0; s0 < nsub; s0 += GV_SUBS) {
    const int ns = nsub - s0 < GV_SUBS ? (int)(nsub - s0) : GV_SUBS, span = ns * 32;
    __syncthreads(); /* the previous slice is consumed */
    for (int idx = threadIdx.x; idx < NR * span; idx += blockDim.x) {
      const int r = idx / span, i = idx % span;
      xs[r * GV_SUBS * GV_PAD + (i >> 5) * GV_PAD + (i & 31)] = x[r * ldx + 32 * s0 + i];
    }
    __syncthreads();
    if (active && lane < ns) {
      float v[32];
      cu_load_sub<T>(w, row, s0 + lane, v);
#pragma unroll
      for (int r = 0; r < NR; r++) {
        const float *xr = xs + r * GV_SUBS * GV_PAD + lane * GV_PAD;
        float a = 0.0f;
#pragma unroll
        for (int k = 0; k < 32; k++) a = fmaf(v[k], xr[k], a);
        acc[r] += a;
      }
    }
  }
  if (!active) return;
  if (cu_has_tail<T>()) {
    for (int64_t k = nsub * 32 + lane; k < w.cols; k += 32) {
      float e = cu_load_elem<T>(w, row, k);
#pragma unroll
      for (int r = 0; r < NR; r++) acc[r] = fmaf(e, x[r * ldx + k], acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < NR; r++) {
    float s = warp_sum(acc[r]);
    if (lane == 0) y[r * ldy + row] = s + (bias ? bias[row] : 0.0f);
  }
}


/* Dense rows (f32 / f16 / bf16, 16-byte aligned): the weights stream at
 * the bandwidth limit when every load is a coalesced 16-byte one and each
 * lane keeps several in flight. Four warps per block, one output row per
 * warp; lane l reads the 16-byte pieces l, l + 32, ... of the row, four
 * at a time, and multiplies them by the matching activations (read through
 * the read-only cache: they are the same for every row). */
#define GD_WARPS 4
#define GD_UNROLL 4

template <int T>
static __device__ __forceinline__ void gd_unpack(const uint4 q, float *v) {
  if (T == BK_F32) {
    v[0] = __uint_as_float(q.x), v[1] = __uint_as_float(q.y), v[2] = __uint_as_float(q.z), v[3] = __uint_as_float(q.w);
  } else {
    const uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
      if (T == BK_BF16) {
        v[2 * i] = __uint_as_float(u[i] << 16);
        v[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
      } else {
        v[2 * i] = cu_h2f((uint16_t)(u[i] & 0xffffu));
        v[2 * i + 1] = cu_h2f((uint16_t)(u[i] >> 16));
      }
    }
  }
}

template <int T, int NR, bool XVEC>
__global__ void __launch_bounds__(GD_WARPS * 32)
    gemv_dense_kernel(cu_wdesc w, const float *__restrict__ x, int64_t ldx, float *__restrict__ y, int64_t ldy,
                      const float *__restrict__ bias) {
  constexpr int E = T == BK_F32 ? 4 : 8; /* elements per 16-byte load */
  const int lane = threadIdx.x & 31;
  const int64_t row = (int64_t)blockIdx.x * GD_WARPS + (threadIdx.x >> 5);
  if (row >= w.rows) return;
  const uint4 *wr = (const uint4 *)(w.data + row * w.row_bytes);
  const int64_t nq = w.cols / E; /* 16-byte pieces in the row */
  float acc[NR];
#pragma unroll
  for (int r = 0; r < NR; r++) acc[r] = 0.0f;
  int64_t q = lane;
  for (; q + 32 * (GD_UNROLL - 1) < nq; q += 32 * GD_UNROLL) {
    uint4 raw[GD_UNROLL];
#pragma unroll
    for (int u = 0; u < GD_UNROLL; u++) raw[u] = __ldcs(wr + q + 32 * u);
#pragma unroll
    for (int u = 0; u < GD_UNROLL; u++) {
      float v[E];
      gd_unpack<T>(raw[u], v);
      const int64_t k = (q + 32 * u) * E;
#pragma unroll
      for (int r = 0; r < NR; r++) {
        const float *xr = x + r * ldx + k;
        if (XVEC) {
#pragma unroll
          for (int e = 0; e < E; e += 4) {
            const float4 xv = __ldg((const float4 *)(xr + e));
            acc[r] = fmaf(v[e], xv.x, acc[r]);
            acc[r] = fmaf(v[e + 1], xv.y, acc[r]);
            acc[r] = fmaf(v[e + 2], xv.z, acc[r]);
            acc[r] = fmaf(v[e + 3], xv.w, acc[r]);
          }
        } else {
#pragma unroll
          for (int e = 0; e < E; e++) acc[r] = fmaf(v[e], __ldg(xr + e), acc[r]);
        }
      }
    }
  }
  for (; q < nq; q += 32) {
    float v[E];
    gd_unpack<T>(__ldcs(wr + q), v);
    const int64_t k = q * E;
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
      for (int e = 0; e < E; e++) acc[r] = fmaf(v[e], __ldg(x + r * ldx + k + e), acc[r]);
  }
#pragma unroll
  for (int r = 0; r < NR; r++) {
    float sum = warp_sum(acc[r]);
    if (lane == 0) y[r * ldy + row] = sum + (bias ? bias[row] : 0.0f);
  }
}

/* Q4_K rows (16-byte aligned): a warp takes RW consecutive output rows and
 * walks their 144-byte blocks four at a time, eight lanes to a block: lane k
 * of the eight reads the block's 16-byte piece k of nibbles (bytes 16k ..
 * 16k + 15: elements 64 (k / 2) + 16 (k % 2) + i in the low nibbles, 32 more
 * in the high ones, sub-blocks k & ~1 and k | 1) with one 16-byte load per
 * row, and the 32 matching activations once for all RW rows, so a weight
 * byte meets its activations from registers, not from the cache each time.
 * Per sub-block the dot is d·sc·Σ x·q − dmin·m·Σ x. */
#define GQ_WARPS 4

template <int NR, int RW>
__global__ void __launch_bounds__(GQ_WARPS * 32)
    gemv_q4k_kernel(cu_wdesc w, const float *__restrict__ x, int64_t ldx, float *__restrict__ y, int64_t ldy,
                    const float *__restrict__ bias) {
  const int lane = threadIdx.x & 31, k = lane & 7;
  const int64_t row0 = ((int64_t)blockIdx.x * GQ_WARPS + (threadIdx.x >> 5)) * RW;
  if (row0 >= w.rows) return;
  const int64_t nb = w.cols / 256;
  const int c = k >> 1, half = k & 1;
  float acc[RW][NR];
#pragma unroll
  for (int q = 0; q < RW; q++)
#pragma unroll
    for (int r = 0; r < NR; r++) acc[q][r] = 0.0f;
  for (int64_t b = lane >> 3; b < nb; b += 4) {
    uint4 qv[RW];
#pragma unroll
    for (int q = 0; q < RW; q++) {
      const int64_t row = row0 + q < w.rows ? row0 + q : w.rows - 1;
      qv[q] = __ldcs((const uint4 *)(w.data + row * w.row_bytes + b * CU_Q4_K_BYTES + 16 + 16 * k));
    }
    /* activations: elements e0 + i (low nibbles) and e0 + 32 + i (high), i < 16 */
    const int64_t e0 = b * 256 + 64 * c + 16 * half;
    float slo[RW][NR], shi[RW][NR], xlo[NR], xhi[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) {
      xlo[r] = xhi[r] = 0.0f;
#pragma unroll
      for (int q = 0; q < RW; q++) slo[q][r] = shi[q][r] = 0.0f;
    }
#pragma unroll
    for (int i4 = 0; i4 < 4; i4++) {
#pragma unroll
      for (int r = 0; r < NR; r++) {
        const float4 a = __ldg((const float4 *)(x + r * ldx + e0) + i4);
        const float4 h = __ldg((const float4 *)(x + r * ldx + e0 + 32) + i4);
        xlo[r] += (a.x + a.y) + (a.z + a.w);
        xhi[r] += (h.x + h.y) + (h.z + h.w);
#pragma unroll
        for (int q = 0; q < RW; q++) {
          const uint32_t u = i4 == 0 ? qv[q].x : i4 == 1 ? qv[q].y : i4 == 2 ? qv[q].z : qv[q].w;
          slo[q][r] = fmaf(a.x, (float)(u & 15u), slo[q][r]);
          slo[q][r] = fmaf(a.y, (float)((u >> 8) & 15u), slo[q][r]);
          slo[q][r] = fmaf(a.z, (float)((u >> 16) & 15u), slo[q][r]);
          slo[q][r] = fmaf(a.w, (float)((u >> 24) & 15u), slo[q][r]);
          shi[q][r] = fmaf(h.x, (float)((u >> 4) & 15u), shi[q][r]);
          shi[q][r] = fmaf(h.y, (float)((u >> 12) & 15u), shi[q][r]);
          shi[q][r] = fmaf(h.z, (float)((u >> 20) & 15u), shi[q][r]);
          shi[q][r] = fmaf(h.w, (float)(u >> 28), shi[q][r]);
        }
      }
    }
#pragma unroll
    for (int q = 0; q < RW; q++) {
      const int64_t row = row0 + q < w.rows ? row0 + q : w.rows - 1;
      const uint8_t *hb = w.data + row * w.row_bytes + b * CU_Q4_K_BYTES;
      const float d = cu_h2f(cu_ld16(hb)), dmin = cu_h2f(cu_ld16(hb + 2));
      int sc0, m0, sc1, m1;
      cu_k_scale_min(hb + 4, 2 * c, &sc0, &m0);
      cu_k_scale_min(hb + 4, 2 * c + 1, &sc1, &m1);
      const float dl = d * (float)sc0, ml = dmin * (float)m0, dh = d * (float)sc1, mh = dmin * (float)m1;
#pragma unroll
      for (int r = 0; r < NR; r++) acc[q][r] += (dl * slo[q][r] - ml * xlo[r]) + (dh * shi[q][r] - mh * xhi[r]);
    }
  }
#pragma unroll
  for (int q = 0; q < RW; q++)
#pragma unroll
    for (int r = 0; r < NR; r++) {
      const float sum = warp_sum(acc[q][r]);
      if (lane == 0 && row0 + q < w.rows) y[r * ldy + row0 + q] = sum + (bias ? bias[row0 + q] : 0.0f);
    }
}

/* FP8 rows (16-byte aligned): like the Q4_K kernel, a warp takes RW rows and
 * lane l reads the 16-byte pieces l, l + 32, ... of each (16 weights a
 * load), converted two at a time through half; the 16 matching activations
 * are loaded once for the RW rows. The row's scale multiplies the sum. */
template <int NR, int RW>
__global__ void __launch_bounds__(GQ_WARPS * 32)
    gemv_fp8_kernel(cu_wdesc w, const float *__restrict__ x, int64_t ldx, float *__restrict__ y, int64_t ldy,
                    const float *__restrict__ bias) {
  const int lane = threadIdx.x & 31;
  const int64_t row0 = ((int64_t)blockIdx.x * GQ_WARPS + (threadIdx.x >> 5)) * RW;
  if (row0 >= w.rows) return;
  const int64_t nq = w.cols / 16;
  float acc[RW][NR];
#pragma unroll
  for (int q = 0; q < RW; q++)
#pragma unroll
    for (int r = 0; r < NR; r++) acc[q][r] = 0.0f;
#pragma unroll 4
  for (int64_t p = lane; p < nq; p += 32) {
    uint4 wv[RW];
#pragma unroll
    for (int q = 0; q < RW; q++) {
      const int64_t row = row0 + q < w.rows ? row0 + q : w.rows - 1;
      wv[q] = __ldcs((const uint4 *)(w.data + row * w.row_bytes) + p);
    }
#pragma unroll
    for (int i4 = 0; i4 < 4; i4++) {
      float wf[RW][4];
#pragma unroll
      for (int q = 0; q < RW; q++) {
        const uint32_t u = i4 == 0 ? wv[q].x : i4 == 1 ? wv[q].y : i4 == 2 ? wv[q].z : wv[q].w;
        const __half2 lo = __half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u & 0xffffu), __NV_E4M3));
        const __half2 hi = __half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(u >> 16), __NV_E4M3));
        const float2 a = __half22float2(lo), b = __half22float2(hi);
        wf[q][0] = a.x, wf[q][1] = a.y, wf[q][2] = b.x, wf[q][3] = b.y;
      }
#pragma unroll
      for (int r = 0; r < NR; r++) {
        const float4 xv = __ldg((const float4 *)(x + r * ldx) + 4 * p + i4);
#pragma unroll
        for (int q = 0; q < RW; q++) {
          acc[q][r] = fmaf(wf[q][0], xv.x, acc[q][r]);
          acc[q][r] = fmaf(wf[q][1], xv.y, acc[q][r]);
          acc[q][r] = fmaf(wf[q][2], xv.z, acc[q][r]);
          acc[q][r] = fmaf(wf[q][3], xv.w, acc[q][r]);
        }
      }
    }
  }
#pragma unroll
  for (int q = 0; q < RW; q++) {
    if (row0 + q >= w.rows) break;
    const float sc = ((const float *)w.scales)[row0 + q];
#pragma unroll
    for (int r = 0; r < NR; r++) {
      const float sum = warp_sum(acc[q][r]);
      if (lane == 0) y[r * ldy + row0 + q] = sum * sc + (bias ? bias[row0 + q] : 0.0f);
    }
  }
}

template <int NR>
static void launch_gemv_fp8_n(const cu_wdesc &w, const float *x, int64_t ldx, float *y, int64_t ldy, const float *bias,
                              cudaStream_t st, int n_sm) {
  constexpr int RW = NR <= 2 ? 4 : NR <= 4 ? 2 : 1;
  if (RW > 1 && (w.rows + GQ_WARPS * RW - 1) / (GQ_WARPS * RW) >= 2 * n_sm)
    gemv_fp8_kernel<NR, RW><<<(unsigned)((w.rows + GQ_WARPS * RW - 1) / (GQ_WARPS * RW)), GQ_WARPS * 32, 0, st>>>(
        w, x, ldx, y, ldy, bias);
  else
    gemv_fp8_kernel<NR, 1><<<(unsigned)((w.rows + GQ_WARPS - 1) / GQ_WARPS), GQ_WARPS * 32, 0, st>>>(w, x, ldx, y, ldy,
                                                                                                    bias);
}

template <int NR>
static void launch_gemv_q4k_n(const cu_wdesc &w, const float *x, int64_t ldx, float *y, int64_t ldy, const float *bias,
                              cudaStream_t st, int n_sm) {
  /* four rows a warp where that still gives a few blocks per multiprocessor, else one */
  constexpr int RW = NR <= 2 ? 4 : NR <= 4 ? 2 : 1;
  if (RW > 1 && (w.rows + GQ_WARPS * RW - 1) / (GQ_WARPS * RW) >= 2 * n_sm)
    gemv_q4k_kernel<NR, RW><<<(unsigned)((w.rows + GQ_WARPS * RW - 1) / (GQ_WARPS * RW)), GQ_WARPS * 32, 0, st>>>(
        w, x, ldx, y, ldy, bias);
  else
    gemv_q4k_kernel<NR, 1><<<(unsigned)((w.rows + GQ_WARPS - 1) / GQ_WARPS), GQ_WARPS * 32, 0, st>>>(w, x, ldx, y, ldy,
                                                                                                    bias);
}

template <int T, int NR>
static void launch_gemv_dense_n(const cu_wdesc &w, const float *x, int64_t ldx, float *y, int64_t ldy, const float *bias,
                                cudaStream_t st) {
  const bool xvec = ((uintptr_t)x % 16 == 0) && (ldx % 4 == 0);
  const unsigned blocks = (unsigned)((w.rows + GD_WARPS - 1) / GD_WARPS);
  if (xvec)
    gemv_dense_kernel<T, NR, true><<<blocks, GD_WARPS * 32, 0, st>>>(w, x, ldx, y, ldy, bias);
  else
    gemv_dense_kernel<T, NR, false><<<blocks, GD_WARPS * 32, 0, st>>>(w, x, ldx, y, ldy, bias);
}

template <int T, int NR>
static void launch_gemv_n(const cu_wdesc &w, const float *x, int64_t ldx, float *y, int64_t ldy, const float *bias,
                          cudaStream_t st, int n_sm) {
  if ((T == BK_F32 || T == BK_F16 || T == BK_BF16) && w.vec) {
    launch_gemv_dense_n<T, NR>(w, x, ldx, y, ldy, bias, st);
    return;
  }
  if (T == BK_Q4_K && w.row_bytes % 16 == 0 && (uintptr_t)w.data % 16 == 0 && (uintptr_t)x % 16 == 0 && ldx % 4 == 0) {
    launch_gemv_q4k_n<NR>(w, x, ldx, y, ldy, bias, st, n_sm);
    return;
  }
  if (T == BK_FP8 && w.row_bytes % 16 == 0 && (uintptr_t)w.data % 16 == 0 && (uintptr_t)x % 16 == 0 && ldx % 4 == 0) {
    launch_gemv_fp8_n<NR>(w, x, ldx, y, ldy, bias, st, n_sm);
    return;
  }
  gemv_kernel<T, NR><<<cu_blocks(w.rows, CU_GEMV_WARPS), CU_GEMV_WARPS * 32, 0, st>>>(w, x, ldx, y, ldy, bias);
}

template <int T>
static void launch_gemv(int n, const cu_wdesc &w, const float *x, int64_t ldx, float *y, int64_t ldy, const float *bias,
                        cudaStream_t st, int n_sm) {
  switch (n) {
    case 1: launch_gemv_n<T, 1>(w, x, ldx, y, ldy, bias, st, n_sm); break;
    case 2: launch_gemv_n<T, 2>(w, x, ldx, y, ldy, bias, st, n_sm); break;
    case 3: launch_gemv_n<T, 3>(w, x, ldx, y, ldy, bias, st, n_sm); break;
    case 4: launch_gemv_n<T, 4>(w, x, ldx, y, ldy, bias, st, n_sm); break;
    case 5: launch_gemv_n<T, 5>(w, x, ldx, y, ldy, bias, st, n_sm); break;
    case 6: launch_gemv_n<T, 6>(w, x, ldx, y, ldy, bias, st, n_sm); break;
    case 7: launch_gemv_n<T, 7>(w, x, ldx, y, ldy, bias, st, n_sm); break;
    default: launch_gemv_n<T, 8>(w, x, ldx, y, ldy, bias, st, n_sm); break;
  }
}

static void gemv(cu_backend *b, int n, const cu_wdesc &w, const float *x, int64_t ldx, float *y, int64_t ldy,
                 const float *bias) {
  cudaStream_t st = b->stream;
  switch (w.type) {
    case BK_F32: launch_gemv<BK_F32>(n, w, x, ldx, y, ldy, bias, st, b->n_sm); break;
    case BK_F16: launch_gemv<BK_F16>(n, w, x, ldx, y, ldy, bias, st, b->n_sm); break;
    case BK_BF16: launch_gemv<BK_BF16>(n, w, x, ldx, y, ldy, bias, st, b->n_sm); break;
    case BK_Q8_0: launch_gemv<BK_Q8_0>(n, w, x, ldx, y, ldy, bias, st, b->n_sm); break;
    case BK_Q4_0: launch_gemv<BK_Q4_0>(n, w, x, ldx, y, ldy, bias, st, b->n_sm); break;
    case BK_Q4_K: launch_gemv<BK_Q4_K>(n, w, x, ldx, y, ldy, bias, st, b->n_sm); break;
    case BK_Q5_K: launch_gemv<BK_Q5_K>(n, w, x, ldx, y, ldy, bias, st, b->n_sm); break;
    case BK_Q6_K: launch_gemv<BK_Q6_K>(n, w, x, ldx, y, ldy, bias, st, b->n_sm); break;
    case BK_Q5_0: launch_gemv<BK_Q5_0>(n, w, x, ldx, y, ldy, bias, st, b->n_sm); break;
    case BK_Q5_1: launch_gemv<BK_Q5_1>(n, w, x, ldx, y, ldy, bias, st, b->n_sm); break;
    case BK_Q2_K: launch_gemv<BK_Q2_K>(n, w, x, ldx, y, ldy, bias, st, b->n_sm); break;
    case BK_Q3_K: launch_gemv<BK_Q3_K>(n, w, x, ldx, y, ldy, bias, st, b->n_sm); break;
    case BK_IQ4_NL: launch_gemv<BK_IQ4_NL>(n, w, x, ldx, y, ldy, bias, st, b->n_sm); break;
    case BK_IQ4_XS: launch_gemv<BK_IQ4_XS>(n, w, x, ldx, y, ldy, bias, st, b->n_sm); break;
    case BK_MLX_AFFINE: launch_gemv<BK_MLX_AFFINE>(n, w, x, ldx, y, ldy, bias, st, b->n_sm); break;
    case BK_FP8: launch_gemv<BK_FP8>(n, w, x, ldx, y, ldy, bias, st, b->n_sm); break;
    default: break;
  }
}

/* ---- dequantization of a row range to f32 ---- */

/* out[r - r0][k] for rows [r0, r0 + nrows): one thread per 32-element sub-block. */
template <int T>
__global__ void dequant_sub_kernel(cu_wdesc w, int64_t r0, int64_t nrows, float *__restrict__ out) {
  const int64_t nsub = w.cols / 32, total = nrows * nsub;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / nsub, s = i % nsub;
    float v[32];
    cu_load_sub<T>(w, r0 + r, s, v);
    float4 *o = (float4 *)(out + r * w.cols + 32 * s);
#pragma unroll
    for (int k = 0; k < 8; k++) o[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
  }
}

/* f32 / f16 / bf16 of any width: one thread per element. */
template <int T>
__global__ void dequant_elem_kernel(cu_wdesc w, int64_t r0, int64_t nrows, float *__restrict__ out) {
  const int64_t total = nrows * w.cols;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = cu_load_elem<T>(w, r0 + i / w.cols, i % w.cols);
}

template <int T>
static void launch_dequant_sub(const cu_wdesc &w, int64_t r0, int64_t nrows, float *out, cudaStream_t st) {
  dequant_sub_kernel<T><<<grid_for(nrows * (w.cols / 32), 128), 128, 0, st>>>(w, r0, nrows, out);
}

template <int T>
static void launch_dequant_elem(const cu_wdesc &w, int64_t r0, int64_t nrows, float *out, cudaStream_t st) {
  dequant_elem_kernel<T><<<grid_for(nrows * w.cols, 256), 256, 0, st>>>(w, r0, nrows, out);
}

static void dequant_rows(cudaStream_t st, const cu_wdesc &w, int64_t r0, int64_t nrows, float *out) {
  switch (w.type) {
    case BK_F32: launch_dequant_elem<BK_F32>(w, r0, nrows, out, st); break;
    case BK_F16: launch_dequant_elem<BK_F16>(w, r0, nrows, out, st); break;
    case BK_BF16: launch_dequant_elem<BK_BF16>(w, r0, nrows, out, st); break;
    case BK_FP8: launch_dequant_elem<BK_FP8>(w, r0, nrows, out, st); break;
    case BK_Q8_0: launch_dequant_sub<BK_Q8_0>(w, r0, nrows, out, st); break;
    case BK_Q4_0: launch_dequant_sub<BK_Q4_0>(w, r0, nrows, out, st); break;
    case BK_Q4_K: launch_dequant_sub<BK_Q4_K>(w, r0, nrows, out, st); break;
    case BK_Q5_K: launch_dequant_sub<BK_Q5_K>(w, r0, nrows, out, st); break;
    case BK_Q6_K: launch_dequant_sub<BK_Q6_K>(w, r0, nrows, out, st); break;
    case BK_Q5_0: launch_dequant_sub<BK_Q5_0>(w, r0, nrows, out, st); break;
    case BK_Q5_1: launch_dequant_sub<BK_Q5_1>(w, r0, nrows, out, st); break;
    case BK_Q2_K: launch_dequant_sub<BK_Q2_K>(w, r0, nrows, out, st); break;
    case BK_Q3_K: launch_dequant_sub<BK_Q3_K>(w, r0, nrows, out, st); break;
    case BK_IQ4_NL: launch_dequant_sub<BK_IQ4_NL>(w, r0, nrows, out, st); break;
    case BK_IQ4_XS: launch_dequant_sub<BK_IQ4_XS>(w, r0, nrows, out, st); break;
    case BK_MLX_AFFINE: launch_dequant_sub<BK_MLX_AFFINE>(w, r0, nrows, out, st); break;
    default: break;
  }
}

/* ---- Q8_0 / Q4_0 / Q4_K GEMV on 8-bit activations (integer dot products) ----
 *
 * As the CPU's packed kernels do (and llama.cpp's): each activation row is
 * quantized per block of 32 to int8 (d = max|x| / 127, q = round(x / d),
 * bk_qrows_fill's arithmetic), and a weight block meets it through __dp4a:
 * y += d_w · d_x · Σ q_w q_x (Q4_0: Σ (q_w − 8) q_x = Σ q_w q_x − 8 Σ q_x).
 * The weight rows (16-byte aligned: 8 blocks' bytes are a multiple of 16)
 * stream through coalesced 16-byte loads into shared memory, 32 blocks of
 * RW rows at a time per warp, and lane l takes block l of each row from
 * there (a 34- or 18-byte stride: no two lanes of a warp on one bank). */
#define QV_WARPS 4

/* x [n][cols] → xq [n][cols] int8, xd [n][nb] scales (NaN where the block holds a NaN or inf), xs [n][nb] Σ q. */
__global__ void quantize_q8_rows_kernel(const float *__restrict__ x, int64_t ldx, int n, int64_t cols,
                                        int8_t *__restrict__ xq, float *__restrict__ xd, int *__restrict__ xs) {
  const int64_t nb = cols / 32, total = (int64_t)n * nb;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / nb, b = i % nb;
    const float *xb = x + r * ldx + 32 * b;
    float v[32], amax = 0.f;
    bool bad = false;
#pragma unroll
    for (int k = 0; k < 32; k++) {
      v[k] = xb[k];
      amax = fmaxf(amax, fabsf(v[k]));
      bad |= isnan(v[k]);
    }
    const float id = amax > 0.f && !isinf(amax) ? 127.0f / amax : 0.0f;
    __align__(16) int8_t q[32];
    int s = 0;
#pragma unroll
    for (int k = 0; k < 32; k++) {
      int t = __float2int_rn(v[k] * id);
      t = t > 127 ? 127 : t < -127 ? -127 : t;
      q[k] = (int8_t)t;
      s += t;
    }
    uint4 *o = (uint4 *)(xq + r * cols + 32 * b);
    o[0] = ((const uint4 *)q)[0];
    o[1] = ((const uint4 *)q)[1];
    xd[i] = bad ? NAN : amax / 127.0f;
    xs[i] = s;
  }
}

template <int T> struct qv_fmt;
template <> struct qv_fmt<BK_Q8_0> { static constexpr int bytes = CU_Q8_0_BYTES; };
template <> struct qv_fmt<BK_Q4_0> { static constexpr int bytes = CU_Q4_0_BYTES; };

/* The chunk of RW consecutive rows (bytes [off, off + 16 pieces) of each; rows past the end repeat the last)
 * into the warp's shared memory sm[RW][bytes]: every 16-byte load in flight before the first store. */
template <int RW, int PIECES>
static __device__ __forceinline__ void qv_stage(const cu_wdesc &w, int64_t row0, int64_t off, int pieces, int lane,
                                                uint8_t (*sm)[PIECES * 16]) {
  uint4 buf[RW][(PIECES + 31) / 32];
#pragma unroll
  for (int rr = 0; rr < RW; rr++) {
    const int64_t row = row0 + rr < w.rows ? row0 + rr : w.rows - 1;
    const uint4 *src = (const uint4 *)(w.data + row * w.row_bytes + off);
#pragma unroll
    for (int j = 0; j < (PIECES + 31) / 32; j++) {
      const int pi = lane + 32 * j;
      if (pi < pieces) buf[rr][j] = __ldg(src + pi);
    }
  }
  __syncwarp();
#pragma unroll
  for (int rr = 0; rr < RW; rr++)
#pragma unroll
    for (int j = 0; j < (PIECES + 31) / 32; j++) {
      const int pi = lane + 32 * j;
      if (pi < pieces) ((uint4 *)sm[rr])[pi] = buf[rr][j];
    }
  __syncwarp();
}

/* The 8-bit activations of block b of each of the NR rows, as eight int32 words each. */
template <int NR>
static __device__ __forceinline__ void qv_load_x(const int8_t *__restrict__ xq, int64_t cols, int64_t b, int xw[NR][8]) {
#pragma unroll
  for (int r = 0; r < NR; r++) {
    const uint4 *xp = (const uint4 *)(xq + (int64_t)r * cols + 32 * b);
    const uint4 a = __ldg(xp), c = __ldg(xp + 1);
    xw[r][0] = (int)a.x, xw[r][1] = (int)a.y, xw[r][2] = (int)a.z, xw[r][3] = (int)a.w;
    xw[r][4] = (int)c.x, xw[r][5] = (int)c.y, xw[r][6] = (int)c.z, xw[r][7] = (int)c.w;
  }
}

/* The warp's sums of its RW rows for the NR activation rows into y (+ bias), by lane 0. */
template <int RW, int NR>
static __device__ __forceinline__ void qv_store(float acc[RW][NR], int64_t rows, int64_t row0, int lane,
                                                float *__restrict__ y, int64_t ldy, const float *__restrict__ bias) {
#pragma unroll
  for (int rr = 0; rr < RW; rr++) {
    const int64_t row = row0 + rr;
#pragma unroll
    for (int r = 0; r < NR; r++) {
      const float s = warp_sum(acc[rr][r]);
      if (lane == 0 && row < rows) y[r * ldy + row] = s + (bias ? bias[row] : 0.0f);
    }
  }
}

/* The int32 word k (bytes 4k .. 4k + 3) of a block's quants at p (2-byte aligned, in shared memory). */
static __device__ __forceinline__ int qv_word(const uint8_t *p, int k) {
  const uint16_t *h = (const uint16_t *)p;
  return (int)((uint32_t)h[2 * k] | ((uint32_t)h[2 * k + 1] << 16));
}

template <int T, int NR, int RW>
__global__ void __launch_bounds__(QV_WARPS * 32)
    gemv_q8act_kernel(cu_wdesc w, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                      const int *__restrict__ xs, float *__restrict__ y, int64_t ldy, const float *__restrict__ bias) {
  constexpr int BB = qv_fmt<T>::bytes, CHUNK = 32 * BB, PIECES = CHUNK / 16;
  __shared__ __align__(16) uint8_t sm[QV_WARPS][RW][CHUNK];
  const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
  const int64_t row0 = ((int64_t)blockIdx.x * QV_WARPS + wi) * RW;
  if (row0 >= w.rows) return;
  const int64_t nb = w.cols / 32;
  float acc[RW][NR];
#pragma unroll
  for (int rr = 0; rr < RW; rr++)
#pragma unroll
    for (int r = 0; r < NR; r++) acc[rr][r] = 0.f;
  for (int64_t b0 = 0; b0 < nb; b0 += 32) {
    const int nblk = nb - b0 < 32 ? (int)(nb - b0) : 32;
    qv_stage<RW, PIECES>(w, row0, b0 * BB, nblk * BB / 16, lane, sm[wi]);
    if (lane < nblk) {
      const int64_t b = b0 + lane;
      int xw[NR][8];
      qv_load_x<NR>(xq, w.cols, b, xw);
#pragma unroll
      for (int rr = 0; rr < RW; rr++) {
        const uint8_t *blk = sm[wi][rr] + lane * BB;
        const float dw = __half2float(__ushort_as_half(*(const uint16_t *)blk));
        int isum[NR];
#pragma unroll
        for (int r = 0; r < NR; r++) isum[r] = 0;
        if (T == BK_Q8_0) {
#pragma unroll
          for (int k = 0; k < 8; k++) {
            const int q = qv_word(blk + 2, k);
#pragma unroll
            for (int r = 0; r < NR; r++) isum[r] = __dp4a(q, xw[r][k], isum[r]);
          }
        } else {
#pragma unroll
          for (int k = 0; k < 4; k++) {
            const int q = qv_word(blk + 2, k), lo = q & 0x0F0F0F0F, hi = (q >> 4) & 0x0F0F0F0F;
#pragma unroll
            for (int r = 0; r < NR; r++) isum[r] = __dp4a(hi, xw[r][k + 4], __dp4a(lo, xw[r][k], isum[r]));
          }
#pragma unroll
          for (int r = 0; r < NR; r++) isum[r] -= 8 * xs[(int64_t)r * nb + b];
        }
#pragma unroll
        for (int r = 0; r < NR; r++) acc[rr][r] += dw * xd[(int64_t)r * nb + b] * (float)isum[r];
      }
    }
    __syncwarp();
  }
  qv_store<RW, NR>(acc, w.rows, row0, lane, y, ldy, bias);
}

/* Q4_K on 8-bit activations: chunks of 8 super-blocks (1,152 bytes) of RW rows stream into shared memory
 * per warp; lane l takes sub-blocks l and l + 32 of the chunk (super-block s / 8, sub-block s % 8: 32
 * nibbles of one half of 32 bytes) and adds d_x · (d·sc · Σ q q_x − dmin·m · Σ q_x), as the CPU does. */
template <int NR, int RW>
__global__ void __launch_bounds__(QV_WARPS * 32)
    gemv_q4k_q8act_kernel(cu_wdesc w, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                          const int *__restrict__ xs, float *__restrict__ y, int64_t ldy, const float *__restrict__ bias) {
  constexpr int SB = CU_Q4_K_BYTES, CHUNK = 8 * SB, PIECES = CHUNK / 16; /* 72 */
  __shared__ __align__(16) uint8_t sm[QV_WARPS][RW][CHUNK];
  const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
  const int64_t row0 = ((int64_t)blockIdx.x * QV_WARPS + wi) * RW;
  if (row0 >= w.rows) return;
  const int64_t nsb = w.cols / 256, nb = w.cols / 32;
  float acc[RW][NR];
#pragma unroll
  for (int rr = 0; rr < RW; rr++)
#pragma unroll
    for (int r = 0; r < NR; r++) acc[rr][r] = 0.f;
  for (int64_t s0 = 0; s0 < nsb; s0 += 8) {
    const int nsbc = nsb - s0 < 8 ? (int)(nsb - s0) : 8;
    qv_stage<RW, PIECES>(w, row0, s0 * SB, nsbc * SB / 16, lane, sm[wi]);
#pragma unroll
    for (int t = 0; t < 2; t++) {
      const int s = lane + 32 * t, sbi = s >> 3, j = s & 7;
      if (sbi < nsbc) {
        const int64_t b = (s0 + sbi) * 8 + j; /* the activations' block */
        int xw[NR][8];
        qv_load_x<NR>(xq, w.cols, b, xw);
#pragma unroll
        for (int rr = 0; rr < RW; rr++) {
          const uint8_t *blk = sm[wi][rr] + sbi * SB;
          const float d = __half2float(__ushort_as_half(*(const uint16_t *)blk));
          const float dmin = __half2float(__ushort_as_half(*(const uint16_t *)(blk + 2)));
          int sc, m;
          cu_k_scale_min(blk + 4, j, &sc, &m);
          const uint4 *qp = (const uint4 *)(blk + 16 + 32 * (j >> 1));
          const uint4 q0 = qp[0], q1 = qp[1];
          const int qw[8] = {(int)q0.x, (int)q0.y, (int)q0.z, (int)q0.w, (int)q1.x, (int)q1.y, (int)q1.z, (int)q1.w};
          const int sh = 4 * (j & 1);
          int isum[NR];
#pragma unroll
          for (int r = 0; r < NR; r++) isum[r] = 0;
#pragma unroll
          for (int k = 0; k < 8; k++) {
            const int q = (qw[k] >> sh) & 0x0F0F0F0F;
#pragma unroll
            for (int r = 0; r < NR; r++) isum[r] = __dp4a(q, xw[r][k], isum[r]);
          }
          const float a = d * (float)sc, mm = dmin * (float)m;
#pragma unroll
          for (int r = 0; r < NR; r++)
            acc[rr][r] += xd[(int64_t)r * nb + b] * (a * (float)isum[r] - mm * (float)xs[(int64_t)r * nb + b]);
        }
      }
    }
    __syncwarp();
  }
  qv_store<RW, NR>(acc, w.rows, row0, lane, y, ldy, bias);
}

/* Byte k (0..11) of a Q4_K super-block's packed scales held as three words. */
static __device__ __forceinline__ int q4k_sbyte(const uint32_t s[3], int k) { return (int)((s[k >> 2] >> (8 * (k & 3))) & 0xFF); }

/* Q4_K on 8-bit activations, read straight from global memory (no staging): lane l takes the pairs of
 * sub-blocks l, l + 32, ... of its row (pair p of super-block s: the 32 bytes at 16 + 32 p, low nibbles
 * sub-block 2p, high nibbles 2p + 1), two pairs in flight per step, each with one 16-byte load of the
 * super-block's head (d, dmin, scales) and two of quants; RW rows a warp share the activations. */
template <int NR, int RW>
__global__ void __launch_bounds__(QV_WARPS * 32)
    gemv_q4k_direct_kernel(cu_wdesc w, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                           const int *__restrict__ xs, float *__restrict__ y, int64_t ldy, const float *__restrict__ bias) {
  const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
  const int64_t row0 = ((int64_t)blockIdx.x * QV_WARPS + wi) * RW;
  if (row0 >= w.rows) return;
  const int64_t nb = w.cols / 32;
  const int items = (int)(w.cols / 64); /* pairs of sub-blocks a row */
  float acc[RW][NR];
#pragma unroll
  for (int rr = 0; rr < RW; rr++)
#pragma unroll
    for (int r = 0; r < NR; r++) acc[rr][r] = 0.f;
  const uint8_t *rowp[RW];
#pragma unroll
  for (int rr = 0; rr < RW; rr++) rowp[rr] = w.data + (row0 + rr < w.rows ? row0 + rr : row0) * w.row_bytes;
  for (int it0 = lane; it0 < items; it0 += 64) {
    uint4 hd[2][RW], q0[2][RW], q1[2][RW];
#pragma unroll
    for (int u = 0; u < 2; u++) {
      const int it = it0 + 32 * u < items ? it0 + 32 * u : it0;
      const int sb = it >> 2, p = it & 3;
#pragma unroll
      for (int rr = 0; rr < RW; rr++) {
        const uint8_t *blk = rowp[rr] + (int64_t)sb * CU_Q4_K_BYTES;
        hd[u][rr] = __ldcs((const uint4 *)blk);
        q0[u][rr] = __ldcs((const uint4 *)(blk + 16 + 32 * p));
        q1[u][rr] = __ldcs((const uint4 *)(blk + 32 + 32 * p));
      }
    }
#pragma unroll
    for (int u = 0; u < 2; u++) {
      const int it = it0 + 32 * u;
      if (it >= items) break;
      const int sb = it >> 2, p = it & 3, j0 = 2 * p, j1 = 2 * p + 1;
      const int64_t b0 = (int64_t)sb * 8 + j0; /* the activations' blocks b0 and b0 + 1 */
      int xw0[NR][8], xw1[NR][8];
      qv_load_x<NR>(xq, w.cols, b0, xw0);
      qv_load_x<NR>(xq, w.cols, b0 + 1, xw1);
#pragma unroll
      for (int rr = 0; rr < RW; rr++) {
        const uint4 h = hd[u][rr];
        const float d = __half2float(__ushort_as_half((unsigned short)(h.x & 0xFFFF)));
        const float dmin = __half2float(__ushort_as_half((unsigned short)(h.x >> 16)));
        const uint32_t sw[3] = {h.y, h.z, h.w};
        int sc0, m0, sc1, m1;
        if (j0 < 4) {
          sc0 = q4k_sbyte(sw, j0) & 63, m0 = q4k_sbyte(sw, j0 + 4) & 63;
          sc1 = q4k_sbyte(sw, j1) & 63, m1 = q4k_sbyte(sw, j1 + 4) & 63;
        } else {
          sc0 = (q4k_sbyte(sw, j0 + 4) & 0xF) | ((q4k_sbyte(sw, j0 - 4) >> 6) << 4);
          m0 = (q4k_sbyte(sw, j0 + 4) >> 4) | ((q4k_sbyte(sw, j0) >> 6) << 4);
          sc1 = (q4k_sbyte(sw, j1 + 4) & 0xF) | ((q4k_sbyte(sw, j1 - 4) >> 6) << 4);
          m1 = (q4k_sbyte(sw, j1 + 4) >> 4) | ((q4k_sbyte(sw, j1) >> 6) << 4);
        }
        const int qw[8] = {(int)q0[u][rr].x, (int)q0[u][rr].y, (int)q0[u][rr].z, (int)q0[u][rr].w,
                           (int)q1[u][rr].x, (int)q1[u][rr].y, (int)q1[u][rr].z, (int)q1[u][rr].w};
        int is0[NR], is1[NR];
#pragma unroll
        for (int r = 0; r < NR; r++) is0[r] = 0, is1[r] = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
          const int lo = qw[k] & 0x0F0F0F0F, hi = (qw[k] >> 4) & 0x0F0F0F0F;
#pragma unroll
          for (int r = 0; r < NR; r++) is0[r] = __dp4a(lo, xw0[r][k], is0[r]), is1[r] = __dp4a(hi, xw1[r][k], is1[r]);
        }
        const float a0 = d * (float)sc0, mm0 = dmin * (float)m0, a1 = d * (float)sc1, mm1 = dmin * (float)m1;
#pragma unroll
        for (int r = 0; r < NR; r++)
          acc[rr][r] += xd[(int64_t)r * nb + b0] * (a0 * (float)is0[r] - mm0 * (float)xs[(int64_t)r * nb + b0]) +
                        xd[(int64_t)r * nb + b0 + 1] * (a1 * (float)is1[r] - mm1 * (float)xs[(int64_t)r * nb + b0 + 1]);
      }
    }
  }
  qv_store<RW, NR>(acc, w.rows, row0, lane, y, ldy, bias);
}

/* HEARTH_CUDA_Q4K=direct: the Q4_K GEMV that reads straight from global memory (gemv_q4k_direct_kernel)
 * instead of staging through shared memory; read at each launch, so a test can try both. */
static bool q4k_direct(void) {
  const char *e = getenv("HEARTH_CUDA_Q4K");
  return e && !strcmp(e, "direct");
}

template <int T, int NR>
static void launch_gemv_q8act_n(const cu_wdesc &w, const int8_t *xq, const float *xd, const int *xs, float *y,
                                int64_t ldy, const float *bias, cudaStream_t st, int n_sm) {
  /* several rows a warp (their loads in flight together) where that still gives a few blocks per multiprocessor */
  constexpr int RW = NR <= 2 ? 4 : NR <= 4 ? 2 : 1;
  if constexpr (T == BK_Q4_K) {
    if (q4k_direct()) {
      constexpr int RD = NR <= 4 ? 2 : 1;
      gemv_q4k_direct_kernel<NR, RD><<<(unsigned)((w.rows + QV_WARPS * RD - 1) / (QV_WARPS * RD)), QV_WARPS * 32, 0,
                                       st>>>(w, xq, xd, xs, y, ldy, bias);
    } else if (RW > 1 && (w.rows + QV_WARPS * RW - 1) / (QV_WARPS * RW) >= 2 * n_sm)
      gemv_q4k_q8act_kernel<NR, RW><<<(unsigned)((w.rows + QV_WARPS * RW - 1) / (QV_WARPS * RW)), QV_WARPS * 32, 0,
                                      st>>>(w, xq, xd, xs, y, ldy, bias);
    else
      gemv_q4k_q8act_kernel<NR, 1><<<(unsigned)((w.rows + QV_WARPS - 1) / QV_WARPS), QV_WARPS * 32, 0, st>>>(
          w, xq, xd, xs, y, ldy, bias);
  } else if (RW > 1 && (w.rows + QV_WARPS * RW - 1) / (QV_WARPS * RW) >= 2 * n_sm) {
    gemv_q8act_kernel<T, NR, RW><<<(unsigned)((w.rows + QV_WARPS * RW - 1) / (QV_WARPS * RW)), QV_WARPS * 32, 0, st>>>(
        w, xq, xd, xs, y, ldy, bias);
  } else {
    gemv_q8act_kernel<T, NR, 1><<<(unsigned)((w.rows + QV_WARPS - 1) / QV_WARPS), QV_WARPS * 32, 0, st>>>(w, xq, xd, xs, y,
                                                                                                       ldy, bias);
  }
}

template <int T>
static void launch_gemv_q8act(int n, const cu_wdesc &w, const int8_t *xq, const float *xd, const int *xs, float *y,
                              int64_t ldy, const float *bias, cudaStream_t st, int n_sm) {
  switch (n) {
    case 1: launch_gemv_q8act_n<T, 1>(w, xq, xd, xs, y, ldy, bias, st, n_sm); break;
    case 2: launch_gemv_q8act_n<T, 2>(w, xq, xd, xs, y, ldy, bias, st, n_sm); break;
    case 3: launch_gemv_q8act_n<T, 3>(w, xq, xd, xs, y, ldy, bias, st, n_sm); break;
    case 4: launch_gemv_q8act_n<T, 4>(w, xq, xd, xs, y, ldy, bias, st, n_sm); break;
    case 5: launch_gemv_q8act_n<T, 5>(w, xq, xd, xs, y, ldy, bias, st, n_sm); break;
    case 6: launch_gemv_q8act_n<T, 6>(w, xq, xd, xs, y, ldy, bias, st, n_sm); break;
    case 7: launch_gemv_q8act_n<T, 7>(w, xq, xd, xs, y, ldy, bias, st, n_sm); break;
    default: launch_gemv_q8act_n<T, 8>(w, xq, xd, xs, y, ldy, bias, st, n_sm); break;
  }
}

/* Q8_0 / Q4_0 / Q4_K with rows whose bytes are whole 16-byte pieces: the integer path (unless f32_activations).
 * Returns false, having run nothing, where it does not apply. */
static bool gemv_q8act(cu_backend *b, int n, const cu_wdesc &w, const float *x, int64_t ldx, float *y, int64_t ldy,
                       const float *bias) {
  if (b->f32_act || (w.type != BK_Q8_0 && w.type != BK_Q4_0 && w.type != BK_Q4_K) || w.cols % 256 || w.row_bytes % 16 ||
      (uintptr_t)w.data % 16)
    return false;
  const int64_t nb = w.cols / 32;
  const size_t qbytes = ((size_t)n * (size_t)w.cols + 255) & ~(size_t)255, dbytes = ((size_t)n * (size_t)nb * 4 + 255) & ~(size_t)255;
  char *sc = (char *)cu_scratch(b, qbytes + 2 * dbytes);
  if (!sc) return true;
  int8_t *xq = (int8_t *)sc;
  float *xd = (float *)(sc + qbytes);
  int *xs = (int *)(sc + qbytes + dbytes);
  quantize_q8_rows_kernel<<<grid_for((int64_t)n * nb, 128), 128, 0, b->stream>>>(x, ldx, n, w.cols, xq, xd, xs);
  if (cu_check(b, "matmul (8-bit activations)")) return true;
  if (w.type == BK_Q8_0) launch_gemv_q8act<BK_Q8_0>(n, w, xq, xd, xs, y, ldy, bias, b->stream, b->n_sm);
  else if (w.type == BK_Q4_0) launch_gemv_q8act<BK_Q4_0>(n, w, xq, xd, xs, y, ldy, bias, b->stream, b->n_sm);
  else launch_gemv_q8act<BK_Q4_K>(n, w, xq, xd, xs, y, ldy, bias, b->stream, b->n_sm);
  return true;
}

/* ---- GEMM helpers ---- */

__global__ void split_bf16_kernel(const float *__restrict__ x, int64_t n, __nv_bfloat16 *__restrict__ hi,
                                  __nv_bfloat16 *__restrict__ mid, __nv_bfloat16 *__restrict__ lo) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float v = x[i];
    __nv_bfloat16 h = __float2bfloat16_rn(v);
    float r = v - __bfloat162float(h);
    __nv_bfloat16 m = __float2bfloat16_rn(r);
    hi[i] = h;
    mid[i] = m;
    lo[i] = __float2bfloat16_rn(r - __bfloat162float(m));
  }
}

__global__ void to_bf16_kernel(const float *__restrict__ x, int64_t n, __nv_bfloat16 *__restrict__ out) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = __float2bfloat16_rn(x[i]);
}

/* y[r][c] = (t[r][c] + t[nc + r][c]) + t[2 nc + r][c]: the three terms' products (lo, mid, hi) summed */
__global__ void sum3_kernel(const float *__restrict__ t, int64_t nc, int64_t rows, float *__restrict__ y) {
  const int64_t total = nc * rows, third = nc * rows;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = (t[i] + t[third + i]) + t[2 * third + i];
}

__global__ void add_bias_kernel(float *__restrict__ y, int64_t n, int64_t cols, const float *__restrict__ bias) {
  const int64_t total = n * cols;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
    y[i] += bias[i % cols];
}

/* ---- f16 tensor-core GEMM for f16 weights and every dequantized format ---- */

/* Per activation row: a power of two s (so that max |x s| lies in [2^14, 2^15), well inside f16's range,
 * exponent clamped) and x s split into f16 terms — hi alone (fast), or hi + mid + lo (exact: x s to about
 * 2^-33 of itself, and every element to 2^-25 absolute, beyond f32). terms: [nterms][nc][cols]; inv_s[r] = 1 / s. */
__global__ void split_f16_rows_kernel(const float *__restrict__ x, int64_t nc, int64_t cols, int nterms,
                                      __half *__restrict__ terms, float *__restrict__ inv_s) {
  const int64_t r = blockIdx.x;
  const float *xr = x + r * cols;
  float m = 0.f;
  for (int64_t k = threadIdx.x; k < cols; k += blockDim.x) m = fmaxf(m, fabsf(xr[k]));
  __shared__ float red[32];
  for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.f;
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x == 0) red[0] = m;
  }
  __syncthreads();
  m = red[0];
  int e = (m > 0.f && isfinite(m)) ? 14 - ilogbf(m) : 0;
  e = e < -100 ? -100 : e > 100 ? 100 : e;
  const float s = ldexpf(1.f, e);
  if (threadIdx.x == 0) inv_s[r] = ldexpf(1.f, -e);
  __half *hi = terms + r * cols, *mid = hi + nc * cols, *lo = mid + nc * cols;
  for (int64_t k = threadIdx.x; k < cols; k += blockDim.x) {
    float v = xr[k] * s;
    __half h = __float2half_rn(v);
    hi[k] = h;
    if (nterms > 1) {
      float rem = v - __half2float(h);
      __half md = __float2half_rn(rem);
      mid[k] = md;
      lo[k] = __float2half_rn(rem - __half2float(md));
    }
  }
}

/* Rows [r0, r0 + nrows) of a quantized (or FP8) weight as f16 (round to nearest). One thread per
 * 32-element sub-block. */
template <int T>
__global__ void dequant_f16_kernel(cu_wdesc w, int64_t r0, int64_t nrows, __half *__restrict__ out) {
  const int64_t nsub = w.cols / 32, total = nrows * nsub;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / nsub, s = i % nsub;
    float v[32];
    cu_load_sub<T>(w, r0 + r, s, v);
    __align__(16) __half h[32];
#pragma unroll
    for (int k = 0; k < 32; k++) h[k] = __float2half_rn(v[k]);
    uint4 *o = (uint4 *)(out + r * w.cols + 32 * s);
#pragma unroll
    for (int k = 0; k < 4; k++) o[k] = ((const uint4 *)h)[k];
  }
}

template <int T>
static void launch_dequant_f16(const cu_wdesc &w, int64_t r0, int64_t nrows, __half *out, cudaStream_t st) {
  dequant_f16_kernel<T><<<grid_for(nrows * (w.cols / 32), 128), 128, 0, st>>>(w, r0, nrows, out);
}

static bool dequant_f16_rows(cudaStream_t st, const cu_wdesc &w, int64_t r0, int64_t nrows, __half *out) {
  switch (w.type) {
    case BK_FP8: launch_dequant_f16<BK_FP8>(w, r0, nrows, out, st); return true;
    case BK_Q8_0: launch_dequant_f16<BK_Q8_0>(w, r0, nrows, out, st); return true;
    case BK_Q4_0: launch_dequant_f16<BK_Q4_0>(w, r0, nrows, out, st); return true;
    case BK_Q4_K: launch_dequant_f16<BK_Q4_K>(w, r0, nrows, out, st); return true;
    case BK_Q5_K: launch_dequant_f16<BK_Q5_K>(w, r0, nrows, out, st); return true;
    case BK_Q6_K: launch_dequant_f16<BK_Q6_K>(w, r0, nrows, out, st); return true;
    case BK_Q5_0: launch_dequant_f16<BK_Q5_0>(w, r0, nrows, out, st); return true;
    case BK_Q5_1: launch_dequant_f16<BK_Q5_1>(w, r0, nrows, out, st); return true;
    case BK_Q2_K: launch_dequant_f16<BK_Q2_K>(w, r0, nrows, out, st); return true;
    case BK_Q3_K: launch_dequant_f16<BK_Q3_K>(w, r0, nrows, out, st); return true;
    case BK_IQ4_NL: launch_dequant_f16<BK_IQ4_NL>(w, r0, nrows, out, st); return true;
    case BK_IQ4_XS: launch_dequant_f16<BK_IQ4_XS>(w, r0, nrows, out, st); return true;
    case BK_MLX_AFFINE: launch_dequant_f16<BK_MLX_AFFINE>(w, r0, nrows, out, st); return true;
    default: return false;
  }
}

/* y[r][c] (ldy) = (sum of the products t[p][r][c], smallest first) × inv_s[r]: np = 1 (fast; t [nc][ldt]
 * may be y itself) or 3 (exact: hi·hi, hi·mid, hi·lo, t holding three blocks of [nc][rc]). */
__global__ void sum_terms_kernel(const float *__restrict__ t, int64_t ldt, int np, int64_t nc, int64_t rc,
                                 const float *__restrict__ inv_s, float *__restrict__ y, int64_t ldy) {
  const int64_t total = nc * rc;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = i / rc, c = i % rc;
    const float v = np == 1 ? t[r * ldt + c] /* (in place: t is y) */ : (t[2 * total + i] + t[total + i]) + t[i];
    y[r * ldy + c] = v * inv_s[r];
  }
}

/* y[n, rows] = x · Wᵀ on the f16 tensor cores: f16 weights read as stored, in both precisions (exact:
 * three activation terms, fast: one), and under --gpu-precision fast every format that dequantizes, a
 * chunk of rows at a time into f16 scratch (exact keeps those on the f32 path: two f16 weight terms
 * against three activation terms measured slower than dequantizing to f32 for cublasSgemm). Each
 * activation row is scaled by a power of two into f16's range first and the product unscaled after.
 * Returns false, having run nothing, where it does not apply. */
static bool half_gemm(cu_backend *b, const cu_wdesc &w, const float *x, int64_t n, float *y) {
  const bool native = w.type == BK_F16, fast = b->fast_matmul;
  if (!native && (!fast || w.cols % 32 || w.type == BK_BF16 || w.type == BK_F32)) return false;
  const int64_t rows = w.rows, cols = w.cols;
  const int xterms = fast ? 1 : 3, np = xterms;
  const size_t cap = CU_SCRATCH_CAP - 1024;
  /* weight rows per chunk: all of them when they fit in half the scratch */
  int64_t wchunk = native ? rows : (int64_t)((cap / 2) / ((size_t)cols * 2));
  if (wchunk > rows) wchunk = rows;
  if (wchunk < 1) return false;
  size_t wbytes = native ? 0 : (((size_t)wchunk * (size_t)cols * 2 + 255) & ~(size_t)255);
  /* activation rows per chunk: their terms, the scale and (exact) the products of one weight chunk */
  size_t per_row = (size_t)xterms * (size_t)cols * 2 + sizeof(float) + (np > 1 ? (size_t)np * (size_t)wchunk * 4 : 0);
  int64_t nchunk = (int64_t)((cap - wbytes - 768) / per_row);
  if (nchunk < 1) return false;
  if (nchunk > n) nchunk = n;
  char *sc = (char *)cu_scratch(b, cap);
  if (!sc) return true;
  __half *wh = (__half *)sc, *terms = (__half *)(sc + wbytes);
  float *inv_s = (float *)(sc + wbytes + (((size_t)xterms * (size_t)nchunk * (size_t)cols * 2 + 255) & ~(size_t)255));
  float *prod = (float *)((char *)inv_s + (((size_t)nchunk * sizeof(float) + 255) & ~(size_t)255));
  const float one = 1.0f, zero = 0.0f;
  const bool split_once = nchunk >= n;
  for (int64_t r0 = 0; r0 < rows; r0 += wchunk) {
    const int64_t rc = rows - r0 < wchunk ? rows - r0 : wchunk;
    const __half *a = native ? (const __half *)(w.data + (size_t)r0 * (size_t)w.row_bytes) : wh;
    if (!native) {
      dequant_f16_rows(b->stream, w, r0, rc, wh);
      if (cu_check(b, "matmul (dequantize to f16)")) return true;
    }
    for (int64_t n0 = 0; n0 < n; n0 += nchunk) {
      const int64_t nc = n - n0 < nchunk ? n - n0 : nchunk;
      if (!split_once || r0 == 0) {
        split_f16_rows_kernel<<<(unsigned)nc, 256, 0, b->stream>>>(x + n0 * cols, nc, cols, xterms, terms, inv_s);
        if (cu_check(b, "matmul (f16 split)")) return true;
      }
      float *out = np > 1 ? prod : y + n0 * rows + r0;
      const int ldo = np > 1 ? (int)rc : (int)rows;
      cublasStatus_t st = cublasGemmEx(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rc, (int)(xterms * nc), (int)cols, &one,
                                       a, CUDA_R_16F, (int)cols, terms, CUDA_R_16F, (int)cols, &zero, out, CUDA_R_32F,
                                       ldo, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (cu_check_blas(b, st, "gemm f16")) return true;
      sum_terms_kernel<<<grid_for(nc * rc, 256), 256, 0, b->stream>>>(out, ldo, np, nc, rc, inv_s, y + n0 * rows + r0,
                                                                      rows);
      if (cu_check(b, "matmul (f16 terms)")) return true;
    }
  }
  return true;
}

/* ---- FP8 GEMM (fast mode): activations quantized per row to E4M3, cuBLASLt on the tensor cores ---- */

/* Block t: s[t] = max |x[t]| / 448 and q[t] = e4m3(x[t] / s[t]) (saturating; a row of zeros gives s = 0, q = 0),
 * with the arithmetic of bk_quantize_fp8 (one division for the scale, its reciprocal, one product per element). */
__global__ void fp8_rows_kernel(const float *__restrict__ x, int64_t cols, __nv_fp8_storage_t *__restrict__ q,
                                float *__restrict__ s) {
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const float *xr = x + t * cols;
  float m = 0.0f;
  for (int64_t k = threadIdx.x; k < cols; k += blockDim.x) m = fmaxf(m, fabsf(xr[k]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x == 0) red[0] = m;
  }
  __syncthreads();
  const float sc = __fdiv_rn(red[0], 448.0f), inv = sc > 0.0f ? __fdiv_rn(1.0f, sc) : 0.0f;
  if (threadIdx.x == 0) s[t] = sc;
  for (int64_t k = threadIdx.x; k < cols; k += blockDim.x)
    q[t * cols + k] = __nv_cvt_float_to_fp8(__fmul_rn(xr[k], inv), __NV_SATFINITE, __NV_E4M3);
}

/* y[t][o] = y[t][o] * sx[t] * sw[o] (+ bias[o]) */
__global__ void fp8_scale_kernel(float *__restrict__ y, int64_t n, int64_t rows, const float *__restrict__ sx,
                                 const float *__restrict__ sw, const float *__restrict__ bias) {
  const int64_t total = n * rows;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = i / rows, o = i % rows;
    y[i] = y[i] * (sx[t] * sw[o]) + (bias ? bias[o] : 0.0f);
  }
}

#define CU_LT_WS ((size_t)32 << 20)
#define CU_LT_ALGOS 64
struct cu_lt_algo {
  int64_t m, n, k;
  bool none;   /* cuBLASLt has no algorithm for this shape: the dequantizing path takes it */
  cublasLtMatmulAlgo_t algo;
};

void cu_lt_free(cu_backend *b) {
  if (b->lt) cublasLtDestroy(b->lt);
  if (b->lt_ws) cudaFree(b->lt_ws);
  free(b->lt_algos);
  b->lt = NULL, b->lt_ws = NULL, b->lt_algos = NULL, b->n_lt_algos = 0;
}

/* yᵀ [rows, n] (column-major) = Wᵀᵀ · xq: W [rows, cols] E4M3 row-major is cols x rows column-major, used
 * transposed; xq [n, cols] is cols x n column-major (the "TN" layout FP8 needs). f32 out, f32 accumulation.
 * Returns 0, 1 after recording an error, or 2 when cuBLASLt has no algorithm for the shape (nothing ran). */
static int lt_fp8_gemm(cu_backend *b, const void *w, const void *xq, float *y, int64_t rows, int64_t n, int64_t cols) {
  if (!b->lt) {
    if (cublasLtCreate(&b->lt) != CUBLAS_STATUS_SUCCESS) {
      b->lt = NULL;
      cu_fail(b, HEARTH_EINTERNAL, "cuBLASLt: cannot create a handle");
      return 1;
    }
    if (cudaMalloc(&b->lt_ws, CU_LT_WS) != cudaSuccess) {
      cudaGetLastError();
      b->lt_ws = NULL;
      cu_fail(b, HEARTH_ENOMEM, "cuBLASLt: no device memory for the workspace");
      return 1;
    }
    b->lt_algos = (cu_lt_algo *)calloc(CU_LT_ALGOS, sizeof(cu_lt_algo));
    if (!b->lt_algos) {
      cu_fail(b, HEARTH_ENOMEM, "cuBLASLt: out of host memory");
      return 1;
    }
  }
  cublasLtMatmulDesc_t op = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasStatus_t st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, (uint64_t)cols, (uint64_t)rows, cols);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, (uint64_t)cols, (uint64_t)n, cols);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, (uint64_t)rows, (uint64_t)n, rows);
  cu_lt_algo *ca = NULL;
  for (int i = 0; i < b->n_lt_algos && !ca; i++)
    if (b->lt_algos[i].m == rows && b->lt_algos[i].n == n && b->lt_algos[i].k == cols) ca = &b->lt_algos[i];
  cublasLtMatmulAlgo_t algo;
  bool none = false;
  if (st == CUBLAS_STATUS_SUCCESS && ca) {
    algo = ca->algo;
    none = ca->none;
  } else if (st == CUBLAS_STATUS_SUCCESS) {
    cublasLtMatmulPreference_t pref = NULL;
    size_t ws = CU_LT_WS;
    cublasLtMatmulHeuristicResult_t hr;
    int found = 0;
    st = cublasLtMatmulPreferenceCreate(&pref);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulAlgoGetHeuristic(b->lt, op, la, lb, lc, lc, pref, 1, &hr, &found);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && !found)) none = true, st = CUBLAS_STATUS_SUCCESS;
    if (st == CUBLAS_STATUS_SUCCESS) {
      if (!none) algo = hr.algo;
      cu_lt_algo *slot = &b->lt_algos[b->n_lt_algos < CU_LT_ALGOS ? b->n_lt_algos++ : (int)((rows + n + cols) % CU_LT_ALGOS)];
      *slot = (cu_lt_algo){rows, n, cols, none, none ? cublasLtMatmulAlgo_t{} : algo};
    }
  }
  const float one = 1.0f, zero = 0.0f;
  if (st == CUBLAS_STATUS_SUCCESS && !none)
    st = cublasLtMatmul(b->lt, op, &one, w, la, xq, lb, &zero, y, lc, y, lc, &algo, b->lt_ws, CU_LT_WS, b->stream);
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (op) cublasLtMatmulDescDestroy(op);
  if (st == CUBLAS_STATUS_SUCCESS && none) return 2;
  return cu_check_blas(b, st, "cuBLASLt fp8 gemm");
}

/* ---- matmul ---- */

void cu_matmul(bk_backend *be, const bk_tensor *yt, const bk_tensor *xt, const bk_weight *wt, const bk_tensor *bias) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  const int64_t n = xt->rows, cols = wt->cols, rows = wt->rows;
  if (xt->cols != cols || yt->cols != rows || yt->rows != n || (bias && bk_nelem(bias) != rows) || !wt->data) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda matmul: x [%lld, %lld] · %s [%lld, %lld]ᵀ into y [%lld, %lld]%s", (long long)n,
            (long long)xt->cols, cu_type_name(wt->type), (long long)rows, (long long)cols, (long long)yt->rows,
            (long long)yt->cols, wt->data ? "" : " (weight not loaded)");
    return;
  }
  if (n <= 0 || rows <= 0) return;
  if (rows > INT32_MAX || cols > INT32_MAX || n > INT32_MAX) {
    cu_fail(b, HEARTH_EUNSUPPORTED, "cuda matmul: shape too large for cuBLAS");
    return;
  }
  cudaSetDevice(b->device);
  cu_wdesc w = cu_make_wdesc(wt);
  const float *x = cu_f(xt);
  float *y = cu_fw(yt);
  const float *bp = bias ? cu_f(bias) : NULL;

  if (n <= (wt->type == BK_BF16 || wt->type == BK_F16 ? CU_GEMV_MAX_N_BF16 : CU_GEMV_MAX_N)) {
    if (!gemv_q8act(b, (int)n, w, x, cols, y, rows, bp)) gemv(b, (int)n, w, x, cols, y, rows, bp);
    cu_check(b, "matmul (gemv)");
    return;
  }

  const float one = 1.0f, zero = 0.0f;
  if (wt->type == BK_FP8 && b->fast_matmul && cols % 16 == 0 && rows % 16 == 0 && (uintptr_t)w.data % 16 == 0) {
    /* the activations' rows as E4M3 with a scale each, chunks of n that fit the scratch */
    int64_t per_row = cols + (int64_t)sizeof(float), chunk = (int64_t)((CU_SCRATCH_CAP - 512) / (size_t)per_row);
    if (chunk > n) chunk = n;
    char *sc = (char *)cu_scratch(b, (size_t)(chunk * per_row) + 512);
    if (!sc) return;
    float *sx = (float *)sc;
    __nv_fp8_storage_t *xq = (__nv_fp8_storage_t *)(sc + (((size_t)chunk * sizeof(float) + 255) & ~(size_t)255));
    bool fallback = false;
    for (int64_t n0 = 0; n0 < n && !fallback; n0 += chunk) {
      int64_t nc = n - n0 < chunk ? n - n0 : chunk;
      fp8_rows_kernel<<<(unsigned)nc, 256, 0, b->stream>>>(x + n0 * cols, cols, xq, sx);
      if (cu_check(b, "matmul (fp8 activations)")) return;
      int rc = lt_fp8_gemm(b, w.data, xq, y + n0 * rows, rows, nc, cols);
      if (rc == 2 && n0 == 0) {
        fallback = true; /* no FP8 algorithm for this shape: the dequantizing path below */
        break;
      }
      if (rc) {
        if (rc == 2) cu_fail(b, HEARTH_EINTERNAL, "cuBLASLt: no FP8 algorithm for a %lld-row chunk", (long long)nc);
        return;
      }
      fp8_scale_kernel<<<grid_for(nc * rows, 256), 256, 0, b->stream>>>(y + n0 * rows, nc, rows, sx, (const float *)w.scales, bp);
      if (cu_check(b, "matmul (fp8 scales)")) return;
    }
    if (!fallback) return;
  }
  if (wt->type != BK_F32 && wt->type != BK_BF16 && half_gemm(b, w, x, n, y)) {
    if (b->err.code) return;
  } else if (wt->type == BK_F32) {
    cublasStatus_t st = cublasSgemm(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)cols, &one,
                                    (const float *)w.data, (int)cols, x, (int)cols, &zero, y, (int)rows);
    if (cu_check_blas(b, st, "sgemm")) return;
  } else if (wt->type == BK_BF16) {
    /* activations as lo, mid, hi bf16 terms stacked [3 nc, cols], their products [3 nc, rows]
     * in f32, all in the scratch: chunks of n so that they fit */
    int64_t per_row = 3 * cols * (int64_t)sizeof(__nv_bfloat16) + 3 * rows * (int64_t)sizeof(float);
    int64_t chunk = (int64_t)((CU_SCRATCH_CAP - 256) / (size_t)per_row); /* (256: the products' alignment) */
    if (chunk < 1) {
      cu_fail(b, HEARTH_EUNSUPPORTED, "cuda matmul: %lld x %lld too wide for the bf16 path", (long long)rows,
              (long long)cols);
      return;
    }
    if (chunk > n) chunk = n;
    char *sc = (char *)cu_scratch(b, (size_t)(chunk * per_row) + 256);
    if (!sc) return;
    for (int64_t n0 = 0; n0 < n; n0 += chunk) {
      int64_t nc = n - n0 < chunk ? n - n0 : chunk;
      __nv_bfloat16 *lo = (__nv_bfloat16 *)sc, *mid = lo + nc * cols, *hi = mid + nc * cols;
      float *prod = (float *)(sc + (((size_t)(3 * nc * cols) * sizeof(__nv_bfloat16) + 255) & ~(size_t)255));
      if (b->fast_matmul) { /* one term: the activations rounded to bf16, straight into y */
        to_bf16_kernel<<<grid_for(nc * cols, 256), 256, 0, b->stream>>>(x + n0 * cols, nc * cols, lo);
        if (cu_check(b, "matmul (bf16 round)")) return;
        cublasStatus_t st = cublasGemmEx(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)nc, (int)cols, &one, w.data,
                                         CUDA_R_16BF, (int)cols, lo, CUDA_R_16BF, (int)cols, &zero, y + n0 * rows,
                                         CUDA_R_32F, (int)rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (cu_check_blas(b, st, "gemm bf16")) return;
        continue;
      }
      split_bf16_kernel<<<grid_for(nc * cols, 256), 256, 0, b->stream>>>(x + n0 * cols, nc * cols, hi, mid, lo);
      if (cu_check(b, "matmul (bf16 split)")) return;
      cublasStatus_t st = cublasGemmEx(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)(3 * nc), (int)cols, &one,
                                       w.data, CUDA_R_16BF, (int)cols, lo, CUDA_R_16BF, (int)cols, &zero, prod,
                                       CUDA_R_32F, (int)rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (cu_check_blas(b, st, "gemm bf16")) return;
      sum3_kernel<<<grid_for(nc * rows, 256), 256, 0, b->stream>>>(prod, nc, rows, y + n0 * rows);
      if (cu_check(b, "matmul (bf16 sum)")) return;
    }
  } else {
    /* dequantize a chunk of weight rows to f32, then sgemm into y's columns [r0, r0 + rc) */
    int64_t chunk = (int64_t)(CU_SCRATCH_CAP / ((size_t)cols * sizeof(float)));
    if (chunk < 1) {
      cu_fail(b, HEARTH_EUNSUPPORTED, "cuda matmul: %lld columns too wide to dequantize", (long long)cols);
      return;
    }
    if (chunk > rows) chunk = rows;
    float *wd = (float *)cu_scratch(b, (size_t)(chunk * cols) * sizeof(float));
    if (!wd) return;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      int64_t rc = rows - r0 < chunk ? rows - r0 : chunk;
      dequant_rows(b->stream, w, r0, rc, wd);
      if (cu_check(b, "matmul (dequantize)")) return;
      cublasStatus_t st = cublasSgemm(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rc, (int)n, (int)cols, &one, wd, (int)cols,
                                      x, (int)cols, &zero, y + r0, (int)rows);
      if (cu_check_blas(b, st, "sgemm")) return;
    }
  }
  if (bp) add_bias_kernel<<<grid_for(n * rows, 256), 256, 0, b->stream>>>(y, n, rows, bp);
  cu_check(b, "matmul");
}

/* ---- embed ---- */

/* Block t: y[t] = row ids[t] of the table times scale (rows outside the table give zeros). */
template <int T>
__global__ void embed_kernel(cu_wdesc w, const int32_t *__restrict__ ids, float *__restrict__ y, float scale) {
  const int64_t t = blockIdx.x, cols = w.cols;
  const int32_t id = ids[t];
  float *yr = y + t * cols;
  const bool ok = id >= 0 && id < w.rows;
  const int64_t nsub = cols / 32;
  for (int64_t s = threadIdx.x; s < nsub; s += blockDim.x) {
    float v[32];
    if (ok) cu_load_sub<T>(w, id, s, v);
#pragma unroll
    for (int k = 0; k < 32; k++) yr[32 * s + k] = ok ? __fmul_rn(v[k], scale) : 0.0f;
  }
  if (cu_has_tail<T>())
    for (int64_t k = nsub * 32 + threadIdx.x; k < cols; k += blockDim.x)
      yr[k] = ok ? __fmul_rn(cu_load_elem<T>(w, id, k), scale) : 0.0f;
}

template <int T>
static void launch_embed(int64_t n, const cu_wdesc &w, const int32_t *ids, float *y, float scale, cudaStream_t st) {
  embed_kernel<T><<<(unsigned)n, 128, 0, st>>>(w, ids, y, scale);
}

void cu_embed(bk_backend *be, const bk_tensor *y, const bk_weight *table, const bk_tensor *ids, float scale) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  const int64_t n = y->rows;
  if (y->cols != table->cols || bk_nelem(ids) < n || ids->dt != BK_DT_I32 || !table->data) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda embed: y [%lld, %lld] from a %s table [%lld, %lld] with %lld ids", (long long)y->rows,
            (long long)y->cols, cu_type_name(table->type), (long long)table->rows, (long long)table->cols,
            (long long)bk_nelem(ids));
    return;
  }
  if (n <= 0) return;
  if (n > INT32_MAX) {
    cu_fail(b, HEARTH_EUNSUPPORTED, "cuda embed: %lld rows", (long long)n);
    return;
  }
  cudaSetDevice(b->device);
  cu_wdesc w = cu_make_wdesc(table);
  const float s = scale != 0.0f ? scale : 1.0f;
  const int32_t *id = cu_i(ids);
  float *yp = cu_fw(y);
  cudaStream_t st = b->stream;
  switch (table->type) {
    case BK_F32: launch_embed<BK_F32>(n, w, id, yp, s, st); break;
    case BK_F16: launch_embed<BK_F16>(n, w, id, yp, s, st); break;
    case BK_BF16: launch_embed<BK_BF16>(n, w, id, yp, s, st); break;
    case BK_Q8_0: launch_embed<BK_Q8_0>(n, w, id, yp, s, st); break;
    case BK_Q4_0: launch_embed<BK_Q4_0>(n, w, id, yp, s, st); break;
    case BK_Q4_K: launch_embed<BK_Q4_K>(n, w, id, yp, s, st); break;
    case BK_Q5_K: launch_embed<BK_Q5_K>(n, w, id, yp, s, st); break;
    case BK_Q6_K: launch_embed<BK_Q6_K>(n, w, id, yp, s, st); break;
    case BK_Q5_0: launch_embed<BK_Q5_0>(n, w, id, yp, s, st); break;
    case BK_Q5_1: launch_embed<BK_Q5_1>(n, w, id, yp, s, st); break;
    case BK_Q2_K: launch_embed<BK_Q2_K>(n, w, id, yp, s, st); break;
    case BK_Q3_K: launch_embed<BK_Q3_K>(n, w, id, yp, s, st); break;
    case BK_IQ4_NL: launch_embed<BK_IQ4_NL>(n, w, id, yp, s, st); break;
    case BK_IQ4_XS: launch_embed<BK_IQ4_XS>(n, w, id, yp, s, st); break;
    case BK_MLX_AFFINE: launch_embed<BK_MLX_AFFINE>(n, w, id, yp, s, st); break;
    case BK_FP8: launch_embed<BK_FP8>(n, w, id, yp, s, st); break;
    default: cu_fail(b, HEARTH_EUNSUPPORTED, "cuda embed: table type %d", (int)table->type); return;
  }
  cu_check(b, "embed");
}
