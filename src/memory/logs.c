/* logs.c — reading conversation logs into turns (logs.h): chat JSONL, JSON
 * message lists, Markdown / text transcripts. Knows nothing of the stages or
 * the wiki. */
#include "memory/logs.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <strings.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/json.h"
#include "base/utf8.h"
#include "base/vec.h"
#include "memory/state.h"

typedef struct turn_list {
  mem_turn *v;
  size_t n, cap;
} turn_list;

/* s[0..n) as valid UTF-8 (a byte that is not replaced by U+FFFD; NUL bytes left out), malloc'd. */
static char *valid_utf8(const char *s, size_t n) {
  hbuf b = {0};
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    int k = utf8_decode(s + i, n - i, &cp);
    if (k > 0 && cp) hbuf_append(&b, s + i, (size_t)k);
    else if (k <= 0) hbuf_puts(&b, "\xEF\xBF\xBD");
    i += k > 0 ? (size_t)k : 1;
  }
  return b.oom ? (hbuf_free(&b), NULL) : b.data ? hbuf_take(&b) : strdup("");
}

/* s[0..n) without the white space around it, as valid UTF-8, malloc'd. */
static char *trimmed(const char *s, size_t n) {
  while (n && isspace((unsigned char)*s)) s++, n--;
  while (n && isspace((unsigned char)s[n - 1])) n--;
  return valid_utf8(s, n);
}

static int add_turn(turn_list *l, const char *role, const char *text, size_t len) {
  char *t = trimmed(text, len), *r = valid_utf8(role, strlen(role));
  if (!t || !r || (l->n == l->cap && !HGROW(l->v, l->cap, l->n + 1))) {
    free(t);
    free(r);
    return HEARTH_ENOMEM;
  }
  if (!*t) { /* nothing said: no turn */
    free(t);
    free(r);
    return 0;
  }
  l->v[l->n++] = (mem_turn){.role = r, .text = t};
  return 0;
}

/* ---- JSON messages ---- */

/* One content part's text into b: text parts as they are, tool calls and results as JSON. */
static void part_text(const json_t *part, hbuf *b) {
  const char *type = json_string_value(json_object_get(part, "type"));
  const json_t *text = json_object_get(part, "text");
  if (json_is_string(text)) {
    hbuf_puts(b, json_string_value(text));
  } else if (type && !strcmp(type, "tool_use")) {
    char *in = json_dumps(json_object_get(part, "input"), JSON_COMPACT | JSON_SORT_KEYS);
    hbuf_printf(b, "[tool %s: %s]", json_string_value(json_object_get(part, "name")) ?: "?", in ? in : "");
    free(in);
  } else if (type && !strcmp(type, "tool_result")) {
    const json_t *c = json_object_get(part, "content");
    if (json_is_string(c)) hbuf_puts(b, json_string_value(c));
    for (size_t i = 0; json_is_array(c) && i < json_array_size(c); i++) part_text(json_array_get(c, i), b);
  }
}

static void content_text(const json_t *content, hbuf *b) {
  if (json_is_string(content)) {
    hbuf_puts(b, json_string_value(content));
    return;
  }
  for (size_t i = 0; json_is_array(content) && i < json_array_size(content); i++) {
    if (i && b->len) hbuf_putc(b, '\n');
    part_text(json_array_get(content, i), b);
  }
}

static int add_message(turn_list *l, const json_t *msg) {
  const char *role = json_string_value(json_object_get(msg, "role"));
  if (!role) return 0;
  hbuf b = {0};
  content_text(json_object_get(msg, "content"), &b);
  int rc = b.oom ? HEARTH_ENOMEM : add_turn(l, role, hbuf_str(&b), b.len);
  hbuf_free(&b);
  return rc;
}

/* A message, an array of messages, or a conversation {"system", "messages"}. */
static int add_json(turn_list *l, const json_t *v) {
  int rc = 0;
  if (json_is_array(v)) {
    for (size_t i = 0; !rc && i < json_array_size(v); i++) rc = add_message(l, json_array_get(v, i));
    return rc;
  }
  const json_t *msgs = json_object_get(v, "messages");
  if (!msgs) return add_message(l, v);
  const json_t *sys = json_object_get(v, "system");
  if (sys) {
    hbuf b = {0};
    content_text(sys, &b);
    rc = b.oom ? HEARTH_ENOMEM : add_turn(l, "system", hbuf_str(&b), b.len);
    hbuf_free(&b);
  }
  return rc ? rc : add_json(l, msgs);
}

static int parse_jsonl(const char *name, const char *data, size_t len, turn_list *l, herr *err) {
  size_t line = 0;
  for (const char *p = data, *end = data + len; p < end; line++) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
    char what[300];
    snprintf(what, sizeof what, "%s: line %zu", name, line + 1);
    bool blank = true;
    for (size_t i = 0; i < n; i++) blank = blank && isspace((unsigned char)p[i]);
    if (!blank) {
      json_t *v = hjson_load_buf(p, n, what, err);
      if (!v) return HEARTH_EFORMAT;
      int rc = add_json(l, v);
      json_decref(v);
      if (rc) return herr_set(err, rc, "%s: out of memory", what);
    }
    p += n + 1;
  }
  return 0;
}

/* ---- transcripts ---- */

static const struct {
  const char *name, *role;
} speakers[] = {{"user", "user"},       {"human", "user"},         {"me", "user"},       {"you", "user"},
                {"assistant", "assistant"}, {"ai", "assistant"},   {"claude", "assistant"}, {"chatgpt", "assistant"},
                {"gpt", "assistant"},   {"bot", "assistant"},      {"model", "assistant"}, {"system", "system"},
                {"tool", "tool"}};

/* When the line opens a turn: its role, and *rest where the turn's text starts on it.
 * "Name:" opens one anywhere; a name alone on its line only as a heading or in bold. */
static const char *speaker_line(const char *s, size_t n, const char **rest) {
  const char *end = s + n, *start = s;
  while (s < end && (*s == '#' || *s == '>' || *s == '*' || *s == '_' || *s == ' ' || *s == '\t')) s++;
  bool marked = s > start && (*start == '#' || *start == '*');
  for (size_t k = 0; k < sizeof speakers / sizeof speakers[0]; k++) {
    size_t w = strlen(speakers[k].name);
    if ((size_t)(end - s) < w || strncasecmp(s, speakers[k].name, w)) continue;
    const char *p = s + w;
    while (p < end && (*p == '*' || *p == '_')) p++;
    bool colon = p < end && *p == ':';
    if (colon) p++;
    while (p < end && (*p == '*' || *p == '_' || *p == ' ' || *p == '\t' || *p == '\r')) p++;
    if (colon || (marked && p == end)) {
      *rest = p;
      return speakers[k].role;
    }
  }
  return NULL;
}

static int parse_transcript(const char *data, size_t len, turn_list *l) {
  const char *role = NULL;
  hbuf cur = {0};
  int rc = 0;
  for (const char *p = data, *end = data + len; p < end && !rc;) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
    const char *rest = NULL, *r = speaker_line(p, n, &rest);
    if (r) {
      if (role) rc = add_turn(l, role, hbuf_str(&cur), cur.len);
      hbuf_clear(&cur);
      role = r;
      hbuf_append(&cur, rest, (size_t)(p + n - rest));
    } else if (role) {
      hbuf_putc(&cur, '\n');
      hbuf_append(&cur, p, n);
    }
    p += n + 1;
  }
  if (!rc && role) rc = add_turn(l, role, hbuf_str(&cur), cur.len);
  if (cur.oom) rc = HEARTH_ENOMEM;
  hbuf_free(&cur);
  if (rc || role) return rc;
  /* no speakers: a paragraph a turn */
  for (const char *p = data, *end = data + len; p < end && !rc;) {
    const char *q = p;
    while (q < end && !(q + 1 < end && q[0] == '\n' && (q[1] == '\n' || (q[1] == '\r' && q + 2 < end && q[2] == '\n'))))
      q++;
    rc = add_turn(l, "text", p, (size_t)(q - p));
    p = q < end ? q + 2 : end;
  }
  return rc;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcasecmp(s + n - m, suffix);
}

int mem_log_parse(const char *name, const char *data, size_t len, mem_log *out, herr *err) {
  memset(out, 0, sizeof *out);
  const char *slash = strrchr(name, '/');
  out->name = valid_utf8(slash ? slash + 1 : name, strlen(slash ? slash + 1 : name));
  if (!out->name) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  mem_hash_hex(data, len, out->hash);
  size_t i = 0;
  while (i < len && isspace((unsigned char)data[i])) i++;
  bool json_like = i < len && (data[i] == '{' || data[i] == '[');
  turn_list l = {0};
  int rc;
  if (json_like && !ends_with(name, ".md") && !ends_with(name, ".txt")) {
    /* one document, else one per line */
    json_t *v = ends_with(name, ".jsonl") ? NULL : json_loadb(data, len, 0, NULL);
    if (v) {
      rc = add_json(&l, v);
      json_decref(v);
      if (rc) herr_set(err, rc, "%s: out of memory", out->name);
    } else {
      rc = parse_jsonl(out->name, data, len, &l, err);
    }
  } else {
    rc = parse_transcript(data, len, &l);
    if (rc) herr_set(err, rc, "%s: out of memory", out->name);
  }
  out->turns = l.v;
  out->n_turns = l.n;
  if (rc) mem_log_free(out);
  return rc;
}

int mem_log_read(const char *path, mem_log *out, herr *err) {
  memset(out, 0, sizeof *out);
  char *data = NULL;
  size_t len = 0;
  if (hfile_read(path, &data, &len, err)) return err ? err->code : HEARTH_EIO;
  int rc = mem_log_parse(path, data, len, out, err);
  free(data);
  return rc;
}

void mem_log_free(mem_log *l) {
  if (!l) return;
  for (size_t i = 0; i < l->n_turns; i++) {
    free(l->turns[i].role);
    free(l->turns[i].text);
  }
  free(l->turns);
  free(l->name);
  memset(l, 0, sizeof *l);
}
