/* sparse.cu — the ops multi-head latent attention and DeepSeek sparse
 * attention add (references in cpu/ref_sparse.c): set_cols, set_rows,
 * LayerNorm (one block per row, sums in double), the grouped sigmoid
 * routing (one thread per token, the selection loops of
 * op_moe_route_group), the lightning indexer's top-k (one block per query:
 * a radix select over the 64-bit keys of the double scores, recomputed per
 * pass so no workspace depends on the context length, then the chosen rows
 * written in ascending order through a block-wide count) and attention over
 * the chosen rows (one block per query and head, scores and softmax in
 * double as the reference). Everything stays on the device, so steps that
 * use them can be recorded. */
#include <math.h>

#include "backend/cuda/cuda_common.cuh"

/* ---- set_cols, set_rows ---- */

__global__ void set_cols_kernel(float *y, int64_t ldy, int64_t c0, const float *x, int64_t n, int64_t w) {
  GRID_LOOP(i, n * w) y[(i / w) * ldy + c0 + i % w] = x[i];
}

void cu_set_cols(bk_backend *be, const bk_tensor *y, const bk_tensor *x, int64_t c0) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  if (y->rows != x->rows || c0 < 0 || c0 + x->cols > y->cols) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda set_cols: x [%lld, %lld] into columns %lld.. of y [%lld, %lld]", (long long)x->rows,
            (long long)x->cols, (long long)c0, (long long)y->rows, (long long)y->cols);
    return;
  }
  if (bk_nelem(x) <= 0) return;
  cudaSetDevice(b->device);
  set_cols_kernel<<<grid_for(bk_nelem(x), 256), 256, 0, b->stream>>>(cu_fw(y), y->cols, c0, cu_f(x), x->rows, x->cols);
  cu_check(b, "set_cols");
}

__global__ void set_rows_kernel(float *y, const float *x, const int32_t *rows, int64_t n, int64_t w) {
  GRID_LOOP(i, n * w) y[(int64_t)rows[i / w] * w + i % w] = x[i];
}

void cu_set_rows(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *rows) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  if (y->cols != x->cols || bk_nelem(rows) < x->rows) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda set_rows: x [%lld, %lld] into y [%lld, %lld] by %lld rows", (long long)x->rows,
            (long long)x->cols, (long long)y->rows, (long long)y->cols, (long long)bk_nelem(rows));
    return;
  }
  if (bk_nelem(x) <= 0) return;
  cudaSetDevice(b->device);
  set_rows_kernel<<<grid_for(bk_nelem(x), 256), 256, 0, b->stream>>>(cu_fw(y), cu_f(x), cu_i(rows), x->rows, x->cols);
  cu_check(b, "set_rows");
}

/* ---- layernorm ---- */

#define LN_THREADS 256

__device__ double block_sum(double v, double *part) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  double tot = 0;
  for (int k = 0; k < (int)(blockDim.x >> 5); k++) tot += part[k];
  return tot;
}

__global__ void layernorm_kernel(float *y, const float *x, int64_t d, const float *w, const float *bias, float eps) {
  __shared__ double part[LN_THREADS / 32];
  const float *xr = x + (int64_t)blockIdx.x * d;
  float *yr = y + (int64_t)blockIdx.x * d;
  double s = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) s += (double)xr[i];
  const double mean = block_sum(s, part) / (double)d;
  double v = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) v += ((double)xr[i] - mean) * ((double)xr[i] - mean);
  const double inv = 1.0 / sqrt(block_sum(v, part) / (double)d + (double)eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    double o = ((double)xr[i] - mean) * inv;
    if (w) o *= w[i];
    if (bias) o += bias[i];
    yr[i] = (float)o;
  }
}

void cu_layernorm(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, const bk_tensor *bias, float eps) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  if (y->rows != x->rows || y->cols != x->cols || (w && bk_nelem(w) != x->cols) || (bias && bk_nelem(bias) != x->cols)) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda layernorm: x [%lld, %lld], y [%lld, %lld]", (long long)x->rows, (long long)x->cols,
            (long long)y->rows, (long long)y->cols);
    return;
  }
  if (x->rows <= 0 || x->cols <= 0) return;
  cudaSetDevice(b->device);
  layernorm_kernel<<<(unsigned)x->rows, LN_THREADS, 0, b->stream>>>(cu_fw(y), cu_f(x), x->cols, w ? cu_f(w) : NULL,
                                                                    bias ? cu_f(bias) : NULL, eps);
  cu_check(b, "layernorm");
}

/* ---- grouped sigmoid routing ---- */

__device__ inline float route_s(const float *l, int64_t x) { return (float)(1.0 / (1.0 + exp(-(double)l[x]))); }
__device__ inline float route_c(const float *l, const float *bias, int64_t x) {
  return __fadd_rn(route_s(l, x), bias ? bias[x] : 0.0f);
}

__global__ void moe_route_group_kernel(int32_t *ids, float *w, const float *logits, const float *bias, int64_t T, int64_t E,
                                       int64_t k, int64_t n_group, int64_t topk_group, int norm, float scale) {
  GRID_LOOP(t, T) {
    const float *l = logits + t * E;
    int32_t *id = ids + t * k;
    float *wt = w + t * k;
    const int64_t per = E / n_group;
    uint64_t open = 0;
    for (int64_t j = 0; j < topk_group; j++) {
      int64_t best = -1;
      double bs = 0;
      for (int64_t g = 0; g < n_group; g++) {
        if (open >> g & 1) continue;
        float a = -INFINITY, b2 = -INFINITY;
        for (int64_t x = g * per; x < (g + 1) * per; x++) {
          float c = route_c(l, bias, x);
          if (c > a) b2 = a, a = c;
          else if (c > b2) b2 = c;
        }
        double gs = (double)a + (double)b2;
        if (best < 0 || gs > bs) best = g, bs = gs;
      }
      open |= 1ull << best;
    }
    double sum = 0;
    for (int64_t j = 0; j < k; j++) {
      int64_t best = -1;
      float bc = 0;
      for (int64_t x = 0; x < E; x++) {
        if (!(open >> (x / per) & 1)) continue;
        bool taken = false;
        for (int64_t q = 0; q < j; q++) taken |= id[q] == x;
        if (taken) continue;
        float c = route_c(l, bias, x);
        if (best < 0 || c > bc) best = x, bc = c;
      }
      id[j] = (int32_t)best;
      sum += route_s(l, best);
    }
    for (int64_t j = 0; j < k; j++) {
      double v = route_s(l, id[j]);
      if (norm) v /= sum + 1e-20;
      wt[j] = (float)(v * scale);
    }
  }
}

void cu_moe_route_group(bk_backend *be, const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits, const bk_tensor *bias,
                        int64_t n_group, int64_t topk_group, bool norm, float scale) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  const int64_t T = logits->rows, E = logits->cols, k = ids->cols;
  if (ids->rows != T || w->rows != T || w->cols != k || n_group < 1 || n_group > 64 || E % n_group || E / n_group < 2 ||
      topk_group < 1 || topk_group > n_group || k < 1 || k > topk_group * (E / n_group) || (bias && bk_nelem(bias) != E)) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda moe_route_group: logits [%lld, %lld], top %lld in %lld of %lld groups", (long long)T,
            (long long)E, (long long)k, (long long)topk_group, (long long)n_group);
    return;
  }
  if (T <= 0) return;
  cudaSetDevice(b->device);
  moe_route_group_kernel<<<grid_for(T, 64), 64, 0, b->stream>>>((int32_t *)bk_addr(ids), cu_fw(w), cu_f(logits),
                                                                bias ? cu_f(bias) : NULL, T, E, k, n_group, topk_group,
                                                                norm ? 1 : 0, scale);
  cu_check(b, "moe_route_group");
}

/* ---- the lightning indexer's top-k ---- */

#define IX_THREADS 256

struct paged_dev {
  const float *arena;
  int64_t width, B;
  const int32_t *tables;
};

__device__ inline const float *dev_row(const paged_dev &p, int64_t tab, int64_t j) {
  return p.arena + ((int64_t)p.tables[tab + j / p.B] * p.B + j % p.B) * p.width;
}

/* An order-preserving 64-bit key of a double (larger score, larger key). */
__device__ inline unsigned long long score_key(double s) {
  unsigned long long u = (unsigned long long)__double_as_longlong(s);
  return (u >> 63) ? ~u : (u | 0x8000000000000000ull);
}

__device__ inline double index_score(const float *q, const float *w, const float *k, int64_t H, int64_t hd, double scale) {
  double s = 0;
  for (int64_t h = 0; h < H; h++) {
    double d = 0;
    for (int64_t x = 0; x < hd; x++) d += (double)q[h * hd + x] * (double)k[x];
    d *= scale;
    if (d > 0) s += (double)w[h] * d;
  }
  return s;
}

__global__ void index_topk_kernel(int32_t *sel, const float *q, const float *w, paged_dev keys, const int32_t *row,
                                  const int32_t *tab, int64_t H, int64_t hd, int64_t K, float scale) {
  extern __shared__ float qs[]; /* H * hd query floats, then H weights */
  __shared__ unsigned int hist[256];
  __shared__ unsigned long long s_prefix, s_mask;
  __shared__ long long s_need;
  __shared__ long long cnt_gt[IX_THREADS], cnt_eq[IX_THREADS];
  const int64_t i = blockIdx.x, rows = (int64_t)row[i] + 1, tb = tab[i];
  int32_t *out = sel + i * K;
  if (rows <= K) {
    for (int64_t j = threadIdx.x; j < K; j += blockDim.x) out[j] = j < rows ? (int32_t)j : -1;
    return;
  }
  float *ws = qs + H * hd;
  for (int64_t x = threadIdx.x; x < H * hd; x += blockDim.x) qs[x] = q[i * H * hd + x];
  for (int64_t x = threadIdx.x; x < H; x += blockDim.x) ws[x] = w[i * H + x];
  if (threadIdx.x == 0) s_prefix = 0, s_mask = 0, s_need = K;
  __syncthreads();
  for (int pass = 0; pass < 8; pass++) {
    const int shift = 56 - 8 * pass;
    for (int x = threadIdx.x; x < 256; x += blockDim.x) hist[x] = 0;
    __syncthreads();
    const unsigned long long prefix = s_prefix, mask = s_mask;
    for (int64_t j = threadIdx.x; j < rows; j += blockDim.x) {
      unsigned long long key = score_key(index_score(qs, ws, dev_row(keys, tb, j), H, hd, scale));
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      long long need = s_need, cum = 0;
      for (int d = 255; d >= 0; d--) {
        if (cum + (long long)hist[d] >= need) {
          s_need = need - cum;
          s_prefix = prefix | ((unsigned long long)d << shift);
          s_mask = mask | (255ull << shift);
          break;
        }
        cum += hist[d];
      }
    }
    __syncthreads();
  }
  const unsigned long long thr = s_prefix;
  const long long need = s_need; /* rows with the threshold key to take, lowest rows first */
  const int64_t chunk = (rows + blockDim.x - 1) / blockDim.x, j0 = threadIdx.x * chunk;
  const int64_t j1 = j0 + chunk < rows ? j0 + chunk : rows;
  long long gt = 0, eq = 0;
  for (int64_t j = j0; j < j1; j++) {
    unsigned long long key = score_key(index_score(qs, ws, dev_row(keys, tb, j), H, hd, scale));
    gt += key > thr;
    eq += key == thr;
  }
  cnt_gt[threadIdx.x] = gt, cnt_eq[threadIdx.x] = eq;
  __syncthreads();
  if (threadIdx.x == 0) { /* exclusive prefix sums */
    long long a = 0, c = 0;
    for (unsigned x = 0; x < blockDim.x; x++) {
      long long g = cnt_gt[x], e = cnt_eq[x];
      cnt_gt[x] = a, cnt_eq[x] = c;
      a += g, c += e;
    }
  }
  __syncthreads();
  gt = cnt_gt[threadIdx.x], eq = cnt_eq[threadIdx.x];
  for (int64_t j = j0; j < j1; j++) {
    unsigned long long key = score_key(index_score(qs, ws, dev_row(keys, tb, j), H, hd, scale));
    if (key > thr) out[gt + (eq < need ? eq : need)] = (int32_t)j, gt++;
    else if (key == thr) {
      if (eq < need) out[gt + eq] = (int32_t)j;
      eq++;
    }
  }
}

void cu_index_topk(bk_backend *be, const bk_tensor *sel, const bk_tensor *q, const bk_tensor *w, const bk_kv_layer *keys,
                   const bk_attn_index *ix, const index_params *p) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  const int64_t T = q->rows;
  size_t shm = sizeof(float) * (size_t)(p->n_heads * p->head_dim + p->n_heads);
  if (sel->rows != T || sel->cols != p->topk || q->cols != p->n_heads * p->head_dim || w->rows != T || w->cols != p->n_heads ||
      keys->k->cols < p->head_dim || p->topk < 1 || shm > 40 * 1024) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda index_topk: q [%lld, %lld], %lld heads of %lld, top %lld, keys of %lld", (long long)T,
            (long long)q->cols, (long long)p->n_heads, (long long)p->head_dim, (long long)p->topk, (long long)keys->k->cols);
    return;
  }
  if (T <= 0) return;
  cudaSetDevice(b->device);
  paged_dev pd = {cu_f(keys->k), keys->k->cols, keys->block_rows, cu_i(ix->tables)};
  index_topk_kernel<<<(unsigned)T, IX_THREADS, shm, b->stream>>>((int32_t *)bk_addr(sel), cu_f(q), cu_f(w), pd, cu_i(ix->row),
                                                                 cu_i(ix->tab), p->n_heads, p->head_dim, p->topk, p->scale);
  cu_check(b, "index_topk");
}

/* ---- attention over the chosen rows ---- */

#define SA_THREADS 128

__global__ void attention_sparse_kernel(float *out, const float *q, const int32_t *sel, paged_dev kv, const int32_t *tab,
                                        int64_t H, int64_t hd, int64_t v_off, int64_t vd, int64_t K, float scale) {
  extern __shared__ double sc[]; /* K scores, then hd query floats */
  __shared__ double part[SA_THREADS / 32];
  const int64_t i = blockIdx.x / H, h = blockIdx.x % H, tb = tab[i];
  const int32_t *s = sel + i * K;
  float *qs = (float *)(sc + K);
  for (int64_t x = threadIdx.x; x < hd; x += blockDim.x) qs[x] = q[(i * H + h) * hd + x];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int64_t m = warp; m < K; m += nw) { /* a warp per chosen row */
    if (s[m] < 0) continue;
    const float *k = dev_row(kv, tb, s[m]);
    double d = 0;
    for (int64_t x = lane; x < hd; x += 32) d += (double)qs[x] * (double)k[x];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    if (lane == 0) sc[m] = d * (double)scale;
  }
  __syncthreads();
  double mx = -INFINITY;
  for (int64_t m = 0; m < K; m++)
    if (s[m] >= 0 && sc[m] > mx) mx = sc[m];
  double sum = 0;
  for (int64_t m = threadIdx.x; m < K; m += blockDim.x)
    if (s[m] >= 0) sum += exp(sc[m] - mx);
  sum = block_sum(sum, part);
  __syncthreads();
  for (int64_t m = threadIdx.x; m < K; m += blockDim.x) sc[m] = s[m] >= 0 ? exp(sc[m] - mx) : 0.0;
  __syncthreads();
  float *o = out + (i * H + h) * vd;
  for (int64_t x = threadIdx.x; x < vd; x += blockDim.x) {
    double acc = 0;
    for (int64_t m = 0; m < K; m++)
      if (s[m] >= 0) acc += sc[m] * (double)dev_row(kv, tb, s[m])[v_off + x];
    o[x] = sum > 0 ? (float)(acc / sum) : 0.0f;
  }
}

void cu_attention_sparse(bk_backend *be, const bk_tensor *out, const bk_tensor *q, const bk_kv_layer *kv, const bk_attn_index *ix,
                         const bk_tensor *sel, const sparse_attn_params *p) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  const int64_t T = q->rows;
  size_t shm = sizeof(double) * (size_t)p->topk + sizeof(float) * (size_t)p->head_dim;
  if (q->cols != p->n_heads * p->head_dim || out->rows != T || out->cols != p->n_heads * p->v_dim || sel->rows != T ||
      sel->cols != p->topk || kv->k->cols < p->head_dim || kv->k->cols < p->v_off + p->v_dim || shm > 46 * 1024) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda attention_sparse: q [%lld, %lld], %lld heads of %lld, values %lld.. of %lld, top %lld",
            (long long)T, (long long)q->cols, (long long)p->n_heads, (long long)p->head_dim, (long long)p->v_off,
            (long long)p->v_dim, (long long)p->topk);
    return;
  }
  if (T <= 0) return;
  cudaSetDevice(b->device);
  paged_dev pd = {cu_f(kv->k), kv->k->cols, kv->block_rows, cu_i(ix->tables)};
  attention_sparse_kernel<<<(unsigned)(T * p->n_heads), SA_THREADS, shm, b->stream>>>(
      cu_fw(out), cu_f(q), cu_i(sel), pd, cu_i(ix->tab), p->n_heads, p->head_dim, p->v_off, p->v_dim, p->topk, p->scale);
  cu_check(b, "attention_sparse");
}
