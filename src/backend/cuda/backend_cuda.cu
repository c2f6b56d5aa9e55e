/* backend_cuda.cu — the CUDA backend's handle and its non-op entries:
 * opening a device (stream, cuBLAS), describe / mem_info, device buffers,
 * host <-> device copies, the sticky error that sync and get report,
 * weight upload (stored bytes, MLX scales and biases in one allocation),
 * the scratch buffer and the cache of rope frequency tables. Exports only
 * hearth_cuda_backend_open. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"

/* ---- errors ---- */

void cu_fail(cu_backend *b, int code, const char *fmt, ...) {
  if (b->err.code) return;
  b->err.code = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b->err.msg, sizeof b->err.msg, fmt, ap);
  va_end(ap);
}

int cu_check(cu_backend *b, const char *op) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return 0;
  cu_fail(b, e == cudaErrorMemoryAllocation ? HEARTH_ENOMEM : HEARTH_EINTERNAL, "cuda %s: %s", op, cudaGetErrorString(e));
  return 1;
}

int cu_check_blas(cu_backend *b, cublasStatus_t st, const char *op) {
  if (st == CUBLAS_STATUS_SUCCESS) return 0;
  cu_fail(b, st == CUBLAS_STATUS_ALLOC_FAILED ? HEARTH_ENOMEM : HEARTH_EINTERNAL, "cuBLAS %s: %s", op,
          cublasGetStatusString(st));
  return 1;
}

/* Moves the recorded error (if any) into err and clears it. */
int cu_take_error(cu_backend *b, herr *err) {
  if (!b->err.code) return 0;
  int code = b->err.code;
  herr_set(err, code, "%s", b->err.msg);
  b->err.code = 0;
  b->err.msg[0] = 0;
  return code;
}

static int cuda_error(herr *err, cudaError_t e, const char *what) {
  int code = e == cudaErrorMemoryAllocation ? HEARTH_ENOMEM : HEARTH_EINTERNAL;
  return herr_set(err, code, "%s: %s", what, cudaGetErrorString(e));
}

/* ---- types ---- */

size_t cu_row_bytes(bk_type t, int64_t cols, int bits) {
  if (cols <= 0) return 0;
  switch (t) {
    case BK_F32: return (size_t)cols * 4;
    case BK_F16: case BK_BF16: return (size_t)cols * 2;
    case BK_Q8_0: return cols % 32 ? 0 : (size_t)(cols / 32) * 34;
    case BK_Q4_0: return cols % 32 ? 0 : (size_t)(cols / 32) * 18;
    case BK_Q4_K: return cols % 256 ? 0 : (size_t)(cols / 256) * 144;
    case BK_Q5_K: return cols % 256 ? 0 : (size_t)(cols / 256) * 176;
    case BK_Q6_K: return cols % 256 ? 0 : (size_t)(cols / 256) * 210;
    case BK_Q5_0: return cols % 32 ? 0 : (size_t)(cols / 32) * 22;
    case BK_Q5_1: return cols % 32 ? 0 : (size_t)(cols / 32) * 24;
    case BK_Q2_K: return cols % 256 ? 0 : (size_t)(cols / 256) * 84;
    case BK_Q3_K: return cols % 256 ? 0 : (size_t)(cols / 256) * 110;
    case BK_IQ4_NL: return cols % 32 ? 0 : (size_t)(cols / 32) * 18;
    case BK_IQ4_XS: return cols % 256 ? 0 : (size_t)(cols / 256) * 136;
    case BK_FP8: return (size_t)cols;
    case BK_MLX_AFFINE:
      if ((bits != 4 && bits != 8) || (cols * bits) % 32) return 0;
      return (size_t)(cols * bits / 8);
    default: return 0;
  }
}

const char *cu_type_name(bk_type t) {
  static const char *names[BK_TYPE_COUNT] = {"f32",  "f16",  "bf16", "q8_0", "q4_0",   "q4_K",  "q5_K", "q6_K",
                                             "mlx_affine", "fp8", "q5_0", "q5_1", "q2_K", "q3_K", "iq4_nl", "iq4_xs"};
  return (unsigned)t < BK_TYPE_COUNT ? names[t] : "unknown";
}

/* ---- scratch and rope cache ---- */

void *cu_scratch(cu_backend *b, size_t bytes) {
  if (bytes > CU_SCRATCH_CAP) {
    cu_fail(b, HEARTH_EINTERNAL, "cuda: scratch request of %zu bytes over the %zu-byte cap", bytes, CU_SCRATCH_CAP);
    return NULL;
  }
  if (b->scratch) return b->scratch;
  /* allocated once, at the cap: the buffer never moves while queued work reads it */
  size_t want = CU_SCRATCH_CAP;
  cudaError_t e = cudaMalloc(&b->scratch, want);
  if (e != cudaSuccess) {
    cudaGetLastError();
    b->scratch = NULL;
    cu_fail(b, HEARTH_ENOMEM, "cuda: no device memory for a %zu-byte scratch buffer: %s", want, cudaGetErrorString(e));
    return NULL;
  }
  b->scratch_size = want;
  return b->scratch;
}

static void rope_entry_free(cu_rope_entry *r) {
  if (r->dev) cudaFree(r->dev);
  free(r->copy);
  memset(r, 0, sizeof *r);
}

const double *cu_rope_freqs(cu_backend *b, const rope_table *t) {
  /* the frequencies, then (several position axes) each frequency's axis as a double */
  const int64_t half = t->rot_dim / 2, n = t->n_axes > 1 ? 2 * half : half;
  if (half <= 0) return NULL;
  size_t bytes = (size_t)n * sizeof(double);
  double *want = (double *)malloc(bytes);
  if (!want) {
    cu_fail(b, HEARTH_ENOMEM, "cuda rope: out of memory");
    return NULL;
  }
  memcpy(want, t->inv_freq, (size_t)half * sizeof(double));
  for (int64_t i = half; i < n; i++) want[i] = (double)t->axis[i - half];
  for (int i = 0; i < CU_ROPE_CACHE; i++) {
    cu_rope_entry *r = &b->rope[i];
    if (r->host == t->inv_freq && r->n == n && !memcmp(r->copy, want, bytes)) {
      free(want);
      return r->dev;
    }
  }
  /* a new table, or a reused address with other values: take a slot (stale entries of the same pointer first) */
  int slot = -1;
  for (int i = 0; i < CU_ROPE_CACHE && slot < 0; i++)
    if (b->rope[i].host == t->inv_freq) slot = i;
  for (int i = 0; i < CU_ROPE_CACHE && slot < 0; i++)
    if (!b->rope[i].host) slot = i;
  if (slot < 0) slot = b->rope_next++ % CU_ROPE_CACHE;
  cu_rope_entry *r = &b->rope[slot];
  if (r->dev) cudaStreamSynchronize(b->stream); /* queued ropes may still read it */
  rope_entry_free(r);
  r->copy = want;
  cudaError_t e = cudaMalloc(&r->dev, bytes);
  if (e == cudaSuccess) e = cudaMemcpy(r->dev, r->copy, bytes, cudaMemcpyHostToDevice);
  if (e != cudaSuccess) {
    cudaGetLastError();
    rope_entry_free(r);
    cu_fail(b, HEARTH_ENOMEM, "cuda rope: could not upload the frequency table: %s", cudaGetErrorString(e));
    return NULL;
  }
  r->host = t->inv_freq;
  r->n = n;
  return r->dev;
}

/* ---- handle ---- */

static void cu_close(bk_backend *be) {
  cu_backend *b = cu_be(be);
  cudaSetDevice(b->device);
  if (b->stream) cudaStreamSynchronize(b->stream);
  if (b->blas) cublasDestroy(b->blas);
  for (int i = 0; i < CU_ROPE_CACHE; i++) rope_entry_free(&b->rope[i]);
  if (b->scratch) cudaFree(b->scratch);
  if (b->samp) cudaFree(b->samp);
  cu_moe_free(b);
  cu_lt_free(b);
  for (int i = 0; i < CU_GRAPHS; i++)
    if (b->graphs[i].exec) cudaGraphExecDestroy(b->graphs[i].exec);
  if (b->stream) cudaStreamDestroy(b->stream);
  free(b);
}

static void cu_describe(const bk_backend *be, char *buf, size_t n) {
  const cu_backend *b = (const cu_backend *)be;
  size_t fr = 0, tot = 0;
  cudaSetDevice(b->device);
  if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) cudaGetLastError();
  const double gib = 1024.0 * 1024.0 * 1024.0;
  snprintf(buf, n, "%s %s, %.1f GiB total, %.1f GiB free, sm_%d", be->name, b->dev_name, tot / gib, fr / gib, b->sm);
}

static int cu_mem_info(bk_backend *be, size_t *free_bytes, size_t *total_bytes) {
  cu_backend *b = cu_be(be);
  size_t fr = 0, tot = 0;
  cudaSetDevice(b->device);
  cudaError_t e = cudaMemGetInfo(&fr, &tot);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return HEARTH_EINTERNAL;
  }
  if (free_bytes) *free_bytes = fr;
  if (total_bytes) *total_bytes = tot;
  return 0;
}

/* ---- memory ---- */

static int cu_buf_new(bk_backend *be, size_t bytes, bk_buf **out, herr *err) {
  cu_backend *b = cu_be(be);
  *out = NULL;
  bk_buf *buf = (bk_buf *)calloc(1, sizeof *buf);
  if (!buf) return herr_set(err, HEARTH_ENOMEM, "cuda: out of host memory");
  cudaSetDevice(b->device);
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    cudaGetLastError();
    free(buf);
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) cudaGetLastError();
    return herr_set(err, HEARTH_ENOMEM, "%s: cannot allocate %zu bytes of device memory (%zu of %zu free): %s", be->name,
                    bytes, fr, tot, cudaGetErrorString(e));
  }
  buf->be = be;
  buf->base = p;
  buf->size = bytes;
  *out = buf;
  return 0;
}

static void cu_buf_free(bk_backend *be, bk_buf *buf) {
  if (!buf) return;
  cu_backend *b = cu_be(be);
  cudaSetDevice(b->device);
  cudaStreamSynchronize(b->stream); /* queued work may still use it */
  if (buf->base) cudaFree(buf->base);
  free(buf);
}

static int cu_set(bk_backend *be, void *dst, const void *src, size_t n, herr *err) {
  cu_backend *b = cu_be(be);
  cudaSetDevice(b->device);
  cudaError_t e = cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, b->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(b->stream);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cuda_error(err, e, "cuda set");
  }
  return 0;
}

static int cu_get(bk_backend *be, void *dst, const void *src, size_t n, herr *err) {
  cu_backend *b = cu_be(be);
  cudaSetDevice(b->device);
  cudaError_t e = n ? cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, b->stream) : cudaSuccess;
  if (e == cudaSuccess) e = cudaStreamSynchronize(b->stream);
  if (e != cudaSuccess) {
    cudaGetLastError();
    cu_fail(b, HEARTH_EINTERNAL, "cuda get: %s", cudaGetErrorString(e));
  }
  return cu_take_error(b, err);
}

static void cu_copy(bk_backend *be, void *dst, const void *src, size_t n) {
  cu_backend *b = cu_be(be);
  cudaSetDevice(b->device);
  if (cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, b->stream) != cudaSuccess) cu_check(b, "copy");
}

static int cu_sync(bk_backend *be, herr *err) {
  cu_backend *b = cu_be(be);
  cudaSetDevice(b->device);
  cudaError_t e = cudaStreamSynchronize(b->stream);
  if (e != cudaSuccess) {
    cudaGetLastError();
    cu_fail(b, HEARTH_EINTERNAL, "cuda: %s", cudaGetErrorString(e));
  }
  return cu_take_error(b, err);
}

/* ---- weights ---- */

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

static int validate_weight(const bk_weight *w, herr *err) {
  if ((unsigned)w->type >= BK_TYPE_COUNT) return herr_set(err, HEARTH_EUNSUPPORTED, "weight: unknown type %d", (int)w->type);
  if (w->rows <= 0 || w->cols <= 0)
    return herr_set(err, HEARTH_EINVAL, "weight %s: shape [%lld, %lld]", cu_type_name(w->type), (long long)w->rows,
                    (long long)w->cols);
  if (!cu_row_bytes(w->type, w->cols, w->bits))
    return herr_set(err, HEARTH_EINVAL, "weight %s: %lld columns are not a whole number of blocks", cu_type_name(w->type),
                    (long long)w->cols);
  if (!w->data) return herr_set(err, HEARTH_EINVAL, "weight %s: no data", cu_type_name(w->type));
  if (w->type == BK_MLX_AFFINE) {
    if (w->group_size != 32 && w->group_size != 64 && w->group_size != 128)
      return herr_set(err, HEARTH_EUNSUPPORTED, "weight mlx: group size %d (32, 64 or 128)", w->group_size);
    if (w->cols % w->group_size)
      return herr_set(err, HEARTH_EINVAL, "weight mlx: %lld columns are not a whole number of %d-element groups",
                      (long long)w->cols, w->group_size);
    if (w->scale_type != BK_F32 && w->scale_type != BK_F16 && w->scale_type != BK_BF16)
      return herr_set(err, HEARTH_EUNSUPPORTED, "weight mlx: scales of type %s", cu_type_name(w->scale_type));
    if (!w->scales || !w->biases) return herr_set(err, HEARTH_EINVAL, "weight mlx: no scales or biases");
  }
  return 0;
}

/* use (matmul / embed / private bytes) changes nothing here: the bytes are uploaded either way. */
static int cu_weight_load(bk_backend *be, bk_weight *w, unsigned use, herr *err) {
  (void)use;
  cu_backend *b = cu_be(be);
  if (w->packed) return herr_set(err, HEARTH_EINVAL, "%s weight load: the weight is already loaded", be->name);
  int rc = validate_weight(w, err);
  if (rc) return rc;
  if (w->type == BK_FP8 && (!w->scales || w->scale_type != BK_F32))
    return herr_set(err, HEARTH_EINVAL, "weight fp8: no f32 scales");
  size_t data_bytes = (size_t)w->rows * cu_row_bytes(w->type, w->cols, w->bits), sb_bytes = 0, fp8_scales = 0;
  if (w->type == BK_FP8) fp8_scales = (size_t)w->rows * 4;
  if (w->type == BK_MLX_AFFINE)
    sb_bytes = (size_t)w->rows * (size_t)(w->cols / w->group_size) * (w->scale_type == BK_F32 ? 4 : 2);
  size_t off_s = align256(data_bytes), off_b = off_s + align256(sb_bytes), total = off_b + sb_bytes + fp8_scales;
  cudaSetDevice(b->device);
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, total);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) cudaGetLastError();
    return herr_set(err, HEARTH_ENOMEM, "%s: no device memory for a %s weight [%lld, %lld] (%zu bytes; %zu of %zu free)",
                    be->name, cu_type_name(w->type), (long long)w->rows, (long long)w->cols, total, fr, tot);
  }
  char *d = (char *)p;
  e = cudaMemcpy(d, w->data, data_bytes, cudaMemcpyHostToDevice);
  if (e == cudaSuccess && sb_bytes) e = cudaMemcpy(d + off_s, w->scales, sb_bytes, cudaMemcpyHostToDevice);
  if (e == cudaSuccess && sb_bytes) e = cudaMemcpy(d + off_b, w->biases, sb_bytes, cudaMemcpyHostToDevice);
  if (e == cudaSuccess && fp8_scales) e = cudaMemcpy(d + off_b, w->scales, fp8_scales, cudaMemcpyHostToDevice);
  if (e != cudaSuccess) {
    cudaGetLastError();
    cudaFree(p);
    return cuda_error(err, e, "cuda weight upload");
  }
  w->data = d;
  if (fp8_scales) w->scales = d + off_b;
  if (sb_bytes) {
    w->scales = d + off_s;
    w->biases = d + off_b;
  }
  w->packed = p;
  w->packed_size = total;
  return 0;
}

static void cu_weight_release(bk_backend *be, bk_weight *w) {
  if (!w || !w->packed) return;
  cu_backend *b = cu_be(be);
  cudaSetDevice(b->device);
  cudaStreamSynchronize(b->stream);
  cudaFree(w->packed);
  w->packed = NULL;
  w->packed_size = 0;
  w->data = NULL;
  w->scales = NULL;
  w->biases = NULL;
}

/* ---- recorded steps (bk_graph_begin / bk_graph_end) ----
 * The first time a key is seen the step runs plainly (its lazy allocations
 * — scratch, rope tables — happen then, outside any recording); the second
 * time its ops are captured from the stream into a CUDA graph, which is
 * then launched; from then on the graph is launched instead of the ops. */

static bool cu_graph_begin(bk_backend *be, uint64_t key) {
  cu_backend *b = cu_be(be);
  b->graph_mode = 0;
  if (b->no_graphs || b->err.code) return false;
  int slot = -1, victim = 0;
  for (int i = 0; i < CU_GRAPHS; i++) {
    if (b->graphs[i].state != CU_GRAPH_EMPTY && b->graphs[i].key == key) slot = i;
    if (b->graphs[i].used < b->graphs[victim].used) victim = i;
  }
  b->graph_tick++;
  if (slot < 0) { /* first sight: run plainly, record next time */
    cu_graph *g = &b->graphs[victim];
    if (g->exec) cudaGraphExecDestroy(g->exec);
    *g = (cu_graph){.key = key, .state = CU_GRAPH_WARM, .exec = NULL, .used = b->graph_tick};
    return false;
  }
  cu_graph *g = &b->graphs[slot];
  g->used = b->graph_tick;
  if (g->state == CU_GRAPH_READY) {
    b->graph_mode = 2;
    b->graph_slot = slot;
    return true;
  }
  if (g->state != CU_GRAPH_WARM) return false;
  cudaSetDevice(b->device);
  if (cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    g->state = CU_GRAPH_NEVER;
    return false;
  }
  b->graph_mode = 1;
  b->graph_slot = slot;
  return false;
}

static int cu_graph_end(bk_backend *be, herr *err) {
  cu_backend *b = cu_be(be);
  int mode = b->graph_mode;
  b->graph_mode = 0;
  if (mode == 0) return 0;
  cu_graph *g = &b->graphs[b->graph_slot];
  cudaSetDevice(b->device);
  if (mode == 1) {
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(b->stream, &graph);
    if (e == cudaSuccess && !b->err.code) e = cudaGraphInstantiate(&g->exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (e != cudaSuccess || b->err.code) {
      /* nothing recorded ran: the caller issues the ops again, and this key stays plain */
      cudaGetLastError();
      if (g->exec) cudaGraphExecDestroy(g->exec);
      g->exec = NULL;
      g->state = CU_GRAPH_NEVER;
      b->err.code = 0;
      b->err.msg[0] = 0;
      return BK_GRAPH_REDO;
    }
    g->state = CU_GRAPH_READY;
  }
  if (cudaGraphLaunch(g->exec, b->stream) != cudaSuccess) {
    cudaError_t e = cudaGetLastError();
    cu_fail(b, HEARTH_EINTERNAL, "cuda graph launch: %s", cudaGetErrorString(e));
  }
  (void)err;
  return 0;
}

/* ---- the table ---- */

/* Positional: this notices the table gaining or losing an entry. */
static_assert(sizeof(bk_backend_ops) == 44 * sizeof(void *), "bk_backend_ops changed: update cu_ops");

static const bk_backend_ops cu_ops = {
    cu_close,      cu_describe,   cu_mem_info, cu_buf_new,  cu_buf_free, cu_set,          cu_get,     cu_copy,
    cu_sync,       cu_weight_load, cu_weight_release, cu_embed, cu_matmul, cu_rmsnorm, cu_rope,  cu_act_mul,
    cu_add,        cu_softcap,    cu_get_rows, cu_scale,    cu_get_cols, cu_moe_route, cu_moe,  cu_kv_write,
    cu_attention,  cu_conv1d,     cu_delta_rule, cu_sigmoid_mul, cu_sample, cu_graph_begin, cu_graph_end,
    cu_set_cols,   cu_set_rows,   cu_layernorm, cu_moe_route_group, cu_index_topk, cu_attention_sparse, cu_lora,
    cu_act,        cu_clamp,      cu_embed_bag, cu_attention_rel, cu_add_rmsnorm,
    NULL, /* supports_op: every entry above is set */
};

extern "C" __attribute__((visibility("default"))) int hearth_cuda_backend_open(int abi, int device, const bk_open_opts *opts,
                                                                               bk_backend **out, herr *err) {
  if (out) *out = NULL;
  if (abi != BK_CUDA_ABI)
    return herr_set(err, HEARTH_EUNSUPPORTED,
                    "libhearth_cuda.so speaks backend ABI %d but the program asked for %d (rebuild them together)",
                    BK_CUDA_ABI, abi);
  if (!out) return herr_set(err, HEARTH_EINVAL, "cuda open: no output handle");
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (e == cudaErrorInsufficientDriver)
      return herr_set(err, HEARTH_EUNSUPPORTED,
                      "device cuda:%d: no usable NVIDIA driver (none is installed, or it is older than this build's CUDA "
                      "runtime %d.%d needs)",
                      device, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    if (e == cudaErrorNoDevice)
      return herr_set(err, HEARTH_EUNSUPPORTED, "device cuda:%d: no CUDA GPU found", device);
    return herr_set(err, HEARTH_EUNSUPPORTED, "device cuda:%d: CUDA is not usable: %s", device, cudaGetErrorString(e));
  }
  if (count <= 0) return herr_set(err, HEARTH_EUNSUPPORTED, "device cuda:%d: no CUDA GPU found", device);
  if (device < 0 || device >= count)
    return herr_set(err, HEARTH_EINVAL, "device cuda:%d: this machine has %d CUDA GPU%s (cuda:0..cuda:%d)", device, count,
                    count == 1 ? "" : "s", count - 1);
  cudaDeviceProp prop;
  e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return herr_set(err, HEARTH_EUNSUPPORTED, "device cuda:%d: %s", device, cudaGetErrorString(e));
  }
  if (prop.major < 8)
    return herr_set(err, HEARTH_EUNSUPPORTED, "device cuda:%d (%s): compute capability %d.%d; this build needs 8.0 or newer",
                    device, prop.name, prop.major, prop.minor);
  cu_backend *b = (cu_backend *)calloc(1, sizeof *b);
  if (!b) return herr_set(err, HEARTH_ENOMEM, "cuda open: out of host memory");
  b->device = device;
  b->sm = prop.major * 10 + prop.minor;
  b->n_sm = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
  snprintf(b->dev_name, sizeof b->dev_name, "%s", prop.name);
  b->base.ops = &cu_ops;
  snprintf(b->base.name, sizeof b->base.name, "cuda:%d", device);
  b->base.is_cpu = false;
  b->base.expert_lora = true;
  b->base.lib = NULL;
  b->no_graphs = opts && opts->no_graphs;
  b->fast_matmul = opts && opts->fast_matmul;
  b->f32_act = opts && opts->f32_activations;
  e = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    cudaGetLastError();
    free(b);
    return cuda_error(err, e, "cuda open: creating a stream");
  }
  cublasStatus_t st = cublasCreate(&b->blas);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetStream(b->blas, b->stream);
  if (st == CUBLAS_STATUS_SUCCESS) st = cublasSetMathMode(b->blas, CUBLAS_DEFAULT_MATH);
  if (st != CUBLAS_STATUS_SUCCESS) {
    int code = st == CUBLAS_STATUS_ALLOC_FAILED ? HEARTH_ENOMEM : HEARTH_EUNSUPPORTED;
    herr_set(err, code, "cuda open: cuBLAS: %s", cublasGetStatusString(st));
    if (b->blas) cublasDestroy(b->blas);
    cudaStreamDestroy(b->stream);
    free(b);
    return code;
  }
  e = cu_attention_init();
  if (e == cudaSuccess) e = cu_deltanet_init();
  if (e != cudaSuccess) {
    cudaGetLastError();
    cublasDestroy(b->blas);
    cudaStreamDestroy(b->stream);
    free(b);
    return cuda_error(err, e, "cuda open: attention and delta-rule kernels");
  }
  cu_prof_open(b);
  *out = &b->base;
  return 0;
}
