/* test_serve_batch.c — the server over the real engine (models/default)
 * with continuous batching: 64 concurrent streams, some of which hang up
 * after their first token, all end and every KV block is back in the pool
 * (GET /stats; the sanitizer build checks for leaks); a completion sharing
 * a long prompt with an earlier one reports usage.prompt_tokens_details.
 * cached_tokens; 16 concurrent greedy completions answer the same text as
 * each run alone; GET /metrics is Prometheus text; a request that can never
 * fit the memory budget is refused with 400 memory_admission; speculative
 * decoding asked for per request gives the plain greedy text and is counted
 * per draft source in /stats and /metrics; a request naming a draft source
 * the model cannot serve (mtp without an MTP layer, draft without a draft
 * model) or none known is refused naming the field; the engine's KV pool
 * is there before the first request, and one that cannot be had (or a KV
 * store that is a file) fails the open. */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "serve/engine.h"
#include "serve/server.h"
#include "serve_harness.h"
#include "test.h"

#define MODEL HEARTH_SOURCE_DIR "/models/default"

static int g_port;

static json_t *get_stats(void) {
  char *r = http_at(g_port, "GET", "/stats", NULL, NULL);
  json_t *j = body_json(r);
  free(r);
  return j;
}

static int64_t stat_of(json_t *j, const char *group, const char *key) {
  return json_integer_value(json_object_get(json_object_get(j, group), key));
}

typedef struct stream_job {
  int i;
  bool hang_up;
  bool ok;
} stream_job;

static void *stream_main(void *arg) {
  stream_job *sj = arg;
  char body[256];
  snprintf(body, sizeof body,
           "{\"prompt\":\"And it came to pass in the %d day\",\"max_tokens\":12,\"temperature\":0,\"stream\":true}",
           sj->i);
  int fd = dial(g_port);
  if (fd < 0) return NULL;
  hbuf req = {0};
  hbuf_printf(&req,
              "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: "
              "application/json\r\nContent-Length: %zu\r\n\r\n%s",
              strlen(body), body);
  send_all(fd, req.data, req.len);
  hbuf_free(&req);
  if (sj->hang_up) {
    sj->ok = await_first_token(fd);
  } else {
    hbuf got = {0};
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0) hbuf_append(&got, buf, (size_t)n);
    sj->ok = strstr(hbuf_str(&got), "data: [DONE]") != NULL;
    hbuf_free(&got);
  }
  close(fd);
  return NULL;
}

static void test_streams_with_disconnects(void) {
  enum { N = 64 };
  stream_job jobs[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    jobs[i] = (stream_job){.i = i, .hang_up = (i * 7) % 3 == 0};
    pthread_create(&th[i], NULL, stream_main, &jobs[i]);
  }
  int ok = 0;
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    ok += jobs[i].ok;
  }
  CHECK_EQ_INT(ok, N);
  /* the hung-up ones end within a step of being noticed; wait for that (bounded) */
  json_t *st = NULL;
  for (int tries = 0; tries < 600; tries++) {
    json_decref(st);
    st = get_stats();
    if (st && stat_of(st, "requests", "running") == 0 && stat_of(st, "requests", "waiting") == 0 &&
        stat_of(st, "kv_cache", "blocks_used") == 0)
      break;
    sleep_ms(100);
  }
  CHECK(st != NULL);
  CHECK_EQ_INT(stat_of(st, "requests", "running"), 0);
  CHECK_EQ_INT(stat_of(st, "requests", "waiting"), 0);
  CHECK_EQ_INT(stat_of(st, "kv_cache", "blocks_used"), 0);
  CHECK_EQ_INT(stat_of(st, "kv_cache", "blocks_free"), stat_of(st, "kv_cache", "blocks_total"));
  CHECK_EQ_INT(stat_of(st, "kv_cache", "capacity_tokens"), stat_of(st, "kv_cache", "blocks_total") * stat_of(st, "kv_cache", "block_tokens"));
  CHECK(stat_of(st, "kv_cache", "block_bytes") > 0);
  CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(st, "kv_cache"), "format")), "f32");
  CHECK_EQ_INT(stat_of(st, "requests", "finished") + stat_of(st, "requests", "cancelled"), N);
  CHECK(stat_of(st, "tokens", "generated") > 0);
  json_decref(st);
}

static void test_cached_tokens(void) {
  hbuf p = {0};
  for (int i = 0; i < 12; i++) hbuf_puts(&p, "In the beginning God created the heaven and the earth. ");
  hbuf a = {0}, b = {0};
  hbuf_printf(&a, "{\"prompt\":\"%s And the earth\",\"max_tokens\":2,\"temperature\":0}", hbuf_str(&p));
  hbuf_printf(&b, "{\"prompt\":\"%s And the light\",\"max_tokens\":2,\"temperature\":0}", hbuf_str(&p));
  char *r1 = http_at(g_port, "POST", "/v1/completions", NULL, hbuf_str(&a));
  char *r2 = http_at(g_port, "POST", "/v1/completions", NULL, hbuf_str(&b));
  CHECK_EQ_INT(status_of(r1), 200);
  CHECK_EQ_INT(status_of(r2), 200);
  json_t *j2 = body_json(r2);
  json_t *u = json_object_get(j2, "usage");
  int64_t prompt = json_integer_value(json_object_get(u, "prompt_tokens"));
  int64_t cached = json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
  CHECK(prompt > 100);
  /* every full 16-token block before the differing tail is shared */
  CHECK_MSG(cached >= prompt - 20 - 16 && cached % 16 == 0 && cached < prompt, "cached %lld of %lld",
            (long long)cached, (long long)prompt);
  json_decref(j2);
  free(r1);
  free(r2);
  hbuf_free(&a);
  hbuf_free(&b);
  hbuf_free(&p);
}

typedef struct whole_job {
  int i;
  char *text; /* owned */
} whole_job;

static char *completion_text(int i) {
  char body[256];
  snprintf(body, sizeof body,
           "{\"prompt\":\"%d: And God said, Let there be\",\"max_tokens\":%d,\"temperature\":0}", i * 37,
           4 + i % 9);
  char *r = http_at(g_port, "POST", "/v1/completions", NULL, body);
  json_t *j = body_json(r);
  const char *t = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
  char *out = strdup(t ? t : "(none)");
  json_decref(j);
  free(r);
  return out;
}

static void *whole_main(void *arg) {
  whole_job *w = arg;
  w->text = completion_text(w->i);
  return NULL;
}

static void test_concurrent_equals_alone(void) {
  enum { N = 16 };
  char *alone[N];
  for (int i = 0; i < N; i++) alone[i] = completion_text(i);
  whole_job jobs[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    jobs[i] = (whole_job){.i = i};
    pthread_create(&th[i], NULL, whole_main, &jobs[i]);
  }
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < N; i++) {
    CHECK(strcmp(alone[i], "(none)") != 0);
    CHECK_EQ_STR(jobs[i].text, alone[i]);
    free(alone[i]);
    free(jobs[i].text);
  }
}

static void test_metrics(void) {
  char *r = http_at(g_port, "GET", "/metrics", NULL, NULL);
  CHECK_EQ_INT(status_of(r), 200);
  CHECK(strstr(r, "# HELP hearth_kv_blocks_total ") != NULL);
  CHECK(strstr(r, "# TYPE hearth_kv_blocks_total gauge\nhearth_kv_blocks_total ") != NULL);
  CHECK(strstr(r, "# TYPE hearth_generation_tokens_total counter\n") != NULL);
  CHECK(strstr(r, "hearth_prefix_cache_hit_tokens_total ") != NULL);
  free(r);
}

/* Speculative decoding asked for per request (the server runs without it):
 * the same greedy text as without, drafts counted in /stats and /metrics, and
 * a bad value refused naming the field. */
static char *spec_text(const char *spec, int *status) {
  char body[512];
  snprintf(body, sizeof body,
           "{\"prompt\":\"The cat sat on the mat. The cat sat on the mat. The cat sat on the mat. The cat sat\","
           "\"max_tokens\":40,\"temperature\":0%s}",
           spec);
  char *r = http_at(g_port, "POST", "/v1/completions", NULL, body);
  *status = status_of(r);
  json_t *j = body_json(r);
  const char *t = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
  char *out = strdup(t ? t : r);
  json_decref(j);
  free(r);
  return out;
}

static void test_speculative(void) {
  int st0, st1, st2, st3;
  char *plain = spec_text(",\"spec_tokens\":0", &st0);
  char *spec = spec_text(",\"speculative\":{\"tokens\":4}", &st1);
  char *spec2 = spec_text(",\"spec_tokens\":6", &st2);
  CHECK_EQ_INT(st0, 200);
  CHECK_EQ_INT(st1, 200);
  CHECK_EQ_INT(st2, 200);
  CHECK_EQ_STR(spec, plain);
  CHECK_EQ_STR(spec2, plain);
  json_t *j = get_stats();
  json_t *ng = json_object_get(json_object_get(j, "speculative"), "ngram");
  int64_t drafted = json_integer_value(json_object_get(ng, "drafted"));
  int64_t accepted = json_integer_value(json_object_get(ng, "accepted"));
  CHECK(drafted > 0);
  CHECK(accepted > 0 && accepted <= drafted);
  CHECK(json_real_value(json_object_get(ng, "acceptance_rate")) > 0);
  CHECK(json_object_get(json_object_get(j, "speculative"), "draft") != NULL);
  json_decref(j);
  char *r = http_at(g_port, "GET", "/metrics", NULL, NULL);
  CHECK(strstr(r, "# TYPE hearth_spec_drafted_tokens_total counter\nhearth_spec_drafted_tokens_total{source=\"ngram\"} ") != NULL);
  CHECK(strstr(r, "hearth_spec_acceptance_rate{source=\"draft\"} 0\n") != NULL);
  free(r);
  char *bad = spec_text(",\"spec_tokens\":17", &st3);
  CHECK_EQ_INT(st3, 400);
  CHECK(strstr(bad, "spec_tokens") != NULL);
  free(bad);
  bad = spec_text(",\"speculative\":{\"tokens\":-2}", &st3);
  CHECK_EQ_INT(st3, 400);
  CHECK(strstr(bad, "speculative.tokens") != NULL);
  free(bad);
  /* the draft source per request: a name the server knows, and one this model cannot serve */
  char *named = spec_text(",\"speculative\":{\"tokens\":4,\"method\":\"ngram\"}", &st3);
  CHECK_EQ_INT(st3, 200);
  CHECK_EQ_STR(named, plain);
  free(named);
  bad = spec_text(",\"spec_tokens\":4,\"spec_method\":\"mtp\"", &st3);
  CHECK_EQ_INT(st3, 400);
  CHECK_MSG(strstr(bad, "spec_method") && strstr(bad, "multi-token-prediction"), "%s", bad);
  free(bad);
  bad = spec_text(",\"speculative\":{\"tokens\":4,\"method\":\"draft\"}", &st3);
  CHECK_EQ_INT(st3, 400);
  CHECK_MSG(strstr(bad, "spec_method") && strstr(bad, "draft model"), "%s", bad);
  free(bad);
  bad = spec_text(",\"speculative\":{\"method\":\"medusa\"}", &st3);
  CHECK_EQ_INT(st3, 400);
  CHECK_MSG(strstr(bad, "speculative.method") != NULL, "%s", bad);
  free(bad);
  free(plain);
  free(spec);
  free(spec2);
}

static void test_memory_admission(void) {
  hbuf p = {0};
  hbuf_puts(&p, "{\"prompt\":\"");
  for (int i = 0; i < 60; i++) hbuf_puts(&p, "In the beginning God created the heaven and the earth. ");
  hbuf_puts(&p, "\",\"max_tokens\":8,\"stream\":true}");
  char *r = http_at(g_port, "POST", "/v1/completions", NULL, hbuf_str(&p));
  CHECK_EQ_INT(status_of(r), 400);
  json_t *j = body_json(r);
  CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(j, "error"), "type")), "memory_admission");
  json_decref(j);
  free(r);
  hbuf_free(&p);
}


/* A model folder like models/default with another chat template, in a temporary folder. */
static void model_with_template(char *dir, size_t cap, const char *tmpl) {
  snprintf(dir, cap, "/tmp/hearth_tmpl_XXXXXX");
  if (!mkdtemp(dir)) return;
  const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char src[1024], dst[1024];
    snprintf(src, sizeof src, "%s/%s", MODEL, files[i]);
    snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
    CHECK(symlink(src, dst) == 0);
  }
  json_t *cfg = json_load_file(MODEL "/tokenizer_config.json", 0, NULL);
  CHECK(cfg != NULL);
  if (!cfg) return;
  json_object_set_new(cfg, "chat_template", json_string(tmpl));
  char path[1024];
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  CHECK(json_dump_file(cfg, path, 0) == 0);
  json_decref(cfg);
}

static void remove_model(const char *dir) {
  const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json",
                         "tokenizer_config.json"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, files[i]);
    unlink(p);
  }
  rmdir(dir);
}

/* A chat template that cannot be used is the server's fault (500
 * server_error); one that refuses the messages (raise_exception) is the
 * client's (400). Neither message shows a server path. */
static void test_template_errors(void) {
  static const struct { const char *tmpl; int status; const char *type; } cases[] = {
      {"{% for m in messages %}{{ m.content }", 500, "server_error"}, /* does not parse */
      {"{% for m in messages %}{% if m.role == 'user' %}{{ raise_exception('Only system and assistant roles') }}{% endif %}{% endfor %}",
       400, "invalid_request_error"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char dir[256];
    model_with_template(dir, sizeof dir, cases[i].tmpl);
    harness h;
    herr err = {0};
    serve_engine_opts eo = {.threads = 1};
    int rc = harness_start(&h, dir, &eo, NULL, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) {
      remove_model(dir);
      continue;
    }
    char *r = http_at(h.port, "POST", "/v1/chat/completions", NULL,
                      "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2}");
    int code = 0;
    sscanf(r, "HTTP/1.1 %d", &code);
    CHECK_MSG(code == cases[i].status, "template case %zu: got %d: %.200s", i, code, r);
    CHECK(strstr(r, cases[i].type) != NULL);
    CHECK_MSG(strstr(r, "/tmp/") == NULL && strstr(r, dir) == NULL, "template case %zu: a server path in '%s'", i, r);
    free(r);
    harness_stop(&h);
    remove_model(dir);
  }
}

/* The engine starts with the server: before any request /stats shows the
 * pool's capacity; a pool that cannot be had or a KV store that is a file
 * stops the open with the reason. */
static void test_started_at_open(void) {
  json_t *st = get_stats();
  CHECK_EQ_INT(stat_of(st, "kv_cache", "blocks_total"), 16);
  CHECK(stat_of(st, "kv_cache", "capacity_tokens") > 0);
  CHECK_EQ_INT(stat_of(st, "requests", "finished"), 0);
  json_decref(st);
  serve_engine engine;
  herr err = {0};
  serve_engine_opts eo = {.threads = 1, .kv_cache_bytes = (int64_t)100000 << 30};
  int rc = serve_engine_open_opts(MODEL, &eo, &engine, &err);
  CHECK(rc != 0);
  CHECK_MSG(strstr(err.msg, "KV cache") && strstr(err.msg, "more than this machine"), "%s", err.msg);
  if (!rc) serve_engine_close(&engine);
  char file[] = "/tmp/hearth_kvstore_file_XXXXXX";
  int fd = mkstemp(file);
  CHECK(fd >= 0);
  if (fd >= 0) close(fd);
  serve_engine_opts so = {.threads = 1};
  so.load.kv_store = file;
  err = (herr){0};
  rc = serve_engine_open_opts(MODEL, &so, &engine, &err);
  CHECK(rc != 0);
  CHECK_MSG(strstr(err.msg, "not a folder") != NULL, "%s", err.msg);
  if (!rc) serve_engine_close(&engine);
  unlink(file);
}

/* /tokenize and /detokenize on the model's own tokenizer: a round trip. */
static void test_tokenize_round_trip(void) {
  char *r = http_at(g_port, "POST", "/tokenize", NULL, "{\"content\":\"Hello world\",\"add_special\":false,\"with_pieces\":true}");
  CHECK_EQ_INT(status_of(r), 200);
  json_t *j = body_json(r);
  free(r);
  json_t *toks = json_object_get(j, "tokens");
  CHECK(json_array_size(toks) > 0);
  hbuf ids = {0}, pieces = {0};
  size_t i;
  json_t *t;
  json_array_foreach(toks, i, t) {
    hbuf_printf(&ids, "%s%lld", i ? "," : "", (long long)json_integer_value(json_object_get(t, "id")));
    hbuf_puts(&pieces, json_string_value(json_object_get(t, "piece")) ? json_string_value(json_object_get(t, "piece")) : "");
  }
  CHECK_EQ_STR(hbuf_str(&pieces), "Hello world");
  char body[512];
  snprintf(body, sizeof body, "{\"tokens\":[%s]}", hbuf_str(&ids));
  r = http_at(g_port, "POST", "/detokenize", NULL, body);
  json_t *d = body_json(r);
  free(r);
  CHECK_EQ_STR(json_string_value(json_object_get(d, "content")), "Hello world");
  json_decref(d);
  json_decref(j);
  hbuf_free(&ids), hbuf_free(&pieces);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  herr err = {0};
  harness h;
  /* 2 MiB of KV: 16 blocks of 16 tokens on this model, so 64 streams wait and preempt */
  serve_engine_opts eo = {.threads = 2, .max_batch = 16, .memory_budget = 2 << 20};
  if (harness_start(&h, MODEL, &eo, NULL, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  g_port = h.port;
  RUN(test_started_at_open); /* first: no request has run yet */
  RUN(test_streams_with_disconnects);
  RUN(test_cached_tokens);
  RUN(test_concurrent_equals_alone);
  RUN(test_metrics);
  RUN(test_speculative);
  RUN(test_memory_admission);
  RUN(test_template_errors);
  RUN(test_tokenize_round_trip);
  harness_stop(&h);
  TEST_MAIN_END();
}
