/* pack.c — the packed layouts of pack.h in plain C: repacking, activation
 * quantization (shared by every level, so the integer sums are the same
 * everywhere) and the reference matmul over packed weights that the SIMD
 * kernels are checked against. Knows nothing of threads or models. */
#include "backend/cpu/pack.h"

#include <math.h>
#include <string.h>

#include "backend/formats.h"

bool bk_pack_type_ok(bk_type t) { return t == BK_Q8_0 || t == BK_Q4_0 || t == BK_Q4_K || t == BK_Q5_K || t == BK_Q6_K; }

size_t bk_pack_group_bytes(const bk_weight *w) {
  switch (w->type) {
    case BK_Q8_0: return (2 + 32) * BK_PACK_ROWS * (size_t)(w->cols / 32);
    case BK_Q4_0: return (2 + 16) * BK_PACK_ROWS * (size_t)(w->cols / 32);
    case BK_Q4_K: return BK_PACK_K4_BYTES * (size_t)(w->cols / 256);
    case BK_Q5_K: return BK_PACK_K5_BYTES * (size_t)(w->cols / 256);
    case BK_Q6_K: return BK_PACK_K6_BYTES * (size_t)(w->cols / 256);
    default: return 0;
  }
}

/* Q4_K / Q5_K: see pack.h for the layout. */
static void pack_write_k(const bk_weight *w, void *dst) {
  const int64_t nsb = w->cols / 256, groups = (w->rows + BK_PACK_ROWS - 1) / BK_PACK_ROWS;
  const size_t gbytes = bk_pack_group_bytes(w), row_bytes = bk_row_bytes(w->type, w->cols, 0);
  const int five = w->type == BK_Q5_K;
  const size_t sbytes = five ? BK_PACK_K5_BYTES : BK_PACK_K4_BYTES;
  for (int64_t g = 0; g < groups; g++)
    for (int64_t sb = 0; sb < nsb; sb++) {
      uint8_t *out = (uint8_t *)dst + (size_t)g * gbytes + (size_t)sb * sbytes;
      memset(out, 0, sbytes);
      uint16_t *d = (uint16_t *)out, *dmin = d + BK_PACK_ROWS;
      uint8_t *sc = out + 64, *mn = sc + 8 * BK_PACK_ROWS, *u = mn + 8 * BK_PACK_ROWS, *hb = u + 2048;
      for (int r = 0; r < BK_PACK_ROWS; r++) {
        int64_t row = g * BK_PACK_ROWS + r;
        if (row >= w->rows) continue; /* padding rows: all zero */
        const uint8_t *src = (const uint8_t *)w->data + (size_t)row * row_bytes;
        const uint8_t *scales, *qs, *qh = NULL;
        if (five) {
          const bk_block_q5_K *b = (const bk_block_q5_K *)src + sb;
          d[r] = b->d, dmin[r] = b->dmin, scales = b->scales, qs = b->qs, qh = b->qh;
        } else {
          const bk_block_q4_K *b = (const bk_block_q4_K *)src + sb;
          d[r] = b->d, dmin[r] = b->dmin, scales = b->scales, qs = b->qs;
        }
        for (int j = 0; j < 8; j++) bk_k_scale_min(scales, j, &sc[j * BK_PACK_ROWS + r], &mn[j * BK_PACK_ROWS + r]);
        for (int p = 0; p < 4; p++)
          for (int c = 0; c < 8; c++)
            for (int jj = 0; jj < 4; jj++) {
              int l = 4 * c + jj; /* byte 32p + l: elements 64p + l (low nibble) and 64p + 32 + l (high) */
              u[((p * 8 + c) * BK_PACK_ROWS + r) * 4 + jj] = qs[32 * p + l];
              if (five) {
                int lo = (qh[l] >> (2 * p)) & 1, hi = (qh[l] >> (2 * p + 1)) & 1;
                hb[((p * 2 + c / 4) * BK_PACK_ROWS + r) * 4 + jj] |= (uint8_t)((lo << (2 * (c % 4))) | (hi << (2 * (c % 4) + 1)));
              }
            }
      }
    }
}

/* The 6-bit quant (0..63) of element e (0..255) of a Q6_K block. */
static int q6_value(const bk_block_q6_K *b, int e) {
  int h = e / 128, l = e % 32, part = (e % 128) / 32; /* parts: ql[l] low, ql[l+32] low, ql[l] high, ql[l+32] high */
  const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
  int lo = part & 1 ? ql[l + 32] : ql[l];
  lo = part >= 2 ? lo >> 4 : lo & 0xF;
  return lo | (((qh[l] >> (2 * part)) & 3) << 4);
}

static void pack_write_q6_k(const bk_weight *w, void *dst) {
  const int64_t nsb = w->cols / 256, groups = (w->rows + BK_PACK_ROWS - 1) / BK_PACK_ROWS;
  const size_t gbytes = bk_pack_group_bytes(w), row_bytes = bk_row_bytes(w->type, w->cols, 0);
  for (int64_t g = 0; g < groups; g++)
    for (int64_t sb = 0; sb < nsb; sb++) {
      uint8_t *out = (uint8_t *)dst + (size_t)g * gbytes + (size_t)sb * BK_PACK_K6_BYTES;
      memset(out, 0, BK_PACK_K6_BYTES);
      uint16_t *d = (uint16_t *)out;
      int8_t *sc = (int8_t *)(out + 32);
      uint8_t *u = out + 32 + 256, *hb = u + 2048;
      for (int r = 0; r < BK_PACK_ROWS; r++) {
        int64_t row = g * BK_PACK_ROWS + r;
        if (row >= w->rows) continue; /* padding rows: all zero */
        const bk_block_q6_K *b = (const bk_block_q6_K *)((const uint8_t *)w->data + (size_t)row * row_bytes) + sb;
        d[r] = b->d;
        for (int k = 0; k < 16; k++) sc[k * BK_PACK_ROWS + r] = b->scales[k];
        for (int j = 0; j < 8; j++)
          for (int t = 0; t < 2; t++)
            for (int c = 0; c < 4; c++)
              for (int i = 0; i < 4; i++) {
                int q = q6_value(b, 32 * j + 16 * t + 4 * c + i);
                u[((j * 4 + c) * BK_PACK_ROWS + r) * 4 + i] |= (uint8_t)((q & 15) << (4 * t));
                hb[((j * 2 + t) * BK_PACK_ROWS + r) * 4 + i] |= (uint8_t)((q >> 4) << (2 * c));
              }
      }
    }
}

void bk_pack_write(const bk_weight *w, void *dst) {
  if (w->type == BK_Q4_K || w->type == BK_Q5_K) {
    pack_write_k(w, dst);
    return;
  }
  if (w->type == BK_Q6_K) {
    pack_write_q6_k(w, dst);
    return;
  }
  const int64_t nb = w->cols / 32, groups = (w->rows + BK_PACK_ROWS - 1) / BK_PACK_ROWS;
  const size_t gbytes = bk_pack_group_bytes(w), row_bytes = bk_row_bytes(w->type, w->cols, 0);
  const int q8 = w->type == BK_Q8_0;
  const size_t qbytes = q8 ? 32 : 16;
  for (int64_t g = 0; g < groups; g++) {
    uint8_t *out = (uint8_t *)dst + (size_t)g * gbytes;
    for (int64_t b = 0; b < nb; b++, out += 2 * BK_PACK_ROWS + qbytes * BK_PACK_ROWS) {
      uint16_t *d = (uint16_t *)out;
      uint8_t *u = out + 2 * BK_PACK_ROWS;
      for (int r = 0; r < BK_PACK_ROWS; r++) {
        int64_t row = g * BK_PACK_ROWS + r;
        const uint8_t *src = row < w->rows ? (const uint8_t *)w->data + (size_t)row * row_bytes : NULL;
        uint16_t dh = 0;
        const uint8_t *qs = NULL;
        if (src && q8) {
          const bk_block_q8_0 *blk = (const bk_block_q8_0 *)src + b;
          dh = blk->d, qs = (const uint8_t *)blk->qs;
        } else if (src) {
          const bk_block_q4_0 *blk = (const bk_block_q4_0 *)src + b;
          dh = blk->d, qs = blk->qs;
        }
        d[r] = dh;
        for (size_t c = 0; c < qbytes / 4; c++)
          for (int j = 0; j < 4; j++) {
            uint8_t v = qs ? qs[4 * c + j] : (q8 ? 0 : 0x88); /* padding rows: quant 0 */
            u[(c * BK_PACK_ROWS + (size_t)r) * 4 + (size_t)j] = q8 ? (uint8_t)(v ^ 0x80) : v;
          }
      }
    }
  }
}

void bk_qrows_fill_block(const bk_qrows *qa, const float *x, int64_t i, int64_t b) {
  const float *xb = x + i * qa->cols + 32 * b;
  int8_t *q = qa->q + i * qa->cols + 32 * b;
  float amax = 0.0f;
  int nan = 0;
  for (int k = 0; k < 32; k++) {
    amax = fmaxf(amax, fabsf(xb[k]));
    nan |= isnan(xb[k]);
  }
  float d = amax / 127.0f, id = d > 0.0f && !isinf(amax) ? 127.0f / amax : 0.0f;
  int32_t s[2] = {0, 0};
  for (int k = 0; k < 32; k++) {
    int v = (int)nearbyintf(xb[k] * id);
    v = v > 127 ? 127 : v < -127 ? -127 : v;
    q[k] = (int8_t)v;
    s[k / 16] += v;
  }
  qa->d[i * qa->nb + b] = nan ? NAN : d; /* a NaN (or inf) input makes its outputs NaN, as with f32 activations */
  qa->s[i * qa->nb + b] = s[0] + s[1];
  qa->s16[(i * qa->nb + b) * 2] = s[0];
  qa->s16[(i * qa->nb + b) * 2 + 1] = s[1];
  qa->nds[i * qa->nb + b] = -(qa->d[i * qa->nb + b] * (float)(s[0] + s[1]));
}

void bk_qrows_fill(const bk_qrows *qa, const float *x, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; i++)
    for (int64_t b = 0; b < qa->nb; b++) bk_qrows_fill_block(qa, x, i, b);
}

/* Q4_K / Q5_K: per sub-block j of 32, acc += isum·(d·sc_j·dx) − (dmin·m_j)·(dx·Σxq). */
static void packed_rows_ref_k(const bk_weight *w, const bk_qrows *qa, float *y, int64_t g0, int64_t g1, const float *bias) {
  const size_t gbytes = bk_pack_group_bytes(w);
  const int five = w->type == BK_Q5_K;
  const size_t sbytes = five ? BK_PACK_K5_BYTES : BK_PACK_K4_BYTES;
  const int64_t nsb = w->cols / 256;
  for (int64_t g = g0; g < g1; g++)
    for (int r = 0; r < BK_PACK_ROWS; r++) {
      int64_t row = g * BK_PACK_ROWS + r;
      if (row >= w->rows) break;
      for (int64_t i = 0; i < qa->n; i++) {
        float acc = 0.0f;
        for (int64_t sb = 0; sb < nsb; sb++) {
          const uint8_t *blk = (const uint8_t *)w->packed + (size_t)g * gbytes + (size_t)sb * sbytes;
          const uint16_t *d = (const uint16_t *)blk, *dmin = d + BK_PACK_ROWS;
          const uint8_t *sc = blk + 64, *mn = sc + 8 * BK_PACK_ROWS, *u = mn + 8 * BK_PACK_ROWS, *hb = u + 2048;
          float dv = bk_fp16_decode(d[r]), dmv = bk_fp16_decode(dmin[r]);
          for (int j = 0; j < 8; j++) {
            int p = j / 2, half = j & 1;
            const int8_t *xb = qa->q + i * qa->cols + 256 * sb + 32 * j;
            int32_t isum = 0;
            for (int c = 0; c < 8; c++)
              for (int jj = 0; jj < 4; jj++) {
                uint8_t v = u[((p * 8 + c) * BK_PACK_ROWS + r) * 4 + jj];
                int q = half ? v >> 4 : v & 15;
                if (five) q |= ((hb[((p * 2 + c / 4) * BK_PACK_ROWS + r) * 4 + jj] >> (2 * (c % 4) + half)) & 1) << 4;
                isum += q * xb[4 * c + jj];
              }
            int64_t xi = i * qa->nb + 8 * sb + j;
            float a = dv * (float)sc[j * BK_PACK_ROWS + r], b = dmv * (float)mn[j * BK_PACK_ROWS + r];
            acc = fmaf((float)isum, a * qa->d[xi], acc);
            acc = fmaf(b, qa->nds[xi], acc);
          }
        }
        y[i * w->rows + row] = bias ? acc + bias[row] : acc;
      }
    }
}

/* Q6_K: per x block j, t = sc_2j·(isum_lo − 32 Σxq_lo) + sc_2j+1·(isum_hi − 32 Σxq_hi); acc = fma(t, d·dx, acc). */
static void packed_rows_ref_q6_k(const bk_weight *w, const bk_qrows *qa, float *y, int64_t g0, int64_t g1, const float *bias) {
  const size_t gbytes = bk_pack_group_bytes(w);
  const int64_t nsb = w->cols / 256;
  for (int64_t g = g0; g < g1; g++)
    for (int r = 0; r < BK_PACK_ROWS; r++) {
      int64_t row = g * BK_PACK_ROWS + r;
      if (row >= w->rows) break;
      for (int64_t i = 0; i < qa->n; i++) {
        float acc = 0.0f;
        for (int64_t sb = 0; sb < nsb; sb++) {
          const uint8_t *blk = (const uint8_t *)w->packed + (size_t)g * gbytes + (size_t)sb * BK_PACK_K6_BYTES;
          const int8_t *sc = (const int8_t *)(blk + 32);
          const uint8_t *u = blk + 32 + 256, *hb = u + 2048;
          float dv = bk_fp16_decode(((const uint16_t *)blk)[r]);
          for (int j = 0; j < 8; j++) {
            const int8_t *xb = qa->q + i * qa->cols + 256 * sb + 32 * j;
            int64_t xi = i * qa->nb + 8 * sb + j;
            int32_t t = 0;
            for (int h = 0; h < 2; h++) {
              int32_t isum = 0;
              for (int c = 0; c < 4; c++)
                for (int k = 0; k < 4; k++) {
                  int q = (u[((j * 4 + c) * BK_PACK_ROWS + r) * 4 + k] >> (4 * h)) & 15;
                  q |= ((hb[((j * 2 + h) * BK_PACK_ROWS + r) * 4 + k] >> (2 * c)) & 3) << 4;
                  isum += q * xb[16 * h + 4 * c + k];
                }
              t += (int32_t)sc[(2 * j + h) * BK_PACK_ROWS + r] * (isum - 32 * qa->s16[2 * xi + h]);
            }
            acc = fmaf((float)t, dv * qa->d[xi], acc);
          }
        }
        y[i * w->rows + row] = bias ? acc + bias[row] : acc;
      }
    }
}

void bk_packed_rows_ref(const bk_weight *w, const bk_qrows *qa, float *y, int64_t g0, int64_t g1, const float *bias) {
  if (w->type == BK_Q4_K || w->type == BK_Q5_K) {
    packed_rows_ref_k(w, qa, y, g0, g1, bias);
    return;
  }
  if (w->type == BK_Q6_K) {
    packed_rows_ref_q6_k(w, qa, y, g0, g1, bias);
    return;
  }
  const size_t gbytes = bk_pack_group_bytes(w);
  const int q8 = w->type == BK_Q8_0;
  const size_t bbytes = gbytes / (size_t)qa->nb;
  const int32_t off = q8 ? 128 : 8;
  for (int64_t g = g0; g < g1; g++) {
    const uint8_t *grp = (const uint8_t *)w->packed + (size_t)g * gbytes;
    for (int r = 0; r < BK_PACK_ROWS; r++) {
      int64_t row = g * BK_PACK_ROWS + r;
      if (row >= w->rows) break;
      for (int64_t i = 0; i < qa->n; i++) {
        const int8_t *xq = qa->q + i * qa->cols;
        float acc = 0.0f;
        for (int64_t b = 0; b < qa->nb; b++) {
          const uint8_t *blk = grp + (size_t)b * bbytes;
          const uint8_t *u = blk + 2 * BK_PACK_ROWS;
          const int8_t *xb = xq + 32 * b;
          int32_t isum = 0;
          if (q8) {
            for (int k = 0; k < 32; k++) isum += (int32_t)u[((k / 4) * BK_PACK_ROWS + r) * 4 + k % 4] * xb[k];
          } else {
            for (int k = 0; k < 16; k++) {
              uint8_t v = u[((k / 4) * BK_PACK_ROWS + r) * 4 + k % 4];
              isum += (int32_t)(v & 15) * xb[k] + (int32_t)(v >> 4) * xb[16 + k];
            }
          }
          isum -= off * qa->s[i * qa->nb + b];
          float dw = bk_fp16_decode(((const uint16_t *)blk)[r]);
          float scale = dw * qa->d[i * qa->nb + b];
          acc = fmaf((float)isum, scale, acc);
        }
        y[i * w->rows + row] = bias ? acc + bias[row] : acc;
      }
    }
  }
}
