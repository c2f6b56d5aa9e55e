/* Unit tests for base/: status, buffers, UTF-8, dict, thread pool, files, JSON. */
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/dict.h"
#include "base/file.h"
#include "base/json.h"
#include "base/pool.h"
#include "base/status.h"
#include "base/utf8.h"
#include "base/vec.h"
#include "test.h"

static void test_status(void) {
  herr e = {0};
  CHECK_EQ_INT(herr_set(&e, HEARTH_EFORMAT, "tensor '%s' bad", "x"), HEARTH_EFORMAT);
  CHECK_EQ_STR(e.msg, "tensor 'x' bad");
  herr_wrap(&e, "model.safetensors");
  CHECK_EQ_STR(e.msg, "model.safetensors: tensor 'x' bad");
  CHECK_EQ_INT(e.code, HEARTH_EFORMAT);
  CHECK_EQ_INT(herr_set(NULL, HEARTH_EIO, "ignored"), HEARTH_EIO);
  herr_clear(&e);
  CHECK_EQ_INT(e.code, 0);
}

static void test_buf(void) {
  hbuf b = {0};
  CHECK_EQ_STR(hbuf_str(&b), "");
  for (int i = 0; i < 1000; i++) hbuf_printf(&b, "%d,", i);
  CHECK(b.len > 3000);
  CHECK(strncmp(b.data, "0,1,2,", 6) == 0);
  hbuf_clear(&b);
  hbuf_printf(&b, "%s", "a long string that is longer than the two hundred and fifty six byte stack buffer used for formatting "
                        "a long string that is longer than the two hundred and fifty six byte stack buffer used for formatting "
                        "a long string that is longer than the two hundred and fifty six byte stack buffer used for formatting");
  CHECK_EQ_INT(b.len, 305);
  char *s = hbuf_take(&b);
  CHECK(s && strlen(s) == 305);
  free(s);
  CHECK(b.data == NULL);
  hbuf_free(&b);
}

static void test_grow(void) {
  /* growth: geometric from HGROW_MIN, contents kept, at least want */
  int32_t *v = NULL;
  size_t cap = 0;
  CHECK(hgrow((void **)&v, &cap, 0, sizeof *v));
  CHECK(v == NULL && cap == 0);
  CHECK(hgrow((void **)&v, &cap, 1, sizeof *v));
  CHECK(v != NULL && cap == HGROW_MIN);
  size_t reallocs = 0, last = cap;
  for (int32_t i = 0; i < 100000; i++) {
    if ((size_t)i == cap) CHECK(hgrow((void **)&v, &cap, (size_t)i + 1, sizeof *v));
    if (cap != last) reallocs++, last = cap;
    v[i] = i;
  }
  CHECK(cap >= 100000 && cap < 200000);
  CHECK(reallocs < 20);
  int ok = 1;
  for (int32_t i = 0; i < 100000; i++) ok &= v[i] == i;
  CHECK(ok);
  CHECK(hgrow((void **)&v, &cap, 10, sizeof *v) && cap >= 100000); /* never shrinks */
  size_t before = cap;
  CHECK(hgrow((void **)&v, &cap, before * 5, sizeof *v) && cap >= before * 5);

  /* overflow refused; the array and its capacity untouched */
  int32_t *keep = v;
  before = cap;
  CHECK(!hgrow((void **)&v, &cap, SIZE_MAX / 2, sizeof *v));
  CHECK(!hgrow((void **)&v, &cap, SIZE_MAX, 1 + sizeof *v));
  CHECK(v == keep && cap == before);
  ok = 1;
  for (int32_t i = 0; i < 100000; i++) ok &= v[i] == i;
  CHECK(ok);
  free(v);

  /* the typed form: any element and capacity type; a capacity that cannot
   * hold the new size is refused and left as it was */
  struct { double x, y; } *pts = NULL;
  int n = 0, icap = 0;
  for (int i = 0; i < 1000; i++) {
    if (n == icap) CHECK(HGROW(pts, icap, n + 1));
    pts[n].x = i, pts[n++].y = -i;
  }
  CHECK(icap >= 1000 && pts[999].y == -999);
  free(pts);
  unsigned char *bytes = NULL;
  uint8_t bcap = 0;
  CHECK(!HGROW(bytes, bcap, 200)); /* 256 does not fit a uint8_t */
  CHECK(bcap == 0 && bytes != NULL); /* grown, still valid, capacity unchanged */
  CHECK(HGROW(bytes, bcap, 100) && bcap == 128);
  bytes[127] = 1;
  free(bytes);
}

static void test_utf8(void) {
  uint32_t cp;
  CHECK_EQ_INT(utf8_decode("\xe2\x82\xac", 3, &cp), 3);
  CHECK_EQ_INT(cp, 0x20AC);
  CHECK_EQ_INT(utf8_decode("\xc0\x80", 2, &cp), 0);          /* overlong */
  CHECK_EQ_INT(utf8_decode("\xed\xa0\x80", 3, &cp), 0);      /* surrogate */
  CHECK_EQ_INT(utf8_decode("\xf4\x90\x80\x80", 4, &cp), 0);  /* > U+10FFFF */
  CHECK_EQ_INT(utf8_decode("\xe2\x82", 2, &cp), 0);          /* truncated */
  char out[4];
  CHECK_EQ_INT(utf8_encode(0x1F600, out), 4);
  CHECK(memcmp(out, "\xf0\x9f\x98\x80", 4) == 0);
  CHECK(utf8_valid("h\xc3\xa9llo", 6));
  CHECK(!utf8_valid("\xff", 1));
  CHECK_EQ_INT(utf8_complete_prefix("ab\xf0\x9f\x98", 5), 2);
  CHECK_EQ_INT(utf8_complete_prefix("ab\xf0\x9f\x98\x80", 6), 6);
  CHECK_EQ_INT(utf8_complete_prefix("ab\xc3", 3), 2);
  CHECK_EQ_INT(utf8_complete_prefix("abc", 3), 3);
}

static void test_dict(void) {
  hdict d;
  hdict_init(&d);
  char key[32];
  for (int i = 0; i < 10000; i++) {
    snprintf(key, sizeof key, "k%d", i);
    CHECK(hdict_put(&d, key, strlen(key), i * 3));
  }
  CHECK_EQ_INT(d.count, 10000);
  int64_t v = -1;
  CHECK(hdict_gets(&d, "k1234", &v));
  CHECK_EQ_INT(v, 3702);
  CHECK(!hdict_gets(&d, "nope", &v));
  CHECK(hdict_put(&d, "k1234", 5, 7));
  CHECK(hdict_gets(&d, "k1234", &v) && v == 7);
  CHECK_EQ_INT(d.count, 10000);
  /* keys with embedded NULs are distinct */
  CHECK(hdict_put(&d, "a\0b", 3, 1));
  CHECK(hdict_put(&d, "a\0c", 3, 2));
  CHECK(hdict_get(&d, "a\0c", 3, &v) && v == 2);
  hdict_free(&d);
}

static atomic_int pool_sum;
static void add_item(void *ctx, int i, int tid) {
  int *hits = ctx;
  hits[i]++;
  atomic_fetch_add(&pool_sum, i);
  (void)tid;
}

static void test_pool(void) {
  hpool *p = hpool_create(4);
  CHECK(p != NULL);
  CHECK_EQ_INT(hpool_size(p), 4);
  for (int round = 0; round < 50; round++) {
    int hits[1000] = {0};
    atomic_store(&pool_sum, 0);
    hpool_for(p, 1000, add_item, hits);
    int ok = 1;
    for (int i = 0; i < 1000; i++) ok &= hits[i] == 1;
    CHECK(ok);
    CHECK_EQ_INT(atomic_load(&pool_sum), 499500);
  }
  hpool_destroy(p);
}

/* Every thread computes with denormals flushed (a denormal input reads as 0
 * and a denormal result becomes 0), and the caller's mode is back after. */
static atomic_int flushed_items, denormal_results;
static volatile float tiny = 1e-38f; /* normal; tiny * 0.01 is denormal */
static void check_flush(void *ctx, int i, int tid) {
  (void)ctx, (void)i, (void)tid;
  if (hpool_flushing()) atomic_fetch_add(&flushed_items, 1);
  float r = tiny * 0.01f;
  if (r != 0.0f) atomic_fetch_add(&denormal_results, 1);
}

static void test_pool_flushes_denormals(void) {
#if defined(__x86_64__) || defined(__aarch64__)
  int before = hpool_flushing();
  CHECK(tiny * 0.01f != 0.0f); /* not flushed outside the pool (the C default) */
  for (int n = 1; n <= 4; n *= 2) {
    hpool *p = hpool_create(n);
    atomic_store(&flushed_items, 0);
    atomic_store(&denormal_results, 0);
    hpool_for(p, 400, check_flush, NULL);
    CHECK_EQ_INT(atomic_load(&flushed_items), 400);
    CHECK_EQ_INT(atomic_load(&denormal_results), 0);
    CHECK_EQ_INT(hpool_flushing(), before);
    hpool_destroy(p);
  }
#endif
}

static void test_file_json(void) {
  char path[] = "/tmp/hearth_test_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  const char *text = "{\"a\": 3, \"b\": \"x\", \"c\": 1.5, \"d\": true}";
  CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
  close(fd);
  herr e = {0};
  hmmap m;
  CHECK_EQ_INT(hmmap_open(&m, path, &e), 0);
  CHECK_EQ_INT(m.size, strlen(text));
  hmmap_close(&m);
  json_t *j = hjson_load_file(path, &e);
  CHECK(j != NULL);
  int64_t a = 0;
  double c = 0;
  const char *b = NULL;
  bool d = false;
  CHECK_EQ_INT(hjson_get_int(j, "a", true, &a, "t.json", &e), 0);
  CHECK_EQ_INT(a, 3);
  CHECK_EQ_INT(hjson_get_num(j, "c", true, &c, "t.json", &e), 0);
  CHECK_EQ_INT(hjson_get_str(j, "b", true, &b, "t.json", &e), 0);
  CHECK_EQ_INT(hjson_get_bool(j, "d", true, &d, "t.json", &e), 0);
  CHECK(d && c == 1.5 && strcmp(b, "x") == 0);
  CHECK_EQ_INT(hjson_get_int(j, "b", true, &a, "t.json", &e), HEARTH_EFORMAT);
  CHECK_EQ_STR(e.msg, "t.json: field 'b' must be an integer");
  CHECK_EQ_INT(hjson_get_int(j, "zz", true, &a, "t.json", &e), HEARTH_EFORMAT);
  CHECK_EQ_INT(hjson_get_int(j, "zz", false, &a, "t.json", &e), 0);
  json_decref(j);
  /* whole reals are integers; out-of-range reals are refused without being converted (UB) */
  static const char *reals = "{\"w\": 4096.0, \"big\": 1e28, \"neg\": -1e19, \"edge\": 9223372036854775808.0, \"frac\": 2.5}";
  j = hjson_load_buf(reals, strlen(reals), "r.json", &e);
  CHECK(j != NULL);
  CHECK_EQ_INT(hjson_get_int(j, "w", true, &a, "r.json", &e), 0);
  CHECK_EQ_INT(a, 4096);
  CHECK_EQ_INT(hjson_get_int(j, "big", true, &a, "r.json", &e), HEARTH_EFORMAT);
  CHECK_EQ_INT(hjson_get_int(j, "neg", true, &a, "r.json", &e), HEARTH_EFORMAT);
  CHECK_EQ_INT(hjson_get_int(j, "edge", true, &a, "r.json", &e), HEARTH_EFORMAT);
  CHECK_EQ_INT(hjson_get_int(j, "frac", true, &a, "r.json", &e), HEARTH_EFORMAT);
  json_decref(j);
  CHECK(hjson_load_buf("{\"a\":", 5, "bad.json", &e) == NULL);
  CHECK(strstr(e.msg, "bad.json: invalid JSON") == e.msg);
  /* a copy holds the same bytes; a missing source or an uncreatable copy is named */
  char copy[sizeof path + 8];
  snprintf(copy, sizeof copy, "%s.copy", path);
  CHECK_EQ_INT(hfile_copy(path, copy, &e), 0);
  char *got = NULL;
  size_t got_len = 0;
  CHECK_EQ_INT(hfile_read(copy, &got, &got_len, &e), 0);
  CHECK(got && got_len == strlen(text) && memcmp(got, text, got_len) == 0);
  free(got);
  unlink(copy);
  CHECK(hfile_copy("/nonexistent/from", copy, &e) != 0);
  CHECK(strstr(e.msg, "/nonexistent/from") != NULL);
  CHECK_EQ_INT(hfile_copy(path, "/nonexistent/dir/to", &e), HEARTH_EIO);
  CHECK(strstr(e.msg, "/nonexistent/dir/to") != NULL);
  unlink(path);
  CHECK_EQ_INT(hmmap_open(&m, "/nonexistent/file", &e), HEARTH_ENOTFOUND);
  CHECK(strstr(e.msg, "/nonexistent/file") != NULL);
  char *dir = hpath_dir("/a/b/c.json");
  CHECK_EQ_STR(dir, "/a/b");
  free(dir);
  char *jp = hpath_join("/a/", "b");
  CHECK_EQ_STR(jp, "/a/b");
  free(jp);
}

int main(void) {
  RUN(test_status);
  RUN(test_buf);
  RUN(test_grow);
  RUN(test_utf8);
  RUN(test_dict);
  RUN(test_pool);
  RUN(test_pool_flushes_denormals);
  RUN(test_file_json);
  TEST_MAIN_END();
}
