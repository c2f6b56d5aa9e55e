/* attention.cu — causal attention over the paged KV arenas (GQA, sliding
 * window, softcap), f32 throughout with an online softmax.
 *
 * Two kernels share the work of one call, split by the batch layout that
 * bk_attention promises (queries of one sequence are contiguous):
 *   - decode: one block of 4 warps per (query, head) for queries that are
 *     the only one of their sequence in the batch (every query when T == 1).
 *     Each warp takes 32 keys at a time, one key per lane for the scores,
 *     then all lanes accumulate V over the head dimension. When the batch
 *     has few (query, head) pairs, each pair's keys are split over up to 16
 *     blocks whose partial softmax states a second kernel merges.
 *   - flash: one block per (tile of 32 consecutive queries, head) for the
 *     other queries. Runs of queries in the tile that share a block table are
 *     one segment; for each segment, K / V tiles of 32 rows are loaded into
 *     shared memory once and used by all the segment's queries, each query
 *     masking the rows outside its causal / window range.
 * Row j of a query's sequence lives in slot tables[tab + j / B] * B + j % B.
 * Quantized arenas (8 / 4-bit blocks, kv_quant.cuh) are dequantized as they
 * are read: in the decode kernel per key (whole blocks of 32 when a head
 * starts and ends on block boundaries) and per value element, in the flash
 * kernel as its K / V tiles are loaded into shared memory. */
#include <limits.h>

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

cudaError_t cu_attention_init(void) {
  return cudaFuncSetAttribute(attn_flash_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)flash_smem(AT_MAX_HD));
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
  /* small decode batches: split each query's keys over several blocks to fill the GPU */
  a.nsplit = 1;
  a.part = NULL;
  const int64_t pairs = T * H, target = 2 * (int64_t)b->n_sm;
  if (pairs < target) {
    int64_t ns = (target + pairs - 1) / pairs;
    a.nsplit = (int)(ns > 16 ? 16 : ns);
    a.part = (float *)cu_scratch(b, (size_t)(pairs * a.nsplit * (hd + 2)) * sizeof(float));
    if (!a.part) return;
  }
  attn_decode_kernel<<<dim3((unsigned)T, (unsigned)H, (unsigned)a.nsplit), DEC_WARPS * 32, 0, b->stream>>>(a);
  if (cu_check(b, "attention (decode)")) return;
  if (a.nsplit > 1) {
    attn_combine_kernel<<<dim3((unsigned)T, (unsigned)H), 128, 0, b->stream>>>(a);
    if (cu_check(b, "attention (combine)")) return;
  }
  if (T > 1) {
    attn_flash_kernel<<<dim3(cu_blocks(T, FL_BQ), (unsigned)H), FL_WARPS * 32, flash_smem((int)hd), b->stream>>>(a);
    cu_check(b, "attention (flash)");
  }
}
