/* embed.c — `hearth embed`: embeddings of texts and token-id lists, printed
 * as JSON (the last token's final hidden state, L2-normalised, as
 * Qwen3-Embedding; an optional instruction in its query form; Matryoshka
 * dimensions). Uses only the public API (hearth_embed). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "hearth.h"

#define EMBED_MAX_INPUTS 4096

static void usage(FILE *f) {
  fprintf(f,
          "usage: hearth embed [--model PATH] [options] (TEXT | --ids ID,ID,...)...\n\n"
          "Prints {\"model\", \"dimensions\", \"prompt_tokens\", \"embeddings\": [[...], ...]}: one\n"
          "L2-normalised vector per input (the last token's final hidden state), in the\n"
          "order the inputs were given.\n\n"
          "  --model PATH        model folder or .gguf file (default: the built-in model)\n"
          "  TEXT                an input text (tokenized with the model's BOS/EOS as its tokenizer adds them)\n"
          "  --ids LIST          an input as token ids, comma or space separated (repeatable)\n"
          "  --instruction TEXT  texts become \"Instruct: TEXT\\nQuery:{text}\" (Qwen3-Embedding's query form)\n"
          "  --dimensions N      keep the first N values and renormalise (Matryoshka models)\n"
          "  --threads N         CPU worker threads (default: one per CPU)\n");
}

/* s as a JSON string literal on stdout. */
static void print_json_string(const char *s) {
  putchar('"');
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') printf("\\%c", *p);
    else if (*p < 0x20) printf("\\u%04x", *p);
    else putchar(*p);
  }
  putchar('"');
}

int cli_embed(int argc, char **argv) {
  const char *model_dir = NULL, *instruction = NULL;
  long long dims = 0;
  hearth_prompt *in = calloc(EMBED_MAX_INPUTS, sizeof *in);
  int32_t **owned = calloc(EMBED_MAX_INPUTS, sizeof *owned);
  size_t n = 0;
  int status = 2;
  hearth_model *m = NULL;
  float *out = NULL;
  if (!in || !owned) {
    status = cli_fail("out of memory");
    goto done;
  }
  for (int i = 1; i < argc; i++) {
    const char *v = NULL;
    int r;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (cli_is_help(argv[i])) {
      usage(stdout);
      status = 0;
      goto done;
    }
    if ((r = cli_opt_ids("embed", argc, argv, &i, "--ids", &ids, &n_ids))) {
      if (r < 0) goto done;
      if (n == EMBED_MAX_INPUTS) {
        free(ids);
        status = cli_usage_error("embed", "at most %d inputs", EMBED_MAX_INPUTS);
        goto done;
      }
      owned[n] = ids;
      in[n++] = (hearth_prompt){.ids = ids, .n_ids = n_ids};
    } else if ((r = cli_opt_int("embed", argc, argv, &i, "--dimensions", 1, INT32_MAX, &dims))) {
      if (r < 0) goto done;
    } else if ((r = cli_opt(argc, argv, &i, "--model", &v))) {
      if (r < 0) goto done;
      model_dir = v;
    } else if ((r = cli_opt(argc, argv, &i, "--instruction", &v))) {
      if (r < 0) goto done;
      instruction = v;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      status = cli_usage_error("embed", "unknown option '%s'", argv[i]);
      goto done;
    } else {
      if (!argv[i][0]) {
        status = cli_usage_error("embed", "input %zu is an empty text: there is nothing to embed", n);
        goto done;
      }
      if (n == EMBED_MAX_INPUTS) {
        status = cli_usage_error("embed", "at most %d inputs", EMBED_MAX_INPUTS);
        goto done;
      }
      in[n++] = (hearth_prompt){.text = argv[i], .text_len = strlen(argv[i]), .add_special = true};
    }
  }
  if (n == 0) {
    status = cli_usage_error("embed", "give at least one input (TEXT or --ids)");
    goto done;
  }
  if (!model_dir && !(model_dir = cli_default_model())) {
    status = cli_fail("no --model given and no built-in model found (models/default)");
    goto done;
  }
  status = 1;
  hearth_error err = {0};
  hearth_load_opts lo;
  cli_hearth_load_opts(&lo);
  if (hearth_model_load(model_dir, &lo, &m, &err)) {
    cli_fail("%s", err.msg);
    goto done;
  }
  hearth_info info;
  hearth_model_info(m, &info);
  int dim = dims ? (int)dims : info.hidden_size;
  if (dim > info.hidden_size) {
    status = cli_usage_error("embed", "--dimensions %d is more than the model's %d", dim, (int)info.hidden_size);
    goto done;
  }
  if (!(out = malloc(sizeof(float) * n * (size_t)dim))) {
    cli_fail("out of memory");
    goto done;
  }
  hearth_embed_opts eo = {.instruction = instruction, .dimensions = (int)dims};
  int64_t toks = 0;
  if (hearth_embed(m, in, n, &eo, out, &toks, &err)) {
    cli_fail("%s", err.msg);
    goto done;
  }
  printf("{\"model\":");
  print_json_string(info.id);
  printf(",\"dimensions\":%d,\"prompt_tokens\":%lld,\"embeddings\":[", dim, (long long)toks);
  for (size_t i = 0; i < n; i++) {
    printf("%s[", i ? ",\n" : "\n");
    for (int j = 0; j < dim; j++) {
      float x = out[i * (size_t)dim + (size_t)j];
      printf(isfinite(x) ? "%s%.9g" : "%snull", j ? "," : "", (double)x);
    }
    printf("]");
  }
  printf("\n]}\n");
  status = 0;
done:
  for (size_t i = 0; owned && i < n; i++) free(owned[i]);
  free(owned);
  free(in);
  free(out);
  hearth_model_free(m);
  return status;
}
