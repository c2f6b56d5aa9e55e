/* buf.c — growable byte buffer (see buf.h). */
#include "base/buf.h"
#include "base/vec.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool hbuf_reserve(hbuf *b, size_t extra) {
  if (b->oom) return false;
  if (extra > (size_t)-1 - 1 - b->len || !HGROW(b->data, b->cap, b->len + extra + 1)) {
    b->oom = true;
    return false;
  }
  return true;
}

void hbuf_append(hbuf *b, const void *p, size_t n) {
  if (!hbuf_reserve(b, n)) return;
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = 0;
}

void hbuf_puts(hbuf *b, const char *s) { hbuf_append(b, s, strlen(s)); }
void hbuf_putc(hbuf *b, char c) { hbuf_append(b, &c, 1); }

void hbuf_printf(hbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char tmp[256];
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) {
    va_end(ap2);
    return;
  }
  if ((size_t)n < sizeof tmp) {
    hbuf_append(b, tmp, (size_t)n);
  } else if (hbuf_reserve(b, (size_t)n)) {
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
    b->len += (size_t)n;
  }
  va_end(ap2);
}

void hbuf_clear(hbuf *b) {
  b->len = 0;
  if (b->data) b->data[0] = 0;
}

void hbuf_free(hbuf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
  b->oom = false;
}

char *hbuf_take(hbuf *b) {
  if (b->oom) {
    hbuf_free(b);
    return NULL;
  }
  char *d = b->data;
  if (!d) d = calloc(1, 1);
  b->data = NULL;
  b->len = b->cap = 0;
  return d;
}

const char *hbuf_str(const hbuf *b) { return b->data ? b->data : ""; }
