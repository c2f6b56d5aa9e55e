/* mm_image.h — image preprocessing as transformers' processors compute it,
 * from decoded RGB8 pixels to the patches a vision tower takes: the
 * antialiased resize of torchvision / PyTorch on uint8 images (the
 * separable fixed-point filter of its CPU uint8 path: weights rounded to
 * int16 at a precision fitted to the largest weight, a horizontal then a
 * vertical pass, each rounded and clamped to uint8), and the Qwen-VL
 * family's smart resize, rescale / normalize and patching into
 * (channel, temporal patch, row, column) vectors in spatial-merge order,
 * for images and for video frames. */
#ifndef HEARTH_MODEL_MM_IMAGE_H
#define HEARTH_MODEL_MM_IMAGE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

typedef enum mm_resample { MM_RESAMPLE_BILINEAR = 0, MM_RESAMPLE_BICUBIC } mm_resample;

/* dst [C, oh, ow] = src [C, ih, iw] (planar uint8) resized with antialiasing
 * as torch.nn.functional.interpolate(antialias=True) does on uint8 tensors
 * on the CPU (bicubic with a = -0.5). Same size: a copy. */
int mm_resize_u8(uint8_t *dst, int oh, int ow, const uint8_t *src, int c, int ih, int iw, mm_resample how, herr *err);

/* The Qwen-VL processors' settings (preprocessor_config.json). */
typedef struct qwen_vision_prep {
  int patch_size, temporal_patch_size, merge_size;
  int64_t min_pixels, max_pixels;          /* images: size.shortest_edge / longest_edge */
  int64_t video_min_pixels, video_max_pixels; /* videos (video_preprocessor_config.json) */
  double mean[3], std[3], rescale;         /* rescale_factor (1/255) */
  mm_resample resample;
  /* how videos are sampled (video_preprocessor_config.json's fps, min_frames, max_frames; every frame
   * when do_sample_frames is false) */
  double video_fps;
  int video_min_frames, video_max_frames;
  bool video_sample_frames;
} qwen_vision_prep;

/* Qwen3-VL / Qwen3.5 defaults (patch 16, merge 2, temporal 2, mean / std 0.5, bicubic; videos sampled at
 * 2 frames a second, 4 to 768 frames). */
void qwen_vision_prep_default(qwen_vision_prep *p);
/* Reads preprocessor_config.json (and video_preprocessor_config.json when present) of dir over the
 * defaults; a missing file keeps them. */
int qwen_vision_prep_load(qwen_vision_prep *p, const char *dir, herr *err);

/* qwen2_vl's smart_resize: (h, w) rounded to multiples of factor within [min_pixels, max_pixels]. */
int qwen_smart_resize(int h, int w, int factor, int64_t min_pixels, int64_t max_pixels, int *oh, int *ow, herr *err);
/* The video variant (qwen3_vl): the pixel budget covers t frames. */
int qwen_smart_resize_video(int t, int h, int w, int temporal_factor, int factor, int64_t min_pixels, int64_t max_pixels,
                            int *oh, int *ow, herr *err);

/* Patches of n_frames RGB8 frames [h, w, 3] (one image: n_frames 1, repeated over the temporal patch;
 * a video: padded by repeating its last frame to a multiple of the temporal patch), resized to the
 * smart size, normalized, as [grid_t * grid_h * grid_w, 3 * temporal * patch * patch] floats
 * (*out owned by the caller: free) and the grid (t, h, w in patches). */
int qwen_vision_patches(const qwen_vision_prep *p, const uint8_t *const *frames, int n_frames, int h, int w, bool video,
                        float **out, int64_t grid[3], herr *err);

#endif
