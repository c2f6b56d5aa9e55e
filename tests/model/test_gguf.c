/* test_gguf.c — a llama model read from a GGUF file (llama-2-tiny-random.gguf,
 * F16 + F32, written by tools/gen_random_gguf.c llama2-tiny before the tests):
 * greedy decoding of [1, 15043, 3186] must give the ids that
 * tools/ref_llama_gguf.py gives for that file (a plain-Python forward with
 * llama.cpp's conventions; on the earlier llama.cpp-made fixture it printed
 * llama.cpp's own ids), which also checks that llama.cpp's q/k row permutation
 * is undone.
 * Also: the GGUF path agrees with the same weights from safetensors, and
 * unsupported GGUF content is refused with a message. */
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

#define TINY HEARTH_TINY_GGUF

static int argmax(const float *x, int64_t n) {
  int best = 0;
  for (int64_t i = 1; i < n; i++)
    if (x[i] > x[best]) best = (int)i;
  return best;
}

static void test_tiny_llama_greedy(void) {
  herr err = {0};
  model *m = NULL;
  int rc = model_load(TINY, &(model_load_opts){.device = test_device()}, &m, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (rc) return;
  const model_config *c = model_cfg(m);
  CHECK_EQ_STR(c->model_type, "llama");
  CHECK_EQ_INT(c->vocab_size, 32000);
  CHECK_EQ_INT(c->hidden_size, 8);
  CHECK_EQ_INT(c->num_hidden_layers, 1);
  CHECK(!c->tie_word_embeddings);
  model_kv_geometry geo;
  model_kv_geometry_of(m, &geo);
  kv_cache *cache = NULL;
  kv_seq *s = NULL;
  CHECK(kv_cache_new(&geo, 64, &cache, &err) == 0);
  CHECK(kv_cache_seq_new(cache, &s, &err) == 0);
  int64_t V = model_vocab_size(m);
  float *logits = malloc(sizeof(float) * (size_t)V);
  int32_t prompt[3] = {1, 15043, 3186};
  static const int32_t want[8] = {23329, 30286, 10349, 423, 7465, 23542, 6765, 2458}; /* tools/ref_llama_gguf.py */
  model_seq sq = {.kv = s, .tokens = prompt, .n_tokens = 3};
  model_batch b = {&sq, 1};
  CHECK(model_forward(m, &b, logits, &err) == 0);
  for (int i = 0; i < 8; i++) {
    int32_t next = argmax(logits, V);
    CHECK_MSG(next == want[i], "step %d: got %d, the reference gives %d", i, next, want[i]);
    model_seq d = {.kv = s, .tokens = &want[i], .n_tokens = 1};
    model_batch bd = {&d, 1};
    CHECK(model_forward(m, &bd, logits, &err) == 0);
  }
  free(logits);
  kv_cache_seq_free(s);
  kv_cache_free(cache);
  model_free(m);
}


/* ---- a GGUF writer for the conversion test ---- */

static void put_str(FILE *f, const char *s) {
  uint64_t n = strlen(s);
  fwrite(&n, 8, 1, f);
  fwrite(s, 1, n, f);
}
static void kv_u32(FILE *f, const char *k, uint32_t v) {
  uint32_t t = 4;
  put_str(f, k), fwrite(&t, 4, 1, f), fwrite(&v, 4, 1, f);
}
static void kv_f32(FILE *f, const char *k, float v) {
  uint32_t t = 6;
  put_str(f, k), fwrite(&t, 4, 1, f), fwrite(&v, 4, 1, f);
}
static void kv_str(FILE *f, const char *k, const char *v) {
  uint32_t t = 8;
  put_str(f, k), fwrite(&t, 4, 1, f), put_str(f, v);
}

/* llama.cpp's conversion of a Hugging Face q/k weight (convert_hf_to_gguf.py,
 * LlamaModel.permute): w.reshape(heads, 2, hd/2, in).swapaxes(1, 2).reshape(w.shape). */
static void llama_cpp_permute(float *out, const float *w, int64_t rows, int64_t cols, int64_t heads) {
  int64_t hd = rows / heads, half = hd / 2;
  for (int64_t h = 0; h < heads; h++)
    for (int64_t s = 0; s < 2; s++)
      for (int64_t i = 0; i < half; i++)
        memcpy(out + (h * hd + i * 2 + s) * cols, w + (h * hd + s * half + i) * cols, sizeof(float) * (size_t)cols);
}

static const struct { const char *hf, *gg; } names[] = {
    {"model.embed_tokens.weight", "token_embd.weight"}, {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"}, {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"}, {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"}, {"self_attn.o_proj.weight", "attn_output.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"}, {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"}, {"mlp.down_proj.weight", "ffn_down.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"}, {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"}, {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
};

static void gguf_name_of(const char *hf, char *out, size_t n) {
  int l = -1, used = 0;
  const char *rest = hf;
  if (sscanf(hf, "model.layers.%d.%n", &l, &used) == 1 && used) rest = hf + used;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(rest, names[i].hf)) {
      if (l >= 0) snprintf(out, n, "blk.%d.%s", l, names[i].gg);
      else snprintf(out, n, "%s", names[i].gg);
      return;
    }
  snprintf(out, n, "unknown.%s", hf);
}

/* One tensor of the GGUF being written. */
typedef struct out_tensor {
  char name[128];
  int ndim;
  int64_t shape[3];   /* Hugging Face order */
  void *blob;         /* owned */
  size_t size;
  uint32_t type;
} out_tensor;

/* Converts golden folder NAME (f32 safetensors) into a GGUF the way
 * llama.cpp's converter does: metadata under the architecture's prefix,
 * tensors renamed, for llama the q/k rows permuted, and for qwen3moe each
 * layer's experts stacked into ffn_{gate,up,down}_exps [experts, rows,
 * cols] (the router, ffn_gate_inp, stays f32 as llama.cpp's quantizer
 * leaves it). */
static int write_gguf(const char *path, const char *name, const char *arch, int qtype) {
  char dir[512], cfgp[600];
  snprintf(dir, sizeof dir, HEARTH_SOURCE_DIR "/tests/fixtures/golden/%s", name);
  snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
  st_set st;
  herr err = {0};
  json_t *cfg = hjson_load_file(cfgp, &err);
  if (!cfg || st_open(&st, dir, &err)) {
    json_decref(cfg);
    return -1;
  }
  bool moe = !strcmp(arch, "qwen3moe");
  int64_t heads = json_integer_value(json_object_get(cfg, "num_attention_heads"));
  int64_t kvh = json_integer_value(json_object_get(cfg, "num_key_value_heads"));
  int64_t hd = json_integer_value(json_object_get(cfg, "head_dim"));
  int64_t n_exp = json_integer_value(json_object_get(cfg, "num_local_experts"));
  if (!hd) hd = json_integer_value(json_object_get(cfg, "hidden_size")) / heads;
  double theta = json_number_value(json_object_get(json_object_get(cfg, "rope_parameters"), "rope_theta"));
  /* the tensors: bytes first (quantized matrices change sizes), then infos, then data */
  bool llama = !strcmp(arch, "llama");
  out_tensor *ot = calloc(st.count, sizeof *ot);
  size_t n_out = 0;
  for (size_t i = 0; i < st.count; i++) {
    const st_tensor *t = &st.tensors[i];
    out_tensor *o = &ot[n_out];
    int l = -1, e = -1, used = 0;
    char kind[32] = "";
    bool expert = sscanf(t->name, "model.layers.%d.mlp.experts.%d.%31[a-z_].weight%n", &l, &e, kind, &used) == 3 && used;
    if (expert && e != 0) continue; /* stacked with expert 0 */
    o->ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) o->shape[d] = t->shape[d];
    float *p;
    if (expert) {
      snprintf(o->name, sizeof o->name, "blk.%d.ffn_%s_exps.weight", l, !strcmp(kind, "gate_proj") ? "gate" : !strcmp(kind, "up_proj") ? "up" : "down");
      o->ndim = 3;
      o->shape[0] = n_exp, o->shape[1] = t->shape[0], o->shape[2] = t->shape[1];
      p = malloc(t->nbytes * (size_t)n_exp);
      for (int x = 0; x < n_exp; x++) {
        char en[160];
        snprintf(en, sizeof en, "model.layers.%d.mlp.experts.%d.%s.weight", l, x, kind);
        const st_tensor *te = st_find(&st, en);
        memcpy((char *)p + (size_t)x * t->nbytes, te->data, t->nbytes);
      }
    } else {
      if (moe && strstr(t->name, "mlp.gate.weight")) snprintf(o->name, sizeof o->name, "blk.%d.ffn_gate_inp.weight", (sscanf(t->name, "model.layers.%d.", &l), l));
      else gguf_name_of(t->name, o->name, sizeof o->name);
      float *w = malloc(t->nbytes);
      p = malloc(t->nbytes);
      memcpy(w, t->data, t->nbytes);
      bool q = strstr(t->name, "q_proj.weight") != NULL, k = strstr(t->name, "k_proj.weight") != NULL;
      if (llama && (q || k)) llama_cpp_permute(p, w, t->shape[0], t->shape[1], q ? heads : kvh);
      else memcpy(p, w, t->nbytes);
      free(w);
    }
    int64_t rows = o->ndim == 3 ? o->shape[0] * o->shape[1] : o->ndim == 2 ? o->shape[0] : 1, cols = o->shape[o->ndim - 1];
    size_t bytes = (size_t)(rows * cols) * sizeof(float);
    if (qtype == 8 && o->ndim >= 2 && !strstr(o->name, "ffn_gate_inp")) { /* Q8_0 rows, quantized after the permutation as llama.cpp does */
      o->size = (size_t)(rows * cols / 32 * 34);
      o->blob = malloc(o->size);
      bk_quantize(BK_Q8_0, p, rows, cols, o->blob, &err);
      o->type = 8;
      free(p);
    } else {
      o->blob = p;
      o->size = bytes;
    }
    n_out++;
  }
  FILE *f = fopen(path, "wb");
  uint32_t ver = 3;
  uint64_t nt = n_out, nkv = moe ? 15 : 12;
  fwrite("GGUF", 1, 4, f), fwrite(&ver, 4, 1, f), fwrite(&nt, 8, 1, f), fwrite(&nkv, 8, 1, f);
  char key[128];
#define K(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
  kv_str(f, "general.architecture", arch);
  kv_u32(f, K("context_length"), (uint32_t)json_integer_value(json_object_get(cfg, "max_position_embeddings")));
  kv_u32(f, K("embedding_length"), (uint32_t)json_integer_value(json_object_get(cfg, "hidden_size")));
  kv_u32(f, K("block_count"), (uint32_t)json_integer_value(json_object_get(cfg, "num_hidden_layers")));
  kv_u32(f, K("feed_forward_length"), (uint32_t)json_integer_value(json_object_get(cfg, "intermediate_size")));
  kv_u32(f, K("rope.dimension_count"), (uint32_t)hd);
  kv_u32(f, K("attention.head_count"), (uint32_t)heads);
  kv_u32(f, K("attention.head_count_kv"), (uint32_t)kvh);
  kv_u32(f, K("attention.key_length"), (uint32_t)hd);
  kv_f32(f, K("attention.layer_norm_rms_epsilon"), (float)json_number_value(json_object_get(cfg, "rms_norm_eps")));
  kv_f32(f, K("rope.freq_base"), (float)theta);
  kv_u32(f, K("vocab_size"), (uint32_t)json_integer_value(json_object_get(cfg, "vocab_size")));
  if (moe) {
    kv_u32(f, K("expert_count"), (uint32_t)n_exp);
    kv_u32(f, K("expert_used_count"), (uint32_t)json_integer_value(json_object_get(cfg, "num_experts_per_tok")));
    kv_u32(f, K("expert_feed_forward_length"), (uint32_t)json_integer_value(json_object_get(cfg, "moe_intermediate_size")));
  }
#undef K
  uint64_t off = 0;
  for (size_t i = 0; i < n_out; i++) {
    put_str(f, ot[i].name);
    uint32_t nd = (uint32_t)ot[i].ndim;
    fwrite(&nd, 4, 1, f);
    for (int d = ot[i].ndim - 1; d >= 0; d--) {
      uint64_t dim = (uint64_t)ot[i].shape[d];
      fwrite(&dim, 8, 1, f);
    }
    fwrite(&ot[i].type, 4, 1, f);
    fwrite(&off, 8, 1, f);
    off += (ot[i].size + 31) / 32 * 32;
  }
  long pos = ftell(f);
  for (; pos % 32; pos++) fputc(0, f);
  for (size_t i = 0; i < n_out; i++) {
    fwrite(ot[i].blob, 1, ot[i].size, f);
    for (size_t pad = ot[i].size; pad % 32; pad++) fputc(0, f);
    free(ot[i].blob);
  }
  free(ot);
  fclose(f);
  st_close(&st);
  json_decref(cfg);
  return 0;
}

/* A golden model converted to GGUF as llama.cpp converts it gives transformers' logits. */
static void check_converted(const char *name, const char *arch, int upto, int qtype, double tol) {
  char path[] = "/tmp/hearth_gguf_conv_XXXXXX.gguf";
  int fd = mkstemps(path, 5);
  if (fd < 0) return;
  close(fd);
  CHECK(write_gguf(path, name, arch, qtype) == 0);
  herr err = {0};
  model *m = NULL;
  int rc = model_load(path, &(model_load_opts){.device = test_device()}, &m, &err);
  CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
  char gp[512], lp[512];
  snprintf(gp, sizeof gp, HEARTH_SOURCE_DIR "/tests/fixtures/golden/%s/golden.json", name);
  snprintf(lp, sizeof lp, HEARTH_SOURCE_DIR "/tests/fixtures/golden/%s/logits_f32.bin", name);
  json_t *doc = hjson_load_file(gp, &err);
  FILE *lf = fopen(lp, "rb");
  if (!rc && doc && lf) {
    CHECK_EQ_STR(model_cfg(m)->model_type, json_string_value(json_object_get(doc, "model_type")));
    json_t *p0 = json_array_get(json_object_get(doc, "prompts"), 0);
    int n = (int)json_array_size(p0);
    int32_t ids[64];
    for (int i = 0; i < n && i < 64; i++) ids[i] = (int32_t)json_integer_value(json_array_get(p0, i));
    int64_t V = model_vocab_size(m);
    float *ref = malloc(sizeof(float) * (size_t)(n * V)), *got = malloc(sizeof(float) * (size_t)(n * V));
    CHECK(fread(ref, sizeof(float), (size_t)(n * V), lf) == (size_t)(n * V));
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
    for (int64_t i = 0; i < (upto && upto < n ? upto : n) * V; i++) {
      double e = fabs((double)got[i] - ref[i]);
      if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
    CHECK_MSG(worst <= tol, "%s converted to GGUF (%s, type %d): max abs error %g", name, arch, qtype, worst);
    if (model_expert_bytes(m) > 0) { /* experts read in from the file on use (repacked as at load): the same logits */
      model *mb = NULL;
      int64_t budget = model_expert_bytes(m) / 8;
      CHECK(model_load(path, &(model_load_opts){.device = test_device(), .expert_budget = budget}, &mb, &err) == 0 ||
            !bk_backend_is_cpu(model_backend(m)));
      if (mb) {
        float *again = malloc(sizeof(float) * (size_t)(n * V));
        kv_seq *s2 = NULL;
        model_kv_geometry geo2;
        model_kv_geometry_of(mb, &geo2);
        kv_cache *c2 = NULL;
        CHECK(kv_cache_new(&geo2, 0, &c2, &err) == 0 && kv_cache_seq_new(c2, &s2, &err) == 0);
        model_seq sq2 = {.kv = s2, .tokens = ids, .n_tokens = n, .all_logits = true};
        model_batch b2 = {&sq2, 1};
        CHECK(model_forward(mb, &b2, again, &err) == 0);
        CHECK_MSG(memcmp(again, got, sizeof(float) * (size_t)(n * V)) == 0, "%s (type %d): logits differ under an expert budget",
                  name, qtype);
        model_expert_stats xs;
        model_expert_stats_of(mb, &xs);
        CHECK(xs.resident <= budget && xs.evictions > 0);
        free(again);
        kv_cache_seq_free(s2);
        kv_cache_free(c2);
        model_free(mb);
      }
    }
    fprintf(stderr, "  %s as GGUF %s type %d: max abs error %.3g\n", name, arch, qtype, worst);
    free(ref), free(got);
    kv_cache_seq_free(s);
    kv_cache_free(cache);
  }
  if (lf) fclose(lf);
  json_decref(doc);
  model_free(m);
  remove(path);
}

static void test_converted_llama_matches_golden(void) {
  check_converted("llama-f32", "llama", 0, 0, 1e-4);
  check_converted("llama-f32", "llama", 0, 8, 0.1); /* Q8_0 matrices: quantization error only */
}
static void test_converted_qwen_matches_golden(void) {
  /* q/k/v biases, MQA; GGUF carries no sliding window, so only the first
   * 8 positions (the fixture's window) agree with transformers */
  check_converted("qwen2-f32", "qwen2", 8, 0, 1e-4);
  check_converted("qwen3-f32", "qwen3", 0, 0, 1e-4); /* q/k norms, head_dim 32, tied */
  check_converted("qwen3-f32", "qwen3", 0, 8, 1.0);
}
static void test_converted_qwen3moe_matches_golden(void) {
  /* experts stacked into ffn_*_exps, router ffn_gate_inp; quantized experts multiply through the same paths */
  check_converted("qwen3_moe-f32", "qwen3moe", 0, 0, 1e-4);
  check_converted("qwen3_moe-f32", "qwen3moe", 0, 8, 1.0);
}

static void test_bad_gguf(void) {
  herr err = {0};
  model *m = NULL;
  CHECK(model_load(HEARTH_SOURCE_DIR "/no/such/file.gguf", NULL, &m, &err) != 0);
  CHECK(m == NULL);
  CHECK(strstr(err.msg, "file.gguf") != NULL);
  /* a GGUF whose architecture is not llama */
  char path[] = "/tmp/hearth_gguf_XXXXXX.gguf";
  int fd = mkstemps(path, 5);
  if (fd < 0) return;
  FILE *f = fdopen(fd, "wb");
  /* header: magic, version 3, 0 tensors, 1 kv: general.architecture = "mamba" */
  const char *key = "general.architecture", *val = "mamba";
  uint32_t ver = 3, type = 8;
  uint64_t nt = 0, nkv = 1, kl = strlen(key), vl = strlen(val);
  fwrite("GGUF", 1, 4, f);
  fwrite(&ver, 4, 1, f);
  fwrite(&nt, 8, 1, f);
  fwrite(&nkv, 8, 1, f);
  fwrite(&kl, 8, 1, f);
  fwrite(key, 1, kl, f);
  fwrite(&type, 4, 1, f);
  fwrite(&vl, 8, 1, f);
  fwrite(val, 1, vl, f);
  fclose(f);
  CHECK_EQ_INT(model_load(path, NULL, &m, &err), HEARTH_EUNSUPPORTED);
  CHECK_MSG(strstr(err.msg, "mamba") != NULL, "%s", err.msg);
  remove(path);
}

int main(void) {
  test_device_or_skip();
  RUN(test_tiny_llama_greedy);
  RUN(test_converted_llama_matches_golden);
  RUN(test_converted_qwen_matches_golden);
  RUN(test_converted_qwen3moe_matches_golden);
  RUN(test_bad_gguf);
  TEST_MAIN_END();
}
