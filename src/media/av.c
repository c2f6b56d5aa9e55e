/* av.c — sound and video through FFmpeg's libraries: any container and codec
 * libavformat / libavcodec read, from bytes in memory. Sound becomes 16 kHz mono
 * f32 (libswresample); video becomes RGB8 frames (libswscale) sampled as
 * transformers' Qwen3-VL video processor samples them: the stream's packets
 * counted first (as torchcodec's exact scan counts them), the frame indices
 * chosen from that count and the average rate, then only those frames kept.
 * Durations and frame sizes are checked against the limits as decoding goes. */
#include <math.h>
#include <stdint.h>

#include "media/media.h"
#include "base/vec.h"

#ifdef HEARTH_HAVE_FFMPEG
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/channel_layout.h>
#include <libavutil/imgutils.h>
#include <libavutil/opt.h>
#include <libswresample/swresample.h>
#include <libswscale/swscale.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct mem_io {
  const uint8_t *p;
  size_t n, off;
} mem_io;

static int io_read(void *u, uint8_t *buf, int sz) {
  mem_io *m = u;
  size_t k = m->n - m->off;
  if (k == 0) return AVERROR_EOF;
  if ((size_t)sz < k) k = (size_t)sz;
  memcpy(buf, m->p + m->off, k);
  m->off += k;
  return (int)k;
}

static int64_t io_seek(void *u, int64_t off, int whence) {
  mem_io *m = u;
  if (whence & AVSEEK_SIZE) return (int64_t)m->n;
  int64_t base = 0;
  switch (whence & 3) {
    case SEEK_SET: base = 0; break;
    case SEEK_CUR: base = (int64_t)m->off; break;
    case SEEK_END: base = (int64_t)m->n; break;
    default: return -1;
  }
  int64_t to = base + off;
  if (to < 0 || to > (int64_t)m->n) return -1;
  m->off = (size_t)to;
  return to;
}

typedef struct av_in {
  mem_io mem;
  AVIOContext *io;
  AVFormatContext *fc;
  AVCodecContext *cc;
  int stream;
} av_in;

static void av_in_close(av_in *a) {
  avcodec_free_context(&a->cc);
  if (a->fc) avformat_close_input(&a->fc);
  if (a->io) {
    av_freep(&a->io->buffer);
    avio_context_free(&a->io);
  }
}

static int av_fail(herr *err, const char *what, int e) {
  char b[AV_ERROR_MAX_STRING_SIZE] = "";
  av_strerror(e, b, sizeof b);
  return herr_set(err, HEARTH_EINVAL, "%s: %s", what, b);
}

static int av_in_open(av_in *a, const void *data, size_t n, enum AVMediaType type, int64_t max_pixels, herr *err) {
  static bool quiet;
  if (!__atomic_exchange_n(&quiet, true, __ATOMIC_ACQ_REL)) av_log_set_level(AV_LOG_QUIET);
  memset(a, 0, sizeof *a);
  a->mem = (mem_io){.p = data, .n = n};
  const char *kind = type == AVMEDIA_TYPE_AUDIO ? "audio" : "video";
  uint8_t *buf = av_malloc(65536);
  if (!buf) return herr_set(err, HEARTH_ENOMEM, "out of memory opening %s", kind);
  a->io = avio_alloc_context(buf, 65536, 0, &a->mem, io_read, NULL, io_seek);
  if (!a->io) {
    av_free(buf);
    return herr_set(err, HEARTH_ENOMEM, "out of memory opening %s", kind);
  }
  a->fc = avformat_alloc_context();
  if (!a->fc) return herr_set(err, HEARTH_ENOMEM, "out of memory opening %s", kind);
  a->fc->pb = a->io;
  a->fc->flags |= AVFMT_FLAG_CUSTOM_IO;
  int e = avformat_open_input(&a->fc, NULL, NULL, NULL);
  if (e < 0) {
    a->fc = NULL; /* freed by avformat_open_input on failure */
    return av_fail(err, type == AVMEDIA_TYPE_AUDIO ? "not audio hearth reads" : "not video hearth reads", e);
  }
  if ((e = avformat_find_stream_info(a->fc, NULL)) < 0) return av_fail(err, "bad media data", e);
  const AVCodec *codec = NULL;
  a->stream = av_find_best_stream(a->fc, type, -1, -1, &codec, 0);
  if (a->stream < 0 || !codec) return herr_set(err, HEARTH_EINVAL, "no %s stream hearth can decode", kind);
  a->cc = avcodec_alloc_context3(codec);
  if (!a->cc) return herr_set(err, HEARTH_ENOMEM, "out of memory opening %s", kind);
  if ((e = avcodec_parameters_to_context(a->cc, a->fc->streams[a->stream]->codecpar)) < 0) return av_fail(err, kind, e);
  a->cc->thread_count = 1;
  if (max_pixels > 0) a->cc->max_pixels = max_pixels; /* the decoder refuses larger frames before allocating them */
  if ((e = avcodec_open2(a->cc, codec, NULL)) < 0) return av_fail(err, kind, e);
  return 0;
}

/* Feeds the stream's packets (then the flush) to the decoder; on_frame gets every frame. */
static int av_decode(av_in *a, int (*on_frame)(void *u, AVFrame *f, herr *err), void *u, herr *err) {
  AVPacket *pkt = av_packet_alloc();
  AVFrame *fr = av_frame_alloc();
  int rc = 0;
  if (!pkt || !fr) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory decoding media");
    goto done;
  }
  bool eof = false;
  while (!rc) {
    int e;
    if (!eof) {
      e = av_read_frame(a->fc, pkt);
      if (e < 0) {
        eof = true;
        e = avcodec_send_packet(a->cc, NULL);
      } else {
        if (pkt->stream_index != a->stream) {
          av_packet_unref(pkt);
          continue;
        }
        e = avcodec_send_packet(a->cc, pkt);
        av_packet_unref(pkt);
        if (e == AVERROR_INVALIDDATA) continue; /* a damaged packet: go on, as players do */
      }
      if (e < 0 && e != AVERROR(EAGAIN) && e != AVERROR_EOF) {
        rc = av_fail(err, "bad media data", e);
        break;
      }
    }
    for (;;) {
      e = avcodec_receive_frame(a->cc, fr);
      if (e == AVERROR(EAGAIN)) break;
      if (e == AVERROR_EOF) goto done;
      if (e < 0) {
        if (e == AVERROR_INVALIDDATA) break;
        rc = av_fail(err, "bad media data", e);
        break;
      }
      rc = on_frame(u, fr, err);
      av_frame_unref(fr);
      if (rc) break;
    }
    if (eof && !rc) {
      /* drained: receive_frame gave EAGAIN after the flush (some decoders) */
      break;
    }
  }
done:
  av_packet_free(&pkt);
  av_frame_free(&fr);
  return rc;
}

/* ---- audio ---- */

typedef struct audio_sink {
  SwrContext *swr;
  float *pcm;
  int64_t n, cap, max;
} audio_sink;

static int audio_push(audio_sink *s, const uint8_t **in, int n_in, herr *err) {
  int room = swr_get_out_samples(s->swr, n_in);
  if (room < 0) return herr_set(err, HEARTH_EINVAL, "cannot resample the audio");
  if (s->n + room > s->max + MEDIA_AUDIO_RATE)
    return herr_set(err, HEARTH_EINVAL, "audio longer than the limit (%.0f s)", (double)s->max / MEDIA_AUDIO_RATE);
  if (s->n + room > s->cap && !HGROW(s->pcm, s->cap, s->n + room))
    return herr_set(err, HEARTH_ENOMEM, "out of memory decoding audio");
  uint8_t *out = (uint8_t *)(s->pcm + s->n);
  int got = swr_convert(s->swr, &out, room, in, n_in);
  if (got < 0) return av_fail(err, "cannot resample the audio", got);
  s->n += got;
  if (s->n > s->max)
    return herr_set(err, HEARTH_EINVAL, "audio longer than the limit (%.0f s)", (double)s->max / MEDIA_AUDIO_RATE);
  return 0;
}

static int audio_frame(void *u, AVFrame *f, herr *err) {
  audio_sink *s = u;
  if (!s->swr) {
    AVChannelLayout mono = AV_CHANNEL_LAYOUT_MONO;
    AVChannelLayout in = f->ch_layout;
    if (in.nb_channels <= 0) return herr_set(err, HEARTH_EINVAL, "audio without channels");
    if (in.order == AV_CHANNEL_ORDER_UNSPEC) av_channel_layout_default(&in, in.nb_channels);
    if (f->sample_rate < 1000 || f->sample_rate > 768000) /* (a resampler for absurd rates is huge and slow) */
      return herr_set(err, HEARTH_EINVAL, "audio at %d Hz: sample rates from 1 kHz to 768 kHz are read", f->sample_rate);
    if (in.nb_channels > 64) return herr_set(err, HEARTH_EINVAL, "audio with %d channels (at most 64)", in.nb_channels);
    int e = swr_alloc_set_opts2(&s->swr, &mono, AV_SAMPLE_FMT_FLT, MEDIA_AUDIO_RATE, &in, f->format, f->sample_rate, 0,
                                NULL);
    /* mono as the mean of the channels (librosa's to_mono), not FFmpeg's downmix levels */
    double mix[64];
    int nc = in.nb_channels > 64 ? 64 : in.nb_channels;
    for (int c = 0; c < nc; c++) mix[c] = 1.0 / nc;
    if (e >= 0 && nc == in.nb_channels && nc > 1) e = swr_set_matrix(s->swr, mix, nc);
    if (e < 0 || (e = swr_init(s->swr)) < 0) return av_fail(err, "cannot resample the audio", e);
  }
  return audio_push(s, (const uint8_t **)f->extended_data, f->nb_samples, err);
}

int media_decode_audio(const void *data, size_t n, const media_limits *lim, media *out, herr *err) {
  memset(out, 0, sizeof *out);
  media_limits l;
  media_limits_default(&l);
  if (lim && lim->max_bytes) l.max_bytes = lim->max_bytes;
  if (lim && lim->max_seconds > 0) l.max_seconds = lim->max_seconds;
  if (n > l.max_bytes) return herr_set(err, HEARTH_EINVAL, "audio of %zu bytes is larger than the limit (%zu)", n, l.max_bytes);
  av_in a;
  int rc = av_in_open(&a, data, n, AVMEDIA_TYPE_AUDIO, 0, err);
  audio_sink s = {.max = (int64_t)(l.max_seconds * MEDIA_AUDIO_RATE)};
  if (!rc) rc = av_decode(&a, audio_frame, &s, err);
  if (!rc && s.swr) rc = audio_push(&s, NULL, 0, err); /* what the resampler still holds */
  swr_free(&s.swr);
  av_in_close(&a);
  if (!rc && s.n == 0) rc = herr_set(err, HEARTH_EINVAL, "audio without samples");
  if (rc) {
    free(s.pcm);
    return rc;
  }
  out->kind = MEDIA_AUDIO;
  out->audio.pcm = s.pcm;
  out->audio.n = s.n;
  out->hash = media_hash(out);
  return 0;
}

/* ---- video ---- */

typedef struct video_sink {
  const media_limits *lim;
  const int64_t *idx; /* borrowed: the n_idx frame indices to keep, ascending */
  int64_t n_idx, next; /* idx[next]: the next one to keep */
  AVRational tb;
  struct SwsContext *sws;
  media_video v;
  int32_t cap;
  int64_t decoded;
} video_sink;

#define VIDEO_ALL_KEPT (-1) /* (not an error: every sampled frame is in, the rest need no decoding) */

static int video_keep(video_sink *s, const AVFrame *f, int64_t k, double t, herr *err) {
  if (s->v.n_frames == s->cap) { /* three parallel arrays, grown from one capacity */
    int32_t c1 = s->cap, c2 = s->cap, c3 = s->cap;
    if (!HGROW(s->v.frames, c1, s->cap + 1) || !HGROW(s->v.t, c2, s->cap + 1) || !HGROW(s->v.index, c3, s->cap + 1))
      return herr_set(err, HEARTH_ENOMEM, "out of memory decoding video");
    s->cap = c1;
  }
  media_image *img = &s->v.frames[s->v.n_frames];
  img->w = f->width;
  img->h = f->height;
  img->rgb = malloc((size_t)f->width * f->height * 3);
  if (!img->rgb) return herr_set(err, HEARTH_ENOMEM, "out of memory decoding video");
  if (s->v.n_frames > 0 && s->v.index[s->v.n_frames - 1] == k) /* the same frame again */
    memcpy(img->rgb, s->v.frames[s->v.n_frames - 1].rgb, (size_t)f->width * f->height * 3);
  else {
    uint8_t *dst[4] = {img->rgb, NULL, NULL, NULL};
    int stride[4] = {f->width * 3, 0, 0, 0};
    sws_scale(s->sws, (const uint8_t *const *)f->data, f->linesize, 0, f->height, dst, stride);
  }
  s->v.t[s->v.n_frames] = t;
  s->v.index[s->v.n_frames++] = k;
  return 0;
}

static int video_frame(void *u, AVFrame *f, herr *err) {
  video_sink *s = u;
  int64_t k = s->decoded++; /* frames come in presentation order: k is the frame's index */
  int64_t ts = f->best_effort_timestamp != AV_NOPTS_VALUE ? f->best_effort_timestamp : f->pts;
  double t = ts != AV_NOPTS_VALUE ? ts * av_q2d(s->tb) : (double)k / 25.0;
  if (t > s->lim->max_seconds) return herr_set(err, HEARTH_EINVAL, "video longer than the limit (%.0f s)", s->lim->max_seconds);
  if (s->next >= s->n_idx) return VIDEO_ALL_KEPT;
  if (s->idx[s->next] != k) return 0;
  if (f->width <= 0 || f->height <= 0 || f->width > s->lim->max_side || f->height > s->lim->max_side ||
      (int64_t)f->width * f->height > s->lim->max_pixels)
    return herr_set(err, HEARTH_EINVAL, "video frames of %d x %d pixels are larger than the limit", f->width, f->height);
  s->sws = sws_getCachedContext(s->sws, f->width, f->height, f->format, f->width, f->height, AV_PIX_FMT_RGB24,
                                SWS_BICUBIC | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT, NULL, NULL, NULL);
  if (!s->sws) return herr_set(err, HEARTH_EINVAL, "cannot convert video frames of this pixel format");
  for (; s->next < s->n_idx && s->idx[s->next] == k; s->next++) {
    int rc = video_keep(s, f, k, t, err);
    if (rc) return rc;
  }
  return s->next >= s->n_idx ? VIDEO_ALL_KEPT : 0;
}

/* The stream's frames, counted from its packets as torchcodec's exact scan counts them, and its span
 * in seconds (from the first packet's time to the end of the last). */
static int video_scan(av_in *a, const media_limits *l, int64_t *frames, double *span, herr *err) {
  AVPacket *pkt = av_packet_alloc();
  if (!pkt) return herr_set(err, HEARTH_ENOMEM, "out of memory decoding video");
  int64_t n = 0, lo = INT64_MAX, hi = INT64_MIN, cap = (int64_t)(l->max_seconds * 1000);
  int rc = 0;
  while (av_read_frame(a->fc, pkt) >= 0) {
    if (pkt->stream_index == a->stream && !(pkt->flags & AV_PKT_FLAG_DISCARD)) {
      int64_t ts = pkt->pts != AV_NOPTS_VALUE ? pkt->pts : pkt->dts;
      if (ts != AV_NOPTS_VALUE) {
        if (ts < lo) lo = ts;
        if (ts + pkt->duration > hi) hi = ts + pkt->duration;
      }
      if (++n > cap) {
        rc = herr_set(err, HEARTH_EINVAL, "video with more frames than the limit allows (%lld)", (long long)cap);
        break;
      }
    }
    av_packet_unref(pkt);
  }
  av_packet_free(&pkt);
  AVRational tb = a->fc->streams[a->stream]->time_base;
  *frames = n;
  *span = lo != INT64_MAX && hi != INT64_MIN ? (double)hi * av_q2d(tb) - (double)lo * av_q2d(tb) : 0;
  return rc;
}

int media_decode_video(const void *data, size_t n, const media_limits *lim, const media_video_opts *vo, media *out,
                       herr *err) {
  memset(out, 0, sizeof *out);
  media_limits l;
  media_limits_default(&l);
  if (lim) {
    if (lim->max_bytes) l.max_bytes = lim->max_bytes;
    if (lim->max_pixels) l.max_pixels = lim->max_pixels;
    if (lim->max_side) l.max_side = lim->max_side;
    if (lim->max_seconds > 0) l.max_seconds = lim->max_seconds;
  }
  if (n > l.max_bytes) return herr_set(err, HEARTH_EINVAL, "video of %zu bytes is larger than the limit (%zu)", n, l.max_bytes);
  av_in a;
  int64_t frames = 0, *idx = NULL, n_idx = 0;
  double span = 0, dur = 0, rate = 0;
  /* first the packets: how many frames, over how long; then, from the start again, the sampled frames decoded */
  int rc = av_in_open(&a, data, n, AVMEDIA_TYPE_VIDEO, l.max_pixels, err);
  if (!rc) {
    dur = a.fc->duration != AV_NOPTS_VALUE ? a.fc->duration / (double)AV_TIME_BASE : 0;
    if (dur > l.max_seconds) rc = herr_set(err, HEARTH_EINVAL, "video of %.1f s is longer than the limit (%.0f s)", dur, l.max_seconds);
  }
  if (!rc) rc = video_scan(&a, &l, &frames, &span, err);
  if (!rc) {
    AVStream *st = a.fc->streams[a.stream];
    /* torchcodec's average_fps: the frames over their span, else the header's rate */
    rate = span != 0 ? (double)frames / span : st->r_frame_rate.den ? av_q2d(st->r_frame_rate) : 0;
    if (span > l.max_seconds) rc = herr_set(err, HEARTH_EINVAL, "video of %.1f s is longer than the limit (%.0f s)", span, l.max_seconds);
    else if (frames == 0) rc = herr_set(err, HEARTH_EINVAL, "video without frames");
  }
  av_in_close(&a);
  if (!rc) {
    n_idx = media_video_sample_count(frames, rate, vo);
    if (!(idx = malloc(sizeof(int64_t) * (size_t)(n_idx ? n_idx : 1)))) rc = herr_set(err, HEARTH_ENOMEM, "out of memory decoding video");
    else media_video_sample_indices(frames, n_idx, idx);
  }
  video_sink s = {.lim = &l, .idx = idx, .n_idx = n_idx};
  if (!rc) {
    if (!(rc = av_in_open(&a, data, n, AVMEDIA_TYPE_VIDEO, l.max_pixels, err))) {
      s.tb = a.fc->streams[a.stream]->time_base;
      s.v.fps = rate;
      s.v.duration = span > 0 ? span : dur;
      s.v.src_frames = frames;
      rc = av_decode(&a, video_frame, &s, err);
      if (rc == VIDEO_ALL_KEPT) rc = 0;
    }
    av_in_close(&a);
  }
  sws_freeContext(s.sws);
  free(idx);
  if (!rc && s.v.n_frames == 0) rc = herr_set(err, HEARTH_EINVAL, "video without frames");
  out->kind = MEDIA_VIDEO;
  out->video = s.v;
  if (rc) {
    media_free(out);
    return rc;
  }
  if (out->video.duration <= 0) out->video.duration = out->video.t[out->video.n_frames - 1];
  out->hash = media_hash(out);
  return 0;
}

#else /* built without FFmpeg's libraries */

int media_decode_audio(const void *data, size_t n, const media_limits *lim, media *out, herr *err) {
  (void)data, (void)n, (void)lim, (void)out;
  return herr_set(err, HEARTH_EUNSUPPORTED, "this hearth was built without FFmpeg's libraries: no audio");
}

int media_decode_video(const void *data, size_t n, const media_limits *lim, const media_video_opts *vo, media *out,
                       herr *err) {
  (void)data, (void)n, (void)lim, (void)vo, (void)out;
  return herr_set(err, HEARTH_EUNSUPPORTED, "this hearth was built without FFmpeg's libraries: no video");
}

#endif

/* ---- frame sampling (no FFmpeg needed) ---- */

int64_t media_video_sample_count(int64_t frames, double rate, const media_video_opts *vo) {
  if (frames <= 0) return 0;
  double fps = vo ? vo->fps : 0;
  int64_t lo = vo && vo->min_frames > 0 ? vo->min_frames : 0, hi = vo && vo->max_frames > 0 ? vo->max_frames : INT64_MAX;
  int64_t n;
  if (fps > 0) {
    if (!(rate > 0)) rate = 24; /* transformers' default when the rate is unknown */
    double want = (double)frames / rate * fps; /* int(total_num_frames / metadata.fps * fps) */
    n = want >= 9.0e18 ? INT64_MAX : (int64_t)want;
    if (n < lo) n = lo;
    if (n > hi) n = hi;
    if (n > frames) n = frames;
  } else { /* min(max(total_num_frames, min_frames), max_frames): short clips repeat frames */
    n = frames < lo ? lo : frames;
    if (n > hi) n = hi;
  }
  return n;
}

void media_video_sample_indices(int64_t frames, int64_t n, int64_t *idx) {
  /* np.linspace(0, frames - 1, n): i * step, the last exactly frames - 1; .round(): halves to even */
  double step = n > 1 ? (double)(frames - 1) / (double)(n - 1) : 0;
  for (int64_t i = 0; i < n; i++) idx[i] = (int64_t)nearbyint((double)i * step);
  if (n > 1) idx[n - 1] = frames - 1;
}
