/* adapter.h — a PEFT LoRA adapter folder as it is on disk:
 * adapter_config.json (rank, alpha, rsLoRA, which modules and layers it
 * targets) and adapter_model.safetensors (lora_A / lora_B per module).
 *
 * What is read from adapter_config.json:
 *   peft_type            "LORA" (absent: taken as LORA)
 *   r, lora_alpha        scale = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora
 *   rank_pattern,        per-module rank / alpha, keys matched as PEFT does: a
 *   alpha_pattern        module whose name is KEY or ends in ".KEY" (KEY a regex)
 *   target_modules       a list (a module is targeted when its name equals an
 *                        entry or ends in "." + entry) or a string (a regex the
 *                        whole module name must match), as PEFT
 *   exclude_modules      the same forms, excluded
 *   layers_to_transform  an int or a list of layer indices (others untouched)
 *   fan_in_fan_out       only means something for Conv1D bases (GPT-2); the
 *                        Linear projections hearth runs take it as false, as PEFT does
 *   target_parameters    a list of parameter names (PEFT's ParamWrapper: the
 *                        experts' fused mlp.experts.gate_up_proj / down_proj),
 *                        matched by the model code against its tensors
 * Refused with a message naming the field: use_dora, modules_to_save,
 * bias other than "none", another peft_type, r <= 0, and
 * the variants whose forward is not scale · B · A · x when set: lora_bias,
 * alora_invocation_tokens, layer_replication, trainable_token_indices,
 * use_qalora, use_bdlora, arrow / monteclora / kasa / velora configs.
 */
#ifndef HEARTH_FORMAT_ADAPTER_H
#define HEARTH_FORMAT_ADAPTER_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "format/safetensors.h"

typedef struct adapter_config {
  json_t *raw;            /* owned: adapter_config.json */
  int64_t r;
  double alpha;
  bool rslora;
  const char *target_regex; /* borrowed from raw: target_modules as a string, or NULL */
  const json_t *targets;  /* borrowed from raw: target_modules as a list, or NULL */
  const json_t *excludes; /* borrowed: exclude_modules (list or string), or NULL */
  const json_t *layers;   /* borrowed: layers_to_transform (list or int), or NULL */
  const json_t *rank_pattern, *alpha_pattern; /* borrowed: objects, or NULL */
  void *code_targets, *code_excludes; /* owned: compiled regexes (pcre2_code), or NULL */
} adapter_config;

/* Reads DIR/adapter_config.json (dir may also name the file itself). */
int adapter_config_load(const char *dir, adapter_config *c, herr *err);
/* The same from parsed JSON (raw: taken, freed with c or on failure); what names it in messages. */
int adapter_config_from_json(json_t *raw, const char *what, adapter_config *c, herr *err);
void adapter_config_free(adapter_config *c);
/* Whether the config targets the module named `module` (its full name,
 * "model.layers.3.self_attn.q_proj") at layer `layer` (-1: not in a layer). */
bool adapter_config_targets(const adapter_config *c, const char *module, int layer);
/* The rank module `module` has (rank_pattern applied). */
int64_t adapter_config_rank(const adapter_config *c, const char *module);
/* The scale of module `module` whose tensors have rank r (rank_pattern
 * and alpha_pattern applied as PEFT does). */
double adapter_config_scale(const adapter_config *c, const char *module, int64_t r);

/* Opens DIR/adapter_model.safetensors. */
int adapter_open_weights(const char *dir, st_set *st, herr *err);

#endif
