/* sample.cu — bk_sample on the GPU: one thread block per logits row does
 * the penalties and bias, the log-softmax and top logprobs, and greedy or
 * temperature / top-k / top-p / min-p sampling (backend.h states the exact
 * semantics; backend/cpu/sample_cpu.c is the plain reference). Only the
 * chosen ids and the logprobs asked for are copied back.
 *
 * Every reduction has a fixed shape (strided per-thread partials, then a
 * fixed tree), so a row gives the same token on every run: the request's
 * seed decides its tokens. top-k finds the k-th largest logit by a 4-pass
 * radix select on the float's ordered bits; top-p finds its probability cut
 * by bisection on the bits of p (each step one pass summing the mass above);
 * the draw is a block-wide prefix sum over contiguous id ranges. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cuda/cuda_common.cuh"

#define ST 1024          /* threads per row */
#define NW (ST / 32)

__device__ static inline bool usable(float x) { return x == x && x != -INFINITY; }

/* (v, i) better than (w, j): larger value, then lower id; i < 0 is nothing. */
__device__ static inline bool better(float v, int i, float w, int j) {
  return i >= 0 && (j < 0 || v > w || (v == w && i < j));
}

struct red_scratch {
  double d[NW];
  float f[NW];
  int i[NW];
  unsigned u[NW];
};

__device__ static double block_sum(double v, red_scratch *sh) {
  for (int o = 16; o; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  __syncthreads();
  if (l == 0) sh->d[w] = v;
  __syncthreads();
  if (w == 0) {
    v = l < NW ? sh->d[l] : 0.0;
    for (int o = 16; o; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (l == 0) sh->d[0] = v;
  }
  __syncthreads();
  return sh->d[0];
}

__device__ static int block_sum_int(int v, red_scratch *sh) {
  for (int o = 16; o; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  __syncthreads();
  if (l == 0) sh->i[w] = v;
  __syncthreads();
  if (w == 0) {
    v = l < NW ? sh->i[l] : 0;
    for (int o = 16; o; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (l == 0) sh->i[0] = v;
  }
  __syncthreads();
  return sh->i[0];
}

/* The best (value, id) over the block; id -1 when no thread has one. */
__device__ static void block_best(float *v, int *id, red_scratch *sh) {
  float bv = *v;
  int bi = *id;
  for (int o = 16; o; o >>= 1) {
    float ov = __shfl_down_sync(0xffffffffu, bv, o);
    int oi = __shfl_down_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  __syncthreads();
  if (l == 0) sh->f[w] = bv, sh->i[w] = bi;
  __syncthreads();
  if (w == 0) {
    bv = l < NW ? sh->f[l] : -INFINITY;
    bi = l < NW ? sh->i[l] : -1;
    for (int o = 16; o; o >>= 1) {
      float ov = __shfl_down_sync(0xffffffffu, bv, o);
      int oi = __shfl_down_sync(0xffffffffu, bi, o);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (l == 0) sh->f[0] = bv, sh->i[0] = bi;
  }
  __syncthreads();
  *v = sh->f[0];
  *id = sh->i[0];
  __syncthreads();
}

/* Float -> unsigned with the same order. */
__device__ static inline unsigned ordered(float x) {
  unsigned u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ static inline float unordered(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__global__ void __launch_bounds__(ST) sample_kernel(float *logits, float *probs, int V, const bk_sample_row *rows,
                                                    const bk_sample_adj *adj, const unsigned long long *masks,
                                                    const long long *mask_at, bk_sample_out *outs) {
  __shared__ red_scratch sh;
  __shared__ unsigned hist[256];
  __shared__ unsigned sel[2];
  __shared__ double scan[NW];
  __shared__ int pick;
  const int r = blockIdx.x, t = threadIdx.x;
  const bk_sample_row w = rows[r];
  float *x = logits + (size_t)r * V;
  float *p = probs + (size_t)r * V;
  bk_sample_out *o = &outs[r];

  /* the grammar's mask first: tokens it does not allow are out */
  if (mask_at[r] >= 0) {
    const unsigned long long *m = masks + mask_at[r];
    for (int i = t; i < V; i += ST)
      if ((i >> 6) >= w.mask_words || !((m[i >> 6] >> (i & 63)) & 1ull)) x[i] = -INFINITY;
    __syncthreads();
  }
  /* adjustments: penalty ids are unique (parallel); bias entries in order */
  for (int i = t; i < w.n_pen; i += ST) {
    bk_sample_adj a = adj[w.pen_off + i];
    float v = x[a.id];
    if (a.rep != 1.0f) v = v < 0 ? v * a.rep : v / a.rep;
    x[a.id] = v - a.sub;
  }
  __syncthreads();
  if (t == 0)
    for (int i = 0; i < w.n_bias; i++) x[adj[w.bias_off + i].id] += adj[w.bias_off + i].add;
  __syncthreads();

  /* argmax */
  float max = -INFINITY;
  int best = -1;
  for (int i = t; i < V; i += ST)
    if (x[i] > max) max = x[i], best = i;
  block_best(&max, &best, &sh);
  if (best < 0) {
    if (t == 0) o->id = -1, o->n_top = 0, o->logprob = 0;
    return;
  }

  double lse = 0;
  if (w.logprobs || w.top_logprobs > 0) {
    double s = 0;
    for (int i = t; i < V; i += ST)
      if (usable(x[i])) s += expf(x[i] - max);
    s = block_sum(s, &sh);
    lse = (double)max + log(s);
    float pv = INFINITY;
    int pid = -1, n_top = 0;
    for (int k = 0; k < w.top_logprobs; k++) {
      float bv = -INFINITY;
      int bi = -1;
      for (int i = t; i < V; i += ST) {
        float v = x[i];
        if (!usable(v) || v > pv || (v == pv && i <= pid)) continue;
        if (better(v, i, bv, bi)) bv = v, bi = i;
      }
      block_best(&bv, &bi, &sh);
      if (bi < 0) break;
      if (t == 0) {
        o->top_ids[k] = bi;
        o->top_logprobs[k] = (float)((double)bv - lse);
      }
      n_top = k + 1;
      pv = bv;
      pid = bi;
    }
    if (t == 0) o->n_top = n_top;
  } else if (t == 0) {
    o->n_top = 0;
  }

  int chosen = best;
  if (w.temperature > 0) {
    /* top-k: the k-th largest usable logit by radix select */
    float floor_v = -INFINITY;
    if (w.top_k > 0) {
      int n = 0;
      for (int i = t; i < V; i += ST) n += usable(x[i]);
      n = block_sum_int(n, &sh);
      if (w.top_k < n) {
        unsigned prefix = 0, mask = 0, k = (unsigned)w.top_k;
        for (int shift = 24; shift >= 0; shift -= 8) {
          for (int b = t; b < 256; b += ST) hist[b] = 0;
          __syncthreads();
          for (int i = t; i < V; i += ST) {
            float v = x[i];
            if (!usable(v)) continue;
            unsigned key = ordered(v);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
          }
          __syncthreads();
          if (t == 0) {
            unsigned cum = 0;
            int b = 255;
            for (; b > 0; b--) {
              if (cum + hist[b] >= k) break;
              cum += hist[b];
            }
            sel[0] = (unsigned)b;
            sel[1] = k - cum;
          }
          __syncthreads();
          prefix |= sel[0] << shift;
          mask |= 255u << shift;
          k = sel[1];
          __syncthreads();
        }
        floor_v = unordered(prefix);
      }
    }
    /* probabilities relative to the max (whose p is 1) */
    double inv_t = 1.0 / (double)w.temperature, total = 0;
    for (int i = t; i < V; i += ST) {
      float v = x[i];
      float q = usable(v) && v >= floor_v ? expf((float)(((double)v - max) * inv_t)) : 0.0f;
      p[i] = q;
      total += q;
    }
    total = block_sum(total, &sh);
    unsigned cut = 0; /* keep bits(p) >= cut */
    if (w.top_p < 1.0f) {
      double target = (double)w.top_p * total;
      unsigned lo = 0, hi = 0x3f800000u; /* bits of 1.0f: nothing lies above it */
      while (lo < hi) {
        unsigned mid = lo + (hi - lo) / 2;
        double above = 0;
        for (int i = t; i < V; i += ST)
          if (__float_as_uint(p[i]) > mid) above += p[i];
        above = block_sum(above, &sh);
        if (above < target) hi = mid;
        else lo = mid + 1;
      }
      cut = lo;
    }
    float min_keep = w.min_p > 0 ? w.min_p : 0.0f;
    /* drop, then the draw: contiguous id ranges, a block prefix sum of their masses */
    int chunk = (V + ST - 1) / ST, i0 = t * chunk, i1 = min(V, i0 + chunk);
    double local = 0;
    int last = -1;
    for (int i = i0; i < i1; i++) {
      float q = p[i];
      if (q > 0 && (__float_as_uint(q) < cut || q < min_keep)) q = 0, p[i] = 0;
      if (q > 0) local += q, last = i;
    }
    /* inclusive scan of local over the block */
    double inc = local;
    int l = t % 32, wi = t / 32;
    for (int o2 = 1; o2 < 32; o2 <<= 1) {
      double y = __shfl_up_sync(0xffffffffu, inc, o2);
      if (l >= o2) inc += y;
    }
    if (l == 31) scan[wi] = inc;
    __syncthreads();
    if (wi == 0) {
      double s = l < NW ? scan[l] : 0.0;
      for (int o2 = 1; o2 < 32; o2 <<= 1) {
        double y = __shfl_up_sync(0xffffffffu, s, o2);
        if (l >= o2) s += y;
      }
      if (l < NW) scan[l] = s; /* inclusive over warps */
    }
    __syncthreads();
    double warp_before = wi > 0 ? scan[wi - 1] : 0.0, mass = scan[NW - 1];
    /* [lo_t, hi_t): this thread's share of [0, mass); a thread's lo is its
     * neighbour's hi, and a warp's last hi the warp total, so they tile exactly */
    double hi_t = l == 31 ? scan[wi] : warp_before + inc;
    double prev = __shfl_up_sync(0xffffffffu, hi_t, 1);
    double lo_t = l > 0 ? prev : warp_before;
    /* when rounding leaves u past the end: the last kept token (the largest id) */
    float lastf = (float)last;
    int last_all = last;
    block_best(&lastf, &last_all, &sh);
    if (t == 0) pick = last_all;
    __syncthreads();
    double u = (double)w.u * mass;
    if (local > 0 && u >= lo_t && u < hi_t) {
      double acc = lo_t;
      int got = last;
      for (int i = i0; i < i1; i++) {
        if (p[i] <= 0) continue;
        acc += p[i];
        if (u < acc) {
          got = i;
          break;
        }
      }
      pick = got;
    }
    __syncthreads();
    chosen = pick;
  }
  if (t == 0) {
    o->id = chosen;
    o->logprob = w.logprobs ? (usable(x[chosen]) ? (float)((double)x[chosen] - lse) : -INFINITY) : 0.0f;
  }
}

int cu_sample(bk_backend *be, const bk_tensor *logits, const bk_sample_row *rows, const bk_sample_adj *adj, int64_t n_adj,
              bk_sample_out *out, herr *err) {
  cu_backend *b = cu_be(be);
  int64_t R = logits->rows, V = logits->cols;
  if (R <= 0) return 0;
  if (V > INT32_MAX / 2) return herr_set(err, HEARTH_EINVAL, "cuda sample: vocabulary of %lld is too large", (long long)V);
  cudaSetDevice(b->device);
  size_t o_rows = 0, o_adj = o_rows + (((size_t)R * sizeof(bk_sample_row) + 255) & ~(size_t)255);
  /* each masked row's words, one after another, and per row where they start (-1: no mask) */
  long long *mask_at = (long long *)malloc((size_t)R * sizeof(long long));
  if (!mask_at) return herr_set(err, HEARTH_ENOMEM, "cuda sample: out of memory");
  size_t n_words = 0;
  for (int64_t r = 0; r < R; r++) {
    mask_at[r] = rows[r].mask && rows[r].mask_words > 0 ? (long long)n_words : -1;
    if (mask_at[r] >= 0) n_words += (size_t)rows[r].mask_words;
  }
  size_t o_at = o_adj + (((size_t)n_adj * sizeof(bk_sample_adj) + 255) & ~(size_t)255);
  size_t o_mask = o_at + (((size_t)R * sizeof(long long) + 255) & ~(size_t)255);
  size_t o_out = o_mask + ((n_words * sizeof(uint64_t) + 255) & ~(size_t)255);
  size_t o_p = o_out + (((size_t)R * sizeof(bk_sample_out) + 255) & ~(size_t)255);
  size_t need = o_p + (size_t)R * (size_t)V * sizeof(float);
  if (need > b->samp_size) {
    cudaStreamSynchronize(b->stream);
    if (b->samp) cudaFree(b->samp);
    b->samp = NULL;
    b->samp_size = 0;
    size_t want = need + need / 4;
    if (cudaMalloc(&b->samp, want) != cudaSuccess) {
      cudaGetLastError();
      b->samp = NULL;
      free(mask_at);
      return herr_set(err, HEARTH_ENOMEM, "cuda sample: no device memory for %zu bytes of sampling scratch", want);
    }
    b->samp_size = want;
  }
  char *d = (char *)b->samp;
  cudaError_t e = cudaMemcpyAsync(d + o_rows, rows, (size_t)R * sizeof(bk_sample_row), cudaMemcpyHostToDevice, b->stream);
  if (e == cudaSuccess && n_adj)
    e = cudaMemcpyAsync(d + o_adj, adj, (size_t)n_adj * sizeof(bk_sample_adj), cudaMemcpyHostToDevice, b->stream);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(d + o_at, mask_at, (size_t)R * sizeof(long long), cudaMemcpyHostToDevice, b->stream);
  for (int64_t r = 0; r < R && e == cudaSuccess; r++)
    if (mask_at[r] >= 0)
      e = cudaMemcpyAsync(d + o_mask + (size_t)mask_at[r] * sizeof(uint64_t), rows[r].mask,
                          (size_t)rows[r].mask_words * sizeof(uint64_t), cudaMemcpyHostToDevice, b->stream);
  /* pageable sources: each copy has taken its bytes when it returns */
  free(mask_at);
  if (e != cudaSuccess) {
    cudaGetLastError();
    cu_fail(b, HEARTH_EINTERNAL, "cuda sample upload: %s", cudaGetErrorString(e));
  } else {
    sample_kernel<<<(unsigned)R, ST, 0, b->stream>>>(cu_fw(logits), (float *)(d + o_p), (int)V,
                                                    (const bk_sample_row *)(d + o_rows),
                                                    (const bk_sample_adj *)(d + o_adj),
                                                    (const unsigned long long *)(d + o_mask),
                                                    (const long long *)(d + o_at), (bk_sample_out *)(d + o_out));
    if (!cu_check(b, "sample")) {
      e = cudaMemcpyAsync(out, d + o_out, (size_t)R * sizeof(bk_sample_out), cudaMemcpyDeviceToHost, b->stream);
      if (e == cudaSuccess) e = cudaStreamSynchronize(b->stream);
      if (e != cudaSuccess) {
        cudaGetLastError();
        cu_fail(b, HEARTH_EINTERNAL, "cuda sample: %s", cudaGetErrorString(e));
      }
    }
  }
  return cu_take_error(b, err);
}
