/* mm_positions.h — multimodal RoPE positions of a prompt holding media
 * (transformers' Qwen3.5 get_rope_index): text tokens count up by one on
 * all three axes; a run of consecutive soft tokens starting where the next
 * position would be P takes (P + t, P + h, P + w) from its tokens' pos3
 * offsets (mm_embeds.pos3), and the token after the run continues at
 * P + 1 + the largest offset of the run. A video whose temporal patches
 * are separated by timestamp text is several runs. */
#ifndef HEARTH_MODEL_MM_POSITIONS_H
#define HEARTH_MODEL_MM_POSITIONS_H

#include <stdbool.h>
#include <stdint.h>

/* n tokens; soft[i]: token i is a soft token; pos3: 3 offsets per soft token, the soft tokens in order.
 * out: 3 per token (t, h, w). Returns the position of the token after the last (the prompt's delta is
 * that minus n: every later token's position is its index plus the delta). */
int64_t mm_positions3(const bool *soft, const int32_t *pos3, int64_t n, int32_t *out);

#endif
