/* memory.c — `hearth memory`: the personal-memory wiki. Its subverbs are in
 * the table below; `ingest` runs the memory pipeline (src/memory) on a
 * hearth model: the model is checked before any work and never fetched (a
 * Hub id not in the cache is an error naming the `hearth get` command), the
 * shipped prompt templates found beside the binary as the built-in model is.
 * `search` is memory_search.c's. Uses hearth.h and memory/. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "cli/cli.h"
#include "hearth.h"
#include "memory/engine_hearth.h"
#include "memory/memory.h"

static int memory_ingest(int argc, char **argv);

/* The subverbs. */
static const struct {
  const char *name, *summary;
  int (*run)(int argc, char **argv);
} subverbs[] = {
    {"ingest", "read conversation logs into the wiki (segment, extract, route, write, reconcile, link)", memory_ingest},
    {"search", "rank the wiki's articles by the model's embeddings against a query", cli_memory_search},
};
static const int nsub = (int)(sizeof subverbs / sizeof subverbs[0]);

static void usage(FILE *f) {
  fprintf(f, "usage: hearth memory SUBVERB [options]   (hearth memory SUBVERB --help)\n\n"
             "A memory wiki is a folder of Markdown articles (DIR/<slug>.md with front matter:\n"
             "title, sources, created, updated) linked by [[slug]], listed in DIR/index.md.\n\n");
  for (int i = 0; i < nsub; i++) fprintf(f, "  %-8s %s\n", subverbs[i].name, subverbs[i].summary);
}

int cli_memory(int argc, char **argv) {
  if (argc < 2 || cli_is_help(argv[1])) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (int i = 0; i < nsub; i++)
    if (!strcmp(argv[1], subverbs[i].name)) return subverbs[i].run(argc - 1, argv + 1);
  fprintf(stderr, "hearth memory: unknown subverb '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}

/* ---- ingest ---- */

static void ingest_usage(FILE *f) {
  fprintf(f,
          "usage: hearth memory ingest LOG... --wiki DIR [options]\n\n"
          "Reads conversation logs (OpenAI chat JSONL, Anthropic / OpenAI JSON messages, Markdown or text\n"
          "transcripts) into DIR, a git repository of Markdown articles (made when missing): one commit per run.\n"
          "Logs ingested before are skipped; a run cut short goes on from its last finished stage.\n\n"
          "  --wiki DIR              the wiki's folder\n"
          "  --model M               a model folder, .gguf file, registry name or cached Hub id (default: the\n"
          "                          built-in model); never fetched: `hearth get ORG/NAME` first\n"
          "  --prompts DIR           prompt templates (<stage>.txt: segment, extract, route, write, patch,\n"
          "                          reconcile, link) that replace the shipped ones\n"
          "  --stage-adapter S=DIR   run stage S (segment or chunk, extract, route, write, reconcile, link) under\n"
          "                          this PEFT LoRA adapter (repeatable)\n"
          "  --stop-after STAGE      stop once STAGE is done, keeping the results (a later run goes on)\n"
          "  --date YYYY-MM-DD       the date articles are created / updated on (default: today)\n"
          "  --window N              characters of a log the segment stage reads per call (default 6000)\n");
}

/* The shipped prompt templates: installed beside the built-in model, or in the source tree. */
static const char *shipped_prompts(void) {
  static char found[PATH_MAX];
  static const char *rel[] = {"../share/hearth/memory/prompts", "../src/memory/prompts", "../../src/memory/prompts"};
  return cli_beside_binary("HEARTH_MEMORY_PROMPTS", rel, sizeof rel / sizeof rel[0], "segment.txt", found);
}

/* The model's path, checked before any work: never fetched. */
static int model_precheck(const char *value, char **path) {
  *path = NULL;
  if (!value) {
    const char *d = cli_default_model();
    if (!d) return cli_fail("memory ingest: no --model given and no built-in model found (models/default)");
    *path = strdup(d);
    return *path ? 0 : cli_fail("out of memory");
  }
  char fetch[700];
  if (cli_model_find(value, path, fetch, sizeof fetch))
    return cli_fail("memory ingest: the model %s is not on this machine (not a folder, a file, a registered name or "
                    "in the Hugging Face cache); fetch it first with: %s",
                    value, fetch);
  if (!*path && !(*path = strdup(value))) return cli_fail("out of memory");
  if (!hfile_exists(*path)) {
    int rc = cli_fail("memory ingest: no model at %s (a folder, a .gguf file, a registered name or a Hub id)", value);
    free(*path);
    *path = NULL;
    return rc;
  }
  return 0;
}

typedef struct ingest_args {
  mem_opts o;
  const char *model;
  const char *adapters[MEM_STAGES];
  const char **logs; /* owned array */
} ingest_args;

/* A stage option's value: the stage, or -1 after a usage error. */
static int stage_value(const char *opt, const char *name) {
  int s = mem_stage_parse(name);
  if (s < 0) cli_usage_error("memory ingest", "%s: no stage '%s' (segment or chunk, extract, route, write, reconcile, link)", opt, name);
  return s;
}

/* One option at argv[*i]: 1 taken, 0 not an option of ingest, -1 usage error printed. */
static int ingest_opt(ingest_args *a, int argc, char **argv, int *i) {
  const char *v = NULL;
  int r;
  long long n;
  if ((r = cli_opt(argc, argv, i, "--wiki", &v))) {
    if (r > 0) a->o.wiki_dir = v;
  } else if ((r = cli_opt(argc, argv, i, "--model", &v))) {
    if (r > 0) a->model = v;
  } else if ((r = cli_opt(argc, argv, i, "--prompts", &v))) {
    if (r > 0) a->o.prompts_override = v;
  } else if ((r = cli_opt(argc, argv, i, "--date", &v))) {
    int y, m, d, end = 0;
    if (r > 0 && (strlen(v) != 10 || sscanf(v, "%4d-%2d-%2d%n", &y, &m, &d, &end) != 3 || end != 10 || m < 1 || m > 12 ||
                  d < 1 || d > 31))
      return cli_usage_error("memory ingest", "--date takes YYYY-MM-DD, not '%s'", v), -1;
    if (r > 0) a->o.today = v;
  } else if ((r = cli_opt_int("memory ingest", argc, argv, i, "--window", 200, 1 << 24, &n))) {
    if (r > 0) a->o.window_chars = (long)n;
  } else if ((r = cli_opt(argc, argv, i, "--stop-after", &v))) {
    int s = r > 0 ? stage_value("--stop-after", v) : -1;
    if (s < 0) return -1;
    a->o.stop_after = s + 1;
  } else if ((r = cli_opt(argc, argv, i, "--stage-adapter", &v))) {
    if (r < 0) return -1;
    const char *eq = strchr(v, '=');
    if (!eq || !eq[1]) return cli_usage_error("memory ingest", "--stage-adapter takes STAGE=DIR, not '%s'", v), -1;
    char name[32];
    snprintf(name, sizeof name, "%.*s", (int)(eq - v), v);
    int s = stage_value("--stage-adapter", name);
    if (s < 0) return -1;
    a->adapters[s] = eq + 1;
  }
  return r;
}

static void print_report(const mem_report *rep, const mem_opts *o, const mem_hearth *h) {
  if (!rep->logs_new) {
    printf("memory: nothing new: %d log%s ingested before\n", rep->logs_known, rep->logs_known == 1 ? "" : "s");
    return;
  }
  printf("memory: %d new log%s (%d known), %d segments, %d entities, %d calls (%d batches, %d one at a time)%s\n",
         rep->logs_new, rep->logs_new == 1 ? "" : "s", rep->logs_known, rep->segments, rep->entities, rep->calls,
         h->batches, h->singles, rep->resumed ? ", resumed" : "");
  if (rep->fallbacks) printf("memory: %d answers were unusable; their stages went on without them\n", rep->fallbacks);
  if (!rep->committed) {
    printf("memory: stopped after %s; run again to go on\n", mem_stage_name(o->stop_after - 1));
    return;
  }
  printf("memory: %d created, %d patched, %d merged, %d linked; commit %.12s\n", rep->created, rep->patched, rep->merged,
         rep->linked, rep->commit);
}

static int memory_ingest(int argc, char **argv) {
  ingest_args a = {.logs = calloc((size_t)argc + 1, sizeof(char *))};
  if (!a.logs) return cli_fail("out of memory");
  int status = 2;
  for (int i = 1; i < argc; i++) {
    if (cli_is_help(argv[i])) {
      ingest_usage(stdout);
      status = 0;
      goto out;
    }
    int r = ingest_opt(&a, argc, argv, &i);
    if (r < 0) goto out;
    if (r == 0 && argv[i][0] == '-' && argv[i][1]) {
      cli_usage_error("memory ingest", "unknown option '%s'", argv[i]);
      goto out;
    }
    if (r == 0) a.logs[a.o.n_logs++] = argv[i];
  }
  if (!a.o.wiki_dir || !a.o.n_logs) {
    cli_usage_error("memory ingest", "%s", !a.o.wiki_dir ? "--wiki DIR is needed" : "no LOG given");
    goto out;
  }
  if (a.o.prompts_override && !hfile_is_dir(a.o.prompts_override)) {
    cli_usage_error("memory ingest", "--prompts %s is not a folder", a.o.prompts_override);
    goto out;
  }
  status = 1;
  char *model_path = NULL;
  if (model_precheck(a.model, &model_path)) goto out;
  for (int i = 0; i < a.o.n_logs; i++)
    if (!hfile_exists(a.logs[i]) || hfile_is_dir(a.logs[i])) {
      cli_fail("memory ingest: no log file %s", a.logs[i]);
      free(model_path);
      goto out;
    }
  a.o.logs = a.logs;
  a.o.prompts_dir = shipped_prompts();
  a.o.progress = stderr;
  hearth_load_opts lo;
  cli_hearth_load_opts(&lo);
  hearth_model *m = NULL;
  hearth_error err = {0};
  mem_hearth h;
  mem_report rep;
  if (hearth_model_load(model_path, &lo, &m, &err) || mem_hearth_init(&h, m, model_path, a.adapters, &err)) {
    cli_fail("%s", err.msg);
  } else {
    mem_engine eng = mem_hearth_engine(&h);
    if (mem_ingest(&a.o, &eng, &rep, &err)) cli_fail("%s", err.msg);
    else print_report(&rep, &a.o, &h), status = 0;
  }
  hearth_model_free(m);
  free(model_path);
out:
  free(a.logs);
  return status;
}
