/* test_sample.c — the sampler against hand-computed distributions: each
 * processor's arithmetic, the processor order, logprobs, the RNG against the
 * published xoshiro256** / splitmix64 sequences, seed reproducibility and a
 * chi-square check of draw frequencies. */
#include <math.h>
#include <stdint.h>

#include "engine/sample.h"
#include "sample_util.h"
#include "test.h"

static void test_rng_reference(void) {
  /* xoshiro256** from state {1,2,3,4}: 11520, 0, 1509978240 (reference algorithm by hand) */
  sample_rng r = {{1, 2, 3, 4}};
  CHECK(sample_rng_next(&r) == 11520u);
  CHECK(sample_rng_next(&r) == 0u);
  CHECK(sample_rng_next(&r) == 1509978240u);
  /* splitmix64 from 0: 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4 */
  sample_rng_seed(&r, 0);
  CHECK(r.s[0] == 0xe220a8397b1dcdafull);
  CHECK(r.s[1] == 0x6e789e6aa1b965f4ull);
  for (int i = 0; i < 1000; i++) {
    double u = sample_rng_uniform(&r);
    CHECK(u >= 0 && u < 1);
  }
}

static void test_greedy(void) {
  sample_params p;
  sample_params_default(&p);
  p.greedy = true;
  sampler *s = make(5, &p);
  float l[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  sample_token t;
  herr err = {0};
  CHECK_EQ_INT(sampler_sample(s, l, &t, &err), 0);
  CHECK_EQ_INT(t.id, 1); /* ties: lowest id */
  sampler_free(s);
  /* temperature 0 is greedy too */
  sample_params_default(&p);
  p.temperature = 0;
  s = make(5, &p);
  float l2[5] = {0.5f, 2.0f, -1.0f, 3.0f, 1.0f};
  CHECK_EQ_INT(sampler_sample(s, l2, &t, &err), 0);
  CHECK_EQ_INT(t.id, 3);
  float probs[5];
  float l3[5] = {0.5f, 2.0f, -1.0f, 3.0f, 1.0f};
  dist(s, l3, 5, probs);
  double want[5] = {0, 0, 0, 1, 0};
  check_probs(probs, want, 5);
  sampler_free(s);
}

static void test_temperature(void) {
  sample_params p;
  sample_params_default(&p);
  sampler *s = make(3, &p);
  float l[3] = {0, (float)log(2.0), (float)log(4.0)};
  float probs[3];
  dist(s, l, 3, probs);
  double want1[3] = {1 / 7.0, 2 / 7.0, 4 / 7.0};
  check_probs(probs, want1, 3);
  sampler_free(s);
  /* T = 2: exp(l/2) = 1, sqrt 2, 2 */
  p.temperature = 2;
  s = make(3, &p);
  dist(s, l, 3, probs);
  double z = 3 + sqrt(2.0);
  double want2[3] = {1 / z, sqrt(2.0) / z, 2 / z};
  check_probs(probs, want2, 3);
  sampler_free(s);
  /* a tiny temperature on large logits: no overflow, the max takes everything */
  p.temperature = 1e-20f;
  s = make(3, &p);
  float big[3] = {3e30f, 1e30f, -3e30f};
  dist(s, big, 3, probs);
  double want_big[3] = {1, 0, 0};
  check_probs(probs, want_big, 3);
  sampler_free(s);
    /* T = 0.5: squares 1, 4, 16 */
  p.temperature = 0.5f;
  s = make(3, &p);
  dist(s, l, 3, probs);
  double want3[3] = {1 / 21.0, 4 / 21.0, 16 / 21.0};
  check_probs(probs, want3, 3);
  sampler_free(s);
}

static void test_top_k(void) {
  sample_params p;
  sample_params_default(&p);
  p.top_k = 2;
  sampler *s = make(4, &p);
  float l[4] = {1, 3, 3, 2};
  float probs[4];
  dist(s, l, 4, probs);
  double want[4] = {0, 0.5, 0.5, 0};
  check_probs(probs, want, 4);
  sampler_free(s);
  /* ties with the k-th are kept (HF) */
  p.top_k = 1;
  s = make(4, &p);
  dist(s, l, 4, probs);
  check_probs(probs, want, 4);
  sampler_free(s);
  /* k = 3 over {1,3,3,2}: keeps 3,3,2 */
  p.top_k = 3;
  s = make(4, &p);
  dist(s, l, 4, probs);
  double e = exp(1.0), z = 2 * e * e + e;
  double want3[4] = {0, e * e / z, e * e / z, e / z};
  check_probs(probs, want3, 4);
  sampler_free(s);
  /* k >= vocabulary: off */
  p.top_k = 10;
  s = make(4, &p);
  dist(s, l, 4, probs);
  CHECK(probs[0] > 0);
  sampler_free(s);
}

static void test_top_p(void) {
  double base[4] = {0.5, 0.3, 0.15, 0.05};
  float l[4];
  logits_of(base, 4, l);
  float probs[4];
  struct {
    float top_p;
    double want[4];
  } cases[] = {
      {0.4f, {1, 0, 0, 0}},
      {0.5f, {1, 0, 0, 0}},          /* the first token alone reaches 0.5 */
      {0.6f, {0.625, 0.375, 0, 0}},  /* 0.5 < 0.6 → the second is kept too */
      {0.85f, {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0}},
      {0.99f, {0.5, 0.3, 0.15, 0.05}},
      {0.0f, {1, 0, 0, 0}},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    sample_params p;
    sample_params_default(&p);
    p.top_p = cases[c].top_p;
    sampler *s = make(4, &p);
    dist(s, l, 4, probs);
    check_probs(probs, cases[c].want, 4);
    sampler_free(s);
  }
}

static void test_min_p(void) {
  double base[4] = {0.5, 0.3, 0.15, 0.05};
  float l[4];
  logits_of(base, 4, l);
  float probs[4];
  sample_params p;
  sample_params_default(&p);
  p.min_p = 0.2f; /* threshold 0.1 */
  sampler *s = make(4, &p);
  dist(s, l, 4, probs);
  double want[4] = {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0};
  check_probs(probs, want, 4);
  sampler_free(s);
  p.min_p = 0.5f; /* threshold 0.25 */
  s = make(4, &p);
  dist(s, l, 4, probs);
  double want2[4] = {0.625, 0.375, 0, 0};
  check_probs(probs, want2, 4);
  sampler_free(s);
  /* after temperature: at T = 0.5 the probabilities square to [.25,.09,.0225,.0025]/.365,
   * and min_p 0.2 (threshold .05 of the max) keeps two */
  p.min_p = 0.2f;
  p.temperature = 0.5f;
  s = make(4, &p);
  dist(s, l, 4, probs);
  double want3[4] = {0.25 / 0.34, 0.09 / 0.34, 0, 0};
  check_probs(probs, want3, 4);
  sampler_free(s);
  /* after top-p: top_p 0.84 takes its nucleus over all four tokens (0.5 + 0.3 < 0.84
   * keeps three); min-p then drops none of those. Filtering min-p first would
   * shrink the mass and keep two. */
  p.temperature = 1;
  p.top_p = 0.84f;
  s = make(4, &p);
  dist(s, l, 4, probs);
  double want4[4] = {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0};
  check_probs(probs, want4, 4);
  sampler_free(s);
}

/* Temperature comes before top-p: at T = 0.5 the probabilities square,
 * [.25,.09,.0225,.0025]/.365, and top_p 0.9 keeps two tokens, where at T = 1 it
 * would keep three. */
static void test_order(void) {
  double base[4] = {0.5, 0.3, 0.15, 0.05};
  float l[4];
  logits_of(base, 4, l);
  float probs[4];
  sample_params p;
  sample_params_default(&p);
  p.temperature = 0.5f;
  p.top_p = 0.9f;
  sampler *s = make(4, &p);
  dist(s, l, 4, probs);
  double want[4] = {0.25 / 0.34, 0.09 / 0.34, 0, 0};
  check_probs(probs, want, 4);
  sampler_free(s);
  /* top-k before top-p: k = 2 renormalises to .625/.375, then top_p 0.6 keeps only the first */
  sample_params_default(&p);
  p.top_k = 2;
  p.top_p = 0.6f;
  s = make(4, &p);
  dist(s, l, 4, probs);
  double want2[4] = {1, 0, 0, 0};
  check_probs(probs, want2, 4);
  sampler_free(s);
}

static void test_repetition_penalty(void) {
  sample_params p;
  sample_params_default(&p);
  p.repetition_penalty = 2;
  p.greedy = true;
  p.logprobs = true;
  p.top_logprobs = 4;
  sampler *s = make(4, &p);
  int32_t prompt[3] = {0, 1, 0};
  sampler_add_prompt(s, prompt, 3);
  float l[4] = {2, -2, 1, 0.5f};
  sample_token t;
  herr err = {0};
  CHECK_EQ_INT(sampler_sample(s, l, &t, &err), 0);
  /* processed: [1, -4, 1, 0.5]; token 2 unseen stays 1 */
  CHECK_NEAR(l[0], 1.0, 1e-6);
  CHECK_NEAR(l[1], -4.0, 1e-6);
  CHECK_NEAR(l[2], 1.0, 1e-6);
  CHECK_NEAR(l[3], 0.5, 1e-6);
  CHECK_EQ_INT(t.id, 0);
  double lse = log(exp(1.0) + exp(-4.0) + exp(1.0) + exp(0.5));
  CHECK_NEAR(t.logprob, 1.0 - lse, 1e-5);
  /* an accepted token is penalised from then on, once however often it repeats */
  sampler_accept(s, 2);
  sampler_accept(s, 2);
  float l2[4] = {2, -2, 1, 0.5f};
  CHECK_EQ_INT(sampler_sample(s, l2, &t, &err), 0);
  CHECK_NEAR(l2[2], 0.5, 1e-6);
  sampler_free(s);
}

static void test_presence_frequency_bias(void) {
  sample_params p;
  sample_params_default(&p);
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  sample_bias bias[2] = {{1, 3.0f}, {3, -100.0f}};
  p.logit_bias = bias;
  p.n_logit_bias = 2;
  sampler *s = make(4, &p);
  bias[0].bias = 99; /* the sampler keeps its own copy */
  int32_t prompt[2] = {0, 0};
  sampler_add_prompt(s, prompt, 2); /* the prompt does not count for presence / frequency */
  sampler_accept(s, 2);
  sampler_accept(s, 2);
  sampler_accept(s, 3);
  float l[4] = {1, 1, 1, 1};
  float probs[4];
  float tmp[4];
  memcpy(tmp, l, sizeof l);
  herr err = {0};
  CHECK_EQ_INT(sampler_distribution(s, tmp, probs, &err), 0);
  /* 0: 1; 1: 1 + 3; 2: 1 - 0.5 - 0.5; 3: 1 - 0.5 - 0.25 - 100 */
  CHECK_NEAR(tmp[0], 1.0, 1e-6);
  CHECK_NEAR(tmp[1], 4.0, 1e-6);
  CHECK_NEAR(tmp[2], 0.0, 1e-6);
  CHECK_NEAR(tmp[3], -99.75, 1e-4);
  double z = exp(1.0) + exp(4.0) + 1 + exp(-99.75);
  double want[4] = {exp(1.0) / z, exp(4.0) / z, 1 / z, exp(-99.75) / z};
  check_probs(probs, want, 4);
  sampler_free(s);
}

static void test_logprobs(void) {
  sample_params p;
  sample_params_default(&p);
  p.logprobs = true;
  p.top_logprobs = 2;
  p.temperature = 0.25f; /* logprobs do not depend on temperature */
  p.top_k = 1;           /* nor on truncation */
  sampler *s = make(3, &p);
  float l[3] = {1, 2, 3};
  sample_token t;
  herr err = {0};
  CHECK_EQ_INT(sampler_sample(s, l, &t, &err), 0);
  double lse = log(exp(1.0) + exp(2.0) + exp(3.0));
  CHECK_EQ_INT(t.id, 2);
  CHECK_NEAR(t.logprob, 3 - lse, 1e-5);
  CHECK_EQ_INT(t.n_top, 2);
  CHECK_EQ_INT(t.top_ids[0], 2);
  CHECK_EQ_INT(t.top_ids[1], 1);
  CHECK_NEAR(t.top_logprobs[0], 3 - lse, 1e-5);
  CHECK_NEAR(t.top_logprobs[1], 2 - lse, 1e-5);
  sampler_free(s);
  /* more alternatives asked than the vocabulary holds */
  p.top_logprobs = 5;
  s = make(3, &p);
  float l2[3] = {1, 2, 3};
  CHECK_EQ_INT(sampler_sample(s, l2, &t, &err), 0);
  CHECK_EQ_INT(t.n_top, 3);
  CHECK_EQ_INT(t.top_ids[2], 0);
  sampler_free(s);
}

static void draw_seq(uint64_t seed, int32_t *out, int n) {
  sample_params p;
  sample_params_default(&p);
  p.seed = seed;
  p.temperature = 0.8f;
  p.top_p = 0.95f;
  sampler *s = make(16, &p);
  herr err = {0};
  for (int i = 0; i < n; i++) {
    float l[16];
    for (int k = 0; k < 16; k++) l[k] = (float)((k * 7 + i) % 16) * 0.3f;
    sample_token t;
    CHECK_EQ_INT(sampler_sample(s, l, &t, &err), 0);
    out[i] = t.id;
    sampler_accept(s, t.id);
  }
  sampler_free(s);
}

static void test_seed(void) {
  int32_t a[200], b[200], c[200];
  draw_seq(42, a, 200);
  draw_seq(42, b, 200);
  draw_seq(43, c, 200);
  CHECK(memcmp(a, b, sizeof a) == 0);
  CHECK(memcmp(a, c, sizeof a) != 0);
}

/* Frequencies of 40000 draws against the distribution: chi-square with 3 degrees
 * of freedom below 16.27 (p = 0.001). Deterministic with a fixed seed. */
static void test_chi_square(void) {
  double base[6] = {0.1, 0.2, 0.3, 0.4, 0.0005, 0.0005};
  float l[6];
  logits_of(base, 6, l);
  sample_params p;
  sample_params_default(&p);
  p.seed = 1234;
  p.min_p = 0.01f; /* removes the last two */
  sampler *s = make(6, &p);
  int counts[6] = {0};
  const int draws = 40000;
  herr err = {0};
  for (int i = 0; i < draws; i++) {
    float tmp[6];
    memcpy(tmp, l, sizeof l);
    sample_token t;
    CHECK_EQ_INT(sampler_sample(s, tmp, &t, &err), 0);
    if (t.id >= 0 && t.id < 6) counts[t.id]++;
  }
  CHECK_EQ_INT(counts[4], 0);
  CHECK_EQ_INT(counts[5], 0);
  double chi = 0;
  for (int k = 0; k < 4; k++) {
    double e = base[k] / 0.999 * draws;
    chi += (counts[k] - e) * (counts[k] - e) / e;
  }
  CHECK_MSG(chi < 16.27, "chi-square %g over counts %d %d %d %d", chi, counts[0], counts[1], counts[2], counts[3]);
  sampler_free(s);
}

/* A vocabulary-sized row: top-p with pruning equals a plain sort-everything reference. */
static const double *g_sort_p;
static int cmp_desc(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  if (g_sort_p[x] != g_sort_p[y]) return g_sort_p[x] < g_sort_p[y] ? 1 : -1;
  return (x > y) - (x < y);
}

static void test_top_p_large(void) {
  enum { N = 50000 };
  float *l = malloc(sizeof(float) * N);
  float *tmp = malloc(sizeof(float) * N);
  float *probs = malloc(sizeof(float) * N);
  double *ref = malloc(sizeof(double) * N);
  int32_t *idx = malloc(sizeof(int32_t) * N);
  sample_rng r;
  sample_rng_seed(&r, 7);
  for (int i = 0; i < N; i++) l[i] = (float)(sample_rng_uniform(&r) * 12.0 - 6.0);
  float top_ps[3] = {0.3f, 0.9f, 0.999f};
  for (int c = 0; c < 3; c++) {
    sample_params p;
    sample_params_default(&p);
    p.top_p = top_ps[c];
    p.temperature = 0.7f;
    sampler *s = make(N, &p);
    memcpy(tmp, l, sizeof(float) * N);
    herr err = {0};
    CHECK_EQ_INT(sampler_distribution(s, tmp, probs, &err), 0);
    /* reference: softmax in double, sort all, keep while mass before < top_p */
    double mx = -1e30, z = 0;
    for (int i = 0; i < N; i++) mx = fmax(mx, l[i] / 0.7);
    for (int i = 0; i < N; i++) z += (ref[i] = exp(l[i] / 0.7 - mx));
    for (int i = 0; i < N; i++) {
      ref[i] /= z;
      idx[i] = i;
    }
    g_sort_p = ref;
    qsort(idx, N, sizeof(int32_t), cmp_desc);
    double before = 0;
    int keep = 0;
    while (keep < N && (keep == 0 || before < top_ps[c])) before += ref[idx[keep++]];
    int mismatched = 0, kept_got = 0;
    for (int i = 0; i < N; i++) kept_got += probs[i] > 0;
    for (int i = 0; i < keep; i++) {
      double want = ref[idx[i]] / before;
      if (!(fabs(probs[idx[i]] - want) <= 1e-6 + 1e-4 * want)) mismatched++;
    }
    CHECK_MSG(abs(kept_got - keep) <= 1, "top_p %g: kept %d, reference %d", top_ps[c], kept_got, keep);
    CHECK_MSG(mismatched <= 1, "top_p %g: %d probabilities differ", top_ps[c], mismatched);
    sampler_free(s);
  }
  free(l);
  free(tmp);
  free(probs);
  free(ref);
  free(idx);
}

static void test_bad_input(void) {
  sample_params p;
  sampler *s = NULL;
  herr err = {0};
  sample_params_default(&p);
  p.top_p = 1.5f;
  CHECK_EQ_INT(sampler_new(4, &p, &s, &err), HEARTH_EINVAL);
  CHECK(strstr(err.msg, "top_p") != NULL);
  CHECK_EQ_STR(err.field, "top_p"); /* the field is typed, not only in the message */
  sample_params_default(&p);
  p.temperature = NAN;
  CHECK_EQ_INT(sampler_new(4, &p, &s, &err), HEARTH_EINVAL);
  CHECK_EQ_STR(err.field, "temperature");
  sample_params_default(&p);
  sample_bias b = {4, 1.0f};
  p.logit_bias = &b;
  p.n_logit_bias = 1;
  CHECK_EQ_INT(sampler_new(4, &p, &s, &err), HEARTH_EINVAL);
  CHECK(strstr(err.msg, "logit_bias") != NULL);
  CHECK_EQ_STR(err.field, "logit_bias");
  sample_params_default(&p);
  p.repetition_penalty = 0;
  CHECK_EQ_INT(sampler_new(4, &p, &s, &err), HEARTH_EINVAL);
  sample_params_default(&p);
  p.top_logprobs = 21;
  CHECK_EQ_INT(sampler_new(4, &p, &s, &err), HEARTH_EINVAL);
  CHECK(s == NULL);
  /* NaN logits are never chosen; a row with nothing finite is an error */
  sample_params_default(&p);
  s = make(3, &p);
  float l[3] = {NAN, 1, NAN};
  sample_token t;
  CHECK_EQ_INT(sampler_sample(s, l, &t, &err), 0);
  CHECK_EQ_INT(t.id, 1);
  float l2[3] = {-INFINITY, NAN, -INFINITY};
  CHECK_EQ_INT(sampler_sample(s, l2, &t, &err), HEARTH_EINTERNAL);
  /* out-of-range history ids are ignored */
  int32_t bad[2] = {-1, 99};
  sampler_add_prompt(s, bad, 2);
  sampler_accept(s, 1000);
  sampler_free(s);
}


/* The device path (sampler_device_row + bk_sample, here on the CPU backend)
 * draws from the same distribution as the host sampler: over a grid of u
 * values the picks of each token are its probability's share of the grid
 * (bk_sample maps u through the running sum in id order), and greedy ids and
 * logprobs equal sampler_sample's. */
static void test_device_path(void) {
  bk_backend *be = NULL;
  herr err = {0};
  CHECK_MSG(bk_backend_open("cpu", NULL, &be, &err) == 0, "%s", err.msg);
  if (!be) return;
  enum { V = 3000, N = 4000 };
  static float logits[V], work[V], probs[V];
  static int counts[V];
  static const sample_bias bias[] = {{5, 3.0f}, {17, -2.0f}, {2999, 9.0f}};
  uint64_t x = 12345;
  for (int cfg = 0; cfg < 12; cfg++) {
    sample_params p;
    sample_params_default(&p);
    p.greedy = cfg % 6 == 0;
    p.temperature = 0.5f + 0.25f * (float)(cfg % 4);
    p.top_k = cfg % 3 == 1 ? 50 : 0;
    p.top_p = cfg % 4 == 2 ? 0.8f : 1.0f;
    p.min_p = cfg % 5 == 3 ? 0.05f : 0.0f;
    p.repetition_penalty = cfg % 2 ? 1.2f : 1.0f;
    p.presence_penalty = cfg % 3 == 2 ? 0.5f : 0.0f;
    p.frequency_penalty = cfg % 4 == 1 ? 0.3f : 0.0f;
    p.logit_bias = cfg % 2 ? bias : NULL;
    p.n_logit_bias = cfg % 2 ? 3 : 0;
    p.logprobs = true;
    p.top_logprobs = 5;
    p.seed = 99 + (uint64_t)cfg;
    for (int i = 0; i < V; i++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      logits[i] = (float)((double)(x >> 11) / 9007199254740992.0 * 10.0 - 5.0);
    }
    sampler *host = make(V, &p), *dev = make(V, &p);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = (int32_t)((i * 37 + cfg) % V);
    sampler_add_prompt(host, prompt, 40);
    sampler_add_prompt(dev, prompt, 40);
    for (int i = 0; i < 25; i++) {
      sampler_accept(host, (int32_t)((i * i + 3) % 60));
      sampler_accept(dev, (int32_t)((i * i + 3) % 60));
    }
    memcpy(work, logits, sizeof logits);
    CHECK_MSG(sampler_distribution(host, work, probs, &err) == 0, "%s", err.msg);

    bk_sample_row row;
    bk_sample_adj *adj = NULL;
    size_t n_adj = 0, cap = 0;
    CHECK_MSG(sampler_device_row(dev, &row, &adj, &n_adj, &cap, &err) == 0, "%s", err.msg);
    bk_tensor t;
    CHECK(bk_tensor_new(be, BK_DT_F32, 1, V, &t, &err) == 0);
    memset(counts, 0, sizeof counts);
    bk_sample_out out;
    for (int k = 0; k < N; k++) {
      row.u = ((double)k + 0.5) / N;
      CHECK(bk_set(&t, 0, logits, sizeof logits, &err) == 0);
      CHECK_MSG(bk_sample(&t, &row, adj, (int64_t)n_adj, &out, &err) == 0, "%s", err.msg);
      if (out.id < 0 || out.id >= V) {
        CHECK_MSG(false, "config %d: id %d", cfg, out.id);
        break;
      }
      counts[out.id]++;
    }
    int bad = 0;
    for (int i = 0; i < V; i++) {
      double share = (double)counts[i] / N;
      if (fabs(share - probs[i]) > 1.5 / N + 1e-5 || (counts[i] && probs[i] == 0)) bad++;
    }
    CHECK_MSG(bad == 0, "config %d: %d tokens drawn out of proportion to the host sampler's distribution", cfg, bad);

    /* the chosen token's logprob and the top list equal the host sampler's */
    sample_token ht;
    memcpy(work, logits, sizeof logits);
    CHECK(sampler_sample(host, work, &ht, &err) == 0);
    row.u = 0.5;
    CHECK(bk_set(&t, 0, logits, sizeof logits, &err) == 0);
    CHECK(bk_sample(&t, &row, adj, (int64_t)n_adj, &out, &err) == 0);
    sample_token dt;
    sampler_from_device(dev, &out, &dt);
    if (p.greedy) CHECK_MSG(dt.id == ht.id, "config %d: greedy %d vs host %d", cfg, dt.id, ht.id);
    CHECK(dt.n_top == ht.n_top);
    for (int k = 0; k < dt.n_top && k < ht.n_top; k++) {
      CHECK(dt.top_ids[k] == ht.top_ids[k]);
      CHECK_NEAR(dt.top_logprobs[k], ht.top_logprobs[k], 1e-5);
    }
    if (dt.id == ht.id) CHECK_NEAR(dt.logprob, ht.logprob, 1e-5);
    bk_tensor_free(&t);
    free(adj);
    sampler_free(host);
    sampler_free(dev);
  }
  bk_backend_close(be);
}

int main(void) {
  RUN(test_rng_reference);
  RUN(test_greedy);
  RUN(test_temperature);
  RUN(test_top_k);
  RUN(test_top_p);
  RUN(test_min_p);
  RUN(test_order);
  RUN(test_repetition_penalty);
  RUN(test_presence_frequency_bias);
  RUN(test_logprobs);
  RUN(test_seed);
  RUN(test_chi_square);
  RUN(test_top_p_large);
  RUN(test_bad_input);
  RUN(test_device_path);
  TEST_MAIN_END();
}
