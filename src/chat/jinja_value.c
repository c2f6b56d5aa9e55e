/* jinja_value.c — the template engine's values: a bump arena, Python's
 * equality, ordering, truthiness, str(), repr() and json.dumps() as chat
 * templates observe them, and conversion from jansson. Knows nothing of
 * syntax or rendering. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/utf8.h"
#include "chat/jinja_internal.h"

/* ---- arena ---- */

struct jarena_chunk {
  jarena_chunk *next;
  size_t cap, used;
  _Alignas(16) unsigned char data[];
};

#define JARENA_CHUNK 65536

void *jarena_alloc(jarena *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (a->limit && (a->used + n > a->limit || n > a->limit)) {
    a->over = true;
    return NULL;
  }
  jarena_chunk *c = a->head;
  if (!c || c->cap - c->used < n) {
    size_t cap = n > JARENA_CHUNK / 4 ? n : JARENA_CHUNK;
    c = malloc(sizeof *c + cap);
    if (!c) {
      a->over = true;
      return NULL;
    }
    c->cap = cap;
    c->used = 0;
    if (n > JARENA_CHUNK / 4 && a->head) { /* big blocks go behind the current chunk */
      c->next = a->head->next;
      a->head->next = c;
    } else {
      c->next = a->head;
      a->head = c;
    }
  }
  void *p = c->data + c->used;
  c->used += n;
  a->used += n;
  memset(p, 0, n);
  return p;
}

char *jarena_strdup(jarena *a, const char *s, size_t n) {
  char *p = jarena_alloc(a, n + 1);
  if (!p) return NULL;
  if (n) memcpy(p, s, n);
  p[n] = 0;
  return p;
}

void jarena_free(jarena *a) {
  jarena_chunk *c = a->head;
  while (c) {
    jarena_chunk *next = c->next;
    free(c);
    c = next;
  }
  a->head = NULL;
  a->used = 0;
}

/* ---- constructors ---- */

jv jv_undef(const char *hint) { return (jv){.t = JV_UNDEF, .hint = hint}; }
jv jv_none(void) { return (jv){.t = JV_NONE}; }
jv jv_bool(bool b) { return (jv){.t = JV_BOOL, .b = b}; }
jv jv_int(int64_t i) { return (jv){.t = JV_INT, .i = i}; }
jv jv_float(double f) { return (jv){.t = JV_FLOAT, .f = f}; }

jv jv_str(jarena *a, const char *s, size_t n) {
  jstr *js = jarena_alloc(a, sizeof(jstr) + n + 1);
  if (!js) return jv_undef(NULL);
  js->len = n;
  if (n) memcpy(js->data, s, n);
  js->data[n] = 0;
  return (jv){.t = JV_STR, .s = js};
}

jv jv_cstr(jarena *a, const char *s) { return jv_str(a, s, strlen(s)); }

jv jv_list(jarena *a, size_t cap) {
  jlist *l = jarena_alloc(a, sizeof *l);
  if (!l) return jv_undef(NULL);
  if (cap) {
    l->items = jarena_alloc(a, cap * sizeof(jv));
    if (!l->items) return jv_undef(NULL);
    l->cap = cap;
  }
  return (jv){.t = JV_LIST, .l = l};
}

jv jv_dict(jarena *a, size_t cap) {
  jdict *d = jarena_alloc(a, sizeof *d);
  if (!d) return jv_undef(NULL);
  if (cap) {
    d->keys = jarena_alloc(a, cap * sizeof(jv));
    d->vals = jarena_alloc(a, cap * sizeof(jv));
    if (!d->keys || !d->vals) return jv_undef(NULL);
    d->cap = cap;
  }
  return (jv){.t = JV_DICT, .d = d};
}

bool jlist_push(jarena *a, jlist *l, jv v) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 4;
    jv *items = jarena_alloc(a, cap * sizeof(jv));
    if (!items) return false;
    if (l->n) memcpy(items, l->items, l->n * sizeof(jv));
    l->items = items;
    l->cap = cap;
  }
  l->items[l->n++] = v;
  return true;
}

jv *jdict_get(const jdict *d, jv key) {
  for (size_t i = 0; i < d->n; i++)
    if (jv_equal(d->keys[i], key)) return &d->vals[i];
  return NULL;
}

jv *jdict_gets(const jdict *d, const char *key) {
  size_t n = strlen(key);
  for (size_t i = 0; i < d->n; i++)
    if (d->keys[i].t == JV_STR && d->keys[i].s->len == n && memcmp(d->keys[i].s->data, key, n) == 0)
      return &d->vals[i];
  return NULL;
}

bool jdict_set(jarena *a, jdict *d, jv key, jv val) {
  jv *have = jdict_get(d, key);
  if (have) {
    *have = val;
    return true;
  }
  if (d->n == d->cap) {
    size_t cap = d->cap ? d->cap * 2 : 4;
    jv *keys = jarena_alloc(a, cap * sizeof(jv));
    jv *vals = jarena_alloc(a, cap * sizeof(jv));
    if (!keys || !vals) return false;
    if (d->n) {
      memcpy(keys, d->keys, d->n * sizeof(jv));
      memcpy(vals, d->vals, d->n * sizeof(jv));
    }
    d->keys = keys;
    d->vals = vals;
    d->cap = cap;
  }
  d->keys[d->n] = key;
  d->vals[d->n] = val;
  d->n++;
  return true;
}

/* ---- Python semantics ---- */

bool jv_truthy(jv v) {
  switch (v.t) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v.b;
    case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0.0;
    case JV_STR: return v.s->len != 0;
    case JV_LIST: return (v.view == VIEW_GENERATOR || v.view == VIEW_REVITER) || v.l->n != 0;
    case JV_DICT: return v.d->n != 0;
    default: return true;
  }
}

bool jv_is_number(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }

double jv_as_double(jv v) {
  if (v.t == JV_INT) return (double)v.i;
  if (v.t == JV_BOOL) return v.b ? 1.0 : 0.0;
  if (v.t == JV_FLOAT) return v.f;
  return 0.0;
}

static int cmp_numbers(jv a, jv b) {
  if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
    int64_t x = a.t == JV_BOOL ? a.b : a.i, y = b.t == JV_BOOL ? b.b : b.i;
    return x < y ? -1 : x > y;
  }
  double x = jv_as_double(a), y = jv_as_double(b);
  return x < y ? -1 : x > y;
}

bool jv_equal(jv a, jv b) {
  if (jv_is_number(a) && jv_is_number(b)) {
    if (a.t == JV_FLOAT || b.t == JV_FLOAT) return jv_as_double(a) == jv_as_double(b);
    return cmp_numbers(a, b) == 0;
  }
  if (a.t != b.t) return false;
  switch (a.t) {
    case JV_UNDEF: case JV_NONE: return true;
    case JV_STR: return a.s->len == b.s->len && memcmp(a.s->data, b.s->data, a.s->len) == 0;
    case JV_LIST:
      if (a.view != b.view) return false;
      if (a.view == VIEW_GENERATOR || a.view == VIEW_REVITER) return a.l == b.l;
      if (a.tuple != b.tuple || a.l->n != b.l->n) return false;
      for (size_t i = 0; i < a.l->n; i++)
        if (!jv_equal(a.l->items[i], b.l->items[i])) return false;
      return true;
    case JV_DICT:
      if (a.d->n != b.d->n) return false;
      for (size_t i = 0; i < a.d->n; i++) {
        jv *o = jdict_get(b.d, a.d->keys[i]);
        if (!o || !jv_equal(a.d->vals[i], *o)) return false;
      }
      return true;
    case JV_NS: return a.d == b.d;
    case JV_FUNC: return a.fn == b.fn;
    case JV_LOOP: return a.loop == b.loop;
    default: return false;
  }
}

int jv_compare(jv a, jv b, int *cmp) {
  if (jv_is_number(a) && jv_is_number(b)) {
    *cmp = cmp_numbers(a, b);
    return 0;
  }
  if (a.t == JV_STR && b.t == JV_STR) {
    size_t n = a.s->len < b.s->len ? a.s->len : b.s->len;
    int c = memcmp(a.s->data, b.s->data, n);
    *cmp = c ? (c < 0 ? -1 : 1) : (a.s->len < b.s->len ? -1 : a.s->len > b.s->len);
    return 0;
  }
  if (a.t == JV_LIST && b.t == JV_LIST && a.tuple == b.tuple && !a.view && !b.view) {
    size_t n = a.l->n < b.l->n ? a.l->n : b.l->n;
    for (size_t i = 0; i < n; i++) {
      if (jv_equal(a.l->items[i], b.l->items[i])) continue;
      return jv_compare(a.l->items[i], b.l->items[i], cmp);
    }
    *cmp = a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
    return 0;
  }
  return -1;
}

const char *jv_type_name(jv v) {
  switch (v.t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST:
      switch (v.view) {
        case VIEW_GENERATOR: return "generator";
        case VIEW_REVITER: return "list_reverseiterator";
        case VIEW_ITEMS: return "dict_items";
        case VIEW_KEYS: return "dict_keys";
        case VIEW_VALUES: return "dict_values";
        default: return v.tuple ? "tuple" : "list";
      }
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_FUNC: return "function";
    case JV_LOOP: return "LoopContext";
    default: return "object";
  }
}

/* ---- printing ---- */

void jv_float_repr(hbuf *b, double f) {
  if (isnan(f)) {
    hbuf_puts(b, "nan");
    return;
  }
  if (isinf(f)) {
    hbuf_puts(b, f < 0 ? "-inf" : "inf");
    return;
  }
  if (f == 0.0) {
    hbuf_puts(b, signbit(f) ? "-0.0" : "0.0");
    return;
  }
  char tmp[64];
  int p = 1;
  for (; p <= 17; p++) {
    snprintf(tmp, sizeof tmp, "%.*e", p - 1, f);
    if (strtod(tmp, NULL) == f) break;
  }
  /* tmp = [-]d[.ddd]e[+-]XX: collect digits and the decimal exponent */
  char digits[32];
  int nd = 0;
  const char *s = tmp;
  bool neg = false;
  if (*s == '-') {
    neg = true;
    s++;
  }
  for (; *s && *s != 'e'; s++)
    if (*s >= '0' && *s <= '9') digits[nd++] = *s;
  int e10 = atoi(s + 1);
  while (nd > 1 && digits[nd - 1] == '0') nd--;
  int decpt = e10 + 1;
  if (neg) hbuf_putc(b, '-');
  if (decpt <= -4 || decpt > 16) {
    hbuf_putc(b, digits[0]);
    if (nd > 1) {
      hbuf_putc(b, '.');
      hbuf_append(b, digits + 1, (size_t)nd - 1);
    }
    hbuf_printf(b, "e%c%02d", e10 < 0 ? '-' : '+', e10 < 0 ? -e10 : e10);
  } else if (decpt <= 0) {
    hbuf_puts(b, "0.");
    for (int i = 0; i < -decpt; i++) hbuf_putc(b, '0');
    hbuf_append(b, digits, (size_t)nd);
  } else if (nd <= decpt) {
    hbuf_append(b, digits, (size_t)nd);
    for (int i = nd; i < decpt; i++) hbuf_putc(b, '0');
    hbuf_puts(b, ".0");
  } else {
    hbuf_append(b, digits, (size_t)decpt);
    hbuf_putc(b, '.');
    hbuf_append(b, digits + decpt, (size_t)(nd - decpt));
  }
}

static bool py_printable(uint32_t cp) {
  if (cp == ' ') return true;
  if (cp < 0x20 || cp == 0x7f) return false;
  if (cp < 0x7f) return true;
  switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
      return false;
    default: return true;
  }
}

static void str_repr(hbuf *b, const char *s, size_t n) {
  bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
  char q = has_sq && !has_dq ? '"' : '\'';
  hbuf_putc(b, q);
  for (size_t i = 0; i < n;) {
    unsigned char c = (unsigned char)s[i];
    if (c == q || c == '\\') {
      hbuf_putc(b, '\\');
      hbuf_putc(b, (char)c);
      i++;
    } else if (c == '\n') { hbuf_puts(b, "\\n"); i++; }
    else if (c == '\r') { hbuf_puts(b, "\\r"); i++; }
    else if (c == '\t') { hbuf_puts(b, "\\t"); i++; }
    else if (c < 0x80) {
      if (c < 0x20 || c == 0x7f) hbuf_printf(b, "\\x%02x", c);
      else hbuf_putc(b, (char)c);
      i++;
    } else {
      uint32_t cp;
      int k = utf8_decode(s + i, n - i, &cp);
      if (k == 0) { /* not UTF-8: show the byte */
        hbuf_printf(b, "\\x%02x", c);
        i++;
        continue;
      }
      if (py_printable(cp)) hbuf_append(b, s + i, (size_t)k);
      else if (cp <= 0xff) hbuf_printf(b, "\\x%02x", cp);
      else if (cp <= 0xffff) hbuf_printf(b, "\\u%04x", cp);
      else hbuf_printf(b, "\\U%08x", cp);
      i += (size_t)k;
    }
  }
  hbuf_putc(b, q);
}

/* The containers being printed, outermost first: a list or dict that holds
 * itself prints as Python does ("[...]", "{...}") instead of recursing
 * forever, and nesting deeper than REPR_MAX_DEPTH prints "..." rather than
 * exhausting the stack. */
#define REPR_MAX_DEPTH 256
typedef struct repr_path {
  const void *at[REPR_MAX_DEPTH];
  int n;
} repr_path;

static void repr_rec(hbuf *b, jv v, repr_path *path);

/* Prints container c (open / close brackets) unless it is already being printed. */
static bool repr_enter(hbuf *b, const void *c, const char *cycle, repr_path *path) {
  for (int i = 0; i < path->n; i++)
    if (path->at[i] == c) {
      hbuf_puts(b, cycle);
      return false;
    }
  if (path->n >= REPR_MAX_DEPTH) {
    hbuf_puts(b, "...");
    return false;
  }
  path->at[path->n++] = c;
  return true;
}

static void repr_rec(hbuf *b, jv v, repr_path *path) {
  switch (v.t) {
    case JV_STR: str_repr(b, v.s->data, v.s->len); return;
    case JV_LIST:
      if (v.view == VIEW_GENERATOR || v.view == VIEW_REVITER) {
        hbuf_printf(b, "<%s object>", jv_type_name(v));
        return;
      }
      if (v.view) {
        jv plain = v;
        plain.view = VIEW_NONE;
        hbuf_printf(b, "%s(", jv_type_name(v));
        repr_rec(b, plain, path);
        hbuf_putc(b, ')');
        return;
      }
      if (!repr_enter(b, v.l, v.tuple ? "(...)" : "[...]", path)) return;
      hbuf_putc(b, v.tuple ? '(' : '[');
      for (size_t i = 0; i < v.l->n; i++) {
        if (i) hbuf_puts(b, ", ");
        repr_rec(b, v.l->items[i], path);
      }
      if (v.tuple && v.l->n == 1) hbuf_putc(b, ',');
      hbuf_putc(b, v.tuple ? ')' : ']');
      path->n--;
      return;
    case JV_DICT:
      if (!repr_enter(b, v.d, "{...}", path)) return;
      hbuf_putc(b, '{');
      for (size_t i = 0; i < v.d->n; i++) {
        if (i) hbuf_puts(b, ", ");
        repr_rec(b, v.d->keys[i], path);
        hbuf_puts(b, ": ");
        repr_rec(b, v.d->vals[i], path);
      }
      hbuf_putc(b, '}');
      path->n--;
      return;
    case JV_UNDEF: hbuf_puts(b, "Undefined"); return;
    case JV_NS: {
      hbuf_puts(b, "<Namespace ");
      jv d = v;
      d.t = JV_DICT;
      repr_rec(b, d, path);
      hbuf_putc(b, '>');
      return;
    }
    default: jv_to_str(b, v); return;
  }
}

void jv_repr(hbuf *b, jv v) {
  repr_path path;
  path.n = 0;
  repr_rec(b, v, &path);
}

void jv_to_str(hbuf *b, jv v) {
  switch (v.t) {
    case JV_UNDEF: return;
    case JV_NONE: hbuf_puts(b, "None"); return;
    case JV_BOOL: hbuf_puts(b, v.b ? "True" : "False"); return;
    case JV_INT: hbuf_printf(b, "%lld", (long long)v.i); return;
    case JV_FLOAT: jv_float_repr(b, v.f); return;
    case JV_STR: hbuf_append(b, v.s->data, v.s->len); return;
    case JV_FUNC: hbuf_puts(b, "<function>"); return;
    case JV_LOOP: hbuf_puts(b, "<LoopContext>"); return;
    default: jv_repr(b, v); return;
  }
}

/* ---- json.dumps ---- */

static void json_str(hbuf *b, const char *s, size_t n, bool ensure_ascii) {
  hbuf_putc(b, '"');
  for (size_t i = 0; i < n;) {
    unsigned char c = (unsigned char)s[i];
    switch (c) {
      case '"': hbuf_puts(b, "\\\""); i++; continue;
      case '\\': hbuf_puts(b, "\\\\"); i++; continue;
      case '\n': hbuf_puts(b, "\\n"); i++; continue;
      case '\r': hbuf_puts(b, "\\r"); i++; continue;
      case '\t': hbuf_puts(b, "\\t"); i++; continue;
      case '\b': hbuf_puts(b, "\\b"); i++; continue;
      case '\f': hbuf_puts(b, "\\f"); i++; continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
      hbuf_printf(b, "\\u%04x", c);
      i++;
    } else if (c < 0x80 || !ensure_ascii) {
      hbuf_putc(b, (char)c);
      i++;
    } else {
      uint32_t cp;
      int k = utf8_decode(s + i, n - i, &cp);
      if (k == 0) {
        cp = 0xfffd;
        k = 1;
      }
      if (cp >= 0x10000) {
        uint32_t v = cp - 0x10000;
        hbuf_printf(b, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
      } else {
        hbuf_printf(b, "\\u%04x", cp);
      }
      i += (size_t)k;
    }
  }
  hbuf_putc(b, '"');
}

static void json_newline(hbuf *b, int indent, int level) {
  hbuf_putc(b, '\n');
  for (int i = 0; i < indent * level; i++) hbuf_putc(b, ' ');
}

static bool json_key(hbuf *b, jv k, bool ensure_ascii, const char **bad) {
  switch (k.t) {
    case JV_STR: json_str(b, k.s->data, k.s->len, ensure_ascii); return true;
    case JV_INT: hbuf_printf(b, "\"%lld\"", (long long)k.i); return true;
    case JV_BOOL: hbuf_puts(b, k.b ? "\"true\"" : "\"false\""); return true;
    case JV_NONE: hbuf_puts(b, "\"null\""); return true;
    case JV_FLOAT:
      hbuf_putc(b, '"');
      jv_float_repr(b, k.f);
      hbuf_putc(b, '"');
      return true;
    default: *bad = jv_type_name(k); return false;
  }
}

static int key_order(const void *x, const void *y) {
  const jv *a = x, *b = y;
  int c = 0;
  if (jv_compare(a[0], b[0], &c) != 0) return 0;
  return c;
}

bool jv_to_json(hbuf *b, jv v, bool ensure_ascii, int indent, const char *item_sep, const char *key_sep,
                bool sort_keys, const char **bad, int depth) {
  if (depth > 512) {
    *bad = "deeply nested";
    return false;
  }
  if (!item_sep) item_sep = indent >= 0 ? "," : ", ";
  if (!key_sep) key_sep = ": ";
  switch (v.t) {
    case JV_NONE: hbuf_puts(b, "null"); return true;
    case JV_BOOL: hbuf_puts(b, v.b ? "true" : "false"); return true;
    case JV_INT: hbuf_printf(b, "%lld", (long long)v.i); return true;
    case JV_FLOAT:
      if (isnan(v.f)) hbuf_puts(b, "NaN");
      else if (isinf(v.f)) hbuf_puts(b, v.f < 0 ? "-Infinity" : "Infinity");
      else jv_float_repr(b, v.f);
      return true;
    case JV_STR: json_str(b, v.s->data, v.s->len, ensure_ascii); return true;
    case JV_LIST:
      if (v.view) {
        *bad = jv_type_name(v);
        return false;
      }
      if (v.l->n == 0) {
        hbuf_puts(b, "[]");
        return true;
      }
      hbuf_putc(b, '[');
      for (size_t i = 0; i < v.l->n; i++) {
        if (i) hbuf_puts(b, item_sep);
        if (indent >= 0) json_newline(b, indent, depth + 1);
        if (!jv_to_json(b, v.l->items[i], ensure_ascii, indent, item_sep, key_sep, sort_keys, bad, depth + 1))
          return false;
      }
      if (indent >= 0) json_newline(b, indent, depth);
      hbuf_putc(b, ']');
      return true;
    case JV_DICT: {
      if (v.d->n == 0) {
        hbuf_puts(b, "{}");
        return true;
      }
      /* pairs (key, value), sorted by key when asked */
      jv *pairs = malloc(v.d->n * 2 * sizeof(jv));
      if (!pairs) {
        b->oom = true;
        return true;
      }
      for (size_t i = 0; i < v.d->n; i++) {
        pairs[2 * i] = v.d->keys[i];
        pairs[2 * i + 1] = v.d->vals[i];
      }
      if (sort_keys) {
        for (size_t i = 1; i < v.d->n; i++) { /* stable insertion sort; mixed types are an error */
          int c;
          if (jv_compare(pairs[0], pairs[2 * i], &c) != 0) {
            *bad = "mixed key types";
            free(pairs);
            return false;
          }
        }
        /* insertion sort keeps it stable */
        for (size_t i = 1; i < v.d->n; i++) {
          jv k = pairs[2 * i], val = pairs[2 * i + 1];
          size_t j = i;
          while (j > 0 && key_order(&pairs[2 * (j - 1)], &k) > 0) {
            pairs[2 * j] = pairs[2 * (j - 1)];
            pairs[2 * j + 1] = pairs[2 * (j - 1) + 1];
            j--;
          }
          pairs[2 * j] = k;
          pairs[2 * j + 1] = val;
        }
      }
      hbuf_putc(b, '{');
      bool ok = true;
      for (size_t i = 0; i < v.d->n && ok; i++) {
        if (i) hbuf_puts(b, item_sep);
        if (indent >= 0) json_newline(b, indent, depth + 1);
        ok = json_key(b, pairs[2 * i], ensure_ascii, bad);
        if (!ok) break;
        hbuf_puts(b, key_sep);
        ok = jv_to_json(b, pairs[2 * i + 1], ensure_ascii, indent, item_sep, key_sep, sort_keys, bad, depth + 1);
      }
      free(pairs);
      if (!ok) return false;
      if (indent >= 0) json_newline(b, indent, depth);
      hbuf_putc(b, '}');
      return true;
    }
    default: *bad = jv_type_name(v); return false;
  }
}

jv jv_from_json(jarena *a, const json_t *j, int depth) {
  if (!j || depth > 512) return jv_none();
  switch (json_typeof(j)) {
    case JSON_OBJECT: {
      jv d = jv_dict(a, json_object_size(j));
      if (d.t != JV_DICT) return d;
      const char *k;
      json_t *val;
      json_object_foreach((json_t *)j, k, val) {
        jv key = jv_cstr(a, k);
        jv x = jv_from_json(a, val, depth + 1);
        if (key.t != JV_STR || !jdict_set(a, d.d, key, x)) return jv_undef(NULL);
      }
      return d;
    }
    case JSON_ARRAY: {
      jv l = jv_list(a, json_array_size(j));
      if (l.t != JV_LIST) return l;
      for (size_t i = 0; i < json_array_size(j); i++)
        if (!jlist_push(a, l.l, jv_from_json(a, json_array_get(j, i), depth + 1))) return jv_undef(NULL);
      return l;
    }
    case JSON_STRING: return jv_str(a, json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return jv_int((int64_t)json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_TRUE: return jv_bool(true);
    case JSON_FALSE: return jv_bool(false);
    default: return jv_none();
  }
}
