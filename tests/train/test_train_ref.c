/* test_train_ref.c — the trainer against float64 references of a LoRA
 * training run (tests/fixtures/train): on the golden models (float32) of
 * every family the trainer runs (llama, mistral, qwen2, qwen3, smollm3,
 * gemma2, gemma3, phi3 with its fused projections adapted whole),
 * starting from the reference's adapter (r 4, alpha 8, every projection),
 * one batch's loss, every LoRA parameter's gradient, and the adapter after 3
 * AdamW steps with clipping and the cosine schedule. NAME-torch is torch's
 * autograd over the family's forward checked against transformers' golden
 * logits (tools/gen_train_torch_ref.py); llama-f32, when present, is PEFT +
 * transformers themselves (tools/gen_train_ref.py). llama-f32-torch-pref
 * (the same tool): DPO's and ORPO's losses and every LoRA gradient on two
 * pairs, the reference model's log-probs (the adapter off) and the policy's. */
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/safetensors.h"
#include "test.h"
#include "train/train.h"

#define REFS HEARTH_SOURCE_DIR "/tests/fixtures/train"

static const char *const names[TT_N] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
/* phi3's fused projections: the q slot is qkv_proj, the gate slot gate_up_proj, no k / v / up slots */
static const char *const fused_names[TT_N] = {"qkv_proj", NULL, NULL, "o_proj", "gate_up_proj", NULL, "down_proj"};

/* The largest |got − ref| over a tensor relative to the tensor's largest |ref|. */
static double rel_err(const float *got, const st_tensor *ref) {
  double worst = 0, scale = 1e-12;
  for (int64_t i = 0; i < ref->numel; i++) {
    double r;
    if (ref->dtype == ST_F64) memcpy(&r, (const char *)ref->data + 8 * i, 8);
    else {
      float f;
      memcpy(&f, (const char *)ref->data + 4 * i, 4);
      r = f;
    }
    scale = fmax(scale, fabs(r));
    double e = fabs(got[i] - r);
    if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
  }
  return worst / scale;
}

/* Compares the trainer's flat array (params or grads) with a safetensors file's tensors; returns the worst error. */
static double compare(const float *flat, const char *path, int L, int64_t in_of[TT_N], int64_t out_of[TT_N], int64_t r,
                      bool fused) {
  st_set st;
  memset(&st, 0, sizeof st);
  herr err = {0};
  if (st_open(&st, path, &err)) {
    CHECK_MSG(0, "%s", err.msg);
    return INFINITY;
  }
  double worst = 0;
  int64_t at = 0;
  for (int l = 0; l < L; l++)
    for (int k = 0; k < TT_N; k++)
      for (int ab = 0; ab < 2 && (!fused || fused_names[k]); ab++) {
        char name[200];
        snprintf(name, sizeof name, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", l, k <= 3 ? "self_attn" : "mlp",
                 fused ? fused_names[k] : names[k], ab ? 'B' : 'A');
        const st_tensor *t = st_find(&st, name);
        int64_t n = ab ? out_of[k] * r : r * in_of[k];
        CHECK_MSG(t && t->numel == n, "%s: %s", path, name);
        if (t && t->numel == n) worst = fmax(worst, rel_err(flat + at, t));
        at += n;
      }
  st_close(&st);
  return worst;
}

static void check_reference(const char *ref, bool required) {
  char path[600];
  snprintf(path, sizeof path, "%s/golden.json", ref);
  json_t *doc = json_load_file(path, 0, NULL);
  if (!doc && !required) {
    fprintf(stderr, "NOT RUN: %s is absent (tools/gen_train_ref.py makes it where PEFT is installed)\n", ref);
    return;
  }
  CHECK_MSG(doc != NULL, "%s", path);
  if (!doc) return;
  fprintf(stderr, "  %s\n", ref);
  /* the base and its projections' shapes */
  char base[600];
  const char *bname = json_string_value(json_object_get(doc, "base"));
  snprintf(base, sizeof base, HEARTH_SOURCE_DIR "/tests/fixtures/golden/%s", bname ? bname : "llama-f32");
  snprintf(path, sizeof path, "%s/config.json", base);
  json_t *cfg = json_load_file(path, 0, NULL);
  CHECK_MSG(cfg != NULL, "%s", path);
  if (!cfg) return json_decref(doc);
#define CFG(k) json_integer_value(json_object_get(cfg, k))
  int64_t D = CFG("hidden_size"), I = CFG("intermediate_size"), H = CFG("num_attention_heads"), KV = CFG("num_key_value_heads");
  int64_t hd = json_is_integer(json_object_get(cfg, "head_dim")) ? CFG("head_dim") : D / H;
  int L = (int)CFG("num_hidden_layers");
  bool fused = !strcmp(json_string_value(json_object_get(cfg, "model_type")), "phi3");
#undef CFG
  json_decref(cfg);
  int64_t in_of[TT_N] = {D, D, D, H * hd, D, D, I}, out_of[TT_N] = {H * hd, KV * hd, KV * hd, D, I, I, D};
  if (fused) out_of[TT_Q] = (H + 2 * KV) * hd, out_of[TT_GATE] = 2 * I;
  train_opts o;
  train_opts_init(&o);
  o.model_dir = base;
  o.rank = 4, o.alpha = 8, o.targets = (1u << TT_N) - 1;
  const json_t *opt = json_object_get(doc, "optimizer");
  o.weight_decay = json_number_value(json_object_get(opt, "weight_decay"));
  o.max_grad_norm = json_number_value(json_object_get(opt, "max_grad_norm"));
  double lr = json_number_value(json_object_get(opt, "lr"));
  int steps = (int)json_integer_value(json_object_get(opt, "steps"));
  trainer *t = NULL;
  herr err = {0};
  CHECK_MSG(trainer_new(&o, &t, &err) == 0, "%s", err.msg);
  if (!t) return;
  snprintf(path, sizeof path, "%s/adapter_init", ref);
  CHECK_MSG(trainer_load_adapter(t, path, &err) == 0, "%s", err.msg);
  const json_t *seqs = json_object_get(doc, "sequences"), *learned = json_object_get(doc, "learned");
  int ns = (int)json_array_size(seqs);
  train_example ex[4];
  memset(ex, 0, sizeof ex);
  int64_t total = 0;
  for (int s = 0; s < ns && s < 4; s++) {
    const json_t *a = json_array_get(seqs, s), *f = json_array_get(learned, s);
    ex[s].n = (int64_t)json_array_size(a);
    ex[s].ids = malloc(sizeof(int32_t) * ex[s].n);
    ex[s].loss = malloc((size_t)ex[s].n);
    for (int64_t i = 0; i < ex[s].n; i++) {
      ex[s].ids[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
      ex[s].loss[i] = (uint8_t)json_integer_value(json_array_get(f, (size_t)i));
      if (i) total += ex[s].loss[i];
    }
  }
  for (int step = 0; step <= steps; step++) {
    double sum = 0;
    int64_t count = 0;
    for (int s = 0; s < ns; s++) CHECK(trainer_loss(t, &ex[s], true, 1.0f / (float)total, &sum, &count, &err) == 0);
    if (step == 0) {
      double want = json_number_value(json_object_get(doc, "loss")), got = sum / (double)count;
      fprintf(stderr, "  loss %.9f, reference %.9f: relative error %.3g\n", got, want, fabs(got - want) / want);
      CHECK_MSG(fabs(got - want) <= 1e-5 * want, "loss %.9f vs %.9f", got, want);
      snprintf(path, sizeof path, "%s/grads.safetensors", ref);
      double g = compare(trainer_grads(t), path, L, in_of, out_of, 4, fused);
      fprintf(stderr, "  gradients: largest error %.3g of the tensor's largest value\n", g);
      CHECK_MSG(g <= 1e-4, "gradients %.3g from the reference's", g);
    }
    if (step == steps) break;
    double gn, want = json_number_value(json_array_get(json_object_get(doc, "grad_norms"), (size_t)step));
    trainer_step(t, train_lr_at(lr, step, 0, steps), &gn);
    CHECK_MSG(fabs(gn - want) <= 1e-5 * want, "step %d: gradient norm %.9f, reference %.9f", step + 1, gn, want);
  }
  int64_t P;
  snprintf(path, sizeof path, "%s/adapter_step3/adapter_model.safetensors", ref);
  double a = compare(trainer_params(t, &P), path, L, in_of, out_of, 4, fused);
  fprintf(stderr, "  adapter after %d steps: largest error %.3g of the tensor's largest value\n", steps, a);
  CHECK_MSG(a <= 1e-4, "the adapter after %d steps is %.3g from the reference's", steps, a);
  for (int s = 0; s < ns; s++) free(ex[s].ids), free(ex[s].loss);
  trainer_free(t);
  json_decref(doc);
}

static int64_t ids_of(const json_t *a, int32_t **ids) {
  int64_t n = (int64_t)json_array_size(a);
  *ids = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) (*ids)[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
  return n;
}

static void check_pref_reference(const char *ref, bool required) {
  char path[600];
  snprintf(path, sizeof path, "%s/golden.json", ref);
  json_t *doc = json_load_file(path, 0, NULL);
  if (!doc && !required) {
    fprintf(stderr, "NOT RUN: %s is absent (tools/gen_train_torch_ref.py makes it where torch is installed)\n", ref);
    return;
  }
  CHECK_MSG(doc != NULL, "%s", path);
  if (!doc) return;
  fprintf(stderr, "  %s\n", ref);
  train_opts o;
  train_opts_init(&o);
  o.model_dir = HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-f32";
  o.rank = 4, o.alpha = 8, o.targets = (1u << TT_N) - 1;
  trainer *t = NULL;
  herr err = {0};
  CHECK_MSG(trainer_new(&o, &t, &err) == 0, "%s", err.msg);
  snprintf(path, sizeof path, "%s/adapter_init", ref);
  CHECK_MSG(t && trainer_load_adapter(t, path, &err) == 0, "%s", err.msg);
  const json_t *pairs = json_object_get(doc, "pairs"), *refl = json_object_get(doc, "ref_logps");
  int np = (int)json_array_size(pairs);
  train_pair p[4];
  memset(p, 0, sizeof p);
  int64_t chosen_learned = 0;
  for (int i = 0; i < np && i < 4; i++) {
    const json_t *x = json_array_get(pairs, (size_t)i);
    int32_t *f = NULL;
    p[i].chosen.n = ids_of(json_object_get(x, "chosen"), &p[i].chosen.ids);
    ids_of(json_object_get(x, "chosen_learned"), &f);
    p[i].chosen.loss = malloc((size_t)p[i].chosen.n);
    for (int64_t k = 0; k < p[i].chosen.n; k++) p[i].chosen.loss[k] = (uint8_t)f[k], chosen_learned += k ? f[k] : 0;
    free(f);
    p[i].rejected.n = ids_of(json_object_get(x, "rejected"), &p[i].rejected.ids);
    ids_of(json_object_get(x, "rejected_learned"), &f);
    p[i].rejected.loss = malloc((size_t)p[i].rejected.n);
    for (int64_t k = 0; k < p[i].rejected.n; k++) p[i].rejected.loss[k] = (uint8_t)f[k];
    free(f);
    /* the reference: this trainer with its adapter off, against the reference's own numbers */
    double sc = 0, sr = 0;
    int64_t k = 0;
    trainer_adapter_off(t, true);
    CHECK(t && trainer_loss(t, &p[i].chosen, false, 0, &sc, &k, &err) == 0 && trainer_loss(t, &p[i].rejected, false, 0, &sr, &k, &err) == 0);
    trainer_adapter_off(t, false);
    p[i].ref_chosen = -sc, p[i].ref_rejected = -sr;
    double wc = json_number_value(json_array_get(json_array_get(refl, (size_t)i), 0));
    double wr = json_number_value(json_array_get(json_array_get(refl, (size_t)i), 1));
    CHECK_MSG(fabs(-sc - wc) <= 1e-5 * fabs(wc) && fabs(-sr - wr) <= 1e-5 * fabs(wr), "pair %d: reference log-probs %.9f %.9f vs %.9f %.9f",
              i, -sc, -sr, wc, wr);
  }
  double beta = json_number_value(json_object_get(doc, "beta"));
  int64_t in_of[TT_N] = {64, 64, 64, 64, 64, 64, 128}, out_of[TT_N] = {64, 32, 32, 64, 128, 128, 64};
  const char *methods[2] = {"dpo", "orpo"};
  for (int mi = 0; t && mi < 2; mi++) {
    int64_t P;
    trainer_params(t, &P);
    memset(trainer_grads(t), 0, sizeof(float) * (size_t)P);
    double loss = 0;
    for (int i = 0; i < np; i++)
      CHECK(trainer_pref_loss(t, mi ? TRAIN_ORPO : TRAIN_DPO, beta, &p[i], 1.0 / np, 1.0 / (double)chosen_learned, true, &loss, NULL,
                              &err) == 0);
    char key[64];
    snprintf(key, sizeof key, "%s_loss", methods[mi]);
    double want = json_number_value(json_object_get(doc, key));
    fprintf(stderr, "  %s loss %.9f, reference %.9f: relative error %.3g\n", methods[mi], loss, want, fabs(loss - want) / fabs(want));
    CHECK_MSG(fabs(loss - want) <= 1e-5 * fabs(want), "%s loss %.9f vs %.9f", methods[mi], loss, want);
    snprintf(path, sizeof path, "%s/grads_%s.safetensors", ref, methods[mi]);
    double g = compare(trainer_grads(t), path, 2, in_of, out_of, 4, false);
    fprintf(stderr, "  %s gradients: largest error %.3g of the tensor's largest value\n", methods[mi], g);
    CHECK_MSG(g <= 1e-4, "%s gradients %.3g from the reference's", methods[mi], g);
  }
  for (int i = 0; i < np && i < 4; i++) free(p[i].chosen.ids), free(p[i].chosen.loss), free(p[i].rejected.ids), free(p[i].rejected.loss);
  trainer_free(t);
  json_decref(doc);
}

static void test_reference(void) {
  static const char *const bases[] = {"llama-f32", "mistral-f32", "qwen2-f32", "qwen3-f32", "smollm3-f32", "gemma2-f32", "gemma3-f32", "phi3-f32"};
  for (size_t i = 0; i < sizeof bases / sizeof bases[0]; i++) {
    char ref[300];
    snprintf(ref, sizeof ref, REFS "/%s-torch", bases[i]);
    check_reference(ref, true);
  }
  check_reference(REFS "/llama-f32", false);
  check_pref_reference(REFS "/llama-f32-torch-pref", true);
}

int main(void) {
  RUN(test_reference);
  TEST_MAIN_END();
}
