/* file.h — files: read-only mmap, whole-file reads and copies, path helpers. */
#ifndef HEARTH_BASE_FILE_H
#define HEARTH_BASE_FILE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

/* A read-only memory map of a whole file. An empty file maps to data == NULL, size 0. */
typedef struct hmmap {
  const unsigned char *data; /* owned mapping */
  size_t size;
  void *base;                /* what to unmap (data, or below it when aligned) */
  size_t mapped;             /* bytes mapped at base */
} hmmap;

/* How hmmap_open_mode holds the file:
 *   HMMAP_MAP       a private read-only mapping of the file (pages come from
 *                   the page cache as they are touched);
 *   HMMAP_RESIDENT  read whole into anonymous memory aligned to 2 MiB and
 *                   advised for transparent huge pages: what model weights
 *                   use, since streaming them through 4 KiB page-cache pages
 *                   runs at a fraction of the memory bandwidth. */
enum { HMMAP_MAP = 0, HMMAP_RESIDENT = 1 };

int hmmap_open(hmmap *m, const char *path, herr *err); /* HMMAP_MAP */
int hmmap_open_mode(hmmap *m, const char *path, int mode, herr *err);
void hmmap_close(hmmap *m);
/* Gives back the whole pages inside [p, p + n) of an HMMAP_MAP mapping: they
 * stop counting as resident and are read from the file again when next touched. */
void hmmap_drop(const void *p, size_t n);

/* Reads a whole file into a NUL-terminated malloc'd buffer (*out owned by caller). */
int hfile_read(const char *path, char **out, size_t *len, herr *err);
/* Writes a copy of the file from at to (created or truncated); errors name the file. */
int hfile_copy(const char *from, const char *to, herr *err);
bool hfile_exists(const char *path);
bool hfile_is_dir(const char *path);
/* Joins a and b with one '/' into a malloc'd string (caller frees). */
char *hpath_join(const char *a, const char *b);
/* Folder part of a path as a malloc'd string ("." when there is none). */
char *hpath_dir(const char *path);

#endif
