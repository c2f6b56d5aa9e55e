/* inspect.c — `hearth inspect PATH [--json]`: what a model folder, a
 * safetensors file or a GGUF file holds (model type, exact parameter count,
 * bytes per dtype, shards, context length, vocabulary size, quantization,
 * chat template), as text or as one JSON object.
 *
 * Owns: gathering those facts and printing them. Refuses to know: how the
 * files are parsed (format/ does that) or what the tensors mean. Uses the
 * internal format module (format/config.h, gguf.h, safetensors.h), not
 * hearth.h: it reads headers without loading a model.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "cli/cli.h"
#include "format/config.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/gguf_model.h"
#include "model/model.h"

#define INSPECT_MAX_DTYPES 64

typedef struct dtype_bytes {
  char name[24];
  uint64_t bytes;
} dtype_bytes;

/* Everything inspect reports. Unknown numbers are -1. */
typedef struct model_facts {
  const char *format;            /* "safetensors" or "gguf" */
  char model_type[64];           /* "" when unknown */
  bool type_supported;
  uint64_t parameters;
  uint64_t expert_parameters;    /* of them, in mixture-of-experts experts */
  uint64_t expert_bytes;         /* their stored bytes (what --expert-budget divides) */
  int64_t expert_budget;         /* --expert-budget given here (0: none) */
  int64_t n_experts, experts_per_token; /* -1: not a mixture of experts */
  int64_t n_layers;              /* num_hidden_layers (-1: unknown) */
  uint64_t nextn_parameters;     /* of layers past num_hidden_layers (GLM-5's multi-token prediction), not in parameters */
  uint64_t tensors;
  int shards;
  dtype_bytes dtypes[INSPECT_MAX_DTYPES];
  int ndtypes;
  int64_t context_length, vocab_size;
  bool quantized;
  int64_t quant_bits, quant_group_size;   /* -1 when not stated */
  char quant_method[32];
  char file_type[16];                     /* GGUF general.file_type by llama.cpp's name ("Q4_K_M"); "" when absent */
  bool chat_template;
  bool tensors_read;             /* the weights could be read (else nothing is printed) */
  char problem[1024];            /* why the model is not usable although its weights were read ("" if none) */
  bool quiet;                    /* a weight file that does not open goes to problem, not stderr */
} model_facts;

static void usage(FILE *f) {
  fprintf(f,
          "usage: hearth inspect [PATH | --model PATH] [--expert-budget BYTES] [--json]\n\n"
          "Describes a model without loading it: PATH is a model folder (config.json +\n"
          "safetensors, single or sharded), a .safetensors file, or a .gguf file\n"
          "(default: the built-in model).\n\n"
          "Prints model_type, the exact parameter count (sum of the element counts of\n"
          "all stored tensors but buffers — gemma4's layer_scalar, the routers'\n"
          "e_score_correction_bias — and the multi-token-prediction layers stored past\n"
          "num_hidden_layers, counted apart), for a mixture of\n"
          "experts the parameters active per token (all but the experts a token does\n"
          "not use), tensor count, shards, bytes per dtype, context length,\n"
          "vocabulary size, quantization and whether a chat template is present.\n\n"
          "options:\n"
          "  --expert-budget BYTES  a mixture of experts: the expert bytes that stay\n"
          "              resident under that budget (loading would keep at most this\n"
          "              many; the server's /stats reports the bytes resident now)\n"
          "  --json      print one JSON object with the keys model_type, parameters,\n"
          "              active_parameters, expert_bytes and expert_resident_bytes (null\n"
          "              unless a mixture of experts), nextn_parameters,\n"
          "              tensors, shards, bytes_by_dtype, context_length, vocab_size,\n"
          "              quantization (null or {bits, group_size, method}; GGUF also\n"
          "              file_type, llama.cpp's name of the mix: Q4_K_M, Q3_K_S, IQ4_XS...),\n"
          "              chat_template\n"
          "  -h, --help  this text\n\n"
          "Exits 1 when a file is malformed or the model_type is not supported (what\n"
          "could be read is still printed).\n");
}

/* A weight file that does not open: said on stderr, or kept in m->problem when m->quiet. */
static int open_failed(model_facts *m, const char *msg) {
  if (m->quiet) {
    snprintf(m->problem, sizeof m->problem, "%s", msg);
    return 1;
  }
  return cli_fail("%s", msg);
}

static void add_dtype_bytes(model_facts *m, const char *name, uint64_t bytes) {
  for (int i = 0; i < m->ndtypes; i++) {
    if (strcmp(m->dtypes[i].name, name) == 0) {
      m->dtypes[i].bytes += bytes;
      return;
    }
  }
  if (m->ndtypes < INSPECT_MAX_DTYPES) {
    snprintf(m->dtypes[m->ndtypes].name, sizeof m->dtypes[0].name, "%s", name);
    m->dtypes[m->ndtypes++].bytes = bytes;
  }
}

/* Tensors of mixture-of-experts experts: "model.layers.3.mlp.experts.7.up_proj.weight",
 * "model.layers.3.experts.gate_up_proj" (transformers), "blk.3.ffn_up_exps.weight" (GGUF),
 * "model.layers.3.mlp.switch_mlp.up_proj.weight" / ".scales" / ".biases" (mlx-lm). */
static bool is_expert_tensor(const char *name) {
  return strstr(name, ".experts.") != NULL || strstr(name, "_exps.") != NULL || strstr(name, ".switch_mlp.") != NULL;
}
/* Tensors transformers keeps as buffers, not parameters (gemma4's per-layer scalar). */
static bool is_buffer_tensor(const char *name) {
  size_t n = strlen(name);
  return (n >= 13 && !strcmp(name + n - 13, ".layer_scalar")) || (n >= 24 && !strcmp(name + n - 24, ".e_score_correction_bias"));
}
/* A tensor of a decoder layer numbered past num_hidden_layers ("model.layers.78.eh_proj.weight": the
 * multi-token-prediction layers GLM-5 and DeepSeek-V3 checkpoints keep after the decoder). */
static bool is_nextn_tensor(const char *name, int64_t n_layers) {
  const char *l = strstr(name, "layers.");
  if (n_layers <= 0 || !l || (l != name && l[-1] != '.')) return false;
  char *end = NULL;
  long long i = strtoll(l + 7, &end, 10);
  return end != l + 7 && *end == '.' && i >= n_layers;
}

/* ---- config.json and friends (raw JSON; model_config_load is consulted separately) ---- */

/* An integer field of the config or of its text_config (multimodal configs). */
static int64_t config_int(const json_t *cfg, const char *key) {
  const json_t *v = json_object_get(cfg, key);
  if (!json_is_integer(v)) v = json_object_get(json_object_get(cfg, "text_config"), key);
  return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

static void read_quantization(model_facts *m, const json_t *cfg) {
  const json_t *q = json_object_get(cfg, "quantization");   /* MLX */
  const char *method = "mlx";
  if (!json_is_object(q)) {
    q = json_object_get(cfg, "quantization_config");         /* transformers */
    method = json_string_value(json_object_get(q, "quant_method"));
    if (!method) method = "unknown";
  }
  if (!json_is_object(q)) return;
  m->quantized = true;
  snprintf(m->quant_method, sizeof m->quant_method, "%s", method);
  const json_t *bits = json_object_get(q, "bits"), *gs = json_object_get(q, "group_size");
  if (!bits) bits = json_object_get(q, "w_bit");             /* older AWQ */
  if (!gs) gs = json_object_get(q, "q_group_size");
  m->quant_bits = json_is_integer(bits) ? (int64_t)json_integer_value(bits) : -1;
  m->quant_group_size = json_is_integer(gs) ? (int64_t)json_integer_value(gs) : -1;
  if (m->quant_bits < 0) {
    if (json_is_true(json_object_get(q, "load_in_4bit"))) m->quant_bits = 4;
    else if (json_is_true(json_object_get(q, "load_in_8bit")) || strncmp(method, "fp8", 3) == 0) m->quant_bits = 8;
  }
}

static bool folder_has_chat_template(const char *dir) {
  static const char *files[] = {"chat_template.jinja", "chat_template.json"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char *p = hpath_join(dir, files[i]);
    bool yes = p && hfile_exists(p);
    free(p);
    if (yes) return true;
  }
  char *p = hpath_join(dir, "tokenizer_config.json");
  if (!p) return false;
  bool yes = false;
  if (hfile_exists(p)) {
    json_t *tc = hjson_load_file(p, NULL);
    const json_t *t = json_object_get(tc, "chat_template");
    yes = (json_is_string(t) && json_string_length(t) > 0) || (json_is_array(t) && json_array_size(t) > 0);
    json_decref(tc);
  }
  free(p);
  return yes;
}

/* Reads DIR/config.json into m. When the config is not usable, says why in m->problem and
 * keeps the facts that could be read. A folder without config.json is fine. */
static void read_folder_config(model_facts *m, const char *dir) {
  char *path = hpath_join(dir, "config.json");
  if (!path) {
    snprintf(m->problem, sizeof m->problem, "out of memory");
    return;
  }
  if (!hfile_exists(path)) {
    free(path);
    return;
  }
  herr err = {0};
  json_t *cfg = hjson_load_file(path, &err);
  if (!cfg) {
    free(path);
    snprintf(m->problem, sizeof m->problem, "%s", err.msg);
    return;
  }
  const char *type = json_string_value(json_object_get(cfg, "model_type"));
  if (type) snprintf(m->model_type, sizeof m->model_type, "%s", type);
  m->context_length = config_int(cfg, "max_position_embeddings");
  if (m->context_length < 0) m->context_length = config_int(cfg, "n_positions");
  if (m->context_length < 0) m->context_length = config_int(cfg, "max_sequence_length");
  m->vocab_size = config_int(cfg, "vocab_size");
  read_quantization(m, cfg);

  if (!type) {
    snprintf(m->problem, sizeof m->problem, "%s: no model_type", path);
  } else if (!model_type_supported(type)) {
    snprintf(m->problem, sizeof m->problem, "%s: model_type '%s' is not supported (supported: %s)", path, type,
             model_supported_types());
  } else {
    /* the config as loading reads it: the shared keys and the family's own (the experts of Gemma 4,
     * Qwen3.5-MoE, GLM-5 are its keys), laid out without reading a weight */
    model *md = NULL;
    if (model_load(dir, &(model_load_opts){.threads = 1, .geometry_only = true}, &md, &err)) {
      snprintf(m->problem, sizeof m->problem, "%s", err.msg);
    } else {
      const model_config *c = model_cfg(md);
      m->type_supported = true;
      if (c->max_position_embeddings > 0) m->context_length = c->max_position_embeddings;
      m->vocab_size = c->vocab_size;
      if (c->num_experts > 0) m->n_experts = c->num_experts, m->experts_per_token = c->num_experts_per_tok;
      m->n_layers = c->num_hidden_layers;
      model_free(md);
    }
  }
  json_decref(cfg);
  free(path);
}

/* ---- safetensors ---- */

static int inspect_safetensors(model_facts *m, const char *path, bool is_dir) {
  m->format = "safetensors";
  st_set s;
  herr err = {0};
  if (st_open(&s, path, &err)) return open_failed(m, err.msg);
  m->tensors_read = true;
  m->tensors = s.count;
  m->shards = s.nshards;
  uint64_t by_dtype[ST_DTYPE_COUNT] = {0};
  bool seen[ST_DTYPE_COUNT] = {0};
  if (is_dir) { /* the config first: it says which layers are the decoder's */
    m->chat_template = folder_has_chat_template(path);
    read_folder_config(m, path);
  }
  for (size_t i = 0; i < s.count; i++) {
    by_dtype[s.tensors[i].dtype] += s.tensors[i].nbytes;
    seen[s.tensors[i].dtype] = true;
    if (is_nextn_tensor(s.tensors[i].name, m->n_layers)) {
      if (!is_buffer_tensor(s.tensors[i].name)) m->nextn_parameters += (uint64_t)s.tensors[i].numel;
      continue;
    }
    if (!is_buffer_tensor(s.tensors[i].name)) m->parameters += (uint64_t)s.tensors[i].numel;
    if (is_expert_tensor(s.tensors[i].name)) {
      m->expert_parameters += (uint64_t)s.tensors[i].numel;
      m->expert_bytes += s.tensors[i].nbytes;
    }
  }
  for (int d = 0; d < ST_DTYPE_COUNT; d++)
    if (seen[d]) add_dtype_bytes(m, st_dtype_name((st_dtype)d), by_dtype[d]);
  st_close(&s);
  return 0;
}

/* ---- GGUF ---- */

static bool tensor_type_is_quantized(uint32_t t) {
  switch (t) {
    case GGUF_TENSOR_F32: case GGUF_TENSOR_F16: case GGUF_TENSOR_BF16: case GGUF_TENSOR_F64:
    case GGUF_TENSOR_I8: case GGUF_TENSOR_I16: case GGUF_TENSOR_I32: case GGUF_TENSOR_I64:
      return false;
    default:
      return true;
  }
}

static int inspect_gguf(model_facts *m, const char *path) {
  m->format = "gguf";
  gguf_file *g = NULL;
  herr err = {0};
  if (gguf_open(&g, path, &err)) return open_failed(m, err.msg);
  size_t n = gguf_tensor_count(g);
  m->tensors_read = true;
  m->tensors = n;
  m->shards = 1;
  int64_t splits;
  if (gguf_get_int(g, "split.count", &splits, NULL) == 0 && splits > 0) m->shards = (int)splits;
  /* The most common quantized type (by elements) names the quantization. */
  uint64_t quant_elems[GGUF_TENSOR_TYPE_COUNT] = {0};
  for (size_t i = 0; i < n; i++) {
    const gguf_tensor *t = gguf_tensor_at(g, i);
    m->parameters += (uint64_t)t->nelements;
    if (is_expert_tensor(t->name)) {
      m->expert_parameters += (uint64_t)t->nelements;
      m->expert_bytes += t->nbytes;
    }
    add_dtype_bytes(m, gguf_tensor_type_name(t->type), t->nbytes);
    if ((unsigned)t->type < GGUF_TENSOR_TYPE_COUNT && tensor_type_is_quantized(t->type)) quant_elems[t->type] += (uint64_t)t->nelements;
  }
  int best = -1;
  for (int t = 0; t < GGUF_TENSOR_TYPE_COUNT; t++)
    if (quant_elems[t] && (best < 0 || quant_elems[t] > quant_elems[best])) best = t;
  if (best >= 0) {
    const gguf_tensor_type_info *ti = gguf_tensor_type_get((uint32_t)best);
    m->quantized = true;
    snprintf(m->quant_method, sizeof m->quant_method, "gguf %s", ti ? ti->name : "?");
    m->quant_bits = -1;
    /* q4_0, q8_0, q4_K, iq4_xs, tq2_0, mxfp4...: the first digit is the nominal bit width */
    for (const char *p = ti ? ti->name : ""; *p; p++)
      if (*p >= '1' && *p <= '8') {
        m->quant_bits = *p - '0';
        break;
      }
    m->quant_group_size = ti ? ti->block_size : -1;
  }
  int64_t ft;
  if (gguf_get_int(g, "general.file_type", &ft, NULL) == 0) {
    const char *ftn = gguf_model_file_type_name(ft);
    if (ftn) snprintf(m->file_type, sizeof m->file_type, "%s", ftn);
    else snprintf(m->file_type, sizeof m->file_type, "type %lld", (long long)ft);
  }
  char *arch = NULL;
  if (gguf_get_strdup(g, "general.architecture", &arch, NULL) == 0 && arch) {
    snprintf(m->model_type, sizeof m->model_type, "%s", arch);
    char key[160];
    int64_t v;
    snprintf(key, sizeof key, "%s.context_length", arch);
    if (gguf_get_int(g, key, &v, NULL) == 0) m->context_length = v;
    snprintf(key, sizeof key, "%s.vocab_size", arch);
    if (gguf_get_int(g, key, &v, NULL) == 0) m->vocab_size = v;
    snprintf(key, sizeof key, "%s.expert_count", arch);
    if (gguf_get_int(g, key, &v, NULL) == 0 && v > 0) m->n_experts = v;
    snprintf(key, sizeof key, "%s.expert_used_count", arch);
    if (gguf_get_int(g, key, &v, NULL) == 0 && v > 0) m->experts_per_token = v;
  }
  free(arch);
  gguf_arr tokens;
  if (m->vocab_size < 0 && gguf_get_arr(g, "tokenizer.ggml.tokens", &tokens, NULL) == 0) m->vocab_size = (int64_t)tokens.n;
  m->chat_template = gguf_has(g, "tokenizer.chat_template");
  /* GGUF architectures are named by llama.cpp, not by config.json; report, do not judge. The
   * tensor types are hearth's to judge: one it cannot multiply makes the file unusable. */
  m->type_supported = true;
  for (size_t i = 0; i < n; i++) {
    const gguf_tensor *t = gguf_tensor_at(g, i);
    bk_type bt;
    if (!model_bk_type_of_gguf((gguf_tensor_type)t->type, &bt)) {
      snprintf(m->problem, sizeof m->problem, "%s: tensor '%s' has type %s, which hearth does not read (it reads %s)", path,
               t->name, gguf_tensor_type_name(t->type), GGUF_MODEL_TYPES);
      m->type_supported = false;
      break;
    }
  }
  gguf_close(g);
  return 0;
}

static bool is_gguf_file(const char *path) {
  size_t l = strlen(path);
  if (l >= 5 && strcmp(path + l - 5, ".gguf") == 0) return true;
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  char magic[4] = {0};
  bool yes = fread(magic, 1, 4, f) == 4 && memcmp(magic, "GGUF", 4) == 0;
  fclose(f);
  return yes;
}

/* A folder that holds no safetensors but exactly one .gguf file: that file's path (caller frees), else NULL. */
static char *lone_gguf_in(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return NULL;
  char *found = NULL;
  int ngguf = 0, nst = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t l = strlen(e->d_name);
    if (l > 12 && strcmp(e->d_name + l - 12, ".safetensors") == 0) nst++;
    if (l > 5 && strcmp(e->d_name + l - 5, ".gguf") == 0 && ngguf++ == 0) found = hpath_join(dir, e->d_name);
  }
  closedir(d);
  if (nst == 0 && ngguf == 1) return found;
  free(found);
  return NULL;
}

/* ---- output ---- */

/* Parameters a token uses: all but the experts it is not routed to; -1 when not a mixture of experts. */
static int64_t active_parameters(const model_facts *m) {
  if (m->n_experts <= 0 || m->experts_per_token <= 0 || !m->expert_parameters) return -1;
  uint64_t idle = m->expert_parameters / (uint64_t)m->n_experts * (uint64_t)(m->n_experts - m->experts_per_token);
  return (int64_t)(m->parameters - idle);
}

static json_t *facts_json(const model_facts *m) {
  json_t *o = json_object();
  json_t *bytes = json_object();
  json_t *quant = json_null();
  if (m->quantized) {
    quant = json_object();
    json_object_set_new(quant, "bits", m->quant_bits >= 0 ? json_integer(m->quant_bits) : json_null());
    json_object_set_new(quant, "group_size", m->quant_group_size >= 0 ? json_integer(m->quant_group_size) : json_null());
    json_object_set_new(quant, "method", json_string(m->quant_method));
    if (m->file_type[0]) json_object_set_new(quant, "file_type", json_string(m->file_type));
  }
  for (int i = 0; i < m->ndtypes; i++) json_object_set_new(bytes, m->dtypes[i].name, json_integer((json_int_t)m->dtypes[i].bytes));
  json_object_set_new(o, "format", json_string(m->format));
  json_object_set_new(o, "model_type", m->model_type[0] ? json_string(m->model_type) : json_null());
  json_object_set_new(o, "supported", m->model_type[0] ? json_boolean(m->type_supported) : json_null());
  json_object_set_new(o, "parameters", json_integer((json_int_t)m->parameters));
  int64_t active = active_parameters(m);
  json_object_set_new(o, "active_parameters", active >= 0 ? json_integer((json_int_t)active) : json_null());
  json_object_set_new(o, "expert_bytes", active >= 0 ? json_integer((json_int_t)m->expert_bytes) : json_null());
  uint64_t resident = m->expert_budget > 0 && (uint64_t)m->expert_budget < m->expert_bytes ? (uint64_t)m->expert_budget
                                                                                            : m->expert_bytes;
  json_object_set_new(o, "expert_resident_bytes", active >= 0 ? json_integer((json_int_t)resident) : json_null());
  json_object_set_new(o, "nextn_parameters", json_integer((json_int_t)m->nextn_parameters));
  json_object_set_new(o, "tensors", json_integer((json_int_t)m->tensors));
  json_object_set_new(o, "shards", json_integer(m->shards));
  json_object_set_new(o, "bytes_by_dtype", bytes);
  json_object_set_new(o, "context_length", m->context_length >= 0 ? json_integer(m->context_length) : json_null());
  json_object_set_new(o, "vocab_size", m->vocab_size >= 0 ? json_integer(m->vocab_size) : json_null());
  json_object_set_new(o, "quantization", quant);
  json_object_set_new(o, "chat_template", json_boolean(m->chat_template));
  return o;
}

static void print_size(char *out, size_t cap, double v, const char *const *units) {
  int u = 0;
  while (v >= 1000 && units[u + 1]) {
    v /= 1000;
    u++;
  }
  snprintf(out, cap, u ? "%.2f %s" : "%.0f%s", v, units[u]);
}

static void print_facts(const char *path, const model_facts *m) {
  static const char *const counts[] = {"", "thousand", "million", "billion", "trillion", NULL};
  static const char *const bytes[] = {" B", "kB", "MB", "GB", "TB", NULL};
  char human[64];
  printf("%s (%s)\n", path, m->format);
  if (m->model_type[0]) printf("  model_type      %s%s\n", m->model_type, m->type_supported ? "" : " (not supported)");
  else printf("  model_type      unknown (no config.json)\n");
  print_size(human, sizeof human, (double)m->parameters, counts);
  printf("  parameters      %llu (%s)\n", (unsigned long long)m->parameters, human);
  int64_t active = active_parameters(m);
  if (active >= 0) {
    print_size(human, sizeof human, (double)active, counts);
    printf("  active          %lld (%s) per token: %lld of %lld experts\n", (long long)active, human,
           (long long)m->experts_per_token, (long long)m->n_experts);
    print_size(human, sizeof human, (double)m->expert_bytes, bytes);
    printf("  expert bytes    %llu (%s): what --expert-budget limits\n", (unsigned long long)m->expert_bytes, human);
    uint64_t resident = m->expert_budget > 0 && (uint64_t)m->expert_budget < m->expert_bytes ? (uint64_t)m->expert_budget
                                                                                              : m->expert_bytes;
    print_size(human, sizeof human, (double)resident, bytes);
    printf("  resident        at most %llu (%s) of expert weights in memory%s\n", (unsigned long long)resident, human,
           m->expert_budget > 0 ? " under --expert-budget" : " (all: no --expert-budget)");
  }
  if (m->nextn_parameters) {
    print_size(human, sizeof human, (double)m->nextn_parameters, counts);
    printf("  next-token      %llu (%s) more in multi-token-prediction layers\n", (unsigned long long)m->nextn_parameters, human);
  }
  printf("  tensors         %llu\n", (unsigned long long)m->tensors);
  printf("  shards          %d\n", m->shards);
  uint64_t total = 0;
  for (int i = 0; i < m->ndtypes; i++) total += m->dtypes[i].bytes;
  print_size(human, sizeof human, (double)total, bytes);
  printf("  bytes           %llu (%s)\n", (unsigned long long)total, human);
  for (int i = 0; i < m->ndtypes; i++) {
    print_size(human, sizeof human, (double)m->dtypes[i].bytes, bytes);
    printf("    %-12s  %llu (%s)\n", m->dtypes[i].name, (unsigned long long)m->dtypes[i].bytes, human);
  }
  if (m->context_length >= 0) printf("  context length  %lld\n", (long long)m->context_length);
  else printf("  context length  unknown\n");
  if (m->vocab_size >= 0) printf("  vocab size      %lld\n", (long long)m->vocab_size);
  else printf("  vocab size      unknown\n");
  if (!m->quantized) printf("  quantization    none\n");
  else {
    printf("  quantization    %s", m->quant_method);
    if (m->quant_bits >= 0) printf(", %lld-bit", (long long)m->quant_bits);
    if (m->quant_group_size >= 0) printf(", group size %lld", (long long)m->quant_group_size);
    if (m->file_type[0]) printf(", file type %s", m->file_type);
    printf("\n");
  }
  printf("  chat template   %s\n", m->chat_template ? "yes" : "no");
}

/* Fills m with what path holds; returns nonzero on a file that could not be read. */
static int gather_facts(model_facts *m, const char *path, long long budget) {
  bool quiet = m->quiet;
  memset(m, 0, sizeof *m);
  m->quiet = quiet;
  m->context_length = m->vocab_size = m->quant_bits = m->quant_group_size = m->n_experts = m->experts_per_token = m->n_layers = -1;
  m->expert_budget = budget;
  bool is_dir = hfile_is_dir(path);
  int rc;
  char *gguf_in_dir = is_dir ? lone_gguf_in(path) : NULL;
  if (gguf_in_dir) {
    rc = inspect_gguf(m, gguf_in_dir);
    if (!rc) m->chat_template |= folder_has_chat_template(path);
    free(gguf_in_dir);
  } else if (!is_dir && is_gguf_file(path)) {
    rc = inspect_gguf(m, path);
  } else {
    rc = inspect_safetensors(m, path, is_dir);
  }
  return rc;
}

json_t *cli_inspect_json(const char *path, char *problem, size_t cap) {
  model_facts m = {.quiet = true};
  int rc = gather_facts(&m, path, 0);
  snprintf(problem, cap, "%s", m.problem[0] ? m.problem : rc || !m.tensors_read ? "the weights could not be read" : "");
  if (!m.tensors_read) return NULL;
  return facts_json(&m);
}

int cli_inspect(int argc, char **argv) {
  const char *path = NULL, *v = NULL;
  bool as_json = false;
  long long budget = 0;
  for (int i = 1; i < argc; i++) {
    int r;
    if (cli_is_help(argv[i])) {
      usage(stdout);
      return 0;
    } else if ((r = cli_opt(argc, argv, &i, "--model", &v))) {
      if (r < 0) return 2;
      if (path) return cli_usage_error("inspect", "one PATH only (got '%s' and '%s')", path, v);
      path = v;
    } else if ((r = cli_opt(argc, argv, &i, "--expert-budget", &v))) {
      if (r < 0) return 2;
      if (!cli_parse_bytes(v, &budget) || budget <= 0)
        return cli_usage_error("inspect", "--expert-budget must be a byte count (4096, 512M, 2G), not '%s'", v);
    } else if (strcmp(argv[i], "--json") == 0) {
      as_json = true;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      return cli_usage_error("inspect", "unknown option '%s'", argv[i]);
    } else if (path) {
      return cli_usage_error("inspect", "one PATH only (got '%s' and '%s')", path, argv[i]);
    } else {
      path = argv[i];
    }
  }
  if (!path) path = cli_default_model();
  if (!path) return cli_usage_error("inspect", "no PATH given and no built-in model found");
  if (!hfile_exists(path)) return cli_fail("%s: no such file or folder", path);

  model_facts m = {0};
  int rc = gather_facts(&m, path, budget);
  if (!m.tensors_read) return rc ? rc : 1;
  if (as_json) {
    json_t *o = facts_json(&m);
    char *text = o ? json_dumps(o, JSON_INDENT(2)) : NULL;
    if (!text) {
      json_decref(o);
      return cli_fail("out of memory");
    }
    printf("%s\n", text);
    free(text);
    json_decref(o);
  } else {
    print_facts(path, &m);
  }
  fflush(stdout);
  if (m.problem[0]) return cli_fail("%s", m.problem);
  return rc ? 1 : 0;
}
