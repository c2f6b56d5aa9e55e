/* test_spec_mtp.c — speculative decoding with the model's multi-token-
 * prediction layer (engine/method.h SPEC_MTP) on the GLM-5 fixture, whose
 * weights hold one (model.layers.3.*: eh_proj, enorm, hnorm, shared_head and
 * a decoder layer).
 *
 * The MTP forward against a reference made another way: the layer's input
 * rows eh_proj([enorm(embed(t_{i+1})) | hnorm(h_i)]) computed here on the
 * host from the raw weights (h_i: the model's final hidden states, from a
 * plain MODEL_OUT_HIDDEN_ALL forward), then fed as input embeddings to a
 * one-layer GLM-5 written here whose layer is the MTP layer's weights,
 * final norm its shared_head.norm and head its shared_head.head: its logits
 * (and final hidden states) at every row must be the MTP forward's.
 *
 * A run decoded by hand (a prompt longer than the layer's catch-up chunk):
 * at every step its drafts are what the layer gives over the whole history
 * computed afresh (so rejected positions' hidden
 * states and the layer's chain rows are dropped as they should be).
 *
 * Greedy in the scheduler: MTP-drafted requests (several prompts and draft
 * lengths) beside plain and prompt-lookup ones in the same steps, each equal
 * token for token to plain decoding alone (sched_alone.h); drafts are made and the stats
 * count them under "mtp" — also in a KV pool so small that requests are
 * preempted, and with the tokens chosen by bk_sample. With random weights
 * few drafts are kept, so a second model is written whose decoder layers add
 * nothing (each token's logits are its embedding's) and whose MTP layer
 * passes the embedding through (eh_proj = [I | 0], no attention or expert
 * output, shared_head = the model's norm and head): its drafts are the
 * target's own next tokens, and nearly every draft must be kept — with the
 * output still exactly plain decoding's; sampled requests, which draft from
 * the layer's distribution, keep nearly every draft there too.
 *
 * Qwen3.5 and Qwen3.5-MoE (the committed fixtures plus an mtp.* layer
 * written here): the MTP forward against a one-layer model of the fixture's
 * kind made of mtp.layers.0, mtp.norm and the lm_head, fed the rows
 * fc([norm_e(embed(t_{i+1})) | norm_h(h_i)]) computed on the host with the
 * (1 + w) norms; greedy MTP drafting in the scheduler on the hybrid (its
 * recurrent state rewound after rejections) equal to plain decoding, drafts
 * counted under "mtp"; with a copying MTP layer nearly every draft is kept.
 *
 * Refusals: a model without an MTP layer refuses the method at load
 * (gen_method_check) and a request naming it (spec_method "mtp", field
 * spec_method), as a request naming "draft" without a draft model. */
#include <math.h>
#include <pthread.h>
#include <unistd.h>

#include "base/json.h"
#include "engine/request.h"
#include "sched_alone.h"
#include "engine/kv_cache.h"
#include "engine/kv_paged.h"
#include "engine/method.h"
#include "engine/sched.h"
#include "format/safetensors.h"
#include "format/safetensors_write.h"
#include "model/model.h"
#include "test.h"
#include "test_device.h"

#define GLM5 HEARTH_SOURCE_DIR "/tests/fixtures/golden/glm5-f32"
#define LLAMA HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-f32"
#define QWEN35 HEARTH_SOURCE_DIR "/tests/fixtures/golden/qwen3_5-f32"
#define QWEN35_MOE HEARTH_SOURCE_DIR "/tests/fixtures/golden/qwen3_5_moe-f32"

static model *g_glm5_fresh; /* the fixture with a longer context (test_proposals_fresh) */

static model *load(const char *dir) {
  model *m = NULL;
  herr e = {0};
  model_load_opts mo = {.threads = 2, .device = test_device()};
  if (model_load(dir, &mo, &m, &e)) fprintf(stderr, "%s: %s\n", dir, e.msg);
  return m;
}

/* ---- model variants written from the fixture ---- */

typedef struct variant {
  st_set st;
  st_writer *w;
  float **owned;
  int n_owned;
} variant;

static const st_tensor *tensor(variant *v, const char *name) {
  const st_tensor *t = st_find(&v->st, name);
  if (!t) fprintf(stderr, "fixture: no tensor %s\n", name);
  return t;
}

/* name from the fixture's src (its data), or a copy scaled by mul (0: zeros) */
static void put(variant *v, const char *name, const char *src, float mul) {
  const st_tensor *t = tensor(v, src);
  if (!t) return;
  const void *data = t->data;
  if (mul != 1.0f) {
    float *d = malloc(sizeof(float) * (size_t)t->numel);
    for (int64_t i = 0; i < t->numel; i++) d[i] = ((const float *)t->data)[i] * mul;
    v->owned = realloc(v->owned, sizeof(float *) * (size_t)(v->n_owned + 1));
    v->owned[v->n_owned++] = d;
    data = d;
  }
  st_writer_tensor(v->w, name, t->dtype, t->ndim, t->shape, data);
}

static void put_data(variant *v, const char *name, int ndim, const int64_t *shape, float *data) {
  v->owned = realloc(v->owned, sizeof(float *) * (size_t)(v->n_owned + 1));
  v->owned[v->n_owned++] = data;
  st_writer_tensor(v->w, name, ST_F32, ndim, shape, data);
}

static bool ends_with(const char *s, const char *tail) {
  size_t a = strlen(s), b = strlen(tail);
  return a >= b && !strcmp(s + a - b, tail);
}

/* Writes dir/model.safetensors and dir/config.json (the fixture's with the changes `patch` makes). */
static int variant_write(variant *v, const char *dir, json_t *cfg) {
  herr e = {0};
  char path[600];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  int rc = st_writer_write(v->w, path, NULL, NULL, &e);
  if (rc) fprintf(stderr, "%s: %s\n", path, e.msg);
  snprintf(path, sizeof path, "%s/config.json", dir);
  if (!rc && json_dump_file(cfg, path, JSON_INDENT(1))) rc = 1;
  st_writer_free(v->w);
  for (int i = 0; i < v->n_owned; i++) free(v->owned[i]);
  free(v->owned);
  st_close(&v->st);
  return rc;
}

/* The reference: one GLM-5 layer made of the MTP layer's weights (as layer 0, with its indexer and
 * experts), the final norm its shared_head.norm, the head its shared_head.head. */
static int write_reference(const char *dir) {
  variant v = {0};
  herr e = {0};
  if (st_open(&v.st, GLM5, &e)) return fprintf(stderr, "%s\n", e.msg), 1;
  v.w = st_writer_new();
  put(&v, "model.embed_tokens.weight", "model.embed_tokens.weight", 1);
  put(&v, "model.norm.weight", "model.layers.3.shared_head.norm.weight", 1);
  put(&v, "lm_head.weight", "model.layers.3.shared_head.head.weight", 1);
  for (size_t i = 0; i < v.st.count; i++) {
    const char *n = v.st.tensors[i].name;
    if (strncmp(n, "model.layers.3.", 15) || strstr(n, "eh_proj") || strstr(n, "enorm") || strstr(n, "hnorm") ||
        strstr(n, "shared_head"))
      continue;
    char name[256];
    snprintf(name, sizeof name, "model.layers.0.%s", n + 15);
    put(&v, name, n, 1);
  }
  json_t *cfg = hjson_load_file(GLM5 "/config.json", &e);
  if (!cfg) return 1;
  json_object_set_new(cfg, "num_hidden_layers", json_integer(1));
  json_object_set_new(cfg, "num_nextn_predict_layers", json_integer(0));
  json_object_set_new(cfg, "first_k_dense_replace", json_integer(0));
  json_object_set_new(cfg, "indexer_types", json_pack("[s]", "full"));
  json_object_set_new(cfg, "mlp_layer_types", json_pack("[s]", "sparse"));
  json_object_set_new(cfg, "layer_types", json_pack("[s]", "deepseek_sparse_attention"));
  int rc = variant_write(&v, dir, cfg);
  json_decref(cfg);
  return rc;
}

/* The copying model: decoder layers whose attention and feed-forward add nothing, and an MTP layer
 * that passes the embedding of its token through to the model's own norm and head. */
static int write_copying(const char *dir) {
  variant v = {0};
  herr e = {0};
  if (st_open(&v.st, GLM5, &e)) return fprintf(stderr, "%s\n", e.msg), 1;
  v.w = st_writer_new();
  for (size_t i = 0; i < v.st.count; i++) {
    const char *n = v.st.tensors[i].name;
    if (strstr(n, "shared_head") || strstr(n, "eh_proj") || strstr(n, "enorm")) continue;
    bool silent = ends_with(n, "self_attn.o_proj.weight") || ends_with(n, "down_proj.weight");
    put(&v, n, n, silent ? 0.0f : 1.0f);
  }
  const st_tensor *emb = tensor(&v, "model.embed_tokens.weight");
  int64_t D = emb ? emb->shape[1] : 0;
  float *eh = calloc((size_t)(D * 2 * D), sizeof(float)), *ones = malloc(sizeof(float) * (size_t)D);
  for (int64_t i = 0; i < D; i++) eh[i * 2 * D + i] = 1.0f, ones[i] = 1.0f;
  put_data(&v, "model.layers.3.eh_proj.weight", 2, (int64_t[]){D, 2 * D}, eh);
  put_data(&v, "model.layers.3.enorm.weight", 1, (int64_t[]){D}, ones);
  put(&v, "model.layers.3.shared_head.norm.weight", "model.norm.weight", 1);
  put(&v, "model.layers.3.shared_head.head.weight", "lm_head.weight", 1);
  json_t *cfg = hjson_load_file(GLM5 "/config.json", &e);
  if (!cfg) return 1;
  int rc = variant_write(&v, dir, cfg);
  json_decref(cfg);
  return rc;
}

/* The fixture with a longer context (for a prompt longer than the layer's catch-up chunk). */
static int write_long(const char *dir) {
  herr e = {0};
  char path[600];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  if (symlink(GLM5 "/model.safetensors", path)) return 1;
  json_t *cfg = hjson_load_file(GLM5 "/config.json", &e);
  if (!cfg) return 1;
  json_object_set_new(cfg, "max_position_embeddings", json_integer(1024));
  snprintf(path, sizeof path, "%s/config.json", dir);
  int rc = json_dump_file(cfg, path, JSON_INDENT(1)) ? 1 : 0;
  json_decref(cfg);
  return rc;
}

/* ---- the MTP forward against the reference ---- */

static void rmsnorm_host(float *y, const float *x, const float *w, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
  float r = (float)(1.0 / sqrt(ss / (double)n + eps));
  for (int64_t i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

static double max_abs(const float *a, const float *b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (!(d <= m)) m = d; /* NaN wins */
  }
  return m;
}

/* The MTP forward over rows (t_{i+1}, h_i) at positions 0..n-1, fed in two pieces (5, then the
 * rest) into a cache of its own (*mc, *ms, the caller frees): logits [n, V] and hidden states [n, D]. */
static void mtp_forward_pieces(model *m, const int32_t *toks, const float *h, int n, kv_cache **mc, kv_seq **ms, float *lg,
                               float *hid) {
  herr e = {0};
  int64_t V = model_vocab_size(m), D = model_cfg(m)->hidden_size;
  model_kv_geometry mg;
  model_mtp_geometry_of(m, &mg);
  CHECK_EQ_INT(kv_cache_new(&mg, 0, mc, &e), 0);
  CHECK_EQ_INT(kv_cache_seq_new(*mc, ms, &e), 0);
  int64_t *pos = malloc(sizeof(int64_t) * (size_t)n);
  for (int i = 0; i < n; i++) pos[i] = i;
  int first = 5;
  model_seq m1 = {.kv = *ms, .tokens = toks + 1, .n_tokens = first, .positions = pos, .all_logits = true,
                  .mtp_hidden = h, .next_hidden = hid};
  CHECK_EQ_INT(model_forward(m, &(model_batch){.seqs = &m1, .n_seqs = 1}, lg, &e), 0);
  model_seq m2 = {.kv = *ms, .tokens = toks + 1 + first, .n_tokens = n - first, .positions = pos + first,
                  .all_logits = true, .mtp_hidden = h + first * D, .next_hidden = hid + first * D};
  CHECK_EQ_INT(model_forward(m, &(model_batch){.seqs = &m2, .n_seqs = 1}, lg + first * V, &e), 0);
  free(pos);
}

/* Checks the MTP forward's logits and hidden states (mtp_lg, mtp_h: N rows) against `ref`, a
 * one-layer model run on input rows composed from the raw weights: row i is
 * fc([norm_e(E[t_{i+1}]) | norm_h(h_i)]) with norm weights we / wh. Returns the largest logit. */
static double check_against_reference(model *ref, const char *name, const int32_t *toks, const float *h, int N, int64_t D,
                                      int64_t V, const float *E, const float *W, const float *we, const float *wh,
                                      float eps, const float *mtp_lg, const float *mtp_h) {
  herr e = {0};
  float *x = malloc(sizeof(float) * (size_t)(N * D)), *cat = malloc(sizeof(float) * (size_t)(2 * D));
  const float **rows = malloc(sizeof(float *) * (size_t)N);
  for (int i = 0; i < N; i++) {
    rmsnorm_host(cat, E + (size_t)toks[i + 1] * (size_t)D, we, D, eps);
    rmsnorm_host(cat + D, h + (size_t)i * (size_t)D, wh, D, eps);
    for (int64_t o = 0; o < D; o++) {
      double acc = 0;
      for (int64_t k = 0; k < 2 * D; k++) acc += (double)W[o * 2 * D + k] * cat[k];
      x[i * D + o] = (float)acc;
    }
    rows[i] = x + i * D;
  }
  model_kv_geometry rg;
  model_kv_geometry_of(ref, &rg);
  kv_cache *rc = NULL;
  kv_seq *rs = NULL;
  CHECK_EQ_INT(kv_cache_new(&rg, 0, &rc, &e), 0);
  CHECK_EQ_INT(kv_cache_seq_new(rc, &rs, &e), 0);
  float *ref_lg = malloc(sizeof(float) * (size_t)(N * V)), *ref_h = malloc(sizeof(float) * (size_t)(N * D));
  model_seq rq = {.kv = rs, .tokens = toks + 1, .n_tokens = N, .all_logits = true, .embeds = rows, .next_hidden = ref_h};
  CHECK_EQ_INT(model_forward(ref, &(model_batch){.seqs = &rq, .n_seqs = 1}, ref_lg, &e), 0);
  double dl = max_abs(mtp_lg, ref_lg, (size_t)(N * V)), dh = max_abs(mtp_h, ref_h, (size_t)(N * D)), scale = 0;
  for (size_t i = 0; i < (size_t)(N * V); i++) scale = fabs(ref_lg[i]) > scale ? fabs(ref_lg[i]) : scale;
  fprintf(stderr, "  %s: MTP forward vs the one-layer reference: logits max abs error %.3g (largest logit %.3g), hidden %.3g\n",
          name, dl, scale, dh);
  CHECK_MSG(dl <= 1e-4 * (1 + scale), "MTP logits differ from the reference by %.3g", dl);
  CHECK_MSG(dh <= 1e-4, "MTP output hidden states differ from the reference by %.3g", dh);
  free(x), free(cat), free(rows), free(ref_lg), free(ref_h);
  kv_cache_seq_free(rs), kv_cache_free(rc);
  return scale;
}

static void test_forward_reference(void) {
  char dir[] = "/tmp/hearth-mtp-ref-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  if (write_reference(dir)) {
    CHECK_MSG(0, "could not write the reference model");
    return;
  }
  model *m = load(GLM5), *ref = load(dir);
  CHECK(m && ref);
  if (!m || !ref) {
    model_free(m), model_free(ref);
    return;
  }
  herr e = {0};
  CHECK_EQ_INT(model_mtp_check(m, &e), 0);
  const model_config *c = model_cfg(m);
  int64_t D = c->hidden_size, V = c->vocab_size;
  enum { N = 14 }; /* more rows than index_topk (8): the indexer chooses */
  int32_t toks[N + 1];
  for (int i = 0; i <= N; i++) toks[i] = (int32_t)(3 + (i * 97 + 11) % 500);
  /* h_i of t_0 .. t_{N-1}: the model's final hidden states */
  float *h = malloc(sizeof(float) * (size_t)(N * D));
  model_kv_geometry g;
  model_kv_geometry_of(m, &g);
  kv_cache *kc = NULL;
  kv_seq *ks = NULL;
  CHECK_EQ_INT(kv_cache_new(&g, 0, &kc, &e), 0);
  CHECK_EQ_INT(kv_cache_seq_new(kc, &ks, &e), 0);
  model_seq sq = {.kv = ks, .tokens = toks, .n_tokens = N, .out = MODEL_OUT_HIDDEN_ALL, .dest = h};
  CHECK_EQ_INT(model_forward(m, &(model_batch){.seqs = &sq, .n_seqs = 1}, NULL, &e), 0);
  /* the same states as next_hidden beside a logits row */
  float *h2 = malloc(sizeof(float) * (size_t)(N * D)), *lg1 = malloc(sizeof(float) * (size_t)V);
  kv_cache_seq_truncate(ks, 0);
  sq = (model_seq){.kv = ks, .tokens = toks, .n_tokens = N, .next_hidden = h2};
  CHECK_EQ_INT(model_forward(m, &(model_batch){.seqs = &sq, .n_seqs = 1}, lg1, &e), 0);
  CHECK_MSG(max_abs(h, h2, (size_t)(N * D)) == 0, "next_hidden differs from MODEL_OUT_HIDDEN_ALL");
  /* the MTP forward: rows (t_{i+1}, h_i) at positions 0..N-1, fed in two pieces */
  kv_cache *mc = NULL;
  kv_seq *ms = NULL;
  float *mtp_lg = malloc(sizeof(float) * (size_t)(N * V)), *mtp_h = malloc(sizeof(float) * (size_t)(N * D));
  mtp_forward_pieces(m, toks, h, N, &mc, &ms, mtp_lg, mtp_h);
  CHECK_EQ_INT(ms->len, N);
  /* the reference: the input rows here, from the raw weights */
  st_set st = {0};
  CHECK_EQ_INT(st_open(&st, GLM5, &e), 0);
  const st_tensor *te = st_find(&st, "model.embed_tokens.weight"), *tw = st_find(&st, "model.layers.3.eh_proj.weight"),
                  *ten = st_find(&st, "model.layers.3.enorm.weight"), *thn = st_find(&st, "model.layers.3.hnorm.weight");
  CHECK(te && tw && ten && thn);
  if (te && tw && ten && thn)
    check_against_reference(ref, c->model_type, toks, h, N, D, V, te->data, tw->data, ten->data, thn->data,
                            (float)c->rms_norm_eps, mtp_lg, mtp_h);
  /* and it is not the reference's trivially: the concat's halves swapped gives other logits */
  CHECK_MSG(max_abs(mtp_lg, lg1, (size_t)V) > 1e-3, "the MTP head's first row equals the model's last logits");
  st_close(&st);
  free(mtp_lg), free(mtp_h), free(h), free(h2), free(lg1);
  kv_cache_seq_free(ms), kv_cache_free(mc);
  kv_cache_seq_free(ks), kv_cache_free(kc);
  model_free(m), model_free(ref);
  char path[640];
  snprintf(path, sizeof path, "%s/model.safetensors", dir), unlink(path);
  snprintf(path, sizeof path, "%s/config.json", dir), unlink(path);
  rmdir(dir);
}

/* ---- Qwen3.5 (dense and MoE hybrids): mtp.* written here beside the fixture's weights ---- */

static float *rand_floats(int64_t n, uint32_t *seed, float scale) {
  float *d = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) {
    *seed = *seed * 1664525u + 1013904223u;
    d[i] = scale * ((float)(*seed >> 8) / (float)(1u << 24) * 2.0f - 1.0f);
  }
  return d;
}

/* The fixture plus a random MTP layer: fc, the two pre-fc norms and mtp.norm random, mtp.layers.0.* the
 * fixture's full-attention layer 1 scaled by 0.8 (a full-attention block of the model's kind). copying:
 * instead every block's output projections are zero (the decoder adds nothing: each token's logits are
 * its embedding's) and the MTP layer passes its token's embedding through (fc = [I | 0], its norm
 * 1 + 0) to the model's final norm (mtp.norm) and head: its drafts are the target's own next tokens. */
static int write_qwen_mtp(const char *fixture, const char *dir, bool copying) {
  variant v = {0};
  herr e = {0};
  if (st_open(&v.st, fixture, &e)) return fprintf(stderr, "%s\n", e.msg), 1;
  v.w = st_writer_new();
  for (size_t i = 0; i < v.st.count; i++) {
    const char *n = v.st.tensors[i].name;
    bool silent = copying && (ends_with(n, "o_proj.weight") || ends_with(n, "out_proj.weight") || ends_with(n, "down_proj.weight"));
    put(&v, n, n, silent ? 0.0f : 1.0f);
    if (!strncmp(n, "model.layers.1.", 15)) {
      char name[256];
      snprintf(name, sizeof name, "mtp.layers.0.%s", n + 15);
      put(&v, name, n, silent ? 0.0f : 0.8f);
    }
  }
  const st_tensor *emb = tensor(&v, "model.embed_tokens.weight");
  int64_t D = emb ? emb->shape[1] : 0;
  uint32_t seed = 7;
  float *fc = rand_floats(2 * D * D, &seed, 0.15f), *enorm = rand_floats(D, &seed, 0.5f);
  if (copying) {
    memset(fc, 0, sizeof(float) * (size_t)(2 * D * D)), memset(enorm, 0, sizeof(float) * (size_t)D);
    for (int64_t i = 0; i < D; i++) fc[i * 2 * D + i] = 1.0f;
  }
  put_data(&v, "mtp.fc.weight", 2, (int64_t[]){D, 2 * D}, fc);
  put_data(&v, "mtp.pre_fc_norm_embedding.weight", 1, (int64_t[]){D}, enorm);
  put_data(&v, "mtp.pre_fc_norm_hidden.weight", 1, (int64_t[]){D}, rand_floats(D, &seed, 0.5f));
  if (copying) put(&v, "mtp.norm.weight", "model.norm.weight", 1);
  else put_data(&v, "mtp.norm.weight", 1, (int64_t[]){D}, rand_floats(D, &seed, 0.5f));
  char path[600];
  snprintf(path, sizeof path, "%s/config.json", fixture);
  json_t *cfg = hjson_load_file(path, &e);
  if (!cfg) return 1;
  json_object_set_new(cfg, "mtp_num_hidden_layers", json_integer(1));
  int rc = variant_write(&v, dir, cfg);
  json_decref(cfg);
  return rc;
}

/* The reference: a one-layer model of the fixture's kind whose full-attention layer is mtp.layers.0,
 * its final norm mtp.norm, its head the model's lm_head. */
static int write_qwen_reference(const char *fixture, const char *mtp_dir, const char *dir) {
  variant v = {0};
  herr e = {0};
  if (st_open(&v.st, mtp_dir, &e)) return fprintf(stderr, "%s\n", e.msg), 1;
  v.w = st_writer_new();
  put(&v, "model.embed_tokens.weight", "model.embed_tokens.weight", 1);
  put(&v, "model.norm.weight", "mtp.norm.weight", 1);
  put(&v, "lm_head.weight", "lm_head.weight", 1);
  for (size_t i = 0; i < v.st.count; i++) {
    const char *n = v.st.tensors[i].name;
    if (strncmp(n, "mtp.layers.0.", 13)) continue;
    char name[256];
    snprintf(name, sizeof name, "model.layers.0.%s", n + 13);
    put(&v, name, n, 1);
  }
  char path[600];
  snprintf(path, sizeof path, "%s/config.json", fixture);
  json_t *cfg = hjson_load_file(path, &e);
  if (!cfg) return 1;
  json_object_set_new(cfg, "num_hidden_layers", json_integer(1));
  json_object_set_new(cfg, "layer_types", json_pack("[s]", "full_attention"));
  int rc = variant_write(&v, dir, cfg);
  json_decref(cfg);
  return rc;
}

static void rm_variant(const char *dir) {
  char path[640];
  snprintf(path, sizeof path, "%s/model.safetensors", dir), unlink(path);
  snprintf(path, sizeof path, "%s/config.json", dir), unlink(path);
  rmdir(dir);
}

/* The MTP forward of a Qwen3.5 hybrid against the one-layer reference fed the rows
 * fc([norm_e(embed(t_{i+1})) | norm_h(h_i)]) computed here, the norms scaling by (1 + w). */
static void qwen_forward_reference(model *m, const char *fixture, const char *mtp_dir) {
  char dir[] = "/tmp/hearth-mtp-qref-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  if (write_qwen_reference(fixture, mtp_dir, dir)) {
    CHECK_MSG(0, "could not write the reference model");
    return;
  }
  model *ref = load(dir);
  CHECK(ref != NULL);
  if (!ref) return;
  herr e = {0};
  CHECK_EQ_INT(model_mtp_check(m, &e), 0);
  CHECK(model_mtp_check(ref, &e) == HEARTH_EUNSUPPORTED);
  const model_config *c = model_cfg(m);
  int64_t D = c->hidden_size, V = c->vocab_size;
  enum { N = 12 };
  int32_t toks[N + 1];
  for (int i = 0; i <= N; i++) toks[i] = (int32_t)(3 + (i * 97 + 11) % 500);
  float *h = malloc(sizeof(float) * (size_t)(N * D));
  model_kv_geometry g;
  model_kv_geometry_of(m, &g);
  kv_cache *kc = NULL;
  kv_seq *ks = NULL;
  CHECK_EQ_INT(kv_cache_new(&g, 0, &kc, &e), 0);
  CHECK_EQ_INT(kv_cache_seq_new(kc, &ks, &e), 0);
  model_seq sq = {.kv = ks, .tokens = toks, .n_tokens = N, .out = MODEL_OUT_HIDDEN_ALL, .dest = h};
  CHECK_EQ_INT(model_forward(m, &(model_batch){.seqs = &sq, .n_seqs = 1}, NULL, &e), 0);
  kv_cache *mc = NULL;
  kv_seq *ms = NULL;
  float *mtp_lg = malloc(sizeof(float) * (size_t)(N * V)), *mtp_h = malloc(sizeof(float) * (size_t)(N * D));
  mtp_forward_pieces(m, toks, h, N, &mc, &ms, mtp_lg, mtp_h);
  st_set st = {0};
  CHECK_EQ_INT(st_open(&st, mtp_dir, &e), 0);
  const st_tensor *te = st_find(&st, "model.embed_tokens.weight"), *tw = st_find(&st, "mtp.fc.weight"),
                  *ten = st_find(&st, "mtp.pre_fc_norm_embedding.weight"), *thn = st_find(&st, "mtp.pre_fc_norm_hidden.weight");
  CHECK(te && tw && ten && thn);
  float *we = malloc(sizeof(float) * (size_t)D), *wh = malloc(sizeof(float) * (size_t)D); /* Qwen3.5's norms: 1 + w */
  for (int64_t i = 0; ten && thn && i < D; i++) we[i] = 1.0f + ((const float *)ten->data)[i], wh[i] = 1.0f + ((const float *)thn->data)[i];
  if (te && tw && ten && thn)
    CHECK(check_against_reference(ref, c->model_type, toks, h, N, D, V, te->data, tw->data, we, wh, (float)c->rms_norm_eps,
                                  mtp_lg, mtp_h) > 1e-3);
  st_close(&st);
  free(we), free(wh), free(mtp_lg), free(mtp_h), free(h);
  kv_cache_seq_free(ms), kv_cache_free(mc);
  kv_cache_seq_free(ks), kv_cache_free(kc);
  model_free(ref);
  rm_variant(dir);
}

/* ---- a run's proposals against the layer computed afresh ---- */

#define FRESH_PROMPT 530 /* more than DRAFT_CHUNK: the layer catches up on the prompt in two forwards */
#define FRESH_MAX (FRESH_PROMPT + 48)

typedef struct hist {
  int32_t toks[FRESH_MAX + 8];
  int64_t n;
} hist;

static bool commit_tok(void *ctx, const sample_token *st) {
  hist *h = ctx;
  h->toks[h->n++] = st->id;
  return false;
}

static int32_t argmax(const float *row, int64_t n) {
  int32_t b = 0;
  for (int64_t i = 1; i < n; i++)
    if (row[i] > row[b]) b = (int32_t)i;
  return b;
}

/* A greedy run decoded by hand (prompt in two chunks, then propose / verify): at every step its
 * drafts must be what the MTP layer gives over the whole history computed afresh — the target's
 * final hidden states of every position from one forward, the layer over all of them in one
 * forward, then its chain. With random weights nearly every draft is rejected, so this checks that
 * the hidden states of rejected positions are dropped and the layer's chain rows cut off. */
static void test_proposals_fresh(void) {
  model *m = g_glm5_fresh;
  herr e = {0};
  int64_t D = model_cfg(m)->hidden_size, V = model_vocab_size(m);
  model_kv_geometry g, mg;
  model_kv_geometry_of(m, &g);
  model_mtp_geometry_of(m, &mg);
  kv_cache *kc = NULL, *mc = NULL, *fc = NULL, *fmc = NULL;
  CHECK_EQ_INT(kv_cache_new(&g, 0, &kc, &e), 0);
  CHECK_EQ_INT(kv_cache_new(&mg, 0, &mc, &e), 0);
  CHECK_EQ_INT(kv_cache_new(&g, 0, &fc, &e), 0);
  CHECK_EQ_INT(kv_cache_new(&mg, 0, &fmc, &e), 0);
  gen_method gm = {.spec_tokens = 3, .source = SPEC_MTP, .target = m, .mtp_cache = mc};
  hist h = {0};
  for (int i = 0; i < FRESH_PROMPT; i++) h.toks[h.n++] = (int32_t)(3 + (i * 151 + 7 + i * i * 3) % 500);
  gen_request req;
  gen_request_init(&req);
  req.prompt = h.toks;
  req.n_prompt = (size_t)h.n;
  req.sample.greedy = true;
  gen_run *run = NULL;
  sampler *smp = NULL;
  CHECK_EQ_INT(gen_run_new(&gm, &req, V, NULL, &run, &e), 0);
  CHECK_EQ_INT(sampler_new((int32_t)V, &req.sample, &smp, &e), 0);
  kv_seq *kv = NULL;
  CHECK_EQ_INT(kv_cache_seq_new(kc, &kv, &e), 0);
  if (!run || !smp || !kv) return;
  float *rows = malloc(sizeof(float) * (size_t)(4 * V)), *scratch = NULL;
  size_t cap = 0;
  gen_step gs;
  /* the prompt in two chunks, each keeping its hidden states for the layer */
  int64_t split = 300;
  model_seq c1 = {.kv = kv, .tokens = h.toks, .n_tokens = (int)split, .out = MODEL_OUT_NONE,
                  .next_hidden = gen_run_hidden(run, 0, (int)split, &e)};
  CHECK(c1.next_hidden != NULL);
  CHECK_EQ_INT(model_forward(m, &(model_batch){.seqs = &c1, .n_seqs = 1}, NULL, &e), 0);
  CHECK_EQ_INT(gen_run_backlog(run), split);
  model_seq c2 = {.kv = kv, .tokens = h.toks + split, .n_tokens = (int)(h.n - split),
                  .next_hidden = gen_run_hidden(run, split, (int)(h.n - split), &e)};
  CHECK_EQ_INT(model_forward(m, &(model_batch){.seqs = &c2, .n_seqs = 1}, rows, &e), 0);
  CHECK_EQ_INT(gen_run_verify(run, smp, rows, 1, V, commit_tok, &h, &gs, &e), 0);
  int steps = 0, drafted = 0, compared = 0;
  float *H = malloc(sizeof(float) * FRESH_MAX * (size_t)D), *lg = malloc(sizeof(float) * (size_t)V);
  float *nh = malloc(sizeof(float) * FRESH_MAX * (size_t)D);
  int64_t *pos = malloc(sizeof(int64_t) * FRESH_MAX);
  while (h.n < FRESH_PROMPT + 40 && steps < 60) {
    steps++;
    gen_proposal pr = {.run = run, .toks = h.toks, .n_toks = h.n, .max = 3};
    CHECK_EQ_INT(gen_runs_propose(&pr, 1, &scratch, &cap, &e), 0);
    CHECK_MSG(pr.n >= 1, "step %d: no draft", steps);
    /* afresh: the target's hidden states of positions 0 .. n-2, the layer over all of them */
    kv_seq *fk = NULL, *fm = NULL;
    CHECK_EQ_INT(kv_cache_seq_new(fc, &fk, &e), 0);
    CHECK_EQ_INT(kv_cache_seq_new(fmc, &fm, &e), 0);
    int n1 = (int)h.n - 1;
    model_seq fs = {.kv = fk, .tokens = h.toks, .n_tokens = n1, .out = MODEL_OUT_HIDDEN_ALL, .dest = H};
    CHECK_EQ_INT(model_forward(m, &(model_batch){.seqs = &fs, .n_seqs = 1}, NULL, &e), 0);
    for (int i = 0; i < n1; i++) pos[i] = i;
    model_seq ms = {.kv = fm, .tokens = h.toks + 1, .n_tokens = n1, .positions = pos, .mtp_hidden = H, .next_hidden = nh};
    /* (one forward: only the last row's logits) */
    CHECK_EQ_INT(model_forward(m, &(model_batch){.seqs = &ms, .n_seqs = 1}, lg, &e), 0);
    float *chain = nh + (size_t)(n1 - 1) * (size_t)D;
    for (int j = 0; j < pr.n; j++) {
      int32_t want = argmax(lg, V);
      CHECK_MSG(pr.draft[j] == want, "step %d (%lld tokens): draft %d is %d, the layer afresh gives %d", steps,
                (long long)h.n, j, (int)pr.draft[j], (int)want);
      compared++;
      if (j + 1 == pr.n) break;
      int64_t p = h.n - 1 + j;
      model_seq cs = {.kv = fm, .tokens = &pr.draft[j], .n_tokens = 1, .positions = &p, .mtp_hidden = chain,
                      .next_hidden = chain};
      CHECK_EQ_INT(model_forward(m, &(model_batch){.seqs = &cs, .n_seqs = 1}, lg, &e), 0);
    }
    kv_cache_seq_free(fk);
    kv_cache_seq_free(fm);
    /* verify: the pending token and the drafts in one forward */
    int32_t feed[4];
    feed[0] = h.toks[h.n - 1];
    memcpy(feed + 1, pr.draft, sizeof(int32_t) * (size_t)pr.n);
    drafted += pr.n;
    int64_t at = kv->len;
    model_seq vs = {.kv = kv, .tokens = feed, .n_tokens = 1 + pr.n, .all_logits = true,
                    .next_hidden = gen_run_hidden(run, at, 1 + pr.n, &e)};
    CHECK_EQ_INT(model_forward(m, &(model_batch){.seqs = &vs, .n_seqs = 1}, rows, &e), 0);
    CHECK_EQ_INT(gen_run_verify(run, smp, rows, 1 + pr.n, V, commit_tok, &h, &gs, &e), 0);
    kv_cache_seq_truncate(kv, h.n - 1);
  }
  fprintf(stderr, "  %d steps by hand: %d drafts, each the layer's afresh (%d compared)\n", steps, drafted, compared);
  CHECK(compared >= 30);
  free(rows), free(scratch), free(H), free(lg), free(nh), free(pos);
  kv_cache_seq_free(kv);
  gen_run_free(run);
  sampler_free(smp);
  kv_cache_free(kc), kv_cache_free(mc), kv_cache_free(fc), kv_cache_free(fmc);
}

/* ---- greedy in the scheduler ---- */

typedef struct collected {
  int32_t ids[256];
  int n;
} collected;

static int collect(void *user, const char *delta, size_t len, const sample_token *tok) {
  (void)delta, (void)len;
  collected *c = user;
  if (tok && c->n < 256) c->ids[c->n++] = tok->id;
  return 0;
}

#define N_REQ 8
#define NEW_TOKENS 36

typedef struct job {
  sched *s;
  gen_request req;
  collected out;
  gen_result res;
  int rc;
  herr err;
} job;

static void *job_main(void *arg) {
  job *j = arg;
  j->rc = sched_run(j->s, &j->req, collect, &j->out, &j->res, &j->err);
  return NULL;
}

static int32_t g_prompt[N_REQ][80];
static int g_plen[N_REQ];

/* Runs N_REQ greedy requests together: MTP-drafted with 1, 2, 4 (the method's) and 7 drafts, two
 * plain, one with prompt lookup; each must equal plain decoding alone. Returns the MTP stats. */
static void run_greedy(model *m, size_t kv_bytes, bool backend_sampling, bool expect_accept, const char *what) {
  gen_method gm = {.spec_tokens = 4, .source = SPEC_MTP};
  sched_config cfg = {.max_batch = 8, .block_tokens = 16, .kv_bytes = kv_bytes, .method = &gm,
                      .backend_sampling = backend_sampling};
  sched *s = NULL;
  herr e = {0};
  CHECK_EQ_INT(sched_new(m, NULL, &cfg, &s, &e), 0);
  if (!s) {
    fprintf(stderr, "%s\n", e.msg);
    return;
  }
  static job jobs[N_REQ];
  pthread_t th[N_REQ];
  static const int spec[N_REQ] = {-1, 1, 0, 2, 7, -1, 0, 3};
  for (int i = 0; i < N_REQ; i++) {
    memset(&jobs[i], 0, sizeof jobs[i]);
    jobs[i].s = s;
    gen_request_init(&jobs[i].req);
    jobs[i].req.prompt = g_prompt[i];
    jobs[i].req.n_prompt = (size_t)g_plen[i];
    jobs[i].req.max_tokens = NEW_TOKENS;
    jobs[i].req.sample.greedy = true;
    jobs[i].req.ignore_eos = true;
    jobs[i].req.spec_tokens = spec[i];
    if (i == 5) jobs[i].req.spec_method = "ngram"; /* its own source beside the method's */
    pthread_create(&th[i], NULL, job_main, &jobs[i]);
  }
  for (int i = 0; i < N_REQ; i++) pthread_join(th[i], NULL);
  int mismatched = 0;
  for (int i = 0; i < N_REQ; i++) {
    CHECK_MSG(jobs[i].rc == 0, "%s: request %d: %s", what, i, jobs[i].err.msg);
    gen_request r = jobs[i].req;
    collected ref = {0};
    gen_result rr;
    herr e2 = {0};
    CHECK_EQ_INT(sched_run_alone(m, &r, collect, &ref, &rr, &e2), 0);
    CHECK_EQ_INT(jobs[i].out.n, NEW_TOKENS);
    if (jobs[i].out.n != ref.n || memcmp(jobs[i].out.ids, ref.ids, sizeof(int32_t) * (size_t)ref.n)) {
      int t = 0;
      while (t < ref.n && t < jobs[i].out.n && ref.ids[t] == jobs[i].out.ids[t]) t++;
      fprintf(stderr, "  %s: request %d (spec_tokens %d) differs at token %d\n", what, i, spec[i], t);
      mismatched++;
    }
  }
  CHECK_MSG(mismatched == 0, "%s: %d of %d requests differ from plain decoding", what, mismatched, N_REQ);
  sched_stats st;
  sched_get_stats(s, &st);
  CHECK_EQ_INT(st.blocks_used, 0);
  CHECK_EQ_INT(st.generated_tokens, N_REQ * NEW_TOKENS);
  CHECK_MSG(st.spec_drafted[SPEC_MTP] > 0, "%s: no token drafted by the MTP layer", what);
  CHECK(st.spec_accepted[SPEC_MTP] <= st.spec_drafted[SPEC_MTP]);
  CHECK(st.spec_drafted[SPEC_NGRAM] >= 0);
  if (expect_accept)
    CHECK_MSG(st.spec_accepted[SPEC_MTP] * 10 >= st.spec_drafted[SPEC_MTP] * 9,
              "%s: %lld of %lld drafts kept, where the MTP layer drafts the model's own tokens", what,
              (long long)st.spec_accepted[SPEC_MTP], (long long)st.spec_drafted[SPEC_MTP]);
  if (kv_bytes) CHECK_MSG(st.preemptions > 0, "%s: no preemption in a small pool", what);
  fprintf(stderr, "  %s: %lld steps, mtp: %lld verification steps, drafted %lld, accepted %lld; %lld preemptions\n",
          what, (long long)st.steps, (long long)st.spec_steps[SPEC_MTP], (long long)st.spec_drafted[SPEC_MTP],
          (long long)st.spec_accepted[SPEC_MTP], (long long)st.preemptions);
  sched_free(s);
}

static model *g_glm5, *g_copy;

static void test_greedy_random(void) { run_greedy(g_glm5, 0, false, false, "mtp, random weights"); }

static void test_greedy_copying(void) {
  run_greedy(g_copy, 0, false, true, "mtp, a layer drafting the model's own tokens");
  run_greedy(g_copy, 0, true, true, "mtp, tokens chosen by bk_sample");
}

/* a pool of 14 blocks for 8 requests of up to 8 blocks each: requests wait and are preempted */
static void test_greedy_preempted(void) {
  model_kv_geometry g;
  model_kv_geometry_of(g_copy, &g);
  run_greedy(g_copy, 14 * kv_block_bytes(&g, 16), false, true, "mtp, a small pool");
}

/* Sampled requests draft from the layer's distribution q and keep a draft with probability
 * min(1, p/q): with the copying layer q is the model's own p, so nearly every draft is kept. */
static void test_sampled_copying(void) {
  gen_method gm = {.spec_tokens = 4, .source = SPEC_MTP};
  sched *s = NULL;
  herr e = {0};
  CHECK_EQ_INT(sched_new(g_copy, NULL, &(sched_config){.max_batch = 4, .method = &gm}, &s, &e), 0);
  if (!s) return;
  static job jobs[4];
  pthread_t th[4];
  for (int i = 0; i < 4; i++) {
    memset(&jobs[i], 0, sizeof jobs[i]);
    jobs[i].s = s;
    gen_request_init(&jobs[i].req);
    jobs[i].req.prompt = g_prompt[i];
    jobs[i].req.n_prompt = (size_t)g_plen[i];
    jobs[i].req.max_tokens = NEW_TOKENS;
    jobs[i].req.sample.temperature = 0.8f;
    jobs[i].req.sample.top_k = 40;
    jobs[i].req.sample.seed = 1234 + (uint64_t)i;
    jobs[i].req.ignore_eos = true;
    pthread_create(&th[i], NULL, job_main, &jobs[i]);
  }
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 4; i++) {
    CHECK_MSG(jobs[i].rc == 0, "sampled request %d: %s", i, jobs[i].err.msg);
    CHECK_EQ_INT(jobs[i].out.n, NEW_TOKENS);
  }
  sched_stats st;
  sched_get_stats(s, &st);
  CHECK(st.spec_drafted[SPEC_MTP] > 0);
  CHECK_MSG(st.spec_accepted[SPEC_MTP] * 10 >= st.spec_drafted[SPEC_MTP] * 9, "sampled: %lld of %lld drafts kept",
            (long long)st.spec_accepted[SPEC_MTP], (long long)st.spec_drafted[SPEC_MTP]);
  fprintf(stderr, "  mtp, sampled: drafted %lld, accepted %lld\n", (long long)st.spec_drafted[SPEC_MTP],
          (long long)st.spec_accepted[SPEC_MTP]);
  sched_free(s);
}

/* Qwen3.5 and Qwen3.5-MoE with an MTP layer: the forward against the reference, then greedy MTP
 * drafting in the scheduler (the hybrid's recurrent state rewound after rejections) equal to plain
 * decoding, with random weights (few drafts kept) and with the copying layer (nearly all kept); the
 * fixture without mtp.* refuses the method. */
static void run_qwen(const char *fixture, const char *what) {
  char dir[] = "/tmp/hearth-mtp-qwen-XXXXXX", cdir[] = "/tmp/hearth-mtp-qcopy-XXXXXX";
  CHECK(mkdtemp(dir) != NULL && mkdtemp(cdir) != NULL);
  CHECK_EQ_INT(write_qwen_mtp(fixture, dir, false), 0);
  CHECK_EQ_INT(write_qwen_mtp(fixture, cdir, true), 0);
  model *m = load(dir), *plain = load(fixture), *copy = load(cdir);
  CHECK(m && plain && copy);
  char label[160];
  if (m) {
    qwen_forward_reference(m, fixture, dir);
    snprintf(label, sizeof label, "%s, random weights", what);
    run_greedy(m, 0, false, false, label);
  }
  if (copy) {
    snprintf(label, sizeof label, "%s, a layer drafting the model's own tokens", what);
    run_greedy(copy, 0, false, true, label);
  }
  model_free(copy);
  rm_variant(cdir);
  if (plain) {
    herr e = {0};
    CHECK(model_mtp_check(plain, &e) == HEARTH_EUNSUPPORTED);
    CHECK_MSG(strstr(e.msg, "no multi-token-prediction layer") && strstr(e.msg, "mtp.fc"), "%s", e.msg);
  }
  model_free(m), model_free(plain);
  rm_variant(dir);
}

static void test_qwen3_5(void) { run_qwen(QWEN35, "qwen3_5 mtp"); }
static void test_qwen3_5_moe(void) { run_qwen(QWEN35_MOE, "qwen3_5_moe mtp"); }

/* ---- refusals ---- */

static void test_refused(void) {
  model *llama = load(LLAMA);
  CHECK(llama != NULL);
  if (!llama) return;
  herr e = {0};
  CHECK(model_mtp_check(llama, &e) == HEARTH_EUNSUPPORTED);
  CHECK_MSG(strstr(e.msg, "no multi-token-prediction layer") != NULL, "%s", e.msg);
  gen_method gm = {.spec_tokens = 4, .source = SPEC_MTP};
  e = (herr){0};
  CHECK(gen_method_check(&gm, llama, &e) == HEARTH_EUNSUPPORTED);
  CHECK_MSG(strstr(e.msg, "mtp") && strstr(e.msg, "multi-token-prediction"), "%s", e.msg);
  CHECK(gen_method_check(&gm, g_glm5, &e) == 0);
  /* per request */
  sched *s = NULL;
  CHECK_EQ_INT(sched_new(llama, NULL, &(sched_config){.max_batch = 2}, &s, &e), 0);
  int32_t prompt[] = {5, 6, 7, 8};
  gen_request req;
  gen_request_init(&req);
  req.prompt = prompt;
  req.n_prompt = 4;
  req.max_tokens = 4;
  req.spec_tokens = 2;
  req.spec_method = "mtp";
  gen_result res;
  collected out = {0};
  e = (herr){0};
  CHECK_EQ_INT(sched_run(s, &req, collect, &out, &res, &e), HEARTH_EUNSUPPORTED);
  CHECK_EQ_STR(e.field, "spec_method");
  req.spec_method = "draft";
  e = (herr){0};
  CHECK_EQ_INT(sched_run(s, &req, collect, &out, &res, &e), HEARTH_EINVAL);
  CHECK_EQ_STR(e.field, "spec_method");
  req.spec_method = "lookahead";
  e = (herr){0};
  CHECK_EQ_INT(sched_run(s, &req, collect, &out, &res, &e), HEARTH_EINVAL);
  req.spec_method = "ngram";
  e = (herr){0};
  CHECK_EQ_INT(sched_run(s, &req, collect, &out, &res, &e), 0);
  CHECK_EQ_INT(out.n, 4);
  sched_free(s);
  model_free(llama);
}

int main(void) {
  test_device_or_skip();
  for (int i = 0; i < N_REQ; i++) {
    g_plen[i] = 9 + i * 7;
    for (int t = 0; t < g_plen[i]; t++) g_prompt[i][t] = (int32_t)(3 + (t * 131 + i * 29 + t * t * 7) % 500);
  }
  g_glm5 = load(GLM5);
  char dir[] = "/tmp/hearth-mtp-copy-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  CHECK_EQ_INT(write_copying(dir), 0);
  g_copy = load(dir);
  if (!g_glm5 || !g_copy) return 1;
  RUN(test_forward_reference);
  char ldir[] = "/tmp/hearth-mtp-long-XXXXXX";
  CHECK(mkdtemp(ldir) != NULL);
  CHECK_EQ_INT(write_long(ldir), 0);
  g_glm5_fresh = load(ldir);
  if (g_glm5_fresh) RUN(test_proposals_fresh);
  model_free(g_glm5_fresh);
  char lpath[640];
  snprintf(lpath, sizeof lpath, "%s/model.safetensors", ldir), unlink(lpath);
  snprintf(lpath, sizeof lpath, "%s/config.json", ldir), unlink(lpath);
  rmdir(ldir);
  RUN(test_greedy_random);
  RUN(test_greedy_copying);
  RUN(test_greedy_preempted);
  RUN(test_sampled_copying);
  RUN(test_refused);
  RUN(test_qwen3_5);
  RUN(test_qwen3_5_moe);
  model_free(g_glm5);
  model_free(g_copy);
  char path[640];
  snprintf(path, sizeof path, "%s/model.safetensors", dir), unlink(path);
  snprintf(path, sizeof path, "%s/config.json", dir), unlink(path);
  rmdir(dir);
  TEST_MAIN_END();
}
