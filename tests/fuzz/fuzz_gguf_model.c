/* fuzz_gguf_model — a GGUF image read as a model: gguf_parse, then the
 * metadata mapped to a config (gguf_model_config) and every tensor the
 * decoder would ask for converted to f32 (gguf_model_read_f32). Each step
 * must either refuse with a message or succeed with consistent sizes and no
 * read outside the input. Seeds: tools/gen_gguf_model_seeds.py. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "model/gguf_model.h"

static const char *const layer_names[] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight",
};

static void read_one(const gguf_file *g, const char *hf, int64_t heads) {
  const gguf_tensor *t = gguf_model_find(g, hf);
  if (!t || t->nelements > (1 << 22)) return;
  float *buf = malloc(sizeof(float) * (size_t)(t->nelements ? t->nelements : 1));
  if (!buf) return;
  herr err = {0};
  if (gguf_model_read_f32(g, t, hf, heads, buf, &err) && !err.msg[0]) abort();
  free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  unsigned char *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);
  gguf_file *g = NULL;
  herr err = {0};
  if (gguf_parse(copy, size, "fuzz.gguf", &g, &err)) {
    free(copy);
    return 0;
  }
  model_config c;
  if (gguf_model_config(g, &c, &err)) {
    if (!err.msg[0]) abort();
  } else {
    if (c.num_hidden_layers <= 0 || c.num_attention_heads % c.num_key_value_heads) abort();
    read_one(g, "model.embed_tokens.weight", 0);
    read_one(g, "model.norm.weight", 0);
    read_one(g, "lm_head.weight", 0);
    int64_t layers = c.num_hidden_layers < 4 ? c.num_hidden_layers : 4;
    for (int64_t l = 0; l < layers; l++)
      for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++) {
        char name[128];
        snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)l, layer_names[i]);
        read_one(g, name, strstr(name, "k_proj") ? c.num_key_value_heads : c.num_attention_heads);
      }
  }
  config_free(&c);
  gguf_close(g);
  free(copy);
  return 0;
}
