/* family.c — the table of decoder families (see family.h): one row per
 * model_type, each following transformers' models/<type>/modeling_<type>.py.
 * Knows the switches only; the forward pass itself lives in decoder.c. */
#include "model/family.h"

#include <string.h>

static const model_family families[] = {
    /* type          unit_off sandwich embscale qk_norm fused  qpas */
    {"llama",        false,   false,   false,   false,  false, false}, /* also llama3 / yarn rope scaling */
    {"mistral",      false,   false,   false,   false,  false, false}, /* sliding_window on every layer */
    {"qwen2",        false,   false,   false,   false,  false, false}, /* q/k/v biases; max_window_layers */
    {"qwen3",        false,   false,   false,   true,   false, false}, /* q_norm / k_norm per head */
    {"smollm3",      false,   false,   false,   false,  false, false}, /* no_rope_layers */
    {"phi3",         false,   false,   false,   false,  true,  false}, /* fused projections, partial rotary */
    {"gemma2",       true,    true,    true,    false,  false, true},  /* softcapping, sliding/global */
    {"gemma3_text",  true,    true,    true,    true,   false, true},  /* local rope base for sliding layers */
};

const model_family *model_family_find(const char *model_type) {
  for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
    if (strcmp(families[i].model_type, model_type) == 0) return &families[i];
  return NULL;
}
