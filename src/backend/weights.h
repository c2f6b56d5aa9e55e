/* weights.h — weight matrices kept in their stored format (f32, f16, bf16,
 * GGUF Q8_0 / Q4_0 / Q5_0 / Q5_1 / Q2_K / Q3_K / Q4_K / Q5_K / Q6_K /
 * IQ4_NL / IQ4_XS, MLX affine 4/8-bit, FP8) and the matmul
 * that multiplies activations by them without converting the whole matrix.
 *
 * A bk_weight only describes memory it does not own: the bytes may point
 * into an mmap of a safetensors or GGUF file. GGUF blocks are bit-exact with
 * ggml's layouts; MLX affine weights are uint32 words holding 32/bits values
 * each (element j of a word in bits [j*bits, (j+1)*bits)), with one scale
 * and one bias per group of group_size consecutive inputs of a row:
 * w = scale * q + bias. FP8 weights are E4M3 bytes with one f32 scale per
 * output row (per channel), w = scale * e4m3.
 *
 * Backends take a host descriptor and make it theirs (backend.h,
 * bk_weight_load); the CPU's matmul over it is in cpu/cpu.h.
 */
#ifndef HEARTH_BACKEND_WEIGHTS_H
#define HEARTH_BACKEND_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
  BK_FP8,        /* FP8 E4M3 (the OCP "fn" variant: no infinities, S.1111.111 is NaN), one byte an
                    element, and one f32 scale per output row (scales [rows]): w = scale[row] * e4m3 */
  BK_Q5_0,       /* ggml block_q5_0: f16 d; qh[4]; qs[16]           (22 bytes / 32)  */
  BK_Q5_1,       /* ggml block_q5_1: f16 d, m; qh[4]; qs[16]        (24 bytes / 32)  */
  BK_Q2_K,       /* ggml block_q2_K: scales[16]; qs[64]; f16 d, dmin (84 bytes / 256) */
  BK_Q3_K,       /* ggml block_q3_K: hmask[32]; qs[64]; scales[12]; f16 d (110 / 256) */
  BK_IQ4_NL,     /* ggml block_iq4_nl: f16 d; qs[16], 4-bit indices into kvalues_iq4nl (18 / 32) */
  BK_IQ4_XS,     /* ggml block_iq4_xs: f16 d; scales_h; scales_l[4]; qs[128] (136 / 256) */
  BK_TYPE_COUNT
} bk_type;

typedef struct bk_weight {
  bk_type type;
  int64_t rows;          /* outputs */
  int64_t cols;          /* inputs; a multiple of the type's block (32, 256, group_size) */
  const void *data;      /* borrowed: rows * bk_row_bytes(type, cols) bytes, row-major */
  /* BK_MLX_AFFINE only (scales: BK_FP8 too) */
  int bits;              /* 4 or 8 */
  int group_size;        /* 32, 64 or 128 */
  bk_type scale_type;    /* BK_F32, BK_F16 or BK_BF16: the dtype of scales and biases */
  const void *scales;    /* borrowed: [rows, cols / group_size]; BK_FP8: f32 [rows] */
  const void *biases;    /* borrowed: [rows, cols / group_size] */
  /* Set by the backend that loaded the weight (bk_weight_load): the CPU's
   * repacked copy for its 8-bit integer kernels, or the device allocation
   * the pointers above now point into (owned through this descriptor:
   * release with bk_weight_release; a copy of the descriptor must not
   * outlive it). NULL: the stored format, in host memory, is used as is. */
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

/* The one host decoding of the stored formats (src/backend/formats.c, the
 * reference every kernel of every backend is checked against), for code
 * outside the backend that needs plain floats (GGUF norms and biases, convert).
 * IEEE half and bfloat16 -> f32 (exact). */
float bk_fp16_decode(uint16_t h);
float bk_bf16_decode(uint16_t h);
/* FP8 E4M3 ("fn": no infinities; 0x7F / 0xFF are NaN) -> f32 (exact). */
float bk_fp8_decode(uint8_t b);
/* out[0..cols) = row `row` of w as floats, for every stored format (a vector
 * is a weight of one row). w must validate (checked: the message names the
 * problem). */
int bk_dequant_row(const bk_weight *w, int64_t row, float *out, herr *err);

/* Checks that w describes something bk_matmul can run: known type, positive
 * shape, cols a whole number of blocks, non-NULL pointers, valid MLX bits /
 * group_size / scale_type. The message names the problem. */
int bk_weight_validate(const bk_weight *w, herr *err);

#endif
