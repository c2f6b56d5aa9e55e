/* args.c — the value parsers and typed options every verb uses (see cli.h):
 * integers, reals, byte counts, token id lists, thread counts, the sampling
 * options of generate and chat, and the load options a verb's model gets.
 * One rule per kind of value, so that every verb accepts and refuses the
 * same spellings with the same message. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "base/vec.h"
#include "cli/cli.h"
#include "engine/kv_quant.h"

bool cli_parse_int(const char *s, long long lo, long long hi, long long *out) {
  if (!s || !*s || isspace((unsigned char)*s)) return false;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (end == s || *end || errno || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool cli_parse_double(const char *s, double lo, double hi, double *out) {
  if (!s || !*s || isspace((unsigned char)*s)) return false;
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end || errno || !isfinite(v) || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool cli_parse_bytes(const char *s, long long *out) {
  if (!s || !*s || !isdigit((unsigned char)*s)) return false;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || v < 1) return false;
  long long mul = 1;
  if (*end == 'K' || *end == 'k') mul = 1LL << 10, end++;
  else if (*end == 'M' || *end == 'm') mul = 1LL << 20, end++;
  else if (*end == 'G' || *end == 'g') mul = 1LL << 30, end++;
  if (*end || v > (1LL << 50) / mul) return false;
  *out = v * mul;
  return true;
}

bool cli_parse_threads(const char *s, int *out) {
  long long v;
  if (!cli_parse_int(s, 0, CLI_MAX_THREADS, &v)) return false;
  *out = (int)v;
  return true;
}

int cli_parse_ids(const char *s, int32_t **out, size_t *n) {
  *out = NULL;
  *n = 0;
  size_t cap = 16, k = 0;
  int32_t *ids = malloc(cap * sizeof *ids);
  if (!ids) return -1;
  const char *p = s;
  for (;;) {
    while (isspace((unsigned char)*p)) p++;
    if (!*p) break;
    if (!isdigit((unsigned char)*p)) goto bad;
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (errno || v > INT32_MAX) goto bad;
    if (k == cap && !HGROW(ids, cap, k + 1)) goto bad;
    ids[k++] = (int32_t)v;
    p = end;
    /* one separator: a comma (with any spaces around it) or spaces */
    while (isspace((unsigned char)*p)) p++;
    if (*p == ',') {
      p++;
      while (isspace((unsigned char)*p)) p++;
      if (!*p || *p == ',') goto bad; /* "1," or "1,,2" */
    }
  }
  if (!k) goto bad;
  *out = ids;
  *n = k;
  return 0;
bad:
  free(ids);
  return -1;
}

int cli_opt_int(const char *verb, int argc, char **argv, int *i, const char *name, long long lo, long long hi,
                long long *out) {
  const char *v;
  int r = cli_opt(argc, argv, i, name, &v);
  if (r <= 0) return r;
  if (!cli_parse_int(v, lo, hi, out)) {
    cli_usage_error(verb, "%s must be a whole number from %lld to %lld, not '%s'", name, lo, hi, v);
    return -1;
  }
  return 1;
}

int cli_opt_double(const char *verb, int argc, char **argv, int *i, const char *name, double lo, double hi,
                   double *out) {
  const char *v;
  int r = cli_opt(argc, argv, i, name, &v);
  if (r <= 0) return r;
  if (!cli_parse_double(v, lo, hi, out)) {
    cli_usage_error(verb, "%s must be a number from %g to %g, not '%s'", name, lo, hi, v);
    return -1;
  }
  return 1;
}

int cli_opt_ids(const char *verb, int argc, char **argv, int *i, const char *name, int32_t **ids, size_t *n) {
  const char *v;
  int r = cli_opt(argc, argv, i, name, &v);
  if (r <= 0) return r;
  free(*ids);
  if (cli_parse_ids(v, ids, n)) {
    cli_usage_error(verb, "%s must be token ids separated by commas or spaces (1,2,3 or \"1 2 3\"), not '%s'", name, v);
    return -1;
  }
  return 1;
}

int cli_opt_threads(const char *verb, int argc, char **argv, int *i, const char *name, int *threads) {
  const char *v;
  int r = cli_opt(argc, argv, i, name, &v);
  if (r <= 0) return r;
  if (!cli_parse_threads(v, threads)) {
    cli_usage_error(verb, "%s must be a thread count from 0 (one per CPU) to %d, not '%s'", name, CLI_MAX_THREADS, v);
    return -1;
  }
  return 1;
}

int cli_opt_sampling(const char *verb, int argc, char **argv, int *i, hearth_gen_params *p, bool *max_given) {
  long long k;
  double d;
  int r;
  if ((r = cli_opt_int(verb, argc, argv, i, "-n", -1, CLI_MAX_TOKENS, &k)) ||
      (r = cli_opt_int(verb, argc, argv, i, "--max-tokens", -1, CLI_MAX_TOKENS, &k))) {
    if (r > 0) {
      p->max_tokens = k;
      if (max_given) *max_given = true;
    }
    return r;
  }
  if ((r = cli_opt_double(verb, argc, argv, i, "--temp", 0, 1e6, &d)) ||
      (r = cli_opt_double(verb, argc, argv, i, "--temperature", 0, 1e6, &d))) {
    if (r > 0) p->temperature = d;
    return r;
  }
  if ((r = cli_opt_double(verb, argc, argv, i, "--top-p", 0, 1, &d))) {
    if (r > 0) p->top_p = d;
    return r;
  }
  if ((r = cli_opt_int(verb, argc, argv, i, "--top-k", 0, INT32_MAX, &k))) {
    if (r > 0) p->top_k = k;
    return r;
  }
  if ((r = cli_opt_double(verb, argc, argv, i, "--min-p", 0, 1, &d))) {
    if (r > 0) p->min_p = d;
    return r;
  }
  if ((r = cli_opt_double(verb, argc, argv, i, "--repeat-penalty", 0, 1e6, &d))) {
    if (r > 0) p->repetition_penalty = d;
    return r;
  }
  if ((r = cli_opt_double(verb, argc, argv, i, "--presence-penalty", -1e6, 1e6, &d))) {
    if (r > 0) p->presence_penalty = d;
    return r;
  }
  if ((r = cli_opt_double(verb, argc, argv, i, "--frequency-penalty", -1e6, 1e6, &d))) {
    if (r > 0) p->frequency_penalty = d;
    return r;
  }
  if ((r = cli_opt_int(verb, argc, argv, i, "--seed", 0, INT64_MAX, &k))) {
    if (r > 0) {
      p->has_seed = true;
      p->seed = (uint64_t)k;
    }
    return r;
  }
  /* llama.cpp's samplers, under llama.cpp's flag names */
  static const struct {
    const char *name;
    double lo, hi;
    size_t off;
  } reals[] = {
      {"--typical-p", 0, 1, offsetof(hearth_gen_params, typical_p)},
      {"--typical", 0, 1, offsetof(hearth_gen_params, typical_p)},
      {"--xtc-probability", 0, 1, offsetof(hearth_gen_params, xtc_probability)},
      {"--xtc-threshold", 0, 1, offsetof(hearth_gen_params, xtc_threshold)},
      {"--dry-multiplier", 0, 1e6, offsetof(hearth_gen_params, dry_multiplier)},
      {"--dry-base", 1, 1e6, offsetof(hearth_gen_params, dry_base)},
      {"--mirostat-ent", 0, 1e6, offsetof(hearth_gen_params, mirostat_tau)},
      {"--mirostat-tau", 0, 1e6, offsetof(hearth_gen_params, mirostat_tau)},
      {"--mirostat-lr", 0, 1e6, offsetof(hearth_gen_params, mirostat_eta)},
      {"--mirostat-eta", 0, 1e6, offsetof(hearth_gen_params, mirostat_eta)},
  };
  for (size_t j = 0; j < sizeof reals / sizeof reals[0]; j++)
    if ((r = cli_opt_double(verb, argc, argv, i, reals[j].name, reals[j].lo, reals[j].hi, &d))) {
      if (r > 0) *(double *)((char *)p + reals[j].off) = d;
      return r;
    }
  if ((r = cli_opt_int(verb, argc, argv, i, "--dry-allowed-length", 0, INT32_MAX, &k))) {
    if (r > 0) p->dry_allowed_length = k;
    return r;
  }
  if ((r = cli_opt_int(verb, argc, argv, i, "--dry-penalty-last-n", -1, INT32_MAX, &k))) {
    if (r > 0) p->dry_penalty_last_n = k;
    return r;
  }
  if ((r = cli_opt_int(verb, argc, argv, i, "--mirostat", 0, 2, &k))) {
    if (r > 0 && k == 1) {
      cli_usage_error(verb, "--mirostat 1 (the first Mirostat) is not supported: use --mirostat 2");
      return -1;
    }
    if (r > 0) p->mirostat = (int)k;
    return r;
  }
  /* repeatable; the first replaces the default breakers, "none" leaves none */
  static const char *breakers[16];
  static int n_breakers;
  const char *v;
  if ((r = cli_opt(argc, argv, i, "--dry-sequence-breaker", &v))) {
    if (r < 0) return r;
    if (!v[0]) {
      cli_usage_error(verb, "--dry-sequence-breaker must not be empty (\"none\" leaves no breakers)");
      return -1;
    }
    if (strcmp(v, "none") != 0) {
      if (n_breakers == (int)(sizeof breakers / sizeof breakers[0])) {
        cli_usage_error(verb, "--dry-sequence-breaker given more than %d times", (int)(sizeof breakers / sizeof breakers[0]));
        return -1;
      }
      breakers[n_breakers++] = v;
    }
    p->dry_sequence_breakers = breakers;
    p->n_dry_sequence_breakers = n_breakers;
    return 1;
  }
  return 0;
}

const char *cli_sampling_help(void) {
  return "  --temp T          temperature (0 = greedy; default: the model's generation_config)\n"
         "  --top-p P  --top-k K  --min-p P\n"
         "  --repeat-penalty R  --presence-penalty P  --frequency-penalty F\n"
         "  --seed S          sampling seed (same seed → same output)\n"
         "  --typical-p P     locally typical sampling (1 = off)\n"
         "  --xtc-probability P  --xtc-threshold T   XTC: with chance P, drop the tokens at or\n"
         "                    above probability T but the least likely of them (T > 0.5 = off)\n"
         "  --dry-multiplier M  --dry-base B  --dry-allowed-length N  --dry-penalty-last-n N\n"
         "  --dry-sequence-breaker S   DRY repetition penalty (M 0 = off; the breaker flag\n"
         "                    repeats and replaces \"\\n\", \":\", \"\\\"\", \"*\"; \"none\": no breakers)\n"
         "  --mirostat 2  --mirostat-ent TAU  --mirostat-lr ETA   Mirostat 2.0 (top-k/p, min-p,\n"
         "                    typical-p and XTC are not applied under it)\n";
}

void cli_hearth_load_opts(hearth_load_opts *lo) {
  const cli_load *cl = cli_load_opts();
  *lo = (hearth_load_opts){.threads = cl->threads, .device = cl->device, .gpu_memory_fraction = cl->gpu_memory_fraction,
                           .cpu_level = cl->cpu_level, .mmap = cl->mmap, .f32_activations = cl->f32_activations,
                           .f32_as_bf16 = cl->f32_as_bf16, .no_cuda_graphs = cl->no_cuda_graphs,
                           .gpu_fast_matmul = cl->gpu_fast_matmul,
                           .expert_budget = cl->expert_budget, .tensor_parallel = cl->tensor_parallel,
                           .spec_tokens = cl->spec_tokens,
                           .spec_method = cl->spec_method, .draft_model = cl->draft_model,
                           .kv_quant = cl->kv_quant, .kv_quant_config = cl->kv_quant_config,
                           .context_length = cl->context_length, .chat_template_file = cl->chat_template_file,
                           .chat_template = cl->chat_template};
}

int cli_kv_geometry(const model *m, model_kv_geometry *g, herr *err) {
  const cli_load *cl = cli_load_opts();
  model_kv_geometry_of(m, g);
  kv_quant q;
  int rc = kv_quant_make(cl->kv_quant, cl->kv_quant_config, g->n_layers, &q, err);
  if (!rc) kv_quant_apply(&q, g);
  return rc;
}

int cli_context_check(const model *m, herr *err) {
  int64_t want = cli_load_opts()->context_length, own = model_cfg(m)->max_position_embeddings;
  if (want > 0 && own > 0 && want > own)
    return herr_set(err, HEARTH_EINVAL, "--ctx-size %lld is more than the model's context of %lld tokens",
                    (long long)want, (long long)own);
  return 0;
}

int cli_model_load(const char *dir, model **out, herr *err) {
  const cli_load *cl = cli_load_opts();
  model_load_opts opts = {.threads = cl->threads, .device = cl->device, .cpu_level = cl->cpu_level, .mmap = cl->mmap,
                          .f32_activations = cl->f32_activations, .f32_as_bf16 = cl->f32_as_bf16,
                          .no_graphs = cl->no_cuda_graphs, .fast_matmul = cl->gpu_fast_matmul,
                          .expert_budget = cl->expert_budget, .tensor_parallel = cl->tensor_parallel};
  int rc = model_load(dir, &opts, out, err);
  if (!rc && ((rc = model_config_check(model_cfg(*out), dir, err)) || (rc = cli_context_check(*out, err)))) {
    model_free(*out);
    *out = NULL;
  }
  return rc;
}
