/* source.c — where media bytes come from: data URLs (base64 or percent-encoded),
 * bare base64, local files, and http(s) URLs through libcurl when allowed. Every
 * path stops at the byte limit. */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "media/media.h"
#include "base/vec.h"

static int b64_val(int c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;
  if (c == '/' || c == '_') return 63;
  return -1;
}

/* Base64 (standard or URL-safe alphabet; padding and whitespace optional) of s[0..n). */
static int b64_decode(const char *s, size_t n, size_t max, uint8_t **out, size_t *len, herr *err) {
  size_t cap = n / 4 * 3 + 3;
  if (n / 4 * 3 > max + 2)
    return herr_set(err, HEARTH_EINVAL, "medium of about %zu bytes is larger than the limit (%zu)", n / 4 * 3, max);
  uint8_t *b = malloc(cap ? cap : 1);
  if (!b) return herr_set(err, HEARTH_ENOMEM, "out of memory decoding base64");
  size_t o = 0;
  uint32_t acc = 0;
  int bits = 0;
  bool pad = false;
  for (size_t i = 0; i < n; i++) {
    int c = (unsigned char)s[i];
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      pad = true;
      continue;
    }
    int v = b64_val(c);
    if (v < 0 || pad) {
      free(b);
      return herr_set(err, HEARTH_EINVAL, "bad base64 data (character %zu)", i);
    }
    acc = acc << 6 | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      b[o++] = (uint8_t)(acc >> bits);
    }
  }
  if (bits >= 6) {
    free(b);
    return herr_set(err, HEARTH_EINVAL, "bad base64 data (truncated)");
  }
  if (o > max) {
    free(b);
    return herr_set(err, HEARTH_EINVAL, "medium of %zu bytes is larger than the limit (%zu)", o, max);
  }
  *out = b;
  *len = o;
  return 0;
}

static int hexv(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static int data_url(const char *url, size_t max, uint8_t **out, size_t *n, herr *err) {
  const char *comma = strchr(url, ',');
  if (!comma) return herr_set(err, HEARTH_EINVAL, "data URL without a comma");
  bool b64 = false;
  for (const char *p = url + 5; p < comma; p++)
    if (*p == ';' && (size_t)(comma - p) >= 7 && strncasecmp(p, ";base64", 7) == 0 && (p + 7 == comma || p[7] == ';'))
      b64 = true;
  const char *d = comma + 1;
  size_t len = strlen(d);
  if (b64) return b64_decode(d, len, max, out, n, err);
  if (len > max) return herr_set(err, HEARTH_EINVAL, "medium of %zu bytes is larger than the limit (%zu)", len, max);
  uint8_t *b = malloc(len ? len : 1);
  if (!b) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  size_t o = 0;
  for (size_t i = 0; i < len; i++) {
    if (d[i] == '%' && i + 2 < len && hexv(d[i + 1]) >= 0 && hexv(d[i + 2]) >= 0) {
      b[o++] = (uint8_t)(hexv(d[i + 1]) * 16 + hexv(d[i + 2]));
      i += 2;
    } else b[o++] = (uint8_t)d[i];
  }
  *out = b;
  *n = o;
  return 0;
}

static int read_file(const char *path, size_t max, uint8_t **out, size_t *n, herr *err) {
  FILE *f = fopen(path, "rb");
  if (!f) return herr_set(err, HEARTH_EINVAL, "cannot open %s", path);
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    fclose(f);
    return herr_set(err, HEARTH_EINVAL, "%s is not a file", path);
  }
  if ((size_t)st.st_size > max) {
    fclose(f);
    return herr_set(err, HEARTH_EINVAL, "%s: %lld bytes is larger than the limit (%zu)", path, (long long)st.st_size, max);
  }
  uint8_t *b = malloc(st.st_size ? (size_t)st.st_size : 1);
  if (!b) {
    fclose(f);
    return herr_set(err, HEARTH_ENOMEM, "out of memory reading %s", path);
  }
  size_t got = fread(b, 1, (size_t)st.st_size, f);
  fclose(f);
  if (got != (size_t)st.st_size) {
    free(b);
    return herr_set(err, HEARTH_EIO, "cannot read %s", path);
  }
  *out = b;
  *n = got;
  return 0;
}

typedef struct fetch_buf {
  uint8_t *p;
  size_t n, cap, max;
  bool over;
} fetch_buf;

static size_t on_body(char *data, size_t sz, size_t nm, void *user) {
  fetch_buf *b = user;
  size_t k = sz * nm;
  if (b->n + k > b->max) {
    b->over = true;
    return 0;
  }
  if (b->n + k > b->cap && !HGROW(b->p, b->cap, b->n + k)) return 0;
  memcpy(b->p + b->n, data, k);
  b->n += k;
  return k;
}

static int http_get(const char *url, size_t max, uint8_t **out, size_t *n, herr *err) {
  static bool inited;
  if (!__atomic_exchange_n(&inited, true, __ATOMIC_ACQ_REL)) curl_global_init(CURL_GLOBAL_DEFAULT);
  CURL *c = curl_easy_init();
  if (!c) return herr_set(err, HEARTH_ENOMEM, "cannot start an HTTP client");
  fetch_buf b = {.max = max};
  char ebuf[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
  curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)max);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, ebuf);
  CURLcode rc = curl_easy_perform(c);
  curl_easy_cleanup(c);
  if (b.over || rc == CURLE_FILESIZE_EXCEEDED) {
    free(b.p);
    return herr_set(err, HEARTH_EINVAL, "%s: larger than the limit (%zu bytes)", url, max);
  }
  if (rc != CURLE_OK) {
    free(b.p);
    return herr_set(err, HEARTH_EINVAL, "cannot fetch %s: %s", url, ebuf[0] ? ebuf : curl_easy_strerror(rc));
  }
  *out = b.p ? b.p : malloc(1);
  *n = b.n;
  return 0;
}

int media_fetch(const char *url, const media_source_opts *o, uint8_t **out, size_t *n, herr *err) {
  media_limits l;
  media_limits_default(&l);
  if (o && o->lim && o->lim->max_bytes) l.max_bytes = o->lim->max_bytes;
  *out = NULL;
  *n = 0;
  if (!url || !*url) return herr_set(err, HEARTH_EINVAL, "empty media URL");
  if (strncasecmp(url, "data:", 5) == 0) return data_url(url, l.max_bytes, out, n, err);
  if (strncasecmp(url, "http://", 7) == 0 || strncasecmp(url, "https://", 8) == 0) {
    if (!o || !o->allow_remote)
      return herr_set(err, HEARTH_EINVAL, "remote media URLs are not allowed (start the server with --allow-remote-media)");
    return http_get(url, l.max_bytes, out, n, err);
  }
  bool file_url = strncasecmp(url, "file://", 7) == 0;
  if (file_url || url[0] == '/' || url[0] == '.') {
    if (!o || !o->allow_files) return herr_set(err, HEARTH_EINVAL, "local media files are not allowed here");
    return read_file(file_url ? url + 7 : url, l.max_bytes, out, n, err);
  }
  struct stat st;
  if (o && o->allow_files && stat(url, &st) == 0) return read_file(url, l.max_bytes, out, n, err); /* a relative path */
  if (o && o->bare_base64) return b64_decode(url, strlen(url), l.max_bytes, out, n, err);
  if (o && o->allow_files) return read_file(url, l.max_bytes, out, n, err);
  return herr_set(err, HEARTH_EINVAL, "not a data URL or an allowed media URL");
}

int media_load(media_kind kind, const char *url, const media_source_opts *o, const media_video_opts *vo, media *out,
               herr *err) {
  memset(out, 0, sizeof *out);
  uint8_t *b = NULL;
  size_t n = 0;
  int rc = media_fetch(url, o, &b, &n, err);
  if (rc) return rc;
  const media_limits *lim = o ? o->lim : NULL;
  switch (kind) {
    case MEDIA_IMAGE: rc = media_decode_image(b, n, lim, out, err); break;
    case MEDIA_AUDIO: rc = media_decode_audio(b, n, lim, out, err); break;
    case MEDIA_VIDEO: rc = media_decode_video(b, n, lim, vo, out, err); break;
  }
  free(b);
  return rc;
}
