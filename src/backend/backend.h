/* backend.h — the device-agnostic backend interface: where tensors live and
 * every op the model code needs, as a table of functions that each backend
 * (cpu/, cuda/) fills. Model code builds its forward pass from these calls
 * only; it never dereferences a tensor's memory, so the same model file runs
 * on the CPU and on an NVIDIA GPU.
 *
 * Memory. A backend hands out buffers (bk_buf: one allocation in its own
 * address space: host memory for the CPU, device memory for CUDA). A tensor
 * (bk_tensor) is a typed, shaped window into a buffer: buffer + byte offset,
 * dtype, rows x cols, row-major and dense. Weights keep their stored format
 * (bk_weight in weights.h); bk_weight_load makes a host descriptor usable by
 * the backend (the CPU repacks for its integer kernels, CUDA uploads).
 *
 * Streams. Ops are queued in order on the backend's one stream and may run
 * asynchronously: bk_set may return before the copy is done only if the
 * host bytes stay valid until the next bk_sync; bk_get waits for everything
 * queued before it. An op that fails (a launch error, an unsupported shape)
 * records the first error; bk_sync and bk_get report it, and clear it.
 *
 * Host <-> device traffic per forward step: the step's index tables in (token
 * ids, positions, KV slots, block tables: one bk_set), and out either the
 * requested logits rows (one bk_get) or, when the engine samples on the
 * device (bk_sample), only the sampled ids and the logprobs asked for. Weights are uploaded once at load; the KV pool is
 * allocated once and never leaves the device.
 *
 * Partial backends. A backend may leave ops out (NULL entries, supports_op):
 * those run on the host where a host path exists, or are refused with a
 * message naming the op and the backend (below, "what a backend runs").
 *
 * Threads: a backend is driven by one thread at a time (the engine thread).
 */
#ifndef HEARTH_BACKEND_BACKEND_H
#define HEARTH_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/ops.h"
#include "backend/weights.h"
#include "base/status.h"

typedef struct bk_backend bk_backend;

typedef enum bk_dtype { BK_DT_F32 = 0, BK_DT_I32 = 1 } bk_dtype;

/* One allocation of a backend. base is an address in the backend's space
 * (host pointer for the CPU, device pointer for CUDA). */
typedef struct bk_buf {
  bk_backend *be;   /* borrowed: the backend that owns the memory */
  void *base;       /* owned by the backend */
  size_t size;      /* bytes */
} bk_buf;

/* A dense row-major [rows, cols] window of a buffer. */
typedef struct bk_tensor {
  bk_buf *buf;      /* borrowed */
  size_t off;       /* bytes from buf->base */
  bk_dtype dt;
  int64_t rows, cols;
} bk_tensor;

/* Bytes per element: f32 and i32 are both 4. */
static inline size_t bk_dtype_size(bk_dtype dt) { return (void)dt, 4; }
static inline int64_t bk_nelem(const bk_tensor *t) { return t->rows * t->cols; }
static inline size_t bk_nbytes(const bk_tensor *t) { return (size_t)bk_nelem(t) * bk_dtype_size(t->dt); }
/* The tensor's address in the backend's space: only a backend may dereference it. */
static inline void *bk_addr(const bk_tensor *t) { return (char *)t->buf->base + t->off; }
/* Rows [r0, r0 + n) of t. */
static inline bk_tensor bk_rows(const bk_tensor *t, int64_t r0, int64_t n) {
  bk_tensor v = *t;
  v.off += (size_t)(r0 * t->cols) * bk_dtype_size(t->dt);
  v.rows = n;
  return v;
}
/* The same elements seen as [rows, cols] (rows * cols must equal t's count). */
static inline bk_tensor bk_reshape(const bk_tensor *t, int64_t rows, int64_t cols) {
  bk_tensor v = *t;
  v.rows = rows;
  v.cols = cols;
  return v;
}

/* What to open. */
typedef struct bk_open_opts {
  int threads;            /* CPU: worker threads (<= 0: one per CPU) */
  bool f32_activations;   /* no 8-bit activation quantization for GGUF types (CPU: every packed type;
                             CUDA: the Q8_0 / Q4_0 / Q4_K GEMV of a few rows) */
  const char *cuda_lib;   /* CUDA: path of libhearth_cuda.so (NULL: next to the program, then the loader's search) */
  const char *cpu_level;  /* CPU: "scalar", "avx2" or "avx512" caps the kernel level (NULL: the best this CPU has) */
  bool no_graphs;         /* CUDA: launch every op of every step (no graph capture and replay) */
  bool fast_matmul;       /* CUDA: bf16 weights meet bf16-rounded activations in one tensor-core pass
                             (about 3 significant digits of the activations; a third of the work of the
                             default, which keeps them to f32 precision in three bf16 terms) */
} bk_open_opts;

/* device: "cpu", "cuda", "cuda:N" or "auto" (the first GPU when one is
 * usable, else the CPU); NULL = "cpu". A CUDA request on a machine without
 * a GPU or without the CUDA libraries fails with a message that says which. */
int bk_backend_open(const char *device, const bk_open_opts *opts, bk_backend **out, herr *err);
void bk_backend_close(bk_backend *be);
/* "cpu" or "cuda:0". */
const char *bk_backend_name(const bk_backend *be);
bool bk_backend_is_cpu(const bk_backend *be);
/* Whether bk_moe applies a bk_experts' LoRA deltas (bk_expert_lora) here. */
bool bk_backend_expert_lora(const bk_backend *be);
/* A line for the startup log: device name, memory. */
void bk_backend_describe(const bk_backend *be, char *buf, size_t n);
/* Device memory: free and total bytes (CPU: available and physical RAM). */
int bk_mem_info(bk_backend *be, size_t *free_bytes, size_t *total_bytes);

/* ---- memory ---- */

/* A new buffer of `bytes` (contents undefined). */
int bk_buf_new(bk_backend *be, size_t bytes, bk_buf **out, herr *err);
void bk_buf_free(bk_buf *b);
/* A tensor in a buffer of its own (t->buf is owned by the caller: bk_tensor_free). */
int bk_tensor_new(bk_backend *be, bk_dtype dt, int64_t rows, int64_t cols, bk_tensor *t, herr *err);
void bk_tensor_free(bk_tensor *t);
/* Bytes [off, off + n) of dst from host memory src. */
int bk_set(const bk_tensor *dst, size_t off, const void *src, size_t n, herr *err);
/* Host dst from bytes [off, off + n) of src; waits for queued work first. */
int bk_get(const bk_tensor *src, size_t off, void *dst, size_t n, herr *err);
/* Copies bytes [src_off, +n) of src into [dst_off, +n) of dst (same backend). */
void bk_copy(const bk_tensor *dst, size_t dst_off, const bk_tensor *src, size_t src_off, size_t n);
/* Waits for queued work; reports (and clears) the first error an op recorded. */
int bk_sync(bk_backend *be, herr *err);

/* ---- weights ---- */

/* How a loaded weight is used (bk_weight_load's use flags). */
enum {
  BK_USE_MATMUL = 1,   /* multiplied by bk_matmul_t */
  BK_USE_EMBED = 2,    /* read row by row by bk_embed */
  BK_USE_PRIVATE = 4,  /* the host bytes are the caller's own copy (not a shared file mapping): a
                          backend that no longer needs them may give their pages back */
};
/* Makes host descriptor w (data pointing into a file mapping) usable by
 * be's ops for `use`. CPU: repacks matmul weights for the integer kernels
 * where it pays (and returns the stored pages when it may); CUDA: uploads
 * the bytes (scales and biases too) and points w at device memory. Either
 * way w owns what was made: bk_weight_release. */
int bk_weight_load(bk_backend *be, bk_weight *w, unsigned use, herr *err);
void bk_weight_release(bk_backend *be, bk_weight *w);

/* ---- ops (queued on the stream; shapes are taken from the tensors) ---- */

typedef enum bk_act { BK_ACT_SILU = 0, BK_ACT_GELU_TANH, BK_ACT_GELU, BK_ACT_RELU } bk_act;

/* y[n, cols] = rows ids[0..n) of table (any stored format), times scale when scale != 0. ids: I32 [n, 1]. */
void bk_embed(const bk_tensor *y, const bk_weight *table, const bk_tensor *ids, float scale);
/* y[n, w.rows] = x[n, w.cols] · wᵀ (+ bias[1, w.rows]); y must not alias x. bias may be NULL. */
void bk_matmul_t(const bk_tensor *y, const bk_tensor *x, const bk_weight *w, const bk_tensor *bias);
/* y = x / rms(x) * w per row (w NULL: no scale; unit_offset: (1 + w)); y may equal x. w: [1, cols]. */
void bk_rmsnorm(const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, float eps, bool unit_offset);
/* Rotary embedding in place on x[T, n_heads * head_dim] at positions pos (I32 [T, 1]); see op_rope. */
void bk_rope(const bk_tensor *x, int64_t n_heads, int64_t head_dim, const bk_tensor *pos, const rope_table *t);
/* gate = act(gate) * up, elementwise (same shapes). */
void bk_act_mul(const bk_tensor *gate, const bk_tensor *up, bk_act act);
/* y = a + b elementwise (y may alias a or b). */
void bk_add(const bk_tensor *y, const bk_tensor *a, const bk_tensor *b);
/* x = x + d elementwise, then y = rmsnorm(x) as bk_rmsnorm: a residual add and the norm after it, in one
 * pass where the backend fuses them (else bk_add then bk_rmsnorm; the same numbers either way). y must not
 * alias x or d. */
void bk_add_rmsnorm(const bk_tensor *x, const bk_tensor *d, const bk_tensor *y, const bk_tensor *w, float eps,
                    bool unit_offset);
/* x = cap * tanh(x / cap). */
void bk_softcap(const bk_tensor *x, float cap);
/* y[r] = x[rows[r]] for r < y.rows; rows: I32 [y.rows, 1]. */
void bk_get_rows(const bk_tensor *y, const bk_tensor *x, const bk_tensor *rows);
/* x *= s elementwise. */
void bk_scale(const bk_tensor *x, float s);
/* y[n, w] = columns [c0, c0 + w) of x[n, *] (y.rows == x.rows, c0 + w <= x.cols). */
void bk_get_cols(const bk_tensor *y, const bk_tensor *x, int64_t c0);

/* ---- LoRA adapters ----
 *
 * A LoRA adapter adds a low-rank delta to a projection's output: y += scale ·
 * (x · aᵀ) · bᵀ. In a batch whose sequences use different adapters (or
 * none), the base projection runs once over every row, then each run of
 * rows that shares an adapter gets that adapter's delta: one bk_lora per
 * run, on row views (bk_rows) of the step's activations. */

/* y[n, out] += scale · (x[n, in] · aᵀ) · bᵀ with a F32 [r, in] and b F32 [out, r]
 * (as op_lora; the first product rounded to f32). y must not alias x. */
void bk_lora(const bk_tensor *y, const bk_tensor *x, const bk_tensor *a, const bk_tensor *b, float scale);

/* ---- mixture of experts ----
 *
 * A MoE layer is routing (bk_moe_route: which k experts each token uses,
 * with what weights) and the experts themselves (bk_moe). The experts of a
 * layer are n feed-forward blocks of the same shape, each loaded like any
 * matmul weight (BK_USE_MATMUL), in any stored format. bk_moe reads only
 * the experts some token of the batch chose, each once per call: the
 * tokens are grouped by expert, so a batched step costs one pass over each
 * active expert's weights, not one per token. */
/* A LoRA adapter's deltas on a layer's experts: for projection p (0 gate,
 * 1 up, 2 down) and expert e, proj_e · x gains (x · a_eᵀ) · b_eᵀ, with a_e
 * rows [e·r, e·r + r) of a[p] (F32 [n·r, in]) and b_e rows [e·out, e·out +
 * out) of b[p] (F32 [n·out, r]); the adapter's scale is in b, and an expert
 * it does not change has zeros. */
typedef struct bk_expert_lora {
  int64_t r;
  bk_tensor a[3], b[3];
} bk_expert_lora;

typedef struct bk_experts {
  int64_t n;                          /* experts */
  const bk_weight *gate, *up, *down;  /* borrowed: n each; gate, up [inter, D], down [D, inter] */
  const bk_expert_lora *const *lora;  /* borrowed, may be NULL: n_lora adapters whose deltas every routed
                                         token gets in its experts' projections (a caller runs the rows
                                         of one adapter set as one call); on a backend where
                                         bk_backend_expert_lora says so */
  int n_lora;
} bk_experts;

/* For each row t of logits [T, E] (F32): p = softmax(logits[t]); the k
 * largest p (larger first, the lower expert id first on ties) give
 * ids[t, 0..k) (I32 [T, k]) and w[t, 0..k) (F32 [T, k]): p, divided by the
 * sum of the k when norm, then times scale[id] when scale ([1, E]) is not NULL. */
void bk_moe_route(const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits, bool norm, const bk_tensor *scale);
/* y[t] = sum over j < k (in order) of w[t, j] · down_e(act(gate_e · x[t]) * (up_e · x[t])), e = ids[t, j].
 * x, y: F32 [T, D]; ids, w: as bk_moe_route makes them. y must not alias x.
 * A slot whose id is outside [0, ex->n) contributes nothing. */
void bk_moe(const bk_tensor *y, const bk_tensor *x, const bk_tensor *ids, const bk_tensor *w, const bk_experts *ex, bk_act act);

/* The paged KV store of one layer: K and V arenas of n_slots rows; a slot
 * is block * block_rows + row-in-block. With format BK_KV_F32 (0) an arena
 * is [n_slots, kv_dim] f32; quantized (ops.h, bk_kv_fmt) it is [n_slots,
 * bk_kv_row_bytes(fmt, kv_dim) / 4] 4-byte words holding one stored row
 * each. kv_write quantizes, attention dequantizes as it reads. */
typedef struct bk_kv_layer {
  const bk_tensor *k, *v;  /* borrowed */
  int64_t block_rows;
  bk_kv_fmt k_fmt, v_fmt;
} bk_kv_layer;

/* k_new, v_new [T, kv_dim] stored (as kv's formats) in the slots slot[0..T) (I32 [T, 1]). */
void bk_kv_write(const bk_kv_layer *kv, const bk_tensor *k_new, const bk_tensor *v_new, const bk_tensor *slot);

/* Where each query of a batch reads its keys: for query t, its KV row
 * row[t] (= its position in its sequence: it attends rows j <= row[t], and
 * with window > 0 only rows with row[t] - j < window) and its sequence's
 * block table, which starts at tables[tab[t]]: row j is in slot
 * tables[tab[t] + j / block_rows] * block_rows + j % block_rows.
 * row, tab: I32 [T, 1]; tables: I32 [n, 1]. Queries of one sequence are
 * contiguous and in row order. */
typedef struct bk_attn_index {
  const bk_tensor *row, *tab, *tables;
  const bk_tensor *last;  /* may be NULL: I32 [T, 1], the last row query t sees (>= row[t]; a bidirectional
                             span reaches past the query); the window still counts back from row[t] */
} bk_attn_index;

/* out[T, n_heads * head_dim] = causal attention of q[T, n_heads * head_dim]
 * over the paged KV of one layer (GQA, window, softcap: attn_params, as
 * op_attention). */
void bk_attention(const bk_tensor *out, const bk_tensor *q, const bk_kv_layer *kv, const bk_attn_index *ix,
                  const attn_params *p);

/* ---- recurrent layers (linear attention) ----
 *
 * A recurrent layer keeps a fixed-size state per sequence (ops.h, rec_seq):
 * row `slot` of the layer's state arena (F32 [n_slots, width]); an op
 * owns the floats [off, off + its width) of each row. seqs (I32 [S, 4]:
 * t0, n, slot, fresh per sequence) groups the step's tokens by sequence;
 * a fresh sequence starts from a zero state. The ops read and update the
 * state in place, so a sequence's steps must run in order. */
typedef struct bk_recurrent {
  const bk_tensor *state;  /* borrowed: the layer's state arena */
  int64_t off;             /* this op's first float in a row */
  const bk_tensor *seqs;   /* borrowed: I32 [S, 4] */
  const int32_t *keep;     /* borrowed host memory, NULL: none: per token, the row that gets the state after it
                              (-1: none; ops.h, keep); the CPU backend alone takes it */
} bk_recurrent;

/* y[T, c] = the causal depthwise convolution of x[T, c] with w (F32 [c, k]),
 * continuing from each sequence's last k - 1 inputs, through SiLU when silu
 * (op_conv1d_state); the state's (k - 1) · c floats at r->off then hold the
 * sequence's last k - 1 inputs. y must not alias x. */
void bk_conv1d(const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, const bk_recurrent *r, bool silu);
/* o[T, nv · dv] = the gated delta rule over qkv[T, 2 · nk · dk + nv · dv]
 * with a, b [T, nv] and the heads' a_log, dt_bias ([1, nv]), continuing
 * from each sequence's state (nv · dk · dv floats at r->off), which it
 * updates (op_delta_rule_ref is the definition). */
void bk_delta_rule(const bk_tensor *o, const bk_tensor *qkv, const bk_tensor *a, const bk_tensor *b, const bk_tensor *a_log,
                   const bk_tensor *dt_bias, const bk_recurrent *r, const delta_params *p);
/* y *= sigmoid(g): g the same shape as y, or [y.rows, 1] (one gate per row). */
void bk_sigmoid_mul(const bk_tensor *y, const bk_tensor *g);
/* ---- multi-head latent attention, DeepSeek sparse attention ----
 *
 * The pieces MLA and DSA add (GLM-5, DeepSeek-V3.2): columns written into
 * a wider tensor, rows scattered into a cache arena, LayerNorm, the grouped
 * sigmoid routing, the lightning indexer's top-k choice of cached rows and
 * attention over the chosen rows of a one-head latent cache. The references
 * are in ops.h. */

/* Columns [c0, c0 + x.cols) of y = x (y.rows == x.rows); the inverse of bk_get_cols. */
void bk_set_cols(const bk_tensor *y, const bk_tensor *x, int64_t c0);
/* y[rows[r]] = x[r] for r < x.rows (rows: I32 [x.rows, 1], distinct; y.cols == x.cols). */
void bk_set_rows(const bk_tensor *y, const bk_tensor *x, const bk_tensor *rows);
/* y = LayerNorm(x) per row with weight w and bias b ([1, cols] each, NULL: none); y may equal x. */
void bk_layernorm(const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, const bk_tensor *b, float eps);
/* Grouped sigmoid routing of logits [T, E] into ids (I32 [T, k]) and w (F32
 * [T, k]) as op_moe_route_group: bias [1, E] or NULL, n_group groups of which
 * topk_group stay open, renormalized when norm, times scale. */
void bk_moe_route_group(const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits, const bk_tensor *bias,
                        int64_t n_group, int64_t topk_group, bool norm, float scale);
/* sel (I32 [T, p.topk]) = the lightning indexer's rows for each query as
 * op_index_topk: q [T, n_heads * head_dim], w [T, n_heads], the keys the first
 * head_dim floats of each row of the arena keys->k (keys->v unused), rows
 * found through ix as bk_attention's. */
void bk_index_topk(const bk_tensor *sel, const bk_tensor *q, const bk_tensor *w, const bk_kv_layer *keys,
                   const bk_attn_index *ix, const index_params *p);
/* out [T, n_heads * v_dim] = attention of q [T, n_heads * head_dim] over the
 * rows sel (as bk_index_topk makes it) of the one-head arena kv->k (values:
 * its columns [v_off, v_off + v_dim); kv->v unused), as op_attention_sparse. */
void bk_attention_sparse(const bk_tensor *out, const bk_tensor *q, const bk_kv_layer *kv, const bk_attn_index *ix,
                         const bk_tensor *sel, const sparse_attn_params *p);

/* ---- media encoders ----
 *
 * The pieces the image and audio towers add: an activation alone, a clamp,
 * a weighted sum of table rows (learned position embeddings resampled to
 * an image's grid) and the conformer's local attention with relative
 * positions. A vision tower's bidirectional attention inside an image is
 * bk_attention itself: every patch a query whose row is its image's last
 * row, so that each sees the whole image. */

/* x = act(x) elementwise. */
void bk_activate(const bk_tensor *x, bk_act act);
/* x = min(max(x, lo), hi) elementwise (op_clamp). */
void bk_clamp(const bk_tensor *x, float lo, float hi);
/* y[n, d] = sum over j of w[r, j] · table[ids[r, j]] (op_embed_bag): table F32 [rows, d], ids I32 [n, k],
 * w F32 [n, k]. */
void bk_embed_bag(const bk_tensor *y, const bk_tensor *table, const bk_tensor *ids, const bk_tensor *w);
/* out = op_attention_rel over q, k, v [T, n_heads · head_dim] (one sequence; its first n_valid rows are
 * keys), rel [left + right + 1, n_heads · head_dim], qscale [1, head_dim] or NULL. out must not alias the inputs. */
void bk_attention_rel(const bk_tensor *out, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v, const bk_tensor *rel,
                      const bk_tensor *qscale, int64_t n_valid, const rel_attn_params *p);

/* ---- sampling on the device ----
 *
 * bk_sample picks one token per logits row on the backend, so that only ids
 * (and logprobs when asked) cross to the host. Per row, in this order:
 *   mask          with a mask (output under a grammar): tokens whose bit is
 *                 clear become -inf before anything else.
 *   adjustments   the row's penalty entries (unique ids, any order):
 *                 x = rep == 1 ? x : (x < 0 ? x * rep : x / rep); x -= sub;
 *                 then its bias entries one after another: x += add.
 *   logprobs      log-softmax of the adjusted row (NaN and -inf are unusable
 *                 tokens); the chosen token's and the top_logprobs best
 *                 (descending, lower id first on ties).
 *   greedy        temperature <= 0: the largest adjusted logit, lowest id on ties.
 *   otherwise     p = exp((x - max) / T) over the usable tokens;
 *                 top-k keeps x >= the k-th largest (ties kept);
 *                 top-p keeps a token when the mass of the tokens with a
 *                 strictly larger p is below top_p * total (tokens of equal p
 *                 are kept or dropped together);
 *                 min-p keeps p >= min_p * max p;
 *                 then the token where u * kept mass falls in the running sum
 *                 of the kept p in id order.
 * u is the request's uniform draw in [0, 1), made on the host from its seeded
 * RNG, so the same seed gives the same tokens on the same device. The logits
 * rows are left adjusted (they are scratch). */
#define BK_SAMPLE_MAX_TOP 20

typedef struct bk_sample_adj {
  int32_t id;
  float rep;  /* penalty entries: repetition penalty (1 = none) */
  float sub;  /* penalty entries: presence + frequency * count (0 = none) */
  float add;  /* bias entries: the logit bias */
} bk_sample_adj;

typedef struct bk_sample_row {
  float temperature;      /* <= 0: greedy */
  int32_t top_k;          /* <= 0: off */
  float top_p;            /* >= 1: off */
  float min_p;            /* <= 0: off */
  double u;               /* uniform draw in [0, 1) (unused when greedy) */
  int32_t logprobs;       /* nonzero: the chosen token's logprob */
  int32_t top_logprobs;   /* 0..BK_SAMPLE_MAX_TOP alternatives */
  int32_t pen_off, n_pen; /* penalty entries adj[pen_off, +n_pen): ids unique */
  int32_t bias_off, n_bias; /* bias entries adj[bias_off, +n_bias), applied in order */
  int32_t mask_words;     /* with mask: its length in 64-bit words */
  const uint64_t *mask;   /* NULL, or the tokens that may be picked, a host bitset: bit i % 64 of word
                           * i / 64 is token i (ids at or past 64 * mask_words may not be picked) */
} bk_sample_row;

typedef struct bk_sample_out {
  int32_t id;             /* -1: the row has no usable logit */
  float logprob;          /* when asked */
  int32_t n_top;
  int32_t top_ids[BK_SAMPLE_MAX_TOP];
  float top_logprobs[BK_SAMPLE_MAX_TOP];
} bk_sample_out;

/* One token for each row of logits (F32 [rows, vocab]) as above; rows and
 * adj are host arrays (logits.rows rows, n_adj entries), out a host array of
 * logits.rows results. Waits for the queued work (like bk_get). */
int bk_sample(const bk_tensor *logits, const bk_sample_row *rows, const bk_sample_adj *adj, int64_t n_adj,
              bk_sample_out *out, herr *err);

/* ---- recorded steps ----
 *
 * A forward step of a given shape issues the same ops with the same
 * arguments every time (what changes lives in device memory: the index
 * tables, the KV blocks). A backend may record such a step once and replay
 * it: bk_graph_begin(be, key) before the step's ops returns true when the
 * backend will replay its recording of `key` at bk_graph_end, and the
 * caller must then skip issuing the ops; false means issue them (the
 * backend may be recording them). key must change whenever any op's
 * shape or any tensor's address would (the caller folds in the batch shape,
 * its scratch generation and the KV store). bk_graph_end runs or finishes
 * what was begun and reports errors like bk_sync. The CPU backend never
 * records. */
bool bk_graph_begin(bk_backend *be, uint64_t key);
/* 0, an error code, or BK_GRAPH_REDO: the recording failed and nothing of
 * it ran — issue the step's ops again (they run plainly). */
#define BK_GRAPH_REDO (-1)
int bk_graph_end(bk_backend *be, herr *err);

/* ---- what a backend runs ----
 *
 * A backend may start partial: it leaves the table entries of the ops it
 * does not have NULL, or says no through supports_op. A call to such an op
 * then runs on the host where a host path exists (host_path.c: the inputs
 * read back with get, the plain reference of ops.h run on them, the result
 * written with set: correct, slow) and otherwise does nothing and records an
 * error naming the op and the backend, which the next bk_sync / bk_get
 * reports. bk_backend_require refuses such a backend before any op runs.
 * The CPU and CUDA backends fill every entry. */
typedef enum bk_op {
  BK_OP_EMBED = 0, BK_OP_MATMUL, BK_OP_RMSNORM, BK_OP_ROPE, BK_OP_ACT_MUL, BK_OP_ADD, BK_OP_SOFTCAP, BK_OP_GET_ROWS,
  BK_OP_SCALE, BK_OP_GET_COLS, BK_OP_MOE_ROUTE, BK_OP_MOE, BK_OP_KV_WRITE, BK_OP_ATTENTION, BK_OP_CONV1D,
  BK_OP_DELTA_RULE, BK_OP_SIGMOID_MUL, BK_OP_SAMPLE, BK_OP_SET_COLS, BK_OP_SET_ROWS, BK_OP_LAYERNORM,
  BK_OP_MOE_ROUTE_GROUP, BK_OP_INDEX_TOPK, BK_OP_ATTENTION_SPARSE, BK_OP_LORA, BK_OP_ACT, BK_OP_CLAMP, BK_OP_EMBED_BAG,
  BK_OP_ATTENTION_REL, BK_OP_ADD_RMSNORM,
  BK_OP_COUNT
} bk_op;

/* "matmul", "attention", ... (the table entry's name; static). */
const char *bk_op_name(bk_op op);
/* Whether be runs op itself: its entry is set and supports_op (when set) says so. */
bool bk_backend_supports(const bk_backend *be, bk_op op);
/* Whether op can run on the host for a backend that lacks it. */
bool bk_op_host_path(bk_op op);
/* 0 when be can run every op of ops[0..n), itself or on the host, and has
 * the memory entries every backend needs (buf_new, buf_free, set, get, copy,
 * sync); else HEARTH_EUNSUPPORTED with a message naming the first op it
 * cannot run and the backend. */
int bk_backend_require(const bk_backend *be, const bk_op *ops, int n, herr *err);
/* The ops every forward pass of every model runs that have no host path
 * (embed, matmul, kv_write, attention): what loading a model requires. */
int bk_backend_require_core(const bk_backend *be, herr *err);

/* ---- the table a backend fills ---- */

typedef struct bk_backend_ops {
  void (*close)(bk_backend *be);
  void (*describe)(const bk_backend *be, char *buf, size_t n);
  int (*mem_info)(bk_backend *be, size_t *free_bytes, size_t *total_bytes);
  int (*buf_new)(bk_backend *be, size_t bytes, bk_buf **out, herr *err);
  void (*buf_free)(bk_backend *be, bk_buf *b);
  int (*set)(bk_backend *be, void *dst, const void *src, size_t n, herr *err);
  int (*get)(bk_backend *be, void *dst, const void *src, size_t n, herr *err);
  void (*copy)(bk_backend *be, void *dst, const void *src, size_t n);
  int (*sync)(bk_backend *be, herr *err);
  int (*weight_load)(bk_backend *be, bk_weight *w, unsigned use, herr *err);
  void (*weight_release)(bk_backend *be, bk_weight *w);
  void (*embed)(bk_backend *be, const bk_tensor *y, const bk_weight *table, const bk_tensor *ids, float scale);
  void (*matmul)(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_weight *w, const bk_tensor *bias);
  void (*rmsnorm)(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, float eps, bool unit_offset);
  void (*rope)(bk_backend *be, const bk_tensor *x, int64_t n_heads, int64_t head_dim, const bk_tensor *pos, const rope_table *t);
  void (*act_mul)(bk_backend *be, const bk_tensor *gate, const bk_tensor *up, bk_act act);
  void (*add)(bk_backend *be, const bk_tensor *y, const bk_tensor *a, const bk_tensor *b);
  void (*softcap)(bk_backend *be, const bk_tensor *x, float cap);
  void (*get_rows)(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *rows);
  void (*scale)(bk_backend *be, const bk_tensor *x, float s);
  void (*get_cols)(bk_backend *be, const bk_tensor *y, const bk_tensor *x, int64_t c0);
  void (*moe_route)(bk_backend *be, const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits, bool norm,
                    const bk_tensor *scale);
  void (*moe)(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *ids, const bk_tensor *w,
              const bk_experts *ex, bk_act act);
  void (*kv_write)(bk_backend *be, const bk_kv_layer *kv, const bk_tensor *k_new, const bk_tensor *v_new, const bk_tensor *slot);
  void (*attention)(bk_backend *be, const bk_tensor *out, const bk_tensor *q, const bk_kv_layer *kv, const bk_attn_index *ix,
                    const attn_params *p);
  void (*conv1d)(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, const bk_recurrent *r, bool silu);
  void (*delta_rule)(bk_backend *be, const bk_tensor *o, const bk_tensor *qkv, const bk_tensor *a, const bk_tensor *b,
                     const bk_tensor *a_log, const bk_tensor *dt_bias, const bk_recurrent *r, const delta_params *p);
  void (*sigmoid_mul)(bk_backend *be, const bk_tensor *y, const bk_tensor *g);
  int (*sample)(bk_backend *be, const bk_tensor *logits, const bk_sample_row *rows, const bk_sample_adj *adj,
                int64_t n_adj, bk_sample_out *out, herr *err);
  bool (*graph_begin)(bk_backend *be, uint64_t key); /* NULL: never records */
  int (*graph_end)(bk_backend *be, herr *err);
  void (*set_cols)(bk_backend *be, const bk_tensor *y, const bk_tensor *x, int64_t c0);
  void (*set_rows)(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *rows);
  void (*layernorm)(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, const bk_tensor *b, float eps);
  void (*moe_route_group)(bk_backend *be, const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits,
                          const bk_tensor *bias, int64_t n_group, int64_t topk_group, bool norm, float scale);
  void (*index_topk)(bk_backend *be, const bk_tensor *sel, const bk_tensor *q, const bk_tensor *w, const bk_kv_layer *keys,
                     const bk_attn_index *ix, const index_params *p);
  void (*attention_sparse)(bk_backend *be, const bk_tensor *out, const bk_tensor *q, const bk_kv_layer *kv,
                           const bk_attn_index *ix, const bk_tensor *sel, const sparse_attn_params *p);
  void (*lora)(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *a, const bk_tensor *b, float scale);
  void (*act)(bk_backend *be, const bk_tensor *x, bk_act act);
  void (*clamp)(bk_backend *be, const bk_tensor *x, float lo, float hi);
  void (*embed_bag)(bk_backend *be, const bk_tensor *y, const bk_tensor *table, const bk_tensor *ids, const bk_tensor *w);
  void (*attention_rel)(bk_backend *be, const bk_tensor *out, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v,
                        const bk_tensor *rel, const bk_tensor *qscale, int64_t n_valid, const rel_attn_params *p);
  void (*add_rmsnorm)(bk_backend *be, const bk_tensor *x, const bk_tensor *d, const bk_tensor *y, const bk_tensor *w,
                      float eps, bool unit_offset);
  /* NULL: every op whose entry above is set. Else whether this backend runs op (a backend that has an
   * entry may still say no, e.g. for a device it cannot use it on). describe, mem_info, weight_load,
   * weight_release and graph_begin / graph_end may be NULL too: the name, no memory figures (an
   * error), weights used as the host descriptor gives them, no recording. */
  bool (*supports_op)(const bk_backend *be, bk_op op);
} bk_backend_ops;

/* Every backend's handle starts with this. */
struct bk_backend {
  const bk_backend_ops *ops;  /* borrowed (static) */
  char name[32];              /* "cpu", "cuda:0" */
  bool is_cpu;
  bool expert_lora;           /* bk_moe honours bk_experts.lora (else it does nothing when n_lora > 0) */
  void *lib;                  /* owned: the dlopen handle of a loaded backend library, or NULL */
  herr refused;               /* the first op the dispatch could not run (no entry, no host path) or whose host
                                 path failed; reported and cleared by bk_sync / bk_get / bk_graph_end */
};

/* The CUDA backend library's one entry point (libhearth_cuda.so). */
#define BK_CUDA_ENTRY "hearth_cuda_backend_open"
#define BK_CUDA_ABI 11
typedef int (*bk_cuda_open_fn)(int abi, int device, const bk_open_opts *opts, bk_backend **out, herr *err);

/* The CPU backend (cpu/backend_cpu.c). */
int bk_cpu_open(const bk_open_opts *opts, bk_backend **out, herr *err);

/* Per-op wall time on the CPU backend (hearth bench --profile): each matmul
 * keyed by its weight's shape, and attention (rows = cols = 0). bytes is the
 * weight bytes the calls read (stored format; 0 for attention). */
typedef struct bk_prof_entry {
  const char *op; /* "matmul" or "attention" (static) */
  int64_t rows, cols, calls;
  double seconds, bytes;
} bk_prof_entry;
#define BK_PROF_MAX 64
/* Starts (on, clearing what was collected) or stops collecting. Returns -1
 * on a backend that is not the CPU's, else 0. */
int bk_cpu_profile(bk_backend *be, bool on);
/* Copies up to max entries collected so far into out (first-seen order);
 * returns how many there are (0 on other backends). */
int bk_cpu_profile_read(bk_backend *be, bk_prof_entry *out, int max);

#endif
