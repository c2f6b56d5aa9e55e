/* test_kv_disk.c — the prefix cache on disk: blocks written at flush and at
 * eviction come back bit for bit into a new pool (after a "restart"), with
 * their chain (a prefix attaches across them); a store of another model,
 * KV format or format version is ignored and left in place; a short file is
 * removed when the folder is read, a file with a bad checksum when it is
 * read back (the prefix stops before it); the size bound removes the least
 * recently used files, and a flush under it writes the most recently used
 * blocks; the model identity follows config.json and the
 * weight files' contents, not their folder's name. Evicted blocks wait in
 * the writer thread's bounded queue, readable there; a full queue drops; the
 * close writes what waits; many evictions beside reads stay correct. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/kv_disk.h"
#include "engine/kv_paged.h"
#include "test.h"

#define B 4

/* three layers, the middle one sharing an earlier layer's rows (no arena) */
static model_kv_geometry geom(int64_t d0) {
  model_kv_geometry g = {0};
  g.n_layers = 3;
  g.kv_dim[0] = d0;
  g.kv_dim[1] = 0;
  g.kv_dim[2] = 8;
  return g;
}

static float value(int l, int kv, int32_t tok, int d) { return (float)(l * 100000 + kv * 50000 + tok * 16 + d) * 0.5f; }

/* Makes a sequence of n tokens whose rows hold value(...) of their token, publishes it, frees it. */
static void fill(kv_pool *p, const int32_t *toks, int64_t n) {
  herr e = {0};
  kv_seq *s;
  CHECK_EQ_INT(kv_paged_seq_new(p, 0, &s, &e), 0);
  CHECK_EQ_INT(s->ops->reserve(s, n, &e), 0);
  const int32_t *tbl;
  int64_t nb;
  const kv_store *st = s->ops->table(s, &tbl, &nb);
  for (int l = 0; l < st->n_layers; l++) {
    if (!st->k[l].cols) continue;
    for (int64_t r = 0; r < n; r++) {
      int64_t slot = tbl[r / B] * B + r % B;
      float *k = (float *)bk_addr(&st->k[l]) + slot * st->k[l].cols, *v = (float *)bk_addr(&st->v[l]) + slot * st->v[l].cols;
      for (int d = 0; d < st->k[l].cols; d++) k[d] = value(l, 0, toks[r], d), v[d] = value(l, 1, toks[r], d);
    }
  }
  s->ops->commit(s, n);
  kv_paged_seq_publish(s, toks, n, 0);
  kv_paged_seq_free(s);
}

/* Attaches toks[0..n) to a new sequence; checks the attached rows' values; returns the rows attached. */
static int64_t attach_check(kv_pool *p, const int32_t *toks, int64_t n) {
  herr e = {0};
  kv_seq *s;
  CHECK_EQ_INT(kv_paged_seq_new(p, 0, &s, &e), 0);
  int64_t hit = kv_paged_seq_attach_prefix(s, toks, n, 0);
  const int32_t *tbl;
  int64_t nb;
  const kv_store *st = s->ops->table(s, &tbl, &nb);
  int bad = 0;
  for (int l = 0; l < st->n_layers; l++) {
    if (!st->k[l].cols) continue;
    for (int64_t r = 0; r < hit; r++) {
      int64_t slot = tbl[r / B] * B + r % B;
      const float *k = (const float *)bk_addr(&st->k[l]) + slot * st->k[l].cols;
      const float *v = (const float *)bk_addr(&st->v[l]) + slot * st->v[l].cols;
      for (int d = 0; d < st->k[l].cols; d++) bad += k[d] != value(l, 0, toks[r], d) || v[d] != value(l, 1, toks[r], d);
    }
  }
  CHECK_EQ_INT(bad, 0);
  kv_paged_seq_free(s);
  return hit;
}

static char *temp_dir(void) {
  char tmpl[] = "/tmp/hearth-kvdisk-XXXXXX";
  char *d = mkdtemp(tmpl);
  return d ? strdup(d) : NULL;
}

static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *de;
  while (d && (de = readdir(d))) {
    if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2]))) continue;
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    unlink(p);
  }
  if (d) closedir(d);
  rmdir(dir);
}

static int count_files(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *de;
  int n = 0;
  while (d && (de = readdir(d))) n += strstr(de->d_name, ".kvb") != NULL;
  if (d) closedir(d);
  return n;
}

/* The path of the stored file of the block that ends toks[0..(depth+1)*B) (found by its tokens). */
static void block_file(const char *dir, kv_pool *p, const int32_t *toks, int depth, char *out, size_t cap) {
  herr e = {0};
  kv_seq *s;
  kv_paged_seq_new(p, 0, &s, &e);
  int64_t hit = kv_paged_seq_attach_prefix(s, toks, (int64_t)(depth + 1) * B + 1, 0);
  CHECK_EQ_INT(hit, (int64_t)(depth + 1) * B);
  kv_block_key k = {0};
  CHECK(kv_pool_block_published(p, kv_paged_seq_table(s)[depth], &k));
  snprintf(out, cap, "%s/%016llx.kvb", dir, (unsigned long long)k.hash);
  kv_paged_seq_free(s);
}

static void test_save_restore(void) {
  char *dir = temp_dir();
  CHECK(dir != NULL);
  model_kv_geometry g = geom(4);
  herr e = {0};
  int32_t toks[13];
  for (int i = 0; i < 13; i++) toks[i] = 7 + 3 * i;
  /* the first life: three full blocks and a partial one, written at flush */
  kv_pool *p;
  kv_disk *d;
  CHECK_EQ_INT(kv_pool_new(&g, B, 8, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, 0, 42, p, &d, &e), 0);
  fill(p, toks, 13);
  CHECK_EQ_INT(kv_disk_flush(d, &e), 0);
  kv_disk_stats st;
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.saved, 3);
  CHECK_EQ_INT(st.files, 3);
  CHECK_EQ_INT(count_files(dir), 3);
  /* a second flush writes nothing new */
  CHECK_EQ_INT(kv_disk_flush(d, &e), 0);
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.saved, 3);
  kv_disk_close(d);
  kv_pool_free(p);
  /* the second life: an empty pool finds the prefix on disk, values intact */
  CHECK_EQ_INT(kv_pool_new(&g, B, 8, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, 0, 42, p, &d, &e), 0);
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.files, 3);
  CHECK_EQ_INT(attach_check(p, toks, 13), 12);
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.loaded, 3);
  /* now in the pool: attaching again reads nothing */
  CHECK_EQ_INT(attach_check(p, toks, 13), 12);
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.loaded, 3);
  /* a prompt that differs in block 1 gets block 0 only */
  int32_t other[13];
  memcpy(other, toks, sizeof other);
  other[5] = 1;
  CHECK_EQ_INT(attach_check(p, other, 13), 4);
  kv_disk_close(d);
  kv_pool_free(p);
  remove_dir(dir);
  free(dir);
}

static void test_evicted_blocks_are_written(void) {
  char *dir = temp_dir();
  model_kv_geometry g = geom(4);
  herr e = {0};
  int32_t A[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, C[9] = {11, 12, 13, 14, 15, 16, 17, 18, 19};
  kv_pool *p;
  kv_disk *d;
  CHECK_EQ_INT(kv_pool_new(&g, B, 4, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, 0, 42, p, &d, &e), 0);
  fill(p, A, 8);
  fill(p, C, 8);
  /* a sequence that takes the whole pool evicts all four cached blocks: each written first */
  kv_seq *x;
  kv_paged_seq_new(p, 0, &x, &e);
  CHECK_EQ_INT(x->ops->reserve(x, 16, &e), 0);
  kv_disk_sync(d); /* written by the writer thread */
  kv_disk_stats st;
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.saved, 4);
  CHECK_EQ_INT(st.pending, 0);
  CHECK_EQ_INT(count_files(dir), 4);
  /* no room to read them back while x holds everything */
  CHECK_EQ_INT(attach_check(p, A, 9), 0);
  kv_paged_seq_free(x);
  CHECK_EQ_INT(attach_check(p, A, 9), 8);
  CHECK_EQ_INT(attach_check(p, C, 9), 8);
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.loaded, 4);
  CHECK_EQ_INT(st.saved, 4); /* blocks read back are not written again */
  kv_disk_close(d);
  kv_pool_free(p);
  remove_dir(dir);
  free(dir);
}

/* Writes a store of toks (3 blocks) for model 42 into dir. */
static void make_store(const char *dir, const int32_t *toks) {
  model_kv_geometry g = geom(4);
  herr e = {0};
  kv_pool *p;
  kv_disk *d;
  CHECK_EQ_INT(kv_pool_new(&g, B, 8, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, 0, 42, p, &d, &e), 0);
  fill(p, toks, 13);
  CHECK_EQ_INT(kv_disk_flush(d, &e), 0);
  kv_disk_close(d);
  kv_pool_free(p);
}

static void test_rejects(void) {
  char *dir = temp_dir();
  herr e = {0};
  int32_t toks[13];
  for (int i = 0; i < 13; i++) toks[i] = 100 + i;
  make_store(dir, toks);
  kv_pool *p;
  kv_disk *d;
  kv_disk_stats st;
  /* another model: nothing loads, nothing is removed */
  model_kv_geometry g = geom(4);
  CHECK_EQ_INT(kv_pool_new(&g, B, 8, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, 0, 43, p, &d, &e), 0);
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.files, 0);
  CHECK_EQ_INT(st.rejected, 3);
  CHECK_EQ_INT(attach_check(p, toks, 13), 0);
  kv_disk_close(d);
  kv_pool_free(p);
  CHECK_EQ_INT(count_files(dir), 3);
  /* another KV format (row widths; block size) */
  model_kv_geometry g6 = geom(6);
  CHECK_EQ_INT(kv_pool_new(&g6, B, 8, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, 0, 42, p, &d, &e), 0);
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.files, 0);
  CHECK_EQ_INT(st.rejected, 3);
  kv_disk_close(d);
  kv_pool_free(p);
  CHECK_EQ_INT(kv_pool_new(&g, 2 * B, 8, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, 0, 42, p, &d, &e), 0);
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.files, 0);
  kv_disk_close(d);
  kv_pool_free(p);
  CHECK_EQ_INT(count_files(dir), 3);
  /* find the three files by their blocks */
  char f0[4096], f1[4096], f2[4096];
  CHECK_EQ_INT(kv_pool_new(&g, B, 8, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, 0, 42, p, &d, &e), 0);
  block_file(dir, p, toks, 0, f0, sizeof f0);
  block_file(dir, p, toks, 1, f1, sizeof f1);
  block_file(dir, p, toks, 2, f2, sizeof f2);
  kv_disk_close(d);
  kv_pool_free(p);
  /* another format version in block 2's file: ignored, kept; the chain stops before it */
  int fd = open(f2, O_RDWR);
  CHECK(fd >= 0);
  unsigned char ver[4] = {KV_DISK_VERSION + 1, 0, 0, 0};
  CHECK_EQ_INT(pwrite(fd, ver, 4, 8), 4);
  close(fd);
  CHECK_EQ_INT(kv_pool_new(&g, B, 8, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, 0, 42, p, &d, &e), 0);
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.files, 2);
  CHECK_EQ_INT(st.rejected, 1);
  CHECK_EQ_INT(attach_check(p, toks, 13), 8);
  kv_disk_close(d);
  kv_pool_free(p);
  CHECK_EQ_INT(count_files(dir), 3);
  /* block 1 truncated: removed when the folder is read; block 0 still loads */
  struct stat sb;
  CHECK_EQ_INT(stat(f1, &sb), 0);
  CHECK_EQ_INT(truncate(f1, sb.st_size - 5), 0);
  CHECK_EQ_INT(kv_pool_new(&g, B, 8, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, 0, 42, p, &d, &e), 0);
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.files, 1);
  CHECK(access(f1, F_OK) != 0);
  CHECK_EQ_INT(attach_check(p, toks, 13), 4);
  kv_disk_close(d);
  kv_pool_free(p);
  /* block 0 with one payload byte flipped: its size is right, its checksum is not: not loaded, removed */
  fd = open(f0, O_RDWR);
  CHECK(fd >= 0);
  CHECK_EQ_INT(fstat(fd, &sb), 0);
  unsigned char byte;
  CHECK_EQ_INT(pread(fd, &byte, 1, sb.st_size - 3), 1);
  byte ^= 0x40;
  CHECK_EQ_INT(pwrite(fd, &byte, 1, sb.st_size - 3), 1);
  close(fd);
  CHECK_EQ_INT(kv_pool_new(&g, B, 8, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, 0, 42, p, &d, &e), 0);
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.files, 1);
  CHECK_EQ_INT(attach_check(p, toks, 13), 0);
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.files, 0);
  CHECK_EQ_INT(st.loaded, 0);
  CHECK(access(f0, F_OK) != 0);
  kv_pool_counts c;
  kv_pool_count(p, &c);
  CHECK_EQ_INT(c.free, 8); /* the block taken for it went back */
  kv_disk_close(d);
  kv_pool_free(p);
  remove_dir(dir);
  free(dir);
}

static void test_size_bound(void) {
  char *dir = temp_dir();
  model_kv_geometry g = geom(4);
  herr e = {0};
  int32_t toks[13];
  for (int i = 0; i < 13; i++) toks[i] = 50 + i;
  make_store(dir, toks);
  struct stat sb;
  DIR *dd = opendir(dir);
  struct dirent *de;
  int64_t one = 0;
  while ((de = readdir(dd)))
    if (strstr(de->d_name, ".kvb")) {
      char p[4096];
      snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
      CHECK_EQ_INT(stat(p, &sb), 0);
      one = sb.st_size;
    }
  closedir(dd);
  CHECK(one > 0);
  /* reopened with room for two blocks: one goes at once */
  kv_pool *p;
  kv_disk *d;
  CHECK_EQ_INT(kv_pool_new(&g, B, 8, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, 2 * one + one / 2, 42, p, &d, &e), 0);
  kv_disk_stats st;
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.files, 2);
  CHECK_EQ_INT(st.removed, 1);
  CHECK_EQ_INT(count_files(dir), 2);
  /* more blocks written: still two files */
  int32_t more[13];
  for (int i = 0; i < 13; i++) more[i] = 500 + i;
  fill(p, more, 13);
  CHECK_EQ_INT(kv_disk_flush(d, &e), 0);
  kv_disk_get_stats(d, &st);
  CHECK(st.bytes <= 2 * one + one / 2);
  CHECK_EQ_INT(count_files(dir), 2);
  kv_disk_close(d);
  kv_pool_free(p);
  remove_dir(dir);
  free(dir);
}

/* A flush under a bound smaller than the pool's cache keeps the most recently used blocks. */
static void test_flush_keeps_recent(void) {
  char *dir = temp_dir();
  model_kv_geometry g = geom(4);
  herr e = {0};
  int32_t A[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, C[9] = {11, 12, 13, 14, 15, 16, 17, 18, 19};
  kv_pool *p;
  kv_disk *d;
  CHECK_EQ_INT(kv_pool_new(&g, B, 8, &p, &e), 0);
  size_t one = 0;
  {
    kv_disk *probe;
    char *tmp = temp_dir();
    CHECK_EQ_INT(kv_disk_open(tmp, 0, 42, p, &probe, &e), 0);
    fill(p, A, 8);
    CHECK_EQ_INT(kv_disk_flush(probe, &e), 0);
    kv_disk_stats st;
    kv_disk_get_stats(probe, &st);
    one = (size_t)(st.bytes / st.files);
    kv_disk_close(probe);
    remove_dir(tmp);
    free(tmp);
  }
  fill(p, C, 8); /* released after A: more recent */
  CHECK_EQ_INT(kv_disk_open(dir, (int64_t)(2 * one), 42, p, &d, &e), 0);
  CHECK_EQ_INT(kv_disk_flush(d, &e), 0);
  kv_disk_stats st;
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.saved, 2);
  CHECK_EQ_INT(st.removed, 0);
  kv_disk_close(d);
  kv_pool_free(p);
  CHECK_EQ_INT(kv_pool_new(&g, B, 8, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, (int64_t)(2 * one), 42, p, &d, &e), 0);
  CHECK_EQ_INT(attach_check(p, C, 9), 8);
  CHECK_EQ_INT(attach_check(p, A, 9), 0);
  kv_disk_close(d);
  kv_pool_free(p);
  remove_dir(dir);
  free(dir);
}

/* Evicted blocks wait in the writer's queue: found and read back from there
 * before any file exists, written when the writer runs; closing the store
 * writes what is still queued. */
static void test_queue(void) {
  char *dir = temp_dir();
  model_kv_geometry g = geom(4);
  herr e = {0};
  int32_t A[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, C[9] = {11, 12, 13, 14, 15, 16, 17, 18, 19};
  kv_pool *p;
  kv_disk *d;
  CHECK_EQ_INT(kv_pool_new(&g, B, 4, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, 0, 42, p, &d, &e), 0);
  kv_disk_hold(d, true);
  fill(p, A, 8);
  fill(p, C, 8);
  kv_seq *x;
  kv_paged_seq_new(p, 0, &x, &e);
  CHECK_EQ_INT(x->ops->reserve(x, 16, &e), 0);
  kv_disk_stats st;
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.pending, 4);
  CHECK_EQ_INT(st.saved, 0);
  CHECK_EQ_INT(count_files(dir), 0);
  kv_paged_seq_free(x);
  CHECK_EQ_INT(attach_check(p, A, 9), 8); /* from the queue's images */
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.loaded, 2);
  CHECK_EQ_INT(st.hit_tokens, 2 * B);
  CHECK_EQ_INT(count_files(dir), 0);
  kv_disk_hold(d, false);
  kv_disk_sync(d);
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.pending, 0);
  CHECK_EQ_INT(st.saved, 4);
  CHECK_EQ_INT(count_files(dir), 4);
  CHECK_EQ_INT(attach_check(p, C, 9), 8); /* C's blocks from their files */
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.loaded, 4);
  kv_disk_close(d);
  kv_pool_free(p);
  remove_dir(dir);
  /* held until the close: the close writes them all */
  CHECK_EQ_INT(kv_pool_new(&g, B, 4, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, 0, 42, p, &d, &e), 0);
  kv_disk_hold(d, true);
  fill(p, A, 8);
  fill(p, C, 8);
  kv_paged_seq_new(p, 0, &x, &e);
  CHECK_EQ_INT(x->ops->reserve(x, 16, &e), 0);
  CHECK_EQ_INT(count_files(dir), 0);
  kv_disk_close(d);
  CHECK_EQ_INT(count_files(dir), 4);
  kv_paged_seq_free(x);
  kv_pool_free(p);
  CHECK_EQ_INT(kv_pool_new(&g, B, 4, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, 0, 42, p, &d, &e), 0);
  CHECK_EQ_INT(attach_check(p, A, 9), 8);
  CHECK_EQ_INT(attach_check(p, C, 9), 8);
  kv_disk_close(d);
  kv_pool_free(p);
  remove_dir(dir);
  free(dir);
}

/* A full queue drops what it cannot hold (counted) rather than wait: 80
 * blocks evicted at once into a queue of 64. */
static void test_queue_full(void) {
  char *dir = temp_dir();
  model_kv_geometry g = geom(4);
  herr e = {0};
  kv_pool *p;
  kv_disk *d;
  CHECK_EQ_INT(kv_pool_new(&g, B, 80, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, 0, 42, p, &d, &e), 0);
  kv_disk_hold(d, true);
  for (int i = 0; i < 20; i++) {
    int32_t t[16];
    for (int j = 0; j < 16; j++) t[j] = 1000 * (i + 1) + j;
    fill(p, t, 16);
  }
  kv_seq *x;
  kv_paged_seq_new(p, 0, &x, &e);
  CHECK_EQ_INT(x->ops->reserve(x, 80 * B, &e), 0);
  kv_disk_stats st;
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.pending, 64);
  CHECK_EQ_INT(st.dropped, 16);
  kv_disk_close(d);
  CHECK_EQ_INT(count_files(dir), 64);
  kv_paged_seq_free(x);
  kv_pool_free(p);
  remove_dir(dir);
  free(dir);
}

/* Many evictions while prompts keep asking for earlier prefixes: each read
 * back (from the pool, the queue or a file, whichever has it as the writer
 * runs) holds the right values; nothing is rejected; after the close every
 * block evicted and not dropped is a file. */
static void test_concurrent_evictions(void) {
  char *dir = temp_dir();
  model_kv_geometry g = geom(4);
  herr e = {0};
  kv_pool *p;
  kv_disk *d;
  CHECK_EQ_INT(kv_pool_new(&g, B, 6, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, 0, 42, p, &d, &e), 0);
  enum { N = 300 };
  int64_t hits = 0;
  for (int i = 0; i < N; i++) {
    int32_t t[9];
    for (int j = 0; j < 9; j++) t[j] = 10 * i + j + 1;
    fill(p, t, 8);
    if (i % 8 == 0) nanosleep(&(struct timespec){.tv_nsec = 200000}, NULL); /* lets the writer run on a busy machine */
    if (i >= 4) {
      int k = i - 4 + (i % 3);
      for (int j = 0; j < 9; j++) t[j] = 10 * k + j + 1;
      int64_t hit = attach_check(p, t, 9);
      CHECK(hit == 0 || hit == 4 || hit == 8);
      hits += hit;
    }
  }
  kv_disk_stats st;
  kv_disk_get_stats(d, &st);
  CHECK_EQ_INT(st.rejected, 0);
  CHECK(hits > 0);
  kv_disk_close(d);
  kv_disk_stats first;
  kv_pool_free(p);
  /* a new life finds every block evicted and not dropped (all but the pool's last 6) */
  CHECK_EQ_INT(kv_pool_new(&g, B, 2 * N + 2, &p, &e), 0);
  CHECK_EQ_INT(kv_disk_open(dir, 0, 42, p, &d, &e), 0);
  kv_disk_get_stats(d, &first);
  CHECK_MSG(first.files >= 2 * N - 6 - st.dropped && first.files <= 2 * N, "files %lld, dropped %lld",
            (long long)first.files, (long long)st.dropped);
  CHECK(first.files > 0);
  int found = 0;
  for (int i = 0; i < N; i++) {
    int32_t t[9];
    for (int j = 0; j < 9; j++) t[j] = 10 * i + j + 1;
    found += attach_check(p, t, 9) == 8;
  }
  CHECK_MSG(found >= N - 3 - (int)st.dropped, "%d of %d prompts found, %lld blocks dropped", found, N,
            (long long)st.dropped);
  kv_disk_close(d);
  kv_pool_free(p);
  remove_dir(dir);
  free(dir);
}

static void write_file(const char *dir, const char *name, const char *text, size_t n) {
  char p[4096];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "wb");
  CHECK(f != NULL);
  fwrite(text, 1, n, f);
  fclose(f);
}

static void test_model_identity(void) {
  char *a = temp_dir(), *b = temp_dir();
  herr e = {0};
  static char weights[200000];
  for (size_t i = 0; i < sizeof weights; i++) weights[i] = (char)(i * 7 + i / 1000);
  write_file(a, "config.json", "{\"model_type\": \"llama\"}", 23);
  write_file(a, "model.safetensors", weights, sizeof weights);
  write_file(b, "config.json", "{\"model_type\": \"llama\"}", 23);
  write_file(b, "model.safetensors", weights, sizeof weights);
  uint64_t ia, ib, ic;
  CHECK_EQ_INT(kv_disk_model_identity(a, "device=cpu", &ia, &e), 0);
  CHECK_EQ_INT(kv_disk_model_identity(b, "device=cpu", &ib, &e), 0);
  CHECK(ia == ib); /* another folder, the same contents */
  CHECK_EQ_INT(kv_disk_model_identity(b, "device=cuda", &ic, &e), 0);
  CHECK(ia != ic);
  weights[10] ^= 1; /* the first 64 KiB (a safetensors file's tensor index): hashed whole */
  write_file(b, "model.safetensors", weights, sizeof weights);
  CHECK_EQ_INT(kv_disk_model_identity(b, "device=cpu", &ib, &e), 0);
  CHECK(ia != ib);
  weights[10] ^= 1;
  write_file(b, "model.safetensors", weights, sizeof weights);
  write_file(b, "config.json", "{\"model_type\": \"qwen3\"}", 23);
  CHECK_EQ_INT(kv_disk_model_identity(b, "device=cpu", &ib, &e), 0);
  CHECK(ia != ib);
  CHECK(kv_disk_model_identity("/nonexistent/hearth", NULL, &ib, &e) != 0);
  remove_dir(a);
  remove_dir(b);
  free(a);
  free(b);
}

int main(void) {
  RUN(test_save_restore);
  RUN(test_evicted_blocks_are_written);
  RUN(test_rejects);
  RUN(test_size_bound);
  RUN(test_flush_keeps_recent);
  RUN(test_queue);
  RUN(test_queue_full);
  RUN(test_concurrent_evictions);
  RUN(test_model_identity);
  TEST_MAIN_END();
}
