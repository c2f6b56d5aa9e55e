/* article.c — a wiki article's front matter and body (article.h): parsed from
 * and written to its file, carried as JSON, and slugs made from titles.
 * Knows nothing of the folder the articles live in or of git. */
#include "memory/article.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/json.h"

void mem_slugify(const char *title, char out[MEM_SLUG_MAX + 1]) {
  size_t n = 0;
  bool dash = false;
  for (const unsigned char *p = (const unsigned char *)title; *p && n < MEM_SLUG_MAX; p++) {
    if (isalnum(*p) || *p >= 0x80) {
      if (dash && n) out[n++] = '-';
      dash = false;
      if (n < MEM_SLUG_MAX) out[n++] = (char)tolower(*p);
    } else {
      dash = true;
    }
  }
  /* a cut UTF-8 sequence is cut back to its start */
  size_t k = n;
  while (k && ((unsigned char)out[k - 1] & 0xC0) == 0x80) k--;
  if (k && (unsigned char)out[k - 1] >= 0xC0) {
    unsigned char lead = (unsigned char)out[k - 1];
    size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
    if (n - (k - 1) < want) n = k - 1;
  }
  while (n && out[n - 1] == '-') n--;
  out[n] = 0;
  if (!n) strcpy(out, "article");
  else if (!strcmp(out, "index")) strcpy(out, "index-article");
}

static char *one_line(const char *s) {
  char *t = strdup(s ? s : "");
  if (!t) return NULL;
  for (char *p = t; *p; p++)
    if (*p == '\n' || *p == '\r' || *p == '\t') *p = ' ';
  size_t n = strlen(t);
  while (n && t[n - 1] == ' ') t[--n] = 0;
  size_t lead = strspn(t, " ");
  memmove(t, t + lead, strlen(t + lead) + 1);
  return t;
}

int mem_article_set_title(mem_article *a, const char *s) {
  char *t = one_line(s);
  if (!t) return -1;
  free(a->title);
  a->title = t;
  return 0;
}

int mem_article_set_body(mem_article *a, const char *s) {
  if (!s) s = "";
  while (*s == '\n' || *s == '\r' || *s == ' ' || *s == '\t') s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) n--;
  char *t = strndup(s, n);
  if (!t) return -1;
  free(a->body);
  a->body = t;
  return 0;
}

bool mem_article_has_source(const mem_article *a, const char *src) {
  for (size_t i = 0; i < a->n_sources; i++)
    if (!strcmp(a->sources[i], src)) return true;
  return false;
}

int mem_article_add_source(mem_article *a, const char *src) {
  if (mem_article_has_source(a, src)) return 0;
  char **v = realloc(a->sources, (a->n_sources + 1) * sizeof *v);
  if (!v) return -1;
  a->sources = v;
  if (!(v[a->n_sources] = strdup(src))) return -1;
  a->n_sources++;
  return 0;
}

/* The value of "key: value" when line is that key's line, else NULL. */
static const char *field(const char *line, const char *key) {
  size_t k = strlen(key);
  if (strncmp(line, key, k) || line[k] != ':') return NULL;
  line += k + 1;
  while (*line == ' ') line++;
  return line;
}

static int parse_sources(mem_article *a, const char *v) {
  if (*v == '[') v++;
  char *list = strdup(v), *save = NULL;
  if (!list) return -1;
  char *close = strrchr(list, ']');
  if (close) *close = 0;
  int rc = 0;
  for (char *tok = strtok_r(list, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save)) {
    while (*tok == ' ') tok++;
    size_t n = strlen(tok);
    while (n && tok[n - 1] == ' ') tok[--n] = 0;
    if (n) rc = mem_article_add_source(a, tok);
  }
  free(list);
  return rc;
}

static void set_date(char out[11], const char *v) {
  snprintf(out, 11, "%s", v);
}

static int parse_line(mem_article *a, const char *line) {
  const char *v;
  if ((v = field(line, "title"))) return mem_article_set_title(a, v);
  if ((v = field(line, "sources"))) return parse_sources(a, v);
  if ((v = field(line, "created"))) set_date(a->created, v);
  else if ((v = field(line, "updated"))) set_date(a->updated, v);
  return 0;
}

int mem_article_parse(const char *slug, const char *text, size_t len, mem_article *out, herr *err) {
  memset(out, 0, sizeof *out);
  bool crlf = len >= 5 && !strncmp(text, "---\r\n", 5);
  if (!crlf && (len < 4 || strncmp(text, "---\n", 4)))
    return herr_set(err, HEARTH_EFORMAT, "%s.md: no front matter (a first line '---')", slug);
  const char *p = text + (crlf ? 5 : 4), *end = text + len;
  bool closed = false;
  int rc = (out->slug = strdup(slug)) ? 0 : -1;
  while (!rc && p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
    char *line = strndup(p, n);
    if (line && n && line[n - 1] == '\r') line[n - 1] = 0;
    p += n + (nl ? 1 : 0);
    if (line && !strcmp(line, "---")) closed = true;
    else rc = line ? parse_line(out, line) : -1;
    free(line);
    if (closed) break;
  }
  if (!rc) {
    char *body = strndup(p, (size_t)(end - p));
    rc = body ? mem_article_set_body(out, body) : -1;
    free(body);
  }
  if (rc) {
    mem_article_free(out);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  if (!closed || !out->title || !*out->title) {
    mem_article_free(out);
    return herr_set(err, HEARTH_EFORMAT, "%s.md: %s", slug, closed ? "no title in its front matter" : "front matter not closed");
  }
  return 0;
}

char *mem_article_format(const mem_article *a) {
  hbuf b = {0};
  hbuf_printf(&b, "---\ntitle: %s\nsources: [", a->title ? a->title : a->slug);
  for (size_t i = 0; i < a->n_sources; i++) hbuf_printf(&b, "%s%s", i ? ", " : "", a->sources[i]);
  hbuf_printf(&b, "]\ncreated: %s\nupdated: %s\n---\n\n%s\n", a->created, a->updated, a->body ? a->body : "");
  if (b.oom) {
    hbuf_free(&b);
    return NULL;
  }
  return hbuf_take(&b);
}

json_t *mem_article_to_json(const mem_article *a) {
  json_t *src = json_array();
  for (size_t i = 0; src && i < a->n_sources; i++) json_array_append_new(src, json_string(a->sources[i]));
  return json_pack("{s:s, s:s, s:s, s:o, s:s, s:s}", "slug", a->slug, "title", a->title ? a->title : "", "body",
                   a->body ? a->body : "", "sources", src ? src : json_array(), "created", a->created, "updated",
                   a->updated);
}

int mem_article_from_json(const json_t *v, mem_article *out, herr *err) {
  memset(out, 0, sizeof *out);
  const char *slug = NULL, *title = NULL, *body = NULL, *created = "", *updated = "";
  int rc = hjson_get_str(v, "slug", true, &slug, "article", err);
  if (!rc) rc = hjson_get_str(v, "title", true, &title, "article", err);
  if (!rc) rc = hjson_get_str(v, "body", true, &body, "article", err);
  if (!rc) rc = hjson_get_str(v, "created", false, &created, "article", err);
  if (!rc) rc = hjson_get_str(v, "updated", false, &updated, "article", err);
  if (rc) return rc;
  bool oom = !(out->slug = strdup(slug)) || mem_article_set_title(out, title) || mem_article_set_body(out, body);
  const json_t *src = json_object_get(v, "sources");
  for (size_t i = 0; !oom && json_is_array(src) && i < json_array_size(src); i++) {
    const char *s = json_string_value(json_array_get(src, i));
    oom = s && mem_article_add_source(out, s);
  }
  set_date(out->created, created);
  set_date(out->updated, updated);
  if (oom) {
    mem_article_free(out);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  return 0;
}

int mem_article_copy(const mem_article *a, mem_article *out) {
  json_t *j = mem_article_to_json(a);
  int rc = j ? mem_article_from_json(j, out, NULL) : -1;
  json_decref(j);
  return rc ? -1 : 0;
}

bool mem_body_links(const char *body, const char *slug) {
  size_t n = strlen(slug);
  for (const char *p = body ? strstr(body, "[[") : NULL; p; p = strstr(p + 2, "[["))
    if (!strncmp(p + 2, slug, n) && (p[2 + n] == ']' || p[2 + n] == '|')) return true;
  return false;
}

void mem_article_free(mem_article *a) {
  if (!a) return;
  for (size_t i = 0; i < a->n_sources; i++) free(a->sources[i]);
  free(a->sources);
  free(a->slug);
  free(a->title);
  free(a->body);
  memset(a, 0, sizeof *a);
}
