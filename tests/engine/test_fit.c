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
#include <unistd.h>

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
  CHECK(!r.context_exceeds_model);
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

/* KV bytes per element of a format: 32 elements in 32 (8-bit, FP8) or 16
 * (4-bit) bytes plus a 4-byte scale. */
static int64_t quant_row(const char *fmt, int64_t dim) {
  if (!strcmp(fmt, "8") || !strcmp(fmt, "fp8")) return dim / 32 * 36;
  if (!strcmp(fmt, "4")) return dim / 32 * 20;
  return dim * 4;
}

static hearth_fit_result fit_of(const char *dir, const char *mode, const char *config, int64_t memory) {
  hearth_fit_opts o = {.context = 100, .batch = 1, .no_bandwidth = true, .kv_quant = mode, .kv_quant_config = config,
                       .memory_bytes = memory};
  hearth_fit_result r;
  hearth_error e = {0};
  int rc = hearth_fit(dir, &o, &r, &e);
  CHECK_MSG(rc == 0, "%s %s: %s", dir, mode ? mode : "-", e.msg);
  if (rc) memset(&r, 0, sizeof r);
  return r;
}

/* --kv-quant in the fit: each layer's K and V rows are the 8 / 4-bit / FP8 block
 * sizes exactly (a per-layer config file too), the format is named, and in
 * the same memory the largest context grows by the ratio of the bytes. */
static void test_kv_quant(void) {
  static const char *const fixtures[] = {"llama-f32", "qwen3-f32"};
  for (size_t f = 0; f < sizeof fixtures / sizeof fixtures[0]; f++) {
    char dir[4096], cfgp[4200];
    snprintf(dir, sizeof dir, GOLDEN "%s", fixtures[f]);
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    json_error_t je;
    json_t *cfg = json_load_file(cfgp, 0, &je);
    CHECK_MSG(cfg != NULL, "%s: %s", cfgp, je.text);
    if (!cfg) return;
    int64_t layers = jint(cfg, "num_hidden_layers", 0), heads = jint(cfg, "num_attention_heads", 1);
    int64_t dim = jint(cfg, "num_key_value_heads", heads) * jint(cfg, "head_dim", jint(cfg, "hidden_size", 0) / heads);
    json_decref(cfg);
    CHECK(dim % 32 == 0);
    static const char *const modes[] = {"off", "8", "4", "fp8"};
    hearth_fit_result r[4];
    for (int i = 0; i < 4; i++) {
      r[i] = fit_of(dir, modes[i], NULL, 0);
      for (int64_t l = 0; l < layers; l++)
        CHECK_MSG(r[i].kv_layer_bytes_per_token[l] == 2 * quant_row(modes[i], dim), "%s %s layer %lld: %lld bytes",
                  fixtures[f], modes[i], (long long)l, (long long)r[i].kv_layer_bytes_per_token[l]);
      CHECK_EQ_INT(r[i].kv_bytes_per_token, layers * 2 * quant_row(modes[i], dim));
      CHECK_EQ_INT(r[i].kv_bytes, r[i].kv_bytes_per_token * 100);
      CHECK_EQ_STR(r[i].kv_format, i == 0 ? "f32" : i == 1 ? "q8" : i == 2 ? "q4" : "fp8");
    }
    /* memory for the weights, the overhead and 16 tokens of f32 KV: 8 / 4-bit fit 128/36 and 128/20 times that */
    int64_t fixed = r[0].weight_bytes + r[0].overhead_bytes, room = 16 * r[0].kv_bytes_per_token;
    for (int i = 0; i < 4; i++) {
      hearth_fit_result g = fit_of(dir, modes[i], NULL, fixed + room);
      CHECK_EQ_STR(g.memory_source, "given");
      CHECK_EQ_INT(g.available_bytes, fixed + room);
      CHECK_EQ_INT(g.overhead_bytes, r[0].overhead_bytes);
      CHECK_EQ_INT(g.max_context, room / g.kv_bytes_per_token);
      CHECK_EQ_INT(g.max_batch, room / (g.kv_bytes_per_token * 100));
    }
    CHECK_EQ_INT(fit_of(dir, "off", NULL, fixed + room).max_context, 16);
    CHECK_EQ_INT(fit_of(dir, "8", NULL, fixed + room).max_context, 16 * dim * 4 / (dim / 32 * 36));
    CHECK_EQ_INT(fit_of(dir, "4", NULL, fixed + room).max_context, 16 * dim * 4 / (dim / 32 * 20));
    CHECK_EQ_INT(fit_of(dir, "fp8", NULL, fixed + room).max_context, 16 * dim * 4 / (dim / 32 * 36));
    /* a per-layer config over the mode: layer 0's K 4-bit and V f32, the rest 8-bit */
    char path[] = "/tmp/hearth_fit_kvq_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    FILE *fp = fdopen(fd, "w");
    fputs("{\"layers\": {\"0\": {\"k\": \"4\", \"v\": \"off\"}}}", fp);
    fclose(fp);
    hearth_fit_result c = fit_of(dir, "8", path, 0);
    CHECK_EQ_INT(c.kv_layer_bytes_per_token[0], quant_row("4", dim) + quant_row("off", dim));
    for (int64_t l = 1; l < layers; l++) CHECK_EQ_INT(c.kv_layer_bytes_per_token[l], 2 * quant_row("8", dim));
    CHECK_MSG(strstr(c.kv_format, "q4") && strstr(c.kv_format, "q8"), "format '%s'", c.kv_format);
    /* a bad config is refused with its name */
    fp = fopen(path, "w");
    fputs("{\"layers\": {\"99\": \"8\"}}", fp);
    fclose(fp);
    hearth_fit_opts o = {.no_bandwidth = true, .kv_quant_config = path};
    hearth_error e = {0};
    CHECK(hearth_fit(dir, &o, &(hearth_fit_result){0}, &e) != 0 && strstr(e.msg, "hearth_fit_kvq_"));
    unlink(path);
  }
}

/* A context longer than the model's never fits, in any memory, and says so. */
static void test_context_beyond_model(void) {
  const char *dir = HEARTH_SOURCE_DIR "/models/default";
  hearth_fit_result r;
  hearth_error e = {0};
  hearth_fit_opts o = {.batch = 1, .no_bandwidth = true, .memory_bytes = (int64_t)1 << 40};
  CHECK_MSG(hearth_fit(dir, &o, &r, &e) == 0, "%s", e.msg);
  CHECK(r.context == r.context_length && r.fits && !r.context_exceeds_model);
  o.context = r.context_length * 4;
  CHECK_MSG(hearth_fit(dir, &o, &r, &e) == 0, "%s", e.msg);
  CHECK(r.context_exceeds_model);
  CHECK(!r.fits);
  char *js = NULL;
  CHECK_EQ_INT(hearth_fit_json(&r, &js, &e), 0);
  json_t *j = js ? json_loads(js, 0, NULL) : NULL;
  CHECK(json_is_true(json_object_get(j, "context_exceeds_model")) && json_is_false(json_object_get(j, "fits")));
  json_decref(j);
  hearth_free(js);
}

int main(void) {
  RUN(test_golden_kv_bytes);
  RUN(test_kv_quant);
  RUN(test_json_and_bandwidth);
  RUN(test_context_beyond_model);
  TEST_MAIN_END();
}
