/* fuzz_media_image — the image decoders (JPEG, PNG, WebP, GIF, HEIC and AVIF
 * through libheif) and the data
 * URL reader over arbitrary bytes: each input either decodes to an image
 * within the limits (every pixel readable) or is refused with a message.
 * An input starting with "data:" goes through media_load as a URL. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "media/media.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  media_limits lim = {.max_bytes = 1 << 20, .max_pixels = 1 << 20, .max_side = 4096};
  media m;
  herr err = {0};
  int rc;
  if (size >= 5 && !memcmp(data, "data:", 5)) {
    char *url = malloc(size + 1);
    memcpy(url, data, size);
    url[size] = 0;
    media_source_opts o = {.lim = &lim, .bare_base64 = true};
    rc = media_load(MEDIA_IMAGE, url, &o, NULL, &m, &err);
    free(url);
  } else {
    rc = media_decode_image(data, size, &lim, &m, &err);
  }
  if (rc) {
    if (!err.msg[0]) abort();
    return 0;
  }
  if (m.kind != MEDIA_IMAGE || m.image.w <= 0 || m.image.h <= 0 || (int64_t)m.image.w * m.image.h > lim.max_pixels ||
      !m.image.rgb || !m.hash)
    abort();
  unsigned sum = 0;
  for (size_t i = 0; i < (size_t)m.image.w * m.image.h * 3; i++) sum += m.image.rgb[i];
  if (media_hash(&m) != m.hash) abort();
  (void)sum;
  media_free(&m);
  return 0;
}
