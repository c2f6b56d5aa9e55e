/* convert.c — `hearth convert SRC DST`: rewrites a model folder (safetensors
 * f32/f16/bf16 or MLX affine) or a GGUF file as a GGUF file or a Hugging Face
 * folder, quantizing on the way with the backend's quantizers
 * (backend/formats.h) — no Python.
 *
 * To GGUF: llama.cpp's layout for the llama, qwen2 and qwen3 architectures
 * (metadata keys, tensor names, llama's q/k row permutation, norms in F32,
 * llama3 RoPE as a rope_freqs tensor) and the tokenizer from tokenizer.json
 * as tokenizer.ggml.* (gpt2-style BPE with merges and a pre-tokenizer name,
 * or llama SPM with scores from the merge ranks). Every matrix gets the
 * chosen type ("pure"); a matrix whose rows are not whole blocks of it falls
 * back to q4_0, then f16.
 * To safetensors: model.safetensors + config.json (+ an MLX "quantization"
 * block for mlx4/mlx8; for fp8, E4M3 matrices with per-row f32 scales and an
 * fbgemm_fp8 "quantization_config") and the tokenizer files copied.
 *
 * Knows file layouts and names; refuses to know how the forward pass runs.
 * Uses internal modules (format/ readers and writers, backend/weights.h and
 * backend/formats.h, model/gguf_model.h), not hearth.h: the public API
 * has no access to tensors.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/formats.h"
#include "backend/weights.h"
#include "base/buf.h"
#include "base/file.h"
#include "base/json.h"
#include "base/vec.h"
#include "cli/cli.h"
#include "format/config.h"
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "format/safetensors.h"
#include "format/safetensors_write.h"
#include "model/gguf_model.h"
#include "model/model.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: hearth convert SRC DST [--to gguf|safetensors] [--quant TYPE] [--group-size 32|64|128] [--pre NAME]\n\n"
          "Converts a model folder (safetensors f32/f16/bf16 or MLX 4/8-bit) or a GGUF file.\n"
          "  --to          gguf (a file; default when DST ends in .gguf) or safetensors (a folder)\n"
          "  --quant       gguf: f32 f16 bf16 q8_0 q4_0 q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k iq4_nl iq4_xs;\n"
          "                safetensors: f32 f16 bf16 mlx4 mlx8 fp8\n"
          "                (fp8: E4M3 matrices with one f32 scale per output row, NAME_scale [rows, 1];\n"
          "                the embedding stays in the float dtype)\n"
          "                (default: the source's dtype)\n"
          "  --group-size  MLX group size (default 64)\n"
          "  --pre         llama.cpp pre-tokenizer name for a BPE tokenizer hearth does not recognise\n"
          "Matrices are quantized; norms and biases stay f32 (GGUF) or the float dtype (safetensors).\n"
          "GGUF export supports model_type llama, mistral, qwen2, qwen3.\n");
}

/* ---- the source model ---- */

typedef struct src_tensor {
  char hf[256];             /* Hugging Face name */
  int ndim;                 /* 1 or 2 (HF order: [rows, cols]) */
  int64_t rows, cols;       /* 1-D: rows = 1, cols = n */
  const st_tensor *st;      /* borrowed: safetensors float tensor, or MLX packed weight */
  const st_tensor *scales, *biases; /* borrowed: MLX only */
  const gguf_tensor *gt;    /* borrowed: GGUF tensor */
} src_tensor;

typedef struct src_model {
  const char *path;
  char *dir;                /* owned: folder holding tokenizer files */
  bool is_gguf;
  st_set st;
  bool st_opened;
  gguf_file *gg;            /* owned or NULL */
  model_config cfg;
  bool cfg_loaded;
  bool gguf_llama;          /* a llama GGUF: q/k rows are permuted in the file */
  src_tensor *ts;           /* owned */
  int nt, cap_ts;
} src_model;

static void src_close(src_model *s) {
  if (s->st_opened) st_close(&s->st);
  gguf_close(s->gg);
  if (s->cfg_loaded) config_free(&s->cfg);
  free(s->ts);
  free(s->dir);
}


static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

static int add_src(src_model *s, const src_tensor *t, herr *err) {
  if (s->nt == s->cap_ts && !HGROW(s->ts, s->cap_ts, s->nt + 1)) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  s->ts[s->nt++] = *t;
  return 0;
}

static int src_open(src_model *s, const char *path, herr *err) {
  memset(s, 0, sizeof *s);
  s->path = path;
  int rc;
  s->is_gguf = gguf_model_is_gguf(path);
  s->dir = s->is_gguf ? hpath_dir(path) : strdup(path);
  if (!s->dir) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  if (s->is_gguf) {
    if ((rc = gguf_open(&s->gg, path, err))) return rc;
    if ((rc = gguf_model_config(s->gg, &s->cfg, err))) return rc;
    s->cfg_loaded = true;
    s->gguf_llama = !strcmp(s->cfg.model_type, "llama");
    for (size_t i = 0; i < gguf_tensor_count(s->gg); i++) {
      const gguf_tensor *g = gguf_tensor_at(s->gg, i);
      src_tensor t = {.gt = g};
      if (!strcmp(g->name, "rope_freqs.weight")) continue; /* rebuilt from the config when writing GGUF */
      if (!gguf_model_gguf_to_hf_name(g->name, t.hf, sizeof t.hf))
        return herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor '%s' has no Hugging Face name hearth knows", path, g->name);
      if (g->ndim > 2) return herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor '%s' has %d dimensions", path, g->name, g->ndim);
      t.ndim = g->ndim;
      t.cols = g->dims[0];
      t.rows = g->ndim == 2 ? g->dims[1] : 1;
      if ((rc = add_src(s, &t, err))) return rc;
    }
    return 0;
  }
  if (!hfile_is_dir(path)) return herr_set(err, HEARTH_EINVAL, "%s: not a model folder or .gguf file", path);
  if ((rc = model_config_load(&s->cfg, path, err))) return rc;
  s->cfg_loaded = true;
  if ((rc = st_open(&s->st, path, err))) return rc;
  s->st_opened = true;
  for (size_t i = 0; i < s->st.count; i++) {
    const st_tensor *x = &s->st.tensors[i];
    src_tensor t = {0};
    snprintf(t.hf, sizeof t.hf, "%s", x->name);
    if (ends_with(x->name, ".scales") || ends_with(x->name, ".biases")) {
      /* part of an MLX matrix when BASE.weight is packed */
      char w[300];
      snprintf(w, sizeof w, "%.*s.weight", (int)(strlen(x->name) - 7), x->name);
      const st_tensor *wt = st_find(&s->st, w);
      if (wt && wt->dtype == ST_U32) continue;
    }
    if (ends_with(x->name, "rotary_emb.inv_freq")) continue;
    if (x->dtype == ST_U32 && s->cfg.quant_bits > 0 && ends_with(x->name, ".weight")) {
      char base[300], sn[310], bn[310];
      snprintf(base, sizeof base, "%.*s", (int)(strlen(x->name) - 7), x->name);
      snprintf(sn, sizeof sn, "%s.scales", base);
      snprintf(bn, sizeof bn, "%s.biases", base);
      t.scales = st_find(&s->st, sn);
      t.biases = st_find(&s->st, bn);
      int bits = s->cfg.quant_bits, gs = s->cfg.quant_group_size;
      if (!t.scales || !t.biases || x->ndim != 2 || t.scales->ndim != 2 || t.biases->ndim != 2 || (bits != 4 && bits != 8))
        return herr_set(err, HEARTH_EFORMAT, "%s: MLX tensor '%s' lacks scales/biases or has an unexpected shape", path, x->name);
      t.st = x;
      t.ndim = 2;
      t.rows = x->shape[0];
      t.cols = x->shape[1] * 32 / bits;
      if (t.scales->shape[0] != t.rows || t.scales->shape[1] * gs != t.cols || t.biases->shape[0] != t.rows ||
          t.biases->shape[1] != t.scales->shape[1] || t.scales->dtype != t.biases->dtype)
        return herr_set(err, HEARTH_EFORMAT, "%s: scales/biases of '%s' do not match %lld x %lld with group size %d", path, x->name,
                        (long long)t.rows, (long long)t.cols, gs);
    } else {
      if (!st_dtype_is_float(x->dtype))
        return herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor '%s' has dtype %s (float tensors or MLX packed weights expected)", path,
                        x->name, st_dtype_name(x->dtype));
      if (x->ndim < 1 || x->ndim > 2)
        return herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor '%s' has %d dimensions (1 or 2 expected)", path, x->name, x->ndim);
      t.st = x;
      t.ndim = x->ndim;
      t.rows = x->ndim == 2 ? x->shape[0] : 1;
      t.cols = x->shape[x->ndim - 1];
    }
    if ((rc = add_src(s, &t, err))) return rc;
  }
  return 0;
}


static bool is_qk(const char *hf, bool *is_k) {
  *is_k = ends_with(hf, "k_proj.weight") || ends_with(hf, "k_proj.bias");
  return *is_k || ends_with(hf, "q_proj.weight") || ends_with(hf, "q_proj.bias");
}

/* llama.cpp's q/k row order: within each head, Hugging Face row (half, i)
 * goes to row 2i + half. inverse undoes it. rows of `cols` floats. */
static int permute_heads(float *x, int64_t rows, int64_t cols, int64_t heads, bool inverse, const char *name, herr *err) {
  if (heads <= 0 || rows % heads || (rows / heads) % 2)
    return herr_set(err, HEARTH_EFORMAT, "%s: %lld rows do not split into %lld heads of even size", name, (long long)rows, (long long)heads);
  int64_t hd = rows / heads, half = hd / 2;
  float *tmp = malloc((size_t)(hd * cols) * sizeof(float));
  if (!tmp) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (int64_t h = 0; h < heads; h++) {
    float *head = x + h * hd * cols;
    memcpy(tmp, head, (size_t)(hd * cols) * sizeof(float));
    for (int64_t i = 0; i < half; i++)
      for (int s = 0; s < 2; s++) {
        int64_t hf_row = s * half + i, gg_row = 2 * i + s;
        int64_t dst = inverse ? hf_row : gg_row, from = inverse ? gg_row : hf_row;
        memcpy(head + dst * cols, tmp + from * cols, (size_t)cols * sizeof(float));
      }
  }
  free(tmp);
  return 0;
}

/* Copies n bytes into an aligned malloc'd buffer (safetensors data may sit at any offset). */
static void *aligned_copy(const void *p, size_t n) {
  void *q = malloc(n ? n : 1);
  if (q) memcpy(q, p, n);
  return q;
}

/* The tensor as f32 in Hugging Face row order (rows * cols floats). */
static int src_read_f32(const src_model *s, const src_tensor *t, float *out, herr *err) {
  int rc = 0;
  if (t->gt) {
    bk_weight w = {.rows = t->rows, .cols = t->cols, .data = t->gt->data};
    if (!model_bk_type_of_gguf(t->gt->type, &w.type))
      return herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor '%s' has type %s, which hearth cannot read", s->path, t->gt->name,
                      gguf_tensor_type_name(t->gt->type));
    for (int64_t r = 0; r < t->rows && !rc; r++) rc = bk_dequant_row(&w, r, out + r * t->cols, err);
    if (rc) return herr_wrap(err, "%s", t->gt->name);
    bool is_k;
    if (s->gguf_llama && is_qk(t->hf, &is_k)) {
      int64_t heads = is_k ? s->cfg.num_key_value_heads : s->cfg.num_attention_heads;
      return permute_heads(out, t->ndim == 2 ? t->rows : t->cols, t->ndim == 2 ? t->cols : 1, heads, true, t->hf, err);
    }
    return 0;
  }
  if (!t->scales) return st_to_f32(t->st, out, err);
  /* MLX affine: packed words, scales and biases copied to aligned memory */
  bk_weight w = {.type = BK_MLX_AFFINE, .rows = t->rows, .cols = t->cols, .bits = s->cfg.quant_bits, .group_size = s->cfg.quant_group_size};
  if (!model_bk_type_of_st(t->scales->dtype, &w.scale_type))
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s: scales of dtype %s", t->scales->name, st_dtype_name(t->scales->dtype));
  void *d = aligned_copy(t->st->data, t->st->nbytes), *sc = aligned_copy(t->scales->data, t->scales->nbytes),
       *bi = aligned_copy(t->biases->data, t->biases->nbytes);
  if (!d || !sc || !bi) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
  w.data = d, w.scales = sc, w.biases = bi;
  if (!rc) rc = bk_weight_validate(&w, err);
  for (int64_t r = 0; r < t->rows && !rc; r++) rc = bk_dequant_row(&w, r, out + r * t->cols, err);
  free(d), free(sc), free(bi);
  return rc ? herr_wrap(err, "%s", t->hf) : 0;
}

/* The source's float dtype as a bk type (for unquantized outputs). */
static bk_type src_float_type(const src_model *s) {
  const char *d = s->cfg.torch_dtype;
  if (!strcmp(d, "float32")) return BK_F32;
  if (!strcmp(d, "bfloat16")) return BK_BF16;
  if (!strcmp(d, "float16")) return BK_F16;
  for (int i = 0; i < s->nt; i++) /* no dtype in config: the first float tensor's */
    if (s->ts[i].st && !s->ts[i].scales) {
      bk_type b;
      if (model_bk_type_of_st(s->ts[i].st->dtype, &b)) return b;
    }
  return BK_F16;
}

/* ---- output plan ---- */

typedef enum out_role { ROLE_WHOLE, ROLE_MLX_W, ROLE_MLX_S, ROLE_MLX_B, ROLE_CONST, ROLE_FP8_W, ROLE_FP8_S } out_role;

typedef struct out_tensor {
  int src;           /* index into src_model.ts (-1 for ROLE_CONST) */
  out_role role;
  bk_type type;      /* ROLE_WHOLE: the stored type */
  bool permute;      /* apply llama.cpp's q/k row order */
  int64_t heads;
} out_tensor;

typedef struct conv {
  src_model *src;
  out_tensor *outs;  /* owned, indexed like the writer's tensors */
  int nouts, cap_outs;
  int bits, group_size;
  bk_type scale_type;
  void *mlx_scales, *mlx_biases; /* owned: the current MLX matrix's, filled by its ROLE_MLX_W call */
  int mlx_for;       /* which source tensor they belong to (-1 none) */
  float *rope_freqs; /* owned: llama3 factors, or NULL */
  /* progress: tensors and bytes written so far, of n_total / bytes_total */
  const char *dst;
  int n_total, n_done;
  size_t *sizes;     /* owned: bytes of each output tensor */
  size_t bytes_total, bytes_done;
  double t0, last_shown;
  bool tty;          /* stderr is a terminal: a progress line */
} conv;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "12.3 MB" */
static const char *human_bytes(double b, char *buf, size_t n) {
  static const char *unit[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) b /= 1000, u++;
  snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
  return buf;
}

/* Before writing: the sizes of the n output tensors (size(w, i)). */
static int progress_start(conv *c, const char *dst, int n, size_t (*size)(const void *, int), const void *w, herr *err) {
  c->dst = dst;
  c->n_total = n;
  c->sizes = calloc(n > 0 ? (size_t)n : 1, sizeof *c->sizes);
  if (!c->sizes) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (int i = 0; i < n; i++) c->bytes_total += c->sizes[i] = size(w, i);
  c->tty = isatty(2);
  c->t0 = c->last_shown = now_s();
  return 0;
}

static void progress_line(conv *c, const char *name, double now) {
  char a[32], b[32], r[32];
  double dt = now - c->t0;
  fprintf(stderr, "\r\033[Khearth convert: tensor %d of %d, %s of %s, %s/s  %s", c->n_done, c->n_total,
          human_bytes((double)c->bytes_done, a, sizeof a), human_bytes((double)c->bytes_total, b, sizeof b),
          human_bytes(dt > 0 ? (double)c->bytes_done / dt : 0, r, sizeof r), name);
  fflush(stderr);
  c->last_shown = now;
}

/* After a tensor: the progress line on a terminal (at most 10 a second). */
static void progress_step(conv *c, int i, const char *name) {
  c->n_done++;
  c->bytes_done += i < c->n_total ? c->sizes[i] : 0;
  double now = now_s();
  if (c->tty && (now - c->last_shown >= 0.1 || c->n_done == c->n_total)) progress_line(c, name, now);
}

/* The one-line summary, always (on a terminal it replaces the progress line). */
static void progress_end(conv *c) {
  char a[32], r[32];
  double dt = now_s() - c->t0;
  fprintf(stderr, "%shearth convert: wrote %s: %d tensors, %s in %.1f s (%s/s)\n", c->tty ? "\r\033[K" : "", c->dst,
          c->n_total, human_bytes((double)c->bytes_total, a, sizeof a), dt,
          human_bytes(dt > 0 ? (double)c->bytes_total / dt : 0, r, sizeof r));
}

static size_t gguf_size(const void *w, int i) { return gguf_writer_tensor_bytes(w, i); }
static size_t st_size(const void *w, int i) { return st_writer_tensor_bytes(w, i); }

static int add_out(conv *c, out_tensor o, herr *err) {
  if (c->nouts == c->cap_outs && !HGROW(c->outs, c->cap_outs, c->nouts + 1))
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  c->outs[c->nouts++] = o;
  return 0;
}

static int fill_tensor(void *ctx, int i, void *dst, herr *err) {
  conv *c = ctx;
  const out_tensor *o = &c->outs[i];
  size_t es = bk_row_bytes(c->scale_type, 1, 0);
  if (o->role == ROLE_FP8_S) { /* the per-row scales its ROLE_FP8_W call made */
    const src_tensor *t = &c->src->ts[o->src];
    if (c->mlx_for != o->src) return herr_set(err, HEARTH_EINTERNAL, "%s: scales asked before the weight", t->hf);
    memcpy(dst, c->mlx_scales, (size_t)t->rows * sizeof(float));
    return 0;
  }
  if (o->role == ROLE_MLX_S || o->role == ROLE_MLX_B) {
    const src_tensor *t = &c->src->ts[o->src];
    if (c->mlx_for != o->src) return herr_set(err, HEARTH_EINTERNAL, "%s: scales asked before the weight", t->hf);
    memcpy(dst, o->role == ROLE_MLX_S ? c->mlx_scales : c->mlx_biases, (size_t)(t->rows * (t->cols / c->group_size)) * es);
    return 0;
  }
  const src_tensor *t = &c->src->ts[o->src];
  float *x = malloc((size_t)(t->rows * t->cols) * sizeof(float));
  if (!x) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory for %lld floats", t->hf, (long long)(t->rows * t->cols));
  int rc = src_read_f32(c->src, t, x, err);
  if (!rc && o->permute)
    rc = permute_heads(x, t->ndim == 2 ? t->rows : t->cols, t->ndim == 2 ? t->cols : 1, o->heads, false, t->hf, err);
  if (!rc && o->role == ROLE_WHOLE) rc = bk_quantize(o->type, x, t->rows, t->cols, dst, err);
  if (!rc && o->role == ROLE_FP8_W) {
    free(c->mlx_scales);
    c->mlx_scales = malloc((size_t)t->rows * sizeof(float));
    c->mlx_for = -1;
    if (!c->mlx_scales) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    else rc = bk_quantize_fp8(x, t->rows, t->cols, dst, c->mlx_scales, err);
    if (!rc) c->mlx_for = o->src;
  }
  if (!rc && o->role == ROLE_MLX_W) {
    size_t n = (size_t)(t->rows * (t->cols / c->group_size)) * es;
    free(c->mlx_scales), free(c->mlx_biases);
    c->mlx_scales = malloc(n), c->mlx_biases = malloc(n);
    c->mlx_for = -1;
    if (!c->mlx_scales || !c->mlx_biases) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    else rc = bk_quantize_mlx(x, t->rows, t->cols, c->bits, c->group_size, c->scale_type, dst, c->mlx_scales, c->mlx_biases, err);
    if (!rc) c->mlx_for = o->src;
  }
  free(x);
  return rc ? herr_wrap(err, "%s", t->hf) : 0;
}

/* fill_tensor, then the progress. */
static int fill_progress(void *ctx, int i, void *dst, herr *err) {
  conv *c = ctx;
  int rc = fill_tensor(ctx, i, dst, err);
  if (!rc) {
    const out_tensor *o = &c->outs[i];
    progress_step(c, i, o->src >= 0 ? c->src->ts[o->src].hf : "rope_freqs");
  } else if (c->tty) {
    fputc('\n', stderr);
  }
  return rc;
}

static void conv_free(conv *c) {
  free(c->sizes);
  free(c->outs);
  free(c->mlx_scales);
  free(c->mlx_biases);
  free(c->rope_freqs);
}

/* ---- tokenizer.json → tokenizer.ggml.* ---- */

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

/* Does the pipeline element (or a Sequence holding it) have type `type`? Returns it. */
static const json_t *find_step(const json_t *j, const char *type) {
  if (!json_is_object(j)) return NULL;
  const char *t = json_string_value(json_object_get(j, "type"));
  if (t && !strcmp(t, type)) return j;
  if (t && !strcmp(t, "Sequence")) {
    static const char *const lists[] = {"pretokenizers", "normalizers", "decoders", "processors"};
    for (size_t k = 0; k < 4; k++) {
      const json_t *a = json_object_get(j, lists[k]), *e;
      size_t i;
      json_array_foreach(a, i, e) {
        const json_t *r = find_step(e, type);
        if (r) return r;
      }
    }
  }
  return NULL;
}

/* llama.cpp's tokenizer.ggml.pre for a ByteLevel BPE tokenizer, from its Split regexes. */
static const char *detect_pre(const json_t *pre) {
  static const char RX_LLAMA3[] =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  static const char RX_QWEN2[] =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const char *rx[8];
  int n = 0;
  const char *t = json_string_value(json_object_get(pre, "type"));
  const json_t *list = t && !strcmp(t, "Sequence") ? json_object_get(pre, "pretokenizers") : NULL;
  size_t i;
  const json_t *e;
  if (list) {
    json_array_foreach(list, i, e) {
      const char *et = json_string_value(json_object_get(e, "type"));
      if (et && !strcmp(et, "Split") && n < 8) rx[n++] = json_string_value(json_object_get(json_object_get(e, "pattern"), "Regex"));
    }
  } else if (t && !strcmp(t, "Split")) {
    rx[n++] = json_string_value(json_object_get(json_object_get(pre, "pattern"), "Regex"));
  }
  for (int k = 0; k < n; k++)
    if (!rx[k]) return NULL;
  const json_t *bl = find_step(pre, "ByteLevel");
  if (n == 0) return bl && json_is_true(json_object_get(bl, "use_regex")) ? "gpt-2" : NULL;
  if (n == 1 && !strcmp(rx[0], RX_LLAMA3)) return "llama-bpe";
  if (n == 1 && !strcmp(rx[0], RX_QWEN2)) return "qwen2";
  if (n == 3 && !strcmp(rx[0], "\\p{N}{1,3}")) return "deepseek-v3";
  if (n == 1 && !strncmp(rx[0], "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*", 40)) return "gpt-4o";
  return NULL;
}

/* A special token named in tokenizer_config.json (string or {"content": ...}); NULL when absent. */
static const char *config_token(const json_t *tc, const char *key) {
  const json_t *v = json_object_get(tc, key);
  if (json_is_string(v)) return json_string_value(v);
  if (json_is_object(v)) return json_string_value(json_object_get(v, "content"));
  return NULL;
}

typedef struct vocab_out {
  const char **text; /* borrowed from the JSON or pads */
  int32_t *type;
  float *score;
  char **pads;       /* owned strings for ids the tokenizer lacks */
  int64_t n;
} vocab_out;

static int64_t token_id(const vocab_out *v, const char *s) {
  if (!s) return -1;
  for (int64_t i = 0; i < v->n; i++)
    if (v->text[i] && !strcmp(v->text[i], s)) return i;
  return -1;
}

static int add_tokenizer(gguf_writer *w, const src_model *s, const char *pre_override, herr *err) {
  char *tj = hpath_join(s->dir, "tokenizer.json"), *tcj = hpath_join(s->dir, "tokenizer_config.json");
  json_t *root = NULL, *tc = NULL;
  vocab_out v = {0};
  int rc = 0;
  if (!tj || !tcj) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto out;
  }
  if (!hfile_exists(tj)) {
    fprintf(stderr, "hearth convert: %s not found: the GGUF gets no tokenizer (hearth loads it; llama.cpp will not)\n", tj);
    goto out;
  }
  if (!(root = hjson_load_file(tj, err))) {
    rc = err ? err->code : HEARTH_EFORMAT;
    goto out;
  }
  if (hfile_exists(tcj)) {
    json_error_t je; /* model_max_length is often 1e30 written as an integer */
    if (!(tc = json_load_file(tcj, JSON_DECODE_INT_AS_REAL, &je))) {
      rc = herr_set(err, HEARTH_EFORMAT, "%s: invalid JSON at line %d: %s", tcj, je.line, je.text);
      goto out;
    }
  }
  const json_t *model = json_object_get(root, "model"), *vocab = json_object_get(model, "vocab"),
               *merges = json_object_get(model, "merges"), *added = json_object_get(root, "added_tokens");
  const char *mtype = json_string_value(json_object_get(model, "type"));
  if (!mtype || strcmp(mtype, "BPE") || !json_is_object(vocab) || !json_is_array(merges)) {
    rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: model type '%s' cannot be written as a GGUF vocabulary (BPE with vocab and merges can)", tj,
                  mtype ? mtype : "?");
    goto out;
  }
  const json_t *pre = json_object_get(root, "pre_tokenizer"), *norm = json_object_get(root, "normalizer");
  bool spm = json_is_true(json_object_get(model, "byte_fallback")) || find_step(json_object_get(root, "decoder"), "ByteFallback");
  bool bytelevel = find_step(pre, "ByteLevel") != NULL;
  if (!spm && !bytelevel) {
    rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: a BPE tokenizer without ByteLevel or byte fallback cannot be written as GGUF", tj);
    goto out;
  }
  /* ids: vocab, then added tokens; the config's vocab_size pads the rest */
  int64_t n = s->cfg.vocab_size;
  const char *k;
  const json_t *val, *at;
  size_t ia;
  json_object_foreach((json_t *)vocab, k, val) if (json_integer_value(val) + 1 > n) n = json_integer_value(val) + 1;
  json_array_foreach(added, ia, at) if (json_integer_value(json_object_get(at, "id")) + 1 > n) n = json_integer_value(json_object_get(at, "id")) + 1;
  if (n > s->cfg.vocab_size) {
    rc = herr_set(err, HEARTH_EFORMAT, "%s: token ids reach %lld but the model's vocab_size is %lld", tj, (long long)n - 1,
                  (long long)s->cfg.vocab_size);
    goto out;
  }
  v.n = n;
  v.text = calloc((size_t)n, sizeof *v.text);
  v.type = calloc((size_t)n, sizeof *v.type);
  v.score = calloc((size_t)n, sizeof *v.score);
  v.pads = calloc((size_t)n, sizeof *v.pads);
  if (!v.text || !v.type || !v.score || !v.pads) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto out;
  }
  json_object_foreach((json_t *)vocab, k, val) {
    int64_t id = json_integer_value(val);
    if (id < 0) continue;
    v.text[id] = k;
    v.type[id] = TT_NORMAL;
    v.score[id] = spm ? -1e9f : 0;
    if (spm && strlen(k) == 6 && !strncmp(k, "<0x", 3) && k[5] == '>') v.type[id] = TT_BYTE;
  }
  const char *unk = json_string_value(json_object_get(model, "unk_token"));
  if (unk && token_id(&v, unk) >= 0) v.type[token_id(&v, unk)] = TT_UNKNOWN;
  json_array_foreach(added, ia, at) {
    int64_t id = json_integer_value(json_object_get(at, "id"));
    const char *c = json_string_value(json_object_get(at, "content"));
    if (id < 0 || !c) continue;
    v.text[id] = c;
    if (v.type[id] != TT_UNKNOWN) v.type[id] = json_is_true(json_object_get(at, "special")) ? TT_CONTROL : TT_USER;
  }
  /* SPM merges by the score of the merged token: the earlier the merge, the higher */
  if (spm) {
    size_t im;
    const json_t *m;
    hbuf mb = {0};
    json_array_foreach(merges, im, m) {
      hbuf_clear(&mb);
      if (json_is_string(m)) {
        const char *sp = strchr(json_string_value(m), ' ');
        if (!sp) continue;
        hbuf_append(&mb, json_string_value(m), (size_t)(sp - json_string_value(m)));
        hbuf_puts(&mb, sp + 1);
      } else {
        hbuf_puts(&mb, json_string_value(json_array_get(m, 0)) ? json_string_value(json_array_get(m, 0)) : "");
        hbuf_puts(&mb, json_string_value(json_array_get(m, 1)) ? json_string_value(json_array_get(m, 1)) : "");
      }
      const json_t *idv = json_object_get(vocab, hbuf_str(&mb));
      if (idv && v.score[json_integer_value(idv)] < -(float)im) v.score[json_integer_value(idv)] = -(float)im;
    }
    hbuf_free(&mb);
  }
  for (int64_t i = 0; i < n; i++)
    if (!v.text[i]) {
      char pad[32];
      snprintf(pad, sizeof pad, "[PAD%lld]", (long long)i);
      if (!(v.pads[i] = strdup(pad))) {
        rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
        goto out;
      }
      v.text[i] = v.pads[i];
      v.type[i] = TT_UNUSED;
    }
  gguf_writer_str(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2");
  if (!spm) {
    const char *pname = pre_override ? pre_override : detect_pre(pre);
    if (!pname) {
      rc = herr_set(err, HEARTH_EUNSUPPORTED,
                    "%s: cannot tell which llama.cpp pre-tokenizer matches this tokenizer's regexes; give one with --pre NAME "
                    "(llama-bpe, qwen2, gpt-2, ...)", tj);
      goto out;
    }
    gguf_writer_str(w, "tokenizer.ggml.pre", pname);
  } else {
    gguf_writer_str(w, "tokenizer.ggml.pre", "default");
  }
  gguf_writer_arr_str(w, "tokenizer.ggml.tokens", v.text, NULL, (size_t)n);
  if (spm) gguf_writer_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, v.score, (size_t)n);
  gguf_writer_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v.type, (size_t)n);
  if (!spm) {
    size_t nm = json_array_size(merges), im;
    char **ms = calloc(nm ? nm : 1, sizeof *ms);
    const json_t *m;
    bool ok = ms != NULL;
    json_array_foreach(merges, im, m) {
      if (!ok) break;
      if (json_is_string(m)) ms[im] = strdup(json_string_value(m));
      else {
        const char *a = json_string_value(json_array_get(m, 0)), *b = json_string_value(json_array_get(m, 1));
        size_t la = a ? strlen(a) : 0, lb = b ? strlen(b) : 0;
        if ((ms[im] = malloc(la + lb + 2))) {
          memcpy(ms[im], a ? a : "", la);
          ms[im][la] = ' ';
          memcpy(ms[im] + la + 1, b ? b : "", lb + 1);
        }
      }
      ok = ms[im] != NULL;
    }
    if (ok) gguf_writer_arr_str(w, "tokenizer.ggml.merges", (const char *const *)ms, NULL, nm);
    for (size_t i = 0; ms && i < nm; i++) free(ms[i]);
    free(ms);
    if (!ok) {
      rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
      goto out;
    }
  }
  /* special ids: tokenizer_config.json's names, else config.json's ids */
  int64_t bos = token_id(&v, config_token(tc, "bos_token")), eos = token_id(&v, config_token(tc, "eos_token"));
  int64_t pad = token_id(&v, config_token(tc, "pad_token")), unk_id = token_id(&v, unk);
  if (bos < 0 && !config_token(tc, "bos_token") && s->cfg.bos_token_id >= 0 && s->cfg.bos_token_id < n) bos = s->cfg.bos_token_id;
  if (eos < 0 && s->cfg.n_eos > 0 && s->cfg.eos_token_ids[0] < n) eos = s->cfg.eos_token_ids[0];
  if (bos >= 0) gguf_writer_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
  if (eos >= 0) gguf_writer_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
  if (pad >= 0) gguf_writer_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)pad);
  if (unk_id >= 0) gguf_writer_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)unk_id);
  /* add_bos: the config's flag, else whether the post-processor puts BOS first */
  const json_t *ab = json_object_get(tc, "add_bos_token"), *ae = json_object_get(tc, "add_eos_token");
  bool add_bos = false;
  if (json_is_boolean(ab)) add_bos = json_is_true(ab);
  else {
    const json_t *tp = find_step(json_object_get(root, "post_processor"), "TemplateProcessing");
    const json_t *first = json_array_get(json_object_get(tp, "single"), 0);
    const char *sid = json_string_value(json_object_get(json_object_get(first, "SpecialToken"), "id"));
    add_bos = sid && bos >= 0 && !strcmp(sid, v.text[bos]);
  }
  if (add_bos && bos < 0) add_bos = false;
  gguf_writer_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
  gguf_writer_bool(w, "tokenizer.ggml.add_eos_token", json_is_true(ae) && eos >= 0);
  if (spm) {
    const json_t *prep = find_step(norm, "Prepend"), *meta = find_step(pre, "Metaspace");
    const char *scheme = json_string_value(json_object_get(meta, "prepend_scheme"));
    bool space = prep || (meta && (!scheme || strcmp(scheme, "never")) && !json_is_false(json_object_get(meta, "add_prefix_space")));
    gguf_writer_bool(w, "tokenizer.ggml.add_space_prefix", space);
  }
  /* chat template */
  const json_t *ct = json_object_get(tc, "chat_template");
  if (json_is_string(ct)) gguf_writer_str(w, "tokenizer.chat_template", json_string_value(ct));
  else {
    char *jp = hpath_join(s->dir, "chat_template.jinja"), *txt = NULL;
    size_t len;
    if (jp && hfile_exists(jp) && !hfile_read(jp, &txt, &len, NULL)) gguf_writer_strn(w, "tokenizer.chat_template", txt, len);
    free(txt);
    free(jp);
  }
out:
  for (int64_t i = 0; v.pads && i < v.n; i++) free(v.pads[i]);
  free(v.pads), free(v.text), free(v.type), free(v.score);
  json_decref(root);
  json_decref(tc);
  free(tj);
  free(tcj);
  return rc;
}

/* ---- to GGUF ---- */

typedef struct quant_choice {
  const char *name;
  bk_type type;
  gguf_tensor_type gtype;
  uint32_t file_type; /* llama.cpp's llama_ftype */
} quant_choice;

static const quant_choice gguf_quants[] = {
    {"f32", BK_F32, GGUF_TENSOR_F32, 0},     {"f16", BK_F16, GGUF_TENSOR_F16, 1},     {"bf16", BK_BF16, GGUF_TENSOR_BF16, 32},
    {"q8_0", BK_Q8_0, GGUF_TENSOR_Q8_0, 7},  {"q4_0", BK_Q4_0, GGUF_TENSOR_Q4_0, 2},  {"q4_k", BK_Q4_K, GGUF_TENSOR_Q4_K, 14},
    {"q5_k", BK_Q5_K, GGUF_TENSOR_Q5_K, 16}, {"q6_k", BK_Q6_K, GGUF_TENSOR_Q6_K, 18},
    {"q5_0", BK_Q5_0, GGUF_TENSOR_Q5_0, 8},  {"q5_1", BK_Q5_1, GGUF_TENSOR_Q5_1, 9},  {"q2_k", BK_Q2_K, GGUF_TENSOR_Q2_K, 10},
    {"q3_k", BK_Q3_K, GGUF_TENSOR_Q3_K, 11}, {"iq4_nl", BK_IQ4_NL, GGUF_TENSOR_IQ4_NL, 25},
    {"iq4_xs", BK_IQ4_XS, GGUF_TENSOR_IQ4_XS, 30},
};

/* The 32-column type a matrix too narrow for q's 256-column blocks is kept as (F16 for the rest). */
static bk_type narrow_fallback(bk_type t) {
  switch (t) {
    case BK_Q2_K: case BK_Q3_K: case BK_Q4_K: return BK_Q4_0;
    case BK_Q5_K: case BK_Q6_K: return BK_Q8_0;
    case BK_IQ4_XS: return BK_IQ4_NL;
    default: return BK_F16;
  }
}

static gguf_tensor_type bk_to_ggml(bk_type t) {
  for (size_t i = 0; i < sizeof gguf_quants / sizeof gguf_quants[0]; i++)
    if (gguf_quants[i].type == t) return gguf_quants[i].gtype;
  return GGUF_TENSOR_F32;
}

/* The gguf architecture for a model_type, NULL when there is none. */
static const char *gguf_arch(const char *model_type) {
  if (!strcmp(model_type, "llama") || !strcmp(model_type, "mistral")) return "llama";
  if (!strcmp(model_type, "qwen2")) return "qwen2";
  if (!strcmp(model_type, "qwen3")) return "qwen3";
  return NULL;
}

static int write_gguf(src_model *s, const char *dst, const char *quant, const char *pre, herr *err) {
  const model_config *c = &s->cfg;
  const char *arch = gguf_arch(c->model_type);
  if (!arch)
    return herr_set(err, HEARTH_EUNSUPPORTED, "%s: model_type '%s' cannot be exported to GGUF (supported: llama, mistral, qwen2, qwen3)",
                    s->path, c->model_type);
  const quant_choice *q = NULL;
  if (!quant) {
    bk_type ft = src_float_type(s);
    quant = ft == BK_F32 ? "f32" : ft == BK_BF16 ? "bf16" : "f16";
  }
  for (size_t i = 0; i < sizeof gguf_quants / sizeof gguf_quants[0]; i++)
    if (!strcasecmp(quant, gguf_quants[i].name)) q = &gguf_quants[i];
  if (!q) return herr_set(err, HEARTH_EINVAL, "--quant %s cannot be written to GGUF (f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs)", quant);
  gguf_writer *w = gguf_writer_new();
  conv cv = {.src = s, .mlx_for = -1};
  if (!w) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  char key[128];
#define K(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
  gguf_writer_str(w, "general.architecture", arch);
  const char *name = strrchr(s->dir, '/') ? strrchr(s->dir, '/') + 1 : s->dir;
  gguf_writer_str(w, "general.name", s->is_gguf ? "converted" : name);
  gguf_writer_u32(w, "general.file_type", q->file_type);
  if (q->type != BK_F32 && q->type != BK_F16 && q->type != BK_BF16) gguf_writer_u32(w, "general.quantization_version", 2);
  gguf_writer_u32(w, K("context_length"), (uint32_t)c->max_position_embeddings);
  gguf_writer_u32(w, K("embedding_length"), (uint32_t)c->hidden_size);
  gguf_writer_u32(w, K("block_count"), (uint32_t)c->num_hidden_layers);
  gguf_writer_u32(w, K("feed_forward_length"), (uint32_t)c->intermediate_size);
  gguf_writer_u32(w, K("attention.head_count"), (uint32_t)c->num_attention_heads);
  gguf_writer_u32(w, K("attention.head_count_kv"), (uint32_t)c->num_key_value_heads);
  gguf_writer_u32(w, K("attention.key_length"), (uint32_t)c->head_dim);
  gguf_writer_u32(w, K("attention.value_length"), (uint32_t)c->head_dim);
  gguf_writer_f32(w, K("attention.layer_norm_rms_epsilon"), (float)c->rms_norm_eps);
  gguf_writer_f32(w, K("rope.freq_base"), (float)c->rope.theta);
  int64_t rot = (int64_t)llround((double)c->head_dim * (c->rope.partial_rotary_factor > 0 ? c->rope.partial_rotary_factor : 1.0));
  gguf_writer_u32(w, K("rope.dimension_count"), (uint32_t)rot);
  gguf_writer_u32(w, K("vocab_size"), (uint32_t)c->vocab_size);
  int rc = 0;
  switch (c->rope.kind) {
    case ROPE_DEFAULT: break;
    case ROPE_LINEAR:
    case ROPE_YARN:
      gguf_writer_str(w, K("rope.scaling.type"), c->rope.kind == ROPE_LINEAR ? "linear" : "yarn");
      gguf_writer_f32(w, K("rope.scaling.factor"), (float)c->rope.factor);
      if (c->rope.original_max_position > 0) gguf_writer_u32(w, K("rope.scaling.original_context_length"), (uint32_t)c->rope.original_max_position);
      break;
    case ROPE_FACTORS: /* a GGUF's own rope_freqs, written back as read */
    case ROPE_LLAMA3: {
      /* llama.cpp keeps llama3 RoPE as per-frequency divisors in rope_freqs.weight */
      int64_t half = rot / 2;
      cv.rope_freqs = malloc((size_t)half * sizeof(float));
      if (!cv.rope_freqs) {
        rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
        break;
      }
      if (c->rope.kind == ROPE_FACTORS) {
        if (c->rope.n_freq_factors != half) {
          rc = herr_set(err, HEARTH_EFORMAT, "%s: %d RoPE frequency factors for %lld rotated pairs", s->path,
                        c->rope.n_freq_factors, (long long)half);
          break;
        }
        memcpy(cv.rope_freqs, c->rope.freq_factors, (size_t)half * sizeof(float));
        int64_t dims[1] = {half};
        gguf_writer_tensor(w, "rope_freqs.weight", GGUF_TENSOR_F32, 1, dims, cv.rope_freqs);
        rc = add_out(&cv, (out_tensor){.src = -1, .role = ROLE_CONST}, err);
        break;
      }
      double factor = c->rope.factor > 0 ? c->rope.factor : 8, lo = c->rope.low_freq_factor > 0 ? c->rope.low_freq_factor : 1,
             hi = c->rope.high_freq_factor > 0 ? c->rope.high_freq_factor : 4,
             old = c->rope.original_max_position > 0 ? (double)c->rope.original_max_position : 8192;
      for (int64_t i = 0; i < half; i++) {
        double freq = 1.0 / pow(c->rope.theta, (double)(2 * i) / (double)rot), wavelen = 2 * M_PI / freq;
        double f = 1;
        if (wavelen > old / lo) f = factor;
        else if (wavelen >= old / hi) {
          double smooth = (old / wavelen - lo) / (hi - lo);
          f = 1 / ((1 - smooth) / factor + smooth);
        }
        cv.rope_freqs[i] = (float)f;
      }
      int64_t dims[1] = {half};
      gguf_writer_tensor(w, "rope_freqs.weight", GGUF_TENSOR_F32, 1, dims, cv.rope_freqs);
      if ((rc = add_out(&cv, (out_tensor){.src = -1, .role = ROLE_CONST}, err))) break;
      break;
    }
    default:
      fprintf(stderr, "hearth convert: %s: this config's RoPE scaling (dynamic / longrope) has no GGUF form; written without it\n",
              s->path);
  }
#undef K
  if (!rc && s->is_gguf) {
    for (size_t i = 0; i < gguf_kv_count(s->gg); i++) {
      const gguf_kv *kv = gguf_kv_at(s->gg, i);
      if (!strncmp(kv->key, "tokenizer.", 10)) gguf_writer_copy_kv(w, kv);
    }
  } else if (!rc) {
    rc = add_tokenizer(w, s, pre, err);
  }
  int fallbacks = 0;
  bool llama = !strcmp(arch, "llama");
  for (int i = 0; !rc && i < s->nt; i++) {
    const src_tensor *t = &s->ts[i];
    char gname[256];
    if (!gguf_model_hf_to_gguf_name(t->hf, gname, sizeof gname)) {
      if (c->tie_word_embeddings && !strcmp(t->hf, "lm_head.weight")) continue;
      rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor '%s' has no GGUF name in the %s layout", s->path, t->hf, arch);
      break;
    }
    out_tensor o = {.src = i, .role = ROLE_WHOLE, .type = BK_F32};
    bool is_k;
    if (llama && is_qk(t->hf, &is_k)) {
      o.permute = true;
      o.heads = is_k ? c->num_key_value_heads : c->num_attention_heads;
    }
    if (t->ndim == 2) {
      o.type = q->type;
      if (!bk_row_bytes(o.type, t->cols, 0)) {
        /* 256-column K blocks do not fit: the 32-column type of about the same size */
        bk_type fb = narrow_fallback(q->type);
        o.type = bk_row_bytes(fb, t->cols, 0) ? fb : BK_F16;
        fallbacks++;
      }
    }
    int64_t dims[2] = {t->cols, t->rows};
    if (gguf_writer_tensor(w, gname, bk_to_ggml(o.type), t->ndim, dims, NULL) < 0) {
      rc = gguf_writer_write(w, dst, NULL, NULL, err); /* reports the descriptor error */
      if (!rc) rc = herr_set(err, HEARTH_EINTERNAL, "%s: tensor '%s' was refused", dst, gname);
      break;
    }
    rc = add_out(&cv, o, err);
  }
  if (fallbacks)
    fprintf(stderr, "hearth convert: %d matri%s with rows that are not whole %s blocks kept as %s%s\n", fallbacks,
            fallbacks == 1 ? "x" : "ces", q->name, narrow_fallback(q->type) == BK_F16 ? "f16" : bk_type_name(narrow_fallback(q->type)),
            narrow_fallback(q->type) == BK_F16 ? "" : " (or f16)");
  if (!rc) rc = progress_start(&cv, dst, (int)gguf_writer_tensor_count(w), gguf_size, w, err);
  if (!rc) rc = gguf_writer_write(w, dst, fill_progress, &cv, err);
  if (!rc) progress_end(&cv);
  gguf_writer_free(w);
  conv_free(&cv);
  return rc;
}

/* ---- to safetensors ---- */

static st_dtype bk_to_st(bk_type t) { return t == BK_F32 ? ST_F32 : t == BK_BF16 ? ST_BF16 : ST_F16; }
static const char *torch_name(bk_type t) { return t == BK_F32 ? "float32" : t == BK_BF16 ? "bfloat16" : "float16"; }

static int write_safetensors(src_model *s, const char *dst, const char *quant, int group_size, herr *err) {
  if (s->cfg.rope.kind == ROPE_FACTORS) /* never written as something the folder's reader would take otherwise */
    return herr_set(err, HEARTH_EUNSUPPORTED,
                    "%s: RoPE frequency factors (tensor 'rope_freqs.weight') have no config.json form; convert to GGUF instead",
                    s->path);
  int bits = 0;
  bool fp8 = false;
  bk_type ft = src_float_type(s);
  if (quant) {
    if (!strcasecmp(quant, "fp8")) fp8 = true;
    else if (!strcasecmp(quant, "mlx4")) bits = 4;
    else if (!strcasecmp(quant, "mlx8")) bits = 8;
    else if (!strcasecmp(quant, "f32")) ft = BK_F32;
    else if (!strcasecmp(quant, "f16")) ft = BK_F16;
    else if (!strcasecmp(quant, "bf16")) ft = BK_BF16;
    else return herr_set(err, HEARTH_EINVAL, "--quant %s cannot be written to safetensors (f32, f16, bf16, mlx4, mlx8, fp8)", quant);
  }
  if (mkdir(dst, 0755) && errno != EEXIST) return herr_set(err, HEARTH_EIO, "%s: cannot create the folder: %s", dst, strerror(errno));
  if (!hfile_is_dir(dst)) return herr_set(err, HEARTH_EIO, "%s: exists and is not a folder", dst);
  st_writer *w = st_writer_new();
  if (!w) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  conv cv = {.src = s, .mlx_for = -1, .bits = bits, .group_size = group_size, .scale_type = ft};
  int rc = 0, kept = 0;
  for (int i = 0; !rc && i < s->nt; i++) {
    const src_tensor *t = &s->ts[i];
    int64_t shape[2] = {t->rows, t->cols};
    const int64_t *sh = t->ndim == 2 ? shape : shape + 1;
    if (bits && t->ndim == 2 && t->cols % group_size == 0 && (t->cols * bits) % 32 == 0) {
      char base[300], nm[310];
      snprintf(base, sizeof base, "%.*s", (int)(strlen(t->hf) - (ends_with(t->hf, ".weight") ? 7 : 0)), t->hf);
      int64_t ws[2] = {t->rows, t->cols * bits / 32}, gs[2] = {t->rows, t->cols / group_size};
      snprintf(nm, sizeof nm, "%s.weight", base);
      st_writer_tensor(w, nm, ST_U32, 2, ws, NULL);
      snprintf(nm, sizeof nm, "%s.scales", base);
      st_writer_tensor(w, nm, bk_to_st(ft), 2, gs, NULL);
      snprintf(nm, sizeof nm, "%s.biases", base);
      st_writer_tensor(w, nm, bk_to_st(ft), 2, gs, NULL);
      if (!(rc = add_out(&cv, (out_tensor){.src = i, .role = ROLE_MLX_W}, err)) &&
          !(rc = add_out(&cv, (out_tensor){.src = i, .role = ROLE_MLX_S}, err)))
        rc = add_out(&cv, (out_tensor){.src = i, .role = ROLE_MLX_B}, err);
      continue;
    }
    if (fp8 && t->ndim == 2 && !strstr(t->hf, "embed_tokens")) { /* NAME F8_E4M3 and NAME_scale F32 [rows, 1] */
      char nm[310];
      int64_t ss[2] = {t->rows, 1};
      st_writer_tensor(w, t->hf, ST_F8_E4M3, 2, shape, NULL);
      snprintf(nm, sizeof nm, "%s_scale", t->hf);
      st_writer_tensor(w, nm, ST_F32, 2, ss, NULL);
      if (!(rc = add_out(&cv, (out_tensor){.src = i, .role = ROLE_FP8_W}, err)))
        rc = add_out(&cv, (out_tensor){.src = i, .role = ROLE_FP8_S}, err);
      continue;
    }
    if (bits && t->ndim == 2) kept++;
    st_writer_tensor(w, t->hf, bk_to_st(ft), t->ndim, sh, NULL);
    rc = add_out(&cv, (out_tensor){.src = i, .role = ROLE_WHOLE, .type = ft}, err);
  }
  if (kept) fprintf(stderr, "hearth convert: %d matri%s whose rows are not whole groups of %d kept as %s\n", kept, kept == 1 ? "x" : "ces",
                    group_size, torch_name(ft));
  st_writer_meta(w, "format", bits ? "mlx" : "pt");
  char *path = hpath_join(dst, "model.safetensors");
  if (!rc && !path) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
  if (!rc) rc = progress_start(&cv, dst, cv.nouts, st_size, w, err);
  if (!rc) rc = st_writer_write(w, path, fill_progress, &cv, err);
  if (!rc) progress_end(&cv);
  free(path);
  st_writer_free(w);
  conv_free(&cv);
  if (rc) return rc;
  /* config.json: the source's, with the new dtype and quantization */
  json_t *cfg = json_deep_copy(s->cfg.raw);
  if (!cfg) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  json_object_del(cfg, "quantization");
  json_object_del(cfg, "quantization_config");
  json_object_set_new(cfg, "torch_dtype", json_string(torch_name(ft)));
  if (json_object_get(cfg, "dtype")) json_object_set_new(cfg, "dtype", json_string(torch_name(ft)));
  if (!json_object_get(cfg, "architectures")) {
    const char *a = !strcmp(s->cfg.model_type, "qwen2") ? "Qwen2ForCausalLM" : !strcmp(s->cfg.model_type, "qwen3") ? "Qwen3ForCausalLM"
                                                                                                                   : "LlamaForCausalLM";
    json_object_set_new(cfg, "architectures", json_pack("[s]", a));
  }
  if (fp8) /* the per-channel FP8 layout transformers knows as fbgemm_fp8 */
    json_object_set_new(cfg, "quantization_config", json_pack("{s:s, s:f, s:[s]}", "quant_method", "fbgemm_fp8",
                                                              "activation_scale_ub", 1200.0, "modules_to_not_convert",
                                                              "model.embed_tokens"));
  if (bits) {
    json_object_set_new(cfg, "quantization", json_pack("{s:i, s:i}", "group_size", group_size, "bits", bits));
    json_object_set_new(cfg, "quantization_config", json_pack("{s:i, s:i}", "group_size", group_size, "bits", bits));
  }
  char *cpath = hpath_join(dst, "config.json");
  if (!cpath || json_dump_file(cfg, cpath, JSON_INDENT(2) | JSON_PRESERVE_ORDER))
    rc = herr_set(err, HEARTH_EIO, "%s: cannot write", cpath ? cpath : "config.json");
  free(cpath);
  json_decref(cfg);
  static const char *const files[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json",
                                      "chat_template.jinja", "tokenizer.model"};
  for (size_t i = 0; !rc && i < sizeof files / sizeof files[0]; i++) {
    char *from = hpath_join(s->dir, files[i]), *to = hpath_join(dst, files[i]);
    if (!from || !to) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    else if (!s->is_gguf && hfile_exists(from)) rc = hfile_copy(from, to, err);
    free(from);
    free(to);
  }
  if (!rc && s->is_gguf)
    fprintf(stderr, "hearth convert: %s: the GGUF vocabulary is not written as tokenizer.json; copy the tokenizer files in\n", dst);
  return rc;
}

int cli_convert(int argc, char **argv) {
  const char *src_path = NULL, *dst = NULL, *to = NULL, *quant = NULL, *gs_arg = NULL, *pre = NULL;
  for (int i = 1; i < argc; i++) {
    int r;
    if (cli_is_help(argv[i])) {
      usage(stdout);
      return 0;
    }
    if ((r = cli_opt(argc, argv, &i, "--to", &to)) || (r = cli_opt(argc, argv, &i, "--quant", &quant)) ||
        (r = cli_opt(argc, argv, &i, "--group-size", &gs_arg)) || (r = cli_opt(argc, argv, &i, "--pre", &pre))) {
      if (r < 0) return 2;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      return cli_usage_error("convert", "unknown option '%s'", argv[i]);
    } else if (!src_path) {
      src_path = argv[i];
    } else if (!dst) {
      dst = argv[i];
    } else {
      return cli_usage_error("convert", "give one SRC and one DST");
    }
  }
  if (!src_path || !dst) return cli_usage_error("convert", "give SRC and DST");
  bool to_gguf = to ? !strcmp(to, "gguf") : ends_with(dst, ".gguf");
  if (to && strcmp(to, "gguf") && strcmp(to, "safetensors")) return cli_usage_error("convert", "--to must be gguf or safetensors");
  long long gs = 64;
  if (gs_arg && (!cli_parse_int(gs_arg, 32, 128, &gs) || (gs != 32 && gs != 64 && gs != 128)))
    return cli_usage_error("convert", "--group-size must be 32, 64 or 128, not '%s'", gs_arg);
  if (quant && to_gguf && (!strcasecmp(quant, "mlx4") || !strcasecmp(quant, "mlx8")))
    return cli_usage_error("convert", "--quant %s is an MLX format: use --to safetensors", quant);
  if (quant && to_gguf && !strcasecmp(quant, "fp8"))
    return cli_usage_error("convert", "--quant fp8 is written as safetensors (GGUF has no FP8 type): use --to safetensors");
  herr err = {0};
  src_model s;
  int rc = src_open(&s, src_path, &err);
  if (!rc) rc = to_gguf ? write_gguf(&s, dst, quant, pre, &err) : write_safetensors(&s, dst, quant, (int)gs, &err);
  src_close(&s);
  if (rc) return cli_fail("%s", err.msg);
  return 0;
}
