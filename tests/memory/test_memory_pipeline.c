/* Tests of the memory pipeline (memory.h) through a scripted engine: each
 * stage's answers are given by the test, keyed on the stage and a piece of
 * the prompt (the test's own templates, through the --prompts override), so
 * what the pipeline writes is asserted exactly — articles created with their
 * front matter, an existing article patched, duplicates reconciled (merged,
 * links to the one removed pointed at the one kept), links added, the index —
 * and so are the batches (one engine call per stage), idempotence (a second
 * run on the same logs calls nothing and changes no file or commit),
 * resuming after a run stopped after a stage or killed in the middle of one
 * (only the later stages run, from the one it was in),
 * unusable answers (each stage falls back), and the git history read back
 * with libgit2 (one commit per run, its summary and trailers). */
#include <dirent.h>
#include <git2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "memory/memory.h"
#include "memory/state.h"
#include "test.h"

static char tmp[] = "/tmp/hearth_memory_XXXXXX";
static char prompts[600];

/* ---- the scripted engine ---- */

typedef struct rule {
  int stage;
  const char *needle; /* the prompt holds it */
  const char *answer;
} rule;

typedef struct fake {
  const rule *rules;
  size_t n_rules;
  int calls[MEM_STAGES];   /* calls per stage */
  int batches[MEM_STAGES]; /* engine runs per stage */
  int mixed;               /* runs holding calls of more than one stage */
  int die_at;              /* > 0: the process ends (as if killed) when stage die_at - 1 asks */
} fake;

static int fake_run(void *ctx, mem_call *calls, size_t n, herr *err) {
  (void)err;
  fake *f = ctx;
  if (n && f->die_at == calls[0].stage + 1) _exit(3);
  for (size_t i = 0; i < n; i++) {
    mem_call *c = &calls[i];
    if (c->stage != calls[0].stage) f->mixed++;
    CHECK(c->schema != NULL && c->max_tokens > 0 && c->answer == NULL);
    f->calls[c->stage]++;
    for (size_t k = 0; k < f->n_rules; k++)
      if (f->rules[k].stage == c->stage && strstr(c->prompt, f->rules[k].needle)) {
        c->answer = strdup(f->rules[k].answer);
        break;
      }
  }
  if (n) f->batches[calls[0].stage]++;
  return 0;
}

static mem_engine engine_of(fake *f) { return (mem_engine){.run = fake_run, .ctx = f, .id = "scripted"}; }

/* ---- files ---- */

static char *path_in(const char *dir, const char *name) {
  char *p = malloc(strlen(dir) + strlen(name) + 2);
  sprintf(p, "%s/%s", dir, name);
  return p;
}

static void put(const char *dir, const char *name, const char *text) {
  mkdir(dir, 0755);
  char *p = path_in(dir, name);
  FILE *f = fopen(p, "w");
  CHECK(f != NULL);
  if (f) fputs(text, f), fclose(f);
  free(p);
}

static char *get(const char *dir, const char *name) {
  char *p = path_in(dir, name), *text = NULL;
  size_t len;
  if (hfile_read(p, &text, &len, NULL)) text = NULL;
  free(p);
  return text;
}

static void check_file(const char *dir, const char *name, const char *want) {
  char *got = get(dir, name);
  CHECK_MSG(got != NULL, "%s/%s missing", dir, name);
  if (got) CHECK_EQ_STR(got, want);
  free(got);
}

static bool exists(const char *dir, const char *name) {
  char *p = path_in(dir, name);
  bool e = hfile_exists(p);
  free(p);
  return e;
}

/* Every file of dir (not .git, not the state folder) as "name\ncontent\n" in name order, for comparing. */
static char *snapshot(const char *dir) {
  struct dirent **list = NULL;
  int n = scandir(dir, &list, NULL, alphasort);
  hbuf b = {0};
  for (int i = 0; i < n; i++) {
    const char *name = list[i]->d_name;
    if (name[0] != '.' || !strcmp(name, ".gitignore")) {
      char *t = get(dir, name);
      hbuf_printf(&b, "%s\n%s\n", name, t ? t : "");
      free(t);
    }
    free(list[i]);
  }
  free(list);
  return b.data ? hbuf_take(&b) : strdup("");
}

/* ---- git, read back ---- */

typedef struct history {
  int commits;
  char head[41];
  char *message; /* HEAD's, owned */
} history;

static history read_history(const char *dir) {
  history h = {0};
  git_libgit2_init();
  git_repository *repo = NULL;
  git_revwalk *walk = NULL;
  git_oid oid;
  if (!git_repository_open(&repo, dir) && !git_reference_name_to_id(&oid, repo, "HEAD")) {
    git_oid_tostr(h.head, sizeof h.head, &oid);
    git_commit *c = NULL;
    if (!git_commit_lookup(&c, repo, &oid)) h.message = strdup(git_commit_message(c));
    git_commit_free(c);
    git_revwalk_new(&walk, repo);
    git_revwalk_push_head(walk);
    while (!git_revwalk_next(&oid, walk)) h.commits++;
  }
  git_revwalk_free(walk);
  git_repository_free(repo);
  git_libgit2_shutdown();
  return h;
}

static int count_commits(const char *dir) {
  history h = read_history(dir);
  free(h.message);
  return h.commits;
}

/* Whether HEAD's tree holds path. */
static bool committed_file(const char *dir, const char *path) {
  git_libgit2_init();
  git_repository *repo = NULL;
  git_object *obj = NULL;
  char spec[300];
  snprintf(spec, sizeof spec, "HEAD:%s", path);
  bool there = !git_repository_open(&repo, dir) && !git_revparse_single(&obj, repo, spec);
  git_object_free(obj);
  git_repository_free(repo);
  git_libgit2_shutdown();
  return there;
}

/* A commit of a README.md of the test's own in dir's repository (made when missing). */
static void commit_readme(const char *dir, const char *text) {
  put(dir, "README.md", text);
  git_libgit2_init();
  git_repository *repo = NULL;
  git_index *idx = NULL;
  git_signature *sig = NULL;
  git_tree *tree = NULL;
  git_commit *parent = NULL;
  git_oid tid, cid, pid;
  bool ok = (!git_repository_open(&repo, dir) || !git_repository_init(&repo, dir, 0)) && !git_repository_index(&idx, repo) &&
            !git_index_add_bypath(idx, "README.md") && !git_index_write(idx) && !git_index_write_tree(&tid, idx) &&
            !git_tree_lookup(&tree, repo, &tid) && !git_signature_now(&sig, "t", "t@t");
  if (ok && !git_reference_name_to_id(&pid, repo, "HEAD")) ok = !git_commit_lookup(&parent, repo, &pid);
  const git_commit *parents[] = {parent};
  ok = ok && !git_commit_create(&cid, repo, "HEAD", sig, sig, NULL, "notes\n", tree, parent ? 1 : 0, parents);
  CHECK(ok);
  git_commit_free(parent);
  git_tree_free(tree);
  git_signature_free(sig);
  git_index_free(idx);
  git_repository_free(repo);
  git_libgit2_shutdown();
}

static bool starts_with(const char *s, const char *prefix) { return s && !strncmp(s, prefix, strlen(prefix)); }

/* ---- the conversations and answers ---- */

static const char *talk1 =
    "{\"role\":\"user\",\"content\":\"My sister Alice lives in Lyon and works as a nurse.\"}\n"
    "{\"role\":\"assistant\",\"content\":\"Noted: Alice, your sister, is a nurse in Lyon.\"}\n"
    "{\"role\":\"user\",\"content\":\"I am building a garden shed this spring, in cedar.\"}\n"
    "{\"role\":\"assistant\",\"content\":\"A cedar shed sounds great.\"}\n";

static const char *talk2 =
    "User: Alice Smith got a new job at the Lyon hospital.\n"
    "Assistant: Congratulations to Alice Smith!\n"
    "User: The shed will get a green roof.\n"
    "Assistant: Green roofs keep sheds cool.\n";

static const rule rules[] = {
    /* log 1 */
    {MEM_SEGMENT, "SEGMENT chat1.jsonl (4)",
     "{\"segments\":[{\"title\":\"Family\",\"first\":1,\"last\":2},{\"title\":\"Shed\",\"first\":3,\"last\":4}]}"},
    {MEM_EXTRACT, "EXTRACT chat1.jsonl#1 Family\nuser: My sister Alice",
     "{\"entities\":[{\"name\":\"Alice\",\"kind\":\"person\",\"facts\":[\"Alice is the user's sister.\","
     "\"Alice lives in Lyon and works as a nurse.\"]}]}"},
    {MEM_EXTRACT, "EXTRACT chat1.jsonl#2 Shed",
     "{\"entities\":[{\"name\":\"Garden shed\",\"kind\":\"project\",\"facts\":[\"A cedar shed is built this spring.\"]}]}"},
    {MEM_ROUTE, "ROUTE Alice (person)", "{\"action\":\"create\",\"slug\":\"alice\",\"title\":\"Alice\"}"},
    {MEM_ROUTE, "ROUTE Garden shed (project)\n- A cedar", "{\"action\":\"create\",\"slug\":\"garden-shed\",\"title\":\"Garden shed\"}"},
    {MEM_WRITE, "WRITE Alice\n", "{\"body\":\"# Alice\\n\\nAlice is the user's sister, a nurse in Lyon.\"}"},
    {MEM_WRITE, "WRITE Garden shed\n", "{\"body\":\"# Garden shed\\n\\nA cedar shed, built this spring.\"}"},
    {MEM_LINK, "LINK garden-shed\n# Garden shed\n\nA cedar shed, built this spring.\nARTICLES",
     "{\"links\":[\"alice\",\"nonexistent\",\"garden-shed\"]}"},
    {MEM_LINK, "LINK alice\n# Alice\n\nAlice is the user's sister, a nurse in Lyon.\nARTICLES", "{\"links\":[]}"},
    /* log 2 */
    {MEM_SEGMENT, "SEGMENT chat2.md (4)",
     "{\"segments\":[{\"title\":\"Alice's job\",\"first\":1,\"last\":2},{\"title\":\"Roof\",\"first\":3,\"last\":4}]}"},
    {MEM_EXTRACT, "EXTRACT chat2.md#1",
     "{\"entities\":[{\"name\":\"Alice Smith\",\"kind\":\"person\",\"facts\":[\"Alice Smith works at the Lyon hospital.\"]}]}"},
    {MEM_EXTRACT, "EXTRACT chat2.md#2",
     "{\"entities\":[{\"name\":\"Garden shed\",\"kind\":\"project\",\"facts\":[\"The shed gets a green roof.\"]}]}"},
    {MEM_ROUTE, "ROUTE Alice Smith (person)", "{\"action\":\"create\",\"slug\":\"alice-smith\",\"title\":\"Alice Smith\"}"},
    {MEM_ROUTE, "ROUTE Garden shed (project)\n- The shed gets", "{\"action\":\"patch\",\"slug\":\"garden-shed\",\"title\":\"Garden shed\"}"},
    {MEM_WRITE, "WRITE Alice Smith\n", "{\"body\":\"# Alice Smith\\n\\nAlice Smith works at the Lyon hospital.\"}"},
    {MEM_WRITE, "PATCH Garden shed\n# Garden shed\n\nA cedar shed, built this spring.\n\n## See also\n\n- [[alice]]\nNEW\n- The shed gets a green roof.",
     "{\"body\":\"# Garden shed\\n\\nA cedar shed with a green roof; [[alice-smith]] helps.\\n\\n## See also\\n\\n- [[alice]]\"}"},
    {MEM_RECONCILE, "RECONCILE alice alice-smith",
     "{\"same\":true,\"title\":\"Alice\",\"body\":\"# Alice\\n\\nAlice is the user's sister, a nurse at the Lyon hospital.\"}"},
    {MEM_LINK, "LINK alice\n# Alice\n\nAlice is the user's sister, a nurse at the Lyon hospital.", "{\"links\":[\"[[garden-shed]]\"]}"},
    {MEM_LINK, "LINK garden-shed\n# Garden shed\n\nA cedar shed with a green roof", "{\"links\":[\"alice\"]}"},
};

static const char *alice_1 = "---\ntitle: Alice\nsources: [chat1.jsonl#1]\ncreated: 2026-01-02\nupdated: 2026-01-02\n---\n\n"
                             "# Alice\n\nAlice is the user's sister, a nurse in Lyon.\n";
static const char *shed_1 = "---\ntitle: Garden shed\nsources: [chat1.jsonl#2]\ncreated: 2026-01-02\nupdated: 2026-01-02\n---\n\n"
                            "# Garden shed\n\nA cedar shed, built this spring.\n\n## See also\n\n- [[alice]]\n";
static const char *index_1 = "# Index\n\n- [[alice]] — Alice\n- [[garden-shed]] — Garden shed\n";

static void write_prompts(void) {
  snprintf(prompts, sizeof prompts, "%s/prompts", tmp);
  put(prompts, "segment.txt", "SEGMENT {{log}} ({{count}})\n{{turns}}");
  put(prompts, "extract.txt", "EXTRACT {{source}} {{title}}\n{{segment}}");
  put(prompts, "route.txt", "ROUTE {{name}} ({{kind}})\n{{facts}}ARTICLES\n{{articles}}");
  put(prompts, "write.txt", "WRITE {{title}}\n{{facts}}");
  put(prompts, "patch.txt", "PATCH {{title}}\n{{body}}\nNEW\n{{facts}}");
  put(prompts, "reconcile.txt", "RECONCILE {{a_slug}} {{b_slug}}\n{{a_body}}\n{{b_body}}");
  put(prompts, "link.txt", "LINK {{slug}}\n{{body}}\nARTICLES\n{{articles}}");
}

static mem_opts opts_for(const char *wiki, const char *const *logs, int n, const char *today) {
  return (mem_opts){.wiki_dir = wiki, .logs = logs, .n_logs = n, .prompts_dir = "/nonexistent",
                    .prompts_override = prompts, .today = today};
}

static int ingest(const char *wiki, const char *log, const char *today, int stop_after, fake *f, mem_report *rep) {
  const char *logs[] = {log};
  mem_opts o = opts_for(wiki, logs, 1, today);
  o.stop_after = stop_after;
  mem_engine e = engine_of(f);
  herr err = {0};
  int rc = mem_ingest(&o, &e, rep, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  return rc;
}

static void check_calls(const fake *f, const int want[MEM_STAGES]) {
  for (int s = 0; s < MEM_STAGES; s++) {
    CHECK_MSG(f->calls[s] == want[s], "%s: %d calls, want %d", mem_stage_name(s), f->calls[s], want[s]);
    CHECK_MSG(f->batches[s] == (want[s] > 0), "%s: %d batches", mem_stage_name(s), f->batches[s]);
  }
  CHECK_EQ_INT(f->mixed, 0);
}

/* ---- the tests ---- */

static char wiki[700], talk1_path[700], talk2_path[700];

static void test_create_and_link(void) {
  fake f = {.rules = rules, .n_rules = sizeof rules / sizeof rules[0]};
  mem_report rep;
  if (ingest(wiki, talk1_path, "2026-01-02", 0, &f, &rep)) return;
  check_calls(&f, (int[MEM_STAGES]){1, 2, 2, 2, 0, 2});
  CHECK_EQ_INT(rep.logs_new, 1);
  CHECK_EQ_INT(rep.segments, 2);
  CHECK_EQ_INT(rep.entities, 2);
  CHECK_EQ_INT(rep.created, 2);
  CHECK_EQ_INT(rep.patched, 0);
  CHECK_EQ_INT(rep.linked, 1);
  CHECK_EQ_INT(rep.fallbacks, 0);
  CHECK(rep.committed && !rep.resumed);
  check_file(wiki, "alice.md", alice_1);
  check_file(wiki, "garden-shed.md", shed_1);
  check_file(wiki, "index.md", index_1);
  check_file(wiki, ".gitignore", ".hearth-memory/\n");
  history h = read_history(wiki);
  CHECK_EQ_INT(h.commits, 1);
  CHECK_EQ_STR(h.head, rep.commit);
  char *text = get(wiki, "../chat1.jsonl"), hash[17];
  mem_hash_hex(text, strlen(text), hash);
  free(text);
  char want[200];
  snprintf(want, sizeof want, "\n\nHearth-Memory-Log: %s chat1.jsonl\nHearth-Memory-Segments: ", hash);
  CHECK_MSG(starts_with(h.message, "memory: ingest chat1.jsonl — 2 created, 0 patched, 0 merged, 1 linked\n\n"
                                    "created: alice, garden-shed\nlinked: garden-shed\n\nHearth-Memory-Log: "),
            "%s", h.message);
  CHECK_MSG(h.message && strstr(h.message, want), "%s", h.message);
  CHECK(committed_file(wiki, "alice.md") && committed_file(wiki, "garden-shed.md") && committed_file(wiki, ".gitignore"));
  CHECK(!exists(wiki, ".hearth-memory/runs"));
  free(h.message);
}

static void test_second_run_changes_nothing(void) {
  char *before = snapshot(wiki);
  history h0 = read_history(wiki);
  fake f = {.rules = rules, .n_rules = sizeof rules / sizeof rules[0]};
  mem_report rep;
  if (ingest(wiki, talk1_path, "2026-01-03", 0, &f, &rep)) return;
  check_calls(&f, (int[MEM_STAGES]){0});
  CHECK_EQ_INT(rep.logs_new, 0);
  CHECK_EQ_INT(rep.logs_known, 1);
  CHECK(!rep.committed);
  history h1 = read_history(wiki);
  CHECK_EQ_STR(h1.head, h0.head);
  CHECK_EQ_INT(h1.commits, 1);
  char *after = snapshot(wiki);
  CHECK_EQ_STR(after, before);
  free(before);
  free(after);
  free(h0.message);
  free(h1.message);
}

static void test_patch_reconcile_link(void) {
  fake f = {.rules = rules, .n_rules = sizeof rules / sizeof rules[0]};
  mem_report rep;
  if (ingest(wiki, talk2_path, "2026-01-05", 0, &f, &rep)) return;
  check_calls(&f, (int[MEM_STAGES]){1, 2, 2, 2, 1, 2});
  CHECK_EQ_INT(rep.created, 1);
  CHECK_EQ_INT(rep.patched, 1);
  CHECK_EQ_INT(rep.merged, 1);
  CHECK_EQ_INT(rep.linked, 1);
  CHECK_EQ_INT(rep.fallbacks, 0);
  /* alice-smith merged into alice: the older slug kept, sources joined, the first date kept */
  check_file(wiki, "alice.md",
             "---\ntitle: Alice\nsources: [chat1.jsonl#1, chat2.md#1]\ncreated: 2026-01-02\nupdated: 2026-01-05\n---\n\n"
             "# Alice\n\nAlice is the user's sister, a nurse at the Lyon hospital.\n\n## See also\n\n- [[garden-shed]]\n");
  CHECK(!exists(wiki, "alice-smith.md"));
  /* patched, and its link to the merged-away article now points at the one kept */
  check_file(wiki, "garden-shed.md",
             "---\ntitle: Garden shed\nsources: [chat1.jsonl#2, chat2.md#2]\ncreated: 2026-01-02\nupdated: 2026-01-05\n---\n\n"
             "# Garden shed\n\nA cedar shed with a green roof; [[alice]] helps.\n\n## See also\n\n- [[alice]]\n");
  check_file(wiki, "index.md", index_1);
  history h = read_history(wiki);
  CHECK_EQ_INT(h.commits, 2);
  CHECK_MSG(starts_with(h.message, "memory: ingest chat2.md — 1 created, 1 patched, 1 merged, 1 linked\n\n"
                                    "created: alice-smith\npatched: garden-shed\nmerged: alice-smith into alice\n"
                                    "linked: alice\n\nHearth-Memory-Log: "),
            "%s", h.message);
  CHECK(committed_file(wiki, "alice.md") && !committed_file(wiki, "alice-smith.md"));
  free(h.message);
  /* both logs again: nothing to do */
  const char *logs[] = {talk1_path, talk2_path};
  mem_opts o = opts_for(wiki, logs, 2, "2026-01-09");
  fake f2 = {.rules = rules, .n_rules = sizeof rules / sizeof rules[0]};
  mem_engine e = engine_of(&f2);
  herr err = {0};
  CHECK(mem_ingest(&o, &e, &rep, &err) == 0);
  CHECK_EQ_INT(rep.logs_known, 2);
  check_calls(&f2, (int[MEM_STAGES]){0});
  CHECK_EQ_INT(count_commits(wiki), 2);
}

static void test_resume_after_stop(void) {
  char other[800];
  snprintf(other, sizeof other, "%s/wiki-resume", tmp);
  fake f = {.rules = rules, .n_rules = sizeof rules / sizeof rules[0]};
  mem_report rep;
  /* a run that ends after route: no article, no commit, the results kept */
  if (ingest(other, talk1_path, "2026-01-02", MEM_ROUTE + 1, &f, &rep)) return;
  check_calls(&f, (int[MEM_STAGES]){1, 2, 2, 0, 0, 0});
  CHECK(!rep.committed && rep.stages_run == 3);
  CHECK(!exists(other, "alice.md") && !exists(other, "index.md"));
  CHECK_EQ_INT(count_commits(other), 0);
  char runs[900];
  snprintf(runs, sizeof runs, "%s/.hearth-memory/runs", other);
  struct dirent **list = NULL;
  int n = scandir(runs, &list, NULL, alphasort), kept = 0;
  for (int i = 0; i < n; i++) {
    if (list[i]->d_name[0] != '.') {
      char *dir = path_in(runs, list[i]->d_name);
      kept = exists(dir, "1-segment.json") + exists(dir, "2-extract.json") + exists(dir, "3-route.json") +
             exists(dir, "4-write.json");
      free(dir);
    }
    free(list[i]);
  }
  free(list);
  CHECK_EQ_INT(kept, 3);
  /* the next run does only write, reconcile and link, and ends where one whole run would */
  fake g = {.rules = rules, .n_rules = sizeof rules / sizeof rules[0]};
  if (ingest(other, talk1_path, "2026-01-02", 0, &g, &rep)) return;
  check_calls(&g, (int[MEM_STAGES]){0, 0, 0, 2, 0, 2});
  CHECK(rep.committed && rep.resumed && rep.stages_run == 3);
  CHECK_EQ_INT(rep.created, 2);
  CHECK_EQ_INT(rep.segments, 2); /* counted from the kept results */
  check_file(other, "alice.md", alice_1);
  check_file(other, "garden-shed.md", shed_1);
  check_file(other, "index.md", index_1);
  history h = read_history(other);
  CHECK_EQ_INT(h.commits, 1);
  CHECK(starts_with(h.message, "memory: ingest chat1.jsonl — 2 created"));
  free(h.message);
  CHECK(!exists(other, ".hearth-memory/runs"));
}

static void test_stale_state_dropped(void) {
  /* results kept on one commit are not used once the wiki has moved on */
  char other[800];
  snprintf(other, sizeof other, "%s/wiki-stale", tmp);
  fake f = {.rules = rules, .n_rules = sizeof rules / sizeof rules[0]};
  mem_report rep;
  if (ingest(other, talk2_path, "2026-01-02", MEM_SEGMENT + 1, &f, &rep)) return;
  commit_readme(other, "Notes.\n");
  fake g = {.rules = rules, .n_rules = sizeof rules / sizeof rules[0]};
  if (ingest(other, talk2_path, "2026-01-05", 0, &g, &rep)) return;
  CHECK(!rep.resumed && rep.stages_run == MEM_STAGES);
  CHECK_EQ_INT(g.calls[MEM_SEGMENT], 1);
  CHECK_EQ_INT(count_commits(other), 2);
}

static void test_unusable_answers(void) {
  /* only segment and extract answer: route takes the entity's name, write lists the facts,
   * link adds nothing */
  static const rule few[] = {
      {MEM_SEGMENT, "SEGMENT", "{\"segments\":[{\"title\":\"Family\",\"first\":1,\"last\":2},{\"title\":\"Shed\",\"first\":3,\"last\":4}]}"},
      {MEM_EXTRACT, "EXTRACT chat1.jsonl#1",
       "{\"entities\":[{\"name\":\"Alice\",\"kind\":\"person\",\"facts\":[\"Alice is the user's sister.\","
       "\"Alice lives in Lyon and works as a nurse.\"]}]}"},
      {MEM_EXTRACT, "EXTRACT chat1.jsonl#2", "not json at all"},
  };
  char other[800];
  snprintf(other, sizeof other, "%s/wiki-fallback", tmp);
  fake f = {.rules = few, .n_rules = sizeof few / sizeof few[0]};
  mem_report rep;
  if (ingest(other, talk1_path, "2026-01-02", 0, &f, &rep)) return;
  check_calls(&f, (int[MEM_STAGES]){1, 2, 1, 1, 0, 0});
  CHECK_EQ_INT(rep.fallbacks, 3); /* extract #2, route, write */
  check_file(other, "alice.md",
             "---\ntitle: Alice\nsources: [chat1.jsonl#1]\ncreated: 2026-01-02\nupdated: 2026-01-02\n---\n\n"
             "# Alice\n\n- Alice is the user's sister.\n- Alice lives in Lyon and works as a nurse.\n");
  check_file(other, "index.md", "# Index\n\n- [[alice]] — Alice\n");
  CHECK_EQ_INT(count_commits(other), 1);
  /* no answer at all: one segment per log, no entities, and the log is still recorded */
  char empty[800];
  snprintf(empty, sizeof empty, "%s/wiki-silent", tmp);
  fake s = {.rules = NULL, .n_rules = 0};
  if (ingest(empty, talk2_path, "2026-01-02", 0, &s, &rep)) return;
  check_calls(&s, (int[MEM_STAGES]){1, 1, 0, 0, 0, 0});
  CHECK_EQ_INT(rep.segments, 1);
  CHECK_EQ_INT(rep.fallbacks, 2);
  check_file(empty, "index.md", "# Index\n\n");
  CHECK_EQ_INT(count_commits(empty), 1);
  fake s2 = {.rules = NULL, .n_rules = 0};
  if (ingest(empty, talk2_path, "2026-01-02", 0, &s2, &rep)) return;
  CHECK_EQ_INT(rep.logs_known, 1);
  CHECK_EQ_INT(count_commits(empty), 1);
}

static void test_existing_repository(void) {
  /* a wiki that is already a git repository with a commit of its own keeps it as the parent */
  char other[800];
  snprintf(other, sizeof other, "%s/wiki-existing", tmp);
  commit_readme(other, "Notes, not an article.\n");
  fake f = {.rules = rules, .n_rules = sizeof rules / sizeof rules[0]};
  mem_report rep;
  if (ingest(other, talk1_path, "2026-01-02", 0, &f, &rep)) return;
  CHECK_EQ_INT(count_commits(other), 2);
  check_file(other, "README.md", "Notes, not an article.\n");
  check_file(other, "index.md", index_1);
  CHECK(committed_file(other, "README.md"));
}

static void test_resume_after_kill(void) {
  /* a run that dies in the middle of write (a child process, ended there) leaves segment,
   * extract and route kept; the next run does write, reconcile and link */
  char other[800];
  snprintf(other, sizeof other, "%s/wiki-killed", tmp);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    fake f = {.rules = rules, .n_rules = sizeof rules / sizeof rules[0], .die_at = MEM_WRITE + 1};
    mem_report rep;
    ingest(other, talk1_path, "2026-01-02", 0, &f, &rep);
    _exit(0); /* not reached */
  }
  int st = 0;
  CHECK(pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 3);
  CHECK_EQ_INT(count_commits(other), 0);
  fake g = {.rules = rules, .n_rules = sizeof rules / sizeof rules[0]};
  mem_report rep;
  if (ingest(other, talk1_path, "2026-01-02", 0, &g, &rep)) return;
  check_calls(&g, (int[MEM_STAGES]){0, 0, 0, 2, 0, 2});
  CHECK(rep.resumed && rep.committed);
  check_file(other, "alice.md", alice_1);
  check_file(other, "garden-shed.md", shed_1);
  CHECK_EQ_INT(count_commits(other), 1);
}

static void test_one_run_at_a_time(void) {
  /* a run holding the wiki's lock keeps a second one out, with a message */
  int fd = -1;
  herr err = {0};
  CHECK(mem_state_lock(wiki, &fd, &err) == 0);
  const char *logs[] = {talk1_path};
  mem_opts o = opts_for(wiki, logs, 1, "2026-01-09");
  fake f = {.rules = rules, .n_rules = sizeof rules / sizeof rules[0]};
  mem_engine e = engine_of(&f);
  mem_report rep;
  CHECK(mem_ingest(&o, &e, &rep, &err) == HEARTH_EINVAL);
  CHECK_MSG(strstr(err.msg, "another hearth memory run") != NULL, "%s", err.msg);
  mem_state_unlock(fd);
  herr_clear(&err);
  CHECK(mem_ingest(&o, &e, &rep, &err) == 0 && rep.logs_known == 1);
}

int main(void) {
  if (!mkdtemp(tmp)) return 1;
  write_prompts();
  put(tmp, "chat1.jsonl", talk1);
  put(tmp, "chat2.md", talk2);
  snprintf(wiki, sizeof wiki, "%s/wiki", tmp);
  snprintf(talk1_path, sizeof talk1_path, "%s/chat1.jsonl", tmp);
  snprintf(talk2_path, sizeof talk2_path, "%s/chat2.md", tmp);
  RUN(test_create_and_link);
  RUN(test_second_run_changes_nothing);
  RUN(test_patch_reconcile_link);
  RUN(test_resume_after_stop);
  RUN(test_resume_after_kill);
  RUN(test_one_run_at_a_time);
  RUN(test_stale_state_dropped);
  RUN(test_unusable_answers);
  RUN(test_existing_repository);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
  if (!test_failures && system(cmd)) fprintf(stderr, "could not remove %s\n", tmp);
  fprintf(stderr, "%d checks, %d failures\n", test_checks, test_failures);
  return test_failures ? 1 : 0;
}
