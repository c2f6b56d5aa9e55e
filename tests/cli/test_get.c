/* End-to-end tests of `hearth get`, `ls`, `scan`, `rm`, `gc` and `--model`
 * by name, with no network: a stand-in for the Hugging Face Hub runs in this
 * process (libmicrohttpd, two daemons: the Hub and a "CDN" on another port)
 * and speaks the Hub's shape —
 *   GET /api/models/ORG/NAME/revision/REV?blobs=true   {"sha", "siblings": [{"rfilename",
 *       "size", "blobId", "lfs": {"sha256", "size", "pointerSize"}}]}
 *   GET|HEAD /ORG/NAME/resolve/REV/FILE   LFS files: 302 to the CDN with X-Linked-Etag
 *       (the sha256) and X-Linked-Size; other files: 200 with ETag (the git blob sha1)
 *   GET /cdn/ORG/NAME/FILE on the CDN   Range: bytes=N- answered 206
 * — and misbehaves on purpose: the first listing of tiny/llama is a 503, its
 * model.safetensors is cut off half way the first time, tiny/gated answers 401
 * without "Authorization: Bearer sekrit", tiny/corrupt's weights never match
 * their sha256, and one file is listed without blobId (its ETag names it).
 * The model served is tests/fixtures/golden/llama-f32 with the byte-level
 * tokenizer of tests/fixtures/engine.
 *
 * The cache layout checked is huggingface_hub's (file_download.py), written
 * down here as the rules the test compares against:
 *   models--ORG--NAME/refs/main                  the commit, 40 hex, no newline
 *   models--ORG--NAME/blobs/<sha256>             an LFS file's bytes
 *   models--ORG--NAME/blobs/<git blob sha1>      any other file's bytes (its ETag)
 *   models--ORG--NAME/snapshots/<commit>/F       symlink "../../blobs/<id>"
 *   models--ORG--NAME/snapshots/<commit>/D/F     symlink "../../../blobs/<id>"
 *   nothing else (a fetch in progress: blobs/<id>.incomplete, gone when done).
 * A cache made by hand with these rules (other/handmade) is run by hearth,
 * which is how a model fetched by huggingface-cli is found. */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>
#include <openssl/evp.h>

#include "base/file.h"
#include "test.h"

#define LLAMA HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-f32"
#define ENGINE HEARTH_SOURCE_DIR "/tests/fixtures/engine"

static char tmpdir[] = "/tmp/hearth_get_XXXXXX";
static char cache[600];

/* ---- the stand-in Hub ---- */

typedef struct sfile {
  const char *name;
  char *data; /* owned */
  size_t len;
  bool lfs, no_blob_id, corrupt;
  char sha256[65], sha1[41];
} sfile;

typedef struct srepo {
  const char *id;
  const char *commit;
  sfile files[12];
  int n;
  bool gated;
} srepo;

static srepo repos[8];
static int nrepos;
static int hub_port, cdn_port;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int listing_calls, drop_left; /* first tiny/llama listing: 503; drops of tiny/llama's weights left */
static int cdn_gets[8][12];          /* per repo and file */
static long long last_range[8][12];  /* the start of the last Range asked, -1: none */

static void hex(const unsigned char *md, int n, char *out) {
  for (int i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", md[i]);
}

static void hash_file(sfile *f) {
  unsigned char md[32];
  unsigned int n;
  EVP_Digest(f->data, f->len, md, &n, EVP_sha256(), NULL);
  hex(md, 32, f->sha256);
  /* git's blob id: sha1("blob <size>\0" + bytes) */
  EVP_MD_CTX *c = EVP_MD_CTX_new();
  char head[64];
  int hl = snprintf(head, sizeof head, "blob %zu", f->len) + 1;
  EVP_DigestInit_ex(c, EVP_sha1(), NULL);
  EVP_DigestUpdate(c, head, (size_t)hl);
  EVP_DigestUpdate(c, f->data, f->len);
  EVP_DigestFinal_ex(c, md, &n);
  EVP_MD_CTX_free(c);
  hex(md, 20, f->sha1);
}

static void add_file(srepo *r, const char *name, const char *from, const char *text, bool lfs) {
  sfile *f = &r->files[r->n++];
  f->name = name;
  f->lfs = lfs;
  if (from) {
    if (hfile_read(from, &f->data, &f->len, NULL)) {
      fprintf(stderr, "cannot read %s\n", from);
      exit(1);
    }
  } else {
    f->data = strdup(text);
    f->len = strlen(text);
  }
  hash_file(f);
}

static srepo *add_llama(const char *id, const char *commit) {
  srepo *r = &repos[nrepos++];
  r->id = id;
  r->commit = commit;
  add_file(r, "config.json", LLAMA "/config.json", NULL, false);
  add_file(r, "generation_config.json", LLAMA "/generation_config.json", NULL, false);
  r->files[r->n - 1].no_blob_id = true;
  add_file(r, "tokenizer.json", ENGINE "/tokenizer.json", NULL, false);
  add_file(r, "tokenizer_config.json", ENGINE "/tokenizer_config.json", NULL, false);
  add_file(r, "model.safetensors", LLAMA "/model.safetensors", NULL, true);
  add_file(r, "original/consolidated.pth", NULL, "not a runtime file: the original checkpoint", true);
  add_file(r, "pytorch_model.bin", NULL, "pickled weights, not fetched beside safetensors", true);
  add_file(r, "onnx/model.onnx", NULL, "another format", true);
  add_file(r, "README.md", NULL, "# tiny llama\n", false);
  return r;
}

static void make_repos(void) {
  add_llama("tiny/llama", "1111111111111111111111111111111111111111");
  add_llama("tiny/llama2", "2222222222222222222222222222222222222222");
  add_llama("tiny/resume", "3333333333333333333333333333333333333333");
  add_llama("tiny/gated", "4444444444444444444444444444444444444444")->gated = true;
  srepo *c = add_llama("tiny/corrupt", "5555555555555555555555555555555555555555");
  c->files[4].corrupt = true;
  srepo *g = &repos[nrepos++];
  g->id = "tiny/gguf";
  g->commit = "6666666666666666666666666666666666666666";
  add_file(g, "tiny-Q4_K_M.gguf", NULL, "GGUF q4_k_m bytes", true);
  add_file(g, "tiny-Q8_0.gguf", NULL, "GGUF q8_0 bytes", true);
  add_file(g, "tiny-F16-00001-of-00002.gguf", NULL, "GGUF f16 part one", true);
  add_file(g, "tiny-F16-00002-of-00002.gguf", NULL, "GGUF f16 part two", true);
  add_file(g, "mmproj-F16.gguf", NULL, "GGUF projector", true);
  add_file(g, "README.md", NULL, "# tiny gguf\n", false);
}

static srepo *find_repo(const char *id, size_t n) {
  for (int i = 0; i < nrepos; i++)
    if (strlen(repos[i].id) == n && !strncmp(repos[i].id, id, n)) return &repos[i];
  return NULL;
}

static sfile *find_file(srepo *r, const char *name) {
  for (int i = 0; i < r->n; i++)
    if (!strcmp(r->files[i].name, name)) return &r->files[i];
  return NULL;
}

static enum MHD_Result answer(struct MHD_Connection *c, unsigned status, const char *body) {
  struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
  enum MHD_Result rc = MHD_queue_response(c, status, resp);
  MHD_destroy_response(resp);
  return rc;
}

static bool authorized(struct MHD_Connection *c, const srepo *r) {
  if (!r->gated) return true;
  const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
  return a && !strcmp(a, "Bearer sekrit");
}

/* "ORG/NAME/rest": the repo and *rest, or NULL. */
static srepo *split_repo(const char *p, const char **rest) {
  const char *s1 = strchr(p, '/');
  const char *s2 = s1 ? strchr(s1 + 1, '/') : NULL;
  if (!s2) return NULL;
  *rest = s2 + 1;
  return find_repo(p, (size_t)(s2 - p));
}

static enum MHD_Result on_hub(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_len, void **state) {
  (void)cls, (void)version, (void)upload, (void)upload_len, (void)state;
  const char *rest;
  if (!strncmp(url, "/api/models/", 12)) {
    srepo *r = split_repo(url + 12, &rest);
    if (!r || strncmp(rest, "revision/", 9)) return answer(c, 404, "{\"error\":\"Repository not found\"}");
    if (!authorized(c, r)) return answer(c, 401, "{\"error\":\"Access to model is restricted\"}");
    const char *blobs = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "blobs");
    if (!blobs || strcmp(blobs, "true")) return answer(c, 400, "{\"error\":\"ask with blobs=true\"}");
    pthread_mutex_lock(&mu);
    bool fail = !strcmp(r->id, "tiny/llama") && listing_calls++ == 0;
    pthread_mutex_unlock(&mu);
    if (fail) return answer(c, 503, "{\"error\":\"try again\"}");
    json_t *o = json_object(), *sib = json_array();
    json_object_set_new(o, "id", json_string(r->id));
    json_object_set_new(o, "sha", json_string(r->commit));
    for (int i = 0; i < r->n; i++) {
      sfile *f = &r->files[i];
      json_t *s = json_object();
      json_object_set_new(s, "rfilename", json_string(f->name));
      json_object_set_new(s, "size", json_integer((json_int_t)f->len));
      if (!f->no_blob_id) json_object_set_new(s, "blobId", json_string(f->sha1));
      if (f->lfs)
        json_object_set_new(s, "lfs", json_pack("{s:s, s:I, s:i}", "sha256", f->sha256, "size", (json_int_t)f->len,
                                                "pointerSize", 134));
      json_array_append_new(sib, s);
    }
    json_object_set_new(o, "siblings", sib);
    char *text = json_dumps(o, 0);
    json_decref(o);
    enum MHD_Result rc = answer(c, 200, text);
    free(text);
    return rc;
  }
  srepo *r = split_repo(url + 1, &rest);
  if (!r || strncmp(rest, "resolve/", 8)) return answer(c, 404, "Entry not found");
  if (!authorized(c, r)) return answer(c, 401, "Access to model is restricted");
  const char *name = strchr(rest + 8, '/');
  sfile *f = name ? find_file(r, name + 1) : NULL;
  if (!f) return answer(c, 404, "Entry not found");
  struct MHD_Response *resp;
  unsigned status;
  char etag[80];
  if (f->lfs) {
    char loc[600], size[32];
    snprintf(loc, sizeof loc, "http://127.0.0.1:%d/cdn/%s/%s", cdn_port, r->id, f->name);
    snprintf(etag, sizeof etag, "\"%s\"", f->sha256);
    snprintf(size, sizeof size, "%zu", f->len);
    resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(resp, "Location", loc);
    MHD_add_response_header(resp, "X-Linked-Etag", etag);
    MHD_add_response_header(resp, "X-Linked-Size", size);
    status = 302;
  } else {
    snprintf(etag, sizeof etag, "\"%s\"", f->sha1);
    resp = MHD_create_response_from_buffer(f->len, f->data, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(resp, "ETag", etag);
    status = 200;
  }
  MHD_add_response_header(resp, "X-Repo-Commit", r->commit);
  (void)method;
  enum MHD_Result rc = MHD_queue_response(c, status, resp);
  MHD_destroy_response(resp);
  return rc;
}

typedef struct body {
  const sfile *f;
  size_t start, stop; /* bytes [start, stop) then end; stop < len: the connection is dropped */
} body;

static ssize_t read_body(void *cls, uint64_t pos, char *buf, size_t max) {
  body *b = cls;
  size_t at = b->start + (size_t)pos;
  if (at >= b->stop) return b->stop < b->f->len ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
  size_t n = b->stop - at < max ? b->stop - at : max;
  memcpy(buf, b->f->data + at, n);
  if (b->f->corrupt)
    for (size_t i = 0; i < n; i++)
      if (at + i == 100) buf[i] ^= 0x55;
  return (ssize_t)n;
}

static enum MHD_Result on_cdn(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_len, void **state) {
  (void)cls, (void)version, (void)upload, (void)upload_len, (void)state, (void)method;
  const char *rest;
  srepo *r = strncmp(url, "/cdn/", 5) ? NULL : split_repo(url + 5, &rest);
  sfile *f = r ? find_file(r, rest) : NULL;
  if (!f) return answer(c, 404, "NoSuchKey");
  int ri = (int)(r - repos), fi = (int)(f - r->files);
  const char *range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range");
  long long start = 0;
  if (range && sscanf(range, "bytes=%lld-", &start) != 1) start = 0;
  if (start < 0 || (size_t)start > f->len) return answer(c, 416, "Range Not Satisfiable");
  body *b = malloc(sizeof *b);
  b->f = f;
  b->start = (size_t)start;
  b->stop = f->len;
  pthread_mutex_lock(&mu);
  cdn_gets[ri][fi]++;
  last_range[ri][fi] = range ? start : -1;
  if (!strcmp(r->id, "tiny/llama") && !strcmp(f->name, "model.safetensors") && drop_left > 0) {
    drop_left--;
    b->stop = f->len / 2; /* the connection dies half way */
  }
  pthread_mutex_unlock(&mu);
  struct MHD_Response *resp = MHD_create_response_from_callback(f->len - b->start, 16384, read_body, b, free);
  char etag[80];
  snprintf(etag, sizeof etag, "\"%s\"", f->sha256);
  MHD_add_response_header(resp, "ETag", etag);
  MHD_add_response_header(resp, "Accept-Ranges", "bytes");
  unsigned status = 200;
  if (range) {
    char cr[96];
    snprintf(cr, sizeof cr, "bytes %lld-%zu/%zu", start, f->len ? f->len - 1 : 0, f->len);
    MHD_add_response_header(resp, "Content-Range", cr);
    status = 206;
  }
  enum MHD_Result rc = MHD_queue_response(c, status, resp);
  MHD_destroy_response(resp);
  return rc;
}

static struct MHD_Daemon *start(MHD_AccessHandlerCallback fn, int *port) {
  struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                                              MHD_USE_ERROR_LOG,
                                          0, NULL, NULL, fn, NULL, MHD_OPTION_END);
  if (!d) return NULL;
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  *port = info ? info->port : 0;
  return d;
}

/* ---- running hearth ---- */

typedef struct run_result {
  int status;
  char *out, *err; /* owned */
} run_result;

static char *slurp(const char *path) {
  char *s = NULL;
  size_t n;
  if (hfile_read(path, &s, &n, NULL)) return strdup("");
  return s;
}

static void run_free(run_result *r) {
  free(r->out);
  free(r->err);
}

static run_result run_hearth(const char *const *args) {
  run_result r = {-1, NULL, NULL};
  char outp[700], errp[700];
  snprintf(outp, sizeof outp, "%s/.stdout", tmpdir);
  snprintf(errp, sizeof errp, "%s/.stderr", tmpdir);
  char *argv[40];
  int n = 0;
  argv[n++] = (char *)HEARTH_BINARY;
  for (int i = 0; args[i] && n < 39; i++) argv[n++] = (char *)args[i];
  argv[n] = NULL;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    int in = open("/dev/null", O_RDONLY);
    int o = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || o < 0 || e < 0) _exit(126);
    dup2(in, 0);
    dup2(o, 1);
    dup2(e, 2);
    execv(argv[0], argv);
    _exit(127);
  }
  int st = 0;
  if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st)) r.status = WEXITSTATUS(st);
  r.out = slurp(outp);
  r.err = slurp(errp);
  if (r.status != 0 && getenv("HEARTH_TEST_VERBOSE")) fprintf(stderr, "[%s] %s\n", args[0], r.err);
  return r;
}

/* ---- the cache as found on disk ---- */

static char *repo_path(const char *repo, const char *rest) {
  static char p[4][1200];
  static int k;
  char dir[300];
  snprintf(dir, sizeof dir, "%s", repo);
  char *s = strchr(dir, '/');
  if (s) *s = 0;
  char *out = p[k++ % 4];
  snprintf(out, 1200, "%s/models--%s--%s%s%s", cache, dir, s ? s + 1 : "", rest ? "/" : "", rest ? rest : "");
  return out;
}

static char *link_of(const char *path) {
  static char t[1200];
  ssize_t n = readlink(path, t, sizeof t - 1);
  t[n > 0 ? n : 0] = 0;
  return t;
}

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

static bool same_bytes(const char *path, const sfile *f) {
  char *s = NULL;
  size_t n = 0;
  bool ok = !hfile_read(path, &s, &n, NULL) && n == f->len && !memcmp(s, f->data, n);
  free(s);
  return ok;
}

/* Checks that repo r's snapshot holds exactly the files named in want (NULL-ended), laid out by the rules above. */
static void check_layout(const srepo *r, const char *const *want) {
  char *ref = slurp(repo_path(r->id, "refs/main"));
  CHECK_EQ_STR(ref, r->commit);
  free(ref);
  char snap[200];
  snprintf(snap, sizeof snap, "snapshots/%s", r->commit);
  int nwant = 0, ntop = 0;
  for (; want[nwant]; nwant++) {
    const sfile *f = find_file((srepo *)r, want[nwant]);
    char rel[400], target[200];
    snprintf(rel, sizeof rel, "%s/%s", snap, f->name);
    int depth = 0;
    for (const char *p = f->name; (p = strchr(p, '/')); p++) depth++;
    snprintf(target, sizeof target, "%s../../blobs/%s", depth ? "../" : "", f->lfs ? f->sha256 : f->sha1);
    CHECK_EQ_STR(link_of(repo_path(r->id, rel)), target);
    CHECK_MSG(same_bytes(repo_path(r->id, rel), f), "%s: bytes differ", f->name);
    if (!depth) ntop++;
  }
  CHECK_EQ_INT(count_entries(repo_path(r->id, "blobs")), nwant);
  (void)ntop;
}

static const char *const llama_files[] = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                          "model.safetensors", NULL};

static void test_get_layout(void) {
  srepo *r = &repos[0];
  const char *a[] = {"get", "tiny/llama", NULL};
  run_result g = run_hearth(a);
  CHECK_MSG(g.status == 0, "%s", g.err);
  char snap[700];
  snprintf(snap, sizeof snap, "%s\n", repo_path(r->id, "snapshots/1111111111111111111111111111111111111111"));
  CHECK_EQ_STR(g.out, snap);
  CHECK_EQ_INT(listing_calls, 2);                 /* the 503 was retried */
  CHECK_EQ_INT(cdn_gets[0][4], 2);                /* the weights: cut off, then continued */
  CHECK_EQ_INT(last_range[0][4], (long long)r->files[4].len / 2);
  check_layout(r, llama_files);
  CHECK(count_entries(repo_path(r->id, "snapshots/1111111111111111111111111111111111111111")) == 5);
  run_free(&g);

  /* again: everything is there, nothing is fetched */
  g = run_hearth(a);
  CHECK_EQ_INT(g.status, 0);
  CHECK_EQ_INT(cdn_gets[0][4], 2);
  run_free(&g);

  /* --include: a file in a folder, linked one level deeper */
  const char *b[] = {"get", "tiny/llama", "--include", "original/*", NULL};
  g = run_hearth(b);
  CHECK_MSG(g.status == 0, "%s", g.err);
  const char *const with_orig[] = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                   "model.safetensors", "original/consolidated.pth", NULL};
  check_layout(r, with_orig);
  run_free(&g);
}

static void test_get_resume(void) {
  srepo *r = &repos[2];
  const sfile *w = &r->files[4];
  char part[1200];
  snprintf(part, sizeof part, "%s/%s.incomplete", repo_path(r->id, "blobs"), w->sha256);
  mkdir(repo_path(r->id, NULL), 0755);
  mkdir(repo_path(r->id, "blobs"), 0755);
  FILE *f = fopen(part, "wb");
  fwrite(w->data, 1, 1000, f);
  fclose(f);
  const char *a[] = {"get", "tiny/resume", "--jobs", "1", NULL};
  run_result g = run_hearth(a);
  CHECK_MSG(g.status == 0, "%s", g.err);
  CHECK_EQ_INT(last_range[2][4], 1000);
  CHECK_EQ_INT(cdn_gets[2][4], 1);
  CHECK(!hfile_exists(part));
  check_layout(r, llama_files);
  run_free(&g);
}

static void test_get_refusals(void) {
  /* bytes that never match their sha256: fetched twice, then an error naming the file */
  const char *a[] = {"get", "tiny/corrupt", NULL};
  run_result g = run_hearth(a);
  CHECK_EQ_INT(g.status, 1);
  CHECK_MSG(strstr(g.err, "model.safetensors") && strstr(g.err, "sha256") && strstr(g.err, "fetched twice"), "%s", g.err);
  CHECK_EQ_INT(cdn_gets[4][4], 2);
  char blob[1200];
  snprintf(blob, sizeof blob, "%s/%s", repo_path("tiny/corrupt", "blobs"), repos[4].files[4].sha256);
  CHECK(!hfile_exists(blob));
  run_free(&g);

  /* gated: 401 says to set HF_TOKEN; with the token it comes */
  const char *b[] = {"get", "tiny/gated", NULL};
  g = run_hearth(b);
  CHECK_EQ_INT(g.status, 1);
  CHECK_MSG(strstr(g.err, "gated") && strstr(g.err, "HF_TOKEN") && strstr(g.err, "401"), "%s", g.err);
  run_free(&g);
  setenv("HF_TOKEN", "wrong", 1);
  g = run_hearth(b);
  CHECK_EQ_INT(g.status, 1);
  CHECK_MSG(strstr(g.err, "HF_TOKEN"), "%s", g.err);
  run_free(&g);
  setenv("HF_TOKEN", "sekrit", 1);
  g = run_hearth(b);
  CHECK_MSG(g.status == 0, "%s", g.err);
  check_layout(&repos[3], llama_files);
  run_free(&g);
  unsetenv("HF_TOKEN");

  /* not on the Hub; not an id */
  const char *c[] = {"get", "tiny/nothing", NULL};
  g = run_hearth(c);
  CHECK_EQ_INT(g.status, 1);
  CHECK_MSG(strstr(g.err, "tiny/nothing") && strstr(g.err, "404"), "%s", g.err);
  run_free(&g);
  const char *d[] = {"get", "no-slash", NULL};
  g = run_hearth(d);
  CHECK_EQ_INT(g.status, 2);
  run_free(&g);

  /* offline: only the cache */
  setenv("HF_HUB_OFFLINE", "1", 1);
  g = run_hearth(c);
  CHECK_EQ_INT(g.status, 1);
  CHECK_MSG(strstr(g.err, "HF_HUB_OFFLINE") && strstr(g.err, "hearth get tiny/nothing"), "%s", g.err);
  run_free(&g);
  unsetenv("HF_HUB_OFFLINE");
}

static void test_get_gguf(void) {
  srepo *r = &repos[5];
  char snap[1200];
  snprintf(snap, sizeof snap, "%s", repo_path(r->id, "snapshots/6666666666666666666666666666666666666666"));
  const char *a[] = {"get", "tiny/gguf:q8_0", NULL};
  run_result g = run_hearth(a);
  CHECK_MSG(g.status == 0, "%s", g.err);
  char want[1300];
  snprintf(want, sizeof want, "%s/tiny-Q8_0.gguf\n", snap);
  CHECK_EQ_STR(g.out, want);
  CHECK_EQ_INT(count_entries(snap), 1);
  run_free(&g);
  const char *b[] = {"get", "tiny/gguf:F16", NULL};
  g = run_hearth(b);
  CHECK_MSG(g.status == 0, "%s", g.err);
  snprintf(want, sizeof want, "%s/tiny-F16-00001-of-00002.gguf\n", snap);
  CHECK_EQ_STR(g.out, want);
  CHECK_EQ_INT(count_entries(snap), 3); /* both parts of the split file */
  run_free(&g);
  const char *c[] = {"get", "tiny/gguf", NULL}; /* no tag: Q4_K_M */
  g = run_hearth(c);
  CHECK_MSG(g.status == 0, "%s", g.err);
  snprintf(want, sizeof want, "%s/tiny-Q4_K_M.gguf", snap);
  CHECK(hfile_exists(want));
  CHECK_EQ_INT(count_entries(snap), 4);
  run_free(&g);
  const char *d[] = {"get", "tiny/gguf:Q2_K", NULL};
  g = run_hearth(d);
  CHECK_EQ_INT(g.status, 1);
  CHECK_MSG(strstr(g.err, "Q2_K") && strstr(g.err, "tiny-Q8_0.gguf"), "%s", g.err);
  run_free(&g);
}

/* A cache entry made by hand with the rules above, as huggingface_hub would write it. */
static void make_handmade(void) {
  const srepo *r = &repos[0];
  const char *commit = "abcdefabcdefabcdefabcdefabcdefabcdefabcd";
  char p[1300], t[300];
  mkdir(repo_path("other/handmade", NULL), 0755);
  mkdir(repo_path("other/handmade", "blobs"), 0755);
  mkdir(repo_path("other/handmade", "refs"), 0755);
  mkdir(repo_path("other/handmade", "snapshots"), 0755);
  snprintf(p, sizeof p, "snapshots/%s", commit);
  mkdir(repo_path("other/handmade", p), 0755);
  FILE *f = fopen(repo_path("other/handmade", "refs/main"), "w");
  fputs(commit, f);
  fclose(f);
  for (int i = 0; llama_files[i]; i++) {
    const sfile *s = find_file((srepo *)r, llama_files[i]);
    const char *id = s->lfs ? s->sha256 : s->sha1;
    snprintf(t, sizeof t, "blobs/%s", id);
    f = fopen(repo_path("other/handmade", t), "wb");
    fwrite(s->data, 1, s->len, f);
    fclose(f);
    snprintf(t, sizeof t, "../../blobs/%s", id);
    snprintf(p, sizeof p, "snapshots/%s/%s", commit, s->name);
    CHECK(symlink(t, repo_path("other/handmade", p)) == 0);
  }
}

static void test_model_by_name(void) {
  char snap[1200];
  snprintf(snap, sizeof snap, "%s", repo_path("tiny/llama", "snapshots/1111111111111111111111111111111111111111"));
  const char *a0[] = {"generate", "--model", snap, "--ids", "1,2,3", "-n", "4", "--temp", "0", NULL};
  run_result ref = run_hearth(a0);
  CHECK_MSG(ref.status == 0 && ref.out[0], "%s", ref.err);

  setenv("HF_HUB_OFFLINE", "1", 1);
  const char *a1[] = {"generate", "--model", "tiny/llama", "--ids", "1,2,3", "-n", "4", "--temp", "0", NULL};
  run_result g = run_hearth(a1);
  CHECK_MSG(g.status == 0, "%s", g.err);
  CHECK_EQ_STR(g.out, ref.out);
  run_free(&g);
  make_handmade();
  const char *a2[] = {"generate", "--model=other/handmade", "--ids", "1,2,3", "-n", "4", "--temp", "0", NULL};
  g = run_hearth(a2);
  CHECK_MSG(g.status == 0, "%s", g.err);
  CHECK_EQ_STR(g.out, ref.out);
  run_free(&g);
  const char *a3[] = {"generate", "--model", "tiny/llama2", "--ids", "1,2,3", "-n", "4", NULL};
  g = run_hearth(a3);
  CHECK_EQ_INT(g.status, 1);
  CHECK_MSG(strstr(g.err, "HF_HUB_OFFLINE") && strstr(g.err, "hearth get tiny/llama2"), "%s", g.err);
  run_free(&g);
  unsetenv("HF_HUB_OFFLINE");

  /* not cached, online: fetched first, with a message */
  const char *a4[] = {"generate", "--model", "tiny/llama2", "--ids", "1,2,3", "-n", "4", "--temp", "0", NULL};
  g = run_hearth(a4);
  CHECK_MSG(g.status == 0, "%s", g.err);
  CHECK_MSG(strstr(g.err, "fetching it first") && strstr(g.err, "hearth get tiny/llama2"), "%s", g.err);
  CHECK_EQ_STR(g.out, ref.out);
  check_layout(&repos[1], llama_files);
  run_free(&g);
  run_free(&ref);
}

static json_t *ls_entry(json_t *list, const char *name) {
  size_t i;
  json_t *v;
  json_array_foreach(list, i, v) if (!strcmp(json_string_value(json_object_get(v, "name")), name)) return v;
  return NULL;
}

static void test_registry(void) {
  char models[700], mine[800], gguf[800], p[900];
  snprintf(models, sizeof models, "%s/elsewhere", tmpdir);
  snprintf(mine, sizeof mine, "%s/mine", models);
  mkdir(models, 0755);
  mkdir(mine, 0755);
  for (int i = 0; llama_files[i]; i++) {
    const sfile *s = find_file(&repos[0], llama_files[i]);
    snprintf(p, sizeof p, "%s/%s", mine, s->name);
    FILE *f = fopen(p, "wb");
    fwrite(s->data, 1, s->len, f);
    fclose(f);
  }
  snprintf(gguf, sizeof gguf, "%s/broken.gguf", models);
  FILE *f = fopen(gguf, "wb");
  fputs("GGUF but nothing else", f);
  fclose(f);

  const char *a[] = {"scan", models, NULL};
  run_result g = run_hearth(a);
  CHECK_MSG(g.status == 0, "%s", g.err);
  CHECK_MSG(strstr(g.out, "mine") && strstr(g.out, "broken"), "%s", g.out);
  run_free(&g);
  snprintf(p, sizeof p, "%s/home/registry.json", tmpdir);
  CHECK(hfile_exists(p));

  const char *b[] = {"ls", "--json", NULL};
  g = run_hearth(b);
  CHECK_MSG(g.status == 0, "%s", g.err);
  json_t *list = json_loads(g.out, 0, NULL);
  CHECK(json_is_array(list));
  json_t *e = ls_entry(list, "tiny/llama");
  CHECK(e && json_is_true(json_object_get(e, "runnable")));
  CHECK_EQ_STR(json_string_value(json_object_get(e, "format")), "safetensors");
  CHECK_EQ_STR(json_string_value(json_object_get(e, "architecture")), "llama");
  CHECK_EQ_STR(json_string_value(json_object_get(e, "revision")), "1111111111111111111111111111111111111111");
  CHECK(json_integer_value(json_object_get(e, "bytes")) > 500000);
  e = ls_entry(list, "mine");
  CHECK(e && json_is_true(json_object_get(e, "runnable")));
  CHECK_EQ_STR(json_string_value(json_object_get(e, "source")), "registry");
  e = ls_entry(list, "broken");
  CHECK(e && json_is_false(json_object_get(e, "runnable")) && json_string_value(json_object_get(e, "problem")));
  CHECK(ls_entry(list, "tiny/gguf") != NULL);
  json_decref(list);
  run_free(&g);
  const char *b2[] = {"ls", NULL};
  g = run_hearth(b2);
  CHECK_MSG(g.status == 0 && strstr(g.out, "NAME") && strstr(g.out, "tiny/llama") && strstr(g.out, "no: "), "%s", g.out);
  run_free(&g);

  const char *c[] = {"generate", "--model", "mine", "--ids", "1,2,3", "-n", "4", "--temp", "0", NULL};
  g = run_hearth(c);
  CHECK_MSG(g.status == 0, "%s", g.err);
  run_free(&g);

  const char *d[] = {"rm", "mine", NULL};
  g = run_hearth(d);
  CHECK_MSG(g.status == 0, "%s", g.err);
  run_free(&g);
  snprintf(p, sizeof p, "%s/config.json", mine);
  CHECK(hfile_exists(p)); /* a reference was dropped, not the files */
  g = run_hearth(d);
  CHECK_EQ_INT(g.status, 1);
  run_free(&g);
}

static void test_rm_gc(void) {
  char orphan[1300];
  snprintf(orphan, sizeof orphan, "%s/%s", repo_path("tiny/llama", "blobs"), "0123456789012345678901234567890123456789");
  FILE *f = fopen(orphan, "wb");
  fputs("nobody links here", f);
  fclose(f);
  const char *a[] = {"gc", NULL};
  run_result g = run_hearth(a);
  CHECK_MSG(g.status == 0 && strstr(g.out, "1 unused blob removed"), "%s%s", g.out, g.err);
  CHECK(!hfile_exists(orphan));
  check_layout(&repos[0], (const char *const[]){"config.json", "generation_config.json", "tokenizer.json",
                                                 "tokenizer_config.json", "model.safetensors", "original/consolidated.pth",
                                                 NULL});
  run_free(&g);

  const char *b[] = {"rm", "tiny/gguf:Q8_0", NULL};
  g = run_hearth(b);
  CHECK_MSG(g.status == 0, "%s", g.err);
  CHECK_EQ_INT(count_entries(repo_path("tiny/gguf", "blobs")), 3);
  run_free(&g);
  const char *c[] = {"rm", "tiny/llama", NULL};
  g = run_hearth(c);
  CHECK_MSG(g.status == 0, "%s", g.err);
  CHECK(!hfile_exists(repo_path("tiny/llama", NULL)));
  run_free(&g);
}

int main(void) {
  if (!mkdtemp(tmpdir)) return 1;
  snprintf(cache, sizeof cache, "%s/hub", tmpdir);
  mkdir(cache, 0755);
  char home[700], endpoint[64];
  snprintf(home, sizeof home, "%s/home", tmpdir);
  make_repos();
  memset(last_range, 0xff, sizeof last_range);
  drop_left = 1;
  struct MHD_Daemon *hub = start(on_hub, &hub_port), *cdn = start(on_cdn, &cdn_port);
  if (!hub || !cdn || !hub_port || !cdn_port) {
    fprintf(stderr, "cannot start the stand-in Hub\n");
    return 1;
  }
  snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d", hub_port);
  setenv("HF_ENDPOINT", endpoint, 1);
  setenv("HF_HUB_CACHE", cache, 1);
  setenv("HEARTH_HOME", home, 1);
  unsetenv("HF_TOKEN");
  unsetenv("HF_HUB_OFFLINE");
  unsetenv("HTTP_PROXY");
  unsetenv("http_proxy");
  RUN(test_get_layout);
  RUN(test_get_resume);
  RUN(test_get_refusals);
  RUN(test_get_gguf);
  RUN(test_model_by_name);
  RUN(test_registry);
  RUN(test_rm_gc);
  MHD_stop_daemon(hub);
  MHD_stop_daemon(cdn);
  for (int i = 0; i < nrepos; i++)
    for (int k = 0; k < repos[i].n; k++) free(repos[i].files[k].data);
  if (!test_failures) {
    char cmd[800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
  }
  fprintf(stderr, "%d checks, %d failed\n", test_checks, test_failures);
  return test_failures ? 1 : 0;
}
