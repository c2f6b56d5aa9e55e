/* safetensors.c — reads safetensors files (one file or the shards of a
 * folder) by mmap, validating every header field before any tensor is
 * handed out; converts float elements to f32.
 *
 * Owns: the header checks, the shard/index agreement, the name index.
 * Refuses to know: what the tensors mean (model/), config.json (config.c),
 * and how bytes become numbers beyond the element conversions below.
 */
#include "format/safetensors.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/half.h"
#include "base/json.h"
#include "base/utf8.h"

/* ---- dtypes ---------------------------------------------------------------- */

static const struct {
  const char *name;
  size_t size;
} dtype_info[ST_DTYPE_COUNT] = {
    [ST_F64] = {"F64", 8},        [ST_F32] = {"F32", 4},   [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},      [ST_I64] = {"I64", 8},   [ST_I32] = {"I32", 4},
    [ST_I16] = {"I16", 2},        [ST_I8] = {"I8", 1},     [ST_U8] = {"U8", 1},
    [ST_BOOL] = {"BOOL", 1},      [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
    [ST_U16] = {"U16", 2},        [ST_U32] = {"U32", 4},   [ST_U64] = {"U64", 8},
};

size_t st_dtype_size(st_dtype dt) { return (unsigned)dt < ST_DTYPE_COUNT ? dtype_info[dt].size : 0; }

const char *st_dtype_name(st_dtype dt) { return (unsigned)dt < ST_DTYPE_COUNT ? dtype_info[dt].name : "?"; }

bool st_dtype_from_name(const char *name, st_dtype *dt) {
  for (int i = 0; i < ST_DTYPE_COUNT; i++) {
    if (strcmp(name, dtype_info[i].name) == 0) {
      *dt = (st_dtype)i;
      return true;
    }
  }
  return false;
}

bool st_dtype_is_float(st_dtype dt) {
  return dt == ST_F64 || dt == ST_F32 || dt == ST_F16 || dt == ST_BF16 || dt == ST_F8_E4M3 || dt == ST_F8_E5M2;
}

/* ---- element conversions --------------------------------------------------- */

float st_bf16_to_f32(uint16_t b) { return hbf16_to_f32(b); }

float st_f16_to_f32(uint16_t h) { return hf16_to_f32(h); }

/* E4M3 "fn": bias 7, no infinities, S.1111.111 is NaN. */
float st_f8e4m3_to_f32(uint8_t v) {
  int sign = v >> 7, exp = (v >> 3) & 0xF, man = v & 7;
  float r;
  if (exp == 0xF && man == 7) return NAN;
  if (exp == 0) r = ldexpf((float)man, -9); /* man/8 × 2^-6 */
  else r = ldexpf(1.0f + (float)man / 8.0f, exp - 7);
  return sign ? -r : r;
}

/* E5M2: bias 15, IEEE-style infinities and NaNs (the top byte of an f16). */
float st_f8e5m2_to_f32(uint8_t v) { return st_f16_to_f32((uint16_t)((unsigned)v << 8)); }

int st_to_f32(const st_tensor *t, float *out, herr *err) {
  const unsigned char *p = t->data;
  size_t n = (size_t)t->numel;
  switch (t->dtype) {
    case ST_F32:
      if (n) memcpy(out, p, n * 4);
      return 0;
    case ST_F64:
      for (size_t i = 0; i < n; i++) {
        double d;
        memcpy(&d, p + i * 8, 8);
        out[i] = (float)d;
      }
      return 0;
    case ST_F16:
    case ST_BF16:
      for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + i * 2, 2);
        out[i] = t->dtype == ST_F16 ? st_f16_to_f32(h) : st_bf16_to_f32(h);
      }
      return 0;
    case ST_F8_E4M3:
      for (size_t i = 0; i < n; i++) out[i] = st_f8e4m3_to_f32(p[i]);
      return 0;
    case ST_F8_E5M2:
      for (size_t i = 0; i < n; i++) out[i] = st_f8e5m2_to_f32(p[i]);
      return 0;
    default:
      return herr_set(err, HEARTH_EUNSUPPORTED, "tensor '%s': cannot convert %s to f32 (not a float dtype)",
                      t->name ? t->name : "?", st_dtype_name(t->dtype));
  }
}

/* ---- header parsing -------------------------------------------------------- */

/* Appends s[0..n) to b with non-printable bytes escaped, at most `max` bytes. */
static void put_escaped(hbuf *b, const unsigned char *s, size_t n, size_t max) {
  for (size_t i = 0; i < n && i < max; i++) {
    if (s[i] >= 0x20 && s[i] < 0x7F && s[i] != '"' && s[i] != '\\') hbuf_putc(b, (char)s[i]);
    else hbuf_printf(b, "\\x%02x", s[i]);
  }
  if (n > max) hbuf_puts(b, "...");
}

/* The header must be valid UTF-8; names the string that is not. */
static int check_header_utf8(const unsigned char *h, size_t n, const char *what, herr *err) {
  size_t i = 0;
  uint32_t cp;
  while (i < n) {
    if (h[i] < 0x80) {
      i++;
      continue;
    }
    int l = utf8_decode((const char *)h + i, n - i, &cp);
    if (l) {
      i += (size_t)l;
      continue;
    }
    /* Find the JSON string around byte i: back to its opening quote, on to its close. */
    size_t start = i;
    while (start > 0 && h[start - 1] != '"') start--;
    size_t end = i;
    while (end < n && h[end] != '"') end++;
    size_t after = end + 1;
    while (after < n && (h[after] == ' ' || h[after] == '\n' || h[after] == '\r' || h[after] == '\t')) after++;
    bool is_key = after < n && h[after] == ':';
    hbuf b = {0};
    put_escaped(&b, h + start, end - start, 80);
    int rc = herr_set(err, HEARTH_EFORMAT, "%s: %s \"%s\" is not valid UTF-8 (byte 0x%02x at header offset %zu)", what,
                      is_key ? "tensor name" : "header string", b.oom ? "?" : hbuf_str(&b), h[i], i);
    hbuf_free(&b);
    return rc;
  }
  return 0;
}

static int fmt_shape(char *out, size_t cap, const st_tensor *t) {
  size_t used = 0;
  used += (size_t)snprintf(out, cap, "[");
  for (int d = 0; d < t->ndim && used < cap; d++)
    used += (size_t)snprintf(out + used, cap - used, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
  if (used < cap) snprintf(out + used, cap - used, "]");
  return 0;
}

/* Fills t (except name and data) from one header entry. */
static int parse_entry(const json_t *v, const char *name, const char *what, st_tensor *t, uint64_t *begin,
                       uint64_t *end, herr *err) {
  if (!json_is_object(v)) return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s': entry is not a JSON object", what, name);
  const json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
               *jo = json_object_get(v, "data_offsets");
  if (!json_is_string(jd)) return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s': missing or non-string 'dtype'", what, name);
  if (!st_dtype_from_name(json_string_value(jd), &t->dtype)) {
    hbuf b = {0};
    put_escaped(&b, (const unsigned char *)json_string_value(jd), json_string_length(jd), 40);
    int rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor '%s': unknown dtype '%s'", what, name,
                      b.oom ? "?" : hbuf_str(&b));
    hbuf_free(&b);
    return rc;
  }
  if (!json_is_array(js)) return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s': missing or non-array 'shape'", what, name);
  size_t nd = json_array_size(js);
  if (nd > ST_MAX_DIMS)
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor '%s': %zu dimensions (at most %d supported)", what, name, nd,
                    ST_MAX_DIMS);
  t->ndim = (int)nd;
  uint64_t numel = 1;
  bool overflow = false;
  for (size_t d = 0; d < nd; d++) {
    const json_t *x = json_array_get(js, d);
    if (!json_is_integer(x) || json_integer_value(x) < 0)
      return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s': shape[%zu] is not a non-negative integer", what, name, d);
    uint64_t dim = (uint64_t)json_integer_value(x);
    t->shape[d] = (int64_t)dim;
    if (dim && numel > UINT64_MAX / dim) overflow = true;
    else numel *= dim;
  }
  if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
      !json_is_integer(json_array_get(jo, 1)) || json_integer_value(json_array_get(jo, 0)) < 0 ||
      json_integer_value(json_array_get(jo, 1)) < 0)
    return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s': 'data_offsets' must be two non-negative integers", what, name);
  *begin = (uint64_t)json_integer_value(json_array_get(jo, 0));
  *end = (uint64_t)json_integer_value(json_array_get(jo, 1));
  if (*end < *begin)
    return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin", what, name,
                    (unsigned long long)*begin, (unsigned long long)*end);
  size_t esize = dtype_info[t->dtype].size;
  char shape[160];
  fmt_shape(shape, sizeof shape, t);
  if (overflow || numel > (uint64_t)INT64_MAX / esize)
    return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s': shape %s is too large", what, name, shape);
  uint64_t nbytes = numel * esize;
  if (nbytes != *end - *begin)
    return herr_set(err, HEARTH_EFORMAT,
                    "%s: tensor '%s': shape %s of %s needs %llu bytes but data_offsets [%llu, %llu] span %llu", what, name,
                    shape, dtype_info[t->dtype].name, (unsigned long long)nbytes, (unsigned long long)*begin,
                    (unsigned long long)*end, (unsigned long long)(*end - *begin));
  t->numel = (int64_t)numel;
  t->nbytes = (size_t)nbytes;
  return 0;
}

static int cmp_tensor_name(const void *a, const void *b) {
  return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

typedef struct range_ref {
  uint64_t begin, end;
  size_t tensor;
} range_ref;

static int cmp_range(const void *a, const void *b) {
  const range_ref *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

static int check_metadata(const json_t *m, const char *what, herr *err) {
  if (!json_is_object(m)) return herr_set(err, HEARTH_EFORMAT, "%s: __metadata__ is not a JSON object", what);
  const char *k;
  const json_t *v;
  json_object_foreach((json_t *)m, k, v) {
    if (!json_is_string(v))
      return herr_set(err, HEARTH_EFORMAT, "%s: __metadata__ field '%s' is not a string", what, k);
  }
  return 0;
}

/* Turns jansson's message into one that speaks of tensors where it can. */
static int header_json_error(const json_error_t *je, const char *what, herr *err) {
  if (json_error_code(je) == json_error_duplicate_key) {
    const char *near = strstr(je->text, "near '");
    if (near) {
      char name[256];
      snprintf(name, sizeof name, "%s", near + 6);
      size_t l = strlen(name);
      if (l && name[l - 1] == '\'') name[l - 1] = 0;
      return herr_set(err, HEARTH_EFORMAT, "%s: tensor name %s appears twice in the header", what, name);
    }
    return herr_set(err, HEARTH_EFORMAT, "%s: a tensor name appears twice in the header (offset %d)", what, je->position);
  }
  char why[JSON_ERROR_TEXT_LENGTH];
  return herr_set(err, HEARTH_EFORMAT, "%s: header is not valid JSON (line %d column %d): %s", what, je->line, je->column,
                  hjson_error_what(je, why, sizeof why));
}

int st_parse(const unsigned char *data, size_t size, const char *what, st_tensor **tensors, size_t *count,
             json_t **metadata, char **names, herr *err) {
  *tensors = NULL;
  *count = 0;
  *names = NULL;
  if (metadata) *metadata = NULL;
  if (size < 8)
    return herr_set(err, HEARTH_EFORMAT, "%s: file is %zu bytes, too short to hold the 8-byte header length (truncated?)",
                    what, size);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
  if (hlen > ST_MAX_HEADER_BYTES)
    return herr_set(err, HEARTH_ELIMIT, "%s: header length %llu exceeds the limit of %u bytes", what,
                    (unsigned long long)hlen, ST_MAX_HEADER_BYTES);
  if (hlen > size - 8)
    return herr_set(err, HEARTH_EFORMAT, "%s: header length %llu but the file has only %zu bytes after it (truncated?)",
                    what, (unsigned long long)hlen, size - 8);
  const unsigned char *h = data + 8;
  size_t n = (size_t)hlen;
  size_t first = 0;
  while (first < n && (h[first] == ' ' || h[first] == '\n' || h[first] == '\r' || h[first] == '\t')) first++;
  if (first == n || h[first] != '{')
    return herr_set(err, HEARTH_EFORMAT, "%s: header does not start with a JSON object", what);
  int rc = check_header_utf8(h, n, what, err);
  if (rc) return rc;

  json_error_t je;
  json_t *root = json_loadb((const char *)h, n, JSON_REJECT_DUPLICATES, &je);
  if (!root) return header_json_error(&je, what, err);
  const unsigned char *body = h + n;
  size_t body_size = size - 8 - n;

  size_t cap = json_object_size(root);
  st_tensor *ts = calloc(cap ? cap : 1, sizeof *ts);
  range_ref *ranges = calloc(cap ? cap : 1, sizeof *ranges);
  size_t names_len = 0;
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) names_len += strlen(key) + 1;
  char *store = malloc(names_len ? names_len : 1);
  json_t *meta = NULL;
  if (!ts || !ranges || !store) {
    rc = herr_set(err, HEARTH_ENOMEM, "%s: out of memory for %zu tensors", what, cap);
    goto fail;
  }

  size_t nt = 0, used = 0;
  json_object_foreach(root, key, val) {
    if (strcmp(key, "__metadata__") == 0) {
      if ((rc = check_metadata(val, what, err))) goto fail;
      meta = json_incref(val);
      continue;
    }
    st_tensor *t = &ts[nt];
    uint64_t begin = 0, end = 0;
    if ((rc = parse_entry(val, key, what, t, &begin, &end, err))) goto fail;
    if (end > body_size) {
      rc = herr_set(err, HEARTH_EFORMAT,
                    "%s: tensor '%s' ends at byte %llu of the data section but the file holds only %zu bytes of data "
                    "(truncated?)",
                    what, key, (unsigned long long)end, body_size);
      goto fail;
    }
    size_t kl = strlen(key);
    memcpy(store + used, key, kl + 1);
    t->name = store + used;
    used += kl + 1;
    t->data = body + begin;
    t->shard = 0;
    ranges[nt] = (range_ref){begin, end, nt};
    nt++;
  }

  /* Non-empty ranges must not overlap. */
  qsort(ranges, nt, sizeof *ranges, cmp_range);
  size_t prev = SIZE_MAX;
  for (size_t i = 0; i < nt; i++) {
    if (ranges[i].begin == ranges[i].end) continue;
    if (prev != SIZE_MAX && ranges[i].begin < ranges[prev].end) {
      const range_ref *a = &ranges[prev], *b = &ranges[i];
      rc = herr_set(err, HEARTH_EFORMAT, "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap", what,
                    ts[a->tensor].name, (unsigned long long)a->begin, (unsigned long long)a->end, ts[b->tensor].name,
                    (unsigned long long)b->begin, (unsigned long long)b->end);
      goto fail;
    }
    if (prev == SIZE_MAX || ranges[i].end > ranges[prev].end) prev = i;
  }
  free(ranges);
  json_decref(root);
  qsort(ts, nt, sizeof *ts, cmp_tensor_name);
  *tensors = ts;
  *count = nt;
  *names = store;
  if (metadata) *metadata = meta;
  else json_decref(meta);
  return 0;

fail:
  free(ts);
  free(ranges);
  free(store);
  json_decref(meta);
  json_decref(root);
  return rc;
}

/* ---- opening files and folders ---------------------------------------------- */

void st_close(st_set *s) {
  if (!s) return;
  for (int i = 0; i < s->nshards; i++) {
    if (s->maps) hmmap_close(&s->maps[i]);
    if (s->paths) free(s->paths[i]);
  }
  free(s->maps);
  free(s->paths);
  free(s->tensors);
  free(s->names);
  json_decref(s->metadata);
  hdict_free(&s->index);
  memset(s, 0, sizeof *s);
}

const st_tensor *st_find(const st_set *s, const char *name) {
  int64_t at;
  if (!s->tensors || !hdict_gets(&s->index, name, &at)) return NULL;
  return &s->tensors[at];
}

static bool has_suffix(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* One shard parsed, before merging. */
typedef struct shard_part {
  st_tensor *tensors; /* owned */
  size_t count;
  char *names;        /* owned */
} shard_part;

/* Sorts the merged tensors, rejects names held by two shards and builds the index. */
static int finish_set(st_set *s, const char *what, herr *err) {
  qsort(s->tensors, s->count, sizeof *s->tensors, cmp_tensor_name);
  for (size_t i = 1; i < s->count; i++) {
    const st_tensor *a = &s->tensors[i - 1], *b = &s->tensors[i];
    if (strcmp(a->name, b->name) == 0)
      return herr_set(err, HEARTH_EFORMAT, "%s: tensor '%s' is in both %s and %s", what, a->name, s->paths[a->shard],
                      s->paths[b->shard]);
  }
  hdict_init(&s->index);
  for (size_t i = 0; i < s->count; i++)
    if (!hdict_put(&s->index, s->tensors[i].name, strlen(s->tensors[i].name), (int64_t)i))
      return herr_set(err, HEARTH_ENOMEM, "%s: out of memory indexing tensors", what);
  return 0;
}

/* Maps and parses shard k (path already in s->paths[k]). */
static int load_shard(st_set *s, int k, shard_part *part, herr *err) {
  int rc = hmmap_open_mode(&s->maps[k], s->paths[k], s->mode, err);
  if (rc) return rc;
  json_t **meta = k == 0 ? &s->metadata : NULL;
  rc = st_parse(s->maps[k].data, s->maps[k].size, s->paths[k], &part->tensors, &part->count, meta, &part->names, err);
  if (rc) return rc;
  for (size_t i = 0; i < part->count; i++) part->tensors[i].shard = k;
  return 0;
}

static int alloc_shards(st_set *s, int n, const char *what, herr *err) {
  s->maps = calloc((size_t)n, sizeof *s->maps);
  s->paths = calloc((size_t)n, sizeof *s->paths);
  if (!s->maps || !s->paths) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  s->nshards = n;
  return 0;
}

static int open_single(st_set *s, const char *path, herr *err) {
  int rc = alloc_shards(s, 1, path, err);
  if (rc) return rc;
  if (!(s->paths[0] = strdup(path))) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", path);
  shard_part part = {0};
  if ((rc = load_shard(s, 0, &part, err))) return rc;
  s->tensors = part.tensors;
  s->count = part.count;
  s->names = part.names;
  return finish_set(s, path, err);
}

/* A shard file name from weight_map: relative, no ".." component. */
static bool shard_name_ok(const char *f) {
  if (!f[0] || f[0] == '/') return false;
  for (const char *p = f; *p;) {
    const char *slash = strchr(p, '/');
    size_t l = slash ? (size_t)(slash - p) : strlen(p);
    if (l == 0 || (l == 2 && p[0] == '.' && p[1] == '.')) return false;
    p += l + (slash ? 1 : 0);
  }
  return true;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int open_sharded(st_set *s, const char *index_path, herr *err) {
  int rc;
  json_t *idx = hjson_load_file(index_path, err);
  if (!idx) return err ? err->code : HEARTH_EFORMAT;
  char *dir = hpath_dir(index_path);
  const char **files = NULL;
  shard_part *parts = NULL;
  json_t *wm = json_object_get(idx, "weight_map");
  if (!dir) {
    rc = herr_set(err, HEARTH_ENOMEM, "%s: out of memory", index_path);
    goto done;
  }
  if (!json_is_object(wm)) {
    rc = herr_set(err, HEARTH_EFORMAT, "%s: missing or non-object 'weight_map'", index_path);
    goto done;
  }
  /* The distinct shard files, sorted. */
  size_t nmap = json_object_size(wm), nfiles = 0;
  files = calloc(nmap ? nmap : 1, sizeof *files);
  if (!files) {
    rc = herr_set(err, HEARTH_ENOMEM, "%s: out of memory", index_path);
    goto done;
  }
  const char *key;
  json_t *val;
  json_object_foreach(wm, key, val) {
    if (!json_is_string(val)) {
      rc = herr_set(err, HEARTH_EFORMAT, "%s: weight_map entry for tensor '%s' is not a file name", index_path, key);
      goto done;
    }
    if (!shard_name_ok(json_string_value(val))) {
      rc = herr_set(err, HEARTH_EFORMAT, "%s: weight_map puts tensor '%s' in '%s', which is not a file inside the folder",
                    index_path, key, json_string_value(val));
      goto done;
    }
    files[nfiles++] = json_string_value(val);
  }
  if (nfiles == 0) {
    rc = herr_set(err, HEARTH_EFORMAT, "%s: weight_map lists no tensors", index_path);
    goto done;
  }
  qsort(files, nfiles, sizeof *files, cmp_str);
  size_t nuniq = 0;
  for (size_t i = 0; i < nfiles; i++)
    if (nuniq == 0 || strcmp(files[nuniq - 1], files[i]) != 0) files[nuniq++] = files[i];
  if (nuniq > 100000) {
    rc = herr_set(err, HEARTH_ELIMIT, "%s: %zu shard files", index_path, nuniq);
    goto done;
  }
  if ((rc = alloc_shards(s, (int)nuniq, index_path, err))) goto done;
  parts = calloc(nuniq, sizeof *parts);
  if (!parts) {
    rc = herr_set(err, HEARTH_ENOMEM, "%s: out of memory", index_path);
    goto done;
  }
  size_t total = 0, names_len = 0;
  for (size_t k = 0; k < nuniq; k++) {
    if (!(s->paths[k] = hpath_join(dir, files[k]))) {
      rc = herr_set(err, HEARTH_ENOMEM, "%s: out of memory", index_path);
      goto done;
    }
    if ((rc = load_shard(s, (int)k, &parts[k], err))) {
      if (rc == HEARTH_ENOTFOUND)
        herr_set(err, rc, "%s: shard '%s' listed in weight_map is missing (%s)", index_path, files[k], s->paths[k]);
      goto done;
    }
    total += parts[k].count;
    for (size_t i = 0; i < parts[k].count; i++) names_len += strlen(parts[k].tensors[i].name) + 1;
  }
  /* Merge into one tensor array and one name store. */
  s->tensors = calloc(total ? total : 1, sizeof *s->tensors);
  s->names = malloc(names_len ? names_len : 1);
  if (!s->tensors || !s->names) {
    rc = herr_set(err, HEARTH_ENOMEM, "%s: out of memory", index_path);
    goto done;
  }
  size_t used = 0;
  for (size_t k = 0; k < nuniq; k++) {
    for (size_t i = 0; i < parts[k].count; i++) {
      st_tensor t = parts[k].tensors[i];
      size_t l = strlen(t.name);
      memcpy(s->names + used, t.name, l + 1);
      t.name = s->names + used;
      used += l + 1;
      s->tensors[s->count++] = t;
    }
  }
  if ((rc = finish_set(s, index_path, err))) goto done;
  /* The index and the shards must agree, both ways. */
  json_object_foreach(wm, key, val) {
    const st_tensor *t = st_find(s, key);
    const char *want = json_string_value(val);
    if (!t) {
      rc = herr_set(err, HEARTH_EFORMAT, "%s: weight_map puts tensor '%s' in %s, but that shard does not hold it",
                    index_path, key, want);
      goto done;
    }
    const char *held = files[t->shard];
    if (strcmp(held, want) != 0) {
      rc = herr_set(err, HEARTH_EFORMAT, "%s: weight_map puts tensor '%s' in %s, but it is in %s", index_path, key, want,
                    held);
      goto done;
    }
  }
  for (size_t i = 0; i < s->count; i++) {
    if (!json_object_get(wm, s->tensors[i].name)) {
      rc = herr_set(err, HEARTH_EFORMAT, "%s: holds tensor '%s', which %s's weight_map does not list",
                    s->paths[s->tensors[i].shard], s->tensors[i].name, index_path);
      goto done;
    }
  }
  rc = 0;

done:
  if (parts) {
    for (size_t k = 0; k < (size_t)s->nshards; k++) {
      free(parts[k].tensors);
      free(parts[k].names);
    }
  }
  free(parts);
  free(files);
  free(dir);
  json_decref(idx);
  return rc;
}

/* A folder without model.safetensors or an index: accept exactly one *.safetensors. */
static int find_lone_file(const char *dir, char **out, herr *err) {
  *out = NULL;
  DIR *d = opendir(dir);
  if (!d) return herr_set(err, HEARTH_EIO, "%s: cannot read folder", dir);
  char *found = NULL;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!has_suffix(e->d_name, ".safetensors")) continue;
    if (n++ == 0) found = strdup(e->d_name);
  }
  closedir(d);
  if (n == 0) {
    free(found);
    return herr_set(err, HEARTH_ENOTFOUND, "%s: no model.safetensors, model.safetensors.index.json or other .safetensors file",
                    dir);
  }
  if (n > 1) {
    free(found);
    return herr_set(err, HEARTH_EFORMAT, "%s: %d .safetensors files but no model.safetensors.index.json to say which to use",
                    dir, n);
  }
  if (!found) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", dir);
  *out = hpath_join(dir, found);
  free(found);
  return *out ? 0 : herr_set(err, HEARTH_ENOMEM, "%s: out of memory", dir);
}

int st_open(st_set *s, const char *path, herr *err) { return st_open_mode(s, path, HMMAP_MAP, err); }

int st_open_mode(st_set *s, const char *path, int mode, herr *err) {
  memset(s, 0, sizeof *s);
  s->mode = mode;
  hdict_init(&s->index);
  int rc;
  if (hfile_is_dir(path)) {
    char *index = hpath_join(path, "model.safetensors.index.json");
    char *single = hpath_join(path, "model.safetensors");
    if (!index || !single) rc = herr_set(err, HEARTH_ENOMEM, "%s: out of memory", path);
    else if (hfile_exists(index)) rc = open_sharded(s, index, err);
    else if (hfile_exists(single)) rc = open_single(s, single, err);
    else {
      char *lone = NULL;
      rc = find_lone_file(path, &lone, err);
      if (!rc) rc = open_single(s, lone, err);
      free(lone);
    }
    free(index);
    free(single);
  } else if (has_suffix(path, ".index.json")) {
    rc = open_sharded(s, path, err);
  } else {
    rc = open_single(s, path, err);
  }
  if (rc) st_close(s);
  return rc;
}
