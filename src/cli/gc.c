/* gc.c — `hearth gc`: removes from the Hugging Face cache the blobs that no
 * snapshot links to (left by removed revisions or files) and the partial
 * fetches (*.incomplete) a later `hearth get` would otherwise continue. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "cli/cli.h"
#include "hub/hub.h"

int cli_gc(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (cli_is_help(argv[i])) {
      printf("usage: hearth gc\n\n"
             "Removes the blobs of the Hugging Face cache that no snapshot uses, and\n"
             "partial fetches (*.incomplete), and says how much was freed.\n");
      return 0;
    }
    return cli_usage_error("gc", "unknown argument '%s'", argv[i]);
  }
  char *root = hub_cache_root();
  DIR *d = root ? opendir(root) : NULL;
  int n = 0, rc = 0;
  int64_t bytes = 0;
  struct dirent *e;
  while (d && (e = readdir(d))) {
    char id[600];
    if (!hub_repo_from_dir(e->d_name, id, sizeof id)) continue;
    char *repo = hpath_join(root, e->d_name);
    herr err = {0};
    if (repo && hub_cache_gc_repo(repo, &n, &bytes, &err)) rc = cli_fail("%s", err.msg);
    free(repo);
  }
  if (d) closedir(d);
  printf("hearth: %d unused blob%s removed, %lld bytes freed (%s)\n", n, n == 1 ? "" : "s", (long long)bytes,
         root ? root : "");
  free(root);
  return rc;
}
