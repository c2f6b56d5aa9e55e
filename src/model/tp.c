/* tp.c — tensor parallelism: one model spread over N ranks of one process,
 * one thread per rank, each rank a whole `model` (its own backend: the CPU,
 * or GPU cuda:K + r) holding 1/N of every layer, driven in lockstep as one
 * model through model.h.
 *
 * The sharding, applied to the described weights before they go to the
 * backend (tp_shard): each family says how its own layers split through
 * its shard hook (family_ops.shard), built from the helpers here; a family
 * without one is refused. The llama decoder's families (llama, mistral,
 * qwen2, qwen3, smollm3, phi3, gemma2, gemma3_text), granite and qwen3_moe
 * take tp_shard_layers:
 *   attention   query heads split (rank r: heads [r H/N, (r+1) H/N)); KV
 *               heads split with them, or, fewer than N, replicated (each
 *               rank keeps the one KV head its query heads read; N a
 *               multiple of the KV heads); q / k / v (and their biases)
 *               column-parallel: row ranges of the stored matrices, no copy;
 *               o row-parallel: its input columns of those heads (copied),
 *               its bias added by rank 0 only, then an all-reduce.
 *   dense MLP   gate / up column-parallel, down row-parallel + all-reduce.
 *   MoE         every expert split by width (each rank 1/N of every expert's
 *               intermediate size) with the router replicated: each rank
 *               routes the same tokens to the same experts (identical inputs
 *               after the all-reduce), runs its slices, and one all-reduce
 *               sums them — the dense MLP's scheme, no backend change, every
 *               rank the same work whatever the routing (an expert split
 *               leaves ranks idle when a step's tokens pick few experts).
 *               A layer with both (a shared expert, a branch beside the
 *               MLP) splits both; norms are replicated everywhere.
 *   vocabulary  the embedding and the head split by rows (rank r: ids
 *               [r Vp, r Vp + its count), Vp = ceil(V / N)): a rank's
 *               embedding table has a zero row that ids outside its range
 *               read, so the all-reduce after the embedding sums one row
 *               and zeros; its head makes its logits columns, gathered.
 * Gemma 4 (gemma4.c): attention by heads as above, per layer with its own
 *               head size and KV heads (sliding and full layers alike; a
 *               KV-shared layer reads its source layer's heads, split the
 *               same way; keys as values need no v); the MLP (double-wide
 *               or not) and the MoE branch beside it by width, the router
 *               and its scales replicated. Per-layer inputs: the per-layer
 *               input gate and projection, per_layer_model_projection and
 *               its norm replicated (small, on the whole residual stream);
 *               the per-layer embedding table, the largest of all, split by
 *               vocabulary rows like the embedding, its lookups summed by
 *               one more all-reduce (vocab_size_per_layer_input must equal
 *               vocab_size).
 * Qwen3.5 (qwen3_5.c, qwen3_5_moe.c): gated full attention by heads (a
 *               head's query and output-gate rows of q_proj go together);
 *               Gated DeltaNet linear attention by heads too (tp_shard_
 *               deltanet): a rank keeps 1/N of the value heads and the key
 *               heads they read (split with them, or, fewer than N,
 *               replicated as KV heads are) — in_proj_qkv's q, k and v rows
 *               and the conv1d's channels of those heads gathered, in_proj_z
 *               / a / b, A_log and dt_bias column-parallel, the per-head
 *               gated norm replicated, out_proj row-parallel + all-reduce;
 *               each rank's recurrent state (the conv's last inputs and the
 *               heads' dk × dv matrices) holds its heads only, so the KV
 *               geometry's state_dim is the rank's. The MLP, or the routed
 *               experts and the shared expert (its sigmoid gate replicated),
 *               by width.
 * GLM-5 (glm5.c): latent attention by heads: q_b_proj's rows of a rank's
 *               heads (q_nope_h, q_rope_h) and kv_b_proj's (W_UK_h, W_UV_h)
 *               column-parallel, o_proj row-parallel + all-reduce; q_a_proj,
 *               kv_a_proj_with_mqa and their norms replicated, so every rank
 *               writes the same latent K rows (the latent cache replicated,
 *               the KV geometry unchanged); the DSA indexer replicated (every
 *               rank picks the same rows); the dense MLP, the experts and
 *               the shared experts by width.
 * LoRA adapters (lora.c) follow the projections' split: for a
 * column-parallel projection A is replicated and B split by output rows;
 * for a row-parallel one A is split by input columns and B replicated, and
 * the delta, a share like the projection's, is summed by the same
 * all-reduce. Deltas on routed experts are refused.
 * Shapes that do not divide are refused with a message naming the
 * dimension, as are column splits that do not fall on a quantized block.
 * Not split: DiffusionGemma (its canvas pass's soft embeddings need every
 * rank's vocabulary), and the multi-token-prediction layers of GLM-5 and
 * Qwen3.5 (loaded whole, not run on a split model).
 *
 * The group (tp_load, tp_forward): rank 0's model is the one the engine
 * holds; model_forward on it checks the batch and reserves KV rows once,
 * then every rank runs the forward on the same batch and its own arenas of
 * the one KV cache (kv_store_rank), rank 0 in the caller's thread, the
 * others in threads of their own. A rank that fails aborts the
 * communicator, so the others return from their collectives instead of
 * waiting; the group then refuses every later forward with the failure's
 * message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/vec.h"
#include "model/internal.h"

typedef struct tp_group {
  int n;
  model *rank[KV_MAX_RANKS];     /* rank[0]: the engine's model (not owned here); the others owned */
  pthread_t th[KV_MAX_RANKS];
  bool started[KV_MAX_RANKS];
  pthread_mutex_t mu;
  pthread_cond_t go, done;
  unsigned long job;             /* jobs posted */
  int pending;                   /* ranks still on the current job */
  bool quit;
  const model_batch *b;          /* borrowed: the job's batch */
  int rc[KV_MAX_RANKS];
  herr err[KV_MAX_RANKS];
  bool own[KV_MAX_RANKS];        /* the rank failed by itself (not by another's abort) */
  bk_tensor lg, hid;             /* rank 0's outputs */
  bool dead;                     /* a rank failed: every later forward is refused */
  herr dead_err;
} tp_group;

/* ---- sharding ---- */

int tp_refuse(const model *m, const char *dim, int64_t v, herr *err) {
  return herr_set(err, HEARTH_EUNSUPPORTED, "tensor parallelism: %s %lld does not split over %d ranks", dim, (long long)v, m->tp_size);
}

model *tp_rank_model(const model *m, int r) { return m->tp && r >= 0 && r < m->tp->n ? m->tp->rank[r] : (model *)m; }

/* Rows [r0, r0 + n) of *w, in place. */
static void keep_rows(bk_weight *w, int64_t r0, int64_t n) {
  if (w->rows) *w = model_sub_rows(w, r0, n);
}

/* Where LoRA target t's part of this rank lies in the stored matrix (before *w is cut). */
static void note_part(layer_weights *lw, int t, const bk_weight *w, int64_t row0, int64_t col0) {
  if (!w->rows) return;
  lw->part[t].row0 = row0, lw->part[t].col0 = col0;
  lw->part[t].rows = w->rows, lw->part[t].cols = w->cols;
}

int tp_keep_cols(model *m, bk_weight *w, int64_t c0, int64_t n, const char *what, herr *err) {
  if (!w->rows) return 0;
  int64_t blk = w->type == BK_MLX_AFFINE ? w->group_size : bk_type_block(w->type);
  if (c0 % blk || n % blk)
    return herr_set(err, HEARTH_EUNSUPPORTED,
                    "tensor parallelism: %s: %d ranks split its %lld inputs into %lld each, not a whole number of %s blocks of %lld",
                    what, m->tp_size, (long long)w->cols, (long long)n, bk_type_name(w->type), (long long)blk);
  size_t rb = bk_row_bytes(w->type, w->cols, w->bits), nb = bk_row_bytes(w->type, n, w->bits);
  size_t ob = c0 ? bk_row_bytes(w->type, c0, w->bits) : 0;
  size_t es = w->scale_type == BK_F32 ? 4 : 2, gs = w->type == BK_MLX_AFFINE ? (size_t)(w->cols / w->group_size) * es : 0;
  size_t gn = w->type == BK_MLX_AFFINE ? (size_t)(n / w->group_size) * es : 0, go = w->type == BK_MLX_AFFINE ? (size_t)(c0 / w->group_size) * es : 0;
  size_t bytes = (size_t)w->rows * (nb + 2 * gn);
  float *buf;
  int rc = model_own_floats(m, (int64_t)((bytes + 3) / 4), what, &buf, err);
  if (rc) return rc;
  char *d = (char *)buf, *sc = d + (size_t)w->rows * nb, *bi = sc + (size_t)w->rows * gn;
  for (int64_t r = 0; r < w->rows; r++) {
    memcpy(d + (size_t)r * nb, (const char *)w->data + (size_t)r * rb + ob, nb);
    if (gn) {
      memcpy(sc + (size_t)r * gn, (const char *)w->scales + (size_t)r * gs + go, gn);
      memcpy(bi + (size_t)r * gn, (const char *)w->biases + (size_t)r * gs + go, gn);
    }
  }
  w->data = d, w->cols = n;
  if (gn) w->scales = sc, w->biases = bi;
  return 0;
}

/* Columns [c0, c0 + n) of a [1, N] vector: a view. */
static void keep_vec(bk_tensor *t, int64_t c0, int64_t n) {
  if (!t->buf) return;
  t->off += (size_t)c0 * sizeof(float);
  t->cols = n;
}

/* The rows of n ranges [r0, r0 + len) of *w, one after another, copied into memory the model owns. */
static int gather_rows(model *m, bk_weight *w, const int64_t rg[][2], int n, const char *what, herr *err) {
  size_t rb = bk_row_bytes(w->type, w->cols, w->bits);
  size_t gs = w->type == BK_MLX_AFFINE ? (size_t)(w->cols / w->group_size) * (w->scale_type == BK_F32 ? 4 : 2)
              : w->type == BK_FP8        ? 4
                                         : 0;
  int64_t rows = 0;
  for (int i = 0; i < n; i++) rows += rg[i][1];
  size_t bytes = (size_t)rows * (rb + 2 * gs);
  float *buf;
  int rc = model_own_floats(m, (int64_t)((bytes + 3) / 4), what, &buf, err);
  if (rc) return rc;
  char *d = (char *)buf, *sc = d + (size_t)rows * rb, *bi = sc + (size_t)rows * gs;
  int64_t at = 0;
  for (int i = 0; i < n; i++) {
    memcpy(d + (size_t)at * rb, (const char *)w->data + (size_t)rg[i][0] * rb, (size_t)rg[i][1] * rb);
    if (gs) memcpy(sc + (size_t)at * gs, (const char *)w->scales + (size_t)rg[i][0] * gs, (size_t)rg[i][1] * gs);
    if (gs && w->type == BK_MLX_AFFINE)
      memcpy(bi + (size_t)at * gs, (const char *)w->biases + (size_t)rg[i][0] * gs, (size_t)rg[i][1] * gs);
    at += rg[i][1];
  }
  w->data = d, w->rows = rows;
  if (gs) w->scales = sc;
  if (gs && w->type == BK_MLX_AFFINE) w->biases = bi;
  return 0;
}

/* The rows (of `width` floats) of n ranges of a vector held as [1, rows × width], in a new tensor of the backend. */
static int gather_vec(model *m, bk_tensor *t, int64_t width, const int64_t rg[][2], int n, herr *err) {
  int64_t rows = 0;
  for (int i = 0; i < n; i++) rows += rg[i][1];
  if (m->n_bufs == m->cap_bufs && !HGROW(m->bufs, m->cap_bufs, m->n_bufs + 1)) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  bk_tensor out;
  int rc = bk_tensor_new(m->be, BK_DT_F32, 1, rows * width, &out, err);
  if (rc) return rc;
  m->bufs[m->n_bufs++] = out.buf;
  int64_t at = 0;
  for (int i = 0; i < n; i++) {
    bk_copy(&out, (size_t)(at * width) * sizeof(float), t, (size_t)(rg[i][0] * width) * sizeof(float),
            (size_t)(rg[i][1] * width) * sizeof(float));
    at += rg[i][1];
  }
  *t = out;
  return 0;
}

void tp_drop(model *m, bk_weight *w) {
  for (int i = 0; i < m->n_mats; i++)
    if (m->mats[i].w == w) {
      memmove(&m->mats[i], &m->mats[i + 1], sizeof m->mats[0] * (size_t)(m->n_mats - i - 1));
      m->n_mats--;
      break;
    }
  *w = (bk_weight){0};
}

/* The rows of the rank's vocabulary then one zero row (what ids of the other ranks read). */
static int embed_rows(model *m, bk_weight *w, int64_t r0, int64_t n, herr *err) {
  size_t rb = bk_row_bytes(w->type, w->cols, w->bits);
  size_t gs = w->type == BK_MLX_AFFINE ? (size_t)(w->cols / w->group_size) * (w->scale_type == BK_F32 ? 4 : 2) : 0;
  size_t bytes = (size_t)(n + 1) * (rb + 2 * gs);
  float *buf;
  int rc = model_own_floats(m, (int64_t)((bytes + 3) / 4), "embedding rows", &buf, err);
  if (rc) return rc;
  memset(buf, 0, bytes); /* zero bytes are zeros in every stored format (a scale of 0 included) */
  char *d = (char *)buf, *sc = d + (size_t)(n + 1) * rb, *bi = sc + (size_t)(n + 1) * gs;
  memcpy(d, (const char *)w->data + (size_t)r0 * rb, (size_t)n * rb);
  if (gs) {
    memcpy(sc, (const char *)w->scales + (size_t)r0 * gs, (size_t)n * gs);
    memcpy(bi, (const char *)w->biases + (size_t)r0 * gs, (size_t)n * gs);
    w->scales = sc, w->biases = bi;
  }
  w->data = d, w->rows = n + 1;
  return 0;
}

int tp_vocab_rows(model *m, bk_weight *w, const char *what, herr *err) {
  if (w->rows != m->cfg.vocab_size)
    return herr_set(err, HEARTH_EUNSUPPORTED, "tensor parallelism: %s has %lld rows, not the vocabulary's %lld", what,
                    (long long)w->rows, (long long)m->cfg.vocab_size);
  if (w->type == BK_FP8) return herr_set(err, HEARTH_EUNSUPPORTED, "tensor parallelism: %s: an FP8 table is not split", what);
  return embed_rows(m, w, m->vocab_lo, m->vocab_n, err);
}

int tp_shard_attention(model *m, int l, herr *err) {
  layer_weights *lw = &m->layers[l];
  int N = m->tp_size, r = m->tp_rank;
  int64_t H = lw->heads, KV = lw->kv_heads, hd = lw->head_dim, qh = lw->out_gate ? 2 * hd : hd, Hl = H / N, KVl, kv0;
  if (H % N) return tp_refuse(m, "num_attention_heads", H, err);
  if (KV >= N) {
    if (KV % N) return tp_refuse(m, "num_key_value_heads", KV, err);
    KVl = KV / N, kv0 = r * KVl;
  } else { /* replicated: the KV head this rank's query heads read */
    if (N % KV) return tp_refuse(m, "num_key_value_heads (fewer than the ranks, and not dividing them)", KV, err);
    KVl = 1, kv0 = r / (N / KV);
  }
  note_part(lw, LORA_Q, &lw->q, r * Hl * qh, 0);
  note_part(lw, LORA_K, &lw->k, kv0 * hd, 0);
  note_part(lw, LORA_V, &lw->v, kv0 * hd, 0);
  note_part(lw, LORA_O, &lw->o, 0, r * Hl * hd);
  keep_rows(&lw->q, r * Hl * qh, Hl * qh);
  keep_rows(&lw->k, kv0 * hd, KVl * hd);
  keep_rows(&lw->v, kv0 * hd, KVl * hd);
  keep_vec(&lw->q_bias, r * Hl * qh, Hl * qh);
  keep_vec(&lw->k_bias, kv0 * hd, KVl * hd);
  keep_vec(&lw->v_bias, kv0 * hd, KVl * hd);
  char what[160];
  snprintf(what, sizeof what, "model.layers.%d.self_attn.o_proj.weight", l);
  int rc = tp_keep_cols(m, &lw->o, r * Hl * hd, Hl * hd, what, err);
  if (rc) return rc;
  if (r) lw->o_bias = (bk_tensor){0}; /* added once, before the sum */
  lw->heads = Hl, lw->kv_heads = KVl;
  return 0;
}

int tp_shard_ffn(model *m, layer_weights *lw, int l, herr *err) {
  const model_config *c = &m->cfg;
  int N = m->tp_size, r = m->tp_rank, rc;
  char what[160];
  if (lw->moe && lw->ex.n) {
    int64_t I = c->moe_intermediate_size, Il = I / N, E = lw->ex.n;
    if (I % N) return tp_refuse(m, "moe_intermediate_size", I, err);
    for (int64_t e = 0; e < E; e++) {
      keep_rows(&lw->experts[e], r * Il, Il);
      keep_rows(&lw->experts[E + e], r * Il, Il);
      snprintf(what, sizeof what, "model.layers.%d.mlp.experts.%lld.down_proj", l, (long long)e);
      if ((rc = tp_keep_cols(m, &lw->experts[2 * E + e], r * Il, Il, what, err))) return rc;
    }
  }
  if (lw->gate.rows) {
    int64_t I = lw->inter, Il = I / N;
    if (I % N) return tp_refuse(m, lw->moe ? "the shared expert's intermediate size" : "intermediate_size", I, err);
    note_part(lw, LORA_GATE, &lw->gate, r * Il, 0);
    note_part(lw, LORA_UP, &lw->up, r * Il, 0);
    note_part(lw, LORA_DOWN, &lw->down, 0, r * Il);
    keep_rows(&lw->gate, r * Il, Il);
    keep_rows(&lw->up, r * Il, Il);
    keep_vec(&lw->gate_bias, r * Il, Il);
    keep_vec(&lw->up_bias, r * Il, Il);
    snprintf(what, sizeof what, "model.layers.%d.mlp.down_proj.weight", l);
    if ((rc = tp_keep_cols(m, &lw->down, r * Il, Il, what, err))) return rc;
    if (r) lw->down_bias = (bk_tensor){0};
    lw->inter = Il;
  }
  return 0;
}

int tp_shard_deltanet(model *m, int l, herr *err) {
  layer_weights *lw = &m->layers[l];
  int N = m->tp_size, r = m->tp_rank, rc;
  int64_t nk = lw->lin_k_heads, nv = lw->lin_v_heads, dk = lw->lin_k_dim, dv = lw->lin_v_dim;
  int64_t K = lw->conv_kernel, nkl, k0, nvl = nv / N;
  if (nv % N) return tp_refuse(m, "linear_num_value_heads", nv, err);
  if (nk >= N) {
    if (nk % N) return tp_refuse(m, "linear_num_key_heads", nk, err);
    nkl = nk / N, k0 = r * nkl;
  } else { /* replicated: the key head this rank's value heads read */
    if (N % nk) return tp_refuse(m, "linear_num_key_heads (fewer than the ranks, and not dividing them)", nk, err);
    nkl = 1, k0 = r / (N / nk);
  }
  /* the conv's channels and in_proj_qkv's rows: this rank's q heads, its k heads, its v heads */
  const int64_t rg[3][2] = {{k0 * dk, nkl * dk}, {nk * dk + k0 * dk, nkl * dk}, {2 * nk * dk + r * nvl * dv, nvl * dv}};
  char what[160];
  snprintf(what, sizeof what, "model.layers.%d.linear_attn.in_proj_qkv.weight", l);
  if ((rc = gather_rows(m, &lw->in_qkv, rg, 3, what, err))) return rc;
  if ((rc = gather_vec(m, &lw->conv_w, K, rg, 3, err))) return herr_wrap(err, "model.layers.%d.linear_attn.conv1d.weight", l);
  keep_rows(&lw->in_z, r * nvl * dv, nvl * dv);
  keep_rows(&lw->in_a, r * nvl, nvl);
  keep_rows(&lw->in_b, r * nvl, nvl);
  keep_vec(&lw->a_log, r * nvl, nvl);
  keep_vec(&lw->dt_bias, r * nvl, nvl);
  snprintf(what, sizeof what, "model.layers.%d.linear_attn.out_proj.weight", l);
  if ((rc = tp_keep_cols(m, &lw->out_proj, r * nvl * dv, nvl * dv, what, err))) return rc;
  lw->lin_k_heads = nkl, lw->lin_v_heads = nvl;
  lw->state_dim = (K - 1) * (2 * nkl * dk + nvl * dv) + nvl * dk * dv;
  return 0;
}

int tp_shard_layers(model *m, herr *err) {
  int rc = 0;
  for (int l = 0; l < m->cfg.num_hidden_layers && !rc; l++)
    if (!(rc = tp_shard_attention(m, l, err))) rc = tp_shard_ffn(m, &m->layers[l], l, err);
  return rc;
}

int tp_shard(model *m, herr *err) {
  const model_config *c = &m->cfg;
  int N = m->tp_size, r = m->tp_rank, rc;
  const family_ops *ops = m->fam->ops;
  if (!ops->shard)
    return herr_set(err, HEARTH_EUNSUPPORTED, "tensor parallelism: model_type '%s' is not split over ranks", c->model_type);
  if (m->no_head) return herr_set(err, HEARTH_EUNSUPPORTED, "tensor parallelism: a model without an output head is not split");
  /* the vocabulary: rows [v0, v0 + n) of the embedding (then a zero row) and of the head */
  int64_t V = c->vocab_size, Vp = (V + N - 1) / N, v0 = r * Vp, n = V - v0 < Vp ? V - v0 : Vp;
  if (n <= 0) return tp_refuse(m, "vocab_size", V, err);
  m->vocab_lo = v0, m->vocab_n = n, m->vocab_pad = Vp;
  if ((rc = ops->shard(m, err))) return rc;
  if (m->tied) { /* the head gets a descriptor of its own: the embedding's rows change below */
    m->lm_head = m->embed;
    m->tied = false;
  }
  keep_rows(&m->lm_head, v0, n);
  return embed_rows(m, &m->embed, v0, n, err);
}

/* ---- the forward's collectives ---- */

void model_reduce(model *m, const bk_tensor *x) {
  if (m->comm) bk_all_reduce_sum(m->comm, x);
}

int tp_reserve(model *m, int64_t R, herr *err) {
  if (R <= m->tp_cap_r) return 0;
  int64_t cap = m->tp_cap_r ? m->tp_cap_r : 4, N = m->tp_size, Vp = m->vocab_pad;
  while (cap < R) cap *= 2;
  bk_buf *buf; /* this rank's logits [cap, Vp], then every rank's [N cap, Vp] */
  int rc = bk_buf_new(m->be, (size_t)((1 + N) * cap * Vp) * sizeof(float), &buf, err);
  if (rc) return herr_wrap(err, "model_forward: the head's logits for %lld rows", (long long)cap);
  bk_buf_free(m->tp_buf);
  m->tp_buf = buf, m->tp_cap_r = cap;
  return 0;
}

int model_head(model *m, const bk_tensor *lg, const bk_tensor *x, herr *err) {
  if (!m->comm) {
    bk_matmul_t(lg, x, &m->lm_head, NULL);
    return 0;
  }
  int64_t R = x->rows, Vp = m->vocab_pad, N = m->tp_size, V = m->cfg.vocab_size;
  if (R > m->tp_cap_r) return herr_set(err, HEARTH_EINTERNAL, "model_forward: the head's buffers were not reserved");
  bk_tensor mine = {.buf = m->tp_buf, .dt = BK_DT_F32, .rows = R, .cols = m->vocab_n};
  bk_matmul_t(&mine, x, &m->lm_head, NULL);
  bk_tensor padded = {.buf = m->tp_buf, .dt = BK_DT_F32, .rows = R, .cols = Vp};
  bk_tensor all = {.buf = m->tp_buf, .off = (size_t)(R * Vp) * sizeof(float), .dt = BK_DT_F32, .rows = N * R, .cols = Vp};
  bk_all_gather(m->comm, &all, &padded);
  for (int64_t k = 0; k < N; k++) {
    int64_t n = V - k * Vp < Vp ? V - k * Vp : Vp; /* rank k's columns, its first R * n floats */
    bk_tensor part = {.buf = m->tp_buf, .off = (size_t)((1 + k) * R * Vp) * sizeof(float), .dt = BK_DT_F32, .rows = R, .cols = n};
    bk_set_cols(lg, &part, k * Vp);
  }
  return 0;
}

/* ---- the group ---- */

/* Rank r's part of the current job; on failure the group's communicator is aborted. */
static void run_rank(tp_group *g, int r) {
  model *m = g->rank[r];
  bk_tensor lg = {0}, hid = {0};
  herr e = {0};
  int rc = bk_sync(m->be, &e); /* (a GPU's backend also makes its device this thread's) */
  if (!rc) rc = model_forward_rank(m, g->b, &lg, &hid, FWD_RANK, &e);
  if (!rc) rc = bk_sync(m->be, &e);
  bool own = rc != 0 || m->comm->origin;
  if (!rc) rc = bk_comm_status(m->comm, &e);
  if (rc) {
    char why[300];
    snprintf(why, sizeof why, "rank %d (%s): %s", r, bk_backend_name(m->be), e.msg);
    bk_comm_abort(m->comm, why);
  }
  g->rc[r] = rc, g->err[r] = e, g->own[r] = own;
  if (r == 0) g->lg = lg, g->hid = hid;
}

typedef struct rank_arg {
  tp_group *g;
  int r;
} rank_arg;

static void *rank_main(void *arg) {
  rank_arg a = *(rank_arg *)arg;
  free(arg);
  tp_group *g = a.g;
  unsigned long seen = 0;
  for (;;) {
    pthread_mutex_lock(&g->mu);
    while (g->job == seen && !g->quit) pthread_cond_wait(&g->go, &g->mu);
    if (g->quit) {
      pthread_mutex_unlock(&g->mu);
      return NULL;
    }
    seen = g->job;
    pthread_mutex_unlock(&g->mu);
    run_rank(g, a.r);
    pthread_mutex_lock(&g->mu);
    if (--g->pending == 0) pthread_cond_signal(&g->done);
    pthread_mutex_unlock(&g->mu);
  }
}

int tp_forward(model *m, const model_batch *b, bk_tensor *lg, bk_tensor *hid, herr *err) {
  tp_group *g = m->tp;
  if (g->dead) {
    if (err) *err = g->dead_err;
    return g->dead_err.code;
  }
  int rc = model_forward_rank(m, b, NULL, NULL, FWD_CHECK, err); /* the batch checked, KV rows reserved, once */
  if (rc) return rc;
  pthread_mutex_lock(&g->mu);
  g->b = b;
  g->pending = g->n - 1;
  g->job++;
  pthread_cond_broadcast(&g->go);
  pthread_mutex_unlock(&g->mu);
  run_rank(g, 0);
  pthread_mutex_lock(&g->mu);
  while (g->pending > 0) pthread_cond_wait(&g->done, &g->mu);
  pthread_mutex_unlock(&g->mu);
  int bad = -1;
  for (int r = 0; r < g->n; r++)
    if (g->rc[r] && (bad < 0 || (g->own[r] && !g->own[bad]))) bad = r; /* the rank that failed first-hand */
  if (bad >= 0) {
    g->dead = true;
    herr_set(&g->dead_err, HEARTH_EIO, "tensor-parallel group stopped: rank %d (%s) failed: %s", bad,
             bk_backend_name(g->rank[bad]->be), g->err[bad].msg);
    HLOG_ERROR("%s", g->dead_err.msg);
    if (err) *err = g->dead_err;
    return g->dead_err.code;
  }
  *lg = g->lg, *hid = g->hid;
  return 0;
}

bk_comm *tp_rank_comm(const model *m, int r) { return m->tp && r >= 0 && r < m->tp->n ? m->tp->rank[r]->comm : m->comm; }

void tp_geometry(const model *m, model_kv_geometry *g) {
  g->n_ranks = m->tp->n;
  for (int r = 0; r < m->tp->n; r++) g->rank_backend[r] = m->tp->rank[r]->be;
}

void tp_free(model *m) {
  bk_buf_free(m->tp_buf);
  m->tp_buf = NULL;
  tp_group *g = m->tp;
  if (g) {
    pthread_mutex_lock(&g->mu);
    g->quit = true;
    pthread_cond_broadcast(&g->go);
    pthread_mutex_unlock(&g->mu);
    for (int r = 1; r < g->n; r++)
      if (g->started[r]) pthread_join(g->th[r], NULL);
    m->tp = NULL;
    for (int r = 1; r < g->n; r++) model_free(g->rank[r]);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->go);
    pthread_cond_destroy(&g->done);
    free(g);
  }
  bk_comm_free(m->comm);
  m->comm = NULL;
}

/* "cuda:K" -> K (0 for "cuda"). */
static int cuda_index(const char *name) {
  const char *c = strchr(name, ':');
  return c ? atoi(c + 1) : 0;
}

int tp_load(const char *dir, const model_load_opts *opts, model **out, herr *err) {
  *out = NULL;
  int N = opts->tensor_parallel;
  if (N > KV_MAX_RANKS) return herr_set(err, HEARTH_EINVAL, "--tensor-parallel %d: at most %d ranks", N, KV_MAX_RANKS);
  if (opts->backend) return herr_set(err, HEARTH_EINVAL, "tensor parallelism: a model that borrows another's backend cannot be split");
  if (opts->expert_budget > 0)
    return herr_set(err, HEARTH_EUNSUPPORTED, "tensor parallelism: --expert-budget cannot be combined with --tensor-parallel");
  model_load_opts o = *opts;
  o.tensor_parallel = 0;
  if (opts->geometry_only) return model_load_rank(dir, &o, 0, 0, out, err); /* the whole model's geometry */
  int threads = opts->threads > 0 ? opts->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
  tp_group *g = calloc(1, sizeof *g);
  if (!g) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->go, NULL);
  pthread_cond_init(&g->done, NULL);
  g->n = N;
  int rc = 0;
  char dev[32];
  bk_backend *bes[KV_MAX_RANKS];
  for (int r = 0; r < N && !rc; r++) {
    if (r > 0) { /* the ranks after the first: the CPU again, or the next GPUs */
      if (bk_backend_is_cpu(g->rank[0]->be)) snprintf(dev, sizeof dev, "cpu");
      else snprintf(dev, sizeof dev, "cuda:%d", cuda_index(bk_backend_name(g->rank[0]->be)) + r);
      o.device = dev;
    }
    o.threads = threads / N > 0 ? threads / N : 1; /* the CPU's threads shared out */
    if ((rc = model_load_rank(dir, &o, r, N, &g->rank[r], err))) herr_wrap(err, "tensor-parallel rank %d", r);
    else bes[r] = g->rank[r]->be;
  }
  bk_comm *comms[KV_MAX_RANKS] = {0};
  if (!rc) rc = bk_backend_is_cpu(bes[0]) ? bk_comm_inproc_new(N, comms, err) : bk_comm_nccl_new(bes, N, comms, err);
  if (rc) {
    for (int r = 0; r < N; r++) model_free(g->rank[r]);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->go);
    pthread_cond_destroy(&g->done);
    free(g);
    return rc;
  }
  for (int r = 0; r < N; r++) g->rank[r]->comm = comms[r];
  model *m = g->rank[0];
  m->tp = g;
  for (int r = 1; r < N && !rc; r++) {
    rank_arg *a = malloc(sizeof *a);
    if (!a) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    else {
      *a = (rank_arg){g, r};
      if (pthread_create(&g->th[r], NULL, rank_main, a)) {
        free(a);
        rc = herr_set(err, HEARTH_EIO, "tensor parallelism: cannot start the thread of rank %d", r);
      } else {
        g->started[r] = true;
      }
    }
  }
  if (rc) {
    model_free(m);
    return rc;
  }
  HLOG_INFO("%s: split over %d ranks (%s .. %s)", dir, N, bk_backend_name(bes[0]), bk_backend_name(bes[N - 1]));
  *out = m;
  return 0;
}
