/* image.c — images from bytes to RGB8 pixels, as PIL's Image.open(...).convert("RGB")
 * gives them: JPEG through libjpeg-turbo (the library PIL's wheels use, default
 * settings: islow IDCT, fancy upsampling), PNG through libpng (16-bit samples
 * keep their high byte, alpha and transparency are dropped, no gamma applied),
 * WebP through libwebp (still images), GIF's first frame through giflib (the
 * frame on the logical screen, the rest in the background colour), HEIC and
 * AVIF through libheif when built with it (the primary image, with its own
 * rotation, mirroring and crop applied as libheif applies them by default,
 * alpha dropped as for PNG; HEVC through libde265, AV1 through libdav1d or
 * libaom). Sizes are checked against the limits before any pixel is decoded. */
#include <gif_lib.h>
#include <stdio.h> /* before jpeglib.h, which uses FILE */
#include <jpeglib.h>
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <webp/decode.h>
#ifdef HEARTH_HAVE_HEIF
#include <libheif/heif.h>
#endif

#include "base/hash.h"
#include "media/media.h"

void media_limits_default(media_limits *l) {
  l->max_bytes = (size_t)32 << 20;
  l->max_pixels = 50000000;
  l->max_side = 16384;
  l->max_seconds = 600;
}

static media_limits limits_of(const media_limits *lim) {
  media_limits d;
  media_limits_default(&d);
  if (lim) {
    if (lim->max_bytes) d.max_bytes = lim->max_bytes;
    if (lim->max_pixels) d.max_pixels = lim->max_pixels;
    if (lim->max_side) d.max_side = lim->max_side;
    if (lim->max_seconds > 0) d.max_seconds = lim->max_seconds;
  }
  return d;
}

void media_free(media *m) {
  if (!m) return;
  free(m->image.rgb);
  free(m->audio.pcm);
  for (int32_t i = 0; i < m->video.n_frames; i++) free(m->video.frames[i].rgb);
  free(m->video.frames);
  free(m->video.t);
  free(m->video.index);
  memset(m, 0, sizeof *m);
}

static uint64_t hash_bytes(uint64_t h, const void *data, size_t n) {
  const uint8_t *p = data;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    h = hmix64(h ^ w) + HMIX64_GAMMA;
  }
  uint64_t w = 0;
  memcpy(&w, p + i, n - i);
  return hmix64(h ^ w ^ ((uint64_t)(n - i) << 56));
}

uint64_t media_hash(const media *m) {
  uint64_t h = hmix64(0x6d65646961ull + (uint64_t)m->kind);
  switch (m->kind) {
    case MEDIA_IMAGE:
      h = hmix64(h ^ ((uint64_t)(uint32_t)m->image.w << 32 | (uint32_t)m->image.h));
      h = hash_bytes(h, m->image.rgb, (size_t)m->image.w * m->image.h * 3);
      break;
    case MEDIA_AUDIO:
      h = hmix64(h ^ (uint64_t)m->audio.n);
      h = hash_bytes(h, m->audio.pcm, (size_t)m->audio.n * sizeof(float));
      break;
    case MEDIA_VIDEO:
      h = hmix64(h ^ (uint64_t)m->video.n_frames);
      for (int32_t i = 0; i < m->video.n_frames; i++) {
        const media_image *f = &m->video.frames[i];
        h = hmix64(h ^ ((uint64_t)(uint32_t)f->w << 32 | (uint32_t)f->h));
        h = hash_bytes(h, &m->video.t[i], sizeof(double));
        if (m->video.index) h = hash_bytes(h, &m->video.index[i], sizeof(int64_t));
        h = hash_bytes(h, f->rgb, (size_t)f->w * f->h * 3);
      }
      break;
  }
  return h ? h : 1;
}

static int check_size(int64_t w, int64_t h, const media_limits *l, const char *fmt, herr *err) {
  if (w <= 0 || h <= 0) return herr_set(err, HEARTH_EINVAL, "%s image has no pixels (%lld x %lld)", fmt, (long long)w, (long long)h);
  if (w > l->max_side || h > l->max_side || w * h > l->max_pixels)
    return herr_set(err, HEARTH_EINVAL, "%s image of %lld x %lld pixels is larger than the limit (%d per side, %lld in all)",
                    fmt, (long long)w, (long long)h, l->max_side, (long long)l->max_pixels);
  return 0;
}

static int alloc_rgb(media *out, int64_t w, int64_t h, herr *err) {
  out->kind = MEDIA_IMAGE;
  out->image.w = (int32_t)w;
  out->image.h = (int32_t)h;
  out->image.rgb = malloc((size_t)w * h * 3);
  if (!out->image.rgb) return herr_set(err, HEARTH_ENOMEM, "out of memory for an image of %lld x %lld", (long long)w, (long long)h);
  return 0;
}

/* ---- JPEG ---- */

typedef struct jpeg_fail {
  struct jpeg_error_mgr mgr;
  jmp_buf jb;
  char msg[JMSG_LENGTH_MAX];
} jpeg_fail;

static void jpeg_on_error(j_common_ptr c) {
  jpeg_fail *f = (jpeg_fail *)c->err;
  c->err->format_message(c, f->msg);
  longjmp(f->jb, 1);
}

static void jpeg_on_message(j_common_ptr c, int level) { (void)c, (void)level; /* warnings: PIL goes on too */ }

static int decode_jpeg(const uint8_t *data, size_t n, const media_limits *l, media *out, herr *err) {
  struct jpeg_decompress_struct c;
  jpeg_fail f;
  memset(&c, 0, sizeof c);
  c.err = jpeg_std_error(&f.mgr);
  f.mgr.error_exit = jpeg_on_error;
  f.mgr.emit_message = jpeg_on_message;
  f.msg[0] = 0;
  uint8_t *volatile cmyk = NULL;
  if (setjmp(f.jb)) {
    jpeg_destroy_decompress(&c);
    free(cmyk);
    media_free(out);
    return herr_set(err, HEARTH_EINVAL, "bad JPEG data: %s", f.msg);
  }
  jpeg_create_decompress(&c);
  jpeg_mem_src(&c, data, (unsigned long)n);
  jpeg_read_header(&c, TRUE);
  if (check_size(c.image_width, c.image_height, l, "JPEG", err)) {
    jpeg_destroy_decompress(&c);
    return err ? err->code : HEARTH_EINVAL;
  }
  bool is_cmyk = c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK;
  c.out_color_space = is_cmyk ? JCS_CMYK : JCS_RGB;
  jpeg_start_decompress(&c);
  int64_t w = c.output_width, h = c.output_height;
  if (alloc_rgb(out, w, h, err)) {
    jpeg_destroy_decompress(&c);
    return HEARTH_ENOMEM;
  }
  if (is_cmyk && !(cmyk = malloc((size_t)w * 4))) {
    jpeg_destroy_decompress(&c);
    media_free(out);
    return herr_set(err, HEARTH_ENOMEM, "out of memory decoding a JPEG");
  }
  /* Adobe CMYK JPEGs store inverted ink; PIL reads them inverted back, then converts
   * as r = 255 - min(255, c + k) per channel (Convert.c's cmyk2rgb). */
  bool adobe = c.saw_Adobe_marker;
  while (c.output_scanline < c.output_height) {
    int64_t y = c.output_scanline;
    uint8_t *row = out->image.rgb + (size_t)y * w * 3;
    JSAMPROW rp = is_cmyk ? (JSAMPROW)cmyk : row;
    jpeg_read_scanlines(&c, &rp, 1);
    if (is_cmyk)
      for (int64_t x = 0; x < w; x++) {
        int k = cmyk[x * 4 + 3];
        if (adobe) k = 255 - k;
        for (int ch = 0; ch < 3; ch++) {
          int v = cmyk[x * 4 + ch];
          if (adobe) v = 255 - v;
          int s = v + k;
          row[x * 3 + ch] = (uint8_t)(s > 255 ? 0 : 255 - s);
        }
      }
  }
  jpeg_finish_decompress(&c);
  jpeg_destroy_decompress(&c);
  free(cmyk);
  return 0;
}

/* ---- PNG ---- */

typedef struct png_reader {
  const uint8_t *data;
  size_t n, off;
  char msg[200];
} png_reader;

static void png_read_mem(png_structp p, png_bytep dst, size_t n) {
  png_reader *r = png_get_io_ptr(p);
  if (n > r->n - r->off) png_error(p, "truncated PNG data");
  memcpy(dst, r->data + r->off, n);
  r->off += n;
}

static void png_on_error(png_structp p, png_const_charp msg) {
  png_reader *r = png_get_error_ptr(p);
  snprintf(r->msg, sizeof r->msg, "%s", msg);
  png_longjmp(p, 1);
}

static void png_on_warning(png_structp p, png_const_charp msg) { (void)p, (void)msg; }

static int decode_png(const uint8_t *data, size_t n, const media_limits *l, media *out, herr *err) {
  png_reader r = {.data = data, .n = n};
  png_structp p = png_create_read_struct(PNG_LIBPNG_VER_STRING, &r, png_on_error, png_on_warning);
  if (!p) return herr_set(err, HEARTH_ENOMEM, "out of memory decoding a PNG");
  png_infop info = png_create_info_struct(p);
  png_bytep *volatile rows = NULL;
  if (!info || setjmp(png_jmpbuf(p))) {
    png_destroy_read_struct(&p, info ? &info : NULL, NULL);
    free(rows);
    media_free(out);
    return herr_set(err, HEARTH_EINVAL, "bad PNG data: %s", r.msg[0] ? r.msg : "out of memory");
  }
  png_set_read_fn(p, &r, png_read_mem);
  png_set_user_limits(p, (png_uint_32)l->max_side, (png_uint_32)l->max_side);
  png_read_info(p, info);
  png_uint_32 w = png_get_image_width(p, info), h = png_get_image_height(p, info);
  if (check_size(w, h, l, "PNG", err)) {
    png_destroy_read_struct(&p, &info, NULL);
    return err ? err->code : HEARTH_EINVAL;
  }
  int ct = png_get_color_type(p, info), depth = png_get_bit_depth(p, info);
  if (ct == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(p);
  if (ct == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(p);
  if (depth == 16) png_set_strip_16(p);
  if (ct & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(p);
  if (ct == PNG_COLOR_TYPE_GRAY || ct == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(p);
  png_set_interlace_handling(p);
  png_read_update_info(p, info);
  if (png_get_rowbytes(p, info) != (size_t)w * 3) png_error(p, "unexpected row layout");
  if (alloc_rgb(out, w, h, err)) {
    png_destroy_read_struct(&p, &info, NULL);
    return HEARTH_ENOMEM;
  }
  rows = malloc(sizeof(png_bytep) * h);
  if (!rows) png_error(p, "out of memory");
  for (png_uint_32 y = 0; y < h; y++) rows[y] = out->image.rgb + (size_t)y * w * 3;
  png_read_image(p, rows);
  png_destroy_read_struct(&p, &info, NULL);
  free(rows);
  return 0;
}

/* ---- WebP ---- */

static int decode_webp(const uint8_t *data, size_t n, const media_limits *l, media *out, herr *err) {
  WebPBitstreamFeatures ft;
  if (WebPGetFeatures(data, n, &ft) != VP8_STATUS_OK) return herr_set(err, HEARTH_EINVAL, "bad WebP data");
  if (ft.has_animation) return herr_set(err, HEARTH_EINVAL, "animated WebP images are not supported");
  int rc = check_size(ft.width, ft.height, l, "WebP", err);
  if (rc) return rc;
  if ((rc = alloc_rgb(out, ft.width, ft.height, err))) return rc;
  size_t stride = (size_t)ft.width * 3;
  if (!WebPDecodeRGBInto(data, n, out->image.rgb, stride * ft.height, (int)stride)) {
    media_free(out);
    return herr_set(err, HEARTH_EINVAL, "bad WebP data");
  }
  return 0;
}

/* ---- GIF ---- */

typedef struct gif_reader {
  const uint8_t *data;
  size_t n, off;
} gif_reader;

static int gif_read_mem(GifFileType *g, GifByteType *dst, int n) {
  gif_reader *r = g->UserData;
  size_t k = (size_t)n <= r->n - r->off ? (size_t)n : r->n - r->off;
  memcpy(dst, r->data + r->off, k);
  r->off += k;
  return (int)k;
}

static int decode_gif(const uint8_t *data, size_t n, const media_limits *l, media *out, herr *err) {
  gif_reader r = {.data = data, .n = n};
  int e = 0;
  GifFileType *g = DGifOpen(&r, gif_read_mem, &e);
  if (!g) return herr_set(err, HEARTH_EINVAL, "bad GIF data: %s", GifErrorString(e) ? GifErrorString(e) : "?");
  int rc = 0;
  GifByteType *idx = NULL;
  int W = g->SWidth, H = g->SHeight;
  if ((rc = check_size(W, H, l, "GIF", err))) goto done;
  GifRecordType rec;
  int transparent = -1;
  for (;;) {
    if (DGifGetRecordType(g, &rec) == GIF_ERROR) {
      rc = herr_set(err, HEARTH_EINVAL, "bad GIF data: %s", GifErrorString(g->Error));
      goto done;
    }
    if (rec == TERMINATE_RECORD_TYPE) {
      rc = herr_set(err, HEARTH_EINVAL, "GIF without an image");
      goto done;
    }
    if (rec == EXTENSION_RECORD_TYPE) {
      int code;
      GifByteType *ext;
      if (DGifGetExtension(g, &code, &ext) == GIF_ERROR) {
        rc = herr_set(err, HEARTH_EINVAL, "bad GIF data: %s", GifErrorString(g->Error));
        goto done;
      }
      while (ext) {
        if (code == GRAPHICS_EXT_FUNC_CODE && ext[0] >= 4 && (ext[1] & 1)) transparent = ext[4];
        if (DGifGetExtensionNext(g, &ext) == GIF_ERROR) {
          rc = herr_set(err, HEARTH_EINVAL, "bad GIF data: %s", GifErrorString(g->Error));
          goto done;
        }
      }
      continue;
    }
    if (rec != IMAGE_DESC_RECORD_TYPE) continue;
    if (DGifGetImageDesc(g) == GIF_ERROR) {
      rc = herr_set(err, HEARTH_EINVAL, "bad GIF data: %s", GifErrorString(g->Error));
      goto done;
    }
    break;
  }
  GifImageDesc *d = &g->Image;
  ColorMapObject *cm = d->ColorMap ? d->ColorMap : g->SColorMap;
  if (!cm) {
    rc = herr_set(err, HEARTH_EINVAL, "GIF without a colour map");
    goto done;
  }
  if (d->Width <= 0 || d->Height <= 0 || (int64_t)d->Width * d->Height > l->max_pixels || d->Width > l->max_side ||
      d->Height > l->max_side) {
    rc = herr_set(err, HEARTH_EINVAL, "GIF frame of %d x %d pixels is out of bounds", d->Width, d->Height);
    goto done;
  }
  idx = malloc((size_t)d->Width * d->Height);
  if (!idx || (rc = alloc_rgb(out, W, H, err))) {
    rc = rc ? rc : herr_set(err, HEARTH_ENOMEM, "out of memory decoding a GIF");
    goto done;
  }
  if (d->Interlace) {
    static const int start[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
    for (int pass = 0; pass < 4; pass++)
      for (int y = start[pass]; y < d->Height; y += step[pass])
        if (DGifGetLine(g, idx + (size_t)y * d->Width, d->Width) == GIF_ERROR) goto bad_line;
  } else {
    for (int y = 0; y < d->Height; y++)
      if (DGifGetLine(g, idx + (size_t)y * d->Width, d->Width) == GIF_ERROR) goto bad_line;
  }
  /* the canvas: the background colour (the transparent index when the frame has one), the frame on it */
  int bg = transparent >= 0 ? transparent : g->SBackGroundColor;
  ColorMapObject *scm = g->SColorMap ? g->SColorMap : cm;
  GifColorType bgc = bg < scm->ColorCount ? scm->Colors[bg] : (GifColorType){0, 0, 0};
  for (int64_t i = 0; i < (int64_t)W * H; i++) {
    out->image.rgb[i * 3] = bgc.Red;
    out->image.rgb[i * 3 + 1] = bgc.Green;
    out->image.rgb[i * 3 + 2] = bgc.Blue;
  }
  for (int y = 0; y < d->Height; y++) {
    int cy = d->Top + y;
    if (cy < 0 || cy >= H) continue;
    for (int x = 0; x < d->Width; x++) {
      int cx = d->Left + x;
      if (cx < 0 || cx >= W) continue;
      int k = idx[(size_t)y * d->Width + x];
      GifColorType c = k < cm->ColorCount ? cm->Colors[k] : (GifColorType){0, 0, 0};
      uint8_t *px = out->image.rgb + ((size_t)cy * W + cx) * 3;
      px[0] = c.Red, px[1] = c.Green, px[2] = c.Blue;
    }
  }
  goto done;
bad_line:
  rc = herr_set(err, HEARTH_EINVAL, "bad GIF data: %s", GifErrorString(g->Error));
  media_free(out);
done:
  free(idx);
  DGifCloseFile(g, &e);
  return rc;
}

/* ---- HEIC / AVIF (ISO base media files holding HEIF images) ---- */

/* The format an ISO-BMFF file's ftyp box names, when it is a HEIF still image: "HEIC", "AVIF" or NULL.
 * Its major brand or any compatible brand decides (mif1 alone: a HEIF of a codec libheif says). */
static const char *heif_format(const uint8_t *p, size_t n) {
  if (n < 16 || memcmp(p + 4, "ftyp", 4) != 0) return NULL;
  size_t box = (size_t)p[0] << 24 | (size_t)p[1] << 16 | (size_t)p[2] << 8 | p[3];
  if (box < 16 || box > n || box > 4096) return NULL;
  static const char *const heic[] = {"heic", "heix", "heim", "heis", "hevc", "hevx", "hevm", "hevs"},
                           *const avif[] = {"avif", "avis"}, *const any[] = {"mif1", "msf1"};
  bool is_heic = false, is_avif = false, is_heif = false;
  /* the major brand at 8, the minor version at 12, compatible brands from 16 */
  for (size_t off = 8; off + 4 <= box; off += off == 8 ? 8 : 4) {
    const uint8_t *b = p + off;
    for (size_t i = 0; i < sizeof heic / sizeof *heic; i++) is_heic |= !memcmp(b, heic[i], 4);
    for (size_t i = 0; i < sizeof avif / sizeof *avif; i++) is_avif |= !memcmp(b, avif[i], 4);
    for (size_t i = 0; i < sizeof any / sizeof *any; i++) is_heif |= !memcmp(b, any[i], 4);
  }
  if (is_avif && (!is_heic || !memcmp(p + 8, "avi", 3))) return "AVIF";
  if (is_heic) return "HEIC";
  return is_heif ? "HEIF" : NULL;
}

#ifdef HEARTH_HAVE_HEIF
/* AV1 through libaom where libheif has it: libheif 1.15's libdav1d path leaks the data it hands over when
 * dav1d refuses it (an empty item), so that a damaged AVIF would cost memory each time. (AV1 decoding is
 * exact: both give the same pixels.) NULL: libheif's own choice. */
static const char *av1_decoder(void) {
  static int have_aom = -1;
  int v = __atomic_load_n(&have_aom, __ATOMIC_ACQUIRE);
  if (v < 0) {
    const struct heif_decoder_descriptor *d[16];
    int k = heif_get_decoder_descriptors(heif_compression_AV1, d, 16);
    v = 0;
    for (int i = 0; i < k; i++)
      if (!strcmp(heif_decoder_descriptor_get_id_name(d[i]), "aom")) v = 1;
    __atomic_store_n(&have_aom, v, __ATOMIC_RELEASE);
  }
  return v ? "aom" : NULL;
}

static int decode_heif(const uint8_t *data, size_t n, const char *fmt, const media_limits *l, media *out, herr *err) {
  struct heif_context *ctx = heif_context_alloc();
  if (!ctx) return herr_set(err, HEARTH_ENOMEM, "out of memory decoding a %s image", fmt);
  struct heif_image_handle *h = NULL;
  struct heif_image *img = NULL;
  int rc = 0;
  /* libheif refuses larger images itself before it decodes them (and the checks below say why) */
  heif_context_set_maximum_image_size_limit(ctx, l->max_side);
  struct heif_error e = heif_context_read_from_memory_without_copy(ctx, data, n, NULL);
  if (e.code == heif_error_Ok) e = heif_context_get_primary_image_handle(ctx, &h);
  if (e.code != heif_error_Ok) {
    rc = herr_set(err, HEARTH_EINVAL, "bad %s data: %s", fmt, e.message ? e.message : "?");
    goto done;
  }
  /* the size as shown: after the image's own rotation and crop */
  if ((rc = check_size(heif_image_handle_get_width(h), heif_image_handle_get_height(h), l, fmt, err))) goto done;
  /* RGB without alpha: an alpha plane is dropped, not composited, as PIL's convert("RGB") drops it */
  struct heif_decoding_options *opt = heif_decoding_options_alloc();
  if (!opt) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory decoding a %s image", fmt);
    goto done;
  }
  /* whatever the brands say, the image may be AV1: libaom first, then (not AV1) libheif's choice */
  opt->decoder_id = av1_decoder();
  e = heif_decode_image(h, &img, heif_colorspace_RGB, heif_chroma_interleaved_RGB, opt);
  if (e.code == heif_error_Unsupported_feature && opt->decoder_id) {
    opt->decoder_id = NULL;
    e = heif_decode_image(h, &img, heif_colorspace_RGB, heif_chroma_interleaved_RGB, opt);
  }
  heif_decoding_options_free(opt);
  if (e.code != heif_error_Ok) {
    rc = herr_set(err, HEARTH_EINVAL, "bad %s data: %s", fmt, e.message ? e.message : "?");
    goto done;
  }
  int w = heif_image_get_width(img, heif_channel_interleaved), hh = heif_image_get_height(img, heif_channel_interleaved);
  if ((rc = check_size(w, hh, l, fmt, err))) goto done;
  int stride = 0;
  const uint8_t *px = heif_image_get_plane_readonly(img, heif_channel_interleaved, &stride);
  if (!px || heif_image_get_bits_per_pixel_range(img, heif_channel_interleaved) != 8 || stride < w * 3) {
    rc = herr_set(err, HEARTH_EINVAL, "bad %s data: no 8-bit RGB plane after decoding", fmt);
    goto done;
  }
  if ((rc = alloc_rgb(out, w, hh, err))) goto done;
  for (int y = 0; y < hh; y++) memcpy(out->image.rgb + (size_t)y * w * 3, px + (size_t)y * stride, (size_t)w * 3);
done:
  heif_image_release(img);
  heif_image_handle_release(h);
  heif_context_free(ctx);
  return rc;
}
#else
static int decode_heif(const uint8_t *data, size_t n, const char *fmt, const media_limits *l, media *out, herr *err) {
  (void)data, (void)n, (void)l, (void)out;
  return herr_set(err, HEARTH_EUNSUPPORTED, "this hearth was built without libheif: no %s images", fmt);
}
#endif

int media_decode_image(const void *data, size_t n, const media_limits *lim, media *out, herr *err) {
  memset(out, 0, sizeof *out);
  media_limits l = limits_of(lim);
  const uint8_t *p = data;
  if (n > l.max_bytes)
    return herr_set(err, HEARTH_EINVAL, "image of %zu bytes is larger than the limit (%zu)", n, l.max_bytes);
  int rc;
  if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) rc = decode_jpeg(p, n, &l, out, err);
  else if (n >= 8 && memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0) rc = decode_png(p, n, &l, out, err);
  else if (n >= 12 && memcmp(p, "RIFF", 4) == 0 && memcmp(p + 8, "WEBP", 4) == 0) rc = decode_webp(p, n, &l, out, err);
  else if (n >= 6 && (memcmp(p, "GIF87a", 6) == 0 || memcmp(p, "GIF89a", 6) == 0)) rc = decode_gif(p, n, &l, out, err);
  else if (heif_format(p, n)) rc = decode_heif(p, n, heif_format(p, n), &l, out, err);
  else return herr_set(err, HEARTH_EINVAL, "not an image hearth reads (JPEG, PNG, WebP, GIF, HEIC, AVIF)");
  if (rc) {
    media_free(out);
    return rc;
  }
  out->hash = media_hash(out);
  return 0;
}
