/* wiki.c — the wiki's articles in memory and on disk (wiki.h): loading the
 * folder, changes recorded as they are made, the index, saving. Knows
 * nothing of git or of the model. */
#include "memory/wiki.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/log.h"

static int oom(herr *err) { return herr_set(err, HEARTH_ENOMEM, "out of memory"); }

/* Where slug is, or would go, in the sorted array. */
static size_t slot(const mem_wiki *w, const char *slug, bool *found) {
  size_t lo = 0, hi = w->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int c = strcmp(w->v[mid].slug, slug);
    if (c == 0) {
      *found = true;
      return mid;
    }
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  *found = false;
  return lo;
}

mem_article *mem_wiki_find(const mem_wiki *w, const char *slug) {
  bool found;
  size_t i = slot(w, slug, &found);
  return found ? &w->v[i] : NULL;
}

bool mem_wiki_is_touched(const mem_wiki *w, const char *slug) {
  bool found;
  size_t i = slot(w, slug, &found);
  return found && w->touched[i];
}

/* Inserts a (taken over) at its place; touched says whether it is a change. */
static int insert(mem_wiki *w, mem_article *a, bool touched, herr *err) {
  bool found;
  size_t i = slot(w, a->slug, &found);
  if (found) {
    mem_article_free(&w->v[i]);
    w->v[i] = *a;
    w->touched[i] = w->touched[i] || touched;
    return 0;
  }
  if (w->n == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 16;
    mem_article *v = realloc(w->v, cap * sizeof *v);
    if (v) w->v = v;
    bool *t = v ? realloc(w->touched, cap * sizeof *t) : NULL;
    if (t) w->touched = t;
    if (!v || !t) return oom(err);
    w->cap = cap;
  }
  memmove(&w->v[i + 1], &w->v[i], (w->n - i) * sizeof *w->v);
  memmove(&w->touched[i + 1], &w->touched[i], (w->n - i) * sizeof *w->touched);
  w->v[i] = *a;
  w->touched[i] = touched;
  w->n++;
  return 0;
}

static void unremove(mem_wiki *w, const char *slug) {
  for (size_t i = 0; i < w->n_removed; i++)
    if (!strcmp(w->removed[i], slug)) {
      free(w->removed[i]);
      w->removed[i] = w->removed[--w->n_removed];
      return;
    }
}

int mem_wiki_put(mem_wiki *w, const mem_article *a, herr *err) {
  mem_article c;
  if (mem_article_copy(a, &c)) return oom(err);
  unremove(w, c.slug);
  int rc = insert(w, &c, true, err);
  if (rc) mem_article_free(&c);
  return rc;
}

int mem_wiki_remove(mem_wiki *w, const char *slug, herr *err) {
  bool found;
  size_t i = slot(w, slug, &found);
  if (!found) return 0;
  char **r = realloc(w->removed, (w->n_removed + 1) * sizeof *r);
  if (!r) return oom(err);
  w->removed = r;
  if (!(r[w->n_removed] = strdup(slug))) return oom(err);
  w->n_removed++;
  mem_article_free(&w->v[i]);
  memmove(&w->v[i], &w->v[i + 1], (w->n - i - 1) * sizeof *w->v);
  memmove(&w->touched[i], &w->touched[i + 1], (w->n - i - 1) * sizeof *w->touched);
  w->n--;
  return 0;
}

void mem_wiki_free_slug(const mem_wiki *w, const char *base, char out[MEM_SLUG_MAX + 1]) {
  snprintf(out, MEM_SLUG_MAX + 1, "%s", base);
  for (int k = 2; mem_wiki_find(w, out); k++) {
    char suffix[16];
    int n = snprintf(suffix, sizeof suffix, "-%d", k);
    size_t keep = strlen(base);
    if (keep + (size_t)n > MEM_SLUG_MAX) keep = MEM_SLUG_MAX - (size_t)n;
    snprintf(out, MEM_SLUG_MAX + 1, "%.*s%s", (int)keep, base, suffix);
  }
}

static bool is_article_file(const char *name) {
  size_t n = strlen(name);
  return n > 3 && !strcmp(name + n - 3, ".md") && strcmp(name, "index.md") && name[0] != '.';
}

static int load_file(mem_wiki *w, const char *name, herr *err) {
  char *path = hpath_join(w->dir, name), *text = NULL, *slug = strndup(name, strlen(name) - 3);
  size_t len = 0;
  int rc = path && slug ? hfile_read(path, &text, &len, err) : oom(err);
  mem_article a;
  herr perr = {0};
  if (!rc && !mem_article_parse(slug, text, len, &a, &perr) && (rc = insert(w, &a, false, err))) mem_article_free(&a);
  if (!rc && perr.code) HLOG_DEBUG("memory: %s is not an article (%s)", path, perr.msg);
  free(text);
  free(path);
  free(slug);
  return rc;
}

int mem_wiki_load(const char *dir, mem_wiki *w, herr *err) {
  memset(w, 0, sizeof *w);
  if (!(w->dir = strdup(dir))) return oom(err);
  DIR *d = opendir(dir);
  if (!d) return errno == ENOENT ? 0 : herr_set(err, HEARTH_EIO, "cannot read %s: %s", dir, strerror(errno));
  int rc = 0;
  struct dirent *e;
  while (!rc && (e = readdir(d)))
    if (is_article_file(e->d_name)) rc = load_file(w, e->d_name, err);
  closedir(d);
  if (rc) mem_wiki_free(w);
  return rc;
}

void mem_wiki_free(mem_wiki *w) {
  for (size_t i = 0; i < w->n; i++) mem_article_free(&w->v[i]);
  for (size_t i = 0; i < w->n_removed; i++) free(w->removed[i]);
  free(w->v);
  free(w->touched);
  free(w->removed);
  free(w->dir);
  memset(w, 0, sizeof *w);
}

json_t *mem_wiki_changes(const mem_wiki *w) {
  json_t *arts = json_array(), *rem = json_array();
  for (size_t i = 0; arts && i < w->n; i++)
    if (w->touched[i]) json_array_append_new(arts, mem_article_to_json(&w->v[i]));
  for (size_t i = 0; rem && i < w->n_removed; i++) json_array_append_new(rem, json_string(w->removed[i]));
  return arts && rem ? json_pack("{s:o, s:o}", "articles", arts, "removed", rem) : NULL;
}

int mem_wiki_apply(mem_wiki *w, const json_t *changes, herr *err) {
  const json_t *arts = json_object_get(changes, "articles"), *rem = json_object_get(changes, "removed");
  int rc = 0;
  for (size_t i = 0; !rc && i < json_array_size(rem); i++) {
    const char *s = json_string_value(json_array_get(rem, i));
    if (s) rc = mem_wiki_remove(w, s, err);
  }
  for (size_t i = 0; !rc && i < json_array_size(arts); i++) {
    mem_article a;
    if ((rc = mem_article_from_json(json_array_get(arts, i), &a, err))) break;
    rc = mem_wiki_put(w, &a, err);
    mem_article_free(&a);
  }
  return rc;
}

char *mem_wiki_index(const mem_wiki *w) {
  hbuf b = {0};
  hbuf_puts(&b, "# Index\n\n");
  for (size_t i = 0; i < w->n; i++) hbuf_printf(&b, "- [[%s]] — %s\n", w->v[i].slug, w->v[i].title);
  if (b.oom) {
    hbuf_free(&b);
    return NULL;
  }
  return hbuf_take(&b);
}

/* Writes text to dir/name unless it holds that already. */
static int write_if_changed(const char *dir, const char *name, const char *text, herr *err) {
  char *path = hpath_join(dir, name), *old = NULL;
  size_t len = 0;
  if (!path) return oom(err);
  bool same = !hfile_read(path, &old, &len, NULL) && len == strlen(text) && !memcmp(old, text, len);
  free(old);
  int rc = 0;
  if (!same) {
    FILE *f = fopen(path, "w");
    bool ok = f && fputs(text, f) >= 0;
    if (f && fclose(f)) ok = false;
    if (!ok) rc = herr_set(err, HEARTH_EIO, "cannot write %s: %s", path, strerror(errno));
  }
  free(path);
  return rc;
}

int mem_wiki_save(const mem_wiki *w, herr *err) {
  int rc = 0;
  for (size_t i = 0; !rc && i < w->n_removed; i++) {
    char name[MEM_SLUG_MAX + 8];
    snprintf(name, sizeof name, "%s.md", w->removed[i]);
    char *path = hpath_join(w->dir, name);
    if (!path) rc = oom(err);
    else if (unlink(path) && errno != ENOENT) rc = herr_set(err, HEARTH_EIO, "cannot remove %s: %s", path, strerror(errno));
    free(path);
  }
  for (size_t i = 0; !rc && i < w->n; i++) {
    if (!w->touched[i]) continue;
    char name[MEM_SLUG_MAX + 8], *text = mem_article_format(&w->v[i]);
    snprintf(name, sizeof name, "%s.md", w->v[i].slug);
    rc = text ? write_if_changed(w->dir, name, text, err) : oom(err);
    free(text);
  }
  char *index = rc ? NULL : mem_wiki_index(w);
  if (!rc) rc = index ? write_if_changed(w->dir, "index.md", index, err) : oom(err);
  free(index);
  return rc;
}
