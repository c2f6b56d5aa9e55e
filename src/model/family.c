/* family.c — the table of decoder families (see family.h): one row per
 * model_type, each following transformers' models/<type>/modeling_<type>.py:
 * its config.json's defaults (handed to format/config.c, which names no
 * type), the shared layers' switches, its capabilities and its hooks. Also
 * config.json read with those defaults (model_config_load) and the checks
 * of a parsed config. The forward pass itself lives in decoder.c and the
 * families' files. */
#include "model/family.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "model/internal.h"
#include "model/model.h"

/* The hooks of the families with a file of their own (each defined there; llama_family_ops: internal.h). */
extern const family_ops qwen3_moe_family_ops;
extern const family_ops gemma4_family_ops;
extern const family_ops qwen3_5_family_ops;
extern const family_ops qwen3_5_moe_family_ops;
extern const family_ops glm5_family_ops;
extern const family_ops diffusion_gemma_family_ops;
extern const family_ops granite_family_ops;

#define GELU "gelu_pytorch_tanh"
#define QWEN3_5_MTP "the mtp.fc / pre_fc_norm_* / layers.0 / norm tensors"

static const model_family families[] = {
    /* llama (also llama3 / yarn rope scaling) */
    {.model_type = "llama", .cfg = {.act = "silu", .theta = 1e4, .eps = 1e-6}, .split = true, .ops = &llama_family_ops},
    /* mistral: sliding_window on every layer */
    {.model_type = "mistral", .cfg = {.act = "silu", .theta = 1e4, .eps = 1e-6, .window = 4096, .layers = CFG_LAYERS_WINDOW},
     .split = true, .ops = &llama_family_ops},
    /* qwen2: q/k/v biases; sliding from max_window_layers on */
    {.model_type = "qwen2",
     .cfg = {.act = "silu", .theta = 1e4, .eps = 1e-6, .window = 4096, .layers = CFG_LAYERS_MAX_WINDOW, .qkv_bias = true},
     .split = true, .ops = &llama_family_ops},
    /* qwen3: q_norm / k_norm per head */
    {.model_type = "qwen3",
     .cfg = {.act = "silu", .theta = 1e4, .eps = 1e-6, .head_dim = 128, .window = 4096, .layers = CFG_LAYERS_MAX_WINDOW},
     .qk_norm = true, .split = true, .ops = &llama_family_ops},
    /* qwen3_moe.c: experts */
    {.model_type = "qwen3_moe", .cfg = {.act = "silu", .theta = 1e4, .eps = 1e-6, .window = 4096, .layers = CFG_LAYERS_USE_WINDOW},
     .qk_norm = true, .split = true, .ops = &qwen3_moe_family_ops},
    /* smollm3: every 4th layer skips RoPE (no_rope_layers) */
    {.model_type = "smollm3",
     .cfg = {.act = "silu", .theta = 2e6, .eps = 1e-6, .tie = true, .layers = CFG_LAYERS_NO_ROPE, .no_rope_every = 4},
     .split = true, .ops = &llama_family_ops},
    /* phi3: fused projections, partial rotary */
    {.model_type = "phi3", .cfg = {.act = "silu", .theta = 1e4, .eps = 1e-5, .layers = CFG_LAYERS_WINDOW}, .fused_qkv = true,
     .split = true, .ops = &llama_family_ops},
    /* granite.c: llama with embedding, attention, residual and logits multipliers */
    {.model_type = "granite", .cfg = {.act = "silu", .theta = 1e4, .eps = 1e-6}, .split = true, .ops = &granite_family_ops},
    /* gemma2: softcapping, sliding / full alternating */
    {.model_type = "gemma2",
     .cfg = {.act = GELU, .hidden_activation = true, .theta = 1e4, .eps = 1e-6, .tie = true, .head_dim = 256, .qpas = 256,
             .attn_cap = 50, .final_cap = 30, .window = 4096, .layers = CFG_LAYERS_PATTERN, .every = 2},
     .unit_offset_norm = true, .sandwich_norms = true, .scale_embeddings = true, .query_pre_attn_scalar = true, .split = true,
     .ops = &llama_family_ops},
    /* gemma3_text: a RoPE base of its own for the sliding layers, every 6th layer full */
    {.model_type = "gemma3_text",
     .cfg = {.act = GELU, .hidden_activation = true, .theta = 1e6, .local_theta = 1e4, .eps = 1e-6, .tie = true, .head_dim = 256,
             .qpas = 256, .window = 4096, .layers = CFG_LAYERS_PATTERN, .every = 6, .every_key = "sliding_window_pattern"},
     .unit_offset_norm = true, .sandwich_norms = true, .scale_embeddings = true, .qk_norm = true, .query_pre_attn_scalar = true,
     .split = true, .ops = &llama_family_ops},
    /* gemma4.c */
    {.model_type = "gemma4_text",
     .cfg = {.act = GELU, .hidden_activation = true, .theta = 1e6, .local_theta = 1e4, .eps = 1e-6, .tie = true, .head_dim = 256,
             .window = 512, .proportional = true, .layers = CFG_LAYERS_PATTERN, .every = 6, .last_full = true},
     .sandwich_norms = true, .scale_embeddings = true, .qk_norm = true, .v_norm = true, .split = true, .ops = &gemma4_family_ops},
    /* qwen3_5.c: hybrid of Gated DeltaNet and gated full attention */
    {.model_type = "qwen3_5_text",
     .cfg = {.act = "silu", .theta = 1e4, .eps = 1e-6, .head_dim = 256, .partial = 0.25, .layers = CFG_LAYERS_PATTERN, .every = 4,
             .every_key = "full_attention_interval", .linear = true},
     .unit_offset_norm = true, .qk_norm = true, .split = true, .mtp = QWEN3_5_MTP, .ops = &qwen3_5_family_ops},
    /* qwen3_5_moe.c: its experts beside qwen3_5.c's token mixers */
    {.model_type = "qwen3_5_moe_text",
     .cfg = {.act = "silu", .theta = 1e4, .eps = 1e-6, .head_dim = 256, .partial = 0.25, .layers = CFG_LAYERS_PATTERN, .every = 4,
             .every_key = "full_attention_interval", .linear = true, .inter_from = "shared_expert_intermediate_size",
             .inter_default = 512},
     .unit_offset_norm = true, .qk_norm = true, .split = true, .mtp = QWEN3_5_MTP, .ops = &qwen3_5_moe_family_ops},
    /* glm5.c: MLA, DSA, MoE */
    {.model_type = "glm_moe_dsa", .cfg = {.act = "silu", .theta = 1e4, .eps = 1e-5}, .split = true,
     .mtp = "num_nextn_predict_layers and the eh_proj / enorm / hnorm / shared_head tensors of the layer after the last",
     .ops = &glm5_family_ops},
    /* diffusion_gemma.c: block diffusion over Gemma 4's layers */
    {.model_type = "diffusion_gemma_text", .listed = "diffusion_gemma (block diffusion)",
     .cfg = {.act = GELU, .theta = 1e6, .local_theta = 1e4, .eps = 1e-6, .tie = true, .head_dim = 256, .final_cap = 30,
             .window = 512, .proportional = true, .layers = CFG_LAYERS_PATTERN, .every = 6, .last_full = true},
     .sandwich_norms = true, .scale_embeddings = true, .qk_norm = true, .v_norm = true, .canvas = true,
     .ops = &diffusion_gemma_family_ops},
};
static const int n_families = (int)(sizeof families / sizeof families[0]);

const model_family *model_family_find(const char *model_type) {
  for (int i = 0; model_type && i < n_families; i++)
    if (strcmp(families[i].model_type, model_type) == 0) return &families[i];
  return NULL;
}

const model_family *model_family_at(int i) { return i >= 0 && i < n_families ? &families[i] : NULL; }

/* ---- config.json with the families' defaults ---- */

static char supported[1024];
static pthread_once_t supported_once = PTHREAD_ONCE_INIT;

static void list_supported(void) {
  size_t n = 0;
  for (int i = 0; i < n_families; i++) {
    const model_family *f = &families[i];
    size_t len = strlen(f->model_type);
    const char *sep = i ? ", " : "";
    if (f->listed) n += (size_t)snprintf(supported + n, sizeof supported - n, "%s%s", sep, f->listed);
    else if (len > 5 && !strcmp(f->model_type + len - 5, "_text"))
      n += (size_t)snprintf(supported + n, sizeof supported - n, "%s%s, %.*s (text part)", sep, f->model_type, (int)(len - 5),
                            f->model_type);
    else n += (size_t)snprintf(supported + n, sizeof supported - n, "%s%s", sep, f->model_type);
    if (n >= sizeof supported) break; /* cut short (never with this table) */
  }
}

const char *model_supported_types(void) {
  pthread_once(&supported_once, list_supported);
  return supported;
}

static const config_defaults *defaults_of(const char *model_type) {
  const model_family *f = model_family_find(model_type);
  return f ? &f->cfg : NULL;
}

static const config_types types = {defaults_of, model_supported_types};

int model_config_load(model_config *c, const char *path, herr *err) { return config_load(c, path, &types, err); }

int model_config_from_json(model_config *c, const json_t *j, const char *what, herr *err) {
  return config_from_json(c, j, what, &types, err);
}

bool model_type_supported(const char *model_type) { return config_type_supported(&types, model_type); }

static int check_rope(const rope_config *r, const char *name, const char *what, herr *err) {
  if (!isfinite(r->theta) || r->theta <= 0)
    return herr_set(err, HEARTH_EFORMAT, "%s: %s %g must be a positive finite number", what, name, r->theta);
  if (!(r->partial_rotary_factor > 0 && r->partial_rotary_factor <= 1))
    return herr_set(err, HEARTH_EFORMAT, "%s: partial_rotary_factor %g must be in (0, 1]", what, r->partial_rotary_factor);
  if (r->kind != ROPE_DEFAULT && (!isfinite(r->factor) || r->factor < 0 || r->factor > 1e6))
    return herr_set(err, HEARTH_EFORMAT, "%s: rope_scaling factor %g is out of range (0 to 1e6)", what, r->factor);
  if (!isfinite(r->low_freq_factor) || !isfinite(r->high_freq_factor) || !isfinite(r->beta_fast) ||
      !isfinite(r->beta_slow) || !isfinite(r->attention_factor))
    return herr_set(err, HEARTH_EFORMAT, "%s: rope_scaling holds a value that is not a finite number", what);
  if (r->original_max_position < 0 || r->original_max_position > MODEL_MAX_CONTEXT)
    return herr_set(err, HEARTH_ELIMIT, "%s: original_max_position_embeddings %lld is out of range (0 to %lld)", what,
                    (long long)r->original_max_position, (long long)MODEL_MAX_CONTEXT);
  return 0;
}

int model_config_check(const model_config *c, const char *what, herr *err) {
  if (c->max_position_embeddings < 0 || c->max_position_embeddings > MODEL_MAX_CONTEXT)
    return herr_set(err, HEARTH_ELIMIT,
                    "%s: max_position_embeddings %lld is out of range (0 to %lld tokens); is the config.json right?", what,
                    (long long)c->max_position_embeddings, (long long)MODEL_MAX_CONTEXT);
  if (c->sliding_window < 0 || c->sliding_window > MODEL_MAX_CONTEXT)
    return herr_set(err, HEARTH_ELIMIT, "%s: sliding_window %lld is out of range (0 to %lld)", what,
                    (long long)c->sliding_window, (long long)MODEL_MAX_CONTEXT);
  if (!isfinite(c->rms_norm_eps) || c->rms_norm_eps >= 1)
    return herr_set(err, HEARTH_EFORMAT, "%s: rms_norm_eps %g must be a finite number below 1", what, c->rms_norm_eps);
  if (!isfinite(c->query_pre_attn_scalar) || !isfinite(c->attn_logit_softcapping) || !isfinite(c->final_logit_softcapping))
    return herr_set(err, HEARTH_EFORMAT, "%s: query_pre_attn_scalar and the softcapping values must be finite", what);
  int rc = check_rope(&c->rope, "rope_theta", what, err);
  if (!rc) rc = check_rope(&c->rope_local, "rope_local_base_freq", what, err);
  return rc;
}
