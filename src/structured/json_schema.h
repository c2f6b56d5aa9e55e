/* json_schema.h — JSON Schema to GBNF (grammar.h), for structured output.
 *
 * What is compiled: type (one or a list; "integer", "number", "string",
 * "boolean", "null", "object", "array"), enum, const, anyOf / oneOf, allOf
 * of object schemas (merged), $ref into the same document ("#", "#/$defs/…",
 * "#/definitions/…", recursion included), nullable (OpenAPI); objects with
 * properties (in the schema's order), required, additionalProperties (false /
 * true / a schema; extra properties are generated only when it is given as
 * true or a schema); arrays with items, prefixItems, minItems, maxItems;
 * strings with minLength, maxLength, format (date, time, date-time, uuid) and
 * pattern (a regular-expression subset: literals, classes, ., groups,
 * alternation, * + ? {m,n}, \d \w \s, ^ $ at the ends); integers with
 * minimum / maximum / exclusiveMinimum / exclusiveMaximum; numbers with a
 * non-negative minimum. Annotations (title, description, examples, default,
 * $schema, $id, …) are ignored. A keyword that would narrow the output and
 * cannot be honoured (e.g. multipleOf, uniqueItems: true, a remote $ref, a
 * pattern outside the subset) is refused with HEARTH_EUNSUPPORTED naming it,
 * never ignored.
 *
 * Whitespace between tokens is compact JSON's: at most one space or one
 * newline, so a model cannot spend its budget on padding; numbers to 16
 * integer and 16 fraction digits. Schemas nested more than 64 levels deep
 * (properties, items, anyOf, ... within one another) are refused with
 * HEARTH_ELIMIT, which keeps compile time bounded.
 */
#ifndef HEARTH_STRUCTURED_JSON_SCHEMA_H
#define HEARTH_STRUCTURED_JSON_SCHEMA_H

#include <stddef.h>

#include "base/buf.h"
#include "base/status.h"

/* Appends the GBNF (start rule root) for the schema given as JSON text. */
int json_schema_to_gbnf(const char *schema, size_t len, hbuf *out, herr *err);

#endif
