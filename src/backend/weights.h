/* weights.h — weight matrices kept in their stored format (f32, f16, bf16,
 * GGUF Q8_0 / Q4_0 / Q4_K / Q5_K / Q6_K, MLX affine 4/8-bit) and the matmul
 * that multiplies activations by them without converting the whole matrix.
 *
 * A bk_weight only describes memory it does not own: the bytes may point
 * into an mmap of a safetensors or GGUF file. GGUF blocks are bit-exact with
 * ggml's layouts; MLX affine weights are uint32 words holding 32/bits values
 * each (element j of a word in bits [j*bits, (j+1)*bits)), with one scale
 * and one bias per group of group_size consecutive inputs of a row:
 * w = scale * q + bias.
 *
 * bk_matmul picks a kernel for the CPU at run time (scalar, AVX2+FMA+F16C,
 * AVX-512); HEARTH_CPU=scalar|avx2|avx512 in the environment, or
 * bk_cpu_set_level, forces a lower level.
 */
#ifndef HEARTH_BACKEND_WEIGHTS_H
#define HEARTH_BACKEND_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/pool.h"
#include "base/status.h"

typedef enum bk_type {
  BK_F32 = 0,
  BK_F16,
  BK_BF16,
  BK_Q8_0,       /* ggml block_q8_0: f16 d; int8 qs[32]             (34 bytes / 32)  */
  BK_Q4_0,       /* ggml block_q4_0: f16 d; uint8 qs[16]            (18 bytes / 32)  */
  BK_Q4_K,       /* ggml block_q4_K: f16 d, dmin; scales[12]; qs[128] (144 bytes / 256) */
  BK_Q5_K,       /* ggml block_q5_K: f16 d, dmin; scales[12]; qh[32]; qs[128] (176 / 256) */
  BK_Q6_K,       /* ggml block_q6_K: ql[128]; qh[64]; int8 scales[16]; f16 d (210 / 256) */
  BK_MLX_AFFINE, /* MLX affine: bits 4|8, group_size 32|64|128, scales + biases */
  BK_TYPE_COUNT
} bk_type;

typedef struct bk_weight {
  bk_type type;
  int64_t rows;          /* outputs */
  int64_t cols;          /* inputs; a multiple of the type's block (32, 256, group_size) */
  const void *data;      /* borrowed: rows * bk_row_bytes(type, cols) bytes, row-major */
  /* BK_MLX_AFFINE only */
  int bits;              /* 4 or 8 */
  int group_size;        /* 32, 64 or 128 */
  bk_type scale_type;    /* BK_F32, BK_F16 or BK_BF16: the dtype of scales and biases */
  const void *scales;    /* borrowed: [rows, cols / group_size] */
  const void *biases;    /* borrowed: [rows, cols / group_size] */
  /* Set by bk_weight_pack: the matrix repacked for 8-bit integer kernels
   * (owned through this descriptor: release with bk_weight_unpack; a copy
   * of the descriptor must not outlive it). NULL: the stored format is used. */
  void *packed;
  size_t packed_size;
} bk_weight;

/* "f32", "q4_K", "mlx4"... (static string). */
const char *bk_type_name(bk_type t);
/* Elements per block of the type (1 for f32/f16/bf16; 32; 256). MLX: 1 (see group_size). */
int64_t bk_type_block(bk_type t);
/* Bytes one row of cols elements takes; 0 when cols is not a whole number of
 * blocks. For MLX, the packed words only (bits given separately). */
size_t bk_row_bytes(bk_type t, int64_t cols, int bits);

/* Checks that w describes something bk_matmul can run: known type, positive
 * shape, cols a whole number of blocks, non-NULL pointers, valid MLX bits /
 * group_size / scale_type. The message names the problem. */
int bk_weight_validate(const bk_weight *w, herr *err);

/* y[n, rows] = x[n, cols] · Wᵀ (+ bias[rows] when bias != NULL), spread over
 * the pool's threads (pool may be NULL). y must not alias x. Every element of
 * y is written. Fails only when w does not validate (y untouched then). */
int bk_matmul(hpool *pool, float *y, const float *x, int64_t n, const bk_weight *w, const float *bias, herr *err);

/* Repacks w (Q8_0, Q4_0, Q4_K, Q5_K or Q6_K) into 16-row groups for the 8-bit integer
 * kernels, when the CPU level in effect has them (AVX-512 VNNI). bk_matmul
 * then quantizes activations to 8 bits per block of 32, as llama.cpp does
 * for these types, instead of multiplying f32 activations by the
 * dequantized weights: faster, but no longer exact to the dequantized
 * weights. Does nothing (returns 0) for other types, other CPUs, when
 * HEARTH_ACT=f32 is set in the environment, or when w is packed already.
 * w->data stays as it was and stays in use for other levels. */
int bk_weight_pack(bk_weight *w, herr *err);
void bk_weight_unpack(bk_weight *w);
/* For a packed w whose stored bytes the caller owns privately and no longer
 * needs (nothing else reads them): gives their whole pages back to the
 * system and sets w->data to NULL, so that only the packed copy stays in
 * memory. No-op when w is not packed. */
void bk_weight_drop_source(bk_weight *w);
/* Whether this CPU (and build) has the integer kernels. */
bool bk_cpu_has_int8_dot(void);

/* Dispatch levels, lowest first. */
typedef enum bk_cpu_level { BK_CPU_SCALAR = 0, BK_CPU_AVX2 = 1, BK_CPU_AVX512 = 2 } bk_cpu_level;
/* The best level this CPU (and build) supports. */
bk_cpu_level bk_cpu_best(void);
/* The level bk_matmul uses now: HEARTH_CPU when set (clamped to what the CPU
 * supports), else bk_cpu_best(). */
bk_cpu_level bk_cpu_level_now(void);
/* Forces a level (clamped to bk_cpu_best()); returns the level in effect.
 * Not meant to be called while a matmul runs. */
bk_cpu_level bk_cpu_set_level(bk_cpu_level level);
const char *bk_cpu_level_name(bk_cpu_level level);

#endif
