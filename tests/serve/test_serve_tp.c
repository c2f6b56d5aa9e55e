/* test_serve_tp.c — the server over a model split over two ranks
 * (hearth_load_opts.tensor_parallel, on the CPU): 12 concurrent greedy
 * completions give the text the unsplit model's server gives for each, and
 * a KV block (/stats) holds as many bytes as the unsplit model's: every
 * rank's heads, each on its rank. */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/buf.h"
#include "serve/engine.h"
#include "serve/server.h"
#include "serve_harness.h"
#include "test.h"

#define MODEL HEARTH_SOURCE_DIR "/models/default"


static char *completion(int port, int i) {
  char body[256];
  snprintf(body, sizeof body, "{\"prompt\":\"%d: And God said, Let there be\",\"max_tokens\":%d,\"temperature\":0}", i * 37,
           6 + i % 7);
  char *r = http_at(port, "POST", "/v1/completions", NULL, body);
  json_t *j = body_json(r);
  const char *t = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
  char *out = strdup(t ? t : "(none)");
  json_decref(j);
  free(r);
  return out;
}

typedef struct job {
  int port, i;
  char *text; /* owned */
} job;

static void *job_main(void *arg) {
  job *j = arg;
  j->text = completion(j->port, j->i);
  return NULL;
}

static int start(harness *h, int tp, herr *err) {
  serve_engine_opts eo = {.threads = 2, .max_batch = 8, .memory_budget = 2 << 20, .load = {.tensor_parallel = tp}};
  return harness_start(h, MODEL, &eo, NULL, err);
}

static void test_split_server_equals_one(void) {
  enum { N = 12 };
  herr err = {0};
  harness one, two;
  CHECK_MSG(start(&one, 0, &err) == 0, "%s", err.msg);
  CHECK_MSG(start(&two, 2, &err) == 0, "%s", err.msg);
  if (err.code) return;
  char *alone[N];
  for (int i = 0; i < N; i++) alone[i] = completion(one.port, i);
  job jobs[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    jobs[i] = (job){.port = two.port, .i = i};
    pthread_create(&th[i], NULL, job_main, &jobs[i]);
  }
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < N; i++) {
    CHECK(strcmp(alone[i], "(none)") != 0);
    CHECK_EQ_STR(jobs[i].text, alone[i]);
    free(alone[i]);
    free(jobs[i].text);
  }
  /* a block holds every rank's heads: as many bytes as the unsplit model's block */
  char *r1 = http_at(one.port, "GET", "/stats", NULL, NULL), *r2 = http_at(two.port, "GET", "/stats", NULL, NULL);
  json_t *j1 = body_json(r1), *j2 = body_json(r2);
  json_int_t b1 = json_integer_value(json_object_get(json_object_get(j1, "kv_cache"), "block_bytes"));
  json_int_t b2 = json_integer_value(json_object_get(json_object_get(j2, "kv_cache"), "block_bytes"));
  CHECK_MSG(b1 > 0 && b1 == b2, "block bytes %lld and %lld", (long long)b1, (long long)b2);
  json_decref(j1);
  json_decref(j2);
  free(r1);
  free(r2);
  harness_stop(&one);
  harness_stop(&two);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  RUN(test_split_server_equals_one);
  TEST_MAIN_END();
}
