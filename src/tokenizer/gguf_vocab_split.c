/* gguf_vocab_split.c — the pre-tokenizer of GGUF BPE vocabularies, as
 * llama.cpp runs it (see gguf_vocab_internal.h).
 *
 * Owns: code point classes (from utf8proc's general categories plus the
 * White_Space list), llama.cpp's lenient UTF-8 decoding, and splitting text
 * by an ordered list of regexes. The GPT-2 and Llama-3 patterns run as
 * scanners that follow llama.cpp's hand-written ones step by step; any other
 * pattern runs through PCRE2, rewritten the way llama.cpp rewrites it for
 * std::regex: a pattern using \p{..} classes runs over a "collapsed" copy of
 * the text (one byte per code point: ASCII as is, other code points as one
 * byte per class), a pattern without them over the code points themselves
 * with non-ASCII whitespace turned into \v. Refuses to know which pattern
 * belongs to which model, or anything about tokens.
 */
#include "base/vec.h"
#include "tokenizer/gguf_vocab_internal.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- code points ---- */

static bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

unsigned gv_cpt_flags(uint32_t cp) {
  if (cp >= 0x110000) return 0;
  unsigned f;
  switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: f = GV_LETTER; break;
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: f = GV_MARK; break;
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO: f = GV_NUMBER; break;
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS: case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF: case UTF8PROC_CATEGORY_PO: f = GV_PUNCT; break;
    case UTF8PROC_CATEGORY_SM: case UTF8PROC_CATEGORY_SC: case UTF8PROC_CATEGORY_SK: case UTF8PROC_CATEGORY_SO:
      f = GV_SYMBOL; break;
    case UTF8PROC_CATEGORY_ZS: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: f = GV_SEPARATOR; break;
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
      f = GV_CONTROL; break;
    default: f = GV_UNDEFINED; break;
  }
  if (is_white_space(cp)) f |= GV_WHITESPACE;
  return f;
}

uint32_t gv_tolower(uint32_t cp) {
  if (cp >= 0x110000) return cp;
  return (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
}

uint32_t gv_nfd_first(uint32_t cp) {
  if (cp >= 0x110000 || (cp >= 0xd800 && cp <= 0xdfff)) return cp;
  utf8proc_int32_t buf[32];
  int last = 0;
  utf8proc_ssize_t n = utf8proc_decompose_char((utf8proc_int32_t)cp, buf, 32, UTF8PROC_DECOMPOSE, &last);
  if (n <= 0) return cp;
  return (uint32_t)buf[0];
}

size_t gv_decode_one(const char *s, size_t n, uint32_t *cp) {
  const unsigned char *u = (const unsigned char *)s;
  if (n == 0) return 0;
  unsigned b = u[0];
  if (b < 0x80) {
    *cp = b;
    return 1;
  }
  if (!(b & 0x40)) return 0;
  if (!(b & 0x20)) {
    if (n < 2 || (u[1] & 0xc0) != 0x80) return 0;
    *cp = ((b & 0x1fu) << 6) | (u[1] & 0x3fu);
    return 2;
  }
  if (!(b & 0x10)) {
    if (n < 3 || (u[1] & 0xc0) != 0x80 || (u[2] & 0xc0) != 0x80) return 0;
    *cp = ((b & 0x0fu) << 12) | ((u[1] & 0x3fu) << 6) | (u[2] & 0x3fu);
    return 3;
  }
  if (!(b & 0x08)) {
    if (n < 4 || (u[1] & 0xc0) != 0x80 || (u[2] & 0xc0) != 0x80 || (u[3] & 0xc0) != 0x80) return 0;
    *cp = ((b & 0x07u) << 18) | ((u[1] & 0x3fu) << 12) | ((u[2] & 0x3fu) << 6) | (u[3] & 0x3fu);
    return 4;
  }
  return 0;
}

bool gv_decode(const char *s, size_t n, uint32_t **out, size_t *ncp) {
  uint32_t *cps = malloc((n ? n : 1) * sizeof *cps);
  if (!cps) return false;
  size_t k = 0, i = 0;
  while (i < n) {
    size_t l = gv_decode_one(s + i, n - i, &cps[k]);
    if (!l) {
      cps[k] = 0xfffd;
      l = 1;
    }
    k++;
    i += l;
  }
  *out = cps;
  *ncp = k;
  return true;
}

int gv_encode(uint32_t cp, char *out) {
  unsigned char *o = (unsigned char *)out;
  if (cp > 0x10ffff) cp = 0xfffd;
  if (cp < 0x80) {
    o[0] = (unsigned char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (unsigned char)(0xc0 | (cp >> 6));
    o[1] = (unsigned char)(0x80 | (cp & 0x3f));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (unsigned char)(0xe0 | (cp >> 12));
    o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    o[2] = (unsigned char)(0x80 | (cp & 0x3f));
    return 3;
  }
  o[0] = (unsigned char)(0xf0 | (cp >> 18));
  o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
  o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
  o[3] = (unsigned char)(0x80 | (cp & 0x3f));
  return 4;
}

/* ---- piece lists ---- */

typedef struct lens_vec {
  size_t *v;
  size_t n, cap;
  bool oom;
} lens_vec;

static void lens_push(lens_vec *l, size_t len) {
  if (len == 0 || l->oom) return;
  if (l->n == l->cap && !HGROW(l->v, l->cap, l->n + 1)) {
    l->oom = true;
    return;
  }
  l->v[l->n++] = len;
}

/* ---- the hand-written scanners ---- */

#define OUT_OF_RANGE 0xffffffffu

typedef struct scan {
  const uint32_t *cps;
  size_t ini, end, prev_end;
  lens_vec *out;
} scan;

static uint32_t sc_cpt(const scan *s, size_t pos) { return (pos >= s->ini && pos < s->end) ? s->cps[pos] : OUT_OF_RANGE; }
static unsigned sc_flags(const scan *s, size_t pos) { return (pos >= s->ini && pos < s->end) ? gv_cpt_flags(s->cps[pos]) : 0; }

static size_t sc_add(scan *s, size_t end) {
  size_t len = end - s->prev_end;
  lens_push(s->out, len);
  s->prev_end = end;
  return len;
}

#define F_WS(f) ((f) & GV_WHITESPACE)
#define F_L(f) ((f) & GV_LETTER)
#define F_N(f) ((f) & GV_NUMBER)

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static void scan_gpt2(scan *s) {
  for (size_t pos = s->ini; pos < s->end;) {
    uint32_t cpt = sc_cpt(s, pos);
    unsigned flags = sc_flags(s, pos);
    if (cpt == '\'' && pos + 1 < s->end) {
      uint32_t nx = sc_cpt(s, pos + 1);
      if (nx == 's' || nx == 't' || nx == 'm' || nx == 'd') {
        pos += sc_add(s, pos + 2);
        continue;
      }
      if (pos + 2 < s->end) {
        uint32_t nn = sc_cpt(s, pos + 2);
        if ((nx == 'r' && nn == 'e') || (nx == 'v' && nn == 'e') || (nx == 'l' && nn == 'l')) {
          pos += sc_add(s, pos + 3);
          continue;
        }
      }
    }
    unsigned flags2 = cpt == ' ' ? sc_flags(s, pos + 1) : flags;
    if (F_L(flags2)) {
      pos += (cpt == ' ');
      while (F_L(flags2)) flags2 = sc_flags(s, ++pos);
      sc_add(s, pos);
      continue;
    }
    if (F_N(flags2)) {
      pos += (cpt == ' ');
      while (F_N(flags2)) flags2 = sc_flags(s, ++pos);
      sc_add(s, pos);
      continue;
    }
    if (!(F_WS(flags2) || F_L(flags2) || F_N(flags2)) && flags2) {
      pos += (cpt == ' ');
      while (!(F_WS(flags2) || F_L(flags2) || F_N(flags2)) && flags2) flags2 = sc_flags(s, ++pos);
      sc_add(s, pos);
      continue;
    }
    size_t nws = 0;
    while (F_WS(sc_flags(s, pos + nws))) nws++;
    if (nws > 1 && sc_cpt(s, pos + nws) != OUT_OF_RANGE) {
      pos += nws - 1;
      sc_add(s, pos);
      continue;
    }
    if (nws > 0) {
      pos += nws;
      sc_add(s, pos);
      continue;
    }
    sc_add(s, ++pos);
  }
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static void scan_llama3(scan *s) {
  for (size_t pos = s->ini; pos < s->end;) {
    uint32_t cpt = sc_cpt(s, pos);
    unsigned flags = sc_flags(s, pos);
    if (cpt == '\'' && pos + 1 < s->end) {
      uint32_t nx = gv_tolower(sc_cpt(s, pos + 1));
      if (nx == 's' || nx == 't' || nx == 'm' || nx == 'd') {
        pos += sc_add(s, pos + 2);
        continue;
      }
      if (pos + 2 < s->end) {
        uint32_t nn = gv_tolower(sc_cpt(s, pos + 2));
        if ((nx == 'r' && nn == 'e') || (nx == 'v' && nn == 'e') || (nx == 'l' && nn == 'l')) {
          pos += sc_add(s, pos + 3);
          continue;
        }
      }
    }
    if (!(cpt == '\r' || cpt == '\n' || F_N(flags))) {
      if (F_L(flags) || F_L(sc_flags(s, pos + 1))) {
        pos++;
        while (F_L(sc_flags(s, pos))) pos++;
        sc_add(s, pos);
        continue;
      }
    }
    if (F_N(flags)) {
      size_t ini = pos;
      while (F_N(sc_flags(s, pos))) {
        if (++pos - ini >= 3) {
          sc_add(s, pos);
          ini = pos;
        }
      }
      sc_add(s, pos);
      continue;
    }
    unsigned flags2 = cpt == ' ' ? sc_flags(s, pos + 1) : flags;
    if (!(F_WS(flags2) || F_L(flags2) || F_N(flags2)) && flags) {
      pos += (cpt == ' ');
      while (!(F_WS(flags2) || F_L(flags2) || F_N(flags2)) && flags2) flags2 = sc_flags(s, ++pos);
      uint32_t c2 = sc_cpt(s, pos);
      while (c2 == '\r' || c2 == '\n') c2 = sc_cpt(s, ++pos);
      sc_add(s, pos);
      continue;
    }
    size_t nws = 0, last_rn = 0;
    while (F_WS(sc_flags(s, pos + nws))) {
      uint32_t c2 = sc_cpt(s, pos + nws);
      if (c2 == '\r' || c2 == '\n') last_rn = pos + nws + 1;
      nws++;
    }
    if (last_rn > 0) {
      pos = last_rn;
      sc_add(s, pos);
      continue;
    }
    if (nws > 1 && sc_cpt(s, pos + nws) != OUT_OF_RANGE) {
      pos += nws - 1;
      sc_add(s, pos);
      continue;
    }
    if (nws > 0) {
      pos += nws;
      sc_add(s, pos);
      continue;
    }
    sc_add(s, ++pos);
  }
}

/* ---- regexes through PCRE2 ---- */

enum { RX_GPT2, RX_LLAMA3, RX_COLLAPSED, RX_CODEPOINTS };

typedef struct gv_regex {
  int kind;
  pcre2_code *code; /* owned; NULL for the scanners */
} gv_regex;

struct gv_splitter {
  gv_regex *rx; /* owned */
  size_t n;
};

static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
static const char LLAMA3_PATTERN_A[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char LLAMA3_PATTERN_B[] =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const struct {
  const char *pat;
  unsigned flag;
} class_names[] = {
  {"\\p{N}", GV_NUMBER}, {"\\p{L}", GV_LETTER}, {"\\p{P}", GV_PUNCT}, {"\\p{M}", GV_MARK}, {"\\p{S}", GV_SYMBOL},
  {"\\p{Lu}", GV_LETTER}, {"\\p{Ll}", GV_LETTER}, {"\\p{Lt}", GV_LETTER}, {"\\p{Lm}", GV_LETTER}, {"\\p{Lo}", GV_LETTER},
};

/* The one byte that stands for a class in the collapsed text, and the ASCII members of the class. */
static unsigned char class_byte(unsigned flag) {
  switch (flag) {
    case GV_NUMBER: return 0xd1;
    case GV_LETTER: return 0xd2;
    case GV_PUNCT: return 0xd3;
    case GV_MARK: return 0xd4;
    case GV_SYMBOL: return 0xd5;
    default: return 0xd0;
  }
}

static const char *class_ascii(unsigned flag) {
  switch (flag) {
    case GV_NUMBER: return "0-9";
    case GV_LETTER: return "A-Za-z";
    case GV_PUNCT: return "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}";
    case GV_SYMBOL: return "\\$\\+<->^`\\|";
    default: return "";
  }
}

static bool uses_classes(const char *re) {
  for (size_t k = 0; k < sizeof class_names / sizeof class_names[0]; k++)
    if (strstr(re, class_names[k].pat)) return true;
  return false;
}

/* Rewrites \p{..} into the collapsed-text byte plus its ASCII members, as llama.cpp does. *out malloc'd. */
static char *collapse_regex(const char *re) {
  size_t n = strlen(re);
  char *out = malloc(n * 24 + 1);
  if (!out) return NULL;
  size_t k = 0;
  bool inside = false;
  for (size_t i = 0; i < n; i++) {
    if (re[i] == '[' && (i == 0 || re[i - 1] != '\\')) {
      out[k++] = '[';
      inside = true;
      continue;
    }
    if (inside && re[i] == ']' && re[i - 1] != '\\') {
      out[k++] = ']';
      inside = false;
      continue;
    }
    if (re[i] == '\\' && i + 3 < n && re[i + 1] == 'p' && re[i + 2] == '{') {
      const char *close = strchr(re + i + 3, '}');
      if (close && (size_t)(close - re) <= i + 10) {
        size_t plen = (size_t)(close - re) - i + 1;
        unsigned flag = 0;
        for (size_t c = 0; c < sizeof class_names / sizeof class_names[0]; c++)
          if (strlen(class_names[c].pat) == plen && memcmp(class_names[c].pat, re + i, plen) == 0) flag = class_names[c].flag;
        if (flag) {
          if (!inside) out[k++] = '[';
          out[k++] = (char)class_byte(flag);
          const char *a = class_ascii(flag);
          size_t al = strlen(a);
          memcpy(out + k, a, al);
          k += al;
          if (!inside) out[k++] = ']';
          i = (size_t)(close - re);
          continue;
        }
      }
    }
    out[k++] = re[i];
  }
  out[k] = 0;
  return out;
}

static int compile_rx(const char *pattern, uint32_t opts, pcre2_code **out, herr *err) {
  int ecode;
  PCRE2_SIZE eoff;
  pcre2_code *c = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts | PCRE2_DOLLAR_ENDONLY, &ecode, &eoff, NULL);
  if (!c) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(ecode, msg, sizeof msg);
    return herr_set(err, HEARTH_EINTERNAL, "pre-tokenizer regex '%s': %s at offset %zu", pattern, (const char *)msg, (size_t)eoff);
  }
  pcre2_jit_compile(c, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
  *out = c;
  return 0;
}

int gv_splitter_new(const char *const *regexes, size_t n, gv_splitter **out, herr *err) {
  *out = NULL;
  gv_splitter *s = calloc(1, sizeof *s);
  if (!s || !(s->rx = calloc(n ? n : 1, sizeof *s->rx))) {
    free(s);
    return herr_set(err, HEARTH_ENOMEM, "pre-tokenizer: out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    const char *re = regexes[i];
    gv_regex *r = &s->rx[i];
    s->n = i + 1;
    if (strcmp(re, GPT2_PATTERN) == 0) {
      r->kind = RX_GPT2;
    } else if (strcmp(re, LLAMA3_PATTERN_A) == 0 || strcmp(re, LLAMA3_PATTERN_B) == 0) {
      r->kind = RX_LLAMA3;
    } else if (uses_classes(re)) {
      r->kind = RX_COLLAPSED;
      char *c = collapse_regex(re);
      if (!c) {
        gv_splitter_free(s);
        return herr_set(err, HEARTH_ENOMEM, "pre-tokenizer: out of memory");
      }
      int rc = compile_rx(c, 0, &r->code, err);
      free(c);
      if (rc) {
        gv_splitter_free(s);
        return rc;
      }
    } else {
      r->kind = RX_CODEPOINTS;
      int rc = compile_rx(re, PCRE2_UTF, &r->code, err);
      if (rc) {
        gv_splitter_free(s);
        return rc;
      }
    }
  }
  *out = s;
  return 0;
}

void gv_splitter_free(gv_splitter *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n; i++) pcre2_code_free(s->rx[i].code);
  free(s->rx);
  free(s);
}

/* The subject a PCRE2 pattern runs over, with a map from its bytes back to code point positions. */
typedef struct subject {
  unsigned char *bytes; /* owned */
  size_t nbytes;
  size_t *cp_at;        /* owned, nbytes + 1: code point index of each byte (collapsed: identity) */
  size_t *byte_of;      /* owned, ncp + 1: byte offset of each code point */
} subject;

static void subject_free(subject *s) {
  free(s->bytes);
  free(s->cp_at);
  free(s->byte_of);
  memset(s, 0, sizeof *s);
}

static bool subject_collapsed(subject *s, const uint32_t *cps, size_t n) {
  s->bytes = malloc(n + 1);
  s->byte_of = malloc((n + 1) * sizeof *s->byte_of);
  s->cp_at = malloc((n + 1) * sizeof *s->cp_at);
  if (!s->bytes || !s->byte_of || !s->cp_at) return false;
  for (size_t i = 0; i < n; i++) {
    uint32_t cp = cps[i];
    unsigned char b;
    if (cp < 128) {
      b = (unsigned char)cp;
    } else {
      unsigned f = gv_cpt_flags(cp);
      if (f & GV_WHITESPACE) b = 0x0b;
      else b = class_byte(f & GV_CATEGORY_MASK);
    }
    s->bytes[i] = b;
    s->byte_of[i] = i;
    s->cp_at[i] = i;
  }
  s->byte_of[n] = n;
  s->cp_at[n] = n;
  s->nbytes = n;
  return true;
}

static bool subject_codepoints(subject *s, const uint32_t *cps, size_t n) {
  s->bytes = malloc(n * 4 + 1);
  s->byte_of = malloc((n + 1) * sizeof *s->byte_of);
  s->cp_at = malloc((n * 4 + 1) * sizeof *s->cp_at);
  if (!s->bytes || !s->byte_of || !s->cp_at) return false;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t cp = cps[i];
    if (cp > 0x7f && (gv_cpt_flags(cp) & GV_WHITESPACE)) cp = 0x0b;
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) cp = 0xfffd; /* keep the subject valid UTF-8 */
    s->byte_of[i] = k;
    int l = gv_encode(cp, (char *)s->bytes + k);
    for (int j = 0; j < l; j++) s->cp_at[k + j] = i;
    k += (size_t)l;
  }
  s->byte_of[n] = k;
  s->cp_at[k] = n;
  s->nbytes = k;
  return true;
}

/* Splits every current piece by one PCRE2 pattern: matches and the gaps between them become pieces. */
static int split_pcre(const gv_regex *r, const subject *sub, const size_t *in, size_t nin, lens_vec *out, herr *err) {
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(r->code, NULL);
  if (!md) return herr_set(err, HEARTH_ENOMEM, "pre-tokenizer: out of memory");
  bool utf = r->kind == RX_CODEPOINTS;
  size_t start_cp = 0;
  for (size_t p = 0; p < nin; p++) {
    size_t b0 = sub->byte_of[start_cp], b1 = sub->byte_of[start_cp + in[p]];
    PCRE2_SPTR subj = sub->bytes + b0;
    size_t len = b1 - b0;
    size_t at = 0, done = 0; /* byte offsets within the piece */
    uint32_t opts = 0;
    while (at <= len) {
      int rc = pcre2_match(r->code, subj, len, at, opts | (utf ? PCRE2_NO_UTF_CHECK : 0), md, NULL);
      if (rc == PCRE2_ERROR_NOMATCH) {
        if (!opts) break;
        /* an empty match was refused here: move one character on */
        opts = 0;
        at++;
        while (utf && at < len && (subj[at] & 0xc0) == 0x80) at++;
        continue;
      }
      if (rc < 0) {
        pcre2_match_data_free(md);
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return herr_set(err, HEARTH_ELIMIT, "pre-tokenizer: regex match failed: %s", (const char *)msg);
      }
      PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
      size_t ms = ov[0], me = ov[1];
      if (ms > done) lens_push(out, sub->cp_at[b0 + ms] - sub->cp_at[b0 + done]);
      lens_push(out, sub->cp_at[b0 + me] - sub->cp_at[b0 + ms]);
      done = me;
      at = me;
      opts = (me == ms) ? (PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED) : 0;
    }
    if (done < len) lens_push(out, sub->cp_at[b0 + len] - sub->cp_at[b0 + done]);
    start_cp += in[p];
  }
  pcre2_match_data_free(md);
  return 0;
}

int gv_split(const gv_splitter *s, const uint32_t *cps, size_t n, size_t **lens, size_t *nlens, herr *err) {
  *lens = NULL;
  *nlens = 0;
  lens_vec cur = {0};
  lens_push(&cur, n);
  subject collapsed = {0}, points = {0};
  int rc = 0;
  for (size_t i = 0; i < s->n && !rc && !cur.oom; i++) {
    const gv_regex *r = &s->rx[i];
    lens_vec next = {0};
    if (r->kind == RX_GPT2 || r->kind == RX_LLAMA3) {
      size_t start = 0;
      for (size_t p = 0; p < cur.n; p++) {
        scan sc = {cps, start, start + cur.v[p], start, &next};
        if (r->kind == RX_GPT2) scan_gpt2(&sc);
        else scan_llama3(&sc);
        start += cur.v[p];
      }
    } else {
      subject *sub = r->kind == RX_COLLAPSED ? &collapsed : &points;
      if (!sub->bytes) {
        bool ok = r->kind == RX_COLLAPSED ? subject_collapsed(sub, cps, n) : subject_codepoints(sub, cps, n);
        if (!ok) next.oom = true;
      }
      if (!next.oom) rc = split_pcre(r, sub, cur.v, cur.n, &next, err);
    }
    free(cur.v);
    cur = next;
  }
  subject_free(&collapsed);
  subject_free(&points);
  if (!rc && cur.oom) rc = herr_set(err, HEARTH_ENOMEM, "pre-tokenizer: out of memory");
  if (rc) {
    free(cur.v);
    return rc;
  }
  *lens = cur.v;
  *nlens = cur.n;
  return 0;
}
