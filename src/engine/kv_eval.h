/* kv_eval.h — what KV cache quantization does to a model's output: the
 * logits of a prompt and its greedy continuation with a quantized cache
 * against the same with the f32 cache.
 *
 *   1. f32 cache: the prompt in one forward (logits at every position), then
 *      n_gen greedy tokens one at a time (the reference logits and tokens);
 *   2. quantized cache, teacher-forced: the same inputs in the same chunks,
 *      every logits row compared with the reference's (max / mean |Δ|);
 *   3. quantized cache, free-running greedy from the prompt: its tokens
 *      compared with the reference's (the first position that differs, and
 *      how many positions agree).
 * Every greedy choice is the lowest id among equal maxima. */
#ifndef HEARTH_ENGINE_KV_EVAL_H
#define HEARTH_ENGINE_KV_EVAL_H

#include <stdint.h>

#include "engine/kv_quant.h"
#include "model/model.h"

typedef struct kv_eval_result {
  double max_abs_err, mean_abs_err; /* over every logit of every compared row */
  double max_abs_logit;             /* of the reference rows: the scale of the errors */
  int64_t rows;                     /* logits rows compared: n_prompt + n_gen - 1 */
  int n_gen;                        /* greedy tokens compared */
  int first_divergence;             /* the first greedy position that differs; n_gen when none */
  int same_tokens;                  /* positions where the two greedy tokens agree */
  double min_gap_before_divergence; /* the reference's smallest top-2 logit gap over positions [0, first_divergence] */
} kv_eval_result;

/* q: the quantized cache's formats (kv_quant.h). prompt: n_prompt >= 1 ids. */
int kv_eval_run(model *m, const kv_quant *q, const int32_t *prompt, int n_prompt, int n_gen, kv_eval_result *out,
                herr *err);

#endif
