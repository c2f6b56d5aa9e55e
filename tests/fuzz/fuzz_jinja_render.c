/* fuzz_jinja_render.c — libFuzzer target: a template that parses is rendered
 * over a small chat context under tight limits; it must render or fail with a
 * message, never crash, leak or run away. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "chat/jinja.h"

static const char *context_json =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    "{\"role\": \"user\", \"content\": \"Hi \\u00e9 {{x}}\"},"
    "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\","
    "\"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, true, null]}}}]},"
    "{\"role\": \"tool\", \"content\": \"42\"},"
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"parts\"}]}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"n\": 3}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static json_t *ctx;
  if (!ctx) ctx = json_loads(context_json, 0, NULL);
  jinja_template *t = NULL;
  herr err = {0};
  if (jinja_parse((const char *)data, size, "fuzz", &t, &err) != 0) return 0;
  jinja_limits lim = {.max_depth = 64, .max_iterations = 20000, .max_steps = 200000, .max_output = 1 << 20,
                      .max_memory = 32 << 20, .fixed_now = 1721989800};
  hbuf out = {0};
  jinja_render(t, ctx, &lim, &out, &err);
  hbuf_free(&out);
  jinja_free(t);
  return 0;
}
