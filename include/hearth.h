/* hearth.h — the public C API of hearth, a local LLM runtime.
 *
 * The CLI and the HTTP server are consumers of this header like any other
 * program. Every function that can fail returns 0 on success or a nonzero
 * hearth error code, and fills a hearth_error with a message that names the
 * problem ("model.safetensors: tensor 'x' ends at byte 9000 but the file has 8192").
 */
#ifndef HEARTH_H
#define HEARTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes. */
typedef enum hearth_code {
  HEARTH_OK = 0,
  HEARTH_EINVAL = 1,      /* bad argument or request */
  HEARTH_EIO = 2,         /* file or socket error */
  HEARTH_EFORMAT = 3,     /* malformed file or data */
  HEARTH_EUNSUPPORTED = 4,/* valid but not supported (model_type, dtype, feature) */
  HEARTH_ENOMEM = 5,      /* out of memory */
  HEARTH_ENOTFOUND = 6,   /* file, tensor, token or key not found */
  HEARTH_ELIMIT = 7,      /* a configured limit was hit (recursion, size, context) */
  HEARTH_ECANCELLED = 8,  /* the caller cancelled */
  HEARTH_EINTERNAL = 9    /* a bug: an invariant did not hold */
} hearth_code;

/* An error: a code and a human-readable message. Zero-initialise before use. */
typedef struct hearth_error {
  int code;
  char msg[1024];
} hearth_error;

/* "0.1.0" */
const char *hearth_version(void);

/* The name of an error code ("invalid argument", ...). */
const char *hearth_code_name(int code);

#ifdef __cplusplus
}
#endif
#endif /* HEARTH_H */
