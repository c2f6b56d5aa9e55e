/* test_config.c — config.json / generation_config.json parsing as a model
 * is loaded (model_config_load: format/config.c with the families' rows):
 * the golden fixtures written by transformers 5.17 (rope_parameters
 * spelling), legacy configs (rope_theta + rope_scaling, derived layer
 * types), each family's defaults, and errors that name the field. */
#include <string.h>

#include "base/json.h"
#include "format/config.h"
#include "model/model.h"
#include "test.h"

#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden/"

static int parse(const char *text, model_config *c, herr *err) {
  json_t *j = hjson_load_buf(text, strlen(text), "config.json", err);
  if (!j) return err->code;
  int rc = model_config_from_json(c, j, "config.json", err);
  json_decref(j);
  return rc;
}

#define BASE "\"vocab_size\": 100, \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 6, \"num_attention_heads\": 4"

static void test_golden_configs(void) {
  model_config c;
  herr err = {0};
  CHECK(model_config_load(&c, GOLDEN "gemma3-f32", &err) == 0);
  CHECK_EQ_STR(c.model_type, "gemma3_text");
  CHECK_EQ_STR(c.hidden_act, "gelu_pytorch_tanh");
  CHECK_EQ_STR(c.torch_dtype, "float32");
  CHECK_EQ_INT(c.head_dim, 16);
  CHECK_EQ_INT(c.num_key_value_heads, 2);
  CHECK(c.layer_types[0] == LAYER_SLIDING && c.layer_types[1] == LAYER_FULL && c.layer_types[2] == LAYER_SLIDING);
  CHECK_EQ_INT(c.sliding_window, 8);
  CHECK(c.rope.kind == ROPE_LINEAR && c.rope.factor == 2.0 && c.rope.theta == 1e6);
  CHECK(c.rope_local.kind == ROPE_DEFAULT && c.rope_local.theta == 1e4);
  CHECK(c.query_pre_attn_scalar == 24);
  CHECK(c.attn_logit_softcapping == 0 && c.final_logit_softcapping == 0);
  CHECK(c.tie_word_embeddings);
  CHECK_EQ_INT(c.bos_token_id, 1);
  CHECK_EQ_INT(c.n_eos, 1);
  CHECK_EQ_INT(c.eos_token_ids[0], 2);
  config_free(&c);

  CHECK(model_config_load(&c, GOLDEN "gemma2-bf16/config.json", &err) == 0);
  CHECK_EQ_STR(c.torch_dtype, "bfloat16");
  CHECK(c.attn_logit_softcapping == 5.0 && c.final_logit_softcapping == 10.0);
  CHECK(c.layer_types[0] == LAYER_SLIDING && c.layer_types[1] == LAYER_FULL);
  config_free(&c);

  CHECK(model_config_load(&c, GOLDEN "qwen2-f32", &err) == 0);
  CHECK(c.attention_bias);
  CHECK_EQ_INT(c.num_key_value_heads, 1);
  CHECK(c.layer_types[0] == LAYER_FULL && c.layer_types[1] == LAYER_SLIDING && c.layer_types[2] == LAYER_SLIDING);
  config_free(&c);

  CHECK(model_config_load(&c, GOLDEN "smollm3-f32", &err) == 0);
  CHECK(!c.no_rope[0] && c.no_rope[1]);
  CHECK_EQ_INT(c.sliding_window, 0);
  CHECK(c.rope.theta == 2e6);
  config_free(&c);

  CHECK(model_config_load(&c, GOLDEN "phi3-f32", &err) == 0);
  CHECK(c.rope.partial_rotary_factor == 0.5);
  CHECK(!c.tie_word_embeddings);
  config_free(&c);

  CHECK(model_config_load(&c, GOLDEN "llama_yarn-f32", &err) == 0);
  CHECK(c.rope.kind == ROPE_YARN && c.rope.factor == 4.0 && c.rope.original_max_position == 32);
  CHECK(c.rope.beta_fast == 32 && c.rope.beta_slow == 1);
  config_free(&c);

  CHECK(model_config_load(&c, GOLDEN "llama_llama3-f32", &err) == 0);
  CHECK(c.rope.kind == ROPE_LLAMA3 && c.rope.factor == 8.0 && c.rope.low_freq_factor == 1.0 && c.rope.high_freq_factor == 4.0);
  config_free(&c);

  CHECK(model_config_load(&c, GOLDEN "mistral-f32", &err) == 0);
  CHECK_EQ_INT(c.sliding_window, 8);
  CHECK(c.layer_types[0] == LAYER_SLIDING && c.layer_types[1] == LAYER_SLIDING);
  config_free(&c);
}

/* qwen3_moe's and gemma4's shared fields as transformers 5.17 writes them. */
static void test_moe_and_gemma4_configs(void) {
  model_config c;
  herr err = {0};
  CHECK(model_config_load(&c, GOLDEN "qwen3_moe-f32", &err) == 0);
  CHECK_EQ_STR(c.model_type, "qwen3_moe");
  CHECK_EQ_INT(c.num_experts, 0); /* its experts are its own keys (tests/model/test_family_config.c) */
  CHECK_EQ_INT(c.sliding_window, 0);
  config_free(&c);

  CHECK(model_config_load(&c, GOLDEN "gemma4-f32", &err) == 0);
  CHECK_EQ_STR(c.model_type, "gemma4_text");
  CHECK(c.rope.kind == ROPE_PROPORTIONAL && c.rope.partial_rotary_factor == 0.25 && c.rope.theta == 1e6 && c.rope.factor == 1);
  CHECK(c.rope_local.kind == ROPE_DEFAULT && c.rope_local.theta == 1e4 && c.rope_local.partial_rotary_factor == 1);
  CHECK(c.final_logit_softcapping == 30.0);
  CHECK(c.raw && !c.top); /* its own keys (tests/model/test_family_config.c) stay in raw */
  config_free(&c);

  /* gemma4 defaults: proportional RoPE, every 6th layer and the last full */
  CHECK(parse("{\"model_type\": \"gemma4_text\", \"vocab_size\": 100, \"hidden_size\": 64, \"intermediate_size\": 128, "
              "\"num_hidden_layers\": 8, \"num_attention_heads\": 4}", &c, &err) == 0);
  CHECK(c.rope.kind == ROPE_PROPORTIONAL && c.rope.partial_rotary_factor == 0.25);
  CHECK(c.layer_types[0] == LAYER_SLIDING && c.layer_types[5] == LAYER_FULL && c.layer_types[6] == LAYER_SLIDING &&
        c.layer_types[7] == LAYER_FULL);
  config_free(&c);
  /* glm_moe_dsa: every layer a deepseek_sparse_attention layer (its experts: test_family_config.c) */
  CHECK(parse("{\"model_type\": \"glm_moe_dsa\", " BASE ", \"n_routed_experts\": 16, \"num_experts_per_tok\": 4, "
              "\"moe_intermediate_size\": 32, \"layer_types\": [\"deepseek_sparse_attention\", \"deepseek_sparse_attention\", "
              "\"deepseek_sparse_attention\", \"deepseek_sparse_attention\", \"deepseek_sparse_attention\", "
              "\"deepseek_sparse_attention\"]}", &c, &err) == 0);
  CHECK(c.layer_types[4] == LAYER_FULL);
  CHECK(c.rms_norm_eps == 1e-5);
  config_free(&c);
}

/* DiffusionGemma: the text stack's config under text_config, the whole file kept as top (where its
 * canvas_length is: test_family_config.c), the final softcap of 30 that config.json does not state. */
static void test_diffusion_gemma_config(void) {
  model_config c;
  herr err = {0};
  const char *text =
      "{\"model_type\": \"diffusion_gemma\", \"canvas_length\": 8, \"tie_word_embeddings\": true, \"text_config\": {"
      "\"model_type\": \"diffusion_gemma_text\", " BASE ", \"num_key_value_heads\": 2, \"head_dim\": 16, "
      "\"sliding_window\": 8, \"per_layer_config\": {\"5\": {\"head_dim\": 32, \"num_key_value_heads\": 1}}, "
      "\"num_experts\": 4, \"top_k_experts\": 2, \"moe_intermediate_size\": 16, \"eos_token_id\": 2}}";
  CHECK(parse(text, &c, &err) == 0);
  CHECK_EQ_STR(c.model_type, "diffusion_gemma_text");
  CHECK(c.top && json_integer_value(json_object_get(c.top, "canvas_length")) == 8);
  CHECK(!json_object_get(c.raw, "canvas_length"));
  CHECK_EQ_INT(c.layer_types[0], LAYER_SLIDING);
  CHECK_NEAR(c.final_logit_softcapping, 30.0, 0);
  CHECK_EQ_INT(c.rope.kind, ROPE_PROPORTIONAL);
  config_free(&c);
}

/* Qwen3.5: the hybrid layer types, the linear-attention sizes, partial RoPE from rope_parameters
 * (0.25 by default), the MoE variant without a dense intermediate_size, and the multimodal
 * checkpoints' text_config with the top-level token ids and dtype. */
static void test_qwen3_5_configs(void) {
  model_config c;
  herr err = {0};
  CHECK(model_config_load(&c, GOLDEN "qwen3_5-f32", &err) == 0);
  CHECK_EQ_STR(c.model_type, "qwen3_5_text");
  CHECK(c.layer_types[0] == LAYER_LINEAR && c.layer_types[1] == LAYER_FULL && c.layer_types[3] == LAYER_LINEAR);
  CHECK(c.rope.partial_rotary_factor == 0.5 && c.sliding_window == 0);
  config_free(&c);
  CHECK(model_config_load(&c, GOLDEN "qwen3_5_moe-f32", &err) == 0);
  CHECK_EQ_STR(c.model_type, "qwen3_5_moe_text");
  config_free(&c);
  /* defaults: every 4th layer full attention, partial rotary 0.25, head_dim 256 */
  CHECK(parse("{\"model_type\": \"qwen3_5_moe\", \"eos_token_id\": 7, \"dtype\": \"bfloat16\", \"text_config\": "
              "{\"model_type\": \"qwen3_5_moe_text\", \"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 8, "
              "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"rope_parameters\": {\"rope_type\": \"default\", "
              "\"rope_theta\": 10000000, \"mrope_section\": [11, 11, 10], \"mrope_interleaved\": true}}}", &c, &err) == 0);
  CHECK_EQ_STR(c.model_type, "qwen3_5_moe_text");
  CHECK(c.layer_types[0] == LAYER_LINEAR && c.layer_types[2] == LAYER_LINEAR && c.layer_types[3] == LAYER_FULL &&
        c.layer_types[7] == LAYER_FULL);
  CHECK(c.rope.partial_rotary_factor == 0.25 && c.rope.theta == 1e7);
  CHECK_EQ_INT(c.head_dim, 256);
  CHECK_EQ_INT(c.intermediate_size, 512);
  CHECK(c.n_eos == 1 && c.eos_token_ids[0] == 7);
  CHECK_EQ_STR(c.torch_dtype, "bfloat16");
  config_free(&c);
  /* linear_attention is Qwen3.5's alone */
  CHECK(parse("{\"model_type\": \"llama\", " BASE ", \"layer_types\": [\"linear_attention\", "
              "\"linear_attention\", \"linear_attention\", \"linear_attention\", \"linear_attention\", \"full_attention\"]}", &c,
              &err) == HEARTH_EUNSUPPORTED);
}

static void test_legacy_and_defaults(void) {
  model_config c;
  herr err = {0};
  /* legacy gemma3: rope_theta, rope_local_base_freq, rope_scaling with "type"; layer types from the 6-pattern */
  CHECK(parse("{\"model_type\": \"gemma3_text\", " BASE ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 8},"
              " \"rope_theta\": 1000000, \"rope_local_base_freq\": 10000, \"eos_token_id\": [1, 106]}",
              &c, &err) == 0);
  for (int l = 0; l < 5; l++) CHECK(c.layer_types[l] == LAYER_SLIDING);
  CHECK(c.layer_types[5] == LAYER_FULL);
  CHECK_EQ_INT(c.head_dim, 256);
  CHECK_EQ_INT(c.sliding_window, 4096);
  CHECK(c.rope.kind == ROPE_LINEAR && c.rope.factor == 8 && c.rope.theta == 1e6);
  CHECK(c.rope_local.kind == ROPE_DEFAULT && c.rope_local.theta == 1e4);
  CHECK_EQ_INT(c.n_eos, 2);
  CHECK_EQ_INT(c.eos_token_ids[1], 106);
  CHECK(c.query_pre_attn_scalar == 256);
  config_free(&c);

  /* gemma2 defaults: alternate sliding/full starting with sliding, softcaps 50 / 30 */
  CHECK(parse("{\"model_type\": \"gemma2\", " BASE "}", &c, &err) == 0);
  CHECK(c.layer_types[0] == LAYER_SLIDING && c.layer_types[1] == LAYER_FULL && c.layer_types[4] == LAYER_SLIDING);
  CHECK(c.attn_logit_softcapping == 50 && c.final_logit_softcapping == 30);
  config_free(&c);

  /* qwen2: sliding only when use_sliding_window, from max_window_layers on */
  CHECK(parse("{\"model_type\": \"qwen2\", " BASE ", \"sliding_window\": 32, \"max_window_layers\": 4}", &c, &err) == 0);
  CHECK_EQ_INT(c.sliding_window, 0);
  for (int l = 0; l < 6; l++) CHECK(c.layer_types[l] == LAYER_FULL);
  config_free(&c);
  CHECK(parse("{\"model_type\": \"qwen2\", " BASE ", \"sliding_window\": 32, \"max_window_layers\": 4, \"use_sliding_window\": true}",
              &c, &err) == 0);
  CHECK_EQ_INT(c.sliding_window, 32);
  CHECK(c.layer_types[3] == LAYER_FULL && c.layer_types[4] == LAYER_SLIDING);
  config_free(&c);

  /* mistral: null sliding_window means full attention */
  CHECK(parse("{\"model_type\": \"mistral\", " BASE ", \"sliding_window\": null, \"rope_theta\": 1e6}", &c, &err) == 0);
  CHECK_EQ_INT(c.sliding_window, 0);
  CHECK(c.rope.theta == 1e6);
  CHECK_EQ_INT(c.num_key_value_heads, 4);
  CHECK_EQ_INT(c.head_dim, 16);
  config_free(&c);

  /* smollm3: every 4th layer skips RoPE by default */
  CHECK(parse("{\"model_type\": \"smollm3\", " BASE "}", &c, &err) == 0);
  CHECK(!c.no_rope[0] && !c.no_rope[2] && c.no_rope[3] && !c.no_rope[4]);
  CHECK(c.tie_word_embeddings);
  config_free(&c);

  /* llama3 scaling in the legacy block */
  CHECK(parse("{\"model_type\": \"llama\", " BASE ", \"rope_theta\": 500000, \"rope_scaling\": {\"rope_type\": \"llama3\", "
              "\"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}}",
              &c, &err) == 0);
  CHECK(c.rope.kind == ROPE_LLAMA3 && c.rope.original_max_position == 8192 && c.rope.theta == 5e5);
  CHECK(!c.tie_word_embeddings);
  config_free(&c);

  /* MLX quantization block */
  CHECK(parse("{\"model_type\": \"llama\", " BASE ", \"quantization\": {\"group_size\": 32, \"bits\": 4}}", &c, &err) == 0);
  CHECK_EQ_INT(c.quant_bits, 4);
  CHECK_EQ_INT(c.quant_group_size, 32);
  CHECK(json_is_object(json_object_get(c.raw, "quantization")));
  config_free(&c);
}

static void test_errors(void) {
  model_config c;
  herr err = {0};
  CHECK_EQ_INT(parse("{\"model_type\": \"mamba\", " BASE "}", &c, &err), HEARTH_EUNSUPPORTED);
  CHECK(strstr(err.msg, "mamba") && strstr(err.msg, "gemma3_text"));
  CHECK_EQ_INT(parse("{" BASE "}", &c, &err), HEARTH_EFORMAT);
  CHECK(strstr(err.msg, "model_type"));
  CHECK_EQ_INT(parse("{\"model_type\": \"llama\", \"vocab_size\": 10}", &c, &err), HEARTH_EFORMAT);
  CHECK(strstr(err.msg, "hidden_size"));
  CHECK_EQ_INT(parse("{\"model_type\": \"llama\", " BASE ", \"hidden_act\": \"swiglu9\"}", &c, &err), HEARTH_EUNSUPPORTED);
  CHECK(strstr(err.msg, "swiglu9"));
  CHECK_EQ_INT(parse("{\"model_type\": \"llama\", " BASE ", \"num_key_value_heads\": 3}", &c, &err), HEARTH_EFORMAT);
  CHECK(strstr(err.msg, "num_key_value_heads"));
  CHECK_EQ_INT(parse("{\"model_type\": \"llama\", " BASE ", \"hidden_size\": \"big\"}", &c, &err), HEARTH_EFORMAT);
  CHECK(strstr(err.msg, "hidden_size"));
  CHECK_EQ_INT(parse("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\": \"wobble\", \"factor\": 2}}", &c, &err),
               HEARTH_EUNSUPPORTED);
  CHECK(strstr(err.msg, "wobble"));
  CHECK_EQ_INT(parse("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\": \"linear\"}}", &c, &err), HEARTH_EFORMAT);
  CHECK(strstr(err.msg, "factor"));
  CHECK_EQ_INT(parse("{\"model_type\": \"gemma3_text\", " BASE ", \"layer_types\": [\"full_attention\"]}", &c, &err), HEARTH_EFORMAT);
  CHECK(strstr(err.msg, "layer_types"));
  CHECK_EQ_INT(parse("{\"model_type\": \"llama\", " BASE ", \"num_hidden_layers\": 100000}", &c, &err), HEARTH_ELIMIT);
  CHECK_EQ_INT(parse("[1, 2]", &c, &err), HEARTH_EFORMAT);
  CHECK(model_config_load(&c, HEARTH_SOURCE_DIR "/no/such/dir", &err) != 0);
  CHECK(strstr(err.msg, "no/such/dir") != NULL);
  CHECK(model_type_supported("qwen3") && model_type_supported("gemma4") && !model_type_supported("gpt2"));
  /* the list is made from the family rows: each row's type, a wrapper's "(text part)", a canvas family's note
   * (containment, so a new family's row needs no edit here) */
  static const char *const listed[] = {"llama, ",           "mistral, ",           "qwen3_moe, ",        "phi3, ",
                                       "gemma3 (text part)", "gemma4 (text part)", "qwen3_5_moe (text part)",
                                       "glm_moe_dsa",        "diffusion_gemma (block diffusion)"};
  for (size_t i = 0; i < sizeof listed / sizeof listed[0]; i++) CHECK(strstr(model_supported_types(), listed[i]) != NULL);
  CHECK(strncmp(model_supported_types(), "llama, ", 7) == 0);
}

static void test_generation_config(void) {
  generation_config g;
  herr err = {0};
  CHECK(generation_config_load(&g, GOLDEN "llama-f32", &err) == 0);
  CHECK(g.present);
  CHECK_EQ_INT(g.bos_token_id, 1);
  CHECK_EQ_INT(g.n_eos, 1);
  CHECK_EQ_INT(g.eos_token_ids[0], 2);
  CHECK(g.temperature == 1.0 && g.top_p == 1.0 && g.top_k == 50 && !g.do_sample);
  CHECK(generation_config_load(&g, HEARTH_SOURCE_DIR "/tests", &err) == 0);
  CHECK(!g.present);
  CHECK(g.repetition_penalty == 1.0);
}

int main(void) {
  RUN(test_golden_configs);
  RUN(test_moe_and_gemma4_configs);
  RUN(test_qwen3_5_configs);
  RUN(test_diffusion_gemma_config);
  RUN(test_legacy_and_defaults);
  RUN(test_errors);
  RUN(test_generation_config);
  TEST_MAIN_END();
}
