/* jinja_parse.c — Jinja2's grammar: tokens from jinja_lex.c become a syntax
 * tree (jinja_internal.h) with Jinja2's operator precedence, statements
 * (if/for/set/macro/call/filter/with/generation/break/continue) and its
 * syntax errors. Knows nothing of values beyond literals, nor of rendering. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja_internal.h"

#define MAX_PARSE_DEPTH 200

typedef struct parser {
  jarena *a;
  jtoken *t;
  size_t n, pos;
  herr *err;
  int err_line;
  int depth;      /* nesting of expressions / statements */
  int loop_depth; /* for break/continue */
  int soft;       /* inside if-blocks: unknown filters and tests fail only when run, as in Jinja2 */
} parser;

static int fail_at(parser *P, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail_at(parser *P, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char tmp[600];
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  P->err_line = line;
  return herr_set(P->err, HEARTH_EFORMAT, "%s", tmp);
}

static jtoken *cur(parser *P) { return &P->t[P->pos]; }
static jtoken *peek(parser *P) { return &P->t[P->pos + 1 < P->n ? P->pos + 1 : P->pos]; }
static void next(parser *P) {
  if (P->pos + 1 < P->n) P->pos++;
}

static bool tok_is(const jtoken *t, int type, const char *s) {
  if (t->type != type) return false;
  if (!s) return true;
  size_t k = strlen(s);
  return t->len == k && memcmp(t->s, s, k) == 0;
}
static bool is_op(parser *P, const char *s) { return tok_is(cur(P), T_OP, s); }
static bool is_name(parser *P, const char *s) { return tok_is(cur(P), T_NAME, s); }
static bool skip_op(parser *P, const char *s) {
  if (!is_op(P, s)) return false;
  next(P);
  return true;
}
static bool skip_name(parser *P, const char *s) {
  if (!is_name(P, s)) return false;
  next(P);
  return true;
}

static const char *tok_desc(parser *P, const jtoken *t, char *buf, size_t cap) {
  switch (t->type) {
    case T_EOF: return "end of template";
    case T_BLOCK_END: return "end of statement block";
    case T_VAR_END: return "end of print statement";
    case T_BLOCK_BEGIN: return "begin of statement block";
    case T_VAR_BEGIN: return "begin of print statement";
    case T_DATA: return "template data";
    default: snprintf(buf, cap, "%.*s", (int)(t->len > 60 ? 60 : t->len), t->s); return buf;
  }
}

static int expect_op(parser *P, const char *s) {
  if (skip_op(P, s)) return 0;
  char b[80];
  return fail_at(P, cur(P)->line, "expected token '%s', got '%s'", s, tok_desc(P, cur(P), b, sizeof b));
}

static int expect_type(parser *P, int type, const char *what) {
  if (cur(P)->type == type) {
    next(P);
    return 0;
  }
  char b[80];
  return fail_at(P, cur(P)->line, "expected token '%s', got '%s'", what, tok_desc(P, cur(P), b, sizeof b));
}

static jnode *node(parser *P, int kind, int line) {
  jnode *n = jarena_alloc(P->a, sizeof *n);
  if (n) {
    n->kind = (uint8_t)kind;
    n->line = line;
  }
  return n;
}

static const char *tok_str(parser *P, const jtoken *t) { return jarena_strdup(P->a, t->s, t->len); }

/* A growable array of node pointers (arena). */
typedef struct nvec { jnode **v; int n, cap; } nvec;
static bool nvec_push(parser *P, nvec *v, jnode *x) {
  if (v->n == v->cap) {
    int cap = v->cap ? v->cap * 2 : 4;
    jnode **p = jarena_alloc(P->a, (size_t)cap * sizeof *p);
    if (!p) return false;
    if (v->n) memcpy(p, v->v, (size_t)v->n * sizeof *p);
    v->v = p;
    v->cap = cap;
  }
  v->v[v->n++] = x;
  return true;
}
typedef struct svec { const char **v; int n, cap; } svec;
static bool svec_push(parser *P, svec *v, const char *x) {
  if (v->n == v->cap) {
    int cap = v->cap ? v->cap * 2 : 4;
    const char **p = jarena_alloc(P->a, (size_t)cap * sizeof *p);
    if (!p) return false;
    if (v->n) memcpy(p, v->v, (size_t)v->n * sizeof *p);
    v->v = p;
    v->cap = cap;
  }
  v->v[v->n++] = x;
  return true;
}

#define OOM() fail_at(P, cur(P)->line, "out of memory")
#define TRY(x)              \
  do {                      \
    int rc_ = (x);          \
    if (rc_) return rc_;    \
  } while (0)

static int parse_expression(parser *P, bool with_condexpr, jnode **out);
static int parse_tuple(parser *P, bool simplified, bool with_condexpr, const char *extra_end, bool explicit_parens, jnode **out);
static int parse_primary(parser *P, jnode **out);
static int parse_postfix(parser *P, jnode **node_io);
static int parse_filter_expr(parser *P, jnode **node_io);
static int parse_unary(parser *P, bool with_filter, jnode **out);
static int parse_or(parser *P, jnode **out);

static int enter(parser *P) {
  if (++P->depth > MAX_PARSE_DEPTH) return fail_at(P, cur(P)->line, "template nested too deeply");
  return 0;
}

/* ---- expressions ---- */

static int parse_call_args(parser *P, jnode *call) {
  TRY(expect_op(P, "("));
  nvec args = {0}, kwvals = {0};
  svec kwnames = {0};
  bool first = true;
  while (!is_op(P, ")")) {
    if (!first) {
      TRY(expect_op(P, ","));
      if (is_op(P, ")")) break;
    }
    first = false;
    if (skip_op(P, "*")) {
      TRY(parse_expression(P, true, &call->c));
    } else if (skip_op(P, "**")) {
      TRY(parse_expression(P, true, &call->d));
    } else if (cur(P)->type == T_NAME && tok_is(peek(P), T_OP, "=")) {
      const char *k = tok_str(P, cur(P));
      next(P);
      next(P);
      jnode *v;
      TRY(parse_expression(P, true, &v));
      if (!k || !svec_push(P, &kwnames, k) || !nvec_push(P, &kwvals, v)) return OOM();
    } else {
      if (kwnames.n) return fail_at(P, cur(P)->line, "positional argument follows keyword argument");
      jnode *v;
      TRY(parse_expression(P, true, &v));
      if (!nvec_push(P, &args, v)) return OOM();
    }
  }
  TRY(expect_op(P, ")"));
  call->list = args.v;
  call->n = args.n;
  call->list2 = kwvals.v;
  call->n2 = kwvals.n;
  call->names = kwnames.v;
  call->nnames = kwnames.n;
  return 0;
}

static int parse_subscribed(parser *P, jnode **out) {
  int line = cur(P)->line;
  jnode *args[3] = {0};
  if (skip_op(P, ":")) {
    args[0] = NULL;
  } else {
    jnode *e;
    TRY(parse_expression(P, true, &e));
    if (!is_op(P, ":")) {
      *out = e;
      return 0;
    }
    next(P);
    args[0] = e;
  }
  if (!is_op(P, "]") && !is_op(P, ",") && !is_op(P, ":")) TRY(parse_expression(P, true, &args[1]));
  if (skip_op(P, ":")) {
    if (!is_op(P, "]") && !is_op(P, ",")) TRY(parse_expression(P, true, &args[2]));
  }
  jnode *s = node(P, E_SLICE, line);
  if (!s) return OOM();
  s->b = args[0];
  s->c = args[1];
  s->d = args[2];
  *out = s;
  return 0;
}

static int parse_postfix(parser *P, jnode **io) {
  for (;;) {
    int line = cur(P)->line;
    if (skip_op(P, ".")) {
      jtoken *t = cur(P);
      if (t->type == T_NAME) {
        jnode *g = node(P, E_GETATTR, line);
        if (!g) return OOM();
        g->a = *io;
        g->str = tok_str(P, t);
        g->slen = t->len;
        next(P);
        *io = g;
      } else if (t->type == T_INT) {
        jnode *g = node(P, E_GETITEM, line), *k = node(P, E_CONST, line);
        if (!g || !k) return OOM();
        k->lit = jv_int(t->i);
        g->a = *io;
        g->b = k;
        next(P);
        *io = g;
      } else {
        char b[80];
        return fail_at(P, line, "expected name or number, got '%s'", tok_desc(P, t, b, sizeof b));
      }
    } else if (skip_op(P, "[")) {
      nvec idx = {0};
      while (!is_op(P, "]")) {
        if (idx.n) TRY(expect_op(P, ","));
        if (is_op(P, "]")) break;
        jnode *e = NULL;
        TRY(parse_subscribed(P, &e));
        if (!nvec_push(P, &idx, e)) return OOM();
      }
      TRY(expect_op(P, "]"));
      if (idx.n == 0) return fail_at(P, line, "expected subscript expression");
      jnode *key = idx.v[0];
      if (idx.n > 1) {
        key = node(P, E_TUPLE, line);
        if (!key) return OOM();
        key->list = idx.v;
        key->n = idx.n;
      }
      jnode *g;
      if (key->kind == E_SLICE) {
        g = key;
        g->a = *io;
      } else {
        g = node(P, E_GETITEM, line);
        if (!g) return OOM();
        g->a = *io;
        g->b = key;
      }
      *io = g;
    } else if (is_op(P, "(")) {
      jnode *c = node(P, E_CALL, line);
      if (!c) return OOM();
      c->a = *io;
      TRY(parse_call_args(P, c));
      *io = c;
    } else {
      return 0;
    }
  }
}

static int parse_dotted_name(parser *P, const char **name, size_t *len) {
  if (cur(P)->type != T_NAME) {
    char b[80];
    return fail_at(P, cur(P)->line, "expected token 'name', got '%s'", tok_desc(P, cur(P), b, sizeof b));
  }
  hbuf nb = {0};
  hbuf_append(&nb, cur(P)->s, cur(P)->len);
  next(P);
  while (is_op(P, ".") && peek(P)->type == T_NAME) {
    next(P);
    hbuf_putc(&nb, '.');
    hbuf_append(&nb, cur(P)->s, cur(P)->len);
    next(P);
  }
  *name = jarena_strdup(P->a, hbuf_str(&nb), nb.len);
  *len = nb.len;
  hbuf_free(&nb);
  return *name ? 0 : OOM();
}

/* `| name(args)` chains; with start_inline the first '|' is absent (filter blocks). */
static int parse_filter(parser *P, jnode **io, bool start_inline) {
  while (is_op(P, "|") || start_inline) {
    if (!start_inline) next(P);
    start_inline = false;
    int line = cur(P)->line;
    jnode *f = node(P, E_FILTER, line);
    if (!f) return OOM();
    TRY(parse_dotted_name(P, &f->str, &f->slen));
    if (!P->soft && !jinja_known_filter(f->str)) return fail_at(P, line, "No filter named '%s'.", f->str);
    if (is_op(P, "(")) TRY(parse_call_args(P, f));
    f->a = *io;
    *io = f;
  }
  return 0;
}

static int parse_test(parser *P, jnode **io) {
  int line = cur(P)->line;
  next(P); /* 'is' */
  bool negated = skip_name(P, "not");
  jnode *t = node(P, E_TEST, line);
  if (!t) return OOM();
  TRY(parse_dotted_name(P, &t->str, &t->slen));
  if (!P->soft && !jinja_known_test(t->str)) return fail_at(P, line, "No test named '%s'.", t->str);
  jtoken *c = cur(P);
  if (is_op(P, "(")) {
    TRY(parse_call_args(P, t));
  } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT || c->type == T_FLOAT || is_op(P, "[") ||
              is_op(P, "{")) &&
             !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and")) {
    if (is_name(P, "is")) return fail_at(P, c->line, "You cannot chain multiple tests with is");
    jnode *arg;
    TRY(parse_primary(P, &arg));
    TRY(parse_postfix(P, &arg));
    jnode **l = jarena_alloc(P->a, sizeof *l);
    if (!l) return OOM();
    l[0] = arg;
    t->list = l;
    t->n = 1;
  }
  t->a = *io;
  if (negated) {
    jnode *n = node(P, E_NOT, line);
    if (!n) return OOM();
    n->a = t;
    *io = n;
  } else {
    *io = t;
  }
  return 0;
}

static int parse_filter_expr(parser *P, jnode **io) {
  for (;;) {
    if (is_op(P, "|")) TRY(parse_filter(P, io, false));
    else if (is_name(P, "is")) TRY(parse_test(P, io));
    else if (is_op(P, "(")) {
      jnode *c = node(P, E_CALL, cur(P)->line);
      if (!c) return OOM();
      c->a = *io;
      TRY(parse_call_args(P, c));
      *io = c;
    } else return 0;
  }
}

static int parse_primary(parser *P, jnode **out) {
  TRY(enter(P));
  jtoken *t = cur(P);
  int line = t->line;
  jnode *n = NULL;
  if (t->type == T_NAME) {
    n = node(P, E_CONST, line);
    if (!n) return OOM();
    if (tok_is(t, T_NAME, "true") || tok_is(t, T_NAME, "True")) n->lit = jv_bool(true);
    else if (tok_is(t, T_NAME, "false") || tok_is(t, T_NAME, "False")) n->lit = jv_bool(false);
    else if (tok_is(t, T_NAME, "none") || tok_is(t, T_NAME, "None")) n->lit = jv_none();
    else {
      n->kind = E_NAME;
      n->str = tok_str(P, t);
      n->slen = t->len;
    }
    next(P);
  } else if (t->type == T_STRING) {
    hbuf sb = {0};
    while (cur(P)->type == T_STRING) {
      hbuf_append(&sb, cur(P)->s, cur(P)->len);
      next(P);
    }
    n = node(P, E_CONST, line);
    if (!n) {
      hbuf_free(&sb);
      return OOM();
    }
    n->lit = jv_str(P->a, sb.data ? sb.data : "", sb.len);
    hbuf_free(&sb);
    if (n->lit.t != JV_STR) return OOM();
  } else if (t->type == T_INT || t->type == T_FLOAT) {
    n = node(P, E_CONST, line);
    if (!n) return OOM();
    n->lit = t->type == T_INT ? jv_int(t->i) : jv_float(t->f);
    next(P);
  } else if (skip_op(P, "(")) {
    TRY(parse_tuple(P, false, true, NULL, true, &n));
    TRY(expect_op(P, ")"));
  } else if (skip_op(P, "[")) {
    nvec items = {0};
    while (!is_op(P, "]")) {
      if (items.n) TRY(expect_op(P, ","));
      if (is_op(P, "]")) break;
      jnode *e = NULL;
      TRY(parse_expression(P, true, &e));
      if (!nvec_push(P, &items, e)) return OOM();
    }
    TRY(expect_op(P, "]"));
    n = node(P, E_LIST, line);
    if (!n) return OOM();
    n->list = items.v;
    n->n = items.n;
  } else if (skip_op(P, "{")) {
    nvec keys = {0}, vals = {0};
    while (!is_op(P, "}")) {
      if (keys.n) TRY(expect_op(P, ","));
      if (is_op(P, "}")) break;
      jnode *k, *v;
      TRY(parse_expression(P, true, &k));
      TRY(expect_op(P, ":"));
      TRY(parse_expression(P, true, &v));
      if (!nvec_push(P, &keys, k) || !nvec_push(P, &vals, v)) return OOM();
    }
    TRY(expect_op(P, "}"));
    n = node(P, E_DICT, line);
    if (!n) return OOM();
    n->list = keys.v;
    n->n = keys.n;
    n->list2 = vals.v;
    n->n2 = vals.n;
  } else {
    char b[80];
    return fail_at(P, line, "unexpected '%s'", tok_desc(P, t, b, sizeof b));
  }
  P->depth--;
  *out = n;
  return 0;
}

static int parse_unary(parser *P, bool with_filter, jnode **out) {
  TRY(enter(P));
  int line = cur(P)->line;
  jnode *n;
  if (is_op(P, "-") || is_op(P, "+")) {
    bool neg = is_op(P, "-");
    next(P);
    jnode *x;
    TRY(parse_unary(P, false, &x));
    n = node(P, neg ? E_NEG : E_POS, line);
    if (!n) return OOM();
    n->a = x;
  } else {
    TRY(parse_primary(P, &n));
  }
  TRY(parse_postfix(P, &n));
  if (with_filter) TRY(parse_filter_expr(P, &n));
  P->depth--;
  *out = n;
  return 0;
}

/* The binary-operator ladder: each level is left-associative over the next
 * tighter one, `operand`, and knows its operators by their text (a symbol,
 * or a keyword when word) and the node each makes (E_BIN with its OP_*, or
 * E_CONCAT / E_AND / E_OR with op 0). From loosest to tightest: or, and,
 * (not, comparisons), + -, ~, * / // %, **. */
typedef struct binop_def {
  const char *text;
  bool word;
  uint8_t kind, op;
} binop_def;

static int parse_left_assoc(parser *P, jnode **out, int (*operand)(parser *, jnode **), const binop_def *defs, int n_defs) {
  TRY(operand(P, out));
  for (;;) {
    const binop_def *d = NULL;
    for (int i = 0; i < n_defs && !d; i++)
      if (defs[i].word ? is_name(P, defs[i].text) : is_op(P, defs[i].text)) d = &defs[i];
    if (!d) return 0;
    int line = cur(P)->line;
    next(P);
    jnode *r;
    TRY(operand(P, &r));
    jnode *b = node(P, d->kind, line);
    if (!b) return OOM();
    b->op = d->op;
    b->a = *out;
    b->b = r;
    *out = b;
  }
}

#define LADDER(P, out, operand, defs) parse_left_assoc(P, out, operand, defs, (int)(sizeof defs / sizeof defs[0]))

static int parse_unary_filtered(parser *P, jnode **out) { return parse_unary(P, true, out); }

static int parse_pow(parser *P, jnode **out) {
  static const binop_def ops[] = {{"**", false, E_BIN, OP_POW}};
  return LADDER(P, out, parse_unary_filtered, ops);
}

static int parse_math2(parser *P, jnode **out) {
  static const binop_def ops[] = {
      {"*", false, E_BIN, OP_MUL}, {"/", false, E_BIN, OP_DIV}, {"//", false, E_BIN, OP_FLOORDIV}, {"%", false, E_BIN, OP_MOD}};
  return LADDER(P, out, parse_pow, ops);
}

static int parse_concat(parser *P, jnode **out) {
  static const binop_def ops[] = {{"~", false, E_CONCAT, 0}};
  return LADDER(P, out, parse_math2, ops);
}

static int parse_math1(parser *P, jnode **out) {
  static const binop_def ops[] = {{"+", false, E_BIN, OP_ADD}, {"-", false, E_BIN, OP_SUB}};
  return LADDER(P, out, parse_concat, ops);
}

static int parse_compare(parser *P, jnode **out) {
  int line = cur(P)->line;
  jnode *first;
  TRY(parse_math1(P, &first));
  nvec operands = {0};
  uint8_t ops[64];
  int nops = 0;
  if (!nvec_push(P, &operands, first)) return OOM();
  for (;;) {
    int op = -1;
    if (is_op(P, "==")) op = OP_EQ;
    else if (is_op(P, "!=")) op = OP_NE;
    else if (is_op(P, "<")) op = OP_LT;
    else if (is_op(P, "<=")) op = OP_LE;
    else if (is_op(P, ">")) op = OP_GT;
    else if (is_op(P, ">=")) op = OP_GE;
    else if (is_name(P, "in")) op = OP_IN;
    else if (is_name(P, "not") && tok_is(peek(P), T_NAME, "in")) {
      next(P);
      op = OP_NOTIN;
    }
    if (op < 0) break;
    next(P);
    if (nops >= 64) return fail_at(P, line, "comparison chain too long");
    ops[nops++] = (uint8_t)op;
    jnode *r;
    TRY(parse_math1(P, &r));
    if (!nvec_push(P, &operands, r)) return OOM();
  }
  if (nops == 0) {
    *out = first;
    return 0;
  }
  jnode *n = node(P, E_COMPARE, line);
  if (!n) return OOM();
  n->list = operands.v;
  n->n = operands.n;
  n->ops = jarena_alloc(P->a, (size_t)nops);
  if (!n->ops) return OOM();
  memcpy(n->ops, ops, (size_t)nops);
  *out = n;
  return 0;
}

static int parse_not(parser *P, jnode **out) {
  if (is_name(P, "not")) {
    int line = cur(P)->line;
    next(P);
    TRY(enter(P));
    jnode *x;
    TRY(parse_not(P, &x));
    P->depth--;
    jnode *n = node(P, E_NOT, line);
    if (!n) return OOM();
    n->a = x;
    *out = n;
    return 0;
  }
  return parse_compare(P, out);
}

static int parse_and(parser *P, jnode **out) {
  static const binop_def ops[] = {{"and", true, E_AND, 0}};
  return LADDER(P, out, parse_not, ops);
}

static int parse_or(parser *P, jnode **out) {
  static const binop_def ops[] = {{"or", true, E_OR, 0}};
  return LADDER(P, out, parse_and, ops);
}

static int parse_condexpr(parser *P, jnode **out) {
  TRY(enter(P));
  TRY(parse_or(P, out));
  while (is_name(P, "if")) {
    int line = cur(P)->line;
    next(P);
    jnode *cond, *other = NULL;
    TRY(parse_or(P, &cond));
    if (skip_name(P, "else")) TRY(parse_condexpr(P, &other));
    jnode *n = node(P, E_COND, line);
    if (!n) return OOM();
    n->a = cond;
    n->b = *out;
    n->c = other;
    *out = n;
  }
  P->depth--;
  return 0;
}

static int parse_expression(parser *P, bool with_condexpr, jnode **out) {
  return with_condexpr ? parse_condexpr(P, out) : parse_or(P, out);
}

static bool tuple_end(parser *P, const char *extra_end) {
  jtoken *t = cur(P);
  if (t->type == T_VAR_END || t->type == T_BLOCK_END || t->type == T_EOF || is_op(P, ")")) return true;
  return extra_end && is_name(P, extra_end);
}

static int parse_tuple(parser *P, bool simplified, bool with_condexpr, const char *extra_end, bool explicit_parens,
                       jnode **out) {
  int line = cur(P)->line;
  nvec args = {0};
  bool is_tuple = false;
  for (;;) {
    if (args.n) TRY(expect_op(P, ","));
    if (tuple_end(P, extra_end)) break;
    jnode *e;
    if (simplified) TRY(parse_primary(P, &e));
    else TRY(parse_expression(P, with_condexpr, &e));
    if (!nvec_push(P, &args, e)) return OOM();
    if (is_op(P, ",")) is_tuple = true;
    else break;
  }
  if (!is_tuple) {
    if (args.n) {
      *out = args.v[0];
      return 0;
    }
    if (!explicit_parens) {
      char b[80];
      return fail_at(P, line, "Expected an expression, got '%s'", tok_desc(P, cur(P), b, sizeof b));
    }
  }
  jnode *n = node(P, E_TUPLE, line);
  if (!n) return OOM();
  n->list = args.v;
  n->n = args.n;
  *out = n;
  return 0;
}

/* ---- statements ---- */

static int subparse(parser *P, const char *const *end_names, jnode **body);

static int expect_block_end(parser *P) { return expect_type(P, T_BLOCK_END, "end of statement block"); }

/* After subparse stopped at an end name: consume it (and optionally check it) */
static int end_tag(parser *P, const char *name) {
  if (!skip_name(P, name)) {
    char b[80];
    return fail_at(P, cur(P)->line, "expected '%s', got '%s'", name, tok_desc(P, cur(P), b, sizeof b));
  }
  return expect_block_end(P);
}

static int assign_target(parser *P, const char *extra_end, bool with_namespace, jnode **out) {
  int line = cur(P)->line;
  if (with_namespace && cur(P)->type == T_NAME && tok_is(peek(P), T_OP, ".")) {
    jnode *n = node(P, E_NSREF, line);
    if (!n) return OOM();
    n->str = tok_str(P, cur(P));
    next(P);
    next(P);
    if (cur(P)->type != T_NAME) return fail_at(P, line, "expected an attribute name after '.'");
    n->names = jarena_alloc(P->a, sizeof(char *));
    if (!n->names) return OOM();
    n->names[0] = tok_str(P, cur(P));
    n->nnames = 1;
    next(P);
    *out = n;
    return 0;
  }
  jnode *t;
  TRY(parse_tuple(P, true, true, extra_end, false, &t));
  if (t->kind == E_NAME) {
    *out = t;
    return 0;
  }
  if (t->kind == E_TUPLE) {
    for (int i = 0; i < t->n; i++)
      if (t->list[i]->kind != E_NAME) return fail_at(P, line, "can't assign to '%s'", "tuple");
    *out = t;
    return 0;
  }
  return fail_at(P, line, "can't assign to '%s'", t->kind == E_CONST ? "const" : "expression");
}

/* Names of a target (E_NAME or E_TUPLE of names) into node->names. */
static int target_names(parser *P, jnode *target, jnode *into) {
  int k = target->kind == E_NAME ? 1 : target->n;
  into->names = jarena_alloc(P->a, (size_t)(k ? k : 1) * sizeof(char *));
  if (!into->names) return OOM();
  if (target->kind == E_NAME) into->names[0] = target->str;
  else
    for (int i = 0; i < k; i++) into->names[i] = target->list[i]->str;
  into->nnames = k;
  into->flag = target->kind == E_TUPLE;
  return 0;
}

static int parse_signature(parser *P, jnode *n) {
  TRY(expect_op(P, "("));
  svec names = {0};
  nvec defaults = {0};
  while (!is_op(P, ")")) {
    if (names.n) TRY(expect_op(P, ","));
    if (cur(P)->type != T_NAME) {
      char b[80];
      return fail_at(P, cur(P)->line, "expected token 'name', got '%s'", tok_desc(P, cur(P), b, sizeof b));
    }
    const char *nm = tok_str(P, cur(P));
    next(P);
    jnode *def = NULL;
    if (skip_op(P, "=")) TRY(parse_expression(P, true, &def));
    else if (defaults.n && defaults.v[defaults.n - 1]) return fail_at(P, cur(P)->line, "non-default argument follows default argument");
    if (!svec_push(P, &names, nm) || !nvec_push(P, &defaults, def)) return OOM();
  }
  TRY(expect_op(P, ")"));
  n->names = names.v;
  n->nnames = names.n;
  n->list2 = defaults.v;
  n->n2 = defaults.n;
  return 0;
}

static int parse_for(parser *P, int line, jnode **out) {
  jnode *n = node(P, S_FOR, line), *target;
  if (!n) return OOM();
  TRY(assign_target(P, "in", false, &target));
  TRY(target_names(P, target, n));
  if (!skip_name(P, "in")) return fail_at(P, cur(P)->line, "expected token 'in'");
  TRY(parse_tuple(P, false, false, "recursive", false, &n->a));
  if (skip_name(P, "if")) TRY(parse_expression(P, true, &n->b));
  if (skip_name(P, "recursive")) return fail_at(P, line, "recursive loops are not supported");
  TRY(expect_block_end(P));
  static const char *const ends1[] = {"endfor", "else", NULL};
  static const char *const ends2[] = {"endfor", NULL};
  P->loop_depth++;
  jnode *body, *els = NULL;
  TRY(subparse(P, ends1, &body));
  P->loop_depth--;
  if (skip_name(P, "else")) {
    TRY(expect_block_end(P));
    TRY(subparse(P, ends2, &els));
  }
  TRY(end_tag(P, "endfor"));
  n->c = body;
  n->d = els;
  *out = n;
  return 0;
}

static int parse_if_chain(parser *P, jnode *n, const char *const *ends, const char *const *ends_else);

static int parse_if(parser *P, int line, jnode **out) {
  static const char *const ends[] = {"elif", "else", "endif", NULL};
  static const char *const ends_else[] = {"endif", NULL};
  jnode *n = node(P, S_IF, line);
  if (!n) return OOM();
  *out = n;
  P->soft++;
  int rc = parse_if_chain(P, n, ends, ends_else);
  P->soft--;
  return rc;
}

static int parse_if_chain(parser *P, jnode *n, const char *const *ends, const char *const *ends_else) {
  for (;;) {
    TRY(parse_tuple(P, false, false, NULL, false, &n->a));
    TRY(expect_block_end(P));
    TRY(subparse(P, ends, &n->b));
    if (skip_name(P, "elif")) {
      jnode *e = node(P, S_IF, cur(P)->line);
      if (!e) return OOM();
      n->c = e;
      n = e;
      continue;
    }
    if (skip_name(P, "else")) {
      TRY(expect_block_end(P));
      TRY(subparse(P, ends_else, &n->c));
    }
    return end_tag(P, "endif");
  }
}

static int parse_set(parser *P, int line, jnode **out) {
  jnode *target;
  TRY(assign_target(P, NULL, true, &target));
  if (skip_op(P, "=")) {
    jnode *n = node(P, S_SET, line);
    if (!n) return OOM();
    n->a = target;
    TRY(parse_tuple(P, false, true, NULL, false, &n->b));
    TRY(expect_block_end(P));
    *out = n;
    return 0;
  }
  jnode *n = node(P, S_SETBLOCK, line);
  if (!n) return OOM();
  n->a = target;
  if (is_op(P, "|")) {
    jnode *f = node(P, E_FILTER_INPUT, line);
    if (!f) return OOM();
    TRY(parse_filter(P, &f, false));
    n->d = f;
  }
  TRY(expect_block_end(P));
  static const char *const ends[] = {"endset", NULL};
  TRY(subparse(P, ends, &n->c));
  TRY(end_tag(P, "endset"));
  *out = n;
  return 0;
}

static int parse_macro(parser *P, int line, jnode **out) {
  jnode *n = node(P, S_MACRO, line);
  if (!n) return OOM();
  if (cur(P)->type != T_NAME) return fail_at(P, line, "expected macro name");
  n->str = tok_str(P, cur(P));
  n->slen = cur(P)->len;
  next(P);
  TRY(parse_signature(P, n));
  TRY(expect_block_end(P));
  static const char *const ends[] = {"endmacro", NULL};
  int saved = P->loop_depth;
  P->loop_depth = 0;
  TRY(subparse(P, ends, &n->c));
  P->loop_depth = saved;
  TRY(end_tag(P, "endmacro"));
  *out = n;
  return 0;
}

static int parse_call_block(parser *P, int line, jnode **out) {
  jnode *n = node(P, S_CALLBLOCK, line);
  if (!n) return OOM();
  if (is_op(P, "(")) TRY(parse_signature(P, n));
  TRY(parse_expression(P, true, &n->a));
  if (n->a->kind != E_CALL) return fail_at(P, line, "expected call");
  TRY(expect_block_end(P));
  static const char *const ends[] = {"endcall", NULL};
  int saved = P->loop_depth;
  P->loop_depth = 0;
  TRY(subparse(P, ends, &n->c));
  P->loop_depth = saved;
  TRY(end_tag(P, "endcall"));
  *out = n;
  return 0;
}

static int parse_filter_block(parser *P, int line, jnode **out) {
  jnode *n = node(P, S_FILTERBLOCK, line);
  if (!n) return OOM();
  jnode *f = node(P, E_FILTER_INPUT, line);
  if (!f) return OOM();
  TRY(parse_filter(P, &f, true));
  n->a = f;
  TRY(expect_block_end(P));
  static const char *const ends[] = {"endfilter", NULL};
  TRY(subparse(P, ends, &n->c));
  TRY(end_tag(P, "endfilter"));
  *out = n;
  return 0;
}

static int parse_with(parser *P, int line, jnode **out) {
  jnode *n = node(P, S_WITH, line);
  if (!n) return OOM();
  svec names = {0};
  nvec vals = {0};
  while (cur(P)->type != T_BLOCK_END) {
    if (names.n) TRY(expect_op(P, ","));
    if (cur(P)->type != T_NAME) return fail_at(P, cur(P)->line, "expected a name in 'with'");
    const char *nm = tok_str(P, cur(P));
    next(P);
    TRY(expect_op(P, "="));
    jnode *v;
    TRY(parse_expression(P, true, &v));
    if (!svec_push(P, &names, nm) || !nvec_push(P, &vals, v)) return OOM();
  }
  TRY(expect_block_end(P));
  n->names = names.v;
  n->nnames = names.n;
  n->list2 = vals.v;
  n->n2 = vals.n;
  static const char *const ends[] = {"endwith", NULL};
  TRY(subparse(P, ends, &n->c));
  TRY(end_tag(P, "endwith"));
  *out = n;
  return 0;
}

static int parse_statement(parser *P, jnode **out) {
  jtoken *t = cur(P);
  int line = t->line;
  if (t->type != T_NAME) return fail_at(P, line, "tag name expected");
  TRY(enter(P));
  int rc;
  if (skip_name(P, "for")) rc = parse_for(P, line, out);
  else if (skip_name(P, "if")) rc = parse_if(P, line, out);
  else if (skip_name(P, "set")) rc = parse_set(P, line, out);
  else if (skip_name(P, "macro")) rc = parse_macro(P, line, out);
  else if (skip_name(P, "call")) rc = parse_call_block(P, line, out);
  else if (skip_name(P, "filter")) rc = parse_filter_block(P, line, out);
  else if (skip_name(P, "with")) rc = parse_with(P, line, out);
  else if (skip_name(P, "print")) {
    jnode *n = node(P, S_OUTPUT, line);
    if (!n) return OOM();
    rc = parse_tuple(P, false, true, NULL, false, &n->a);
    if (!rc) rc = expect_block_end(P);
    *out = n;
  } else if (is_name(P, "break") || is_name(P, "continue")) {
    bool brk = is_name(P, "break");
    next(P);
    if (P->loop_depth == 0)
      return fail_at(P, line, "Encountered '%s' outside of a loop", brk ? "break" : "continue");
    jnode *n = node(P, brk ? S_BREAK : S_CONTINUE, line);
    if (!n) return OOM();
    *out = n;
    rc = expect_block_end(P);
  } else if (skip_name(P, "generation")) {
    jnode *n = node(P, S_SCOPE, line);
    if (!n) return OOM();
    rc = expect_block_end(P);
    static const char *const ends[] = {"endgeneration", NULL};
    if (!rc) rc = subparse(P, ends, &n->c);
    if (!rc) rc = end_tag(P, "endgeneration");
    *out = n;
  } else {
    return fail_at(P, line, "Encountered unknown tag '%.*s'.", (int)(t->len > 60 ? 60 : t->len), t->s);
  }
  P->depth--;
  return rc;
}

static bool is_end_name(parser *P, const char *const *ends) {
  if (!ends) return false;
  for (int i = 0; ends[i]; i++)
    if (is_name(P, ends[i])) return true;
  return false;
}

/* Statements until EOF (ends == NULL) or a block whose tag is in ends; stops on
 * that tag's name. The body is an S_SCOPE-free list in (*body)->list. */
static int subparse(parser *P, const char *const *ends, jnode **body) {
  jnode *b = node(P, S_SCOPE, cur(P)->line);
  if (!b) return OOM();
  nvec items = {0};
  for (;;) {
    jtoken *t = cur(P);
    if (t->type == T_EOF) {
      if (ends) {
        hbuf m = {0};
        for (int i = 0; ends[i]; i++) hbuf_printf(&m, "%s'%s'", i ? " or " : "", ends[i]);
        int rc = fail_at(P, t->line, "Unexpected end of template. Jinja was looking for the following tags: %s.",
                         hbuf_str(&m));
        hbuf_free(&m);
        return rc;
      }
      break;
    }
    if (t->type == T_DATA) {
      jnode *d = node(P, S_DATA, t->line);
      if (!d) return OOM();
      d->str = t->s;
      d->slen = t->len;
      if (!nvec_push(P, &items, d)) return OOM();
      next(P);
    } else if (t->type == T_VAR_BEGIN) {
      next(P);
      jnode *o = node(P, S_OUTPUT, t->line);
      if (!o) return OOM();
      TRY(parse_tuple(P, false, true, NULL, false, &o->a));
      TRY(expect_type(P, T_VAR_END, "end of print statement"));
      if (!nvec_push(P, &items, o)) return OOM();
    } else if (t->type == T_BLOCK_BEGIN) {
      next(P);
      if (is_end_name(P, ends)) break;
      if (cur(P)->type == T_NAME && cur(P)->len > 3 && memcmp(cur(P)->s, "end", 3) == 0 && !is_name(P, "endraw")) {
        char b2[80];
        return fail_at(P, cur(P)->line, "Encountered unknown tag '%s'.", tok_desc(P, cur(P), b2, sizeof b2));
      }
      jnode *s = NULL;
      TRY(parse_statement(P, &s));
      if (!nvec_push(P, &items, s)) return OOM();
    } else {
      char b2[80];
      return fail_at(P, t->line, "unexpected '%s'", tok_desc(P, t, b2, sizeof b2));
    }
  }
  b->list = items.v;
  b->n = items.n;
  *body = b;
  return 0;
}

int jinja_parse(const char *src, size_t len, const char *name, jinja_template **out, herr *err) {
  *out = NULL;
  jinja_template *t = calloc(1, sizeof *t);
  if (!t) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  t->name = strdup(name ? name : "template");
  if (!t->name) {
    free(t);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  jtoken *toks;
  size_t ntoks;
  int line = 0;
  herr e = {0};
  int rc = jinja_lex(&t->arena, src, len, &toks, &ntoks, &e, &line);
  if (!rc) {
    parser P = {.a = &t->arena, .t = toks, .n = ntoks, .err = &e};
    rc = subparse(&P, NULL, &t->body);
    line = P.err_line;
    free(toks);
    if (!rc) jinja_mark_constants(t->body, 0);
  }
  if (rc) {
    herr_set(err, rc, "%s:%d: %s", t->name, line, e.msg);
    jinja_free(t);
    return rc;
  }
  *out = t;
  return 0;
}

void jinja_free(jinja_template *t) {
  if (!t) return;
  jarena_free(&t->arena);
  free(t->name);
  free(t);
}

size_t jinja_error_prefix_len(const herr *err) {
  const char *m = err->msg;
  for (const char *p = m; *p; p++) {
    if (*p != ':') continue;
    const char *q = p + 1;
    if (*q < '0' || *q > '9') continue;
    while (*q >= '0' && *q <= '9') q++;
    if (q[0] == ':' && q[1] == ' ') return (size_t)(q + 2 - m);
  }
  return 0;
}
