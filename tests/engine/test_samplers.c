/* test_samplers.c — DRY, XTC, locally typical sampling and mirostat 2 on
 * handmade logits: the exact DRY penalty of the token that would extend a
 * repeat (breakers, the window, allowed length), the set XTC and typical-p
 * keep, XTC's chance over many seeded draws, mirostat's surprise driven
 * toward tau, and the host-only rule (no device row, a greedy request stays
 * plain). */
#include <math.h>
#include <stdint.h>

#include "engine/sample.h"
#include "sample_util.h"
#include "test.h"

/* ---- DRY ------------------------------------------------------------------ */

/* The logits after the penalties for a history, all logits starting at 0. */
static void dry_logits(const sample_params *p, const int32_t *hist, int n_hist, float *out, int n_vocab) {
  sampler *s = make(n_vocab, p);
  sampler_add_prompt(s, hist, (size_t)n_hist);
  for (int i = 0; i < n_vocab; i++) out[i] = 0;
  sampler_penalize(s, out);
  sampler_free(s);
}

static void test_dry_exact(void) {
  sample_params p;
  sample_params_default(&p);
  p.dry_multiplier = 0.8f;
  p.dry_base = 1.75f;
  p.dry_allowed_length = 2;
  float l[8];
  /* "1 2 3" ends the history and appeared before, followed by 4: 4 would make the
   * repeat 4 long; it is 3 long now, so 4 gets 0.8 * 1.75^(3 - 2) */
  int32_t h1[] = {1, 2, 3, 4, 1, 2, 3};
  dry_logits(&p, h1, 7, l, 8);
  for (int i = 0; i < 8; i++) CHECK_NEAR(l[i], i == 4 ? -(0.8 * 1.75) : 0.0, 1e-6);
  /* allowed length 0: every token that followed an earlier end of a (possibly
   * empty) repeat, at base^length */
  p.dry_allowed_length = 0;
  dry_logits(&p, h1, 7, l, 8);
  double want0[8] = {0, -0.8, -0.8, -0.8, -0.8 * pow(1.75, 3), 0, 0, 0};
  for (int i = 0; i < 8; i++) CHECK_NEAR(l[i], want0[i], 1e-5);
  /* the window: the last 6 tokens hold "2 3 4 1 2 3": a repeat of 2 → base^0;
   * the last 4 ("4 1 2 3") hold none */
  p.dry_allowed_length = 2;
  p.dry_penalty_last_n = 6;
  dry_logits(&p, h1, 7, l, 8);
  for (int i = 0; i < 8; i++) CHECK_NEAR(l[i], i == 4 ? -0.8 : 0.0, 1e-6);
  p.dry_penalty_last_n = 4;
  dry_logits(&p, h1, 7, l, 8);
  for (int i = 0; i < 8; i++) CHECK_NEAR(l[i], 0.0, 0);
  /* -1: the whole history */
  p.dry_penalty_last_n = -1;
  dry_logits(&p, h1, 7, l, 8);
  CHECK_NEAR(l[4], -(0.8 * 1.75), 1e-6);
  /* generated tokens extend the history as the prompt does */
  p.dry_penalty_last_n = 64;
  sampler *s = make(8, &p);
  int32_t pre[] = {1, 2, 3, 4, 1, 2};
  sampler_add_prompt(s, pre, 6);
  sampler_accept(s, 3);
  for (int i = 0; i < 8; i++) l[i] = 0;
  sampler_penalize(s, l);
  CHECK_NEAR(l[4], -(0.8 * 1.75), 1e-6);
  sampler_free(s);
  /* a longer repeat: "1 2 3 4 5" again, then 6 → 0.8 * 1.75^(5 - 2) */
  int32_t h2[] = {1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5};
  dry_logits(&p, h2, 12, l, 8);
  for (int i = 0; i < 8; i++) CHECK_NEAR(l[i], i == 6 ? -(0.8 * pow(1.75, 3)) : 0.0, 1e-5);
  /* off: multiplier 0 */
  p.dry_multiplier = 0;
  dry_logits(&p, h2, 12, l, 8);
  CHECK_NEAR(l[6], 0.0, 0);
}

static void test_dry_breakers(void) {
  sample_params p;
  sample_params_default(&p);
  p.dry_multiplier = 1.0f;
  p.dry_base = 2.0f;
  p.dry_allowed_length = 2;
  float l[8];
  /* a one-token breaker (token 2) inside the repeat: the repeat may only be as
   * long as what follows the breaker (1 token), below the allowed length */
  int32_t h1[] = {1, 2, 3, 4, 1, 2, 3};
  sample_dry_breaker b = {.head = 2, .n_tail = 0};
  p.dry_breakers = &b;
  p.n_dry_breakers = 1;
  dry_logits(&p, h1, 7, l, 8);
  for (int i = 0; i < 8; i++) CHECK_NEAR(l[i], 0.0, 0);
  /* a one-token breaker is never penalised itself: "5 6" repeats and 7 followed it */
  int32_t h2[] = {5, 6, 7, 5, 6};
  p.n_dry_breakers = 0;
  dry_logits(&p, h2, 5, l, 8);
  CHECK_NEAR(l[7], -1.0, 1e-6);
  b.head = 7;
  p.n_dry_breakers = 1;
  dry_logits(&p, h2, 5, l, 8);
  CHECK_NEAR(l[7], 0.0, 0);
  /* a two-token breaker "3 4": the repeat "2 1 4 3 2 1"... is cut to the 2
   * tokens after it, so 3 gets 2^(2 - 2) instead of 2^(6 - 2) */
  int32_t h3[] = {1, 2, 3, 4, 1, 2, 3, 4, 1, 2};
  p.n_dry_breakers = 0;
  dry_logits(&p, h3, 10, l, 8);
  CHECK_NEAR(l[3], -pow(2.0, 4), 1e-5);
  b = (sample_dry_breaker){.head = 3, .n_tail = 1, .tail = {4}};
  p.n_dry_breakers = 1;
  dry_logits(&p, h3, 10, l, 8);
  CHECK_NEAR(l[3], -1.0, 1e-6);
  /* the same head with a tail that does not follow it cuts nothing */
  b.tail[0] = 5;
  dry_logits(&p, h3, 10, l, 8);
  CHECK_NEAR(l[3], -pow(2.0, 4), 1e-5);
}

static void test_dry_exponent_cap(void) {
  sample_params p;
  sample_params_default(&p);
  p.dry_multiplier = 1.0f;
  p.dry_base = 1e6f;
  p.dry_allowed_length = 0;
  /* "1 .. 20, 30, 1 .. 20": 30 would extend a 20-token repeat, and 1e6^20
   * overflows a float; the exponent is capped at floor(88.7228391 / ln 1e6) = 6 */
  int32_t hh[41];
  for (int i = 0; i < 20; i++) hh[i] = i + 1, hh[21 + i] = i + 1;
  hh[20] = 30;
  float l[32];
  dry_logits(&p, hh, 41, l, 32);
  CHECK(isfinite(l[30]));
  CHECK_NEAR(l[30] / -1e36, 1.0, 1e-5);
}

/* ---- typical-p -------------------------------------------------------------- */

static void test_typical(void) {
  /* p = 1/2, 1/4, 1/8, 1/8: H = 1.75 ln 2; |-ln p - H| = 0.75, 0.25, 1.25, 1.25 (× ln 2),
   * so the order is 1, 0, 2, 3 and the mass after each 0.25, 0.75, 0.875, 1 */
  double probs[4] = {0.5, 0.25, 0.125, 0.125};
  float l[4], got[4];
  logits_of(probs, 4, l);
  sample_params p;
  sample_params_default(&p);
  p.typical_p = 0.2f; /* 0.25 > 0.2 after the first: only the most typical token, not the likeliest */
  sampler *s = make(4, &p);
  dist(s, l, 4, got);
  check_probs(got, (double[]){0, 1, 0, 0}, 4);
  sampler_free(s);
  p.typical_p = 0.5f;
  s = make(4, &p);
  dist(s, l, 4, got);
  check_probs(got, (double[]){2.0 / 3, 1.0 / 3, 0, 0}, 4);
  sampler_free(s);
  p.typical_p = 0.8f; /* 0.875 > 0.8 once token 2 is in (ties: the lower id first) */
  s = make(4, &p);
  dist(s, l, 4, got);
  check_probs(got, (double[]){0.5 / 0.875, 0.25 / 0.875, 0.125 / 0.875, 0}, 4);
  sampler_free(s);
  p.typical_p = 0.95f; /* the mass never exceeds it before the last: all */
  s = make(4, &p);
  dist(s, l, 4, got);
  check_probs(got, probs, 4);
  sampler_free(s);
  /* after top-k: the kept two renormalised (2/3, 1/3: H = 0.6365, scores 0.231, 0.462) */
  p.typical_p = 0.5f;
  p.top_k = 2;
  s = make(4, &p);
  dist(s, l, 4, got);
  check_probs(got, (double[]){1, 0, 0, 0}, 4);
  sampler_free(s);
}

/* ---- XTC -------------------------------------------------------------------- */

static void test_xtc(void) {
  double probs[4] = {0.4, 0.3, 0.2, 0.1};
  float l[4], got[4];
  logits_of(probs, 4, l);
  sample_params p;
  sample_params_default(&p);
  p.xtc_probability = 1.0f;
  p.xtc_threshold = 0.15f; /* 0.4, 0.3, 0.2 reach it: all but 0.2 removed */
  sampler *s = make(4, &p);
  dist(s, l, 4, got);
  check_probs(got, (double[]){0, 0, 2.0 / 3, 1.0 / 3}, 4);
  sampler_free(s);
  p.xtc_threshold = 0.35f; /* only 0.4 reaches it: nothing removed */
  s = make(4, &p);
  dist(s, l, 4, got);
  check_probs(got, probs, 4);
  sampler_free(s);
  p.xtc_threshold = 0.0f; /* every token reaches it: the least likely alone */
  s = make(4, &p);
  dist(s, l, 4, got);
  check_probs(got, (double[]){0, 0, 0, 1}, 4);
  /* and sampling draws it every time */
  for (int i = 0; i < 50; i++) {
    float tmp[4];
    memcpy(tmp, l, sizeof tmp);
    sample_token t;
    herr err = {0};
    CHECK_EQ_INT(sampler_sample(s, tmp, &t, &err), 0);
    CHECK_EQ_INT(t.id, 3);
  }
  sampler_free(s);
  p.xtc_threshold = 0.6f; /* above 0.5: off */
  s = make(4, &p);
  dist(s, l, 4, got);
  check_probs(got, probs, 4);
  sampler_free(s);
  /* on the probabilities after temperature and top-p: top_p 0.7 keeps 0.4, 0.3
   * (4/7, 3/7); threshold 0.4 → both reach it, the likelier goes */
  p.xtc_threshold = 0.4f;
  p.top_p = 0.7f;
  s = make(4, &p);
  dist(s, l, 4, got);
  check_probs(got, (double[]){0, 1, 0, 0}, 4);
  sampler_free(s);
  /* the chance: with probability 0.3 the top tokens go; over many seeded draws
   * the share of removals is within 5 standard deviations of 0.3 */
  p.top_p = 1.0f;
  p.xtc_threshold = 0.15f;
  p.xtc_probability = 0.3f;
  p.seed = 1234;
  s = make(4, &p);
  int removed = 0, n = 4000;
  for (int i = 0; i < n; i++) {
    dist(s, l, 4, got);
    if (got[0] == 0) {
      removed++;
      check_probs(got, (double[]){0, 0, 2.0 / 3, 1.0 / 3}, 4);
    } else {
      check_probs(got, probs, 4);
    }
  }
  double sd = sqrt(n * 0.3 * 0.7);
  CHECK_MSG(fabs(removed - 0.3 * n) < 5 * sd, "XTC removed the top tokens %d times of %d", removed, n);
  sampler_free(s);
}

/* ---- mirostat 2 --------------------------------------------------------------- */

static void test_mirostat_cut(void) {
  /* surprises 1, 2, 3, 3 bits; mu starts at 2 tau */
  double probs[4] = {0.5, 0.25, 0.125, 0.125};
  float l[4], got[4];
  logits_of(probs, 4, l);
  sample_params p;
  sample_params_default(&p);
  p.mirostat = 2;
  p.mirostat_tau = 1.5f; /* mu 3: all kept */
  p.top_k = 1;           /* not applied under mirostat */
  sampler *s = make(4, &p);
  CHECK_NEAR(sampler_mirostat_mu(s), 3.0, 1e-6);
  dist(s, l, 4, got);
  check_probs(got, probs, 4);
  sampler_free(s);
  p.mirostat_tau = 1.0f; /* mu 2: 1/2, 1/4 kept */
  s = make(4, &p);
  dist(s, l, 4, got);
  check_probs(got, (double[]){2.0 / 3, 1.0 / 3, 0, 0}, 4);
  /* one draw moves mu by eta times the drawn token's surprise (in the kept set) minus tau */
  float tmp[4];
  memcpy(tmp, l, sizeof tmp);
  sample_token t;
  herr err = {0};
  CHECK_EQ_INT(sampler_sample(s, tmp, &t, &err), 0);
  double surprise = t.id == 0 ? -log2(2.0 / 3) : -log2(1.0 / 3);
  CHECK(t.id == 0 || t.id == 1);
  CHECK_NEAR(sampler_mirostat_mu(s), 2.0 - 0.1 * (surprise - 1.0), 1e-5);
  sampler_free(s);
  p.mirostat_tau = 0.25f; /* mu 0.5: nothing has surprise <= 0.5; the likeliest stays */
  s = make(4, &p);
  dist(s, l, 4, got);
  check_probs(got, (double[]){1, 0, 0, 0}, 4);
  sampler_free(s);
}

/* Over many seeded draws from a Zipf distribution whose entropy is well above
 * tau, the mean surprise of the drawn tokens settles near tau. */
static void test_mirostat_converges(void) {
  enum { N = 1000 };
  static float base[N], l[N], q[N];
  double z = 0;
  for (int i = 0; i < N; i++) z += 1.0 / (i + 1);
  double h = 0;
  for (int i = 0; i < N; i++) {
    double pi = 1.0 / (i + 1) / z;
    base[i] = (float)log(pi);
    h -= pi * log2(pi);
  }
  CHECK(h > 6); /* the untruncated surprise, far from tau */
  const double taus[] = {3.0, 4.5};
  for (int k = 0; k < 2; k++) {
    sample_params p;
    sample_params_default(&p);
    p.mirostat = 2;
    p.mirostat_tau = (float)taus[k];
    p.mirostat_eta = 0.1f;
    p.seed = 42 + (uint64_t)k;
    sampler *s = make(N, &p);
    double sum = 0;
    int counted = 0;
    for (int step = 0; step < 6000; step++) {
      herr err = {0};
      memcpy(l, base, sizeof l);
      CHECK_EQ_INT(sampler_distribution(s, l, q, &err), 0);
      memcpy(l, base, sizeof l);
      sample_token t;
      CHECK_EQ_INT(sampler_sample(s, l, &t, &err), 0);
      CHECK(q[t.id] > 0);
      if (step >= 1000) {
        sum += -log2(q[t.id]);
        counted++;
      }
    }
    double mean = sum / counted;
    CHECK_MSG(fabs(mean - taus[k]) < 0.1, "mirostat tau %g: mean surprise %g", taus[k], mean);
    float mu = sampler_mirostat_mu(s);
    CHECK_MSG(mu > 0 && mu < 4 * taus[k], "mirostat tau %g: mu %g", taus[k], mu);
    sampler_free(s);
  }
}

/* ---- parameters and the device rule ------------------------------------------- */

static void test_params(void) {
  sample_params p;
  sample_params_default(&p);
  CHECK(!sample_params_host_only(&p));
  p.typical_p = 0.9f;
  CHECK_EQ_STR(sample_params_host_field(&p), "typical_p");
  p.greedy = true; /* typical, XTC, mirostat shape draws only: a greedy request stays plain */
  CHECK(!sample_params_host_only(&p));
  p.dry_multiplier = 0.5f; /* DRY changes the argmax */
  CHECK_EQ_STR(sample_params_host_field(&p), "dry_multiplier");
  sampler *s = make(8, &p);
  CHECK(!sampler_is_plain_greedy(s));
  bk_sample_row row;
  bk_sample_adj *adj = NULL;
  size_t n_adj = 0, cap = 0;
  herr err = {0};
  CHECK(sampler_device_row(s, &row, &adj, &n_adj, &cap, &err) != 0); /* never on the device */
  free(adj);
  sampler_free(s);
  sample_params_default(&p);
  p.xtc_probability = 0.5f;
  CHECK_EQ_STR(sample_params_host_field(&p), "xtc_probability");
  p.xtc_threshold = 0.7f; /* off */
  CHECK(!sample_params_host_only(&p));
  p.mirostat = 2;
  CHECK_EQ_STR(sample_params_host_field(&p), "mirostat");

  /* each bad value names its field */
  sample_params q;
#define BAD(stmt, name)                                                     \
  do {                                                                      \
    sample_params_default(&q);                                              \
    stmt;                                                                   \
    sampler *t = NULL;                                                      \
    herr e = {0};                                                           \
    CHECK(sampler_new(8, &q, &t, &e) == HEARTH_EINVAL);                     \
    CHECK_EQ_STR(e.field, name);                                            \
    sampler_free(t);                                                        \
  } while (0)
  BAD(q.typical_p = -0.1f, "typical_p");
  BAD(q.typical_p = 1.5f, "typical_p");
  BAD(q.xtc_probability = -0.1f, "xtc_probability");
  BAD((q.xtc_probability = 0.5f, q.xtc_threshold = 1.5f), "xtc_threshold");
  BAD(q.dry_multiplier = -1, "dry_multiplier");
  BAD((q.dry_multiplier = 1, q.dry_base = 0.5f), "dry_base");
  BAD((q.dry_multiplier = 1, q.dry_allowed_length = -1), "dry_allowed_length");
  BAD((q.dry_multiplier = 1, q.dry_penalty_last_n = -2), "dry_penalty_last_n");
  BAD(q.mirostat = 1, "mirostat");
  BAD(q.mirostat = 3, "mirostat");
  BAD((q.mirostat = 2, q.mirostat_tau = NAN), "mirostat_tau");
  BAD((q.mirostat = 2, q.mirostat_eta = -1), "mirostat_eta");
  sample_dry_breaker b = {.head = 99};
  BAD((q.dry_multiplier = 1, q.dry_breakers = &b, q.n_dry_breakers = 1), "dry_sequence_breakers");
#undef BAD
  /* a step that is off is not looked at: a zeroed struct's settings of DRY, XTC and mirostat pass */
  sample_params_default(&q);
  q.dry_base = 0, q.xtc_threshold = 7, q.mirostat_tau = -1, q.dry_penalty_last_n = -5;
  sampler *t = NULL;
  herr e = {0};
  CHECK_EQ_INT(sampler_new(8, &q, &t, &e), 0);
  sampler_free(t);
}

int main(void) {
  RUN(test_dry_exact);
  RUN(test_dry_breakers);
  RUN(test_dry_exponent_cap);
  RUN(test_typical);
  RUN(test_xtc);
  RUN(test_mirostat_cut);
  RUN(test_mirostat_converges);
  RUN(test_params);
  TEST_MAIN_END();
}
