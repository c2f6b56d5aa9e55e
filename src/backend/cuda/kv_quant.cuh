/* kv_quant.cuh — the KV cache's 8 / 4-bit row formats (backend/ops.h,
 * bk_kv_fmt) on the device: reading one element of a stored row, and the
 * quantizer of kv_write, with the reference's rounding (ref.c,
 * op_kv_quantize_row: scale = max|x| / qmax, codes rint(x * (1 / scale)),
 * every step rounded as the host rounds it). Internal to libhearth_cuda.so. */
#ifndef HEARTH_BACKEND_CUDA_KV_QUANT_CUH
#define HEARTH_BACKEND_CUDA_KV_QUANT_CUH

#include "backend/cuda/cuda_common.cuh"

/* Bytes of one block of 32 elements. */
static __host__ __device__ __forceinline__ int kvq_block_bytes(int fmt) { return fmt == BK_KV_Q8 ? 36 : 20; }

/* Element i of a stored row (row: its first word). */
static __device__ __forceinline__ float kvq_elem(const float *row, int fmt, int64_t i) {
  if (fmt == BK_KV_F32) return row[i];
  const unsigned char *blk = (const unsigned char *)row + (i >> 5) * kvq_block_bytes(fmt);
  const float d = *(const float *)blk;
  const int r = (int)(i & 31);
  const int c = fmt == BK_KV_Q8 ? (int)(signed char)blk[4 + r] : (int)((blk[4 + (r & 15)] >> ((r >> 4) * 4)) & 15) - 8;
  return __fmul_rn(d, (float)c);
}

#endif
