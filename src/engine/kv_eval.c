/* kv_eval.c — a quantized KV cache's logits and greedy tokens against the
 * f32 cache's (see kv_eval.h). One-off caches of kv_cache.c; knows nothing
 * of how the formats are stored. */
#include "engine/kv_eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_cache.h"

static int32_t argmax(const float *x, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; i++)
    if (x[i] > x[b]) b = i;
  return (int32_t)b;
}

static double top2_gap(const float *x, int64_t n) {
  double a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    if (x[i] > a) b = a, a = x[i];
    else if (x[i] > b) b = x[i];
  }
  return a - b;
}

/* One sequence through the model: the prompt in one forward (every
 * position's logits into rows), then gen tokens one at a time: forced[i]
 * when forced is not NULL, else the greedy choice, which goes to toks[i].
 * rows: [n_prompt + n_gen - 1][vocab]. */
static int run_seq(model *m, const model_kv_geometry *g, const int32_t *prompt, int n_prompt, int n_gen,
                   const int32_t *forced, int32_t *toks, float *rows, herr *err) {
  kv_cache *c = NULL;
  kv_seq *s = NULL;
  int64_t V = model_vocab_size(m);
  int rc = kv_cache_new(g, (int64_t)n_prompt + n_gen, &c, err);
  if (!rc) rc = kv_cache_seq_new(c, &s, err);
  if (!rc) {
    model_seq sq = {.kv = s, .tokens = prompt, .n_tokens = n_prompt, .all_logits = true};
    rc = model_forward(m, &(model_batch){&sq, 1}, rows, err);
  }
  for (int i = 0; !rc && i < n_gen; i++) {
    const float *last = rows + (int64_t)(n_prompt - 1 + i) * V;
    int32_t t = forced ? forced[i] : argmax(last, V);
    if (toks) toks[i] = t;
    if (i + 1 == n_gen) break; /* the last token needs no logits */
    model_seq sq = {.kv = s, .tokens = &t, .n_tokens = 1};
    rc = model_forward(m, &(model_batch){&sq, 1}, rows + (int64_t)(n_prompt + i) * V, err);
  }
  kv_cache_seq_free(s);
  kv_cache_free(c);
  return rc;
}

int kv_eval_run(model *m, const kv_quant *q, const int32_t *prompt, int n_prompt, int n_gen, kv_eval_result *out,
                herr *err) {
  memset(out, 0, sizeof *out);
  if (n_prompt < 1 || n_gen < 1) return herr_set(err, HEARTH_EINVAL, "kv_eval: a prompt and at least one token to generate");
  int64_t V = model_vocab_size(m), R = (int64_t)n_prompt + n_gen - 1;
  model_kv_geometry g32, gq;
  model_kv_geometry_of(m, &g32);
  gq = g32;
  kv_quant_apply(q, &gq);
  float *ref = malloc(sizeof(float) * (size_t)(R * V)), *got = malloc(sizeof(float) * (size_t)(R * V));
  int32_t *rt = malloc(sizeof(int32_t) * (size_t)n_gen), *qt = malloc(sizeof(int32_t) * (size_t)n_gen);
  int rc = 0;
  if (!ref || !got || !rt || !qt) {
    rc = herr_set(err, HEARTH_ENOMEM, "kv_eval: out of memory for %lld logits rows", (long long)R);
    goto done;
  }
  if ((rc = run_seq(m, &g32, prompt, n_prompt, n_gen, NULL, rt, ref, err))) goto done;
  if ((rc = run_seq(m, &gq, prompt, n_prompt, n_gen, rt, NULL, got, err))) goto done;
  double sum = 0;
  for (int64_t i = 0; i < R * V; i++) {
    double d = fabs((double)got[i] - (double)ref[i]);
    if (!(d <= out->max_abs_err)) out->max_abs_err = isnan(d) ? INFINITY : d;
    sum += d;
    if (fabs(ref[i]) > out->max_abs_logit) out->max_abs_logit = fabs(ref[i]);
  }
  out->mean_abs_err = sum / (double)(R * V);
  out->rows = R;
  if ((rc = run_seq(m, &gq, prompt, n_prompt, n_gen, NULL, qt, got, err))) goto done;
  out->n_gen = n_gen;
  out->first_divergence = n_gen;
  out->min_gap_before_divergence = INFINITY;
  for (int i = 0; i < n_gen; i++) {
    out->same_tokens += qt[i] == rt[i];
    if (qt[i] != rt[i] && out->first_divergence == n_gen) out->first_divergence = i;
  }
  for (int i = 0; i < n_gen && i <= out->first_divergence; i++) {
    double gap = top2_gap(ref + (int64_t)(n_prompt - 1 + i) * V, V);
    if (gap < out->min_gap_before_divergence) out->min_gap_before_divergence = gap;
  }
done:
  free(ref), free(got), free(rt), free(qt);
  return rc;
}
