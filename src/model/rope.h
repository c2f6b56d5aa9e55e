/* rope.h — rotary frequency tables from a config's RoPE settings
 * (default, linear, llama3, yarn, gemma4's proportional; partial rotary), as transformers'
 * modeling_rope_utils computes them; and per-pair divisors (a GGUF's rope_freqs), as llama.cpp applies them. The backend applies them (op_rope). */
#ifndef HEARTH_MODEL_ROPE_H
#define HEARTH_MODEL_ROPE_H

#include "backend/ops.h"
#include "base/status.h"
#include "format/config.h"

/* head_dim: the attention head size; max_pos: config max_position_embeddings
 * (yarn's default original length); mscale / mscale_all_dim: yarn extras (0 = absent).
 * t->inv_freq is owned by t: rope_table_free. */
int rope_table_init(rope_table *t, const rope_config *r, int64_t head_dim, int64_t max_pos, double mscale,
                    double mscale_all_dim, herr *err);
void rope_table_free(rope_table *t);

#endif
