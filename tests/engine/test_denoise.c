/* test_denoise.c — DiffusionGemma against transformers
 * (tests/fixtures/golden/diffusion_gemma-f32, made by
 * tools/gen_diffusion_golden.py): the decoder's logits for a given prompt
 * and canvas, without and with self-conditioning, against the float64
 * reference; generations (block diffusion, an EOS inside a block) replaying
 * the reference's random draws, whole and block by block from the
 * reference's earlier blocks, step for step as far as rounding lets any
 * implementation follow them (see "whole generations against the
 * reference's" for why and how far); an EOS inside a block; the
 * stable-and-confident stop; tokens arriving a block at a time;
 * cancellation between denoising steps; a bfloat16 checkpoint's rounded
 * self-conditioning input; a causal model refused. The runs are driven
 * alone (denoise_alone, here); the scheduler's stepping of them is tested
 * through the server (tests/serve/test_serve_diffusion.c). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/ops.h"
#include "base/json.h"
#include "engine/denoise.h"
#include "engine/emit.h"
#include "engine/kv_cache.h"
#include "model/model.h"
#include "test.h"
#include "test_device.h"

#define DIR HEARTH_SOURCE_DIR "/tests/fixtures/golden/diffusion_gemma-f32"

/* The denoising run of one request alone on a one-off cache, as the
 * scheduler drives it (a forward per denoise_run_step, cancellation checked
 * between them, the tokens through emit.h) but with the callback called as
 * each token is committed, so what a step observer sees lines up with the
 * tokens. */
static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct one_ctx {
  const gen_request *req;
  gen_emit out;
  gen_result *res;
  int64_t max_new;
  gen_token_fn fn;
  void *user;
  int rc;
  herr *err;
  bool cancelled;
} one_ctx;

static bool one_commit(void *ctx, const sample_token *st) {
  one_ctx *c = ctx;
  bool ended = false;
  if ((c->rc = gen_emit_token(&c->out, c->req, st->id, c->max_new, c->res, &ended, c->err))) return true;
  if (c->fn && c->fn(c->user, hbuf_str(&c->out.delta), c->out.delta.len, st)) {
    c->cancelled = true;
    return true;
  }
  return ended;
}

static int denoise_alone(model *m, const tokenizer *tok, const gen_request *req, const denoise_params *p,
                         const denoise_draws *draws, gen_token_fn fn, void *user, gen_result *res, herr *err) {
  memset(res, 0, sizeof *res);
  res->stop_index = -1;
  res->stop_token = -1;
  res->prompt_tokens = (int64_t)req->n_prompt;
  if (!req->prompt || req->n_prompt == 0) return herr_set(err, HEARTH_EINVAL, "denoise: the prompt has no tokens");
  if (req->n_stop && !tok) return herr_set(err, HEARTH_EINVAL, "denoise: stop strings need a tokenizer to decode the output");
  int64_t vocab = model_vocab_size(m);
  for (size_t i = 0; i < req->n_prompt; i++)
    if (req->prompt[i] < 0 || req->prompt[i] >= vocab)
      return herr_set(err, HEARTH_EINVAL, "denoise: prompt token %zu is id %d, outside the vocabulary (size %lld)", i,
                      (int)req->prompt[i], (long long)vocab);
  int64_t max_new = 0;
  int rc = gen_check_context(m, req, &max_new, err);
  if (rc) return rc;
  if (max_new == 0) {
    res->finish = GEN_FINISH_LENGTH;
    return 0;
  }
  one_ctx c = {.req = req, .res = res, .max_new = max_new, .fn = fn, .user = user, .err = err};
  kv_cache *cache = NULL;
  kv_seq *seq = NULL;
  denoise_run *run = NULL;
  model_kv_geometry geom;
  model_kv_geometry_of(m, &geom);
  if ((rc = gen_emit_init(&c.out, tok, req, err))) return rc;
  if ((rc = kv_cache_new(&geom, denoise_kv_rows(m, (int64_t)req->n_prompt, max_new), &cache, err)) ||
      (rc = kv_cache_seq_new(cache, &seq, err)) || (rc = denoise_run_new(m, req, p, draws, seq, max_new, &run, err)))
    goto done;
  double t0 = now_seconds();
  bool fin = false, prefilled = false;
  while (!fin) {
    if (req->cancel && *req->cancel) {
      c.cancelled = true;
      break;
    }
    if ((rc = denoise_run_step(run, one_commit, &c, &fin, err))) goto done;
    if (c.rc) {
      rc = c.rc;
      goto done;
    }
    if (c.cancelled) break;
    if (!prefilled && !denoise_run_encoding(run)) {
      prefilled = true;
      res->prefill_seconds = now_seconds() - t0;
    }
  }
  if (c.cancelled) {
    res->finish = GEN_FINISH_CANCELLED;
    rc = herr_set(err, HEARTH_ECANCELLED, "denoise: cancelled after %lld tokens", (long long)res->completion_tokens);
    goto done;
  }
  if ((rc = gen_emit_flush(&c.out, res, err))) goto done;
  if (c.out.delta.len && fn) fn(user, hbuf_str(&c.out.delta), c.out.delta.len, NULL);
  res->decode_seconds = now_seconds() - t0 - res->prefill_seconds;

done:
  denoise_run_free(run);
  if (seq) kv_cache_seq_free(seq);
  kv_cache_free(cache);
  gen_emit_free(&c.out);
  return rc;
}

static json_t *doc;
static float *bin;
static size_t bin_n;
static model *m;
static double pass_rms_diff; /* the largest rms difference of a decoder pass from the reference (test_decoder_logits) */

static int setup(void) {
  herr err = {0};
  doc = hjson_load_file(DIR "/golden.json", &err);
  if (!doc) {
    fprintf(stderr, "%s\n", err.msg);
    return -1;
  }
  FILE *f = fopen(DIR "/logits_f32.bin", "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  bin_n = (size_t)sz / sizeof(float);
  bin = malloc((size_t)sz);
  size_t got = fread(bin, sizeof(float), bin_n, f);
  fclose(f);
  if (got != bin_n) return -1;
  model_load_opts opts = {.threads = 2, .device = test_device()};
  if (model_load(DIR, &opts, &m, &err)) {
    fprintf(stderr, "load: %s\n", err.msg);
    return -1;
  }
  return 0;
}

static const float *arr(const json_t *rec, size_t *n) {
  size_t off = (size_t)json_integer_value(json_object_get(rec, "offset"));
  const json_t *shape = json_object_get(rec, "shape");
  *n = 1;
  for (size_t i = 0; i < json_array_size(shape); i++) *n *= (size_t)json_integer_value(json_array_get(shape, i));
  return off + *n <= bin_n ? bin + off : NULL;
}

static int32_t *ints(const json_t *a, size_t *n) {
  *n = json_array_size(a);
  int32_t *v = malloc(sizeof(int32_t) * (*n ? *n : 1));
  for (size_t i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(a, i));
  return v;
}

static double rms_diff(const float *a, const float *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += ((double)a[i] - (double)b[i]) * ((double)a[i] - (double)b[i]);
  return n ? sqrt(s / (double)n) : 0;
}

static double max_diff(const float *a, const float *b, size_t n) {
  double d = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - (double)b[i]);
    if (!(e <= d)) d = isnan(e) ? INFINITY : e;
  }
  return d;
}

/* softmax of each row of logits, as the decoder's self-conditioning input */
static void softmax_rows(const float *x, float *p, size_t rows, size_t V) {
  for (size_t r = 0; r < rows; r++) {
    const float *a = x + r * V;
    float *o = p + r * V;
    double mx = -INFINITY, s = 0;
    for (size_t v = 0; v < V; v++) mx = a[v] > mx ? a[v] : mx;
    for (size_t v = 0; v < V; v++) s += exp((double)a[v] - mx);
    for (size_t v = 0; v < V; v++) o[v] = (float)(exp((double)a[v] - mx) / s);
  }
}

static void test_model_loads(void) {
  CHECK(m != NULL);
  if (!m) return;
  CHECK_EQ_INT(model_canvas_length(m), json_integer_value(json_object_get(doc, "canvas_length")));
  CHECK_EQ_INT(model_vocab_size(m), json_integer_value(json_object_get(doc, "vocab")));
}

static void test_decoder_logits(void) {
  if (!m) return;
  const json_t *cases = json_object_get(doc, "decoder_cases");
  CHECK(json_array_size(cases) >= 2);
  int64_t V = model_vocab_size(m), C = model_canvas_length(m);
  model_kv_geometry g;
  model_kv_geometry_of(m, &g);
  for (size_t k = 0; k < json_array_size(cases); k++) {
    const json_t *cs = json_array_get(cases, k);
    size_t np, nc, n_ref, n_sc, n_ref_sc;
    int32_t *prompt = ints(json_object_get(cs, "prompt"), &np), *canvas = ints(json_object_get(cs, "canvas"), &nc);
    const float *ref = arr(json_object_get(cs, "logits"), &n_ref), *sc = arr(json_object_get(cs, "self_conditioning"), &n_sc),
                *ref_sc = arr(json_object_get(cs, "logits_sc"), &n_ref_sc);
    CHECK((int64_t)nc == C && ref && sc && ref_sc && n_ref == (size_t)(C * V));
    double tol = 2e-4 * json_number_value(json_object_get(cs, "max_abs")) + 1e-4;
    herr err = {0};
    kv_cache *c = NULL;
    kv_seq *s = NULL;
    float *out = malloc(sizeof(float) * (size_t)(C * V)), *probs = malloc(sizeof(float) * (size_t)(C * V));
    int rc = kv_cache_new(&g, (int64_t)np + C, &c, &err);
    if (!rc) rc = kv_cache_seq_new(c, &s, &err);
    model_seq enc = {.kv = s, .tokens = prompt, .n_tokens = (int)np, .out = MODEL_OUT_NONE};
    model_batch be = {&enc, 1};
    if (!rc) rc = model_forward(m, &be, NULL, &err);
    CHECK_MSG(rc == 0, "encoder: %s", err.msg);
    if (!rc && ref && sc && ref_sc) {
      model_seq dec = {.kv = s, .tokens = canvas, .n_tokens = (int)C, .all_logits = true, .canvas = true};
      model_batch bd = {&dec, 1};
      rc = model_forward(m, &bd, out, &err);
      CHECK_MSG(rc == 0, "decoder: %s", err.msg);
      double d = max_diff(out, ref, (size_t)(C * V)), rms = rms_diff(out, ref, (size_t)(C * V));
      CHECK_MSG(d <= tol, "case %zu (prompt %zu): decoder logits differ by %g (tol %g)", k, np, d, tol);
      CHECK_EQ_INT(s->len, (int64_t)np); /* the canvas does not join the cache */
      /* with self-conditioning */
      softmax_rows(sc, probs, (size_t)C, (size_t)V);
      dec.self_cond = probs;
      rc = model_forward(m, &bd, out, &err);
      CHECK_MSG(rc == 0, "decoder with self-conditioning: %s", err.msg);
      d = max_diff(out, ref_sc, (size_t)(C * V));
      CHECK_MSG(d <= tol, "case %zu (prompt %zu): self-conditioned logits differ by %g (tol %g)", k, np, d, tol);
      double rms_sc = rms_diff(out, ref_sc, (size_t)(C * V));
      if (rms_sc > rms) rms = rms_sc;
      if (d <= tol && rms > pass_rms_diff) pass_rms_diff = rms;
      /* and again without: the scratch rows of the last pass leave no trace */
      dec.self_cond = NULL;
      rc = model_forward(m, &bd, out, &err);
      d = max_diff(out, ref, (size_t)(C * V));
      CHECK_MSG(rc == 0 && d <= tol, "case %zu: a repeated pass differs by %g", k, d);
      fprintf(stderr, "  case %zu: prompt %zu, canvas %lld: max |diff| %.3g (tol %.3g), rms %.3g\n", k, np, (long long)C, d, tol, rms);
    }
    free(out);
    free(probs);
    free(prompt);
    free(canvas);
    if (s) kv_cache_seq_free(s);
    kv_cache_free(c);
  }
}

typedef struct collect {
  int32_t ids[1024];
  int at_step[1024];  /* denoising steps run when each token came */
  int n;
  int cancel_after;   /* > 0: ask to stop once this many tokens came */
  int steps;          /* counted by count_step */
} collect;

static int collect_fn(void *user, const char *delta, size_t len, const sample_token *tok) {
  (void)delta, (void)len;
  collect *c = user;
  if (tok && c->n < 1024) c->at_step[c->n] = c->steps, c->ids[c->n++] = tok->id;
  return c->cancel_after > 0 && c->n >= c->cancel_after;
}

static void count_step(void *ctx, int step, const int32_t *argmax, const int32_t *next, int64_t n) {
  (void)step, (void)argmax, (void)next, (void)n;
  ((collect *)ctx)->steps++;
}

static void params_of(const json_t *p, denoise_params *dp) {
  denoise_params_default(dp);
  dp->max_denoising_steps = (int)json_integer_value(json_object_get(p, "max_denoising_steps"));
  dp->t_min = json_number_value(json_object_get(p, "t_min"));
  dp->t_max = json_number_value(json_object_get(p, "t_max"));
  dp->entropy_bound = json_number_value(json_object_get(p, "sampler_config"));
  dp->stability_threshold = (int)json_integer_value(json_object_get(p, "stability_threshold"));
  dp->confidence_threshold = json_number_value(json_object_get(p, "confidence_threshold"));
}

/* ---- whole generations against the reference's ----
 *
 * The generations replay the reference's random draws (the canvases' tokens, the samples'
 * uniforms), so a run that computes what the reference computes takes the reference's steps,
 * canvas for canvas. Self-conditioning feeds each step's logits into the next, and with random
 * weights at full scale that feedback amplifies a difference of rounding size several times a
 * step (probabilities moved by one float32 rounding moved the logits by 1.6e-5 at the second
 * step and 0.52 at the tenth), so that kernels summing in another order part from the reference
 * within a block. tools/gen_diffusion_golden.py therefore scales the self-conditioning down_proj
 * to a tenth: then rounding-sized differences die out, and every run must be the reference's
 * throughout.
 *
 * The check says so by measuring it rather than assuming it. Beside each run go TWINS runs with
 * the same draws whose decoder logits get Gaussian noise of twice the rms difference measured in
 * test_decoder_logits before each step's sampling; the first step at which any of them parts
 * from the run is its horizon. Every step before the horizon must be the reference's exactly —
 * argmax canvas, accepted-and-renoised canvas, the step number (so the stable-and-confident
 * stop) — and a run that follows the reference through every step must end with its tokens,
 * draws and finish. Where no twin parts (this fixture: none in any of the 30 steps of each
 * generation) the horizon is the whole run, which must then be the reference's throughout. A
 * defect in the schedule, the sampler, the acceptance, self-conditioning or the stop parts a run
 * from the reference and fails here; a fixture with self-conditioning at full scale still gets
 * the exact check up to where rounding alone could part the runs. */

#define TWINS 32

/* The reference's recorded draws, replayed in order; the run's own steps, recorded. */
typedef struct replay {
  const int32_t *ints;
  size_t n_ints, at_int;
  const double *u;
  size_t n_u, at_u;
  bool overrun;
  int64_t C;
  int32_t *steps; /* per step 1 + 2C ints: the step number, the argmax canvas, the next canvas */
  size_t n_steps, cap;
  double noise;   /* > 0: a twin: Gaussian noise of this standard deviation on every logit */
  uint64_t rng;
  const struct replay *base; /* a twin's run: the twin stops (*stop) once it parts from it */
  volatile int *stop;
} replay;

static int32_t replay_token(void *ctx, int64_t vocab) {
  replay *r = ctx;
  if (r->at_int >= r->n_ints) {
    r->overrun = true;
    return 0;
  }
  int32_t t = r->ints[r->at_int++];
  return t < vocab ? t : 0;
}

static double replay_uniform(void *ctx) {
  replay *r = ctx;
  if (r->at_u >= r->n_u) {
    r->overrun = true;
    return 0.5;
  }
  return r->u[r->at_u++];
}

static void replay_step(void *ctx, int step, const int32_t *argmax, const int32_t *next, int64_t n) {
  replay *r = ctx;
  size_t w = 1 + 2 * (size_t)r->C;
  if (n != r->C) return;
  if (r->n_steps == r->cap) {
    size_t cap = r->cap ? 2 * r->cap : 64;
    int32_t *s = realloc(r->steps, sizeof(int32_t) * w * cap);
    if (!s) return;
    r->steps = s, r->cap = cap;
  }
  int32_t *s = r->steps + r->n_steps++ * w;
  s[0] = step;
  memcpy(s + 1, argmax, sizeof(int32_t) * (size_t)n);
  memcpy(s + 1 + n, next, sizeof(int32_t) * (size_t)n);
  size_t i = r->n_steps - 1;
  if (r->base && (i >= r->base->n_steps || memcmp(s, r->base->steps + i * w, sizeof(int32_t) * w))) *r->stop = 1;
}

static double splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (double)((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
}

static void replay_noise(void *ctx, int step, float *logits, int64_t rows, int64_t vocab) {
  (void)step;
  replay *r = ctx;
  for (int64_t i = 0; i < rows * vocab; i++) {
    double u1 = splitmix(&r->rng), u2 = splitmix(&r->rng);
    logits[i] += (float)(r->noise * sqrt(-2.0 * log(1.0 - u1)) * cos(2.0 * M_PI * u2));
  }
}

static int replay_run(const gen_request *req, const denoise_params *dp, replay *r, collect *col, gen_result *res, herr *err) {
  denoise_draws draws = {replay_token, replay_uniform, replay_step, r, r->noise > 0 ? replay_noise : NULL};
  return denoise_alone(m, NULL, req, dp, &draws, collect_fn, col, res, err);
}

/* Leading steps of r that are the reference's trace[t0 .. t0 + n). */
static size_t ref_agree(const replay *r, const json_t *trace, size_t t0, size_t n) {
  size_t w = 1 + 2 * (size_t)r->C, i = 0;
  for (; i < n && i < r->n_steps; i++) {
    const json_t *t = json_array_get(trace, t0 + i);
    const int32_t *s = r->steps + i * w;
    bool same = t && json_integer_value(json_object_get(t, "step")) == s[0];
    for (int64_t j = 0; same && j < r->C; j++)
      same = json_integer_value(json_array_get(json_object_get(t, "argmax"), (size_t)j)) == s[1 + j] &&
             json_integer_value(json_array_get(json_object_get(t, "next"), (size_t)j)) == s[1 + r->C + j];
    if (!same) break;
  }
  return i;
}

/* The first step at which a twin of run r parts from it (SIZE_MAX: none parts). */
static size_t rounding_horizon(const gen_request *req, const denoise_params *dp, const replay *r) {
  size_t h = SIZE_MAX, w = 1 + 2 * (size_t)r->C;
  for (int k = 0; k < TWINS; k++) {
    volatile int stop = 0;
    replay tw = {.ints = r->ints, .n_ints = r->n_ints, .u = r->u, .n_u = r->n_u, .C = r->C, .noise = 2 * pass_rms_diff,
                 .rng = 0x5eed0000u + (uint64_t)k, .base = r, .stop = &stop};
    gen_request twin_req = *req;
    twin_req.cancel = &stop;
    collect col = {0};
    gen_result res;
    herr err = {0};
    int rc = replay_run(&twin_req, dp, &tw, &col, &res, &err);
    if (rc && rc != HEARTH_ECANCELLED) tw.n_steps = 0;
    size_t i = 0, n = tw.n_steps < r->n_steps ? tw.n_steps : r->n_steps;
    while (i < n && !memcmp(tw.steps + i * w, r->steps + i * w, sizeof(int32_t) * w)) i++;
    if ((i < n || tw.n_steps != r->n_steps) && i < h) h = i;
    free(tw.steps);
  }
  return h;
}

/* Whole generations (block diffusion, an EOS inside a block, the stable-and-confident criterion
 * set) replaying the reference's draws; see above for what must agree. */
static void test_generations(void) {
  if (!m) return;
  const json_t *gens = json_object_get(doc, "generations");
  CHECK(json_array_size(gens) >= 3);
  for (size_t k = 0; k < json_array_size(gens); k++) {
    const json_t *gj = json_array_get(gens, k), *p = json_object_get(gj, "params"), *trace = json_object_get(gj, "trace");
    const char *name = json_string_value(json_object_get(gj, "name"));
    size_t np, nref, n_ints, nu = json_array_size(json_object_get(gj, "uniforms")), n_trace = json_array_size(trace);
    int32_t *prompt = ints(json_object_get(gj, "prompt"), &np), *ref = ints(json_object_get(gj, "output"), &nref);
    int32_t *all_ints = ints(json_object_get(gj, "canvas_draws"), &n_ints);
    double *all_u = malloc(sizeof(double) * (nu ? nu : 1));
    for (size_t i = 0; i < nu; i++) all_u[i] = json_number_value(json_array_get(json_object_get(gj, "uniforms"), i));
    gen_request req;
    gen_request_init(&req);
    req.prompt = prompt;
    req.n_prompt = np;
    req.max_tokens = json_integer_value(json_object_get(p, "max_new_tokens"));
    const json_t *eos = json_object_get(p, "eos_token_id");
    if (json_is_integer(eos)) req.eos_ids[req.n_eos++] = (int32_t)json_integer_value(eos);
    denoise_params dp;
    params_of(p, &dp);
    replay r = {.ints = all_ints, .n_ints = n_ints, .u = all_u, .n_u = nu, .C = model_canvas_length(m)};
    collect col = {0};
    gen_result res;
    herr err = {0};
    int rc = replay_run(&req, &dp, &r, &col, &res, &err);
    CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
    size_t lead = ref_agree(&r, trace, 0, n_trace), horizon = rounding_horizon(&req, &dp, &r);
    bool all = lead == n_trace && r.n_steps == n_trace;
    CHECK_MSG(all || lead >= horizon, "%s: step %zu is not the reference's, yet rounding-sized noise parts no run before step %zu",
              name, lead + 1, horizon + 1);
    if (all) {
      /* the reference pads after its EOS; ours ends at it */
      size_t want = nref;
      if (req.n_eos)
        for (size_t i = 0; i < nref; i++)
          if (ref[i] == req.eos_ids[0]) {
            want = i + 1;
            break;
          }
      bool same = (size_t)col.n == want;
      for (int i = 0; same && i < col.n; i++) same = col.ids[i] == ref[i];
      CHECK_MSG(same, "%s: every step as the reference's, yet other tokens", name);
      CHECK_MSG(!r.overrun && r.at_int == r.n_ints && r.at_u == r.n_u, "%s: draws used %zu / %zu tokens, %zu / %zu uniforms",
                name, r.at_int, r.n_ints, r.at_u, r.n_u);
      CHECK_EQ_INT(res.finish, req.n_eos ? GEN_FINISH_STOP : GEN_FINISH_LENGTH);
    }
    fprintf(stderr, "  %s: %zu of %zu steps as the reference's; rounding-sized noise parts a run from step %zu\n", name, lead,
            n_trace, (horizon == SIZE_MAX ? r.n_steps : horizon) + 1);
    free(r.steps);
    free(prompt);
    free(ref);
    free(all_ints);
    free(all_u);
  }
}

/* Each block of each generation on its own, from the reference's earlier blocks (the prompt and
 * the blocks before it, encoded) and its draws from where that block's start (self-conditioning
 * starts afresh with each block, and so does the amplification): as above, every step before the
 * block's horizon is the reference's, and a block that follows the reference to its end has its
 * tokens. */
static void test_blocks_from_reference(void) {
  if (!m) return;
  const json_t *gens = json_object_get(doc, "generations");
  int64_t C = model_canvas_length(m);
  for (size_t k = 0; k < json_array_size(gens); k++) {
    const json_t *gj = json_array_get(gens, k), *p = json_object_get(gj, "params"), *spb = json_object_get(gj, "steps_per_block");
    const json_t *trace = json_object_get(gj, "trace");
    const char *name = json_string_value(json_object_get(gj, "name"));
    size_t np, nref, n_ints, nu = json_array_size(json_object_get(gj, "uniforms"));
    int32_t *prompt = ints(json_object_get(gj, "prompt"), &np), *ref = ints(json_object_get(gj, "output"), &nref);
    int32_t *all_ints = ints(json_object_get(gj, "canvas_draws"), &n_ints);
    double *all_u = malloc(sizeof(double) * (nu ? nu : 1));
    for (size_t i = 0; i < nu; i++) all_u[i] = json_number_value(json_array_get(json_object_get(gj, "uniforms"), i));
    int32_t *ctx = malloc(sizeof(int32_t) * (np + nref));
    memcpy(ctx, prompt, sizeof(int32_t) * np);
    denoise_params dp;
    params_of(p, &dp);
    size_t int_off = 0, u_off = 0, step_off = 0;
    for (size_t b = 0; b < json_array_size(spb); b++) {
      size_t steps = (size_t)json_integer_value(json_array_get(spb, b));
      replay r = {.ints = all_ints + int_off, .n_ints = n_ints - int_off, .u = all_u + u_off, .n_u = nu - u_off, .C = C};
      gen_request req;
      gen_request_init(&req);
      req.prompt = ctx;
      req.n_prompt = np + b * (size_t)C;
      req.max_tokens = C;
      const json_t *eos = json_object_get(p, "eos_token_id");
      if (json_is_integer(eos)) req.eos_ids[req.n_eos++] = (int32_t)json_integer_value(eos);
      collect col = {0};
      gen_result res;
      herr err = {0};
      int rc = replay_run(&req, &dp, &r, &col, &res, &err);
      CHECK_MSG(rc == 0, "%s block %zu: %s", name, b, err.msg);
      size_t lead = ref_agree(&r, trace, step_off, steps), horizon = rounding_horizon(&req, &dp, &r);
      bool all = lead == steps && r.n_steps == steps;
      CHECK_MSG(all || lead >= horizon,
                "%s block %zu: step %zu is not the reference's, yet rounding-sized noise parts no run before step %zu", name, b, lead + 1,
                horizon + 1);
      /* a block holding the end-of-sequence token ends with it (the reference pads the rest) */
      int64_t want = C;
      for (int64_t i = 0; req.n_eos && i < C; i++)
        if (ref[b * (size_t)C + (size_t)i] == req.eos_ids[0]) {
          want = i + 1;
          break;
        }
      bool same = col.n == want;
      for (int i = 0; same && i < col.n; i++) same = col.ids[i] == ref[b * (size_t)C + (size_t)i];
      CHECK_MSG(!all || same, "%s block %zu: every step as the reference's, yet other tokens", name, b);
      fprintf(stderr, "  %s block %zu: %zu of %zu steps as the reference's%s; rounding-sized noise parts a run from step %zu\n", name,
              b, lead, steps, all && same ? " (its tokens)" : "", (horizon == SIZE_MAX ? r.n_steps : horizon) + 1);
      free(r.steps);
      memcpy(ctx + np + b * (size_t)C, ref + b * (size_t)C, sizeof(int32_t) * (size_t)C);
      int_off += (size_t)C * (1 + steps);
      u_off += (size_t)C * steps;
      step_off += steps;
    }
    free(prompt);
    free(ref);
    free(all_ints);
    free(all_u);
    free(ctx);
  }
}

/* An end-of-sequence token inside a block, placed as the reference's "eos" generation places it
 * (the plain run's token C + 3, here from our own plain run, since the reference's parts from it
 * before): the run ends with the block that holds its first occurrence; the tokens up to it come,
 * those after it do not; the finish is a stop; the draws and steps are the plain run's to there. */
static void test_eos_inside_block(void) {
  if (!m) return;
  const json_t *gj = json_array_get(json_object_get(doc, "generations"), 0), *p = json_object_get(gj, "params");
  int64_t C = model_canvas_length(m);
  size_t np, n_ints, nu = json_array_size(json_object_get(gj, "uniforms"));
  int32_t *prompt = ints(json_object_get(gj, "prompt"), &np), *all_ints = ints(json_object_get(gj, "canvas_draws"), &n_ints);
  double *all_u = malloc(sizeof(double) * (nu ? nu : 1));
  for (size_t i = 0; i < nu; i++) all_u[i] = json_number_value(json_array_get(json_object_get(gj, "uniforms"), i));
  gen_request req;
  gen_request_init(&req);
  req.prompt = prompt;
  req.n_prompt = np;
  req.max_tokens = json_integer_value(json_object_get(p, "max_new_tokens"));
  denoise_params dp;
  params_of(p, &dp);
  replay a = {.ints = all_ints, .n_ints = n_ints, .u = all_u, .n_u = nu, .C = C}, b = a;
  collect ca = {0}, cb = {0};
  gen_result res;
  herr err = {0};
  CHECK(replay_run(&req, &dp, &a, &ca, &res, &err) == 0 && ca.n > C + 3);
  if (ca.n > C + 3) {
    int32_t eos = ca.ids[C + 3];
    int first = 0;
    while (ca.ids[first] != eos) first++;
    req.eos_ids[req.n_eos++] = eos;
    CHECK(replay_run(&req, &dp, &b, &cb, &res, &err) == 0);
    CHECK_EQ_INT(cb.n, first + 1);
    CHECK(cb.n <= ca.n && !memcmp(cb.ids, ca.ids, sizeof(int32_t) * (size_t)cb.n));
    CHECK_EQ_INT(res.finish, GEN_FINISH_STOP);
    /* the steps of the blocks through the EOS's, and their draws */
    size_t w = 1 + 2 * (size_t)C, steps = 0, blocks = 0, block_of_eos = (size_t)first / (size_t)C;
    for (; steps < a.n_steps; steps++) {
      if (a.steps[steps * w] == dp.max_denoising_steps && steps && ++blocks > block_of_eos) break;
    }
    CHECK_EQ_INT(b.n_steps, steps);
    CHECK(b.n_steps <= a.n_steps && !memcmp(b.steps, a.steps, sizeof(int32_t) * w * b.n_steps));
    CHECK_EQ_INT(b.at_u, (size_t)C * steps);
    CHECK_EQ_INT(b.at_int, (size_t)C * (block_of_eos + 1 + steps));
  }
  free(a.steps);
  free(b.steps);
  free(prompt);
  free(all_ints);
  free(all_u);
}

/* Sets a cancel flag after a given number of denoising steps. */
typedef struct stop_at {
  int steps, at;
  volatile int *flag;
} stop_at;

static void stop_step(void *ctx, int step, const int32_t *argmax, const int32_t *next, int64_t n) {
  (void)step, (void)argmax, (void)next, (void)n;
  stop_at *s = ctx;
  if (++s->steps == s->at) *s->flag = 1;
}

/* Cancelled by the callback after the first block, or by the flag before the run or between two
 * denoising steps: no more forwards, everything released. */
static void test_cancel(void) {
  if (!m) return;
  int64_t C = model_canvas_length(m);
  int32_t prompt[] = {1, 17, 42, 99};
  gen_request req;
  gen_request_init(&req);
  req.prompt = prompt;
  req.n_prompt = 4;
  req.max_tokens = 4 * C;
  req.sample.seed = 5;
  denoise_params dp;
  denoise_params_default(&dp);
  dp.max_denoising_steps = 4;
  collect col = {.cancel_after = (int)C};
  gen_result res;
  herr err = {0};
  int rc = denoise_alone(m, NULL, &req, &dp, NULL, collect_fn, &col, &res, &err);
  CHECK_EQ_INT(rc, HEARTH_ECANCELLED);
  CHECK_EQ_INT(res.finish, GEN_FINISH_CANCELLED);
  CHECK_EQ_INT(col.n, C);
  /* the flag: set before the run, nothing is generated */
  volatile int flag = 1;
  req.cancel = &flag;
  collect col2 = {0};
  rc = denoise_alone(m, NULL, &req, &dp, NULL, collect_fn, &col2, &res, &err);
  CHECK_EQ_INT(rc, HEARTH_ECANCELLED);
  CHECK_EQ_INT(col2.n, 0);
  /* the flag set in the middle of a block (after its second denoising step): the run stops before
     the next forward, and the block is never committed */
  flag = 0;
  stop_at sa = {.at = 2, .flag = &flag};
  denoise_draws obs_stop = {.step = stop_step, .ctx = &sa};
  collect col3 = {0};
  rc = denoise_alone(m, NULL, &req, &dp, &obs_stop, collect_fn, &col3, &res, &err);
  CHECK_EQ_INT(rc, HEARTH_ECANCELLED);
  CHECK_EQ_INT(res.finish, GEN_FINISH_CANCELLED);
  CHECK_EQ_INT(sa.steps, 2);
  CHECK_EQ_INT(col3.n, 0);
  CHECK_EQ_INT(res.completion_tokens, 0);
  /* the same seed gives the same tokens; they come a block at a time, each block after its last
     denoising step and before the next block's first */
  req.cancel = NULL;
  collect a = {0}, b = {0};
  denoise_draws obs_a = {.step = count_step, .ctx = &a}, obs_b = {.step = count_step, .ctx = &b};
  CHECK(denoise_alone(m, NULL, &req, &dp, &obs_a, collect_fn, &a, &res, &err) == 0);
  CHECK(denoise_alone(m, NULL, &req, &dp, &obs_b, collect_fn, &b, &res, &err) == 0);
  CHECK(a.n == 4 * C && b.n == a.n && !memcmp(a.ids, b.ids, sizeof(int32_t) * (size_t)a.n));
  bool blockwise = a.n == 4 * C;
  for (int i = 0; i < a.n && blockwise; i++) {
    blockwise = a.at_step[i] == a.at_step[i - i % C];                 /* one burst per block */
    if (i % C == 0 && i) blockwise = a.at_step[i] > a.at_step[i - 1]; /* denoising in between */
  }
  CHECK_MSG(blockwise, "tokens did not come a block at a time");
  CHECK(a.at_step[0] >= 1 && a.steps == a.at_step[a.n - 1]);
}

/* The stable-and-confident stop (the reference's random model is never confident enough for its
 * fixture to show one): any entropy is confident under a threshold of 100; with a stability
 * threshold of 0 every block then ends after its first step, with 1 once the argmax canvas repeats. */
static void test_early_stop(void) {
  if (!m) return;
  int64_t C = model_canvas_length(m);
  int32_t prompt[] = {1, 17, 42, 99};
  gen_request req;
  gen_request_init(&req);
  req.prompt = prompt;
  req.n_prompt = 4;
  req.max_tokens = 3 * C;
  req.sample.seed = 9;
  denoise_params dp;
  denoise_params_default(&dp);
  dp.max_denoising_steps = 12;
  dp.confidence_threshold = 100;
  dp.stability_threshold = 0;
  collect a = {0};
  denoise_draws obs = {.step = count_step, .ctx = &a};
  gen_result res;
  herr err = {0};
  CHECK(denoise_alone(m, NULL, &req, &dp, &obs, collect_fn, &a, &res, &err) == 0);
  CHECK_EQ_INT(a.n, 3 * C);
  CHECK_EQ_INT(a.steps, 3);
  dp.stability_threshold = 1;
  collect b = {0};
  obs.ctx = &b;
  CHECK(denoise_alone(m, NULL, &req, &dp, &obs, collect_fn, &b, &res, &err) == 0);
  CHECK_EQ_INT(b.n, 3 * C);
  CHECK(b.steps >= 6 && b.steps <= 3 * 12); /* at least two steps a block */
  dp.confidence_threshold = 0; /* off: every step runs */
  collect c = {0};
  obs.ctx = &c;
  CHECK(denoise_alone(m, NULL, &req, &dp, &obs, collect_fn, &c, &res, &err) == 0);
  CHECK_EQ_INT(c.steps, 3 * 12);
  fprintf(stderr, "  steps: %d (stop at once), %d (once stable), %d (no stop)\n", a.steps, b.steps, c.steps);
}

static void test_refusals(void) {
  if (!m) return;
  gen_request req;
  gen_request_init(&req);
  int32_t prompt[] = {1, 2};
  req.prompt = prompt;
  req.n_prompt = 2;
  req.max_tokens = 8;
  denoise_params dp;
  denoise_params_default(&dp);
  dp.t_max = dp.t_min;
  gen_result res;
  herr err = {0};
  CHECK_EQ_INT(denoise_alone(m, NULL, &req, &dp, NULL, NULL, NULL, &res, &err), HEARTH_EINVAL);
  CHECK(strstr(err.msg, "t_min") != NULL);
  /* a canvas pass and a causal sequence in one batch */
  model_kv_geometry g;
  model_kv_geometry_of(m, &g);
  kv_cache *c = NULL;
  kv_seq *s1 = NULL, *s2 = NULL;
  CHECK(kv_cache_new(&g, 64, &c, &err) == 0 && kv_cache_seq_new(c, &s1, &err) == 0 && kv_cache_seq_new(c, &s2, &err) == 0);
  float *out = malloc(sizeof(float) * 64 * (size_t)model_vocab_size(m));
  model_seq seqs[2] = {{.kv = s1, .tokens = prompt, .n_tokens = 2, .canvas = true, .all_logits = true},
                       {.kv = s2, .tokens = prompt, .n_tokens = 2}};
  model_batch b = {seqs, 2};
  CHECK_EQ_INT(model_forward(m, &b, out, &err), HEARTH_EINVAL);
  free(out);
  kv_cache_seq_free(s1);
  kv_cache_seq_free(s2);
  kv_cache_free(c);
  /* a causal model is no diffusion model */
  model *llama = NULL;
  model_load_opts opts = {.threads = 1};
  if (model_load(HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-f32", &opts, &llama, &err) == 0) {
    CHECK_EQ_INT(model_canvas_length(llama), 0);
    CHECK_EQ_INT(denoise_alone(llama, NULL, &req, NULL, NULL, NULL, NULL, &res, &err), HEARTH_EUNSUPPORTED);
    model_free(llama);
  }
}

/* The reference hands the next step softmax(logits.to(dtype)).to(dtype), dtype the checkpoint's:
 * a bfloat16 checkpoint's self-conditioning input is rounded twice. The fixture's weights under a
 * config that says bfloat16: the second step's logits equal a pass over the first step's canvas
 * with those rounded probabilities, and differ from one with plain float probabilities. */
typedef struct sc_capture {
  int seen;
  int64_t C, V;
  float *l1, *l2;
  int32_t *canvas1;
} sc_capture;

static void sc_logits(void *ctx, int step, float *logits, int64_t rows, int64_t vocab) {
  (void)step;
  sc_capture *c = ctx;
  if (c->seen == 0) memcpy(c->l1, logits, sizeof(float) * (size_t)(rows * vocab));
  if (c->seen == 1) memcpy(c->l2, logits, sizeof(float) * (size_t)(rows * vocab));
  c->seen++;
}

static void sc_step(void *ctx, int step, const int32_t *argmax, const int32_t *next, int64_t n) {
  (void)step, (void)argmax;
  sc_capture *c = ctx;
  if (c->seen == 1) memcpy(c->canvas1, next, sizeof(int32_t) * (size_t)n);
}

static void test_self_cond_rounding(void) {
  if (!m) return;
  char dir[] = "/tmp/hearth_test_denoise_XXXXXX", path[512];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  CHECK(symlink(DIR "/model.safetensors", path) == 0);
  snprintf(path, sizeof path, "%s/generation_config.json", dir);
  CHECK(symlink(DIR "/generation_config.json", path) == 0);
  herr err = {0};
  json_t *cfg = hjson_load_file(DIR "/config.json", &err);
  CHECK(cfg != NULL);
  if (!cfg) return;
  json_object_set_new(cfg, "dtype", json_string("bfloat16"));
  snprintf(path, sizeof path, "%s/config.json", dir);
  CHECK(json_dump_file(cfg, path, JSON_INDENT(1)) == 0);
  json_decref(cfg);
  model *m2 = NULL;
  model_load_opts opts = {.threads = 2, .device = test_device()};
  CHECK(model_load(dir, &opts, &m2, &err) == 0);
  if (!m2) {
    fprintf(stderr, "%s\n", err.msg);
    return;
  }
  const json_t *gj = json_array_get(json_object_get(doc, "generations"), 0), *p = json_object_get(gj, "params");
  int64_t C = model_canvas_length(m2), V = model_vocab_size(m2);
  size_t np;
  int32_t *prompt = ints(json_object_get(gj, "prompt"), &np);
  gen_request req;
  gen_request_init(&req);
  req.prompt = prompt, req.n_prompt = np, req.max_tokens = C;
  denoise_params dp;
  params_of(p, &dp);
  sc_capture c = {.C = C, .V = V};
  c.l1 = malloc(sizeof(float) * (size_t)(C * V));
  c.l2 = malloc(sizeof(float) * (size_t)(C * V));
  c.canvas1 = malloc(sizeof(int32_t) * (size_t)C);
  float *sc = malloc(sizeof(float) * (size_t)(C * V)), *out = malloc(sizeof(float) * (size_t)(C * V));
  denoise_draws dr = {.logits = sc_logits, .step = sc_step, .ctx = &c};
  model_kv_geometry geom;
  model_kv_geometry_of(m2, &geom);
  kv_cache *cache = NULL, *cache2 = NULL;
  kv_seq *seq = NULL, *seq2 = NULL;
  denoise_run *run = NULL;
  CHECK(kv_cache_new(&geom, denoise_kv_rows(m2, (int64_t)np, C), &cache, &err) == 0 && kv_cache_seq_new(cache, &seq, &err) == 0 &&
        denoise_run_new(m2, &req, &dp, &dr, seq, C, &run, &err) == 0);
  bool done = false;
  while (run && c.seen < 2 && !done) CHECK(denoise_run_step(run, NULL, NULL, &done, &err) == 0);
  CHECK_EQ_INT(c.seen, 2);
  /* the same pass by hand: the prompt encoded, the canvas after the first step, its probabilities */
  CHECK(kv_cache_new(&geom, denoise_kv_rows(m2, (int64_t)np, C), &cache2, &err) == 0 && kv_cache_seq_new(cache2, &seq2, &err) == 0);
  model_seq enc = {.kv = seq2, .tokens = prompt, .n_tokens = (int)np, .out = MODEL_OUT_NONE};
  model_batch eb = {.seqs = &enc, .n_seqs = 1};
  CHECK(model_forward(m2, &eb, NULL, &err) == 0);
  float t = (float)dp.t_max; /* the first step's temperature: t_min + (t_max - t_min) * 1 */
  double d_round = 0, d_plain = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (int64_t i = 0; i < C; i++) {
      const float *x = c.l1 + i * V;
      float *o = sc + i * V;
      double mx = -INFINITY, sum = 0;
      for (int64_t v = 0; v < V; v++) {
        float y = x[v] / t;
        o[v] = pass ? y : bk_round_bf16(y);
        mx = o[v] > mx ? o[v] : mx;
      }
      for (int64_t v = 0; v < V; v++) sum += exp((double)o[v] - mx);
      for (int64_t v = 0; v < V; v++) {
        float q = (float)(exp((double)o[v] - mx) / sum);
        o[v] = pass ? q : bk_round_bf16(q);
      }
    }
    model_seq cs = {.kv = seq2, .tokens = c.canvas1, .n_tokens = (int)C, .all_logits = true, .canvas = true, .self_cond = sc};
    model_batch cb = {.seqs = &cs, .n_seqs = 1};
    CHECK(model_forward(m2, &cb, out, &err) == 0);
    *(pass ? &d_plain : &d_round) = max_diff(out, c.l2, (size_t)(C * V));
  }
  printf("  self-conditioning under bfloat16: max |logit diff| %.3g with rounded probabilities, %.3g with plain ones\n", d_round,
         d_plain);
  CHECK(d_round <= 1e-5);
  CHECK(d_plain > 10 * d_round && d_plain > 1e-5);
  denoise_run_free(run);
  kv_cache_seq_free(seq);
  kv_cache_seq_free(seq2);
  kv_cache_free(cache);
  kv_cache_free(cache2);
  model_free(m2);
  for (int i = 0; i < 3; i++) {
    static const char *const all[] = {"model.safetensors", "generation_config.json", "config.json"};
    snprintf(path, sizeof path, "%s/%s", dir, all[i]);
    unlink(path);
  }
  rmdir(dir);
  free(prompt), free(c.l1), free(c.l2), free(c.canvas1), free(sc), free(out);
}

int main(void) {
  test_device_or_skip();
  int ok = setup() == 0;
  CHECK_MSG(ok, "could not read the fixture in %s", DIR);
  RUN(test_model_loads);
  RUN(test_decoder_logits);
  RUN(test_generations);
  RUN(test_blocks_from_reference);
  RUN(test_eos_inside_block);
  RUN(test_early_stop);
  RUN(test_cancel);
  RUN(test_self_cond_rounding);
  RUN(test_refusals);
  model_free(m);
  json_decref(doc);
  free(bin);
  TEST_MAIN_END();
}
