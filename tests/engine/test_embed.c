/* test_embed.c — embeddings and the next-token signal through the public
 * API (hearth_embed, hearth_signal) against transformers' float64 reference
 * (tests/fixtures/golden/qwen3-{f32,bf16}/embedding.json from tools/gen_embed_golden.py,
 * logits_f32.bin from tools/gen_golden.py): one input at a time, all inputs
 * batched with chunked prefill, beside a running generation, Matryoshka
 * dimensions, a bare decoder's folder (no "model." prefix, no lm_head) as
 * Qwen3-Embedding is saved, and sentence-transformers pooling files; pooled
 * embeddings (mean, max, ...) against the last-token states of every prefix
 * (in a causal model, the states of the prompt's tokens). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/json.h"
#include "engine/sched.h"
#include "engine/logit_signal.h"
#include "model/model.h"
#include "format/safetensors.h"
#include "format/safetensors_write.h"
#include "hearth.h"
#include "test.h"

#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden"

typedef struct ref {
  json_t *doc;        /* owned */
  int n;              /* inputs */
  int32_t ids[8][32];
  int len[8];
  double emb[8][256];
  int dim;
} ref;

static int ref_load(const char *dir, ref *r) {
  memset(r, 0, sizeof *r);
  char path[512];
  snprintf(path, sizeof path, "%s/embedding.json", dir);
  herr err = {0};
  r->doc = hjson_load_file(path, &err);
  if (!r->doc) {
    fprintf(stderr, "%s\n", err.msg);
    return -1;
  }
  json_t *in = json_object_get(r->doc, "inputs"), *em = json_object_get(r->doc, "embeddings");
  r->n = (int)json_array_size(in);
  if (r->n < 2 || r->n > 8 || json_array_size(em) != (size_t)r->n) return -1;
  for (int i = 0; i < r->n; i++) {
    json_t *a = json_array_get(in, i), *e = json_array_get(em, i);
    r->len[i] = (int)json_array_size(a);
    r->dim = (int)json_array_size(e);
    if (r->len[i] > 32 || r->dim > 256) return -1;
    for (int j = 0; j < r->len[i]; j++) r->ids[i][j] = (int32_t)json_integer_value(json_array_get(a, j));
    for (int j = 0; j < r->dim; j++) r->emb[i][j] = json_number_value(json_array_get(e, j));
  }
  return 0;
}

static bool verbose = true; /* the errors of the first comparisons, as test_golden prints them */

/* max |a - ref| and cosine(a, ref) over n values. */
static void compare(const float *a, const double *b, int n, double *max_abs, double *cosine) {
  double d = 0, ab = 0, aa = 0, bb = 0;
  for (int i = 0; i < n; i++) {
    double e = fabs((double)a[i] - b[i]);
    if (!(e <= d)) d = e; /* NaN propagates */
    ab += a[i] * b[i];
    aa += (double)a[i] * a[i];
    bb += b[i] * b[i];
  }
  *max_abs = d;
  *cosine = ab / sqrt(aa * bb);
}

static void check_against(const char *what, const ref *r, int i, const float *v, double tol) {
  double d, cs;
  compare(v, r->emb[i], r->dim, &d, &cs);
  CHECK_MSG(d <= tol, "%s input %d: max abs error %.3g > %.3g", what, i, d, tol);
  CHECK_MSG(cs >= 0.9999, "%s input %d: cosine %.6f < 0.9999", what, i, cs);
  if (verbose) fprintf(stderr, "  %-20s input %d: max abs error %.3g (tol %.3g), cosine %.9f\n", what, i, d, tol, cs);
}

static hearth_model *load(const char *dir, int prefill_chunk) {
  hearth_load_opts o = {.threads = 2, .prefill_chunk = prefill_chunk, .kv_cache_bytes = 8 << 20};
  hearth_error err = {0};
  hearth_model *m = NULL;
  if (hearth_model_load(dir, &o, &m, &err)) fprintf(stderr, "%s: %s\n", dir, err.msg);
  return m;
}

static void test_golden(const char *name, double tol) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/%s", GOLDEN, name);
  ref r;
  CHECK_MSG(ref_load(dir, &r) == 0, "%s/embedding.json does not load", dir);
  hearth_model *m = load(dir, 0), *mc = load(dir, 4);
  CHECK(m && mc);
  if (!m || !mc || !r.doc) goto out;
  hearth_info info;
  hearth_model_info(m, &info);
  CHECK_EQ_INT(info.hidden_size, r.dim);
  CHECK(info.can_embed && info.can_generate);
  hearth_error err = {0};
  float v[256], all[8 * 256];
  hearth_prompt in[8];
  int64_t toks = 0, want_toks = 0;
  for (int i = 0; i < r.n; i++) {
    in[i] = (hearth_prompt){.ids = r.ids[i], .n_ids = (size_t)r.len[i]};
    want_toks += r.len[i];
    CHECK_MSG(hearth_embed(m, &in[i], 1, NULL, v, &toks, &err) == 0, "%s", err.msg);
    CHECK_EQ_INT(toks, r.len[i]);
    check_against(name, &r, i, v, tol);
  }
  verbose = false;
  /* all together, in chunks of 4 tokens: the same vectors */
  CHECK_MSG(hearth_embed(mc, in, (size_t)r.n, NULL, all, &toks, &err) == 0, "%s", err.msg);
  CHECK_EQ_INT(toks, want_toks);
  for (int i = 0; i < r.n; i++) check_against(name, &r, i, all + (size_t)i * (size_t)r.dim, tol);
  /* Matryoshka: the first 16 values renormalised; more than the hidden size refused */
  hearth_embed_opts eo = {.dimensions = 16};
  float d16[16];
  CHECK_MSG(hearth_embed(m, &in[0], 1, &eo, d16, NULL, &err) == 0, "%s", err.msg);
  double n0 = 0, n16 = 0;
  for (int j = 0; j < 16; j++) n0 += r.emb[0][j] * r.emb[0][j];
  for (int j = 0; j < 16; j++) {
    CHECK_NEAR(d16[j], r.emb[0][j] / sqrt(n0), tol * 4);
    n16 += (double)d16[j] * d16[j];
  }
  CHECK_NEAR(n16, 1.0, 1e-5);
  eo.dimensions = r.dim + 1;
  CHECK_EQ_INT(hearth_embed(m, &in[0], 1, &eo, all, NULL, &err), HEARTH_EINVAL);
  CHECK_MSG(strstr(err.msg, "dimensions") != NULL, "%s", err.msg);
  /* bad inputs are errors naming the input */
  int32_t bad[2] = {3, 1 << 20};
  hearth_prompt b2[2] = {in[0], {.ids = bad, .n_ids = 2}};
  CHECK_EQ_INT(hearth_embed(m, b2, 2, NULL, all, NULL, &err), HEARTH_EINVAL);
  CHECK_MSG(strstr(err.msg, "input 1") != NULL, "%s", err.msg);
  b2[1].n_ids = 0;
  CHECK_EQ_INT(hearth_embed(m, b2, 2, NULL, all, NULL, &err), HEARTH_EINVAL);
  CHECK_MSG(strstr(err.msg, "input 1") != NULL, "%s", err.msg);
  int32_t *lng = calloc(200, sizeof *lng);
  hearth_prompt too_long = {.ids = lng, .n_ids = 200}; /* the context is 128 */
  CHECK_EQ_INT(hearth_embed(m, &too_long, 1, NULL, all, NULL, &err), HEARTH_ELIMIT);
  CHECK_MSG(strstr(err.msg, "context_length_exceeded") != NULL, "%s", err.msg);
  free(lng);
out:
  hearth_model_free(m);
  hearth_model_free(mc);
  json_decref(r.doc);
  verbose = true;
}

/* ---- beside a generation ---- */

typedef struct gen_ctx {
  hearth_model *m;
  int32_t out[64];
  atomic_int n;
  bool hold;      /* at the third token, wait for the embedding request */
  int rc;
} gen_ctx;

static int gen_token(void *user, const char *text, size_t len, const hearth_token *tok) {
  (void)text;
  (void)len;
  gen_ctx *g = user;
  if (!tok) return 0;
  int n = atomic_load(&g->n);
  if (n < 64) g->out[n] = tok->id;
  atomic_store(&g->n, n + 1);
  if (n == 2 && g->hold) {
    /* hold the generation until the embedding request has been queued, so the next steps
     * batch both (waiting for the request, not for time; bounded so it cannot hang) */
    for (int k = 0; k < 200000; k++) {
      hearth_stats st;
      hearth_get_stats(g->m, &st);
      if (st.waiting + st.running >= 2) break;
      usleep(50);
    }
  }
  return 0;
}

static void *gen_main(void *arg) {
  gen_ctx *g = arg;
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.max_tokens = 40;
  p.temperature = 0;
  p.ignore_eos = true;
  int32_t prompt[5] = {1, 17, 230, 45, 98};
  hearth_prompt pr = {.ids = prompt, .n_ids = 5};
  hearth_error err = {0};
  g->rc = hearth_generate(g->m, &pr, &p, gen_token, g, NULL, &err);
  if (g->rc) fprintf(stderr, "generate: %s\n", err.msg);
  return NULL;
}

static void test_beside_generation(void) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/qwen3-f32", GOLDEN);
  ref r;
  CHECK(ref_load(dir, &r) == 0);
  hearth_model *m = load(dir, 4);
  CHECK(m != NULL);
  if (!m || !r.doc) {
    hearth_model_free(m);
    json_decref(r.doc);
    return;
  }
  /* the generation alone */
  gen_ctx solo = {.m = m};
  gen_main(&solo);
  CHECK_EQ_INT(solo.rc, 0);
  CHECK_EQ_INT(atomic_load(&solo.n), 40);
  /* again, with every embedding input submitted while it runs */
  gen_ctx g = {.m = m, .hold = true};
  pthread_t t;
  pthread_create(&t, NULL, gen_main, &g);
  while (atomic_load(&g.n) < 2) usleep(100);
  hearth_prompt in[8];
  for (int i = 0; i < r.n; i++) in[i] = (hearth_prompt){.ids = r.ids[i], .n_ids = (size_t)r.len[i]};
  float all[8 * 256];
  hearth_error err = {0};
  CHECK_MSG(hearth_embed(m, in, (size_t)r.n, NULL, all, NULL, &err) == 0, "%s", err.msg);
  pthread_join(t, NULL);
  for (int i = 0; i < r.n; i++) check_against("beside a generation", &r, i, all + (size_t)i * (size_t)r.dim, 1e-4);
  CHECK_EQ_INT(g.rc, 0);
  CHECK_EQ_INT(atomic_load(&g.n), 40);
  CHECK_MSG(memcmp(g.out, solo.out, sizeof g.out) == 0, "the generation changed when embeddings ran beside it");
  hearth_model_free(m);
  json_decref(r.doc);
}

/* ---- a bare decoder's folder ---- */

static char tmpdir[] = "/tmp/hearth_embed_XXXXXX";

typedef struct copy_ctx {
  const st_set *st;
  const st_tensor **src;
} copy_ctx;

static int copy_fill(void *ctx, int i, void *dst, herr *err) {
  (void)err;
  copy_ctx *c = ctx;
  memcpy(dst, c->src[i]->data, c->src[i]->nbytes);
  return 0;
}

static int write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fputs(text, f);
  return fclose(f);
}

/* dir: the golden qwen3 weights named as Qwen3Model saves them (no "model.", no lm_head, untied). */
static int make_bare(const char *dir) {
  herr err = {0};
  st_set st;
  if (st_open(&st, GOLDEN "/qwen3-f32/model.safetensors", &err)) return fprintf(stderr, "%s\n", err.msg), -1;
  st_writer *w = st_writer_new();
  const st_tensor **src = calloc(st.count, sizeof *src);
  int n = 0;
  for (size_t i = 0; i < st.count; i++) {
    const st_tensor *t = &st.tensors[i];
    if (strncmp(t->name, "model.", 6) != 0) continue; /* lm_head, if any */
    st_writer_tensor(w, t->name + 6, t->dtype, t->ndim, t->shape, NULL);
    src[n++] = t;
  }
  char path[600];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  copy_ctx cc = {&st, src};
  int rc = st_writer_write(w, path, copy_fill, &cc, &err);
  if (rc) fprintf(stderr, "%s\n", err.msg);
  st_writer_free(w);
  free(src);
  st_close(&st);
  json_t *cfg = hjson_load_file(GOLDEN "/qwen3-f32/config.json", &err);
  if (!cfg) return -1;
  json_object_set_new(cfg, "tie_word_embeddings", json_false());
  json_object_set_new(cfg, "architectures", json_pack("[s]", "Qwen3Model"));
  snprintf(path, sizeof path, "%s/config.json", dir);
  if (json_dump_file(cfg, path, JSON_INDENT(1))) rc = -1;
  json_decref(cfg);
  return rc;
}

static void test_bare_decoder(void) {
  char dir[600];
  snprintf(dir, sizeof dir, "%s/bare", tmpdir);
  mkdir(dir, 0755);
  CHECK(make_bare(dir) == 0);
  ref r;
  CHECK(ref_load(GOLDEN "/qwen3-f32", &r) == 0);
  hearth_model *m = load(dir, 0);
  CHECK(m != NULL);
  if (m && r.doc) {
    hearth_info info;
    hearth_model_info(m, &info);
    CHECK(!info.can_generate);
    CHECK(info.can_embed);
    hearth_prompt in[8];
    for (int i = 0; i < r.n; i++) in[i] = (hearth_prompt){.ids = r.ids[i], .n_ids = (size_t)r.len[i]};
    float all[8 * 256];
    hearth_error err = {0};
    CHECK_MSG(hearth_embed(m, in, (size_t)r.n, NULL, all, NULL, &err) == 0, "%s", err.msg);
    for (int i = 0; i < r.n; i++) check_against("bare decoder", &r, i, all + (size_t)i * (size_t)r.dim, 1e-4);
    /* no head: no logits, refused by name */
    hearth_signal_result sg;
    CHECK_EQ_INT(hearth_signal(m, &in[0], 20, 5, NULL, &sg, &err), HEARTH_EUNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "lm_head") != NULL, "%s", err.msg);
    hearth_gen_params p;
    hearth_gen_params_init(&p);
    p.max_tokens = 2;
    CHECK(hearth_generate(m, &in[0], &p, NULL, NULL, NULL, &err) != 0);
    CHECK_MSG(strstr(err.msg, "lm_head") != NULL, "%s", err.msg);
  }
  hearth_model_free(m);
  json_decref(r.doc);
}

/* ---- pooling over the prompt's tokens ---- */

#define PD 64 /* the qwen3 golden model's hidden size */
static const int32_t pool_ids[3][11] = {{1, 17, 230, 5, 99, 300, 41, 7, 8, 9, 10}, {1, 17, 230, 61}, {4, 400}};
static const int pool_len[3] = {11, 4, 2};
static float pool_ref[4][3][PD]; /* [sched_pool][input]: sums (unweighted, weighted), max; [0]: last */

/* The final hidden state of every prefix (pool LAST), then the pools the
 * scheduler makes in one go (prompts in chunks of 3, several in a step),
 * against sums and maxima of those states. */
static void test_pooled_probes(void) {
  herr e = {0};
  model *m = NULL;
  model_load_opts mo = {.threads = 2};
  CHECK_MSG(model_load(GOLDEN "/qwen3-f32", &mo, &m, &e) == 0, "%s", e.msg);
  if (!m) return;
  CHECK_EQ_INT((int)model_cfg(m)->hidden_size, PD);
  sched *s = NULL;
  sched_config cfg = {.max_batch = 8, .prefill_chunk = 3, .step_tokens = 8, .kv_bytes = 8u << 20};
  CHECK_MSG(sched_new(m, NULL, &cfg, &s, &e) == 0, "%s", e.msg);
  for (int i = 0; s && i < 3; i++) {
    float states[11][PD];
    sched_probe pr[11];
    for (int t = 0; t < pool_len[i]; t++) pr[t] = (sched_probe){.ids = pool_ids[i], .n_ids = (size_t)t + 1, .out = states[t]};
    CHECK_MSG(sched_probe_run(s, SCHED_EMBED, pr, pool_len[i], NULL, &e) == 0, "%s", e.msg);
    for (int d = 0; d < PD; d++) {
      double sum = 0, wsum = 0, mx = -INFINITY;
      for (int t = 0; t < pool_len[i]; t++) {
        sum += states[t][d], wsum += (t + 1) * (double)states[t][d];
        if (states[t][d] > mx) mx = states[t][d];
      }
      pool_ref[SCHED_POOL_LAST][i][d] = states[pool_len[i] - 1][d];
      pool_ref[SCHED_POOL_SUM][i][d] = (float)sum;
      pool_ref[SCHED_POOL_WSUM][i][d] = (float)wsum;
      pool_ref[SCHED_POOL_MAX][i][d] = (float)mx;
    }
  }
  /* every pool of every input in one run (the same prompts again: no prefix cache for the pooled) */
  float got[4][3][PD];
  sched_probe pr[12];
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < 3; i++)
      pr[k * 3 + i] = (sched_probe){.ids = pool_ids[i], .n_ids = (size_t)pool_len[i], .pool = (sched_pool)k, .out = got[k][i]};
  CHECK_MSG(s && sched_probe_run(s, SCHED_EMBED, pr, 12, NULL, &e) == 0, "%s", e.msg);
  double worst = 0;
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < 3; i++) {
      if (k) CHECK_EQ_INT((int)pr[k * 3 + i].cached_tokens, 0);
      for (int d = 0; d < PD; d++) {
        double err = fabs(got[k][i][d] - pool_ref[k][i][d]) / (1 + fabs(pool_ref[k][i][d]));
        if (err > worst) worst = err;
      }
    }
  CHECK_MSG(worst < 1e-5, "pooled embeddings differ from the pooled prefix states by %g", worst);
  /* a pool for a kind without one is refused */
  float lg[512];
  sched_probe bad = {.ids = pool_ids[0], .n_ids = 3, .pool = SCHED_POOL_SUM, .out = lg};
  CHECK_EQ_INT(sched_probe_run(s, SCHED_NEXT_LOGITS, &bad, 1, NULL, &e), HEARTH_EINVAL);
  sched_free(s);
  model_free(m);
}

/* v (n values) scaled to unit length, as hearth_embed gives it. */
static void unit(const float *v, double div, double *out, int n) {
  double ss = 0;
  for (int i = 0; i < n; i++) out[i] = v[i] / div, ss += out[i] * out[i];
  for (int i = 0; i < n; i++) out[i] /= sqrt(ss);
}

/* ---- sentence-transformers pooling files ---- */

static void test_pooling_files(void) {
  char dir[600], path[700];
  snprintf(dir, sizeof dir, "%s/st", tmpdir);
  mkdir(dir, 0755);
  for (int i = 0; i < 2; i++) {
    const char *f = i ? "model.safetensors" : "config.json";
    char from[600];
    snprintf(from, sizeof from, "%s/qwen3-f32/%s", GOLDEN, f);
    snprintf(path, sizeof path, "%s/%s", dir, f);
    CHECK(symlink(from, path) == 0);
  }
  snprintf(path, sizeof path, "%s/modules.json", dir);
  CHECK(write_file(path, "[{\"idx\":0,\"name\":\"0\",\"path\":\"\",\"type\":\"sentence_transformers.models.Transformer\"},"
                         "{\"idx\":1,\"name\":\"1\",\"path\":\"1_Pooling\",\"type\":\"sentence_transformers.models.Pooling\"},"
                         "{\"idx\":2,\"name\":\"2\",\"path\":\"2_Normalize\",\"type\":\"sentence_transformers.models.Normalize\"}]") == 0);
  snprintf(path, sizeof path, "%s/1_Pooling", dir);
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/1_Pooling/config.json", dir);
  static const char *const modes[][2] = {
      {"{\"word_embedding_dimension\":64,\"pooling_mode_cls_token\":false,\"pooling_mode_mean_tokens\":false,"
       "\"pooling_mode_lasttoken\":true,\"include_prompt\":true}", NULL},
      {"{\"pooling_mode_mean_tokens\":true,\"pooling_mode_lasttoken\":false}", NULL},
      {"{\"pooling_mode_cls_token\":true}", NULL},
      {"{\"pooling_mode_max_tokens\":true}", NULL},
      {"{\"pooling_mode_mean_sqrt_len_tokens\":true}", NULL},
      {"{\"pooling_mode_weightedmean_tokens\":true}", NULL},
      {"{\"pooling_mode_lasttoken\":true,\"pooling_mode_mean_tokens\":true}", "2 pooling modes"},
  };
  hearth_prompt in = {.ids = pool_ids[0], .n_ids = (size_t)pool_len[0]};
  /* per mode above: the reference (from test_pooled_probes) and what divides it */
  double n0 = pool_len[0];
  const float *want[] = {pool_ref[SCHED_POOL_LAST][0], pool_ref[SCHED_POOL_SUM][0], NULL, pool_ref[SCHED_POOL_MAX][0],
                         pool_ref[SCHED_POOL_SUM][0], pool_ref[SCHED_POOL_WSUM][0]};
  double div[] = {1, n0, 1, 1, sqrt(n0), n0 * (n0 + 1) / 2};
  float first[PD]; /* cls: the first token's state, the one-token prefix's */
  {
    hearth_model *m1 = load(GOLDEN "/qwen3-f32", 0);
    hearth_prompt one = {.ids = pool_ids[0], .n_ids = 1};
    hearth_error err = {0};
    CHECK(m1 && hearth_embed(m1, &one, 1, NULL, first, NULL, &err) == 0);
    hearth_model_free(m1);
  }
  for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
    CHECK(write_file(path, modes[k][0]) == 0);
    hearth_model *m = load(dir, 0);
    CHECK(m != NULL);
    if (!m) continue;
    hearth_info info;
    hearth_model_info(m, &info);
    CHECK_EQ_INT(info.can_embed, modes[k][1] == NULL);
    float v[PD];
    hearth_error err = {0};
    int rc = hearth_embed(m, &in, 1, NULL, v, NULL, &err);
    if (!modes[k][1]) {
      CHECK_MSG(rc == 0, "%s", err.msg);
      double u[PD];
      unit(want[k] ? want[k] : first, want[k] ? div[k] : 1, u, PD);
      double worst = 0;
      for (int d = 0; d < PD; d++) worst = fmax(worst, fabs(v[d] - u[d]));
      CHECK_MSG(worst < 1e-5, "pooling mode %zu (%s): %g from the pooled prefix states", k, modes[k][0], worst);
    } else {
      CHECK_EQ_INT(rc, HEARTH_EUNSUPPORTED);
      CHECK_MSG(strstr(err.msg, modes[k][1]) != NULL, "mode %zu: %s", k, err.msg);
    }
    hearth_model_free(m);
  }
  /* a Dense module hearth does not run: refused, naming it */
  snprintf(path, sizeof path, "%s/modules.json", dir);
  CHECK(write_file(path, "[{\"path\":\"1_Pooling\",\"type\":\"sentence_transformers.models.Pooling\"},"
                         "{\"path\":\"2_Dense\",\"type\":\"sentence_transformers.models.Dense\"}]") == 0);
  snprintf(path, sizeof path, "%s/1_Pooling/config.json", dir);
  CHECK(write_file(path, modes[0][0]) == 0);
  hearth_model *m = load(dir, 0);
  if (m) {
    float v[64];
    hearth_error err = {0};
    CHECK_EQ_INT(hearth_embed(m, &in, 1, NULL, v, NULL, &err), HEARTH_EUNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "Dense") != NULL, "%s", err.msg);
    hearth_model_free(m);
  }
  /* a path out of the folder, and broken JSON: the model does not load, and says why */
  snprintf(path, sizeof path, "%s/modules.json", dir);
  static const char *const broken[][2] = {
      {"[{\"path\":\"../../etc\",\"type\":\"sentence_transformers.models.Pooling\"}]", "not a folder name"},
      {"[{\"path\":\"1_Pooling\"}]", "type"},
      {"{\"a\":", "invalid JSON"},
  };
  for (size_t k = 0; k < sizeof broken / sizeof broken[0]; k++) {
    CHECK(write_file(path, broken[k][0]) == 0);
    hearth_load_opts o = {.threads = 1};
    hearth_error err = {0};
    hearth_model *bm = NULL;
    CHECK(hearth_model_load(dir, &o, &bm, &err) != 0);
    CHECK_MSG(strstr(err.msg, broken[k][1]) != NULL && strstr(err.msg, "modules.json") != NULL, "%s", err.msg);
    hearth_model_free(bm);
  }
}

/* ---- the signal ---- */

static void test_logit_signal(void) {
  float row[6] = {0, 0, -INFINITY, NAN, -100, 1e-9f};
  row[5] = 0; /* three equal finite logits at 0, one far below */
  hearth_signal_result s;
  herr err = {0};
  CHECK(logit_signal(row, 6, 10, 3, &s, &err) == 0);
  CHECK_EQ_INT(s.n_tokens, 4);
  CHECK_EQ_INT(s.n_bins, 10);
  /* log(1/3) = -1.0986 falls in the last bin of [-30, 0] in 10 (width 3); -100 - log 3 in the first */
  CHECK_EQ_INT(s.counts[9], 3);
  CHECK_EQ_INT(s.counts[0], 1);
  int64_t total = 0;
  double mass = 0;
  for (int i = 0; i < 10; i++) total += s.counts[i], mass += s.mass[i];
  CHECK_EQ_INT(total, 4);
  CHECK_NEAR(mass, 1.0, 1e-12);
  CHECK_NEAR(s.entropy, log(3.0), 1e-9);
  CHECK_NEAR(s.max_logprob, -log(3.0), 1e-9);
  CHECK_EQ_INT(s.n_top, 3);
  CHECK_EQ_INT(s.top_ids[0], 0);
  CHECK_EQ_INT(s.top_ids[1], 1);
  CHECK_EQ_INT(s.top_ids[2], 5);
  CHECK_EQ_INT(logit_signal(row, 6, 0, 3, &s, &err), HEARTH_EINVAL);
  CHECK_EQ_INT(logit_signal(row, 6, HEARTH_SIGNAL_MAX_BINS + 1, 3, &s, &err), HEARTH_EINVAL);
  CHECK_EQ_INT(logit_signal(row, 6, 5, HEARTH_MAX_TOP_LOGPROBS + 1, &s, &err), HEARTH_EINVAL);
  float none[2] = {NAN, -INFINITY};
  CHECK_EQ_INT(logit_signal(none, 2, 5, 1, &s, &err), HEARTH_EINVAL);
}

/* hearth_signal on the golden model against the reference logits of the first prompt's last token. */
static void test_signal_golden(void) {
  herr err = {0};
  json_t *doc = hjson_load_file(GOLDEN "/qwen3-f32/golden.json", &err);
  CHECK_MSG(doc != NULL, "%s", err.msg);
  if (!doc) return;
  json_t *p0 = json_array_get(json_object_get(doc, "prompts"), 0);
  int n = (int)json_array_size(p0);
  int64_t V = json_integer_value(json_object_get(doc, "vocab_size"));
  int32_t ids[64];
  for (int i = 0; i < n && i < 64; i++) ids[i] = (int32_t)json_integer_value(json_array_get(p0, i));
  char *bin = NULL;
  size_t len = 0;
  CHECK(hfile_read(GOLDEN "/qwen3-f32/logits_f32.bin", &bin, &len, &err) == 0);
  hearth_model *m = load(GOLDEN "/qwen3-f32", 0);
  if (bin && m && n <= 64 && len >= (size_t)n * (size_t)V * 4) {
    const float *ref = (const float *)bin + (size_t)(n - 1) * (size_t)V;
    double mx = -INFINITY, sum = 0, ent = 0;
    for (int64_t i = 0; i < V; i++) mx = ref[i] > mx ? ref[i] : mx;
    for (int64_t i = 0; i < V; i++) sum += exp(ref[i] - mx);
    int best = 0;
    for (int64_t i = 0; i < V; i++) {
      double lp = ref[i] - mx - log(sum);
      ent -= exp(lp) * lp;
      if (ref[i] > ref[best]) best = (int)i;
    }
    hearth_prompt pr = {.ids = ids, .n_ids = (size_t)n};
    hearth_signal_result s;
    hearth_error e = {0};
    CHECK_MSG(hearth_signal(m, &pr, 20, 5, NULL, &s, &e) == 0, "%s", e.msg);
    CHECK_EQ_INT(s.n_tokens, V);
    CHECK_EQ_INT(s.prompt_tokens, n);
    CHECK_EQ_INT(s.top_ids[0], best);
    CHECK_NEAR(s.top_logprobs[0], ref[best] - mx - log(sum), 1e-4);
    CHECK_NEAR(s.entropy, ent, 1e-4);
    int64_t total = 0;
    for (int i = 0; i < s.n_bins; i++) total += s.counts[i];
    CHECK_EQ_INT(total, V);
  }
  free(bin);
  hearth_model_free(m);
  json_decref(doc);
}

int main(void) {
  CHECK(mkdtemp(tmpdir) != NULL);
  test_logit_signal();
  test_golden("qwen3-f32", 1e-4);
  test_golden("qwen3-bf16", 1e-3);
  test_beside_generation();
  test_bare_decoder();
  test_pooled_probes();
  test_pooling_files();
  test_signal_golden();
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  printf("test_embed: %d checks, %d failures\n", test_checks, test_failures);
  return test_failures ? 1 : 0;
}
