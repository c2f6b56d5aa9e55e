/* test_quantized.c — quantized model folders: the golden llama-f32 weights
 * quantized to MLX affine 4- and 8-bit (uint32 words + scales + biases, as
 * mlx-lm writes them, with a "quantization" block in config.json) must give
 * the same logits as an f32 folder holding exactly the dequantized values;
 * and the quantized model must stay close to transformers' logits. The
 * same for the golden qwen3_moe model with its experts stacked as mlx-lm's
 * switch_mlp (3-D words, scales and biases). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/formats.h"
#include "base/json.h"
#include "engine/kv_cache.h"
#include "format/safetensors.h"
#include "model/model.h"
#include "test.h"
#include "test_device.h"

#define SRC HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-f32"

typedef struct st_entry {
  char name[128];
  const char *dtype;
  int ndim;
  int64_t shape[3];
  void *data; /* owned */
  size_t nbytes;
} st_entry;

static void write_st(const char *path, st_entry *e, int n) {
  json_t *hdr = json_object();
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    json_t *shape = json_array();
    for (int d = 0; d < e[i].ndim; d++) json_array_append_new(shape, json_integer(e[i].shape[d]));
    json_object_set_new(hdr, e[i].name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", e[i].dtype, "shape", shape, "data_offsets",
                                                  (json_int_t)off, (json_int_t)(off + e[i].nbytes)));
    off += e[i].nbytes;
  }
  char *text = json_dumps(hdr, JSON_COMPACT | JSON_SORT_KEYS);
  uint64_t hlen = strlen(text);
  FILE *f = fopen(path, "wb");
  fwrite(&hlen, 8, 1, f);
  fwrite(text, 1, hlen, f);
  for (int i = 0; i < n; i++) fwrite(e[i].data, 1, e[i].nbytes, f);
  fclose(f);
  free(text);
  json_decref(hdr);
}

static void write_config_of(const char *src, const char *dir, int bits, int group) {
  herr err = {0};
  char cp[512];
  snprintf(cp, sizeof cp, "%s/config.json", src);
  json_t *j = hjson_load_file(cp, &err);
  if (bits) json_object_set_new(j, "quantization", json_pack("{s:i, s:i}", "group_size", group, "bits", bits));
  char p[512];
  snprintf(p, sizeof p, "%s/config.json", dir);
  json_dump_file(j, p, JSON_INDENT(1));
  json_decref(j);
}

static void write_config(const char *dir, int bits, int group) { write_config_of(SRC, dir, bits, group); }

/* Quantizes x [n * rows, cols] (n stacked matrices) to MLX affine and appends BASE.weight, .scales
 * and .biases ([n,] rows, ...) to q; x becomes the dequantized values. */
static int quantize_to(st_entry *q, int *nq, const char *base, float *x, int64_t n, int64_t rows, int64_t cols, int bits,
                       int group) {
  herr err = {0};
  int64_t R = n * rows, words = cols * bits / 32, groups = cols / group;
  uint32_t *wq = malloc(sizeof(uint32_t) * (size_t)(R * words));
  uint16_t *sc = malloc(2 * (size_t)(R * groups)), *bi = malloc(2 * (size_t)(R * groups));
  if (bk_quantize_mlx(x, R, cols, bits, group, BK_BF16, wq, sc, bi, &err)) return -1;
  bk_weight w = {.type = BK_MLX_AFFINE, .rows = R, .cols = cols, .data = wq, .bits = bits, .group_size = group,
                 .scale_type = BK_BF16, .scales = sc, .biases = bi};
  for (int64_t r = 0; r < R; r++) bk_dequant_row(&w, r, x + r * cols, &err); /* the f32 twin holds these values */
  const int nd = n > 1 ? 3 : 2;
  st_entry e[3] = {{.dtype = "U32", .data = wq, .nbytes = sizeof(uint32_t) * (size_t)(R * words)},
                   {.dtype = "BF16", .data = sc, .nbytes = 2 * (size_t)(R * groups)},
                   {.dtype = "BF16", .data = bi, .nbytes = 2 * (size_t)(R * groups)}};
  static const char *const suffix[3] = {"weight", "scales", "biases"};
  for (int i = 0; i < 3; i++) {
    int64_t last = i ? groups : words;
    e[i].ndim = nd;
    if (nd == 3) e[i].shape[0] = n, e[i].shape[1] = rows, e[i].shape[2] = last;
    else e[i].shape[0] = rows, e[i].shape[1] = last;
    snprintf(e[i].name, sizeof e[i].name, "%s.%s", base, suffix[i]);
    q[(*nq)++] = e[i];
  }
  return 0;
}

/* The experts of a qwen3_moe folder (model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight) as
 * mlx-lm's SwitchGLU stacks them (model.layers.L.mlp.switch_mlp.{gate,up,down}_proj): quantized into
 * q, and as f32 3-D stacks of the dequantized values into f. */
static int stack_experts(const st_set *s, st_entry *q, int *nq, st_entry *f, int *nf, int bits, int group) {
  static const char *const mats[3] = {"gate_proj", "up_proj", "down_proj"};
  for (int l = 0;; l++) {
    char name[160];
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.0.gate_proj.weight", l);
    if (!st_find(s, name)) return l > 0 ? 0 : -1;
    for (int k = 0; k < 3; k++) {
      int64_t n = 0;
      for (;; n++) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%lld.%s.weight", l, (long long)n, mats[k]);
        if (!st_find(s, name)) break;
      }
      snprintf(name, sizeof name, "model.layers.%d.mlp.experts.0.%s.weight", l, mats[k]);
      const st_tensor *t0 = st_find(s, name);
      int64_t rows = t0->shape[0], cols = t0->shape[1];
      float *x = malloc(sizeof(float) * (size_t)(n * rows * cols));
      for (int64_t e = 0; e < n; e++) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%lld.%s.weight", l, (long long)e, mats[k]);
        memcpy(x + e * rows * cols, st_find(s, name)->data, sizeof(float) * (size_t)(rows * cols));
      }
      char base[160];
      snprintf(base, sizeof base, "model.layers.%d.mlp.switch_mlp.%s", l, mats[k]);
      if (quantize_to(q, nq, base, x, n, rows, cols, bits, group)) return -1;
      st_entry *fe = &f[(*nf)++];
      snprintf(fe->name, sizeof fe->name, "%s.weight", base);
      fe->dtype = "F32";
      fe->ndim = 3;
      fe->shape[0] = n, fe->shape[1] = rows, fe->shape[2] = cols;
      fe->nbytes = sizeof(float) * (size_t)(n * rows * cols);
      fe->data = x;
    }
  }
}

/* Builds DIRQ (MLX-quantized matrices) and DIRF (the same values dequantized, f32) from the folder
 * src; with stack, the experts become mlx-lm's 3-D switch_mlp stacks in both. */
static int make_folders_of(const char *src, const char *dirq, const char *dirf, int bits, int group, bool stack) {
  st_set s;
  herr err = {0};
  if (st_open(&s, src, &err)) return -1;
  st_entry *q = calloc(s.count * 3, sizeof *q), *f = calloc(s.count, sizeof *f);
  int nq = 0, nf = 0;
  if (stack && stack_experts(&s, q, &nq, f, &nf, bits, group)) return -1;
  for (size_t i = 0; i < s.count; i++) {
    const st_tensor *t = &s.tensors[i];
    if (stack && strstr(t->name, ".mlp.experts.")) continue;
    float *x = malloc(t->nbytes);
    memcpy(x, t->data, t->nbytes);
    st_entry *fe = &f[nf++];
    snprintf(fe->name, sizeof fe->name, "%s", t->name);
    fe->dtype = "F32";
    fe->ndim = t->ndim;
    fe->shape[0] = t->shape[0];
    fe->shape[1] = t->ndim > 1 ? t->shape[1] : 0;
    fe->nbytes = t->nbytes;
    fe->data = x;
    /* norms stay as they are; so does a MoE router (a quantized one can flip a near-tie of the routing) */
    if (t->ndim != 2 || (stack && strstr(t->name, ".mlp.gate.weight"))) {
      st_entry *qe = &q[nq++];
      *qe = *fe;
      qe->data = malloc(t->nbytes);
      memcpy(qe->data, x, t->nbytes);
      continue;
    }
    char base[128];
    snprintf(base, sizeof base, "%.*s", (int)(strlen(t->name) - 7), t->name);
    if (quantize_to(q, &nq, base, x, 1, t->shape[0], t->shape[1], bits, group)) return -1;
  }
  char p[512];
  snprintf(p, sizeof p, "%s/model.safetensors", dirq);
  write_st(p, q, nq);
  snprintf(p, sizeof p, "%s/model.safetensors", dirf);
  write_st(p, f, nf);
  write_config_of(src, dirq, bits, group);
  write_config_of(src, dirf, 0, 0);
  for (int i = 0; i < nq; i++) free(q[i].data);
  for (int i = 0; i < nf; i++) free(f[i].data);
  free(q), free(f);
  st_close(&s);
  return 0;
}

static int make_folders(const char *dirq, const char *dirf, int bits, int group) {
  return make_folders_of(SRC, dirq, dirf, bits, group, false);
}

static int run_prompt(const char *dir, const int32_t *ids, int n, float *out, herr *err) {
  model *m = NULL;
  int rc = model_load(dir, &(model_load_opts){.device = test_device()}, &m, err);
  if (rc) return rc;
  model_kv_geometry geo;
  model_kv_geometry_of(m, &geo);
  kv_cache *c = NULL;
  kv_seq *s = NULL;
  rc = kv_cache_new(&geo, 0, &c, err);
  if (!rc) rc = kv_cache_seq_new(c, &s, err);
  model_seq sq = {.kv = s, .tokens = ids, .n_tokens = n, .all_logits = true};
  model_batch b = {&sq, 1};
  if (!rc) rc = model_forward(m, &b, out, err);
  kv_cache_seq_free(s);
  kv_cache_free(c);
  model_free(m);
  return rc;
}

static void cleanup(const char *dir) {
  char p[512];
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/config.json", dir);
  unlink(p);
  rmdir(dir);
}

static void check_bits_of(const char *src, bool stack, int bits, int group, double golden_tol) {
  char dq[] = "/tmp/hearth_mlxq_XXXXXX", df[] = "/tmp/hearth_mlxf_XXXXXX";
  if (!mkdtemp(dq) || !mkdtemp(df)) return;
  CHECK(make_folders_of(src, dq, df, bits, group, stack) == 0);
  herr err = {0};
  char gp[512], lp[512];
  snprintf(gp, sizeof gp, "%s/golden.json", src);
  snprintf(lp, sizeof lp, "%s/logits_f32.bin", src);
  json_t *doc = hjson_load_file(gp, &err);
  json_t *p0 = json_array_get(json_object_get(doc, "prompts"), 0);
  int n = (int)json_array_size(p0);
  int32_t ids[64];
  for (int i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(p0, i));
  const int V = 512;
  float *lq = malloc(sizeof(float) * (size_t)(n * V)), *lf = malloc(sizeof(float) * (size_t)(n * V)),
        *ref = malloc(sizeof(float) * (size_t)(n * V));
  int rc = run_prompt(dq, ids, n, lq, &err);
  CHECK_MSG(rc == 0, "%d-bit: %s", bits, err.msg);
  rc = run_prompt(df, ids, n, lf, &err);
  CHECK_MSG(rc == 0, "f32 twin: %s", err.msg);
  FILE *f = fopen(lp, "rb");
  CHECK(f && fread(ref, sizeof(float), (size_t)(n * V), f) == (size_t)(n * V));
  if (f) fclose(f);
  double same = 0, vs_golden = 0;
  for (int i = 0; i < n * V; i++) {
    double a = fabs((double)lq[i] - lf[i]), b = fabs((double)lq[i] - ref[i]);
    if (!(a <= same)) same = isnan(a) ? INFINITY : a;
    if (!(b <= vs_golden)) vs_golden = isnan(b) ? INFINITY : b;
  }
  CHECK_MSG(same <= 1e-4, "%d-bit MLX vs its dequantized f32 twin: max abs diff %g", bits, same);
  CHECK_MSG(vs_golden <= golden_tol, "%d-bit MLX vs transformers: max abs diff %g", bits, vs_golden);
  fprintf(stderr, "  %s mlx %d-bit group %d%s: vs f32 twin %.3g, vs transformers %.3g\n", strrchr(src, '/') + 1, bits, group,
          stack ? " (experts stacked)" : "", same, vs_golden);
  free(lq), free(lf), free(ref);
  json_decref(doc);
  cleanup(dq);
  cleanup(df);
}

static void check_bits(int bits, int group, double golden_tol) { check_bits_of(SRC, false, bits, group, golden_tol); }

static void test_mlx_8bit(void) { check_bits(8, 32, 0.1); }
static void test_mlx_4bit(void) { check_bits(4, 64, 2.0); }

/* Mixture of experts as mlx-lm saves it: the golden qwen3_moe model's experts as 3-D switch_mlp
 * stacks of MLX words (attention and head quantized too, the router kept f32), against the same stacks
 * dequantized to f32 (loaded through the unquantized switch_mlp path) and against transformers. */
#define MOE HEARTH_SOURCE_DIR "/tests/fixtures/golden/qwen3_moe-f32"
static void test_mlx_moe_8bit(void) { check_bits_of(MOE, true, 8, 32, 0.1); }
static void test_mlx_moe_4bit(void) { check_bits_of(MOE, true, 4, 32, 2.0); }

/* A quantized folder with a scales tensor of the wrong shape is refused by name. */
static void test_mlx_bad_scales(void) {
  char dq[] = "/tmp/hearth_mlxq_XXXXXX", df[] = "/tmp/hearth_mlxf_XXXXXX";
  if (!mkdtemp(dq) || !mkdtemp(df)) return;
  CHECK(make_folders(dq, df, 8, 32) == 0);
  write_config(dq, 8, 64); /* the files hold group 32 */
  herr err = {0};
  model *m = NULL;
  CHECK(model_load(dq, NULL, &m, &err) != 0);
  CHECK_MSG(strstr(err.msg, ".scales") || strstr(err.msg, ".weight"), "%s", err.msg);
  model_free(m);
  cleanup(dq);
  cleanup(df);
}

int main(void) {
  test_device_or_skip();
  RUN(test_mlx_8bit);
  RUN(test_mlx_4bit);
  RUN(test_mlx_moe_8bit);
  RUN(test_mlx_moe_4bit);
  RUN(test_mlx_bad_scales);
  TEST_MAIN_END();
}
