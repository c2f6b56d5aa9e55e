/* fuzz_multipart — multipart_parse (the Batch API's uploads) over arbitrary
 * bytes: the first line is the Content-Type, the rest the body. It must
 * either refuse with a 400 and a message or give parts that lie inside the
 * body, each with a name. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/files.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *nl = memchr(data, '\n', size);
  size_t ct_len = nl ? (size_t)(nl - (const char *)data) : size;
  char *ct = malloc(ct_len + 1);
  if (!ct) return 0;
  memcpy(ct, data, ct_len);
  ct[ct_len] = 0;
  const char *body = nl ? nl + 1 : (const char *)data + size;
  size_t len = (size_t)((const char *)data + size - body);
  multipart_part parts[8];
  int n = -1;
  serve_fail f = {0};
  int rc = multipart_parse(ct, body, len, parts, 8, &n, &f);
  if (rc) {
    if (rc != 400 || !f.message[0]) abort();
  } else {
    if (n < 0 || n > 8) abort();
    for (int i = 0; i < n; i++) {
      const multipart_part *p = &parts[i];
      if (!p->name || p->data < body || p->data + p->len > body + len) abort();
      if (p->name < body || p->name + p->name_len > body + len) abort();
      if (p->filename && (p->filename < body || p->filename + p->filename_len > body + len)) abort();
    }
  }
  free(ct);
  return 0;
}
