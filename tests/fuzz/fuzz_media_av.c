/* fuzz_media_av — sound and video through FFmpeg's libraries over arbitrary
 * bytes (the first byte picks audio or video): each input either decodes
 * within the limits (samples finite, frames of the sizes they claim, times
 * in order) or is refused with a message. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "media/media.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  media_limits lim = {.max_bytes = 1 << 20, .max_pixels = 1 << 16, .max_side = 1024, .max_seconds = 20};
  media m;
  herr err = {0};
  int rc;
  if (data[0] & 1) {
    rc = media_decode_audio(data + 1, size - 1, &lim, &m, &err);
    if (!rc) {
      if (m.audio.n <= 0 || m.audio.n > (int64_t)(lim.max_seconds + 1) * MEDIA_AUDIO_RATE) abort();
      for (int64_t i = 0; i < m.audio.n; i++)
        if (isnan(m.audio.pcm[i])) abort();
    }
  } else {
    media_video_opts vo = {.fps = (data[0] >> 1) & 7, .min_frames = (data[0] >> 4) & 3, .max_frames = 8};
    rc = media_decode_video(data + 1, size - 1, &lim, &vo, &m, &err);
    if (!rc) {
      if (m.video.n_frames <= 0 || m.video.n_frames > 8) abort();
      for (int32_t k = 0; k < m.video.n_frames; k++) {
        const media_image *f = &m.video.frames[k];
        if (!m.video.index || m.video.index[k] < 0 || (k && m.video.index[k] < m.video.index[k - 1])) abort();
        if (f->w <= 0 || f->h <= 0 || (int64_t)f->w * f->h > lim.max_pixels || !f->rgb) abort();
        volatile uint8_t last = f->rgb[(size_t)f->w * f->h * 3 - 1];
        (void)last;
      }
    }
  }
  if (rc) {
    if (!err.msg[0]) abort();
    return 0;
  }
  media_free(&m);
  return 0;
}
