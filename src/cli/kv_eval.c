/* kv_eval.c — `hearth kv-eval`: what KV cache quantization does to a model's
 * output (engine/kv_eval.h): per model, prompt and format, the logit error
 * of the quantized cache against the f32 cache over the prompt and a greedy
 * continuation, and where greedy decoding first diverges. Prompts come from
 * --ids, TEXT, or the model folder's golden.json (the test fixtures'
 * prompts). Uses the internal model and engine interfaces, as bench does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "cli/cli.h"
#include "engine/kv_eval.h"
#include "engine/kv_paged.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#define MAX_MODELS 64

static void usage(FILE *f) {
  fprintf(f,
          "usage: hearth kv-eval [--model PATH ...] [--ids 1,2,3 | TEXT] [-n 24] [--json]\n\n"
          "Runs each prompt with the f32 KV cache and with a quantized one and reports the logit\n"
          "error (max and mean |difference| over every position of the prompt and of an n-token\n"
          "greedy continuation, the quantized cache fed the f32 run's tokens) and the greedy\n"
          "agreement (the first position where the quantized cache's own greedy tokens differ, and\n"
          "how many of the n agree). Formats: --kv-quant / --kv-quant-config when given, else 8, fp8 and 4.\n"
          "--model PATH (repeatable; default: the built-in model) is a folder or .gguf file.\n"
          "Without --ids or TEXT the prompts of PATH/golden.json (tests/fixtures/golden) are used.\n"
          "--json prints one object per line.\n");
}

/* The prompts of dir/golden.json ("prompts": [[ids], ...]), up to 8. */
static int golden_prompts(const char *dir, int32_t **p, int *n, int *count, herr *err) {
  char *path = hpath_join(dir, "golden.json");
  json_t *doc = path ? hjson_load_file(path, err) : NULL;
  free(path);
  if (!doc) return herr_wrap(err, "%s: no --ids or TEXT, and no golden.json prompts", dir);
  json_t *a = json_object_get(doc, "prompts");
  *count = 0;
  for (size_t k = 0; k < json_array_size(a) && *count < 8; k++) {
    json_t *ids = json_array_get(a, k);
    int len = (int)json_array_size(ids);
    if (len < 1) continue;
    p[*count] = malloc(sizeof(int32_t) * (size_t)len);
    for (int i = 0; i < len; i++) p[*count][i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
    n[(*count)++] = len;
  }
  json_decref(doc);
  return *count ? 0 : herr_set(err, HEARTH_EINVAL, "%s/golden.json: no prompts", dir);
}

int cli_kv_eval(int argc, char **argv) {
  const char *dirs[MAX_MODELS], *text = NULL;
  int n_dirs = 0;
  long long n_gen = 24;
  bool json = false;
  int32_t *ids = NULL;
  size_t n_ids = 0;
  for (int i = 1; i < argc; i++) {
    int r;
    const char *v;
    if (cli_is_help(argv[i])) {
      usage(stdout);
      free(ids);
      return 0;
    }
    if ((r = cli_opt(argc, argv, &i, "--model", &v))) {
      if (r < 0) return free(ids), 2;
      if (n_dirs == MAX_MODELS) return free(ids), cli_usage_error("kv-eval", "at most %d models", MAX_MODELS);
      dirs[n_dirs++] = v;
    } else if ((r = cli_opt_ids("kv-eval", argc, argv, &i, "--ids", &ids, &n_ids)) ||
               (r = cli_opt_int("kv-eval", argc, argv, &i, "-n", 1, 4096, &n_gen))) {
      if (r < 0) return free(ids), 2;
    } else if (!strcmp(argv[i], "--json")) {
      json = true;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      free(ids);
      return cli_usage_error("kv-eval", "unknown option '%s'", argv[i]);
    } else if (!text) {
      text = argv[i];
    } else {
      free(ids);
      return cli_usage_error("kv-eval", "give the text as one argument");
    }
  }
  if (!n_dirs && (dirs[0] = cli_default_model())) n_dirs = 1;
  if (!n_dirs) return free(ids), cli_fail("kv-eval: no --model given and no built-in model found (models/default)");
  if (ids && text) return free(ids), cli_usage_error("kv-eval", "give either --ids or TEXT");
  for (int d = 0; d < n_dirs && !ids && !text; d++) { /* the prompts come from golden.json: say so before loading */
    char *golden = hpath_join(dirs[d], "golden.json");
    bool there = golden && hfile_exists(golden);
    free(golden);
    if (!there)
      return cli_usage_error("kv-eval", "no prompt: give TEXT or --ids 1,2,3 (%s has no golden.json whose prompts "
                                        "would be used)", dirs[d]);
  }
  const cli_load *cl = cli_load_opts();
  const char *modes[3] = {"8", "fp8", "4"};
  int n_modes = 3;
  if (cl->kv_quant || cl->kv_quant_config) modes[0] = cl->kv_quant ? cl->kv_quant : "off", n_modes = 1;
  if (!json)
    printf("%-28s %6s %-10s %8s %10s %10s %10s %9s %7s\n", "model", "prompt", "kv", "B/token", "max|dlogit|", "mean|dlogit|",
           "max|logit|", "diverges", "same");
  int status = 0;
  for (int d = 0; d < n_dirs && !status; d++) {
    herr err = {0};
    model *m = NULL;
    int32_t *prompts[8] = {0};
    int plen[8] = {0}, np = 0;
    if (cli_model_load(dirs[d], &m, &err)) {
      status = cli_fail("%s", err.msg);
      break;
    }
    if (ids) {
      prompts[0] = malloc(sizeof(int32_t) * n_ids);
      memcpy(prompts[0], ids, sizeof(int32_t) * n_ids);
      plen[0] = (int)n_ids, np = 1;
    } else if (text) {
      tokenizer *tok = NULL;
      size_t n = 0;
      if (tokenizer_load(dirs[d], &tok, &err) || tokenizer_encode(tok, text, strlen(text), true, true, &prompts[0], &n, &err))
        status = cli_fail("%s", err.msg);
      if (tok) tokenizer_free(tok);
      plen[0] = (int)n, np = !status && n > 0;
      if (!status && !np) status = cli_fail("the text tokenizes to no tokens");
    } else if (golden_prompts(dirs[d], prompts, plen, &np, &err)) {
      status = cli_fail("%s", err.msg);
    }
    for (int k = 0; k < np && !status; k++)
      for (int f = 0; f < n_modes && !status; f++) {
        model_kv_geometry g;
        model_kv_geometry_of(m, &g);
        kv_quant q;
        if (kv_quant_make(modes[f], cl->kv_quant_config, g.n_layers, &q, &err)) {
          status = cli_fail("%s", err.msg);
          break;
        }
        kv_quant_apply(&q, &g);
        char fmt[128];
        kv_format_describe(&g, fmt, sizeof fmt);
        double per_token = (double)kv_block_bytes(&g, 16) / 16;
        kv_eval_result r;
        if (kv_eval_run(m, &q, prompts[k], plen[k], (int)n_gen, &r, &err)) {
          status = cli_fail("%s", err.msg);
          break;
        }
        if (json)
          printf("{\"model\": \"%s\", \"prompt\": %d, \"prompt_tokens\": %d, \"kv\": \"%s\", \"bytes_per_token\": %.0f, "
                 "\"max_abs_err\": %.6g, \"mean_abs_err\": %.6g, \"max_abs_logit\": %.6g, \"rows\": %lld, "
                 "\"n_gen\": %d, \"first_divergence\": %d, \"same_tokens\": %d}\n",
                 dirs[d], k, plen[k], fmt, per_token, r.max_abs_err, r.mean_abs_err, r.max_abs_logit, (long long)r.rows,
                 r.n_gen, r.first_divergence, r.same_tokens);
        else {
          const char *base = strrchr(dirs[d], '/');
          char div[16];
          if (r.first_divergence >= r.n_gen) snprintf(div, sizeof div, "none");
          else snprintf(div, sizeof div, "%d", r.first_divergence);
          printf("%-28s %6d %-10s %8.0f %10.2e %10.2e %10.2f %9s %3d/%-3d\n", base && base[1] ? base + 1 : dirs[d], k, fmt,
                 per_token, r.max_abs_err, r.mean_abs_err, r.max_abs_logit, div, r.same_tokens, r.n_gen);
        }
        fflush(stdout);
      }
    for (int k = 0; k < 8; k++) free(prompts[k]);
    model_free(m);
  }
  free(ids);
  return status;
}
