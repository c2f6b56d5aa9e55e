/* utf8.c — UTF-8 decode/encode/validate (see utf8.h). */
#include "base/utf8.h"

int utf8_decode(const char *str, size_t n, uint32_t *cp) {
  const unsigned char *s = (const unsigned char *)str;
  if (n == 0) return 0;
  unsigned c = s[0];
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  int len;
  uint32_t v, min;
  if ((c & 0xE0) == 0xC0) { len = 2; v = c & 0x1F; min = 0x80; }
  else if ((c & 0xF0) == 0xE0) { len = 3; v = c & 0x0F; min = 0x800; }
  else if ((c & 0xF8) == 0xF0) { len = 4; v = c & 0x07; min = 0x10000; }
  else return 0;
  if ((size_t)len > n) return 0;
  for (int i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    v = (v << 6) | (s[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return len;
}

int utf8_encode(uint32_t cp, char *out) {
  unsigned char *o = (unsigned char *)out;
  if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
  if (cp < 0x800) { o[0] = 0xC0 | (cp >> 6); o[1] = 0x80 | (cp & 0x3F); return 2; }
  if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
  if (cp < 0x10000) {
    o[0] = 0xE0 | (cp >> 12); o[1] = 0x80 | ((cp >> 6) & 0x3F); o[2] = 0x80 | (cp & 0x3F);
    return 3;
  }
  if (cp <= 0x10FFFF) {
    o[0] = 0xF0 | (cp >> 18); o[1] = 0x80 | ((cp >> 12) & 0x3F);
    o[2] = 0x80 | ((cp >> 6) & 0x3F); o[3] = 0x80 | (cp & 0x3F);
    return 4;
  }
  return 0;
}

bool utf8_valid(const char *s, size_t n) {
  size_t i = 0;
  uint32_t cp;
  while (i < n) {
    int l = utf8_decode(s + i, n - i, &cp);
    if (!l) return false;
    i += (size_t)l;
  }
  return true;
}

size_t utf8_complete_prefix(const char *str, size_t n) {
  const unsigned char *s = (const unsigned char *)str;
  /* Look back at most 3 bytes for the start of a trailing sequence. */
  size_t i = n;
  int back = 0;
  while (i > 0 && back < 4) {
    unsigned c = s[i - 1];
    if ((c & 0xC0) != 0x80) {
      int need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
      size_t have = n - (i - 1);
      if (have < (size_t)need) return i - 1; /* incomplete: hold it back */
      return n;
    }
    i--;
    back++;
  }
  return n; /* stray continuation bytes: nothing more can complete them */
}
