/* sample.h — choosing the next token from a row of logits.
 *
 * A sampler is per request: it holds the parameters, the request's RNG and
 * the token history the penalties need. Processing order (Hugging Face's,
 * with the OpenAI penalties and logit bias slotted in before temperature):
 *
 *   repetition penalty  HF: over the set of tokens in prompt + output, a
 *                       positive logit is divided by r, a negative one
 *                       multiplied by r.
 *   presence/frequency  OpenAI: over generated tokens only,
 *                       logit -= presence * (count > 0) + frequency * count.
 *   logit bias          logit += bias[id].
 *   ---- logprobs are reported here (see below) ----
 *   temperature         logit /= T; T == 0 or greedy → argmax.
 *   top-k               keep the k largest (ties with the k-th are kept).
 *   top-p               keep the smallest prefix of the descending order whose
 *                       mass reaches p (HF: drop a token when the mass of the
 *                       tokens ranked strictly above it is already >= p).
 *   min-p               drop tokens with prob < min_p * max prob.
 *   typical-p           locally typical sampling (Meister et al.; llama.cpp's
 *                       typical): over the kept candidates renormalised, with
 *                       H their entropy, order by |-log p - H| ascending and
 *                       keep the shortest prefix whose mass exceeds typical_p.
 *   XTC                 exclude top choices (llama.cpp's xtc): with chance
 *                       xtc_probability (a uniform u from the request's RNG,
 *                       applied when u <= xtc_probability), of the kept
 *                       candidates whose renormalised probability is >=
 *                       xtc_threshold, all but the least probable are removed
 *                       (nothing when fewer than two reach it; off when the
 *                       threshold is above 0.5).
 *
 * DRY ("don't repeat yourself", llama.cpp's dry, after koboldcpp) slots in
 * with the penalties, after presence/frequency and before logit bias: over the
 * last dry_penalty_last_n tokens of prompt + output (all of them for -1), a
 * token that would extend a run repeating an earlier one — the run being the
 * longest suffix of the history that also ends earlier at a place this token
 * followed, at most as long as the history since the last sequence breaker —
 * of length L >= dry_allowed_length gets
 *     logit -= dry_multiplier * dry_base ^ (L - dry_allowed_length)
 * (the exponent capped so the power stays finite). A token that is a
 * one-token sequence breaker is never penalised. Breakers are token
 * sequences (sample_dry_breaker): a head token and the tokens that must
 * follow it; engine/dry_breakers.c makes them from strings as llama.cpp does.
 *
 * Mirostat 2 (mirostat = 2, llama.cpp's mirostat-v2) replaces the truncation
 * steps after temperature (top-k, top-p, min-p, typical-p, XTC are not
 * applied, as in llama.cpp): keep the tokens whose surprise -log2 p is at
 * most mu (the most likely one when none is), draw from them renormalised,
 * then mu -= eta * (surprise of the drawn token in that renormalised set -
 * tau). mu starts at 2 tau.
 *
 * Logprobs: the log-softmax of the logits after penalties and logit bias and
 * before temperature and truncation — the model's distribution as the request
 * shaped it, independent of how randomly it is then sampled, so greedy and
 * sampled runs report the same numbers for the same logits. Without penalties
 * or bias this is exactly vLLM's default (raw_logprobs: the model's
 * log-softmax); unlike vLLM's processed modes it leaves temperature and
 * top-k/p/min-p out, so truncated tokens keep finite logprobs.
 *
 * The RNG is xoshiro256** seeded through splitmix64: the same seed, logits and
 * parameters give the same tokens on every machine.
 */
#ifndef HEARTH_ENGINE_SAMPLE_H
#define HEARTH_ENGINE_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/status.h"

#define SAMPLE_MAX_TOP_LOGPROBS 20

typedef struct sample_bias {
  int32_t id;
  float bias;
} sample_bias;

/* A DRY sequence breaker: head, then n_tail tokens that must follow it. */
#define SAMPLE_DRY_MAX_TAIL 20
typedef struct sample_dry_breaker {
  int32_t head;
  int32_t n_tail;
  int32_t tail[SAMPLE_DRY_MAX_TAIL];
} sample_dry_breaker;

typedef struct sample_params {
  bool greedy;               /* argmax (also when temperature <= 0) */
  float temperature;         /* 1 = unchanged */
  int32_t top_k;             /* <= 0 = off */
  float top_p;               /* >= 1 = off */
  float min_p;               /* <= 0 = off */
  float repetition_penalty;  /* 1 = off; must be > 0 */
  float presence_penalty;    /* 0 = off */
  float frequency_penalty;   /* 0 = off */
  const sample_bias *logit_bias; /* borrowed (copied by sampler_new) */
  size_t n_logit_bias;
  float typical_p;           /* >= 1 = off */
  float xtc_probability;     /* <= 0 = off */
  float xtc_threshold;       /* > 0.5 = off */
  float dry_multiplier;      /* 0 = off */
  float dry_base;            /* >= 1 */
  int32_t dry_allowed_length; /* >= 0 */
  int32_t dry_penalty_last_n; /* tokens of history scanned: 0 = off, -1 = all */
  const sample_dry_breaker *dry_breakers; /* borrowed (copied by sampler_new) */
  size_t n_dry_breakers;
  int mirostat;              /* 0 = off, 2 = mirostat 2 */
  float mirostat_tau;        /* target surprise in bits */
  float mirostat_eta;        /* learning rate */
  bool logprobs;             /* compute the chosen token's logprob (and top_logprobs alternatives) */
  int top_logprobs;          /* 0..SAMPLE_MAX_TOP_LOGPROBS alternatives to report */
  uint64_t seed;
} sample_params;

/* llama.cpp's defaults for the samplers it defines, written once here:
 * sample_params_default and hearth_gen_params_init take them. */
#define SAMPLE_DEFAULT_TYPICAL_P 1.0
#define SAMPLE_DEFAULT_XTC_THRESHOLD 0.1
#define SAMPLE_DEFAULT_DRY_BASE 1.75
#define SAMPLE_DEFAULT_DRY_ALLOWED_LENGTH 2
#define SAMPLE_DEFAULT_DRY_PENALTY_LAST_N 64
#define SAMPLE_DEFAULT_MIROSTAT_TAU 5.0
#define SAMPLE_DEFAULT_MIROSTAT_ETA 0.1

/* Neutral parameters: greedy off, temperature 1, every filter and penalty off
 * (DRY's base, allowed length and window, XTC's threshold and mirostat's tau
 * and eta at llama.cpp's defaults, above). */
void sample_params_default(sample_params *p);

/* A model's defaults: the neutral ones with generation_config.json's
 * (do_sample, temperature, top_k, top_p, min_p, repetition_penalty; HF's
 * values when the file has none). A request's fields go over these once
 * (the library's hearth_gen_params), and the sampler takes the result. */
struct generation_config;
void sample_params_model_default(sample_params *p, const struct generation_config *g);

/* Whether p asks for a step only the host sampler runs (DRY, typical-p, XTC,
 * mirostat): such rows are sampled on the host, and the request decodes
 * without drafts. */
bool sample_params_host_only(const sample_params *p);
/* The request field of the first such step p asks for ("dry_multiplier",
 * "typical_p", "xtc_probability", "mirostat"), NULL when none. */
const char *sample_params_host_field(const sample_params *p);

typedef struct sample_token {
  int32_t id;
  float logprob;             /* of id, see the header comment (0 unless params.logprobs) */
  int n_top;                 /* entries in top_* (top_logprobs, fewer if the vocabulary is smaller) */
  int32_t top_ids[SAMPLE_MAX_TOP_LOGPROBS];
  float top_logprobs[SAMPLE_MAX_TOP_LOGPROBS];   /* descending */
} sample_token;

typedef struct sampler sampler;

/* Validates p (names the bad parameter) and makes a sampler for a vocabulary
 * of n_vocab logits. Bias ids outside the vocabulary are an error. */
int sampler_new(int32_t n_vocab, const sample_params *p, sampler **out, herr *err);
void sampler_free(sampler *s);

/* History: prompt tokens count for the repetition penalty only; accepted
 * (generated) tokens count for all three penalties. Ids outside the
 * vocabulary are ignored. */
void sampler_add_prompt(sampler *s, const int32_t *ids, size_t n);
void sampler_accept(sampler *s, int32_t id);

/* The penalties, DRY and logit bias applied to logits in place: the logits
 * logprobs are reported from. */
void sampler_penalize(sampler *s, float *logits);

/* Mirostat 2's mu now (0 when mirostat is off). */
float sampler_mirostat_mu(const sampler *s);

/* Picks the next token. logits (n_vocab floats) is used as scratch and left
 * modified. Does not call sampler_accept. */
int sampler_sample(sampler *s, float *logits, sample_token *out, herr *err);

/* The distribution sampler_sample draws from, written as probabilities into
 * probs (n_vocab; 0 for removed tokens; one 1 for greedy). For tests and
 * diagnostics; logits is used as scratch. With XTC, its chance is drawn from
 * the request's RNG as sampler_sample draws it; mirostat's mu is read, not
 * moved. */
int sampler_distribution(sampler *s, float *logits, float *probs, herr *err);

/* The RNG on its own (xoshiro256**, splitmix64-seeded). */
typedef struct sample_rng {
  uint64_t s[4];
} sample_rng;
void sample_rng_seed(sample_rng *r, uint64_t seed);
uint64_t sample_rng_next(sample_rng *r);
/* Uniform in [0, 1) with 53 random bits. */
double sample_rng_uniform(sample_rng *r);

/* Speculative decoding: verifies a drafted token against this row (logits
 * used as scratch, as sampler_sample). q is the distribution the draft was
 * drawn from (n_vocab probabilities), NULL for a deterministic draft (a point
 * mass: prompt lookup, or any draft of a greedy request). Greedy: the argmax,
 * accepted when it is the draft. Sampled: the draft is kept with probability
 * min(1, p(d) / q(d)), p being the distribution sampler_sample draws from;
 * otherwise a token is drawn from max(0, p - q) renormalised — so the token
 * out is distributed exactly as p. The uniforms come from rng (the caller's),
 * not the sampler's. out's logprobs are this row's, as sampler_sample's.
 * Does not call sampler_accept. */
int sampler_verify(sampler *s, float *logits, int32_t draft, const float *q, sample_rng *rng, sample_token *out,
                   bool *accepted, herr *err);
/* Whether the sampler picks the argmax (greedy, or temperature 0). */
bool sampler_is_greedy(const sampler *s);
/* Greedy with no penalty and no logit bias: the token is the argmax of the
 * model's row itself, whatever came before (so a row's token can be chosen
 * before the tokens ahead of it are known: speculative verification on the
 * device). */
bool sampler_is_plain_greedy(const sampler *s);

/* Sampling on the device (backend.h's bk_sample): the row parameters for this
 * sampler's next token, with its penalty and bias entries appended to *adj
 * (grown as needed; *n_adj entries of *cap). Draws the request's uniform
 * exactly when sampler_sample would, so a request's RNG advances the same way
 * on either path. Greedy requests and temperature 0 give a greedy row. */
int sampler_device_row(sampler *s, bk_sample_row *row, bk_sample_adj **adj, size_t *n_adj, size_t *cap, herr *err);
/* The log-softmax of a raw logits row (n floats): id's log-probability and the
 * n_top (0..SAMPLE_MAX_TOP_LOGPROBS) likeliest tokens into out (out->id = id).
 * HEARTH_EINTERNAL when the row has no finite value. */
int sample_row_logprobs(const float *logits, int32_t n, int32_t id, int n_top, sample_token *out, herr *err);

/* A device result as a sample_token (logprobs only when the sampler asks for them). */
void sampler_from_device(const sampler *s, const bk_sample_out *o, sample_token *out);


#endif
