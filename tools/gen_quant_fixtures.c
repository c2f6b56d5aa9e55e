/* gen_quant_fixtures.c — writes tests/fixtures/quants/: a fixed pseudo-random
 * f32 matrix (4 x 512, xorshift-seeded, values of a few magnitudes per row)
 * quantized by ggml itself (ggml_quantize_chunk, no importance matrix) into
 * each GGUF block type hearth reads, with ggml's own dequantized floats
 * (its type traits' to_float). Built and run against llama.cpp's ggml by
 * tools/gen_quant_fixtures.sh; links ggml-base only.
 *
 * Per type NAME: NAME.blocks (the rows' blocks as ggml lays them out) and
 * NAME.f32 (rows * cols little-endian floats), plus input.f32 (the matrix).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"

#define ROWS 4
#define COLS 512

static uint64_t state = 0x9E3779B97F4A7C15ull;
static uint32_t next_u32(void) {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return (uint32_t)(state >> 32);
}
/* Uniform in [-1, 1). */
static float uniform(void) { return (float)next_u32() / 2147483648.0f - 1.0f; }

static int write_file(const char *dir, const char *name, const void *p, size_t n) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n || fclose(f)) {
    fprintf(stderr, "cannot write %s\n", path);
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  static float x[ROWS * COLS], y[ROWS * COLS];
  /* rows of different scales, a few outliers, a run of zeros */
  static const float row_scale[ROWS] = {1.0f, 0.02f, 37.5f, 0.75f};
  for (int r = 0; r < ROWS; r++)
    for (int c = 0; c < COLS; c++) {
      float v = uniform() * row_scale[r];
      if (next_u32() % 61 == 0) v *= 6.0f;
      if (r == 3 && c >= 96 && c < 128) v = 0.0f;
      x[r * COLS + c] = v;
    }
  if (write_file(argv[1], "input.f32", x, sizeof x)) return 1;
  static const struct {
    const char *name;
    enum ggml_type type;
  } types[] = {
      {"q2_K", GGML_TYPE_Q2_K}, {"q3_K", GGML_TYPE_Q3_K},     {"q5_0", GGML_TYPE_Q5_0},
      {"q5_1", GGML_TYPE_Q5_1}, {"iq4_nl", GGML_TYPE_IQ4_NL}, {"iq4_xs", GGML_TYPE_IQ4_XS},
  };
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    size_t rb = ggml_row_size(types[i].type, COLS), n = rb * ROWS;
    void *q = calloc(1, n);
    if (!q) return 1;
    size_t got = ggml_quantize_chunk(types[i].type, x, q, 0, ROWS, COLS, NULL);
    if (got != n) {
      fprintf(stderr, "%s: ggml wrote %zu bytes, expected %zu\n", types[i].name, got, n);
      return 1;
    }
    const struct ggml_type_traits *tt = ggml_get_type_traits(types[i].type);
    for (int r = 0; r < ROWS; r++) tt->to_float((const char *)q + r * rb, y + r * COLS, COLS);
    char name[64];
    snprintf(name, sizeof name, "%s.blocks", types[i].name);
    if (write_file(argv[1], name, q, n)) return 1;
    snprintf(name, sizeof name, "%s.f32", types[i].name);
    if (write_file(argv[1], name, y, sizeof y)) return 1;
    printf("%-7s %zu bytes a row\n", types[i].name, rb);
    free(q);
  }
  ggml_quantize_free();
  return 0;
}
