/* file.h — files: read-only mmap, whole-file reads, path helpers. */
#ifndef HEARTH_BASE_FILE_H
#define HEARTH_BASE_FILE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

/* A read-only memory map of a whole file. An empty file maps to data == NULL, size 0. */
typedef struct hmmap {
  const unsigned char *data; /* owned mapping */
  size_t size;
} hmmap;

int hmmap_open(hmmap *m, const char *path, herr *err);
void hmmap_close(hmmap *m);

/* Reads a whole file into a NUL-terminated malloc'd buffer (*out owned by caller). */
int hfile_read(const char *path, char **out, size_t *len, herr *err);
bool hfile_exists(const char *path);
bool hfile_is_dir(const char *path);
/* Joins a and b with one '/' into a malloc'd string (caller frees). */
char *hpath_join(const char *a, const char *b);
/* Folder part of a path as a malloc'd string ("." when there is none). */
char *hpath_dir(const char *path);

#endif
