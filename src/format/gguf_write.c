/* gguf_write.c — the GGUF writer (see gguf_write.h): metadata entries kept
 * already encoded, tensor descriptors with offsets laid out at write time,
 * and the file written in one pass (the tensors streamed by tensor_write.c).
 * Knows the container format only, not what any key or tensor means to a
 * model. */
#include "format/gguf_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/vec.h"
#include "format/tensor_write.h"

#define GGUF_WRITE_ALIGN 32

typedef struct wkv {
  char *key;   /* owned */
  hbuf enc;    /* owned: type + value, as in the file (key excluded) */
} wkv;

typedef struct wtensor {
  char *name;  /* owned */
  gguf_tensor_type type;
  int ndim;
  int64_t dims[GGUF_MAX_DIMS];
  size_t nbytes;
  uint64_t offset;
  const void *data; /* borrowed, or NULL (fill callback) */
} wtensor;

struct gguf_writer {
  wkv *kvs;         /* owned */
  size_t nkv, capkv;
  wtensor *ts;      /* owned */
  size_t nt, capt;
  bool oom;
  char bad[512];    /* first error in a tensor descriptor */
};

gguf_writer *gguf_writer_new(void) { return calloc(1, sizeof(gguf_writer)); }

void gguf_writer_free(gguf_writer *w) {
  if (!w) return;
  for (size_t i = 0; i < w->nkv; i++) {
    free(w->kvs[i].key);
    hbuf_free(&w->kvs[i].enc);
  }
  for (size_t i = 0; i < w->nt; i++) free(w->ts[i].name);
  free(w->kvs);
  free(w->ts);
  free(w);
}

bool gguf_writer_has(const gguf_writer *w, const char *key) {
  for (size_t i = 0; i < w->nkv; i++)
    if (!strcmp(w->kvs[i].key, key)) return true;
  return false;
}

/* The entry for key, emptied (new or replaced); NULL on out of memory. */
static hbuf *kv_slot(gguf_writer *w, const char *key) {
  for (size_t i = 0; i < w->nkv; i++)
    if (!strcmp(w->kvs[i].key, key)) {
      hbuf_clear(&w->kvs[i].enc);
      return &w->kvs[i].enc;
    }
  if (w->nkv == w->capkv && !HGROW(w->kvs, w->capkv, w->nkv + 1)) {
    w->oom = true;
    return NULL;
  }
  char *k = strdup(key);
  if (!k) {
    w->oom = true;
    return NULL;
  }
  w->kvs[w->nkv] = (wkv){.key = k};
  return &w->kvs[w->nkv++].enc;
}

static void put_u32(hbuf *b, uint32_t v) { hbuf_append(b, &v, 4); }
static void put_u64(hbuf *b, uint64_t v) { hbuf_append(b, &v, 8); }
static void put_strn(hbuf *b, const char *s, size_t n) {
  put_u64(b, n);
  hbuf_append(b, s, n);
}

static void put_scalar(gguf_writer *w, const char *key, gguf_type t, const void *v, size_t size) {
  hbuf *b = kv_slot(w, key);
  if (!b) return;
  put_u32(b, (uint32_t)t);
  hbuf_append(b, v, size);
  if (b->oom) w->oom = true;
}

void gguf_writer_u32(gguf_writer *w, const char *key, uint32_t v) { put_scalar(w, key, GGUF_TYPE_UINT32, &v, 4); }
void gguf_writer_i32(gguf_writer *w, const char *key, int32_t v) { put_scalar(w, key, GGUF_TYPE_INT32, &v, 4); }
void gguf_writer_u64(gguf_writer *w, const char *key, uint64_t v) { put_scalar(w, key, GGUF_TYPE_UINT64, &v, 8); }
void gguf_writer_f32(gguf_writer *w, const char *key, float v) { put_scalar(w, key, GGUF_TYPE_FLOAT32, &v, 4); }
void gguf_writer_bool(gguf_writer *w, const char *key, bool v) {
  uint8_t b = v ? 1 : 0;
  put_scalar(w, key, GGUF_TYPE_BOOL, &b, 1);
}

void gguf_writer_strn(gguf_writer *w, const char *key, const char *s, size_t len) {
  hbuf *b = kv_slot(w, key);
  if (!b) return;
  put_u32(b, GGUF_TYPE_STRING);
  put_strn(b, s, len);
  if (b->oom) w->oom = true;
}

void gguf_writer_str(gguf_writer *w, const char *key, const char *s) { gguf_writer_strn(w, key, s, strlen(s)); }

void gguf_writer_arr(gguf_writer *w, const char *key, gguf_type t, const void *data, size_t n) {
  size_t es = gguf_type_size(t);
  if (!es) {
    if (!w->bad[0]) snprintf(w->bad, sizeof w->bad, "metadata key '%s': array element type %u is not a scalar type", key, (unsigned)t);
    return;
  }
  hbuf *b = kv_slot(w, key);
  if (!b) return;
  put_u32(b, GGUF_TYPE_ARRAY);
  put_u32(b, (uint32_t)t);
  put_u64(b, n);
  if (n) hbuf_append(b, data, n * es);
  if (b->oom) w->oom = true;
}

void gguf_writer_arr_str(gguf_writer *w, const char *key, const char *const *strs, const size_t *lens, size_t n) {
  hbuf *b = kv_slot(w, key);
  if (!b) return;
  put_u32(b, GGUF_TYPE_ARRAY);
  put_u32(b, GGUF_TYPE_STRING);
  put_u64(b, n);
  for (size_t i = 0; i < n; i++) put_strn(b, strs[i], lens ? lens[i] : strlen(strs[i]));
  if (b->oom) w->oom = true;
}

void gguf_writer_copy_kv(gguf_writer *w, const gguf_kv *kv) {
  if (kv->type == GGUF_TYPE_STRING) {
    gguf_writer_strn(w, kv->key, kv->v.str.ptr, kv->v.str.len);
    return;
  }
  if (kv->type != GGUF_TYPE_ARRAY) {
    put_scalar(w, kv->key, kv->type, &kv->v, gguf_type_size(kv->type));
    return;
  }
  const gguf_arr *a = &kv->v.arr;
  if (a->type != GGUF_TYPE_STRING) {
    gguf_writer_arr(w, kv->key, a->type, a->raw, a->n);
    return;
  }
  hbuf *b = kv_slot(w, kv->key);
  if (!b) return;
  put_u32(b, GGUF_TYPE_ARRAY);
  put_u32(b, GGUF_TYPE_STRING);
  put_u64(b, a->n);
  for (uint64_t i = 0; i < a->n; i++) put_strn(b, a->strs[i].ptr, a->strs[i].len);
  if (b->oom) w->oom = true;
}

int gguf_writer_tensor(gguf_writer *w, const char *name, gguf_tensor_type type, int ndim, const int64_t *dims, const void *data) {
  const gguf_tensor_type_info *ti = gguf_tensor_type_get(type);
#define BAD(...)                                                              \
  do {                                                                        \
    if (!w->bad[0]) snprintf(w->bad, sizeof w->bad, __VA_ARGS__);             \
    return -1;                                                                \
  } while (0)
  if (!ti) BAD("tensor '%s': unknown ggml type %u", name, (unsigned)type);
  if (ndim < 1 || ndim > GGUF_MAX_DIMS) BAD("tensor '%s': %d dimensions (1..%d)", name, ndim, GGUF_MAX_DIMS);
  int64_t rows = 1;
  for (int d = 0; d < ndim; d++) {
    if (dims[d] <= 0) BAD("tensor '%s': dimension %d is %lld", name, d, (long long)dims[d]);
    if (d) rows *= dims[d];
  }
  size_t row = gguf_row_size(type, dims[0]);
  if (!row) BAD("tensor '%s': %lld elements per row is not a whole number of %s blocks (%d)", name, (long long)dims[0], ti->name,
                ti->block_size);
  for (size_t i = 0; i < w->nt; i++)
    if (!strcmp(w->ts[i].name, name)) BAD("tensor '%s' is added twice", name);
#undef BAD
  if (w->nt == w->capt && !HGROW(w->ts, w->capt, w->nt + 1)) {
    w->oom = true;
    return -1;
  }
  char *nm = strdup(name);
  if (!nm) {
    w->oom = true;
    return -1;
  }
  wtensor *t = &w->ts[w->nt];
  *t = (wtensor){.name = nm, .type = type, .ndim = ndim, .nbytes = row * (size_t)rows, .data = data};
  for (int d = 0; d < GGUF_MAX_DIMS; d++) t->dims[d] = d < ndim ? dims[d] : 1;
  return (int)w->nt++;
}

size_t gguf_writer_tensor_bytes(const gguf_writer *w, int i) { return i >= 0 && (size_t)i < w->nt ? w->ts[i].nbytes : 0; }
size_t gguf_writer_tensor_count(const gguf_writer *w) { return w->nt; }

static size_t pad_to(size_t n, size_t a) { return (n + a - 1) / a * a; }

static void tensor_of(const void *writer, size_t i, tensor_bytes *out) {
  const wtensor *t = &((const gguf_writer *)writer)->ts[i];
  *out = (tensor_bytes){.name = t->name, .data = t->data, .nbytes = t->nbytes};
}

int gguf_writer_write(gguf_writer *w, const char *path, gguf_fill_fn fill, void *ctx, herr *err) {
  if (w->oom) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory building the GGUF header", path);
  if (w->bad[0]) return herr_set(err, HEARTH_EINVAL, "%s: %s", path, w->bad);
  for (size_t i = 0; i < w->nt; i++)
    if (!w->ts[i].data && !fill) return herr_set(err, HEARTH_EINVAL, "%s: tensor '%s' has no data", path, w->ts[i].name);
  if (!gguf_writer_has(w, "general.alignment")) gguf_writer_u32(w, "general.alignment", GGUF_WRITE_ALIGN);
  hbuf h = {0};
  hbuf_append(&h, "GGUF", 4);
  put_u32(&h, 3);
  put_u64(&h, w->nt);
  put_u64(&h, w->nkv);
  for (size_t i = 0; i < w->nkv; i++) {
    put_strn(&h, w->kvs[i].key, strlen(w->kvs[i].key));
    hbuf_append(&h, w->kvs[i].enc.data, w->kvs[i].enc.len);
  }
  uint64_t off = 0;
  for (size_t i = 0; i < w->nt; i++) {
    wtensor *t = &w->ts[i];
    t->offset = off;
    off += pad_to(t->nbytes, GGUF_WRITE_ALIGN);
    put_strn(&h, t->name, strlen(t->name));
    put_u32(&h, (uint32_t)t->ndim);
    for (int d = 0; d < t->ndim; d++) put_u64(&h, (uint64_t)t->dims[d]);
    put_u32(&h, (uint32_t)t->type);
    put_u64(&h, t->offset);
  }
  static const char zeros[GGUF_WRITE_ALIGN] = {0};
  hbuf_append(&h, zeros, pad_to(h.len, GGUF_WRITE_ALIGN) - h.len);
  if (h.oom) {
    hbuf_free(&h);
    return herr_set(err, HEARTH_ENOMEM, "%s: out of memory building the GGUF header", path);
  }
  int rc = tensor_write_file(path, h.data, h.len, w, w->nt, tensor_of, GGUF_WRITE_ALIGN, fill, ctx, err);
  hbuf_free(&h);
  return rc;
}
