/* hf_normalize.c — tokenizer.json normalizers: NFC/NFD/NFKC/NFKD, Lowercase,
 * Replace (string or regex), Prepend, Strip, StripAccents, BertNormalizer,
 * Precompiled (a SentencePiece charsmap: a double-array trie replayed over
 * grapheme clusters, then characters, as HF's spm_precompiled does) and
 * Sequence, behaving as HF tokenizers does. A normalizer maps a string to a
 * string; offsets are not tracked (nothing here needs them). Knows nothing of
 * models or decoding. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/utf8.h"
#include "tokenizer/hf_internal.h"

enum {
  NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWERCASE, NORM_REPLACE, NORM_PREPEND, NORM_STRIP,
  NORM_STRIP_ACCENTS, NORM_BERT, NORM_PRECOMPILED, NORM_SEQUENCE
};

struct hf_normalizer {
  int kind;
  hf_regex re;              /* Replace */
  char *content;            /* Replace: replacement; Prepend: prefix (owned) */
  size_t content_len;
  bool left, right;         /* Strip */
  bool clean_text, chinese, strip_accents, lowercase; /* BertNormalizer */
  uint32_t *units;          /* Precompiled: double-array trie (owned) */
  size_t nunits;
  char *norm_blob;          /* Precompiled: NUL-separated replacements (owned) */
  size_t norm_len;
  hf_normalizer **items;    /* Sequence (owned) */
  size_t nitems;
};

int hf_json_pattern(const json_t *obj, const char *key, const char **pat, size_t *len, bool *literal, const char *what,
                    herr *err) {
  const json_t *p = json_object_get(obj, key);
  if (!p) return herr_set(err, HEARTH_EFORMAT, "%s: missing field '%s'", what, key);
  const json_t *s;
  if (json_is_string(p)) { /* a bare string is taken literally */
    *literal = true;
    s = p;
  } else if (json_is_object(p) && (s = json_object_get(p, "String")) && json_is_string(s)) {
    *literal = true;
  } else if (json_is_object(p) && (s = json_object_get(p, "Regex")) && json_is_string(s)) {
    *literal = false;
  } else {
    return herr_set(err, HEARTH_EFORMAT, "%s: field '%s' must be {\"String\": ...} or {\"Regex\": ...}", what, key);
  }
  *pat = json_string_value(s);
  *len = json_string_length(s);
  return 0;
}

static bool get_bool(const json_t *j, const char *key, bool dflt) {
  const json_t *v = json_object_get(j, key);
  return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* ---- Precompiled: the SentencePiece charsmap ---- */
static int b64val(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

/* Decodes base64 (padding optional); NULL when malformed. *n is the byte count. */
static unsigned char *b64decode(const char *s, size_t len, size_t *n) {
  unsigned char *out = malloc(len / 4 * 3 + 4);
  if (!out) return NULL;
  uint32_t acc = 0;
  int bits = 0;
  size_t k = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] == '=') break;
    int v = b64val((unsigned char)s[i]);
    if (v < 0) {
      free(out);
      return NULL;
    }
    acc = acc << 6 | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[k++] = (unsigned char)(acc >> bits);
    }
  }
  *n = k;
  return out;
}

static int parse_precompiled(hf_normalizer *n, const json_t *j, const char *what, herr *err) {
  const json_t *m = json_object_get(j, "precompiled_charsmap");
  if (!m || json_is_null(m) || (json_is_string(m) && json_string_length(m) == 0)) return 0; /* identity */
  if (!json_is_string(m)) return herr_set(err, HEARTH_EFORMAT, "%s: Precompiled normalizer needs a base64 string 'precompiled_charsmap'", what);
  size_t len;
  unsigned char *b = b64decode(json_string_value(m), json_string_length(m), &len);
  if (!b) return herr_set(err, HEARTH_EFORMAT, "%s: precompiled_charsmap is not valid base64", what);
  int rc = 0;
  uint32_t trie_size = len >= 4 ? (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24 : 0;
  if (len < 4 || trie_size % 4 || trie_size > len - 4) {
    rc = herr_set(err, HEARTH_EFORMAT, "%s: precompiled_charsmap's trie size %u does not fit its %zu bytes", what, trie_size, len);
  } else {
    n->nunits = trie_size / 4;
    n->units = malloc((n->nunits + 1) * sizeof *n->units);
    n->norm_len = len - 4 - trie_size;
    n->norm_blob = malloc(n->norm_len + 1);
    if (!n->units || !n->norm_blob) rc = herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
    for (size_t i = 0; !rc && i < n->nunits; i++) {
      const unsigned char *u = b + 4 + 4 * i;
      n->units[i] = (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24;
    }
    if (!rc) {
      memcpy(n->norm_blob, b + 4 + trie_size, n->norm_len);
      n->norm_blob[n->norm_len] = 0;
      if (!utf8_valid(n->norm_blob, n->norm_len))
        rc = herr_set(err, HEARTH_EFORMAT, "%s: precompiled_charsmap's replacement strings are not UTF-8", what);
    }
  }
  free(b);
  return rc;
}

/* The replacement for the first (shortest) key of the trie that is a prefix
 * of s[0..len), as spm_precompiled's transform; NULL when none. */
static const char *charsmap_lookup(const hf_normalizer *n, const char *s, size_t len, size_t *out_len) {
  if (!n->nunits) return NULL;
  size_t pos = 0;
  uint32_t unit = n->units[0];
#define DA_OFFSET(u) (((u) >> 10) << (((u) & (1u << 9)) >> 6))
  pos ^= DA_OFFSET(unit);
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == 0) return NULL;
    pos ^= c;
    if (pos >= n->nunits) return NULL;
    unit = n->units[pos];
    if ((unit & ((1u << 31) | 0xFF)) != c) return NULL;
    pos ^= DA_OFFSET(unit);
    if ((unit >> 8) & 1) {
      if (pos >= n->nunits) return NULL;
      size_t at = n->units[pos] & ((1u << 31) - 1);
      if (at > n->norm_len) return NULL;
      const char *r = n->norm_blob + at;
      *out_len = strlen(r);
      return r;
    }
  }
#undef DA_OFFSET
  return NULL;
}

static void precompiled_normalize(const hf_normalizer *n, const char *s, size_t len, hbuf *out) {
  size_t i = 0;
  while (i < len) {
    /* one extended grapheme cluster: [i, end) */
    uint32_t c;
    int l = utf8_decode(s + i, len - i, &c);
    if (!l) l = 1, c = 0xFFFD;
    size_t end = i + (size_t)l;
    utf8proc_int32_t state = 0;
    uint32_t prev = c;
    while (end < len) {
      uint32_t d;
      int dl = utf8_decode(s + end, len - end, &d);
      if (!dl || utf8proc_grapheme_break_stateful((utf8proc_int32_t)prev, (utf8proc_int32_t)d, &state)) break;
      prev = d;
      end += (size_t)dl;
    }
    size_t rl;
    const char *r = end - i < 6 ? charsmap_lookup(n, s + i, end - i, &rl) : NULL;
    if (r) {
      hbuf_append(out, r, rl);
    } else {
      for (size_t k = i; k < end;) {
        int cl = utf8_decode(s + k, end - k, &c);
        if (!cl) cl = 1;
        r = charsmap_lookup(n, s + k, (size_t)cl, &rl);
        if (r) hbuf_append(out, r, rl);
        else hbuf_append(out, s + k, (size_t)cl);
        k += (size_t)cl;
      }
    }
    i = end;
  }
}

int hf_normalizer_parse(const json_t *j, hf_normalizer **out, const char *what, herr *err) {
  *out = NULL;
  if (!j || json_is_null(j)) return 0;
  if (!json_is_object(j)) return herr_set(err, HEARTH_EFORMAT, "%s: normalizer must be an object", what);
  const char *type = json_string_value(json_object_get(j, "type"));
  if (!type) return herr_set(err, HEARTH_EFORMAT, "%s: normalizer has no 'type'", what);
  hf_normalizer *n = calloc(1, sizeof *n);
  if (!n) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  int rc = 0;
  if (!strcmp(type, "NFC")) n->kind = NORM_NFC;
  else if (!strcmp(type, "NFD")) n->kind = NORM_NFD;
  else if (!strcmp(type, "NFKC")) n->kind = NORM_NFKC;
  else if (!strcmp(type, "Precompiled")) n->kind = NORM_PRECOMPILED, rc = parse_precompiled(n, j, what, err);
  else if (!strcmp(type, "NFKD")) n->kind = NORM_NFKD;
  else if (!strcmp(type, "Lowercase")) n->kind = NORM_LOWERCASE;
  else if (!strcmp(type, "StripAccents")) n->kind = NORM_STRIP_ACCENTS;
  else if (!strcmp(type, "Strip")) {
    n->kind = NORM_STRIP;
    n->left = get_bool(j, "strip_left", true);
    n->right = get_bool(j, "strip_right", true);
  } else if (!strcmp(type, "Prepend")) {
    n->kind = NORM_PREPEND;
    const json_t *p = json_object_get(j, "prepend");
    if (!json_is_string(p)) rc = herr_set(err, HEARTH_EFORMAT, "%s: Prepend normalizer needs a string 'prepend'", what);
    else {
      n->content_len = json_string_length(p);
      n->content = malloc(n->content_len + 1);
      if (n->content) memcpy(n->content, json_string_value(p), n->content_len + 1);
    }
  } else if (!strcmp(type, "Replace")) {
    n->kind = NORM_REPLACE;
    const char *pat;
    size_t plen;
    bool lit;
    const json_t *c = json_object_get(j, "content");
    if (!(rc = hf_json_pattern(j, "pattern", &pat, &plen, &lit, what, err))) {
      if (!json_is_string(c)) rc = herr_set(err, HEARTH_EFORMAT, "%s: Replace normalizer needs a string 'content'", what);
      else if (!(rc = hf_regex_compile(&n->re, pat, plen, lit, what, err))) {
        n->content_len = json_string_length(c);
        n->content = malloc(n->content_len + 1);
        if (n->content) memcpy(n->content, json_string_value(c), n->content_len + 1);
      }
    }
  } else if (!strcmp(type, "BertNormalizer")) {
    n->kind = NORM_BERT;
    n->clean_text = get_bool(j, "clean_text", true);
    n->chinese = get_bool(j, "handle_chinese_chars", true);
    n->lowercase = get_bool(j, "lowercase", true);
    n->strip_accents = get_bool(j, "strip_accents", n->lowercase);
  } else if (!strcmp(type, "Sequence")) {
    n->kind = NORM_SEQUENCE;
    const json_t *items = json_object_get(j, "normalizers");
    if (!json_is_array(items)) rc = herr_set(err, HEARTH_EFORMAT, "%s: Sequence normalizer needs an array 'normalizers'", what);
    else {
      n->items = calloc(json_array_size(items) + 1, sizeof *n->items);
      for (size_t i = 0; !rc && i < json_array_size(items); i++) {
        rc = hf_normalizer_parse(json_array_get(items, i), &n->items[n->nitems], what, err);
        if (!rc && n->items[n->nitems]) n->nitems++;
      }
    }
  } else {
    rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: unsupported normalizer type '%s'", what, type);
  }
  if (rc) {
    hf_normalizer_free(n);
    return rc;
  }
  *out = n;
  return 0;
}

void hf_normalizer_free(hf_normalizer *n) {
  if (!n) return;
  for (size_t i = 0; i < n->nitems; i++) hf_normalizer_free(n->items[i]);
  free(n->items);
  hf_regex_free(&n->re);
  free(n->content);
  free(n->units);
  free(n->norm_blob);
  free(n);
}

static void replace_all(const hf_normalizer *n, const char *s, size_t len, hbuf *out) {
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(n->re.code, NULL);
  size_t pos = 0, ms, me, from = 0;
  while (md && from <= len && hf_regex_next(&n->re, md, s, len, from, &ms, &me)) {
    if (me == ms) { /* an empty match replaces nothing here; step one character */
      if (ms >= len) break;
      int l = utf8_decode(s + ms, len - ms, &(uint32_t){0});
      from = ms + (l ? (size_t)l : 1);
      continue;
    }
    hbuf_append(out, s + pos, ms - pos);
    hbuf_append(out, n->content, n->content_len);
    pos = from = me;
  }
  hbuf_append(out, s + pos, len - pos);
  if (md) pcre2_match_data_free(md);
}

static void strip_ws(const char *s, size_t len, bool left, bool right, hbuf *out) {
  size_t a = 0, b = len;
  uint32_t c;
  while (left && a < b) {
    int l = utf8_decode(s + a, b - a, &c);
    if (!l || !hfu_is_whitespace(c)) break;
    a += (size_t)l;
  }
  while (right && b > a) {
    size_t i = b - 1;
    while (i > a && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    if (!utf8_decode(s + i, b - i, &c) || !hfu_is_whitespace(c)) break;
    b = i;
  }
  hbuf_append(out, s + a, b - a);
}

/* Copies s without the characters drop() selects. */
static void filter_marks(const char *s, size_t len, bool (*drop)(uint32_t), hbuf *out) {
  uint32_t c;
  for (size_t i = 0; i < len;) {
    int l = utf8_decode(s + i, len - i, &c);
    if (!l) l = 1, c = 0xFFFD;
    if (!drop(c)) hbuf_append(out, s + i, (size_t)l);
    i += (size_t)l;
  }
}

static int bert_normalize(const hf_normalizer *n, const char *s, size_t len, hbuf *out) {
  hbuf a = {0}, b = {0};
  uint32_t c;
  for (size_t i = 0; i < len;) {
    int l = utf8_decode(s + i, len - i, &c);
    if (!l) l = 1, c = 0xFFFD;
    if (n->clean_text) {
      if (c == 0 || c == 0xFFFD || hfu_is_control(c)) {
        i += (size_t)l;
        continue;
      }
      if (c == '\t' || c == '\n' || c == '\r' || hfu_is_whitespace(c)) {
        hbuf_putc(&a, ' ');
        i += (size_t)l;
        continue;
      }
    }
    if (n->chinese && hfu_is_chinese(c)) {
      hbuf_putc(&a, ' ');
      hbuf_append(&a, s + i, (size_t)l);
      hbuf_putc(&a, ' ');
    } else {
      hbuf_append(&a, s + i, (size_t)l);
    }
    i += (size_t)l;
  }
  int rc = 0;
  if (n->strip_accents) {
    rc = hfu_normalize_form(hbuf_str(&a), a.len, 'D', &b);
    hbuf_clear(&a);
    filter_marks(hbuf_str(&b), b.len, hfu_is_mark_nonspacing, &a);
  }
  if (n->lowercase) hfu_lowercase(hbuf_str(&a), a.len, out);
  else hbuf_append(out, hbuf_str(&a), a.len);
  hbuf_free(&a);
  hbuf_free(&b);
  return rc;
}

int hf_normalize(const hf_normalizer *n, const char *s, size_t len, hbuf *out, herr *err) {
  int rc = 0;
  switch (n->kind) {
    case NORM_NFC: rc = hfu_normalize_form(s, len, 'C', out); break;
    case NORM_NFD: rc = hfu_normalize_form(s, len, 'D', out); break;
    case NORM_NFKC: rc = hfu_normalize_form(s, len, 'K', out); break;
    case NORM_NFKD: rc = hfu_normalize_form(s, len, 'k', out); break;
    case NORM_LOWERCASE: hfu_lowercase(s, len, out); break;
    case NORM_STRIP_ACCENTS: filter_marks(s, len, hfu_is_combining_mark, out); break;
    case NORM_STRIP: strip_ws(s, len, n->left, n->right, out); break;
    case NORM_PREPEND:
      if (len) hbuf_append(out, n->content, n->content_len);
      hbuf_append(out, s, len);
      break;
    case NORM_REPLACE: replace_all(n, s, len, out); break;
    case NORM_BERT: rc = bert_normalize(n, s, len, out); break;
    case NORM_PRECOMPILED: precompiled_normalize(n, s, len, out); break;
    case NORM_SEQUENCE: {
      hbuf cur = {0}, next = {0};
      hbuf_append(&cur, s, len);
      for (size_t i = 0; !rc && i < n->nitems; i++) {
        hbuf_clear(&next);
        rc = hf_normalize(n->items[i], hbuf_str(&cur), cur.len, &next, err);
        hbuf t = cur;
        cur = next;
        next = t;
      }
      hbuf_append(out, hbuf_str(&cur), cur.len);
      hbuf_free(&cur);
      hbuf_free(&next);
      return rc;
    }
    default: break;
  }
  if (rc) return herr_set(err, rc, "normalizer: text is not valid UTF-8");
  if (out->oom) return herr_set(err, HEARTH_ENOMEM, "normalizer: out of memory");
  return 0;
}
