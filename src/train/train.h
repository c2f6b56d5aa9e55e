/* train.h — LoRA fine-tuning of a llama-family decoder on the CPU
 * (`hearth train sft`, `dpo`, `orpo`): training data read from JSONL and rendered through
 * the model's own chat template (SFT's short examples optionally packed into
 * sequences), the trainer (a forward that keeps its activations, or only
 * checkpoints of them to recompute from, the backward of grad.h through every
 * layer, AdamW with warm-up and cosine decay, gradient accumulation and
 * clipping), and the
 * adapter written as PEFT writes it (adapter_config.json +
 * adapter_model.safetensors), which model_lora_load and `--adapter` read.
 *
 * Data lines (one JSON object a line, blank lines skipped):
 *   {"messages": [{"role": ..., "content": ...}, ...]}  rendered with the
 *       model's chat template; the loss is on the assistant turns' tokens
 *       only: each assistant turn is the text by which rendering the
 *       messages up to it extends rendering the ones before it with the
 *       generation prompt (the template's own markers around it are not
 *       learned, its end-of-turn marker is);
 *   {"prompt": ..., "completion": ...}  the prompt tokenized with the
 *       tokenizer's special tokens (BOS), the completion after it followed
 *       by EOS; the loss on the completion and EOS.
 * Examples longer than seq_len tokens are cut to seq_len.
 *
 * Preference lines (DPO, ORPO): {"prompt": ..., "chosen": ..., "rejected": ...}.
 *   A string prompt is a plain prompt (BOS, the prompt; each completion a
 *   string, learned with EOS after it); a prompt of messages is rendered with
 *   the chat template and each completion (a string, or an array of assistant
 *   messages) is the assistant's turn after it, learned as above. Each side
 *   is one example: the prompt's tokens, then its completion's, the loss
 *   flags on the completion only; each is cut to seq_len on its own.
 *
 * A run (train_run) writes into OUT: the adapter, the log (log.jsonl unless
 * --log names another file), the loss curve (loss.svg, loss.png: gnuplot,
 * skipped with a note when it is missing), and with save_every
 * checkpoint-STEP/ folders: the adapter, optimizer.safetensors (AdamW's
 * moments, its step and the dropout generator) and trainer_state.json (the
 * step, the data order's generator and position, the run's shape), from
 * which --resume continues to the same bytes as a run never stopped.
 */
#ifndef HEARTH_TRAIN_TRAIN_H
#define HEARTH_TRAIN_TRAIN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"
#include "chat/chat.h"
#include "tokenizer/tokenizer.h"

/* The projections LoRA can train, PEFT's module names in this order. */
typedef enum train_target { TT_Q, TT_K, TT_V, TT_O, TT_GATE, TT_UP, TT_DOWN, TT_N } train_target;
/* "q_proj", ... */
const char *train_target_name(train_target t);
/* Parses "q_proj,v_proj" (also "q", "v", "all-linear") into a bit set of train_target. */
int train_targets_parse(const char *s, unsigned *out, herr *err);
/* Bits beside the train_target ones in a parsed set: a fused name was given (qkv_proj / gate_up_proj,
 * which set their parts' bits), or all-linear. */
#define TRAIN_TARGET_FUSED (1u << 16)
#define TRAIN_TARGET_ALL (1u << 17)

typedef struct train_example {
  int32_t *ids;   /* owned: n tokens */
  uint8_t *loss;  /* owned: n flags; loss[i]: token i is a target the loss counts */
  int64_t n;
  int32_t *pos;   /* owned, may be NULL: the positions 0..n−1. A packed sequence (train_pack): each example's
                   * positions from 0, a new example wherever pos is 0; attention stays inside an example and no
                   * token is predicted across the boundary */
} train_example;

typedef struct train_set {
  train_example *ex; /* owned */
  int64_t n, cap;
  int64_t tokens, loss_tokens;
} train_set;

typedef enum train_method { TRAIN_SFT, TRAIN_DPO, TRAIN_ORPO } train_method;
const char *train_method_name(train_method m); /* "sft", "dpo", "orpo" */

/* A preference pair: the same prompt, each completion after it. */
typedef struct train_pair {
  train_example chosen, rejected;  /* owned */
  double ref_chosen, ref_rejected; /* DPO: the reference model's summed log-probs of each completion (NAN: not computed) */
} train_pair;

typedef struct train_pairs {
  train_pair *p; /* owned */
  int64_t n, cap;
  int64_t tokens, chosen_tokens; /* every token of both sides; the chosen sides' learned tokens */
} train_pairs;

/* Packing (SFT's --packing, TRL's SFTTrainer packing=True with its "bfd" strategy and padding-free
 * position ids): in's examples into out as sequences of up to seq_len tokens, none split. Best-fit
 * decreasing: the examples longest first (ties in their order), each into the sequence with the least room
 * that still holds it (the first such sequence filled), else a new one; the sequences in the order they were
 * begun. Each sequence is one train_example with pos restarting at 0 for each example in it. in is unchanged. */
int train_pack(const train_set *in, int64_t seq_len, train_set *out, herr *err);

/* Reads a JSONL file of the lines above into set (appending). tmpl may be
 * NULL when no line has messages. Errors name the file and line. */
int train_data_load(const char *path, const tokenizer *tok, const chat_template *tmpl, int64_t seq_len, train_set *set,
                    herr *err);
/* One example from one parsed line (what names it in messages). */
int train_example_from_json(const void *json_obj, const char *what, const tokenizer *tok, const chat_template *tmpl,
                            int64_t seq_len, train_example *out, herr *err);
void train_set_free(train_set *set);
/* Preference lines into set (appending); errors name the file, line and side. */
int train_pairs_load(const char *path, const tokenizer *tok, const chat_template *tmpl, int64_t seq_len, train_pairs *set,
                     herr *err);
int train_pair_from_json(const void *json_obj, const char *what, const tokenizer *tok, const chat_template *tmpl,
                         int64_t seq_len, train_pair *out, herr *err);
void train_pairs_free(train_pairs *set);

/* ---- the preference losses of one pair (pref.c), as TRL computes them ---- */

/* DPO's sigmoid loss (DPOTrainer's default, no label smoothing): with
 * z = (pc − pr) − (rc − rr) over the summed log-probs of the completions
 * under the policy (pc, pr) and the reference (rc, rr), −log σ(β z).
 * *d_pc, *d_pr: its derivatives in pc and pr. */
double pref_dpo_loss(double beta, double pc, double pr, double rc, double rr, double *d_pc, double *d_pr);
/* ORPO's odds-ratio term (ORPOTrainer): with ac, ar the mean per-token
 * log-probs of the completions and
 * lo = (ac − ar) − (log(1 − e^ac) − log(1 − e^ar)), −β log σ(lo) (the run
 * adds the chosen side's NLL). *d_ac, *d_ar: its derivatives; *log_odds: lo. */
double pref_orpo_loss(double beta, double ac, double ar, double *d_ac, double *d_ar, double *log_odds);

/* What a run does; train_opts_init gives the defaults. */
typedef struct train_opts {
  const char *model_dir; /* a model folder hearth loads */
  const char *data;      /* training JSONL */
  const char *eval;      /* may be NULL: evaluation JSONL */
  const char *out;       /* the adapter's folder (made when missing) */
  const char *log;       /* may be NULL: a JSONL log of every step */
  int64_t steps;         /* optimizer steps; 0: from epochs */
  double epochs;         /* default 1 */
  double lr;             /* peak learning rate, default 2e-4 */
  int64_t warmup;        /* warm-up steps, -1: a tenth of the steps */
  double weight_decay;   /* AdamW, default 0 */
  double max_grad_norm;  /* clipping of the global gradient norm, default 1; <= 0: none */
  int64_t rank;          /* default 8 */
  double alpha;          /* default 16 */
  double dropout;        /* LoRA dropout on the adapters' input, default 0 */
  bool rslora;           /* scale alpha / sqrt(r) instead of alpha / r */
  unsigned targets;      /* bit set of train_target, default q_proj | v_proj */
  int64_t batch;         /* examples per micro-batch, default 4 */
  int64_t grad_accum;    /* micro-batches per optimizer step, default 1 */
  int64_t seq_len;       /* default 512 */
  uint64_t seed;         /* default 0 */
  int threads;           /* <= 0: one per CPU */
  int64_t eval_every;    /* steps between evaluations (0: at the start and the end only) */
  FILE *progress;        /* may be NULL: a line per step */
  int progress_tty;      /* -1: ask isatty(progress); 1: one line rewritten in place; 0: a line per step */
  train_method method;   /* default TRAIN_SFT */
  double beta;           /* DPO's beta, ORPO's lambda; default 0.1 */
  int64_t save_every;    /* > 0: a checkpoint every that many steps into out/checkpoint-STEP */
  const char *resume;    /* NULL: start afresh; "": the latest checkpoint in out; else a checkpoint folder */
  bool plot;             /* draw the loss curve at the end (default true; never fails the run) */
  bool packing;          /* SFT: the examples packed into sequences of up to seq_len tokens (train_pack) */
  int64_t checkpoint_layers; /* 0: every layer's activations kept from the forward to the backward; N >= 1: only the
                              * input of every N-th layer, the layers' activations recomputed from it in the
                              * backward (the same numbers: gradients bit-identical) */
} train_opts;

void train_opts_init(train_opts *o);

typedef struct train_result {
  int64_t steps;
  double first_loss, last_loss; /* training loss of the first and last step */
  double eval_first, eval_last; /* evaluation loss before and after (NAN without eval data) */
  int64_t resumed_at;           /* the checkpoint's step a resumed run started from (0: none) */
  double tokens_per_s;          /* over the run's steps */
} train_result;

/* Trains a LoRA adapter by o->method and writes it to o->out. */
int train_run(const train_opts *o, train_result *res, herr *err);
/* train_run with method SFT. */
int train_sft(const train_opts *o, train_result *res, herr *err);

/* The loss curve of a run's log (train_run's JSONL) drawn by gnuplot to
 * png_path and svg_path: the training loss per step, the evaluation loss
 * where there is one. HEARTH_ENOTFOUND when gnuplot is not installed. */
int train_plot(const char *log_path, const char *png_path, const char *svg_path, const char *title, herr *err);
/* The latest checkpoint-STEP folder in out (malloc'd), or NULL. */
char *train_latest_checkpoint(const char *out);

/* ---- the trainer, for tests and tools ---- */

typedef struct trainer trainer;
/* Loads the model (CPU) and makes the adapter: A seeded (PEFT's kaiming-uniform, bound 1 / sqrt(in)), B zeros. */
int trainer_new(const train_opts *o, trainer **out, herr *err);
void trainer_free(trainer *t);
const tokenizer *trainer_tokenizer(const trainer *t); /* NULL when the model folder has none */
const chat_template *trainer_template(const trainer *t); /* NULL when the model has none */
/* The summed loss and counted tokens of ex under the current adapter; with
 * grads, the gradients of dscale · that loss are added to the adapter's. A
 * packed ex (pos) is its examples each alone: attention within each, each
 * from position 0. */
int trainer_loss(trainer *t, const train_example *ex, bool grads, float dscale, double *loss_sum, int64_t *count,
                 herr *err);
/* Restarts the draws of the adapters' dropout masks from seed (tests: the same masks again). */
void trainer_reseed(trainer *t, uint64_t seed);
/* With off, forwards run the base model alone (DPO's reference model). */
void trainer_adapter_off(trainer *t, bool off);
/* Sums over the pairs a step's preference loss adds (the run's logging). */
typedef struct pref_stats {
  double margin;   /* DPO: β ((pc − rc) − (pr − rr)), the reward margin */
  double correct;  /* DPO: pairs whose chosen reward is above the rejected's */
  double log_odds; /* ORPO: lo */
  double nll;      /* ORPO: the chosen side's summed NLL */
  int64_t pairs;
} pref_stats;
/* One pair's share of a step's loss by method m (DPO: pair_w · its loss;
 * ORPO: nll_w · the chosen side's summed NLL + pair_w · its odds-ratio term),
 * added to *loss; with grads, the gradient of that share is added to the
 * adapter's. DPO needs p's reference log-probs. */
int trainer_pref_loss(trainer *t, train_method m, double beta, const train_pair *p, double pair_w, double nll_w, bool grads,
                      double *loss, pref_stats *st, herr *err);
/* The bytes of activations the trainer holds for a sequence of T tokens (kept for the backward, and scratch). */
int64_t trainer_activation_bytes(const trainer *t, int64_t T);
/* logits [n, vocab] of every position under the current adapter. */
int trainer_logits(trainer *t, const int32_t *ids, int64_t n, float *logits, herr *err);
/* One optimizer step over the gradients added since the last (they are cleared): returns the global
 * gradient norm before clipping in *gnorm. lr: this step's learning rate. */
void trainer_step(trainer *t, double lr, double *gnorm);
/* The adapter's parameters and gradients, flat (tests). */
float *trainer_params(trainer *t, int64_t *n);
float *trainer_grads(trainer *t);
/* Sets the adapter's parameters from a PEFT adapter folder's adapter_model.safetensors (F32 or F64 tensors
 * under the names trainer_save writes, of the trainer's rank and targets; a tensor missing or of another
 * shape is an error naming it). */
int trainer_load_adapter(trainer *t, const char *dir, herr *err);
/* Writes adapter_config.json and adapter_model.safetensors into dir (made when missing). */
int trainer_save(const trainer *t, const char *dir, herr *err);
/* AdamW's moments and step and the dropout generator, as dir/optimizer.safetensors; and back (of the same
 * shape: another is an error naming it). */
int trainer_save_optimizer(const trainer *t, const char *dir, herr *err);
int trainer_load_optimizer(trainer *t, const char *dir, herr *err);
/* HF's cosine schedule with warm-up: the learning rate of update k (from 0) of total. */
double train_lr_at(double peak, int64_t k, int64_t warmup, int64_t total);

#endif
