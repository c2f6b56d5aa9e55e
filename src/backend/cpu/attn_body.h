/* attn_body.h — blocked causal attention written once over GCC vector
 * extensions (internal; included by attention.c once per CPU level, after
 * that level's target pragma, with AN(x) giving the level's suffix).
 *
 * A task is one KV head and a block of 16 query vectors — (query, head)
 * pairs of the heads that share that KV head, query-major — held one per
 * lane. Keys and values are read once per block, in tiles of 64 rows:
 *   S[j] = (Q · K[j]) · scale          16 lanes at once, Q stored transposed
 *   online softmax per lane (running max m and sum l, rescaled per tile)
 *   O[d] = O[d] · alpha + Σ_j P[j] · V[j][d]
 * Each lane masks the rows outside its own causal / window / lo range, so
 * prompts, decode steps and mixed positions share one path. No horizontal
 * sums: every lane is an independent query.
 */

typedef float AN(vf) __attribute__((vector_size(64), aligned(64)));
typedef int32_t AN(vi) __attribute__((vector_size(64), aligned(64)));
#define VF AN(vf)
#define VI AN(vi)

#ifndef ATT_VSEL
#define ATT_VSEL(m, a, b) ((__typeof__(a))(((__typeof__(m))(a) & (m)) | ((__typeof__(m))(b) & ~(m))))
#define ATT_VMAX(a, b) ATT_VSEL((a) > (b), (a), (b))
#endif

/* *px = e^x for x <= 88.7 (Cephes' expf: range reduction by ln 2, degree-6
 * polynomial, about 1 ulp); x = -inf gives 0. In place, so that no vector
 * crosses a call boundary. */
static inline __attribute__((always_inline)) void AN(vexp)(VF *px) {
  VF x = *px;
  const VF hi = (VF){0} + 88.3762626647949f, lo = (VF){0} + -87.3365478515625f;
  VI neg_inf = x == (VF){0} - INFINITY;
  x = ATT_VSEL(x > hi, hi, x);
  x = ATT_VSEL(x < lo, lo, x);
  VF fx = x * 1.44269504088896341f;
  const VF magic = (VF){0} + 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  fx = (fx + magic) - magic;
  VF r = x - fx * 0.693359375f - fx * -2.12194440e-4f;
  VF r2 = r * r;
  VF y = (VF){0} + 1.9875691500E-4f;
  y = y * r + 1.3981999507E-3f;
  y = y * r + 8.3334519073E-3f;
  y = y * r + 4.1665795894E-2f;
  y = y * r + 1.6666665459E-1f;
  y = y * r + 5.0000001201E-1f;
  y = y * r2 + r + 1.0f;
  VI e = __builtin_convertvector(fx, VI);
  VF p = (VF)((e + 127) << 23);
  *px = ATT_VSEL(neg_inf, (VF){0}, y * p);
}

#define ATT_VN 16
#define ATT_BK 64

/* dst[0..n) = elements [i0, i0 + n) of a quantized row (op_kv_dequantize;
 * whole blocks in a loop the compiler vectorizes). */
static inline void AN(kv_deq)(bk_kv_fmt f, float *restrict dst, const void *row, int64_t i0, int64_t n) {
  if (i0 % BK_KV_QBLOCK || n % BK_KV_QBLOCK) {
    op_kv_dequantize(f, dst, row, i0, n);
    return;
  }
  const size_t bb = bk_kv_row_bytes(f, BK_KV_QBLOCK);
  const uint8_t *blk = (const uint8_t *)row + (size_t)(i0 / BK_KV_QBLOCK) * bb;
  for (int64_t b = 0; b < n / BK_KV_QBLOCK; b++, blk += bb, dst += BK_KV_QBLOCK) {
    float d;
    memcpy(&d, blk, 4);
    if (f == BK_KV_Q8) {
      const int8_t *c = (const int8_t *)(blk + 4);
      for (int i = 0; i < BK_KV_QBLOCK; i++) dst[i] = d * (float)c[i];
    } else if (f == BK_KV_FP8) {
      const uint8_t *c = blk + 4;
      for (int i = 0; i < BK_KV_QBLOCK; i++) dst[i] = d * bk_fp8_value(c[i]);
    } else {
      const uint8_t *c = blk + 4;
      for (int i = 0; i < BK_KV_QBLOCK / 2; i++) dst[i] = d * (float)((c[i] & 15) - 8);
      for (int i = 0; i < BK_KV_QBLOCK / 2; i++) dst[i + BK_KV_QBLOCK / 2] = d * (float)((c[i] >> 4) - 8);
    }
  }
}

static void AN(attn_block)(const attn_fast_job *j, int64_t kvh, int64_t blk) {
  const attn_params *p = j->p;
  const kv_view *kv = j->kv;
  const int64_t G = p->n_heads / p->n_kv_heads, hd = p->head_dim, nvec = j->n * G;
  VF qt[ATT_MAX_HD], o[ATT_MAX_HD], s[ATT_BK];
  int32_t qrow_a[ATT_VN] __attribute__((aligned(64))), lo_a[ATT_VN] __attribute__((aligned(64)));
  int64_t v0 = blk * ATT_VN, lo_min = INT64_MAX, hi_max = INT64_MIN;
  int nl = nvec - v0 < ATT_VN ? (int)(nvec - v0) : ATT_VN;
  for (int64_t d = 0; d < hd; d++) qt[d] = (VF){0}, o[d] = (VF){0};
  for (int l = 0; l < ATT_VN; l++) {
    if (l >= nl) { /* empty lane: no rows */
      qrow_a[l] = -1, lo_a[l] = 0;
      continue;
    }
    int64_t v = v0 + l, i = v / G, h = kvh * G + v % G;
    const float *qv = j->q + (i * p->n_heads + h) * hd;
    for (int64_t d = 0; d < hd; d++) qt[d][l] = qv[d];
    int64_t top = (kv->last ? kv->last[i] : j->q_row[i]) + 1;
    int64_t hi = top < kv->hi ? top : kv->hi, lo = kv->lo;
    if (p->window > 0 && j->q_row[i] - p->window + 1 > lo) lo = j->q_row[i] - p->window + 1;
    qrow_a[l] = (int32_t)(hi - 1), lo_a[l] = (int32_t)lo;
    if (hi > lo) {
      if (lo < lo_min) lo_min = lo;
      if (hi > hi_max) hi_max = hi;
    }
  }
  VI qrow, lov;
  memcpy(&qrow, qrow_a, sizeof qrow);
  memcpy(&lov, lo_a, sizeof lov);
  VF m = (VF){0} - INFINITY, lsum = (VF){0};
  const VF ninf = (VF){0} - INFINITY;
  const int64_t vstride = kv->v_row_stride ? kv->v_row_stride : kv->row_stride;
  /* quantized rows: the tile's rows of this KV head, dequantized once for all 16 lanes */
  float kt[kv->k_fmt ? ATT_BK * ATT_MAX_HD : 1] __attribute__((aligned(64)));
  float vt[kv->v_fmt ? ATT_BK * ATT_MAX_HD : 1] __attribute__((aligned(64)));
#define KROW(jj) (kv->k_fmt ? kt + (jj) * hd : kv_row_at(kv->k_blocks, kv, r0 + (jj)) + kvh * hd)
#define VROW(jj) (kv->v_fmt ? vt + (jj) * hd : kv->v_blocks[(r0 + (jj)) / kv->block_rows] + ((r0 + (jj)) % kv->block_rows) * vstride + kvh * hd)
  for (int64_t r0 = lo_min; r0 < hi_max; r0 += ATT_BK) {
    int nk = hi_max - r0 < ATT_BK ? (int)(hi_max - r0) : ATT_BK;
    int jj = 0;
    if (kv->k_fmt)
      for (jj = 0; jj < nk; jj++) AN(kv_deq)(kv->k_fmt, kt + jj * hd, kv_row_at(kv->k_blocks, kv, r0 + jj), kvh * hd, hd);
    if (kv->v_fmt)
      for (jj = 0; jj < nk; jj++)
        AN(kv_deq)(kv->v_fmt, vt + jj * hd, kv->v_blocks[(r0 + jj) / kv->block_rows] + ((r0 + jj) % kv->block_rows) * vstride,
                   kvh * hd, hd);
    jj = 0;
    for (; jj + 4 <= nk; jj += 4) {
      const float *k0 = KROW(jj), *k1 = KROW(jj + 1), *k2 = KROW(jj + 2), *k3 = KROW(jj + 3);
      VF a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
      for (int64_t d = 0; d < hd; d++) {
        VF qd = qt[d];
        a0 += qd * k0[d];
        a1 += qd * k1[d];
        a2 += qd * k2[d];
        a3 += qd * k3[d];
      }
      s[jj] = a0, s[jj + 1] = a1, s[jj + 2] = a2, s[jj + 3] = a3;
    }
    for (; jj < nk; jj++) {
      const float *k0 = KROW(jj);
      VF a0 = {0};
      for (int64_t d = 0; d < hd; d++) a0 += qt[d] * k0[d];
      s[jj] = a0;
    }
    VF mx = ninf;
    for (jj = 0; jj < nk; jj++) {
      VF x = s[jj] * p->scale;
      if (p->softcap > 0)
        for (int l = 0; l < ATT_VN; l++) x[l] = p->softcap * tanhf(x[l] / p->softcap);
      int32_t r = (int32_t)(r0 + jj);
      VI ok = ((VI){0} + r <= qrow) & ((VI){0} + r >= lov);
      x = ATT_VSEL(ok, x, ninf);
      s[jj] = x;
      mx = ATT_VMAX(mx, x);
    }
    VF mn = ATT_VMAX(m, mx);
    VI none = mn == ninf; /* lanes with no row yet: keep everything at 0 */
    VF mref = ATT_VSEL(none, (VF){0}, mn);
    VF alpha = m - mref;
    AN(vexp)(&alpha);
    alpha = ATT_VSEL(none, (VF){0} + 1.0f, alpha);
    VF add = {0};
    for (jj = 0; jj < nk; jj++) {
      s[jj] -= mref;
      AN(vexp)(&s[jj]);
      add += s[jj];
    }
    lsum = lsum * alpha + add;
    m = mn;
    for (int64_t d0 = 0; d0 < hd; d0 += 8) {
      VF c0 = o[d0] * alpha, c1 = o[d0 + 1] * alpha, c2 = o[d0 + 2] * alpha, c3 = o[d0 + 3] * alpha;
      VF c4 = o[d0 + 4] * alpha, c5 = o[d0 + 5] * alpha, c6 = o[d0 + 6] * alpha, c7 = o[d0 + 7] * alpha;
      for (jj = 0; jj < nk; jj++) {
        const float *vr = VROW(jj) + d0;
        VF pj = s[jj];
        c0 += pj * vr[0], c1 += pj * vr[1], c2 += pj * vr[2], c3 += pj * vr[3];
        c4 += pj * vr[4], c5 += pj * vr[5], c6 += pj * vr[6], c7 += pj * vr[7];
      }
      o[d0] = c0, o[d0 + 1] = c1, o[d0 + 2] = c2, o[d0 + 3] = c3;
      o[d0 + 4] = c4, o[d0 + 5] = c5, o[d0 + 6] = c6, o[d0 + 7] = c7;
    }
  }
#undef KROW
#undef VROW
  VI empty = lsum == (VF){0};
  VF one = (VF){0} + 1.0f, zero = {0}, safe = ATT_VSEL(empty, one, lsum), inv = one / safe;
  inv = ATT_VSEL(empty, zero, inv);
  for (int l = 0; l < nl; l++) {
    int64_t v = v0 + l, i = v / G, h = kvh * G + v % G;
    float *out = j->out + (i * p->n_heads + h) * hd;
    for (int64_t d = 0; d < hd; d++) out[d] = o[d][l] * inv[l];
  }
}

/* Task `task` of a dispatch's sequences (attn_seqs_job): a (KV head, block) of one of them. */
static void AN(attn_task)(void *ctx, int task, int tid) {
  (void)tid;
  const attn_seqs_job *sj = ctx;
  int a = 0, b = sj->n - 1; /* the last sequence whose first task is <= task */
  while (a < b) {
    int mid = (a + b + 1) / 2;
    if (sj->first[mid] <= task) a = mid;
    else b = mid - 1;
  }
  const attn_fast_job *j = &sj->jobs[a];
  int t = task - sj->first[a];
  int64_t blocks = (j->n * (j->p->n_heads / j->p->n_kv_heads) + ATT_VN - 1) / ATT_VN;
  AN(attn_block)(j, t / blocks, t % blocks);
}

#undef VF
#undef VI
#undef ATT_VN
#undef ATT_BK
