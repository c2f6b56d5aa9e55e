/* gguf_vocab.c — tokenizers built from a GGUF vocabulary (tokenizer.ggml.*),
 * behaving as llama.cpp's llama-vocab does.
 *
 * Owns: reading the vocabulary keys (tokens, scores, token types, merges,
 * special ids, flags) with llama.cpp's defaults per model type; token
 * attributes (including llama.cpp's fix-ups by token text); splitting text
 * around special tokens; the SPM (llama), BPE (gpt2), WPM (bert) and UGM
 * (t5) algorithms; and detokenization with its space clean-up. The regex
 * lists per tokenizer.ggml.pre live in gguf_vocab_pre.c, the regex
 * splitter in gguf_vocab_split.c. Refuses to know about
 * tokenizer.json, chat templates, or how a model uses the ids.
 */
#include "tokenizer/gguf_vocab.h"

#include <ctype.h>
#include <float.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dict.h"
#include "base/vec.h"
#include "format/gguf.h"
#include "tokenizer/gguf_vocab_internal.h"

enum vocab_type { VT_SPM = 1, VT_BPE, VT_WPM, VT_UGM };

/* Token attributes (llama.cpp's llama_token_attr bits). */
enum {
  ATTR_UNKNOWN = 1 << 0,
  ATTR_UNUSED = 1 << 1,
  ATTR_NORMAL = 1 << 2,
  ATTR_CONTROL = 1 << 3,
  ATTR_USER_DEFINED = 1 << 4,
  ATTR_BYTE = 1 << 5,
  ATTR_LSTRIP = 1 << 7,
  ATTR_RSTRIP = 1 << 8,
};

/* Token types as stored in tokenizer.ggml.token_type. */
enum { TT_UNDEFINED = 0, TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6 };

#define NO_TOKEN (-1)
static const char ESCAPED_SPACE[] = "\xe2\x96\x81"; /* U+2581 */

typedef struct trie_node {
  unsigned char *keys;     /* owned, n entries: the byte leading to each child */
  struct trie_node **kids; /* owned, n entries */
  uint16_t n, cap;
  int32_t value;           /* token id, or NO_TOKEN */
} trie_node;

struct gguf_vocab {
  int type;
  char *model;              /* owned: tokenizer.ggml.model */
  int32_t n;
  char *arena;              /* owned: every token's text, NUL-terminated */
  size_t *off;              /* owned, n */
  uint32_t *len;            /* owned, n */
  float *score;             /* owned, n */
  uint32_t *attr;           /* owned, n */
  uint8_t *eog;             /* owned, n: ends generation */
  hdict index;              /* text → id */
  hdict ranks;              /* "left right" → merge rank */
  int max_token_len;
  int32_t bos, eos, unk, sep, pad, mask, eot, eom;
  bool add_bos, add_eos, add_sep, add_space_prefix, ignore_merges, clean_spaces;
  bool remove_extra_ws, escape_ws, treat_ws_as_suffix;
  bool raw_utf8;            /* BPE over raw UTF-8 with <0xXX> byte tokens (gemma4), not GPT-2 byte symbols */
  bool newline_words;       /* a word of newlines that is itself a token stays whole (gemma4) */
  bool lowercase, strip_accents;
  int32_t *special;         /* owned: control/user-defined/unknown ids, longest text first */
  size_t nspecial;
  char *pieces;             /* owned: each token's piece (special tokens rendered) */
  size_t *piece_off;        /* owned, n + 1 */
  gv_splitter *splitter;    /* owned (BPE) */
  char byte_utf8[256][3];   /* BPE: byte → the UTF-8 of the code point standing for it */
  uint8_t byte_utf8_len[256];
  int16_t cp_byte[512];     /* BPE: code point → byte, -1 when none */
  /* UGM */
  const uint32_t *xcda;     /* points into charsmap (unaligned: read with memcpy) */
  size_t xcda_size;
  unsigned char *charsmap;  /* owned copy of tokenizer.ggml.precompiled_charsmap */
  size_t charsmap_size;
  const char *prefix_repl;  /* points into charsmap */
  size_t prefix_repl_size;
  trie_node *token_trie;    /* owned */
  trie_node *user_trie;     /* owned */
  double unknown_score;
};

/* ---- small helpers ---- */

static const char *tok_text(const gguf_vocab *v, int32_t id) { return v->arena + v->off[id]; }

static int32_t find_token(const gguf_vocab *v, const char *s, size_t n) {
  int64_t id;
  return hdict_get(&v->index, s, n, &id) ? (int32_t)id : NO_TOKEN;
}

static size_t utf8_len_lead(unsigned char c) {
  static const size_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return lookup[c >> 4];
}

typedef struct ids_vec {
  int32_t *v;
  size_t n, cap;
  bool oom;
} ids_vec;

static void ids_push(ids_vec *o, int32_t id) {
  if (o->oom) return;
  if (o->n == o->cap && !HGROW(o->v, o->cap, o->n + 1)) {
    o->oom = true;
    return;
  }
  o->v[o->n++] = id;
}

/* ---- tries (UGM) ---- */

static trie_node *trie_new(void) {
  trie_node *t = calloc(1, sizeof *t);
  if (t) t->value = NO_TOKEN;
  return t;
}

static void trie_free(trie_node *t) {
  if (!t) return;
  for (uint16_t i = 0; i < t->n; i++) trie_free(t->kids[i]);
  free(t->keys);
  free(t->kids);
  free(t);
}

static trie_node *trie_child(const trie_node *t, unsigned char c) {
  if (!t) return NULL;
  for (uint16_t i = 0; i < t->n; i++)
    if (t->keys[i] == c) return t->kids[i];
  return NULL;
}

static bool trie_insert(trie_node *t, const char *key, size_t len, int32_t value) {
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)key[i];
    trie_node *k = trie_child(t, c);
    if (!k) {
      if (t->n == t->cap) { /* at most 256 children: powers of two up to 256 */
        uint16_t ckeys = t->cap, ckids = t->cap;
        if (!HGROW(t->keys, ckeys, t->n + 1) || !HGROW(t->kids, ckids, t->n + 1)) return false;
        t->cap = ckeys;
      }
      if (!(k = trie_new())) return false;
      t->keys[t->n] = c;
      t->kids[t->n++] = k;
    }
    t = k;
  }
  t->value = value;
  return true;
}

static const trie_node *trie_step(const trie_node *t, unsigned char c) { return trie_child(t, c); }

/* ---- bigram queue shared by SPM and BPE: highest key first, then leftmost ---- */

typedef struct bigram {
  int left, right;
  double key;   /* SPM: token score; BPE: minus the merge rank */
  size_t size;  /* bytes of left + right when queued */
} bigram;

typedef struct bigram_heap {
  bigram *v;
  size_t n, cap;
  bool oom;
} bigram_heap;

static bool bigram_before(const bigram *a, const bigram *b) {
  return a->key > b->key || (a->key == b->key && a->left < b->left);
}

static void heap_push(bigram_heap *h, bigram b) {
  if (h->oom) return;
  if (h->n == h->cap && !HGROW(h->v, h->cap, h->n + 1)) {
    h->oom = true;
    return;
  }
  size_t i = h->n++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!bigram_before(&b, &h->v[p])) break;
    h->v[i] = h->v[p];
    i = p;
  }
  h->v[i] = b;
}

static bigram heap_pop(bigram_heap *h) {
  bigram top = h->v[0];
  bigram last = h->v[--h->n];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, best = i;
    const bigram *bv = &last;
    if (l < h->n && bigram_before(&h->v[l], bv)) {
      best = l;
      bv = &h->v[l];
    }
    if (r < h->n && bigram_before(&h->v[r], bv)) best = r;
    if (best == i) break;
    h->v[i] = h->v[best];
    i = best;
  }
  if (h->n) h->v[i] = last;
  return top;
}

typedef struct symbol {
  int prev, next;
  const char *text;
  size_t n;
} symbol;

typedef struct symbols {
  symbol *v;
  size_t n, cap;
} symbols;

static bool symbols_push(symbols *s, symbol sym) {
  if (s->n == s->cap && !HGROW(s->v, s->cap, s->n + 1)) return false;
  s->v[s->n++] = sym;
  return true;
}

/* Splits text into one symbol per UTF-8 character (by lead byte, as llama.cpp). */
static bool symbols_from_text(symbols *s, const char *text, size_t len) {
  s->n = 0;
  size_t offs = 0;
  int index = 0;
  while (offs < len) {
    size_t cl = utf8_len_lead((unsigned char)text[offs]);
    symbol sym = {index - 1, 0, text + offs, cl < len - offs ? cl : len - offs};
    offs += sym.n;
    sym.next = offs == len ? -1 : index + 1;
    index++;
    if (!symbols_push(s, sym)) return false;
  }
  return true;
}

/* ---- SPM ---- */

static void spm_try_bigram(const gguf_vocab *v, const symbols *s, bigram_heap *h, int left, int right) {
  if (left == -1 || right == -1) return;
  size_t n = s->v[left].n + s->v[right].n;
  int32_t id = find_token(v, s->v[left].text, n);
  if (id == NO_TOKEN) return;
  bigram b = {left, right, v->score[id], n};
  heap_push(h, b);
}

static int32_t spm_byte_token(const gguf_vocab *v, unsigned char c) {
  char buf[8];
  snprintf(buf, sizeof buf, "<0x%02X>", c);
  int32_t id = find_token(v, buf, 6);
  if (id != NO_TOKEN) return id;
  char one = (char)c;
  id = find_token(v, &one, 1);
  return id != NO_TOKEN ? id : v->unk;
}

static void spm_tokenize(const gguf_vocab *v, const char *text, size_t len, ids_vec *out) {
  symbols s = {0};
  bigram_heap h = {0};
  if (!symbols_from_text(&s, text, len)) {
    out->oom = true;
    return;
  }
  for (int i = 1; i < (int)s.n; i++) spm_try_bigram(v, &s, &h, i - 1, i);
  while (h.n && !h.oom) {
    bigram b = heap_pop(&h);
    symbol *l = &s.v[b.left], *r = &s.v[b.right];
    if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue;
    l->n += r->n;
    r->n = 0;
    l->next = r->next;
    if (r->next >= 0) s.v[r->next].prev = b.left;
    spm_try_bigram(v, &s, &h, l->prev, b.left);
    spm_try_bigram(v, &s, &h, b.left, l->next);
  }
  if (h.oom) out->oom = true;
  for (int i = s.n ? 0 : -1; i != -1; i = s.v[i].next) {
    const symbol *sym = &s.v[i];
    int32_t id = find_token(v, sym->text, sym->n);
    if (id != NO_TOKEN) {
      ids_push(out, id);
    } else {
      for (size_t j = 0; j < sym->n; j++) {
        int32_t b = spm_byte_token(v, (unsigned char)sym->text[j]);
        if (b != NO_TOKEN) ids_push(out, b);
      }
    }
  }
  free(s.v);
  free(h.v);
}

/* ---- BPE ---- */

static int bpe_rank(const gguf_vocab *v, const symbol *l, const symbol *r, hbuf *scratch) {
  hbuf_clear(scratch);
  hbuf_append(scratch, l->text, l->n);
  hbuf_putc(scratch, ' ');
  hbuf_append(scratch, r->text, r->n);
  if (scratch->oom) return -1;
  int64_t rank;
  return hdict_get(&v->ranks, scratch->data, scratch->len, &rank) ? (int)rank : -1;
}

static void bpe_try_bigram(const gguf_vocab *v, const symbols *s, bigram_heap *h, int left, int right, hbuf *scratch) {
  if (left == -1 || right == -1) return;
  int rank = bpe_rank(v, &s->v[left], &s->v[right], scratch);
  if (rank < 0) return;
  bigram b = {left, right, -(double)rank, s->v[left].n + s->v[right].n};
  heap_push(h, b);
}

/* Merges one pre-tokenized, byte-encoded word and appends its tokens. */
static void bpe_word(const gguf_vocab *v, const char *word, size_t wlen, ids_vec *out, symbols *s, bigram_heap *h,
                     hbuf *scratch) {
  h->n = 0;
  s->n = 0;
  bool all_newlines = v->newline_words && wlen > 0;
  for (size_t i = 0; all_newlines && i < wlen; i++) all_newlines = word[i] == '\n';
  if ((v->ignore_merges || all_newlines) && find_token(v, word, wlen) != NO_TOKEN) {
    symbol sym = {-1, -1, word, wlen};
    if (!symbols_push(s, sym)) {
      out->oom = true;
      return;
    }
  } else if (!symbols_from_text(s, word, wlen)) {
    out->oom = true;
    return;
  }
  for (int i = 1; i < (int)s->n; i++) bpe_try_bigram(v, s, h, i - 1, i, scratch);
  while (h->n && !h->oom) {
    bigram b = heap_pop(h);
    symbol *l = &s->v[b.left], *r = &s->v[b.right];
    if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue;
    l->n += r->n;
    r->n = 0;
    l->next = r->next;
    if (r->next >= 0) s->v[r->next].prev = b.left;
    bpe_try_bigram(v, s, h, l->prev, b.left, scratch);
    bpe_try_bigram(v, s, h, b.left, l->next, scratch);
  }
  if (h->oom) out->oom = true;
  for (size_t i = 0; i < s->n; i++) {
    const symbol *sym = &s->v[i];
    if (sym->n == 0) continue;
    int32_t id = find_token(v, sym->text, sym->n);
    if (id != NO_TOKEN) {
      ids_push(out, id);
      continue;
    }
    for (size_t j = 0; j < sym->n; j++) {
      int32_t b;
      if (v->raw_utf8) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", (unsigned char)sym->text[j]);
        b = find_token(v, hex, 6);
      } else {
        b = find_token(v, sym->text + j, 1);
      }
      if (b != NO_TOKEN) ids_push(out, b);
    }
  }
}

static int bpe_tokenize(const gguf_vocab *v, const char *text, size_t len, ids_vec *out, herr *err) {
  uint32_t *cps = NULL;
  size_t ncp = 0, *lens = NULL, nlens = 0;
  if (!gv_decode(text, len, &cps, &ncp)) return herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
  int rc = gv_split(v->splitter, cps, ncp, &lens, &nlens, err);
  if (rc) {
    free(cps);
    return rc;
  }
  hbuf word = {0}, scratch = {0};
  symbols s = {0};
  bigram_heap h = {0};
  size_t at = 0;
  for (size_t w = 0; w < nlens && !out->oom; w++) {
    hbuf_clear(&word);
    for (size_t i = at; i < at + lens[w]; i++) {
      char u[4];
      int ul = gv_encode(cps[i], u);
      if (v->raw_utf8) {
        hbuf_append(&word, u, (size_t)ul);
        continue;
      }
      for (int k = 0; k < ul; k++) {
        unsigned char b = (unsigned char)u[k];
        hbuf_append(&word, v->byte_utf8[b], v->byte_utf8_len[b]);
      }
    }
    at += lens[w];
    if (word.oom) {
      out->oom = true;
      break;
    }
    bpe_word(v, word.data, word.len, out, &s, &h, &scratch);
  }
  if (scratch.oom) out->oom = true;
  hbuf_free(&word);
  hbuf_free(&scratch);
  free(s.v);
  free(h.v);
  free(lens);
  free(cps);
  return 0;
}

/* ---- WPM ---- */

static bool is_chinese_char(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static void wpm_word(const gguf_vocab *v, const char *word, size_t wlen, ids_vec *out, hbuf *w1) {
  hbuf_clear(w1);
  hbuf_puts(w1, ESCAPED_SPACE);
  hbuf_append(w1, word, wlen);
  if (w1->oom) {
    out->oom = true;
    return;
  }
  int n = (int)w1->len;
  size_t start = out->n;
  for (int i = 0; i < n; ++i) {
    bool match = false;
    int jmax = i + v->max_token_len + 1 < n ? i + v->max_token_len + 1 : n;
    for (int j = jmax; j > i; j--) {
      int32_t id = find_token(v, w1->data + i, (size_t)(j - i));
      if (id != NO_TOKEN) {
        ids_push(out, id);
        match = true;
        i = j - 1;
        break;
      }
    }
    if (!match) {
      out->n = start;
      break;
    }
  }
  if (out->n == start) ids_push(out, v->unk);
}

static void wpm_tokenize(const gguf_vocab *v, const char *text, size_t len, ids_vec *out) {
  uint32_t *cps = NULL;
  size_t ncp = 0;
  if (!gv_decode(text, len, &cps, &ncp)) {
    out->oom = true;
    return;
  }
  hbuf word = {0}, w1 = {0};
  for (size_t i = 0; i <= ncp; i++) {
    bool flush = i == ncp, single = false;
    char u[4];
    int ul = 0;
    if (i < ncp) {
      uint32_t cpt = cps[i];
      if (v->strip_accents) cpt = gv_nfd_first(cpt);
      unsigned f = gv_cpt_flags(cpt);
      if (f & GV_WHITESPACE) {
        flush = true;
      } else if (cpt == 0 || cpt == 0xfffd || (f & GV_CONTROL)) {
        continue;
      } else if (v->strip_accents && (f & GV_MARK)) {
        continue;
      } else {
        ul = gv_encode(v->lowercase ? gv_tolower(cpt) : cpt, u);
        if ((f & GV_PUNCT) || (cpt < 0x7f && (f & GV_SYMBOL)) || is_chinese_char(cpt)) {
          flush = true;
          single = true;
        }
      }
    }
    if (flush && word.len) {
      wpm_word(v, word.data, word.len, out, &w1);
      hbuf_clear(&word);
    }
    if (single) {
      wpm_word(v, u, (size_t)ul, out, &w1);
    } else if (ul) {
      hbuf_append(&word, u, (size_t)ul);
    }
  }
  if (word.oom || w1.oom) out->oom = true;
  hbuf_free(&word);
  hbuf_free(&w1);
  free(cps);
}

/* ---- UGM ---- */

typedef struct norm_piece {
  const char *s;
  size_t len, consumed;
} norm_piece;

static uint32_t xcda_node(const gguf_vocab *v, size_t i, bool *bad) {
  if (i >= v->xcda_size) {
    *bad = true;
    return 0;
  }
  uint32_t x;
  memcpy(&x, v->xcda + i, 4);
  return x;
}

static norm_piece ugm_normalize_prefix(const gguf_vocab *v, const char *in, size_t n, size_t at) {
  norm_piece r = {in + at, 0, 0};
  if (at == n) return r;
  /* user-defined tokens pass through unchanged (longest match) */
  const trie_node *t = v->user_trie;
  size_t longest = 0;
  for (size_t i = at; i < n && t; i++) {
    t = trie_step(t, (unsigned char)in[i]);
    if (t && t->value != NO_TOKEN) longest = i - at + 1;
  }
  if (longest) {
    r.len = r.consumed = longest;
    return r;
  }
  size_t pl = 0, po = 0;
  if (v->xcda_size) {
    bool bad = false;
    uint32_t node = xcda_node(v, 0, &bad);
    uint32_t idx = (node >> 10) << ((node & (1u << 9)) >> 6);
    for (size_t i = at; i < n && !bad; i++) {
      unsigned char c = (unsigned char)in[i];
      if (c == 0) break;
      idx ^= c;
      uint32_t nd = xcda_node(v, idx, &bad);
      if (bad || (nd & ((1u << 31) | 0xff)) != c) break;
      bool leaf = (nd >> 8) & 1;
      idx ^= (nd >> 10) << ((nd & (1u << 9)) >> 6);
      if (leaf) {
        uint32_t vn = xcda_node(v, idx, &bad);
        if (bad) break;
        pl = i - at + 1;
        po = vn & ((1u << 31) - 1);
      }
    }
  }
  if (pl > 0 && po < v->prefix_repl_size) {
    const char *rep = v->prefix_repl + po;
    size_t maxl = v->prefix_repl_size - po, rl = 0;
    while (rl < maxl && rep[rl]) rl++;
    if (rl < maxl) {
      r.s = rep;
      r.len = rl;
      r.consumed = pl;
      return r;
    }
  }
  /* a valid UTF-8 character passes through; a bad byte becomes U+FFFD */
  uint32_t cp;
  size_t cl = gv_decode_one(in + at, n - at, &cp);
  if (cl) {
    r.len = r.consumed = cl;
  } else {
    r.s = "\xef\xbf\xbd";
    r.len = 3;
    r.consumed = 1;
  }
  return r;
}

static bool ugm_normalize(const gguf_vocab *v, const char *in, size_t n, hbuf *out) {
  hbuf_clear(out);
  const char *space = v->escape_ws ? ESCAPED_SPACE : " ";
  bool prepend = !v->treat_ws_as_suffix && v->add_space_prefix;
  bool append = v->treat_ws_as_suffix && v->add_space_prefix;
  bool merge = v->remove_extra_ws;
  bool prepended = false, non_ws = false;
  for (size_t at = 0; at < n;) {
    norm_piece p = ugm_normalize_prefix(v, in, n, at);
    for (size_t i = 0; i < p.len; i++) {
      char c = p.s[i];
      if (c != ' ') {
        if (!non_ws) {
          non_ws = true;
          if ((prepend && !prepended) || merge) {
            hbuf_puts(out, space);
            prepended = true;
          }
        }
        hbuf_putc(out, c);
      } else {
        non_ws = false;
        if (!merge) hbuf_puts(out, space);
      }
    }
    at += p.consumed ? p.consumed : 1;
  }
  if (append) hbuf_puts(out, space);
  return !out->oom;
}

typedef struct best_tok {
  int32_t id;
  size_t from;
  double score;
} best_tok;

static void ugm_tokenize(const gguf_vocab *v, const char *text, size_t len, ids_vec *out) {
  hbuf norm = {0};
  if (!ugm_normalize(v, text, len, &norm)) {
    hbuf_free(&norm);
    out->oom = true;
    return;
  }
  size_t n = norm.len;
  if (n == 0) {
    hbuf_free(&norm);
    return;
  }
  const char *s = norm.data;
  best_tok *best = malloc((n + 1) * sizeof *best);
  if (!best) {
    hbuf_free(&norm);
    out->oom = true;
    return;
  }
  for (size_t i = 0; i <= n; i++) best[i] = (best_tok){v->unk, 0, -DBL_MAX};
  best[0] = (best_tok){v->unk, 0, 0};
  for (size_t at = 0; at < n;) {
    size_t cl = utf8_len_lead((unsigned char)s[at]);
    if (cl > n - at) cl = n - at;
    bool single_found = false;
    const best_tok cur = best[at];
    size_t p = at;
    const trie_node *t = trie_step(v->token_trie, (unsigned char)s[p++]);
    while (p <= n && t) {
      if (t->value != NO_TOKEN) {
        if (p - at == cl) single_found = true;
        int32_t id = t->value;
        double sc = (v->attr[id] & ATTR_USER_DEFINED) ? 0.0 : (double)v->score[id];
        double ch = cur.score + sc;
        if (ch > best[p].score) best[p] = (best_tok){id, at, ch};
      }
      if (p >= n) break;
      t = trie_step(t, (unsigned char)s[p++]);
    }
    if (!single_found) {
      double ch = cur.score + v->unknown_score;
      size_t e = at + cl;
      if (ch > best[e].score) best[e] = (best_tok){v->unk, at, ch};
    }
    at += cl;
  }
  size_t start = out->n;
  bool prev_unk = false;
  for (size_t i = n;;) {
    const best_tok *b = &best[i];
    bool is_unk = b->id == v->unk;
    if (!(prev_unk && is_unk)) ids_push(out, b->id);
    if (b->from == 0) break;
    prev_unk = is_unk;
    i = b->from;
  }
  if (!out->oom)
    for (size_t a = start, z = out->n; a + 1 < z; a++, z--) {
      int32_t tmp = out->v[a];
      out->v[a] = out->v[z - 1];
      out->v[z - 1] = tmp;
    }
  free(best);
  hbuf_free(&norm);
}

/* ---- special-token partition ---- */

typedef struct fragment {
  int32_t token; /* NO_TOKEN for raw text */
  size_t off, len;
} fragment;

typedef struct frag_vec {
  fragment *v;
  size_t n, cap;
  bool oom;
} frag_vec;

static void frag_push(frag_vec *f, fragment x) {
  if (f->oom) return;
  if (f->n == f->cap && !HGROW(f->v, f->cap, f->n + 1)) {
    f->oom = true;
    return;
  }
  f->v[f->n++] = x;
}

static const char *find_bytes(const char *hay, size_t hn, const char *nd, size_t nn) {
  if (nn == 0 || nn > hn) return NULL;
  return memmem(hay, hn, nd, nn);
}

/* Splits text around special tokens, longest first, as llama.cpp's tokenizer_st_partition. */
static bool partition(const gguf_vocab *v, const char *text, size_t len, bool parse_special, const int32_t *lit,
                      size_t nlit, frag_vec *out) {
  out->n = 0;
  if (len == 0) return true;
  frag_push(out, (fragment){NO_TOKEN, 0, len});
  /* which byte pairs occur in the text: a special token with a pair that does not cannot match */
  uint8_t *pairs = calloc(8192, 1);
  if (!pairs) return false;
  for (size_t i = 0; i + 1 < len; i++) {
    unsigned p = (unsigned)(unsigned char)text[i] << 8 | (unsigned char)text[i + 1];
    pairs[p >> 3] |= (uint8_t)(1u << (p & 7));
  }
  frag_vec next = {0};
  for (size_t k = 0; k < v->nspecial && !out->oom; k++) {
    int32_t id = v->special[k];
    uint32_t a = v->attr[id];
    if (!parse_special && (a & (ATTR_CONTROL | ATTR_UNKNOWN))) continue;
    bool literal = false;
    for (size_t i = 0; !parse_special && i < nlit; i++) literal = literal || lit[i] == id;
    if (literal) continue;
    const char *tt = tok_text(v, id);
    size_t tl = v->len[id];
    if (tl > len) continue;
    bool possible = true;
    for (size_t i = 0; i + 1 < tl && possible; i++) {
      unsigned p = (unsigned)(unsigned char)tt[i] << 8 | (unsigned char)tt[i + 1];
      if (!(pairs[p >> 3] & (1u << (p & 7)))) possible = false;
    }
    if (!possible) continue;
    bool any = false;
    for (size_t f = 0; f < out->n && !any; f++)
      if (out->v[f].token == NO_TOKEN && find_bytes(text + out->v[f].off, out->v[f].len, tt, tl)) any = true;
    if (!any) continue;
    next.n = 0;
    for (size_t f = 0; f < out->n; f++) {
      fragment fr = out->v[f];
      if (fr.token != NO_TOKEN) {
        frag_push(&next, fr);
        continue;
      }
      size_t off = fr.off, flen = fr.len;
      for (;;) {
        const char *m = find_bytes(text + off, flen, tt, tl);
        if (!m) {
          if (flen > 0) frag_push(&next, (fragment){NO_TOKEN, off, flen});
          break;
        }
        size_t mpos = (size_t)(m - text);
        if (mpos > off) {
          size_t ll = mpos - off;
          if (a & ATTR_LSTRIP)
            while (ll > 0 && isspace((unsigned char)text[off + ll - 1])) ll--;
          if (ll > 0) frag_push(&next, (fragment){NO_TOKEN, off, ll});
        }
        frag_push(&next, (fragment){id, 0, 0});
        size_t end = mpos + tl;
        if (end < off + flen) {
          size_t roff = end, rlen = off + flen - end;
          if (a & ATTR_RSTRIP)
            while (rlen > 0 && isspace((unsigned char)text[roff])) {
              roff++;
              rlen--;
            }
          off = roff;
          flen = rlen;
          if (flen == 0) break;
        } else {
          break;
        }
      }
    }
    if (next.oom) {
      out->oom = true;
      break;
    }
    frag_vec tmp = *out;
    *out = next;
    next = tmp;
  }
  free(next.v);
  free(pairs);
  return !out->oom;
}

/* ---- encode ---- */

int gguf_vocab_encode(const gguf_vocab *v, const char *text, size_t len, bool add_special, bool parse_special, int32_t **ids,
                      size_t *n, herr *err) {
  return gguf_vocab_encode_ex(v, text, len, add_special, parse_special, NULL, 0, ids, n, err);
}

int gguf_vocab_encode_ex(const gguf_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                         const int32_t *lit, size_t nlit, int32_t **ids, size_t *n, herr *err) {
  *ids = NULL;
  *n = 0;
  frag_vec frags = {0};
  ids_vec out = {0};
  hbuf buf = {0};
  int rc = 0;
  if (!partition(v, text, len, parse_special, lit, nlit, &frags)) {
    rc = herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
    goto done;
  }
  switch (v->type) {
    case VT_SPM: {
      bool prev_special = true;
      if (add_special && v->add_bos) ids_push(&out, v->bos);
      for (size_t f = 0; f < frags.n; f++) {
        const fragment *fr = &frags.v[f];
        if (fr->token != NO_TOKEN) {
          ids_push(&out, fr->token);
          prev_special = true;
          continue;
        }
        hbuf_clear(&buf);
        if (v->add_space_prefix && prev_special) hbuf_puts(&buf, ESCAPED_SPACE);
        for (size_t i = 0; i < fr->len; i++) {
          char c = text[fr->off + i];
          if (c == ' ') hbuf_puts(&buf, ESCAPED_SPACE);
          else hbuf_putc(&buf, c);
        }
        if (buf.oom) {
          out.oom = true;
          break;
        }
        spm_tokenize(v, buf.data, buf.len, &out);
        prev_special = false;
      }
      if (add_special && v->add_eos) ids_push(&out, v->eos);
      break;
    }
    case VT_BPE: {
      if (add_special && v->add_bos) ids_push(&out, v->bos);
      for (size_t f = 0; f < frags.n && !rc; f++) {
        const fragment *fr = &frags.v[f];
        if (fr->token != NO_TOKEN) {
          ids_push(&out, fr->token);
          continue;
        }
        if (v->escape_ws) {
          hbuf_clear(&buf);
          for (size_t i = 0; i < fr->len; i++) {
            char c = text[fr->off + i];
            if (c == ' ') hbuf_puts(&buf, ESCAPED_SPACE);
            else hbuf_putc(&buf, c);
          }
          if (buf.oom) {
            out.oom = true;
            break;
          }
          rc = bpe_tokenize(v, buf.data, buf.len, &out, err);
        } else {
          rc = bpe_tokenize(v, text + fr->off, fr->len, &out, err);
        }
      }
      if (add_special && v->add_eos) ids_push(&out, v->eos);
      break;
    }
    case VT_WPM: {
      if (add_special) ids_push(&out, v->bos);
      for (size_t f = 0; f < frags.n; f++) {
        const fragment *fr = &frags.v[f];
        if (fr->token != NO_TOKEN) ids_push(&out, fr->token);
        else wpm_tokenize(v, text + fr->off, fr->len, &out);
      }
      if (add_special) ids_push(&out, v->sep);
      break;
    }
    case VT_UGM: {
      if (add_special && v->add_bos) ids_push(&out, v->bos);
      for (size_t f = 0; f < frags.n; f++) {
        const fragment *fr = &frags.v[f];
        if (fr->token != NO_TOKEN) ids_push(&out, fr->token);
        else ugm_tokenize(v, text + fr->off, fr->len, &out);
      }
      if (add_special && v->add_eos) ids_push(&out, v->eos);
      break;
    }
    default: rc = herr_set(err, HEARTH_EINTERNAL, "tokenizer: unknown vocabulary type"); break;
  }
  if (!rc && out.oom) rc = herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
  if (!rc) {
    /* a NO_TOKEN can only come from an absent special id (e.g. BOS); drop it */
    size_t k = 0;
    for (size_t i = 0; i < out.n; i++)
      if (out.v[i] >= 0) out.v[k++] = out.v[i];
    out.n = k;
  }
done:
  free(frags.v);
  hbuf_free(&buf);
  if (rc) {
    free(out.v);
    return rc;
  }
  if (!out.v) out.v = malloc(sizeof(int32_t)); /* an empty result is still a valid pointer */
  if (!out.v) return herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
  *ids = out.v;
  *n = out.n;
  return 0;
}

/* ---- decode ---- */

int gguf_vocab_decode(const gguf_vocab *v, const int32_t *ids, size_t n, bool skip_special, hbuf *out, herr *err) {
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= v->n)
      return herr_set(err, HEARTH_EINVAL, "tokenizer: token id %" PRId32 " is outside the vocabulary (0..%" PRId32 ")", ids[i],
                      v->n - 1);
  bool remove_space = v->add_space_prefix;
  if (skip_special && v->add_bos && n > 0 && ids[0] == v->bos) {
    remove_space = false;
    ids++;
    n--;
  }
  if (skip_special && v->add_eos && n > 0 && ids[n - 1] == v->eos) n--;
  hbuf text = {0};
  for (size_t i = 0; i < n; i++) {
    int32_t id = ids[i];
    bool show = !(skip_special && (v->attr[id] & (ATTR_UNKNOWN | ATTR_CONTROL)));
    if (show) {
      const char *p = v->pieces + v->piece_off[id];
      size_t pl = v->piece_off[id + 1] - v->piece_off[id];
      if (remove_space && pl && *p == ' ') {
        p++;
        pl--;
      }
      hbuf_append(&text, p, pl);
    }
    remove_space = false;
  }
  if (text.oom) {
    hbuf_free(&text);
    return herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
  }
  char *t = text.data;
  size_t total = text.len;
  if (v->clean_spaces && total) {
    /* " ?", " !", " .", " ," lose the space */
    size_t t1 = total;
    total = 1;
    for (size_t i = 1; i < t1; i++) {
      char x = t[i];
      if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ','))
        total--;
      t[total++] = x;
    }
    /* " ' " becomes "'" */
    size_t t2 = total;
    total = 1;
    for (size_t i = 1; i < t2; i++) {
      char x = t[i];
      if (x == '\'' && i + 1 < t2 && t[i - 1] == ' ' && t[i + 1] == ' ') {
        total--;
        t[++i] = '\0';
      }
      t[total++] = x;
    }
    /* " 's", " 'm", " 're", " 've" lose the space */
    size_t t3 = total;
    total = 1;
    for (size_t i = 1; i < t3; i++) {
      char x = t[i];
      if (t[i - 1] == ' ' && x == '\'' && i + 1 < t3) {
        char x1 = t[i + 1];
        if (x1 == 's' || x1 == 'm') {
          total--;
        } else if (x1 != 't' && x1 != 'd' && i + 2 < t3) {
          char x2 = t[i + 2];
          if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) total--;
        }
      }
      t[total++] = x;
    }
  }
  hbuf_append(out, t, total);
  hbuf_free(&text);
  if (out->oom) return herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
  return 0;
}

/* ---- accessors ---- */

int32_t gguf_vocab_size(const gguf_vocab *v) { return v->n; }
const char *gguf_vocab_token(const gguf_vocab *v, int32_t id) { return (id >= 0 && id < v->n) ? tok_text(v, id) : NULL; }
int32_t gguf_vocab_find(const gguf_vocab *v, const char *token) { return token ? find_token(v, token, strlen(token)) : NO_TOKEN; }
bool gguf_vocab_is_special(const gguf_vocab *v, int32_t id) {
  return id >= 0 && id < v->n && (v->attr[id] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN));
}
int32_t gguf_vocab_bos(const gguf_vocab *v) { return v->bos; }
int32_t gguf_vocab_eos(const gguf_vocab *v) { return v->eos; }
bool gguf_vocab_is_eog(const gguf_vocab *v, int32_t id) { return id >= 0 && id < v->n && v->eog[id]; }
bool gguf_vocab_add_bos(const gguf_vocab *v) { return v->add_bos; }
bool gguf_vocab_add_eos(const gguf_vocab *v) { return v->add_eos; }
const char *gguf_vocab_model(const gguf_vocab *v) { return v->model; }

int gguf_vocab_piece(const gguf_vocab *v, int32_t id, bool special, const char **s, size_t *len, herr *err) {
  *s = "";
  *len = 0;
  if (id < 0 || id >= v->n)
    return herr_set(err, HEARTH_EINVAL, "tokenizer: token id %" PRId32 " is outside the vocabulary (0..%" PRId32 ")", id, v->n - 1);
  if (!special && (v->attr[id] & (ATTR_UNKNOWN | ATTR_CONTROL))) return 0;
  *s = v->pieces + v->piece_off[id];
  *len = v->piece_off[id + 1] - v->piece_off[id];
  return 0;
}

void gguf_vocab_free(gguf_vocab *v) {
  if (!v) return;
  free(v->model);
  free(v->arena);
  free(v->off);
  free(v->len);
  free(v->score);
  free(v->attr);
  free(v->eog);
  hdict_free(&v->index);
  hdict_free(&v->ranks);
  free(v->special);
  free(v->pieces);
  free(v->piece_off);
  gv_splitter_free(v->splitter);
  free(v->charsmap);
  trie_free(v->token_trie);
  trie_free(v->user_trie);
  free(v);
}


/* ---- loading ---- */

static int opt_bool(const gguf_file *g, const char *key, bool *out, herr *err) {
  const gguf_kv *kv = gguf_find_kv(g, key);
  if (!kv) return 0;
  if (kv->type != GGUF_TYPE_BOOL)
    return herr_set(err, HEARTH_EFORMAT, "%s: key '%s' is %s, expected bool", gguf_path(g), key, gguf_type_name(kv->type));
  *out = kv->v.b;
  return 0;
}

static int opt_string(const gguf_file *g, const char *key, char **out, herr *err) {
  *out = NULL;
  if (!gguf_has(g, key)) return 0;
  return gguf_get_strdup(g, key, out, err);
}

/* Reads an optional token id key: out-of-range values keep the default, as llama.cpp does. */
static int read_special_id(const gguf_file *g, const char *key, int32_t n, int32_t *id, herr *err) {
  if (*id >= n) *id = NO_TOKEN;
  int64_t v = -1;
  if (!gguf_has(g, key)) return 0;
  int rc = gguf_get_int(g, key, &v, err);
  if (rc) return rc;
  if (v >= 0 && v < n) *id = (int32_t)v;
  return 0;
}

static void build_byte_maps(gguf_vocab *v) {
  int extra = 0;
  for (int i = 0; i < 512; i++) v->cp_byte[i] = -1;
  for (int b = 0; b < 256; b++) {
    uint32_t cp;
    if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)) cp = (uint32_t)b;
    else cp = 256 + (uint32_t)extra++;
    v->byte_utf8_len[b] = (uint8_t)gv_encode(cp, v->byte_utf8[b]);
    v->cp_byte[cp] = (int16_t)b;
  }
}

static bool text_in(const char *t, const char *const *list) {
  for (; *list; list++)
    if (strcmp(t, *list) == 0) return true;
  return false;
}

/* llama.cpp's fix-ups of token attributes by token text. */
static void fix_attributes(gguf_vocab *v) {
  static const char *const control_like[] = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
      "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "<end_of_utterance>", "<|eom_id|>",
      "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>",
      "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
      "<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>", "<SUF>", "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>",
      "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>",
      "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>", "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
      "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>", NULL};
  static const char *const eog_texts[] = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
      "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>",
      "<eos>", "<turn|>", "<|tool_response>", "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "[e~[", NULL};
  static const char *const always_shown[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};
  static const char *const eot_texts[] = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
      "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "<end_of_utterance>", NULL};
  for (int32_t id = 0; id < v->n; id++) {
    const char *t = tok_text(v, id);
    if (text_in(t, control_like)) v->attr[id] |= ATTR_CONTROL;
    if (v->eot == NO_TOKEN && text_in(t, eot_texts)) v->eot = id;
    if (v->eom == NO_TOKEN && strcmp(t, "<|eom_id|>") == 0) v->eom = id;
  }
  int32_t end_id = NO_TOKEN, s_id = NO_TOKEN;
  bool has_return = false, has_call = false, has_flush = false, has_tool_response = false;
  for (int32_t id = 0; id < v->n; id++) {
    const char *t = tok_text(v, id);
    uint32_t *a = &v->attr[id];
    if ((*a & ATTR_CONTROL) && strstr(t, "unused")) *a |= ATTR_UNUSED;
    if (text_in(t, eog_texts)) {
      v->eog[id] = 1;
      *a |= ATTR_CONTROL;
    }
    if (text_in(t, always_shown)) *a = ATTR_USER_DEFINED;
  }
  if (v->eos != NO_TOKEN) v->eog[v->eos] = 1;
  if (v->eot != NO_TOKEN) v->eog[v->eot] = 1;
  if (v->eom != NO_TOKEN) v->eog[v->eom] = 1;
  for (int32_t id = 0; id < v->n; id++) {
    if (!v->eog[id]) continue;
    const char *t = tok_text(v, id);
    if (strcmp(t, "<|return|>") == 0) has_return = true;
    else if (strcmp(t, "<|call|>") == 0 || strcmp(t, "<|calls|>") == 0) has_call = true;
    else if (strcmp(t, "<|flush|>") == 0) has_flush = true;
    else if (strcmp(t, "<|end|>") == 0) end_id = id;
    if (strcmp(t, "<|tool_response>") == 0) has_tool_response = true;
    else if (strcmp(t, "</s>") == 0) s_id = id;
  }
  if (end_id != NO_TOKEN && ((has_return && has_call) || (has_call && has_flush))) {
    v->eog[end_id] = 0;
    v->attr[end_id] = ATTR_USER_DEFINED;
  }
  if (has_tool_response && s_id != NO_TOKEN) {
    v->eog[s_id] = 0;
    v->attr[s_id] = ATTR_NORMAL;
  }
}

static int cmp_special(const void *a, const void *b, void *ctx) {
  const gguf_vocab *v = ctx;
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  if (v->len[x] != v->len[y]) return v->len[x] > v->len[y] ? -1 : 1;
  return x < y ? -1 : x > y;
}

static uint8_t hex_value(char c) {
  if (c >= '0' && c <= '9') return (uint8_t)(c - '0');
  if (c >= 'a' && c <= 'f') return (uint8_t)(c - 'a' + 10);
  if (c >= 'A' && c <= 'F') return (uint8_t)(c - 'A' + 10);
  return 0;
}

/* The piece of one token with special tokens rendered (llama.cpp's token_to_piece cache). */
static void token_piece(const gguf_vocab *v, int32_t id, hbuf *out) {
  const char *t = tok_text(v, id);
  size_t tl = v->len[id];
  uint32_t a = v->attr[id];
  if (a & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)) {
    hbuf_append(out, t, tl);
  } else if (a & ATTR_NORMAL) {
    if (v->type != VT_BPE || v->escape_ws) {
      for (size_t i = 0; i < tl;) {
        if (i + 3 <= tl && memcmp(t + i, ESCAPED_SPACE, 3) == 0) {
          hbuf_putc(out, ' ');
          i += 3;
        } else {
          hbuf_putc(out, t[i++]);
        }
      }
    } else {
      for (size_t i = 0; i < tl;) {
        uint32_t cp;
        size_t l = gv_decode_one(t + i, tl - i, &cp);
        if (!l) {
          cp = 0xfffd;
          l = 1;
        }
        if (cp < 512 && v->cp_byte[cp] >= 0) {
          hbuf_putc(out, (char)v->cp_byte[cp]);
        } else {
          char u[4];
          int ul = gv_encode(cp, u);
          hbuf_puts(out, "[UNK_BYTE_0x");
          for (int k = 0; k < ul; k++) hbuf_printf(out, "%02x", (unsigned char)u[k]);
          hbuf_append(out, t, tl);
          hbuf_putc(out, ']');
        }
        i += l;
      }
    }
  } else if (a & ATTR_BYTE) {
    char b = (char)((tl >= 5) ? (hex_value(t[3]) << 4 | hex_value(t[4])) : 0);
    hbuf_putc(out, b);
  }
}

static int load_charsmap(gguf_vocab *v, const gguf_file *g, herr *err) {
  const char *key = "tokenizer.ggml.precompiled_charsmap";
  const gguf_kv *kv = gguf_find_kv(g, key);
  if (!kv) return 0;
  if (kv->type != GGUF_TYPE_ARRAY || (kv->v.arr.type != GGUF_TYPE_UINT8 && kv->v.arr.type != GGUF_TYPE_INT8))
    return herr_set(err, HEARTH_EFORMAT, "%s: key '%s' must be an array of u8 or i8", gguf_path(g), key);
  size_t n = (size_t)kv->v.arr.n;
  if (n < 4) return herr_set(err, HEARTH_EFORMAT, "%s: key '%s' is too small (%zu bytes)", gguf_path(g), key, n);
  v->charsmap = malloc(n);
  if (!v->charsmap) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", gguf_path(g));
  memcpy(v->charsmap, kv->v.arr.raw, n);
  v->charsmap_size = n;
  uint32_t blob;
  memcpy(&blob, v->charsmap, 4);
  if ((uint64_t)blob + 4 >= n)
    return herr_set(err, HEARTH_EFORMAT, "%s: key '%s': XCDA size %u exceeds the %zu bytes of the map", gguf_path(g), key, blob, n);
  v->xcda = (const uint32_t *)(const void *)(v->charsmap + 4);
  v->xcda_size = blob / 4;
  v->prefix_repl = (const char *)v->charsmap + 4 + blob;
  v->prefix_repl_size = n - 4 - blob;
  return 0;
}

static int build_ugm(gguf_vocab *v, herr *err) {
  v->token_trie = trie_new();
  v->user_trie = trie_new();
  if (!v->token_trie || !v->user_trie) return herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
  float min_score = FLT_MAX;
  for (int32_t id = 0; id < v->n; id++) {
    uint32_t a = v->attr[id];
    if ((a & ATTR_NORMAL) && v->score[id] < min_score) min_score = v->score[id];
    if ((a & (ATTR_NORMAL | ATTR_USER_DEFINED | ATTR_UNUSED)) && !trie_insert(v->token_trie, tok_text(v, id), v->len[id], id))
      return herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
    if ((a & ATTR_USER_DEFINED) && !trie_insert(v->user_trie, tok_text(v, id), v->len[id], id))
      return herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
  }
  v->unknown_score = (double)min_score - 10.0;
  return 0;
}

static int load_vocab(gguf_vocab *v, const gguf_file *g, const char *what, herr *err) {
  int rc;
  char *pre = NULL;
  if ((rc = gguf_get_strdup(g, "tokenizer.ggml.model", &v->model, err))) return rc;
  if ((rc = opt_string(g, "tokenizer.ggml.pre", &pre, err))) return rc;
  const char *m = v->model;
  const gv_pre *pd = NULL;
  v->escape_ws = true;
  if (strcmp(m, "llama") == 0) {
    v->type = VT_SPM;
    v->bos = 1, v->eos = 2, v->unk = 0, v->sep = v->pad = v->mask = NO_TOKEN;
    v->add_space_prefix = true, v->add_bos = true;
  } else if (strcmp(m, "bert") == 0) {
    v->type = VT_WPM;
    v->bos = 101, v->eos = NO_TOKEN, v->unk = 100, v->sep = 102, v->pad = 0, v->mask = 103;
    v->add_sep = true, v->add_bos = true, v->clean_spaces = true;
  } else if (strcmp(m, "gpt2") == 0 || strcmp(m, "gemma4") == 0) {
    v->type = VT_BPE;
    bool gemma4 = strcmp(m, "gemma4") == 0;
    v->bos = v->eos = gemma4 ? NO_TOKEN : 11;
    v->unk = v->sep = v->pad = v->mask = NO_TOKEN;
    v->escape_ws = false, v->clean_spaces = true;
    pd = gv_find_pre(gemma4 ? "gemma4" : pre && *pre ? pre : "default");
    if (!pd) {
      rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: tokenizer.ggml.pre '%s' is not a supported pre-tokenizer", what, pre);
      free(pre);
      return rc;
    }
    if (pd->flags & GV_PRE_NOCLEAN) v->clean_spaces = false;
    if (pd->flags & GV_PRE_IGNORE_MERGES) v->ignore_merges = true;
    if (pd->flags & GV_PRE_ADD_BOS) v->add_bos = true;
    if (pd->flags & GV_PRE_ADD_SEP) v->add_sep = true;
    if (pd->flags & GV_PRE_NO_BOS) v->bos = NO_TOKEN;
    if (pd->flags & GV_PRE_ESCAPE_WS) v->escape_ws = true;
    if (pd->flags & GV_PRE_RAW_UTF8) v->raw_utf8 = true;
    if (pd->flags & GV_PRE_NEWLINE_WORDS) v->newline_words = true;
  } else if (strcmp(m, "t5") == 0) {
    v->type = VT_UGM;
    v->bos = NO_TOKEN, v->eos = 1, v->unk = 2, v->sep = NO_TOKEN, v->pad = 0, v->mask = NO_TOKEN;
    v->add_eos = true;
  } else {
    rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: tokenizer.ggml.model '%s' is not supported (llama, gpt2, gemma4, bert, t5 are)",
                  what, m);
    free(pre);
    return rc;
  }
  free(pre);
  v->eot = v->eom = NO_TOKEN;
  v->lowercase = true;
  if ((rc = opt_bool(g, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix, err))) return rc;
  if ((rc = opt_bool(g, "tokenizer.ggml.remove_extra_whitespaces", &v->remove_extra_ws, err))) return rc;

  gguf_arr toks;
  if ((rc = gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, err))) return rc;
  if (toks.type != GGUF_TYPE_STRING)
    return herr_set(err, HEARTH_EFORMAT, "%s: key 'tokenizer.ggml.tokens' must be an array of strings", what);
  if (toks.n == 0 || toks.n > INT32_MAX)
    return herr_set(err, HEARTH_EFORMAT, "%s: key 'tokenizer.ggml.tokens' has %" PRIu64 " tokens", what, toks.n);
  int32_t n = (int32_t)toks.n;
  v->n = n;
  gguf_arr scores = {0}, types = {0};
  bool has_scores = false, has_types = false;
  if (gguf_has(g, "tokenizer.ggml.scores")) {
    if ((rc = gguf_get_arr(g, "tokenizer.ggml.scores", &scores, err))) return rc;
    if (scores.type != GGUF_TYPE_FLOAT32 && scores.type != GGUF_TYPE_INT32)
      return herr_set(err, HEARTH_EFORMAT, "%s: key 'tokenizer.ggml.scores' must be an array of f32 or i32", what);
    if (scores.n < toks.n)
      return herr_set(err, HEARTH_EFORMAT, "%s: key 'tokenizer.ggml.scores' has %" PRIu64 " entries for %" PRId32 " tokens", what,
                      scores.n, n);
    has_scores = true;
  }
  if (gguf_has(g, "tokenizer.ggml.token_type")) {
    if ((rc = gguf_get_arr(g, "tokenizer.ggml.token_type", &types, err))) return rc;
    if (types.type != GGUF_TYPE_INT32)
      return herr_set(err, HEARTH_EFORMAT, "%s: key 'tokenizer.ggml.token_type' must be an array of i32", what);
    if (types.n < toks.n)
      return herr_set(err, HEARTH_EFORMAT, "%s: key 'tokenizer.ggml.token_type' has %" PRIu64 " entries for %" PRId32 " tokens",
                      what, types.n, n);
    has_types = true;
  }

  size_t total = 0;
  for (int32_t i = 0; i < n; i++) {
    size_t l;
    gguf_arr_str(&toks, (uint64_t)i, &l);
    total += (l ? l : 32) + 1;
  }
  v->arena = malloc(total);
  v->off = malloc((size_t)n * sizeof *v->off);
  v->len = malloc((size_t)n * sizeof *v->len);
  v->score = malloc((size_t)n * sizeof *v->score);
  v->attr = malloc((size_t)n * sizeof *v->attr);
  v->eog = calloc((size_t)n, 1);
  if (!v->arena || !v->off || !v->len || !v->score || !v->attr || !v->eog) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  size_t at = 0;
  for (int32_t i = 0; i < n; i++) {
    size_t l;
    const char *s = gguf_arr_str(&toks, (uint64_t)i, &l);
    v->off[i] = at;
    if (l == 0) l = (size_t)snprintf(v->arena + at, 32, "[EMPTY_%" PRId32 "]", i);
    else memcpy(v->arena + at, s, l);
    v->arena[at + l] = 0;
    if (l > UINT32_MAX) return herr_set(err, HEARTH_EFORMAT, "%s: token %" PRId32 " is too long", what, i);
    v->len[i] = (uint32_t)l;
    at += l + 1;
    int64_t prev;
    if (hdict_get(&v->index, v->arena + v->off[i], l, &prev))
      return herr_set(err, HEARTH_EFORMAT, "%s: token '%.64s' appears twice in the vocabulary (ids %" PRId64 " and %" PRId32 ")", what,
                      v->arena + v->off[i], prev, i);
    if (!hdict_put(&v->index, v->arena + v->off[i], l, i)) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
    if ((int)l > v->max_token_len) v->max_token_len = (int)l;
    v->score[i] = !has_scores ? 0.0f : scores.type == GGUF_TYPE_FLOAT32 ? (float)gguf_arr_float(&scores, (uint64_t)i)
                                                                        : (float)gguf_arr_int(&scores, (uint64_t)i);
    uint32_t a = ATTR_NORMAL;
    if (has_types) {
      switch (gguf_arr_int(&types, (uint64_t)i)) {
        case TT_UNKNOWN: a = ATTR_UNKNOWN; break;
        case TT_UNUSED: a = ATTR_UNUSED; break;
        case TT_NORMAL: a = ATTR_NORMAL; break;
        case TT_CONTROL: a = ATTR_CONTROL; break;
        case TT_USER_DEFINED: a = ATTR_USER_DEFINED; break;
        case TT_BYTE: a = ATTR_BYTE; break;
        default: a = 0; break;
      }
    }
    v->attr[i] = a;
  }

  if (v->type == VT_BPE) {
    gguf_arr merges;
    if ((rc = gguf_get_arr(g, "tokenizer.ggml.merges", &merges, err))) return rc;
    if (merges.type != GGUF_TYPE_STRING)
      return herr_set(err, HEARTH_EFORMAT, "%s: key 'tokenizer.ggml.merges' must be an array of strings", what);
    for (uint64_t i = 0; i < merges.n && i <= INT32_MAX; i++) {
      size_t l;
      const char *s = gguf_arr_str(&merges, i, &l);
      const char *sp = l > 1 ? memchr(s + 1, ' ', l - 1) : NULL;
      if (!sp) continue;
      int64_t dummy;
      if (hdict_get(&v->ranks, s, l, &dummy)) continue;
      if (!hdict_put(&v->ranks, s, l, (int64_t)i)) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
    }
    build_byte_maps(v);
    const char *const *rx = pd->regexes;
    size_t nrx = 0;
    while (rx[nrx]) nrx++;
    if ((rc = gv_splitter_new(rx, nrx, &v->splitter, err))) return herr_wrap(err, "%s", what);
  }
  if (v->type == VT_UGM && (rc = load_charsmap(v, g, err))) return rc;

  if ((rc = read_special_id(g, "tokenizer.ggml.bos_token_id", n, &v->bos, err)) ||
      (rc = read_special_id(g, "tokenizer.ggml.eos_token_id", n, &v->eos, err)) ||
      (rc = read_special_id(g, "tokenizer.ggml.eot_token_id", n, &v->eot, err)) ||
      (rc = read_special_id(g, "tokenizer.ggml.eom_token_id", n, &v->eom, err)) ||
      (rc = read_special_id(g, "tokenizer.ggml.unknown_token_id", n, &v->unk, err)) ||
      (rc = read_special_id(g, "tokenizer.ggml.seperator_token_id", n, &v->sep, err)) ||
      (rc = read_special_id(g, "tokenizer.ggml.padding_token_id", n, &v->pad, err)) ||
      (rc = read_special_id(g, "tokenizer.ggml.mask_token_id", n, &v->mask, err)))
    return rc;
  if ((rc = opt_bool(g, "tokenizer.ggml.add_bos_token", &v->add_bos, err)) ||
      (rc = opt_bool(g, "tokenizer.ggml.add_eos_token", &v->add_eos, err)) ||
      (rc = opt_bool(g, "tokenizer.ggml.add_sep_token", &v->add_sep, err)))
    return rc;
  if (v->newline_words) v->add_bos = true; /* llama.cpp: Gemma 4 always starts with BOS */
  if (v->add_bos && v->bos == NO_TOKEN)
    return herr_set(err, HEARTH_EFORMAT, "%s: tokenizer.ggml.add_bos_token is true but there is no BOS token", what);
  if (v->add_eos && v->eos == NO_TOKEN)
    return herr_set(err, HEARTH_EFORMAT, "%s: tokenizer.ggml.add_eos_token is true but there is no EOS token", what);
  if (v->add_sep && v->sep == NO_TOKEN)
    return herr_set(err, HEARTH_EFORMAT, "%s: tokenizer.ggml.add_sep_token is true but there is no separator token", what);
  if ((rc = opt_bool(g, "tokenizer.ggml.normalizer.lowercase", &v->lowercase, err))) return rc;
  v->strip_accents = v->lowercase;
  if ((rc = opt_bool(g, "tokenizer.ggml.normalizer.strip_accents", &v->strip_accents, err))) return rc;
  if (v->type == VT_WPM && v->unk == NO_TOKEN)
    return herr_set(err, HEARTH_EFORMAT, "%s: a bert vocabulary needs an unknown token", what);
  if (v->type == VT_UGM && v->unk == NO_TOKEN)
    return herr_set(err, HEARTH_EFORMAT, "%s: a t5 vocabulary needs an unknown token", what);

  fix_attributes(v);

  /* special tokens, longest text first */
  size_t ns = 0;
  for (int32_t i = 0; i < n; i++)
    if (v->attr[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) ns++;
  v->special = malloc((ns ? ns : 1) * sizeof *v->special);
  if (!v->special) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  for (int32_t i = 0; i < n; i++)
    if (v->attr[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) v->special[v->nspecial++] = i;
  qsort_r(v->special, v->nspecial, sizeof *v->special, cmp_special, v);

  /* pieces */
  hbuf pieces = {0};
  v->piece_off = malloc(((size_t)n + 1) * sizeof *v->piece_off);
  if (!v->piece_off) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  for (int32_t i = 0; i < n; i++) {
    v->piece_off[i] = pieces.len;
    token_piece(v, i, &pieces);
  }
  v->piece_off[n] = pieces.len;
  hbuf_putc(&pieces, 0);
  if (pieces.oom) {
    hbuf_free(&pieces);
    return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  }
  v->pieces = hbuf_take(&pieces);

  /* per-model attributes that only change how special tokens split text */
  char *name = NULL, *arch = NULL;
  if ((rc = opt_string(g, "general.name", &name, NULL))) name = NULL;
  if ((rc = opt_string(g, "general.architecture", &arch, NULL))) arch = NULL;
  if (name)
    for (char *p = name; *p; p++) *p = (char)tolower((unsigned char)*p);
  const char *pre_name = NULL;
  size_t pre_len = 0;
  if (gguf_get_str(g, "tokenizer.ggml.pre", &pre_name, &pre_len, NULL)) pre_name = NULL;
  bool jina = false;
  if (pre_name) {
    static const char *const jinas[] = {"jina-v2-de", "jina-v2-es", "jina-v2-code"};
    for (int k = 0; k < 3; k++)
      if (pre_len >= strlen(jinas[k]) && memmem(pre_name, pre_len, jinas[k], strlen(jinas[k]))) jina = true;
  }
  if (arch && (strstr(arch, "nomic-bert-moe") || strstr(arch, "jina-bert-v3"))) jina = true;
  if (jina) {
    int32_t id = gguf_vocab_find(v, "<mask>");
    if (id >= 0) v->attr[id] |= ATTR_LSTRIP;
  } else if (name && (strstr(name, "phi-3") || strstr(name, "phi3"))) {
    for (size_t k = 0; k < v->nspecial; k++) v->attr[v->special[k]] |= ATTR_RSTRIP;
    int32_t id = gguf_vocab_find(v, "</s>");
    if (id >= 0) v->attr[id] |= ATTR_RSTRIP;
    static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
    for (int k = 0; k < 3; k++)
      if ((id = gguf_vocab_find(v, keep[k])) >= 0) v->attr[id] &= ~(uint32_t)ATTR_RSTRIP;
  } else if (name && strstr(name, "modern-bert")) {
    int32_t id = gguf_vocab_find(v, "[MASK]");
    if (id >= 0) v->attr[id] |= ATTR_LSTRIP;
  }
  free(name);
  free(arch);

  if (v->type == VT_UGM && (rc = build_ugm(v, err))) return rc;
  return 0;
}

int gguf_vocab_load(const struct gguf_file *g, const char *what, gguf_vocab **out, herr *err) {
  *out = NULL;
  if (!what) what = gguf_path(g);
  gguf_vocab *v = calloc(1, sizeof *v);
  if (!v) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  hdict_init(&v->index);
  hdict_init(&v->ranks);
  int rc = load_vocab(v, g, what, err);
  if (rc) {
    gguf_vocab_free(v);
    return rc;
  }
  *out = v;
  return 0;
}
