/* pooling.c — reads a sentence-transformers folder's embedding pipeline
 * (modules.json and the Pooling module's config.json) into a pooling
 * mode, untrusted input refused with messages that name the file and key.
 * Knows nothing of models, tensors or how pooling is computed. */
#include "format/pooling.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"

const char *pool_mode_name(pool_mode m) {
  switch (m) {
  case POOL_LAST: return "last token";
  case POOL_MEAN: return "mean";
  case POOL_CLS: return "cls";
  case POOL_MAX: return "max";
  case POOL_MEAN_SQRT: return "mean_sqrt_len";
  case POOL_WEIGHTED: return "weighted mean";
  default: return "other";
  }
}

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}

int pooling_parse_modules(const char *text, size_t len, const char *what, char *pool_path, size_t path_cap,
                          char *unsupported, size_t unsup_cap, herr *err) {
  if (path_cap) pool_path[0] = 0;
  if (unsup_cap) unsupported[0] = 0;
  json_t *j = hjson_load_buf(text, len, what, err);
  if (!j) return err ? err->code : HEARTH_EFORMAT;
  int rc = 0;
  if (!json_is_array(j)) {
    rc = herr_set(err, HEARTH_EFORMAT, "%s: expected an array of modules", what);
    goto out;
  }
  size_t i;
  json_t *mod;
  json_array_foreach(j, i, mod) {
    if (!json_is_object(mod)) {
      rc = herr_set(err, HEARTH_EFORMAT, "%s: module %zu is not an object", what, i);
      goto out;
    }
    char ctx[96];
    snprintf(ctx, sizeof ctx, "%s: module %zu", what, i);
    const char *type = NULL, *path = "";
    if ((rc = hjson_get_str(mod, "type", true, &type, ctx, err)) || (rc = hjson_get_str(mod, "path", false, &path, ctx, err)))
      goto out;
    if (ends_with(type, ".Pooling")) {
      if (strstr(path, "..") || strchr(path, '/') || strchr(path, '\\') || !path[0]) {
        rc = herr_set(err, HEARTH_EFORMAT, "%s: the Pooling module's path '%.100s' is not a folder name inside the model folder",
                      what, path);
        goto out;
      }
      if (strlen(path) >= path_cap) {
        rc = herr_set(err, HEARTH_ELIMIT, "%s: the Pooling module's path is %zu bytes long", what, strlen(path));
        goto out;
      }
      snprintf(pool_path, path_cap, "%s", path);
    } else if (!ends_with(type, ".Transformer") && !ends_with(type, ".Normalize") && unsup_cap && !unsupported[0]) {
      snprintf(unsupported, unsup_cap, "%s: module %zu (%.60s) is not one hearth runs (Transformer, Pooling, Normalize)",
               what, i, type);
    }
  }
out:
  json_decref(j);
  return rc;
}

int pooling_parse_config(const char *text, size_t len, const char *what, pooling_config *out, herr *err) {
  memset(out, 0, sizeof *out);
  json_t *j = hjson_load_buf(text, len, what, err);
  if (!j) return err ? err->code : HEARTH_EFORMAT;
  int rc = 0;
  if (!json_is_object(j)) {
    rc = herr_set(err, HEARTH_EFORMAT, "%s: expected an object", what);
    goto out;
  }
  static const struct {
    const char *key;
    pool_mode mode;
  } keys[] = {
      {"pooling_mode_lasttoken", POOL_LAST},
      {"pooling_mode_mean_tokens", POOL_MEAN},
      {"pooling_mode_cls_token", POOL_CLS},
      {"pooling_mode_max_tokens", POOL_MAX},
      {"pooling_mode_mean_sqrt_len_tokens", POOL_MEAN_SQRT},
      {"pooling_mode_weightedmean_tokens", POOL_WEIGHTED},
  };
  int n_on = 0;
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
    bool on = false;
    if ((rc = hjson_get_bool(j, keys[k].key, false, &on, what, err))) goto out;
    if (!on) continue;
    if (n_on++ == 0) {
      out->mode = keys[k].mode;
      snprintf(out->mode_key, sizeof out->mode_key, "%s", keys[k].key);
    }
  }
  if (n_on == 0) {
    rc = herr_set(err, HEARTH_EFORMAT, "%s: no pooling_mode_* key is true", what);
    goto out;
  }
  if (n_on > 1) {
    out->mode = POOL_OTHER;
    snprintf(out->unsupported, sizeof out->unsupported, "%s: %d pooling modes at once (concatenated) are not supported",
             what, n_on);
  }
out:
  json_decref(j);
  return rc;
}

static int read_text(const char *dir, const char *rel, char **text, size_t *len, char **path, herr *err) {
  *text = NULL;
  *path = hpath_join(dir, rel);
  if (!*path) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  if (!hfile_exists(*path)) return 0;
  return hfile_read(*path, text, len, err);
}

int pooling_load(const char *dir, pooling_config *out, herr *err) {
  memset(out, 0, sizeof *out);
  char *text = NULL, *path = NULL, pool_path[128] = "1_Pooling", unsupported[192] = "";
  size_t len = 0;
  int rc = read_text(dir, "modules.json", &text, &len, &path, err);
  if (!rc && text) {
    rc = pooling_parse_modules(text, len, path, pool_path, sizeof pool_path, unsupported, sizeof unsupported, err);
    if (!rc && !pool_path[0]) snprintf(pool_path, sizeof pool_path, "1_Pooling"); /* none listed: look anyway */
  }
  free(text);
  free(path);
  text = path = NULL;
  if (!rc) {
    char rel[160];
    snprintf(rel, sizeof rel, "%s/config.json", pool_path);
    rc = read_text(dir, rel, &text, &len, &path, err);
    if (!rc && text) rc = pooling_parse_config(text, len, path, out, err);
  }
  free(text);
  free(path);
  if (!rc && unsupported[0] && !out->unsupported[0]) snprintf(out->unsupported, sizeof out->unsupported, "%s", unsupported);
  return rc;
}
