/* test_trainer.c — the LoRA trainer (src/train). On the built-in model and
 * the golden llama-family models (llama, mistral, smollm3, qwen2, qwen3,
 * gemma2, gemma3, phi3) its forward equals the model's, and its
 * gradient of the whole model's loss matches finite differences of that loss
 * in a few adapter parameters of every target (dropout too, its masks
 * replayed); other families are refused by name. With PEFT's own adapters
 * (the LoRA fixtures) loaded, its logits are PEFT's float64 reference, and
 * what it writes reads back. Data lines render through the chat template
 * with the loss on the assistant's tokens only. The tiny task, on the
 * built-in model: 300 chat lines of one pattern ("Say the word: W" →
 * "W W W", W one of 16 words), 80 steps of 4 lines with every linear layer
 * adapted, drive the loss on 16 other lines of it below a tenth of where it
 * started; the adapter loads through model_lora_load, the model's forward
 * under it equals the trainer's and differs from the base, and greedy
 * decoding under it follows the pattern. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/kv_cache.h"
#include "format/safetensors.h"
#include "model/model.h"
#include "test.h"
#include "train/train.h"

#define MODEL HEARTH_SOURCE_DIR "/models/default"

/* Under the sanitizers the task runs a few steps only (the same code paths; the learning is checked in the plain build). */
#if defined(__SANITIZE_ADDRESS__)
#define TASK_STEPS 6
#else
#define TASK_STEPS 80
#endif

static const char *const words[] = {"apple", "river", "stone", "light", "bread", "sheep", "wind", "gold",
                                    "fire",  "tree",  "water", "lamp",  "door",  "hill",  "sea",  "star"};
#define N_WORDS 16

static char tmpdir[256];

static void make_tmp(void) {
  if (tmpdir[0]) return;
  snprintf(tmpdir, sizeof tmpdir, "/tmp/hearth_train_XXXXXX");
  if (!mkdtemp(tmpdir)) tmpdir[0] = 0;
}

/* n lines of the pattern, words chosen by a seeded generator. */
static void write_task(const char *path, int n, uint64_t seed) {
  FILE *f = fopen(path, "w");
  for (int i = 0; f && i < n; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    int w = (int)((seed >> 33) % N_WORDS);
    fprintf(f,
            "{\"messages\": [{\"role\": \"user\", \"content\": \"Say the word: %s\"}, {\"role\": \"assistant\", "
            "\"content\": \"%s %s %s\"}]}\n",
            words[w], words[w], words[w], words[w]);
  }
  if (f) fclose(f);
}

/* Every position's logits of ids through the model (a KV cache of its own) under adapter a (NULL: none). */
static int model_logits(model *m, const int32_t *ids, int n, model_lora *a, float *out) {
  herr err = {0};
  model_kv_geometry geo;
  model_kv_geometry_of(m, &geo);
  kv_cache *c = NULL;
  kv_seq *s = NULL;
  int rc = kv_cache_new(&geo, 0, &c, &err) || kv_cache_seq_new(c, &s, &err);
  model_lora *la[1] = {a};
  model_seq sq = {.kv = s, .tokens = ids, .n_tokens = n, .all_logits = true, .lora = (const model_lora *const *)la,
                  .n_lora = a ? 1 : 0};
  model_batch b = {&sq, 1};
  if (!rc) rc = model_forward(m, &b, out, &err);
  if (rc) fprintf(stderr, "model forward: %s\n", err.msg);
  kv_cache_seq_free(s);
  kv_cache_free(c);
  return rc;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
  double d = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - b[i]);
    if (!(e <= d)) d = isnan(e) ? INFINITY : e;
  }
  return d;
}

static void test_data(void) {
  train_opts o;
  train_opts_init(&o);
  o.model_dir = MODEL;
  trainer *t = NULL;
  herr err = {0};
  CHECK_MSG(trainer_new(&o, &t, &err) == 0, "%s", err.msg);
  if (!t) return;
  const tokenizer *tok = trainer_tokenizer(t);
  json_t *j = json_loads("{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
                         "\"Hi\"}, {\"role\": \"assistant\", \"content\": \"Peace.\"}, {\"role\": \"user\", \"content\": "
                         "\"More\"}, {\"role\": \"assistant\", \"content\": \"Amen.\"}]}",
                         0, NULL);
  train_example ex;
  CHECK_MSG(train_example_from_json(j, "line", tok, trainer_template(t), 512, &ex, &err) == 0, "%s", err.msg);
  /* the learned tokens decode to exactly the assistant turns with their end markers */
  int32_t learned[64];
  int64_t nl = 0;
  for (int64_t i = 0; i < ex.n && nl < 64; i++)
    if (ex.loss[i]) learned[nl++] = ex.ids[i];
  hbuf text = {0}, all = {0};
  tokenizer_decode(tok, learned, (size_t)nl, false, &text, &err);
  tokenizer_decode(tok, ex.ids, (size_t)ex.n, false, &all, &err);
  CHECK_EQ_STR(hbuf_str(&text), "Peace.<|end|>\nAmen.<|end|>\n");
  CHECK_EQ_STR(hbuf_str(&all), "<|bos|><|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nPeace.<|end|>\n"
                               "<|user|>\nMore<|end|>\n<|assistant|>\nAmen.<|end|>\n");
  hbuf_free(&text), hbuf_free(&all);
  free(ex.ids), free(ex.loss);
  json_decref(j);
  /* prompt / completion: BOS + prompt unlearned, completion + EOS learned */
  j = json_loads("{\"prompt\": \"In the beginning\", \"completion\": \" God created\"}", 0, NULL);
  CHECK_MSG(train_example_from_json(j, "line", tok, NULL, 512, &ex, &err) == 0, "%s", err.msg);
  CHECK(ex.n >= 4 && ex.ids[0] == tokenizer_bos_id(tok) && ex.ids[ex.n - 1] == tokenizer_eos_id(tok) && ex.loss[ex.n - 1] && !ex.loss[0]);
  nl = 0;
  for (int64_t i = 0; i < ex.n; i++)
    if (ex.loss[i] && ex.ids[i] != tokenizer_eos_id(tok)) learned[nl++] = ex.ids[i];
  tokenizer_decode(tok, learned, (size_t)nl, false, &text, &err);
  CHECK_EQ_STR(hbuf_str(&text), " God created");
  hbuf_free(&text);
  free(ex.ids), free(ex.loss);
  json_decref(j);
  /* bad lines say what is wrong */
  const char *bad[] = {"[1]", "{\"text\": \"x\"}", "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}",
                       "{\"prompt\": \"x\", \"completion\": 3}", "{\"messages\": [{\"content\": \"Hi\"}]}"};
  const char *want[] = {"not a JSON object", "needs \"messages\"", "no assistant message", "must both be strings", "no \"role\""};
  for (int i = 0; i < 5; i++) {
    j = json_loads(bad[i], 0, NULL);
    herr e2 = {0};
    CHECK(train_example_from_json(j, "line 7", tok, trainer_template(t), 512, &ex, &e2) != 0);
    CHECK_MSG(strstr(e2.msg, want[i]) && strstr(e2.msg, "line 7"), "%s", e2.msg);
    json_decref(j);
  }
  unsigned tg = 0;
  CHECK(train_targets_parse("q_proj,v,down_proj", &tg, &err) == 0 && tg == ((1u << TT_Q) | (1u << TT_V) | (1u << TT_DOWN)));
  CHECK(train_targets_parse("q_proj,lm_head", &tg, &err) != 0 && strstr(err.msg, "lm_head"));
  trainer_free(t);
}

static void test_schedule(void) {
  CHECK_NEAR(train_lr_at(1e-3, 0, 10, 100), 0, 1e-15);
  CHECK_NEAR(train_lr_at(1e-3, 5, 10, 100), 5e-4, 1e-12);
  CHECK_NEAR(train_lr_at(1e-3, 10, 10, 100), 1e-3, 1e-12);
  CHECK_NEAR(train_lr_at(1e-3, 55, 10, 100), 5e-4, 1e-12);
  CHECK(train_lr_at(1e-3, 99, 10, 100) < 1e-5);
}

/* The trainer's forward (LoRA B = 0 at the start: the base model) against the model's, and its gradient of the
 * whole model's loss against finite differences in a few adapter parameters of every target; on the built-in model
 * (bf16, tied head) and the golden llama-family models: f32 with its own head, llama3 and yarn RoPE, a sliding
 * window shorter than the sequence (mistral), layers without RoPE (smollm3). */
static void forward_and_gradient(const char *dir, double dropout) {
  fprintf(stderr, "  %s%s\n", dir, dropout > 0 ? " (dropout)" : "");
  train_opts o;
  train_opts_init(&o);
  o.model_dir = dir;
  o.targets = (1u << TT_N) - 1;
  o.rank = 4;
  o.seed = 3;
  o.dropout = dropout;
  trainer *t = NULL;
  herr err = {0};
  CHECK_MSG(trainer_new(&o, &t, &err) == 0, "%s", err.msg);
  if (!t) return;
  model *m = NULL;
  model_load_opts lo = {.threads = 2};
  CHECK_MSG(model_load(dir, &lo, &m, &err) == 0, "%s", err.msg);
  int64_t V = m ? model_vocab_size(m) : 1;
  int32_t ids[12] = {0, 4, 10, 300, 52, 1000, 77, 2, 5, 10, 812, 9};
  for (int i = 0; i < 12; i++) ids[i] = (int32_t)(ids[i] % V);
  float *a = malloc(sizeof(float) * 12 * V), *b = malloc(sizeof(float) * 12 * V);
  CHECK(trainer_logits(t, ids, 12, a, &err) == 0);
  if (m && model_logits(m, ids, 12, NULL, b) == 0) {
    double d = max_abs_diff(a, b, 12 * (size_t)V);
    CHECK_MSG(d < 2e-3, "trainer forward differs from the model's by %.3g", d);
  }
  /* the gradient: B made non-zero so every path carries gradient */
  int64_t P;
  float *p = trainer_params(t, &P);
  uint64_t s = 11;
  for (int64_t i = 0; i < P; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] += (float)(((double)(s >> 11) / 9007199254740992.0 - 0.5) * 0.05);
  }
  train_example ex = {.ids = ids, .loss = (uint8_t[12]){0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 1}, .n = 12};
  double loss = 0;
  int64_t count = 0;
  trainer_reseed(t, 99); /* with dropout: the same masks in every forward below */
  CHECK(trainer_loss(t, &ex, true, 1.0f / 8, &loss, &count, &err) == 0);
  CHECK_EQ_INT(count, 8);
  float *g = malloc(sizeof(float) * P);
  memcpy(g, trainer_grads(t), sizeof(float) * P);
  /* the largest gradients of 12 spread blocks of the parameters (every target of a few layers, A and B) */
  int checked = 0, bad = 0;
  for (int blk = 0; blk < 12; blk++) {
    int64_t lo_i = P * blk / 12, hi_i = P * (blk + 1) / 12, best = lo_i;
    for (int64_t i = lo_i; i < hi_i; i++)
      if (fabsf(g[i]) > fabsf(g[best])) best = i;
    float keep = p[best], h = 2e-3f;
    double lp = 0, lm = 0;
    int64_t c = 0;
    /* a training forward (dropout on) whose gradients, scaled by 0, add nothing */
    p[best] = keep + h;
    trainer_reseed(t, 99);
    trainer_loss(t, &ex, dropout > 0, 0, &lp, &c, &err);
    p[best] = keep - h;
    trainer_reseed(t, 99);
    trainer_loss(t, &ex, dropout > 0, 0, &lm, &c, &err);
    p[best] = keep;
    double fd = (lp - lm) / (2.0 * h) / 8.0, e = fabs(fd - g[best]) / fmax(fabs(fd), 1e-3);
    checked++;
    if (!(e < 2e-2)) {
      bad++;
      fprintf(stderr, "param %lld: gradient %.6g, finite differences %.6g\n", (long long)best, g[best], fd);
    }
  }
  CHECK_MSG(bad == 0, "%d of %d adapter gradients disagree with finite differences of the model's loss", bad, checked);
  /* the adapter as written loads into the model (hearth's --adapter), whose forward under it is the trainer's */
  if (m && tmpdir[0] && dropout == 0) {
    char ad[600];
    snprintf(ad, sizeof ad, "%s/fg-%s", tmpdir, strrchr(dir, '/') + 1);
    model_lora *lo_ad = NULL;
    CHECK_MSG(trainer_save(t, ad, &err) == 0, "%s", err.msg);
    CHECK_MSG(model_lora_load(m, ad, &lo_ad, &err) == 0, "%s: %s", ad, err.msg);
    if (lo_ad && trainer_logits(t, ids, 12, a, &err) == 0 && model_logits(m, ids, 12, lo_ad, b) == 0) {
      double d = max_abs_diff(a, b, 12 * (size_t)V);
      CHECK_MSG(d < 2e-3, "%s: the model under the written adapter differs from the trainer by %.3g", dir, d);
    }
    if (lo_ad) model_lora_release(lo_ad);
  }
  free(g), free(a), free(b);
  model_free(m);
  trainer_free(t);
}

static void test_forward_and_gradient(void) {
  forward_and_gradient(MODEL, 0);
  const char *golden[] = {"llama-f32",  "llama_llama3-f32", "llama_yarn-f32", "mistral-f32", "smollm3-f32", "qwen2-f32",
                          "qwen3-f32",  "gemma2-f32",       "gemma3-f32",     "gemma2-bf16", "phi3-f32"};
  for (int i = 0; i < 11; i++) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/golden/%s", HEARTH_SOURCE_DIR, golden[i]);
    forward_and_gradient(dir, 0);
    if (i == 0) forward_and_gradient(dir, 0.3);
  }
  /* what the trainer does not run is refused by name */
  const char *refused[] = {"qwen3_moe-f32", "gemma4-f32", "qwen3_5-f32"};
  for (int i = 0; i < 3; i++) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/golden/%s", HEARTH_SOURCE_DIR, refused[i]);
    train_opts o;
    train_opts_init(&o);
    o.model_dir = dir;
    trainer *t = NULL;
    herr err = {0};
    CHECK(trainer_new(&o, &t, &err) == HEARTH_EUNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "not trained yet") || strstr(err.msg, "does not run yet"), "%s: %s", refused[i], err.msg);
    trainer_free(t);
  }
}

/* PEFT's own adapters (tests/fixtures/lora, made by tools/gen_lora_golden.py) loaded into the trainer: its forward
 * gives PEFT's float64 reference logits (base + scale · B · A merged) within the golden tolerance; and an adapter the
 * trainer writes reads back into another trainer as it was. */
static void test_peft_adapters(void) {
  const char *base = HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-f32", *lora = HEARTH_SOURCE_DIR "/tests/fixtures/lora/llama-f32";
  char path[600];
  snprintf(path, sizeof path, "%s/golden.json", lora);
  json_t *doc = json_load_file(path, 0, NULL);
  CHECK_MSG(doc != NULL, "%s", path);
  if (!doc) return;
  struct {
    const char *name, *file;
    int64_t r;
    double alpha;
    bool rs;
    unsigned targets;
  } cases[] = {{"plain", "logits_plain.bin", 8, 16, false, (1u << TT_Q) | (1u << TT_K) | (1u << TT_V) | (1u << TT_O)},
               {"rs", "logits_rs.bin", 4, 8, true, (1u << TT_GATE) | (1u << TT_UP) | (1u << TT_DOWN)}};
  const json_t *prompts = json_object_get(doc, "prompts");
  int64_t V = 512, rows = 0;
  for (size_t p = 0; p < json_array_size(prompts); p++) rows += (int64_t)json_array_size(json_array_get(prompts, p));
  for (int c = 0; c < 2; c++) {
    train_opts o;
    train_opts_init(&o);
    o.model_dir = base, o.rank = cases[c].r, o.alpha = cases[c].alpha, o.rslora = cases[c].rs, o.targets = cases[c].targets;
    trainer *t = NULL;
    herr err = {0};
    CHECK_MSG(trainer_new(&o, &t, &err) == 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/%s", lora, cases[c].name);
    CHECK_MSG(t && trainer_load_adapter(t, path, &err) == 0, "%s: %s", path, err.msg);
    snprintf(path, sizeof path, "%s/%s", lora, cases[c].file);
    float *ref = malloc(sizeof(float) * rows * V), *got = malloc(sizeof(float) * rows * V);
    FILE *f = fopen(path, "rb");
    CHECK(f && fread(ref, sizeof(float), (size_t)(rows * V), f) == (size_t)(rows * V));
    if (f) fclose(f);
    int64_t at = 0;
    for (size_t p = 0; t && p < json_array_size(prompts); p++) {
      const json_t *pr = json_array_get(prompts, p);
      int32_t ids[64];
      int64_t n = (int64_t)json_array_size(pr);
      for (int64_t i = 0; i < n && i < 64; i++) ids[i] = (int32_t)json_integer_value(json_array_get(pr, (size_t)i));
      CHECK(n <= 64 && trainer_logits(t, ids, n, got + at * V, &err) == 0);
      at += n;
    }
    double d = max_abs_diff(got, ref, (size_t)(rows * V));
    fprintf(stderr, "  PEFT adapter %s: the trainer's logits within %.3g of PEFT's float64 reference\n", cases[c].name, d);
    CHECK_MSG(d <= 1e-4, "%s: %.3g from PEFT's reference", cases[c].name, d);
    /* written and read back */
    if (t && c == 1) {
      char dir[300];
      snprintf(dir, sizeof dir, "/tmp/hearth_train_rt_%d", (int)getpid());
      CHECK_MSG(trainer_save(t, dir, &err) == 0, "%s", err.msg);
      trainer *u = NULL;
      CHECK(trainer_new(&o, &u, &err) == 0);
      CHECK_MSG(u && trainer_load_adapter(u, dir, &err) == 0, "%s", err.msg);
      int64_t P1, P2;
      float *p1 = trainer_params(t, &P1), *p2 = u ? trainer_params(u, &P2) : NULL;
      CHECK(p2 && P1 == P2 && !memcmp(p1, p2, sizeof(float) * (size_t)P1));
      trainer_free(u);
      /* a trainer of another rank refuses it by name */
      o.rank = 2;
      CHECK(trainer_new(&o, &u, &err) == 0);
      CHECK(u && trainer_load_adapter(u, dir, &err) != 0 && strstr(err.msg, "lora_A"));
      trainer_free(u);
      char cmd[400];
      snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
      if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    }
    free(ref), free(got);
    trainer_free(t);
  }
  json_decref(doc);
}

static char *greedy(model *m, model_lora *ad, const tokenizer *tok, const char *word) {
  char prompt[256];
  snprintf(prompt, sizeof prompt, "<|bos|><|user|>\nSay the word: %s<|end|>\n<|assistant|>\n", word);
  int32_t *ids = NULL;
  size_t n = 0;
  herr err = {0};
  if (tokenizer_encode(tok, prompt, strlen(prompt), false, true, &ids, &n, &err)) return NULL;
  int32_t seq[128];
  memcpy(seq, ids, n * sizeof *ids);
  free(ids);
  float *lg = malloc(sizeof(float) * 128 * 4096);
  size_t start = n;
  while (n < start + 12) {
    if (model_logits(m, seq, (int)n, ad, lg)) break;
    const float *row = lg + (n - 1) * 4096;
    int32_t best = 0;
    for (int32_t v = 1; v < 4096; v++)
      if (row[v] > row[best]) best = v;
    if (best == 2 || best == 1) break; /* <|end|>, <|eos|> */
    seq[n++] = best;
  }
  free(lg);
  hbuf out = {0};
  tokenizer_decode(tok, seq + start, n - start, false, &out, &err);
  return hbuf_take(&out);
}

/* Training on the task, its adapter loaded by the model, and what greedy decoding then says. */
static void test_train_task(void) {
  make_tmp();
  CHECK(tmpdir[0]);
  char data[512], eval[512], out[512], logp[512];
  snprintf(data, sizeof data, "%s/train.jsonl", tmpdir);
  snprintf(eval, sizeof eval, "%s/eval.jsonl", tmpdir);
  snprintf(out, sizeof out, "%s/adapter", tmpdir);
  snprintf(logp, sizeof logp, "%s/log.jsonl", tmpdir);
  write_task(data, 300, 1);
  write_task(eval, 16, 2); /* other lines of the same pattern */
  train_opts o;
  train_opts_init(&o);
  o.model_dir = MODEL, o.data = data, o.eval = eval, o.out = out, o.log = logp;
  o.steps = TASK_STEPS, o.lr = 3e-3, o.batch = 4, o.seed = 7, o.threads = 2, o.warmup = 4;
  o.targets = (1u << TT_N) - 1; /* every linear layer: q_proj and v_proj alone learn this more slowly */
  o.progress = stderr;
  train_result res;
  herr err = {0};
  CHECK_MSG(train_sft(&o, &res, &err) == 0, "%s", err.msg);
  CHECK_EQ_INT(res.steps, TASK_STEPS);
  if (TASK_STEPS < 80) {
    fprintf(stderr, "NOT RUN under the sanitizers: the task's learning checks (%d steps only)\n", TASK_STEPS);
    CHECK_MSG(res.eval_last < res.eval_first, "eval loss %.4f -> %.4f", res.eval_first, res.eval_last);
  } else {
    CHECK_MSG(res.eval_last < 0.1 * res.eval_first, "eval loss %.4f -> %.4f: not below a tenth", res.eval_first, res.eval_last);
  }
  /* the log: a line per step and the evaluations */
  FILE *f = fopen(logp, "r");
  int lines = 0, evals = 0;
  char line[512];
  while (f && fgets(line, sizeof line, f)) {
    json_t *j = json_loads(line, 0, NULL);
    CHECK(j != NULL);
    if (json_object_get(j, "eval_loss")) evals++;
    else if (json_is_number(json_object_get(j, "loss")) && json_is_number(json_object_get(j, "grad_norm"))) lines++;
    json_decref(j);
  }
  if (f) fclose(f);
  CHECK_EQ_INT(lines, TASK_STEPS);
  CHECK_EQ_INT(evals, 2);
  /* the adapter as PEFT lays it out, loaded by the model */
  char cfg[600];
  snprintf(cfg, sizeof cfg, "%s/adapter_config.json", out);
  json_t *c = json_load_file(cfg, 0, NULL);
  CHECK(c && json_integer_value(json_object_get(c, "r")) == 8 && json_array_size(json_object_get(c, "target_modules")) == 7);
  json_decref(c);
  model *m = NULL;
  model_load_opts lo = {.threads = 2};
  CHECK_MSG(model_load(MODEL, &lo, &m, &err) == 0, "%s", err.msg);
  model_lora *ad = NULL;
  if (m) CHECK_MSG(model_lora_load(m, out, &ad, &err) == 0, "%s", err.msg);
  if (ad) {
    CHECK_EQ_INT(model_lora_modules(ad), 56); /* the 7 projections of 8 layers */
    /* the model under the adapter equals the trainer's forward with the trained adapter, and differs from the base */
    train_opts o2 = o;
    o2.progress = NULL;
    trainer *t = NULL;
    CHECK(trainer_new(&o2, &t, &err) == 0);
    st_set st = {0};
    char sp[600];
    snprintf(sp, sizeof sp, "%s/adapter_model.safetensors", out);
    if (t && st_open(&st, sp, &err) == 0) {
      /* load the written tensors back into the trainer's parameters, in its order (the file's names) */
      int64_t P;
      float *p = trainer_params(t, &P);
      int64_t at = 0;
      for (int l = 0; l < 8; l++)
        for (int k = 0; k < TT_N; k++)
          for (int ab = 0; ab < 2; ab++) {
            char name[160];
            snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", l, k <= TT_O ? "self_attn" : "mlp",
                     train_target_name(k), ab ? 'B' : 'A');
            const st_tensor *ten = st_find(&st, name);
            CHECK_MSG(ten != NULL, "%s missing", name);
            if (!ten) continue;
            int64_t nel = ten->shape[0] * ten->shape[1];
            memcpy(p + at, ten->data, sizeof(float) * nel);
            at += nel;
          }
      CHECK_EQ_INT(at, P);
      st_close(&st);
      int32_t ids[10] = {0, 4, 10, 300, 52, 1000, 77, 2, 5, 10};
      float *a = malloc(sizeof(float) * 10 * 4096), *b = malloc(sizeof(float) * 10 * 4096), *base = malloc(sizeof(float) * 10 * 4096);
      CHECK(trainer_logits(t, ids, 10, a, &err) == 0);
      CHECK(model_logits(m, ids, 10, ad, b) == 0);
      CHECK(model_logits(m, ids, 10, NULL, base) == 0);
      double same = max_abs_diff(a, b, 10 * 4096), moved = max_abs_diff(base, b, 10 * 4096);
      CHECK_MSG(same < 2e-3, "the model under the adapter differs from the trainer's forward by %.3g", same);
      CHECK_MSG(moved > 0.1, "the adapter moves the logits by only %.3g", moved);
      free(a), free(b), free(base);
    }
    /* greedy decoding on fresh prompts follows the pattern */
    int follows = 0;
    for (int w = 3; TASK_STEPS >= 80 && w < N_WORDS; w += 4) {
      char *s = greedy(m, ad, trainer_tokenizer(t), words[w]);
      char want[64];
      snprintf(want, sizeof want, "%s %s %s", words[w], words[w], words[w]);
      if (s && !strcmp(s, want)) follows++;
      else fprintf(stderr, "greedy for '%s': \"%s\"\n", words[w], s ? s : "(null)");
      free(s);
    }
    if (TASK_STEPS >= 80) CHECK_MSG(follows == 4, "greedy output follows the pattern for %d of 4 words", follows);
    trainer_free(t);
    model_lora_release(ad);
  }
  model_free(m);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (tmpdir[0] && system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
}

int main(void) {
  make_tmp();
  RUN(test_schedule);
  RUN(test_data);
  RUN(test_forward_and_gradient);
  RUN(test_peft_adapters);
  RUN(test_train_task);
  if (tmpdir[0]) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  }
  TEST_MAIN_END();
}
