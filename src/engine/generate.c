/* generate.c — one request's generation loop (see generate.h): owns the
 * request's KV cache, sampler, detokenizer stream and stop matcher for the
 * duration of the call. Knows the model only through model.h and text only
 * through the tokenizer's streaming decoder; knows nothing of chat templates,
 * HTTP or the public API. */
#include "engine/generate.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/emit.h"
#include "engine/kv_cache.h"

void gen_request_init(gen_request *r) {
  memset(r, 0, sizeof *r);
  r->max_tokens = -1;
  sample_params_default(&r->sample);
  r->skip_special = true;
  r->spec_tokens = -1;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool cancelled(const gen_request *req) { return req->cancel && *req->cancel; }

/* Everything one run allocates, freed in one place. */
typedef struct gen_state {
  kv_cache *cache;          /* owned */
  kv_seq *seq;              /* owned */
  sampler *smp;             /* owned */
  gen_emit out;             /* owned: detokenizer, stop matcher, the step's text */
  float *logits;            /* owned [vocab] */
  const gen_request *req;   /* borrowed */
} gen_state;

static void gen_state_free(gen_state *g) {
  if (g->seq) kv_cache_seq_free(g->seq);
  kv_cache_free(g->cache);
  sampler_free(g->smp);
  gen_emit_free(&g->out);
  free(g->logits);
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

static int forward_tokens(model *m, gen_state *g, const int32_t *ids, int n, herr *err) {
  model_seq s = {.kv = g->seq, .tokens = ids, .n_tokens = n, .positions = NULL, .all_logits = false,
                 .lora = g->req ? g->req->lora : NULL, .n_lora = g->req ? g->req->n_lora : 0};
  model_batch b = {.seqs = &s, .n_seqs = 1};
  return model_forward(m, &b, g->logits, err);
}

int generate_run(model *m, const tokenizer *tok, const gen_request *req, gen_token_fn fn, void *user, gen_result *res,
                 herr *err) {
  memset(res, 0, sizeof *res);
  res->stop_index = -1;
  res->stop_token = -1;
  res->prompt_tokens = (int64_t)req->n_prompt;
  if (!req->prompt || req->n_prompt == 0) return herr_set(err, HEARTH_EINVAL, "generate: the prompt has no tokens");
  if (req->n_stop && !tok)
    return herr_set(err, HEARTH_EINVAL, "generate: stop strings need a tokenizer to decode the output");
  int64_t vocab = model_vocab_size(m);
  for (size_t i = 0; i < req->n_prompt; i++) {
    if (req->prompt[i] < 0 || req->prompt[i] >= vocab)
      return herr_set(err, HEARTH_EINVAL, "generate: prompt token %zu is id %d, outside the vocabulary (size %lld)", i,
                      (int)req->prompt[i], (long long)vocab);
  }
  /* parameters first (a bad one is named), then the context, then the work */
  gen_state g = {.req = req};
  int64_t max_new = 0;
  int rc = sampler_new((int32_t)vocab, &req->sample, &g.smp, err);
  if (rc) goto done;
  if ((rc = gen_check_context(m, req, &max_new, err))) goto done;
  if (max_new == 0) {
    res->finish = GEN_FINISH_LENGTH;
    goto done;
  }
  model_kv_geometry geom;
  model_kv_geometry_of(m, &geom);
  if ((rc = kv_cache_new(&geom, (int64_t)req->n_prompt + max_new, &g.cache, err))) goto done;
  if ((rc = kv_cache_seq_new(g.cache, &g.seq, err))) goto done;
  g.logits = malloc(sizeof(float) * (size_t)vocab);
  if (!g.logits) {
    rc = herr_set(err, HEARTH_ENOMEM, "generate: out of memory for a logits row of %lld", (long long)vocab);
    goto done;
  }
  if ((rc = gen_emit_init(&g.out, tok, req, err))) goto done;
  sampler_add_prompt(g.smp, req->prompt, req->n_prompt);

  /* prefill */
  double t0 = now_seconds();
  int chunk = req->prefill_chunk > 0 ? req->prefill_chunk : GEN_DEFAULT_PREFILL_CHUNK;
  for (size_t at = 0; at < req->n_prompt;) {
    if (cancelled(req)) {
      res->finish = GEN_FINISH_CANCELLED;
      rc = herr_set(err, HEARTH_ECANCELLED, "generate: cancelled during prefill");
      goto done;
    }
    size_t n = req->n_prompt - at < (size_t)chunk ? req->n_prompt - at : (size_t)chunk;
    if ((rc = forward_tokens(m, &g, req->prompt + at, (int)n, err))) goto done;
    at += n;
  }
  double t1 = now_seconds();
  res->prefill_seconds = t1 - t0;

  /* decode */
  bool ended = false;
  while (!ended) {
    sample_token st;
    if ((rc = sampler_sample(g.smp, g.logits, &st, err))) goto done;
    sampler_accept(g.smp, st.id);
    if ((rc = gen_emit_token(&g.out, req, st.id, max_new, res, &ended, err))) goto done;
    if (fn && fn(user, hbuf_str(&g.out.delta), g.out.delta.len, &st)) {
      res->finish = GEN_FINISH_CANCELLED;
      rc = herr_set(err, HEARTH_ECANCELLED, "generate: cancelled after %lld tokens", (long long)res->completion_tokens);
      goto done;
    }
    if (ended) break;
    if (cancelled(req)) {
      res->finish = GEN_FINISH_CANCELLED;
      rc = herr_set(err, HEARTH_ECANCELLED, "generate: cancelled after %lld tokens", (long long)res->completion_tokens);
      goto done;
    }
    if ((rc = forward_tokens(m, &g, &st.id, 1, err))) goto done;
  }

  /* what is still held back: the detokenizer's tail, then the stop matcher's */
  if ((rc = gen_emit_flush(&g.out, res, err))) goto done;
  if (g.out.delta.len && fn) fn(user, hbuf_str(&g.out.delta), g.out.delta.len, NULL); /* the run is over: no cancel */
  res->decode_seconds = now_seconds() - t1;
  rc = 0;

done:
  gen_state_free(&g);
  return rc;
}
