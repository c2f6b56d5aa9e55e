/* test_config.c — config.c on its own: the model types and their defaults
 * come from the caller (a made-up table here; hearth's families are
 * tests/model/test_config.c's), so parsing names no type itself: defaults
 * where a key is absent, each layer rule, a multimodal wrapper's
 * text_config, and an unknown type refused with the caller's list. */
#include <string.h>

#include "base/json.h"
#include "format/config.h"
#include "test.h"

static const config_defaults toy = {.act = "gelu_new", .theta = 5e5, .eps = 1e-4, .tie = true, .head_dim = 32, .window = 16,
                                    .layers = CFG_LAYERS_PATTERN, .every = 3, .every_key = "toy_pattern"};
static const config_defaults toy_mm_text = {.theta = 1e4, .eps = 1e-6, .partial = 0.5, .layers = CFG_LAYERS_PATTERN, .every = 2,
                                            .linear = true, .inter_from = "other_size", .inter_default = 48};
static const config_defaults rules[] = {
    {.theta = 1e4, .window = 16, .layers = CFG_LAYERS_WINDOW},
    {.theta = 1e4, .window = 16, .layers = CFG_LAYERS_USE_WINDOW},
    {.theta = 1e4, .window = 16, .layers = CFG_LAYERS_MAX_WINDOW},
    {.theta = 1e4, .window = 16, .layers = CFG_LAYERS_NO_ROPE, .no_rope_every = 3},
    {.theta = 1e4, .window = 16, .layers = CFG_LAYERS_PATTERN, .every = 4, .last_full = true},
    {.theta = 1e4, .qkv_bias = true, .hidden_activation = true},
};
static const char *const rule_names[] = {"window", "use_window", "max_window", "no_rope", "pattern", "biased"};

static const config_defaults *find(const char *t) {
  if (!strcmp(t, "toy")) return &toy;
  if (!strcmp(t, "toy_mm_text")) return &toy_mm_text;
  for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
    if (!strcmp(t, rule_names[i])) return &rules[i];
  return NULL;
}
static const char *list(void) { return "toy, toy_mm (text part), and the rules"; }
static const config_types types = {find, list};

static int parse(const char *text, model_config *c, herr *err) {
  json_t *j = hjson_load_buf(text, strlen(text), "config.json", err);
  if (!j) return err->code;
  int rc = config_from_json(c, j, "config.json", &types, err);
  json_decref(j);
  return rc;
}

#define BASE "\"vocab_size\": 100, \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 6, \"num_attention_heads\": 4"

static void test_defaults(void) {
  model_config c;
  herr err = {0};
  CHECK_MSG(parse("{\"model_type\": \"toy\", " BASE "}", &c, &err) == 0, "%s", err.msg);
  CHECK_EQ_STR(c.hidden_act, "gelu_new");
  CHECK(c.rope.theta == 5e5 && c.rope.partial_rotary_factor == 1 && c.rms_norm_eps == 1e-4 && c.tie_word_embeddings);
  CHECK_EQ_INT(c.head_dim, 32);
  CHECK_EQ_INT(c.sliding_window, 16);
  CHECK(c.layer_types[0] == LAYER_SLIDING && c.layer_types[2] == LAYER_FULL && c.layer_types[5] == LAYER_FULL);
  config_free(&c);
  /* the pattern's key; the config's own values over the defaults */
  CHECK(parse("{\"model_type\": \"toy\", " BASE ", \"toy_pattern\": 2, \"hidden_act\": \"silu\", \"head_dim\": 8, "
              "\"tie_word_embeddings\": false}", &c, &err) == 0);
  CHECK(c.layer_types[0] == LAYER_SLIDING && c.layer_types[1] == LAYER_FULL && c.layer_types[2] == LAYER_SLIDING);
  CHECK_EQ_STR(c.hidden_act, "silu");
  CHECK(c.head_dim == 8 && !c.tie_word_embeddings);
  config_free(&c);
  CHECK_EQ_INT(parse("{\"model_type\": \"toy\", " BASE ", \"toy_pattern\": 0}", &c, &err), HEARTH_EFORMAT);
  CHECK(strstr(err.msg, "toy_pattern") != NULL);
}

/* A wrapper "toy_mm" reads its text_config as "toy_mm_text": linear layers, the stand-in intermediate size. */
static void test_wrapper(void) {
  model_config c;
  herr err = {0};
  CHECK(config_type_supported(&types, "toy_mm") && config_type_supported(&types, "toy") && !config_type_supported(&types, "gpt2"));
  CHECK_MSG(parse("{\"model_type\": \"toy_mm\", \"eos_token_id\": 3, \"text_config\": {\"vocab_size\": 100, \"hidden_size\": 64, "
                  "\"num_hidden_layers\": 4, \"num_attention_heads\": 4}}", &c, &err) == 0, "%s", err.msg);
  CHECK_EQ_STR(c.model_type, "toy_mm_text");
  CHECK(c.top && c.n_eos == 1 && c.eos_token_ids[0] == 3);
  CHECK_EQ_INT(c.intermediate_size, 48);
  CHECK(c.rope.partial_rotary_factor == 0.5);
  CHECK(c.layer_types[0] == LAYER_LINEAR && c.layer_types[1] == LAYER_FULL && c.layer_types[3] == LAYER_FULL);
  config_free(&c);
  /* linear_attention in layer_types only for a type with linear layers */
  CHECK_EQ_INT(parse("{\"model_type\": \"toy\", " BASE ", \"layer_types\": [\"linear_attention\", \"full_attention\", "
                     "\"full_attention\", \"full_attention\", \"full_attention\", \"full_attention\"]}", &c, &err),
               HEARTH_EUNSUPPORTED);
}

/* Each rule for the layers without layer_types. */
static void test_rules(void) {
  model_config c;
  herr err = {0};
  CHECK(parse("{\"model_type\": \"window\", " BASE "}", &c, &err) == 0);
  CHECK(c.layer_types[0] == LAYER_SLIDING && c.layer_types[5] == LAYER_SLIDING);
  config_free(&c);
  CHECK(parse("{\"model_type\": \"use_window\", " BASE "}", &c, &err) == 0);
  CHECK(c.layer_types[0] == LAYER_FULL && c.sliding_window == 0);
  config_free(&c);
  CHECK(parse("{\"model_type\": \"use_window\", " BASE ", \"use_sliding_window\": true}", &c, &err) == 0);
  CHECK(c.layer_types[0] == LAYER_SLIDING && c.sliding_window == 16);
  config_free(&c);
  CHECK(parse("{\"model_type\": \"max_window\", " BASE ", \"use_sliding_window\": true, \"max_window_layers\": 4}", &c, &err) == 0);
  CHECK(c.layer_types[3] == LAYER_FULL && c.layer_types[4] == LAYER_SLIDING);
  config_free(&c);
  CHECK(parse("{\"model_type\": \"no_rope\", " BASE ", \"use_sliding_window\": true}", &c, &err) == 0);
  CHECK(!c.no_rope[1] && c.no_rope[2] && c.layer_types[1] == LAYER_FULL && c.layer_types[2] == LAYER_SLIDING);
  config_free(&c);
  CHECK(parse("{\"model_type\": \"no_rope\", " BASE ", \"no_rope_layers\": [1, 0, 1, 1, 1, 1]}", &c, &err) == 0);
  CHECK(c.no_rope[1] && !c.no_rope[2] && c.layer_types[1] == LAYER_FULL);
  config_free(&c);
  CHECK(parse("{\"model_type\": \"pattern\", " BASE "}", &c, &err) == 0);
  CHECK(c.layer_types[0] == LAYER_SLIDING && c.layer_types[3] == LAYER_FULL && c.layer_types[4] == LAYER_SLIDING &&
        c.layer_types[5] == LAYER_FULL);
  config_free(&c);
  CHECK(parse("{\"model_type\": \"biased\", " BASE ", \"attention_bias\": false, \"hidden_activation\": \"relu\"}", &c, &err) == 0);
  CHECK(c.attention_bias);
  CHECK_EQ_STR(c.hidden_act, "relu");
  CHECK(c.layer_types[0] == LAYER_FULL && c.rope.theta == 1e4);
  config_free(&c);
}

static void test_unknown(void) {
  model_config c;
  herr err = {0};
  CHECK_EQ_INT(parse("{\"model_type\": \"llama\", " BASE "}", &c, &err), HEARTH_EUNSUPPORTED);
  CHECK(strstr(err.msg, "'llama'") && strstr(err.msg, "toy_mm (text part)"));
}

int main(void) {
  RUN(test_defaults);
  RUN(test_wrapper);
  RUN(test_rules);
  RUN(test_unknown);
  TEST_MAIN_END();
}
