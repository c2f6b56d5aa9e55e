/* state.c — the state folder of a pipeline run (state.h): stage results as
 * JSON files under DIR/.hearth-memory/runs/<key>/, the commit the run
 * started from, and the content hash. Knows nothing of what the results hold. */
#include "memory/state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/json.h"
#include "memory/memory.h"

void mem_hash_hex(const void *data, size_t len, char out[17]) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (!EVP_Digest(data, len, md, &n, EVP_sha256(), NULL) || n < 8) memset(md, 0, 8);
  for (int i = 0; i < 8; i++) sprintf(out + 2 * i, "%02x", md[i]);
  out[16] = 0;
}

static int make_dir(const char *path, herr *err) {
  if (mkdir(path, 0755) && errno != EEXIST) return herr_set(err, HEARTH_EIO, "cannot create %s: %s", path, strerror(errno));
  return 0;
}

/* Removes a run folder: its files, then itself (run folders hold no folders). */
static void remove_run(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2]))) continue;
    char *p = hpath_join(dir, e->d_name);
    if (p) unlink(p);
    free(p);
  }
  if (d) closedir(d);
  rmdir(dir);
}

/* Removes every run folder under runs except keep (may be NULL). */
static void remove_runs(const char *runs, const char *keep) {
  DIR *d = opendir(runs);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.' || (keep && !strcmp(e->d_name, keep))) continue;
    char *p = hpath_join(runs, e->d_name);
    if (p) remove_run(p);
    free(p);
  }
  if (d) closedir(d);
}

static char *runs_dir(const char *wiki_dir) {
  char *state = hpath_join(wiki_dir, MEM_STATE_DIR), *runs = state ? hpath_join(state, "runs") : NULL;
  free(state);
  return runs;
}

static int write_file(const char *path, const char *text, herr *err) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) return herr_set(err, HEARTH_EIO, "cannot write %s: %s", tmp, strerror(errno));
  bool ok = fputs(text, f) >= 0;
  ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && ok;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path)) {
    unlink(tmp);
    return herr_set(err, HEARTH_EIO, "cannot write %s: %s", path, strerror(errno));
  }
  return 0;
}

/* Whether the run folder was made on commit base. */
static bool same_base(const char *dir, const char *base) {
  char *p = hpath_join(dir, "base"), *text = NULL;
  size_t len = 0;
  bool same = p && !hfile_read(p, &text, &len, NULL) && !strcmp(text, base);
  free(text);
  free(p);
  return same;
}

int mem_state_open(const char *wiki_dir, const char *key, const char *base, mem_state *st, bool *resumed, herr *err) {
  memset(st, 0, sizeof *st);
  *resumed = false;
  char *state = hpath_join(wiki_dir, MEM_STATE_DIR), *runs = runs_dir(wiki_dir);
  st->dir = runs ? hpath_join(runs, key) : NULL;
  int rc = !state || !st->dir ? herr_set(err, HEARTH_ENOMEM, "out of memory") : 0;
  if (!rc) rc = make_dir(state, err);
  if (!rc) rc = make_dir(runs, err);
  if (!rc) {
    remove_runs(runs, key);
    if (hfile_is_dir(st->dir) && !same_base(st->dir, base)) remove_run(st->dir);
    *resumed = hfile_is_dir(st->dir);
    rc = make_dir(st->dir, err);
  }
  char *bp = !rc ? hpath_join(st->dir, "base") : NULL;
  if (!rc && !*resumed) rc = bp ? write_file(bp, base, err) : herr_set(err, HEARTH_ENOMEM, "out of memory");
  free(bp);
  free(state);
  free(runs);
  if (rc) mem_state_close(st);
  return rc;
}

static char *stage_path(const mem_state *st, int stage) {
  char name[64];
  snprintf(name, sizeof name, "%d-%s.json", stage + 1, mem_stage_name(stage));
  return hpath_join(st->dir, name);
}

json_t *mem_state_load(const mem_state *st, int stage) {
  char *p = stage_path(st, stage);
  json_t *v = p && hfile_exists(p) ? hjson_load_file(p, NULL) : NULL;
  free(p);
  return v;
}

int mem_state_save(const mem_state *st, int stage, const json_t *result, herr *err) {
  char *p = stage_path(st, stage), *text = json_dumps(result, JSON_INDENT(1) | JSON_SORT_KEYS);
  int rc = p && text ? write_file(p, text, err) : herr_set(err, HEARTH_ENOMEM, "out of memory");
  free(text);
  free(p);
  return rc;
}

void mem_state_clear(const char *wiki_dir) {
  char *runs = runs_dir(wiki_dir);
  if (runs) {
    remove_runs(runs, NULL);
    rmdir(runs);
  }
  free(runs);
}

void mem_state_close(mem_state *st) {
  free(st->dir);
  st->dir = NULL;
}

int mem_state_lock(const char *wiki_dir, int *fd, herr *err) {
  *fd = -1;
  char *state = hpath_join(wiki_dir, MEM_STATE_DIR), *path = state ? hpath_join(state, "lock") : NULL;
  int rc = path ? make_dir(state, err) : herr_set(err, HEARTH_ENOMEM, "out of memory");
  if (!rc && (*fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0)
    rc = herr_set(err, HEARTH_EIO, "cannot open %s: %s", path, strerror(errno));
  if (!rc && flock(*fd, LOCK_EX | LOCK_NB)) {
    rc = herr_set(err, HEARTH_EINVAL, "%s: another hearth memory run is writing this wiki (it holds %s)", wiki_dir, path);
    close(*fd);
    *fd = -1;
  }
  free(path);
  free(state);
  return rc;
}

void mem_state_unlock(int fd) {
  if (fd >= 0) close(fd); /* the lock goes with the descriptor */
}
