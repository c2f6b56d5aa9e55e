/* test_sched.c — the continuous-batching scheduler on the golden llama
 * fixture (and the glm5 one for the first check): 32 concurrent greedy requests (different lengths, some sharing
 * prefixes) give exactly the ids each gives run alone (sched_alone.h: plainly, on a
 * scheduler of its own that runs one sequence at a time),
 * also with a KV pool so small that requests wait and get preempted (and a
 * pinned case where the newer of two must be preempted and recomputed); a
 * request sharing a 1,000-token prefix reports cached_tokens covering every
 * full shared block; 64 concurrent requests with random early cancellations
 * leave every block back in the pool; a request that can never fit is
 * refused with "memory_admission:" before any work. The cancellation and
 * preemption runs are traced (base/trace.h): every request's track holds one
 * request span with the rest nested in it, one after another; the preempted
 * request shows its preemption, its second wait and its recomputed prefill.
 * The same batching, preemption and prefix runs on the Qwen3.5 hybrid
 * fixture (recurrent states beside the paged KV), and a conversation's
 * second turn that resumes from the first turn's state snapshot. */
#include <jansson.h>
#include <pthread.h>
#include <unistd.h>

#include "base/trace.h"
#include "engine/request.h"
#include "sched_alone.h"
#include "engine/kv_paged.h"
#include "engine/sched.h"
#include "model/model.h"
#include "test.h"
#include "test_device.h"

#define FIXTURE HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-f32"
#define HYBRID HEARTH_SOURCE_DIR "/tests/fixtures/golden/qwen3_5-f32"
#define N_REQ 32
#define MAX_NEW 12

static model *g_m;

typedef struct collected {
  int32_t ids[256];
  int n;
  int cancel_after; /* > 0: the callback cancels after this many tokens */
} collected;

static int collect(void *user, const char *delta, size_t len, const sample_token *tok) {
  (void)delta, (void)len;
  collected *c = user;
  if (tok && c->n < 256) c->ids[c->n++] = tok->id;
  return c->cancel_after > 0 && c->n >= c->cancel_after;
}

static int32_t g_prompts[N_REQ][120];
static int g_len[N_REQ];
static collected g_ref[N_REQ];

static void make_prompts(void) {
  for (int i = 0; i < N_REQ; i++) {
    g_len[i] = 3 + (i * 13) % 90;
    for (int t = 0; t < g_len[i]; t++) {
      /* even requests share a common prefix of up to 40 tokens */
      bool shared = (i % 2 == 0) && t < 40;
      g_prompts[i][t] = shared ? (int32_t)((t * 31 + 5) % 500 + 3) : (int32_t)((t * 17 + i * 101) % 500 + 3);
    }
  }
}

static void greedy_request(gen_request *r, int i) {
  gen_request_init(r);
  r->prompt = g_prompts[i];
  r->n_prompt = (size_t)g_len[i];
  r->max_tokens = MAX_NEW;
  r->sample.greedy = true;
  r->ignore_eos = true;
}

typedef struct job {
  sched *s;
  int i;
  gen_request req;
  collected out;
  gen_result res;
  int rc;
  volatile int cancel;
  int cancel_flag_after_us;
} job;

static void *job_main(void *arg) {
  job *j = arg;
  herr e = {0};
  j->rc = sched_run(j->s, &j->req, collect, &j->out, &j->res, &e);
  if (j->rc && j->rc != HEARTH_ECANCELLED) fprintf(stderr, "request %d: %s\n", j->i, e.msg);
  return NULL;
}

/* roomy: nothing is evicted (nor, for a hybrid model, a state snapshot), so a
 * request run again finds its blocks cached. */
static void check_against_alone(const sched_config *cfg, const char *what, bool roomy) {
  sched *s;
  herr e = {0};
  CHECK_EQ_INT(sched_new(g_m, NULL, cfg, &s, &e), 0);
  if (!s) return;
  static job jobs[N_REQ];
  pthread_t th[N_REQ];
  for (int i = 0; i < N_REQ; i++) {
    memset(&jobs[i], 0, sizeof jobs[i]);
    jobs[i].s = s;
    jobs[i].i = i;
    greedy_request(&jobs[i].req, i);
    pthread_create(&th[i], NULL, job_main, &jobs[i]);
  }
  for (int i = 0; i < N_REQ; i++) pthread_join(th[i], NULL);
  int mismatched = 0;
  for (int i = 0; i < N_REQ; i++) {
    CHECK_EQ_INT(jobs[i].rc, 0);
    CHECK_EQ_INT(jobs[i].out.n, MAX_NEW);
    CHECK_EQ_INT(jobs[i].res.finish, GEN_FINISH_LENGTH);
    CHECK_EQ_INT(jobs[i].res.prompt_tokens, g_len[i]);
    if (jobs[i].out.n != g_ref[i].n || memcmp(jobs[i].out.ids, g_ref[i].ids, sizeof(int32_t) * (size_t)g_ref[i].n))
      mismatched++;
  }
  CHECK_MSG(mismatched == 0, "%s: %d of %d requests differ from their run alone", what, mismatched, N_REQ);
  sched_stats st;
  sched_get_stats(s, &st);
  CHECK_EQ_INT(st.blocks_used, 0);
  CHECK_EQ_INT(st.running, 0);
  CHECK_EQ_INT(st.waiting, 0);
  CHECK_EQ_INT(st.requests_finished, N_REQ);
  CHECK_EQ_INT(st.generated_tokens, N_REQ * MAX_NEW);
  fprintf(stderr, "  %s: %lld steps (at most %lld sequences in one), %lld preemptions, prefix hits %lld / %lld tokens\n", what, (long long)st.steps, (long long)st.peak_batch,
          (long long)st.preemptions, (long long)st.prefix_hit_tokens,
          (long long)(st.prefix_hit_tokens + st.prefix_miss_tokens));
  /* the requests ran together, not one at a time (whether the small pool preempts depends on
   * how the requests' arrivals overlap, so it is reported above, not asserted) */
  CHECK_MSG(st.peak_batch > 1, "%s: no step ran more than one sequence", what);
  /* Whether the concurrent requests found each other's blocks depends on when
   * each was admitted; the longest request again, after all of them, must find its own. */
  int L = 0;
  for (int i = 1; i < N_REQ; i++)
    if (g_len[i] > g_len[L]) L = i;
  job again = {.s = s, .i = L};
  greedy_request(&again.req, L);
  job_main(&again);
  CHECK_EQ_INT(again.rc, 0);
  CHECK_MSG(again.out.n == g_ref[L].n && !memcmp(again.out.ids, g_ref[L].ids, sizeof(int32_t) * (size_t)g_ref[L].n),
            "%s: request %d from the prefix cache differs from its run alone", what, L);
  sched_stats st2;
  sched_get_stats(s, &st2);
  if (roomy) CHECK(st2.prefix_hit_tokens > st.prefix_hit_tokens);
  sched_free(s);
}

static void test_batched_equals_alone(void) {
  make_prompts();
  memset(g_ref, 0, sizeof g_ref);
  for (int i = 0; i < N_REQ; i++) {
    gen_request r;
    greedy_request(&r, i);
    gen_result res;
    herr e = {0};
    memset(&g_ref[i], 0, sizeof g_ref[i]);
    CHECK_EQ_INT(sched_run_alone(g_m, &r, collect, &g_ref[i], &res, &e), 0);
  }
  sched_config big = {.max_batch = 64, .prefill_chunk = 16, .block_tokens = 4, .state_snapshots = 4096};
  check_against_alone(&big, "roomy pool", true);
  /* 40 blocks of 4 tokens: requests of up to 104 rows wait and get preempted */
  model_kv_geometry g;
  model_kv_geometry_of(g_m, &g);
  sched_config tight = {.max_batch = 8, .prefill_chunk = 8, .block_tokens = 4, .kv_bytes = 40 * kv_block_bytes(&g, 4)};
  check_against_alone(&tight, "tight pool", false);
}

/* The same on GLM-5 (the glm5 fixture): latent K rows and indexer keys in
 * the pool, each query attending its index_topk chosen rows. */
static void test_batched_equals_alone_glm5(void) {
  model *llama = g_m, *m = NULL;
  herr e = {0};
  model_load_opts mo = {.threads = 2, .device = test_device()};
  CHECK_EQ_INT(model_load(HEARTH_SOURCE_DIR "/tests/fixtures/golden/glm5-f32", &mo, &m, &e), 0);
  if (!m) return;
  g_m = m;
  test_batched_equals_alone();
  g_m = llama;
  model_free(m);
}

static void test_prefix_cached_tokens(void) {
  sched_config cfg = {.block_tokens = 16, .context_length = 1100};
  sched *s;
  herr e = {0};
  CHECK_EQ_INT(sched_new(g_m, NULL, &cfg, &s, &e), 0);
  if (!s) return;
  static int32_t a[1010], b[1030];
  for (int i = 0; i < 1000; i++) a[i] = b[i] = (int32_t)((i * 7919) % 509 + 2);
  for (int i = 1000; i < 1010; i++) a[i] = 3;
  for (int i = 1000; i < 1030; i++) b[i] = 4;
  gen_request r;
  gen_request_init(&r);
  r.sample.greedy = true;
  r.max_tokens = 2;
  r.context_length = 1100;
  r.ignore_eos = true;
  r.prompt = a;
  r.n_prompt = 1010;
  gen_result res;
  collected c = {0};
  CHECK_EQ_INT(sched_run(s, &r, collect, &c, &res, &e), 0);
  CHECK_EQ_INT(res.cached_tokens, 0);
  r.prompt = b;
  r.n_prompt = 1030;
  CHECK_EQ_INT(sched_run(s, &r, collect, &c, &res, &e), 0);
  CHECK_EQ_INT(res.cached_tokens, 992); /* every full 16-token block of the shared 1,000 */
  /* the same prompt again: everything but the block holding the last token */
  CHECK_EQ_INT(sched_run(s, &r, collect, &c, &res, &e), 0);
  CHECK_EQ_INT(res.cached_tokens, 1024);
  sched_stats st;
  sched_get_stats(s, &st);
  CHECK_EQ_INT(st.prefix_hit_tokens, 992 + 1024);
  CHECK_EQ_INT(st.blocks_used, 0);
  sched_free(s);
}

/* ---- traces ---- */

typedef struct trace_track {
  int64_t tid;
  char name[64];
  json_t *request;                    /* borrowed: the one request span */
  int n_spans, n_queue, n_lookup, n_prefill, n_recompute, n_decode, n_detok, n_preempted;
} trace_track;

static int64_t ns_of(const json_t *ev, const char *key) {
  return (int64_t)llround(json_number_value(json_object_get(ev, key)) * 1000);
}
static int64_t arg_int(const json_t *ev, const char *key) {
  return json_integer_value(json_object_get(json_object_get(ev, "args"), key));
}

/* Reads a trace back and checks every request track: one request span,
 * everything else inside it and one after another. Fills up to cap tracks;
 * returns how many; *arr (owned by the caller) keeps the events alive. */
static int check_trace(const char *path, trace_track *tracks, int cap, json_t **arr) {
  json_error_t je;
  *arr = json_load_file(path, 0, &je);
  CHECK_MSG(*arr != NULL, "%s: %s", path, je.text);
  if (!*arr) return 0;
  int n = 0;
  size_t i;
  json_t *ev;
  json_array_foreach(*arr, i, ev) {
    const char *ph = json_string_value(json_object_get(ev, "ph"));
    const char *name = json_string_value(json_object_get(ev, "name"));
    if (ph && !strcmp(ph, "M") && !strcmp(name, "thread_name")) {
      const char *track = json_string_value(json_object_get(json_object_get(ev, "args"), "name"));
      if (strncmp(track, "req ", 4) != 0 || n == cap) continue;
      tracks[n] = (trace_track){.tid = json_integer_value(json_object_get(ev, "tid"))};
      snprintf(tracks[n].name, sizeof tracks[n].name, "%s", track);
      n++;
    }
  }
  for (int k = 0; k < n; k++) {
    trace_track *t = &tracks[k];
    int64_t last_end = -1;
    json_array_foreach(*arr, i, ev) { /* the request span first */
      if (json_integer_value(json_object_get(ev, "tid")) != t->tid) continue;
      if (!strcmp(json_string_value(json_object_get(ev, "name")), "request")) {
        CHECK_MSG(t->request == NULL, "%s: a second request span", t->name);
        t->request = ev;
      }
    }
    CHECK_MSG(t->request != NULL, "%s: no request span", t->name);
    if (!t->request) continue;
    int64_t from = ns_of(t->request, "ts"), to = from + ns_of(t->request, "dur");
    /* the others, in the order they were written (the engine thread writes them in time order) */
    json_array_foreach(*arr, i, ev) {
      if (json_integer_value(json_object_get(ev, "tid")) != t->tid || ev == t->request) continue;
      const char *ph = json_string_value(json_object_get(ev, "ph"));
      const char *name = json_string_value(json_object_get(ev, "name"));
      if (!strcmp(ph, "M")) continue;
      int64_t a = ns_of(ev, "ts"), b = !strcmp(ph, "X") ? a + ns_of(ev, "dur") : a;
      CHECK_MSG(from < a && b <= to, "%s: %s outside the request span", t->name, name);
      CHECK_MSG(a >= last_end, "%s: %s starts before the previous span ends", t->name, name);
      last_end = b;
      if (!strcmp(ph, "i")) {
        t->n_preempted += !strcmp(name, "preempted");
        continue;
      }
      t->n_spans++;
      t->n_queue += !strcmp(name, "queue");
      t->n_lookup += !strcmp(name, "cache lookup");
      if (!strcmp(name, "prefill")) {
        t->n_prefill++;
        t->n_recompute += arg_int(ev, "recompute") != 0;
      }
      t->n_decode += !strcmp(name, "decode");
      t->n_detok += !strcmp(name, "detokenize") && !arg_int(ev, "flush"); /* one per sampled token */
    }
  }
  return n;
}

static void test_cancel_storm(void) {
  sched_config cfg = {.max_batch = 16, .prefill_chunk = 8, .block_tokens = 4};
  sched *s;
  herr e = {0};
  char path[128];
  snprintf(path, sizeof path, "/tmp/hearth_sched_trace_%ld_cancel.json", (long)getpid());
  CHECK_EQ_INT(htrace_open(path, 0, &cfg.trace, &e), 0);
  CHECK_EQ_INT(sched_new(g_m, NULL, &cfg, &s, &e), 0);
  if (!s) {
    htrace_close(cfg.trace);
    return;
  }
  enum { N = 64 };
  static job jobs[N];
  pthread_t th[N];
  uint64_t rng = 12345;
  for (int i = 0; i < N; i++) {
    memset(&jobs[i], 0, sizeof jobs[i]);
    jobs[i].s = s;
    jobs[i].i = i;
    greedy_request(&jobs[i].req, i % N_REQ);
    jobs[i].req.max_tokens = 20;
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    int kind = (int)((rng >> 33) % 3);
    if (kind == 1) jobs[i].out.cancel_after = 1 + (int)((rng >> 40) % 10); /* the callback says stop */
    if (kind == 2) jobs[i].req.cancel = &jobs[i].cancel;                   /* the flag, from outside */
    pthread_create(&th[i], NULL, job_main, &jobs[i]);
  }
  for (int i = 0; i < N; i += 2)
    if (jobs[i].req.cancel) __atomic_store_n(&jobs[i].cancel, 1, __ATOMIC_SEQ_CST);
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  int cancelled = 0;
  for (int i = 0; i < N; i++) {
    CHECK(jobs[i].rc == 0 || jobs[i].rc == HEARTH_ECANCELLED);
    if (jobs[i].rc == HEARTH_ECANCELLED) {
      cancelled++;
      CHECK_EQ_INT(jobs[i].res.finish, GEN_FINISH_CANCELLED);
    }
    if (jobs[i].out.cancel_after > 0) CHECK_EQ_INT(jobs[i].out.n, jobs[i].out.cancel_after);
  }
  CHECK(cancelled > 0);
  sched_stats st;
  sched_get_stats(s, &st);
  CHECK_EQ_INT(st.blocks_used, 0);
  CHECK_EQ_INT(st.blocks_used + st.blocks_cached + st.blocks_free, st.blocks_total);
  CHECK_EQ_INT(st.running, 0);
  CHECK_EQ_INT(st.waiting, 0);
  CHECK_EQ_INT(st.requests_finished + st.requests_cancelled, N);
  sched_free(s);
  htrace_close(cfg.trace);
  static trace_track tracks[N];
  json_t *arr = NULL;
  int n = check_trace(path, tracks, N, &arr);
  CHECK_EQ_INT(n, N);
  int traced_cancelled = 0;
  for (int k = 0; k < n; k++) {
    if (!tracks[k].request) continue;
    const char *finish = json_string_value(json_object_get(json_object_get(tracks[k].request, "args"), "finish"));
    traced_cancelled += finish && !strcmp(finish, "cancelled");
    CHECK_EQ_INT(tracks[k].n_queue, 1); /* waited once, whether admitted or cancelled while waiting */
    CHECK(tracks[k].n_lookup <= 1);
  }
  CHECK_EQ_INT(traced_cancelled, cancelled);
  json_decref(arr);
  unlink(path);
}

static void *run_b(void *arg) {
  job *j = arg;
  herr e = {0};
  j->rc = sched_run(j->s, &j->req, collect, &j->out, &j->res, &e);
  return NULL;
}

/* Before each step (the engine's thread, nothing held): once A has a token,
 * B is submitted from another thread and the engine waits until B is queued:
 * B is admitted in that step, so both then run together in a pool that holds
 * only one of them whole. */
static sched *g_hold_sched;
static job *g_hold_job;
static pthread_t g_hold_thread;
static bool g_hold_started;

static void hold_until_b_waits(void *user) {
  (void)user;
  if (g_hold_started || !g_hold_sched) return;
  sched_stats st;
  sched_get_stats(g_hold_sched, &st);
  if (st.generated_tokens < 1) return;
  g_hold_started = pthread_create(&g_hold_thread, NULL, run_b, g_hold_job) == 0;
  for (int tries = 0; tries < 10000 && g_hold_started; tries++) {
    sched_get_stats(g_hold_sched, &st);
    if (st.waiting >= 1) break;
    usleep(1000);
  }
}

static void test_preemption(void) {
  sched_config cfg = {.block_tokens = 4, .kv_bytes = 0, .prefill_chunk = 4, .step_hook = hold_until_b_waits};
  model_kv_geometry g;
  model_kv_geometry_of(g_m, &g);
  cfg.kv_bytes = 10 * kv_block_bytes(&g, 4); /* 40 rows; each request needs 32 */
  sched *s;
  herr e = {0};
  char path[128];
  snprintf(path, sizeof path, "/tmp/hearth_sched_trace_%ld_preempt.json", (long)getpid());
  CHECK_EQ_INT(htrace_open(path, 0, &cfg.trace, &e), 0);
  CHECK_EQ_INT(sched_new(g_m, NULL, &cfg, &s, &e), 0);
  if (!s) {
    htrace_close(cfg.trace);
    return;
  }
  g_hold_sched = s;
  int32_t pa[8] = {5, 9, 14, 200, 33, 71, 8, 90}, pb[8] = {300, 12, 7, 7, 45, 61, 2, 19};
  collected ref_a = {0}, ref_b = {0};
  gen_request ra, rb;
  gen_request_init(&ra);
  ra.prompt = pa;
  ra.n_prompt = 8;
  ra.max_tokens = 24;
  ra.sample.greedy = true;
  ra.ignore_eos = true;
  rb = ra;
  rb.prompt = pb;
  gen_result res;
  CHECK_EQ_INT(sched_run_alone(g_m, &ra, collect, &ref_a, &res, &e), 0);
  CHECK_EQ_INT(sched_run_alone(g_m, &rb, collect, &ref_b, &res, &e), 0);
  ra.trace_label = "a";
  rb.trace_label = "b";
  job b = {.s = s, .i = 1, .req = rb};
  collected got_a = {0};
  /* B is submitted from another thread once A has its first token */
  gen_result res_a;
  g_hold_job = &b;
  CHECK_EQ_INT(sched_run(s, &ra, collect, &got_a, &res_a, &e), 0);
  CHECK(g_hold_started);
  if (g_hold_started) pthread_join(g_hold_thread, NULL);
  CHECK_EQ_INT(b.rc, 0);
  CHECK_EQ_INT(got_a.n, 24);
  CHECK_EQ_INT(b.out.n, 24);
  CHECK(memcmp(got_a.ids, ref_a.ids, sizeof(int32_t) * 24) == 0);
  CHECK(memcmp(b.out.ids, ref_b.ids, sizeof(int32_t) * 24) == 0);
  sched_stats st;
  sched_get_stats(s, &st);
  CHECK_EQ_INT(st.blocks_used, 0);
  CHECK_EQ_INT(st.requests_finished, 2);
  /* together they outgrow the pool: the newer one gave way */
  CHECK_MSG(st.preemptions >= 1, "preemptions %lld, steps %lld, prompt tokens %lld, generated %lld, cached hits %lld",
            (long long)st.preemptions, (long long)st.steps, (long long)st.prompt_tokens, (long long)st.generated_tokens,
            (long long)st.prefix_hit_tokens);
  sched_free(s);
  htrace_close(cfg.trace);
  trace_track tracks[4];
  json_t *arr = NULL;
  int n = check_trace(path, tracks, 4, &arr);
  CHECK_EQ_INT(n, 2);
  for (int k = 0; k < n; k++) {
    trace_track *t = &tracks[k];
    CHECK(!strcmp(t->name, "req a") || !strcmp(t->name, "req b"));
    if (!t->request) continue;
    CHECK_EQ_INT(arg_int(t->request, "completion_tokens"), 24);
    CHECK_EQ_INT(arg_int(t->request, "prompt_tokens"), 8);
    CHECK_EQ_INT(arg_int(t->request, "preemptions"), t->n_preempted);
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(t->request, "args"), "finish")), "length");
    CHECK_EQ_INT(t->n_detok, 24);
    /* each preemption: one more wait, one more lookup, a recomputed prefill */
    CHECK_EQ_INT(t->n_queue, 1 + t->n_preempted);
    CHECK_EQ_INT(t->n_lookup, 1 + t->n_preempted);
    CHECK(t->n_preempted == 0 || t->n_recompute >= 1);
    CHECK(t->n_prefill >= 2); /* 8 prompt tokens in chunks of 4 */
  }
  CHECK_EQ_INT(tracks[0].n_preempted + tracks[1].n_preempted, st.preemptions);
  json_decref(arr);
  unlink(path);
}

/* The step's token budget (step_tokens, vLLM's max_num_batched_tokens):
 * a decoding sequence's row comes first and a prompt's chunk takes what is
 * left, so no step feeds more than the budget. B's 96-token prompt is fed
 * in chunks as large as the budget (8); once its first chunk is in, the
 * step hook holds the scheduler until A, a one-token prompt, is queued, so
 * A decodes beside B's prompt from then on and B's chunks shrink to 7. */
static sched *g_budget_sched;
static job *g_budget_a;
static pthread_t g_budget_thread;
static bool g_budget_started;

static void budget_hold(void *user) {
  (void)user;
  sched_stats st;
  sched_get_stats(g_budget_sched, &st);
  if (g_budget_started || st.prompt_tokens < 8) return;
  g_budget_started = pthread_create(&g_budget_thread, NULL, job_main, g_budget_a) == 0;
  for (int tries = 0; tries < 10000 && g_budget_started; tries++) {
    sched_get_stats(g_budget_sched, &st);
    if (st.waiting >= 1) break;
    usleep(1000);
  }
}

static void test_step_budget(void) {
  sched_config cfg = {.max_batch = 4, .prefill_chunk = 8, .step_tokens = 8, .step_hook = budget_hold};
  sched *s;
  herr e = {0};
  CHECK_EQ_INT(sched_new(g_m, NULL, &cfg, &s, &e), 0);
  if (!s) return;
  int32_t pa[1] = {5}, pb[96];
  for (int k = 0; k < 96; k++) pb[k] = 10 + (k * 37) % 400;
  job b = {.s = s, .i = 1};
  gen_request_init(&b.req);
  b.req.prompt = pb;
  b.req.n_prompt = 96;
  b.req.max_tokens = 4;
  b.req.sample.greedy = true;
  b.req.ignore_eos = true;
  job a = {.s = s, .i = 0, .req = b.req};
  a.req.prompt = pa;
  a.req.n_prompt = 1;
  a.req.max_tokens = 40;
  g_budget_sched = s;
  g_budget_a = &a;
  g_budget_started = false;
  job_main(&b);
  CHECK(g_budget_started);
  if (g_budget_started) pthread_join(g_budget_thread, NULL);
  CHECK_EQ_INT(a.rc, 0);
  CHECK_EQ_INT(b.rc, 0);
  CHECK_EQ_INT(a.out.n, 40);
  CHECK_EQ_INT(b.out.n, 4);
  sched_stats st;
  sched_get_stats(s, &st);
  CHECK_MSG(st.peak_batch == 2, "the two requests never ran in one step (peak batch %lld)", (long long)st.peak_batch);
  CHECK_MSG(st.peak_step_tokens <= 8, "a step fed %lld tokens (budget 8)", (long long)st.peak_step_tokens);
  fprintf(stderr, "  step budget 8: at most %lld tokens a step, %lld steps\n", (long long)st.peak_step_tokens,
          (long long)st.steps);
  sched_free(s);
}

/* Admission order by priority: with room for one sequence, H runs; the step
 * hook then queues L (priority 1, a batch row, 7 prompt tokens) and after it
 * N (priority 0, interactive, 4 prompt tokens) before letting H go on. When H
 * ends, N is admitted before L though L came first: the hook, on the engine
 * thread between steps, sees the computed prompt tokens grow by N's 4 first. */
static sched *g_prio_sched;
static job *g_prio_jobs[2]; /* L, N */
static pthread_t g_prio_threads[2];
static int g_prio_started;
static int64_t g_prio_prompt_tokens, g_prio_first_delta;

static void prio_hold(void *user) {
  (void)user;
  sched_stats st;
  sched_get_stats(g_prio_sched, &st);
  if (g_prio_started == 2) {
    if (!g_prio_first_delta && st.prompt_tokens != g_prio_prompt_tokens)
      g_prio_first_delta = st.prompt_tokens - g_prio_prompt_tokens;
    return;
  }
  if (g_prio_started || st.running < 1) return;
  for (int k = 0; k < 2; k++) {
    if (pthread_create(&g_prio_threads[k], NULL, job_main, g_prio_jobs[k]) != 0) return;
    g_prio_started++;
    for (int tries = 0; tries < 10000; tries++) {
      sched_get_stats(g_prio_sched, &st);
      if (st.waiting >= k + 1) break;
      usleep(1000);
    }
  }
  g_prio_prompt_tokens = st.prompt_tokens;
}

static void test_priority(void) {
  sched_config cfg = {.max_batch = 1, .step_hook = prio_hold};
  sched *s;
  herr e = {0};
  CHECK_EQ_INT(sched_new(g_m, NULL, &cfg, &s, &e), 0);
  if (!s) return;
  int32_t ph[4] = {5, 6, 7, 8}, pl[7] = {9, 10, 11, 12, 13, 14, 15}, pn[4] = {21, 22, 23, 24};
  job h = {.s = s, .i = 9}, l = {.s = s, .i = 0}, n = {.s = s, .i = 1};
  gen_request_init(&h.req);
  h.req.prompt = ph;
  h.req.n_prompt = 4;
  h.req.max_tokens = 6;
  h.req.sample.greedy = true;
  h.req.ignore_eos = true;
  l.req = h.req;
  l.req.prompt = pl;
  l.req.n_prompt = 7;
  l.req.priority = 1;
  n.req = h.req;
  n.req.prompt = pn;
  g_prio_sched = s;
  g_prio_jobs[0] = &l;
  g_prio_jobs[1] = &n;
  g_prio_started = 0;
  g_prio_first_delta = 0;
  job_main(&h);
  CHECK_EQ_INT(g_prio_started, 2);
  for (int k = 0; k < g_prio_started; k++) pthread_join(g_prio_threads[k], NULL);
  CHECK_EQ_INT(h.rc, 0);
  CHECK_EQ_INT(l.rc, 0);
  CHECK_EQ_INT(n.rc, 0);
  CHECK_EQ_INT(l.out.n, 6);
  CHECK_EQ_INT(n.out.n, 6);
  CHECK_MSG(g_prio_first_delta == 4, "the first prompt admitted after H had %lld tokens (N, priority 0: 4; L: 7)",
            (long long)g_prio_first_delta);
  sched_free(s);
}

static void test_admission(void) {
  model_kv_geometry g;
  model_kv_geometry_of(g_m, &g);
  sched_config cfg = {.block_tokens = 16, .memory_budget = 2 * kv_block_bytes(&g, 16)}; /* 32 tokens */
  sched *s;
  herr e = {0};
  CHECK_EQ_INT(sched_new(g_m, NULL, &cfg, &s, &e), 0);
  if (!s) return;
  gen_request r;
  greedy_request(&r, 20); /* g_len[20] > 32 */
  CHECK(g_len[20] > 32);
  gen_result res;
  collected c = {0};
  CHECK_EQ_INT(sched_run(s, &r, collect, &c, &res, &e), HEARTH_ELIMIT);
  CHECK(strncmp(e.msg, "memory_admission:", 17) == 0);
  CHECK(e.cause == HEARTH_CAUSE_MEMORY_ADMISSION);
  CHECK_EQ_INT(c.n, 0);
  /* one that fits runs */
  greedy_request(&r, 0);
  r.max_tokens = 4;
  CHECK(g_len[0] + 4 <= 32);
  e = (herr){0};
  CHECK_EQ_INT(sched_run(s, &r, collect, &c, &res, &e), 0);
  CHECK_EQ_INT(c.n, 4);
  sched_stats st;
  sched_get_stats(s, &st);
  CHECK_EQ_INT(st.requests_refused, 1);
  CHECK_EQ_INT(st.blocks_total, 2);
  sched_free(s);
}


/* Seeded sampling through the scheduler (on a GPU: on the device): the same
 * seed gives the same tokens run alone twice, and each of 8 concurrent
 * sampled requests gives the tokens (and logprobs) it gives alone. */
typedef struct sampled_out {
  int32_t ids[64];
  float lp[64];
  int n;
} sampled_out;

static int collect_sampled(void *user, const char *delta, size_t len, const sample_token *tok) {
  (void)delta, (void)len;
  sampled_out *c = user;
  if (tok && c->n < 64) {
    c->ids[c->n] = tok->id;
    c->lp[c->n++] = tok->logprob;
  }
  return 0;
}

static void sampled_request(gen_request *r, int i) {
  gen_request_init(r);
  r->prompt = g_prompts[i];
  r->n_prompt = (size_t)g_len[i];
  r->max_tokens = 16;
  r->ignore_eos = true;
  r->sample.temperature = 0.8f + 0.1f * (float)(i % 3);
  r->sample.top_k = i % 2 ? 40 : 0;
  r->sample.top_p = i % 3 ? 0.95f : 1.0f;
  r->sample.min_p = i % 4 == 1 ? 0.02f : 0.0f;
  r->sample.repetition_penalty = i % 2 ? 1.1f : 1.0f;
  r->sample.presence_penalty = i % 3 == 2 ? 0.4f : 0.0f;
  r->sample.logprobs = true;
  r->sample.seed = 1000 + (uint64_t)i;
}

typedef struct sjob {
  sched *s;
  int i;
  gen_request req;
  sampled_out out;
  gen_result res;
  int rc;
} sjob;

static void *sjob_main(void *arg) {
  sjob *j = arg;
  herr e = {0};
  j->rc = sched_run(j->s, &j->req, collect_sampled, &j->out, &j->res, &e);
  if (j->rc) fprintf(stderr, "sampled request %d: %s\n", j->i, e.msg);
  return NULL;
}

static void test_sampled_seeded(void) {
  enum { NS = 8 };
  sched_config cfg = {.max_batch = 16, .prefill_chunk = 32, .block_tokens = 8};
  sched *s;
  herr e = {0};
  CHECK_EQ_INT(sched_new(g_m, NULL, &cfg, &s, &e), 0);
  if (!s) return;
  static sjob alone[NS], again[NS], together[NS];
  for (int i = 0; i < NS; i++) {
    alone[i] = (sjob){.s = s, .i = i};
    again[i] = (sjob){.s = s, .i = i};
    sampled_request(&alone[i].req, i);
    sampled_request(&again[i].req, i);
    sjob_main(&alone[i]);
    sjob_main(&again[i]);
    CHECK_EQ_INT(alone[i].rc, 0);
    CHECK_EQ_INT(alone[i].out.n, 16);
    CHECK_MSG(alone[i].out.n == again[i].out.n &&
                  !memcmp(alone[i].out.ids, again[i].out.ids, sizeof(int32_t) * (size_t)alone[i].out.n),
              "sampled request %d: the same seed gave different tokens", i);
  }
  pthread_t th[NS];
  for (int i = 0; i < NS; i++) {
    together[i] = (sjob){.s = s, .i = i};
    sampled_request(&together[i].req, i);
    pthread_create(&th[i], NULL, sjob_main, &together[i]);
  }
  for (int i = 0; i < NS; i++) pthread_join(th[i], NULL);
  int differ = 0;
  for (int i = 0; i < NS; i++) {
    CHECK_EQ_INT(together[i].rc, 0);
    if (together[i].out.n != alone[i].out.n ||
        memcmp(together[i].out.ids, alone[i].out.ids, sizeof(int32_t) * (size_t)alone[i].out.n)) {
      differ++;
      continue;
    }
    for (int k = 0; k < alone[i].out.n; k++) CHECK_NEAR(together[i].out.lp[k], alone[i].out.lp[k], 1e-3);
  }
  CHECK_MSG(differ == 0, "%d of %d seeded sampled requests differ batched from alone", differ, NS);
  sched_free(s);
}

/* A hybrid model (Qwen3.5: linear-attention layers with a recurrent state
 * per sequence beside the KV of its full-attention layers): batched with
 * each other, in chunks, preempted and recomputed, each request gives what
 * it gives alone; and a conversation's second turn resumes from the first
 * turn's state snapshot (cached_tokens > 0) with the tokens it gives alone. */
static void test_hybrid(void) {
  herr e = {0};
  model *hm = NULL;
  model_load_opts mo = {.threads = 2, .device = test_device()};
  CHECK_MSG(model_load(HYBRID, &mo, &hm, &e) == 0, "%s", e.msg);
  if (!hm) return;
  model *keep = g_m;
  g_m = hm;
  test_batched_equals_alone();
  /* turn 1, then turn 2 = turn 1's prompt + its answer + a new message */
  sched_config cfg = {.max_batch = 4, .prefill_chunk = 8, .block_tokens = 4};
  sched *s;
  CHECK_EQ_INT(sched_new(hm, NULL, &cfg, &s, &e), 0);
  static int32_t turn[128];
  int n1 = 37;
  for (int i = 0; i < n1; i++) turn[i] = (int32_t)((i * 53 + 7) % 500 + 3);
  gen_request r;
  greedy_request(&r, 0);
  r.prompt = turn;
  r.n_prompt = (size_t)n1;
  gen_result res;
  collected c1 = {0}, c2 = {0}, alone = {0};
  CHECK_EQ_INT(sched_run(s, &r, collect, &c1, &res, &e), 0);
  CHECK_EQ_INT(res.cached_tokens, 0);
  CHECK_EQ_INT(c1.n, MAX_NEW);
  /* the same prompt again: its last chunk stopped at 36 (a block's end) before its 37th token */
  collected c0 = {0};
  CHECK_EQ_INT(sched_run(s, &r, collect, &c0, &res, &e), 0);
  CHECK_EQ_INT(res.cached_tokens, 36);
  CHECK_MSG(c0.n == c1.n && !memcmp(c0.ids, c1.ids, sizeof(int32_t) * (size_t)c1.n), "the prompt resumed at 36 differs");
  int n2 = n1;
  for (int i = 0; i < c1.n; i++) turn[n2++] = c1.ids[i];
  for (int i = 0; i < 5; i++) turn[n2++] = (int32_t)(400 + i);
  r.prompt = turn;
  r.n_prompt = (size_t)n2;
  CHECK_EQ_INT(sched_run(s, &r, collect, &c2, &res, &e), 0);
  /* turn 1 stored rows [0, 48) (its last token was sampled, not fed), the last block ending at 48 */
  CHECK_EQ_INT(res.cached_tokens, 48);
  CHECK_EQ_INT(sched_run_alone(hm, &r, collect, &alone, &res, &e), 0);
  CHECK_MSG(c2.n == alone.n && !memcmp(c2.ids, alone.ids, sizeof(int32_t) * (size_t)alone.n),
            "the second turn from the first turn's state differs from its run alone");
  sched_free(s);
  g_m = keep;
  model_free(hm);
}

int main(void) {
  test_device_or_skip();
  herr e = {0};
  model_load_opts mo = {.threads = 2, .device = test_device()};
  if (model_load(FIXTURE, &mo, &g_m, &e)) {
    fprintf(stderr, "%s\n", e.msg);
    return 1;
  }
  RUN(test_batched_equals_alone);
  RUN(test_batched_equals_alone_glm5);
  RUN(test_prefix_cached_tokens);
  RUN(test_cancel_storm);
  RUN(test_preemption);
  RUN(test_step_budget);
  RUN(test_priority);
  RUN(test_admission);
  RUN(test_sampled_seeded);
  RUN(test_hybrid);
  model_free(g_m);
  TEST_MAIN_END();
}
