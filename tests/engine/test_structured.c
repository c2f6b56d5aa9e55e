/* test_structured.c — output under a grammar through the scheduler, both ways
 * a token can be picked: on the host (the logits row masked, then sampled)
 * and on the backend (the grammar's mask sent with the row to bk_sample, as a
 * GPU does; on the CPU through the reference sampler). Greedy outputs must be
 * the same both ways; every output, greedy or sampled, batched beside
 * unconstrained requests, must be complete under its grammar. On another
 * device (HEARTH_TEST_DEVICE) the backend path is that device's sampler. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"
#include "engine/sched.h"
#include "model/model.h"
#include "test.h"
#include "test_device.h"
#include "tokenizer/tokenizer.h"

#define MODEL_DIR HEARTH_SOURCE_DIR "/models/default"
#define N_SCHEMA 4
#define N_JOBS (N_SCHEMA * 2 + 2) /* per schema a greedy and a sampled request; two unconstrained */

static const char *k_schemas[N_SCHEMA] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
    "{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"minItems\":1,\"maxItems\":4}",
    "{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"},\"score\":{\"type\":\"number\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},\"required\":[\"ok\",\"score\",\"tags\"]}",
    "{\"type\":\"string\",\"pattern\":\"^[a-z]{2,6}-[0-9]{3}$\"}",
};

static model *g_m;
static tokenizer *g_tok;
static hbuf g_gbnf[N_SCHEMA];

typedef struct job {
  sched *s;
  gen_request req;
  int schema;      /* -1: unconstrained */
  int32_t ids[400];
  int n;
  hbuf text;
  gen_result res;
  int rc;
  char err[256];
} job;

static int collect(void *user, const char *delta, size_t len, const sample_token *tok) {
  job *j = user;
  if (len) hbuf_append(&j->text, delta, len);
  if (tok && j->n < 400) j->ids[j->n++] = tok->id;
  return 0;
}

static void *job_main(void *arg) {
  job *j = arg;
  herr e = {0};
  j->rc = sched_run(j->s, &j->req, collect, j, &j->res, &e);
  if (j->rc) snprintf(j->err, sizeof j->err, "%s", e.msg);
  return NULL;
}

/* Runs every job at once on a scheduler made with cfg. */
static void run_jobs(const sched_config *cfg, job *jobs) {
  sched *s = NULL;
  herr e = {0};
  CHECK_MSG(sched_new(g_m, g_tok, cfg, &s, &e) == 0, "%s", e.msg);
  if (!s) return;
  pthread_t th[N_JOBS];
  for (int i = 0; i < N_JOBS; i++) {
    job *j = &jobs[i];
    memset(j, 0, sizeof *j);
    j->s = s;
    j->schema = i < 2 * N_SCHEMA ? i / 2 : -1;
    gen_request_init(&j->req);
    static int32_t prompt[] = {0, 12, 345, 678, 90, 1234, 56, 7};
    j->req.prompt = prompt;
    j->req.n_prompt = sizeof prompt / sizeof prompt[0] - (size_t)(i % 3);
    j->req.max_tokens = i == 2 ? 24 : 160; /* one short budget: closed early, still complete */
    j->req.eos_ids[0] = 2, j->req.eos_ids[1] = 1, j->req.n_eos = 2;
    if (i % 2 == 0) {
      j->req.sample.greedy = true;
    } else {
      j->req.sample.temperature = 0.9f;
      j->req.sample.top_p = 0.95f;
      j->req.sample.seed = 1000 + (uint64_t)i;
    }
    if (j->schema >= 0) {
      j->req.grammar = g_gbnf[j->schema].data;
      j->req.grammar_len = g_gbnf[j->schema].len;
    }
    pthread_create(&th[i], NULL, job_main, j);
  }
  for (int i = 0; i < N_JOBS; i++) pthread_join(th[i], NULL);
  sched_free(s);
}

/* The output is complete under its grammar. */
static void check_complete(const job *j, const char *how) {
  CHECK_MSG(j->rc == 0, "%s, schema %d: %s", how, j->schema, j->err);
  if (j->rc || j->schema < 0) return;
  herr e = {0};
  grammar *g = NULL;
  grammar_vocab *v = NULL;
  grammar_matcher *mt = NULL;
  const char *one = "x";
  size_t one_len = 1;
  int32_t end = 0;
  CHECK(grammar_compile(g_gbnf[j->schema].data, g_gbnf[j->schema].len, &g, &e) == 0);
  CHECK(grammar_vocab_from_bytes(&one, &one_len, 1, &v, &e) == 0);
  CHECK(grammar_matcher_new(g, v, &end, 1, &mt, &e) == 0);
  bool ok = mt && grammar_matcher_accept_text(mt, j->text.data, j->text.len, &e) == 0 && grammar_matcher_can_end(mt);
  CHECK_MSG(ok, "%s, schema %d (%s): output is not complete under the grammar: %.*s", how, j->schema,
            j->req.sample.greedy ? "greedy" : "sampled", (int)j->text.len, j->text.data);
  CHECK_MSG(j->n > 0, "%s, schema %d: no tokens", how, j->schema);
  grammar_matcher_free(mt);
  grammar_vocab_free(v);
  grammar_free(g);
}

int main(void) {
  test_device_or_skip();
  herr e = {0};
  model_load_opts mo = {.threads = 2, .device = test_device()};
  if (model_load(MODEL_DIR, &mo, &g_m, &e) || tokenizer_load(MODEL_DIR, &g_tok, &e)) {
    fprintf(stderr, "%s\n", e.msg);
    return 1;
  }
  for (int i = 0; i < N_SCHEMA; i++) {
    CHECK_MSG(json_schema_to_gbnf(k_schemas[i], strlen(k_schemas[i]), &g_gbnf[i], &e) == 0, "%s", e.msg);
    hbuf_append(&g_gbnf[i], "", 1); /* NUL-terminated for the messages; the length excludes it */
    g_gbnf[i].len--;
  }
  static job host[N_JOBS], backend[N_JOBS];
  sched_config cfg = {.max_batch = 16, .kv_bytes = 64u << 20};
  run_jobs(&cfg, host);
  cfg.backend_sampling = true;
  run_jobs(&cfg, backend);
  const char *dev = test_device() ? test_device() : "cpu";
  for (int i = 0; i < N_JOBS; i++) {
    check_complete(&host[i], "host sampling");
    check_complete(&backend[i], "backend sampling");
    /* greedy: the same tokens either way (on another device, the host path samples on it too) */
    if (host[i].req.sample.greedy)
      CHECK_MSG(host[i].n == backend[i].n && !memcmp(host[i].ids, backend[i].ids, sizeof(int32_t) * (size_t)host[i].n),
                "job %d (schema %d) on %s: greedy output differs between host and backend sampling:\n  %.*s\n  %.*s", i,
                host[i].schema, dev, (int)host[i].text.len, host[i].text.data, (int)backend[i].text.len,
                backend[i].text.data);
  }
  fprintf(stderr, "schema 0, greedy: %.*s\nschema 2, sampled: %.*s\n", (int)backend[0].text.len, backend[0].text.data,
          (int)backend[5].text.len, backend[5].text.data);
  CHECK_EQ_INT(host[2].res.finish, GEN_FINISH_LENGTH); /* the short budget: cut, and closed complete */
  for (int i = 0; i < N_JOBS; i++) hbuf_free(&host[i].text), hbuf_free(&backend[i].text);
  for (int i = 0; i < N_SCHEMA; i++) hbuf_free(&g_gbnf[i]);
  tokenizer_free(g_tok);
  model_free(g_m);
  TEST_MAIN_END();
}
