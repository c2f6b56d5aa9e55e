/* pipeline.c — mem_ingest (memory.h): which logs are new (by the trailers of
 * the wiki's history), the stages in order, each result kept in the state
 * folder or taken from it when an earlier run of the same inputs finished
 * it, then the wiki written and committed once with a summary. Knows the
 * stages only by their entry points (stages.h). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/buf.h"
#include "base/log.h"
#include "memory/stages.h"
#include "memory/state.h"
#include "memory/wiki_git.h"

#define TRAILER_LOG "Hearth-Memory-Log"
#define TRAILER_SEGMENTS "Hearth-Memory-Segments"
#define RESULT_VERSION "hearth-memory-1" /* part of the run key: change it when results change shape */

static const mem_stage_fn stage_fns[MEM_STAGES] = {mem_stage_segment, mem_stage_extract, mem_stage_route,
                                                   mem_stage_write,   mem_stage_reconcile, mem_stage_link};

/* ---- what earlier runs ingested ---- */

static void add_known_log(void *ctx, const char *value) {
  char hash[17];
  if (sscanf(value, "%16s", hash) == 1) json_object_set_new(ctx, hash, json_true());
}

static void add_known_segments(void *ctx, const char *value) {
  char *list = strdup(value), *save = NULL;
  for (char *h = list ? strtok_r(list, " ", &save) : NULL; h; h = strtok_r(NULL, " ", &save))
    if (strlen(h) == 16) json_object_set_new(ctx, h, json_true());
  free(list);
}

/* Reads the logs; keeps in r those no earlier run (and no earlier log of this run) ingested. */
static int read_new_logs(mem_run *r, mem_git *g, herr *err) {
  json_t *known = json_object();
  int rc = mem_git_trailers(g, TRAILER_LOG, add_known_log, known, err);
  if (!rc) rc = mem_git_trailers(g, TRAILER_SEGMENTS, add_known_segments, r->known_segments, err);
  r->logs = calloc((size_t)r->o->n_logs + 1, sizeof *r->logs);
  if (!rc && !r->logs) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (int i = 0; !rc && i < r->o->n_logs; i++) {
    mem_log *l = &r->logs[r->n_logs];
    if ((rc = mem_log_read(r->o->logs[i], l, err))) break;
    if (json_object_get(known, l->hash)) {
      r->rep->logs_known++;
      mem_log_free(l);
      continue;
    }
    json_object_set_new(known, l->hash, json_true());
    r->n_logs++;
  }
  r->rep->logs_new = r->n_logs;
  json_decref(known);
  return rc;
}

/* ---- the run ---- */

static void run_key(const mem_run *r, char key[17]) {
  hbuf b = {0};
  hbuf_printf(&b, "%s%c%s%c%ld%c", RESULT_VERSION, 0, r->eng->id ? r->eng->id : "", 0, r->o->window_chars, 0);
  for (int t = 0; t < MEM_TEMPLATES; t++) hbuf_printf(&b, "%s%c", r->prompts.text[t], 0);
  for (size_t i = 0; i < r->n_logs; i++) hbuf_printf(&b, "%s %s%c", r->logs[i].name, r->logs[i].hash, 0);
  mem_hash_hex(b.data ? b.data : "", b.len, key);
  hbuf_free(&b);
}

static void set_today(mem_run *r) {
  if (r->o->today) {
    snprintf(r->today, sizeof r->today, "%s", r->o->today);
    return;
  }
  time_t now = time(NULL);
  struct tm tm;
  localtime_r(&now, &tm);
  strftime(r->today, sizeof r->today, "%Y-%m-%d", &tm);
}

/* Carries "logs" and "summary" from one result to the next. */
static void carry(const json_t *from, json_t *to) {
  static const char *keys[] = {"logs", "summary"};
  for (int k = 0; k < 2; k++)
    if (!json_object_get(to, keys[k]) && json_object_get(from, keys[k]))
      json_object_set(to, keys[k], json_object_get(from, keys[k]));
}

/* Stage s: its kept result, or computed and kept. *result: the new result (replacing the old). */
static int run_stage(mem_run *r, const mem_state *st, int s, json_t **result, herr *err) {
  json_t *out = mem_state_load(st, s);
  if (out) {
    r->rep->resumed = true;
    if (json_object_get(out, "articles") && (mem_wiki_apply(&r->wiki, out, err))) return json_decref(out), err->code;
    if (r->o->progress) fprintf(r->o->progress, "memory: %s: done before, kept\n", mem_stage_name(s));
  } else {
    int calls = r->rep->calls;
    int rc = stage_fns[s](r, *result, &out, err);
    if (rc) return herr_wrap(err, "memory: %s", mem_stage_name(s));
    carry(*result, out);
    if ((rc = mem_state_save(st, s, out, err))) return json_decref(out), rc;
    r->rep->stages_run++;
    if (r->o->progress) fprintf(r->o->progress, "memory: %s: %d calls\n", mem_stage_name(s), r->rep->calls - calls);
  }
  if (s == MEM_SEGMENT) r->rep->segments = (int)json_array_size(json_object_get(out, "segments"));
  if (s == MEM_EXTRACT) r->rep->entities = (int)json_array_size(json_object_get(out, "entities"));
  json_decref(*result);
  *result = out;
  return 0;
}

/* ---- the commit ---- */

static void list_line(hbuf *b, const json_t *summary, const char *key) {
  const json_t *arr = json_object_get(summary, key);
  if (!json_array_size(arr)) return;
  hbuf_printf(b, "%s: ", key);
  for (size_t i = 0; i < json_array_size(arr); i++) {
    const json_t *v = json_array_get(arr, i);
    if (json_is_string(v)) hbuf_printf(b, "%s%s", i ? ", " : "", json_string_value(v));
    else
      hbuf_printf(b, "%s%s into %s", i ? ", " : "", json_string_value(json_object_get(v, "from")),
                  json_string_value(json_object_get(v, "into")));
  }
  hbuf_putc(b, '\n');
}

static char *commit_message(const mem_run *r, const json_t *result) {
  const json_t *summary = json_object_get(result, "summary"), *logs = json_object_get(result, "logs");
  hbuf b = {0};
  if (r->n_logs == 1) hbuf_printf(&b, "memory: ingest %s", r->logs[0].name);
  else hbuf_printf(&b, "memory: ingest %zu logs", r->n_logs);
  static const char *counts[] = {"created", "patched", "merged", "linked"};
  for (int k = 0; k < 4; k++)
    hbuf_printf(&b, "%s %zu %s", k ? "," : " —", json_array_size(json_object_get(summary, counts[k])), counts[k]);
  hbuf_puts(&b, "\n\n");
  for (int k = 0; k < 4; k++) list_line(&b, summary, counts[k]);
  hbuf_putc(&b, '\n');
  for (size_t i = 0; i < json_array_size(logs); i++) {
    const json_t *l = json_array_get(logs, i), *segs = json_object_get(l, "segments");
    hbuf_printf(&b, TRAILER_LOG ": %s %s\n", json_string_value(json_object_get(l, "hash")),
                json_string_value(json_object_get(l, "name")));
    if (!json_array_size(segs)) continue;
    hbuf_puts(&b, TRAILER_SEGMENTS ":");
    for (size_t k = 0; k < json_array_size(segs); k++) hbuf_printf(&b, " %s", json_string_value(json_array_get(segs, k)));
    hbuf_putc(&b, '\n');
  }
  return b.oom ? (hbuf_free(&b), NULL) : hbuf_take(&b);
}

/* The files the run changed: its articles, the removed ones, the index. */
static char **changed_paths(const mem_wiki *w, size_t *n) {
  char **p = calloc(w->n + w->n_removed + 1, sizeof *p);
  *n = 0;
  for (size_t i = 0; p && i < w->n; i++)
    if (w->touched[i] && asprintf(&p[*n], "%s.md", w->v[i].slug) > 0) ++*n;
  for (size_t i = 0; p && i < w->n_removed; i++)
    if (asprintf(&p[*n], "%s.md", w->removed[i]) > 0) ++*n;
  if (p && (p[*n] = strdup("index.md"))) ++*n;
  return p;
}

static void report_summary(mem_report *rep, const json_t *result) {
  const json_t *s = json_object_get(result, "summary");
  rep->created = (int)json_array_size(json_object_get(s, "created"));
  rep->patched = (int)json_array_size(json_object_get(s, "patched"));
  rep->merged = (int)json_array_size(json_object_get(s, "merged"));
  rep->linked = (int)json_array_size(json_object_get(s, "linked"));
}

static int commit(mem_run *r, mem_git *g, const json_t *result, herr *err) {
  int rc = mem_wiki_save(&r->wiki, err);
  size_t n = 0;
  char **paths = rc ? NULL : changed_paths(&r->wiki, &n), *msg = rc ? NULL : commit_message(r, result);
  if (!rc && (!paths || !msg)) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
  if (!rc) rc = mem_git_commit(g, (const char *const *)paths, n, msg, r->rep->commit, err);
  r->rep->committed = !rc;
  for (size_t i = 0; paths && i < n; i++) free(paths[i]);
  free(paths);
  free(msg);
  return rc;
}

/* The stages from where the state folder leaves off; then the commit, unless stopped early. */
static int run_stages(mem_run *r, mem_git *g, herr *err) {
  char key[17], head[41];
  run_key(r, key);
  mem_git_head(g, head);
  mem_state st;
  bool resumed;
  int rc = mem_state_open(r->o->wiki_dir, key, head, &st, &resumed, err);
  json_t *result = json_object();
  int last = r->o->stop_after > 0 && r->o->stop_after < MEM_STAGES ? r->o->stop_after : MEM_STAGES;
  for (int s = 0; !rc && s < last; s++) rc = run_stage(r, &st, s, &result, err);
  if (!rc) report_summary(r->rep, result);
  if (!rc && last == MEM_STAGES) {
    rc = commit(r, g, result, err);
    if (!rc) mem_state_clear(r->o->wiki_dir);
  }
  json_decref(result);
  mem_state_close(&st);
  return rc;
}

int mem_ingest(const mem_opts *o, const mem_engine *eng, mem_report *rep, herr *err) {
  memset(rep, 0, sizeof *rep);
  if (!o->wiki_dir || !*o->wiki_dir) return herr_set(err, HEARTH_EINVAL, "memory: no wiki folder");
  if (!eng || !eng->run) return herr_set(err, HEARTH_EINVAL, "memory: no engine");
  mem_run r = {.o = o, .eng = eng, .rep = rep, .known_segments = json_object()};
  set_today(&r);
  mem_git *g = NULL;
  int lock = -1;
  int rc = mem_git_open(o->wiki_dir, &g, err);
  if (!rc) rc = mem_state_lock(o->wiki_dir, &lock, err);
  if (!rc) rc = read_new_logs(&r, g, err);
  if (!rc && !r.n_logs) {
    mem_state_clear(o->wiki_dir);
    if (o->progress) fprintf(o->progress, "memory: nothing new (%d logs ingested before)\n", rep->logs_known);
  } else if (!rc) {
    rc = mem_prompts_load(o->prompts_dir, o->prompts_override, &r.prompts, err);
    if (!rc) rc = mem_wiki_load(o->wiki_dir, &r.wiki, err);
    if (!rc) rc = run_stages(&r, g, err);
  }
  for (size_t i = 0; i < r.n_logs; i++) mem_log_free(&r.logs[i]);
  free(r.logs);
  json_decref(r.known_segments);
  mem_prompts_free(&r.prompts);
  mem_wiki_free(&r.wiki);
  mem_state_unlock(lock);
  mem_git_close(g);
  return rc;
}
