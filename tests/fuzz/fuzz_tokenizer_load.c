/* fuzz_tokenizer_load.c — tokenizer.json parsing: any bytes either load (and
 * then encode, decode and stream a fixed text without trouble) or fail with a
 * message; nothing crashes or leaks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tokenizer *t = NULL;
  herr e = {0};
  if (tokenizer_load_json((const char *)data, size, NULL, 0, "fuzz.json", &t, &e)) return 0;
  static const char text[] = "Hello, world! <s> 123 \xe4\xbd\xa0\xe5\xa5\xbd  \xf0\x9f\xa6\x99\ttab";
  int32_t *ids = NULL;
  size_t n = 0;
  if (tokenizer_encode(t, text, sizeof text - 1, true, true, &ids, &n, &e) == 0) {
    hbuf out = {0};
    tokenizer_decode(t, ids, n, false, &out, &e);
    tokenizer_stream *s = tokenizer_stream_new(t, true);
    for (size_t i = 0; s && i < n; i++) tokenizer_stream_put(s, ids[i], &out, &e);
    if (s) tokenizer_stream_flush(s, &out, &e);
    tokenizer_stream_free(s);
    hbuf_free(&out);
    free(ids);
  }
  tokenizer_vocab_size(t);
  tokenizer_id_to_token(t, 0);
  tokenizer_token_to_id(t, "a");
  tokenizer_free(t);
  return 0;
}
