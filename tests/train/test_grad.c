/* test_grad.c — the backward passes of src/train/grad.h against central
 * finite differences of the same forward written here in double, on small
 * random inputs: RMSNorm (plain and 1 + w), RoPE (rotate-half, interleaved,
 * partial, scaled), causal attention (GQA, sliding window, softcap), the
 * SiLU-gated product, a frozen matmul's input gradient in every stored weight
 * format, LoRA's A / B / input gradients and the chunked, masked
 * cross-entropy. The f32 forwards of backend/ops.h are checked against the
 * double ones first, so the gradients are those of the ops the model runs.
 * The loss of each check is L = Σ c ⊙ y with c random (dy = c). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#include "backend/formats.h"
#include "backend/ops.h"
#include "test.h"
#include "train/grad.h"
#include "weight_formats.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double urand(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}
static void fill(double *d, float *f, int64_t n, double scale) {
  for (int64_t i = 0; i < n; i++) {
    f[i] = (float)(urand() * scale);
    if (d) d[i] = f[i];
  }
}

/* A loss of double arrays: the checks perturb one element of an array and call it. */
typedef double (*loss_fn)(void *ctx);

/* The largest relative error of g[0..n) against the central differences of f in x[0..n) (double). */
static double fd_check(loss_fn f, void *ctx, double *x, const float *g, int64_t n, const char *what) {
  double worst = 0, scale = 1e-3;
  for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(g[i]));
  for (int64_t i = 0; i < n; i++) {
    double keep = x[i], h = 1e-6 * fmax(1.0, fabs(keep));
    x[i] = keep + h;
    double lp = f(ctx);
    x[i] = keep - h;
    double lm = f(ctx);
    x[i] = keep;
    double fd = (lp - lm) / (2 * h), e = fabs(fd - g[i]) / scale;
    if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
  }
  CHECK_MSG(worst < 2e-4, "%s: relative error %.3g against finite differences", what, worst);
  return worst;
}

/* ---- RMSNorm ---- */

typedef struct norm_ctx {
  int64_t n, d;
  double *x, *w, *c;
  float eps;
  bool unit;
} norm_ctx;

static double norm_loss(void *p) {
  norm_ctx *k = p;
  double L = 0;
  for (int64_t i = 0; i < k->n; i++) {
    double ss = 0;
    for (int64_t j = 0; j < k->d; j++) ss += k->x[i * k->d + j] * k->x[i * k->d + j];
    double r = 1 / sqrt(ss / k->d + k->eps);
    for (int64_t j = 0; j < k->d; j++)
      L += k->c[i * k->d + j] * k->x[i * k->d + j] * r * (k->unit ? 1 + k->w[j] : k->w[j]);
  }
  return L;
}

static void test_rmsnorm(void) {
  for (int unit = 0; unit < 2; unit++) {
    enum { N = 3, D = 24 };
    double x[N * D], w[D], c[N * D];
    float xf[N * D], wf[D], cf[N * D], y[N * D], dx[N * D], dw[D] = {0};
    fill(x, xf, N * D, 2), fill(w, wf, D, 1), fill(c, cf, N * D, 1);
    norm_ctx k = {N, D, x, w, c, 1e-5f, unit};
    op_rmsnorm(y, xf, N, D, wf, k.eps, unit);
    double L = 0;
    for (int i = 0; i < N * D; i++) L += c[i] * y[i];
    CHECK_NEAR(L, norm_loss(&k), 1e-4);
    grad_rmsnorm(dx, dw, cf, xf, N, D, wf, k.eps, unit);
    fd_check(norm_loss, &k, x, dx, N * D, unit ? "rmsnorm (1 + w) dx" : "rmsnorm dx");
    fd_check(norm_loss, &k, w, dw, D, unit ? "rmsnorm (1 + w) dw" : "rmsnorm dw");
  }
}

/* ---- RoPE ---- */

typedef struct rope_ctx {
  int64_t n, H, hd;
  double *x, *c;
  const int64_t *pos;
  const rope_table *t;
} rope_ctx;

static double rope_loss(void *p) {
  rope_ctx *k = p;
  int64_t half = k->t->rot_dim / 2;
  double L = 0;
  for (int64_t r = 0; r < k->n; r++)
    for (int64_t h = 0; h < k->H; h++) {
      const double *v = k->x + (r * k->H + h) * k->hd;
      const double *c = k->c + (r * k->H + h) * k->hd;
      for (int64_t d = 0; d < k->hd; d++) {
        bool rot = k->t->interleaved ? d < 2 * half : (d < half || (d >= half && d < 2 * half));
        if (!rot) L += c[d] * v[d];
      }
      for (int64_t i = 0; i < half; i++) {
        double a = (double)k->pos[r] * k->t->inv_freq[i], cs = cos(a) * k->t->attn_scale, sn = sin(a) * k->t->attn_scale;
        int64_t i0 = k->t->interleaved ? 2 * i : i, i1 = k->t->interleaved ? 2 * i + 1 : i + half;
        L += c[i0] * (v[i0] * cs - v[i1] * sn) + c[i1] * (v[i1] * cs + v[i0] * sn);
      }
    }
  return L;
}

static void test_rope(void) {
  enum { N = 4, H = 3, HD = 16 };
  int64_t pos[N] = {0, 5, 17, 300};
  struct {
    int64_t rot;
    bool inter;
    double scale;
  } cases[] = {{16, false, 1.0}, {16, true, 1.0}, {8, false, 1.0}, {16, false, 1.2}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    double inv[8];
    for (int i = 0; i < cases[ci].rot / 2; i++) inv[i] = pow(10000.0, -2.0 * i / (double)cases[ci].rot);
    rope_table t = {.rot_dim = cases[ci].rot, .inv_freq = inv, .attn_scale = cases[ci].scale, .interleaved = cases[ci].inter};
    double x[N * H * HD], c[N * H * HD];
    float xf[N * H * HD], cf[N * H * HD];
    fill(x, xf, N * H * HD, 1), fill(c, cf, N * H * HD, 1);
    rope_ctx k = {N, H, HD, x, c, pos, &t};
    op_rope(xf, N, H, HD, pos, &t);
    double L = 0;
    for (int i = 0; i < N * H * HD; i++) L += c[i] * xf[i];
    CHECK_NEAR(L, rope_loss(&k), 1e-4);
    grad_rope(cf, N, H, HD, pos, &t); /* dx = Rᵀ c */
    fd_check(rope_loss, &k, x, cf, N * H * HD, "rope dx");
  }
}

/* ---- attention ---- */

typedef struct attn_ctx {
  int64_t T;
  double *q, *k, *v, *c;
  const attn_params *p;
} attn_ctx;

static double attn_loss(void *ctx) {
  attn_ctx *a = ctx;
  const attn_params *p = a->p;
  int64_t H = p->n_heads, KVH = p->n_kv_heads, hd = p->head_dim, g = H / KVH;
  double L = 0, s[64];
  for (int64_t i = 0; i < a->T; i++)
    for (int64_t h = 0; h < H; h++) {
      int64_t lo = p->window > 0 && i - p->window + 1 > 0 ? i - p->window + 1 : 0;
      double m = -INFINITY, sum = 0;
      for (int64_t r = lo; r <= i; r++) {
        double d = 0;
        for (int64_t e = 0; e < hd; e++) d += a->q[(i * H + h) * hd + e] * a->k[(r * KVH + h / g) * hd + e];
        d *= p->scale;
        if (p->softcap > 0) d = p->softcap * tanh(d / p->softcap);
        s[r] = d;
        m = fmax(m, d);
      }
      for (int64_t r = lo; r <= i; r++) sum += (s[r] = exp(s[r] - m));
      for (int64_t e = 0; e < hd; e++) {
        double o = 0;
        for (int64_t r = lo; r <= i; r++) o += s[r] / sum * a->v[(r * KVH + h / g) * hd + e];
        L += a->c[(i * H + h) * hd + e] * o;
      }
    }
  return L;
}

static void test_attention(void) {
  enum { T = 7, H = 4, KVH = 2, HD = 8 };
  attn_params cases[] = {
      {H, KVH, HD, 0.35f, 0, 0}, {H, KVH, HD, 0.35f, 0, 3}, {H, KVH, HD, 0.35f, 2.0f, 0}, {H, H, HD, 0.5f, 0, 0}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    attn_params *p = &cases[ci];
    int64_t nq = T * H * HD, nk = T * p->n_kv_heads * HD;
    double q[T * H * HD], k[T * H * HD], v[T * H * HD], c[T * H * HD];
    float qf[T * H * HD], kf[T * H * HD], vf[T * H * HD], cf[T * H * HD], out[T * H * HD];
    float dq[T * H * HD], dk[T * H * HD], dv[T * H * HD];
    fill(q, qf, nq, 1.5), fill(k, kf, nk, 1.5), fill(v, vf, nk, 1), fill(c, cf, nq, 1);
    attn_ctx a = {T, q, k, v, c, p};
    grad_attention_fwd(NULL, out, qf, kf, vf, T, p);
    double L = 0;
    for (int64_t i = 0; i < nq; i++) L += c[i] * out[i];
    CHECK_NEAR(L, attn_loss(&a), 1e-4);
    grad_attention(NULL, dq, dk, dv, cf, qf, kf, vf, T, p);
    char what[64];
    snprintf(what, sizeof what, "attention case %zu dq", ci);
    fd_check(attn_loss, &a, q, dq, nq, what);
    snprintf(what, sizeof what, "attention case %zu dk", ci);
    fd_check(attn_loss, &a, k, dk, nk, what);
    snprintf(what, sizeof what, "attention case %zu dv", ci);
    fd_check(attn_loss, &a, v, dv, nk, what);
  }
}

/* ---- SiLU-gated product ---- */

typedef struct act_ctx {
  int64_t n;
  double *g, *u, *c;
  bool gelu; /* tanh-GELU instead of SiLU */
} act_ctx;

static double act_loss(void *ctx) {
  act_ctx *a = ctx;
  double L = 0;
  for (int64_t i = 0; i < a->n; i++) {
    double x = a->g[i];
    double act = a->gelu ? 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))) : x / (1 + exp(-x));
    L += a->c[i] * act * a->u[i];
  }
  return L;
}

/* h = act(g) · u against finite differences of Σ c · h, act SiLU or tanh-GELU. */
static void check_act_mul(bool gelu) {
  enum { N = 40 };
  double g[N], u[N], c[N];
  float gf[N], uf[N], cf[N], h[N], dg[N], du[N];
  fill(g, gf, N, 5), fill(u, uf, N, 2), fill(c, cf, N, 1);
  memcpy(h, gf, sizeof h);
  if (gelu) op_gelu_tanh(h, N);
  else op_silu(h, N);
  op_mul(h, h, uf, N);
  act_ctx a = {N, g, u, c, gelu};
  double L = 0;
  for (int i = 0; i < N; i++) L += c[i] * h[i];
  CHECK_NEAR(L, act_loss(&a), 1e-4);
  if (gelu) grad_gelu_tanh_mul(dg, du, cf, gf, uf, N);
  else grad_silu_mul(dg, du, cf, gf, uf, N);
  fd_check(act_loss, &a, g, dg, N, gelu ? "gelu_tanh_mul dg" : "silu_mul dg");
  fd_check(act_loss, &a, u, du, N, gelu ? "gelu_tanh_mul du" : "silu_mul du");
}

static void test_silu_mul(void) { check_act_mul(false); }
static void test_gelu_tanh_mul(void) { check_act_mul(true); }

/* ---- frozen matmul, every stored format ---- */

typedef struct mm_ctx {
  int64_t n, in, out;
  double *x, *c;
  const float *w; /* dequantized */
} mm_ctx;

static double mm_loss(void *ctx) {
  mm_ctx *m = ctx;
  double L = 0;
  for (int64_t i = 0; i < m->n; i++)
    for (int64_t o = 0; o < m->out; o++) {
      double y = 0;
      for (int64_t k = 0; k < m->in; k++) y += m->x[i * m->in + k] * m->w[o * m->in + k];
      L += m->c[i * m->out + o] * y;
    }
  return L;
}

static void test_matmul(void) {
  enum { N = 3, IN = 256, OUT = 6 };
  for (int fi = 0; fi < N_FORMATS; fi++) {
    const fmt *f = &formats[fi];
    float src[OUT * IN], deq[OUT * IN];
    fill(NULL, src, OUT * IN, 1);
    bk_weight w = {.type = f->type, .rows = OUT, .cols = IN};
    void *data = NULL, *scales = NULL, *biases = NULL;
    int rc;
    if (f->type == BK_MLX_AFFINE) {
      data = malloc(OUT * IN * f->bits / 8), scales = malloc(4 * OUT * IN / f->group_size), biases = malloc(4 * OUT * IN / f->group_size);
      rc = bk_quantize_mlx(src, OUT, IN, f->bits, f->group_size, f->scale_type, data, scales, biases, NULL);
      w.bits = f->bits, w.group_size = f->group_size, w.scale_type = f->scale_type, w.scales = scales, w.biases = biases;
    } else if (f->type == BK_FP8) {
      data = malloc(OUT * IN), scales = malloc(4 * OUT);
      rc = bk_quantize_fp8(src, OUT, IN, data, scales, NULL);
      w.scale_type = BK_F32, w.scales = scales;
    } else {
      data = malloc(bk_row_bytes(f->type, IN, 0) * OUT);
      rc = bk_quantize(f->type, src, OUT, IN, data, NULL);
    }
    w.data = data;
    for (int r = 0; r < OUT && !rc; r++) rc = bk_dequant_row(&w, r, deq + r * IN, NULL);
    CHECK_EQ_INT(rc, 0);
    double x[N * IN], c[N * OUT];
    float xf[N * IN], cf[N * OUT], dx[N * IN], dx2[N * IN];
    fill(x, xf, N * IN, 1), fill(c, cf, N * OUT, 1);
    mm_ctx m = {N, IN, OUT, x, c, deq};
    herr err = {0};
    CHECK_EQ_INT(grad_matmul_dx_ref(dx, cf, N, &w, &err), 0);
    char what[64];
    snprintf(what, sizeof what, "matmul dx (%s)", bk_type_name(f->type));
    fd_check(mm_loss, &m, x, dx, N * IN, what);
    bk_weight wt;
    float *wtd = NULL;
    CHECK_EQ_INT(grad_weight_t(&w, &wt, &wtd, &err), 0);
    CHECK_EQ_INT(bk_matmul(NULL, dx2, cf, N, &wt, NULL, &err), 0);
    double worst = 0;
    for (int i = 0; i < N * IN; i++) worst = fmax(worst, fabs(dx[i] - dx2[i]));
    CHECK_MSG(worst < 1e-4, "%s: the transposed path differs from the reference by %.3g", what, worst);
    free(wtd);
    free(data), free(scales), free(biases);
  }
}

/* ---- LoRA ---- */

typedef struct lora_ctx {
  int64_t n, in, r, out;
  double *x, *a, *b, *c, s;
} lora_ctx;

static double lora_loss(void *ctx) {
  lora_ctx *l = ctx;
  double L = 0;
  for (int64_t i = 0; i < l->n; i++)
    for (int64_t o = 0; o < l->out; o++) {
      double y = 0;
      for (int64_t j = 0; j < l->r; j++) {
        double t = 0;
        for (int64_t k = 0; k < l->in; k++) t += l->x[i * l->in + k] * l->a[j * l->in + k];
        y += t * l->b[o * l->r + j];
      }
      L += l->c[i * l->out + o] * l->s * y;
    }
  return L;
}

static void test_lora(void) {
  enum { N = 4, IN = 12, R = 3, OUT = 10 };
  double x[N * IN], a[R * IN], b[OUT * R], c[N * OUT];
  float xf[N * IN], af[R * IN], bf[OUT * R], cf[N * OUT], y[N * OUT] = {0}, t[N * R];
  float dx[N * IN] = {0}, da[R * IN] = {0}, db[OUT * R] = {0};
  fill(x, xf, N * IN, 1), fill(a, af, R * IN, 1), fill(b, bf, OUT * R, 1), fill(c, cf, N * OUT, 1);
  lora_ctx l = {N, IN, R, OUT, x, a, b, c, 2.5};
  grad_lora_fwd(y, t, xf, N, IN, af, R, bf, OUT, 2.5f);
  float y2[N * OUT] = {0}, tmp[R];
  op_lora(y2, xf, N, IN, af, R, bf, OUT, 2.5f, tmp);
  double L = 0, worst = 0;
  for (int i = 0; i < N * OUT; i++) L += c[i] * y[i], worst = fmax(worst, fabs(y[i] - y2[i]));
  CHECK_MSG(worst < 1e-5, "lora forward differs from op_lora by %.3g", worst);
  CHECK_NEAR(L, lora_loss(&l), 1e-4);
  grad_lora(dx, da, db, cf, xf, t, N, IN, af, R, bf, OUT, 2.5f);
  fd_check(lora_loss, &l, x, dx, N * IN, "lora dx");
  fd_check(lora_loss, &l, a, da, R * IN, "lora dA");
  fd_check(lora_loss, &l, b, db, OUT * R, "lora dB");
  /* accumulation: a second backward doubles the parameter gradients */
  float da1 = da[5], db1 = db[7];
  grad_lora(NULL, da, db, cf, xf, t, N, IN, af, R, bf, OUT, 2.5f);
  CHECK_NEAR(da[5], 2 * da1, 1e-5 * (1 + fabs(da1)));
  CHECK_NEAR(db[7], 2 * db1, 1e-5 * (1 + fabs(db1)));
}

/* ---- cross-entropy ---- */

typedef struct ce_ctx {
  int64_t n, D, V;
  double *h;
  const float *w;
  const int32_t *tg;
  double scale;
  double cap; /* > 0: the logits soft-capped */
} ce_ctx;

static double ce_loss(void *ctx) {
  ce_ctx *e = ctx;
  double L = 0, *l = malloc(sizeof(double) * e->V);
  for (int64_t i = 0; i < e->n; i++) {
    if (e->tg[i] < 0) continue;
    double m = -INFINITY, s = 0;
    for (int64_t v = 0; v < e->V; v++) {
      l[v] = 0;
      for (int64_t d = 0; d < e->D; d++) l[v] += e->h[i * e->D + d] * e->w[v * e->D + d];
      if (e->cap > 0) l[v] = e->cap * tanh(l[v] / e->cap);
      m = fmax(m, l[v]);
    }
    for (int64_t v = 0; v < e->V; v++) s += exp(l[v] - m);
    L += (m + log(s) - l[e->tg[i]]) * e->scale;
  }
  free(l);
  return L;
}

static void test_cross_entropy(void) {
  enum { N = 7, D = 16, V = 37 };
  float wf[V * D], hf[N * D], dh[N * D], wdeq[V * D];
  double h[N * D];
  fill(NULL, wf, V * D, 1), fill(h, hf, N * D, 1);
  int32_t tg[N] = {3, -1, 36, 0, 17, -1, 5};
  for (int bf = 0; bf < 2; bf++) {
    uint16_t wb[V * D];
    bk_weight w = {.type = BK_F32, .rows = V, .cols = D, .data = wf};
    if (bf) {
      CHECK_EQ_INT(bk_quantize(BK_BF16, wf, V, D, wb, NULL), 0);
      w.type = BK_BF16, w.data = wb;
    }
    for (int r = 0; r < V; r++) bk_dequant_row(&w, r, wdeq + r * D, NULL);
    bk_weight wt;
    float *wtd = NULL, scratch[3 * V];
    herr err = {0};
    CHECK_EQ_INT(grad_weight_t(&w, &wt, &wtd, &err), 0);
    for (int64_t chunk = 1; chunk <= N; chunk += 3) {
      double loss = 0;
      int64_t count = 0;
      float scale = 1.0f / 5;
      CHECK_EQ_INT(grad_cross_entropy(NULL, &loss, &count, dh, hf, N, D, &w, &wt, tg, scale, chunk < 3 ? chunk : 3, scratch, &err), 0);
      CHECK_EQ_INT(count, 5);
      ce_ctx e = {N, D, V, h, wdeq, tg, 1.0, 0};
      CHECK_NEAR(loss, ce_loss(&e), 1e-4 * (1 + loss));
      e.scale = scale;
      fd_check(ce_loss, &e, h, dh, N * D, bf ? "cross-entropy dh (bf16 head)" : "cross-entropy dh");
      for (int d = 0; d < D; d++) CHECK(dh[1 * D + d] == 0 && dh[5 * D + d] == 0); /* masked rows */
    }
    /* through a soft-capped head (small enough a cap to bend the logits) */
    double loss = 0;
    int64_t count = 0;
    CHECK_EQ_INT(grad_cross_entropy_capped(NULL, &loss, &count, dh, hf, N, D, &w, &wt, tg, 0.5f, 1.5f, 2, scratch, &err), 0);
    ce_ctx e = {N, D, V, h, wdeq, tg, 1.0, 1.5};
    CHECK_NEAR(loss, ce_loss(&e), 1e-4 * (1 + loss));
    e.scale = 0.5;
    fd_check(ce_loss, &e, h, dh, N * D, bf ? "capped cross-entropy dh (bf16 head)" : "capped cross-entropy dh");
    e.cap = 0, e.scale = 1;
    CHECK_MSG(fabs(loss - ce_loss(&e)) > 1e-3, "the cap changed nothing (%g)", loss);
    int32_t bad[N] = {3, 37, 0, 0, 0, 0, 0};
    loss = 0, count = 0;
    CHECK(grad_cross_entropy(NULL, &loss, &count, dh, hf, N, D, &w, &wt, bad, 1, 3, scratch, &err) != 0);
    CHECK(strstr(err.msg, "outside the vocabulary") != NULL);
    free(wtd);
  }
}

int main(void) {
  RUN(test_rmsnorm);
  RUN(test_rope);
  RUN(test_attention);
  RUN(test_silu_mul);
  RUN(test_gelu_tanh_mul);
  RUN(test_matmul);
  RUN(test_lora);
  RUN(test_cross_entropy);
  TEST_MAIN_END();
}
