/* jinja.h — a Jinja2 template engine for chat templates.
 *
 * Renders templates the way Python Jinja2 3.1 does under Hugging Face's
 * settings: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
 * loopcontrols), `tojson` as json.dumps(ensure_ascii=False), globals
 * raise_exception / strftime_now / range / namespace / dict / cycler / joiner.
 * Values come from jansson (objects keep their insertion order, as Python
 * dicts do). Output is byte-identical to Jinja2 for the language chat
 * templates use; anything else is a clear error with the template line.
 */
#ifndef HEARTH_CHAT_JINJA_H
#define HEARTH_CHAT_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"

typedef struct jinja_template jinja_template;

/* Bounds on one render. Zero fields take the defaults below. */
typedef struct jinja_limits {
  int max_depth;            /* nested macro calls / expression depth (default 256) */
  int64_t max_iterations;   /* loop iterations over the whole render (default 1,000,000) */
  int64_t max_steps;        /* evaluated nodes over the whole render (default 50,000,000) */
  size_t max_output;        /* bytes of output, also of any one string value (default 64 MiB) */
  size_t max_memory;        /* bytes of values the render may allocate (default 512 MiB) */
  /* When nonzero, strftime_now() formats this UTC time instead of the clock
   * (makes outputs reproducible). */
  int64_t fixed_now;
} jinja_limits;

#define JINJA_DEFAULT_MAX_DEPTH 256
#define JINJA_DEFAULT_MAX_ITERATIONS 1000000
#define JINJA_DEFAULT_MAX_STEPS 50000000
#define JINJA_DEFAULT_MAX_OUTPUT ((size_t)64 << 20)
#define JINJA_DEFAULT_MAX_MEMORY ((size_t)512 << 20)

/* Parses a template. `name` (may be NULL) prefixes error messages. On a syntax
 * error returns HEARTH_EFORMAT with "<name>:<line>: <problem>". *out is owned by
 * the caller (jinja_free). */
int jinja_parse(const char *src, size_t len, const char *name, jinja_template **out, herr *err);
void jinja_free(jinja_template *t);

/* Renders with the variables of `context` (a JSON object; borrowed; may be
 * NULL) appended to `out`. lim may be NULL (defaults). On failure returns
 * nonzero with the message ("<name>:<line>: ..."); errors raised by the
 * template itself through raise_exception() have code HEARTH_EINVAL and the
 * template's message after "<name>:<line>: ". Partial output may remain in out. */
int jinja_render(const jinja_template *t, const json_t *context, const jinja_limits *lim, hbuf *out, herr *err);

/* The message of the last error without the "<name>:<line>: " prefix is
 * err->msg + jinja_error_prefix_len(err); for comparing with Jinja2's text. */
size_t jinja_error_prefix_len(const herr *err);

#endif
