/* jinja_render.c — evaluates a parsed template: scopes (Jinja2's: loop bodies,
 * macros, call blocks and with-blocks are scopes, if-blocks are not), the
 * loop object, macros and caller, Undefined and its errors, the operators
 * with Python's semantics, attribute/item lookup, the sandbox's refusals
 * (mutating methods, huge ranges), and the limits that stop hostile
 * templates. Filters, tests and methods live in jinja_builtins.c. Knows
 * nothing of chat messages or tokenizers. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat/jinja_eval.h"

/* ---- errors ---- */

int jr_fail(jrender *r, int code, const char *fmt, ...) {
  if (r->failed) return r->failed;
  va_list ap;
  va_start(ap, fmt);
  char tmp[900];
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  herr_set(r->err, code, "%s:%d: %s", r->t->name, r->line, tmp);
  r->failed = code;
  return code;
}

int jr_fail_undef(jrender *r, jv v) {
  if (v.t == JV_UNDEF && v.hint) return jr_fail(r, HEARTH_EINVAL, "%s", v.hint);
  return jr_fail(r, HEARTH_EINVAL, "value is undefined");
}

int jr_oom(jrender *r) {
  if (r->a->over)
    return jr_fail(r, HEARTH_ELIMIT, "the template used more than %zu bytes of memory", r->lim.max_memory);
  return jr_fail(r, HEARTH_ENOMEM, "out of memory");
}

int jr_step(jrender *r) {
  if (++r->steps > r->lim.max_steps)
    return jr_fail(r, HEARTH_ELIMIT, "the template ran more than %lld steps", (long long)r->lim.max_steps);
  return 0;
}

/* ---- strings ---- */

int jr_make_str(jrender *r, const char *s, size_t n, jv *out) {
  if (n > r->lim.max_output)
    return jr_fail(r, HEARTH_ELIMIT, "a string of %zu bytes exceeds the output limit of %zu bytes", n, r->lim.max_output);
  *out = jv_str(r->a, s, n);
  if (out->t != JV_STR) return jr_oom(r);
  return 0;
}

int jr_buf_str(jrender *r, hbuf *b, jv *out) {
  if (b->oom) {
    hbuf_free(b);
    return jr_oom(r);
  }
  int rc = jr_make_str(r, b->data ? b->data : "", b->len, out);
  hbuf_free(b);
  return rc;
}

int jr_to_str(jrender *r, jv v, jv *out) {
  if (v.t == JV_STR) {
    *out = v;
    return 0;
  }
  hbuf b = {0};
  jv_to_str(&b, v);
  return jr_buf_str(r, &b, out);
}

/* ---- scopes ---- */

jscope *jr_scope(jrender *r, jscope *parent) {
  jscope *s = jarena_alloc(r->a, sizeof *s);
  if (s) s->parent = parent;
  return s;
}

jv *jr_lookup(jscope *s, const char *name) {
  for (; s; s = s->parent) {
    jv *v = jdict_gets(&s->vars, name);
    if (v) return v;
  }
  return NULL;
}

int jr_bind(jrender *r, jscope *s, const char *name, jv v) {
  jv *have = jdict_gets(&s->vars, name);
  if (have) {
    *have = v;
    return 0;
  }
  jv key = jv_cstr(r->a, name);
  if (key.t != JV_STR || !jdict_set(r->a, &s->vars, key, v)) return jr_oom(r);
  return 0;
}

/* ---- iteration: the items a for loop / filter sees ---- */

int jr_iterate(jrender *r, jv v, jv **items, size_t *n) {
  switch (v.t) {
    case JV_LIST:
      if (v.l->error) return jr_fail(r, HEARTH_EINVAL, "%s", v.l->error);
      if (v.view == VIEW_GENERATOR || v.view == VIEW_REVITER) { /* an iterator is used up by iterating it */
        *items = v.l->items ? v.l->items + v.l->consumed : NULL;
        *n = v.l->n - v.l->consumed;
        v.l->consumed = v.l->n;
        return 0;
      }
      *items = v.l->items;
      *n = v.l->n;
      return 0;
    case JV_DICT: *items = v.d->keys; *n = v.d->n; return 0;
    case JV_UNDEF: *items = NULL; *n = 0; return 0;
    case JV_STR: {
      jv l;
      TRY(jr_str_chars(r, v, &l));
      *items = l.l->items;
      *n = l.l->n;
      return 0;
    }
    default: return jr_fail(r, HEARTH_EINVAL, "'%s' object is not iterable", jv_type_name(v));
  }
}

int jr_str_chars(jrender *r, jv v, jv *out) {
  *out = jv_list(r->a, v.s->len);
  if (out->t != JV_LIST) return jr_oom(r);
  const char *s = v.s->data;
  size_t n = v.s->len;
  for (size_t i = 0; i < n;) {
    size_t k = jr_cp_len(s + i, n - i);
    jv c;
    TRY(jr_make_str(r, s + i, k, &c));
    if (!jlist_push(r->a, out->l, c)) return jr_oom(r);
    i += k;
  }
  return 0;
}

size_t jr_cp_len(const char *s, size_t n) {
  unsigned char c = (unsigned char)s[0];
  size_t k = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
  if (k > n) k = n;
  for (size_t j = 1; j < k; j++)
    if (((unsigned char)s[j] & 0xc0) != 0x80) return j;
  return k ? k : 1;
}

size_t jr_str_cplen(jv v) {
  size_t k = 0;
  for (size_t i = 0; i < v.s->len; i++) k += ((unsigned char)v.s->data[i] & 0xc0) != 0x80;
  return k;
}

/* ---- attribute and item lookup ---- */

static const char *type_repr(jv v) {
  switch (v.t) {
    case JV_NONE: return "'None'";
    case JV_DICT: return "'dict object'";
    case JV_LIST: return v.tuple ? "'tuple object'" : "'list object'";
    case JV_STR: return "'str object'";
    case JV_INT: return "'int object'";
    case JV_FLOAT: return "'float object'";
    case JV_BOOL: return "'bool object'";
    case JV_NS: return "'jinja2.utils.Namespace object'";
    case JV_LOOP: return "'jinja2.runtime.LoopContext object'";
    default: return "'object'";
  }
}

static jv undef_attr(jrender *r, jv obj, const char *name) {
  char *h = jarena_alloc(r->a, strlen(name) + 80);
  if (!h) return jv_undef("out of memory");
  sprintf(h, "%s has no attribute '%s'", type_repr(obj), name);
  return jv_undef(h);
}

static jv undef_elem(jrender *r, jv obj, jv key) {
  hbuf b = {0};
  const char *tr = type_repr(obj);
  if (obj.t == JV_NONE) hbuf_puts(&b, "None");
  else hbuf_append(&b, tr + 1, strlen(tr) - 2);
  hbuf_puts(&b, " has no element ");
  jv_repr(&b, key);
  char *h = b.oom ? NULL : jarena_strdup(r->a, hbuf_str(&b), b.len);
  hbuf_free(&b);
  return jv_undef(h ? h : "undefined element");
}

static int loop_attr(jrender *r, jloop *L, const char *name, jv *out) {
  int64_t n = (int64_t)L->n, i = (int64_t)L->i;
  if (!strcmp(name, "index")) *out = jv_int(i + 1);
  else if (!strcmp(name, "index0")) *out = jv_int(i);
  else if (!strcmp(name, "revindex")) *out = jv_int(n - i);
  else if (!strcmp(name, "revindex0")) *out = jv_int(n - i - 1);
  else if (!strcmp(name, "first")) *out = jv_bool(i == 0);
  else if (!strcmp(name, "last")) *out = jv_bool(i == n - 1);
  else if (!strcmp(name, "length")) *out = jv_int(n);
  else if (!strcmp(name, "depth")) *out = jv_int(L->depth);
  else if (!strcmp(name, "depth0")) *out = jv_int(L->depth - 1);
  else if (!strcmp(name, "previtem")) *out = i > 0 ? L->items[i - 1] : jv_undef("there is no previous item");
  else if (!strcmp(name, "nextitem")) *out = i + 1 < n ? L->items[i + 1] : jv_undef("there is no next item");
  else if (!strcmp(name, "cycle") || !strcmp(name, "changed")) return jr_method(r, (jv){.t = JV_LOOP, .loop = L}, name, out);
  else *out = undef_attr(r, (jv){.t = JV_LOOP, .loop = L}, name);
  return 0;
}

/* obj.name: attribute first (methods), then item — Jinja2's environment.getattr. */
int jr_getattr(jrender *r, jv obj, const char *name, jv *out) {
  switch (obj.t) {
    case JV_UNDEF: return jr_fail_undef(r, obj);
    case JV_LOOP: return loop_attr(r, obj.loop, name, out);
    case JV_NS: {
      jv *v = jdict_gets(obj.d, name);
      *out = v ? *v : undef_attr(r, obj, name);
      return 0;
    }
    case JV_DICT: {
      if (name[0] != '_' && jr_has_method(obj, name)) return jr_method(r, obj, name, out);
      jv *v = jdict_gets(obj.d, name);
      *out = v ? *v : undef_attr(r, obj, name);
      return 0;
    }
    case JV_STR: case JV_LIST:
      if (name[0] != '_' && jr_has_method(obj, name)) return jr_method(r, obj, name, out);
      *out = undef_attr(r, obj, name);
      return 0;
    default: *out = undef_attr(r, obj, name); return 0;
  }
}

static int str_index(jrender *r, jv s, int64_t idx, jv *out, bool *found) {
  int64_t n = (int64_t)jr_str_cplen(s);
  if (idx < 0) idx += n;
  *found = idx >= 0 && idx < n;
  if (!*found) return 0;
  size_t i = 0;
  for (int64_t k = 0; k < idx; k++) i += jr_cp_len(s.s->data + i, s.s->len - i);
  return jr_make_str(r, s.s->data + i, jr_cp_len(s.s->data + i, s.s->len - i), out);
}

/* obj[key]: item first, then attribute — Jinja2's environment.getitem. */
int jr_getitem(jrender *r, jv obj, jv key, jv *out) {
  if (obj.t == JV_UNDEF) return jr_fail_undef(r, obj);
  if (obj.t == JV_LIST && obj.view && !(key.t == JV_STR)) { /* TypeError inside getitem: Undefined */
    *out = undef_elem(r, obj, key);
    return 0;
  }
  if (obj.t == JV_DICT) {
    jv *v = jdict_get(obj.d, key);
    if (v) {
      *out = *v;
      return 0;
    }
  } else if ((obj.t == JV_LIST || obj.t == JV_STR) && (key.t == JV_INT || key.t == JV_BOOL)) {
    int64_t idx = key.t == JV_BOOL ? key.b : key.i;
    if (obj.t == JV_LIST) {
      int64_t n = (int64_t)obj.l->n;
      if (idx < 0) idx += n;
      if (idx >= 0 && idx < n) {
        *out = obj.l->items[idx];
        return 0;
      }
    } else {
      bool found;
      TRY(str_index(r, obj, idx, out, &found));
      if (found) return 0;
    }
    *out = undef_elem(r, obj, key);
    return 0;
  }
  if (key.t == JV_STR && obj.t != JV_DICT) return jr_getattr(r, obj, key.s->data, out);
  if (key.t == JV_STR && obj.t == JV_DICT) {
    if (jr_has_method(obj, key.s->data) && key.s->data[0] != '_') return jr_method(r, obj, key.s->data, out);
    *out = undef_attr(r, obj, key.s->data);
    return 0;
  }
  *out = undef_elem(r, obj, key);
  return 0;
}

static bool const_foldable_compute(jnode *n, int depth);

/* Whether Jinja2's compiler would have folded n to a constant (nodes.as_const):
 * literals and operators, tests and filters (but the context-taking ones) over
 * constants. A failed slice of such an expression renders as Undefined, because
 * the folding goes through the sandbox's getitem, which swallows the TypeError. */
static bool const_foldable(jnode *n, int depth) {
  if (!n) return true;
  if (n->konst_known) return n->konst;
  if (depth > 100) return false;
  bool k = const_foldable_compute(n, depth);
  n->konst = k;
  n->konst_known = true;
  return k;
}

static bool const_foldable_compute(jnode *n, int depth) {
  switch (n->kind) {
    case E_CONST: return true;
    case E_NAME: case E_CALL: case E_FILTER_INPUT: case E_NSREF: return false;
    case E_COND: case E_AND: case E_OR: /* short-circuits: the branch taken decides (checked while folding) */
      return const_foldable(n->a, depth + 1);
    case E_FILTER:
      if (!strcmp(n->str, "map") || !strcmp(n->str, "select") || !strcmp(n->str, "reject") ||
          !strcmp(n->str, "selectattr") || !strcmp(n->str, "rejectattr") || n->c || n->d)
        return false;
      break;
    default: break;
  }
  if (!const_foldable(n->a, depth + 1) || !const_foldable(n->b, depth + 1) || !const_foldable(n->c, depth + 1) ||
      !const_foldable(n->d, depth + 1))
    return false;
  for (int i = 0; i < n->n; i++)
    if (!const_foldable(n->list[i], depth + 1)) return false;
  for (int i = 0; i < n->n2; i++)
    if (!const_foldable(n->list2[i], depth + 1)) return false;
  return true;
}

void jinja_mark_constants(jnode *n, int depth) {
  if (!n || depth > 1000) return;
  if (n->kind < S_DATA) const_foldable(n, 0);
  jinja_mark_constants(n->a, depth + 1);
  jinja_mark_constants(n->b, depth + 1);
  jinja_mark_constants(n->c, depth + 1);
  jinja_mark_constants(n->d, depth + 1);
  for (int i = 0; i < n->n; i++) jinja_mark_constants(n->list[i], depth + 1);
  for (int i = 0; i < n->n2; i++) jinja_mark_constants(n->list2[i], depth + 1);
}

/* Python slicing of lists, tuples and strings (by code point). */
static int slice_value(jrender *r, jv obj, jv start, jv stop, jv step, jv *out) {
  if (obj.t == JV_UNDEF) return jr_fail_undef(r, obj);
  int64_t st = 1;
  if (step.t != JV_NONE && step.t != JV_UNDEF) {
    if (step.t == JV_BOOL) step = jv_int(step.b);
    if (step.t != JV_INT) return jr_fail(r, HEARTH_EINVAL, "slice indices must be integers or None or have an __index__ method");
    st = step.i;
    if (st == 0) return jr_fail(r, HEARTH_EINVAL, "slice step cannot be zero");
  }
  jv items_list = obj;
  bool is_str = obj.t == JV_STR;
  /* Jinja2 compiles slices to a plain Python subscript (no getitem fallback): errors raise */
  if (obj.t == JV_DICT) return jr_fail(r, HEARTH_EINVAL, "unhashable type: 'slice'");
  if ((obj.t != JV_LIST && obj.t != JV_STR) || (obj.t == JV_LIST && obj.view))
    return jr_fail(r, HEARTH_EINVAL, "'%s' object is not subscriptable", jv_type_name(obj));
  if (is_str) TRY(jr_str_chars(r, obj, &items_list));
  int64_t n = (int64_t)items_list.l->n;
  int64_t lo, hi;
  if (start.t == JV_NONE || start.t == JV_UNDEF) lo = st > 0 ? 0 : n - 1;
  else {
    if (start.t == JV_BOOL) start = jv_int(start.b);
    if (start.t != JV_INT) return jr_fail(r, HEARTH_EINVAL, "slice indices must be integers or None or have an __index__ method");
    lo = start.i;
    if (lo < 0) lo += n;
    if (lo < 0) lo = st > 0 ? 0 : -1;
    if (lo >= n) lo = st > 0 ? n : n - 1;
  }
  if (stop.t == JV_NONE || stop.t == JV_UNDEF) hi = st > 0 ? n : -1;
  else {
    if (stop.t == JV_BOOL) stop = jv_int(stop.b);
    if (stop.t != JV_INT) return jr_fail(r, HEARTH_EINVAL, "slice indices must be integers or None or have an __index__ method");
    hi = stop.i;
    if (hi < 0) hi += n;
    if (hi < 0) hi = st > 0 ? 0 : -1;
    if (hi >= n) hi = st > 0 ? n : n - 1;
  }
  jv res = jv_list(r->a, 0);
  if (res.t != JV_LIST) return jr_oom(r);
  for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st)
    if (!jlist_push(r->a, res.l, items_list.l->items[i])) return jr_oom(r);
  if (is_str) {
    hbuf b = {0};
    for (size_t i = 0; i < res.l->n; i++) hbuf_append(&b, res.l->items[i].s->data, res.l->items[i].s->len);
    return jr_buf_str(r, &b, out);
  }
  res.tuple = obj.tuple;
  *out = res;
  return 0;
}

/* ---- operators ---- */

static int overflow(jrender *r) { return jr_fail(r, HEARTH_ELIMIT, "integer overflow (beyond 64 bits)"); }

static int64_t ival(jv v) { return v.t == JV_BOOL ? v.b : v.i; }

static int repeat(jrender *r, jv seq, int64_t times, jv *out) {
  if (times < 0) times = 0;
  if (seq.t == JV_STR) {
    if (times && seq.s->len > r->lim.max_output / (uint64_t)times)
      return jr_fail(r, HEARTH_ELIMIT, "string repetition of %zu bytes x %lld exceeds the output limit of %zu bytes",
                     seq.s->len, (long long)times, r->lim.max_output);
    size_t n = seq.s->len * (size_t)times;
    jstr *s = jarena_alloc(r->a, sizeof(jstr) + n + 1);
    if (!s) return jr_oom(r);
    for (int64_t i = 0; i < times; i++) memcpy(s->data + (size_t)i * seq.s->len, seq.s->data, seq.s->len);
    s->len = n;
    *out = (jv){.t = JV_STR, .s = s, .markup = seq.markup};
    return 0;
  }
  if (times && seq.l->n > (r->lim.max_output / sizeof(jv)) / (uint64_t)times)
    return jr_fail(r, HEARTH_ELIMIT, "list repetition too large");
  jv l = jv_list(r->a, seq.l->n * (size_t)times);
  if (l.t != JV_LIST) return jr_oom(r);
  for (int64_t i = 0; i < times; i++)
    for (size_t k = 0; k < seq.l->n; k++) l.l->items[l.l->n++] = seq.l->items[k];
  l.tuple = seq.tuple;
  *out = l;
  return 0;
}

static int unsupported(jrender *r, const char *op, jv a, jv b) {
  return jr_fail(r, HEARTH_EINVAL, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_type_name(a), jv_type_name(b));
}

static double py_fmod(double a, double b) {
  double m = fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  if (m == 0) m = copysign(0.0, b);
  return m;
}

int jr_binop(jrender *r, int op, jv a, jv b, jv *out) {
  static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
  if (op == OP_MOD && a.t == JV_STR && b.t == JV_UNDEF) return jr_percent_format(r, a, b, out); /* as a mapping */
  if (a.t == JV_UNDEF) return jr_fail_undef(r, a);
  if (b.t == JV_UNDEF) return jr_fail_undef(r, b);
  if ((a.t == JV_LIST && a.view) || (b.t == JV_LIST && b.view)) return unsupported(r, names[op], a, b);
  bool num = jv_is_number(a) && jv_is_number(b);
  bool ints = num && a.t != JV_FLOAT && b.t != JV_FLOAT;
  if (num && (op == OP_ADD || op == OP_SUB || op == OP_MUL)) { /* integers checked for overflow, else doubles */
    if (!ints) {
      double x = jv_as_double(a), y = jv_as_double(b);
      *out = jv_float(op == OP_ADD ? x + y : op == OP_SUB ? x - y : x * y);
      return 0;
    }
    int64_t v;
    bool over = op == OP_ADD   ? __builtin_add_overflow(ival(a), ival(b), &v)
                : op == OP_SUB ? __builtin_sub_overflow(ival(a), ival(b), &v)
                               : __builtin_mul_overflow(ival(a), ival(b), &v);
    if (over) return overflow(r);
    *out = jv_int(v);
    return 0;
  }
  switch (op) {
    case OP_ADD:
      if (a.t == JV_STR && b.t == JV_STR) {
        if (a.markup != b.markup) { /* Markup + str escapes the str */
          jv esc;
          TRY(jr_escape(r, a.markup ? b : a, &esc));
          if (a.markup) b = esc;
          else a = esc;
        }
        size_t n = a.s->len + b.s->len;
        if (n > r->lim.max_output) return jr_fail(r, HEARTH_ELIMIT, "a string of %zu bytes exceeds the output limit", n);
        jstr *s = jarena_alloc(r->a, sizeof(jstr) + n + 1);
        if (!s) return jr_oom(r);
        memcpy(s->data, a.s->data, a.s->len);
        memcpy(s->data + a.s->len, b.s->data, b.s->len);
        s->len = n;
        *out = (jv){.t = JV_STR, .s = s, .markup = a.markup};
      } else if (a.t == JV_LIST && b.t == JV_LIST && a.tuple == b.tuple) {
        jv l = jv_list(r->a, a.l->n + b.l->n);
        if (l.t != JV_LIST) return jr_oom(r);
        for (size_t i = 0; i < a.l->n; i++) l.l->items[l.l->n++] = a.l->items[i];
        for (size_t i = 0; i < b.l->n; i++) l.l->items[l.l->n++] = b.l->items[i];
        l.tuple = a.tuple;
        *out = l;
      } else if (a.t == JV_STR || b.t == JV_STR) {
        if (a.t == JV_STR)
          return jr_fail(r, HEARTH_EINVAL, "can only concatenate str (not \"%s\") to str", jv_type_name(b));
        return unsupported(r, "+", a, b);
      } else if (a.t == JV_LIST && b.t == JV_LIST) {
        return jr_fail(r, HEARTH_EINVAL, "can only concatenate %s (not \"%s\") to %s", jv_type_name(a), jv_type_name(b), jv_type_name(a));
      } else return unsupported(r, "+", a, b);
      return 0;
    case OP_SUB: return unsupported(r, "-", a, b);
    case OP_MUL:
      if ((a.t == JV_STR || a.t == JV_LIST) && (b.t == JV_INT || b.t == JV_BOOL)) return repeat(r, a, ival(b), out);
      else if ((b.t == JV_STR || b.t == JV_LIST) && (a.t == JV_INT || a.t == JV_BOOL)) return repeat(r, b, ival(a), out);
      else if (a.t == JV_STR || b.t == JV_STR)
        return jr_fail(r, HEARTH_EINVAL, "can't multiply sequence by non-int of type '%s'", jv_type_name(a.t == JV_STR ? b : a));
      else return unsupported(r, "*", a, b);
      return 0;
    case OP_DIV:
      if (!num) return unsupported(r, "/", a, b);
      if (jv_as_double(b) == 0) return jr_fail(r, HEARTH_EINVAL, "division by zero");
      *out = jv_float(jv_as_double(a) / jv_as_double(b));
      return 0;
    case OP_FLOORDIV: case OP_MOD: {
      if (!num) {
        if (op == OP_MOD && a.t == JV_STR) return jr_percent_format(r, a, b, out);
        return unsupported(r, names[op], a, b);
      }
      if (jv_as_double(b) == 0)
        return jr_fail(r, HEARTH_EINVAL, op == OP_MOD ? "integer modulo by zero" : "integer division or modulo by zero");
      if (ints) {
        int64_t x = ival(a), y = ival(b);
        if (x == INT64_MIN && y == -1) return overflow(r);
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          q -= 1;
          m += y;
        }
        *out = jv_int(op == OP_MOD ? m : q);
      } else {
        double x = jv_as_double(a), y = jv_as_double(b);
        *out = jv_float(op == OP_MOD ? py_fmod(x, y) : floor(x / y));
      }
      return 0;
    }
    case OP_POW:
      if (!num) return unsupported(r, "** or pow()", a, b);
      if (ints && ival(b) >= 0) {
        int64_t base = ival(a), e = ival(b), v = 1;
        while (e > 0) {
          if (e & 1) {
            if (__builtin_mul_overflow(v, base, &v)) return overflow(r);
          }
          e >>= 1;
          if (e && __builtin_mul_overflow(base, base, &base)) return overflow(r);
        }
        *out = jv_int(v);
      } else {
        *out = jv_float(pow(jv_as_double(a), jv_as_double(b)));
      }
      return 0;
  }
  return jr_fail(r, HEARTH_EINTERNAL, "unknown operator");
}

/* `a in b` */
int jr_contains(jrender *r, jv container, jv item, bool *out) {
  switch (container.t) {
    case JV_STR:
      if (item.t == JV_UNDEF) return jr_fail_undef(r, item);
      if (item.t != JV_STR)
        return jr_fail(r, HEARTH_EINVAL, "'in <string>' requires string as left operand, not %s", jv_type_name(item));
      *out = item.s->len == 0 || memmem(container.s->data, container.s->len, item.s->data, item.s->len) != NULL;
      return 0;
    case JV_LIST:
      if (container.l->error) return jr_fail(r, HEARTH_EINVAL, "%s", container.l->error);
      *out = false;
      if (container.view == VIEW_GENERATOR || container.view == VIEW_REVITER) { /* consumes up to the match */
        while (container.l->consumed < container.l->n && !*out)
          *out = jv_equal(container.l->items[container.l->consumed++], item);
        return 0;
      }
      for (size_t i = 0; i < container.l->n && !*out; i++) *out = jv_equal(container.l->items[i], item);
      return 0;
    case JV_DICT:
      if ((item.t == JV_LIST && !item.tuple) || item.t == JV_DICT)
        return jr_fail(r, HEARTH_EINVAL, "unhashable type: '%s'", jv_type_name(item));
      *out = jdict_get(container.d, item) != NULL;
      return 0;
    case JV_UNDEF: *out = false; return 0;
    default: return jr_fail(r, HEARTH_EINVAL, "argument of type '%s' is not iterable", jv_type_name(container));
  }
}

int jr_compare_op(jrender *r, int op, jv a, jv b, bool *out) {
  switch (op) {
    case OP_EQ: *out = jv_equal(a, b); return 0;
    case OP_NE: *out = !jv_equal(a, b); return 0;
    case OP_IN: return jr_contains(r, b, a, out);
    case OP_NOTIN: TRY(jr_contains(r, b, a, out)); *out = !*out; return 0;
    default: break;
  }
  if (a.t == JV_UNDEF) return jr_fail_undef(r, a);
  if (b.t == JV_UNDEF) return jr_fail_undef(r, b);
  int c;
  static const char *const sym[] = {[OP_LT] = "<", [OP_LE] = "<=", [OP_GT] = ">", [OP_GE] = ">="};
  if (jv_compare(a, b, &c) != 0)
    return jr_fail(r, HEARTH_EINVAL, "'%s' not supported between instances of '%s' and '%s'", sym[op], jv_type_name(a),
                   jv_type_name(b));
  *out = op == OP_LT ? c < 0 : op == OP_LE ? c <= 0 : op == OP_GT ? c > 0 : c >= 0;
  return 0;
}

/* ---- calls ---- */

static int eval(jrender *r, jnode *n, jscope *sc, jv *out);
static int exec_body(jrender *r, jnode *body, jscope *sc, hbuf *out);

/* Evaluated arguments of a call node. */
static int eval_args(jrender *r, jnode *n, jscope *sc, jargs *args) {
  memset(args, 0, sizeof *args);
  size_t extra = 0;
  jv star = {0}, dstar = {0};
  if (n->c) {
    TRY(eval(r, n->c, sc, &star));
    if (star.t != JV_LIST) return jr_fail(r, HEARTH_EINVAL, "argument after * must be an iterable");
    extra = star.l->n;
  }
  if (n->d) {
    TRY(eval(r, n->d, sc, &dstar));
    if (dstar.t != JV_DICT) return jr_fail(r, HEARTH_EINVAL, "argument after ** must be a mapping");
  }
  args->n = n->n + (int)extra;
  args->pos = jarena_alloc(r->a, (size_t)(args->n + 1) * sizeof(jv));
  int nkw = n->n2 + (n->d ? (int)dstar.d->n : 0);
  args->kwnames = jarena_alloc(r->a, (size_t)(nkw + 1) * sizeof(char *));
  args->kwvals = jarena_alloc(r->a, (size_t)(nkw + 1) * sizeof(jv));
  if (!args->pos || !args->kwnames || !args->kwvals) return jr_oom(r);
  for (int i = 0; i < n->n; i++) TRY(eval(r, n->list[i], sc, &args->pos[i]));
  for (size_t i = 0; i < extra; i++) args->pos[n->n + (int)i] = star.l->items[i];
  for (int i = 0; i < n->n2; i++) {
    args->kwnames[args->nkw] = n->names[i];
    TRY(eval(r, n->list2[i], sc, &args->kwvals[args->nkw]));
    args->nkw++;
  }
  if (n->d)
    for (size_t i = 0; i < dstar.d->n; i++) {
      if (dstar.d->keys[i].t != JV_STR) return jr_fail(r, HEARTH_EINVAL, "keywords must be strings");
      args->kwnames[args->nkw] = dstar.d->keys[i].s->data;
      args->kwvals[args->nkw++] = dstar.d->vals[i];
    }
  return 0;
}

static bool node_uses_name(const jnode *n, const char *name, int depth) {
  if (!n || depth > 400) return false;
  if (n->kind == E_NAME && strcmp(n->str, name) == 0) return true;
  if (node_uses_name(n->a, name, depth + 1) || node_uses_name(n->b, name, depth + 1) ||
      node_uses_name(n->c, name, depth + 1) || node_uses_name(n->d, name, depth + 1))
    return true;
  for (int i = 0; i < n->n; i++)
    if (node_uses_name(n->list[i], name, depth + 1)) return true;
  for (int i = 0; i < n->n2; i++)
    if (node_uses_name(n->list2[i], name, depth + 1)) return true;
  return false;
}

/* Calls a macro or a call block's caller. */
static int call_macro(jrender *r, jfunc *f, jargs *args, jv *out) {
  jnode *m = f->macro;
  if (++r->depth > r->lim.max_depth)
    return jr_fail(r, HEARTH_ELIMIT, "maximum recursion depth (%d) exceeded in macro '%s'", r->lim.max_depth, f->name);
  jscope *sc = jr_scope(r, f->closure);
  if (!sc) return jr_oom(r);
  int np = m->nnames;
  if (args->n > np && !f->uses_varargs) {
    r->depth--;
    return jr_fail(r, HEARTH_EINVAL, "macro '%s' takes not more than %d argument(s)", f->name, np);
  }
  jv *vals = jarena_alloc(r->a, (size_t)(np + 1) * sizeof(jv));
  bool *have = jarena_alloc(r->a, (size_t)(np + 1));
  if (!vals || !have) return jr_oom(r);
  for (int i = 0; i < np && i < args->n; i++) {
    vals[i] = args->pos[i];
    have[i] = true;
  }
  jv kwargs = jv_dict(r->a, 0);
  if (kwargs.t != JV_DICT) return jr_oom(r);
  for (int k = 0; k < args->nkw; k++) {
    int idx = -1;
    for (int i = 0; i < np; i++)
      if (!strcmp(m->names[i], args->kwnames[k])) idx = i;
    if (idx >= 0) {
      if (have[idx]) {
        r->depth--;
        return jr_fail(r, HEARTH_EINVAL, "macro '%s' got multiple values for argument '%s'", f->name, args->kwnames[k]);
      }
      vals[idx] = args->kwvals[k];
      have[idx] = true;
    } else if (!strcmp(args->kwnames[k], "caller") && f->caller.t == JV_FUNC) {
      continue;
    } else if (f->uses_kwargs) {
      jv key = jv_cstr(r->a, args->kwnames[k]);
      if (key.t != JV_STR || !jdict_set(r->a, kwargs.d, key, args->kwvals[k])) return jr_oom(r);
    } else {
      r->depth--;
      return jr_fail(r, HEARTH_EINVAL, "macro '%s' takes no keyword argument '%s'", f->name, args->kwnames[k]);
    }
  }
  for (int i = 0; i < np; i++) {
    if (have[i]) {
      TRY(jr_bind(r, sc, m->names[i], vals[i]));
    } else if (m->list2 && m->list2[i]) {
      jv d;
      TRY(eval(r, m->list2[i], sc, &d));
      TRY(jr_bind(r, sc, m->names[i], d));
    } else {
      char *h = jarena_alloc(r->a, strlen(m->names[i]) + 40);
      if (!h) return jr_oom(r);
      sprintf(h, "parameter '%s' was not provided", m->names[i]);
      TRY(jr_bind(r, sc, m->names[i], jv_undef(h)));
    }
  }
  if (f->uses_varargs) {
    jv va = jv_list(r->a, 0);
    if (va.t != JV_LIST) return jr_oom(r);
    va.tuple = true;
    for (int i = np; i < args->n; i++)
      if (!jlist_push(r->a, va.l, args->pos[i])) return jr_oom(r);
    TRY(jr_bind(r, sc, "varargs", va));
  }
  if (f->uses_kwargs) TRY(jr_bind(r, sc, "kwargs", kwargs));
  if (f->caller.t == JV_FUNC) TRY(jr_bind(r, sc, "caller", f->caller));
  hbuf b = {0};
  int rc = exec_body(r, m->c, sc, &b);
  if (rc > 0) {
    hbuf_free(&b);
    return rc;
  }
  r->depth--;
  return jr_buf_str(r, &b, out);
}

int jr_call(jrender *r, jv callee, jargs *args, jv *out) {
  TRY(jr_step(r));
  if (callee.t == JV_UNDEF) return jr_fail_undef(r, callee);
  if (callee.t != JV_FUNC) return jr_fail(r, HEARTH_EINVAL, "'%s' object is not callable", jv_type_name(callee));
  jfunc *f = callee.fn;
  if (f->macro) return call_macro(r, f, args, out);
  return jr_call_builtin(r, f, args, out);
}

/* ---- expressions ---- */

static int eval_filter_chain(jrender *r, jnode *n, jscope *sc, jv *out) {
  jv input;
  if (n->a->kind == E_FILTER_INPUT) input = r->filter_input;
  else TRY(eval(r, n->a, sc, &input));
  jargs args;
  TRY(eval_args(r, n, sc, &args));
  return jr_filter(r, n->str, input, &args, sc, out);
}

static int eval_node(jrender *r, jnode *n, jscope *sc, jv *out);

#define JR_NOT_CONSTANT 1000 /* internal: folding met a non-constant; never leaves eval_top */

/* Python's has_safe_repr: what the optimizer may turn into a literal. */
static bool safe_repr(jv v) {
  switch (v.t) {
    case JV_NONE: case JV_BOOL: case JV_INT: case JV_FLOAT: case JV_STR: return true;
    case JV_LIST:
      if (v.view) return false;
      for (size_t i = 0; i < v.l->n; i++)
        if (!safe_repr(v.l->items[i])) return false;
      return true;
    case JV_DICT:
      for (size_t i = 0; i < v.d->n; i++)
        if (!safe_repr(v.d->keys[i]) || !safe_repr(v.d->vals[i])) return false;
      return true;
    default: return false;
  }
}

/* Evaluates n. A constant subtree is what Jinja2's optimizer folds at compile
 * time: kept when its value is a literal (or printed directly by {{ }}),
 * otherwise evaluated again the way the generated code would at run time. */
static int eval_top(jrender *r, jnode *n, jscope *sc, jv *out, bool printed) {
  if (r->folding || n->kind == E_CONST || !const_foldable(n, 0)) return eval_node(r, n, sc, out);
  r->folding = true;
  int saved_failed = r->failed;
  herr saved = r->err ? *r->err : (herr){0};
  int rc = eval_node(r, n, sc, out);
  r->folding = false;
  if (rc == 0 && (printed || safe_repr(*out))) return 0;
  if (rc && rc != JR_NOT_CONSTANT && (rc == HEARTH_ELIMIT || rc == HEARTH_ENOMEM)) return rc;
  r->failed = saved_failed;
  if (r->err) *r->err = saved;
  return eval_node(r, n, sc, out);
}

static int eval(jrender *r, jnode *n, jscope *sc, jv *out) { return eval_top(r, n, sc, out, false); }

static int eval_node(jrender *r, jnode *n, jscope *sc, jv *out) {
  TRY(jr_step(r));
  if (++r->depth > r->lim.max_depth + 200) return jr_fail(r, HEARTH_ELIMIT, "expression nested too deeply");
  int saved_line = r->line;
  r->line = n->line;
  int rc = 0;
  if (r->folding && (n->kind == E_NAME || n->kind == E_CALL || n->kind == E_FILTER_INPUT)) {
    r->depth--;
    r->line = saved_line;
    return JR_NOT_CONSTANT; /* a short-circuit branch that is not constant was taken */
  }
  switch (n->kind) {
    case E_CONST: *out = n->lit; break;
    case E_NAME: {
      jv *v = jr_lookup(sc, n->str);
      if (v) *out = *v;
      else {
        char *h = jarena_alloc(r->a, n->slen + 20);
        if (!h) {
          rc = jr_oom(r);
          break;
        }
        sprintf(h, "'%s' is undefined", n->str);
        *out = jv_undef(h);
      }
      break;
    }
    case E_LIST: case E_TUPLE: {
      jv l = jv_list(r->a, (size_t)n->n);
      if (l.t != JV_LIST) {
        rc = jr_oom(r);
        break;
      }
      for (int i = 0; i < n->n && !rc; i++) rc = eval(r, n->list[i], sc, &l.l->items[l.l->n++]);
      l.tuple = n->kind == E_TUPLE;
      *out = l;
      break;
    }
    case E_DICT: {
      jv d = jv_dict(r->a, (size_t)n->n);
      if (d.t != JV_DICT) {
        rc = jr_oom(r);
        break;
      }
      for (int i = 0; i < n->n && !rc; i++) {
        jv k, v;
        if ((rc = eval(r, n->list[i], sc, &k))) break;
        if ((rc = eval(r, n->list2[i], sc, &v))) break;
        if (k.t == JV_LIST && !k.tuple) rc = jr_fail(r, HEARTH_EINVAL, "unhashable type: 'list'");
        else if (k.t == JV_DICT) rc = jr_fail(r, HEARTH_EINVAL, "unhashable type: 'dict'");
        else if (!jdict_set(r->a, d.d, k, v)) rc = jr_oom(r);
      }
      *out = d;
      break;
    }
    case E_GETATTR: {
      jv obj;
      if ((rc = eval(r, n->a, sc, &obj))) break;
      r->line = n->line;
      rc = jr_getattr(r, obj, n->str, out);
      break;
    }
    case E_GETITEM: {
      jv obj, key;
      if ((rc = eval(r, n->a, sc, &obj)) || (rc = eval(r, n->b, sc, &key))) break;
      r->line = n->line;
      rc = jr_getitem(r, obj, key, out);
      break;
    }
    case E_SLICE: {
      jv obj, a = jv_none(), b = jv_none(), c = jv_none();
      if (!n->a) { /* a slice inside a tuple subscript (x[1:2, 3]): no object to slice; as a key it finds nothing */
        *out = jv_undef("slice objects are not supported as keys");
        break;
      }
      if ((rc = eval(r, n->a, sc, &obj))) break;
      if (n->b && (rc = eval(r, n->b, sc, &a))) break;
      if (n->c && (rc = eval(r, n->c, sc, &b))) break;
      if (n->d && (rc = eval(r, n->d, sc, &c))) break;
      if (r->folding && obj.t != JV_UNDEF && obj.t != JV_STR && !(obj.t == JV_LIST && !obj.view)) {
        *out = jv_undef("object is not subscriptable"); /* as_const went through the sandbox's getitem */
        break;
      }
      rc = slice_value(r, obj, a, b, c, out);
      break;
    }
    case E_CALL: {
      jv callee;
      jargs args;
      if ((rc = eval(r, n->a, sc, &callee))) break;
      if (callee.t == JV_UNDEF) {
        rc = jr_fail_undef(r, callee);
        break;
      }
      if ((rc = eval_args(r, n, sc, &args))) break;
      r->line = n->line;
      rc = jr_call(r, callee, &args, out);
      break;
    }
    case E_FILTER: rc = eval_filter_chain(r, n, sc, out); break;
    case E_TEST: {
      jv x;
      jargs args;
      if ((rc = eval(r, n->a, sc, &x))) break;
      if ((rc = eval_args(r, n, sc, &args))) break;
      bool res;
      r->line = n->line;
      if ((rc = jr_test(r, n->str, x, &args, sc, &res))) break;
      *out = jv_bool(res);
      break;
    }
    case E_BIN: {
      jv a, b;
      if ((rc = eval(r, n->a, sc, &a)) || (rc = eval(r, n->b, sc, &b))) break;
      r->line = n->line;
      rc = jr_binop(r, n->op, a, b, out);
      break;
    }
    case E_CONCAT: {
      jv a, b, sa, sb;
      if ((rc = eval(r, n->a, sc, &a)) || (rc = eval(r, n->b, sc, &b))) break;
      if ((rc = jr_to_str(r, a, &sa)) || (rc = jr_to_str(r, b, &sb))) break;
      sa.markup = sb.markup = false;
      rc = jr_binop(r, OP_ADD, sa, sb, out);
      break;
    }
    case E_NEG: case E_POS: {
      jv a;
      if ((rc = eval(r, n->a, sc, &a))) break;
      if (a.t == JV_UNDEF) rc = jr_fail_undef(r, a);
      else if (a.t == JV_FLOAT) *out = jv_float(n->kind == E_NEG ? -a.f : a.f);
      else if (a.t == JV_INT || a.t == JV_BOOL) {
        if (n->kind == E_NEG && ival(a) == INT64_MIN) rc = overflow(r);
        else *out = jv_int(n->kind == E_NEG ? -ival(a) : ival(a));
      } else
        rc = jr_fail(r, HEARTH_EINVAL, "bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+', jv_type_name(a));
      break;
    }
    case E_NOT: {
      jv a;
      if ((rc = eval(r, n->a, sc, &a))) break;
      *out = jv_bool(!jv_truthy(a));
      break;
    }
    case E_AND: case E_OR: {
      jv a;
      if ((rc = eval(r, n->a, sc, &a))) break;
      bool t = jv_truthy(a);
      if ((n->kind == E_AND) != t) *out = a;
      else rc = eval(r, n->b, sc, out);
      break;
    }
    case E_COND: {
      jv c;
      if ((rc = eval(r, n->a, sc, &c))) break;
      if (jv_truthy(c)) rc = eval(r, n->b, sc, out);
      else if (n->c) rc = eval(r, n->c, sc, out);
      else *out = jv_undef("the inline if-expression on line evaluated to false and no else section was defined.");
      break;
    }
    case E_COMPARE: {
      jv left;
      if ((rc = eval(r, n->list[0], sc, &left))) break;
      bool res = true;
      for (int i = 1; i < n->n && res; i++) {
        jv right;
        if ((rc = eval(r, n->list[i], sc, &right))) break;
        r->line = n->line;
        if ((rc = jr_compare_op(r, n->ops[i - 1], left, right, &res))) break;
        left = right;
      }
      *out = jv_bool(res);
      break;
    }
    case E_FILTER_INPUT: *out = r->filter_input; break;
    default: rc = jr_fail(r, HEARTH_EINTERNAL, "unexpected node %d in expression", n->kind);
  }
  r->depth--;
  r->line = saved_line;
  return rc;
}

/* ---- statements ---- */

#define CTRL_BREAK (-1)
#define CTRL_CONTINUE (-2)

static int emit(jrender *r, hbuf *out, const char *s, size_t n) {
  hbuf_append(out, s, n);
  if (out->oom) return jr_oom(r);
  if (out->len > r->lim.max_output)
    return jr_fail(r, HEARTH_ELIMIT, "output exceeds the limit of %zu bytes", r->lim.max_output);
  return 0;
}

static int unpack(jrender *r, jnode *targets, jv item, jscope *sc) {
  if (!targets->flag) return jr_bind(r, sc, targets->names[0], item);
  jv *items;
  size_t n;
  TRY(jr_iterate(r, item, &items, &n));
  if (n < (size_t)targets->nnames)
    return jr_fail(r, HEARTH_EINVAL, "not enough values to unpack (expected %d, got %zu)", targets->nnames, n);
  if (n > (size_t)targets->nnames)
    return jr_fail(r, HEARTH_EINVAL, "too many values to unpack (expected %d)", targets->nnames);
  for (int i = 0; i < targets->nnames; i++) TRY(jr_bind(r, sc, targets->names[i], items[i]));
  return 0;
}

static int exec_for(jrender *r, jnode *n, jscope *sc, hbuf *out) {
  jv seq;
  TRY(eval(r, n->a, sc, &seq));
  r->line = n->line;
  jv *items;
  size_t count;
  TRY(jr_iterate(r, seq, &items, &count));
  /* a snapshot, so the loop sees the sequence as it was */
  jv *snap = jarena_alloc(r->a, (count + 1) * sizeof(jv));
  if (!snap) return jr_oom(r);
  size_t kept = 0;
  for (size_t i = 0; i < count; i++) {
    if (n->b) {
      jscope *fs = jr_scope(r, sc);
      if (!fs) return jr_oom(r);
      TRY(unpack(r, n, items[i], fs));
      jv c;
      TRY(eval(r, n->b, fs, &c));
      if (!jv_truthy(c)) continue;
    }
    snap[kept++] = items[i];
  }
  jloop *L = jarena_alloc(r->a, sizeof *L);
  if (!L) return jr_oom(r);
  L->items = snap;
  L->n = kept;
  L->depth = 1; /* depth grows only in recursive loops, which are not supported */
  for (size_t i = 0; i < kept; i++) {
    if (++r->iterations > r->lim.max_iterations)
      return jr_fail(r, HEARTH_ELIMIT, "loops ran more than %lld iterations", (long long)r->lim.max_iterations);
    L->i = i;
    jscope *is = jr_scope(r, sc);
    if (!is) return jr_oom(r);
    TRY(unpack(r, n, snap[i], is));
    TRY(jr_bind(r, is, "loop", (jv){.t = JV_LOOP, .loop = L}));
    int rc = exec_body(r, n->c, is, out);
    if (rc == CTRL_BREAK) break;
    if (rc == CTRL_CONTINUE) continue;
    if (rc) return rc;
  }
  if (kept == 0 && n->d) {
    jscope *es = jr_scope(r, sc);
    if (!es) return jr_oom(r);
    return exec_body(r, n->d, es, out);
  }
  return 0;
}

static int assign(jrender *r, jnode *target, jv v, jscope *sc) {
  if (target->kind == E_NAME) return jr_bind(r, sc, target->str, v);
  if (target->kind == E_NSREF) {
    jv *ns = jr_lookup(sc, target->str);
    if (!ns || ns->t != JV_NS) return jr_fail(r, HEARTH_EINVAL, "Cannot assign attribute on non-namespace object");
    jv key = jv_cstr(r->a, target->names[0]);
    if (key.t != JV_STR || !jdict_set(r->a, ns->d, key, v)) return jr_oom(r);
    return 0;
  }
  /* tuple of names */
  jv *items;
  size_t n;
  TRY(jr_iterate(r, v, &items, &n));
  if (n != (size_t)target->n)
    return jr_fail(r, HEARTH_EINVAL, n < (size_t)target->n ? "not enough values to unpack (expected %d, got %zu)"
                                                          : "too many values to unpack (expected %d, got %zu)",
                   target->n, n);
  for (int i = 0; i < target->n; i++) TRY(jr_bind(r, sc, target->list[i]->str, items[i]));
  return 0;
}

static jfunc *make_macro(jrender *r, jnode *m, const char *name, jscope *closure) {
  jfunc *f = jarena_alloc(r->a, sizeof *f);
  if (!f) return NULL;
  f->name = name;
  f->macro = m;
  f->closure = closure;
  f->uses_varargs = node_uses_name(m->c, "varargs", 0);
  f->uses_kwargs = node_uses_name(m->c, "kwargs", 0);
  return f;
}

static int exec_stmt(jrender *r, jnode *n, jscope *sc, hbuf *out) {
  TRY(jr_step(r));
  r->line = n->line;
  switch (n->kind) {
    case S_DATA: return emit(r, out, n->str, n->slen);
    case S_OUTPUT: {
      jv v;
      TRY(eval_top(r, n->a, sc, &v, true));
      if (v.t == JV_STR) return emit(r, out, v.s->data, v.s->len);
      jv_to_str(out, v);
      return emit(r, out, "", 0); /* checks memory and the output limit */
    }
    case S_IF: {
      for (jnode *b = n; b;) {
        if (b->kind != S_IF) return exec_body(r, b, sc, out);
        jv c;
        r->line = b->line;
        TRY(eval(r, b->a, sc, &c));
        if (jv_truthy(c)) return exec_body(r, b->b, sc, out);
        b = b->c;
      }
      return 0;
    }
    case S_FOR: return exec_for(r, n, sc, out);
    case S_SET: {
      jv v;
      TRY(eval(r, n->b, sc, &v));
      r->line = n->line;
      return assign(r, n->a, v, sc);
    }
    case S_SETBLOCK: { /* the body is a scope of its own */
      hbuf b = {0};
      jscope *bs = jr_scope(r, sc);
      if (!bs) return jr_oom(r);
      int rc = exec_body(r, n->c, bs, &b);
      if (rc) {
        hbuf_free(&b);
        return rc;
      }
      jv v;
      TRY(jr_buf_str(r, &b, &v));
      if (n->d) {
        jv saved = r->filter_input;
        r->filter_input = v;
        rc = eval(r, n->d, sc, &v);
        r->filter_input = saved;
        if (rc) return rc;
      }
      return assign(r, n->a, v, sc);
    }
    case S_MACRO: {
      jfunc *f = make_macro(r, n, n->str, sc);
      if (!f) return jr_oom(r);
      return jr_bind(r, sc, n->str, (jv){.t = JV_FUNC, .fn = f});
    }
    case S_CALLBLOCK: {
      jfunc *caller = make_macro(r, n, "caller", sc);
      if (!caller) return jr_oom(r);
      jnode *call = n->a;
      jv callee;
      TRY(eval(r, call->a, sc, &callee));
      if (callee.t == JV_UNDEF) return jr_fail_undef(r, callee);
      if (callee.t != JV_FUNC || !callee.fn->macro) return jr_fail(r, HEARTH_EINVAL, "'%s' object is not callable with a call block", jv_type_name(callee));
      jargs args;
      TRY(eval_args(r, call, sc, &args));
      jfunc with_caller = *callee.fn;
      with_caller.caller = (jv){.t = JV_FUNC, .fn = caller};
      jv v;
      r->line = n->line;
      TRY(call_macro(r, &with_caller, &args, &v));
      return emit(r, out, v.s->data, v.s->len);
    }
    case S_FILTERBLOCK: { /* the body is a scope of its own */
      hbuf b = {0};
      jscope *bs = jr_scope(r, sc);
      if (!bs) return jr_oom(r);
      int rc = exec_body(r, n->c, bs, &b);
      if (rc) {
        hbuf_free(&b);
        return rc;
      }
      jv v;
      TRY(jr_buf_str(r, &b, &v));
      jv saved = r->filter_input;
      r->filter_input = v;
      rc = eval(r, n->a, sc, &v);
      r->filter_input = saved;
      if (rc) return rc;
      jv s;
      TRY(jr_to_str(r, v, &s));
      return emit(r, out, s.s->data, s.s->len);
    }
    case S_WITH: {
      jscope *ws = jr_scope(r, sc);
      if (!ws) return jr_oom(r);
      for (int i = 0; i < n->nnames; i++) {
        jv v;
        TRY(eval(r, n->list2[i], sc, &v));
        TRY(jr_bind(r, ws, n->names[i], v));
      }
      return exec_body(r, n->c, ws, out);
    }
    case S_BREAK: return CTRL_BREAK;
    case S_CONTINUE: return CTRL_CONTINUE;
    case S_SCOPE: return exec_body(r, n, sc, out);
    default: return jr_fail(r, HEARTH_EINTERNAL, "unexpected node %d in statements", n->kind);
  }
}

static int exec_body(jrender *r, jnode *body, jscope *sc, hbuf *out) {
  if (!body) return 0;
  if (body->kind == S_SCOPE) {
    if (body->c) TRY(exec_body(r, body->c, sc, out));
    for (int i = 0; i < body->n; i++) {
      int rc = exec_stmt(r, body->list[i], sc, out);
      if (rc) return rc;
    }
    return 0;
  }
  return exec_stmt(r, body, sc, out);
}

int jinja_render(const jinja_template *t, const json_t *context, const jinja_limits *lim, hbuf *out, herr *err) {
  jarena arena = {0};
  jrender r = {.a = &arena, .t = t, .err = err, .line = 1};
  if (lim) r.lim = *lim;
  if (r.lim.max_depth <= 0) r.lim.max_depth = JINJA_DEFAULT_MAX_DEPTH;
  if (r.lim.max_iterations <= 0) r.lim.max_iterations = JINJA_DEFAULT_MAX_ITERATIONS;
  if (r.lim.max_steps <= 0) r.lim.max_steps = JINJA_DEFAULT_MAX_STEPS;
  if (r.lim.max_output == 0) r.lim.max_output = JINJA_DEFAULT_MAX_OUTPUT;
  if (r.lim.max_memory == 0) r.lim.max_memory = JINJA_DEFAULT_MAX_MEMORY;
  arena.limit = r.lim.max_memory;
  int rc = 0;
  jscope *globals = jr_scope(&r, NULL);
  if (!globals) rc = jr_oom(&r);
  if (!rc) rc = jr_install_globals(&r, globals);
  jscope *top = rc ? NULL : jr_scope(&r, globals);
  if (!rc && !top) rc = jr_oom(&r);
  if (!rc && context) {
    if (!json_is_object(context)) rc = jr_fail(&r, HEARTH_EINVAL, "the render context must be a JSON object");
    const char *k;
    json_t *v;
    if (!rc) json_object_foreach((json_t *)context, k, v) {
        jv x = jv_from_json(&arena, v, 0);
        if (arena.over) {
          rc = jr_oom(&r);
          break;
        }
        if ((rc = jr_bind(&r, top, k, x))) break;
      }
  }
  if (!rc) {
    rc = exec_body(&r, t->body, top, out);
    if (rc < 0) rc = 0; /* break/continue outside loops cannot parse */
  }
  jarena_free(&arena);
  return rc;
}
