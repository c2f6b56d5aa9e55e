/* trainer.c — the LoRA trainer of train.h on the CPU: the llama decoder's
 * forward over one example (or a packed sequence of several, each attending
 * to itself from position 0) with every activation the backward needs kept —
 * or, with checkpoints, only every N-th layer's input, each span of N layers
 * run forward again before its backward —, the backward through the head,
 * the layers and the adapters (grad.h), the
 * adapter's parameters with AdamW, and its file as PEFT writes it; a
 * preference pair's loss (DPO, ORPO) through the gradients of its two
 * sides; the optimizer's state for checkpoints.
 *
 * The base model stays frozen and in its stored format: forward products go
 * through bk_matmul on the stored weights (f32 activations, exact to the
 * dequantized weights), input gradients through a dequantized f32 copy of
 * each matrix's transpose (grad_weight_t). Adapter parameters are f32, their
 * products through bk_matmul's f32 kernels too (grad_lora_fwd / grad_lora are
 * their reference: the tests hold the whole model's gradient to finite
 * differences).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/cpu/cpu.h"
#include "base/hash.h"
#include "base/pool.h"
#include "format/safetensors.h"
#include "format/safetensors_write.h"
#include "model/model.h"
#include "model/train_view.h"
#include "train/grad.h"
#include "train/train.h"

#define CE_CHUNK 32 /* rows of logits the cross-entropy holds at once */

static const char *const target_names[TT_N] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

/* With fused projections (phi3) the q slot adapts qkv_proj and the gate slot gate_up_proj. */
static const char *const fused_names[TT_N] = {"qkv_proj", NULL, NULL, "o_proj", "gate_up_proj", NULL, "down_proj"};

const char *train_target_name(train_target t) { return t < TT_N ? target_names[t] : "?"; }

int train_targets_parse(const char *s, unsigned *out, herr *err) {
  *out = 0;
  if (!s || !*s) return herr_set(err, HEARTH_EINVAL, "--target: empty");
  if (!strcmp(s, "all-linear")) {
    *out = ((1u << TT_N) - 1) | TRAIN_TARGET_ALL;
    return 0;
  }
  const char *p = s;
  while (*p) {
    const char *e = strchr(p, ',');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    int found = -1;
    for (int t = 0; t < TT_N; t++) {
      size_t k = strlen(target_names[t]) - 5; /* without "_proj" */
      if ((n == k + 5 && !strncmp(p, target_names[t], n)) || (n == k && !strncmp(p, target_names[t], k))) found = t;
    }
    if ((n == 8 && !strncmp(p, "qkv_proj", n)) || (n == 3 && !strncmp(p, "qkv", n))) {
      *out |= 1u << TT_Q | 1u << TT_K | 1u << TT_V | TRAIN_TARGET_FUSED;
    } else if ((n == 12 && !strncmp(p, "gate_up_proj", n)) || (n == 7 && !strncmp(p, "gate_up", n))) {
      *out |= 1u << TT_GATE | 1u << TT_UP | TRAIN_TARGET_FUSED;
    } else if (found < 0) {
      return herr_set(err, HEARTH_EINVAL,
                      "--target: '%.*s' is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj "
                      "(qkv_proj, gate_up_proj where they are fused)",
                      (int)n, p);
    } else {
      *out |= 1u << found;
    }
    p += n;
    if (*p == ',') p++;
  }
  return 0;
}

void train_opts_init(train_opts *o) {
  memset(o, 0, sizeof *o);
  o->epochs = 1;
  o->lr = 2e-4;
  o->warmup = -1;
  o->max_grad_norm = 1.0;
  o->rank = 8;
  o->alpha = 16;
  o->targets = (1u << TT_Q) | (1u << TT_V);
  o->batch = 4;
  o->grad_accum = 1;
  o->seq_len = 512;
  o->beta = 0.1;
  o->progress_tty = -1;
  o->plot = true;
}

double train_lr_at(double peak, int64_t k, int64_t warmup, int64_t total) {
  if (k < warmup) return peak * (double)k / (double)(warmup > 0 ? warmup : 1);
  double span = (double)(total - warmup > 0 ? total - warmup : 1), prog = (double)(k - warmup) / span;
  if (prog > 1) prog = 1;
  return peak * 0.5 * (1.0 + cos(M_PI * prog));
}

/* One layer's kept activations for an example of up to cap_t tokens. */
typedef struct layer_acts {
  float *x, *xn1, *q, *k, *v, *att, *xmid, *xn2, *g, *u, *h;
  float *qr, *kr;    /* with q / k norms: q and k before them [T, Q], [T, KV] */
  float *ao, *mo;    /* with output norms: the attention's and the MLP's outputs before them [T, D] */
  float *lt[TT_N];   /* LoRA x·Aᵀ [T, r] */
  float *lx[TT_N];   /* with dropout: the adapter's masked input [T, in] */
  float *lm[TT_N];   /* with dropout: its mask, 0 or 1 / (1 − p) [T, in] */
} layer_acts;

struct trainer {
  train_opts o;
  model *m;
  train_view v;
  tokenizer *tok;
  chat_template tmpl;
  bool has_tmpl;
  hpool *pool;
  bk_weight *w[TT_N];          /* per layer: the base matrices (borrowed from v) */
  bk_weight *wt;               /* [layers * TT_N]: their transposes, f32 */
  float **wtd;                 /* owned data of wt */
  bk_weight head_t;
  float *head_td;
  float scale;                 /* LoRA scale */
  int64_t P;                   /* adapter floats */
  float *param, *grad, *m1, *m2;
  int64_t adam_t;
  int64_t *off;                /* [layers * TT_N]: offset of A in param (B follows), -1: no adapter */
  /* activations */
  int64_t cap_t;
  float *act;                  /* owned: every kept activation */
  layer_acts *la;              /* [layers]: each layer's activations (with checkpoints, in the sets below) */
  layer_acts *sets;            /* owned: [ck] with checkpoints: the activations of ck consecutive layers */
  int64_t ck;                  /* 0: every layer's activations kept; N: only every N-th layer's input kept (la[l].x
                                * of l % N == 0), the layers of each span of N recomputed from it in the backward */
  uint64_t *ck_rng;            /* owned, [spans] with checkpoints: the dropout generator at each span's start */
  float *xl, *hn;              /* [T, D]: the last layer's output and its norm */
  float *yo;                   /* [T, D]: the forward's attention and MLP outputs (the backward's s1 is kept apart) */
  int64_t *seg, nseg;          /* owned, [cap_t + 1]: the start of each example in the sequence, and T */
  float *s1, *s2, *s3, *s4, *s5, *s6, *s7; /* backward scratch: [T, the widest], s7 [T, 2 KV] */
  float *s8, *s9, *lb1, *lb2, *lb3;   /* the adapters' products: [T, the widest] x2, [T, r] x3 */
  float *lr1, *lr2;                   /* [the widest, r] x2 (owned) */
  float *ce;                   /* CE_CHUNK * vocab */
  int64_t *pos;
  uint64_t rng;
  bool fused;                  /* the q slot is qkv_proj, the gate slot gate_up_proj (train_view.fused) */
  float *fz;                   /* with fused projections: [T, the wider fused output] */
  int64_t wide;                /* the widest activation row (layout) */
  bool adapter_off;            /* forwards of the base alone */
  float *gsave, *gside;        /* owned, [P] each when a pair's loss has run: the gradient before it, its chosen side's */
};

static inline int64_t t_in(const trainer *t, int l, int k) { return t->w[k][l].cols; }
static inline int64_t t_out(const trainer *t, int l, int k) { return t->w[k][l].rows; }

const tokenizer *trainer_tokenizer(const trainer *t) { return t->tok; }
const chat_template *trainer_template(const trainer *t) { return t->has_tmpl ? &t->tmpl : NULL; }
float *trainer_params(trainer *t, int64_t *n) {
  *n = t->P;
  return t->param;
}
float *trainer_grads(trainer *t) { return t->grad; }
void trainer_reseed(trainer *t, uint64_t seed) { t->rng = seed; }
void trainer_adapter_off(trainer *t, bool off) { t->adapter_off = off; }

static double urand01(uint64_t *s) { return (double)(hsplitmix64(s) >> 11) / 9007199254740992.0; }

void trainer_free(trainer *t) {
  if (!t) return;
  int L = (int)t->v.n_layers;
  for (int i = 0; t->wtd && i < L * TT_N; i++) free(t->wtd[i]);
  free(t->wtd), free(t->wt), free(t->head_td);
  for (int k = 0; k < TT_N; k++) free(t->w[k]);
  free(t->param), free(t->grad), free(t->m1), free(t->m2), free(t->off), free(t->gsave), free(t->gside);
  free(t->act), free(t->la), free(t->sets), free(t->ck_rng), free(t->seg), free(t->pos), free(t->ce), free(t->lr1), free(t->lr2);
  train_view_free(&t->v);
  if (t->m) model_free(t->m);
  if (t->tok) tokenizer_free(t->tok);
  if (t->has_tmpl) chat_template_free(&t->tmpl);
  if (t->pool) hpool_destroy(t->pool);
  free(t);
}

/* The targets against the model's projections: fused ones (phi3) are adapted whole, as PEFT does. */
static int fused_targets(trainer *t, herr *err) {
  unsigned tg = t->o.targets, qkv = 1u << TT_Q | 1u << TT_K | 1u << TT_V, gu = 1u << TT_GATE | 1u << TT_UP;
  const char *mt = model_cfg(t->m)->model_type;
  if (t->fused && tg == (1u << TT_Q | 1u << TT_V)) tg = qkv; /* the default q_proj,v_proj: PEFT's default there is qkv_proj */
  if (!t->fused) {
    if ((tg & TRAIN_TARGET_FUSED) && !(tg & TRAIN_TARGET_ALL))
      return herr_set(err, HEARTH_EINVAL, "--target: model_type '%s' has separate q_proj, k_proj, v_proj, gate_proj and "
                      "up_proj, not qkv_proj or gate_up_proj", mt);
  } else if (!(tg & TRAIN_TARGET_ALL) && (((tg & qkv) && (tg & qkv) != qkv) || ((tg & gu) && (tg & gu) != gu))) {
    return herr_set(err, HEARTH_EINVAL, "--target: model_type '%s' fuses q / k / v into qkv_proj and gate / up into "
                    "gate_up_proj: name those (or all-linear)", mt);
  }
  t->o.targets = tg & ((1u << TT_N) - 1);
  if (t->fused) t->o.targets &= ~(1u << TT_K | 1u << TT_V | 1u << TT_UP);
  return 0;
}

int trainer_new(const train_opts *o, trainer **out, herr *err) {
  *out = NULL;
  if (o->rank < 1) return herr_set(err, HEARTH_EINVAL, "--rank must be at least 1");
  if (!(o->dropout >= 0 && o->dropout < 1)) return herr_set(err, HEARTH_EINVAL, "--dropout must be in [0, 1)");
  if (!o->targets) return herr_set(err, HEARTH_EINVAL, "--target: no module to train");
  trainer *t = calloc(1, sizeof *t);
  if (!t) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  t->o = *o;
  t->rng = o->seed ^ 0x6c6f7261ull; /* "lora" */
  int rc;
  model_load_opts lo = {.threads = o->threads, .device = "cpu", .f32_activations = true};
  if ((rc = model_load(o->model_dir, &lo, &t->m, err)) || (rc = train_view_get(t->m, &t->v, err))) {
    trainer_free(t);
    return rc;
  }
  herr terr = {0};
  if (tokenizer_load(o->model_dir, &t->tok, &terr)) t->tok = NULL; /* token ids only (trainer_loss) */
  t->has_tmpl = chat_template_load(o->model_dir, &t->tmpl, &terr) == 0;
  t->pool = hpool_create(o->threads);
  int L = (int)t->v.n_layers;
  for (int k = 0; k < TT_N; k++) t->w[k] = calloc((size_t)L, sizeof(bk_weight));
  t->wt = calloc((size_t)L * TT_N, sizeof *t->wt);
  t->wtd = calloc((size_t)L * TT_N, sizeof *t->wtd);
  t->off = malloc((size_t)L * TT_N * sizeof *t->off);
  if (!t->pool || !t->wt || !t->wtd || !t->off || !t->w[TT_N - 1]) {
    trainer_free(t);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  t->fused = t->v.fused;
  if (o->checkpoint_layers < 0) {
    trainer_free(t);
    return herr_set(err, HEARTH_EINVAL, "--checkpoint-layers must be at least 1");
  }
  t->ck = o->checkpoint_layers < L ? o->checkpoint_layers : L;
  if ((rc = fused_targets(t, err))) {
    trainer_free(t);
    return rc;
  }
  for (int l = 0; l < L; l++) {
    const train_layer_view *lv = &t->v.layers[l];
    const bk_weight *ws[TT_N] = {&lv->q, &lv->k, &lv->v, &lv->o, &lv->gate, &lv->up, &lv->down};
    if (t->fused) ws[TT_Q] = &lv->qkv, ws[TT_GATE] = &lv->gate_up; /* the k, v and up slots stay empty */
    for (int k = 0; k < TT_N; k++) {
      if (t->fused && (k == TT_K || k == TT_V || k == TT_UP)) continue;
      t->w[k][l] = *ws[k];
      if ((rc = grad_weight_t(ws[k], &t->wt[l * TT_N + k], &t->wtd[l * TT_N + k], err))) {
        trainer_free(t);
        return rc;
      }
    }
  }
  if ((rc = grad_weight_t(&t->v.lm_head, &t->head_t, &t->head_td, err))) {
    trainer_free(t);
    return rc;
  }
  /* the adapter: A kaiming-uniform (a = sqrt(5): bound 1 / sqrt(in)), B zeros, as PEFT initializes them */
  int64_t r = o->rank;
  t->scale = (float)(o->rslora ? o->alpha / sqrt((double)r) : o->alpha / (double)r);
  t->P = 0;
  for (int l = 0; l < L; l++)
    for (int k = 0; k < TT_N; k++) {
      t->off[l * TT_N + k] = -1;
      if (!(t->o.targets & (1u << k))) continue;
      t->off[l * TT_N + k] = t->P;
      t->P += r * (t_in(t, l, k) + t_out(t, l, k));
    }
  t->param = calloc((size_t)t->P, sizeof(float));
  t->grad = calloc((size_t)t->P, sizeof(float));
  t->m1 = calloc((size_t)t->P, sizeof(float));
  t->m2 = calloc((size_t)t->P, sizeof(float));
  t->ce = malloc((size_t)(CE_CHUNK * t->v.vocab) * sizeof(float));
  if (!t->param || !t->grad || !t->m1 || !t->m2 || !t->ce) {
    trainer_free(t);
    return herr_set(err, HEARTH_ENOMEM, "out of memory (an adapter of %lld floats)", (long long)t->P);
  }
  uint64_t s = o->seed;
  for (int l = 0; l < L; l++)
    for (int k = 0; k < TT_N; k++) {
      int64_t at = t->off[l * TT_N + k];
      if (at < 0) continue;
      double bound = 1.0 / sqrt((double)t_in(t, l, k));
      for (int64_t i = 0; i < r * t_in(t, l, k); i++) t->param[at + i] = (float)((2 * urand01(&s) - 1) * bound);
    }
  *out = t;
  return 0;
}

/* The layout of the activations of T tokens from base (NULL: only counted; else into t->sets, t->la and the
 * scratch); returns its floats. Without checkpoints every layer has its own set; with them the ck sets hold one
 * span of layers at a time and each span's input has a buffer of its own. */
static size_t layout(trainer *t, int64_t T, float *base) {
  const train_view *v = &t->v;
  int64_t D = v->hidden, Q = v->heads * v->head_dim, KV = v->kv_heads * v->head_dim, I = v->inter, r = t->o.rank;
  int L = (int)v->n_layers;
  bool drop = t->o.dropout > 0;
  const train_layer_view *l0 = &v->layers[0];
  bool qkn = l0->q_norm || l0->k_norm, outn = l0->attn_out_norm != NULL;
  int64_t wide = D > Q ? D : Q;
  if (I > wide) wide = I;
  int64_t fw = t->fused ? (Q + 2 * KV > 2 * I ? Q + 2 * KV : 2 * I) : 0; /* a fused product's width */
  if (fw > wide) wide = fw;
  t->wide = wide;
  size_t at = 0;
  layer_acts dummy;
#define TAKE(dst, w) (dst = base ? base + at : NULL, at += (size_t)T * (size_t)(w))
  int nsets = t->ck ? (int)t->ck : L;
  for (int s = 0; s < nsets; s++) {
    layer_acts *a = base ? (t->ck ? &t->sets[s] : &t->la[s]) : &dummy;
    memset(a, 0, sizeof *a);
    if (!t->ck || s > 0) TAKE(a->x, D); /* a span's first layer reads its input from the span's own buffer */
    TAKE(a->xn1, D), TAKE(a->q, Q), TAKE(a->k, KV), TAKE(a->v, KV), TAKE(a->att, Q);
    TAKE(a->xmid, D), TAKE(a->xn2, D), TAKE(a->g, I), TAKE(a->u, I), TAKE(a->h, I);
    if (qkn) TAKE(a->qr, Q), TAKE(a->kr, KV);
    if (outn) TAKE(a->ao, D), TAKE(a->mo, D);
    for (int k = 0; k < TT_N; k++) {
      if (!(t->o.targets & (1u << k))) continue;
      TAKE(a->lt[k], r);
      if (drop) TAKE(a->lx[k], t_in(t, 0, k)), TAKE(a->lm[k], t_in(t, 0, k));
    }
  }
  for (int l = 0; t->ck && l < L; l++) {
    layer_acts *a = base ? &t->la[l] : &dummy;
    if (base) *a = t->sets[l % t->ck];
    if (l % t->ck == 0) TAKE(a->x, D);
  }
  TAKE(t->xl, D), TAKE(t->hn, D), TAKE(t->yo, D);
  TAKE(t->s1, wide), TAKE(t->s2, wide), TAKE(t->s3, wide), TAKE(t->s4, wide), TAKE(t->s5, wide), TAKE(t->s6, wide);
  TAKE(t->s7, 2 * KV);
  TAKE(t->s8, wide), TAKE(t->s9, wide), TAKE(t->lb1, r), TAKE(t->lb2, r), TAKE(t->lb3, r);
  TAKE(t->fz, fw);
#undef TAKE
  return at;
}

int64_t trainer_activation_bytes(const trainer *t, int64_t T) {
  trainer c = *t; /* layout writes its scratch pointers: a copy's */
  return (int64_t)(layout(&c, T, NULL) * sizeof(float));
}

/* Room for sequences of T tokens. */
static int reserve(trainer *t, int64_t T, herr *err) {
  if (T <= t->cap_t) return 0;
  int L = (int)t->v.n_layers;
  int64_t spans = t->ck ? (L + t->ck - 1) / t->ck : 0, r = t->o.rank;
  size_t n = layout(t, T, NULL);
  int64_t wide = t->wide;
  free(t->act), free(t->la), free(t->sets), free(t->ck_rng), free(t->seg), free(t->pos), free(t->lr1), free(t->lr2);
  t->act = malloc(n * sizeof(float));
  t->lr1 = malloc((size_t)(wide * r) * sizeof(float));
  t->lr2 = malloc((size_t)(wide * r) * sizeof(float));
  t->la = calloc((size_t)L, sizeof *t->la);
  t->sets = t->ck ? calloc((size_t)t->ck, sizeof *t->sets) : NULL;
  t->ck_rng = t->ck ? calloc((size_t)spans, sizeof *t->ck_rng) : NULL;
  t->pos = malloc((size_t)T * sizeof *t->pos);
  t->seg = malloc((size_t)(T + 1) * sizeof *t->seg);
  if (!t->act || !t->la || !t->pos || !t->seg || !t->lr1 || !t->lr2 || (t->ck && (!t->sets || !t->ck_rng))) {
    t->cap_t = 0;
    return herr_set(err, HEARTH_ENOMEM, "out of memory (activations of %lld tokens: %.1f MiB)", (long long)T,
                    (double)n * sizeof(float) / 1048576.0);
  }
  layout(t, T, t->act);
  t->cap_t = T;
  return 0;
}

/* An f32 matrix [rows, cols] as a weight bk_matmul multiplies by (its transpose). */
static bk_weight f32_weight(const float *p, int64_t rows, int64_t cols) {
  bk_weight w;
  memset(&w, 0, sizeof w);
  w.type = BK_F32, w.rows = rows, w.cols = cols, w.data = p;
  return w;
}

/* dst [cols, rows] = src [rows, cols]ᵀ */
static void transpose(float *dst, const float *src, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; i++)
    for (int64_t j = 0; j < cols; j++) dst[j * rows + i] = src[i * cols + j];
}

/* The adapter's delta through bk_matmul's f32 kernels (grad_lora_fwd's products, summed in f32):
 * tt [T, r] = x · Aᵀ, y += s · tt · Bᵀ. */
static int lora_fwd(trainer *t, float *y, float *tt, const float *x, int64_t T, int64_t in, const float *A, int64_t r,
                    const float *B, int64_t out, herr *err) {
  bk_weight aw = f32_weight(A, r, in), bw = f32_weight(B, out, r);
  int rc = bk_matmul(t->pool, tt, x, T, &aw, NULL, err);
  if (!rc) rc = bk_matmul(t->pool, t->s4, tt, T, &bw, NULL, err);
  if (rc) return rc;
  for (int64_t i = 0; i < T * out; i++) y[i] += t->scale * t->s4[i];
  return 0;
}

/* grad_lora's gradients through bk_matmul: dt = s · dy · B, dB += s · dyᵀ · tt, dA += dtᵀ · x, and
 * dx [T, in] = dt · A (written, not added). */
static int lora_bwd(trainer *t, float *dx, float *dA, float *dB, const float *dy, const float *x, const float *tt, int64_t T,
                    int64_t in, const float *A, int64_t r, const float *B, int64_t out, herr *err) {
  float s = t->scale, *dt = t->lb1;
  transpose(t->lr1, B, out, r); /* Bᵀ [r, out] */
  bk_weight w = f32_weight(t->lr1, r, out);
  int rc = bk_matmul(t->pool, dt, dy, T, &w, NULL, err);
  if (rc) return rc;
  for (int64_t i = 0; i < T * r; i++) dt[i] *= s;
  transpose(t->s8, dy, T, out); /* dyᵀ [out, T] */
  transpose(t->lb2, tt, T, r);  /* ttᵀ [r, T] */
  w = f32_weight(t->lb2, r, T);
  if ((rc = bk_matmul(t->pool, t->lr2, t->s8, out, &w, NULL, err))) return rc; /* dyᵀ · tt [out, r] */
  for (int64_t i = 0; i < out * r; i++) dB[i] += s * t->lr2[i];
  transpose(t->lb3, dt, T, r); /* dtᵀ [r, T] */
  transpose(t->s8, x, T, in);  /* xᵀ [in, T] */
  w = f32_weight(t->s8, in, T);
  if ((rc = bk_matmul(t->pool, t->lr2, t->lb3, r, &w, NULL, err))) return rc; /* dtᵀ · x [r, in] */
  for (int64_t i = 0; i < r * in; i++) dA[i] += t->lr2[i];
  transpose(t->lr1, A, r, in); /* Aᵀ [in, r] */
  w = f32_weight(t->lr1, in, r);
  return bk_matmul(t->pool, dx, dt, T, &w, NULL, err);
}

/* y = x · W_kᵀ + the adapter's delta, keeping what its backward needs. */
static int proj(trainer *t, int l, int k, float *y, const float *x, int64_t T, bool train, herr *err) {
  int rc = bk_matmul(t->pool, y, x, T, &t->w[k][l], NULL, err);
  int64_t at = t->off[l * TT_N + k];
  if (rc || at < 0 || t->adapter_off) return rc;
  int64_t in = t_in(t, l, k), out = t_out(t, l, k), r = t->o.rank;
  layer_acts *a = &t->la[l];
  const float *xin = x;
  if (train && t->o.dropout > 0) {
    float keep = (float)(1.0 / (1.0 - t->o.dropout));
    for (int64_t i = 0; i < T * in; i++) {
      a->lm[k][i] = urand01(&t->rng) < t->o.dropout ? 0.0f : keep;
      a->lx[k][i] = x[i] * a->lm[k][i];
    }
    xin = a->lx[k];
  }
  return lora_fwd(t, y, a->lt[k], xin, T, in, t->param + at, r, t->param + at + r * in, out, err);
}

/* dx (+)= dy · W_k, and the adapter's gradients (x: the projection's input in the forward). */
static int proj_back(trainer *t, int l, int k, float *dx, bool add, const float *dy, const float *x, int64_t T, bool train,
                     herr *err) {
  int64_t in = t_in(t, l, k), out = t_out(t, l, k), r = t->o.rank;
  float *tmp = add ? t->s5 : dx;
  int rc = bk_matmul(t->pool, tmp, dy, T, &t->wt[l * TT_N + k], NULL, err);
  if (rc) return rc;
  int64_t at = t->off[l * TT_N + k];
  if (at >= 0) {
    layer_acts *a = &t->la[l];
    const float *A = t->param + at, *B = A + r * in;
    float *dA = t->grad + at, *dB = dA + r * in;
    bool drop = train && t->o.dropout > 0;
    if ((rc = lora_bwd(t, t->s9, dA, dB, dy, drop ? a->lx[k] : x, a->lt[k], T, in, A, r, B, out, err))) return rc;
    if (drop)
      for (int64_t i = 0; i < T * in; i++) tmp[i] += t->s9[i] * a->lm[k][i];
    else
      for (int64_t i = 0; i < T * in; i++) tmp[i] += t->s9[i];
  }
  if (add)
    for (int64_t i = 0; i < T * in; i++) dx[i] += tmp[i];
  return 0;
}

static attn_params attn_of(const trainer *t, int l) {
  const train_view *v = &t->v;
  return (attn_params){v->heads, v->kv_heads, v->head_dim, v->attn_scale, v->attn_softcap, v->layers[l].window};
}

/* The column blocks of x [T, Σ w] into parts[i] [T, w[i]]. */
static void split_cols(const float *x, int64_t T, float *const *parts, const int64_t *w, int n) {
  int64_t all = 0;
  for (int i = 0; i < n; i++) all += w[i];
  for (int64_t r = 0; r < T; r++)
    for (int i = 0, c = 0; i < n; c += (int)w[i], i++) memcpy(parts[i] + r * w[i], x + r * all + c, (size_t)w[i] * sizeof(float));
}

/* parts[i] [T, w[i]] side by side into x [T, Σ w]. */
static void join_cols(float *x, int64_t T, const float *const *parts, const int64_t *w, int n) {
  int64_t all = 0;
  for (int i = 0; i < n; i++) all += w[i];
  for (int64_t r = 0; r < T; r++)
    for (int i = 0, c = 0; i < n; c += (int)w[i], i++) memcpy(x + r * all + c, parts[i] + r * w[i], (size_t)w[i] * sizeof(float));
}

/* y [T, n] += b (NULL: nothing) on every row. */
static void add_bias(float *y, const float *b, int64_t T, int64_t n) {
  if (!b) return;
  for (int64_t i = 0; i < T; i++)
    for (int64_t j = 0; j < n; j++) y[i * n + j] += b[j];
}

/* Layer l's forward over the T tokens in la[l].x, its activations into la[l], its output into the next layer's
 * input (t->xl after the last). Attention runs over each example of the sequence alone (t->seg). */
static int forward_layer(trainer *t, int l, int64_t T, bool train, herr *err) {
  const train_view *v = &t->v;
  int64_t D = v->hidden, H = v->heads, KVH = v->kv_heads, hd = v->head_dim, I = v->inter;
  layer_acts *a = &t->la[l];
  const train_layer_view *lv = &v->layers[l];
  float *next = l + 1 < v->n_layers ? t->la[l + 1].x : t->xl;
  int rc;
  op_rmsnorm(a->xn1, a->x, T, D, lv->attn_norm, v->eps, v->unit_offset);
  if (t->fused) { /* one qkv product, its columns split */
    if ((rc = proj(t, l, TT_Q, t->fz, a->xn1, T, train, err))) return rc;
    split_cols(t->fz, T, (float *[]){a->q, a->k, a->v}, (int64_t[]){H * hd, KVH * hd, KVH * hd}, 3);
  } else if ((rc = proj(t, l, TT_Q, a->q, a->xn1, T, train, err)) || (rc = proj(t, l, TT_K, a->k, a->xn1, T, train, err)) ||
             (rc = proj(t, l, TT_V, a->v, a->xn1, T, train, err))) {
    return rc;
  }
  add_bias(a->q, lv->q_bias, T, H * hd), add_bias(a->k, lv->k_bias, T, KVH * hd), add_bias(a->v, lv->v_bias, T, KVH * hd);
  if (lv->q_norm) { /* per head, before RoPE */
    memcpy(a->qr, a->q, (size_t)(T * H * hd) * sizeof(float));
    op_rmsnorm(a->q, a->qr, T * H, hd, lv->q_norm, v->eps, v->unit_offset);
  }
  if (lv->k_norm) {
    memcpy(a->kr, a->k, (size_t)(T * KVH * hd) * sizeof(float));
    op_rmsnorm(a->k, a->kr, T * KVH, hd, lv->k_norm, v->eps, v->unit_offset);
  }
  if (lv->rope) {
    op_rope(a->q, T, H, hd, t->pos, lv->rope);
    op_rope(a->k, T, KVH, hd, t->pos, lv->rope);
  }
  attn_params ap = attn_of(t, l);
  for (int64_t e = 0; e < t->nseg; e++) {
    int64_t b = t->seg[e], n = t->seg[e + 1] - b;
    grad_attention_fwd(t->pool, a->att + b * H * hd, a->q + b * H * hd, a->k + b * KVH * hd, a->v + b * KVH * hd, n, &ap);
  }
  if ((rc = proj(t, l, TT_O, t->yo, a->att, T, train, err))) return rc;
  add_bias(t->yo, lv->o_bias, T, D);
  if (lv->attn_out_norm) {
    memcpy(a->ao, t->yo, (size_t)(T * D) * sizeof(float));
    op_rmsnorm(t->yo, a->ao, T, D, lv->attn_out_norm, v->eps, v->unit_offset);
  }
  op_add(a->xmid, a->x, t->yo, T * D);
  op_rmsnorm(a->xn2, a->xmid, T, D, lv->mlp_norm, v->eps, v->unit_offset);
  if (t->fused) {
    if ((rc = proj(t, l, TT_GATE, t->fz, a->xn2, T, train, err))) return rc;
    split_cols(t->fz, T, (float *[]){a->g, a->u}, (int64_t[]){I, I}, 2);
  } else if ((rc = proj(t, l, TT_GATE, a->g, a->xn2, T, train, err)) || (rc = proj(t, l, TT_UP, a->u, a->xn2, T, train, err))) {
    return rc;
  }
  memcpy(a->h, a->g, (size_t)(T * I) * sizeof(float));
  if (v->act == BK_ACT_GELU_TANH) op_gelu_tanh(a->h, T * I);
  else op_silu(a->h, T * I);
  op_mul(a->h, a->h, a->u, T * I);
  if ((rc = proj(t, l, TT_DOWN, t->yo, a->h, T, train, err))) return rc;
  if (lv->mlp_out_norm) {
    memcpy(a->mo, t->yo, (size_t)(T * D) * sizeof(float));
    op_rmsnorm(t->yo, a->mo, T, D, lv->mlp_out_norm, v->eps, v->unit_offset);
  }
  op_add(next, a->xmid, t->yo, T * D);
  return 0;
}

/* The forward of ids at positions pos (NULL: 0..T−1; else a packed sequence's, restarting at 0 for each
 * example): the embedding, every layer, the final norm into t->hn. */
static int forward(trainer *t, const int32_t *ids, const int32_t *pos, int64_t T, bool train, herr *err) {
  const train_view *v = &t->v;
  int64_t D = v->hidden;
  int rc = reserve(t, T, err);
  if (rc) return rc;
  t->nseg = 0;
  for (int64_t i = 0; i < T; i++) {
    int64_t p = pos ? pos[i] : i;
    if (p != 0 && (i == 0 || p != t->pos[i - 1] + 1))
      return herr_set(err, HEARTH_EINVAL, "position %lld of a packed sequence is %lld: positions start at 0 and count up by "
                      "one within each example", (long long)i, (long long)p);
    if (p == 0) t->seg[t->nseg++] = i;
    t->pos[i] = p;
  }
  t->seg[t->nseg] = T;
  for (int64_t i = 0; i < T; i++) {
    if (ids[i] < 0 || ids[i] >= v->embed.rows)
      return herr_set(err, HEARTH_EINVAL, "token %d is outside the vocabulary (%lld)", ids[i], (long long)v->embed.rows);
    if ((rc = bk_dequant_row(&v->embed, ids[i], t->la[0].x + i * D, err))) return rc;
    if (v->embed_scale != 0)
      for (int64_t j = 0; j < D; j++) t->la[0].x[i * D + j] *= v->embed_scale;
  }
  for (int l = 0; l < v->n_layers; l++) {
    if (t->ck && l % t->ck == 0) t->ck_rng[l / t->ck] = t->rng; /* the span's dropout masks, drawn again in the backward */
    if ((rc = forward_layer(t, l, T, train, err))) return rc;
  }
  op_rmsnorm(t->hn, t->xl, T, D, v->final_norm, v->eps, v->unit_offset);
  return 0;
}

/* With checkpoints, before the backward of layer l: when l ends a span other than the last (whose activations
 * the forward left in place), the span's layers run forward again from its kept input, with the same dropout
 * masks (the generator as it was at the span's start, then put back), into the same numbers. */
static int recompute_span(trainer *t, int l, int64_t T, herr *err) {
  int L = (int)t->v.n_layers;
  if (!t->ck || l == L - 1 || l % t->ck != t->ck - 1) return 0;
  int c = l - (int)(l % t->ck), rc = 0;
  uint64_t keep = t->rng;
  t->rng = t->ck_rng[c / t->ck];
  for (int j = c; j <= l && !rc; j++) rc = forward_layer(t, j, T, true, err);
  t->rng = keep;
  return rc;
}

int trainer_logits(trainer *t, const int32_t *ids, int64_t n, float *logits, herr *err) {
  int rc = forward(t, ids, NULL, n, false, err);
  if (!rc) rc = bk_matmul(t->pool, logits, t->hn, n, &t->v.lm_head, NULL, err);
  float c = t->v.final_softcap;
  if (!rc && c > 0)
    for (int64_t i = 0; i < n * t->v.vocab; i++) logits[i] = c * tanhf(logits[i] / c);
  return rc;
}

int trainer_loss(trainer *t, const train_example *ex, bool grads, float dscale, double *loss_sum, int64_t *count,
                 herr *err) {
  const train_view *v = &t->v;
  int64_t T = ex->n, D = v->hidden, H = v->heads, KVH = v->kv_heads, hd = v->head_dim, I = v->inter;
  int rc = forward(t, ex->ids, ex->pos, T, grads, err);
  if (rc) return rc;
  int32_t *tg = malloc((size_t)T * sizeof *tg);
  if (!tg) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (int64_t i = 0; i < T; i++) tg[i] = i + 1 < T && ex->loss[i + 1] && t->pos[i + 1] != 0 ? ex->ids[i + 1] : -1;
  float *dx = t->s1, *dn = t->s2; /* the residual stream's gradient; a norm's input gradient */
  rc = grad_cross_entropy_capped(t->pool, loss_sum, count, grads ? dn : NULL, t->hn, T, D, &v->lm_head, &t->head_t, tg,
                                 dscale, v->final_softcap, CE_CHUNK, t->ce, err);
  free(tg);
  if (rc || !grads) return rc;
  grad_rmsnorm(dx, NULL, dn, t->xl, T, D, v->final_norm, v->eps, v->unit_offset);
  for (int l = (int)v->n_layers - 1; l >= 0; l--) {
    if ((rc = recompute_span(t, l, T, err))) return rc;
    layer_acts *a = &t->la[l];
    const train_layer_view *lv = &v->layers[l];
    float *dg = t->s2, *du = t->s3, *dn2 = t->s6;
    /* feed-forward: x_out = xmid + [norm](down(act(gate) · up)); dx holds d x_out */
    const float *dmo = dx;
    if (lv->mlp_out_norm) {
      grad_rmsnorm(t->s4, NULL, dx, a->mo, T, D, lv->mlp_out_norm, v->eps, v->unit_offset);
      dmo = t->s4;
    }
    if ((rc = proj_back(t, l, TT_DOWN, t->s3, false, dmo, a->h, T, true, err))) return rc;
    if (v->act == BK_ACT_GELU_TANH) grad_gelu_tanh_mul(dg, du, t->s3, a->g, a->u, T * I);
    else grad_silu_mul(dg, du, t->s3, a->g, a->u, T * I); /* du overwrites dh element by element, after reading it */
    if (t->fused) {
      join_cols(t->fz, T, (const float *[]){dg, du}, (int64_t[]){I, I}, 2);
      if ((rc = proj_back(t, l, TT_GATE, dn2, false, t->fz, a->xn2, T, true, err))) return rc;
    } else if ((rc = proj_back(t, l, TT_GATE, dn2, false, dg, a->xn2, T, true, err)) ||
               (rc = proj_back(t, l, TT_UP, dn2, true, du, a->xn2, T, true, err))) {
      return rc;
    }
    grad_rmsnorm(dn2, NULL, dn2, a->xmid, T, D, lv->mlp_norm, v->eps, v->unit_offset);
    for (int64_t i = 0; i < T * D; i++) dx[i] += dn2[i]; /* dx is now d xmid */
    /* attention: xmid = x + [norm](o(attention(rope([norm] q), rope([norm] k), v))) */
    float *datt = t->s2, *dq = t->s3, *dk = t->s7, *dvv = t->s7 + T * KVH * hd;
    const float *dao = dx;
    if (lv->attn_out_norm) {
      grad_rmsnorm(t->s4, NULL, dx, a->ao, T, D, lv->attn_out_norm, v->eps, v->unit_offset);
      dao = t->s4;
    }
    if ((rc = proj_back(t, l, TT_O, datt, false, dao, a->att, T, true, err))) return rc;
    attn_params ap = attn_of(t, l);
    for (int64_t e = 0; e < t->nseg; e++) { /* each example's attention alone */
      int64_t b = t->seg[e], n = t->seg[e + 1] - b, qo = b * H * hd, ko = b * KVH * hd;
      grad_attention(t->pool, dq + qo, dk + ko, dvv + ko, datt + qo, a->q + qo, a->k + ko, a->v + ko, n, &ap);
    }
    if (lv->rope) {
      grad_rope(dq, T, H, hd, t->pos, lv->rope);
      grad_rope(dk, T, KVH, hd, t->pos, lv->rope);
    }
    if (lv->q_norm) grad_rmsnorm(dq, NULL, dq, a->qr, T * H, hd, lv->q_norm, v->eps, v->unit_offset);
    if (lv->k_norm) grad_rmsnorm(dk, NULL, dk, a->kr, T * KVH, hd, lv->k_norm, v->eps, v->unit_offset);
    if (t->fused) {
      join_cols(t->fz, T, (const float *[]){dq, dk, dvv}, (int64_t[]){H * hd, KVH * hd, KVH * hd}, 3);
      if ((rc = proj_back(t, l, TT_Q, dn2, false, t->fz, a->xn1, T, true, err))) return rc;
    } else if ((rc = proj_back(t, l, TT_Q, dn2, false, dq, a->xn1, T, true, err)) ||
               (rc = proj_back(t, l, TT_K, dn2, true, dk, a->xn1, T, true, err)) ||
               (rc = proj_back(t, l, TT_V, dn2, true, dvv, a->xn1, T, true, err))) {
      return rc;
    }
    grad_rmsnorm(dn2, NULL, dn2, a->x, T, D, lv->attn_norm, v->eps, v->unit_offset);
    for (int64_t i = 0; i < T * D; i++) dx[i] += dn2[i]; /* d x of this layer: the next one down's output */
  }
  return 0;
}

int trainer_pref_loss(trainer *t, train_method m, double beta, const train_pair *p, double pair_w, double nll_w, bool grads,
                      double *loss, pref_stats *st, herr *err) {
  if (m != TRAIN_DPO && m != TRAIN_ORPO) return herr_set(err, HEARTH_EINVAL, "a pair's loss is DPO's or ORPO's");
  size_t bytes = (size_t)t->P * sizeof(float);
  if (grads && !t->gsave) {
    t->gsave = malloc(bytes), t->gside = malloc(bytes);
    if (!t->gsave || !t->gside) return herr_set(err, HEARTH_ENOMEM, "out of memory (the gradients of a pair)");
  }
  /* each side's summed NLL s and its gradient ∇s alone; then the pair's share of the loss is a function of the
   * two sums, and its gradient their gradients weighted by its derivatives */
  double sc = 0, sr = 0;
  int64_t nc = 0, nr = 0;
  if (grads) memcpy(t->gsave, t->grad, bytes), memset(t->grad, 0, bytes);
  int rc = trainer_loss(t, &p->chosen, grads, 1.0f, &sc, &nc, err);
  if (!rc && grads) memcpy(t->gside, t->grad, bytes), memset(t->grad, 0, bytes);
  if (!rc) rc = trainer_loss(t, &p->rejected, grads, 1.0f, &sr, &nr, err);
  if (rc) {
    if (grads) memcpy(t->grad, t->gsave, bytes);
    return rc;
  }
  double wc, wr; /* d share / d sc, d share / d sr */
  if ((m == TRAIN_DPO && (isnan(p->ref_chosen) || isnan(p->ref_rejected))) || (m != TRAIN_DPO && (!nc || !nr))) {
    if (grads) memcpy(t->grad, t->gsave, bytes);
    return herr_set(err, HEARTH_EINVAL, m == TRAIN_DPO ? "DPO: the pair's reference log-probs were not computed"
                                                       : "ORPO: a side of the pair has no learned token");
  }
  if (m == TRAIN_DPO) {
    double dpc, dpr, l = pref_dpo_loss(beta, -sc, -sr, p->ref_chosen, p->ref_rejected, &dpc, &dpr);
    *loss += pair_w * l;
    wc = -pair_w * dpc, wr = -pair_w * dpr; /* pc = −sc */
    if (st) {
      double rwc = beta * (-sc - p->ref_chosen), rwr = beta * (-sr - p->ref_rejected);
      st->margin += rwc - rwr, st->correct += rwc > rwr;
    }
  } else {
    double dac, dar, lo, l = pref_orpo_loss(beta, -sc / (double)nc, -sr / (double)nr, &dac, &dar, &lo);
    *loss += nll_w * sc + pair_w * l;
    wc = nll_w - pair_w * dac / (double)nc, wr = -pair_w * dar / (double)nr; /* ac = −sc / nc */
    if (st) st->log_odds += lo, st->nll += sc;
  }
  if (st) st->pairs++;
  if (grads)
    for (int64_t i = 0; i < t->P; i++) t->grad[i] = (float)(t->gsave[i] + wc * t->gside[i] + wr * t->grad[i]);
  return 0;
}

void trainer_step(trainer *t, double lr, double *gnorm) {
  double ss = 0;
  for (int64_t i = 0; i < t->P; i++) ss += (double)t->grad[i] * t->grad[i];
  double norm = sqrt(ss), clip = 1.0;
  if (t->o.max_grad_norm > 0) {
    double c = t->o.max_grad_norm / (norm + 1e-6);
    if (c < 1) clip = c;
  }
  *gnorm = norm;
  /* AdamW as torch.optim.AdamW: decoupled decay, then the bias-corrected step */
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  t->adam_t++;
  double bc1 = 1 - pow(b1, (double)t->adam_t), bc2 = 1 - pow(b2, (double)t->adam_t);
  for (int64_t i = 0; i < t->P; i++) {
    double g = t->grad[i] * clip, p = t->param[i];
    p *= 1 - lr * t->o.weight_decay;
    double m = b1 * t->m1[i] + (1 - b1) * g, v = b2 * t->m2[i] + (1 - b2) * g * g;
    t->m1[i] = (float)m, t->m2[i] = (float)v;
    p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps);
    t->param[i] = (float)p;
    t->grad[i] = 0;
  }
}

/* ---- the adapter's files ---- */

static const char *slot_name(const trainer *t, int k) { return t->fused ? fused_names[k] : target_names[k]; }

static void module_name(const trainer *t, char *out, size_t n, int l, int k, char ab) {
  snprintf(out, n, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", l, k <= TT_O ? "self_attn" : "mlp", slot_name(t, k), ab);
}

int trainer_load_adapter(trainer *t, const char *dir, herr *err) {
  char path[4096];
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  st_set st;
  memset(&st, 0, sizeof st);
  int rc = st_open(&st, path, err);
  if (rc) return rc;
  int64_t r = t->o.rank;
  for (int l = 0; !rc && l < t->v.n_layers; l++)
    for (int k = 0; !rc && k < TT_N; k++) {
      int64_t at = t->off[l * TT_N + k];
      if (at < 0) continue;
      for (int ab = 0; !rc && ab < 2; ab++) {
        char name[160];
        module_name(t, name, sizeof name, l, k, ab ? 'B' : 'A');
        int64_t rows = ab ? t_out(t, l, k) : r, cols = ab ? r : t_in(t, l, k);
        float *dst = t->param + at + (ab ? r * t_in(t, l, k) : 0);
        const st_tensor *x = st_find(&st, name);
        if (!x) {
          rc = herr_set(err, HEARTH_ENOTFOUND, "%s: no tensor '%s'", path, name);
        } else if (x->ndim != 2 || x->shape[0] != rows || x->shape[1] != cols || (x->dtype != ST_F32 && x->dtype != ST_F64)) {
          rc = herr_set(err, HEARTH_EINVAL, "%s: '%s' is not F32 or F64 [%lld, %lld]", path, name, (long long)rows, (long long)cols);
        } else {
          for (int64_t i = 0; i < rows * cols; i++) {
            if (x->dtype == ST_F32) memcpy(&dst[i], (const char *)x->data + 4 * i, 4);
            else {
              double d;
              memcpy(&d, (const char *)x->data + 8 * i, 8);
              dst[i] = (float)d;
            }
          }
        }
      }
    }
  st_close(&st);
  return rc;
}

static int fill_tensor(void *ctx, int i, void *dst, herr *err) {
  (void)ctx, (void)i, (void)dst, (void)err;
  return 0; /* every tensor is given with its data */
}

int trainer_save(const trainer *t, const char *dir, herr *err) {
  if (mkdir(dir, 0755) && errno != EEXIST) return herr_set(err, HEARTH_EIO, "%s: cannot create the folder: %s", dir, strerror(errno));
  st_writer *w = st_writer_new();
  if (!w) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  int64_t r = t->o.rank;
  for (int l = 0; l < t->v.n_layers; l++)
    for (int k = 0; k < TT_N; k++) {
      int64_t at = t->off[l * TT_N + k];
      if (at < 0) continue;
      char name[160];
      int64_t in = t_in(t, l, k), out = t_out(t, l, k);
      module_name(t, name, sizeof name, l, k, 'A');
      st_writer_tensor(w, name, ST_F32, 2, (int64_t[]){r, in}, t->param + at);
      module_name(t, name, sizeof name, l, k, 'B');
      st_writer_tensor(w, name, ST_F32, 2, (int64_t[]){out, r}, t->param + at + r * in);
    }
  st_writer_meta(w, "format", "pt");
  char path[4096];
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  int rc = st_writer_write(w, path, fill_tensor, NULL, err);
  st_writer_free(w);
  if (rc) return rc;
  json_t *c = json_object(), *tm = json_array();
  for (int k = 0; k < TT_N; k++)
    if (t->o.targets & (1u << k)) json_array_append_new(tm, json_string(slot_name(t, k)));
  json_object_set_new(c, "alpha_pattern", json_object());
  json_object_set_new(c, "base_model_name_or_path", json_string(t->o.model_dir));
  json_object_set_new(c, "bias", json_string("none"));
  json_object_set_new(c, "exclude_modules", json_null());
  json_object_set_new(c, "fan_in_fan_out", json_false());
  json_object_set_new(c, "inference_mode", json_true());
  json_object_set_new(c, "init_lora_weights", json_true());
  json_object_set_new(c, "layers_pattern", json_null());
  json_object_set_new(c, "layers_to_transform", json_null());
  json_object_set_new(c, "lora_alpha", json_real(t->o.alpha));
  json_object_set_new(c, "lora_bias", json_false());
  json_object_set_new(c, "lora_dropout", json_real(t->o.dropout));
  json_object_set_new(c, "modules_to_save", json_null());
  json_object_set_new(c, "peft_type", json_string("LORA"));
  json_object_set_new(c, "r", json_integer(r));
  json_object_set_new(c, "rank_pattern", json_object());
  json_object_set_new(c, "revision", json_null());
  json_object_set_new(c, "target_modules", tm);
  json_object_set_new(c, "task_type", json_string("CAUSAL_LM"));
  json_object_set_new(c, "use_dora", json_false());
  json_object_set_new(c, "use_rslora", json_boolean(t->o.rslora));
  snprintf(path, sizeof path, "%s/adapter_config.json", dir);
  rc = json_dump_file(c, path, JSON_INDENT(2) | JSON_SORT_KEYS) ? herr_set(err, HEARTH_EIO, "%s: cannot write", path) : 0;
  json_decref(c);
  return rc;
}

/* ---- the optimizer's state ---- */

int trainer_save_optimizer(const trainer *t, const char *dir, herr *err) {
  if (mkdir(dir, 0755) && errno != EEXIST) return herr_set(err, HEARTH_EIO, "%s: cannot create the folder: %s", dir, strerror(errno));
  st_writer *w = st_writer_new();
  if (!w) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  st_writer_tensor(w, "exp_avg", ST_F32, 1, (int64_t[]){t->P}, t->m1);
  st_writer_tensor(w, "exp_avg_sq", ST_F32, 1, (int64_t[]){t->P}, t->m2);
  char v[64];
  snprintf(v, sizeof v, "%lld", (long long)t->adam_t);
  st_writer_meta(w, "step", v);
  snprintf(v, sizeof v, "%016llx", (unsigned long long)t->rng);
  st_writer_meta(w, "dropout_rng", v);
  st_writer_meta(w, "format", "hearth-adamw");
  char path[4096];
  snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
  int rc = st_writer_write(w, path, fill_tensor, NULL, err);
  st_writer_free(w);
  return rc;
}

int trainer_load_optimizer(trainer *t, const char *dir, herr *err) {
  char path[4096];
  snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
  st_set st;
  memset(&st, 0, sizeof st);
  int rc = st_open(&st, path, err);
  if (rc) return rc;
  const char *names[2] = {"exp_avg", "exp_avg_sq"};
  float *dst[2] = {t->m1, t->m2};
  for (int i = 0; !rc && i < 2; i++) {
    const st_tensor *x = st_find(&st, names[i]);
    if (!x || x->dtype != ST_F32 || x->ndim != 1 || x->shape[0] != t->P)
      rc = herr_set(err, HEARTH_EINVAL, "%s: '%s' is not F32 [%lld] (another rank or set of targets?)", path, names[i],
                    (long long)t->P);
    else
      memcpy(dst[i], x->data, (size_t)t->P * sizeof(float));
  }
  const char *step = json_string_value(json_object_get(st.metadata, "step"));
  const char *rng = json_string_value(json_object_get(st.metadata, "dropout_rng"));
  char *e1 = NULL, *e2 = NULL;
  long long k = step ? strtoll(step, &e1, 10) : -1;
  unsigned long long r = rng ? strtoull(rng, &e2, 16) : 0;
  if (!rc && (!step || !rng || *e1 || *e2 || k < 0))
    rc = herr_set(err, HEARTH_EFORMAT, "%s: no \"step\" and \"dropout_rng\" in its metadata", path);
  if (!rc) t->adam_t = k, t->rng = r;
  st_close(&st);
  return rc;
}
