/* stage_write.c — the write stage: each target → its article's body. A new
 * article is written from its facts (template "write"); an existing one is
 * patched: the model gets its body and the new facts and gives the body back
 * with them in (template "patch"). Sources gain the target's segments, dates
 * are set. Without a usable answer the facts are added as a list. */
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "memory/stages.h"

static char *fact_list(const json_t *facts, const char *skip_in) {
  hbuf b = {0};
  for (size_t k = 0; k < json_array_size(facts); k++) {
    const char *f = json_string_value(json_array_get(facts, k));
    if (skip_in && strstr(skip_in, f)) continue;
    hbuf_printf(&b, "- %s\n", f);
  }
  return b.oom ? (hbuf_free(&b), NULL) : b.data ? hbuf_take(&b) : strdup("");
}

/* The body when the answer is unusable: the old body (or a heading) and the facts it lacks. */
static char *fallback_body(const mem_article *old, const char *title, const json_t *facts) {
  char *list = fact_list(facts, old ? old->body : NULL);
  hbuf b = {0};
  if (old) hbuf_printf(&b, "%s\n\n%s", old->body, list ? list : "");
  else hbuf_printf(&b, "# %s\n\n%s", title, list ? list : "");
  free(list);
  return b.oom ? (hbuf_free(&b), NULL) : hbuf_take(&b);
}

/* The article target t becomes, with body, put into the wiki. */
static int apply(mem_run *r, const json_t *t, const char *body, json_t *summary, herr *err) {
  const char *slug = json_string_value(json_object_get(t, "slug"));
  const mem_article *old = mem_wiki_find(&r->wiki, slug);
  mem_article a = {0};
  int rc = 0;
  if (old) rc = mem_article_copy(old, &a);
  else if (!(a.slug = strdup(slug)) || mem_article_set_title(&a, json_string_value(json_object_get(t, "title")))) rc = -1;
  if (!old) snprintf(a.created, sizeof a.created, "%s", r->today);
  snprintf(a.updated, sizeof a.updated, "%s", r->today);
  if (!rc) rc = mem_article_set_body(&a, body);
  const json_t *src = json_object_get(t, "sources");
  for (size_t k = 0; !rc && k < json_array_size(src); k++) rc = mem_article_add_source(&a, json_string_value(json_array_get(src, k)));
  rc = rc ? herr_set(err, HEARTH_ENOMEM, "out of memory") : mem_wiki_put(&r->wiki, &a, err);
  if (!rc) mem_summary_add(summary, old ? "patched" : "created", json_string(slug));
  mem_article_free(&a);
  return rc;
}

int mem_stage_write(mem_run *r, const json_t *in, json_t **out, herr *err) {
  const json_t *targets = json_object_get(in, "targets");
  size_t n = json_array_size(targets);
  mem_ask *asks = calloc(n ? n : 1, sizeof *asks);
  json_t **answers = calloc(n ? n : 1, sizeof *answers);
  char **facts = calloc(n ? n : 1, sizeof *facts);
  int rc = asks && answers && facts ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (size_t i = 0; !rc && i < n; i++) {
    const json_t *t = json_array_get(targets, i);
    const mem_article *old = mem_wiki_find(&r->wiki, json_string_value(json_object_get(t, "slug")));
    if (!(facts[i] = fact_list(json_object_get(t, "facts"), NULL))) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    asks[i] = (mem_ask){.tmpl = old ? MEM_T_PATCH : MEM_T_WRITE,
                        .keys = {"title", "facts", "body", "slug"},
                        .values = {old ? old->title : json_string_value(json_object_get(t, "title")), facts[i],
                                   old ? old->body : "", json_string_value(json_object_get(t, "slug"))},
                        .n = 4};
  }
  if (!rc) rc = mem_stage_ask(r, MEM_WRITE, asks, n, answers, err);
  json_t *summary = mem_summary_copy(in);
  for (size_t i = 0; !rc && i < n; i++) {
    const json_t *t = json_array_get(targets, i);
    const mem_article *old = mem_wiki_find(&r->wiki, json_string_value(json_object_get(t, "slug")));
    char *body = mem_answer_str(answers[i], "body");
    if (!body) body = fallback_body(old, json_string_value(json_object_get(t, "title")), json_object_get(t, "facts"));
    rc = body ? apply(r, t, body, summary, err) : herr_set(err, HEARTH_ENOMEM, "out of memory");
    free(body);
  }
  if (!rc && !(*out = mem_changes_result(r, summary))) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
  json_decref(summary);
  for (size_t i = 0; i < n; i++) {
    if (answers) json_decref(answers[i]);
    if (facts) free(facts[i]);
  }
  free(asks);
  free(answers);
  free(facts);
  return rc;
}
