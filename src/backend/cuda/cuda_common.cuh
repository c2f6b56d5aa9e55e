/* cuda_common.cuh — the CUDA backend's handle (stream, cuBLAS, scratch, rope
 * cache, sticky error), the error-recording calls every op uses, the grid
 * helpers of the element-wise kernels (grid_for, GRID_LOOP), and the entry
 * points each .cu file defines for the ops table. Internal to
 * libhearth_cuda.so. */
#ifndef HEARTH_BACKEND_CUDA_COMMON_CUH
#define HEARTH_BACKEND_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "backend/backend.h"
}

#define CU_HIDDEN __attribute__((visibility("hidden")))

/* Blocks for n elements at `threads` per block, at most 2^20 (kernels loop over
 * the rest with GRID_LOOP). */
static inline unsigned grid_for(int64_t n, int threads) {
  int64_t g = (n + threads - 1) / threads;
  if (g > (1 << 20)) g = 1 << 20;
  return (unsigned)(g < 1 ? 1 : g);
}

/* A grid-stride loop: i over [0, n) across every thread of the grid. */
#define GRID_LOOP(i, n) \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

/* One cached device copy of a rope_table's inv_freq. */
struct cu_rope_entry {
  const double *host;  /* borrowed key: the table's inv_freq pointer */
  double *copy;        /* owned: the values uploaded (to notice a reused address) */
  double *dev;         /* owned: device copy */
  int64_t n;
};

#define CU_ROPE_CACHE 16
#define CU_GRAPHS 16   /* recorded steps kept (least recently used replaced) */

/* One recorded step (bk_graph_begin's key): seen once (warm), then recorded
 * and replayed; a key whose recording failed is never recorded again. */
enum { CU_GRAPH_EMPTY = 0, CU_GRAPH_WARM, CU_GRAPH_READY, CU_GRAPH_NEVER };
struct cu_graph {
  uint64_t key;
  int state;
  cudaGraphExec_t exec;
  uint64_t used;   /* graph_tick when last used */
};
/* Scratch never grows past this many bytes; larger work is chunked. */
#define CU_SCRATCH_CAP ((size_t)256 << 20)

struct cu_backend {
  bk_backend base;               /* first: the loader sees this */
  int device;
  int sm;                        /* major * 10 + minor */
  int n_sm;                      /* multiprocessors */
  char dev_name[256];
  cudaStream_t stream;
  cublasHandle_t blas;
  void *scratch;                 /* owned: device scratch (matmul dequant, bf16 split, attention partials) */
  size_t scratch_size;
  cu_rope_entry rope[CU_ROPE_CACHE];
  int rope_next;                 /* round-robin victim when the cache is full */
  herr err;                      /* first error an op recorded (code 0: none) */
  void *samp;                    /* owned: bk_sample's device scratch (params, results, probabilities) */
  size_t samp_size;
  bool no_graphs;                /* bk_open_opts.no_graphs */
  bool fast_matmul;              /* bk_open_opts.fast_matmul */
  bool f32_act;                  /* bk_open_opts.f32_activations: no 8-bit activations for Q8_0 / Q4_0 / Q4_K GEMVs */
  cu_graph graphs[CU_GRAPHS];    /* owned: recorded steps */
  uint64_t graph_tick;
  int graph_mode;                /* between graph_begin and graph_end: 0 plain, 1 recording, 2 replaying */
  int graph_slot;
  struct cu_moe_tab *moe_tabs;   /* owned: the device tables of expert descriptors (moe.cu) */
  int n_moe_tabs;
  void *moe_tmp;                 /* owned: host staging of one table */
  struct cu_prof *prof;          /* owned: the op profile (prof.cu; NULL unless HEARTH_CUDA_PROFILE) */
  cublasLtHandle_t lt;           /* owned: cuBLASLt (FP8 GEMMs), made at first use */
  void *lt_ws;                   /* owned: its workspace */
  struct cu_lt_algo *lt_algos;   /* owned: the algorithm chosen per GEMM shape (matmul.cu) */
  int n_lt_algos;
};

static inline cu_backend *cu_be(bk_backend *be) { return (cu_backend *)be; }

/* Records the first error (later ones are dropped until sync/get report it). */
CU_HIDDEN void cu_fail(cu_backend *b, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Records a launch error of op, if any. Returns nonzero when one was found. */
CU_HIDDEN int cu_check(cu_backend *b, const char *op);
/* Records a cuBLAS failure of op. Returns nonzero on failure. */
CU_HIDDEN int cu_check_blas(cu_backend *b, cublasStatus_t st, const char *op);
/* Moves the recorded error (if any) into err and clears it; returns its code. */
CU_HIDDEN int cu_take_error(cu_backend *b, herr *err);
/* Device scratch of at least bytes (<= CU_SCRATCH_CAP); NULL after recording an error. */
CU_HIDDEN void *cu_scratch(cu_backend *b, size_t bytes);
/* Device copy of t->inv_freq (cached per pointer); NULL after recording an error. */
CU_HIDDEN const double *cu_rope_freqs(cu_backend *b, const rope_table *t);

/* Bytes of one stored row (0 when cols is not a whole number of blocks). */
CU_HIDDEN size_t cu_row_bytes(bk_type t, int64_t cols, int bits);
CU_HIDDEN const char *cu_type_name(bk_type t);

static inline const float *cu_f(const bk_tensor *t) { return (const float *)bk_addr(t); }
static inline float *cu_fw(const bk_tensor *t) { return (float *)bk_addr(t); }
static inline const int32_t *cu_i(const bk_tensor *t) { return (const int32_t *)bk_addr(t); }

/* ---- ops (matmul.cu, elementwise.cu, attention.cu) ---- */

CU_HIDDEN void cu_embed(bk_backend *be, const bk_tensor *y, const bk_weight *table, const bk_tensor *ids, float scale);
CU_HIDDEN void cu_matmul(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_weight *w, const bk_tensor *bias);
CU_HIDDEN void cu_rmsnorm(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, float eps, bool unit_offset);
CU_HIDDEN void cu_rope(bk_backend *be, const bk_tensor *x, int64_t n_heads, int64_t head_dim, const bk_tensor *pos,
                       const rope_table *t);
CU_HIDDEN void cu_act_mul(bk_backend *be, const bk_tensor *gate, const bk_tensor *up, bk_act act);
CU_HIDDEN void cu_add(bk_backend *be, const bk_tensor *y, const bk_tensor *a, const bk_tensor *b);
CU_HIDDEN void cu_add_rmsnorm(bk_backend *be, const bk_tensor *x, const bk_tensor *d, const bk_tensor *y,
                             const bk_tensor *w, float eps, bool unit_offset);
CU_HIDDEN void cu_softcap(bk_backend *be, const bk_tensor *x, float cap);
CU_HIDDEN void cu_get_rows(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *rows);
CU_HIDDEN void cu_kv_write(bk_backend *be, const bk_kv_layer *kv, const bk_tensor *k_new, const bk_tensor *v_new,
                           const bk_tensor *slot);
CU_HIDDEN int cu_sample(bk_backend *be, const bk_tensor *logits, const bk_sample_row *rows, const bk_sample_adj *adj,
                        int64_t n_adj, bk_sample_out *out, herr *err);
CU_HIDDEN void cu_attention(bk_backend *be, const bk_tensor *out, const bk_tensor *q, const bk_kv_layer *kv,
                            const bk_attn_index *ix, const attn_params *p);
/* moe.cu: scale, get_cols, and the mixture-of-experts routing and experts */
CU_HIDDEN void cu_scale(bk_backend *be, const bk_tensor *x, float s);
CU_HIDDEN void cu_get_cols(bk_backend *be, const bk_tensor *y, const bk_tensor *x, int64_t c0);
CU_HIDDEN void cu_moe_route(bk_backend *be, const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits, bool norm,
                            const bk_tensor *scale);
CU_HIDDEN void cu_moe(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *ids, const bk_tensor *w,
                      const bk_experts *ex, bk_act act);
/* Frees the expert tables (at close). */
CU_HIDDEN void cu_moe_free(cu_backend *b);
/* deltanet.cu: the recurrent ops of linear-attention layers */
CU_HIDDEN void cu_conv1d(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, const bk_recurrent *r, bool silu);
CU_HIDDEN void cu_delta_rule(bk_backend *be, const bk_tensor *o, const bk_tensor *qkv, const bk_tensor *a, const bk_tensor *b,
                             const bk_tensor *a_log, const bk_tensor *dt_bias, const bk_recurrent *r, const delta_params *p);
CU_HIDDEN void cu_sigmoid_mul(bk_backend *be, const bk_tensor *y, const bk_tensor *g);
/* sparse.cu: what multi-head latent attention and DeepSeek sparse attention add */
CU_HIDDEN void cu_set_cols(bk_backend *be, const bk_tensor *y, const bk_tensor *x, int64_t c0);
CU_HIDDEN void cu_set_rows(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *rows);
CU_HIDDEN void cu_layernorm(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, const bk_tensor *b,
                            float eps);
CU_HIDDEN void cu_moe_route_group(bk_backend *be, const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits,
                                  const bk_tensor *bias, int64_t n_group, int64_t topk_group, bool norm, float scale);
CU_HIDDEN void cu_index_topk(bk_backend *be, const bk_tensor *sel, const bk_tensor *q, const bk_tensor *w,
                             const bk_kv_layer *keys, const bk_attn_index *ix, const index_params *p);
/* media.cu: the media encoders' ops */
CU_HIDDEN void cu_act(bk_backend *be, const bk_tensor *x, bk_act act);
CU_HIDDEN void cu_clamp(bk_backend *be, const bk_tensor *x, float lo, float hi);
CU_HIDDEN void cu_embed_bag(bk_backend *be, const bk_tensor *y, const bk_tensor *table, const bk_tensor *ids,
                            const bk_tensor *w);
CU_HIDDEN void cu_attention_rel(bk_backend *be, const bk_tensor *out, const bk_tensor *q, const bk_tensor *k,
                                const bk_tensor *v, const bk_tensor *rel, const bk_tensor *qscale, int64_t n_valid,
                                const rel_attn_params *p);
CU_HIDDEN void cu_attention_sparse(bk_backend *be, const bk_tensor *out, const bk_tensor *q, const bk_kv_layer *kv,
                                   const bk_attn_index *ix, const bk_tensor *sel, const sparse_attn_params *p);
/* lora.cu: a LoRA adapter's delta on a run of rows */
CU_HIDDEN void cu_lora(bk_backend *be, const bk_tensor *y, const bk_tensor *x, const bk_tensor *a, const bk_tensor *b, float scale);
/* One-time kernel attributes (large dynamic shared memory); 0 or a CUDA error. */
CU_HIDDEN cudaError_t cu_attention_init(void);
CU_HIDDEN cudaError_t cu_deltanet_init(void);

/* matmul.cu: frees what the FP8 GEMMs made (cuBLASLt handle, workspace, algorithms). */
CU_HIDDEN void cu_lt_free(cu_backend *b);
/* prof.cu: the op profile. open: turns it on when HEARTH_CUDA_PROFILE is set
 * (wraps b's ops table); write: the table to its file, then frees it. */
CU_HIDDEN void cu_prof_open(cu_backend *b);
CU_HIDDEN void cu_prof_write(cu_backend *b);
/* A timed part of an op (its kernels between the two calls), shown under the
 * op's row count; -1 and nothing recorded when the profile is off. */
CU_HIDDEN int cu_prof_part(cu_backend *b, const char *name, int64_t rows);
CU_HIDDEN void cu_prof_part_end(cu_backend *b, int i);

/* Grid size for n items of `per` each (at least 1 block). */
static inline unsigned cu_blocks(int64_t n, int64_t per) {
  int64_t b = (n + per - 1) / per;
  return (unsigned)(b < 1 ? 1 : b);
}

#endif
