/* test_tp_sched.c — the scheduler driving a model split over ranks (tensor
 * parallelism, the in-process communicator): one scheduler, one KV pool
 * whose blocks hold arenas on every rank; 12 concurrent greedy requests
 * (prefixes shared, prompts in chunks, a small pool so some wait) give
 * exactly the ids of the unsplit model, for llama at N=2 and qwen3_moe at
 * N=4, with device-side sampling too; the KV pool's blocks all come back. A
 * rank that fails mid-step ends the requests in flight with its error and
 * every later request with the group's — no request waits forever. */
#include <pthread.h>
#include <unistd.h>

#include "engine/kv_paged.h"
#include "engine/sched.h"
#include "model/internal.h"
#include "model/model.h"
#include "test.h"

#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden/"
#define N_REQ 12
#define MAX_NEW 10

typedef struct job {
  sched *s;
  gen_request req;
  int32_t prompt[80];
  int32_t ids[64];
  int n;
  gen_result res;
  int rc;
  herr err;
} job;

static int collect(void *user, const char *delta, size_t len, const sample_token *tok) {
  (void)delta, (void)len;
  job *j = user;
  if (tok && j->n < 64) j->ids[j->n++] = tok->id;
  return 0;
}

static void *job_main(void *arg) {
  job *j = arg;
  j->rc = sched_run(j->s, &j->req, collect, j, &j->res, &j->err);
  return NULL;
}

static void make_job(job *j, sched *s, int i) {
  memset(j, 0, sizeof *j);
  j->s = s;
  int len = 3 + (i * 11) % 60;
  for (int t = 0; t < len; t++) j->prompt[t] = (i % 2 == 0 && t < 24) ? (int32_t)((t * 31 + 5) % 500 + 3) : (int32_t)((t * 17 + i * 101) % 500 + 3);
  gen_request_init(&j->req);
  j->req.prompt = j->prompt;
  j->req.n_prompt = (size_t)len;
  j->req.max_tokens = MAX_NEW;
  j->req.sample.greedy = true;
  j->req.ignore_eos = true;
}

/* Runs the N_REQ requests concurrently; out[i] their ids. */
static void serve(model *m, bool device_sampling, job *jobs) {
  sched_config cfg = {.max_batch = 8, .prefill_chunk = 8, .block_tokens = 8, .backend_sampling = device_sampling};
  model_kv_geometry g;
  model_kv_geometry_of(m, &g);
  cfg.memory_budget = 40 * kv_block_bytes(&g, 8); /* 320 tokens: some requests wait for others */
  sched *s = NULL;
  herr e = {0};
  CHECK_MSG(sched_new(m, NULL, &cfg, &s, &e) == 0, "%s", e.msg);
  if (!s) return;
  pthread_t th[N_REQ];
  for (int i = 0; i < N_REQ; i++) {
    make_job(&jobs[i], s, i);
    pthread_create(&th[i], NULL, job_main, &jobs[i]);
  }
  for (int i = 0; i < N_REQ; i++) pthread_join(th[i], NULL);
  sched_stats st;
  sched_get_stats(s, &st);
  CHECK_EQ_INT(st.blocks_used, 0);
  sched_free(s);
}

static void equal_to_one_rank(const char *name, int tp) {
  char dir[400];
  snprintf(dir, sizeof dir, GOLDEN "%s", name);
  herr e = {0};
  model *one = NULL, *split = NULL;
  model_load_opts o1 = {.threads = 2}, on = {.threads = 2, .tensor_parallel = tp};
  CHECK_MSG(model_load(dir, &o1, &one, &e) == 0, "%s", e.msg);
  CHECK_MSG(model_load(dir, &on, &split, &e) == 0, "%s", e.msg);
  if (one && split)
    for (int dev = 0; dev < 2; dev++) {
      static job a[N_REQ], b[N_REQ];
      serve(one, dev, a);
      serve(split, dev, b);
      int differ = 0;
      for (int i = 0; i < N_REQ; i++) {
        CHECK_MSG(a[i].rc == 0 && b[i].rc == 0, "%s N=%d request %d: %s %s", name, tp, i, a[i].err.msg, b[i].err.msg);
        CHECK_EQ_INT(b[i].n, MAX_NEW);
        if (a[i].n != b[i].n || memcmp(a[i].ids, b[i].ids, sizeof(int32_t) * (size_t)a[i].n)) differ++;
      }
      CHECK_MSG(differ == 0, "%s N=%d (%s sampling): %d of %d requests differ from one rank", name, tp, dev ? "device" : "host",
                differ, N_REQ);
    }
  model_free(one);
  model_free(split);
}

static void test_llama_n2(void) { equal_to_one_rank("llama-f32", 2); }
static void test_qwen3_moe_n4(void) { equal_to_one_rank("qwen3_moe-f32", 4); }

static void test_rank_failure(void) {
  herr e = {0};
  model *m = NULL;
  model_load_opts o = {.threads = 2, .tensor_parallel = 2};
  CHECK_MSG(model_load(GOLDEN "llama-f32", &o, &m, &e) == 0, "%s", e.msg);
  if (!m) return;
  bk_comm_inproc_fail_at(tp_rank_comm(m, 1), 40); /* a few steps in */
  static job jobs[N_REQ];
  serve(m, false, jobs);
  int failed = 0;
  for (int i = 0; i < N_REQ; i++)
    if (jobs[i].rc) {
      failed++;
      CHECK_MSG(strstr(jobs[i].err.msg, "rank 1") || strstr(jobs[i].err.msg, "stopped"), "request %d: %s", i, jobs[i].err.msg);
    }
  CHECK_MSG(failed > 0, "no request saw the failure");
  /* the group stays stopped: a new request fails at once */
  static job late[N_REQ];
  serve(m, false, late);
  for (int i = 0; i < N_REQ; i++) CHECK_MSG(late[i].rc != 0 && strstr(late[i].err.msg, "stopped"), "late request %d: rc %d %s", i, late[i].rc, late[i].err.msg);
  model_free(m);
}

int main(void) {
  RUN(test_llama_n2);
  RUN(test_qwen3_moe_n4);
  RUN(test_rank_failure);
  TEST_MAIN_END();
}
