/* kv_quant.cuh — the KV cache's 8 / 4-bit and FP8 (E4M3) row formats
 * (backend/ops.h, bk_kv_fmt) on the device: reading one element of a stored
 * row, the four elements of a word of an 8-bit block's codes, and the
 * quantizers of kv_write, with the reference's rounding (ref.c,
 * op_kv_quantize_row: scale = max|x| / qmax, codes of x * (1 / scale);
 * FP8: scale = max|x| / 448, codes of x / scale; every step rounded as the
 * host rounds it; E4M3 as
 * formats.c's bk_fp8_encode / bk_fp8_decode, bit for bit). Internal to
 * libhearth_cuda.so. */
#ifndef HEARTH_BACKEND_CUDA_KV_QUANT_CUH
#define HEARTH_BACKEND_CUDA_KV_QUANT_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.cuh"

/* Bytes of one block of 32 elements. */
static __host__ __device__ __forceinline__ int kvq_block_bytes(int fmt) { return fmt == BK_KV_Q4 ? 20 : 36; }

/* Whether the format stores one byte per element (Q8, FP8: 36-byte blocks whose codes are read a word at a time). */
static __host__ __device__ __forceinline__ bool kvq_is8(int fmt) { return fmt == BK_KV_Q8 || fmt == BK_KV_FP8; }

/* FP8 E4M3 ("fn": no infinities, S.1111.111 NaN) -> f32, exact (every E4M3 value is a half). */
static __device__ __forceinline__ float kvq_fp8(unsigned b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)(b & 0xffu), __NV_E4M3)));
}

/* The four codes of word w of an 8-bit block (bytes 0..3: elements in order), unscaled. */
static __device__ __forceinline__ float4 kvq_word8(int fmt, unsigned w) {
  if (fmt == BK_KV_FP8) {
    const float2 lo = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xffffu), __NV_E4M3)));
    const float2 hi = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3)));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  }
  return make_float4((float)(signed char)w, (float)(signed char)(w >> 8), (float)(signed char)(w >> 16),
                     (float)(signed char)(w >> 24));
}

/* f32 -> E4M3 as bk_fp8_encode: nearest even, ±448 and beyond (and
 * infinities) saturate to ±448, NaN gives 0x7F. Every step but the final
 * rounding is exact, so the byte equals the host's. */
static __device__ __forceinline__ unsigned char kvq_fp8_encode(float f) {
  if (f != f) return 0x7F;
  const unsigned char sign = signbit(f) ? 0x80 : 0;
  const float a = fabsf(f);
  if (a >= 448.0f) return sign | 0x7E;
  if (a < 0.015625f) return sign | (unsigned char)__float2int_rn(__fmul_rn(a, 512.0f)); /* subnormal steps of 2^-9 */
  int ex;
  const float fr = frexpf(a, &ex); /* a = fr * 2^ex, fr in [0.5, 1) */
  int e = ex - 1 + 7, m = __float2int_rn(__fmul_rn(__fadd_rn(__fmul_rn(fr, 2.0f), -1.0f), 8.0f));
  if (m == 8) m = 0, e++;
  if (e > 15 || (e == 15 && m == 7)) return sign | 0x7E;
  return sign | (unsigned char)(e << 3 | m);
}

/* Element i of a stored row (row: its first word). */
static __device__ __forceinline__ float kvq_elem(const float *row, int fmt, int64_t i) {
  if (fmt == BK_KV_F32) return row[i];
  const unsigned char *blk = (const unsigned char *)row + (i >> 5) * kvq_block_bytes(fmt);
  const float d = *(const float *)blk;
  const int r = (int)(i & 31);
  if (fmt == BK_KV_FP8) return __fmul_rn(d, kvq_fp8(blk[4 + r]));
  const int c = fmt == BK_KV_Q8 ? (int)(signed char)blk[4 + r] : (int)((blk[4 + (r & 15)] >> ((r >> 4) * 4)) & 15) - 8;
  return __fmul_rn(d, (float)c);
}

#endif
