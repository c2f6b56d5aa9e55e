/* End-to-end tests of `hearth batch` on the built-in model (models/default):
 * a JSONL of requests with bad lines among them; the output lines' shape
 * (found by custom_id, whatever order they were written in), an error object
 * per bad line, a response per good one equal at temperature 0 to what the
 * server (started here in-process on the same model) answers for the same
 * body; a second run skips every row already in OUT and appends only new
 * ones; usage errors. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "base/buf.h"
#include "base/file.h"
#include "serve/engine.h"
#include "serve/server.h"
#include "test.h"

#define MODEL HEARTH_SOURCE_DIR "/models/default"

static char tmpdir[] = "/tmp/hearth_batch_cli_XXXXXX";

/* Runs HEARTH_BINARY with args (NULL-terminated); exit status, stderr into *err (malloc'd). */
static int run_hearth(const char *const *args, char **err) {
  char errp[600];
  snprintf(errp, sizeof errp, "%s/.stderr", tmpdir);
  char *argv[20];
  int n = 0;
  argv[n++] = (char *)HEARTH_BINARY;
  for (int i = 0; args[i] && n < 19; i++) argv[n++] = (char *)args[i];
  argv[n] = NULL;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    int e = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int o = open("/dev/null", O_WRONLY);
    if (e < 0 || o < 0) _exit(126);
    dup2(o, 1);
    dup2(e, 2);
    execv(argv[0], argv);
    _exit(127);
  }
  int st = 0, status = -1;
  if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st)) status = WEXITSTATUS(st);
  size_t len;
  if (!err || hfile_read(errp, err, &len, NULL)) {
    if (err) *err = strdup("");
  }
  return status;
}

/* OUT's lines by custom_id (a JSON object; lines without one under "" in an array). */
static json_t *read_out(const char *path, int *nlines) {
  json_t *by = json_object(), *none = json_array();
  *nlines = 0;
  FILE *f = fopen(path, "r");
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  while (f && (n = getline(&line, &cap, f)) > 0) {
    (*nlines)++;
    json_t *o = json_loadb(line, (size_t)n, 0, NULL);
    CHECK_MSG(o != NULL, "output line %d is not JSON: %s", *nlines, line);
    if (!o) continue;
    json_t *cid = json_object_get(o, "custom_id");
    if (json_is_string(cid)) json_object_set(by, json_string_value(cid), o);
    else json_array_append(none, o);
    json_decref(o);
  }
  free(line);
  if (f) fclose(f);
  json_object_set_new(by, "", none);
  return by;
}

/* POSTs body to the in-process server; the response body as JSON. */
static json_t *post(int port, const char *path, const char *body) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return NULL;
  }
  hbuf req = {0};
  hbuf_printf(&req, "POST %s HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s", path,
              strlen(body), body);
  if (write(fd, req.data, req.len) != (ssize_t)req.len) CHECK(0);
  hbuf_free(&req);
  hbuf in = {0};
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) hbuf_append(&in, buf, (size_t)n);
  close(fd);
  const char *b = strstr(hbuf_str(&in), "\r\n\r\n");
  json_t *o = b ? json_loads(b + 4, 0, NULL) : NULL;
  hbuf_free(&in);
  return o;
}

static const char *body_a = "{\"prompt\":\"Once upon a time\",\"max_tokens\":10,\"temperature\":0}";
static const char *body_b = "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me about the sea.\"}],\"max_tokens\":12,"
                            "\"temperature\":0,\"n\":2}";

static void write_in(const char *path, bool more) {
  FILE *f = fopen(path, "w");
  fprintf(f, "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":%s}\n", body_a);
  fprintf(f, "{\"custom_id\":\"b\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":%s}\n", body_b);
  fprintf(f, "this is not json\n\n");
  fprintf(f, "{\"custom_id\":\"c\",\"method\":\"POST\",\"url\":\"/v1/files\",\"body\":{}}\n");
  fprintf(f, "{\"custom_id\":\"d\",\"method\":\"POST\",\"url\":\"/v1/embeddings\",\"body\":{\"input\":[\"hello\",\"sea\"]}}\n");
  fprintf(f, "{\"custom_id\":\"e\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"model\":\"not-this-one\",\"prompt\":\"x\"}}\n");
  fprintf(f, "{\"custom_id\":\"f\",\"method\":\"GET\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"x\"}}\n");
  fprintf(f, "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":%s}\n", body_a);
  if (more) fprintf(f, "{\"custom_id\":\"g\",\"method\":\"POST\",\"url\":\"/v1/completions\",\"body\":{\"prompt\":\"Hi\",\"max_tokens\":3}}\n");
  fclose(f);
}

static const char *error_code(json_t *line) {
  return json_string_value(json_object_get(json_object_get(line, "error"), "code"));
}

static void test_batch(void) {
  char in[600], out[600];
  snprintf(in, sizeof in, "%s/in.jsonl", tmpdir);
  snprintf(out, sizeof out, "%s/out.jsonl", tmpdir);
  write_in(in, false);
  char *err = NULL;
  int st = run_hearth((const char *[]){"batch", in, "-o", out, "--concurrency", "4", NULL}, &err);
  CHECK_MSG(st == 0, "exit %d: %s", st, err);
  CHECK_MSG(strstr(err, "batch: 8 row(s)") != NULL && strstr(err, "tok/s") != NULL, "summary: %s", err);
  free(err);
  int nlines = 0;
  json_t *by = read_out(out, &nlines);
  CHECK_EQ_INT(nlines, 8);
  /* every line: id, custom_id, response, error */
  json_t *a = json_object_get(by, "a"), *b = json_object_get(by, "b");
  const char *k;
  json_t *v;
  json_object_foreach(by, k, v) {
    if (!*k) continue;
    CHECK(strncmp(json_string_value(json_object_get(v, "id")), "batch_req_", 10) == 0);
    CHECK(json_object_get(v, "response") && json_object_get(v, "error"));
  }
  /* the bad lines */
  json_t *none = json_object_get(by, "");
  CHECK_EQ_INT((int)json_array_size(none), 1);
  CHECK_EQ_STR(error_code(json_array_get(none, 0)), "invalid_json_line");
  CHECK(json_is_null(json_object_get(json_array_get(none, 0), "response")));
  CHECK_EQ_STR(error_code(json_object_get(by, "c")), "invalid_url");
  CHECK_EQ_STR(error_code(json_object_get(by, "f")), "invalid_method");
  /* a's first line ran; its second is a duplicate (whichever was written last is kept here) */
  json_t *e = json_object_get(json_object_get(by, "e"), "response");
  CHECK_EQ_INT((int)json_integer_value(json_object_get(e, "status_code")), 404);
  CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(json_object_get(e, "body"), "error"), "code")),
               "model_not_found");
  json_t *d = json_object_get(json_object_get(by, "d"), "response");
  CHECK_EQ_INT((int)json_integer_value(json_object_get(d, "status_code")), 200);
  CHECK_EQ_INT((int)json_array_size(json_object_get(json_object_get(d, "body"), "data")), 2);

  /* the same bodies through the server: the same texts at temperature 0 */
  serve_engine engine;
  herr herr_ = {0};
  CHECK_MSG(serve_engine_open(MODEL, 2, &engine, &herr_) == 0, "%s", herr_.msg);
  serve_server *srv = NULL;
  serve_config cfg = {.port = 0};
  CHECK_MSG(serve_start(&srv, &engine, &cfg, &herr_) == 0, "%s", herr_.msg);
  json_t *sa = post(serve_port(srv), "/v1/completions", body_a);
  json_t *sb = post(serve_port(srv), "/v1/chat/completions", body_b);
  serve_stop(srv);
  serve_engine_close(&engine);
  json_t *ba = json_object_get(json_object_get(a, "response"), "body");
  json_t *bb = json_object_get(json_object_get(b, "response"), "body");
  if (json_is_null(json_object_get(a, "response"))) { /* the duplicate line was written after the row */
    CHECK_EQ_STR(error_code(a), "duplicate_custom_id");
    ba = NULL;
  }
  CHECK_EQ_INT((int)json_integer_value(json_object_get(json_object_get(b, "response"), "status_code")), 200);
  CHECK(sa && sb);
  if (ba) CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(json_object_get(ba, "choices"), 0), "text")),
                       json_string_value(json_object_get(json_array_get(json_object_get(sa, "choices"), 0), "text")));
  CHECK_EQ_INT((int)json_array_size(json_object_get(bb, "choices")), 2);
  for (int i = 0; i < 2; i++) {
    json_t *m1 = json_object_get(json_array_get(json_object_get(bb, "choices"), (size_t)i), "message");
    json_t *m2 = json_object_get(json_array_get(json_object_get(sb, "choices"), (size_t)i), "message");
    CHECK_EQ_STR(json_string_value(json_object_get(m1, "content")), json_string_value(json_object_get(m2, "content")));
  }
  CHECK(json_equal(json_object_get(bb, "usage"), json_object_get(sb, "usage")));
  json_decref(sa);
  json_decref(sb);
  json_decref(by);

  /* resume: rows already in OUT are skipped; a new row runs; OUT is appended */
  write_in(in, true);
  st = run_hearth((const char *[]){"batch", in, "-o", out, NULL}, &err);
  CHECK_MSG(st == 0, "exit %d: %s", st, err);
  CHECK_MSG(strstr(err, "already in") != NULL, "%s", err);
  free(err);
  int n2 = 0;
  by = read_out(out, &n2);
  CHECK_EQ_INT(n2, nlines + 2); /* g, and the bad line again (it has no custom_id to skip it by) */
  json_t *g = json_object_get(json_object_get(by, "g"), "response");
  CHECK_EQ_INT((int)json_integer_value(json_object_get(g, "status_code")), 200);
  json_decref(by);

  /* usage errors */
  CHECK_EQ_INT(run_hearth((const char *[]){"batch", NULL}, NULL), 2);
  CHECK_EQ_INT(run_hearth((const char *[]){"batch", in, "--concurrency", "0", NULL}, NULL), 2);
  CHECK_EQ_INT(run_hearth((const char *[]){"batch", "/nonexistent/in.jsonl", NULL}, NULL), 1);
}

int main(void) {
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  RUN(test_batch);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
  TEST_MAIN_END();
}
