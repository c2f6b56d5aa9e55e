/* hf_unicode.c — the Unicode facts the tokenizer.json pipeline needs, with the
 * exact meanings HF tokenizers gives them (Rust's char predicates, Rust's
 * to_lowercase, from_utf8_lossy), the byte-level alphabet, and two small
 * containers (a u64 map, split lists). Knows nothing of tokenizer.json. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/hash.h"
#include "base/utf8.h"
#include "base/vec.h"
#include "tokenizer/hf_internal.h"

bool hfu_is_whitespace(uint32_t c) {
  if (c >= 9 && c <= 13) return true;
  switch (c) {
    case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

static int category(uint32_t c) { return c > 0x10FFFF ? UTF8PROC_CATEGORY_CN : utf8proc_category((utf8proc_int32_t)c); }

bool hfu_is_punctuation(uint32_t c) {
  if (c < 128) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  int k = category(c);
  return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

bool hfu_is_numeric(uint32_t c) {
  if (c < 128) return c >= '0' && c <= '9';
  int k = category(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

bool hfu_is_word_char(uint32_t c) {
  if (c < 128) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  if (c == 0x200C || c == 0x200D) return true;
  int k = category(c);
  return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || k == UTF8PROC_CATEGORY_MN ||
         k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME || k == UTF8PROC_CATEGORY_ND ||
         k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC;
}

bool hfu_is_control(uint32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  int k = category(c);
  /* Cn is left out: code points the Unicode tables here call unassigned may be
   * assigned in the newer tables HF uses (U+1F6FF), and are kept there. */
  return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CO ||
         k == UTF8PROC_CATEGORY_CS;
}

bool hfu_is_mark_nonspacing(uint32_t c) { return c >= 0x300 && category(c) == UTF8PROC_CATEGORY_MN; }

bool hfu_is_combining_mark(uint32_t c) {
  if (c < 0x300) return false;
  int k = category(c);
  return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME;
}

bool hfu_is_chinese(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static bool is_cased(uint32_t c) {
  int k = category(c);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

static bool is_case_ignorable(uint32_t c) {
  switch (c) {
    case 0x27: case 0x2E: case 0x3A: case 0x5E: case 0x60: case 0xA8: case 0xAD: case 0xAF: case 0xB4: case 0xB7:
    case 0xB8: case 0x2018: case 0x2019: case 0x2024: case 0xFE13: case 0xFE52: case 0xFE55: case 0xFF07:
    case 0xFF0E: case 0xFF1A:
      return true;
    default: break;
  }
  int k = category(c);
  return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_ME || k == UTF8PROC_CATEGORY_CF ||
         k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_SK;
}

/* Decodes the code point ending at s[end) (valid UTF-8 assumed); returns its start. */
static size_t prev_cp(const char *s, size_t end, uint32_t *cp) {
  size_t i = end - 1;
  while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
  if (!utf8_decode(s + i, end - i, cp)) *cp = (unsigned char)s[end - 1];
  return i;
}

static bool sigma_is_final(const char *s, size_t n, size_t at, size_t after) {
  uint32_t c;
  bool before_cased = false;
  for (size_t i = at; i > 0;) {
    i = prev_cp(s, i, &c);
    if (is_case_ignorable(c)) continue;
    before_cased = is_cased(c);
    break;
  }
  if (!before_cased) return false;
  for (size_t i = after; i < n;) {
    int l = utf8_decode(s + i, n - i, &c);
    if (!l) break;
    i += (size_t)l;
    if (is_case_ignorable(c)) continue;
    return !is_cased(c);
  }
  return true;
}

void hfu_lowercase(const char *s, size_t n, hbuf *out) {
  hbuf_reserve(out, n);
  for (size_t i = 0; i < n;) {
    unsigned char b = (unsigned char)s[i];
    if (b < 0x80) {
      hbuf_putc(out, (char)(b >= 'A' && b <= 'Z' ? b + 32 : b));
      i++;
      continue;
    }
    uint32_t c;
    int l = utf8_decode(s + i, n - i, &c);
    if (!l) { /* not UTF-8: copy the byte */
      hbuf_putc(out, (char)b);
      i++;
      continue;
    }
    char enc[4];
    if (c == 0x130) {
      hbuf_append(out, "i\xCC\x87", 3);
    } else if (c == 0x3A3) {
      hbuf_append(out, sigma_is_final(s, n, i, i + (size_t)l) ? "\xCF\x82" : "\xCF\x83", 2);
    } else {
      uint32_t lc = (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
      int el = utf8_encode(lc, enc);
      hbuf_append(out, enc, (size_t)el);
    }
    i += (size_t)l;
  }
}

int hfu_normalize_form(const char *s, size_t n, char form, hbuf *out) {
  bool ascii = true;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] >= 0x80) {
      ascii = false;
      break;
    }
  if (ascii) { /* ASCII is invariant under every normalization form */
    hbuf_append(out, s, n);
    return 0;
  }
  int opt = UTF8PROC_STABLE;
  if (form == 'C') opt |= UTF8PROC_COMPOSE;
  else if (form == 'D') opt |= UTF8PROC_DECOMPOSE;
  else if (form == 'K') opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
  else opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
  utf8proc_uint8_t *dst = NULL;
  utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, (utf8proc_option_t)opt);
  if (r < 0) {
    free(dst);
    return HEARTH_EINVAL;
  }
  hbuf_append(out, dst, (size_t)r);
  free(dst);
  return 0;
}

void hfu_append_lossy(hbuf *out, const unsigned char *b, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = b[i];
    if (c < 0x80) {
      size_t j = i + 1;
      while (j < n && b[j] < 0x80) j++;
      hbuf_append(out, b + i, j - i);
      i = j;
      continue;
    }
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) { need = 2; lo = 0xA0; }
    else if (c == 0xED) { need = 2; hi = 0x9F; }
    else if (c >= 0xE1 && c <= 0xEF) need = 2;
    else if (c == 0xF0) { need = 3; lo = 0x90; }
    else if (c == 0xF4) { need = 3; hi = 0x8F; }
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else { /* never a valid lead byte */
      hbuf_append(out, "\xEF\xBF\xBD", 3);
      i++;
      continue;
    }
    size_t j = i + 1;
    int got = 0;
    while (got < need && j < n) {
      unsigned d = b[j];
      unsigned l = got == 0 ? lo : 0x80, h = got == 0 ? hi : 0xBF;
      if (d < l || d > h) break;
      j++;
      got++;
    }
    if (got == need) hbuf_append(out, b + i, j - i);
    else hbuf_append(out, "\xEF\xBF\xBD", 3);
    i = j;
  }
}

/* ---- byte-level alphabet ---- */
static char byte_utf8[256][3];
static int byte_utf8_len[256];
static int16_t char_to_byte[324];
static pthread_once_t byte_once = PTHREAD_ONCE_INIT;

static void byte_init(void) {
  int n = 0;
  for (int i = 0; i < 324; i++) char_to_byte[i] = -1;
  for (int b = 0; b < 256; b++) {
    uint32_t cp;
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) cp = (uint32_t)b;
    else cp = 256 + (uint32_t)n++;
    byte_utf8_len[b] = utf8_encode(cp, byte_utf8[b]);
    char_to_byte[cp] = (int16_t)b;
  }
}

const char *hfu_byte_char(unsigned b, int *len) {
  pthread_once(&byte_once, byte_init);
  *len = byte_utf8_len[b & 255];
  return byte_utf8[b & 255];
}

int hfu_char_byte(uint32_t c) {
  pthread_once(&byte_once, byte_init);
  return c < 324 ? char_to_byte[c] : -1;
}

/* ---- u64 map ---- */

static bool u64map_grow(hf_u64map *m) {
  size_t ncap = m->cap ? m->cap * 2 : 256;
  uint64_t *nk = calloc(ncap, sizeof *nk), *nv = malloc(ncap * sizeof *nv);
  if (!nk || !nv) {
    free(nk);
    free(nv);
    return false;
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->keys[i]) continue;
    size_t j = hmix64(m->keys[i]) & (ncap - 1);
    while (nk[j]) j = (j + 1) & (ncap - 1);
    nk[j] = m->keys[i];
    nv[j] = m->vals[i];
  }
  free(m->keys);
  free(m->vals);
  m->keys = nk;
  m->vals = nv;
  m->cap = ncap;
  return true;
}

bool hf_u64map_put(hf_u64map *m, uint64_t key, uint64_t val) {
  if ((m->count + 1) * 2 > m->cap && !u64map_grow(m)) return false;
  uint64_t k = key + 1;
  size_t j = hmix64(k) & (m->cap - 1);
  while (m->keys[j] && m->keys[j] != k) j = (j + 1) & (m->cap - 1);
  if (!m->keys[j]) {
    m->keys[j] = k;
    m->count++;
  }
  m->vals[j] = val;
  return true;
}

bool hf_u64map_get(const hf_u64map *m, uint64_t key, uint64_t *val) {
  if (!m->cap) return false;
  uint64_t k = key + 1;
  size_t j = hmix64(k) & (m->cap - 1);
  while (m->keys[j]) {
    if (m->keys[j] == k) {
      *val = m->vals[j];
      return true;
    }
    j = (j + 1) & (m->cap - 1);
  }
  return false;
}

void hf_u64map_free(hf_u64map *m) {
  free(m->keys);
  free(m->vals);
  memset(m, 0, sizeof *m);
}

/* ---- split lists ---- */
bool hf_splits_push(hf_splits *s, const char *p, size_t len, int32_t id, bool at_start) {
  if (s->n == s->cap && !HGROW(s->v, s->cap, s->n + 1)) return false;
  size_t off = s->text.len;
  hbuf_append(&s->text, p, len);
  if (s->text.oom) return false;
  s->v[s->n++] = (hf_split){off, len, id, at_start};
  return true;
}

void hf_splits_clear(hf_splits *s) {
  hbuf_clear(&s->text);
  s->n = 0;
}

void hf_splits_free(hf_splits *s) {
  hbuf_free(&s->text);
  free(s->v);
  memset(s, 0, sizeof *s);
}

/* ---- regex through PCRE2 (UTF + Unicode properties, JIT when available) ---- */
/* HF's regexes are Oniguruma's, where \w is Unicode "word" (alphabetic, marks,
 * decimal digits, connector punctuation, joiners); PCRE2's UCP \w also takes
 * every other number (No: "½", "²"). Rewrites \w (and \W outside a class)
 * to the Oniguruma set; other escapes pass through. */
#define ONIG_WORD "\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}"
static void rewrite_word_class(const char *p, size_t n, hbuf *out) {
  bool in_class = false;
  for (size_t i = 0; i < n; i++) {
    char c = p[i];
    if (c == '\\' && i + 1 < n) {
      char d = p[i + 1];
      if (d == 'w') hbuf_puts(out, in_class ? ONIG_WORD : "[" ONIG_WORD "]");
      else if (d == 'W' && !in_class) hbuf_puts(out, "[^" ONIG_WORD "]");
      else hbuf_append(out, p + i, 2);
      i++;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      hbuf_putc(out, c);
      if (i + 1 < n && p[i + 1] == '^') hbuf_putc(out, p[++i]);
      if (i + 1 < n && p[i + 1] == ']') hbuf_putc(out, p[++i]); /* a leading ']' is literal */
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    hbuf_putc(out, c);
  }
}

int hf_regex_compile(hf_regex *r, const char *pattern, size_t len, bool literal, const char *what, herr *err) {
  int ec;
  PCRE2_SIZE eo;
  uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  hbuf rw = {0};
  const char *orig = pattern;
  size_t orig_len = len;
  if (!literal && (memmem(pattern, len, "\\w", 2) || memmem(pattern, len, "\\W", 2))) {
    rewrite_word_class(pattern, len, &rw);
    if (!rw.oom) pattern = hbuf_str(&rw), len = rw.len;
  }
  r->code = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &ec, &eo, NULL);
  hbuf_free(&rw);
  pattern = orig;
  len = orig_len;
  if (!r->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(ec, msg, sizeof msg);
    return herr_set(err, HEARTH_EFORMAT, "%s: pattern '%.*s' does not compile at offset %zu: %s", what,
                    (int)(len > 200 ? 200 : len), pattern, (size_t)eo, (const char *)msg);
  }
  pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE); /* best effort */
  return 0;
}

void hf_regex_free(hf_regex *r) {
  if (r->code) pcre2_code_free(r->code);
  r->code = NULL;
}

bool hf_regex_next(const hf_regex *r, pcre2_match_data *md, const char *s, size_t n, size_t start, size_t *mstart,
                   size_t *mend) {
  if (start > n) return false;
  int rc = pcre2_match(r->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, md, NULL);
  if (rc < 0) return false;
  PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
  *mstart = ov[0];
  *mend = ov[1];
  return true;
}
