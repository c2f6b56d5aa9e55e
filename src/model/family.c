/* family.c — the table of decoder families (see family.h): one row per
 * model_type, each following transformers' models/<type>/modeling_<type>.py.
 * Knows the switches only; the forward pass itself lives in decoder.c. */
#include "model/family.h"

#include <math.h>
#include <string.h>

#include "model/internal.h"
#include "model/model.h"

static const model_family families[] = {
    /* type          unit_off sandwich embscale qk_norm fused  qpas   v_norm  ops */
    {"llama",        false,   false,   false,   false,  false, false, false, NULL}, /* also llama3 / yarn rope scaling */
    {"mistral",      false,   false,   false,   false,  false, false, false, NULL}, /* sliding_window on every layer */
    {"qwen2",        false,   false,   false,   false,  false, false, false, NULL}, /* q/k/v biases; max_window_layers */
    {"qwen3",        false,   false,   false,   true,   false, false, false, NULL}, /* q_norm / k_norm per head */
    {"qwen3_moe",    false,   false,   false,   true,   false, false, false, &qwen3_moe_family_ops}, /* experts */
    {"smollm3",      false,   false,   false,   false,  false, false, false, NULL}, /* no_rope_layers */
    {"phi3",         false,   false,   false,   false,  true,  false, false, NULL}, /* fused projections, partial rotary */
    {"gemma2",       true,    true,    true,    false,  false, true,  false, NULL}, /* softcapping, sliding/global */
    {"gemma3_text",  true,    true,    true,    true,   false, true,  false, NULL}, /* local rope base for sliding layers */
    {"gemma4_text",  false,   true,    true,    true,   false, false, true,  &gemma4_family_ops}, /* gemma4.c */
    {"qwen3_5_text", true,    false,   false,   true,   false, false, false, &qwen3_5_family_ops}, /* qwen3_5.c: hybrid */
    {"qwen3_5_moe_text", true, false,  false,   true,   false, false, false, &qwen3_5_moe_family_ops}, /* qwen3_5_moe.c */
    {"diffusion_gemma_text", false, true, true, true, false, false, true, &diffusion_gemma_family_ops}, /* diffusion_gemma.c */
    {"glm_moe_dsa",  false,   false,   false,   false,  false, false, false, &glm5_family_ops}, /* glm5.c: MLA, DSA, MoE */
};

const model_family *model_family_find(const char *model_type) {
  for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
    if (strcmp(families[i].model_type, model_type) == 0) return &families[i];
  return NULL;
}

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
