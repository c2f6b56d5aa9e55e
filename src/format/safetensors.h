/* safetensors.h — zero-copy reader for safetensors files and sharded folders.
 *
 * Files are untrusted: the header length must lie inside the file and be at
 * most 100 MB, the header valid JSON, every dtype known, shape × dtype size
 * equal to the byte range, ranges inside the data section and not
 * overlapping, names valid UTF-8 and unique (across shards too), and a
 * sharded folder's weight_map must agree with what the shards hold. A bad
 * file gives one message naming the file, the tensor and the problem.
 *
 * Tensor data is not copied: st_tensor.data points into the read-only map
 * of its file and stays valid until st_close. It may be unaligned (the
 * header length is arbitrary); read it with memcpy or st_to_f32.
 */
#ifndef HEARTH_FORMAT_SAFETENSORS_H
#define HEARTH_FORMAT_SAFETENSORS_H

#include <jansson.h>
#include <stdbool.h>
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
#define ST_MAX_HEADER_BYTES (100u * 1000u * 1000u)

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
  int mode;                    /* HMMAP_MAP or HMMAP_RESIDENT (base/file.h) */
} st_set;

/* Opens PATH: a .safetensors file, a model.safetensors.index.json, or a
 * folder holding model.safetensors, model.safetensors.index.json (+ its
 * shards) or exactly one other .safetensors file. On failure s is left
 * closed (st_close on it is harmless). */
int st_open(st_set *s, const char *path, herr *err);
/* st_open holding the shards as mode says (HMMAP_MAP or HMMAP_RESIDENT, base/file.h). */
int st_open_mode(st_set *s, const char *path, int mode, herr *err);
/* Parses one safetensors file already in memory (used by st_open and the
 * fuzz target). `what` names the file in messages. On success *tensors
 * (owned, sorted by name, shard 0, data pointing into `data`), *names (owned
 * storage of the names) and, when metadata is not NULL, *metadata (owned or
 * NULL when the file has none) are set; on failure they are NULL. */
int st_parse(const unsigned char *data, size_t size, const char *what, st_tensor **tensors, size_t *count,
             json_t **metadata, char **names, herr *err);
void st_close(st_set *s);
/* NULL when absent. */
const st_tensor *st_find(const st_set *s, const char *name);
size_t st_dtype_size(st_dtype dt);   /* bytes per element */
const char *st_dtype_name(st_dtype dt);   /* "F32", "BF16", ... */
/* Parses a dtype name as written in headers; false when unknown. */
bool st_dtype_from_name(const char *name, st_dtype *dt);
bool st_dtype_is_float(st_dtype dt);  /* F64 F32 F16 BF16 F8_E4M3 F8_E5M2 */
/* Converts every element of a float tensor (F64, F32, F16, BF16, F8_E4M3,
 * F8_E5M2) to f32 into out (numel floats, caller's). Other dtypes give
 * HEARTH_EUNSUPPORTED. */
int st_to_f32(const st_tensor *t, float *out, herr *err);
/* One element conversions, exposed for tests and other readers. */
float st_f16_to_f32(uint16_t h);
float st_bf16_to_f32(uint16_t b);
float st_f8e4m3_to_f32(uint8_t v);
float st_f8e5m2_to_f32(uint8_t v);

#endif
