/* fuzz_infill — infill_request_parse over arbitrary bytes as a POST /infill
 * body: it must refuse with a 400 naming the problem, or hand out a
 * fill-in-the-middle completion request (prefix, suffix and prompt strings,
 * its chunks of context with text) whose reply and stream are valid JSON. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve/infill.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);
  serve_request r;
  serve_fail f;
  memset(&f, 0, sizeof f);
  if (infill_request_parse(copy, size, &r, &f) == 0) {
    if (!r.fim || !r.infill || r.kind != SERVE_COMPLETION || !r.fim_prefix || !r.suffix || !r.prompt) abort();
    if (r.n_fim_extra < 0 || (r.n_fim_extra > 0 && !r.fim_extra)) abort();
    for (int i = 0; i < r.n_fim_extra; i++)
      if (!r.fim_extra[i].text) abort();
    if (r.sampling.max_tokens == 0) abort();
    serve_result res = {.finish = SERVE_FINISH_STOP, .prompt_tokens = 3, .completion_tokens = 2,
                        .stop_index = r.sampling.n_stop > 0 ? 0 : -1};
    hbuf out = {0};
    infill_body(&r, "m", r.fim_prefix, strlen(r.fim_prefix), &res, &out);
    if (!out.oom) {
      json_t *j = json_loadb(out.data, out.len, 0, NULL);
      if (!j) abort();
      json_decref(j);
    }
    hbuf_free(&out);
    infill_sse_token(r.suffix, strlen(r.suffix), &out);
    infill_sse_finish(&r, "m", &res, &out);
    if (!out.oom && out.len && strncmp(out.data, "data: ", 6)) abort();
    hbuf_free(&out);
    serve_request_free(&r);
  } else if ((f.status != 400 && f.status != 500) || !f.message[0]) {
    abort();
  }
  free(copy);
  return 0;
}
