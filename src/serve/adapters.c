/* adapters.c — the request and reply shapes of /v1/adapters: loading an
 * adapter ({"name", "path"}), an adapter as JSON, the list. */
#include "serve/adapters.h"

#include <stdlib.h>
#include <string.h>

int adapters_parse_load(const char *body, size_t len, char **name, char **path, serve_fail *f) {
  *name = *path = NULL;
  json_error_t je;
  json_t *root = json_loadb(body, len, 0, &je);
  if (!root) return serve_bad(f, "", "the request body is not valid JSON: %s at line %d column %d", je.text, je.line, je.column);
  int rc = 0;
  if (!json_is_object(root)) rc = serve_bad(f, "", "the request body must be a JSON object: {\"name\": ..., \"path\": ...}");
  else if ((rc = serve_json_str(root, "name", name, f)) || (rc = serve_json_str(root, "path", path, f))) {
  } else if (!*name || !**name)
    rc = serve_bad(f, "name", "'name' is required: the name requests give as \"adapter\"");
  else if (!*path || !**path)
    rc = serve_bad(f, "path", "'path' is required: a PEFT adapter folder on the server (adapter_config.json + adapter_model.safetensors)");
  json_decref(root);
  if (rc) {
    free(*name), free(*path);
    *name = *path = NULL;
  }
  return rc;
}

json_t *adapters_one_json(const hearth_adapter_info *a) {
  return json_pack("{s:s, s:s, s:s, s:I, s:I, s:i}", "id", a->name, "object", "adapter", "path", a->path, "rank",
                   (json_int_t)a->rank, "modules", (json_int_t)a->modules, "in_use", a->in_use);
}

json_t *adapters_list_json(const hearth_adapter_info *a, int n) {
  json_t *data = json_array();
  for (int i = 0; i < n; i++) json_array_append_new(data, adapters_one_json(&a[i]));
  return json_pack("{s:s, s:o}", "object", "list", "data", data);
}
