/* method.h — the generation methods behind one interface: how a running
 * request turns forward passes into committed tokens. The scheduler runs
 * every generation through a gen_run, so the server, the CLI and the
 * library pick a method (autoregressive, or speculative with a draft
 * source) by configuration, without knowing its insides.
 *
 * One decode step of the runs, as the scheduler drives them:
 *
 *   gen_runs_propose(props, n, &scratch, &cap, &err);
 *       // each run's tokens to verify after its pending one, toks[n_toks - 1] (0: a plain step)
 *   one forward: per run [toks[n_toks - 1], drafts...] with a logits row at each position
 *   gen_run_verify(r, smp, rows, n_rows, vocab, commit, ctx, &out, &err);
 *       // (or gen_run_verify_chosen with the ids the device chose for the rows)
 *       // commits tokens one by one as they become final (commit may end the request)
 *   truncate the KV to the committed tokens
 *   gen_run_free(r);   // releases what the run holds, also after a cancel mid-way
 *
 * Autoregressive: no proposal, verify samples the one row (or commits the
 * token the device chose).
 * Speculative: propose drafts up to N tokens from its source; verify walks
 * the rows in order: each draft is accepted or replaced (sampler_verify),
 * the first replacement ends the step, and when every draft is accepted the
 * row after the last gives one more token. Greedy output equals plain
 * decoding token for token; sampled output keeps the target model's
 * distribution (speculative sampling); logprobs are the target's.
 *
 * A run touches its own state only (a draft model's KV, its RNG): the
 * caller owns the target's KV, the sampler and the output.
 */
#ifndef HEARTH_ENGINE_METHOD_H
#define HEARTH_ENGINE_METHOD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/request.h"
#include "engine/kv_cache.h"
#include "engine/sample.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#define GEN_MAX_SPEC_TOKENS 16

/* GEN_METHOD_DENOISING: block diffusion on a DiffusionGemma model (engine/denoise.h): a run per
 * request, not a gen_run, that the scheduler steps beside its batch (one forward of its own a step)
 * and that commits each block of tokens through the same output stage when it is final */
typedef enum gen_method_kind { GEN_METHOD_AUTOREGRESSIVE = 0, GEN_METHOD_SPECULATIVE = 1, GEN_METHOD_DENOISING = 2 } gen_method_kind;

/* Where drafted tokens come from. */
typedef enum spec_source {
  SPEC_NGRAM = 0, /* prompt lookup: the continuation of the latest earlier match of the last tokens */
  SPEC_DRAFT = 1, /* a smaller model with the same vocabulary, with its own KV */
  SPEC_MTP = 2    /* the model's multi-token-prediction layer (GLM-5's, DeepSeek-V3's), with a KV
                     cache of its own: every target forward of the run gives the hidden states
                     of its tokens (gen_run_hidden); a proposal feeds the layer the positions it
                     has not seen (h_i with t_{i+1}), whose last row drafts the token after the
                     pending one, then chains the layer on its own output, one token a forward */
} spec_source;
#define SPEC_N_SOURCES 3

/* "ngram", "draft", "mtp". */
const char *spec_source_name(spec_source s);
/* Parses one of those names; HEARTH_EINVAL naming the choices otherwise. */
int spec_source_parse(const char *name, spec_source *out, herr *err);

/* The method a scheduler runs its generations with (read-only once the
 * scheduler has it; shared by every run). */
typedef struct gen_method {
  int spec_tokens;     /* drafted tokens per step for requests that do not say (0: autoregressive) */
  spec_source source;  /* what drafts them (a request asking for speculation without a configured
                          source gets prompt lookup) */
  model *draft;        /* borrowed, SPEC_DRAFT: the draft model (checked by gen_method_check_draft) */
  /* SPEC_MTP (the scheduler fills its copy of the method): the model the runs decode, whose
   * multi-token-prediction layer drafts, and the cache, in model_mtp_geometry_of's layout, where the
   * runs of one scheduler keep that layer's rows (NULL: the model cannot draft so) */
  model *target;       /* borrowed */
  kv_cache *mtp_cache; /* borrowed */
} gen_method;

/* Whether the target's cached state can be cut back to fewer tokens, which
 * rejected drafts need. Attention KV always can (truncation); a model with
 * recurrent per-sequence state (model_kv_geometry.state_dim: Qwen3.5's Gated
 * DeltaNet layers) keeps a copy of its state before the drafts
 * (kv_paged_seq_mark) and goes back to it over a rejection, the accepted
 * tokens fed again ahead of the next step's — on the CPU backend; elsewhere
 * speculation is refused on it (at load, or per request), with
 * GEN_ROLLBACK_REFUSED. */
bool gen_method_can_rollback(const model *m);
#define GEN_ROLLBACK_REFUSED \
  "speculative decoding: the model keeps recurrent state (Gated DeltaNet), which is rolled back on the CPU backend only"

/* Checks that a method can run on target: the model can roll back, SPEC_DRAFT
 * has a draft model, and SPEC_MTP a multi-token-prediction layer that runs
 * (model_mtp_check's message). */
int gen_method_check(const gen_method *gm, const model *target, herr *err);

/* The draft model must speak the target's vocabulary: the same logits width
 * and, where both have tokenizers, the same token for every id. The message
 * names the first difference. */
int gen_method_check_draft(const model *target, const tokenizer *target_tok, const model *draft,
                           const tokenizer *draft_tok, herr *err);

typedef struct gen_run gen_run;

/* A run for one request. req->spec_tokens (< 0: the method's default, 0:
 * off, else at most GEN_MAX_SPEC_TOKENS) picks speculation, req->spec_method
 * (NULL: the method's) where drafts come from — a source the method cannot
 * serve (draft without a draft model, mtp without a runnable MTP layer) is
 * refused, the error naming the field spec_method; a request with
 * a grammar runs autoregressively. gm may be NULL (autoregressive).
 * draft_cache (borrowed, with a draft model): the cache, in the draft
 * model's geometry, where the runs of one scheduler keep the draft model's
 * rows, so that they draft in shared forwards; the run takes its sequence
 * there at its first proposal. Everything but gen_run_new runs on one
 * thread (the scheduler's). */
int gen_run_new(const gen_method *gm, const gen_request *req, int64_t vocab, kv_cache *draft_cache, gen_run **out,
                herr *err);
void gen_run_free(gen_run *r);

/* SPEC_MTP: where the forward that feeds n tokens of the run from position pos writes their hidden
 * states (model_seq.next_hidden), which the run keeps until its MTP layer has seen them; NULL for a
 * run that keeps none (*err set when out of memory). A position fed again (after a preemption)
 * replaces what the run kept from there on. */
float *gen_run_hidden(gen_run *r, int64_t pos, int n, herr *err);
/* Hidden states the run keeps that its MTP layer has not seen yet (0 but for SPEC_MTP). */
int64_t gen_run_backlog(const gen_run *r);

gen_method_kind gen_run_kind(const gen_run *r);
spec_source gen_run_source(const gen_run *r);

/* Before a forward: the tokens each run wants verified after its pending
 * token (toks[n_toks - 1]), at most max (0: a plain decode step) — prompt
 * lookup's continuation, a draft model's tokens, or the MTP layer's. MTP
 * runs draft together too (one forward of the layer over the positions each
 * has not seen, then one per drafted token); an MTP run still in its prompt
 * (max 0) feeds the layer what it has without drafting. The draft-model runs
 * draft together, in shared forwards of the draft model: one in which each
 * catches up on the committed tokens it has not seen, then one per drafted
 * token over every run still drafting. scratch / cap: the caller's logits
 * buffer, grown as needed (both may be NULL when no run drafts with a
 * model). On failure no run has a proposal. */
typedef struct gen_proposal {
  gen_run *run;            /* in */
  const int32_t *toks;     /* in: the prompt and every committed token */
  int64_t n_toks;          /* in */
  int max;                 /* in: at most this many */
  int n;                   /* out: drafted */
  const int32_t *draft;    /* out: the run's drafts (valid until its next proposal) */
} gen_proposal;
int gen_runs_propose(gen_proposal *p, int n, float **scratch, size_t *cap, herr *err);
/* Keeps only the first n drafts of the last proposal (the step had no room
 * for more); with n = 0 the proposal is dropped and the step is a plain
 * one, whose token may then be committed without gen_run_verify. */
void gen_run_trim(gen_run *r, int n);

/* Commits one final token to the output: returns true when the request
 * ended there (EOS, stop string, max_tokens, the client gone, an error). */
typedef bool (*gen_commit_fn)(void *ctx, const sample_token *st);

typedef struct gen_step {
  int drafted;    /* tokens the last propose gave */
  int accepted;   /* of those, kept */
  int committed;  /* tokens committed this step (accepted + the one after, unless it ended) */
  bool ended;     /* commit said the request ended */
} gen_step;

/* After the forward: rows holds n_rows logits rows (vocab floats each, used
 * as scratch), row i the logits after the pending token and i drafts:
 * 1 + the last proposal's count, or 1 when the proposal was not fed (its
 * sequence was preempted before the forward; the proposal is dropped). Commits tokens through commit; sampler_accept is the
 * commit's business. Once commit reports the end, verify returns at once
 * without touching the run again (the commit may free it). */
int gen_run_verify(gen_run *r, sampler *smp, float *rows, int n_rows, int64_t vocab, gen_commit_fn commit, void *ctx,
                   gen_step *out, herr *err);
/* The same for a plain greedy request (sampler_is_plain_greedy) whose rows'
 * tokens were chosen already, on the device: chosen[i] is row i's argmax
 * (with its logprobs); a draft is kept when it is its row's token. */
int gen_run_verify_chosen(gen_run *r, const sample_token *chosen, int n_rows, gen_commit_fn commit, void *ctx,
                          gen_step *out, herr *err);

#endif
