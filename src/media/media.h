/* media.h — decoded media: what an image, a sound or a video becomes before
 * any model sees it, and the decoders that make them (image.c: JPEG, PNG,
 * WebP, GIF's first frame with libjpeg-turbo / libpng / libwebp / giflib,
 * HEIC and AVIF with libheif;
 * av.c: audio and video through FFmpeg's libraries; source.c: data URLs,
 * local files and, when allowed, http(s) URLs). Knows nothing of models:
 * a model's encoder (model/mm.h) takes these as they are.
 *
 * Every decoder works on bytes in memory, checks the limits before it
 * allocates (media_limits), and reports a bad or oversized medium as an
 * error (HEARTH_EINVAL), never a crash. */
#ifndef HEARTH_MEDIA_MEDIA_H
#define HEARTH_MEDIA_MEDIA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

struct sockaddr;

typedef enum media_kind { MEDIA_IMAGE = 0, MEDIA_AUDIO = 1, MEDIA_VIDEO = 2 } media_kind;
#define MEDIA_KINDS 3
#define MEDIA_BIT(k) (1u << (k))
/* "image", "audio", "video". */
static inline const char *media_kind_name(media_kind k) {
  return k == MEDIA_IMAGE ? "image" : k == MEDIA_AUDIO ? "audio" : k == MEDIA_VIDEO ? "video" : "medium";
}

/* An RGB image: h rows of w pixels, 3 bytes each (R, G, B), top row
 * first, no padding between rows. Alpha is dropped as PIL's convert("RGB")
 * drops it; grey and palette images are expanded. */
typedef struct media_image {
  int32_t w, h;
  uint8_t *rgb;   /* owned: w * h * 3 bytes */
} media_image;

/* Sound as 16 kHz mono f32 samples in [-1, 1]. */
#define MEDIA_AUDIO_RATE 16000
typedef struct media_audio {
  float *pcm;     /* owned: n samples */
  int64_t n;
} media_audio;

/* A video as frames sampled from it, each an RGB image, with the time
 * (seconds from the start) it was shown and its index among the stream's
 * frames (a frame sampled twice is there twice). */
typedef struct media_video {
  int32_t n_frames;
  media_image *frames;  /* owned: n_frames */
  double *t;            /* owned: n_frames timestamps */
  int64_t *index;       /* owned: n_frames frame indices (NULL: unknown) */
  double fps;           /* the stream's average frame rate: its frames over its span (0: unknown) */
  double duration;      /* seconds */
  int64_t src_frames;   /* frames in the stream (0: unknown) */
} media_video;

/* One decoded medium. hash is a 64-bit identity of the decoded content
 * (kind, sizes and every byte or sample), never 0: the prefix cache keys a
 * prompt's media rows on it. */
typedef struct media {
  media_kind kind;
  media_image image;
  media_audio audio;
  media_video video;
  uint64_t hash;
} media;

void media_free(media *m);
/* The content hash media.hash holds (computed by the decoders). */
uint64_t media_hash(const media *m);

/* Bounds on what a decoder accepts; a medium beyond them is refused before
 * it is decoded in full. Zero fields take the defaults. */
typedef struct media_limits {
  size_t max_bytes;        /* encoded bytes (default 32 MiB) */
  int64_t max_pixels;      /* width * height of an image or frame (default 50 M) */
  int32_t max_side;        /* width or height (default 16384) */
  double max_seconds;      /* audio / video duration (default 600) */
} media_limits;
void media_limits_default(media_limits *l);

/* How a video is sampled, as transformers' Qwen3-VL video processor samples
 * it (sample_frames) over the stream's frames counted from its packets and
 * its average rate (torchcodec's exact scan): fps > 0 keeps
 * int(frames / rate * fps) frames, else every frame; then at least min_frames,
 * at most max_frames (<= 0: no cap), and with fps at most the stream's
 * frames; the indices evenly spread, linspace(0, frames - 1, n) rounded half
 * to even. */
typedef struct media_video_opts {
  double fps;
  int32_t min_frames;
  int32_t max_frames;
} media_video_opts;

/* The number of frames vo samples from a stream of `frames` frames at `rate`
 * frames a second (<= 0: unknown, taken as 24 as transformers takes it). */
int64_t media_video_sample_count(int64_t frames, double rate, const media_video_opts *vo);
/* The n indices of the sampled frames, ascending: idx[i] = round-half-even(i * (frames - 1) / (n - 1)). */
void media_video_sample_indices(int64_t frames, int64_t n, int64_t *idx);

/* Decodes an image (JPEG, PNG, WebP, GIF — its first frame —, HEIC, AVIF — the primary image) from bytes. */
int media_decode_image(const void *data, size_t n, const media_limits *lim, media *out, herr *err);
/* Decodes the first audio stream of any container FFmpeg reads into 16 kHz
 * mono samples. */
int media_decode_audio(const void *data, size_t n, const media_limits *lim, media *out, herr *err);
/* Decodes the first video stream's frames at vo's rate. */
int media_decode_video(const void *data, size_t n, const media_limits *lim, const media_video_opts *vo, media *out,
                       herr *err);

/* Where media bytes come from: a data URL ("data:image/png;base64,...")
 * or a plain base64 string when bare_base64, a local path or file:// URL
 * (allow_files), or an http(s) URL (allow_remote: fetched with libcurl,
 * at most lim->max_bytes; only http and https, no proxy, at most 5
 * redirects, each hop's host resolved and checked against the address rule
 * below and the connection pinned to the checked address; every failure of
 * a fetch is one message, "cannot fetch URL (...)", whatever its reason —
 * refused, unreachable, an HTTP error, too large — which goes to the log).
 * The bytes are malloc'ed into *out / *n. */
typedef struct media_source_opts {
  bool allow_files;
  bool allow_remote;
  bool bare_base64;
  /* Remote fetches: which addresses may be connected to. By default only
   * public ones (media_addr_public); allow_private_hosts lifts that. addr_ok,
   * when set, decides instead (ctx is its own): an embedder's narrower rule. */
  bool allow_private_hosts;
  bool (*addr_ok)(const struct sockaddr *sa, void *ctx);
  void *addr_ok_ctx;
  const media_limits *lim;
} media_source_opts;
int media_fetch(const char *url, const media_source_opts *o, uint8_t **out, size_t *n, herr *err);

/* True when a fetch may reach sa without allow_private_hosts: an IPv4 or
 * IPv6 address that is not loopback, private (10/8, 172.16/12, 192.168/16,
 * 100.64/10, fc00::/7), link-local (169.254/16, fe80::/10), multicast,
 * unspecified, broadcast or otherwise reserved (0/8, 240/4, 192.0.0/24,
 * 198.18/15, fec0::/10), judged through the IPv4 address that IPv4-mapped,
 * IPv4-compatible, NAT64 (64:ff9b::/96) and 6to4 (2002::/16) forms carry.
 * Any other family is not public. */
bool media_addr_public(const struct sockaddr *sa);

/* Decodes whichever kind `kind` asks for from a source as media_fetch reads it. */
int media_load(media_kind kind, const char *url, const media_source_opts *o, const media_video_opts *vo, media *out,
               herr *err);

#endif
