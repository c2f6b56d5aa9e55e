/* safetensors_write.c — the safetensors writer (see safetensors_write.h):
 * tensor descriptors, the JSON header built with jansson, and the data
 * written tensor by tensor through tensor_write.c. Knows the container
 * only, not model layouts. */
#include "format/safetensors_write.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/vec.h"
#include "format/tensor_write.h"

typedef struct st_wtensor {
  char *name; /* owned */
  st_dtype dtype;
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  size_t nbytes;
  const void *data; /* borrowed, or NULL (fill callback) */
} st_wtensor;

struct st_writer {
  st_wtensor *ts; /* owned */
  size_t nt, cap;
  json_t *meta;   /* owned, or NULL */
  bool oom;
  char bad[512];
};

st_writer *st_writer_new(void) { return calloc(1, sizeof(st_writer)); }

void st_writer_free(st_writer *w) {
  if (!w) return;
  for (size_t i = 0; i < w->nt; i++) free(w->ts[i].name);
  free(w->ts);
  json_decref(w->meta);
  free(w);
}

void st_writer_meta(st_writer *w, const char *key, const char *value) {
  if (!w->meta && !(w->meta = json_object())) {
    w->oom = true;
    return;
  }
  if (json_object_set_new(w->meta, key, json_string(value))) w->oom = true;
}

int st_writer_tensor(st_writer *w, const char *name, st_dtype dtype, int ndim, const int64_t *shape, const void *data) {
#define BAD(...)                                                  \
  do {                                                            \
    if (!w->bad[0]) snprintf(w->bad, sizeof w->bad, __VA_ARGS__); \
    return -1;                                                    \
  } while (0)
  if ((unsigned)dtype >= ST_DTYPE_COUNT) BAD("tensor '%s': unknown dtype %d", name, (int)dtype);
  if (ndim < 0 || ndim > ST_MAX_DIMS) BAD("tensor '%s': %d dimensions (0..%d)", name, ndim, ST_MAX_DIMS);
  if (!strcmp(name, "__metadata__")) BAD("a tensor may not be called '__metadata__'");
  size_t n = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0) BAD("tensor '%s': dimension %d is %lld", name, d, (long long)shape[d]);
    n *= (size_t)shape[d];
  }
  for (size_t i = 0; i < w->nt; i++)
    if (!strcmp(w->ts[i].name, name)) BAD("tensor '%s' is added twice", name);
#undef BAD
  if (w->nt == w->cap && !HGROW(w->ts, w->cap, w->nt + 1)) {
    w->oom = true;
    return -1;
  }
  char *nm = strdup(name);
  if (!nm) {
    w->oom = true;
    return -1;
  }
  st_wtensor *t = &w->ts[w->nt];
  *t = (st_wtensor){.name = nm, .dtype = dtype, .ndim = ndim, .nbytes = n * st_dtype_size(dtype), .data = data};
  for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
  return (int)w->nt++;
}

size_t st_writer_tensor_bytes(const st_writer *w, int i) { return i >= 0 && (size_t)i < w->nt ? w->ts[i].nbytes : 0; }

/* The header JSON (malloc'd) padded with spaces to a multiple of 8 bytes. */
static char *header_json(const st_writer *w, size_t *len) {
  json_t *h = json_object();
  if (!h) return NULL;
  if (w->meta) json_object_set(h, "__metadata__", w->meta);
  size_t off = 0;
  for (size_t i = 0; i < w->nt; i++) {
    const st_wtensor *t = &w->ts[i];
    json_t *shape = json_array();
    for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
    json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", st_dtype_name(t->dtype), "shape", shape, "data_offsets",
                          (json_int_t)off, (json_int_t)(off + t->nbytes));
    if (!e || json_object_set_new(h, t->name, e)) {
      json_decref(h);
      return NULL;
    }
    off += t->nbytes;
  }
  /* JSON_PRESERVE_ORDER keeps the insertion order: tensors in file order */
  char *s = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(h);
  if (!s) return NULL;
  size_t n = strlen(s), padded = (n + 7) / 8 * 8;
  char *p = realloc(s, padded + 1);
  if (!p) {
    free(s);
    return NULL;
  }
  memset(p + n, ' ', padded - n);
  p[padded] = 0;
  *len = padded;
  return p;
}

static void tensor_of(const void *writer, size_t i, tensor_bytes *out) {
  const st_wtensor *t = &((const st_writer *)writer)->ts[i];
  *out = (tensor_bytes){.name = t->name, .data = t->data, .nbytes = t->nbytes};
}

int st_writer_write(st_writer *w, const char *path, st_fill_fn fill, void *ctx, herr *err) {
  if (w->oom) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory building the safetensors header", path);
  if (w->bad[0]) return herr_set(err, HEARTH_EINVAL, "%s: %s", path, w->bad);
  for (size_t i = 0; i < w->nt; i++)
    if (!w->ts[i].data && !fill && w->ts[i].nbytes) return herr_set(err, HEARTH_EINVAL, "%s: tensor '%s' has no data", path, w->ts[i].name);
  size_t hlen = 0;
  char *hdr = header_json(w, &hlen);
  if (!hdr) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory building the safetensors header", path);
  /* the header's length (8 bytes, little-endian), then the header */
  char *head = malloc(8 + hlen);
  if (!head) {
    free(hdr);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  uint64_t n8 = hlen;
  memcpy(head, &n8, 8);
  memcpy(head + 8, hdr, hlen);
  int rc = tensor_write_file(path, head, 8 + hlen, w, w->nt, tensor_of, 1, fill, ctx, err);
  free(head);
  free(hdr);
  return rc;
}
