/* pack.c — the packed layouts of pack.h in plain C: repacking, activation
 * quantization (shared by every level, so the integer sums are the same
 * everywhere) and the reference matmul over packed weights that the SIMD
 * kernels are checked against. Knows nothing of threads or models. */
#include "backend/cpu/pack.h"

#include <math.h>
#include <string.h>

#include "backend/cpu/quant.h"

bool bk_pack_type_ok(bk_type t) { return t == BK_Q8_0 || t == BK_Q4_0; }

size_t bk_pack_group_bytes(const bk_weight *w) {
  size_t per_block = w->type == BK_Q8_0 ? 2 * BK_PACK_ROWS + 32 * BK_PACK_ROWS
                     : w->type == BK_Q4_0 ? 2 * BK_PACK_ROWS + 16 * BK_PACK_ROWS
                                          : 0;
  return per_block * (size_t)(w->cols / 32);
}

void bk_pack_write(const bk_weight *w, void *dst) {
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

void bk_qrows_fill(const bk_qrows *qa, const float *x, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; i++) {
    const float *xr = x + i * qa->cols;
    int8_t *q = qa->q + i * qa->cols;
    for (int64_t b = 0; b < qa->nb; b++) {
      const float *xb = xr + 32 * b;
      float amax = 0.0f;
      int nan = 0;
      for (int k = 0; k < 32; k++) {
        amax = fmaxf(amax, fabsf(xb[k]));
        nan |= isnan(xb[k]);
      }
      float d = amax / 127.0f, id = d > 0.0f && !isinf(amax) ? 127.0f / amax : 0.0f;
      int32_t s = 0;
      for (int k = 0; k < 32; k++) {
        int v = (int)nearbyintf(xb[k] * id);
        v = v > 127 ? 127 : v < -127 ? -127 : v;
        q[32 * b + k] = (int8_t)v;
        s += v;
      }
      qa->d[i * qa->nb + b] = nan ? NAN : d; /* a NaN (or inf) input makes its outputs NaN, as with f32 activations */
      qa->s[i * qa->nb + b] = s;
    }
  }
}

void bk_packed_rows_ref(const bk_weight *w, const bk_qrows *qa, float *y, int64_t g0, int64_t g1, const float *bias) {
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
