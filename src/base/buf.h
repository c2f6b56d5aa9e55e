/* buf.h — a growable byte buffer (always NUL-terminated when non-empty).
 * Allocation failure sets `oom` and later appends become no-ops, so callers
 * may append freely and check once at the end. */
#ifndef HEARTH_BASE_BUF_H
#define HEARTH_BASE_BUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct hbuf {
  char *data; /* owned */
  size_t len, cap;
  bool oom;
} hbuf;

bool hbuf_reserve(hbuf *b, size_t extra);
void hbuf_append(hbuf *b, const void *p, size_t n);
void hbuf_puts(hbuf *b, const char *s);
void hbuf_putc(hbuf *b, char c);
void hbuf_printf(hbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void hbuf_clear(hbuf *b);   /* len = 0, keeps memory */
void hbuf_free(hbuf *b);
/* Hands the bytes to the caller (malloc'd, NUL-terminated, never NULL unless oom) and resets b. */
char *hbuf_take(hbuf *b);
/* The contents as a C string ("" when empty). */
const char *hbuf_str(const hbuf *b);

#endif
