/* denoise.h — block diffusion (DiffusionGemma) as a generation method:
 * the denoising run of one request, following transformers'
 * generation_diffusion_gemma.py.
 *
 *   encode the prompt (causal forward, fills the KV cache)
 *   per block of canvas_length tokens:
 *     canvas = random tokens; self-conditioning = none
 *     for step = max_denoising_steps .. 1:
 *       logits = the decoder's canvas pass (bidirectional over the canvas, reading the cache)
 *       logits /= t_min + (t_max - t_min) * step / max_denoising_steps   (linear temperature schedule)
 *       sample one token per position (inverse CDF of a uniform); argmax per position
 *       entropy-bound acceptance: the k lowest-entropy positions with
 *         sum of their entropies - the largest of them <= entropy_bound
 *         keep their sampled tokens; every other position gets a random token
 *       stop early when the argmax canvas equals the last stability_threshold ones
 *         and the mean entropy is below confidence_threshold
 *       the next step's self-conditioning = softmax of these logits
 *     the block is the last argmax canvas: its tokens are committed (EOS, stop
 *     strings and max_tokens end the request there), then encoded, and the next
 *     block starts
 *
 * A run does one forward per denoise_run_step — the scheduler (sched.h)
 * steps every running one once per engine step, beside its batch — so
 * cancellation lands between denoising steps; denoise_run_free releases
 * everything, also mid-way. The random draws (the canvases' random tokens,
 * the samples' uniforms) come from the request's seeded RNG, or from a
 * caller's source (the golden test replays the reference's draws).
 */
#ifndef HEARTH_ENGINE_DENOISE_H
#define HEARTH_ENGINE_DENOISE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/request.h"
#include "engine/method.h"
#include "model/kv.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

typedef struct denoise_params {
  int max_denoising_steps;    /* per block (default 48) */
  double t_min, t_max;        /* the temperature at the last and the first step (0.4, 0.8) */
  double entropy_bound;       /* the sampler's bound (0.1) */
  int stability_threshold;    /* steps the argmax canvas must repeat (1); < 0: no early stop */
  double confidence_threshold; /* mean entropy below which a stable canvas stops (0.005); <= 0: no early stop */
} denoise_params;

/* transformers' defaults (DiffusionGemmaGenerationConfig). */
void denoise_params_default(denoise_params *p);
/* Names the bad field. */
int denoise_params_check(const denoise_params *p, herr *err);
/* The model folder dir's generation_config.json (max_denoising_steps, t_min, t_max,
 * sampler_config.entropy_bound, stability_threshold, confidence_threshold) over the
 * defaults; a file (GGUF) or a folder without one: the defaults. */
int denoise_params_load(const char *dir, denoise_params *p, herr *err);
/* The linear schedule's temperature at step (max_denoising_steps down to 1). */
float denoise_temperature(const denoise_params *p, int step);
/* The self-conditioning input of the step after one whose logits (rows × vocab, before
 * the temperature) these are, as the reference forms it: softmax(logits / temp) per
 * row, in the checkpoint's dtype where that is bf16 or f16. */
void denoise_self_cond(const model *m, const float *logits, int64_t rows, float temp, float *probs);

/* A source of the random draws (the reference's torch.randint and the
 * multinomial's uniforms), an observer of each step and a processor of its
 * logits; every field may be NULL. */
typedef struct denoise_draws {
  int32_t (*token)(void *ctx, int64_t vocab); /* uniform in [0, vocab) */
  double (*uniform)(void *ctx);               /* uniform in [0, 1) */
  /* after each denoising step: its number (max_denoising_steps down to 1), the argmax canvas and
     the next canvas, n tokens each */
  void (*step)(void *ctx, int step, const int32_t *argmax, const int32_t *next, int64_t n);
  void *ctx;
  /* before each denoising step's sampling: its number and the decoder's logits, rows × vocab
     floats before the temperature, which it may change (a logits processor, applied first as
     the reference applies a caller's) */
  void (*logits)(void *ctx, int step, float *logits, int64_t rows, int64_t vocab);
} denoise_draws;

typedef struct denoise_run denoise_run;

/* A run for req on a diffusion model (model_canvas_length > 0), its KV in kv
 * (borrowed, empty). max_new: the tokens it may commit (gen_check_context);
 * blocks are whole, so the cache needs n_prompt + ceil(max_new / canvas)
 * × canvas rows. p may be NULL (the defaults); draws may be NULL (the request's RNG, req->sample.seed). */
int denoise_run_new(model *m, const gen_request *req, const denoise_params *p, const denoise_draws *draws, kv_seq *kv,
                    int64_t max_new, denoise_run **out, herr *err);
void denoise_run_free(denoise_run *r);

/* One forward: a chunk of the encoding (the prompt, or the last block), or
 * one denoising step; when a block becomes final, its tokens are committed
 * in order through commit until it reports the end. *done: nothing left (the
 * request ended, or the last block was committed). Once commit reports the
 * end, the step returns at once without touching the run again (the commit
 * may free it). */
int denoise_run_step(denoise_run *r, gen_commit_fn commit, void *ctx, bool *done, herr *err);

/* Whether the run is still encoding its prompt (its first block not begun). */
bool denoise_run_encoding(const denoise_run *r);

typedef struct denoise_stats {
  int64_t blocks;          /* blocks committed */
  int64_t steps;           /* denoising steps (decoder forwards) */
  int64_t early_stops;     /* blocks the stable-and-confident criterion ended before the last step */
} denoise_stats;
void denoise_run_stats(const denoise_run *r, denoise_stats *out);

/* Rows of KV the run needs: n_prompt + whole blocks covering max_new. */
int64_t denoise_kv_rows(const model *m, int64_t n_prompt, int64_t max_new);

#endif
