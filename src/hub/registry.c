/* registry.c — hearth's registry of models kept outside the Hugging Face
 * cache, by reference (nothing is copied): a small JSON file,
 * $HEARTH_HOME/registry.json, else $XDG_DATA_HOME/hearth/registry.json, else
 * ~/.local/share/hearth/registry.json, holding
 *   {"models": {"NAME": {"path": "/absolute/path/to/folder-or-file.gguf"}}}
 * Written whole to a temporary file and renamed, so a reader never sees half.
 * Owns names and paths only; what a model is, the CLI asks inspect. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "hub/hub.h"

char *hub_registry_path(void) {
  const char *h = getenv("HEARTH_HOME");
  if (h && *h) return hpath_join(h, "registry.json");
  char buf[PATH_MAX];
  const char *x = getenv("XDG_DATA_HOME");
  if (x && *x) snprintf(buf, sizeof buf, "%s/hearth/registry.json", x);
  else {
    const char *home = getenv("HOME");
    snprintf(buf, sizeof buf, "%s/.local/share/hearth/registry.json", home && *home ? home : ".");
  }
  return strdup(buf);
}

/* The whole file ({"models": {...}}), a new object when there is none. */
static json_t *load_root(const char *path, herr *err) {
  if (!hfile_exists(path)) {
    json_t *r = json_object();
    json_object_set_new(r, "models", json_object());
    return r;
  }
  json_t *r = hjson_load_file(path, err);
  if (!r) return NULL;
  if (!json_is_object(r) || !json_is_object(json_object_get(r, "models"))) {
    json_decref(r);
    herr_set(err, HEARTH_EFORMAT, "%s: expected {\"models\": {NAME: {\"path\": PATH}}}; fix or remove the file", path);
    return NULL;
  }
  return r;
}

static int save_root(const char *path, json_t *root, herr *err) {
  char dir[PATH_MAX], tmp[PATH_MAX + 8];
  snprintf(dir, sizeof dir, "%s", path);
  for (char *p = dir + 1; *p; p++) /* mkdir -p the folder */
    if (*p == '/') {
      *p = 0;
      mkdir(dir, 0755);
      *p = '/';
    }
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  if (json_dump_file(root, tmp, JSON_INDENT(2) | JSON_SORT_KEYS) || rename(tmp, path)) {
    unlink(tmp);
    return herr_set(err, HEARTH_EIO, "cannot write the registry %s: %s", path, strerror(errno));
  }
  return 0;
}

int hub_registry_load(json_t **models, herr *err) {
  *models = NULL;
  char *path = hub_registry_path();
  if (!path) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  json_t *root = load_root(path, err);
  free(path);
  if (!root) return err ? err->code : HEARTH_EFORMAT;
  *models = json_incref(json_object_get(root, "models"));
  json_decref(root);
  return 0;
}

char *hub_registry_lookup(const char *name) {
  json_t *m = NULL;
  if (hub_registry_load(&m, NULL)) return NULL;
  const char *p = json_string_value(json_object_get(json_object_get(m, name), "path"));
  char *out = p ? strdup(p) : NULL;
  json_decref(m);
  return out;
}

int hub_registry_add(const char *path, char **name_out, herr *err) {
  if (name_out) *name_out = NULL;
  char abs[PATH_MAX];
  if (!realpath(path, abs)) return herr_set(err, HEARTH_ENOTFOUND, "%s: %s", path, strerror(errno));
  char *rp = hub_registry_path();
  json_t *root = rp ? load_root(rp, err) : NULL;
  if (!root) {
    free(rp);
    return rp ? (err ? err->code : HEARTH_EFORMAT) : herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  json_t *models = json_object_get(root, "models");
  const char *key;
  json_t *v;
  char name[300] = "";
  json_object_foreach(models, key, v) {
    const char *p = json_string_value(json_object_get(v, "path"));
    if (p && !strcmp(p, abs)) snprintf(name, sizeof name, "%s", key);
  }
  int rc = 0;
  if (!name[0]) {
    const char *b = strrchr(abs, '/');
    b = b && b[1] ? b + 1 : abs;
    char stem[256];
    snprintf(stem, sizeof stem, "%s", b);
    size_t l = strlen(stem);
    if (l > 5 && !strcmp(stem + l - 5, ".gguf")) stem[l - 5] = 0;
    snprintf(name, sizeof name, "%s", stem);
    for (int k = 2; json_object_get(models, name); k++) snprintf(name, sizeof name, "%s-%d", stem, k);
    json_t *e = json_object();
    json_object_set_new(e, "path", json_string(abs));
    json_object_set_new(models, name, e);
    rc = save_root(rp, root, err);
  }
  if (!rc && name_out) *name_out = strdup(name);
  json_decref(root);
  free(rp);
  return rc;
}

int hub_registry_remove(const char *name, herr *err) {
  char *rp = hub_registry_path();
  json_t *root = rp ? load_root(rp, err) : NULL;
  int rc = 0;
  if (!root) rc = rp ? (err ? err->code : HEARTH_EFORMAT) : herr_set(err, HEARTH_ENOMEM, "out of memory");
  else if (json_object_del(json_object_get(root, "models"), name))
    rc = herr_set(err, HEARTH_ENOTFOUND, "'%s' is not in the registry %s", name, rp);
  else rc = save_root(rp, root, err);
  json_decref(root);
  free(rp);
  return rc;
}
