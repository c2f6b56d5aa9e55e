/* fuzz_safetensors — st_parse over arbitrary bytes: it must either fail with
 * a message or hand out tensors whose every byte lies inside the input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* A copy of exactly `size` bytes, so reading past the end is caught. */
  unsigned char *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);
  st_tensor *ts = NULL;
  size_t n = 0;
  json_t *meta = NULL;
  char *names = NULL;
  herr err = {0};
  if (st_parse(copy, size, "fuzz.safetensors", &ts, &n, &meta, &names, &err) == 0) {
    volatile unsigned sum = 0;
    for (size_t i = 0; i < n; i++) {
      const st_tensor *t = &ts[i];
      if (t->nbytes != (size_t)t->numel * st_dtype_size(t->dtype)) abort();
      if (i && strcmp(ts[i - 1].name, t->name) >= 0) abort();
      const unsigned char *p = t->data;
      if (t->nbytes) sum += p[0] + p[t->nbytes - 1];
      if (st_dtype_is_float(t->dtype) && t->numel) {
        float *out = malloc((size_t)t->numel * sizeof *out);
        if (out) {
          if (st_to_f32(t, out, &err) != 0) abort();
          free(out);
        }
      }
    }
    (void)sum;
  } else if (!err.msg[0]) {
    abort(); /* every failure carries a message */
  }
  free(ts);
  free(names);
  json_decref(meta);
  free(copy);
  return 0;
}
