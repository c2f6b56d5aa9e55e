/* mm_audio.h — audio preprocessing as transformers' feature extractors
 * compute it, from 16 kHz mono f32 PCM to the features an audio tower
 * takes: Gemma-4's log-mel spectrogram (Gemma4AudioFeatureExtractor: the
 * clip padded to a multiple of 128 samples, semicausal framing of 20 ms
 * windows every 10 ms, optional preemphasis, a periodic Hann window, the
 * magnitude of a real FFT, an HTK mel filter bank without normalization,
 * log(mel + floor), optional per-bin mean / stddev, and the frame mask:
 * a frame is valid when its whole window holds real samples). */
#ifndef HEARTH_MODEL_MM_AUDIO_H
#define HEARTH_MODEL_MM_AUDIO_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

#define GEMMA4_MEL_MAX 256

/* The extractor's settings (preprocessor_config.json's feature-extractor fields). */
typedef struct gemma4_audio_prep {
  int feature_size;          /* mel bins (128) */
  int sampling_rate;         /* 16000 */
  double frame_length_ms, hop_length_ms; /* 20, 10 */
  double min_frequency, max_frequency;   /* 0, 8000 */
  double preemphasis;        /* 0: none */
  bool preemphasis_htk_flavor;
  bool fft_overdrive;        /* the FFT twice as long */
  double input_scale_factor; /* 1 */
  double mel_floor;          /* 1e-3 */
  int pad_to_multiple_of;    /* 128 */
  int64_t max_length;        /* 480000 samples: longer clips are cut */
  bool has_mean, has_std;
  double per_bin_mean[GEMMA4_MEL_MAX], per_bin_stddev[GEMMA4_MEL_MAX];
} gemma4_audio_prep;

void gemma4_audio_prep_default(gemma4_audio_prep *p);
/* dir's preprocessor_config.json over the defaults (a missing file keeps them). */
int gemma4_audio_prep_load(gemma4_audio_prep *p, const char *dir, herr *err);

/* Features of n samples: *feat [*frames, feature_size] floats (zero on invalid frames) and *mask
 * [*frames] (1 valid); both owned by the caller (free). */
int gemma4_audio_features(const gemma4_audio_prep *p, const float *pcm, int64_t n, float **feat, uint8_t **mask,
                          int64_t *frames, herr *err);

/* Soft tokens of a clip of n samples (the frame mask halved twice by the tower's stride-2
 * subsampling, as the processor counts them; 0 for a clip too short for one frame). */
int64_t gemma4_audio_num_tokens(const gemma4_audio_prep *p, int64_t n);

#endif
