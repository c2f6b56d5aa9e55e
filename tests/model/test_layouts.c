/* test_layouts.c — the same weights in the other folder layouts the loader
 * accepts must give transformers' logits: gemma3 and gemma4 multimodal
 * checkpoints (model_type "gemma3" / "gemma4" with the language model in
 * text_config and its tensors under "language_model.model." or
 * "model.language_model.", next to a vision tower the text forward
 * ignores), built here from the golden gemma3_text / gemma4_text fixtures,
 * and a gemma4 config in the older spelling (global_head_dim and
 * num_global_key_value_heads instead of per_layer_config). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "engine/kv_cache.h"
#include "format/safetensors.h"
#include "model/model.h"
#include "test.h"

#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden/"

static void write_renamed(const char *src, const char *path, const char *prefix) {
  st_set s;
  herr err = {0};
  char sp[512];
  snprintf(sp, sizeof sp, GOLDEN "%s", src);
  if (st_open(&s, sp, &err)) return;
  json_t *hdr = json_object();
  size_t off = 0;
  static const float vision[4] = {1, 2, 3, 4};
  for (size_t i = 0; i <= s.count; i++) {
    const char *name = i < s.count ? s.tensors[i].name : "vision_tower.vision_model.embeddings.patch_embedding.weight";
    size_t nbytes = i < s.count ? s.tensors[i].nbytes : sizeof vision;
    char renamed[300];
    if (i < s.count && !strncmp(name, "model.", 6)) snprintf(renamed, sizeof renamed, "%s%s", prefix, name + 6);
    else snprintf(renamed, sizeof renamed, "%s", name);
    json_t *shape = json_array();
    if (i < s.count)
      for (int d = 0; d < s.tensors[i].ndim; d++) json_array_append_new(shape, json_integer(s.tensors[i].shape[d]));
    else
      json_array_append_new(shape, json_integer(2)), json_array_append_new(shape, json_integer(2));
    json_object_set_new(hdr, renamed, json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape, "data_offsets",
                                               (json_int_t)off, (json_int_t)(off + nbytes)));
    off += nbytes;
  }
  char *text = json_dumps(hdr, JSON_COMPACT);
  size_t hlen = strlen(text);
  size_t padded = (hlen + 7) / 8 * 8;
  uint64_t hl = padded;
  FILE *f = fopen(path, "wb");
  fwrite(&hl, 8, 1, f);
  fwrite(text, 1, hlen, f);
  for (size_t p = hlen; p < padded; p++) fputc(' ', f);
  for (size_t i = 0; i < s.count; i++) fwrite(s.tensors[i].data, 1, s.tensors[i].nbytes, f);
  fwrite(vision, 1, sizeof vision, f);
  fclose(f);
  free(text);
  json_decref(hdr);
  st_close(&s);
}

/* top: "gemma3" / "gemma4" wraps the fixture's config as text_config; NULL keeps it as it is.
 * old_gemma4: per_layer_config respelled as global_head_dim / num_global_key_value_heads. */
static void write_config(const char *src, const char *path, const char *top_type, bool old_gemma4) {
  herr err = {0};
  char sp[512];
  snprintf(sp, sizeof sp, GOLDEN "%s/config.json", src);
  json_t *text = hjson_load_file(sp, &err);
  if (old_gemma4) {
    json_t *plc = json_object_get(text, "per_layer_config");
    const char *k;
    json_t *v;
    json_object_foreach(plc, k, v) {
      json_object_set(text, "global_head_dim", json_object_get(v, "head_dim"));
      if (json_object_get(v, "num_key_value_heads")) json_object_set(text, "num_global_key_value_heads", json_object_get(v, "num_key_value_heads"));
    }
    json_object_del(text, "per_layer_config");
  }
  json_t *top = text;
  if (top_type) {
    json_object_del(text, "eos_token_id");
    top = json_pack("{s:s, s:o, s:{s:s, s:i}, s:[i, i], s:i}", "model_type", top_type, "text_config", text, "vision_config",
                    "model_type", "siglip_vision_model", "hidden_size", 16, "eos_token_id", 2, 106, "mm_tokens_per_image", 4);
  }
  json_dump_file(top, path, JSON_INDENT(1));
  json_decref(top);
}

static void check_layout(const char *src, const char *top_type, const char *text_type, const char *prefix, bool old_gemma4) {
  char dir[] = "/tmp/hearth_layout_XXXXXX";
  if (!mkdtemp(dir)) return;
  char cp[128], wp[128], gp[512], lp[512];
  snprintf(cp, sizeof cp, "%s/config.json", dir);
  snprintf(wp, sizeof wp, "%s/model.safetensors", dir);
  snprintf(gp, sizeof gp, GOLDEN "%s/golden.json", src);
  snprintf(lp, sizeof lp, GOLDEN "%s/logits_f32.bin", src);
  write_config(src, cp, top_type, old_gemma4);
  write_renamed(src, wp, prefix);
  herr err = {0};
  model *m = NULL;
  int rc = model_load(dir, NULL, &m, &err);
  CHECK_MSG(rc == 0, "%s %s: %s", src, prefix, err.msg);
  json_t *doc = hjson_load_file(gp, &err);
  FILE *lf = fopen(lp, "rb");
  if (!rc && doc && lf) {
    const model_config *c = model_cfg(m);
    CHECK_EQ_STR(c->model_type, text_type);
    if (top_type) {
      CHECK_EQ_INT(c->n_eos, 2);
      CHECK_EQ_INT(c->eos_token_ids[1], 106);
    }
    json_t *p1 = json_array_get(json_object_get(doc, "prompts"), 1);
    json_t *p0 = json_array_get(json_object_get(doc, "prompts"), 0);
    int n0 = (int)json_array_size(p0), n = (int)json_array_size(p1);
    int32_t ids[64];
    for (int i = 0; i < n && i < 64; i++) ids[i] = (int32_t)json_integer_value(json_array_get(p1, i));
    int64_t V = model_vocab_size(m);
    float *ref = malloc(sizeof(float) * (size_t)((n0 + n) * V)), *got = malloc(sizeof(float) * (size_t)(n * V));
    CHECK(fread(ref, sizeof(float), (size_t)((n0 + n) * V), lf) == (size_t)((n0 + n) * V));
    model_kv_geometry geo;
    model_kv_geometry_of(m, &geo);
    kv_cache *cache = NULL;
    kv_seq *s = NULL;
    CHECK(kv_cache_new(&geo, 0, &cache, &err) == 0);
    CHECK(kv_cache_seq_new(cache, &s, &err) == 0);
    model_seq sq = {.kv = s, .tokens = ids, .n_tokens = n, .all_logits = true};
    model_batch b = {&sq, 1};
    CHECK(model_forward(m, &b, got, &err) == 0);
    double worst = 0;
    for (int64_t i = 0; i < n * V; i++) {
      double e = fabs((double)got[i] - ref[(size_t)n0 * V + i]);
      if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
    CHECK_MSG(worst <= 1e-4, "%s as %s (%s%s): max abs error %g", src, top_type ? top_type : text_type, prefix,
              old_gemma4 ? ", global_head_dim" : "", worst);
    free(ref), free(got);
    kv_cache_seq_free(s);
    kv_cache_free(cache);
  }
  if (lf) fclose(lf);
  json_decref(doc);
  model_free(m);
  unlink(cp);
  unlink(wp);
  rmdir(dir);
}

static void test_gemma3_multimodal_checkpoint(void) {
  check_layout("gemma3-f32", "gemma3", "gemma3_text", "language_model.model.", false);
  check_layout("gemma3-f32", "gemma3", "gemma3_text", "model.language_model.", false);
}

static void test_gemma4_multimodal_checkpoint(void) {
  check_layout("gemma4-f32", "gemma4", "gemma4_text", "model.language_model.", false);
  check_layout("gemma4_moe-f32", "gemma4", "gemma4_text", "model.language_model.", false);
}

static void test_gemma4_global_head_dim(void) {
  check_layout("gemma4-f32", NULL, "gemma4_text", "model.", true);
  check_layout("gemma4_moe-f32", NULL, "gemma4_text", "model.", true);
}

static void test_gemma3_without_text_config(void) {
  char dir[] = "/tmp/hearth_layout_XXXXXX";
  if (!mkdtemp(dir)) return;
  char cp[128];
  snprintf(cp, sizeof cp, "%s/config.json", dir);
  FILE *f = fopen(cp, "w");
  fputs("{\"model_type\": \"gemma3\", \"vision_config\": {}}", f);
  fclose(f);
  herr err = {0};
  model *m = NULL;
  CHECK_EQ_INT(model_load(dir, NULL, &m, &err), HEARTH_EFORMAT);
  CHECK_MSG(strstr(err.msg, "text_config") != NULL, "%s", err.msg);
  unlink(cp);
  rmdir(dir);
}

int main(void) {
  RUN(test_gemma3_multimodal_checkpoint);
  RUN(test_gemma3_without_text_config);
  RUN(test_gemma4_multimodal_checkpoint);
  RUN(test_gemma4_global_head_dim);
  TEST_MAIN_END();
}
