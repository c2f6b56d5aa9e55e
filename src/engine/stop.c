/* stop.c — stop-string matching over streamed text with hold-back (see
 * stop.h). Owns the held tail; knows nothing of tokens or models. */
#include "engine/stop.h"

#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"

struct stop_matcher {
  char **stops;   /* owned [n], each owned */
  size_t *lens;   /* owned [n] */
  size_t n;
  size_t max_len;
  hbuf held;      /* owned: text not yet emitted */
  bool done;      /* a stop matched */
};

int stop_matcher_new(const char *const *stops, size_t n, stop_matcher **out, herr *err) {
  *out = NULL;
  for (size_t i = 0; i < n; i++) {
    if (!stops[i] || !stops[i][0]) return herr_set_at(err, HEARTH_EINVAL, "stop", 0, "stop: stop string %zu is empty", i);
  }
  stop_matcher *m = calloc(1, sizeof *m);
  if (!m) return herr_set(err, HEARTH_ENOMEM, "stop: out of memory");
  if (n) {
    m->stops = calloc(n, sizeof(char *));
    m->lens = calloc(n, sizeof(size_t));
    if (!m->stops || !m->lens) {
      stop_matcher_free(m);
      return herr_set(err, HEARTH_ENOMEM, "stop: out of memory");
    }
  }
  m->n = n;
  for (size_t i = 0; i < n; i++) {
    m->stops[i] = strdup(stops[i]);
    if (!m->stops[i]) {
      stop_matcher_free(m);
      return herr_set(err, HEARTH_ENOMEM, "stop: out of memory");
    }
    m->lens[i] = strlen(stops[i]);
    if (m->lens[i] > m->max_len) m->max_len = m->lens[i];
  }
  *out = m;
  return 0;
}

void stop_matcher_free(stop_matcher *m) {
  if (!m) return;
  for (size_t i = 0; i < m->n && m->stops; i++) free(m->stops[i]);
  free(m->stops);
  free(m->lens);
  hbuf_free(&m->held);
  free(m);
}

/* The stop that completes first in h[0..n): the occurrence that ends
 * earliest (then starts earliest, then is listed first) — what a stream sees
 * first, so the answer does not depend on how the text was split. Sets *at to
 * where it starts and returns its index, or -1. */
static int find_stop(const stop_matcher *m, const char *h, size_t n, size_t *at) {
  int which = -1;
  size_t best_end = (size_t)-1, best_start = n;
  for (size_t i = 0; i < m->n; i++) {
    if (m->lens[i] > n) continue;
    const char *p = memmem(h, n, m->stops[i], m->lens[i]);
    if (!p) continue;
    size_t start = (size_t)(p - h), end = start + m->lens[i];
    if (end < best_end || (end == best_end && start < best_start)) {
      best_end = end;
      best_start = start;
      which = (int)i;
    }
  }
  *at = best_start;
  return which;
}

/* Smallest i such that h[i..n) is a proper prefix of some stop (n when none). */
static size_t partial_start(const stop_matcher *m, const char *h, size_t n) {
  size_t from = n > m->max_len ? n - m->max_len + 1 : 0;
  for (size_t i = from; i < n; i++) {
    size_t tail = n - i;
    for (size_t s = 0; s < m->n; s++)
      if (m->lens[s] > tail && memcmp(h + i, m->stops[s], tail) == 0) return i;
  }
  return n;
}

/* Moves h[0..k) to out and keeps the rest held. */
static void emit_prefix(stop_matcher *m, size_t k, hbuf *out) {
  if (!k) return;
  hbuf_append(out, m->held.data, k);
  memmove(m->held.data, m->held.data + k, m->held.len - k);
  m->held.len -= k;
  if (m->held.data) m->held.data[m->held.len] = 0;
}

int stop_matcher_put(stop_matcher *m, const char *piece, size_t len, hbuf *out) {
  if (m->done) return -1;
  hbuf_append(&m->held, piece, len);
  if (m->held.oom || out->oom) return -2;
  const char *h = m->held.data;
  size_t n = m->held.len;
  size_t at;
  int which = find_stop(m, h, n, &at);
  if (which >= 0) {
    hbuf_append(out, h, at);
    hbuf_clear(&m->held);
    m->done = true;
    return out->oom ? -2 : which;
  }
  size_t k = partial_start(m, h, n);
  k = utf8_complete_prefix(h, k);
  emit_prefix(m, k, out);
  return out->oom ? -2 : -1;
}

void stop_matcher_flush(stop_matcher *m, hbuf *out) {
  if (!m->done && m->held.len) hbuf_append(out, m->held.data, m->held.len);
  hbuf_clear(&m->held);
}

size_t stop_matcher_held(const stop_matcher *m) { return m->held.len; }
size_t stop_matcher_max_len(const stop_matcher *m) { return m->max_len; }
