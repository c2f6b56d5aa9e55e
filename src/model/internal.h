/* internal.h — what the files of src/model share and nothing outside
 * uses: the loaded model (struct model), one layer's weights, the step a
 * forward pass works on, where weights come from and how they are
 * described (load.c), the shared layers every family builds its forward
 * from (layers.c: attention, dense MLP, mixture of experts), and the
 * per-family hooks (family_ops) that decoder.c calls. No family's own
 * declarations: what one family file shares with a sibling is in its own
 * header (gemma4.h, qwen3_5.h). */
#ifndef HEARTH_MODEL_INTERNAL_H
#define HEARTH_MODEL_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/comm.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/family.h"
#include "model/model.h"

/* The projections a LoRA adapter may add its delta to (lora.c). */
typedef enum lora_target { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_N_TARGETS } lora_target;

/* One decoder layer's weights: what the shared layers of layers.c read.
 * Matrices are described at load and handed to the backend (bk_weight_load)
 * with the rest; vectors are f32 [1, n] tensors of the backend (.buf NULL =
 * absent). Not every family uses every field; what only one family's
 * layers read lives in that family's state (fam_state). */
typedef struct layer_weights {
  /* attention */
  bk_weight q, k, v, o;                   /* k, v: .rows 0 on a KV-shared layer; v also with keys as values */
  bk_tensor attn_norm, q_bias, k_bias, v_bias, o_bias, q_norm, k_norm;
  bk_tensor post_attn_norm, pre_ffn_norm, post_ffn_norm;
  const rope_table *rope;                 /* NULL = this layer uses no RoPE */
  int64_t window;                         /* 0 = full attention */
  int64_t head_dim, kv_heads;             /* this layer's (gemma4's per_layer_config) */
  int64_t heads;                          /* query heads it computes: all, or a tensor-parallel rank's */
  float attn_scale;
  int kv_src;                             /* the layer whose KV rows this one reads (itself unless shared) */
  bool out_gate;                          /* q holds each head's query then its output gate: the attention
                                             output is times sigmoid(gate) before o (qwen3_5) */
  /* linear attention (Gated DeltaNet, qwen3_5): a recurrent layer instead of attention */
  bool linear;
  bk_weight in_qkv, in_z, in_a, in_b, out_proj; /* [2 nk dk + nv dv, hidden], [nv dv, hidden], [nv, hidden] x2, [hidden, nv dv] */
  bk_tensor conv_w, a_log, dt_bias, lin_norm;   /* [conv channels, kernel], [nv], [nv], [dv] */
  int64_t state_dim;                      /* floats of its per-sequence state: the conv's last inputs, then the heads' states */
  int64_t lin_k_heads, lin_v_heads;       /* the key and value heads it computes: all, or a tensor-parallel rank's */
  int64_t lin_k_dim, lin_v_dim, conv_kernel; /* a key and a value head's size; the conv's taps */
  bk_weight shared_gate;                  /* [1, hidden]: the shared expert's sigmoid gate (qwen3_5_moe) */
  int64_t kv_k_dim, kv_v_dim;             /* cache row widths a family sets (0: kv_heads × head_dim) */
  /* on a device: q / k / v (gate / up) stacked into one matrix whose row ranges q, k, v (gate, up)
   * then are, so a one-row step multiplies them in one pass (decoder.c, stack_projections) */
  bk_weight qkv, gate_up;
  /* dense MLP */
  bk_weight gate, up, down;
  bk_tensor gate_bias, up_bias, down_bias;
  int64_t inter;                          /* its intermediate size */
  /* mixture of experts */
  bool moe;
  bk_weight router;                       /* [n_experts, hidden] */
  bk_weight *experts;                     /* owned: gate[n], up[n], down[n] */
  bk_experts ex;                          /* views of experts */
  bk_tensor expert_scale;                 /* a scale per expert on its routing weight (.buf NULL: none) */
  float scalar;                           /* layer_scalar (1: none) */
  bool bidir_media;                       /* media soft tokens see their whole span (model_seq.bidir_last) */
  /* a tensor-parallel rank's part of each LoRA target: rows [row0, +its rows) and columns [col0, +its
   * columns) of the stored [rows, cols] matrix (tp.c; rows 0: the matrix is whole) */
  struct {
    int64_t row0, col0, rows, cols;
  } part[LORA_N_TARGETS];
} layer_weights;

/* Steps of at most this many tokens are recorded and replayed (bk_graph_begin). */
#define FORWARD_GRAPH_MAX_T 8

/* Activations of one forward, allocated once and grown to the largest batch seen. */
typedef struct fwd_scratch {
  int64_t cap_t;          /* tokens the activation tensors hold */
  bk_buf *act;            /* owned: every activation tensor below */
  bk_tensor x, xn, q, k, v, att, o, gate, up, x2, elog, eids, ew;
  bk_tensor fam;          /* [cap_t, model.w_fam]: a family's own activations */
  bk_buf *one_buf;        /* owned */
  bk_tensor one;          /* [1, model.w_stack]: a one-row step's output of a stacked projection */
  int64_t cap_idx;        /* int32 entries of idx */
  bk_buf *idx_buf;        /* owned */
  bk_tensor idx;          /* I32: the step's index tables (see forward) */
  int32_t *host_idx;      /* owned: their host staging, cap_idx entries */
  int32_t *host_keep;     /* owned: the step's per-token state rows to keep (step.keep), cap_keep entries */
  size_t cap_keep;
  int64_t cap_r;          /* logits rows */
  bk_buf *logit_buf;      /* owned */
  bk_tensor logits;
  int64_t cap_media;      /* media rows (model_seq.embeds) media holds */
  bk_buf *media_buf;      /* owned */
  bk_tensor media;        /* [cap_media, hidden]: the step's media rows, spliced over the embeddings */
  float *host_media;      /* owned: their host staging */
  bk_tensor nh;           /* the last forward's next_hidden rows (views of x2) */
} fwd_scratch;

/* One projection's adapter weights: a [r, in], b [out, r] (a row view when
 * the file's projection was fused, qkv_proj); a.buf NULL: none. */
typedef struct lora_mod {
  bk_tensor a, b;
  float scale;
} lora_mod;

/* A run of the step's rows [t0, t0 + rows) whose sequences use the same adapters. */
typedef struct lora_run {
  int64_t t0, rows;
  const model_lora *a[MODEL_MAX_LORA]; /* borrowed */
  int n;
} lora_run;

/* The step's views: activations of T tokens and the index tables. Widths
 * are the model's largest; a layer takes the prefix it needs (step_view). */
typedef struct step {
  int64_t T, R;
  bk_tensor x, xn, q, k, v, att, o, gate, up, x2, elog, eids, ew;
  bk_tensor fam;          /* T * model.w_fam floats for the family to carve up */
  bk_tensor one;          /* T == 1 on a model with stacked projections: their output row (.buf NULL: none) */
  bk_tensor ids, pos, row, tab, slot, gather, tables;
  bk_tensor rseqs;        /* I32 [S, 4]: per sequence t0, n, state row, fresh (the recurrent ops' rec_seq) */
  const int32_t *keep;    /* host [T], NULL: none: the state rows that get the state after each token (kv_seq.keep) */
  const lora_run *lora;   /* borrowed: the runs of rows that use adapters (none: the base model alone) */
  int n_lora;
  int tp_rank;            /* the rank of a split model that runs the step: whose part of each adapter it adds */
  bool has_last;          /* last holds bidirectional spans (model_seq.bidir_last) */
  bk_tensor last;         /* I32 [T]: the last row each token sees on a layer with bidir_media (bk_attn_index.last) */
  /* a canvas pass (model_seq.canvas): each sequence's new tokens attend to one another and to every
   * earlier row; sliding layers see window_extra more rows back (the canvas beyond the window) */
  bool canvas;
  int64_t window_extra;
  bk_tensor sc;           /* [T, vocab]: self-conditioning probabilities of a canvas pass (.buf NULL: none) */
  /* residual adds fused with the norm after them (bk_add_rmsnorm): the norm that follows the attention's
   * add (set by a family's layer before layer_attention, which clears it; NULL: a plain add), and the
   * layer whose input norm of x is already in xn (-1: none; forward_layers resets it) */
  const bk_tensor *norm_after_attn;
  int xn_ready;
} step;

/* The first rows * cols elements of t seen as [rows, cols]. */
static inline bk_tensor step_view(const bk_tensor *t, int64_t rows, int64_t cols) {
  bk_tensor v = *t;
  v.rows = rows;
  v.cols = cols;
  return v;
}

typedef struct family_ops family_ops;

/* A family's multi-token-prediction layer (model_seq.mtp_hidden) as decoder.c checks and ends it; the
 * family keeps it in its state and its load_model fills it. */
typedef struct model_mtp {
  int n_nextn;                /* multi-token-prediction layers loaded beside the decoder */
  const layer_weights *layer; /* borrowed: the one a forward can run (the cache's geometry); NULL: none runnable */
  bk_tensor norm;             /* its head's norm (.buf NULL: the final norm) */
  const bk_weight *head;      /* borrowed: its head, or &model.lm_head */
  const char *refused;        /* static, may be NULL: why a loaded layer cannot run */
} model_mtp;

/* A matrix the model handed (or will hand) to the backend. */
typedef struct model_mat {
  bk_weight *w;  /* borrowed: a field of the model */
  unsigned use;  /* BK_USE_* */
} model_mat;

#define MODEL_MAX_ROPES 8

/* A use flag of model_keep beside BK_USE_*: an expert, which an expert
 * budget loads on use instead of at load (experts.c). */
#define MODEL_USE_EXPERT 0x100
#define MODEL_USE_STACK 0x200 /* layer_weights.qkv / gate_up: assembled from its parts' host bytes at load */

/* Expert residency under a byte budget (experts.c): an LRU list over every
 * (layer, expert); a resident expert's matrices are loaded in the backend. */
typedef struct expert_cache {
  int64_t budget;          /* 0: no budget, every expert loaded at load */
  int64_t total, resident, page_ins, evictions;
  int n_experts;
  struct expert_slot *slots; /* owned: [layers * n_experts] */
  bk_weight *host;         /* owned: [layers * n_experts * 3] the matrices as described from the file */
  int32_t head, tail;      /* LRU list: head least recently used; -1 empty */
  int32_t *ids;            /* owned: the step's routed ids on the host */
  int64_t cap_ids;
  herr err;                /* the first failure to load an expert in this forward (code 0: none) */
} expert_cache;

struct model {
  model_config cfg;
  const model_family *fam;
  bk_backend *be;         /* owned unless be_borrowed: where weights, activations and the forward live */
  bool be_borrowed;       /* be is model_load_opts.backend: not closed with the model */
  float **owned;          /* owned: host copies of misaligned or converted matrices */
  int n_owned, cap_owned;
  bk_buf **bufs;          /* owned: the backend buffers of every f32 vector */
  int n_bufs, cap_bufs;
  model_mat *mats;        /* owned array: every matrix but embed and lm_head */
  int n_mats, cap_mats;
  st_set st;              /* owned when st_opened: the safetensors mapping the matrices point into */
  bool st_opened;
  gguf_file *gg;          /* owned, or NULL: the GGUF mapping the matrices point into */
  bk_weight embed, lm_head; /* lm_head shares embed's loaded weight when tied */
  bool tied;
  bool no_head;           /* a bare decoder's folder (no lm_head.weight, not tied): hidden states only */
  bk_tensor final_norm;
  layer_weights *layers;  /* owned, num_hidden_layers */
  rope_table ropes[MODEL_MAX_ROPES]; /* per (layer type, head size) */
  int rope_key[MODEL_MAX_ROPES][2];
  int n_ropes;
  bool rope_interleaved;
  int pos_axes;           /* positions per token in the step's pos table: 3 with multimodal RoPE (qwen3_5), else 1 */
  struct mm_tower *towers[3]; /* borrowed from tower_list: the media towers by media_kind (mm.h); NULL: none */
  struct mm_tower *tower_list[3]; /* owned: n_towers towers */
  int n_towers;
  float embed_scale;      /* 0 = none */
  float residual_scale;   /* 0 = none: the attention's (layers.c) and the llama layer's MLP output times it
                             before its residual add (granite's residual_multiplier) */
  float logit_scale;      /* 0 = none: the logits times it, before any softcap (granite: 1 / logits_scaling) */
  bool as_bf16;           /* f32 weights rounded to bf16 as loaded (model_load_opts.f32_as_bf16) */
  /* widest activations over the layers */
  int64_t w_q, w_kv, w_inter;
  int64_t w_fam;          /* floats per token of the family's own activations (step.fam) */
  int64_t w_stack;        /* the widest stacked projection (layer_weights.qkv / gate_up), 0: none */
  void *fam_state;        /* owned by the family: its config, own weights and tables (family_ops.config, .free) */
  expert_cache xc;
  fwd_scratch f;
  pthread_mutex_t lock;   /* held by a forward, and by LoRA adapters while they take or give back backend memory */
  lora_run *lora_runs;    /* owned: the step's runs of rows with adapters */
  int cap_lora_runs;
  int64_t window_extra;   /* rows the cache keeps beyond a sliding layer's window (a canvas beyond it) */
  /* tensor parallelism (tp.c): this rank's place in its group (tp_size 0: not spread) */
  int tp_rank, tp_size;
  bk_comm *comm;          /* owned: this rank's communicator */
  int64_t vocab_lo, vocab_n, vocab_pad; /* its vocabulary rows [vocab_lo, +vocab_n), each rank's padded to vocab_pad */
  struct tp_group *tp;    /* owned by rank 0: the group (the other ranks, their threads) */
  bk_buf *tp_buf;         /* owned: the head's local and gathered logits */
  int64_t tp_cap_r;
};

/* ---- where weights come from (load.c) ---- */

typedef struct weight_src {
  const st_set *st;      /* borrowed, or NULL */
  const gguf_file *gg;   /* borrowed, or NULL */
  const char *what;      /* the folder or file, for messages */
  const char *prefix;    /* what "model." is called in the file ("model.language_model." in multimodal checkpoints) */
} weight_src;

/* Describes matrix `name` (Hugging Face name, shape [rows, cols]) as stored,
 * without copying it. out->data stays NULL when absent and !required. */
int model_describe_matrix(model *m, const weight_src *src, const char *name, int64_t rows, int64_t cols, bool required,
                          bk_weight *out, herr *err);
/* The same, and kept: handed to the backend for `use` with the others (model_keep). */
int model_matrix(model *m, const weight_src *src, const char *name, int64_t rows, int64_t cols, bool required, unsigned use,
                 bk_weight *out, herr *err);
/* A stack of n matrices stored as one 3-D tensor [n, rows, cols], described
 * as n matrices out[0..n) (not kept). false in *found when absent. */
int model_describe_stack(model *m, const weight_src *src, const char *name, int64_t n, int64_t rows, int64_t cols,
                         bk_weight *out, bool *found, herr *err);
/* Keeps w: the model hands it to the backend for `use` and releases it. */
int model_keep(model *m, bk_weight *w, unsigned use, herr *err);
/* Rows [r0, r0 + n) of w as a matrix of its own. */
bk_weight model_sub_rows(const bk_weight *w, int64_t r0, int64_t n);
/* Loads vector / tensor `name` as an f32 [1, numel] tensor of the backend,
 * times mul, after checking its shape (ndim 1: [d0]; 2: [d0, d1]; 3: [d0, 1, d1]); out->buf
 * NULL when absent and !required. */
int model_vector(model *m, const weight_src *src, const char *name, int ndim, int64_t d0, int64_t d1, bool required, float mul,
                 bk_tensor *out, herr *err);
/* n floats of tensor `name` on the host (its shape must hold n elements). */
int model_host_floats(model *m, const weight_src *src, const char *name, int64_t n, float *out, herr *err);
/* The n experts of layer lw (intermediate size inter) under `base`
 * ("model.layers.3.mlp.experts"): one tensor per expert and matrix
 * (base.E.gate_proj.weight, ...), or stacked 3-D (base.gate_up_proj
 * [n, 2 inter, hidden] and base.down_proj [n, hidden, inter], or gate_proj /
 * up_proj apart); described, kept, and viewed as lw->ex. */
int model_experts(model *m, const weight_src *src, const char *base, int64_t n, int64_t inter, layer_weights *lw, herr *err);
/* n floats of host memory the model owns (freed with it). */
int model_own_floats(model *m, int64_t n, const char *what, float **out, herr *err);
/* The f32 matrices rounded to bf16 in host copies the model owns (f32_as_bf16). */
int model_to_bf16(model *m, bk_weight *w, herr *err);

/* ---- shared layers (layers.c) ---- */

bk_act model_act(const model *m);
/* Attention of layer l with its residual: x += [post_norm](o · attention(rope(norm(q)), KV)) [× residual_scale]
 * where q, k, v come from norm(x); k / v written to the layer's cache rows unless it reads another layer's. */
void layer_attention(model *m, int l, const kv_store *kv, step *st);
/* The same with weights lw outside m->layers (a multi-token-prediction layer), over kv's layer l. */
void layer_attention_of(model *m, const layer_weights *lw, int l, const kv_store *kv, step *st);
/* out = down(act(gate · in) * (up · in)) with the layer's dense MLP (in: [T, hidden]). */
void layer_mlp(model *m, const layer_weights *lw, step *st, const bk_tensor *in, const bk_tensor *out);
/* The routing of the step's tokens (into st->eids / st->ew) from router · route_in. */
void layer_route(model *m, const layer_weights *lw, step *st, const bk_tensor *route_in);
/* out = the layer's experts on `in` as layer_route chose them. */
void layer_experts(model *m, const layer_weights *lw, step *st, const bk_tensor *in, const bk_tensor *out);
/* out = the experts of the layer on `in`, routed by router · route_in (in, route_in, out: [T, hidden]). */
void layer_moe(model *m, const layer_weights *lw, step *st, const bk_tensor *route_in, const bk_tensor *in, const bk_tensor *out);
/* A linear-attention (Gated DeltaNet) layer with its residual: x += out_proj(gated_norm(delta_rule(
 * silu(conv1d(in_qkv · norm(x))), a, b), z)) over the sequences' recurrent states in kv->state[l]. */
void layer_deltanet(model *m, int l, const kv_store *kv, step *st);
/* y = rmsnorm(x) with the family's norm convention (w NULL: no scale). */
void layer_norm(const model *m, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w);
/* x += o, then xn = the model's RMSNorm of x with weight w (w->buf NULL: none), in one op (bk_add_rmsnorm). */
void layer_add_norm(const model *m, step *st, const bk_tensor *o, const bk_tensor *w);
/* A multi-token-prediction layer's input: x = fc([enorm(x) | hnorm(h)]) over the step's rows (x: their
 * token embeddings, h: the target's hidden states; st->fam holds the [T, 2D] concatenation). */
void layer_mtp_input(model *m, step *st, const bk_tensor *h, const bk_tensor *enorm, const bk_tensor *hnorm,
                     const bk_weight *fc);

/* y += each adapter's delta for projection t of layer l on the rows of the runs that use one (x: the
 * projection's input); nothing without adapters. */
void layer_lora(const step *st, int l, lora_target t, const bk_tensor *y, const bk_tensor *x);
/* The expert deltas (bk_expert_lora) layer l gets on the rows of the step's lora run `run`:
 * out (MODEL_MAX_LORA entries) and *n; false when none of its adapters changes the experts. */
bool layer_lora_experts(const step *st, int l, int run, const bk_expert_lora **out, int *n);
/* The adapter's load number: process-wide, never reused (recorded steps are keyed on it). */
uint64_t model_lora_serial(const model_lora *a);

/* ---- tensor parallelism (tp.c) ---- */

/* model_load for rank `rank` of a group of `size` (size 0: not spread); decoder.c. */
int model_load_rank(const char *dir, const model_load_opts *opts, int rank, int size, model **out, herr *err);
/* model_load with opts->tensor_parallel > 0: every rank loaded, their communicators, the group on rank 0. */
int tp_load(const char *dir, const model_load_opts *opts, model **out, herr *err);
/* Cuts the described weights down to this rank's part (before they go to the backend): the vocabulary's
 * rows, and the layers as the family's shard hook splits them (a family without one is refused). */
int tp_shard(model *m, herr *err);
/* The shard helpers a family's shard hook is built from (rank m->tp_rank of m->tp_size). Each refuses a
 * dimension that does not split with a message naming it. */
/* "tensor parallelism: DIM V does not split over N ranks" */
int tp_refuse(const model *m, const char *dim, int64_t v, herr *err);
/* Query heads [r H/N, ..) with their KV heads (replicated when fewer than the ranks): q / k / v and
 * their biases column-parallel (q rows per head: head_dim, twice that with an output gate), o
 * row-parallel with its bias on rank 0; lw->heads and kv_heads become the rank's. */
int tp_shard_attention(model *m, int l, herr *err);
/* The dense MLP (gate / up column-parallel, down row-parallel) and the experts (each split by width),
 * whichever the layer has (both: Gemma 4's MoE branch beside its MLP, a shared expert). */
int tp_shard_ffn(model *m, layer_weights *lw, int l, herr *err);
/* A Gated DeltaNet layer split by heads: its value heads, and its key heads (replicated when fewer
 * than the ranks); in_proj_qkv's q / k / v rows and the conv's channels gathered, z / a / b and the
 * per-head vectors column-parallel, out_proj row-parallel; state_dim becomes the rank's. */
int tp_shard_deltanet(model *m, int l, herr *err);
/* The llama decoder's split: every layer's attention and feed-forward (the shard hook of the families
 * without layers of their own). */
int tp_shard_layers(model *m, herr *err);
/* A table indexed by token id split like the embedding (rank r: rows [vocab_lo, +vocab_n), then a zero
 * row that the other ranks' ids read): its lookups are summed by an all-reduce. */
int tp_vocab_rows(model *m, bk_weight *w, const char *what, herr *err);
/* Columns [c0, c0 + n) of *w, copied (a row-parallel matrix's inputs). */
int tp_keep_cols(model *m, bk_weight *w, int64_t c0, int64_t n, const char *what, herr *err);
/* w given back: not handed to the backend, its descriptor zeroed (a part another rank holds). */
void tp_drop(model *m, bk_weight *w);
/* The model of rank r of m's group (m itself when not split). */
model *tp_rank_model(const model *m, int r);
/* The group's ranks and threads (rank 0's model_free). */
void tp_free(model *m);
/* Rank r's communicator (testing: failures injected into one rank). */
bk_comm *tp_rank_comm(const model *m, int r);
/* The KV geometry's ranks (rank 0's model_kv_geometry_of). */
void tp_geometry(const model *m, model_kv_geometry *g);
/* What forward_logits does, by mode. */
enum { FWD_ALL = 0, FWD_CHECK = 1, FWD_RANK = 2 }; /* everything; checks and KV reserve only; all but reserve */
int model_forward_rank(model *m, const model_batch *b, bk_tensor *lg, bk_tensor *hid, int mode, herr *err);
/* model_forward_rank over every rank in lockstep (rank 0's model): *lg, *hid are rank 0's. */
int tp_forward(model *m, const model_batch *b, bk_tensor *lg, bk_tensor *hid, herr *err);
/* x = the sum of every rank's x (after a row-parallel projection); nothing when not spread. */
void model_reduce(model *m, const bk_tensor *x);
/* The head's buffers for R logits rows (a split model's; before a step's ops, which may be recorded). */
int tp_reserve(model *m, int64_t R, herr *err);
/* lg [R, vocab] = x [R, hidden] · lm_headᵀ: each rank's vocabulary rows, gathered. */
int model_head(model *m, const bk_tensor *lg, const bk_tensor *x, herr *err);
/* A token id as this rank's embedding table numbers it (vocab_n: its zero row). */
static inline int32_t tp_local_token(const model *m, int32_t id) {
  return id >= m->vocab_lo && id < m->vocab_lo + m->vocab_n ? (int32_t)(id - m->vocab_lo) : (int32_t)m->vocab_n;
}

/* ---- expert residency (experts.c) ---- */

/* Sets up the budget after the experts are described (budget > 0). */
int experts_budget_init(model *m, int64_t budget, herr *err);
void experts_budget_free(model *m);
/* Before layer l's experts run on the routed ids (I32 [T, k] on the
 * backend): loads the chosen experts that are not resident. */
int experts_acquire(model *m, int l, const bk_tensor *ids, herr *err);
/* After they ran: gives back least recently used experts until the resident bytes fit the budget. */
void experts_trim(model *m);

/* ---- families ---- */

/* A family's hooks, named by its row in family.c (llama_family_ops: the llama decoder's, in decoder.c);
 * a capability of the row (split, canvas, mtp) comes with the hooks that run it. */
struct family_ops {
  /* the family's own config.json keys (from cfg.raw, cfg.top) into its state (fam_state, which it
   * allocates) and the shared fields of cfg they decide; before the layers' geometry (optional) */
  int (*config)(model *m, herr *err);
  /* derived per-layer values, checks (optional) */
  int (*prepare)(model *m, herr *err);
  /* describes and keeps layer l's weights */
  int (*load_layer)(model *m, const weight_src *src, int l, herr *err);
  /* model-level weights beyond embeddings, final norm and head (optional) */
  int (*load_model)(model *m, const weight_src *src, herr *err);
  /* the step's inputs it makes from the batch beyond the index tables (st->sc), before any op (optional) */
  int (*inputs)(model *m, const model_batch *b, step *st, herr *err);
  /* after the embedding, before the layers (optional) */
  void (*embedded)(model *m, step *st);
  /* layer l of the forward */
  void (*layer)(model *m, int l, const kv_store *kv, step *st);
  /* a multi-token-prediction forward (model_seq.mtp_hidden): st->x, the new rows' token embeddings, becomes
   * the MTP layer's output, from h [T, hidden] (the rows' hidden inputs), over kv's layer 0 (with the
   * row's mtp) */
  void (*mtp)(model *m, const kv_store *kv, step *st, const bk_tensor *h);
  /* its multi-token-prediction layer in its state (with the row's mtp) */
  const model_mtp *(*mtp_of)(const model *m);
  /* cuts the described weights down to a tensor-parallel rank's part (tp.c's helpers: a family says how
   * its own layers split; with the row's split) */
  int (*shard)(model *m, herr *err);
  /* tokens per canvas of a block-diffusion model (model_canvas_length; with the row's canvas) */
  int64_t (*canvas)(const model *m);
  /* frees fam_state (optional) */
  void (*free)(model *m);
};

/* The llama decoder's hooks (decoder.c); each other family's are named only by its row in family.c. */
extern const family_ops llama_family_ops;

/* The llama decoder's attention weights of layer l (q/k/v/o, biases, q/k norms), shared by families built on it. */
int llama_load_attention(model *m, const weight_src *src, int l, herr *err);
/* The llama decoder's dense MLP of layer l with intermediate size inter. */
int llama_load_mlp(model *m, const weight_src *src, int l, int64_t inter, herr *err);
/* The RoPE table for a layer of the given kind and head size (made on first use). */
int model_rope_for(model *m, bool sliding, int64_t head_dim, const rope_table **out, herr *err);

#endif
