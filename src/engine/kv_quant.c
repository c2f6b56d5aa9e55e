/* kv_quant.c — the KV cache's per-layer storage formats from a mode and a
 * JSON config file (see kv_quant.h). Knows the formats by name only: the
 * bytes are the backend's (ops.h). */
#include "engine/kv_quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

int kv_quant_parse_fmt(const char *s, bk_kv_fmt *out, herr *err) {
  if (!s || !strcmp(s, "off") || !strcmp(s, "f32") || !strcmp(s, "none") || !strcmp(s, "0")) *out = BK_KV_F32;
  else if (!strcmp(s, "8") || !strcmp(s, "q8")) *out = BK_KV_Q8;
  else if (!strcmp(s, "4") || !strcmp(s, "q4")) *out = BK_KV_Q4;
  else if (!strcmp(s, "fp8")) *out = BK_KV_FP8;
  else return herr_set(err, HEARTH_EINVAL, "KV quantization '%s': expected 8, 4, fp8 or off", s);
  return 0;
}

/* A format given as a string or a number. */
static int fmt_of(const json_t *v, bk_kv_fmt *out, const char *where, herr *err) {
  char num[32];
  const char *s = NULL;
  if (json_is_string(v)) s = json_string_value(v);
  else if (json_is_integer(v)) snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v)), s = num;
  else return herr_set(err, HEARTH_EINVAL, "%s: a format must be \"8\", \"4\", \"fp8\" or \"off\"", where);
  int rc = kv_quant_parse_fmt(s, out, err);
  return rc ? herr_wrap(err, "%s", where) : 0;
}

/* K and V formats from "8" or {"k": "8", "v": "4"} (a missing half keeps *k / *v). */
static int pair_of(const json_t *v, bk_kv_fmt *k, bk_kv_fmt *vf, const char *where, herr *err) {
  if (!json_is_object(v)) {
    int rc = fmt_of(v, k, where, err);
    *vf = *k;
    return rc;
  }
  const char *key;
  json_t *x;
  json_object_foreach((json_t *)v, key, x) {
    int rc;
    if (!strcmp(key, "k")) rc = fmt_of(x, k, where, err);
    else if (!strcmp(key, "v")) rc = fmt_of(x, vf, where, err);
    else rc = herr_set(err, HEARTH_EINVAL, "%s: unknown key '%s' (expected \"k\", \"v\")", where, key);
    if (rc) return rc;
  }
  return 0;
}

/* "N", "-N" (from the end) or "A-B" (inclusive, either may be negative) → [*lo, *hi]. */
static int range_of(const char *key, int n_layers, int *lo, int *hi, const char *path, herr *err) {
  char *end;
  long a = strtol(key, &end, 10), b = a;
  if (end == key) goto bad;
  if (*end == '-') {
    const char *r = end + 1;
    b = strtol(r, &end, 10);
    if (end == r) goto bad;
  }
  if (*end) goto bad;
  if (a < 0) a += n_layers;
  if (b < 0) b += n_layers;
  if (a < 0 || b < 0 || a >= n_layers || b >= n_layers || a > b)
    return herr_set(err, HEARTH_EINVAL, "%s: layers '%s' are outside the model's 0..%d", path, key, n_layers - 1);
  *lo = (int)a, *hi = (int)b;
  return 0;
bad:
  return herr_set(err, HEARTH_EINVAL, "%s: '%s' is not a layer or a range of layers (\"3\", \"0-7\", \"-1\")", path, key);
}

int kv_quant_make(const char *mode, const char *config_path, int n_layers, kv_quant *out, herr *err) {
  memset(out, 0, sizeof *out);
  if (n_layers < 0 || n_layers > CFG_MAX_LAYERS) return herr_set(err, HEARTH_EINVAL, "KV quantization: %d layers", n_layers);
  bk_kv_fmt all;
  int rc = kv_quant_parse_fmt(mode, &all, err);
  if (rc) return rc;
  for (int l = 0; l < n_layers; l++) out->k[l] = out->v[l] = all;
  if (!config_path) return 0;
  json_t *root = hjson_load_file(config_path, err);
  if (!root) return herr_wrap(err, "KV quantization config");
  char where[512];
  const char *key;
  json_t *x;
  if (!json_is_object(root)) {
    rc = herr_set(err, HEARTH_EINVAL, "%s: expected a JSON object", config_path);
    goto out;
  }
  json_object_foreach(root, key, x) {
    if (strcmp(key, "default") && strcmp(key, "layers")) {
      rc = herr_set(err, HEARTH_EINVAL, "%s: unknown key '%s' (expected \"default\", \"layers\")", config_path, key);
      goto out;
    }
  }
  json_t *def = json_object_get(root, "default");
  if (def) {
    bk_kv_fmt k = all, v = all;
    snprintf(where, sizeof where, "%s: \"default\"", config_path);
    if ((rc = pair_of(def, &k, &v, where, err))) goto out;
    for (int l = 0; l < n_layers; l++) out->k[l] = k, out->v[l] = v;
  }
  json_t *layers = json_object_get(root, "layers");
  if (layers && !json_is_object(layers)) {
    rc = herr_set(err, HEARTH_EINVAL, "%s: \"layers\" must be an object of layer ranges", config_path);
    goto out;
  }
  if (layers) {
    json_object_foreach(layers, key, x) {
      int lo = 0, hi = -1;
      if ((rc = range_of(key, n_layers, &lo, &hi, config_path, err))) goto out;
      snprintf(where, sizeof where, "%s: layers \"%s\"", config_path, key);
      for (int l = lo; l <= hi; l++)
        if ((rc = pair_of(x, &out->k[l], &out->v[l], where, err))) goto out;
    }
  }
out:
  json_decref(root);
  return rc;
}

void kv_quant_apply(const kv_quant *q, model_kv_geometry *g) {
  for (int l = 0; l < g->n_layers; l++) {
    g->k_fmt[l] = g->f32_only[l] ? BK_KV_F32 : q->k[l];
    g->v_fmt[l] = g->f32_only[l] ? BK_KV_F32 : q->v[l];
  }
}
