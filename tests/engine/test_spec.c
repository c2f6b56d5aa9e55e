/* test_spec.c — speculative decoding (engine/method.h) in the scheduler.
 *
 * Greedy: on the built-in model, requests with prompt-lookup drafts, with a
 * draft model (the model itself, and the golden llama as the draft of
 * another), and plain requests run together in the same steps, each giving
 * exactly the ids it gives decoded plainly alone (sched_alone.h) — also in a KV pool
 * so small that requests wait and are preempted; drafts are made and
 * accepted (the stats say how many), every KV block comes back, and a
 * cancel mid-way through a speculative run frees everything; a request
 * under a grammar decodes plainly; stop strings and max_tokens end a
 * speculative request where they end a plain one. Hybrid models (Qwen3.5,
 * dense and MoE: Gated DeltaNet beside attention) decode the same way with
 * prompt lookup and draft models, drafts kept and rejected (their recurrent
 * state goes back to its mark), batched, preempted, and across a second
 * turn that starts from the first's state snapshot; sampled, their bf16
 * copy drafting keeps the distribution; off the CPU backend they refuse.
 *
 * Sampling: sampler_verify keeps the target distribution — many seeded
 * verifications of a drafted token (a point mass, as prompt lookup drafts,
 * and a draft distribution q, as a draft model's) against a logits row of
 * the golden model, chi-square tested against p at a significance of about
 * 1e-9 (and the same test rejects the draft distribution itself, so it can
 * fail). End to end: 1,200 seeded requests drafted by the golden llama's
 * bf16 copy (close to the f32 target, not equal: most drafts kept, some
 * rejected) and 1,200 plain ones give the same distribution of their
 * 2nd and 3rd tokens (two-sample chi-square, same level). Logprobs of the
 * verified tokens are the target's (equal to the plain run's for greedy). */
#include <math.h>
#include <pthread.h>

#include "base/buf.h"
#include "engine/request.h"
#include "sched_alone.h"
#include "engine/kv_paged.h"
#include "engine/method.h"
#include "engine/sample.h"
#include "engine/sched.h"
#include "model/model.h"
#include "test.h"
#include "test_device.h"

#define BUILTIN HEARTH_SOURCE_DIR "/models/default"
#define GOLDEN_LLAMA HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-f32"
#define GOLDEN_QWEN3 HEARTH_SOURCE_DIR "/tests/fixtures/golden/qwen3-f32"
#define GOLDEN_LLAMA_BF16 HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-bf16"
#define GOLDEN_QWEN3_5 HEARTH_SOURCE_DIR "/tests/fixtures/golden/qwen3_5-f32"
#define GOLDEN_QWEN3_5_MOE HEARTH_SOURCE_DIR "/tests/fixtures/golden/qwen3_5_moe-f32"
#define GOLDEN_QWEN3_5_BF16 HEARTH_SOURCE_DIR "/tests/fixtures/golden/qwen3_5-bf16"

typedef struct collected {
  int32_t ids[512];
  float lp[512];
  int n;
  int cancel_after;
} collected;

static int collect(void *user, const char *delta, size_t len, const sample_token *tok) {
  (void)delta, (void)len;
  collected *c = user;
  if (tok && c->n < 512) {
    c->lp[c->n] = tok->logprob;
    c->ids[c->n++] = tok->id;
  }
  return c->cancel_after > 0 && c->n >= c->cancel_after;
}

static model *load(const char *dir) {
  model *m = NULL;
  herr e = {0};
  model_load_opts mo = {.threads = 2, .device = test_device()};
  if (model_load(dir, &mo, &m, &e)) fprintf(stderr, "%s: %s\n", dir, e.msg);
  return m;
}

/* ---- greedy: identical to plain decoding ---- */

#define N_GREEDY 8
#define GREEDY_NEW 40

typedef struct job {
  sched *s;
  gen_request req;
  collected out;
  gen_result res;
  int rc;
  herr err;
} job;

static void *job_main(void *arg) {
  job *j = arg;
  j->rc = sched_run(j->s, &j->req, collect, &j->out, &j->res, &j->err);
  return NULL;
}

static int32_t g_prompt[N_GREEDY][96];
static int g_plen[N_GREEDY];

static void make_prompts(void) {
  for (int i = 0; i < N_GREEDY; i++) {
    /* a phrase repeated (prompt lookup finds it), or tokens that do not repeat */
    bool rep = i % 4 != 3;
    int phrase = 5 + i % 3 * 4;
    g_plen[i] = 40 + i * 5;
    for (int t = 0; t < g_plen[i]; t++)
      g_prompt[i][t] = rep ? (int32_t)(100 + ((t % phrase) * 37 + i * 11) % 400) : (int32_t)(100 + (t * 113 + i * 7) % 400);
  }
}

static bool g_backend_sampling; /* tokens chosen by bk_sample, as on a GPU */
/* how far a logprob may be from the plain run's: the CPU's grouped experts multiply each expert's
 * tokens of a step together, so a token's sums depend on the batch around it, and qwen3_5_moe's
 * expert choice for one token of these prompts sits on a near tie that this tips (with the
 * per-token reference experts every logprob is within 1e-4); its logprobs are compared more
 * loosely, ids always exactly */
static float g_lp_tol = 1e-4f;

static sched_stats run_greedy_mix(model *m, model *draft, spec_source src, bool expect_accept, size_t kv_bytes,
                                  const char *what) {
  gen_method gm = {.spec_tokens = 4, .source = src, .draft = draft};
  sched_config cfg = {.max_batch = 8, .block_tokens = 16, .kv_bytes = kv_bytes, .method = &gm,
                      .backend_sampling = g_backend_sampling};
  sched *s = NULL;
  herr e = {0};
  sched_stats st = {0};
  CHECK_EQ_INT(sched_new(m, NULL, &cfg, &s, &e), 0);
  if (!s) {
    fprintf(stderr, "  %s: %s\n", what, e.msg);
    return st;
  }
  static job jobs[N_GREEDY];
  pthread_t th[N_GREEDY];
  for (int i = 0; i < N_GREEDY; i++) {
    memset(&jobs[i], 0, sizeof jobs[i]);
    jobs[i].s = s;
    gen_request_init(&jobs[i].req);
    jobs[i].req.prompt = g_prompt[i];
    jobs[i].req.n_prompt = (size_t)g_plen[i];
    jobs[i].req.max_tokens = GREEDY_NEW;
    jobs[i].req.sample.greedy = true;
    jobs[i].req.sample.logprobs = true;
    jobs[i].req.ignore_eos = true;
    /* every third request plain, one asking for more drafts than the default */
    if (i % 3 == 2) jobs[i].req.spec_tokens = 0;
    if (i == 4) jobs[i].req.spec_tokens = 7;
    pthread_create(&th[i], NULL, job_main, &jobs[i]);
  }
  for (int i = 0; i < N_GREEDY; i++) pthread_join(th[i], NULL);
  int mismatched = 0;
  for (int i = 0; i < N_GREEDY; i++) {
    CHECK_MSG(jobs[i].rc == 0, "%s: request %d: %s", what, i, jobs[i].err.msg);
    gen_request r = jobs[i].req;
    r.spec_tokens = -1;
    collected ref = {0};
    gen_result rr;
    herr e2 = {0};
    CHECK_EQ_INT(sched_run_alone(m, &r, collect, &ref, &rr, &e2), 0);
    CHECK_EQ_INT(jobs[i].out.n, GREEDY_NEW);
    if (jobs[i].out.n != ref.n || memcmp(jobs[i].out.ids, ref.ids, sizeof(int32_t) * (size_t)ref.n)) {
      mismatched++;
      int t = 0;
      while (t < ref.n && t < jobs[i].out.n && ref.ids[t] == jobs[i].out.ids[t]) t++;
      fprintf(stderr, "  %s: request %d (spec_tokens %d, prompt %d) differs at token %d of %d/%d\n", what, i,
              jobs[i].req.spec_tokens, g_plen[i], t, jobs[i].out.n, ref.n);
      continue;
    }
    for (int t = 0; t < ref.n; t++)
      CHECK_MSG(fabsf(jobs[i].out.lp[t] - ref.lp[t]) < g_lp_tol, "%s: request %d token %d logprob %g vs %g", what, i, t,
                jobs[i].out.lp[t], ref.lp[t]);
  }
  CHECK_MSG(mismatched == 0, "%s: %d of %d requests differ from plain decoding", what, mismatched, N_GREEDY);
  sched_get_stats(s, &st);
  CHECK_EQ_INT(st.blocks_used, 0);
  CHECK_EQ_INT(st.generated_tokens, N_GREEDY * GREEDY_NEW);
  CHECK(st.spec_drafted[src] > 0);
  CHECK(!expect_accept || st.spec_accepted[src] > 0);
  CHECK(st.spec_accepted[src] <= st.spec_drafted[src]);
  if (kv_bytes) CHECK(st.preemptions > 0);
  fprintf(stderr, "  %s: %lld steps, %lld verification steps, drafted %lld, accepted %lld (%.0f%%), %lld preemptions\n",
          what, (long long)st.steps, (long long)st.spec_steps[src], (long long)st.spec_drafted[src],
          (long long)st.spec_accepted[src], 100.0 * (double)st.spec_accepted[src] / (double)st.spec_drafted[src],
          (long long)st.preemptions);
  sched_free(s);
  return st;
}

static model *g_builtin, *g_llama, *g_qwen3, *g_llama_bf16;

static void test_greedy_ngram(void) { run_greedy_mix(g_builtin, NULL, SPEC_NGRAM, true, 0, "ngram"); }

/* a pool of 12 blocks for 8 requests of up to 8 blocks each: requests wait and are preempted */
static void test_greedy_preempted(void) {
  model_kv_geometry g;
  model_kv_geometry_of(g_builtin, &g);
  size_t block = kv_block_bytes(&g, 16);
  run_greedy_mix(g_builtin, NULL, SPEC_NGRAM, true, 12 * block, "ngram, a small pool");
  run_greedy_mix(g_builtin, g_builtin, SPEC_DRAFT, true, 12 * block, "draft (itself), a small pool");
}

static void test_greedy_self_draft(void) {
  run_greedy_mix(g_builtin, g_builtin, SPEC_DRAFT, true, 0, "draft (itself)");
}

/* a random draft model of another architecture: few acceptances, still exact */
static void test_greedy_other_draft(void) { run_greedy_mix(g_llama, g_qwen3, SPEC_DRAFT, false, 0, "draft (qwen3 for llama)"); }

/* The device path (bk_sample, here on the CPU's reference): plain greedy
 * requests have each of their rows' argmax chosen there and verified by id. */
static void test_greedy_backend_sampling(void) {
  g_backend_sampling = true;
  run_greedy_mix(g_builtin, NULL, SPEC_NGRAM, true, 0, "ngram, tokens chosen by bk_sample");
  run_greedy_mix(g_builtin, g_builtin, SPEC_DRAFT, true, 0, "draft (itself), tokens chosen by bk_sample");
  model_kv_geometry g;
  model_kv_geometry_of(g_builtin, &g);
  run_greedy_mix(g_builtin, NULL, SPEC_NGRAM, true, 12 * kv_block_bytes(&g, 16), "ngram, bk_sample, a small pool");
  g_backend_sampling = false;
}

/* cancelled by the callback in the middle of a verification step, and by the flag */
static void test_cancel(void) {
  gen_method gm = {.spec_tokens = 4, .source = SPEC_DRAFT, .draft = g_builtin};
  sched_config cfg = {.max_batch = 4, .method = &gm};
  sched *s = NULL;
  herr e = {0};
  CHECK_EQ_INT(sched_new(g_builtin, NULL, &cfg, &s, &e), 0);
  if (!s) return;
  for (int k = 0; k < 3; k++) {
    gen_request r;
    gen_request_init(&r);
    r.prompt = g_prompt[0];
    r.n_prompt = (size_t)g_plen[0];
    r.max_tokens = 30;
    r.sample.greedy = true;
    r.ignore_eos = true;
    collected c = {.cancel_after = 3 + k * 4};
    gen_result res;
    herr e2 = {0};
    CHECK_EQ_INT(sched_run(s, &r, collect, &c, &res, &e2), HEARTH_ECANCELLED);
    CHECK_EQ_INT(res.finish, GEN_FINISH_CANCELLED);
    CHECK_EQ_INT(c.n, 3 + k * 4); /* nothing committed after the cancel */
  }
  sched_stats st;
  sched_get_stats(s, &st);
  CHECK_EQ_INT(st.blocks_used, 0);
  CHECK_EQ_INT(st.requests_cancelled, 3);
  sched_free(s);
  /* MTP is refused when the scheduler starts, saying so */
  gen_method mtp = {.spec_tokens = 2, .source = SPEC_MTP};
  cfg.method = &mtp;
  herr e3 = {0};
  CHECK_EQ_INT(sched_new(g_builtin, NULL, &cfg, &s, &e3), HEARTH_EUNSUPPORTED);
  CHECK(strstr(e3.msg, "multi-token-prediction") != NULL);
}

/* Prompt lookup's proposals: the longest suffix (4 down to 2 tokens) that
 * occurred before, the latest occurrence with a whole continuation. */
static void test_ngram_proposals(void) {
  gen_request r;
  gen_request_init(&r);
  r.spec_tokens = 4;
  gen_run *run = NULL;
  herr e = {0};
  CHECK_EQ_INT(gen_run_new(NULL, &r, 100, NULL, &run, &e), 0);
  if (!run) return;
  CHECK_EQ_INT(gen_run_kind(run), GEN_METHOD_SPECULATIVE);
  CHECK_EQ_INT(gen_run_source(run), SPEC_NGRAM);
  struct {
    int32_t toks[16];
    int n, max, want_n;
    int32_t want[4];
  } cases[] = {
      {{1, 2, 3, 4, 5, 1, 2, 3}, 8, 4, 4, {4, 5, 1, 2}},      /* "1 2 3" at 0 */
      {{1, 2, 3, 4, 5, 1, 2, 3}, 8, 2, 2, {4, 5}},            /* at most max */
      {{7, 8, 9, 7, 8, 6, 7, 8}, 8, 4, 4, {9, 7, 8, 6}},      /* "7 8" twice: the latest with 4 after it */
      {{7, 8, 9, 7, 8, 6, 7, 8}, 8, 2, 2, {6, 7}},            /* with 2 after it, the latest */
      {{1, 2, 3, 4, 5, 6, 7, 8}, 8, 4, 0, {0}},               /* nothing repeats */
      {{5, 9, 5, 9, 5, 9, 5, 9}, 8, 4, 4, {5, 9, 5, 9}},      /* a loop */
      {{3, 1, 2, 3, 1, 2, 4, 1, 2}, 9, 4, 4, {3, 1, 2, 4}},   /* "1 2": the latest has 3 after it, an earlier 4 */
      {{3, 1, 2, 4, 1, 2}, 6, 4, 3, {4, 1, 2}},               /* the only one: all that follows it */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    gen_proposal p = {.run = run, .toks = cases[i].toks, .n_toks = cases[i].n, .max = cases[i].max};
    CHECK_EQ_INT(gen_runs_propose(&p, 1, NULL, NULL, &e), 0);
    CHECK_MSG(p.n == cases[i].want_n, "case %zu: %d drafts, want %d", i, p.n, cases[i].want_n);
    for (int k = 0; k < p.n && k < cases[i].want_n; k++)
      CHECK_MSG(p.draft[k] == cases[i].want[k], "case %zu: draft %d is %d, want %d", i, k, p.draft[k], cases[i].want[k]);
  }
  gen_run_free(run);
  /* a grammar, or spec_tokens 0, makes an autoregressive run */
  r.grammar = "root ::= \"a\"";
  CHECK_EQ_INT(gen_run_new(NULL, &r, 100, NULL, &run, &e), 0);
  CHECK_EQ_INT(gen_run_kind(run), GEN_METHOD_AUTOREGRESSIVE);
  gen_run_free(run);
  r.grammar = NULL;
  r.spec_tokens = 17;
  CHECK_EQ_INT(gen_run_new(NULL, &r, 100, NULL, &run, &e), HEARTH_EINVAL);
}

/* A request under a grammar decodes plainly, beside speculative ones: its
 * output follows the grammar and no step of it drafts. */
static void test_grammar_plain(void) {
  tokenizer *tok = NULL;
  herr e = {0};
  CHECK_EQ_INT(tokenizer_load(BUILTIN, &tok, &e), 0);
  if (!tok) return;
  gen_method gm = {.spec_tokens = 4, .source = SPEC_NGRAM};
  sched_config cfg = {.max_batch = 4, .method = &gm};
  sched *s = NULL;
  CHECK_EQ_INT(sched_new(g_builtin, tok, &cfg, &s, &e), 0);
  if (!s) {
    tokenizer_free(tok);
    return;
  }
  gen_request r;
  gen_request_init(&r);
  r.prompt = g_prompt[0];
  r.n_prompt = (size_t)g_plen[0];
  r.max_tokens = 12;
  r.sample.greedy = true;
  r.eos_ids[0] = 1;
  r.n_eos = 1;
  static const char gbnf[] = "root ::= (\"ab\" | \" \")+";
  r.grammar = gbnf;
  r.grammar_len = sizeof gbnf - 1;
  collected c = {0};
  gen_result res;
  CHECK_EQ_INT(sched_run(s, &r, collect, &c, &res, &e), 0);
  CHECK(c.n > 0);
  sched_stats st;
  sched_get_stats(s, &st);
  CHECK_EQ_INT(st.spec_drafted[SPEC_NGRAM], 0);
  CHECK_EQ_INT(st.blocks_used, 0);
  sched_free(s);
  tokenizer_free(tok);
}

/* Stop strings and max_tokens end a speculative request where they end a
 * plain one, even when the verified tokens go on past them. */
static void test_stops(void) {
  tokenizer *tok = NULL;
  herr e = {0};
  CHECK_EQ_INT(tokenizer_load(BUILTIN, &tok, &e), 0);
  if (!tok) return;
  gen_method gm = {.spec_tokens = 6, .source = SPEC_DRAFT, .draft = g_builtin};
  sched_config cfg = {.max_batch = 4, .method = &gm};
  sched *s = NULL;
  CHECK_EQ_INT(sched_new(g_builtin, tok, &cfg, &s, &e), 0);
  if (!s) {
    tokenizer_free(tok);
    return;
  }
  int n_stopped = 0;
  for (int k = 0; k < 4; k++) {
    /* the stop string: 3 characters from the middle of the plain output (k == 3: one that never occurs) */
    gen_request r0;
    gen_request_init(&r0);
    r0.prompt = g_prompt[k];
    r0.n_prompt = (size_t)g_plen[k];
    r0.max_tokens = 24;
    r0.sample.greedy = true;
    r0.ignore_eos = true;
    r0.spec_tokens = 0;
    collected c0 = {0};
    gen_result res0;
    CHECK_EQ_INT(sched_run(s, &r0, collect, &c0, &res0, &e), 0);
    hbuf text = {0};
    tokenizer_decode(tok, c0.ids, (size_t)c0.n, true, &text, NULL);
    char stop[8] = "zzz-q";
    if (k < 3 && text.len > 8) memcpy(stop, text.data + text.len / 2 + k, 3), stop[3] = 0;
    hbuf_free(&text);
    const char *stops[1] = {stop};
    collected c[2];
    memset(c, 0, sizeof c);
    gen_result res[2];
    for (int spec = 0; spec < 2; spec++) {
      gen_request r = r0;
      r.max_tokens = 20 + k;
      r.stop = stops;
      r.n_stop = 1;
      r.spec_tokens = spec ? -1 : 0;
      CHECK_EQ_INT(sched_run(s, &r, collect, &c[spec], &res[spec], &e), 0);
    }
    CHECK_EQ_INT(c[1].n, c[0].n);
    CHECK(memcmp(c[1].ids, c[0].ids, sizeof(int32_t) * (size_t)c[0].n) == 0);
    CHECK_EQ_INT(res[1].finish, res[0].finish);
    CHECK_EQ_INT(res[1].stop_index, res[0].stop_index);
    CHECK_EQ_INT(res[1].completion_tokens, res[0].completion_tokens);
    n_stopped += res[1].stop_index >= 0;
  }
  CHECK(n_stopped >= 2); /* the stop strings do occur */
  sched_stats st;
  sched_get_stats(s, &st);
  CHECK(st.spec_accepted[SPEC_DRAFT] > 0);
  CHECK_EQ_INT(st.blocks_used, 0);
  sched_free(s);
  tokenizer_free(tok);
}

/* ---- hybrid models: recurrent state rolled back ---- */

static model *g_q35, *g_q35moe, *g_q35_bf16;
static void sampled_end_to_end(model *target, model *draft);

/* Whether speculation runs on a hybrid model here (the CPU backend); elsewhere it is refused, saying
 * so, by the scheduler's method and per request, and plain requests still run. */
static bool hybrid_runs(model *m) {
  if (gen_method_can_rollback(m)) return true;
  CHECK(!bk_backend_is_cpu(model_backend(m)));
  gen_method gm = {.spec_tokens = 2, .source = SPEC_NGRAM};
  sched_config cfg = {.max_batch = 2, .method = &gm};
  sched *s = NULL;
  herr e = {0};
  CHECK_EQ_INT(sched_new(m, NULL, &cfg, &s, &e), HEARTH_EUNSUPPORTED);
  CHECK(strstr(e.msg, "CPU backend only") != NULL);
  cfg.method = NULL;
  CHECK_EQ_INT(sched_new(m, NULL, &cfg, &s, &e), 0);
  if (s) {
    static const int32_t prompt[] = {5, 17, 200, 31, 9};
    gen_request r;
    gen_request_init(&r);
    r.prompt = prompt;
    r.n_prompt = 5;
    r.max_tokens = 4;
    r.sample.greedy = true;
    r.spec_tokens = 2;
    collected c = {0};
    gen_result res;
    herr e2 = {0};
    CHECK_EQ_INT(sched_run(s, &r, collect, &c, &res, &e2), HEARTH_EUNSUPPORTED);
    CHECK_EQ_STR(e2.field, "spec_tokens");
    sched_free(s);
  }
  return false;
}

/* Greedy on a hybrid model (Gated DeltaNet beside attention) is plain decoding token for token:
 * prompt lookup (drafts kept and rejected: the state goes back to its mark), a draft model that
 * is the model itself (all kept), the other hybrid (mostly rejected: the target's state and the
 * recurrent draft's own are rolled back), an attention model drafting for a hybrid and a hybrid
 * for an attention model — batched beside plain requests, in a pool small enough to preempt, and
 * with the tokens chosen by bk_sample. The MTP source stays refused (no MTP layer is loaded). */
static void hybrid_greedy(model *m, model *other, const char *name) {
  if (!hybrid_runs(m)) return;
  char what[160];
  sched_stats st;
  snprintf(what, sizeof what, "%s: ngram", name);
  st = run_greedy_mix(m, NULL, SPEC_NGRAM, true, 0, what);
  CHECK_MSG(st.spec_accepted[SPEC_NGRAM] < st.spec_drafted[SPEC_NGRAM], "%s: no draft was rejected", what);
  /* the state after each verified token is kept: a rejection installs the last accepted one's, and no
   * accepted token is computed again */
  CHECK_MSG(st.spec_refed == 0, "%s: %lld tokens fed again", what, (long long)st.spec_refed);
  snprintf(what, sizeof what, "%s: draft (itself)", name);
  st = run_greedy_mix(m, m, SPEC_DRAFT, true, 0, what);
  CHECK_EQ_INT(st.spec_accepted[SPEC_DRAFT], st.spec_drafted[SPEC_DRAFT]);
  snprintf(what, sizeof what, "%s: draft (the other hybrid)", name);
  st = run_greedy_mix(m, other, SPEC_DRAFT, false, 0, what);
  CHECK_MSG(st.spec_accepted[SPEC_DRAFT] < st.spec_drafted[SPEC_DRAFT], "%s: no draft was rejected", what);
  CHECK_MSG(st.spec_refed == 0, "%s: %lld tokens fed again", what, (long long)st.spec_refed);
  snprintf(what, sizeof what, "%s: draft (llama)", name);
  run_greedy_mix(m, g_llama, SPEC_DRAFT, false, 0, what);
  snprintf(what, sizeof what, "llama: draft (%s)", name);
  run_greedy_mix(g_llama, m, SPEC_DRAFT, false, 0, what);
  model_kv_geometry g;
  model_kv_geometry_of(m, &g);
  size_t block = kv_block_bytes(&g, 16);
  snprintf(what, sizeof what, "%s: ngram, a small pool", name);
  st = run_greedy_mix(m, NULL, SPEC_NGRAM, true, 12 * block, what);
  CHECK_MSG(st.spec_refed == 0, "%s: %lld tokens fed again", what, (long long)st.spec_refed);
  snprintf(what, sizeof what, "%s: draft (the other hybrid), a small pool", name);
  st = run_greedy_mix(m, other, SPEC_DRAFT, false, 12 * block, what);
  CHECK_MSG(st.spec_refed == 0, "%s: %lld tokens fed again", what, (long long)st.spec_refed);
  g_backend_sampling = true;
  snprintf(what, sizeof what, "%s: ngram, tokens chosen by bk_sample", name);
  run_greedy_mix(m, NULL, SPEC_NGRAM, true, 0, what);
  snprintf(what, sizeof what, "%s: draft (the other hybrid), tokens chosen by bk_sample", name);
  run_greedy_mix(m, other, SPEC_DRAFT, false, 0, what);
  g_backend_sampling = false;
  gen_method mtp = {.spec_tokens = 2, .source = SPEC_MTP};
  sched_config cfg = {.max_batch = 2, .method = &mtp};
  sched *s = NULL;
  herr e = {0};
  CHECK_EQ_INT(sched_new(m, NULL, &cfg, &s, &e), HEARTH_EUNSUPPORTED);
}

static void test_hybrid_greedy(void) {
  hybrid_greedy(g_q35, g_q35moe, "qwen3_5");
  g_lp_tol = 0.05f;
  hybrid_greedy(g_q35moe, g_q35, "qwen3_5_moe");
  g_lp_tol = 1e-4f;
}

/* One request, then a second turn on its whole conversation: the first's speculative steps stop
 * at block ends, so every full block of its output has a state snapshot, and the second starts
 * from the last of them (a snapshot of a rejected position would change its tokens); both equal
 * plain decoding. */
static void hybrid_turns(model *m, spec_source src, model *draft, const char *what) {
  gen_method gm = {.spec_tokens = 4, .source = src, .draft = draft};
  sched_config cfg = {.max_batch = 4, .block_tokens = 16, .method = &gm};
  sched *s = NULL;
  herr e = {0};
  CHECK_EQ_INT(sched_new(m, NULL, &cfg, &s, &e), 0);
  if (!s) return;
  int32_t conv[128];
  int n = g_plen[0];
  memcpy(conv, g_prompt[0], sizeof(int32_t) * (size_t)n);
  static const int turn_new[2] = {40, 30};
  for (int turn = 0; turn < 2; turn++) {
    if (turn) { /* the second turn: the first's output and a few tokens more */
      static const int32_t more[] = {7, 300, 42, 9, 260};
      memcpy(conv + n, more, sizeof more);
      n += 5;
    }
    gen_request r;
    gen_request_init(&r);
    r.prompt = conv;
    r.n_prompt = (size_t)n;
    r.max_tokens = turn_new[turn];
    r.sample.greedy = true;
    r.ignore_eos = true;
    collected c = {0}, ref = {0};
    gen_result res, rr;
    herr e2 = {0};
    CHECK_EQ_INT(sched_run(s, &r, collect, &c, &res, &e2), 0);
    r.spec_tokens = 0;
    CHECK_EQ_INT(sched_run_alone(m, &r, collect, &ref, &rr, &e2), 0);
    CHECK_EQ_INT(c.n, turn_new[turn]);
    CHECK_MSG(c.n == ref.n && !memcmp(c.ids, ref.ids, sizeof(int32_t) * (size_t)ref.n),
              "%s: turn %d differs from plain decoding", what, turn + 1);
    if (turn) { /* the first turn's KV ends at 40 + 40 - 1: blocks to 64 have snapshots */
      CHECK_EQ_INT(res.cached_tokens, 64);
      fprintf(stderr, "  %s: the second turn had %lld of %d prompt tokens cached\n", what,
              (long long)res.cached_tokens, n);
    }
    memcpy(conv + n, c.ids, sizeof(int32_t) * (size_t)c.n);
    n += c.n;
  }
  sched_stats st;
  sched_get_stats(s, &st);
  CHECK(st.spec_drafted[src] > 0);
  if (draft == m) CHECK_EQ_INT(st.spec_accepted[src], st.spec_drafted[src]);
  else if (draft) CHECK(st.spec_accepted[src] < st.spec_drafted[src]);
  CHECK_MSG(st.spec_refed == 0, "%s: %lld tokens fed again", what, (long long)st.spec_refed);
  fprintf(stderr, "  %s: drafted %lld, accepted %lld\n", what, (long long)st.spec_drafted[src],
          (long long)st.spec_accepted[src]);
  CHECK_EQ_INT(st.blocks_used, 0);
  sched_free(s);
}

static void test_hybrid_prefix_cache(void) {
  if (!gen_method_can_rollback(g_q35)) return;
  hybrid_turns(g_q35, SPEC_NGRAM, NULL, "qwen3_5: ngram");
  hybrid_turns(g_q35, SPEC_DRAFT, g_q35, "qwen3_5: draft (itself)");
  hybrid_turns(g_q35, SPEC_DRAFT, g_q35moe, "qwen3_5: draft (qwen3_5_moe)");
  hybrid_turns(g_q35moe, SPEC_DRAFT, g_q35_bf16, "qwen3_5_moe: draft (qwen3_5 bf16)");
}

/* Sampled: the hybrid's bf16 copy drafting for it (most drafts kept), and the MoE hybrid (most
 * rejected), keep its distribution (the same two-sample check as the attention model's). */
static void test_hybrid_sampled(void) {
  if (!gen_method_can_rollback(g_q35)) return;
  sampled_end_to_end(g_q35, g_q35_bf16);
  sampled_end_to_end(g_q35, g_q35moe); /* another model: most drafts rejected, the state rolled back */
}

/* ---- sampling: the target distribution is kept ---- */

/* Pearson's chi-square critical value at a tail probability of about 1e-9
 * (Wilson-Hilferty with z = 6). */
static double chi2_crit(int dof) {
  double k = dof, z = 6.0;
  double t = 1 - 2 / (9 * k) + z * sqrt(2 / (9 * k));
  return k * t * t * t;
}

/* Goodness of fit of counts (total n) to probabilities p: cells with an
 * expected count below 5 are pooled. Returns the statistic and its dof. */
static double chi2_fit(const int64_t *counts, const double *p, int nv, int64_t n, int *dof) {
  double stat = 0, pool_e = 0, pool_o = 0;
  int cells = 0;
  for (int i = 0; i < nv; i++) {
    double ex = p[i] * (double)n;
    if (ex < 5) {
      pool_e += ex;
      pool_o += (double)counts[i];
      continue;
    }
    stat += ((double)counts[i] - ex) * ((double)counts[i] - ex) / ex;
    cells++;
  }
  if (pool_e >= 5) {
    stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
    cells++;
  } else if (pool_o > 20) {
    stat += 1e9; /* mass where p has (almost) none */
  }
  *dof = cells - 1;
  return stat;
}

/* Two samples from one distribution? Cells with fewer than 10 in both together are pooled. */
static double chi2_two(const int64_t *a, const int64_t *b, int nv, int64_t na, int64_t nb, int *dof) {
  double stat = 0, pa = 0, pb = 0;
  int cells = 0;
  for (int i = 0; i <= nv; i++) {
    double x, y;
    if (i < nv) {
      x = (double)a[i], y = (double)b[i];
      if (x + y < 10) {
        pa += x, pb += y;
        continue;
      }
    } else {
      x = pa, y = pb;
      if (x + y == 0) continue;
    }
    double t = x + y, ea = t * (double)na / (double)(na + nb), eb = t * (double)nb / (double)(na + nb);
    stat += (x - ea) * (x - ea) / ea + (y - eb) * (y - eb) / eb;
    cells++;
  }
  *dof = cells - 1;
  return stat;
}

/* Under the sanitizers fewer draws (the same code; the test's power to catch a bad verifier is
   checked in the plain build) */
#if defined(__SANITIZE_ADDRESS__)
#define N_DRAWS 20000
#else
#define N_DRAWS 80000
#endif

static void verify_distribution(const float *logits, int nv, const sample_params *sp, bool with_q, const char *what) {
  sampler *smp = NULL;
  herr e = {0};
  CHECK_EQ_INT(sampler_new(nv, sp, &smp, &e), 0);
  float *row = malloc(sizeof(float) * (size_t)nv), *pf = malloc(sizeof(float) * (size_t)nv);
  float *q = malloc(sizeof(float) * (size_t)nv);
  double *p = calloc((size_t)nv, sizeof(double)), *qd = calloc((size_t)nv, sizeof(double));
  int64_t *cnt = calloc((size_t)nv, sizeof(int64_t)), *qcnt = calloc((size_t)nv, sizeof(int64_t));
  memcpy(row, logits, sizeof(float) * (size_t)nv);
  CHECK_EQ_INT(sampler_distribution(smp, row, pf, &e), 0);
  for (int i = 0; i < nv; i++) p[i] = pf[i];
  /* the draft: the second most likely token (point mass), or q: the row
   * shifted by 7 ids and tempered, so q and p overlap only partly */
  int32_t best = 0, second = -1;
  for (int i = 1; i < nv; i++)
    if (p[i] > p[best]) best = i;
  for (int i = 0; i < nv; i++)
    if (i != best && (second < 0 || p[i] > p[second])) second = i;
  if (with_q) {
    double z = 0;
    for (int i = 0; i < nv; i++) z += qd[i] = exp(2.0 * (double)logits[(i + 7) % nv]);
    for (int i = 0; i < nv; i++) q[i] = (float)(qd[i] /= z);
  }
  sample_rng rng;
  sample_rng_seed(&rng, 12345);
  int64_t accepted = 0;
  for (int64_t k = 0; k < N_DRAWS; k++) {
    int32_t d = second;
    if (with_q) {
      double u = sample_rng_uniform(&rng), acc = 0;
      d = nv - 1;
      for (int i = 0; i < nv; i++)
        if (u < (acc += q[i])) {
          d = i;
          break;
        }
      qcnt[d]++;
    }
    memcpy(row, logits, sizeof(float) * (size_t)nv);
    sample_token st;
    bool acc = false;
    if (sampler_verify(smp, row, d, with_q ? q : NULL, &rng, &st, &acc, &e)) {
      CHECK_MSG(0, "%s: %s", what, e.msg);
      break;
    }
    cnt[st.id]++;
    accepted += acc;
    CHECK(!acc || st.id == d);
  }
  int dof;
  double x2 = chi2_fit(cnt, p, nv, N_DRAWS, &dof);
  CHECK_MSG(dof >= 1 && x2 < chi2_crit(dof), "%s: chi-square %.1f with %d dof (critical %.1f)", what, x2, dof,
            chi2_crit(dof));
  fprintf(stderr, "  %s: chi-square %.1f, %d dof (critical %.1f at ~1e-9); %.1f%% of drafts accepted\n", what, x2, dof,
          chi2_crit(dof), 100.0 * (double)accepted / N_DRAWS);
#if !defined(__SANITIZE_ADDRESS__)
  if (with_q) { /* the drafts alone fail the same test: it has the power to catch a bad verifier */
    int dq;
    double xq = chi2_fit(qcnt, p, nv, N_DRAWS, &dq);
    CHECK_MSG(xq > chi2_crit(dq), "%s: the draft distribution itself passes (%.1f)", what, xq);
  }
#endif
  sampler_free(smp);
  free(row), free(pf), free(q), free(p), free(qd), free(cnt), free(qcnt);
}

static void test_verify_distribution(void) {
  /* a logits row of the golden llama after a short prompt */
  int nv = (int)model_vocab_size(g_llama);
  float *logits = malloc(sizeof(float) * (size_t)nv);
  int32_t prompt[] = {5, 17, 200, 31, 9};
  sched_config cfg = {.max_batch = 2};
  sched *s = NULL;
  herr e = {0};
  CHECK_EQ_INT(sched_new(g_llama, NULL, &cfg, &s, &e), 0);
  sched_probe pr = {.ids = prompt, .n_ids = 5, .out = logits};
  CHECK_EQ_INT(sched_probe_run(s, SCHED_NEXT_LOGITS, &pr, 1, NULL, &e), 0);
  sched_free(s);
  /* the random model's logits, scaled to a spread of 1.5 so that p has a shape */
  double mean = 0, var = 0;
  for (int i = 0; i < nv; i++) mean += logits[i] / nv;
  for (int i = 0; i < nv; i++) var += (logits[i] - mean) * (logits[i] - mean) / nv;
  fprintf(stderr, "  logits: mean %g, sd %g\n", mean, sqrt(var));
  for (int i = 0; i < nv; i++) logits[i] = (float)((logits[i] - mean) * 1.5 / sqrt(var));
  sample_params sp;
  sample_params_default(&sp);
  sp.seed = 7;
  verify_distribution(logits, nv, &sp, false, "point-mass draft, T=1");
  verify_distribution(logits, nv, &sp, true, "draft distribution, T=1");
  sp.temperature = 0.7f;
  sp.top_k = 40;
  sp.top_p = 0.95f;
  verify_distribution(logits, nv, &sp, false, "point-mass draft, T=0.7 top-k 40 top-p 0.95");
  verify_distribution(logits, nv, &sp, true, "draft distribution, T=0.7 top-k 40 top-p 0.95");
  free(logits);
}

/* End to end through the scheduler: the 2nd and 3rd tokens of seeded
 * sampled requests, speculative (the bf16 copy drafting) against plain. */
#if defined(__SANITIZE_ADDRESS__)
#define N_E2E 320 /* under the sanitizers: the same threads and paths, fewer requests */
#else
#define N_E2E 1200
#endif
#define E2E_WORKERS 16

typedef struct e2e_worker {
  sched *s;
  int from, to;
  bool spec;
  int32_t (*out)[3];
} e2e_worker;

static void *e2e_main(void *arg) {
  e2e_worker *w = arg;
  static const int32_t prompt[] = {5, 17, 200, 31, 9, 44};
  for (int i = w->from; i < w->to; i++) {
    gen_request r;
    gen_request_init(&r);
    r.prompt = prompt;
    r.n_prompt = 6;
    r.max_tokens = 3;
    r.ignore_eos = true;
    r.sample.temperature = 1.0f;
    r.sample.top_k = 6;
    r.sample.seed = (uint64_t)i * 2654435761u + (w->spec ? 1 : 0);
    r.spec_tokens = w->spec ? 2 : 0;
    collected c = {0};
    gen_result res;
    herr e = {0};
    if (sched_run(w->s, &r, collect, &c, &res, &e) || c.n != 3) {
      fprintf(stderr, "request %d: %s\n", i, e.msg);
      w->out[i][0] = -1;
      continue;
    }
    memcpy(w->out[i], c.ids, sizeof(int32_t) * 3);
  }
  return NULL;
}

static void sampled_end_to_end(model *target, model *draft) {
  gen_method gm = {.spec_tokens = 2, .source = SPEC_DRAFT, .draft = draft};
  sched_config cfg = {.max_batch = 16, .method = &gm};
  sched *s = NULL;
  herr e = {0};
  CHECK_EQ_INT(sched_new(target, NULL, &cfg, &s, &e), 0);
  if (!s) return;
  int32_t(*spec)[3] = calloc(N_E2E, sizeof *spec), (*plain)[3] = calloc(N_E2E, sizeof *plain);
  pthread_t th[2 * E2E_WORKERS];
  e2e_worker w[2 * E2E_WORKERS];
  for (int k = 0; k < 2 * E2E_WORKERS; k++) {
    int per = N_E2E / E2E_WORKERS, j = k % E2E_WORKERS;
    w[k] = (e2e_worker){.s = s, .from = j * per, .to = (j + 1) * per, .spec = k < E2E_WORKERS,
                        .out = k < E2E_WORKERS ? spec : plain};
    pthread_create(&th[k], NULL, e2e_main, &w[k]);
  }
  for (int k = 0; k < 2 * E2E_WORKERS; k++) pthread_join(th[k], NULL);
  sched_stats st;
  sched_get_stats(s, &st);
  CHECK(st.spec_drafted[SPEC_DRAFT] >= N_E2E);
  CHECK(st.spec_accepted[SPEC_DRAFT] > 0 && st.spec_accepted[SPEC_DRAFT] < st.spec_drafted[SPEC_DRAFT]);
  CHECK_EQ_INT(st.blocks_used, 0);
  int nv = (int)model_vocab_size(target);
  for (int pos = 1; pos <= 2; pos++) {
    int64_t *a = calloc((size_t)nv, sizeof(int64_t)), *b = calloc((size_t)nv, sizeof(int64_t));
    int64_t na = 0, nb = 0;
    for (int i = 0; i < N_E2E; i++) {
      if (spec[i][0] >= 0) a[spec[i][pos]]++, na++;
      if (plain[i][0] >= 0) b[plain[i][pos]]++, nb++;
    }
    CHECK_EQ_INT(na, N_E2E);
    CHECK_EQ_INT(nb, N_E2E);
    int dof;
    double x2 = chi2_two(a, b, nv, na, nb, &dof);
    CHECK_MSG(dof >= 1 && x2 < chi2_crit(dof), "token %d: chi-square %.1f with %d dof (critical %.1f)", pos + 1, x2,
              dof, chi2_crit(dof));
    fprintf(stderr, "  end to end, token %d: two-sample chi-square %.1f, %d dof (critical %.1f)\n", pos + 1, x2, dof,
            chi2_crit(dof));
    free(a), free(b);
  }
  fprintf(stderr, "  end to end: drafted %lld, accepted %lld\n", (long long)st.spec_drafted[SPEC_DRAFT],
          (long long)st.spec_accepted[SPEC_DRAFT]);
  free(spec), free(plain);
  sched_free(s);
}

static void test_sampled_end_to_end(void) { sampled_end_to_end(g_llama, g_llama_bf16); }

int main(void) {
  test_device_or_skip();
  make_prompts();
  g_builtin = load(BUILTIN);
  g_llama = load(GOLDEN_LLAMA);
  g_qwen3 = load(GOLDEN_QWEN3);
  g_llama_bf16 = load(GOLDEN_LLAMA_BF16);
  g_q35 = load(GOLDEN_QWEN3_5);
  g_q35moe = load(GOLDEN_QWEN3_5_MOE);
  g_q35_bf16 = load(GOLDEN_QWEN3_5_BF16);
  if (!g_builtin || !g_llama || !g_qwen3 || !g_llama_bf16 || !g_q35 || !g_q35moe || !g_q35_bf16) return 1;
  RUN(test_ngram_proposals);
  RUN(test_greedy_ngram);
  RUN(test_greedy_self_draft);
  RUN(test_greedy_other_draft);
  RUN(test_greedy_preempted);
  RUN(test_greedy_backend_sampling);
  RUN(test_cancel);
  RUN(test_grammar_plain);
  RUN(test_stops);
  RUN(test_hybrid_greedy);
  RUN(test_hybrid_prefix_cache);
  RUN(test_verify_distribution);
  RUN(test_sampled_end_to_end);
  RUN(test_hybrid_sampled);
  model_free(g_q35);
  model_free(g_q35moe);
  model_free(g_q35_bf16);
  model_free(g_builtin);
  model_free(g_llama);
  model_free(g_qwen3);
  model_free(g_llama_bf16);
  TEST_MAIN_END();
}
