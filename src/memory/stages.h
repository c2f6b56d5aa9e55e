/* stages.h — what the six stages share inside the module: the run they work
 * on, the one way they ask the engine, and each stage's entry point.
 *
 * A stage takes the previous stage's result (JSON; for segment, the run's
 * logs) and gives its own. Results are self-contained so that a stage can
 * start from a result read back from the state folder: from write on, each
 * carries every change made to the wiki so far (mem_wiki_changes), and
 * every result carries "logs" (the logs and segment hashes the commit
 * records) and "summary" (the articles created, patched, merged, linked).
 *
 *   segment   → {"segments": [{id, title, text}], "logs": [{name, hash, segments: [hash]}]}
 *   extract   → {"entities": [{name, kind, facts: [..], source}]}
 *   route     → {"targets": [{slug, title, action: "create"|"patch", facts, sources}]}
 *   write     → {"articles", "removed"} and summary.created / summary.patched
 *   reconcile → {"articles", "removed"} and summary.merged: [{from, into}]
 *   link      → {"articles", "removed"} and summary.linked
 */
#ifndef HEARTH_MEMORY_STAGES_H
#define HEARTH_MEMORY_STAGES_H

#include <jansson.h>
#include <stdbool.h>

#include "memory/logs.h"
#include "memory/memory.h"
#include "memory/prompts.h"
#include "memory/wiki.h"

typedef struct mem_run {
  const mem_opts *o;         /* borrowed */
  const mem_engine *eng;     /* borrowed */
  mem_prompts prompts;
  mem_wiki wiki;
  mem_log *logs;             /* owned: the logs not yet ingested */
  size_t n_logs;
  json_t *known_segments;    /* owned: object, segment hash → true, ingested by earlier runs */
  char today[11];
  mem_report *rep;           /* borrowed */
} mem_run;

typedef int (*mem_stage_fn)(mem_run *r, const json_t *in, json_t **out, herr *err);

int mem_stage_segment(mem_run *r, const json_t *in, json_t **out, herr *err);
int mem_stage_extract(mem_run *r, const json_t *in, json_t **out, herr *err);
int mem_stage_route(mem_run *r, const json_t *in, json_t **out, herr *err);
int mem_stage_write(mem_run *r, const json_t *in, json_t **out, herr *err);
int mem_stage_reconcile(mem_run *r, const json_t *in, json_t **out, herr *err);
int mem_stage_link(mem_run *r, const json_t *in, json_t **out, herr *err);

/* One request of a stage: its template and slot values. */
typedef struct mem_ask {
  int tmpl;                  /* MEM_T_* */
  const char *keys[8];
  const char *values[8];     /* borrowed */
  int n;
} mem_ask;

/* Runs a stage's requests as one batch: each prompt filled from its template,
 * the stage's schema and token limit set. answers[i]: the JSON object item i
 * answered (a new reference), or NULL when there was no usable answer
 * (counted in rep->fallbacks). */
int mem_stage_ask(mem_run *r, int stage, const mem_ask *asks, size_t n, json_t **answers, herr *err);

/* The stage's JSON Schema and answer length limit. */
const char *mem_stage_schema(int stage);
long mem_stage_max_tokens(int stage);

/* A string field of an answer trimmed (malloc'd), or NULL when absent or empty. */
char *mem_answer_str(const json_t *answer, const char *key);
/* s without the white space around it (malloc'd), or NULL when s is NULL or blank. */
char *mem_trimmed(const char *s);
/* A result's "summary" copied (a new object; empty when there is none). */
json_t *mem_summary_copy(const json_t *result);
/* A stage's result from write on: the wiki's changes so far and summary (a new reference). */
json_t *mem_changes_result(const mem_run *r, json_t *summary);
/* Appends s to summary[key] (an array) unless it is there. */
void mem_summary_add(json_t *summary, const char *key, json_t *s);
/* Lines "- slug: Title" of the articles most like text (at most max, best
 * first; skip may be NULL), or "(none yet)". malloc'd. */
char *mem_article_menu(const mem_wiki *w, const char *text, const char *skip, size_t max);
/* Words of a text alike: |shared| / |either| of their lowercased words, small words left out. */
double mem_words_alike(const char *a, const char *b);

#endif
