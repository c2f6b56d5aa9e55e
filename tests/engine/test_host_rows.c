/* test_host_rows.c — what the scheduler computes on the host from a step's
 * logits rows, on the test device (HEARTH_TEST_DEVICE; a GPU brings those
 * rows back for them): hearth_prompt_logprobs — each prompt token's
 * log-probability and alternatives equal what hearth_signal reports for the
 * prompt cut before that token (a separate path: one logits row per call,
 * through the prefix cache), also after the same prompt's blocks were cached
 * by a generation; the first token has none — and a greedy DRY request, each
 * token of which is the argmax of the model's next-token log-probabilities
 * (hearth_signal) after the DRY penalties of the history so far — and a
 * scheduler step mixing such requests (DRY, XTC, typical-p, mirostat) with
 * plain seeded ones, also with tokens picked by bk_sample as on a GPU: each
 * host-only request gives what it gives alone (host sampling), and each plain
 * one what it gives alone (its neighbours leave its device sampling as it is). */
#include <math.h>
#include <stdint.h>

#include <pthread.h>

#include "engine/request.h"
#include "sched_alone.h"
#include "engine/sample.h"
#include "engine/sched.h"
#include "hearth.h"
#include "model/model.h"
#include "test.h"
#include "test_device.h"

#define DEFAULT_MODEL HEARTH_SOURCE_DIR "/models/default"

static void test_against_signal(void) {
  hearth_model *m = NULL;
  hearth_error err = {0};
  hearth_load_opts lo = {.threads = 2, .device = test_device()};
  int rc = hearth_model_load(DEFAULT_MODEL, &lo, &m, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (rc) return;
  const char *text = "And God said, Let there be light: and there was light. And God saw the light, that it was good: "
                     "and God divided the light from the darkness.";
  int32_t *ids = NULL;
  size_t n = 0;
  CHECK_EQ_INT(hearth_tokenize(m, text, strlen(text), true, &ids, &n, &err), 0);
  CHECK(n > 32);
  /* a generation first, so the prompt's blocks are in the prefix cache */
  hearth_gen_params gp;
  hearth_gen_params_init(&gp);
  gp.max_tokens = 4;
  gp.temperature = 0;
  hearth_prompt hp = {.ids = ids, .n_ids = n};
  CHECK_EQ_INT(hearth_generate(m, &hp, &gp, NULL, NULL, NULL, &err), 0);
  hearth_prompt_logprob *lp = calloc(n, sizeof *lp);
  CHECK_EQ_INT(hearth_prompt_logprobs(m, ids, n, 3, NULL, lp, &err), 0);
  CHECK(isnan(lp[0].logprob));
  CHECK_EQ_INT(lp[0].n_top, 0);
  int checked = 0;
  for (size_t i = 1; i < n; i++) {
    CHECK_EQ_INT(lp[i].id, ids[i]);
    hearth_signal_result sig;
    hearth_prompt pre = {.ids = ids, .n_ids = i};
    CHECK_EQ_INT(hearth_signal(m, &pre, 10, 3, NULL, &sig, &err), 0);
    CHECK_EQ_INT(lp[i].n_top, 3);
    for (int k = 0; k < 3 && k < sig.n_top; k++) {
      CHECK_EQ_INT(lp[i].top_ids[k], sig.top_ids[k]);
      CHECK_NEAR(lp[i].top_logprobs[k], sig.top_logprobs[k], 1e-4);
      if (sig.top_ids[k] == ids[i]) CHECK_NEAR(lp[i].logprob, sig.top_logprobs[k], 1e-4);
    }
    CHECK(lp[i].logprob <= lp[i].top_logprobs[0] + 1e-6);
    CHECK(lp[i].logprob < 0 && isfinite(lp[i].logprob));
    checked++;
  }
  CHECK_EQ_INT(checked, (long long)n - 1);
  /* bad arguments */
  CHECK_EQ_INT(hearth_prompt_logprobs(m, ids, n, 21, NULL, lp, &err), HEARTH_EINVAL);
  CHECK_EQ_INT(hearth_prompt_logprobs(m, ids, 0, 1, NULL, lp, &err), HEARTH_EINVAL);
  int32_t bad[2] = {1, 1 << 30};
  CHECK(hearth_prompt_logprobs(m, bad, 2, 1, NULL, lp, &err) != 0);
  free(lp);
  hearth_free(ids);
  hearth_model_free(m);
}

typedef struct ids_out {
  int32_t ids[64];
  int n;
} ids_out;

static int collect(void *user, const char *text, size_t len, const hearth_token *tok) {
  (void)text, (void)len;
  ids_out *o = user;
  if (tok && o->n < 64) o->ids[o->n++] = tok->id;
  return 0;
}

static void test_dry_greedy(void) {
  hearth_model *m = NULL;
  hearth_error err = {0};
  hearth_load_opts lo = {.threads = 2, .device = test_device()};
  int rc = hearth_model_load(DEFAULT_MODEL, &lo, &m, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (rc) return;
  const char *text = "And God said, Let there be";
  int32_t *prompt = NULL;
  size_t n_prompt = 0;
  CHECK_EQ_INT(hearth_tokenize(m, text, strlen(text), true, &prompt, &n_prompt, &err), 0);
  enum { N = 32 };
  hearth_gen_params gp;
  hearth_gen_params_init(&gp);
  gp.max_tokens = N;
  gp.temperature = 0;
  gp.ignore_eos = true;
  hearth_prompt hp = {.ids = prompt, .n_ids = n_prompt};
  ids_out plain = {0}, dry = {0};
  CHECK_EQ_INT(hearth_generate(m, &hp, &gp, collect, &plain, NULL, &err), 0);
  static const char *const no_breakers[1] = {NULL};
  gp.dry_multiplier = 1.5;
  gp.dry_allowed_length = 1;
  gp.dry_penalty_last_n = -1;
  gp.dry_sequence_breakers = no_breakers; /* none: the penalties below need no vocabulary */
  gp.n_dry_sequence_breakers = 0;
  CHECK_EQ_INT(hearth_generate(m, &hp, &gp, collect, &dry, NULL, &err), 0);
  CHECK_EQ_INT(plain.n, N);
  CHECK_EQ_INT(dry.n, N);
  CHECK(memcmp(plain.ids, dry.ids, sizeof(int32_t) * N) != 0); /* the greedy text repeats itself; DRY moves it */
  /* each DRY token: the argmax over the next-token log-probabilities minus the penalties */
  int32_t hist[256];
  memcpy(hist, prompt, sizeof(int32_t) * n_prompt);
  hearth_info info;
  hearth_model_info(m, &info);
  int32_t vocab = info.vocab_size;
  float *pen = malloc(sizeof(float) * (size_t)vocab);
  int checked = 0;
  for (int t = 0; t < dry.n; t++) {
    size_t n_hist = n_prompt + (size_t)t;
    hearth_signal_result sig;
    hearth_prompt pre = {.ids = hist, .n_ids = n_hist};
    CHECK_EQ_INT(hearth_signal(m, &pre, 10, HEARTH_MAX_TOP_LOGPROBS, NULL, &sig, &err), 0);
    sample_params sp;
    sample_params_default(&sp);
    sp.dry_multiplier = 1.5f;
    sp.dry_allowed_length = 1;
    sp.dry_penalty_last_n = -1;
    sampler *s = NULL;
    herr e = {0};
    CHECK_EQ_INT(sampler_new(vocab, &sp, &s, &e), 0);
    sampler_add_prompt(s, hist, n_hist);
    for (int32_t i = 0; i < vocab; i++) pen[i] = 0;
    sampler_penalize(s, pen);
    sampler_free(s);
    double best = -INFINITY, second = -INFINITY;
    int32_t best_id = -1;
    for (int k = 0; k < sig.n_top; k++) {
      double v = sig.top_logprobs[k] + pen[sig.top_ids[k]];
      if (v > best) second = best, best = v, best_id = sig.top_ids[k];
      else if (v > second) second = v;
    }
    /* exact when nothing outside the top list can win, and not a near tie */
    if (best > sig.top_logprobs[sig.n_top - 1] && best - second > 1e-3) {
      CHECK_MSG(dry.ids[t] == best_id, "token %d: %d, the penalised argmax %d", t, (int)dry.ids[t], (int)best_id);
      checked++;
    }
    hist[n_hist] = dry.ids[t];
  }
  CHECK_MSG(checked >= N / 2, "only %d of %d tokens checked", checked, N);
  fprintf(stderr, "  %d of %d DRY tokens checked against the penalised argmax\n", checked, N);
  free(pen);
  hearth_free(prompt);
  hearth_model_free(m);
}

typedef struct job {
  sched *s;
  gen_request req;
  int32_t ids[64];
  int n;
  int rc;
  herr err;
  gen_result res;
} job;

static int job_token(void *user, const char *delta, size_t len, const sample_token *tok) {
  (void)delta, (void)len;
  job *j = user;
  if (tok && j->n < 64) j->ids[j->n++] = tok->id;
  return 0;
}

static void *job_main(void *arg) {
  job *j = arg;
  j->rc = sched_run(j->s, &j->req, job_token, j, &j->res, &j->err);
  return NULL;
}

enum { N_JOBS = 8, N_NEW = 24 };
static int32_t g_prompts[N_JOBS][48];

static void job_params(job *j, int i) {
  gen_request_init(&j->req);
  for (int t = 0; t < 48; t++) g_prompts[i][t] = (int32_t)(100 + ((t % (5 + i)) * 37 + i * 11) % 400);
  j->req.prompt = g_prompts[i];
  j->req.n_prompt = 48;
  j->req.max_tokens = N_NEW;
  j->req.ignore_eos = true;
  sample_params *p = &j->req.sample;
  p->seed = 100 + (uint64_t)i;
  p->temperature = 0.8f;
  switch (i) {
  case 0: p->greedy = true, p->dry_multiplier = 1.5f, p->dry_allowed_length = 1, p->dry_penalty_last_n = -1; break;
  case 1: p->top_k = 3, p->xtc_probability = 1, p->xtc_threshold = 0; break;
  case 2: p->mirostat = 2, p->mirostat_tau = 3; break;
  case 3: p->typical_p = 0.5f; break;
  default: break; /* plain, seeded */
  }
}

/* The jobs in `which` (a bit each) at once on a scheduler of m. */
static void run_jobs(model *m, bool backend_sampling, unsigned which, job *jobs) {
  sched_config cfg = {.max_batch = 8, .block_tokens = 16, .backend_sampling = backend_sampling};
  sched *s = NULL;
  herr e = {0};
  CHECK_EQ_INT(sched_new(m, NULL, &cfg, &s, &e), 0);
  if (!s) return;
  pthread_t th[N_JOBS];
  for (int i = 0; i < N_JOBS; i++) {
    if (!(which >> i & 1)) continue;
    memset(&jobs[i], 0, sizeof jobs[i]);
    jobs[i].s = s;
    job_params(&jobs[i], i);
    pthread_create(&th[i], NULL, job_main, &jobs[i]);
  }
  for (int i = 0; i < N_JOBS; i++)
    if (which >> i & 1) pthread_join(th[i], NULL);
  sched_free(s);
}

static void test_mixed_step(void) {
  model *m = NULL;
  herr e = {0};
  model_load_opts mo = {.threads = 2, .device = test_device()};
  CHECK_EQ_INT(model_load(DEFAULT_MODEL, &mo, &m, &e), 0);
  if (!m) return;
  for (int mode = 0; mode < 2; mode++) {
    bool bs = mode == 1; /* on a GPU both are the device path */
    static job all[N_JOBS], alone[N_JOBS];
    run_jobs(m, bs, 0xff, all);
    for (int i = 0; i < N_JOBS; i++) {
      CHECK_MSG(all[i].rc == 0, "job %d: %s", i, all[i].err.msg);
      CHECK_EQ_INT(all[i].n, N_NEW);
    }
    /* the host-only requests: as each one alone samples them on the host */
    for (int i = 0; i < 4; i++) {
      job ref = {0};
      job_params(&ref, i);
      herr e2 = {0};
      CHECK_EQ_INT(sched_run_alone(m, &ref.req, job_token, &ref, &ref.res, &e2), 0);
      CHECK_MSG(ref.n == all[i].n && !memcmp(ref.ids, all[i].ids, sizeof(int32_t) * (size_t)ref.n),
                "backend sampling %d: host-only job %d differs from its run alone", (int)bs, i);
    }
    /* the plain ones: as alone */
    run_jobs(m, bs, 0xf0, alone);
    for (int i = 4; i < N_JOBS; i++)
      CHECK_MSG(alone[i].n == all[i].n && !memcmp(alone[i].ids, all[i].ids, sizeof(int32_t) * (size_t)all[i].n),
                "backend sampling %d: plain job %d changes beside host-only neighbours", (int)bs, i);
  }
  model_free(m);
}

int main(void) {
  test_device_or_skip();
  RUN(test_against_signal);
  RUN(test_dry_greedy);
  RUN(test_mixed_step);
  TEST_MAIN_END();
}
