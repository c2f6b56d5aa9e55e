/* logits.c — `hearth logits`: runs one forward pass and prints the logits as
 * JSON, for debugging a model against a reference and for other tools'
 * tests. Token ids come from --ids or from tokenizing TEXT with the model's
 * tokenizer. Knows the model and tokenizer interfaces, nothing of their
 * insides. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/kv_cache.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: hearth logits [--model DIR] (--ids 1,2,3 | TEXT) [--all] [--threads N]\n\n"
          "Runs the model on the tokens and prints JSON: {\"ids\": [...], \"vocab_size\": V,\n"
          "\"logits\": [[...]]} with one row for the last position, or one per position with --all.\n"
          "TEXT is tokenized with the model's tokenizer (special tokens added, as HF does).\n");
}

/* Parses "1,2,3" into a malloc'd array. */
static int parse_ids(const char *s, int32_t **out, size_t *n) {
  size_t cap = 16, k = 0;
  int32_t *ids = malloc(cap * sizeof *ids);
  if (!ids) return -1;
  const char *p = s;
  while (*p) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno || v < 0 || v > INT32_MAX) {
      free(ids);
      return -1;
    }
    if (k == cap) {
      int32_t *g = realloc(ids, (cap *= 2) * sizeof *ids);
      if (!g) {
        free(ids);
        return -1;
      }
      ids = g;
    }
    ids[k++] = (int32_t)v;
    p = end;
    while (*p == ' ') p++;
    if (*p == ',') p++;
    else if (*p) {
      free(ids);
      return -1;
    }
  }
  if (!k) {
    free(ids);
    return -1;
  }
  *out = ids;
  *n = k;
  return 0;
}

int cli_logits(int argc, char **argv) {
  const char *dir = NULL, *ids_arg = NULL, *text = NULL, *threads_arg = NULL;
  bool all = false;
  for (int i = 1; i < argc; i++) {
    int r;
    if (cli_is_help(argv[i])) {
      usage(stdout);
      return 0;
    }
    if ((r = cli_opt(argc, argv, &i, "--model", &dir))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt(argc, argv, &i, "--ids", &ids_arg))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt(argc, argv, &i, "--threads", &threads_arg))) {
      if (r < 0) return 2;
    } else if (!strcmp(argv[i], "--all")) {
      all = true;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      return cli_usage_error("logits", "unknown option '%s'", argv[i]);
    } else if (!text) {
      text = argv[i];
    } else {
      return cli_usage_error("logits", "give the text as one argument");
    }
  }
  if (!dir) dir = cli_default_model();
  if (!dir) return cli_usage_error("logits", "no --model given and no built-in model found");
  if (!ids_arg == !text) return cli_usage_error("logits", "give either --ids or TEXT");
  int threads = threads_arg ? atoi(threads_arg) : 0;

  herr err = {0};
  int32_t *ids = NULL;
  size_t n = 0;
  if (ids_arg) {
    if (parse_ids(ids_arg, &ids, &n)) return cli_usage_error("logits", "--ids must be a comma-separated list of token ids");
  } else {
    tokenizer *tok = NULL;
    if (tokenizer_load(dir, &tok, &err)) return cli_fail("%s", err.msg);
    int rc = tokenizer_encode(tok, text, strlen(text), true, true, &ids, &n, &err);
    tokenizer_free(tok);
    if (rc) return cli_fail("%s", err.msg);
    if (!n) {
      free(ids);
      return cli_fail("the text tokenizes to no tokens");
    }
  }

  model *m = NULL;
  kv_cache *cache = NULL;
  kv_seq *seq = NULL;
  float *logits = NULL;
  int status = 1;
  const cli_load *cl = cli_load_opts();
  model_load_opts opts = {.threads = threads, .device = cl->device, .cpu_level = cl->cpu_level, .mmap = cl->mmap,
                          .f32_activations = cl->f32_activations, .f32_as_bf16 = cl->f32_as_bf16};
  if (model_load(dir, &opts, &m, &err)) goto fail;
  model_kv_geometry geo;
  model_kv_geometry_of(m, &geo);
  if (kv_cache_new(&geo, 0, &cache, &err) || kv_cache_seq_new(cache, &seq, &err)) goto fail;
  int64_t V = model_vocab_size(m);
  size_t rows = all ? n : 1;
  logits = malloc(rows * (size_t)V * sizeof(float));
  if (!logits) {
    herr_set(&err, HEARTH_ENOMEM, "out of memory for %zu × %lld logits", rows, (long long)V);
    goto fail;
  }
  model_seq sq = {.kv = seq, .tokens = ids, .n_tokens = (int)n, .all_logits = all};
  model_batch b = {&sq, 1};
  if (model_forward(m, &b, logits, &err)) goto fail;
  printf("{\"model_type\": \"%s\", \"ids\": [", model_cfg(m)->model_type);
  for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", (int)ids[i]);
  printf("], \"vocab_size\": %lld, \"all\": %s, \"logits\": [", (long long)V, all ? "true" : "false");
  for (size_t r = 0; r < rows; r++) {
    printf("%s[", r ? ",\n  " : "\n  ");
    for (int64_t v = 0; v < V; v++) printf("%s%.9g", v ? ", " : "", logits[r * (size_t)V + v]);
    printf("]");
  }
  printf("\n]}\n");
  status = 0;
fail:
  if (status) cli_fail("%s", err.msg);
  free(logits);
  kv_cache_seq_free(seq);
  kv_cache_free(cache);
  model_free(m);
  free(ids);
  return status;
}
