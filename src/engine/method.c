/* method.c — the generation methods (see method.h): the autoregressive run,
 * the speculative run and its draft sources — prompt lookup over the
 * request's own tokens, a draft model with a KV cache of the run's own, and
 * the model's multi-token-prediction layer with its rows in a cache of the
 * run's own and the target's hidden states it has not seen yet. Owns a
 * run's draft state and RNG; knows the model only through model.h and the
 * output only through the commit callback it is given. */
#include "engine/method.h"

#include <stdlib.h>
#include <string.h>

#include "base/vec.h"
#include "engine/kv_cache.h"

/* Prompt lookup: the longest suffix tried first. */
#define NGRAM_MAX 4
#define NGRAM_MIN 2
/* Tokens a draft model (an MTP layer) catches up on per forward. */
#define DRAFT_CHUNK 512

struct gen_run {
  gen_method_kind kind;
  spec_source source;
  int spec_tokens;
  int cur;                              /* drafts to propose next: adapts within [1, spec_tokens] */
  int64_t vocab;
  int32_t draft[GEN_MAX_SPEC_TOKENS];   /* the last proposal */
  int n_draft;
  int64_t n_hist;                       /* tokens before the last proposal */
  sample_rng rng;                       /* acceptance draws, and a draft model's draws */
  /* SPEC_DRAFT */
  model *dm;                            /* borrowed */
  kv_cache *dcache;                     /* borrowed: the scheduler's cache for its draft model */
  kv_seq *dkv;                          /* owned, made at the first proposal: rows of committed tokens only,
                                           between steps */
  sampler *dsmp;                        /* owned: the draft's distribution q (no penalties) */
  bool greedy;                          /* the request is greedy: drafts are the draft's argmax */
  float *q;                             /* owned [spec_tokens * vocab]: q of each draft (sampled requests) */
  /* SPEC_MTP: the layer's rows (in dcache) are of positions it has seen, in order (a prefix-cache
   * hit leaves the positions before it unseen); the first m_true are of the target's hidden states,
   * the rest of the last proposal's chain */
  model *tm;                            /* borrowed: the target */
  int64_t m_true;
  int64_t m_next;                       /* the position after the last one the layer saw (0: none) */
  int64_t D;                            /* hidden_size */
  float *hid;                           /* owned [cap_hid * D]: the target's hidden states of positions
                                           [hid_pos, hid_pos + n_hid), not all seen by the layer yet */
  int64_t hid_pos, n_hid, cap_hid;
  int64_t *mpos;                        /* owned [cap_hid + 1]: positions of a forward's rows */
  float *chain;                         /* owned [D]: the layer's output at its last row (the next row's h) */
};

const char *spec_source_name(spec_source s) {
  switch (s) {
    case SPEC_NGRAM: return "ngram";
    case SPEC_DRAFT: return "draft";
    case SPEC_MTP: return "mtp";
  }
  return "?";
}

int spec_source_parse(const char *name, spec_source *out, herr *err) {
  for (int i = 0; i < SPEC_N_SOURCES; i++)
    if (name && !strcmp(name, spec_source_name((spec_source)i))) {
      *out = (spec_source)i;
      return 0;
    }
  return herr_set(err, HEARTH_EINVAL, "speculative method '%s' is not one of ngram, draft, mtp", name ? name : "");
}

bool gen_method_can_rollback(const model *m) {
  /* attention KV is cut back by truncating the sequence; a recurrent layer's
   * state (Gated DeltaNet) is kept at a mark before the drafts and restored
   * from it (kv_paged_seq_mark), which the CPU backend runs */
  model_kv_geometry g;
  model_kv_geometry_of(m, &g);
  for (int l = 0; l < g.n_layers; l++)
    if (g.state_dim[l] > 0) return bk_backend_is_cpu(model_backend(m));
  return true;
}

int gen_method_check(const gen_method *gm, const model *target, herr *err) {
  if (!gm || gm->spec_tokens < 0) return 0;
  if (gm->spec_tokens > GEN_MAX_SPEC_TOKENS)
    return herr_set(err, HEARTH_EINVAL, "spec_tokens %d is more than %d", gm->spec_tokens, GEN_MAX_SPEC_TOKENS);
  int rc;
  if (gm->source == SPEC_MTP && (rc = model_mtp_check(target, err)))
    return herr_wrap(err, "speculative method mtp");
  if (gm->source == SPEC_DRAFT && !gm->draft)
    return herr_set(err, HEARTH_EINVAL, "speculative method draft needs a draft model");
  /* without drafts (spec_tokens 0: speculation only when a request asks) nothing is ever rolled back here;
   * a request that asks is refused by the scheduler then */
  if (gm->spec_tokens > 0 && !gen_method_can_rollback(target))
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s", GEN_ROLLBACK_REFUSED);
  if (gm->spec_tokens > 0 && gm->source == SPEC_DRAFT && !gen_method_can_rollback(gm->draft))
    return herr_set(err, HEARTH_EUNSUPPORTED, "draft model: %s", GEN_ROLLBACK_REFUSED);
  return 0;
}

int gen_method_check_draft(const model *target, const tokenizer *target_tok, const model *draft,
                           const tokenizer *draft_tok, herr *err) {
  int64_t vt = model_vocab_size(target), vd = model_vocab_size(draft);
  if (vt != vd)
    return herr_set(err, HEARTH_EINVAL,
                    "draft model: its vocabulary has %lld tokens but the model's has %lld; a draft must share the "
                    "tokenizer",
                    (long long)vd, (long long)vt);
  if (!target_tok || !draft_tok) return 0;
  int32_t nt = tokenizer_vocab_size(target_tok), nd = tokenizer_vocab_size(draft_tok);
  if (nt != nd)
    return herr_set(err, HEARTH_EINVAL, "draft model: its tokenizer has %d tokens but the model's has %d", (int)nd,
                    (int)nt);
  for (int32_t i = 0; i < nt; i++) {
    const char *a = tokenizer_id_to_token(target_tok, i), *b = tokenizer_id_to_token(draft_tok, i);
    if ((a == NULL) != (b == NULL) || (a && strcmp(a, b)))
      return herr_set(err, HEARTH_EINVAL, "draft model: token %d is '%s' in its tokenizer but '%s' in the model's",
                      (int)i, b ? b : "(none)", a ? a : "(none)");
  }
  return 0;
}

/* ---- runs ---- */

void gen_run_free(gen_run *r) {
  if (!r) return;
  if (r->dkv) kv_cache_seq_free(r->dkv);
  sampler_free(r->dsmp);
  free(r->q);
  free(r->hid);
  free(r->mpos);
  free(r->chain);
  free(r);
}

int gen_run_new(const gen_method *gm, const gen_request *req, int64_t vocab, kv_cache *draft_cache, gen_run **out,
                herr *err) {
  *out = NULL;
  gen_run *r = calloc(1, sizeof *r);
  if (!r) return herr_set(err, HEARTH_ENOMEM, "generate: out of memory");
  r->vocab = vocab;
  int n = req->spec_tokens >= 0 ? req->spec_tokens : gm ? gm->spec_tokens : 0;
  if (n > GEN_MAX_SPEC_TOKENS) {
    free(r);
    return herr_set_at(err, HEARTH_EINVAL, "spec_tokens", 0, "spec_tokens %d is more than %d", n, GEN_MAX_SPEC_TOKENS);
  }
  /* the request's source, else the method's; prompt lookup when it has none (a draft method without
   * its model) */
  r->source = SPEC_NGRAM;
  if (gm && gm->source == SPEC_DRAFT && gm->draft) r->source = SPEC_DRAFT;
  if (gm && gm->source == SPEC_MTP) r->source = SPEC_MTP;
  int rc = 0;
  if (req->spec_method) {
    herr e = {0};
    if (spec_source_parse(req->spec_method, &r->source, &e)) {
      free(r);
      return herr_set_at(err, HEARTH_EINVAL, "spec_method", 0, "%s", e.msg);
    }
    if (r->source == SPEC_DRAFT && !(gm && gm->draft)) {
      free(r);
      return herr_set_at(err, HEARTH_EINVAL, "spec_method", 0,
                         "spec_method draft: the model was loaded without a draft model (--draft-model)");
    }
    if (r->source == SPEC_MTP && (!gm || !gm->target || (rc = model_mtp_check(gm->target, &e)) || !gm->mtp_cache)) {
      free(r);
      return herr_set_at(err, HEARTH_EUNSUPPORTED, "spec_method", 0, "spec_method mtp: %s",
                         rc ? e.msg : "the model's multi-token-prediction layer has no cache here");
    }
  }
  if (n > 0 && !req->grammar && !sample_params_host_only(&req->sample)) { /* DRY, XTC, ...: one token at a time */
    r->kind = GEN_METHOD_SPECULATIVE;
    r->spec_tokens = r->cur = n;
  }
  sample_rng_seed(&r->rng, req->sample.seed ^ 0x5eed5bec0ffee000ull);
  if (r->kind == GEN_METHOD_SPECULATIVE && (r->source == SPEC_DRAFT || r->source == SPEC_MTP)) {
    if (r->source == SPEC_DRAFT) {
      r->dm = gm->draft;
      r->dcache = draft_cache;
    } else {
      r->tm = gm ? gm->target : NULL;
      r->dcache = gm ? gm->mtp_cache : NULL;
      r->D = r->tm ? model_cfg(r->tm)->hidden_size : 0;
      if (r->tm && (rc = model_mtp_check(r->tm, err))) goto fail;
      r->chain = r->D ? malloc(sizeof(float) * (size_t)r->D) : NULL;
      if (r->D && !r->chain) {
        rc = herr_set(err, HEARTH_ENOMEM, "generate: out of memory");
        goto fail;
      }
    }
    if (!r->dcache || (r->source == SPEC_MTP && !r->tm)) {
      rc = herr_set(err, HEARTH_EINTERNAL, "speculative: a %s without a cache for it",
                    r->source == SPEC_DRAFT ? "draft model" : "multi-token-prediction layer");
      goto fail;
    }
    sample_params dp;
    sample_params_default(&dp);
    dp.greedy = req->sample.greedy;
    dp.temperature = req->sample.temperature;
    dp.top_k = req->sample.top_k;
    dp.top_p = req->sample.top_p;
    dp.min_p = req->sample.min_p;
    if ((rc = sampler_new((int32_t)vocab, &dp, &r->dsmp, err))) goto fail;
    r->greedy = sampler_is_greedy(r->dsmp);
    r->q = r->greedy ? NULL : malloc(sizeof(float) * (size_t)vocab * (size_t)n);
    if (!r->greedy && !r->q) {
      rc = herr_set(err, HEARTH_ENOMEM, "generate: out of memory for the draft model's logits");
      goto fail;
    }
  }
  *out = r;
  return 0;
fail:
  gen_run_free(r);
  return rc;
}

gen_method_kind gen_run_kind(const gen_run *r) { return r->kind; }
spec_source gen_run_source(const gen_run *r) { return r->source; }

float *gen_run_hidden(gen_run *r, int64_t pos, int n, herr *err) {
  if (r->kind != GEN_METHOD_SPECULATIVE || r->source != SPEC_MTP || n <= 0) return NULL;
  /* contiguous from hid_pos: a position fed again replaces the rest; one past a gap starts afresh */
  if (pos < r->hid_pos || pos > r->hid_pos + r->n_hid) r->hid_pos = pos, r->n_hid = 0;
  else r->n_hid = pos - r->hid_pos;
  if (r->n_hid + n > r->cap_hid) { /* rows of D floats, and one position more than rows */
    size_t ch = (size_t)r->cap_hid, cp = (size_t)r->cap_hid;
    bool ok = hgrow((void **)&r->hid, &ch, (size_t)(r->n_hid + n), sizeof(float) * (size_t)r->D) &&
              hgrow((void **)&r->mpos, &cp, ch + 1, sizeof(int64_t));
    if (!ok) {
      herr_set(err, HEARTH_ENOMEM, "generate: out of memory for %lld hidden states", (long long)(r->n_hid + n));
      return NULL;
    }
    r->cap_hid = (int64_t)ch;
  }
  float *at = r->hid + (size_t)r->n_hid * (size_t)r->D;
  r->n_hid += n;
  return at;
}

int64_t gen_run_backlog(const gen_run *r) {
  if (r->source != SPEC_MTP || r->kind != GEN_METHOD_SPECULATIVE) return 0;
  int64_t from = r->m_next > r->hid_pos ? r->m_next : r->hid_pos;
  return r->hid_pos + r->n_hid > from ? r->hid_pos + r->n_hid - from : 0;
}

/* Prompt lookup: for the longest n (NGRAM_MAX down to NGRAM_MIN) whose last
 * n tokens occurred before, the continuation of the latest occurrence that
 * has max tokens after it (else of the one with the most). */
static int propose_ngram(gen_run *r, const int32_t *toks, int64_t n_toks, int max) {
  for (int n = NGRAM_MAX; n >= NGRAM_MIN; n--) {
    if (n_toks < n + 1) continue;
    const int32_t *suf = toks + n_toks - n;
    int64_t best_from = -1, best_k = 0;
    for (int64_t i = n_toks - n - 1; i >= 0 && best_k < max; i--) {
      if (toks[i] != suf[0] || memcmp(toks + i, suf, sizeof(int32_t) * (size_t)n)) continue;
      int64_t from = i + n, k = n_toks - from < max ? n_toks - from : max;
      if (k > best_k) best_from = from, best_k = k;
    }
    if (best_k > 0) {
      for (int64_t j = 0; j < best_k; j++) r->draft[j] = toks[best_from + j];
      return (int)best_k;
    }
  }
  return 0;
}

static int32_t draw(const float *probs, int64_t n, sample_rng *rng) {
  double u = sample_rng_uniform(rng), acc = 0;
  int32_t last = -1;
  for (int64_t i = 0; i < n; i++) {
    if (probs[i] <= 0) continue;
    last = (int32_t)i;
    acc += probs[i];
    if (u < acc) return (int32_t)i;
  }
  return last;
}

static int32_t argmax_row(const float *row, int64_t n) {
  int32_t best = 0;
  for (int64_t i = 1; i < n; i++)
    if (row[i] > row[best]) best = (int32_t)i;
  return best;
}

/* Draft j of run r from its draft model's logits row (used as scratch). */
static int draft_pick(gen_run *r, float *row, int j, herr *err) {
  if (r->greedy) {
    r->draft[j] = argmax_row(row, r->vocab);
    return 0;
  }
  float *q = r->q + (size_t)j * (size_t)r->vocab;
  int rc = sampler_distribution(r->dsmp, row, q, err);
  if (rc) return rc;
  r->draft[j] = draw(q, r->vocab, &r->rng);
  return r->draft[j] < 0 ? herr_set(err, HEARTH_EINTERNAL, "draft model: an empty distribution") : 0;
}

/* The draft-model runs of p (indices idx[0..n)), which share one draft
 * model: one forward in which each catches up on the committed tokens it
 * has not seen (a long backlog — the prompt — is fed first, alone, in
 * chunks), then one forward per drafted token over every run still
 * drafting. Each draft model's KV keeps every row fed; verify cuts it back. */
static int propose_drafts(gen_proposal *p, const int *idx, int n, float **scratch, size_t *cap, herr *err) {
  model *dm = p[idx[0]].run->dm;
  int64_t vocab = p[idx[0]].run->vocab;
  if ((size_t)n * (size_t)vocab > *cap) {
    float *f = realloc(*scratch, sizeof(float) * (size_t)n * (size_t)vocab);
    if (!f) return herr_set(err, HEARTH_ENOMEM, "draft model: out of memory for %d logits rows", n);
    *scratch = f;
    *cap = (size_t)n * (size_t)vocab;
  }
  model_seq *seqs = calloc((size_t)n, sizeof *seqs);
  int *who = calloc((size_t)n, sizeof *who);
  if (!seqs || !who) {
    free(seqs);
    free(who);
    return herr_set(err, HEARTH_ENOMEM, "draft model: out of memory for a batch of %d", n);
  }
  int rc = 0, nb = 0;
  for (int k = 0; k < n && !rc; k++) {
    gen_proposal *x = &p[idx[k]];
    gen_run *r = x->run;
    if (!r->dkv && (rc = kv_cache_seq_new(r->dcache, &r->dkv, err))) break;
    if (r->dkv->len >= x->n_toks) kv_cache_seq_rewind(r->dkv, x->n_toks - 1); /* the last token's logits are needed */
    int64_t have = r->dkv->len;
    while (!rc && x->n_toks - have > DRAFT_CHUNK) { /* a backlog: the prompt, a preempted run's tokens */
      model_seq one = {.kv = r->dkv, .tokens = x->toks + have, .n_tokens = DRAFT_CHUNK, .out = MODEL_OUT_NONE};
      model_batch b1 = {.seqs = &one, .n_seqs = 1};
      rc = model_forward(dm, &b1, NULL, err);
      have = r->dkv->len;
    }
    seqs[nb] = (model_seq){.kv = r->dkv, .tokens = x->toks + have, .n_tokens = (int)(x->n_toks - have)};
    who[nb++] = idx[k];
  }
  for (int j = 0; !rc && nb > 0; j++) {
    model_batch b = {.seqs = seqs, .n_seqs = nb};
    if ((rc = model_forward(dm, &b, *scratch, err))) break;
    int next = 0;
    for (int k = 0; k < nb && !rc; k++) {
      gen_proposal *x = &p[who[k]];
      gen_run *r = x->run;
      if ((rc = draft_pick(r, *scratch + (size_t)k * (size_t)vocab, j, err))) break;
      x->n = j + 1;
      /* it drafts on: its draft goes in next (a recurrent draft model keeps its state here first,
       * where verify cuts it back to when a draft it fed is rejected) */
      if (j + 1 < x->max && !(rc = j == 0 ? kv_cache_seq_mark(r->dkv, err) : 0)) {
        seqs[next] = (model_seq){.kv = r->dkv, .tokens = &r->draft[j], .n_tokens = 1};
        who[next++] = who[k];
      }
    }
    nb = next;
  }
  free(seqs);
  free(who);
  return rc;
}

/* Grows the caller's logits buffer to n rows. */
static int grow_rows(float **scratch, size_t *cap, int n, int64_t vocab, herr *err) {
  if ((size_t)n * (size_t)vocab <= *cap) return 0;
  float *f = realloc(*scratch, sizeof(float) * (size_t)n * (size_t)vocab);
  if (!f) return herr_set(err, HEARTH_ENOMEM, "speculative: out of memory for %d logits rows", n);
  *scratch = f;
  *cap = (size_t)n * (size_t)vocab;
  return 0;
}

/* The MTP runs of p (indices idx[0..n)), which share one target. First one forward of the layer in
 * which each run's rows see the positions it has the target's hidden state and the next token for
 * (row i: h_i and t_{i+1}, at position i; a long backlog — a prompt — is fed first, alone, in chunks);
 * a drafting run's last row (position n_toks - 2, its token the pending one) gives its first draft.
 * Then one forward per drafted token over every run still drafting: the row at position
 * n_toks - 2 + j takes draft j and the layer's own output at the row before. Rows of the target's
 * hidden states stay (m_true), the chain's are cut off at verification. */
static int propose_mtp(gen_proposal *p, const int *idx, int n, float **scratch, size_t *cap, herr *err) {
  model *tm = p[idx[0]].run->tm;
  int64_t vocab = p[idx[0]].run->vocab, D = p[idx[0]].run->D;
  int rc = grow_rows(scratch, cap, n, vocab, err);
  if (rc) return rc;
  model_seq *seqs = calloc((size_t)n, sizeof *seqs);
  int *who = calloc((size_t)n, sizeof *who);
  int64_t *ends = calloc((size_t)n, sizeof *ends);
  float *nh = NULL;
  size_t nh_rows = 0;
  if (!seqs || !who || !ends) rc = herr_set(err, HEARTH_ENOMEM, "multi-token prediction: out of memory for a batch of %d", n);
  for (int k = 0; k < n && !rc; k++) { /* room for the drafting runs' output rows (the chain's first h) */
    gen_run *r = p[idx[k]].run;
    int64_t from = r->m_next > r->hid_pos ? r->m_next : r->hid_pos, end = r->hid_pos + r->n_hid;
    if (p[idx[k]].max > 0 && end > from) nh_rows += (size_t)(end - from < DRAFT_CHUNK ? end - from : DRAFT_CHUNK);
  }
  if (!rc && nh_rows && !(nh = malloc(sizeof(float) * nh_rows * (size_t)D)))
    rc = herr_set(err, HEARTH_ENOMEM, "multi-token prediction: out of memory for %zu hidden states", nh_rows);
  int nb = 0;
  size_t nh_at = 0;
  for (int k = 0; k < n && !rc; k++) {
    gen_proposal *x = &p[idx[k]];
    gen_run *r = x->run;
    if (!r->dkv && (rc = kv_cache_seq_new(r->dcache, &r->dkv, err))) break;
    if (r->dkv->len > r->m_true) kv_cache_seq_truncate(r->dkv, r->m_true); /* an unverified chain */
    int64_t end = r->hid_pos + r->n_hid < x->n_toks - 1 ? r->hid_pos + r->n_hid : x->n_toks - 1;
    int64_t from = r->m_next > r->hid_pos ? r->m_next : r->hid_pos;
    ends[k] = end;
    while (!rc && end - from > DRAFT_CHUNK) { /* a backlog: the prompt */
      for (int64_t i = 0; i < DRAFT_CHUNK; i++) r->mpos[i] = from + i;
      model_seq one = {.kv = r->dkv, .tokens = x->toks + from + 1, .n_tokens = DRAFT_CHUNK, .positions = r->mpos,
                       .out = MODEL_OUT_NONE, .mtp_hidden = r->hid + (size_t)(from - r->hid_pos) * (size_t)D};
      model_batch b1 = {.seqs = &one, .n_seqs = 1};
      if (!(rc = model_forward(tm, &b1, NULL, err))) from += DRAFT_CHUNK, r->m_next = from;
    }
    if (rc || end <= from) continue;
    bool drafts = x->max > 0 && end == x->n_toks - 1;
    for (int64_t i = from; i < end; i++) r->mpos[i - from] = i;
    seqs[nb] = (model_seq){.kv = r->dkv, .tokens = x->toks + from + 1, .n_tokens = (int)(end - from),
                           .positions = r->mpos, .out = drafts ? MODEL_OUT_LOGITS : MODEL_OUT_NONE,
                           .mtp_hidden = r->hid + (size_t)(from - r->hid_pos) * (size_t)D,
                           .next_hidden = drafts ? nh + nh_at * (size_t)D : NULL};
    if (drafts) nh_at += (size_t)(end - from);
    who[nb++] = k;
  }
  if (!rc && nb > 0) {
    model_batch b = {.seqs = seqs, .n_seqs = nb};
    rc = model_forward(tm, &b, *scratch, err);
  }
  /* what each saw: the hidden states before m_next are done with */
  for (int i = 0; i < nb && !rc; i++) p[idx[who[i]]].run->m_next = ends[who[i]];
  for (int k = 0; k < n && !rc; k++) {
    gen_run *r = p[idx[k]].run;
    int64_t drop = r->m_next - r->hid_pos, keep = r->n_hid - drop;
    if (drop <= 0) continue;
    if (keep > 0) memmove(r->hid, r->hid + (size_t)drop * (size_t)D, sizeof(float) * (size_t)(keep * D));
    r->hid_pos = r->m_next, r->n_hid = keep > 0 ? keep : 0;
    if (r->dkv) r->m_true = r->dkv->len;
  }
  int next = 0;
  for (int i = 0, row = 0; i < nb && !rc; i++) {
    gen_proposal *x = &p[idx[who[i]]];
    gen_run *r = x->run;
    r->m_true = r->dkv->len;
    if (seqs[i].out != MODEL_OUT_LOGITS) continue;
    if ((rc = draft_pick(r, *scratch + (size_t)row++ * (size_t)vocab, 0, err))) break;
    memcpy(r->chain, seqs[i].next_hidden + (size_t)(seqs[i].n_tokens - 1) * (size_t)D, sizeof(float) * (size_t)D);
    x->n = 1;
    if (x->max > 1) {
      r->mpos[0] = x->n_toks - 1;
      seqs[next] = (model_seq){.kv = r->dkv, .tokens = &r->draft[0], .n_tokens = 1, .positions = r->mpos,
                               .mtp_hidden = r->chain, .next_hidden = r->chain};
      who[next++] = who[i];
    }
  }
  nb = rc ? 0 : next;
  for (int j = 1; !rc && nb > 0; j++) { /* the chain: one drafted token a forward */
    model_batch b = {.seqs = seqs, .n_seqs = nb};
    if ((rc = model_forward(tm, &b, *scratch, err))) break;
    next = 0;
    for (int i = 0; i < nb && !rc; i++) {
      gen_proposal *x = &p[idx[who[i]]];
      gen_run *r = x->run;
      if ((rc = draft_pick(r, *scratch + (size_t)i * (size_t)vocab, j, err))) break;
      x->n = j + 1;
      if (j + 1 < x->max) {
        r->mpos[0] = x->n_toks - 1 + j;
        seqs[next] = (model_seq){.kv = r->dkv, .tokens = &r->draft[j], .n_tokens = 1, .positions = r->mpos,
                                 .mtp_hidden = r->chain, .next_hidden = r->chain};
        who[next++] = who[i];
      }
    }
    nb = next;
  }
  free(seqs);
  free(who);
  free(ends);
  free(nh);
  return rc;
}

/* A proposal that was never verified (its sequence left the step before the
 * forward: preempted): the draft model (the MTP layer) forgets the rows it fed for it. */
static void abandon(gen_run *r) {
  int64_t keep = r->source == SPEC_MTP ? r->m_true : r->n_hist;
  if (r->dkv && r->dkv->len > keep) kv_cache_seq_rewind(r->dkv, keep);
  r->n_draft = 0;
}

int gen_runs_propose(gen_proposal *p, int n, float **scratch, size_t *cap, herr *err) {
  int *draft_idx = NULL, n_draft_runs = 0, *mtp_idx = NULL, n_mtp_runs = 0;
  for (int i = 0; i < n; i++) {
    gen_proposal *x = &p[i];
    gen_run *r = x->run;
    x->n = 0;
    x->draft = r->draft;
    if (r->n_draft > 0) abandon(r);
    r->n_hist = x->n_toks;
    if (x->max > r->cur) x->max = r->cur;
    if (r->kind == GEN_METHOD_SPECULATIVE && r->source == SPEC_MTP && x->n_toks > 0 &&
        (x->max > 0 || gen_run_backlog(r) > 0)) { /* drafting, or feeding its layer what it has */
      if (x->max < 0) x->max = 0;
      if (!mtp_idx && !(mtp_idx = malloc(sizeof(int) * (size_t)n))) {
        free(draft_idx);
        return herr_set(err, HEARTH_ENOMEM, "multi-token prediction: out of memory");
      }
      mtp_idx[n_mtp_runs++] = i;
      continue;
    }
    if (r->kind != GEN_METHOD_SPECULATIVE || x->max <= 0 || x->n_toks <= 0) continue;
    if (r->source == SPEC_NGRAM) {
      x->n = propose_ngram(r, x->toks, x->n_toks, x->max);
    } else if (r->source == SPEC_DRAFT) {
      if (!draft_idx && !(draft_idx = malloc(sizeof(int) * (size_t)n))) {
        free(mtp_idx);
        return herr_set(err, HEARTH_ENOMEM, "draft model: out of memory");
      }
      draft_idx[n_draft_runs++] = i;
    }
  }
  int rc = 0;
  /* the draft-model runs, grouped by draft model (one per scheduler in practice) */
  while (!rc && n_draft_runs > 0) {
    model *dm = p[draft_idx[0]].run->dm;
    int same = 0, rest = 0;
    for (int k = 0; k < n_draft_runs; k++) /* stable partition: this model's runs first */
      if (p[draft_idx[k]].run->dm == dm) {
        int v = draft_idx[k];
        memmove(draft_idx + same + 1, draft_idx + same, sizeof(int) * (size_t)(k - same));
        draft_idx[same++] = v;
      }
    rest = n_draft_runs - same;
    rc = propose_drafts(p, draft_idx, same, scratch, cap, err);
    memmove(draft_idx, draft_idx + same, sizeof(int) * (size_t)rest);
    n_draft_runs = rest;
  }
  free(draft_idx);
  /* the MTP runs, grouped by target (one per scheduler) */
  while (!rc && n_mtp_runs > 0) {
    model *tm = p[mtp_idx[0]].run->tm;
    int same = 0;
    for (int k = 0; k < n_mtp_runs; k++)
      if (p[mtp_idx[k]].run->tm == tm) {
        int v = mtp_idx[k];
        memmove(mtp_idx + same + 1, mtp_idx + same, sizeof(int) * (size_t)(k - same));
        mtp_idx[same++] = v;
      }
    rc = propose_mtp(p, mtp_idx, same, scratch, cap, err);
    memmove(mtp_idx, mtp_idx + same, sizeof(int) * (size_t)(n_mtp_runs - same));
    n_mtp_runs -= same;
  }
  free(mtp_idx);
  for (int i = 0; i < n; i++) p[i].run->n_draft = rc ? 0 : p[i].n;
  return rc;
}

void gen_run_trim(gen_run *r, int n) {
  if (n <= 0) abandon(r); /* a plain step: its token may be sampled without verify */
  else if (n < r->n_draft) r->n_draft = n;
}

/* Row i's token, and whether it is draft i (i < r->n_draft; the row after
 * the last draft gives one more token). */
typedef int (*verify_pick)(gen_run *r, void *pctx, int i, sample_token *st, bool *acc, herr *err);

static int verify_rows(gen_run *r, int n_rows, verify_pick pick, void *pctx, gen_commit_fn commit, void *ctx,
                       gen_step *out, herr *err) {
  *out = (gen_step){0};
  if (n_rows == 1 && r->n_draft > 0) abandon(r); /* a plain step after a proposal that was not fed */
  if (n_rows != 1 + r->n_draft)
    return herr_set(err, HEARTH_EINTERNAL, "speculative: %d logits rows for %d drafted tokens", n_rows, r->n_draft);
  out->drafted = r->n_draft;
  int rc = 0;
  for (int i = 0; i <= r->n_draft; i++) {
    sample_token st;
    bool acc = false;
    if ((rc = pick(r, pctx, i, &st, &acc, err))) break;
    out->committed++;
    if (acc) out->accepted++;
    if (i == r->n_draft - 1 || (i < r->n_draft && !acc)) {
      /* the next proposal's length: one more after a step that kept every
       * draft, half after one that kept none */
      if (out->accepted == r->n_draft && r->cur < r->spec_tokens) r->cur++;
      else if (out->accepted == 0 && r->cur > 1) r->cur /= 2;
    }
    if (commit(ctx, &st)) {
      out->ended = true;
      return 0; /* the commit may have freed the run */
    }
    if (i < r->n_draft && !acc) break;
  }
  if (r->source == SPEC_MTP) {
    /* the MTP layer keeps its rows of the target's hidden states; the target's of the rejected
     * drafts' positions are gone */
    if (r->dkv && r->dkv->len > r->m_true) kv_cache_seq_truncate(r->dkv, r->m_true);
    int64_t keep = r->n_hist + out->accepted; /* positions the target's cache keeps */
    if (out->drafted > 0 && r->hid_pos + r->n_hid > keep) r->n_hid = keep > r->hid_pos ? keep - r->hid_pos : 0;
  } else if (r->dkv && r->dkv->len > r->n_hist + out->accepted) {
    /* the draft model keeps the rows of accepted drafts only (a recurrent one goes back to its
     * mark, before its drafts, and catches up on them at the next proposal) */
    kv_cache_seq_rewind(r->dkv, r->n_hist + out->accepted);
  }
  r->n_draft = 0;
  return rc;
}

typedef struct host_rows {
  sampler *smp;
  float *rows;
  int64_t vocab;
} host_rows;

static int pick_host(gen_run *r, void *pctx, int i, sample_token *st, bool *acc, herr *err) {
  host_rows *h = pctx;
  float *row = h->rows + (size_t)i * (size_t)h->vocab;
  if (i == r->n_draft) return sampler_sample(h->smp, row, st, err);
  const float *q = r->q && !r->greedy && (r->source == SPEC_DRAFT || r->source == SPEC_MTP)
                       ? r->q + (size_t)i * (size_t)h->vocab
                       : NULL;
  return sampler_verify(h->smp, row, r->draft[i], q, &r->rng, st, acc, err);
}

int gen_run_verify(gen_run *r, sampler *smp, float *rows, int n_rows, int64_t vocab, gen_commit_fn commit, void *ctx,
                   gen_step *out, herr *err) {
  host_rows h = {smp, rows, vocab};
  return verify_rows(r, n_rows, pick_host, &h, commit, ctx, out, err);
}

static int pick_chosen(gen_run *r, void *pctx, int i, sample_token *st, bool *acc, herr *err) {
  (void)err;
  *st = ((const sample_token *)pctx)[i];
  *acc = i < r->n_draft && st->id == r->draft[i];
  return 0;
}

int gen_run_verify_chosen(gen_run *r, const sample_token *chosen, int n_rows, gen_commit_fn commit, void *ctx,
                          gen_step *out, herr *err) {
  return verify_rows(r, n_rows, pick_chosen, (void *)chosen, commit, ctx, out, err);
}
