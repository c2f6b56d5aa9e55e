/* kv_quant.h — how the KV cache stores keys and values, per layer: f32, or
 * 8 / 4-bit integer or FP8 (E4M3) blocks with scales (the formats of
 * backend/ops.h, bk_kv_fmt). Chosen by a mode for every layer ("8", "4",
 * "fp8", "off") and, optionally, a
 * JSON file that sets layers or ranges of layers, keys and values apart:
 *
 *   {
 *     "default": "8",                       optional: every layer (else the mode)
 *     "layers": {
 *       "0": "off",                         one layer: "8", "4", "fp8", "off" (or 8, 4, 0)
 *       "1-3": {"k": "8", "v": "4"},        an inclusive range, K and V apart
 *       "-1": "off"                         negative: from the end (-1 = the last layer)
 *     }
 *   }
 *
 * Entries apply in the file's order, a later one over an earlier one; a
 * layer outside the model or an unknown format or key is an error that
 * names it. */
#ifndef HEARTH_ENGINE_KV_QUANT_H
#define HEARTH_ENGINE_KV_QUANT_H

#include "base/status.h"
#include "model/model.h"

typedef struct kv_quant {
  bk_kv_fmt k[CFG_MAX_LAYERS], v[CFG_MAX_LAYERS]; /* all 0 (f32) by default */
} kv_quant;

/* "8" / "q8" → BK_KV_Q8, "4" / "q4" → BK_KV_Q4, "fp8" → BK_KV_FP8,
 * "off" / "f32" / "none" / "0" → BK_KV_F32. */
int kv_quant_parse_fmt(const char *s, bk_kv_fmt *out, herr *err);
/* Per-layer formats of a model of n_layers from mode (NULL = "off") and
 * config_path (NULL = none). */
int kv_quant_make(const char *mode, const char *config_path, int n_layers, kv_quant *out, herr *err);
/* Sets g's storage formats from q (layers g marks f32_only stay f32). */
void kv_quant_apply(const kv_quant *q, model_kv_geometry *g);

#endif
