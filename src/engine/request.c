/* request.c — a generation request's defaults and its check against the
 * context length (see request.h). */
#include "engine/request.h"

#include <string.h>

void gen_request_init(gen_request *r) {
  memset(r, 0, sizeof *r);
  r->max_tokens = -1;
  sample_params_default(&r->sample);
  r->skip_special = true;
  r->spec_tokens = -1;
}

/* Resolves max_tokens against the context; fills *max_new. */
int gen_check_context(const model *m, const gen_request *req, int64_t *max_new, herr *err) {
  int64_t ctx = req->context_length > 0 ? req->context_length : model_cfg(m)->max_position_embeddings;
  int64_t n_prompt = (int64_t)req->n_prompt;
  if (ctx <= 0) {
    if (req->max_tokens < 0)
      return herr_set(err, HEARTH_EINVAL, "max_tokens is required: the model states no context length");
    *max_new = req->max_tokens;
    return 0;
  }
  if (n_prompt >= ctx)
    return herr_set_at(err, HEARTH_ELIMIT, NULL, HEARTH_CAUSE_CONTEXT_LENGTH,
                    "context_length_exceeded: the prompt has %lld tokens but the context length is %lld, which leaves "
                    "no room to generate",
                    (long long)n_prompt, (long long)ctx);
  if (req->max_tokens < 0) {
    *max_new = ctx - n_prompt;
    return 0;
  }
  if (n_prompt + req->max_tokens > ctx)
    return herr_set_at(err, HEARTH_ELIMIT, "max_tokens", HEARTH_CAUSE_CONTEXT_LENGTH,
                    "context_length_exceeded: the prompt (%lld tokens) plus max_tokens (%lld) is %lld tokens, more "
                    "than the context length of %lld",
                    (long long)n_prompt, (long long)req->max_tokens, (long long)(n_prompt + req->max_tokens),
                    (long long)ctx);
  *max_new = req->max_tokens;
  return 0;
}
