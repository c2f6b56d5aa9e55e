/* json_schema.c — JSON Schema → GBNF (see json_schema.h). Walks the schema,
 * writes one rule per schema node (named after its path), shared rules for
 * the JSON primitives, and the translations of integer ranges, string
 * formats and regular-expression patterns. Knows nothing of tokens or of
 * how the grammar is matched. */
#include "structured/json_schema.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/utf8.h"
#include "base/vec.h"

/* appends a string literal */
#define hbuf_lit(b, s) hbuf_append((b), (s), sizeof(s) - 1)

#define MAX_DIGITS 16
#define MAX_NODES 10000  /* schema nodes compiled (bounds $ref expansion too) */
#define MAX_REPEAT 4096  /* minItems / maxItems / minLength / maxLength */
#define MAX_DEPTH 64     /* schemas nested in schemas (properties, items, anyOf, ...) */

typedef struct ref_entry {
  char *ref;  /* owned */
  char *rule; /* owned */
} ref_entry;

typedef struct ctx {
  hbuf *out;
  const json_t *doc;
  herr *err;
  int rc;
  int n_nodes;
  int depth;     /* gen calls open */
  unsigned prim; /* primitives already written */
  ref_entry *refs;
  size_t n_refs, cap_refs;
  char **names;   /* rule names used */
  size_t n_names, cap_names;
} ctx;

enum { P_WS = 1, P_STRING = 2, P_CHAR = 4, P_NUMBER = 8, P_INTEGER = 16, P_BOOL = 32, P_NULL = 64, P_VALUE = 128,
       P_OBJECT = 256, P_ARRAY = 512 };

static int cfail(ctx *c, int code, const char *fmt, const char *a, const char *b) {
  if (!c->rc) {
    char msg[256];
    snprintf(msg, sizeof msg, fmt, a ? a : "", b ? b : "");
    c->rc = herr_set(c->err, code, "json_schema: %s", msg);
  }
  return c->rc;
}

static void put(ctx *c, const char *s) { hbuf_append(c->out, s, strlen(s)); }

/* A GBNF string literal for bytes s[0..n). */
static void put_literal(hbuf *o, const char *s, size_t n) {
  hbuf_putc(o, '"');
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '"' || ch == '\\') {
      hbuf_putc(o, '\\');
      hbuf_putc(o, (char)ch);
    } else if (ch < 0x20 || ch == 0x7f) {
      char e[8];
      snprintf(e, sizeof e, "\\x%02X", ch);
      hbuf_append(o, e, strlen(e));
    } else {
      hbuf_putc(o, (char)ch);
    }
  }
  hbuf_putc(o, '"');
}

/* A JSON value's compact text as a GBNF literal. */
static int put_json_literal(ctx *c, const json_t *v) {
  char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  if (!s) return cfail(c, HEARTH_ENOMEM, "out of memory", NULL, NULL);
  put_literal(c->out, s, strlen(s));
  free(s);
  return 0;
}

static void primitives(ctx *c, unsigned want) {
  if (want & (P_VALUE | P_OBJECT | P_ARRAY)) want |= P_VALUE | P_OBJECT | P_ARRAY | P_STRING | P_NUMBER | P_BOOL | P_NULL | P_WS;
  if (want & P_STRING) want |= P_CHAR;
  want &= ~c->prim;
  c->prim |= want;
  if (want & P_WS) put(c, "ws ::= ( \" \" | \"\\n\" )?\n"); /* compact: one space or one newline at most */
  if (want & P_CHAR) put(c, "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n");
  if (want & P_STRING) put(c, "string ::= \"\\\"\" char* \"\\\"\"\n");
  if (want & P_INTEGER) put(c, "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n");
  if (want & P_NUMBER)
    put(c, "number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?\n");
  if (want & P_BOOL) put(c, "boolean ::= \"true\" | \"false\"\n");
  if (want & P_NULL) put(c, "null ::= \"null\"\n");
  if (want & P_VALUE) {
    put(c, "value ::= object | array | string | number | boolean | null\n");
    put(c, "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? \"}\"\n");
    put(c, "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n");
  }
}

/* A fresh rule name from a hint (letters, digits and '-' kept). Owned by c. */
static const char *fresh_name(ctx *c, const char *hint) {
  char base[48];
  size_t k = 0;
  for (const char *h = hint; *h && k < 40; h++) {
    char ch = *h;
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')) base[k++] = ch;
    else if (k && base[k - 1] != '-') base[k++] = '-';
  }
  while (k && base[k - 1] == '-') k--;
  if (!k) memcpy(base, "s", 2), k = 1;
  base[k] = 0;
  static const char *reserved[] = {"ws", "char", "string", "integer", "number", "boolean", "null", "value", "object", "array", "root"};
  char name[64];
  for (int n = 0;; n++) {
    if (n) snprintf(name, sizeof name, "%s-%d", base, n);
    else snprintf(name, sizeof name, "%s", base);
    bool used = false;
    for (size_t i = 0; i < sizeof reserved / sizeof *reserved && !used; i++) used = !strcmp(reserved[i], name);
    for (size_t i = 0; i < c->n_names && !used; i++) used = !strcmp(c->names[i], name);
    if (!used) break;
  }
  if (c->n_names == c->cap_names && !HGROW(c->names, c->cap_names, c->n_names + 1)) return NULL;
  c->names[c->n_names] = strdup(name);
  return c->names[c->n_names] ? c->names[c->n_names++] : NULL;
}

/* ---- integers ---- */

static void put_digits_class(hbuf *o, int lo, int hi) {
  char b[16];
  if (lo == hi) snprintf(b, sizeof b, "[%d]", lo);
  else snprintf(b, sizeof b, "[%d-%d]", lo, hi);
  hbuf_append(o, b, strlen(b));
}

/* Numbers with exactly the digits of a..b (same length, as strings). */
static void same_len_range(hbuf *o, const char *a, const char *b, size_t n) {
  if (n == 0) {
    hbuf_lit(o, "\"\"");
    return;
  }
  if (a[0] == b[0]) {
    hbuf_putc(o, '"');
    hbuf_putc(o, a[0]);
    hbuf_lit(o, "\" ");
    hbuf_putc(o, '(');
    same_len_range(o, a + 1, b + 1, n - 1);
    hbuf_putc(o, ')');
    return;
  }
  char nines[24], zeros[24];
  memset(nines, '9', n - 1);
  memset(zeros, '0', n - 1);
  bool a_low = !memcmp(a + 1, zeros, n - 1), b_high = !memcmp(b + 1, nines, n - 1);
  int lo = a[0] - '0', hi = b[0] - '0';
  hbuf_putc(o, '(');
  bool first = true;
  if (!a_low) {
    hbuf_putc(o, '"');
    hbuf_putc(o, a[0]);
    hbuf_lit(o, "\" (");
    same_len_range(o, a + 1, nines, n - 1);
    hbuf_putc(o, ')');
    first = false;
    lo++;
  }
  int top = b_high ? hi : hi - 1;
  if (lo <= top) {
    if (!first) hbuf_lit(o, " | ");
    put_digits_class(o, lo, top);
    if (n > 1) {
      char r[24];
      snprintf(r, sizeof r, " [0-9]{%zu}", n - 1);
      hbuf_append(o, r, strlen(r));
    }
    first = false;
  }
  if (!b_high) {
    if (!first) hbuf_lit(o, " | ");
    hbuf_putc(o, '"');
    hbuf_putc(o, b[0]);
    hbuf_lit(o, "\" (");
    same_len_range(o, zeros, b + 1, n - 1);
    hbuf_putc(o, ')');
  }
  hbuf_putc(o, ')');
}

/* Non-negative integers in [lo, hi] without leading zeros; hi < 0: unbounded (up to MAX_DIGITS digits). */
static void uint_range(hbuf *o, int64_t lo, int64_t hi) {
  char a[24], b[24];
  snprintf(a, sizeof a, "%" PRId64, lo);
  size_t la = strlen(a), lb = MAX_DIGITS;
  if (hi >= 0) {
    snprintf(b, sizeof b, "%" PRId64, hi);
    lb = strlen(b);
  }
  hbuf_putc(o, '(');
  bool first = true;
  for (size_t d = la; d <= lb; d++) {
    char from[24], to[24];
    if (d == la) memcpy(from, a, la + 1);
    else {
      from[0] = '1';
      memset(from + 1, '0', d - 1);
      from[d] = 0;
    }
    if (hi >= 0 && d == lb) memcpy(to, b, lb + 1);
    else {
      memset(to, '9', d);
      to[d] = 0;
    }
    if (!first) hbuf_lit(o, " | ");
    first = false;
    if (d == 1 && from[0] == '0' && to[0] == '0') hbuf_lit(o, "\"0\"");
    else same_len_range(o, from, to, d);
  }
  hbuf_putc(o, ')');
}

/* Integers in [lo, hi] (INT64_MIN / INT64_MAX: unbounded). */
static void int_range(hbuf *o, int64_t lo, int64_t hi) {
  bool first = true;
  hbuf_putc(o, '(');
  if (lo < 0) {
    /* magnitudes in [max(1, -hi), -lo] */
    int64_t mlo = hi < 0 ? -hi : 1, mhi = lo == INT64_MIN ? -1 : -lo;
    hbuf_lit(o, "\"-\" ");
    uint_range(o, mlo, mhi);
    first = false;
  }
  if (hi >= 0) {
    if (!first) hbuf_lit(o, " | ");
    uint_range(o, lo < 0 ? 0 : lo, hi == INT64_MAX ? -1 : hi);
  }
  hbuf_putc(o, ')');
}

static bool get_bound(const json_t *s, const char *key, double *v) {
  const json_t *j = json_object_get(s, key);
  if (!json_is_number(j)) return false;
  *v = json_number_value(j);
  return isfinite(*v);
}

/* [lo, hi] as integers from minimum / maximum / exclusive*; false when empty. */
static bool int_bounds(const json_t *s, bool integral, int64_t *lo, int64_t *hi) {
  double v;
  const double lim = 9e15;
  *lo = INT64_MIN, *hi = INT64_MAX;
  if (get_bound(s, "minimum", &v)) *lo = v < -lim ? INT64_MIN : (int64_t)ceil(v);
  if (get_bound(s, "exclusiveMinimum", &v)) {
    int64_t x = v < -lim ? INT64_MIN : (int64_t)floor(v) + 1;
    if (x > *lo) *lo = x;
  }
  if (json_is_true(json_object_get(s, "exclusiveMinimum")) && get_bound(s, "minimum", &v) && *lo == (int64_t)v) (*lo)++;
  if (get_bound(s, "maximum", &v)) *hi = v > lim ? INT64_MAX : (int64_t)floor(v);
  if (get_bound(s, "exclusiveMaximum", &v)) {
    int64_t x = v > lim ? INT64_MAX : (int64_t)ceil(v) - 1;
    if (x < *hi) *hi = x;
  }
  if (json_is_true(json_object_get(s, "exclusiveMaximum")) && get_bound(s, "maximum", &v) && *hi == (int64_t)v) (*hi)--;
  (void)integral;
  return *lo <= *hi;
}

static bool has_bounds(const json_t *s) {
  return json_object_get(s, "minimum") || json_object_get(s, "maximum") || json_object_get(s, "exclusiveMinimum") ||
         json_object_get(s, "exclusiveMaximum");
}

/* ---- strings ---- */

static const char *format_body(const char *f) {
  static const char date[] = "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] )";
  static const char tm[] =
      "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )? "
      "( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )";
  static const char date_time[] =
      "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) \"T\" "
      "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )? "
      "( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )";
  static const char uuid[] =
      "[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12}";
  static const char email[] = "[a-zA-Z0-9._+-]{1,32} \"@\" [a-zA-Z0-9] [a-zA-Z0-9-]{0,30} ( \".\" [a-zA-Z]{2,8} ){1,2}";
  if (!strcmp(f, "date")) return date;
  if (!strcmp(f, "time")) return tm;
  if (!strcmp(f, "date-time")) return date_time;
  if (!strcmp(f, "uuid")) return uuid;
  if (!strcmp(f, "email")) return email;
  return NULL;
}

/* -- a regular-expression subset, translated to GBNF over JSON string content -- */

typedef struct rx {
  const char *s, *end;
  hbuf *o;
  ctx *c;
  int depth;
} rx;

static int rx_fail(rx *r, const char *what) {
  return cfail(r->c, HEARTH_EUNSUPPORTED, "pattern: %s is not supported", what, NULL);
}

/* one code point as GBNF matching its JSON-escaped form inside a string */
static void rx_put_cp(hbuf *o, uint32_t cp) {
  char u[8];
  if (cp == '"') hbuf_lit(o, "\"\\\\\\\"\""); /* GBNF "\\\"" */
  else if (cp == '\\') hbuf_lit(o, "\"\\\\\\\\\"");
  else if (cp < 0x20) {
    static const char *named[] = {[8] = "b", [9] = "t", [10] = "n", [12] = "f", [13] = "r"};
    char b[32];
    if (cp < sizeof named / sizeof *named && named[cp]) snprintf(b, sizeof b, "\"\\\\%s\"", named[cp]);
    else snprintf(b, sizeof b, "\"\\\\u%04X\"", cp);
    hbuf_append(o, b, strlen(b));
  } else {
    int l = utf8_encode(cp, u);
    hbuf_putc(o, '"');
    hbuf_append(o, u, (size_t)l);
    hbuf_putc(o, '"');
  }
}

static void class_put_cp(hbuf *o, uint32_t cp) {
  char b[16];
  if (cp == ']' || cp == '\\' || cp == '^' || cp == '-' || cp == '"' || cp < 0x20 || cp == 0x7f) {
    snprintf(b, sizeof b, "\\x%02X", cp);
    if (cp > 0xff) snprintf(b, sizeof b, "\\u%04X", cp);
    hbuf_append(o, b, strlen(b));
  } else {
    int l = utf8_encode(cp, b);
    hbuf_append(o, b, (size_t)l);
  }
}

typedef struct cls {
  uint32_t lo[64], hi[64];
  int n;
  bool neg;
} cls;

static bool cls_add(cls *k, uint32_t lo, uint32_t hi) {
  if (k->n == 64) return false;
  k->lo[k->n] = lo, k->hi[k->n++] = hi;
  return true;
}

/* a class (as ranges) in GBNF over JSON string content: unescaped characters
 * in one class, and '"', '\\' and control characters as their escapes */
static void cls_put(hbuf *o, const cls *k) {
  hbuf_lit(o, "( [");
  if (k->neg) {
    hbuf_putc(o, '^');
    for (int i = 0; i < k->n; i++) {
      class_put_cp(o, k->lo[i]);
      if (k->hi[i] != k->lo[i]) hbuf_putc(o, '-'), class_put_cp(o, k->hi[i]);
    }
    hbuf_lit(o, "\"\\\\\\x00-\\x1F]");
    /* escapes of '"' and '\\' when the class does not exclude them */
    bool has_q = false, has_b = false;
    for (int i = 0; i < k->n; i++) {
      has_q |= k->lo[i] <= '"' && k->hi[i] >= '"';
      has_b |= k->lo[i] <= '\\' && k->hi[i] >= '\\';
    }
    if (!has_q) hbuf_lit(o, " | \"\\\\\\\"\"");
    if (!has_b) hbuf_lit(o, " | \"\\\\\\\\\"");
    hbuf_lit(o, " )");
    return;
  }
  bool any = false, has_q = false, has_b = false;
  hbuf tmp = {0};
  for (int i = 0; i < k->n; i++) {
    uint32_t lo = k->lo[i], hi = k->hi[i];
    has_q |= lo <= '"' && hi >= '"';
    has_b |= lo <= '\\' && hi >= '\\';
    /* split around control characters, '"' and '\\' */
    static const uint32_t cuts[][2] = {{0, 0x1f}, {'"', '"'}, {'\\', '\\'}};
    uint32_t x = lo;
    while (x <= hi) {
      int in_cut = -1;
      for (int c = 0; c < 3; c++)
        if (x >= cuts[c][0] && x <= cuts[c][1]) in_cut = c;
      if (in_cut >= 0) {
        if (cuts[in_cut][1] >= hi) break;
        x = cuts[in_cut][1] + 1;
        continue;
      }
      uint32_t stop = hi;
      for (int c = 0; c < 3; c++)
        if (cuts[c][0] > x && cuts[c][0] - 1 < stop) stop = cuts[c][0] - 1;
      class_put_cp(&tmp, x);
      if (stop != x) hbuf_putc(&tmp, '-'), class_put_cp(&tmp, stop);
      any = true;
      if (stop >= hi) break;
      x = stop + 1;
    }
  }
  if (any) hbuf_append(o, hbuf_str(&tmp), tmp.len);
  else hbuf_lit(o, "\\x00"); /* never a valid unescaped char in a string: an empty class */
  hbuf_free(&tmp);
  hbuf_putc(o, ']');
  if (has_q) hbuf_lit(o, " | \"\\\\\\\"\"");
  if (has_b) hbuf_lit(o, " | \"\\\\\\\\\"");
  hbuf_lit(o, " )");
}

static bool shorthand(cls *k, char e) {
  switch (e) {
    case 'd': return cls_add(k, '0', '9');
    case 'w': return cls_add(k, 'a', 'z') && cls_add(k, 'A', 'Z') && cls_add(k, '0', '9') && cls_add(k, '_', '_');
    case 's': return cls_add(k, ' ', ' ') && cls_add(k, '\t', '\r');
    default: return false;
  }
}

static int rx_char(rx *r, uint32_t *cp) {
  int l = utf8_decode(r->s, (size_t)(r->end - r->s), cp);
  if (l <= 0) return rx_fail(r, "invalid UTF-8");
  r->s += l;
  return 0;
}

static int rx_escape_cp(rx *r, char e, uint32_t *cp) {
  switch (e) {
    case 'n': *cp = '\n'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    default:
      if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')) {
        char w[4] = {'\\', e, 0};
        return rx_fail(r, w);
      }
      *cp = (uint32_t)(unsigned char)e;
      return 0;
  }
}

static int rx_alts(rx *r);

static int rx_atom(rx *r) {
  char ch = *r->s;
  if (ch == '(') {
    r->s++;
    if (r->end - r->s >= 2 && r->s[0] == '?') {
      if (r->s[1] != ':') return rx_fail(r, "a group with (? other than (?:");
      r->s += 2;
    }
    if (++r->depth > 64) return rx_fail(r, "nesting this deep");
    hbuf_lit(r->o, "( ");
    if (rx_alts(r)) return r->c->rc;
    if (r->s >= r->end || *r->s != ')') return rx_fail(r, "an unbalanced '('");
    r->s++;
    r->depth--;
    hbuf_lit(r->o, " )");
    return 0;
  }
  if (ch == '[') {
    r->s++;
    cls k = {0};
    if (r->s < r->end && *r->s == '^') k.neg = true, r->s++;
    bool first = true;
    while (r->s < r->end && (*r->s != ']' || first)) {
      first = false;
      uint32_t a, b;
      if (*r->s == '\\') {
        if (r->s + 1 >= r->end) return rx_fail(r, "a trailing backslash");
        char e = r->s[1];
        r->s += 2;
        if (e == 'd' || e == 'w' || e == 's') {
          if (!shorthand(&k, e)) return rx_fail(r, "a class this large");
          continue;
        }
        if (rx_escape_cp(r, e, &a)) return r->c->rc;
      } else if (rx_char(r, &a)) {
        return r->c->rc;
      }
      b = a;
      if (r->end - r->s >= 2 && *r->s == '-' && r->s[1] != ']') {
        r->s++;
        if (*r->s == '\\') {
          if (r->s + 1 >= r->end) return rx_fail(r, "a trailing backslash");
          char e = r->s[1];
          r->s += 2;
          if (rx_escape_cp(r, e, &b)) return r->c->rc;
        } else if (rx_char(r, &b)) {
          return r->c->rc;
        }
        if (b < a) return rx_fail(r, "a backwards range");
      }
      if (!cls_add(&k, a, b)) return rx_fail(r, "a class this large");
    }
    if (r->s >= r->end) return rx_fail(r, "an unterminated class");
    r->s++;
    cls_put(r->o, &k);
    return 0;
  }
  if (ch == '.') {
    r->s++;
    hbuf_lit(r->o, "( [^\"\\\\\\x00-\\x1F] | \"\\\\\\\"\" | \"\\\\\\\\\" )");
    return 0;
  }
  if (ch == '\\') {
    if (r->s + 1 >= r->end) return rx_fail(r, "a trailing backslash");
    char e = r->s[1];
    r->s += 2;
    cls k = {0};
    if (e == 'd' || e == 'w' || e == 's' || e == 'D' || e == 'W' || e == 'S') {
      shorthand(&k, (char)(e | 0x20));
      k.neg = e >= 'A' && e <= 'Z';
      cls_put(r->o, &k);
      return 0;
    }
    uint32_t cp;
    if (rx_escape_cp(r, e, &cp)) return r->c->rc;
    rx_put_cp(r->o, cp);
    return 0;
  }
  if (ch == '^' || ch == '$') return rx_fail(r, "an anchor inside the pattern");
  if (ch == '*' || ch == '+' || ch == '?' || ch == '{') return rx_fail(r, "a quantifier that follows nothing");
  uint32_t cp;
  if (rx_char(r, &cp)) return r->c->rc;
  rx_put_cp(r->o, cp);
  return 0;
}

static int rx_seq(rx *r) {
  bool any = false;
  while (r->s < r->end && *r->s != '|' && *r->s != ')') {
    if (*r->s == '$' && r->s + 1 == r->end) break;
    if (any) hbuf_putc(r->o, ' ');
    hbuf_lit(r->o, "( ");
    if (rx_atom(r)) return r->c->rc;
    hbuf_lit(r->o, " )");
    any = true;
    if (r->s < r->end && (*r->s == '*' || *r->s == '+' || *r->s == '?')) {
      hbuf_putc(r->o, *r->s);
      r->s++;
    } else if (r->s < r->end && *r->s == '{') {
      const char *q = r->s + 1;
      long m = 0, n = -1;
      if (q >= r->end || *q < '0' || *q > '9') return rx_fail(r, "a '{' that is not a repetition");
      for (; q < r->end && *q >= '0' && *q <= '9'; q++)
        if (m <= MAX_REPEAT) m = m * 10 + (*q - '0');
      if (q < r->end && *q == ',') {
        q++;
        if (q < r->end && *q >= '0' && *q <= '9') {
          n = 0;
          for (; q < r->end && *q >= '0' && *q <= '9'; q++)
            if (n <= MAX_REPEAT) n = n * 10 + (*q - '0');
        }
      } else {
        n = m;
      }
      if (q >= r->end || *q != '}' || m > MAX_REPEAT || n > MAX_REPEAT || (n >= 0 && n < m))
        return rx_fail(r, "this repetition");
      char b[48];
      if (n < 0) snprintf(b, sizeof b, "{%ld,}", m);
      else snprintf(b, sizeof b, "{%ld,%ld}", m, n);
      hbuf_append(r->o, b, strlen(b));
      r->s = q + 1;
    }
    if (r->s < r->end && *r->s == '?') r->s++; /* lazy: the same language */
  }
  if (!any) hbuf_lit(r->o, "\"\"");
  return 0;
}

static int rx_alts(rx *r) {
  for (;;) {
    if (rx_seq(r)) return r->c->rc;
    if (r->s < r->end && *r->s == '|') {
      hbuf_lit(r->o, " | ");
      r->s++;
      continue;
    }
    return 0;
  }
}

static int put_pattern(ctx *c, const char *pat, size_t n) {
  rx r = {.s = pat, .end = pat + n, .o = c->out, .c = c};
  bool start = n && pat[0] == '^';
  bool end = n && pat[n - 1] == '$' && !(n >= 2 && pat[n - 2] == '\\');
  if (start) r.s++;
  hbuf_lit(c->out, "\"\\\"\" ");
  if (!start) hbuf_lit(c->out, "char* ");
  hbuf_lit(c->out, "( ");
  if (rx_alts(&r)) return c->rc;
  if (r.s < r.end && *r.s == ')') return rx_fail(&r, "an unbalanced ')'");
  if (r.s < r.end && !(end && r.s + 1 == r.end)) return rx_fail(&r, "this construct");
  hbuf_lit(c->out, " )");
  if (!end) hbuf_lit(c->out, " char*");
  hbuf_lit(c->out, " \"\\\"\"");
  return 0;
}

/* ---- schemas ---- */

static int gen(ctx *c, const json_t *s, const char *hint, const char **name);

static const json_t *resolve_ref(ctx *c, const char *ref) {
  if (ref[0] != '#') return NULL;
  const json_t *at = c->doc;
  const char *p = ref + 1;
  if (*p == 0) return at;
  if (*p != '/') return NULL;
  while (*p == '/' && at) {
    p++;
    char seg[256];
    size_t k = 0;
    while (*p && *p != '/' && k < sizeof seg - 1) {
      if (*p == '~' && p[1] == '0') seg[k++] = '~', p += 2;
      else if (*p == '~' && p[1] == '1') seg[k++] = '/', p += 2;
      else seg[k++] = *p++;
    }
    seg[k] = 0;
    if (json_is_object(at)) at = json_object_get(at, seg);
    else if (json_is_array(at)) at = json_array_get(at, (size_t)strtoul(seg, NULL, 10));
    else at = NULL;
  }
  return *p ? NULL : at;
}

static int gen_ref(ctx *c, const char *ref, const char **name) {
  for (size_t i = 0; i < c->n_refs; i++)
    if (!strcmp(c->refs[i].ref, ref)) {
      *name = c->refs[i].rule;
      return 0;
    }
  const json_t *target = resolve_ref(c, ref);
  if (!target) return cfail(c, HEARTH_EUNSUPPORTED, "$ref '%.100s' does not point into this schema", ref, NULL);
  /* name first, so a recursive reference finds it */
  const char *slash = strrchr(ref, '/');
  const char *rule = fresh_name(c, slash ? slash + 1 : "root-ref");
  if (!rule) return cfail(c, HEARTH_ENOMEM, "out of memory", NULL, NULL);
  if (c->n_refs == c->cap_refs && !HGROW(c->refs, c->cap_refs, c->n_refs + 1)) return cfail(c, HEARTH_ENOMEM, "out of memory", NULL, NULL);
  c->refs[c->n_refs].ref = strdup(ref);
  c->refs[c->n_refs].rule = strdup(rule);
  if (!c->refs[c->n_refs].ref || !c->refs[c->n_refs].rule) return cfail(c, HEARTH_ENOMEM, "out of memory", NULL, NULL);
  c->n_refs++;
  const char *body;
  if (gen(c, target, rule, &body)) return c->rc;
  put(c, rule);
  put(c, " ::= ");
  put(c, body);
  put(c, "\n");
  *name = rule;
  return 0;
}

/* Writes `name ::= ` for a new rule and returns the name; the caller writes the body and "\n". */
static const char *open_rule(ctx *c, const char *hint) {
  const char *n = fresh_name(c, hint);
  if (!n) {
    cfail(c, HEARTH_ENOMEM, "out of memory", NULL, NULL);
    return NULL;
  }
  return n;
}

/* Keywords that would narrow the output but are not compiled. */
static int refuse_unknown(ctx *c, const json_t *s) {
  static const char *refused[] = {"multipleOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
                                  "patternProperties", "propertyNames", "unevaluatedProperties", "unevaluatedItems",
                                  "contains", "minContains", "maxContains", "minProperties", "maxProperties",
                                  "contentMediaType", "contentEncoding", "$dynamicRef", "$recursiveRef"};
  for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
    if (json_object_get(s, refused[i])) return cfail(c, HEARTH_EUNSUPPORTED, "the keyword '%s' is not supported", refused[i], NULL);
  if (json_is_true(json_object_get(s, "uniqueItems")))
    return cfail(c, HEARTH_EUNSUPPORTED, "the keyword '%s' is not supported", "uniqueItems", NULL);
  return 0;
}

static int gen_object(ctx *c, const json_t *s, const char *rule, hbuf *body) {
  const json_t *props = json_object_get(s, "properties");
  const json_t *req = json_object_get(s, "required");
  const json_t *addl = json_object_get(s, "additionalProperties");
  if (props && !json_is_object(props)) return cfail(c, HEARTH_EINVAL, "'properties' must be an object", NULL, NULL);
  if (req && !json_is_array(req)) return cfail(c, HEARTH_EINVAL, "'required' must be an array", NULL, NULL);
  size_t n = props ? json_object_size(props) : 0;
  /* required names must be declared (or additional properties allowed) */
  for (size_t i = 0; req && i < json_array_size(req); i++) {
    const char *r = json_string_value(json_array_get(req, i));
    if (!r) return cfail(c, HEARTH_EINVAL, "'required' must hold strings", NULL, NULL);
    if (!props || !json_object_get(props, r))
      return cfail(c, HEARTH_EUNSUPPORTED, "required property '%.80s' has no schema under 'properties'", r, NULL);
  }
  if (n == 0) {
    if (json_is_false(addl)) {
      hbuf_lit(body, "\"{\" ws \"}\"");
      return 0;
    }
    if (!addl || json_is_true(addl) || (json_is_object(addl) && json_object_size(addl) == 0)) {
      primitives(c, P_VALUE);
      hbuf_lit(body, "object");
      return 0;
    }
    const char *vname;
    char hint[80];
    snprintf(hint, sizeof hint, "%s-additional", rule);
    if (gen(c, addl, hint, &vname)) return c->rc;
    primitives(c, P_STRING | P_WS);
    char b[512];
    snprintf(b, sizeof b, "\"{\" ws ( string ws \":\" ws %s ws ( \",\" ws string ws \":\" ws %s ws )* )? \"}\"", vname, vname);
    hbuf_append(body, b, strlen(b));
    return 0;
  }
  primitives(c, P_WS);
  /* each property: kv rule */
  const char **kv = calloc(n, sizeof *kv);
  bool *required = calloc(n, sizeof *required);
  if (!kv || !required) {
    free(kv);
    free(required);
    return cfail(c, HEARTH_ENOMEM, "out of memory", NULL, NULL);
  }
  size_t i = 0;
  const char *key;
  const json_t *sub;
  json_object_foreach((json_t *)props, key, sub) {
    char hint[120];
    snprintf(hint, sizeof hint, "%s-%s", rule, key);
    const char *vname;
    if (gen(c, sub, hint, &vname)) break;
    const char *kvname = open_rule(c, hint);
    if (!kvname) break;
    hbuf line = {0};
    hbuf_append(&line, kvname, strlen(kvname));
    hbuf_lit(&line, "_kv ::= ");
    json_t *k = json_string(key);
    char *ks = k ? json_dumps(k, JSON_ENCODE_ANY) : NULL;
    json_decref(k);
    if (!ks) {
      hbuf_free(&line);
      cfail(c, HEARTH_ENOMEM, "out of memory", NULL, NULL);
      break;
    }
    put_literal(&line, ks, strlen(ks));
    free(ks);
    hbuf_lit(&line, " ws \":\" ws ");
    hbuf_append(&line, vname, strlen(vname));
    hbuf_lit(&line, " ws\n");
    hbuf_append(c->out, hbuf_str(&line), line.len);
    hbuf_free(&line);
    kv[i] = kvname;
    for (size_t r = 0; req && r < json_array_size(req); r++)
      if (!strcmp(json_string_value(json_array_get(req, r)), key)) required[i] = true;
    i++;
  }
  if (c->rc) {
    free(kv);
    free(required);
    return c->rc;
  }
  /* extra properties */
  const char *extra = NULL;
  if (json_is_true(addl) || (json_is_object(addl) && json_object_size(addl) == 0)) {
    primitives(c, P_VALUE);
    extra = "value";
  } else if (json_is_object(addl)) {
    char hint[80];
    snprintf(hint, sizeof hint, "%s-additional", rule);
    if (gen(c, addl, hint, &extra)) {
      free(kv);
      free(required);
      return c->rc;
    }
  }
  /* the members: S(i, emitted) as rules rule-mI-E (E: something before, so a comma comes first) */
  hbuf line = {0};
  for (size_t k = n + 1; k-- > 0;) {
    for (int e = 0; e < 2; e++) {
      char nm[160];
      snprintf(nm, sizeof nm, "%s_m%zu_%d", rule, k, e);
      hbuf_append(&line, nm, strlen(nm));
      hbuf_lit(&line, " ::= ");
      if (k == n) {
        if (extra) {
          char b[400];
          primitives(c, P_STRING);
          if (e) snprintf(b, sizeof b, "( \",\" ws string ws \":\" ws %s ws )*", extra);
          else snprintf(b, sizeof b, "( string ws \":\" ws %s ws ( \",\" ws string ws \":\" ws %s ws )* )?", extra, extra);
          hbuf_append(&line, b, strlen(b));
        } else {
          hbuf_lit(&line, "\"\"");
        }
      } else {
        char b[400];
        snprintf(b, sizeof b, "%s%s_kv %s_m%zu_1", e ? "\",\" ws " : "", kv[k], rule, k + 1);
        hbuf_append(&line, b, strlen(b));
        if (!required[k]) {
          snprintf(b, sizeof b, " | %s_m%zu_%d", rule, k + 1, e);
          hbuf_append(&line, b, strlen(b));
        }
      }
      hbuf_putc(&line, '\n');
    }
  }
  hbuf_append(c->out, hbuf_str(&line), line.len);
  hbuf_free(&line);
  char b[200];
  snprintf(b, sizeof b, "\"{\" ws %s_m0_0 \"}\"", rule);
  hbuf_append(body, b, strlen(b));
  free(kv);
  free(required);
  return 0;
}

static int get_count(ctx *c, const json_t *s, const char *key, int64_t dflt, int64_t *out) {
  const json_t *v = json_object_get(s, key);
  *out = dflt;
  if (!v) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < 0) return cfail(c, HEARTH_EINVAL, "'%s' must be a non-negative integer", key, NULL);
  if (json_integer_value(v) > MAX_REPEAT) return cfail(c, HEARTH_EUNSUPPORTED, "'%s' above 4096", key, NULL);
  *out = json_integer_value(v);
  return 0;
}

static int gen_array(ctx *c, const json_t *s, const char *rule, hbuf *body) {
  const json_t *items = json_object_get(s, "items");
  const json_t *prefix = json_object_get(s, "prefixItems");
  if (json_is_array(items) && !prefix) prefix = items, items = json_object_get(s, "additionalItems"); /* draft 4-7 tuples */
  int64_t lo, hi;
  if (get_count(c, s, "minItems", 0, &lo) || get_count(c, s, "maxItems", -1, &hi)) return c->rc;
  if (hi >= 0 && hi < lo) return cfail(c, HEARTH_EINVAL, "maxItems is below minItems", NULL, NULL);
  primitives(c, P_WS);
  size_t np = json_is_array(prefix) ? json_array_size(prefix) : 0;
  const char *item = NULL;
  if (json_is_false(items)) {
    item = NULL;
  } else if (!items || json_is_true(items) || (json_is_object(items) && json_object_size(items) == 0)) {
    primitives(c, P_VALUE);
    item = "value";
  } else {
    char hint[120];
    snprintf(hint, sizeof hint, "%s-item", rule);
    if (gen(c, items, hint, &item)) return c->rc;
  }
  /* elements: the tuple part, then repeated items; counts within [lo, hi] */
  hbuf seq = {0};
  hbuf_lit(&seq, "\"[\" ws ");
  size_t open = 0;
  int64_t at = 0;
  for (size_t i = 0; i < np; i++) {
    if (hi >= 0 && at >= hi) break;
    char hint[120];
    snprintf(hint, sizeof hint, "%s-%zu", rule, i);
    const char *nm;
    if (gen(c, json_array_get(prefix, i), hint, &nm)) {
      hbuf_free(&seq);
      return c->rc;
    }
    bool optional = at >= lo;
    if (optional) hbuf_lit(&seq, "( "), open++;
    if (i) hbuf_lit(&seq, "\",\" ws ");
    hbuf_append(&seq, nm, strlen(nm));
    hbuf_lit(&seq, " ws ");
    at++;
  }
  if (item && (hi < 0 || at < hi)) {
    int64_t need = lo > at ? lo - at : 0;
    char b[256];
    const char *sep = at ? "\",\" ws " : "";
    if (need > 0) {
      /* first item, then need-1 more, then up to hi-lo optional */
      snprintf(b, sizeof b, "%s%s ws ", sep, item);
      hbuf_append(&seq, b, strlen(b));
      if (need > 1) {
        snprintf(b, sizeof b, "( \",\" ws %s ws ){%" PRId64 "} ", item, need - 1);
        hbuf_append(&seq, b, strlen(b));
      }
      if (hi < 0) snprintf(b, sizeof b, "( \",\" ws %s ws )* ", item);
      else if (hi > lo) snprintf(b, sizeof b, "( \",\" ws %s ws ){0,%" PRId64 "} ", item, hi - lo);
      else b[0] = 0;
      hbuf_append(&seq, b, strlen(b));
    } else {
      int64_t room = hi < 0 ? -1 : hi - at;
      if (room != 0) {
        if (room < 0) snprintf(b, sizeof b, "( %s%s ws ( \",\" ws %s ws )* )? ", sep, item, item);
        else if (room == 1) snprintf(b, sizeof b, "( %s%s ws )? ", sep, item);
        else snprintf(b, sizeof b, "( %s%s ws ( \",\" ws %s ws ){0,%" PRId64 "} )? ", sep, item, item, room - 1);
        hbuf_append(&seq, b, strlen(b));
      }
    }
  } else if (!item && at < lo) {
    hbuf_free(&seq);
    return cfail(c, HEARTH_EINVAL, "minItems cannot be met: items is false", NULL, NULL);
  }
  for (size_t i = 0; i < open; i++) hbuf_lit(&seq, ")? ");
  hbuf_lit(&seq, "\"]\"");
  hbuf_append(body, hbuf_str(&seq), seq.len);
  hbuf_free(&seq);
  return 0;
}

static int gen_string(ctx *c, const json_t *s, hbuf *body) {
  const char *fmt = json_string_value(json_object_get(s, "format"));
  const json_t *pat = json_object_get(s, "pattern");
  int64_t lo, hi;
  if (get_count(c, s, "minLength", 0, &lo) || get_count(c, s, "maxLength", -1, &hi)) return c->rc;
  if (hi >= 0 && hi < lo) return cfail(c, HEARTH_EINVAL, "maxLength is below minLength", NULL, NULL);
  primitives(c, P_STRING);
  if (pat) {
    if (!json_is_string(pat)) return cfail(c, HEARTH_EINVAL, "'pattern' must be a string", NULL, NULL);
    if (lo > 0 || hi >= 0) return cfail(c, HEARTH_EUNSUPPORTED, "'pattern' together with minLength / maxLength is not supported", NULL, NULL);
    hbuf_lit(body, "( ");
    hbuf *save = c->out;
    c->out = body;
    int rc = put_pattern(c, json_string_value(pat), json_string_length(pat));
    c->out = save;
    if (rc) return rc;
    hbuf_lit(body, " )");
    return 0;
  }
  const char *f = fmt ? format_body(fmt) : NULL;
  if (f) {
    if (lo > 0 || hi >= 0) return cfail(c, HEARTH_EUNSUPPORTED, "'format' together with minLength / maxLength is not supported", NULL, NULL);
    hbuf_lit(body, "\"\\\"\" ");
    hbuf_append(body, f, strlen(f));
    hbuf_lit(body, " \"\\\"\"");
    return 0;
  }
  if (lo == 0 && hi < 0) {
    hbuf_lit(body, "string");
    return 0;
  }
  char b[96];
  if (hi < 0) snprintf(b, sizeof b, "\"\\\"\" char{%" PRId64 ",} \"\\\"\"", lo);
  else snprintf(b, sizeof b, "\"\\\"\" char{%" PRId64 ",%" PRId64 "} \"\\\"\"", lo, hi);
  hbuf_append(body, b, strlen(b));
  return 0;
}

/* Non-negative decimals whose value is in [a, b] (b < 0: unbounded). */
static void mag_range(hbuf *o, int64_t a, int64_t b) {
  hbuf_lit(o, "( ");
  if (b < 0) {
    uint_range(o, a, -1);
    hbuf_lit(o, " ( \".\" [0-9]{1,16} )?");
  } else {
    if (a < b) {
      uint_range(o, a, b - 1);
      hbuf_lit(o, " ( \".\" [0-9]{1,16} )? | ");
    }
    uint_range(o, b, b);
    hbuf_lit(o, " ( \".\" \"0\"{1,16} )?");
  }
  hbuf_lit(o, " )");
}

static int gen_number(ctx *c, const json_t *s, bool integer, hbuf *body) {
  if (!has_bounds(s)) {
    primitives(c, integer ? P_INTEGER : P_NUMBER);
    hbuf_append(body, integer ? "integer" : "number", integer ? 7 : 6);
    return 0;
  }
  int64_t lo, hi;
  if (!int_bounds(s, integer, &lo, &hi))
    return cfail(c, HEARTH_EUNSUPPORTED, "the bounds of a%s admit no value this grammar can write", integer ? "n integer" : " number", NULL);
  if (integer) {
    int_range(body, lo, hi);
    return 0;
  }
  /* numbers by sign and magnitude: a magnitude in [a, b] is an integer part in
   * [a, b - 1] with any fraction, or b itself with a zero fraction */
  hbuf_lit(body, "( ");
  if (lo < 0) {
    hbuf_lit(body, "\"-\" ");
    mag_range(body, hi < 0 ? -hi : 0, lo == INT64_MIN ? -1 : -lo);
  }
  if (hi >= 0) {
    if (lo < 0) hbuf_lit(body, " | ");
    mag_range(body, lo < 0 ? 0 : lo, hi == INT64_MAX ? -1 : hi);
  }
  hbuf_lit(body, " )");
  return 0;
}

static int gen_typed(ctx *c, const json_t *s, const char *type, const char *rule, hbuf *body) {
  if (!strcmp(type, "object")) return gen_object(c, s, rule, body);
  if (!strcmp(type, "array")) return gen_array(c, s, rule, body);
  if (!strcmp(type, "string")) return gen_string(c, s, body);
  if (!strcmp(type, "integer")) return gen_number(c, s, true, body);
  if (!strcmp(type, "number")) return gen_number(c, s, false, body);
  if (!strcmp(type, "boolean")) {
    primitives(c, P_BOOL);
    hbuf_lit(body, "boolean");
    return 0;
  }
  if (!strcmp(type, "null")) {
    primitives(c, P_NULL);
    hbuf_lit(body, "null");
    return 0;
  }
  return cfail(c, HEARTH_EINVAL, "unknown type '%.40s'", type, NULL);
}

/* Merges allOf members (objects) into one schema; NULL when they cannot be merged. */
static json_t *merge_all_of(ctx *c, const json_t *s) {
  json_t *m = json_deep_copy(s);
  if (!m) return NULL;
  json_object_del(m, "allOf");
  const json_t *all = json_object_get(s, "allOf");
  size_t i;
  const json_t *part;
  json_array_foreach(all, i, part) {
    const json_t *p = part;
    const char *ref = json_string_value(json_object_get(p, "$ref"));
    if (ref) p = resolve_ref(c, ref);
    if (!json_is_object(p)) {
      json_decref(m);
      return NULL;
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)p, k, v) {
      if (!strcmp(k, "properties") && json_is_object(v)) {
        json_t *dst = json_object_get(m, "properties");
        if (!dst) json_object_set_new(m, "properties", dst = json_object());
        json_object_update(dst, v);
      } else if (!strcmp(k, "required") && json_is_array(v)) {
        json_t *dst = json_object_get(m, "required");
        if (!dst) json_object_set_new(m, "required", dst = json_array());
        json_array_extend(dst, v);
      } else if (!strcmp(k, "allOf") || !strcmp(k, "$ref")) {
        json_decref(m);
        return NULL;
      } else {
        json_t *have = json_object_get(m, k);
        if (have && !json_equal(have, v)) {
          json_decref(m);
          return NULL;
        }
        json_object_set(m, k, v);
      }
    }
  }
  return m;
}

static int gen_node(ctx *c, const json_t *s, const char *hint, const char **name);

/* Compiles schema s into a rule; *name is the rule (owned by c). Nesting
 * deeper than MAX_DEPTH is refused, so compile time stays bounded. */
static int gen(ctx *c, const json_t *s, const char *hint, const char **name) {
  if (c->depth >= MAX_DEPTH)
    return cfail(c, HEARTH_ELIMIT, "the schema nests deeper than 64 levels", NULL, NULL);
  c->depth++;
  int rc = gen_node(c, s, hint, name);
  c->depth--;
  return rc;
}

static int gen_node(ctx *c, const json_t *s, const char *hint, const char **name) {
  if (++c->n_nodes > MAX_NODES) return cfail(c, HEARTH_ELIMIT, "the schema has more than 10000 nodes", NULL, NULL);
  if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
    primitives(c, P_VALUE);
    *name = "value";
    return 0;
  }
  if (json_is_false(s)) return cfail(c, HEARTH_EINVAL, "the schema 'false' admits nothing", NULL, NULL);
  if (!json_is_object(s)) return cfail(c, HEARTH_EINVAL, "a schema must be an object or a boolean", NULL, NULL);
  if (refuse_unknown(c, s)) return c->rc;
  const char *ref = json_string_value(json_object_get(s, "$ref"));
  if (ref) return gen_ref(c, ref, name);
  const char *rule = open_rule(c, hint);
  if (!rule) return c->rc;
  hbuf body = {0};
  const json_t *v;
  bool nullable = json_is_true(json_object_get(s, "nullable"));
  if ((v = json_object_get(s, "const"))) {
    hbuf *save = c->out;
    c->out = &body;
    put_json_literal(c, v);
    c->out = save;
  } else if ((v = json_object_get(s, "enum"))) {
    if (!json_is_array(v) || !json_array_size(v)) {
      hbuf_free(&body);
      return cfail(c, HEARTH_EINVAL, "'enum' must be a non-empty array", NULL, NULL);
    }
    size_t i;
    const json_t *e;
    hbuf *save = c->out;
    c->out = &body;
    json_array_foreach(v, i, e) {
      if (i) put(c, " | ");
      put_json_literal(c, e);
    }
    c->out = save;
  } else if ((v = json_object_get(s, "anyOf")) || (v = json_object_get(s, "oneOf"))) {
    if (!json_is_array(v) || !json_array_size(v)) {
      hbuf_free(&body);
      return cfail(c, HEARTH_EINVAL, "'anyOf' / 'oneOf' must be a non-empty array", NULL, NULL);
    }
    size_t i;
    const json_t *e;
    json_array_foreach(v, i, e) {
      char h[120];
      snprintf(h, sizeof h, "%s-%zu", rule, i);
      const char *nm;
      if (gen(c, e, h, &nm)) break;
      if (i) hbuf_lit(&body, " | ");
      hbuf_append(&body, nm, strlen(nm));
    }
  } else if ((v = json_object_get(s, "allOf"))) {
    json_t *m = json_is_array(v) ? merge_all_of(c, s) : NULL;
    if (!m) {
      hbuf_free(&body);
      return c->rc ? c->rc : cfail(c, HEARTH_EUNSUPPORTED, "this 'allOf' (only object schemas that merge are supported)", NULL, NULL);
    }
    const char *nm;
    char h[120];
    snprintf(h, sizeof h, "%s-all", rule);
    int rc = gen(c, m, h, &nm);
    json_decref(m);
    if (!rc) hbuf_append(&body, nm, strlen(nm));
  } else {
    const json_t *type = json_object_get(s, "type");
    if (json_is_string(type)) {
      gen_typed(c, s, json_string_value(type), rule, &body);
    } else if (json_is_array(type) && json_array_size(type)) {
      size_t i;
      const json_t *t;
      json_array_foreach(type, i, t) {
        if (!json_is_string(t)) {
          cfail(c, HEARTH_EINVAL, "'type' must be a string or an array of strings", NULL, NULL);
          break;
        }
        if (i) hbuf_lit(&body, " | ");
        hbuf_lit(&body, "( ");
        if (gen_typed(c, s, json_string_value(t), rule, &body)) break;
        hbuf_lit(&body, " )");
      }
    } else if (type) {
      cfail(c, HEARTH_EINVAL, "'type' must be a string or an array of strings", NULL, NULL);
    } else if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties") || json_object_get(s, "required")) {
      gen_object(c, s, rule, &body);
    } else if (json_object_get(s, "items") || json_object_get(s, "prefixItems")) {
      gen_array(c, s, rule, &body);
    } else {
      primitives(c, P_VALUE);
      hbuf_lit(&body, "value");
    }
  }
  if (nullable && !c->rc) {
    primitives(c, P_NULL);
    hbuf_lit(&body, " | null");
  }
  if (!c->rc && body.oom) cfail(c, HEARTH_ENOMEM, "out of memory", NULL, NULL);
  if (!c->rc) {
    put(c, rule);
    put(c, " ::= ");
    hbuf_append(c->out, hbuf_str(&body), body.len);
    put(c, "\n");
    *name = rule;
  }
  hbuf_free(&body);
  return c->rc;
}

int json_schema_to_gbnf(const char *schema, size_t len, hbuf *out, herr *err) {
  json_error_t je;
  json_t *doc = json_loadb(schema ? schema : "", schema ? len : 0, JSON_DECODE_ANY, &je);
  if (!doc) return herr_set(err, HEARTH_EINVAL, "json_schema: not JSON: %s", je.text);
  ctx c = {.out = out, .doc = doc, .err = err};
  const char *root = NULL;
  if (!gen(&c, doc, "root-value", &root)) {
    put(&c, "root ::= ");
    put(&c, root);
    put(&c, "\n");
    if (out->oom) cfail(&c, HEARTH_ENOMEM, "out of memory", NULL, NULL);
  }
  for (size_t i = 0; i < c.n_refs; i++) free(c.refs[i].ref), free(c.refs[i].rule);
  free(c.refs);
  for (size_t i = 0; i < c.n_names; i++) free(c.names[i]);
  free(c.names);
  json_decref(doc);
  return c.rc;
}
