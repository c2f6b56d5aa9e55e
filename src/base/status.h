/* status.h — errors that carry a message up to the user.
 *
 * Convention: a function that can fail returns int (0 = ok, else a
 * hearth_code) and takes `herr *err` last. On failure it fills err with a
 * message that names the file / tensor / field and the problem. err may be
 * NULL when the caller does not want the message.
 *
 *   if (x > n) return herr_set(err, HEARTH_EFORMAT, "%s: header length %zu exceeds file size %zu", path, x, n);
 *   if ((rc = load_part(...))) return herr_wrap(err, "loading %s", path);
 */
#ifndef HEARTH_BASE_STATUS_H
#define HEARTH_BASE_STATUS_H

#include "hearth.h"

typedef hearth_error herr;

/* Sets code and a printf-formatted message (no cause, no field); returns code. */
int herr_set(herr *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The same with the field at fault (may be NULL) and a hearth_cause. */
int herr_set_at(herr *err, int code, const char *field, int cause, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Prefixes the existing message with "<context>: "; returns err->code (or
 * HEARTH_EINTERNAL when err holds no error). */
int herr_wrap(herr *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void herr_clear(herr *err);

#endif
