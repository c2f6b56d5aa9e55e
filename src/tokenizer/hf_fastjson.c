/* hf_fastjson.c — a fast path for the two huge parts of a tokenizer.json:
 * model.vocab (an object of token: id) and model.merges (an array of "a b"
 * strings or [a, b] pairs). Loading them through a general JSON tree costs
 * seconds on 30 MB files; here they are located by a small scanner and read
 * straight from the (mapped) text, and the rest of the file goes to jansson
 * with those two values replaced by null. Anything unexpected makes the
 * caller fall back to the plain jansson path, which reports errors. Knows
 * nothing of what the tokens mean. */
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "tokenizer/hf_fastjson.h"

static const char *ws(const char *p, const char *end) {
  while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
  return p;
}

/* Skips a string starting at p ('"'); returns the byte after it or NULL. */
static const char *skip_string(const char *p, const char *end) {
  for (p++; p < end; p++) {
    if (*p == '\\') p++;
    else if (*p == '"') return p + 1;
  }
  return NULL;
}

/* Skips one JSON value (not validated: jansson checks what it is given). */
static const char *skip_value(const char *p, const char *end) {
  if (p >= end) return NULL;
  if (*p == '"') return skip_string(p, end);
  if (*p == '{' || *p == '[') {
    int depth = 0;
    for (; p < end; p++) {
      if (*p == '"') {
        p = skip_string(p, end);
        if (!p) return NULL;
        p--;
      } else if (*p == '{' || *p == '[') depth++;
      else if (*p == '}' || *p == ']') {
        if (--depth == 0) return p + 1;
      }
    }
    return NULL;
  }
  while (p < end && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\n' && *p != '\r' && *p != '\t') p++;
  return p;
}

/* Finds the member `key` of the object at p; sets its value range. 0 found, -1 not found/odd. */
static int find_member(const char *p, const char *end, const char *key, const char **vs, const char **ve) {
  size_t klen = strlen(key);
  int found = 0;
  p = ws(p, end);
  if (p >= end || *p != '{') return -1;
  p = ws(p + 1, end);
  if (p < end && *p == '}') return -1;
  while (p < end) {
    if (*p != '"') return -1;
    const char *ks = p + 1, *ke = skip_string(p, end);
    if (!ke) return -1;
    p = ws(ke, end);
    if (p >= end || *p != ':') return -1;
    p = ws(p + 1, end);
    const char *v = p;
    p = skip_value(p, end);
    if (!p) return -1;
    if ((size_t)(ke - 1 - ks) == klen && memcmp(ks, key, klen) == 0) {
      if (found) return -1; /* duplicate keys: let jansson decide */
      found = 1;
      *vs = v;
      *ve = p;
    }
    p = ws(p, end);
    if (p < end && *p == ',') {
      p = ws(p + 1, end);
      continue;
    }
    if (p < end && *p == '}') break;
    return -1;
  }
  return found ? 0 : -1;
}

int hf_fast_split(const char *json, size_t len, hf_fast_ranges *r) {
  memset(r, 0, sizeof *r);
  const char *end = json + len, *ms, *me;
  if (find_member(json, end, "model", &ms, &me)) return -1;
  if (find_member(ms, me, "vocab", &r->vocab, &r->vocab_end)) return -1;
  if (*r->vocab != '{') return -1; /* Unigram's array vocab takes the plain path */
  if (find_member(ms, me, "merges", &r->merges, &r->merges_end)) r->merges = r->merges_end = NULL;
  else if (*r->merges != '[') return -1;
  /* the text with the two values replaced by null */
  size_t cap = len + 16;
  char *o = malloc(cap);
  if (!o) return -1;
  const char *a = r->vocab, *ae = r->vocab_end, *b = r->merges, *be = r->merges_end;
  if (b && b < a) { /* keep them in text order */
    const char *t = a, *te = ae;
    a = b, ae = be, b = t, be = te;
  }
  size_t k = 0;
  memcpy(o + k, json, (size_t)(a - json)), k += (size_t)(a - json);
  memcpy(o + k, "null", 4), k += 4;
  if (b) {
    memcpy(o + k, ae, (size_t)(b - ae)), k += (size_t)(b - ae);
    memcpy(o + k, "null", 4), k += 4;
    memcpy(o + k, be, (size_t)(end - be)), k += (size_t)(end - be);
  } else {
    memcpy(o + k, ae, (size_t)(end - ae)), k += (size_t)(end - ae);
  }
  r->rest = o;
  r->rest_len = k;
  return 0;
}

static int hexval(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static int hex4(const char *p, const char *end, uint32_t *v) {
  if (end - p < 4) return -1;
  *v = 0;
  for (int i = 0; i < 4; i++) {
    int h = hexval(p[i]);
    if (h < 0) return -1;
    *v = *v << 4 | (uint32_t)h;
  }
  return 0;
}

/* Decodes the string at *pp ('"') into out; advances *pp. -1 when malformed. */
int hf_fast_string(const char **pp, const char *end, hbuf *out) {
  const char *p = *pp;
  if (p >= end || *p != '"') return -1;
  hbuf_clear(out);
  bool high = false;
  for (p++; p < end; p++) {
    unsigned char c = (unsigned char)*p;
    if (c == '"') {
      *pp = p + 1;
      if (high && !utf8_valid(hbuf_str(out), out->len)) return -1;
      return out->oom ? -1 : 0;
    }
    if (c < 0x20) return -1;
    if (c >= 0x80) high = true;
    if (c != '\\') {
      /* copy a run of plain bytes */
      const char *q = p + 1;
      while (q < end && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
      for (const char *x = p; x < q; x++)
        if ((unsigned char)*x >= 0x80) high = true;
      hbuf_append(out, p, (size_t)(q - p));
      p = q - 1;
      continue;
    }
    if (++p >= end) return -1;
    char ch;
    switch (*p) {
      case '"': ch = '"'; break;
      case '\\': ch = '\\'; break;
      case '/': ch = '/'; break;
      case 'b': ch = '\b'; break;
      case 'f': ch = '\f'; break;
      case 'n': ch = '\n'; break;
      case 'r': ch = '\r'; break;
      case 't': ch = '\t'; break;
      case 'u': {
        uint32_t v, lo;
        if (hex4(p + 1, end, &v)) return -1;
        p += 4;
        if (v >= 0xD800 && v <= 0xDBFF) {
          if (end - p < 7 || p[1] != '\\' || p[2] != 'u' || hex4(p + 3, end, &lo) || lo < 0xDC00 || lo > 0xDFFF) return -1;
          v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
          p += 6;
        } else if (v >= 0xDC00 && v <= 0xDFFF) {
          return -1;
        }
        char enc[4];
        int l = utf8_encode(v, enc);
        if (v == 0) enc[0] = 0, l = 1;
        if (!l) return -1;
        hbuf_append(out, enc, (size_t)l);
        continue;
      }
      default: return -1;
    }
    hbuf_putc(out, ch);
  }
  return -1;
}

const char *hf_fast_ws(const char *p, const char *end) { return ws(p, end); }

int hf_fast_int(const char **pp, const char *end, int64_t *v) {
  const char *p = *pp;
  bool neg = false;
  if (p < end && *p == '-') neg = true, p++;
  if (p >= end || *p < '0' || *p > '9') return -1;
  int64_t x = 0;
  int digits = 0;
  while (p < end && *p >= '0' && *p <= '9') {
    x = x * 10 + (*p - '0');
    if (++digits > 15) return -1;
    p++;
  }
  if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) return -1;
  *v = neg ? -x : x;
  *pp = p;
  return 0;
}
