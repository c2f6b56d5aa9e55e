/* safetensors_write.h — writing one safetensors file: a JSON header (tensors
 * in the order added, optional __metadata__ of strings), padded with spaces
 * to a multiple of 8 bytes, then the tensors' bytes back to back.
 *
 *   st_writer *w = st_writer_new();
 *   st_writer_tensor(w, "model.norm.weight", ST_F32, 1, shape, data);   // data borrowed
 *   st_writer_tensor(w, "model.layers.0.mlp.up_proj.weight", ST_U32, 2, shape, NULL); // bytes from fill()
 *   st_writer_meta(w, "format", "pt");
 *   st_writer_write(w, "model.safetensors", fill, ctx, &err);
 *   st_writer_free(w);
 *
 * As with the GGUF writer, tensor bytes come one tensor at a time, so the
 * model need not fit in memory. Errors in a descriptor are reported by
 * st_writer_write.
 */
#ifndef HEARTH_FORMAT_SAFETENSORS_WRITE_H
#define HEARTH_FORMAT_SAFETENSORS_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "format/safetensors.h"

typedef struct st_writer st_writer;

st_writer *st_writer_new(void);   /* NULL on out of memory */
void st_writer_free(st_writer *w);
/* Adds a string to __metadata__ (copied). */
void st_writer_meta(st_writer *w, const char *key, const char *value);
/* Adds a tensor; data borrowed (must live until st_writer_write) or NULL for
 * the fill callback. Returns its index, or -1 after an error (bad dtype or
 * shape, duplicate name) which st_writer_write reports. */
int st_writer_tensor(st_writer *w, const char *name, st_dtype dtype, int ndim, const int64_t *shape, const void *data);
size_t st_writer_tensor_bytes(const st_writer *w, int i);

/* Fills dst (st_writer_tensor_bytes(w, i) bytes) with tensor i. */
typedef int (*st_fill_fn)(void *ctx, int i, void *dst, herr *err);

/* Writes PATH (through PATH.tmp, renamed at the end). */
int st_writer_write(st_writer *w, const char *path, st_fill_fn fill, void *ctx, herr *err);

#endif
