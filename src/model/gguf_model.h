/* gguf_model.h — a GGUF file seen as a model folder: its metadata as a
 * model_config (llama, qwen2, qwen3 architectures), its tensors under the
 * Hugging Face names the decoder asks for, and f32 conversion of tensors
 * (llama.cpp's llama q/k row permutation undone on request). */
#ifndef HEARTH_MODEL_GGUF_MODEL_H
#define HEARTH_MODEL_GGUF_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "format/config.h"
#include "format/gguf.h"

/* True when path names a .gguf file. */
bool gguf_model_is_gguf(const char *path);
/* Fills c from the file's metadata (c->raw holds the equivalent config.json). */
int gguf_model_config(const gguf_file *g, model_config *c, herr *err);
/* The GGUF tensor holding Hugging Face tensor hf_name, or NULL (absent or no GGUF name for it). */
const gguf_tensor *gguf_model_find(const gguf_file *g, const char *hf_name);
/* Converts t (F32, F16, BF16, Q8_0, Q4_0) to f32 in Hugging Face row order:
 * for a llama file's q_proj / k_proj (heads = attention / kv heads) the rows
 * are un-permuted. out holds t->nelements floats. */
int gguf_model_read_f32(const gguf_file *g, const gguf_tensor *t, const char *hf_name, int64_t heads, float *out, herr *err);

#endif
