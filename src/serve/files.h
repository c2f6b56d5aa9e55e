/* files.h — the OpenAI Files API's store for the Batch API: uploaded input
 * files (multipart/form-data with "purpose" and "file") and the output and
 * error files batches make, each a content file and a JSON file object
 * ({"id", "object": "file", "bytes", "created_at", "filename", "purpose",
 * "status"}) under STATE_DIR/files, so they outlive a restart. Thread-safe. */
#ifndef HEARTH_SERVE_FILES_H
#define HEARTH_SERVE_FILES_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "serve/request.h"

#define FILES_DEFAULT_MAX_BYTES ((size_t)200 << 20) /* OpenAI's limit for a batch input file */
#define FILES_MAX_LINES 50000                         /* rows in one batch input file at most */

typedef struct file_store file_store;

/* Opens (making it when missing) dir/files and reads the file objects kept
 * there. max_bytes: an upload's content at most (0: FILES_DEFAULT_MAX_BYTES). */
int file_store_open(file_store **out, const char *dir, size_t max_bytes, herr *err);
void file_store_close(file_store *fs);
size_t file_store_max_bytes(const file_store *fs);

/* One part of a multipart/form-data body (all pointers into the body). */
typedef struct multipart_part {
  const char *name, *filename; /* filename NULL when the part has none */
  size_t name_len, filename_len;
  const char *data;
  size_t len;
} multipart_part;

/* Splits body by the boundary of content_type into at most max parts;
 * *n the count. 400 with f filled when it is not multipart/form-data or is
 * malformed. */
int multipart_parse(const char *content_type, const char *body, size_t len, multipart_part *parts, int max, int *n,
                    serve_fail *f);

/* POST /v1/files: the upload in body (content_type its Content-Type); 200
 * with *obj the new file object, else the status with f filled (400 for a
 * bad form, a purpose other than "batch", an empty or binary file or one of
 * more than FILES_MAX_LINES lines; 413 over the size limit). */
int file_store_upload(file_store *fs, const char *content_type, const char *body, size_t len, json_t **obj,
                      serve_fail *f);
/* Moves the file at path into the store as a new file (a batch's output);
 * *obj its object (a new reference). */
int file_store_adopt(file_store *fs, const char *path, const char *filename, const char *purpose, json_t **obj,
                     herr *err);
/* GET /v1/files: {"object": "list", "data", "first_id", "last_id", "has_more"},
 * newest first (or oldest first when asc), only `purpose` (NULL: every
 * purpose), the files after the id `after` (NULL: from the first), at most
 * limit of them. 400 with f filled for a limit out of 1..10000. */
int file_store_list(file_store *fs, const char *purpose, const char *after, int64_t limit, bool asc, json_t **out,
                    serve_fail *f);
/* GET /v1/files/{id}: 200 with *obj (a copy), 404 with f filled when unknown. */
int file_store_get(file_store *fs, const char *id, json_t **obj, serve_fail *f);
/* GET /v1/files/{id}/content: 200 with *data (malloc'd, NUL-terminated) and *len. */
int file_store_read(file_store *fs, const char *id, char **data, size_t *len, serve_fail *f);
/* DELETE /v1/files/{id}: 200 with *obj {"id", "object": "file", "deleted": true}. */
int file_store_delete(file_store *fs, const char *id, json_t **obj, serve_fail *f);

/* Writes len bytes to path through a temporary file and a rename, so a
 * reader (or a restart) sees the old content or the new, never a part. */
int file_write_atomic(const char *path, const char *data, size_t len, herr *err);

#endif
