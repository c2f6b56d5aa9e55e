/* sft.c — a supervised fine-tuning run (train_sft): data and evaluation
 * sets, the seeded order of examples over epochs, optimizer steps of
 * batch × grad_accum examples with the loss averaged over their counted
 * tokens, the learning-rate schedule, progress lines and the JSONL log, the
 * adapter written at the end. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/hash.h"
#include "train/train.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int eval_loss(trainer *t, const train_set *s, double *out, herr *err) {
  double sum = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < s->n; i++) {
    int rc = trainer_loss(t, &s->ex[i], false, 0, &sum, &count, err);
    if (rc) return rc;
  }
  *out = count ? sum / (double)count : NAN;
  return 0;
}

static void shuffle(int64_t *order, int64_t n, uint64_t *rng) {
  for (int64_t i = 0; i < n; i++) order[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)(hsplitmix64(rng) % (uint64_t)(i + 1)), x = order[i];
    order[i] = order[j], order[j] = x;
  }
}

int train_sft(const train_opts *o, train_result *res, herr *err) {
  memset(res, 0, sizeof *res);
  res->eval_first = res->eval_last = NAN;
  if (o->batch < 1 || o->grad_accum < 1 || o->seq_len < 2)
    return herr_set(err, HEARTH_EINVAL, "--batch and --grad-accum must be at least 1, --seq-len at least 2");
  if (!(o->lr > 0)) return herr_set(err, HEARTH_EINVAL, "--lr must be positive");
  trainer *t = NULL;
  int rc = trainer_new(o, &t, err);
  if (rc) return rc;
  train_set data = {0}, ev = {0};
  FILE *log = NULL;
  int64_t *order = NULL;
  if ((rc = train_data_load(o->data, trainer_tokenizer(t), trainer_template(t), o->seq_len, &data, err))) goto out;
  if (o->eval && (rc = train_data_load(o->eval, trainer_tokenizer(t), trainer_template(t), o->seq_len, &ev, err))) goto out;
  if (o->log && !(log = fopen(o->log, "w"))) {
    rc = herr_set(err, HEARTH_EIO, "%s: cannot write the log", o->log);
    goto out;
  }
  int64_t per_step = o->batch * o->grad_accum;
  int64_t steps = o->steps > 0 ? o->steps : (int64_t)ceil((double)data.n * o->epochs / (double)per_step);
  if (steps < 1) steps = 1;
  int64_t warmup = o->warmup >= 0 ? o->warmup : steps / 10;
  if (o->progress)
    fprintf(o->progress, "train: %lld examples (%lld tokens, %lld learned), %lld steps of %lld, rank %lld, alpha %g\n",
            (long long)data.n, (long long)data.tokens, (long long)data.loss_tokens, (long long)steps, (long long)per_step,
            (long long)o->rank, o->alpha);
  if (ev.n) {
    if ((rc = eval_loss(t, &ev, &res->eval_first, err))) goto out;
    res->eval_last = res->eval_first;
    if (o->progress) fprintf(o->progress, "eval step 0 loss %.4f\n", res->eval_first);
    if (log) fprintf(log, "{\"step\":0,\"eval_loss\":%.6f}\n", res->eval_first);
  }
  order = malloc((size_t)data.n * sizeof *order);
  if (!order) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto out;
  }
  uint64_t rng = o->seed ^ 0x73667400ull;
  shuffle(order, data.n, &rng);
  int64_t at = 0;
  double start = now_s();
  for (int64_t step = 0; step < steps; step++) {
    double t0 = now_s();
    const train_example *batch[4096];
    int64_t nb = per_step < 4096 ? per_step : 4096, counted = 0, tokens = 0;
    for (int64_t i = 0; i < nb; i++) {
      if (at == data.n) shuffle(order, data.n, &rng), at = 0;
      batch[i] = &data.ex[order[at++]];
      for (int64_t j = 1; j < batch[i]->n; j++) counted += batch[i]->loss[j];
      tokens += batch[i]->n;
    }
    double sum = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < nb; i++)
      if ((rc = trainer_loss(t, batch[i], true, 1.0f / (float)counted, &sum, &count, err))) goto out;
    double lr = train_lr_at(o->lr, step, warmup, steps), gnorm = 0;
    trainer_step(t, lr, &gnorm);
    double loss = sum / (double)count, dt = now_s() - t0;
    if (step == 0) res->first_loss = loss;
    res->last_loss = loss;
    res->steps = step + 1;
    if (o->progress)
      fprintf(o->progress, "step %lld/%lld loss %.4f lr %.3g grad_norm %.4f tokens/s %.0f eta %.0fs\n", (long long)(step + 1),
              (long long)steps, loss, lr, gnorm, (double)tokens / dt, (now_s() - start) / (double)(step + 1) * (double)(steps - step - 1));
    if (log)
      fprintf(log, "{\"step\":%lld,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6f,\"tokens_per_s\":%.1f}\n", (long long)(step + 1),
              loss, lr, gnorm, (double)tokens / dt);
    bool last = step + 1 == steps;
    if (ev.n && (last || (o->eval_every > 0 && (step + 1) % o->eval_every == 0))) {
      if ((rc = eval_loss(t, &ev, &res->eval_last, err))) goto out;
      if (o->progress) fprintf(o->progress, "eval step %lld loss %.4f\n", (long long)(step + 1), res->eval_last);
      if (log) fprintf(log, "{\"step\":%lld,\"eval_loss\":%.6f}\n", (long long)(step + 1), res->eval_last);
    }
    if (log) fflush(log);
  }
  rc = trainer_save(t, o->out, err);
  if (!rc && o->progress) fprintf(o->progress, "train: adapter written to %s\n", o->out);
out:
  if (log) fclose(log);
  free(order);
  train_set_free(&data);
  train_set_free(&ev);
  trainer_free(t);
  return rc;
}
