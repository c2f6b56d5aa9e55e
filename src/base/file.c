/* file.c — mmap'd files and whole-file reads (see file.h). */
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int hmmap_open(hmmap *m, const char *path, herr *err) {
  m->data = NULL;
  m->size = 0;
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
  if (st.st_size > 0) {
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      close(fd);
      return herr_set(err, HEARTH_EIO, "%s: mmap failed: %s", path, strerror(e));
    }
    m->data = p;
    m->size = (size_t)st.st_size;
  }
  close(fd);
  return 0;
}

void hmmap_close(hmmap *m) {
  if (m && m->data) munmap((void *)m->data, m->size);
  if (m) {
    m->data = NULL;
    m->size = 0;
  }
}

int hfile_read(const char *path, char **out, size_t *len, herr *err) {
  *out = NULL;
  if (len) *len = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return herr_set(err, errno == ENOENT ? HEARTH_ENOTFOUND : HEARTH_EIO, "%s: %s", path, strerror(errno));
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap + 1);
  if (!buf) {
    fclose(f);
    return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", path);
  }
  for (;;) {
    if (n == cap) {
      cap *= 2;
      char *nb = realloc(buf, cap + 1);
      if (!nb) {
        free(buf);
        fclose(f);
        return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", path);
      }
      buf = nb;
    }
    size_t r = fread(buf + n, 1, cap - n, f);
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
