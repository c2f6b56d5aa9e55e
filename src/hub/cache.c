/* cache.c — the Hugging Face cache on disk, laid out exactly as
 * huggingface_hub lays it out (the rules are in hub.h): where it is, which
 * commit a revision names, the snapshot's relative symlinks into blobs/, refs,
 * which model file a snapshot gives, and the blobs no snapshot uses. Knows no
 * HTTP and nothing of model formats beyond file names. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/dict.h"
#include "base/file.h"
#include "hub/hub.h"

static char *dup_printf(const char *a, const char *b, const char *c) {
  size_t n = strlen(a) + strlen(b) + strlen(c) + 1;
  char *s = malloc(n);
  if (s) snprintf(s, n, "%s%s%s", a, b, c);
  return s;
}

char *hub_cache_root(void) {
  const char *e = getenv("HF_HUB_CACHE");
  if (e && *e) return strdup(e);
  e = getenv("HF_HOME");
  if (e && *e) return hpath_join(e, "hub");
  e = getenv("HOME");
  return dup_printf(e && *e ? e : ".", "/.cache/huggingface/hub", "");
}

char *hub_repo_dir(const char *root, const char *repo) {
  char name[600] = "models--";
  size_t k = strlen(name);
  for (const char *p = repo; *p && k + 3 < sizeof name; p++) {
    if (*p == '/') {
      name[k++] = '-';
      name[k++] = '-';
    } else name[k++] = *p;
  }
  name[k] = 0;
  return hpath_join(root, name);
}

bool hub_repo_from_dir(const char *dirname, char *out, size_t cap) {
  if (strncmp(dirname, "models--", 8)) return false;
  const char *s = dirname + 8, *sep = strstr(s, "--");
  if (!sep || sep == s || !sep[2] || strlen(s) >= cap) return false;
  snprintf(out, cap, "%.*s/%s", (int)(sep - s), s, sep + 2);
  return true;
}

static bool is_commit(const char *s) {
  if (strlen(s) != 40) return false;
  for (const char *p = s; *p; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return false;
  return true;
}

int hub_cache_commit(const char *repo_dir, const char *revision, char **commit, herr *err) {
  *commit = NULL;
  char *ref = dup_printf(repo_dir, "/refs/", revision);
  char *text = NULL;
  size_t n = 0;
  if (ref && hfile_exists(ref) && !hfile_read(ref, &text, &n, NULL)) {
    while (n && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' ')) text[--n] = 0;
    free(ref);
    if (!is_commit(text)) {
      int rc = herr_set(err, HEARTH_EFORMAT, "%s/refs/%s does not hold a commit hash", repo_dir, revision);
      free(text);
      return rc;
    }
    *commit = text;
    return 0;
  }
  free(ref);
  if (is_commit(revision)) {
    char *snap = dup_printf(repo_dir, "/snapshots/", revision);
    bool there = snap && hfile_is_dir(snap);
    free(snap);
    if (there) return (*commit = strdup(revision)) ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  return herr_set(err, HEARTH_ENOTFOUND, "revision '%s' is not in the cache %s", revision, repo_dir);
}

static bool ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && !strcmp(s + a - b, suf);
}

int hub_snapshot_model(const char *snapshot, const char *quant, char **path, herr *err) {
  *path = NULL;
  DIR *d = opendir(snapshot);
  if (!d) return herr_set(err, HEARTH_ENOTFOUND, "%s: no such snapshot folder", snapshot);
  char best[NAME_MAX + 1] = "", first[NAME_MAX + 1] = "";
  int ngguf = 0;
  bool has_config = false;
  struct dirent *e;
  while ((e = readdir(d))) {
    const char *nm = e->d_name;
    if (!strcmp(nm, "config.json")) has_config = true;
    if (!ends_with(nm, ".gguf") || !strncasecmp(nm, "mmproj", 6) || hub_gguf_is_later_shard(nm)) continue;
    char *full = hpath_join(snapshot, nm);
    bool ok = full && hfile_exists(full); /* a dangling link is a file not fetched */
    free(full);
    if (!ok) continue;
    ngguf++;
    if (!first[0] || strcmp(nm, first) < 0) snprintf(first, sizeof first, "%s", nm);
    const char *tag = quant && *quant ? quant : "Q4_K_M";
    if (hub_name_has_quant(nm, tag) && (!best[0] || strcmp(nm, best) < 0)) snprintf(best, sizeof best, "%s", nm);
  }
  closedir(d);
  if (quant && *quant) {
    if (!best[0]) return herr_set(err, HEARTH_ENOTFOUND, "%s holds no GGUF file with the tag %s", snapshot, quant);
    *path = hpath_join(snapshot, best);
  } else if (ngguf && !has_config) {
    *path = hpath_join(snapshot, best[0] ? best : first);
  } else if (has_config) {
    *path = strdup(snapshot);
  } else {
    return herr_set(err, HEARTH_ENOTFOUND, "%s holds no config.json and no GGUF file", snapshot);
  }
  return *path ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
}

/* mkdir -p of the folders above path's last part. */
static int make_parents(const char *path, herr *err) {
  char buf[PATH_MAX];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
    return herr_set(err, HEARTH_ELIMIT, "%s: path too long", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(buf, 0755) && errno != EEXIST) {
      int e = errno;
      *p = '/';
      return herr_set(err, HEARTH_EIO, "cannot make the folder %.*s: %s", (int)(p - buf), buf, strerror(e));
    }
    *p = '/';
  }
  return 0;
}

int hub_cache_link(const char *repo_dir, const char *commit, const char *rfilename, const char *blob_id, herr *err) {
  char link[PATH_MAX], target[PATH_MAX];
  if (snprintf(link, sizeof link, "%s/snapshots/%s/%s", repo_dir, commit, rfilename) >= (int)sizeof link)
    return herr_set(err, HEARTH_ELIMIT, "%s: path too long", rfilename);
  /* os.path.relpath(blob, dirname(link)): up out of each folder of rfilename, then snapshots/<commit> */
  size_t k = 0;
  target[0] = 0;
  for (const char *p = rfilename; (p = strchr(p, '/')); p++) k += (size_t)snprintf(target + k, sizeof target - k, "../");
  snprintf(target + k, sizeof target - k, "../../blobs/%s", blob_id);
  int rc = make_parents(link, err);
  if (rc) return rc;
  if (unlink(link) && errno != ENOENT) return herr_set(err, HEARTH_EIO, "cannot replace %s: %s", link, strerror(errno));
  if (symlink(target, link)) return herr_set(err, HEARTH_EIO, "cannot link %s to %s: %s", link, target, strerror(errno));
  return 0;
}

int hub_cache_write_ref(const char *repo_dir, const char *revision, const char *commit, herr *err) {
  if (!strcmp(revision, commit)) return 0;
  char path[PATH_MAX], tmp[PATH_MAX + 8];
  snprintf(path, sizeof path, "%s/refs/%s", repo_dir, revision);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int rc = make_parents(path, err);
  if (rc) return rc;
  FILE *f = fopen(tmp, "w");
  if (!f) return herr_set(err, HEARTH_EIO, "cannot write %s: %s", tmp, strerror(errno));
  bool ok = fputs(commit, f) >= 0;
  ok &= fclose(f) == 0;
  if (!ok || rename(tmp, path)) {
    unlink(tmp);
    return herr_set(err, HEARTH_EIO, "cannot write %s: %s", path, strerror(errno));
  }
  return 0;
}

/* Adds the blob names the symlinks under dir point at to used. */
static void collect_links(const char *dir, hdict *used) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char *p = hpath_join(dir, e->d_name);
    if (!p) continue;
    struct stat st;
    if (!lstat(p, &st)) {
      if (S_ISLNK(st.st_mode)) {
        char t[PATH_MAX];
        ssize_t n = readlink(p, t, sizeof t - 1);
        if (n > 0) {
          t[n] = 0;
          const char *b = strrchr(t, '/');
          b = b ? b + 1 : t;
          hdict_put(used, b, strlen(b), 1);
        }
      } else if (S_ISDIR(st.st_mode)) {
        collect_links(p, used);
      }
    }
    free(p);
  }
  closedir(d);
}

int hub_cache_gc_repo(const char *repo_dir, int *nremoved, int64_t *bytes, herr *err) {
  hdict used;
  hdict_init(&used);
  char *snaps = hpath_join(repo_dir, "snapshots"), *blobs = hpath_join(repo_dir, "blobs");
  int rc = 0;
  if (!snaps || !blobs) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto done;
  }
  collect_links(snaps, &used);
  DIR *d = opendir(blobs);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      int64_t v;
      if (e->d_name[0] == '.' || hdict_gets(&used, e->d_name, &v)) continue;
      char *p = hpath_join(blobs, e->d_name);
      struct stat st;
      if (p && !lstat(p, &st) && S_ISREG(st.st_mode)) {
        if (unlink(p)) rc = herr_set(err, HEARTH_EIO, "cannot remove %s: %s", p, strerror(errno));
        else {
          (*nremoved)++;
          *bytes += st.st_size;
        }
      }
      free(p);
    }
    closedir(d);
  }
done:
  free(snaps);
  free(blobs);
  hdict_free(&used);
  return rc;
}

int hub_remove_tree(const char *path, herr *err) {
  struct stat st;
  if (lstat(path, &st)) return errno == ENOENT ? 0 : herr_set(err, HEARTH_EIO, "%s: %s", path, strerror(errno));
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(path);
    if (!d) return herr_set(err, HEARTH_EIO, "cannot open %s: %s", path, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      char *p = hpath_join(path, e->d_name);
      rc = p ? hub_remove_tree(p, err) : herr_set(err, HEARTH_ENOMEM, "out of memory");
      free(p);
    }
    closedir(d);
    if (rc) return rc;
    if (rmdir(path)) return herr_set(err, HEARTH_EIO, "cannot remove %s: %s", path, strerror(errno));
    return 0;
  }
  if (unlink(path)) return herr_set(err, HEARTH_EIO, "cannot remove %s: %s", path, strerror(errno));
  return 0;
}

static int64_t tree_bytes(const char *path, hdict *seen) {
  struct stat st;
  if (stat(path, &st)) return 0;
  if (S_ISREG(st.st_mode)) {
    char key[64];
    int n = snprintf(key, sizeof key, "%llu:%llu", (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
    int64_t v;
    if (hdict_get(seen, key, (size_t)n, &v)) return 0;
    hdict_put(seen, key, (size_t)n, 1);
    return st.st_size;
  }
  if (!S_ISDIR(st.st_mode)) return 0;
  DIR *d = opendir(path);
  if (!d) return 0;
  int64_t sum = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char *p = hpath_join(path, e->d_name);
    if (p) sum += tree_bytes(p, seen);
    free(p);
  }
  closedir(d);
  return sum;
}

int64_t hub_tree_bytes(const char *path) {
  hdict seen;
  hdict_init(&seen);
  int64_t n = tree_bytes(path, &seen);
  hdict_free(&seen);
  return n;
}
