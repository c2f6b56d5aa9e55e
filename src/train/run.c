/* run.c — a training run (train_run): the data and evaluation sets of its
 * method (examples for SFT, packed into sequences with --packing; preference
 * pairs for DPO and ORPO, with DPO's reference log-probs computed once, the
 * adapter switched off), the seeded order of examples over epochs, optimizer
 * steps of batch × grad_accum examples (packed sequences), the learning-rate
 * schedule, progress (one line rewritten on a terminal, a line per step
 * otherwise), the JSONL log, checkpoints and resuming from one, the adapter
 * and the loss curve written at the end.
 *
 * A step's loss: SFT, the summed NLL of its learned tokens over their count
 * (packed or not: per learned token over the whole step, as TRL's);
 * DPO, the mean of its pairs' losses; ORPO, the chosen sides' NLL over their
 * learned tokens plus the mean of the pairs' odds-ratio terms. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/hash.h"
#include "train/train.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_s(void) { /* the process's CPU time, every thread's */
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void shuffle(int64_t *order, int64_t n, uint64_t *rng) {
  for (int64_t i = 0; i < n; i++) order[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)(hsplitmix64(rng) % (uint64_t)(i + 1)), x = order[i];
    order[i] = order[j], order[j] = x;
  }
}

typedef struct run {
  const train_opts *o;
  trainer *t;
  bool pref;             /* DPO or ORPO: pairs */
  train_set data, ev;    /* SFT */
  train_pairs pdata, pev; /* DPO, ORPO */
  int64_t n;             /* training items */
  int64_t *order;        /* owned: [n] */
  uint64_t rng, epoch_rng; /* the order's generator, and its state before the epoch's shuffle */
  int64_t at;            /* the next item of the epoch's order */
  FILE *progress;
  bool tty, line_open;   /* a progress line is on the terminal, unfinished */
} run;

/* A message on its own line (a progress line in place first cleared). */
static void note(run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(run *r, const char *fmt, ...) {
  if (!r->progress) return;
  if (r->line_open) fputs("\r\033[K", r->progress), r->line_open = false;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(r->progress, fmt, ap);
  va_end(ap);
  fputc('\n', r->progress);
  fflush(r->progress);
}

static void fmt_eta(char *out, size_t n, double s) {
  if (!(s >= 0) || s > 1e8) snprintf(out, n, "?");
  else if (s >= 3600) snprintf(out, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
  else if (s >= 60) snprintf(out, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
  else snprintf(out, n, "%.0fs", s);
}

static void progress_step(run *r, int64_t step, int64_t steps, double loss, double lr, double gnorm, double tps, double eta) {
  if (!r->progress) return;
  if (r->tty) {
    char e[32];
    fmt_eta(e, sizeof e, eta);
    fprintf(r->progress, "\r\033[K%s step %lld/%lld  loss %.4f  lr %.3g  %.0f tok/s  ETA %s", train_method_name(r->o->method),
            (long long)step, (long long)steps, loss, lr, tps, e);
    r->line_open = true;
  } else {
    fprintf(r->progress, "step %lld/%lld loss %.4f lr %.3g grad_norm %.4f tokens/s %.0f eta %.0fs\n", (long long)step,
            (long long)steps, loss, lr, gnorm, tps, eta);
  }
  fflush(r->progress);
}

static int eval_loss(run *r, double *out, herr *err) {
  double sum = 0;
  int rc = 0;
  if (!r->pref) {
    int64_t count = 0;
    for (int64_t i = 0; !rc && i < r->ev.n; i++) rc = trainer_loss(r->t, &r->ev.ex[i], false, 0, &sum, &count, err);
    *out = count ? sum / (double)count : NAN;
    return rc;
  }
  const train_pairs *e = &r->pev;
  for (int64_t i = 0; !rc && i < e->n; i++)
    rc = trainer_pref_loss(r->t, r->o->method, r->o->beta, &e->p[i], 1.0 / (double)e->n, 1.0 / (double)e->chosen_tokens, false,
                           &sum, NULL, err);
  *out = sum;
  return rc;
}

/* DPO's reference: each completion's summed log-prob under the base model alone. */
static int reference_logps(run *r, train_pairs *s, herr *err) {
  trainer_adapter_off(r->t, true);
  int rc = 0;
  for (int64_t i = 0; !rc && i < s->n; i++) {
    double c = 0, j = 0;
    int64_t k = 0;
    if (!(rc = trainer_loss(r->t, &s->p[i].chosen, false, 0, &c, &k, err)) &&
        !(rc = trainer_loss(r->t, &s->p[i].rejected, false, 0, &j, &k, err)))
      s->p[i].ref_chosen = -c, s->p[i].ref_rejected = -j;
  }
  trainer_adapter_off(r->t, false);
  return rc;
}

static int64_t item_tokens(const run *r, int64_t i) {
  return r->pref ? r->pdata.p[i].chosen.n + r->pdata.p[i].rejected.n : r->data.ex[i].n;
}

static int64_t item_learned(const run *r, int64_t i) { /* SFT: the example's learned tokens; pairs: the chosen side's */
  const train_example *x = r->pref ? &r->pdata.p[i].chosen : &r->data.ex[i];
  int64_t c = 0;
  for (int64_t j = 1; j < x->n; j++) c += x->loss[j];
  return c;
}

/* ---- checkpoints ---- */

char *train_latest_checkpoint(const char *out) {
  DIR *d = opendir(out);
  if (!d) return NULL;
  long long best = -1;
  struct dirent *e;
  while ((e = readdir(d))) {
    char *end = NULL;
    if (strncmp(e->d_name, "checkpoint-", 11) != 0) continue;
    long long k = strtoll(e->d_name + 11, &end, 10);
    if (end == e->d_name + 11 || *end || k < 0) continue;
    char *dir = hpath_join(out, e->d_name), *st = dir ? hpath_join(dir, "trainer_state.json") : NULL;
    if (st && hfile_exists(st) && k > best) best = k;
    free(dir), free(st);
  }
  closedir(d);
  if (best < 0) return NULL;
  char name[64];
  snprintf(name, sizeof name, "checkpoint-%lld", best);
  return hpath_join(out, name);
}

/* The run's shape a checkpoint must match to be continued. */
static json_t *run_shape(const run *r, int64_t steps) {
  const train_opts *o = r->o;
  json_t *s = json_pack("{s:s,s:I,s:I,s:I,s:I,s:I}", "method", train_method_name(o->method), "steps", (json_int_t)steps, "batch",
                        (json_int_t)o->batch, "grad_accum", (json_int_t)o->grad_accum, "seed", (json_int_t)o->seed, "examples",
                        (json_int_t)r->n);
  if (s && o->packing) json_object_set_new(s, "packing", json_true()); /* "examples": the packed sequences */
  return s;
}

static int save_checkpoint(run *r, int64_t step, int64_t steps, const char *log_path, herr *err) {
  char name[64];
  snprintf(name, sizeof name, "checkpoint-%lld", (long long)step);
  char *dir = hpath_join(r->o->out, name);
  if (!dir) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  int rc = trainer_save(r->t, dir, err);
  if (!rc) rc = trainer_save_optimizer(r->t, dir, err);
  if (!rc) {
    json_t *s = run_shape(r, steps);
    char rng[32];
    snprintf(rng, sizeof rng, "%016llx", (unsigned long long)r->epoch_rng);
    json_object_set_new(s, "step", json_integer(step));
    json_object_set_new(s, "data_rng", json_string(rng));
    json_object_set_new(s, "data_at", json_integer(r->at));
    json_object_set_new(s, "beta", json_real(r->o->beta));
    json_object_set_new(s, "lr", json_real(r->o->lr));
    if (log_path) json_object_set_new(s, "log", json_string(log_path));
    char *path = hpath_join(dir, "trainer_state.json"), *tmp = path ? malloc(strlen(path) + 8) : NULL;
    if (tmp) sprintf(tmp, "%s.tmp", path);
    /* written last, through a rename: a folder with trainer_state.json is a whole checkpoint */
    if (!tmp || json_dump_file(s, tmp, JSON_INDENT(1) | JSON_SORT_KEYS) || rename(tmp, path))
      rc = herr_set(err, HEARTH_EIO, "%s/trainer_state.json: cannot write", dir);
    free(path), free(tmp);
    json_decref(s);
  }
  if (!rc) note(r, "%s: checkpoint %s", train_method_name(r->o->method), dir);
  free(dir);
  return rc;
}

/* Reads a checkpoint into the trainer and the order's state; returns its step. */
static int load_checkpoint(run *r, const char *dir, int64_t steps, int64_t *step, herr *err) {
  char *path = hpath_join(dir, "trainer_state.json");
  if (!path) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  json_error_t je;
  json_t *s = json_load_file(path, 0, &je);
  int rc = 0;
  if (!s) rc = herr_set(err, HEARTH_ENOTFOUND, "--resume: %s: %s", path, je.text);
  json_t *want = s ? run_shape(r, steps) : NULL;
  const char *k;
  json_t *v;
  json_object_foreach(want, k, v) {
    if (rc) break;
    json_t *got = json_object_get(s, k);
    if (!json_equal(got, v)) {
      char *a = json_dumps(v, JSON_ENCODE_ANY), *b = got ? json_dumps(got, JSON_ENCODE_ANY) : strdup("nothing");
      rc = herr_set(err, HEARTH_EINVAL, "--resume: %s was a run with %s %s, this one has %s: resume with the same settings",
                    dir, k, b ? b : "?", a ? a : "?");
      free(a), free(b);
    }
  }
  json_decref(want);
  const char *rng = json_string_value(json_object_get(s, "data_rng"));
  json_int_t st = json_integer_value(json_object_get(s, "step")), at = json_integer_value(json_object_get(s, "data_at"));
  char *end = NULL;
  unsigned long long er = rng ? strtoull(rng, &end, 16) : 0;
  if (!rc && (!rng || *end || st < 1 || st > steps || at < 0 || at > r->n))
    rc = herr_set(err, HEARTH_EFORMAT, "--resume: %s: no valid \"step\", \"data_rng\" and \"data_at\"", path);
  if (!rc && !(rc = trainer_load_adapter(r->t, dir, err)) && !(rc = trainer_load_optimizer(r->t, dir, err))) {
    r->rng = r->epoch_rng = er;
    shuffle(r->order, r->n, &r->rng);
    r->at = at;
    *step = st;
  }
  json_decref(s);
  free(path);
  return rc;
}

/* Keeps the log's lines up to step (a resumed run goes on from there). */
static void trim_log(const char *path, int64_t step) {
  char *text = NULL;
  size_t len = 0;
  if (hfile_read(path, &text, &len, NULL)) return;
  FILE *f = fopen(path, "w");
  for (char *s = text; f && s < text + len;) {
    char *e = memchr(s, '\n', (size_t)(text + len - s));
    size_t n = e ? (size_t)(e - s + 1) : (size_t)(text + len - s);
    json_t *o = json_loadb(s, n, JSON_DISABLE_EOF_CHECK, NULL);
    if (o && json_integer_value(json_object_get(o, "step")) <= step) fwrite(s, 1, n, f);
    json_decref(o);
    s += n;
  }
  if (f) fclose(f);
  free(text);
}

/* ---- the run ---- */

/* set's examples replaced by their packed sequences (train_pack). */
static int pack_set(train_set *set, int64_t seq_len, herr *err) {
  if (!set->n) return 0;
  train_set packed;
  int rc = train_pack(set, seq_len, &packed, err);
  if (rc) return rc;
  train_set_free(set);
  *set = packed;
  return 0;
}

static int load_data(run *r, herr *err) {
  const train_opts *o = r->o;
  const tokenizer *tok = trainer_tokenizer(r->t);
  const chat_template *tm = trainer_template(r->t);
  int rc;
  if (!r->pref) {
    if ((rc = train_data_load(o->data, tok, tm, o->seq_len, &r->data, err))) return rc;
    if (o->eval && (rc = train_data_load(o->eval, tok, tm, o->seq_len, &r->ev, err))) return rc;
    if (o->packing) {
      int64_t examples = r->data.n;
      if ((rc = pack_set(&r->data, o->seq_len, err)) || (rc = pack_set(&r->ev, o->seq_len, err))) return rc;
      note(r, "sft: %lld examples packed into %lld sequence%s of up to %lld tokens (%.1f%% filled)", (long long)examples,
           (long long)r->data.n, r->data.n == 1 ? "" : "s", (long long)o->seq_len,
           100.0 * (double)r->data.tokens / ((double)r->data.n * (double)o->seq_len));
    }
    r->n = r->data.n;
    return 0;
  }
  if ((rc = train_pairs_load(o->data, tok, tm, o->seq_len, &r->pdata, err))) return rc;
  if (o->eval && (rc = train_pairs_load(o->eval, tok, tm, o->seq_len, &r->pev, err))) return rc;
  r->n = r->pdata.n;
  if (o->method == TRAIN_DPO) {
    double t0 = now_s();
    if ((rc = reference_logps(r, &r->pdata, err)) || (rc = reference_logps(r, &r->pev, err))) return rc;
    note(r, "dpo: the reference model's log-probs of %lld pairs in %.1f s", (long long)(r->pdata.n + r->pev.n), now_s() - t0);
  }
  return 0;
}

int train_run(const train_opts *o, train_result *res, herr *err) {
  memset(res, 0, sizeof *res);
  res->eval_first = res->eval_last = NAN;
  if (o->batch < 1 || o->grad_accum < 1 || o->seq_len < 2)
    return herr_set(err, HEARTH_EINVAL, "--batch and --grad-accum must be at least 1, --seq-len at least 2");
  if (!(o->lr > 0)) return herr_set(err, HEARTH_EINVAL, "--lr must be positive");
  if (o->method != TRAIN_SFT && !(o->beta > 0)) return herr_set(err, HEARTH_EINVAL, "--beta must be positive");
  if (o->method != TRAIN_SFT && o->packing)
    return herr_set(err, HEARTH_EINVAL, "--packing is for sft: a preference pair's two sides are scored apart");
  if (!o->out) return herr_set(err, HEARTH_EINVAL, "no output folder");
  if (mkdir(o->out, 0755) && errno != EEXIST)
    return herr_set(err, HEARTH_EIO, "%s: cannot create the folder: %s", o->out, strerror(errno));
  run r = {.o = o, .pref = o->method != TRAIN_SFT, .progress = o->progress};
  r.tty = o->progress && (o->progress_tty < 0 ? isatty(fileno(o->progress)) : o->progress_tty > 0);
  FILE *log = NULL;
  char *log_path = o->log ? strdup(o->log) : hpath_join(o->out, "log.jsonl"), *resume_dir = NULL;
  int64_t *batch = NULL;
  int rc = log_path ? trainer_new(o, &r.t, err) : herr_set(err, HEARTH_ENOMEM, "out of memory");
  if (rc || (rc = load_data(&r, err))) goto out;
  int64_t per_step = o->batch * o->grad_accum;
  int64_t steps = o->steps > 0 ? o->steps : (int64_t)ceil((double)r.n * o->epochs / (double)per_step);
  if (steps < 1) steps = 1;
  int64_t warmup = o->warmup >= 0 ? o->warmup : steps / 10;
  r.order = malloc((size_t)r.n * sizeof *r.order);
  batch = malloc((size_t)per_step * sizeof *batch);
  if (!r.order || !batch) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto out;
  }
  r.rng = r.epoch_rng = o->seed ^ 0x73667400ull;
  shuffle(r.order, r.n, &r.rng);
  int64_t start = 0;
  if (o->resume) {
    resume_dir = o->resume[0] ? strdup(o->resume) : train_latest_checkpoint(o->out);
    if (!resume_dir) {
      rc = herr_set(err, HEARTH_ENOTFOUND, "--resume: no checkpoint-STEP folder in %s to resume from", o->out);
      goto out;
    }
    if ((rc = load_checkpoint(&r, resume_dir, steps, &start, err))) goto out;
    res->resumed_at = start;
    trim_log(log_path, start);
  }
  if (!(log = fopen(log_path, o->resume ? "a" : "w"))) {
    rc = herr_set(err, HEARTH_EIO, "%s: cannot write the log", log_path);
    goto out;
  }
  int64_t items = r.pref ? r.pdata.n : r.data.n, tokens_all = r.pref ? r.pdata.tokens : r.data.tokens;
  if (r.progress) {
    note(&r, "%s: %lld %s (%lld tokens), %lld steps of %lld, rank %lld, alpha %g", train_method_name(o->method),
         (long long)items, r.pref ? "pairs" : o->packing ? (items == 1 ? "packed sequence" : "packed sequences") : "examples", (long long)tokens_all,
         (long long)steps, (long long)per_step, (long long)o->rank, o->alpha);
    int64_t longest = 0;
    for (int64_t i = 0; i < r.n; i++) {
      const train_example *x = r.pref ? &r.pdata.p[i].chosen : &r.data.ex[i];
      if (x->n > longest) longest = x->n;
      if (r.pref && r.pdata.p[i].rejected.n > longest) longest = r.pdata.p[i].rejected.n;
    }
    if (o->checkpoint_layers > 0)
      note(&r, "%s: activations of a %lld-token sequence: %.1f MiB (--checkpoint-layers %lld: the input of every span of "
           "%lld layers kept, their activations recomputed in the backward)", train_method_name(o->method), (long long)longest,
           (double)trainer_activation_bytes(r.t, longest) / 1048576.0, (long long)o->checkpoint_layers,
           (long long)o->checkpoint_layers);
    else
      note(&r, "%s: activations of a %lld-token sequence: %.1f MiB", train_method_name(o->method), (long long)longest,
           (double)trainer_activation_bytes(r.t, longest) / 1048576.0);
    if (start) note(&r, "%s: resumed from %s at step %lld", train_method_name(o->method), resume_dir, (long long)start);
  }
  bool have_eval = r.pref ? r.pev.n > 0 : r.ev.n > 0;
  if (have_eval && !start) {
    if ((rc = eval_loss(&r, &res->eval_first, err))) goto out;
    res->eval_last = res->eval_first;
    note(&r, "eval step 0 loss %.4f", res->eval_first);
    fprintf(log, "{\"step\":0,\"eval_loss\":%.6f}\n", res->eval_first);
    fflush(log);
  }
  double t_start = now_s();
  int64_t tokens_run = 0;
  for (int64_t step = start; step < steps; step++) {
    double t0 = now_s(), c0 = cpu_s();
    int64_t learned = 0, tokens = 0;
    for (int64_t i = 0; i < per_step; i++) {
      if (r.at == r.n) r.epoch_rng = r.rng, shuffle(r.order, r.n, &r.rng), r.at = 0;
      batch[i] = r.order[r.at++];
      learned += item_learned(&r, batch[i]);
      tokens += item_tokens(&r, batch[i]);
    }
    double loss = 0;
    pref_stats ps = {0};
    if (!r.pref) {
      double sum = 0;
      int64_t count = 0;
      for (int64_t i = 0; i < per_step; i++)
        if ((rc = trainer_loss(r.t, &r.data.ex[batch[i]], true, 1.0f / (float)learned, &sum, &count, err))) goto out;
      loss = sum / (double)count;
    } else {
      for (int64_t i = 0; i < per_step; i++)
        if ((rc = trainer_pref_loss(r.t, o->method, o->beta, &r.pdata.p[batch[i]], 1.0 / (double)per_step, 1.0 / (double)learned,
                                    true, &loss, &ps, err)))
          goto out;
    }
    double lr = train_lr_at(o->lr, step, warmup, steps), gnorm = 0;
    trainer_step(r.t, lr, &gnorm);
    double now = now_s(), dt = now - t0, tps = (double)tokens / dt;
    tokens_run += tokens;
    if (step == start) res->first_loss = loss;
    res->last_loss = loss;
    res->steps = step + 1;
    double eta = (now - t_start) / (double)(step + 1 - start) * (double)(steps - step - 1);
    progress_step(&r, step + 1, steps, loss, lr, gnorm, tps, eta);
    fprintf(log, "{\"step\":%lld,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6f,\"tokens_per_s\":%.1f,\"tokens\":%lld,\"cpu_s\":%.3f",
            (long long)(step + 1), loss, lr, gnorm, tps, (long long)tokens, cpu_s() - c0);
    if (o->method == TRAIN_DPO)
      fprintf(log, ",\"reward_margin\":%.6f,\"reward_accuracy\":%.4f", ps.margin / (double)ps.pairs, ps.correct / (double)ps.pairs);
    else if (o->method == TRAIN_ORPO)
      fprintf(log, ",\"nll\":%.6f,\"log_odds\":%.6f", ps.nll / (double)learned, ps.log_odds / (double)ps.pairs);
    fputs("}\n", log);
    bool last = step + 1 == steps;
    if (have_eval && (last || (o->eval_every > 0 && (step + 1) % o->eval_every == 0))) {
      if ((rc = eval_loss(&r, &res->eval_last, err))) goto out;
      note(&r, "eval step %lld loss %.4f", (long long)(step + 1), res->eval_last);
      fprintf(log, "{\"step\":%lld,\"eval_loss\":%.6f}\n", (long long)(step + 1), res->eval_last);
    }
    fflush(log);
    if (o->save_every > 0 && (step + 1) % o->save_every == 0 && (rc = save_checkpoint(&r, step + 1, steps, log_path, err)))
      goto out;
  }
  double took = now_s() - t_start;
  res->tokens_per_s = took > 0 ? (double)tokens_run / took : 0;
  if (r.line_open) fputc('\n', r.progress), r.line_open = false;
  fclose(log), log = NULL;
  if ((rc = trainer_save(r.t, o->out, err))) goto out;
  note(&r, "%s: adapter written to %s (%.0f tokens/s over %lld steps)", train_method_name(o->method), o->out, res->tokens_per_s,
       (long long)(res->steps - start));
  if (o->plot) {
    char *png = hpath_join(o->out, "loss.png"), *svg = hpath_join(o->out, "loss.svg"), title[600];
    const char *slash = o->model_dir ? strrchr(o->model_dir, '/') : NULL;
    snprintf(title, sizeof title, "hearth train %s, %s", train_method_name(o->method),
             slash && slash[1] ? slash + 1 : o->model_dir ? o->model_dir : "");
    herr perr = {0};
    if (!png || !svg) snprintf(perr.msg, sizeof perr.msg, "out of memory");
    if (!png || !svg || train_plot(log_path, png, svg, title, &perr)) note(&r, "%s: no loss curve: %s", train_method_name(o->method), perr.msg);
    else note(&r, "%s: loss curve in %s and %s", train_method_name(o->method), svg, png);
    free(png), free(svg);
  }
out:
  if (r.line_open) fputc('\n', r.progress);
  if (log) fclose(log);
  free(log_path), free(resume_dir), free(batch), free(r.order);
  train_set_free(&r.data);
  train_set_free(&r.ev);
  train_pairs_free(&r.pdata);
  train_pairs_free(&r.pev);
  trainer_free(r.t);
  return rc;
}

int train_sft(const train_opts *o, train_result *res, herr *err) {
  train_opts s = *o;
  s.method = TRAIN_SFT;
  return train_run(&s, res, err);
}
