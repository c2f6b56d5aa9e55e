/* memory.c — `hearth memory SUBVERB`: the memory wiki's verbs, each in a file
 * of its own (memory_search.c: search). Knows only their names. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const struct {
  const char *name, *summary;
  int (*run)(int argc, char **argv);
} subverbs[] = {
    {"search", "rank the wiki's articles by the model's embeddings against a query", cli_memory_search},
};
#define N_SUBVERBS ((int)(sizeof subverbs / sizeof subverbs[0]))

static void usage(FILE *f) {
  fprintf(f, "usage: hearth memory SUBVERB [options]   (hearth memory SUBVERB --help)\n\n"
             "A memory wiki is a folder of Markdown articles (DIR/<slug>.md with front matter:\n"
             "title, sources, created, updated) linked by [[slug]], listed in DIR/index.md.\n\n");
  for (int i = 0; i < N_SUBVERBS; i++) fprintf(f, "  %-10s %s\n", subverbs[i].name, subverbs[i].summary);
}

int cli_memory(int argc, char **argv) {
  if (argc < 2 || cli_is_help(argv[1])) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (int i = 0; i < N_SUBVERBS; i++)
    if (!strcmp(argv[1], subverbs[i].name)) return subverbs[i].run(argc - 1, argv + 1);
  return cli_usage_error("memory", "unknown subverb '%s'", argv[1]);
}
