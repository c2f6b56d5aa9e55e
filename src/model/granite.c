/* granite.c — IBM Granite's dense models (transformers' models/granite,
 * GraniteForCausalLM; Granite 3.x): the llama decoder — its layers,
 * weights and split (llama_family_ops) — with four multipliers from
 * config.json, each where modeling_granite.py applies it:
 *
 *   embedding_multiplier  GraniteModel: inputs_embeds = embed_tokens(ids) * it
 *   attention_multiplier  GraniteAttention.scaling: scores = q · kᵀ * it, in
 *                         place of 1/sqrt(head_dim)
 *   residual_multiplier   GraniteDecoderLayer: x = x + attn(norm(x)) * it, then
 *                         x = x + mlp(norm(x)) * it
 *   logits_scaling        GraniteForCausalLM: logits = lm_head(norm(x)) / it
 *
 * GraniteConfig's default for each is 1.0, attention_multiplier's too: a
 * config.json without it gets an attention scale of 1, not 1/sqrt(head_dim).
 * They become the model's embed_scale, residual_scale and logit_scale
 * (1 / logits_scaling), which the embedding, the shared attention, the llama
 * layer's MLP add and the head honour, and each layer's attn_scale. */
#include <math.h>
#include <stdlib.h>

#include "base/json.h"
#include "model/internal.h"

typedef struct granite_state {
  double attention; /* attention_multiplier: every layer's attention scale (prepare) */
} granite_state;

/* A multiplier: absent 1, else a positive finite number. */
static int multiplier(const json_t *j, const char *key, double *v, herr *err) {
  *v = 1.0;
  int rc = hjson_get_num(j, key, false, v, "config.json", err);
  if (!rc && !(isfinite(*v) && *v > 0))
    rc = herr_set(err, HEARTH_EFORMAT, "config.json: %s %g must be a positive finite number", key, *v);
  return rc;
}

static int config(model *m, herr *err) {
  granite_state *s = calloc(1, sizeof *s);
  if (!s) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  m->fam_state = s;
  const json_t *j = m->cfg.raw;
  double emb, res, logits;
  int rc;
  if ((rc = multiplier(j, "embedding_multiplier", &emb, err)) || (rc = multiplier(j, "attention_multiplier", &s->attention, err)) ||
      (rc = multiplier(j, "residual_multiplier", &res, err)) || (rc = multiplier(j, "logits_scaling", &logits, err)))
    return rc;
  m->embed_scale = emb != 1.0 ? (float)emb : 0.0f; /* 0: none */
  m->residual_scale = res != 1.0 ? (float)res : 0.0f;
  m->logit_scale = logits != 1.0 ? (float)(1.0 / logits) : 0.0f;
  return 0;
}

static int prepare(model *m, herr *err) {
  (void)err;
  const granite_state *s = m->fam_state;
  for (int l = 0; s && l < m->cfg.num_hidden_layers; l++) m->layers[l].attn_scale = (float)s->attention;
  return 0;
}

static int load_layer(model *m, const weight_src *src, int l, herr *err) { return llama_family_ops.load_layer(m, src, l, err); }

static void layer(model *m, int l, const kv_store *kv, step *st) { llama_family_ops.layer(m, l, kv, st); }

static void free_state(model *m) {
  free(m->fam_state);
  m->fam_state = NULL;
}

const family_ops granite_family_ops = {.config = config, .prepare = prepare, .load_layer = load_layer, .layer = layer,
                                       .shard = tp_shard_layers, .free = free_state};
