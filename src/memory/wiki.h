/* wiki.h — the wiki's articles in memory: read from DIR/<slug>.md, changed by
 * the stages (each change recorded, so a stage's result can carry every
 * change so far and be applied again on resume), written back with
 * DIR/index.md (`- [[slug]] — title` per article, by slug). Files in DIR
 * without front matter are not articles and are left alone. */
#ifndef HEARTH_MEMORY_WIKI_H
#define HEARTH_MEMORY_WIKI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "memory/article.h"

typedef struct mem_wiki {
  char *dir;             /* owned */
  mem_article *v;        /* owned, n articles sorted by slug */
  bool *touched;         /* touched[i]: v[i] changed in this run */
  size_t n, cap;
  char **removed;        /* owned: slugs removed in this run */
  size_t n_removed;
} mem_wiki;

/* Reads the articles of dir (a missing folder is an empty wiki). */
int mem_wiki_load(const char *dir, mem_wiki *w, herr *err);
void mem_wiki_free(mem_wiki *w);

mem_article *mem_wiki_find(const mem_wiki *w, const char *slug);
/* Puts a copy of a in (replacing the article of its slug), marked changed. */
int mem_wiki_put(mem_wiki *w, const mem_article *a, herr *err);
/* Removes slug's article (nothing when there is none). */
int mem_wiki_remove(mem_wiki *w, const char *slug, herr *err);
bool mem_wiki_is_touched(const mem_wiki *w, const char *slug);
/* An unused slug from base: base, base-2, base-3, ... */
void mem_wiki_free_slug(const mem_wiki *w, const char *base, char out[MEM_SLUG_MAX + 1]);

/* The changes so far: {"articles": [changed articles], "removed": [slugs]} (a new reference). */
json_t *mem_wiki_changes(const mem_wiki *w);
/* Applies changes made by mem_wiki_changes. */
int mem_wiki_apply(mem_wiki *w, const json_t *changes, herr *err);

/* The index's text. */
char *mem_wiki_index(const mem_wiki *w);
/* Writes the changed articles and the index, deletes removed articles' files. */
int mem_wiki_save(const mem_wiki *w, herr *err);

#endif
