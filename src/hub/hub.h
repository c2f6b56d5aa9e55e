/* hub.h — models by name from the Hugging Face Hub: the revision listing
 * (revision.c), which files a runtime needs (select.c), the cache that
 * huggingface_hub writes and reads (cache.c), fetching into it (fetch.c), and
 * hearth's registry of models found elsewhere (registry.c).
 *
 * The cache layout (huggingface_hub's, followed to the letter so that either
 * tool finds what the other fetched):
 *   root      $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub
 *   repo      <root>/models--ORG--NAME                 ("/" of the id → "--")
 *   blobs     <repo>/blobs/<id>    id: the LFS sha256 for LFS files, the git
 *                                  blob sha1 (the Hub's ETag) for the others
 *   partial   <repo>/blobs/<id>.incomplete             (a fetch under way)
 *   snapshot  <repo>/snapshots/<commit>/<rfilename>    a relative symlink to
 *             ../../blobs/<id>, one more ../ per folder in rfilename
 *   refs      <repo>/refs/<revision>                   the commit hash, no newline;
 *             written only when the revision asked for is not the commit itself
 * Knows nothing of models beyond file names; the CLI decides what to load. */
#ifndef HEARTH_HUB_H
#define HEARTH_HUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/json.h"
#include "base/status.h"

#define HUB_DEFAULT_ENDPOINT "https://huggingface.co"

/* ---- names (revision.c) ---- */

/* ORG/NAME[@REVISION][:QUANT] */
typedef struct hub_ref {
  char repo[256];      /* "ORG/NAME" */
  char revision[256];  /* "main" when not given */
  char quant[64];      /* "" when not given */
} hub_ref;
/* Parses s; HEARTH_EINVAL with a message when it is not a hub id. */
int hub_ref_parse(const char *s, hub_ref *out, herr *err);
/* "ORG/NAME[@REV][:QUANT]" as the user would type it (REV omitted when main), into out. */
void hub_ref_format(const hub_ref *r, char *out, size_t cap);

/* ---- the revision listing (revision.c) ---- */

typedef struct hub_file {
  char *name;        /* rfilename, a relative path checked to stay inside the snapshot (owned) */
  int64_t size;      /* bytes (the LFS size for LFS files); -1 when not given */
  char *blob_id;     /* the git blob sha1 (40 hex), NULL when not given (owned) */
  char *sha256;      /* LFS files: the content's sha256 (64 hex), else NULL (owned) */
} hub_file;

typedef struct hub_revision {
  char *commit;      /* 40 hex (owned) */
  hub_file *files;   /* owned */
  size_t n;
} hub_revision;

/* The body of GET /api/models/{id}/revision/{rev}?blobs=true:
 *   {"id": ..., "sha": COMMIT, "siblings": [{"rfilename": NAME, "size": N,
 *     "blobId": SHA1, "lfs": {"sha256": HEX, "size": N, "pointerSize": N}}, ...], ...}
 * Untrusted: names with "..", absolute paths, backslashes or empty parts, bad
 * hashes and sizes are refused with a message naming the entry. */
int hub_revision_parse(const char *json, size_t len, hub_revision *out, herr *err);
void hub_revision_free(hub_revision *r);

/* ---- which files (select.c) ---- */

typedef struct hub_select_opts {
  const char *quant;              /* pick one GGUF (or one split set) by tag; NULL/"" = Q4_K_M or the first */
  const char *const *include;     /* fnmatch globs; when given, exactly the files they match (less excludes) */
  size_t ninclude;
  const char *const *exclude;
  size_t nexclude;
} hub_select_opts;
/* keep[i] for r->files[i]. By default: the files a runtime needs — *config.json,
 * tokenizer*, special_tokens_map.json, chat_template.*, modules.json and
 * N_Pooling/config.json, *.safetensors with their index; or, in a repo without
 * safetensors, one GGUF model (mmproj files aside). Never original/, *.pth,
 * *.bin, onnx/ or other formats unless --include asks. */
int hub_select(const hub_revision *r, const hub_select_opts *o, bool *keep, herr *err);
/* True when name (its last part) carries tag, case-insensitively, with no
 * letter or digit either side ("x-Q4_K_M.gguf" has Q4_K_M, not Q4_K). */
bool hub_name_has_quant(const char *name, const char *tag);
/* Whether name is a later part ("-00002-of-00003.gguf" on) of a split GGUF. */
bool hub_gguf_is_later_shard(const char *name);

/* ---- the cache (cache.c) ---- */

/* The cache root (see above), malloc'd. */
char *hub_cache_root(void);
/* <root>/models--ORG--NAME, malloc'd. */
char *hub_repo_dir(const char *root, const char *repo);
/* The folder name models--ORG--NAME back to ORG/NAME into out; false when not one. */
bool hub_repo_from_dir(const char *dirname, char *out, size_t cap);
/* The commit a revision names in the cache: refs/<rev>, or rev itself when it
 * is a commit with a snapshot. HEARTH_ENOTFOUND when neither. *commit malloc'd. */
int hub_cache_commit(const char *repo_dir, const char *revision, char **commit, herr *err);
/* The model path a cached snapshot gives: the snapshot folder, or its GGUF file
 * (by quant, else Q4_K_M, else the only one; a split set's first shard).
 * HEARTH_ENOTFOUND when the snapshot holds no config.json and no fitting GGUF. */
int hub_snapshot_model(const char *snapshot, const char *quant, char **path, herr *err);
/* Makes snapshots/<commit>/<rfilename> a relative symlink to blobs/<blob_id> (replacing one there). */
int hub_cache_link(const char *repo_dir, const char *commit, const char *rfilename, const char *blob_id, herr *err);
/* Writes refs/<revision> = commit (not when revision is the commit). */
int hub_cache_write_ref(const char *repo_dir, const char *revision, const char *commit, herr *err);
/* Removes the blobs of repo_dir that no snapshot links to (and partial
 * fetches); adds their count and bytes. */
int hub_cache_gc_repo(const char *repo_dir, int *nremoved, int64_t *bytes, herr *err);
/* rm -r path (symlinks removed, not followed). */
int hub_remove_tree(const char *path, herr *err);
/* Bytes of the files a snapshot links to (each blob once). */
int64_t hub_tree_bytes(const char *path);

/* ---- fetching (fetch.c) ---- */

typedef struct hub_fetch_opts {
  const char *endpoint;          /* NULL: $HF_ENDPOINT, else HUB_DEFAULT_ENDPOINT */
  const char *token;             /* NULL: $HF_TOKEN */
  const char *cache_root;        /* NULL: hub_cache_root() */
  hub_select_opts select;
  int jobs;                      /* files fetched at once (0: 4) */
  FILE *progress;                /* where progress goes (NULL: nowhere); a bar when it is a terminal */
} hub_fetch_opts;
/* Fetches ref's files into the cache, verified, and returns the snapshot
 * folder (*snapshot, malloc'd). HF_HUB_OFFLINE=1: only the cache is looked at. */
int hub_fetch(const hub_ref *ref, const hub_fetch_opts *o, char **snapshot, herr *err);
/* True when HF_HUB_OFFLINE is set to 1 / true / yes / on. */
bool hub_offline(void);

/* ---- the registry (registry.c) ---- */

/* $HEARTH_HOME/registry.json, else $XDG_DATA_HOME/hearth/registry.json, else
 * ~/.local/share/hearth/registry.json (malloc'd). The file:
 *   {"models": {"NAME": {"path": "/absolute/path"}, ...}} */
char *hub_registry_path(void);
/* The path registered under name, malloc'd; NULL when none. */
char *hub_registry_lookup(const char *name);
/* Adds path under a name made from its last part (".gguf" dropped; "-2", "-3"
 * added on a clash with another path); a path already there keeps its name.
 * *name_out (may be NULL) malloc'd. */
int hub_registry_add(const char *path, char **name_out, herr *err);
/* Removes name; HEARTH_ENOTFOUND when absent. */
int hub_registry_remove(const char *name, herr *err);
/* The registry's {"NAME": {"path": ...}} object (a new reference; empty when no file). */
int hub_registry_load(json_t **models, herr *err);

#endif
