/* method.c — the generation methods (see method.h): the autoregressive run,
 * the speculative run and its draft sources — prompt lookup over the
 * request's own tokens, a draft model with a KV cache of the run's own, and
 * the place where multi-token-prediction heads plug in. Owns a run's draft
 * state and RNG; knows the model only through model.h and the output only
 * through the commit callback it is given. */
#include "engine/method.h"

#include <stdlib.h>
#include <string.h>

#include "engine/kv_cache.h"

/* Prompt lookup: the longest suffix tried first. */
#define NGRAM_MAX 4
#define NGRAM_MIN 2
/* Tokens a draft model catches up on per forward. */
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
   * state (Gated DeltaNet) holds every token folded in and cannot be */
  model_kv_geometry g;
  model_kv_geometry_of(m, &g);
  for (int l = 0; l < g.n_layers; l++)
    if (g.state_dim[l] > 0) return false;
  return true;
}

int gen_method_check(const gen_method *gm, const model *target, herr *err) {
  if (!gm || gm->spec_tokens < 0) return 0;
  if (gm->spec_tokens > GEN_MAX_SPEC_TOKENS)
    return herr_set(err, HEARTH_EINVAL, "spec_tokens %d is more than %d", gm->spec_tokens, GEN_MAX_SPEC_TOKENS);
  if (gm->source == SPEC_MTP)
    return herr_set(err, HEARTH_EUNSUPPORTED,
                    "speculative decoding with multi-token-prediction heads is not supported yet (use ngram or draft)");
  if (gm->source == SPEC_DRAFT && !gm->draft)
    return herr_set(err, HEARTH_EINVAL, "speculative method draft needs a draft model");
  if (!gen_method_can_rollback(target))
    return herr_set(err, HEARTH_EUNSUPPORTED,
                    "speculative decoding: the model keeps recurrent state that cannot be rolled back");
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
  /* the method's source; prompt lookup when it has none (a draft method without its model) */
  r->source = SPEC_NGRAM;
  if (gm && gm->source == SPEC_DRAFT && gm->draft) r->source = SPEC_DRAFT;
  if (gm && gm->source == SPEC_MTP) r->source = SPEC_MTP;
  if (n > 0 && !req->grammar) {
    r->kind = GEN_METHOD_SPECULATIVE;
    r->spec_tokens = r->cur = n;
  }
  sample_rng_seed(&r->rng, req->sample.seed ^ 0x5eed5bec0ffee000ull);
  int rc = 0;
  if (r->kind == GEN_METHOD_SPECULATIVE && r->source == SPEC_DRAFT) {
    r->dm = gm->draft;
    r->dcache = draft_cache;
    if (!draft_cache) {
      rc = herr_set(err, HEARTH_EINTERNAL, "speculative: a draft model without a cache for it");
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
  } else if (r->kind == GEN_METHOD_SPECULATIVE && r->source == SPEC_MTP) {
    /* The hook for multi-token-prediction heads: a proposal is the MTP
     * layer's chain over the target's last hidden state. Not loaded yet. */
    rc = herr_set(err, HEARTH_EUNSUPPORTED, "speculative decoding with multi-token-prediction heads is not supported yet");
    goto fail;
  }
  *out = r;
  return 0;
fail:
  gen_run_free(r);
  return rc;
}

gen_method_kind gen_run_kind(const gen_run *r) { return r->kind; }
spec_source gen_run_source(const gen_run *r) { return r->source; }

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
    if (r->dkv->len >= x->n_toks) kv_cache_seq_truncate(r->dkv, x->n_toks - 1); /* the last token's logits are needed */
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
      if (j + 1 < x->max) { /* it drafts on: its draft goes in next */
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

/* A proposal that was never verified (its sequence left the step before the
 * forward: preempted): the draft model forgets the rows it fed for it. */
static void abandon(gen_run *r) {
  if (r->dkv && r->dkv->len > r->n_hist) kv_cache_seq_truncate(r->dkv, r->n_hist);
  r->n_draft = 0;
}

int gen_runs_propose(gen_proposal *p, int n, float **scratch, size_t *cap, herr *err) {
  int *draft_idx = NULL, n_draft_runs = 0;
  for (int i = 0; i < n; i++) {
    gen_proposal *x = &p[i];
    gen_run *r = x->run;
    x->n = 0;
    x->draft = r->draft;
    if (r->n_draft > 0) abandon(r);
    r->n_hist = x->n_toks;
    if (r->kind != GEN_METHOD_SPECULATIVE || x->max <= 0 || x->n_toks <= 0) continue;
    if (x->max > r->cur) x->max = r->cur;
    if (r->source == SPEC_NGRAM) {
      x->n = propose_ngram(r, x->toks, x->n_toks, x->max);
    } else if (r->source == SPEC_DRAFT) {
      if (!draft_idx && !(draft_idx = malloc(sizeof(int) * (size_t)n)))
        return herr_set(err, HEARTH_ENOMEM, "draft model: out of memory");
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
  /* the draft model keeps the rows of accepted drafts only */
  if (r->dkv && r->dkv->len > r->n_hist + out->accepted) kv_cache_seq_truncate(r->dkv, r->n_hist + out->accepted);
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
  const float *q = r->q && !r->greedy && r->source == SPEC_DRAFT ? r->q + (size_t)i * (size_t)h->vocab : NULL;
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
