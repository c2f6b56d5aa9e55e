/* test_pack_checkpoint.c — packing and activation checkpointing in the
 * trainer (src/train).
 *
 * Packing: train_pack's best-fit-decreasing layout on lengths worked by hand
 * (which sequence each example joins, positions restarting at 0, the first
 * token of each example unlearned); a packed sequence's loss and gradients
 * equal the sum of its examples' run one by one, to float summation order
 * (a relative 1e-5 here), on the built-in model and on golden models with a
 * sliding window shorter than the examples (mistral) and soft-capped
 * attention with sliding layers (gemma2) — and differ when the same tokens
 * run as one plain sequence, so the boundaries are what makes them equal;
 * bad positions are refused. A short SFT run with --packing, each step over
 * the whole data, logs the losses of the same run unpacked and ends with its
 * adapter, to float rounding through AdamW (within a twentieth of the
 * learning rate; --packing with DPO is refused).
 *
 * Checkpointing: with --checkpoint-layers 1, 3 (not dividing the built-in
 * model's 8 layers) and 8, the loss and every gradient are bit-identical to
 * keeping all activations, with dropout (the masks drawn again from the
 * generator saved at each span's start), on a packed sequence too, and on
 * golden models with q / k norms (qwen3), output norms and soft-capping
 * (gemma2) and fused projections (phi3); the activations held shrink. A short
 * run with dropout and checkpoints writes the same adapter bytes and the same
 * log losses as without. Under the sanitizers the built-in model is checked
 * with spans of 3 layers only. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "test.h"
#include "train/train.h"

#define MODEL HEARTH_SOURCE_DIR "/models/default"
#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden/"

static char tmpdir[256];

static trainer *new_trainer(const char *dir, double dropout, int64_t ck) {
  train_opts o;
  train_opts_init(&o);
  o.model_dir = dir;
  o.targets = (1u << TT_N) - 1;
  o.rank = 4;
  o.seed = 5;
  o.dropout = dropout;
  o.threads = 2;
  o.checkpoint_layers = ck;
  trainer *t = NULL;
  herr err = {0};
  CHECK_MSG(trainer_new(&o, &t, &err) == 0, "%s: %s", dir, err.msg);
  if (!t) return NULL;
  /* B made non-zero so every path carries gradient */
  int64_t P;
  float *p = trainer_params(t, &P);
  uint64_t s = 11;
  for (int64_t i = 0; i < P; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    p[i] += (float)(((double)(s >> 11) / 9007199254740992.0 - 0.5) * 0.05);
  }
  return t;
}

/* An example of n tokens drawn from seed below vocab, the loss on its second half. */
static train_example make_example(int64_t n, uint64_t seed, int64_t vocab) {
  train_example x = {.ids = malloc((size_t)n * sizeof(int32_t)), .loss = malloc((size_t)n), .n = n};
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    x.ids[i] = (int32_t)((seed >> 33) % (uint64_t)vocab);
    x.loss[i] = i >= n / 2;
  }
  return x;
}

static void test_pack_layout(void) {
  /* lengths 5, 9, 3, 7, 2, 6 into 10: longest first — 9 opens A (room 1), 7 opens B (room 3), 6 opens C (room 4),
   * 5 opens D (room 5); 3 fits best in B (room 3 → 0), 2 in C (room 4 → 2). */
  int64_t lens[6] = {5, 9, 3, 7, 2, 6};
  train_set in = {0};
  in.ex = calloc(6, sizeof *in.ex);
  for (int i = 0; i < 6; i++) {
    in.ex[i] = make_example(lens[i], (uint64_t)i + 1, 100);
    for (int64_t j = 0; j < lens[i]; j++) in.ex[i].ids[j] = 100 * i + (int32_t)j, in.ex[i].loss[j] = 1;
    in.n++;
  }
  train_set out;
  herr err = {0};
  CHECK_MSG(train_pack(&in, 10, &out, &err) == 0, "%s", err.msg);
  int want[4][2] = {{1, -1}, {3, 2}, {5, 4}, {0, -1}};
  CHECK_EQ_INT(out.n, 4);
  CHECK_EQ_INT(out.tokens, 32);
  for (int b = 0; b < 4 && b < out.n; b++) {
    const train_example *x = &out.ex[b];
    int64_t at = 0;
    for (int k = 0; k < 2 && want[b][k] >= 0; k++) {
      int e = want[b][k];
      for (int64_t j = 0; j < lens[e]; j++, at++) {
        CHECK_MSG(at < x->n && x->ids[at] == 100 * e + j && x->pos[at] == j && x->loss[at] == (j > 0),
                  "sequence %d token %lld: id %d pos %d loss %d", b, (long long)at, at < x->n ? x->ids[at] : -1,
                  at < x->n ? x->pos[at] : -1, at < x->n ? x->loss[at] : -1);
      }
    }
    CHECK_EQ_INT(x->n, at);
  }
  train_set_free(&out);
  /* equal room: the sequence that got it first; 4, 4 into 6 open two sequences of room 2, then 2, 2 fill them in order */
  int64_t l2[4] = {4, 4, 2, 2};
  train_set in2 = {0};
  in2.ex = calloc(4, sizeof *in2.ex);
  for (int i = 0; i < 4; i++) in2.ex[in2.n++] = make_example(l2[i], (uint64_t)i + 9, 100);
  CHECK(train_pack(&in2, 6, &out, &err) == 0);
  CHECK(out.n == 2 && out.ex[0].n == 6 && out.ex[1].n == 6 && out.ex[0].ids[4] == in2.ex[2].ids[0] &&
        out.ex[1].ids[4] == in2.ex[3].ids[0]);
  train_set_free(&out);
  train_set_free(&in2);
  train_set_free(&in);
}

static double rel_diff(const float *a, const float *b, int64_t n) {
  double d = 0, m = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - b[i]);
    if (!(e <= d)) d = isnan(e) ? INFINITY : e;
    if (fabs((double)b[i]) > m) m = fabs((double)b[i]);
  }
  return d / (m > 0 ? m : 1);
}

/* Three examples packed into one sequence against each run alone: the summed loss and the gradients. */
static void packed_equals_unpacked(const char *dir, int64_t n0, int64_t n1, int64_t n2) {
  fprintf(stderr, "  %s: %lld + %lld + %lld tokens\n", dir, (long long)n0, (long long)n1, (long long)n2);
  trainer *t = new_trainer(dir, 0, 0);
  if (!t) return;
  train_set in = {0};
  in.ex = calloc(3, sizeof *in.ex);
  int64_t lens[3] = {n0, n1, n2};
  for (int i = 0; i < 3; i++) in.ex[in.n++] = make_example(lens[i], (uint64_t)i * 7 + 1, 500);
  train_set packed;
  herr err = {0};
  CHECK_MSG(train_pack(&in, n0 + n1 + n2, &packed, &err) == 0 && packed.n == 1, "%s", err.msg);
  int64_t P, learned = 0;
  trainer_params(t, &P);
  for (int i = 0; i < 3; i++)
    for (int64_t j = 1; j < in.ex[i].n; j++) learned += in.ex[i].loss[j];
  double s1 = 0, s2 = 0;
  int64_t c1 = 0, c2 = 0;
  for (int i = 0; i < 3; i++) CHECK(trainer_loss(t, &in.ex[i], true, 1.0f / (float)learned, &s1, &c1, &err) == 0);
  float *g1 = malloc(sizeof(float) * (size_t)P);
  memcpy(g1, trainer_grads(t), sizeof(float) * (size_t)P);
  memset(trainer_grads(t), 0, sizeof(float) * (size_t)P);
  CHECK_MSG(trainer_loss(t, &packed.ex[0], true, 1.0f / (float)learned, &s2, &c2, &err) == 0, "%s", err.msg);
  CHECK_EQ_INT(c1, learned);
  CHECK_EQ_INT(c2, learned);
  double dl = fabs(s1 - s2) / fabs(s1), dg = rel_diff(trainer_grads(t), g1, P);
  fprintf(stderr, "    packed: loss %.9g vs %.9g one by one (relative %.2g), gradients within %.2g of the largest\n", s2, s1, dl, dg);
  CHECK_MSG(dl < 1e-5, "packed loss %.9g, one by one %.9g", s2, s1);
  CHECK_MSG(dg < 1e-5, "packed gradients differ from one by one by %.3g of the largest", dg);
  /* the same tokens as one plain sequence (positions on, attention across): another loss */
  train_example plain = packed.ex[0];
  plain.pos = NULL;
  double s3 = 0;
  int64_t c3 = 0;
  CHECK(trainer_loss(t, &plain, false, 0, &s3, &c3, &err) == 0);
  CHECK_MSG(fabs(s3 - s1) / fabs(s1) > 1e-3, "a plain sequence of the same tokens has the same loss (%.9g)", s3);
  /* positions must restart at 0 and count up */
  int32_t keep = packed.ex[0].pos[3];
  packed.ex[0].pos[3] = 7;
  herr e2 = {0};
  CHECK(trainer_loss(t, &packed.ex[0], false, 0, &s3, &c3, &e2) != 0 && strstr(e2.msg, "position 3"));
  packed.ex[0].pos[3] = keep;
  free(g1);
  train_set_free(&packed);
  train_set_free(&in);
  trainer_free(t);
}

static void test_packed_equals_unpacked(void) {
  packed_equals_unpacked(MODEL, 9, 23, 14);
  packed_equals_unpacked(GOLDEN "mistral-f32", 12, 5, 11); /* its window is shorter than 12 */
  packed_equals_unpacked(GOLDEN "gemma2-f32", 10, 13, 6);
}

/* Loss and gradients of ex with checkpoints every ck layers, bit for bit against none. */
static void checkpoint_same(const char *dir, double dropout, const int64_t *cks, int ncks, const train_example *ex) {
  fprintf(stderr, "  %s%s%s\n", dir, dropout > 0 ? " (dropout)" : "", ex->pos ? " (packed)" : "");
  double ref_loss = 0;
  int64_t ref_count = 0, P = 0, ref_bytes = 0;
  float *ref = NULL;
  for (int c = -1; c < ncks; c++) {
    int64_t ck = c < 0 ? 0 : cks[c];
    trainer *t = new_trainer(dir, dropout, ck);
    if (!t) return;
    trainer_params(t, &P);
    trainer_reseed(t, 42);
    double loss = 0;
    int64_t count = 0;
    herr err = {0};
    /* twice: gradients accumulate over micro-batches, and a second forward reuses the buffers */
    CHECK_MSG(trainer_loss(t, ex, true, 0.25f, &loss, &count, &err) == 0, "%s", err.msg);
    CHECK_MSG(trainer_loss(t, ex, true, 0.5f, &loss, &count, &err) == 0, "%s", err.msg);
    int64_t bytes = trainer_activation_bytes(t, ex->n);
    if (c < 0) {
      ref = malloc(sizeof(float) * (size_t)P);
      memcpy(ref, trainer_grads(t), sizeof(float) * (size_t)P);
      ref_loss = loss, ref_count = count, ref_bytes = bytes;
    } else {
      CHECK_MSG(memcmp(&loss, &ref_loss, sizeof loss) == 0 && count == ref_count,
                "--checkpoint-layers %lld: loss %.17g, without %.17g", (long long)ck, loss, ref_loss);
      int64_t differ = 0;
      for (int64_t i = 0; i < P; i++) differ += memcmp(&trainer_grads(t)[i], &ref[i], sizeof(float)) != 0;
      CHECK_MSG(differ == 0, "--checkpoint-layers %lld: %lld of %lld gradients differ", (long long)ck, (long long)differ, (long long)P);
      fprintf(stderr, "    --checkpoint-layers %lld: the same loss and %lld gradients bit for bit; activations %.2f MiB, "
              "without %.2f MiB\n", (long long)ck, (long long)P, bytes / 1048576.0, ref_bytes / 1048576.0);
    }
    trainer_free(t);
  }
  free(ref);
}

/* Under the sanitizers the built-in model runs one span length (the same code paths; each trainer costs seconds there). */
#if defined(__SANITIZE_ADDRESS__)
#define N_CKS 1
#else
#define N_CKS 3
#endif

static void test_checkpoint(void) {
  int64_t cks[3] = {3, 1, 8};
  train_example ex = make_example(40, 3, 4096);
  checkpoint_same(MODEL, 0, cks, N_CKS, &ex);
  checkpoint_same(MODEL, 0.3, cks, N_CKS, &ex);
  /* a packed sequence: three examples */
  train_set in = {0}, packed;
  in.ex = calloc(3, sizeof *in.ex);
  for (int i = 0; i < 3; i++) in.ex[in.n++] = make_example(10 + 7 * i, (uint64_t)i + 20, 4096);
  herr err = {0};
  CHECK(train_pack(&in, 64, &packed, &err) == 0 && packed.n == 1);
  if (packed.n == 1) checkpoint_same(MODEL, 0.3, cks, N_CKS < 2 ? N_CKS : 2, &packed.ex[0]);
  train_set_free(&packed), train_set_free(&in);
  free(ex.ids), free(ex.loss);
  ex = make_example(20, 4, 500);
  int64_t one[2] = {1, 2};
  checkpoint_same(GOLDEN "qwen3-f32", 0, one, 2, &ex);
  checkpoint_same(GOLDEN "gemma2-f32", 0.2, one, 2, &ex);
  checkpoint_same(GOLDEN "gemma3-f32", 0, one, 2, &ex);
  checkpoint_same(GOLDEN "phi3-f32", 0.2, one, 1, &ex);
  free(ex.ids), free(ex.loss);
  /* the bytes held: less with checkpoints */
  trainer *a = new_trainer(MODEL, 0, 0), *b = new_trainer(MODEL, 0, 1), *c = new_trainer(MODEL, 0, 3);
  if (a && b && c) {
    int64_t ba = trainer_activation_bytes(a, 512), bb = trainer_activation_bytes(b, 512), bc = trainer_activation_bytes(c, 512);
    fprintf(stderr, "  activations of 512 tokens on the built-in model: %.1f MiB, --checkpoint-layers 1 %.1f MiB, 3 %.1f MiB\n",
            ba / 1048576.0, bb / 1048576.0, bc / 1048576.0);
    CHECK(bb < ba / 3 && bc < ba / 2);
  }
  trainer_free(a), trainer_free(b), trainer_free(c);
  /* a negative count is refused */
  train_opts o;
  train_opts_init(&o);
  o.model_dir = MODEL, o.checkpoint_layers = -1;
  trainer *t = NULL;
  CHECK(trainer_new(&o, &t, &err) != 0 && strstr(err.msg, "--checkpoint-layers"));
}

/* n prompt / completion lines of a few words each. */
static void write_short(const char *path, int n) {
  static const char *const words[] = {"apple", "river", "stone", "light", "bread", "sheep", "wind", "gold"};
  FILE *f = fopen(path, "w");
  for (int i = 0; f && i < n; i++) {
    fprintf(f, "{\"prompt\": \"Say %s\", \"completion\": \"", words[i % 8]);
    for (int k = 0; k <= i % 5; k++) fprintf(f, "%s%s", k ? " " : "", words[(i + k) % 8]);
    fprintf(f, "\"}\n");
  }
  if (f) fclose(f);
}

static float *read_params(const train_opts *o, const char *dir, int64_t *P) {
  trainer *t = NULL;
  herr err = {0};
  train_opts q = *o;
  q.progress = NULL;
  float *out = NULL;
  if (trainer_new(&q, &t, &err) == 0 && trainer_load_adapter(t, dir, &err) == 0) {
    float *p = trainer_params(t, P);
    out = malloc(sizeof(float) * (size_t)*P);
    memcpy(out, p, sizeof(float) * (size_t)*P);
  }
  CHECK_MSG(out != NULL, "%s: %s", dir, err.msg);
  trainer_free(t);
  return out;
}

/* The losses logged by a run, one per step. */
static int read_losses(const char *path, double *loss, int max) {
  char *text = NULL;
  size_t len = 0;
  int n = 0;
  if (hfile_read(path, &text, &len, NULL)) return 0;
  for (char *s = text; s && n < max; s = strchr(s + 1, '\n')) {
    char *l = strstr(s, "\"loss\":");
    char *e = strchr(s + 1, '\n');
    if (l && (!e || l < e)) loss[n++] = strtod(l + 7, NULL);
  }
  free(text);
  return n;
}

static void test_runs(void) {
  char data[400], out1[400], out2[400], out3[400], cmd[1400];
  snprintf(data, sizeof data, "%s/short.jsonl", tmpdir);
  snprintf(out1, sizeof out1, "%s/plain", tmpdir);
  snprintf(out2, sizeof out2, "%s/packed", tmpdir);
  snprintf(out3, sizeof out3, "%s/ckpt", tmpdir);
  write_short(data, 12);
  train_opts o;
  train_opts_init(&o);
  o.model_dir = MODEL, o.data = data, o.steps = 3, o.lr = 1e-3, o.warmup = 0, o.seed = 2, o.threads = 2, o.plot = false;
  o.targets = (1u << TT_N) - 1, o.rank = 4;
  /* every step the whole data: 12 examples unpacked, and their packed sequences */
  o.out = out1, o.batch = 12;
  train_result r1, r2, r3;
  herr err = {0};
  CHECK_MSG(train_sft(&o, &r1, &err) == 0, "%s", err.msg);
  train_opts p = o;
  p.out = out2, p.packing = true, p.seq_len = 64;
  /* the packed sequences of 12 short examples in 64 tokens */
  train_set set = {0}, packed;
  trainer *t = NULL;
  CHECK(trainer_new(&p, &t, &err) == 0);
  CHECK(t && train_data_load(data, trainer_tokenizer(t), NULL, 64, &set, &err) == 0 && train_pack(&set, 64, &packed, &err) == 0);
  fprintf(stderr, "  12 examples of %lld tokens packed into %lld sequences of up to 64\n", (long long)set.tokens, (long long)packed.n);
  CHECK(packed.n > 1 && packed.n < 12 && packed.tokens == set.tokens);
  p.batch = packed.n;
  train_set_free(&set), train_set_free(&packed);
  trainer_free(t);
  CHECK_MSG(train_sft(&p, &r2, &err) == 0, "%s", err.msg);
  CHECK_MSG(fabs(r1.first_loss - r2.first_loss) < 1e-5 * r1.first_loss && fabs(r1.last_loss - r2.last_loss) < 1e-5 * r1.last_loss,
            "losses: unpacked %.9g -> %.9g, packed %.9g -> %.9g", r1.first_loss, r1.last_loss, r2.first_loss, r2.last_loss);
  int64_t P1 = 0, P2 = 0;
  float *a1 = read_params(&o, out1, &P1), *a2 = read_params(&p, out2, &P2);
  if (a1 && a2 && P1 == P2) {
    double d = 0;
    for (int64_t i = 0; i < P1; i++) d = fmax(d, fabs((double)a1[i] - a2[i]));
    fprintf(stderr, "  3 steps packed and unpacked: losses %.9g / %.9g, adapters within %.3g (lr %g)\n", r2.last_loss, r1.last_loss, d, o.lr);
    CHECK_MSG(d < 5e-2 * o.lr, "the packed run's adapter is %.3g from the unpacked one's", d);
  }
  free(a1), free(a2);
  /* checkpoints with dropout: the same bytes */
  o.dropout = 0.2, o.batch = 4, o.steps = 4;
  char log1[500], log3[500];
  snprintf(log1, sizeof log1, "%s/log.jsonl", out1);
  snprintf(log3, sizeof log3, "%s/log.jsonl", out3);
  CHECK_MSG(train_sft(&o, &r1, &err) == 0, "%s", err.msg);
  train_opts c = o;
  c.out = out3, c.checkpoint_layers = 3;
  CHECK_MSG(train_sft(&c, &r3, &err) == 0, "%s", err.msg);
  snprintf(cmd, sizeof cmd, "cmp -s '%s/adapter_model.safetensors' '%s/adapter_model.safetensors'", out1, out3);
  CHECK_MSG(system(cmd) == 0, "--checkpoint-layers 3 wrote other adapter bytes");
  double l1[8], l3[8];
  int n1 = read_losses(log1, l1, 8), n3 = read_losses(log3, l3, 8);
  CHECK(n1 == 4 && n3 == 4 && !memcmp(l1, l3, sizeof(double) * 4));
  /* packing is SFT's */
  train_opts d = p;
  d.method = TRAIN_DPO;
  CHECK(train_run(&d, &r3, &err) != 0 && strstr(err.msg, "--packing is for sft"));
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/hearth_pack_XXXXXX");
  if (!mkdtemp(tmpdir)) tmpdir[0] = 0;
  RUN(test_pack_layout);
  RUN(test_packed_equals_unpacked);
  RUN(test_checkpoint);
  if (tmpdir[0]) RUN(test_runs);
  if (tmpdir[0]) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
  }
  TEST_MAIN_END();
}
