/* fetch.c — a repository revision fetched from the Hub into the cache over
 * libcurl: the revision listing, then the chosen files by a few threads at
 * once, each file's bytes from {endpoint}/{id}/resolve/{commit}/{file} (redirects
 * followed, the token sent to the Hub's host only), continued with Range from
 * blobs/<id>.incomplete after a dropped connection or an interrupted run,
 * retried on 5xx / 429 / network errors, verified (LFS files by sha256, the
 * rest by size; a mismatch fetched again once, then an error naming the file)
 * and linked into snapshots/<commit>/ as hub.h lays out. Progress: a bar on a
 * terminal, a line per file otherwise. Proxies: libcurl's usual variables. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <openssl/evp.h>

#include "base/buf.h"
#include "base/file.h"
#include "hub/hub.h"

#define FETCH_ATTEMPTS 5

bool hub_offline(void) {
  const char *v = getenv("HF_HUB_OFFLINE");
  return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"));
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static void sleep_ms(int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

typedef struct fetch_run {
  const hub_ref *ref;
  const hub_revision *rev;
  const char *endpoint, *token, *repo_dir;
  size_t *todo; /* indices into rev->files */
  size_t ntodo, next, ndone;
  int64_t total, have; /* bytes wanted; bytes on disk so far (present + received) */
  double t0;
  int64_t received;
  FILE *progress;
  bool tty;
  pthread_mutex_t mu;
  int rc;
  herr err;
} fetch_run;

/* ---- HTTP ---- */

static struct curl_slist *auth_headers(const char *token) {
  struct curl_slist *h = curl_slist_append(NULL, "User-Agent: hearth/" HEARTH_VERSION);
  if (token && *token) {
    char line[4200];
    snprintf(line, sizeof line, "Authorization: Bearer %s", token);
    h = curl_slist_append(h, line);
  }
  return h;
}

static void curl_common(CURL *c, const char *url, struct curl_slist *headers) {
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
}

static bool transient(CURLcode cc, long code) {
  if (cc == CURLE_HTTP_RETURNED_ERROR) return code >= 500 || code == 429 || code == 408;
  return cc == CURLE_COULDNT_CONNECT || cc == CURLE_PARTIAL_FILE || cc == CURLE_RECV_ERROR || cc == CURLE_SEND_ERROR ||
         cc == CURLE_OPERATION_TIMEDOUT || cc == CURLE_GOT_NOTHING || cc == CURLE_COULDNT_RESOLVE_HOST;
}

/* The error for a failed request: the gated-repo hint for 401 / 403. */
static int http_error(herr *err, const hub_ref *ref, const char *url, CURLcode cc, long code, const char *token) {
  char id[600];
  hub_ref_format(ref, id, sizeof id);
  if (cc == CURLE_HTTP_RETURNED_ERROR && (code == 401 || code == 403)) {
    if (token && *token)
      return herr_set(err, HEARTH_EIO,
                      "%s: the Hub refused access (HTTP %ld for %s): the token in HF_TOKEN may lack access to this gated "
                      "or private repository — accept its terms on the model's page, or use another token",
                      id, code, url);
    return herr_set(err, HEARTH_EIO,
                    "%s: the Hub refused access (HTTP %ld for %s): the repository may be gated or private — accept its "
                    "terms on the model's page and set HF_TOKEN to an access token (https://huggingface.co/settings/tokens)",
                    id, code, url);
  }
  if (cc == CURLE_HTTP_RETURNED_ERROR && code == 404)
    return herr_set(err, HEARTH_ENOTFOUND, "%s: not found on the Hub (HTTP 404 for %s): check the name and revision", id, url);
  if (cc == CURLE_HTTP_RETURNED_ERROR)
    return herr_set(err, HEARTH_EIO, "%s: HTTP %ld for %s", id, code, url);
  return herr_set(err, HEARTH_EIO, "%s: %s (%s)", id, curl_easy_strerror(cc), url);
}

static size_t to_buf(char *p, size_t sz, size_t n, void *user) {
  hbuf *b = user;
  if (b->len + sz * n > ((size_t)64 << 20)) return 0; /* a listing is never this large */
  hbuf_append(b, p, sz * n);
  return sz * n;
}

static int get_listing(const hub_ref *ref, const char *endpoint, const char *token, hbuf *body, herr *err) {
  CURL *c = curl_easy_init();
  if (!c) return herr_set(err, HEARTH_ENOMEM, "cannot start libcurl");
  char *rev = curl_easy_escape(c, ref->revision, 0);
  size_t n = strlen(endpoint) + strlen(ref->repo) + (rev ? strlen(rev) : 0) + 64;
  char *url = malloc(n);
  struct curl_slist *h = auth_headers(token);
  int rc = 0;
  if (!rev || !url) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto done;
  }
  snprintf(url, n, "%s/api/models/%s/revision/%s?blobs=true", endpoint, ref->repo, rev);
  for (int attempt = 1;; attempt++) {
    hbuf_clear(body);
    curl_common(c, url, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, to_buf);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, body);
    CURLcode cc = curl_easy_perform(c);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    if (cc == CURLE_OK) break;
    if (!transient(cc, code) || attempt == FETCH_ATTEMPTS) {
      rc = http_error(err, ref, url, cc, code, token);
      break;
    }
    sleep_ms(100 << attempt);
  }
done:
  curl_slist_free_all(h);
  curl_free(rev);
  free(url);
  curl_easy_cleanup(c);
  return rc;
}

/* ---- one file ---- */

typedef struct transfer {
  fetch_run *run;
  FILE *f;
  CURL *c;
  int64_t have;   /* bytes in the partial file */
  bool started;
  char etag[128]; /* X-Linked-Etag, else ETag, of the answers (HEAD) */
} transfer;

static size_t to_file(char *p, size_t sz, size_t n, void *user) {
  transfer *t = user;
  size_t bytes = sz * n;
  if (!t->started) {
    t->started = true;
    long code = 0;
    curl_easy_getinfo(t->c, CURLINFO_RESPONSE_CODE, &code);
    if (code == 200 && t->have > 0) { /* the server sent the whole file: start over */
      if (fflush(t->f) || ftruncate(fileno(t->f), 0) || fseek(t->f, 0, SEEK_SET)) return 0;
      pthread_mutex_lock(&t->run->mu);
      t->run->have -= t->have;
      pthread_mutex_unlock(&t->run->mu);
      t->have = 0;
    }
  }
  if (fwrite(p, 1, bytes, t->f) != bytes) return 0;
  t->have += (int64_t)bytes;
  pthread_mutex_lock(&t->run->mu);
  t->run->have += (int64_t)bytes;
  t->run->received += (int64_t)bytes;
  pthread_mutex_unlock(&t->run->mu);
  return bytes;
}

static void normalize_etag(const char *v, size_t n, char *out, size_t cap) {
  while (n && (*v == ' ')) v++, n--;
  while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' ')) n--;
  if (n >= 2 && v[0] == 'W' && v[1] == '/') v += 2, n -= 2;
  if (n >= 2 && v[0] == '"' && v[n - 1] == '"') v++, n -= 2;
  snprintf(out, cap, "%.*s", (int)n, v);
}

static size_t on_header(char *p, size_t sz, size_t n, void *user) {
  transfer *t = user;
  size_t len = sz * n;
  if (len > 14 && !strncasecmp(p, "X-Linked-Etag:", 14)) normalize_etag(p + 14, len - 14, t->etag, sizeof t->etag);
  else if (len > 5 && !strncasecmp(p, "ETag:", 5) && !t->etag[0]) normalize_etag(p + 5, len - 5, t->etag, sizeof t->etag);
  return len;
}

static char *file_url(CURL *c, const fetch_run *run, const char *rfilename) {
  hbuf u = {0};
  hbuf_printf(&u, "%s/%s/resolve/%s/", run->endpoint, run->ref->repo, run->rev->commit);
  for (const char *p = rfilename; *p;) {
    size_t k = strcspn(p, "/");
    char *e = curl_easy_escape(c, p, (int)k);
    if (e) hbuf_append(&u, e, strlen(e));
    curl_free(e);
    p += k;
    if (*p == '/') hbuf_append(&u, "/", 1), p++;
  }
  return hbuf_take(&u);
}

/* The sha256 of a file as 64 hex digits into out. */
static int file_sha256(const char *path, char out[65], herr *err) {
  FILE *f = fopen(path, "rb");
  if (!f) return herr_set(err, HEARTH_EIO, "cannot read %s: %s", path, strerror(errno));
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  unsigned char buf[1 << 16], md[32];
  unsigned int mdlen = 0;
  bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
  size_t n;
  while (ok && (n = fread(buf, 1, sizeof buf, f)) > 0) ok = EVP_DigestUpdate(ctx, buf, n);
  ok = ok && !ferror(f) && EVP_DigestFinal_ex(ctx, md, &mdlen) && mdlen == 32;
  EVP_MD_CTX_free(ctx);
  fclose(f);
  if (!ok) return herr_set(err, HEARTH_EIO, "cannot hash %s", path);
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
  return 0;
}

static int64_t file_size(const char *path) {
  struct stat st;
  return stat(path, &st) ? -1 : (int64_t)st.st_size;
}

/* The blob name of a file the listing gives no hash for: its ETag, from a HEAD as huggingface_hub asks. */
static int head_etag(transfer *t, const char *url, struct curl_slist *h, char *out, size_t cap, herr *err) {
  for (int attempt = 1;; attempt++) {
    curl_easy_reset(t->c);
    curl_common(t->c, url, h);
    curl_easy_setopt(t->c, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(t->c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(t->c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(t->c, CURLOPT_HEADERDATA, t);
    t->etag[0] = 0;
    CURLcode cc = curl_easy_perform(t->c);
    long code = 0;
    curl_easy_getinfo(t->c, CURLINFO_RESPONSE_CODE, &code);
    if (cc == CURLE_OK && code >= 400) cc = CURLE_HTTP_RETURNED_ERROR;
    if (cc == CURLE_OK) break;
    if (!transient(cc, code) || attempt == FETCH_ATTEMPTS) return http_error(err, t->run->ref, url, cc, code, t->run->token);
    sleep_ms(100 << attempt);
  }
  bool hex = t->etag[0] != 0;
  for (const char *p = t->etag; *p; p++) hex &= (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f');
  if (!hex) return herr_set(err, HEARTH_EFORMAT, "%s: the Hub gave no usable ETag for it", url);
  snprintf(out, cap, "%s", t->etag);
  return 0;
}

/* Fetches f into blobs/<id>, verified; links it into the snapshot. */
static int fetch_file(fetch_run *run, CURL *c, const hub_file *f, herr *err) {
  char blob_id[130], blob[PATH_MAX], part[PATH_MAX];
  char *url = file_url(c, run, f->name);
  struct curl_slist *h = auth_headers(run->token);
  transfer t = {.run = run, .c = c};
  int rc = 0;
  if (!url) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto done;
  }
  if (f->sha256) snprintf(blob_id, sizeof blob_id, "%s", f->sha256);
  else if (f->blob_id) snprintf(blob_id, sizeof blob_id, "%s", f->blob_id);
  else if ((rc = head_etag(&t, url, h, blob_id, sizeof blob_id, err))) goto done;
  snprintf(blob, sizeof blob, "%s/blobs/%s", run->repo_dir, blob_id);
  snprintf(part, sizeof part, "%s.incomplete", blob);
  int64_t present = file_size(blob);
  if (present >= 0 && (f->size < 0 || present == f->size)) { /* another file or revision brought it */
    pthread_mutex_lock(&run->mu);
    run->have += present;
    pthread_mutex_unlock(&run->mu);
  } else {
    for (int pass = 0;; pass++) {
      int64_t have = file_size(part);
      if (have < 0 || (f->size >= 0 && have > f->size)) have = 0;
      t.f = fopen(part, have ? "r+b" : "wb");
      if (!t.f || fseek(t.f, have, SEEK_SET)) {
        rc = herr_set(err, HEARTH_EIO, "cannot write %s: %s", part, strerror(errno));
        if (t.f) fclose(t.f);
        goto done;
      }
      if (ftruncate(fileno(t.f), have)) {
        rc = herr_set(err, HEARTH_EIO, "cannot write %s: %s", part, strerror(errno));
        fclose(t.f);
        goto done;
      }
      t.have = have;
      pthread_mutex_lock(&run->mu);
      run->have += have;
      pthread_mutex_unlock(&run->mu);
      for (int attempt = 1; f->size < 0 || t.have < f->size || (f->size == 0 && attempt == 1); attempt++) {
        char range[48];
        curl_easy_reset(c);
        curl_common(c, url, h);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, to_file);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
        if (t.have > 0) {
          snprintf(range, sizeof range, "%lld-", (long long)t.have);
          curl_easy_setopt(c, CURLOPT_RANGE, range);
        }
        t.started = false;
        CURLcode cc = curl_easy_perform(c);
        long code = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
        if (cc == CURLE_OK) {
          if (f->size < 0 || t.have >= f->size) break;
          cc = CURLE_PARTIAL_FILE; /* the answer ended early: continue from where it stopped */
        }
        if (cc == CURLE_HTTP_RETURNED_ERROR && code == 416) { /* the range is past the end: start over */
          if (ftruncate(fileno(t.f), 0) || fseek(t.f, 0, SEEK_SET)) break;
          pthread_mutex_lock(&run->mu);
          run->have -= t.have;
          pthread_mutex_unlock(&run->mu);
          t.have = 0;
        } else if (!transient(cc, code) || attempt >= FETCH_ATTEMPTS) {
          fclose(t.f);
          rc = http_error(err, run->ref, url, cc, code, run->token);
          herr_wrap(err, "%s", f->name);
          goto done;
        }
        sleep_ms(100 << (attempt < 6 ? attempt : 6));
      }
      if (fclose(t.f)) {
        rc = herr_set(err, HEARTH_EIO, "cannot write %s: %s", part, strerror(errno));
        goto done;
      }
      /* verify: the LFS sha256, else the size */
      char got[65] = "";
      int64_t size = file_size(part);
      bool ok = f->size < 0 || size == f->size;
      if (ok && f->sha256) {
        if ((rc = file_sha256(part, got, err))) goto done;
        ok = !strcmp(got, f->sha256);
      }
      if (ok) break;
      unlink(part);
      pthread_mutex_lock(&run->mu);
      run->have -= size;
      pthread_mutex_unlock(&run->mu);
      if (pass == 1) {
        if (got[0] && size == f->size)
          rc = herr_set(err, HEARTH_EFORMAT,
                        "%s: its sha256 is %s but the Hub lists %s (fetched twice from %s); the bytes were removed", f->name,
                        got, f->sha256, url);
        else
          rc = herr_set(err, HEARTH_EFORMAT, "%s: %lld bytes arrived but the Hub lists %lld (fetched twice from %s)", f->name,
                        (long long)size, (long long)f->size, url);
        goto done;
      }
    }
    if (rename(part, blob)) {
      rc = herr_set(err, HEARTH_EIO, "cannot rename %s to %s: %s", part, blob, strerror(errno));
      goto done;
    }
  }
  rc = hub_cache_link(run->repo_dir, run->rev->commit, f->name, blob_id, err);
done:
  curl_slist_free_all(h);
  free(url);
  return rc;
}

/* ---- progress ---- */

static void human_bytes(char *out, size_t cap, double v) {
  static const char *u[] = {"B", "kB", "MB", "GB", "TB"};
  int k = 0;
  while (v >= 1000 && k < 4) v /= 1000, k++;
  snprintf(out, cap, k ? "%.1f %s" : "%.0f %s", v, u[k]);
}

static void draw_bar(fetch_run *run, bool final) {
  pthread_mutex_lock(&run->mu);
  int64_t have = run->have, total = run->total, received = run->received;
  size_t done = run->ndone, n = run->ntodo;
  pthread_mutex_unlock(&run->mu);
  double el = now_s() - run->t0, rate = el > 0 ? received / el : 0;
  char a[32], b[32], r[32], eta[32] = "";
  human_bytes(a, sizeof a, (double)have);
  human_bytes(b, sizeof b, (double)total);
  human_bytes(r, sizeof r, rate);
  double frac = total > 0 ? (double)have / (double)total : 1;
  if (frac > 1) frac = 1;
  if (!final && rate > 0 && total > have) snprintf(eta, sizeof eta, " ETA %.0fs", (double)(total - have) / rate);
  char bar[31];
  int fill = (int)(frac * 30);
  for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
  bar[30] = 0;
  fprintf(run->progress, "\r[%s] %3.0f%% %s / %s  %s/s%s  (%zu/%zu files)\033[K%s", bar, frac * 100, a, b, r, eta, done, n,
          final ? "\n" : "");
  fflush(run->progress);
}

/* mkdir -p path. */
static int mkdir_p(const char *path, herr *err) {
  char buf[PATH_MAX];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1;; p++) {
    if (*p && *p != '/') continue;
    char c = *p;
    *p = 0;
    if (mkdir(buf, 0755) && errno != EEXIST) return herr_set(err, HEARTH_EIO, "cannot make the folder %s: %s", buf, strerror(errno));
    if (!c) return 0;
    *p = c;
  }
}

/* ---- the workers ---- */

static void *worker(void *arg) {
  fetch_run *run = arg;
  CURL *c = curl_easy_init();
  for (;;) {
    pthread_mutex_lock(&run->mu);
    if (run->next >= run->ntodo || run->rc || !c) {
      if (!c && !run->rc) run->rc = herr_set(&run->err, HEARTH_ENOMEM, "cannot start libcurl");
      pthread_mutex_unlock(&run->mu);
      break;
    }
    const hub_file *f = &run->rev->files[run->todo[run->next++]];
    pthread_mutex_unlock(&run->mu);
    herr e = {0};
    int rc = fetch_file(run, c, f, &e);
    pthread_mutex_lock(&run->mu);
    if (rc && !run->rc) {
      run->rc = rc;
      run->err = e;
    }
    if (!rc) {
      run->ndone++;
      if (run->progress && !run->tty) {
        char sz[32];
        human_bytes(sz, sizeof sz, f->size >= 0 ? (double)f->size : 0);
        fprintf(run->progress, "hearth: %s (%s) ok, %zu/%zu files\n", f->name, sz, run->ndone, run->ntodo);
        fflush(run->progress);
      }
    }
    pthread_mutex_unlock(&run->mu);
  }
  curl_easy_cleanup(c);
  return NULL;
}

int hub_fetch(const hub_ref *ref, const hub_fetch_opts *o, char **snapshot, herr *err) {
  *snapshot = NULL;
  char id[600];
  hub_ref_format(ref, id, sizeof id);
  char *root = o->cache_root ? strdup(o->cache_root) : hub_cache_root();
  char *repo_dir = root ? hub_repo_dir(root, ref->repo) : NULL;
  hub_revision rev = {0};
  hbuf body = {0};
  bool *keep = NULL;
  size_t *todo = NULL;
  int rc = 0;
  if (!repo_dir) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto done;
  }
  if (hub_offline()) {
    char *commit = NULL;
    if (hub_cache_commit(repo_dir, ref->revision, &commit, NULL)) {
      rc = herr_set(err, HEARTH_ENOTFOUND,
                    "%s is not in the Hugging Face cache (%s) and HF_HUB_OFFLINE=1 forbids fetching it; "
                    "with a network, run: hearth get %s",
                    id, root, id);
      goto done;
    }
    char *snap = malloc(strlen(repo_dir) + 64);
    if (snap) sprintf(snap, "%s/snapshots/%s", repo_dir, commit);
    free(commit);
    if (!snap) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    *snapshot = snap;
    goto done;
  }
  const char *endpoint = o->endpoint ? o->endpoint : getenv("HF_ENDPOINT");
  if (!endpoint || !*endpoint) endpoint = HUB_DEFAULT_ENDPOINT;
  char ep[1024];
  snprintf(ep, sizeof ep, "%s", endpoint);
  for (size_t l = strlen(ep); l && ep[l - 1] == '/';) ep[--l] = 0;
  const char *token = o->token ? o->token : getenv("HF_TOKEN");
  curl_global_init(CURL_GLOBAL_DEFAULT);
  if ((rc = get_listing(ref, ep, token, &body, err))) goto done;
  if ((rc = hub_revision_parse(hbuf_str(&body), body.len, &rev, err))) {
    herr_wrap(err, "%s (from %s)", id, ep);
    goto done;
  }
  keep = calloc(rev.n ? rev.n : 1, sizeof *keep);
  todo = calloc(rev.n ? rev.n : 1, sizeof *todo);
  if (!keep || !todo) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto done;
  }
  if ((rc = hub_select(&rev, &o->select, keep, err))) {
    herr_wrap(err, "%s", id);
    goto done;
  }
  fetch_run run = {.ref = ref, .rev = &rev, .endpoint = ep, .token = token, .repo_dir = repo_dir, .todo = todo,
                   .progress = o->progress, .t0 = now_s()};
  for (size_t i = 0; i < rev.n; i++)
    if (keep[i]) {
      todo[run.ntodo++] = i;
      if (rev.files[i].size > 0) run.total += rev.files[i].size;
    }
  if (!run.ntodo) {
    rc = herr_set(err, HEARTH_ENOTFOUND, "%s: no file of the repository matches what was asked (--include / --exclude)", id);
    goto done;
  }
  char blobs[PATH_MAX];
  snprintf(blobs, sizeof blobs, "%s/blobs", repo_dir);
  if ((rc = mkdir_p(blobs, err))) goto done;
  run.tty = o->progress && isatty(fileno(o->progress));
  pthread_mutex_init(&run.mu, NULL);
  int jobs = o->jobs > 0 ? o->jobs : 4;
  if ((size_t)jobs > run.ntodo) jobs = (int)run.ntodo;
  if (run.progress) {
    char tot[32];
    human_bytes(tot, sizeof tot, (double)run.total);
    fprintf(run.progress, "hearth: fetching %s (commit %.12s): %zu files, %s, into %s\n", id, rev.commit, run.ntodo, tot,
            repo_dir);
  }
  pthread_t th[16];
  int started = 0;
  for (int k = 0; k < jobs && k < 16; k++)
    if (!pthread_create(&th[k], NULL, worker, &run)) started++;
  if (!started) worker(&run);
  if (run.tty) {
    for (;;) {
      pthread_mutex_lock(&run.mu);
      bool over = run.ndone == run.ntodo || (run.rc && run.next >= run.ntodo) || run.rc;
      pthread_mutex_unlock(&run.mu);
      if (over) break;
      draw_bar(&run, false);
      sleep_ms(200);
    }
  }
  for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
  if (run.tty) draw_bar(&run, true);
  pthread_mutex_destroy(&run.mu);
  if (run.rc) {
    rc = run.rc;
    if (err) *err = run.err;
    goto done;
  }
  if ((rc = hub_cache_write_ref(repo_dir, ref->revision, rev.commit, err))) goto done;
  *snapshot = malloc(strlen(repo_dir) + 64);
  if (!*snapshot) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
  else sprintf(*snapshot, "%s/snapshots/%s", repo_dir, rev.commit);
done:
  free(keep);
  free(todo);
  hub_revision_free(&rev);
  hbuf_free(&body);
  free(repo_dir);
  free(root);
  return rc;
}
