/* adapter.c — reads a PEFT LoRA adapter's adapter_config.json (see
 * adapter.h) and opens its adapter_model.safetensors; decides which module
 * names the config targets and each one's scale, with PEFT's matching rules
 * (list entries match the name or its last dotted parts, a string is a regex
 * over the whole name). Knows nothing of models: model/lora.c puts the
 * tensors onto a model's projections. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "format/adapter.h"

#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/json.h"

static pcre2_code *compile_full(const char *pattern, bool suffix, const char *what, herr *err) {
  /* suffix: PEFT's pattern-key form "(.*\.)?(KEY)$" */
  char *buf = NULL;
  if (suffix) {
    size_t n = strlen(pattern) + 16;
    buf = malloc(n);
    if (!buf) {
      herr_set(err, HEARTH_ENOMEM, "out of memory");
      return NULL;
    }
    snprintf(buf, n, "(?:.*\\.)?(?:%s)", pattern);
    pattern = buf;
  }
  int ecode;
  PCRE2_SIZE eoff;
  pcre2_code *c = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED | PCRE2_ENDANCHORED, &ecode, &eoff, NULL);
  if (!c) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(ecode, msg, sizeof msg);
    herr_set(err, HEARTH_EFORMAT, "%s: regex '%s' does not compile at offset %zu: %s", what, pattern, (size_t)eoff,
             (const char *)msg);
  }
  free(buf);
  return c;
}

static bool full_match(const pcre2_code *c, const char *s) {
  pcre2_match_data *md = pcre2_match_data_create_from_pattern(c, NULL);
  if (!md) return false;
  int rc = pcre2_match(c, (PCRE2_SPTR)s, strlen(s), 0, 0, md, NULL);
  pcre2_match_data_free(md);
  return rc >= 0;
}

/* A list entry matches the name itself or its tail after a dot. */
static bool list_match(const json_t *list, const char *name) {
  size_t i;
  const json_t *v;
  size_t n = strlen(name);
  json_array_foreach(list, i, v) {
    if (!json_is_string(v)) continue;
    const char *t = json_string_value(v);
    size_t k = strlen(t);
    if (!strcmp(t, name) || (n > k && name[n - k - 1] == '.' && !strcmp(name + n - k, t))) return true;
  }
  return false;
}

int adapter_config_load(const char *dir, adapter_config *c, herr *err) {
  memset(c, 0, sizeof *c);
  char path[4096];
  struct stat sb;
  if (stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(path, sizeof path, "%s/adapter_config.json", dir);
  else snprintf(path, sizeof path, "%s", dir);
  json_t *raw = hjson_load_file(path, err);
  if (!raw) return err ? err->code : HEARTH_EIO;
  return adapter_config_from_json(raw, path, c, err);
}

int adapter_config_from_json(json_t *raw, const char *what, adapter_config *c, herr *err) {
  memset(c, 0, sizeof *c);
  c->raw = raw;
  int rc = 0;
  if (!json_is_object(c->raw)) {
    rc = herr_set(err, HEARTH_EFORMAT, "%s: not a JSON object", what);
    goto fail;
  }
  const char *type = "LORA", *bias = "none";
  bool dora = false;
  if ((rc = hjson_get_str(c->raw, "peft_type", false, &type, what, err)) || (rc = hjson_get_str(c->raw, "bias", false, &bias, what, err)) ||
      (rc = hjson_get_bool(c->raw, "use_dora", false, &dora, what, err)) ||
      (rc = hjson_get_bool(c->raw, "use_rslora", false, &c->rslora, what, err)) ||
      (rc = hjson_get_int(c->raw, "r", true, &c->r, what, err)) ||
      (rc = hjson_get_num(c->raw, "lora_alpha", false, &c->alpha, what, err)))
    goto fail;
  if (!json_object_get(c->raw, "lora_alpha")) c->alpha = 8; /* PEFT's default */
  if (strcmp(type, "LORA") != 0) {
    rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: peft_type '%s': only LoRA adapters (LORA) are supported", what, type);
    goto fail;
  }
  if (dora) {
    rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: use_dora: DoRA adapters (a learned magnitude per weight) are not supported", what);
    goto fail;
  }
  if (strcmp(bias, "none") != 0) {
    rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: bias '%s': adapters that train biases are not supported (only \"none\")", what, bias);
    goto fail;
  }
  const json_t *mts = json_object_get(c->raw, "modules_to_save");
  if (mts && !json_is_null(mts) && !(json_is_array(mts) && json_array_size(mts) == 0)) {
    rc = herr_set(err, HEARTH_EUNSUPPORTED,
                  "%s: modules_to_save: adapters that replace whole modules (an output head, embeddings) are not supported", what);
    goto fail;
  }
  const json_t *tp = json_object_get(c->raw, "target_parameters");
  if (tp && !json_is_null(tp)) { /* parameters named by their module's path: the experts' fused stacks (lora.c) */
    bool ok = json_is_array(tp);
    size_t i;
    const json_t *v;
    json_array_foreach(tp, i, v) ok = ok && json_is_string(v);
    if (!ok) {
      rc = herr_set(err, HEARTH_EINVAL, "%s: target_parameters must be a list of parameter names", what);
      goto fail;
    }
  }
  /* variants whose forward is not scale · B · A · x (or that train more than the low-rank pair) */
  static const char *const variants[] = {"lora_bias", "alora_invocation_tokens", "layer_replication", "trainable_token_indices",
                                         "use_qalora", "use_bdlora", "arrow_config", "monteclora_config", "kasa_config",
                                         "velora_config"};
  for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
    const json_t *v = json_object_get(c->raw, variants[i]);
    bool set = v && !json_is_null(v) && !json_is_false(v) && !((json_is_array(v) || json_is_object(v)) && json_array_size(v) + json_object_size(v) == 0);
    if (set) {
      rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: %s: this LoRA variant is not supported (plain LoRA and rsLoRA are)", what, variants[i]);
      goto fail;
    }
  }
  if (c->r <= 0 || c->r > 65536) {
    rc = herr_set(err, HEARTH_EFORMAT, "%s: r must be a positive rank, not %lld", what, (long long)c->r);
    goto fail;
  }
  if (!isfinite(c->alpha)) {
    rc = herr_set(err, HEARTH_EFORMAT, "%s: lora_alpha is not finite", what);
    goto fail;
  }
  const json_t *t = json_object_get(c->raw, "target_modules");
  if (t && json_is_string(t)) {
    c->target_regex = json_string_value(t);
    if (!(c->code_targets = compile_full(c->target_regex, false, what, err))) {
      rc = err ? err->code : HEARTH_EFORMAT;
      goto fail;
    }
  } else if (t && json_is_array(t)) c->targets = t;
  else if (t && !json_is_null(t)) {
    rc = herr_set(err, HEARTH_EFORMAT, "%s: field 'target_modules' must be a list of names or a regex string", what);
    goto fail;
  }
  const json_t *ex = json_object_get(c->raw, "exclude_modules");
  if (ex && json_is_string(ex)) {
    if (!(c->code_excludes = compile_full(json_string_value(ex), false, what, err))) {
      rc = err ? err->code : HEARTH_EFORMAT;
      goto fail;
    }
  } else if (ex && json_is_array(ex)) c->excludes = ex;
  const json_t *ly = json_object_get(c->raw, "layers_to_transform");
  if (ly && (json_is_array(ly) || json_is_integer(ly))) c->layers = ly;
  else if (ly && !json_is_null(ly)) {
    rc = herr_set(err, HEARTH_EFORMAT, "%s: field 'layers_to_transform' must be a layer index or a list of them", what);
    goto fail;
  }
  const json_t *rp = json_object_get(c->raw, "rank_pattern"), *ap = json_object_get(c->raw, "alpha_pattern");
  c->rank_pattern = rp && json_is_object(rp) && json_object_size(rp) ? rp : NULL;
  c->alpha_pattern = ap && json_is_object(ap) && json_object_size(ap) ? ap : NULL;
  return 0;
fail:
  adapter_config_free(c);
  return rc;
}

void adapter_config_free(adapter_config *c) {
  if (c->code_targets) pcre2_code_free(c->code_targets);
  if (c->code_excludes) pcre2_code_free(c->code_excludes);
  json_decref(c->raw);
  memset(c, 0, sizeof *c);
}

bool adapter_config_targets(const adapter_config *c, const char *module, int layer) {
  if (c->code_targets && !full_match(c->code_targets, module)) return false;
  if (c->targets && !list_match(c->targets, module)) return false;
  if (c->code_excludes && full_match(c->code_excludes, module)) return false;
  if (c->excludes && list_match(c->excludes, module)) return false;
  if (c->layers) {
    if (layer < 0) return false;
    if (json_is_integer(c->layers)) return json_integer_value(c->layers) == layer;
    size_t i;
    const json_t *v;
    json_array_foreach(c->layers, i, v) if (json_is_integer(v) && json_integer_value(v) == layer) return true;
    return false;
  }
  return true;
}

/* The first key of pattern (in file order) that names the module, PEFT's way. */
static const json_t *pattern_value(const json_t *pattern, const char *module) {
  if (!pattern) return NULL;
  const char *key;
  const json_t *v;
  json_object_foreach((json_t *)pattern, key, v) {
    if (!strcmp(key, module)) return v;
    pcre2_code *c = compile_full(key, true, "pattern", NULL);
    if (!c) continue;
    bool hit = full_match(c, module);
    pcre2_code_free(c);
    if (hit) return v;
  }
  return NULL;
}

int64_t adapter_config_rank(const adapter_config *c, const char *module) {
  const json_t *r = pattern_value(c->rank_pattern, module);
  return r && json_is_integer(r) ? json_integer_value(r) : c->r;
}

double adapter_config_scale(const adapter_config *c, const char *module, int64_t r) {
  double alpha = c->alpha;
  const json_t *a = pattern_value(c->alpha_pattern, module);
  if (a && json_is_number(a)) alpha = json_number_value(a);
  return c->rslora ? alpha / sqrt((double)r) : alpha / (double)r;
}

int adapter_open_weights(const char *dir, st_set *st, herr *err) {
  char path[4096];
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  struct stat sb;
  if (stat(path, &sb) != 0) {
    char alt[4096];
    snprintf(alt, sizeof alt, "%s/adapter_model.bin", dir);
    if (stat(alt, &sb) == 0)
      return herr_set(err, HEARTH_EUNSUPPORTED, "%s: adapter_model.bin (a pickle) is not read; save the adapter as safetensors", dir);
    return herr_set(err, HEARTH_ENOTFOUND, "%s: no adapter_model.safetensors", dir);
  }
  return st_open(st, path, err);
}
