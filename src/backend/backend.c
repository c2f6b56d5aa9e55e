/* backend.c — opening a backend by device name (the CPU in-process, CUDA by
 * loading libhearth_cuda.so at run time so that a binary built with CUDA
 * still starts where the CUDA libraries are absent) and the thin dispatch
 * of every bk_* call through the backend's table: an op the backend lacks
 * goes to its host path (host_path.c) or is refused by name. Shape checks
 * that are programming errors stay here, once, for every backend. Knows
 * nothing of models. */
#include "backend/backend.h"

#include <dlfcn.h>
#include <unistd.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/host_path.h"

#ifndef HEARTH_CUDA_INSTALL_DIR
#define HEARTH_CUDA_INSTALL_DIR ""
#endif
#ifndef HEARTH_CUDA_LIB_DIR
#define HEARTH_CUDA_LIB_DIR ""
#endif

/* ---- opening ---- */

/* dlopen the CUDA library: opts->cuda_lib, then beside this program (and in
 * its ../lib/hearth), then where make install puts it, then the build folder
 * it was made in, then the loader's own search. */
static void *load_cuda_lib(const bk_open_opts *opts, char *tried, size_t n) {
  char cand[5][PATH_MAX];
  int nc = 0;
  if (opts && opts->cuda_lib && *opts->cuda_lib) snprintf(cand[nc++], PATH_MAX, "%s", opts->cuda_lib);
  Dl_info info;
  if (dladdr((void *)&load_cuda_lib, &info) && info.dli_fname) {
    char self[PATH_MAX];
    snprintf(self, sizeof self, "%s", info.dli_fname);
    if (!strchr(self, '/')) {
      ssize_t r = readlink("/proc/self/exe", self, sizeof self - 1);
      self[r > 0 ? r : 0] = 0;
    }
    char *slash = strrchr(self, '/');
    if (slash) {
      *slash = 0;
      snprintf(cand[nc++], PATH_MAX, "%s/libhearth_cuda.so", self);
      snprintf(cand[nc++], PATH_MAX, "%s/../lib/hearth/libhearth_cuda.so", self);
    }
  }
  if (*HEARTH_CUDA_INSTALL_DIR) snprintf(cand[nc++], PATH_MAX, "%s/libhearth_cuda.so", HEARTH_CUDA_INSTALL_DIR);
  if (*HEARTH_CUDA_LIB_DIR) snprintf(cand[nc++], PATH_MAX, "%s/libhearth_cuda.so", HEARTH_CUDA_LIB_DIR);
  size_t o = 0;
  tried[0] = 0;
  for (int i = 0; i < nc; i++) {
    void *h = dlopen(cand[i], RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
    const char *e = dlerror();
    if (o < n) o += (size_t)snprintf(tried + o, n - o, "%s%s", o ? "; " : "", e ? e : cand[i]);
  }
  void *h = dlopen("libhearth_cuda.so", RTLD_NOW | RTLD_LOCAL);
  if (!h && o < n) {
    const char *e = dlerror();
    snprintf(tried + o, n - o, "%s%s", o ? "; " : "", e ? e : "libhearth_cuda.so");
  }
  return h;
}

static int open_cuda(int device, const bk_open_opts *opts, bk_backend **out, herr *err) {
  char tried[1024];
  void *lib = load_cuda_lib(opts, tried, sizeof tried);
  if (!lib)
    return herr_set(err, HEARTH_EUNSUPPORTED,
                    "device cuda: the CUDA backend could not be loaded (this build has no CUDA support, or the CUDA "
                    "runtime libraries are missing): %s",
                    tried);
  bk_cuda_open_fn fn = (bk_cuda_open_fn)dlsym(lib, BK_CUDA_ENTRY);
  if (!fn) {
    dlclose(lib);
    return herr_set(err, HEARTH_EUNSUPPORTED, "device cuda: libhearth_cuda.so has no %s", BK_CUDA_ENTRY);
  }
  int rc = fn(BK_CUDA_ABI, device, opts, out, err);
  if (rc) {
    dlclose(lib);
    return rc;
  }
  (*out)->lib = lib;
  return 0;
}

int bk_backend_open(const char *device, const bk_open_opts *opts, bk_backend **out, herr *err) {
  *out = NULL;
  if (!device || !*device || !strcmp(device, "cpu")) return bk_cpu_open(opts, out, err);
  if (!strcmp(device, "auto")) {
    herr quiet = {0};
    if (open_cuda(0, opts, out, &quiet) == 0) return 0;
    return bk_cpu_open(opts, out, err);
  }
  if (!strncmp(device, "cuda", 4)) {
    int dev = 0;
    if (device[4] == ':') {
      char *end = NULL;
      long v = strtol(device + 5, &end, 10);
      if (end == device + 5 || *end || v < 0 || v > 255)
        return herr_set(err, HEARTH_EINVAL, "device '%s': expected cuda:N with N a GPU index", device);
      dev = (int)v;
    } else if (device[4]) {
      return herr_set(err, HEARTH_EINVAL, "unknown device '%s' (cpu, cuda, cuda:N or auto)", device);
    }
    return open_cuda(dev, opts, out, err);
  }
  return herr_set(err, HEARTH_EINVAL, "unknown device '%s' (cpu, cuda, cuda:N or auto)", device);
}

void bk_backend_close(bk_backend *be) {
  if (!be) return;
  void *lib = be->lib;
  be->ops->close(be);
  if (lib) dlclose(lib);
}

const char *bk_backend_name(const bk_backend *be) { return be->name; }
bool bk_backend_is_cpu(const bk_backend *be) { return be->is_cpu; }
bool bk_backend_expert_lora(const bk_backend *be) { return be->expert_lora; }
void bk_backend_describe(const bk_backend *be, char *buf, size_t n) {
  if (be->ops->describe) be->ops->describe(be, buf, n);
  else if (n) snprintf(buf, n, "%s", be->name);
}
int bk_mem_info(bk_backend *be, size_t *free_bytes, size_t *total_bytes) {
  if (!be->ops->mem_info) return -1;
  return be->ops->mem_info(be, free_bytes, total_bytes);
}

/* ---- what a backend runs ---- */

static const char *const op_names[BK_OP_COUNT] = {
    [BK_OP_EMBED] = "embed", [BK_OP_MATMUL] = "matmul", [BK_OP_RMSNORM] = "rmsnorm", [BK_OP_ROPE] = "rope",
    [BK_OP_ACT_MUL] = "act_mul", [BK_OP_ADD] = "add", [BK_OP_SOFTCAP] = "softcap", [BK_OP_GET_ROWS] = "get_rows",
    [BK_OP_SCALE] = "scale", [BK_OP_GET_COLS] = "get_cols", [BK_OP_MOE_ROUTE] = "moe_route", [BK_OP_MOE] = "moe",
    [BK_OP_KV_WRITE] = "kv_write", [BK_OP_ATTENTION] = "attention", [BK_OP_CONV1D] = "conv1d",
    [BK_OP_DELTA_RULE] = "delta_rule", [BK_OP_SIGMOID_MUL] = "sigmoid_mul", [BK_OP_SAMPLE] = "sample",
    [BK_OP_SET_COLS] = "set_cols", [BK_OP_SET_ROWS] = "set_rows", [BK_OP_LAYERNORM] = "layernorm",
    [BK_OP_MOE_ROUTE_GROUP] = "moe_route_group", [BK_OP_INDEX_TOPK] = "index_topk",
    [BK_OP_ATTENTION_SPARSE] = "attention_sparse", [BK_OP_LORA] = "lora", [BK_OP_ACT] = "act", [BK_OP_CLAMP] = "clamp",
    [BK_OP_EMBED_BAG] = "embed_bag", [BK_OP_ATTENTION_REL] = "attention_rel", [BK_OP_ADD_RMSNORM] = "add_rmsnorm",
};

const char *bk_op_name(bk_op op) { return (unsigned)op < BK_OP_COUNT && op_names[op] ? op_names[op] : "unknown"; }

/* The table's entry for op (as a generic pointer: only whether it is set matters here). */
static bool has_entry(const bk_backend_ops *o, bk_op op) {
  switch (op) {
    case BK_OP_EMBED: return o->embed;
    case BK_OP_MATMUL: return o->matmul;
    case BK_OP_RMSNORM: return o->rmsnorm;
    case BK_OP_ROPE: return o->rope;
    case BK_OP_ACT_MUL: return o->act_mul;
    case BK_OP_ADD: return o->add;
    case BK_OP_SOFTCAP: return o->softcap;
    case BK_OP_GET_ROWS: return o->get_rows;
    case BK_OP_SCALE: return o->scale;
    case BK_OP_GET_COLS: return o->get_cols;
    case BK_OP_MOE_ROUTE: return o->moe_route;
    case BK_OP_MOE: return o->moe;
    case BK_OP_KV_WRITE: return o->kv_write;
    case BK_OP_ATTENTION: return o->attention;
    case BK_OP_CONV1D: return o->conv1d;
    case BK_OP_DELTA_RULE: return o->delta_rule;
    case BK_OP_SIGMOID_MUL: return o->sigmoid_mul;
    case BK_OP_SAMPLE: return o->sample;
    case BK_OP_SET_COLS: return o->set_cols;
    case BK_OP_SET_ROWS: return o->set_rows;
    case BK_OP_LAYERNORM: return o->layernorm;
    case BK_OP_ADD_RMSNORM: return o->add_rmsnorm;
    case BK_OP_MOE_ROUTE_GROUP: return o->moe_route_group;
    case BK_OP_INDEX_TOPK: return o->index_topk;
    case BK_OP_ATTENTION_SPARSE: return o->attention_sparse;
    case BK_OP_LORA: return o->lora;
    case BK_OP_ACT: return o->act;
    case BK_OP_CLAMP: return o->clamp;
    case BK_OP_EMBED_BAG: return o->embed_bag;
    case BK_OP_ATTENTION_REL: return o->attention_rel;
    default: return false;
  }
}

bool bk_backend_supports(const bk_backend *be, bk_op op) {
  return has_entry(be->ops, op) && (!be->ops->supports_op || be->ops->supports_op(be, op));
}

bool bk_op_host_path(bk_op op) {
  switch (op) {
    case BK_OP_RMSNORM: case BK_OP_ROPE: case BK_OP_ACT_MUL: case BK_OP_ADD: case BK_OP_SOFTCAP: case BK_OP_GET_ROWS:
    case BK_OP_SCALE: case BK_OP_GET_COLS: case BK_OP_MOE_ROUTE: case BK_OP_SIGMOID_MUL: case BK_OP_SAMPLE:
    case BK_OP_SET_COLS: case BK_OP_SET_ROWS: case BK_OP_LAYERNORM: case BK_OP_MOE_ROUTE_GROUP: case BK_OP_LORA:
    case BK_OP_ACT: case BK_OP_CLAMP: case BK_OP_EMBED_BAG: case BK_OP_ADD_RMSNORM:
      return true;
    default: return false;
  }
}

static int refusal(const bk_backend *be, const char *what, herr *err) {
  return herr_set(err, HEARTH_EUNSUPPORTED, "backend '%s' has no op '%s', and it has no host path", be->name, what);
}

int bk_backend_require(const bk_backend *be, const bk_op *ops, int n, herr *err) {
  const bk_backend_ops *o = be->ops;
  static const char *const mem_names[] = {"buf_new", "buf_free", "set", "get", "copy", "sync"};
  const bool mem_set[] = {o->buf_new, o->buf_free, o->set, o->get, o->copy, o->sync};
  for (int i = 0; i < 6; i++)
    if (!mem_set[i]) return refusal(be, mem_names[i], err);
  for (int i = 0; i < n; i++)
    if (!bk_backend_supports(be, ops[i]) && !bk_op_host_path(ops[i])) return refusal(be, bk_op_name(ops[i]), err);
  return 0;
}

int bk_backend_require_core(const bk_backend *be, herr *err) {
  static const bk_op core[] = {BK_OP_EMBED, BK_OP_MATMUL, BK_OP_KV_WRITE, BK_OP_ATTENTION};
  return bk_backend_require(be, core, (int)(sizeof core / sizeof core[0]), err);
}

/* An op the backend cannot run, with no host path: nothing runs; the next bk_sync / bk_get says why. */
static void refuse(bk_backend *be, bk_op op) {
  herr e = {0};
  refusal(be, bk_op_name(op), &e);
  bk_backend_record(be, &e);
}

/* The error the dispatch recorded, if any, moved into err (cleared on the backend). */
static int take_refused(bk_backend *be, herr *err) {
  if (!be->refused.code) return 0;
  int rc = be->refused.code;
  if (err) *err = be->refused;
  memset(&be->refused, 0, sizeof be->refused);
  return rc;
}

/* rc of a call that waited for the queued work; when it succeeded, the dispatch's recorded error
 * instead (taken either way, so it is reported once). */
static int with_refused(bk_backend *be, int rc, herr *err) {
  herr mine = {0};
  int r2 = take_refused(be, &mine);
  if (!rc && r2) {
    if (err) *err = mine;
    rc = r2;
  }
  return rc;
}

/* ---- memory ---- */

int bk_buf_new(bk_backend *be, size_t bytes, bk_buf **out, herr *err) { return be->ops->buf_new(be, bytes ? bytes : 1, out, err); }

void bk_buf_free(bk_buf *b) {
  if (b) b->be->ops->buf_free(b->be, b);
}

int bk_tensor_new(bk_backend *be, bk_dtype dt, int64_t rows, int64_t cols, bk_tensor *t, herr *err) {
  memset(t, 0, sizeof *t);
  if (rows < 0 || cols < 0) return herr_set(err, HEARTH_EINVAL, "tensor: shape [%lld, %lld]", (long long)rows, (long long)cols);
  bk_buf *b;
  int rc = bk_buf_new(be, (size_t)(rows * cols) * bk_dtype_size(dt), &b, err);
  if (rc) return rc;
  *t = (bk_tensor){.buf = b, .off = 0, .dt = dt, .rows = rows, .cols = cols};
  return 0;
}

void bk_tensor_free(bk_tensor *t) {
  if (!t) return;
  bk_buf_free(t->buf);
  memset(t, 0, sizeof *t);
}

int bk_set(const bk_tensor *dst, size_t off, const void *src, size_t n, herr *err) {
  if (off + n > bk_nbytes(dst)) return herr_set(err, HEARTH_EINTERNAL, "bk_set: %zu bytes at %zu past a %zu-byte tensor", n, off, bk_nbytes(dst));
  if (n == 0) return 0;
  return dst->buf->be->ops->set(dst->buf->be, (char *)bk_addr(dst) + off, src, n, err);
}

int bk_get(const bk_tensor *src, size_t off, void *dst, size_t n, herr *err) {
  if (off + n > bk_nbytes(src)) return herr_set(err, HEARTH_EINTERNAL, "bk_get: %zu bytes at %zu past a %zu-byte tensor", n, off, bk_nbytes(src));
  bk_backend *be = src->buf->be;
  return with_refused(be, be->ops->get(be, dst, (const char *)bk_addr(src) + off, n, err), err);
}

void bk_copy(const bk_tensor *dst, size_t dst_off, const bk_tensor *src, size_t src_off, size_t n) {
  if (n) dst->buf->be->ops->copy(dst->buf->be, (char *)bk_addr(dst) + dst_off, (const char *)bk_addr(src) + src_off, n);
}

int bk_sync(bk_backend *be, herr *err) { return with_refused(be, be->ops->sync(be, err), err); }

/* ---- weights ---- */

int bk_weight_load(bk_backend *be, bk_weight *w, unsigned use, herr *err) {
  return be->ops->weight_load ? be->ops->weight_load(be, w, use, err) : 0;
}
void bk_weight_release(bk_backend *be, bk_weight *w) {
  if (be->ops->weight_release) be->ops->weight_release(be, w);
}

/* ---- ops ---- */

#define BE(t) ((t)->buf->be)
/* Whether be runs the op of table entry `entry` (bk_op op) itself. */
#define RUNS(be, entry, op) ((be)->ops->entry && (!(be)->ops->supports_op || (be)->ops->supports_op((be), (op))))
/* The op on be, else on the host. */
#define OR_HOST(be, entry, op, ...)                                \
  do {                                                             \
    bk_backend *be_ = (be);                                        \
    if (RUNS(be_, entry, op)) be_->ops->entry(be_, __VA_ARGS__);   \
    else host_##entry(be_, __VA_ARGS__);                           \
  } while (0)
/* The op on be, else refused (no host path). */
#define OR_REFUSE(be, entry, op, ...)                              \
  do {                                                             \
    bk_backend *be_ = (be);                                        \
    if (RUNS(be_, entry, op)) be_->ops->entry(be_, __VA_ARGS__);   \
    else refuse(be_, op);                                          \
  } while (0)

void bk_embed(const bk_tensor *y, const bk_weight *table, const bk_tensor *ids, float scale) {
  OR_REFUSE(BE(y), embed, BK_OP_EMBED, y, table, ids, scale);
}
void bk_matmul_t(const bk_tensor *y, const bk_tensor *x, const bk_weight *w, const bk_tensor *bias) {
  OR_REFUSE(BE(y), matmul, BK_OP_MATMUL, y, x, w, bias);
}
void bk_rmsnorm(const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, float eps, bool unit_offset) {
  OR_HOST(BE(y), rmsnorm, BK_OP_RMSNORM, y, x, w, eps, unit_offset);
}
void bk_rope(const bk_tensor *x, int64_t n_heads, int64_t head_dim, const bk_tensor *pos, const rope_table *t) {
  OR_HOST(BE(x), rope, BK_OP_ROPE, x, n_heads, head_dim, pos, t);
}
void bk_act_mul(const bk_tensor *gate, const bk_tensor *up, bk_act act) { OR_HOST(BE(gate), act_mul, BK_OP_ACT_MUL, gate, up, act); }
void bk_add(const bk_tensor *y, const bk_tensor *a, const bk_tensor *b) { OR_HOST(BE(y), add, BK_OP_ADD, y, a, b); }
void bk_add_rmsnorm(const bk_tensor *x, const bk_tensor *d, const bk_tensor *y, const bk_tensor *w, float eps,
                    bool unit_offset) {
  bk_backend *be = BE(y);
  if (RUNS(be, add_rmsnorm, BK_OP_ADD_RMSNORM)) {
    be->ops->add_rmsnorm(be, x, d, y, w, eps, unit_offset);
    return;
  }
  bk_add(x, x, d);
  bk_rmsnorm(y, x, w, eps, unit_offset);
}
void bk_softcap(const bk_tensor *x, float cap) { OR_HOST(BE(x), softcap, BK_OP_SOFTCAP, x, cap); }
void bk_get_rows(const bk_tensor *y, const bk_tensor *x, const bk_tensor *rows) { OR_HOST(BE(y), get_rows, BK_OP_GET_ROWS, y, x, rows); }
void bk_scale(const bk_tensor *x, float s) { OR_HOST(BE(x), scale, BK_OP_SCALE, x, s); }
void bk_get_cols(const bk_tensor *y, const bk_tensor *x, int64_t c0) { OR_HOST(BE(y), get_cols, BK_OP_GET_COLS, y, x, c0); }
void bk_lora(const bk_tensor *y, const bk_tensor *x, const bk_tensor *a, const bk_tensor *b, float scale) {
  OR_HOST(BE(y), lora, BK_OP_LORA, y, x, a, b, scale);
}
void bk_moe_route(const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits, bool norm, const bk_tensor *scale) {
  OR_HOST(BE(ids), moe_route, BK_OP_MOE_ROUTE, ids, w, logits, norm, scale);
}
void bk_moe(const bk_tensor *y, const bk_tensor *x, const bk_tensor *ids, const bk_tensor *w, const bk_experts *ex, bk_act act) {
  if (ex->n_lora > 0 && !BE(y)->expert_lora) return; /* refused when such an adapter is loaded */
  OR_REFUSE(BE(y), moe, BK_OP_MOE, y, x, ids, w, ex, act);
}
void bk_conv1d(const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, const bk_recurrent *r, bool silu) {
  OR_REFUSE(BE(y), conv1d, BK_OP_CONV1D, y, x, w, r, silu);
}
void bk_delta_rule(const bk_tensor *o, const bk_tensor *qkv, const bk_tensor *a, const bk_tensor *b, const bk_tensor *a_log,
                   const bk_tensor *dt_bias, const bk_recurrent *r, const delta_params *p) {
  OR_REFUSE(BE(o), delta_rule, BK_OP_DELTA_RULE, o, qkv, a, b, a_log, dt_bias, r, p);
}
void bk_sigmoid_mul(const bk_tensor *y, const bk_tensor *g) { OR_HOST(BE(y), sigmoid_mul, BK_OP_SIGMOID_MUL, y, g); }
void bk_set_cols(const bk_tensor *y, const bk_tensor *x, int64_t c0) { OR_HOST(BE(y), set_cols, BK_OP_SET_COLS, y, x, c0); }
void bk_set_rows(const bk_tensor *y, const bk_tensor *x, const bk_tensor *rows) { OR_HOST(BE(y), set_rows, BK_OP_SET_ROWS, y, x, rows); }
void bk_activate(const bk_tensor *x, bk_act act) { OR_HOST(BE(x), act, BK_OP_ACT, x, act); }
void bk_clamp(const bk_tensor *x, float lo, float hi) { OR_HOST(BE(x), clamp, BK_OP_CLAMP, x, lo, hi); }
void bk_embed_bag(const bk_tensor *y, const bk_tensor *table, const bk_tensor *ids, const bk_tensor *w) {
  OR_HOST(BE(y), embed_bag, BK_OP_EMBED_BAG, y, table, ids, w);
}
void bk_attention_rel(const bk_tensor *out, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v, const bk_tensor *rel,
                      const bk_tensor *qscale, int64_t n_valid, const rel_attn_params *p) {
  OR_REFUSE(BE(out), attention_rel, BK_OP_ATTENTION_REL, out, q, k, v, rel, qscale, n_valid, p);
}
void bk_layernorm(const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, const bk_tensor *b, float eps) {
  OR_HOST(BE(y), layernorm, BK_OP_LAYERNORM, y, x, w, b, eps);
}
void bk_moe_route_group(const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits, const bk_tensor *bias,
                        int64_t n_group, int64_t topk_group, bool norm, float scale) {
  OR_HOST(BE(ids), moe_route_group, BK_OP_MOE_ROUTE_GROUP, ids, w, logits, bias, n_group, topk_group, norm, scale);
}
void bk_index_topk(const bk_tensor *sel, const bk_tensor *q, const bk_tensor *w, const bk_kv_layer *keys,
                   const bk_attn_index *ix, const index_params *p) {
  OR_REFUSE(BE(sel), index_topk, BK_OP_INDEX_TOPK, sel, q, w, keys, ix, p);
}
void bk_attention_sparse(const bk_tensor *out, const bk_tensor *q, const bk_kv_layer *kv, const bk_attn_index *ix,
                         const bk_tensor *sel, const sparse_attn_params *p) {
  OR_REFUSE(BE(out), attention_sparse, BK_OP_ATTENTION_SPARSE, out, q, kv, ix, sel, p);
}
bool bk_graph_begin(bk_backend *be, uint64_t key) { return be->ops->graph_begin ? be->ops->graph_begin(be, key) : false; }
int bk_graph_end(bk_backend *be, herr *err) {
  return with_refused(be, be->ops->graph_end ? be->ops->graph_end(be, err) : 0, err);
}

int bk_sample(const bk_tensor *logits, const bk_sample_row *rows, const bk_sample_adj *adj, int64_t n_adj,
              bk_sample_out *out, herr *err) {
  if (logits->dt != BK_DT_F32) return herr_set(err, HEARTH_EINVAL, "bk_sample: logits must be f32");
  for (int64_t r = 0; r < logits->rows; r++) {
    const bk_sample_row *w = &rows[r];
    if (w->top_logprobs < 0 || w->top_logprobs > BK_SAMPLE_MAX_TOP || w->n_pen < 0 || w->n_bias < 0 || w->pen_off < 0 ||
        w->bias_off < 0 || (int64_t)w->pen_off + w->n_pen > n_adj || (int64_t)w->bias_off + w->n_bias > n_adj)
      return herr_set(err, HEARTH_EINVAL, "bk_sample: row %lld has bad parameters", (long long)r);
  }
  for (int64_t i = 0; i < n_adj; i++)
    if (adj[i].id < 0 || adj[i].id >= logits->cols)
      return herr_set(err, HEARTH_EINVAL, "bk_sample: adjustment for token %d outside the vocabulary", (int)adj[i].id);
  bk_backend *be = BE(logits);
  int rc = RUNS(be, sample, BK_OP_SAMPLE) ? be->ops->sample(be, logits, rows, adj, n_adj, out, err)
                                          : host_sample(be, logits, rows, adj, n_adj, out, err);
  return with_refused(be, rc, err); /* sampling waits for the queued work, as bk_get does */
}
void bk_kv_write(const bk_kv_layer *kv, const bk_tensor *k_new, const bk_tensor *v_new, const bk_tensor *slot) {
  OR_REFUSE(BE(k_new), kv_write, BK_OP_KV_WRITE, kv, k_new, v_new, slot);
}
void bk_attention(const bk_tensor *out, const bk_tensor *q, const bk_kv_layer *kv, const bk_attn_index *ix, const attn_params *p) {
  OR_REFUSE(BE(out), attention, BK_OP_ATTENTION, out, q, kv, ix, p);
}
