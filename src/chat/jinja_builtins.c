/* jinja_builtins.c — the names a template can call: Jinja2's filters and
 * tests, the str/dict/list methods Python exposes (mutating ones refused as
 * ImmutableSandboxedEnvironment refuses them), and the globals range,
 * namespace, dict, joiner, raise_exception and strftime_now (Hugging Face's
 * additions). Knows nothing of statements or scopes beyond calling back into
 * the evaluator. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "base/utf8.h"
#include "chat/jinja_eval.h"

#define MISSING 0xFF
static const jv missing = {.t = MISSING};
static bool has(jv v) { return v.t != MISSING; }
static bool given(jv v) { return v.t != MISSING && v.t != JV_NONE; }

enum {
  B_RANGE = 1, B_NAMESPACE, B_DICT, B_RAISE, B_STRFTIME, B_JOINER, B_JOINER_CALL, B_METHOD
};

/* Binds positional and keyword args to params (NULL-terminated); absent ones are MISSING. */
static int bind(jrender *r, const char *fname, jargs *a, const char *const *params, jv *vals) {
  int np = 0;
  while (params[np]) np++;
  for (int i = 0; i < np; i++) vals[i] = missing;
  if (a->n > np) return jr_fail(r, HEARTH_EINVAL, "%s() takes at most %d argument(s) (%d given)", fname, np, a->n);
  for (int i = 0; i < a->n; i++) vals[i] = a->pos[i];
  for (int k = 0; k < a->nkw; k++) {
    int idx = -1;
    for (int i = 0; i < np; i++)
      if (!strcmp(params[i], a->kwnames[k])) idx = i;
    if (idx < 0) return jr_fail(r, HEARTH_EINVAL, "%s() got an unexpected keyword argument '%s'", fname, a->kwnames[k]);
    if (has(vals[idx])) return jr_fail(r, HEARTH_EINVAL, "%s() got multiple values for argument '%s'", fname, a->kwnames[k]);
    vals[idx] = a->kwvals[k];
  }
  return 0;
}

static int need_str(jrender *r, jv v, const char *what) {
  if (v.t == JV_STR) return 0;
  if (v.t == JV_UNDEF) return jr_fail_undef(r, v);
  return jr_fail(r, HEARTH_EINVAL, "%s must be str, not %s", what, jv_type_name(v));
}

static int need_int(jrender *r, jv v, const char *what, int64_t *out) {
  if (v.t == JV_INT || v.t == JV_BOOL) {
    *out = v.t == JV_BOOL ? v.b : v.i;
    return 0;
  }
  if (v.t == JV_UNDEF) return jr_fail_undef(r, v);
  return jr_fail(r, HEARTH_EINVAL, "'%s' object cannot be interpreted as an integer (%s)", jv_type_name(v), what);
}

/* ---- unicode helpers ---- */

static size_t cp_at(const char *s, size_t n, uint32_t *cp) {
  int k = utf8_decode(s, n, cp);
  if (k == 0) {
    *cp = (unsigned char)s[0];
    return 1;
  }
  return (size_t)k;
}

static bool py_space(uint32_t cp) {
  return cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
         cp == 0x205f || cp == 0x3000;
}

static bool is_linebreak(uint32_t cp) {
  return cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d || cp == 0x1e ||
         cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

static bool is_cased(uint32_t cp) {
  return utf8proc_toupper((utf8proc_int32_t)cp) != (utf8proc_int32_t)cp ||
         utf8proc_tolower((utf8proc_int32_t)cp) != (utf8proc_int32_t)cp;
}

static bool is_word(uint32_t cp) {
  if (cp == '_') return true;
  utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) || (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

static void put_cp(hbuf *b, uint32_t cp) {
  char e[4];
  int k = utf8_encode(cp, e);
  if (k) hbuf_append(b, e, (size_t)k);
}

enum { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAPITALIZE, CASE_SWAP };

static int change_case(jrender *r, jv s, int mode, jv *out) {
  hbuf b = {0};
  const char *p = s.s->data;
  size_t n = s.s->len;
  bool prev_cased = false, first = true;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    i += cp_at(p + i, n - i, &cp);
    uint32_t o = cp;
    switch (mode) {
      case CASE_UPPER: o = (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp); break;
      case CASE_LOWER: o = (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp); break;
      case CASE_CAPITALIZE:
        o = first ? (uint32_t)utf8proc_totitle((utf8proc_int32_t)cp) : (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
        break;
      case CASE_TITLE: {
        bool cased = is_cased(cp);
        if (cased) o = prev_cased ? (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp) : (uint32_t)utf8proc_totitle((utf8proc_int32_t)cp);
        prev_cased = cased;
        break;
      }
    }
    first = false;
    put_cp(&b, o);
  }
  TRY(jr_buf_str(r, &b, out));
  out->markup = s.markup;
  return 0;
}

/* strip: which = 1 left, 2 right, 3 both; chars NULL = whitespace */
static int strip(jrender *r, jv s, jv chars, int which, jv *out) {
  const char *p = s.s->data;
  size_t n = s.s->len, lo = 0, hi = n;
  bool ws = !given(chars);
  if (!ws) TRY(need_str(r, chars, "strip arg"));
  if (which & 1) {
    while (lo < hi) {
      uint32_t cp;
      size_t k = cp_at(p + lo, hi - lo, &cp);
      bool m;
      if (ws) m = py_space(cp);
      else {
        m = false;
        for (size_t j = 0; j < chars.s->len;) {
          uint32_t c2;
          j += cp_at(chars.s->data + j, chars.s->len - j, &c2);
          if (c2 == cp) m = true;
        }
      }
      if (!m) break;
      lo += k;
    }
  }
  if (which & 2) {
    while (hi > lo) {
      size_t st = hi - 1;
      while (st > lo && ((unsigned char)p[st] & 0xc0) == 0x80) st--;
      uint32_t cp;
      cp_at(p + st, hi - st, &cp);
      bool m;
      if (ws) m = py_space(cp);
      else {
        m = false;
        for (size_t j = 0; j < chars.s->len;) {
          uint32_t c2;
          j += cp_at(chars.s->data + j, chars.s->len - j, &c2);
          if (c2 == cp) m = true;
        }
      }
      if (!m) break;
      hi = st;
    }
  }
  TRY(jr_make_str(r, p + lo, hi - lo, out));
  out->markup = s.markup;
  return 0;
}

static int push(jrender *r, jlist *l, jv v) { return jlist_push(r->a, l, v) ? 0 : jr_oom(r); }

static int new_list(jrender *r, jv *out) {
  *out = jv_list(r->a, 0);
  return out->t == JV_LIST ? 0 : jr_oom(r);
}

static int split(jrender *r, jv s, jv sep, int64_t maxsplit, bool from_right, jv *out) {
  TRY(new_list(r, out));
  const char *p = s.s->data;
  size_t n = s.s->len;
  if (!given(sep)) {
    /* runs of whitespace; empty pieces dropped */
    size_t i = 0;
    int64_t done = 0;
    if (from_right) {
      /* collect pieces from the right, then reverse */
      jv tmp;
      TRY(new_list(r, &tmp));
      size_t hi = n;
      for (;;) {
        while (hi > 0) {
          size_t st = hi - 1;
          while (st > 0 && ((unsigned char)p[st] & 0xc0) == 0x80) st--;
          uint32_t cp;
          cp_at(p + st, hi - st, &cp);
          if (!py_space(cp)) break;
          hi = st;
        }
        if (hi == 0) break;
        size_t lo = hi;
        if (maxsplit >= 0 && done >= maxsplit) lo = 0;
        else
          while (lo > 0) {
            size_t st = lo - 1;
            while (st > 0 && ((unsigned char)p[st] & 0xc0) == 0x80) st--;
            uint32_t cp;
            cp_at(p + st, lo - st, &cp);
            if (py_space(cp)) break;
            lo = st;
          }
        jv piece;
        TRY(jr_make_str(r, p + lo, hi - lo, &piece));
        TRY(push(r, tmp.l, piece));
        done++;
        hi = lo;
      }
      for (size_t k = tmp.l->n; k > 0; k--) TRY(push(r, out->l, tmp.l->items[k - 1]));
      return 0;
    }
    for (;;) {
      while (i < n) {
        uint32_t cp;
        size_t k = cp_at(p + i, n - i, &cp);
        if (!py_space(cp)) break;
        i += k;
      }
      if (i >= n) break;
      size_t start = i;
      if (maxsplit >= 0 && done >= maxsplit) {
        size_t end = n;
        /* the rest, with trailing whitespace removed */
        while (end > start) {
          size_t st = end - 1;
          while (st > start && ((unsigned char)p[st] & 0xc0) == 0x80) st--;
          uint32_t cp;
          cp_at(p + st, end - st, &cp);
          if (!py_space(cp)) break;
          end = st;
        }
        jv piece;
        TRY(jr_make_str(r, p + start, end - start, &piece));
        return push(r, out->l, piece);
      }
      while (i < n) {
        uint32_t cp;
        size_t k = cp_at(p + i, n - i, &cp);
        if (py_space(cp)) break;
        i += k;
      }
      jv piece;
      TRY(jr_make_str(r, p + start, i - start, &piece));
      TRY(push(r, out->l, piece));
      done++;
    }
    return 0;
  }
  TRY(need_str(r, sep, "separator"));
  if (sep.s->len == 0) return jr_fail(r, HEARTH_EINVAL, "empty separator");
  const char *q = sep.s->data;
  size_t m = sep.s->len;
  if (from_right) {
    jv tmp;
    TRY(new_list(r, &tmp));
    size_t hi = n;
    int64_t done = 0;
    while (maxsplit < 0 || done < maxsplit) {
      const char *found = NULL;
      for (size_t k = hi; k >= m && k - m <= hi; k--) {
        if (memcmp(p + k - m, q, m) == 0) {
          found = p + k - m;
          break;
        }
        if (k == m) break;
      }
      if (!found) break;
      jv piece;
      TRY(jr_make_str(r, found + m, (size_t)(p + hi - found - m), &piece));
      TRY(push(r, tmp.l, piece));
      hi = (size_t)(found - p);
      done++;
    }
    jv piece;
    TRY(jr_make_str(r, p, hi, &piece));
    TRY(push(r, tmp.l, piece));
    for (size_t k = tmp.l->n; k > 0; k--) TRY(push(r, out->l, tmp.l->items[k - 1]));
    return 0;
  }
  size_t i = 0;
  int64_t done = 0;
  for (;;) {
    const char *f = (maxsplit < 0 || done < maxsplit) ? memmem(p + i, n - i, q, m) : NULL;
    size_t end = f ? (size_t)(f - p) : n;
    jv piece;
    TRY(jr_make_str(r, p + i, end - i, &piece));
    TRY(push(r, out->l, piece));
    if (!f) break;
    i = end + m;
    done++;
  }
  return 0;
}

static int replace(jrender *r, jv s, jv old, jv new_, int64_t count, jv *out) {
  TRY(need_str(r, old, "replace() argument 1"));
  TRY(need_str(r, new_, "replace() argument 2"));
  hbuf b = {0};
  const char *p = s.s->data;
  size_t n = s.s->len, i = 0;
  int64_t done = 0;
  if (old.s->len == 0) {
    /* inserts new between every code point and at both ends */
    while (i <= n && (count < 0 || done < count)) {
      hbuf_append(&b, new_.s->data, new_.s->len);
      done++;
      if (i == n) {
        i = n + 1;
        break;
      }
      size_t k = jr_cp_len(p + i, n - i);
      hbuf_append(&b, p + i, k);
      i += k;
      if (b.len > r->lim.max_output) break;
    }
    if (i <= n) hbuf_append(&b, p + i, n - i);
    return jr_buf_str(r, &b, out);
  }
  while (i < n && (count < 0 || done < count)) {
    const char *f = memmem(p + i, n - i, old.s->data, old.s->len);
    if (!f) break;
    hbuf_append(&b, p + i, (size_t)(f - p) - i);
    hbuf_append(&b, new_.s->data, new_.s->len);
    i = (size_t)(f - p) + old.s->len;
    done++;
    if (b.len > r->lim.max_output) break;
  }
  hbuf_append(&b, p + i, n - i);
  return jr_buf_str(r, &b, out);
}

static bool affix_match(jv s, jv affix, bool end) {
  if (affix.t != JV_STR || affix.s->len > s.s->len) return false;
  const char *p = end ? s.s->data + s.s->len - affix.s->len : s.s->data;
  return memcmp(p, affix.s->data, affix.s->len) == 0;
}

static int splitlines(jrender *r, jv s, bool keepends, jv *out) {
  TRY(new_list(r, out));
  const char *p = s.s->data;
  size_t n = s.s->len, i = 0, start = 0;
  while (i < n) {
    uint32_t cp;
    size_t k = cp_at(p + i, n - i, &cp);
    if (is_linebreak(cp)) {
      size_t eol = i + k;
      if (cp == '\r' && eol < n && p[eol] == '\n') eol++;
      jv piece;
      TRY(jr_make_str(r, p + start, (keepends ? eol : i) - start, &piece));
      TRY(push(r, out->l, piece));
      i = start = eol;
    } else {
      i += k;
    }
  }
  if (start < n) {
    jv piece;
    TRY(jr_make_str(r, p + start, n - start, &piece));
    TRY(push(r, out->l, piece));
  }
  return 0;
}

/* str.format: {} {0} {name} {name.attr} {name[key]} with !r / !s; format specs other than
 * empty are refused. */
#define JR_MAX_FORMAT_PRECISION 1000

static int str_format(jrender *r, jv fmt, jargs *a, jv *out) {
  hbuf b = {0};
  const char *p = fmt.s->data;
  size_t n = fmt.s->len;
  int auto_idx = 0;
  for (size_t i = 0; i < n; i++) {
    char c = p[i];
    if (c == '{' && i + 1 < n && p[i + 1] == '{') {
      hbuf_putc(&b, '{');
      i++;
      continue;
    }
    if (c == '}' && i + 1 < n && p[i + 1] == '}') {
      hbuf_putc(&b, '}');
      i++;
      continue;
    }
    if (c != '{') {
      hbuf_putc(&b, c);
      continue;
    }
    size_t j = i + 1;
    while (j < n && p[j] != '}') j++;
    if (j >= n) {
      hbuf_free(&b);
      return jr_fail(r, HEARTH_EINVAL, "Single '{' encountered in format string");
    }
    char field[256];
    size_t fl = j - i - 1 < sizeof field - 1 ? j - i - 1 : sizeof field - 1;
    memcpy(field, p + i + 1, fl);
    field[fl] = 0;
    char conv = 0;
    char *bang = strchr(field, '!');
    char *colon = strchr(field, ':');
    if (colon) {
      if (colon[1]) {
        hbuf_free(&b);
        return jr_fail(r, HEARTH_EUNSUPPORTED, "format spec '%s' is not supported", colon + 1);
      }
      *colon = 0;
    }
    if (bang) {
      conv = bang[1];
      *bang = 0;
    }
    jv v;
    if (field[0] == 0) {
      if (auto_idx >= a->n) {
        hbuf_free(&b);
        return jr_fail(r, HEARTH_EINVAL, "Replacement index %d out of range for positional args tuple", auto_idx);
      }
      v = a->pos[auto_idx++];
    } else if (field[0] >= '0' && field[0] <= '9') {
      char *end;
      long long k = strtoll(field, &end, 10); /* saturates on overflow: never a negative index */
      if (k < 0 || k >= a->n) {
        hbuf_free(&b);
        return jr_fail(r, HEARTH_EINVAL, "Replacement index %s out of range for positional args tuple", field);
      }
      v = a->pos[k];
    } else {
      int k = -1;
      for (int q = 0; q < a->nkw; q++)
        if (!strcmp(a->kwnames[q], field)) k = q;
      if (k < 0) {
        hbuf_free(&b);
        return jr_fail(r, HEARTH_EINVAL, "'%s'", field);
      }
      v = a->kwvals[k];
    }
    if (conv == 'r') jv_repr(&b, v);
    else jv_to_str(&b, v);
    i = j;
  }
  return jr_buf_str(r, &b, out);
}

/* printf-style `fmt % args` for %s %r %d %i %f %% (what templates use). */
int jr_percent_format(jrender *r, jv fmt, jv args, jv *out) {
  jv *items = &args;
  size_t nargs = 1, used = 0;
  if (args.t == JV_LIST && args.tuple) {
    items = args.l->items;
    nargs = args.l->n;
  }
  hbuf b = {0};
  const char *p = fmt.s->data;
  size_t n = fmt.s->len;
  for (size_t i = 0; i < n; i++) {
    if (p[i] != '%') {
      hbuf_putc(&b, p[i]);
      continue;
    }
    if (++i >= n) {
      hbuf_free(&b);
      return jr_fail(r, HEARTH_EINVAL, "incomplete format");
    }
    int prec = -1;
    if (p[i] == '.') {
      prec = 0;
      while (++i < n && p[i] >= '0' && p[i] <= '9') {
        prec = prec * 10 + (p[i] - '0');
        if (prec > JR_MAX_FORMAT_PRECISION) { /* Python would print it; a template asking for this is hostile */
          hbuf_free(&b);
          return jr_fail(r, HEARTH_ELIMIT, "format precision larger than %d", JR_MAX_FORMAT_PRECISION);
        }
      }
      if (i >= n) break;
    }
    char c = p[i];
    if (c == '%') {
      hbuf_putc(&b, '%');
      continue;
    }
    if (used >= nargs) {
      hbuf_free(&b);
      return jr_fail(r, HEARTH_EINVAL, "not enough arguments for format string");
    }
    jv v = items[used++];
    if (c == 's') jv_to_str(&b, v);
    else if (c == 'r') jv_repr(&b, v);
    else if ((c == 'd' || c == 'i') && jv_is_number(v)) hbuf_printf(&b, "%lld", (long long)(v.t == JV_FLOAT ? (int64_t)v.f : v.t == JV_BOOL ? v.b : v.i));
    else if (c == 'f' && jv_is_number(v)) hbuf_printf(&b, "%.*f", prec < 0 ? 6 : prec, jv_as_double(v));
    else {
      hbuf_free(&b);
      return jr_fail(r, HEARTH_EUNSUPPORTED, "format character '%c' is not supported for %s", c, jv_type_name(v));
    }
  }
  /* Python takes anything with __getitem__ (but tuples and str) as a mapping: no leftover check */
  bool mapping = (args.t == JV_LIST && !args.tuple) || args.t == JV_DICT || args.t == JV_UNDEF;
  if (used < nargs && !mapping) {
    hbuf_free(&b);
    return jr_fail(r, HEARTH_EINVAL, "not all arguments converted during string formatting");
  }
  return jr_buf_str(r, &b, out);
}

/* ---- methods ---- */

static const char *const str_methods[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith",
                                          "upper", "lower", "title", "capitalize", "replace", "format", "join",
                                          "count", "find", "rfind", "splitlines", "isdigit", "isalpha", "isalnum",
                                          "isspace", "islower", "isupper", "swapcase", "index", NULL};
static const char *const dict_methods[] = {"items", "keys", "values", "get", "copy", NULL};
static const char *const dict_unsafe[] = {"update", "pop", "popitem", "setdefault", "clear", NULL};
static const char *const list_methods[] = {"index", "count", "copy", NULL};
static const char *const list_unsafe[] = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", NULL};

static bool in_table(const char *const *t, const char *name) {
  for (int i = 0; t[i]; i++)
    if (!strcmp(t[i], name)) return true;
  return false;
}

bool jr_has_method(jv obj, const char *name) {
  switch (obj.t) {
    case JV_STR: return in_table(str_methods, name);
    case JV_DICT: return in_table(dict_methods, name) || in_table(dict_unsafe, name);
    case JV_LIST: return !obj.view && (in_table(list_methods, name) || (!obj.tuple && in_table(list_unsafe, name)));
    default: return false;
  }
}

int jr_method(jrender *r, jv obj, const char *name, jv *out) {
  if ((obj.t == JV_DICT && in_table(dict_unsafe, name)) || (obj.t == JV_LIST && in_table(list_unsafe, name))) {
    char *h = jarena_alloc(r->a, strlen(name) + 80);
    if (!h) return jr_oom(r);
    sprintf(h, "access to attribute '%s' of '%s' object is unsafe.", name, jv_type_name(obj));
    *out = jv_undef(h);
    return 0;
  }
  jfunc *f = jarena_alloc(r->a, sizeof *f);
  if (!f) return jr_oom(r);
  f->name = name;
  f->builtin = B_METHOD;
  f->self = obj;
  *out = (jv){.t = JV_FUNC, .fn = f};
  return 0;
}

static int find_sub(jv s, jv sub, bool last, int64_t *out) {
  const char *p = s.s->data;
  size_t n = s.s->len, m = sub.s->len;
  const char *f = NULL;
  if (!last) f = memmem(p, n, sub.s->data, m);
  else
    for (size_t k = n + 1; k-- > 0;) {
      if (k + m <= n && memcmp(p + k, sub.s->data, m) == 0) {
        f = p + k;
        break;
      }
    }
  if (!f) {
    *out = -1;
    return 0;
  }
  /* byte offset to code point offset */
  int64_t cps = 0;
  for (const char *q = p; q < f; q++) cps += ((unsigned char)*q & 0xc0) != 0x80;
  *out = cps;
  return 0;
}

static int call_method(jrender *r, jfunc *f, jargs *a, jv *out) {
  jv self = f->self;
  const char *m = f->name;
  jv v[4];
  if (self.t == JV_LOOP) {
    if (!strcmp(m, "cycle")) {
      if (a->n == 0) return jr_fail(r, HEARTH_EINVAL, "no items for cycling given");
      *out = a->pos[self.loop->i % (size_t)a->n];
      return 0;
    }
    return jr_fail(r, HEARTH_EUNSUPPORTED, "loop.%s() is not supported", m);
  }
  if (self.t == JV_STR) {
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
      static const char *const p[] = {"chars", NULL};
      TRY(bind(r, m, a, p, v));
      return strip(r, self, v[0], m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3, out);
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
      static const char *const p[] = {"sep", "maxsplit", NULL};
      TRY(bind(r, m, a, p, v));
      int64_t ms = -1;
      if (has(v[1])) TRY(need_int(r, v[1], "maxsplit", &ms));
      return split(r, self, v[0], ms, m[0] == 'r', out);
    }
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
      static const char *const p[] = {"prefix", NULL};
      TRY(bind(r, m, a, p, v));
      bool end = m[0] == 'e', res = false;
      if (v[0].t == JV_LIST && v[0].tuple) {
        for (size_t i = 0; i < v[0].l->n; i++) res = res || affix_match(self, v[0].l->items[i], end);
      } else {
        if (v[0].t != JV_STR)
          return jr_fail(r, HEARTH_EINVAL, "%s first arg must be str or a tuple of str, not %s", m, jv_type_name(v[0]));
        res = affix_match(self, v[0], end);
      }
      *out = jv_bool(res);
      return 0;
    }
    if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") || !strcmp(m, "capitalize")) {
      static const char *const p[] = {NULL};
      TRY(bind(r, m, a, p, v));
      int mode = m[0] == 'u' ? CASE_UPPER : m[0] == 'l' ? CASE_LOWER : m[0] == 't' ? CASE_TITLE : CASE_CAPITALIZE;
      return change_case(r, self, mode, out);
    }
    if (!strcmp(m, "replace")) {
      static const char *const p[] = {"old", "new", "count", NULL};
      TRY(bind(r, m, a, p, v));
      if (!has(v[0]) || !has(v[1])) return jr_fail(r, HEARTH_EINVAL, "replace() takes at least 2 arguments");
      int64_t count = -1;
      if (has(v[2])) TRY(need_int(r, v[2], "count", &count));
      return replace(r, self, v[0], v[1], count, out);
    }
    if (!strcmp(m, "format")) return str_format(r, self, a, out);
    if (!strcmp(m, "join")) {
      static const char *const p[] = {"iterable", NULL};
      TRY(bind(r, m, a, p, v));
      jv *items;
      size_t n;
      TRY(jr_iterate(r, v[0], &items, &n));
      hbuf b = {0};
      for (size_t i = 0; i < n; i++) {
        if (items[i].t != JV_STR) {
          hbuf_free(&b);
          return jr_fail(r, HEARTH_EINVAL, "sequence item %zu: expected str instance, %s found", i, jv_type_name(items[i]));
        }
        if (i) hbuf_append(&b, self.s->data, self.s->len);
        hbuf_append(&b, items[i].s->data, items[i].s->len);
      }
      return jr_buf_str(r, &b, out);
    }
    if (!strcmp(m, "count") || !strcmp(m, "find") || !strcmp(m, "rfind") || !strcmp(m, "index")) {
      static const char *const p[] = {"sub", NULL};
      TRY(bind(r, m, a, p, v));
      TRY(need_str(r, v[0], "substring"));
      if (!strcmp(m, "count")) {
        int64_t k = 0;
        if (v[0].s->len == 0) k = (int64_t)jr_str_cplen(self) + 1;
        else
          for (const char *q = self.s->data; (q = memmem(q, self.s->len - (size_t)(q - self.s->data), v[0].s->data, v[0].s->len));
               q += v[0].s->len)
            k++;
        *out = jv_int(k);
        return 0;
      }
      int64_t pos;
      find_sub(self, v[0], m[0] == 'r', &pos);
      if (pos < 0 && m[0] == 'i') return jr_fail(r, HEARTH_EINVAL, "substring not found");
      *out = jv_int(pos);
      return 0;
    }
    if (!strcmp(m, "splitlines")) {
      static const char *const p[] = {"keepends", NULL};
      TRY(bind(r, m, a, p, v));
      return splitlines(r, self, has(v[0]) && jv_truthy(v[0]), out);
    }
    if (!strncmp(m, "is", 2)) {
      bool res = self.s->len > 0, any_cased = false;
      for (size_t i = 0; i < self.s->len;) {
        uint32_t cp;
        i += cp_at(self.s->data + i, self.s->len - i, &cp);
        utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
        bool alpha = c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
        bool digit = c == UTF8PROC_CATEGORY_ND;
        if (!strcmp(m, "isdigit")) res = res && digit;
        else if (!strcmp(m, "isalpha")) res = res && alpha;
        else if (!strcmp(m, "isalnum")) res = res && (alpha || digit || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO);
        else if (!strcmp(m, "isspace")) res = res && py_space(cp);
        else if (!strcmp(m, "islower")) {
          if (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LT) res = false;
          if (c == UTF8PROC_CATEGORY_LL) any_cased = true;
        } else if (!strcmp(m, "isupper")) {
          if (c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT) res = false;
          if (c == UTF8PROC_CATEGORY_LU) any_cased = true;
        }
      }
      if (!strcmp(m, "islower") || !strcmp(m, "isupper")) res = res && any_cased;
      *out = jv_bool(res);
      return 0;
    }
    if (!strcmp(m, "swapcase")) return change_case(r, self, CASE_SWAP, out);
  }
  if (self.t == JV_DICT) {
    if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values") || !strcmp(m, "copy")) {
      static const char *const p[] = {NULL};
      TRY(bind(r, m, a, p, v));
      if (m[0] == 'c') {
        jv d = jv_dict(r->a, self.d->n);
        if (d.t != JV_DICT) return jr_oom(r);
        for (size_t i = 0; i < self.d->n; i++)
          if (!jdict_set(r->a, d.d, self.d->keys[i], self.d->vals[i])) return jr_oom(r);
        *out = d;
        return 0;
      }
      jv l = jv_list(r->a, self.d->n);
      if (l.t != JV_LIST) return jr_oom(r);
      l.view = m[0] == 'k' ? VIEW_KEYS : m[0] == 'v' ? VIEW_VALUES : VIEW_ITEMS;
      for (size_t i = 0; i < self.d->n; i++) {
        if (m[0] == 'k') l.l->items[l.l->n++] = self.d->keys[i];
        else if (m[0] == 'v') l.l->items[l.l->n++] = self.d->vals[i];
        else {
          jv pair = jv_list(r->a, 2);
          if (pair.t != JV_LIST) return jr_oom(r);
          pair.tuple = true;
          pair.l->items[0] = self.d->keys[i];
          pair.l->items[1] = self.d->vals[i];
          pair.l->n = 2;
          l.l->items[l.l->n++] = pair;
        }
      }
      *out = l;
      return 0;
    }
    if (!strcmp(m, "get")) {
      static const char *const p[] = {"key", "default", NULL};
      TRY(bind(r, m, a, p, v));
      if (!has(v[0])) return jr_fail(r, HEARTH_EINVAL, "get expected at least 1 argument, got 0");
      jv *x = jdict_get(self.d, v[0]);
      *out = x ? *x : has(v[1]) ? v[1] : jv_none();
      return 0;
    }
  }
  if (self.t == JV_LIST) {
    if (!strcmp(m, "copy")) {
      jv l = jv_list(r->a, self.l->n);
      if (l.t != JV_LIST) return jr_oom(r);
      for (size_t i = 0; i < self.l->n; i++) l.l->items[l.l->n++] = self.l->items[i];
      *out = l;
      return 0;
    }
    static const char *const p[] = {"value", NULL};
    TRY(bind(r, m, a, p, v));
    int64_t k = 0, first = -1;
    for (size_t i = 0; i < self.l->n; i++)
      if (jv_equal(self.l->items[i], v[0])) {
        k++;
        if (first < 0) first = (int64_t)i;
      }
    if (!strcmp(m, "index")) {
      if (first < 0) return jr_fail(r, HEARTH_EINVAL, "value is not in list");
      *out = jv_int(first);
    } else {
      *out = jv_int(k);
    }
    return 0;
  }
  return jr_fail(r, HEARTH_EINVAL, "'%s' object has no method '%s'", jv_type_name(self), m);
}

/* ---- globals ---- */

#define MAX_RANGE 100000

static int g_range(jrender *r, jargs *a, jv *out) {
  if (a->nkw) return jr_fail(r, HEARTH_EINVAL, "range() takes no keyword arguments");
  if (a->n < 1 || a->n > 3) return jr_fail(r, HEARTH_EINVAL, "range expected at most 3 arguments, got %d", a->n);
  int64_t x[3];
  for (int i = 0; i < a->n; i++) TRY(need_int(r, a->pos[i], "range", &x[i]));
  int64_t start = 0, stop, step = 1;
  if (a->n == 1) stop = x[0];
  else {
    start = x[0];
    stop = x[1];
    if (a->n == 3) step = x[2];
  }
  if (step == 0) return jr_fail(r, HEARTH_EINVAL, "range() arg 3 must not be zero");
  double len = step > 0 ? ((double)stop - (double)start) / (double)step : ((double)start - (double)stop) / (double)-step;
  int64_t n = len <= 0 ? 0 : (int64_t)ceil(len);
  if (n > MAX_RANGE)
    return jr_fail(r, HEARTH_ELIMIT, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", MAX_RANGE);
  jv l = jv_list(r->a, (size_t)n);
  if (l.t != JV_LIST) return jr_oom(r);
  for (int64_t i = 0; i < n; i++) l.l->items[l.l->n++] = jv_int(start + i * step);
  *out = l;
  return 0;
}

static int g_dict(jrender *r, jargs *a, jv *out, bool ns) {
  jv d = jv_dict(r->a, 0);
  if (d.t != JV_DICT) return jr_oom(r);
  if (a->n > 1) return jr_fail(r, HEARTH_EINVAL, "%s expected at most 1 argument, got %d", ns ? "namespace" : "dict", a->n);
  if (a->n == 1) {
    jv src = a->pos[0];
    if (src.t == JV_DICT || src.t == JV_NS) {
      for (size_t i = 0; i < src.d->n; i++)
        if (!jdict_set(r->a, d.d, src.d->keys[i], src.d->vals[i])) return jr_oom(r);
    } else if (src.t == JV_LIST) {
      for (size_t i = 0; i < src.l->n; i++) {
        jv p = src.l->items[i];
        if (p.t != JV_LIST || p.l->n != 2)
          return jr_fail(r, HEARTH_EINVAL, "dictionary update sequence element #%zu has the wrong length", i);
        if (!jdict_set(r->a, d.d, p.l->items[0], p.l->items[1])) return jr_oom(r);
      }
    } else {
      return jr_fail(r, HEARTH_EINVAL, "'%s' object is not iterable", jv_type_name(src));
    }
  }
  for (int k = 0; k < a->nkw; k++) {
    jv key = jv_cstr(r->a, a->kwnames[k]);
    if (key.t != JV_STR || !jdict_set(r->a, d.d, key, a->kwvals[k])) return jr_oom(r);
  }
  if (ns) d.t = JV_NS;
  *out = d;
  return 0;
}

static int g_strftime(jrender *r, jargs *a, jv *out) {
  jv v[1];
  static const char *const p[] = {"format", NULL};
  TRY(bind(r, "strftime_now", a, p, v));
  if (!has(v[0])) return jr_fail(r, HEARTH_EINVAL, "strftime_now() missing 1 required positional argument: 'format'");
  TRY(need_str(r, v[0], "strftime format"));
  struct tm tm;
  time_t now = r->lim.fixed_now ? (time_t)r->lim.fixed_now : time(NULL);
  if (r->lim.fixed_now) gmtime_r(&now, &tm);
  else localtime_r(&now, &tm);
  char buf[512];
  size_t n = v[0].s->len == 0 ? 0 : strftime(buf, sizeof buf, v[0].s->data, &tm);
  if (n == 0 && v[0].s->len) return jr_fail(r, HEARTH_EINVAL, "strftime format too long or invalid");
  return jr_make_str(r, buf, n, out);
}

int jr_call_builtin(jrender *r, jfunc *f, jargs *a, jv *out) {
  switch (f->builtin) {
    case B_METHOD: return call_method(r, f, a, out);
    case B_RANGE: return g_range(r, a, out);
    case B_NAMESPACE: return g_dict(r, a, out, true);
    case B_DICT: return g_dict(r, a, out, false);
    case B_RAISE: {
      if (a->n < 1) return jr_fail(r, HEARTH_EINVAL, "raise_exception() missing 1 required positional argument: 'message'");
      hbuf b = {0};
      jv_to_str(&b, a->pos[0]);
      int rc = jr_fail(r, HEARTH_EINVAL, "%s", hbuf_str(&b));
      hbuf_free(&b);
      return rc;
    }
    case B_STRFTIME: return g_strftime(r, a, out);
    case B_JOINER: {
      jv v[1];
      static const char *const p[] = {"sep", NULL};
      TRY(bind(r, "joiner", a, p, v));
      jfunc *j = jarena_alloc(r->a, sizeof *j);
      if (!j) return jr_oom(r);
      j->name = "joiner";
      j->builtin = B_JOINER_CALL;
      j->self = jv_list(r->a, 2);
      if (j->self.t != JV_LIST) return jr_oom(r);
      jv sep = has(v[0]) ? v[0] : jv_cstr(r->a, ", ");
      if (sep.t == JV_UNDEF && !has(v[0])) return jr_oom(r);
      j->self.l->items[0] = sep;
      j->self.l->items[1] = jv_bool(false);
      j->self.l->n = 2;
      *out = (jv){.t = JV_FUNC, .fn = j};
      return 0;
    }
    case B_JOINER_CALL: {
      jv *used = &f->self.l->items[1];
      if (!used->b) {
        used->b = true;
        return jr_make_str(r, "", 0, out);
      }
      return jr_to_str(r, f->self.l->items[0], out);
    }
    default: return jr_fail(r, HEARTH_EINTERNAL, "unknown builtin %d", f->builtin);
  }
}

int jr_install_globals(jrender *r, jscope *g) {
  static const struct { const char *name; int id; } globals[] = {
      {"range", B_RANGE}, {"namespace", B_NAMESPACE}, {"dict", B_DICT}, {"raise_exception", B_RAISE},
      {"strftime_now", B_STRFTIME}, {"joiner", B_JOINER}};
  for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++) {
    jfunc *f = jarena_alloc(r->a, sizeof *f);
    if (!f) return jr_oom(r);
    f->name = globals[i].name;
    f->builtin = globals[i].id;
    TRY(jr_bind(r, g, globals[i].name, (jv){.t = JV_FUNC, .fn = f}));
  }
  return 0;
}

/* ---- tests ---- */

int jr_test(jrender *r, const char *name, jv x, jargs *a, jscope *sc, bool *out) {
  (void)sc;
  jv arg = a->n > 0 ? a->pos[0] : (a->nkw > 0 ? a->kwvals[0] : missing);
  #define IS(s) (!strcmp(name, s))
  if (IS("defined")) *out = x.t != JV_UNDEF;
  else if (IS("undefined")) *out = x.t == JV_UNDEF;
  else if (IS("none")) *out = x.t == JV_NONE;
  else if (IS("string")) *out = x.t == JV_STR;
  else if (IS("number")) *out = jv_is_number(x);
  else if (IS("integer")) *out = x.t == JV_INT;
  else if (IS("float")) *out = x.t == JV_FLOAT;
  else if (IS("mapping")) *out = x.t == JV_DICT;
  else if (IS("iterable")) *out = x.t == JV_STR || x.t == JV_LIST || x.t == JV_DICT || x.t == JV_UNDEF;
  else if (IS("sequence")) *out = x.t == JV_STR || (x.t == JV_LIST && !x.view) || x.t == JV_DICT || x.t == JV_UNDEF;
  else if (IS("boolean")) *out = x.t == JV_BOOL;
  else if (IS("true")) *out = x.t == JV_BOOL && x.b;
  else if (IS("false")) *out = x.t == JV_BOOL && !x.b;
  else if (IS("callable")) *out = x.t == JV_FUNC || x.t == JV_UNDEF; /* Undefined has __call__ */
  else if (IS("escaped")) *out = false;
  else if (IS("equalto") || IS("eq") || IS("==") || IS("ne") || IS("!=") || IS("lt") || IS("<") || IS("gt") ||
           IS(">") || IS("le") || IS("<=") || IS("ge") || IS(">=") || IS("lessthan") || IS("greaterthan")) {
    if (!has(arg)) return jr_fail(r, HEARTH_EINVAL, "test '%s' needs an argument", name);
    int op = (IS("equalto") || IS("eq") || IS("==")) ? OP_EQ
             : (IS("ne") || IS("!="))                 ? OP_NE
             : (IS("lt") || IS("<") || IS("lessthan")) ? OP_LT
             : (IS("gt") || IS(">") || IS("greaterthan")) ? OP_GT
             : (IS("le") || IS("<="))                 ? OP_LE
                                                      : OP_GE;
    return jr_compare_op(r, op, x, arg, out);
  } else if (IS("in")) {
    if (!has(arg)) return jr_fail(r, HEARTH_EINVAL, "test 'in' needs an argument");
    return jr_contains(r, arg, x, out);
  } else if (IS("sameas")) {
    if (!has(arg)) return jr_fail(r, HEARTH_EINVAL, "test 'sameas' needs an argument");
    if (x.t != arg.t) *out = false;
    else if (x.t == JV_NONE || x.t == JV_UNDEF) *out = x.t == JV_NONE || x.hint == arg.hint;
    else if (x.t == JV_BOOL) *out = x.b == arg.b;
    else if (x.t == JV_INT) *out = x.i == arg.i && x.i >= -5 && x.i <= 256;
    else if (x.t == JV_STR) *out = x.s == arg.s;
    else if (x.t == JV_LIST) *out = x.l == arg.l;
    else if (x.t == JV_DICT || x.t == JV_NS) *out = x.d == arg.d;
    else if (x.t == JV_FUNC) *out = x.fn == arg.fn;
    else *out = false;
  } else if (IS("lower") || IS("upper")) {
    jv s;
    TRY(jr_to_str(r, x, &s));
    jfunc f = {.name = IS("lower") ? "islower" : "isupper", .builtin = B_METHOD, .self = s};
    jargs none = {0};
    jv res;
    TRY(call_method(r, &f, &none, &res));
    *out = res.b;
  } else if (IS("odd") || IS("even") || IS("divisibleby")) {
    int64_t n, d = 2;
    if (x.t == JV_UNDEF) return jr_fail_undef(r, x);
    if (x.t == JV_FLOAT) { /* value % 2 == 1 etc. with Python's float modulo */
      double d = 2.0;
      if (IS("divisibleby")) {
        if (!has(arg) || !jv_is_number(arg)) return jr_fail(r, HEARTH_EINVAL, "test 'divisibleby' needs a number");
        d = jv_as_double(arg);
        if (d == 0) return jr_fail(r, HEARTH_EINVAL, "float modulo");
      }
      double m = fmod(x.f, d);
      if (m != 0 && ((m < 0) != (d < 0))) m += d;
      *out = IS("odd") ? m == 1.0 : m == 0.0;
      return 0;
    }
    if (x.t != JV_INT && x.t != JV_BOOL)
      return jr_fail(r, HEARTH_EINVAL, "test '%s' needs an integer, not %s", name, jv_type_name(x));
    n = x.t == JV_BOOL ? x.b : x.i;
    if (IS("divisibleby") && x.t == JV_INT && has(arg) && arg.t == JV_FLOAT) {
      if (arg.f == 0) return jr_fail(r, HEARTH_EINVAL, "float modulo");
      *out = fmod((double)n, arg.f) == 0;
      return 0;
    }
    if (IS("divisibleby")) {
      if (!has(arg)) return jr_fail(r, HEARTH_EINVAL, "test 'divisibleby' needs an argument");
      TRY(need_int(r, arg, "divisibleby", &d));
      if (d == 0) return jr_fail(r, HEARTH_EINVAL, "integer modulo by zero");
      *out = n % d == 0;
    } else {
      bool odd = (n % 2) != 0;
      *out = IS("odd") ? odd : !odd;
    }
  } else {
    return jr_fail(r, HEARTH_EINVAL, "No test named '%s'.", name);
  }
  #undef IS
  return 0;
}

/* ---- names (the parser refuses unknown ones, as Jinja2's compiler does) ---- */

static const char *const filter_names[] = {
    "tojson", "safe", "list", "string", "length", "count", "first", "last", "items", "reverse", "abs", "upper",
    "lower", "capitalize", "title", "wordcount", "e", "escape", "forceescape", "trim", "join", "replace", "default",
    "d", "int", "float", "round", "map", "select", "reject", "selectattr", "rejectattr", "unique", "sort",
    "dictsort", "indent", "batch", "sum", "min", "max", "attr", "format", "center", NULL};
static const char *const test_names[] = {
    "defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable", "sequence",
    "boolean", "true", "false", "callable", "escaped", "equalto", "eq", "==", "ne", "!=", "lt", "<", "gt", ">",
    "le", "<=", "ge", ">=", "lessthan", "greaterthan", "in", "sameas", "lower", "upper", "odd", "even",
    "divisibleby", NULL};

bool jinja_known_filter(const char *name) { return in_table(filter_names, name); }
bool jinja_known_test(const char *name) { return in_table(test_names, name); }

/* ---- filters ---- */

/* Jinja2's make_attrgetter: "a.b.0" walks getitem with integer parts. */
static int attr_get(jrender *r, jv item, jv attr, jv *out) {
  if (attr.t != JV_STR) return jr_getitem(r, item, attr, out);
  const char *p = attr.s->data;
  jv cur = item;
  for (;;) {
    const char *dot = strchr(p, '.');
    size_t n = dot ? (size_t)(dot - p) : strlen(p);
    bool digits = n > 0;
    for (size_t i = 0; i < n; i++) digits = digits && p[i] >= '0' && p[i] <= '9';
    jv key;
    if (digits) key = jv_int(strtoll(p, NULL, 10));
    else TRY(jr_make_str(r, p, n, &key));
    TRY(jr_getitem(r, cur, key, &cur));
    if (!dot) break;
    p = dot + 1;
  }
  *out = cur;
  return 0;
}

static int to_list(jrender *r, jv v, jv *out) {
  jv *items;
  size_t n;
  TRY(jr_iterate(r, v, &items, &n));
  *out = jv_list(r->a, n);
  if (out->t != JV_LIST) return jr_oom(r);
  for (size_t i = 0; i < n; i++) out->l->items[out->l->n++] = items[i];
  return 0;
}

/* Sort key for sort/unique/dictsort/min/max: lowercased strings unless case_sensitive. */
static int sort_key(jrender *r, jv v, bool case_sensitive, jv *out) {
  if (v.t == JV_STR && !case_sensitive) return change_case(r, v, CASE_LOWER, out);
  *out = v;
  return 0;
}

typedef struct keyed { jv key, val; } keyed;

static int merge_sort(jrender *r, keyed *x, keyed *tmp, size_t n, bool reverse) {
  if (n < 2) return 0;
  size_t h = n / 2;
  TRY(merge_sort(r, x, tmp, h, reverse));
  TRY(merge_sort(r, x + h, tmp, n - h, reverse));
  size_t i = 0, j = h, k = 0;
  while (i < h && j < n) {
    int c;
    if (jv_compare(x[j].key, x[i].key, &c) != 0)
      return jr_fail(r, HEARTH_EINVAL, "'<' not supported between instances of '%s' and '%s'", jv_type_name(x[j].key),
                     jv_type_name(x[i].key));
    bool take_right = reverse ? c > 0 : c < 0;
    tmp[k++] = take_right ? x[j++] : x[i++];
  }
  while (i < h) tmp[k++] = x[i++];
  while (j < n) tmp[k++] = x[j++];
  memcpy(x, tmp, n * sizeof *x);
  return 0;
}

static int sorted(jrender *r, keyed *x, size_t n, bool reverse) {
  keyed *tmp = jarena_alloc(r->a, (n + 1) * sizeof *tmp);
  if (!tmp) return jr_oom(r);
  return merge_sort(r, x, tmp, n, reverse);
}

int jr_escape(jrender *r, jv v, jv *out) {
  if (v.t == JV_STR && v.markup) {
    *out = v;
    return 0;
  }
  jv s;
  TRY(jr_to_str(r, v, &s));
  hbuf b = {0};
  for (size_t i = 0; i < s.s->len; i++) {
    char c = s.s->data[i];
    switch (c) {
      case '&': hbuf_puts(&b, "&amp;"); break;
      case '<': hbuf_puts(&b, "&lt;"); break;
      case '>': hbuf_puts(&b, "&gt;"); break;
      case '"': hbuf_puts(&b, "&#34;"); break;
      case '\'': hbuf_puts(&b, "&#39;"); break;
      default: hbuf_putc(&b, c);
    }
  }
  TRY(jr_buf_str(r, &b, out));
  out->markup = true;
  return 0;
}

static int f_tojson(jrender *r, jv x, jargs *a, jv *out) {
  jv v[4];
  static const char *const p[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
  TRY(bind(r, "tojson", a, p, v));
  int indent = -1;
  if (given(v[1])) {
    int64_t k;
    TRY(need_int(r, v[1], "indent", &k));
    indent = k < 0 ? 0 : (int)(k > 64 ? 64 : k);
  }
  const char *item_sep = NULL, *key_sep = NULL;
  if (given(v[2])) {
    if (v[2].t != JV_LIST || v[2].l->n != 2 || v[2].l->items[0].t != JV_STR || v[2].l->items[1].t != JV_STR)
      return jr_fail(r, HEARTH_EINVAL, "tojson: separators must be a pair of strings");
    item_sep = v[2].l->items[0].s->data;
    key_sep = v[2].l->items[1].s->data;
  }
  hbuf b = {0};
  const char *bad = NULL;
  if (!jv_to_json(&b, x, has(v[0]) && jv_truthy(v[0]), indent, item_sep, key_sep, has(v[3]) && jv_truthy(v[3]), &bad, 0)) {
    hbuf_free(&b);
    return jr_fail(r, HEARTH_EINVAL, "Object of type %s is not JSON serializable", bad ? bad : "object");
  }
  return jr_buf_str(r, &b, out);
}

static int f_indent(jrender *r, jv x, jargs *a, jv *out) {
  jv v[3];
  static const char *const p[] = {"width", "first", "blank", NULL};
  TRY(bind(r, "indent", a, p, v));
  hbuf ind = {0};
  if (!has(v[0])) hbuf_puts(&ind, "    ");
  else if (v[0].t == JV_STR) hbuf_append(&ind, v[0].s->data, v[0].s->len);
  else {
    int64_t w;
    TRY(need_int(r, v[0], "width", &w));
    for (int64_t i = 0; i < w && i < 4096; i++) hbuf_putc(&ind, ' ');
  }
  bool first = has(v[1]) && jv_truthy(v[1]), blank = has(v[2]) && jv_truthy(v[2]);
  if (x.t != JV_STR) {
    hbuf_free(&ind);
    if (x.t == JV_UNDEF) return jr_fail_undef(r, x);
    if (x.t == JV_LIST && !x.view && !x.tuple) return jr_fail(r, HEARTH_EINVAL, "'list' object has no attribute 'splitlines'");
    return jr_fail(r, HEARTH_EINVAL, "unsupported operand type(s) for +=: '%s' and 'str'", jv_type_name(x));
  }
  jv s = x;
  hbuf tmp = {0};
  hbuf_append(&tmp, s.s->data, s.s->len);
  hbuf_putc(&tmp, '\n');
  jv s2;
  TRY(jr_buf_str(r, &tmp, &s2));
  jv lines;
  TRY(splitlines(r, s2, false, &lines));
  hbuf b = {0};
  if (first) hbuf_append(&b, ind.data ? ind.data : "", ind.len);
  for (size_t i = 0; i < lines.l->n; i++) {
    jv line = lines.l->items[i];
    if (i) {
      hbuf_putc(&b, '\n');
      if (blank || line.s->len) hbuf_append(&b, ind.data ? ind.data : "", ind.len);
    }
    hbuf_append(&b, line.s->data, line.s->len);
  }
  hbuf_free(&ind);
  return jr_buf_str(r, &b, out);
}

static int f_int(jrender *r, jv x, jargs *a, jv *out) {
  jv v[2];
  static const char *const p[] = {"default", "base", NULL};
  TRY(bind(r, "int", a, p, v));
  if (x.t == JV_UNDEF) return jr_fail_undef(r, x); /* Undefined.__int__ raises */
  jv def = has(v[0]) ? v[0] : jv_int(0);
  int64_t base = 10;
  if (has(v[1])) TRY(need_int(r, v[1], "base", &base));
  if (x.t == JV_INT) *out = x;
  else if (x.t == JV_BOOL) *out = jv_int(x.b);
  else if (x.t == JV_FLOAT) *out = isfinite(x.f) && fabs(x.f) < 9.2e18 ? jv_int((int64_t)x.f) : def;
  else if (x.t == JV_STR) {
    char buf[128];
    size_t k = 0;
    for (size_t i = 0; i < x.s->len && k < sizeof buf - 1; i++)
      if (x.s->data[i] != '_') buf[k++] = x.s->data[i];
    buf[k] = 0;
    char *end;
    const char *st = buf;
    while (*st == ' ' || (*st >= 9 && *st <= 13)) st++;
    long long iv = strtoll(st, &end, (int)base);
    while (*end == ' ' || (*end >= 9 && *end <= 13)) end++;
    if (end != st && *end == 0 && *st) *out = jv_int(iv);
    else {
      double d = strtod(st, &end);
      while (*end == ' ' || (*end >= 9 && *end <= 13)) end++;
      if (end != st && *end == 0 && *st && isfinite(d)) *out = jv_int((int64_t)d);
      else *out = def;
    }
  } else *out = def;
  return 0;
}

static int f_float(jrender *r, jv x, jargs *a, jv *out) {
  jv v[1];
  static const char *const p[] = {"default", NULL};
  TRY(bind(r, "float", a, p, v));
  if (x.t == JV_UNDEF) return jr_fail_undef(r, x); /* Undefined.__float__ raises */
  jv def = has(v[0]) ? v[0] : jv_float(0.0);
  if (x.t == JV_FLOAT) *out = x;
  else if (x.t == JV_INT || x.t == JV_BOOL) *out = jv_float(jv_as_double(x));
  else if (x.t == JV_STR) {
    char *end;
    const char *st = x.s->data;
    while (*st == ' ' || (*st >= 9 && *st <= 13)) st++;
    double d = strtod(st, &end);
    while (*end == ' ' || (*end >= 9 && *end <= 13)) end++;
    *out = (end != st && *end == 0 && *st) ? jv_float(d) : def;
  } else *out = def;
  return 0;
}

static int f_round(jrender *r, jv x, jargs *a, jv *out) {
  jv v[2];
  static const char *const p[] = {"precision", "method", NULL};
  TRY(bind(r, "round", a, p, v));
  int64_t prec = 0;
  if (has(v[0])) TRY(need_int(r, v[0], "precision", &prec));
  if (!jv_is_number(x)) return jr_fail(r, HEARTH_EINVAL, "type %s doesn't define __round__ method", jv_type_name(x));
  double d = jv_as_double(x), m = pow(10.0, (double)prec);
  const char *method = has(v[1]) && v[1].t == JV_STR ? v[1].s->data : "common";
  if (!strcmp(method, "common") && x.t != JV_FLOAT && prec >= 0) { /* round(int, n) is the int */
    *out = jv_int(x.t == JV_BOOL ? x.b : x.i);
    return 0;
  }
  double res;
  if (!strcmp(method, "common")) res = nearbyint(d * m) / m;
  else if (!strcmp(method, "ceil")) res = ceil(d * m) / m;
  else if (!strcmp(method, "floor")) res = floor(d * m) / m;
  else return jr_fail(r, HEARTH_EINVAL, "method must be common, ceil or floor");
  *out = jv_float(res);
  return 0;
}

/* A generator over x: Python iterates lazily, so a value that cannot be iterated
 * fails only when the generator is (*broken = true, out holds the pending error). */
static int lazy_source(jrender *r, jv x, bool skip_falsy, jv **items, size_t *n, jv *out, bool *broken) {
  *items = NULL;
  *n = 0;
  *broken = false;
  if (skip_falsy && !jv_truthy(x)) return 0; /* map/select: `if value: for item in value` */
  if (x.t == JV_LIST && x.l->error) { /* a broken generator stays broken until iterated */
    *out = x;
    *broken = true;
    return 0;
  }
  if (x.t == JV_LIST || x.t == JV_DICT || x.t == JV_STR || x.t == JV_UNDEF) return jr_iterate(r, x, items, n);
  TRY(new_list(r, out));
  out->view = VIEW_GENERATOR;
  char *msg = jarena_alloc(r->a, 64);
  if (!msg) return jr_oom(r);
  snprintf(msg, 64, "'%s' object is not iterable", jv_type_name(x));
  out->l->error = msg;
  *broken = true;
  return 0;
}

static int select_like(jrender *r, jv x, jargs *a, jscope *sc, bool attr_mode, bool keep, jv *out) {
  jv *items = NULL;
  size_t n = 0;
  bool broken;
  TRY(lazy_source(r, x, true, &items, &n, out, &broken));
  if (broken) return 0;
  int off = 0;
  jv attr = missing;
  if (attr_mode) {
    if (a->n < 1) return jr_fail(r, HEARTH_EINVAL, "%s needs an attribute name", keep ? "selectattr" : "rejectattr");
    attr = a->pos[0];
    off = 1;
  }
  const char *test = NULL;
  jargs targs = {0};
  if (a->n > off) {
    if (a->pos[off].t != JV_STR) return jr_fail(r, HEARTH_EINVAL, "test name must be a string");
    test = a->pos[off].s->data;
    targs.pos = a->pos + off + 1;
    targs.n = a->n - off - 1;
    targs.kwnames = a->kwnames;
    targs.kwvals = a->kwvals;
    targs.nkw = a->nkw;
  }
  TRY(new_list(r, out));
  for (size_t i = 0; i < n; i++) {
    jv val = items[i];
    if (attr_mode) TRY(attr_get(r, items[i], attr, &val));
    bool t;
    if (test) TRY(jr_test(r, test, val, &targs, sc, &t));
    else t = jv_truthy(val);
    if (t == keep) TRY(push(r, out->l, items[i]));
  }
  out->view = VIEW_GENERATOR;
  return 0;
}

static int f_map(jrender *r, jv x, jargs *a, jscope *sc, jv *out) {
  jv *items = NULL;
  size_t n = 0;
  bool broken;
  TRY(lazy_source(r, x, true, &items, &n, out, &broken));
  if (broken) return 0;
  TRY(new_list(r, out));
  out->view = VIEW_GENERATOR;
  jv attr = missing, def = missing;
  for (int k = 0; k < a->nkw; k++) {
    if (!strcmp(a->kwnames[k], "attribute")) attr = a->kwvals[k];
    else if (!strcmp(a->kwnames[k], "default")) def = a->kwvals[k];
  }
  if (has(attr)) {
    for (size_t i = 0; i < n; i++) {
      jv v;
      TRY(attr_get(r, items[i], attr, &v));
      if (v.t == JV_UNDEF && has(def)) v = def;
      TRY(push(r, out->l, v));
    }
    return 0;
  }
  if (a->n < 1 || a->pos[0].t != JV_STR) return jr_fail(r, HEARTH_EINVAL, "map requires a filter argument");
  jargs fargs = {.pos = a->pos + 1, .n = a->n - 1, .kwnames = a->kwnames, .kwvals = a->kwvals, .nkw = a->nkw};
  for (size_t i = 0; i < n; i++) {
    jv v;
    TRY(jr_filter(r, a->pos[0].s->data, items[i], &fargs, sc, &v));
    TRY(push(r, out->l, v));
  }
  return 0;
}

static int f_sort(jrender *r, jv x, jargs *a, jv *out) {
  jv v[3];
  static const char *const p[] = {"reverse", "case_sensitive", "attribute", NULL};
  TRY(bind(r, "sort", a, p, v));
  jv *items;
  size_t n;
  TRY(jr_iterate(r, x, &items, &n));
  keyed *k = jarena_alloc(r->a, (n + 1) * sizeof *k);
  if (!k) return jr_oom(r);
  bool cs = has(v[1]) && jv_truthy(v[1]);
  for (size_t i = 0; i < n; i++) {
    jv key = items[i];
    if (given(v[2])) TRY(attr_get(r, items[i], v[2], &key));
    TRY(sort_key(r, key, cs, &k[i].key));
    k[i].val = items[i];
  }
  TRY(sorted(r, k, n, has(v[0]) && jv_truthy(v[0])));
  *out = jv_list(r->a, n);
  if (out->t != JV_LIST) return jr_oom(r);
  for (size_t i = 0; i < n; i++) out->l->items[out->l->n++] = k[i].val;
  return 0;
}

static int f_dictsort(jrender *r, jv x, jargs *a, jv *out) {
  jv v[3];
  static const char *const p[] = {"case_sensitive", "by", "reverse", NULL};
  TRY(bind(r, "dictsort", a, p, v));
  if (x.t != JV_DICT) return jr_fail(r, HEARTH_EINVAL, "dictsort needs a mapping, not %s", jv_type_name(x));
  bool by_value = given(v[1]) && v[1].t == JV_STR && !strcmp(v[1].s->data, "value");
  size_t n = x.d->n;
  keyed *k = jarena_alloc(r->a, (n + 1) * sizeof *k);
  if (!k) return jr_oom(r);
  for (size_t i = 0; i < n; i++) {
    TRY(sort_key(r, by_value ? x.d->vals[i] : x.d->keys[i], has(v[0]) && jv_truthy(v[0]), &k[i].key));
    jv pair = jv_list(r->a, 2);
    if (pair.t != JV_LIST) return jr_oom(r);
    pair.tuple = true;
    pair.l->items[0] = x.d->keys[i];
    pair.l->items[1] = x.d->vals[i];
    pair.l->n = 2;
    k[i].val = pair;
  }
  TRY(sorted(r, k, n, has(v[2]) && jv_truthy(v[2])));
  *out = jv_list(r->a, n);
  if (out->t != JV_LIST) return jr_oom(r);
  for (size_t i = 0; i < n; i++) out->l->items[out->l->n++] = k[i].val;
  return 0;
}

static int f_unique(jrender *r, jv x, jargs *a, jv *out) {
  jv v[2];
  static const char *const p[] = {"case_sensitive", "attribute", NULL};
  TRY(bind(r, "unique", a, p, v));
  jv *items;
  size_t n;
  bool broken;
  TRY(lazy_source(r, x, false, &items, &n, out, &broken));
  if (broken) return 0;
  TRY(new_list(r, out));
  jv seen;
  TRY(new_list(r, &seen));
  for (size_t i = 0; i < n; i++) {
    jv key = items[i];
    if (given(v[1])) TRY(attr_get(r, items[i], v[1], &key));
    TRY(sort_key(r, key, has(v[0]) && jv_truthy(v[0]), &key));
    bool dup;
    TRY(jr_contains(r, seen, key, &dup));
    if (dup) continue;
    TRY(push(r, seen.l, key));
    TRY(push(r, out->l, items[i]));
  }
  out->view = VIEW_GENERATOR;
  return 0;
}

static int f_minmax(jrender *r, jv x, jargs *a, bool want_max, jv *out) {
  jv v[2];
  static const char *const p[] = {"case_sensitive", "attribute", NULL};
  TRY(bind(r, want_max ? "max" : "min", a, p, v));
  jv *items;
  size_t n;
  TRY(jr_iterate(r, x, &items, &n));
  if (n == 0) {
    *out = jv_undef("No aggregated item, sequence was empty.");
    return 0;
  }
  jv best = items[0], best_key;
  if (given(v[1])) TRY(attr_get(r, best, v[1], &best_key));
  else best_key = best;
  TRY(sort_key(r, best_key, has(v[0]) && jv_truthy(v[0]), &best_key));
  for (size_t i = 1; i < n; i++) {
    jv key = items[i];
    if (given(v[1])) TRY(attr_get(r, items[i], v[1], &key));
    TRY(sort_key(r, key, has(v[0]) && jv_truthy(v[0]), &key));
    int c;
    if (jv_compare(key, best_key, &c) != 0)
      return jr_fail(r, HEARTH_EINVAL, "'<' not supported between instances of '%s' and '%s'", jv_type_name(key), jv_type_name(best_key));
    if (want_max ? c > 0 : c < 0) {
      best = items[i];
      best_key = key;
    }
  }
  *out = best;
  return 0;
}

static int f_sum(jrender *r, jv x, jargs *a, jv *out) {
  jv v[2];
  static const char *const p[] = {"attribute", "start", NULL};
  TRY(bind(r, "sum", a, p, v));
  jv *items;
  size_t n;
  TRY(jr_iterate(r, x, &items, &n));
  jv acc = has(v[1]) ? v[1] : jv_int(0);
  for (size_t i = 0; i < n; i++) {
    jv val = items[i];
    if (given(v[0])) TRY(attr_get(r, items[i], v[0], &val));
    TRY(jr_binop(r, OP_ADD, acc, val, &acc));
  }
  *out = acc;
  return 0;
}

static int f_batch(jrender *r, jv x, jargs *a, jv *out) {
  jv v[2];
  static const char *const p[] = {"linecount", "fill_with", NULL};
  TRY(bind(r, "batch", a, p, v));
  int64_t count;
  if (!has(v[0])) return jr_fail(r, HEARTH_EINVAL, "batch() missing 1 required positional argument: 'linecount'");
  TRY(need_int(r, v[0], "linecount", &count));
  if (count <= 0) return jr_fail(r, HEARTH_EINVAL, "batch size must be positive");
  jv *items;
  size_t n;
  bool broken;
  TRY(lazy_source(r, x, false, &items, &n, out, &broken));
  if (broken) return 0;
  TRY(new_list(r, out));
  jv cur = {0};
  for (size_t i = 0; i < n; i++) {
    if (cur.t != JV_LIST || (int64_t)cur.l->n == count) {
      TRY(new_list(r, &cur));
      TRY(push(r, out->l, cur));
    }
    TRY(push(r, cur.l, items[i]));
  }
  if (cur.t == JV_LIST && given(v[1]))
    while ((int64_t)cur.l->n < count) TRY(push(r, cur.l, v[1]));
  out->view = VIEW_GENERATOR;
  return 0;
}

static int f_wordcount(jrender *r, jv x, jv *out) {
  jv s;
  TRY(jr_to_str(r, x, &s));
  int64_t k = 0;
  bool in = false;
  for (size_t i = 0; i < s.s->len;) {
    uint32_t cp;
    i += cp_at(s.s->data + i, s.s->len - i, &cp);
    bool w = is_word(cp);
    if (w && !in) k++;
    in = w;
  }
  *out = jv_int(k);
  return 0;
}

static int f_title(jrender *r, jv x, jv *out) {
  /* Jinja2: split at runs of [-\s({\[<]; each piece: first char upper, rest lower */
  jv s;
  TRY(jr_to_str(r, x, &s));
  hbuf b = {0};
  bool start = true;
  for (size_t i = 0; i < s.s->len;) {
    uint32_t cp;
    i += cp_at(s.s->data + i, s.s->len - i, &cp);
    bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || py_space(cp);
    if (sep) {
      put_cp(&b, cp);
      start = true;
    } else {
      put_cp(&b, start ? (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp) : (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
      start = false;
    }
  }
  return jr_buf_str(r, &b, out);
}

int jr_filter(jrender *r, const char *name, jv x, jargs *a, jscope *sc, jv *out) {
  TRY(jr_step(r));
  jv v[4];
  #define IS(s) (!strcmp(name, s))
  if (IS("tojson")) return f_tojson(r, x, a, out);
  if (IS("safe") || IS("list") || IS("string") || IS("length") || IS("count") || IS("first") || IS("last") ||
      IS("items") || IS("reverse") || IS("abs") || IS("upper") || IS("lower") || IS("capitalize") || IS("title") ||
      IS("wordcount") || IS("e") || IS("escape") || IS("forceescape") || IS("trim")) {
    static const char *const none[] = {NULL};
    static const char *const trim_p[] = {"chars", NULL};
    TRY(bind(r, name, a, IS("trim") ? trim_p : none, v));
  }
  if (IS("safe")) {
    TRY(jr_to_str(r, x, out));
    out->markup = true;
    return 0;
  }
  if (IS("string")) return jr_to_str(r, x, out);
  if (IS("list")) return to_list(r, x, out);
  if (IS("length") || IS("count")) {
    if (x.t == JV_LIST && (x.view == VIEW_GENERATOR || x.view == VIEW_REVITER))
      return jr_fail(r, HEARTH_EINVAL, "object of type '%s' has no len()", jv_type_name(x));
    if (x.t == JV_STR) *out = jv_int((int64_t)jr_str_cplen(x));
    else if (x.t == JV_LIST) *out = jv_int((int64_t)x.l->n);
    else if (x.t == JV_DICT || x.t == JV_NS) *out = jv_int((int64_t)x.d->n);
    else if (x.t == JV_UNDEF) *out = jv_int(0);
    else return jr_fail(r, HEARTH_EINVAL, "object of type '%s' has no len()", jv_type_name(x));
    return 0;
  }
  if (IS("first") || IS("last")) {
    if (IS("last") && x.t == JV_LIST && (x.view == VIEW_GENERATOR || x.view == VIEW_REVITER))
      return jr_fail(r, HEARTH_EINVAL, "'%s' object is not reversible", jv_type_name(x));
    if (IS("first") && x.t == JV_LIST && (x.view == VIEW_GENERATOR || x.view == VIEW_REVITER) && !x.l->error) {
      /* next(iter(gen)): takes one item */
      if (x.l->consumed < x.l->n) *out = x.l->items[x.l->consumed++];
      else *out = jv_undef("No first item, sequence was empty.");
      return 0;
    }
    jv *items;
    size_t n;
    TRY(jr_iterate(r, x, &items, &n));
    if (n == 0) *out = jv_undef(IS("first") ? "No first item, sequence was empty." : "No last item, sequence was empty.");
    else *out = IS("first") ? items[0] : items[n - 1];
    return 0;
  }
  if (IS("items")) {
    if (x.t == JV_UNDEF) {
      TRY(new_list(r, out));
    } else {
      if (x.t != JV_DICT) { /* raised when the generator is iterated */
        TRY(new_list(r, out));
        out->view = VIEW_GENERATOR;
        out->l->error = "Can only get item pairs from a mapping.";
        return 0;
      }
      jargs none = {0};
      jfunc f = {.name = "items", .builtin = B_METHOD, .self = x};
      TRY(call_method(r, &f, &none, out));
    }
    out->view = VIEW_GENERATOR;
    return 0;
  }
  if (IS("reverse")) {
    if (x.t == JV_STR) {
      jv chars;
      TRY(jr_str_chars(r, x, &chars));
      hbuf b = {0};
      for (size_t i = chars.l->n; i > 0; i--) hbuf_append(&b, chars.l->items[i - 1].s->data, chars.l->items[i - 1].s->len);
      return jr_buf_str(r, &b, out);
    }
    jv l;
    if (x.t == JV_UNDEF) { /* reversed(Undefined): len() 0, so an empty iterator */
      TRY(new_list(r, out));
      out->view = VIEW_REVITER;
      return 0;
    }
    if (x.t != JV_LIST && x.t != JV_DICT) return jr_fail(r, HEARTH_EINVAL, "argument must be iterable");
    TRY(to_list(r, x, &l));
    for (size_t i = 0; i < l.l->n / 2; i++) {
      jv t = l.l->items[i];
      l.l->items[i] = l.l->items[l.l->n - 1 - i];
      l.l->items[l.l->n - 1 - i] = t;
    }
    /* reversed(list) is an iterator; a generator is listed and reversed into a list */
    if (!(x.t == JV_LIST && x.view == VIEW_GENERATOR)) l.view = VIEW_REVITER;
    *out = l;
    return 0;
  }
  if (IS("abs")) {
    if (x.t == JV_INT) {
      if (x.i == INT64_MIN) return jr_fail(r, HEARTH_ELIMIT, "integer overflow (beyond 64 bits)");
      *out = jv_int(x.i < 0 ? -x.i : x.i);
    } else if (x.t == JV_BOOL) *out = jv_int(x.b);
    else if (x.t == JV_FLOAT) *out = jv_float(fabs(x.f));
    else if (x.t == JV_UNDEF) return jr_fail_undef(r, x);
    else return jr_fail(r, HEARTH_EINVAL, "bad operand type for abs(): '%s'", jv_type_name(x));
    return 0;
  }
  if (IS("upper") || IS("lower") || IS("capitalize")) {
    jv s;
    TRY(jr_to_str(r, x, &s));
    return change_case(r, s, IS("upper") ? CASE_UPPER : IS("lower") ? CASE_LOWER : CASE_CAPITALIZE, out);
  }
  if (IS("title")) return f_title(r, x, out);
  if (IS("wordcount")) return f_wordcount(r, x, out);
  if (IS("e") || IS("escape")) return jr_escape(r, x, out);
  if (IS("forceescape")) {
    jv plain;
    TRY(jr_to_str(r, x, &plain));
    plain.markup = false;
    return jr_escape(r, plain, out);
  }
  if (IS("trim")) {
    jv s;
    TRY(jr_to_str(r, x, &s));
    return strip(r, s, v[0], 3, out);
  }
  if (IS("join")) {
    static const char *const p[] = {"d", "attribute", NULL};
    TRY(bind(r, name, a, p, v));
    jv *items;
    size_t n;
    TRY(jr_iterate(r, x, &items, &n));
    jv sep = jv_none();
    if (has(v[0])) TRY(jr_to_str(r, v[0], &sep));
    hbuf b = {0};
    for (size_t i = 0; i < n; i++) {
      jv item = items[i];
      if (given(v[1])) {
        int rc = attr_get(r, item, v[1], &item);
        if (rc) {
          hbuf_free(&b);
          return rc;
        }
      }
      if (i && sep.t == JV_STR) hbuf_append(&b, sep.s->data, sep.s->len);
      jv_to_str(&b, item);
      if (b.len > r->lim.max_output) break;
    }
    return jr_buf_str(r, &b, out);
  }
  if (IS("replace")) {
    static const char *const p[] = {"old", "new", "count", NULL};
    TRY(bind(r, name, a, p, v));
    if (!has(v[0]) || !has(v[1])) return jr_fail(r, HEARTH_EINVAL, "replace() needs old and new");
    jv s, o, nw;
    TRY(jr_to_str(r, x, &s));
    TRY(jr_to_str(r, v[0], &o));
    TRY(jr_to_str(r, v[1], &nw));
    int64_t count = -1;
    if (given(v[2])) TRY(need_int(r, v[2], "count", &count));
    return replace(r, s, o, nw, count, out);
  }
  if (IS("default") || IS("d")) {
    static const char *const p[] = {"default_value", "boolean", NULL};
    TRY(bind(r, name, a, p, v));
    jv def = has(v[0]) ? v[0] : missing;
    bool boolean = has(v[1]) && jv_truthy(v[1]);
    if (x.t == JV_UNDEF || (boolean && !jv_truthy(x))) {
      if (has(def)) *out = def;
      else TRY(jr_make_str(r, "", 0, out));
    } else {
      *out = x;
    }
    return 0;
  }
  if (IS("int")) return f_int(r, x, a, out);
  if (IS("float")) return f_float(r, x, a, out);
  if (IS("round")) return f_round(r, x, a, out);
  if (IS("map")) return f_map(r, x, a, sc, out);
  if (IS("select")) return select_like(r, x, a, sc, false, true, out);
  if (IS("reject")) return select_like(r, x, a, sc, false, false, out);
  if (IS("selectattr")) return select_like(r, x, a, sc, true, true, out);
  if (IS("rejectattr")) return select_like(r, x, a, sc, true, false, out);
  if (IS("unique")) return f_unique(r, x, a, out);
  if (IS("sort")) return f_sort(r, x, a, out);
  if (IS("dictsort")) return f_dictsort(r, x, a, out);
  if (IS("indent")) return f_indent(r, x, a, out);
  if (IS("batch")) return f_batch(r, x, a, out);
  if (IS("sum")) return f_sum(r, x, a, out);
  if (IS("min")) return f_minmax(r, x, a, false, out);
  if (IS("max")) return f_minmax(r, x, a, true, out);
  if (IS("attr")) {
    static const char *const p[] = {"name", NULL};
    TRY(bind(r, name, a, p, v));
    if (!has(v[0]) || v[0].t != JV_STR) return jr_fail(r, HEARTH_EINVAL, "attr() needs a name");
    return jr_getattr(r, x, v[0].s->data, out);
  }
  if (IS("format")) {
    jv s;
    TRY(jr_to_str(r, x, &s));
    jv args = jv_list(r->a, (size_t)a->n);
    if (args.t != JV_LIST) return jr_oom(r);
    args.tuple = true;
    for (int i = 0; i < a->n; i++) args.l->items[args.l->n++] = a->pos[i];
    return jr_percent_format(r, s, args, out);
  }
  if (IS("center")) {
    static const char *const p[] = {"width", NULL};
    TRY(bind(r, name, a, p, v));
    int64_t w = 80;
    if (has(v[0])) TRY(need_int(r, v[0], "width", &w));
    jv s;
    TRY(jr_to_str(r, x, &s));
    int64_t len = (int64_t)jr_str_cplen(s);
    if (w > 1 << 20) w = 1 << 20;
    if (w <= len) {
      *out = s;
      return 0;
    }
    int64_t pad = w - len, left = pad / 2 + (pad & w & 1);
    hbuf b = {0};
    for (int64_t i = 0; i < left; i++) hbuf_putc(&b, ' ');
    hbuf_append(&b, s.s->data, s.s->len);
    for (int64_t i = 0; i < pad - left; i++) hbuf_putc(&b, ' ');
    return jr_buf_str(r, &b, out);
  }
  #undef IS
  return jr_fail(r, HEARTH_EINVAL, "No filter named '%s'.", name);
}
