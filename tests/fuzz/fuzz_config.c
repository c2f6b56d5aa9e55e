/* fuzz_config — model_config_from_json over arbitrary bytes (parsed as JSON): it
 * must either refuse with a message or produce a config whose sizes are
 * consistent, and whose RoPE settings give finite frequency tables. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "format/config.h"
#include "model/model.h"
#include "model/rope.h"

static void check_rope(const rope_config *r, const model_config *c) {
  rope_table t;
  herr err = {0};
  if (rope_table_init(&t, r, c->head_dim, c->max_position_embeddings, 0, 0, &err)) {
    if (!err.msg[0]) abort();
    return;
  }
  if (t.rot_dim < 0 || t.rot_dim > c->head_dim || t.rot_dim % 2) abort();
  if (isnan(t.attn_scale)) abort();
  rope_table_free(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  herr err = {0};
  json_t *j = hjson_load_buf((const char *)data, size, "config.json", &err);
  if (!j) return 0;
  model_config c;
  int rc = model_config_from_json(&c, j, "config.json", &err);
  json_decref(j);
  if (rc) {
    if (!err.msg[0]) abort();
    config_free(&c);
    return 0;
  }
  if (c.num_hidden_layers <= 0 || c.num_hidden_layers > CFG_MAX_LAYERS) abort();
  if (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads) abort();
  if (c.head_dim <= 0 || c.vocab_size <= 0 || c.hidden_size <= 0) abort();
  if (c.sliding_window < 0 || c.n_eos < 0 || c.n_eos > CFG_MAX_EOS) abort();
  if (!model_type_supported(c.model_type)) abort();
  check_rope(&c.rope, &c);
  check_rope(&c.rope_local, &c);
  config_free(&c);
  return 0;
}
