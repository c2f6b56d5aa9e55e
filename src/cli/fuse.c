/* fuse.c — `hearth fuse BASE ADAPTER OUT`: merges a PEFT LoRA adapter into a
 * model folder's weights (W + scale · B · A for every module the adapter
 * changes, summed in double, rounded once to the base's dtype) and writes
 * OUT/model.safetensors with every tensor of the base in its stored dtype
 * (f32, f16 or bf16), plus the base's other files (config, tokenizer,
 * generation config, chat template) copied. Refuses a GGUF or quantized
 * (MLX affine) base: the merged weights would need requantizing, which
 * would not be the same model as base + adapter.
 *
 * Uses internal modules (format/ safetensors reader and writer, the adapter
 * config reader, backend/formats.h for the f16 / bf16 rounding), not
 * hearth.h: the public API has no access to tensors. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/formats.h"
#include "base/file.h"
#include "base/json.h"
#include "cli/cli.h"
#include "format/adapter.h"
#include "format/safetensors.h"
#include "format/safetensors_write.h"

static void fuse_usage(FILE *f) {
  fprintf(f,
          "usage: hearth fuse BASE ADAPTER OUT\n\n"
          "Merges the PEFT LoRA adapter folder ADAPTER (adapter_config.json + adapter_model.safetensors)\n"
          "into the model folder BASE and writes the result to the folder OUT: model.safetensors with\n"
          "every weight in the base's dtype (f32, f16 or bf16; each changed matrix W + scale * B @ A,\n"
          "rounded once), and the base's config, tokenizer and other files copied. GGUF and quantized\n"
          "bases are refused.\n");
}

/* One module of the adapter: the base tensor it changes. */
typedef struct fuse_mod {
  char target[300];        /* the base tensor's name */
  const st_tensor *a, *b;  /* borrowed from the adapter's set */
  double scale;
  int base_index;          /* the base tensor's index in its set */
} fuse_mod;

typedef struct fuse_ctx {
  const st_set *base;
  fuse_mod *mods;
  int n_mods;
  int *mod_of;             /* [base tensor] -> module, -1 */
} fuse_ctx;

static int layer_of(const char *module) {
  const char *p = strstr(module, "layers.");
  while (p && p != module && p[-1] != '.') p = strstr(p + 1, "layers.");
  if (!p) return -1;
  char *end;
  long l = strtol(p + 7, &end, 10);
  return end != p + 7 && *end == '.' ? (int)l : -1;
}

static int fill(void *ctx, int i, void *dst, herr *err) {
  fuse_ctx *c = ctx;
  const st_tensor *t = &c->base->tensors[i];
  int m = c->mod_of[i];
  if (m < 0) {
    memcpy(dst, t->data, t->nbytes);
    return 0;
  }
  const fuse_mod *md = &c->mods[m];
  int64_t out = t->shape[0], in = t->shape[1], r = md->a->shape[0];
  float *w = malloc(sizeof(float) * (size_t)(out * in)), *a = malloc(sizeof(float) * (size_t)(r * in)),
        *b = malloc(sizeof(float) * (size_t)(out * r));
  double *row = malloc(sizeof(double) * (size_t)in);
  int rc = 0;
  if (!w || !a || !b || !row) rc = herr_set(err, HEARTH_ENOMEM, "out of memory merging %s", t->name);
  if (!rc) rc = st_to_f32(t, w, err);
  if (!rc) rc = st_to_f32(md->a, a, err);
  if (!rc) rc = st_to_f32(md->b, b, err);
  for (int64_t o = 0; !rc && o < out; o++) {
    for (int64_t k = 0; k < in; k++) row[k] = 0;
    for (int64_t j = 0; j < r; j++) {
      double bj = (double)b[o * r + j];
      const float *aj = a + j * in;
      for (int64_t k = 0; k < in; k++) row[k] += bj * aj[k];
    }
    for (int64_t k = 0; k < in; k++) w[o * in + k] = (float)((double)w[o * in + k] + md->scale * row[k]);
  }
  if (!rc) {
    bk_type bt = t->dtype == ST_F32 ? BK_F32 : t->dtype == ST_BF16 ? BK_BF16 : BK_F16;
    rc = bk_quantize(bt, w, out, in, dst, err);
  }
  free(w), free(a), free(b), free(row);
  return rc;
}

/* The adapter's modules matched to base tensors; refuses what cannot be merged. */
static int match_modules(const char *adir, const adapter_config *cfg, const st_set *ad, const st_set *base, fuse_ctx *c, herr *err) {
  c->mods = calloc(ad->count ? ad->count : 1, sizeof *c->mods);
  c->mod_of = malloc(sizeof(int) * (base->count ? base->count : 1));
  if (!c->mods || !c->mod_of) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (size_t i = 0; i < base->count; i++) c->mod_of[i] = -1;
  for (size_t i = 0; i < ad->count; i++) {
    const char *name = ad->tensors[i].name;
    const char *s = name;
    if (!strncmp(s, "base_model.model.", 17)) s += 17;
    const char *suf = strstr(s, ".lora_A.");
    if (!suf || strcmp(suf + 8, "weight") != 0) {
      if (strstr(s, ".lora_B.") && !strcmp(strstr(s, ".lora_B.") + 8, "weight")) continue; /* paired below */
      return herr_set(err, HEARTH_EUNSUPPORTED, "%s: tensor '%s' is not a LoRA lora_A / lora_B weight (DoRA, embeddings and "
                      "other variants cannot be fused)", adir, name);
    }
    char module[256], bname[300];
    size_t mlen = (size_t)(suf - s);
    if (mlen >= sizeof module) return herr_set(err, HEARTH_EFORMAT, "%s: tensor name '%s' is too long", adir, name);
    memcpy(module, s, mlen);
    module[mlen] = 0;
    snprintf(bname, sizeof bname, "%.*slora_B.weight", (int)(suf + 1 - name), name);
    const st_tensor *a = &ad->tensors[i], *b = st_find(ad, bname);
    if (!b) return herr_set(err, HEARTH_EFORMAT, "%s: module '%s' has lora_A but no lora_B", adir, module);
    const char *tail = strrchr(module, '.');
    if ((tail && (!strcmp(tail, ".experts") || !strcmp(tail, ".base_layer"))) && strstr(module, ".experts"))
      return herr_set(err, HEARTH_EUNSUPPORTED,
                      "%s: '%s': a LoRA on the experts' fused parameters (target_parameters) cannot be fused; load it as an "
                      "adapter (--adapter), or use one made per expert module",
                      adir, module);
    if (!adapter_config_targets(cfg, module, layer_of(module)))
      return herr_set(err, HEARTH_EFORMAT, "%s: adapter_model.safetensors has a LoRA for '%s', which adapter_config.json does not target",
                      adir, module);
    fuse_mod *m = &c->mods[c->n_mods];
    snprintf(m->target, sizeof m->target, "%s.weight", module);
    const st_tensor *w = st_find(base, m->target);
    if (!w) return herr_set(err, HEARTH_ENOTFOUND, "%s: the adapter changes '%s', which the base does not have", adir, m->target);
    if (w->ndim != 2 || (w->dtype != ST_F32 && w->dtype != ST_F16 && w->dtype != ST_BF16))
      return herr_set(err, HEARTH_EUNSUPPORTED, "%s: base tensor '%s' is %s with %d dimensions: only 2-D f32, f16 and bf16 matrices "
                      "can be fused", adir, m->target, st_dtype_name(w->dtype), w->ndim);
    if (a->ndim != 2 || b->ndim != 2 || a->shape[1] != w->shape[1] || b->shape[0] != w->shape[0] || b->shape[1] != a->shape[0])
      return herr_set(err, HEARTH_EFORMAT, "%s: '%s': lora_A [%lld, %lld] and lora_B [%lld, %lld] do not fit the base [%lld, %lld]",
                      adir, module, (long long)a->shape[0], (long long)(a->ndim > 1 ? a->shape[1] : 0), (long long)b->shape[0],
                      (long long)(b->ndim > 1 ? b->shape[1] : 0), (long long)w->shape[0], (long long)w->shape[1]);
    if (a->shape[0] != adapter_config_rank(cfg, module))
      return herr_set(err, HEARTH_EFORMAT, "%s: '%s': the tensors have rank %lld but adapter_config.json says %lld", adir, module,
                      (long long)a->shape[0], (long long)adapter_config_rank(cfg, module));
    m->a = a, m->b = b;
    m->scale = adapter_config_scale(cfg, module, a->shape[0]);
    m->base_index = (int)(w - base->tensors);
    if (c->mod_of[m->base_index] >= 0) return herr_set(err, HEARTH_EFORMAT, "%s: two modules change '%s'", adir, m->target);
    c->mod_of[m->base_index] = c->n_mods++;
  }
  if (!c->n_mods) return herr_set(err, HEARTH_EFORMAT, "%s: adapter_model.safetensors holds no LoRA weights", adir);
  return 0;
}

/* The base's files other than its weights. */
static int copy_others(const char *base, const char *out, herr *err) {
  DIR *d = opendir(base);
  if (!d) return herr_set(err, HEARTH_EIO, "%s: cannot list: %s", base, strerror(errno));
  struct dirent *e;
  int rc = 0;
  while (!rc && (e = readdir(d))) {
    const char *n = e->d_name;
    size_t len = strlen(n);
    if (n[0] == '.' || (len > 12 && !strcmp(n + len - 12, ".safetensors")) || !strcmp(n, "model.safetensors.index.json")) continue;
    char from[4096], to[4096];
    snprintf(from, sizeof from, "%s/%s", base, n);
    snprintf(to, sizeof to, "%s/%s", out, n);
    struct stat sb;
    if (stat(from, &sb) || !S_ISREG(sb.st_mode)) continue;
    rc = hfile_copy(from, to, err);
  }
  closedir(d);
  return rc;
}

int cli_fuse(int argc, char **argv) {
  const char *pos[3];
  int npos = 0;
  for (int i = 1; i < argc; i++) {
    if (cli_is_help(argv[i])) {
      fuse_usage(stdout);
      return 0;
    }
    if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error("fuse", "unknown option '%s'", argv[i]);
    if (npos == 3) return cli_usage_error("fuse", "too many arguments (BASE ADAPTER OUT)");
    pos[npos++] = argv[i];
  }
  if (npos != 3) {
    fuse_usage(stderr);
    return 2;
  }
  const char *base = pos[0], *adir = pos[1], *out = pos[2];
  herr err = {0};
  if (!hfile_is_dir(base))
    return cli_fail("fuse: %s: not a model folder (GGUF files cannot be fused: their weights are quantized or would need "
                    "converting; fuse the safetensors folder, then convert)", base);
  char cpath[4096];
  snprintf(cpath, sizeof cpath, "%s/config.json", base);
  json_t *config = hjson_load_file(cpath, &err);
  if (!config) return cli_fail("fuse: %s", err.msg);
  bool quantized = json_object_get(config, "quantization") || json_object_get(config, "quantization_config");
  json_decref(config);
  if (quantized)
    return cli_fail("fuse: %s is quantized (config.json has a quantization block): merging would mean requantizing, which "
                    "is not the model base + adapter; fuse the unquantized folder, then quantize with hearth convert", base);
  adapter_config cfg;
  if (adapter_config_load(adir, &cfg, &err)) return cli_fail("fuse: %s", err.msg);
  st_set ad, bs;
  memset(&ad, 0, sizeof ad);
  memset(&bs, 0, sizeof bs);
  fuse_ctx c = {0};
  st_writer *w = NULL;
  int rc = adapter_open_weights(adir, &ad, &err);
  if (!rc) rc = st_open(&bs, base, &err);
  if (!rc) {
    c.base = &bs;
    rc = match_modules(adir, &cfg, &ad, &bs, &c, &err);
  }
  if (!rc && mkdir(out, 0755) && errno != EEXIST) rc = herr_set(&err, HEARTH_EIO, "%s: cannot create: %s", out, strerror(errno));
  if (!rc && !(w = st_writer_new())) rc = herr_set(&err, HEARTH_ENOMEM, "out of memory");
  for (size_t i = 0; !rc && i < bs.count; i++)
    if (st_writer_tensor(w, bs.tensors[i].name, bs.tensors[i].dtype, bs.tensors[i].ndim, bs.tensors[i].shape, NULL) < 0)
      rc = herr_set(&err, HEARTH_EINTERNAL, "%s: cannot describe tensor '%s'", base, bs.tensors[i].name);
  if (!rc) {
    st_writer_meta(w, "format", "pt");
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    rc = st_writer_write(w, path, fill, &c, &err);
  }
  if (!rc) rc = copy_others(base, out, &err);
  if (!rc) fprintf(stderr, "fuse: %d matrices of %s merged with %s into %s\n", c.n_mods, base, adir, out);
  st_writer_free(w);
  free(c.mods);
  free(c.mod_of);
  st_close(&ad);
  st_close(&bs);
  adapter_config_free(&cfg);
  return rc ? cli_fail("fuse: %s", err.msg) : 0;
}
