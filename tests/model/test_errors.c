/* test_errors.c — model_load on broken folders built in a temp dir from the
 * llama golden fixture: a missing tensor, a wrong shape, an unknown
 * activation, an unsupported model_type. Each must fail with a message that
 * names the problem. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "format/safetensors.h"
#include "model/model.h"
#include "test.h"

#define SRC HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-f32"

static char tmpdir[64];

static void path_in(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", tmpdir, name); }

/* Writes tmpdir/config.json: the source config with one field replaced (NULL = unchanged). */
static void write_config(const char *key, const char *value) {
  herr err = {0};
  json_t *j = hjson_load_file(SRC "/config.json", &err);
  if (key) json_object_set_new(j, key, json_string(value));
  char p[256];
  path_in(p, sizeof p, "config.json");
  json_dump_file(j, p, JSON_INDENT(1));
  json_decref(j);
}

/* Writes tmpdir/model.safetensors from the source weights, leaving out `skip`
 * and declaring `transpose` with its two dimensions swapped. */
static void write_weights(const char *skip, const char *transpose) {
  st_set s;
  herr err = {0};
  if (st_open(&s, SRC, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return;
  }
  json_t *hdr = json_object();
  size_t off = 0;
  for (size_t i = 0; i < s.count; i++) {
    const st_tensor *t = &s.tensors[i];
    if (skip && !strcmp(t->name, skip)) continue;
    json_t *shape = json_array();
    for (int d = 0; d < t->ndim; d++) {
      int dd = (transpose && !strcmp(t->name, transpose) && t->ndim == 2) ? 1 - d : d;
      json_array_append_new(shape, json_integer(t->shape[dd]));
    }
    json_object_set_new(hdr, t->name,
                        json_pack("{s:s, s:o, s:[I, I]}", "dtype", st_dtype_name(t->dtype), "shape", shape, "data_offsets",
                                  (json_int_t)off, (json_int_t)(off + t->nbytes)));
    off += t->nbytes;
  }
  char *text = json_dumps(hdr, JSON_COMPACT);
  uint64_t hlen = strlen(text);
  char p[256];
  path_in(p, sizeof p, "model.safetensors");
  FILE *f = fopen(p, "wb");
  fwrite(&hlen, 8, 1, f);
  fwrite(text, 1, hlen, f);
  for (size_t i = 0; i < s.count; i++) {
    const st_tensor *t = &s.tensors[i];
    if (skip && !strcmp(t->name, skip)) continue;
    fwrite(t->data, 1, t->nbytes, f);
  }
  fclose(f);
  free(text);
  json_decref(hdr);
  st_close(&s);
}

static int try_load(herr *err) {
  model *m = NULL;
  int rc = model_load(tmpdir, NULL, &m, err);
  model_free(m);
  return rc;
}

static void test_intact_copy_loads(void) {
  write_config(NULL, NULL);
  write_weights(NULL, NULL);
  herr err = {0};
  CHECK_MSG(try_load(&err) == 0, "%s", err.msg);
}

static void test_missing_tensor(void) {
  write_config(NULL, NULL);
  write_weights("model.layers.1.mlp.up_proj.weight", NULL);
  herr err = {0};
  CHECK_EQ_INT(try_load(&err), HEARTH_ENOTFOUND);
  CHECK_MSG(strstr(err.msg, "model.layers.1.mlp.up_proj.weight") && strstr(err.msg, "missing"), "%s", err.msg);
  write_weights("lm_head.weight", NULL);
  CHECK_EQ_INT(try_load(&err), HEARTH_ENOTFOUND);
  CHECK_MSG(strstr(err.msg, "lm_head.weight") != NULL, "%s", err.msg);
}

static void test_wrong_shape(void) {
  write_config(NULL, NULL);
  write_weights(NULL, "model.layers.0.mlp.up_proj.weight");
  herr err = {0};
  CHECK_EQ_INT(try_load(&err), HEARTH_EFORMAT);
  CHECK_EQ_STR(err.msg, "model.layers.0.mlp.up_proj.weight: expected shape [128, 64], file has [64, 128]");
}

static void test_unknown_activation(void) {
  write_config("hidden_act", "swiglu9");
  write_weights(NULL, NULL);
  herr err = {0};
  CHECK_EQ_INT(try_load(&err), HEARTH_EUNSUPPORTED);
  CHECK_MSG(strstr(err.msg, "unknown activation 'swiglu9'") != NULL, "%s", err.msg);
}

static void test_unsupported_type(void) {
  write_config("model_type", "mamba");
  write_weights(NULL, NULL);
  herr err = {0};
  CHECK_EQ_INT(try_load(&err), HEARTH_EUNSUPPORTED);
  CHECK_MSG(strstr(err.msg, "unsupported model_type 'mamba'") && strstr(err.msg, "llama"), "%s", err.msg);
}

static void test_no_weights(void) {
  write_config(NULL, NULL);
  char p[256];
  path_in(p, sizeof p, "model.safetensors");
  unlink(p);
  herr err = {0};
  CHECK(try_load(&err) != 0);
  CHECK(err.msg[0] != 0);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/hearth_model_errXXXXXX");
  if (!mkdtemp(tmpdir)) return 1;
  RUN(test_intact_copy_loads);
  RUN(test_missing_tensor);
  RUN(test_wrong_shape);
  RUN(test_unknown_activation);
  RUN(test_unsupported_type);
  RUN(test_no_weights);
  char p[256];
  path_in(p, sizeof p, "config.json");
  unlink(p);
  path_in(p, sizeof p, "model.safetensors");
  unlink(p);
  rmdir(tmpdir);
  TEST_MAIN_END();
}
