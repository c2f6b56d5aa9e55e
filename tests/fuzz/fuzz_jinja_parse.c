/* fuzz_jinja_parse.c — libFuzzer target: arbitrary bytes as a Jinja template
 * must parse or fail with a message, never crash or leak. */
#include <stddef.h>
#include <stdint.h>

#include "chat/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  jinja_template *t = NULL;
  herr err = {0};
  if (jinja_parse((const char *)data, size, "fuzz", &t, &err) == 0) jinja_free(t);
  return 0;
}
