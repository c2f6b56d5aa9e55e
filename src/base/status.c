/* status.c — error values with messages (see status.h). Owns nothing else. */
#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *hearth_version(void) { return HEARTH_VERSION; }

const char *hearth_code_name(int code) {
  switch (code) {
    case HEARTH_OK: return "ok";
    case HEARTH_EINVAL: return "invalid argument";
    case HEARTH_EIO: return "i/o error";
    case HEARTH_EFORMAT: return "malformed data";
    case HEARTH_EUNSUPPORTED: return "unsupported";
    case HEARTH_ENOMEM: return "out of memory";
    case HEARTH_ENOTFOUND: return "not found";
    case HEARTH_ELIMIT: return "limit exceeded";
    case HEARTH_ECANCELLED: return "cancelled";
    default: return "internal error";
  }
}

int herr_set(herr *err, int code, const char *fmt, ...) {
  if (err) {
    err->code = code;
    err->cause = HEARTH_CAUSE_NONE;
    err->field[0] = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return code;
}

int herr_set_at(herr *err, int code, const char *field, int cause, const char *fmt, ...) {
  if (err) {
    err->code = code;
    err->cause = cause;
    snprintf(err->field, sizeof err->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return code;
}

int herr_wrap(herr *err, const char *fmt, ...) {
  if (!err) return HEARTH_EINTERNAL;
  if (!err->code) err->code = HEARTH_EINTERNAL;
  char prefix[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  char old[sizeof err->msg];
  memcpy(old, err->msg, sizeof old);
  old[sizeof old - 1] = 0;
  snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
  return err->code;
}

void herr_clear(herr *err) {
  if (err) {
    err->code = 0;
    err->msg[0] = 0;
    err->cause = HEARTH_CAUSE_NONE;
    err->field[0] = 0;
  }
}
