/* gguf_write.h — writing GGUF files (version 3): metadata of any scalar,
 * string or array type, then tensors aligned to general.alignment (32).
 *
 *   gguf_writer *w = gguf_writer_new();
 *   gguf_writer_str(w, "general.architecture", "llama");
 *   gguf_writer_u32(w, "llama.block_count", 16);
 *   gguf_writer_tensor(w, "output_norm.weight", GGUF_TENSOR_F32, 1, dims, data);   // data borrowed
 *   gguf_writer_tensor(w, "blk.0.attn_q.weight", GGUF_TENSOR_Q4_0, 2, dims, NULL); // bytes from fill()
 *   gguf_writer_write(w, "out.gguf", fill, ctx, &err);
 *   gguf_writer_free(w);
 *
 * Tensor bytes are produced one tensor at a time (a borrowed pointer given
 * when the tensor is added, or the fill callback at write time), so a model
 * larger than memory can be written. Keys and names are copied. Allocation
 * failures are remembered and reported by gguf_writer_write.
 */
#ifndef HEARTH_FORMAT_GGUF_WRITE_H
#define HEARTH_FORMAT_GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "format/gguf.h"

typedef struct gguf_writer gguf_writer;

/* NULL on out of memory. */
gguf_writer *gguf_writer_new(void);
void gguf_writer_free(gguf_writer *w);

/* Metadata, written in the order added. A key added twice keeps its first
 * place and takes the new value. */
void gguf_writer_u32(gguf_writer *w, const char *key, uint32_t v);
void gguf_writer_i32(gguf_writer *w, const char *key, int32_t v);
void gguf_writer_u64(gguf_writer *w, const char *key, uint64_t v);
void gguf_writer_f32(gguf_writer *w, const char *key, float v);
void gguf_writer_bool(gguf_writer *w, const char *key, bool v);
void gguf_writer_str(gguf_writer *w, const char *key, const char *s);
void gguf_writer_strn(gguf_writer *w, const char *key, const char *s, size_t len);
/* Numeric array: n elements of scalar type t (packed, little-endian) copied from data. */
void gguf_writer_arr(gguf_writer *w, const char *key, gguf_type t, const void *data, size_t n);
/* String array: n strings (lens may be NULL for NUL-terminated ones), copied. */
void gguf_writer_arr_str(gguf_writer *w, const char *key, const char *const *strs, const size_t *lens, size_t n);
/* Copies one key of another file (any type) under the same name. */
void gguf_writer_copy_kv(gguf_writer *w, const gguf_kv *kv);
bool gguf_writer_has(const gguf_writer *w, const char *key);

/* Adds a tensor. dims in ggml order (dims[0] contiguous). data: borrowed
 * bytes (must live until gguf_writer_write), or NULL to get them from the
 * fill callback. Returns its index (0, 1, ...), or -1 after an error
 * (unknown type, bad dims, a row that is not whole blocks, a duplicate name):
 * the error is reported by gguf_writer_write. */
int gguf_writer_tensor(gguf_writer *w, const char *name, gguf_tensor_type type, int ndim, const int64_t *dims, const void *data);
/* Bytes tensor i takes (0 when out of range). */
size_t gguf_writer_tensor_bytes(const gguf_writer *w, int i);
size_t gguf_writer_tensor_count(const gguf_writer *w);

/* Fills dst (gguf_writer_tensor_bytes(w, i) bytes) with tensor i. */
typedef int (*gguf_fill_fn)(void *ctx, int i, void *dst, herr *err);

/* Writes the file (to PATH.tmp, renamed at the end). fill may be NULL when
 * every tensor was given its data. */
int gguf_writer_write(gguf_writer *w, const char *path, gguf_fill_fn fill, void *ctx, herr *err);

#endif
