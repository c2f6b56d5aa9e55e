/* backend.c — opening a backend by device name (the CPU in-process, CUDA by
 * loading libhearth_cuda.so at run time so that a binary built with CUDA
 * still starts where the CUDA libraries are absent) and the thin dispatch
 * of every bk_* call through the backend's table. Shape checks that are
 * programming errors stay here, once, for every backend. Knows nothing of
 * models. */
#include "backend/backend.h"

#include <dlfcn.h>
#include <unistd.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
void bk_backend_describe(const bk_backend *be, char *buf, size_t n) { be->ops->describe(be, buf, n); }
int bk_mem_info(bk_backend *be, size_t *free_bytes, size_t *total_bytes) { return be->ops->mem_info(be, free_bytes, total_bytes); }

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
  return src->buf->be->ops->get(src->buf->be, dst, (const char *)bk_addr(src) + off, n, err);
}

void bk_copy(const bk_tensor *dst, size_t dst_off, const bk_tensor *src, size_t src_off, size_t n) {
  if (n) dst->buf->be->ops->copy(dst->buf->be, (char *)bk_addr(dst) + dst_off, (const char *)bk_addr(src) + src_off, n);
}

int bk_sync(bk_backend *be, herr *err) { return be->ops->sync(be, err); }

/* ---- weights ---- */

int bk_weight_load(bk_backend *be, bk_weight *w, unsigned use, herr *err) { return be->ops->weight_load(be, w, use, err); }
void bk_weight_release(bk_backend *be, bk_weight *w) { be->ops->weight_release(be, w); }

/* ---- ops ---- */

#define BE(t) ((t)->buf->be)

void bk_embed(const bk_tensor *y, const bk_weight *table, const bk_tensor *ids, float scale) {
  BE(y)->ops->embed(BE(y), y, table, ids, scale);
}
void bk_matmul_t(const bk_tensor *y, const bk_tensor *x, const bk_weight *w, const bk_tensor *bias) {
  BE(y)->ops->matmul(BE(y), y, x, w, bias);
}
void bk_rmsnorm(const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, float eps, bool unit_offset) {
  BE(y)->ops->rmsnorm(BE(y), y, x, w, eps, unit_offset);
}
void bk_rope(const bk_tensor *x, int64_t n_heads, int64_t head_dim, const bk_tensor *pos, const rope_table *t) {
  BE(x)->ops->rope(BE(x), x, n_heads, head_dim, pos, t);
}
void bk_act_mul(const bk_tensor *gate, const bk_tensor *up, bk_act act) { BE(gate)->ops->act_mul(BE(gate), gate, up, act); }
void bk_add(const bk_tensor *y, const bk_tensor *a, const bk_tensor *b) { BE(y)->ops->add(BE(y), y, a, b); }
void bk_softcap(const bk_tensor *x, float cap) { BE(x)->ops->softcap(BE(x), x, cap); }
void bk_get_rows(const bk_tensor *y, const bk_tensor *x, const bk_tensor *rows) { BE(y)->ops->get_rows(BE(y), y, x, rows); }
void bk_scale(const bk_tensor *x, float s) { BE(x)->ops->scale(BE(x), x, s); }
void bk_get_cols(const bk_tensor *y, const bk_tensor *x, int64_t c0) { BE(y)->ops->get_cols(BE(y), y, x, c0); }
void bk_lora(const bk_tensor *y, const bk_tensor *x, const bk_tensor *a, const bk_tensor *b, float scale) {
  BE(y)->ops->lora(BE(y), y, x, a, b, scale);
}
void bk_moe_route(const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits, bool norm, const bk_tensor *scale) {
  BE(ids)->ops->moe_route(BE(ids), ids, w, logits, norm, scale);
}
void bk_moe(const bk_tensor *y, const bk_tensor *x, const bk_tensor *ids, const bk_tensor *w, const bk_experts *ex, bk_act act) {
  if (ex->n_lora > 0 && !BE(y)->expert_lora) return; /* refused when such an adapter is loaded */
  BE(y)->ops->moe(BE(y), y, x, ids, w, ex, act);
}
void bk_conv1d(const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, const bk_recurrent *r, bool silu) {
  BE(y)->ops->conv1d(BE(y), y, x, w, r, silu);
}
void bk_delta_rule(const bk_tensor *o, const bk_tensor *qkv, const bk_tensor *a, const bk_tensor *b, const bk_tensor *a_log,
                   const bk_tensor *dt_bias, const bk_recurrent *r, const delta_params *p) {
  BE(o)->ops->delta_rule(BE(o), o, qkv, a, b, a_log, dt_bias, r, p);
}
void bk_sigmoid_mul(const bk_tensor *y, const bk_tensor *g) { BE(y)->ops->sigmoid_mul(BE(y), y, g); }
void bk_set_cols(const bk_tensor *y, const bk_tensor *x, int64_t c0) { BE(y)->ops->set_cols(BE(y), y, x, c0); }
void bk_set_rows(const bk_tensor *y, const bk_tensor *x, const bk_tensor *rows) { BE(y)->ops->set_rows(BE(y), y, x, rows); }
void bk_activate(const bk_tensor *x, bk_act act) { BE(x)->ops->act(BE(x), x, act); }
void bk_clamp(const bk_tensor *x, float lo, float hi) { BE(x)->ops->clamp(BE(x), x, lo, hi); }
void bk_embed_bag(const bk_tensor *y, const bk_tensor *table, const bk_tensor *ids, const bk_tensor *w) {
  BE(y)->ops->embed_bag(BE(y), y, table, ids, w);
}
void bk_attention_rel(const bk_tensor *out, const bk_tensor *q, const bk_tensor *k, const bk_tensor *v, const bk_tensor *rel,
                      const bk_tensor *qscale, int64_t n_valid, const rel_attn_params *p) {
  BE(out)->ops->attention_rel(BE(out), out, q, k, v, rel, qscale, n_valid, p);
}
void bk_layernorm(const bk_tensor *y, const bk_tensor *x, const bk_tensor *w, const bk_tensor *b, float eps) {
  BE(y)->ops->layernorm(BE(y), y, x, w, b, eps);
}
void bk_moe_route_group(const bk_tensor *ids, const bk_tensor *w, const bk_tensor *logits, const bk_tensor *bias,
                        int64_t n_group, int64_t topk_group, bool norm, float scale) {
  BE(ids)->ops->moe_route_group(BE(ids), ids, w, logits, bias, n_group, topk_group, norm, scale);
}
void bk_index_topk(const bk_tensor *sel, const bk_tensor *q, const bk_tensor *w, const bk_kv_layer *keys,
                   const bk_attn_index *ix, const index_params *p) {
  BE(sel)->ops->index_topk(BE(sel), sel, q, w, keys, ix, p);
}
void bk_attention_sparse(const bk_tensor *out, const bk_tensor *q, const bk_kv_layer *kv, const bk_attn_index *ix,
                         const bk_tensor *sel, const sparse_attn_params *p) {
  BE(out)->ops->attention_sparse(BE(out), out, q, kv, ix, sel, p);
}
bool bk_graph_begin(bk_backend *be, uint64_t key) { return be->ops->graph_begin ? be->ops->graph_begin(be, key) : false; }
int bk_graph_end(bk_backend *be, herr *err) { return be->ops->graph_end ? be->ops->graph_end(be, err) : 0; }

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
  return BE(logits)->ops->sample(BE(logits), logits, rows, adj, n_adj, out, err);
}
void bk_kv_write(const bk_kv_layer *kv, const bk_tensor *k_new, const bk_tensor *v_new, const bk_tensor *slot) {
  BE(k_new)->ops->kv_write(BE(k_new), kv, k_new, v_new, slot);
}
void bk_attention(const bk_tensor *out, const bk_tensor *q, const bk_kv_layer *kv, const bk_attn_index *ix, const attn_params *p) {
  BE(out)->ops->attention(BE(out), out, q, kv, ix, p);
}
