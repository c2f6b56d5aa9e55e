/* batches.h — the OpenAI Batch API's batches: create, retrieve, list and
 * cancel, with OpenAI's batch object and status flow (validating →
 * in_progress → finalizing → completed, or failed, or cancelling →
 * cancelled, or expired), kept under STATE_DIR/batches so that a restart
 * resumes the unfinished ones (rows already answered are not run again), and
 * a runner that answers their rows at low priority through the server's own
 * HTTP path (batch_row.h), one batch at a time, oldest first. Output and
 * error files go to the file store (files.h). Thread-safe. */
#ifndef HEARTH_SERVE_BATCHES_H
#define HEARTH_SERVE_BATCHES_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "serve/batch_row.h"
#include "serve/files.h"
#include "serve/request.h"

#define BATCHES_DEFAULT_CONCURRENCY 8 /* rows in flight at once by default */

typedef struct batch_store batch_store;

/* Opens (making it when missing) dir/batches and reads the batches kept
 * there; files is borrowed. Rows are posted to target (copied) with
 * X-Hearth-Priority: low, concurrency of them at once (<= 0: the default).
 * Nothing runs before batch_store_start. */
int batch_store_open(batch_store **out, const char *dir, file_store *files, const batch_row_target *target,
                     int concurrency, herr *err);
/* Starts the runner thread. */
int batch_store_start(batch_store *bs, herr *err);
/* The runner takes no more rows and cuts those in flight; their answers are
 * not kept (they run again after a restart). Returns at once. */
void batch_store_halt(batch_store *bs);
/* Halts, waits for the runner and frees. */
void batch_store_close(batch_store *bs);

/* POST /v1/batches: {"input_file_id", "endpoint", "completion_window": "24h",
 * "metadata"?}. 200 with *obj the new batch, else the status with f filled. */
int batch_store_create(batch_store *bs, const char *body, size_t len, json_t **obj, serve_fail *f);
/* GET /v1/batches/{id}: 200 with *obj (a copy), 404 when unknown. */
int batch_store_get(batch_store *bs, const char *id, json_t **obj, serve_fail *f);
/* GET /v1/batches: newest first, after the id `after` (NULL: from the
 * first), at most limit (1..100, else 400). */
int batch_store_list(batch_store *bs, const char *after, int64_t limit, json_t **out, serve_fail *f);
/* POST /v1/batches/{id}/cancel: the batch as it is now (cancelling, or
 * cancelled when it was not running); 409 when it has already ended. */
int batch_store_cancel(batch_store *bs, const char *id, json_t **obj, serve_fail *f);

/* Tests: seconds added to the clock the store reads (expiry, timestamps). */
void batch_store_shift_clock(batch_store *bs, int64_t seconds);

#endif
