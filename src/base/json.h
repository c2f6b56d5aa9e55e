/* json.h — JSON through jansson, with errors that name the file and place,
 * and typed field getters that name the field when it is missing or mistyped. */
#ifndef HEARTH_BASE_JSON_H
#define HEARTH_BASE_JSON_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

/* Parses a file / buffer. `what` names the source in messages, which say
 * where the JSON is broken (line, column) and never quote its bytes. Caller
 * json_decref's. */
json_t *hjson_load_file(const char *path, herr *err);
json_t *hjson_load_buf(const char *data, size_t len, const char *what, herr *err);
/* jansson's message for je without the text it quotes (" near '...'"): what
 * is wrong, not what the input says. Returns buf. */
const char *hjson_error_what(const json_error_t *je, char *buf, size_t n);

/* Typed getters for object fields. Return 0 and leave *out untouched when the
 * key is absent (or JSON null) and required is false; HEARTH_EFORMAT with
 * "<what>: field 'key' must be <type>" when mistyped or required but absent. */
int hjson_get_int(const json_t *obj, const char *key, bool required, int64_t *out, const char *what, herr *err);
int hjson_get_num(const json_t *obj, const char *key, bool required, double *out, const char *what, herr *err);
int hjson_get_bool(const json_t *obj, const char *key, bool required, bool *out, const char *what, herr *err);
/* *out is borrowed from obj. */
int hjson_get_str(const json_t *obj, const char *key, bool required, const char **out, const char *what, herr *err);

#endif
