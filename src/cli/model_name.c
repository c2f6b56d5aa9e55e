/* model_name.c — what a `--model` value names, for every verb (main.c calls
 * this before a verb sees its options): an existing folder or file as it is;
 * else a name in hearth's registry (hearth scan); else a Hub id ORG/NAME
 * [@REVISION][:QUANT], found in the Hugging Face cache or, when not cached,
 * fetched there first with a message and progress (refused under
 * HF_HUB_OFFLINE=1 with the exact `hearth get` command). Anything else is left
 * for the verb to refuse. cli_model_find is the same lookup for verbs that
 * must not fetch (hearth memory): a Hub id not cached is an error that names
 * the command that fetches it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "cli/cli.h"
#include "hub/hub.h"

/* The model path of a cached hub id, or NULL. */
static char *cached_model(const hub_ref *ref) {
  char *root = hub_cache_root(), *repo = root ? hub_repo_dir(root, ref->repo) : NULL, *commit = NULL, *path = NULL;
  if (repo && !hub_cache_commit(repo, ref->revision, &commit, NULL)) {
    char *snap = malloc(strlen(repo) + 64);
    if (snap) {
      sprintf(snap, "%s/snapshots/%s", repo, commit);
      if (hub_snapshot_model(snap, ref->quant, &path, NULL)) path = NULL;
    }
    free(snap);
  }
  free(commit);
  free(repo);
  free(root);
  return path;
}

/* What value names without fetching: 0 with *path set (NULL: use value as it is), or 1 when it
 * is a Hub id that is not cached (ref and id filled). */
static int find_local(const char *value, char **path, hub_ref *ref, char *id, size_t cap) {
  *path = NULL;
  if (!value || !*value || hfile_exists(value)) return 0;
  if ((*path = hub_registry_lookup(value))) return 0;
  /* what reads as a path stays one, for the verb to say it is missing */
  size_t len = strlen(value);
  if (value[0] == '.' || value[0] == '~' || (len > 5 && !strcmp(value + len - 5, ".gguf")) ||
      (len > 12 && !strcmp(value + len - 12, ".safetensors")) || (len > 5 && !strcmp(value + len - 5, ".json")))
    return 0;
  if (hub_ref_parse(value, ref, NULL)) return 0;
  if ((*path = cached_model(ref))) return 0;
  hub_ref_format(ref, id, cap);
  return 1;
}

int cli_model_find(const char *value, char **path, char *fetch, size_t cap) {
  hub_ref ref;
  char id[600];
  if (!find_local(value, path, &ref, id, sizeof id)) return 0;
  snprintf(fetch, cap, "hearth get %s", id);
  return HEARTH_ENOTFOUND;
}

int cli_model_resolve(const char *value, char **path) {
  hub_ref ref;
  char id[600];
  if (!find_local(value, path, &ref, id, sizeof id)) return 0;
  char *root = hub_cache_root();
  if (hub_offline()) {
    fprintf(stderr,
            "hearth: %s is not a folder, a file, a registered name (hearth ls) or a model in the Hugging Face cache (%s), "
            "and HF_HUB_OFFLINE=1 forbids fetching it; with a network, run: hearth get %s\n",
            value, root ? root : "?", id);
    free(root);
    return 1;
  }
  fprintf(stderr, "hearth: %s is not in the Hugging Face cache (%s); fetching it first (as `hearth get %s` does)\n", id,
          root ? root : "?", id);
  free(root);
  hub_fetch_opts o = {.select = {.quant = ref.quant}, .progress = stderr};
  herr err = {0};
  char *snap = NULL;
  if (hub_fetch(&ref, &o, &snap, &err)) {
    fprintf(stderr, "hearth: %s\n(%s is no folder or file here and no registered name, so it was taken as a Hub id)\n",
            err.msg, value);
    return 1;
  }
  int rc = hub_snapshot_model(snap, ref.quant, path, &err);
  if (rc) fprintf(stderr, "hearth: %s: %s\n", id, err.msg);
  free(snap);
  return rc ? 1 : 0;
}
