/* fuzz_adapter — adapter_config_from_json over arbitrary bytes (parsed as
 * JSON): it must either refuse with a message or give a config with a
 * positive rank whose matching (targets, layers, rank and alpha patterns,
 * regexes compiled from the input) answers for any module name. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "format/adapter.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  herr err = {0};
  json_t *j = hjson_load_buf((const char *)data, size, "adapter_config.json", &err);
  if (!j) return 0;
  adapter_config c;
  if (adapter_config_from_json(j, "adapter_config.json", &c, &err)) {
    if (!err.msg[0]) abort();
    return 0;
  }
  if (c.r <= 0) abort();
  static const char *names[] = {"model.layers.0.self_attn.q_proj", "model.layers.11.mlp.down_proj", "lm_head", ""};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    (void)adapter_config_targets(&c, names[i], (int)i - 1);
    int64_t r = adapter_config_rank(&c, names[i]);
    double s = adapter_config_scale(&c, names[i], r > 0 ? r : 1);
    (void)s;
  }
  adapter_config_free(&c);
  return 0;
}
