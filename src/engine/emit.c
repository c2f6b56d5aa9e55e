/* emit.c — the per-token output logic (see emit.h). */
#include "engine/emit.h"

#include <string.h>

int gen_emit_init(gen_emit *e, const tokenizer *tok, const gen_request *req, herr *err) {
  memset(e, 0, sizeof *e);
  if (!tok) {
    if (req->n_stop) return herr_set(err, HEARTH_EINVAL, "generate: stop strings need a tokenizer to decode the output");
    return 0;
  }
  e->detok = tokenizer_stream_new(tok, req->skip_special);
  if (!e->detok) return herr_set(err, HEARTH_ENOMEM, "generate: out of memory for the detokenizer");
  return stop_matcher_new(req->stop, req->n_stop, &e->stops, err);
}

void gen_emit_free(gen_emit *e) {
  if (e->detok) tokenizer_stream_free(e->detok);
  stop_matcher_free(e->stops);
  hbuf_free(&e->piece);
  hbuf_free(&e->delta);
  memset(e, 0, sizeof *e);
}

static bool is_eos(const gen_request *req, int32_t id) {
  if (req->ignore_eos) return false;
  for (int i = 0; i < req->n_eos; i++)
    if (req->eos_ids[i] == id) return true;
  return false;
}

int gen_emit_token(gen_emit *e, const gen_request *req, int32_t id, int64_t max_new, gen_result *res, bool *ended,
                   herr *err) {
  *ended = false;
  res->completion_tokens++;
  hbuf_clear(&e->delta);
  if (is_eos(req, id)) {
    res->finish = GEN_FINISH_STOP;
    res->stop_token = id;
    *ended = true;
    return 0;
  }
  if (e->detok) {
    hbuf_clear(&e->piece);
    int rc = tokenizer_stream_put(e->detok, id, &e->piece, err);
    if (rc) return rc;
    int which = stop_matcher_put(e->stops, e->piece.data ? e->piece.data : "", e->piece.len, &e->delta);
    if (which == -2) return herr_set(err, HEARTH_ENOMEM, "generate: out of memory for the output text");
    if (which >= 0) {
      res->finish = GEN_FINISH_STOP;
      res->stop_index = which;
      *ended = true;
      return 0;
    }
  }
  if (res->completion_tokens >= max_new) {
    res->finish = GEN_FINISH_LENGTH;
    *ended = true;
  }
  return 0;
}

int gen_emit_flush(gen_emit *e, gen_result *res, herr *err) {
  hbuf_clear(&e->delta);
  if (!e->detok || res->stop_index >= 0) return 0;
  hbuf_clear(&e->piece);
  int rc = tokenizer_stream_flush(e->detok, &e->piece, err);
  if (rc) return rc;
  int which = e->piece.len ? stop_matcher_put(e->stops, e->piece.data, e->piece.len, &e->delta) : -1;
  if (which == -2) return herr_set(err, HEARTH_ENOMEM, "generate: out of memory for the output text");
  if (which >= 0) {
    res->finish = GEN_FINISH_STOP;
    res->stop_index = which;
  } else {
    stop_matcher_flush(e->stops, &e->delta);
  }
  return 0;
}
