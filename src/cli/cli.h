/* cli.h — the hearth command line: one file per verb (src/cli/<verb>.c), each
 * exporting `int cli_<verb>(int argc, char **argv)` where argv[0] is the verb.
 * A verb returns the process exit status: 0 ok, 1 failure, 2 usage error.
 *
 * What each verb uses: generate, chat and embed only the public API (hearth.h),
 * chat --memory also chat/toolcall.h, memory/ and serve/forced.h;
 * serve the server module (src/serve/, itself on hearth.h), and hub/ for the
 * Ollama API's model list, pull and delete. The others need
 * access below the public API and say so in their header comment: tokenize
 * and detokenize (the tokenizer module, on a bare tokenizer.json), template
 * (the chat module, without weights), inspect (format/), logits and bench
 * (model/, engine/kv_cache.h; cli_model_load below), convert (format/,
 * backend/, model/gguf_model.h), fuse (format/, backend/formats.h), get, ls,
 * scan, rm and gc (hub/: the Hub, the Hugging Face cache, the registry),
 * memory (memory/: the wiki pipeline, on hearth.h, and the wiki's search index). */
#ifndef HEARTH_CLI_H
#define HEARTH_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/json.h"
#include "hearth.h"
#include "memory/search.h"
#include "model/model.h"

typedef struct cli_verb {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv);
  bool loads_model;  /* takes --device, --gpu-memory-fraction, --f32-as-bf16 and --threads */
} cli_verb;

/* Option parsing shared by verbs. At argv[*i]: if it is `name VALUE` or
 * `name=VALUE`, stores VALUE, advances *i past it and returns 1; returns -1
 * (after printing an error) when the value is missing; 0 when argv[*i] is not
 * this option. */
int cli_opt(int argc, char **argv, int *i, const char *name, const char **value);
/* True when argv[i] is -h or --help. */
bool cli_is_help(const char *arg);
/* Prints "hearth VERB: message" to stderr; returns 2 (usage) for `return cli_usage_error(...)`. */
int cli_usage_error(const char *verb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints "hearth: message" to stderr; returns 1. */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The built-in model folder (models/default next to the binary's install or
 * source tree), or NULL when none is found. Borrowed static string. */
const char *cli_default_model(void);
/* A folder shipped with hearth, found as the built-in model is: the folder
 * the environment variable env names (may be NULL), else the first of rel
 * (n paths relative to the binary's folder) that holds the file marker.
 * found: the caller's static PATH_MAX buffer, which keeps the answer. NULL
 * when there is none. */
const char *cli_beside_binary(const char *env, const char *const *rel, size_t n, const char *marker, char *found);
/* How a verb loads its model: the global --device, --gpu-memory-fraction,
 * --f32-as-bf16 and --threads (which main.c takes from any verb that loads a
 * model) and the
 * environment's HEARTH_CPU=scalar|avx2|avx512 (cap the CPU kernels),
 * HEARTH_MMAP=1 (map weight files) and HEARTH_ACT=f32 (f32 activations for
 * GGUF block types), read here so that the library reads none. */
typedef struct cli_load {
  int threads;                 /* 0: one per CPU */
  const char *device;
  double gpu_memory_fraction;
  const char *cpu_level;
  bool mmap;
  bool f32_activations;
  bool f32_as_bf16;
  bool no_cuda_graphs;         /* HEARTH_CUDA_GRAPHS=0 */
  bool gpu_fast_matmul;        /* --gpu-precision fast */
  int64_t expert_budget;       /* --expert-budget BYTES */
  int tensor_parallel;         /* --tensor-parallel N / --tp N (0: not split) */
  int spec_tokens;             /* --spec-tokens N (generate, chat, serve) */
  const char *spec_method;     /* --spec-method ngram|draft|mtp */
  const char *draft_model;     /* --draft-model DIR */
  const char *kv_quant;        /* --kv-quant 8|4|off */
  const char *kv_quant_config; /* --kv-quant-config FILE */
  int64_t context_length;      /* --ctx-size N / -c N (0: the model's) */
  const char *chat_template_file; /* --chat-template-file PATH (batch, chat, generate, serve) */
  const char *chat_template;      /* --chat-template NAME|FILE (the same verbs) */
} cli_load;
const cli_load *cli_load_opts(void);
/* The name a --model value gave the model at path (a registry name or a Hub id, as typed), or NULL
 * when --model gave that path itself. */
const char *cli_model_name_of(const char *path);
/* The load options above as the library's (fields a verb sets itself stay 0). */
void cli_hearth_load_opts(hearth_load_opts *lo);
/* An error naming both numbers when --ctx-size is above the model's own
 * context (max_position_embeddings); 0 otherwise. */
int cli_context_check(const model *m, herr *err);
/* model_load with the options above, model_config_check and cli_context_check. */
int cli_model_load(const char *dir, model **out, herr *err);
/* m's KV geometry with the storage formats of --kv-quant / --kv-quant-config. */
int cli_kv_geometry(const model *m, model_kv_geometry *g, herr *err);

/* ---- values (args.c): the one parser of each kind of value, for every verb ----
 * Each takes the whole string (no trailing text, no leading space) and
 * returns false (or -1) when it is not a value in range. */
#define CLI_MAX_THREADS 4096
#define CLI_MAX_TOKENS ((long long)1 << 40)
bool cli_parse_int(const char *s, long long lo, long long hi, long long *out);
bool cli_parse_double(const char *s, double lo, double hi, double *out);   /* finite */
/* "4096", "512M", "2G" (K/M/G: powers of 1024), 1 to 2^50 bytes. */
bool cli_parse_bytes(const char *s, long long *out);
/* 0 (one per CPU) to CLI_MAX_THREADS. */
bool cli_parse_threads(const char *s, int *out);
/* Token ids separated by commas and/or spaces ("1,2,3", "1 2 3", "1, 2"), at
 * least one; *out malloc'd. Ids are not checked against a vocabulary here. */
int cli_parse_ids(const char *s, int32_t **out, size_t *n);

/* Typed options, as cli_opt: 1 when argv[*i] is `name` and its value parsed
 * (stored in *out); 0 when it is not this option; -1 after a usage error was
 * printed (the verb returns 2). */
int cli_opt_int(const char *verb, int argc, char **argv, int *i, const char *name, long long lo, long long hi,
                long long *out);
int cli_opt_double(const char *verb, int argc, char **argv, int *i, const char *name, double lo, double hi,
                   double *out);
int cli_opt_ids(const char *verb, int argc, char **argv, int *i, const char *name, int32_t **ids, size_t *n);
int cli_opt_threads(const char *verb, int argc, char **argv, int *i, const char *name, int *threads);
/* The sampling options of generate and chat (-n/--max-tokens, --temp, --top-p,
 * --top-k, --min-p, the penalties, --seed, and llama.cpp's --typical-p, --xtc-*,
 * --dry-*, --mirostat*) into p; *max_given (may be NULL) is
 * set when -n was given. cli_sampling_help: the lines of all but -n for a usage text (each verb
 * writes its own -n line, whose default differs). */
int cli_opt_sampling(const char *verb, int argc, char **argv, int *i, hearth_gen_params *p, bool *max_given);
const char *cli_sampling_help(void);

/* ---- models by name (ls.c, rm.c), for hearth ls / rm and the server's Ollama API ---- */
/* The models hearth can name: the Hugging Face cache's and the registry's, each
 * {name, source, path, revision, format, bytes, architecture, runnable, problem,
 * parameters, quantization, modified} (a new array). */
json_t *cli_model_list(void);
/* The same facts of one model path, under name (a new object). */
json_t *cli_model_facts(const char *name, const char *path);
/* Removes a registry name or a cached Hub id as `hearth rm` does; *done (cap bytes) says what
 * was removed. HEARTH_ENOTFOUND when nothing goes by that name. */
int cli_remove_model(const char *name, char *done, size_t cap, herr *err);
/* The models under dir as hearth scan finds them (folders with config.json and safetensors, .gguf files
 * but projectors and later split parts; Hugging Face cache folders skipped): fn(ctx, path) for each, in
 * directory order; a nonzero return stops the walk and is returned. */
int cli_find_models(const char *dir, int (*fn)(void *ctx, const char *path), void *ctx);

/* Verbs. Add a verb: write src/cli/<verb>.c and add one line to the table in main.c. */
int cli_version(int argc, char **argv);
/* `hearth help [VERB]`: the verbs, or one verb's --help. */
int cli_help(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_detokenize(int argc, char **argv);
int cli_serve(int argc, char **argv);
int cli_batch(int argc, char **argv);
int cli_inspect(int argc, char **argv);
int cli_generate(int argc, char **argv);
int cli_embed(int argc, char **argv);
int cli_chat(int argc, char **argv);
int cli_logits(int argc, char **argv);
int cli_kv_eval(int argc, char **argv);
int cli_template(int argc, char **argv);
int cli_convert(int argc, char **argv);
int cli_fit(int argc, char **argv);
int cli_fuse(int argc, char **argv);
int cli_train(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_get(int argc, char **argv);
int cli_ls(int argc, char **argv);
int cli_scan(int argc, char **argv);
int cli_rm(int argc, char **argv);
int cli_gc(int argc, char **argv);
/* `hearth memory SUBVERB`: memory.c dispatches (ingest: the memory pipeline, src/memory;
 * search: memory_search.c). */
int cli_memory(int argc, char **argv);
int cli_memory_search(int argc, char **argv);

/* The memory wiki at dir opened for searching with m's embeddings (memory_search.c; for
 * hearth memory search and chat --memory): the index's model identity is m's files'
 * (kv_disk_model_identity) and width, as serve --memory's; pool a memsearch_pool, or -1 for words
 * when m generates and text for an embedding model. HEARTH_EUNSUPPORTED when m gives no embeddings. */
int cli_memory_open(const char *dir, hearth_model *m, int pool, memsearch **out, herr *err);

/* What a --model value names (model_name.c): *path (malloc'd) the folder or
 * file a registry name or a Hub id stands for — fetched into the Hugging Face
 * cache when not there —, or NULL when the value is to be used as it is.
 * Returns nonzero after printing why a Hub id cannot be had. */
int cli_model_resolve(const char *value, char **path);
/* The same without fetching: HEARTH_ENOTFOUND when value is a Hub id not in
 * the cache, with the command that fetches it ("hearth get ORG/NAME") in
 * fetch (cap bytes); 0 otherwise, *path as cli_model_resolve sets it. */
int cli_model_find(const char *value, char **path, char *fetch, size_t cap);
/* inspect's facts about a model folder or file as a JSON object (NULL when its
 * weights could not be read); problem: why hearth cannot run it ("" if it can). */
json_t *cli_inspect_json(const char *path, char *problem, size_t cap);

#endif
