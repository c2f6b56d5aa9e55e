/* revision.c — hub ids (ORG/NAME[@REVISION][:QUANT]) and the Hub's revision
 * listing (GET /api/models/{id}/revision/{rev}?blobs=true) read into a list of
 * files. Owns: the checks that keep an untrusted listing from naming a path
 * outside the snapshot or a blob that is not a hash. Knows no HTTP. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "base/dict.h"
#include "hub/hub.h"

static bool is_hex(const char *s, size_t n) {
  if (strlen(s) != n) return false;
  for (size_t i = 0; i < n; i++)
    if (!isxdigit((unsigned char)s[i])) return false;
  return true;
}

/* A part of a repo id: letters, digits, '-', '_', '.', not "." or ".." and not starting with '-' or '.'. */
static bool id_part_ok(const char *s, size_t n) {
  if (n == 0 || n > 96 || s[0] == '-' || s[0] == '.') return false;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (!isalnum(c) && c != '-' && c != '_' && c != '.') return false;
  }
  return !(n >= 2 && s[n - 1] == '.' && s[n - 2] == '.');
}

int hub_ref_parse(const char *s, hub_ref *out, herr *err) {
  memset(out, 0, sizeof *out);
  const char *slash = strchr(s, '/');
  const char *name = slash ? slash + 1 : NULL;
  size_t nlen = name ? strcspn(name, "@:") : 0;
  if (!slash || memchr(name, '/', nlen))
    return herr_set(err, HEARTH_EINVAL, "'%s' is not a Hub id: expected ORG/NAME, ORG/NAME@REVISION or ORG/NAME:QUANT", s);
  if (!id_part_ok(s, (size_t)(slash - s)) || !id_part_ok(name, nlen))
    return herr_set(err, HEARTH_EINVAL, "'%s' is not a Hub id: ORG and NAME are letters, digits, '-', '_' and '.'", s);
  snprintf(out->repo, sizeof out->repo, "%.*s", (int)(slash - s + 1 + nlen), s);
  const char *p = name + nlen;
  snprintf(out->revision, sizeof out->revision, "main");
  if (*p == '@') {
    p++;
    size_t rlen = strcspn(p, ":");
    if (!rlen || rlen >= sizeof out->revision)
      return herr_set(err, HEARTH_EINVAL, "'%s': the revision after '@' is empty or too long", s);
    snprintf(out->revision, sizeof out->revision, "%.*s", (int)rlen, p);
    for (size_t i = 0; i < rlen; i++)
      if (p[i] == '.' && i + 1 < rlen && p[i + 1] == '.')
        return herr_set(err, HEARTH_EINVAL, "'%s': a revision may not hold '..'", s);
    p += rlen;
  }
  if (*p == ':') {
    p++;
    size_t qlen = strlen(p);
    if (!qlen || qlen >= sizeof out->quant)
      return herr_set(err, HEARTH_EINVAL, "'%s': the quant tag after ':' is empty or too long", s);
    for (size_t i = 0; i < qlen; i++)
      if (!isalnum((unsigned char)p[i]) && p[i] != '_' && p[i] != '-')
        return herr_set(err, HEARTH_EINVAL, "'%s': a quant tag is letters, digits, '_' and '-' (Q4_K_M)", s);
    snprintf(out->quant, sizeof out->quant, "%s", p);
  }
  return 0;
}

void hub_ref_format(const hub_ref *r, char *out, size_t cap) {
  bool main_rev = !strcmp(r->revision, "main");
  snprintf(out, cap, "%s%s%s%s%s", r->repo, main_rev ? "" : "@", main_rev ? "" : r->revision, r->quant[0] ? ":" : "",
           r->quant);
}

/* A listed file name stays inside the snapshot: relative, '/'-separated, no empty, "." or ".." parts. */
static bool rfilename_ok(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > 1024 || s[0] == '/' || strchr(s, '\\')) return false;
  const char *p = s;
  for (;;) {
    size_t k = strcspn(p, "/");
    if (k == 0 || (k == 1 && p[0] == '.') || (k == 2 && p[0] == '.' && p[1] == '.')) return false;
    for (size_t i = 0; i < k; i++)
      if ((unsigned char)p[i] < 0x20) return false;
    if (!p[k]) return true;
    p += k + 1;
  }
}

void hub_revision_free(hub_revision *r) {
  if (!r) return;
  for (size_t i = 0; i < r->n; i++) {
    free(r->files[i].name);
    free(r->files[i].blob_id);
    free(r->files[i].sha256);
  }
  free(r->files);
  free(r->commit);
  memset(r, 0, sizeof *r);
}

static char *lower_dup(const char *s) {
  char *d = strdup(s);
  if (d)
    for (char *p = d; *p; p++) *p = (char)tolower((unsigned char)*p);
  return d;
}

int hub_revision_parse(const char *text, size_t len, hub_revision *out, herr *err) {
  memset(out, 0, sizeof *out);
  json_t *root = hjson_load_buf(text, len, "the Hub's revision listing", err);
  if (!root) return err ? err->code : HEARTH_EFORMAT;
  int rc = 0;
  const char *sha = NULL;
  hdict names;
  hdict_init(&names);
  json_t *sib = json_is_object(root) ? json_object_get(root, "siblings") : NULL;
  if (!json_is_object(root) || (rc = hjson_get_str(root, "sha", true, &sha, "the Hub's revision listing", err))) {
    if (!rc) rc = herr_set(err, HEARTH_EFORMAT, "the Hub's revision listing is not a JSON object");
    goto done;
  }
  if (!is_hex(sha, 40)) {
    rc = herr_set(err, HEARTH_EFORMAT, "the Hub's revision listing: \"sha\" '%.60s' is not a 40-digit commit hash", sha);
    goto done;
  }
  if (!json_is_array(sib)) {
    rc = herr_set(err, HEARTH_EFORMAT, "the Hub's revision listing has no \"siblings\" array of files");
    goto done;
  }
  size_t n = json_array_size(sib);
  if (n > 1000000) {
    rc = herr_set(err, HEARTH_ELIMIT, "the Hub's revision listing names %zu files, more than 1000000", n);
    goto done;
  }
  out->commit = lower_dup(sha);
  out->files = calloc(n ? n : 1, sizeof *out->files);
  if (!out->commit || !out->files) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory reading the Hub's revision listing");
    goto done;
  }
  for (size_t i = 0; i < n; i++) {
    json_t *f = json_array_get(sib, i);
    const char *name = NULL, *blob = NULL, *sha256 = NULL;
    int64_t size = -1, lfs_size = -1;
    char what[64];
    snprintf(what, sizeof what, "the Hub's listing, file %zu", i);
    if (!json_is_object(f)) {
      rc = herr_set(err, HEARTH_EFORMAT, "%s is not an object", what);
      goto done;
    }
    if ((rc = hjson_get_str(f, "rfilename", true, &name, what, err)) ||
        (rc = hjson_get_str(f, "blobId", false, &blob, what, err)) ||
        (rc = hjson_get_int(f, "size", false, &size, what, err)))
      goto done;
    if (!rfilename_ok(name)) {
      rc = herr_set(err, HEARTH_EFORMAT, "%s: name '%.200s' is not a relative path inside the repository", what, name);
      goto done;
    }
    json_t *lfs = json_object_get(f, "lfs");
    if (lfs && !json_is_null(lfs)) {
      if (!json_is_object(lfs)) {
        rc = herr_set(err, HEARTH_EFORMAT, "%s (%s): \"lfs\" is not an object", what, name);
        goto done;
      }
      if ((rc = hjson_get_str(lfs, "sha256", true, &sha256, name, err)) ||
          (rc = hjson_get_int(lfs, "size", false, &lfs_size, name, err)))
        goto done;
      if (!is_hex(sha256, 64)) {
        rc = herr_set(err, HEARTH_EFORMAT, "%s: LFS sha256 '%.80s' is not 64 hex digits", name, sha256);
        goto done;
      }
      if (lfs_size >= 0) size = lfs_size;
    }
    if (blob && !is_hex(blob, 40)) {
      rc = herr_set(err, HEARTH_EFORMAT, "%s: blobId '%.80s' is not a 40-digit git hash", name, blob);
      goto done;
    }
    if (size < -1 || size > ((int64_t)1 << 50)) {
      rc = herr_set(err, HEARTH_EFORMAT, "%s: size %lld is out of range", name, (long long)size);
      goto done;
    }
    hub_file *hf = &out->files[out->n++];
    hf->size = size;
    hf->name = strdup(name);
    hf->blob_id = blob ? lower_dup(blob) : NULL;
    hf->sha256 = sha256 ? lower_dup(sha256) : NULL;
    if (!hf->name || (blob && !hf->blob_id) || (sha256 && !hf->sha256)) {
      rc = herr_set(err, HEARTH_ENOMEM, "out of memory reading the Hub's revision listing");
      goto done;
    }
    int64_t seen;
    if (hdict_gets(&names, name, &seen)) {
      rc = herr_set(err, HEARTH_EFORMAT, "the Hub's listing names '%.200s' twice", name);
      goto done;
    }
    if (!hdict_put(&names, name, strlen(name), (int64_t)i)) {
      rc = herr_set(err, HEARTH_ENOMEM, "out of memory reading the Hub's revision listing");
      goto done;
    }
  }
done:
  hdict_free(&names);
  json_decref(root);
  if (rc) hub_revision_free(out);
  return rc;
}
