/* kv_disk.c — the prefix cache on disk (see kv_disk.h): the file format,
 * the index of the blocks in the folder, the writer thread and its bounded
 * queue of block images (a block the pool evicts is copied out on the
 * pool's thread and written to disk on the writer's), reading one back into
 * the pool when a prefix asks for it (from the queue while it waits there),
 * the size bound, and the model identity. Knows the pool only through the
 * persistence part of kv_paged.h; knows nothing of models or scheduling. */
#include "engine/kv_disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/vec.h"

#define MAGIC "HKVBLOCK"
#define FIXED_HEADER 68
#define MAX_DESC 16384
#define CHECKSUM_AT 56
#define QUEUE_BYTES ((size_t)64 << 20) /* block images waiting for the writer, at most (and 2 .. 64 of them) */

typedef struct entry {
  uint64_t hash, parent;
  int32_t depth;
  int64_t bytes;        /* file size */
  int64_t used;         /* last use, ns since the epoch (the file's mtime) */
  int32_t next;         /* next entry in the bucket, -1 */
  bool live;
} entry;

/* A block waiting to be written: its file image, checksum still unset. */
typedef struct wslot {
  uint64_t hash, parent;
  int32_t depth;
  unsigned char *img;   /* owned [header + payload], allocated on first use */
} wslot;

struct kv_disk {
  char *dir;            /* owned */
  int64_t max_bytes;
  uint64_t model_id;
  kv_pool *pool;        /* borrowed */
  bool host;            /* the pool's arenas are in host memory (a CPU backend) */
  char desc[MAX_DESC];  /* the pool's format descriptor */
  uint32_t desc_len;
  int B;
  size_t payload;       /* bytes of one block's payload */
  size_t header;        /* bytes of a file's header */
  entry *e;             /* owned: the index */
  int64_t n_e, cap_e, n_dead;
  int32_t *buckets;     /* owned [n_buckets] */
  int64_t n_buckets;
  unsigned char *io;    /* owned [header + payload]: a block file read on the pool's thread */
  uint64_t tmp_seq;     /* the writer's */
  kv_disk_stats st;
  /* mu guards the index, st and the queue; the pool's thread fills a free slot outside it
   * (only that thread adds), the writer writes the head slot outside it (only it removes) */
  pthread_mutex_t mu;
  pthread_cond_t cv;    /* the queue changed: work for the writer, room or empty for a waiter */
  pthread_t writer;
  bool writer_started, stop, hold;
  wslot *q;             /* owned [q_cap]: a ring, q_n pending from q_head */
  int q_cap, q_head, q_n;
};

/* ---- little-endian fields ---- */

static void put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static uint64_t get64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* A 64-bit checksum of n bytes, over four independent lanes (fast enough to
 * check a block on every read). */
static uint64_t checksum_update(uint64_t lane[4], const unsigned char *p, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; k++) {
      uint64_t w;
      memcpy(&w, p + i + 8 * k, 8);
      lane[k] = hmix64(lane[k] ^ w);
    }
  uint64_t tail = 0;
  for (size_t j = 0; i + j < n; j++) tail = tail * 257 + p[i + j] + 1;
  return tail;
}

/* The checksum of a whole file image, its checksum field read as zero. */
static uint64_t file_checksum(const unsigned char *p, size_t n) {
  uint64_t lane[4] = {1, 2, 3, 4}, h = hmix64(n);
  unsigned char zero[8] = {0};
  /* header up to the field, the zeroed field, the rest: each part a multiple of 8 bytes except the last */
  uint64_t t1 = checksum_update(lane, p, CHECKSUM_AT);
  uint64_t t2 = checksum_update(lane, zero, 8);
  uint64_t t3 = checksum_update(lane, p + CHECKSUM_AT + 8, n - CHECKSUM_AT - 8);
  h = hmix64(h ^ t1 ^ hmix64(t2 + 1) ^ hmix64(t3 + 2));
  for (int k = 0; k < 4; k++) h = hmix64(h ^ lane[k]);
  return h;
}

/* ---- the index (under mu) ---- */

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int rebuild_buckets(kv_disk *d) {
  /* drop dead entries, then hash the live ones into a table twice their number */
  int64_t j = 0;
  for (int64_t i = 0; i < d->n_e; i++)
    if (d->e[i].live) d->e[j++] = d->e[i];
  d->n_e = j;
  d->n_dead = 0;
  int64_t nb = 2 * (d->cap_e > 16 ? d->cap_e : 16) + 1;
  int32_t *b = malloc(sizeof *b * (size_t)nb);
  if (!b) return -1;
  for (int64_t i = 0; i < nb; i++) b[i] = -1;
  for (int64_t i = 0; i < d->n_e; i++) {
    int32_t *head = &b[d->e[i].hash % (uint64_t)nb];
    d->e[i].next = *head;
    *head = (int32_t)i;
  }
  free(d->buckets);
  d->buckets = b;
  d->n_buckets = nb;
  return 0;
}

static entry *find(const kv_disk *d, uint64_t hash) {
  if (!d->buckets) return NULL;
  for (int32_t i = d->buckets[hash % (uint64_t)d->n_buckets]; i >= 0; i = d->e[i].next)
    if (d->e[i].live && d->e[i].hash == hash) return &d->e[i];
  return NULL;
}

static int add_entry(kv_disk *d, const entry *x) {
  if (d->n_e == d->cap_e) {
    if (!HGROW(d->e, d->cap_e, d->n_e + 1)) return -1;
    if (rebuild_buckets(d)) return -1;
  }
  entry *e = &d->e[d->n_e];
  *e = *x;
  e->live = true;
  int32_t *head = &d->buckets[e->hash % (uint64_t)d->n_buckets];
  e->next = *head;
  *head = (int32_t)d->n_e++;
  d->st.files++;
  d->st.bytes += e->bytes;
  return 0;
}

static void block_path(const kv_disk *d, uint64_t hash, char *out, size_t cap) {
  snprintf(out, cap, "%s/%016llx.kvb", d->dir, (unsigned long long)hash);
}

/* Forgets entry e and removes its file. */
static void drop_entry(kv_disk *d, entry *e) {
  char path[4096];
  block_path(d, e->hash, path, sizeof path);
  unlink(path);
  e->live = false;
  d->n_dead++;
  d->st.files--;
  d->st.bytes -= e->bytes;
  if (d->n_dead > 64 && d->n_dead * 2 > d->n_e) rebuild_buckets(d);
}

/* Removes least recently used files (the deepest first among equals) until
 * `extra` more bytes fit under the bound. */
static void make_room(kv_disk *d, int64_t extra) {
  while (d->st.files > 0 && d->st.bytes + extra > d->max_bytes) {
    entry *victim = NULL;
    for (int64_t i = 0; i < d->n_e; i++) {
      entry *e = &d->e[i];
      if (!e->live) continue;
      if (!victim || e->used < victim->used || (e->used == victim->used && e->depth > victim->depth)) victim = e;
    }
    if (!victim) break;
    drop_entry(d, victim);
    d->st.removed++;
  }
}

/* ---- the header ---- */

typedef struct header {
  uint32_t version, header_len, depth, block_tokens, desc_len;
  uint64_t model_id, hash, parent, payload, checksum;
  const unsigned char *desc;
  const unsigned char *tokens;
} header;

typedef enum verdict { FILE_OK = 0, FILE_OTHER_VERSION, FILE_OTHER_MODEL, FILE_OTHER_FORMAT, FILE_DAMAGED } verdict;

/* Reads the header in p[0..n) (n: what is there of it); FILE_OK when it is
 * this store's (model, version, format), else why not. */
static verdict parse_header(const kv_disk *d, const unsigned char *p, size_t n, header *h) {
  memset(h, 0, sizeof *h);
  if (n < FIXED_HEADER || memcmp(p, MAGIC, 8) != 0) return FILE_DAMAGED;
  h->version = get32(p + 8);
  if (h->version != KV_DISK_VERSION) return FILE_OTHER_VERSION;
  h->header_len = get32(p + 12);
  h->model_id = get64(p + 16);
  h->hash = get64(p + 24);
  h->parent = get64(p + 32);
  h->depth = get32(p + 40);
  h->block_tokens = get32(p + 44);
  h->payload = get64(p + 48);
  h->checksum = get64(p + CHECKSUM_AT);
  h->desc_len = get32(p + 64);
  if (h->model_id != d->model_id) return FILE_OTHER_MODEL;
  if (h->desc_len > MAX_DESC || (size_t)FIXED_HEADER + h->desc_len > n) return FILE_DAMAGED;
  h->desc = p + FIXED_HEADER;
  if (h->desc_len != d->desc_len || memcmp(h->desc, d->desc, d->desc_len) != 0) return FILE_OTHER_FORMAT;
  /* the descriptor holds the block size and row widths: the rest must follow from it */
  if (h->block_tokens != (uint32_t)d->B || h->header_len != d->header || h->payload != d->payload) return FILE_DAMAGED;
  if (n < d->header) return FILE_DAMAGED;
  h->tokens = p + FIXED_HEADER + h->desc_len;
  return FILE_OK;
}

static size_t header_bytes(uint32_t desc_len, int B) { return FIXED_HEADER + desc_len + 4 * (size_t)B; }

/* ---- reading the folder ---- */

typedef struct rejects {
  int64_t n[5];
  char first[5][300];
} rejects;

static void reject(kv_disk *d, rejects *r, verdict v, const char *name) {
  if (!r->n[v]++) snprintf(r->first[v], sizeof r->first[v], "%s", name);
  d->st.rejected++;
}

static void report_rejects(const kv_disk *d, const rejects *r) {
  static const char *const why[] = {"", "another format version", "another model", "another KV format",
                                    "damaged (short or unreadable)"};
  for (int v = 1; v < 5; v++)
    if (r->n[v])
      HLOG_WARN("KV store %s: %lld block file(s) ignored, %s (first: %s)%s", d->dir, (long long)r->n[v], why[v],
                r->first[v], v == FILE_DAMAGED ? "; removed" : "");
}

static bool ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && !strcmp(s + a - b, suffix);
}

static int scan(kv_disk *d, herr *err) {
  DIR *dir = opendir(d->dir);
  if (!dir) return herr_set(err, HEARTH_EIO, "KV store %s: %s", d->dir, strerror(errno));
  rejects r = {0};
  unsigned char *buf = malloc(d->header);
  if (!buf) {
    closedir(dir);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  struct dirent *de;
  while ((de = readdir(dir))) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", d->dir, de->d_name);
    if (!strncmp(de->d_name, ".tmp-", 5)) { /* a write that never finished */
      unlink(path);
      continue;
    }
    if (!ends_with(de->d_name, ".kvb")) continue;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat sb;
    ssize_t got = fstat(fd, &sb) == 0 ? pread(fd, buf, d->header, 0) : -1;
    close(fd);
    header h;
    verdict v = got < 0 ? FILE_DAMAGED : parse_header(d, buf, (size_t)got, &h);
    char want[32];
    if (v == FILE_OK) {
      snprintf(want, sizeof want, "%016llx.kvb", (unsigned long long)h.hash);
      if (strcmp(want, de->d_name) != 0 || (uint64_t)sb.st_size != d->header + d->payload || find(d, h.hash))
        v = FILE_DAMAGED;
    }
    if (v != FILE_OK) {
      reject(d, &r, v, de->d_name);
      if (v == FILE_DAMAGED) unlink(path);
      continue;
    }
    entry e = {.hash = h.hash, .parent = h.parent, .depth = (int32_t)h.depth, .bytes = (int64_t)sb.st_size,
               .used = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec};
    if (add_entry(d, &e)) {
      free(buf);
      closedir(dir);
      return herr_set(err, HEARTH_ENOMEM, "KV store %s: out of memory for its index", d->dir);
    }
  }
  free(buf);
  closedir(dir);
  report_rejects(d, &r);
  make_room(d, 0); /* a smaller bound than last time */
  return 0;
}

/* ---- the pool's hooks ---- */

static void touch(kv_disk *d, entry *e) {
  char path[4096];
  block_path(d, e->hash, path, sizeof path);
  e->used = now_ns();
  struct timespec ts[2] = {{.tv_nsec = UTIME_NOW}, {.tv_sec = e->used / 1000000000, .tv_nsec = e->used % 1000000000}};
  utimensat(AT_FDCWD, path, ts, 0);
}

static void touch(kv_disk *d, entry *e);

/* The pending slot of block (hash, parent), or NULL. Under mu. */
static wslot *queued(const kv_disk *d, uint64_t hash, uint64_t parent) {
  for (int i = 0; i < d->q_n; i++) {
    wslot *w = &d->q[(d->q_head + i) % d->q_cap];
    if (w->hash == hash && w->parent == parent) return w;
  }
  return NULL;
}

/* Queues block b of the pool (published) for the writer unless the store has
 * it or it waits already; one it has is marked used now when `refresh`. A
 * full queue drops the block (counted) unless `wait`, which waits for room.
 * Runs on the pool's thread. */
static int save_block(kv_disk *d, int32_t b, bool refresh, bool wait, herr *err) {
  kv_block_key k;
  if (!kv_pool_block_published(d->pool, b, &k)) return 0;
  if ((int64_t)(d->header + d->payload) > d->max_bytes) return 0;
  pthread_mutex_lock(&d->mu);
  entry *have = find(d, k.hash);
  if (have && have->parent == k.parent) {
    if (refresh) touch(d, have);
    pthread_mutex_unlock(&d->mu);
    return 0;
  }
  if (queued(d, k.hash, k.parent)) {
    pthread_mutex_unlock(&d->mu);
    return 0;
  }
  while (wait && d->q_n == d->q_cap) pthread_cond_wait(&d->cv, &d->mu);
  if (d->q_n == d->q_cap) {
    d->st.dropped++;
    pthread_mutex_unlock(&d->mu);
    return 0;
  }
  wslot *w = &d->q[(d->q_head + d->q_n) % d->q_cap]; /* free: the writer only takes pending slots */
  pthread_mutex_unlock(&d->mu);
  if (!w->img && !(w->img = malloc(d->header + d->payload))) return herr_set(err, HEARTH_ENOMEM, "KV store: out of memory");
  unsigned char *p = w->img;
  memset(p, 0, d->header);
  memcpy(p, MAGIC, 8);
  put32(p + 8, KV_DISK_VERSION);
  put32(p + 12, (uint32_t)d->header);
  put64(p + 16, d->model_id);
  put64(p + 24, k.hash);
  put64(p + 32, k.parent);
  put32(p + 40, (uint32_t)k.depth);
  put32(p + 44, (uint32_t)d->B);
  put64(p + 48, d->payload);
  put32(p + 64, d->desc_len);
  memcpy(p + FIXED_HEADER, d->desc, d->desc_len);
  for (int i = 0; i < d->B; i++) put32(p + FIXED_HEADER + d->desc_len + 4 * (size_t)i, (uint32_t)k.tokens[i]);
  int rc = kv_pool_block_read(d->pool, b, p + d->header, err); /* the copy the pool's thread waits for */
  if (rc) return rc;
  w->hash = k.hash, w->parent = k.parent, w->depth = k.depth;
  pthread_mutex_lock(&d->mu);
  d->q_n++;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
  return 0;
}

/* Writes the image of slot w to its file (a temporary file renamed into place). No lock held. */
static int write_image(kv_disk *d, wslot *w, herr *err) {
  size_t size = d->header + d->payload;
  unsigned char *p = w->img;
  put64(p + CHECKSUM_AT, file_checksum(p, size));
  char tmp[4096], path[4096];
  snprintf(tmp, sizeof tmp, "%s/.tmp-%ld-%llu", d->dir, (long)getpid(), (unsigned long long)d->tmp_seq++);
  block_path(d, w->hash, path, sizeof path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return herr_set(err, HEARTH_EIO, "KV store: %s: %s", tmp, strerror(errno));
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, p + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += (size_t)n;
  }
  bool ok = done == size;
  int e = ok ? 0 : errno;
  if (close(fd) != 0 && ok) ok = false, e = errno;
  if (ok && rename(tmp, path) != 0) ok = false, e = errno;
  if (!ok) {
    unlink(tmp);
    return herr_set(err, HEARTH_EIO, "KV store: writing %s: %s", path, strerror(e ? e : EIO));
  }
  return 0;
}

/* The writer thread: takes the queue's head, makes room under the bound,
 * writes the file, then indexes it and frees the slot in one step, so a
 * block is always found in the queue or in the index, never in neither. It
 * ends when stopped with the queue empty. */
static void *writer_main(void *arg) {
  kv_disk *d = arg;
  pthread_mutex_lock(&d->mu);
  for (;;) {
    while ((d->hold || !d->q_n) && !d->stop) pthread_cond_wait(&d->cv, &d->mu);
    if (!d->q_n) break; /* stopped, nothing left */
    wslot *w = &d->q[d->q_head];
    int64_t size = (int64_t)(d->header + d->payload);
    entry *have = find(d, w->hash);
    if (have) drop_entry(d, have); /* the same hash for another prefix: the newer one wins */
    make_room(d, size);
    pthread_mutex_unlock(&d->mu);
    herr e = {0};
    int rc = write_image(d, w, &e);
    if (rc) HLOG_WARN("KV store %s: a block was not saved: %s", d->dir, e.msg);
    pthread_mutex_lock(&d->mu);
    entry x = {.hash = w->hash, .parent = w->parent, .depth = w->depth, .bytes = size, .used = now_ns()};
    if (!rc && add_entry(d, &x)) {
      char path[4096];
      block_path(d, w->hash, path, sizeof path);
      unlink(path);
      HLOG_WARN("KV store %s: out of memory for its index; a block was not saved", d->dir);
    } else if (!rc) {
      d->st.saved++;
    }
    d->q_head = (d->q_head + 1) % d->q_cap;
    d->q_n--;
    pthread_cond_broadcast(&d->cv);
  }
  pthread_mutex_unlock(&d->mu);
  return NULL;
}

static void on_evict(void *user, kv_pool *p, int32_t b) {
  (void)p;
  kv_disk *d = user;
  herr e = {0};
  if (save_block(d, b, false, false, &e)) HLOG_WARN("KV store %s: a block was not saved: %s", d->dir, e.msg);
}

static bool on_has(void *user, uint64_t hash, uint64_t parent) {
  kv_disk *d = user;
  pthread_mutex_lock(&d->mu);
  entry *e = find(d, hash);
  bool has = (e && e->parent == parent) || queued(d, hash, parent);
  pthread_mutex_unlock(&d->mu);
  return has;
}

int kv_disk_parse_block(const kv_disk *d, const unsigned char *data, size_t size, kv_disk_block *out, herr *err) {
  static const char *const why[] = {"", "another format version", "another model", "another KV format",
                                    "a damaged header"};
  header h;
  verdict v = parse_header(d, data, size, &h);
  if (v != FILE_OK) return herr_set(err, HEARTH_EFORMAT, "KV block: %s", why[v]);
  if (size != d->header + d->payload)
    return herr_set(err, HEARTH_EFORMAT, "KV block: %zu bytes where its header says %zu", size, d->header + d->payload);
  if (file_checksum(data, size) != h.checksum) return herr_set(err, HEARTH_EFORMAT, "KV block: bad checksum");
  *out = (kv_disk_block){.hash = h.hash, .parent = h.parent, .depth = (int32_t)h.depth, .tokens = h.tokens,
                         .payload = data + d->header};
  return 0;
}

/* Reads the file at path into buf (cap bytes at most; a longer file is read short and
 * fails the size check after). */
static int read_file(const char *path, unsigned char *buf, size_t cap, size_t *got, herr *err) {
  *got = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return herr_set(err, HEARTH_EIO, "%s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size != cap) {
    close(fd);
    return herr_set(err, HEARTH_EFORMAT, "%s: not the size of a block file", path);
  }
  while (*got < cap) {
    ssize_t r = pread(fd, buf + *got, cap - *got, (off_t)*got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    *got += (size_t)r;
  }
  close(fd);
  return *got == cap ? 0 : herr_set(err, HEARTH_EIO, "%s: short read", path);
}

/* Holds mu for its whole length: the writer may not drop or rename under it. */
static int on_load(void *user, kv_pool *p, int32_t b, uint64_t hash, uint64_t parent, const int32_t *tokens) {
  kv_disk *d = user;
  pthread_mutex_lock(&d->mu);
  wslot *w = queued(d, hash, parent);
  if (w) { /* still waiting for the writer: read back from its image */
    herr err = {0};
    const unsigned char *tk = w->img + FIXED_HEADER + d->desc_len;
    int rc = 0;
    for (int i = 0; i < d->B && !rc; i++)
      if ((int32_t)get32(tk + 4 * (size_t)i) != tokens[i]) rc = -1; /* a hash collision */
    if (!rc && kv_pool_block_write(p, b, w->img + d->header, &err)) {
      HLOG_WARN("KV store %s: a queued block not loaded: %s", d->dir, err.msg);
      rc = -1;
    }
    if (!rc) d->st.loaded++;
    pthread_mutex_unlock(&d->mu);
    return rc;
  }
  entry *e = find(d, hash);
  if (!e || e->parent != parent) {
    pthread_mutex_unlock(&d->mu);
    return -1;
  }
  char path[4096];
  block_path(d, hash, path, sizeof path);
  hmmap m = {0};
  herr err = {0};
  const char *why = NULL;
  const unsigned char *data = NULL;
  size_t size = 0;
  /* the pool in host memory copies straight from the file's pages; a device's is uploaded
   * from a read into the store's buffer */
  if (d->host ? hmmap_open(&m, path, &err) == 0 : read_file(path, d->io, d->header + d->payload, &size, &err) == 0) {
    data = d->host ? m.data : d->io;
    size = d->host ? m.size : size;
  } else {
    why = err.msg;
  }
  if (data) {
    kv_disk_block k;
    if (kv_disk_parse_block(d, data, size, &k, &err)) why = err.msg;
    else if (k.hash != hash || k.parent != parent) why = "it holds another block";
    else {
      for (int i = 0; i < d->B && !why; i++)
        if ((int32_t)get32(k.tokens + 4 * (size_t)i) != tokens[i]) why = "its tokens differ (a hash collision)";
      if (!why && kv_pool_block_write(p, b, k.payload, &err)) why = err.msg;
    }
  }
  hmmap_close(&m);
  if (why) {
    HLOG_WARN("KV store %s: %016llx.kvb not loaded: %s; removed", d->dir, (unsigned long long)hash, why);
    d->st.rejected++;
    drop_entry(d, e);
    pthread_mutex_unlock(&d->mu);
    return -1;
  }
  touch(d, e);
  d->st.loaded++;
  pthread_mutex_unlock(&d->mu);
  return 0;
}

/* ---- public ---- */

int kv_disk_open(const char *dir, int64_t max_bytes, uint64_t model_id, kv_pool *p, kv_disk **out, herr *err) {
  *out = NULL;
  if (!dir || !dir[0]) return herr_set(err, HEARTH_EINVAL, "KV store: no folder given");
  if (mkdir(dir, 0755) != 0 && errno != EEXIST) return herr_set(err, HEARTH_EIO, "KV store %s: %s", dir, strerror(errno));
  if (!hfile_is_dir(dir)) return herr_set(err, HEARTH_EINVAL, "KV store %s: not a folder", dir);
  kv_disk *d = calloc(1, sizeof *d);
  if (!d) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  d->dir = strdup(dir);
  d->max_bytes = max_bytes > 0 ? max_bytes : KV_DISK_DEFAULT_MAX;
  d->model_id = model_id;
  d->pool = p;
  d->host = kv_pool_on_host(p);
  kv_pool_format(p, d->desc, sizeof d->desc);
  d->desc_len = (uint32_t)strlen(d->desc);
  d->B = kv_pool_block_tokens(p);
  d->payload = kv_pool_block_payload(p);
  d->header = header_bytes(d->desc_len, d->B);
  d->io = malloc(d->header + d->payload);
  size_t per = d->header + d->payload;
  d->q_cap = QUEUE_BYTES / per > 64 ? 64 : QUEUE_BYTES / per < 2 ? 2 : (int)(QUEUE_BYTES / per);
  d->q = calloc((size_t)d->q_cap, sizeof *d->q);
  pthread_mutex_init(&d->mu, NULL);
  pthread_cond_init(&d->cv, NULL);
  int rc = 0;
  if (!d->dir || !d->io || !d->q || rebuild_buckets(d)) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
  if (!rc) rc = scan(d, err);
  if (!rc && pthread_create(&d->writer, NULL, writer_main, d) != 0)
    rc = herr_set(err, HEARTH_EINTERNAL, "KV store %s: cannot start its writer thread", dir);
  if (!rc) d->writer_started = true;
  if (rc) {
    kv_disk_close(d);
    return rc;
  }
  kv_pool_set_spill(p, &(kv_pool_spill){.user = d, .evict = on_evict, .has = on_has, .load = on_load});
  HLOG_INFO("KV store %s: %lld blocks (%.1f MiB, at most %.1f MiB)", d->dir, (long long)d->st.files,
            (double)d->st.bytes / (1 << 20), (double)d->max_bytes / (1 << 20));
  *out = d;
  return 0;
}

int kv_disk_flush(kv_disk *d, herr *err) {
  if (!d) return 0;
  /* the most recently used blocks that fit the bound, written oldest first (so their files'
   * times keep the pool's order); a pool larger than the bound writes no more than it holds */
  int32_t *order = malloc(sizeof *order * (size_t)(kv_pool_blocks(d->pool) > 0 ? kv_pool_blocks(d->pool) : 1));
  if (!order) return herr_set(err, HEARTH_ENOMEM, "KV store: out of memory");
  int64_t n = kv_pool_published_by_use(d->pool, order), first = n, room = d->max_bytes;
  int64_t size = (int64_t)(d->header + d->payload);
  while (first > 0 && room >= size) {
    first--;
    room -= size;
  }
  pthread_mutex_lock(&d->mu);
  int64_t before = d->st.saved + d->q_n; /* what waits now is written by an earlier count */
  pthread_mutex_unlock(&d->mu);
  int rc = 0;
  for (int64_t i = first; i < n && !rc; i++) rc = save_block(d, order[i], true, true, err);
  free(order);
  kv_disk_sync(d);
  if (rc) return rc;
  HLOG_INFO("KV store %s: %lld blocks written at close; %lld blocks (%.1f MiB) stored", d->dir,
            (long long)(d->st.saved - before), (long long)d->st.files, (double)d->st.bytes / (1 << 20));
  return 0;
}

void kv_disk_sync(kv_disk *d) {
  if (!d) return;
  pthread_mutex_lock(&d->mu);
  while (d->q_n && !d->hold && d->writer_started) pthread_cond_wait(&d->cv, &d->mu);
  pthread_mutex_unlock(&d->mu);
}

void kv_disk_hold(kv_disk *d, bool hold) {
  pthread_mutex_lock(&d->mu);
  d->hold = hold;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
}

void kv_disk_close(kv_disk *d) {
  if (!d) return;
  if (d->pool) kv_pool_set_spill(d->pool, NULL);
  if (d->writer_started) { /* the writer empties the queue before it ends */
    pthread_mutex_lock(&d->mu);
    d->stop = true;
    d->hold = false;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->writer, NULL);
  }
  for (int i = 0; d->q && i < d->q_cap; i++) free(d->q[i].img);
  free(d->q);
  pthread_mutex_destroy(&d->mu);
  pthread_cond_destroy(&d->cv);
  free(d->dir);
  free(d->e);
  free(d->buckets);
  free(d->io);
  free(d);
}

void kv_disk_get_stats(kv_disk *d, kv_disk_stats *out) {
  pthread_mutex_lock(&d->mu);
  *out = d->st;
  out->pending = d->q_n;
  out->hit_tokens = d->st.loaded * d->B;
  pthread_mutex_unlock(&d->mu);
}

/* ---- the model's identity ---- */

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  uint64_t lane[4] = {h, h + 1, h + 2, h + 3};
  uint64_t t = checksum_update(lane, b, n);
  h = hmix64(h ^ hmix64(n) ^ t);
  for (int k = 0; k < 4; k++) h = hmix64(h ^ lane[k]);
  return h;
}

/* Size, the first 64 KiB and 16 windows of 4 KiB of the file at path. */
static int hash_file_sample(const char *path, uint64_t *h, herr *err) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return herr_set(err, HEARTH_EIO, "%s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    close(fd);
    return herr_set(err, HEARTH_EIO, "%s: %s", path, strerror(errno));
  }
  uint64_t size = (uint64_t)sb.st_size;
  *h = hmix64(*h ^ size);
  unsigned char *buf = malloc(65536);
  if (!buf) {
    close(fd);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  ssize_t n = pread(fd, buf, 65536, 0);
  if (n > 0) *h = hash_bytes(*h, buf, (size_t)n);
  for (int i = 0; i < 16 && size > 4096; i++) {
    off_t at = (off_t)((size - 4096) / 15 * (uint64_t)i);
    n = pread(fd, buf, 4096, at);
    if (n > 0) *h = hash_bytes(*h, buf, (size_t)n);
  }
  free(buf);
  close(fd);
  return 0;
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int kv_disk_model_identity(const char *path, const char *extra, uint64_t *out, herr *err) {
  uint64_t h = 0x4b5653544f5245ull; /* any fixed start */
  int rc = 0;
  if (!hfile_is_dir(path)) {
    rc = hash_file_sample(path, &h, err);
  } else {
    char *cfg = hpath_join(path, "config.json"), *text = NULL;
    size_t len = 0;
    if (!cfg) return herr_set(err, HEARTH_ENOMEM, "out of memory");
    rc = hfile_read(cfg, &text, &len, err);
    free(cfg);
    if (rc) return rc;
    h = hash_bytes(h, text, len);
    free(text);
    DIR *dir = opendir(path);
    if (!dir) return herr_set(err, HEARTH_EIO, "%s: %s", path, strerror(errno));
    char **names = NULL;
    int64_t n = 0, cap = 0;
    struct dirent *de;
    while (!rc && (de = readdir(dir))) {
      if (!ends_with(de->d_name, ".safetensors")) continue;
      char *s = strdup(de->d_name);
      if (!s || !HGROW(names, cap, n + 1)) {
        free(s);
        rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
      } else {
        names[n++] = s;
      }
    }
    closedir(dir);
    if (n > 1) qsort(names, (size_t)n, sizeof *names, cmp_names);
    for (int64_t i = 0; i < n; i++) {
      if (!rc) {
        h = hash_bytes(h, names[i], strlen(names[i]));
        char *f = hpath_join(path, names[i]);
        rc = f ? hash_file_sample(f, &h, err) : herr_set(err, HEARTH_ENOMEM, "out of memory");
        free(f);
      }
      free(names[i]);
    }
    free(names);
  }
  if (rc) return rc;
  if (extra) h = hash_bytes(h, extra, strlen(extra));
  *out = h;
  return 0;
}
