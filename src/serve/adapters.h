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
/* Where POST /v1/adapters may load from: `path` (absolute, or relative to
 * root) must resolve (realpath: symlinks followed) to a folder strictly
 * inside root, a realpath'ed directory, and so must the adapter files in it
 * that exist (adapter_config.json, adapter_model.safetensors); *out is the
 * folder's real path (malloc'd). root NULL (no --adapter-dir): every path is
 * refused, 403. A path that does not exist, lies outside or is not a folder
 * gets one and the same 400, which reads nothing of the file. Returns the
 * HTTP status with f filled on failure. */
int adapters_resolve(const char *root, const char *path, char **out, serve_fail *f);
/* {"id", "object": "adapter", "path", "rank", "modules", "in_use"} */
json_t *adapters_one_json(const hearth_adapter_info *a);
/* {"object": "list", "data": [adapter...]} */
json_t *adapters_list_json(const hearth_adapter_info *a, int n);

#endif
