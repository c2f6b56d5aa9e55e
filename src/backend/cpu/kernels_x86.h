/* kernels_x86.h — SIMD unpacking of every bk_type for the x86 levels
 * (internal; included by kernels_avx2.c and kernels_avx512.c after their
 * target pragmas). Quants are unpacked 16 at a time with SSE byte ops into an
 * __m128i of int8 / uint8 values, which the includer turns into 16 weights.
 * The layouts are those of backend/formats.c (the reference), bit for bit.
 *
 * The file is a template: the includer defines what happens to each group of
 * 16 weights and includes it once per use (a dequantizing copy into a buffer,
 * or a GEMV step that multiplies them straight into accumulators):
 *   X86_RET, X86_FN, X86_PARAMS   the function's return type, name, extra parameters
 *   X86_F32(p)                    what f32 weights (at p) do; X86_DONE ends a case
 *   EMIT_I8(site, off, q, d, m)   weights [off, off+16) = (int8)q * d + m
 *   EMIT_U8(site, off, q, d, m)   weights [off, off+16) = (uint8)q * d + m
 *   EMIT_F16(site, off, p) / EMIT_BF16(site, off, p)   16 halves / bfloat16s at p
 *   EMIT_ONE(off, v)              one weight (tails of f16 / bf16 rows)
 * site (0..3) is a compile-time slot that lets a fused GEMV keep independent
 * sums; offsets are relative to k0.
 */

#ifndef BK_X86_HELPERS
#define BK_X86_HELPERS
static inline float x86_half(uint16_t h) { return _cvtsh_ss(h); }
static inline float x86_bf16(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
static inline float x86_scale_value(bk_type t, const void *p, int64_t i) {
  if (t == BK_F16) return x86_half(((const uint16_t *)p)[i]);
  if (t == BK_BF16) return x86_bf16(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}
static inline void x86_k_scale_min(const uint8_t q[12], int j, uint8_t *sc, uint8_t *m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

/* bk_row_bytes for a validated weight, inlined: the kernels call it per row. */
static inline size_t x86_row_bytes(const bk_weight *w) {
  switch (w->type) {
    case BK_F32: return (size_t)w->cols * 4;
    case BK_F16: case BK_BF16: return (size_t)w->cols * 2;
    case BK_Q8_0: return (size_t)(w->cols / 32) * sizeof(bk_block_q8_0);
    case BK_Q4_0: return (size_t)(w->cols / 32) * sizeof(bk_block_q4_0);
    case BK_Q4_K: return (size_t)(w->cols / 256) * sizeof(bk_block_q4_K);
    case BK_Q5_K: return (size_t)(w->cols / 256) * sizeof(bk_block_q5_K);
    case BK_Q6_K: return (size_t)(w->cols / 256) * sizeof(bk_block_q6_K);
    default: return bk_row_bytes(w->type, w->cols, w->bits);
  }
}

static inline __m128i x86_srl16(__m128i v, int c) { return _mm_srl_epi16(v, _mm_cvtsi32_si128(c)); }

/* Software prefetch of a row's bytes X86_PF_DIST ahead (into the next rows,
 * which are read next): this VM's hardware prefetchers alone keep too few
 * lines in flight for one thread to reach its memory bandwidth. */
#define X86_PF_DIST 4096
#define X86_PREFETCH(p_, bytes_)                                                                    \
  do {                                                                                              \
    for (int o_ = 0; o_ < (bytes_); o_ += 64) _mm_prefetch((const char *)(p_) + X86_PF_DIST + o_, _MM_HINT_T0); \
  } while (0)
#endif /* BK_X86_HELPERS */

/* X86_GEMV_PF(p): the includer's prefetch of a 128-byte step of an F16 row
 * (the fused GEMV defines it; the GEMM's dequantizing copy reads a panel of
 * rows 256 columns at a time, where a row's bytes ahead are not read next). */
#ifndef X86_GEMV_PF
#define X86_GEMV_PF(p_) ((void)0)
#define X86_GEMV_PF_DEFAULT
#endif

X86_RET X86_FN(const bk_weight *w, int64_t row, int64_t k0, int64_t len X86_PARAMS) {
  const uint8_t *base = (const uint8_t *)w->data + (size_t)row * x86_row_bytes(w);
  const __m128i lo4 = _mm_set1_epi8(0x0F), three = _mm_set1_epi8(3), one = _mm_set1_epi8(1);
  switch (w->type) {
    case BK_F32: X86_F32((const float *)base + k0);
    case BK_F16: {
      const uint16_t *p = (const uint16_t *)base + k0;
      int64_t k = 0;
      for (; k + 64 <= len; k += 64) { /* four independent sums: loads in flight, not FMA latency, set the pace */
        X86_GEMV_PF(p + k);
        EMIT_F16(0, k, p + k);
        EMIT_F16(1, k + 16, p + k + 16);
        EMIT_F16(2, k + 32, p + k + 32);
        EMIT_F16(3, k + 48, p + k + 48);
      }
      for (; k + 16 <= len; k += 16) EMIT_F16(0, k, p + k);
      for (; k < len; k++) EMIT_ONE(k, x86_half(p[k]));
      X86_DONE;
    }
    case BK_BF16: {
      const uint16_t *p = (const uint16_t *)base + k0;
      int64_t k = 0;
      for (; k + 64 <= len; k += 64) {
        EMIT_BF16(0, k, p + k);
        EMIT_BF16(1, k + 16, p + k + 16);
        EMIT_BF16(2, k + 32, p + k + 32);
        EMIT_BF16(3, k + 48, p + k + 48);
      }
      for (; k + 16 <= len; k += 16) EMIT_BF16(0, k, p + k);
      for (; k < len; k++) EMIT_ONE(k, x86_bf16(p[k]));
      X86_DONE;
    }
    case BK_Q8_0: {
      const bk_block_q8_0 *b = (const bk_block_q8_0 *)base + k0 / 32;
      for (int64_t i = 0; i < len / 32; i++) {
        float d = x86_half(b[i].d);
        EMIT_I8(0, 32 * i, _mm_loadu_si128((const __m128i *)b[i].qs), d, 0.0f);
        EMIT_I8(1, 32 * i + 16, _mm_loadu_si128((const __m128i *)(b[i].qs + 16)), d, 0.0f);
      }
      X86_DONE;
    }
    case BK_Q4_0: {
      const bk_block_q4_0 *b = (const bk_block_q4_0 *)base + k0 / 32;
      const __m128i eight = _mm_set1_epi8(8);
      for (int64_t i = 0; i < len / 32; i++) {
        float d = x86_half(b[i].d);
        __m128i v = _mm_loadu_si128((const __m128i *)b[i].qs);
        EMIT_I8(0, 32 * i, _mm_sub_epi8(_mm_and_si128(v, lo4), eight), d, 0.0f);
        EMIT_I8(1, 32 * i + 16, _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), lo4), eight), d, 0.0f);
      }
      X86_DONE;
    }
    case BK_Q4_K:
    case BK_Q5_K: {
      int five = w->type == BK_Q5_K;
      size_t bsize = five ? sizeof(bk_block_q5_K) : sizeof(bk_block_q4_K);
      const uint8_t *bp = base + (size_t)(k0 / 256) * bsize;
      for (int64_t i = 0; i < len / 256; i++, bp += bsize) {
        const uint8_t *scales, *qs, *qh = NULL;
        uint16_t dh, dminh;
        if (five) {
          const bk_block_q5_K *b = (const bk_block_q5_K *)bp;
          dh = b->d, dminh = b->dmin, scales = b->scales, qs = b->qs, qh = b->qh;
        } else {
          const bk_block_q4_K *b = (const bk_block_q4_K *)bp;
          dh = b->d, dminh = b->dmin, scales = b->scales, qs = b->qs;
        }
        float d = x86_half(dh), dmin = x86_half(dminh);
        __m128i h0 = _mm_setzero_si128(), h1 = _mm_setzero_si128();
        if (five) {
          h0 = _mm_loadu_si128((const __m128i *)qh);
          h1 = _mm_loadu_si128((const __m128i *)(qh + 16));
        }
        int64_t o = 256 * i;
        for (int p = 0; p < 4; p++, o += 64) {
          uint8_t sc, m;
          x86_k_scale_min(scales, 2 * p, &sc, &m);
          float d1 = d * sc, m1 = dmin * m;
          x86_k_scale_min(scales, 2 * p + 1, &sc, &m);
          float d2 = d * sc, m2 = dmin * m;
          __m128i v0 = _mm_loadu_si128((const __m128i *)(qs + 32 * p));
          __m128i v1 = _mm_loadu_si128((const __m128i *)(qs + 32 * p + 16));
          __m128i a0 = _mm_and_si128(v0, lo4), a1 = _mm_and_si128(v1, lo4);
          __m128i b0 = _mm_and_si128(_mm_srli_epi16(v0, 4), lo4), b1 = _mm_and_si128(_mm_srli_epi16(v1, 4), lo4);
          if (five) {
            a0 = _mm_or_si128(a0, _mm_slli_epi16(_mm_and_si128(x86_srl16(h0, 2 * p), one), 4));
            a1 = _mm_or_si128(a1, _mm_slli_epi16(_mm_and_si128(x86_srl16(h1, 2 * p), one), 4));
            b0 = _mm_or_si128(b0, _mm_slli_epi16(_mm_and_si128(x86_srl16(h0, 2 * p + 1), one), 4));
            b1 = _mm_or_si128(b1, _mm_slli_epi16(_mm_and_si128(x86_srl16(h1, 2 * p + 1), one), 4));
          }
          EMIT_I8(0, o, a0, d1, -m1);
          EMIT_I8(1, o + 16, a1, d1, -m1);
          EMIT_I8(2, o + 32, b0, d2, -m2);
          EMIT_I8(3, o + 48, b1, d2, -m2);
        }
      }
      X86_DONE;
    }
    case BK_Q6_K: {
      const bk_block_q6_K *b = (const bk_block_q6_K *)base + k0 / 256;
      const __m128i off = _mm_set1_epi8(32);
      for (int64_t i = 0; i < len / 256; i++) {
        float d = x86_half(b[i].d);
        for (int h = 0; h < 2; h++) {
          const uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
          const int8_t *sc = b[i].scales + 8 * h;
          int64_t o = 256 * i + 128 * h;
          for (int c = 0; c < 2; c++) {
            __m128i a = _mm_loadu_si128((const __m128i *)(ql + 16 * c));
            __m128i bq = _mm_loadu_si128((const __m128i *)(ql + 32 + 16 * c));
            __m128i hb = _mm_loadu_si128((const __m128i *)(qh + 16 * c));
            __m128i q1 = _mm_or_si128(_mm_and_si128(a, lo4), _mm_slli_epi16(_mm_and_si128(hb, three), 4));
            __m128i q2 = _mm_or_si128(_mm_and_si128(bq, lo4),
                                      _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(hb, 2), three), 4));
            __m128i q3 = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a, 4), lo4),
                                      _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(hb, 4), three), 4));
            __m128i q4 = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(bq, 4), lo4),
                                      _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(hb, 6), three), 4));
            EMIT_I8(0, o + 16 * c, _mm_sub_epi8(q1, off), d * sc[c], 0.0f);
            EMIT_I8(1, o + 32 + 16 * c, _mm_sub_epi8(q2, off), d * sc[2 + c], 0.0f);
            EMIT_I8(2, o + 64 + 16 * c, _mm_sub_epi8(q3, off), d * sc[4 + c], 0.0f);
            EMIT_I8(3, o + 96 + 16 * c, _mm_sub_epi8(q4, off), d * sc[6 + c], 0.0f);
          }
        }
      }
      X86_DONE;
    }
    case BK_MLX_AFFINE: {
      const int gs = w->group_size;
      const uint8_t *q = (const uint8_t *)w->data + (size_t)(row * w->cols + k0) * w->bits / 8;
      int64_t g0 = row * (w->cols / gs) + k0 / gs;
      for (int64_t g = 0; g < len / gs; g++) {
        float s = x86_scale_value(w->scale_type, w->scales, g0 + g), bias = x86_scale_value(w->scale_type, w->biases, g0 + g);
        int64_t o = g * gs;
        if (w->bits == 4) {
          const uint8_t *qg = q + g * gs / 2;
          for (int l = 0; l < gs; l += 32) {
            __m128i v = _mm_loadu_si128((const __m128i *)(qg + l / 2));
            __m128i v0 = _mm_and_si128(v, lo4), v1 = _mm_and_si128(_mm_srli_epi16(v, 4), lo4);
            EMIT_I8(0, o + l, _mm_unpacklo_epi8(v0, v1), s, bias);
            EMIT_I8(1, o + l + 16, _mm_unpackhi_epi8(v0, v1), s, bias);
          }
        } else {
          const uint8_t *qg = q + g * gs;
          for (int l = 0; l < gs; l += 32) {
            EMIT_U8(0, o + l, _mm_loadu_si128((const __m128i *)(qg + l)), s, bias);
            EMIT_U8(1, o + l + 16, _mm_loadu_si128((const __m128i *)(qg + l + 16)), s, bias);
          }
        }
      }
      X86_DONE;
    }
    case BK_FP8: { /* plain: one weight at a time through the decoder */
      const float s = ((const float *)w->scales)[row];
      for (int64_t k = 0; k < len; k++) EMIT_ONE(k, s * bk_fp8_decode(base[k0 + k]));
      X86_DONE;
    }
    case BK_Q5_0:
    case BK_Q5_1: {
      const int one5 = w->type == BK_Q5_1;
      const size_t bsize = one5 ? sizeof(bk_block_q5_1) : sizeof(bk_block_q5_0);
      const uint8_t *bp = base + (size_t)(k0 / 32) * bsize;
      /* byte l of a 16-byte mask: bit l % 8 of byte l / 8 of the fifth-bit word */
      const __m128i spread = _mm_set_epi8(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
      const __m128i bits = _mm_set_epi8(-128, 64, 32, 16, 8, 4, 2, 1, -128, 64, 32, 16, 8, 4, 2, 1);
      const __m128i sixteen = _mm_set1_epi8(16);
      for (int64_t i = 0; i < len / 32; i++, bp += bsize) {
        const uint8_t *qh = bp + (one5 ? 4 : 2);
        uint32_t h;
        uint16_t dh, mh;
        memcpy(&h, qh, 4);
        memcpy(&dh, bp, 2);
        memcpy(&mh, bp + 2, 2);
        float d = x86_half(dh), m = one5 ? x86_half(mh) : 0.0f;
        __m128i v = _mm_loadu_si128((const __m128i *)(qh + 4));
        __m128i h0 = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)h), spread);
        __m128i h1 = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)(h >> 16)), spread);
        h0 = _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(h0, bits), bits), sixteen);
        h1 = _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(h1, bits), bits), sixteen);
        __m128i a = _mm_or_si128(_mm_and_si128(v, lo4), h0), b = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(v, 4), lo4), h1);
        if (one5) {
          EMIT_U8(0, 32 * i, a, d, m);
          EMIT_U8(1, 32 * i + 16, b, d, m);
        } else {
          EMIT_I8(0, 32 * i, _mm_sub_epi8(a, sixteen), d, 0.0f);
          EMIT_I8(1, 32 * i + 16, _mm_sub_epi8(b, sixteen), d, 0.0f);
        }
      }
      X86_DONE;
    }
    case BK_IQ4_NL: {
      const bk_block_iq4_nl *b = (const bk_block_iq4_nl *)base + k0 / 32;
      const __m128i tbl = _mm_loadu_si128((const __m128i *)bk_iq4nl_values);
      for (int64_t i = 0; i < len / 32; i++) {
        float d = x86_half(b[i].d);
        __m128i v = _mm_loadu_si128((const __m128i *)b[i].qs);
        EMIT_I8(0, 32 * i, _mm_shuffle_epi8(tbl, _mm_and_si128(v, lo4)), d, 0.0f);
        EMIT_I8(1, 32 * i + 16, _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(v, 4), lo4)), d, 0.0f);
      }
      X86_DONE;
    }
    case BK_IQ4_XS: {
      const bk_block_iq4_xs *b = (const bk_block_iq4_xs *)base + k0 / 256;
      const __m128i tbl = _mm_loadu_si128((const __m128i *)bk_iq4nl_values);
      for (int64_t i = 0; i < len / 256; i++) {
        float d = x86_half(b[i].d);
        for (int s = 0; s < 8; s++) {
          int ls = ((b[i].scales_l[s / 2] >> (4 * (s % 2))) & 0xF) | (((b[i].scales_h >> (2 * s)) & 3) << 4);
          float dl = d * (float)(ls - 32);
          __m128i v = _mm_loadu_si128((const __m128i *)(b[i].qs + 16 * s));
          int64_t o = 256 * i + 32 * s;
          if (s & 1) {
            EMIT_I8(2, o, _mm_shuffle_epi8(tbl, _mm_and_si128(v, lo4)), dl, 0.0f);
            EMIT_I8(3, o + 16, _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(v, 4), lo4)), dl, 0.0f);
          } else {
            EMIT_I8(0, o, _mm_shuffle_epi8(tbl, _mm_and_si128(v, lo4)), dl, 0.0f);
            EMIT_I8(1, o + 16, _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(v, 4), lo4)), dl, 0.0f);
          }
        }
      }
      X86_DONE;
    }
    case BK_Q2_K: {
      const bk_block_q2_K *b = (const bk_block_q2_K *)base + k0 / 256;
      for (int64_t i = 0; i < len / 256; i++) {
        float d = x86_half(b[i].d), dmin = x86_half(b[i].dmin);
        for (int h = 0; h < 2; h++) {
          __m128i q0 = _mm_loadu_si128((const __m128i *)(b[i].qs + 32 * h));
          __m128i q1 = _mm_loadu_si128((const __m128i *)(b[i].qs + 32 * h + 16));
          for (int j = 0; j < 4; j++) {
            const uint8_t sc0 = b[i].scales[8 * h + 2 * j], sc1 = b[i].scales[8 * h + 2 * j + 1];
            int64_t o = 256 * i + 128 * h + 32 * j;
            __m128i a = _mm_and_si128(x86_srl16(q0, 2 * j), three), c = _mm_and_si128(x86_srl16(q1, 2 * j), three);
            if (j & 1) {
              EMIT_I8(2, o, a, d * (float)(sc0 & 0xF), -(dmin * (float)(sc0 >> 4)));
              EMIT_I8(3, o + 16, c, d * (float)(sc1 & 0xF), -(dmin * (float)(sc1 >> 4)));
            } else {
              EMIT_I8(0, o, a, d * (float)(sc0 & 0xF), -(dmin * (float)(sc0 >> 4)));
              EMIT_I8(1, o + 16, c, d * (float)(sc1 & 0xF), -(dmin * (float)(sc1 >> 4)));
            }
          }
        }
      }
      X86_DONE;
    }
    case BK_Q3_K: {
      const bk_block_q3_K *b = (const bk_block_q3_K *)base + k0 / 256;
      const __m128i four = _mm_set1_epi8(4);
      for (int64_t i = 0; i < len / 256; i++) {
        float d = x86_half(b[i].d);
        __m128i m0 = _mm_loadu_si128((const __m128i *)b[i].hmask), m1 = _mm_loadu_si128((const __m128i *)(b[i].hmask + 16));
        for (int h = 0; h < 2; h++) {
          __m128i q0 = _mm_loadu_si128((const __m128i *)(b[i].qs + 32 * h));
          __m128i q1 = _mm_loadu_si128((const __m128i *)(b[i].qs + 32 * h + 16));
          for (int j = 0; j < 4; j++) {
            int t = 8 * h + 2 * j, sh = 4 * h + j;
            float d0 = d * (float)(bk_q3_K_scale(b[i].scales, t) - 32), d1 = d * (float)(bk_q3_K_scale(b[i].scales, t + 1) - 32);
            int64_t o = 256 * i + 128 * h + 32 * j;
            /* low two bits | the high bit at bit 2, minus 4 */
            __m128i a = _mm_or_si128(_mm_and_si128(x86_srl16(q0, 2 * j), three), _mm_slli_epi16(_mm_and_si128(x86_srl16(m0, sh), one), 2));
            __m128i c = _mm_or_si128(_mm_and_si128(x86_srl16(q1, 2 * j), three), _mm_slli_epi16(_mm_and_si128(x86_srl16(m1, sh), one), 2));
            if (j & 1) {
              EMIT_I8(2, o, _mm_sub_epi8(a, four), d0, 0.0f);
              EMIT_I8(3, o + 16, _mm_sub_epi8(c, four), d1, 0.0f);
            } else {
              EMIT_I8(0, o, _mm_sub_epi8(a, four), d0, 0.0f);
              EMIT_I8(1, o + 16, _mm_sub_epi8(c, four), d1, 0.0f);
            }
          }
        }
      }
      X86_DONE;
    }
    default: X86_DONE;
  }
}

#ifdef X86_GEMV_PF_DEFAULT
#undef X86_GEMV_PF
#undef X86_GEMV_PF_DEFAULT
#endif
