/* fuzz_signal — signal_request_parse over arbitrary bytes: it must refuse
 * with a 400 naming the problem, or hand out exactly one prompt form (text,
 * ids inside the vocabulary, or chat messages) with bins and top in range,
 * and a reply (with the prompt's bytes as a token's text) that is valid JSON. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/signal.h"

#define VOCAB 1000

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);
  signal_request r;
  serve_fail f;
  memset(&f, 0, sizeof f);
  if (signal_request_parse(copy, size, VOCAB, &r, &f) == 0) {
    int forms = (r.prompt != NULL) + (r.ids != NULL) + r.is_chat;
    if (forms != 1) abort();
    if (r.prompt && !r.prompt[0]) abort();
    if (r.ids && r.n_ids == 0) abort();
    for (size_t j = 0; r.ids && j < r.n_ids; j++)
      if (r.ids[j] < 0 || r.ids[j] >= VOCAB) abort();
    if (r.is_chat && r.chat.nmessages < 1) abort();
    if (r.bins < 1 || r.bins > HEARTH_SIGNAL_MAX_BINS || r.top < 0 || r.top > HEARTH_MAX_TOP_LOGPROBS) abort();
    serve_signal s;
    memset(&s, 0, sizeof s);
    s.r.n_bins = r.bins;
    s.r.lo = HEARTH_SIGNAL_LO;
    s.r.n_top = r.top;
    s.r.entropy = NAN; /* non-finite values must still give JSON */
    for (int i = 0; i < r.top; i++) {
      s.r.top_ids[i] = i;
      s.r.top_logprobs[i] = -i;
      if (r.prompt) {
        s.top_text[i] = strdup(r.prompt);
        s.top_len[i] = s.top_text[i] ? strlen(s.top_text[i]) : 0;
      }
    }
    hbuf out = {0};
    signal_reply(&s, r.is_chat ? r.chat.model : r.model, &out);
    if (!out.oom) {
      json_error_t je;
      json_t *j = json_loadb(out.data, out.len, 0, &je);
      if (!j) abort();
      if ((int)json_array_size(json_object_get(j, "bins")) != r.bins) abort();
      if ((int)json_array_size(json_object_get(j, "top")) != r.top) abort();
      json_decref(j);
    }
    hbuf_free(&out);
    serve_signal_free(&s);
    signal_request_free(&r);
  } else if ((f.status != 400 && f.status != 500) || !f.message[0]) {
    abort();
  }
  free(copy);
  return 0;
}
