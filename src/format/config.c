/* config.c — config.json / generation_config.json into typed structs (see
 * config.h). Owns the keys every decoder shares, how they are read where a
 * model_type's config is silent (a config_defaults the caller's types give
 * per model_type: what transformers assumes when a key is absent, which
 * layers slide), and both spellings of RoPE settings: the legacy
 * rope_theta + rope_scaling and the newer rope_parameters (flat, or keyed
 * by layer type for gemma3). Names no model_type: the types and their
 * defaults are the family rows of src/model/family.c. A family's own keys
 * (Gemma 4's per-layer inputs, Qwen3.5's linear attention, GLM-5's latent
 * attention and experts, DiffusionGemma's canvas) are read from `raw` by
 * its file in src/model. Refuses to know anything about weights. */
#include "format/config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"

/* A multimodal checkpoint's model_type ("gemma4"): its language model is text_config, a "<type>_text" config. */
static bool is_wrapper(const config_types *types, const char *t) {
  char text_type[80];
  snprintf(text_type, sizeof text_type, "%s_text", t);
  return !types->find(t) && types->find(text_type);
}

bool config_type_supported(const config_types *types, const char *model_type) {
  return model_type && (types->find(model_type) != NULL || is_wrapper(types, model_type));
}

static const char *const known_acts[] = {"silu", "swish", "gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu", "relu"};

/* A number field that may be absent or null. */
static int get_num_opt(const json_t *o, const char *key, double *out, const char *what, herr *err) {
  return hjson_get_num(o, key, false, out, what, err);
}

/* Reads one rope dict (rope_scaling or rope_parameters or one of its per-layer-type entries) into r. */
static int read_rope_dict(const json_t *d, rope_config *r, const char *what, herr *err) {
  if (!d || json_is_null(d)) return 0;
  if (!json_is_object(d)) return herr_set(err, HEARTH_EFORMAT, "%s: rope settings must be an object", what);
  const char *type = NULL;
  int rc;
  if ((rc = hjson_get_str(d, "rope_type", false, &type, what, err))) return rc;
  if (!type && (rc = hjson_get_str(d, "type", false, &type, what, err))) return rc;
  if (type) {
    if (!strcmp(type, "default")) r->kind = ROPE_DEFAULT;
    else if (!strcmp(type, "linear")) r->kind = ROPE_LINEAR;
    else if (!strcmp(type, "llama3")) r->kind = ROPE_LLAMA3;
    else if (!strcmp(type, "yarn")) r->kind = ROPE_YARN;
    else if (!strcmp(type, "dynamic")) r->kind = ROPE_DYNAMIC;
    else if (!strcmp(type, "longrope") || !strcmp(type, "su")) r->kind = ROPE_LONGROPE;
    else if (!strcmp(type, "proportional")) r->kind = ROPE_PROPORTIONAL;
    else return herr_set(err, HEARTH_EUNSUPPORTED, "%s: unsupported rope_type '%s' (supported: default, linear, llama3, yarn, proportional)", what, type);
  }
  if ((rc = get_num_opt(d, "rope_theta", &r->theta, what, err))) return rc;
  if ((rc = get_num_opt(d, "factor", &r->factor, what, err))) return rc;
  if ((rc = get_num_opt(d, "low_freq_factor", &r->low_freq_factor, what, err))) return rc;
  if ((rc = get_num_opt(d, "high_freq_factor", &r->high_freq_factor, what, err))) return rc;
  if ((rc = hjson_get_int(d, "original_max_position_embeddings", false, &r->original_max_position, what, err))) return rc;
  if ((rc = get_num_opt(d, "beta_fast", &r->beta_fast, what, err))) return rc;
  if ((rc = get_num_opt(d, "beta_slow", &r->beta_slow, what, err))) return rc;
  if ((rc = get_num_opt(d, "attention_factor", &r->attention_factor, what, err))) return rc;
  if ((rc = get_num_opt(d, "partial_rotary_factor", &r->partial_rotary_factor, what, err))) return rc;
  if (r->kind == ROPE_PROPORTIONAL && !json_object_get(d, "factor")) r->factor = 1.0;
  return 0;
}

static int check_rope(const rope_config *r, const char *what, herr *err) {
  if (!(r->theta > 0) || !isfinite(r->theta)) return herr_set(err, HEARTH_EFORMAT, "%s: rope_theta must be positive", what);
  if (!(r->partial_rotary_factor > 0 && r->partial_rotary_factor <= 1))
    return herr_set(err, HEARTH_EFORMAT, "%s: partial_rotary_factor must be in (0, 1]", what);
  if (r->kind == ROPE_DYNAMIC || r->kind == ROPE_LONGROPE)
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s: rope_type '%s' is not supported yet (supported: default, linear, llama3, yarn)",
                    what, r->kind == ROPE_DYNAMIC ? "dynamic" : "longrope");
  if (r->kind != ROPE_DEFAULT && !(r->factor > 0 && isfinite(r->factor)))
    return herr_set(err, HEARTH_EFORMAT, "%s: rope scaling needs a positive 'factor'", what);
  if (r->kind == ROPE_LLAMA3) {
    if (r->original_max_position <= 0)
      return herr_set(err, HEARTH_EFORMAT, "%s: llama3 rope scaling needs 'original_max_position_embeddings'", what);
    if (!(r->high_freq_factor != r->low_freq_factor))
      return herr_set(err, HEARTH_EFORMAT, "%s: llama3 rope scaling needs high_freq_factor != low_freq_factor", what);
  }
  return 0;
}

static int read_token_ids(const json_t *o, const char *key, int64_t *ids, int *n, const char *what, herr *err) {
  const json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (json_is_integer(v)) {
    ids[0] = json_integer_value(v);
    *n = 1;
    return 0;
  }
  if (!json_is_array(v)) return herr_set(err, HEARTH_EFORMAT, "%s: field '%s' must be an integer or a list of integers", what, key);
  *n = 0;
  size_t i;
  json_t *e;
  json_array_foreach(v, i, e) {
    if (!json_is_integer(e)) return herr_set(err, HEARTH_EFORMAT, "%s: field '%s' must be an integer or a list of integers", what, key);
    if (*n < CFG_MAX_EOS) ids[(*n)++] = json_integer_value(e);
  }
  return 0;
}

static int read_layer_types(const json_t *j, model_config *c, bool linear, bool *given, const char *what, herr *err) {
  const json_t *lt = json_object_get(j, "layer_types");
  *given = false;
  if (!lt || json_is_null(lt)) return 0;
  if (!json_is_array(lt)) return herr_set(err, HEARTH_EFORMAT, "%s: field 'layer_types' must be a list", what);
  if ((int64_t)json_array_size(lt) < c->num_hidden_layers)
    return herr_set(err, HEARTH_EFORMAT, "%s: 'layer_types' has %zu entries but num_hidden_layers is %lld", what,
                    json_array_size(lt), (long long)c->num_hidden_layers);
  for (int64_t l = 0; l < c->num_hidden_layers; l++) {
    const char *s = json_string_value(json_array_get(lt, (size_t)l));
    if (!s) return herr_set(err, HEARTH_EFORMAT, "%s: layer_types[%lld] must be a string", what, (long long)l);
    if (!strcmp(s, "full_attention")) c->layer_types[l] = LAYER_FULL;
    else if (!strcmp(s, "sliding_attention")) c->layer_types[l] = LAYER_SLIDING;
    else if (linear && !strcmp(s, "linear_attention")) c->layer_types[l] = LAYER_LINEAR;
    else if (!strcmp(s, "deepseek_sparse_attention")) c->layer_types[l] = LAYER_FULL; /* glm_moe_dsa: every layer */
    else return herr_set(err, HEARTH_EUNSUPPORTED, "%s: layer_types[%lld] is '%s' (supported: full_attention, sliding_attention%s)", what, (long long)l, s,
                         linear ? ", linear_attention" : "");
  }
  *given = true;
  return 0;
}

/* gemma3 / gemma4 / qwen3_5 / qwen3_5_moe / diffusion_gemma (the multimodal
 * checkpoints): the language model's config is text_config (a <type>_text
 * config); token ids and dtype may sit at the top, and the whole file is
 * kept as `top` for the keys a family reads there. */
static int gemma_text_part(model_config *c, const json_t *j, const char *type, const char *what, const config_types *types, herr *err) {
  const json_t *tc = json_object_get(j, "text_config");
  if (!json_is_object(tc)) return herr_set(err, HEARTH_EFORMAT, "%s: model_type '%s' needs a 'text_config' object", what, type);
  json_t *copy = json_deep_copy(tc);
  if (!copy) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  char text_type[32];
  snprintf(text_type, sizeof text_type, "%s_text", type);
  json_object_set_new(copy, "model_type", json_string(text_type));
  static const char *const inherit[] = {"eos_token_id", "bos_token_id", "pad_token_id", "torch_dtype", "dtype",
                                        "tie_word_embeddings"};
  for (size_t i = 0; i < sizeof inherit / sizeof inherit[0]; i++) {
    const json_t *v = json_object_get(j, inherit[i]);
    if (v && !json_object_get(copy, inherit[i])) json_object_set(copy, inherit[i], (json_t *)v);
  }
  char sub[300];
  snprintf(sub, sizeof sub, "%s: text_config", what);
  int rc = config_from_json(c, copy, sub, types, err);
  json_decref(copy);
  if (!rc && !(c->top = json_deep_copy(j))) {
    config_free(c);
    return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  }
  return rc;
}

int config_int_range(const json_t *j, const char *key, bool required, int64_t lo, int64_t hi, int64_t *v, const char *what,
                         herr *err) {
  const json_t *x = json_object_get(j, key);
  if (x && json_is_null(x) && !required) return 0;
  int rc = hjson_get_int(j, key, required, v, what, err);
  if (rc) return rc;
  if (x && (*v < lo || *v > hi))
    return herr_set(err, HEARTH_EFORMAT, "%s: %s %lld is out of range (%lld to %lld)", what, key, (long long)*v, (long long)lo,
                    (long long)hi);
  return 0;
}

int config_experts(const json_t *j, model_config *c, const char *k_key, const char *what, herr *err) {
  int rc;
  if ((rc = config_int_range(j, "num_experts", false, 1, 4096, &c->num_experts, what, err)) ||
      (!json_object_get(j, "num_experts") &&
       (rc = config_int_range(j, "num_local_experts", false, 1, 4096, &c->num_experts, what, err))) ||
      (rc = config_int_range(j, k_key, false, 1, c->num_experts, &c->num_experts_per_tok, what, err)) ||
      (rc = config_int_range(j, "moe_intermediate_size", false, 1, 1 << 22, &c->moe_intermediate_size, what, err)))
    return rc;
  if (c->num_experts_per_tok > c->num_experts)
    return herr_set(err, HEARTH_EFORMAT, "%s: %s %lld exceeds num_experts %lld", what, k_key, (long long)c->num_experts_per_tok,
                    (long long)c->num_experts);
  return 0;
}

int config_from_json(model_config *c, const json_t *j, const char *what, const config_types *types, herr *err) {
  memset(c, 0, sizeof *c);
  const char *top = json_is_object(j) ? json_string_value(json_object_get(j, "model_type")) : NULL;
  if (top && is_wrapper(types, top)) return gemma_text_part(c, j, top, what, types, err);
  c->bos_token_id = c->pad_token_id = -1;
  if (!json_is_object(j)) return herr_set(err, HEARTH_EFORMAT, "%s: must be a JSON object", what);
  int rc;
  const char *s = NULL;
  if ((rc = hjson_get_str(j, "model_type", true, &s, what, err))) return rc;
  const config_defaults *a = types->find(s);
  if (!a) return herr_set(err, HEARTH_EUNSUPPORTED, "%s: unsupported model_type '%s' (supported: %s)", what, s, types->list());
  snprintf(c->model_type, sizeof c->model_type, "%s", s);

  /* activation: some types (gemma) read hidden_activation first */
  const char *act = NULL;
  if (a->hidden_activation && (rc = hjson_get_str(j, "hidden_activation", false, &act, what, err))) return rc;
  if (!act && (rc = hjson_get_str(j, "hidden_act", false, &act, what, err))) return rc;
  if (!act) act = a->act ? a->act : "silu";
  bool known = false;
  for (size_t i = 0; i < sizeof known_acts / sizeof known_acts[0]; i++) known |= !strcmp(act, known_acts[i]);
  if (!known)
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s: unknown activation '%s' (supported: silu, gelu_pytorch_tanh, gelu_new, gelu, relu)", what, act);
  snprintf(c->hidden_act, sizeof c->hidden_act, "%s", act);

  s = NULL;
  if ((rc = hjson_get_str(j, "torch_dtype", false, &s, what, err))) return rc;
  if (!s && (rc = hjson_get_str(j, "dtype", false, &s, what, err))) return rc;
  if (s) snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", s);

  if ((rc = hjson_get_int(j, "vocab_size", true, &c->vocab_size, what, err))) return rc;
  if ((rc = hjson_get_int(j, "hidden_size", true, &c->hidden_size, what, err))) return rc;
  if (a->inter_from) { /* no dense MLP: another size stands in */
    c->intermediate_size = a->inter_default;
    if ((rc = hjson_get_int(j, a->inter_from, false, &c->intermediate_size, what, err))) return rc;
  }
  if ((rc = hjson_get_int(j, "intermediate_size", !a->inter_from, &c->intermediate_size, what, err)))
    return rc;
  if ((rc = hjson_get_int(j, "num_hidden_layers", true, &c->num_hidden_layers, what, err))) return rc;
  if ((rc = hjson_get_int(j, "num_attention_heads", true, &c->num_attention_heads, what, err))) return rc;
  c->num_key_value_heads = c->num_attention_heads;
  if ((rc = hjson_get_int(j, "num_key_value_heads", false, &c->num_key_value_heads, what, err))) return rc;
  if (c->vocab_size <= 0 || c->hidden_size <= 0 || c->intermediate_size <= 0 || c->num_hidden_layers <= 0 ||
      c->num_attention_heads <= 0 || c->num_key_value_heads <= 0)
    return herr_set(err, HEARTH_EFORMAT, "%s: vocab_size, hidden_size, intermediate_size, num_hidden_layers, "
                    "num_attention_heads and num_key_value_heads must all be positive", what);
  if (c->num_hidden_layers > CFG_MAX_LAYERS)
    return herr_set(err, HEARTH_ELIMIT, "%s: num_hidden_layers %lld exceeds the supported %d", what, (long long)c->num_hidden_layers, CFG_MAX_LAYERS);
  if (c->num_attention_heads % c->num_key_value_heads)
    return herr_set(err, HEARTH_EFORMAT, "%s: num_attention_heads %lld is not a multiple of num_key_value_heads %lld", what,
                    (long long)c->num_attention_heads, (long long)c->num_key_value_heads);
  if (c->hidden_size > (1 << 20) || c->intermediate_size > (1 << 22) || c->vocab_size > (1 << 24) || c->num_attention_heads > 4096)
    return herr_set(err, HEARTH_ELIMIT, "%s: sizes are implausibly large", what);
  c->head_dim = a->head_dim ? a->head_dim : c->hidden_size / c->num_attention_heads;
  if ((rc = hjson_get_int(j, "head_dim", false, &c->head_dim, what, err))) return rc;
  if (c->head_dim <= 0 || c->head_dim > 4096) return herr_set(err, HEARTH_EFORMAT, "%s: head_dim %lld is out of range", what, (long long)c->head_dim);
  c->max_position_embeddings = 0;
  if ((rc = hjson_get_int(j, "max_position_embeddings", false, &c->max_position_embeddings, what, err))) return rc;
  c->rms_norm_eps = a->eps;
  if ((rc = get_num_opt(j, "rms_norm_eps", &c->rms_norm_eps, what, err))) return rc;
  if (!(c->rms_norm_eps >= 0)) return herr_set(err, HEARTH_EFORMAT, "%s: rms_norm_eps must be >= 0", what);

  /* RoPE: legacy keys first, then rope_parameters on top. */
  rope_config r = {.kind = ROPE_DEFAULT, .theta = a->theta, .beta_fast = 32, .beta_slow = 1,
                   .partial_rotary_factor = a->partial ? a->partial : 1.0, .low_freq_factor = 1, .high_freq_factor = 4};
  if ((rc = get_num_opt(j, "rope_theta", &r.theta, what, err))) return rc;
  if ((rc = get_num_opt(j, "partial_rotary_factor", &r.partial_rotary_factor, what, err))) return rc;
  if ((rc = read_rope_dict(json_object_get(j, "rope_scaling"), &r, what, err))) return rc;
  if (a->proportional) { /* transformers' defaults when rope_parameters is absent */
    r.kind = ROPE_PROPORTIONAL;
    r.partial_rotary_factor = 0.25;
    r.factor = 1.0;
  }
  rope_config local = r;
  local.kind = ROPE_DEFAULT;
  local.partial_rotary_factor = 1.0;
  local.theta = a->local_theta ? a->local_theta : r.theta;
  if ((rc = get_num_opt(j, "rope_local_base_freq", &local.theta, what, err))) return rc;
  const json_t *rp = json_object_get(j, "rope_parameters");
  if (rp && json_is_object(rp) && (json_object_get(rp, "full_attention") || json_object_get(rp, "sliding_attention"))) {
    if ((rc = read_rope_dict(json_object_get(rp, "full_attention"), &r, what, err))) return rc;
    if ((rc = read_rope_dict(json_object_get(rp, "sliding_attention"), &local, what, err))) return rc;
  } else if (rp && !json_is_null(rp)) {
    if ((rc = read_rope_dict(rp, &r, what, err))) return rc;
    local = r;
  }
  if ((rc = check_rope(&r, what, err)) || (rc = check_rope(&local, what, err))) return rc;
  c->rope = r;
  c->rope_local = a->local_theta ? local : r;
  if (c->rope.kind != ROPE_PROPORTIONAL && (int64_t)(c->head_dim * c->rope.partial_rotary_factor) % 2)
    return herr_set(err, HEARTH_EFORMAT, "%s: head_dim %lld × partial_rotary_factor %g is not even", what, (long long)c->head_dim,
                    c->rope.partial_rotary_factor);

  c->tie_word_embeddings = a->tie;
  if ((rc = hjson_get_bool(j, "tie_word_embeddings", false, &c->tie_word_embeddings, what, err))) return rc;
  c->attention_bias = a->qkv_bias;
  if ((rc = hjson_get_bool(j, "attention_bias", false, &c->attention_bias, what, err))) return rc;
  if (a->qkv_bias) c->attention_bias = true; /* q/k/v biases always */
  if ((rc = hjson_get_bool(j, "mlp_bias", false, &c->mlp_bias, what, err))) return rc;

  /* Sliding window and which layers use it. */
  int64_t window = a->window;
  const json_t *sw = json_object_get(j, "sliding_window");
  if (sw && json_is_null(sw)) window = 0;
  else if ((rc = hjson_get_int(j, "sliding_window", false, &window, what, err))) return rc;
  if (window < 0) window = 0;
  bool use_sw = false;
  if ((rc = hjson_get_bool(j, "use_sliding_window", false, &use_sw, what, err))) return rc;
  bool given = false;
  if ((rc = read_layer_types(j, c, a->linear, &given, what, err))) return rc;
  int64_t L = c->num_hidden_layers;
  /* no_rope_layers[i] = 1 uses RoPE, 0 skips it; without them every no_rope_layer_interval-th layer skips */
  if (a->no_rope_every > 0) {
    int64_t interval = a->no_rope_every;
    if ((rc = hjson_get_int(j, "no_rope_layer_interval", false, &interval, what, err))) return rc;
    const json_t *nr = json_object_get(j, "no_rope_layers");
    if (nr && !json_is_null(nr)) {
      if (!json_is_array(nr) || (int64_t)json_array_size(nr) < L)
        return herr_set(err, HEARTH_EFORMAT, "%s: 'no_rope_layers' must be a list with one entry per layer", what);
      for (int64_t l = 0; l < L; l++) {
        json_t *e = json_array_get(nr, (size_t)l);
        if (!json_is_integer(e) && !json_is_boolean(e))
          return herr_set(err, HEARTH_EFORMAT, "%s: no_rope_layers[%lld] must be 0 or 1", what, (long long)l);
        bool uses = json_is_integer(e) ? json_integer_value(e) != 0 : json_is_true(e);
        c->no_rope[l] = !uses;
      }
    } else {
      if (interval <= 0) return herr_set(err, HEARTH_EFORMAT, "%s: no_rope_layer_interval must be positive", what);
      for (int64_t l = 0; l < L; l++) c->no_rope[l] = (l + 1) % interval == 0;
    }
  }
  if (!given) { /* the type's rule */
    int64_t from = L, every = a->every;
    if (a->layers == CFG_LAYERS_MAX_WINDOW && (rc = hjson_get_int(j, "max_window_layers", false, &from, what, err))) return rc;
    if (a->layers == CFG_LAYERS_PATTERN) {
      if (a->every_key && (rc = hjson_get_int(j, a->every_key, false, &every, what, err))) return rc;
      if (every <= 0)
        return herr_set(err, HEARTH_EFORMAT, "%s: %s must be positive", what, a->every_key ? a->every_key : "the layer pattern");
    }
    for (int64_t l = 0; l < L; l++) {
      bool sliding = false;
      switch (a->layers) {
      case CFG_LAYERS_FULL: break;
      case CFG_LAYERS_WINDOW: sliding = window > 0; break;
      case CFG_LAYERS_USE_WINDOW: sliding = use_sw && window > 0; break;
      case CFG_LAYERS_MAX_WINDOW: sliding = use_sw && window > 0 && l >= from; break;
      case CFG_LAYERS_NO_ROPE: sliding = use_sw && window > 0 && c->no_rope[l]; break;
      case CFG_LAYERS_PATTERN: sliding = (l + 1) % every != 0 && !(a->last_full && l == L - 1); break;
      }
      c->layer_types[l] = !sliding ? LAYER_FULL : a->linear ? LAYER_LINEAR : LAYER_SLIDING;
    }
  }
  bool any_sliding = false;
  for (int64_t l = 0; l < L; l++) any_sliding |= c->layer_types[l] == LAYER_SLIDING;
  if (any_sliding && window <= 0) {
    /* sliding layers without a window attend everything */
    for (int64_t l = 0; l < L; l++) c->layer_types[l] = LAYER_FULL;
    any_sliding = false;
  }
  c->sliding_window = any_sliding ? window : 0;

  /* query scale and softcaps */
  c->query_pre_attn_scalar = a->qpas;
  if ((rc = get_num_opt(j, "query_pre_attn_scalar", &c->query_pre_attn_scalar, what, err))) return rc;
  c->attn_logit_softcapping = a->attn_cap;
  c->final_logit_softcapping = a->final_cap;
  const json_t *v;
  if ((v = json_object_get(j, "attn_logit_softcapping")) && json_is_null(v)) c->attn_logit_softcapping = 0;
  else if ((rc = get_num_opt(j, "attn_logit_softcapping", &c->attn_logit_softcapping, what, err))) return rc;
  if ((v = json_object_get(j, "final_logit_softcapping")) && json_is_null(v)) c->final_logit_softcapping = 0;
  else if ((rc = get_num_opt(j, "final_logit_softcapping", &c->final_logit_softcapping, what, err))) return rc;
  if (c->attn_logit_softcapping < 0 || c->final_logit_softcapping < 0 || c->query_pre_attn_scalar < 0)
    return herr_set(err, HEARTH_EFORMAT, "%s: softcapping values and query_pre_attn_scalar must not be negative", what);

  for (int64_t l = 0; l < L; l++) c->layer_head_dim[l] = c->head_dim, c->layer_kv_heads[l] = c->num_key_value_heads;

  /* token ids */
  if ((rc = hjson_get_int(j, "bos_token_id", false, &c->bos_token_id, what, err))) return rc;
  if ((rc = hjson_get_int(j, "pad_token_id", false, &c->pad_token_id, what, err))) return rc;
  if ((rc = read_token_ids(j, "eos_token_id", c->eos_token_ids, &c->n_eos, what, err))) return rc;

  /* MLX quantization block */
  const json_t *q = json_object_get(j, "quantization");
  if (!q) q = json_object_get(j, "quantization_config");
  if (q && json_is_object(q) && json_object_get(q, "bits")) {
    int64_t bits = 0, gs = 64;
    if ((rc = hjson_get_int(q, "bits", false, &bits, what, err))) return rc;
    if ((rc = hjson_get_int(q, "group_size", false, &gs, what, err))) return rc;
    if (bits <= 0 || bits > 16 || gs <= 0 || gs > 4096)
      return herr_set(err, HEARTH_EFORMAT, "%s: quantization bits %lld / group_size %lld out of range", what, (long long)bits, (long long)gs);
    c->quant_bits = (int)bits;
    c->quant_group_size = (int)gs;
  }
  c->raw = json_deep_copy(j);
  if (!c->raw) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  return 0;
}

int config_load(model_config *c, const char *path, const config_types *types, herr *err) {
  memset(c, 0, sizeof *c);
  char *file = hfile_is_dir(path) ? hpath_join(path, "config.json") : strdup(path);
  if (!file) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  json_t *j = hjson_load_file(file, err);
  if (!j) {
    free(file);
    return err ? err->code : HEARTH_EIO;
  }
  int rc = config_from_json(c, j, file, types, err);
  json_decref(j);
  free(file);
  if (rc) config_free(c);
  return rc;
}

void config_free(model_config *c) {
  if (!c) return;
  json_decref(c->raw);
  json_decref(c->top);
  c->raw = c->top = NULL;
}

int generation_config_load(generation_config *g, const char *dir, herr *err) {
  memset(g, 0, sizeof *g);
  g->temperature = 1.0;
  g->top_p = 1.0;
  g->min_p = 0.0;
  g->repetition_penalty = 1.0;
  g->top_k = 50;
  g->bos_token_id = g->pad_token_id = -1;
  char *file = hfile_is_dir(dir) ? hpath_join(dir, "generation_config.json") : strdup(dir);
  if (!file) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  if (!hfile_exists(file)) {
    free(file);
    return 0;
  }
  json_t *j = hjson_load_file(file, err);
  int rc = 0;
  if (!j) {
    rc = err ? err->code : HEARTH_EFORMAT;
    goto out;
  }
  if (!json_is_object(j)) {
    rc = herr_set(err, HEARTH_EFORMAT, "%s: must be a JSON object", file);
    goto out;
  }
  g->present = true;
  if ((rc = hjson_get_bool(j, "do_sample", false, &g->do_sample, file, err))) goto out;
  if ((rc = hjson_get_num(j, "temperature", false, &g->temperature, file, err))) goto out;
  if ((rc = hjson_get_num(j, "top_p", false, &g->top_p, file, err))) goto out;
  if ((rc = hjson_get_num(j, "min_p", false, &g->min_p, file, err))) goto out;
  if ((rc = hjson_get_num(j, "repetition_penalty", false, &g->repetition_penalty, file, err))) goto out;
  if ((rc = hjson_get_int(j, "top_k", false, &g->top_k, file, err))) goto out;
  if ((rc = hjson_get_int(j, "max_new_tokens", false, &g->max_new_tokens, file, err))) goto out;
  if ((rc = hjson_get_int(j, "bos_token_id", false, &g->bos_token_id, file, err))) goto out;
  if ((rc = hjson_get_int(j, "pad_token_id", false, &g->pad_token_id, file, err))) goto out;
  if ((rc = read_token_ids(j, "eos_token_id", g->eos_token_ids, &g->n_eos, file, err))) goto out;
out:
  json_decref(j);
  free(file);
  return rc;
}
