/* stage_reconcile.c — the reconcile stage: articles that may tell of one
 * thing (an article of this run and another whose title shares most of its
 * words) are shown to the model in pairs; when it says they are the same,
 * they become one: the older article keeps its slug and takes the merged
 * title and body, the union of sources and the earlier created date; the
 * other is removed and links to it point to the one kept. Each article is in
 * one pair at most per run. Without a usable answer a pair stays apart. */
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "memory/stages.h"

#define RECONCILE_ALIKE 0.5 /* word likeness of titles at which two articles are shown as a pair */

typedef struct pair {
  char *a, *b; /* owned slugs */
} pair;

static bool in_summary(const json_t *summary, const char *key, const char *slug) {
  const json_t *arr = json_object_get(summary, key);
  for (size_t i = 0; i < json_array_size(arr); i++)
    if (!strcmp(json_string_value(json_array_get(arr, i)), slug)) return true;
  return false;
}

static bool paired(const pair *p, size_t n, const char *slug) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(p[i].a, slug) || !strcmp(p[i].b, slug)) return true;
  return false;
}

/* Pairs of alike titles, one article of each pair touched in this run. */
static size_t find_pairs(const mem_run *r, pair **out) {
  const mem_wiki *w = &r->wiki;
  pair *p = NULL;
  size_t n = 0;
  for (size_t i = 0; i < w->n; i++) {
    if (!w->touched[i] || paired(p, n, w->v[i].slug)) continue;
    for (size_t j = 0; j < w->n; j++) {
      if (j == i || paired(p, n, w->v[j].slug) || mem_words_alike(w->v[i].title, w->v[j].title) < RECONCILE_ALIKE) continue;
      pair *grown = realloc(p, (n + 1) * sizeof *p);
      if (!grown) break;
      p = grown;
      p[n].a = strdup(w->v[i < j ? i : j].slug);
      p[n++].b = strdup(w->v[i < j ? j : i].slug);
      break;
    }
  }
  *out = p;
  return n;
}

/* Which of the pair keeps its slug: one older than this run, else the one with more sources, else a. */
static bool keep_a(const mem_run *r, const json_t *summary, const mem_article *a, const mem_article *b) {
  bool new_a = in_summary(summary, "created", a->slug), new_b = in_summary(summary, "created", b->slug);
  if (new_a != new_b) return new_b;
  return a->n_sources >= b->n_sources;
}

/* body with [[from]] and [[from|...]] made [[into...]] (malloc'd), or NULL when it has none. */
static char *relink(const char *body, const char *from, const char *into) {
  if (!mem_body_links(body, from)) return NULL;
  size_t n = strlen(from);
  hbuf b = {0};
  for (const char *p = body; *p;) {
    const char *at = strstr(p, "[[");
    if (!at) {
      hbuf_puts(&b, p);
      break;
    }
    hbuf_append(&b, p, (size_t)(at - p) + 2);
    p = at + 2;
    if (!strncmp(p, from, n) && (p[n] == ']' || p[n] == '|')) {
      hbuf_puts(&b, into);
      p += n;
    }
  }
  return b.oom ? (hbuf_free(&b), NULL) : hbuf_take(&b);
}

/* Every article linking to from links to into instead. */
static int relink_all(mem_run *r, const char *from, const char *into, herr *err) {
  for (size_t i = 0; i < r->wiki.n; i++) {
    char *body = relink(r->wiki.v[i].body, from, into);
    if (!body) continue;
    mem_article c;
    int rc = mem_article_copy(&r->wiki.v[i], &c) || mem_article_set_body(&c, body) ? herr_set(err, HEARTH_ENOMEM, "out of memory") : 0;
    if (!rc) snprintf(c.updated, sizeof c.updated, "%s", r->today);
    if (!rc) rc = mem_wiki_put(&r->wiki, &c, err);
    mem_article_free(&c);
    free(body);
    if (rc) return rc;
  }
  return 0;
}

static int merge(mem_run *r, const pair *p, const json_t *answer, json_t *summary, herr *err) {
  const mem_article *a = mem_wiki_find(&r->wiki, p->a), *b = mem_wiki_find(&r->wiki, p->b);
  if (!a || !b) return 0;
  bool ka = keep_a(r, summary, a, b);
  const mem_article *keep = ka ? a : b, *gone = ka ? b : a;
  char *title = mem_answer_str(answer, "title"), *body = mem_answer_str(answer, "body");
  mem_article m;
  int rc = mem_article_copy(keep, &m) ? -1 : 0;
  if (!rc && title) rc = mem_article_set_title(&m, title);
  if (!rc && body) rc = mem_article_set_body(&m, body);
  for (size_t k = 0; !rc && k < gone->n_sources; k++) rc = mem_article_add_source(&m, gone->sources[k]);
  if (!rc && gone->created[0] && (!m.created[0] || strcmp(gone->created, m.created) < 0)) memcpy(m.created, gone->created, 11);
  snprintf(m.updated, sizeof m.updated, "%s", r->today);
  char *from = strdup(gone->slug);
  rc = rc || !from ? herr_set(err, HEARTH_ENOMEM, "out of memory") : mem_wiki_put(&r->wiki, &m, err);
  if (!rc) rc = mem_wiki_remove(&r->wiki, from, err);
  if (!rc) rc = relink_all(r, from, m.slug, err);
  if (!rc) mem_summary_add(summary, "merged", json_pack("{s:s, s:s}", "from", from, "into", m.slug));
  free(from);
  free(title);
  free(body);
  mem_article_free(&m);
  return rc;
}

int mem_stage_reconcile(mem_run *r, const json_t *in, json_t **out, herr *err) {
  pair *p = NULL;
  size_t n = find_pairs(r, &p);
  mem_ask *asks = calloc(n ? n : 1, sizeof *asks);
  json_t **answers = calloc(n ? n : 1, sizeof *answers);
  int rc = asks && answers ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (size_t i = 0; !rc && i < n; i++) {
    const mem_article *a = mem_wiki_find(&r->wiki, p[i].a), *b = mem_wiki_find(&r->wiki, p[i].b);
    asks[i] = (mem_ask){.tmpl = MEM_T_RECONCILE,
                        .keys = {"a_slug", "a_title", "a_body", "b_slug", "b_title", "b_body"},
                        .values = {a->slug, a->title, a->body, b->slug, b->title, b->body},
                        .n = 6};
  }
  if (!rc) rc = mem_stage_ask(r, MEM_RECONCILE, asks, n, answers, err);
  json_t *summary = mem_summary_copy(in);
  for (size_t i = 0; !rc && i < n; i++)
    if (json_is_true(json_object_get(answers[i], "same"))) rc = merge(r, &p[i], answers[i], summary, err);
  if (!rc && !(*out = mem_changes_result(r, summary))) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
  json_decref(summary);
  for (size_t i = 0; i < n; i++) {
    if (answers) json_decref(answers[i]);
    free(p[i].a);
    free(p[i].b);
  }
  free(p);
  free(asks);
  free(answers);
  return rc;
}
