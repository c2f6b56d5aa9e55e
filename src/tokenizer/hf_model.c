/* hf_model.c — tokenizer.json models: BPE (byte-level or SentencePiece style,
 * byte_fallback, ignore_merges, fuse_unk, continuing_subword_prefix /
 * end_of_word_suffix), WordPiece, Unigram (Viterbi) and WordLevel. A model
 * turns one pre-tokenized word into ids, as HF tokenizers' models do. The BPE
 * merge runs over a linked list of symbols with a binary heap of candidate
 * pairs keyed by merge rank; results per word are cached. Knows nothing of
 * normalization, added tokens or decoding. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "base/vec.h"
#include "tokenizer/hf_fastjson.h"
#include "tokenizer/hf_internal.h"

enum { MODEL_BPE, MODEL_WORDPIECE, MODEL_UNIGRAM, MODEL_WORDLEVEL };

#define MAX_VOCAB_ID (1 << 24)
#define CACHE_MAX_WORD 256
#define CACHE_MAX_ENTRIES 200000

struct hf_model {
  int kind;
  hdict vocab;           /* token -> id */
  char **id_tok;         /* id -> token (owned strings), NULL where unused */
  uint32_t *id_len;      /* owned */
  int32_t nids;          /* 1 + largest id */
  int32_t unk_id;        /* -1 when none */
  char *unk_token;       /* BPE / WordPiece / WordLevel (owned) */
  /* BPE */
  hf_u64map merges;      /* (a << 32 | b) -> (rank << 32 | new id) */
  char *prefix, *suffix; /* continuing_subword_prefix, end_of_word_suffix (owned, NULL = none) */
  size_t prefix_len, suffix_len;
  bool fuse_unk, byte_fallback, ignore_merges;
  int32_t byte_ids[256]; /* "<0xXX>" ids, -1 when absent */
  /* WordPiece */
  size_t max_chars;
  /* Unigram */
  double *scores;        /* owned */
  double min_score;
  size_t max_piece;      /* longest piece in bytes */
  /* per-word cache (BPE) */
  pthread_mutex_t cache_lock;
  hdict cache;           /* word -> (offset << 20 | count) into cache_ids */
  int32_t *cache_ids;    /* owned */
  size_t cache_len, cache_cap;
};

static int set_token(hf_model *m, const char *tok, size_t len, int64_t id, const char *what, herr *err) {
  if (id < 0 || id >= MAX_VOCAB_ID)
    return herr_set(err, HEARTH_EFORMAT, "%s: vocab token '%.*s' has id %lld, outside [0, %d)", what,
                    (int)(len > 60 ? 60 : len), tok, (long long)id, MAX_VOCAB_ID);
  if (id >= m->nids) {
    int32_t ncap = m->nids, nlen = m->nids;
    if (!HGROW(m->id_tok, ncap, id + 1) || !HGROW(m->id_len, nlen, id + 1))
      return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
    for (int32_t i = m->nids; i < ncap; i++) m->id_tok[i] = NULL, m->id_len[i] = 0;
    m->nids = ncap; /* trimmed to the real size after loading */
  }
  char *copy = malloc(len + 1);
  if (!copy || !hdict_put(&m->vocab, tok, len, id)) {
    free(copy);
    return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  }
  memcpy(copy, tok, len);
  copy[len] = 0;
  free(m->id_tok[id]);
  m->id_tok[id] = copy;
  m->id_len[id] = (uint32_t)len;
  return 0;
}

static void trim_ids(hf_model *m) {
  int32_t n = m->nids;
  while (n > 0 && !m->id_tok[n - 1]) n--;
  m->nids = n;
}

static int32_t lookup(const hf_model *m, const char *s, size_t len) {
  int64_t v;
  return hdict_get(&m->vocab, s, len, &v) ? (int32_t)v : -1;
}

static char *dup_str(const json_t *v, size_t *len) {
  if (!json_is_string(v)) return NULL;
  size_t n = json_string_length(v);
  char *s = malloc(n + 1);
  if (s) memcpy(s, json_string_value(v), n + 1);
  if (len) *len = n;
  return s;
}

static int parse_vocab_object(hf_model *m, const json_t *vocab, const char *what, herr *err) {
  if (!json_is_object(vocab)) return herr_set(err, HEARTH_EFORMAT, "%s: model.vocab must be an object of token: id", what);
  const char *k;
  json_t *v;
  void *iter = json_object_iter((json_t *)vocab);
  while (iter) {
    k = json_object_iter_key(iter);
    v = json_object_iter_value(iter);
    size_t klen = json_object_iter_key_len(iter);
    if (!json_is_integer(v))
      return herr_set(err, HEARTH_EFORMAT, "%s: model.vocab['%.*s'] must be an integer id", what, (int)(klen > 60 ? 60 : klen), k);
    int rc = set_token(m, k, klen, json_integer_value(v), what, err);
    if (rc) return rc;
    iter = json_object_iter_next((json_t *)vocab, iter);
  }
  trim_ids(m);
  return 0;
}

static int add_merge(hf_model *m, size_t r, const char *a, size_t alen, const char *b, size_t blen, const char *what,
                     herr *err) {
  char stackbuf[512];
  int rc;
  int32_t ia = lookup(m, a, alen), ib = lookup(m, b, blen);
  if (ia < 0 || ib < 0)
    return herr_set(err, HEARTH_EFORMAT, "%s: merge %zu uses token '%.*s' which is not in the vocabulary", what, r,
                    (int)((ia < 0 ? alen : blen) > 60 ? 60 : (ia < 0 ? alen : blen)), ia < 0 ? a : b);
  size_t skip = m->prefix_len <= blen ? m->prefix_len : blen;
  size_t nlen = alen + blen - skip;
  char *buf = nlen <= sizeof stackbuf ? stackbuf : malloc(nlen);
  if (!buf) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  memcpy(buf, a, alen);
  memcpy(buf + alen, b + skip, blen - skip);
  int32_t inew = lookup(m, buf, nlen);
  if (inew < 0) {
    rc = herr_set(err, HEARTH_EFORMAT, "%s: merge %zu makes token '%.*s' which is not in the vocabulary", what, r,
                  (int)(nlen > 60 ? 60 : nlen), buf);
    if (buf != stackbuf) free(buf);
    return rc;
  }
  if (buf != stackbuf) free(buf);
  if (!hf_u64map_put(&m->merges, (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib, (uint64_t)r << 32 | (uint32_t)inew))
    return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  return 0;
}

/* ---- the fast path: vocab and merges read straight from the text ---- */
static int fast_vocab(hf_model *m, const char *p, const char *end, const char *what, herr *err) {
  hbuf key = {0};
  int rc = HF_FAST_FALLBACK;
  p = hf_fast_ws(p, end);
  if (p >= end || *p != '{') goto out;
  p = hf_fast_ws(p + 1, end);
  if (p < end && *p == '}') {
    rc = 0;
    goto out;
  }
  while (p < end) {
    int64_t id;
    if (hf_fast_string(&p, end, &key)) goto out;
    p = hf_fast_ws(p, end);
    if (p >= end || *p != ':') goto out;
    p = hf_fast_ws(p + 1, end);
    if (hf_fast_int(&p, end, &id)) goto out;
    int r = set_token(m, hbuf_str(&key), key.len, id, what, err);
    if (r) {
      rc = r;
      goto out;
    }
    p = hf_fast_ws(p, end);
    if (p < end && *p == ',') {
      p = hf_fast_ws(p + 1, end);
      continue;
    }
    if (p < end && *p == '}') {
      rc = 0;
      break;
    }
    goto out;
  }
out:
  hbuf_free(&key);
  if (!rc) trim_ids(m);
  return rc;
}

static int fast_merges(hf_model *m, const char *p, const char *end, const char *what, herr *err) {
  hbuf a = {0}, b = {0};
  int rc = HF_FAST_FALLBACK;
  size_t r = 0;
  p = hf_fast_ws(p, end);
  if (p >= end || *p != '[') goto out;
  p = hf_fast_ws(p + 1, end);
  if (p < end && *p == ']') {
    rc = 0;
    goto out;
  }
  while (p < end) {
    int e;
    if (*p == '"') {
      if (hf_fast_string(&p, end, &a)) goto out;
      const char *s = hbuf_str(&a), *sp = memchr(s, ' ', a.len);
      if (!sp) goto out; /* the plain path names the problem */
      e = add_merge(m, r, s, (size_t)(sp - s), sp + 1, a.len - (size_t)(sp - s) - 1, what, err);
    } else if (*p == '[') {
      p = hf_fast_ws(p + 1, end);
      if (hf_fast_string(&p, end, &a)) goto out;
      p = hf_fast_ws(p, end);
      if (p >= end || *p != ',') goto out;
      p = hf_fast_ws(p + 1, end);
      if (hf_fast_string(&p, end, &b)) goto out;
      p = hf_fast_ws(p, end);
      if (p >= end || *p != ']') goto out;
      p++;
      e = add_merge(m, r, hbuf_str(&a), a.len, hbuf_str(&b), b.len, what, err);
    } else {
      goto out;
    }
    if (e) {
      rc = e;
      goto out;
    }
    r++;
    p = hf_fast_ws(p, end);
    if (p < end && *p == ',') {
      p = hf_fast_ws(p + 1, end);
      continue;
    }
    if (p < end && *p == ']') rc = 0;
    break;
  }
out:
  hbuf_free(&a);
  hbuf_free(&b);
  return rc;
}

static int parse_bpe(hf_model *m, const json_t *j, const hf_fast_ranges *fast, const char *what, herr *err) {
  int rc = fast ? fast_vocab(m, fast->vocab, fast->vocab_end, what, err)
                : parse_vocab_object(m, json_object_get(j, "vocab"), what, err);
  if (rc) return rc;
  const json_t *v;
  if ((v = json_object_get(j, "unk_token")) && json_is_string(v)) m->unk_token = dup_str(v, NULL);
  if ((v = json_object_get(j, "continuing_subword_prefix")) && json_is_string(v)) m->prefix = dup_str(v, &m->prefix_len);
  if ((v = json_object_get(j, "end_of_word_suffix")) && json_is_string(v)) m->suffix = dup_str(v, &m->suffix_len);
  m->fuse_unk = json_is_true(json_object_get(j, "fuse_unk"));
  m->byte_fallback = json_is_true(json_object_get(j, "byte_fallback"));
  m->ignore_merges = json_is_true(json_object_get(j, "ignore_merges"));
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    m->byte_ids[b] = lookup(m, name, 6);
  }
  m->unk_id = m->unk_token ? lookup(m, m->unk_token, strlen(m->unk_token)) : -1;
  if (fast && fast->merges) return fast_merges(m, fast->merges, fast->merges_end, what, err);
  const json_t *merges = json_object_get(j, "merges");
  if (!merges || json_is_null(merges)) return 0;
  if (!json_is_array(merges)) return herr_set(err, HEARTH_EFORMAT, "%s: model.merges must be an array", what);
  size_t n = json_array_size(merges);
  for (size_t r = 0; r < n; r++) {
    const json_t *e = json_array_get(merges, r);
    const char *a, *b;
    size_t alen, blen;
    if (json_is_string(e)) {
      a = json_string_value(e);
      size_t len = json_string_length(e);
      const char *sp = memchr(a, ' ', len);
      if (!sp) return herr_set(err, HEARTH_EFORMAT, "%s: merge %zu ('%.*s') is not two tokens separated by a space", what, r, (int)(len > 60 ? 60 : len), a);
      alen = (size_t)(sp - a);
      b = sp + 1;
      blen = len - alen - 1;
    } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
               json_is_string(json_array_get(e, 1))) {
      a = json_string_value(json_array_get(e, 0));
      alen = json_string_length(json_array_get(e, 0));
      b = json_string_value(json_array_get(e, 1));
      blen = json_string_length(json_array_get(e, 1));
    } else {
      return herr_set(err, HEARTH_EFORMAT, "%s: merge %zu must be a string \"a b\" or a pair [a, b]", what, r);
    }
    if ((rc = add_merge(m, r, a, alen, b, blen, what, err))) return rc;
  }
  return 0;
}

static int parse_wordpiece(hf_model *m, const json_t *j, bool wordlevel, const hf_fast_ranges *fast, const char *what,
                           herr *err) {
  int rc = fast ? fast_vocab(m, fast->vocab, fast->vocab_end, what, err)
                : parse_vocab_object(m, json_object_get(j, "vocab"), what, err);
  if (rc) return rc;
  const json_t *v = json_object_get(j, "unk_token");
  m->unk_token = json_is_string(v) ? dup_str(v, NULL) : strdup(wordlevel ? "<unk>" : "[UNK]");
  m->unk_id = lookup(m, m->unk_token, strlen(m->unk_token));
  if (!wordlevel) {
    v = json_object_get(j, "continuing_subword_prefix");
    m->prefix = json_is_string(v) ? dup_str(v, &m->prefix_len) : strdup("##");
    if (!json_is_string(v)) m->prefix_len = 2;
    v = json_object_get(j, "max_input_chars_per_word");
    m->max_chars = json_is_integer(v) && json_integer_value(v) >= 0 ? (size_t)json_integer_value(v) : 100;
  }
  return 0;
}

static int parse_unigram(hf_model *m, const json_t *j, const char *what, herr *err) {
  const json_t *vocab = json_object_get(j, "vocab");
  if (!json_is_array(vocab)) return herr_set(err, HEARTH_EFORMAT, "%s: Unigram model.vocab must be an array of [piece, score]", what);
  size_t n = json_array_size(vocab);
  m->scores = calloc(n + 1, sizeof *m->scores);
  if (!m->scores) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  m->min_score = INFINITY;
  for (size_t i = 0; i < n; i++) {
    const json_t *e = json_array_get(vocab, i);
    const json_t *p = json_array_get(e, 0), *s = json_array_get(e, 1);
    if (!json_is_array(e) || !json_is_string(p) || !json_is_number(s))
      return herr_set(err, HEARTH_EFORMAT, "%s: Unigram vocab entry %zu must be [string, number]", what, i);
    int rc = set_token(m, json_string_value(p), json_string_length(p), (int64_t)i, what, err);
    if (rc) return rc;
    m->scores[i] = json_number_value(s);
    if (m->scores[i] < m->min_score) m->min_score = m->scores[i];
    if (json_string_length(p) > m->max_piece) m->max_piece = json_string_length(p);
  }
  trim_ids(m);
  if (n == 0) m->min_score = 0;
  const json_t *u = json_object_get(j, "unk_id");
  m->unk_id = -1;
  if (json_is_integer(u)) {
    if (json_integer_value(u) < 0 || (size_t)json_integer_value(u) >= n)
      return herr_set(err, HEARTH_EFORMAT, "%s: Unigram unk_id %lld is outside the vocabulary of %zu pieces", what,
                      (long long)json_integer_value(u), n);
    m->unk_id = (int32_t)json_integer_value(u);
  }
  m->byte_fallback = json_is_true(json_object_get(j, "byte_fallback"));
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    m->byte_ids[b] = lookup(m, name, 6);
  }
  return 0;
}

int hf_model_parse(const json_t *j, const hf_fast_ranges *fast, hf_model **out, const char *what, herr *err) {
  *out = NULL;
  if (!json_is_object(j)) return herr_set(err, HEARTH_EFORMAT, "%s: missing 'model' object", what);
  const char *type = json_string_value(json_object_get(j, "type"));
  hf_model *m = calloc(1, sizeof *m);
  if (!m) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  hdict_init(&m->vocab);
  hdict_init(&m->cache);
  pthread_mutex_init(&m->cache_lock, NULL);
  m->unk_id = -1;
  int rc;
  if (!type && fast) type = "?"; /* guessing needs the fields: take the plain path */
  if (!type) { /* old files leave the type out; guess from the fields, as HF does */
    if (json_object_get(j, "merges")) type = "BPE";
    else if (json_is_array(json_object_get(j, "vocab"))) type = "Unigram";
    else if (json_object_get(j, "continuing_subword_prefix")) type = "WordPiece";
    else type = "WordLevel";
  }
  if (!strcmp(type, "BPE")) m->kind = MODEL_BPE, rc = parse_bpe(m, j, fast, what, err);
  else if (!strcmp(type, "WordPiece")) m->kind = MODEL_WORDPIECE, rc = parse_wordpiece(m, j, false, fast, what, err);
  else if (!strcmp(type, "WordLevel")) m->kind = MODEL_WORDLEVEL, rc = parse_wordpiece(m, j, true, fast, what, err);
  else if (fast) rc = HF_FAST_FALLBACK;
  else if (!strcmp(type, "Unigram")) m->kind = MODEL_UNIGRAM, rc = parse_unigram(m, j, what, err);
  else rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: unsupported model type '%s'", what, type);
  if (rc) {
    hf_model_free(m);
    return rc;
  }
  *out = m;
  return 0;
}

void hf_model_free(hf_model *m) {
  if (!m) return;
  hdict_free(&m->vocab);
  hdict_free(&m->cache);
  for (int32_t i = 0; i < m->nids; i++) free(m->id_tok[i]);
  free(m->id_tok);
  free(m->id_len);
  free(m->unk_token);
  free(m->prefix);
  free(m->suffix);
  free(m->scores);
  free(m->cache_ids);
  hf_u64map_free(&m->merges);
  pthread_mutex_destroy(&m->cache_lock);
  free(m);
}

int32_t hf_model_vocab_size(const hf_model *m) { return m->nids; }

const char *hf_model_id_to_token(const hf_model *m, int32_t id, size_t *len) {
  if (id < 0 || id >= m->nids || !m->id_tok[id]) return NULL;
  if (len) *len = m->id_len[id];
  return m->id_tok[id];
}

int32_t hf_model_token_to_id(const hf_model *m, const char *tok, size_t len) { return lookup(m, tok, len); }

/* ---- output helper ---- */
static bool push_id(int32_t **ids, size_t *n, size_t *cap, int32_t id) {
  if (*n == *cap && !HGROW(*ids, *cap, *n + 1)) return false;
  (*ids)[(*n)++] = id;
  return true;
}

/* ---- BPE ---- */
typedef struct sym {
  int32_t id;
  int32_t prev, next;
  uint32_t len; /* 0 = merged away */
} sym;

typedef struct cand {
  uint32_t rank;
  uint32_t pos;
  int32_t new_id;
} cand;

static inline bool cand_less(cand a, cand b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

typedef struct heap {
  cand *v;
  size_t n, cap;
} heap;

static bool heap_push(heap *h, cand c) {
  if (h->n == h->cap && !HGROW(h->v, h->cap, h->n + 1)) return false;
  size_t i = h->n++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!cand_less(c, h->v[p])) break;
    h->v[i] = h->v[p];
    i = p;
  }
  h->v[i] = c;
  return true;
}

static cand heap_pop(heap *h) {
  cand top = h->v[0], last = h->v[--h->n];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, s = i;
    cand best = last;
    if (l < h->n && cand_less(h->v[l], best)) s = l, best = h->v[l];
    if (r < h->n && cand_less(h->v[r], best)) s = r;
    if (s == i) break;
    h->v[i] = h->v[s];
    i = s;
  }
  if (h->n) h->v[i] = last;
  return top;
}

typedef struct syms {
  sym *v;
  size_t n, cap;
} syms;

static bool sym_add(syms *w, int32_t id, uint32_t len) {
  if (w->n == w->cap && !HGROW(w->v, w->cap, w->n + 1)) return false;
  w->v[w->n] = (sym){id, (int32_t)w->n - 1, -1, len};
  if (w->n > 0) w->v[w->n - 1].next = (int32_t)w->n;
  w->n++;
  return true;
}

static bool merge_rank(const hf_model *m, int32_t a, int32_t b, uint32_t *rank, int32_t *new_id) {
  uint64_t v;
  if (!hf_u64map_get(&m->merges, (uint64_t)(uint32_t)a << 32 | (uint32_t)b, &v)) return false;
  *rank = (uint32_t)(v >> 32);
  *new_id = (int32_t)(uint32_t)v;
  return true;
}

static int bpe_word(const hf_model *m, const char *s, size_t len, int32_t **ids, size_t *n, size_t *cap, herr *err) {
  syms w = {0};
  heap h = {0};
  bool ok = true;
  int32_t unk_id = -1;
  uint32_t unk_len = 0;
  bool have_unk = false;
  char stackbuf[256];
  for (size_t i = 0; ok && i < len;) {
    uint32_t cp;
    int cl = utf8_decode(s + i, len - i, &cp);
    if (!cl) cl = 1;
    bool first = i == 0, last = i + (size_t)cl == len;
    const char *piece = s + i;
    size_t plen = (size_t)cl;
    char *buf = NULL;
    if ((!first && m->prefix_len) || (last && m->suffix_len)) {
      size_t need = (size_t)cl + (first ? 0 : m->prefix_len) + (last ? m->suffix_len : 0);
      buf = need <= sizeof stackbuf ? stackbuf : malloc(need);
      if (!buf) {
        ok = false;
        break;
      }
      size_t k = 0;
      if (!first && m->prefix_len) memcpy(buf, m->prefix, m->prefix_len), k += m->prefix_len;
      memcpy(buf + k, s + i, (size_t)cl), k += (size_t)cl;
      if (last && m->suffix_len) memcpy(buf + k, m->suffix, m->suffix_len), k += m->suffix_len;
      piece = buf;
      plen = k;
    }
    int32_t id = lookup(m, piece, plen);
    if (buf && buf != stackbuf) free(buf);
    if (id >= 0) {
      if (have_unk) ok = sym_add(&w, unk_id, unk_len), have_unk = false;
      ok = ok && sym_add(&w, id, (uint32_t)cl);
    } else {
      bool done = false;
      if (m->byte_fallback) {
        bool all = true;
        for (int k = 0; k < cl; k++)
          if (m->byte_ids[(unsigned char)s[i + k]] < 0) all = false;
        if (all) {
          if (have_unk) ok = sym_add(&w, unk_id, unk_len), have_unk = false;
          for (int k = 0; ok && k < cl; k++) ok = sym_add(&w, m->byte_ids[(unsigned char)s[i + k]], 1);
          done = true;
        }
      }
      if (!done && m->unk_token) {
        if (m->unk_id < 0) {
          free(w.v);
          return herr_set(err, HEARTH_EFORMAT, "tokenizer: unk_token '%s' is not in the vocabulary", m->unk_token);
        }
        if (have_unk && m->fuse_unk) unk_len += (uint32_t)cl;
        else {
          if (have_unk) ok = sym_add(&w, unk_id, unk_len);
          have_unk = true;
          unk_id = m->unk_id;
          unk_len = (uint32_t)cl;
        }
      }
    }
    i += (size_t)cl;
  }
  if (ok && have_unk) ok = sym_add(&w, unk_id, unk_len);
  /* merges */
  for (size_t i = 0; ok && i + 1 < w.n; i++) {
    uint32_t r;
    int32_t nid;
    if (merge_rank(m, w.v[i].id, w.v[i + 1].id, &r, &nid)) ok = heap_push(&h, (cand){r, (uint32_t)i, nid});
  }
  while (ok && h.n) {
    cand c = heap_pop(&h);
    sym *cur = &w.v[c.pos];
    if (cur->len == 0 || cur->next < 0) continue;
    sym *right = &w.v[cur->next];
    uint32_t r;
    int32_t nid;
    if (!merge_rank(m, cur->id, right->id, &r, &nid) || nid != c.new_id) continue;
    cur->id = c.new_id;
    cur->len += right->len;
    right->len = 0;
    cur->next = right->next;
    if (cur->next >= 0) w.v[cur->next].prev = (int32_t)c.pos;
    if (cur->prev >= 0 && merge_rank(m, w.v[cur->prev].id, cur->id, &r, &nid))
      ok = heap_push(&h, (cand){r, (uint32_t)cur->prev, nid});
    if (ok && cur->next >= 0 && merge_rank(m, cur->id, w.v[cur->next].id, &r, &nid))
      ok = heap_push(&h, (cand){r, c.pos, nid});
  }
  for (int32_t i = w.n ? 0 : -1; ok && i >= 0; i = w.v[i].next) ok = push_id(ids, n, cap, w.v[i].id);
  free(w.v);
  free(h.v);
  return ok ? 0 : herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
}

static bool cache_get(hf_model *m, const char *s, size_t len, int32_t **ids, size_t *n, size_t *cap) {
  int64_t v;
  bool hit = false;
  pthread_mutex_lock(&m->cache_lock);
  if (hdict_get(&m->cache, s, len, &v)) {
    size_t off = (size_t)(v >> 20), cnt = (size_t)(v & 0xFFFFF);
    hit = true;
    for (size_t i = 0; hit && i < cnt; i++) hit = push_id(ids, n, cap, m->cache_ids[off + i]);
  }
  pthread_mutex_unlock(&m->cache_lock);
  return hit;
}

static void cache_put(hf_model *m, const char *s, size_t len, const int32_t *ids, size_t cnt) {
  pthread_mutex_lock(&m->cache_lock);
  if (m->cache.count >= CACHE_MAX_ENTRIES) {
    hdict_free(&m->cache);
    hdict_init(&m->cache);
    m->cache_len = 0;
  }
  if (!HGROW(m->cache_ids, m->cache_cap, m->cache_len + cnt)) goto out;
  if (cnt) memcpy(m->cache_ids + m->cache_len, ids, cnt * sizeof *ids);
  if (hdict_put(&m->cache, s, len, (int64_t)m->cache_len << 20 | (int64_t)cnt)) m->cache_len += cnt;
out:
  pthread_mutex_unlock(&m->cache_lock);
}

static int bpe_tokenize(const hf_model *cm, const char *s, size_t len, int32_t **ids, size_t *n, size_t *cap,
                        herr *err) {
  hf_model *m = (hf_model *)cm; /* only the cache is written, under its lock */
  if (len == 0) return 0;
  if (m->ignore_merges) {
    int32_t id = lookup(m, s, len);
    if (id >= 0) return push_id(ids, n, cap, id) ? 0 : herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
  }
  bool cacheable = len <= CACHE_MAX_WORD;
  if (cacheable && cache_get(m, s, len, ids, n, cap)) return 0;
  size_t before = *n;
  int rc = bpe_word(m, s, len, ids, n, cap, err);
  if (!rc && cacheable && *n - before < 0xFFFFF && *n > before) cache_put(m, s, len, *ids + before, *n - before);
  return rc;
}

/* ---- WordPiece ---- */
static int wordpiece_tokenize(const hf_model *m, const char *s, size_t len, int32_t **ids, size_t *n, size_t *cap,
                              herr *err) {
  if (len == 0) return 0;
  size_t nchars = 0;
  for (size_t i = 0; i < len; i++)
    if (((unsigned char)s[i] & 0xC0) != 0x80) nchars++;
  size_t before = *n;
  bool bad = nchars > m->max_chars;
  hbuf tmp = {0};
  for (size_t start = 0; !bad && start < len;) {
    size_t end = len;
    int32_t found = -1;
    while (start < end) {
      hbuf_clear(&tmp);
      if (start > 0) hbuf_append(&tmp, m->prefix, m->prefix_len);
      hbuf_append(&tmp, s + start, end - start);
      found = lookup(m, hbuf_str(&tmp), tmp.len);
      if (found >= 0) break;
      do end--; while (end > start && ((unsigned char)s[end] & 0xC0) == 0x80);
    }
    if (found < 0) {
      bad = true;
      break;
    }
    if (!push_id(ids, n, cap, found)) {
      hbuf_free(&tmp);
      return herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
    }
    start = end;
  }
  hbuf_free(&tmp);
  if (bad) {
    *n = before;
    if (m->unk_id < 0) return herr_set(err, HEARTH_EFORMAT, "tokenizer: unk_token '%s' is not in the vocabulary", m->unk_token);
    if (!push_id(ids, n, cap, m->unk_id)) return herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
  }
  return 0;
}

static int wordlevel_tokenize(const hf_model *m, const char *s, size_t len, int32_t **ids, size_t *n, size_t *cap,
                              herr *err) {
  int32_t id = lookup(m, s, len);
  if (id < 0) id = m->unk_id;
  if (id < 0) return herr_set(err, HEARTH_EFORMAT, "tokenizer: unk_token '%s' is not in the vocabulary", m->unk_token);
  return push_id(ids, n, cap, id) ? 0 : herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
}

/* ---- Unigram ---- */
typedef struct lnode {
  double score;
  int32_t id;
  int64_t start; /* -1 = unset */
} lnode;

static int unigram_tokenize(const hf_model *m, const char *s, size_t len, int32_t **ids, size_t *n, size_t *cap,
                            herr *err) {
  if (len == 0) return 0;
  lnode *best = malloc((len + 1) * sizeof *best);
  if (!best) return herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
  for (size_t i = 0; i <= len; i++) best[i] = (lnode){0, -1, -1};
  best[0].start = 0;
  double unk_score = m->min_score - 10.0;
  int rc = 0;
  for (size_t at = 0; at < len;) {
    uint32_t cp;
    int cl = utf8_decode(s + at, len - at, &cp);
    if (!cl) cl = 1;
    double base = best[at].score;
    bool single = false;
    size_t maxend = at + m->max_piece < len ? at + m->max_piece : len;
    for (size_t end = at + 1; end <= maxend; end++) {
      if (end < len && ((unsigned char)s[end] & 0xC0) == 0x80) continue;
      int32_t id = lookup(m, s + at, end - at);
      if (id < 0) continue;
      double sc = base + m->scores[id];
      lnode *t = &best[end];
      if (t->start < 0 || sc > t->score) *t = (lnode){sc, id, (int64_t)at};
      if (end - at == (size_t)cl) single = true;
    }
    if (!single) {
      if (m->unk_id < 0) {
        rc = herr_set(err, HEARTH_EFORMAT, "tokenizer: text needs the unknown token but the Unigram model has no unk_id");
        break;
      }
      double sc = base + unk_score;
      lnode *t = &best[at + (size_t)cl];
      if (t->start < 0 || sc > t->score) *t = (lnode){sc, m->unk_id, (int64_t)at};
    }
    at += (size_t)cl;
  }
  if (rc) {
    free(best);
    return rc;
  }
  /* backtrack into (start, end) pieces, fusing runs of unknowns */
  size_t cnt = 0;
  size_t *bounds = malloc((len + 1) * sizeof *bounds);
  if (!bounds) {
    free(best);
    return herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
  }
  bool prev_unk = false;
  for (size_t end = len; end > 0;) {
    size_t st = (size_t)best[end].start;
    bool unk = best[end].id == m->unk_id;
    if (unk && prev_unk) bounds[cnt - 1] = st; /* extend the fused unknown piece leftwards */
    else bounds[cnt++] = st;
    prev_unk = unk;
    end = st;
  }
  /* bounds holds piece starts from the right; walk them left to right */
  size_t end = len;
  size_t *ends = malloc((cnt + 1) * sizeof *ends);
  if (!ends) rc = herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
  for (size_t i = 0; !rc && i < cnt; i++) {
    ends[i] = end;
    end = bounds[i];
  }
  for (size_t k = cnt; !rc && k-- > 0;) {
    size_t a = bounds[k], b = ends[k];
    int32_t id = lookup(m, s + a, b - a);
    bool ok = true;
    if (id >= 0) ok = push_id(ids, n, cap, id);
    else {
      bool all = m->byte_fallback;
      for (size_t q = a; all && q < b; q++)
        if (m->byte_ids[(unsigned char)s[q]] < 0) all = false;
      if (all)
        for (size_t q = a; ok && q < b; q++) ok = push_id(ids, n, cap, m->byte_ids[(unsigned char)s[q]]);
      else ok = push_id(ids, n, cap, m->unk_id);
    }
    if (!ok) rc = herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
  }
  free(ends);
  free(bounds);
  free(best);
  return rc;
}

int hf_model_tokenize(const hf_model *m, const char *s, size_t len, int32_t **ids, size_t *n, size_t *cap, herr *err) {
  switch (m->kind) {
    case MODEL_BPE: return bpe_tokenize(m, s, len, ids, n, cap, err);
    case MODEL_WORDPIECE: return wordpiece_tokenize(m, s, len, ids, n, cap, err);
    case MODEL_WORDLEVEL: return len ? wordlevel_tokenize(m, s, len, ids, n, cap, err) : 0;
    default: return unigram_tokenize(m, s, len, ids, n, cap, err);
  }
}
