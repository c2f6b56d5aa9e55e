/* gguf_model.c — reading a model from a GGUF file (see gguf_model.h): the
 * metadata keys of llama.cpp's llama, qwen2, qwen3, qwen3moe, phi3, gemma2,
 * gemma3 and granite architectures mapped onto config.json fields — with llama.cpp's
 * reading of them where it differs from transformers' (gemma2 and gemma3: the
 * sliding layers from the period 2 / 6 or sliding_window_pattern, queries
 * scaled by 1/sqrt(head_dim), norms stored with their +1; qwen2 and phi3: no
 * sliding window; granite: its four multipliers, q/k rows permuted as llama's,
 * attention.scale absent meaning 1/sqrt(head_dim)) —, tensor names mapped
 * onto Hugging Face names, and
 * vectors (norms, biases) converted to f32 (F32, F16, BF16, Q8_0, Q4_0) by
 * the backend's one dequantization (bk_dequant_row).
 * Matrices stay in the mapping (the decoder multiplies them as stored).
 * Knows nothing of the forward pass; other GGUF architectures are refused
 * with a message. */
#include "model/gguf_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/weights.h"
#include "model/model.h"

bool gguf_model_is_gguf(const char *path) {
  size_t n = strlen(path);
  return n > 5 && strcmp(path + n - 5, ".gguf") == 0;
}

/* Sets key in j from an integer metadata key when present. */
static int put_int(const gguf_file *g, json_t *j, const char *key, const char *gkey, bool required, herr *err) {
  int64_t v;
  if (!gguf_has(g, gkey)) return required ? herr_set(err, HEARTH_EFORMAT, "%s: metadata key '%s' is missing", gguf_path(g), gkey) : 0;
  int rc = gguf_get_int(g, gkey, &v, err);
  if (rc) return rc;
  json_object_set_new(j, key, json_integer(v));
  return 0;
}

static int put_float(const gguf_file *g, json_t *j, const char *key, const char *gkey, herr *err) {
  double v;
  if (!gguf_has(g, gkey)) return 0;
  int rc = gguf_get_float(g, gkey, &v, err);
  if (rc) return rc;
  json_object_set_new(j, key, json_real(v));
  return 0;
}

/* llama.cpp keeps Llama-3-style RoPE scaling as per-frequency divisors in
 * rope_freqs.weight (F32, one per rotated pair): the model's RoPE then
 * divides each frequency by its factor (ROPE_FACTORS), as ggml_rope_ext does. */
static int rope_freq_factors(const gguf_file *g, model_config *c, herr *err) {
  const gguf_tensor *t = gguf_find_tensor(g, "rope_freqs.weight");
  if (!t) return 0;
  int64_t rot = (int64_t)(c->head_dim * c->rope.partial_rotary_factor);
  rot -= rot % 2;
  if (t->type != GGUF_TENSOR_F32 || t->ndim != 1 || t->nelements != rot / 2 || t->nelements > ROPE_MAX_FACTORS ||
      t->nbytes < (size_t)t->nelements * sizeof(float))
    return herr_set(err, HEARTH_EFORMAT,
                    "%s: tensor 'rope_freqs.weight' must be F32 with one factor per rotated pair (%lld), not %s with %lld",
                    gguf_path(g), (long long)(rot / 2), gguf_tensor_type_name(t->type), (long long)t->nelements);
  if (c->rope.kind != ROPE_DEFAULT)
    return herr_set(err, HEARTH_EFORMAT, "%s: tensor 'rope_freqs.weight' together with rope.scaling.type: two RoPE scalings",
                    gguf_path(g));
  rope_config *r = &c->rope;
  for (int64_t i = 0; i < t->nelements; i++) {
    float f;
    memcpy(&f, (const char *)t->data + i * (int64_t)sizeof f, sizeof f);
    if (!(f > 0) || !isfinite(f))
      return herr_set(err, HEARTH_EFORMAT, "%s: tensor 'rope_freqs.weight': factor %lld is %g (must be positive)", gguf_path(g),
                      (long long)i, (double)f);
    r->freq_factors[i] = f;
  }
  r->n_freq_factors = (int)t->nelements;
  r->kind = ROPE_FACTORS;
  r->factor = 1;
  c->rope_local = *r;
  return 0;
}

/* gemma2 and gemma3 as llama.cpp runs them. The sliding layers: l with l % P < P - 1 (P:
 * attention.sliding_window_pattern, default 2 for gemma2 and 6 for gemma3 — config.c's rule; P = 0:
 * every layer), written out as layer_types. The window: attention.sliding_window, default 4096 for
 * gemma2; gemma3 slides only when the key is there and positive. RoPE base rope.freq_base_swa on the
 * sliding layers (gemma3: default 10000, gemma2: the global base; set by gguf_model_config, config.c
 * keeping one RoPE for gemma2). Queries scaled by 1/sqrt(key_length) (1/sqrt(hidden / heads) for
 * gemma2's 46-layer and gemma3's 62-layer 27B) instead of query_pre_attn_scalar. Softcapping: gemma2
 * attention and final logits (defaults 50 and 30), gemma3 the final logits when the key is there. */
static int gemma_config(const gguf_file *g, const char *arch, json_t *j, herr *err) {
  bool g2 = !strcmp(arch, "gemma2");
  int64_t window = g2 ? 4096 : 0, period = g2 ? 2 : 6, hd = 0, hidden = 0, heads = 0, layers = 0;
  char k[6][96];
#define GKEY(i, suffix) (snprintf(k[i], sizeof k[i], "%s.%s", arch, suffix), k[i])
  int rc = 0;
  if (gguf_has(g, GKEY(0, "attention.sliding_window")) && (rc = gguf_get_int(g, k[0], &window, err))) return rc;
  if (g2 && window <= 0)
    return herr_set(err, HEARTH_EFORMAT, "%s: %s must be positive (gemma2 slides on every other layer)", gguf_path(g), k[0]);
  if (gguf_has(g, GKEY(1, "attention.sliding_window_pattern"))) {
    const gguf_kv *kv = gguf_find_kv(g, k[1]);
    if (kv->type == GGUF_TYPE_ARRAY)
      return herr_set(err, HEARTH_EUNSUPPORTED, "%s: %s as a per-layer list is not supported", gguf_path(g), k[1]);
    if ((rc = gguf_get_int(g, k[1], &period, err))) return rc;
    if (period < 0) return herr_set(err, HEARTH_EFORMAT, "%s: %s must not be negative", gguf_path(g), k[1]);
  }
  if ((gguf_has(g, GKEY(2, "attention.key_length")) && (rc = gguf_get_int(g, k[2], &hd, err))) ||
      (rc = gguf_get_int(g, GKEY(3, "embedding_length"), &hidden, err)) ||
      (rc = gguf_get_int(g, GKEY(4, "attention.head_count"), &heads, err)) ||
      (rc = gguf_get_int(g, GKEY(5, "block_count"), &layers, err)))
    return rc;
  if (heads <= 0) return herr_set(err, HEARTH_EFORMAT, "%s: %s must be positive", gguf_path(g), k[4]);
  if (layers <= 0 || layers > CFG_MAX_LAYERS)
    return herr_set(err, HEARTH_ELIMIT, "%s: %s %lld is out of range (1 to %d)", gguf_path(g), k[5], (long long)layers, CFG_MAX_LAYERS);
  json_object_set_new(j, "sliding_window", json_integer(window > 0 ? window : 0));
  json_t *types = json_array();
  for (int64_t l = 0; l < layers; l++)
    json_array_append_new(types, json_string(period == 0 || l % period < period - 1 ? "sliding_attention" : "full_attention"));
  json_object_set_new(j, "layer_types", types);
  if (!g2) {
    if ((rc = put_float(g, j, "rope_local_base_freq", "gemma3.rope.freq_base_swa", err))) return rc;
    if (!gguf_has(g, "gemma3.rope.freq_base_swa")) json_object_set_new(j, "rope_local_base_freq", json_real(10000.0));
  }
  if (!hd) {
    hd = hidden / heads;
    json_object_set_new(j, "head_dim", json_integer(hd)); /* llama.cpp's default, not transformers' 256 */
  }
  json_object_set_new(j, "query_pre_attn_scalar", json_integer(layers == (g2 ? 46 : 62) ? hidden / heads : hd));
  if (g2) {
    json_object_set_new(j, "attn_logit_softcapping", json_real(50.0));
    json_object_set_new(j, "final_logit_softcapping", json_real(30.0));
    if ((rc = put_float(g, j, "attn_logit_softcapping", "gemma2.attn_logit_softcapping", err))) return rc;
  } else {
    json_object_set_new(j, "attn_logit_softcapping", json_null());
  }
  if ((rc = put_float(g, j, "final_logit_softcapping", GKEY(0, "final_logit_softcapping"), err))) return rc;
#undef GKEY
  return 0;
}

int gguf_model_config(const gguf_file *g, model_config *c, herr *err) {
  memset(c, 0, sizeof *c);
  char *arch = NULL;
  int rc = gguf_get_strdup(g, "general.architecture", &arch, err);
  if (rc) return rc;
  /* architectures whose GGUF layout is the Hugging Face one renamed (llama: q/k rows permuted) */
  bool moe = !strcmp(arch, "qwen3moe"), gemma2 = !strcmp(arch, "gemma2"), gemma3 = !strcmp(arch, "gemma3"),
       phi3 = !strcmp(arch, "phi3"), granite = !strcmp(arch, "granite");
  if (strcmp(arch, "llama") && strcmp(arch, "qwen2") && strcmp(arch, "qwen3") && !moe && !gemma2 && !gemma3 && !phi3 && !granite) {
    rc = herr_set(err, HEARTH_EUNSUPPORTED,
                  "%s: GGUF architecture '%s' is not supported (supported: llama, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3, "
                  "granite)",
                  gguf_path(g), arch);
    free(arch);
    return rc;
  }
  json_t *j = json_object();
  if (!j) {
    free(arch);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  char k[24][96];
#define KEY(i, suffix) (snprintf(k[i], sizeof k[i], "%s.%s", arch, suffix), k[i])
  json_object_set_new(j, "model_type", json_string(moe ? "qwen3_moe" : gemma3 ? "gemma3_text" : arch));
  json_object_set_new(j, "hidden_act", json_string(gemma2 || gemma3 ? "gelu_pytorch_tanh" : "silu"));
  if (phi3) json_object_set_new(j, "sliding_window", json_integer(0)); /* llama.cpp runs Phi-3 without one */
  if ((gemma2 || gemma3) && (rc = gemma_config(g, arch, j, err))) goto out;
  /* granite: transformers' four multipliers under llama.cpp's names (granite.c reads them; an absent key is 1,
     attention.scale absent is llama.cpp's 1/sqrt(head_dim)) */
  if (granite && ((rc = put_float(g, j, "embedding_multiplier", KEY(17, "embedding_scale"), err)) ||
                  (rc = put_float(g, j, "residual_multiplier", KEY(18, "residual_scale"), err)) ||
                  (rc = put_float(g, j, "logits_scaling", KEY(19, "logit_scale"), err)) ||
                  (rc = put_float(g, j, "attention_multiplier", KEY(20, "attention.scale"), err))))
    goto out;
  if (moe) { /* llama.cpp's qwen3moe: experts on every layer, top-k weights renormalized */
    json_object_set_new(j, "norm_topk_prob", json_true());
    if ((rc = put_int(g, j, "num_experts", KEY(14, "expert_count"), true, err)) ||
        (rc = put_int(g, j, "num_experts_per_tok", KEY(15, "expert_used_count"), true, err)) ||
        (rc = put_int(g, j, "moe_intermediate_size", KEY(16, "expert_feed_forward_length"), true, err)))
      goto out;
    if (!gguf_has(g, KEY(1, "feed_forward_length")))
      json_object_set(j, "intermediate_size", json_object_get(j, "moe_intermediate_size"));
  }
  if ((rc = put_int(g, j, "hidden_size", KEY(0, "embedding_length"), true, err)) ||
      (rc = put_int(g, j, "intermediate_size", KEY(1, "feed_forward_length"), !moe, err)) ||
      (rc = put_int(g, j, "num_hidden_layers", KEY(2, "block_count"), true, err)) ||
      (rc = put_int(g, j, "num_attention_heads", KEY(3, "attention.head_count"), true, err)) ||
      (rc = put_int(g, j, "num_key_value_heads", KEY(4, "attention.head_count_kv"), false, err)) ||
      (rc = put_int(g, j, "max_position_embeddings", KEY(5, "context_length"), false, err)) ||
      (rc = put_int(g, j, "head_dim", KEY(6, "attention.key_length"), false, err)) ||
      (rc = put_int(g, j, "bos_token_id", "tokenizer.ggml.bos_token_id", false, err)) ||
      (rc = put_int(g, j, "eos_token_id", "tokenizer.ggml.eos_token_id", false, err)) ||
      (rc = put_float(g, j, "rms_norm_eps", KEY(7, "attention.layer_norm_rms_epsilon"), err)) ||
      (rc = put_float(g, j, "rope_theta", KEY(8, "rope.freq_base"), err)))
    goto out;
  if (granite && !json_object_get(j, "attention_multiplier")) { /* llama.cpp's default: 1/sqrt(head_dim) */
    int64_t heads = json_integer_value(json_object_get(j, "num_attention_heads"));
    int64_t hd = json_object_get(j, "head_dim") ? json_integer_value(json_object_get(j, "head_dim"))
                                                : (heads > 0 ? json_integer_value(json_object_get(j, "hidden_size")) / heads : 0);
    if (hd > 0) json_object_set_new(j, "attention_multiplier", json_real(1.0 / sqrt((double)hd)));
  }
  /* vocabulary size: the key when present, else the embedding's rows */
  if (gguf_has(g, KEY(9, "vocab_size"))) {
    if ((rc = put_int(g, j, "vocab_size", k[9], true, err))) goto out;
  } else {
    const gguf_tensor *e = gguf_find_tensor(g, "token_embd.weight");
    if (!e || e->ndim != 2) {
      rc = herr_set(err, HEARTH_EFORMAT, "%s: tensor 'token_embd.weight' is missing or not 2-D", gguf_path(g));
      goto out;
    }
    json_object_set_new(j, "vocab_size", json_integer(e->dims[1]));
  }
  json_object_set_new(j, "tie_word_embeddings", json_boolean(gguf_find_tensor(g, "output.weight") == NULL));
  /* partial rotary: rope.dimension_count of head_dim */
  if (gguf_has(g, KEY(10, "rope.dimension_count"))) {
    int64_t rot, hidden, heads;
    if ((rc = gguf_get_int(g, k[10], &rot, err))) goto out;
    hidden = json_integer_value(json_object_get(j, "hidden_size"));
    heads = json_integer_value(json_object_get(j, "num_attention_heads"));
    int64_t hd = json_object_get(j, "head_dim") ? json_integer_value(json_object_get(j, "head_dim")) : (heads > 0 ? hidden / heads : 0);
    if (hd > 0 && rot > 0 && rot < hd) json_object_set_new(j, "partial_rotary_factor", json_real((double)rot / (double)hd));
  }
  if (gguf_has(g, KEY(11, "rope.scaling.type"))) {
    char *type = NULL;
    if ((rc = gguf_get_strdup(g, k[11], &type, err))) goto out;
    if (strcmp(type, "none") != 0) {
      json_t *rs = json_object();
      json_object_set_new(rs, "rope_type", json_string(type));
      json_object_set_new(j, "rope_scaling", rs);
      if ((rc = put_float(g, rs, "factor", KEY(12, "rope.scaling.factor"), err)) ||
          (rc = put_int(g, rs, "original_max_position_embeddings", KEY(13, "rope.scaling.original_context_length"), false, err))) {
        free(type);
        goto out;
      }
    }
    free(type);
  }
#undef KEY
  rc = model_config_from_json(c, j, gguf_path(g), err);
  if (!rc && gemma2 && gguf_has(g, "gemma2.rope.freq_base_swa")) { /* the sliding layers' own base (config.c keeps one) */
    double swa;
    if ((rc = gguf_get_float(g, "gemma2.rope.freq_base_swa", &swa, err))) config_free(c);
    else c->rope_local.theta = swa;
  }
  if (!rc && (rc = rope_freq_factors(g, c, err))) config_free(c);
  else if (!rc && (rc = model_config_check(c, gguf_path(g), err))) config_free(c);
out:
  json_decref(j);
  free(arch);
  return rc;
}

/* GGUF name ↔ Hugging Face name for the llama layout. */
static const struct { const char *hf, *gg; } top_names[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};
static const struct { const char *hf, *gg; } layer_names[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    /* qwen3moe: the router and the experts stacked 3-D ([experts, rows, cols]) */
    {"mlp.gate.weight", "ffn_gate_inp.weight"},
    {"mlp.experts.gate_proj", "ffn_gate_exps.weight"},
    {"mlp.experts.up_proj", "ffn_up_exps.weight"},
    {"mlp.experts.down_proj", "ffn_down_exps.weight"},
};
#define N_TOP_NAMES (sizeof top_names / sizeof top_names[0])
#define N_LAYER_NAMES (sizeof layer_names / sizeof layer_names[0])
/* Layer names of architectures that differ from the llama layout, looked up first. gemma2 and gemma3: a
 * norm after attention and two around the MLP; phi3: q/k/v and gate/up fused, as in its Hugging Face
 * checkpoint. */
typedef struct arch_name {
  const char *arch, *hf, *gg;
} arch_name;
static const arch_name arch_layer_names[] = {
    {"gemma2", "post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"gemma2", "pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"gemma2", "post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
    {"gemma3", "post_attention_layernorm.weight", "post_attention_norm.weight"},
    {"gemma3", "pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"gemma3", "post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
    {"phi3", "self_attn.qkv_proj.weight", "attn_qkv.weight"},
    {"phi3", "mlp.gate_up_proj.weight", "ffn_up.weight"},
};

/* Whether g's general.architecture is arch. */
static bool arch_is(const gguf_file *g, const char *arch) {
  const gguf_kv *kv = gguf_find_kv(g, "general.architecture");
  size_t n = strlen(arch);
  return kv && kv->type == GGUF_TYPE_STRING && kv->v.str.len == n && !memcmp(kv->v.str.ptr, arch, n);
}

bool gguf_model_hf_to_gguf_name(const char *hf, char *out, size_t n) {
  for (size_t i = 0; i < N_TOP_NAMES; i++)
    if (!strcmp(hf, top_names[i].hf)) return snprintf(out, n, "%s", top_names[i].gg) < (int)n;
  int l, used = 0;
  if (sscanf(hf, "model.layers.%d.%n", &l, &used) != 1 || used == 0) return false;
  for (size_t i = 0; i < N_LAYER_NAMES; i++)
    if (!strcmp(hf + used, layer_names[i].hf)) return snprintf(out, n, "blk.%d.%s", l, layer_names[i].gg) < (int)n;
  return false;
}

bool gguf_model_gguf_to_hf_name(const char *gg, char *out, size_t n) {
  for (size_t i = 0; i < N_TOP_NAMES; i++)
    if (!strcmp(gg, top_names[i].gg)) return snprintf(out, n, "%s", top_names[i].hf) < (int)n;
  int l, used = 0;
  if (sscanf(gg, "blk.%d.%n", &l, &used) != 1 || used == 0) return false;
  for (size_t i = 0; i < N_LAYER_NAMES; i++)
    if (!strcmp(gg + used, layer_names[i].gg)) return snprintf(out, n, "model.layers.%d.%s", l, layer_names[i].hf) < (int)n;
  return false;
}

bool model_bk_type_of_st(st_dtype dt, bk_type *out) {
  switch (dt) {
    case ST_F32: *out = BK_F32; return true;
    case ST_F16: *out = BK_F16; return true;
    case ST_BF16: *out = BK_BF16; return true;
    default: return false;
  }
}

bool model_bk_type_of_gguf(gguf_tensor_type t, bk_type *out) {
  switch (t) {
    case GGUF_TENSOR_F32: *out = BK_F32; return true;
    case GGUF_TENSOR_F16: *out = BK_F16; return true;
    case GGUF_TENSOR_BF16: *out = BK_BF16; return true;
    case GGUF_TENSOR_Q8_0: *out = BK_Q8_0; return true;
    case GGUF_TENSOR_Q4_0: *out = BK_Q4_0; return true;
    case GGUF_TENSOR_Q4_K: *out = BK_Q4_K; return true;
    case GGUF_TENSOR_Q5_K: *out = BK_Q5_K; return true;
    case GGUF_TENSOR_Q6_K: *out = BK_Q6_K; return true;
    case GGUF_TENSOR_Q5_0: *out = BK_Q5_0; return true;
    case GGUF_TENSOR_Q5_1: *out = BK_Q5_1; return true;
    case GGUF_TENSOR_Q2_K: *out = BK_Q2_K; return true;
    case GGUF_TENSOR_Q3_K: *out = BK_Q3_K; return true;
    case GGUF_TENSOR_IQ4_NL: *out = BK_IQ4_NL; return true;
    case GGUF_TENSOR_IQ4_XS: *out = BK_IQ4_XS; return true;
    default: return false;
  }
}

const char *gguf_model_file_type_name(int64_t ft) {
  static const char *const names[] = {
      [0] = "F32",      [1] = "F16",      [2] = "Q4_0",     [3] = "Q4_1",     [7] = "Q8_0",     [8] = "Q5_0",
      [9] = "Q5_1",     [10] = "Q2_K",    [11] = "Q3_K_S",  [12] = "Q3_K_M",  [13] = "Q3_K_L",  [14] = "Q4_K_S",
      [15] = "Q4_K_M",  [16] = "Q5_K_S",  [17] = "Q5_K_M",  [18] = "Q6_K",    [19] = "IQ2_XXS", [20] = "IQ2_XS",
      [21] = "Q2_K_S",  [22] = "IQ3_XS",  [23] = "IQ3_XXS", [24] = "IQ1_S",   [25] = "IQ4_NL",  [26] = "IQ3_S",
      [27] = "IQ3_M",   [28] = "IQ2_S",   [29] = "IQ2_M",   [30] = "IQ4_XS",  [31] = "IQ1_M",   [32] = "BF16",
      [36] = "TQ1_0",   [37] = "TQ2_0",   [38] = "MXFP4_MOE",
  };
  if (ft < 0 || ft >= (int64_t)(sizeof names / sizeof names[0])) return NULL;
  return names[ft];
}

const gguf_tensor *gguf_model_find(const gguf_file *g, const char *hf_name) {
  char name[256];
  int l, used = 0;
  if (sscanf(hf_name, "model.layers.%d.%n", &l, &used) == 1 && used > 0)
    for (size_t i = 0; i < sizeof arch_layer_names / sizeof arch_layer_names[0]; i++)
      if (!strcmp(hf_name + used, arch_layer_names[i].hf) && arch_is(g, arch_layer_names[i].arch)) {
        snprintf(name, sizeof name, "blk.%d.%s", l, arch_layer_names[i].gg);
        return gguf_find_tensor(g, name);
      }
  if (!gguf_model_hf_to_gguf_name(hf_name, name, sizeof name)) return NULL;
  return gguf_find_tensor(g, name);
}

/* A whole tensor as floats, through the backend's dequantization of the stored format. */
static int to_f32(const gguf_tensor *t, float *out, herr *err) {
  bk_type bt;
  if (!model_bk_type_of_gguf(t->type, &bt))
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor type %s is not supported (%s)", t->name, gguf_tensor_type_name(t->type),
                    GGUF_MODEL_TYPES);
  bk_weight w = {.type = bt, .rows = 1, .cols = t->nelements, .data = t->data};
  return bk_dequant_row(&w, 0, out, err);
}

int gguf_model_read_f32(const gguf_file *g, const gguf_tensor *t, const char *hf_name, int64_t heads, float *out, herr *err) {
  int rc = to_f32(t, out, err);
  if (rc) return rc;
  size_t hl = strlen(hf_name);
  if (hl >= 11 && !strcmp(hf_name + hl - 11, "norm.weight") && (arch_is(g, "gemma2") || arch_is(g, "gemma3"))) {
    /* llama.cpp's converter stores Gemma's (1 + w) norms as 1 + w; the decoder adds the 1 itself */
    for (int64_t i = 0; i < t->nelements; i++) out[i] -= 1.0f;
    return 0;
  }
  if (!arch_is(g, "llama") && !arch_is(g, "granite")) return 0; /* the architectures whose q/k rows the converter permutes */
  size_t n = strlen(hf_name);
  bool qk = n >= 13 && (!strcmp(hf_name + n - 13, "q_proj.weight") || !strcmp(hf_name + n - 13, "k_proj.weight"));
  if (!qk || t->ndim != 2 || heads <= 0) return 0;
  /* llama.cpp stores row (h, 2i + half) what Hugging Face has at row (h, half * hd/2 + i) */
  int64_t cols = t->dims[0], rows = t->dims[1], hd = rows / heads, half = hd / 2;
  if (rows == 0 || cols == 0) return 0; /* nothing to reorder (and no per-head loop over an empty tensor) */
  if (hd == 0 || hd * heads != rows || hd % 2) return herr_set(err, HEARTH_EFORMAT, "%s: %lld rows do not split into %lld heads", t->name, (long long)rows, (long long)heads);
  float *tmp = malloc((size_t)(hd * cols) * sizeof(float));
  if (!tmp) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (int64_t h = 0; h < heads; h++) {
    float *head = out + h * hd * cols;
    memcpy(tmp, head, (size_t)(hd * cols) * sizeof(float));
    for (int64_t i = 0; i < half; i++)
      for (int s = 0; s < 2; s++) memcpy(head + (s * half + i) * cols, tmp + (2 * i + s) * cols, (size_t)cols * sizeof(float));
  }
  free(tmp);
  return 0;
}
