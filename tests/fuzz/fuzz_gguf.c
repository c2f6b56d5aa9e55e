/* fuzz_gguf — gguf_parse over arbitrary bytes: it must either fail with a
 * message or hand out metadata and tensors that lie entirely inside the
 * input, readable through every getter. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* A copy of exactly `size` bytes, so reading past the end is caught. */
  unsigned char *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);
  gguf_file *g = NULL;
  herr err = {0};
  if (gguf_parse(copy, size, "fuzz.gguf", &g, &err) == 0) {
    volatile unsigned sum = 0;
    for (size_t i = 0; i < gguf_kv_count(g); i++) {
      const gguf_kv *kv = gguf_kv_at(g, i);
      if (!kv || gguf_find_kv(g, kv->key) != kv) abort();
      if (kv->type == GGUF_TYPE_STRING) {
        const char *s;
        size_t len;
        if (gguf_get_str(g, kv->key, &s, &len, &err) != 0) abort();
        if (len) sum += (unsigned char)s[0] + (unsigned char)s[len - 1];
        char *d = NULL;
        if (gguf_get_strdup(g, kv->key, &d, &err) == 0) free(d);
      } else if (kv->type == GGUF_TYPE_ARRAY) {
        gguf_arr a;
        if (gguf_get_arr(g, kv->key, &a, &err) != 0) abort();
        for (uint64_t k = 0; k < a.n; k++) {
          if (a.type == GGUF_TYPE_STRING) {
            size_t len;
            const char *s = gguf_arr_str(&a, k, &len);
            if (!s) abort();
            if (len) sum += (unsigned char)s[len - 1];
          } else {
            double f = gguf_arr_float(&a, k);
            sum += (unsigned)gguf_arr_int(&a, k) + (unsigned)(f == f);
          }
        }
      } else {
        int64_t iv;
        double fv;
        if (gguf_get_int(g, kv->key, &iv, &err) == 0) sum += (unsigned)iv;
        if (gguf_get_float(g, kv->key, &fv, &err) == 0) sum += (unsigned)(fv == fv);
      }
    }
    for (size_t i = 0; i < gguf_tensor_count(g); i++) {
      const gguf_tensor *t = gguf_tensor_at(g, i);
      if (!t || gguf_find_tensor(g, t->name) != t) abort();
      const unsigned char *p = t->data;
      if (p < copy || p + t->nbytes > copy + size) abort();
      if (t->nbytes) sum += p[0] + p[t->nbytes - 1];
      if (t->offset % gguf_alignment(g)) abort();
    }
    (void)sum;
  } else if (!err.msg[0]) {
    abort(); /* every failure carries a message */
  }
  gguf_close(g);
  free(copy);
  return 0;
}
