/* get.c — `hearth get ORG/NAME[@REVISION][:QUANT]`: fetches a model from the
 * Hugging Face Hub into the Hugging Face cache (hub/, laid out as
 * huggingface_hub does) and prints where it is. Owns the verb's options;
 * what to fetch, how and where is hub/'s. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "hub/hub.h"

#define GET_MAX_GLOBS 64

static void usage(FILE *f) {
  fprintf(f,
          "usage: hearth get ORG/NAME[@REVISION][:QUANT] [--include GLOB]... [--exclude GLOB]... [--jobs N]\n\n"
          "Fetches a model from the Hugging Face Hub into the Hugging Face cache\n"
          "($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub) — the same\n"
          "files huggingface-cli and transformers use, so neither fetches twice — and\n"
          "prints the model's path. Files are checked (sha256 of large files, size of\n"
          "the rest), fetched a few at a time, and a fetch cut short continues where it\n"
          "stopped the next time.\n\n"
          "By default only what hearth needs: config and tokenizer files, the chat\n"
          "template and the safetensors weights; in a GGUF repository, one GGUF file:\n"
          ":QUANT picks it by its tag (ORG/NAME:Q4_K_M, any case; a split GGUF whole),\n"
          "else Q4_K_M, else the first.\n\n"
          "options:\n"
          "  --include GLOB  fetch exactly the files matching GLOB (repeatable; fnmatch, e.g. 'original/*')\n"
          "  --exclude GLOB  leave out the files matching GLOB (repeatable)\n"
          "  --jobs N        files fetched at once (1 to 16, default 4)\n"
          "  -h, --help      this text\n\n"
          "environment:\n"
          "  HF_TOKEN          an access token, for gated and private repositories\n"
          "  HF_ENDPOINT       the Hub's address (default %s), for mirrors\n"
          "  HF_HUB_OFFLINE=1  no network: only say where a cached model is\n"
          "  HTTPS_PROXY, HTTP_PROXY, NO_PROXY  as for curl\n",
          HUB_DEFAULT_ENDPOINT);
}

int cli_get(int argc, char **argv) {
  const char *id = NULL, *v;
  const char *inc[GET_MAX_GLOBS], *exc[GET_MAX_GLOBS];
  size_t ninc = 0, nexc = 0;
  long long jobs = 4;
  for (int i = 1; i < argc; i++) {
    int r;
    if (cli_is_help(argv[i])) {
      usage(stdout);
      return 0;
    } else if ((r = cli_opt(argc, argv, &i, "--include", &v))) {
      if (r < 0) return 2;
      if (ninc == GET_MAX_GLOBS) return cli_usage_error("get", "at most %d --include globs", GET_MAX_GLOBS);
      inc[ninc++] = v;
    } else if ((r = cli_opt(argc, argv, &i, "--exclude", &v))) {
      if (r < 0) return 2;
      if (nexc == GET_MAX_GLOBS) return cli_usage_error("get", "at most %d --exclude globs", GET_MAX_GLOBS);
      exc[nexc++] = v;
    } else if ((r = cli_opt_int("get", argc, argv, &i, "--jobs", 1, 16, &jobs))) {
      if (r < 0) return 2;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      return cli_usage_error("get", "unknown option '%s'", argv[i]);
    } else if (id) {
      return cli_usage_error("get", "one model at a time (got '%s' and '%s')", id, argv[i]);
    } else {
      id = argv[i];
    }
  }
  if (!id) return cli_usage_error("get", "which model? e.g. hearth get Qwen/Qwen3-0.6B");
  hub_ref ref;
  herr err = {0};
  if (hub_ref_parse(id, &ref, &err)) return cli_usage_error("get", "%s", err.msg);
  hub_fetch_opts o = {.select = {.quant = ref.quant, .include = inc, .ninclude = ninc, .exclude = exc, .nexclude = nexc},
                      .jobs = (int)jobs, .progress = stderr};
  char *snap = NULL, *path = NULL;
  if (hub_fetch(&ref, &o, &snap, &err)) return cli_fail("%s", err.msg);
  /* the model's path: the snapshot, or its GGUF file */
  if (ninc || hub_snapshot_model(snap, ref.quant, &path, NULL)) path = NULL;
  printf("%s\n", path ? path : snap);
  free(path);
  free(snap);
  return 0;
}
