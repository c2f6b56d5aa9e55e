/* jinja_lex.c — turns template source into tokens exactly as Jinja2's lexer
 * does under trim_blocks + lstrip_blocks: newline normalisation, the dropped
 * trailing newline, `-`/`+` whitespace control, comments, raw blocks, and the
 * tokens inside {{ }} / {% %} (names, numbers, strings with Python escapes,
 * operators, bracket balancing). Knows nothing of the grammar. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "base/vec.h"
#include "chat/jinja_internal.h"

typedef struct lexer {
  jarena *a;
  const char *s; /* normalised source (arena) */
  size_t n, pos;
  int line;
  jtoken *toks;
  size_t ntoks, cap;
  herr *err;
  int *err_line;
} lexer;

static int lex_fail(lexer *L, const char *msg, ...) __attribute__((format(printf, 2, 3)));
static int lex_fail(lexer *L, const char *msg, ...) {
  va_list ap;
  va_start(ap, msg);
  char tmp[512];
  vsnprintf(tmp, sizeof tmp, msg, ap);
  va_end(ap);
  *L->err_line = L->line;
  return herr_set(L->err, HEARTH_EFORMAT, "%s", tmp);
}

static int count_lines(const char *s, size_t n) {
  int k = 0;
  for (size_t i = 0; i < n; i++) k += s[i] == '\n';
  return k;
}

static jtoken *push(lexer *L, int type, const char *s, size_t len) {
  if (L->ntoks == L->cap && !HGROW(L->toks, L->cap, L->ntoks + 1)) return NULL;
  jtoken *t = &L->toks[L->ntoks++];
  memset(t, 0, sizeof *t);
  t->type = (uint8_t)type;
  t->line = L->line;
  t->s = s;
  t->len = len;
  return t;
}

/* Byte length of the Python whitespace character at s (str.isspace), else 0. */
static size_t ws_at(const char *s, size_t n) {
  if (n == 0) return 0;
  unsigned char c = (unsigned char)s[0];
  if (c < 0x80) return (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) ? 1 : 0;
  uint32_t cp;
  int k = utf8_decode(s, n, &cp);
  if (k == 0) return 0;
  if (cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
      cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000)
    return (size_t)k;
  return 0;
}

static size_t skip_ws(const char *s, size_t n, size_t pos) {
  size_t k;
  while (pos < n && (k = ws_at(s + pos, n - pos))) pos += k;
  return pos;
}

/* Length of text[0..n) with trailing Python whitespace removed. */
static size_t rstrip_len(const char *s, size_t n) {
  size_t end = 0, i = 0, k;
  while (i < n) {
    if ((k = ws_at(s + i, n - i))) {
      i += k;
    } else {
      int d = 1;
      uint32_t cp;
      if ((unsigned char)s[i] >= 0x80) {
        d = utf8_decode(s + i, n - i, &cp);
        if (d == 0) d = 1;
      }
      i += (size_t)d;
      end = i;
    }
  }
  return end;
}

static bool all_ws(const char *s, size_t n) { return n > 0 && skip_ws(s, n, 0) == n; }

/* Emits the data before a tag, applying '-' / lstrip_blocks like Jinja2. */
static int emit_text(lexer *L, size_t start, size_t end, char sign, bool is_variable, bool line_starting) {
  const char *text = L->s + start;
  size_t n = end - start;
  if (sign == '-') {
    n = rstrip_len(text, n);
  } else if (sign != '+' && !is_variable) {
    size_t l_pos = 0;
    for (size_t i = n; i > 0; i--)
      if (text[i - 1] == '\n') {
        l_pos = i;
        break;
      }
    if ((l_pos > 0 || line_starting) && all_ws(text + l_pos, n - l_pos)) n = l_pos;
  }
  if (n) {
    if (!push(L, T_DATA, text, n)) return lex_fail(L, "out of memory");
  }
  L->line += count_lines(L->s + start, end - start);
  return 0;
}

static bool starts(const lexer *L, size_t pos, const char *lit) {
  size_t k = strlen(lit);
  return pos + k <= L->n && memcmp(L->s + pos, lit, k) == 0;
}

/* Tag end at pos: "+%}", "-%}\s*", "%}\n?" (close = "%}" or "#}"), or "-}}\s*" / "}}".
 * Returns the position after it, or 0 when there is none at pos. */
static size_t tag_end_at(const lexer *L, size_t pos, const char *close, bool trim) {
  if (L->s[pos] == '+' && close[0] != '}' && starts(L, pos + 1, close)) return pos + 3;
  if (L->s[pos] == '-' && starts(L, pos + 1, close)) return skip_ws(L->s, L->n, pos + 3);
  if (starts(L, pos, close)) {
    size_t e = pos + 2;
    if (trim && e < L->n && L->s[e] == '\n') e++;
    return e;
  }
  return 0;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Python unicode-escape decoding of a string literal body. */
static int unescape(lexer *L, const char *s, size_t n, jtoken *t) {
  char *out = jarena_alloc(L->a, n + 1);
  if (!out) return lex_fail(L, "out of memory");
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] != '\\' || i + 1 >= n) {
      out[o++] = s[i];
      continue;
    }
    char c = s[++i];
    switch (c) {
      case '\n': break;
      case '\\': out[o++] = '\\'; break;
      case '\'': out[o++] = '\''; break;
      case '"': out[o++] = '"'; break;
      case 'a': out[o++] = '\a'; break;
      case 'b': out[o++] = '\b'; break;
      case 'f': out[o++] = '\f'; break;
      case 'n': out[o++] = '\n'; break;
      case 'r': out[o++] = '\r'; break;
      case 't': out[o++] = '\t'; break;
      case 'v': out[o++] = '\v'; break;
      case 'x': case 'u': case 'U': {
        int digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (int k = 0; k < digits; k++) {
          int h = i + 1 + (size_t)k < n ? hexval(s[i + 1 + k]) : -1;
          if (h < 0) return lex_fail(L, "invalid \\%c escape in string literal", c);
          cp = cp * 16 + (uint32_t)h;
        }
        i += (size_t)digits;
        char enc[4];
        int k = utf8_encode(cp, enc);
        if (k == 0) return lex_fail(L, "invalid code point U+%X in string literal", cp);
        memcpy(out + o, enc, (size_t)k); /* an escape is >= 4 source bytes for >= 4 output bytes */
        o += (size_t)k;
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          uint32_t cp = (uint32_t)(c - '0');
          for (int k = 0; k < 2 && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '7'; k++) cp = cp * 8 + (uint32_t)(s[++i] - '0');
          char enc[4];
          int k = utf8_encode(cp, enc);
          memcpy(out + o, enc, (size_t)k);
          o += (size_t)k;
        } else {
          out[o++] = '\\';
          out[o++] = c;
        }
    }
  }
  out[o] = 0;
  t->s = out;
  t->len = o;
  return 0;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* Digits with single underscores between them ((\d+_)*\d+). Returns the end, or start when none. */
static size_t scan_digits(const lexer *L, size_t p) {
  size_t start = p;
  while (p < L->n && is_digit(L->s[p])) {
    p++;
    if (p + 1 < L->n && L->s[p] == '_' && is_digit(L->s[p + 1])) p++;
  }
  return p == start ? start : p;
}

static int lex_number(lexer *L, size_t *pos) {
  size_t p = *pos;
  const char *s = L->s;
  /* float: digits ( (.digits)? e[+-]?digits | .digits ) unless preceded by '.' */
  bool after_dot = p > 0 && s[p - 1] == '.';
  size_t e = scan_digits(L, p);
  if (!after_dot) {
    size_t q = e;
    bool frac = false, expo = false;
    if (q + 1 < L->n && s[q] == '.' && is_digit(s[q + 1])) {
      q = scan_digits(L, q + 1);
      frac = true;
    }
    if (q < L->n && (s[q] == 'e' || s[q] == 'E')) {
      size_t r = q + 1;
      if (r < L->n && (s[r] == '+' || s[r] == '-')) r++;
      if (r < L->n && is_digit(s[r])) {
        q = scan_digits(L, r);
        expo = true;
      }
    }
    if (frac || expo) {
      char buf[128];
      size_t k = 0;
      for (size_t i = p; i < q && k < sizeof buf - 1; i++)
        if (s[i] != '_') buf[k++] = s[i];
      buf[k] = 0;
      jtoken *t = push(L, T_FLOAT, s + p, q - p);
      if (!t) return lex_fail(L, "out of memory");
      t->f = strtod(buf, NULL);
      *pos = q;
      return 0;
    }
  }
  /* integer: 0b / 0o / 0x prefixes, [1-9](_?\d)*, 0(_?0)* */
  int base = 10;
  size_t q = p;
  if (s[p] == '0' && p + 1 < L->n && strchr("bBoOxX", s[p + 1]) && s[p + 1]) {
    char k = (char)(s[p + 1] | 0x20);
    base = k == 'b' ? 2 : k == 'o' ? 8 : 16;
    q = p + 2;
    size_t digits_start = q;
    while (q < L->n) {
      if (s[q] == '_' && q + 1 < L->n && hexval(s[q + 1]) >= 0 && hexval(s[q + 1]) < base) q++;
      int h = hexval(s[q]);
      if (h < 0 || h >= base) break;
      q++;
    }
    if (q == digits_start) { base = 10; q = p + 1; }
  } else if (s[p] == '0') {
    q = p + 1;
    while (q < L->n && (s[q] == '0' || (s[q] == '_' && q + 1 < L->n && s[q + 1] == '0'))) q++;
  } else {
    q = e;
  }
  int64_t v = 0;
  size_t from = base == 10 ? p : p + 2;
  for (size_t i = from; i < q; i++) {
    if (s[i] == '_') continue;
    int h = hexval(s[i]);
    if (v > (INT64_MAX - h) / base) return lex_fail(L, "integer literal too large");
    v = v * base + h;
  }
  jtoken *t = push(L, T_INT, s + p, q - p);
  if (!t) return lex_fail(L, "out of memory");
  t->i = v;
  *pos = q;
  return 0;
}

static const char *const operators2[] = {"//", "**", "==", "!=", ">=", "<="};
static const char operators1[] = "+-/*%~[](){}><=.:|,;";

/* Tokens inside {{ }} or {% %} until the closing tag. */
static int lex_tag(lexer *L, bool block, bool *line_starting) {
  char balance[256];
  int depth = 0;
  const char *close = block ? "%}" : "}}";
  for (;;) {
    if (L->pos >= L->n) return lex_fail(L, "unexpected end of template, expected '%s'", block ? "end of statement block" : "end of print statement");
    if (depth == 0) {
      size_t e = tag_end_at(L, L->pos, close, block);
      if (e) {
        if (!push(L, block ? T_BLOCK_END : T_VAR_END, L->s + L->pos, e - L->pos)) return lex_fail(L, "out of memory");
        L->line += count_lines(L->s + L->pos, e - L->pos);
        *line_starting = L->s[e - 1] == '\n';
        L->pos = e;
        return 0;
      }
    }
    size_t p = L->pos;
    const char *s = L->s;
    size_t w = skip_ws(s, L->n, p);
    if (w > p) {
      L->line += count_lines(s + p, w - p);
      L->pos = w;
      continue;
    }
    char c = s[p];
    if (is_digit(c)) {
      int rc = lex_number(L, &L->pos);
      if (rc) return rc;
      continue;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
      size_t q = p + 1;
      while (q < L->n && ((s[q] >= 'a' && s[q] <= 'z') || (s[q] >= 'A' && s[q] <= 'Z') || s[q] == '_' || is_digit(s[q]))) q++;
      if (!push(L, T_NAME, s + p, q - p)) return lex_fail(L, "out of memory");
      L->pos = q;
      continue;
    }
    if (c == '\'' || c == '"') {
      size_t q = p + 1;
      while (q < L->n && s[q] != c) q += s[q] == '\\' ? 2 : 1;
      if (q < L->n) {
        jtoken *t = push(L, T_STRING, s + p, q + 1 - p);
        if (!t) return lex_fail(L, "out of memory");
        int rc = unescape(L, s + p + 1, q - p - 1, t);
        if (rc) return rc;
        L->line += count_lines(s + p, q + 1 - p);
        L->pos = q + 1;
        continue;
      }
    }
    size_t oplen = 0;
    for (size_t k = 0; k < sizeof operators2 / sizeof operators2[0]; k++)
      if (starts(L, p, operators2[k])) oplen = 2;
    if (!oplen && c && strchr(operators1, c)) oplen = 1;
    if (!oplen) return lex_fail(L, "unexpected char '%c' at %zu", c, p);
    if (oplen == 1 && (c == '(' || c == '[' || c == '{')) {
      if (depth >= (int)sizeof balance) return lex_fail(L, "brackets nested too deeply");
      balance[depth++] = c == '(' ? ')' : c == '[' ? ']' : '}';
    } else if (oplen == 1 && (c == ')' || c == ']' || c == '}')) {
      if (depth == 0) return lex_fail(L, "unexpected '%c'", c);
      if (balance[depth - 1] != c) return lex_fail(L, "unexpected '%c', expected '%c'", c, balance[depth - 1]);
      depth--;
    }
    if (!push(L, T_OP, s + p, oplen)) return lex_fail(L, "out of memory");
    L->pos = p + oplen;
  }
}

static int lex_all(lexer *out, jarena *a, const char *src, size_t len, jtoken **toks, size_t *ntoks, herr *err, int *err_line) {
  *out = (lexer){.a = a, .line = 1, .err = err, .err_line = err_line};
#define L (*out)
  /* newlines: \r\n and \r become \n; one trailing newline is dropped */
  char *s = jarena_alloc(a, len + 1);
  if (!s) return lex_fail(&L, "out of memory");
  size_t n = 0;
  for (size_t i = 0; i < len; i++) {
    if (src[i] == '\r') {
      s[n++] = '\n';
      if (i + 1 < len && src[i + 1] == '\n') i++;
    } else {
      s[n++] = src[i];
    }
  }
  if (n && s[n - 1] == '\n') n--;
  s[n] = 0;
  L.s = s;
  L.n = n;
  bool line_starting = true;
  while (L.pos < n) {
    /* the next tag start: "{{", "{%", "{#" */
    size_t p = L.pos;
    const char *hit = NULL;
    while ((hit = memchr(s + p, '{', n - p)) != NULL) {
      size_t q = (size_t)(hit - s);
      if (q + 1 < n && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#')) break;
      p = q + 1;
    }
    if (!hit) {
      if (!push(&L, T_DATA, s + L.pos, n - L.pos)) return lex_fail(&L, "out of memory");
      break;
    }
    size_t start = (size_t)(hit - s);
    char kind = s[start + 1];
    size_t after = start + 2;
    char sign = 0;
    if (after < n && (s[after] == '-' || s[after] == '+')) sign = s[after++];
    /* {% raw %} */
    if (kind == '%') {
      size_t q = skip_ws(s, n, after);
      if (starts(&L, q, "raw")) {
        size_t r = skip_ws(s, n, q + 3);
        size_t e = 0;
        if (r < n && s[r] == '-' && starts(&L, r + 1, "%}")) e = skip_ws(s, n, r + 3);
        else if (starts(&L, r, "%}")) e = r + 2;
        if (e) {
          int rc = emit_text(&L, L.pos, start, sign, false, line_starting);
          if (rc) return rc;
          L.line += count_lines(s + start, e - start);
          line_starting = s[e - 1] == '\n';
          /* find {%(-|+|)\s*endraw\s*(+%}|-%}\s*|%}\n?) */
          size_t x = e;
          for (;;) {
            const char *h = x < n ? memchr(s + x, '{', n - x) : NULL;
            if (!h) return lex_fail(&L, "Missing end of raw directive");
            size_t hs = (size_t)(h - s);
            if (hs + 1 < n && s[hs + 1] == '%') {
              size_t y = hs + 2;
              char esign = 0;
              if (y < n && (s[y] == '-' || s[y] == '+')) esign = s[y++];
              y = skip_ws(s, n, y);
              if (starts(&L, y, "endraw")) {
                size_t z = skip_ws(s, n, y + 6);
                size_t end = z < n ? tag_end_at(&L, z, "%}", true) : 0;
                if (end) {
                  rc = emit_text(&L, e, hs, esign, false, line_starting);
                  if (rc) return rc;
                  L.line += count_lines(s + hs, end - hs);
                  line_starting = s[end - 1] == '\n';
                  L.pos = end;
                  break;
                }
              }
            }
            x = hs + 1;
          }
          continue;
        }
      }
    }
    int rc = emit_text(&L, L.pos, start, sign, kind == '{', line_starting);
    if (rc) return rc;
    L.pos = after;
    if (kind == '#') {
      /* (.*?)(+#}|-#}\s*|#}\n?) */
      size_t x = after;
      size_t end = 0;
      for (; x + 1 < n; x++) {
        if ((s[x] == '-' || s[x] == '+') && x + 2 < n && s[x + 1] == '#' && s[x + 2] == '}') {
          end = tag_end_at(&L, x, "#}", true);
          break;
        }
        if (s[x] == '#' && s[x + 1] == '}') {
          end = tag_end_at(&L, x, "#}", true);
          break;
        }
      }
      if (!end) return lex_fail(&L, "Missing end of comment tag");
      L.line += count_lines(s + start, end - start);
      line_starting = s[end - 1] == '\n';
      L.pos = end;
      continue;
    }
    if (!push(&L, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, s + start, after - start)) return lex_fail(&L, "out of memory");
    rc = lex_tag(&L, kind == '%', &line_starting);
    if (rc) return rc;
  }
  if (!push(&L, T_EOF, s + n, 0)) return lex_fail(&L, "out of memory");
  *toks = L.toks; /* malloc'd: the caller frees */
  *ntoks = L.ntoks;
  return 0;
#undef L
}

int jinja_lex(jarena *a, const char *src, size_t len, jtoken **toks, size_t *ntoks, herr *err, int *err_line) {
  lexer L = {0};
  *toks = NULL;
  int rc = lex_all(&L, a, src, len, toks, ntoks, err, err_line);
  if (rc) {
    free(L.toks);
    *toks = NULL;
  }
  return rc;
}
