/* logits.c — `hearth logits`: runs one forward pass and prints the logits as
 * JSON, for debugging a model against a reference and for other tools'
 * tests. Token ids come from --ids or from tokenizing TEXT with the model's
 * tokenizer. Uses the internal model, KV cache and tokenizer interfaces
 * (model/model.h, engine/kv_cache.h, tokenizer/tokenizer.h), not hearth.h:
 * the public API never hands out raw logits. Nothing of their insides.
 * --adapter runs the forward under PEFT LoRA adapters (model_lora), stacked
 * as generate stacks them. --canvas (block-diffusion models) runs the
 * denoiser's canvas pass after the prompt, and --steps N repeats it on the
 * same canvas N times, each pass self-conditioned on the one before as the
 * denoising run forms it (engine/denoise.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "cli/cli.h"
#include "engine/denoise.h"
#include "engine/kv_cache.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: hearth logits [--model PATH] (--ids 1,2,3 | TEXT) [--all] [--adapter [NAME=]DIR]...\n"
          "                     [--canvas IDS [--steps N | --self-condition-from-step 1]]\n\n"
          "PATH is a model folder or a .gguf file (default: the built-in model). --ids takes ids\n"
          "separated by commas or spaces.\n"
          "Runs the model on the tokens and prints JSON: {\"ids\": [...], \"vocab_size\": V,\n"
          "\"logits\": [[...]]} with one row for the last position, or one per position with --all.\n"
          "TEXT is tokenized with the model's tokenizer (special tokens added, as HF does).\n"
          "  --adapter [NAME=]DIR\n"
          "                    run under this PEFT LoRA adapter folder (repeatable, at most %d: stacked,\n"
          "                    deltas summed; NAME is only a label, as serve's --adapter NAME=DIR)\n"
          "  --canvas IDS      a block-diffusion model (DiffusionGemma): after the prompt, one denoising\n"
          "                    pass over this canvas (as many ids as the model's canvas length); prints its\n"
          "                    rows' logits, before the temperature\n"
          "  --steps N         N passes over the same canvas, each self-conditioned on the one before as\n"
          "                    the denoising run forms it: softmax(logits / temperature) of the previous\n"
          "                    pass, the linear schedule's temperature of generation_config.json, in the\n"
          "                    checkpoint's dtype; adds \"self_conditioned\": {\"step\": N, \"logits\": ...}\n"
          "  --self-condition-from-step 1\n"
          "                    the same as --steps 2\n",
          MODEL_MAX_LORA);
}

static void print_rows(const float *logits, size_t rows, int64_t V) {
  printf("[");
  for (size_t r = 0; r < rows; r++) {
    printf("%s[", r ? ",\n  " : "\n  ");
    for (int64_t v = 0; v < V; v++) printf("%s%.9g", v ? ", " : "", logits[r * (size_t)V + v]);
    printf("]");
  }
  printf("\n]");
}

static void print_ids(const char *key, const int32_t *ids, size_t n) {
  printf("\"%s\": [", key);
  for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", (int)ids[i]);
  printf("]");
}

/* The prompt into seq's cache, then `steps` canvas passes; logits: the first pass's rows,
 * last: the last pass's. */
static int canvas_passes(model *m, const char *dir, kv_seq *seq, const int32_t *ids, size_t n, const int32_t *canvas,
                         int steps, const model_lora *const *loras, int n_lora, float *logits, float *last, herr *err) {
  denoise_params p;
  int rc = denoise_params_load(dir, &p, err);
  if (rc) return rc;
  if (steps > p.max_denoising_steps)
    return herr_set(err, HEARTH_EINVAL, "--steps %d is more than the model's max_denoising_steps (%d)", steps,
                    p.max_denoising_steps);
  model_seq enc = {.kv = seq, .tokens = ids, .n_tokens = (int)n, .out = MODEL_OUT_NONE, .lora = loras, .n_lora = n_lora};
  model_batch be = {&enc, 1};
  if ((rc = model_forward(m, &be, NULL, err))) return rc;
  int64_t C = model_canvas_length(m), V = model_vocab_size(m);
  float *sc = steps > 1 ? malloc(sizeof(float) * (size_t)(C * V)) : NULL;
  if (steps > 1 && !sc) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  model_seq dec = {.kv = seq, .tokens = canvas, .n_tokens = (int)C, .all_logits = true, .canvas = true,
                   .lora = loras, .n_lora = n_lora};
  model_batch bd = {&dec, 1};
  for (int k = 1; k <= steps && !rc; k++) {
    float *out = k == 1 ? logits : last;
    if (k > 1) { /* self-conditioned on the pass before, at its step of the schedule (they count down) */
      denoise_self_cond(m, k == 2 ? logits : last, C, denoise_temperature(&p, p.max_denoising_steps - k + 2), sc);
      dec.self_cond = sc;
    }
    rc = model_forward(m, &bd, out, err);
  }
  free(sc);
  return rc;
}

int cli_logits(int argc, char **argv) {
  const char *dir = NULL, *text = NULL, *adapters[MODEL_MAX_LORA], *v;
  int n_adapters = 0;
  bool all = false;
  int32_t *ids = NULL, *canvas = NULL;
  size_t n = 0, n_canvas = 0;
  long long steps = 1;
  for (int i = 1; i < argc; i++) {
    int r;
    if (cli_is_help(argv[i])) {
      usage(stdout);
      free(ids);
      return 0;
    }
    if ((r = cli_opt(argc, argv, &i, "--model", &dir)) || (r = cli_opt_ids("logits", argc, argv, &i, "--ids", &ids, &n)) ||
        (r = cli_opt_ids("logits", argc, argv, &i, "--canvas", &canvas, &n_canvas)) ||
        (r = cli_opt_int("logits", argc, argv, &i, "--steps", 1, 100000, &steps))) {
      if (r < 0) return free(ids), free(canvas), 2;
    } else if ((r = cli_opt(argc, argv, &i, "--self-condition-from-step", &v))) {
      if (r < 0 || strcmp(v, "1"))
        return free(ids), free(canvas), r < 0 ? 2 : cli_usage_error("logits", "--self-condition-from-step takes 1 (the first pass)");
      steps = 2;
    } else if ((r = cli_opt(argc, argv, &i, "--adapter", &v))) {
      if (r < 0) return free(ids), free(canvas), 2;
      if (n_adapters == MODEL_MAX_LORA)
        return free(ids), free(canvas), cli_usage_error("logits", "at most %d --adapter", MODEL_MAX_LORA);
      const char *eq = strchr(v, '='); /* NAME=DIR, as serve takes it: the name is a label */
      adapters[n_adapters++] = eq && !hfile_exists(v) ? eq + 1 : v;
    } else if (!strcmp(argv[i], "--all")) {
      all = true;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      free(ids), free(canvas);
      return cli_usage_error("logits", "unknown option '%s'", argv[i]);
    } else if (!text) {
      text = argv[i];
    } else {
      free(ids), free(canvas);
      return cli_usage_error("logits", "give the text as one argument");
    }
  }
  if (steps > 1 && !canvas) return free(ids), cli_usage_error("logits", "--steps and --self-condition-from-step need --canvas");
  if (canvas && all) return free(ids), free(canvas), cli_usage_error("logits", "--canvas prints every canvas row; --all is for causal passes");
  if (!dir) dir = cli_default_model();
  if (!dir) return free(ids), free(canvas), cli_usage_error("logits", "no --model given and no built-in model found");
  if (!ids == !text) return free(ids), free(canvas), cli_usage_error("logits", "give either --ids or TEXT");

  herr err = {0};
  if (!ids) {
    tokenizer *tok = NULL;
    if (tokenizer_load(dir, &tok, &err)) return free(canvas), cli_fail("%s", err.msg);
    int rc = tokenizer_encode(tok, text, strlen(text), true, true, &ids, &n, &err);
    tokenizer_free(tok);
    if (rc) return free(canvas), cli_fail("%s", err.msg);
    if (!n) {
      free(ids), free(canvas);
      return cli_fail("the text tokenizes to no tokens");
    }
  }

  model *m = NULL;
  kv_cache *cache = NULL;
  kv_seq *seq = NULL;
  float *logits = NULL, *last = NULL;
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
  int64_t V = model_vocab_size(m), C = model_canvas_length(m);
  if (canvas && C <= 0) {
    herr_set(&err, HEARTH_EINVAL, "--canvas: %s is not a block-diffusion model", model_cfg(m)->model_type);
    goto fail;
  }
  if (canvas && (int64_t)n_canvas != C) {
    herr_set(&err, HEARTH_EINVAL, "--canvas has %zu ids; the model's canvas is %lld", n_canvas, (long long)C);
    goto fail;
  }
  if (kv_cache_new(&geo, canvas ? (int64_t)n + C : 0, &cache, &err) || kv_cache_seq_new(cache, &seq, &err)) goto fail;
  for (size_t i = 0; i < n + n_canvas; i++) {
    int32_t t = i < n ? ids[i] : canvas[i - n];
    if (t >= V) {
      herr_set(&err, HEARTH_EINVAL, "token id %d is outside the vocabulary (size %lld)", (int)t, (long long)V);
      goto fail;
    }
  }
  size_t rows = canvas ? (size_t)C : all ? n : 1;
  logits = malloc(rows * (size_t)V * sizeof(float));
  last = steps > 1 ? malloc(rows * (size_t)V * sizeof(float)) : NULL;
  if (!logits || (steps > 1 && !last)) {
    herr_set(&err, HEARTH_ENOMEM, "out of memory for %zu × %lld logits", rows, (long long)V);
    goto fail;
  }
  const model_lora *const *lo = (const model_lora *const *)loras;
  if (canvas) {
    if (canvas_passes(m, dir, seq, ids, n, canvas, (int)steps, lo, n_adapters, logits, last, &err)) goto fail;
  } else {
    model_seq sq = {.kv = seq, .tokens = ids, .n_tokens = (int)n, .all_logits = all, .lora = lo, .n_lora = n_adapters};
    model_batch b = {&sq, 1};
    if (model_forward(m, &b, logits, &err)) goto fail;
  }
  printf("{\"model_type\": \"%s\", ", model_cfg(m)->model_type);
  print_ids("ids", ids, n);
  if (canvas) printf(", "), print_ids("canvas", canvas, n_canvas);
  printf(", \"vocab_size\": %lld, \"all\": %s, \"logits\": ", (long long)V, all || canvas ? "true" : "false");
  print_rows(logits, rows, V);
  if (last) printf(", \"self_conditioned\": {\"step\": %lld, \"logits\": ", steps), print_rows(last, rows, V), printf("}");
  printf("}\n");
  status = 0;
fail:
  if (status) cli_fail("%s", err.msg);
  free(logits);
  free(last);
  free(canvas);
  kv_cache_seq_free(seq);
  kv_cache_free(cache);
  for (int a = 0; a < n_adapters; a++)
    if (loras[a]) model_lora_release(loras[a]);
  model_free(m);
  free(ids);
  return status;
}
