/* sample_util.h — what the sampler tests share: a sampler made or the test
 * failed, the distribution of a logits row, probabilities compared with a
 * reference, and the logits whose softmax is a given distribution. */
#ifndef HEARTH_TESTS_SAMPLE_UTIL_H
#define HEARTH_TESTS_SAMPLE_UTIL_H

#include <math.h>
#include <string.h>

#include "engine/sample.h"
#include "test.h"

static inline sampler *make(int32_t n, const sample_params *p) {
  sampler *s = NULL;
  herr err = {0};
  int rc = sampler_new(n, p, &s, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  return s;
}

/* The distribution for logits (copied, so callers can reuse them; at most 64). */
static inline void dist(sampler *s, const float *logits, int n, float *probs) {
  float tmp[64];
  memcpy(tmp, logits, sizeof(float) * (size_t)n);
  herr err = {0};
  int rc = sampler_distribution(s, tmp, probs, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
}

static inline void check_probs(const float *got, const double *want, int n) {
  for (int i = 0; i < n; i++) CHECK_NEAR(got[i], want[i], 1e-6);
}

static inline void logits_of(const double *probs, int n, float *logits) {
  for (int i = 0; i < n; i++) logits[i] = probs[i] > 0 ? (float)log(probs[i]) : -INFINITY;
}

#endif
