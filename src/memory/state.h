/* state.h — the pipeline's state folder, DIR/.hearth-memory/ (the wiki's
 * git ignores it): each stage's result as JSON, kept under runs/<key>/ until
 * the run commits, so a run cut short resumes after its last finished stage.
 * The key hashes the run's inputs (the new logs, the prompts, the engine);
 * the folder also records the wiki commit the run started from, and results
 * made on another commit are thrown away. Also the one content hash the
 * module uses (mem_hash_hex). */
#ifndef HEARTH_MEMORY_STATE_H
#define HEARTH_MEMORY_STATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

#define MEM_STATE_DIR ".hearth-memory"

/* The first 8 bytes of data's SHA-256 as 16 lowercase hex digits. */
void mem_hash_hex(const void *data, size_t len, char out[17]);

typedef struct mem_state {
  char *dir;     /* owned: DIR/.hearth-memory/runs/<key> */
} mem_state;

/* Opens the run folder of key, made on commit base ("" for a wiki with no
 * commit yet). *resumed: it held results made on that commit. Other runs'
 * folders are removed. */
int mem_state_open(const char *wiki_dir, const char *key, const char *base, mem_state *st, bool *resumed, herr *err);
/* Stage k's result (a new reference), or NULL when the stage has not finished. */
json_t *mem_state_load(const mem_state *st, int stage);
/* Keeps stage k's result (written whole, then renamed into place). */
int mem_state_save(const mem_state *st, int stage, const json_t *result, herr *err);
/* Removes every run folder under wiki_dir's state folder (after a commit). */
void mem_state_clear(const char *wiki_dir);
void mem_state_close(mem_state *st);

/* Holds DIR/.hearth-memory/lock for the run (*fd: the lock's descriptor):
 * HEARTH_EINVAL when another run holds it. mem_state_unlock lets go. */
int mem_state_lock(const char *wiki_dir, int *fd, herr *err);
void mem_state_unlock(int fd);

#endif
