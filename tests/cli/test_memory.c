/* End-to-end tests of `hearth memory ingest`: the built binary on the
 * built-in model (models/default). Whatever the model writes, the wiki's
 * shape is checked: articles with front matter citing the log, an index
 * listing exactly them, one git commit whose message sums the run; a second
 * run changes nothing. Also the model check before any work: a Hub id that
 * is not in the cache is refused naming `hearth get`, with nothing fetched;
 * and the usage errors. */
#include <dirent.h>
#include <fcntl.h>
#include <git2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "memory/article.h"
#include "test.h"

static char tmpdir[] = "/tmp/hearth_memory_cli_XXXXXX";

typedef struct run_result {
  int status;
  char *out, *err; /* owned */
} run_result;

static char *slurp(const char *path) {
  char *s = NULL;
  size_t n;
  if (hfile_read(path, &s, &n, NULL)) return strdup("");
  return s;
}

/* Runs HEARTH_BINARY with args (NULL-terminated, without argv[0]). */
static run_result run_hearth(const char *const *args) {
  run_result r = {-1, NULL, NULL};
  char outp[600], errp[600];
  snprintf(outp, sizeof outp, "%s/.stdout", tmpdir);
  snprintf(errp, sizeof errp, "%s/.stderr", tmpdir);
  char *argv[40];
  int n = 0;
  argv[n++] = (char *)HEARTH_BINARY;
  for (int i = 0; args[i] && n < 39; i++) argv[n++] = (char *)args[i];
  argv[n] = NULL;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    int in = open("/dev/null", O_RDONLY), o = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644),
        e = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || o < 0 || e < 0) _exit(126);
    dup2(in, 0);
    dup2(o, 1);
    dup2(e, 2);
    execv(argv[0], argv);
    _exit(127);
  }
  int st = 0;
  if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st)) r.status = WEXITSTATUS(st);
  r.out = slurp(outp);
  r.err = slurp(errp);
  return r;
}

static void run_free(run_result *r) {
  free(r->out);
  free(r->err);
}

static void head_of(const char *dir, char out[41], int *commits, char **message) {
  out[0] = 0;
  *commits = 0;
  *message = NULL;
  git_libgit2_init();
  git_repository *repo = NULL;
  git_revwalk *walk = NULL;
  git_commit *c = NULL;
  git_oid oid;
  if (!git_repository_open(&repo, dir) && !git_reference_name_to_id(&oid, repo, "HEAD")) {
    git_oid_tostr(out, 41, &oid);
    if (!git_commit_lookup(&c, repo, &oid)) *message = strdup(git_commit_message(c));
    git_revwalk_new(&walk, repo);
    git_revwalk_push_head(walk);
    while (!git_revwalk_next(&oid, walk)) ++*commits;
  }
  git_commit_free(c);
  git_revwalk_free(walk);
  git_repository_free(repo);
  git_libgit2_shutdown();
}

/* Checks every article of wiki (front matter, sources from log, dates) and that the index lists exactly them. */
static int check_articles(const char *wiki, const char *log, const char *date) {
  char *index = NULL;
  size_t len;
  char ip[700];
  snprintf(ip, sizeof ip, "%s/index.md", wiki);
  CHECK_MSG(!hfile_read(ip, &index, &len, NULL), "no %s", ip);
  if (!index) return 0;
  CHECK(!strncmp(index, "# Index\n\n", 9));
  int articles = 0, listed = 0;
  for (const char *p = strstr(index, "\n- [["); p; p = strstr(p + 1, "\n- [[")) listed++;
  DIR *d = opendir(wiki);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (n < 4 || strcmp(e->d_name + n - 3, ".md") || !strcmp(e->d_name, "index.md")) continue;
    char path[1000], slug[300], *text = NULL;
    snprintf(path, sizeof path, "%s/%s", wiki, e->d_name);
    snprintf(slug, sizeof slug, "%.*s", (int)(n - 3), e->d_name);
    CHECK(!hfile_read(path, &text, &len, NULL));
    mem_article a;
    herr err = {0};
    int rc = text ? mem_article_parse(slug, text, len, &a, &err) : -1;
    CHECK_MSG(rc == 0, "%s: %s", path, err.msg);
    if (!rc) {
      articles++;
      CHECK(a.title && *a.title);
      CHECK_MSG(a.n_sources >= 1, "%s cites no source", path);
      for (size_t k = 0; k < a.n_sources; k++)
        CHECK_MSG(!strncmp(a.sources[k], log, strlen(log)) && a.sources[k][strlen(log)] == '#', "%s: source %s", path,
                  a.sources[k]);
      CHECK_EQ_STR(a.created, date);
      CHECK_EQ_STR(a.updated, date);
      char line[700];
      snprintf(line, sizeof line, "\n- [[%s]] — %s\n", a.slug, a.title);
      CHECK_MSG(strstr(index, line) != NULL, "the index does not list %s", slug);
      mem_article_free(&a);
    }
    free(text);
  }
  if (d) closedir(d);
  CHECK_EQ_INT(listed, articles);
  free(index);
  return articles;
}

static void test_ingest_builtin_model(void) {
  char log[600], wiki[600];
  snprintf(log, sizeof log, "%s/talk.jsonl", tmpdir);
  snprintf(wiki, sizeof wiki, "%s/wiki", tmpdir);
  FILE *f = fopen(log, "w");
  if (!f) return;
  fputs("{\"role\":\"user\",\"content\":\"My sister Alice lives in Lyon. She is a nurse.\"}\n"
        "{\"role\":\"assistant\",\"content\":\"Alice is a nurse in Lyon.\"}\n"
        "{\"role\":\"user\",\"content\":\"I am building a cedar garden shed.\"}\n",
        f);
  fclose(f);
  const char *args[] = {"memory", "ingest", log, "--wiki", wiki, "--date", "2026-01-02", "--threads", "2", NULL};
  run_result r = run_hearth(args);
  CHECK_MSG(r.status == 0, "exit %d\n%s%s", r.status, r.out, r.err);
  CHECK_MSG(strstr(r.out, "memory: 1 new log") && strstr(r.out, "; commit "), "%s", r.out);
  run_free(&r);
  int articles = check_articles(wiki, "talk.jsonl", "2026-01-02");
  fprintf(stderr, "  the built-in model wrote %d article(s)\n", articles);
  char head[41], *msg;
  int commits;
  head_of(wiki, head, &commits, &msg);
  CHECK_EQ_INT(commits, 1);
  CHECK_MSG(msg && !strncmp(msg, "memory: ingest talk.jsonl — ", strlen("memory: ingest talk.jsonl — ")), "%s", msg);
  CHECK_MSG(msg && strstr(msg, "\nHearth-Memory-Log: "), "%s", msg);
  free(msg);
  /* again: nothing new, no commit */
  r = run_hearth(args);
  CHECK_MSG(r.status == 0 && strstr(r.out, "nothing new"), "exit %d\n%s%s", r.status, r.out, r.err);
  run_free(&r);
  char head2[41];
  head_of(wiki, head2, &commits, &msg);
  CHECK_EQ_STR(head2, head);
  CHECK_EQ_INT(commits, 1);
  free(msg);
}

static void test_model_not_fetched(void) {
  char cache[600], home[600], wiki[600], log[600];
  snprintf(cache, sizeof cache, "%s/hf-cache", tmpdir);
  snprintf(home, sizeof home, "%s/hearth-home", tmpdir);
  snprintf(wiki, sizeof wiki, "%s/wiki-nomodel", tmpdir);
  snprintf(log, sizeof log, "%s/talk.jsonl", tmpdir);
  mkdir(cache, 0755);
  setenv("HF_HUB_CACHE", cache, 1);
  setenv("HEARTH_HOME", home, 1);
  setenv("HF_ENDPOINT", "http://127.0.0.1:9", 1); /* were it to fetch, it would fail at once */
  unsetenv("HF_HUB_OFFLINE");
  const char *args[] = {"memory", "ingest", log, "--wiki", wiki, "--model", "nosuch-org/nosuch-model", NULL};
  run_result r = run_hearth(args);
  CHECK_EQ_INT(r.status, 1);
  CHECK_MSG(strstr(r.err, "hearth get nosuch-org/nosuch-model") != NULL, "%s", r.err);
  CHECK_MSG(strstr(r.err, "fetching") == NULL, "%s", r.err);
  run_free(&r);
  DIR *d = opendir(cache);
  int entries = 0;
  struct dirent *e;
  while (d && (e = readdir(d))) entries += e->d_name[0] != '.';
  if (d) closedir(d);
  CHECK_EQ_INT(entries, 0);
  CHECK(!hfile_exists(wiki)); /* refused before any work */
  unsetenv("HF_ENDPOINT");
}

static void test_usage(void) {
  const char *none[] = {"memory", NULL};
  run_result r = run_hearth(none);
  CHECK_EQ_INT(r.status, 2);
  CHECK(strstr(r.err, "ingest") != NULL);
  run_free(&r);
  const char *help[] = {"memory", "ingest", "--help", NULL};
  r = run_hearth(help);
  CHECK_EQ_INT(r.status, 0);
  CHECK(strstr(r.out, "--stage-adapter") != NULL);
  run_free(&r);
  const char *bad_stage[] = {"memory", "ingest", "x.jsonl", "--wiki", "w", "--stage-adapter", "summarize=dir", NULL};
  r = run_hearth(bad_stage);
  CHECK_EQ_INT(r.status, 2);
  CHECK_MSG(strstr(r.err, "summarize") != NULL, "%s", r.err);
  run_free(&r);
  const char *no_prompts[] = {"memory", "ingest", "x.jsonl", "--wiki", "w", "--prompts", "/nonexistent", NULL};
  r = run_hearth(no_prompts);
  CHECK_EQ_INT(r.status, 2);
  run_free(&r);
  const char *bad_date[] = {"memory", "ingest", "x.jsonl", "--wiki", "w", "--date", "2026-13-01", NULL};
  r = run_hearth(bad_date);
  CHECK_EQ_INT(r.status, 2);
  run_free(&r);
  const char *no_wiki[] = {"memory", "ingest", "x.jsonl", NULL};
  r = run_hearth(no_wiki);
  CHECK_EQ_INT(r.status, 2);
  run_free(&r);
  const char *no_log[] = {"memory", "ingest", "/nonexistent/x.jsonl", "--wiki", "w", NULL};
  r = run_hearth(no_log);
  CHECK_EQ_INT(r.status, 1);
  CHECK_MSG(strstr(r.err, "/nonexistent/x.jsonl") != NULL, "%s", r.err);
  run_free(&r);
}

int main(void) {
  if (!mkdtemp(tmpdir)) return 1;
  RUN(test_ingest_builtin_model);
  RUN(test_model_not_fetched);
  RUN(test_usage);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (!test_failures && system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
  fprintf(stderr, "%d checks, %d failures\n", test_checks, test_failures);
  return test_failures ? 1 : 0;
}
