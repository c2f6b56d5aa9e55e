/* hf_pretok.c — tokenizer.json pre-tokenizers: ByteLevel, Split (every
 * behaviour, invert, string or regex), Metaspace, Digits, Punctuation,
 * Whitespace, WhitespaceSplit, BertPreTokenizer, CharDelimiterSplit and
 * Sequence. Each turns a list of text pieces into a finer list, exactly as
 * HF's PreTokenizedString::split does (empty pieces dropped). Pieces that are
 * already tokens (added tokens) pass through. Knows nothing of vocabularies. */
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "base/vec.h"
#include "tokenizer/hf_internal.h"

enum { PT_BYTELEVEL, PT_SPLIT, PT_METASPACE, PT_DIGITS, PT_PUNCT, PT_WHITESPACE, PT_WS_SPLIT, PT_BERT, PT_CHAR, PT_SEQUENCE };
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

struct hf_pretok {
  int kind;
  bool add_prefix_space, use_regex; /* ByteLevel */
  hf_regex re;                      /* Split, ByteLevel (GPT-2 regex), Whitespace */
  int behavior;                     /* Split, Punctuation */
  bool invert;                      /* Split */
  char repl[8];                     /* Metaspace replacement / CharDelimiterSplit delimiter (UTF-8) */
  int repl_len;
  uint32_t repl_cp;
  int prepend;                      /* Metaspace */
  bool split;                       /* Metaspace */
  bool individual;                  /* Digits */
  hf_pretok **items;                /* Sequence (owned) */
  size_t nitems;
};

/* The byte-level alphabet as {length, utf8...} per byte, filled once. */
static unsigned char byte_chars[256][3];
static pthread_once_t byte_chars_once = PTHREAD_ONCE_INIT;

static void byte_chars_init(void) {
  for (unsigned b = 0; b < 256; b++) {
    int l;
    const char *c = hfu_byte_char(b, &l);
    byte_chars[b][0] = (unsigned char)l;
    byte_chars[b][1] = (unsigned char)c[0];
    byte_chars[b][2] = (unsigned char)(l > 1 ? c[1] : 0);
  }
}

static const char GPT2_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
#define WORD_CLASS "\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}"
static const char WHITESPACE_RE[] = "[" WORD_CLASS "]+|[^" WORD_CLASS "\\s]+";

static int parse_behavior(const json_t *j, int dflt, int *out, const char *what, herr *err) {
  const json_t *b = json_object_get(j, "behavior");
  if (!b || json_is_null(b)) {
    *out = dflt;
    return 0;
  }
  const char *s = json_string_value(b);
  static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
  for (int i = 0; s && i < 5; i++)
    if (!strcmp(s, names[i])) {
      *out = i;
      return 0;
    }
  return herr_set(err, HEARTH_EFORMAT, "%s: unknown split behavior '%s'", what, s ? s : "(not a string)");
}

static bool get_bool(const json_t *j, const char *key, bool dflt) {
  const json_t *v = json_object_get(j, key);
  return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static int set_char(hf_pretok *p, const json_t *v, const char *field, const char *what, herr *err) {
  const char *s = json_string_value(v);
  uint32_t cp;
  int l = s ? utf8_decode(s, json_string_length(v), &cp) : 0;
  if (!l || (size_t)l != json_string_length(v))
    return herr_set(err, HEARTH_EFORMAT, "%s: field '%s' must be a one-character string", what, field);
  memcpy(p->repl, s, (size_t)l);
  p->repl_len = l;
  p->repl_cp = cp;
  return 0;
}

int hf_pretok_parse(const json_t *j, hf_pretok **out, const char *what, herr *err) {
  *out = NULL;
  if (!j || json_is_null(j)) return 0;
  if (!json_is_object(j)) return herr_set(err, HEARTH_EFORMAT, "%s: pre_tokenizer must be an object", what);
  const char *type = json_string_value(json_object_get(j, "type"));
  if (!type) return herr_set(err, HEARTH_EFORMAT, "%s: pre_tokenizer has no 'type'", what);
  hf_pretok *p = calloc(1, sizeof *p);
  if (!p) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  int rc = 0;
  if (!strcmp(type, "ByteLevel")) {
    p->kind = PT_BYTELEVEL;
    pthread_once(&byte_chars_once, byte_chars_init);
    p->add_prefix_space = get_bool(j, "add_prefix_space", true);
    p->use_regex = get_bool(j, "use_regex", true);
    if (p->use_regex) rc = hf_regex_compile(&p->re, GPT2_RE, sizeof GPT2_RE - 1, false, what, err);
  } else if (!strcmp(type, "Split")) {
    p->kind = PT_SPLIT;
    const char *pat;
    size_t plen;
    bool lit;
    if (!(rc = hf_json_pattern(j, "pattern", &pat, &plen, &lit, what, err)) &&
        !(rc = parse_behavior(j, -1, &p->behavior, what, err))) {
      if (p->behavior < 0) rc = herr_set(err, HEARTH_EFORMAT, "%s: Split pre_tokenizer needs a 'behavior'", what);
      else rc = hf_regex_compile(&p->re, pat, plen, lit, what, err);
    }
    p->invert = get_bool(j, "invert", false);
  } else if (!strcmp(type, "Metaspace")) {
    p->kind = PT_METASPACE;
    const json_t *r = json_object_get(j, "replacement");
    if (r) rc = set_char(p, r, "replacement", what, err);
    else memcpy(p->repl, "\xE2\x96\x81", 3), p->repl_len = 3, p->repl_cp = 0x2581;
    p->split = get_bool(j, "split", true);
    const char *ps = json_string_value(json_object_get(j, "prepend_scheme"));
    if (ps) {
      if (!strcmp(ps, "always")) p->prepend = PREPEND_ALWAYS;
      else if (!strcmp(ps, "first")) p->prepend = PREPEND_FIRST;
      else if (!strcmp(ps, "never")) p->prepend = PREPEND_NEVER;
      else rc = herr_set(err, HEARTH_EFORMAT, "%s: unknown Metaspace prepend_scheme '%s'", what, ps);
    } else {
      p->prepend = get_bool(j, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER;
    }
  } else if (!strcmp(type, "Digits")) {
    p->kind = PT_DIGITS;
    p->individual = get_bool(j, "individual_digits", false);
  } else if (!strcmp(type, "Punctuation")) {
    p->kind = PT_PUNCT;
    rc = parse_behavior(j, HF_SPLIT_ISOLATED, &p->behavior, what, err);
  } else if (!strcmp(type, "Whitespace")) {
    p->kind = PT_WHITESPACE;
    rc = hf_regex_compile(&p->re, WHITESPACE_RE, sizeof WHITESPACE_RE - 1, false, what, err);
  } else if (!strcmp(type, "WhitespaceSplit")) {
    p->kind = PT_WS_SPLIT;
  } else if (!strcmp(type, "BertPreTokenizer")) {
    p->kind = PT_BERT;
  } else if (!strcmp(type, "CharDelimiterSplit")) {
    p->kind = PT_CHAR;
    rc = set_char(p, json_object_get(j, "delimiter"), "delimiter", what, err);
  } else if (!strcmp(type, "Sequence")) {
    p->kind = PT_SEQUENCE;
    const json_t *items = json_object_get(j, "pretokenizers");
    if (!json_is_array(items)) rc = herr_set(err, HEARTH_EFORMAT, "%s: Sequence pre_tokenizer needs an array 'pretokenizers'", what);
    else {
      p->items = calloc(json_array_size(items) + 1, sizeof *p->items);
      for (size_t i = 0; !rc && i < json_array_size(items); i++) {
        rc = hf_pretok_parse(json_array_get(items, i), &p->items[p->nitems], what, err);
        if (!rc && p->items[p->nitems]) p->nitems++;
      }
    }
  } else {
    rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: unsupported pre_tokenizer type '%s'", what, type);
  }
  if (rc) {
    hf_pretok_free(p);
    return rc;
  }
  *out = p;
  return 0;
}

void hf_pretok_free(hf_pretok *p) {
  if (!p) return;
  for (size_t i = 0; i < p->nitems; i++) hf_pretok_free(p->items[i]);
  free(p->items);
  hf_regex_free(&p->re);
  free(p);
}

/* ---- the split machinery ---- */
typedef struct seg {
  size_t a, b;
  bool m;
} seg;

typedef struct segs {
  seg *v; /* owned */
  size_t n, cap;
} segs;

static bool seg_push(segs *s, size_t a, size_t b, bool m) {
  if (s->n == s->cap && !HGROW(s->v, s->cap, s->n + 1)) return false;
  s->v[s->n++] = (seg){a, b, m};
  return true;
}

typedef bool (*char_pred)(uint32_t c, const hf_pretok *p);

static void find_char_matches(const char *s, size_t n, char_pred pred, const hf_pretok *p, segs *out) {
  size_t last = 0;
  uint32_t c;
  for (size_t i = 0; i < n;) {
    int l = utf8_decode(s + i, n - i, &c);
    if (!l) l = 1, c = 0xFFFD;
    if (pred(c, p)) {
      if (last < i) seg_push(out, last, i, false);
      seg_push(out, i, i + (size_t)l, true);
      last = i + (size_t)l;
    }
    i += (size_t)l;
  }
  if (n > last) seg_push(out, last, n, false);
}

static void find_regex_matches(const hf_regex *re, pcre2_match_data *md, const char *s, size_t n, segs *out) {
  size_t prev = 0, from = 0, ms, me;
  while (from <= n && hf_regex_next(re, md, s, n, from, &ms, &me)) {
    if (prev != ms) seg_push(out, prev, ms, false);
    seg_push(out, ms, me, true);
    prev = me;
    if (me == ms) { /* empty match: step over one character */
      if (me >= n) break;
      uint32_t c;
      int l = utf8_decode(s + me, n - me, &c);
      from = me + (l ? (size_t)l : 1);
    } else {
      from = me;
    }
  }
  if (prev != n) seg_push(out, prev, n, false);
}

/* Applies a split behaviour to segs (in place) and pushes the pieces to out. */
static bool emit_behavior(const char *s, segs *sg, int behavior, bool invert, bool at_start, hf_splits *out) {
  if (invert)
    for (size_t i = 0; i < sg->n; i++) sg->v[i].m = !sg->v[i].m;
  size_t k = 0;
  bool prev_match = false;
  switch (behavior) {
    case HF_SPLIT_REMOVED:
      for (size_t i = 0; i < sg->n; i++)
        if (!sg->v[i].m) sg->v[k++] = sg->v[i];
      break;
    case HF_SPLIT_ISOLATED: k = sg->n; break;
    case HF_SPLIT_MERGED_PREV:
      for (size_t i = 0; i < sg->n; i++) {
        seg g = sg->v[i];
        if (g.m && !prev_match && k > 0) sg->v[k - 1].b = g.b;
        else sg->v[k++] = g;
        prev_match = g.m;
      }
      break;
    case HF_SPLIT_MERGED_NEXT: {
      /* walk backwards, then reverse */
      segs tmp = {0};
      for (size_t i = sg->n; i-- > 0;) {
        seg g = sg->v[i];
        if (g.m && !prev_match && tmp.n > 0) tmp.v[tmp.n - 1].a = g.a;
        else seg_push(&tmp, g.a, g.b, false);
        prev_match = g.m;
      }
      for (size_t i = 0; i < tmp.n; i++) sg->v[i] = tmp.v[tmp.n - 1 - i];
      k = tmp.n;
      free(tmp.v);
      break;
    }
    case HF_SPLIT_CONTIGUOUS:
      for (size_t i = 0; i < sg->n; i++) {
        seg g = sg->v[i];
        if (g.m == prev_match && k > 0) sg->v[k - 1].b = g.b;
        else sg->v[k++] = g;
        prev_match = g.m;
      }
      break;
  }
  for (size_t i = 0; i < k; i++) {
    seg g = sg->v[i];
    if (g.b > g.a && !hf_splits_push(out, s + g.a, g.b - g.a, -1, at_start && g.a == 0)) return false;
  }
  return true;
}

static bool pred_numeric(uint32_t c, const hf_pretok *p) { (void)p; return hfu_is_numeric(c); }
static bool pred_punct(uint32_t c, const hf_pretok *p) { (void)p; return hfu_is_punctuation(c); }
static bool pred_ws(uint32_t c, const hf_pretok *p) { (void)p; return hfu_is_whitespace(c); }
static bool pred_char(uint32_t c, const hf_pretok *p) { return c == p->repl_cp; }

/* One leaf pre-tokenizer over one piece of text. */
static bool pretok_piece(const hf_pretok *p, pcre2_match_data *md, const char *s, size_t n, bool at_start,
                         hf_splits *out, segs *sg, hbuf *tmp) {
  sg->n = 0;
  switch (p->kind) {
    case PT_SPLIT:
      find_regex_matches(&p->re, md, s, n, sg);
      return emit_behavior(s, sg, p->behavior, p->invert, at_start, out);
    case PT_WHITESPACE:
      find_regex_matches(&p->re, md, s, n, sg);
      return emit_behavior(s, sg, HF_SPLIT_REMOVED, true, at_start, out);
    case PT_DIGITS:
      find_char_matches(s, n, pred_numeric, p, sg);
      return emit_behavior(s, sg, p->individual ? HF_SPLIT_ISOLATED : HF_SPLIT_CONTIGUOUS, false, at_start, out);
    case PT_PUNCT:
      find_char_matches(s, n, pred_punct, p, sg);
      return emit_behavior(s, sg, p->behavior, false, at_start, out);
    case PT_WS_SPLIT:
      find_char_matches(s, n, pred_ws, p, sg);
      return emit_behavior(s, sg, HF_SPLIT_REMOVED, false, at_start, out);
    case PT_CHAR:
      find_char_matches(s, n, pred_char, p, sg);
      return emit_behavior(s, sg, HF_SPLIT_REMOVED, false, at_start, out);
    case PT_BERT: {
      find_char_matches(s, n, pred_ws, p, sg);
      /* whitespace removed, then punctuation isolated within each remaining piece */
      segs words = {0};
      for (size_t i = 0; i < sg->n; i++)
        if (!sg->v[i].m) seg_push(&words, sg->v[i].a, sg->v[i].b, false);
      bool ok = true;
      for (size_t i = 0; ok && i < words.n; i++) {
        sg->n = 0;
        size_t a = words.v[i].a;
        find_char_matches(s + a, words.v[i].b - a, pred_punct, p, sg);
        ok = emit_behavior(s + a, sg, HF_SPLIT_ISOLATED, false, at_start && a == 0, out);
      }
      free(words.v);
      return ok;
    }
    case PT_METASPACE: {
      hbuf_clear(tmp);
      bool starts = n >= (size_t)p->repl_len && memcmp(s, p->repl, (size_t)p->repl_len) == 0;
      if (!starts && n > 0 && s[0] == ' ') starts = true; /* the space becomes the replacement */
      if ((p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && at_start)) && !starts)
        hbuf_append(tmp, p->repl, (size_t)p->repl_len);
      for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') hbuf_append(tmp, p->repl, (size_t)p->repl_len);
        else hbuf_putc(tmp, s[i]);
      }
      if (tmp->oom) return false;
      const char *t = hbuf_str(tmp);
      if (!p->split) return tmp->len == 0 || hf_splits_push(out, t, tmp->len, -1, at_start);
      find_char_matches(t, tmp->len, pred_char, p, sg);
      return emit_behavior(t, sg, HF_SPLIT_MERGED_NEXT, false, at_start, out);
    }
    case PT_BYTELEVEL: {
      hbuf_clear(tmp);
      if (p->add_prefix_space && (n == 0 || s[0] != ' ')) hbuf_putc(tmp, ' ');
      hbuf_append(tmp, s, n);
      if (tmp->oom) return false;
      const char *t = hbuf_str(tmp);
      size_t tn = tmp->len;
      if (p->use_regex) {
        find_regex_matches(&p->re, md, t, tn, sg);
      } else {
        seg_push(sg, 0, tn, false);
      }
      for (size_t i = 0; i < sg->n; i++) {
        seg g = sg->v[i];
        if (g.b <= g.a) continue;
        /* map each byte to its alphabet character, written straight into out */
        size_t start = out->text.len;
        if (!hf_splits_push(out, "", 0, -1, at_start && g.a == 0)) return false;
        if (!hbuf_reserve(&out->text, 2 * (g.b - g.a))) return false;
        char *w = out->text.data + out->text.len;
        for (size_t k = g.a; k < g.b; k++) {
          const unsigned char *c = byte_chars[(unsigned char)t[k]];
          w[0] = (char)c[1];
          w[1] = (char)c[2];
          w += c[0];
        }
        out->text.len = (size_t)(w - out->text.data);
        out->text.data[out->text.len] = 0;
        if (out->text.oom) return false;
        out->v[out->n - 1].len = out->text.len - start;
      }
      return true;
    }
  }
  return true;
}

static int pretok_leaf(const hf_pretok *p, const hf_splits *in, hf_splits *out, herr *err) {
  segs sg = {0};
  hbuf tmp = {0};
  pcre2_match_data *md = p->re.code ? pcre2_match_data_create_from_pattern(p->re.code, NULL) : NULL;
  bool ok = !p->re.code || md;
  for (size_t i = 0; ok && i < in->n; i++) {
    const hf_split *sp = &in->v[i];
    const char *s = hbuf_str(&in->text) + sp->off;
    if (sp->id >= 0) ok = hf_splits_push(out, s, sp->len, sp->id, sp->at_start);
    else ok = pretok_piece(p, md, s, sp->len, sp->at_start, out, &sg, &tmp);
  }
  free(sg.v);
  hbuf_free(&tmp);
  if (md) pcre2_match_data_free(md);
  return ok ? 0 : herr_set(err, HEARTH_ENOMEM, "pre-tokenizer: out of memory");
}

int hf_pretokenize(const hf_pretok *p, const hf_splits *in, hf_splits *out, herr *err) {
  hf_splits_clear(out);
  if (p->kind != PT_SEQUENCE) return pretok_leaf(p, in, out, err);
  if (p->nitems == 0) {
    for (size_t i = 0; i < in->n; i++)
      if (!hf_splits_push(out, hbuf_str(&in->text) + in->v[i].off, in->v[i].len, in->v[i].id, in->v[i].at_start))
        return herr_set(err, HEARTH_ENOMEM, "pre-tokenizer: out of memory");
    return 0;
  }
  hf_splits a = {0}, b = {0};
  const hf_splits *cur = in;
  int rc = 0;
  for (size_t i = 0; !rc && i < p->nitems; i++) {
    hf_splits *dst = (i == p->nitems - 1) ? out : (cur == &a ? &b : &a);
    rc = hf_pretokenize(p->items[i], cur, dst, err);
    cur = dst;
  }
  hf_splits_free(&a);
  hf_splits_free(&b);
  return rc;
}
