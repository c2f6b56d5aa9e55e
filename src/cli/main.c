/* main.c — the `hearth` binary: global flags (--version, --help, --verbose,
 * --quiet) and dispatch to one verb per file. Knows no verb's internals.
 * Uses hearth.h (the version) and base/ (log levels, finding the built-in
 * model). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <limits.h>

#include "base/file.h"
#include "base/log.h"
#include "cli/cli.h"
#include "engine/kv_quant.h"
#include "hearth.h"

static const cli_verb verbs[] = {
    {"bench", "measure prompt and generation tokens/s", cli_bench, true},
    {"batch", "run OpenAI Batch API JSONL requests offline (resumable)", cli_batch, true},
    {"chat", "talk with a model in the terminal", cli_chat, true},
    {"convert", "convert / quantize a model to GGUF or safetensors", cli_convert, false},
    {"detokenize", "print the text of token ids as JSON", cli_detokenize, false},
    {"embed", "print embeddings of texts or token ids as JSON", cli_embed, true},
    {"fit", "will a model fit this machine or GPU: memory, largest context, predicted tok/s", cli_fit, false},
    {"fuse", "merge a LoRA adapter into a model folder's weights", cli_fuse, false},
    {"gc", "remove the blobs of the Hugging Face cache that no model uses", cli_gc, false},
    {"generate", "generate text from a prompt", cli_generate, true},
    {"get", "fetch a model from the Hugging Face Hub (ORG/NAME[@REV][:QUANT]) into the HF cache", cli_get, false},
    {"help", "list the verbs, or show one verb's options (hearth help VERB)", cli_help, false},
    {"inspect", "describe a model folder, safetensors or GGUF file", cli_inspect, false},
    {"kv-eval", "measure the logit error and greedy agreement of a quantized KV cache", cli_kv_eval, true},
    {"logits", "print a forward pass's logits as JSON", cli_logits, true},
    {"memory", "a memory wiki of Markdown articles: search it by embeddings", cli_memory, true},
    {"ls", "list the models hearth can name: the Hugging Face cache and the registry", cli_ls, false},
    {"memory", "a Markdown wiki in git written from conversation logs (memory ingest)", cli_memory, true},
    {"rm", "remove a model from the HF cache or a name from the registry", cli_rm, false},
    {"scan", "register the model folders and GGUF files found under folders, by reference", cli_scan, false},
    {"serve", "serve a model over HTTP (OpenAI API, chat page)", cli_serve, true},
    {"template", "render a chat template over messages", cli_template, false},
    {"tokenize", "print the token ids of a text as JSON", cli_tokenize, false},
    {"train", "fine-tune a LoRA adapter on the CPU (sft, dpo, orpo) from JSONL data", cli_train, false},
    {"version", "print the version", cli_version, false},
};
static const int nverbs = (int)(sizeof verbs / sizeof verbs[0]);

static void usage(FILE *f) {
  fprintf(f,
          "hearth %s — a local LLM runtime\n\n"
          "usage: hearth [--verbose|--quiet] VERB [options]\n"
          "       hearth --version | --help\n"
          "       hearth VERB --help | hearth help VERB\n\n"
          "verbs:\n",
          hearth_version());
  for (int i = 0; i < nverbs; i++) fprintf(f, "  %-12s %s\n", verbs[i].name, verbs[i].summary);
  fprintf(f,
          "\noptions of every verb that loads a model (batch, bench, chat, embed, generate, kv-eval, logits, memory, serve):\n"
          "  --device DEV                 cpu (default), cuda, cuda:N, or auto (the GPU when one is usable)\n"
          "  --gpu-memory-fraction F      share of free GPU memory the KV pool may take after the weights (0.9)\n"
          "  --ctx-size N, -c N           context in tokens, below the model's own to save memory (default: the\n"
          "                               model's max_position_embeddings; a larger value is refused)\n"
          "  --chat-template NAME|FILE    batch, chat, generate, memory, serve (and template): render chats with a\n"
          "                               template hearth ships (chatml, deepseek3, gemma, llama3, mistral-v7, phi3)\n"
          "                               or a Jinja file instead of the model's (a model without one uses chatml)\n"
          "  --chat-template-file PATH    the same, a Jinja file only\n"
          "  --f32-as-bf16                store f32 weight matrices as bf16 (half the memory; weights rounded)\n"
          "  --gpu-precision exact|fast   GPU, bf16 weights: activations at f32 precision (exact, default) or\n"
          "                               rounded to bf16 in one pass (fast: a third of the prefill work; prompt\n"
          "                               attention on tensor cores; FP8 weights meet FP8 activations)\n"
          "  --threads N                  CPU worker threads (default 0: one per CPU)\n"
          "  --expert-budget BYTES        mixture of experts: at most this much expert weight resident (RAM or GPU);\n"
          "                               the rest is read from the file when used (e.g. 4G)\n"
          "  --tensor-parallel N, --tp N  split the model over N ranks (one thread each): N GPUs from --device's\n"
          "                               on (cuda:K .. cuda:K+N-1, NCCL between them), or N shares of the CPU\n"
          "  --spec-tokens N              speculative decoding (generate, chat, serve): draft up to N tokens per\n"
          "                               step (1..16, 0 = off) and verify them in one forward; greedy output is\n"
          "                               unchanged, sampled output keeps the model's distribution\n"
          "  --spec-method M              where drafts come from: ngram (prompt lookup, the default), draft\n"
          "                               (--draft-model) or mtp (the model's multi-token-prediction layer:\n"
          "                               GLM-5's, Qwen3.5's)\n"
          "  --draft-model DIR            a smaller model with the same tokenizer that drafts (implies draft)\n"
          "  --kv-quant 8|4|fp8|off       KV cache storage: 8 or 4-bit integer blocks of 32 with a scale, FP8 (E4M3) blocks\n"
          "                               of 32 with a scale, or f32 (off, default); the pool holds 3.6x (8, fp8) or\n"
          "                               6.4x (4) the tokens in the same memory\n"
          "  --kv-quant-config FILE       per-layer KV storage, K and V apart, over --kv-quant (docs/KV_QUANT.md)\n"
          "\nWithout --model (or PATH), the verbs use the built-in model. A model is a Hugging Face folder or a .gguf file;\n"
          "--model (and --draft-model) also take a name from the registry (hearth ls, hearth scan) or a Hub id\n"
          "ORG/NAME[@REVISION][:QUANT], found in the Hugging Face cache or fetched into it first (hearth get).\n");
}

static const cli_verb *find_verb(const char *name) {
  for (int v = 0; v < nverbs; v++)
    if (strcmp(name, verbs[v].name) == 0) return &verbs[v];
  return NULL;
}

int cli_help(int argc, char **argv) {
  if (argc < 2 || cli_is_help(argv[1])) {
    usage(stdout);
    return 0;
  }
  if (argc > 2) return cli_usage_error("help", "one VERB at most");
  const cli_verb *v = find_verb(argv[1]);
  if (!v) {
    fprintf(stderr, "hearth help: unknown verb '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
  }
  if (v->run == cli_help) {
    usage(stdout);
    return 0;
  }
  char *args[3] = {(char *)v->name, "--help", NULL};
  return v->run(2, args);
}

static cli_load g_load;

/* The verbs that load a model and render chats with its template. */
static bool renders_chats(const cli_verb *v) {
  return v->run == cli_batch || v->run == cli_chat || v->run == cli_generate || v->run == cli_memory || v->run == cli_serve;
}

const cli_load *cli_load_opts(void) {
  static bool env_read;
  if (!env_read) {
    const char *cpu = getenv("HEARTH_CPU"), *mm = getenv("HEARTH_MMAP"), *act = getenv("HEARTH_ACT");
    g_load.cpu_level = cpu && *cpu ? cpu : NULL;
    g_load.mmap = mm && !strcmp(mm, "1");
    g_load.f32_activations = act && !strcmp(act, "f32");
    const char *graphs = getenv("HEARTH_CUDA_GRAPHS");
    g_load.no_cuda_graphs = graphs && !strcmp(graphs, "0");
    env_read = true;
  }
  return &g_load;
}

bool cli_is_help(const char *arg) { return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0; }

int cli_opt(int argc, char **argv, int *i, const char *name, const char **value) {
  const char *a = argv[*i];
  size_t n = strlen(name);
  if (strncmp(a, name, n) != 0) return 0;
  if (a[n] == '=') {
    *value = a + n + 1;
    return 1;
  }
  if (a[n] != 0) return 0;
  if (*i + 1 >= argc) {
    fprintf(stderr, "hearth: option %s needs a value\n", name);
    return -1;
  }
  *value = argv[++*i];
  return 1;
}

int cli_usage_error(const char *verb, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "hearth %s: ", verb);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n(see hearth %s --help)\n", verb);
  va_end(ap);
  return 2;
}

int cli_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "hearth: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  return 1;
}

const char *cli_beside_binary(const char *env, const char *const *rel, size_t n, const char *marker, char *found) {
  if (found[0]) return found;
  const char *e = env ? getenv(env) : NULL;
  if (e && hfile_is_dir(e)) {
    snprintf(found, PATH_MAX, "%s", e);
    return found;
  }
  char exe[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) return NULL;
  exe[len] = 0;
  char *slash = strrchr(exe, '/');
  if (!slash) return NULL;
  *slash = 0;
  for (size_t i = 0; i < n; i++) {
    char cand[PATH_MAX];
    snprintf(cand, sizeof cand, "%s/%s", exe, rel[i]);
    char *m = hpath_join(cand, marker);
    bool ok = m && hfile_exists(m);
    free(m);
    if (ok && realpath(cand, found)) return found;
  }
  found[0] = 0;
  return NULL;
}

const char *cli_default_model(void) {
  static char found[PATH_MAX];
  /* <bindir>/../share/hearth/models/default (installed), <build>/../models/default (source tree) */
  static const char *rel[] = {"../share/hearth/models/default", "../models/default", "models/default",
                              "../../models/default"};
  return cli_beside_binary("HEARTH_DEFAULT_MODEL", rel, sizeof rel / sizeof rel[0], "config.json", found);
}

int cli_version(int argc, char **argv) {
  (void)argc;
  (void)argv;
  printf("hearth %s\n", hearth_version());
  return 0;
}

/* The --model values that named a model (registry names, Hub ids), with the paths they stand for. */
static struct {
  const char *name, *path;
} named[64];
static int n_named;

const char *cli_model_name_of(const char *path) {
  for (int i = 0; path && i < n_named; i++)
    if (named[i].path && !strcmp(named[i].path, path)) return named[i].name;
  return NULL;
}

/* At argv[*j]: --model VALUE or --model=VALUE (--draft-model too, for the verbs
 * that take it themselves) with VALUE a registry name or a Hub id: written back
 * as the path it stands for (kept for the process's life), into argv[*out...].
 * Returns 1 when handled, 0 when argv[*j] is not such an option, -1 after
 * printing why the model cannot be had. */
static int resolve_model_arg(int argc, char **argv, int *j, int *out) {
  static const char *names[] = {"--model", "--draft-model"};
  for (int k = 0; k < 2; k++) {
    size_t n = strlen(names[k]);
    const char *a = argv[*j];
    if (strncmp(a, names[k], n) || (a[n] && a[n] != '=')) continue;
    bool eq = a[n] == '=';
    if (!eq && *j + 1 >= argc) return 0; /* the verb says the value is missing */
    const char *v = eq ? a + n + 1 : argv[*j + 1];
    char *path = NULL;
    if (cli_model_resolve(v, &path)) return -1;
    if (path && k == 0 && n_named < (int)(sizeof named / sizeof named[0])) { /* a name, not a path: what the model is called */
      named[n_named].name = v;
      named[n_named++].path = strdup(path); /* kept for the process's life */
    }
    if (eq) {
      char *both = NULL;
      if (path && asprintf(&both, "%s=%s", names[k], path) < 0) both = NULL;
      argv[(*out)++] = both ? both : argv[*j];
      free(path);
    } else {
      argv[(*out)++] = argv[*j];
      argv[(*out)++] = path ? path : argv[*j + 1];
      (*j)++;
    }
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0) {
      printf("hearth %s\n", hearth_version());
      return 0;
    } else if (cli_is_help(a)) {
      usage(stdout);
      return 0;
    } else if (strcmp(a, "--verbose") == 0 || strcmp(a, "-v") == 0) {
      hlog_set_level(HLOG_LEVEL_DEBUG);
    } else if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0) {
      hlog_set_level(HLOG_LEVEL_ERROR);
    } else {
      fprintf(stderr, "hearth: unknown option '%s'\n\n", a);
      usage(stderr);
      return 2;
    }
  }
  if (i >= argc) {
    usage(stderr);
    return 2;
  }
  const cli_verb *verb = find_verb(argv[i]);
  /* --verbose / --quiet are accepted after the verb too, and --device,
   * --gpu-memory-fraction, --ctx-size (-c), --chat-template(-file) (by the verbs that render chats), --f32-as-bf16, --expert-budget, --tensor-parallel (--tp), --spec-tokens, --spec-method,
   * --draft-model, --kv-quant, --kv-quant-config and --threads by verbs that load a
   * model; verbs never see them. */
  int out = i + 1;
  for (int j = i + 1; j < argc; j++) {
    const char *v = NULL;
    int r = 0;
    if (strcmp(argv[j], "--verbose") == 0) hlog_set_level(HLOG_LEVEL_DEBUG);
    else if (strcmp(argv[j], "--quiet") == 0) hlog_set_level(HLOG_LEVEL_ERROR);
    else if (verb && verb->loads_model && (r = cli_opt(argc, argv, &j, "--device", &v))) {
      if (r < 0) return 2;
      if (strcmp(v, "cpu") && strcmp(v, "auto") && strncmp(v, "cuda", 4))
        return cli_usage_error(verb->name, "--device must be cpu, cuda, cuda:N or auto, not '%s'", v);
      g_load.device = v;
    } else if (verb && verb->loads_model && (r = cli_opt_threads(verb->name, argc, argv, &j, "--threads", &g_load.threads))) {
      if (r < 0) return 2;
    } else if (verb && verb->loads_model && (r = cli_opt(argc, argv, &j, "--expert-budget", &v))) {
      long long b;
      if (r < 0) return 2;
      if (!cli_parse_bytes(v, &b)) return cli_usage_error(verb->name, "--expert-budget must be a byte count (4096, 512M, 2G), not '%s'", v);
      g_load.expert_budget = b;
    } else if (verb && verb->loads_model &&
               ((r = cli_opt(argc, argv, &j, "--tensor-parallel", &v)) || (r = cli_opt(argc, argv, &j, "--tp", &v)))) {
      long long n;
      if (r < 0) return 2;
      if (!cli_parse_int(v, 1, KV_MAX_RANKS, &n))
        return cli_usage_error(verb->name, "--tensor-parallel must be from 1 to %d, not '%s'", KV_MAX_RANKS, v);
      g_load.tensor_parallel = (int)n;
    } else if (verb && verb->loads_model && (r = cli_opt(argc, argv, &j, "--gpu-precision", &v))) {
      if (r < 0) return 2;
      if (strcmp(v, "fast") && strcmp(v, "exact"))
        return cli_usage_error(verb->name, "--gpu-precision must be exact or fast, not '%s'", v);
      g_load.gpu_fast_matmul = !strcmp(v, "fast");
    } else if (verb && verb->loads_model && (r = cli_opt(argc, argv, &j, "--spec-tokens", &v))) {
      long long n;
      if (r < 0) return 2;
      if (!cli_parse_int(v, 0, 16, &n)) return cli_usage_error(verb->name, "--spec-tokens must be from 0 to 16, not '%s'", v);
      g_load.spec_tokens = (int)n;
    } else if (verb && verb->loads_model && (r = cli_opt(argc, argv, &j, "--spec-method", &v))) {
      if (r < 0) return 2;
      if (strcmp(v, "ngram") && strcmp(v, "draft") && strcmp(v, "mtp"))
        return cli_usage_error(verb->name, "--spec-method must be ngram, draft or mtp, not '%s'", v);
      g_load.spec_method = v;
    } else if (verb && verb->loads_model && (r = cli_opt(argc, argv, &j, "--draft-model", &v))) {
      if (r < 0) return 2;
      char *path = NULL;
      if (cli_model_resolve(v, &path)) return 1;
      g_load.draft_model = path ? path : v; /* path: kept for the process's life */
    } else if (verb && verb->loads_model && (r = cli_opt(argc, argv, &j, "--kv-quant", &v))) {
      bk_kv_fmt f;
      herr e = {0};
      if (r < 0) return 2;
      if (kv_quant_parse_fmt(v, &f, &e)) return cli_usage_error(verb->name, "--kv-quant must be 8, 4, fp8 or off, not '%s'", v);
      g_load.kv_quant = v;
    } else if (verb && verb->loads_model && (r = cli_opt(argc, argv, &j, "--kv-quant-config", &v))) {
      if (r < 0) return 2;
      g_load.kv_quant_config = v;
    } else if (verb && verb->loads_model &&
               ((r = cli_opt(argc, argv, &j, "--ctx-size", &v)) || (r = cli_opt(argc, argv, &j, "-c", &v)))) {
      long long n;
      if (r < 0) return 2;
      if (!cli_parse_int(v, 1, INT32_MAX, &n))
        return cli_usage_error(verb->name, "--ctx-size must be a token count from 1 to %d, not '%s'", INT32_MAX, v);
      g_load.context_length = n;
    } else if (verb && renders_chats(verb) && (r = cli_opt(argc, argv, &j, "--chat-template-file", &v))) {
      if (r < 0) return 2;
      if (g_load.chat_template) return cli_usage_error(verb->name, "--chat-template and --chat-template-file: give one");
      g_load.chat_template_file = v;
    } else if (verb && renders_chats(verb) && (r = cli_opt(argc, argv, &j, "--chat-template", &v))) {
      if (r < 0) return 2;
      if (g_load.chat_template_file) return cli_usage_error(verb->name, "--chat-template and --chat-template-file: give one");
      g_load.chat_template = v;
    } else if (verb && verb->loads_model && strcmp(argv[j], "--f32-as-bf16") == 0) {
      g_load.f32_as_bf16 = true;
    } else if (verb && verb->loads_model && (r = cli_opt(argc, argv, &j, "--gpu-memory-fraction", &v))) {
      if (r < 0) return 2;
      if (!cli_parse_double(v, 0, 1, &g_load.gpu_memory_fraction) || g_load.gpu_memory_fraction == 0)
        return cli_usage_error(verb->name, "--gpu-memory-fraction must be in (0, 1], not '%s'", v);
    } else if (verb && verb->run != cli_get && verb->run != cli_rm && verb->run != cli_memory && /* memory never fetches */
               (r = resolve_model_arg(argc, argv, &j, &out))) {
      if (r < 0) return 1;
    } else argv[out++] = argv[j];
  }
  argc = out;
  argv[argc] = NULL;
  if (verb) return verb->run(argc - i, argv + i);
  fprintf(stderr, "hearth: unknown verb '%s'\n\n", argv[i]);
  usage(stderr);
  return 2;
}
