/* grad.h — the backward passes LoRA training needs, as plain reference ops
 * on host floats beside the forward references of backend/ops.h: f32 in and
 * out, sums in double where the forward sums in double. Each is checked
 * against central finite differences of its forward (tests/train/test_grad.c).
 *
 * Shapes follow ops.h: row-major, [n, d] is n rows of d floats. "dy" is the
 * gradient of the loss with respect to a forward output y; a backward writes
 * the gradient of its inputs (dx: overwritten; parameter gradients da, db:
 * accumulated, so micro-batches add up). The embedding lookup stays frozen:
 * it needs no backward (its rows are the first layer's input, nothing more).
 */
#ifndef HEARTH_TRAIN_GRAD_H
#define HEARTH_TRAIN_GRAD_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/ops.h"
#include "backend/weights.h"
#include "base/pool.h"
#include "base/status.h"

/* RMSNorm, y = x · r · s with r = 1 / sqrt(mean(x²) + eps) and s = w, 1 + w
 * (unit_offset) or 1 (w NULL), as op_rmsnorm:
 *   dx_j = r s_j dy_j − x_j r³ / d · Σ_i dy_i s_i x_i;   dw_i += dy_i x_i r (dw may be NULL: frozen).
 * dx may equal dy. */
void grad_rmsnorm(float *dx, float *dw, const float *dy, const float *x, int64_t n, int64_t d, const float *w, float eps,
                  bool unit_offset);

/* RoPE's backward, in place on dx[n, n_heads, head_dim]: a rotation's
 * transpose, the rotation by −angle (times attn_scale, as the forward), for
 * every layout and table op_rope takes. */
void grad_rope(float *dx, int64_t n, int64_t n_heads, int64_t head_dim, const int64_t *pos, const rope_table *t);

/* Causal attention of one sequence of T tokens at positions 0..T−1 over its
 * own keys and values, as op_attention_ref computes it (GQA, window, softcap,
 * scale from p): q [T, H, hd], k / v [T, KVH, hd], out [T, H, hd]. */
void grad_attention_fwd(hpool *pool, float *out, const float *q, const float *k, const float *v, int64_t T,
                        const attn_params *p);
/* Its backward: dq [T, H, hd], dk / dv [T, KVH, hd], all overwritten. The
 * softmax is recomputed per query and head in double. */
void grad_attention(hpool *pool, float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                    const float *v, int64_t T, const attn_params *p);

/* The SiLU-gated product h = silu(g) · u (bk_act_mul with BK_ACT_SILU):
 * dg = dh · u · σ(g)(1 + g(1 − σ(g))), du = dh · silu(g). */
void grad_silu_mul(float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n);
/* The tanh-GELU-gated product h = gelu_tanh(g) · u (gemma's gelu_pytorch_tanh):
 * dg = dh · u · gelu_tanh'(g), du = dh · gelu_tanh(g). */
void grad_gelu_tanh_mul(float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n);

/* A frozen base matmul y = x · Wᵀ: dx[n, in] = dy[n, out] · W, W's rows
 * dequantized by bk_dequant_row (every stored format), sums in double.
 * The plain reference of the trainer's path through grad_weight_t. */
int grad_matmul_dx_ref(float *dx, const float *dy, int64_t n, const bk_weight *w, herr *err);
/* Wᵀ dequantized to f32: *wt describes [w->cols, w->rows] f32 in *data
 * (owned by the caller: free()), so bk_matmul(dy, wt) = dy · W. */
int grad_weight_t(const bk_weight *w, bk_weight *wt, float **data, herr *err);

/* LoRA on a frozen projection, y = x Wᵀ + s · (x Aᵀ) Bᵀ; a [r, in], b [out, r].
 * Forward of the delta: t[n, r] = x · Aᵀ (kept for the backward), y += s · t · Bᵀ
 * (sums in double). x may be dropout's masked and scaled input. */
void grad_lora_fwd(float *y, float *t, const float *x, int64_t n, int64_t in, const float *a, int64_t r, const float *b,
                   int64_t out, float s);
/* Backward: with dt = s · dy · B,  dA += dtᵀ · x,  dB += s · dyᵀ · t,  and
 * dx += dt · A when dx is not NULL (the base's dx is added elsewhere). */
void grad_lora(float *dx, float *da, float *db, const float *dy, const float *x, const float *t, int64_t n, int64_t in,
               const float *a, int64_t r, const float *b, int64_t out, float s);

/* Cross-entropy of next-token targets over the vocabulary through a frozen
 * head W [V, D]: logits = h · Wᵀ, computed `chunk` rows at a time (never
 * [n, V] at once; scratch: chunk · V floats), log-sum-exp in double. Rows
 * whose target is < 0 are masked: no loss, no gradient. Adds Σ −log p(target)
 * over the counted rows to *loss_sum and their count to *count; writes
 * dh[n, D] = dscale · (softmax − onehot) · W (masked rows: zeros) when dh is
 * not NULL. wt: Wᵀ as grad_weight_t makes it (needed with dh). */
int grad_cross_entropy(hpool *pool, double *loss_sum, int64_t *count, float *dh, const float *h, int64_t n, int64_t D,
                       const bk_weight *w, const bk_weight *wt, const int32_t *target, float dscale, int64_t chunk,
                       float *scratch, herr *err);
/* The same through a soft-capped head (softcap > 0: logits = c · tanh(h · Wᵀ / c), as gemma2's
 * final_logit_softcapping; 0: none). */
int grad_cross_entropy_capped(hpool *pool, double *loss_sum, int64_t *count, float *dh, const float *h, int64_t n, int64_t D,
                              const bk_weight *w, const bk_weight *wt, const int32_t *target, float dscale, float softcap,
                              int64_t chunk, float *scratch, herr *err);

#endif
