/* fit.c — `hearth fit`: will a model fit on this machine (or GPU), with how
 * much context, how fast? A table, or the JSON that GET /fit answers.
 * Everything is hearth_fit's (include/hearth.h); this file only reads the
 * options and prints. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "hearth.h"

static void fit_usage(void) {
  printf("usage: hearth fit [MODEL] [--ctx N] [--batch B] [--device DEV] [--kv-quant 8|4|fp8|off]\n"
         "                 [--kv-quant-config FILE] [--memory BYTES] [--threads N] [--no-bandwidth] [--json]\n\n"
         "Whether MODEL (a folder or .gguf file; default: the built-in model) fits this machine's\n"
         "memory (MemAvailable) or the GPU's free memory, without loading its weights: weights as\n"
         "stored (total, and read per token for a mixture of experts), KV bytes per token and layer\n"
         "as the serving KV pool stores them (layers sharing another's KV store none), runtime\n"
         "overhead; the largest context that fits at the batch, and a decode speed predicted from a\n"
         "memory bandwidth measured now (a short read of a 256 MiB buffer; on a GPU a device copy).\n\n"
         "  --ctx N          tokens per sequence (default: the model's context length)\n"
         "  --batch B        sequences decoding together (default 1)\n"
         "  --device DEV     cpu (default), cuda, cuda:N: whose memory and bandwidth\n"
         "  --kv-quant M     the KV cache stored as `serve --kv-quant` would: 8 or 4-bit blocks\n"
         "                   of 32 with an f32 scale, fp8 (E4M3 blocks of 32 with an f32 scale),\n"
         "                   or off (f32, the default)\n"
         "  --kv-quant-config FILE  per-layer K / V formats, as `serve --kv-quant-config`\n"
         "  --memory BYTES   fit into this much memory (4096, 512M, 24G) instead of what is free now\n"
         "  --threads N      threads of the CPU bandwidth test (default: one per CPU)\n"
         "  --no-bandwidth   do not measure (no speed prediction)\n"
         "  --json           print JSON (the shape of GET /fit) instead of a table\n");
}

static void bytes_text(int64_t b, char *out, size_t n) {
  double v = (double)b;
  if (b >= (int64_t)1 << 30) snprintf(out, n, "%.2f GiB", v / (1 << 30));
  else if (b >= 1 << 20) snprintf(out, n, "%.1f MiB", v / (1 << 20));
  else if (b >= 1 << 10) snprintf(out, n, "%.1f KiB", v / (1 << 10));
  else snprintf(out, n, "%lld B", (long long)b);
}

static void print_table(const char *path, const hearth_fit_result *r) {
  char a[32], b[32], c[32];
  printf("model        %s (%s, context %lld tokens)\n", path, r->model_type, (long long)r->context_length);
  printf("device       %s\n", r->device);
  bytes_text(r->weight_bytes, a, sizeof a);
  bytes_text(r->active_weight_bytes, b, sizeof b);
  if (r->n_experts > 0) {
    bytes_text(r->expert_bytes, c, sizeof c);
    printf("weights      %s; read per token %s (%lld of %lld experts of %s)\n", a, b, (long long)r->experts_per_token,
           (long long)r->n_experts, c);
  } else {
    printf("weights      %s; read per token %s\n", a, b);
  }
  printf("KV cache     %s, %d of %d layers store KV, blocks of %d tokens\n", r->kv_format, r->kv_layers, r->n_layers,
         r->kv_block_tokens);
  printf("  per token  %lld B:", (long long)r->kv_bytes_per_token);
  /* the layers as runs of equal sizes */
  for (int l = 0; l < r->n_layers && l < HEARTH_FIT_MAX_LAYERS;) {
    int e = l;
    while (e + 1 < r->n_layers && e + 1 < HEARTH_FIT_MAX_LAYERS && r->kv_layer_bytes_per_token[e + 1] == r->kv_layer_bytes_per_token[l]) e++;
    if (e > l) printf(" layers %d-%d %lld B each;", l, e, (long long)r->kv_layer_bytes_per_token[l]);
    else printf(" layer %d %lld B;", l, (long long)r->kv_layer_bytes_per_token[l]);
    l = e + 1;
  }
  printf("\n");
  bytes_text(r->kv_bytes, a, sizeof a);
  printf("  in use     %s for %lld tokens × %lld sequences\n", a, (long long)r->context, (long long)r->batch);
  if (r->state_layers > 0) {
    bytes_text(r->state_bytes_per_sequence, a, sizeof a);
    bytes_text(r->state_bytes, b, sizeof b);
    printf("state        %d recurrent layers: %s a sequence, %s for %lld\n", r->state_layers, a, b, (long long)r->batch);
  }
  bytes_text(r->activation_bytes, a, sizeof a);
  bytes_text(r->runtime_bytes, b, sizeof b);
  printf("overhead     activations %s, runtime %s\n", a, b);
  bytes_text(r->need_bytes, a, sizeof a);
  bytes_text(r->available_bytes, b, sizeof b);
  printf("need         %s of %s available (%s)\n", a, b, r->memory_source);
  if (r->context_exceeds_model)
    printf("fits         no: a context of %lld tokens is more than the model's %lld\n", (long long)r->context,
           (long long)r->context_length);
  else
    printf("fits         %s\n", r->fits ? "yes" : "no");
  printf("max context  %lld tokens at batch %lld%s\n", (long long)r->max_context, (long long)r->batch,
         r->max_context == r->context_length ? " (the model's limit)" : "");
  printf("max batch    %lld sequences of %lld tokens\n", (long long)r->max_batch, (long long)r->context);
  if (r->bandwidth > 0) {
    printf("bandwidth    %.1f GB/s (measured)\n", r->bandwidth / 1e9);
    printf("decode       %.1f tok/s per sequence (%.1f total) at %lld tokens × %lld; %.1f tok/s alone at a short context\n",
           r->decode_tok_s, r->decode_tok_s_total, (long long)r->context, (long long)r->batch, r->decode_tok_s_short);
  }
}

int cli_fit(int argc, char **argv) {
  const char *model = NULL, *v;
  bool json = false;
  hearth_fit_opts o = {0};
  long long ctx = 0, batch = 0;
  for (int i = 1; i < argc; i++) {
    int r;
    if (cli_is_help(argv[i])) {
      fit_usage();
      return 0;
    }
    if (!strcmp(argv[i], "--json")) {
      json = true;
    } else if (!strcmp(argv[i], "--no-bandwidth")) {
      o.no_bandwidth = true;
    } else if ((r = cli_opt_int("fit", argc, argv, &i, "--ctx", 1, (long long)1 << 26, &ctx)) ||
               (r = cli_opt_int("fit", argc, argv, &i, "--batch", 1, 1 << 20, &batch))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt_threads("fit", argc, argv, &i, "--threads", &o.threads))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt(argc, argv, &i, "--device", &v))) {
      if (r < 0) return 2;
      o.device = v;
    } else if ((r = cli_opt(argc, argv, &i, "--kv-quant", &v))) {
      if (r < 0) return 2;
      if (strcmp(v, "8") && strcmp(v, "4") && strcmp(v, "off") && strcmp(v, "q8") && strcmp(v, "q4") && strcmp(v, "f32") &&
          strcmp(v, "fp8"))
        return cli_usage_error("fit", "--kv-quant must be 8, 4, fp8 or off, not '%s'", v);
      o.kv_quant = v;
    } else if ((r = cli_opt(argc, argv, &i, "--memory", &v))) {
      long long b;
      if (r < 0) return 2;
      if (!cli_parse_bytes(v, &b)) return cli_usage_error("fit", "--memory must be a byte count (4096, 512M, 2G), not '%s'", v);
      o.memory_bytes = b;
    } else if ((r = cli_opt(argc, argv, &i, "--kv-quant-config", &v))) {
      if (r < 0) return 2;
      o.kv_quant_config = v;
    } else if ((r = cli_opt(argc, argv, &i, "--model", &model))) {
      if (r < 0) return 2;
    } else if (argv[i][0] == '-') {
      return cli_usage_error("fit", "unknown option '%s'", argv[i]);
    } else if (model) {
      return cli_usage_error("fit", "one MODEL at most");
    } else {
      model = argv[i];
    }
  }
  if (!model) model = cli_default_model();
  if (!model) return cli_fail("fit: no MODEL given and no built-in model found (models/default)");
  o.context = ctx;
  o.batch = (int)batch;
  hearth_fit_result r;
  hearth_error err = {0};
  if (hearth_fit(model, &o, &r, &err)) return cli_fail("fit: %s", err.msg);
  if (json) {
    char *text = NULL;
    if (hearth_fit_json(&r, &text, &err)) return cli_fail("fit: %s", err.msg);
    printf("%s\n", text);
    hearth_free(text);
  } else {
    print_table(model, &r);
  }
  return 0;
}
