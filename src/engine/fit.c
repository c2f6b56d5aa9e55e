/* fit.c — `hearth fit` and GET /fit (see fit.h and hearth.h): the model's
 * layers and KV geometry from its config (model_load with geometry_only:
 * no weights read), the KV bytes from the paged pool's own block size
 * function, the weights from the files' tensor index, the memory from
 * /proc/meminfo or the GPU, and a measured bandwidth. Knows nothing of HTTP
 * or the command line. */
#include "engine/fit.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/file.h"
#include "base/pool.h"
#include "engine/request.h"
#include "engine/kv_paged.h"
#include "engine/sched.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/gguf_model.h"
#include "model/model.h"

#define BANDWIDTH_BYTES ((size_t)256 << 20)
#define RUNTIME_CPU ((int64_t)64 << 20)  /* thread stacks, index tables, the program */
#define RUNTIME_GPU ((int64_t)512 << 20) /* a CUDA context, cuBLAS workspace, graphs */

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- bandwidth ---- */

typedef struct bw_ctx {
  const uint64_t *buf;
  size_t words;
  int parts;
  uint64_t sink[256];
} bw_ctx;

static void bw_read(void *arg, int i, int tid) {
  (void)tid;
  bw_ctx *c = arg;
  size_t per = c->words / (size_t)c->parts / 8 * 8, lo = per * (size_t)i, hi = i == c->parts - 1 ? c->words / 8 * 8 : lo + per;
  uint64_t a[8] = {0};
  for (size_t w = lo; w < hi; w += 8)
    for (int k = 0; k < 8; k++) a[k] ^= c->buf[w + (size_t)k];
  c->sink[i & 255] = a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7];
}

static double host_bandwidth(int threads, size_t bytes) {
  hpool *p = hpool_create(threads);
  uint64_t *buf = malloc(bytes);
  double best = 0;
  if (p && buf) {
    memset(buf, 1, bytes); /* pages in */
    bw_ctx c = {.buf = buf, .words = bytes / 8, .parts = hpool_size(p)};
    if (c.parts > 256) c.parts = 256;
    for (int pass = 0; pass < 5; pass++) {
      double t0 = now_seconds();
      hpool_for(p, c.parts, bw_read, &c);
      double t = now_seconds() - t0;
      if (t > 0 && (double)(c.words / 8 * 8 * 8) / t > best) best = (double)(c.words / 8 * 8 * 8) / t;
    }
  }
  free(buf);
  if (p) hpool_destroy(p);
  return best;
}

static double device_bandwidth(bk_backend *be, size_t bytes) {
  bk_buf *a = NULL, *b = NULL;
  herr e = {0};
  double best = 0;
  if (bk_buf_new(be, bytes, &a, &e) == 0 && bk_buf_new(be, bytes, &b, &e) == 0) {
    int64_t n = (int64_t)(bytes / 4);
    bk_tensor ta = {.buf = a, .dt = BK_DT_F32, .rows = 1, .cols = n}, tb = {.buf = b, .dt = BK_DT_F32, .rows = 1, .cols = n};
    bk_copy(&tb, 0, &ta, 0, bytes); /* warm up */
    if (bk_sync(be, &e) == 0) {
      for (int pass = 0; pass < 5; pass++) {
        double t0 = now_seconds();
        for (int k = 0; k < 4; k++) bk_copy(pass & 1 ? &ta : &tb, 0, pass & 1 ? &tb : &ta, 0, bytes);
        if (bk_sync(be, &e)) break;
        double t = now_seconds() - t0;
        if (t > 0 && 8.0 * (double)bytes / t > best) best = 8.0 * (double)bytes / t;
      }
    }
  }
  bk_buf_free(a);
  bk_buf_free(b);
  return best;
}

double fit_bandwidth(bk_backend *be, int threads, size_t bytes) {
  if (be && !bk_backend_is_cpu(be)) return device_bandwidth(be, bytes);
  return host_bandwidth(threads, bytes);
}

/* ---- memory ---- */

static int64_t mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  long long kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
  fclose(f);
  return (int64_t)kb * 1024;
}

/* ---- weights ---- */

/* Tensors that are not the language model's (a multimodal checkpoint's towers). */
static bool other_tower(const char *name) {
  static const char *const parts[] = {"vision_tower", "audio_tower", "embed_vision", "embed_audio", "multi_modal_projector",
                                      "visual.", "vision_model", "mm_projector"};
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
    if (strstr(name, parts[i])) return true;
  return false;
}

static bool expert_tensor(const char *name) { return strstr(name, ".experts.") || strstr(name, "_exps."); }

/* Token tables of which a decoded token reads one row (the input embedding
 * when the head has its own weights; Gemma's per-layer input tables). */
static bool row_table(const char *name, bool tied) {
  if (strstr(name, "per_layer") && (strstr(name, "embed") || strstr(name, "embd"))) return true;
  bool input = strstr(name, "embed_tokens.weight") || !strcmp(name, "token_embd.weight");
  return input && !tied;
}

typedef struct weight_sums {
  int64_t total, experts, row_tables;
} weight_sums;

static void add_tensor(weight_sums *w, const char *name, int64_t bytes, bool tied) {
  if (other_tower(name)) return;
  w->total += bytes;
  if (expert_tensor(name)) w->experts += bytes;
  else if (row_table(name, tied)) w->row_tables += bytes;
}

static int weight_bytes(const char *path, bool tied, weight_sums *w, herr *err) {
  memset(w, 0, sizeof *w);
  if (gguf_model_is_gguf(path)) {
    gguf_file *g = NULL;
    int rc = gguf_open_mode(&g, path, HMMAP_MAP, err);
    if (rc) return rc;
    for (size_t i = 0; i < gguf_tensor_count(g); i++) {
      const gguf_tensor *t = gguf_tensor_at(g, i);
      add_tensor(w, t->name, (int64_t)t->nbytes, tied);
    }
    gguf_close(g);
    return 0;
  }
  st_set st;
  int rc = st_open_mode(&st, path, HMMAP_MAP, err);
  if (rc) return rc;
  for (size_t i = 0; i < st.count; i++) add_tensor(w, st.tensors[i].name, (int64_t)st.tensors[i].nbytes, tied);
  st_close(&st);
  return 0;
}

/* ---- the fit ---- */

/* Weights a decode step of `batch` sequences reads: everything but the row
 * tables, with the experts that batch tokens choose at random (each expert
 * missed by all of them with probability (1 - k/E)^batch). */
static double active_bytes(const hearth_fit_result *r, const weight_sums *w, int64_t batch) {
  double dense = (double)(w->total - w->experts - w->row_tables);
  if (r->n_experts <= 0 || r->experts_per_token <= 0) return dense + (double)w->experts;
  double miss = pow(1.0 - (double)r->experts_per_token / (double)r->n_experts, (double)batch);
  return dense + (double)w->experts * (1.0 - miss);
}

int fit_model(const char *path, const hearth_fit_opts *o, const kv_quant *quant, bk_backend *be, int64_t held,
              double *bandwidth, hearth_fit_result *out, herr *err) {
  hearth_fit_opts opts = o ? *o : (hearth_fit_opts){0};
  memset(out, 0, sizeof *out);
  model *m = NULL;
  int rc = model_load(path, &(model_load_opts){.threads = 1, .geometry_only = true}, &m, err);
  if (rc) return rc;
  const model_config *c = model_cfg(m);
  model_kv_geometry g;
  model_kv_geometry_of(m, &g);
  g.backend = NULL;
  /* each layer's K / V storage, as the engine sets it at load */
  kv_quant made;
  if (!quant) {
    if ((rc = kv_quant_make(opts.kv_quant, opts.kv_quant_config, g.n_layers, &made, err))) {
      model_free(m);
      return rc;
    }
    quant = &made;
  }
  kv_quant_apply(quant, &g);
  snprintf(out->model_type, sizeof out->model_type, "%s", c->model_type);
  out->context_length = c->max_position_embeddings > 0 ? c->max_position_embeddings : 4096;
  out->context = opts.context > 0 ? opts.context : out->context_length;
  out->batch = opts.batch > 0 ? opts.batch : 1;
  out->n_experts = c->num_experts;
  out->experts_per_token = c->num_experts_per_tok;
  /* the KV cache as the serving pool lays it out */
  int B = SCHED_DEFAULT_BLOCK_TOKENS;
  out->kv_block_tokens = B;
  out->n_layers = g.n_layers;
  out->kv_bytes_per_token = (int64_t)(kv_block_bytes(&g, B) / (size_t)B);
  for (int l = 0; l < g.n_layers && l < HEARTH_FIT_MAX_LAYERS; l++) {
    model_kv_geometry one = {.n_layers = 1};
    one.kv_dim[0] = g.kv_dim[l];
    one.v_dim[0] = g.v_dim[l];
    one.k_fmt[0] = g.k_fmt[l];
    one.v_fmt[0] = g.v_fmt[l];
    out->kv_layer_bytes_per_token[l] = (int64_t)(kv_block_bytes(&one, B) / (size_t)B);
    out->kv_layers += g.kv_dim[l] > 0;
  }
  kv_format_describe(&g, out->kv_format, sizeof out->kv_format);
  out->kv_bytes = out->kv_bytes_per_token * out->context * out->batch;
  for (int l = 0; l < g.n_layers; l++) {
    out->state_layers += g.state_dim[l] > 0;
    out->state_bytes_per_sequence += g.state_dim[l] * (int64_t)sizeof(float);
  }
  out->state_bytes = out->state_bytes_per_sequence * out->batch;
  /* the forward's scratch: the widest activations of a serving step, and the logits */
  int64_t q = 0, kv = 0;
  for (int l = 0; l < c->num_hidden_layers; l++) {
    if (c->num_attention_heads * c->layer_head_dim[l] > q) q = c->num_attention_heads * c->layer_head_dim[l];
    if (g.kv_dim[l] > kv) kv = g.kv_dim[l];
  }
  int64_t step = out->batch > GEN_DEFAULT_PREFILL_CHUNK ? out->batch : GEN_DEFAULT_PREFILL_CHUNK;
  int64_t per_token = 4 * c->hidden_size + 2 * q + 2 * kv + 3 * c->intermediate_size +
                      (c->num_experts > 0 ? 3 * c->num_experts_per_tok * c->moe_intermediate_size + c->num_experts : 0);
  out->activation_bytes = step * per_token * 4 + 2 * out->batch * c->vocab_size * 4;
  bool tied = c->tie_word_embeddings;
  model_free(m);
  weight_sums w;
  if ((rc = weight_bytes(path, tied, &w, err))) return rc;
  out->weight_bytes = w.total;
  out->expert_bytes = w.experts;
  out->active_weight_bytes = (int64_t)active_bytes(out, &w, 1);
  /* the device: its memory and bandwidth */
  bk_backend *own = NULL;
  if (!be && opts.device && strcmp(opts.device, "cpu") != 0) {
    if ((rc = bk_backend_open(opts.device, &(bk_open_opts){.threads = 1}, &own, err))) return rc;
    be = own;
  }
  bool gpu = be && !bk_backend_is_cpu(be);
  if (be) bk_backend_describe(be, out->device, sizeof out->device);
  else snprintf(out->device, sizeof out->device, "cpu (%d threads)", opts.threads > 0 ? opts.threads : hpool_cpu_count());
  int64_t tok_bytes = 0;
  if (!gpu && hfile_is_dir(path)) {
    char *tj = hpath_join(path, "tokenizer.json");
    struct stat sb;
    if (tj && stat(tj, &sb) == 0) tok_bytes = (int64_t)sb.st_size * 4; /* its vocabulary and merges in memory */
    free(tj);
  }
  out->runtime_bytes = (gpu ? RUNTIME_GPU : RUNTIME_CPU) + tok_bytes;
  out->overhead_bytes = out->activation_bytes + out->runtime_bytes;
  out->need_bytes = out->weight_bytes + out->kv_bytes + out->state_bytes + out->overhead_bytes;
  if (gpu) {
    size_t fr = 0, tot = 0;
    if (bk_mem_info(be, &fr, &tot) == 0) out->available_bytes = (int64_t)fr;
    snprintf(out->memory_source, sizeof out->memory_source, "%s free", bk_backend_name(be));
  } else {
    out->available_bytes = mem_available();
    snprintf(out->memory_source, sizeof out->memory_source, "MemAvailable");
  }
  if (opts.memory_bytes > 0) {
    out->available_bytes = opts.memory_bytes;
    snprintf(out->memory_source, sizeof out->memory_source, "given");
  } else if (held > 0) {
    out->available_bytes += held;
    size_t n = strlen(out->memory_source);
    snprintf(out->memory_source + n, sizeof out->memory_source - n, " + held by the model");
  }
  out->context_exceeds_model = out->context > out->context_length;
  out->fits = out->need_bytes <= out->available_bytes && !out->context_exceeds_model;
  int64_t room = out->available_bytes - out->weight_bytes - out->overhead_bytes;
  if (room > out->state_bytes) {
    int64_t ctx = out->kv_bytes_per_token > 0 ? (room - out->state_bytes) / (out->kv_bytes_per_token * out->batch)
                                              : out->context_length;
    out->max_context = ctx < out->context_length ? ctx : out->context_length;
    int64_t per_seq = out->kv_bytes_per_token * out->context + out->state_bytes_per_sequence;
    out->max_batch = per_seq > 0 ? room / per_seq : 0;
  }
  /* the speed a memory-bound decode step reaches */
  double bw = bandwidth && *bandwidth > 0 ? *bandwidth : 0;
  if (bw <= 0 && !opts.no_bandwidth) {
    size_t bytes = BANDWIDTH_BYTES;
    if (!gpu && out->available_bytes > 0 && (size_t)out->available_bytes / 8 < bytes) bytes = (size_t)out->available_bytes / 8;
    bw = fit_bandwidth(be, opts.threads, bytes);
    if (bandwidth) *bandwidth = bw;
  }
  out->bandwidth = bw;
  if (bw > 0) {
    /* a recurrent layer reads and writes its state once a token */
    double per_seq = (double)out->kv_bytes_per_token * (double)out->context + 2.0 * (double)out->state_bytes_per_sequence;
    double step_bytes = active_bytes(out, &w, out->batch) + (double)out->batch * per_seq;
    out->decode_tok_s = bw / step_bytes;
    out->decode_tok_s_total = out->decode_tok_s * (double)out->batch;
    out->decode_tok_s_short = bw / (active_bytes(out, &w, 1) + 2.0 * (double)out->state_bytes_per_sequence);
  }
  bk_backend_close(own);
  return 0;
}

int hearth_fit(const char *path, const hearth_fit_opts *opts, hearth_fit_result *out, hearth_error *err) {
  if (!path) return herr_set(err, HEARTH_EINVAL, "hearth_fit: no path");
  if (!hfile_exists(path)) return herr_set(err, HEARTH_ENOTFOUND, "%s: no such model folder or file", path);
  return fit_model(path, opts, NULL, NULL, 0, NULL, out, err);
}

int hearth_fit_json(const hearth_fit_result *r, char **json, hearth_error *err) {
  *json = NULL;
  json_t *layers = json_array();
  for (int l = 0; l < r->n_layers && l < HEARTH_FIT_MAX_LAYERS; l++)
    json_array_append_new(layers, json_integer(r->kv_layer_bytes_per_token[l]));
  json_t *o = json_pack(
      "{s:s, s:s, s:I, s:I, s:I, s:{s:I, s:I, s:I, s:I, s:I}, s:{s:I, s:I, s:I, s:s, s:I, s:o, s:I}, s:{s:I, s:I, "
      "s:I}, s:I, s:{s:I, s:s}, s:b, s:I, s:I}",
      "model_type", r->model_type, "device", r->device, "context_length", (json_int_t)r->context_length, "context",
      (json_int_t)r->context, "batch", (json_int_t)r->batch,                                           /* */
      "weights", "bytes", (json_int_t)r->weight_bytes, "active_bytes", (json_int_t)r->active_weight_bytes,
      "expert_bytes", (json_int_t)r->expert_bytes, "experts", (json_int_t)r->n_experts, "experts_per_token",
      (json_int_t)r->experts_per_token,                                                                 /* */
      "kv", "layers", (json_int_t)r->n_layers, "stored_layers", (json_int_t)r->kv_layers, "block_tokens",
      (json_int_t)r->kv_block_tokens, "format", r->kv_format, "bytes_per_token", (json_int_t)r->kv_bytes_per_token,
      "layer_bytes_per_token", layers, "bytes", (json_int_t)r->kv_bytes,                                /* */
      "overhead", "activation_bytes", (json_int_t)r->activation_bytes, "runtime_bytes", (json_int_t)r->runtime_bytes,
      "bytes", (json_int_t)r->overhead_bytes,                                                           /* */
      "need_bytes", (json_int_t)r->need_bytes,                                                          /* */
      "memory", "available_bytes", (json_int_t)r->available_bytes, "source", r->memory_source,        /* */
      "fits", r->fits, "max_context", (json_int_t)r->max_context, "max_batch", (json_int_t)r->max_batch);
  if (!o) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  json_object_set_new(o, "context_exceeds_model", json_boolean(r->context_exceeds_model));
  json_t *state = json_object();
  json_object_set_new(state, "layers", json_integer(r->state_layers));
  json_object_set_new(state, "bytes_per_sequence", json_integer(r->state_bytes_per_sequence));
  json_object_set_new(state, "bytes", json_integer(r->state_bytes));
  json_object_set_new(o, "recurrent_state", state);
  json_t *speed = json_object();
  json_object_set_new(speed, "bandwidth_bytes_per_s", r->bandwidth > 0 ? json_real(r->bandwidth) : json_null());
  json_object_set_new(speed, "decode_tok_s", r->bandwidth > 0 ? json_real(r->decode_tok_s) : json_null());
  json_object_set_new(speed, "decode_tok_s_total", r->bandwidth > 0 ? json_real(r->decode_tok_s_total) : json_null());
  json_object_set_new(speed, "decode_tok_s_short_context", r->bandwidth > 0 ? json_real(r->decode_tok_s_short) : json_null());
  json_object_set_new(o, "predicted", speed);
  *json = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  json_decref(o);
  return *json ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
}
