/* adapters.h — /v1/adapters (hearth's own endpoints): LoRA adapters loaded
 * onto the served model at run time. The POST body parsed and checked, and
 * the JSON shapes of an adapter and of the list. Knows nothing of models or
 * HTTP; server.c answers the routes through the engine's adapter_* calls. */
#ifndef HEARTH_SERVE_ADAPTERS_H
#define HEARTH_SERVE_ADAPTERS_H

#include <jansson.h>
#include <stddef.h>

#include "hearth.h"
#include "serve/request.h"

/* {"name": "...", "path": "..."} (both non-empty strings); *name and *path
 * malloc'd. On failure returns the HTTP status with f filled. */
int adapters_parse_load(const char *body, size_t len, char **name, char **path, serve_fail *f);
/* {"id", "object": "adapter", "path", "rank", "modules", "in_use"} */
json_t *adapters_one_json(const hearth_adapter_info *a);
/* {"object": "list", "data": [adapter...]} */
json_t *adapters_list_json(const hearth_adapter_info *a, int n);

#endif
