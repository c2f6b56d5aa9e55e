/* safetensors.h — zero-copy reader for safetensors files and sharded folders.
 *
 * Files are untrusted: the header length must lie inside the file and be at
 * most 100 MB, the header valid JSON, every dtype known, shape × dtype size
 * equal to the byte range, ranges inside the data section and not
 * overlapping, names valid UTF-8 and unique. A bad file gives one message
 * naming the file, the tensor and the problem.
 */
#ifndef HEARTH_FORMAT_SAFETENSORS_H
#define HEARTH_FORMAT_SAFETENSORS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dict.h"
#include "base/file.h"
#include "base/status.h"

typedef enum st_dtype {
  ST_F64, ST_F32, ST_F16, ST_BF16, ST_I64, ST_I32, ST_I16, ST_I8, ST_U8, ST_BOOL,
  ST_F8_E4M3, ST_F8_E5M2, ST_U16, ST_U32, ST_U64,
  ST_DTYPE_COUNT
} st_dtype;

#define ST_MAX_DIMS 8

typedef struct st_tensor {
  const char *name;            /* borrowed from the set's storage */
  st_dtype dtype;
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  int64_t numel;
  const void *data;            /* borrowed: points into the mmap */
  size_t nbytes;
  int shard;                   /* index of the file that holds it */
} st_tensor;

/* A set of tensors from one file or from every shard of a folder. */
typedef struct st_set {
  st_tensor *tensors;          /* owned, sorted by name */
  size_t count;
  hmmap *maps;                 /* owned, one per shard */
  char **paths;                /* owned, one per shard */
  int nshards;
  json_t *metadata;            /* owned: __metadata__ of the first shard (string→string) or NULL */
  hdict index;                 /* name → position in tensors */
  char *names;                 /* owned storage for tensor names */
} st_set;

/* Opens PATH: a .safetensors file, or a folder holding model.safetensors or
 * model.safetensors.index.json (+ its shards). */
int st_open(st_set *s, const char *path, herr *err);
/* Parses one safetensors file already in memory (used by st_open and the fuzz target). */
int st_parse(const unsigned char *data, size_t size, const char *what, st_tensor **tensors, size_t *count,
             json_t **metadata, char **names, herr *err);
void st_close(st_set *s);
const st_tensor *st_find(const st_set *s, const char *name);
size_t st_dtype_size(st_dtype dt);   /* bytes per element */
const char *st_dtype_name(st_dtype dt);

#endif
