/* fuzz_hub_revision — the Hub's revision listing (and the file choice made
 * from it) over arbitrary bytes: an error with a message, or files whose names
 * stay inside the snapshot and whose hashes are hex of the right length. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hub/hub.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  herr err = {0};
  hub_revision r;
  if (hub_revision_parse((const char *)data, size, &r, &err)) {
    if (!err.msg[0]) abort();
    return 0;
  }
  if (strlen(r.commit) != 40) abort();
  for (size_t i = 0; i < r.n; i++) {
    const char *n = r.files[i].name;
    if (!n[0] || n[0] == '/' || strstr(n, "//") || !strcmp(n, "..") || !strncmp(n, "../", 3) || strstr(n, "/../") ||
        (strlen(n) >= 3 && !strcmp(n + strlen(n) - 3, "/..")))
      abort();
    if (r.files[i].sha256 && strlen(r.files[i].sha256) != 64) abort();
    if (r.files[i].blob_id && strlen(r.files[i].blob_id) != 40) abort();
  }
  bool *keep = calloc(r.n ? r.n : 1, sizeof *keep);
  hub_select_opts o = {.quant = size & 1 ? "Q4_K_M" : NULL};
  if (keep) hub_select(&r, &o, keep, &err);
  free(keep);
  hub_revision_free(&r);
  return 0;
}
