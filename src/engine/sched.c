/* sched.c — the continuous-batching scheduler (see sched.h): the engine
 * thread, the waiting queue and running set, admission against the KV pool,
 * and each step in three parts, as vLLM v1's schedule() → SchedulerOutput →
 * update_from_output():
 *   plan     (sched_plan → a sched_step): cancellations, admission, drafts,
 *            the batch — decode rows, prefill chunks, preemption by
 *            recompute — and each logits row's sampling on a device;
 *   run      (sched_execute): the step's one forward;
 *   commit   (sched_commit): drafts verified, blocks published, probes'
 *            outputs gathered, tokens sampled;
 * and the output stage each committed token goes through: the grammar,
 * emission (EOS, detokenizer, stop strings, max_tokens: emit.h) and the
 * queue to the request's waiter; with the spans they leave in a trace
 * (base/trace.h) when one is given.
 * How a generation turns a step's logits into tokens is its method's
 * (engine/method.h): a speculative run's drafts join the batch as a chunk
 * after its pending token, and the KV rows of rejected drafts are cut off
 * after verification (a hybrid model's recurrent state goes back to its
 * mark before the drafts, and the accepted tokens go in again ahead of the
 * next step's pending one); a run drafting with the model's MTP layer gets
 * the hidden states of every token it feeds (model_seq.next_hidden), and its
 * layer sees them in the next step's proposals, in the prompt too. On a
 * block-diffusion model every generation is a denoising run (engine/denoise.h,
 * GEN_METHOD_DENOISING), stepped once per engine step beside the batch, with
 * a forward and a KV cache of its own; its final blocks go through the same
 * output stage.
 * Knows the model only through model.h and the cache only through
 * kv_paged.h; knows nothing of HTTP or the public API. */
#include "engine/sched.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/vec.h"
#include "engine/emit.h"
#include "structured/grammar.h"
#include "engine/kv_cache.h"
#include "engine/kv_disk.h"
#include "engine/kv_paged.h"

typedef struct dentry {
  sample_token st;
  bool has_tok;               /* false: the held-back tail at the end */
  size_t off, len;            /* its text in dtext */
} dentry;

typedef struct sseq {
  /* the request (borrowed from sched_run's caller, who waits) */
  const gen_request *req;
  gen_token_fn fn;
  void *user;
  gen_result *res;
  herr *err;
  int rc;
  int64_t max_new;
  int kind;                   /* 0: a generation; else a sched_probe_kind (prefill only, no sampler) */
  float *dest;                /* borrowed: a probe's output */
  int pool;                   /* an embedding probe: its sched_pool */
  sample_token *plp;          /* borrowed: a prompt-logprobs probe's output, one per prompt token */
  int plp_top;
  float *hrow;                /* owned [vocab], made at first use: on a device, the logits row of a
                                 request whose sampler runs on the host only (MODEL_OUT_LOGITS_HOST) */
  /* state */
  int32_t *toks;              /* owned: prompt then sampled tokens */
  int64_t n_toks, cap_toks;
  int32_t *keys;              /* owned, NULL unless the prompt has media: toks as the prefix cache keys them */
  int64_t cap_keys;
  kv_seq *kv;                 /* owned while running, NULL while waiting */
  sampler *smp;               /* owned */
  grammar *gram;              /* owned, NULL without a grammar */
  grammar_matcher *gm;        /* owned, with gram: what the output may be next */
  bool closing;               /* the token budget ran short: the grammar is being closed */
  int mask_rc;                /* device sampling, this step: 0, -1 (the grammar is complete) or an error */
  gen_emit out;               /* owned: detokenizer, stop matcher, the step's text */
  /* delivery: the engine queues each token with its text; the waiter (sched_run's caller) takes them
   * and calls fn, so the callbacks of many requests run on their own threads, not in the step */
  pthread_mutex_t dmu;        /* guards the queue, dtext, dclosed */
  pthread_cond_t dcv;
  struct dentry *dq;          /* owned: queued tokens */
  size_t n_dq, cap_dq;
  hbuf dtext;                 /* their text, one after another */
  bool dclosed;               /* finished: nothing more will be queued */
  atomic_int stop_req;        /* fn returned nonzero: the engine cancels at its next step */
  gen_run *run;               /* owned (generations): the method run; released when the sequence ends */
  gen_method_kind method;     /* a generation's method: GEN_METHOD_DENOISING (a block-diffusion model's) runs
                                 dn beside the batch; the others run `run` in it */
  denoise_run *dn;            /* owned, a block-diffusion model's generation (from its admission): its run,
                                 stepped beside the batch; released when the sequence ends */
  kv_cache *dcache;           /* owned with dn: the run's one-off KV cache */
  kv_seq *dkv;                /* owned with dn: its rows there */
  int n_draft;                /* this step: drafted tokens fed after the pending one */
  int n_catch;                /* this step, with drafts: committed tokens fed before the pending one (a
                                 hybrid model's accepted tokens, fed again after a rejection) */
  int32_t feed[1 + 2 * GEN_MAX_SPEC_TOKENS]; /* this step's tokens when it has drafts */
  bool admitted_once;
  bool ended;                 /* finished: the engine no longer touches it */
  bool done;                  /* the waiter may return (under the lock) */
  double t_admit, t_first;
  double t_enqueue;           /* joined the waiting queue first (now_seconds) */
  int preemptions;
  /* tracing (only with sched.trace) */
  int64_t trace_tid;          /* the request's track; 0: not traced */
  double t_start;             /* sched_run was called */
  double t_queued;            /* joined the waiting queue; 0 while not waiting */
  struct sseq *next;          /* waiting queue link */
} sseq;

/* The prefix cache's keys of q's tokens. */
static const int32_t *keys_of(const sseq *q) { return q->keys ? q->keys : q->toks; }

struct sched {
  model *m;                   /* borrowed */
  const tokenizer *tok;       /* borrowed, may be NULL */
  int64_t vocab;
  int max_batch, chunk, step_tokens;
  int64_t ctx;                /* context length: probes longer than this are refused */
  size_t memory_budget;
  size_t block_bytes;
  kv_pool *pool;              /* owned; touched only by the engine thread */
  kv_disk *store;             /* owned, may be NULL: the prefix cache on disk (its hooks run on the engine thread) */
  float *logits;              /* owned [cap_rows * vocab] (host sampling; on a device, made for
                                 speculative steps) */
  size_t cap_rows;
  const gen_method *method;   /* &method_own */
  gen_method method_own;      /* the configured method (or none), with the target and its MTP layer's cache */
  kv_cache *mtp_cache;        /* owned, when the model's multi-token-prediction layer can draft: its rows
                                 for every request (one pool, so that the requests draft in shared forwards) */
  gen_proposal *props;        /* owned [max_batch]: the step's speculative proposals */
  sseq **prop_seqs;           /* owned [max_batch]: whose */
  float *draft_rows;          /* owned, grown: a draft model's logits rows */
  kv_cache *draft_cache;      /* owned, with a draft model: its rows for every request (one pool, so
                                 that the requests draft in shared forwards) */
  size_t cap_draft_rows;
  bool dev_sample;            /* sample on the model's device (bk_sample): only ids come back */
  bool recurrent;             /* the model has recurrent layers: prefill chunks stop at block ends */
  bk_sample_row *rows;        /* owned [cap_dev_rows] (device sampling) */
  bk_sample_out *outs;        /* owned [cap_dev_rows] */
  size_t cap_dev_rows;        /* rows and outs hold this many (max_batch, more for speculative rows) */
  bk_sample_adj *adj;         /* owned, grown: the step's penalty and bias entries */
  size_t n_adj, cap_adj;
  uint64_t *masks;            /* owned [max_batch * ceil(vocab / 64)], made on the first grammar step on a device */
  float *hrows;               /* owned [step_tokens * hidden], made for the first pooled embedding: a step's hidden rows */
  sseq **running;             /* owned array [max_batch]; the sequences are their waiters' */
  int n_running;
  model_seq *batch;           /* owned [max_batch] */
  int64_t *media_pos;         /* owned [step_tokens]: positions of tokens after a prompt with multimodal RoPE */
  sseq **in_batch;            /* owned [max_batch] */
  pthread_t thread;
  bool thread_started;
  pthread_mutex_t mu;         /* guards the waiting queue, done flags, stats, stop */
  pthread_cond_t work_cv, done_cv;
  sseq *wait_head, *wait_tail;
  int64_t n_waiting;
  bool stop;
  sched_stats st;
  pthread_mutex_t gv_mu;      /* guards making gv */
  grammar_vocab *gv;          /* owned, made on the first grammar request: the tokens' bytes */
  htrace *trace;              /* borrowed, may be NULL */
  bool diffusion;             /* a block-diffusion model: every generation is a denoising run */
  denoise_params denoise;     /* their settings */
  sseq **denoising;           /* owned [max_batch]: the admitted denoising runs (n_running + n_denoising
                                 <= max_batch) */
  int n_denoising;
  void (*step_hook)(void *);  /* sched_config's */
  void *step_hook_user;
  int64_t trace_requests;     /* requests traced so far (atomic): their tracks' numbers */
};

/* The engine's track in a trace; request N's track is TRACE_ENGINE + N, the
 * track of its callbacks (on its own thread) TRACE_DELIVER + N. */
#define TRACE_ENGINE 1
#define TRACE_DELIVER ((int64_t)1 << 32)

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- trace spans (only with s->trace) ---- */

/* A request joins the queue: its own track, named by its label or number. */
static void trace_queued(sched *s, sseq *q) {
  int64_t n = __atomic_add_fetch(&s->trace_requests, 1, __ATOMIC_RELAXED);
  q->trace_tid = TRACE_ENGINE + n;
  char name[160];
  if (q->req->trace_label && q->req->trace_label[0]) snprintf(name, sizeof name, "req %s", q->req->trace_label);
  else snprintf(name, sizeof name, "req %lld", (long long)n);
  htrace_track(s->trace, q->trace_tid, name, q->trace_tid);
  /* the callbacks run on the request's own thread: a track of their own beside it */
  if (q->fn) {
    char dname[172];
    snprintf(dname, sizeof dname, "deliver: %s", name);
    htrace_track(s->trace, TRACE_DELIVER + n, dname, q->trace_tid);
  }
  q->t_queued = htrace_now();
}

/* The wait in the queue ends at `until`. */
static void trace_queue_span(sched *s, sseq *q, double until) {
  if (q->t_queued <= 0) return;
  htrace_complete(s->trace, q->trace_tid, "queue", "request", q->t_queued, until - q->t_queued,
                  (htrace_arg[]){HTRACE_INT("preemptions", q->preemptions)}, 1);
  q->t_queued = 0;
}

static const char *finish_name(const sseq *q) {
  if (q->res->finish == GEN_FINISH_CANCELLED) return "cancelled";
  if (q->rc) return "error";
  return q->res->finish == GEN_FINISH_LENGTH ? "length" : "stop";
}

/* The whole request, from sched_run to its end (after every span inside it). */
static void trace_request_span(sched *s, sseq *q) {
  double t = htrace_now();
  trace_queue_span(s, q, t);
  htrace_arg args[] = {HTRACE_INT("prompt_tokens", q->res->prompt_tokens),
                       HTRACE_INT("completion_tokens", q->res->completion_tokens),
                       HTRACE_INT("cached_tokens", q->res->cached_tokens), HTRACE_STR("finish", finish_name(q)),
                       HTRACE_INT("preemptions", q->preemptions), HTRACE_STR("error", q->err->msg)};
  int n = q->rc && q->res->finish != GEN_FINISH_CANCELLED ? 6 : 5;
  htrace_complete(s->trace, q->trace_tid, "request", "request", q->t_start, t - q->t_start, args, n);
}

/* ---- waiting queue (under mu) ---- */

/* The queue is ordered by priority (gen_request.priority, smaller first):
 * a new request joins behind the last one of its priority or a smaller one,
 * a preempted one (queue_push_front) in front of the first of its own. */
static void queue_insert_after(sched *s, sseq *prev, sseq *q) {
  q->next = prev ? prev->next : s->wait_head;
  if (prev) prev->next = q;
  else s->wait_head = q;
  if (!q->next) s->wait_tail = q;
  s->n_waiting++;
}

static void queue_push_back(sched *s, sseq *q) {
  sseq *prev = NULL;
  for (sseq *p = s->wait_head; p && p->req->priority <= q->req->priority; p = p->next) prev = p;
  queue_insert_after(s, prev, q);
}

static void queue_push_front(sched *s, sseq *q) {
  sseq *prev = NULL;
  for (sseq *p = s->wait_head; p && p->req->priority < q->req->priority; p = p->next) prev = p;
  queue_insert_after(s, prev, q);
}

static sseq *queue_pop(sched *s) {
  sseq *q = s->wait_head;
  if (!q) return NULL;
  s->wait_head = q->next;
  if (!s->wait_head) s->wait_tail = NULL;
  q->next = NULL;
  s->n_waiting--;
  return q;
}

/* ---- one sequence ---- */

/* The prefix cache's key for the sequence's adapters (0: the base model). */
static uint64_t adapter_of(const sseq *q) { return model_lora_set_id(q->req->lora, q->req->n_lora); }

static bool seq_cancelled(const sseq *q) {
  return (q->req->cancel && *q->req->cancel) || (q->fn && atomic_load_explicit(&((sseq *)q)->stop_req, memory_order_relaxed));
}

/* Copies the engine-side counts into the stats (engine thread, under mu). */
static void publish_counts(sched *s) {
  kv_pool_counts c;
  kv_pool_count(s->pool, &c);
  s->st.blocks_total = c.total;
  s->st.blocks_used = c.used;
  s->st.blocks_cached = c.cached;
  s->st.blocks_free = c.free;
  int64_t running = 0;
  for (int i = 0; i < s->n_running; i++) running += !s->running[i]->ended;
  for (int i = 0; i < s->n_denoising; i++) running += !s->denoising[i]->ended;
  s->st.running = running;
}

/* Ends q (engine thread): frees its blocks, tells its waiter. */
static void seq_finish(sched *s, sseq *q, int rc) {
  if (q->trace_tid && !q->fn) { /* (a generation's span is written by its waiter, once delivered) */
    q->rc = rc;
    trace_request_span(s, q);
  }
  double t = now_seconds();
  if (q->kv) {
    kv_paged_seq_free(q->kv);
    q->kv = NULL;
  }
  gen_run_free(q->run);
  q->run = NULL;
  denoise_run_free(q->dn);
  q->dn = NULL;
  if (q->dkv) kv_cache_seq_free(q->dkv);
  q->dkv = NULL;
  kv_cache_free(q->dcache);
  q->dcache = NULL;
  q->rc = rc;
  if (q->t_first > 0) {
    q->res->prefill_seconds = q->t_first - q->t_admit;
    q->res->decode_seconds = t - q->t_first;
  }
  q->ended = true;
  if (q->fn) {
    pthread_mutex_lock(&q->dmu);
    q->dclosed = true;
    pthread_cond_signal(&q->dcv);
    pthread_mutex_unlock(&q->dmu);
  }
  pthread_mutex_lock(&s->mu);
  publish_counts(s);
  if (q->res->finish == GEN_FINISH_CANCELLED) s->st.requests_cancelled++;
  else if (rc == 0) s->st.requests_finished++;
  q->done = true;
  pthread_cond_broadcast(&s->done_cv);
  pthread_mutex_unlock(&s->mu);
}

static void seq_cancel(sched *s, sseq *q, const char *when) {
  q->res->finish = GEN_FINISH_CANCELLED;
  herr_set(q->err, HEARTH_ECANCELLED, "generate: cancelled %s", when);
  seq_finish(s, q, HEARTH_ECANCELLED);
}

static void running_remove(sched *s, int i) {
  memmove(&s->running[i], &s->running[i + 1], sizeof(sseq *) * (size_t)(s->n_running - i - 1));
  s->n_running--;
}

/* Takes q out of the running set (when it is there). */
static void running_drop(sched *s, const sseq *q) {
  for (int i = 0; i < s->n_running; i++)
    if (s->running[i] == q) {
      running_remove(s, i);
      return;
    }
}

static void denoising_remove(sched *s, int i) {
  memmove(&s->denoising[i], &s->denoising[i + 1], sizeof(sseq *) * (size_t)(s->n_denoising - i - 1));
  s->n_denoising--;
}

/* ---- the output stage: grammar, emission (EOS, detokenizing, stop strings,
 * max_tokens: engine/emit.h) and delivery to the waiter ----
 *
 * Every committed token of a generation goes through out_commit; a sequence
 * that ends here is finished (seq_finish) before the call returns. */

/* Queues a token (tok NULL: the held-back tail) and its text for q's waiter
 * (engine thread). False when out of memory. */
static bool seq_queue(sseq *q, const char *text, size_t len, const sample_token *tok) {
  pthread_mutex_lock(&q->dmu);
  bool ok = q->n_dq < q->cap_dq || HGROW(q->dq, q->cap_dq, q->n_dq + 1);
  if (ok) {
    q->dq[q->n_dq++] = (dentry){.st = tok ? *tok : (sample_token){0}, .has_tok = tok != NULL, .off = q->dtext.len, .len = len};
    if (len) hbuf_append(&q->dtext, text, len);
    ok = !q->dtext.oom;
  }
  pthread_cond_signal(&q->dcv);
  pthread_mutex_unlock(&q->dmu);
  return ok;
}

/* The held-back tail at the end of a run, queued for the waiter. */
static int out_flush(sched *s, sseq *q) {
  double t0 = q->trace_tid ? htrace_now() : 0;
  int rc = gen_emit_flush(&q->out, q->res, q->err);
  if (q->trace_tid)
    htrace_complete(s->trace, q->trace_tid, "detokenize", "request", t0, htrace_now() - t0,
                    (htrace_arg[]){HTRACE_INT("flush", 1), HTRACE_INT("bytes", q->out.delta.len)}, 2);
  if (!rc && q->out.delta.len && q->fn && !seq_queue(q, hbuf_str(&q->out.delta), q->out.delta.len, NULL))
    rc = herr_set(q->err, HEARTH_ENOMEM, "generate: out of memory for the output");
  return rc;
}

/* q ends without a token (its grammar): rc > 0 an error, else the grammar is
 * complete and nothing may follow. */
static void out_end(sched *s, sseq *q, int rc) {
  if (rc > 0) seq_finish(s, q, rc);
  else seq_finish(s, q, out_flush(s, q));
}

/* Emits q's next token st (sampled on the host or the device): the text,
 * the stop conditions, the token history. Returns true when q ended (and
 * was finished). */
static bool out_token(sched *s, sseq *q, sample_token st) {
  if (q->t_first == 0) q->t_first = now_seconds();
  if (q->smp) sampler_accept(q->smp, st.id); /* (a denoising run samples on its own) */
  pthread_mutex_lock(&s->mu);
  s->st.generated_tokens++;
  pthread_mutex_unlock(&s->mu);
  bool ended = false;
  double t0 = q->trace_tid ? htrace_now() : 0;
  int rc = gen_emit_token(&q->out, q->req, st.id, q->max_new, q->res, &ended, q->err);
  if (q->trace_tid)
    htrace_complete(s->trace, q->trace_tid, "detokenize", "request", t0, htrace_now() - t0,
                    (htrace_arg[]){HTRACE_INT("token", st.id), HTRACE_INT("bytes", q->out.delta.len)}, 2);
  if (rc) {
    seq_finish(s, q, rc);
    return true;
  }
  if (q->fn && !seq_queue(q, hbuf_str(&q->out.delta), q->out.delta.len, &st)) {
    seq_finish(s, q, herr_set(q->err, HEARTH_ENOMEM, "generate: out of memory for the output"));
    return true;
  }
  if (ended) {
    if (q->closing && q->res->finish == GEN_FINISH_STOP) q->res->finish = GEN_FINISH_LENGTH;
    seq_finish(s, q, out_flush(s, q));
    return true;
  }
  if (q->n_toks == q->cap_toks && !HGROW(q->toks, q->cap_toks, q->n_toks + 1)) {
    seq_finish(s, q, herr_set(q->err, HEARTH_ENOMEM, "generate: out of memory for the token history"));
    return true;
  }
  if (q->keys) {
    if (q->n_toks == q->cap_keys && !HGROW(q->keys, q->cap_keys, q->n_toks + 1)) {
      seq_finish(s, q, herr_set(q->err, HEARTH_ENOMEM, "generate: out of memory for the token history"));
      return true;
    }
    q->keys[q->n_toks] = st.id;
  }
  q->toks[q->n_toks++] = st.id;
  return false;
}

/* Commits one token of q's run (a gen_commit_fn): the grammar, then the
 * output. True when q ended. */
typedef struct out_ctx {
  sched *s;
  sseq *q;
  bool ended;                 /* set: q ended (and was finished: it may be gone) */
} out_ctx;

static bool out_commit(void *ctx, const sample_token *st) {
  out_ctx *c = ctx;
  int rc;
  if (c->q->gm && (rc = grammar_matcher_accept(c->q->gm, st->id, c->q->err))) {
    seq_finish(c->s, c->q, rc);
    return c->ended = true;
  }
  return c->ended = out_token(c->s, c->q, *st);
}

/* The tokens q's grammar allows next (a bitset over the grammar's vocabulary).
 * Returns 0, an error code (set in q->err), or -1 when no token may follow. */
static int out_allowed(sseq *q, const uint64_t **mask) {
  int32_t n_allowed = 0;
  /* tokens that would leave too few to finish the structure are left out; once
   * the tokens left are as few as the characters still needed (plus the end
   * token), the output is being closed early: it ends complete, reported as cut
   * by length */
  int64_t left = q->max_new - q->res->completion_tokens;
  if (!q->closing && left <= (int64_t)grammar_matcher_distance(q->gm) + 1) q->closing = true;
  int rc = grammar_matcher_mask_budget(q->gm, left, mask, &n_allowed, q->err);
  if (rc) return rc;
  return n_allowed == 0 ? -1 : 0;
}

/* Masks q's logits row with its grammar (host sampling): disallowed tokens get
 * -inf. Returns as out_allowed. */
static int out_mask(sched *s, sseq *q, float *row) {
  const uint64_t *mask;
  int rc = out_allowed(q, &mask);
  if (rc) return rc;
  int32_t nv = grammar_vocab_size(s->gv);
  for (int64_t i = 0; i < s->vocab; i++)
    if (i >= nv || !(mask[i >> 6] >> (i & 63) & 1)) row[i] = -INFINITY;
  return 0;
}

/* The mask of device row `row` for q's grammar, into the step's mask slot
 * `slot` (the device sampler applies it). Returns as out_allowed. */
static int out_mask_row(sched *s, sseq *q, bk_sample_row *row, int slot) {
  int32_t words = (int32_t)((s->vocab + 63) / 64);
  if (!s->masks) {
    s->masks = malloc(sizeof(uint64_t) * (size_t)words * (size_t)s->max_batch);
    if (!s->masks) return herr_set(q->err, HEARTH_ENOMEM, "scheduler: out of memory for the grammar masks of a batch");
  }
  const uint64_t *mask;
  int rc = out_allowed(q, &mask);
  if (rc) return rc;
  int32_t nv = grammar_vocab_size(s->gv), nw = (nv + 63) / 64;
  uint64_t *dst = s->masks + (size_t)slot * (size_t)words;
  for (int32_t w = 0; w < words; w++) dst[w] = w < nw ? mask[w] : 0;
  if (nv % 64 && nw <= words) dst[nw - 1] &= ~0ull >> (64 - nv % 64); /* ids past the grammar's vocabulary */
  row->mask = dst;
  row->mask_words = words;
  return 0;
}

/* ---- media in prompts ---- */

/* A prefill chunk of n tokens from q's current length, shortened so that it
 * neither crosses from the prompt into generated tokens (recomputed after a
 * preemption: they have no media rows or positions of their own) nor ends
 * inside a bidirectional span, which one forward must hold whole (a span
 * longer than the chunk is taken whole). */
static int64_t media_chunk(const sseq *q, int64_t n) {
  const gen_request *r = q->req;
  if (!r->embeds && !r->positions3) return n;
  int64_t at = q->kv->len, np = (int64_t)r->n_prompt;
  if (at < np && at + n > np) n = np - at;
  if (!r->bidir_last || at >= np || n <= 0) return n;
  int64_t end = at + n - 1, last = r->bidir_last[end];
  if (last <= end) return n;
  int64_t start = end;
  while (start > at && r->bidir_last[start - 1] == last) start--;
  return start > at ? start - at : last + 1 - at;
}

/* Fills sq's media fields for q's rows [at, at + n); off: where its rows start in the step. */
static void media_rows(sched *s, const sseq *q, model_seq *sq, int64_t at, int64_t n, int64_t off) {
  const gen_request *r = q->req;
  int64_t np = (int64_t)r->n_prompt;
  if (!r->embeds && !r->positions3) return;
  if (at < np) {
    if (r->embeds) sq->embeds = r->embeds + at;
    if (r->bidir_last) sq->bidir_last = r->bidir_last + at;
    if (r->positions3) sq->positions3 = r->positions3 + 3 * at;
  } else if (r->positions3) { /* after the prompt: row + delta on every axis */
    int64_t *p = s->media_pos + off;
    for (int64_t i = 0; i < n; i++) p[i] = at + i + r->pos_delta;
    sq->positions = p;
  }
}


/* ---- plan: which sequences feed which tokens this step, and how each row is sampled ---- */

/* Frees the blocks of running[i] and puts it back at the front of the queue:
 * it is recomputed (mostly from the prefix cache) when there is room again. */
static void preempt(sched *s, int i) {
  sseq *q = s->running[i];
  kv_paged_seq_publish(q->kv, keys_of(q), q->kv->len, adapter_of(q));
  kv_paged_seq_free(q->kv);
  q->kv = NULL;
  running_remove(s, i);
  q->preemptions++;
  if (q->trace_tid) {
    q->t_queued = htrace_now();
    htrace_instant(s->trace, q->trace_tid, "preempted", "request", q->t_queued,
                   (htrace_arg[]){HTRACE_INT("computed_tokens", q->n_toks)}, 1);
  }
  pthread_mutex_lock(&s->mu);
  queue_push_front(s, q);
  s->st.preemptions++;
  pthread_mutex_unlock(&s->mu);
}

/* Admits the waiting head q, a denoising run: its one-off KV cache (nothing
 * from the pool: no prefix cache, never preempted) and its run; failing to
 * make them ends it with the error. */
static void admit_denoise(sched *s, sseq *q) {
  double t_look = q->trace_tid ? htrace_now() : 0;
  pthread_mutex_lock(&s->mu);
  queue_pop(s);
  s->st.prompt_tokens += q->n_toks;
  pthread_mutex_unlock(&s->mu);
  q->t_admit = now_seconds();
  q->res->queue_seconds = q->t_admit - q->t_enqueue;
  q->admitted_once = true;
  if (q->trace_tid) trace_queue_span(s, q, t_look);
  model_kv_geometry g;
  model_kv_geometry_of(s->m, &g);
  int rc = kv_cache_new(&g, denoise_kv_rows(s->m, q->n_toks, q->max_new), &q->dcache, q->err);
  if (!rc) rc = kv_cache_seq_new(q->dcache, &q->dkv, q->err);
  if (!rc) rc = denoise_run_new(s->m, q->req, &s->denoise, NULL, q->dkv, q->max_new, &q->dn, q->err);
  if (rc) seq_finish(s, q, rc);
  else s->denoising[s->n_denoising++] = q;
}

/* Moves waiting requests to running while there is a slot and room for
 * their first chunk; drops cancelled ones. */
static void admit(sched *s) {
  /* cancelled requests leave the queue from wherever they are */
  sseq *gone = NULL;
  pthread_mutex_lock(&s->mu);
  for (sseq **at = &s->wait_head, *prev = NULL; *at;) {
    sseq *q = *at;
    if (seq_cancelled(q)) {
      *at = q->next;
      if (s->wait_tail == q) s->wait_tail = prev;
      s->n_waiting--;
      q->next = gone;
      gone = q;
    } else {
      prev = q;
      at = &q->next;
    }
  }
  pthread_mutex_unlock(&s->mu);
  while (gone) {
    sseq *q = gone;
    gone = q->next;
    q->next = NULL;
    seq_cancel(s, q, "while waiting");
  }
  for (;;) {
    pthread_mutex_lock(&s->mu);
    sseq *q = s->wait_head;
    if (!q || s->n_running + s->n_denoising >= s->max_batch) {
      pthread_mutex_unlock(&s->mu);
      return;
    }
    pthread_mutex_unlock(&s->mu);
    if (!q->kind && q->method == GEN_METHOD_DENOISING) {
      admit_denoise(s, q);
      continue;
    }
    herr e = {0};
    kv_seq *kv = NULL;
    double t_look = q->trace_tid ? htrace_now() : 0;
    if (kv_paged_seq_new(s->pool, q->n_toks + q->max_new, &kv, &e)) return; /* out of memory: try next step */
    /* a pooled embedding needs every token's hidden state, prompt logprobs every token's logits: none
     * from the cache */
    bool whole = q->pool || q->kind == SCHED_PROMPT_LOGPROBS;
    int64_t hit = whole ? 0 : kv_paged_seq_attach_prefix(kv, keys_of(q), q->n_toks, adapter_of(q));
    int64_t first = q->n_toks - hit < s->chunk ? q->n_toks - hit : s->chunk;
    if (kv_paged_seq_blocks_for(kv, hit + first) > kv_pool_available(s->pool)) {
      kv_paged_seq_free(kv);
      return; /* waits until blocks come back */
    }
    pthread_mutex_lock(&s->mu);
    queue_pop(s);
    if (!q->admitted_once) {
      q->res->cached_tokens = hit;
      s->st.prefix_hit_tokens += hit;
      s->st.prefix_miss_tokens += q->n_toks - hit;
    }
    pthread_mutex_unlock(&s->mu);
    if (!q->admitted_once) {
      q->t_admit = now_seconds();
      q->res->queue_seconds = q->t_admit - q->t_enqueue;
    }
    q->admitted_once = true;
    q->kv = kv;
    if (q->pool) { /* (again after a preemption: the whole prompt is computed again) */
      int64_t D = model_cfg(s->m)->hidden_size;
      for (int64_t d = 0; d < D; d++) q->dest[d] = q->pool == SCHED_POOL_MAX ? -INFINITY : 0.0f;
    }
    if (q->trace_tid) {
      trace_queue_span(s, q, t_look);
      htrace_complete(s->trace, q->trace_tid, "cache lookup", "request", t_look, htrace_now() - t_look,
                      (htrace_arg[]){HTRACE_INT("hit_tokens", hit), HTRACE_INT("miss_tokens", q->n_toks - hit)}, 2);
    }
    s->running[s->n_running++] = q;
  }
}

/* The speculative sequences about to decode propose their drafts, together
 * (a draft model drafts for all of them in shared forwards): q->n_draft and
 * q->feed. The rest get no drafts this step. */
static void propose(sched *s) {
  int n = 0;
  for (int i = 0; i < s->n_running; i++) {
    sseq *q = s->running[i];
    q->n_draft = q->n_catch = 0;
    if (q->kind || !q->run || gen_run_kind(q->run) != GEN_METHOD_SPECULATIVE) continue;
    /* recurrent layers, rewound over a rejection: the accepted tokens go in again, drafts after them */
    int64_t gap = q->n_toks - q->kv->len;
    bool catch_up = gap > 1 && gap <= GEN_MAX_SPEC_TOKENS + 1 && s->recurrent &&
                    q->kv->len >= (int64_t)q->req->n_prompt && gen_run_source(q->run) != SPEC_MTP;
    if (gap != 1 && !catch_up) { /* in its prompt: an MTP layer sees the hidden states it has so far */
      if (gen_run_backlog(q->run) > 0) {
        s->props[n] = (gen_proposal){.run = q->run, .toks = q->toks, .n_toks = q->n_toks, .max = 0};
        s->prop_seqs[n++] = q;
      }
      continue;
    }
    /* no more than the output can still take after the pending token's successor */
    int64_t room = q->max_new - q->res->completion_tokens - 1;
    if (room <= 0) continue;
    s->props[n] = (gen_proposal){.run = q->run, .toks = q->toks, .n_toks = q->n_toks,
                                 .max = room < GEN_MAX_SPEC_TOKENS ? (int)room : GEN_MAX_SPEC_TOKENS};
    s->prop_seqs[n++] = q;
  }
  if (n == 0) return;
  herr e = {0};
  int rc = gen_runs_propose(s->props, n, &s->draft_rows, &s->cap_draft_rows, &e);
  for (int k = 0; k < n; k++) {
    sseq *q = s->prop_seqs[k];
    if (rc) { /* the draft model failed: its requests end with the error */
      running_drop(s, q);
      *q->err = e;
      seq_finish(s, q, rc);
      continue;
    }
    q->n_draft = s->props[k].n;
    if (q->n_draft > 0) {
      q->n_catch = (int)(q->n_toks - 1 - q->kv->len);
      memcpy(q->feed, q->toks + q->kv->len, sizeof(int32_t) * (size_t)(q->n_catch + 1));
      memcpy(q->feed + q->n_catch + 1, s->props[k].draft, sizeof(int32_t) * (size_t)q->n_draft);
    }
  }
}


/* A step as planned: the sequences it feeds and how many tokens each, what
 * the forward gives back for them, and, on a device, how each logits row is
 * sampled. sched_plan makes it, sched_execute runs its forward, sched_commit
 * applies what came back. The arrays are the scheduler's (one step at a time). */
typedef struct sched_step {
  model_seq *seqs;            /* borrowed (s->batch) [n_seqs]: the forward's sequences */
  sseq **owners;              /* borrowed (s->in_batch) [n_seqs]: whose each one is */
  int n_seqs;
  int64_t tokens;             /* tokens fed, at most step_tokens */
  int64_t prompt_tokens;      /* of them, prompt tokens */
  bool host;                  /* the logits rows come to the host (s->logits) and are sampled there;
                                 else the device samples them (rows) and only ids come back (s->outs) */
  size_t n_rows;              /* logits rows */
  bk_sample_row *rows;        /* borrowed (s->rows), !host: a sampling row per logits row */
  const bk_sample_adj *adj;   /* borrowed (s->adj), !host: their penalty and bias entries */
  int64_t n_adj;
  double t_plan;              /* planning began (the step's busy time) */
  double t_step;              /* the step began (its trace span) */
  double t_fwd, t_fwd_end;    /* the forward ran (trace spans) */
} sched_step;

/* The running sequences' share of the step: decode rows first, then drafts
 * and prompt chunks in what the step's budget leaves, preempting the newest
 * sequences when the pool has no room, and what each sequence's forward
 * gives back. */
static void plan_batch(sched *s, sched_step *p) {
  int n_batch = 0;
  int64_t budget = s->step_tokens, prompt_fed = 0;
  /* decode rows first: a prompt's chunk takes only what the step's budget leaves after one row for
   * every sequence that decodes (as vLLM's max_num_batched_tokens), so long prompts never starve them */
  int64_t decode_left = 0;
  for (int i = 0; i < s->n_running; i++)
    decode_left += s->running[i]->n_toks - s->running[i]->kv->len <= 1 || s->running[i]->n_draft > 0;
  for (int i = 0; i < s->n_running; i++) {
    sseq *q = s->running[i];
    int64_t n = q->n_toks - q->kv->len;
    if (n <= 1 || q->n_draft > 0) decode_left--;
    if (q->n_draft > 0) { /* its drafts, as many as the step's budget leaves room for */
      int64_t keep = q->n_draft < budget - n ? q->n_draft : budget - n;
      herr me = {0};
      if (s->recurrent && keep > 0 && (kv_paged_seq_keep(q->kv, (int)(n + keep), &me) || q->kv->n_keep == 0)) {
        /* recurrent layers keep the state after each fed token (kv_paged_seq_keep): a rejection installs
         * the last accepted one's, and a block's end inside the drafts gets its snapshot from there. Without
         * those rows, the drafts stop at a block's end (whose snapshot then needs the sequence to end there)
         * and the state before them is kept (a mark), to go back to over a rejection */
        if (me.code) HLOG_WARN("%s (this step keeps the state before its drafts alone)", me.msg);
        int64_t B = kv_pool_block_tokens(s->pool), end = (q->kv->len / B + 1) * B;
        if (q->kv->len + n + keep > end) keep = end - q->kv->len - n;
        me = (herr){0};
        if (keep > 0 && kv_paged_seq_mark(q->kv, &me)) {
          HLOG_WARN("%s (this step decodes without drafts)", me.msg);
          keep = 0;
        }
      }
      if (keep < q->n_draft) {
        q->n_draft = keep > 0 ? (int)keep : 0;
        gen_run_trim(q->run, q->n_draft);
      }
      if (q->n_draft == 0) q->n_catch = 0;
    }
    if (q->n_draft > 0) {
      n += q->n_draft;
    } else if (n > 1) {
      int chunk = q->req->prefill_chunk > 0 && q->req->prefill_chunk < s->chunk ? q->req->prefill_chunk : s->chunk;
      if (n > chunk) n = chunk;
      if (n > budget - decode_left) n = budget - decode_left;
      /* recurrent layers: a chunk stops at a block's end, where the state is kept for the
       * prefix cache (kv_paged's snapshots); the prompt's last chunk too, when it crosses one,
       * leaving the tail of fewer than a block's tokens to the next step */
      int64_t B = kv_pool_block_tokens(s->pool), end = (q->kv->len + n) / B * B;
      if (s->recurrent && end > q->kv->len && end < q->kv->len + n) n = end - q->kv->len;
      n = media_chunk(q, n);
      if (n <= 0) continue; /* the budget is spent: prefill next step */
    }
    /* room for n rows: preempt the newest others until there is */
    bool self_preempted = false;
    while (kv_paged_seq_blocks_for(q->kv, q->kv->len + n) > kv_pool_available(s->pool)) {
      if (s->n_running - 1 > i) {
        preempt(s, s->n_running - 1);
      } else if (n_batch > 0 || i > 0) {
        preempt(s, i);
        self_preempted = true;
        break;
      } else {
        break; /* alone and still no room: the reserve below fails and ends it */
      }
    }
    if (self_preempted) break;
    herr e = {0};
    if (q->kv->ops->reserve(q->kv, n, &e)) {
      /* alone in a pool too small for it: end with what it has */
      running_remove(s, i);
      i--;
      if (q->res->completion_tokens > 0) {
        q->res->finish = GEN_FINISH_LENGTH;
        seq_finish(s, q, out_flush(s, q));
      } else {
        herr_set_at(q->err, HEARTH_ELIMIT, NULL, HEARTH_CAUSE_MEMORY_ADMISSION, "memory_admission: %s", e.msg);
        seq_finish(s, q, HEARTH_ELIMIT);
      }
      continue;
    }
    budget -= n;
    int64_t at = q->kv->len;
    int64_t n_prompt = (int64_t)q->req->n_prompt;
    if (at < n_prompt) prompt_fed += (at + n < n_prompt ? at + n : n_prompt) - at;
    model_seq *sq = &p->seqs[n_batch];
    *sq = (model_seq){.kv = q->kv, .tokens = q->n_draft ? q->feed : q->toks + at, .n_tokens = (int)n,
                      .positions = NULL, .all_logits = q->n_draft > 0, .lora = q->req->lora, .n_lora = q->req->n_lora};
    media_rows(s, q, sq, at, n, s->step_tokens - budget - n);
    if (!q->kind && q->run) { /* an MTP run keeps the hidden states of what it feeds */
      herr he = {0};
      sq->next_hidden = gen_run_hidden(q->run, at, (int)n, &he);
      if (he.code) HLOG_WARN("%s (the multi-token-prediction layer will not see these positions)", he.msg);
    }
    if (q->pool) { /* every chunk's hidden rows, folded into the pool after the step */
      sq->out = MODEL_OUT_HIDDEN_ALL;
      sq->dest = s->hrows + (s->step_tokens - budget - n) * model_cfg(s->m)->hidden_size;
    } else if (q->kind == SCHED_PROMPT_LOGPROBS) { /* every chunk's logits rows, to the host */
      sq->out = MODEL_OUT_LOGITS;
      sq->all_logits = true;
    } else if (!q->kind && s->dev_sample && !q->n_draft && at + n >= q->n_toks &&
               sample_params_host_only(&q->req->sample) &&
               (q->hrow || (q->hrow = malloc(sizeof(float) * (size_t)s->vocab)))) {
      /* DRY, typical-p, XTC, mirostat: its row comes to the host, the others' stay on the device */
      sq->out = MODEL_OUT_LOGITS_HOST;
      sq->dest = q->hrow;
    } else if (q->kind) { /* a probe: nothing out until its last chunk, then its one output */
      bool last = at + n >= q->n_toks;
      sq->out = !last ? MODEL_OUT_NONE : q->kind == SCHED_EMBED ? MODEL_OUT_HIDDEN : MODEL_OUT_LOGITS_HOST;
      sq->dest = last ? q->dest : NULL;
    }
    p->owners[n_batch++] = q;
  }
  p->n_seqs = n_batch;
  p->tokens = s->step_tokens - budget;
  p->prompt_tokens = prompt_fed;
  model_batch b = {.seqs = p->seqs, .n_seqs = n_batch};
  p->n_rows = n_batch ? model_batch_logit_rows(&b) : 0;
}

/* Where the step's rows are sampled, and on a device each row's sampling:
 * a grammar's mask goes with the row (made here, from the tokens so far), and
 * a plain greedy speculative sequence's rows are each its argmax there; other
 * speculative sequences' drafts are verified on the host, and so is a step
 * scoring a prompt (all its rows come back); a request whose sampler runs on
 * the host only (DRY, typical-p, XTC, mirostat) has its one row copied to the
 * host (MODEL_OUT_LOGITS_HOST, plan_batch; a row that could not be, for want of
 * memory, brings the step's to the host). */
static int plan_sampling(sched *s, sched_step *p, herr *e) {
  p->host = !s->dev_sample;
  for (int k = 0; k < p->n_seqs && !p->host; k++) {
    const sseq *q = p->owners[k];
    p->host = (q->n_draft > 0 && !sampler_is_plain_greedy(q->smp)) || q->kind == SCHED_PROMPT_LOGPROBS ||
              (!q->kind && sample_params_host_only(&q->req->sample) && p->seqs[k].out == MODEL_OUT_LOGITS);
  }
  if (p->host) return 0;
  if (p->n_rows > s->cap_dev_rows) { /* a speculative sequence has a row per position */
    bk_sample_row *nr = realloc(s->rows, p->n_rows * sizeof *nr);
    if (nr) s->rows = nr;
    bk_sample_out *no = nr ? realloc(s->outs, p->n_rows * sizeof *no) : NULL;
    if (!no) return herr_set(e, HEARTH_ENOMEM, "scheduler: out of memory for the sampling rows of a batch");
    s->outs = no, s->cap_dev_rows = p->n_rows;
  }
  /* a row per logits row; sequences still mid-prefill and probes get a greedy row whose id is ignored;
   * a speculative one (plain greedy) a row per position, each its argmax */
  int rc = 0;
  s->n_adj = 0;
  for (int k = 0, r = 0; k < p->n_seqs && !rc; k++) {
    sseq *q = p->owners[k];
    const model_seq *sq = &p->seqs[k];
    if (sq->out != MODEL_OUT_LOGITS && sq->out != MODEL_OUT_LOGITS_HOST) continue;
    if (q->n_draft > 0) {
      for (int i = 0; i < q->n_catch; i++) s->rows[r++] = (bk_sample_row){0}; /* fed again: not read */
      for (int i = 0; i <= q->n_draft && !rc; i++)
        rc = sampler_device_row(q->smp, &s->rows[r++], &s->adj, &s->n_adj, &s->cap_adj, e);
    } else if (!q->kind && sq->out == MODEL_OUT_LOGITS_HOST) {
      s->rows[r++] = (bk_sample_row){0}; /* sampled on the host from its copied row: this id is not read */
      q->mask_rc = 0;
    } else if (!q->kind && q->kv->len + sq->n_tokens >= q->n_toks) {
      rc = sampler_device_row(q->smp, &s->rows[r], &s->adj, &s->n_adj, &s->cap_adj, e);
      q->mask_rc = !rc && q->gm ? out_mask_row(s, q, &s->rows[r], k) : 0;
      if (q->mask_rc) s->rows[r] = (bk_sample_row){0}; /* ends this step: its row is not read */
      r++;
    } else
      s->rows[r++] = (bk_sample_row){0};
  }
  p->rows = s->rows;
  p->adj = s->adj;
  p->n_adj = (int64_t)s->n_adj;
  return rc;
}

/* Plans one step: cancelled sequences leave, waiting ones are admitted,
 * speculative ones draft, the batch is assembled and its sampling prepared.
 * p->n_seqs == 0: nothing to run. An error fails the step's sequences. */
static int sched_plan(sched *s, sched_step *p, herr *e) {
  *p = (sched_step){.seqs = s->batch, .owners = s->in_batch, .t_step = s->trace ? htrace_now() : 0};
  for (int i = 0; i < s->n_running;) {
    sseq *q = s->running[i];
    if (seq_cancelled(q)) {
      running_remove(s, i);
      seq_cancel(s, q, "during generation");
    } else {
      i++;
    }
  }
  for (int i = 0; i < s->n_denoising;) {
    sseq *q = s->denoising[i];
    if (seq_cancelled(q)) {
      denoising_remove(s, i);
      seq_cancel(s, q, "during generation");
    } else {
      i++;
    }
  }
  admit(s);
  if (s->n_running == 0) return 0;
  p->t_plan = now_seconds();
  propose(s);
  plan_batch(s, p);
  if (p->n_seqs == 0) return 0;
  return plan_sampling(s, p, e);
}

/* ---- run: the step's one forward ---- */

/* The forward of a planned step: logits rows to s->logits (host), or the
 * tokens the device picked to s->outs. */
static int sched_execute(sched *s, sched_step *p, herr *e) {
  p->t_fwd = s->trace ? htrace_now() : 0;
  model_batch b = {.seqs = p->seqs, .n_seqs = p->n_seqs};
  int rc;
  if (p->host && p->n_rows > s->cap_rows) {
    float *l = realloc(s->logits, sizeof(float) * p->n_rows * (size_t)s->vocab);
    if (!l) return herr_set(e, HEARTH_ENOMEM, "scheduler: out of memory for the logits of a batch");
    s->logits = l, s->cap_rows = p->n_rows;
  }
  if (p->host) rc = model_forward(s->m, &b, s->logits, e);
  else rc = model_forward_sample(s->m, &b, p->rows, p->adj, p->n_adj, s->outs, e);
  p->t_fwd_end = s->trace ? htrace_now() : 0;
  return rc;
}

/* ---- commit: the step's results applied ---- */

/* A failed plan or forward: every sequence of the step ends with the error. */
static void fail_step(sched *s, const sched_step *p, int rc, const herr *e) {
  for (int k = 0; k < p->n_seqs; k++) {
    sseq *q = p->owners[k];
    running_drop(s, q);
    *q->err = *e;
    seq_finish(s, q, rc);
  }
}

/* Folds n hidden rows (of positions at, at + 1, ...) into q's pool. */
static void pool_fold(sched *s, sseq *q, const float *rows, int64_t n, int64_t at) {
  int64_t D = model_cfg(s->m)->hidden_size;
  for (int64_t i = 0; i < n; i++) {
    const float *h = rows + i * D;
    float w = q->pool == SCHED_POOL_WSUM ? (float)(at + i + 1) : 1.0f;
    if (q->pool == SCHED_POOL_MAX) {
      for (int64_t d = 0; d < D; d++)
        if (h[d] > q->dest[d]) q->dest[d] = h[d];
    } else {
      for (int64_t d = 0; d < D; d++) q->dest[d] += w * h[d];
    }
  }
}

/* q's logits rows on the host (1 + its drafts), or the tokens the device
 * chose for them (chosen, with rows NULL): its run commits the tokens
 * through the output stage; the KV rows of rejected drafts are cut off
 * before any block is published. Returns true when q ended (and was
 * finished). */
static bool seq_verify(sched *s, sseq *q, float *rows, const bk_sample_out *chosen) {
  out_ctx c = {s, q, false};
  gen_step g;
  spec_source src = gen_run_source(q->run);
  int n_draft = q->n_draft;
  q->n_draft = 0;
  /* once a commit ends q, q and its run are gone: only g is read after */
  int rc;
  if (rows) {
    rc = gen_run_verify(q->run, q->smp, rows, 1 + n_draft, s->vocab, out_commit, &c, &g, q->err);
  } else {
    sample_token st[1 + GEN_MAX_SPEC_TOKENS];
    rc = 0;
    for (int i = 0; i <= n_draft && !rc; i++) {
      if (chosen[i].id < 0) rc = herr_set(q->err, HEARTH_EINTERNAL, "sampler: the logits row has no finite value");
      else sampler_from_device(q->smp, &chosen[i], &st[i]);
    }
    g = (gen_step){0};
    if (!rc) rc = gen_run_verify_chosen(q->run, st, 1 + n_draft, out_commit, &c, &g, q->err);
  }
  if (g.drafted > 0) {
    pthread_mutex_lock(&s->mu);
    s->st.spec_steps[src]++;
    s->st.spec_drafted[src] += g.drafted;
    s->st.spec_accepted[src] += g.accepted;
    pthread_mutex_unlock(&s->mu);
  }
  if (g.ended) return true;
  if (rc) {
    seq_finish(s, q, rc);
    return true;
  }
  /* rejected drafts: attention rows are cut off; recurrent layers take the state kept after the last
   * accepted token (kv_paged_seq_keep), or, without one, go back to the state before the drafts (the
   * mark), and the accepted tokens are fed again ahead of the next step's pending token (and its
   * drafts: q->n_catch), so no block is published past what the state has seen */
  if (q->kv->len > q->n_toks - 1 && kv_paged_seq_rewind(q->kv, q->n_toks - 1) < q->n_toks - 1) {
    pthread_mutex_lock(&s->mu);
    s->st.spec_refed += q->n_toks - 1 - q->kv->len;
    pthread_mutex_unlock(&s->mu);
  }
  kv_paged_seq_publish(q->kv, keys_of(q), q->kv->len, adapter_of(q));
  return false;
}

/* The step's forward [t0, t1): on the engine's track, and on each request's
 * track as a prefill chunk or a decode step (the whole batch's time: the
 * requests share it). */
static void trace_forward(sched *s, const sched_step *p, int64_t *prefill_tokens, int64_t *decode_tokens) {
  int64_t prefill = 0, decode = 0;
  double t0 = p->t_fwd, t1 = p->t_fwd_end;
  for (int k = 0; k < p->n_seqs; k++) {
    sseq *q = p->owners[k];
    int64_t n = p->seqs[k].n_tokens, pos = q->kv->len - n;
    bool is_prefill = (n > 1 && !q->n_draft) || pos < (int64_t)q->req->n_prompt;
    if (is_prefill) prefill += n;
    else decode += n;
    if (is_prefill)
      htrace_complete(s->trace, q->trace_tid, "prefill", "request", t0, t1 - t0,
                      (htrace_arg[]){HTRACE_INT("tokens", n), HTRACE_INT("position", pos),
                                     HTRACE_INT("batch", p->n_seqs), HTRACE_INT("recompute", q->preemptions > 0)},
                      4);
    else
      htrace_complete(s->trace, q->trace_tid, "decode", "request", t0, t1 - t0,
                      (htrace_arg[]){HTRACE_INT("position", pos), HTRACE_INT("batch", p->n_seqs)}, 2);
  }
  htrace_complete(s->trace, TRACE_ENGINE, "forward", "engine", t0, t1 - t0, NULL, 0);
  *prefill_tokens = prefill;
  *decode_tokens = decode;
}

/* Applies the step's results to its k-th sequence, whose (first) logits row
 * is r: drafts verified, blocks published, a probe's output gathered, the
 * next token sampled and committed through the output stage. Returns true
 * when q ended (and was finished). */
static bool commit_seq(sched *s, const sched_step *p, int k, int r) {
  sseq *q = p->owners[k];
  const model_seq *sq = &p->seqs[k];
  if (q->n_draft > 0) { /* speculative: verify, cut the rejected rows, then publish */
    r += q->n_catch;    /* the pending token's row */
    return p->host ? seq_verify(s, q, s->logits + (size_t)r * (size_t)s->vocab, NULL) : seq_verify(s, q, NULL, s->outs + r);
  }
  kv_paged_seq_publish(q->kv, keys_of(q), q->kv->len, adapter_of(q));
  if (q->pool) pool_fold(s, q, sq->dest, sq->n_tokens, q->kv->len - sq->n_tokens);
  if (q->kind == SCHED_PROMPT_LOGPROBS) { /* row i: position at + i, which predicts the token after it */
    int64_t at = q->kv->len - sq->n_tokens;
    int lrc = 0;
    for (int i = 0; i < sq->n_tokens && at + i + 1 < q->n_toks && !lrc; i++)
      lrc = sample_row_logprobs(s->logits + (size_t)(r + i) * (size_t)s->vocab, (int32_t)s->vocab, q->toks[at + i + 1],
                                q->plp_top, &q->plp[at + i + 1], q->err);
    if (lrc) {
      seq_finish(s, q, lrc);
      return true;
    }
  }
  if (q->kv->len < q->n_toks) return false; /* mid-prefill: no token yet */
  if (q->kind) { /* a probe's output is in its dest: done */
    seq_finish(s, q, 0);
    return true;
  }
  /* the row sampled on the host: the step's, or this sequence's copied one */
  float *hrow = p->host ? s->logits + (size_t)r * (size_t)s->vocab : sq->out == MODEL_OUT_LOGITS_HOST ? q->hrow : NULL;
  int rc;
  if (!hrow && q->mask_rc) {
    out_end(s, q, q->mask_rc);
    return true;
  }
  if (!hrow) return seq_verify(s, q, NULL, s->outs + r); /* the token the device chose: the run commits it */
  if (q->gm && (rc = out_mask(s, q, hrow)) != 0) {
    out_end(s, q, rc);
    return true;
  }
  return seq_verify(s, q, hrow, NULL); /* one row: the run samples it */
}

/* Applies a step's results, then its statistics and trace span. */
static void sched_commit(sched *s, const sched_step *p) {
  int64_t prefill_tokens = 0, decode_tokens = 0;
  if (s->trace) trace_forward(s, p, &prefill_tokens, &decode_tokens);
  for (int k = 0, next_row = 0; k < p->n_seqs; k++) {
    const model_seq *sq = &p->seqs[k];
    int r = next_row;
    if (sq->out == MODEL_OUT_LOGITS || sq->out == MODEL_OUT_LOGITS_HOST) next_row += sq->all_logits ? sq->n_tokens : 1;
    if (commit_seq(s, p, k, r)) running_drop(s, p->owners[k]);
  }
  pthread_mutex_lock(&s->mu);
  publish_counts(s);
  s->st.prompt_tokens += p->prompt_tokens;
  s->st.busy_seconds += now_seconds() - p->t_plan;
  s->st.steps++;
  if (p->n_seqs > s->st.peak_batch) s->st.peak_batch = p->n_seqs;
  if (p->tokens > s->st.peak_step_tokens) s->st.peak_step_tokens = p->tokens;
  int64_t waiting = s->n_waiting;
  pthread_mutex_unlock(&s->mu);
  if (s->trace)
    htrace_complete(s->trace, TRACE_ENGINE, "step", "engine", p->t_step, htrace_now() - p->t_step,
                    (htrace_arg[]){HTRACE_INT("n_seqs", p->n_seqs), HTRACE_INT("tokens", prefill_tokens + decode_tokens),
                                   HTRACE_INT("prefill_tokens", prefill_tokens),
                                   HTRACE_INT("decode_tokens", decode_tokens), HTRACE_INT("running", s->n_running),
                                   HTRACE_INT("waiting", waiting)},
                    6);
}

/* ---- denoising: block diffusion's runs, stepped beside the batch ---- */

/* One forward of each denoising run — its own: a canvas pass does not share
 * the batch's — and, when a block becomes final, its tokens through the
 * output stage. counted: the step's batch ran (and was counted). */
static void step_denoise(sched *s, bool counted) {
  double t0 = now_seconds();
  for (int i = 0; i < s->n_denoising;) {
    sseq *q = s->denoising[i];
    out_ctx c = {s, q, false};
    bool done = false;
    double tt = q->trace_tid ? htrace_now() : 0;
    int rc = denoise_run_step(q->dn, out_commit, &c, &done, q->err);
    if (c.ended) { /* finished by the output stage: q may be gone */
      denoising_remove(s, i);
      continue;
    }
    if (q->trace_tid) htrace_complete(s->trace, q->trace_tid, "denoise", "request", tt, htrace_now() - tt, NULL, 0);
    if (rc || done) {
      denoising_remove(s, i);
      seq_finish(s, q, rc ? rc : out_flush(s, q));
      continue;
    }
    if (q->t_first == 0 && !denoise_run_encoding(q->dn)) q->t_first = now_seconds(); /* the prompt is in */
    i++;
  }
  pthread_mutex_lock(&s->mu);
  publish_counts(s);
  if (!counted) s->st.steps++;
  s->st.busy_seconds += now_seconds() - t0;
  pthread_mutex_unlock(&s->mu);
}

/* ---- the engine thread ---- */

/* One step: plan, run, commit; then the denoising runs' forwards. */
static void step(sched *s) {
  if (s->step_hook) s->step_hook(s->step_hook_user);
  sched_step p;
  herr e = {0};
  int rc = sched_plan(s, &p, &e);
  if (p.n_seqs > 0) {
    if (!rc) rc = sched_execute(s, &p, &e);
    if (rc) fail_step(s, &p, rc, &e);
    else sched_commit(s, &p);
  }
  if (s->n_denoising > 0) step_denoise(s, p.n_seqs > 0 && !rc);
}

static void *engine_main(void *arg) {
  sched *s = arg;
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while (!s->stop && s->n_running == 0 && s->n_denoising == 0 && !s->wait_head)
      pthread_cond_wait(&s->work_cv, &s->mu);
    bool stop = s->stop;
    pthread_mutex_unlock(&s->mu);
    if (stop) break;
    int before = s->n_running + s->n_denoising;
    int64_t steps = s->st.steps;
    step(s);
    /* nothing could run (all waiting on blocks held by no one running cannot happen;
     * a failed allocation can): do not spin */
    if (s->n_running + s->n_denoising == 0 && before == 0 && steps == s->st.steps) usleep(1000);
  }
  while (s->n_running > 0) {
    sseq *q = s->running[--s->n_running];
    seq_cancel(s, q, "by shutdown");
  }
  while (s->n_denoising > 0) {
    sseq *q = s->denoising[--s->n_denoising];
    seq_cancel(s, q, "by shutdown");
  }
  for (;;) {
    pthread_mutex_lock(&s->mu);
    sseq *q = queue_pop(s);
    pthread_mutex_unlock(&s->mu);
    if (!q) break;
    seq_cancel(s, q, "by shutdown");
  }
  return NULL;
}

/* ---- public ---- */

static size_t physical_memory(void) {
  long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? (size_t)pages * (size_t)size : (size_t)8 << 30;
}

int sched_new(model *m, const tokenizer *tok, const sched_config *cfg, sched **out, herr *err) {
  *out = NULL;
  sched_config c = cfg ? *cfg : (sched_config){0};
  sched *s = calloc(1, sizeof *s);
  if (!s) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  s->m = m;
  s->tok = tok;
  s->vocab = model_vocab_size(m);
  s->max_batch = c.max_batch > 0 ? c.max_batch : 64;
  s->chunk = c.prefill_chunk > 0 ? c.prefill_chunk : GEN_DEFAULT_PREFILL_CHUNK;
  s->step_tokens = c.step_tokens > 0 ? c.step_tokens : (s->chunk > s->max_batch ? s->chunk : s->max_batch);
  if (s->step_tokens < s->max_batch) s->step_tokens = s->max_batch; /* every running sequence decodes each step */
  s->memory_budget = c.memory_budget;
  s->trace = c.trace;
  s->step_hook = c.step_hook;
  s->step_hook_user = c.step_hook_user;
  s->diffusion = model_canvas_length(m) > 0;
  if (c.denoise) s->denoise = *c.denoise;
  else denoise_params_default(&s->denoise);
  int rc = gen_method_check(c.method, m, err);
  if (rc) {
    free(s);
    return rc;
  }
  if (c.method) s->method_own = *c.method;
  s->method_own.target = m;
  s->method_own.mtp_cache = NULL;
  s->method = &s->method_own;
  int B = c.block_tokens > 0 ? c.block_tokens : SCHED_DEFAULT_BLOCK_TOKENS;
  int64_t ctx = c.context_length > 0 ? c.context_length : model_cfg(m)->max_position_embeddings;
  if (ctx <= 0) ctx = 4096;
  s->ctx = ctx;
  model_kv_geometry g;
  model_kv_geometry_of(m, &g);
  kv_quant_apply(&c.kv_quant, &g);
  s->block_bytes = kv_block_bytes(&g, B);
  /* recurrent layers: a state per running sequence and the snapshots, allocated up front beside the blocks */
  int64_t snaps = c.state_snapshots > 0 ? c.state_snapshots : c.state_snapshots < 0 ? 0 : s->max_batch;
  size_t states = kv_state_bytes(&g) * (size_t)(s->max_batch + snaps);
  size_t bytes = c.kv_bytes;
  int64_t n_blocks;
  bk_backend *be = model_backend(m);
  if (bytes == 0 && !bk_backend_is_cpu(be)) {
    size_t fr = 0, tot = 0;
    double frac = c.gpu_memory_fraction > 0 && c.gpu_memory_fraction <= 1 ? c.gpu_memory_fraction : 0.9;
    if (bk_mem_info(be, &fr, &tot) == 0) bytes = (size_t)((double)fr * frac);
    for (int r = 1; r < g.n_ranks; r++) { /* tensor parallelism: each rank's arenas on its GPU, the least free one sets the size */
      size_t fr_r = 0;
      if (bk_mem_info(g.rank_backend[r], &fr_r, &tot) == 0 && (size_t)((double)fr_r * frac) < bytes) bytes = (size_t)((double)fr_r * frac);
    }
    if (g.n_ranks > 1) bytes *= (size_t)g.n_ranks; /* block_bytes counts every rank's arenas */
    bytes = bytes > states ? bytes - states : 0;
    n_blocks = (int64_t)(bytes / s->block_bytes);
    int64_t enough = (int64_t)s->max_batch * ((ctx + B - 1) / B);
    if (n_blocks > enough) n_blocks = enough;
  } else if (bytes == 0) {
    bytes = physical_memory() / 4;
    if (bytes > ((size_t)4 << 30)) bytes = (size_t)4 << 30;
    bytes = bytes > states ? bytes - states : 0;
    n_blocks = (int64_t)(bytes / s->block_bytes);
    int64_t enough = (int64_t)s->max_batch * ((ctx + B - 1) / B);
    if (n_blocks > enough) n_blocks = enough;
  } else {
    size_t have = physical_memory();
    if (bk_backend_is_cpu(be) && bytes > have) {
      free(s); /* nothing else is held yet */
      return herr_set(err, HEARTH_ENOMEM, "KV cache: %.1f GiB asked for, more than this machine's %.1f GiB of memory",
                      (double)bytes / (1 << 30), (double)have / (1 << 30));
    }
    n_blocks = (int64_t)(bytes / s->block_bytes);
  }
  /* a block-diffusion model's generations keep their KV in caches of their own: the pool holds one
   * full-context sequence's rows for prompt-only work */
  if (s->diffusion && c.kv_bytes == 0 && n_blocks > (ctx + B - 1) / B) n_blocks = (ctx + B - 1) / B;
  if (c.memory_budget && n_blocks > (int64_t)(c.memory_budget / s->block_bytes))
    n_blocks = (int64_t)(c.memory_budget / s->block_bytes);
  if (n_blocks < 1) n_blocks = 1; /* admission refuses what does not fit */
  pthread_mutex_init(&s->mu, NULL);
  pthread_mutex_init(&s->gv_mu, NULL);
  pthread_cond_init(&s->work_cv, NULL);
  pthread_cond_init(&s->done_cv, NULL);
  rc = kv_pool_new(&g, B, n_blocks, &s->pool, err);
  if (rc) goto fail;
  /* recurrent layers: state snapshots at block ends let a prefix-cache hit resume there */
  s->recurrent = kv_pool_recurrent(s->pool);
  if (s->recurrent) {
    kv_pool_set_snapshots(s->pool, snaps);
    /* a speculating sequence also keeps its state after each verified token (kv_paged_seq_keep) */
    int64_t marks = s->method->spec_tokens > 0 || s->method->draft ? s->max_batch * (s->method->spec_tokens + 2) : 0;
    if ((rc = kv_pool_reserve_states(s->pool, s->max_batch + snaps + marks + 1, err))) goto fail;
  }
  if (s->method && s->method->draft) {
    model_kv_geometry dg;
    model_kv_geometry_of(s->method->draft, &dg);
    if ((rc = kv_cache_new(&dg, 0, &s->draft_cache, err))) goto fail;
  }
  if (model_mtp_check(m, NULL) == 0) { /* requests may draft with the MTP layer */
    model_kv_geometry mg;
    model_mtp_geometry_of(m, &mg);
    if ((rc = kv_cache_new(&mg, 0, &s->mtp_cache, err))) goto fail;
    s->method_own.mtp_cache = s->mtp_cache;
  }
  kv_format_describe(&g, s->st.kv_format, sizeof s->st.kv_format);
  s->st.block_bytes = s->block_bytes;
  HLOG_INFO("KV pool on %s: %lld blocks of %d tokens (%lld tokens, KV %s, %.1f KiB a token), %.2f GiB",
            bk_backend_name(be), (long long)n_blocks, B, (long long)n_blocks * B, s->st.kv_format,
            (double)s->block_bytes / B / 1024, (double)n_blocks * (double)s->block_bytes / (1 << 30));
  /* a hybrid model's prefix needs the recurrent state snapshot at its end, which the store does not keep */
  if (c.kv_store && kv_pool_recurrent(s->pool))
    HLOG_WARN("KV store %s: not used: the model has recurrent layers, whose states the store does not keep",
              c.kv_store);
  else if (c.kv_store && (rc = kv_disk_open(c.kv_store, c.kv_store_max, c.kv_store_model, s->pool, &s->store, err)))
    goto fail;
  /* on a device, tokens are chosen there (only ids and asked-for logprobs come back) */
  s->dev_sample = !bk_backend_is_cpu(be) || cfg->backend_sampling;
  if (s->dev_sample) {
    s->rows = calloc((size_t)s->max_batch, sizeof *s->rows);
    s->outs = calloc((size_t)s->max_batch, sizeof *s->outs);
    s->cap_dev_rows = (size_t)s->max_batch;
  } else {
    s->logits = malloc(sizeof(float) * (size_t)s->max_batch * (size_t)s->vocab);
    s->cap_rows = (size_t)s->max_batch;
  }
  s->running = calloc((size_t)s->max_batch, sizeof *s->running);
  s->denoising = calloc((size_t)s->max_batch, sizeof *s->denoising);
  s->props = calloc((size_t)s->max_batch, sizeof *s->props);
  s->prop_seqs = calloc((size_t)s->max_batch, sizeof *s->prop_seqs);
  s->batch = calloc((size_t)s->max_batch, sizeof *s->batch);
  s->media_pos = calloc((size_t)s->step_tokens, sizeof *s->media_pos);
  s->in_batch = calloc((size_t)s->max_batch, sizeof *s->in_batch);
  if ((s->dev_sample ? !s->rows || !s->outs : !s->logits) || !s->running || !s->denoising || !s->batch ||
      !s->in_batch || !s->props || !s->prop_seqs || !s->media_pos) {
    rc = herr_set(err, HEARTH_ENOMEM, "scheduler: out of memory for a batch of %d", s->max_batch);
    goto fail;
  }
  s->st.block_tokens = B;
  publish_counts(s);
  htrace_track(s->trace, TRACE_ENGINE, "engine", 0);
  if (pthread_create(&s->thread, NULL, engine_main, s)) {
    rc = herr_set(err, HEARTH_EINTERNAL, "scheduler: cannot start the engine thread");
    goto fail;
  }
  s->thread_started = true;
  *out = s;
  return 0;
fail:
  sched_free(s);
  return rc;
}

void sched_free(sched *s) {
  if (!s) return;
  if (s->thread_started) {
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
  }
  if (s->store) {
    herr e = {0};
    if (kv_disk_flush(s->store, &e)) HLOG_WARN("%s", e.msg);
    kv_disk_close(s->store);
  }
  kv_pool_free(s->pool);
  kv_cache_free(s->draft_cache);
  kv_cache_free(s->mtp_cache);
  free(s->logits);
  free(s->rows);
  free(s->outs);
  free(s->adj);
  free(s->masks);
  free(s->hrows);
  free(s->running);
  free(s->denoising);
  free(s->props);
  free(s->prop_seqs);
  free(s->draft_rows);
  free(s->batch);
  free(s->media_pos);
  free(s->in_batch);
  grammar_vocab_free(s->gv);
  pthread_mutex_destroy(&s->mu);
  pthread_mutex_destroy(&s->gv_mu);
  pthread_cond_destroy(&s->work_cv);
  pthread_cond_destroy(&s->done_cv);
  free(s);
}

static void seq_state_free(sseq *q) {
  free(q->hrow);
  gen_run_free(q->run);
  denoise_run_free(q->dn);
  if (q->dkv) kv_cache_seq_free(q->dkv);
  kv_cache_free(q->dcache);
  free(q->toks);
  free(q->keys);
  sampler_free(q->smp);
  grammar_matcher_free(q->gm);
  grammar_free(q->gram);
  gen_emit_free(&q->out);
}

int sched_admit(sched *s, int64_t n_prompt, int64_t max_tokens, herr *err) {
  int B = kv_pool_block_tokens(s->pool);
  kv_pool_counts c;
  kv_pool_count(s->pool, &c); /* total is constant: safe from any thread */
  int64_t rows = n_prompt + (max_tokens >= 0 ? max_tokens : 1);
  int64_t blocks = (rows + B - 1) / B;
  if (blocks <= c.total) return 0;
  pthread_mutex_lock(&s->mu);
  s->st.requests_refused++;
  pthread_mutex_unlock(&s->mu);
  return herr_set_at(err, HEARTH_ELIMIT, NULL, HEARTH_CAUSE_MEMORY_ADMISSION,
                  "memory_admission: the request needs %lld tokens of KV cache (%zu bytes) but the cache holds %lld "
                  "tokens (%zu bytes%s)",
                  (long long)rows, (size_t)blocks * s->block_bytes, (long long)(c.total * B),
                  (size_t)c.total * s->block_bytes, s->memory_budget ? ", within --memory-budget" : "");
}

/* The tokenizer's vocabulary as grammar.h wants it. */
static int grammar_vocab_new(const tokenizer *t, grammar_vocab **out, herr *err) {
  *out = NULL;
  int32_t n = tokenizer_vocab_size(t);
  hbuf all = {0};
  size_t *offs = malloc(sizeof *offs * (size_t)(n + 1));
  char **ptrs = malloc(sizeof *ptrs * (size_t)(n > 0 ? n : 1));
  size_t *lens = malloc(sizeof *lens * (size_t)(n > 0 ? n : 1));
  int rc = 0;
  if (!offs || !ptrs || !lens) rc = herr_set(err, HEARTH_ENOMEM, "grammar: out of memory for the vocabulary");
  for (int32_t i = 0; !rc && i < n; i++) {
    offs[i] = all.len;
    if (!tokenizer_is_special(t, i) && tokenizer_id_to_token(t, i)) rc = tokenizer_token_bytes(t, i, &all, err);
    lens[i] = all.len - offs[i];
  }
  if (!rc && all.oom) rc = herr_set(err, HEARTH_ENOMEM, "grammar: out of memory for the vocabulary");
  if (!rc) {
    for (int32_t i = 0; i < n; i++) ptrs[i] = all.data + offs[i];
    rc = grammar_vocab_from_bytes((const char *const *)ptrs, lens, n, out, err);
  }
  /* special tokens (tool-call markers and the like) by their text, for <text> terminals */
  for (int32_t i = 0; !rc && i < n; i++) {
    const char *txt = tokenizer_is_special(t, i) ? tokenizer_id_to_token(t, i) : NULL;
    if (txt) rc = grammar_vocab_name(*out, i, txt, err);
  }
  if (rc) {
    grammar_vocab_free(*out);
    *out = NULL;
  }
  hbuf_free(&all);
  free(offs);
  free(ptrs);
  free(lens);
  return rc;
}

/* Compiles q's grammar and starts its matcher (the caller's thread). */
static int seq_grammar(sched *s, sseq *q, herr *err) {
  if (!s->tok) return herr_set(err, HEARTH_EINVAL, "grammar: the model has no tokenizer to match the output with");
  int rc = grammar_compile(q->req->grammar, q->req->grammar_len, &q->gram, err);
  if (rc) return rc;
  pthread_mutex_lock(&s->gv_mu);
  if (!s->gv) rc = grammar_vocab_new(s->tok, &s->gv, err);
  pthread_mutex_unlock(&s->gv_mu);
  if (rc) return rc;
  int32_t ends[GEN_MAX_EOS];
  int n_end = 0;
  for (int i = 0; i < q->req->n_eos && i < GEN_MAX_EOS; i++) ends[n_end++] = q->req->eos_ids[i];
  if (!n_end) return herr_set(err, HEARTH_EINVAL, "grammar: the model has no end-of-sequence token to finish with");
  return grammar_matcher_new(q->gram, s->gv, ends, n_end, &q->gm, err);
}

/* The waiter's side of delivery: takes the queued tokens and calls fn for
 * each, outside the engine's step, until the sequence is finished and its
 * queue empty. After fn asks to stop (returns nonzero, or sets the request's
 * cancel flag), the rest is dropped. Returns whether it stopped; *delivered:
 * the tokens fn was given. */
static bool deliver(sched *s, sseq *q, int64_t *delivered) {
  dentry *batch = NULL;
  size_t cap = 0;
  hbuf text = {0};
  bool stopped = false;
  pthread_mutex_lock(&q->dmu);
  for (;;) {
    while (q->n_dq == 0 && !q->dclosed) pthread_cond_wait(&q->dcv, &q->dmu);
    if (q->n_dq == 0) break; /* closed and drained */
    /* take the whole queue: swap it with the (empty) local arrays */
    dentry *qa = q->dq;
    size_t qn = q->n_dq, qc = q->cap_dq;
    q->dq = batch, q->cap_dq = cap, q->n_dq = 0;
    batch = qa, cap = qc;
    hbuf t = q->dtext;
    q->dtext = text;
    hbuf_clear(&q->dtext);
    text = t;
    pthread_mutex_unlock(&q->dmu);
    double t0 = q->trace_tid ? htrace_now() : 0;
    for (size_t i = 0; i < qn && !stopped; i++) {
      const dentry *d = &batch[i];
      int r = q->fn(q->user, text.data ? text.data + d->off : "", d->len, d->has_tok ? &d->st : NULL);
      *delivered += d->has_tok;
      if (r || seq_cancelled(q)) {
        stopped = true;
        atomic_store(&q->stop_req, 1);
      }
    }
    if (q->trace_tid)
      htrace_complete(s->trace, q->trace_tid - TRACE_ENGINE + TRACE_DELIVER, "deliver", "request", t0, htrace_now() - t0,
                      (htrace_arg[]){HTRACE_INT("tokens", (int64_t)qn)}, 1);
    hbuf_clear(&text);
    pthread_mutex_lock(&q->dmu);
  }
  pthread_mutex_unlock(&q->dmu);
  free(batch);
  hbuf_free(&text);
  return stopped;
}

int sched_run(sched *s, const gen_request *req, gen_token_fn fn, void *user, gen_result *res, herr *err) {
  double t_start = s->trace ? htrace_now() : 0;
  memset(res, 0, sizeof *res);
  res->stop_index = -1;
  res->stop_token = -1;
  res->prompt_tokens = (int64_t)req->n_prompt;
  if (!req->prompt || req->n_prompt == 0) return herr_set(err, HEARTH_EINVAL, "generate: the prompt has no tokens");
  if (req->n_stop && !s->tok)
    return herr_set(err, HEARTH_EINVAL, "generate: stop strings need a tokenizer to decode the output");
  for (size_t i = 0; i < req->n_prompt; i++)
    if (req->prompt[i] < 0 || req->prompt[i] >= s->vocab)
      return herr_set(err, HEARTH_EINVAL, "generate: prompt token %zu is id %d, outside the vocabulary (size %lld)", i,
                      (int)req->prompt[i], (long long)s->vocab);
  sseq q = {.req = req, .fn = fn, .user = user, .res = res, .err = err, .t_start = t_start,
            .method = s->diffusion ? GEN_METHOD_DENOISING : GEN_METHOD_AUTOREGRESSIVE};
  pthread_mutex_init(&q.dmu, NULL);
  pthread_cond_init(&q.dcv, NULL);
  /* a denoising run samples on its own (engine/denoise.h), and keeps its KV in a cache of its own */
  bool denoising = q.method == GEN_METHOD_DENOISING;
  int rc = denoising ? 0 : sampler_new((int32_t)s->vocab, &req->sample, &q.smp, err);
  if (rc) goto out;
  if ((rc = gen_check_context(s->m, req, &q.max_new, err))) goto out;
  if (q.max_new == 0) {
    res->finish = GEN_FINISH_LENGTH;
    goto out;
  }
  /* admission: the request alone must fit the pool (and the budget) */
  if (!denoising && (rc = sched_admit(s, (int64_t)req->n_prompt, req->max_tokens >= 0 ? q.max_new : -1, err)))
    goto out;
  q.cap_toks = (int64_t)req->n_prompt + 16;
  q.toks = malloc(sizeof(int32_t) * (size_t)q.cap_toks);
  if (!q.toks) {
    rc = herr_set(err, HEARTH_ENOMEM, "generate: out of memory for the prompt");
    goto out;
  }
  memcpy(q.toks, req->prompt, sizeof(int32_t) * req->n_prompt);
  q.n_toks = (int64_t)req->n_prompt;
  if (req->prefix_keys) {
    q.cap_keys = q.cap_toks;
    if (!(q.keys = malloc(sizeof(int32_t) * (size_t)q.cap_keys))) {
      rc = herr_set(err, HEARTH_ENOMEM, "generate: out of memory for the prompt");
      goto out;
    }
    memcpy(q.keys, req->prefix_keys, sizeof(int32_t) * req->n_prompt);
  }
  if ((rc = gen_emit_init(&q.out, s->tok, req, err))) goto out;
  if (req->grammar && (rc = seq_grammar(s, &q, err))) goto out;
  if (!denoising) {
    if ((rc = gen_run_new(s->method, req, s->vocab, s->draft_cache, &q.run, err))) goto out;
    q.method = gen_run_kind(q.run);
    if (gen_run_kind(q.run) == GEN_METHOD_SPECULATIVE && !gen_method_can_rollback(s->m)) {
      rc = herr_set_at(err, HEARTH_EUNSUPPORTED, "spec_tokens", 0, "%s", GEN_ROLLBACK_REFUSED);
      goto out;
    }
    sampler_add_prompt(q.smp, req->prompt, req->n_prompt);
  }
  pthread_mutex_lock(&s->mu);
  if (s->stop) {
    pthread_mutex_unlock(&s->mu);
    rc = herr_set(err, HEARTH_ECANCELLED, "generate: the engine is shutting down");
    goto out;
  }
  if (s->trace) trace_queued(s, &q);
  q.t_enqueue = now_seconds();
  queue_push_back(s, &q);
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  int64_t delivered = 0;
  bool stopped = fn && deliver(s, &q, &delivered);
  pthread_mutex_lock(&s->mu);
  while (!q.done) pthread_cond_wait(&s->done_cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  rc = q.rc;
  if (stopped && (rc == 0 || rc == HEARTH_ECANCELLED)) {
    /* the engine may have gone on past the token where the caller stopped: the result
     * (and the statistics, and the trace) are what the caller saw */
    if (res->finish != GEN_FINISH_CANCELLED) {
      pthread_mutex_lock(&s->mu);
      s->st.requests_finished--;
      s->st.requests_cancelled++;
      pthread_mutex_unlock(&s->mu);
    }
    res->finish = GEN_FINISH_CANCELLED;
    res->completion_tokens = delivered;
    res->stop_index = -1;
    res->stop_token = -1;
    if (rc == 0) rc = herr_set(err, HEARTH_ECANCELLED, "generate: cancelled by the callback");
  }
  if (q.trace_tid && fn) {
    q.rc = rc;
    trace_request_span(s, &q);
  }
out:
  seq_state_free(&q);
  free(q.dq);
  hbuf_free(&q.dtext);
  pthread_cond_destroy(&q.dcv);
  pthread_mutex_destroy(&q.dmu);
  return rc;
}

void sched_get_stats(sched *s, sched_stats *out) {
  pthread_mutex_lock(&s->mu);
  *out = s->st;
  out->waiting = s->n_waiting;
  pthread_mutex_unlock(&s->mu);
  out->kv_store = s->store != NULL;
  if (s->store) kv_disk_get_stats(s->store, &out->store); /* under the store's own lock */
}

int sched_probe_run(sched *s, sched_probe_kind kind, sched_probe *p, int n, const volatile int *cancel, herr *err) {
  if (kind != SCHED_EMBED && kind != SCHED_NEXT_LOGITS && kind != SCHED_PROMPT_LOGPROBS)
    return herr_set(err, HEARTH_EINVAL, "probe: unknown kind %d", (int)kind);
  if (n <= 0) return herr_set(err, HEARTH_EINVAL, "probe: no inputs");
  for (int i = 0; i < n; i++) {
    if (!p[i].ids || p[i].n_ids == 0) return herr_set(err, HEARTH_EINVAL, "input %d has no tokens", i);
    if (kind == SCHED_PROMPT_LOGPROBS ? !p[i].lp || p[i].n_top < 0 || p[i].n_top > SAMPLE_MAX_TOP_LOGPROBS : !p[i].out)
      return herr_set(err, HEARTH_EINVAL, "probe: input %d has nowhere to write", i);
    if (p[i].pool < SCHED_POOL_LAST || p[i].pool > SCHED_POOL_MAX || (p[i].pool && kind != SCHED_EMBED))
      return herr_set(err, HEARTH_EINVAL, "probe: input %d asks for pooling %d, which this kind has not", i, (int)p[i].pool);
    for (size_t j = 0; j < p[i].n_ids; j++)
      if (p[i].ids[j] < 0 || p[i].ids[j] >= s->vocab)
        return herr_set(err, HEARTH_EINVAL, "input %d: token %zu is id %d, outside the vocabulary (size %lld)", i, j,
                        (int)p[i].ids[j], (long long)s->vocab);
    if ((int64_t)p[i].n_ids > s->ctx)
      return herr_set(err, HEARTH_ELIMIT, "context_length_exceeded: input %d has %zu tokens but the context length is %lld",
                      i, p[i].n_ids, (long long)s->ctx);
    int rc = sched_admit(s, (int64_t)p[i].n_ids, 0, err);
    if (rc) return rc;
  }
  bool pooled = false;
  for (int i = 0; i < n; i++) pooled |= p[i].pool != SCHED_POOL_LAST;
  if (pooled) { /* a step's hidden rows, for pooled embeddings (made once; the engine reads it after the queue's lock) */
    pthread_mutex_lock(&s->mu);
    if (!s->hrows) s->hrows = malloc(sizeof(float) * (size_t)s->step_tokens * (size_t)model_cfg(s->m)->hidden_size);
    bool ok = s->hrows != NULL;
    pthread_mutex_unlock(&s->mu);
    if (!ok) return herr_set(err, HEARTH_ENOMEM, "probe: out of memory for the hidden states of a step");
  }
  /* each probe: its sequence, a request (for its prompt and cancel flag), result and error */
  typedef struct probe_slot {
    sseq q;
    gen_request req;
    gen_result res;
    herr err;
  } probe_slot;
  probe_slot *ps = calloc((size_t)n, sizeof *ps);
  if (!ps) return herr_set(err, HEARTH_ENOMEM, "probe: out of memory for %d inputs", n);
  int rc = 0;
  for (int i = 0; i < n && !rc; i++) {
    probe_slot *x = &ps[i];
    gen_request_init(&x->req);
    x->req.prompt = p[i].ids;
    x->req.n_prompt = p[i].n_ids;
    x->req.max_tokens = 0;
    x->req.cancel = cancel;
    x->res.prompt_tokens = (int64_t)p[i].n_ids;
    x->q = (sseq){.req = &x->req, .res = &x->res, .err = &x->err, .kind = (int)kind, .dest = p[i].out, .pool = (int)p[i].pool,
                  .plp = p[i].lp, .plp_top = p[i].n_top};
    if (kind == SCHED_PROMPT_LOGPROBS) x->req.prefill_chunk = 64; /* a logits row per token comes to the host */
    x->q.toks = malloc(sizeof(int32_t) * p[i].n_ids);
    if (!x->q.toks) rc = herr_set(err, HEARTH_ENOMEM, "probe: out of memory for input %d", i);
    else memcpy(x->q.toks, p[i].ids, sizeof(int32_t) * p[i].n_ids);
    x->q.n_toks = x->q.cap_toks = (int64_t)p[i].n_ids;
  }
  if (!rc) {
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
      rc = herr_set(err, HEARTH_ECANCELLED, "probe: the engine is shutting down");
    } else {
      for (int i = 0; i < n; i++) queue_push_back(s, &ps[i].q);
      pthread_cond_signal(&s->work_cv);
      for (int i = 0; i < n; i++)
        while (!ps[i].q.done) pthread_cond_wait(&s->done_cv, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
  }
  for (int i = 0; i < n && !rc; i++) {
    p[i].cached_tokens = ps[i].res.cached_tokens;
    if (ps[i].q.rc) {
      rc = ps[i].q.rc;
      if (err) *err = ps[i].err;
    }
  }
  for (int i = 0; i < n; i++) seq_state_free(&ps[i].q);
  free(ps);
  return rc;
}
