/* train_view.c — the trainer's view of a loaded llama-family decoder
 * (train_view.h): host descriptors of the stored matrices, host copies of
 * the norm weights, the layers' RoPE tables and geometry. Refuses what the
 * trainer's layer does not run. Knows nothing of gradients. */
#include "model/train_view.h"

#include <stdlib.h>
#include <string.h>

#include "model/internal.h"

static int host_vector(const bk_tensor *t, int64_t n, const char *what, int l, float **out, herr *err) {
  *out = NULL;
  if (!t->buf || bk_nelem(t) != n) return herr_set(err, HEARTH_EINVAL, "layer %d has no %s of %lld floats", l, what, (long long)n);
  float *p = malloc((size_t)n * sizeof *p);
  if (!p) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  int rc = bk_get(t, 0, p, (size_t)n * sizeof *p, err);
  if (rc) {
    free(p);
    return rc;
  }
  *out = p;
  return 0;
}

/* A vector the layer may have (t->buf NULL: *out NULL). */
static int optional_vector(const bk_tensor *t, int64_t n, const char *what, int l, float **out, herr *err) {
  *out = NULL;
  return t->buf ? host_vector(t, n, what, l, out, err) : 0;
}

static int host_matrix(const bk_weight *w, int64_t rows, int64_t cols, const char *what, int l, herr *err) {
  if (!w->data || w->rows != rows || w->cols != cols)
    return herr_set(err, HEARTH_EINVAL,
                    "layer %d's %s is not a host matrix [%lld, %lld] (load the model on the CPU with f32 activations)",
                    l, what, (long long)rows, (long long)cols);
  return 0;
}

int train_view_get(model *m, train_view *v, herr *err) {
  memset(v, 0, sizeof *v);
  const model_config *c = &m->cfg;
  const model_family *f = m->fam;
  if (m->tp_size > 1) return herr_set(err, HEARTH_EINVAL, "a model spread over ranks is not trained");
  if (f->ops != &llama_family_ops || f->v_norm || c->num_experts > 0)
    return herr_set(err, HEARTH_EUNSUPPORTED,
                    "model_type '%s' is not trained yet (llama, mistral, qwen2, qwen3, smollm3, gemma2, gemma3 and phi3 are)",
                    c->model_type);
  if (m->no_head || m->n_towers)
    return herr_set(err, HEARTH_EUNSUPPORTED, "model_type '%s' has a head or towers the trainer does not run", c->model_type);
  v->hidden = c->hidden_size;
  v->heads = c->num_attention_heads;
  v->n_layers = c->num_hidden_layers;
  v->vocab = c->vocab_size;
  v->eps = (float)c->rms_norm_eps;
  v->attn_softcap = (float)c->attn_logit_softcapping;
  v->final_softcap = c->final_logit_softcapping > 0 ? (float)c->final_logit_softcapping : 0;
  v->embed_scale = m->embed_scale;
  v->unit_offset = f->unit_offset_norm;
  v->fused = f->fused_qkv;
  v->act = model_act(m);
  if (v->act != BK_ACT_SILU && v->act != BK_ACT_GELU_TANH)
    return herr_set(err, HEARTH_EUNSUPPORTED, "hidden_act '%s' is not trained yet (silu and gelu_pytorch_tanh are)", c->hidden_act);
  v->embed = m->embed;
  v->lm_head = m->lm_head;
  if (!v->embed.data || !v->lm_head.data || v->lm_head.rows != v->vocab || v->lm_head.cols != v->hidden)
    return herr_set(err, HEARTH_EINVAL, "the embedding or head is not in host memory (load the model on the CPU)");
  int rc = host_vector(&m->final_norm, v->hidden, "final norm", -1, &v->final_norm, err);
  if (rc) return rc;
  v->layers = calloc((size_t)v->n_layers, sizeof *v->layers);
  if (!v->layers) {
    train_view_free(v);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  for (int l = 0; l < v->n_layers; l++) {
    const layer_weights *lw = &m->layers[l];
    train_layer_view *tl = &v->layers[l];
    if (l == 0) {
      v->head_dim = lw->head_dim, v->kv_heads = lw->kv_heads, v->inter = lw->inter, v->attn_scale = lw->attn_scale;
    } else if (lw->head_dim != v->head_dim || lw->kv_heads != v->kv_heads || lw->inter != v->inter) {
      train_view_free(v);
      return herr_set(err, HEARTH_EUNSUPPORTED, "layers of different shapes are not trained yet (layer %d)", l);
    }
    if (lw->linear || lw->moe || lw->out_gate || lw->kv_src != l || lw->gate_bias.buf || lw->up_bias.buf ||
        lw->down_bias.buf || lw->scalar != 1.0f || lw->heads != v->heads || lw->attn_scale != v->attn_scale) {
      train_view_free(v);
      return herr_set(err, HEARTH_EUNSUPPORTED, "layer %d has parts the trainer does not run yet (MLP biases, "
                                          "linear attention, experts, shared KV, a scale of its own)", l);
    }
    int64_t D = v->hidden, Q = v->heads * v->head_dim, KV = v->kv_heads * v->head_dim, I = v->inter;
    tl->q = lw->q, tl->k = lw->k, tl->v = lw->v, tl->o = lw->o, tl->gate = lw->gate, tl->up = lw->up, tl->down = lw->down;
    tl->rope = lw->rope;
    tl->window = lw->window;
    if (v->fused) { /* the stored matrices the row ranges come from: rows follow one another */
      tl->qkv = lw->q, tl->qkv.rows = Q + 2 * KV, tl->qkv.packed = NULL, tl->qkv.packed_size = 0;
      tl->gate_up = lw->gate, tl->gate_up.rows = 2 * I, tl->gate_up.packed = NULL, tl->gate_up.packed_size = 0;
      size_t qrow = bk_row_bytes(lw->q.type, lw->q.cols, lw->q.bits), grow = bk_row_bytes(lw->gate.type, lw->gate.cols, lw->gate.bits);
      if (lw->q.type == BK_MLX_AFFINE || (const char *)lw->k.data != (const char *)lw->q.data + qrow * (size_t)Q ||
          (const char *)lw->up.data != (const char *)lw->gate.data + grow * (size_t)I) {
        train_view_free(v);
        return herr_set(err, HEARTH_EUNSUPPORTED, "layer %d: its fused projections are not stored as one matrix", l);
      }
    }
    if ((rc = host_matrix(&tl->q, Q, D, "q_proj", l, err)) || (rc = host_matrix(&tl->k, KV, D, "k_proj", l, err)) ||
        (rc = host_matrix(&tl->v, KV, D, "v_proj", l, err)) || (rc = host_matrix(&tl->o, D, Q, "o_proj", l, err)) ||
        (rc = host_matrix(&tl->gate, I, D, "gate_proj", l, err)) || (rc = host_matrix(&tl->up, I, D, "up_proj", l, err)) ||
        (rc = host_matrix(&tl->down, D, I, "down_proj", l, err)) ||
        (rc = host_vector(&lw->attn_norm, D, "input_layernorm", l, &tl->attn_norm, err)) ||
        (rc = optional_vector(&lw->q_bias, Q, "q_proj bias", l, &tl->q_bias, err)) ||
        (rc = optional_vector(&lw->k_bias, KV, "k_proj bias", l, &tl->k_bias, err)) ||
        (rc = optional_vector(&lw->v_bias, KV, "v_proj bias", l, &tl->v_bias, err)) ||
        (rc = optional_vector(&lw->o_bias, D, "o_proj bias", l, &tl->o_bias, err)) ||
        (rc = optional_vector(&lw->q_norm, v->head_dim, "q_norm", l, &tl->q_norm, err)) ||
        (rc = optional_vector(&lw->k_norm, v->head_dim, "k_norm", l, &tl->k_norm, err))) {
      train_view_free(v);
      return rc;
    }
    if (f->sandwich_norms) /* gemma: post_attention_layernorm is the attention output's norm */
      rc = host_vector(&lw->post_attn_norm, D, "post_attention_layernorm", l, &tl->attn_out_norm, err);
    if (!rc) rc = host_vector(f->sandwich_norms ? &lw->pre_ffn_norm : &lw->post_attn_norm, D,
                              f->sandwich_norms ? "pre_feedforward_layernorm" : "post_attention_layernorm", l, &tl->mlp_norm, err);
    if (!rc && f->sandwich_norms) rc = host_vector(&lw->post_ffn_norm, D, "post_feedforward_layernorm", l, &tl->mlp_out_norm, err);
    if (rc) {
      train_view_free(v);
      return rc;
    }
  }
  return 0;
}

void train_view_free(train_view *v) {
  if (!v) return;
  for (int64_t l = 0; v->layers && l < v->n_layers; l++) {
    train_layer_view *tl = &v->layers[l];
    free(tl->attn_norm), free(tl->mlp_norm), free(tl->attn_out_norm), free(tl->mlp_out_norm);
    free(tl->q_bias), free(tl->k_bias), free(tl->v_bias), free(tl->o_bias), free(tl->q_norm), free(tl->k_norm);
  }
  free(v->layers);
  free(v->final_norm);
  memset(v, 0, sizeof *v);
}
