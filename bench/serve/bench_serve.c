/* bench_serve.c — continuous batching through the public API: aggregate
 * decode tokens/s at several concurrencies (each client thread calls
 * hearth_generate at once; the scheduler batches them), and the time to
 * first token of a request whose 1,000-token prefix is cached against one
 * whose prefix is not. The peer measured in the same run is concurrency 1.
 *
 *   bench_serve MODEL_DIR [THREADS] [NEW_TOKENS]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hearth.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct client {
  hearth_model *m;
  int32_t prompt[64];
  int n_new;
  hearth_gen_result res;
  double t_submit, t_first;
} client;

static int on_token(void *user, const char *text, size_t len, const hearth_token *tok) {
  (void)text, (void)len;
  client *c = user;
  if (tok && c->t_first == 0) c->t_first = now();
  return 0;
}

static void *client_main(void *arg) {
  client *c = arg;
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.max_tokens = c->n_new;
  p.temperature = 0;
  p.ignore_eos = true;
  hearth_prompt pr = {.ids = c->prompt, .n_ids = 16};
  hearth_error e = {0};
  c->t_submit = now();
  if (hearth_generate(c->m, &pr, &p, on_token, c, &c->res, &e)) fprintf(stderr, "generate: %s\n", e.msg);
  return NULL;
}

static double ttft(hearth_model *m, const int32_t *ids, size_t n, int64_t *cached) {
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.max_tokens = 1;
  p.temperature = 0;
  client c = {.m = m};
  hearth_prompt pr = {.ids = ids, .n_ids = n};
  hearth_error e = {0};
  c.t_submit = now();
  if (hearth_generate(m, &pr, &p, on_token, &c, &c.res, &e)) fprintf(stderr, "generate: %s\n", e.msg);
  *cached = c.res.cached_tokens;
  return c.t_first - c.t_submit;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_serve MODEL_DIR [THREADS] [NEW_TOKENS]\n");
    return 2;
  }
  int threads = argc > 2 ? atoi(argv[2]) : 0, n_new = argc > 3 ? atoi(argv[3]) : 64;
  hearth_load_opts o = {.threads = threads, .max_batch = 64};
  hearth_model *m;
  hearth_error e = {0};
  if (hearth_model_load(argv[1], &o, &m, &e)) {
    fprintf(stderr, "%s\n", e.msg);
    return 1;
  }
  hearth_info info;
  hearth_model_info(m, &info);
  int conc[] = {1, 4, 16, 64};
  double base = 0;
  printf("| concurrency | decode tokens | seconds | aggregate tokens/s | vs concurrency 1 |\n|---|---|---|---|---|\n");
  for (int k = 0; k < 4; k++) {
    int n = conc[k];
    client *cs = calloc((size_t)n, sizeof *cs);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    for (int i = 0; i < n; i++) {
      cs[i].m = m;
      cs[i].n_new = n_new;
      for (int t = 0; t < 16; t++) cs[i].prompt[t] = (int32_t)((t * 97 + i * 31 + k) % (info.vocab_size - 10) + 5);
    }
    double t0 = now();
    for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, client_main, &cs[i]);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
    double secs = now() - t0;
    int64_t toks = 0;
    for (int i = 0; i < n; i++) toks += cs[i].res.completion_tokens;
    double rate = (double)toks / secs;
    if (k == 0) base = rate;
    printf("| %d | %lld | %.2f | %.1f | %.2fx |\n", n, (long long)toks, secs, rate, rate / base);
    fflush(stdout);
    free(cs);
    free(th);
  }
  /* time to first token: a 1,000-token prompt cold, then one sharing its first 1,000 tokens */
  int32_t *a = malloc(sizeof(int32_t) * 1020), *b = malloc(sizeof(int32_t) * 1020);
  for (int i = 0; i < 1000; i++) a[i] = b[i] = (int32_t)((i * 7919) % (info.vocab_size - 10) + 5);
  for (int i = 1000; i < 1020; i++) a[i] = 7, b[i] = 9;
  int64_t ca = 0, cb = 0;
  double ta = ttft(m, a, 1020, &ca), tb = ttft(m, b, 1020, &cb);
  printf("\ntime to first token, 1,020-token prompt: cold %.3f s (cached_tokens %lld); sharing a 1,000-token prefix "
         "%.3f s (cached_tokens %lld); %.1fx faster\n",
         ta, (long long)ca, tb, (long long)cb, ta / tb);
  hearth_stats st;
  hearth_get_stats(m, &st);
  printf("engine: %lld steps, %lld preemptions, KV blocks used %lld of %lld\n", (long long)st.steps,
         (long long)st.preemptions, (long long)st.kv_blocks_used, (long long)st.kv_blocks_total);
  free(a);
  free(b);
  hearth_model_free(m);
  return 0;
}
