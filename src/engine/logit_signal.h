/* logit_signal.h — a summary of the next-token distribution from one logits row:
 * a histogram of the log-probabilities over a fixed range, the entropy, the
 * best tokens (what POST /v1/signal and hearth_signal report). */
#ifndef HEARTH_ENGINE_LOGIT_SIGNAL_H
#define HEARTH_ENGINE_LOGIT_SIGNAL_H

#include <stdint.h>

#include "base/status.h"

/* Fills out (bins, edges, counts, mass, entropy, extremes, top) from
 * logits[0..vocab): log-softmax in double; NaN and -inf logits are tokens
 * that cannot come next and are left out of every count. n_bins in
 * [1, HEARTH_SIGNAL_MAX_BINS], n_top in [0, HEARTH_MAX_TOP_LOGPROBS].
 * HEARTH_EINVAL when the row has no finite logit or n_bins / n_top are out of range. */
int logit_signal(const float *logits, int64_t vocab, int n_bins, int n_top, hearth_signal_result *out, herr *err);

#endif
