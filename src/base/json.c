/* json.c — jansson wrappers with named errors (see json.h). */
#include "base/json.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/file.h"

const char *hjson_error_what(const json_error_t *je, char *buf, size_t n) {
  snprintf(buf, n, "%s", je->text);
  char *near = strstr(buf, " near ");
  if (near) *near = 0;
  return buf;
}

json_t *hjson_load_buf(const char *data, size_t len, const char *what, herr *err) {
  json_error_t je;
  json_t *j = json_loadb(data, len, JSON_ALLOW_NUL, &je);
  char why[JSON_ERROR_TEXT_LENGTH];
  if (!j)
    herr_set(err, HEARTH_EFORMAT, "%s: invalid JSON at line %d column %d: %s", what, je.line, je.column,
             hjson_error_what(&je, why, sizeof why));
  return j;
}

json_t *hjson_load_file(const char *path, herr *err) {
  char *data;
  size_t len;
  if (hfile_read(path, &data, &len, err)) return NULL;
  json_t *j = hjson_load_buf(data, len, path, err);
  free(data);
  return j;
}

static const json_t *field(const json_t *obj, const char *key) {
  if (!json_is_object(obj)) return NULL;
  const json_t *v = json_object_get(obj, key);
  return (v && !json_is_null(v)) ? v : NULL;
}

#define ABSENT_OR(cond, type)                                                                          \
  if (!v) return required ? herr_set(err, HEARTH_EFORMAT, "%s: missing required field '%s'", what, key) : 0; \
  if (!(cond)) return herr_set(err, HEARTH_EFORMAT, "%s: field '%s' must be %s", what, key, type)

/* A JSON real that is a whole number an int64_t holds (4096.0, 1e3): range
 * first, so that no out-of-range value (1e28, inf) is ever converted. */
static bool real_is_int64(const json_t *v) {
  if (!json_is_real(v)) return false;
  double d = json_real_value(v);
  return d >= -9223372036854775808.0 && d < 9223372036854775808.0 && d == trunc(d);
}

int hjson_get_int(const json_t *obj, const char *key, bool required, int64_t *out, const char *what, herr *err) {
  const json_t *v = field(obj, key);
  ABSENT_OR(json_is_integer(v) || real_is_int64(v), "an integer");
  *out = json_is_integer(v) ? (int64_t)json_integer_value(v) : (int64_t)json_real_value(v);
  return 0;
}

int hjson_get_num(const json_t *obj, const char *key, bool required, double *out, const char *what, herr *err) {
  const json_t *v = field(obj, key);
  ABSENT_OR(json_is_number(v), "a number");
  *out = json_number_value(v);
  return 0;
}

int hjson_get_bool(const json_t *obj, const char *key, bool required, bool *out, const char *what, herr *err) {
  const json_t *v = field(obj, key);
  ABSENT_OR(json_is_boolean(v), "a boolean");
  *out = json_is_true(v);
  return 0;
}

int hjson_get_str(const json_t *obj, const char *key, bool required, const char **out, const char *what, herr *err) {
  const json_t *v = field(obj, key);
  ABSENT_OR(json_is_string(v), "a string");
  *out = json_string_value(v);
  return 0;
}
