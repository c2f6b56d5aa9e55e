/* wiki_git.h — the wiki's git repository through libgit2: made when missing
 * (with a .gitignore that keeps the state folder out), the commit a run
 * starts from, what earlier runs recorded in their commit messages'
 * trailers, and one commit per run. */
#ifndef HEARTH_MEMORY_WIKI_GIT_H
#define HEARTH_MEMORY_WIKI_GIT_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

typedef struct mem_git mem_git;

/* Opens the repository at dir, or makes one (and dir) when there is none.
 * Makes sure dir/.gitignore names the state folder. */
int mem_git_open(const char *dir, mem_git **out, herr *err);
void mem_git_close(mem_git *g);

/* HEAD's commit id (40 hex digits), or "" when the repository has no commit. */
void mem_git_head(mem_git *g, char out[41]);

/* fn(ctx, value) for every trailer line "key: value" of every commit reachable from HEAD. */
int mem_git_trailers(mem_git *g, const char *key, void (*fn)(void *ctx, const char *value), void *ctx, herr *err);

/* Stages the paths (relative to the wiki; a missing file is staged as
 * removed) and .gitignore, and commits with message on HEAD. out: the new
 * commit's id. The author is git's configured user, else "hearth". */
int mem_git_commit(mem_git *g, const char *const *paths, size_t n, const char *message, char out[41], herr *err);

#endif
