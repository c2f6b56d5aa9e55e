/* stage_link.c — the link stage: each article of this run → the other
 * articles it should link to, chosen by the model from those most like it.
 * Links to articles that exist, are not the article itself and are not
 * linked already are added under a "## See also" heading at the end of the
 * body. Without a usable answer an article gains no links. */
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "memory/stages.h"

#define LINK_HEADING "## See also"

/* The slug a link answer names (a slug, [[slug]], or a title), when it is an article. */
static const mem_article *named(const mem_wiki *w, const char *said) {
  char buf[MEM_SLUG_MAX + 1];
  size_t n = strlen(said);
  if (n > 4 && !strncmp(said, "[[", 2) && !strcmp(said + n - 2, "]]")) {
    snprintf(buf, sizeof buf, "%.*s", (int)(n - 4), said + 2);
    said = buf;
  }
  const mem_article *a = mem_wiki_find(w, said);
  if (a) return a;
  char slug[MEM_SLUG_MAX + 1];
  mem_slugify(said, slug);
  return mem_wiki_find(w, slug);
}

/* The body with "- [[slug]]" added under the see-also heading (made when missing). */
static char *with_link(const char *body, const char *slug) {
  hbuf b = {0};
  const char *h = strstr(body, "\n" LINK_HEADING "\n");
  hbuf_puts(&b, body);
  if (!h && strncmp(body, LINK_HEADING "\n", strlen(LINK_HEADING) + 1)) hbuf_puts(&b, "\n\n" LINK_HEADING "\n");
  hbuf_printf(&b, "\n- [[%s]]", slug);
  return b.oom ? (hbuf_free(&b), NULL) : hbuf_take(&b);
}

/* Adds the answer's links to the article of slug; *added counts them. */
static int add_links(mem_run *r, const char *slug, const json_t *answer, int *added, herr *err) {
  const json_t *links = json_object_get(answer, "links");
  *added = 0;
  for (size_t k = 0; k < json_array_size(links); k++) {
    const char *said = json_string_value(json_array_get(links, k));
    const mem_article *to = said ? named(&r->wiki, said) : NULL, *self = mem_wiki_find(&r->wiki, slug);
    if (!to || !self || to == self || mem_body_links(self->body, to->slug)) continue;
    char *body = with_link(self->body, to->slug);
    mem_article c;
    int rc = !body || mem_article_copy(self, &c) ? herr_set(err, HEARTH_ENOMEM, "out of memory") : 0;
    if (!rc) {
      free(c.body);
      c.body = body;
      body = NULL;
      snprintf(c.updated, sizeof c.updated, "%s", r->today);
      rc = mem_wiki_put(&r->wiki, &c, err);
      mem_article_free(&c);
    }
    free(body);
    if (rc) return rc;
    ++*added;
  }
  return 0;
}

int mem_stage_link(mem_run *r, const json_t *in, json_t **out, herr *err) {
  /* the articles of this run, by slug (the wiki changes under the loop) */
  json_t *slugs = json_array();
  for (size_t i = 0; i < r->wiki.n; i++)
    if (r->wiki.touched[i] && r->wiki.n > 1) json_array_append_new(slugs, json_string(r->wiki.v[i].slug));
  size_t n = json_array_size(slugs);
  mem_ask *asks = calloc(n ? n : 1, sizeof *asks);
  json_t **answers = calloc(n ? n : 1, sizeof *answers);
  char **menus = calloc(n ? n : 1, sizeof *menus);
  int rc = asks && answers && menus ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (size_t i = 0; !rc && i < n; i++) {
    const mem_article *a = mem_wiki_find(&r->wiki, json_string_value(json_array_get(slugs, i)));
    hbuf about = {0};
    hbuf_printf(&about, "%s\n%s", a->title, a->body);
    menus[i] = mem_article_menu(&r->wiki, hbuf_str(&about), a->slug, 40);
    hbuf_free(&about);
    if (!menus[i]) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    asks[i] = (mem_ask){.tmpl = MEM_T_LINK,
                        .keys = {"slug", "title", "body", "articles"},
                        .values = {a->slug, a->title, a->body, menus[i]},
                        .n = 4};
  }
  if (!rc) rc = mem_stage_ask(r, MEM_LINK, asks, n, answers, err);
  json_t *summary = mem_summary_copy(in);
  for (size_t i = 0; !rc && i < n; i++) {
    int added = 0;
    const char *slug = json_string_value(json_array_get(slugs, i));
    rc = add_links(r, slug, answers[i], &added, err);
    if (!rc && added) mem_summary_add(summary, "linked", json_string(slug));
  }
  if (!rc && !(*out = mem_changes_result(r, summary))) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
  json_decref(summary);
  for (size_t i = 0; i < n; i++) {
    if (answers) json_decref(answers[i]);
    if (menus) free(menus[i]);
  }
  free(asks);
  free(answers);
  free(menus);
  json_decref(slugs);
  return rc;
}
