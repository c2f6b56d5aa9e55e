/* denoise.c — block diffusion's denoising run (see denoise.h): the
 * encoder's forwards, the decoder's canvas passes, the linear temperature
 * schedule, the entropy-bound sampler, the stable-and-confident stop, and
 * the blocks committed as they become final. Sampling is on the host over
 * each step's logits rows; the model sees token ids and the
 * self-conditioning probabilities. */
#include "engine/denoise.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/ops.h"
#include "base/file.h"
#include "base/json.h"
#include "base/pool.h"
#include "engine/sample.h"

void denoise_params_default(denoise_params *p) {
  p->max_denoising_steps = 48;
  p->t_min = 0.4;
  p->t_max = 0.8;
  p->entropy_bound = 0.1;
  p->stability_threshold = 1;
  p->confidence_threshold = 0.005;
}

int denoise_params_check(const denoise_params *p, herr *err) {
  if (p->max_denoising_steps <= 0 || p->max_denoising_steps > 100000)
    return herr_set_at(err, HEARTH_EINVAL, "max_denoising_steps", HEARTH_CAUSE_NONE, "max_denoising_steps must be in 1..100000");
  if (!(p->t_min >= 0) || !(p->t_max > p->t_min) || !isfinite(p->t_max))
    return herr_set_at(err, HEARTH_EINVAL, "t_min", HEARTH_CAUSE_NONE, "the temperatures must satisfy 0 <= t_min < t_max");
  if (!(p->entropy_bound > 0) || !isfinite(p->entropy_bound))
    return herr_set_at(err, HEARTH_EINVAL, "entropy_bound", HEARTH_CAUSE_NONE, "entropy_bound must be a positive number");
  if (!isfinite(p->confidence_threshold))
    return herr_set_at(err, HEARTH_EINVAL, "confidence_threshold", HEARTH_CAUSE_NONE, "confidence_threshold must be finite");
  return 0;
}

int denoise_params_load(const char *dir, denoise_params *p, herr *err) {
  denoise_params_default(p);
  if (!hfile_is_dir(dir)) return 0;
  char *file = hpath_join(dir, "generation_config.json");
  if (!file) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  json_t *j = hfile_exists(file) ? hjson_load_file(file, err) : NULL;
  int rc = hfile_exists(file) && !j ? (err ? err->code : HEARTH_EFORMAT) : 0;
  free(file);
  if (!j) return rc;
  const json_t *v;
  if (json_is_integer(v = json_object_get(j, "max_denoising_steps"))) p->max_denoising_steps = (int)json_integer_value(v);
  if (json_is_number(v = json_object_get(j, "t_min"))) p->t_min = json_number_value(v);
  if (json_is_number(v = json_object_get(j, "t_max"))) p->t_max = json_number_value(v);
  if (json_is_integer(v = json_object_get(j, "stability_threshold"))) p->stability_threshold = (int)json_integer_value(v);
  if (json_is_number(v = json_object_get(j, "confidence_threshold"))) p->confidence_threshold = json_number_value(v);
  const json_t *sc = json_object_get(j, "sampler_config");
  if (json_is_number(v = json_object_get(sc, "entropy_bound"))) p->entropy_bound = json_number_value(v);
  json_decref(j);
  if ((rc = denoise_params_check(p, err))) return herr_wrap(err, "%s: generation_config.json", dir);
  return 0;
}

float denoise_temperature(const denoise_params *p, int step) {
  /* in float, as the reference computes it (a float tensor of the step number) */
  float frac = (float)step / (float)p->max_denoising_steps;
  return (float)p->t_min + (float)(p->t_max - p->t_min) * frac;
}

/* The checkpoint's dtype for the self-conditioning input: 0 f32, 1 bf16, 2 f16. */
static int sc_rounding(const model *m) {
  const char *dt = model_cfg(m)->torch_dtype;
  return !strcmp(dt, "bfloat16") ? 1 : !strcmp(dt, "float16") ? 2 : 0;
}

/* The reference hands the next step softmax(logits.to(dtype)).to(dtype), dtype the
   embedding's: x (one row over the temperature, its largest mx) and the probabilities
   each rounded to the checkpoint's type. */
static void sc_round_row(const float *x, int64_t V, float mx, int sc_round, float *pr) {
  float (*rnd)(float) = sc_round == 1 ? bk_round_bf16 : bk_round_f16;
  float rmx = rnd(mx);
  double rs = 0;
  for (int64_t v = 0; v < V; v++) rs += exp((double)rnd(x[v]) - (double)rmx);
  for (int64_t v = 0; v < V; v++) pr[v] = rnd((float)(exp((double)rnd(x[v]) - (double)rmx) / rs));
}

void denoise_self_cond(const model *m, const float *logits, int64_t rows, float temp, float *probs) {
  int64_t V = model_vocab_size(m);
  int sc_round = sc_rounding(m);
  for (int64_t i = 0; i < rows; i++) {
    float *x = probs + i * V, mx = -INFINITY; /* the row over the temperature, then its probabilities in place */
    for (int64_t v = 0; v < V; v++)
      if ((x[v] = logits[i * V + v] / temp) > mx) mx = x[v];
    if (sc_round) {
      sc_round_row(x, V, mx, sc_round, x);
      continue;
    }
    double sum = 0;
    for (int64_t v = 0; v < V; v++) sum += exp((double)x[v] - (double)mx);
    double lse = (double)mx + log(sum);
    for (int64_t v = 0; v < V; v++) x[v] = (float)(exp((double)x[v] - lse));
  }
}

typedef enum { PHASE_ENCODE, PHASE_DENOISE, PHASE_DONE } phase;

/* Canvases of at least this many logits are sampled on up to this many threads. */
#define DENOISE_POOL_MIN (1 << 15)
#define DENOISE_POOL_THREADS 8

struct denoise_run {
  model *m;
  const gen_request *req;   /* borrowed */
  denoise_params p;
  denoise_draws draws;
  sample_rng rng;
  kv_seq *kv;               /* borrowed */
  int64_t C, V, max_blocks, blocks;
  phase ph;
  const int32_t *enc;       /* what the encoder still has to read: the prompt, or the last block */
  int64_t enc_n, enc_at;
  int cur_step;             /* max_denoising_steps .. 1 */
  bool have_sc;
  int sc_round;             /* the checkpoint's dtype for the self-conditioning input: 0 f32, 1 bf16, 2 f16 */
  int32_t *canvas, *argmax, *sampled, *block, *history; /* [C] each; history [stability * C] */
  int64_t hist_n;
  float *logits, *sc;       /* [C, V] */
  double *entropy, *lp, *u; /* [C] */
  bool *keep;               /* [C] */
  float temp;               /* this step's temperature */
  hpool *pool;              /* owned, NULL: the positions one after another (small canvases) */
  int64_t *order;           /* [C] */
  denoise_stats stats;
};

static int32_t draw_token(denoise_run *r) {
  if (r->draws.token) return r->draws.token(r->draws.ctx, r->V);
  return (int32_t)(sample_rng_uniform(&r->rng) * (double)r->V);
}

static double draw_uniform(denoise_run *r) {
  if (r->draws.uniform) return r->draws.uniform(r->draws.ctx);
  return sample_rng_uniform(&r->rng);
}

int64_t denoise_kv_rows(const model *m, int64_t n_prompt, int64_t max_new) {
  int64_t C = model_canvas_length(m);
  if (C <= 0) return n_prompt + max_new;
  return n_prompt + (max_new + C - 1) / C * C;
}

void denoise_run_free(denoise_run *r) {
  if (!r) return;
  free(r->canvas);
  free(r->argmax);
  free(r->sampled);
  free(r->block);
  free(r->history);
  free(r->logits);
  free(r->sc);
  free(r->entropy);
  free(r->lp);
  free(r->order);
  free(r->keep);
  free(r->u);
  if (r->pool) hpool_destroy(r->pool);
  free(r);
}

int denoise_run_new(model *m, const gen_request *req, const denoise_params *p, const denoise_draws *draws, kv_seq *kv,
                    int64_t max_new, denoise_run **out, herr *err) {
  *out = NULL;
  int64_t C = model_canvas_length(m);
  if (C <= 0) return herr_set(err, HEARTH_EUNSUPPORTED, "denoise: the model is not a block-diffusion model");
  if (!req->prompt || req->n_prompt == 0) return herr_set(err, HEARTH_EINVAL, "denoise: the prompt has no tokens");
  denoise_params defaults;
  if (!p) {
    denoise_params_default(&defaults);
    p = &defaults;
  }
  int rc = denoise_params_check(p, err);
  if (rc) return rc;
  denoise_run *r = calloc(1, sizeof *r);
  if (!r) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  r->m = m, r->req = req, r->p = *p, r->kv = kv, r->C = C, r->V = model_vocab_size(m);
  r->sc_round = sc_rounding(m);
  if (draws) r->draws = *draws;
  sample_rng_seed(&r->rng, req->sample.seed);
  r->max_blocks = (max_new + C - 1) / C;
  r->hist_n = p->stability_threshold > 0 ? p->stability_threshold : 0;
  size_t cv = (size_t)C * (size_t)r->V;
  r->canvas = malloc(sizeof(int32_t) * (size_t)C);
  r->argmax = malloc(sizeof(int32_t) * (size_t)C);
  r->sampled = malloc(sizeof(int32_t) * (size_t)C);
  r->block = malloc(sizeof(int32_t) * (size_t)C);
  r->history = malloc(sizeof(int32_t) * (size_t)(C * (r->hist_n ? r->hist_n : 1)));
  r->logits = malloc(sizeof(float) * cv);
  r->sc = malloc(sizeof(float) * cv);
  r->entropy = malloc(sizeof(double) * (size_t)C);
  r->lp = malloc(sizeof(double) * (size_t)C);
  r->order = malloc(sizeof(int64_t) * (size_t)C);
  r->keep = malloc(sizeof(bool) * (size_t)C);
  r->u = malloc(sizeof(double) * (size_t)C);
  if (!r->u || !r->keep || !r->canvas || !r->argmax || !r->sampled || !r->block || !r->history || !r->logits || !r->sc || !r->entropy || !r->lp ||
      !r->order) {
    denoise_run_free(r);
    return herr_set(err, HEARTH_ENOMEM, "denoise: out of memory for a canvas of %lld × %lld logits", (long long)C,
                    (long long)r->V);
  }
  /* a canvas of many large rows is sampled on a few threads of the run's own */
  if (C > 1 && C * r->V >= DENOISE_POOL_MIN) {
    int n = hpool_cpu_count();
    r->pool = hpool_create(n < DENOISE_POOL_THREADS ? n : DENOISE_POOL_THREADS); /* NULL: one thread */
  }
  r->ph = r->max_blocks > 0 ? PHASE_ENCODE : PHASE_DONE;
  r->enc = req->prompt, r->enc_n = (int64_t)req->n_prompt, r->enc_at = 0;
  *out = r;
  return 0;
}

void denoise_run_stats(const denoise_run *r, denoise_stats *out) { *out = r->stats; }

static void start_block(denoise_run *r) {
  for (int64_t i = 0; i < r->C; i++) r->canvas[i] = draw_token(r);
  r->cur_step = r->p.max_denoising_steps;
  r->have_sc = false;
  for (int64_t i = 0; i < r->C * r->hist_n; i++) r->history[i] = -1;
  r->ph = PHASE_DENOISE;
}

/* order[0..n) sorted by ascending e[] (ties by position). */
static void sort_by_entropy(int64_t *order, int64_t n, const double *e) {
  for (int64_t i = 1; i < n; i++) {
    int64_t x = order[i], j = i;
    for (; j > 0 && (e[order[j - 1]] > e[x] || (e[order[j - 1]] == e[x] && order[j - 1] > x)); j--) order[j] = order[j - 1];
    order[j] = x;
  }
}

/* Position i of a step: its logits over the temperature, entropy, argmax and
 * its logprob, the probabilities (the next step's self-conditioning), and the
 * denoiser's sample — the first token whose cumulative probability exceeds
 * u × the total, u drawn beforehand in position order. */
static void denoise_position(void *ctx, int pos, int tid) {
  (void)tid;
  denoise_run *r = ctx;
  int64_t i = pos, V = r->V;
  float tf = r->temp;
  float *x = r->logits + i * V, *pr = r->sc + i * V;
  float mx = -INFINITY;
  int32_t am = 0;
  for (int64_t v = 0; v < V; v++) {
    x[v] = x[v] / tf;
    if (x[v] > mx) mx = x[v], am = (int32_t)v;
  }
  double sum = 0, dot = 0;
  for (int64_t v = 0; v < V; v++) {
    double e = exp((double)x[v] - (double)mx);
    sum += e;
    dot += e * (double)x[v];
  }
  double lse = (double)mx + log(sum);
  r->entropy[i] = lse - dot / sum;
  r->argmax[i] = am;
  r->lp[i] = (double)x[am] - lse;
  double total = 0;
  for (int64_t v = 0; v < V; v++) {
    pr[v] = (float)(exp((double)x[v] - lse));
    total += pr[v];
  }
  double target = r->u[i] * total, acc = 0;
  int32_t pick = (int32_t)(V - 1);
  for (int64_t v = 0; v < V; v++) {
    acc += pr[v];
    if (acc > target) {
      pick = (int32_t)v;
      break;
    }
  }
  r->sampled[i] = pick;
  if (r->sc_round) sc_round_row(x, V, mx, r->sc_round, pr);
}

/* One denoising step's sampling over r->logits; true when the block is final. */
static bool denoise_logits(denoise_run *r) {
  int64_t C = r->C;
  r->temp = denoise_temperature(&r->p, r->cur_step);
  for (int64_t i = 0; i < C; i++) r->u[i] = draw_uniform(r);
  if (r->draws.logits) r->draws.logits(r->draws.ctx, r->cur_step, r->logits, C, r->V);
  if (r->pool) hpool_for(r->pool, (int)C, denoise_position, r);
  else
    for (int64_t i = 0; i < C; i++) denoise_position(r, (int)i, 0);
  double mean_entropy = 0;
  for (int64_t i = 0; i < C; i++) mean_entropy += r->entropy[i];
  mean_entropy /= (double)C;
  /* entropy-bound acceptance: the lowest-entropy positions while sum - max <= bound */
  for (int64_t i = 0; i < C; i++) r->order[i] = i;
  sort_by_entropy(r->order, C, r->entropy);
  double cum = 0;
  bool *keep = r->keep;
  for (int64_t k = 0; k < C; k++) {
    double e = r->entropy[r->order[k]];
    cum += e;
    keep[r->order[k]] = cum - e <= r->p.entropy_bound;
  }
  /* renoising: every position not kept gets a random token (a full canvas is drawn) */
  for (int64_t i = 0; i < C; i++) {
    int32_t t = draw_token(r);
    r->canvas[i] = keep[i] ? r->sampled[i] : t;
  }
  /* stable and confident */
  bool finished = false;
  if (r->p.stability_threshold >= 0 && r->p.confidence_threshold > 0) {
    bool stable = true;
    for (int64_t h = 0; h < r->hist_n && stable; h++) stable = !memcmp(r->history + h * C, r->argmax, sizeof(int32_t) * (size_t)C);
    if (r->hist_n) {
      memmove(r->history, r->history + C, sizeof(int32_t) * (size_t)(C * (r->hist_n - 1)));
      memcpy(r->history + C * (r->hist_n - 1), r->argmax, sizeof(int32_t) * (size_t)C);
    }
    finished = stable && mean_entropy < r->p.confidence_threshold;
  }
  r->have_sc = true; /* sc holds softmax(these logits) for the next step */
  if (r->draws.step) r->draws.step(r->draws.ctx, r->cur_step, r->argmax, r->canvas, C);
  r->stats.steps++;
  r->cur_step--;
  if (finished && r->cur_step > 0) r->stats.early_stops++;
  return finished || r->cur_step == 0;
}

bool denoise_run_encoding(const denoise_run *r) { return r->ph == PHASE_ENCODE && r->blocks == 0; }

int denoise_run_step(denoise_run *r, gen_commit_fn commit, void *ctx, bool *done, herr *err) {
  *done = false;
  int rc;
  if (r->ph == PHASE_DONE) {
    *done = true;
    return 0;
  }
  if (r->ph == PHASE_ENCODE) {
    int chunk = r->req->prefill_chunk > 0 ? r->req->prefill_chunk : GEN_DEFAULT_PREFILL_CHUNK;
    int64_t n = r->enc_n - r->enc_at < chunk ? r->enc_n - r->enc_at : chunk;
    model_seq s = {.kv = r->kv, .tokens = r->enc + r->enc_at, .n_tokens = (int)n, .out = MODEL_OUT_NONE,
                   .lora = r->req->lora, .n_lora = r->req->n_lora};
    model_batch b = {.seqs = &s, .n_seqs = 1};
    if ((rc = model_forward(r->m, &b, NULL, err))) return rc;
    r->enc_at += n;
    if (r->enc_at == r->enc_n) start_block(r);
    return 0;
  }
  model_seq s = {.kv = r->kv, .tokens = r->canvas, .n_tokens = (int)r->C, .all_logits = true, .canvas = true,
                 .self_cond = r->have_sc ? r->sc : NULL, .lora = r->req->lora, .n_lora = r->req->n_lora};
  model_batch b = {.seqs = &s, .n_seqs = 1};
  if ((rc = model_forward(r->m, &b, r->logits, err))) return rc;
  if (!denoise_logits(r)) return 0;
  /* the block is final: commit it, then encode it for the next one */
  memcpy(r->block, r->argmax, sizeof(int32_t) * (size_t)r->C);
  r->blocks++;
  r->stats.blocks++;
  for (int64_t i = 0; i < r->C; i++) {
    sample_token st = {.id = r->block[i], .logprob = (float)r->lp[i]};
    if (commit(ctx, &st)) { /* the request ended there: the commit may have freed the run */
      *done = true;
      return 0;
    }
  }
  if (r->blocks >= r->max_blocks) {
    r->ph = PHASE_DONE;
    *done = true;
    return 0;
  }
  r->ph = PHASE_ENCODE;
  r->enc = r->block, r->enc_n = r->C, r->enc_at = 0;
  return 0;
}
