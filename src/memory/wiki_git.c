/* wiki_git.c — the wiki's git repository through libgit2 (wiki_git.h):
 * opening or making it, HEAD, trailers of the history, one commit of given
 * paths. Knows nothing of articles. */
#include "memory/wiki_git.h"

#include <errno.h>
#include <git2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "memory/state.h"

struct mem_git {
  git_repository *repo; /* owned */
  char *dir;            /* owned */
};

static int git_fail(herr *err, const char *what, const char *dir) {
  const git_error *e = git_error_last();
  return herr_set(err, HEARTH_EIO, "%s: %s: %s", dir, what, e && e->message ? e->message : "libgit2 failed");
}

/* dir/.gitignore names the state folder (added when it does not). */
static int ignore_state(const char *dir, herr *err) {
  char *path = hpath_join(dir, ".gitignore"), *text = NULL;
  size_t len = 0;
  if (!path) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  hfile_read(path, &text, &len, NULL);
  int rc = 0;
  if (!text || !strstr(text, MEM_STATE_DIR "/")) {
    FILE *f = fopen(path, "a");
    bool ok = f && fprintf(f, "%s%s/\n", len && text[len - 1] != '\n' ? "\n" : "", MEM_STATE_DIR) > 0;
    if (f && fclose(f)) ok = false;
    if (!ok) rc = herr_set(err, HEARTH_EIO, "cannot write %s: %s", path, strerror(errno));
  }
  free(text);
  free(path);
  return rc;
}

int mem_git_open(const char *dir, mem_git **out, herr *err) {
  *out = NULL;
  if (mkdir(dir, 0755) && errno != EEXIST) return herr_set(err, HEARTH_EIO, "cannot create %s: %s", dir, strerror(errno));
  git_libgit2_init();
  mem_git *g = calloc(1, sizeof *g);
  if (!g || !(g->dir = strdup(dir))) {
    free(g);
    git_libgit2_shutdown();
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  int rc = 0;
  if (git_repository_open_ext(&g->repo, dir, GIT_REPOSITORY_OPEN_NO_SEARCH, NULL) &&
      git_repository_init(&g->repo, dir, 0))
    rc = git_fail(err, "cannot open or make a git repository", dir);
  if (!rc && git_repository_is_bare(g->repo)) rc = herr_set(err, HEARTH_EINVAL, "%s: a bare git repository", dir);
  if (!rc) rc = ignore_state(dir, err);
  if (rc) {
    mem_git_close(g);
    return rc;
  }
  *out = g;
  return 0;
}

void mem_git_close(mem_git *g) {
  if (!g) return;
  git_repository_free(g->repo);
  free(g->dir);
  free(g);
  git_libgit2_shutdown();
}

void mem_git_head(mem_git *g, char out[41]) {
  git_oid oid;
  out[0] = 0;
  if (!git_reference_name_to_id(&oid, g->repo, "HEAD")) git_oid_tostr(out, 41, &oid);
}

static void message_trailers(const char *msg, const char *key, void (*fn)(void *, const char *), void *ctx) {
  size_t k = strlen(key);
  for (const char *p = msg; p && *p;) {
    const char *nl = strchr(p, '\n');
    size_t n = nl ? (size_t)(nl - p) : strlen(p);
    if (n > k + 2 && !strncmp(p, key, k) && p[k] == ':' && p[k + 1] == ' ') {
      char *v = strndup(p + k + 2, n - k - 2);
      if (v) fn(ctx, v);
      free(v);
    }
    p = nl ? nl + 1 : NULL;
  }
}

int mem_git_trailers(mem_git *g, const char *key, void (*fn)(void *ctx, const char *value), void *ctx, herr *err) {
  char head[41];
  mem_git_head(g, head);
  if (!head[0]) return 0;
  git_revwalk *walk = NULL;
  if (git_revwalk_new(&walk, g->repo) || git_revwalk_push_head(walk)) {
    git_revwalk_free(walk);
    return git_fail(err, "cannot walk the history", g->dir);
  }
  git_oid oid;
  int rc = 0;
  while (!rc && !git_revwalk_next(&oid, walk)) {
    git_commit *c = NULL;
    if (git_commit_lookup(&c, g->repo, &oid)) rc = git_fail(err, "cannot read a commit", g->dir);
    else message_trailers(git_commit_message(c), key, fn, ctx);
    git_commit_free(c);
  }
  git_revwalk_free(walk);
  return rc;
}

static int stage_path(mem_git *g, git_index *idx, const char *rel) {
  char *abs = hpath_join(g->dir, rel);
  bool there = abs && hfile_exists(abs);
  free(abs);
  if (there) return git_index_add_bypath(idx, rel);
  git_index_remove_bypath(idx, rel); /* not in the index either: nothing to do */
  return 0;
}

static int signature(git_repository *repo, git_signature **sig) {
  if (!git_signature_default(sig, repo)) return 0;
  return git_signature_now(sig, "hearth", "hearth@localhost");
}

int mem_git_commit(mem_git *g, const char *const *paths, size_t n, const char *message, char out[41], herr *err) {
  git_index *idx = NULL;
  git_tree *tree = NULL;
  git_signature *sig = NULL;
  git_commit *parent = NULL;
  git_oid tree_id, commit_id, head_id;
  int rc = 0;
  if (git_repository_index(&idx, g->repo)) return git_fail(err, "cannot read the git index", g->dir);
  for (size_t i = 0; !rc && i < n; i++)
    if (stage_path(g, idx, paths[i])) rc = git_fail(err, paths[i], g->dir);
  if (!rc && stage_path(g, idx, ".gitignore")) rc = git_fail(err, ".gitignore", g->dir);
  if (!rc && (git_index_write(idx) || git_index_write_tree(&tree_id, idx) || git_tree_lookup(&tree, g->repo, &tree_id)))
    rc = git_fail(err, "cannot write the tree", g->dir);
  if (!rc && signature(g->repo, &sig)) rc = git_fail(err, "no signature for the commit", g->dir);
  bool has_parent = !rc && !git_reference_name_to_id(&head_id, g->repo, "HEAD");
  if (has_parent && git_commit_lookup(&parent, g->repo, &head_id)) rc = git_fail(err, "cannot read HEAD", g->dir);
  const git_commit *parents[1] = {parent};
  if (!rc && git_commit_create(&commit_id, g->repo, "HEAD", sig, sig, NULL, message, tree, parent ? 1 : 0, parents))
    rc = git_fail(err, "cannot commit", g->dir);
  if (!rc) git_oid_tostr(out, 41, &commit_id);
  git_commit_free(parent);
  git_signature_free(sig);
  git_tree_free(tree);
  git_index_free(idx);
  return rc;
}
