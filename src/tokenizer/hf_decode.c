/* hf_decode.c — tokenizer.json decoders: ByteLevel, Metaspace, ByteFallback,
 * Fuse, Strip, Replace, WordPiece, BPEDecoder, CTC and Sequence. Each maps a
 * list of token strings to a list of strings (HF's decode_chain); the result
 * is their concatenation. Knows nothing of ids or vocabularies. */
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "base/vec.h"
#include "tokenizer/hf_internal.h"

enum { DEC_BYTELEVEL, DEC_METASPACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_REPLACE, DEC_WORDPIECE, DEC_BPE, DEC_CTC, DEC_SEQUENCE };

struct hf_decoder {
  int kind;
  char repl[8];       /* Metaspace replacement; Strip content (UTF-8) */
  int repl_len;
  bool prepend;       /* Metaspace: prepend_scheme != never */
  size_t start, stop; /* Strip */
  hf_regex re;        /* Replace */
  char *str;          /* Replace content; WordPiece prefix; BPE suffix; CTC pad (owned) */
  size_t str_len;
  char *word_delim;   /* CTC (owned) */
  bool cleanup;       /* WordPiece, CTC */
  hf_decoder **items; /* Sequence (owned) */
  size_t nitems;
};

bool hf_strlist_push(hf_strlist *l, const char *s, size_t len) {
  if (l->n == l->cap) {
    size_t coff = l->cap, clen = l->cap;
    if (!HGROW(l->off, coff, l->n + 1) || !HGROW(l->len, clen, l->n + 1)) return false;
    l->cap = coff;
  }
  l->off[l->n] = l->data.len;
  l->len[l->n] = len;
  hbuf_append(&l->data, s, len);
  if (l->data.oom) return false;
  l->n++;
  return true;
}

void hf_strlist_clear(hf_strlist *l) {
  hbuf_clear(&l->data);
  l->n = 0;
}

void hf_strlist_free(hf_strlist *l) {
  hbuf_free(&l->data);
  free(l->off);
  free(l->len);
  memset(l, 0, sizeof *l);
}

static const char *item(const hf_strlist *l, size_t i) { return hbuf_str(&l->data) + l->off[i]; }

static char *dup_json_str(const json_t *v, size_t *len) {
  size_t n = json_string_length(v);
  char *s = malloc(n + 1);
  if (s) memcpy(s, json_string_value(v), n + 1);
  *len = n;
  return s;
}

static int one_char(hf_decoder *d, const json_t *v, const char *dflt, const char *field, const char *what, herr *err) {
  const char *s = v ? json_string_value(v) : dflt;
  size_t n = v ? json_string_length(v) : strlen(dflt);
  uint32_t cp;
  int l = s ? utf8_decode(s, n, &cp) : 0;
  if (!l || (size_t)l != n) return herr_set(err, HEARTH_EFORMAT, "%s: decoder field '%s' must be a one-character string", what, field);
  memcpy(d->repl, s, (size_t)l);
  d->repl_len = l;
  return 0;
}

int hf_decoder_parse(const json_t *j, hf_decoder **out, const char *what, herr *err) {
  *out = NULL;
  if (!j || json_is_null(j)) return 0;
  if (!json_is_object(j)) return herr_set(err, HEARTH_EFORMAT, "%s: decoder must be an object", what);
  const char *type = json_string_value(json_object_get(j, "type"));
  if (!type) return herr_set(err, HEARTH_EFORMAT, "%s: decoder has no 'type'", what);
  hf_decoder *d = calloc(1, sizeof *d);
  if (!d) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  int rc = 0;
  const json_t *v;
  if (!strcmp(type, "ByteLevel")) d->kind = DEC_BYTELEVEL;
  else if (!strcmp(type, "ByteFallback")) d->kind = DEC_BYTEFALLBACK;
  else if (!strcmp(type, "Fuse")) d->kind = DEC_FUSE;
  else if (!strcmp(type, "Metaspace")) {
    d->kind = DEC_METASPACE;
    rc = one_char(d, json_object_get(j, "replacement"), "\xE2\x96\x81", "replacement", what, err);
    const char *ps = json_string_value(json_object_get(j, "prepend_scheme"));
    if (ps) d->prepend = strcmp(ps, "never") != 0;
    else d->prepend = !json_is_false(json_object_get(j, "add_prefix_space"));
  } else if (!strcmp(type, "Strip")) {
    d->kind = DEC_STRIP;
    rc = one_char(d, json_object_get(j, "content"), " ", "content", what, err);
    v = json_object_get(j, "start");
    d->start = json_is_integer(v) && json_integer_value(v) > 0 ? (size_t)json_integer_value(v) : 0;
    v = json_object_get(j, "stop");
    d->stop = json_is_integer(v) && json_integer_value(v) > 0 ? (size_t)json_integer_value(v) : 0;
  } else if (!strcmp(type, "Replace")) {
    d->kind = DEC_REPLACE;
    const char *pat;
    size_t plen;
    bool lit;
    v = json_object_get(j, "content");
    if (!(rc = hf_json_pattern(j, "pattern", &pat, &plen, &lit, what, err))) {
      if (!json_is_string(v)) rc = herr_set(err, HEARTH_EFORMAT, "%s: Replace decoder needs a string 'content'", what);
      else if (!(rc = hf_regex_compile(&d->re, pat, plen, lit, what, err))) d->str = dup_json_str(v, &d->str_len);
    }
  } else if (!strcmp(type, "WordPiece")) {
    d->kind = DEC_WORDPIECE;
    v = json_object_get(j, "prefix");
    if (json_is_string(v)) d->str = dup_json_str(v, &d->str_len);
    else d->str = strdup("##"), d->str_len = 2;
    d->cleanup = !json_is_false(json_object_get(j, "cleanup"));
  } else if (!strcmp(type, "BPEDecoder")) {
    d->kind = DEC_BPE;
    v = json_object_get(j, "suffix");
    if (json_is_string(v)) d->str = dup_json_str(v, &d->str_len);
    else d->str = strdup("</w>"), d->str_len = 4;
  } else if (!strcmp(type, "CTC")) {
    d->kind = DEC_CTC;
    v = json_object_get(j, "pad_token");
    if (json_is_string(v)) d->str = dup_json_str(v, &d->str_len);
    else d->str = strdup("<pad>"), d->str_len = 5;
    v = json_object_get(j, "word_delimiter_token");
    size_t wl;
    d->word_delim = json_is_string(v) ? dup_json_str(v, &wl) : strdup("|");
    d->cleanup = !json_is_false(json_object_get(j, "cleanup"));
  } else if (!strcmp(type, "Sequence")) {
    d->kind = DEC_SEQUENCE;
    const json_t *items = json_object_get(j, "decoders");
    if (!json_is_array(items)) rc = herr_set(err, HEARTH_EFORMAT, "%s: Sequence decoder needs an array 'decoders'", what);
    else {
      d->items = calloc(json_array_size(items) + 1, sizeof *d->items);
      for (size_t i = 0; !rc && i < json_array_size(items); i++) {
        rc = hf_decoder_parse(json_array_get(items, i), &d->items[d->nitems], what, err);
        if (!rc && d->items[d->nitems]) d->nitems++;
      }
    }
  } else {
    rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: unsupported decoder type '%s'", what, type);
  }
  if (rc) {
    hf_decoder_free(d);
    return rc;
  }
  *out = d;
  return 0;
}

void hf_decoder_free(hf_decoder *d) {
  if (!d) return;
  for (size_t i = 0; i < d->nitems; i++) hf_decoder_free(d->items[i]);
  free(d->items);
  hf_regex_free(&d->re);
  free(d->str);
  free(d->word_delim);
  free(d);
}

/* Replaces every occurrence of pat in s with rep (plain substring replace). */
static void str_replace(hbuf *out, const char *s, size_t n, const char *pat, size_t plen, const char *rep, size_t rlen) {
  size_t i = 0;
  while (i < n) {
    if (plen && i + plen <= n && memcmp(s + i, pat, plen) == 0) {
      hbuf_append(out, rep, rlen);
      i += plen;
    } else {
      hbuf_putc(out, s[i]);
      i++;
    }
  }
}

static void wordpiece_cleanup(hbuf *t) {
  static const char *pairs[][2] = {{" .", "."},   {" ?", "?"},   {" !", "!"},           {" ,", ","},   {" ' ", "'"},
                                   {" n't", "n't"}, {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"},
                                   {" 're", "'re"}};
  hbuf tmp = {0};
  for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
    if (!t->len || !memmem(t->data, t->len, pairs[k][0], strlen(pairs[k][0]))) continue;
    hbuf_clear(&tmp);
    str_replace(&tmp, t->data, t->len, pairs[k][0], strlen(pairs[k][0]), pairs[k][1], strlen(pairs[k][1]));
    hbuf_clear(t);
    hbuf_append(t, hbuf_str(&tmp), tmp.len);
  }
  hbuf_free(&tmp);
}

static int parse_byte_token(const char *s, size_t n) {
  if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; i++) {
    char c = s[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) {
      if (i == 3 && c == '+') continue; /* Rust's from_str_radix takes a leading '+' */
      return -1;
    }
    v = v * 16 + d;
  }
  return v;
}

/* One decoder step: in -> out (cleared first). raw: the tokens stand in the
 * middle of a longer text (no first-token or last-token rules) and bytes stay
 * bytes (no lossy UTF-8 repair). */
static int decode_step(const hf_decoder *d, const hf_strlist *in, hf_strlist *out, bool raw, herr *err) {
  hf_strlist_clear(out);
  hbuf t = {0};
  bool ok = true;
  int rc = 0;
  switch (d->kind) {
    case DEC_BYTELEVEL: {
      hbuf bytes = {0};
      for (size_t i = 0; i < in->n; i++) {
        const char *s = item(in, i);
        size_t n = in->len[i], start = bytes.len;
        bool all = true;
        for (size_t k = 0; k < n;) {
          uint32_t cp;
          int l = utf8_decode(s + k, n - k, &cp);
          int b = l ? hfu_char_byte(cp) : -1;
          if (b < 0) {
            all = false;
            break;
          }
          hbuf_putc(&bytes, (char)b);
          k += (size_t)l;
        }
        if (!all) {
          bytes.len = start;
          hbuf_append(&bytes, s, n);
        }
      }
      if (raw) hbuf_append(&t, hbuf_str(&bytes), bytes.len);
      else hfu_append_lossy(&t, (const unsigned char *)hbuf_str(&bytes), bytes.len);
      hbuf_free(&bytes);
      ok = hf_strlist_push(out, hbuf_str(&t), t.len);
      break;
    }
    case DEC_METASPACE:
      for (size_t i = 0; ok && i < in->n; i++) {
        hbuf_clear(&t);
        const char *s = item(in, i);
        size_t n = in->len[i];
        for (size_t k = 0; k < n;) {
          if (k + (size_t)d->repl_len <= n && memcmp(s + k, d->repl, (size_t)d->repl_len) == 0) {
            if (!(i == 0 && d->prepend && !raw)) hbuf_putc(&t, ' ');
            k += (size_t)d->repl_len;
          } else {
            hbuf_putc(&t, s[k]);
            k++;
          }
        }
        ok = hf_strlist_push(out, hbuf_str(&t), t.len);
      }
      break;
    case DEC_BYTEFALLBACK: {
      hbuf pend = {0};
      for (size_t i = 0; ok && i <= in->n; i++) {
        int b = i < in->n ? parse_byte_token(item(in, i), in->len[i]) : -1;
        if (b >= 0) {
          hbuf_putc(&pend, (char)b);
          continue;
        }
        if (pend.len) {
          if (raw || utf8_valid(pend.data, pend.len)) ok = hf_strlist_push(out, pend.data, pend.len);
          else
            for (size_t k = 0; ok && k < pend.len; k++) ok = hf_strlist_push(out, "\xEF\xBF\xBD", 3);
          hbuf_clear(&pend);
        }
        if (ok && i < in->n) ok = hf_strlist_push(out, item(in, i), in->len[i]);
      }
      hbuf_free(&pend);
      break;
    }
    case DEC_FUSE:
      ok = hf_strlist_push(out, hbuf_str(&in->data), in->data.len);
      if (ok && in->n == 0) out->n = 1; /* one empty string */
      break;
    case DEC_STRIP:
      for (size_t i = 0; ok && i < in->n; i++) {
        if (raw) {
          ok = hf_strlist_push(out, item(in, i), in->len[i]);
          continue;
        }
        const char *s = item(in, i);
        size_t a = 0, b = in->len[i], rl = (size_t)d->repl_len;
        for (size_t k = 0; k < d->start && a + rl <= b && memcmp(s + a, d->repl, rl) == 0; k++) a += rl;
        for (size_t k = 0; k < d->stop && b >= a + rl && memcmp(s + b - rl, d->repl, rl) == 0; k++) b -= rl;
        ok = hf_strlist_push(out, s + a, b - a);
      }
      break;
    case DEC_REPLACE: {
      pcre2_match_data *md = pcre2_match_data_create_from_pattern(d->re.code, NULL);
      ok = md != NULL;
      for (size_t i = 0; ok && i < in->n; i++) {
        hbuf_clear(&t);
        const char *s = item(in, i);
        size_t n = in->len[i], pos = 0, from = 0, ms, me;
        while (from <= n && hf_regex_next(&d->re, md, s, n, from, &ms, &me)) {
          if (me == ms) {
            if (ms >= n) break;
            from = ms + 1;
            continue;
          }
          hbuf_append(&t, s + pos, ms - pos);
          hbuf_append(&t, d->str, d->str_len);
          pos = from = me;
        }
        hbuf_append(&t, s + pos, n - pos);
        ok = hf_strlist_push(out, hbuf_str(&t), t.len);
      }
      if (md) pcre2_match_data_free(md);
      break;
    }
    case DEC_WORDPIECE:
      for (size_t i = 0; ok && i < in->n; i++) {
        hbuf_clear(&t);
        const char *s = item(in, i);
        size_t n = in->len[i];
        if (i != 0 || raw) {
          if (n >= d->str_len && memcmp(s, d->str, d->str_len) == 0) s += d->str_len, n -= d->str_len;
          else hbuf_putc(&t, ' ');
        }
        hbuf_append(&t, s, n);
        if (d->cleanup) wordpiece_cleanup(&t);
        ok = hf_strlist_push(out, hbuf_str(&t), t.len);
      }
      break;
    case DEC_BPE:
      for (size_t i = 0; ok && i < in->n; i++) {
        hbuf_clear(&t);
        const char *rep = i + 1 == in->n && !raw ? "" : " ";
        str_replace(&t, item(in, i), in->len[i], d->str, d->str_len, rep, strlen(rep));
        ok = hf_strlist_push(out, hbuf_str(&t), t.len);
      }
      break;
    case DEC_CTC: {
      /* dedup consecutive, drop pad, word delimiter -> space, optional cleanup */
      for (size_t i = 0; ok && i < in->n; i++) {
        if (i > 0 && in->len[i] == in->len[i - 1] && memcmp(item(in, i), item(in, i - 1), in->len[i]) == 0) continue;
        if (in->len[i] == d->str_len && memcmp(item(in, i), d->str, d->str_len) == 0) continue;
        hbuf_clear(&t);
        if (d->cleanup) {
          str_replace(&t, item(in, i), in->len[i], d->word_delim, strlen(d->word_delim), " ", 1);
          wordpiece_cleanup(&t);
        } else {
          hbuf_append(&t, item(in, i), in->len[i]);
        }
        ok = hf_strlist_push(out, hbuf_str(&t), t.len);
      }
      break;
    }
    case DEC_SEQUENCE: {
      hf_strlist a = {0}, b = {0};
      const hf_strlist *cur = in;
      for (size_t k = 0; !rc && k < d->nitems; k++) {
        hf_strlist *dst = cur == &a ? &b : &a;
        rc = decode_step(d->items[k], cur, dst, raw, err);
        cur = dst;
      }
      for (size_t i = 0; !rc && ok && i < cur->n; i++) ok = hf_strlist_push(out, item(cur, i), cur->len[i]);
      hf_strlist_free(&a);
      hf_strlist_free(&b);
      break;
    }
  }
  if (t.oom) ok = false;
  hbuf_free(&t);
  if (rc) return rc;
  return ok ? 0 : herr_set(err, HEARTH_ENOMEM, "decoder: out of memory");
}

int hf_decode_tokens(const hf_decoder *d, const hf_strlist *tokens, hbuf *out, herr *err) {
  hf_strlist res = {0};
  int rc = decode_step(d, tokens, &res, false, err);
  if (!rc) hbuf_append(out, hbuf_str(&res.data), res.data.len);
  hf_strlist_free(&res);
  return rc;
}

int hf_decode_token_raw(const hf_decoder *d, const char *tok, size_t len, hbuf *out, herr *err) {
  hf_strlist in = {0}, res = {0};
  int rc = hf_strlist_push(&in, tok, len) ? decode_step(d, &in, &res, true, err)
                                           : herr_set(err, HEARTH_ENOMEM, "detokenize: out of memory");
  if (!rc) hbuf_append(out, hbuf_str(&res.data), res.data.len);
  hf_strlist_free(&in);
  hf_strlist_free(&res);
  return rc;
}
