/* file.c — mmap'd files, whole-file reads and copies (see file.h). */
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/vec.h"

/* Reads fd (n bytes) into fresh anonymous memory aligned to 2 MiB. */
static int read_resident(hmmap *m, int fd, size_t n, const char *path, herr *err) {
  const size_t huge = (size_t)2 << 20;
  size_t mapped = n + huge;
  void *base = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return herr_set(err, HEARTH_ENOMEM, "%s: cannot allocate %zu bytes: %s", path, n, strerror(errno));
  unsigned char *p = (unsigned char *)(((uintptr_t)base + huge - 1) & ~(uintptr_t)(huge - 1));
#ifdef MADV_HUGEPAGE
  madvise(p, n, MADV_HUGEPAGE); /* advice only: without THP the copy still works */
#endif
  size_t off = 0;
  while (off < n) {
    size_t want = n - off > ((size_t)1 << 26) ? ((size_t)1 << 26) : n - off;
    ssize_t r = pread(fd, p + off, want, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int e = r < 0 ? errno : 0;
      munmap(base, mapped);
      return herr_set(err, HEARTH_EIO, "%s: read failed at byte %zu: %s", path, off, e ? strerror(e) : "file shrank");
    }
    off += (size_t)r;
  }
  mprotect(p, n, PROT_READ);
  m->data = p;
  m->size = n;
  m->base = base;
  m->mapped = mapped;
  return 0;
}

int hmmap_open(hmmap *m, const char *path, herr *err) { return hmmap_open_mode(m, path, HMMAP_MAP, err); }

int hmmap_open_mode(hmmap *m, const char *path, int mode, herr *err) {
  memset(m, 0, sizeof *m);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return herr_set(err, errno == ENOENT ? HEARTH_ENOTFOUND : HEARTH_EIO, "%s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return herr_set(err, HEARTH_EIO, "%s: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return herr_set(err, HEARTH_EIO, "%s: not a regular file", path);
  }
  if (st.st_size > 0 && mode == HMMAP_RESIDENT) {
    int rc = read_resident(m, fd, (size_t)st.st_size, path, err);
    close(fd);
    return rc;
  }
  if (st.st_size > 0) {
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      close(fd);
      return herr_set(err, HEARTH_EIO, "%s: mmap failed: %s", path, strerror(e));
    }
    m->data = p;
    m->size = (size_t)st.st_size;
    m->base = p;
    m->mapped = m->size;
  }
  close(fd);
  return 0;
}

void hmmap_close(hmmap *m) {
  if (m && m->base) munmap(m->base, m->mapped);
  if (m) memset(m, 0, sizeof *m);
}

void hmmap_drop(const void *p, size_t n) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = ((uintptr_t)p + page - 1) / page * page, b = ((uintptr_t)p + n) / page * page;
  if (p && b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

int hfile_read(const char *path, char **out, size_t *len, herr *err) {
  *out = NULL;
  if (len) *len = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return herr_set(err, errno == ENOENT ? HEARTH_ENOTFOUND : HEARTH_EIO, "%s: %s", path, strerror(errno));
  size_t cap = 0, n = 0; /* cap: bytes allocated, one kept for the NUL */
  char *buf = NULL;
  if (!HGROW(buf, cap, (1 << 16) + 1)) {
    fclose(f);
    return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", path);
  }
  for (;;) {
    if (n + 1 == cap && !HGROW(buf, cap, cap + 1)) {
      free(buf);
      fclose(f);
      return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", path);
    }
    size_t r = fread(buf + n, 1, cap - 1 - n, f);
    n += r;
    if (r == 0) break;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(buf);
    return herr_set(err, HEARTH_EIO, "%s: read error", path);
  }
  buf[n] = 0;
  *out = buf;
  if (len) *len = n;
  return 0;
}

int hfile_copy(const char *from, const char *to, herr *err) {
  char *data = NULL;
  size_t len = 0;
  int rc = hfile_read(from, &data, &len, err);
  if (rc) return rc;
  FILE *f = fopen(to, "wb");
  if (!f) rc = herr_set(err, HEARTH_EIO, "%s: cannot create: %s", to, strerror(errno));
  else {
    if (fwrite(data, 1, len, f) != len) rc = herr_set(err, HEARTH_EIO, "%s: write failed", to);
    if (fclose(f) && !rc) rc = herr_set(err, HEARTH_EIO, "%s: write failed", to);
  }
  free(data);
  return rc;
}

bool hfile_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

bool hfile_is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

char *hpath_join(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  while (la > 1 && a[la - 1] == '/') la--;
  char *s = malloc(la + lb + 2);
  if (!s) return NULL;
  memcpy(s, a, la);
  s[la] = '/';
  memcpy(s + la + 1, b, lb + 1);
  return s;
}

char *hpath_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return strdup(".");
  if (slash == path) return strdup("/");
  return strndup(path, (size_t)(slash - path));
}
