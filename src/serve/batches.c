/* batches.c — the Batch API's batches and their runner. Each batch is its
 * object in STATE_DIR/batches/ID.json (rewritten through a rename at every
 * change), and while it runs, ID.output.jsonl and ID.errors.jsonl, appended
 * a line per row as rows end. A row whose custom_id is in either file is
 * done; on a restart the runner reads them back (a line cut short by a kill
 * is cut off) and runs only the rest, so no row is answered twice. Lines that
 * are not requests get their error lines at validation; they are found the
 * same way again on a restart and never run. The runner runs one batch at a
 * time, oldest first, `concurrency` rows at once, each posted to the server
 * with X-Hearth-Priority: low, so the scheduler admits interactive requests
 * before them. A halt (the server draining or stopping) cuts the rows in
 * flight by shutting their sockets; their answers are dropped, and they run
 * again after the restart. Knows the server only by its address (batch_row.h)
 * and the files only through files.h. */
#include "serve/batches.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "base/dict.h"
#include "base/file.h"
#include "base/log.h"
#include "base/vec.h"
#include "serve/reply.h"

#define COMPLETION_WINDOW_S (24 * 3600)
#define MAX_METADATA 16

typedef struct bentry {
  json_t *obj;        /* owned: the batch object (under the store's mu) */
  atomic_bool cancel; /* cancel asked: the runner takes no more of its rows */
} bentry;

struct batch_store {
  char *dir;              /* owned: STATE_DIR/batches */
  file_store *files;      /* borrowed */
  batch_row_target target;
  int concurrency;
  pthread_mutex_t mu;     /* entries, their objects, running */
  pthread_cond_t cv;      /* a new batch, or a halt */
  bentry **entries;       /* owned, oldest first */
  size_t n, cap;
  bentry *running;        /* borrowed: the batch the runner works on */
  pthread_t runner;
  bool started;
  atomic_bool halt;
  atomic_int *fds;        /* owned [concurrency]: the sockets of rows in flight (-1: none) */
  atomic_llong shift;     /* tests: seconds added to the clock */
};

static int64_t now_s(batch_store *bs) { return (int64_t)time(NULL) + atomic_load(&bs->shift); }

void batch_store_shift_clock(batch_store *bs, int64_t seconds) { atomic_fetch_add(&bs->shift, seconds); }

static const char *str_of(const json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }
static const char *id_of(const bentry *b) { return str_of(b->obj, "id"); }
static const char *status_of(const bentry *b) { return str_of(b->obj, "status"); }

static bool ended(const char *status) {
  return !strcmp(status, "completed") || !strcmp(status, "failed") || !strcmp(status, "expired") ||
         !strcmp(status, "cancelled");
}

static char *path_of(const batch_store *bs, const char *id, const char *ext) {
  size_t n = strlen(bs->dir) + strlen(id) + strlen(ext) + 2;
  char *p = malloc(n);
  if (p) snprintf(p, n, "%s/%s%s", bs->dir, id, ext);
  return p;
}

/* Writes b's object (under mu). A failure is logged: the batch goes on in memory. */
static void save_locked(batch_store *bs, bentry *b) {
  char *text = json_dumps(b->obj, JSON_COMPACT);
  char *p = path_of(bs, id_of(b), ".json");
  herr err = {0};
  if (!text || !p || file_write_atomic(p, text, strlen(text), &err))
    HLOG_WARN("batches: cannot save %s: %s", id_of(b), text && p ? err.msg : "out of memory");
  free(text);
  free(p);
}

static void set_now_locked(batch_store *bs, bentry *b, const char *key) {
  json_object_set_new(b->obj, key, json_integer(now_s(bs)));
}

static void set_status_locked(batch_store *bs, bentry *b, const char *status, const char *at_key) {
  json_object_set_new(b->obj, "status", json_string(status));
  if (at_key) set_now_locked(bs, b, at_key);
  save_locked(bs, b);
}

static void set_counts_locked(bentry *b, int64_t total, int64_t completed, int64_t failed) {
  json_object_set_new(b->obj, "request_counts",
                      json_pack("{s:I, s:I, s:I}", "total", (json_int_t)total, "completed", (json_int_t)completed,
                                "failed", (json_int_t)failed));
}

static void count_add_locked(bentry *b, bool ok) {
  json_t *c = json_object_get(b->obj, "request_counts");
  const char *k = ok ? "completed" : "failed";
  json_object_set_new(c, k, json_integer(json_integer_value(json_object_get(c, k)) + 1));
}

static bentry *find_locked(batch_store *bs, const char *id) {
  for (size_t i = 0; i < bs->n; i++)
    if (!strcmp(id_of(bs->entries[i]), id)) return bs->entries[i];
  return NULL;
}

/* ---- opening ---- */

static int by_created(const void *a, const void *b) {
  const bentry *x = *(bentry *const *)a, *y = *(bentry *const *)b;
  int64_t cx = json_integer_value(json_object_get(x->obj, "created_at"));
  int64_t cy = json_integer_value(json_object_get(y->obj, "created_at"));
  if (cx != cy) return cx < cy ? -1 : 1;
  return strcmp(id_of(x), id_of(y));
}

static int add_entry_locked(batch_store *bs, json_t *obj /* consumed */) {
  bentry *b = calloc(1, sizeof *b);
  if (!b || (bs->n == bs->cap && !HGROW(bs->entries, bs->cap, bs->n + 1))) {
    free(b);
    json_decref(obj);
    return 1;
  }
  b->obj = obj;
  atomic_init(&b->cancel, !strcmp(status_of(b), "cancelling"));
  bs->entries[bs->n++] = b;
  return 0;
}

int batch_store_open(batch_store **out, const char *dir, file_store *files, const batch_row_target *target,
                     int concurrency, herr *err) {
  *out = NULL;
  batch_store *bs = calloc(1, sizeof *bs);
  if (!bs || !(bs->dir = hpath_join(dir, "batches"))) {
    free(bs);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  bs->files = files;
  bs->target = *target;
  bs->target.priority = "low";
  bs->concurrency = concurrency > 0 ? concurrency : BATCHES_DEFAULT_CONCURRENCY;
  pthread_mutex_init(&bs->mu, NULL);
  pthread_cond_init(&bs->cv, NULL);
  atomic_init(&bs->halt, false);
  atomic_init(&bs->shift, 0);
  bs->fds = calloc((size_t)bs->concurrency, sizeof *bs->fds);
  if (!bs->fds) {
    batch_store_close(bs);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  for (int i = 0; i < bs->concurrency; i++) atomic_init(&bs->fds[i], -1);
  if (mkdir(bs->dir, 0700) != 0 && errno != EEXIST) {
    int rc = herr_set(err, HEARTH_EIO, "%s: %s", bs->dir, strerror(errno));
    batch_store_close(bs);
    return rc;
  }
  DIR *d = opendir(bs->dir);
  if (!d) {
    int rc = herr_set(err, HEARTH_EIO, "%s: %s", bs->dir, strerror(errno));
    batch_store_close(bs);
    return rc;
  }
  for (struct dirent *e; (e = readdir(d));) {
    size_t n = strlen(e->d_name);
    if (n < 6 || strcmp(e->d_name + n - 5, ".json") != 0) continue;
    char *p = hpath_join(bs->dir, e->d_name);
    json_t *obj = p ? json_load_file(p, 0, NULL) : NULL;
    if (json_is_string(json_object_get(obj, "id")) && json_is_string(json_object_get(obj, "status"))) add_entry_locked(bs, obj);
    else json_decref(obj);
    free(p);
  }
  closedir(d);
  if (bs->n) qsort(bs->entries, bs->n, sizeof *bs->entries, by_created);
  *out = bs;
  return 0;
}

/* ---- the runner ---- */

typedef struct run_row {
  json_t *line; /* owned: the checked input line */
} run_row;

typedef struct run {
  batch_store *bs;
  bentry *b;
  run_row *rows;   /* owned: the rows still to run */
  size_t n, cap, next; /* next: the first row no worker has taken (under mu) */
  FILE *out, *err; /* the batch's output and error lines, appended (under mu) */
  pthread_mutex_t mu;
  bool expired;    /* the completion window ended: no more rows are taken */
  int64_t saved_at; /* when the batch's counts were last saved (under the store's mu) */
} run;

/* The codes of lines refused at validation: found again on a restart, never run. */
static bool refused_code(const char *code) {
  static const char *const codes[] = {"invalid_json_line", "missing_custom_id", "duplicate_custom_id", "invalid_method",
                                      "invalid_url",       "mismatched_url",    "invalid_body"};
  for (size_t i = 0; code && i < sizeof codes / sizeof codes[0]; i++)
    if (!strcmp(code, codes[i])) return true;
  return false;
}

/* Reads a row file back: its lines are counted into *lines and the custom_ids
 * of answered rows put in done; a last line without its newline (cut by a
 * kill) is cut off. A missing file has no lines. */
static int read_rows_file(const char *path, hdict *done, int64_t *lines) {
  *lines = 0;
  char *data = NULL;
  size_t len = 0;
  herr e = {0};
  if (!hfile_exists(path)) return 0;
  if (hfile_read(path, &data, &len, &e)) return 1;
  size_t keep = 0;
  for (char *p = data, *end = data + len; p < end;) {
    char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl) break;
    keep = (size_t)(nl + 1 - data);
    json_t *o = json_loadb(p, (size_t)(nl - p), 0, NULL);
    if (o) {
      (*lines)++;
      json_t *cid = json_object_get(o, "custom_id");
      if (json_is_string(cid) && !refused_code(str_of(json_object_get(o, "error"), "code")))
        hdict_put(done, json_string_value(cid), json_string_length(cid), 1);
    }
    json_decref(o);
    p = nl + 1;
  }
  if (keep < len && truncate(path, (off_t)keep) != 0) HLOG_WARN("batches: cannot cut %s: %s", path, strerror(errno));
  free(data);
  return 0;
}

static void append_line(FILE *f, json_t *o) {
  char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9));
  if (s) fprintf(f, "%s\n", s);
  fflush(f);
  free(s);
}

static bool row_ok(json_t *o) {
  if (!o || !json_is_null(json_object_get(o, "error"))) return false;
  json_int_t st = json_integer_value(json_object_get(json_object_get(o, "response"), "status_code"));
  return st >= 200 && st < 300;
}

typedef struct worker_arg {
  run *r;
  int slot;
} worker_arg;

static void *worker_main(void *arg) {
  worker_arg *w = arg;
  run *r = w->r;
  batch_store *bs = r->bs;
  int64_t expires = json_integer_value(json_object_get(r->b->obj, "expires_at"));
  for (;;) {
    pthread_mutex_lock(&r->mu);
    size_t i = r->n;
    if (!r->expired && now_s(bs) >= expires) r->expired = true;
    if (!atomic_load(&bs->halt) && !atomic_load(&r->b->cancel) && !r->expired && r->next < r->n) i = r->next++;
    pthread_mutex_unlock(&r->mu);
    if (i == r->n) return NULL;
    bool transport_failed;
    int64_t tokens;
    json_t *o = batch_row_post(&bs->target, r->rows[i].line, &bs->fds[w->slot], &transport_failed, &tokens);
    if (atomic_load(&bs->halt)) { /* cut short by the halt, or answered during it: runs again after the restart */
      json_decref(o);
      return NULL;
    }
    bool ok = row_ok(o);
    pthread_mutex_lock(&r->mu);
    if (o) append_line(ok ? r->out : r->err, o);
    pthread_mutex_unlock(&r->mu);
    json_decref(o);
    pthread_mutex_lock(&bs->mu);
    count_add_locked(r->b, ok);
    int64_t t = (int64_t)time(NULL);
    if (t != r->saved_at) { /* the counts on disk at most a second behind (a restart counts the lines again) */
      save_locked(bs, r->b);
      r->saved_at = t;
    }
    pthread_mutex_unlock(&bs->mu);
  }
}

/* The batch failed before running: errors {"object": "list", "data": [{code, message, param, line}]}. */
static void fail_batch(batch_store *bs, bentry *b, const char *code, const char *msg) {
  pthread_mutex_lock(&bs->mu);
  json_object_set_new(b->obj, "errors",
                      json_pack("{s:s, s:[{s:s, s:s, s:n, s:n}]}", "object", "list", "data", "code", code, "message",
                                msg, "param", "line"));
  set_status_locked(bs, b, "failed", "failed_at");
  pthread_mutex_unlock(&bs->mu);
}

/* The output and error lines become files of the store, and the batch ends
 * with `status` (its *_at set). Lines files that are empty are dropped. */
static void finalize_locked(batch_store *bs, bentry *b, const char *status, const char *at_key) {
  const char *id = id_of(b);
  const char *exts[2] = {".output.jsonl", ".errors.jsonl"}, *keys[2] = {"output_file_id", "error_file_id"};
  const char *names[2] = {"_output.jsonl", "_error.jsonl"};
  for (int k = 0; k < 2; k++) {
    char *p = path_of(bs, id, exts[k]);
    struct stat st;
    if (p && stat(p, &st) == 0 && st.st_size > 0) {
      char name[160];
      snprintf(name, sizeof name, "%s%s", id, names[k]);
      json_t *fo = NULL;
      herr err = {0};
      if (file_store_adopt(bs->files, p, name, "batch_output", &fo, &err))
        HLOG_WARN("batches: %s: %s", id, err.msg);
      else json_object_set(b->obj, keys[k], json_object_get(fo, "id"));
      json_decref(fo);
    }
    if (p) unlink(p);
    free(p);
  }
  set_status_locked(bs, b, status, at_key);
}

/* Splits the input into rows: the lines refused are written to err (when
 * given) and counted in *refused, the rest checked into r->rows unless their
 * custom_id is in done. *total: the lines that are not blank. */
static int split_rows(run *r, const char *input, size_t len, const char *endpoint, FILE *err, const hdict *done,
                      int64_t *total, int64_t *refused) {
  hdict seen;
  hdict_init(&seen);
  int line = 0;
  *total = *refused = 0;
  for (const char *p = input, *end = input + len; p < end;) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
    line++;
    size_t k = 0;
    while (k < n && (p[k] == ' ' || p[k] == '\t' || p[k] == '\r')) k++;
    if (k < n) {
      (*total)++;
      char *cid = batch_row_custom_id(p, n);
      int64_t dummy;
      bool dup = cid && hdict_gets(&seen, cid, &dummy);
      if (cid && !dup) hdict_put(&seen, cid, strlen(cid), 1);
      json_t *bad = NULL;
      json_t *ok = batch_row_check(p, n, line, dup, endpoint, &bad);
      if (!ok) {
        (*refused)++;
        if (err && bad) append_line(err, bad);
      } else if (!(cid && done && hdict_gets(done, cid, &dummy))) {
        if (r->n == r->cap && !HGROW(r->rows, r->cap, r->n + 1)) {
          json_decref(ok);
          json_decref(bad);
          free(cid);
          hdict_free(&seen);
          return 1;
        }
        r->rows[r->n++].line = ok;
        ok = NULL;
      }
      json_decref(ok);
      json_decref(bad);
      free(cid);
    }
    p += n + 1;
  }
  hdict_free(&seen);
  return 0;
}

static void run_free(run *r) {
  for (size_t i = 0; i < r->n; i++) json_decref(r->rows[i].line);
  free(r->rows);
  if (r->out) fclose(r->out);
  if (r->err) fclose(r->err);
  pthread_mutex_destroy(&r->mu);
}

static void run_batch(batch_store *bs, bentry *b) {
  pthread_mutex_lock(&bs->mu);
  char id[96], input_id[96], endpoint[64], status[32];
  snprintf(id, sizeof id, "%s", id_of(b));
  snprintf(input_id, sizeof input_id, "%s", str_of(b->obj, "input_file_id"));
  snprintf(endpoint, sizeof endpoint, "%s", str_of(b->obj, "endpoint"));
  snprintf(status, sizeof status, "%s", status_of(b));
  pthread_mutex_unlock(&bs->mu);
  char *out_path = path_of(bs, id, ".output.jsonl"), *err_path = path_of(bs, id, ".errors.jsonl");
  run r = {.bs = bs, .b = b};
  pthread_mutex_init(&r.mu, NULL);
  char *input = NULL;
  size_t len = 0;
  serve_fail f;
  hdict done;
  hdict_init(&done);
  if (!out_path || !err_path) goto end;
  if (!strcmp(status, "validating") || !strcmp(status, "in_progress")) {
    if (file_store_read(bs->files, input_id, &input, &len, &f) != 200) {
      fail_batch(bs, b, "invalid_input_file", f.message);
      goto end;
    }
  }
  if (!strcmp(status, "validating")) {
    FILE *err = fopen(err_path, "w");
    int64_t total, refused;
    if (!err || split_rows(&r, input, len, endpoint, err, NULL, &total, &refused)) {
      if (err) fclose(err);
      fail_batch(bs, b, "server_error", "could not write the batch's error lines");
      goto end;
    }
    fclose(err);
    for (size_t i = 0; i < r.n; i++) json_decref(r.rows[i].line);
    r.n = 0;
    if (total == 0) {
      unlink(err_path);
      fail_batch(bs, b, "empty_file", "The input file holds no request lines");
      goto end;
    }
    pthread_mutex_lock(&bs->mu);
    set_counts_locked(b, total, 0, refused);
    if (!atomic_load(&b->cancel)) set_status_locked(bs, b, "in_progress", "in_progress_at");
    else save_locked(bs, b);
    snprintf(status, sizeof status, "%s", status_of(b));
    pthread_mutex_unlock(&bs->mu);
  }
  if (!strcmp(status, "in_progress")) {
    int64_t n_out = 0, n_err = 0, total, refused;
    if (read_rows_file(out_path, &done, &n_out) || read_rows_file(err_path, &done, &n_err) ||
        split_rows(&r, input, len, endpoint, NULL, &done, &total, &refused) || !(r.out = fopen(out_path, "a")) ||
        !(r.err = fopen(err_path, "a"))) {
      fail_batch(bs, b, "server_error", "could not read or write the batch's lines");
      goto end;
    }
    pthread_mutex_lock(&bs->mu);
    set_counts_locked(b, total, n_out, n_err);
    save_locked(bs, b);
    pthread_mutex_unlock(&bs->mu);
    int nth = r.n < (size_t)bs->concurrency ? (int)r.n : bs->concurrency;
    pthread_t th[nth > 0 ? nth : 1];
    worker_arg wa[nth > 0 ? nth : 1];
    int started = 0;
    for (; started < nth; started++) {
      wa[started] = (worker_arg){.r = &r, .slot = started};
      if (pthread_create(&th[started], NULL, worker_main, &wa[started]) != 0) break;
    }
    if (started == 0 && nth > 0) {
      wa[0] = (worker_arg){.r = &r, .slot = 0};
      worker_main(&wa[0]);
    }
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    if (atomic_load(&bs->halt)) goto end;
    if (!r.expired && r.next < r.n && !atomic_load(&b->cancel) &&
        now_s(bs) >= json_integer_value(json_object_get(b->obj, "expires_at")))
      r.expired = true;
    pthread_mutex_lock(&bs->mu);
    if (r.expired) { /* the rows never taken end as errors */
      for (size_t i = r.next; i < r.n; i++) {
        json_t *o = batch_row_error_line(json_object_get(r.rows[i].line, "custom_id"), "batch_expired",
                                         "This request could not be executed before the completion window expired.");
        append_line(r.err, o);
        json_decref(o);
        count_add_locked(b, false);
      }
      fclose(r.out), fclose(r.err);
      r.out = r.err = NULL;
      finalize_locked(bs, b, "expired", "expired_at");
    } else if (atomic_load(&b->cancel)) {
      fclose(r.out), fclose(r.err);
      r.out = r.err = NULL;
      if (strcmp(status_of(b), "cancelling") != 0) set_status_locked(bs, b, "cancelling", "cancelling_at");
      finalize_locked(bs, b, "cancelled", "cancelled_at");
    } else {
      fclose(r.out), fclose(r.err);
      r.out = r.err = NULL;
      set_status_locked(bs, b, "finalizing", "finalizing_at");
      finalize_locked(bs, b, "completed", "completed_at");
    }
    pthread_mutex_unlock(&bs->mu);
    goto end;
  }
  pthread_mutex_lock(&bs->mu);
  if (!strcmp(status_of(b), "finalizing")) finalize_locked(bs, b, "completed", "completed_at");
  else if (!strcmp(status_of(b), "cancelling")) finalize_locked(bs, b, "cancelled", "cancelled_at");
  pthread_mutex_unlock(&bs->mu);
end:
  hdict_free(&done);
  run_free(&r);
  free(input);
  free(out_path);
  free(err_path);
}

static void *runner_main(void *arg) {
  batch_store *bs = arg;
  pthread_mutex_lock(&bs->mu);
  while (!atomic_load(&bs->halt)) {
    bentry *b = NULL;
    for (size_t i = 0; i < bs->n && !b; i++)
      if (!ended(status_of(bs->entries[i]))) b = bs->entries[i];
    if (!b) {
      pthread_cond_wait(&bs->cv, &bs->mu);
      continue;
    }
    bs->running = b;
    pthread_mutex_unlock(&bs->mu);
    run_batch(bs, b);
    pthread_mutex_lock(&bs->mu);
    bs->running = NULL;
    if (!atomic_load(&bs->halt) && !ended(status_of(b))) { /* could not go on (out of memory): leave it for a restart */
      HLOG_WARN("batches: %s stopped in status %s", id_of(b), status_of(b));
      break;
    }
  }
  pthread_mutex_unlock(&bs->mu);
  return NULL;
}

int batch_store_start(batch_store *bs, herr *err) {
  if (pthread_create(&bs->runner, NULL, runner_main, bs) != 0)
    return herr_set(err, HEARTH_EIO, "could not start the batch runner's thread");
  bs->started = true;
  return 0;
}

void batch_store_halt(batch_store *bs) {
  atomic_store(&bs->halt, true);
  for (int i = 0; i < bs->concurrency; i++) {
    int fd = atomic_load(&bs->fds[i]);
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
  }
  pthread_mutex_lock(&bs->mu);
  pthread_cond_broadcast(&bs->cv);
  pthread_mutex_unlock(&bs->mu);
}

void batch_store_close(batch_store *bs) {
  if (!bs) return;
  if (bs->fds) batch_store_halt(bs);
  if (bs->started) pthread_join(bs->runner, NULL);
  for (size_t i = 0; i < bs->n; i++) {
    json_decref(bs->entries[i]->obj);
    free(bs->entries[i]);
  }
  free(bs->entries);
  free(bs->fds);
  pthread_cond_destroy(&bs->cv);
  pthread_mutex_destroy(&bs->mu);
  free(bs->dir);
  free(bs);
}

/* ---- the API ---- */

static int not_found(serve_fail *f, const char *id) {
  return serve_fail_set(f, 404, "invalid_request_error", "batch_id", "not_found", "No batch with id '%.200s'", id);
}

int batch_store_create(batch_store *bs, const char *body, size_t len, json_t **obj, serve_fail *f) {
  *obj = NULL;
  json_error_t je;
  json_t *root = json_loadb(body, len, 0, &je);
  if (!json_is_object(root)) {
    json_decref(root);
    return serve_bad(f, NULL, "The body must be a JSON object: {\"input_file_id\", \"endpoint\", \"completion_window\"}");
  }
  json_t *input = json_object_get(root, "input_file_id"), *endpoint = json_object_get(root, "endpoint");
  json_t *window = json_object_get(root, "completion_window"), *meta = serve_json_field(root, "metadata");
  int rc = 0;
  json_t *fo = NULL;
  if (!json_is_string(input)) rc = serve_bad(f, "input_file_id", "Missing required parameter: 'input_file_id' (a string)");
  else if (!json_is_string(endpoint)) rc = serve_bad(f, "endpoint", "Missing required parameter: 'endpoint'");
  else if (!batch_row_url_served(json_string_value(endpoint)))
    rc = serve_bad(f, "endpoint", "'endpoint' is '%.200s'; it must be /v1/chat/completions, /v1/completions or /v1/embeddings",
                   json_string_value(endpoint));
  else if (!json_is_string(window)) rc = serve_bad(f, "completion_window", "Missing required parameter: 'completion_window' (\"24h\")");
  else if (strcmp(json_string_value(window), "24h") != 0)
    rc = serve_bad(f, "completion_window", "'completion_window' is '%.40s'; only \"24h\" is supported", json_string_value(window));
  else if (meta && !json_is_object(meta)) rc = serve_bad(f, "metadata", "'metadata' must be an object of strings");
  else if (meta && json_object_size(meta) > MAX_METADATA)
    rc = serve_bad(f, "metadata", "'metadata' has %zu keys; at most %d", json_object_size(meta), MAX_METADATA);
  if (!rc && meta) {
    const char *k;
    json_t *v;
    json_object_foreach(meta, k, v) {
      if (strlen(k) > 64 || !json_is_string(v) || json_string_length(v) > 512) {
        rc = serve_bad(f, "metadata", "'metadata.%.64s' must be a string of at most 512 characters under a key of at most 64", k);
        break;
      }
    }
  }
  if (!rc) {
    serve_fail nf;
    if (file_store_get(bs->files, json_string_value(input), &fo, &nf) != 200)
      rc = serve_fail_set(f, 400, "invalid_request_error", "input_file_id", "invalid_input_file",
                          "No file with id '%.200s' (upload it with POST /v1/files, purpose \"batch\")", json_string_value(input));
    else if (strcmp(str_of(fo, "purpose"), "batch") != 0)
      rc = serve_fail_set(f, 400, "invalid_request_error", "input_file_id", "invalid_input_file",
                          "File '%.200s' has purpose '%s'; a batch's input must have purpose \"batch\"",
                          json_string_value(input), str_of(fo, "purpose"));
  }
  json_decref(fo);
  if (rc) {
    json_decref(root);
    return rc;
  }
  char id[64];
  serve_random_id(id, sizeof id, "batch_", 24);
  int64_t now = now_s(bs);
  json_t *o = json_pack(
      "{s:s, s:s, s:O, s:n, s:O, s:O, s:s, s:n, s:n, s:I, s:n, s:I, s:n, s:n, s:n, s:n, s:n, s:n, s:{s:i, s:i, s:i}, s:O?}",
      "id", id, "object", "batch", "endpoint", endpoint, "errors", "input_file_id", input, "completion_window", window,
      "status", "validating", "output_file_id", "error_file_id", "created_at", (json_int_t)now, "in_progress_at",
      "expires_at", (json_int_t)(now + COMPLETION_WINDOW_S), "finalizing_at", "completed_at", "failed_at",
      "expired_at", "cancelling_at", "cancelled_at", "request_counts", "total", 0, "completed", 0, "failed", 0,
      "metadata", meta);
  json_decref(root);
  if (o && !json_object_get(o, "metadata")) json_object_set_new(o, "metadata", json_null());
  pthread_mutex_lock(&bs->mu);
  if (!o || add_entry_locked(bs, json_incref(o))) {
    pthread_mutex_unlock(&bs->mu);
    json_decref(o);
    return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  }
  save_locked(bs, bs->entries[bs->n - 1]);
  *obj = json_deep_copy(o);
  pthread_cond_broadcast(&bs->cv);
  pthread_mutex_unlock(&bs->mu);
  json_decref(o);
  return 200;
}

int batch_store_get(batch_store *bs, const char *id, json_t **obj, serve_fail *f) {
  pthread_mutex_lock(&bs->mu);
  bentry *b = find_locked(bs, id);
  *obj = b ? json_deep_copy(b->obj) : NULL;
  pthread_mutex_unlock(&bs->mu);
  return b ? 200 : not_found(f, id);
}

int batch_store_list(batch_store *bs, const char *after, int64_t limit, json_t **out, serve_fail *f) {
  *out = NULL;
  if (limit < 1 || limit > 100) return serve_bad(f, "limit", "'limit' is %lld; it must be from 1 to 100", (long long)limit);
  json_t *data = json_array();
  bool more = false, started = after == NULL;
  pthread_mutex_lock(&bs->mu);
  for (size_t k = 0; k < bs->n; k++) {
    const bentry *b = bs->entries[bs->n - 1 - k];
    if (!started) {
      started = !strcmp(id_of(b), after);
      continue;
    }
    if ((int64_t)json_array_size(data) == limit) {
      more = true;
      break;
    }
    json_array_append_new(data, json_deep_copy(b->obj));
  }
  pthread_mutex_unlock(&bs->mu);
  size_t n = json_array_size(data);
  json_t *first = n ? json_object_get(json_array_get(data, 0), "id") : NULL;
  json_t *last = n ? json_object_get(json_array_get(data, n - 1), "id") : NULL;
  *out = json_pack("{s:s, s:o, s:O?, s:O?, s:b}", "object", "list", "data", data, "first_id", first, "last_id", last,
                   "has_more", more);
  return 200;
}

int batch_store_cancel(batch_store *bs, const char *id, json_t **obj, serve_fail *f) {
  *obj = NULL;
  pthread_mutex_lock(&bs->mu);
  bentry *b = find_locked(bs, id);
  int rc = 200;
  if (!b) {
    rc = not_found(f, id);
  } else if (ended(status_of(b))) {
    rc = serve_fail_set(f, 409, "invalid_request_error", NULL, "batch_not_cancellable",
                        "Batch '%.200s' is %s: only a batch that has not ended can be cancelled", id, status_of(b));
  } else if (strcmp(status_of(b), "cancelling") != 0 && strcmp(status_of(b), "finalizing") != 0) {
    atomic_store(&b->cancel, true);
    set_status_locked(bs, b, "cancelling", "cancelling_at");
    /* one the runner is not on ends now, with what lines it has (a batch resumed after a restart may have some) */
    if (bs->running != b) finalize_locked(bs, b, "cancelled", "cancelled_at");
  }
  if (b && rc == 200) *obj = json_deep_copy(b->obj);
  pthread_mutex_unlock(&bs->mu);
  return rc;
}
