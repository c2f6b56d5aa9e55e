/* test_quant.c — the weight formats: half / bfloat16 conversions against
 * known encodings, hand-made GGUF and MLX blocks that must decode to known
 * floats (the ggml / MLX layouts), exact round trips of representable values,
 * and quantize -> dequantize error bounds for every format. */
#include <stdint.h>
#include <string.h>

#include "backend/formats.h"
#include "backend/weights.h"
#include "test.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* uniform in [-1, 1) */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((rng_state >> 40) * (2.0 / 16777216.0) - 1.0);
}
static float fgauss(void) { return (frand() + frand() + frand() + frand()) * 0.87f; }

static void test_fp16(void) {
  CHECK_EQ_INT(bk_fp16_encode(1.0f), 0x3C00);
  CHECK_EQ_INT(bk_fp16_encode(0.5f), 0x3800);
  CHECK_EQ_INT(bk_fp16_encode(-2.0f), 0xC000);
  CHECK_EQ_INT(bk_fp16_encode(65504.0f), 0x7BFF);
  CHECK_EQ_INT(bk_fp16_encode(65520.0f), 0x7C00);      /* halfway to 65536 rounds to even: infinity */
  CHECK_EQ_INT(bk_fp16_encode(65519.0f), 0x7BFF);
  CHECK_EQ_INT(bk_fp16_encode(ldexpf(1, -24)), 0x0001); /* smallest subnormal */
  CHECK_EQ_INT(bk_fp16_encode(ldexpf(1, -26)), 0x0000); /* a quarter of it: rounds to zero */
  CHECK_EQ_INT(bk_fp16_encode(ldexpf(3, -26)), 0x0001); /* three quarters: rounds up */
  CHECK_EQ_INT(bk_fp16_encode(1.0f + ldexpf(1, -11)), 0x3C00);     /* tie, even stays */
  CHECK_EQ_INT(bk_fp16_encode(1.0f + ldexpf(3, -11)), 0x3C02);     /* tie, odd rounds up */
  CHECK_EQ_INT(bk_fp16_encode(ldexpf(1023, -24) + ldexpf(1, -25)), 0x0400); /* subnormal tie carries to min normal */
  CHECK(bk_fp16_encode(NAN) & 0x3FF);
  CHECK_EQ_INT(bk_fp16_encode(NAN) & 0x7C00, 0x7C00);
  CHECK(bk_fp16_decode(0x0001) == ldexpf(1, -24));
  CHECK(bk_fp16_decode(0x3555) == 0.333251953125f);
  CHECK(isinf(bk_fp16_decode(0xFC00)) && bk_fp16_decode(0xFC00) < 0);
  CHECK(isnan(bk_fp16_decode(0x7E00)));
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue; /* NaN */
    if (bk_fp16_encode(bk_fp16_decode((uint16_t)h)) != h) bad++;
  }
  CHECK_EQ_INT(bad, 0);
}

static void test_bf16(void) {
  CHECK_EQ_INT(bk_bf16_encode(1.0f), 0x3F80);
  CHECK_EQ_INT(bk_bf16_encode(-0.5f), 0xBF00);
  CHECK_EQ_INT(bk_bf16_encode(1.0f + ldexpf(1, -8)), 0x3F80); /* tie, even */
  CHECK_EQ_INT(bk_bf16_encode(1.0f + ldexpf(3, -8)), 0x3F82); /* tie, odd rounds up */
  CHECK_EQ_INT(bk_bf16_encode(1.0f + ldexpf(5, -10)), 0x3F81);
  CHECK(isnan(bk_bf16_decode(bk_bf16_encode(NAN))));
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    if ((h & 0x7F80) == 0x7F80 && (h & 0x7F)) continue;
    if (bk_bf16_encode(bk_bf16_decode((uint16_t)h)) != h) bad++;
  }
  CHECK_EQ_INT(bad, 0);
}

static bk_weight one_row(bk_type t, int64_t cols, const void *data) {
  bk_weight w = {.type = t, .rows = 1, .cols = cols, .data = data};
  return w;
}

static void test_q8_0_layout(void) {
  bk_block_q8_0 b;
  b.d = 0x3400; /* 0.25 */
  for (int l = 0; l < 32; l++) b.qs[l] = (int8_t)(l - 16);
  bk_weight w = one_row(BK_Q8_0, 32, &b);
  float out[32];
  CHECK_EQ_INT(bk_dequant_row(&w, 0, out, NULL), 0);
  for (int l = 0; l < 32; l++) CHECK(out[l] == (l - 16) * 0.25f);
}

static void test_q4_0_layout(void) {
  bk_block_q4_0 b;
  b.d = 0x3800; /* 0.5 */
  for (int l = 0; l < 16; l++) b.qs[l] = (uint8_t)(l | ((15 - l) << 4));
  bk_weight w = one_row(BK_Q4_0, 32, &b);
  float out[32];
  CHECK_EQ_INT(bk_dequant_row(&w, 0, out, NULL), 0);
  for (int l = 0; l < 16; l++) {
    CHECK(out[l] == (l - 8) * 0.5f);       /* low nibbles: elements 0..15 */
    CHECK(out[16 + l] == (7 - l) * 0.5f);  /* high nibbles: elements 16..31 */
  }
  CHECK(out[0] == -4.0f && out[15] == 3.5f && out[16] == 3.5f && out[31] == -4.0f);
}

/* Scales and mins of the hand-made K blocks, and their packed bytes worked out by hand. */
static const uint8_t k_sc[8] = {1, 2, 3, 4, 17, 33, 50, 63};
static const uint8_t k_m[8] = {0, 5, 10, 20, 30, 40, 45, 63};
static const uint8_t k_packed[12] = {0x41, 0x82, 0xC3, 0xC4, 0x40, 0x85, 0x8A, 0xD4, 0xE1, 0x81, 0xD2, 0xFF};

static void test_k_scales(void) {
  for (int j = 0; j < 8; j++) {
    uint8_t sc, m;
    bk_k_scale_min(k_packed, j, &sc, &m);
    CHECK_EQ_INT(sc, k_sc[j]);
    CHECK_EQ_INT(m, k_m[j]);
  }
}

static void test_q4_K_layout(void) {
  bk_block_q4_K b;
  b.d = 0x3C00;    /* 1.0 */
  b.dmin = 0x3800; /* 0.5 */
  memcpy(b.scales, k_packed, 12);
  for (int i = 0; i < 128; i++) b.qs[i] = (uint8_t)(i * 7);
  bk_weight w = one_row(BK_Q4_K, 256, &b);
  float out[256];
  CHECK_EQ_INT(bk_dequant_row(&w, 0, out, NULL), 0);
  int bad = 0;
  for (int p = 0; p < 4; p++)
    for (int l = 0; l < 32; l++) {
      uint8_t q = b.qs[32 * p + l];
      if (out[64 * p + l] != k_sc[2 * p] * (q & 0xF) - 0.5f * k_m[2 * p]) bad++;
      if (out[64 * p + 32 + l] != k_sc[2 * p + 1] * (q >> 4) - 0.5f * k_m[2 * p + 1]) bad++;
    }
  CHECK_EQ_INT(bad, 0);
  CHECK(out[0] == 0.0f);
  CHECK(out[100] == 50.0f);  /* qs[36] = 0xFC: high nibble 15, scale 4, min 20 * 0.5 */
  CHECK(out[230] == 724.5f); /* qs[102] = 0xCA: high nibble 12, scale 63, min 63 * 0.5 */
}

static void test_q5_K_layout(void) {
  bk_block_q5_K b;
  b.d = 0x3C00;
  b.dmin = 0x3800;
  memcpy(b.scales, k_packed, 12);
  for (int i = 0; i < 128; i++) b.qs[i] = (uint8_t)(i * 7);
  for (int i = 0; i < 32; i++) b.qh[i] = (uint8_t)(i * 29);
  bk_weight w = one_row(BK_Q5_K, 256, &b);
  float out[256];
  CHECK_EQ_INT(bk_dequant_row(&w, 0, out, NULL), 0);
  int bad = 0;
  for (int p = 0; p < 4; p++)
    for (int l = 0; l < 32; l++) {
      uint8_t q = b.qs[32 * p + l];
      int lo = (q & 0xF) + ((b.qh[l] >> (2 * p)) & 1) * 16, hi = (q >> 4) + ((b.qh[l] >> (2 * p + 1)) & 1) * 16;
      if (out[64 * p + l] != k_sc[2 * p] * lo - 0.5f * k_m[2 * p]) bad++;
      if (out[64 * p + 32 + l] != k_sc[2 * p + 1] * hi - 0.5f * k_m[2 * p + 1]) bad++;
    }
  CHECK_EQ_INT(bad, 0);
  CHECK(out[100] == 50.0f); /* qs[36] high nibble 15, qh[4] = 0x74 bit 3 clear */
  CHECK(out[70] == 73.0f);  /* qs[38] low nibble 10, qh[6] = 0xAE bit 2 set: 26 * 3 - 5 */
}

static void test_q6_K_layout(void) {
  bk_block_q6_K b;
  b.d = 0x3800; /* 0.5 */
  for (int i = 0; i < 128; i++) b.ql[i] = (uint8_t)(i * 11);
  for (int i = 0; i < 64; i++) b.qh[i] = (uint8_t)(i * 37);
  for (int j = 0; j < 16; j++) b.scales[j] = (int8_t)(j * 3 - 20);
  bk_weight w = one_row(BK_Q6_K, 256, &b);
  float out[256];
  CHECK_EQ_INT(bk_dequant_row(&w, 0, out, NULL), 0);
  CHECK(out[0] == 320.0f);    /* q 0 - 32 = -32, scale -20, d 0.5 */
  CHECK(out[200] == -248.0f); /* half 1, element 72: ql[72] = 24 high nibble 1, qh[40] = 200 bits 4-5 = 0; scale 16 */
  int bad = 0;
  for (int h = 0; h < 2; h++)
    for (int t = 0; t < 128; t++) {
      int g = t / 32, l = t % 32;
      uint8_t ql = b.ql[64 * h + l + (g & 1) * 32], qh = b.qh[32 * h + l];
      int q = ((g < 2 ? ql & 0xF : ql >> 4) | (((qh >> (2 * g)) & 3) << 4)) - 32;
      float want = 0.5f * b.scales[8 * h + 2 * g + l / 16] * q;
      if (out[128 * h + t] != want) bad++;
    }
  CHECK_EQ_INT(bad, 0);
}

static void test_mlx_layout(void) {
  uint32_t q4[4] = {0x76543210u, 0xFEDCBA98u, 0x01234567u, 0x89ABCDEFu};
  float s = 0.5f, bias = -1.0f;
  bk_weight w = {.type = BK_MLX_AFFINE, .rows = 1, .cols = 32, .data = q4, .bits = 4, .group_size = 32,
                 .scale_type = BK_F32, .scales = &s, .biases = &bias};
  float out[32];
  CHECK_EQ_INT(bk_dequant_row(&w, 0, out, NULL), 0);
  for (int j = 0; j < 16; j++) CHECK(out[j] == 0.5f * j - 1.0f);
  for (int j = 0; j < 8; j++) CHECK(out[16 + j] == 0.5f * (7 - j) - 1.0f);
  for (int j = 0; j < 8; j++) CHECK(out[24 + j] == 0.5f * (15 - j) - 1.0f);
  uint32_t q8[8] = {0x04030201u, 0xFF000080u};
  uint16_t s16 = 0x3C00, b16 = 0x0000; /* f16 1.0, 0.0 */
  bk_weight w8 = {.type = BK_MLX_AFFINE, .rows = 1, .cols = 32, .data = q8, .bits = 8, .group_size = 32,
                  .scale_type = BK_F16, .scales = &s16, .biases = &b16};
  CHECK_EQ_INT(bk_dequant_row(&w8, 0, out, NULL), 0);
  CHECK(out[0] == 1 && out[1] == 2 && out[2] == 3 && out[3] == 4);
  CHECK(out[4] == 128 && out[5] == 0 && out[6] == 0 && out[7] == 255);
}

static void test_exact_round_trips(void) {
  float x[32], out[32];
  /* Q8_0: amax 31.75 = 127 * 0.25, every value a multiple of 0.25 */
  x[0] = 31.75f;
  for (int l = 1; l < 32; l++) x[l] = (l * 7 - 100) * 0.25f;
  bk_block_q8_0 b8;
  CHECK_EQ_INT(bk_quantize(BK_Q8_0, x, 1, 32, &b8, NULL), 0);
  CHECK_EQ_INT(b8.d, 0x3400);
  bk_weight w = one_row(BK_Q8_0, 32, &b8);
  bk_dequant_row(&w, 0, out, NULL);
  for (int l = 0; l < 32; l++) CHECK(out[l] == x[l]);
  /* Q4_0: largest magnitude -4 gives d = 0.5; values (q - 8) * 0.5 */
  x[0] = -4.0f;
  for (int l = 1; l < 32; l++) x[l] = ((l * 5) % 16 - 8) * 0.5f;
  bk_block_q4_0 b4;
  CHECK_EQ_INT(bk_quantize(BK_Q4_0, x, 1, 32, &b4, NULL), 0);
  CHECK_EQ_INT(b4.d, 0x3800);
  w = one_row(BK_Q4_0, 32, &b4);
  bk_dequant_row(&w, 0, out, NULL);
  for (int l = 0; l < 32; l++) CHECK(out[l] == x[l]);
  /* MLX 4-bit: min -1, max 2.75 -> scale 0.25; values 0.25 q - 1 */
  for (int l = 0; l < 32; l++) x[l] = 0.25f * ((l * 3) % 16) - 1.0f;
  uint32_t wq[4];
  uint16_t sc, bi;
  CHECK_EQ_INT(bk_quantize_mlx(x, 1, 32, 4, 32, BK_F16, wq, &sc, &bi, NULL), 0);
  CHECK_EQ_INT(sc, 0x3400);
  CHECK_EQ_INT(bi, 0xBC00);
  bk_weight wm = {.type = BK_MLX_AFFINE, .rows = 1, .cols = 32, .data = wq, .bits = 4, .group_size = 32,
                  .scale_type = BK_F16, .scales = &sc, .biases = &bi};
  bk_dequant_row(&wm, 0, out, NULL);
  for (int l = 0; l < 32; l++) CHECK(out[l] == x[l]);
  CHECK_EQ_INT(wq[0] & 0xF, 0);         /* element 0: q 0 in the lowest nibble */
  CHECK_EQ_INT((wq[0] >> 4) & 0xF, 3);  /* element 1: q 3 */
  /* f16 / bf16: representable values survive */
  for (int l = 0; l < 32; l++) x[l] = (float)(l - 16) * 0.125f;
  uint16_t h[32];
  CHECK_EQ_INT(bk_quantize(BK_F16, x, 1, 32, h, NULL), 0);
  w = one_row(BK_F16, 32, h);
  bk_dequant_row(&w, 0, out, NULL);
  for (int l = 0; l < 32; l++) CHECK(out[l] == x[l]);
  CHECK_EQ_INT(bk_quantize(BK_BF16, x, 1, 32, h, NULL), 0);
  w = one_row(BK_BF16, 32, h);
  bk_dequant_row(&w, 0, out, NULL);
  for (int l = 0; l < 32; l++) CHECK(out[l] == x[l]);
}

/* Quantizes rows x cols of gaussian data (with an outlier per row) and checks
 * the largest error per block against max_rel * (the block's range) and the
 * RMS error against rms_rel * RMS(range). */
static void check_error(bk_type t, int64_t blk, double max_rel, double rms_rel) {
  enum { ROWS = 4, COLS = 1024 };
  float *x = malloc(sizeof(float) * ROWS * COLS), *out = malloc(sizeof(float) * COLS);
  for (int i = 0; i < ROWS * COLS; i++) x[i] = fgauss() * (1 + (i / 256) % 3);
  for (int r = 0; r < ROWS; r++) x[r * COLS + 17 * r + 5] = 9.0f * (r & 1 ? -1 : 1);
  size_t rb = bk_row_bytes(t, COLS, 0);
  void *q = malloc(rb * ROWS);
  CHECK_EQ_INT(bk_quantize(t, x, ROWS, COLS, q, NULL), 0);
  bk_weight w = {.type = t, .rows = ROWS, .cols = COLS, .data = q};
  double worst = 0, se = 0, sr = 0;
  for (int r = 0; r < ROWS; r++) {
    CHECK_EQ_INT(bk_dequant_row(&w, r, out, NULL), 0);
    for (int b = 0; b < COLS / blk; b++) {
      const float *xb = x + r * COLS + b * blk;
      float mn = 0, mx = 0;
      for (int l = 0; l < blk; l++) {
        mn = fminf(mn, xb[l]);
        mx = fmaxf(mx, xb[l]);
      }
      double range = mx - mn;
      for (int l = 0; l < blk; l++) {
        double e = fabs((double)out[b * blk + l] - xb[l]);
        if (!(e <= max_rel * range)) worst = fmax(worst, isnan(e) ? 1e30 : e / range);
        se += e * e;
      }
      sr += range * range * blk;
    }
  }
  CHECK_MSG(worst == 0, "%s: an error of %.4g x the block range exceeds %.4g", bk_type_name(t), worst, max_rel);
  double rms = sqrt(se / sr);
  CHECK_MSG(rms <= rms_rel, "%s: RMS error %.4g x the block range exceeds %.4g", bk_type_name(t), rms, rms_rel);
  fprintf(stderr, "  %-5s max bound %.4f, rms %.5f of the block range\n", bk_type_name(t), max_rel, rms);
  free(x);
  free(out);
  free(q);
}

static void test_quantize_errors(void) {
  check_error(BK_F16, 32, ldexp(1, -11), 1e-3);
  check_error(BK_BF16, 32, ldexp(1, -8), 4e-3);
  check_error(BK_Q8_0, 32, 0.5 / 127 + 1.0 / 1024, 0.5 / 127 / sqrt(3.0));  /* range >= amax */
  check_error(BK_Q4_0, 32, 1.0 / 8 * 1.01, 0.5 / 8 / sqrt(3.0));                       /* range >= amax; d = amax / 8 */
  check_error(BK_Q4_K, 256, 0.5 / 15 + 0.025, 0.5 / 15 / sqrt(3.0));
  check_error(BK_Q5_K, 256, 0.5 / 31 + 0.016, 0.5 / 31 / sqrt(3.0));
  check_error(BK_Q6_K, 256, 0.5 / 31 + 0.01, 0.5 / 31 / sqrt(3.0));
  check_error(BK_Q5_0, 32, 1.0 / 16 * 1.01, 0.5 / 16 / sqrt(3.0));   /* as Q4_0, d = amax / 16 */
  check_error(BK_Q5_1, 32, 0.5 / 31 + 1.0 / 1024, 0.5 / 31 / sqrt(3.0)); /* d = range / 31, m = min */
  /* IQ4_NL: d = amax / 127; the levels' widest gap (89..113) and the top (113..127) leave at most 14 d */
  check_error(BK_IQ4_NL, 32, 14.0 / 127 * 1.01, 0.5 * 16 / 127 / sqrt(3.0));
}

static void test_mlx_errors(void) {
  enum { ROWS = 3, COLS = 512 };
  float *x = malloc(sizeof(float) * ROWS * COLS), *out = malloc(sizeof(float) * COLS);
  for (int i = 0; i < ROWS * COLS; i++) x[i] = fgauss() + 0.3f;
  uint32_t *wq = malloc(ROWS * COLS);
  float *sc = malloc(sizeof(float) * ROWS * COLS / 32), *bi = malloc(sizeof(float) * ROWS * COLS / 32);
  const bk_type stypes[3] = {BK_F32, BK_F16, BK_BF16};
  for (int bits = 4; bits <= 8; bits += 4)
    for (int gs = 32; gs <= 128; gs *= 2)
      for (int s = 0; s < 3; s++) {
        CHECK_EQ_INT(bk_quantize_mlx(x, ROWS, COLS, bits, gs, stypes[s], wq, sc, bi, NULL), 0);
        bk_weight w = {.type = BK_MLX_AFFINE, .rows = ROWS, .cols = COLS, .data = wq, .bits = bits, .group_size = gs,
                       .scale_type = stypes[s], .scales = sc, .biases = bi};
        double sround = stypes[s] == BK_BF16 ? ldexp(1, -8) : stypes[s] == BK_F16 ? ldexp(1, -11) : 1e-7;
        int bad = 0;
        for (int r = 0; r < ROWS; r++) {
          CHECK_EQ_INT(bk_dequant_row(&w, r, out, NULL), 0);
          for (int g = 0; g < COLS / gs; g++) {
            const float *xg = x + r * COLS + g * gs;
            float mn = xg[0], mx = xg[0];
            for (int l = 0; l < gs; l++) mn = fminf(mn, xg[l]), mx = fmaxf(mx, xg[l]);
            double bound = 0.5 * (mx - mn) / ((1 << bits) - 1) + 2 * sround * (fabs(mn) + (mx - mn)) + 1e-6;
            for (int l = 0; l < gs; l++)
              if (!(fabs(out[g * gs + l] - xg[l]) <= bound)) bad++;
          }
        }
        CHECK_MSG(bad == 0, "mlx %d-bit group %d %s: %d values beyond the bound", bits, gs, bk_type_name(stypes[s]), bad);
      }
  free(x);
  free(out);
  free(wq);
  free(sc);
  free(bi);
}

static void test_bad_input(void) {
  float x[64] = {0}, out[64];
  uint8_t buf[256];
  herr err = {0};
  CHECK_EQ_INT(bk_quantize(BK_Q4_0, x, 1, 40, buf, &err), HEARTH_EINVAL);
  CHECK(strstr(err.msg, "blocks") != NULL);
  herr_clear(&err);
  bk_weight w = {.type = BK_Q4_K, .rows = 1, .cols = 64, .data = buf};
  CHECK_EQ_INT(bk_dequant_row(&w, 0, out, &err), HEARTH_EINVAL);
  CHECK(strstr(err.msg, "q4_K") != NULL);
  herr_clear(&err);
  w = (bk_weight){.type = BK_Q8_0, .rows = 1, .cols = 32, .data = buf};
  CHECK_EQ_INT(bk_dequant_row(&w, 1, out, &err), HEARTH_EINVAL);
  herr_clear(&err);
  w = (bk_weight){.type = BK_MLX_AFFINE, .rows = 1, .cols = 64, .data = buf, .bits = 3, .group_size = 32,
                  .scale_type = BK_F16, .scales = buf, .biases = buf};
  CHECK_EQ_INT(bk_weight_validate(&w, &err), HEARTH_EINVAL);
  CHECK(strstr(err.msg, "bits") != NULL);
  herr_clear(&err);
  w.bits = 4;
  w.scale_type = BK_Q8_0;
  CHECK_EQ_INT(bk_weight_validate(&w, &err), HEARTH_EINVAL);
  herr_clear(&err);
  w.scale_type = BK_BF16;
  CHECK_EQ_INT(bk_weight_validate(&w, &err), 0);
  w.type = (bk_type)99;
  CHECK_EQ_INT(bk_weight_validate(&w, &err), HEARTH_EINVAL);
  herr_clear(&err);
  CHECK_EQ_INT(bk_quantize_mlx(x, 1, 48, 4, 32, BK_F16, (uint32_t *)buf, buf, buf, &err), HEARTH_EINVAL);
  herr_clear(&err);
  CHECK_EQ_INT(bk_row_bytes(BK_Q6_K, 512, 0), 420);
  CHECK_EQ_INT(bk_row_bytes(BK_Q5_K, 256, 0), 176);
  CHECK_EQ_INT(bk_row_bytes(BK_MLX_AFFINE, 64, 4), 32);
  CHECK_EQ_INT(bk_row_bytes(BK_Q8_0, 33, 0), 0);
}

/* FP8 E4M3: every code decodes to its value and encodes back; halfway
 * values round to the even code; out of range saturates; per-row scales. */
static void test_fp8(void) {
  CHECK(bk_fp8_decode(0x7E) == 448.0f);
  CHECK(bk_fp8_decode(0xFE) == -448.0f);
  CHECK(bk_fp8_decode(0x08) == 0.015625f);     /* 2^-6, the smallest normal */
  CHECK(bk_fp8_decode(0x01) == 0.001953125f);  /* 2^-9, the smallest subnormal */
  CHECK(bk_fp8_decode(0x38) == 1.0f);
  CHECK(bk_fp8_decode(0x3C) == 1.5f);
  CHECK(isnan(bk_fp8_decode(0x7F)) && isnan(bk_fp8_decode(0xFF)));
  for (int c = 0; c < 256; c++) {
    if ((c & 0x7F) == 0x7F) continue;
    CHECK_EQ_INT(bk_fp8_encode(bk_fp8_decode((uint8_t)c)), c);
  }
  for (int c = 0; c < 0x7D; c++) { /* midpoints between neighbouring positive codes: the even one */
    float mid = 0.5f * (bk_fp8_decode((uint8_t)c) + bk_fp8_decode((uint8_t)(c + 1)));
    CHECK_EQ_INT(bk_fp8_encode(mid), (c & 1) ? c + 1 : c);
  }
  CHECK_EQ_INT(bk_fp8_encode(1e6f), 0x7E);
  CHECK_EQ_INT(bk_fp8_encode(-INFINITY), 0xFE);
  CHECK_EQ_INT(bk_fp8_encode(1e-9f), 0x00);
  /* every byte as the OCP E4M3 spec defines it: S.EEEE.MMM, bias 7, E = 0
   * subnormal (M/8 * 2^-6), S.1111.111 NaN, no infinities (bk_fp8_value,
   * the kernels' inline form, is the same function) */
  for (int c = 0; c < 256; c++) {
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    float v = bk_fp8_decode((uint8_t)c);
    if (e == 15 && m == 7) {
      CHECK_MSG(isnan(v) && isnan(bk_fp8_value((uint8_t)c)), "0x%02x: NaN", c);
      continue;
    }
    double want = (e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6)) * (s ? -1 : 1);
    CHECK_MSG((double)v == want && !!signbit(v) == s, "0x%02x: %g, not %g", c, (double)v, want);
    float w = bk_fp8_value((uint8_t)c);
    CHECK_MSG(memcmp(&w, &v, 4) == 0, "bk_fp8_value 0x%02x", c);
  }
  /* saturation: everything from 448 up is 448 (480 would be S.1111.111, NaN) */
  CHECK_EQ_INT(bk_fp8_encode(448.0f), 0x7E);
  CHECK_EQ_INT(bk_fp8_encode(463.9f), 0x7E);
  CHECK_EQ_INT(bk_fp8_encode(464.0f), 0x7E);
  CHECK_EQ_INT(bk_fp8_encode(479.0f), 0x7E);
  CHECK_EQ_INT(bk_fp8_encode(-1000.0f), 0xFE);
  CHECK_EQ_INT(bk_fp8_encode(INFINITY), 0x7E);
  CHECK_EQ_INT(bk_fp8_encode(NAN) & 0x7F, 0x7F);
  /* ties to even, by hand: 1 + 1/16 between 1 (0x38) and 1.125 (0x39); 1.1875 between 0x39 and 1.25 (0x3A);
   * 2^-10 between 0 and 2^-9; 3 * 2^-10 between 0x01 and 0x02; 7.5 * 2^-9 between 0x07 and 2^-6 (0x08);
   * negatives mirror */
  CHECK_EQ_INT(bk_fp8_encode(1.0625f), 0x38);
  CHECK_EQ_INT(bk_fp8_encode(1.1875f), 0x3A);
  CHECK_EQ_INT(bk_fp8_encode(0x1p-10f), 0x00);
  CHECK_EQ_INT(bk_fp8_encode(0x3p-10f), 0x02);
  CHECK_EQ_INT(bk_fp8_encode(0xFp-10f), 0x08);
  CHECK_EQ_INT(bk_fp8_encode(-1.0625f), 0xB8);
  CHECK_EQ_INT(bk_fp8_encode(-0x3p-10f), 0x82);
  CHECK_EQ_INT(bk_fp8_encode(1.0626f), 0x39); /* just past a tie: up */
  CHECK_EQ_INT(bk_fp8_encode(-0.0f), 0x80);
  float x[2 * 40];
  for (int i = 0; i < 80; i++) x[i] = i < 40 ? 0.0f : (float)(i - 60) * 0.37f;
  uint8_t q[80];
  float sc[2], back[40];
  CHECK_EQ_INT(bk_quantize_fp8(x, 2, 40, q, sc, NULL), 0);
  CHECK(sc[0] == 0.0f && fabsf(sc[1] - 20 * 0.37f / 448.0f) < 1e-9f);
  bk_weight w = {.type = BK_FP8, .rows = 2, .cols = 40, .data = q, .scale_type = BK_F32, .scales = sc};
  CHECK_EQ_INT(bk_dequant_row(&w, 0, back, NULL), 0);
  for (int i = 0; i < 40; i++) CHECK(back[i] == 0.0f);
  CHECK_EQ_INT(bk_dequant_row(&w, 1, back, NULL), 0);
  for (int i = 0; i < 40; i++) CHECK(fabsf(back[i] - x[40 + i]) <= 0.0625f * fabsf(x[40 + i]) + 1e-6f); /* 3 mantissa bits */
  w.scales = NULL;
  CHECK(bk_dequant_row(&w, 0, back, NULL) != 0);
}

int main(void) {
  RUN(test_fp16);
  RUN(test_bf16);
  RUN(test_q8_0_layout);
  RUN(test_q4_0_layout);
  RUN(test_k_scales);
  RUN(test_q4_K_layout);
  RUN(test_q5_K_layout);
  RUN(test_q6_K_layout);
  RUN(test_mlx_layout);
  RUN(test_exact_round_trips);
  RUN(test_quantize_errors);
  RUN(test_mlx_errors);
  RUN(test_bad_input);
  RUN(test_fp8);
  TEST_MAIN_END();
}
