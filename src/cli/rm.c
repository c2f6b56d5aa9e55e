/* rm.c — `hearth rm NAME`: forgets a registry name (the files stay where they
 * are), or removes a model from the Hugging Face cache: ORG/NAME the whole
 * repository, ORG/NAME@REVISION that revision (its ref, and its snapshot when
 * no other ref uses it), ORG/NAME:QUANT that GGUF's files; then the blobs no
 * snapshot uses. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "cli/cli.h"
#include "hub/hub.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: hearth rm NAME...\n\n"
          "NAME is a registry name (hearth scan; only the reference is dropped, no file\n"
          "is touched) or a Hub id in the Hugging Face cache: ORG/NAME removes the whole\n"
          "repository, ORG/NAME@REVISION one revision, ORG/NAME:QUANT one GGUF (and the\n"
          "blobs nothing else uses).\n");
}

/* Removes the GGUF links of snap that carry quant. */
static int rm_quant(const char *snap, const char *quant, int *n, herr *err) {
  DIR *d = opendir(snap);
  if (!d) return herr_set(err, HEARTH_ENOTFOUND, "%s: no such snapshot", snap);
  struct dirent *e;
  int rc = 0;
  while (!rc && (e = readdir(d))) {
    size_t l = strlen(e->d_name);
    if (l < 5 || strcmp(e->d_name + l - 5, ".gguf") || !hub_name_has_quant(e->d_name, quant)) continue;
    char *p = hpath_join(snap, e->d_name);
    if (p && unlink(p)) rc = herr_set(err, HEARTH_EIO, "cannot remove %s", p);
    else (*n)++;
    free(p);
  }
  closedir(d);
  return rc;
}

int cli_remove_model(const char *name, char *done, size_t cap, herr *err) {
  if (!hub_registry_remove(name, err)) {
    snprintf(done, cap, "%s removed from the registry (its files were not touched)", name);
    return 0;
  }
  if (err->code != HEARTH_ENOTFOUND) return err->code;
  hub_ref ref;
  if (hub_ref_parse(name, &ref, NULL))
    return herr_set(err, HEARTH_ENOTFOUND, "%s is neither a registry name nor a Hub id (hearth ls lists both)", name);
  char *root = hub_cache_root(), *repo = root ? hub_repo_dir(root, ref.repo) : NULL, *commit = NULL;
  int rc = 0;
  if (!repo || !hfile_is_dir(repo)) {
    rc = herr_set(err, HEARTH_ENOTFOUND, "%s is not in the registry nor in the Hugging Face cache %s (hearth ls lists what is)",
                  name, root ? root : "");
    goto done;
  }
  bool whole = !strchr(name, '@') && !ref.quant[0];
  if (whole) {
    if (!(rc = hub_remove_tree(repo, err))) snprintf(done, cap, "%s removed from the Hugging Face cache (%s)", name, repo);
    goto done;
  }
  if ((rc = hub_cache_commit(repo, ref.revision, &commit, err))) goto done;
  char snap[4200];
  snprintf(snap, sizeof snap, "%s/snapshots/%s", repo, commit);
  if (ref.quant[0]) {
    int n = 0;
    if (!(rc = rm_quant(snap, ref.quant, &n, err)) && !n)
      rc = herr_set(err, HEARTH_ENOTFOUND, "%s: no GGUF file with the tag %s in %s", name, ref.quant, snap);
  } else {
    char refp[4200];
    snprintf(refp, sizeof refp, "%s/refs/%s", repo, ref.revision);
    unlink(refp);
    char *other = NULL; /* another ref to the same commit keeps the snapshot */
    bool kept = !hub_cache_commit(repo, "main", &other, NULL) && !strcmp(other, commit);
    free(other);
    if (!kept) rc = hub_remove_tree(snap, err);
  }
  int nb = 0;
  int64_t bytes = 0;
  if (!rc) rc = hub_cache_gc_repo(repo, &nb, &bytes, err);
  if (!rc) snprintf(done, cap, "%s removed (%d unused blob%s, %lld bytes freed)", name, nb, nb == 1 ? "" : "s", (long long)bytes);
done:
  free(commit);
  free(repo);
  free(root);
  return rc;
}

static int rm_one(const char *name) {
  herr err = {0};
  char done[1200];
  if (cli_remove_model(name, done, sizeof done, &err)) return cli_fail("%s", err.msg);
  printf("hearth: %s\n", done);
  return 0;
}

int cli_rm(int argc, char **argv) {
  int n = 0;
  for (int i = 1; i < argc; i++) {
    if (cli_is_help(argv[i])) {
      usage(stdout);
      return 0;
    }
    if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error("rm", "unknown option '%s'", argv[i]);
    n++;
  }
  if (!n) return cli_usage_error("rm", "which model? (hearth ls lists them)");
  for (int i = 1; i < argc; i++) {
    int rc = rm_one(argv[i]);
    if (rc) return rc;
  }
  return 0;
}
