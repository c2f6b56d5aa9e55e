/* fuzz_pooling — a sentence-transformers folder's modules.json and Pooling
 * config.json readers over arbitrary bytes: an error with a message, or a
 * pooling path that stays inside the folder and a mode in range. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/pooling.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *text = (const char *)data;
  herr err = {0};
  char path[128], unsup[192];
  if (pooling_parse_modules(text, size, "modules.json", path, sizeof path, unsup, sizeof unsup, &err) == 0) {
    if (strstr(path, "..") || strchr(path, '/') || strlen(path) >= sizeof path) abort();
  } else if (!err.msg[0]) {
    abort();
  }
  memset(&err, 0, sizeof err);
  pooling_config pc;
  if (pooling_parse_config(text, size, "config.json", &pc, &err) == 0) {
    if (pc.mode < POOL_LAST || pc.mode > POOL_OTHER) abort();
    if (pc.mode == POOL_OTHER && !pc.unsupported[0]) abort();
    if (!pc.mode_key[0]) abort();
  } else if (!err.msg[0]) {
    abort();
  }
  return 0;
}
