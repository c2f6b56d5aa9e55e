/* tensor_write.h — how the writers (gguf_write, safetensors_write) put a
 * file on disk: a header, then each tensor's bytes in order (borrowed, or
 * made by the caller's fill callback into one reused buffer), each padded
 * with zeros to the alignment, written to PATH.tmp and renamed to PATH only
 * when whole, so a failed write never leaves a partial file under the name.
 * Knows neither container's layout. */
#ifndef HEARTH_FORMAT_TENSOR_WRITE_H
#define HEARTH_FORMAT_TENSOR_WRITE_H

#include <stddef.h>

#include "base/status.h"

/* One tensor's bytes as a writer holds them. */
typedef struct tensor_bytes {
  const char *name;  /* borrowed: for messages */
  const void *data;  /* borrowed, or NULL: made by the fill callback */
  size_t nbytes;
} tensor_bytes;

/* Tensor i of the writer. */
typedef void (*tensor_bytes_fn)(const void *writer, size_t i, tensor_bytes *out);
/* Fills dst (nbytes of tensor i) for a tensor without data. */
typedef int (*tensor_fill_fn)(void *ctx, int i, void *dst, herr *err);

/* Writes head[0..head_len), then the n tensors (get(writer, i)), each
 * followed by zeros up to a multiple of align (1: none), to path. A tensor of
 * no bytes writes nothing and is not filled. */
int tensor_write_file(const char *path, const void *head, size_t head_len, const void *writer, size_t n,
                      tensor_bytes_fn get, size_t align, tensor_fill_fn fill, void *ctx, herr *err);

#endif
