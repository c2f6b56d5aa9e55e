/* test_batches.c — the Batch API's stores without HTTP clients: the
 * multipart/form-data parser (good forms, a quoted boundary, bodies cut short
 * or without names), the file store (upload, list with after / limit and
 * purpose, content, delete, a purpose other than "batch", an empty file, a
 * NUL byte, a file over the size limit, the objects read back after a
 * reopen), and the batch store running rows against the server over the fake
 * engine: the refusals of create (unknown input file, an output file as
 * input, a window other than "24h", bad metadata), a bad JSONL line, a
 * duplicate custom_id and a url other than the endpoint each answered by an
 * error line while the good rows complete, the batch read back after a
 * reopen, the rows generated at low priority, a cancel of an ended batch
 * refused, an interactive request's X-Hearth-Priority checked, and a batch past its
 * completion window (the clock moved) ending expired with a batch_expired
 * line per row. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/file.h"
#include "fake_engine.h"
#include "serve/batches.h"
#include "serve/files.h"
#include "serve/server.h"
#include "test.h"

#define BOUNDARY "----hearthTestBoundary42"
#define CT "multipart/form-data; boundary=" BOUNDARY

/* A form with a purpose field and a file part (NULL: left out). */
static char *form(const char *purpose, const char *file, size_t file_len, size_t *len) {
  hbuf b = {0};
  if (purpose) hbuf_printf(&b, "--" BOUNDARY "\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n%s\r\n", purpose);
  if (file) {
    hbuf_puts(&b, "--" BOUNDARY "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"rows.jsonl\"\r\n"
                  "Content-Type: application/jsonl\r\n\r\n");
    hbuf_append(&b, file, file_len);
    hbuf_puts(&b, "\r\n");
  }
  hbuf_puts(&b, "--" BOUNDARY "--\r\n");
  *len = b.len;
  return hbuf_take(&b);
}

static void test_multipart(void) {
  size_t len;
  char *body = form("batch", "line one\r\nline two", 18, &len);
  multipart_part parts[4];
  int n = 0;
  serve_fail f;
  CHECK_EQ_INT(multipart_parse(CT, body, len, parts, 4, &n, &f), 0);
  CHECK_EQ_INT(n, 2);
  CHECK(n == 2 && parts[0].len == 5 && !memcmp(parts[0].data, "batch", 5));
  CHECK(n == 2 && parts[1].len == 18 && !memcmp(parts[1].data, "line one\r\nline two", 18));
  CHECK(n == 2 && parts[1].filename_len == 10 && !memcmp(parts[1].filename, "rows.jsonl", 10));
  /* a quoted boundary */
  CHECK_EQ_INT(multipart_parse("multipart/form-data; boundary=\"" BOUNDARY "\"", body, len, parts, 4, &n, &f), 0);
  CHECK_EQ_INT(n, 2);
  /* cut short: no closing delimiter */
  CHECK_EQ_INT(multipart_parse(CT, body, len - 10, parts, 4, &n, &f), 400);
  CHECK(strstr(f.message, "cut short") != NULL);
  /* not a form */
  CHECK_EQ_INT(multipart_parse("application/json", body, len, parts, 4, &n, &f), 400);
  CHECK(strstr(f.message, "multipart/form-data") != NULL);
  free(body);
  const char *noname = "--" BOUNDARY "\r\nContent-Type: text/plain\r\n\r\nx\r\n--" BOUNDARY "--\r\n";
  CHECK_EQ_INT(multipart_parse(CT, noname, strlen(noname), parts, 4, &n, &f), 400);
  CHECK(strstr(f.message, "name") != NULL);
}

static char *tmpdir(void) {
  char tmpl[] = "/tmp/hearth-test-batches-XXXXXX";
  char *d = mkdtemp(tmpl);
  return d ? strdup(d) : NULL;
}

static void rmtree(const char *dir) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static json_t *upload(file_store *fs, const char *purpose, const char *text, size_t text_len, int want, serve_fail *f) {
  size_t len;
  char *body = form(purpose, text, text_len, &len);
  json_t *o = NULL;
  CHECK_EQ_INT(file_store_upload(fs, CT, body, len, &o, f), want);
  free(body);
  return o;
}

static void test_file_store(void) {
  char *dir = tmpdir();
  if (!dir) return;
  file_store *fs;
  herr e = {0};
  CHECK_EQ_INT(file_store_open(&fs, dir, 64, &e), 0);
  serve_fail f;
  const char *rows = "{\"a\": 1}\n{\"b\": 2}\n";
  json_t *a = upload(fs, "batch", rows, strlen(rows), 200, &f);
  json_t *b = upload(fs, "batch", "{}\n", 3, 200, &f);
  CHECK_EQ_STR(json_string_value(json_object_get(a, "object")), "file");
  CHECK_EQ_STR(json_string_value(json_object_get(a, "purpose")), "batch");
  CHECK_EQ_STR(json_string_value(json_object_get(a, "filename")), "rows.jsonl");
  CHECK_EQ_INT(json_integer_value(json_object_get(a, "bytes")), (int64_t)strlen(rows));
  const char *ida = json_string_value(json_object_get(a, "id")), *idb = json_string_value(json_object_get(b, "id"));
  /* refusals */
  upload(fs, "fine-tune", rows, strlen(rows), 400, &f);
  CHECK_EQ_STR(f.param, "purpose");
  upload(fs, NULL, rows, strlen(rows), 400, &f);
  CHECK_EQ_STR(f.param, "purpose");
  upload(fs, "batch", NULL, 0, 400, &f);
  CHECK_EQ_STR(f.param, "file");
  upload(fs, "batch", "", 0, 400, &f);
  CHECK(strstr(f.message, "empty") != NULL);
  upload(fs, "batch", "{}\0{}\n", 6, 400, &f);
  CHECK_EQ_STR(f.code, "invalid_file_format");
  char big[100];
  memset(big, 'x', sizeof big);
  upload(fs, "batch", big, sizeof big, 413, &f);
  CHECK_EQ_STR(f.code, "file_too_large");
  CHECK(strstr(f.message, "64") != NULL);
  /* content, list, delete */
  char *data = NULL;
  size_t len = 0;
  CHECK_EQ_INT(file_store_read(fs, ida, &data, &len, &f), 200);
  CHECK(data && len == strlen(rows) && !memcmp(data, rows, len));
  free(data);
  CHECK_EQ_INT(file_store_read(fs, "file-none", &data, &len, &f), 404);
  CHECK_EQ_INT(file_store_read(fs, "../../etc/passwd", &data, &len, &f), 404);
  json_t *list = NULL;
  CHECK_EQ_INT(file_store_list(fs, NULL, NULL, 1, false, &list, &f), 200);
  CHECK_EQ_INT(json_array_size(json_object_get(list, "data")), 1);
  CHECK_EQ_STR(json_string_value(json_object_get(list, "first_id")), idb); /* newest first */
  CHECK(json_is_true(json_object_get(list, "has_more")));
  json_decref(list);
  CHECK_EQ_INT(file_store_list(fs, NULL, idb, 10, false, &list, &f), 200);
  CHECK_EQ_INT(json_array_size(json_object_get(list, "data")), 1);
  CHECK_EQ_STR(json_string_value(json_object_get(list, "last_id")), ida);
  CHECK(json_is_false(json_object_get(list, "has_more")));
  json_decref(list);
  CHECK_EQ_INT(file_store_list(fs, "batch_output", NULL, 10, false, &list, &f), 200);
  CHECK_EQ_INT(json_array_size(json_object_get(list, "data")), 0);
  json_decref(list);
  CHECK_EQ_INT(file_store_list(fs, NULL, NULL, 0, false, &list, &f), 400);
  CHECK_EQ_STR(f.param, "limit");
  json_t *del = NULL;
  CHECK_EQ_INT(file_store_delete(fs, idb, &del, &f), 200);
  CHECK(json_is_true(json_object_get(del, "deleted")));
  json_decref(del);
  CHECK_EQ_INT(file_store_delete(fs, idb, &del, &f), 404);
  /* read back after a reopen: a is there, b is not */
  char keep[64];
  snprintf(keep, sizeof keep, "%s", ida);
  json_decref(a);
  json_decref(b);
  file_store_close(fs);
  CHECK_EQ_INT(file_store_open(&fs, dir, 0, &e), 0);
  json_t *o = NULL;
  CHECK_EQ_INT(file_store_get(fs, keep, &o, &f), 200);
  CHECK_EQ_INT(json_integer_value(json_object_get(o, "bytes")), (int64_t)strlen(rows));
  json_decref(o);
  CHECK_EQ_INT(file_store_list(fs, NULL, NULL, 10, true, &list, &f), 200);
  CHECK_EQ_INT(json_array_size(json_object_get(list, "data")), 1);
  json_decref(list);
  file_store_close(fs);
  rmtree(dir);
  free(dir);
}

/* Waits (at most about a minute) for the batch to end; its object. */
static json_t *await_end(batch_store *bs, const char *id) {
  serve_fail f;
  for (int tries = 0; tries < 6000; tries++) {
    json_t *o = NULL;
    if (batch_store_get(bs, id, &o, &f) != 200) return NULL;
    const char *st = json_string_value(json_object_get(o, "status"));
    if (!strcmp(st, "completed") || !strcmp(st, "failed") || !strcmp(st, "expired") || !strcmp(st, "cancelled"))
      return o;
    json_decref(o);
    usleep(10000);
  }
  return NULL;
}

static json_t *file_lines(file_store *fs, const char *id) {
  char *data = NULL;
  size_t len = 0;
  serve_fail f;
  json_t *arr = json_array();
  if (!id || file_store_read(fs, id, &data, &len, &f) != 200) return arr;
  for (char *p = data, *nl; (nl = strchr(p, '\n')); p = nl + 1) json_array_append_new(arr, json_loadb(p, (size_t)(nl - p), 0, NULL));
  free(data);
  return arr;
}

static json_t *line_of(json_t *lines, const char *custom_id) {
  size_t i;
  json_t *l;
  json_array_foreach(lines, i, l) {
    json_t *c = json_object_get(l, "custom_id");
    if (custom_id ? json_is_string(c) && !strcmp(json_string_value(c), custom_id) : json_is_null(c)) return l;
  }
  return NULL;
}

static const char *create(batch_store *bs, const char *body, int want, serve_fail *f, json_t **keep) {
  json_t *o = NULL;
  CHECK_EQ_INT(batch_store_create(bs, body, strlen(body), &o, f), want);
  *keep = o;
  return o ? json_string_value(json_object_get(o, "id")) : "";
}

static void test_batch_store(void) {
  char *dir = tmpdir();
  if (!dir) return;
  serve_engine engine;
  fake_engine_init(&engine);
  serve_config cfg = {.host = "127.0.0.1", .served_names = (const char *[]){"default"}, .n_served_names = 1};
  serve_server *srv = NULL;
  herr e = {0};
  CHECK_EQ_INT(serve_start(&srv, &engine, &cfg, &e), 0);
  if (!srv) return;
  batch_row_target t;
  CHECK_EQ_INT(batch_row_target_set(&t, "127.0.0.1", serve_port(srv), NULL, &e), 0);
  file_store *fs;
  batch_store *bs;
  CHECK_EQ_INT(file_store_open(&fs, dir, 0, &e), 0);
  CHECK_EQ_INT(batch_store_open(&bs, dir, fs, &t, 2, &e), 0);
  serve_fail f;
  const char *rows =
      "{\"custom_id\": \"one\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": {\"model\": \"default\", "
      "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 4}}\n"
      "this is not JSON\n"
      "\n"
      "{\"custom_id\": \"two\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": {\"model\": \"default\", "
      "\"messages\": [{\"role\": \"user\", \"content\": \"yo\"}], \"max_tokens\": 4}}\n"
      "{\"custom_id\": \"one\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": {}}\n"
      "{\"custom_id\": \"three\", \"method\": \"POST\", \"url\": \"/v1/completions\", \"body\": {\"model\": \"default\", "
      "\"prompt\": \"x\"}}\n"
      "{\"custom_id\": \"four\", \"method\": \"POST\", \"url\": \"/v1/chat/completions\", \"body\": {\"model\": \"other\", "
      "\"messages\": [{\"role\": \"user\", \"content\": \"yo\"}]}}\n";
  json_t *in = upload(fs, "batch", rows, strlen(rows), 200, &f);
  const char *in_id = json_string_value(json_object_get(in, "id"));
  char body[512];
  json_t *keep = NULL;
  /* refusals of create */
  create(bs, "{\"input_file_id\": \"file-none\", \"endpoint\": \"/v1/chat/completions\", \"completion_window\": \"24h\"}", 400,
         &f, &keep);
  CHECK_EQ_STR(f.param, "input_file_id");
  CHECK(strstr(f.message, "file-none") != NULL);
  snprintf(body, sizeof body, "{\"input_file_id\": \"%s\", \"endpoint\": \"/v1/chat/completions\", \"completion_window\": \"1h\"}", in_id);
  create(bs, body, 400, &f, &keep);
  CHECK_EQ_STR(f.param, "completion_window");
  snprintf(body, sizeof body, "{\"input_file_id\": \"%s\", \"endpoint\": \"/v1/images\", \"completion_window\": \"24h\"}", in_id);
  create(bs, body, 400, &f, &keep);
  CHECK_EQ_STR(f.param, "endpoint");
  snprintf(body, sizeof body,
           "{\"input_file_id\": \"%s\", \"endpoint\": \"/v1/chat/completions\", \"completion_window\": \"24h\", \"metadata\": {\"k\": 1}}",
           in_id);
  create(bs, body, 400, &f, &keep);
  CHECK_EQ_STR(f.param, "metadata");
  create(bs, "[1]", 400, &f, &keep);
  /* the batch: bad lines become error lines, good rows run */
  snprintf(body, sizeof body,
           "{\"input_file_id\": \"%s\", \"endpoint\": \"/v1/chat/completions\", \"completion_window\": \"24h\", \"metadata\": {\"k\": \"v\"}}",
           in_id);
  const char *bid = create(bs, body, 200, &f, &keep);
  char id[64];
  snprintf(id, sizeof id, "%s", bid);
  json_decref(keep);
  CHECK_EQ_INT(batch_store_start(bs, &e), 0);
  json_t *end = await_end(bs, id);
  CHECK(end != NULL);
  if (!end) goto out;
  CHECK_EQ_STR(json_string_value(json_object_get(end, "status")), "completed");
  json_t *rc = json_object_get(end, "request_counts");
  CHECK_EQ_INT(json_integer_value(json_object_get(rc, "total")), 6);
  CHECK_EQ_INT(json_integer_value(json_object_get(rc, "completed")), 2);
  CHECK_EQ_INT(json_integer_value(json_object_get(rc, "failed")), 4);
  json_t *out = file_lines(fs, json_string_value(json_object_get(end, "output_file_id")));
  json_t *errs = file_lines(fs, json_string_value(json_object_get(end, "error_file_id")));
  CHECK_EQ_INT(json_array_size(out), 2);
  CHECK_EQ_INT(json_array_size(errs), 4);
  CHECK(line_of(out, "one") && line_of(out, "two"));
  /* the rows ran at low priority: one, two, and four (refused by the server before generating) */
  CHECK_EQ_INT(atomic_load(&fake_low_priority), 2);
  json_t *bad = line_of(errs, NULL);
  CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(bad, "error"), "code")), "invalid_json_line");
  CHECK(strstr(json_string_value(json_object_get(json_object_get(bad, "error"), "message")), "line 2") != NULL);
  json_t *dup = line_of(errs, "one");
  CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(dup, "error"), "code")), "duplicate_custom_id");
  json_t *url = line_of(errs, "three");
  CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(url, "error"), "code")), "mismatched_url");
  json_t *other = line_of(errs, "four"); /* answered by the server with 404: the error file, its response kept */
  CHECK(json_is_null(json_object_get(other, "error")));
  CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(other, "response"), "status_code")), 404);
  json_decref(out);
  json_decref(errs);
  /* an ended batch cannot be cancelled */
  json_t *o = NULL;
  CHECK_EQ_INT(batch_store_cancel(bs, id, &o, &f), 409);
  CHECK_EQ_INT(batch_store_cancel(bs, "batch_none", &o, &f), 404);
  CHECK_EQ_INT(batch_store_list(bs, NULL, 101, &o, &f), 400);
  /* read back after a reopen */
  batch_store_close(bs);
  CHECK_EQ_INT(batch_store_open(&bs, dir, fs, &t, 2, &e), 0);
  CHECK_EQ_INT(batch_store_get(bs, id, &o, &f), 200);
  CHECK(json_equal(o, end));
  json_decref(o);
  json_decref(end);
  /* past its window: expired, every row a batch_expired line */
  snprintf(body, sizeof body, "{\"input_file_id\": \"%s\", \"endpoint\": \"/v1/chat/completions\", \"completion_window\": \"24h\"}",
           in_id);
  bid = create(bs, body, 200, &f, &keep);
  snprintf(id, sizeof id, "%s", bid);
  json_decref(keep);
  batch_store_shift_clock(bs, 25 * 3600);
  CHECK_EQ_INT(batch_store_start(bs, &e), 0);
  end = await_end(bs, id);
  CHECK(end != NULL);
  if (!end) goto out;
  CHECK_EQ_STR(json_string_value(json_object_get(end, "status")), "expired");
  CHECK(json_is_integer(json_object_get(end, "expired_at")));
  errs = file_lines(fs, json_string_value(json_object_get(end, "error_file_id")));
  CHECK_EQ_INT(json_array_size(errs), 6);
  int expired = 0; /* the rows one, two and four; the three refused lines as before */
  size_t i;
  json_t *l;
  json_array_foreach(errs, i, l) expired += !strcmp(json_string_value(json_object_get(json_object_get(l, "error"), "code")), "batch_expired");
  CHECK_EQ_INT(expired, 3);
  CHECK(json_is_null(json_object_get(end, "output_file_id")));
  json_decref(errs);
  json_decref(end);
out:
  json_decref(in);
  batch_store_close(bs);
  file_store_close(fs);
  serve_stop(srv);
  rmtree(dir);
  free(dir);
}

/* X-Hearth-Priority: "low" reaches the engine as priority 1; another value is
 * a 400 naming it. A state directory is held by one server at a time. */
static int post_status(int port, const char *extra_headers) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  const char *body = "{\"model\": \"default\", \"prompt\": \"hi\", \"max_tokens\": 2}";
  char req[1024];
  int n = snprintf(req, sizeof req,
                   "POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n%sContent-Length: %zu\r\n\r\n%s",
                   extra_headers, strlen(body), body);
  if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
    close(fd);
    return -1;
  }
  char buf[4096];
  ssize_t got = recv(fd, buf, sizeof buf - 1, MSG_WAITALL);
  close(fd);
  int code = -1;
  if (got > 0) {
    buf[got] = 0;
    sscanf(buf, "HTTP/1.%*d %d", &code);
  }
  return code;
}

static void test_priority_header(void) {
  serve_engine engine;
  fake_engine_init(&engine);
  serve_config cfg = {.host = "127.0.0.1", .served_names = (const char *[]){"default"}, .n_served_names = 1};
  serve_server *srv = NULL;
  herr e = {0};
  CHECK_EQ_INT(serve_start(&srv, &engine, &cfg, &e), 0);
  if (!srv) return;
  /* one server per state directory */
  char *dir = tmpdir();
  serve_server *a = NULL, *b = NULL;
  serve_config sc = cfg;
  sc.state_dir = dir;
  CHECK_EQ_INT(serve_start(&a, &engine, &sc, &e), 0);
  CHECK(serve_start(&b, &engine, &sc, &e) != 0);
  CHECK(strstr(e.msg, "in use by another server") != NULL);
  serve_stop(a);
  CHECK_EQ_INT(serve_start(&b, &engine, &sc, &e), 0); /* free again once the first has stopped */
  serve_stop(b);
  if (dir) rmtree(dir);
  free(dir);
  int before = atomic_load(&fake_low_priority);
  CHECK_EQ_INT(post_status(serve_port(srv), ""), 200);
  CHECK_EQ_INT(atomic_load(&fake_low_priority), before);
  CHECK_EQ_INT(post_status(serve_port(srv), "X-Hearth-Priority: low\r\n"), 200);
  CHECK_EQ_INT(atomic_load(&fake_low_priority), before + 1);
  CHECK_EQ_INT(post_status(serve_port(srv), "X-Hearth-Priority: urgent\r\n"), 400);
  serve_stop(srv);
}

int main(void) {
  RUN(test_multipart);
  RUN(test_file_store);
  RUN(test_batch_store);
  RUN(test_priority_header);
  TEST_MAIN_END();
}
