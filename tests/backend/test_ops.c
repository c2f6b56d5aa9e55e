/* test_ops.c — every backend op against a naive double-precision
 * computation written here from the op's definition, on random inputs. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/ops.h"
#include "backend/cpu/cpu.h"
#include "backend/weights.h"
#include "base/pool.h"
#include "test.h"

static uint64_t rng_state = 88172645463325252ull;
static double urand(void) { /* xorshift64 → [0, 1) */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) / 9007199254740992.0;
}
static float nrand(void) { return (float)((urand() + urand() + urand() - 1.5) * 2.0); }
static float *rand_buf(size_t n) {
  float *p = bk_alloc(n);
  for (size_t i = 0; i < n; i++) p[i] = nrand();
  return p;
}

/* relative-or-absolute closeness, NaN never passes */
static double rel_err(double got, double want) { return fabs(got - want) / (fabs(want) > 1 ? fabs(want) : 1); }

static void test_matmul(void) {
  hpool *pool = hpool_create(3);
  const int shapes[][3] = {{1, 7, 5}, {3, 64, 130}, {17, 33, 1}, {5, 128, 257}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int n = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
    float *x = rand_buf((size_t)n * in), *w = rand_buf((size_t)out * in), *b = rand_buf((size_t)out);
    float *y = bk_alloc((size_t)n * out);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
      op_matmul_ref(with_bias ? pool : NULL, y, x, n, in, w, out, with_bias ? b : NULL);
      double worst = 0;
      for (int r = 0; r < n; r++)
        for (int c = 0; c < out; c++) {
          double want = with_bias ? b[c] : 0;
          for (int k = 0; k < in; k++) want += (double)x[r * in + k] * w[c * in + k];
          double e = rel_err(y[r * out + c], want);
          if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
        }
      CHECK_MSG(worst < 1e-5, "matmul %dx%dx%d bias %d: rel err %g", n, in, out, with_bias, worst);
    }
    bk_free(x), bk_free(w), bk_free(b), bk_free(y);
  }
  hpool_destroy(pool);
}

/* op_matmul (whatever kernel it runs) against the reference, and a row's
 * result must not depend on the batch around it (chunked prefill relies on it). */
static void test_matmul_fast_vs_ref(void) {
  hpool *pool = hpool_create(2);
  const int shapes[][3] = {{1, 64, 64}, {4, 64, 512}, {7, 100, 131}, {13, 257, 37}, {2, 8, 5}, {9, 3, 2}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int n = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
    float *x = rand_buf((size_t)n * in), *w = rand_buf((size_t)out * in), *b = rand_buf((size_t)out);
    float *y = bk_alloc((size_t)n * out), *r = bk_alloc((size_t)n * out), *one = bk_alloc((size_t)out);
    op_matmul(pool, y, x, n, in, w, out, b);
    op_matmul_ref(pool, r, x, n, in, w, out, b);
    double worst = 0;
    for (int i = 0; i < n * out; i++) {
      double e = rel_err(y[i], r[i]);
      if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
    CHECK_MSG(worst < 1e-5, "fast matmul %dx%dx%d: rel err %g vs reference", n, in, out, worst);
    int mism = 0;
    for (int row = 0; row < n; row++) {
      op_matmul(pool, one, x + row * in, 1, in, w, out, b);
      mism += memcmp(one, y + row * out, sizeof(float) * (size_t)out) != 0;
    }
    CHECK_MSG(mism == 0, "fast matmul %dx%dx%d: %d rows differ from the same row alone", n, in, out, mism);
    bk_free(x), bk_free(w), bk_free(b), bk_free(y), bk_free(r), bk_free(one);
  }
  hpool_destroy(pool);
}

static void test_rmsnorm(void) {
  int n = 4, d = 48;
  float *x = rand_buf((size_t)n * d), *w = rand_buf((size_t)d), *y = bk_alloc((size_t)n * d);
  for (int unit = 0; unit < 2; unit++) {
    op_rmsnorm(y, x, n, d, w, 1e-5f, unit);
    for (int r = 0; r < n; r++) {
      double ss = 0;
      for (int i = 0; i < d; i++) ss += (double)x[r * d + i] * x[r * d + i];
      double inv = 1 / sqrt(ss / d + 1e-5);
      for (int i = 0; i < d; i++) {
        double want = x[r * d + i] * inv * (unit ? 1.0 + w[i] : w[i]);
        CHECK_NEAR(y[r * d + i], want, 1e-5 * (1 + fabs(want)));
      }
    }
  }
  /* in place, no weight */
  memcpy(y, x, sizeof(float) * (size_t)d);
  op_rmsnorm(y, y, 1, d, NULL, 0, false);
  double ss = 0;
  for (int i = 0; i < d; i++) ss += (double)y[i] * y[i];
  CHECK_NEAR(ss / d, 1.0, 1e-5);
  bk_free(x), bk_free(w), bk_free(y);
}

static void test_rope(void) {
  int n = 3, heads = 2, hd = 12;
  int64_t pos[3] = {0, 5, 37};
  double inv[6];
  for (int rot = 8; rot <= 12; rot += 4) { /* partial and full rotary */
    for (int i = 0; i < rot / 2; i++) inv[i] = 1.0 / pow(10000.0, 2.0 * i / rot);
    rope_table t = {.rot_dim = rot, .inv_freq = inv, .attn_scale = 1.25, .interleaved = false};
    float *x = rand_buf((size_t)n * heads * hd), *y = bk_alloc((size_t)n * heads * hd);
    memcpy(y, x, sizeof(float) * (size_t)(n * heads * hd));
    op_rope(y, n, heads, hd, pos, &t);
    for (int r = 0; r < n; r++)
      for (int h = 0; h < heads; h++) {
        const float *a = x + (r * heads + h) * hd;
        const float *b = y + (r * heads + h) * hd;
        for (int i = 0; i < hd; i++) {
          double want;
          if (i >= rot) want = a[i];
          else {
            int half = rot / 2, k = i % half;
            double ang = pos[r] * inv[k], c = cos(ang) * 1.25, s = sin(ang) * 1.25;
            /* x * cos + rotate_half(x) * sin, rotate_half = [-x2, x1] */
            double rh = i < half ? -a[i + half] : a[i - half];
            want = a[i] * c + rh * s;
          }
          CHECK_NEAR(b[i], want, 1e-5 * (1 + fabs(want)));
        }
      }
    bk_free(x), bk_free(y);
  }
}

static void test_elementwise(void) {
  int n = 257;
  float *x = rand_buf((size_t)n), *y = rand_buf((size_t)n), *z = bk_alloc((size_t)n);
  for (int i = 0; i < n; i++) x[i] *= 4;
  memcpy(z, x, sizeof(float) * n);
  op_silu(z, n);
  for (int i = 0; i < n; i++) CHECK_NEAR(z[i], x[i] / (1 + exp(-(double)x[i])), 1e-6 * (1 + fabs(x[i])));
  memcpy(z, x, sizeof(float) * n);
  op_gelu_tanh(z, n);
  for (int i = 0; i < n; i++) {
    double v = x[i], want = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    CHECK_NEAR(z[i], want, 1e-6 * (1 + fabs(want)));
  }
  memcpy(z, x, sizeof(float) * n);
  op_gelu(z, n);
  for (int i = 0; i < n; i++) CHECK_NEAR(z[i], 0.5 * x[i] * (1 + erf(x[i] / sqrt(2.0))), 1e-6 * (1 + fabs(x[i])));
  memcpy(z, x, sizeof(float) * n);
  op_relu(z, n);
  for (int i = 0; i < n; i++) CHECK(z[i] == (x[i] > 0 ? x[i] : 0));
  memcpy(z, x, sizeof(float) * n);
  op_softcap(z, n, 3.0f);
  for (int i = 0; i < n; i++) CHECK_NEAR(z[i], 3.0 * tanh(x[i] / 3.0), 1e-6);
  op_mul(z, x, y, n);
  for (int i = 0; i < n; i++) CHECK(z[i] == x[i] * y[i]);
  op_add(z, x, y, n);
  for (int i = 0; i < n; i++) CHECK(z[i] == x[i] + y[i]);
  memcpy(z, x, sizeof(float) * n);
  op_scale(z, n, 0.5f);
  for (int i = 0; i < n; i++) CHECK(z[i] == x[i] * 0.5f);
  /* softmax rows sum to 1 and match exp/sum; large values do not overflow */
  memcpy(z, x, sizeof(float) * n);
  z[3] = 1000.0f;
  op_softmax(z, 1, n);
  double sum = 0;
  for (int i = 0; i < n; i++) sum += z[i];
  CHECK_NEAR(sum, 1.0, 1e-5);
  CHECK_NEAR(z[3], 1.0, 1e-6);
  memcpy(z, x, sizeof(float) * n);
  op_softmax(z, 1, 16);
  double den = 0;
  for (int i = 0; i < 16; i++) den += exp((double)x[i]);
  for (int i = 0; i < 16; i++) CHECK_NEAR(z[i], exp((double)x[i]) / den, 1e-6);
  bk_free(x), bk_free(y), bk_free(z);
}

/* Naive attention of one query against rows [lo, hi) of contiguous K/V. */
static void naive_attention(double *out, const float *q, const float *k, const float *v, int64_t qrow, int64_t lo,
                            int64_t kv_dim, int64_t hd, int64_t kvh, double scale, double cap, int64_t window) {
  double s[256], m = -INFINITY, sum = 0;
  int64_t first = lo;
  if (window > 0 && qrow - window + 1 > first) first = qrow - window + 1;
  for (int64_t r = first; r <= qrow; r++) {
    double d = 0;
    for (int64_t i = 0; i < hd; i++) d += (double)q[i] * k[r * kv_dim + kvh * hd + i];
    d *= scale;
    if (cap > 0) d = cap * tanh(d / cap);
    s[r] = d;
    if (d > m) m = d;
  }
  for (int64_t r = first; r <= qrow; r++) sum += (s[r] = exp(s[r] - m));
  for (int64_t i = 0; i < hd; i++) out[i] = 0;
  for (int64_t r = first; r <= qrow; r++)
    for (int64_t i = 0; i < hd; i++) out[i] += s[r] / sum * v[r * kv_dim + kvh * hd + i];
}

static void test_attention(void) {
  hpool *pool = hpool_create(2);
  const int64_t H = 4, KVH = 2, hd = 8, kv_dim = KVH * hd, rows = 30;
  float *k = rand_buf((size_t)(rows * kv_dim)), *v = rand_buf((size_t)(rows * kv_dim));
  /* the same rows split into blocks of 7, as a paged cache would hold them */
  const int64_t br = 7, nb = (rows + br - 1) / br;
  float *kb[8], *vb[8];
  for (int64_t b = 0; b < nb; b++) {
    kb[b] = bk_alloc((size_t)(br * kv_dim));
    vb[b] = bk_alloc((size_t)(br * kv_dim));
    int64_t cnt = rows - b * br < br ? rows - b * br : br;
    memcpy(kb[b], k + b * br * kv_dim, sizeof(float) * (size_t)(cnt * kv_dim));
    memcpy(vb[b], v + b * br * kv_dim, sizeof(float) * (size_t)(cnt * kv_dim));
  }
  const int64_t n = 5;
  int64_t qrow[5] = {0, 3, 11, 28, 29};
  float *q = rand_buf((size_t)(n * H * hd)), *out = bk_alloc((size_t)(n * H * hd));
  struct { int64_t window; float cap; int64_t lo; int blocks; } cases[] = {
      {0, 0, 0, 0}, {6, 0, 0, 0}, {0, 2.0f, 0, 1}, {4, 1.5f, 0, 1}, {0, 0, 9, 1}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const float *kp = k, *vp = v;
    kv_view view = {&kp, &vp, rows, kv_dim, cases[ci].lo, rows, BK_KV_F32, BK_KV_F32, 0, NULL};
    if (cases[ci].blocks) view = (kv_view){(const float *const *)kb, (const float *const *)vb, br, kv_dim, cases[ci].lo, rows, BK_KV_F32, BK_KV_F32, 0, NULL};
    attn_params p = {H, KVH, hd, 0.35f, cases[ci].cap, cases[ci].window};
    op_attention(pool, out, q, n, qrow, &view, &p);
    double worst = 0;
    for (int64_t i = 0; i < n; i++)
      for (int64_t h = 0; h < H; h++) {
        double want[8];
        if (qrow[i] < cases[ci].lo) continue;
        naive_attention(want, q + (i * H + h) * hd, k, v, qrow[i], cases[ci].lo, kv_dim, hd, h / (H / KVH), 0.35,
                        cases[ci].cap, cases[ci].window);
        for (int64_t d = 0; d < hd; d++) {
          double e = rel_err(out[(i * H + h) * hd + d], want[d]);
          if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
        }
      }
    CHECK_MSG(worst < 1e-5, "attention case %zu: rel err %g", ci, worst);
  }
  for (int64_t b = 0; b < nb; b++) bk_free(kb[b]), bk_free(vb[b]);
  bk_free(k), bk_free(v), bk_free(q), bk_free(out);
  hpool_destroy(pool);
}

/* The blocked kernels (every level this CPU has) against the plain
 * reference, on shapes that cross their 16-lane blocks and 64-row tiles:
 * GQA groups of 1..8, head sizes 8..128, prompts, decode steps, scattered
 * positions, windows, soft-capping, a raised lo and a paged layout. */
static void test_attention_fast(void) {
  hpool *pool = hpool_create(3);
  struct { int64_t H, KVH, hd, rows, n, window, lo; float cap; int scattered, paged; } cases[] = {
      {8, 2, 64, 150, 37, 0, 0, 0, 0, 0},  {8, 2, 64, 150, 1, 0, 0, 0, 0, 1},   {4, 4, 16, 70, 70, 0, 0, 0, 0, 0},
      {6, 1, 24, 90, 5, 0, 0, 0, 1, 1},    {32, 8, 8, 130, 9, 20, 0, 0, 0, 0},  {2, 1, 128, 65, 65, 0, 0, 30.0f, 0, 1},
      {16, 2, 32, 100, 17, 7, 40, 0, 1, 0}, {4, 2, 64, 3, 3, 0, 0, 0, 0, 0},    {20, 1, 16, 33, 2, 0, 0, 0, 0, 1},
  };
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    int64_t H = cases[ci].H, KVH = cases[ci].KVH, hd = cases[ci].hd, rows = cases[ci].rows, n = cases[ci].n,
            kv_dim = KVH * hd;
    float *k = rand_buf((size_t)(rows * kv_dim)), *v = rand_buf((size_t)(rows * kv_dim));
    float *q = rand_buf((size_t)(n * H * hd)), *want = bk_alloc((size_t)(n * H * hd)), *got = bk_alloc((size_t)(n * H * hd));
    for (int64_t i = 0; i < n * H * hd; i++) q[i] *= 3; /* peaked softmaxes too */
    int64_t qrow[128];
    for (int64_t i = 0; i < n; i++) qrow[i] = cases[ci].scattered ? (i * 37 + 11) % rows : rows - n + i;
    const int64_t br = 16, nb = (rows + br - 1) / br;
    float **kb = malloc(sizeof(float *) * (size_t)nb), **vb = malloc(sizeof(float *) * (size_t)nb);
    for (int64_t b = 0; b < nb; b++) {
      kb[b] = bk_alloc((size_t)(br * kv_dim));
      vb[b] = bk_alloc((size_t)(br * kv_dim));
      int64_t cnt = rows - b * br < br ? rows - b * br : br;
      memcpy(kb[b], k + b * br * kv_dim, sizeof(float) * (size_t)(cnt * kv_dim));
      memcpy(vb[b], v + b * br * kv_dim, sizeof(float) * (size_t)(cnt * kv_dim));
    }
    const float *kp = k, *vp = v;
    kv_view view = {&kp, &vp, rows, kv_dim, cases[ci].lo, rows, BK_KV_F32, BK_KV_F32, 0, NULL};
    if (cases[ci].paged) view = (kv_view){(const float *const *)kb, (const float *const *)vb, br, kv_dim, cases[ci].lo, rows, BK_KV_F32, BK_KV_F32, 0, NULL};
    attn_params p = {H, KVH, hd, 1.0f / sqrtf((float)hd), cases[ci].cap, cases[ci].window};
    op_attention_ref(pool, want, q, n, qrow, &view, &p);
    for (int l = BK_CPU_SCALAR; l <= (int)bk_cpu_best(); l++) {
      bk_cpu_set_level((bk_cpu_level)l);
      for (int64_t i = 0; i < n * H * hd; i++) got[i] = NAN;
      op_attention(l == 1 ? NULL : pool, got, q, n, qrow, &view, &p);
      double worst = 0;
      for (int64_t i = 0; i < n * H * hd; i++) {
        double e = fabs((double)got[i] - want[i]); /* values are convex mixes of V rows in [-1, 1] */
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
      }
      CHECK_MSG(worst < 1e-5, "attention case %zu at level %s: abs err %g", ci, bk_cpu_level_name((bk_cpu_level)l), worst);
    }
    bk_cpu_set_level(bk_cpu_best());
    for (int64_t b = 0; b < nb; b++) bk_free(kb[b]), bk_free(vb[b]);
    free(kb), free(vb);
    bk_free(k), bk_free(v), bk_free(q), bk_free(want), bk_free(got);
  }
  hpool_destroy(pool);
}

/* op_attention_seqs: a step's sequences (decode queries, a prompt's chunk, one without queries)
 * in one dispatch give each exactly what op_attention gives it alone, at every level. */
static void test_attention_seqs(void) {
  hpool *pool = hpool_create(3);
  const int64_t H = 8, KVH = 2, hd = 64, kv_dim = KVH * hd, rows = 90;
  struct { int64_t n, len; } spec[] = {{1, 40}, {1, 90}, {0, 10}, {17, 60}, {1, 1}, {3, 70}};
  const int S = (int)(sizeof spec / sizeof spec[0]);
  float *k[6], *v[6], *q[6], *alone[6], *together[6];
  int64_t qrow[6][32];
  attn_seq seqs[6];
  attn_params p = {H, KVH, hd, 0.125f, 0, 0};
  for (int i = 0; i < S; i++) {
    k[i] = rand_buf((size_t)(rows * kv_dim)), v[i] = rand_buf((size_t)(rows * kv_dim));
    size_t nq = (size_t)(spec[i].n ? spec[i].n : 1) * (size_t)(H * hd);
    q[i] = rand_buf(nq), alone[i] = bk_alloc(nq), together[i] = bk_alloc(nq);
    for (int64_t t = 0; t < spec[i].n; t++) qrow[i][t] = spec[i].len - spec[i].n + t;
    seqs[i] = (attn_seq){.out = together[i], .q = q[i], .n = spec[i].n, .q_row = qrow[i],
                         .kv = {(const float *const *)&k[i], (const float *const *)&v[i], rows, kv_dim, 0, spec[i].len,
                                BK_KV_F32, BK_KV_F32, 0, NULL}};
  }
  for (int l = BK_CPU_SCALAR; l <= (int)bk_cpu_best(); l++) {
    bk_cpu_set_level((bk_cpu_level)l);
    for (int i = 0; i < S; i++)
      if (spec[i].n) op_attention(pool, alone[i], q[i], spec[i].n, qrow[i], &seqs[i].kv, &p);
    op_attention_seqs(pool, seqs, S, &p);
    for (int i = 0; i < S; i++)
      CHECK_MSG(!spec[i].n || !memcmp(alone[i], together[i], sizeof(float) * (size_t)(spec[i].n * H * hd)),
                "sequence %d at level %s differs", i, bk_cpu_level_name((bk_cpu_level)l));
  }
  bk_cpu_set_level(bk_cpu_best());
  for (int i = 0; i < S; i++) bk_free(k[i]), bk_free(v[i]), bk_free(q[i]), bk_free(alone[i]), bk_free(together[i]);
  hpool_destroy(pool);
}

static void test_conversions(void) {
  uint16_t bf[4] = {0x3f80, 0xc000, 0x0000, 0x3e00}; /* 1, -2, 0, 0.125 */
  float f[4];
  bk_bf16_to_f32(f, bf, 4);
  CHECK(f[0] == 1.0f && f[1] == -2.0f && f[2] == 0.0f && f[3] == 0.125f);
  uint16_t h[5] = {0x3c00, 0xc000, 0x0001, 0x7bff, 0x3555}; /* 1, -2, 2^-24, 65504, ~0.33325 */
  float g[5];
  bk_f16_to_f32(g, h, 5);
  CHECK(g[0] == 1.0f && g[1] == -2.0f && g[2] == ldexpf(1, -24) && g[3] == 65504.0f);
  CHECK_NEAR(g[4], 0.333251953125, 0);
  CHECK(bk_round_bf16(1.00390625f) == 1.0f);        /* halfway: to even */
  CHECK(bk_round_bf16(1.01171875f) == 1.015625f);   /* halfway: to even (up) */
  CHECK(bk_round_bf16(3.0f) == 3.0f);
  CHECK(bk_round_f16(1.0f + 1.0f / 4096) == 1.0f);
  CHECK(bk_round_f16(0.1f) == 0.0999755859375f);
  CHECK(bk_round_f16(1e6f) == INFINITY);
}

/* The KV row formats against their definition (ops.h): per block of 32 the
 * scale is max|x| / qmax, every element comes back within half a step of
 * itself, the element of largest magnitude exactly (up to the scale's
 * rounding), zeros stay zero, a row's padding is harmless, and any range of
 * elements dequantizes as the whole row does. */
static void test_kv_quant(void) {
  static const int64_t dims[] = {16, 32, 48, 64, 80, 128, 256, 1000};
  static const bk_kv_fmt fmts[] = {BK_KV_Q8, BK_KV_Q4};
  for (size_t fi = 0; fi < 2; fi++)
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
      bk_kv_fmt f = fmts[fi];
      int64_t D = dims[di];
      const double qmax = f == BK_KV_Q8 ? 127 : 7;
      CHECK(bk_kv_row_bytes(f, D) % 4 == 0);
      CHECK(bk_kv_row_bytes(f, D) == (size_t)((D + 31) / 32) * (f == BK_KV_Q8 ? 36 : 20));
      float *x = rand_buf((size_t)D), *y = rand_buf((size_t)D), *z = rand_buf((size_t)D);
      for (int64_t i = 0; i < D && i < 32; i++) x[i] = 0; /* a block of zeros */
      if (D > 40) x[40] = 1e3f;                            /* an outlier: its block's scale */
      void *row = malloc(bk_kv_row_bytes(f, D));
      op_kv_quantize_row(f, row, x, D);
      op_kv_dequantize(f, y, row, 0, D);
      for (int64_t b0 = 0; b0 < D; b0 += 32) {
        double amax = 0;
        for (int64_t i = b0; i < D && i < b0 + 32; i++) amax = fmax(amax, fabs(x[i]));
        double step = amax / qmax;
        for (int64_t i = b0; i < D && i < b0 + 32; i++) {
          CHECK_MSG(fabs((double)y[i] - x[i]) <= 0.5 * step * (1 + 1e-6) + 1e-30, "%s dim %lld elem %lld: %g for %g (step %g)",
                    bk_kv_fmt_name(f), (long long)D, (long long)i, (double)y[i], (double)x[i], step);
          if (amax == 0) CHECK(y[i] == 0);
          if (fabs(x[i]) == amax) CHECK_NEAR(fabs(y[i]), amax, 1e-6 * amax);
        }
      }
      for (int64_t i0 = 0; i0 < D; i0 += 7) { /* ranges that start and end inside blocks */
        int64_t n = D - i0 < 19 ? D - i0 : 19;
        op_kv_dequantize(f, z, row, i0, n);
        for (int64_t i = 0; i < n; i++) CHECK(z[i] == y[i0 + i]);
      }
      free(row), bk_free(x), bk_free(y), bk_free(z);
    }
  /* f32 rows are the floats themselves */
  float a[5] = {1, -2, 3.5f, 0, 1e-30f}, b[5];
  float stored[5];
  op_kv_quantize_row(BK_KV_F32, stored, a, 5);
  op_kv_dequantize(BK_KV_F32, b, stored, 0, 5);
  for (int i = 0; i < 5; i++) CHECK(b[i] == a[i]);
}

/* FP8 KV rows (ops.h): per block of 32 a stored scale of max|x| / 448,
 * every element the scale times an E4M3 value (bk_fp8_decode of its byte),
 * within half an E4M3 step of x: 2^-4 of |x| where x / scale is a normal
 * E4M3 number, 2^-10 of the scale below 2^-6; the largest element comes back
 * as 448 * scale; signs kept; zeros and padding stay zero (also in a block of
 * values so small that the scale is a subnormal float); ranges as the whole row. */
static void test_kv_fp8(void) {
  static const int64_t dims[] = {16, 32, 48, 64, 80, 128, 256, 1000};
  for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
    int64_t D = dims[di], nb = (D + 31) / 32;
    CHECK(bk_kv_row_bytes(BK_KV_FP8, D) == (size_t)nb * 36);
    float *x = rand_buf((size_t)D), *y = rand_buf((size_t)D), *z = rand_buf((size_t)D);
    for (int64_t i = 0; i < D && i < 32; i++) x[i] = 0; /* a block of zeros */
    if (D > 40) x[40] = 1e3f, x[41] = -1e-3f;            /* an outlier and a value far below it */
    if (D > 96)
      for (int64_t i = 64; i < 96; i++) x[i] = (i % 3 - 1) * 1e-38f; /* the scale a subnormal float */
    uint8_t *row = malloc(bk_kv_row_bytes(BK_KV_FP8, D));
    op_kv_quantize_row(BK_KV_FP8, row, x, D);
    op_kv_dequantize(BK_KV_FP8, y, row, 0, D);
    for (int64_t b = 0; b < nb; b++) {
      const uint8_t *blk = row + b * 36;
      float d;
      memcpy(&d, blk, 4);
      float amax = 0;
      for (int64_t i = b * 32; i < D && i < b * 32 + 32; i++) amax = fmaxf(amax, fabsf(x[i]));
      CHECK(d == amax / 448.0f);
      for (int r = 0; r < 32; r++) {
        int64_t i = b * 32 + r;
        if (i >= D) { /* padding */
          CHECK(blk[4 + r] == 0);
          continue;
        }
        CHECK(memcmp(&y[i], &(float){d * bk_fp8_decode(blk[4 + r])}, 4) == 0);
        CHECK(!isnan(y[i]));
        double ax = fabs((double)x[i]), tol = ax / d >= 0.015625 ? ax / 16 : (double)d / 1024;
        CHECK_MSG(fabs((double)y[i] - x[i]) <= tol * (1 + 1e-6) + 1e-30, "fp8 dim %lld elem %lld: %g for %g (scale %g)",
                  (long long)D, (long long)i, (double)y[i], (double)x[i], (double)d);
        if (x[i] == 0) CHECK(y[i] == 0);
        if (y[i] != 0) CHECK(signbit(y[i]) == signbit(x[i]));
        if (fabsf(x[i]) == amax && amax > 0) CHECK((blk[4 + r] & 0x7f) == 0x7e); /* ±448 */
      }
    }
    for (int64_t i0 = 0; i0 < D; i0 += 7) {
      int64_t n = D - i0 < 19 ? D - i0 : 19;
      op_kv_dequantize(BK_KV_FP8, z, row, i0, n);
      for (int64_t i = 0; i < n; i++) CHECK(z[i] == y[i0 + i]);
    }
    free(row), bk_free(x), bk_free(y), bk_free(z);
  }
  CHECK(!strcmp(bk_kv_fmt_name(BK_KV_FP8), "fp8"));
}

/* The recurrent ops' per-position states (keep): a run of n tokens per
 * sequence, with keep, must leave in row keep[t] the state the op reaches
 * when fed the same tokens one at a time up to token t; the slot's own
 * state and the outputs must be those of a run without keep. */
static void test_rec_keep(void) {
  hpool *pool = hpool_create(2);
  enum { NS = 2, LEN0 = 5, LEN1 = 3, T = LEN0 + LEN1, SLOTS = 2 + T };
  const rec_seq seqs[NS] = {{0, LEN0, 1, 0}, {LEN0, LEN1, 0, 1}};
  int32_t keep[T]; /* sequence 0 keeps its states in rows 2.., in reverse order; sequence 1 in rows 7.. */
  for (int i = 0; i < LEN0; i++) keep[i] = 2 + LEN0 - 1 - i;
  for (int i = 0; i < LEN1; i++) keep[LEN0 + i] = 2 + LEN0 + i;
  /* conv1d: c channels, k taps */
  {
    int64_t c = 6, k = 4, off = 3, stride = off + (k - 1) * c + 2;
    float *x = rand_buf((size_t)(T * c)), *w = rand_buf((size_t)(c * k)), *st0 = rand_buf((size_t)(SLOTS * stride));
    float *st = bk_alloc((size_t)(SLOTS * stride)), *plain = bk_alloc((size_t)(SLOTS * stride));
    float *y = bk_alloc((size_t)(T * c)), *yp = bk_alloc((size_t)(T * c));
    memcpy(st, st0, sizeof(float) * (size_t)(SLOTS * stride));
    memcpy(plain, st0, sizeof(float) * (size_t)(SLOTS * stride));
    op_conv1d_state(y, x, c, w, k, st, stride, off, seqs, NS, keep, true);
    op_conv1d_state(yp, x, c, w, k, plain, stride, off, seqs, NS, NULL, true);
    CHECK(memcmp(y, yp, sizeof(float) * (size_t)(T * c)) == 0);
    for (int s = 0; s < NS; s++) {
      CHECK(memcmp(st + seqs[s].slot * stride, plain + seqs[s].slot * stride, sizeof(float) * (size_t)stride) == 0);
      float *one = bk_alloc((size_t)(SLOTS * stride)), *y1 = bk_alloc((size_t)(T * c));
      memcpy(one, st0, sizeof(float) * (size_t)(SLOTS * stride));
      for (int i = 0; i < seqs[s].n; i++) {
        rec_seq q = {seqs[s].t0 + i, 1, seqs[s].slot, seqs[s].fresh && i == 0};
        op_conv1d_state(y1, x, c, w, k, one, stride, off, &q, 1, NULL, true);
        CHECK_MSG(memcmp(st + keep[seqs[s].t0 + i] * stride + off, one + seqs[s].slot * stride + off,
                         sizeof(float) * (size_t)((k - 1) * c)) == 0,
                  "conv1d keep: sequence %d position %d", s, i);
      }
      bk_free(one), bk_free(y1);
    }
    bk_free(x), bk_free(w), bk_free(st0), bk_free(st), bk_free(plain), bk_free(y), bk_free(yp);
  }
  /* the gated delta rule (chunked form) against the reference one token at a time */
  {
    delta_params p = {2, 4, 16, 8};
    int64_t nv = p.n_v_heads, W = 2 * p.n_k_heads * p.dk + nv * p.dv, off = 5, width = nv * p.dk * p.dv;
    int64_t stride = off + width + 1;
    float *qkv = rand_buf((size_t)(T * W)), *a = rand_buf((size_t)(T * nv)), *b = rand_buf((size_t)(T * nv));
    float *a_log = rand_buf((size_t)nv), *dtb = rand_buf((size_t)nv), *st0 = bk_alloc((size_t)(SLOTS * stride));
    for (int64_t i = 0; i < SLOTS * stride; i++) st0[i] = 0.2f * nrand();
    float *st = bk_alloc((size_t)(SLOTS * stride)), *plain = bk_alloc((size_t)(SLOTS * stride));
    float *o = bk_alloc((size_t)(T * nv * p.dv)), *op = bk_alloc((size_t)(T * nv * p.dv));
    memcpy(st, st0, sizeof(float) * (size_t)(SLOTS * stride));
    memcpy(plain, st0, sizeof(float) * (size_t)(SLOTS * stride));
    op_delta_rule_chunked(pool, o, qkv, a, b, a_log, dtb, st, stride, off, seqs, NS, keep, &p, 64);
    op_delta_rule_chunked(pool, op, qkv, a, b, a_log, dtb, plain, stride, off, seqs, NS, NULL, &p, 64);
    double worst = 0;
    for (int64_t i = 0; i < T * nv * p.dv; i++) {
      double e = rel_err(o[i], op[i]);
      if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
    for (int s = 0; s < NS; s++)
      for (int64_t i = 0; i < width; i++) {
        double e = rel_err(st[seqs[s].slot * stride + off + i], plain[seqs[s].slot * stride + off + i]);
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
      }
    CHECK_MSG(worst < 1e-4, "delta rule keep: outputs / final state off by %g", worst);
    for (int s = 0; s < NS; s++) {
      float *one = bk_alloc((size_t)(SLOTS * stride)), *o1 = bk_alloc((size_t)(T * nv * p.dv));
      memcpy(one, st0, sizeof(float) * (size_t)(SLOTS * stride));
      for (int i = 0; i < seqs[s].n; i++) {
        rec_seq q = {seqs[s].t0 + i, 1, seqs[s].slot, seqs[s].fresh && i == 0};
        op_delta_rule_ref(o1, qkv, a, b, a_log, dtb, one, stride, off, &q, 1, &p);
        worst = 0;
        for (int64_t e = 0; e < width; e++) {
          double d = rel_err(st[keep[seqs[s].t0 + i] * stride + off + e], one[seqs[s].slot * stride + off + e]);
          if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
        }
        CHECK_MSG(worst < 1e-4, "delta rule keep: sequence %d position %d off by %g", s, i, worst);
      }
      bk_free(one), bk_free(o1);
    }
    bk_free(qkv), bk_free(a), bk_free(b), bk_free(a_log), bk_free(dtb), bk_free(st0), bk_free(st), bk_free(plain);
    bk_free(o), bk_free(op);
  }
  hpool_destroy(pool);
}

int main(void) {
  RUN(test_matmul);
  RUN(test_matmul_fast_vs_ref);
  RUN(test_rmsnorm);
  RUN(test_rope);
  RUN(test_elementwise);
  RUN(test_attention);
  RUN(test_attention_fast);
  RUN(test_attention_seqs);
  RUN(test_conversions);
  RUN(test_kv_quant);
  RUN(test_kv_fp8);
  RUN(test_rec_keep);
  TEST_MAIN_END();
}
