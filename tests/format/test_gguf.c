/* test_gguf.c — the GGUF reader: the tiny llama-2 file the tests write
 * (tools/gen_random_gguf.c llama2-tiny with llama.cpp's Llama 2 vocabulary:
 * metadata, tensors), a crafted file holding every value type, and crafted bad files
 * (truncated at every byte, bad magic, huge lengths, bad array types,
 * misaligned / out-of-range tensors, duplicates) that must each give one
 * message naming the problem, without crashing or leaking. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "test.h"

#define FIXTURE HEARTH_TINY_GGUF /* written before the tests (fixture tiny_gguf) */

/* ---- a tiny GGUF writer for crafted files ---- */

typedef struct gb {
  unsigned char *d;
  size_t n, cap;
} gb;

static void gb_bytes(gb *b, const void *p, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->d = realloc(b->d, b->cap);
  }
  memcpy(b->d + b->n, p, n);
  b->n += n;
}
static void gb_u8(gb *b, uint8_t v) { gb_bytes(b, &v, 1); }
static void gb_u32(gb *b, uint32_t v) { gb_bytes(b, &v, 4); }
static void gb_u64(gb *b, uint64_t v) { gb_bytes(b, &v, 8); }
static void gb_str(gb *b, const char *s) {
  gb_u64(b, strlen(s));
  gb_bytes(b, s, strlen(s));
}
static void gb_header(gb *b, uint32_t version, uint64_t ntensors, uint64_t nkv) {
  gb_bytes(b, "GGUF", 4);
  gb_u32(b, version);
  gb_u64(b, ntensors);
  gb_u64(b, nkv);
}
static void gb_kv_u32(gb *b, const char *key, uint32_t v) {
  gb_str(b, key);
  gb_u32(b, GGUF_TYPE_UINT32);
  gb_u32(b, v);
}
static void gb_kv_str(gb *b, const char *key, const char *v) {
  gb_str(b, key);
  gb_u32(b, GGUF_TYPE_STRING);
  gb_str(b, v);
}
static void gb_tensor(gb *b, const char *name, uint32_t ndim, const uint64_t *dims, uint32_t type, uint64_t offset) {
  gb_str(b, name);
  gb_u32(b, ndim);
  for (uint32_t i = 0; i < ndim; i++) gb_u64(b, dims[i]);
  gb_u32(b, type);
  gb_u64(b, offset);
}
static void gb_pad(gb *b, size_t align) {
  while (b->n % align) gb_u8(b, 0);
}
static void gb_zeros(gb *b, size_t n) {
  for (size_t i = 0; i < n; i++) gb_u8(b, 0);
}

/* Parses b and expects failure with a message containing `needle`. */
static void expect_bad(const gb *b, const char *needle, const char *label) {
  gguf_file *g = NULL;
  herr err = {0};
  int rc = gguf_parse(b->d, b->n, "crafted.gguf", &g, &err);
  CHECK_MSG(rc != 0, "%s: parsed a bad file", label);
  CHECK_MSG(g == NULL, "%s: returned a file on failure", label);
  CHECK_MSG(strstr(err.msg, "crafted.gguf") != NULL, "%s: message does not name the file: %s", label, err.msg);
  CHECK_MSG(strstr(err.msg, needle) != NULL, "%s: message '%s' lacks '%s'", label, err.msg, needle);
  CHECK_MSG(strchr(err.msg, '\n') == NULL, "%s: message is not one line", label);
  gguf_close(g);
}

/* ---- the tiny llama-2 file ---- */

static void test_fixture(void) {
  gguf_file *g = NULL;
  herr err = {0};
  CHECK_MSG(gguf_open(&g, FIXTURE, &err) == 0, "%s", err.msg);
  if (!g) return;
  CHECK_EQ_INT(gguf_version(g), 3);
  CHECK_EQ_INT(gguf_kv_count(g), 21); /* 11 of the model, 10 of the vocabulary file */
  CHECK_EQ_INT(gguf_tensor_count(g), 12);
  CHECK_EQ_INT(gguf_alignment(g), 32);
  CHECK_EQ_INT(gguf_data_offset(g) % 32, 0);

  const char *s;
  size_t len;
  CHECK(gguf_get_str(g, "general.architecture", &s, &len, &err) == 0);
  CHECK(len == 5 && memcmp(s, "llama", 5) == 0);
  char *name = NULL;
  CHECK(gguf_get_strdup(g, "general.name", &name, &err) == 0);
  CHECK_EQ_STR(name, "llama-2-tiny-random");
  free(name);
  uint32_t u;
  CHECK(gguf_get_u32(g, "llama.embedding_length", &u, &err) == 0);
  CHECK_EQ_INT(u, 8);
  CHECK(gguf_get_u32(g, "llama.block_count", &u, &err) == 0);
  CHECK_EQ_INT(u, 1);
  CHECK(gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &u, &err) == 0);
  CHECK_EQ_INT(u, 1);
  float eps;
  CHECK(gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps, &err) == 0);
  CHECK_NEAR(eps, 1e-5, 1e-12);
  int64_t i64;
  CHECK(gguf_get_int(g, "llama.context_length", &i64, &err) == 0);
  CHECK_EQ_INT(i64, 4096);

  /* wrong type and missing key name the key */
  int32_t i32;
  herr e2 = {0};
  CHECK_EQ_INT(gguf_get_i32(g, "llama.block_count", &i32, &e2), HEARTH_EFORMAT);
  CHECK(strstr(e2.msg, "llama.block_count") && strstr(e2.msg, "u32"));
  herr e3 = {0};
  CHECK_EQ_INT(gguf_get_u32(g, "no.such.key", &u, &e3), HEARTH_ENOTFOUND);
  CHECK(strstr(e3.msg, "no.such.key") != NULL);
  CHECK(!gguf_has(g, "no.such.key"));

  gguf_arr toks;
  CHECK(gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, &err) == 0);
  CHECK_EQ_INT(toks.type, GGUF_TYPE_STRING);
  CHECK_EQ_INT(toks.n, 32000);
  const char *t0 = gguf_arr_str(&toks, 0, &len);
  CHECK(len == 5 && memcmp(t0, "<unk>", 5) == 0);
  const char *th = gguf_arr_str(&toks, 15043, &len);
  CHECK(len == 8 && memcmp(th, "\xe2\x96\x81Hello", 8) == 0);
  CHECK(gguf_arr_str(&toks, 32000, &len) == NULL);
  gguf_arr scores, types;
  CHECK(gguf_get_arr(g, "tokenizer.ggml.scores", &scores, &err) == 0);
  CHECK_EQ_INT(scores.type, GGUF_TYPE_FLOAT32);
  CHECK_EQ_INT(scores.n, 32000);
  CHECK(gguf_get_arr(g, "tokenizer.ggml.token_type", &types, &err) == 0);
  CHECK_EQ_INT(types.type, GGUF_TYPE_INT32);
  CHECK_EQ_INT(gguf_arr_int(&types, 0), 2);   /* <unk>: unknown */
  CHECK_EQ_INT(gguf_arr_int(&types, 1), 3);   /* <s>: control */
  CHECK_EQ_INT(gguf_arr_int(&types, 3), 6);   /* <0x00>: byte */
  CHECK_EQ_INT(gguf_arr_int(&types, 15043), 1);

  /* tensors: names, types, shapes in ggml order, data inside the file */
  int n_f16 = 0, n_f32 = 0;
  for (size_t i = 0; i < gguf_tensor_count(g); i++) {
    const gguf_tensor *t = gguf_tensor_at(g, i);
    CHECK(t && t->name && *t->name);
    CHECK(t->type == GGUF_TENSOR_F16 || t->type == GGUF_TENSOR_F32);
    n_f16 += t->type == GGUF_TENSOR_F16;
    n_f32 += t->type == GGUF_TENSOR_F32;
    CHECK_EQ_INT(t->offset % 32, 0);
    CHECK_EQ_INT(t->nbytes, gguf_row_size(t->type, t->dims[0]) * (size_t)(t->nelements / t->dims[0]));
    CHECK(gguf_find_tensor(g, t->name) == t);
  }
  CHECK(n_f16 > 0 && n_f32 > 0);
  const gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
  CHECK(emb != NULL);
  if (emb) {
    CHECK_EQ_INT(emb->ndim, 2);
    CHECK_EQ_INT(emb->dims[0], 8);
    CHECK_EQ_INT(emb->dims[1], 32000);
    CHECK_EQ_INT(emb->nbytes, 8 * 32000 * 2);
  }
  const gguf_tensor *norm = gguf_find_tensor(g, "output_norm.weight");
  CHECK(norm && norm->type == GGUF_TENSOR_F32 && norm->ndim == 1 && norm->dims[0] == 8);
  CHECK(gguf_find_tensor(g, "no.such.tensor") == NULL);
  CHECK(gguf_tensor_at(g, 12) == NULL);
  gguf_close(g);
}

/* ---- the type table, against the block layouts of ggml-common.h ---- */

static void test_type_table(void) {
  static const struct {
    uint32_t t;
    int block;
    size_t size;
  } want[] = {
    {GGUF_TENSOR_F32, 1, 4},      {GGUF_TENSOR_F16, 1, 2},      {GGUF_TENSOR_BF16, 1, 2},     {GGUF_TENSOR_Q4_0, 32, 2 + 16},
    {GGUF_TENSOR_Q4_1, 32, 4 + 16}, {GGUF_TENSOR_Q5_0, 32, 2 + 4 + 16}, {GGUF_TENSOR_Q5_1, 32, 4 + 4 + 16},
    {GGUF_TENSOR_Q8_0, 32, 2 + 32}, {GGUF_TENSOR_Q2_K, 256, 16 + 64 + 4}, {GGUF_TENSOR_Q3_K, 256, 32 + 64 + 12 + 2},
    {GGUF_TENSOR_Q4_K, 256, 4 + 12 + 128}, {GGUF_TENSOR_Q5_K, 256, 4 + 12 + 32 + 128}, {GGUF_TENSOR_Q6_K, 256, 128 + 64 + 16 + 2},
    {GGUF_TENSOR_Q8_K, 256, 4 + 256 + 32}, {GGUF_TENSOR_I8, 1, 1}, {GGUF_TENSOR_I16, 1, 2}, {GGUF_TENSOR_I32, 1, 4},
    {GGUF_TENSOR_I64, 1, 8},      {GGUF_TENSOR_F64, 1, 8},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    const gguf_tensor_type_info *ti = gguf_tensor_type_get(want[i].t);
    CHECK_MSG(ti != NULL, "type %u unknown", want[i].t);
    if (!ti) continue;
    CHECK_EQ_INT(ti->block_size, want[i].block);
    CHECK_EQ_INT(ti->type_size, want[i].size);
  }
  CHECK(gguf_tensor_type_get(4) == NULL); /* removed Q4_2 */
  CHECK(gguf_tensor_type_get(1000) == NULL);
  CHECK_EQ_STR(gguf_tensor_type_name(GGUF_TENSOR_Q4_K), "q4_K");
  CHECK_EQ_STR(gguf_tensor_type_name(77), "?");
  CHECK_EQ_INT(gguf_row_size(GGUF_TENSOR_Q4_0, 64), 36);
  CHECK_EQ_INT(gguf_row_size(GGUF_TENSOR_Q4_0, 33), 0);
  CHECK_EQ_INT(gguf_row_size(GGUF_TENSOR_Q6_K, 512), 420);
  CHECK_EQ_STR(gguf_type_name(GGUF_TYPE_STRING), "string");
  CHECK_EQ_INT(gguf_type_size(GGUF_TYPE_UINT16), 2);
  CHECK_EQ_INT(gguf_type_size(GGUF_TYPE_ARRAY), 0);
}

/* ---- a crafted file with every value type ---- */

static void build_good(gb *b, uint32_t version) {
  gb_header(b, version, 2, 17);
  gb_str(b, "t.u8"), gb_u32(b, GGUF_TYPE_UINT8), gb_u8(b, 200);
  gb_str(b, "t.i8"), gb_u32(b, GGUF_TYPE_INT8), gb_u8(b, (uint8_t)-5);
  gb_str(b, "t.u16"), gb_u32(b, GGUF_TYPE_UINT16), gb_bytes(b, &(uint16_t){60000}, 2);
  gb_str(b, "t.i16"), gb_u32(b, GGUF_TYPE_INT16), gb_bytes(b, &(int16_t){-30000}, 2);
  gb_kv_u32(b, "t.u32", 4000000000u);
  gb_str(b, "t.i32"), gb_u32(b, GGUF_TYPE_INT32), gb_bytes(b, &(int32_t){-7}, 4);
  gb_str(b, "t.u64"), gb_u32(b, GGUF_TYPE_UINT64), gb_u64(b, UINT64_MAX);
  gb_str(b, "t.i64"), gb_u32(b, GGUF_TYPE_INT64), gb_bytes(b, &(int64_t){-9000000000ll}, 8);
  gb_str(b, "t.f32"), gb_u32(b, GGUF_TYPE_FLOAT32), gb_bytes(b, &(float){1.5f}, 4);
  gb_str(b, "t.f64"), gb_u32(b, GGUF_TYPE_FLOAT64), gb_bytes(b, &(double){-2.25}, 8);
  gb_str(b, "t.bool"), gb_u32(b, GGUF_TYPE_BOOL), gb_u8(b, 1);
  gb_kv_str(b, "t.str", "h\xc3\xa9llo");
  gb_str(b, "t.arr_i16"), gb_u32(b, GGUF_TYPE_ARRAY), gb_u32(b, GGUF_TYPE_INT16), gb_u64(b, 3);
  gb_bytes(b, (int16_t[]){-1, 2, -3}, 6);
  gb_str(b, "t.arr_f64"), gb_u32(b, GGUF_TYPE_ARRAY), gb_u32(b, GGUF_TYPE_FLOAT64), gb_u64(b, 2);
  gb_bytes(b, (double[]){0.5, 1e300}, 16);
  gb_str(b, "t.arr_str"), gb_u32(b, GGUF_TYPE_ARRAY), gb_u32(b, GGUF_TYPE_STRING), gb_u64(b, 3);
  gb_str(b, "a"), gb_str(b, ""), gb_str(b, "ccc");
  gb_str(b, "t.arr_empty"), gb_u32(b, GGUF_TYPE_ARRAY), gb_u32(b, GGUF_TYPE_UINT32), gb_u64(b, 0);
  gb_kv_u32(b, "general.alignment", 64);
  gb_tensor(b, "a.weight", 2, (uint64_t[]){64, 3}, GGUF_TENSOR_Q4_0, 0);          /* 3 rows × 36 bytes = 108 */
  gb_tensor(b, "b.weight", 1, (uint64_t[]){256}, GGUF_TENSOR_Q8_K, 128);         /* 292 bytes */
  gb_pad(b, 64);
  gb_zeros(b, 128 + 292);
}

static void test_crafted_good(void) {
  for (uint32_t version = 2; version <= 3; version++) {
    gb b = {0};
    build_good(&b, version);
    gguf_file *g = NULL;
    herr err = {0};
    CHECK_MSG(gguf_parse(b.d, b.n, "crafted.gguf", &g, &err) == 0, "%s", err.msg);
    if (!g) {
      free(b.d);
      continue;
    }
    CHECK_EQ_INT(gguf_version(g), version);
    CHECK_EQ_INT(gguf_alignment(g), 64);
    uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32; uint64_t u64; int64_t i64;
    float f32; double f64; bool bo;
    CHECK(gguf_get_u8(g, "t.u8", &u8, &err) == 0 && u8 == 200);
    CHECK(gguf_get_i8(g, "t.i8", &i8, &err) == 0 && i8 == -5);
    CHECK(gguf_get_u16(g, "t.u16", &u16, &err) == 0 && u16 == 60000);
    CHECK(gguf_get_i16(g, "t.i16", &i16, &err) == 0 && i16 == -30000);
    CHECK(gguf_get_u32(g, "t.u32", &u32, &err) == 0 && u32 == 4000000000u);
    CHECK(gguf_get_i32(g, "t.i32", &i32, &err) == 0 && i32 == -7);
    CHECK(gguf_get_u64(g, "t.u64", &u64, &err) == 0 && u64 == UINT64_MAX);
    CHECK(gguf_get_i64(g, "t.i64", &i64, &err) == 0 && i64 == -9000000000ll);
    CHECK(gguf_get_f32(g, "t.f32", &f32, &err) == 0 && f32 == 1.5f);
    CHECK(gguf_get_f64(g, "t.f64", &f64, &err) == 0 && f64 == -2.25);
    CHECK(gguf_get_bool(g, "t.bool", &bo, &err) == 0 && bo);
    const char *s;
    size_t len;
    CHECK(gguf_get_str(g, "t.str", &s, &len, &err) == 0 && len == 6 && memcmp(s, "h\xc3\xa9llo", 6) == 0);
    /* lenient getters */
    CHECK(gguf_get_int(g, "t.u8", &i64, &err) == 0 && i64 == 200);
    CHECK(gguf_get_int(g, "t.i16", &i64, &err) == 0 && i64 == -30000);
    herr e2 = {0};
    CHECK_EQ_INT(gguf_get_int(g, "t.u64", &i64, &e2), HEARTH_EFORMAT); /* does not fit int64 */
    CHECK(gguf_get_float(g, "t.f32", &f64, &err) == 0 && f64 == 1.5);
    herr e3 = {0};
    CHECK_EQ_INT(gguf_get_float(g, "t.str", &f64, &e3), HEARTH_EFORMAT);
    CHECK(strstr(e3.msg, "t.str") != NULL);
    /* arrays */
    gguf_arr a;
    CHECK(gguf_get_arr(g, "t.arr_i16", &a, &err) == 0);
    CHECK(a.type == GGUF_TYPE_INT16 && a.n == 3 && a.raw != NULL && a.strs == NULL);
    CHECK_EQ_INT(gguf_arr_int(&a, 0), -1);
    CHECK_EQ_INT(gguf_arr_int(&a, 2), -3);
    CHECK_EQ_INT(gguf_arr_int(&a, 3), 0);
    CHECK_NEAR(gguf_arr_float(&a, 1), 2.0, 0);
    CHECK(gguf_get_arr(g, "t.arr_f64", &a, &err) == 0);
    CHECK_NEAR(gguf_arr_float(&a, 1), 1e300, 0);
    CHECK(gguf_get_arr(g, "t.arr_str", &a, &err) == 0);
    CHECK(a.type == GGUF_TYPE_STRING && a.n == 3 && a.strs != NULL);
    s = gguf_arr_str(&a, 2, &len);
    CHECK(len == 3 && memcmp(s, "ccc", 3) == 0);
    s = gguf_arr_str(&a, 1, &len);
    CHECK(s != NULL && len == 0);
    CHECK_EQ_INT(gguf_arr_int(&a, 0), 0); /* not numeric */
    CHECK(gguf_get_arr(g, "t.arr_empty", &a, &err) == 0 && a.n == 0);
    herr e4 = {0};
    CHECK_EQ_INT(gguf_get_arr(g, "t.u8", &a, &e4), HEARTH_EFORMAT);
    /* tensors */
    const gguf_tensor *ta = gguf_find_tensor(g, "a.weight"), *tb = gguf_find_tensor(g, "b.weight");
    CHECK(ta && tb);
    if (ta && tb) {
      CHECK_EQ_INT(ta->type, GGUF_TENSOR_Q4_0);
      CHECK_EQ_INT(ta->nelements, 192);
      CHECK_EQ_INT(ta->nbytes, 108);
      CHECK_EQ_INT(ta->dims[2], 1);
      CHECK_EQ_INT(tb->nbytes, 292);
      CHECK_EQ_INT(gguf_data_offset(g) % 64, 0);
      CHECK((const unsigned char *)tb->data == b.d + gguf_data_offset(g) + 128);
    }
    CHECK_EQ_INT(gguf_kv_count(g), 17);
    CHECK_EQ_STR(gguf_kv_at(g, 0)->key, "t.u8");
    CHECK(gguf_kv_at(g, 17) == NULL);
    gguf_close(g);

    /* every truncation of a good file fails cleanly */
    if (version == 3) {
      for (size_t cut = 0; cut < b.n; cut++) {
        gguf_file *gt = NULL;
        herr et = {0};
        int rc = gguf_parse(b.d, cut, "cut.gguf", &gt, &et);
        CHECK_MSG(rc != 0, "truncated at %zu parsed", cut);
        CHECK_MSG(strstr(et.msg, "cut.gguf") != NULL, "cut %zu: %s", cut, et.msg);
        gguf_close(gt);
      }
    }
    free(b.d);
  }
}

/* ---- crafted bad files ---- */

static void test_bad_files(void) {
  gb b = {0};

  gb_bytes(&b, "GGML", 4), gb_u32(&b, 3), gb_u64(&b, 0), gb_u64(&b, 0);
  expect_bad(&b, "magic", "bad magic");
  b.n = 0;

  gb_header(&b, 1, 0, 0);
  expect_bad(&b, "version 1", "version 1");
  b.n = 0;
  gb_header(&b, 0x03000000, 0, 0);
  expect_bad(&b, "byte-swapped", "big-endian");
  b.n = 0;

  gb_header(&b, 3, 0, 1);
  gb_str(&b, "k"), gb_u32(&b, GGUF_TYPE_STRING), gb_u64(&b, 1ull << 60), gb_bytes(&b, "abc", 3);
  expect_bad(&b, "string length", "huge string");
  b.n = 0;

  gb_header(&b, 3, 0, 1);
  gb_u64(&b, UINT64_MAX), gb_zeros(&b, 16);
  expect_bad(&b, "key 0", "huge key length");
  b.n = 0;

  gb_header(&b, 3, 0, 1000000);
  gb_kv_u32(&b, "k", 1);
  expect_bad(&b, "1000000 metadata keys", "too many keys");
  b.n = 0;

  gb_header(&b, 3, 0, 1);
  gb_str(&b, "nested"), gb_u32(&b, GGUF_TYPE_ARRAY), gb_u32(&b, GGUF_TYPE_ARRAY), gb_u64(&b, 1);
  gb_u32(&b, GGUF_TYPE_UINT8), gb_u64(&b, 1), gb_u8(&b, 0);
  expect_bad(&b, "nested", "nested array");
  b.n = 0;

  gb_header(&b, 3, 0, 1);
  gb_str(&b, "weird"), gb_u32(&b, GGUF_TYPE_ARRAY), gb_u32(&b, 13), gb_u64(&b, 1), gb_u8(&b, 0);
  expect_bad(&b, "weird", "array of unknown type");
  b.n = 0;

  gb_header(&b, 3, 0, 1);
  gb_str(&b, "weird"), gb_u32(&b, 77), gb_u32(&b, 0);
  expect_bad(&b, "unknown value type 77", "unknown value type");
  b.n = 0;

  gb_header(&b, 3, 0, 1);
  gb_str(&b, "big"), gb_u32(&b, GGUF_TYPE_ARRAY), gb_u32(&b, GGUF_TYPE_UINT64), gb_u64(&b, 1ull << 61);
  expect_bad(&b, "big", "huge numeric array");
  b.n = 0;

  gb_header(&b, 3, 0, 1);
  gb_str(&b, "strs"), gb_u32(&b, GGUF_TYPE_ARRAY), gb_u32(&b, GGUF_TYPE_STRING), gb_u64(&b, 3);
  gb_str(&b, "a"), gb_u64(&b, 99), gb_zeros(&b, 40);
  expect_bad(&b, "strs' element 1", "bad string in array");
  b.n = 0;

  gb_header(&b, 3, 0, 2);
  gb_kv_u32(&b, "dup", 1), gb_kv_u32(&b, "dup", 2);
  expect_bad(&b, "'dup' appears twice", "duplicate key");
  b.n = 0;

  gb_header(&b, 3, 0, 1);
  gb_str(&b, ""), gb_u32(&b, GGUF_TYPE_UINT8), gb_u8(&b, 0);
  expect_bad(&b, "empty name", "empty key");
  b.n = 0;

  gb_header(&b, 3, 0, 1);
  gb_u64(&b, 3), gb_bytes(&b, "a\0b", 3), gb_u32(&b, GGUF_TYPE_UINT8), gb_u8(&b, 0);
  expect_bad(&b, "NUL", "key with NUL");
  b.n = 0;

  gb_header(&b, 3, 0, 1);
  gb_kv_u32(&b, "general.alignment", 48);
  expect_bad(&b, "power of two", "alignment not a power of two");
  b.n = 0;

  gb_header(&b, 3, 0, 1);
  gb_kv_str(&b, "general.alignment", "32");
  expect_bad(&b, "general.alignment' is string", "alignment of wrong type");
  b.n = 0;

  /* tensors */
  gb_header(&b, 3, 1, 0);
  gb_tensor(&b, "w", 1, (uint64_t[]){32}, GGUF_TENSOR_F32, 16);
  gb_pad(&b, 32), gb_zeros(&b, 256);
  expect_bad(&b, "'w' offset 16 is not a multiple of the alignment 32", "misaligned tensor");
  b.n = 0;

  gb_header(&b, 3, 1, 0);
  gb_tensor(&b, "w", 1, (uint64_t[]){32}, GGUF_TENSOR_F32, 64);
  gb_pad(&b, 32), gb_zeros(&b, 128);
  expect_bad(&b, "'w' (128 bytes at data offset 64) ends past the data section of 128 bytes", "tensor past the end");
  b.n = 0;

  gb_header(&b, 3, 1, 0);
  gb_tensor(&b, "w", 1, (uint64_t[]){32}, GGUF_TENSOR_F32, UINT64_MAX - 31);
  gb_pad(&b, 32), gb_zeros(&b, 128);
  expect_bad(&b, "'w'", "tensor offset overflow");
  b.n = 0;

  gb_header(&b, 3, 1, 0);
  gb_tensor(&b, "w", 1, (uint64_t[]){32}, 4, 0);
  gb_pad(&b, 32), gb_zeros(&b, 128);
  expect_bad(&b, "'w' has unknown ggml type 4", "unknown ggml type");
  b.n = 0;

  gb_header(&b, 3, 1, 0);
  gb_tensor(&b, "w", 1, (uint64_t[]){48}, GGUF_TENSOR_Q4_0, 0);
  gb_pad(&b, 32), gb_zeros(&b, 128);
  expect_bad(&b, "not a multiple of the q4_0 block size 32", "row not a block multiple");
  b.n = 0;

  gb_header(&b, 3, 1, 0);
  gb_tensor(&b, "w", 5, (uint64_t[]){1, 1, 1, 1, 1}, GGUF_TENSOR_F32, 0);
  gb_pad(&b, 32), gb_zeros(&b, 128);
  expect_bad(&b, "'w' has 5 dimensions", "too many dims");
  b.n = 0;

  gb_header(&b, 3, 1, 0);
  gb_tensor(&b, "w", 2, (uint64_t[]){1ull << 40, 1ull << 40}, GGUF_TENSOR_F32, 0);
  gb_pad(&b, 32), gb_zeros(&b, 128);
  expect_bad(&b, "'w'", "dims overflow");
  b.n = 0;

  gb_header(&b, 3, 1, 0);
  gb_tensor(&b, "w", 1, (uint64_t[]){UINT64_MAX}, GGUF_TENSOR_F32, 0);
  gb_pad(&b, 32), gb_zeros(&b, 128);
  expect_bad(&b, "negative", "negative dim");
  b.n = 0;

  gb_header(&b, 3, 2, 0);
  gb_tensor(&b, "w", 1, (uint64_t[]){8}, GGUF_TENSOR_F32, 0);
  gb_tensor(&b, "w", 1, (uint64_t[]){8}, GGUF_TENSOR_F32, 32);
  gb_pad(&b, 32), gb_zeros(&b, 64);
  expect_bad(&b, "tensor 'w' appears twice", "duplicate tensor");
  b.n = 0;

  gb_header(&b, 3, 1, 0);
  gb_tensor(&b, "w", 1, (uint64_t[]){8}, GGUF_TENSOR_F32, 0);
  /* no padding, no data */
  expect_bad(&b, "data section", "no data section");
  b.n = 0;

  gb_header(&b, 3, 1000000, 0);
  expect_bad(&b, "1000000 tensors", "too many tensors");
  free(b.d);

  /* a missing file */
  gguf_file *g = NULL;
  herr err = {0};
  CHECK(gguf_open(&g, "/nonexistent/x.gguf", &err) == HEARTH_ENOTFOUND);
  CHECK(strstr(err.msg, "/nonexistent/x.gguf") != NULL);
  gguf_close(NULL);
}

int main(void) {
  RUN(test_fixture);
  RUN(test_type_table);
  RUN(test_crafted_good);
  RUN(test_bad_files);
  TEST_MAIN_END();
}
