/* fuzz_embeddings — embed_request_parse over arbitrary bytes: it must refuse
 * with a 400 naming the problem, or hand out inputs that hold their
 * invariants (non-empty, ids inside the vocabulary) and whose reply, as
 * floats and as base64, is valid JSON of the right length. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/embeddings.h"

#define VOCAB 1000

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);
  embed_request r;
  serve_fail f;
  memset(&f, 0, sizeof f);
  if (embed_request_parse(copy, size, VOCAB, &r, &f) == 0) {
    if (r.n < 1 || r.n > EMBED_MAX_INPUTS || !r.inputs || r.dimensions < 0) abort();
    for (int i = 0; i < r.n; i++) {
      const serve_embed_input *in = &r.inputs[i];
      if (!in->text == !in->ids) abort();
      if (in->text && in->len == 0) abort();
      if (in->ids && in->n_ids == 0) abort();
      for (size_t j = 0; in->ids && j < in->n_ids; j++)
        if (in->ids[j] < 0 || in->ids[j] >= VOCAB) abort();
    }
    int dim = r.dimensions > 0 && r.dimensions <= 16 ? r.dimensions : 5;
    float *v = calloc((size_t)r.n * (size_t)dim, sizeof *v);
    if (v) {
      for (size_t i = 0; i < (size_t)r.n * (size_t)dim; i++) v[i] = (float)i / 7.0f - 1.0f;
      hbuf out = {0};
      embed_reply(&r, v, dim, r.model, 42, &out);
      if (!out.oom) {
        json_error_t je;
        json_t *j = json_loadb(out.data, out.len, 0, &je);
        if (!j) abort();
        json_t *arr = json_object_get(j, "data");
        if ((int)json_array_size(arr) != r.n) abort();
        json_t *e = json_object_get(json_array_get(arr, 0), "embedding");
        if (r.base64 ? json_string_length(e) != (size_t)((dim * 4 + 2) / 3 * 4) : json_array_size(e) != (size_t)dim) abort();
        json_decref(j);
      }
      hbuf_free(&out);
      free(v);
    }
    embed_request_free(&r);
  } else if (f.status != 400 && f.status != 500) {
    abort();
  } else if (!f.message[0]) {
    abort();
  }
  free(copy);
  return 0;
}
