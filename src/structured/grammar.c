/* grammar.c — GBNF grammars (see grammar.h): the parser that turns the text
 * into rules of alternatives, the checks (undefined rules, left recursion),
 * the token trie, and the matcher's pushdown automaton with its interned
 * states, byte transitions and token masks. Knows tokens only as byte
 * strings and end ids; knows nothing of sampling or JSON. */
#include "structured/grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/dict.h"
#include "base/hash.h"
#include "base/utf8.h"
#include "base/vec.h"

#define GRAMMAR_MAX_REPEAT 4096     /* {m,n}: n at most this */
#define GRAMMAR_MAX_ELEMS (1 << 22) /* elements after expanding repetitions */
#define GRAMMAR_MAX_STATES 200000   /* interned automaton states per matcher */
#define GRAMMAR_MAX_NODES 2000000   /* interned stack nodes per matcher */
#define GRAMMAR_MAX_DEPTH 512       /* rule expansion depth */

/* ---- compiled form ----
 * Every alternative is a run of elements in elems, closed by E_END. A
 * character element points at a charset: sorted ranges, maybe negated. */
enum { E_END = 0, E_CHARS = 1, E_RULE = 2, E_TOKEN = 3 };

typedef struct g_elem {
  uint32_t kind : 2;
  uint32_t arg : 30; /* E_CHARS: charset; E_RULE: rule; E_TOKEN: token terminal */
} g_elem;

typedef struct g_range {
  uint32_t lo, hi;
} g_range;

typedef struct g_charset {
  uint32_t off, n; /* into ranges */
  bool neg;
} g_charset;

/* A token terminal: one whole token, by id (<[id]>) or by its text (<text>),
 * which the vocabulary resolves. */
typedef struct g_tok {
  int32_t id;  /* -1: by name */
  char *name;  /* owned, or NULL */
} g_tok;

typedef struct g_rule {
  uint32_t first_alt, n_alts; /* into alts */
} g_rule;

struct grammar {
  g_elem *elems;
  size_t n_elems, cap_elems;
  uint32_t *alts; /* start element of each alternative */
  size_t n_alts, cap_alts;
  g_rule *rules;
  size_t n_rules;
  g_range *ranges;
  size_t n_ranges, cap_ranges;
  g_charset *sets;
  size_t n_sets, cap_sets;
  g_tok *toks;
  size_t n_toks, cap_toks;
  uint32_t root;
  uint32_t *rest; /* per element: the fewest characters from it to the end of its alternative */
};

/* ---- building ---- */

typedef struct b_seq {
  g_elem *e;
  size_t n, cap;
} b_seq;

typedef struct b_rule {
  char *name; /* owned; NULL for generated rules */
  b_seq *alts;
  size_t n_alts, cap_alts;
  bool defined;
  int line;   /* first use or definition */
} b_rule;

typedef struct parser {
  const char *s, *end;
  const char *start;
  b_rule *rules;
  size_t n_rules, cap_rules;
  grammar *g; /* charsets go straight here */
  herr *err;
  int rc;
  int depth;
} parser;

static int line_of(const parser *p, const char *at) {
  int line = 1;
  for (const char *c = p->start; c < at && c < p->end; c++) line += *c == '\n';
  return line;
}

static int fail(parser *p, const char *at, const char *fmt, const char *detail) {
  if (!p->rc) {
    char msg[200];
    snprintf(msg, sizeof msg, fmt, detail ? detail : "");
    p->rc = herr_set(p->err, HEARTH_EINVAL, "grammar: line %d: %s", line_of(p, at), msg);
  }
  return p->rc;
}

static bool seq_push(b_seq *q, g_elem e) {
  if (q->n == q->cap && !HGROW(q->e, q->cap, q->n + 1)) return false;
  q->e[q->n++] = e;
  return true;
}

static int oom(parser *p) {
  if (!p->rc) p->rc = herr_set(p->err, HEARTH_ENOMEM, "grammar: out of memory");
  return p->rc;
}

static int new_rule(parser *p, const char *name, size_t len, uint32_t *id) {
  if (p->n_rules == p->cap_rules && !HGROW(p->rules, p->cap_rules, p->n_rules + 1)) return oom(p);
  b_rule *r = &p->rules[p->n_rules];
  memset(r, 0, sizeof *r);
  if (name) {
    r->name = strndup(name, len);
    if (!r->name) return oom(p);
  }
  *id = (uint32_t)p->n_rules++;
  return 0;
}

static int rule_by_name(parser *p, const char *name, size_t len, uint32_t *id) {
  for (size_t i = 0; i < p->n_rules; i++)
    if (p->rules[i].name && strlen(p->rules[i].name) == len && !memcmp(p->rules[i].name, name, len)) {
      *id = (uint32_t)i;
      return 0;
    }
  return new_rule(p, name, len, id);
}

static int rule_add_alt(parser *p, uint32_t rule, b_seq *alt) {
  b_rule *r = &p->rules[rule];
  if (r->n_alts == r->cap_alts && !HGROW(r->alts, r->cap_alts, r->n_alts + 1)) return oom(p);
  r->alts[r->n_alts++] = *alt;
  memset(alt, 0, sizeof *alt);
  return 0;
}

static int cmp_range(const void *a, const void *b) {
  uint32_t x = ((const g_range *)a)->lo, y = ((const g_range *)b)->lo;
  return x < y ? -1 : x > y;
}

static int add_charset(parser *p, const g_range *r, size_t n, bool neg, uint32_t *id) {
  grammar *g = p->g;
  if (g->n_sets == g->cap_sets && !HGROW(g->sets, g->cap_sets, g->n_sets + 1)) return oom(p);
  if (g->n_ranges + n + 1 > g->cap_ranges && !HGROW(g->ranges, g->cap_ranges, g->n_ranges + n + 1)) return oom(p);
  /* sort and merge */
  g_range *dst = g->ranges + g->n_ranges;
  if (n) memcpy(dst, r, n * sizeof *r);
  qsort(dst, n, sizeof *dst, cmp_range);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (m && dst[i].lo <= dst[m - 1].hi + 1) {
      if (dst[i].hi > dst[m - 1].hi) dst[m - 1].hi = dst[i].hi;
    } else {
      dst[m++] = dst[i];
    }
  }
  g->sets[g->n_sets] = (g_charset){.off = (uint32_t)g->n_ranges, .n = (uint32_t)m, .neg = neg};
  g->n_ranges += m;
  *id = (uint32_t)g->n_sets++;
  return 0;
}

/* ---- lexing ---- */

static bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skips spaces, newlines and comments. */
static const char *skip_space(const parser *p, const char *s) {
  while (s < p->end) {
    if (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') {
      s++;
    } else if (*s == '#') {
      while (s < p->end && *s != '\n') s++;
    } else {
      break;
    }
  }
  return s;
}

static const char *name_end(const parser *p, const char *s) {
  while (s < p->end && is_name_char(*s)) s++;
  return s;
}

/* `name ::=` starts at s */
static bool at_definition(const parser *p, const char *s) {
  const char *e = name_end(p, s);
  if (e == s) return false;
  e = skip_space(p, e);
  return p->end - e >= 3 && !memcmp(e, "::=", 3);
}

static int hexval(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* One character of a literal or class at *s (escape or UTF-8); advances *s. */
static int read_char(parser *p, const char **s, uint32_t *cp) {
  const char *c = *s;
  if (c >= p->end) return fail(p, c, "unexpected end of the grammar", NULL);
  if (*c == '\\') {
    if (c + 1 >= p->end) return fail(p, c, "a backslash ends the grammar", NULL);
    char e = c[1];
    int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (digits) {
      uint32_t v = 0;
      for (int i = 0; i < digits; i++) {
        int h = c + 2 + i < p->end ? hexval(c[2 + i]) : -1;
        if (h < 0) return fail(p, c, "bad \\%s escape", e == 'x' ? "x" : e == 'u' ? "u" : "U");
        v = v * 16 + (uint32_t)h;
      }
      if (v > 0x10FFFF) return fail(p, c, "escape beyond U+10FFFF", NULL);
      *cp = v;
      *s = c + 2 + digits;
      return 0;
    }
    switch (e) {
      case 'n': *cp = '\n'; break;
      case 'r': *cp = '\r'; break;
      case 't': *cp = '\t'; break;
      case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': *cp = (uint32_t)(unsigned char)e; break;
      default: {
        char d[2] = {e, 0};
        return fail(p, c, "unknown escape \\%s", d);
      }
    }
    *s = c + 2;
    return 0;
  }
  int l = utf8_decode(c, (size_t)(p->end - c), cp);
  if (l <= 0) return fail(p, c, "invalid UTF-8", NULL);
  *s = c + l;
  return 0;
}

/* ---- parsing ---- */

static int parse_alternates(parser *p, uint32_t rule, bool nested);

static int char_elem(parser *p, const g_range *r, size_t n, bool neg, b_seq *out) {
  uint32_t cs = 0;
  if (add_charset(p, r, n, neg, &cs)) return p->rc;
  if (!seq_push(out, (g_elem){.kind = E_CHARS, .arg = cs})) return oom(p);
  return 0;
}

/* Wraps the elements out[from..] into a rule of their own (for a postfix
 * operator), leaving a reference in their place. */
static int wrap_item(parser *p, b_seq *out, size_t from, uint32_t *rule) {
  if (out->n - from == 1 && out->e[from].kind == E_RULE) {
    *rule = out->e[from].arg;
    out->n = from;
    return 0;
  }
  if (new_rule(p, NULL, 0, rule)) return p->rc;
  b_seq alt = {0};
  for (size_t i = from; i < out->n; i++)
    if (!seq_push(&alt, out->e[i])) {
      free(alt.e);
      return oom(p);
    }
  out->n = from;
  if (rule_add_alt(p, *rule, &alt)) {
    free(alt.e);
    return p->rc;
  }
  return 0;
}

static int push_ref(parser *p, b_seq *q, uint32_t rule) {
  if (!seq_push(q, (g_elem){.kind = E_RULE, .arg = rule})) return oom(p);
  return 0;
}

/* R ::= x R | ε  (x*) */
static int star_rule(parser *p, uint32_t x, uint32_t *out) {
  uint32_t r;
  if (new_rule(p, NULL, 0, &r)) return p->rc;
  b_seq a = {0}, b = {0};
  if (push_ref(p, &a, x) || push_ref(p, &a, r) || rule_add_alt(p, r, &a) || rule_add_alt(p, r, &b)) {
    free(a.e);
    return p->rc;
  }
  *out = r;
  return 0;
}

/* R ::= x | ε  (x?), or R ::= x next | ε */
static int opt_rule(parser *p, uint32_t x, int64_t next, uint32_t *out) {
  uint32_t r;
  if (new_rule(p, NULL, 0, &r)) return p->rc;
  b_seq a = {0}, b = {0};
  if (push_ref(p, &a, x) || (next >= 0 && push_ref(p, &a, (uint32_t)next)) || rule_add_alt(p, r, &a) ||
      rule_add_alt(p, r, &b)) {
    free(a.e);
    return p->rc;
  }
  *out = r;
  return 0;
}

static int parse_count(parser *p, const char **s, int64_t *v) {
  const char *c = skip_space(p, *s);
  if (c >= p->end || *c < '0' || *c > '9') return fail(p, c, "expected a number in {m,n}", NULL);
  int64_t x = 0;
  while (c < p->end && *c >= '0' && *c <= '9') {
    x = x * 10 + (*c - '0');
    if (x > GRAMMAR_MAX_REPEAT) return fail(p, c, "a repetition count above 4096", NULL);
    c++;
  }
  *v = x;
  *s = skip_space(p, c);
  return 0;
}

/* Applies a postfix operator at *s to the item out[from..]. */
static int parse_postfix(parser *p, const char **s, b_seq *out, size_t from) {
  const char *c = *s;
  char op = *c;
  if (op != '*' && op != '+' && op != '?' && op != '{') return 0;
  if (out->n == from) return fail(p, c, "'%s' follows nothing", op == '{' ? "{" : op == '*' ? "*" : op == '+' ? "+" : "?");
  int64_t lo = 0, hi = -1;
  c++;
  if (op == '{') {
    if (parse_count(p, &c, &lo)) return p->rc;
    if (c < p->end && *c == ',') {
      c++;
      const char *d = skip_space(p, c);
      if (d < p->end && *d == '}') {
        c = d;
        hi = -1;
      } else if (parse_count(p, &c, &hi)) {
        return p->rc;
      }
    } else {
      hi = lo;
    }
    if (c >= p->end || *c != '}') return fail(p, c, "expected '}' after a repetition count", NULL);
    if (hi >= 0 && hi < lo) return fail(p, c, "{m,n} with n < m", NULL);
    c++;
  } else {
    lo = op == '+';
    hi = op == '?' ? 1 : -1;
  }
  *s = c;
  uint32_t x = 0;
  if (wrap_item(p, out, from, &x)) return p->rc;
  if ((size_t)lo * 2 + (hi > 0 ? (size_t)hi : 0) > GRAMMAR_MAX_ELEMS) return fail(p, c, "repetition too large", NULL);
  for (int64_t i = 0; i < lo; i++)
    if (push_ref(p, out, x)) return p->rc;
  if (hi < 0) {
    uint32_t r = 0;
    if (star_rule(p, x, &r) || push_ref(p, out, r)) return p->rc;
  } else if (hi > lo) {
    /* nested optionals: O1 ::= x O2 | ε, ..., Ok ::= x | ε */
    int64_t next = -1;
    for (int64_t i = hi - lo; i > 0; i--) {
      uint32_t r = 0;
      if (opt_rule(p, x, next, &r)) return p->rc;
      next = r;
    }
    if (push_ref(p, out, (uint32_t)next)) return p->rc;
  }
  return 0;
}

/* A sequence, up to '|', ')' (nested) or the next definition / the end. */
static int parse_sequence(parser *p, b_seq *out, bool nested) {
  const char *s = skip_space(p, p->s);
  for (;;) {
    s = skip_space(p, s);
    if (s >= p->end || *s == '|' || (*s == ')' && nested) || at_definition(p, s)) break;
    size_t from = out->n;
    if (*s == '"') {
      s++;
      while (s < p->end && *s != '"') {
        uint32_t cp;
        if (read_char(p, &s, &cp)) return p->rc;
        g_range r = {cp, cp};
        if (char_elem(p, &r, 1, false, out)) return p->rc;
      }
      if (s >= p->end) return fail(p, s, "unterminated string literal", NULL);
      s++;
      if (out->n == from) { /* "" is the empty sequence: nothing to repeat */
        const char *t = skip_space(p, s);
        if (t < p->end && (*t == '*' || *t == '+' || *t == '?' || *t == '{'))
          return fail(p, t, "a repetition of the empty string", NULL);
        continue;
      }
    } else if (*s == '[') {
      const char *open = s;
      s++;
      bool neg = s < p->end && *s == '^';
      if (neg) s++;
      g_range rs[256];
      size_t n = 0;
      g_range *heap = NULL;
      size_t cap = 0;
      while (s < p->end && *s != ']') {
        uint32_t a, b;
        if (read_char(p, &s, &a)) break;
        b = a;
        if (s + 1 < p->end && *s == '-' && s[1] != ']') {
          s++;
          if (read_char(p, &s, &b)) break;
          if (b < a) {
            fail(p, s, "a character range that runs backwards", NULL);
            break;
          }
        }
        if (n < 256) {
          rs[n++] = (g_range){a, b};
        } else {
          if (!heap) {
            if (!HGROW(heap, cap, 512)) {
              oom(p);
              break;
            }
            memcpy(heap, rs, sizeof rs);
          } else if (n == cap && !HGROW(heap, cap, n + 1)) {
            oom(p);
            break;
          }
          heap[n++] = (g_range){a, b};
        }
      }
      if (!p->rc && s >= p->end) fail(p, open, "unterminated character class", NULL);
      if (!p->rc) char_elem(p, heap ? heap : rs, n, neg, out);
      free(heap);
      if (p->rc) return p->rc;
      s++;
    } else if (*s == '<') {
      /* a token terminal: <[id]> or <text> */
      const char *open = s, *close = s + 1;
      while (close < p->end && *close != '>' && *close != '\n') close++;
      if (close >= p->end || *close != '>' || close == s + 1) return fail(p, open, "a token terminal is <[id]> or <text>", NULL);
      g_tok t = {.id = -1};
      if (s[1] == '[') {
        int64_t v = 0;
        const char *d = s + 2;
        for (; d < close && *d >= '0' && *d <= '9' && v <= INT32_MAX; d++) v = v * 10 + (*d - '0');
        if (d == s + 2 || d + 1 != close || *d != ']' || v > INT32_MAX)
          return fail(p, open, "a token terminal is <[id]> or <text>", NULL);
        t.id = (int32_t)v;
      } else {
        t.name = malloc((size_t)(close - open) + 2);
        if (!t.name) return oom(p);
        memcpy(t.name, open, (size_t)(close - open) + 1); /* the text with its brackets */
        t.name[close - open + 1] = 0;
      }
      grammar *g = p->g;
      if (g->n_toks == g->cap_toks && !HGROW(g->toks, g->cap_toks, g->n_toks + 1)) {
        free(t.name);
        return oom(p);
      }
      g->toks[g->n_toks] = t;
      if (!seq_push(out, (g_elem){.kind = E_TOKEN, .arg = (uint32_t)g->n_toks++})) return oom(p);
      s = close + 1;
    } else if (*s == '.') {
      g_range r = {0, 0x10FFFF};
      if (char_elem(p, &r, 1, false, out)) return p->rc;
      s++;
    } else if (*s == '(') {
      if (++p->depth > 200) return fail(p, s, "groups nested too deeply", NULL);
      uint32_t r;
      if (new_rule(p, NULL, 0, &r)) return p->rc;
      p->s = s + 1;
      if (parse_alternates(p, r, true)) return p->rc;
      s = skip_space(p, p->s);
      if (s >= p->end || *s != ')') return fail(p, s, "expected ')'", NULL);
      s++;
      p->depth--;
      if (push_ref(p, out, r)) return p->rc;
    } else if (is_name_char(*s)) {
      const char *e = name_end(p, s);
      uint32_t r;
      if (rule_by_name(p, s, (size_t)(e - s), &r)) return p->rc;
      if (!p->rules[r].line) p->rules[r].line = line_of(p, s);
      if (push_ref(p, out, r)) return p->rc;
      s = e;
    } else if (*s == '*' || *s == '+' || *s == '?' || *s == '{') {
      char d[2] = {*s, 0};
      return fail(p, s, "'%s' follows nothing", d);
    } else if (*s == ')') {
      return fail(p, s, "unbalanced ')'", NULL);
    } else {
      char d[2] = {*s, 0};
      return fail(p, s, "unexpected '%s'", d);
    }
    if (s < p->end && (*s == '*' || *s == '+' || *s == '?' || *s == '{')) {
      if (parse_postfix(p, &s, out, from)) return p->rc;
    }
  }
  p->s = s;
  return 0;
}

static int parse_alternates(parser *p, uint32_t rule, bool nested) {
  for (;;) {
    b_seq alt = {0};
    if (parse_sequence(p, &alt, nested) || rule_add_alt(p, rule, &alt)) {
      free(alt.e);
      return p->rc;
    }
    const char *s = skip_space(p, p->s);
    if (s < p->end && *s == '|') {
      p->s = s + 1;
      continue;
    }
    p->s = s;
    return 0;
  }
}

static int parse_all(parser *p) {
  p->s = skip_space(p, p->s);
  while (p->s < p->end) {
    const char *s = p->s;
    if (!at_definition(p, s)) return fail(p, s, "expected a rule definition `name ::= ...`", NULL);
    const char *e = name_end(p, s);
    uint32_t r;
    if (rule_by_name(p, s, (size_t)(e - s), &r)) return p->rc;
    if (p->rules[r].defined) {
      char nm[64];
      snprintf(nm, sizeof nm, "%.*s", (int)(e - s) < 60 ? (int)(e - s) : 60, s);
      return fail(p, s, "rule '%s' is defined twice", nm);
    }
    p->rules[r].defined = true;
    p->rules[r].line = line_of(p, s);
    p->s = skip_space(p, e) + 3;
    if (parse_alternates(p, r, false)) return p->rc;
    p->s = skip_space(p, p->s);
    if (p->s < p->end && *p->s == ')') return fail(p, p->s, "unbalanced ')'", NULL);
  }
  return 0;
}

/* ---- checks ---- */

/* nullable[r]: rule r can match the empty string. */
static void compute_nullable(const grammar *g, bool *nullable) {
  bool changed = true;
  while (changed) {
    changed = false;
    for (size_t r = 0; r < g->n_rules; r++) {
      if (nullable[r]) continue;
      for (uint32_t a = 0; a < g->rules[r].n_alts && !nullable[r]; a++) {
        bool all = true;
        for (uint32_t i = g->alts[g->rules[r].first_alt + a]; g->elems[i].kind != E_END; i++) {
          if (g->elems[i].kind != E_RULE || !nullable[g->elems[i].arg]) {
            all = false;
            break;
          }
        }
        if (all) nullable[r] = changed = true;
      }
    }
  }
}

/* Left recursion: r reaches itself through leftmost references (past nullable ones). */
static int check_left_recursion(const grammar *g, char **names, herr *err) {
  size_t n = g->n_rules;
  bool *nullable = calloc(n ? n : 1, sizeof *nullable);
  uint8_t *mark = calloc(n ? n : 1, 1); /* 0 new, 1 on the path, 2 done */
  uint32_t *stack = malloc(sizeof *stack * (n ? n : 1) * 2);
  uint32_t *pos = malloc(sizeof *pos * (n ? n : 1) * 2);
  int rc = 0;
  if (!nullable || !mark || !stack || !pos) {
    rc = herr_set(err, HEARTH_ENOMEM, "grammar: out of memory");
    goto out;
  }
  compute_nullable(g, nullable);
  /* the leftmost references of each rule, as edges, walked depth first */
  for (size_t start = 0; start < n && !rc; start++) {
    if (mark[start]) continue;
    size_t sp = 0;
    stack[sp] = (uint32_t)start;
    pos[sp++] = 0;
    mark[start] = 1;
    while (sp && !rc) {
      uint32_t r = stack[sp - 1];
      /* enumerate leftmost refs of r: flattened index over (alt, element) */
      uint32_t k = pos[sp - 1]++;
      /* find the k-th leftmost reference */
      uint32_t seen = 0, next = UINT32_MAX;
      for (uint32_t a = 0; a < g->rules[r].n_alts && next == UINT32_MAX; a++) {
        for (uint32_t i = g->alts[g->rules[r].first_alt + a]; g->elems[i].kind == E_RULE; i++) {
          if (seen++ == k) {
            next = g->elems[i].arg;
            break;
          }
          if (!nullable[g->elems[i].arg]) break;
        }
      }
      if (next == UINT32_MAX) {
        mark[r] = 2;
        sp--;
        continue;
      }
      if (mark[next] == 1) {
        /* name the nearest named rule on the cycle */
        const char *nm = names[next];
        for (size_t i = sp; i-- > 0 && !nm;)
          if (names[stack[i]]) nm = names[stack[i]];
        rc = herr_set(err, HEARTH_EINVAL, "grammar: rule '%s' is left-recursive (it can reach itself before matching a character)",
                      nm ? nm : "?");
      } else if (mark[next] == 0) {
        mark[next] = 1;
        stack[sp] = next;
        pos[sp++] = 0;
      }
    }
  }
out:
  free(nullable);
  free(mark);
  free(stack);
  free(pos);
  return rc;
}

#define LEN_INF UINT32_MAX

static uint32_t sat_add(uint32_t a, uint32_t b) { return a > LEN_INF - b ? LEN_INF : a + b; }

/* The shortest text each rule matches (fixed point), then each element's rest. */
static int compute_rest(grammar *g, herr *err) {
  uint32_t *minlen = malloc(sizeof *minlen * (g->n_rules ? g->n_rules : 1));
  g->rest = malloc(sizeof *g->rest * (g->n_elems ? g->n_elems : 1));
  if (!minlen || !g->rest) {
    free(minlen);
    return herr_set(err, HEARTH_ENOMEM, "grammar: out of memory");
  }
  for (size_t r = 0; r < g->n_rules; r++) minlen[r] = LEN_INF;
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < g->n_rules; r++)
      for (uint32_t a = 0; a < g->rules[r].n_alts; a++) {
        uint32_t len = 0;
        for (uint32_t i = g->alts[g->rules[r].first_alt + a]; g->elems[i].kind != E_END; i++)
          len = sat_add(len, g->elems[i].kind != E_RULE ? 1 : minlen[g->elems[i].arg]);
        if (len < minlen[r]) minlen[r] = len, changed = true;
      }
  }
  for (size_t i = g->n_elems; i-- > 0;) {
    g_elem e = g->elems[i];
    g->rest[i] = e.kind == E_END ? 0 : sat_add(g->rest[i + 1], e.kind != E_RULE ? 1 : minlen[e.arg]);
  }
  free(minlen);
  return 0;
}

static void parser_free(parser *p) {
  for (size_t i = 0; i < p->n_rules; i++) {
    free(p->rules[i].name);
    for (size_t a = 0; a < p->rules[i].n_alts; a++) free(p->rules[i].alts[a].e);
    free(p->rules[i].alts);
  }
  free(p->rules);
}

void grammar_free(grammar *g) {
  if (!g) return;
  free(g->elems);
  free(g->alts);
  free(g->rules);
  free(g->ranges);
  free(g->sets);
  free(g->rest);
  for (size_t i = 0; i < g->n_toks; i++) free(g->toks[i].name);
  free(g->toks);
  free(g);
}

size_t grammar_rule_count(const grammar *g) { return g->n_rules; }

int grammar_compile(const char *text, size_t len, grammar **out, herr *err) {
  *out = NULL;
  if (!text) text = "", len = 0;
  grammar *g = calloc(1, sizeof *g);
  if (!g) return herr_set(err, HEARTH_ENOMEM, "grammar: out of memory");
  parser p = {.s = text, .end = text + len, .start = text, .g = g, .err = err};
  int rc = parse_all(&p);
  uint32_t root = UINT32_MAX;
  for (size_t i = 0; !rc && i < p.n_rules; i++) {
    if (p.rules[i].name && !p.rules[i].defined)
      rc = herr_set(err, HEARTH_EINVAL, "grammar: line %d: rule '%s' is used but never defined", p.rules[i].line, p.rules[i].name);
    if (p.rules[i].name && !strcmp(p.rules[i].name, "root")) root = (uint32_t)i;
  }
  if (!rc && root == UINT32_MAX) rc = herr_set(err, HEARTH_EINVAL, "grammar: no 'root' rule");
  /* flatten */
  size_t total = 0, n_alts = 0;
  for (size_t i = 0; !rc && i < p.n_rules; i++)
    for (size_t a = 0; a < p.rules[i].n_alts; a++) total += p.rules[i].alts[a].n + 1, n_alts++;
  if (!rc && total > GRAMMAR_MAX_ELEMS) rc = herr_set(err, HEARTH_ELIMIT, "grammar: too large (%zu elements)", total);
  char **names = NULL;
  if (!rc) {
    g->elems = malloc(sizeof *g->elems * (total ? total : 1));
    g->alts = malloc(sizeof *g->alts * (n_alts ? n_alts : 1));
    g->rules = calloc(p.n_rules ? p.n_rules : 1, sizeof *g->rules);
    names = calloc(p.n_rules ? p.n_rules : 1, sizeof *names);
    if (!g->elems || !g->alts || !g->rules || !names) rc = herr_set(err, HEARTH_ENOMEM, "grammar: out of memory");
  }
  if (!rc) {
    for (size_t i = 0; i < p.n_rules; i++) {
      names[i] = p.rules[i].name;
      g->rules[i].first_alt = (uint32_t)g->n_alts;
      g->rules[i].n_alts = (uint32_t)p.rules[i].n_alts;
      for (size_t a = 0; a < p.rules[i].n_alts; a++) {
        g->alts[g->n_alts++] = (uint32_t)g->n_elems;
        if (p.rules[i].alts[a].n)
          memcpy(g->elems + g->n_elems, p.rules[i].alts[a].e, sizeof *g->elems * p.rules[i].alts[a].n);
        g->n_elems += p.rules[i].alts[a].n;
        g->elems[g->n_elems++] = (g_elem){.kind = E_END};
      }
    }
    g->n_rules = p.n_rules;
    g->root = root;
    rc = check_left_recursion(g, names, err);
  }
  if (!rc) rc = compute_rest(g, err);
  free(names);
  parser_free(&p);
  if (rc) {
    grammar_free(g);
    return rc;
  }
  *out = g;
  return 0;
}

/* ---- the vocabulary trie ---- */

typedef struct trie_node {
  uint32_t first_child, next_sibling; /* 0 = none (node 0 is the root) */
  uint32_t first_tok;                 /* into tok_next chain, UINT32_MAX = none */
  uint8_t byte;
} trie_node;

struct grammar_vocab {
  int32_t n;
  trie_node *nodes;
  size_t n_nodes, cap_nodes;
  uint32_t *tok_next; /* per token: the next token ending at the same node, UINT32_MAX = last */
  char *bytes;        /* all tokens' bytes */
  size_t *off;        /* n + 1 */
  hdict names;        /* token text -> id, for token terminals <text> */
};

static uint32_t trie_child(grammar_vocab *v, uint32_t at, uint8_t b, bool make) {
  uint32_t prev = 0;
  for (uint32_t c = v->nodes[at].first_child; c; c = v->nodes[c].next_sibling) {
    if (v->nodes[c].byte == b) return c;
    if (v->nodes[c].byte > b) break;
    prev = c;
  }
  if (!make) return 0;
  if (v->n_nodes == v->cap_nodes && !HGROW(v->nodes, v->cap_nodes, v->n_nodes + 1)) return UINT32_MAX;
  uint32_t id = (uint32_t)v->n_nodes++;
  v->nodes[id] = (trie_node){.byte = b, .first_tok = UINT32_MAX};
  /* keep siblings sorted by byte */
  if (prev) {
    v->nodes[id].next_sibling = v->nodes[prev].next_sibling;
    v->nodes[prev].next_sibling = id;
  } else {
    v->nodes[id].next_sibling = v->nodes[at].first_child;
    v->nodes[at].first_child = id;
  }
  return id;
}

int grammar_vocab_from_bytes(const char *const *bytes, const size_t *lens, int32_t n, grammar_vocab **out, herr *err) {
  *out = NULL;
  grammar_vocab *v = calloc(1, sizeof *v);
  size_t total = 0;
  for (int32_t i = 0; i < n; i++) total += lens[i];
  if (v) {
    v->n = n;
    v->tok_next = malloc(sizeof *v->tok_next * (size_t)(n > 0 ? n : 1));
    v->off = malloc(sizeof *v->off * (size_t)(n + 1));
    v->bytes = malloc(total ? total : 1);
  }
  if (!v || !v->tok_next || !v->off || !v->bytes || !HGROW(v->nodes, v->cap_nodes, 1024)) {
    grammar_vocab_free(v);
    return herr_set(err, HEARTH_ENOMEM, "grammar: out of memory for the vocabulary");
  }
  v->nodes[0] = (trie_node){.first_tok = UINT32_MAX};
  v->n_nodes = 1;
  hdict_init(&v->names);
  size_t at = 0;
  for (int32_t i = 0; i < n; i++) {
    v->off[i] = at;
    v->tok_next[i] = UINT32_MAX;
    if (lens[i]) memcpy(v->bytes + at, bytes[i], lens[i]);
    uint32_t node = 0;
    for (size_t k = 0; k < lens[i] && node != UINT32_MAX; k++) node = trie_child(v, node, (uint8_t)bytes[i][k], true);
    if (node == UINT32_MAX) {
      grammar_vocab_free(v);
      return herr_set(err, HEARTH_ENOMEM, "grammar: out of memory for the vocabulary");
    }
    if (lens[i]) {
      v->tok_next[i] = v->nodes[node].first_tok;
      v->nodes[node].first_tok = (uint32_t)i;
      /* the token by its text, for <text> terminals (the lowest id of equal texts) */
      int64_t had;
      if (!hdict_get(&v->names, bytes[i], lens[i], &had) && !hdict_put(&v->names, bytes[i], lens[i], i)) {
        grammar_vocab_free(v);
        return herr_set(err, HEARTH_ENOMEM, "grammar: out of memory for the vocabulary");
      }
    }
    at += lens[i];
  }
  v->off[n] = at;
  *out = v;
  return 0;
}

void grammar_vocab_free(grammar_vocab *v) {
  if (!v) return;
  hdict_free(&v->names);
  free(v->nodes);
  free(v->tok_next);
  free(v->bytes);
  free(v->off);
  free(v);
}

int32_t grammar_vocab_size(const grammar_vocab *v) { return v->n; }

int grammar_vocab_name(grammar_vocab *v, int32_t id, const char *text, herr *err) {
  if (id < 0 || id >= v->n) return herr_set(err, HEARTH_EINVAL, "grammar: token %d is outside the vocabulary", id);
  if (!hdict_put(&v->names, text, strlen(text), id)) return herr_set(err, HEARTH_ENOMEM, "grammar: out of memory");
  return 0;
}

/* ---- the automaton ----
 * A stack node is (pos, parent): "go on at element pos, then with parent".
 * Nodes are interned, so equal stacks are equal ids; node 0 is the empty
 * stack (the sentence may end). A normalized stack's top is a character
 * element. A state is a sorted set of normalized stacks plus the UTF-8
 * sequence begun but not finished (its bits so far and bytes still due). */

typedef struct a_node {
  uint32_t pos, parent;
} a_node;

typedef struct a_state {
  uint32_t off, n;   /* into st_nodes */
  uint32_t acc;      /* UTF-8 bits so far */
  uint8_t need;      /* continuation bytes still due */
  uint8_t len;       /* bytes of the sequence (for the overlong check) */
  int32_t *trans;    /* owned [256] or NULL: next state, -1 unknown, -2 dead */
  uint64_t *mask;    /* owned or NULL */
  int32_t n_allowed;
  uint32_t max_next; /* with mask: the largest distance a single allowed token leads to */
  uint32_t dist;     /* fewest characters to a possible end; LEN_INF until known */
} a_state;

struct grammar_matcher {
  const grammar *g;
  const grammar_vocab *v;
  int32_t *end_ids;
  int n_end;
  int32_t *tok_ids;  /* per token terminal of the grammar: its id in the vocabulary */
  bool finished; /* an end token was accepted */
  int32_t cur;   /* current state */
  /* interned nodes */
  a_node *nodes;
  uint32_t *node_dist; /* parallel to nodes, grown with them: fewest characters to the end, LEN_INF unknown */
  size_t n_nodes, cap_nodes;
  uint32_t *node_slots; /* open addressing: node id + 1, 0 empty */
  size_t n_node_slots;
  /* interned states */
  a_state *states;
  size_t n_states, cap_states;
  uint32_t *st_nodes;
  size_t n_st_nodes, cap_st_nodes;
  uint32_t *state_slots;
  size_t n_state_slots;
  /* scratch */
  uint32_t *set;
  size_t n_set, cap_set;
  uint64_t *end_mask; /* the mask when only ending is possible */
  uint64_t *budget;   /* scratch: the last budget-limited mask */
  int depth;
  bool overflow;
};

static uint64_t node_hash(uint32_t pos, uint32_t parent) { return hmix64(((uint64_t)pos << 32) | parent); }

static bool node_rehash(grammar_matcher *m) {
  size_t n = m->n_node_slots ? m->n_node_slots * 2 : 1024;
  uint32_t *s = calloc(n, sizeof *s);
  if (!s) return false;
  for (size_t i = 0; i < m->n_nodes; i++) {
    size_t h = node_hash(m->nodes[i].pos, m->nodes[i].parent) & (n - 1);
    while (s[h]) h = (h + 1) & (n - 1);
    s[h] = (uint32_t)i + 1;
  }
  free(m->node_slots);
  m->node_slots = s;
  m->n_node_slots = n;
  return true;
}

/* UINT32_MAX on overflow / out of memory */
static uint32_t node_intern(grammar_matcher *m, uint32_t pos, uint32_t parent) {
  if ((m->n_nodes + 1) * 2 > m->n_node_slots && !node_rehash(m)) return UINT32_MAX;
  size_t mask = m->n_node_slots - 1, h = node_hash(pos, parent) & mask;
  for (; m->node_slots[h]; h = (h + 1) & mask) {
    const a_node *nd = &m->nodes[m->node_slots[h] - 1];
    if (nd->pos == pos && nd->parent == parent) return m->node_slots[h] - 1;
  }
  if (m->n_nodes >= GRAMMAR_MAX_NODES) {
    m->overflow = true;
    return UINT32_MAX;
  }
  if (m->n_nodes == m->cap_nodes) {
    size_t cap = m->cap_nodes;
    if (!HGROW(m->nodes, cap, m->n_nodes + 1)) return UINT32_MAX;
    size_t cap2 = m->cap_nodes;
    if (!HGROW(m->node_dist, cap2, m->n_nodes + 1)) return UINT32_MAX;
    m->cap_nodes = cap;
  }
  m->nodes[m->n_nodes] = (a_node){pos, parent};
  m->node_dist[m->n_nodes] = LEN_INF;
  m->node_slots[h] = (uint32_t)m->n_nodes + 1;
  return (uint32_t)m->n_nodes++;
}

static bool set_add(grammar_matcher *m, uint32_t id) {
  if (m->n_set == m->cap_set && !HGROW(m->set, m->cap_set, m->n_set + 1)) return false;
  m->set[m->n_set++] = id;
  return true;
}

/* Adds to m->set every normalized stack that "continue at pos, then parent" becomes. */
static bool expand(grammar_matcher *m, uint32_t pos, uint32_t parent) {
  const grammar *g = m->g;
  for (;;) {
    g_elem e = g->elems[pos];
    if (e.kind == E_END) {
      if (parent == 0) return set_add(m, 0);
      pos = m->nodes[parent].pos;
      parent = m->nodes[parent].parent;
      continue;
    }
    if (e.kind == E_CHARS || e.kind == E_TOKEN) {
      uint32_t id = node_intern(m, pos, parent);
      return id != UINT32_MAX && set_add(m, id);
    }
    /* a rule: each alternative, returning to what follows the reference */
    uint32_t cont = parent;
    if (g->elems[pos + 1].kind != E_END) {
      cont = node_intern(m, pos + 1, parent);
      if (cont == UINT32_MAX) return false;
    }
    if (++m->depth > GRAMMAR_MAX_DEPTH) {
      m->overflow = true;
      return false;
    }
    const g_rule *r = &g->rules[e.arg];
    for (uint32_t a = 0; a < r->n_alts; a++)
      if (!expand(m, g->alts[r->first_alt + a], cont)) return false;
    m->depth--;
    return true;
  }
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

static uint64_t state_hash(const uint32_t *ids, size_t n, uint32_t acc, uint8_t need) {
  uint64_t h = hmix64(((uint64_t)acc << 8) | need);
  for (size_t i = 0; i < n; i++) h = hmix64(h ^ ids[i]);
  return h;
}

static bool state_rehash(grammar_matcher *m) {
  size_t n = m->n_state_slots ? m->n_state_slots * 2 : 256;
  uint32_t *s = calloc(n, sizeof *s);
  if (!s) return false;
  for (size_t i = 0; i < m->n_states; i++) {
    const a_state *st = &m->states[i];
    size_t h = state_hash(m->st_nodes + st->off, st->n, st->acc, st->need) & (n - 1);
    while (s[h]) h = (h + 1) & (n - 1);
    s[h] = (uint32_t)i + 1;
  }
  free(m->state_slots);
  m->state_slots = s;
  m->n_state_slots = n;
  return true;
}

/* Interns the state (m->set sorted and deduplicated here, acc, need, len). -1 on failure. */
static int32_t state_intern(grammar_matcher *m, uint32_t acc, uint8_t need, uint8_t len) {
  qsort(m->set, m->n_set, sizeof *m->set, cmp_u32);
  size_t k = 0;
  for (size_t i = 0; i < m->n_set; i++)
    if (!k || m->set[i] != m->set[k - 1]) m->set[k++] = m->set[i];
  m->n_set = k;
  if ((m->n_states + 1) * 2 > m->n_state_slots && !state_rehash(m)) return -1;
  size_t mask = m->n_state_slots - 1, h = state_hash(m->set, k, acc, need) & mask;
  for (; m->state_slots[h]; h = (h + 1) & mask) {
    const a_state *st = &m->states[m->state_slots[h] - 1];
    if (st->n == k && st->acc == acc && st->need == need && st->len == len &&
        !memcmp(m->st_nodes + st->off, m->set, k * sizeof *m->set))
      return (int32_t)m->state_slots[h] - 1;
  }
  if (m->n_states >= GRAMMAR_MAX_STATES) {
    m->overflow = true;
    return -1;
  }
  if (m->n_states == m->cap_states && !HGROW(m->states, m->cap_states, m->n_states + 1)) return -1;
  if (m->n_st_nodes + k > m->cap_st_nodes && !HGROW(m->st_nodes, m->cap_st_nodes, m->n_st_nodes + k)) return -1;
  memcpy(m->st_nodes + m->n_st_nodes, m->set, k * sizeof *m->set);
  m->states[m->n_states] = (a_state){.off = (uint32_t)m->n_st_nodes, .n = (uint32_t)k, .acc = acc, .need = need, .len = len,
                                     .dist = LEN_INF};
  m->n_st_nodes += k;
  m->state_slots[h] = (uint32_t)m->n_states + 1;
  return (int32_t)m->n_states++;
}

static bool charset_has(const grammar *g, uint32_t cs, uint32_t cp) {
  const g_charset *c = &g->sets[cs];
  const g_range *r = g->ranges + c->off;
  size_t lo = 0, hi = c->n;
  bool in = false;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (cp < r[mid].lo) hi = mid;
    else if (cp > r[mid].hi) lo = mid + 1;
    else {
      in = true;
      break;
    }
  }
  return in != c->neg;
}

/* Whether the charset holds any code point in [a, b]. */
static bool charset_meets(const grammar *g, uint32_t cs, uint32_t a, uint32_t b) {
  const g_charset *c = &g->sets[cs];
  const g_range *r = g->ranges + c->off;
  if (!c->neg) {
    for (uint32_t i = 0; i < c->n; i++)
      if (r[i].lo <= b && r[i].hi >= a) return true;
    return false;
  }
  /* negated: some point of [a, b] is outside every range */
  uint32_t x = a;
  for (uint32_t i = 0; i < c->n && x <= b; i++) {
    if (r[i].hi < x) continue;
    if (r[i].lo > x) return true;
    if (r[i].hi == UINT32_MAX) return false;
    x = r[i].hi + 1;
  }
  return x <= b;
}

static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000}; /* by sequence length */

#define T_UNKNOWN -1
#define T_DEAD -2

/* The state after byte b from state s: its id, T_DEAD, or T_UNKNOWN on failure (overflow / memory). */
static int32_t transition(grammar_matcher *m, int32_t s, uint8_t b) {
  a_state *st = &m->states[s];
  if (st->trans && st->trans[b] != T_UNKNOWN) return st->trans[b];
  if (!st->trans) {
    int32_t *t = malloc(sizeof *t * 256);
    if (!t) return T_UNKNOWN;
    for (int i = 0; i < 256; i++) t[i] = T_UNKNOWN;
    m->states[s].trans = t;
    st = &m->states[s];
  }
  uint32_t acc = st->acc, len = st->len;
  uint8_t need = st->need;
  int32_t res = T_DEAD;
  bool complete = false;
  uint32_t cp = 0;
  if (need == 0) {
    if (b < 0x80) cp = b, complete = true;
    else if (b >= 0xC2 && b <= 0xDF) acc = b & 0x1F, need = 1, len = 2;
    else if (b >= 0xE0 && b <= 0xEF) acc = b & 0x0F, need = 2, len = 3;
    else if (b >= 0xF0 && b <= 0xF4) acc = b & 0x07, need = 3, len = 4;
    else goto done;
  } else {
    if ((b & 0xC0) != 0x80) goto done;
    acc = (acc << 6) | (b & 0x3F);
    need--;
    if (need == 0) {
      cp = acc;
      complete = true;
      if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) goto done;
    }
  }
  m->n_set = 0;
  uint32_t s_off = st->off, s_n = st->n;
  if (complete) {
    for (uint32_t i = 0; i < s_n; i++) {
      uint32_t id = m->st_nodes[s_off + i];
      if (id == 0) continue;
      a_node nd = m->nodes[id];
      if (m->g->elems[nd.pos].kind != E_CHARS || !charset_has(m->g, m->g->elems[nd.pos].arg, cp)) continue;
      m->depth = 0;
      if (!expand(m, nd.pos + 1, nd.parent)) {
        res = T_UNKNOWN;
        goto done;
      }
    }
    if (m->n_set) res = state_intern(m, 0, 0, 0);
    if (res == -1) res = T_UNKNOWN;
  } else {
    /* a sequence begun: keep the stacks whose class meets the code points it can still become */
    uint32_t lo = acc << (6 * need), hi = lo | ((1u << (6 * need)) - 1);
    if (lo < min_cp[len]) lo = min_cp[len];
    if (hi > 0x10FFFF) hi = 0x10FFFF;
    if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF)) goto done; /* nothing valid can follow */
    for (uint32_t i = 0; i < s_n; i++) {
      uint32_t id = m->st_nodes[s_off + i];
      if (id && m->g->elems[m->nodes[id].pos].kind == E_CHARS &&
          charset_meets(m->g, m->g->elems[m->nodes[id].pos].arg, lo, hi) && !set_add(m, id)) {
        res = T_UNKNOWN;
        goto done;
      }
    }
    if (m->n_set) res = state_intern(m, acc, need, (uint8_t)len);
    if (res == -1) res = T_UNKNOWN;
  }
done:
  if (res != T_UNKNOWN) m->states[s].trans[b] = res;
  return res;
}

/* The state after the whole token id taken by token terminals from state s
 * (T_DEAD when no stack's top is that token; T_UNKNOWN on failure). */
static int32_t token_step(grammar_matcher *m, int32_t s, int32_t id) {
  const a_state *st = &m->states[s];
  if (st->need) return T_DEAD;
  m->n_set = 0;
  uint32_t off = st->off, n = st->n;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t nid = m->st_nodes[off + i];
    if (!nid) continue;
    a_node nd = m->nodes[nid];
    g_elem e = m->g->elems[nd.pos];
    if (e.kind != E_TOKEN || m->tok_ids[e.arg] != id) continue;
    m->depth = 0;
    if (!expand(m, nd.pos + 1, nd.parent)) return T_UNKNOWN;
  }
  if (!m->n_set) return T_DEAD;
  int32_t r = state_intern(m, 0, 0, 0);
  return r < 0 ? T_UNKNOWN : r;
}

/* The state after token id (its bytes, or a token terminal, or both at once). */
static int32_t token_next(grammar_matcher *m, int32_t s, int32_t id) {
  size_t len = m->v->off[id + 1] - m->v->off[id];
  int32_t by_bytes = T_DEAD;
  if (len) {
    by_bytes = s;
    for (size_t i = 0; i < len && by_bytes >= 0; i++) by_bytes = transition(m, by_bytes, (uint8_t)m->v->bytes[m->v->off[id] + i]);
  }
  if (!m->g->n_toks || by_bytes == T_UNKNOWN) return by_bytes;
  int32_t by_tok = token_step(m, s, id);
  if (by_tok < 0 || by_bytes == T_DEAD) return by_tok == T_DEAD ? by_bytes : by_tok;
  if (m->states[by_bytes].need) return by_tok; /* (a token both ways, one of them mid-character: rare) */
  /* both: the union of their stacks */
  m->n_set = 0;
  for (int k = 0; k < 2; k++) {
    const a_state *st = &m->states[k ? by_bytes : by_tok];
    for (uint32_t i = 0; i < st->n; i++)
      if (!set_add(m, m->st_nodes[st->off + i])) return T_UNKNOWN;
  }
  int32_t r = state_intern(m, 0, 0, 0);
  return r < 0 ? T_UNKNOWN : r;
}

static bool state_can_end(const grammar_matcher *m, int32_t s) {
  const a_state *st = &m->states[s];
  return st->need == 0 && st->n && m->st_nodes[st->off] == 0; /* sorted: node 0 first */
}

void grammar_matcher_free(grammar_matcher *m) {
  if (!m) return;
  for (size_t i = 0; i < m->n_states; i++) {
    free(m->states[i].trans);
    free(m->states[i].mask);
  }
  free(m->node_dist);
  free(m->states);
  free(m->st_nodes);
  free(m->state_slots);
  free(m->nodes);
  free(m->node_slots);
  free(m->set);
  free(m->end_ids);
  free(m->tok_ids);
  free(m->end_mask);
  free(m->budget);
  free(m);
}

static int matcher_fail(grammar_matcher *m, herr *err) {
  if (m->overflow)
    return herr_set(err, HEARTH_ELIMIT, "grammar: the output's parse grew past the matcher's limits (%d states, rules nested %d deep)",
                    GRAMMAR_MAX_STATES, GRAMMAR_MAX_DEPTH);
  return herr_set(err, HEARTH_ENOMEM, "grammar: out of memory");
}

int grammar_matcher_new(const grammar *g, const grammar_vocab *v, const int32_t *end_ids, int n_end,
                        grammar_matcher **out, herr *err) {
  *out = NULL;
  grammar_matcher *m = calloc(1, sizeof *m);
  if (!m) return herr_set(err, HEARTH_ENOMEM, "grammar: out of memory");
  m->g = g;
  m->v = v;
  m->end_ids = malloc(sizeof *m->end_ids * (size_t)(n_end > 0 ? n_end : 1));
  if (!m->end_ids) {
    grammar_matcher_free(m);
    return herr_set(err, HEARTH_ENOMEM, "grammar: out of memory");
  }
  for (int i = 0; i < n_end; i++)
    if (end_ids[i] >= 0 && end_ids[i] < v->n) m->end_ids[m->n_end++] = end_ids[i];
  /* token terminals, resolved against this vocabulary */
  m->tok_ids = malloc(sizeof *m->tok_ids * (g->n_toks ? g->n_toks : 1));
  if (!m->tok_ids) {
    grammar_matcher_free(m);
    return herr_set(err, HEARTH_ENOMEM, "grammar: out of memory");
  }
  for (size_t i = 0; i < g->n_toks; i++) {
    int64_t id = g->toks[i].id;
    if (g->toks[i].name && !hdict_gets(&v->names, g->toks[i].name, &id)) {
      int rc = herr_set(err, HEARTH_EINVAL, "grammar: %s is not a special token of this model", g->toks[i].name);
      grammar_matcher_free(m);
      return rc;
    }
    if (id < 0 || id >= v->n) {
      int rc = herr_set(err, HEARTH_EINVAL, "grammar: token <[%lld]> is outside the vocabulary of %d", (long long)id, v->n);
      grammar_matcher_free(m);
      return rc;
    }
    m->tok_ids[i] = (int32_t)id;
  }
  /* node 0: the empty stack */
  size_t cap2 = 0;
  if (!HGROW(m->node_dist, cap2, 64) || !HGROW(m->nodes, m->cap_nodes, 64) || !node_rehash(m)) {
    grammar_matcher_free(m);
    return herr_set(err, HEARTH_ENOMEM, "grammar: out of memory");
  }
  m->nodes[0] = (a_node){UINT32_MAX, UINT32_MAX};
  m->node_dist[0] = 0;
  m->n_nodes = 1;
  /* the start: every alternative of root */
  const g_rule *r = &g->rules[g->root];
  bool ok = true;
  for (uint32_t a = 0; a < r->n_alts && ok; a++) {
    m->depth = 0;
    ok = expand(m, g->alts[r->first_alt + a], 0);
  }
  int32_t s = ok ? state_intern(m, 0, 0, 0) : -1;
  if (s < 0) {
    int rc = matcher_fail(m, err);
    grammar_matcher_free(m);
    return rc;
  }
  m->cur = s;
  *out = m;
  return 0;
}

/* Fewest characters from node id to the end (iterative: parent chains can be long). */
static uint32_t node_distance(grammar_matcher *m, uint32_t id) {
  uint32_t at = id, n = 0;
  while (m->node_dist[at] == LEN_INF) at = m->nodes[at].parent, n++;
  /* fill back along the chain: each node's rest plus its parent's distance */
  while (n > 0) {
    uint32_t x = id, up = 0;
    for (uint32_t k = 0; k + 1 < n; k++) x = m->nodes[x].parent;
    up = m->node_dist[m->nodes[x].parent];
    m->node_dist[x] = sat_add(m->g->rest[m->nodes[x].pos], up);
    n--;
  }
  return m->node_dist[id];
}

static uint32_t state_distance(grammar_matcher *m, int32_t s) {
  a_state *st = &m->states[s];
  if (st->dist != LEN_INF) return st->dist;
  uint32_t best = LEN_INF;
  for (uint32_t i = 0; i < st->n; i++) {
    uint32_t d = node_distance(m, m->st_nodes[st->off + i]);
    if (d < best) best = d;
  }
  m->states[s].dist = best;
  return best;
}

/* The tokens allowed in state s, into mask (zeroed here). limit: only tokens
 * after which the text is whole (no UTF-8 sequence pending) and at most limit
 * characters from an end; LEN_INF: every token. *max_next: the largest such
 * distance among the allowed tokens. */
static int mask_into(grammar_matcher *m, int32_t s, uint32_t limit, uint64_t *mask, int32_t *n_out, uint32_t *max_next,
                     herr *err) {
  const grammar_vocab *v = m->v;
  size_t words = ((size_t)v->n + 63) / 64;
  memset(mask, 0, sizeof *mask * (words ? words : 1));
  int32_t n_allowed = 0;
  uint32_t most = 0;
  /* depth-first over the trie, carrying the automaton state */
  typedef struct {
    uint32_t node;
    int32_t state;
  } frame;
  frame stack_small[256];
  frame *stack = stack_small;
  size_t sp = 0, cap = 256;
  stack[sp++] = (frame){0, s};
  int rc = 0;
  while (sp && !rc) {
    frame f = stack[--sp];
    for (uint32_t c = v->nodes[f.node].first_child; c; c = v->nodes[c].next_sibling) {
      int32_t t = transition(m, f.state, v->nodes[c].byte);
      if (t == T_DEAD) continue;
      if (t == T_UNKNOWN) {
        rc = matcher_fail(m, err);
        break;
      }
      /* a token may end inside a UTF-8 sequence (byte-level vocabularies split
       * characters): it is allowed while some stack can still take the rest */
      if (v->nodes[c].first_tok != UINT32_MAX) {
        uint32_t d = state_distance(m, t);
        if (limit == LEN_INF || (m->states[t].need == 0 && d <= limit)) {
          if (d > most && m->states[t].need == 0) most = d;
          for (uint32_t id = v->nodes[c].first_tok; id != UINT32_MAX; id = v->tok_next[id]) {
            mask[id / 64] |= 1ull << (id % 64);
            n_allowed++;
          }
        }
      }
      if (v->nodes[c].first_child) {
        if (sp == cap) {
          frame *bigger = malloc(sizeof *bigger * cap * 2);
          if (!bigger) {
            rc = herr_set(err, HEARTH_ENOMEM, "grammar: out of memory");
            break;
          }
          memcpy(bigger, stack, sizeof *stack * sp);
          if (stack != stack_small) free(stack);
          stack = bigger;
          cap *= 2;
        }
        stack[sp++] = (frame){c, t};
      }
    }
  }
  if (stack != stack_small) free(stack);
  if (rc) return rc;
  /* token terminals at the tops of the stacks */
  for (uint32_t i = 0; m->g->n_toks && m->states[s].need == 0 && i < m->states[s].n; i++) {
    uint32_t nid = m->st_nodes[m->states[s].off + i];
    if (!nid || m->g->elems[m->nodes[nid].pos].kind != E_TOKEN) continue;
    int32_t id = m->tok_ids[m->g->elems[m->nodes[nid].pos].arg];
    if (mask[id / 64] >> (id % 64) & 1) continue;
    int32_t t = token_next(m, s, id);
    if (t == T_UNKNOWN) return matcher_fail(m, err);
    if (t < 0) continue;
    uint32_t d = state_distance(m, t);
    if (limit != LEN_INF && d > limit) continue;
    if (d > most) most = d;
    mask[id / 64] |= 1ull << (id % 64);
    n_allowed++;
  }
  if (state_can_end(m, s))
    for (int i = 0; i < m->n_end; i++) {
      int32_t id = m->end_ids[i];
      if (!(mask[id / 64] >> (id % 64) & 1)) n_allowed++;
      mask[id / 64] |= 1ull << (id % 64);
    }
  *n_out = n_allowed;
  *max_next = most;
  return 0;
}

/* The full mask of state s, cached. */
static int state_mask(grammar_matcher *m, int32_t s, herr *err) {
  if (m->states[s].mask) return 0;
  size_t words = ((size_t)m->v->n + 63) / 64;
  uint64_t *mask = malloc(sizeof *mask * (words ? words : 1));
  if (!mask) return herr_set(err, HEARTH_ENOMEM, "grammar: out of memory");
  int32_t n = 0;
  uint32_t most = 0;
  int rc = mask_into(m, s, LEN_INF, mask, &n, &most, err);
  if (rc) {
    free(mask);
    return rc;
  }
  m->states[s].mask = mask;
  m->states[s].n_allowed = n;
  m->states[s].max_next = most;
  return 0;
}

uint32_t grammar_matcher_distance(grammar_matcher *m) { return m->finished ? 0 : state_distance(m, m->cur); }

int grammar_matcher_mask_budget(grammar_matcher *m, int64_t tokens_left, const uint64_t **mask, int32_t *n_allowed,
                                herr *err) {
  int rc = grammar_matcher_mask(m, mask, n_allowed, err);
  if (rc || m->finished) return rc;
  /* after this token, tokens_left - 1 remain: the distance then (one character per
   * token at worst) and the end token must fit */
  int64_t limit = tokens_left - 2;
  if (limit >= (int64_t)m->states[m->cur].max_next) return 0; /* nothing reachable overruns */
  if (!m->budget) {
    size_t words = ((size_t)m->v->n + 63) / 64;
    m->budget = malloc(sizeof *m->budget * (words ? words : 1));
    if (!m->budget) return herr_set(err, HEARTH_ENOMEM, "grammar: out of memory");
  }
  uint32_t here = state_distance(m, m->cur), most;
  int32_t n = 0;
  /* within the budget; when nothing fits, at least closer to an end */
  uint32_t lim = limit < 0 ? 0 : (uint32_t)limit;
  if ((rc = mask_into(m, m->cur, lim, m->budget, &n, &most, err))) return rc;
  if (n == 0 && here > 0 && (rc = mask_into(m, m->cur, here - 1, m->budget, &n, &most, err))) return rc;
  if (n == 0) return 0; /* no shorter way: the full mask */
  *mask = m->budget;
  if (n_allowed) *n_allowed = n;
  return 0;
}

int grammar_matcher_mask(grammar_matcher *m, const uint64_t **mask, int32_t *n_allowed, herr *err) {
  if (m->finished) {
    /* after the end token nothing more: only end tokens again */
    if (!m->end_mask) {
      size_t words = ((size_t)m->v->n + 63) / 64;
      m->end_mask = calloc(words ? words : 1, sizeof *m->end_mask);
      if (!m->end_mask) return herr_set(err, HEARTH_ENOMEM, "grammar: out of memory");
      for (int i = 0; i < m->n_end; i++) m->end_mask[m->end_ids[i] / 64] |= 1ull << (m->end_ids[i] % 64);
    }
    *mask = m->end_mask;
    if (n_allowed) *n_allowed = m->n_end;
    return 0;
  }
  int rc = state_mask(m, m->cur, err);
  if (rc) return rc;
  *mask = m->states[m->cur].mask;
  if (n_allowed) *n_allowed = m->states[m->cur].n_allowed;
  return 0;
}

static bool is_end(const grammar_matcher *m, int32_t id) {
  for (int i = 0; i < m->n_end; i++)
    if (m->end_ids[i] == id) return true;
  return false;
}

/* The state after the token's bytes, or a negative value. */
static int32_t walk(grammar_matcher *m, int32_t s, const char *b, size_t n) {
  for (size_t i = 0; i < n && s >= 0; i++) s = transition(m, s, (uint8_t)b[i]);
  return s;
}

bool grammar_matcher_allows(grammar_matcher *m, int32_t id) {
  if (id < 0 || id >= m->v->n) return false;
  if (is_end(m, id)) return m->finished || state_can_end(m, m->cur);
  if (m->finished) return false;
  if (m->states[m->cur].mask) return m->states[m->cur].mask[id / 64] >> (id % 64) & 1;
  return token_next(m, m->cur, id) >= 0;
}

int grammar_matcher_accept(grammar_matcher *m, int32_t id, herr *err) {
  if (id < 0 || id >= m->v->n) return herr_set(err, HEARTH_EINVAL, "grammar: token %d is outside the vocabulary", id);
  if (is_end(m, id)) {
    if (!m->finished && !state_can_end(m, m->cur))
      return herr_set(err, HEARTH_EINVAL, "grammar: the output cannot end here");
    m->finished = true;
    return 0;
  }
  if (m->finished) return herr_set(err, HEARTH_EINVAL, "grammar: token %d after the end", id);
  int32_t s = token_next(m, m->cur, id);
  if (s == T_UNKNOWN) return matcher_fail(m, err);
  if (s < 0) return herr_set(err, HEARTH_EINVAL, "grammar: token %d does not fit the grammar here", id);
  m->cur = s;
  return 0;
}

int grammar_matcher_accept_text(grammar_matcher *m, const char *s, size_t n, herr *err) {
  if (m->finished) return n ? herr_set(err, HEARTH_EINVAL, "grammar: text after the end") : 0;
  int32_t t = walk(m, m->cur, s, n);
  if (t == T_UNKNOWN) return matcher_fail(m, err);
  if (t < 0) return herr_set(err, HEARTH_EINVAL, "grammar: the text does not fit the grammar");
  m->cur = t;
  return 0;
}

bool grammar_matcher_can_end(const grammar_matcher *m) { return m->finished || state_can_end(m, m->cur); }

int grammar_prefix_rules(const char *text, size_t len, const char *prefix, hbuf *out) {
  size_t plen = strlen(prefix);
  for (size_t i = 0; i < len;) {
    char c = text[i];
    if (c == '"' || c == '[') {
      /* a literal or a class: copied as is, escapes included */
      char close = c == '"' ? '"' : ']';
      size_t j = i + 1;
      while (j < len && text[j] != close) j += text[j] == '\\' ? 2 : 1;
      if (j > len) j = len;
      hbuf_append(out, text + i, (j < len ? j + 1 : len) - i);
      i = j < len ? j + 1 : len;
    } else if (c == '<') {
      /* a token terminal: copied as is */
      size_t j = i + 1;
      while (j < len && text[j] != '>' && text[j] != '\n') j++;
      j = j < len && text[j] == '>' ? j + 1 : j;
      hbuf_append(out, text + i, j - i);
      i = j;
    } else if (c == '#' || c == '{') {
      /* a comment, or a repetition count */
      size_t j = i;
      while (j < len && text[j] != (c == '#' ? '\n' : '}')) j++;
      hbuf_append(out, text + i, j - i);
      i = j;
    } else if (is_name_char(c)) {
      size_t j = i;
      while (j < len && is_name_char(text[j])) j++;
      hbuf_append(out, prefix, plen);
      hbuf_append(out, text + i, j - i);
      i = j;
    } else {
      hbuf_putc(out, c);
      i++;
    }
  }
  return out->oom ? -1 : 0;
}
