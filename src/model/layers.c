/* layers.c — the blocks every decoder family builds its forward from, as
 * sequences of backend ops over a step's activations: attention (norm,
 * projections, per-head q/k/v norms, RoPE, the paged KV write, attention,
 * output projection, optional post-norm, the model's residual scale,
 * residual add; a layer may read another layer's KV rows instead of writing
 * its own; an optional output gate), linear attention (Gated DeltaNet:
 * projections, the causal conv1d and the gated delta rule over each
 * sequence's recurrent state, the gated RMSNorm, output projection), the
 * dense gated MLP and the mixture of experts (router matmul, top-k routing,
 * the experts).
 * What differs between families is data in the layer's weights and the
 * family's switches; how blocks are put together is each family's file. */
#include <string.h>

#include "model/internal.h"

static const bk_tensor *opt(const bk_tensor *t) { return t->buf ? t : NULL; }

bk_act model_act(const model *m) {
  const char *act = m->cfg.hidden_act;
  if (!strcmp(act, "silu") || !strcmp(act, "swish")) return BK_ACT_SILU;
  if (!strcmp(act, "gelu")) return BK_ACT_GELU;
  if (!strcmp(act, "relu")) return BK_ACT_RELU;
  return BK_ACT_GELU_TANH; /* gelu_pytorch_tanh, gelu_new, gelu_fast */
}

void layer_norm(const model *m, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w) {
  bk_rmsnorm(y, x, w && w->buf ? w : NULL, (float)m->cfg.rms_norm_eps, m->fam->unit_offset_norm);
}

void layer_add_norm(const model *m, step *st, const bk_tensor *o, const bk_tensor *w) {
  bk_add_rmsnorm(&st->x, o, &st->xn, w && w->buf ? w : NULL, (float)m->cfg.rms_norm_eps, m->fam->unit_offset_norm);
}

void layer_attention(model *m, int l, const kv_store *kv, step *st) { layer_attention_of(m, &m->layers[l], l, kv, st); }

void layer_mtp_input(model *m, step *st, const bk_tensor *h, const bk_tensor *enorm, const bk_tensor *hnorm,
                     const bk_weight *fc) {
  int64_t D = m->cfg.hidden_size;
  bk_tensor cat = st->fam; /* [T, 2D] (w_fam is at least 2D with an MTP layer) */
  cat.rows = st->T, cat.cols = 2 * D, cat.dt = BK_DT_F32;
  layer_norm(m, &st->xn, &st->x, enorm);
  bk_set_cols(&cat, &st->xn, 0);
  layer_norm(m, &st->xn, h, hnorm);
  bk_set_cols(&cat, &st->xn, D);
  bk_matmul_t(&st->x, &cat, fc, NULL);
}

/* Columns [c0, c0 + n) of a one-row tensor, as a tensor of its own. */
static bk_tensor row_slice(const bk_tensor *t, int64_t c0, int64_t n) {
  bk_tensor v = *t;
  v.off += (size_t)c0 * bk_dtype_size(t->dt);
  v.cols = n;
  return v;
}

void layer_attention_of(model *m, const layer_weights *lw, int l, const kv_store *kv, step *st) {
  const model_config *c = &m->cfg;
  int64_t T = st->T, H = lw->heads, hd = lw->head_dim, KV = lw->kv_heads;
  float eps = (float)c->rms_norm_eps;
  bk_tensor q = step_view(&st->q, T, H * hd), k = step_view(&st->k, T, KV * hd), v = step_view(&st->v, T, KV * hd);
  bk_tensor att = step_view(&st->att, T, H * hd);
  bk_tensor gate = step_view(&st->gate, T, H * hd);
  if (st->xn_ready == l && lw == &m->layers[l]) st->xn_ready = -1; /* the previous layer's add left the norm in xn */
  else layer_norm(m, &st->xn, &st->x, &lw->attn_norm);
  /* one row and q, k, v stacked (decoder.c): one product, the three as slices of its row */
  bool stacked = lw->qkv.data && st->one.buf;
  /* stacked, with nothing between the product and RoPE: q and k (adjacent in the row) turn in one call */
  bool rope_qk = stacked && lw->rope && !lw->q_norm.buf && !lw->k_norm.buf && lw->kv_src == l;
  bk_tensor all = {0};
  if (stacked) {
    all = step_view(&st->one, 1, lw->qkv.rows);
    bk_matmul_t(&all, &st->xn, &lw->qkv, NULL);
    q = row_slice(&all, 0, H * hd), k = row_slice(&all, H * hd, KV * hd), v = row_slice(&all, (H + KV) * hd, KV * hd);
    layer_lora(st, l, LORA_Q, &q, &st->xn);
  } else if (lw->out_gate) { /* per head: hd of query, then hd of gate */
    bk_tensor qg = step_view(&st->att, T * H, 2 * hd), qh = bk_reshape(&q, T * H, hd), gh = bk_reshape(&gate, T * H, hd);
    bk_tensor qg_flat = bk_reshape(&qg, T, 2 * H * hd);
    bk_matmul_t(&qg_flat, &st->xn, &lw->q, opt(&lw->q_bias));
    layer_lora(st, l, LORA_Q, &qg_flat, &st->xn); /* the delta covers query and gate rows alike */
    bk_get_cols(&qh, &qg, 0);
    bk_get_cols(&gh, &qg, hd);
  } else {
    bk_matmul_t(&q, &st->xn, &lw->q, opt(&lw->q_bias));
    layer_lora(st, l, LORA_Q, &q, &st->xn);
  }
  if (lw->q_norm.buf) {
    bk_tensor qh = bk_reshape(&q, T * H, hd);
    layer_norm(m, &qh, &qh, &lw->q_norm);
  }
  if (lw->rope && !rope_qk) bk_rope(&q, H, hd, &st->pos, lw->rope);
  if (lw->kv_src == l) { /* this layer's own keys and values, into its cache rows */
    if (!stacked) bk_matmul_t(&k, &st->xn, &lw->k, opt(&lw->k_bias));
    layer_lora(st, l, LORA_K, &k, &st->xn);
    if (lw->v.rows) {
      if (!stacked) bk_matmul_t(&v, &st->xn, &lw->v, opt(&lw->v_bias));
      layer_lora(st, l, LORA_V, &v, &st->xn);
    }
    const bk_tensor *vsrc = lw->v.rows ? &v : &k; /* keys as values: the raw key projection */
    bk_tensor vh = bk_reshape(&v, T * KV, hd), vs = bk_reshape(vsrc, T * KV, hd);
    if (m->fam->v_norm) bk_rmsnorm(&vh, &vs, NULL, eps, false);
    else if (!lw->v.rows) bk_copy(&v, 0, &k, 0, bk_nbytes(&k));
    if (lw->k_norm.buf) {
      bk_tensor kh = bk_reshape(&k, T * KV, hd);
      layer_norm(m, &kh, &kh, &lw->k_norm);
    }
    if (rope_qk) {
      bk_tensor qk = row_slice(&all, 0, (H + KV) * hd);
      bk_rope(&qk, H + KV, hd, &st->pos, lw->rope);
    } else if (lw->rope) bk_rope(&k, KV, hd, &st->pos, lw->rope);
    bk_kv_layer kl = {&kv->k[l], &kv->v[l], kv->block_rows, kv->k_fmt[l], kv->v_fmt[l]};
    bk_kv_write(&kl, &k, &v, &st->slot);
  }
  int src = lw->kv_src;
  bk_kv_layer kl = {&kv->k[src], &kv->v[src], kv->block_rows, kv->k_fmt[src], kv->v_fmt[src]};
  attn_params ap = {H, (src == l ? lw : &m->layers[src])->kv_heads, hd, lw->attn_scale, (float)c->attn_logit_softcapping,
                    lw->window ? lw->window + st->window_extra : 0};
  bk_attn_index ix = {.row = &st->row, .tab = &st->tab, .tables = &st->tables,
                      .last = st->has_last && lw->bidir_media ? &st->last : NULL};
  bk_attention(&att, &q, &kl, &ix, &ap);
  if (lw->out_gate) bk_sigmoid_mul(&att, &gate);
  bk_tensor o = step_view(&st->o, T, c->hidden_size);
  bk_matmul_t(&o, &att, &lw->o, opt(&lw->o_bias));
  layer_lora(st, l, LORA_O, &o, &att);
  model_reduce(m, &o); /* row-parallel: each rank's heads' share */
  if (m->fam->sandwich_norms) layer_norm(m, &o, &o, &lw->post_attn_norm);
  if (m->residual_scale) bk_scale(&o, m->residual_scale);
  if (st->norm_after_attn) {
    layer_add_norm(m, st, &o, st->norm_after_attn);
    st->norm_after_attn = NULL;
  } else {
    bk_add(&st->x, &st->x, &o);
  }
}

void layer_mlp(model *m, const layer_weights *lw, step *st, const bk_tensor *in, const bk_tensor *out) {
  bk_tensor gate = step_view(&st->gate, st->T, lw->inter), up = step_view(&st->up, st->T, lw->inter);
  int l = (int)(lw - m->layers);
  if (lw->gate_up.data && st->one.buf) { /* one row, gate and up stacked: one product */
    bk_tensor both = step_view(&st->one, 1, lw->gate_up.rows);
    bk_matmul_t(&both, in, &lw->gate_up, NULL);
    gate = row_slice(&both, 0, lw->gate.rows), up = row_slice(&both, lw->gate.rows, lw->up.rows);
  } else {
    bk_matmul_t(&gate, in, &lw->gate, opt(&lw->gate_bias));
    bk_matmul_t(&up, in, &lw->up, opt(&lw->up_bias));
  }
  layer_lora(st, l, LORA_GATE, &gate, in);
  layer_lora(st, l, LORA_UP, &up, in);
  bk_act_mul(&gate, &up, model_act(m));
  bk_matmul_t(out, &gate, &lw->down, opt(&lw->down_bias));
  layer_lora(st, l, LORA_DOWN, out, &gate);
  model_reduce(m, out); /* row-parallel: each rank's share of the width */
}

void layer_route(model *m, const layer_weights *lw, step *st, const bk_tensor *route_in) {
  const model_config *c = &m->cfg;
  int64_t T = st->T, E = c->num_experts, K = c->num_experts_per_tok;
  bk_tensor logits = step_view(&st->elog, T, E), ids = step_view(&st->eids, T, K), w = step_view(&st->ew, T, K);
  bk_matmul_t(&logits, route_in, &lw->router, NULL);
  bk_moe_route(&ids, &w, &logits, c->norm_topk_prob, opt(&lw->expert_scale));
}

void layer_experts(model *m, const layer_weights *lw, step *st, const bk_tensor *in, const bk_tensor *out) {
  int64_t T = st->T, K = m->cfg.num_experts_per_tok;
  bk_tensor ids = step_view(&st->eids, T, K), w = step_view(&st->ew, T, K);
  bool budget = m->xc.budget > 0;
  if (budget && !m->xc.err.code && experts_acquire(m, (int)(lw - m->layers), &ids, &m->xc.err)) return;
  bk_moe(out, in, &ids, &w, &lw->ex, model_act(m));
  /* rows whose adapters change the experts: their experts again, with the deltas */
  int l = (int)(lw - m->layers);
  for (int i = 0; i < st->n_lora; i++) {
    const bk_expert_lora *xl[MODEL_MAX_LORA];
    bk_experts ex = lw->ex;
    if (!layer_lora_experts(st, l, i, xl, &ex.n_lora)) continue;
    ex.lora = xl;
    const lora_run *run = &st->lora[i];
    bk_tensor yr = bk_rows(out, run->t0, run->rows), xr = bk_rows(in, run->t0, run->rows);
    bk_tensor ir = bk_rows(&ids, run->t0, run->rows), wr = bk_rows(&w, run->t0, run->rows);
    bk_moe(&yr, &xr, &ir, &wr, &ex, model_act(m));
  }
  model_reduce(m, out); /* each rank holds a share of every expert's width */
  if (budget) experts_trim(m);
}

void layer_moe(model *m, const layer_weights *lw, step *st, const bk_tensor *route_in, const bk_tensor *in, const bk_tensor *out) {
  layer_route(m, lw, st, route_in);
  layer_experts(m, lw, st, in, out);
}

void layer_deltanet(model *m, int l, const kv_store *kv, step *st) {
  const model_config *c = &m->cfg;
  const layer_weights *lw = &m->layers[l];
  int64_t T = st->T, nk = lw->lin_k_heads, nv = lw->lin_v_heads, dk = lw->lin_k_dim;
  int64_t dv = lw->lin_v_dim, C = 2 * nk * dk + nv * dv, K = lw->conv_kernel;
  bk_tensor qkv = step_view(&st->q, T, C), mixed = step_view(&st->att, T, C), z = step_view(&st->gate, T, nv * dv);
  bk_tensor a = step_view(&st->k, T, nv), b = step_view(&st->v, T, nv), o = step_view(&st->up, T, nv * dv);
  layer_norm(m, &st->xn, &st->x, &lw->attn_norm);
  bk_matmul_t(&qkv, &st->xn, &lw->in_qkv, NULL);
  bk_matmul_t(&z, &st->xn, &lw->in_z, NULL);
  bk_matmul_t(&a, &st->xn, &lw->in_a, NULL);
  bk_matmul_t(&b, &st->xn, &lw->in_b, NULL);
  bk_tensor w = bk_reshape(&lw->conv_w, C, K);
  bk_recurrent conv = {&kv->state[l], 0, &st->rseqs, st->keep}, rule = {&kv->state[l], (K - 1) * C, &st->rseqs, st->keep};
  bk_conv1d(&mixed, &qkv, &w, &conv, model_act(m) == BK_ACT_SILU);
  delta_params p = {nk, nv, dk, dv};
  bk_delta_rule(&o, &mixed, &a, &b, &lw->a_log, &lw->dt_bias, &rule, &p);
  /* gated RMSNorm per value head: norm(o) · w · silu(z) (w itself, not 1 + w) */
  bk_tensor oh = bk_reshape(&o, T * nv, dv);
  bk_rmsnorm(&oh, &oh, &lw->lin_norm, (float)c->rms_norm_eps, false);
  bk_act_mul(&z, &o, BK_ACT_SILU);
  bk_tensor out = step_view(&st->o, T, c->hidden_size);
  bk_matmul_t(&out, &z, &lw->out_proj, NULL);
  model_reduce(m, &out); /* row-parallel: each rank's value heads' share */
  bk_add(&st->x, &st->x, &out);
}
