/* formats.c — the stored weight formats in plain C, for every backend and
 * for the code above them (model loading, convert, fuse): half / bfloat16 /
 * FP8 conversions, block sizes, the descriptor check, the reference
 * dequantization of every bk_type (the spec every kernel of every backend is
 * tested against; for Q5_0, Q5_1, Q2_K, Q3_K, IQ4_NL and IQ4_XS also checked
 * bit for bit against ggml's own dequantized floats, tests/fixtures/quants)
 * and quantization from f32. Block layouts follow ggml's
 * ggml-common.h / ggml-quants.c bit for bit; the K-quant quantizers here are
 * plain round-to-nearest (ggml searches scales iteratively, IQ4 levels
 * with an importance weighting; the stored format is the same). Knows nothing
 * of files, models, threads or devices: the CPU's kernels live in cpu/, the
 * GPU's in cuda/.
 */
#include "backend/formats.h"

#include <math.h>
#include <string.h>

#include "base/half.h"

/* ---- half / bfloat16 ---- */


uint16_t bk_fp16_encode(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return sign | 0x7E00;     /* NaN */
  if (ax >= 0x477FF000u) return sign | 0x7C00;    /* >= 65520 rounds to infinity */
  if (ax < 0x38800000u) {                         /* below 2^-14: subnormal half */
    float a;
    memcpy(&a, &ax, 4);
    return sign | (uint16_t)lrintf(a * 16777216.0f); /* exact scaling, rounds to nearest even */
  }
  uint32_t h = (((ax >> 23) - 112) << 10) | ((ax >> 13) & 0x3FF);
  uint32_t rest = ax & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++; /* a carry into the exponent is right */
  return sign | (uint16_t)h;
}

float bk_fp16_decode(uint16_t h) { return hf16_to_f32(h); }

/* ---- FP8 E4M3 ---- */

float bk_fp8_decode(uint8_t b) { return bk_fp8_value(b); }

uint8_t bk_fp8_encode(float f) {
  if (f != f) return 0x7F;
  uint8_t sign = signbit(f) ? 0x80 : 0;
  float a = fabsf(f);
  if (a >= 448.0f) return sign | 0x7E; /* saturates to the largest finite value */
  if (a < 0.015625f) {                 /* below 2^-6: subnormal steps of 2^-9 (8 is the smallest normal, 0x08) */
    return sign | (uint8_t)lrintf(a * 512.0f);
  }
  int ex;
  float fr = frexpf(a, &ex); /* a = fr * 2^ex, fr in [0.5, 1) */
  int e = ex - 1 + 7, m = (int)lrintf((fr * 2.0f - 1.0f) * 8.0f); /* round to nearest even */
  if (m == 8) m = 0, e++;
  if (e > 15 || (e == 15 && m == 7)) return sign | 0x7E;
  return sign | (uint8_t)(e << 3 | m);
}
float bk_bf16_decode(uint16_t h) { return hbf16_to_f32(h); }

uint16_t bk_bf16_encode(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x40);
  return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1)) >> 16);
}

/* ---- sizes ---- */

const char *bk_type_name(bk_type t) {
  static const char *names[BK_TYPE_COUNT] = {"f32",  "f16",  "bf16", "q8_0", "q4_0",   "q4_K",  "q5_K", "q6_K",
                                             "mlx_affine", "fp8", "q5_0", "q5_1", "q2_K", "q3_K", "iq4_nl", "iq4_xs"};
  return (unsigned)t < BK_TYPE_COUNT ? names[t] : "unknown";
}

int64_t bk_type_block(bk_type t) {
  switch (t) {
    case BK_Q8_0: case BK_Q4_0: case BK_Q5_0: case BK_Q5_1: case BK_IQ4_NL: return BK_QK;
    case BK_Q4_K: case BK_Q5_K: case BK_Q6_K: case BK_Q2_K: case BK_Q3_K: case BK_IQ4_XS: return BK_QKK;
    default: return 1;
  }
}

size_t bk_row_bytes(bk_type t, int64_t cols, int bits) {
  if (cols <= 0) return 0;
  int64_t blk = bk_type_block(t);
  if (cols % blk) return 0;
  switch (t) {
    case BK_F32: return (size_t)cols * 4;
    case BK_F16: case BK_BF16: return (size_t)cols * 2;
    case BK_FP8: return (size_t)cols;
    case BK_Q8_0: return (size_t)(cols / blk) * sizeof(bk_block_q8_0);
    case BK_Q4_0: return (size_t)(cols / blk) * sizeof(bk_block_q4_0);
    case BK_Q4_K: return (size_t)(cols / blk) * sizeof(bk_block_q4_K);
    case BK_Q5_K: return (size_t)(cols / blk) * sizeof(bk_block_q5_K);
    case BK_Q6_K: return (size_t)(cols / blk) * sizeof(bk_block_q6_K);
    case BK_Q5_0: return (size_t)(cols / blk) * sizeof(bk_block_q5_0);
    case BK_Q5_1: return (size_t)(cols / blk) * sizeof(bk_block_q5_1);
    case BK_Q2_K: return (size_t)(cols / blk) * sizeof(bk_block_q2_K);
    case BK_Q3_K: return (size_t)(cols / blk) * sizeof(bk_block_q3_K);
    case BK_IQ4_NL: return (size_t)(cols / blk) * sizeof(bk_block_iq4_nl);
    case BK_IQ4_XS: return (size_t)(cols / blk) * sizeof(bk_block_iq4_xs);
    case BK_MLX_AFFINE:
      if ((bits != 4 && bits != 8) || (cols * bits) % 32) return 0;
      return (size_t)(cols * bits / 8);
    default: return 0;
  }
}

/* ---- validation ---- */

int bk_weight_validate(const bk_weight *w, herr *err) {
  if (!w) return herr_set(err, HEARTH_EINVAL, "weight: NULL descriptor");
  if ((unsigned)w->type >= BK_TYPE_COUNT) return herr_set(err, HEARTH_EINVAL, "weight: unknown type %d", (int)w->type);
  const char *tn = bk_type_name(w->type);
  if (w->rows <= 0 || w->cols <= 0)
    return herr_set(err, HEARTH_EINVAL, "weight %s: shape %lld x %lld is empty", tn, (long long)w->rows, (long long)w->cols);
  if (!w->data && !w->packed) return herr_set(err, HEARTH_EINVAL, "weight %s: no data", tn);
  if (w->type == BK_MLX_AFFINE) {
    if (w->bits != 4 && w->bits != 8) return herr_set(err, HEARTH_EINVAL, "weight mlx_affine: bits %d (want 4 or 8)", w->bits);
    if (w->group_size != 32 && w->group_size != 64 && w->group_size != 128)
      return herr_set(err, HEARTH_EINVAL, "weight mlx_affine: group_size %d (want 32, 64 or 128)", w->group_size);
    if (w->cols % w->group_size)
      return herr_set(err, HEARTH_EINVAL, "weight mlx_affine: %lld columns are not a whole number of %d-element groups",
                      (long long)w->cols, w->group_size);
    if (w->scale_type != BK_F32 && w->scale_type != BK_F16 && w->scale_type != BK_BF16)
      return herr_set(err, HEARTH_EINVAL, "weight mlx_affine: scales of type %s (want f32, f16 or bf16)",
                      bk_type_name(w->scale_type));
    if (!w->scales || !w->biases) return herr_set(err, HEARTH_EINVAL, "weight mlx_affine: missing scales or biases");
    return 0;
  }
  if (w->type == BK_FP8 && !w->scales) return herr_set(err, HEARTH_EINVAL, "weight fp8: missing scales");
  if (w->cols % bk_type_block(w->type))
    return herr_set(err, HEARTH_EINVAL, "weight %s: %lld columns are not a whole number of %lld-element blocks", tn,
                    (long long)w->cols, (long long)bk_type_block(w->type));
  return 0;
}

/* ---- dequantization (reference) ---- */

static inline void k_scale_min(const uint8_t q[12], int j, uint8_t *sc, uint8_t *m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void bk_k_scale_min(const uint8_t q[12], int j, uint8_t *sc, uint8_t *m) { k_scale_min(q, j, sc, m); }

static float scale_value(bk_type t, const void *p, int64_t i) {
  if (t == BK_F16) return hf16_to_f32(((const uint16_t *)p)[i]);
  if (t == BK_BF16) return hbf16_to_f32(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}

static void dequant_q8_0(const bk_block_q8_0 *b, int64_t nb, float *y) {
  for (int64_t i = 0; i < nb; i++, y += 32) {
    float d = hf16_to_f32(b[i].d);
    for (int l = 0; l < 32; l++) y[l] = b[i].qs[l] * d;
  }
}

static void dequant_q4_0(const bk_block_q4_0 *b, int64_t nb, float *y) {
  for (int64_t i = 0; i < nb; i++, y += 32) {
    float d = hf16_to_f32(b[i].d);
    for (int l = 0; l < 16; l++) {
      y[l] = ((b[i].qs[l] & 0xF) - 8) * d;
      y[l + 16] = ((b[i].qs[l] >> 4) - 8) * d;
    }
  }
}

static void dequant_q4_K(const bk_block_q4_K *b, int64_t nb, float *y) {
  for (int64_t i = 0; i < nb; i++) {
    float d = hf16_to_f32(b[i].d), dmin = hf16_to_f32(b[i].dmin);
    const uint8_t *q = b[i].qs;
    for (int p = 0; p < 4; p++, q += 32) {
      uint8_t sc, m;
      k_scale_min(b[i].scales, 2 * p, &sc, &m);
      float d1 = d * sc, m1 = dmin * m;
      k_scale_min(b[i].scales, 2 * p + 1, &sc, &m);
      float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
    }
  }
}

static void dequant_q5_K(const bk_block_q5_K *b, int64_t nb, float *y) {
  for (int64_t i = 0; i < nb; i++) {
    float d = hf16_to_f32(b[i].d), dmin = hf16_to_f32(b[i].dmin);
    const uint8_t *q = b[i].qs, *qh = b[i].qh;
    for (int p = 0; p < 4; p++, q += 32) {
      uint8_t sc, m;
      k_scale_min(b[i].scales, 2 * p, &sc, &m);
      float d1 = d * sc, m1 = dmin * m;
      k_scale_min(b[i].scales, 2 * p + 1, &sc, &m);
      float d2 = d * sc, m2 = dmin * m;
      uint8_t u1 = (uint8_t)(1u << (2 * p)), u2 = (uint8_t)(2u << (2 * p));
      for (int l = 0; l < 32; l++) *y++ = d1 * ((q[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; l++) *y++ = d2 * ((q[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
  }
}

static void dequant_q6_K(const bk_block_q6_K *b, int64_t nb, float *y) {
  for (int64_t i = 0; i < nb; i++) {
    float d = hf16_to_f32(b[i].d);
    const uint8_t *ql = b[i].ql, *qh = b[i].qh;
    const int8_t *sc = b[i].scales;
    for (int h = 0; h < 2; h++, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; l++) {
        int is = l / 16;
        int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
    }
  }
}

const int8_t bk_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* Q5_0 / Q5_1: element j (0..15) and j + 16 of a block, each with its fifth bit from the 32-bit qh word. */
static inline void q5_pair(const uint8_t qs[16], const uint8_t qh[4], int j, int *lo, int *hi) {
  uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
  *lo = (qs[j] & 0xF) | (int)(((h >> j) & 1) << 4);
  *hi = (qs[j] >> 4) | (int)(((h >> (j + 16)) & 1) << 4);
}

static void dequant_q5_0(const bk_block_q5_0 *b, int64_t nb, float *y) {
  for (int64_t i = 0; i < nb; i++, y += 32) {
    float d = hf16_to_f32(b[i].d);
    for (int j = 0; j < 16; j++) {
      int lo, hi;
      q5_pair(b[i].qs, b[i].qh, j, &lo, &hi);
      y[j] = (float)(lo - 16) * d;
      y[j + 16] = (float)(hi - 16) * d;
    }
  }
}

static void dequant_q5_1(const bk_block_q5_1 *b, int64_t nb, float *y) {
  for (int64_t i = 0; i < nb; i++, y += 32) {
    float d = hf16_to_f32(b[i].d), m = hf16_to_f32(b[i].m);
    for (int j = 0; j < 16; j++) {
      int lo, hi;
      q5_pair(b[i].qs, b[i].qh, j, &lo, &hi);
      y[j] = (float)lo * d + m;
      y[j + 16] = (float)hi * d + m;
    }
  }
}

/* Q2_K: sub-block s (0..15) of 16 elements is 128h + 32j + 16c + l (s = 8h + 2j + c): scale
 * d * (scales[s] & 15), min dmin * (scales[s] >> 4), quant bits 2j.. of qs[32h + 16c + l]. */
static void dequant_q2_K(const bk_block_q2_K *b, int64_t nb, float *y) {
  for (int64_t i = 0; i < nb; i++) {
    float d = hf16_to_f32(b[i].d), dmin = hf16_to_f32(b[i].dmin);
    for (int s = 0; s < 16; s++, y += 16) {
      int h = s / 8, j = (s % 8) / 2, c = s % 2;
      float dl = d * (float)(b[i].scales[s] & 0xF), ml = dmin * (float)(b[i].scales[s] >> 4);
      const uint8_t *q = b[i].qs + 32 * h + 16 * c;
      for (int l = 0; l < 16; l++) y[l] = dl * (float)((q[l] >> (2 * j)) & 3) - ml;
    }
  }
}

int bk_q3_K_scale(const uint8_t scales[12], int j) {
  int lo = j < 8 ? scales[j] & 0xF : scales[j - 8] >> 4;
  int hi = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return lo | hi << 4;
}

/* Q3_K: laid out as Q2_K, a quant q2 - 4 when its hmask bit is clear, scale d * (scale - 32). */
static void dequant_q3_K(const bk_block_q3_K *b, int64_t nb, float *y) {
  for (int64_t i = 0; i < nb; i++) {
    float d = hf16_to_f32(b[i].d);
    for (int s = 0; s < 16; s++, y += 16) {
      int h = s / 8, j = (s % 8) / 2, c = s % 2;
      float dl = d * (float)(bk_q3_K_scale(b[i].scales, s) - 32);
      const uint8_t *q = b[i].qs + 32 * h + 16 * c, *hm = b[i].hmask + 16 * c;
      uint8_t bit = (uint8_t)(1u << (4 * h + j));
      for (int l = 0; l < 16; l++) y[l] = dl * (float)(((q[l] >> (2 * j)) & 3) - (hm[l] & bit ? 0 : 4));
    }
  }
}

static void dequant_iq4_nl(const bk_block_iq4_nl *b, int64_t nb, float *y) {
  for (int64_t i = 0; i < nb; i++, y += 32) {
    float d = hf16_to_f32(b[i].d);
    for (int j = 0; j < 16; j++) {
      y[j] = d * (float)bk_iq4nl_values[b[i].qs[j] & 0xF];
      y[j + 16] = d * (float)bk_iq4nl_values[b[i].qs[j] >> 4];
    }
  }
}

static void dequant_iq4_xs(const bk_block_iq4_xs *b, int64_t nb, float *y) {
  for (int64_t i = 0; i < nb; i++) {
    float d = hf16_to_f32(b[i].d);
    for (int s = 0; s < 8; s++, y += 32) {
      int ls = ((b[i].scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | (((b[i].scales_h >> (2 * s)) & 3) << 4);
      float dl = d * (float)(ls - 32);
      const uint8_t *q = b[i].qs + 16 * s;
      for (int j = 0; j < 16; j++) {
        y[j] = dl * (float)bk_iq4nl_values[q[j] & 0xF];
        y[j + 16] = dl * (float)bk_iq4nl_values[q[j] >> 4];
      }
    }
  }
}

static void dequant_mlx(const bk_weight *w, int64_t row, int64_t k0, int64_t len, float *y) {
  const uint32_t *q = (const uint32_t *)w->data + (row * w->cols + k0) * w->bits / 32;
  const int gs = w->group_size, per = 32 / w->bits;
  int64_t g0 = row * (w->cols / gs) + k0 / gs;
  uint32_t mask = (1u << w->bits) - 1;
  for (int64_t g = 0; g < len / gs; g++) {
    float s = scale_value(w->scale_type, w->scales, g0 + g), b = scale_value(w->scale_type, w->biases, g0 + g);
    const uint32_t *qg = q + g * gs / per;
    float *yg = y + g * gs;
    for (int k = 0; k < gs; k++) yg[k] = s * (float)((qg[k / per] >> ((k % per) * w->bits)) & mask) + b;
  }
}

void bk_dequant_range(const bk_weight *w, int64_t row, int64_t k0, int64_t len, float *out) {
  const uint8_t *base = (const uint8_t *)w->data + (size_t)row * bk_row_bytes(w->type, w->cols, w->bits);
  int64_t blk = bk_type_block(w->type);
  switch (w->type) {
    case BK_F32: memcpy(out, (const float *)base + k0, (size_t)len * 4); break;
    case BK_F16:
      for (int64_t k = 0; k < len; k++) out[k] = hf16_to_f32(((const uint16_t *)base)[k0 + k]);
      break;
    case BK_BF16:
      for (int64_t k = 0; k < len; k++) out[k] = hbf16_to_f32(((const uint16_t *)base)[k0 + k]);
      break;
    case BK_Q8_0: dequant_q8_0((const bk_block_q8_0 *)base + k0 / blk, len / blk, out); break;
    case BK_Q4_0: dequant_q4_0((const bk_block_q4_0 *)base + k0 / blk, len / blk, out); break;
    case BK_Q4_K: dequant_q4_K((const bk_block_q4_K *)base + k0 / blk, len / blk, out); break;
    case BK_Q5_K: dequant_q5_K((const bk_block_q5_K *)base + k0 / blk, len / blk, out); break;
    case BK_Q6_K: dequant_q6_K((const bk_block_q6_K *)base + k0 / blk, len / blk, out); break;
    case BK_Q5_0: dequant_q5_0((const bk_block_q5_0 *)base + k0 / blk, len / blk, out); break;
    case BK_Q5_1: dequant_q5_1((const bk_block_q5_1 *)base + k0 / blk, len / blk, out); break;
    case BK_Q2_K: dequant_q2_K((const bk_block_q2_K *)base + k0 / blk, len / blk, out); break;
    case BK_Q3_K: dequant_q3_K((const bk_block_q3_K *)base + k0 / blk, len / blk, out); break;
    case BK_IQ4_NL: dequant_iq4_nl((const bk_block_iq4_nl *)base + k0 / blk, len / blk, out); break;
    case BK_IQ4_XS: dequant_iq4_xs((const bk_block_iq4_xs *)base + k0 / blk, len / blk, out); break;
    case BK_MLX_AFFINE: dequant_mlx(w, row, k0, len, out); break;
    case BK_FP8: {
      float s = ((const float *)w->scales)[row];
      for (int64_t k = 0; k < len; k++) out[k] = s * bk_fp8_decode(base[k0 + k]);
      break;
    }
    default: break;
  }
}

int bk_dequant_row(const bk_weight *w, int64_t row, float *out, herr *err) {
  int rc = bk_weight_validate(w, err);
  if (rc) return rc;
  if (row < 0 || row >= w->rows)
    return herr_set(err, HEARTH_EINVAL, "dequant: row %lld outside [0, %lld)", (long long)row, (long long)w->rows);
  bk_dequant_range(w, row, 0, w->cols, out);
  return 0;
}

/* ---- quantization ---- */

static int nearest(float x) { return (int)lrintf(x); }
static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

static void quantize_q8_0(const float *x, int64_t nb, bk_block_q8_0 *b) {
  for (int64_t i = 0; i < nb; i++, x += 32) {
    float amax = 0;
    for (int l = 0; l < 32; l++) amax = fmaxf(amax, fabsf(x[l]));
    float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
    b[i].d = bk_fp16_encode(d);
    for (int l = 0; l < 32; l++) b[i].qs[l] = (int8_t)clampi(nearest(x[l] * id), -127, 127);
  }
}

static void quantize_q4_0(const float *x, int64_t nb, bk_block_q4_0 *b) {
  for (int64_t i = 0; i < nb; i++, x += 32) {
    float amax = 0, max = 0; /* max: the value of largest magnitude, sign kept (as ggml) */
    for (int l = 0; l < 32; l++)
      if (fabsf(x[l]) > amax) {
        amax = fabsf(x[l]);
        max = x[l];
      }
    float d = max / -8.0f, id = d ? 1.0f / d : 0.0f;
    b[i].d = bk_fp16_encode(d);
    for (int l = 0; l < 16; l++) {
      int q0 = clampi(nearest(x[l] * id) + 8, 0, 15), q1 = clampi(nearest(x[l + 16] * id) + 8, 0, 15);
      b[i].qs[l] = (uint8_t)(q0 | (q1 << 4));
    }
  }
}

/* Packs 8 six-bit scales and mins the way bk_k_scale_min reads them. */
static void pack_k_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t out[12]) {
  for (int j = 0; j < 4; j++) {
    out[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    out[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
}

/* Q4_K / Q5_K: per 32-element sub-block x ≈ d*sc*q - dmin*m with q in [0, nmax].
 * Fills L[256] with the quants and the packed header fields. */
static void quantize_k_affine(const float *x, int nmax, uint16_t *d_out, uint16_t *dmin_out, uint8_t scales[12],
                              uint8_t L[256]) {
  float scale[8], minv[8], max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; j++) {
    float mn = x[32 * j], mx = x[32 * j];
    for (int l = 1; l < 32; l++) {
      mn = fminf(mn, x[32 * j + l]);
      mx = fmaxf(mx, x[32 * j + l]);
    }
    if (mn > 0) mn = 0;
    scale[j] = (mx - mn) / (float)nmax;
    minv[j] = -mn;
    max_scale = fmaxf(max_scale, scale[j]);
    max_min = fmaxf(max_min, minv[j]);
  }
  float d = max_scale / 63.0f, dmin = max_min / 63.0f;
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; j++) {
    sc[j] = (uint8_t)(d ? clampi(nearest(scale[j] / d), 0, 63) : 0);
    m[j] = (uint8_t)(dmin ? clampi(nearest(minv[j] / dmin), 0, 63) : 0);
  }
  *d_out = bk_fp16_encode(d);
  *dmin_out = bk_fp16_encode(dmin);
  pack_k_scales(sc, m, scales);
  float dr = hf16_to_f32(*d_out), dminr = hf16_to_f32(*dmin_out);
  for (int j = 0; j < 8; j++) {
    float ds = dr * sc[j], ms = dminr * m[j];
    for (int l = 0; l < 32; l++) L[32 * j + l] = (uint8_t)(ds ? clampi(nearest((x[32 * j + l] + ms) / ds), 0, nmax) : 0);
  }
}

static void quantize_q4_K(const float *x, int64_t nb, bk_block_q4_K *b) {
  uint8_t L[256];
  for (int64_t i = 0; i < nb; i++, x += 256) {
    quantize_k_affine(x, 15, &b[i].d, &b[i].dmin, b[i].scales, L);
    for (int p = 0; p < 4; p++)
      for (int l = 0; l < 32; l++) b[i].qs[32 * p + l] = (uint8_t)(L[64 * p + l] | (L[64 * p + 32 + l] << 4));
  }
}

static void quantize_q5_K(const float *x, int64_t nb, bk_block_q5_K *b) {
  uint8_t L[256];
  for (int64_t i = 0; i < nb; i++, x += 256) {
    quantize_k_affine(x, 31, &b[i].d, &b[i].dmin, b[i].scales, L);
    memset(b[i].qh, 0, sizeof b[i].qh);
    for (int p = 0; p < 4; p++)
      for (int l = 0; l < 32; l++) {
        int lo = L[64 * p + l], hi = L[64 * p + 32 + l];
        b[i].qs[32 * p + l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
        if (lo & 16) b[i].qh[l] |= (uint8_t)(1u << (2 * p));
        if (hi & 16) b[i].qh[l] |= (uint8_t)(2u << (2 * p));
      }
  }
}

static void quantize_q6_K(const float *x, int64_t nb, bk_block_q6_K *b) {
  uint8_t L[256];
  for (int64_t i = 0; i < nb; i++, x += 256) {
    float s[16], smax = 0;
    for (int j = 0; j < 16; j++) {
      float amax = 0;
      for (int l = 0; l < 16; l++) amax = fmaxf(amax, fabsf(x[16 * j + l]));
      s[j] = amax / 31.0f;
      smax = fmaxf(smax, s[j]);
    }
    float d = smax / 127.0f;
    b[i].d = bk_fp16_encode(d);
    float dr = hf16_to_f32(b[i].d);
    for (int j = 0; j < 16; j++) {
      int sc = d ? clampi(nearest(s[j] / d), 0, 127) : 0;
      b[i].scales[j] = (int8_t)sc;
      float ds = dr * sc;
      for (int l = 0; l < 16; l++) L[16 * j + l] = (uint8_t)((ds ? clampi(nearest(x[16 * j + l] / ds), -32, 31) : 0) + 32);
    }
    uint8_t *ql = b[i].ql, *qh = b[i].qh;
    for (int h = 0; h < 2; h++, ql += 64, qh += 32) {
      const uint8_t *Lh = L + 128 * h;
      for (int l = 0; l < 32; l++) {
        ql[l] = (uint8_t)((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
        ql[l + 32] = (uint8_t)((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
        qh[l] = (uint8_t)((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) | ((Lh[l + 96] >> 4) << 6));
      }
    }
  }
}

/* Q5_0 / Q5_1: fifth bits into the little-endian qh word, nibbles as Q4_0's. */
static void pack_q5(const int q[32], uint8_t qs[16], uint8_t qh[4]) {
  uint32_t h = 0;
  for (int l = 0; l < 16; l++) {
    qs[l] = (uint8_t)((q[l] & 0xF) | ((q[l + 16] & 0xF) << 4));
    h |= (uint32_t)((q[l] >> 4) & 1) << l | (uint32_t)((q[l + 16] >> 4) & 1) << (l + 16);
  }
  for (int k = 0; k < 4; k++) qh[k] = (uint8_t)(h >> (8 * k));
}

static void quantize_q5_0(const float *x, int64_t nb, bk_block_q5_0 *b) {
  for (int64_t i = 0; i < nb; i++, x += 32) {
    float amax = 0, max = 0; /* as Q4_0: the largest magnitude maps to -16 */
    for (int l = 0; l < 32; l++)
      if (fabsf(x[l]) > amax) amax = fabsf(x[l]), max = x[l];
    float d = max / -16.0f, id = d ? 1.0f / d : 0.0f;
    b[i].d = bk_fp16_encode(d);
    int q[32];
    for (int l = 0; l < 32; l++) q[l] = clampi(nearest(x[l] * id) + 16, 0, 31);
    pack_q5(q, b[i].qs, b[i].qh);
  }
}

static void quantize_q5_1(const float *x, int64_t nb, bk_block_q5_1 *b) {
  for (int64_t i = 0; i < nb; i++, x += 32) {
    float mn = x[0], mx = x[0];
    for (int l = 1; l < 32; l++) mn = fminf(mn, x[l]), mx = fmaxf(mx, x[l]);
    float d = (mx - mn) / 31.0f;
    b[i].d = bk_fp16_encode(d);
    b[i].m = bk_fp16_encode(mn);
    float dr = hf16_to_f32(b[i].d), mr = hf16_to_f32(b[i].m);
    int q[32];
    for (int l = 0; l < 32; l++) q[l] = dr ? clampi(nearest((x[l] - mr) / dr), 0, 31) : 0;
    pack_q5(q, b[i].qs, b[i].qh);
  }
}

/* Q2_K / Q3_K: the 2-bit quants L[256] (element 128h + 32j + l at bits 2j of qs[32h + l]). */
static void pack_q2(const uint8_t L[256], uint8_t qs[64]) {
  memset(qs, 0, 64);
  for (int e = 0; e < 256; e++) qs[32 * (e / 128) + e % 32] |= (uint8_t)((L[e] & 3) << (2 * ((e % 128) / 32)));
}

static void quantize_q2_K(const float *x, int64_t nb, bk_block_q2_K *b) {
  uint8_t L[256];
  for (int64_t i = 0; i < nb; i++, x += 256) {
    float scale[16], minv[16], max_scale = 0, max_min = 0;
    for (int s = 0; s < 16; s++) {
      float mn = x[16 * s], mx = x[16 * s];
      for (int l = 1; l < 16; l++) mn = fminf(mn, x[16 * s + l]), mx = fmaxf(mx, x[16 * s + l]);
      if (mn > 0) mn = 0;
      scale[s] = (mx - mn) / 3.0f;
      minv[s] = -mn;
      max_scale = fmaxf(max_scale, scale[s]);
      max_min = fmaxf(max_min, minv[s]);
    }
    float d = max_scale / 15.0f, dmin = max_min / 15.0f;
    b[i].d = bk_fp16_encode(d);
    b[i].dmin = bk_fp16_encode(dmin);
    float dr = hf16_to_f32(b[i].d), dminr = hf16_to_f32(b[i].dmin);
    for (int s = 0; s < 16; s++) {
      int sc = dr ? clampi(nearest(scale[s] / dr), 0, 15) : 0, m = dminr ? clampi(nearest(minv[s] / dminr), 0, 15) : 0;
      b[i].scales[s] = (uint8_t)(sc | m << 4);
      float ds = dr * sc, ms = dminr * m;
      for (int l = 0; l < 16; l++) L[16 * s + l] = (uint8_t)(ds ? clampi(nearest((x[16 * s + l] + ms) / ds), 0, 3) : 0);
    }
    pack_q2(L, b[i].qs);
  }
}

static void quantize_q3_K(const float *x, int64_t nb, bk_block_q3_K *b) {
  uint8_t L[256];
  for (int64_t i = 0; i < nb; i++, x += 256) {
    float s[16], smax = 0;
    for (int j = 0; j < 16; j++) {
      float amax = 0;
      for (int l = 0; l < 16; l++) amax = fmaxf(amax, fabsf(x[16 * j + l]));
      s[j] = amax / 4.0f;
      smax = fmaxf(smax, s[j]);
    }
    float d = smax / 31.0f;
    b[i].d = bk_fp16_encode(d);
    float dr = hf16_to_f32(b[i].d);
    memset(b[i].scales, 0, sizeof b[i].scales);
    memset(b[i].hmask, 0, sizeof b[i].hmask);
    for (int j = 0; j < 16; j++) {
      int sc = d ? clampi(nearest(s[j] / d), -32, 31) : 0, v = sc + 32;
      if (j < 8) b[i].scales[j] |= (uint8_t)(v & 0xF);
      else b[i].scales[j - 8] |= (uint8_t)((v & 0xF) << 4);
      b[i].scales[8 + j % 4] |= (uint8_t)((v >> 4) << (2 * (j / 4)));
      float ds = dr * sc;
      for (int l = 0; l < 16; l++) L[16 * j + l] = (uint8_t)((ds ? clampi(nearest(x[16 * j + l] / ds), -4, 3) : 0) + 4);
    }
    for (int e = 0; e < 256; e++)
      if (L[e] >= 4) b[i].hmask[e % 32] |= (uint8_t)(1u << (4 * (e / 128) + (e % 128) / 32));
    pack_q2(L, b[i].qs);
  }
}

/* The IQ4 level nearest v (in units of the block scale). */
static int iq4_nearest(float v) {
  int best = 0;
  for (int k = 1; k < 16; k++)
    if (fabsf(v - bk_iq4nl_values[k]) < fabsf(v - bk_iq4nl_values[best])) best = k;
  return best;
}

/* 32 values at scale ds: nibbles as Q4_0's. */
static void pack_iq4(const float *x, float ds, uint8_t qs[16]) {
  float id = ds ? 1.0f / ds : 0.0f;
  for (int l = 0; l < 16; l++) qs[l] = (uint8_t)(iq4_nearest(x[l] * id) | iq4_nearest(x[l + 16] * id) << 4);
}

static void quantize_iq4_nl(const float *x, int64_t nb, bk_block_iq4_nl *b) {
  for (int64_t i = 0; i < nb; i++, x += 32) {
    float amax = 0, max = 0; /* the largest magnitude maps to the level -127 */
    for (int l = 0; l < 32; l++)
      if (fabsf(x[l]) > amax) amax = fabsf(x[l]), max = x[l];
    b[i].d = bk_fp16_encode(max / -127.0f);
    pack_iq4(x, hf16_to_f32(b[i].d), b[i].qs);
  }
}

static void quantize_iq4_xs(const float *x, int64_t nb, bk_block_iq4_xs *b) {
  for (int64_t i = 0; i < nb; i++, x += 256) {
    float s[8], smax = 0;
    for (int j = 0; j < 8; j++) {
      float amax = 0, max = 0;
      for (int l = 0; l < 32; l++)
        if (fabsf(x[32 * j + l]) > amax) amax = fabsf(x[32 * j + l]), max = x[32 * j + l];
      s[j] = max / -127.0f;
      smax = fmaxf(smax, fabsf(s[j]));
    }
    float d = smax / 31.0f;
    b[i].d = bk_fp16_encode(d);
    float dr = hf16_to_f32(b[i].d);
    b[i].scales_h = 0;
    memset(b[i].scales_l, 0, sizeof b[i].scales_l);
    for (int j = 0; j < 8; j++) {
      int sc = d ? clampi(nearest(s[j] / d), -32, 31) : 0, ls = sc + 32;
      b[i].scales_l[j / 2] |= (uint8_t)((ls & 0xF) << (4 * (j % 2)));
      b[i].scales_h |= (uint16_t)((ls >> 4) << (2 * j));
      pack_iq4(x + 32 * j, dr * (float)sc, b[i].qs + 16 * j);
    }
  }
}

int bk_quantize(bk_type type, const float *x, int64_t rows, int64_t cols, void *out, herr *err) {
  size_t rb = bk_row_bytes(type, cols, 0);
  if (rows <= 0 || !rb || type == BK_MLX_AFFINE || type == BK_FP8)
    return herr_set(err, HEARTH_EINVAL, "quantize %s: %lld x %lld is not a whole number of %lld-element blocks",
                    bk_type_name(type), (long long)rows, (long long)cols, (long long)bk_type_block(type));
  int64_t nb = cols / bk_type_block(type);
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    uint8_t *o = (uint8_t *)out + (size_t)r * rb;
    switch (type) {
      case BK_F32: memcpy(o, xr, rb); break;
      case BK_F16:
        for (int64_t k = 0; k < cols; k++) ((uint16_t *)o)[k] = bk_fp16_encode(xr[k]);
        break;
      case BK_BF16:
        for (int64_t k = 0; k < cols; k++) ((uint16_t *)o)[k] = bk_bf16_encode(xr[k]);
        break;
      case BK_Q8_0: quantize_q8_0(xr, nb, (bk_block_q8_0 *)o); break;
      case BK_Q4_0: quantize_q4_0(xr, nb, (bk_block_q4_0 *)o); break;
      case BK_Q4_K: quantize_q4_K(xr, nb, (bk_block_q4_K *)o); break;
      case BK_Q5_K: quantize_q5_K(xr, nb, (bk_block_q5_K *)o); break;
      case BK_Q6_K: quantize_q6_K(xr, nb, (bk_block_q6_K *)o); break;
      case BK_Q5_0: quantize_q5_0(xr, nb, (bk_block_q5_0 *)o); break;
      case BK_Q5_1: quantize_q5_1(xr, nb, (bk_block_q5_1 *)o); break;
      case BK_Q2_K: quantize_q2_K(xr, nb, (bk_block_q2_K *)o); break;
      case BK_Q3_K: quantize_q3_K(xr, nb, (bk_block_q3_K *)o); break;
      case BK_IQ4_NL: quantize_iq4_nl(xr, nb, (bk_block_iq4_nl *)o); break;
      case BK_IQ4_XS: quantize_iq4_xs(xr, nb, (bk_block_iq4_xs *)o); break;
      default: return herr_set(err, HEARTH_EUNSUPPORTED, "quantize: unknown type %d", (int)type);
    }
  }
  return 0;
}

static void store_scale(bk_type t, void *p, int64_t i, float v) {
  if (t == BK_F16)
    ((uint16_t *)p)[i] = bk_fp16_encode(v);
  else if (t == BK_BF16)
    ((uint16_t *)p)[i] = bk_bf16_encode(v);
  else
    ((float *)p)[i] = v;
}

int bk_quantize_mlx(const float *x, int64_t rows, int64_t cols, int bits, int group_size, bk_type scale_type,
                    uint32_t *wq, void *scales, void *biases, herr *err) {
  if (bits != 4 && bits != 8)
    return herr_set(err, HEARTH_EINVAL, "quantize mlx: bits %d (want 4 or 8)", bits);
  if (group_size != 32 && group_size != 64 && group_size != 128)
    return herr_set(err, HEARTH_EINVAL, "quantize mlx: group_size %d (want 32, 64 or 128)", group_size);
  if (scale_type != BK_F32 && scale_type != BK_F16 && scale_type != BK_BF16)
    return herr_set(err, HEARTH_EINVAL, "quantize mlx: scale type %s (want f32, f16 or bf16)", bk_type_name(scale_type));
  if (rows <= 0 || cols <= 0 || cols % group_size)
    return herr_set(err, HEARTH_EINVAL, "quantize mlx: %lld x %lld is not a whole number of %d-element groups",
                    (long long)rows, (long long)cols, group_size);
  int nmax = (1 << bits) - 1, per = 32 / bits;
  int64_t groups = rows * cols / group_size;
  memset(wq, 0, (size_t)(rows * cols / per) * 4);
  for (int64_t g = 0; g < groups; g++) {
    const float *xg = x + g * group_size;
    float mn = xg[0], mx = xg[0];
    for (int l = 1; l < group_size; l++) {
      mn = fminf(mn, xg[l]);
      mx = fmaxf(mx, xg[l]);
    }
    float s = fmaxf((mx - mn) / (float)nmax, 1e-7f);
    store_scale(scale_type, scales, g, s);
    store_scale(scale_type, biases, g, mn);
    float sr = scale_value(scale_type, scales, g), br = scale_value(scale_type, biases, g);
    for (int l = 0; l < group_size; l++) {
      int64_t e = g * group_size + l;
      uint32_t q = (uint32_t)(sr ? clampi(nearest((xg[l] - br) / sr), 0, nmax) : 0);
      wq[e / per] |= q << ((e % per) * bits);
    }
  }
  return 0;
}

int bk_quantize_fp8(const float *x, int64_t rows, int64_t cols, uint8_t *q, float *scales, herr *err) {
  if (rows <= 0 || cols <= 0)
    return herr_set(err, HEARTH_EINVAL, "quantize fp8: %lld x %lld is empty", (long long)rows, (long long)cols);
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    float amax = 0;
    for (int64_t k = 0; k < cols; k++) amax = fmaxf(amax, fabsf(xr[k]));
    float s = amax / 448.0f, inv = s > 0 ? 1.0f / s : 0.0f;
    scales[r] = s;
    for (int64_t k = 0; k < cols; k++) q[r * cols + k] = bk_fp8_encode(xr[k] * inv);
  }
  return 0;
}
