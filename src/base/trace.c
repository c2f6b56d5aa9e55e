/* trace.c — the Chrome trace-event JSON sink of trace.h: formats events
 * (strings escaped, invalid UTF-8 replaced by U+FFFD), writes each as one
 * whole line under a lock, keeps the byte cap. Owns the file and nothing
 * else; knows nothing of requests, models or the scheduler — what a span
 * means is its caller's business. */
#include "base/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/utf8.h"

struct htrace {
  int fd;                /* owned */
  char *path;            /* owned, for messages */
  double t0;             /* htrace_now() at open: ts 0 */
  int64_t pid;
  int64_t max_bytes;
  pthread_mutex_t mu;    /* guards the rest and the file's write position */
  int64_t bytes;         /* event bytes written */
  int64_t n_events;
  int64_t dropped;
  bool full;             /* the cap was reached (logged once) */
  bool failed;           /* a write failed (logged once): nothing more is written */
};

double htrace_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* s as a JSON string literal. */
static void put_str(hbuf *b, const char *s) {
  hbuf_putc(b, '"');
  size_t n = s ? strlen(s) : 0;
  for (size_t i = 0; i < n;) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') {
      hbuf_putc(b, '\\');
      hbuf_putc(b, (char)c);
      i++;
    } else if (c < 0x20) {
      hbuf_printf(b, "\\u%04x", c);
      i++;
    } else if (c < 0x80) {
      hbuf_putc(b, (char)c);
      i++;
    } else {
      uint32_t cp;
      int len = utf8_decode(s + i, n - i, &cp);
      if (len > 0) {
        hbuf_append(b, s + i, (size_t)len);
        i += (size_t)len;
      } else {
        hbuf_puts(b, "\\ufffd");
        i++;
      }
    }
  }
  hbuf_putc(b, '"');
}

static void put_args(hbuf *b, const htrace_arg *args, int n_args) {
  if (n_args <= 0 || !args) return;
  hbuf_puts(b, ",\"args\":{");
  for (int i = 0; i < n_args; i++) {
    if (i) hbuf_putc(b, ',');
    put_str(b, args[i].key);
    hbuf_putc(b, ':');
    if (args[i].str) put_str(b, args[i].str);
    else hbuf_printf(b, "%lld", (long long)args[i].num);
  }
  hbuf_putc(b, '}');
}

static bool write_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= (size_t)w;
  }
  return true;
}

/* Writes one formatted event (b holds it, without separator) unless the cap forbids. */
static void emit(htrace *t, hbuf *b) {
  if (b->oom) {
    pthread_mutex_lock(&t->mu);
    t->dropped++;
    pthread_mutex_unlock(&t->mu);
    return;
  }
  pthread_mutex_lock(&t->mu);
  size_t sep = t->n_events ? 2 : 0;
  if (t->failed || t->bytes + (int64_t)(b->len + sep) > t->max_bytes) {
    t->dropped++;
    if (!t->full && !t->failed) {
      t->full = true;
      HLOG_WARN("trace: %s reached its size limit of %lld bytes; later events are not written",
                t->path, (long long)t->max_bytes);
    }
    pthread_mutex_unlock(&t->mu);
    return;
  }
  /* ",\n" then the event, in one write */
  bool ok;
  if (sep) {
    hbuf line = {0};
    hbuf_puts(&line, ",\n");
    hbuf_append(&line, b->data, b->len);
    ok = !line.oom && write_all(t->fd, line.data, line.len);
    hbuf_free(&line);
  } else {
    ok = write_all(t->fd, b->data, b->len);
  }
  if (ok) {
    t->bytes += (int64_t)(b->len + sep);
    t->n_events++;
  } else {
    t->failed = true;
    t->dropped++;
    HLOG_WARN("trace: cannot write %s: %s; later events are not written", t->path, strerror(errno));
  }
  pthread_mutex_unlock(&t->mu);
}

static void put_head(hbuf *b, const htrace *t, const char *ph, const char *name, const char *cat, int64_t tid) {
  hbuf_printf(b, "{\"ph\":\"%s\",\"name\":", ph);
  put_str(b, name);
  if (cat) {
    hbuf_puts(b, ",\"cat\":");
    put_str(b, cat);
  }
  hbuf_printf(b, ",\"pid\":%lld,\"tid\":%lld", (long long)t->pid, (long long)tid);
}

/* Nanoseconds since open (0 for earlier times). Times are written from these
 * whole nanoseconds, and a span's duration as end minus start, so spans that
 * nest in seconds still nest exactly in the file. */
static int64_t ns_since_open(const htrace *t, double at) {
  double ns = (at - t->t0) * 1e9;
  return ns > 0 ? (int64_t)llround(ns) : 0;
}

/* Microseconds with three decimals, from nanoseconds >= 0. */
static void put_us(hbuf *b, const char *key, int64_t ns) {
  hbuf_printf(b, ",\"%s\":%lld.%03lld", key, (long long)(ns / 1000), (long long)(ns % 1000));
}

int htrace_open(const char *path, int64_t max_bytes, htrace **out, herr *err) {
  *out = NULL;
  if (!path || !path[0]) return herr_set(err, HEARTH_EINVAL, "trace: no file name");
  htrace *t = calloc(1, sizeof *t);
  if (!t) return herr_set(err, HEARTH_ENOMEM, "trace: out of memory");
  t->path = strdup(path);
  if (!t->path) {
    free(t);
    return herr_set(err, HEARTH_ENOMEM, "trace: out of memory");
  }
  t->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (t->fd < 0) {
    int rc = herr_set(err, HEARTH_EIO, "trace: cannot create %s: %s", path, strerror(errno));
    free(t->path);
    free(t);
    return rc;
  }
  if (!write_all(t->fd, "[\n", 2)) {
    int rc = herr_set(err, HEARTH_EIO, "trace: cannot write %s: %s", path, strerror(errno));
    close(t->fd);
    free(t->path);
    free(t);
    return rc;
  }
  pthread_mutex_init(&t->mu, NULL);
  t->t0 = htrace_now();
  t->pid = (int64_t)getpid();
  t->max_bytes = max_bytes > 0 ? max_bytes : HTRACE_DEFAULT_MAX_BYTES;
  hbuf b = {0};
  put_head(&b, t, "M", "process_name", NULL, 0);
  put_args(&b, (htrace_arg[]){HTRACE_STR("name", "hearth")}, 1);
  hbuf_putc(&b, '}');
  emit(t, &b);
  hbuf_free(&b);
  *out = t;
  return 0;
}

void htrace_close(htrace *t) {
  if (!t) return;
  if (!t->failed && !write_all(t->fd, "\n]\n", 3))
    HLOG_WARN("trace: cannot finish %s: %s", t->path, strerror(errno));
  if (close(t->fd)) HLOG_WARN("trace: cannot close %s: %s", t->path, strerror(errno));
  if (t->dropped) HLOG_INFO("trace: %s: %lld events written, %lld dropped", t->path, (long long)t->n_events,
                            (long long)t->dropped);
  pthread_mutex_destroy(&t->mu);
  free(t->path);
  free(t);
}

void htrace_track(htrace *t, int64_t tid, const char *name, int64_t sort_index) {
  if (!t) return;
  hbuf b = {0};
  put_head(&b, t, "M", "thread_name", NULL, tid);
  put_args(&b, (htrace_arg[]){HTRACE_STR("name", name)}, 1);
  hbuf_putc(&b, '}');
  emit(t, &b);
  hbuf_clear(&b);
  put_head(&b, t, "M", "thread_sort_index", NULL, tid);
  put_args(&b, (htrace_arg[]){HTRACE_INT("sort_index", sort_index)}, 1);
  hbuf_putc(&b, '}');
  emit(t, &b);
  hbuf_free(&b);
}

void htrace_complete(htrace *t, int64_t tid, const char *name, const char *cat, double start, double dur,
                     const htrace_arg *args, int n_args) {
  if (!t) return;
  hbuf b = {0};
  put_head(&b, t, "X", name, cat, tid);
  int64_t from = ns_since_open(t, start), to = ns_since_open(t, start + (dur > 0 ? dur : 0));
  put_us(&b, "ts", from);
  put_us(&b, "dur", to - from);
  put_args(&b, args, n_args);
  hbuf_putc(&b, '}');
  emit(t, &b);
  hbuf_free(&b);
}

void htrace_instant(htrace *t, int64_t tid, const char *name, const char *cat, double at, const htrace_arg *args,
                    int n_args) {
  if (!t) return;
  hbuf b = {0};
  put_head(&b, t, "i", name, cat, tid);
  hbuf_puts(&b, ",\"s\":\"t\"");
  put_us(&b, "ts", ns_since_open(t, at));
  put_args(&b, args, n_args);
  hbuf_putc(&b, '}');
  emit(t, &b);
  hbuf_free(&b);
}

int64_t htrace_bytes(htrace *t) {
  if (!t) return 0;
  pthread_mutex_lock(&t->mu);
  int64_t n = t->bytes;
  pthread_mutex_unlock(&t->mu);
  return n;
}

int64_t htrace_dropped(htrace *t) {
  if (!t) return 0;
  pthread_mutex_lock(&t->mu);
  int64_t n = t->dropped;
  pthread_mutex_unlock(&t->mu);
  return n;
}
