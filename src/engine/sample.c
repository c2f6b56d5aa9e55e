/* sample.c — logit processors, logprobs and the per-request RNG (see
 * sample.h for the order and semantics). Owns the sampler's history and
 * scratch; knows nothing of models, tokenizers or text. */
#include "engine/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "base/vec.h"
#include "format/config.h"

typedef struct cand {
  float v;     /* tempered logit, then unnormalised probability */
  int32_t id;
} cand;

struct sampler {
  int32_t n_vocab;
  sample_params p;
  sample_bias *bias;       /* owned copy of p.logit_bias */
  sample_rng rng;
  uint8_t *seen;           /* owned [n_vocab]: in prompt or output (repetition penalty) */
  int32_t *seen_ids;       /* owned: the ids with seen set, in first-seen order */
  size_t n_seen, cap_seen;
  int32_t *counts;         /* owned [n_vocab]: times generated (presence / frequency) */
  int32_t *gen_ids;        /* owned: ids with counts > 0 */
  size_t n_gen, cap_gen;
  cand *cands;             /* owned scratch [n_vocab] */
  /* DRY (only when on) */
  sample_dry_breaker *brk; /* owned copy of p.dry_breakers, sorted by head */
  int32_t *hist;           /* owned: prompt + output ids, the last ones DRY scans */
  size_t n_hist, cap_hist;
  int32_t *dry_z;          /* owned scratch: the history's repeat lengths */
  struct dry_run *dry_runs; /* owned scratch: (token, length) of each repeat */
  size_t cap_dry;
  /* typical-p (only when on) */
  struct typ_cand *typ;    /* owned scratch [n_vocab] */
  float mu;                /* mirostat 2's surprise cap, in bits */
};

typedef struct dry_run {
  int32_t id, len;
} dry_run;

typedef struct typ_cand {
  float score, v;
  int32_t id;
} typ_cand;

/* ---- RNG ---------------------------------------------------------------- */

void sample_rng_seed(sample_rng *r, uint64_t seed) {
  uint64_t x = seed;
  for (int i = 0; i < 4; i++) r->s[i] = hsplitmix64(&x);
}

static uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t sample_rng_next(sample_rng *r) {
  uint64_t *s = r->s;
  uint64_t out = rotl64(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl64(s[3], 45);
  return out;
}

double sample_rng_uniform(sample_rng *r) { return (double)(sample_rng_next(r) >> 11) * 0x1.0p-53; }

/* ---- construction --------------------------------------------------------- */

void sample_params_default(sample_params *p) {
  memset(p, 0, sizeof *p);
  p->temperature = 1.0f;
  p->top_p = 1.0f;
  p->repetition_penalty = 1.0f;
  p->typical_p = (float)SAMPLE_DEFAULT_TYPICAL_P;
  p->xtc_threshold = (float)SAMPLE_DEFAULT_XTC_THRESHOLD;
  p->dry_base = (float)SAMPLE_DEFAULT_DRY_BASE;
  p->dry_allowed_length = SAMPLE_DEFAULT_DRY_ALLOWED_LENGTH;
  p->dry_penalty_last_n = SAMPLE_DEFAULT_DRY_PENALTY_LAST_N;
  p->mirostat_tau = (float)SAMPLE_DEFAULT_MIROSTAT_TAU;
  p->mirostat_eta = (float)SAMPLE_DEFAULT_MIROSTAT_ETA;
}

void sample_params_model_default(sample_params *p, const generation_config *g) {
  sample_params_default(p);
  p->greedy = !g->do_sample;
  p->temperature = (float)g->temperature;
  p->top_k = (int32_t)g->top_k;
  p->top_p = (float)g->top_p;
  p->min_p = (float)g->min_p;
  p->repetition_penalty = (float)g->repetition_penalty;
}

static bool dry_on(const sample_params *p) { return p->dry_multiplier != 0 && p->dry_base >= 1 && p->dry_penalty_last_n != 0; }
static bool typical_on(const sample_params *p) { return p->typical_p < 1.0f; }
static bool xtc_on(const sample_params *p) { return p->xtc_probability > 0 && p->xtc_threshold <= 0.5f; }

const char *sample_params_host_field(const sample_params *p) {
  if (dry_on(p)) return "dry_multiplier";
  if (p->greedy || p->temperature <= 0) return NULL; /* the rest shape draws only */
  if (typical_on(p)) return "typical_p";
  if (xtc_on(p)) return "xtc_probability";
  if (p->mirostat) return "mirostat";
  return NULL;
}

bool sample_params_host_only(const sample_params *p) { return sample_params_host_field(p) != NULL; }

static int brk_cmp(const void *a, const void *b) {
  const sample_dry_breaker *x = a, *y = b;
  if (x->head != y->head) return x->head < y->head ? -1 : 1;
  return (x->n_tail > y->n_tail) - (x->n_tail < y->n_tail);
}

static int check_params(int32_t n_vocab, const sample_params *p, herr *err) {
  if (n_vocab <= 0) return herr_set(err, HEARTH_EINVAL, "sampler: vocabulary size %d must be positive", (int)n_vocab);
  if (!isfinite(p->temperature) || p->temperature < 0)
    return herr_set_at(err, HEARTH_EINVAL, "temperature", 0, "temperature %g must be a finite number >= 0", p->temperature);
  if (!(p->top_p >= 0 && p->top_p <= 1)) return herr_set_at(err, HEARTH_EINVAL, "top_p", 0, "top_p %g must be in [0, 1]", p->top_p);
  if (!(p->min_p >= 0 && p->min_p <= 1)) return herr_set_at(err, HEARTH_EINVAL, "min_p", 0, "min_p %g must be in [0, 1]", p->min_p);
  if (!isfinite(p->repetition_penalty) || p->repetition_penalty <= 0)
    return herr_set_at(err, HEARTH_EINVAL, "repetition_penalty", 0, "repetition_penalty %g must be a finite number > 0", p->repetition_penalty);
  if (!isfinite(p->presence_penalty))
    return herr_set_at(err, HEARTH_EINVAL, "presence_penalty", 0, "presence_penalty %g must be finite", p->presence_penalty);
  if (!isfinite(p->frequency_penalty))
    return herr_set_at(err, HEARTH_EINVAL, "frequency_penalty", 0, "frequency_penalty %g must be finite", p->frequency_penalty);
  if (!(p->typical_p >= 0 && p->typical_p <= 1))
    return herr_set_at(err, HEARTH_EINVAL, "typical_p", 0, "typical_p %g must be in [0, 1]", p->typical_p);
  if (!(p->xtc_probability >= 0 && p->xtc_probability <= 1))
    return herr_set_at(err, HEARTH_EINVAL, "xtc_probability", 0, "xtc_probability %g must be in [0, 1]", p->xtc_probability);
  /* the settings of a step that is off are not looked at */
  if (p->xtc_probability > 0 && !(p->xtc_threshold >= 0 && p->xtc_threshold <= 1))
    return herr_set_at(err, HEARTH_EINVAL, "xtc_threshold", 0, "xtc_threshold %g must be in [0, 1]", p->xtc_threshold);
  if (!isfinite(p->dry_multiplier) || p->dry_multiplier < 0)
    return herr_set_at(err, HEARTH_EINVAL, "dry_multiplier", 0, "dry_multiplier %g must be a finite number >= 0", p->dry_multiplier);
  if (p->dry_multiplier != 0 && (!isfinite(p->dry_base) || p->dry_base < 1))
    return herr_set_at(err, HEARTH_EINVAL, "dry_base", 0, "dry_base %g must be a finite number >= 1", p->dry_base);
  if (p->dry_multiplier != 0 && p->dry_allowed_length < 0)
    return herr_set_at(err, HEARTH_EINVAL, "dry_allowed_length", 0, "dry_allowed_length %d must be >= 0", (int)p->dry_allowed_length);
  if (p->dry_multiplier != 0 && p->dry_penalty_last_n < -1)
    return herr_set_at(err, HEARTH_EINVAL, "dry_penalty_last_n", 0, "dry_penalty_last_n %d must be >= -1 (-1: the whole context)",
                       (int)p->dry_penalty_last_n);
  if (p->n_dry_breakers && !p->dry_breakers)
    return herr_set_at(err, HEARTH_EINVAL, "dry_sequence_breakers", 0, "dry_sequence_breakers: %zu entries but no array", p->n_dry_breakers);
  for (size_t i = 0; i < p->n_dry_breakers; i++) {
    const sample_dry_breaker *b = &p->dry_breakers[i];
    bool ok = b->head >= 0 && b->head < n_vocab && b->n_tail >= 0 && b->n_tail <= SAMPLE_DRY_MAX_TAIL;
    for (int32_t k = 0; ok && k < b->n_tail; k++) ok = b->tail[k] >= 0 && b->tail[k] < n_vocab;
    if (!ok) return herr_set_at(err, HEARTH_EINVAL, "dry_sequence_breakers", 0, "dry_sequence_breakers: breaker %zu is not a token sequence of this vocabulary", i);
  }
  if (p->mirostat != 0 && p->mirostat != 2)
    return herr_set_at(err, HEARTH_EINVAL, "mirostat", 0,
                       p->mirostat == 1 ? "mirostat 1 is not supported: use mirostat 2" : "mirostat %d must be 0 or 2", p->mirostat);
  if (p->mirostat && (!isfinite(p->mirostat_tau) || p->mirostat_tau < 0))
    return herr_set_at(err, HEARTH_EINVAL, "mirostat_tau", 0, "mirostat_tau %g must be a finite number >= 0", p->mirostat_tau);
  if (p->mirostat && (!isfinite(p->mirostat_eta) || p->mirostat_eta < 0))
    return herr_set_at(err, HEARTH_EINVAL, "mirostat_eta", 0, "mirostat_eta %g must be a finite number >= 0", p->mirostat_eta);
  if (p->top_logprobs < 0 || p->top_logprobs > SAMPLE_MAX_TOP_LOGPROBS)
    return herr_set_at(err, HEARTH_EINVAL, "top_logprobs", 0, "top_logprobs %d must be in [0, %d]", p->top_logprobs, SAMPLE_MAX_TOP_LOGPROBS);
  if (p->n_logit_bias && !p->logit_bias) return herr_set_at(err, HEARTH_EINVAL, "logit_bias", 0, "logit_bias: %zu entries but no array", p->n_logit_bias);
  for (size_t i = 0; i < p->n_logit_bias; i++) {
    const sample_bias *b = &p->logit_bias[i];
    if (b->id < 0 || b->id >= n_vocab)
      return herr_set_at(err, HEARTH_EINVAL, "logit_bias", 0, "logit_bias: token id %d is outside the vocabulary (size %d)", (int)b->id,
                      (int)n_vocab);
    if (!isfinite(b->bias)) return herr_set_at(err, HEARTH_EINVAL, "logit_bias", 0, "logit_bias: bias for token %d is not finite", (int)b->id);
  }
  return 0;
}

int sampler_new(int32_t n_vocab, const sample_params *p, sampler **out, herr *err) {
  *out = NULL;
  int rc = check_params(n_vocab, p, err);
  if (rc) return rc;
  sampler *s = calloc(1, sizeof *s);
  if (!s) return herr_set(err, HEARTH_ENOMEM, "sampler: out of memory");
  s->n_vocab = n_vocab;
  s->p = *p;
  s->p.logit_bias = NULL;
  s->seen = calloc((size_t)n_vocab, 1);
  s->counts = calloc((size_t)n_vocab, sizeof(int32_t));
  (void)HGROW(s->seen_ids, s->cap_seen, 16);
  (void)HGROW(s->gen_ids, s->cap_gen, 16);
  s->cands = malloc(sizeof(cand) * (size_t)n_vocab);
  if (p->n_logit_bias) {
    s->bias = malloc(sizeof(sample_bias) * p->n_logit_bias);
    if (s->bias) memcpy(s->bias, p->logit_bias, sizeof(sample_bias) * p->n_logit_bias);
  }
  bool dry = dry_on(p);
  if (dry && p->n_dry_breakers) {
    s->brk = malloc(sizeof(sample_dry_breaker) * p->n_dry_breakers);
    if (s->brk) {
      memcpy(s->brk, p->dry_breakers, sizeof(sample_dry_breaker) * p->n_dry_breakers);
      qsort(s->brk, p->n_dry_breakers, sizeof(sample_dry_breaker), brk_cmp);
    }
  }
  if (dry) (void)HGROW(s->hist, s->cap_hist, 64);
  if (typical_on(p)) s->typ = malloc(sizeof(typ_cand) * (size_t)n_vocab);
  if (!s->seen || !s->seen_ids || !s->counts || !s->gen_ids || !s->cands || (p->n_logit_bias && !s->bias) ||
      (dry && p->n_dry_breakers && !s->brk) || (dry && !s->hist) || (typical_on(p) && !s->typ)) {
    sampler_free(s);
    return herr_set(err, HEARTH_ENOMEM, "sampler: out of memory for a vocabulary of %d", (int)n_vocab);
  }
  s->p.logit_bias = s->bias;
  s->p.dry_breakers = s->brk;
  if (!dry) s->p.n_dry_breakers = 0;
  s->mu = p->mirostat ? 2.0f * p->mirostat_tau : 0.0f;
  sample_rng_seed(&s->rng, p->seed);
  *out = s;
  return 0;
}

void sampler_free(sampler *s) {
  if (!s) return;
  free(s->bias);
  free(s->seen);
  free(s->seen_ids);
  free(s->counts);
  free(s->gen_ids);
  free(s->cands);
  free(s->brk);
  free(s->hist);
  free(s->dry_z);
  free(s->dry_runs);
  free(s->typ);
  free(s);
}

/* Appends id to a growing list. */
static bool list_push(int32_t **list, size_t *n, size_t *cap, int32_t id) {
  if (*n == *cap && !HGROW(*list, *cap, *n + 1)) return false;
  (*list)[(*n)++] = id;
  return true;
}

static void mark_seen(sampler *s, int32_t id) {
  if (s->seen[id]) return;
  if (list_push(&s->seen_ids, &s->n_seen, &s->cap_seen, id)) s->seen[id] = 1;
}

/* DRY's history: every id, the oldest dropped once twice the window is held. */
static void hist_push(sampler *s, int32_t id) {
  if (!s->hist) return;
  size_t win = s->p.dry_penalty_last_n > 0 ? (size_t)s->p.dry_penalty_last_n : 0;
  if (win && s->n_hist >= 2 * win + 64) {
    memmove(s->hist, s->hist + (s->n_hist - win), sizeof(int32_t) * win);
    s->n_hist = win;
  }
  if (s->n_hist == s->cap_hist && !HGROW(s->hist, s->cap_hist, s->n_hist + 1)) return;
  s->hist[s->n_hist++] = id;
}

void sampler_add_prompt(sampler *s, const int32_t *ids, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (ids[i] >= 0 && ids[i] < s->n_vocab) {
      mark_seen(s, ids[i]);
      hist_push(s, ids[i]);
    }
}

void sampler_accept(sampler *s, int32_t id) {
  if (id < 0 || id >= s->n_vocab) return;
  mark_seen(s, id);
  hist_push(s, id);
  if (s->counts[id] == 0 && !list_push(&s->gen_ids, &s->n_gen, &s->cap_gen, id)) return;
  s->counts[id]++;
}

/* ---- processing ----------------------------------------------------------- */

/* The breakers whose head is id: s->brk[*lo .. *hi). */
static void brk_range(const sampler *s, int32_t id, size_t *lo, size_t *hi) {
  size_t a = 0, b = s->p.n_dry_breakers;
  while (a < b) {
    size_t m = a + (b - a) / 2;
    if (s->brk[m].head < id) a = m + 1;
    else b = m;
  }
  *lo = *hi = a;
  while (*hi < s->p.n_dry_breakers && s->brk[*hi].head == id) ++*hi;
}

static int dry_run_cmp(const void *a, const void *b) {
  const dry_run *x = a, *y = b;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return (x->len < y->len) - (x->len > y->len); /* longest first */
}

/* DRY (see sample.h). h[0..n) is the window, newest last; r(i) = h[n - 1 - i]
 * reads it backwards. */
static void apply_dry(sampler *s, float *logits) {
  if (!s->hist) return;
  size_t n = s->n_hist;
  if (s->p.dry_penalty_last_n > 0 && n > (size_t)s->p.dry_penalty_last_n) n = (size_t)s->p.dry_penalty_last_n;
  size_t allowed = (size_t)s->p.dry_allowed_length;
  if (n <= allowed) return;
  const int32_t *h = s->hist + (s->n_hist - n);
#define R(i) h[n - 1 - (i)]
  /* 1. the most recent breaker caps how long a repeat may be: the tokens after it */
  size_t limit = n;
  for (size_t i = 0; i < n; i++) {
    size_t lo, hi;
    brk_range(s, R(i), &lo, &hi);
    long longest = -1;
    for (size_t b = lo; b < hi; b++) {
      long len = s->brk[b].n_tail;
      if (len <= longest || (size_t)len > i) continue;
      bool match = true;
      for (long o = 0; o < len && match; o++) match = s->brk[b].tail[o] == R(i - (size_t)o - 1);
      if (match) longest = len;
    }
    if (longest >= 0) {
      limit = i - (size_t)longest;
      break;
    }
  }
  if (limit < allowed) return;
  /* 2. z[k]: how many of the newest tokens also end k tokens earlier (the Z
   * function of the reversed window), linear time */
  if (n > s->cap_dry) {
    int32_t *z = realloc(s->dry_z, sizeof(int32_t) * n);
    if (z) s->dry_z = z;
    dry_run *r = z ? realloc(s->dry_runs, sizeof(dry_run) * n) : NULL;
    if (r) s->dry_runs = r, s->cap_dry = n;
    else return; /* out of memory: no DRY this step */
  }
  int32_t *z = s->dry_z;
  z[0] = (int32_t)n;
  size_t left = 0, right = 0; /* [left, right): the rightmost match window found */
  for (size_t k = 1; k < n; k++) {
    size_t len = 0;
    if (k < right) {
      len = right - k;
      if ((size_t)z[k - left] < len) len = (size_t)z[k - left];
    }
    while (k + len < n && R(len) == R(k + len)) len++;
    z[k] = (int32_t)len;
    if (k + len > right) left = k, right = k + len;
  }
  /* 3. the token after each earlier end of the repeat would extend it */
  size_t n_runs = 0;
  for (size_t k = 1; k < n; k++) {
    size_t len = (size_t)z[k] < limit ? (size_t)z[k] : limit;
    if (len >= allowed) s->dry_runs[n_runs++] = (dry_run){R(k - 1), (int32_t)len};
  }
#undef R
  if (n_runs == 0) return;
  qsort(s->dry_runs, n_runs, sizeof(dry_run), dry_run_cmp);
  /* 4. each token's longest run, penalised unless the token is a breaker on its own */
  int max_exp = 0;
  if (s->p.dry_base > 1.000001f) max_exp = (int)(88.7228391f / logf(s->p.dry_base));
  for (size_t i = 0; i < n_runs; i++) {
    if (i > 0 && s->dry_runs[i].id == s->dry_runs[i - 1].id) continue;
    int32_t id = s->dry_runs[i].id;
    size_t lo, hi;
    brk_range(s, id, &lo, &hi);
    bool single = false;
    for (size_t b = lo; b < hi && !single; b++) single = s->brk[b].n_tail == 0;
    if (single) continue;
    int e = s->dry_runs[i].len - (int)allowed;
    if (max_exp > 0 && e > max_exp) e = max_exp;
    logits[id] -= (float)((double)s->p.dry_multiplier * pow((double)s->p.dry_base, e));
  }
}

/* Penalties, DRY and bias, in place: the logits logprobs are reported from. */
static void apply_penalties(sampler *s, float *logits) {
  float r = s->p.repetition_penalty;
  if (r != 1.0f) {
    for (size_t i = 0; i < s->n_seen; i++) {
      float *l = &logits[s->seen_ids[i]];
      *l = *l < 0 ? *l * r : *l / r;
    }
  }
  float pres = s->p.presence_penalty, freq = s->p.frequency_penalty;
  if (pres != 0 || freq != 0) {
    for (size_t i = 0; i < s->n_gen; i++) {
      int32_t id = s->gen_ids[i];
      logits[id] -= pres + freq * (float)s->counts[id];
    }
  }
  apply_dry(s, logits);
  for (size_t i = 0; i < s->p.n_logit_bias; i++) logits[s->bias[i].id] += s->bias[i].bias;
}

void sampler_penalize(sampler *s, float *logits) { apply_penalties(s, logits); }

float sampler_mirostat_mu(const sampler *s) { return s->mu; }

/* NaN counts as -inf everywhere below. */
static bool usable(float x) { return x == x && x != -INFINITY; }

/* Greedy choice: the largest logit, lowest id on ties. -1 when none is usable. */
static int32_t argmax(const float *logits, int32_t n) {
  int32_t best = -1;
  float best_v = -INFINITY;
  for (int32_t i = 0; i < n; i++) {
    if (logits[i] > best_v) { /* false for NaN and -inf */
      best_v = logits[i];
      best = i;
    }
  }
  return best;
}

/* log-sum-exp over the usable logits (max is the largest of them). Terms in
 * float (each within an ulp), the sum in double. */
static double log_sum_exp(const float *logits, int32_t n, float max) {
  double sum = 0;
  for (int32_t i = 0; i < n; i++)
    if (usable(logits[i])) sum += expf(logits[i] - max);
  return (double)max + log(sum);
}

/* Fills out's logprob and top lists (want alternatives) from logits (n, the largest at best). */
static void row_logprobs(const float *logits, int32_t n, int32_t best, int want, sample_token *out) {
  double lse = log_sum_exp(logits, n, logits[best]);
  out->logprob = (float)((double)logits[out->id] - lse);
  if (!usable(logits[out->id])) out->logprob = -INFINITY;
  int have = 0;
  /* Insertion into a short descending list; ties keep the lower id first. */
  for (int32_t i = 0; i < n && want > 0; i++) {
    float v = logits[i];
    if (!usable(v)) continue;
    if (have == want && v <= out->top_logprobs[have - 1]) continue;
    int pos = have < want ? have++ : want - 1;
    while (pos > 0 && out->top_logprobs[pos - 1] < v) {
      out->top_logprobs[pos] = out->top_logprobs[pos - 1];
      out->top_ids[pos] = out->top_ids[pos - 1];
      pos--;
    }
    out->top_logprobs[pos] = v;
    out->top_ids[pos] = i;
  }
  out->n_top = have;
  for (int k = 0; k < have; k++) out->top_logprobs[k] = (float)((double)out->top_logprobs[k] - lse);
}

static void fill_logprobs(const sampler *s, const float *logits, int32_t best, sample_token *out) {
  row_logprobs(logits, s->n_vocab, best, s->p.top_logprobs, out);
}

int sample_row_logprobs(const float *logits, int32_t n, int32_t id, int n_top, sample_token *out, herr *err) {
  memset(out, 0, sizeof *out);
  if (n_top < 0 || n_top > SAMPLE_MAX_TOP_LOGPROBS || id < 0 || id >= n)
    return herr_set(err, HEARTH_EINVAL, "logprobs: token %d or %d alternatives out of range", (int)id, n_top);
  int32_t best = argmax(logits, n);
  if (best < 0) return herr_set(err, HEARTH_EINTERNAL, "logprobs: the logits row has no finite value");
  out->id = id;
  row_logprobs(logits, n, best, n_top, out);
  return 0;
}

/* Descending by value, then ascending id: a total order, so runs are reproducible. */
static int cand_desc(const void *a, const void *b) {
  const cand *x = a, *y = b;
  if (x->v != y->v) return x->v < y->v ? 1 : -1;
  return (x->id > y->id) - (x->id < y->id);
}

/* Min-heap on (v, then higher id is "smaller") for top-k selection. */
static bool heap_less(const cand *a, const cand *b) { return a->v < b->v || (a->v == b->v && a->id > b->id); }

static void heap_sift_down(cand *h, int32_t n, int32_t i) {
  for (;;) {
    int32_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < n && heap_less(&h[l], &h[m])) m = l;
    if (r < n && heap_less(&h[r], &h[m])) m = r;
    if (m == i) return;
    cand t = h[i];
    h[i] = h[m];
    h[m] = t;
    i = m;
  }
}

/* The k-th largest usable value of logits (k >= 1, k < number usable), using
 * scratch (k entries) as a heap. */
static float kth_largest(const float *logits, int32_t n, int32_t k, cand *scratch) {
  int32_t have = 0;
  for (int32_t i = 0; i < n; i++) {
    if (!usable(logits[i])) continue;
    cand c = {logits[i], i};
    if (have < k) {
      int32_t j = have++;
      scratch[j] = c;
      while (j > 0 && heap_less(&scratch[j], &scratch[(j - 1) / 2])) {
        cand t = scratch[j];
        scratch[j] = scratch[(j - 1) / 2];
        scratch[(j - 1) / 2] = t;
        j = (j - 1) / 2;
      }
    } else if (heap_less(&scratch[0], &c)) {
      scratch[0] = c;
      heap_sift_down(scratch, k, 0);
    }
  }
  return scratch[0].v;
}

static int typ_cmp(const void *a, const void *b) {
  const typ_cand *x = a, *y = b;
  if (x->score != y->score) return x->score < y->score ? -1 : 1;
  return (x->id > y->id) - (x->id < y->id);
}

/* Locally typical sampling over c[0..n) (unnormalised, total mass): the
 * candidates in order of |-log p - H|, the shortest prefix whose mass exceeds
 * typical_p. Returns the new count; c is rewritten in that order. */
static int32_t apply_typical(sampler *s, cand *c, int32_t n, double total) {
  if (n < 2) return n;
  double h = 0;
  for (int32_t i = 0; i < n; i++) {
    double p = c[i].v / total;
    if (p > 0) h -= p * log(p);
  }
  typ_cand *t = s->typ;
  for (int32_t i = 0; i < n; i++) {
    double p = c[i].v / total;
    t[i] = (typ_cand){.score = p > 0 ? (float)fabs(-log(p) - h) : INFINITY, .v = c[i].v, .id = c[i].id};
  }
  qsort(t, (size_t)n, sizeof(typ_cand), typ_cmp);
  double cum = 0, target = (double)s->p.typical_p;
  int32_t keep = n;
  for (int32_t i = 0; i < n; i++) {
    cum += t[i].v / total;
    if (cum > target) {
      keep = i + 1;
      break;
    }
  }
  for (int32_t i = 0; i < keep; i++) c[i] = (cand){.v = t[i].v, .id = t[i].id};
  return keep;
}

/* XTC over the kept candidates c[0..*n) of mass *mass: with its chance (one
 * uniform from the request's RNG), every candidate at or above the threshold
 * but the least probable of them is removed. */
static void apply_xtc(sampler *s, int32_t *n, double *mass) {
  if (!xtc_on(&s->p) || *n < 2) return;
  double u = sample_rng_uniform(&s->rng);
  if (u > (double)s->p.xtc_probability) return;
  cand *c = s->cands;
  double t = (double)s->p.xtc_threshold * *mass;
  int32_t above = 0, last = -1; /* last: the least probable at or above, the higher id on ties */
  for (int32_t i = 0; i < *n; i++) {
    if ((double)c[i].v < t) continue;
    above++;
    if (last < 0 || c[i].v < c[last].v || (c[i].v == c[last].v && c[i].id > c[last].id)) last = i;
  }
  if (above < 2) return;
  int32_t k = 0;
  double kept = 0;
  for (int32_t i = 0; i < *n; i++) {
    if ((double)c[i].v >= t && i != last) continue;
    c[k++] = c[i];
    kept += c[i].v;
  }
  *n = k;
  *mass = kept;
}

/* Mirostat 2's truncation of c[0..*n): the tokens with surprise -log2 p at
 * most mu, the most likely one when none is. */
static void apply_mirostat(sampler *s, int32_t *n, double *mass) {
  cand *c = s->cands;
  double total = *mass, kept = 0;
  int32_t k = 0, best = 0;
  for (int32_t i = 0; i < *n; i++) {
    if (c[i].v > c[best].v || (c[i].v == c[best].v && c[i].id < c[best].id)) best = i;
  }
  cand top = c[best];
  for (int32_t i = 0; i < *n; i++) {
    double p = c[i].v / total;
    if (p > 0 && -log2(p) <= (double)s->mu) {
      c[k++] = c[i];
      kept += c[i].v;
    }
  }
  if (k == 0) {
    c[k++] = top;
    kept = top.v;
  }
  *n = k;
  *mass = kept;
}

/* Builds the kept candidates after temperature, top-k, top-p, min-p and
 * typical-p (after temperature alone under mirostat), each with its
 * unnormalised probability (relative to the max, which is 1). Returns how
 * many were kept (>= 1) and their total mass in *mass. The kept candidates
 * are s->cands[0..n). */
static int32_t build_candidates(sampler *s, const float *logits, double *mass) {
  int32_t n_vocab = s->n_vocab;
  cand *c = s->cands;
  if (s->p.mirostat) { /* temperature only */
    float max = -INFINITY;
    int32_t n = 0;
    for (int32_t i = 0; i < n_vocab; i++)
      if (usable(logits[i])) {
        c[n++] = (cand){logits[i], i};
        if (logits[i] > max) max = logits[i];
      }
    double inv_t = 1.0 / s->p.temperature, total = 0;
    for (int32_t i = 0; i < n; i++) {
      c[i].v = expf((float)(((double)c[i].v - max) * inv_t));
      total += c[i].v;
    }
    *mass = total;
    return n;
  }
  /* top-k threshold on the raw order (temperature does not change it) */
  float floor_v = -INFINITY;
  bool have_floor = false;
  int32_t n_usable = 0;
  if (s->p.top_k > 0 && s->p.top_k < n_vocab)
    for (int32_t i = 0; i < n_vocab; i++) n_usable += usable(logits[i]);
  if (s->p.top_k > 0 && s->p.top_k < n_usable) {
    floor_v = kth_largest(logits, n_vocab, s->p.top_k, c);
    have_floor = true;
  }
  /* min-p in logit space: p / p_max < min_p  <=>  l < l_max + T log(min_p), so
   * those tokens are dropped before any exp (the exact test follows below).
   * Only without top-p, whose nucleus is taken over the mass min-p removes later. */
  if (s->p.min_p > 0 && s->p.top_p >= 1.0f) {
    float lmax = -INFINITY;
    for (int32_t i = 0; i < n_vocab; i++)
      if (usable(logits[i]) && logits[i] > lmax) lmax = logits[i];
    float cut = (float)((double)lmax + (double)s->p.temperature * log((double)s->p.min_p) - 1e-3);
    if (cut > floor_v) {
      floor_v = cut;
      have_floor = true;
    }
  }
  /* (l - l_max) / T: never above 0, so no temperature overflows the exp */
  double inv_t = 1.0 / s->p.temperature;
  int32_t n = 0;
  float max = -INFINITY;
  for (int32_t i = 0; i < n_vocab; i++) {
    float v = logits[i];
    if (!usable(v) || (have_floor && v < floor_v)) continue;
    c[n].v = v;
    c[n].id = i;
    if (v > max) max = v;
    n++;
  }
  double total = 0;
  float pmax = 0;
  for (int32_t i = 0; i < n; i++) {
    c[i].v = expf((float)(((double)c[i].v - max) * inv_t));
    total += c[i].v;
    if (c[i].v > pmax) pmax = c[i].v;
  }

  /* top-p: sort only what can matter. Candidates with p >= t form a prefix of
   * the descending order; once their mass reaches top_p the nucleus lies in them. */
  if (s->p.top_p < 1.0f && n > 1) {
    double target = (double)s->p.top_p * total;
    double t = pmax * 1e-4;
    int32_t m = n;
    for (;;) {
      double in_mass = 0;
      int32_t k = 0;
      for (int32_t i = 0; i < n; i++) {
        if (c[i].v >= t) {
          in_mass += c[i].v;
          cand tmp = c[k];
          c[k] = c[i];
          c[i] = tmp;
          k++;
        }
      }
      if (in_mass >= target || t == 0) {
        m = k;
        break;
      }
      t = t < 1e-30 ? 0 : t * 1e-4;
    }
    qsort(c, (size_t)m, sizeof(cand), cand_desc);
    double before = 0;
    int32_t keep = 0;
    while (keep < m && (keep == 0 || before < target)) before += c[keep++].v;
    n = keep;
  }

  /* min-p: relative to the largest probability, which is 1 here */
  if (s->p.min_p > 0) {
    float thresh = s->p.min_p * pmax;
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++)
      if (c[i].v >= thresh) c[k++] = c[i];
    if (k == 0) k = 1; /* cannot happen (the max passes), kept for safety */
    n = k;
  }

  double kept = 0;
  for (int32_t i = 0; i < n; i++) kept += c[i].v;
  if (typical_on(&s->p)) {
    n = apply_typical(s, c, n, kept);
    kept = 0;
    for (int32_t i = 0; i < n; i++) kept += c[i].v;
  }
  *mass = kept;
  return n;
}

/* The candidates a draw picks from: build_candidates, then XTC or mirostat's cut. */
static int32_t final_candidates(sampler *s, const float *logits, double *mass) {
  int32_t n = build_candidates(s, logits, mass);
  if (s->p.mirostat) apply_mirostat(s, &n, mass);
  else apply_xtc(s, &n, mass);
  return n;
}

static bool is_greedy(const sampler *s) { return s->p.greedy || s->p.temperature <= 0; }

int sampler_sample(sampler *s, float *logits, sample_token *out, herr *err) {
  memset(out, 0, sizeof *out);
  apply_penalties(s, logits);
  int32_t best = argmax(logits, s->n_vocab);
  if (best < 0) return herr_set(err, HEARTH_EINTERNAL, "sampler: the logits row has no finite value");
  if (is_greedy(s)) {
    out->id = best;
  } else {
    double mass;
    int32_t n = final_candidates(s, logits, &mass);
    double u = sample_rng_uniform(&s->rng) * mass;
    int32_t pick = n - 1;
    double acc = 0;
    for (int32_t i = 0; i < n; i++) {
      acc += s->cands[i].v;
      if (u < acc) {
        pick = i;
        break;
      }
    }
    out->id = s->cands[pick].id;
    if (s->p.mirostat) { /* mu follows the drawn token's surprise toward tau */
      double surprise = -log2(s->cands[pick].v / mass);
      s->mu -= s->p.mirostat_eta * (float)(surprise - (double)s->p.mirostat_tau);
    }
  }
  if (s->p.logprobs) fill_logprobs(s, logits, best, out);
  return 0;
}

int sampler_distribution(sampler *s, float *logits, float *probs, herr *err) {
  apply_penalties(s, logits);
  int32_t best = argmax(logits, s->n_vocab);
  if (best < 0) return herr_set(err, HEARTH_EINTERNAL, "sampler: the logits row has no finite value");
  memset(probs, 0, sizeof(float) * (size_t)s->n_vocab);
  if (is_greedy(s)) {
    probs[best] = 1;
    return 0;
  }
  double mass;
  int32_t n = final_candidates(s, logits, &mass);
  for (int32_t i = 0; i < n; i++) probs[s->cands[i].id] = (float)(s->cands[i].v / mass);
  return 0;
}

/* ---- speculative verification ------------------------------------------- */

/* The standard speculative-sampling step (Leviathan et al., Chen et al.): the
 * draft was drawn from q; keep it with probability min(1, p(d) / q(d)), else
 * draw from max(0, p - q) renormalised. Over the draft's randomness and this
 * step's, the token is distributed exactly as p. */
int sampler_verify(sampler *s, float *logits, int32_t draft, const float *q, sample_rng *rng, sample_token *out,
                   bool *accepted, herr *err) {
  memset(out, 0, sizeof *out);
  *accepted = false;
  apply_penalties(s, logits);
  int32_t best = argmax(logits, s->n_vocab);
  if (best < 0) return herr_set(err, HEARTH_EINTERNAL, "sampler: the logits row has no finite value");
  if (is_greedy(s)) {
    out->id = best;
    *accepted = best == draft;
  } else {
    double mass;
    int32_t n = build_candidates(s, logits, &mass);
    double pd = 0;
    for (int32_t i = 0; i < n; i++)
      if (s->cands[i].id == draft) pd = s->cands[i].v / mass;
    double qd = draft >= 0 && draft < s->n_vocab ? (q ? (double)q[draft] : 1.0) : 0.0;
    if (qd > 0 && pd > 0 && (pd >= qd || sample_rng_uniform(rng) * qd < pd)) {
      out->id = draft;
      *accepted = true;
    } else {
      /* the residual max(0, p - q): with a point-mass q, p without the draft */
      double rest = 0;
      for (int32_t i = 0; i < n; i++) {
        int32_t id = s->cands[i].id;
        double qi = q ? (double)q[id] : (id == draft ? 1.0 : 0.0);
        double r = s->cands[i].v / mass - qi;
        s->cands[i].v = r > 0 ? (float)r : 0.0f;
        rest += s->cands[i].v;
      }
      if (!(rest > 0)) { /* p == q to rounding: the acceptance above was certain */
        out->id = pd > 0 ? draft : best;
        *accepted = pd > 0;
      } else {
        double u = sample_rng_uniform(rng) * rest, acc = 0;
        int32_t pick = -1;
        for (int32_t i = 0; i < n; i++) {
          if (s->cands[i].v <= 0) continue;
          pick = i;
          acc += s->cands[i].v;
          if (u < acc) break;
        }
        out->id = s->cands[pick].id;
      }
    }
  }
  if (s->p.logprobs) fill_logprobs(s, logits, best, out);
  return 0;
}

bool sampler_is_greedy(const sampler *s) { return is_greedy(s); }

bool sampler_is_plain_greedy(const sampler *s) {
  return is_greedy(s) && s->p.repetition_penalty == 1.0f && s->p.presence_penalty == 0 &&
         s->p.frequency_penalty == 0 && s->p.n_logit_bias == 0 && !s->hist;
}

/* ---- the device path ------------------------------------------------------ */

static bool adj_push(bk_sample_adj **adj, size_t *n, size_t *cap, bk_sample_adj a) {
  if (*n == *cap && !HGROW(*adj, *cap, *n + 1)) return false;
  (*adj)[(*n)++] = a;
  return true;
}

int sampler_device_row(sampler *s, bk_sample_row *row, bk_sample_adj **adj, size_t *n_adj, size_t *cap, herr *err) {
  memset(row, 0, sizeof *row);
  if (sample_params_host_only(&s->p))
    return herr_set(err, HEARTH_EINTERNAL, "sampler: %s is sampled on the host only", sample_params_host_field(&s->p));
  bool greedy = is_greedy(s);
  row->temperature = greedy ? 0.0f : s->p.temperature;
  row->top_k = s->p.top_k;
  row->top_p = s->p.top_p;
  row->min_p = s->p.min_p;
  row->logprobs = s->p.logprobs;
  row->top_logprobs = s->p.logprobs ? s->p.top_logprobs : 0;
  if (!greedy) row->u = sample_rng_uniform(&s->rng);
  float r = s->p.repetition_penalty, pres = s->p.presence_penalty, freq = s->p.frequency_penalty;
  bool counts = pres != 0 || freq != 0;
  row->pen_off = (int32_t)*n_adj;
  if (r != 1.0f) {
    for (size_t i = 0; i < s->n_seen; i++) {
      int32_t id = s->seen_ids[i];
      float sub = counts && s->counts[id] > 0 ? pres + freq * (float)s->counts[id] : 0.0f;
      if (!adj_push(adj, n_adj, cap, (bk_sample_adj){.id = id, .rep = r, .sub = sub}))
        return herr_set(err, HEARTH_ENOMEM, "sampler: out of memory");
    }
  } else if (counts) {
    for (size_t i = 0; i < s->n_gen; i++) {
      int32_t id = s->gen_ids[i];
      if (!adj_push(adj, n_adj, cap, (bk_sample_adj){.id = id, .rep = 1.0f, .sub = pres + freq * (float)s->counts[id]}))
        return herr_set(err, HEARTH_ENOMEM, "sampler: out of memory");
    }
  }
  row->n_pen = (int32_t)(*n_adj - (size_t)row->pen_off);
  row->bias_off = (int32_t)*n_adj;
  for (size_t i = 0; i < s->p.n_logit_bias; i++)
    if (!adj_push(adj, n_adj, cap, (bk_sample_adj){.id = s->bias[i].id, .rep = 1.0f, .add = s->bias[i].bias}))
      return herr_set(err, HEARTH_ENOMEM, "sampler: out of memory");
  row->n_bias = (int32_t)(*n_adj - (size_t)row->bias_off);
  return 0;
}

void sampler_from_device(const sampler *s, const bk_sample_out *o, sample_token *out) {
  memset(out, 0, sizeof *out);
  out->id = o->id;
  if (!s->p.logprobs) return;
  out->logprob = o->logprob;
  out->n_top = o->n_top < s->p.top_logprobs ? o->n_top : s->p.top_logprobs;
  for (int k = 0; k < out->n_top; k++) {
    out->top_ids[k] = o->top_ids[k];
    out->top_logprobs[k] = o->top_logprobs[k];
  }
}
