/* test_serve_lora.c — LoRA adapters through the server over the real engine
 * (models/default): an adapter loaded at start (as --adapter does) and one
 * through POST /v1/adapters are listed by GET /v1/adapters and announced by
 * GET /v1; a completion under an adapter differs from the base model's, and
 * requests under different adapters (and none) running together answer what
 * each answers alone; an adapter is listed by /v1/models and may be named as
 * the request's model; "a+b" stacks; an unknown adapter is refused 400 naming
 * the field; the prefix cache never hands one adapter's KV to another (or to
 * the base) but does share it between requests under the same adapter;
 * DELETE /v1/adapters/{id} while a stream runs under it answers in_use 1,
 * the stream ends normally, and the adapter is gone for new requests; bad
 * loads (no such folder, a taken name) are 400s and an unknown DELETE a 404;
 * POST /v1/adapters loads only from folders inside --adapter-dir (a name
 * relative to it loads; a path outside, "..", a symlink leading out — the
 * folder or a file in it —, /etc/passwd are one 400 that quotes nothing of
 * any file; a broken config inside says where, not what) and, without one,
 * nothing (403). */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "format/safetensors_write.h"
#include "serve/engine.h"
#include "serve/server.h"
#include "serve_harness.h"
#include "test.h"

#define MODEL HEARTH_SOURCE_DIR "/models/default"

static int g_port;
static char g_root[128];

static char *http(const char *method, const char *path, const char *body) { return http_at(g_port, method, path, NULL, body); }

/* An adapter on every layer's q_proj and v_proj of the default model (hidden 256, 4 × 64 query
 * heads, 2 × 64 KV heads), rank 8, random weights from seed. */
static void write_adapter(const char *dir, uint32_t seed) {
  mkdir(dir, 0755);
  char path[300];
  snprintf(path, sizeof path, "%s/adapter_config.json", dir);
  FILE *f = fopen(path, "w");
  fputs("{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\", \"v_proj\"], \"bias\": \"none\"}", f);
  fclose(f);
  enum { R = 8, D = 256, L = 8 };
  static float bufs[L][4][R * D];
  st_writer *w = st_writer_new();
  uint32_t x = seed;
  for (int l = 0; l < L; l++)
    for (int m = 0; m < 4; m++) {
      bool is_v = m >= 2, is_b = m % 2 == 1;
      int64_t out = is_v ? 128 : 256;
      int64_t n = is_b ? out * R : R * D;
      for (int64_t i = 0; i < n; i++) x = x * 1664525u + 1013904223u, bufs[l][m][i] = 0.25f * ((float)(x >> 8) / 16777216.0f - 0.5f);
      char name[160];
      snprintf(name, sizeof name, "base_model.model.model.layers.%d.self_attn.%s.lora_%s.weight", l, is_v ? "v_proj" : "q_proj",
               is_b ? "B" : "A");
      int64_t shape[2] = {is_b ? out : R, is_b ? R : D};
      st_writer_tensor(w, name, ST_F32, 2, shape, bufs[l][m]);
    }
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  herr err = {0};
  if (st_writer_write(w, path, NULL, NULL, &err)) fprintf(stderr, "write %s: %s\n", path, err.msg);
  st_writer_free(w);
}

/* A greedy completion's text and cached tokens; adapter NULL: none given. */
static char *complete(const char *prompt, const char *adapter, int max_tokens, int *status, int64_t *cached) {
  hbuf b = {0};
  hbuf_printf(&b, "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0", prompt, max_tokens);
  if (adapter) hbuf_printf(&b, ",\"adapter\":\"%s\"", adapter);
  hbuf_puts(&b, "}");
  char *r = http("POST", "/v1/completions", hbuf_str(&b));
  hbuf_free(&b);
  *status = status_of(r);
  json_t *j = body_json(r);
  free(r);
  const char *t = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
  if (cached)
    *cached = json_integer_value(
        json_object_get(json_object_get(json_object_get(j, "usage"), "prompt_tokens_details"), "cached_tokens"));
  char *out = t ? strdup(t) : NULL;
  if (!t) {
    const json_t *e = json_object_get(j, "error");
    char *dump = e ? json_dumps(e, 0) : NULL;
    out = dump ? dump : strdup("(none)");
  }
  json_decref(j);
  return out;
}

static void test_listing_and_loading(void) {
  char *r = http("GET", "/v1", NULL);
  json_t *j = body_json(r);
  CHECK(json_is_true(json_object_get(json_object_get(j, "capabilities"), "adapters")));
  json_decref(j);
  free(r);
  char body[400];
  snprintf(body, sizeof body, "{\"name\":\"b\",\"path\":\"%s/b\"}", g_root);
  r = http("POST", "/v1/adapters", body);
  CHECK_EQ_INT(status_of(r), 200);
  j = body_json(r);
  CHECK_EQ_STR(json_string_value(json_object_get(j, "id")), "b");
  CHECK_EQ_INT(json_integer_value(json_object_get(j, "rank")), 8);
  CHECK_EQ_INT(json_integer_value(json_object_get(j, "modules")), 16);
  json_decref(j);
  free(r);
  r = http("POST", "/v1/adapters", body); /* the name is taken */
  CHECK_EQ_INT(status_of(r), 400);
  free(r);
  r = http("POST", "/v1/adapters", "{\"name\":\"c\",\"path\":\"/nonexistent/adapter\"}");
  CHECK_EQ_INT(status_of(r), 400);
  CHECK(strstr(r, "/nonexistent/adapter") != NULL);
  free(r);
  r = http("POST", "/v1/adapters", "{\"name\":\"c\"}");
  CHECK_EQ_INT(status_of(r), 400);
  free(r);
  r = http("GET", "/v1/adapters", NULL);
  CHECK_EQ_INT(status_of(r), 200);
  j = body_json(r);
  json_t *data = json_object_get(j, "data");
  CHECK_EQ_INT(json_array_size(data), 2);
  CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(data, 0), "id")), "a");
  CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(data, 1), "id")), "b");
  CHECK_EQ_INT(json_integer_value(json_object_get(json_array_get(data, 0), "in_use")), 0);
  json_decref(j);
  free(r);
  r = http("DELETE", "/v1/adapters/nope", NULL);
  CHECK_EQ_INT(status_of(r), 404);
  free(r);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (f) fputs(text, f), fclose(f);
}

/* No file bytes in an answer: the first bytes of /etc/passwd and of the planted config. */
static bool quotes_nothing(const char *r) {
  return !strstr(r, "root:") && !strstr(r, "daemon:") && !strstr(r, "SECRET") && !strstr(r, "near '");
}

static void test_adapter_dir(void) {
  char path[300], body[600];
  /* a name relative to the adapter directory loads */
  char *r = http("POST", "/v1/adapters", "{\"name\":\"c\",\"path\":\"c\"}");
  CHECK_MSG(status_of(r) == 200, "%.300s", r);
  free(r);
  r = http("DELETE", "/v1/adapters/c", NULL);
  CHECK_EQ_INT(status_of(r), 200);
  free(r);
  /* outside it, however spelled, or not a folder: one 400 quoting nothing */
  snprintf(path, sizeof path, "%s_outside", g_root); /* beside the adapter directory */
  mkdir(path, 0755);
  snprintf(body, sizeof body, "%s_outside/x", g_root);
  write_adapter(body, 5); /* a valid adapter, but outside */
  snprintf(path, sizeof path, "%s/evil", g_root);
  CHECK(symlink(body, path) == 0);             /* evil -> a folder outside */
  char up[200];                                /* ../<name>_outside/x */
  snprintf(up, sizeof up, "../%s_outside/x", strrchr(g_root, '/') + 1);
  snprintf(path, sizeof path, "%s/etc", g_root);
  CHECK(symlink("/etc", path) == 0);           /* etc -> /etc */
  snprintf(path, sizeof path, "%s/leaky", g_root);
  mkdir(path, 0755);                           /* a folder inside whose config leads out */
  snprintf(path, sizeof path, "%s/leaky/adapter_config.json", g_root);
  CHECK(symlink("/etc/passwd", path) == 0);
  snprintf(path, sizeof path, "%s/secret.json", g_root);
  write_file(path, "SECRET-TOKEN-1234\n");
  const char *refused[] = {"/etc/passwd", "/etc", up, "evil", "etc", "etc/passwd", "leaky", "secret.json",
                           "no-such-adapter", "", "."};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    snprintf(body, sizeof body, "{\"name\":\"x%zu\",\"path\":\"%s\"}", i, refused[i]);
    r = http("POST", "/v1/adapters", body);
    CHECK_MSG(status_of(r) == 400, "path '%s': %.300s", refused[i], r);
    CHECK_MSG(quotes_nothing(r), "path '%s': %.300s", refused[i], r);
    if (refused[i][0]) CHECK_MSG(strstr(r, "adapter_path_refused") != NULL, "path '%s': %.300s", refused[i], r);
    free(r);
  }
  snprintf(body, sizeof body, "{\"name\":\"x\",\"path\":\"%s_outside/x\"}", g_root); /* absolute, outside */
  r = http("POST", "/v1/adapters", body);
  CHECK_MSG(status_of(r) == 400 && strstr(r, "adapter_path_refused"), "%.300s", r);
  free(r);
  /* a broken config inside the directory: the error says where, not what */
  snprintf(path, sizeof path, "%s/broken", g_root);
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/broken/adapter_config.json", g_root);
  write_file(path, "root:x:0:0:root:/root:/bin/bash SECRET\n");
  r = http("POST", "/v1/adapters", "{\"name\":\"x\",\"path\":\"broken\"}");
  CHECK_MSG(status_of(r) == 400 && strstr(r, "line 1"), "%.300s", r);
  CHECK_MSG(quotes_nothing(r), "%.300s", r);
  free(r);
  r = http("GET", "/v1/adapters", NULL);
  json_t *j = body_json(r);
  CHECK_EQ_INT(json_array_size(json_object_get(j, "data")), 1); /* a only (b was deleted): none of the refused loaded */
  json_decref(j);
  free(r);
}

typedef struct job {
  const char *adapter;
  int i;
  char *text;
} job;

static void *job_main(void *arg) {
  job *jb = arg;
  char prompt[64];
  snprintf(prompt, sizeof prompt, "%d: And God said, Let there be", jb->i);
  int st;
  jb->text = complete(prompt, jb->adapter, 10, &st, NULL);
  return NULL;
}

static void test_mixed_requests(void) {
  static const char *which[] = {NULL, "a", "b", "none", "a+b", "a"};
  enum { N = sizeof which / sizeof which[0] };
  char *alone[N];
  for (int i = 0; i < N; i++) {
    job jb = {which[i], i, NULL};
    job_main(&jb);
    alone[i] = jb.text;
  }
  char *alone_a1 = strdup(alone[1]); /* prompt 1 under "a" */
  /* the adapters change the output */
  int st;
  char *base0 = complete("0: And God said, Let there be", NULL, 10, &st, NULL);
  char *a0 = complete("0: And God said, Let there be", "a", 10, &st, NULL);
  char *b0 = complete("0: And God said, Let there be", "b", 10, &st, NULL);
  char *ab0 = complete("0: And God said, Let there be", "a+b", 10, &st, NULL);
  CHECK_EQ_INT(st, 200);
  CHECK_MSG(strcmp(base0, a0) != 0 && strcmp(a0, b0) != 0 && strcmp(ab0, a0) != 0 && strcmp(ab0, b0) != 0,
            "base '%s' a '%s' b '%s' a+b '%s'", base0, a0, b0, ab0);
  free(base0), free(a0), free(b0), free(ab0);
  /* together, the same as alone */
  pthread_t th[N];
  job jobs[N];
  for (int i = 0; i < N; i++) {
    jobs[i] = (job){which[i], i, NULL};
    pthread_create(&th[i], NULL, job_main, &jobs[i]);
  }
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    CHECK_MSG(jobs[i].text && !strcmp(jobs[i].text, alone[i]), "request %d (%s): '%s' together, '%s' alone", i,
              which[i] ? which[i] : "-", jobs[i].text, alone[i]);
    free(jobs[i].text);
    free(alone[i]);
  }
  /* an adapter's name as the model (as vLLM serves adapters): listed under /v1/models, and runs under it */
  char *r0 = http("GET", "/v1/models", NULL);
  json_t *jm = body_json(r0);
  bool listed = false;
  size_t k;
  json_t *mo;
  json_array_foreach(json_object_get(jm, "data"), k, mo) if (!strcmp(json_string_value(json_object_get(mo, "id")), "a")) listed =
      json_is_string(json_object_get(mo, "parent"));
  CHECK(listed);
  json_decref(jm);
  free(r0);
  r0 = http("GET", "/v1/models/b", NULL);
  CHECK_EQ_INT(status_of(r0), 200);
  free(r0);
  r0 = http("POST", "/v1/completions", "{\"model\":\"a\",\"prompt\":\"1: And God said, Let there be\",\"max_tokens\":10,\"temperature\":0}");
  CHECK_EQ_INT(status_of(r0), 200);
  jm = body_json(r0);
  const char *as_model = json_string_value(json_object_get(json_array_get(json_object_get(jm, "choices"), 0), "text"));
  CHECK_MSG(as_model && !strcmp(as_model, alone_a1), "model \"a\": '%s', adapter \"a\": '%s'", as_model ? as_model : "-", alone_a1);
  json_decref(jm);
  free(r0);
  free(alone_a1);
  /* an unknown adapter */
  char *r = http("POST", "/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":2,\"adapter\":\"zz\"}");
  CHECK_EQ_INT(status_of(r), 400);
  CHECK(strstr(r, "\"adapter\"") != NULL && strstr(r, "zz") != NULL);
  free(r);
  r = http("POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2,\"adapter\":7}");
  CHECK_EQ_INT(status_of(r), 400);
  free(r);
}

static void test_prefix_cache_apart(void) {
  hbuf p = {0};
  for (int i = 0; i < 8; i++) hbuf_puts(&p, "Now the serpent was more subtil than any beast of the field. ");
  int st;
  int64_t c_base = -1, c_a1 = -1, c_a2 = -1, c_b = -1;
  free(complete(hbuf_str(&p), NULL, 2, &st, &c_base));
  CHECK_EQ_INT(st, 200);
  free(complete(hbuf_str(&p), "a", 2, &st, &c_a1));
  free(complete(hbuf_str(&p), "a", 2, &st, &c_a2));
  free(complete(hbuf_str(&p), "b", 2, &st, &c_b));
  fprintf(stderr, "  cached tokens: base %lld, a %lld then %lld, b %lld\n", (long long)c_base, (long long)c_a1, (long long)c_a2,
          (long long)c_b);
  CHECK_EQ_INT(c_a1, 0);  /* the base model's blocks are not a's */
  CHECK(c_a2 > 64);       /* a's own are */
  CHECK_EQ_INT(c_b, 0);   /* and not b's */
  hbuf_free(&p);
}

static void test_delete_while_running(void) {
  int fd = dial(g_port);
  CHECK(fd >= 0);
  if (fd < 0) return;
  send_request(fd, "POST", "/v1/completions", NULL,
               "{\"prompt\":\"In the beginning\",\"max_tokens\":120,\"temperature\":0,\"ignore_eos\":true,\"stream\":true,"
               "\"adapter\":\"b\"}");
  /* wait for the first event, then unload b under it */
  hbuf got = {0};
  char buf[1024];
  ssize_t n;
  while (!strstr(hbuf_str(&got), "data: ") && (n = recv(fd, buf, sizeof buf, 0)) > 0) hbuf_append(&got, buf, (size_t)n);
  char *r = http("DELETE", "/v1/adapters/b", NULL);
  CHECK_EQ_INT(status_of(r), 200);
  json_t *j = body_json(r);
  CHECK(json_is_true(json_object_get(j, "deleted")));
  CHECK_EQ_INT(json_integer_value(json_object_get(j, "in_use")), 1);
  json_decref(j);
  free(r);
  /* new requests can no longer name it */
  int st;
  char *t = complete("x", "b", 2, &st, NULL);
  CHECK_EQ_INT(st, 400);
  free(t);
  r = http("GET", "/v1/adapters", NULL);
  j = body_json(r);
  CHECK_EQ_INT(json_array_size(json_object_get(j, "data")), 1);
  json_decref(j);
  free(r);
  /* the running stream finishes under it */
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) hbuf_append(&got, buf, (size_t)n);
  close(fd);
  CHECK(strstr(hbuf_str(&got), "data: [DONE]") != NULL);
  CHECK(strstr(hbuf_str(&got), "\"finish_reason\":\"length\"") != NULL);
  hbuf_free(&got);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  snprintf(g_root, sizeof g_root, "/tmp/hearth_test_serve_lora_%d", (int)getpid());
  mkdir(g_root, 0755);
  char dir[200];
  snprintf(dir, sizeof dir, "%s/a", g_root);
  write_adapter(dir, 7);
  snprintf(dir, sizeof dir, "%s/b", g_root);
  write_adapter(dir, 99);
  herr err = {0};
  serve_engine engine;
  serve_engine_opts eo = {.threads = 2, .max_batch = 8};
  if (serve_engine_open_opts(MODEL, &eo, &engine, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  snprintf(dir, sizeof dir, "%s/a", g_root);
  if (engine.adapter_load(engine.impl, "a", dir, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  snprintf(dir, sizeof dir, "%s/c", g_root);
  write_adapter(dir, 3);
  serve_config cfg = {.port = 0, .adapter_dir = g_root};
  serve_server *srv;
  if (serve_start(&srv, &engine, &cfg, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    serve_engine_close(&engine);
    return 1;
  }
  g_port = serve_port(srv);
  RUN(test_listing_and_loading);
  RUN(test_mixed_requests);
  RUN(test_prefix_cache_apart);
  RUN(test_delete_while_running);
  RUN(test_adapter_dir);
  serve_stop(srv);
  /* without --adapter-dir the API loads nothing, whatever the path */
  serve_config bare = {.port = 0};
  if (serve_start(&srv, &engine, &bare, &err) == 0) {
    g_port = serve_port(srv);
    snprintf(dir, sizeof dir, "{\"name\":\"c\",\"path\":\"%s/c\"}", g_root);
    char *r = http("POST", "/v1/adapters", dir);
    CHECK_MSG(status_of(r) == 403 && strstr(r, "--adapter-dir"), "%.300s", r);
    free(r);
    r = http("POST", "/v1/adapters", "{\"name\":\"c\",\"path\":\"/etc/passwd\"}");
    CHECK_MSG(status_of(r) == 403 && quotes_nothing(r), "%.300s", r);
    free(r);
    serve_stop(srv);
  } else {
    CHECK_MSG(0, "%s", err.msg);
  }
  cfg.adapter_dir = "/no/such/adapter/dir";
  CHECK(serve_start(&srv, &engine, &cfg, &err) == HEARTH_EINVAL && strstr(err.msg, "/no/such/adapter/dir"));
  serve_engine_close(&engine);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s_outside'", g_root, g_root);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_root);
  TEST_MAIN_END();
}
