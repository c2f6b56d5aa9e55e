/* source.c — where media bytes come from: data URLs (base64 or percent-encoded),
 * bare base64, local files, and http(s) URLs through libcurl when allowed. Every
 * path stops at the byte limit. A remote fetch reaches only public addresses
 * unless told otherwise: each hop's host is resolved here and checked
 * (media_addr_public), libcurl is pinned to the checked address and may open
 * no other, redirects are followed here (each hop checked again), only http
 * and https, no proxy; every failure is one message, its reason in the log. */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "media/media.h"
#include "base/log.h"
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

/* ---- remote media: which addresses a fetch may reach ---- */

static bool v4_public(const uint8_t a[4]) {
  uint32_t x = (uint32_t)a[0] << 24 | (uint32_t)a[1] << 16 | (uint32_t)a[2] << 8 | a[3];
  static const struct {
    uint32_t net;
    int bits;
  } refused[] = {
      {0x00000000u, 8},  /* "this network", 0.0.0.0 (unspecified) */
      {0x0A000000u, 8},  /* private 10/8 */
      {0x64400000u, 10}, /* shared address space (carrier-grade NAT) 100.64/10 */
      {0x7F000000u, 8},  /* loopback 127/8 */
      {0xA9FE0000u, 16}, /* link-local 169.254/16 (cloud metadata services live here) */
      {0xAC100000u, 12}, /* private 172.16/12 */
      {0xC0000000u, 24}, /* IETF protocol assignments 192.0.0/24 */
      {0xC0A80000u, 16}, /* private 192.168/16 */
      {0xC6120000u, 15}, /* benchmarking 198.18/15 */
      {0xE0000000u, 4},  /* multicast 224/4 */
      {0xF0000000u, 4},  /* reserved 240/4, with the broadcast address 255.255.255.255 */
  };
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
    if (x >> (32 - refused[i].bits) == refused[i].net >> (32 - refused[i].bits)) return false;
  return true;
}

static bool v6_public(const uint8_t a[16]) {
  static const uint8_t zero[16];
  if (!memcmp(a, zero, 10) && a[10] == 0xff && a[11] == 0xff) return v4_public(a + 12); /* ::ffff:a.b.c.d, mapped */
  if (!memcmp(a, zero, 12)) return v4_public(a + 12); /* ::a.b.c.d, compatible (:: and ::1 fall in 0/8) */
  if (!memcmp(a, zero, 8) && a[8] == 0xff && a[9] == 0xff && a[10] == 0 && a[11] == 0)
    return v4_public(a + 12);                                               /* ::ffff:0:a.b.c.d, translated */
  if (a[0] == 0 && a[1] == 0x64 && a[2] == 0xff && a[3] == 0x9b && !memcmp(a + 4, zero, 8))
    return v4_public(a + 12);                                               /* 64:ff9b::/96, NAT64 */
  if (a[0] == 0x20 && a[1] == 0x02) return v4_public(a + 2);                /* 2002::/16, 6to4 */
  if (a[0] == 0x01 && !memcmp(a + 1, zero, 7)) return false;                /* 100::/64, discard */
  if ((a[0] & 0xfe) == 0xfc) return false;                                  /* fc00::/7, unique local */
  if (a[0] == 0xfe && (a[1] & 0xc0) == 0x80) return false;                  /* fe80::/10, link-local */
  if (a[0] == 0xfe && (a[1] & 0xc0) == 0xc0) return false;                  /* fec0::/10, site-local */
  if (a[0] == 0xff) return false;                                           /* ff00::/8, multicast */
  return true;
}

bool media_addr_public(const struct sockaddr *sa) {
  if (!sa) return false;
  if (sa->sa_family == AF_INET) return v4_public((const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr);
  if (sa->sa_family == AF_INET6) return v6_public(((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr);
  return false;
}

static bool addr_allowed(const media_source_opts *o, const struct sockaddr *sa) {
  if (o->addr_ok) return o->addr_ok(sa, o->addr_ok_ctx);
  return o->allow_private_hosts || media_addr_public(sa);
}

static void addr_text(const struct sockaddr *sa, char *buf, size_t n) {
  const void *a = sa->sa_family == AF_INET6 ? (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr
                                            : (const void *)&((const struct sockaddr_in *)sa)->sin_addr;
  if (!inet_ntop(sa->sa_family, a, buf, (socklen_t)n)) snprintf(buf, n, "?");
}

/* ---- remote media: the fetch ---- */

#define MAX_REDIRECTS 5

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

/* libcurl's socket for a connection: only to an address the rule allows.
 * The host was resolved and checked before, and pinned (CURLOPT_RESOLVE);
 * this is the same rule at the last moment, whatever path led here. */
typedef struct fetch_hop_ctx {
  const media_source_opts *o;
  bool refused;
  char addr[INET6_ADDRSTRLEN];
} fetch_hop_ctx;

static curl_socket_t open_socket(void *user, curlsocktype purpose, struct curl_sockaddr *a) {
  fetch_hop_ctx *h = user;
  if (purpose != CURLSOCKTYPE_IPCXN || !addr_allowed(h->o, &a->addr)) {
    h->refused = true;
    addr_text(&a->addr, h->addr, sizeof h->addr);
    return CURL_SOCKET_BAD;
  }
  return socket(a->family, a->socktype, a->protocol);
}

/* One request: url's host resolved here and checked, the connection pinned
 * to the checked address, no redirect followed (a redirect's absolute URL
 * goes to *next). The body goes to b. Any failure: non-zero with the
 * reason in why (for the server's log, not the client). */
static int fetch_hop(const char *url, const media_source_opts *o, fetch_buf *b, char **next, char *why, size_t wn) {
  *next = NULL;
  int rc = -1;
  CURLU *u = curl_url();
  char *scheme = NULL, *host = NULL, *port = NULL;
  CURL *c = NULL;
  struct curl_slist *pin = NULL;
  struct addrinfo *ai = NULL;
  if (!u || curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK || curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
      curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
      curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK) {
    snprintf(why, wn, "not a valid URL");
    goto done;
  }
  if (strcasecmp(scheme, "http") != 0 && strcasecmp(scheme, "https") != 0) {
    snprintf(why, wn, "the scheme '%s' is not http or https", scheme);
    goto done;
  }
  char name[256];
  size_t hl = strlen(host);
  bool literal6 = hl >= 2 && host[0] == '[' && host[hl - 1] == ']';
  if (literal6) snprintf(name, sizeof name, "%.*s", (int)(hl - 2), host + 1);
  else snprintf(name, sizeof name, "%s", host);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  int gai = getaddrinfo(name, port, &hints, &ai);
  if (gai || !ai) {
    snprintf(why, wn, "cannot resolve '%s': %s", name, gai_strerror(gai));
    goto done;
  }
  const struct addrinfo *use = NULL;
  for (const struct addrinfo *p = ai; p && !use; p = p->ai_next)
    if ((p->ai_family == AF_INET || p->ai_family == AF_INET6) && addr_allowed(o, p->ai_addr)) use = p;
  char addr[INET6_ADDRSTRLEN];
  if (!use) {
    addr_text(ai->ai_addr, addr, sizeof addr);
    if (o->addr_ok) snprintf(why, wn, "'%s' is %s, which the address rule refuses", name, addr);
    else
      snprintf(why, wn, "'%s' is %s, which remote media may not reach (loopback, private, link-local or reserved; "
               "--allow-private-media-hosts allows it)", name, addr);
    goto done;
  }
  addr_text(use->ai_addr, addr, sizeof addr);
  /* Pinned: libcurl connects to the address checked here, not to a second answer from DNS. */
  char entry[600];
  snprintf(entry, sizeof entry, "%s:%s:%s%s%s", host, port, use->ai_family == AF_INET6 ? "[" : "", addr,
           use->ai_family == AF_INET6 ? "]" : "");
  if (!(pin = curl_slist_append(NULL, entry)) || !(c = curl_easy_init())) {
    snprintf(why, wn, "out of memory");
    goto done;
  }
  fetch_hop_ctx hc = {.o = o};
  char ebuf[CURL_ERROR_SIZE] = "";
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_PROXY, ""); /* no proxy from the environment: the checked address is the one reached */
  if (!literal6) curl_easy_setopt(c, CURLOPT_RESOLVE, pin);
  curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, open_socket);
  curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, &hc);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
  curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)b->max);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, ebuf);
  CURLcode cr = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (hc.refused) {
    snprintf(why, wn, "a connection to %s was refused (loopback, private, link-local or reserved)", hc.addr);
  } else if (b->over || cr == CURLE_FILESIZE_EXCEEDED) {
    snprintf(why, wn, "larger than the limit (%zu bytes)", b->max);
  } else if (cr != CURLE_OK) {
    snprintf(why, wn, "%s", ebuf[0] ? ebuf : curl_easy_strerror(cr));
  } else if (status == 301 || status == 302 || status == 303 || status == 307 || status == 308) {
    char *loc = NULL;
    curl_easy_getinfo(c, CURLINFO_REDIRECT_URL, &loc);
    if (!loc || !*loc) snprintf(why, wn, "HTTP %ld without a Location", status);
    else if (!(*next = strdup(loc))) snprintf(why, wn, "out of memory");
    else rc = 0;
  } else if (status / 100 != 2) {
    snprintf(why, wn, "HTTP %ld", status);
  } else {
    rc = 0;
  }
done:
  if (c) curl_easy_cleanup(c);
  curl_slist_free_all(pin);
  if (ai) freeaddrinfo(ai);
  curl_free(scheme), curl_free(host), curl_free(port);
  curl_url_cleanup(u);
  return rc;
}

/* An http(s) URL's bytes, redirects followed here (at most MAX_REDIRECTS),
 * every hop's host resolved and checked before it is reached. Every failure
 * is one message to the caller, the same whether the host refused, timed
 * out, answered an error or sent too much (which would otherwise tell a
 * client which ports answer where); the reason goes to the log. */
static int http_get(const char *url, const media_source_opts *o, size_t max, uint8_t **out, size_t *n, herr *err) {
  static bool inited;
  if (!__atomic_exchange_n(&inited, true, __ATOMIC_ACQ_REL)) curl_global_init(CURL_GLOBAL_DEFAULT);
  fetch_buf b = {.max = max};
  char why[512] = "";
  char *cur = strdup(url);
  bool ok = false;
  if (!cur) snprintf(why, sizeof why, "out of memory");
  for (int hop = 0; cur; hop++) {
    char *next = NULL;
    b.n = 0;
    b.over = false;
    if (fetch_hop(cur, o, &b, &next, why, sizeof why)) break;
    free(cur);
    cur = next;
    if (!next) ok = true;
    else if (hop == MAX_REDIRECTS) {
      snprintf(why, sizeof why, "more than %d redirects", MAX_REDIRECTS);
      break;
    }
  }
  free(cur);
  if (!ok) {
    free(b.p);
    HLOG_WARN("media: cannot fetch %.300s: %s", url, why);
    return herr_set(err, HEARTH_EINVAL,
                    "cannot fetch %.300s (refused, unreachable, an HTTP error or over %zu bytes; the server's log says which)",
                    url, max);
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
    return http_get(url, o, l.max_bytes, out, n, err);
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
