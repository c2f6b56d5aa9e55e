/* utf8.h — minimal UTF-8 helpers shared by tokenizers, templates and the server. */
#ifndef HEARTH_BASE_UTF8_H
#define HEARTH_BASE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Decodes one code point from s[0..n). Returns its byte length (1..4), or 0 when
 * the bytes there are not valid UTF-8 (overlong, surrogate, > U+10FFFF, truncated). */
int utf8_decode(const char *s, size_t n, uint32_t *cp);
/* Encodes cp into out (4 bytes of room); returns the length, 0 if cp is invalid. */
int utf8_encode(uint32_t cp, char *out);
bool utf8_valid(const char *s, size_t n);
/* Length of the longest prefix of s[0..n) that does not end inside a UTF-8
 * sequence which could still be completed by more bytes (for streaming). */
size_t utf8_complete_prefix(const char *s, size_t n);

#endif
