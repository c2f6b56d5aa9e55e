/* llamacpp_logits.c — the reference side of tools/gen_gguf_parity.sh: loads a
 * GGUF file with llama.cpp's own library (its CPU build) and writes the logits
 * of every position of one prompt, given as token ids, as float32
 * little-endian [position][vocab]. Built by gen_gguf_parity.sh against the
 * libllama of the llama.cpp release it converts with; not part of hearth's build.
 * A libllama whose CPU backends are loadable modules (node-llama-cpp's
 * prebuilt one) finds them in $LLAMACPP_BACKENDS.
 *
 * One decode of the whole prompt, one thread, an f32 KV cache and no flash
 * attention: llama.cpp's plain CPU path, so the only roundings left are the
 * ones its matmuls make for the weights' type.
 *
 *   llamacpp_logits MODEL.gguf 1,2,3 OUT.bin
 *   llamacpp_logits --quantize IN.gguf OUT.gguf TYPE   (llama.cpp's llama-quantize of an f32 file, one
 *                                                     thread: q4_0 q5_0 q5_1 iq4_nl q2_k q3_k_m q4_k_m
 *                                                     q5_k_m q6_k iq4_xs) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
  (void)user;
  if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static int quantize(const char *in, const char *out, const char *type) {
  static const struct {
    const char *name;
    enum llama_ftype ftype;
  } types[] = {{"q4_0", LLAMA_FTYPE_MOSTLY_Q4_0},     {"q5_0", LLAMA_FTYPE_MOSTLY_Q5_0},
               {"q5_1", LLAMA_FTYPE_MOSTLY_Q5_1},     {"iq4_nl", LLAMA_FTYPE_MOSTLY_IQ4_NL},
               {"q2_k", LLAMA_FTYPE_MOSTLY_Q2_K},     {"q3_k_m", LLAMA_FTYPE_MOSTLY_Q3_K_M},
               {"q4_k_m", LLAMA_FTYPE_MOSTLY_Q4_K_M}, {"q5_k_m", LLAMA_FTYPE_MOSTLY_Q5_K_M},
               {"q6_k", LLAMA_FTYPE_MOSTLY_Q6_K},     {"iq4_xs", LLAMA_FTYPE_MOSTLY_IQ4_XS}};
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
    if (strcmp(types[i].name, type)) continue;
    struct llama_model_quantize_params qp = llama_model_quantize_default_params();
    qp.nthread = 1;
    qp.ftype = types[i].ftype;
    if (llama_model_quantize(in, out, &qp)) {
      fprintf(stderr, "%s: llama.cpp cannot quantize it to %s\n", in, type);
      return 1;
    }
    return 0;
  }
  fprintf(stderr, "unknown type %s\n", type);
  return 2;
}

int main(int argc, char **argv) {
  if (argc == 5 && !strcmp(argv[1], "--quantize")) {
    llama_log_set(quiet, NULL);
    llama_backend_init();
    const char *backends = getenv("LLAMACPP_BACKENDS");
    if (backends && *backends) ggml_backend_load_all_from_path(backends);
    return quantize(argv[2], argv[3], argv[4]);
  }
  if (argc != 4) {
    fprintf(stderr, "usage: %s MODEL.gguf IDS OUT.bin\n", argv[0]);
    return 2;
  }
  int32_t ids[512];
  int n = 0;
  for (char *p = argv[2]; *p && n < 512;) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p) {
      fprintf(stderr, "bad id list: %s\n", argv[2]);
      return 2;
    }
    ids[n++] = (int32_t)v;
    p = *end == ',' ? end + 1 : end;
  }
  llama_log_set(quiet, NULL);
  llama_backend_init();
  const char *backends = getenv("LLAMACPP_BACKENDS");
  if (backends && *backends) ggml_backend_load_all_from_path(backends);
  struct llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  struct llama_model *model = llama_model_load_from_file(argv[1], mp);
  if (!model) {
    fprintf(stderr, "%s: llama.cpp cannot load it\n", argv[1]);
    return 1;
  }
  struct llama_context_params cp = llama_context_default_params();
  cp.n_ctx = (uint32_t)(n < 64 ? 64 : n);
  cp.n_batch = cp.n_ubatch = cp.n_ctx;
  cp.n_seq_max = 1;
  cp.n_threads = cp.n_threads_batch = 1;
  cp.type_k = cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.swa_full = true;
  struct llama_context *ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    fprintf(stderr, "%s: no context\n", argv[1]);
    return 1;
  }
  int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  struct llama_batch b = llama_batch_init(n, 0, 1);
  for (int i = 0; i < n; i++) {
    b.token[i] = ids[i];
    b.pos[i] = i;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = 0;
    b.logits[i] = 1;
  }
  b.n_tokens = n;
  if (llama_decode(ctx, b)) {
    fprintf(stderr, "%s: llama_decode failed\n", argv[1]);
    return 1;
  }
  FILE *f = fopen(argv[3], "wb");
  if (!f) {
    perror(argv[3]);
    return 1;
  }
  for (int i = 0; i < n; i++) {
    const float *row = llama_get_logits_ith(ctx, i);
    if (!row || fwrite(row, sizeof(float), (size_t)vocab, f) != (size_t)vocab) {
      fprintf(stderr, "%s: no logits for position %d\n", argv[1], i);
      return 1;
    }
  }
  if (fclose(f)) {
    perror(argv[3]);
    return 1;
  }
  printf("%s: %d positions x %d logits\n", argv[1], n, vocab);
  llama_batch_free(b);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
