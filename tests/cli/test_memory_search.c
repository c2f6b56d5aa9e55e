/* End-to-end tests of the memory wiki's search with the built-in model's
 * embeddings (models/default): `hearth memory search --json` over a copy of
 * tests/fixtures/memory_wiki ranks the article of a query's topic first,
 * for several topics; the index beside the wiki is updated incrementally
 * (a second run embeds nothing, one touched article is embedded again
 * alone, a deleted one is dropped, all read from the printed counters);
 * usage errors exit 2. Then `hearth chat --memory` starts over the wiki and,
 * with --memory-always, runs a memory_search call each turn before answering;
 * `hearth serve --memory` answers a chat whose tool_choice forces
 * memory_search: the server runs the call on the wiki and the reply carries
 * the exchange. */
#include <arpa/inet.h>
#include <dirent.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "test.h"

#define WIKI HEARTH_SOURCE_DIR "/tests/fixtures/memory_wiki"
#define MODEL HEARTH_SOURCE_DIR "/models/default"

static char g_dir[256];

static int run(const char *args, hbuf *out, hbuf *err) {
  char cmd[8192], errpath[64];
  snprintf(errpath, sizeof errpath, "/tmp/hearth_memsearch_err_%d.txt", (int)getpid());
  snprintf(cmd, sizeof cmd, "'%s' %s --threads 2 2>%s", HEARTH_BINARY, args, errpath);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) hbuf_append(out, buf, n);
  int st = pclose(p);
  FILE *e = fopen(errpath, "r");
  if (e) {
    while ((n = fread(buf, 1, sizeof buf, e)) > 0) hbuf_append(err, buf, n);
    fclose(e);
  }
  remove(errpath);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* `hearth memory search QUERY --wiki g_dir --json -k 6`, parsed (NULL on failure). */
static json_t *search(const char *query) {
  char args[4096];
  snprintf(args, sizeof args, "memory search '%s' --wiki '%s' --model '%s' --json -k 6", query, g_dir, MODEL);
  hbuf out = {0}, err = {0};
  int rc = run(args, &out, &err);
  json_t *j = rc == 0 ? json_loads(hbuf_str(&out), 0, NULL) : NULL;
  if (!j) fprintf(stderr, "memory search '%s': exit %d, stdout %s, stderr %s\n", query, rc, hbuf_str(&out), hbuf_str(&err));
  hbuf_free(&out);
  hbuf_free(&err);
  return j;
}

static int index_count(json_t *j, const char *key) {
  return (int)json_integer_value(json_object_get(json_object_get(j, "index"), key));
}

static const char *first_slug(json_t *j) {
  return json_string_value(json_object_get(json_array_get(json_object_get(j, "results"), 0), "slug"));
}

static void print_ranking(json_t *j) {
  size_t i;
  json_t *r;
  json_array_foreach(json_object_get(j, "results"), i, r)
    fprintf(stderr, "  %.4f %s\n", json_real_value(json_object_get(r, "score")), json_string_value(json_object_get(r, "slug")));
}

static void wiki_copy(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/hearth_memsearch_XXXXXX");
  if (!mkdtemp(g_dir)) {
    g_dir[0] = 0;
    return;
  }
  DIR *d = opendir(WIKI);
  struct dirent *de;
  while (d && (de = readdir(d))) {
    if (!strstr(de->d_name, ".md")) continue;
    char from[4096], to[4096];
    snprintf(from, sizeof from, "%s/%s", WIKI, de->d_name);
    snprintf(to, sizeof to, "%s/%s", g_dir, de->d_name);
    hfile_copy(from, to, NULL);
  }
  if (d) closedir(d);
}

/* Each query's topic article ranks first. */
static const struct {
  const char *query, *slug;
} topics[] = {
    {"How much flour and water do I feed the sourdough starter before baking bread?", "sourdough-bread"},
    {"The tomato plants have brown spots on their leaves", "tomato-garden"},
    {"How do I mend a puncture in a bicycle tyre?", "bicycle-repair"},
    {"When are the lambs born and the sheep shorn?", "sheep-flock"},
    {"What did we do when we moved house to the village?", "house-move"},
    {"Where does Tom go fishing for trout on the river?", "river-fishing"},
};

static void test_ranking(void) {
  int right = 0, n = (int)(sizeof topics / sizeof topics[0]);
  for (int i = 0; i < n; i++) {
    json_t *j = search(topics[i].query);
    CHECK(j != NULL);
    if (!j) continue;
    CHECK_EQ_INT(json_array_size(json_object_get(j, "results")), 6);
    CHECK_EQ_INT(index_count(j, "articles"), 6);
    const char *got = first_slug(j);
    bool ok = got && !strcmp(got, topics[i].slug);
    right += ok;
    CHECK_MSG(ok, "'%s': %s first, not %s", topics[i].query, got ? got : "(none)", topics[i].slug);
    if (!ok) print_ranking(j);
    json_decref(j);
  }
  fprintf(stderr, "memory search: %d of %d topics ranked first\n", right, n);
}

static void test_incremental(void) {
  /* the ranking runs built the index: nothing more to embed */
  json_t *j = search("sheep");
  CHECK(j != NULL);
  if (!j) return;
  CHECK_EQ_INT(index_count(j, "embedded"), 0);
  CHECK_EQ_INT(index_count(j, "chunks_embedded"), 0);
  CHECK(json_is_false(json_object_get(json_object_get(j, "index"), "rebuilt")));
  json_decref(j);
  /* one article touched: it alone */
  char path[512];
  snprintf(path, sizeof path, "%s/tomato-garden.md", g_dir);
  FILE *f = fopen(path, "a");
  if (f) fputs("\nThe first ripe tomatoes were picked in August.\n", f), fclose(f);
  j = search("sheep");
  CHECK(j != NULL);
  if (!j) return;
  CHECK_EQ_INT(index_count(j, "embedded"), 1);
  CHECK_EQ_INT(index_count(j, "chunks_embedded"), 1);
  CHECK_EQ_INT(index_count(j, "removed"), 0);
  json_decref(j);
  /* deleted: dropped, nothing embedded */
  snprintf(path, sizeof path, "%s/river-fishing.md", g_dir);
  CHECK_EQ_INT(unlink(path), 0);
  j = search("sheep");
  CHECK(j != NULL);
  if (!j) return;
  CHECK_EQ_INT(index_count(j, "embedded"), 0);
  CHECK_EQ_INT(index_count(j, "removed"), 1);
  CHECK_EQ_INT(index_count(j, "articles"), 5);
  CHECK_EQ_INT(json_array_size(json_object_get(j, "results")), 5);
  json_decref(j);
}

static void test_usage(void) {
  hbuf out = {0}, err = {0};
  CHECK_EQ_INT(run("memory search 'x'", &out, &err), 2);
  CHECK(strstr(hbuf_str(&err), "--wiki") != NULL);
  hbuf_clear(&out), hbuf_clear(&err);
  CHECK_EQ_INT(run("memory search --wiki /tmp", &out, &err), 2);
  hbuf_clear(&out), hbuf_clear(&err);
  CHECK_EQ_INT(run("memory search 'x' --wiki /nonexistent/wiki", &out, &err), 1);
  CHECK(strstr(hbuf_str(&err), "/nonexistent/wiki") != NULL);
  hbuf_clear(&out), hbuf_clear(&err);
  CHECK_EQ_INT(run("memory frobnicate", &out, &err), 2);
  hbuf_clear(&out), hbuf_clear(&err);
  CHECK_EQ_INT(run("memory search --help", &out, &err), 0);
  CHECK(strstr(hbuf_str(&out), "--wiki") != NULL);
  hbuf_free(&out);
  hbuf_free(&err);
}

/* hearth chat --memory: the wiki opened (its index brought up to date) before the session. */
static void test_chat_memory(void) {
  char args[2048];
  snprintf(args, sizeof args, "chat --model '%s' --memory '%s' -n 8 --temp 0 </dev/null", MODEL, g_dir);
  hbuf out = {0}, err = {0};
  CHECK_EQ_INT(run(args, &out, &err), 0);
  hbuf_clear(&out), hbuf_clear(&err);
  snprintf(args, sizeof args, "chat --model '%s' --memory /nonexistent/wiki </dev/null", MODEL);
  CHECK_EQ_INT(run(args, &out, &err), 1);
  CHECK(strstr(hbuf_str(&err), "--memory") != NULL);
  hbuf_clear(&out), hbuf_clear(&err);
  CHECK_EQ_INT(run("chat --memory-always </dev/null", &out, &err), 2);
  /* --memory-always: the turn's first reply is a memory_search call, run on the wiki, and the
   * model answers after its result (the call on stderr, the answer on stdout) */
  hbuf_clear(&out), hbuf_clear(&err);
  char in[300];
  snprintf(in, sizeof in, "%s.input", g_dir);
  FILE *f = fopen(in, "w");
  if (f) fputs("Tell me of the sheep.\n", f), fclose(f);
  snprintf(args, sizeof args, "chat --model '%s' --memory '%s' --memory-always -n 24 --temp 0 <'%s'", MODEL, g_dir, in);
  CHECK_EQ_INT(run(args, &out, &err), 0);
  int calls = 0;
  for (const char *p = hbuf_str(&err); (p = strstr(p, "[memory_search: ")); p++) calls++;
  CHECK_EQ_INT(calls, 1);
  CHECK(strstr(hbuf_str(&err), " failed]") == NULL);
  CHECK(strstr(hbuf_str(&err), "exceeded") == NULL); /* the turn not dropped */
  CHECK(strspn(hbuf_str(&out), " \n") < out.len);   /* an answer after the result */
  CHECK(strchr(hbuf_str(&out), '{') == NULL); /* the calls are not shown as text */
  fprintf(stderr, "chat --memory-always: stderr: %.300s\n  stdout: %.300s\n", hbuf_str(&err), hbuf_str(&out));
  remove(in);
  hbuf_free(&out);
  hbuf_free(&err);
}

/* ---- hearth serve --memory ---- */

static json_t *post(int port, const char *body, int *status) {
  *status = 0;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return NULL;
  }
  hbuf req = {0};
  hbuf_printf(&req, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                    "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s", strlen(body), body);
  if (send(fd, req.data, req.len, MSG_NOSIGNAL) != (ssize_t)req.len) fprintf(stderr, "short send\n");
  hbuf_free(&req);
  hbuf resp = {0};
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) hbuf_append(&resp, buf, (size_t)n);
  close(fd);
  sscanf(hbuf_str(&resp), "HTTP/1.1 %d", status);
  const char *b = strstr(hbuf_str(&resp), "\r\n\r\n");
  json_t *j = b ? json_loads(b + 4, 0, NULL) : NULL;
  if (!j) fprintf(stderr, "response: %.500s\n", hbuf_str(&resp));
  hbuf_free(&resp);
  return j;
}

static void test_serve_memory(void) {
  int pipefd[2];
  if (pipe(pipefd)) return;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], 2);
    close(pipefd[0]);
    close(pipefd[1]);
    execl(HEARTH_BINARY, HEARTH_BINARY, "serve", "--model", MODEL, "--memory", g_dir, "--port", "0", "--threads", "2",
          (char *)NULL);
    _exit(127);
  }
  close(pipefd[1]);
  FILE *log = fdopen(pipefd[0], "r");
  char line[1024];
  int port = 0;
  while (log && fgets(line, sizeof line, log)) {
    const char *p = strstr(line, "listening on http://127.0.0.1:");
    if (p && (port = atoi(p + strlen("listening on http://127.0.0.1:"))) > 0) break;
  }
  CHECK(port > 0);
  if (port > 0) {
    int status = 0;
    json_t *r = post(port,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"Give me a verse about sheep.\"}],"
                     "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"memory_search\"}},"
                     "\"max_tokens\":48,\"temperature\":0}",
                     &status);
    CHECK_EQ_INT(status, 200);
    json_t *ex = json_object_get(r, "tool_exchange");
    CHECK_EQ_INT(json_array_size(ex), 2);
    json_t *call = json_array_get(json_object_get(json_array_get(ex, 0), "tool_calls"), 0);
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(call, "function"), "name")), "memory_search");
    const char *result = json_string_value(json_object_get(json_array_get(ex, 1), "content"));
    /* the call's query is the model's: the wiki's hits, or the tool's word on a call without one */
    CHECK(result && (strstr(result, "of the memory wiki for") || !strncmp(result, "error: ", 7)));
    fprintf(stderr, "serve --memory: the call %s\n  gave: %.200s\n",
            json_string_value(json_object_get(json_object_get(call, "function"), "arguments")), result ? result : "(none)");
    CHECK(json_is_string(json_object_get(json_object_get(json_array_get(json_object_get(r, "choices"), 0), "message"),
                                         "content")));
    json_decref(r);
  }
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  if (log) fclose(log);
}

int main(void) {
  if (!hfile_exists(MODEL "/config.json")) {
    fprintf(stderr, "no built-in model at %s\n", MODEL);
    return 1;
  }
  wiki_copy();
  CHECK(g_dir[0] != 0);
  if (!g_dir[0]) return 1;
  RUN(test_ranking);
  RUN(test_incremental);
  RUN(test_usage);
  RUN(test_chat_memory);
  RUN(test_serve_memory);
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_dir);
  TEST_MAIN_END();
}
