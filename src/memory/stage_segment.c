/* stage_segment.c — the segment stage: each log, a window of its turns at a
 * time, cut into topical segments. The model names where each segment starts
 * (its first turn) and its title; the segments are the turns from one start
 * to the next, so they cover the window without gaps or overlaps whatever
 * the answer says. A segment whose text an earlier run ingested is left out. */
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "memory/stages.h"
#include "memory/state.h"

typedef struct window {
  size_t log, first, n; /* turns [first, first + n) of logs[log] */
  char *numbered;       /* owned: "[1] role: text" lines for the prompt */
} window;

static void turn_line(hbuf *b, const mem_turn *t) { hbuf_printf(b, "%s: %s\n", t->role, t->text); }

/* Windows of at most max chars of numbered turns (one turn at least each). */
static int make_windows(const mem_run *r, long max, window **out, size_t *n_out) {
  window *w = NULL;
  size_t n = 0;
  for (size_t l = 0; l < r->n_logs; l++) {
    const mem_log *lg = &r->logs[l];
    for (size_t t = 0; t < lg->n_turns;) {
      window *grown = realloc(w, (n + 1) * sizeof *w);
      if (!grown) break;
      w = grown;
      hbuf b = {0};
      size_t k = 0;
      while (t + k < lg->n_turns) {
        size_t before = b.len;
        hbuf_printf(&b, "[%zu] ", k + 1);
        turn_line(&b, &lg->turns[t + k]);
        if (k && (long)b.len > max) {
          b.len = before;
          b.data[before] = 0;
          break;
        }
        k++;
      }
      w[n++] = (window){.log = l, .first = t, .n = k, .numbered = hbuf_take(&b)};
      hbuf_free(&b);
      t += k;
    }
  }
  *out = w;
  *n_out = n;
  return 0;
}

/* The starts (1-based within the window) the answer gives, sorted, 1 always
 * among them; titles[k] for start k. Returns how many. */
static size_t starts_of(const json_t *answer, size_t n_turns, size_t *starts, const char **titles) {
  size_t n = 0;
  starts[n] = 1;
  titles[n++] = NULL;
  const json_t *segs = json_object_get(answer, "segments");
  for (size_t i = 0; i < json_array_size(segs) && n < 64; i++) {
    const json_t *s = json_array_get(segs, i);
    json_int_t first = json_integer_value(json_object_get(s, "first"));
    const char *title = json_string_value(json_object_get(s, "title"));
    if (first < 1 || (size_t)first > n_turns) continue;
    size_t at = 0;
    while (at < n && starts[at] < (size_t)first) at++;
    if (at < n && starts[at] == (size_t)first) {
      if (!titles[at]) titles[at] = title;
      continue;
    }
    memmove(&starts[at + 1], &starts[at], (n - at) * sizeof *starts);
    memmove(&titles[at + 1], &titles[at], (n - at) * sizeof *titles);
    starts[at] = (size_t)first;
    titles[at] = title;
    n++;
  }
  return n;
}

/* The log's entry in "logs" (made when missing). */
static json_t *log_entry(json_t *logs, const mem_log *lg) {
  for (size_t i = 0; i < json_array_size(logs); i++) {
    json_t *e = json_array_get(logs, i);
    if (!strcmp(json_string_value(json_object_get(e, "name")), lg->name)) return e;
  }
  json_t *e = json_pack("{s:s, s:s, s:[]}", "name", lg->name, "hash", lg->hash, "segments");
  json_array_append_new(logs, e);
  return e;
}

/* Adds the window's segments (turn ranges from the starts) to segs; *counter numbers them in their log. */
static void add_segments(mem_run *r, const window *w, const size_t *starts, const char **titles, size_t n, json_t *segs,
                         json_t *logs, int *counter) {
  const mem_log *lg = &r->logs[w->log];
  for (size_t k = 0; k < n; k++) {
    size_t from = w->first + starts[k] - 1, to = w->first + (k + 1 < n ? starts[k + 1] - 1 : w->n);
    hbuf text = {0};
    for (size_t t = from; t < to; t++) turn_line(&text, &lg->turns[t]);
    char hash[17], id[600];
    mem_hash_hex(hbuf_str(&text), text.len, hash);
    snprintf(id, sizeof id, "%s#%d", lg->name, ++*counter);
    for (char *c = id; *c; c++) /* the front matter's list cannot hold these */
      if (*c == ',' || *c == '[' || *c == ']') *c = '_';
    json_array_append_new(json_object_get(log_entry(logs, lg), "segments"), json_string(hash));
    if (!json_object_get(r->known_segments, hash)) {
      char title[128];
      snprintf(title, sizeof title, "%s", titles[k] ? titles[k] : lg->name);
      json_array_append_new(segs, json_pack("{s:s, s:s, s:s, s:s}", "id", id, "title", title, "text", hbuf_str(&text),
                                            "hash", hash));
    }
    hbuf_free(&text);
  }
}

int mem_stage_segment(mem_run *r, const json_t *in, json_t **out, herr *err) {
  (void)in;
  window *w = NULL;
  size_t n = 0;
  make_windows(r, r->o->window_chars > 0 ? r->o->window_chars : 6000, &w, &n);
  mem_ask *asks = calloc(n ? n : 1, sizeof *asks);
  json_t **answers = calloc(n ? n : 1, sizeof *answers);
  char(*counts)[24] = calloc(n ? n : 1, sizeof *counts);
  int rc = asks && answers && counts ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (size_t i = 0; !rc && i < n; i++) {
    snprintf(counts[i], sizeof counts[i], "%zu", w[i].n);
    asks[i] = (mem_ask){.tmpl = MEM_T_SEGMENT,
                        .keys = {"log", "turns", "count"},
                        .values = {r->logs[w[i].log].name, w[i].numbered, counts[i]},
                        .n = 3};
  }
  if (!rc) rc = mem_stage_ask(r, MEM_SEGMENT, asks, n, answers, err);
  json_t *segs = json_array(), *logs = json_array();
  for (size_t l = 0; l < r->n_logs; l++) log_entry(logs, &r->logs[l]); /* a log with no turns is recorded too */
  int counter = 0;
  for (size_t i = 0; !rc && i < n; i++) {
    if (i && w[i].log != w[i - 1].log) counter = 0;
    size_t starts[65];
    const char *titles[65];
    size_t k = starts_of(answers[i], w[i].n, starts, titles);
    add_segments(r, &w[i], starts, titles, k, segs, logs, &counter);
  }
  if (!rc) *out = json_pack("{s:o, s:o}", "segments", segs, "logs", logs);
  else json_decref(segs), json_decref(logs);
  for (size_t i = 0; i < n; i++) {
    if (answers) json_decref(answers[i]);
    free(w[i].numbered);
  }
  free(w);
  free(asks);
  free(answers);
  free(counts);
  return rc;
}
