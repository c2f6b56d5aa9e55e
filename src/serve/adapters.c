/* adapters.c — the request and reply shapes of /v1/adapters: loading an
 * adapter ({"name", "path"}) and where it may be loaded from (inside the
 * adapter directory, adapters_resolve), an adapter as JSON, the list. */
#include "serve/adapters.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* real lies strictly inside root (both real paths). */
static bool inside(const char *root, const char *real) {
  size_t n = strlen(root);
  if (n == 1 && root[0] == '/') return real[0] == '/' && real[1] != 0;
  return strncmp(real, root, n) == 0 && real[n] == '/' && real[n + 1] != 0;
}

int adapters_resolve(const char *root, const char *path, char **out, serve_fail *f) {
  *out = NULL;
  if (!root) {
    serve_fail_set(f, 403, "permission_error", "path", "adapter_dir_unset",
                   "Loading adapters over the API is off: start the server with --adapter-dir DIR to load "
                   "adapters from folders inside DIR");
    return 403;
  }
  char *joined = NULL;
  if (path[0] == '/') joined = strdup(path);
  else {
    size_t n = strlen(root) + strlen(path) + 2;
    joined = malloc(n);
    if (joined) snprintf(joined, n, "%s/%s", root, path);
  }
  if (!joined) {
    serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
    return 500;
  }
  char *real = realpath(joined, NULL);
  free(joined);
  struct stat st;
  bool ok = real && inside(root, real) && stat(real, &st) == 0 && S_ISDIR(st.st_mode);
  static const char *files[] = {"adapter_config.json", "adapter_model.safetensors"};
  for (size_t i = 0; ok && i < sizeof files / sizeof files[0]; i++) {
    char file[PATH_MAX + 64];
    snprintf(file, sizeof file, "%s/%s", real, files[i]);
    if (lstat(file, &st) != 0) continue; /* absent: the loader says so */
    char *rf = realpath(file, NULL);
    ok = rf && inside(root, rf);
    free(rf);
  }
  if (!ok) {
    free(real);
    serve_fail_set(f, 400, "invalid_request_error", "path", "adapter_path_refused",
                   "'path' must name an adapter folder inside the server's adapter directory (a name relative to it, "
                   "or a path under it, symlinks included): '%.200s' is not one",
                   path);
    return 400;
  }
  *out = real;
  return 0;
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
