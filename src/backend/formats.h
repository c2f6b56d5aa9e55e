/* formats.h — the stored weight formats in plain C, device-independent (as
 * ggml keeps ggml-quants.c beside, not inside, its CPU backend): half /
 * bfloat16 / FP8 bit conversions, the GGUF block structs (bit-exact with
 * ggml), dequantization of a row or part of a row (the reference every
 * kernel of every backend is checked against), and quantization from f32
 * (round to nearest, as ggml and MLX do). The descriptor (bk_weight) and the
 * sizes are declared in weights.h; formats.c defines them.
 */
#ifndef HEARTH_BACKEND_FORMATS_H
#define HEARTH_BACKEND_FORMATS_H

#include <stdint.h>
#include <string.h>

#include "backend/weights.h"

/* IEEE half and bfloat16 <-> f32; encoding rounds to nearest even, NaN stays
 * NaN. bk_fp16_decode and bk_bf16_decode are declared in weights.h. */
uint16_t bk_fp16_encode(float f);
uint16_t bk_bf16_encode(float f);
/* f32 -> FP8 E4M3, rounded to nearest even; beyond ±448 (and infinities)
 * saturate to ±448, NaN stays NaN. bk_fp8_decode is declared in weights.h. */
uint8_t bk_fp8_encode(float f);
/* FP8 E4M3 -> f32, exact: the one decoding (bk_fp8_decode is this), in
 * integer and float arithmetic without branches or selects, so that a loop
 * over bytes vectorizes. The byte's exponent and mantissa bits go into an
 * f32 whose exponent is rebiased from 7 to 127 (x = ±2^(e-7) · (1 + m/8));
 * for a subnormal (e = 0) that reads ±2^-7 · (1 + m/8), and (x ∓ 2^-7) · 2
 * = ±m · 2^-9 is its value, every step exact; the sign is set again (for
 * -0); S.1111.111 becomes NaN. */
static inline float bk_fp8_value(uint8_t b) {
  uint32_t s = (uint32_t)(b & 0x80) << 24, em = b & 0x7Fu;
  uint32_t sub = (em - 8) >> 31, nan = (em + 1) >> 7; /* 1 when e = 0; 1 for S.1111.111 */
  uint32_t xb = s | ((em << 20) + (120u << 23)), ob = (s | (120u << 23)) & (0u - sub), vb;
  float x, off, v;
  memcpy(&x, &xb, 4);
  memcpy(&off, &ob, 4);
  v = (x - off) * (float)(1 + sub);
  memcpy(&vb, &v, 4);
  vb = ((vb | s) & ~(0u - nan)) | (0x7FC00000u & (0u - nan));
  memcpy(&v, &vb, 4);
  return v;
}

#define BK_QK 32   /* elements per Q8_0 / Q4_0 block */
#define BK_QKK 256 /* elements per K-quant super-block */

typedef struct bk_block_q8_0 {
  uint16_t d;      /* f16 scale */
  int8_t qs[32];   /* value = qs[i] * d */
} bk_block_q8_0;

typedef struct bk_block_q4_0 {
  uint16_t d;      /* f16 scale */
  uint8_t qs[16];  /* low nibbles: elements 0..15, high nibbles: 16..31; value = (q - 8) * d */
} bk_block_q4_0;

typedef struct bk_block_q4_K {
  uint16_t d;          /* f16 super-block scale of the 6-bit scales */
  uint16_t dmin;       /* f16 super-block scale of the 6-bit mins */
  uint8_t scales[12];  /* 8 scales + 8 mins, 6 bits each (ggml get_scale_min_k4 packing) */
  uint8_t qs[128];     /* 4-bit quants: byte 32p+l holds elements 64p+l (low) and 64p+32+l (high) */
} bk_block_q4_K;

typedef struct bk_block_q5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];      /* fifth bit: bit 2p of qh[l] for element 64p+l, bit 2p+1 for 64p+32+l */
  uint8_t qs[128];
} bk_block_q5_K;

typedef struct bk_block_q6_K {
  uint8_t ql[128];     /* low 4 bits */
  uint8_t qh[64];      /* high 2 bits */
  int8_t scales[16];   /* one per 16 elements */
  uint16_t d;          /* f16 super-block scale */
} bk_block_q6_K;

typedef struct bk_block_q5_0 {
  uint16_t d;      /* f16 scale */
  uint8_t qh[4];   /* fifth bits: bit j of the little-endian word for element j (0..31) */
  uint8_t qs[16];  /* low nibbles: elements 0..15, high nibbles: 16..31; value = ((q | h << 4) - 16) * d */
} bk_block_q5_0;

typedef struct bk_block_q5_1 {
  uint16_t d, m;   /* f16 scale and min; value = (q | h << 4) * d + m */
  uint8_t qh[4];
  uint8_t qs[16];
} bk_block_q5_1;

typedef struct bk_block_q2_K {
  uint8_t scales[16];  /* per 16 elements: low nibble scale, high nibble min */
  uint8_t qs[64];      /* 2-bit quants: byte 32h+l, bits 2j..2j+1, holds element 128h+32j+l (l < 32) */
  uint16_t d, dmin;    /* f16 super-block scales of the scales and the mins */
} bk_block_q2_K;

typedef struct bk_block_q3_K {
  uint8_t hmask[32];   /* high bit, set for q >= 0: bit 4h+j of hmask[l] for element 128h+32j+l */
  uint8_t qs[64];      /* low 2 bits, laid out as Q2_K's */
  uint8_t scales[12];  /* 16 six-bit scales (stored + 32) */
  uint16_t d;          /* f16 super-block scale */
} bk_block_q3_K;

typedef struct bk_block_iq4_nl {
  uint16_t d;      /* f16 scale */
  uint8_t qs[16];  /* 4-bit indices into bk_iq4nl_values, nibbles as Q4_0's; value = d * table[q] */
} bk_block_iq4_nl;

typedef struct bk_block_iq4_xs {
  uint16_t d;          /* f16 super-block scale */
  uint16_t scales_h;   /* high 2 bits of the 8 six-bit sub-block scales (bits 2j, 2j+1) */
  uint8_t scales_l[4]; /* low 4 bits: nibble j % 2 of scales_l[j / 2] */
  uint8_t qs[128];     /* per 32-element sub-block j, 16 bytes as IQ4_NL's; value = d * (ls - 32) * table[q] */
} bk_block_iq4_xs;

/* ggml's kvalues_iq4nl: the 16 levels of IQ4_NL / IQ4_XS. */
extern const int8_t bk_iq4nl_values[16];

_Static_assert(sizeof(bk_block_q8_0) == 34, "block_q8_0 is 34 bytes");
_Static_assert(sizeof(bk_block_q4_0) == 18, "block_q4_0 is 18 bytes");
_Static_assert(sizeof(bk_block_q4_K) == 144, "block_q4_K is 144 bytes");
_Static_assert(sizeof(bk_block_q5_K) == 176, "block_q5_K is 176 bytes");
_Static_assert(sizeof(bk_block_q6_K) == 210, "block_q6_K is 210 bytes");
_Static_assert(sizeof(bk_block_q5_0) == 22, "block_q5_0 is 22 bytes");
_Static_assert(sizeof(bk_block_q5_1) == 24, "block_q5_1 is 24 bytes");
_Static_assert(sizeof(bk_block_q2_K) == 84, "block_q2_K is 84 bytes");
_Static_assert(sizeof(bk_block_q3_K) == 110, "block_q3_K is 110 bytes");
_Static_assert(sizeof(bk_block_iq4_nl) == 18, "block_iq4_nl is 18 bytes");
_Static_assert(sizeof(bk_block_iq4_xs) == 136, "block_iq4_xs is 136 bytes");

/* The 6-bit scale (0..63, stored with +32) of sub-block j (0..15) of a Q3_K block. */
int bk_q3_K_scale(const uint8_t scales[12], int j);

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block. */
void bk_k_scale_min(const uint8_t scales[12], int j, uint8_t *sc, uint8_t *m);

/* bk_dequant_row (a whole row, checked) is declared in weights.h. */
/* out[0..len) = elements [k0, k0+len) of row `row`; k0 and len whole blocks
 * (any for f32/f16/bf16; multiples of 256 always work). No checks: for kernels. */
void bk_dequant_range(const bk_weight *w, int64_t row, int64_t k0, int64_t len, float *out);

/* Quantizes x[rows, cols] into out (rows * bk_row_bytes(type, cols) bytes)
 * for F32, F16, BF16 and every GGUF block type (round to nearest: the block
 * layouts are ggml's, the choice of scales simpler than its search). */
int bk_quantize(bk_type type, const float *x, int64_t rows, int64_t cols, void *out, herr *err);

/* MLX affine quantization of x[rows, cols]: wq gets rows * cols * bits / 32
 * words; scales and biases rows * cols / group_size values of scale_type
 * (F32, F16 or BF16). Per group: scale = (max - min) / (2^bits - 1),
 * bias = min, q = round((x - bias) / scale) using the stored (rounded)
 * scale and bias. */
int bk_quantize_mlx(const float *x, int64_t rows, int64_t cols, int bits, int group_size, bk_type scale_type,
                    uint32_t *wq, void *scales, void *biases, herr *err);

/* FP8 E4M3 with one scale per row: scales[r] = max|x[r]| / 448 (0 for a
 * row of zeros), q[r, k] = e4m3(x[r, k] / scales[r]). q: rows * cols bytes. */
int bk_quantize_fp8(const float *x, int64_t rows, int64_t cols, uint8_t *q, float *scales, herr *err);

#endif
