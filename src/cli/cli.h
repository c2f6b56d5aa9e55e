/* cli.h — the hearth command line: one file per verb (src/cli/<verb>.c), each
 * exporting `int cli_<verb>(int argc, char **argv)` where argv[0] is the verb.
 * A verb returns the process exit status: 0 ok, 1 failure, 2 usage error. */
#ifndef HEARTH_CLI_H
#define HEARTH_CLI_H

#include <stdbool.h>
#include <stddef.h>

typedef struct cli_verb {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv);
  bool loads_model;  /* takes --device and --gpu-memory-fraction */
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
/* How a verb loads its model: the global --device and --gpu-memory-fraction
 * (which main.c takes from any verb that loads a model) and the
 * environment's HEARTH_CPU=scalar|avx2|avx512 (cap the CPU kernels),
 * HEARTH_MMAP=1 (map weight files) and HEARTH_ACT=f32 (f32 activations for
 * GGUF block types), read here so that the library reads none. */
typedef struct cli_load {
  const char *device;
  double gpu_memory_fraction;
  const char *cpu_level;
  bool mmap;
  bool f32_activations;
  bool f32_as_bf16;
} cli_load;
const cli_load *cli_load_opts(void);

/* Verbs. Add a verb: write src/cli/<verb>.c and add one line to the table in main.c. */
int cli_version(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_detokenize(int argc, char **argv);
int cli_serve(int argc, char **argv);
int cli_inspect(int argc, char **argv);
int cli_generate(int argc, char **argv);
int cli_chat(int argc, char **argv);
int cli_logits(int argc, char **argv);
int cli_template(int argc, char **argv);
int cli_convert(int argc, char **argv);
int cli_bench(int argc, char **argv);

#endif
