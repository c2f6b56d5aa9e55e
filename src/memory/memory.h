/* memory.h — the memory pipeline: conversation logs into a git-tracked
 * Markdown wiki, written by a language model in six stages.
 *
 *   segment    each log (a window of its turns) → topical segments (turn ranges)
 *   extract    each segment → entities (people, projects, places, topics) and their facts
 *   route      each entity → an existing article to patch, or a new one to create
 *   write      each article touched → its body (a new article, or the old one patched)
 *   reconcile  each pair of articles that look like duplicates → merged, or left apart
 *   link       each article touched → the other articles it should link to
 *
 * Each stage is one batch of calls (one per item) through a mem_engine: the
 * model behind it is the engine's business (engine_hearth.h runs a hearth
 * model; tests script the answers). Every call's prompt comes from the
 * stage's template (prompts.h), JSON answers are constrained by the stage's
 * schema, and an answer that cannot be used falls back to what the stage can
 * do without the model (counted in mem_report.fallbacks).
 *
 * The wiki (wiki.h): DIR/<slug>.md articles, each with front matter (title,
 * sources `log#segment`, created, updated), `[[slug]]` links, and
 * DIR/index.md listing them. One git commit per run (wiki_git.h), whose
 * trailers record the logs and segments ingested, so a log already ingested is
 * skipped and a second run on the same logs changes nothing. Each stage's
 * result is kept in DIR/.hearth-memory/ (state.h) until the run commits, so a
 * run cut short resumes after its last finished stage.
 */
#ifndef HEARTH_MEMORY_H
#define HEARTH_MEMORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "base/status.h"

enum { MEM_SEGMENT = 0, MEM_EXTRACT, MEM_ROUTE, MEM_WRITE, MEM_RECONCILE, MEM_LINK, MEM_STAGES };

/* "segment", "extract", ... for stage 0..MEM_STAGES-1. */
const char *mem_stage_name(int stage);
/* The stage a name gives ("chunk" is segment's other name), or -1. */
int mem_stage_parse(const char *name);

/* One model call: a prompt in, the answer's text out. */
typedef struct mem_call {
  int stage;               /* MEM_SEGMENT .. MEM_LINK */
  const char *prompt;      /* borrowed: the user message (the template filled in) */
  const char *schema;      /* borrowed, may be NULL: the JSON Schema the answer must follow */
  long max_tokens;         /* the stage's answer length limit */
  char *answer;            /* out, owned (malloc'd; the pipeline frees it): NULL when the call failed */
} mem_call;

/* What runs the calls. run answers calls[0..n) in place (all of one stage);
 * a nonzero return fails the run (err set); a call that alone failed leaves
 * its answer NULL. id names the model and its settings in the run key, so
 * stage results kept for one engine are not resumed under another. */
typedef struct mem_engine {
  int (*run)(void *ctx, mem_call *calls, size_t n, herr *err);
  void *ctx;
  const char *id;
} mem_engine;

typedef struct mem_opts {
  const char *wiki_dir;            /* the wiki's folder (created and made a git repository when missing) */
  const char *const *logs;         /* n_logs paths: JSONL, JSON, Markdown or text transcripts */
  int n_logs;
  const char *prompts_dir;         /* the shipped templates (<stage>.txt) */
  const char *prompts_override;    /* may be NULL: a folder whose templates replace the shipped ones */
  const char *today;               /* YYYY-MM-DD for created / updated; NULL: the local date */
  int stop_after;                  /* 0: every stage; k in 1..5: stop after the first k stages (no commit) */
  long window_chars;               /* a segment call's transcript at most this long (0: 6000) */
  FILE *progress;                  /* may be NULL: a line per stage */
} mem_opts;

typedef struct mem_report {
  int logs_new, logs_known;        /* logs read; already ingested ones skipped */
  int segments, entities;
  int created, patched, merged, linked; /* articles created, patched, merged away, given new links */
  int fallbacks;                   /* answers that could not be used */
  int stages_run;                  /* stages computed in this run (not resumed from the state dir) */
  int calls;                       /* model calls made */
  bool resumed;                    /* stage results of an earlier run were used */
  bool committed;                  /* a commit was made */
  char commit[41];                 /* its id */
} mem_report;

/* Ingests the logs into the wiki. 0 when the run finished (committed, or
 * nothing new, or stopped at stop_after); else an error naming the problem. */
int mem_ingest(const mem_opts *o, const mem_engine *eng, mem_report *rep, herr *err);

#endif
