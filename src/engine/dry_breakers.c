/* dry_breakers.c — DRY's sequence breakers from strings over a tokenizer's
 * vocabulary (see dry_breakers.h). Walks every token's bytes once per string;
 * knows nothing of how the sampler uses the result. */
#include "engine/dry_breakers.h"

#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/vec.h"

const char *const dry_default_breakers[4] = {"\n", ":", "\"", "*"};

typedef struct brk_list {
  sample_dry_breaker *v;
  size_t n, cap;
} brk_list;

static bool same(const sample_dry_breaker *a, const sample_dry_breaker *b) {
  return a->head == b->head && a->n_tail == b->n_tail && !memcmp(a->tail, b->tail, sizeof(int32_t) * (size_t)a->n_tail);
}

/* Adds b unless an equal breaker is there (a head's breakers are added together:
 * scan back while the head matches). */
static bool add(brk_list *l, const sample_dry_breaker *b) {
  for (size_t i = l->n; i > 0 && l->v[i - 1].head == b->head; i--)
    if (same(&l->v[i - 1], b)) return true;
  if (l->n == l->cap && !HGROW(l->v, l->cap, l->n + 1)) return false;
  l->v[l->n++] = *b;
  return true;
}

/* The next position p >= from where word[p..len) is a proper prefix of s
 * (the token ends with the beginning of s); len when none. */
static size_t next_overlap(const char *word, size_t len, const char *s, size_t slen, size_t from) {
  for (size_t p = from; p < len; p++) {
    size_t k = 0;
    while (k < slen && p + k < len && word[p + k] == s[k]) k++;
    if (p + k == len && k < slen) return p;
  }
  return len;
}

int dry_breakers_build(const tokenizer *t, const char *const *strs, int n_strs, sample_dry_breaker **out, size_t *n,
                       herr *err) {
  *out = NULL;
  *n = 0;
  brk_list l = {0};
  hbuf word = {0};
  int rc = 0;
  char cut[DRY_BREAKER_MAX_BYTES + 1];
  int32_t vocab = tokenizer_vocab_size(t);
  for (int i = 0; i < n_strs && !rc; i++) {
    if (!strs[i] || !strs[i][0]) {
      rc = herr_set_at(err, HEARTH_EINVAL, "dry_sequence_breakers", 0, "dry_sequence_breakers[%d] is empty", i);
      break;
    }
    size_t slen = strlen(strs[i]);
    if (slen > DRY_BREAKER_MAX_BYTES) slen = DRY_BREAKER_MAX_BYTES;
    memcpy(cut, strs[i], slen);
    cut[slen] = 0;
    for (int32_t id = 0; id < vocab && !rc; id++) {
      hbuf_clear(&word);
      if (tokenizer_token_bytes(t, id, &word, err)) {
        herr_clear(err);
        continue; /* an id with no text (a gap in the vocabulary) */
      }
      const char *w = word.data ? word.data : "";
      size_t wl = word.len;
      if (wl >= slen && memmem(w, wl, cut, slen)) {
        sample_dry_breaker b = {.head = id, .n_tail = 0};
        if (!add(&l, &b)) rc = herr_set(err, HEARTH_ENOMEM, "dry_sequence_breakers: out of memory");
        continue;
      }
      for (size_t p = next_overlap(w, wl, cut, slen, 0); p < wl && !rc; p = next_overlap(w, wl, cut, slen, p + 1)) {
        size_t have = wl - p; /* bytes of the string the token supplies */
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if ((rc = tokenizer_encode(t, cut + have, slen - have, false, false, &ids, &n_ids, err))) break;
        sample_dry_breaker b = {.head = id, .n_tail = (int32_t)(n_ids < SAMPLE_DRY_MAX_TAIL ? n_ids : SAMPLE_DRY_MAX_TAIL)};
        if (b.n_tail) memcpy(b.tail, ids, sizeof(int32_t) * (size_t)b.n_tail);
        free(ids);
        if (!add(&l, &b)) rc = herr_set(err, HEARTH_ENOMEM, "dry_sequence_breakers: out of memory");
      }
    }
  }
  hbuf_free(&word);
  if (rc) {
    free(l.v);
    return rc;
  }
  *out = l.v;
  *n = l.n;
  return 0;
}
