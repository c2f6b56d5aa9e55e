/* forced.h — tool_choice enforced: when a request asks for a call (required,
 * a named function, Anthropic any / tool), the reply opens with the call in
 * the template's syntax (chat/toolcall.h tc_forced_call) and goes on under a
 * grammar of that syntax over the request's tools, made here. */
#ifndef HEARTH_SERVE_FORCED_H
#define HEARTH_SERVE_FORCED_H

#include <jansson.h>
#include <stdbool.h>

#include "base/buf.h"
#include "chat/toolcall.h"

/* The grammar (GBNF, structured/grammar.h) of what follows tc_forced_call's
 * opening, over tools ([{"type":"function","function":{name, parameters}}]):
 * the tool's name when name is NULL (one of the tools), then its arguments
 * and the call's close. hermes, llama3, mistral, generic (one call): the arguments as JSON under the tool's
 * parameters schema (structured/json_schema.h); deepseek (either generation's
 * call form) and harmony: JSON under the schema, their markers as whole
 * tokens (grammar token terminals); qwen3_coder, glm: parameters named from
 * the schema's properties, values as free text; gemma4: keys from the
 * schema's properties, values in Gemma's notation (types unchecked). False
 * (out untouched) for none or when no tool has a schema that compiles. */
bool serve_forced_grammar(tc_format f, const json_t *tools, const char *name, hbuf *out);

#endif
