/* weight_formats.h — the stored weight formats the backend tests sweep:
 * every bk_type (FP8 with its per-row f32 scales), and MLX affine at both bit widths with each group size and
 * scale type appearing at least once. */
#ifndef HEARTH_TEST_WEIGHT_FORMATS_H
#define HEARTH_TEST_WEIGHT_FORMATS_H

#include "backend/weights.h"

typedef struct fmt {
  bk_type type;
  int bits, group_size;
  bk_type scale_type;
} fmt;

static const fmt formats[] = {
    {BK_F32, 0, 0, 0},  {BK_F16, 0, 0, 0},  {BK_BF16, 0, 0, 0}, {BK_Q8_0, 0, 0, 0},
    {BK_Q4_0, 0, 0, 0}, {BK_Q4_K, 0, 0, 0}, {BK_Q5_K, 0, 0, 0}, {BK_Q6_K, 0, 0, 0},
    {BK_MLX_AFFINE, 4, 32, BK_F16},  {BK_MLX_AFFINE, 4, 64, BK_BF16}, {BK_MLX_AFFINE, 4, 128, BK_F32},
    {BK_MLX_AFFINE, 8, 32, BK_BF16}, {BK_MLX_AFFINE, 8, 64, BK_F32},  {BK_MLX_AFFINE, 8, 128, BK_F16},
    {BK_FP8, 0, 0, BK_F32},
    {BK_Q5_0, 0, 0, 0}, {BK_Q5_1, 0, 0, 0}, {BK_Q2_K, 0, 0, 0}, {BK_Q3_K, 0, 0, 0},
    {BK_IQ4_NL, 0, 0, 0}, {BK_IQ4_XS, 0, 0, 0},
};
#define N_FORMATS (int)(sizeof formats / sizeof formats[0])

#endif
