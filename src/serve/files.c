/* files.c — the Files API's store: each file is STATE_DIR/files/ID (its
 * content) and STATE_DIR/files/ID.json (its file object), both written
 * through a temporary file and a rename; the objects are held in memory in
 * the order they were made. Uploads are multipart/form-data, parsed here
 * from the whole body. Knows nothing of batches but the purposes' names. */
#include "serve/files.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/vec.h"
#include "serve/reply.h"

typedef struct file_entry {
  json_t *obj; /* owned: the file object */
} file_entry;

struct file_store {
  char *dir;            /* owned: STATE_DIR/files */
  size_t max_bytes;
  pthread_mutex_t mu;   /* entries */
  file_entry *entries;  /* owned, oldest first */
  size_t n, cap;
};

int file_write_atomic(const char *path, const char *data, size_t len, herr *err) {
  size_t n = strlen(path);
  char *tmp = malloc(n + 8);
  if (!tmp) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  snprintf(tmp, n + 8, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  int rc = 0;
  if (!f || (len && fwrite(data, 1, len, f) != len) || fflush(f) != 0 || fsync(fileno(f)) != 0) {
    rc = herr_set(err, HEARTH_EIO, "%s: %s", tmp, strerror(errno));
  }
  if (f && fclose(f) != 0 && !rc) rc = herr_set(err, HEARTH_EIO, "%s: %s", tmp, strerror(errno));
  if (!rc && rename(tmp, path) != 0) rc = herr_set(err, HEARTH_EIO, "%s: %s", path, strerror(errno));
  if (rc) unlink(tmp);
  free(tmp);
  return rc;
}

static char *entry_path(const file_store *fs, const char *id, const char *ext) {
  size_t n = strlen(fs->dir) + strlen(id) + strlen(ext) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/%s%s", fs->dir, id, ext);
  return p;
}

static const char *id_of(const json_t *obj) { return json_string_value(json_object_get(obj, "id")); }
static int64_t created_of(const json_t *obj) { return json_integer_value(json_object_get(obj, "created_at")); }

static int by_created(const void *a, const void *b) {
  const file_entry *x = a, *y = b;
  int64_t cx = created_of(x->obj), cy = created_of(y->obj);
  if (cx != cy) return cx < cy ? -1 : 1;
  return strcmp(id_of(x->obj), id_of(y->obj));
}

/* An id is letters, digits, '-' and '_' only: it names a file in the folder. */
static bool id_ok(const char *id) {
  if (!id || !id[0] || strlen(id) > 64) return false;
  for (const char *p = id; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_'))
      return false;
  return true;
}

int file_store_open(file_store **out, const char *dir, size_t max_bytes, herr *err) {
  *out = NULL;
  file_store *fs = calloc(1, sizeof *fs);
  if (!fs || !(fs->dir = hpath_join(dir, "files"))) {
    free(fs);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  fs->max_bytes = max_bytes ? max_bytes : FILES_DEFAULT_MAX_BYTES;
  pthread_mutex_init(&fs->mu, NULL);
  if (mkdir(fs->dir, 0700) != 0 && errno != EEXIST) {
    int rc = herr_set(err, HEARTH_EIO, "%s: %s", fs->dir, strerror(errno));
    file_store_close(fs);
    return rc;
  }
  DIR *d = opendir(fs->dir);
  if (!d) {
    int rc = herr_set(err, HEARTH_EIO, "%s: %s", fs->dir, strerror(errno));
    file_store_close(fs);
    return rc;
  }
  for (struct dirent *e; (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    if (n < 6 || strcmp(e->d_name + n - 5, ".json") != 0) continue;
    char *p = hpath_join(fs->dir, e->d_name);
    json_t *obj = p ? json_load_file(p, 0, NULL) : NULL;
    char *content = obj && id_ok(id_of(obj)) ? entry_path(fs, id_of(obj), "") : NULL;
    if (content && hfile_exists(content) && (fs->n < fs->cap || HGROW(fs->entries, fs->cap, fs->n + 1))) {
      fs->entries[fs->n++] = (file_entry){.obj = obj};
      obj = NULL;
    }
    json_decref(obj);
    free(content);
    free(p);
  }
  closedir(d);
  if (fs->n) qsort(fs->entries, fs->n, sizeof *fs->entries, by_created);
  *out = fs;
  return 0;
}

void file_store_close(file_store *fs) {
  if (!fs) return;
  for (size_t i = 0; i < fs->n; i++) json_decref(fs->entries[i].obj);
  free(fs->entries);
  pthread_mutex_destroy(&fs->mu);
  free(fs->dir);
  free(fs);
}

size_t file_store_max_bytes(const file_store *fs) { return fs->max_bytes; }

/* ---- multipart/form-data ---- */

/* The value of `key=` in a header's parameters (quoted or not) into out. */
static bool header_param(const char *h, size_t hlen, const char *key, const char **val, size_t *vlen) {
  size_t klen = strlen(key);
  for (size_t i = 0; i + klen + 1 <= hlen; i++) {
    if (strncasecmp(h + i, key, klen) != 0 || h[i + klen] != '=') continue;
    if (i > 0 && h[i - 1] != ' ' && h[i - 1] != ';' && h[i - 1] != '\t') continue;
    const char *v = h + i + klen + 1, *end = h + hlen;
    if (v < end && *v == '"') {
      const char *q = memchr(v + 1, '"', (size_t)(end - v - 1));
      if (!q) return false;
      *val = v + 1;
      *vlen = (size_t)(q - v - 1);
    } else {
      const char *e = v;
      while (e < end && *e != ';' && *e != ' ' && *e != '\r') e++;
      *val = v;
      *vlen = (size_t)(e - v);
    }
    return true;
  }
  return false;
}

int multipart_parse(const char *content_type, const char *body, size_t len, multipart_part *parts, int max, int *n,
                    serve_fail *f) {
  *n = 0;
  const char *b;
  size_t blen;
  if (!content_type || strncasecmp(content_type, "multipart/form-data", 19) != 0 ||
      !header_param(content_type, strlen(content_type), "boundary", &b, &blen) || blen == 0 || blen > 200)
    return serve_bad(f, NULL, "An upload must be multipart/form-data with a boundary (the fields 'purpose' and 'file')");
  char delim[208];
  int dlen = snprintf(delim, sizeof delim, "--%.*s", (int)blen, b);
  const char *p = memmem(body, len, delim, (size_t)dlen), *end = body + len;
  if (!p) return serve_bad(f, NULL, "The multipart body holds no part (its boundary is not in it)");
  for (;;) {
    p += dlen;
    if (end - p >= 2 && p[0] == '-' && p[1] == '-') return 0; /* the closing delimiter */
    if (end - p < 2 || p[0] != '\r' || p[1] != '\n') break;
    p += 2;
    const char *hend = memmem(p, (size_t)(end - p), "\r\n\r\n", 4);
    if (!hend) break;
    multipart_part part = {0};
    for (const char *h = p; h < hend;) { /* the part's header lines */
      const char *eol = memmem(h, (size_t)(hend - h), "\r\n", 2);
      if (!eol) eol = hend;
      size_t hl = (size_t)(eol - h);
      if (hl > 20 && strncasecmp(h, "Content-Disposition:", 20) == 0) {
        header_param(h, hl, "name", &part.name, &part.name_len);
        header_param(h, hl, "filename", &part.filename, &part.filename_len);
      }
      h = eol + 2;
    }
    const char *data = hend + 4;
    char next[212];
    int nlen = snprintf(next, sizeof next, "\r\n%s", delim);
    const char *q = memmem(data, (size_t)(end - data), next, (size_t)nlen);
    if (!q) break;
    if (!part.name) return serve_bad(f, NULL, "A multipart part has no Content-Disposition name");
    part.data = data;
    part.len = (size_t)(q - data);
    if (*n < max) parts[(*n)++] = part;
    p = q + 2;
  }
  return serve_bad(f, NULL, "The multipart body is malformed or cut short (no closing boundary)");
}

static const multipart_part *part_named(const multipart_part *parts, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (parts[i].name_len == strlen(name) && !memcmp(parts[i].name, name, parts[i].name_len)) return &parts[i];
  return NULL;
}

/* ---- the store ---- */

static int64_t now_unix(void) { return (int64_t)time(NULL); }

/* Saves obj as the entry's object file and appends it (under mu). */
static int add_entry(file_store *fs, json_t *obj, herr *err) {
  char *text = json_dumps(obj, JSON_COMPACT);
  char *p = entry_path(fs, id_of(obj), ".json");
  int rc = !text || !p ? herr_set(err, HEARTH_ENOMEM, "out of memory") : file_write_atomic(p, text, strlen(text), err);
  if (!rc && fs->n == fs->cap && !HGROW(fs->entries, fs->cap, fs->n + 1)) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
  if (!rc) fs->entries[fs->n++] = (file_entry){.obj = json_incref(obj)};
  free(text);
  free(p);
  return rc;
}

static json_t *new_object(const char *filename, const char *purpose, size_t bytes) {
  char id[64];
  serve_random_id(id, sizeof id, "file-", 24);
  return json_pack("{s:s, s:s, s:I, s:I, s:s, s:s, s:s, s:n}", "id", id, "object", "file", "bytes", (json_int_t)bytes,
                   "created_at", (json_int_t)now_unix(), "filename", filename, "purpose", purpose, "status", "processed",
                   "status_details");
}

int file_store_upload(file_store *fs, const char *content_type, const char *body, size_t len, json_t **obj,
                      serve_fail *f) {
  *obj = NULL;
  multipart_part parts[8];
  int n;
  if (multipart_parse(content_type, body, len, parts, 8, &n, f)) return f->status;
  const multipart_part *purpose = part_named(parts, n, "purpose"), *file = part_named(parts, n, "file");
  if (!purpose) return serve_bad(f, "purpose", "Missing required parameter: 'purpose' (hearth keeps files for the Batch API: \"batch\")");
  if (purpose->len != 5 || memcmp(purpose->data, "batch", 5) != 0)
    return serve_bad(f, "purpose", "'purpose' is '%.*s': hearth keeps files for the Batch API only, so it must be \"batch\"",
                     (int)(purpose->len > 64 ? 64 : purpose->len), purpose->data);
  if (!file) return serve_bad(f, "file", "Missing required parameter: 'file' (the JSONL file, as a form part with a filename)");
  if (file->len > fs->max_bytes)
    return serve_fail_set(f, 413, "invalid_request_error", "file", "file_too_large",
                          "The file has %zu bytes; the limit is %zu (hearth serve --max-file-size)", file->len, fs->max_bytes);
  if (file->len == 0) return serve_bad(f, "file", "The file is empty: a batch input file holds one JSON request per line");
  if (memchr(file->data, 0, file->len))
    return serve_fail_set(f, 400, "invalid_request_error", "file", "invalid_file_format",
                          "The file holds a NUL byte: a batch input file is JSONL text, one JSON request per line");
  size_t lines = 0;
  for (const char *p = file->data, *end = file->data + file->len; p < end; lines++) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    p = nl ? nl + 1 : end;
  }
  if (lines > FILES_MAX_LINES)
    return serve_fail_set(f, 400, "invalid_request_error", "file", "too_many_lines",
                          "The file has %zu lines; a batch takes at most %d requests", lines, FILES_MAX_LINES);
  char filename[256];
  snprintf(filename, sizeof filename, "%.*s", file->filename ? (int)(file->filename_len > 255 ? 255 : file->filename_len) : 0,
           file->filename ? file->filename : "");
  json_t *o = new_object(filename[0] ? filename : "upload.jsonl", "batch", file->len);
  herr err = {0};
  char *path = o ? entry_path(fs, id_of(o), "") : NULL;
  int rc = !path ? herr_set(&err, HEARTH_ENOMEM, "out of memory") : file_write_atomic(path, file->data, file->len, &err);
  if (!rc) {
    pthread_mutex_lock(&fs->mu);
    rc = add_entry(fs, o, &err);
    pthread_mutex_unlock(&fs->mu);
    if (rc) unlink(path);
  }
  free(path);
  if (rc) {
    json_decref(o);
    return serve_fail_set(f, 500, "server_error", NULL, NULL, "could not keep the file: %s", err.msg);
  }
  *obj = o;
  return 200;
}

int file_store_adopt(file_store *fs, const char *path, const char *filename, const char *purpose, json_t **obj,
                     herr *err) {
  *obj = NULL;
  struct stat st;
  if (stat(path, &st) != 0) return herr_set(err, HEARTH_EIO, "%s: %s", path, strerror(errno));
  json_t *o = new_object(filename, purpose, (size_t)st.st_size);
  char *dst = o ? entry_path(fs, id_of(o), "") : NULL;
  int rc = !dst ? herr_set(err, HEARTH_ENOMEM, "out of memory") : 0;
  if (!rc && rename(path, dst) != 0) rc = herr_set(err, HEARTH_EIO, "%s: %s", dst, strerror(errno));
  if (!rc) {
    pthread_mutex_lock(&fs->mu);
    rc = add_entry(fs, o, err);
    pthread_mutex_unlock(&fs->mu);
  }
  free(dst);
  if (rc) json_decref(o);
  else *obj = o;
  return rc;
}

/* The entry of id (under mu), or -1. */
static ssize_t find(const file_store *fs, const char *id) {
  for (size_t i = 0; i < fs->n; i++)
    if (!strcmp(id_of(fs->entries[i].obj), id)) return (ssize_t)i;
  return -1;
}

static int not_found(serve_fail *f, const char *id) {
  return serve_fail_set(f, 404, "invalid_request_error", "file_id", "not_found", "No file with id '%.200s'", id);
}

int file_store_list(file_store *fs, const char *purpose, const char *after, int64_t limit, bool asc, json_t **out,
                    serve_fail *f) {
  *out = NULL;
  if (limit < 1 || limit > 10000) return serve_bad(f, "limit", "'limit' is %lld; it must be from 1 to 10000", (long long)limit);
  json_t *data = json_array();
  bool more = false, started = after == NULL;
  pthread_mutex_lock(&fs->mu);
  for (size_t k = 0; k < fs->n; k++) {
    const json_t *o = fs->entries[asc ? k : fs->n - 1 - k].obj;
    if (!started) {
      started = !strcmp(id_of(o), after);
      continue;
    }
    if (purpose && strcmp(json_string_value(json_object_get(o, "purpose")), purpose) != 0) continue;
    if ((int64_t)json_array_size(data) == limit) {
      more = true;
      break;
    }
    json_array_append_new(data, json_deep_copy(o));
  }
  pthread_mutex_unlock(&fs->mu);
  size_t n = json_array_size(data);
  json_t *first = n ? json_object_get(json_array_get(data, 0), "id") : NULL;
  json_t *last = n ? json_object_get(json_array_get(data, n - 1), "id") : NULL;
  *out = json_pack("{s:s, s:o, s:O?, s:O?, s:b}", "object", "list", "data", data, "first_id", first, "last_id", last,
                   "has_more", more);
  return 200;
}

int file_store_get(file_store *fs, const char *id, json_t **obj, serve_fail *f) {
  pthread_mutex_lock(&fs->mu);
  ssize_t i = find(fs, id);
  *obj = i >= 0 ? json_deep_copy(fs->entries[i].obj) : NULL;
  pthread_mutex_unlock(&fs->mu);
  return i >= 0 ? 200 : not_found(f, id);
}

int file_store_read(file_store *fs, const char *id, char **data, size_t *len, serve_fail *f) {
  *data = NULL;
  *len = 0;
  pthread_mutex_lock(&fs->mu);
  ssize_t i = find(fs, id);
  char *p = i >= 0 ? entry_path(fs, id, "") : NULL;
  herr err = {0};
  int rc = i < 0 ? not_found(f, id) : !p ? serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory") : 0;
  if (!rc && hfile_read(p, data, len, &err)) rc = serve_fail_set(f, 500, "server_error", NULL, NULL, "%s", err.msg);
  pthread_mutex_unlock(&fs->mu);
  free(p);
  return rc ? rc : 200;
}

int file_store_delete(file_store *fs, const char *id, json_t **obj, serve_fail *f) {
  *obj = NULL;
  pthread_mutex_lock(&fs->mu);
  ssize_t i = find(fs, id);
  if (i >= 0) {
    char *meta = entry_path(fs, id, ".json"), *content = entry_path(fs, id, "");
    if (meta) unlink(meta);
    if (content) unlink(content);
    free(meta);
    free(content);
    json_decref(fs->entries[i].obj);
    memmove(&fs->entries[i], &fs->entries[i + 1], sizeof *fs->entries * (fs->n - (size_t)i - 1));
    fs->n--;
  }
  pthread_mutex_unlock(&fs->mu);
  if (i < 0) return not_found(f, id);
  *obj = json_pack("{s:s, s:s, s:b}", "id", id, "object", "file", "deleted", 1);
  return 200;
}
