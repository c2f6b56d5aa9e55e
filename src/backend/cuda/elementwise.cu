/* elementwise.cu — the per-row and per-element ops on f32 activations:
 * rmsnorm (and a residual add fused with it), rope, act_mul (silu, gelu_tanh, gelu, relu), add, softcap,
 * get_rows and kv_write. Formulas and rounding follow cpu/ref.c: the
 * rmsnorm sum is taken in double, rope angles in double, and products that
 * ref.c rounds separately are not fused. */
#include "backend/cuda/kv_quant.cuh"

static bool same_shape(const bk_tensor *a, const bk_tensor *b) { return a->rows == b->rows && a->cols == b->cols; }

/* ---- rmsnorm ---- */

#define RMS_THREADS 256

/* 1 / rms of a row from each thread's part ss of its sum of squares (the block's threads together; in double,
 * as ref.c sums). */
static __device__ __forceinline__ float rms_inv(double ss, int64_t d, float eps) {
  __shared__ double part[RMS_THREADS / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  double tot = 0;
#pragma unroll
  for (int k = 0; k < RMS_THREADS / 32; k++) tot += part[k];
  return (float)(1.0 / sqrt(tot / (double)d + (double)eps));
}

__global__ void __launch_bounds__(RMS_THREADS)
    rmsnorm_kernel(float *y, const float *x, int64_t d, const float *__restrict__ w, float eps, int unit_offset) {
  const float *xr = x + (int64_t)blockIdx.x * d;
  float *yr = y + (int64_t)blockIdx.x * d;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < d; i += RMS_THREADS) ss += (double)xr[i] * (double)xr[i];
  const float inv = rms_inv(ss, d, eps);
  for (int64_t i = threadIdx.x; i < d; i += RMS_THREADS) {
    float s = w ? (unit_offset ? __fadd_rn(1.0f, w[i]) : w[i]) : 1.0f;
    yr[i] = __fmul_rn(__fmul_rn(xr[i], inv), s);
  }
}

void cu_rmsnorm(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, float eps, bool unit_offset) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  if (!same_shape(x, y) || (w && bk_nelem(w) != x->cols)) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda rmsnorm: x [%lld, %lld], y [%lld, %lld], w of %lld", (long long)x->rows,
            (long long)x->cols, (long long)y->rows, (long long)y->cols, (long long)(w ? bk_nelem(w) : 0));
    return;
  }
  if (x->rows <= 0 || x->cols <= 0) return;
  cudaSetDevice(b->device);
  rmsnorm_kernel<<<(unsigned)x->rows, RMS_THREADS, 0, b->stream>>>(cu_fw(y), cu_f(x), x->cols, w ? cu_f(w) : NULL, eps,
                                                                    unit_offset ? 1 : 0);
  cu_check(b, "rmsnorm");
}

/* Block r: x[r] += d[r], then y[r] = rmsnorm(x[r]) with rmsnorm_kernel's arithmetic (each thread reads back only
 * the elements it wrote), so the result is that of cu_add then cu_rmsnorm. */
__global__ void __launch_bounds__(RMS_THREADS)
    add_rmsnorm_kernel(float *x, const float *__restrict__ dd, float *__restrict__ y, int64_t d,
                       const float *__restrict__ w, float eps, int unit_offset) {
  float *xr = x + (int64_t)blockIdx.x * d;
  const float *dr = dd + (int64_t)blockIdx.x * d;
  float *yr = y + (int64_t)blockIdx.x * d;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < d; i += RMS_THREADS) {
    const float v = xr[i] + dr[i];
    xr[i] = v;
    ss += (double)v * (double)v;
  }
  const float inv = rms_inv(ss, d, eps);
  for (int64_t i = threadIdx.x; i < d; i += RMS_THREADS) {
    float s = w ? (unit_offset ? __fadd_rn(1.0f, w[i]) : w[i]) : 1.0f;
    yr[i] = __fmul_rn(__fmul_rn(xr[i], inv), s);
  }
}

void cu_add_rmsnorm(bk_backend *be, const bk_tensor *x, const bk_tensor *d, const bk_tensor *y, const bk_tensor *w,
                    float eps, bool unit_offset) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  if (!same_shape(x, y) || !same_shape(x, d) || (w && bk_nelem(w) != x->cols)) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda add_rmsnorm: x [%lld, %lld], d [%lld, %lld], y [%lld, %lld], w of %lld",
            (long long)x->rows, (long long)x->cols, (long long)d->rows, (long long)d->cols, (long long)y->rows,
            (long long)y->cols, (long long)(w ? bk_nelem(w) : 0));
    return;
  }
  if (x->rows <= 0 || x->cols <= 0) return;
  cudaSetDevice(b->device);
  add_rmsnorm_kernel<<<(unsigned)x->rows, RMS_THREADS, 0, b->stream>>>(cu_fw(x), cu_f(d), cu_fw(y), x->cols,
                                                                        w ? cu_f(w) : NULL, eps, unit_offset ? 1 : 0);
  cu_check(b, "add_rmsnorm");
}

/* ---- rope ---- */

/* Block r: token r's position(s) (na axes: frequency i turns by axis inv_freq[half + i]); thread i per
 * frequency, over all heads. */
__global__ void rope_kernel(float *x, int64_t n_heads, int64_t head_dim, const int32_t *__restrict__ pos,
                            const double *__restrict__ inv_freq, int64_t half, double attn_scale, int interleaved, int na) {
  const int64_t r = blockIdx.x;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const double p = (double)pos[r * na + (na > 1 ? (int)inv_freq[half + i] : 0)];
    double sn, cs;
    sincos(p * inv_freq[i], &sn, &cs);
    const float c = (float)(cs * attn_scale), s = (float)(sn * attn_scale);
    const int64_t i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
    for (int64_t h = 0; h < n_heads; h++) {
      float *v = x + (r * n_heads + h) * head_dim;
      const float a = v[i0], bb = v[i1];
      v[i0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(bb, s));
      v[i1] = __fadd_rn(__fmul_rn(bb, c), __fmul_rn(a, s));
    }
  }
}

void cu_rope(bk_backend *be, const bk_tensor *x, int64_t n_heads, int64_t head_dim, const bk_tensor *pos, const rope_table *t) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  const int na = t->n_axes > 1 ? (int)t->n_axes : 1;
  if (x->cols != n_heads * head_dim || bk_nelem(pos) < x->rows * na || t->rot_dim > head_dim || t->rot_dim % 2 ||
      t->rot_dim < 0 || (na > 1 && !t->axis)) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda rope: x [%lld, %lld] as %lld heads of %lld, rot_dim %lld, %lld positions",
            (long long)x->rows, (long long)x->cols, (long long)n_heads, (long long)head_dim, (long long)t->rot_dim,
            (long long)bk_nelem(pos));
    return;
  }
  const int64_t half = t->rot_dim / 2;
  if (x->rows <= 0 || half <= 0 || n_heads <= 0) return;
  cudaSetDevice(b->device);
  const double *f = cu_rope_freqs(b, t);
  if (!f) return;
  int threads = half >= 128 ? 128 : (int)((half + 31) / 32 * 32);
  rope_kernel<<<(unsigned)x->rows, threads, 0, b->stream>>>(cu_fw(x), n_heads, head_dim, cu_i(pos), f, half, t->attn_scale,
                                                            t->interleaved ? 1 : 0, na);
  cu_check(b, "rope");
}

/* ---- activations ---- */

__global__ void act_mul_kernel(float *gate, const float *up, int64_t n, int act) {
  GRID_LOOP(i, n) {
    float v = gate[i], a;
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
    gate[i] = __fmul_rn(a, up[i]);
  }
}

void cu_act_mul(bk_backend *be, const bk_tensor *gate, const bk_tensor *up, bk_act act) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  const int64_t n = bk_nelem(gate);
  if (bk_nelem(up) != n || (unsigned)act > BK_ACT_RELU) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda act_mul: gate of %lld, up of %lld, act %d", (long long)n, (long long)bk_nelem(up),
            (int)act);
    return;
  }
  if (n <= 0) return;
  cudaSetDevice(b->device);
  act_mul_kernel<<<grid_for(n, 256), 256, 0, b->stream>>>(cu_fw(gate), cu_f(up), n, (int)act);
  cu_check(b, "act_mul");
}

/* ---- add, softcap ---- */

__global__ void add_kernel(float *y, const float *a, const float *c, int64_t n) {
  GRID_LOOP(i, n) y[i] = a[i] + c[i];
}

void cu_add(bk_backend *be, const bk_tensor *y, const bk_tensor *a, const bk_tensor *c) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  const int64_t n = bk_nelem(y);
  if (bk_nelem(a) != n || bk_nelem(c) != n) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda add: %lld = %lld + %lld elements", (long long)n, (long long)bk_nelem(a),
            (long long)bk_nelem(c));
    return;
  }
  if (n <= 0) return;
  cudaSetDevice(b->device);
  add_kernel<<<grid_for(n, 256), 256, 0, b->stream>>>(cu_fw(y), cu_f(a), cu_f(c), n);
  cu_check(b, "add");
}

__global__ void softcap_kernel(float *x, int64_t n, float cap) {
  GRID_LOOP(i, n) x[i] = __fmul_rn(cap, tanhf(x[i] / cap));
}

void cu_softcap(bk_backend *be, const bk_tensor *x, float cap) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  const int64_t n = bk_nelem(x);
  if (n <= 0) return;
  cudaSetDevice(b->device);
  softcap_kernel<<<grid_for(n, 256), 256, 0, b->stream>>>(cu_fw(x), n, cap);
  cu_check(b, "softcap");
}

/* ---- get_rows, kv_write ---- */

/* y[r] = x[idx[r]] for r < n rows of cols; rows outside [0, x_rows) give zeros. */
__global__ void get_rows_kernel(float *__restrict__ y, const float *__restrict__ x, int64_t x_rows, int64_t cols,
                                const int32_t *__restrict__ idx, int64_t n) {
  GRID_LOOP(i, n * cols) {
    int64_t r = i / cols, c = i % cols;
    int32_t src = idx[r];
    y[i] = src >= 0 && src < x_rows ? x[(int64_t)src * cols + c] : 0.0f;
  }
}

void cu_get_rows(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *rows) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  if (y->cols != x->cols || bk_nelem(rows) < y->rows || rows->dt != BK_DT_I32) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda get_rows: y [%lld, %lld] from x [%lld, %lld] with %lld indices", (long long)y->rows,
            (long long)y->cols, (long long)x->rows, (long long)x->cols, (long long)bk_nelem(rows));
    return;
  }
  if (y->rows <= 0 || y->cols <= 0) return;
  cudaSetDevice(b->device);
  get_rows_kernel<<<grid_for(y->rows * y->cols, 256), 256, 0, b->stream>>>(cu_fw(y), cu_f(x), x->rows, x->cols, cu_i(rows),
                                                                          y->rows);
  cu_check(b, "get_rows");
}

/* K[slot[t]] = k_new[t], V[slot[t]] = v_new[t]; slots outside the arena are skipped. */
__global__ void kv_write_kernel(float *__restrict__ K, float *__restrict__ V, int64_t n_slots, const float *__restrict__ kn,
                                const float *__restrict__ vn, const int32_t *__restrict__ slot, int64_t T, int64_t dim) {
  GRID_LOOP(i, T * dim) {
    int64_t t = i / dim, c = i % dim;
    int32_t s = slot[t];
    if (s < 0 || s >= n_slots) continue;
    K[(int64_t)s * dim + c] = kn[i];
    V[(int64_t)s * dim + c] = vn[i];
  }
}

/* Quantized rows (8 / 4-bit, FP8): one warp per (token, block of 32
 * elements), a lane per element; the warp's max gives the block's scale,
 * lane 0 stores it. */
__global__ void kv_quant_write_kernel(unsigned char *__restrict__ arena, int64_t row_bytes, int64_t n_slots, int fmt,
                                      const float *__restrict__ src, const int32_t *__restrict__ slot, int64_t T,
                                      int64_t dim) {
  const int64_t nb = (dim + 31) / 32, warps = T * nb;
  const int lane = threadIdx.x & 31;
  for (int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; w < warps;
       w += ((int64_t)gridDim.x * blockDim.x) >> 5) {
    const int64_t t = w / nb, b = w % nb, i = b * 32 + lane;
    const int32_t s = slot[t];
    if (s < 0 || s >= n_slots) continue; /* the same for the whole warp */
    const float x = i < dim ? src[t * dim + i] : 0.0f;
    float amax = fabsf(x);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    unsigned char *blk = arena + (int64_t)s * row_bytes + b * kvq_block_bytes(fmt);
    if (fmt == BK_KV_FP8) { /* x / d, as the host divides */
      const float d = __fdiv_rn(amax, 448.0f);
      if (lane == 0) *(float *)blk = d;
      blk[4 + lane] = i < dim && d > 0.0f ? kvq_fp8_encode(__fdiv_rn(x, d)) : 0;
      continue;
    }
    const float qmax = fmt == BK_KV_Q8 ? 127.0f : 7.0f;
    const float d = __fdiv_rn(amax, qmax), id = d > 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    float c = rintf(__fmul_rn(x, id));
    c = fminf(fmaxf(c, -qmax), qmax);
    const int code = i < dim ? (int)c : 0;
    if (lane == 0) *(float *)blk = d;
    if (fmt == BK_KV_Q8) {
      blk[4 + lane] = (unsigned char)(signed char)code;
    } else {
      const int hi = __shfl_down_sync(0xffffffffu, code, 16); /* element lane + 16 */
      if (lane < 16) blk[4 + lane] = (unsigned char)((code + 8) | ((hi + 8) << 4));
    }
  }
}

void cu_kv_write(bk_backend *be, const bk_kv_layer *kv, const bk_tensor *k_new, const bk_tensor *v_new, const bk_tensor *slot) {
  cu_backend *b = cu_be(be);
  if (b->err.code) return;
  const int64_t T = k_new->rows, dim = k_new->cols;
  const int64_t kw = (int64_t)bk_kv_row_bytes(kv->k_fmt, dim) / 4, vw = (int64_t)bk_kv_row_bytes(kv->v_fmt, dim) / 4;
  if (!same_shape(k_new, v_new) || kv->k->cols != kw || kv->v->cols != vw || kv->k->rows != kv->v->rows ||
      bk_nelem(slot) < T || (unsigned)kv->k_fmt > BK_KV_FMT_LAST || (unsigned)kv->v_fmt > BK_KV_FMT_LAST) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda kv_write: k_new [%lld, %lld], v_new [%lld, %lld] into arenas of %lld / %lld columns (formats %d / %d)",
            (long long)k_new->rows, (long long)k_new->cols, (long long)v_new->rows, (long long)v_new->cols,
            (long long)kv->k->cols, (long long)kv->v->cols, (int)kv->k_fmt, (int)kv->v_fmt);
    return;
  }
  if (T <= 0 || dim <= 0) return;
  cudaSetDevice(b->device);
  if (kv->k_fmt == BK_KV_F32 && kv->v_fmt == BK_KV_F32) {
    kv_write_kernel<<<grid_for(T * dim, 256), 256, 0, b->stream>>>(cu_fw(kv->k), cu_fw(kv->v), kv->k->rows, cu_f(k_new),
                                                                   cu_f(v_new), cu_i(slot), T, dim);
    cu_check(b, "kv_write");
    return;
  }
  const bk_tensor *arena[2] = {kv->k, kv->v}, *src[2] = {k_new, v_new};
  const bk_kv_fmt fmt[2] = {kv->k_fmt, kv->v_fmt};
  for (int h = 0; h < 2; h++) {
    const int64_t words = arena[h]->cols;
    if (fmt[h] == BK_KV_F32) /* the f32 kernel writes both arenas: run it on this one twice */
      kv_write_kernel<<<grid_for(T * dim, 256), 256, 0, b->stream>>>(cu_fw(arena[h]), cu_fw(arena[h]), arena[h]->rows,
                                                                     cu_f(src[h]), cu_f(src[h]), cu_i(slot), T, dim);
    else
      kv_quant_write_kernel<<<grid_for(T * ((dim + 31) / 32) * 32, 256), 256, 0, b->stream>>>(
          (unsigned char *)cu_fw(arena[h]), words * 4, arena[h]->rows, (int)fmt[h], cu_f(src[h]), cu_i(slot), T, dim);
    if (cu_check(b, "kv_write")) return;
  }
}
