/* attention.cu — causal attention over the paged KV arenas (GQA, sliding
 * window, softcap), f32 throughout with an online softmax.
 *
 * Two kernels share the work of one call, split by the batch layout that
 * bk_attention promises (queries of one sequence are contiguous):
 *   - decode: for queries that are the only one of their sequence in the
 *     batch (every query when T == 1), one block of 4 warps per (query, KV
 *     head) that serves the group of query heads sharing that KV head (group
 *     sizes 1, 2, 4, 8; other ratios: a block per query head), so each K / V
 *     row is read once per group. Each warp takes 32 keys at a time, one key
 *     per lane for the scores, then all lanes accumulate V over the head
 *     dimension. When the batch is small, each query's keys are split over
 *     up to 128 blocks (flash-decoding: about eight blocks per multiprocessor)
 *     whose partial softmax states a second kernel merges.
 *   - flash: one block per (tile of 32 consecutive queries, head) for the
 *     other queries. Runs of queries in the tile that share a block table are
 *     one segment; for each segment, K / V tiles of 32 rows are loaded into
 *     shared memory once and used by all the segment's queries, each query
 *     masking the rows outside its causal / window range.
 * Row j of a query's sequence lives in slot tables[tab + j / B] * B + j % B.
 * Quantized arenas (8 / 4-bit blocks, kv_quant.cuh) are dequantized as they
 * are read: in the decode kernel per key (whole blocks of 32 when a head
 * starts and ends on block boundaries) and per value element, in the flash
 * kernel as its K / V tiles are loaded into shared memory. Under the fast
 * precision (--gpu-precision fast) the tiles of queries go to tensor cores
 * instead (attn_flash_tc_kernel, FlashAttention-2's shape: bf16 operands
 * through mma.sync, the scores, softmax and output rows in registers). */
#include <limits.h>
#include <mma.h>

#include "backend/cuda/kv_quant.cuh"

#define AT_MAX_HD 256
#define AT_DI (AT_MAX_HD / 32) /* head dims per lane */
#define DEC_WARPS 4 /* the merge at the end of the decode kernel names all 4 */
#define FL_BQ 32
#define FL_BK 32
#define FL_WARPS 8
#define FL_QW (FL_BQ / FL_WARPS) /* queries per warp */

struct at_args {
  float *out;
  const float *q, *K, *V;
  const int32_t *row, *tab, *tables;
  const int32_t *last; /* NULL, or the last row each query sees (a bidirectional span) */
  int T, H, KVH, hd, B, window;
  int64_t kstride, vstride; /* 4-byte words from one slot's K (V) row to the next */
  int kfmt, vfmt;           /* bk_kv_fmt of the arenas */
  int blk32;                /* quantized: each head's slice is whole blocks of 32 */
  float scale, softcap;
  int all;   /* decode kernel: every query (else only the ones alone in their sequence) */
  int vec4;  /* K rows and head offsets 16-byte aligned */
  int vvec4; /* K and V both f32 and 16-byte aligned (the decode kernel's float4 path) */
  int nsplit;   /* decode: key range split over this many blocks per (query, head) */
  float *part;  /* nsplit > 1: [T * H * nsplit][hd + 2] partial (m, l, unnormalized o) */
};

static __device__ __forceinline__ float at_wmax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

static __device__ __forceinline__ float at_wsum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Whether query t is the only query of its sequence in the batch. */
static __device__ __forceinline__ bool at_alone(const at_args &a, int t) {
  const int tv = a.tab[t];
  return (t == 0 || a.tab[t - 1] != tv) && (t == a.T - 1 || a.tab[t + 1] != tv);
}

static __device__ __forceinline__ int64_t at_slot(const at_args &a, int tv, int j) {
  return (int64_t)a.tables[tv + j / a.B] * a.B + j % a.B;
}

static __device__ __forceinline__ float at_score(const at_args &a, float dot) {
  float s = __fmul_rn(dot, a.scale);
  if (a.softcap > 0) s = __fmul_rn(a.softcap, tanhf(s / a.softcap));
  return s;
}

/* The last row query t sees: its own, or the end of its bidirectional span. */
static __device__ __forceinline__ int at_top(const at_args &a, int t) {
  return a.last ? max(a.last[t], a.row[t]) : a.row[t];
}

static __device__ __forceinline__ int at_lo(const at_args &a, int r) {
  return a.window > 0 && r - a.window + 1 > 0 ? r - a.window + 1 : 0;
}

/* ---- decode ---- */

__global__ void __launch_bounds__(DEC_WARPS * 32, 4) attn_decode_kernel(at_args a) {
  const int t = blockIdx.x, h = blockIdx.y, sp = blockIdx.z;
  if (!a.all && !at_alone(a, t)) return;
  __shared__ __align__(16) float qs[AT_MAX_HD];
  __shared__ float wm[DEC_WARPS], wl[DEC_WARPS];
  __shared__ float wo[DEC_WARPS][AT_MAX_HD];
  const int hd = a.hd, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kvh = h / (a.H / a.KVH);
  const float *qp = a.q + ((int64_t)t * a.H + h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qp[d];
  __syncthreads();
  const int rq = a.row[t], tv = a.tab[t], hi = at_top(a, t) + 1, lo = at_lo(a, rq);
  /* this block's share of [lo, hi): whole chunks of 32 rows */
  const int per = ((max(hi - lo, 0) + a.nsplit - 1) / a.nsplit + 31) & ~31;
  const int b0 = lo + sp * per, b1 = min(hi, b0 + per);
  const int64_t hoff = (int64_t)kvh * hd; /* the head's first element in a row */
  float m = -INFINITY, l = 0.0f, acc[AT_DI];
#pragma unroll
  for (int i = 0; i < AT_DI; i++) acc[i] = 0.0f;
  for (int c0 = b0 + warp * 32; c0 < b1; c0 += DEC_WARPS * 32) {
    const int j = c0 + lane;
    const bool valid = j < b1;
    int64_t sl = 0;
    float s = -INFINITY;
    if (valid) {
      sl = at_slot(a, tv, j);
      const float *kp = a.K + sl * a.kstride + (a.kfmt == BK_KV_F32 ? hoff : 0);
      float dot = 0.0f;
      if (a.kfmt != BK_KV_F32 && a.blk32) {
        const int bb = kvq_block_bytes(a.kfmt);
        const unsigned char *blk = (const unsigned char *)kp + (hoff >> 5) * bb;
        for (int b0 = 0; b0 < hd; b0 += 32, blk += bb) {
          const float sc = *(const float *)blk;
          if (a.kfmt == BK_KV_Q8) {
#pragma unroll
            for (int w = 0; w < 8; w++) {
              const int v = *(const int *)(blk + 4 + 4 * w);
#pragma unroll
              for (int k = 0; k < 4; k++) dot = fmaf(qs[b0 + 4 * w + k], __fmul_rn(sc, (float)(signed char)(v >> (8 * k))), dot);
            }
          } else {
#pragma unroll
            for (int w = 0; w < 4; w++) { /* byte 4w + k: elements 4w + k (low nibble) and 4w + k + 16 (high) */
              const unsigned v = *(const unsigned *)(blk + 4 + 4 * w);
#pragma unroll
              for (int k = 0; k < 4; k++) {
                dot = fmaf(qs[b0 + 4 * w + k], __fmul_rn(sc, (float)((int)((v >> (8 * k)) & 15u) - 8)), dot);
                dot = fmaf(qs[b0 + 16 + 4 * w + k], __fmul_rn(sc, (float)((int)((v >> (8 * k + 4)) & 15u) - 8)), dot);
              }
            }
          }
        }
      } else if (a.kfmt != BK_KV_F32) {
        for (int d = 0; d < hd; d++) dot = fmaf(qs[d], kvq_elem(kp, a.kfmt, hoff + d), dot);
      } else if (a.vec4) {
#pragma unroll 8
        for (int d = 0; d < hd; d += 4) {
          float4 k4 = *(const float4 *)(kp + d), q4 = *(const float4 *)(qs + d);
          dot = fmaf(q4.x, k4.x, dot);
          dot = fmaf(q4.y, k4.y, dot);
          dot = fmaf(q4.z, k4.z, dot);
          dot = fmaf(q4.w, k4.w, dot);
        }
      } else {
#pragma unroll 8
        for (int d = 0; d < hd; d++) dot = fmaf(qs[d], kp[d], dot);
      }
      s = at_score(a, dot);
    }
    const float mn = fmaxf(m, at_wmax(s)); /* finite: lane 0 always has a row */
    const float alpha = expf(m - mn);
    const float p = valid ? expf(s - mn) : 0.0f;
    l = l * alpha + at_wsum(p);
    m = mn;
#pragma unroll
    for (int i = 0; i < AT_DI; i++) acc[i] *= alpha;
    const int nv = b1 - c0 < 32 ? b1 - c0 : 32;
#pragma unroll 4
    for (int jj = 0; jj < nv; jj++) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
      const int64_t sj = __shfl_sync(0xffffffffu, sl, jj);
      const float *vp = a.V + sj * a.vstride;
      if (a.vfmt == BK_KV_F32) {
#pragma unroll
        for (int i = 0; i < AT_DI; i++)
          if (lane + 32 * i < hd) acc[i] = fmaf(pj, vp[hoff + lane + 32 * i], acc[i]);
      } else {
#pragma unroll
        for (int i = 0; i < AT_DI; i++)
          if (lane + 32 * i < hd) acc[i] = fmaf(pj, kvq_elem(vp, a.vfmt, hoff + lane + 32 * i), acc[i]);
      }
    }
  }
  if (lane == 0) wm[warp] = m, wl[warp] = l;
#pragma unroll
  for (int i = 0; i < AT_DI; i++)
    if (lane + 32 * i < hd) wo[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float M = -INFINITY, L = 0.0f, f[DEC_WARPS];
#pragma unroll
  for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, wm[w]);
#pragma unroll
  for (int w = 0; w < DEC_WARPS; w++) {
    f[w] = wm[w] == -INFINITY ? 0.0f : expf(wm[w] - M);
    L += wl[w] * f[w];
  }
  const bool whole = a.nsplit == 1;
  float *dst = whole ? a.out + ((int64_t)t * a.H + h) * hd : a.part + (((int64_t)t * a.H + h) * a.nsplit + sp) * (hd + 2);
  if (!whole && threadIdx.x == 0) dst[0] = M, dst[1] = L;
  if (!whole) dst += 2;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    const float o = wo[0][d] * f[0] + wo[1][d] * f[1] + wo[2][d] * f[2] + wo[3][d] * f[3];
    dst[d] = !whole ? o : L > 0.0f ? o / L : 0.0f;
  }
}

/* The decode kernel for a group of G query heads sharing one KV head
 * (GQA; G = 1 is plain multi-head): block (t, kv head, split) reads each key
 * and value row of its range once for all G heads, so the cache crosses
 * from memory (and L2) once per KV head instead of once per query head.
 * Each warp takes 32 keys at a time, one key per lane: the lane's K row is
 * dotted with the G queries (staged in shared memory), each head keeps its
 * own online softmax, then the 32 V rows are read across the lanes (lane l
 * holds head dims l, l + 32, ...) and accumulated into the G heads. DI is
 * the head dims per lane (hd <= 32 * DI). Partials as attn_decode_kernel's. */
template <int G, int DI>
__global__ void __launch_bounds__(DEC_WARPS * 32) attn_decode_gqa_kernel(at_args a) {
  const int t = blockIdx.x, kvh = blockIdx.y, sp = blockIdx.z;
  if (!a.all && !at_alone(a, t)) return;
  __shared__ __align__(16) float qs[G][DI * 32];
  __shared__ float wm[DEC_WARPS][G], wl[DEC_WARPS][G];
  __shared__ float wo[DEC_WARPS][G][DI * 32];
  const int hd = a.hd, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h0 = kvh * G;
  for (int i = threadIdx.x; i < G * hd; i += blockDim.x) {
    const int g = i / hd, d = i % hd;
    qs[g][d] = a.q[((int64_t)t * a.H + h0 + g) * hd + d];
  }
  __syncthreads();
  const int rq = a.row[t], tv = a.tab[t], hi = rq + 1, lo = at_lo(a, rq);
  const int per = ((max(hi - lo, 0) + a.nsplit - 1) / a.nsplit + 31) & ~31;
  const int b0 = lo + sp * per, b1 = min(hi, b0 + per);
  const int64_t hoff = (int64_t)kvh * hd;
  float m[G], l[G], acc[G][DI];
#pragma unroll
  for (int g = 0; g < G; g++) {
    m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < DI; i++) acc[g][i] = 0.0f;
  }
  for (int c0 = b0 + warp * 32; c0 < b1; c0 += DEC_WARPS * 32) {
    const int j = c0 + lane;
    const bool valid = j < b1;
    int64_t sl = 0;
    float dot[G];
#pragma unroll
    for (int g = 0; g < G; g++) dot[g] = 0.0f;
    if (valid) {
      sl = at_slot(a, tv, j);
      const float *kp = a.K + sl * a.kstride + (a.kfmt == BK_KV_F32 ? hoff : 0);
      if (a.kfmt != BK_KV_F32 && a.blk32) {
        const int bb = kvq_block_bytes(a.kfmt);
        const unsigned char *blk = (const unsigned char *)kp + (hoff >> 5) * bb;
        for (int d0 = 0; d0 < hd; d0 += 32, blk += bb) {
          const float sc = *(const float *)blk;
          float kv[32];
          if (a.kfmt == BK_KV_Q8) {
#pragma unroll
            for (int w = 0; w < 8; w++) {
              const int v = *(const int *)(blk + 4 + 4 * w);
#pragma unroll
              for (int k = 0; k < 4; k++) kv[4 * w + k] = __fmul_rn(sc, (float)(signed char)(v >> (8 * k)));
            }
          } else {
#pragma unroll
            for (int w = 0; w < 4; w++) {
              const unsigned v = *(const unsigned *)(blk + 4 + 4 * w);
#pragma unroll
              for (int k = 0; k < 4; k++) {
                kv[4 * w + k] = __fmul_rn(sc, (float)((int)((v >> (8 * k)) & 15u) - 8));
                kv[16 + 4 * w + k] = __fmul_rn(sc, (float)((int)((v >> (8 * k + 4)) & 15u) - 8));
              }
            }
          }
#pragma unroll
          for (int k = 0; k < 32; k++)
#pragma unroll
            for (int g = 0; g < G; g++) dot[g] = fmaf(qs[g][d0 + k], kv[k], dot[g]);
        }
      } else if (a.kfmt != BK_KV_F32) {
        for (int d = 0; d < hd; d++) {
          const float kv = kvq_elem(kp, a.kfmt, hoff + d);
#pragma unroll
          for (int g = 0; g < G; g++) dot[g] = fmaf(qs[g][d], kv, dot[g]);
        }
      } else if (a.vec4) {
#pragma unroll 4
        for (int d = 0; d < hd; d += 4) {
          const float4 k4 = *(const float4 *)(kp + d);
#pragma unroll
          for (int g = 0; g < G; g++) {
            const float4 q4 = *(const float4 *)(&qs[g][d]);
            dot[g] = fmaf(q4.x, k4.x, dot[g]);
            dot[g] = fmaf(q4.y, k4.y, dot[g]);
            dot[g] = fmaf(q4.z, k4.z, dot[g]);
            dot[g] = fmaf(q4.w, k4.w, dot[g]);
          }
        }
      } else {
        for (int d = 0; d < hd; d++) {
          const float kv = kp[d];
#pragma unroll
          for (int g = 0; g < G; g++) dot[g] = fmaf(qs[g][d], kv, dot[g]);
        }
      }
    }
    float p[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
      const float s = valid ? at_score(a, dot[g]) : -INFINITY;
      const float mn = fmaxf(m[g], at_wmax(s)); /* finite: lane 0 always has a row */
      const float alpha = expf(m[g] - mn);
      p[g] = valid ? expf(s - mn) : 0.0f;
      l[g] = l[g] * alpha + at_wsum(p[g]);
      m[g] = mn;
#pragma unroll
      for (int i = 0; i < DI; i++) acc[g][i] *= alpha;
    }
    const int nv = b1 - c0 < 32 ? b1 - c0 : 32;
#pragma unroll 2
    for (int jj = 0; jj < nv; jj++) {
      const int64_t sj = __shfl_sync(0xffffffffu, sl, jj);
      const float *vp = a.V + sj * a.vstride;
      float v[DI];
#pragma unroll
      for (int i = 0; i < DI; i++) {
        const int d = lane + 32 * i;
        v[i] = d < hd ? (a.vfmt == BK_KV_F32 ? vp[hoff + d] : kvq_elem(vp, a.vfmt, hoff + d)) : 0.0f;
      }
#pragma unroll
      for (int g = 0; g < G; g++) {
        const float pj = __shfl_sync(0xffffffffu, p[g], jj);
#pragma unroll
        for (int i = 0; i < DI; i++) acc[g][i] = fmaf(pj, v[i], acc[g][i]);
      }
    }
  }
#pragma unroll
  for (int g = 0; g < G; g++) {
    if (lane == 0) wm[warp][g] = m[g], wl[warp][g] = l[g];
#pragma unroll
    for (int i = 0; i < DI; i++)
      if (lane + 32 * i < hd) wo[warp][g][lane + 32 * i] = acc[g][i];
  }
  __syncthreads();
  const bool whole = a.nsplit == 1;
  for (int g = warp; g < G; g += DEC_WARPS) { /* warp w merges heads w, w + 4, ... */
    float M = -INFINITY, L = 0.0f, f[DEC_WARPS];
#pragma unroll
    for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, wm[w][g]);
#pragma unroll
    for (int w = 0; w < DEC_WARPS; w++) {
      f[w] = wm[w][g] == -INFINITY ? 0.0f : expf(wm[w][g] - M);
      L += wl[w][g] * f[w];
    }
    const int h = h0 + g;
    float *dst = whole ? a.out + ((int64_t)t * a.H + h) * hd : a.part + (((int64_t)t * a.H + h) * a.nsplit + sp) * (hd + 2);
    if (!whole && lane == 0) dst[0] = M, dst[1] = L;
    if (!whole) dst += 2;
    for (int d = lane; d < hd; d += 32) {
      const float o = wo[0][g][d] * f[0] + wo[1][g][d] * f[1] + wo[2][g][d] * f[2] + wo[3][g][d] * f[3];
      dst[d] = !whole ? o : L > 0.0f ? o / L : 0.0f;
    }
  }
}

/* The same for f32 K and V rows that are 16-byte aligned (the default
 * cache): lane l's K row is read as float4s eight at a time, and each V row
 * as one float4 per lane (head dims 4l .. 4l + 3, then 128 further per DV),
 * eight rows in flight, so a warp keeps many loads outstanding. Q8: 8-bit
 * rows whose head slices are whole blocks, read a block's scale and its
 * codes a word at a time (a lane's four V dims are one word). */
template <int G, int DV, bool Q8>
__global__ void __launch_bounds__(DEC_WARPS * 32) attn_decode_f32_kernel(at_args a) {
  const int t = blockIdx.x, kvh = blockIdx.y, sp = blockIdx.z;
  if (!a.all && !at_alone(a, t)) return;
  __shared__ __align__(16) float qs[G][DV * 128];
  __shared__ float wm[DEC_WARPS][G], wl[DEC_WARPS][G];
  __shared__ __align__(16) float wo[DEC_WARPS][G][DV * 128];
  const int hd = a.hd, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h0 = kvh * G;
  for (int i = threadIdx.x; i < G * hd; i += blockDim.x) {
    const int g = i / hd, d = i % hd;
    qs[g][d] = a.q[((int64_t)t * a.H + h0 + g) * hd + d];
  }
  __syncthreads();
  const int rq = a.row[t], tv = a.tab[t], hi = rq + 1, lo = at_lo(a, rq);
  const int per = ((max(hi - lo, 0) + a.nsplit - 1) / a.nsplit + 31) & ~31;
  const int b0 = lo + sp * per, b1 = min(hi, b0 + per);
  const int64_t hoff = (int64_t)kvh * hd;
  float m[G], l[G];
  float4 acc[G][DV];
#pragma unroll
  for (int g = 0; g < G; g++) {
    m[g] = -INFINITY, l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < DV; i++) acc[g][i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  for (int c0 = b0 + warp * 32; c0 < b1; c0 += DEC_WARPS * 32) {
    const int j = c0 + lane;
    const bool valid = j < b1;
    int64_t sl = 0;
    float dot[G];
#pragma unroll
    for (int g = 0; g < G; g++) dot[g] = 0.0f;
    if (valid && Q8) { /* 8-bit rows: per block of 32, its scale and eight words of codes */
      sl = at_slot(a, tv, j);
      const unsigned char *blk = (const unsigned char *)(a.K + sl * a.kstride) + (hoff >> 5) * 36;
#pragma unroll
      for (int d0 = 0; d0 < DV * 128; d0 += 32, blk += 36) {
        if (d0 >= hd) break;
        const float sc = *(const float *)blk;
        int w[8];
#pragma unroll
        for (int u = 0; u < 8; u++) w[u] = __ldg((const int *)(blk + 4) + u);
#pragma unroll
        for (int u = 0; u < 8; u++)
#pragma unroll
          for (int k = 0; k < 4; k++) {
            const float kv = __fmul_rn(sc, (float)(signed char)(w[u] >> (8 * k)));
#pragma unroll
            for (int g = 0; g < G; g++) dot[g] = fmaf(qs[g][d0 + 4 * u + k], kv, dot[g]);
          }
      }
    } else if (valid) {
      sl = at_slot(a, tv, j);
      const float4 *kp = (const float4 *)(a.K + sl * a.kstride + hoff);
#pragma unroll
      for (int d0 = 0; d0 < DV * 128; d0 += 32) {
        if (d0 >= hd) break;
        float4 k4[8];
#pragma unroll
        for (int u = 0; u < 8; u++) k4[u] = d0 + 4 * u < hd ? __ldg(kp + d0 / 4 + u) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int u = 0; u < 8; u++)
#pragma unroll
          for (int g = 0; g < G; g++) {
            if (d0 + 4 * u >= hd) continue;
            const float4 q4 = *(const float4 *)(&qs[g][d0 + 4 * u]);
            dot[g] = fmaf(q4.x, k4[u].x, dot[g]);
            dot[g] = fmaf(q4.y, k4[u].y, dot[g]);
            dot[g] = fmaf(q4.z, k4[u].z, dot[g]);
            dot[g] = fmaf(q4.w, k4[u].w, dot[g]);
          }
      }
    }
    float p[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
      const float s = valid ? at_score(a, dot[g]) : -INFINITY;
      const float mn = fmaxf(m[g], at_wmax(s)); /* finite: lane 0 always has a row */
      const float alpha = expf(m[g] - mn);
      p[g] = valid ? expf(s - mn) : 0.0f;
      l[g] = l[g] * alpha + at_wsum(p[g]);
      m[g] = mn;
#pragma unroll
      for (int i = 0; i < DV; i++) acc[g][i].x *= alpha, acc[g][i].y *= alpha, acc[g][i].z *= alpha, acc[g][i].w *= alpha;
    }
    const int nv = b1 - c0 < 32 ? b1 - c0 : 32;
    for (int j0 = 0; j0 < nv; j0 += 8) {
      float4 v[8][DV];
#pragma unroll
      for (int u = 0; u < 8; u++) {
        const int64_t sj = __shfl_sync(0xffffffffu, sl, (j0 + u) & 31);
        if (Q8) { /* head dims 4 lane + 128 i: block lane / 8 + 4 i, word lane % 8 of its codes */
          const unsigned char *vb = (const unsigned char *)(a.V + sj * a.vstride) + (hoff >> 5) * 36;
#pragma unroll
          for (int i = 0; i < DV; i++) {
            v[u][i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (j0 + u < nv && 4 * lane + 128 * i < hd) {
              const unsigned char *bk = vb + (lane / 8 + 4 * i) * 36;
              const float sc = *(const float *)bk;
              const int w = __ldg((const int *)(bk + 4) + lane % 8);
              v[u][i] = make_float4(__fmul_rn(sc, (float)(signed char)w), __fmul_rn(sc, (float)(signed char)(w >> 8)),
                                    __fmul_rn(sc, (float)(signed char)(w >> 16)), __fmul_rn(sc, (float)(signed char)(w >> 24)));
            }
          }
          continue;
        }
        const float4 *vp = (const float4 *)(a.V + sj * a.vstride + hoff);
#pragma unroll
        for (int i = 0; i < DV; i++)
          v[u][i] = j0 + u < nv && 4 * lane + 128 * i < hd ? __ldg(vp + lane + 32 * i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < 8; u++)
#pragma unroll
        for (int g = 0; g < G; g++) {
          const float pj = __shfl_sync(0xffffffffu, p[g], (j0 + u) & 31); /* 0 past nv: invalid lanes hold p = 0 */
#pragma unroll
          for (int i = 0; i < DV; i++) {
            acc[g][i].x = fmaf(pj, v[u][i].x, acc[g][i].x);
            acc[g][i].y = fmaf(pj, v[u][i].y, acc[g][i].y);
            acc[g][i].z = fmaf(pj, v[u][i].z, acc[g][i].z);
            acc[g][i].w = fmaf(pj, v[u][i].w, acc[g][i].w);
          }
        }
    }
  }
#pragma unroll
  for (int g = 0; g < G; g++) {
    if (lane == 0) wm[warp][g] = m[g], wl[warp][g] = l[g];
#pragma unroll
    for (int i = 0; i < DV; i++)
      if (4 * lane + 128 * i < hd) *(float4 *)(&wo[warp][g][4 * lane + 128 * i]) = acc[g][i];
  }
  __syncthreads();
  const bool whole = a.nsplit == 1;
  for (int g = warp; g < G; g += DEC_WARPS) {
    float M = -INFINITY, L = 0.0f, f[DEC_WARPS];
#pragma unroll
    for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, wm[w][g]);
#pragma unroll
    for (int w = 0; w < DEC_WARPS; w++) {
      f[w] = wm[w][g] == -INFINITY ? 0.0f : expf(wm[w][g] - M);
      L += wl[w][g] * f[w];
    }
    const int h = h0 + g;
    float *dst = whole ? a.out + ((int64_t)t * a.H + h) * hd : a.part + (((int64_t)t * a.H + h) * a.nsplit + sp) * (hd + 2);
    if (!whole && lane == 0) dst[0] = M, dst[1] = L;
    if (!whole) dst += 2;
    for (int d = lane; d < hd; d += 32) {
      const float o = wo[0][g][d] * f[0] + wo[1][g][d] * f[1] + wo[2][g][d] * f[2] + wo[3][g][d] * f[3];
      dst[d] = !whole ? o : L > 0.0f ? o / L : 0.0f;
    }
  }
}

template <int G>
static void launch_decode_gqa(const at_args &a, dim3 grid, cudaStream_t st) {
  const bool q8 = a.kfmt == BK_KV_Q8 && a.vfmt == BK_KV_Q8 && a.blk32;
  if (a.vvec4 && a.hd <= 128) attn_decode_f32_kernel<G, 1, false><<<grid, DEC_WARPS * 32, 0, st>>>(a);
  else if (a.vvec4) attn_decode_f32_kernel<G, 2, false><<<grid, DEC_WARPS * 32, 0, st>>>(a);
  else if (q8 && a.hd <= 128) attn_decode_f32_kernel<G, 1, true><<<grid, DEC_WARPS * 32, 0, st>>>(a);
  else if (q8) attn_decode_f32_kernel<G, 2, true><<<grid, DEC_WARPS * 32, 0, st>>>(a);
  else if (a.hd <= 128) attn_decode_gqa_kernel<G, 4><<<grid, DEC_WARPS * 32, 0, st>>>(a);
  else attn_decode_gqa_kernel<G, 8><<<grid, DEC_WARPS * 32, 0, st>>>(a);
}

/* Block (t, h): out = the decode kernel's nsplit partials merged. */
__global__ void attn_combine_kernel(at_args a) {
  const int t = blockIdx.x, h = blockIdx.y;
  if (!a.all && !at_alone(a, t)) return;
  const int hd = a.hd;
  const float *pp = a.part + ((int64_t)t * a.H + h) * a.nsplit * (hd + 2);
  float M = -INFINITY;
  for (int sp = 0; sp < a.nsplit; sp++) M = fmaxf(M, pp[sp * (hd + 2)]);
  float *op = a.out + ((int64_t)t * a.H + h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float L = 0.0f, o = 0.0f;
    for (int sp = 0; sp < a.nsplit; sp++) {
      const float *ps = pp + sp * (hd + 2);
      const float f = ps[0] == -INFINITY ? 0.0f : expf(ps[0] - M);
      L += ps[1] * f;
      o += ps[2 + d] * f;
    }
    op[d] = L > 0.0f ? o / L : 0.0f;
  }
}

/* ---- flash (tiles of queries of one sequence) ---- */

static size_t flash_smem(int hd) {
  return (size_t)(FL_BQ * hd + FL_BK * (hd + 1) + FL_BK * hd + FL_BQ * FL_BK) * sizeof(float) + FL_BK * sizeof(int64_t);
}

__global__ void __launch_bounds__(FL_WARPS * 32) attn_flash_kernel(at_args a) {
  extern __shared__ __align__(16) float sm[];
  const int hd = a.hd, hdp = hd + 1;
  float *Qs = sm;                  /* [BQ][hd] */
  float *Ks = Qs + FL_BQ * hd;     /* [BK][hd + 1] */
  float *Vs = Ks + FL_BK * hdp;    /* [BK][hd] */
  float *Ps = Vs + FL_BK * hd;     /* [BQ][BK] */
  int64_t *Ss = (int64_t *)(Ps + FL_BQ * FL_BK); /* slots of the K / V tile; offset is even in floats */
  const int t0 = blockIdx.x * FL_BQ, t1 = min(a.T, t0 + FL_BQ), h = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kvh = h / (a.H / a.KVH);
  const int64_t hoff = (int64_t)kvh * hd;
  for (int s = t0; s < t1;) {
    const int tv = a.tab[s], s0 = s;
    int e = s + 1;
    while (e < t1 && a.tab[e] == tv) e++;
    s = e;
    if (e - s0 == 1 && at_alone(a, s0)) continue; /* the decode kernel's */
    const int nq = e - s0;
    int jlo = INT_MAX, jhi = 0;
    for (int i = 0; i < nq; i++) {
      const int r = a.row[s0 + i];
      jlo = min(jlo, at_lo(a, r));
      jhi = max(jhi, at_top(a, s0 + i) + 1);
    }
    __syncthreads(); /* the previous segment is done with shared memory */
    for (int idx = threadIdx.x; idx < FL_BQ * hd; idx += blockDim.x) {
      const int qi = idx / hd, d = idx % hd;
      Qs[idx] = qi < nq ? a.q[((int64_t)(s0 + qi) * a.H + h) * hd + d] : 0.0f;
    }
    int rowq[FL_QW], loq[FL_QW];
    float m[FL_QW], l[FL_QW], o[FL_QW][AT_DI];
#pragma unroll
    for (int k = 0; k < FL_QW; k++) {
      const int qi = warp * FL_QW + k;
      rowq[k] = qi < nq ? at_top(a, s0 + qi) : -1;
      loq[k] = qi < nq ? at_lo(a, a.row[s0 + qi]) : 0;
      m[k] = -INFINITY;
      l[k] = 0.0f;
#pragma unroll
      for (int i = 0; i < AT_DI; i++) o[k][i] = 0.0f;
    }
    for (int j0 = jlo; j0 < jhi; j0 += FL_BK) {
      const int nk = min(FL_BK, jhi - j0);
      __syncthreads(); /* the previous tile is consumed */
      if (threadIdx.x < nk) Ss[threadIdx.x] = at_slot(a, tv, j0 + threadIdx.x);
      __syncthreads();
      if (a.vvec4 && hd <= 128) { /* f32 rows: up to four float4 pieces of K and of V per thread, all loaded first */
        const int q4 = hd / 4, np = FL_BK * q4;
        float4 kv4[4], vv4[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
          const int pc = threadIdx.x + u * FL_WARPS * 32, jj = pc / q4, d = 4 * (pc % q4);
          const bool in = pc < np && jj < nk;
          kv4[u] = in ? __ldg((const float4 *)(a.K + Ss[jj] * a.kstride + hoff + d)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          vv4[u] = in ? __ldg((const float4 *)(a.V + Ss[jj] * a.vstride + hoff + d)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
          const int pc = threadIdx.x + u * FL_WARPS * 32, jj = pc / q4, d = 4 * (pc % q4);
          if (pc >= np) continue;
          float *kd = Ks + jj * hdp + d, *vd = Vs + jj * hd + d;
          kd[0] = kv4[u].x, kd[1] = kv4[u].y, kd[2] = kv4[u].z, kd[3] = kv4[u].w;
          vd[0] = vv4[u].x, vd[1] = vv4[u].y, vd[2] = vv4[u].z, vd[3] = vv4[u].w;
        }
      } else
#pragma unroll 4
      for (int idx = threadIdx.x; idx < FL_BK * hd; idx += blockDim.x) {
        const int jj = idx / hd, d = idx % hd;
        float kv = 0.0f, vv = 0.0f;
        if (jj < nk) {
          kv = kvq_elem(a.K + Ss[jj] * a.kstride, a.kfmt, hoff + d);
          vv = kvq_elem(a.V + Ss[jj] * a.vstride, a.vfmt, hoff + d);
        }
        Ks[jj * hdp + d] = kv;
        Vs[jj * hd + d] = vv;
      }
      __syncthreads();
      /* this warp's queries against key lane of the tile */
      float dot[FL_QW];
#pragma unroll
      for (int k = 0; k < FL_QW; k++) dot[k] = 0.0f;
      const float *kr = Ks + lane * hdp, *qw = Qs + warp * FL_QW * hd;
      for (int d = 0; d < hd; d++) {
        const float kd = kr[d];
#pragma unroll
        for (int k = 0; k < FL_QW; k++) dot[k] = fmaf(qw[k * hd + d], kd, dot[k]);
      }
      const int j = j0 + lane;
#pragma unroll
      for (int k = 0; k < FL_QW; k++) {
        const bool ok = lane < nk && j <= rowq[k] && j >= loq[k];
        const float sc = ok ? at_score(a, dot[k]) : -INFINITY;
        const float mn = fmaxf(m[k], at_wmax(sc));
        float alpha = 1.0f, p = 0.0f;
        if (mn != -INFINITY) {
          alpha = expf(m[k] - mn);
          p = ok ? expf(sc - mn) : 0.0f;
        }
        l[k] = l[k] * alpha + at_wsum(p);
        m[k] = mn;
#pragma unroll
        for (int i = 0; i < AT_DI; i++) o[k][i] *= alpha;
        Ps[(warp * FL_QW + k) * FL_BK + lane] = p;
      }
      __syncwarp();
      for (int jj = 0; jj < nk; jj++) {
        float pk[FL_QW];
#pragma unroll
        for (int k = 0; k < FL_QW; k++) pk[k] = Ps[(warp * FL_QW + k) * FL_BK + jj];
#pragma unroll
        for (int i = 0; i < AT_DI; i++) {
          if (lane + 32 * i < hd) {
            const float v = Vs[jj * hd + lane + 32 * i];
#pragma unroll
            for (int k = 0; k < FL_QW; k++) o[k][i] = fmaf(pk[k], v, o[k][i]);
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < FL_QW; k++) {
      const int qi = warp * FL_QW + k;
      if (qi >= nq) continue;
      float *op = a.out + ((int64_t)(s0 + qi) * a.H + h) * hd;
#pragma unroll
      for (int i = 0; i < AT_DI; i++)
        if (lane + 32 * i < hd) op[lane + 32 * i] = l[k] > 0.0f ? o[k][i] / l[k] : 0.0f;
    }
  }
}

/* ---- flash on tensor cores (fast precision): bf16 Q, K, V, P; f32 scores, softmax and sums ----
 *
 * FlashAttention-2's shape: one block of 4 warps per (tile of 64 consecutive
 * queries, head); runs of the tile's queries that share a block table are
 * segments, as in the f32 kernel. Warp w owns query rows 16w .. 16w + 15 of
 * the tile and keeps everything of them in registers: its Q fragments, the
 * scores of a 64-key tile, the online-softmax state and the output rows.
 * Per key tile the block stages K and V (read from the paged arenas through
 * the block table, any KV format, rounded to bf16) in shared memory, rows
 * padded by 16 bytes so that the fragment loads hit every bank once; then
 * each warp computes S = Q Kᵀ with mma.sync m16n8k16 (bf16 in, f32
 * accumulate), masks and softmaxes S in registers (the accumulator's layout
 * is the next product's A operand, so P never leaves the registers), and
 * adds P V, V's fragments loaded transposed by ldmatrix. A warp whose rows
 * all end before the tile (causal) or start after it (window) skips it.
 * HD: 64 or 128. */
#define TC_BQ 64
#define TC_BK 64
#define TC_WARPS 4

template <int HD>
static size_t tc_smem() {
  return (size_t)(TC_BQ + 2 * TC_BK) * (HD + 8) * 2 /* Q, K, V bf16, padded rows */ + TC_BK * 8 /* slots */;
}

static __device__ __forceinline__ uint32_t tc_pack(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}

static __device__ __forceinline__ void tc_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8 x 8 bf16 matrices, transposed: lane l names row l % 8 of matrix l / 8. */
static __device__ __forceinline__ void tc_ldsm_t(uint32_t r[4], const __nv_bfloat16 *p) {
  const uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

static __device__ __forceinline__ float tc_qmax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

static __device__ __forceinline__ float tc_qsum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

template <int HD>
__global__ void __launch_bounds__(TC_WARPS * 32) attn_flash_tc_kernel(at_args a) {
  constexpr int LD = HD + 8; /* bf16 elements from one staged row to the next */
  extern __shared__ __align__(128) unsigned char tsm[];
  __nv_bfloat16 *Qs = (__nv_bfloat16 *)tsm; /* [BQ][LD] */
  __nv_bfloat16 *Ks = Qs + TC_BQ * LD;      /* [BK][LD] */
  __nv_bfloat16 *Vs = Ks + TC_BK * LD;      /* [BK][LD] */
  int64_t *Sl = (int64_t *)(Vs + TC_BK * LD);
  __shared__ int rqs[TC_BQ], lqs[TC_BQ]; /* the segment's last and first key each query may see */
  const int t0 = blockIdx.x * TC_BQ, t1 = min(a.T, t0 + TC_BQ), h = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c2 = 2 * (lane & 3);
  const int kvh = h / (a.H / a.KVH);
  const int64_t hoff = (int64_t)kvh * HD;
  const float L2E = 1.4426950408889634f;
  for (int s = t0; s < t1;) {
    const int tv = a.tab[s], s0 = s;
    int e = s + 1;
    while (e < t1 && a.tab[e] == tv) e++;
    s = e;
    if (e - s0 == 1 && at_alone(a, s0)) continue; /* the decode kernel's */
    const int nq = e - s0;
    int jlo = INT_MAX, jhi = 0;
    for (int i = 0; i < nq; i++) {
      jlo = min(jlo, at_lo(a, a.row[s0 + i]));
      jhi = max(jhi, at_top(a, s0 + i) + 1);
    }
    __syncthreads(); /* the previous segment is done with shared memory */
    for (int p = threadIdx.x; p < TC_BQ * HD / 4; p += blockDim.x) {
      const int qi = p / (HD / 4), d = 4 * (p % (HD / 4));
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (qi < nq) {
        const float *qp = a.q + ((int64_t)(s0 + qi) * a.H + h) * HD + d;
        v = make_float4(qp[0], qp[1], qp[2], qp[3]);
      }
      *(__nv_bfloat162 *)(Qs + qi * LD + d) = __floats2bfloat162_rn(v.x, v.y);
      *(__nv_bfloat162 *)(Qs + qi * LD + d + 2) = __floats2bfloat162_rn(v.z, v.w);
    }
    for (int i = threadIdx.x; i < TC_BQ; i += blockDim.x) {
      rqs[i] = i < nq ? at_top(a, s0 + i) : -1;
      lqs[i] = i < nq ? at_lo(a, a.row[s0 + i]) : INT_MAX;
    }
    __syncthreads();
    const int r0 = warp * 16 + g; /* this thread's rows: r0 and r0 + 8 */
    uint32_t qf[HD / 16][4];
#pragma unroll
    for (int k = 0; k < HD / 16; k++) {
      const __nv_bfloat16 *q0 = Qs + r0 * LD + k * 16 + c2, *q1 = q0 + 8 * LD;
      qf[k][0] = *(const uint32_t *)q0;
      qf[k][1] = *(const uint32_t *)q1;
      qf[k][2] = *(const uint32_t *)(q0 + 8);
      qf[k][3] = *(const uint32_t *)(q1 + 8);
    }
    const int rq0 = rqs[r0], rq1 = rqs[r0 + 8], lq0 = lqs[r0], lq1 = lqs[r0 + 8];
    /* the key range any row of this warp sees */
    int whi = max(rq0, rq1), wlo = min(lq0, lq1);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
      wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
    }
    float acc[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    for (int j0 = jlo; j0 < jhi; j0 += TC_BK) {
      const int nk = min(TC_BK, jhi - j0);
      __syncthreads(); /* the previous tile is consumed */
      if (threadIdx.x < TC_BK) Sl[threadIdx.x] = threadIdx.x < nk ? at_slot(a, tv, j0 + threadIdx.x) : 0;
      __syncthreads();
      if (a.vvec4) { /* f32 rows: every thread's float4 pieces of K, then of V, loaded before any is stored */
        constexpr int PER = 8, NP = TC_BK * HD / 4 / (TC_WARPS * 32); /* pieces in flight, pieces per thread and tile */
#pragma unroll
        for (int kv = 0; kv < 2; kv++) {
          const float *base = kv ? a.V : a.K;
          const int64_t stride = kv ? a.vstride : a.kstride;
          __nv_bfloat16 *dst = kv ? Vs : Ks;
#pragma unroll
          for (int u0 = 0; u0 < NP; u0 += PER) {
            float4 v[PER];
#pragma unroll
            for (int u = 0; u < PER; u++) {
              const int p = threadIdx.x + (u0 + u) * TC_WARPS * 32, jj = p / (HD / 4), d = 4 * (p % (HD / 4));
              v[u] = jj < nk ? __ldg((const float4 *)(base + Sl[jj] * stride + hoff + d)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < PER; u++) {
              const int p = threadIdx.x + (u0 + u) * TC_WARPS * 32, jj = p / (HD / 4), d = 4 * (p % (HD / 4));
              *(__nv_bfloat162 *)(dst + jj * LD + d) = __floats2bfloat162_rn(v[u].x, v[u].y);
              *(__nv_bfloat162 *)(dst + jj * LD + d + 2) = __floats2bfloat162_rn(v[u].z, v[u].w);
            }
          }
        }
      } else if (a.blk32 && (a.kfmt == BK_KV_Q8 || a.kfmt == BK_KV_Q4) && (a.vfmt == BK_KV_Q8 || a.vfmt == BK_KV_Q4)) {
        /* 8 / 4-bit blocks: a thread decodes one block of 32 elements from its scale and code words */
        constexpr int NBH = HD / 32;
        for (int p = threadIdx.x; p < 2 * TC_BK * NBH; p += blockDim.x) {
          const int kv = p / (TC_BK * NBH), jj = (p % (TC_BK * NBH)) / NBH, bi = p % NBH, fmt = kv ? a.vfmt : a.kfmt;
          __nv_bfloat162 *dst = (__nv_bfloat162 *)((kv ? Vs : Ks) + jj * LD + bi * 32);
          if (jj >= nk) {
#pragma unroll
            for (int e = 0; e < 16; e++) dst[e] = __floats2bfloat162_rn(0.0f, 0.0f);
            continue;
          }
          const unsigned char *blk = (const unsigned char *)((kv ? a.V : a.K) + Sl[jj] * (kv ? a.vstride : a.kstride)) +
                                     (hoff / 32 + bi) * kvq_block_bytes(fmt);
          const float d = *(const float *)blk;
          const uint32_t *w = (const uint32_t *)(blk + 4);
          if (fmt == BK_KV_Q8) {
#pragma unroll
            for (int k = 0; k < 8; k++) {
              const uint32_t x = w[k];
              dst[2 * k] = __floats2bfloat162_rn(__fmul_rn(d, (float)(signed char)(x & 255)),
                                                 __fmul_rn(d, (float)(signed char)((x >> 8) & 255)));
              dst[2 * k + 1] = __floats2bfloat162_rn(__fmul_rn(d, (float)(signed char)((x >> 16) & 255)),
                                                     __fmul_rn(d, (float)(signed char)(x >> 24)));
            }
          } else { /* byte r holds element r (low nibble) and element r + 16 (high), both offset by 8 */
#pragma unroll
            for (int k = 0; k < 4; k++) {
              const uint32_t x = w[k];
              float lo[4], hi[4];
#pragma unroll
              for (int u = 0; u < 4; u++) {
                lo[u] = __fmul_rn(d, (float)((int)((x >> (8 * u)) & 15) - 8));
                hi[u] = __fmul_rn(d, (float)((int)((x >> (8 * u + 4)) & 15) - 8));
              }
              dst[2 * k] = __floats2bfloat162_rn(lo[0], lo[1]);
              dst[2 * k + 1] = __floats2bfloat162_rn(lo[2], lo[3]);
              dst[8 + 2 * k] = __floats2bfloat162_rn(hi[0], hi[1]);
              dst[8 + 2 * k + 1] = __floats2bfloat162_rn(hi[2], hi[3]);
            }
          }
        }
      } else {
        for (int idx = threadIdx.x; idx < TC_BK * HD; idx += blockDim.x) {
          const int jj = idx / HD, d = idx % HD;
          float kv = 0.0f, vv = 0.0f;
          if (jj < nk) {
            kv = kvq_elem(a.K + Sl[jj] * a.kstride, a.kfmt, hoff + d);
            vv = kvq_elem(a.V + Sl[jj] * a.vstride, a.vfmt, hoff + d);
          }
          Ks[jj * LD + d] = __float2bfloat16_rn(kv);
          Vs[jj * LD + d] = __float2bfloat16_rn(vv);
        }
      }
      __syncthreads();
      if (j0 > whi || j0 + nk <= wlo) continue; /* no row of this warp sees the tile */
      /* S = Q Kᵀ: n-tile n holds keys 8n .. 8n + 7; this thread's entries are rows r0 / r0 + 8, keys 8n + c2 + {0, 1} */
      float sc[TC_BK / 8][4];
#pragma unroll
      for (int n = 0; n < TC_BK / 8; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
      for (int k = 0; k < HD / 16; k++) {
#pragma unroll
        for (int n = 0; n < TC_BK / 8; n++) {
          const __nv_bfloat16 *kp = Ks + (n * 8 + g) * LD + k * 16 + c2;
          tc_mma(sc[n], qf[k], *(const uint32_t *)kp, *(const uint32_t *)(kp + 8));
        }
      }
      /* mask, score (scale, soft-cap), in log2 units; the rows' maxima over the quad of lanes that share them */
      float x0 = -INFINITY, x1 = -INFINITY;
#pragma unroll
      for (int n = 0; n < TC_BK / 8; n++) {
#pragma unroll
        for (int u = 0; u < 4; u++) {
          const int jj = n * 8 + c2 + (u & 1), j = j0 + jj;
          const bool ok = jj < nk && (u < 2 ? j <= rq0 && j >= lq0 : j <= rq1 && j >= lq1);
          const float v = ok ? at_score(a, sc[n][u]) * L2E : -INFINITY;
          sc[n][u] = v;
          if (u < 2) x0 = fmaxf(x0, v);
          else x1 = fmaxf(x1, v);
        }
      }
      const float mn0 = fmaxf(m0, tc_qmax(x0)), mn1 = fmaxf(m1, tc_qmax(x1));
      const float al0 = mn0 == -INFINITY ? 1.0f : exp2f(m0 - mn0), al1 = mn1 == -INFINITY ? 1.0f : exp2f(m1 - mn1);
      float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
      for (int n = 0; n < TC_BK / 8; n++) {
#pragma unroll
        for (int u = 0; u < 4; u++) {
          const float mn = u < 2 ? mn0 : mn1;
          const float p = sc[n][u] == -INFINITY ? 0.0f : exp2f(sc[n][u] - mn);
          sc[n][u] = p;
          if (u < 2) p0 += p;
          else p1 += p;
        }
      }
      l0 = l0 * al0 + tc_qsum(p0);
      l1 = l1 * al1 + tc_qsum(p1);
      m0 = mn0, m1 = mn1;
#pragma unroll
      for (int n = 0; n < HD / 8; n++) acc[n][0] *= al0, acc[n][1] *= al0, acc[n][2] *= al1, acc[n][3] *= al1;
      /* O += P V: keys 16kk .. 16kk + 15 are P's k-slice (score n-tiles 2kk, 2kk + 1 are its A fragment) */
#pragma unroll
      for (int kk = 0; kk < TC_BK / 16; kk++) {
        uint32_t pa[4];
        pa[0] = tc_pack(sc[2 * kk][0], sc[2 * kk][1]);
        pa[1] = tc_pack(sc[2 * kk][2], sc[2 * kk][3]);
        pa[2] = tc_pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
        pa[3] = tc_pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
        const __nv_bfloat16 *vp = Vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;
#pragma unroll
        for (int nn = 0; nn < HD / 16; nn++) {
          uint32_t vb[4];
          tc_ldsm_t(vb, vp + nn * 16);
          tc_mma(acc[2 * nn], pa, vb[0], vb[1]);
          tc_mma(acc[2 * nn + 1], pa, vb[2], vb[3]);
        }
      }
    }
    const float i0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, i1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
      if (r0 < nq)
        *(float2 *)(a.out + ((int64_t)(s0 + r0) * a.H + h) * HD + n * 8 + c2) = make_float2(acc[n][0] * i0, acc[n][1] * i0);
      if (r0 + 8 < nq)
        *(float2 *)(a.out + ((int64_t)(s0 + r0 + 8) * a.H + h) * HD + n * 8 + c2) = make_float2(acc[n][2] * i1, acc[n][3] * i1);
    }
  }
}

cudaError_t cu_attention_init(void) {
  cudaError_t e = cudaFuncSetAttribute(attn_flash_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)flash_smem(AT_MAX_HD));
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(attn_flash_tc_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tc_smem<64>());
  if (e == cudaSuccess)
    e = cudaFuncSetAttribute(attn_flash_tc_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tc_smem<128>());
  return e;
}

void cu_attention(bk_backend *be, const bk_tensor *out, const bk_tensor *q, const bk_kv_layer *kv, const bk_attn_index *ix,
                  const attn_params *p) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  const int64_t T = q->rows, H = p->n_heads, KVH = p->n_kv_heads, hd = p->head_dim;
  if (H <= 0 || KVH <= 0 || H % KVH || hd <= 0 || hd > AT_MAX_HD || q->cols != H * hd || out->rows != T ||
      out->cols != q->cols || (unsigned)kv->k_fmt > BK_KV_Q4 || (unsigned)kv->v_fmt > BK_KV_Q4 ||
      kv->k->cols * 4 != (int64_t)bk_kv_row_bytes(kv->k_fmt, KVH * hd) ||
      kv->v->cols * 4 != (int64_t)bk_kv_row_bytes(kv->v_fmt, KVH * hd) || kv->block_rows <= 0 ||
      bk_nelem(ix->row) < T || bk_nelem(ix->tab) < T) {
    cu_fail(b, hd > AT_MAX_HD ? HEARTH_EUNSUPPORTED : HEARTH_EINTERNAL,
            "cuda attention: q [%lld, %lld], out [%lld, %lld], %lld heads / %lld kv heads of %lld (at most %d), "
            "arenas of %lld columns, block_rows %lld",
            (long long)T, (long long)q->cols, (long long)out->rows, (long long)out->cols, (long long)H, (long long)KVH,
            (long long)hd, AT_MAX_HD, (long long)kv->k->cols, (long long)kv->block_rows);
    return;
  }
  if (T <= 0) return;
  if (T > INT32_MAX || H > 65535 || kv->block_rows > INT32_MAX) {
    cu_fail(b, HEARTH_EUNSUPPORTED, "cuda attention: %lld queries x %lld heads is too large", (long long)T, (long long)H);
    return;
  }
  cudaSetDevice(b->device);
  at_args a;
  a.out = cu_fw(out);
  a.q = cu_f(q);
  a.K = cu_f(kv->k);
  a.V = cu_f(kv->v);
  a.row = cu_i(ix->row);
  a.tab = cu_i(ix->tab);
  a.tables = cu_i(ix->tables);
  a.last = ix->last ? cu_i(ix->last) : NULL;
  a.T = (int)T;
  a.H = (int)H;
  a.KVH = (int)KVH;
  a.hd = (int)hd;
  a.B = (int)kv->block_rows;
  a.window = p->window > 0 ? (p->window > INT32_MAX ? INT32_MAX : (int)p->window) : 0;
  a.kstride = kv->k->cols;
  a.vstride = kv->v->cols;
  a.kfmt = (int)kv->k_fmt;
  a.vfmt = (int)kv->v_fmt;
  a.blk32 = hd % 32 == 0;
  a.scale = p->scale;
  a.softcap = p->softcap;
  a.all = T == 1;
  a.vec4 = a.kfmt == BK_KV_F32 && hd % 4 == 0 && a.kstride % 4 == 0 && (uintptr_t)a.K % 16 == 0;
  a.vvec4 = a.vec4 && a.vfmt == BK_KV_F32 && a.vstride % 4 == 0 && (uintptr_t)a.V % 16 == 0;
  /* Decode: a group of query heads sharing a KV head in one block where the
   * group size is 1, 2, 4 or 8 (else a block per query head). Small batches
   * split each query's keys over several blocks (flash-decoding) so that the
   * GPU has about four blocks per multiprocessor; partials merged after. */
  const int64_t G = H / KVH;
  const bool grouped = G == 1 || G == 2 || G == 4 || G == 8;
  const int64_t units = T * (grouped ? KVH : H), pairs = T * H, target = 8 * (int64_t)b->n_sm;
  a.nsplit = 1;
  a.part = NULL;
  if (units < target) {
    int64_t ns = (target + units - 1) / units;
    a.nsplit = (int)(ns > 128 ? 128 : ns);
    a.part = (float *)cu_scratch(b, (size_t)(pairs * a.nsplit * (hd + 2)) * sizeof(float));
    if (!a.part) return;
  }
  int pi = cu_prof_part(b, "attention decode kernel", T);
  if (grouped) {
    dim3 grid((unsigned)T, (unsigned)KVH, (unsigned)a.nsplit);
    switch (G) {
      case 1: launch_decode_gqa<1>(a, grid, b->stream); break;
      case 2: launch_decode_gqa<2>(a, grid, b->stream); break;
      case 4: launch_decode_gqa<4>(a, grid, b->stream); break;
      default: launch_decode_gqa<8>(a, grid, b->stream); break;
    }
  } else {
    attn_decode_kernel<<<dim3((unsigned)T, (unsigned)H, (unsigned)a.nsplit), DEC_WARPS * 32, 0, b->stream>>>(a);
  }
  if (cu_check(b, "attention (decode)")) return;
  if (a.nsplit > 1) {
    attn_combine_kernel<<<dim3((unsigned)T, (unsigned)H), 128, 0, b->stream>>>(a);
    if (cu_check(b, "attention (combine)")) return;
  }
  cu_prof_part_end(b, pi);
  if (T > 1) {
    pi = cu_prof_part(b, "attention flash kernel", T);
    if (b->fast_matmul && (hd == 64 || hd == 128)) { /* fast precision: tensor cores */
      if (hd == 64)
        attn_flash_tc_kernel<64><<<dim3(cu_blocks(T, TC_BQ), (unsigned)H), TC_WARPS * 32, tc_smem<64>(), b->stream>>>(a);
      else
        attn_flash_tc_kernel<128><<<dim3(cu_blocks(T, TC_BQ), (unsigned)H), TC_WARPS * 32, tc_smem<128>(), b->stream>>>(a);
    } else {
      attn_flash_kernel<<<dim3(cu_blocks(T, FL_BQ), (unsigned)H), FL_WARPS * 32, flash_smem((int)hd), b->stream>>>(a);
    }
    cu_prof_part_end(b, pi);
    cu_check(b, "attention (flash)");
  }
}
