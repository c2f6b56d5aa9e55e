/* prompts.h — the stages' prompt templates: <name>.txt in the shipped folder
 * (src/memory/prompts, installed under share/hearth/memory/prompts), each
 * replaced by a file of the same name in an override folder when there is
 * one. A template is text with {{name}} slots, filled by mem_prompt_fill. */
#ifndef HEARTH_MEMORY_PROMPTS_H
#define HEARTH_MEMORY_PROMPTS_H

#include <stddef.h>

#include "base/status.h"

/* The templates: segment, extract, route, write, patch, reconcile, link. */
enum { MEM_T_SEGMENT = 0, MEM_T_EXTRACT, MEM_T_ROUTE, MEM_T_WRITE, MEM_T_PATCH, MEM_T_RECONCILE, MEM_T_LINK, MEM_TEMPLATES };

typedef struct mem_prompts {
  char *text[MEM_TEMPLATES]; /* owned */
} mem_prompts;

/* Reads every template (override first, then dir). HEARTH_ENOTFOUND naming
 * the file when a template is in neither. */
int mem_prompts_load(const char *dir, const char *override, mem_prompts *p, herr *err);
void mem_prompts_free(mem_prompts *p);
const char *mem_prompt_name(int t);

/* The template with each {{key}} slot replaced by its value (n pairs
 * keys[i] → values[i]); a slot with no value stays as it is. malloc'd. */
char *mem_prompt_fill(const char *tmpl, const char *const *keys, const char *const *values, size_t n);

#endif
