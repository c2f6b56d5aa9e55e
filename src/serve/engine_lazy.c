/* engine_lazy.c — models loaded on first use: a serve_engine that stands in
 * for a model not loaded yet, opening the real engine when a request acquires
 * it and forwarding every call to it. A pool holds such engines under one
 * budget of bytes: a model that does not fit beside the loaded ones unloads
 * the least recently used idle ones first, or waits for one in use to go idle;
 * one larger than the budget is refused with the numbers. An idle model is
 * unloaded after the pool's time to live. Knows models only as serve_engine;
 * knows nothing of HTTP. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "serve/engine.h"

#define WAIT_FOR_ROOM_S 120.0 /* a model waits this long for models in use to go idle */
#define TTL_SCAN_MS 200       /* idle models are looked at this often */

typedef struct lazy {
  serve_lazy_pool *pool;  /* borrowed */
  serve_engine *self;     /* borrowed: the stand-in the server holds (its fields follow the real engine's) */
  const char *id;         /* borrowed */
  int64_t bytes;
  int (*open)(void *ctx, serve_engine *out, herr *err);
  void *ctx;
  serve_engine real;      /* owned while loaded */
  bool loaded, loading;
  int users;              /* requests holding it (acquire .. release) */
  double last_used;       /* monotonic seconds */
  double expires;         /* once idle, unloaded at this time (monotonic seconds; 0: not before it must make room) */
  bool unload_asked;      /* unloaded as soon as its requests are done */
  struct lazy *next;      /* the pool's list */
} lazy;

struct serve_lazy_pool {
  pthread_mutex_t mu;
  pthread_cond_t cv;      /* a model loaded, unloaded or released */
  int64_t budget, used;   /* used: the pinned bytes and the loaded (or loading) models' */
  double ttl;
  lazy *all;
  pthread_t ttl_thread;
  bool thread_started, stop;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the calls, forwarded to the loaded engine (the caller holds it: acquire) ---- */

#define REAL(impl) (&((lazy *)(impl))->real)

static int f_render_chat(void *impl, const serve_message *msgs, int nmsgs, const serve_chat_opts *o, char **prompt,
                         herr *err) {
  return REAL(impl)->render_chat(REAL(impl)->impl, msgs, nmsgs, o, prompt, err);
}
static int f_count_tokens(void *impl, const char *prompt, bool raw, int64_t *n, herr *err) {
  return REAL(impl)->count_tokens(REAL(impl)->impl, prompt, raw, n, err);
}
static int f_tokenize(void *impl, const char *text, bool add_special, int32_t **ids, size_t *n, herr *err) {
  return REAL(impl)->tokenize(REAL(impl)->impl, text, add_special, ids, n, err);
}
static int f_detokenize(void *impl, const int32_t *ids, size_t n, char **text, size_t *len, herr *err) {
  return REAL(impl)->detokenize(REAL(impl)->impl, ids, n, text, len, err);
}
static int f_generate(void *impl, const char *prompt, bool raw, const serve_sampling *s, serve_token_fn fn, void *ctx,
                      volatile int *cancel, serve_result *res, herr *err) {
  return REAL(impl)->generate(REAL(impl)->impl, prompt, raw, s, fn, ctx, cancel, res, err);
}
static int f_generate_media(void *impl, const char *prompt, bool raw, const hearth_media *media, int n_media,
                            const serve_sampling *s, serve_token_fn fn, void *ctx, volatile int *cancel,
                            serve_result *res, herr *err) {
  return REAL(impl)->generate_media(REAL(impl)->impl, prompt, raw, media, n_media, s, fn, ctx, cancel, res, err);
}
static int f_generate_ids(void *impl, const int32_t *ids, size_t n_ids, const serve_sampling *s, serve_token_fn fn,
                          void *ctx, volatile int *cancel, serve_result *res, herr *err) {
  return REAL(impl)->generate_ids(REAL(impl)->impl, ids, n_ids, s, fn, ctx, cancel, res, err);
}
static int f_admit(void *impl, int64_t n_prompt, int64_t max_tokens, herr *err) {
  return REAL(impl)->admit(REAL(impl)->impl, n_prompt, max_tokens, err);
}
static void f_stats(void *impl, serve_stats *out) { REAL(impl)->stats(REAL(impl)->impl, out); }
static int f_embed(void *impl, const serve_embed_input *in, int n, const char *instruction, int dimensions, float *out,
                   int64_t *prompt_tokens, volatile int *cancel, herr *err) {
  return REAL(impl)->embed(REAL(impl)->impl, in, n, instruction, dimensions, out, prompt_tokens, cancel, err);
}
static int f_signal(void *impl, const char *prompt, bool raw, const int32_t *ids, size_t n_ids, int bins, int top,
                    serve_signal *out, volatile int *cancel, herr *err) {
  return REAL(impl)->signal(REAL(impl)->impl, prompt, raw, ids, n_ids, bins, top, out, cancel, err);
}
static int f_fit(void *impl, int64_t context, int batch, char **json, herr *err) {
  return REAL(impl)->fit(REAL(impl)->impl, context, batch, json, err);
}
static int f_adapter_load(void *impl, const char *name, const char *path, herr *err) {
  return REAL(impl)->adapter_load(REAL(impl)->impl, name, path, err);
}
static int f_adapter_unload(void *impl, const char *name, herr *err) {
  return REAL(impl)->adapter_unload(REAL(impl)->impl, name, err);
}
static int f_adapter_list(void *impl, hearth_adapter_info *out, int max) {
  return REAL(impl)->adapter_list(REAL(impl)->impl, out, max);
}

/* The stand-in takes the loaded engine's facts, and its optional calls where it has them. */
static void follow(lazy *l) {
  serve_engine *s = l->self, *r = &l->real;
  s->context_length = r->context_length;
  s->vocab_size = r->vocab_size;
  s->created = r->created;
  s->thread_safe = r->thread_safe;
  s->tool_format = r->tool_format;
  s->reasoning = r->reasoning;
  s->media_kinds = r->media_kinds;
  s->denoising = r->denoising;
  s->chat_template = r->chat_template;
  s->spec_method = r->spec_method;
  s->embed_dim = r->embed_dim;
  s->generate_media = r->generate_media ? f_generate_media : NULL;
  s->generate_ids = r->generate_ids ? f_generate_ids : NULL;
  s->admit = r->admit ? f_admit : NULL;
  s->stats = r->stats ? f_stats : NULL;
  s->embed = r->embed ? f_embed : NULL;
  s->signal = r->signal ? f_signal : NULL;
  s->fit = r->fit ? f_fit : NULL;
  s->adapter_load = r->adapter_load ? f_adapter_load : NULL;
  s->adapter_unload = r->adapter_unload ? f_adapter_unload : NULL;
  s->adapter_list = r->adapter_list ? f_adapter_list : NULL;
}

/* Under the pool's lock: l's model goes (it is idle). */
static void unload(lazy *l, const char *why) {
  HLOG_INFO("serve: unloading %s (%s)", l->id, why);
  serve_engine_close(&l->real);
  l->loaded = false;
  l->unload_asked = false;
  l->pool->used -= l->bytes;
  pthread_cond_broadcast(&l->pool->cv);
}

/* Under the pool's lock: the least recently used idle loaded model other than l, or NULL. */
static lazy *idlest(serve_lazy_pool *p, const lazy *l) {
  lazy *best = NULL;
  for (lazy *x = p->all; x; x = x->next)
    if (x != l && x->loaded && !x->users && (!best || x->last_used < best->last_used)) best = x;
  return best;
}

static void wait_until(serve_lazy_pool *p, double deadline) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  double left = deadline - now_s();
  if (left > 1) left = 1; /* wake now and then */
  if (left < 0) left = 0;
  long ns = ts.tv_nsec + (long)(left * 1e9);
  ts.tv_sec += ns / 1000000000L;
  ts.tv_nsec = ns % 1000000000L;
  pthread_cond_timedwait(&p->cv, &p->mu, &ts);
}

static int acquire(void *impl, herr *err) {
  lazy *l = impl;
  serve_lazy_pool *p = l->pool;
  double deadline = now_s() + WAIT_FOR_ROOM_S;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    if (l->loaded) {
      l->users++;
      pthread_mutex_unlock(&p->mu);
      return 0;
    }
    if (l->loading) { /* another request loads it: wait for that */
      wait_until(p, now_s() + 1);
      continue;
    }
    lazy *v; /* room: idle models go, least recently used first */
    while (p->budget && p->used + l->bytes > p->budget && (v = idlest(p, l))) unload(v, "least recently used, to make room");
    if (p->budget && p->used + l->bytes > p->budget) {
      int64_t busy = 0;
      for (lazy *x = p->all; x; x = x->next)
        if (x != l && (x->loaded || x->loading)) busy += x->bytes;
      int64_t pinned = p->used - busy;
      if (l->bytes + pinned > p->budget) { /* never fits, however many models go */
        pthread_mutex_unlock(&p->mu);
        return herr_set_at(err, HEARTH_ELIMIT, "model", HEARTH_CAUSE_MEMORY_ADMISSION,
                          "memory_admission: model '%s' takes %lld bytes, but the model memory budget is %lld bytes "
                          "(%lld of them held by the models that stay loaded)",
                          l->id, (long long)l->bytes, (long long)p->budget, (long long)pinned);
      }
      if (now_s() >= deadline) {
        pthread_mutex_unlock(&p->mu);
        return herr_set_at(err, HEARTH_ELIMIT, "model", HEARTH_CAUSE_MEMORY_ADMISSION,
                          "memory_admission: model '%s' takes %lld bytes; the models in use hold %lld of the %lld-byte "
                          "budget and did not go idle within %.0f s",
                          l->id, (long long)l->bytes, (long long)p->used, (long long)p->budget, WAIT_FOR_ROOM_S);
      }
      wait_until(p, deadline); /* for a model in use to go idle */
      continue;
    }
    l->loading = true;
    p->used += l->bytes;
    pthread_mutex_unlock(&p->mu);
    HLOG_INFO("serve: loading %s", l->id);
    serve_engine real;
    memset(&real, 0, sizeof real);
    int rc = l->open(l->ctx, &real, err);
    pthread_mutex_lock(&p->mu);
    l->loading = false;
    if (rc) {
      p->used -= l->bytes;
      pthread_cond_broadcast(&p->cv);
      pthread_mutex_unlock(&p->mu);
      return rc;
    }
    l->real = real;
    l->loaded = true;
    l->last_used = now_s();
    l->expires = 0;
    follow(l);
    pthread_cond_broadcast(&p->cv);
  }
}

static void release(void *impl, double keep_alive_s) {
  lazy *l = impl;
  serve_lazy_pool *p = l->pool;
  pthread_mutex_lock(&p->mu);
  if (l->users > 0) l->users--;
  l->last_used = now_s();
  double keep = keep_alive_s < 0 ? p->ttl : keep_alive_s;
  l->expires = keep_alive_s < 0 && p->ttl <= 0 ? 0 : l->last_used + keep;
  if ((keep_alive_s == 0 || l->unload_asked) && l->loaded && !l->users) unload(l, l->unload_asked ? "asked to" : "keep_alive 0");
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

static void unload_soon(void *impl) {
  lazy *l = impl;
  pthread_mutex_lock(&l->pool->mu);
  if (l->loaded && !l->users) unload(l, "asked to");
  else if (l->loaded) l->unload_asked = true; /* once its requests are done (release) */
  pthread_mutex_unlock(&l->pool->mu);
}

static bool is_loaded(void *impl) {
  lazy *l = impl;
  pthread_mutex_lock(&l->pool->mu);
  bool on = l->loaded;
  pthread_mutex_unlock(&l->pool->mu);
  return on;
}

static void destroy(void *impl) {
  lazy *l = impl;
  serve_lazy_pool *p = l->pool;
  pthread_mutex_lock(&p->mu);
  if (l->loaded) unload(l, "the server stops");
  for (lazy **x = &p->all; *x; x = &(*x)->next)
    if (*x == l) {
      *x = l->next;
      break;
    }
  pthread_mutex_unlock(&p->mu);
  free(l);
}

/* Unloads the models idle for the pool's time to live. */
static void *ttl_main(void *arg) {
  serve_lazy_pool *p = arg;
  pthread_mutex_lock(&p->mu);
  while (!p->stop) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += TTL_SCAN_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    double now = now_s();
    for (lazy *x = p->all; x && !p->stop; x = x->next)
      if (x->loaded && !x->users && x->expires > 0 && now >= x->expires)
        unload(x, x->expires == x->last_used + p->ttl ? "idle past --model-ttl" : "idle past its keep_alive");
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

int serve_lazy_pool_new(int64_t budget, double ttl_s, int64_t pinned_bytes, serve_lazy_pool **out, herr *err) {
  *out = NULL;
  serve_lazy_pool *p = calloc(1, sizeof *p);
  if (!p) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  p->budget = budget > 0 ? budget : 0;
  p->used = pinned_bytes > 0 ? pinned_bytes : 0;
  p->ttl = ttl_s > 0 ? ttl_s : 0;
  if (p->budget && p->used > p->budget) {
    int64_t used = p->used;
    serve_lazy_pool_free(p);
    return herr_set_at(err, HEARTH_ELIMIT, "model", HEARTH_CAUSE_MEMORY_ADMISSION,
                      "the models that stay loaded take %lld bytes, more than the model memory budget of %lld",
                      (long long)used, (long long)budget);
  }
  { /* idle models past their time: the pool's ttl, or a request's keep_alive */
    if (pthread_create(&p->ttl_thread, NULL, ttl_main, p)) {
      serve_lazy_pool_free(p);
      return herr_set(err, HEARTH_EINTERNAL, "cannot start the model time-to-live thread");
    }
    p->thread_started = true;
  }
  *out = p;
  return 0;
}

void serve_lazy_pool_free(serve_lazy_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stop = true;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  if (p->thread_started) pthread_join(p->ttl_thread, NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p);
}

int serve_engine_lazy(serve_lazy_pool *p, const char *id, int64_t bytes,
                      int (*open)(void *ctx, serve_engine *out, herr *err), void *ctx, serve_engine *out, herr *err) {
  memset(out, 0, sizeof *out);
  lazy *l = calloc(1, sizeof *l);
  if (!l) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  l->pool = p;
  l->self = out;
  l->id = id;
  l->bytes = bytes > 0 ? bytes : 0;
  l->open = open;
  l->ctx = ctx;
  out->impl = l;
  out->model_id = id;
  out->created = (int64_t)time(NULL);
  out->thread_safe = true;
  out->render_chat = f_render_chat;
  out->count_tokens = f_count_tokens;
  out->tokenize = f_tokenize;
  out->detokenize = f_detokenize;
  out->generate = f_generate;
  out->destroy = destroy;
  out->acquire = acquire;
  out->release = release;
  out->is_loaded = is_loaded;
  out->unload = unload_soon;
  pthread_mutex_lock(&p->mu);
  l->next = p->all;
  p->all = l;
  pthread_mutex_unlock(&p->mu);
  return 0;
}
