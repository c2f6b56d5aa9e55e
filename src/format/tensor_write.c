/* tensor_write.c — the tensor-streaming write shared by the GGUF and
 * safetensors writers (see tensor_write.h): PATH.tmp, the header, each
 * tensor (filled into one buffer grown to the largest tensor made), zero
 * padding, flush, rename. Knows neither container's layout. */
#include "format/tensor_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t pad_to(size_t n, size_t a) { return (n + a - 1) / a * a; }

int tensor_write_file(const char *path, const void *head, size_t head_len, const void *writer, size_t n,
                      tensor_bytes_fn get, size_t align, tensor_fill_fn fill, void *ctx, herr *err) {
  static const char zeros[64] = {0};
  if (align < 1) align = 1;
  if (align > sizeof zeros) return herr_set(err, HEARTH_EINTERNAL, "%s: alignment %zu is over %zu", path, align, sizeof zeros);
  size_t plen = strlen(path);
  char *tmp = malloc(plen + 5);
  if (!tmp) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  memcpy(tmp, path, plen);
  memcpy(tmp + plen, ".tmp", 5);
  void *buf = NULL;
  int rc = 0;
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    rc = herr_set(err, HEARTH_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    goto out;
  }
  if (fwrite(head, 1, head_len, f) != head_len) goto io;
  size_t cap = 0;
  for (size_t i = 0; i < n; i++) {
    tensor_bytes t;
    get(writer, i, &t);
    if (!t.nbytes) continue;
    const void *src = t.data;
    if (!src) {
      if (t.nbytes > cap) {
        free(buf);
        buf = malloc(t.nbytes);
        cap = buf ? t.nbytes : 0;
        if (!buf) {
          rc = herr_set(err, HEARTH_ENOMEM, "%s: out of memory for tensor '%s' (%zu bytes)", path, t.name, t.nbytes);
          goto out;
        }
      }
      if ((rc = fill(ctx, (int)i, buf, err))) goto out;
      src = buf;
    }
    if (fwrite(src, 1, t.nbytes, f) != t.nbytes) goto io;
    size_t pad = pad_to(t.nbytes, align) - t.nbytes;
    if (pad && fwrite(zeros, 1, pad, f) != pad) goto io;
  }
  if (fflush(f) || ferror(f)) goto io;
  int cr = fclose(f);
  f = NULL;
  if (cr) goto io;
  if (rename(tmp, path)) rc = herr_set(err, HEARTH_EIO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
  goto out;
io:
  rc = herr_set(err, HEARTH_EIO, "%s: write failed: %s", tmp, strerror(errno));
out:
  if (f) fclose(f);
  if (rc) remove(tmp);
  free(buf);
  free(tmp);
  return rc;
}
