/* logits.c — `hearth logits`: runs one forward pass and prints the logits as
 * JSON, for debugging a model against a reference and for other tools'
 * tests. Token ids come from --ids or from tokenizing TEXT with the model's
 * tokenizer. Uses the internal model, KV cache and tokenizer interfaces
 * (model/model.h, engine/kv_cache.h, tokenizer/tokenizer.h), not hearth.h:
 * the public API never hands out raw logits. Nothing of their insides.
 * --adapter runs the forward under PEFT LoRA adapters (model_lora), stacked
 * as generate stacks them. */
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
          "usage: hearth logits [--model PATH] (--ids 1,2,3 | TEXT) [--all] [--adapter DIR]... [--threads N]\n\n"
          "PATH is a model folder or a .gguf file (default: the built-in model). --ids takes ids\n"
          "separated by commas or spaces.\n"
          "Runs the model on the tokens and prints JSON: {\"ids\": [...], \"vocab_size\": V,\n"
          "\"logits\": [[...]]} with one row for the last position, or one per position with --all.\n"
          "TEXT is tokenized with the model's tokenizer (special tokens added, as HF does).\n"
          "  --adapter DIR     run under this PEFT LoRA adapter folder (repeatable, at most %d: stacked,\n"
          "                    deltas summed)\n",
          MODEL_MAX_LORA);
}

int cli_logits(int argc, char **argv) {
  const char *dir = NULL, *text = NULL, *adapters[MODEL_MAX_LORA], *v;
  int n_adapters = 0;
  bool all = false;
  int32_t *ids = NULL;
  size_t n = 0;
  for (int i = 1; i < argc; i++) {
    int r;
    if (cli_is_help(argv[i])) {
      usage(stdout);
      free(ids);
      return 0;
    }
    if ((r = cli_opt(argc, argv, &i, "--model", &dir)) || (r = cli_opt_ids("logits", argc, argv, &i, "--ids", &ids, &n))) {
      if (r < 0) return free(ids), 2;
    } else if ((r = cli_opt(argc, argv, &i, "--adapter", &v))) {
      if (r < 0) return free(ids), 2;
      if (n_adapters == MODEL_MAX_LORA)
        return free(ids), cli_usage_error("logits", "at most %d --adapter", MODEL_MAX_LORA);
      adapters[n_adapters++] = v;
    } else if (!strcmp(argv[i], "--all")) {
      all = true;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      free(ids);
      return cli_usage_error("logits", "unknown option '%s'", argv[i]);
    } else if (!text) {
      text = argv[i];
    } else {
      free(ids);
      return cli_usage_error("logits", "give the text as one argument");
    }
  }
  if (!dir) dir = cli_default_model();
  if (!dir) return free(ids), cli_usage_error("logits", "no --model given and no built-in model found");
  if (!ids == !text) return free(ids), cli_usage_error("logits", "give either --ids or TEXT");

  herr err = {0};
  if (!ids) {
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
  model_lora *loras[MODEL_MAX_LORA] = {0};
  int status = 1;
  if (cli_model_load(dir, &m, &err)) goto fail;
  for (int a = 0; a < n_adapters; a++)
    if (model_lora_load(m, adapters[a], &loras[a], &err)) {
      herr_wrap(&err, "--adapter %s", adapters[a]);
      goto fail;
    }
  model_kv_geometry geo;
  if (cli_kv_geometry(m, &geo, &err)) goto fail;
  if (kv_cache_new(&geo, 0, &cache, &err) || kv_cache_seq_new(cache, &seq, &err)) goto fail;
  int64_t V = model_vocab_size(m);
  for (size_t i = 0; i < n; i++)
    if (ids[i] >= V) {
      herr_set(&err, HEARTH_EINVAL, "token id %d is outside the vocabulary (size %lld)", (int)ids[i], (long long)V);
      goto fail;
    }
  size_t rows = all ? n : 1;
  logits = malloc(rows * (size_t)V * sizeof(float));
  if (!logits) {
    herr_set(&err, HEARTH_ENOMEM, "out of memory for %zu × %lld logits", rows, (long long)V);
    goto fail;
  }
  model_seq sq = {.kv = seq, .tokens = ids, .n_tokens = (int)n, .all_logits = all,
                  .lora = (const model_lora *const *)loras, .n_lora = n_adapters};
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
  for (int a = 0; a < n_adapters; a++)
    if (loras[a]) model_lora_release(loras[a]);
  model_free(m);
  free(ids);
  return status;
}
