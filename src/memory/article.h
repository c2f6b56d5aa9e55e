/* article.h — one wiki article: its front matter and body, as a file and as
 * JSON (for the state folder), and the slugs that name articles.
 *
 *   ---
 *   title: <Title>
 *   sources: [<log file name>#<segment>, ...]
 *   created: YYYY-MM-DD
 *   updated: YYYY-MM-DD
 *   ---
 *
 *   <Markdown body with [[slug]] links>
 */
#ifndef HEARTH_MEMORY_ARTICLE_H
#define HEARTH_MEMORY_ARTICLE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

#define MEM_SLUG_MAX 80

typedef struct mem_article {
  char *slug;          /* owned: the file is <slug>.md */
  char *title;         /* owned, one line */
  char *body;          /* owned: Markdown, no trailing newline */
  char **sources;      /* owned: n_sources "log#segment" */
  size_t n_sources;
  char created[11], updated[11];
} mem_article;

/* The slug of a title: ASCII letters and digits lowercased, other ASCII runs
 * as one '-', UTF-8 letters kept, at most MEM_SLUG_MAX bytes; "article" when
 * nothing is left, "index-article" for "index" (index.md is the index). */
void mem_slugify(const char *title, char out[MEM_SLUG_MAX + 1]);

/* Parses a file's text. HEARTH_EFORMAT when it has no front matter or no title. */
int mem_article_parse(const char *slug, const char *text, size_t len, mem_article *out, herr *err);
/* The file's text (malloc'd). */
char *mem_article_format(const mem_article *a);

json_t *mem_article_to_json(const mem_article *a);
int mem_article_from_json(const json_t *v, mem_article *out, herr *err);

/* Sets a field to a copy of s (a title made one line, a body trimmed). -1 when out of memory. */
int mem_article_set_title(mem_article *a, const char *s);
int mem_article_set_body(mem_article *a, const char *s);
/* Adds a source unless it is there. -1 when out of memory. */
int mem_article_add_source(mem_article *a, const char *src);
bool mem_article_has_source(const mem_article *a, const char *src);
/* A deep copy into out. -1 when out of memory. */
int mem_article_copy(const mem_article *a, mem_article *out);
/* Whether body links to slug ([[slug]] or [[slug|text]]). */
bool mem_body_links(const char *body, const char *slug);
void mem_article_free(mem_article *a);

#endif
