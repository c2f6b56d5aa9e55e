/* test_pref.c — preference training (DPO, ORPO) in src/train. The losses
 * of one pair against values worked by hand (DPO at z = 1 and z = 0, ORPO at
 * chosen / rejected probabilities 1/2 and 1/4: odds 1 and 1/3) and their
 * derivatives against finite differences. Preference lines: a string prompt
 * and a prompt of messages (rendered through the built-in model's template,
 * the loss on the final assistant turn only, an earlier one kept as
 * context), bad lines named. On the golden llama and the built-in model, the
 * gradient of a step's whole DPO and ORPO loss over two pairs matches finite
 * differences of that loss in a few adapter parameters of every target; the
 * reference (the adapter switched off) is the base model, so a fresh adapter
 * (B = 0) has DPO loss log 2 exactly. Short DPO and ORPO runs on the
 * built-in model lower their evaluation loss (DPO's from log 2), log the
 * method's fields, and print their progress as one line rewritten in place
 * when told it is a terminal. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "test.h"
#include "train/train.h"

#define MODEL HEARTH_SOURCE_DIR "/models/default"
#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-f32"

static void test_losses(void) {
  double dc, dr, lo;
  /* DPO, beta 0.1, z = (−1 − −2) − (−1.5 − −1.5) = 1: log(1 + e^−0.1), d/dpc = −0.1 σ(−0.1) */
  double l = pref_dpo_loss(0.1, -1, -2, -1.5, -1.5, &dc, &dr);
  CHECK_NEAR(l, 0.64439666007357, 1e-12);
  CHECK_NEAR(dc, -0.1 * 0.47502081252106, 1e-12);
  CHECK_NEAR(dr, 0.1 * 0.47502081252106, 1e-12);
  /* policy = reference: z = 0, log 2, ∓β/2 */
  l = pref_dpo_loss(0.5, -3, -7, -3, -7, &dc, &dr);
  CHECK_NEAR(l, log(2.0), 1e-15);
  CHECK_NEAR(dc, -0.25, 1e-15);
  CHECK_NEAR(dr, 0.25, 1e-15);
  /* ORPO, lambda 0.1, P(chosen) 1/2 (odds 1), P(rejected) 1/4 (odds 1/3): lo = log 3, the term −0.1 log(3/4);
   * d/d lo = −0.1 σ(−log 3) = −0.025; d lo / d ac = 1 / (1 − 1/2), d lo / d ar = −1 / (1 − 1/4) */
  l = pref_orpo_loss(0.1, log(0.5), log(0.25), &dc, &dr, &lo);
  CHECK_NEAR(lo, log(3.0), 1e-12);
  CHECK_NEAR(l, -0.1 * log(0.75), 1e-12);
  CHECK_NEAR(dc, -0.05, 1e-12);
  CHECK_NEAR(dr, 0.025 / 0.75, 1e-12);
  /* derivatives against central differences at spread points */
  uint64_t s = 5;
  for (int k = 0; k < 50; k++) {
    double v[4];
    for (int j = 0; j < 4; j++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      v[j] = -0.01 - 6.0 * (double)(s >> 11) / 9007199254740992.0;
    }
    double h = 1e-6, beta = 0.05 + 0.1 * k;
    pref_dpo_loss(beta, v[0], v[1], v[2], v[3], &dc, &dr);
    double fc = (pref_dpo_loss(beta, v[0] + h, v[1], v[2], v[3], NULL, NULL) - pref_dpo_loss(beta, v[0] - h, v[1], v[2], v[3], NULL, NULL)) / (2 * h);
    double fr = (pref_dpo_loss(beta, v[0], v[1] + h, v[2], v[3], NULL, NULL) - pref_dpo_loss(beta, v[0], v[1] - h, v[2], v[3], NULL, NULL)) / (2 * h);
    CHECK_MSG(fabs(fc - dc) < 1e-7 && fabs(fr - dr) < 1e-7, "dpo: %g %g vs %g %g", dc, dr, fc, fr);
    double a = v[0] / 3, b = v[1] / 3; /* mean log-probs */
    pref_orpo_loss(beta, a, b, &dc, &dr, NULL);
    fc = (pref_orpo_loss(beta, a + h, b, NULL, NULL, NULL) - pref_orpo_loss(beta, a - h, b, NULL, NULL, NULL)) / (2 * h);
    fr = (pref_orpo_loss(beta, a, b + h, NULL, NULL, NULL) - pref_orpo_loss(beta, a, b - h, NULL, NULL, NULL)) / (2 * h);
    CHECK_MSG(fabs(fc - dc) < 1e-6 * fmax(1, fabs(dc)) && fabs(fr - dr) < 1e-6 * fmax(1, fabs(dr)), "orpo: %g %g vs %g %g", dc, dr, fc, fr);
  }
  CHECK_EQ_STR(train_method_name(TRAIN_DPO), "dpo");
  CHECK_EQ_STR(train_method_name(TRAIN_ORPO), "orpo");
}

static char *decode(const tokenizer *tok, const train_example *x, int learned) {
  int32_t ids[512];
  size_t n = 0;
  for (int64_t i = 0; i < x->n && n < 512; i++)
    if (learned < 0 || x->loss[i] == learned) ids[n++] = x->ids[i];
  hbuf b = {0};
  herr err = {0};
  tokenizer_decode(tok, ids, n, false, &b, &err);
  return hbuf_take(&b);
}

static void free_pair(train_pair *p) {
  free(p->chosen.ids), free(p->chosen.loss), free(p->rejected.ids), free(p->rejected.loss);
}

static void test_pair_lines(void) {
  train_opts o;
  train_opts_init(&o);
  o.model_dir = MODEL;
  trainer *t = NULL;
  herr err = {0};
  CHECK_MSG(trainer_new(&o, &t, &err) == 0, "%s", err.msg);
  if (!t) return;
  const tokenizer *tok = trainer_tokenizer(t);
  const chat_template *tm = trainer_template(t);
  /* a string prompt: BOS and the prompt unlearned, each completion and EOS learned */
  json_t *j = json_loads("{\"prompt\": \"In the beginning\", \"chosen\": \" God created\", \"rejected\": \" nothing\"}", 0, NULL);
  train_pair p;
  CHECK_MSG(train_pair_from_json(j, "l1", tok, tm, 512, &p, &err) == 0, "%s", err.msg);
  CHECK(isnan(p.ref_chosen) && isnan(p.ref_rejected));
  int32_t eos = tokenizer_eos_id(tok);
  CHECK(p.chosen.ids[0] == tokenizer_bos_id(tok) && p.chosen.ids[p.chosen.n - 1] == eos && p.chosen.loss[p.chosen.n - 1]);
  CHECK(p.rejected.ids[p.rejected.n - 1] == eos && p.rejected.loss[p.rejected.n - 1]);
  p.chosen.n--, p.rejected.n--; /* without EOS */
  char *a = decode(tok, &p.chosen, 1), *b = decode(tok, &p.rejected, 1), *c = decode(tok, &p.chosen, 0), *d = decode(tok, &p.rejected, 0);
  p.chosen.n++, p.rejected.n++;
  CHECK_EQ_STR(a, " God created");
  CHECK_EQ_STR(b, " nothing");
  CHECK_MSG(strlen(c) > 16 && !strcmp(c + strlen(c) - 16, "In the beginning"), "%s", c);
  CHECK_EQ_STR(d, c);
  free(a), free(b), free(c), free(d);
  free_pair(&p);
  json_decref(j);
  /* messages: the template's rendering; an earlier assistant turn is context, the final one (chosen / rejected) learned */
  j = json_loads("{\"prompt\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Peace.\"}, "
                 "{\"role\": \"user\", \"content\": \"More\"}], \"chosen\": [{\"role\": \"assistant\", \"content\": \"Amen.\"}], "
                 "\"rejected\": \"No.\"}",
                 0, NULL);
  CHECK_MSG(train_pair_from_json(j, "l2", tok, tm, 512, &p, &err) == 0, "%s", err.msg);
  a = decode(tok, &p.chosen, -1), b = decode(tok, &p.chosen, 1), c = decode(tok, &p.rejected, 1), d = decode(tok, &p.rejected, -1);
  CHECK_EQ_STR(a, "<|bos|><|user|>\nHi<|end|>\n<|assistant|>\nPeace.<|end|>\n<|user|>\nMore<|end|>\n<|assistant|>\nAmen.<|end|>\n");
  CHECK_EQ_STR(b, "Amen.<|end|>\n");
  CHECK_EQ_STR(c, "No.<|end|>\n");
  CHECK_EQ_STR(d, "<|bos|><|user|>\nHi<|end|>\n<|assistant|>\nPeace.<|end|>\n<|user|>\nMore<|end|>\n<|assistant|>\nNo.<|end|>\n");
  free(a), free(b), free(c), free(d);
  free_pair(&p);
  json_decref(j);
  /* bad lines say what is wrong, naming the line (and the side) */
  const char *bad[] = {"{\"prompt\": \"x\", \"chosen\": \"y\"}", "{\"prompt\": 3, \"chosen\": \"y\", \"rejected\": \"z\"}",
                       "{\"prompt\": \"x\", \"chosen\": [{\"role\": \"assistant\", \"content\": \"y\"}], \"rejected\": \"z\"}",
                       "{\"prompt\": [{\"role\": \"user\", \"content\": \"x\"}], \"chosen\": \"y\", \"rejected\": 5}",
                       "{\"prompt\": [{\"role\": \"user\", \"content\": \"x\"}], \"chosen\": [], \"rejected\": \"z\"}"};
  const char *want[] = {"needs \"prompt\", \"chosen\" and \"rejected\"", "\"prompt\" must be a string or an array",
                        "\"chosen\" must be a string", "\"rejected\" must be a string or a non-empty array",
                        "\"chosen\" must be a string or a non-empty array"};
  for (int i = 0; i < 5; i++) {
    j = json_loads(bad[i], 0, NULL);
    herr e2 = {0};
    CHECK(train_pair_from_json(j, "line 9", tok, tm, 512, &p, &e2) != 0);
    CHECK_MSG(strstr(e2.msg, want[i]) && strstr(e2.msg, "line 9"), "%d: %s", i, e2.msg);
    json_decref(j);
  }
  trainer_free(t);
}

/* The summed loss of a step over pairs (no gradients). */
static double step_loss(trainer *t, train_method m, double beta, train_pair *p, int np, double nll_w) {
  double loss = 0;
  herr err = {0};
  for (int i = 0; i < np; i++) trainer_pref_loss(t, m, beta, &p[i], 1.0 / np, nll_w, false, &loss, NULL, &err);
  return loss;
}

static void pref_gradient(const char *dir, train_method m) {
  fprintf(stderr, "  %s %s\n", train_method_name(m), dir);
  train_opts o;
  train_opts_init(&o);
  o.model_dir = dir, o.targets = (1u << TT_N) - 1, o.rank = 4, o.seed = 3, o.threads = 2;
  trainer *t = NULL;
  herr err = {0};
  CHECK_MSG(trainer_new(&o, &t, &err) == 0, "%s", err.msg);
  if (!t) return;
  /* two pairs of token ids: a shared prompt, completions of different lengths */
  int32_t c0[10] = {1, 40, 7, 300, 52, 100, 77, 9, 5, 10}, r0[8] = {1, 40, 7, 300, 52, 11, 200, 3};
  int32_t c1[9] = {1, 8, 99, 4, 250, 17, 66, 31, 2}, r1[11] = {1, 8, 99, 4, 61, 62, 63, 64, 65, 66, 2};
  uint8_t fc0[10] = {0, 0, 0, 0, 0, 1, 1, 1, 1, 1}, fr0[8] = {0, 0, 0, 0, 0, 1, 1, 1};
  uint8_t fc1[9] = {0, 0, 0, 0, 1, 1, 1, 1, 1}, fr1[11] = {0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1};
  train_pair p[2] = {{{c0, fc0, 10, NULL}, {r0, fr0, 8, NULL}, NAN, NAN}, {{c1, fc1, 9, NULL}, {r1, fr1, 11, NULL}, NAN, NAN}};
  /* the reference: the base model, the adapter off */
  trainer_adapter_off(t, true);
  for (int i = 0; i < 2; i++) {
    double sc = 0, sr = 0;
    int64_t k = 0;
    CHECK(trainer_loss(t, &p[i].chosen, false, 0, &sc, &k, &err) == 0 && trainer_loss(t, &p[i].rejected, false, 0, &sr, &k, &err) == 0);
    p[i].ref_chosen = -sc, p[i].ref_rejected = -sr;
  }
  trainer_adapter_off(t, false);
  double beta = 1.0, nll_w = 1.0 / 10; /* the chosen sides' learned tokens: 5 + 5 */
  if (m == TRAIN_DPO) {
    /* a fresh adapter (B = 0) is the reference: z = 0 for every pair */
    double l0 = step_loss(t, m, beta, p, 2, nll_w);
    CHECK_MSG(fabs(l0 - log(2.0)) < 1e-6, "DPO loss of a fresh adapter %.9f, not log 2", l0);
  }
  int64_t P;
  float *w = trainer_params(t, &P);
  uint64_t s = 11;
  for (int64_t i = 0; i < P; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    w[i] += (float)(((double)(s >> 11) / 9007199254740992.0 - 0.5) * 0.1);
  }
  /* the adapter moved: the reference is not the policy any more */
  trainer_adapter_off(t, true);
  double off = step_loss(t, m, beta, p, 2, nll_w);
  trainer_adapter_off(t, false);
  double on = step_loss(t, m, beta, p, 2, nll_w);
  CHECK_MSG(fabs(on - off) > 1e-3, "%s: the adapter changes the loss by %.3g only", train_method_name(m), fabs(on - off));
  if (m == TRAIN_DPO) CHECK_NEAR(off, log(2.0), 1e-6);
  double loss = 0;
  pref_stats st = {0};
  memset(trainer_grads(t), 0, sizeof(float) * (size_t)P);
  for (int i = 0; i < 2; i++) CHECK(trainer_pref_loss(t, m, beta, &p[i], 0.5, nll_w, true, &loss, &st, &err) == 0);
  CHECK_NEAR(loss, on, 1e-9);
  CHECK_EQ_INT(st.pairs, 2);
  float *g = malloc(sizeof(float) * (size_t)P);
  memcpy(g, trainer_grads(t), sizeof(float) * (size_t)P);
  int bad = 0, checked = 0;
  for (int blk = 0; blk < 12; blk++) {
    int64_t lo = P * blk / 12, hi = P * (blk + 1) / 12, best = lo;
    for (int64_t i = lo; i < hi; i++)
      if (fabsf(g[i]) > fabsf(g[best])) best = i;
    float keep = w[best], h = 2e-3f;
    w[best] = keep + h;
    double lp = step_loss(t, m, beta, p, 2, nll_w);
    w[best] = keep - h;
    double lm = step_loss(t, m, beta, p, 2, nll_w);
    w[best] = keep;
    double fd = (lp - lm) / (2.0 * h), e = fabs(fd - g[best]) / fmax(fabs(fd), 1e-3);
    checked++;
    if (!(e < 2e-2)) {
      bad++;
      fprintf(stderr, "param %lld: gradient %.6g, finite differences %.6g\n", (long long)best, g[best], fd);
    }
  }
  CHECK_MSG(bad == 0, "%s: %d of %d adapter gradients disagree with finite differences of the loss", train_method_name(m), bad,
            checked);
  /* the gradient adds to what was there: a second pass doubles it */
  for (int i = 0; i < 2; i++) trainer_pref_loss(t, m, beta, &p[i], 0.5, nll_w, true, &loss, NULL, &err);
  double worst = 0, gmax = 1e-12;
  for (int64_t i = 0; i < P; i++) worst = fmax(worst, fabs(trainer_grads(t)[i] - 2.0 * g[i])), gmax = fmax(gmax, fabs(g[i]));
  CHECK_MSG(worst < 1e-5 * gmax, "a second pair pass does not add its gradient (%.3g of the largest)", worst / gmax);
  free(g);
  trainer_free(t);
}

static void test_gradient(void) {
  pref_gradient(GOLDEN, TRAIN_DPO);
  pref_gradient(GOLDEN, TRAIN_ORPO);
  pref_gradient(MODEL, TRAIN_DPO);
  pref_gradient(MODEL, TRAIN_ORPO);
}

static const char *const words[] = {"apple", "river", "stone", "light", "bread", "sheep", "wind", "gold"};

static void write_pairs(const char *path, int n, uint64_t seed) {
  FILE *f = fopen(path, "w");
  for (int i = 0; f && i < n; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    int w = (int)((seed >> 33) % 8);
    if (i % 2)
      fprintf(f, "{\"prompt\": [{\"role\": \"user\", \"content\": \"Say the word: %s\"}], \"chosen\": \"%s %s\", \"rejected\": \"no\"}\n",
              words[w], words[w], words[w]);
    else
      fprintf(f, "{\"prompt\": \"Say the word: %s\\n\", \"chosen\": \"%s %s\", \"rejected\": \"I will not.\"}\n", words[w],
              words[w], words[w]);
  }
  if (f) fclose(f);
}

/* Under the sanitizers a run takes a few steps (the same code paths; the learning and the terminal's
   in-place line are checked in the plain build). */
#if defined(__SANITIZE_ADDRESS__)
#define RUN_STEPS 4
#else
#define RUN_STEPS 12
#endif

static void run_method(train_method m) {
  char tmp[] = "/tmp/hearth_pref_XXXXXX";
  if (!mkdtemp(tmp)) return;
  char data[300], eval[300], out[300], errp[300];
  snprintf(data, sizeof data, "%s/train.jsonl", tmp);
  snprintf(eval, sizeof eval, "%s/eval.jsonl", tmp);
  snprintf(out, sizeof out, "%s/out", tmp);
  snprintf(errp, sizeof errp, "%s/progress.txt", tmp);
  write_pairs(data, 40, 1);
  write_pairs(eval, 8, 2);
  FILE *prog = fopen(errp, "w+");
  train_opts o;
  train_opts_init(&o);
  o.model_dir = MODEL, o.data = data, o.eval = eval, o.out = out, o.method = m, o.threads = 2;
  o.steps = RUN_STEPS, o.batch = 2, o.lr = 5e-3, o.warmup = 2, o.seed = 4, o.targets = (1u << TT_N) - 1;
  o.progress = prog, o.progress_tty = 1, o.plot = false;
  train_result res;
  herr err = {0};
  CHECK_MSG(train_run(&o, &res, &err) == 0, "%s", err.msg);
  fprintf(stderr, "  %s: eval loss %.4f -> %.4f\n", train_method_name(m), res.eval_first, res.eval_last);
  if (m == TRAIN_DPO) CHECK_MSG(fabs(res.eval_first - log(2.0)) < 1e-6, "DPO eval loss before training %.9f, not log 2", res.eval_first);
#if !defined(__SANITIZE_ADDRESS__)
  CHECK_MSG(res.eval_last < res.eval_first, "%s: eval loss %.4f -> %.4f", train_method_name(m), res.eval_first, res.eval_last);
#endif
  CHECK(res.tokens_per_s > 0);
  /* the log: the method's fields on every step line */
  char logp[400], *log = NULL;
  size_t n = 0;
  snprintf(logp, sizeof logp, "%s/log.jsonl", out);
  CHECK(hfile_read(logp, &log, &n, NULL) == 0);
  int steps = 0;
  for (char *s = log; s && *s;) {
    char *e = strchr(s, '\n');
    json_t *j = json_loadb(s, e ? (size_t)(e - s) : strlen(s), 0, NULL);
    CHECK(j != NULL);
    if (json_object_get(j, "loss")) {
      steps++;
      const char *field = m == TRAIN_DPO ? "reward_margin" : "log_odds";
      CHECK_MSG(json_is_number(json_object_get(j, field)) && json_is_number(json_object_get(j, "tokens_per_s")), "no %s", field);
    }
    json_decref(j);
    s = e ? e + 1 : s + strlen(s);
  }
  CHECK_EQ_INT(steps, RUN_STEPS);
  free(log);
  /* progress on a "terminal": one line rewritten in place, the eval lines on their own */
  fflush(prog);
  char *text = NULL;
  CHECK(hfile_read(errp, &text, &n, NULL) == 0);
  char last[32];
  snprintf(last, sizeof last, "step %d/%d", RUN_STEPS, RUN_STEPS);
  CHECK_MSG(text && strstr(text, "\r\033[K") && strstr(text, last) && strstr(text, "tok/s") && strstr(text, "ETA"), "%s",
            text ? text : "");
#if !defined(__SANITIZE_ADDRESS__)
  int newlines = 0;
  for (char *s = text; s && *s; s++) newlines += *s == '\n';
  CHECK_MSG(newlines < 12, "%d lines for 12 steps: not rewritten in place", newlines);
#endif
  free(text);
  fclose(prog);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmp);
}

static void test_runs(void) {
  run_method(TRAIN_DPO);
  run_method(TRAIN_ORPO);
}

int main(void) {
  RUN(test_losses);
  RUN(test_pair_lines);
  RUN(test_gradient);
  RUN(test_runs);
  TEST_MAIN_END();
}
