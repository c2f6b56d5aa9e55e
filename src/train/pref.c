/* pref.c — the preference losses of one pair (train.h): DPO's sigmoid loss
 * and ORPO's odds-ratio term as TRL's DPOTrainer and ORPOTrainer compute
 * them, with their derivatives in the policy's log-probs, in double. The
 * trainer turns those derivatives into the adapter's gradient; the tests
 * check both against hand-worked values and finite differences. */
#include <math.h>

#include "train/train.h"

const char *train_method_name(train_method m) { return m == TRAIN_DPO ? "dpo" : m == TRAIN_ORPO ? "orpo" : "sft"; }

/* log(1 + e^x) without overflow. */
static double softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }
static double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }

double pref_dpo_loss(double beta, double pc, double pr, double rc, double rr, double *d_pc, double *d_pr) {
  double z = (pc - pr) - (rc - rr), g = -beta * sigmoid(-beta * z); /* d loss / d z */
  if (d_pc) *d_pc = g;
  if (d_pr) *d_pr = -g;
  return softplus(-beta * z); /* −log σ(β z) */
}

double pref_orpo_loss(double beta, double ac, double ar, double *d_ac, double *d_ar, double *log_odds) {
  /* a mean log-prob of 0 (every token certain) has infinite odds: held just below */
  if (ac > -1e-12) ac = -1e-12;
  if (ar > -1e-12) ar = -1e-12;
  double oc = -expm1(ac), orr = -expm1(ar); /* 1 − e^a */
  double lo = (ac - ar) - (log(oc) - log(orr)), g = -beta * sigmoid(-lo); /* d term / d lo */
  if (d_ac) *d_ac = g / oc;
  if (d_ar) *d_ar = -g / orr;
  if (log_odds) *log_odds = lo;
  return beta * softplus(-lo); /* −β log σ(lo) */
}
