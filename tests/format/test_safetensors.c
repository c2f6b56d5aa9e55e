/* Unit tests for format/safetensors: good single files and sharded folders
 * written here into a temp dir, one test per kind of bad file (each checks
 * the code and that the message names the file and tensor), and the float
 * element conversions against IEEE values worked out by hand. */
#include <stdarg.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "format/safetensors.h"
#include "test.h"

static char tmpdir[] = "/tmp/hearth_st_XXXXXX";

static char *tmp_path(const char *name) {
  static char buf[8][512];
  static int next;
  char *p = buf[next++ % 8];
  snprintf(p, 512, "%s/%s", tmpdir, name);
  return p;
}

static void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(1);
  }
  if (n) fwrite(data, 1, n, f);
  fclose(f);
}

/* A safetensors file: 8-byte length (hlen_override when nonzero), header, data. */
static void write_st_len(const char *path, const char *header, const void *data, size_t dlen, uint64_t hlen_override) {
  size_t hl = strlen(header);
  uint64_t hlen = hlen_override ? hlen_override : hl;
  unsigned char *buf = malloc(8 + hl + dlen + 1);
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hlen >> (8 * i));
  memcpy(buf + 8, header, hl);
  if (dlen) memcpy(buf + 8 + hl, data, dlen);
  write_bytes(path, buf, 8 + hl + dlen);
  free(buf);
}

static void write_st(const char *path, const char *header, const void *data, size_t dlen) {
  write_st_len(path, header, data, dlen, 0);
}

/* Opens path expecting failure with `code`; the message must contain each of the NULL-terminated needles. */
static void expect_fail(const char *path, int code, ...) {
  st_set s;
  herr e = {0};
  int rc = st_open(&s, path, &e);
  CHECK_MSG(rc == code, "%s: rc %d (want %d): %s", path, rc, code, e.msg);
  CHECK(s.tensors == NULL && s.count == 0 && s.nshards == 0);
  va_list ap;
  va_start(ap, code);
  for (const char *needle; (needle = va_arg(ap, const char *));)
    CHECK_MSG(strstr(e.msg, needle) != NULL, "message \"%s\" lacks \"%s\"", e.msg, needle);
  va_end(ap);
  CHECK(strchr(e.msg, '\n') == NULL);
  if (getenv("HEARTH_TEST_VERBOSE")) fprintf(stderr, "  message: %s\n", e.msg);
  st_close(&s);
}

static void test_good_single(void) {
  /* data: a F32 [2,3] at 0..24, BF16 [2] at 24..28, F16 [2] at 28..32, I64 scalar at 32..40, U8 [0] empty */
  unsigned char data[40];
  float f[6] = {1, -2, 0.5f, 3.25f, -0.125f, 1e-3f};
  memcpy(data, f, 24);
  uint16_t bf[2] = {0x3F80, 0xC040};  /* 1.0, -3.0 */
  memcpy(data + 24, bf, 4);
  uint16_t hf[2] = {0x3C00, 0x3555};  /* 1.0, 0.333251953125 */
  memcpy(data + 28, hf, 4);
  int64_t i64 = -1234567890123LL;
  memcpy(data + 32, &i64, 8);
  const char *hdr =
      "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"x\"},"
      "\"w.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
      "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[24,28]},"
      "\"h\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[28,32]},"
      "\"step\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[32,40]},"
      "\"empty\":{\"dtype\":\"U8\",\"shape\":[0, 4],\"data_offsets\":[40,40]}}   ";
  write_st(tmp_path("good.safetensors"), hdr, data, sizeof data);

  st_set s;
  herr e = {0};
  int rc = st_open(&s, tmp_path("good.safetensors"), &e);
  CHECK_MSG(rc == 0, "%s", e.msg);
  if (rc) return;
  CHECK_EQ_INT(s.count, 5);
  CHECK_EQ_INT(s.nshards, 1);
  /* sorted by name */
  CHECK_EQ_STR(s.tensors[0].name, "b");
  CHECK_EQ_STR(s.tensors[1].name, "empty");
  CHECK_EQ_STR(s.tensors[4].name, "w.weight");
  const st_tensor *w = st_find(&s, "w.weight");
  CHECK(w != NULL);
  if (w) {
    CHECK_EQ_INT(w->dtype, ST_F32);
    CHECK_EQ_INT(w->ndim, 2);
    CHECK_EQ_INT(w->shape[0], 2);
    CHECK_EQ_INT(w->shape[1], 3);
    CHECK_EQ_INT(w->numel, 6);
    CHECK_EQ_INT(w->nbytes, 24);
    CHECK_EQ_INT(w->shard, 0);
    float out[6];
    CHECK_EQ_INT(st_to_f32(w, out, &e), 0);
    for (int i = 0; i < 6; i++) CHECK_NEAR(out[i], f[i], 0);
  }
  const st_tensor *b = st_find(&s, "b");
  if (b) {
    float out[2];
    CHECK_EQ_INT(st_to_f32(b, out, &e), 0);
    CHECK_NEAR(out[0], 1.0, 0);
    CHECK_NEAR(out[1], -3.0, 0);
  }
  const st_tensor *h = st_find(&s, "h");
  if (h) {
    float out[2];
    CHECK_EQ_INT(st_to_f32(h, out, &e), 0);
    CHECK_NEAR(out[0], 1.0, 0);
    CHECK_NEAR(out[1], 0.333251953125, 0);
  }
  const st_tensor *st = st_find(&s, "step");
  CHECK(st && st->ndim == 0 && st->numel == 1 && st->nbytes == 8);
  if (st) {
    int64_t v;
    memcpy(&v, st->data, 8);
    CHECK_EQ_INT(v, -1234567890123LL);
    float dummy;
    herr e2 = {0};
    CHECK_EQ_INT(st_to_f32(st, &dummy, &e2), HEARTH_EUNSUPPORTED);
    CHECK(strstr(e2.msg, "step") && strstr(e2.msg, "I64"));
  }
  const st_tensor *em = st_find(&s, "empty");
  CHECK(em && em->numel == 0 && em->nbytes == 0);
  CHECK(st_find(&s, "missing") == NULL);
  CHECK(json_is_object(s.metadata));
  CHECK_EQ_STR(json_string_value(json_object_get(s.metadata, "format")), "pt");
  st_close(&s);
  st_close(&s); /* twice is harmless */
}

static void test_all_dtypes(void) {
  static const char *names[] = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL",
                                "F8_E4M3", "F8_E5M2", "U16", "U32", "U64"};
  static const size_t sizes[] = {8, 4, 2, 2, 8, 4, 2, 1, 1, 1, 1, 1, 2, 4, 8};
  char hdr[4096];
  size_t used = (size_t)snprintf(hdr, sizeof hdr, "{");
  size_t off = 0;
  for (int i = 0; i < 15; i++) {
    used += (size_t)snprintf(hdr + used, sizeof hdr - used, "%s\"t%02d\":{\"dtype\":\"%s\",\"shape\":[3],\"data_offsets\":[%zu,%zu]}",
                             i ? "," : "", i, names[i], off, off + 3 * sizes[i]);
    off += 3 * sizes[i];
  }
  snprintf(hdr + used, sizeof hdr - used, "}");
  unsigned char *data = calloc(1, off);
  write_st(tmp_path("dtypes.safetensors"), hdr, data, off);
  free(data);
  st_set s;
  herr e = {0};
  int rc = st_open(&s, tmp_path("dtypes.safetensors"), &e);
  CHECK_MSG(rc == 0, "%s", e.msg);
  if (rc) return;
  CHECK_EQ_INT(s.count, 15);
  for (int i = 0; i < 15 && i < (int)s.count; i++) {
    CHECK_EQ_STR(st_dtype_name(s.tensors[i].dtype), names[i]);
    CHECK_EQ_INT(st_dtype_size(s.tensors[i].dtype), sizes[i]);
    CHECK_EQ_INT(s.tensors[i].nbytes, 3 * sizes[i]);
    st_dtype dt;
    CHECK(st_dtype_from_name(names[i], &dt) && dt == s.tensors[i].dtype);
  }
  st_close(&s);
}

static void test_conversions(void) {
  /* F16: 1, -2, smallest subnormal 2^-24, largest normal 65504, inf, nan, -0 */
  CHECK_NEAR(st_f16_to_f32(0x3C00), 1.0, 0);
  CHECK_NEAR(st_f16_to_f32(0xC000), -2.0, 0);
  CHECK_NEAR(st_f16_to_f32(0x0001), ldexp(1.0, -24), 0);
  CHECK_NEAR(st_f16_to_f32(0x03FF), 1023.0 * ldexp(1.0, -24), 0);
  CHECK_NEAR(st_f16_to_f32(0x7BFF), 65504.0, 0);
  CHECK(isinf(st_f16_to_f32(0x7C00)) && st_f16_to_f32(0x7C00) > 0);
  CHECK(isinf(st_f16_to_f32(0xFC00)) && st_f16_to_f32(0xFC00) < 0);
  CHECK(isnan(st_f16_to_f32(0x7E00)));
  CHECK(signbit(st_f16_to_f32(0x8000)) && st_f16_to_f32(0x8000) == 0);
  /* BF16: the top half of an f32 */
  CHECK_NEAR(st_bf16_to_f32(0x3F80), 1.0, 0);
  CHECK_NEAR(st_bf16_to_f32(0x4049), 3.140625, 0);
  CHECK(isnan(st_bf16_to_f32(0x7FC0)));
  /* F8 E4M3 (fn): bias 7, max 448, no inf, 0x7F NaN, subnormal 2^-9 */
  CHECK_NEAR(st_f8e4m3_to_f32(0x38), 1.0, 0);
  CHECK_NEAR(st_f8e4m3_to_f32(0xC0), -2.0, 0);
  CHECK_NEAR(st_f8e4m3_to_f32(0x7E), 448.0, 0);
  CHECK_NEAR(st_f8e4m3_to_f32(0x01), ldexp(1.0, -9), 0);
  CHECK_NEAR(st_f8e4m3_to_f32(0x08), ldexp(1.0, -6), 0);
  CHECK(isnan(st_f8e4m3_to_f32(0x7F)) && isnan(st_f8e4m3_to_f32(0xFF)));
  /* F8 E5M2: bias 15, max 57344, inf 0x7C */
  CHECK_NEAR(st_f8e5m2_to_f32(0x3C), 1.0, 0);
  CHECK_NEAR(st_f8e5m2_to_f32(0x7B), 57344.0, 0);
  CHECK_NEAR(st_f8e5m2_to_f32(0x01), ldexp(1.0, -16), 0);
  CHECK(isinf(st_f8e5m2_to_f32(0x7C)));
  /* F64 and f8 through st_to_f32 */
  double d[3] = {1.5, -1e10, 3.0};
  st_tensor t = {.name = "d", .dtype = ST_F64, .ndim = 1, .shape = {3}, .numel = 3, .data = d, .nbytes = 24};
  float out[3];
  herr e = {0};
  CHECK_EQ_INT(st_to_f32(&t, out, &e), 0);
  CHECK_NEAR(out[0], 1.5, 0);
  CHECK_NEAR(out[1], (float)-1e10, 0);
  unsigned char f8[3] = {0x38, 0x40, 0xB8};
  t.dtype = ST_F8_E4M3;
  t.data = f8;
  CHECK_EQ_INT(st_to_f32(&t, out, &e), 0);
  CHECK_NEAR(out[0], 1.0, 0);
  CHECK_NEAR(out[1], 2.0, 0);
  CHECK_NEAR(out[2], -1.0, 0);
}

/* A file whose header starts at an odd offset still reads (data unaligned). */
static void test_unaligned(void) {
  float v[2] = {7.5f, -8.25f};
  write_st(tmp_path("odd.safetensors"), "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} ", v, 8);
  st_set s;
  herr e = {0};
  CHECK_EQ_INT(st_open(&s, tmp_path("odd.safetensors"), &e), 0);
  const st_tensor *t = st_find(&s, "x");
  if (t) {
    float out[2];
    CHECK_EQ_INT(st_to_f32(t, out, &e), 0);
    CHECK_NEAR(out[0], 7.5, 0);
    CHECK_NEAR(out[1], -8.25, 0);
  }
  st_close(&s);
}

static const char *one_tensor = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";

static void test_truncated_file(void) {
  write_bytes(tmp_path("tiny.safetensors"), "\x10\x00\x00", 3);
  expect_fail(tmp_path("tiny.safetensors"), HEARTH_EFORMAT, "tiny.safetensors", "too short", NULL);
  write_bytes(tmp_path("zero.safetensors"), "", 0);
  expect_fail(tmp_path("zero.safetensors"), HEARTH_EFORMAT, "zero.safetensors", NULL);
  /* data section cut short: the tensor ends past the end of the file */
  float v[2] = {1, 2};
  write_st(tmp_path("cut.safetensors"), one_tensor, v, 5);
  expect_fail(tmp_path("cut.safetensors"), HEARTH_EFORMAT, "cut.safetensors", "'a'", "truncated", NULL);
}

static void test_truncated_header(void) {
  const char *hdr = "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
  write_st_len(tmp_path("hdr.safetensors"), hdr, NULL, 0, strlen(hdr) + 100);
  expect_fail(tmp_path("hdr.safetensors"), HEARTH_EFORMAT, "hdr.safetensors", "header length", NULL);
  /* a length that fits but cuts the JSON short */
  float v = 1;
  char cut[40];
  memcpy(cut, hdr, 30);
  cut[30] = 0;
  write_st(tmp_path("hdrjson.safetensors"), cut, &v, 4);
  expect_fail(tmp_path("hdrjson.safetensors"), HEARTH_EFORMAT, "hdrjson.safetensors", "JSON", NULL);
}

static void test_huge_header(void) {
  write_st_len(tmp_path("huge.safetensors"), one_tensor, "12345678", 8, 1ull << 40);
  expect_fail(tmp_path("huge.safetensors"), HEARTH_ELIMIT, "huge.safetensors", "header length 1099511627776", NULL);
  write_st_len(tmp_path("huge2.safetensors"), one_tensor, "12345678", 8, 100000001ull);
  expect_fail(tmp_path("huge2.safetensors"), HEARTH_ELIMIT, "huge2.safetensors", NULL);
}

static void test_overlap(void) {
  unsigned char d[16] = {0};
  write_st(tmp_path("overlap.safetensors"),
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
           d, 16);
  expect_fail(tmp_path("overlap.safetensors"), HEARTH_EFORMAT, "overlap.safetensors", "'a'", "'b'", "overlap", NULL);
  /* one range inside another, listed in the other order */
  write_st(tmp_path("inside.safetensors"),
           "{\"big\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,16]},"
           "\"small\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[6,8]}}",
           d, 16);
  expect_fail(tmp_path("inside.safetensors"), HEARTH_EFORMAT, "'big'", "'small'", "overlap", NULL);
  /* empty tensors at the same offset do not overlap anything */
  write_st(tmp_path("empties.safetensors"),
           "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
           "\"e1\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]},"
           "\"e2\":{\"dtype\":\"F32\",\"shape\":[3,0],\"data_offsets\":[2,2]}}",
           d, 4);
  st_set s;
  herr e = {0};
  CHECK_MSG(st_open(&s, tmp_path("empties.safetensors"), &e) == 0, "%s", e.msg);
  st_close(&s);
}

static void test_size_mismatch(void) {
  unsigned char d[16] = {0};
  write_st(tmp_path("size.safetensors"), "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,16]}}", d, 16);
  expect_fail(tmp_path("size.safetensors"), HEARTH_EFORMAT, "size.safetensors", "'w'", "[2, 3]", "12 bytes", "16", NULL);
  write_st(tmp_path("backwards.safetensors"), "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,4]}}", d, 16);
  expect_fail(tmp_path("backwards.safetensors"), HEARTH_EFORMAT, "'w'", NULL);
  /* a shape whose product overflows */
  write_st(tmp_path("overflow.safetensors"),
           "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,0]}}", d, 16);
  expect_fail(tmp_path("overflow.safetensors"), HEARTH_EFORMAT, "'w'", "too large", NULL);
  write_st(tmp_path("negdim.safetensors"), "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,0]}}", d, 16);
  expect_fail(tmp_path("negdim.safetensors"), HEARTH_EFORMAT, "'w'", "shape[0]", NULL);
}

static void test_unknown_dtype(void) {
  unsigned char d[8] = {0};
  write_st(tmp_path("dtype.safetensors"), "{\"q\":{\"dtype\":\"Q4_K\",\"shape\":[2],\"data_offsets\":[0,8]}}", d, 8);
  expect_fail(tmp_path("dtype.safetensors"), HEARTH_EUNSUPPORTED, "dtype.safetensors", "'q'", "Q4_K", NULL);
  write_st(tmp_path("nodtype.safetensors"), "{\"q\":{\"shape\":[2],\"data_offsets\":[0,8]}}", d, 8);
  expect_fail(tmp_path("nodtype.safetensors"), HEARTH_EFORMAT, "'q'", "dtype", NULL);
}

static void test_bad_utf8_name(void) {
  unsigned char d[8] = {0};
  write_st(tmp_path("utf8.safetensors"), "{\"bad\xff\xfename\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}", d, 8);
  expect_fail(tmp_path("utf8.safetensors"), HEARTH_EFORMAT, "utf8.safetensors", "tensor name", "bad\\xff", "UTF-8", NULL);
  /* an escaped lone surrogate is not a character either */
  write_st(tmp_path("surr.safetensors"), "{\"x\\ud800\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}", d, 8);
  expect_fail(tmp_path("surr.safetensors"), HEARTH_EFORMAT, "surr.safetensors", NULL);
  /* a valid non-ASCII name is fine */
  write_st(tmp_path("utf8ok.safetensors"), "{\"caf\xc3\xa9\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}", d, 8);
  st_set s;
  herr e = {0};
  CHECK_MSG(st_open(&s, tmp_path("utf8ok.safetensors"), &e) == 0, "%s", e.msg);
  CHECK(st_find(&s, "caf\xc3\xa9") != NULL);
  st_close(&s);
}

static void test_duplicate_name(void) {
  unsigned char d[16] = {0};
  write_st(tmp_path("dup.safetensors"),
           "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
           "\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[8,16]}}",
           d, 16);
  expect_fail(tmp_path("dup.safetensors"), HEARTH_EFORMAT, "dup.safetensors", "\"a\"", "twice", NULL);
}

static void test_bad_header_shapes(void) {
  unsigned char d[8] = {0};
  write_st(tmp_path("arr.safetensors"), "[1,2,3]", d, 8);
  expect_fail(tmp_path("arr.safetensors"), HEARTH_EFORMAT, "arr.safetensors", "JSON object", NULL);
  write_st(tmp_path("meta.safetensors"), "{\"__metadata__\":{\"format\":1}}", d, 8);
  expect_fail(tmp_path("meta.safetensors"), HEARTH_EFORMAT, "__metadata__", "'format'", NULL);
  write_st(tmp_path("entry.safetensors"), "{\"a\":[1]}", d, 8);
  expect_fail(tmp_path("entry.safetensors"), HEARTH_EFORMAT, "'a'", NULL);
  write_st(tmp_path("offs.safetensors"), "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0]}}", d, 8);
  expect_fail(tmp_path("offs.safetensors"), HEARTH_EFORMAT, "'a'", "data_offsets", NULL);
  write_st(tmp_path("dims.safetensors"),
           "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", d, 8);
  expect_fail(tmp_path("dims.safetensors"), HEARTH_EUNSUPPORTED, "'a'", "dimensions", NULL);
  expect_fail(tmp_path("does-not-exist.safetensors"), HEARTH_ENOTFOUND, "does-not-exist", NULL);
}

/* ---- folders ---- */

static void make_dir(const char *name) { mkdir(tmp_path(name), 0755); }

/* Writes a two-shard folder: shard 1 holds a (F32[2]) and b (U8[4]), shard 2 holds c (BF16[3]). */
static void write_sharded(const char *dir, const char *index) {
  char p[512];
  float a[2] = {1.5f, 2.5f};
  unsigned char d1[12];
  memcpy(d1, a, 8);
  memcpy(d1 + 8, "\x01\x02\x03\x04", 4);
  snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", tmp_path(dir));
  write_st(p,
           "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]}}",
           d1, 12);
  uint16_t c[3] = {0x3F80, 0x4000, 0x4040};
  snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", tmp_path(dir));
  write_st(p, "{\"c\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]}}", c, 6);
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", tmp_path(dir));
  write_bytes(p, index, strlen(index));
}

static const char *good_index =
    "{\"metadata\":{\"total_size\":18},\"weight_map\":{"
    "\"c\":\"model-00002-of-00002.safetensors\","
    "\"a\":\"model-00001-of-00002.safetensors\","
    "\"b\":\"model-00001-of-00002.safetensors\"}}";

static void test_good_sharded(void) {
  make_dir("sharded");
  write_sharded("sharded", good_index);
  st_set s;
  herr e = {0};
  int rc = st_open(&s, tmp_path("sharded"), &e);
  CHECK_MSG(rc == 0, "%s", e.msg);
  if (rc) return;
  CHECK_EQ_INT(s.nshards, 2);
  CHECK_EQ_INT(s.count, 3);
  CHECK(strstr(s.paths[0], "model-00001-of-00002") != NULL);
  const st_tensor *a = st_find(&s, "a"), *c = st_find(&s, "c");
  CHECK(a && a->shard == 0);
  CHECK(c && c->shard == 1);
  if (c) {
    float out[3];
    CHECK_EQ_INT(st_to_f32(c, out, &e), 0);
    CHECK_NEAR(out[0], 1, 0);
    CHECK_NEAR(out[1], 2, 0);
    CHECK_NEAR(out[2], 3, 0);
  }
  if (a) {
    float v1;
    memcpy(&v1, (const char *)a->data + 4, 4);
    CHECK_NEAR(v1, 2.5, 0);
  }
  CHECK_EQ_STR(json_string_value(json_object_get(s.metadata, "format")), "pt");
  st_close(&s);
  /* the index file itself may be named */
  rc = st_open(&s, tmp_path("sharded/model.safetensors.index.json"), &e);
  CHECK_MSG(rc == 0 && s.count == 3, "%s", e.msg);
  st_close(&s);
}

static void test_shard_missing(void) {
  make_dir("missing");
  write_sharded("missing", good_index);
  unlink(tmp_path("missing/model-00002-of-00002.safetensors"));
  expect_fail(tmp_path("missing"), HEARTH_ENOTFOUND, "model.safetensors.index.json", "model-00002-of-00002.safetensors",
              "missing", NULL);
}

static void test_index_disagrees(void) {
  /* weight_map names a tensor that no shard holds */
  make_dir("ghost");
  write_sharded("ghost",
                "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00001-of-00002.safetensors\","
                "\"c\":\"model-00002-of-00002.safetensors\",\"d\":\"model-00002-of-00002.safetensors\"}}");
  expect_fail(tmp_path("ghost"), HEARTH_EFORMAT, "index.json", "'d'", "model-00002-of-00002.safetensors", NULL);
  /* weight_map puts a tensor in the wrong shard */
  make_dir("wrong");
  write_sharded("wrong",
                "{\"weight_map\":{\"a\":\"model-00002-of-00002.safetensors\",\"b\":\"model-00001-of-00002.safetensors\","
                "\"c\":\"model-00002-of-00002.safetensors\"}}");
  expect_fail(tmp_path("wrong"), HEARTH_EFORMAT, "index.json", "'a'", "but it is in model-00001-of-00002", NULL);
  /* a shard holds a tensor the weight_map does not list */
  make_dir("unlisted");
  write_sharded("unlisted",
                "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\"}}");
  expect_fail(tmp_path("unlisted"), HEARTH_EFORMAT, "model-00001-of-00002.safetensors", "'b'", "does not list", NULL);
  /* a weight_map that escapes the folder */
  make_dir("escape");
  write_sharded("escape", "{\"weight_map\":{\"a\":\"../good.safetensors\"}}");
  expect_fail(tmp_path("escape"), HEARTH_EFORMAT, "'a'", "../good.safetensors", NULL);
  make_dir("nomap");
  write_sharded("nomap", "{\"metadata\":{}}");
  expect_fail(tmp_path("nomap"), HEARTH_EFORMAT, "weight_map", NULL);
}

static void test_duplicate_across_shards(void) {
  make_dir("dupshard");
  write_sharded("dupshard", good_index);
  char p[512];
  unsigned char d[4] = {0};
  snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", tmp_path("dupshard"));
  write_st(p, "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"c\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,4]}}", d, 4);
  expect_fail(tmp_path("dupshard"), HEARTH_EFORMAT, "'a'", "model-00001-of-00002", "model-00002-of-00002", NULL);
}

static void test_folder_single(void) {
  make_dir("single");
  float v[2] = {1, 2};
  write_st(tmp_path("single/model.safetensors"), one_tensor, v, 8);
  st_set s;
  herr e = {0};
  CHECK_MSG(st_open(&s, tmp_path("single"), &e) == 0 && s.count == 1, "%s", e.msg);
  st_close(&s);
  /* a folder with one differently named file */
  make_dir("lone");
  write_st(tmp_path("lone/weights.safetensors"), one_tensor, v, 8);
  CHECK_MSG(st_open(&s, tmp_path("lone"), &e) == 0 && s.count == 1, "%s", e.msg);
  st_close(&s);
  /* two files and no index: ambiguous */
  write_st(tmp_path("lone/other.safetensors"), one_tensor, v, 8);
  expect_fail(tmp_path("lone"), HEARTH_EFORMAT, "2 .safetensors files", NULL);
  make_dir("empty");
  expect_fail(tmp_path("empty"), HEARTH_ENOTFOUND, "empty", NULL);
}

/* Files written by the safetensors library (transformers' save_pretrained), when present:
 * the sharded llama holds exactly the single-file llama's bytes, and the bf16 copy
 * converts to within bf16 rounding of the f32 one. */
#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden"

static void test_golden_files(void) {
  if (!hfile_is_dir(GOLDEN "/llama-f32")) {
    fprintf(stderr, "note: %s not found; files from the safetensors library not checked\n", GOLDEN "/llama-f32");
    return;
  }
  st_set one, two, half;
  herr e = {0};
  CHECK_MSG(st_open(&one, GOLDEN "/llama-f32", &e) == 0, "%s", e.msg);
  CHECK_MSG(st_open(&two, GOLDEN "/llama-sharded", &e) == 0, "%s", e.msg);
  CHECK_MSG(st_open(&half, GOLDEN "/llama-bf16", &e) == 0, "%s", e.msg);
  CHECK_EQ_INT(two.nshards, 2);
  CHECK_EQ_INT(one.count, two.count);
  CHECK_EQ_INT(one.count, half.count);
  CHECK(one.count > 0);
  CHECK_EQ_STR(json_string_value(json_object_get(one.metadata, "format")), "pt");
  bool shard_used[2] = {false, false};
  size_t compared = 0;
  for (size_t i = 0; i < one.count && i < two.count && i < half.count; i++) {
    const st_tensor *a = &one.tensors[i], *b = st_find(&two, a->name), *h = st_find(&half, a->name);
    CHECK_MSG(b && h, "tensor '%s' missing from a copy", a->name);
    if (!b || !h) continue;
    CHECK_EQ_INT(a->dtype, ST_F32);
    CHECK_EQ_INT(h->dtype, ST_BF16);
    CHECK(a->ndim == b->ndim && a->numel == b->numel && a->numel == h->numel);
    CHECK_MSG(b->dtype == a->dtype && b->nbytes == a->nbytes && memcmp(a->data, b->data, a->nbytes) == 0,
              "tensor '%s' differs between llama-f32 and llama-sharded", a->name);
    if (b->shard >= 0 && b->shard < 2) shard_used[b->shard] = true;
    float *fa = malloc((size_t)a->numel * sizeof *fa), *fh = malloc((size_t)a->numel * sizeof *fh);
    CHECK_EQ_INT(st_to_f32(a, fa, &e), 0);
    CHECK_EQ_INT(st_to_f32(h, fh, &e), 0);
    size_t bad = 0;
    for (int64_t k = 0; k < a->numel; k++)
      if (!(fabsf(fa[k] - fh[k]) <= fabsf(fa[k]) * (1.0f / 256) + 1e-30f)) bad++;
    CHECK_MSG(bad == 0, "tensor '%s': %zu bf16 elements are not within bf16 rounding of the f32 ones", a->name, bad);
    free(fa);
    free(fh);
    compared++;
  }
  CHECK(shard_used[0] && shard_used[1]);
  CHECK_EQ_INT(compared, one.count);
  st_close(&one);
  st_close(&two);
  st_close(&half);
}

static void cleanup(void) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
}

int main(void) {
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  RUN(test_good_single);
  RUN(test_all_dtypes);
  RUN(test_conversions);
  RUN(test_unaligned);
  RUN(test_truncated_file);
  RUN(test_truncated_header);
  RUN(test_huge_header);
  RUN(test_overlap);
  RUN(test_size_mismatch);
  RUN(test_unknown_dtype);
  RUN(test_bad_utf8_name);
  RUN(test_duplicate_name);
  RUN(test_bad_header_shapes);
  RUN(test_good_sharded);
  RUN(test_shard_missing);
  RUN(test_index_disagrees);
  RUN(test_duplicate_across_shards);
  RUN(test_folder_single);
  RUN(test_golden_files);
  cleanup();
  TEST_MAIN_END();
}
