/* pack.h — weights repacked for 8-bit integer dot products, and activations
 * quantized to 8 bits for them (internal to backend/cpu).
 *
 * Q8_0, Q4_0, Q4_K, Q5_K and Q6_K matrices are repacked once, at load (bk_weight_pack), into
 * groups of 16 rows: for each 32-column block the 16 rows' f16 scales, then
 * their quants interleaved 4 bytes per row, so that one 64-byte load holds 4
 * consecutive quants of each of the 16 rows — one AVX-512 VNNI vpdpbusd
 * against 4 activation bytes broadcast. Activations are quantized per row in
 * blocks of 32 (scale = max|x| / 127, round half to even), as llama.cpp does
 * for these types. Output row r is then
 *
 *   y[r] = Σ_blocks (dw[r] · dx) · Σ_k wq[r, k] · xq[k]     (+ bias[r])
 *
 * accumulated in block order, one fused multiply-add per block, so the
 * portable reference (bk_packed_rows_ref) and the SIMD kernel agree bit for
 * bit. The integer sums use unsigned weight bytes u = wq + off (off 128 for
 * Q8_0, 8 for Q4_0): Σ wq·xq = Σ u·xq − off · Σ xq.
 *
 * Layout of one group (rows padded to a multiple of 16 with zero scales and
 * quants), blocks in column order:
 *   Q8_0x16: uint16 d[16]; uint8 u[8][16][4]   u[c][r][j] = q[r][4c+j] + 128      544 bytes
 *   Q4_0x16: uint16 d[16]; uint8 u[4][16][4]   the stored nibble bytes qs[r][4c+j]:
 *            low nibble = element 4c+j, high nibble = element 16+4c+j             288 bytes
 *
 * Q4_K and Q5_K keep their 256-column super-blocks (w = d·sc_j·q − dmin·m_j
 * for sub-block j of 32, q of 4 or 5 bits); per group and super-block:
 *   uint16 d[16]; uint16 dmin[16]; uint8 sc[8][16]; uint8 m[8][16]   (6-bit values unpacked)
 *   uint8 u[4][8][16][4]   u[p][c][r][j] = qs[r][32p + 4c + j]: low nibble = element
 *                          64p + 4c + j (sub-block 2p), high = 64p + 32 + 4c + j (2p + 1)
 *   Q5_K only: uint8 h[4][2][16][4]: bit 2(c%4) of h[p][c/4][r][j] = fifth bit of
 *                          the low element of u[p][c][r][j], bit 2(c%4)+1 of the high one
 * and output row r accumulates, per sub-block j in order,
 *   acc = fma(isum_j, (d·sc_j)·dx_j, acc);  acc = fma(dmin·m_j, −dx_j·Σxq_j, acc).
 *
 * Q6_K (w = d·sc·(q − 32), q of 6 bits, one int8 scale per 16 columns), per
 * group and super-block:
 *   uint16 d[16]; int8 sc[16][16]                    (sc[sub-block][row])
 *   uint8 u[8][4][16][4]   for x block j: low nibble of u[j][c][r][i] = low 4 bits
 *                          of q(32j + 4c + i), high nibble those of q(32j + 16 + 4c + i)
 *   uint8 h[8][2][16][4]   bits 2c, 2c+1 of h[j][t][r][i] = top 2 bits of q(32j + 16t + 4c + i)
 * and per x block j, with the sums over each half block h of 16:
 *   t_j = sc_2j·(isum_lo − 32·Σxq_lo) + sc_2j+1·(isum_hi − 32·Σxq_hi)   (int32)
 *   acc = fma(t_j, d·dx_j, acc).
 */
#ifndef HEARTH_BACKEND_CPU_PACK_H
#define HEARTH_BACKEND_CPU_PACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/cpu.h"
#include "backend/weights.h"

#define BK_PACK_ROWS 16
#define BK_PACK_K4_BYTES (64 + 256 + 2048)       /* one Q4_K super-block of 16 rows */
#define BK_PACK_K5_BYTES (64 + 256 + 2048 + 512) /* one Q5_K super-block of 16 rows */
#define BK_PACK_K6_BYTES (32 + 256 + 2048 + 1024) /* one Q6_K super-block of 16 rows */

/* 8-bit activations: n rows of cols values (cols a multiple of 32). */
typedef struct bk_qrows {
  int64_t n, cols, nb; /* rows, columns, 32-blocks per row */
  int8_t *q;           /* [n][cols] */
  float *d;            /* [n][nb] block scales */
  int32_t *s;          /* [n][nb] Σ q of each block */
  int32_t *s16;        /* [n][2 nb] Σ q of each half block (16 values) */
  float *nds;          /* [n][nb] −d · Σ q of each block (the K-quants' min term) */
} bk_qrows;

/* Whether type has a packed layout. */
bool bk_pack_type_ok(bk_type t);
/* Bytes of one packed group of 16 rows (0 when the type has no layout). */
size_t bk_pack_group_bytes(const bk_weight *w);
/* Writes w's packed form (ceil(rows / 16) groups) into dst. */
void bk_pack_write(const bk_weight *w, void *dst);

/* Quantizes rows [i0, i1) of x[n, cols] into qa (arrays sized by the caller):
 * the reference, one 32-block at a time (bk_qrows_fill_block). */
typedef void (*bk_qrows_fn)(const bk_qrows *qa, const float *x, int64_t i0, int64_t i1);
void bk_qrows_fill(const bk_qrows *qa, const float *x, int64_t i0, int64_t i1);
void bk_qrows_fill_block(const bk_qrows *qa, const float *x, int64_t i, int64_t b);
#if defined(__x86_64__)
/* The same bytes with AVX-512 (kernels_vnni.c; only where bk_cpu_has_int8_dot). */
void bk_qrows_fill_vnni(const bk_qrows *qa, const float *x, int64_t i0, int64_t i1);
#endif

/* y[i, r] for every activation row i < qa->n and every row r of groups
 * [g0, g1) (rows past w->rows are not written). */
typedef void (*bk_packed_fn)(const bk_weight *w, const bk_qrows *qa, float *y, int64_t g0, int64_t g1, const float *bias);
void bk_packed_rows_ref(const bk_weight *w, const bk_qrows *qa, float *y, int64_t g0, int64_t g1, const float *bias);
#if defined(__x86_64__)
void bk_packed_rows_vnni(const bk_weight *w, const bk_qrows *qa, float *y, int64_t g0, int64_t g1, const float *bias);
#endif

#endif
