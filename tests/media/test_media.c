/* test_media.c — the media decoders: images as PIL decodes them (PNG and
 * lossless WebP exactly the source pixels, JPEG and GIF exactly PIL's decode,
 * from tests/fixtures/mm/gemma4_vision-f32 made by tools/gen_mm_golden.py),
 * limits refused before decoding, damaged data refused with a message; sources
 * (data URLs in base64 and percent-encoding, bare base64, files only when
 * allowed, http(s) only when allowed; remote fetches reach no loopback or
 * private address without allow_private_hosts — a listener on 127.0.0.1
 * counts the connections it gets —, redirects are checked hop by hop, and
 * every failure reads the same; the address rule over IPv4 and IPv6 ranges
 * and mapped forms); sound through FFmpeg (a WAV made here:
 * 16 kHz mono samples exact, 44.1 kHz stereo resampled to 16 kHz mono); video
 * through FFmpeg (the animated GIF: its frames, times and sampling rate;
 * the frame indices transformers' Qwen3-VL sample_frames picks, worked out
 * by hand for clips short and long, capped and odd, and the same frames
 * decoded from animated GIFs made here);
 * content hashes; HEIC and AVIF through libheif (lossy: exact sizes, pixels
 * within a PSNR / mean error bound of the PNG they were made from — made here
 * by heif-enc when it is installed, one with an alpha channel too, which is
 * dropped and not composited, and one turned a quarter by its own irot box
 * (encoded here through libheif), which decodes turned; and always the fuzz
 * seeds img.heic / img.avif,
 * made from img_a.png by `heif-enc -q 90 -p chroma=444 -o img.heic img.png`
 * and `heif-enc -A -q 90 -p chroma=444 -o img.avif img.png`: full chroma, as the
 * image is noise that 4:2:0 would blur). */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gif_lib.h>
#include <png.h>
#include <sys/socket.h>
#include <unistd.h>
#ifdef HEARTH_HAVE_HEIF
#include <libheif/heif.h>
#endif

#include "media/media.h"
#include "base/file.h"
#include "test.h"

#define FX HEARTH_SOURCE_DIR "/tests/fixtures/mm/gemma4_vision-f32"

static uint8_t *read_path(const char *path, size_t *n) {
  char *buf = NULL;
  herr err = {0};
  return hfile_read(path, &buf, n, &err) ? NULL : (uint8_t *)buf;
}

static uint8_t *read_all(const char *name, size_t *n) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", FX, name);
  uint8_t *buf = read_path(path, n);
  CHECK_MSG(buf != NULL, "%s: missing", path);
  return buf;
}

/* file decodes to exactly the pixels of rgb_file (w x h). */
static void check_image(const char *file, const char *rgb_file, int w, int h) {
  size_t n = 0, nr = 0;
  uint8_t *data = read_all(file, &n), *ref = read_all(rgb_file, &nr);
  if (!data || !ref) {
    free(data), free(ref);
    return;
  }
  media m;
  herr err = {0};
  int rc = media_decode_image(data, n, NULL, &m, &err);
  CHECK_MSG(rc == 0, "%s: %s", file, err.msg);
  if (!rc) {
    CHECK_EQ_INT(m.kind, MEDIA_IMAGE);
    CHECK_EQ_INT(m.image.w, w);
    CHECK_EQ_INT(m.image.h, h);
    CHECK(m.hash != 0);
    int64_t bad = 0;
    for (size_t i = 0; i < nr && i < (size_t)w * h * 3; i++) bad += m.image.rgb[i] != ref[i];
    CHECK_MSG(nr == (size_t)w * h * 3 && bad == 0, "%s: %lld of %zu values differ from %s", file, (long long)bad, nr, rgb_file);
    fprintf(stderr, "  %-12s %dx%d, exact\n", file, w, h);
    media_free(&m);
  }
  free(data), free(ref);
}

static void test_images(void) {
  check_image("img_a.png", "img_a.rgb", 40, 30);
  check_image("img_b.png", "img_b.rgb", 200, 90);
  check_image("img_a.jpg", "img_a_jpg.rgb", 40, 30);
  check_image("img_a.webp", "img_a.rgb", 40, 30);
  check_image("img_a.gif", "img_a_gif.rgb", 40, 30);
}

static void test_bad_images(void) {
  size_t n = 0;
  uint8_t *png = read_all("img_a.png", &n), *jpg = NULL;
  size_t nj = 0;
  jpg = read_all("img_a.jpg", &nj);
  if (!png || !jpg) {
    free(png), free(jpg);
    return;
  }
  media m;
  herr err = {0};
  /* limits: refused before decoding */
  media_limits lim = {.max_pixels = 1000};
  CHECK(media_decode_image(png, n, &lim, &m, &err) == HEARTH_EINVAL);
  CHECK_MSG(strstr(err.msg, "40 x 30") && strstr(err.msg, "limit"), "%s", err.msg);
  lim = (media_limits){.max_bytes = 100};
  CHECK(media_decode_image(png, n, &lim, &m, &err) == HEARTH_EINVAL);
  CHECK_MSG(strstr(err.msg, "bytes"), "%s", err.msg);
  /* every truncation of both: an error or (JPEG decoders pad a short stream) an image of the right size */
  for (size_t k = 0; k < n; k += 7) {
    herr_clear(&err);
    int rc = media_decode_image(png, k, NULL, &m, &err);
    /* (cut inside the closing IEND chunk, every pixel is there) */
    CHECK_MSG((rc == HEARTH_EINVAL && err.msg[0]) || (rc == 0 && k >= n - 12), "PNG cut at %zu: rc %d", k, rc);
    if (!rc) media_free(&m);
  }
  for (size_t k = 0; k < nj; k += 5) {
    herr_clear(&err);
    int rc = media_decode_image(jpg, k, NULL, &m, &err);
    CHECK_MSG(rc == HEARTH_EINVAL || (rc == 0 && m.image.w == 40 && m.image.h == 30), "JPEG cut at %zu: rc %d", k, rc);
    if (!rc) media_free(&m);
  }
  /* flipped bytes: never a crash */
  for (size_t k = 8; k < n; k += 13) {
    uint8_t *c = malloc(n);
    memcpy(c, png, n);
    c[k] ^= 0x5a;
    if (!media_decode_image(c, n, NULL, &m, &err)) media_free(&m);
    free(c);
  }
  CHECK(media_decode_image("GIF89a", 6, NULL, &m, &err) == HEARTH_EINVAL);
  CHECK(media_decode_image("hello, world", 12, NULL, &m, &err) == HEARTH_EINVAL);
  CHECK_MSG(strstr(err.msg, "JPEG, PNG, WebP, GIF, HEIC, AVIF"), "%s", err.msg);
  /* an ISO base media file that is no HEIF image (an MP4's ftyp) is not taken for one */
  static const uint8_t mp4[24] = {0, 0, 0, 24, 'f', 't', 'y', 'p', 'i', 's', 'o', 'm', 0, 0, 2, 0, 'i', 's', 'o', 'm', 'm', 'p', '4', '1'};
  CHECK(media_decode_image(mp4, sizeof mp4, NULL, &m, &err) == HEARTH_EINVAL);
  CHECK_MSG(strstr(err.msg, "not an image"), "%s", err.msg);
  free(png), free(jpg);
}


/* A lossy file decodes to ref's size and close to its pixels: PSNR >= 30 dB, mean error <= 4 levels. */
static void check_lossy(const char *what, const uint8_t *data, size_t n, const uint8_t *ref, int w, int h) {
  media m;
  herr err = {0};
  int rc = media_decode_image(data, n, NULL, &m, &err);
  if (rc == HEARTH_EUNSUPPORTED) { /* built without libheif: says so */
    CHECK_MSG(strstr(err.msg, "libheif"), "%s: %s", what, err.msg);
    fprintf(stderr, "  %-12s skipped: %s\n", what, err.msg);
    return;
  }
  CHECK_MSG(rc == 0, "%s: %s", what, err.msg);
  if (rc) return;
  CHECK_EQ_INT(m.kind, MEDIA_IMAGE);
  CHECK_EQ_INT(m.image.w, w);
  CHECK_EQ_INT(m.image.h, h);
  CHECK(m.hash == media_hash(&m));
  if (m.image.w == w && m.image.h == h) {
    double se = 0, ae = 0;
    size_t k = (size_t)w * h * 3;
    for (size_t i = 0; i < k; i++) {
      double d = (double)m.image.rgb[i] - ref[i];
      se += d * d, ae += fabs(d);
    }
    double psnr = se > 0 ? 10 * log10(255.0 * 255.0 / (se / k)) : 99;
    fprintf(stderr, "  %-12s %dx%d, PSNR %.1f dB, mean error %.2f\n", what, w, h, psnr, ae / k);
    CHECK_MSG(psnr >= 30 && ae / k <= 4, "%s: PSNR %.1f dB, mean error %.2f", what, psnr, ae / k);
  }
  media_free(&m);
}

/* An RGBA PNG of ref's pixels with a ramp of alpha (0 at the left to 255 at the right). */
static bool write_rgba_png(const char *path, const uint8_t *ref, int w, int h) {
  uint8_t *rgba = malloc((size_t)w * h * 4);
  for (int i = 0; i < w * h; i++) {
    memcpy(rgba + i * 4, ref + i * 3, 3);
    rgba[i * 4 + 3] = (uint8_t)((i % w) * 255 / (w - 1));
  }
  png_image im = {.version = PNG_IMAGE_VERSION, .width = (png_uint_32)w, .height = (png_uint_32)h, .format = PNG_FORMAT_RGBA};
  bool ok = png_image_write_to_file(&im, path, 0, rgba, 0, NULL) != 0;
  free(rgba);
  return ok;
}

#ifdef HEARTH_HAVE_HEIF
/* x265 keeps a block from its first encoder open to the end of the process (x265_cleanup frees it, which
 * libheif calls only from heif_deinit, and that unloads the decoders too): not a leak of hearth's, and only
 * the test encodes. LeakSanitizer reads this where the sanitizer build runs the test. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libx265.so\n"; }

/* ref (w x h) encoded as compression says (HEVC or AV1), marked to be shown turned 90 degrees clockwise
 * (an irot box), written to path. */
static bool write_turned_heif(const char *path, const uint8_t *ref, int w, int h, enum heif_compression_format compression) {
  struct heif_context *ctx = heif_context_alloc();
  struct heif_encoder *enc = NULL;
  struct heif_image *img = NULL;
  struct heif_encoding_options *opt = heif_encoding_options_alloc();
  bool ok = heif_image_create(w, h, heif_colorspace_RGB, heif_chroma_interleaved_RGB, &img).code == heif_error_Ok &&
            heif_image_add_plane(img, heif_channel_interleaved, w, h, 8).code == heif_error_Ok;
  int stride = 0;
  uint8_t *px = ok ? heif_image_get_plane(img, heif_channel_interleaved, &stride) : NULL;
  for (int y = 0; px && y < h; y++) memcpy(px + (size_t)y * stride, ref + (size_t)y * w * 3, (size_t)w * 3);
  ok = ok && px && heif_context_get_encoder_for_format(ctx, compression, &enc).code == heif_error_Ok &&
       heif_encoder_set_lossy_quality(enc, 90).code == heif_error_Ok;
  if (ok) heif_encoder_set_parameter(enc, "chroma", "444");
  opt->image_orientation = heif_orientation_rotate_90_cw;
  ok = ok && heif_context_encode_image(ctx, img, enc, opt, NULL).code == heif_error_Ok &&
       heif_context_write_to_file(ctx, path).code == heif_error_Ok;
  heif_encoding_options_free(opt);
  if (enc) heif_encoder_release(enc);
  heif_image_release(img);
  heif_context_free(ctx);
  return ok;
}

/* The image file at path shows ref (w x h) turned a quarter clockwise: h x w, row r col c = ref's row h-1-c col r. */
static void check_turned(const char *what, const char *path, const uint8_t *ref, int w, int h) {
  uint8_t *turned = malloc((size_t)w * h * 3);
  for (int r = 0; r < w; r++)
    for (int c = 0; c < h; c++) memcpy(turned + ((size_t)r * h + c) * 3, ref + ((size_t)(h - 1 - c) * w + r) * 3, 3);
  size_t n = 0;
  uint8_t *d = read_path(path, &n);
  CHECK_MSG(d != NULL, "%s: not written", path);
  if (d) check_lossy(what, d, n, turned, h, w);
  free(d), free(turned);
}
#endif

static void test_heif(void) {
  size_t nr = 0;
  uint8_t *ref = read_all("img_a.rgb", &nr);
  if (!ref || nr != 40 * 30 * 3) {
    free(ref);
    return;
  }
  /* the committed seeds */
  static const char *const seeds[] = {"img.heic", "img.avif"};
  for (int i = 0; i < 2; i++) {
    char path[600];
    snprintf(path, sizeof path, "%s/tests/fuzz/seeds/media_image/%s", HEARTH_SOURCE_DIR, seeds[i]);
    size_t n = 0;
    uint8_t *d = read_path(path, &n);
    CHECK_MSG(d != NULL, "%s: missing", path);
    if (d) check_lossy(seeds[i], d, n, ref, 40, 30);
    /* damaged: cut short, or a byte flipped here and there, never a crash; the message names the format */
    media m;
    herr err = {0};
    for (size_t k = 16; d && k < n; k += n / 23 + 1) {
      herr_clear(&err);
      int rc = media_decode_image(d, k, NULL, &m, &err);
      if (rc == HEARTH_EUNSUPPORTED) break;
      CHECK_MSG(rc == HEARTH_EINVAL && strstr(err.msg, i ? "AVIF" : "HEIC"), "%s cut at %zu: rc %d, %s", seeds[i], k, rc, err.msg);
      if (!rc) media_free(&m);
    }
    for (size_t k = 32; d && k < n; k += 37) {
      uint8_t *c = malloc(n);
      memcpy(c, d, n);
      c[k] ^= 0x5a;
      if (!media_decode_image(c, n, NULL, &m, &err)) media_free(&m);
      free(c);
    }
    /* the limits hold before decoding */
    media_limits lim = {.max_pixels = 1000};
    int rc = d ? media_decode_image(d, n, &lim, &m, &err) : HEARTH_EINVAL;
    CHECK_MSG(rc == HEARTH_EINVAL || rc == HEARTH_EUNSUPPORTED, "%s: rc %d", seeds[i], rc);
    if (rc == HEARTH_EINVAL) CHECK_MSG(strstr(err.msg, "40 x 30") && strstr(err.msg, "limit"), "%s", err.msg);
    free(d);
  }
  char dir[] = "/tmp/hearth_heif_XXXXXX";
  if (!mkdtemp(dir)) {
    CHECK_MSG(0, "mkdtemp failed");
    free(ref);
    return;
  }
#ifdef HEARTH_HAVE_HEIF
  /* the image's own transform (irot), applied as libheif applies it by default */
  static const struct { const char *name; enum heif_compression_format c; } turned[] = {
      {"turned.heic", heif_compression_HEVC}, {"turned.avif", heif_compression_AV1}};
  for (int i = 0; i < 2; i++) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, turned[i].name);
    CHECK_MSG(write_turned_heif(path, ref, 40, 30, turned[i].c), "%s: libheif could not encode it", turned[i].name);
    check_turned(turned[i].name, path, ref, 40, 30);
    unlink(path);
  }
#endif
  /* made here from the PNG, when heif-enc is installed (tools/setup.sh --test) */
  if (system("command -v heif-enc >/dev/null 2>&1") != 0) {
    fprintf(stderr, "  heif-enc not installed: only the committed HEIC / AVIF samples\n");
    rmdir(dir);
    free(ref);
    return;
  }
  char png_rgba[700];
  snprintf(png_rgba, sizeof png_rgba, "%s/rgba.png", dir);
  CHECK(write_rgba_png(png_rgba, ref, 40, 30));
  static const struct { const char *src, *name, *flags; } made[] = {
      {FX "/img_a.png", "a.heic", ""}, {FX "/img_a.png", "a.avif", "-A"},
      {NULL, "rgba.heic", ""}, {NULL, "rgba.avif", "-A"}};
  for (int i = 0; i < 4; i++) {
    char out[700], cmd[2200];
    snprintf(out, sizeof out, "%s/%s", dir, made[i].name);
    snprintf(cmd, sizeof cmd, "heif-enc %s -q 90 -p chroma=444 -o '%s' '%s' >/dev/null 2>&1", made[i].flags, out,
             made[i].src ? made[i].src : png_rgba);
    if (system(cmd) != 0) {
      CHECK_MSG(0, "%s failed", cmd);
      continue;
    }
    size_t n = 0;
    uint8_t *d = read_path(out, &n);
    CHECK_MSG(d && n > 16 && !memcmp(d + 4, "ftyp", 4), "%s: not an ISO base media file", out);
    /* with alpha: the colour as it is, as for PNG (composited on black or white, the left would be far off) */
    if (d) check_lossy(made[i].name, d, n, ref, 40, 30);
    free(d);
    unlink(out);
  }
  unlink(png_rgba);
  rmdir(dir);
  free(ref);
}

static char *b64(const uint8_t *d, size_t n) {
  static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  char *o = malloc(n / 3 * 4 + 8), *p = o;
  size_t i = 0;
  for (; i + 2 < n; i += 3) {
    uint32_t v = (uint32_t)d[i] << 16 | (uint32_t)d[i + 1] << 8 | d[i + 2];
    *p++ = t[v >> 18], *p++ = t[(v >> 12) & 63], *p++ = t[(v >> 6) & 63], *p++ = t[v & 63];
  }
  if (i < n) {
    uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0);
    *p++ = t[v >> 18], *p++ = t[(v >> 12) & 63];
    *p++ = i + 1 < n ? t[(v >> 6) & 63] : '=';
    *p++ = '=';
  }
  *p = 0;
  return o;
}

static void test_sources(void) {
  size_t n = 0;
  uint8_t *png = read_all("img_a.png", &n);
  if (!png) return;
  char *enc = b64(png, n);
  char *url = malloc(strlen(enc) + 64);
  sprintf(url, "data:image/png;base64,%s", enc);
  media_source_opts o = {0};
  uint8_t *got = NULL;
  size_t gn = 0;
  herr err = {0};
  CHECK_MSG(media_fetch(url, &o, &got, &gn, &err) == 0, "%s", err.msg);
  CHECK(gn == n && got && !memcmp(got, png, n));
  free(got);
  /* bare base64 only when asked */
  CHECK(media_fetch(enc, &o, &got, &gn, &err) == HEARTH_EINVAL);
  o.bare_base64 = true;
  CHECK_MSG(media_fetch(enc, &o, &got, &gn, &err) == 0 && gn == n, "%s", err.msg);
  free(got);
  /* percent-encoded data URL */
  CHECK(media_fetch("data:text/plain,a%20b%zz", &o, &got, &gn, &err) == 0 && gn == 6 && !memcmp(got, "a b%zz", 6));
  free(got);
  CHECK(media_fetch("data:image/png;base64,@@@@", &o, &got, &gn, &err) == HEARTH_EINVAL);
  CHECK(media_fetch("data:image/png;base64", &o, &got, &gn, &err) == HEARTH_EINVAL);
  /* the byte limit */
  media_limits lim = {.max_bytes = 100};
  o.lim = &lim;
  CHECK(media_fetch(url, &o, &got, &gn, &err) == HEARTH_EINVAL);
  CHECK_MSG(strstr(err.msg, "limit"), "%s", err.msg);
  o.lim = NULL;
  /* files and remote URLs only when allowed */
  char path[600];
  snprintf(path, sizeof path, "%s/img_a.png", FX);
  CHECK(media_fetch(path, &o, &got, &gn, &err) == HEARTH_EINVAL);
  CHECK(media_fetch("https://example.com/a.png", &o, &got, &gn, &err) == HEARTH_EINVAL);
  CHECK_MSG(strstr(err.msg, "--allow-remote-media"), "%s", err.msg);
  o.allow_files = true;
  CHECK_MSG(media_fetch(path, &o, &got, &gn, &err) == 0 && gn == n, "%s", err.msg);
  free(got);
  char furl[640];
  snprintf(furl, sizeof furl, "file://%s", path);
  media m;
  CHECK_MSG(media_load(MEDIA_IMAGE, furl, &o, NULL, &m, &err) == 0 && m.image.w == 40, "%s", err.msg);
  media m2;
  CHECK(media_load(MEDIA_IMAGE, url, &o, NULL, &m2, &err) == 0);
  CHECK(m.hash == m2.hash); /* the same pixels */
  media_free(&m2);
  snprintf(furl, sizeof furl, "%s/img_a.jpg", FX);
  CHECK(media_load(MEDIA_IMAGE, furl, &o, NULL, &m2, &err) == 0);
  CHECK(m.hash != m2.hash); /* other pixels, same size */
  media_free(&m2);
  media_free(&m);
  CHECK(media_fetch(FX "/no-such-file.png", &o, &got, &gn, &err) == HEARTH_EINVAL);
  free(url), free(enc), free(png);
}

/* ---- remote fetches ---- */

static void addr_case(const char *text, bool want) {
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  if (strchr(text, ':')) {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
    a->sin6_family = AF_INET6;
    CHECK_MSG(inet_pton(AF_INET6, text, &a->sin6_addr) == 1, "%s", text);
  } else {
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    a->sin_family = AF_INET;
    CHECK_MSG(inet_pton(AF_INET, text, &a->sin_addr) == 1, "%s", text);
  }
  CHECK_MSG(media_addr_public((struct sockaddr *)&ss) == want, "%s should be %s", text, want ? "public" : "refused");
}

static void test_addr_rule(void) {
  static const char *refused[] = {
      "0.0.0.0", "0.1.2.3", "10.0.0.1", "10.255.255.255", "100.64.0.1", "100.127.255.254", "127.0.0.1", "127.1.2.3",
      "169.254.169.254", "169.254.0.1", "172.16.0.1", "172.31.255.255", "192.0.0.8", "192.168.0.1", "192.168.255.255",
      "198.18.0.1", "198.19.255.255", "224.0.0.1", "239.255.255.250", "240.0.0.1", "255.255.255.255",
      "::", "::1", "::ffff:127.0.0.1", "::ffff:10.1.2.3", "::ffff:169.254.169.254", "::ffff:192.168.1.1", "::127.0.0.1",
      "::10.0.0.1", "::ffff:0:127.0.0.1", "64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", "2002:7f00:1::", "2002:c0a8:101::1",
      "fe80::1", "febf::1", "fec0::1", "fc00::1", "fd12:3456::1", "ff02::1", "ff0e::1", "100::1",
  };
  static const char *public_ok[] = {
      "1.1.1.1", "8.8.8.8", "9.255.255.255", "11.0.0.1", "100.63.255.255", "100.128.0.1", "126.255.255.255",
      "128.0.0.1", "169.253.255.255", "169.255.0.1", "172.15.255.255", "172.32.0.1", "192.0.1.1", "192.167.255.255",
      "192.169.0.1", "198.17.255.255", "198.20.0.1", "223.255.255.255",
      "2001:4860:4860::8888", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1", "fbff::1",
      "fe7f::1",
  };
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) addr_case(refused[i], false);
  for (size_t i = 0; i < sizeof public_ok / sizeof public_ok[0]; i++) addr_case(public_ok[i], true);
  struct sockaddr un = {.sa_family = AF_UNIX};
  CHECK(!media_addr_public(&un));
  CHECK(!media_addr_public(NULL));
}

/* A one-connection-at-a-time HTTP listener on 127.0.0.1 that counts the
 * connections it accepts and answers each with 200 "hello", a 404, or a
 * redirect to `location`. */
typedef struct listener {
  int fd, port;
  atomic_int hits;
  int status; /* 200, 404 or 302 */
  char location[256];
  atomic_bool stop;
  pthread_t thread;
} listener;

static void *listen_main(void *arg) {
  listener *l = arg;
  while (!atomic_load(&l->stop)) {
    struct pollfd p = {.fd = l->fd, .events = POLLIN};
    if (poll(&p, 1, 50) <= 0) continue;
    int c = accept(l->fd, NULL, NULL);
    if (c < 0) continue;
    atomic_fetch_add(&l->hits, 1);
    struct timeval tv = {5, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char req[4096];
    size_t got = 0;
    ssize_t k;
    while (got < sizeof req - 1 && (k = recv(c, req + got, sizeof req - 1 - got, 0)) > 0) {
      got += (size_t)k;
      req[got] = 0;
      if (strstr(req, "\r\n\r\n")) break;
    }
    char resp[600];
    if (l->status == 302)
      snprintf(resp, sizeof resp, "HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
               l->location);
    else if (l->status == 404)
      snprintf(resp, sizeof resp, "HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\nConnection: close\r\n\r\nnope");
    else
      snprintf(resp, sizeof resp, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello");
    send(c, resp, strlen(resp), MSG_NOSIGNAL);
    close(c);
  }
  return NULL;
}

static void listener_start(listener *l, int status) {
  memset(l, 0, sizeof *l);
  l->status = status;
  l->fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  socklen_t al = sizeof a;
  CHECK(bind(l->fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(l->fd, 16) == 0);
  getsockname(l->fd, (struct sockaddr *)&a, &al);
  l->port = ntohs(a.sin_port);
  pthread_create(&l->thread, NULL, listen_main, l);
}

static void listener_stop(listener *l) {
  atomic_store(&l->stop, true);
  pthread_join(l->thread, NULL);
  close(l->fd);
}

/* Lets a fetch reach one port only (the addr_ok rule an embedder may set). */
static bool only_port(const struct sockaddr *sa, void *ctx) {
  int port = *(int *)ctx;
  return sa->sa_family == AF_INET && ntohs(((const struct sockaddr_in *)sa)->sin_port) == port;
}

static void test_remote_fetch(void) {
  listener a, b;
  listener_start(&a, 200);
  listener_start(&b, 200);
  media_source_opts o = {.allow_remote = true};
  herr err = {0};
  uint8_t *got = NULL;
  size_t gn = 0;
  char url[300];
  /* without allow_private_hosts, loopback in every spelling is never reached */
  const char *hosts[] = {"127.0.0.1", "localhost", "127.9.9.9", "[::1]", "[::ffff:127.0.0.1]", "0.0.0.0", "[::]", "2130706433"};
  for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++) {
    snprintf(url, sizeof url, "http://%s:%d/img.png", hosts[i], a.port);
    CHECK_MSG(media_fetch(url, &o, &got, &gn, &err) == HEARTH_EINVAL && !got, "%s was fetched", url);
    CHECK_MSG(strstr(err.msg, "cannot fetch"), "%s: %s", url, err.msg);
  }
  CHECK(media_fetch("http://169.254.169.254/latest/meta-data/", &o, &got, &gn, &err) == HEARTH_EINVAL);
  CHECK(media_fetch("http://10.0.0.1:9/", &o, &got, &gn, &err) == HEARTH_EINVAL);
  CHECK_EQ_INT(atomic_load(&a.hits), 0);
  /* with it, the listener answers */
  o.allow_private_hosts = true;
  snprintf(url, sizeof url, "http://127.0.0.1:%d/img.png", a.port);
  CHECK_MSG(media_fetch(url, &o, &got, &gn, &err) == 0 && gn == 5 && !memcmp(got, "hello", 5), "%s", err.msg);
  free(got), got = NULL;
  snprintf(url, sizeof url, "http://localhost:%d/img.png", a.port);
  CHECK_MSG(media_fetch(url, &o, &got, &gn, &err) == 0 && gn == 5, "%s", err.msg);
  free(got), got = NULL;
  CHECK_EQ_INT(atomic_load(&a.hits), 2);
  /* a redirect is checked again: a reaches b (another port) only where b is allowed */
  listener r;
  listener_start(&r, 302);
  snprintf(r.location, sizeof r.location, "http://localhost:%d/next.png", b.port);
  snprintf(url, sizeof url, "http://127.0.0.1:%d/img.png", r.port);
  o.addr_ok = only_port;
  o.addr_ok_ctx = &r.port;
  CHECK(media_fetch(url, &o, &got, &gn, &err) == HEARTH_EINVAL && !got);
  CHECK_EQ_INT(atomic_load(&r.hits), 1);
  CHECK_EQ_INT(atomic_load(&b.hits), 0);
  o.addr_ok = NULL;
  CHECK_MSG(media_fetch(url, &o, &got, &gn, &err) == 0 && gn == 5, "%s", err.msg);
  free(got), got = NULL;
  CHECK_EQ_INT(atomic_load(&b.hits), 1);
  /* only http(s), at any hop */
  const char *bad[] = {"file:///etc/passwd", "ftp://127.0.0.1/x", "gopher://127.0.0.1:70/x", "dict://127.0.0.1:11211/stat"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(r.location, sizeof r.location, "%s", bad[i]);
    CHECK_MSG(media_fetch(url, &o, &got, &gn, &err) == HEARTH_EINVAL && !got, "a redirect to %s was followed", bad[i]);
  }
  /* at most 5 redirects: a loop ends after the first request and 5 more */
  snprintf(r.location, sizeof r.location, "http://127.0.0.1:%d/again", r.port);
  int before = atomic_load(&r.hits);
  CHECK(media_fetch(url, &o, &got, &gn, &err) == HEARTH_EINVAL && !got);
  CHECK_EQ_INT(atomic_load(&r.hits) - before, 6);
  listener_stop(&r);
  /* one message whatever the failure: an HTTP error and a closed port read the same */
  listener nf;
  listener_start(&nf, 404);
  snprintf(url, sizeof url, "http://127.0.0.1:%d/img.png", nf.port);
  CHECK(media_fetch(url, &o, &got, &gn, &err) == HEARTH_EINVAL);
  char first[sizeof err.msg];
  snprintf(first, sizeof first, "%s", err.msg);
  listener_stop(&nf);
  CHECK(media_fetch(url, &o, &got, &gn, &err) == HEARTH_EINVAL);
  CHECK_EQ_STR(err.msg, first);
  o.allow_private_hosts = false;
  CHECK(media_fetch(url, &o, &got, &gn, &err) == HEARTH_EINVAL);
  CHECK_EQ_STR(err.msg, first);
  listener_stop(&a);
  listener_stop(&b);
}

/* A WAV file of n 16-bit samples per channel. */
static uint8_t *wav(int rate, int channels, const int16_t *s, int n, size_t *len) {
  size_t data = (size_t)n * channels * 2;
  uint8_t *b = malloc(44 + data);
  uint32_t v;
  uint16_t h;
  memcpy(b, "RIFF", 4), v = (uint32_t)(36 + data), memcpy(b + 4, &v, 4), memcpy(b + 8, "WAVEfmt ", 8);
  v = 16, memcpy(b + 16, &v, 4), h = 1, memcpy(b + 20, &h, 2), h = (uint16_t)channels, memcpy(b + 22, &h, 2);
  v = (uint32_t)rate, memcpy(b + 24, &v, 4), v = (uint32_t)(rate * channels * 2), memcpy(b + 28, &v, 4);
  h = (uint16_t)(channels * 2), memcpy(b + 32, &h, 2), h = 16, memcpy(b + 34, &h, 2);
  memcpy(b + 36, "data", 4), v = (uint32_t)data, memcpy(b + 40, &v, 4);
  memcpy(b + 44, s, data);
  *len = 44 + data;
  return b;
}

static void test_audio(void) {
  enum { N = 8000 };
  int16_t *s = malloc(sizeof(int16_t) * N * 2);
  for (int i = 0; i < N; i++) s[i] = (int16_t)(12000 * sin(i * 0.05) + (i % 7) * 100 - 300);
  size_t len;
  uint8_t *w = wav(16000, 1, s, N, &len);
  media m;
  herr err = {0};
  int rc = media_decode_audio(w, len, NULL, &m, &err);
  if (rc == HEARTH_EUNSUPPORTED) { /* built without FFmpeg: says so */
    CHECK_MSG(strstr(err.msg, "FFmpeg"), "%s", err.msg);
    free(w), free(s);
    return;
  }
  CHECK_MSG(rc == 0, "%s", err.msg);
  CHECK_EQ_INT(m.kind, MEDIA_AUDIO);
  CHECK_EQ_INT(m.audio.n, N);
  double d = 0;
  for (int i = 0; i < N && i < m.audio.n; i++) d = fmax(d, fabs(m.audio.pcm[i] - s[i] / 32768.0));
  CHECK_MSG(d <= 1e-7, "16 kHz mono samples off by %.3g", d);
  media_free(&m);
  free(w);
  /* 44.1 kHz stereo: resampled and mixed down */
  for (int i = 0; i < N; i++) s[2 * i] = (int16_t)(8000 * sin(i * 0.02)), s[2 * i + 1] = s[2 * i];
  w = wav(44100, 2, s, N, &len);
  CHECK_MSG(media_decode_audio(w, len, NULL, &m, &err) == 0, "%s", err.msg);
  int64_t want = (int64_t)N * 16000 / 44100;
  CHECK_MSG(llabs(m.audio.n - want) <= 32, "%lld samples for %lld", (long long)m.audio.n, (long long)want);
  double peak = 0;
  for (int64_t i = 0; i < m.audio.n; i++) peak = fmax(peak, fabs(m.audio.pcm[i]));
  CHECK_MSG(peak > 0.2 && peak < 0.3, "peak %.3g (8000 / 32768 = 0.244: the mean of the channels)", peak);
  media_free(&m);
  /* the duration limit */
  media_limits lim = {.max_seconds = 0.05};
  CHECK(media_decode_audio(w, len, &lim, &m, &err) == HEARTH_EINVAL);
  CHECK_MSG(strstr(err.msg, "longer than"), "%s", err.msg);
  /* damaged */
  CHECK(media_decode_audio(w, 30, NULL, &m, &err) == HEARTH_EINVAL);
  CHECK(media_decode_audio("not audio at all, not at all", 28, NULL, &m, &err) == HEARTH_EINVAL);
  free(w), free(s);
}

static void test_video(void) {
  size_t n = 0;
  uint8_t *gif = read_all("anim.gif", &n);
  if (!gif) return;
  media m;
  herr err = {0};
  media_video_opts vo = {0};
  int rc = media_decode_video(gif, n, NULL, &vo, &m, &err);
  if (rc == HEARTH_EUNSUPPORTED) {
    free(gif);
    return;
  }
  CHECK_MSG(rc == 0, "%s", err.msg);
  CHECK_EQ_INT(m.video.n_frames, 3);
  for (int k = 0; k < m.video.n_frames && k < 3; k++) {
    CHECK_NEAR(m.video.t[k], 0.2 * k, 1e-6);
    CHECK_EQ_INT(m.video.frames[k].w, 40);
    CHECK_EQ_INT(m.video.frames[k].h, 30);
    char name[32];
    snprintf(name, sizeof name, "anim.%d.rgb", k);
    size_t nr = 0;
    uint8_t *ref = read_all(name, &nr);
    int64_t bad = 0;
    for (size_t i = 0; ref && i < nr && i < 40 * 30 * 3; i++) bad += m.video.frames[k].rgb[i] != ref[i];
    CHECK_MSG(ref && bad == 0, "frame %d: %lld values differ from PIL's", k, (long long)bad);
    free(ref);
  }
  media_free(&m);
  /* sampled at 2.5 frames a second: int(3 frames / 5 fps * 2.5) = 1 frame, the first */
  vo.fps = 2.5;
  CHECK_MSG(media_decode_video(gif, n, NULL, &vo, &m, &err) == 0, "%s", err.msg);
  CHECK_EQ_INT(m.video.n_frames, 1);
  CHECK_NEAR(m.video.fps, 5.0, 1e-9);
  CHECK_EQ_INT(m.video.src_frames, 3);
  if (m.video.n_frames == 1) CHECK_EQ_INT(m.video.index[0], 0);
  media_free(&m);
  /* as Qwen3-VL samples it (fps 2, at least 4 frames): all 3 (at most the stream's frames) */
  vo = (media_video_opts){.fps = 2, .min_frames = 4, .max_frames = 768};
  CHECK_MSG(media_decode_video(gif, n, NULL, &vo, &m, &err) == 0, "%s", err.msg);
  CHECK_EQ_INT(m.video.n_frames, 3);
  for (int k = 0; k < m.video.n_frames; k++) CHECK_EQ_INT(m.video.index[k], k);
  media_free(&m);
  vo = (media_video_opts){.max_frames = 2};
  CHECK_MSG(media_decode_video(gif, n, NULL, &vo, &m, &err) == 0, "%s", err.msg);
  CHECK_EQ_INT(m.video.n_frames, 2); /* linspace(0, 2, 2): frames 0 and 2 */
  if (m.video.n_frames == 2) CHECK(m.video.index[0] == 0 && m.video.index[1] == 2 && fabs(m.video.t[1] - 0.4) < 1e-6);
  media_free(&m);
  media_limits lim = {.max_pixels = 100};
  CHECK(media_decode_video(gif, n, &lim, &vo, &m, &err) == HEARTH_EINVAL);
  CHECK(media_decode_video(gif, n / 3, NULL, &vo, &m, &err) != 0 || (media_free(&m), 1));
  free(gif);
}

/* The frame indices transformers' Qwen3VLVideoProcessor.sample_frames picks (fps 2, min_frames 4,
 * max_frames 768), worked out by hand from its code for each (frames, rate):
 *   n = min(max(int(frames / rate * 2), 4), 768, frames); np.linspace(0, frames - 1, n).round()
 * (np.round takes halves to even). */
static void test_sample_indices(void) {
  static const struct {
    int64_t frames;
    double rate;
    int64_t n;
    int64_t idx[20];
  } cases[] = {
      /* 0.6 s: int(3 / 5 * 2) = 1 -> 4 -> at most the 3 frames: linspace(0, 2, 3) */
      {3, 5, 3, {0, 1, 2}},
      /* 1 s: int(2.0) = 2 -> 4: linspace(0, 29, 4) = 0, 9.67, 19.33, 29 */
      {30, 30, 4, {0, 10, 19, 29}},
      /* 1.5 s: int(3.0) = 3 -> 4: 0, 14.67, 29.33, 44 */
      {45, 30, 4, {0, 15, 29, 44}},
      /* 0.42 s: int(0.83) = 0 -> 4: 0, 3, 6, 9 */
      {10, 24, 4, {0, 3, 6, 9}},
      /* 2 frames: 4 -> at most 2 */
      {2, 25, 2, {0, 1}},
      /* 1 frame: linspace(0, 0, 1) */
      {1, 25, 1, {0}},
      /* 1.67 s at 29.97: int(3.34) = 3 -> 4: 0, 16.33, 32.67, 49 */
      {50, 29.97, 4, {0, 16, 33, 49}},
      /* 3 s: int(6.0) = 6: step 14.8 -> 0, 14.8, 29.6, 44.4, 59.2, 74 */
      {75, 25, 6, {0, 15, 30, 44, 59, 74}},
      /* 3.52 s: int(7.04) = 7, an odd count (the processor pads to 8 with the last): step 14.5, halves to even:
       * 14.5 -> 14, 43.5 -> 44, 72.5 -> 72 */
      {88, 25, 7, {0, 14, 29, 44, 58, 72, 87}},
      /* 10 s: int(20.0) = 20: step 299 / 19 = 15.74 */
      {300, 30, 20, {0, 16, 31, 47, 63, 79, 94, 110, 126, 142, 157, 173, 189, 205, 220, 236, 252, 268, 283, 299}},
      /* unknown rate: taken as 24; 1.25 s: int(2.5) = 2 -> 4: 0, 9.67, 19.33, 29 */
      {30, 0, 4, {0, 10, 19, 29}},
  };
  media_video_opts vo = {.fps = 2, .min_frames = 4, .max_frames = 768};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    int64_t n = media_video_sample_count(cases[c].frames, cases[c].rate, &vo);
    CHECK_MSG(n == cases[c].n, "%lld frames at %g fps: %lld sampled, want %lld", (long long)cases[c].frames, cases[c].rate,
              (long long)n, (long long)cases[c].n);
    if (n != cases[c].n) continue;
    int64_t idx[20];
    media_video_sample_indices(cases[c].frames, n, idx);
    for (int64_t i = 0; i < n; i++)
      CHECK_MSG(idx[i] == cases[c].idx[i], "%lld frames at %g fps: index %lld is %lld, want %lld", (long long)cases[c].frames,
                cases[c].rate, (long long)i, (long long)idx[i], (long long)cases[c].idx[i]);
  }
  /* 30 minutes at 30 fps: int(3600) capped at 768; step 53999 / 767 = 70.40 */
  int64_t n = media_video_sample_count(54000, 30, &vo);
  CHECK_EQ_INT(n, 768);
  int64_t *big = malloc(sizeof(int64_t) * 768), sum = 0;
  media_video_sample_indices(54000, 768, big);
  for (int i = 0; i < 768; i++) sum += big[i];
  CHECK(big[0] == 0 && big[1] == 70 && big[2] == 141 && big[3] == 211 && big[5] == 352 && big[765] == 53858 &&
        big[766] == 53929 && big[767] == 53999);
  CHECK_EQ_INT(sum, 20735616);
  free(big);
  /* without a rate to sample at: every frame, at least min_frames (a 3-frame clip repeats one: 0, .67, 1.33, 2) */
  media_video_opts all = {.min_frames = 4};
  CHECK_EQ_INT(media_video_sample_count(3, 5, &all), 4);
  int64_t four[4];
  media_video_sample_indices(3, 4, four);
  CHECK(four[0] == 0 && four[1] == 1 && four[2] == 1 && four[3] == 2);
  CHECK_EQ_INT(media_video_sample_count(1000, 30, &(media_video_opts){0}), 1000);
  CHECK_EQ_INT(media_video_sample_count(1000, 30, &(media_video_opts){.max_frames = 10}), 10);
  CHECK_EQ_INT(media_video_sample_count(0, 30, &vo), 0);
}

/* An animated GIF of n frames of w x h, each `delay` hundredths of a second, frame k all colour k. */
typedef struct gif_out {
  uint8_t *p;
  size_t n, cap;
} gif_out;

static int gif_write_mem(GifFileType *g, const GifByteType *b, int n) {
  gif_out *o = g->UserData;
  if (o->n + (size_t)n > o->cap) {
    o->cap = (o->n + (size_t)n) * 2;
    o->p = realloc(o->p, o->cap);
  }
  memcpy(o->p + o->n, b, (size_t)n);
  o->n += (size_t)n;
  return n;
}

static GifColorType frame_colour(int k) { return (GifColorType){(GifByteType)(k * 3), (GifByteType)(255 - k * 2), (GifByteType)(k * 37)}; }

static uint8_t *make_gif(int n, int w, int h, int delay, size_t *len) {
  gif_out o = {0};
  int e = 0;
  GifFileType *g = EGifOpen(&o, gif_write_mem, &e);
  GifColorType cols[256];
  for (int k = 0; k < 256; k++) cols[k] = frame_colour(k);
  ColorMapObject *cm = GifMakeMapObject(256, cols);
  EGifSetGifVersion(g, true);
  EGifPutScreenDesc(g, w, h, 8, 0, cm);
  GifByteType *row = malloc((size_t)w);
  for (int k = 0; k < n; k++) {
    GifByteType gce[4] = {0, (GifByteType)(delay & 255), (GifByteType)(delay >> 8), 0};
    EGifPutExtension(g, GRAPHICS_EXT_FUNC_CODE, 4, gce);
    EGifPutImageDesc(g, 0, 0, w, h, false, NULL);
    memset(row, k, (size_t)w);
    for (int y = 0; y < h; y++) EGifPutLine(g, row, w);
  }
  EGifCloseFile(g, &e);
  GifFreeMapObject(cm);
  free(row);
  *len = o.n;
  return o.p;
}

/* Short clips decoded as Qwen3-VL samples them: the frames at the indices above, with their times. */
static void test_video_sampling(void) {
  static const struct {
    int frames, delay; /* hundredths of a second per frame */
    int n;
    int64_t idx[8];
  } clips[] = {
      {30, 4, 4, {0, 10, 19, 29}}, /* 1.2 s at 25 fps: int(2.4) = 2 -> 4 */
      {7, 10, 4, {0, 2, 4, 6}},    /* 0.7 s at 10 fps: int(1.4) = 1 -> 4: linspace(0, 6, 4) */
      {3, 20, 3, {0, 1, 2}},       /* 0.6 s at 5 fps: 4 -> at most 3 */
      {88, 4, 7, {0, 14, 29, 44, 58, 72, 87}}, /* 3.52 s at 25 fps: int(7.04) = 7 */
  };
  media_video_opts vo = {.fps = 2, .min_frames = 4, .max_frames = 768};
  for (size_t c = 0; c < sizeof clips / sizeof *clips; c++) {
    size_t len = 0;
    uint8_t *gif = make_gif(clips[c].frames, 8, 6, clips[c].delay, &len);
    media m;
    herr err = {0};
    int rc = media_decode_video(gif, len, NULL, &vo, &m, &err);
    free(gif);
    if (rc == HEARTH_EUNSUPPORTED) return;
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) continue;
    CHECK_EQ_INT(m.video.src_frames, clips[c].frames);
    CHECK_NEAR(m.video.fps, 100.0 / clips[c].delay, 1e-9);
    CHECK_EQ_INT(m.video.n_frames, clips[c].n);
    for (int i = 0; i < m.video.n_frames && i < clips[c].n; i++) {
      int64_t k = clips[c].idx[i];
      CHECK_MSG(m.video.index[i] == k, "clip %zu: frame %d is %lld, want %lld", c, i, (long long)m.video.index[i], (long long)k);
      CHECK_NEAR(m.video.t[i], k * clips[c].delay / 100.0, 1e-6);
      GifColorType want = frame_colour((int)k);
      const uint8_t *px = m.video.frames[i].rgb + (3 * 8 + 5) * 3;
      CHECK_MSG(px[0] == want.Red && px[1] == want.Green && px[2] == want.Blue, "clip %zu: frame %d holds (%d, %d, %d), not frame %lld's colour",
                c, i, px[0], px[1], px[2], (long long)k);
    }
    media_free(&m);
  }
}

int main(void) {
  RUN(test_images);
  RUN(test_bad_images);
  RUN(test_heif);
  RUN(test_sources);
  RUN(test_addr_rule);
  RUN(test_remote_fetch);
  RUN(test_audio);
  RUN(test_video);
  RUN(test_sample_indices);
  RUN(test_video_sampling);
  TEST_MAIN_END();
}
