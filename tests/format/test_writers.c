/* test_writers.c — the GGUF and safetensors writers, read back by hearth's
 * readers (which check every offset, size and type): metadata of each type,
 * tensors given as data or through the fill callback, alignment, copying
 * keys from one file into another, and the errors for bad descriptors. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "format/safetensors.h"
#include "format/safetensors_write.h"
#include "test.h"

static char tmpdir[256];

static void make_tmpdir(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/hearth_writers_XXXXXX");
  if (!mkdtemp(tmpdir)) tmpdir[0] = 0;
}

static int fill_ramp(void *ctx, int i, void *dst, herr *err) {
  (void)err;
  const gguf_writer *w = ctx;
  size_t n = gguf_writer_tensor_bytes(w, i);
  unsigned char *p = dst;
  for (size_t k = 0; k < n; k++) p[k] = (unsigned char)(k * 7 + (size_t)i);
  return 0;
}

static int fill_fail(void *ctx, int i, void *dst, herr *err) {
  (void)ctx, (void)dst;
  return herr_set(err, HEARTH_EIO, "fill %d failed on purpose", i);
}

static void test_gguf_roundtrip(void) {
  char path[300];
  snprintf(path, sizeof path, "%s/a.gguf", tmpdir);
  gguf_writer *w = gguf_writer_new();
  CHECK(w != NULL);
  if (!w) return;
  gguf_writer_str(w, "general.architecture", "llama");
  gguf_writer_u32(w, "llama.block_count", 3);
  gguf_writer_i32(w, "x.i32", -5);
  gguf_writer_u64(w, "x.u64", 1ull << 40);
  gguf_writer_f32(w, "x.f32", 1.5f);
  gguf_writer_bool(w, "x.bool", true);
  gguf_writer_u32(w, "llama.block_count", 4); /* replaced in place */
  const char *strs[] = {"a", "", "héllo"};
  gguf_writer_arr_str(w, "x.strs", strs, NULL, 3);
  int32_t ints[4] = {1, -2, 3, -4};
  gguf_writer_arr(w, "x.ints", GGUF_TYPE_INT32, ints, 4);
  float vec[5] = {1, 2, 3, 4, 5};
  int64_t d1[1] = {5}, d2[2] = {64, 3}, d3[2] = {32, 2};
  CHECK_EQ_INT(gguf_writer_tensor(w, "vec", GGUF_TENSOR_F32, 1, d1, vec), 0);
  CHECK_EQ_INT(gguf_writer_tensor(w, "mat", GGUF_TENSOR_Q8_0, 2, d2, NULL), 1);
  CHECK_EQ_INT(gguf_writer_tensor(w, "half", GGUF_TENSOR_F16, 2, d3, NULL), 2);
  CHECK_EQ_INT(gguf_writer_tensor_bytes(w, 1), 3 * 2 * 34);
  herr err = {0};
  CHECK_MSG(gguf_writer_write(w, path, fill_ramp, w, &err) == 0, "%s", err.msg);
  gguf_writer_free(w);

  gguf_file *g = NULL;
  CHECK_MSG(gguf_open(&g, path, &err) == 0, "%s", err.msg);
  if (!g) return;
  char *s = NULL;
  CHECK(gguf_get_strdup(g, "general.architecture", &s, &err) == 0);
  CHECK_EQ_STR(s, "llama");
  free(s);
  uint32_t u = 0;
  CHECK(gguf_get_u32(g, "llama.block_count", &u, &err) == 0);
  CHECK_EQ_INT(u, 4);
  CHECK_EQ_STR(gguf_kv_at(g, 1)->key, "llama.block_count");
  int32_t i32 = 0;
  CHECK(gguf_get_i32(g, "x.i32", &i32, &err) == 0);
  CHECK_EQ_INT(i32, -5);
  uint64_t u64 = 0;
  CHECK(gguf_get_u64(g, "x.u64", &u64, &err) == 0);
  CHECK(u64 == 1ull << 40);
  float f = 0;
  CHECK(gguf_get_f32(g, "x.f32", &f, &err) == 0);
  CHECK(f == 1.5f);
  bool b = false;
  CHECK(gguf_get_bool(g, "x.bool", &b, &err) == 0);
  CHECK(b);
  gguf_arr a;
  CHECK(gguf_get_arr(g, "x.strs", &a, &err) == 0);
  CHECK_EQ_INT(a.n, 3);
  size_t len = 0;
  const char *e = gguf_arr_str(&a, 2, &len);
  CHECK(len == strlen("héllo") && e && !memcmp(e, "héllo", len));
  CHECK(gguf_arr_str(&a, 1, &len) != NULL && len == 0);
  CHECK(gguf_get_arr(g, "x.ints", &a, &err) == 0);
  CHECK_EQ_INT(gguf_arr_int(&a, 3), -4);
  CHECK_EQ_INT(gguf_alignment(g), 32);
  CHECK_EQ_INT(gguf_tensor_count(g), 3);
  const gguf_tensor *t = gguf_find_tensor(g, "vec");
  CHECK(t && t->type == GGUF_TENSOR_F32 && t->ndim == 1 && t->dims[0] == 5 && !memcmp(t->data, vec, sizeof vec));
  t = gguf_find_tensor(g, "mat");
  CHECK(t && t->type == GGUF_TENSOR_Q8_0 && t->ndim == 2 && t->dims[0] == 64 && t->dims[1] == 3 && t->nbytes == 204);
  if (t) {
    const unsigned char *p = t->data;
    bool ok = true;
    for (size_t k = 0; k < t->nbytes; k++) ok = ok && p[k] == (unsigned char)(k * 7 + 1);
    CHECK(ok);
    CHECK(((uintptr_t)t->data - (uintptr_t)gguf_find_tensor(g, "vec")->data) % 32 == 0);
  }
  t = gguf_find_tensor(g, "half");
  CHECK(t && t->offset % 32 == 0 && t->nbytes == 128);

  /* every key copied into a second file reads back the same */
  char path2[300];
  snprintf(path2, sizeof path2, "%s/b.gguf", tmpdir);
  gguf_writer *w2 = gguf_writer_new();
  for (size_t i = 0; i < gguf_kv_count(g); i++) gguf_writer_copy_kv(w2, gguf_kv_at(g, i));
  CHECK_MSG(gguf_writer_write(w2, path2, NULL, NULL, &err) == 0, "%s", err.msg);
  gguf_writer_free(w2);
  gguf_file *g2 = NULL;
  CHECK_MSG(gguf_open(&g2, path2, &err) == 0, "%s", err.msg);
  if (g2) {
    CHECK_EQ_INT(gguf_kv_count(g2), gguf_kv_count(g));
    CHECK(gguf_get_arr(g2, "x.strs", &a, &err) == 0);
    e = gguf_arr_str(&a, 2, &len);
    CHECK(e && len == strlen("héllo") && !memcmp(e, "héllo", len));
    CHECK(gguf_get_arr(g2, "x.ints", &a, &err) == 0 && gguf_arr_int(&a, 1) == -2);
    CHECK(gguf_get_f32(g2, "x.f32", &f, &err) == 0 && f == 1.5f);
    gguf_close(g2);
  }
  gguf_close(g);
  unlink(path);
  unlink(path2);
}

static void test_gguf_errors(void) {
  char path[300];
  snprintf(path, sizeof path, "%s/bad.gguf", tmpdir);
  herr err = {0};
  int64_t d[2] = {33, 2};
  gguf_writer *w = gguf_writer_new();
  CHECK_EQ_INT(gguf_writer_tensor(w, "odd", GGUF_TENSOR_Q8_0, 2, d, NULL), -1);
  CHECK(gguf_writer_write(w, path, fill_ramp, w, &err) == HEARTH_EINVAL);
  CHECK_MSG(strstr(err.msg, "'odd'") && strstr(err.msg, "q8_0"), "%s", err.msg);
  CHECK(!hfile_exists(path));
  gguf_writer_free(w);

  w = gguf_writer_new();
  d[0] = 32;
  CHECK_EQ_INT(gguf_writer_tensor(w, "t", GGUF_TENSOR_F32, 2, d, NULL), 0);
  CHECK_EQ_INT(gguf_writer_tensor(w, "t", GGUF_TENSOR_F32, 2, d, NULL), -1);
  CHECK(gguf_writer_write(w, path, fill_ramp, w, &err) == HEARTH_EINVAL);
  CHECK_MSG(strstr(err.msg, "added twice"), "%s", err.msg);
  gguf_writer_free(w);

  w = gguf_writer_new();
  CHECK_EQ_INT(gguf_writer_tensor(w, "t", GGUF_TENSOR_F32, 2, d, NULL), 0);
  CHECK(gguf_writer_write(w, path, NULL, NULL, &err) == HEARTH_EINVAL); /* no data, no callback */
  CHECK(gguf_writer_write(w, path, fill_fail, NULL, &err) == HEARTH_EIO);
  CHECK_MSG(strstr(err.msg, "on purpose"), "%s", err.msg);
  CHECK(!hfile_exists(path));
  char tmp[310];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  CHECK(!hfile_exists(tmp));
  CHECK(gguf_writer_write(w, "/nonexistent-dir/x.gguf", fill_ramp, w, &err) == HEARTH_EIO);
  CHECK_MSG(strstr(err.msg, "/nonexistent-dir/x.gguf"), "%s", err.msg);
  int64_t bad[1] = {0};
  CHECK_EQ_INT(gguf_writer_tensor(w, "zero", GGUF_TENSOR_F32, 1, bad, NULL), -1);
  CHECK_EQ_INT(gguf_writer_tensor(w, "unk", (gguf_tensor_type)99, 1, d, NULL), -1);
  gguf_writer_free(w);
}

static int fill_st(void *ctx, int i, void *dst, herr *err) {
  (void)err;
  const st_writer *w = ctx;
  size_t n = st_writer_tensor_bytes(w, i);
  unsigned char *p = dst;
  for (size_t k = 0; k < n; k++) p[k] = (unsigned char)(k * 13 + 3 * (size_t)i);
  return 0;
}

static void test_safetensors_roundtrip(void) {
  char path[300];
  snprintf(path, sizeof path, "%s/m.safetensors", tmpdir);
  st_writer *w = st_writer_new();
  float v[3] = {1.25f, -2, 3};
  int64_t s1[1] = {3}, s2[2] = {4, 5}, s3[2] = {2, 7}, s0[1] = {0};
  CHECK_EQ_INT(st_writer_tensor(w, "z.vec", ST_F32, 1, s1, v), 0);
  CHECK_EQ_INT(st_writer_tensor(w, "a.packed", ST_U32, 2, s2, NULL), 1);
  CHECK_EQ_INT(st_writer_tensor(w, "m.half", ST_BF16, 2, s3, NULL), 2);
  CHECK_EQ_INT(st_writer_tensor(w, "empty", ST_F16, 1, s0, NULL), 3);
  st_writer_meta(w, "format", "mlx");
  herr err = {0};
  CHECK_MSG(st_writer_write(w, path, fill_st, w, &err) == 0, "%s", err.msg);
  st_writer_free(w);

  st_set s;
  CHECK_MSG(st_open(&s, path, &err) == 0, "%s", err.msg);
  hmmap m = {0};
  CHECK(hmmap_open(&m, path, &err) == 0);
  if (m.data) {
    uint64_t hl;
    memcpy(&hl, m.data, 8);
    CHECK_EQ_INT(hl % 8, 0);
    CHECK(m.data[8] == '{');
    hmmap_close(&m);
  }
  const st_tensor *t = st_find(&s, "z.vec");
  CHECK(t && t->dtype == ST_F32 && t->ndim == 1 && t->shape[0] == 3 && !memcmp(t->data, v, sizeof v));
  t = st_find(&s, "a.packed");
  CHECK(t && t->dtype == ST_U32 && t->ndim == 2 && t->shape[0] == 4 && t->shape[1] == 5 && t->nbytes == 80);
  if (t) {
    bool ok = true;
    for (size_t k = 0; k < t->nbytes; k++) ok = ok && ((const unsigned char *)t->data)[k] == (unsigned char)(k * 13 + 3);
    CHECK(ok);
  }
  t = st_find(&s, "m.half");
  CHECK(t && t->dtype == ST_BF16 && t->nbytes == 28);
  t = st_find(&s, "empty");
  CHECK(t && t->numel == 0);
  CHECK(s.metadata && !strcmp(json_string_value(json_object_get(s.metadata, "format")), "mlx"));
  st_close(&s);
  unlink(path);
}

static void test_safetensors_errors(void) {
  char path[300];
  snprintf(path, sizeof path, "%s/bad.safetensors", tmpdir);
  herr err = {0};
  int64_t sh[1] = {2}, neg[1] = {-1};
  st_writer *w = st_writer_new();
  CHECK_EQ_INT(st_writer_tensor(w, "a", ST_F32, 1, sh, NULL), 0);
  CHECK_EQ_INT(st_writer_tensor(w, "a", ST_F32, 1, sh, NULL), -1);
  CHECK(st_writer_write(w, path, fill_st, w, &err) == HEARTH_EINVAL);
  CHECK_MSG(strstr(err.msg, "'a'") && strstr(err.msg, "twice"), "%s", err.msg);
  CHECK(!hfile_exists(path));
  st_writer_free(w);
  w = st_writer_new();
  CHECK_EQ_INT(st_writer_tensor(w, "n", ST_F32, 1, neg, NULL), -1);
  CHECK_EQ_INT(st_writer_tensor(w, "__metadata__", ST_F32, 1, sh, NULL), -1);
  CHECK(st_writer_write(w, path, fill_st, w, &err) == HEARTH_EINVAL);
  st_writer_free(w);
  w = st_writer_new();
  CHECK_EQ_INT(st_writer_tensor(w, "a", ST_F32, 1, sh, NULL), 0);
  CHECK(st_writer_write(w, path, NULL, NULL, &err) == HEARTH_EINVAL);
  CHECK(st_writer_write(w, path, fill_fail, NULL, &err) == HEARTH_EIO);
  CHECK(!hfile_exists(path));
  st_writer_free(w);
}

int main(void) {
  make_tmpdir();
  CHECK(tmpdir[0] != 0);
  if (!tmpdir[0]) TEST_MAIN_END();
  RUN(test_gguf_roundtrip);
  RUN(test_gguf_errors);
  RUN(test_safetensors_roundtrip);
  RUN(test_safetensors_errors);
  rmdir(tmpdir);
  TEST_MAIN_END();
}
