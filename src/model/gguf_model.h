/* gguf_model.h — a GGUF file seen as a model folder: its metadata as a
 * model_config (llama, qwen2, qwen3, qwen3moe, phi3, gemma2, gemma3, granite architectures), its tensors under the
 * Hugging Face names the decoder asks for, and f32 conversion of tensors
 * (llama.cpp's llama q/k row permutation undone on request). */
#ifndef HEARTH_MODEL_GGUF_MODEL_H
#define HEARTH_MODEL_GGUF_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "format/config.h"
#include "backend/weights.h"
#include "format/gguf.h"
#include "format/safetensors.h"

/* True when path names a .gguf file. */
bool gguf_model_is_gguf(const char *path);
/* Fills c from the file's metadata (c->raw holds the equivalent config.json). */
int gguf_model_config(const gguf_file *g, model_config *c, herr *err);
/* Tensor names of the llama layout, Hugging Face ↔ GGUF ("model.layers.3.mlp.up_proj.weight" ↔
 * "blk.3.ffn_up.weight"); false when the name has no counterpart. */
bool gguf_model_hf_to_gguf_name(const char *hf, char *out, size_t n);
bool gguf_model_gguf_to_hf_name(const char *gguf, char *out, size_t n);
/* The backend weight type a stored dtype / ggml type is multiplied as; false when none. */
bool model_bk_type_of_st(st_dtype dt, bk_type *out);
bool model_bk_type_of_gguf(gguf_tensor_type t, bk_type *out);
/* llama.cpp's name of a general.file_type value (llama_ftype: "Q4_K_M",
 * "Q3_K_S", "IQ4_XS", "F16"...); NULL when unknown. */
const char *gguf_model_file_type_name(int64_t ft);
/* The tensor types model_bk_type_of_gguf takes, for messages. */
#define GGUF_MODEL_TYPES "f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs"

/* The GGUF tensor holding Hugging Face tensor hf_name, or NULL (absent or no GGUF name for it). */
const gguf_tensor *gguf_model_find(const gguf_file *g, const char *hf_name);
/* Converts t (F32, F16, BF16, Q8_0, Q4_0) to f32 in Hugging Face row order:
 * for a llama file's q_proj / k_proj (heads = attention / kv heads) the rows
 * are un-permuted. out holds t->nelements floats. */
int gguf_model_read_f32(const gguf_file *g, const gguf_tensor *t, const char *hf_name, int64_t heads, float *out, herr *err);

#endif
