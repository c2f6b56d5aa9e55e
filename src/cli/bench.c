/* bench.c — `hearth bench`: prompt-processing and generation speed of a
 * model, measured as llama-bench does. pp: one forward over P prompt tokens
 * into an empty cache; tg: N single-token forward steps into another empty
 * cache (after one untimed token; logits computed, no sampling), or with -d
 * D into a cache already holding D tokens (decode speed at that context). One
 * untimed warm-up pass first (the first pass over freshly mapped weights is
 * slower); the median of the repeats is reported. Token ids are fixed pseudo-random
 * ids of the vocabulary. Uses the internal model, KV cache and backend
 * interfaces (model/model.h, engine/kv_cache.h, backend/backend.h), not
 * hearth.h: it times bare forward passes, which the public API does not
 * expose. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "base/pool.h"
#include "cli/cli.h"
#include "engine/kv_cache.h"
#include "engine/kv_paged.h"
#include "model/model.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: hearth bench [--model M] [-p 512] [-n 128] [-d 0] [-t THREADS] [--repeat R] [--no-warmup] [--roofline] [--profile]\n"
          "                    [--json]\n"
          "                    [--device cpu|cuda|cuda:N|auto]\n\n"
          "Measures prompt processing (one forward over P tokens) and generation (N single-token\n"
          "steps from an empty cache, no sampling) in tokens/s, median of R repeats (default 3),\n"
          "after one untimed warm-up pass (--no-warmup skips it).\n"
          "-d D: the N generation steps start at a context of D tokens (prefilled untimed).\n"
          "--kv-quant 8|4|fp8 stores the KV cache quantized (see hearth --help); the output names the format.\n"
          "-p 0 or -n 0 skips that part. --roofline also measures the device's copy bandwidth\n"
          "(a 1 GiB buffer copied on the device, bytes read + written) and reports generation's\n"
          "weight traffic (weight bytes x tokens/s) as a share of it. --profile (CPU) breaks the\n"
          "generation steps down: wall time per step of each matmul (by weight shape, with the GB/s\n"
          "its weights were read at), of attention, and of the rest of the step.\n"
          "--json prints one line:\n"
          "{\"pp_tps\": ..., \"tg_tps\": ..., \"threads\": ..., \"device\": ..., \"model\": ...}\n");
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  if (n <= 0) return 0;
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* A fresh cache with one sequence of up to max_len tokens (allocated up front). */
static int fresh_seq(model *m, int64_t max_len, kv_cache **cache, kv_seq **seq, herr *err) {
  model_kv_geometry geo;
  *cache = NULL;
  *seq = NULL;
  int rc = cli_kv_geometry(m, &geo, err);
  if (!rc) rc = kv_cache_new(&geo, max_len, cache, err);
  if (!rc) rc = kv_cache_seq_new(*cache, seq, err);
  return rc;
}

static int step(model *m, kv_seq *seq, const int32_t *tokens, int n, float *logits, herr *err) {
  model_seq sq = {.kv = seq, .tokens = tokens, .n_tokens = n};
  model_batch b = {&sq, 1};
  return model_forward(m, &b, logits, err);
}

/* One repeat: pp over `prompt` into an empty cache; then, into another empty
 * cache, one untimed token and N timed single steps. Times in seconds (a
 * part is skipped when its count is 0). */
static int run_once(model *m, const int32_t *prompt, int P, const int32_t *gen, int N, const int32_t *ctx, int D, float *logits,
                    bool profile, double *pp_s, double *tg_s, herr *err) {
  kv_cache *cache = NULL;
  kv_seq *seq = NULL;
  int rc = 0;
  *pp_s = *tg_s = 0;
  if (P > 0) {
    rc = fresh_seq(m, P, &cache, &seq, err);
    double t0 = now_s();
    if (!rc) rc = step(m, seq, prompt, P, logits, err);
    *pp_s = now_s() - t0;
    kv_cache_seq_free(seq);
    kv_cache_free(cache);
  }
  if (!rc && N > 0) {
    rc = fresh_seq(m, (int64_t)D + N + 1, &cache, &seq, err);
    for (int at = 0; !rc && at < D; at += 2048) rc = step(m, seq, ctx + at, D - at < 2048 ? D - at : 2048, logits, err);
    if (!rc) rc = step(m, seq, prompt, 1, logits, err);
    if (profile) bk_cpu_profile(model_backend(m), true); /* the timed steps only; a repeat starts afresh */
    double t0 = now_s();
    for (int i = 0; !rc && i < N; i++) rc = step(m, seq, gen + i, 1, logits, err);
    *tg_s = now_s() - t0;
    if (profile) bk_cpu_profile(model_backend(m), false);
    kv_cache_seq_free(seq);
    kv_cache_free(cache);
  }
  return rc;
}

/* The device's copy bandwidth: a 1 GiB buffer copied within the device, bytes read
 * plus written over the time, median of 5 after one warm-up. */
static int copy_bandwidth(bk_backend *be, double *gbs, herr *err) {
  const int64_t n = (int64_t)1 << 28; /* floats: 1 GiB */
  bk_tensor a, b;
  int rc = bk_tensor_new(be, BK_DT_F32, n, 1, &a, err);
  if (rc) return rc;
  if ((rc = bk_tensor_new(be, BK_DT_F32, n, 1, &b, err))) {
    bk_tensor_free(&a);
    return rc;
  }
  double t[5];
  for (int i = -1; i < 5 && !rc; i++) {
    double t0 = now_s();
    bk_copy(&b, 0, &a, 0, bk_nbytes(&a));
    rc = bk_sync(be, err);
    if (i >= 0) t[i] = now_s() - t0;
  }
  bk_tensor_free(&a);
  bk_tensor_free(&b);
  if (!rc) *gbs = 2.0 * (double)n * 4 / median(t, 5) / 1e9;
  return rc;
}

/* --profile: the last repeat's N generation steps, per step. */
static json_t *profile_json(bk_backend *be, int N, double tg_s) {
  bk_prof_entry e[BK_PROF_MAX];
  int n = bk_cpu_profile_read(be, e, BK_PROF_MAX);
  n = n < BK_PROF_MAX ? n : BK_PROF_MAX;
  json_t *ops = json_array();
  double sum = 0;
  for (int i = 0; i < n; i++) {
    sum += e[i].seconds;
    json_t *o = json_pack("{s:s, s:I, s:I, s:f, s:f, s:f}", "op", e[i].op, "rows", (json_int_t)e[i].rows, "cols",
                          (json_int_t)e[i].cols, "calls_per_step", (double)e[i].calls / N, "ms_per_step",
                          1e3 * e[i].seconds / N, "gbs", e[i].seconds > 0 ? e[i].bytes / e[i].seconds / 1e9 : 0.0);
    if (o) json_array_append_new(ops, o);
  }
  return json_pack("{s:f, s:o, s:f}", "step_ms", 1e3 * tg_s / N, "ops", ops, "rest_ms", 1e3 * (tg_s - sum) / N);
}

static void profile_print(bk_backend *be, int N, double tg_s) {
  bk_prof_entry e[BK_PROF_MAX];
  int n = bk_cpu_profile_read(be, e, BK_PROF_MAX);
  n = n < BK_PROF_MAX ? n : BK_PROF_MAX;
  double step = tg_s / N, sum = 0;
  printf("profile  one generation step of the last repeat: %.3f ms\n", 1e3 * step);
  for (int i = 0; i < n; i++) {
    sum += e[i].seconds;
    double ms = 1e3 * e[i].seconds / N, pct = step > 0 ? 100 * e[i].seconds / N / step : 0;
    if (e[i].rows)
      printf("  %-9s %6lldx%-6lld x%-4g %8.3f ms %5.1f%%  %6.1f GB/s\n", e[i].op, (long long)e[i].rows, (long long)e[i].cols,
             (double)e[i].calls / N, ms, pct, e[i].seconds > 0 ? e[i].bytes / e[i].seconds / 1e9 : 0);
    else
      printf("  %-23s x%-4g %8.3f ms %5.1f%%\n", e[i].op, (double)e[i].calls / N, ms, pct);
  }
  printf("  %-23s       %8.3f ms %5.1f%%\n", "rest", 1e3 * (tg_s - sum) / N, step > 0 ? 100 * (tg_s - sum) / N / step : 0);
}

int cli_bench(int argc, char **argv) {
  const char *dir = NULL;
  long long P_ = 512, N_ = 128, D_ = 0, repeat_ = 3;
  int threads = -1; /* -t; else --threads */
  bool json = false, warmup = true, roofline = false, profile = false;
  for (int i = 1; i < argc; i++) {
    int r;
    if (cli_is_help(argv[i])) {
      usage(stdout);
      return 0;
    }
    if ((r = cli_opt(argc, argv, &i, "--model", &dir))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt_int("bench", argc, argv, &i, "-p", 0, 1000000, &P_)) ||
               (r = cli_opt_int("bench", argc, argv, &i, "-n", 0, 1000000, &N_)) ||
               (r = cli_opt_int("bench", argc, argv, &i, "-d", 0, 1000000, &D_)) ||
               (r = cli_opt_threads("bench", argc, argv, &i, "-t", &threads)) ||
               (r = cli_opt_int("bench", argc, argv, &i, "--repeat", 1, 100, &repeat_))) {
      if (r < 0) return 2;
    } else if (!strcmp(argv[i], "--no-warmup")) {
      warmup = false;
    } else if (!strcmp(argv[i], "--roofline")) {
      roofline = true;
    } else if (!strcmp(argv[i], "--profile")) {
      profile = true;
    } else if (!strcmp(argv[i], "--json")) {
      json = true;
    } else {
      return cli_usage_error("bench", "unknown argument '%s'", argv[i]);
    }
  }
  int P = (int)P_, N = (int)N_, D = (int)D_, repeat = (int)repeat_;
  if (!dir) dir = cli_default_model();
  if (!dir) return cli_usage_error("bench", "no --model given and no built-in model found");
  if (P == 0 && N == 0) return cli_usage_error("bench", "-p and -n are both 0: nothing to measure");

  herr err = {0};
  model *m = NULL;
  const cli_load *cl = cli_load_opts();
  model_load_opts opts = {.threads = threads >= 0 ? threads : cl->threads, .device = cl->device, .cpu_level = cl->cpu_level,
                          .mmap = cl->mmap, .f32_activations = cl->f32_activations, .f32_as_bf16 = cl->f32_as_bf16,
                          .no_graphs = cl->no_cuda_graphs, .fast_matmul = cl->gpu_fast_matmul};
  if (threads < 0) threads = cl->threads;
  if (model_load(dir, &opts, &m, &err) || model_config_check(model_cfg(m), dir, &err) || cli_context_check(m, &err)) {
    model_free(m);
    return cli_fail("%s", err.msg);
  }
  const model_config *c = model_cfg(m);
  int64_t V = model_vocab_size(m);
  if (c->max_position_embeddings > 0 && P + D + N + 1 > c->max_position_embeddings)
    fprintf(stderr, "hearth bench: note: %d tokens exceed max_position_embeddings %lld\n", P + D + N + 1,
            (long long)c->max_position_embeddings);
  if (profile && (!bk_backend_is_cpu(model_backend(m)) || N == 0)) {
    model_free(m);
    return cli_usage_error("bench", "--profile needs the CPU device and -n > 0");
  }
  int32_t *prompt = malloc((size_t)(P > 0 ? P : 1) * sizeof *prompt), *gen = malloc((size_t)(N > 0 ? N : 1) * sizeof *gen);
  float *logits = malloc((size_t)V * sizeof(float));
  int32_t *ctx = malloc((size_t)(D > 0 ? D : 1) * sizeof *ctx);
  double *pp = calloc((size_t)repeat, sizeof *pp), *tg = calloc((size_t)repeat, sizeof *tg);
  int status = 1;
  if (!prompt || !gen || !logits || !pp || !tg || !ctx) {
    cli_fail("out of memory");
    goto out;
  }
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < (P > 0 ? P : 1); i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    prompt[i] = (int32_t)(x % (uint64_t)V);
  }
  for (int i = 0; i < N; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    gen[i] = (int32_t)(x % (uint64_t)V);
  }
  for (int i = 0; i < D; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    ctx[i] = (int32_t)(x % (uint64_t)V);
  }
  if (warmup) {
    double ps, ts;
    if (run_once(m, prompt, P < 32 ? P : 32, gen, N < 2 ? N : 2, ctx, 0, logits, false, &ps, &ts, &err)) {
      cli_fail("%s", err.msg);
      goto out;
    }
  }
  double tg_last_s = 0; /* the last repeat's generation time: the one --profile describes */
  for (int r = 0; r < repeat; r++) {
    double ps, ts;
    if (run_once(m, prompt, P, gen, N, ctx, D, logits, profile, &ps, &ts, &err)) {
      cli_fail("%s", err.msg);
      goto out;
    }
    pp[r] = P > 0 && ps > 0 ? P / ps : 0;
    tg[r] = N > 0 && ts > 0 ? N / ts : 0;
    tg_last_s = ts;
    if (!json) fprintf(stderr, "repeat %d: pp%d %.2f t/s, tg%d %.2f t/s\n", r + 1, P, pp[r], N, tg[r]);
  }
  double pp_med = median(pp, repeat), tg_med = median(tg, repeat);
  char kvfmt[128];
  model_kv_geometry kg;
  if (cli_kv_geometry(m, &kg, &err)) {
    cli_fail("%s", err.msg);
    goto out;
  }
  kv_format_describe(&kg, kvfmt, sizeof kvfmt);
  int nthreads = threads > 0 ? threads : hpool_cpu_count(); /* the pool's size */
  const char *dev = bk_backend_name(model_backend(m));
  double wgb = (double)model_weight_bytes(m) / 1e9, copy_gbs = 0;
  if (roofline && copy_bandwidth(model_backend(m), &copy_gbs, &err)) {
    cli_fail("%s", err.msg);
    goto out;
  }
  if (json) {
    json_t *j = json_pack("{s:f, s:f, s:i, s:s, s:s}", "pp_tps", pp_med, "tg_tps", tg_med, "threads", nthreads, "device", dev, "model", dir);
    if (j && D > 0) json_object_set_new(j, "depth", json_integer(D));
    if (j) json_object_set_new(j, "kv", json_string(kvfmt));
    if (j && roofline) {
      json_object_set_new(j, "weights_gb", json_real(wgb));
      json_object_set_new(j, "copy_gbs", json_real(copy_gbs));
      json_object_set_new(j, "tg_roofline", json_real(copy_gbs > 0 ? wgb * tg_med / copy_gbs : 0));
    }
    if (j && profile) json_object_set_new(j, "tg_profile", profile_json(model_backend(m), N, tg_last_s));
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (s) printf("%s\n", s);
    free(s);
    json_decref(j);
  } else {
    printf("model    %s (%s, %lld layers, hidden %lld)\n", dir, c->model_type, (long long)c->num_hidden_layers, (long long)c->hidden_size);
    printf("device   %s\n", dev);
    if (bk_backend_is_cpu(model_backend(m))) printf("threads  %d\n", nthreads);
    printf("kv       %s\n", kvfmt);
    if (P > 0) printf("pp%-6d %.2f tokens/s\n", P, pp_med);
    if (N > 0 && D > 0) printf("tg%-6d %.2f tokens/s at a context of %d tokens\n", N, tg_med, D);
    else if (N > 0) printf("tg%-6d %.2f tokens/s\n", N, tg_med);
    if (roofline && N > 0)
      printf("roofline %.2f GB of weights x %.2f tokens/s = %.1f GB/s, %.1f%% of the %.1f GB/s copy bandwidth\n", wgb, tg_med,
             wgb * tg_med, copy_gbs > 0 ? 100 * wgb * tg_med / copy_gbs : 0, copy_gbs);
    printf("(median of %d repeats)\n", repeat);
    if (profile) profile_print(model_backend(m), N, tg_last_s);
  }
  status = 0;
out:
  free(prompt), free(gen), free(logits), free(pp), free(tg), free(ctx);
  model_free(m);
  return status;
}
