/* test_fit.c — hearth_fit on the golden fixture models: the KV bytes per
 * token (all layers and each layer) are exactly what their config.json says
 * — 2 (K and V) × kv heads × head size × 4 bytes for every layer that stores
 * its own KV, nothing for Gemma-4's shared layers and Qwen3.5's linear
 * attention layers (whose fixed per-sequence state is counted apart), GLM-5's
 * latent attention rows (latent + RoPE key as K, the indexer's key as V),
 * per-layer head sizes from per_layer_config — computed here from the JSON, independently of the model
 * code; the weights are the safetensors file's tensor bytes; a mixture of
 * experts reads fewer bytes per token than it holds; the memory sums add
 * up; the JSON has the fields GET /fit answers; a measured bandwidth gives a
 * prediction. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/fit.h"
#include "hearth.h"
#include "test.h"

#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden/"

static int64_t jint(const json_t *o, const char *k, int64_t dflt) {
  const json_t *v = json_object_get(o, k);
  return json_is_integer(v) ? json_integer_value(v) : dflt;
}

/* KV bytes per token of layer l, from config.json alone (f32 rows). */
static int64_t expected_layer(const json_t *t, int64_t l) {
  int64_t layers = jint(t, "num_hidden_layers", 0), shared = jint(t, "num_kv_shared_layers", 0);
  if (l >= layers - shared) return 0; /* reads an earlier layer's KV */
  const json_t *types = json_object_get(t, "layer_types");
  const char *type = json_is_array(types) ? json_string_value(json_array_get(types, (size_t)l)) : NULL;
  if (type && !strcmp(type, "linear_attention")) return 0; /* a recurrent state instead */
  if (jint(t, "kv_lora_rank", 0) > 0) /* multi-head latent attention: K the latent and the RoPE key, V the indexer's key */
    return (jint(t, "kv_lora_rank", 0) + jint(t, "qk_rope_head_dim", 0) + jint(t, "index_head_dim", 0)) * 4;
  int64_t heads = jint(t, "num_attention_heads", 0);
  int64_t hd = jint(t, "head_dim", jint(t, "hidden_size", 0) / heads), kvh = jint(t, "num_key_value_heads", heads);
  const json_t *plc = json_object_get(t, "per_layer_config");
  char key[16];
  snprintf(key, sizeof key, "%lld", (long long)l);
  const json_t *over = plc ? json_object_get(plc, key) : NULL;
  if (over) {
    hd = jint(over, "head_dim", hd);
    kvh = jint(over, "num_key_value_heads", kvh);
  }
  return 2 * kvh * hd * 4;
}

/* State bytes per sequence of the recurrent (Gated DeltaNet) layers: the
 * recurrent state (value heads × key size × value size) and the causal
 * convolution's last kernel - 1 inputs (q, k and v channels). */
static int64_t expected_state(const json_t *t) {
  const json_t *types = json_object_get(t, "layer_types");
  int64_t n = 0;
  for (size_t l = 0; json_is_array(types) && l < json_array_size(types); l++)
    n += !strcmp(json_string_value(json_array_get(types, l)) ? json_string_value(json_array_get(types, l)) : "", "linear_attention");
  int64_t nk = jint(t, "linear_num_key_heads", 0), nv = jint(t, "linear_num_value_heads", 0);
  int64_t dk = jint(t, "linear_key_head_dim", 0), dv = jint(t, "linear_value_head_dim", 0), K = jint(t, "linear_conv_kernel_dim", 0);
  return n * (nv * dk * dv + (K - 1) * (2 * nk * dk + nv * dv)) * 4;
}

/* Tensor bytes of a single-file safetensors: the file minus its header. */
static int64_t tensor_bytes(const char *dir) {
  char p[4096];
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  FILE *f = fopen(p, "rb");
  if (!f) return -1;
  unsigned char n8[8];
  size_t got = fread(n8, 1, 8, f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fclose(f);
  if (got != 8) return -1;
  uint64_t hl = 0;
  for (int i = 0; i < 8; i++) hl |= (uint64_t)n8[i] << (8 * i);
  return (int64_t)size - 8 - (int64_t)hl;
}

static void check_fixture(const char *name) {
  char dir[4096], cfgp[4200];
  snprintf(dir, sizeof dir, GOLDEN "%s", name);
  snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
  json_error_t je;
  json_t *cfg = json_load_file(cfgp, 0, &je);
  CHECK_MSG(cfg != NULL, "%s: %s", cfgp, je.text);
  if (!cfg) return;
  const json_t *t = json_object_get(cfg, "text_config") ? json_object_get(cfg, "text_config") : cfg;
  hearth_fit_opts o = {.context = 100, .batch = 3, .no_bandwidth = true};
  hearth_fit_result r;
  hearth_error e = {0};
  CHECK_MSG(hearth_fit(dir, &o, &r, &e) == 0, "%s: %s", name, e.msg);
  int64_t layers = jint(t, "num_hidden_layers", 0), total = 0;
  CHECK_EQ_INT(r.n_layers, layers);
  for (int64_t l = 0; l < layers; l++) {
    int64_t want = expected_layer(t, l);
    CHECK_MSG(r.kv_layer_bytes_per_token[l] == want, "%s layer %lld: %lld bytes, config says %lld", name, (long long)l,
              (long long)r.kv_layer_bytes_per_token[l], (long long)want);
    total += want;
  }
  CHECK_MSG(r.kv_bytes_per_token == total, "%s: %lld bytes per token, config says %lld", name,
            (long long)r.kv_bytes_per_token, (long long)total);
  int64_t stored = 0;
  for (int64_t l = 0; l < layers; l++) stored += expected_layer(t, l) > 0;
  CHECK_EQ_INT(r.kv_layers, stored);
  CHECK_EQ_INT(r.state_bytes_per_sequence, expected_state(t));
  CHECK_EQ_INT(r.state_bytes, expected_state(t) * 3);
  CHECK_EQ_STR(r.kv_format, "f32");
  CHECK_EQ_INT(r.kv_bytes, total * 100 * 3);
  CHECK_EQ_INT(r.context, 100);
  CHECK_EQ_INT(r.batch, 3);
  CHECK_EQ_INT(r.context_length, jint(t, "max_position_embeddings", 0));
  int64_t tb = tensor_bytes(dir);
  if (tb >= 0) CHECK_EQ_INT(r.weight_bytes, tb);
  CHECK_EQ_INT(r.need_bytes, r.weight_bytes + r.kv_bytes + r.state_bytes + r.overhead_bytes);
  CHECK_EQ_INT(r.overhead_bytes, r.activation_bytes + r.runtime_bytes);
  CHECK(r.available_bytes > 0);
  CHECK(r.fits == (r.need_bytes <= r.available_bytes));
  if (r.fits) CHECK(r.max_context >= 100);
  CHECK(r.bandwidth == 0 && r.decode_tok_s == 0);
  int64_t experts = jint(t, "num_experts", 0);
  if (experts > 0) {
    CHECK(r.expert_bytes > 0);
    CHECK(r.active_weight_bytes < r.weight_bytes);
    CHECK_EQ_INT(r.n_experts, experts);
  } else if (json_is_true(json_object_get(t, "tie_word_embeddings")) || !json_object_get(t, "tie_word_embeddings")) {
    CHECK_EQ_INT(r.expert_bytes, 0);
  }
  json_decref(cfg);
}

static void test_golden_kv_bytes(void) {
  static const char *const fixtures[] = {"llama-f32", "llama-bf16", "qwen2-f32", "qwen3-f32", "mistral-f32", "phi3-f32",
                                         "gemma2-f32", "gemma3-f32", "gemma4-f32", "gemma4_plain-f32", "gemma4_moe-f32",
                                         "qwen3_moe-f32", "smollm3-f32", "qwen3_5-f32", "qwen3_5_moe-f32", "glm5-f32", "glm5_yarn-f32"};
  for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) check_fixture(fixtures[i]);
}

static void test_json_and_bandwidth(void) {
  hearth_fit_opts o = {.batch = 2, .threads = 1};
  hearth_fit_result r;
  hearth_error e = {0};
  CHECK_EQ_INT(hearth_fit(GOLDEN "llama-f32", &o, &r, &e), 0);
  CHECK(r.bandwidth > 0);
  CHECK(r.decode_tok_s > 0 && r.decode_tok_s_short >= r.decode_tok_s);
  CHECK(r.decode_tok_s_total > r.decode_tok_s * 1.999 && r.decode_tok_s_total < r.decode_tok_s * 2.001);
  char *text = NULL;
  CHECK_EQ_INT(hearth_fit_json(&r, &text, &e), 0);
  json_error_t je;
  json_t *j = json_loads(text, 0, &je);
  CHECK(j != NULL);
  CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "kv"), "bytes_per_token")), r.kv_bytes_per_token);
  CHECK_EQ_INT(json_array_size(json_object_get(json_object_get(j, "kv"), "layer_bytes_per_token")), r.n_layers);
  CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "weights"), "bytes")), r.weight_bytes);
  CHECK(json_is_boolean(json_object_get(j, "fits")));
  CHECK(json_real_value(json_object_get(json_object_get(j, "predicted"), "decode_tok_s")) > 0);
  json_decref(j);
  hearth_free(text);
  /* a missing model is an error that names it */
  CHECK_EQ_INT(hearth_fit("/nonexistent/model", &o, &r, &e), HEARTH_ENOTFOUND);
}

int main(void) {
  RUN(test_golden_kv_bytes);
  RUN(test_json_and_bandwidth);
  TEST_MAIN_END();
}
