/* gguf.h — zero-copy reader for GGUF files (versions 2 and 3).
 *
 * The file is mmap'd and untrusted: every count and string length is bounded
 * by the bytes left in the file, array element types must be valid scalar or
 * string types (no nested arrays), keys unique and free of NUL bytes, tensor
 * names unique, dims positive with a product that fits, the ggml type known,
 * tensor offsets aligned to general.alignment (default 32) and the tensor's
 * bytes inside the data section. A bad file gives one message naming the
 * file, the key or tensor, and the problem.
 *
 * Strings (values and array elements) point into the mapping and are NOT
 * NUL-terminated; keys and tensor names are copied and NUL-terminated.
 * Numeric array data points into the mapping and may be unaligned: read it
 * with the gguf_arr_* accessors or memcpy.
 */
#ifndef HEARTH_FORMAT_GGUF_H
#define HEARTH_FORMAT_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* Metadata value types, numbered as in the file. */
typedef enum gguf_type {
  GGUF_TYPE_UINT8 = 0,
  GGUF_TYPE_INT8 = 1,
  GGUF_TYPE_UINT16 = 2,
  GGUF_TYPE_INT16 = 3,
  GGUF_TYPE_UINT32 = 4,
  GGUF_TYPE_INT32 = 5,
  GGUF_TYPE_FLOAT32 = 6,
  GGUF_TYPE_BOOL = 7,
  GGUF_TYPE_STRING = 8,
  GGUF_TYPE_ARRAY = 9,
  GGUF_TYPE_UINT64 = 10,
  GGUF_TYPE_INT64 = 11,
  GGUF_TYPE_FLOAT64 = 12,
  GGUF_TYPE_COUNT
} gguf_type;

/* Tensor element types, numbered as GGUF files number them (ggml's numbering). */
typedef enum gguf_tensor_type {
  GGUF_TENSOR_F32 = 0,
  GGUF_TENSOR_F16 = 1,
  GGUF_TENSOR_Q4_0 = 2,
  GGUF_TENSOR_Q4_1 = 3,
  GGUF_TENSOR_Q5_0 = 6,
  GGUF_TENSOR_Q5_1 = 7,
  GGUF_TENSOR_Q8_0 = 8,
  GGUF_TENSOR_Q8_1 = 9,
  GGUF_TENSOR_Q2_K = 10,
  GGUF_TENSOR_Q3_K = 11,
  GGUF_TENSOR_Q4_K = 12,
  GGUF_TENSOR_Q5_K = 13,
  GGUF_TENSOR_Q6_K = 14,
  GGUF_TENSOR_Q8_K = 15,
  GGUF_TENSOR_IQ2_XXS = 16,
  GGUF_TENSOR_IQ2_XS = 17,
  GGUF_TENSOR_IQ3_XXS = 18,
  GGUF_TENSOR_IQ1_S = 19,
  GGUF_TENSOR_IQ4_NL = 20,
  GGUF_TENSOR_IQ3_S = 21,
  GGUF_TENSOR_IQ2_S = 22,
  GGUF_TENSOR_IQ4_XS = 23,
  GGUF_TENSOR_I8 = 24,
  GGUF_TENSOR_I16 = 25,
  GGUF_TENSOR_I32 = 26,
  GGUF_TENSOR_I64 = 27,
  GGUF_TENSOR_F64 = 28,
  GGUF_TENSOR_IQ1_M = 29,
  GGUF_TENSOR_BF16 = 30,
  GGUF_TENSOR_TQ1_0 = 34,
  GGUF_TENSOR_TQ2_0 = 35,
  GGUF_TENSOR_MXFP4 = 39,
  GGUF_TENSOR_TYPE_COUNT = 40
} gguf_tensor_type;

/* Storage of one ggml type: elements come in blocks of block_size, each
 * block type_size bytes. */
typedef struct gguf_tensor_type_info {
  const char *name;   /* "q4_K", "f16", ... */
  int block_size;
  size_t type_size;
} gguf_tensor_type_info;

/* NULL when t is not a known type. */
const gguf_tensor_type_info *gguf_tensor_type_get(uint32_t t);
const char *gguf_tensor_type_name(uint32_t t);           /* "?" when unknown */
/* Bytes of a row of ne elements; 0 when the type is unknown or ne is not a multiple of the block size. */
size_t gguf_row_size(uint32_t t, int64_t ne);
const char *gguf_type_name(uint32_t t);           /* "u32", "string", "array", ...; "?" when unknown */

typedef struct gguf_str {
  const char *ptr;    /* borrowed from the mapping; not NUL-terminated */
  uint64_t len;
} gguf_str;

typedef struct gguf_arr {
  gguf_type type;     /* element type (never GGUF_TYPE_ARRAY) */
  uint64_t n;
  const void *raw;    /* numeric/bool: n packed elements in the mapping, possibly unaligned; NULL for strings */
  const gguf_str *strs; /* strings: n entries (owned by the file); NULL otherwise */
} gguf_arr;

typedef struct gguf_kv {
  const char *key;    /* owned by the file, NUL-terminated */
  gguf_type type;
  union {
    uint8_t u8;
    int8_t i8;
    uint16_t u16;
    int16_t i16;
    uint32_t u32;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    float f32;
    double f64;
    bool b;
    gguf_str str;
    gguf_arr arr;
  } v;
} gguf_kv;

#define GGUF_MAX_DIMS 4

typedef struct gguf_tensor {
  const char *name;   /* owned by the file, NUL-terminated */
  gguf_tensor_type type;
  int ndim;
  int64_t dims[GGUF_MAX_DIMS]; /* ggml order: dims[0] is the contiguous one; unused dims are 1 */
  int64_t nelements;
  uint64_t offset;    /* from the start of the data section */
  const void *data;   /* borrowed: points into the mapping */
  size_t nbytes;
} gguf_tensor;

typedef struct gguf_file gguf_file;

/* Maps and parses PATH. *out is owned by the caller (gguf_close). */
int gguf_open(gguf_file **out, const char *path, herr *err);
/* gguf_open holding the file as mode says (HMMAP_MAP or HMMAP_RESIDENT, base/file.h). */
int gguf_open_mode(gguf_file **out, const char *path, int mode, herr *err);
/* Parses a GGUF image already in memory (borrowed: must outlive *out). `what`
 * names it in messages. */
int gguf_parse(const unsigned char *data, size_t size, const char *what, gguf_file **out, herr *err);
void gguf_close(gguf_file *g);

const char *gguf_path(const gguf_file *g);         /* the `what`/path given at open */
uint32_t gguf_version(const gguf_file *g);
size_t gguf_alignment(const gguf_file *g);
size_t gguf_data_offset(const gguf_file *g);       /* start of the data section in the file */

/* Metadata. */
size_t gguf_kv_count(const gguf_file *g);
const gguf_kv *gguf_kv_at(const gguf_file *g, size_t i);  /* NULL out of range */
const gguf_kv *gguf_find_kv(const gguf_file *g, const char *key); /* NULL when absent */
bool gguf_has(const gguf_file *g, const char *key);

/* Typed getters. Absent key: HEARTH_ENOTFOUND ("<file>: key 'k' not found");
 * another type: HEARTH_EFORMAT ("<file>: key 'k' is i32, expected u32"). */
int gguf_get_u8(const gguf_file *g, const char *key, uint8_t *out, herr *err);
int gguf_get_i8(const gguf_file *g, const char *key, int8_t *out, herr *err);
int gguf_get_u16(const gguf_file *g, const char *key, uint16_t *out, herr *err);
int gguf_get_i16(const gguf_file *g, const char *key, int16_t *out, herr *err);
int gguf_get_u32(const gguf_file *g, const char *key, uint32_t *out, herr *err);
int gguf_get_i32(const gguf_file *g, const char *key, int32_t *out, herr *err);
int gguf_get_u64(const gguf_file *g, const char *key, uint64_t *out, herr *err);
int gguf_get_i64(const gguf_file *g, const char *key, int64_t *out, herr *err);
int gguf_get_f32(const gguf_file *g, const char *key, float *out, herr *err);
int gguf_get_f64(const gguf_file *g, const char *key, double *out, herr *err);
int gguf_get_bool(const gguf_file *g, const char *key, bool *out, herr *err);
/* *s borrowed from the mapping, not NUL-terminated. */
int gguf_get_str(const gguf_file *g, const char *key, const char **s, size_t *len, herr *err);
/* The string as a malloc'd NUL-terminated copy (caller frees); EFORMAT when it holds a NUL. */
int gguf_get_strdup(const gguf_file *g, const char *key, char **out, herr *err);
int gguf_get_arr(const gguf_file *g, const char *key, gguf_arr *out, herr *err);
/* Lenient getters: any integer type (or bool) that fits int64 / any float type. */
int gguf_get_int(const gguf_file *g, const char *key, int64_t *out, herr *err);
int gguf_get_float(const gguf_file *g, const char *key, double *out, herr *err);

/* Array elements. Out-of-range i or a mismatched element type gives 0 / NULL. */
int64_t gguf_arr_int(const gguf_arr *a, uint64_t i);    /* any integer or bool element type */
double gguf_arr_float(const gguf_arr *a, uint64_t i);   /* float or integer element types */
const char *gguf_arr_str(const gguf_arr *a, uint64_t i, size_t *len); /* borrowed, not NUL-terminated */
size_t gguf_type_size(uint32_t t);                      /* bytes of a scalar type; 0 for string/array/unknown */

/* Tensors, in file order. */
size_t gguf_tensor_count(const gguf_file *g);
const gguf_tensor *gguf_tensor_at(const gguf_file *g, size_t i);          /* NULL out of range */
const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name); /* NULL when absent */

#endif
