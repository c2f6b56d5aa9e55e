/* quant_cuda.cuh — device-side decoding of every stored weight format (f32,
 * f16, bf16, GGUF Q8_0 / Q4_0 / Q5_0 / Q5_1 / Q2_K / Q3_K / Q4_K / Q5_K /
 * Q6_K / IQ4_NL / IQ4_XS, MLX affine 4/8-bit with
 * f32 / f16 / bf16 scales, FP8 E4M3 with per-row f32 scales), bit-exact to
 * bk_dequant_range in formats.c.
 * A row is read as sub-blocks of 32 consecutive elements; f32 / f16 / bf16
 * rows whose length is not a multiple of 32 also have a per-element tail.
 * Products and sums are rounded separately (no fused multiply-add) so that
 * the values equal the CPU's. */
#ifndef HEARTH_BACKEND_CUDA_QUANT_CUH
#define HEARTH_BACKEND_CUDA_QUANT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

/* A weight as the kernels see it (device pointers). */
struct cu_wdesc {
  const uint8_t *data;
  const void *scales, *biases;  /* MLX only */
  int64_t rows, cols;
  int64_t row_bytes;
  int type;                     /* bk_type */
  int bits, group_size, scale_type;
  int vec;                      /* f32/f16/bf16: every row starts 16-byte aligned (16-byte loads) */
};

/* The device descriptor of a loaded weight (matmul.cu). */
CU_HIDDEN cu_wdesc cu_make_wdesc(const bk_weight *w);

/* ggml block sizes in bytes */
#define CU_Q8_0_BYTES 34
#define CU_Q4_0_BYTES 18
#define CU_Q4_K_BYTES 144
#define CU_Q5_K_BYTES 176
#define CU_Q6_K_BYTES 210
#define CU_Q5_0_BYTES 22
#define CU_Q5_1_BYTES 24
#define CU_Q2_K_BYTES 84
#define CU_Q3_K_BYTES 110
#define CU_IQ4_NL_BYTES 18
#define CU_IQ4_XS_BYTES 136

/* ggml's kvalues_iq4nl (formats.c bk_iq4nl_values): the 16 levels of IQ4_NL / IQ4_XS. */
static __constant__ int8_t cu_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static __device__ __forceinline__ float cu_h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
static __device__ __forceinline__ float cu_bf2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
static __device__ __forceinline__ uint16_t cu_ld16(const uint8_t *p) { return *(const uint16_t *)p; }
/* FP8 E4M3 -> f32 (exact, through half). */
static __device__ __forceinline__ float cu_fp8f(uint8_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3)));
}

static __device__ __forceinline__ float cu_scale_value(int st, const void *p, int64_t i) {
  if (st == BK_F16) return cu_h2f(((const uint16_t *)p)[i]);
  if (st == BK_BF16) return cu_bf2f(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}

static __device__ __forceinline__ void cu_k_scale_min(const uint8_t *q, int j, int *sc, int *m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

/* Element k of row `row` of an f32 / f16 / bf16 / FP8 weight. */
template <int T>
static __device__ __forceinline__ float cu_load_elem(const cu_wdesc &w, int64_t row, int64_t k) {
  const uint8_t *base = w.data + row * w.row_bytes;
  if (T == BK_FP8) return __fmul_rn(((const float *)w.scales)[row], cu_fp8f(base[k]));
  if (T == BK_F32) return ((const float *)base)[k];
  if (T == BK_F16) return cu_h2f(((const uint16_t *)base)[k]);
  return cu_bf2f(((const uint16_t *)base)[k]);
}

/* v[0..32) = elements [32 s, 32 s + 32) of row `row`. */
template <int T>
static __device__ __forceinline__ void cu_load_sub(const cu_wdesc &w, int64_t row, int64_t s, float v[32]) {
  const uint8_t *base = w.data + row * w.row_bytes;
  if (T == BK_F32) {
    const float *p = (const float *)base + 32 * s;
    if (w.vec) {
#pragma unroll
      for (int i = 0; i < 8; i++) {
        float4 f = ((const float4 *)p)[i];
        v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; i++) v[i] = p[i];
    }
  } else if (T == BK_F16 || T == BK_BF16) {
    const uint16_t *p = (const uint16_t *)base + 32 * s;
    if (w.vec) {
#pragma unroll
      for (int i = 0; i < 4; i++) {
        uint4 u = ((const uint4 *)p)[i];
        uint32_t a[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
          uint16_t lo = (uint16_t)(a[k] & 0xFFFF), hi = (uint16_t)(a[k] >> 16);
          v[8 * i + 2 * k] = T == BK_F16 ? cu_h2f(lo) : cu_bf2f(lo);
          v[8 * i + 2 * k + 1] = T == BK_F16 ? cu_h2f(hi) : cu_bf2f(hi);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; i++) v[i] = T == BK_F16 ? cu_h2f(p[i]) : cu_bf2f(p[i]);
    }
  } else if (T == BK_Q8_0) {
    const uint8_t *b = base + s * CU_Q8_0_BYTES;
    float d = cu_h2f(cu_ld16(b));
#pragma unroll
    for (int i = 0; i < 16; i++) {
      uint16_t u = cu_ld16(b + 2 + 2 * i);
      v[2 * i] = __fmul_rn((float)(int8_t)(u & 0xFF), d);
      v[2 * i + 1] = __fmul_rn((float)(int8_t)(u >> 8), d);
    }
  } else if (T == BK_Q4_0) {
    const uint8_t *b = base + s * CU_Q4_0_BYTES;
    float d = cu_h2f(cu_ld16(b));
#pragma unroll
    for (int i = 0; i < 8; i++) {
      uint16_t u = cu_ld16(b + 2 + 2 * i);
      int q0 = u & 0xFF, q1 = u >> 8;
      v[2 * i] = __fmul_rn((float)((q0 & 0xF) - 8), d);
      v[2 * i + 1] = __fmul_rn((float)((q1 & 0xF) - 8), d);
      v[2 * i + 16] = __fmul_rn((float)((q0 >> 4) - 8), d);
      v[2 * i + 17] = __fmul_rn((float)((q1 >> 4) - 8), d);
    }
  } else if (T == BK_Q4_K || T == BK_Q5_K) {
    const int bytes = T == BK_Q4_K ? CU_Q4_K_BYTES : CU_Q5_K_BYTES;
    const uint8_t *b = base + (s >> 3) * bytes;
    int j = (int)(s & 7), p = j >> 1, hi = j & 1;
    float d = cu_h2f(cu_ld16(b)), dmin = cu_h2f(cu_ld16(b + 2));
    int sc, m;
    cu_k_scale_min(b + 4, j, &sc, &m);
    float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
    const uint8_t *qs = b + (T == BK_Q4_K ? 16 : 48) + 32 * p;
    uint4 q4[2] = {((const uint4 *)qs)[0], ((const uint4 *)qs)[1]};
    const uint8_t *q = (const uint8_t *)q4;
    if (T == BK_Q4_K) {
#pragma unroll
      for (int l = 0; l < 32; l++) {
        int n = hi ? q[l] >> 4 : q[l] & 0xF;
        v[l] = __fsub_rn(__fmul_rn(d1, (float)n), m1);
      }
    } else {
      uint4 h4[2] = {((const uint4 *)(b + 16))[0], ((const uint4 *)(b + 16))[1]};
      const uint8_t *qh = (const uint8_t *)h4;
      int bit = 2 * p + hi;
#pragma unroll
      for (int l = 0; l < 32; l++) {
        int n = (hi ? q[l] >> 4 : q[l] & 0xF) + (((qh[l] >> bit) & 1) ? 16 : 0);
        v[l] = __fsub_rn(__fmul_rn(d1, (float)n), m1);
      }
    }
  } else if (T == BK_Q6_K) {
    const uint8_t *b = base + (s >> 3) * CU_Q6_K_BYTES;
    int j = (int)(s & 7), h = j >> 2, k = j & 3;
    const uint8_t *ql = b + 64 * h + 32 * (k & 1), *qh = b + 128 + 32 * h;
    const int8_t *sc = (const int8_t *)(b + 192) + 8 * h + 2 * k;
    float d = cu_h2f(cu_ld16(b + 208));
    float ds0 = __fmul_rn(d, (float)sc[0]), ds1 = __fmul_rn(d, (float)sc[1]);
#pragma unroll
    for (int i = 0; i < 16; i++) {
      uint16_t lq = cu_ld16(ql + 2 * i), hq = cu_ld16(qh + 2 * i);
#pragma unroll
      for (int e = 0; e < 2; e++) {
        int l = 2 * i + e;
        int lb = e ? lq >> 8 : lq & 0xFF, hb = e ? hq >> 8 : hq & 0xFF;
        int n = ((k >= 2 ? lb >> 4 : lb & 0xF) | (((hb >> (2 * k)) & 3) << 4)) - 32;
        v[l] = __fmul_rn(l < 16 ? ds0 : ds1, (float)n);
      }
    }
  } else if (T == BK_Q5_0 || T == BK_Q5_1) {
    /* d (, m) f16; qh: fifth bits of elements 0..31 (a little-endian word); qs nibbles as Q4_0's */
    const uint8_t *b = base + s * (T == BK_Q5_0 ? CU_Q5_0_BYTES : CU_Q5_1_BYTES);
    const uint8_t *qh = b + (T == BK_Q5_0 ? 2 : 4), *qs = qh + 4;
    float d = cu_h2f(cu_ld16(b)), m = T == BK_Q5_1 ? cu_h2f(cu_ld16(b + 2)) : 0.0f;
    uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
#pragma unroll
    for (int i = 0; i < 16; i++) {
      int q = qs[i];
      int lo = (q & 0xF) | (int)(((h >> i) & 1) << 4), hi = (q >> 4) | (int)(((h >> (i + 16)) & 1) << 4);
      if (T == BK_Q5_0) {
        v[i] = __fmul_rn((float)(lo - 16), d);
        v[i + 16] = __fmul_rn((float)(hi - 16), d);
      } else {
        v[i] = __fadd_rn(__fmul_rn((float)lo, d), m);
        v[i + 16] = __fadd_rn(__fmul_rn((float)hi, d), m);
      }
    }
  } else if (T == BK_Q2_K || T == BK_Q3_K) {
    /* sub-block s & 7 = 4h + j: elements 128h + 32j + l, quant bits 2j.. of qs[32h + l], scale 8h + 2j + (l >= 16) */
    const uint8_t *b = base + (s >> 3) * (T == BK_Q2_K ? CU_Q2_K_BYTES : CU_Q3_K_BYTES);
    int jj = (int)(s & 7), h = jj >> 2, j = jj & 3;
    const uint8_t *qs = b + (T == BK_Q2_K ? 16 : 32) + 32 * h;
    float dl[2], ml[2] = {0.0f, 0.0f};
    if (T == BK_Q2_K) {
      float d = cu_h2f(cu_ld16(b + 80)), dmin = cu_h2f(cu_ld16(b + 82));
#pragma unroll
      for (int c = 0; c < 2; c++) {
        int sc = b[8 * h + 2 * j + c];
        dl[c] = __fmul_rn(d, (float)(sc & 0xF));
        ml[c] = __fmul_rn(dmin, (float)(sc >> 4));
      }
    } else {
      float d = cu_h2f(cu_ld16(b + 108));
      const uint8_t *sb = b + 96;
#pragma unroll
      for (int c = 0; c < 2; c++) {
        int t = 8 * h + 2 * j + c;
        int sc = (t < 8 ? sb[t] & 0xF : sb[t - 8] >> 4) | (((sb[8 + (t & 3)] >> (2 * (t >> 2))) & 3) << 4);
        dl[c] = __fmul_rn(d, (float)(sc - 32));
      }
    }
#pragma unroll
    for (int l = 0; l < 32; l++) {
      int q = (qs[l] >> (2 * j)) & 3;
      if (T == BK_Q2_K) {
        v[l] = __fsub_rn(__fmul_rn(dl[l >> 4], (float)q), ml[l >> 4]);
      } else {
        int hb = (b[l] >> (4 * h + j)) & 1; /* hmask at offset 0 */
        v[l] = __fmul_rn(dl[l >> 4], (float)(q - (hb ? 0 : 4)));
      }
    }
  } else if (T == BK_IQ4_NL || T == BK_IQ4_XS) {
    const uint8_t *qs;
    float dl;
    if (T == BK_IQ4_NL) {
      const uint8_t *b = base + s * CU_IQ4_NL_BYTES;
      dl = cu_h2f(cu_ld16(b));
      qs = b + 2;
    } else {
      const uint8_t *b = base + (s >> 3) * CU_IQ4_XS_BYTES;
      int ib = (int)(s & 7);
      int ls = ((b[4 + (ib >> 1)] >> (4 * (ib & 1))) & 0xF) | (((cu_ld16(b + 2) >> (2 * ib)) & 3) << 4);
      dl = __fmul_rn(cu_h2f(cu_ld16(b)), (float)(ls - 32));
      qs = b + 8 + 16 * ib;
    }
#pragma unroll
    for (int i = 0; i < 16; i++) {
      int q = qs[i];
      v[i] = __fmul_rn(dl, (float)cu_iq4nl_values[q & 0xF]);
      v[i + 16] = __fmul_rn(dl, (float)cu_iq4nl_values[q >> 4]);
    }
  } else if (T == BK_FP8) {
    const float sc = ((const float *)w.scales)[row];
#pragma unroll
    for (int i = 0; i < 32; i++) v[i] = __fmul_rn(sc, cu_fp8f(base[32 * s + i]));
  } else if (T == BK_MLX_AFFINE) {
    const int64_t k0 = 32 * s;
    const int64_t g = row * (w.cols / w.group_size) + k0 / w.group_size;
    float sc = cu_scale_value(w.scale_type, w.scales, g), bi = cu_scale_value(w.scale_type, w.biases, g);
    const uint32_t *q = (const uint32_t *)w.data + (row * w.cols + k0) * w.bits / 32;
    if (w.bits == 4) {
      uint4 u = *(const uint4 *)q;
      uint32_t a[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int i = 0; i < 32; i++) v[i] = __fadd_rn(__fmul_rn(sc, (float)((a[i >> 3] >> ((i & 7) * 4)) & 0xF)), bi);
    } else {
      uint4 u0 = ((const uint4 *)q)[0], u1 = ((const uint4 *)q)[1];
      uint32_t a[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
      for (int i = 0; i < 32; i++) v[i] = __fadd_rn(__fmul_rn(sc, (float)((a[i >> 2] >> ((i & 3) * 8)) & 0xFF)), bi);
    }
  }
}

/* Whether type T may have a per-element tail (cols not a multiple of 32). */
template <int T>
static __device__ __forceinline__ constexpr bool cu_has_tail() {
  return T == BK_F32 || T == BK_F16 || T == BK_BF16 || T == BK_FP8;
}

#endif
