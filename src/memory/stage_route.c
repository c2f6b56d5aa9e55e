/* stage_route.c — the route stage: each entity (those of one name merged
 * first) → the article its facts go to: an existing one to patch, or a new
 * one to create. The model sees the articles most like the entity; what it
 * says is checked against the wiki — a patch of an article that does not
 * exist creates it, a "new" article whose slug exists patches that one —
 * and entities routed to one article become one target. Without a usable
 * answer the entity's own name decides. */
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "memory/stages.h"

static void add_unique(json_t *arr, const json_t *s) {
  for (size_t i = 0; i < json_array_size(arr); i++)
    if (json_equal(json_array_get(arr, i), s)) return;
  json_array_append(arr, (json_t *)s);
}

/* Entities of one slug merged: [{name, kind, facts, sources}] in first-seen order. */
static json_t *merge_entities(const json_t *ents) {
  json_t *groups = json_array(), *by_slug = json_object();
  for (size_t i = 0; i < json_array_size(ents); i++) {
    const json_t *e = json_array_get(ents, i);
    char slug[MEM_SLUG_MAX + 1];
    mem_slugify(json_string_value(json_object_get(e, "name")), slug);
    json_t *g = json_object_get(by_slug, slug);
    if (!g) {
      g = json_pack("{s:O, s:O, s:[], s:[]}", "name", json_object_get(e, "name"), "kind", json_object_get(e, "kind"),
                    "facts", "sources");
      json_object_set(by_slug, slug, g);
      json_array_append_new(groups, g);
    }
    const json_t *facts = json_object_get(e, "facts");
    for (size_t k = 0; k < json_array_size(facts); k++) add_unique(json_object_get(g, "facts"), json_array_get(facts, k));
    add_unique(json_object_get(g, "sources"), json_object_get(e, "source"));
  }
  json_decref(by_slug);
  return groups;
}

static char *bullets(const json_t *facts) {
  hbuf b = {0};
  for (size_t k = 0; k < json_array_size(facts); k++) hbuf_printf(&b, "- %s\n", json_string_value(json_array_get(facts, k)));
  return b.oom ? (hbuf_free(&b), NULL) : b.data ? hbuf_take(&b) : strdup("");
}

/* Where the group goes: slug and title, and whether that article exists (patch). */
static void decide(const mem_run *r, const json_t *g, const json_t *answer, char slug[MEM_SLUG_MAX + 1], char **title,
                   bool *patch) {
  const char *name = json_string_value(json_object_get(g, "name"));
  char *said_slug = mem_answer_str(answer, "slug"), *said_title = mem_answer_str(answer, "title");
  const char *action = json_string_value(json_object_get(answer, "action"));
  slug[0] = 0;
  if (action && !strcmp(action, "patch") && said_slug) {
    if (mem_wiki_find(&r->wiki, said_slug)) snprintf(slug, MEM_SLUG_MAX + 1, "%s", said_slug);
    else mem_slugify(said_slug, slug);
  }
  if (!slug[0] || !mem_wiki_find(&r->wiki, slug)) mem_slugify(said_title ? said_title : name, slug);
  const mem_article *a = mem_wiki_find(&r->wiki, slug);
  *patch = a != NULL;
  *title = strdup(a ? a->title : said_title ? said_title : name);
  free(said_slug);
  free(said_title);
}

/* The target of slug in targets (made when missing). */
static json_t *target(json_t *targets, const char *slug, const char *title, bool patch) {
  json_t *t = json_object_get(targets, slug);
  if (!t) {
    t = json_pack("{s:s, s:s, s:s, s:[], s:[]}", "slug", slug, "title", title, "action", patch ? "patch" : "create",
                  "facts", "sources");
    json_object_set_new(targets, slug, t);
  }
  return t;
}

int mem_stage_route(mem_run *r, const json_t *in, json_t **out, herr *err) {
  json_t *groups = merge_entities(json_object_get(in, "entities"));
  size_t n = json_array_size(groups);
  mem_ask *asks = calloc(n ? n : 1, sizeof *asks);
  json_t **answers = calloc(n ? n : 1, sizeof *answers);
  char **facts = calloc(n ? n : 1, sizeof *facts), **menus = calloc(n ? n : 1, sizeof *menus);
  int rc = asks && answers && facts && menus ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (size_t i = 0; !rc && i < n; i++) {
    const json_t *g = json_array_get(groups, i);
    const char *name = json_string_value(json_object_get(g, "name"));
    facts[i] = bullets(json_object_get(g, "facts"));
    hbuf about = {0};
    hbuf_printf(&about, "%s\n%s", name, facts[i] ? facts[i] : "");
    menus[i] = mem_article_menu(&r->wiki, hbuf_str(&about), NULL, 40);
    hbuf_free(&about);
    if (!facts[i] || !menus[i]) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    asks[i] = (mem_ask){.tmpl = MEM_T_ROUTE,
                        .keys = {"name", "kind", "facts", "articles"},
                        .values = {name, json_string_value(json_object_get(g, "kind")), facts[i], menus[i]},
                        .n = 4};
  }
  if (!rc) rc = mem_stage_ask(r, MEM_ROUTE, asks, n, answers, err);
  json_t *targets = json_object();
  for (size_t i = 0; !rc && i < n; i++) {
    const json_t *g = json_array_get(groups, i);
    char slug[MEM_SLUG_MAX + 1], *title = NULL;
    bool patch;
    decide(r, g, answers[i], slug, &title, &patch);
    json_t *t = target(targets, slug, title ? title : slug, patch);
    free(title);
    for (size_t k = 0; k < json_array_size(json_object_get(g, "facts")); k++)
      add_unique(json_object_get(t, "facts"), json_array_get(json_object_get(g, "facts"), k));
    for (size_t k = 0; k < json_array_size(json_object_get(g, "sources")); k++)
      add_unique(json_object_get(t, "sources"), json_array_get(json_object_get(g, "sources"), k));
  }
  json_t *list = json_array();
  const char *key;
  json_t *t;
  json_object_foreach(targets, key, t) json_array_append(list, t); /* jansson keeps insertion order */
  json_decref(targets);
  if (!rc) *out = json_pack("{s:o}", "targets", list);
  else json_decref(list);
  for (size_t i = 0; i < n; i++) {
    if (answers) json_decref(answers[i]);
    if (facts) free(facts[i]);
    if (menus) free(menus[i]);
  }
  free(asks);
  free(answers);
  free(facts);
  free(menus);
  json_decref(groups);
  return rc;
}
