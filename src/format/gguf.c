/* gguf.c — parses GGUF v2/v3 files from a read-only mapping (see gguf.h).
 *
 * Owns: the layout of the file (header, metadata key/values, tensor infos,
 * the aligned data section), its validation, and the ggml type table (block
 * size and bytes per block). Refuses to know what any key means beyond
 * general.alignment, or how to decode quantized blocks: model and tokenizer
 * code read the metadata and tensors they need through the getters.
 */
#include "format/gguf.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dict.h"
#include "base/file.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32

struct gguf_file {
  hmmap map;                   /* owned when opened from a path */
  const unsigned char *data;   /* borrowed: the whole file image */
  size_t size;
  char *what;                  /* owned */
  uint32_t version;
  size_t alignment;
  size_t data_offset;
  gguf_kv *kvs;                /* owned, nkv entries; keys owned */
  size_t nkv;
  gguf_tensor *tensors;        /* owned, ntensors entries; names owned */
  size_t ntensors;
  hdict kv_index;              /* key → position in kvs */
  hdict tensor_index;          /* name → position in tensors */
};

/* ---- type tables ---- */

static const gguf_tensor_type_info ggml_types[GGUF_TENSOR_TYPE_COUNT] = {
  [GGUF_TENSOR_F32] = {"f32", 1, 4},
  [GGUF_TENSOR_F16] = {"f16", 1, 2},
  [GGUF_TENSOR_Q4_0] = {"q4_0", 32, 18},
  [GGUF_TENSOR_Q4_1] = {"q4_1", 32, 20},
  [GGUF_TENSOR_Q5_0] = {"q5_0", 32, 22},
  [GGUF_TENSOR_Q5_1] = {"q5_1", 32, 24},
  [GGUF_TENSOR_Q8_0] = {"q8_0", 32, 34},
  [GGUF_TENSOR_Q8_1] = {"q8_1", 32, 36},
  [GGUF_TENSOR_Q2_K] = {"q2_K", 256, 84},
  [GGUF_TENSOR_Q3_K] = {"q3_K", 256, 110},
  [GGUF_TENSOR_Q4_K] = {"q4_K", 256, 144},
  [GGUF_TENSOR_Q5_K] = {"q5_K", 256, 176},
  [GGUF_TENSOR_Q6_K] = {"q6_K", 256, 210},
  [GGUF_TENSOR_Q8_K] = {"q8_K", 256, 292},
  [GGUF_TENSOR_IQ2_XXS] = {"iq2_xxs", 256, 66},
  [GGUF_TENSOR_IQ2_XS] = {"iq2_xs", 256, 74},
  [GGUF_TENSOR_IQ3_XXS] = {"iq3_xxs", 256, 98},
  [GGUF_TENSOR_IQ1_S] = {"iq1_s", 256, 50},
  [GGUF_TENSOR_IQ4_NL] = {"iq4_nl", 32, 18},
  [GGUF_TENSOR_IQ3_S] = {"iq3_s", 256, 110},
  [GGUF_TENSOR_IQ2_S] = {"iq2_s", 256, 82},
  [GGUF_TENSOR_IQ4_XS] = {"iq4_xs", 256, 136},
  [GGUF_TENSOR_I8] = {"i8", 1, 1},
  [GGUF_TENSOR_I16] = {"i16", 1, 2},
  [GGUF_TENSOR_I32] = {"i32", 1, 4},
  [GGUF_TENSOR_I64] = {"i64", 1, 8},
  [GGUF_TENSOR_F64] = {"f64", 1, 8},
  [GGUF_TENSOR_IQ1_M] = {"iq1_m", 256, 56},
  [GGUF_TENSOR_BF16] = {"bf16", 1, 2},
  [GGUF_TENSOR_TQ1_0] = {"tq1_0", 256, 54},
  [GGUF_TENSOR_TQ2_0] = {"tq2_0", 256, 66},
  [GGUF_TENSOR_MXFP4] = {"mxfp4", 32, 17},
};

const gguf_tensor_type_info *gguf_tensor_type_get(uint32_t t) {
  if (t >= GGUF_TENSOR_TYPE_COUNT || !ggml_types[t].name) return NULL;
  return &ggml_types[t];
}

const char *gguf_tensor_type_name(uint32_t t) {
  const gguf_tensor_type_info *ti = gguf_tensor_type_get(t);
  return ti ? ti->name : "?";
}

size_t gguf_row_size(uint32_t t, int64_t ne) {
  const gguf_tensor_type_info *ti = gguf_tensor_type_get(t);
  if (!ti || ne < 0 || ne % ti->block_size) return 0;
  return (size_t)(ne / ti->block_size) * ti->type_size;
}

static const struct {
  const char *name;
  size_t size;
} gguf_types[GGUF_TYPE_COUNT] = {
  [GGUF_TYPE_UINT8] = {"u8", 1},    [GGUF_TYPE_INT8] = {"i8", 1},        [GGUF_TYPE_UINT16] = {"u16", 2},
  [GGUF_TYPE_INT16] = {"i16", 2},   [GGUF_TYPE_UINT32] = {"u32", 4},     [GGUF_TYPE_INT32] = {"i32", 4},
  [GGUF_TYPE_FLOAT32] = {"f32", 4}, [GGUF_TYPE_BOOL] = {"bool", 1},      [GGUF_TYPE_STRING] = {"string", 0},
  [GGUF_TYPE_ARRAY] = {"array", 0}, [GGUF_TYPE_UINT64] = {"u64", 8},     [GGUF_TYPE_INT64] = {"i64", 8},
  [GGUF_TYPE_FLOAT64] = {"f64", 8},
};

const char *gguf_type_name(uint32_t t) { return t < GGUF_TYPE_COUNT ? gguf_types[t].name : "?"; }
size_t gguf_type_size(uint32_t t) { return t < GGUF_TYPE_COUNT ? gguf_types[t].size : 0; }

/* ---- the cursor over the untrusted image ---- */

typedef struct cursor {
  const unsigned char *p;
  size_t pos, size;
} cursor;

static size_t cursor_left(const cursor *c) { return c->size - c->pos; }

static const unsigned char *cursor_take(cursor *c, size_t n) {
  if (n > cursor_left(c)) return NULL;
  const unsigned char *r = c->p + c->pos;
  c->pos += n;
  return r;
}

static bool read_u32(cursor *c, uint32_t *v) {
  const unsigned char *b = cursor_take(c, 4);
  if (b) memcpy(v, b, 4);
  return b != NULL;
}

static bool read_u64(cursor *c, uint64_t *v) {
  const unsigned char *b = cursor_take(c, 8);
  if (b) memcpy(v, b, 8);
  return b != NULL;
}

/* Reads a length-prefixed string; the length is bounded by the bytes left. */
static int read_str(cursor *c, gguf_str *s, const char *what, const char *thing, herr *err) {
  uint64_t len;
  size_t at = c->pos;
  if (!read_u64(c, &len))
    return herr_set(err, HEARTH_EFORMAT, "%s: %s: file ends at byte %zu inside a string length", what, thing, at);
  if (len > cursor_left(c))
    return herr_set(err, HEARTH_EFORMAT, "%s: %s: string length %" PRIu64 " at byte %zu exceeds the %zu bytes left in the file",
                    what, thing, len, at, cursor_left(c));
  s->ptr = (const char *)cursor_take(c, (size_t)len);
  s->len = len;
  return 0;
}

/* A NUL-terminated copy of a key or name; refuses embedded NULs. */
static int dup_name(const gguf_str *s, char **out, const char *what, const char *thing, uint64_t index, herr *err) {
  if (s->len == 0) return herr_set(err, HEARTH_EFORMAT, "%s: %s %" PRIu64 " has an empty name", what, thing, index);
  if (memchr(s->ptr, 0, (size_t)s->len))
    return herr_set(err, HEARTH_EFORMAT, "%s: %s %" PRIu64 " has a name with a NUL byte", what, thing, index);
  char *d = malloc((size_t)s->len + 1);
  if (!d) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  memcpy(d, s->ptr, (size_t)s->len);
  d[s->len] = 0;
  *out = d;
  return 0;
}

static void read_scalar(gguf_kv *kv, gguf_type t, const unsigned char *b) {
  switch (t) {
    case GGUF_TYPE_UINT8: kv->v.u8 = b[0]; break;
    case GGUF_TYPE_INT8: kv->v.i8 = (int8_t)b[0]; break;
    case GGUF_TYPE_BOOL: kv->v.b = b[0] != 0; break;
    case GGUF_TYPE_UINT16: memcpy(&kv->v.u16, b, 2); break;
    case GGUF_TYPE_INT16: memcpy(&kv->v.i16, b, 2); break;
    case GGUF_TYPE_UINT32: memcpy(&kv->v.u32, b, 4); break;
    case GGUF_TYPE_INT32: memcpy(&kv->v.i32, b, 4); break;
    case GGUF_TYPE_FLOAT32: memcpy(&kv->v.f32, b, 4); break;
    case GGUF_TYPE_UINT64: memcpy(&kv->v.u64, b, 8); break;
    case GGUF_TYPE_INT64: memcpy(&kv->v.i64, b, 8); break;
    case GGUF_TYPE_FLOAT64: memcpy(&kv->v.f64, b, 8); break;
    default: break;
  }
}

static int read_value(cursor *c, gguf_kv *kv, const char *what, herr *err) {
  uint32_t t;
  size_t at = c->pos;
  if (!read_u32(c, &t))
    return herr_set(err, HEARTH_EFORMAT, "%s: key '%s': file ends at byte %zu inside the value type", what, kv->key, at);
  if (t >= GGUF_TYPE_COUNT)
    return herr_set(err, HEARTH_EFORMAT, "%s: key '%s' has unknown value type %" PRIu32, what, kv->key, t);
  kv->type = (gguf_type)t;
  if (t == GGUF_TYPE_STRING) {
    char thing[300];
    snprintf(thing, sizeof thing, "key '%s'", kv->key);
    return read_str(c, &kv->v.str, what, thing, err);
  }
  if (t != GGUF_TYPE_ARRAY) {
    const unsigned char *b = cursor_take(c, gguf_types[t].size);
    if (!b) return herr_set(err, HEARTH_EFORMAT, "%s: key '%s': file ends inside its %s value", what, kv->key, gguf_types[t].name);
    read_scalar(kv, (gguf_type)t, b);
    return 0;
  }
  uint32_t et;
  uint64_t n;
  if (!read_u32(c, &et) || !read_u64(c, &n))
    return herr_set(err, HEARTH_EFORMAT, "%s: key '%s': file ends inside the array header", what, kv->key);
  if (et >= GGUF_TYPE_COUNT || et == GGUF_TYPE_ARRAY)
    return herr_set(err, HEARTH_EFORMAT, "%s: key '%s' is an array of %s (type %" PRIu32 "), which is not a valid element type",
                    what, kv->key, et == GGUF_TYPE_ARRAY ? "arrays" : "unknown values", et);
  gguf_arr *a = &kv->v.arr;
  a->type = (gguf_type)et;
  a->n = n;
  if (et != GGUF_TYPE_STRING) {
    size_t es = gguf_types[et].size;
    if (n > cursor_left(c) / es)
      return herr_set(err, HEARTH_EFORMAT, "%s: key '%s': array of %" PRIu64 " %s exceeds the %zu bytes left in the file", what,
                      kv->key, n, gguf_types[et].name, cursor_left(c));
    a->raw = cursor_take(c, (size_t)n * es);
    return 0;
  }
  /* each string takes at least its 8-byte length */
  if (n > cursor_left(c) / 8)
    return herr_set(err, HEARTH_EFORMAT, "%s: key '%s': array of %" PRIu64 " strings exceeds the %zu bytes left in the file", what,
                    kv->key, n, cursor_left(c));
  gguf_str *strs = malloc((n ? (size_t)n : 1) * sizeof *strs);
  if (!strs) return herr_set(err, HEARTH_ENOMEM, "%s: key '%s': out of memory for %" PRIu64 " strings", what, kv->key, n);
  a->strs = strs;
  for (uint64_t i = 0; i < n; i++) {
    char thing[320];
    snprintf(thing, sizeof thing, "key '%s' element %" PRIu64, kv->key, i);
    int rc = read_str(c, &strs[i], what, thing, err);
    if (rc) return rc;
  }
  return 0;
}

static int read_tensor_info(cursor *c, gguf_file *g, size_t i, herr *err) {
  const char *what = g->what;
  gguf_tensor *t = &g->tensors[i];
  gguf_str name;
  char thing[64];
  snprintf(thing, sizeof thing, "tensor %zu name", i);
  int rc = read_str(c, &name, what, thing, err);
  if (rc) return rc;
  char *nm = NULL;
  if ((rc = dup_name(&name, &nm, what, "tensor", i, err))) return rc;
  t->name = nm;
  int64_t dummy;
  if (hdict_get(&g->tensor_index, nm, (size_t)name.len, &dummy))
    return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s' appears twice", what, nm);
  if (!hdict_put(&g->tensor_index, nm, (size_t)name.len, (int64_t)i)) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);

  uint32_t ndim;
  if (!read_u32(c, &ndim)) return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s': file ends inside its info", what, nm);
  if (ndim > GGUF_MAX_DIMS)
    return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s' has %" PRIu32 " dimensions (at most %d)", what, nm, ndim, GGUF_MAX_DIMS);
  t->ndim = (int)ndim;
  int64_t ne = 1;
  bool overflow = false;
  for (int d = 0; d < GGUF_MAX_DIMS; d++) {
    t->dims[d] = 1;
    if (d >= (int)ndim) continue;
    uint64_t v;
    if (!read_u64(c, &v)) return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s': file ends inside its dims", what, nm);
    if (v > (uint64_t)INT64_MAX)
      return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s' dimension %d is negative (%" PRId64 ")", what, nm, d, (int64_t)v);
    t->dims[d] = (int64_t)v;
    if (t->dims[d] != 0 && ne > INT64_MAX / t->dims[d]) overflow = true;
    else ne *= t->dims[d];
  }
  if (overflow) return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s': the product of its dims overflows", what, nm);
  for (int d = 0; d < (int)ndim; d++)
    if (t->dims[d] == 0) ne = 0;
  t->nelements = ne;

  uint32_t type;
  uint64_t off;
  if (!read_u32(c, &type) || !read_u64(c, &off))
    return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s': file ends inside its info", what, nm);
  const gguf_tensor_type_info *ti = gguf_tensor_type_get(type);
  if (!ti) return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s' has unknown ggml type %" PRIu32, what, nm, type);
  t->type = (gguf_tensor_type)type;
  if (t->dims[0] % ti->block_size)
    return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s': row of %" PRId64 " elements is not a multiple of the %s block size %d",
                    what, nm, t->dims[0], ti->name, ti->block_size);
  uint64_t blocks = (uint64_t)ne / (uint64_t)ti->block_size;
  if (blocks > SIZE_MAX / ti->type_size)
    return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s': byte size overflows", what, nm);
  t->nbytes = (size_t)blocks * ti->type_size;
  t->offset = off;
  return 0;
}

static int parse_image(gguf_file *g, herr *err) {
  const char *what = g->what;
  cursor c = {g->data, 0, g->size};
  const unsigned char *magic = cursor_take(&c, 4);
  if (!magic) return herr_set(err, HEARTH_EFORMAT, "%s: file of %zu bytes is too short to be GGUF", what, g->size);
  if (memcmp(magic, GGUF_MAGIC, 4) != 0) {
    char m[5];
    for (int i = 0; i < 4; i++) m[i] = (magic[i] >= 0x20 && magic[i] < 0x7f) ? (char)magic[i] : '?';
    m[4] = 0;
    return herr_set(err, HEARTH_EFORMAT, "%s: bad magic '%s' (expected 'GGUF')", what, m);
  }
  uint32_t version;
  uint64_t ntensors, nkv;
  if (!read_u32(&c, &version) || !read_u64(&c, &ntensors) || !read_u64(&c, &nkv))
    return herr_set(err, HEARTH_EFORMAT, "%s: file ends inside the header", what);
  if (version != 2 && version != 3) {
    if ((version & 0xffff) == 0)
      return herr_set(err, HEARTH_EUNSUPPORTED, "%s: GGUF version %" PRIu32 " looks byte-swapped (a big-endian file)", what, version);
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s: GGUF version %" PRIu32 " is not supported (2 and 3 are)", what, version);
  }
  g->version = version;
  /* every key/value takes at least 8 (key length) + 4 (type) + 1 bytes; every tensor info 8 + 4 + 4 + 8 */
  if (nkv > cursor_left(&c) / 13)
    return herr_set(err, HEARTH_EFORMAT, "%s: %" PRIu64 " metadata keys cannot fit in a file of %zu bytes", what, nkv, g->size);
  if (ntensors > cursor_left(&c) / 24)
    return herr_set(err, HEARTH_EFORMAT, "%s: %" PRIu64 " tensors cannot fit in a file of %zu bytes", what, ntensors, g->size);

  g->kvs = calloc(nkv ? (size_t)nkv : 1, sizeof *g->kvs);
  g->tensors = calloc(ntensors ? (size_t)ntensors : 1, sizeof *g->tensors);
  if (!g->kvs || !g->tensors) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);

  for (uint64_t i = 0; i < nkv; i++) {
    gguf_str key;
    char thing[64];
    snprintf(thing, sizeof thing, "key %" PRIu64, i);
    int rc = read_str(&c, &key, what, thing, err);
    if (rc) return rc;
    gguf_kv *kv = &g->kvs[i];
    char *k = NULL;
    if ((rc = dup_name(&key, &k, what, "key", i, err))) return rc;
    kv->key = k;
    g->nkv = (size_t)i + 1;
    int64_t dummy;
    if (hdict_get(&g->kv_index, k, (size_t)key.len, &dummy))
      return herr_set(err, HEARTH_EFORMAT, "%s: key '%s' appears twice", what, k);
    if (!hdict_put(&g->kv_index, k, (size_t)key.len, (int64_t)i)) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
    if ((rc = read_value(&c, kv, what, err))) return rc;
  }

  g->alignment = GGUF_DEFAULT_ALIGNMENT;
  const gguf_kv *al = gguf_find_kv(g, "general.alignment");
  if (al) {
    if (al->type != GGUF_TYPE_UINT32)
      return herr_set(err, HEARTH_EFORMAT, "%s: key 'general.alignment' is %s, expected u32", what, gguf_type_name(al->type));
    uint32_t a = al->v.u32;
    if (a == 0 || (a & (a - 1)))
      return herr_set(err, HEARTH_EFORMAT, "%s: key 'general.alignment' is %" PRIu32 ", not a power of two", what, a);
    g->alignment = a;
  }

  for (uint64_t i = 0; i < ntensors; i++) {
    g->ntensors = (size_t)i + 1;
    int rc = read_tensor_info(&c, g, (size_t)i, err);
    if (rc) return rc;
  }

  size_t pad = (g->alignment - c.pos % g->alignment) % g->alignment;
  if (ntensors > 0 && pad > cursor_left(&c))
    return herr_set(err, HEARTH_EFORMAT, "%s: file ends before the data section (byte %zu + padding %zu > %zu)", what, c.pos, pad,
                    g->size);
  g->data_offset = pad > cursor_left(&c) ? g->size : c.pos + pad;
  size_t data_size = g->size - g->data_offset;

  for (size_t i = 0; i < g->ntensors; i++) {
    gguf_tensor *t = &g->tensors[i];
    if (t->offset % g->alignment)
      return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s' offset %" PRIu64 " is not a multiple of the alignment %zu", what,
                      t->name, t->offset, g->alignment);
    if (t->offset > data_size || t->nbytes > data_size - t->offset)
      return herr_set(err, HEARTH_EFORMAT,
                      "%s: tensor '%s' (%zu bytes at data offset %" PRIu64 ") ends past the data section of %zu bytes", what,
                      t->name, t->nbytes, t->offset, data_size);
    t->data = g->data + g->data_offset + t->offset;
  }
  return 0;
}

static gguf_file *file_new(const char *what) {
  gguf_file *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->what = strdup(what ? what : "gguf");
  if (!g->what) {
    free(g);
    return NULL;
  }
  hdict_init(&g->kv_index);
  hdict_init(&g->tensor_index);
  return g;
}

int gguf_parse(const unsigned char *data, size_t size, const char *what, gguf_file **out, herr *err) {
  *out = NULL;
  gguf_file *g = file_new(what);
  if (!g) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what ? what : "gguf");
  g->data = data;
  g->size = size;
  int rc = parse_image(g, err);
  if (rc) {
    gguf_close(g);
    return rc;
  }
  *out = g;
  return 0;
}

int gguf_open(gguf_file **out, const char *path, herr *err) { return gguf_open_mode(out, path, HMMAP_MAP, err); }

int gguf_open_mode(gguf_file **out, const char *path, int mode, herr *err) {
  *out = NULL;
  hmmap m;
  int rc = hmmap_open_mode(&m, path, mode, err);
  if (rc) return rc;
  gguf_file *g = file_new(path);
  if (!g) {
    hmmap_close(&m);
    return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", path);
  }
  g->map = m;
  g->data = m.data;
  g->size = m.size;
  if ((rc = parse_image(g, err))) {
    gguf_close(g);
    return rc;
  }
  *out = g;
  return 0;
}

void gguf_close(gguf_file *g) {
  if (!g) return;
  for (size_t i = 0; i < g->nkv; i++) {
    free((char *)g->kvs[i].key);
    if (g->kvs[i].type == GGUF_TYPE_ARRAY) free((gguf_str *)g->kvs[i].v.arr.strs);
  }
  free(g->kvs);
  for (size_t i = 0; i < g->ntensors; i++) free((char *)g->tensors[i].name);
  free(g->tensors);
  hdict_free(&g->kv_index);
  hdict_free(&g->tensor_index);
  hmmap_close(&g->map);
  free(g->what);
  free(g);
}

const char *gguf_path(const gguf_file *g) { return g->what; }
uint32_t gguf_version(const gguf_file *g) { return g->version; }
size_t gguf_alignment(const gguf_file *g) { return g->alignment; }
size_t gguf_data_offset(const gguf_file *g) { return g->data_offset; }

/* ---- metadata ---- */

size_t gguf_kv_count(const gguf_file *g) { return g->nkv; }
const gguf_kv *gguf_kv_at(const gguf_file *g, size_t i) { return i < g->nkv ? &g->kvs[i] : NULL; }

const gguf_kv *gguf_find_kv(const gguf_file *g, const char *key) {
  int64_t i;
  if (!key || !hdict_gets(&g->kv_index, key, &i)) return NULL;
  return &g->kvs[i];
}

bool gguf_has(const gguf_file *g, const char *key) { return gguf_find_kv(g, key) != NULL; }

static int find_typed(const gguf_file *g, const char *key, gguf_type want, const gguf_kv **out, herr *err) {
  const gguf_kv *kv = gguf_find_kv(g, key);
  if (!kv) return herr_set(err, HEARTH_ENOTFOUND, "%s: key '%s' not found", g->what, key);
  if (kv->type != want)
    return herr_set(err, HEARTH_EFORMAT, "%s: key '%s' is %s, expected %s", g->what, key, gguf_type_name(kv->type),
                    gguf_type_name(want));
  *out = kv;
  return 0;
}

#define GGUF_GETTER(fn, ctype, tag, field)                                          \
  int fn(const gguf_file *g, const char *key, ctype *out, herr *err) {             \
    const gguf_kv *kv = NULL;                                                       \
    int rc = find_typed(g, key, tag, &kv, err);                                     \
    if (!rc) *out = kv->v.field;                                                    \
    return rc;                                                                      \
  }

GGUF_GETTER(gguf_get_u8, uint8_t, GGUF_TYPE_UINT8, u8)
GGUF_GETTER(gguf_get_i8, int8_t, GGUF_TYPE_INT8, i8)
GGUF_GETTER(gguf_get_u16, uint16_t, GGUF_TYPE_UINT16, u16)
GGUF_GETTER(gguf_get_i16, int16_t, GGUF_TYPE_INT16, i16)
GGUF_GETTER(gguf_get_u32, uint32_t, GGUF_TYPE_UINT32, u32)
GGUF_GETTER(gguf_get_i32, int32_t, GGUF_TYPE_INT32, i32)
GGUF_GETTER(gguf_get_u64, uint64_t, GGUF_TYPE_UINT64, u64)
GGUF_GETTER(gguf_get_i64, int64_t, GGUF_TYPE_INT64, i64)
GGUF_GETTER(gguf_get_f32, float, GGUF_TYPE_FLOAT32, f32)
GGUF_GETTER(gguf_get_f64, double, GGUF_TYPE_FLOAT64, f64)
GGUF_GETTER(gguf_get_bool, bool, GGUF_TYPE_BOOL, b)
GGUF_GETTER(gguf_get_arr, gguf_arr, GGUF_TYPE_ARRAY, arr)

int gguf_get_str(const gguf_file *g, const char *key, const char **s, size_t *len, herr *err) {
  const gguf_kv *kv = NULL;
  int rc = find_typed(g, key, GGUF_TYPE_STRING, &kv, err);
  if (rc) return rc;
  *s = kv->v.str.ptr;
  if (len) *len = (size_t)kv->v.str.len;
  return 0;
}

int gguf_get_strdup(const gguf_file *g, const char *key, char **out, herr *err) {
  const char *s;
  size_t n;
  *out = NULL;
  int rc = gguf_get_str(g, key, &s, &n, err);
  if (rc) return rc;
  if (n && memchr(s, 0, n)) return herr_set(err, HEARTH_EFORMAT, "%s: key '%s' holds a NUL byte", g->what, key);
  char *d = malloc(n + 1);
  if (!d) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", g->what);
  if (n) memcpy(d, s, n);
  d[n] = 0;
  *out = d;
  return 0;
}

/* The value of an integer-typed (or bool) scalar; false when kv is not one or a u64 exceeds INT64_MAX. */
static bool kv_as_int(const gguf_kv *kv, int64_t *out) {
  switch (kv->type) {
    case GGUF_TYPE_UINT8: *out = kv->v.u8; return true;
    case GGUF_TYPE_INT8: *out = kv->v.i8; return true;
    case GGUF_TYPE_UINT16: *out = kv->v.u16; return true;
    case GGUF_TYPE_INT16: *out = kv->v.i16; return true;
    case GGUF_TYPE_UINT32: *out = kv->v.u32; return true;
    case GGUF_TYPE_INT32: *out = kv->v.i32; return true;
    case GGUF_TYPE_INT64: *out = kv->v.i64; return true;
    case GGUF_TYPE_BOOL: *out = kv->v.b; return true;
    case GGUF_TYPE_UINT64:
      if (kv->v.u64 > (uint64_t)INT64_MAX) return false;
      *out = (int64_t)kv->v.u64;
      return true;
    default: return false;
  }
}

int gguf_get_int(const gguf_file *g, const char *key, int64_t *out, herr *err) {
  const gguf_kv *kv = gguf_find_kv(g, key);
  if (!kv) return herr_set(err, HEARTH_ENOTFOUND, "%s: key '%s' not found", g->what, key);
  if (!kv_as_int(kv, out))
    return herr_set(err, HEARTH_EFORMAT, "%s: key '%s' is %s, expected an integer that fits int64", g->what, key,
                    gguf_type_name(kv->type));
  return 0;
}

int gguf_get_float(const gguf_file *g, const char *key, double *out, herr *err) {
  const gguf_kv *kv = gguf_find_kv(g, key);
  if (!kv) return herr_set(err, HEARTH_ENOTFOUND, "%s: key '%s' not found", g->what, key);
  if (kv->type == GGUF_TYPE_FLOAT32) *out = kv->v.f32;
  else if (kv->type == GGUF_TYPE_FLOAT64) *out = kv->v.f64;
  else
    return herr_set(err, HEARTH_EFORMAT, "%s: key '%s' is %s, expected f32 or f64", g->what, key, gguf_type_name(kv->type));
  return 0;
}

/* ---- array elements ---- */

int64_t gguf_arr_int(const gguf_arr *a, uint64_t i) {
  if (!a || i >= a->n || !a->raw) return 0;
  const unsigned char *b = (const unsigned char *)a->raw + i * gguf_types[a->type].size;
  switch (a->type) {
    case GGUF_TYPE_UINT8: return b[0];
    case GGUF_TYPE_INT8: return (int8_t)b[0];
    case GGUF_TYPE_BOOL: return b[0] != 0;
    case GGUF_TYPE_UINT16: { uint16_t v; memcpy(&v, b, 2); return v; }
    case GGUF_TYPE_INT16: { int16_t v; memcpy(&v, b, 2); return v; }
    case GGUF_TYPE_UINT32: { uint32_t v; memcpy(&v, b, 4); return v; }
    case GGUF_TYPE_INT32: { int32_t v; memcpy(&v, b, 4); return v; }
    case GGUF_TYPE_UINT64: { uint64_t v; memcpy(&v, b, 8); return (int64_t)v; }
    case GGUF_TYPE_INT64: { int64_t v; memcpy(&v, b, 8); return v; }
    default: return 0;
  }
}

double gguf_arr_float(const gguf_arr *a, uint64_t i) {
  if (!a || i >= a->n || !a->raw) return 0;
  const unsigned char *b = (const unsigned char *)a->raw + i * gguf_types[a->type].size;
  if (a->type == GGUF_TYPE_FLOAT32) {
    float v;
    memcpy(&v, b, 4);
    return v;
  }
  if (a->type == GGUF_TYPE_FLOAT64) {
    double v;
    memcpy(&v, b, 8);
    return v;
  }
  if (a->type == GGUF_TYPE_UINT64) {
    uint64_t v;
    memcpy(&v, b, 8);
    return (double)v;
  }
  return (double)gguf_arr_int(a, i);
}

const char *gguf_arr_str(const gguf_arr *a, uint64_t i, size_t *len) {
  if (!a || i >= a->n || a->type != GGUF_TYPE_STRING || !a->strs) {
    if (len) *len = 0;
    return NULL;
  }
  if (len) *len = (size_t)a->strs[i].len;
  return a->strs[i].ptr ? a->strs[i].ptr : "";
}

/* ---- tensors ---- */

size_t gguf_tensor_count(const gguf_file *g) { return g->ntensors; }
const gguf_tensor *gguf_tensor_at(const gguf_file *g, size_t i) { return i < g->ntensors ? &g->tensors[i] : NULL; }

const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name) {
  int64_t i;
  if (!name || !hdict_gets(&g->tensor_index, name, &i)) return NULL;
  return &g->tensors[i];
}
