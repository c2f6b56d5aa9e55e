/* logit_signal.c — the next-token distribution of one logits row summarised:
 * log-softmax, a histogram over the fixed range [HEARTH_SIGNAL_LO, 0]
 * (lower log-probabilities counted in the first bin), entropy and the best
 * tokens. Host code over a row that came back from the backend, as the
 * host sampler (sample.c) is; knows nothing of models or HTTP. */
#include "engine/logit_signal.h"

#include <math.h>
#include <string.h>

int logit_signal(const float *logits, int64_t vocab, int n_bins, int n_top, hearth_signal_result *out, herr *err) {
  memset(out, 0, sizeof *out);
  if (n_bins < 1 || n_bins > HEARTH_SIGNAL_MAX_BINS)
    return herr_set(err, HEARTH_EINVAL, "bins must be between 1 and %d, not %d", HEARTH_SIGNAL_MAX_BINS, n_bins);
  if (n_top < 0 || n_top > HEARTH_MAX_TOP_LOGPROBS)
    return herr_set(err, HEARTH_EINVAL, "top must be between 0 and %d, not %d", HEARTH_MAX_TOP_LOGPROBS, n_top);
  double mx = -INFINITY;
  int64_t usable = 0;
  for (int64_t i = 0; i < vocab; i++)
    if (isfinite(logits[i])) {
      usable++;
      if (logits[i] > mx) mx = logits[i];
    }
  if (usable == 0) return herr_set(err, HEARTH_EINVAL, "the logits row has no finite value");
  double sum = 0;
  for (int64_t i = 0; i < vocab; i++)
    if (isfinite(logits[i])) sum += exp((double)logits[i] - mx);
  double lse = mx + log(sum), lo = HEARTH_SIGNAL_LO, w = -lo / n_bins, entropy = 0;
  out->n_bins = n_bins;
  out->lo = lo;
  out->hi = 0;
  out->max_logprob = -INFINITY;
  out->min_logprob = 0;
  out->n_tokens = usable;
  for (int64_t i = 0; i < vocab; i++) {
    if (!isfinite(logits[i])) continue;
    double lp = (double)logits[i] - lse, p = exp(lp);
    int b = lp <= lo ? 0 : (int)((lp - lo) / w);
    if (b >= n_bins) b = n_bins - 1;
    if (b < 0) b = 0;
    out->counts[b]++;
    out->mass[b] += p;
    if (p > 0) entropy -= p * lp;
    if (lp > out->max_logprob) out->max_logprob = lp;
    if (lp < out->min_logprob) out->min_logprob = lp;
    /* the best n_top, descending, the lower id first on ties (ids come in order) */
    if (n_top == 0 || (out->n_top == n_top && !(lp > out->top_logprobs[n_top - 1]))) continue;
    int at = out->n_top < n_top ? out->n_top++ : n_top - 1;
    while (at > 0 && lp > out->top_logprobs[at - 1]) {
      out->top_ids[at] = out->top_ids[at - 1];
      out->top_logprobs[at] = out->top_logprobs[at - 1];
      at--;
    }
    out->top_ids[at] = (int32_t)i;
    out->top_logprobs[at] = lp;
  }
  out->entropy = entropy;
  return 0;
}
