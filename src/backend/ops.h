/* ops.h — the plain reference of the numeric operations, on host float
 * buffers: the spec that every backend's kernels are tested against, and
 * what the CPU backend runs where it has nothing faster. Model code does
 * not call these; it goes through backend.h. Shapes are row-major: a
 * matrix [n, d] is n rows of d floats.
 *
 * Every op here has a plain reference implementation (cpu/ref.c); faster
 * kernels added later are checked against it. The backend knows nothing of
 * models: rotary frequencies arrive as a table, attention reads a KV view.
 */
#ifndef HEARTH_BACKEND_OPS_H
#define HEARTH_BACKEND_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/pool.h"

/* Host float buffers for the reference ops and their tests: 64-byte aligned, zeroed. NULL on failure. */
float *bk_alloc(size_t n_floats);
void bk_free(float *p);

/* y[n, out] = x[n, in] · w[out, in]ᵀ (+ bias[out] when bias != NULL).
 * Spread over the pool's threads (pool may be NULL). y must not alias x. */
void op_matmul(hpool *pool, float *y, const float *x, int64_t n, int64_t in, const float *w, int64_t out, const float *bias);
/* The plain reference matmul (op_matmul is it today; faster kernels for
 * stored weight formats are in weights.h, bk_matmul). */
void op_matmul_ref(hpool *pool, float *y, const float *x, int64_t n, int64_t in, const float *w, int64_t out, const float *bias);

/* y[n, d] = x / rms(x) * w, per row (rms over d, eps inside the root);
 * with unit_offset the scale is (1 + w) (gemma). w NULL = no scale. y may equal x. */
void op_rmsnorm(float *y, const float *x, int64_t n, int64_t d, const float *w, float eps, bool unit_offset);

/* Rotary embedding on x[n, n_heads, head_dim] in place, "rotate half" layout:
 * for each head the first rot_dim dims are rotated as pairs (i, i + rot_dim/2)
 * by angle pos[t] * inv_freq[i]; cos and sin are multiplied by attn_scale
 * (yarn). Dims beyond rot_dim pass through. With interleaved the pairs are
 * (2i, 2i + 1) instead (llama.cpp's layout of llama q/k weights in GGUF).
 * Several position axes (multimodal RoPE: a token's temporal / height /
 * width positions; the 2-D rotary of vision towers): with n_axes > 1, pos
 * holds n_axes positions per token (pos[t * n_axes + a]) and frequency i
 * turns by the position of axis axis[i]. */
typedef struct rope_table {
  int64_t rot_dim;       /* even, <= head_dim */
  double *inv_freq;      /* owned: rot_dim / 2 frequencies */
  double attn_scale;     /* 1 unless yarn */
  bool interleaved;
  int64_t n_axes;        /* 0 or 1: one position per token */
  int8_t *axis;          /* owned when n_axes > 1: rot_dim / 2 axis numbers in [0, n_axes) */
} rope_table;
void op_rope(float *x, int64_t n, int64_t n_heads, int64_t head_dim, const int64_t *pos, const rope_table *t);

/* x = min(max(x, lo), hi) over n floats (NaN stays NaN). */
void op_clamp(float *x, int64_t n, float lo, float hi);

/* y[n, d] = sum over j < k of w[r, j] · table[ids[r, j]] per row r (the sum
 * in double, in j order); ids outside [0, rows) contribute nothing. */
void op_embed_bag(float *y, const float *table, int64_t rows, int64_t d, const int32_t *ids, const float *w, int64_t n,
                  int64_t k);

/* Local attention with relative-position logits (the conformer attention
 * of USM-style audio encoders, Transformer-XL's relative positions), over
 * one sequence of T rows of which the first n_valid are keys. Per head,
 * query i sees the keys j < n_valid with i - left <= j <= i + right:
 *   s_ij = (q_i ⊙ qscale) · k_j + (q_i ⊙ qscale) · rel[right + i - j]
 * (qscale [head_dim], NULL: none; rel [left + right + 1, n_heads * head_dim],
 * the relative keys by distance i - j), then cap · tanh(s / cap) when
 * softcap > 0, softmax over the keys seen, out_i = sum of p_ij v_j. A query
 * that sees no key gets zeros. q, k, v, out: [T, n_heads * head_dim]. */
typedef struct rel_attn_params {
  int64_t n_heads, head_dim;
  int64_t left, right;
  float softcap;
} rel_attn_params;
void op_attention_rel(float *out, const float *q, const float *k, const float *v, const float *rel, const float *qscale,
                      int64_t T, int64_t n_valid, const rel_attn_params *p);

/* In place over each of n rows of d floats. */
void op_softmax(float *x, int64_t n, int64_t d);
/* x = cap * tanh(x / cap) over n floats. */
void op_softcap(float *x, int64_t n, float cap);
void op_silu(float *x, int64_t n);
/* gelu with the tanh approximation (gelu_pytorch_tanh, gelu_new). */
void op_gelu_tanh(float *x, int64_t n);
/* exact gelu (erf). */
void op_gelu(float *x, int64_t n);
void op_relu(float *x, int64_t n);
/* y = a * b elementwise (y may alias a or b). */
void op_mul(float *y, const float *a, const float *b, int64_t n);
/* y = a + b elementwise (y may alias a or b). */
void op_add(float *y, const float *a, const float *b, int64_t n);
/* x *= s */
void op_scale(float *x, int64_t n, float s);
/* x[0..n) scaled to unit L2 norm (the sum of squares in double); a vector
 * of zeros (or with a non-finite norm) is left as it is. Returns the norm. */
double op_l2_normalize(float *x, int64_t n);

/* How a KV cache stores a row of dim floats (keys or values of one token
 * and layer). BK_KV_F32: dim floats. BK_KV_Q8 / BK_KV_Q4 / BK_KV_FP8: the
 * row cut in blocks of BK_KV_QBLOCK (32) consecutive elements (the last
 * block padded with zeros), each block an f32 scale d followed by its codes.
 * Q8 / Q4: symmetric, d = max|x| / 127 (Q8) or / 7 (Q4), code =
 * round-to-nearest-even(x * (1/d)) clamped to [-127, 127] (Q8: one int8 per
 * element, 36 bytes a block) or [-7, 7] (Q4: code + 8 in a nibble, byte j
 * holds elements j (low) and j + 16 (high), 20 bytes a block); x = d * code.
 * FP8: d = max|x| / 448, code = the E4M3 byte (bk_fp8_encode: nearest even,
 * saturating at ±448) of x / d (0 when d = 0), one byte per element in order as Q8
 * (36 bytes a block); x = d * e4m3(code) (bk_fp8_decode). A block of zeros
 * has d = 0. Every row size is a multiple of 4 bytes. */
typedef enum bk_kv_fmt { BK_KV_F32 = 0, BK_KV_Q8 = 1, BK_KV_Q4 = 2, BK_KV_FP8 = 3 } bk_kv_fmt;
#define BK_KV_QBLOCK 32
#define BK_KV_FMT_LAST BK_KV_FP8 /* formats are 0 .. BK_KV_FMT_LAST */
/* Bytes of one stored row of dim elements. */
static inline size_t bk_kv_row_bytes(bk_kv_fmt f, int64_t dim) {
  size_t nb = (size_t)((dim + BK_KV_QBLOCK - 1) / BK_KV_QBLOCK);
  return f == BK_KV_Q8 || f == BK_KV_FP8 ? nb * (4 + BK_KV_QBLOCK)
         : f == BK_KV_Q4                 ? nb * (4 + BK_KV_QBLOCK / 2)
                                         : (size_t)dim * 4;
}
/* "f32", "q8", "q4" or "fp8" ("?" for anything else). */
const char *bk_kv_fmt_name(bk_kv_fmt f);
/* Stores src[0..dim) as one row of format f at dst (bk_kv_row_bytes(f, dim) bytes). */
void op_kv_quantize_row(bk_kv_fmt f, void *dst, const float *src, int64_t dim);
/* dst[0..n) = elements [i0, i0 + n) of a stored row of format f. */
void op_kv_dequantize(bk_kv_fmt f, float *dst, const void *row, int64_t i0, int64_t n);

/* Cached keys/values of one layer for one sequence: rows [lo, hi). Row r
 * lives at k_blocks[r / block_rows] + (r % block_rows) * row_stride (v:
 * v_row_stride when set, else row_stride), strides in 4-byte words; a row
 * holds n_kv_heads * head_dim elements stored as k_fmt / v_fmt (f32 when
 * 0: the blocks are then plain floats). */
typedef struct kv_view {
  const float *const *k_blocks; /* borrowed */
  const float *const *v_blocks; /* borrowed */
  int64_t block_rows;
  int64_t row_stride;
  int64_t lo, hi;
  bk_kv_fmt k_fmt, v_fmt;
  int64_t v_row_stride;
  const int64_t *last;  /* may be NULL: query i sees rows up to last[i] (>= its q_row) instead of q_row[i] —
                           a bidirectional span; the window still counts back from q_row[i] */
} kv_view;

/* Causal attention of n query rows against a KV view.
 * q[n, n_heads, head_dim]; q_row[i] is the KV row index (= sequence position)
 * of query i: it attends rows j with j <= q_row[i] (kv->last[i] when given),
 * j >= kv->lo and, when window > 0, q_row[i] - j < window. Scores are q·k * scale, then
 * cap * tanh(s / cap) when softcap > 0, then softmax. Head h reads KV head
 * h / (n_heads / n_kv_heads). out[n, n_heads, head_dim]. */
typedef struct attn_params {
  int64_t n_heads, n_kv_heads, head_dim;
  float scale, softcap;
  int64_t window;
} attn_params;
void op_attention(hpool *pool, float *out, const float *q, int64_t n, const int64_t *q_row, const kv_view *kv,
                  const attn_params *p);
/* Several sequences' op_attention at once (one dispatch over the pool): sequence i's
 * n query rows q / q_row against its view kv, into out. */
typedef struct attn_seq {
  float *out;           /* borrowed */
  const float *q;       /* borrowed */
  int64_t n;
  const int64_t *q_row; /* borrowed */
  kv_view kv;           /* its pointers borrowed */
} attn_seq;
void op_attention_seqs(hpool *pool, const attn_seq *seqs, int n_seqs, const attn_params *p);
/* The plain reference of op_attention (one task per query and head, scalar
 * loops), which the blocked kernels are tested against. */
void op_attention_ref(hpool *pool, float *out, const float *q, int64_t n, const int64_t *q_row, const kv_view *kv,
                      const attn_params *p);

/* Mixture-of-experts routing of n tokens over e experts: per row of
 * logits[n, e], p = softmax(row) (sum in double); the k largest logits
 * (larger first, the lower expert id first on ties) give ids[n, k] and
 * weights[n, k] = their p, divided by the sum of the k when norm, then
 * times scale[id] when scale != NULL. k <= e. */
void op_moe_route(int32_t *ids, float *weights, const float *logits, int64_t n, int64_t e, int64_t k, bool norm,
                  const float *scale);

/* ---- recurrent layers (linear attention) ----
 *
 * A recurrent layer keeps, per sequence, a fixed-size state instead of KV
 * rows: one row of a state arena (stride floats apart), of which an op owns
 * the floats [off, off + its width). The tokens of a step are grouped by
 * sequence: sequence s has tokens [t0, t0 + n) of the step, its state in
 * row `slot`, and `fresh` set when those tokens are its first (its state is
 * then taken as zeros, whatever the row holds). */
typedef struct rec_seq {
  int32_t t0, n, slot, fresh;
} rec_seq;

/* keep (the recurrent ops' last-but-one argument, NULL: none): per token
 * of the step, -1 or the state-arena row that gets its sequence's state
 * after that token (at off like the slot's); the slot's own state is
 * updated as without. A verification forward over drafts keeps them, so the
 * state after the last accepted one can be installed without computing the
 * accepted tokens again. A sequence's tokens keep all or none (whether its
 * first token's entry is -1 decides). */

/* Causal depthwise convolution over c channels with a kernel of k taps
 * (w[c, k]), continuing each sequence from its state: the state holds the
 * k - 1 inputs before the sequence's first new token (oldest first, c
 * floats each). y[t, ch] = sum over j < k of w[ch, j] · in[t - (k - 1) + j, ch],
 * through SiLU when silu. Afterwards the state holds the sequence's last
 * k - 1 inputs. x, y: [T, c]; y must not alias x. */
void op_conv1d_state(float *y, const float *x, int64_t c, const float *w, int64_t k, float *state, int64_t stride,
                     int64_t off, const rec_seq *seqs, int64_t n_seqs, const int32_t *keep, bool silu);

/* The gated delta rule (Gated DeltaNet's token mixer). qkv[T, 2 · nk · dk +
 * nv · dv] holds per token the queries (nk heads of dk), the keys (same) and
 * the values (nv heads of dv); value head h reads query / key head
 * h / (nv / nk). Per token and value head, with q and k L2-normalized
 * (x / sqrt(sum x² + 1e-6)) and q scaled by dk^-1/2,
 *   g = -exp(a_log[h]) · softplus(a[t, h] + dt_bias[h]),  beta = sigmoid(b[t, h]),
 *   S = exp(g) · S;  u = beta · (v - Sᵀ k);  S = S + k uᵀ;  o[t, h] = Sᵀ q
 * where S [dk, dv] is the head's state (row-major, nv · dk · dv floats per
 * sequence). a, b: [T, nv]; o: [T, nv · dv]. */
typedef struct delta_params {
  int64_t n_k_heads, n_v_heads, dk, dv;
} delta_params;
/* The plain reference: token by token, as above (sums in double). */
void op_delta_rule_ref(float *o, const float *qkv, const float *a, const float *b, const float *a_log, const float *dt_bias,
                       float *state, int64_t stride, int64_t off, const rec_seq *seqs, int64_t n_seqs, const delta_params *p);
/* The same in the chunked (parallel) form the CPU backend runs: a
 * sequence's tokens in chunks of `chunk`, each chunk's updates solved as one
 * triangular system against the state at its start; one task per sequence
 * and value head over the pool. A sequence of one token takes the
 * token-by-token step. */
void op_delta_rule_chunked(hpool *pool, float *o, const float *qkv, const float *a, const float *b, const float *a_log,
                           const float *dt_bias, float *state, int64_t stride, int64_t off, const rec_seq *seqs,
                           int64_t n_seqs, const int32_t *keep, const delta_params *p, int64_t chunk);
/* y[n, d] *= sigmoid(g), g [n, d] elementwise or [n, 1] per row (gd = d or 1). */
void op_sigmoid_mul(float *y, const float *g, int64_t n, int64_t d, int64_t gd);
/* ---- multi-head latent attention and DeepSeek sparse attention (cpu/ref_sparse.c) ---- */

/* y[n, d] = (x - mean) / sqrt(var + eps) * w + b per row (var over d, in
 * double; w / b NULL: 1 / 0). y may equal x. */
void op_layernorm(float *y, const float *x, int64_t n, int64_t d, const float *w, const float *b, float eps);

/* DeepSeek-V3 routing of n tokens over e experts in n_group equal groups:
 * per row, s = sigmoid(logits) and c = s + bias (bias NULL: 0); a group's
 * score is the sum of its two largest c; the topk_group best groups (lower
 * group first on ties) are open, and the k largest c among their experts
 * (larger first, lower id first on ties) give ids[n, k]; weights[n, k] =
 * their s, divided by (sum of the k + 1e-20) when norm, then times scale.
 * e % n_group == 0, e / n_group >= 2, k <= topk_group * e / n_group. */
void op_moe_route_group(int32_t *ids, float *weights, const float *logits, int64_t n, int64_t e, int64_t k,
                        const float *bias, int64_t n_group, int64_t topk_group, bool norm, float scale);

/* Rows of a paged cache, per query: query i sees rows 0..q_row[i] of its
 * sequence, whose row j lives in slot tables[q_tab[i] + j / block_rows] *
 * block_rows + j % block_rows of arena (row_width floats per slot). */
typedef struct paged_rows {
  const float *arena;        /* borrowed */
  int64_t row_width, block_rows;
  const int32_t *q_row, *q_tab, *tables; /* borrowed */
} paged_rows;

/* The lightning indexer's choice: for query i with heads q[i, h, 0..head_dim)
 * and weights w[i, h], the score of its row j is
 *   sum over h of w[i, h] * max(0, scale * q[i, h] . key_j)   (key_j: the
 *   first head_dim floats of row j; sums in double);
 * the topk best rows (higher score first, lower row first on ties; all of
 * them when q_row[i] < topk) go to sel[i, 0..topk) in ascending row order,
 * the rest of the row is -1. */
typedef struct index_params {
  int64_t n_heads, head_dim, topk;
  float scale;
} index_params;
void op_index_topk(hpool *pool, int32_t *sel, const float *q, const float *w, int64_t n, const paged_rows *keys,
                   const index_params *p);

/* Attention over chosen rows with one KV head (multi-head latent attention's
 * cache): query i, head h (q[i, h, 0..head_dim)) attends the rows
 * sel[i, 0..topk) that are >= 0: scores q . key_j * scale with key_j the
 * first head_dim floats of row j, softmax (in double), and out[i, h,
 * 0..v_dim) the weighted sum of the values, columns [v_off, v_off + v_dim)
 * of the same rows. */
typedef struct sparse_attn_params {
  int64_t n_heads, head_dim, v_off, v_dim, topk;
  float scale;
} sparse_attn_params;
void op_attention_sparse(hpool *pool, float *out, const float *q, int64_t n, const int32_t *sel, const paged_rows *kv,
                         const sparse_attn_params *p);
/* A low-rank (LoRA) delta added to n rows: for each row i,
 * t[j] = (float) sum_k x[i, k] * a[j, k] (j < r, the sum in double), then
 * y[i, o] += (float)(scale * sum_j t[j] * b[o, j]) (o < out, the sum in
 * double). x [n, in], a [r, in], b [out, r], y [n, out]; y must not alias x;
 * tmp: r floats of scratch (t). */
void op_lora(float *y, const float *x, int64_t n, int64_t in, const float *a, int64_t r, const float *b, int64_t out,
             float scale, float *tmp);

/* Converts stored weights to f32. */
void bk_bf16_to_f32(float *y, const uint16_t *x, int64_t n);
void bk_f16_to_f32(float *y, const uint16_t *x, int64_t n);
/* Rounds a float to the nearest bf16 / f16 value (round to nearest even), returned as float. */
float bk_round_bf16(float x);
float bk_round_f16(float x);

#endif
