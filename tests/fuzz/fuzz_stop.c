/* fuzz_stop — the stop matcher over arbitrary stops and piece splits. Input:
 * stop strings separated by 0x00, then 0xFF, then text pieces separated by
 * 0x01. Whatever the split, the output must equal feeding the text whole, be
 * a prefix of the text, never contain a stop, and end where the stop starts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/stop.h"

#define MAX_STOPS 8

/* Feeds pieces; returns the matched stop (-1 none); out gets the emitted text. */
static int run(const char *const *stops, size_t nstops, const uint8_t *text, size_t len, const uint8_t *cuts,
               size_t ncuts, hbuf *out) {
  stop_matcher *m = NULL;
  if (stop_matcher_new(stops, nstops, &m, NULL)) abort();
  int which = -1;
  size_t at = 0;
  for (size_t c = 0; c <= ncuts && which < 0; c++) {
    size_t end = c < ncuts ? cuts[c] : len;
    if (end < at) end = at;
    if (end > len) end = len;
    which = stop_matcher_put(m, (const char *)text + at, end - at, out);
    if (which == -2) abort();
    at = end;
  }
  if (which < 0) stop_matcher_flush(m, out);
  stop_matcher_free(m);
  return which;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *sep = memchr(data, 0xFF, size);
  if (!sep) return 0;
  char *stop_buf = malloc((size_t)(sep - data) + 1);
  if (!stop_buf) return 0;
  memcpy(stop_buf, data, (size_t)(sep - data));
  stop_buf[sep - data] = 0;
  const char *stops[MAX_STOPS];
  size_t nstops = 0;
  for (char *p = stop_buf; p < stop_buf + (sep - data) && nstops < MAX_STOPS; p += strlen(p) + 1)
    if (*p) stops[nstops++] = p;
  /* the text without separators, and where the separators cut it */
  size_t rest = size - (size_t)(sep - data) - 1;
  uint8_t *text = malloc(rest + 1), *cuts = malloc(rest + 1);
  size_t len = 0, ncuts = 0;
  for (size_t i = 0; text && cuts && i < rest; i++) {
    uint8_t b = sep[1 + i];
    if (b == 0x01) {
      if (len < 256) cuts[ncuts++] = (uint8_t)len;
    } else if (len < 255) {
      text[len++] = b;
    }
  }
  if (text && cuts) {
    hbuf split = {0}, whole = {0};
    int w1 = run(stops, nstops, text, len, cuts, ncuts, &split);
    int w2 = run(stops, nstops, text, len, NULL, 0, &whole);
    if (w1 != w2 || split.len != whole.len || (split.len && memcmp(split.data, whole.data, split.len))) abort();
    if (split.len > len || (split.len && memcmp(split.data, text, split.len))) abort();
    if (w1 >= 0) {
      size_t sl = strlen(stops[w1]);
      if (split.len + sl > len || memcmp(text + split.len, stops[w1], sl)) abort();
    } else if (split.len != len) {
      abort();
    }
    for (size_t s = 0; s < nstops; s++)
      if (split.len && memmem(split.data, split.len, stops[s], strlen(stops[s]))) abort();
    hbuf_free(&split);
    hbuf_free(&whole);
  }
  free(text);
  free(cuts);
  free(stop_buf);
  return 0;
}
