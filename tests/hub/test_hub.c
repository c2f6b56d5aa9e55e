/* Unit tests of hub/: Hub ids, the revision listing (and what it refuses),
 * the files a runtime needs and the GGUF a quant tag picks, the cache's
 * names and symlinks (huggingface_hub's layout: snapshots/<commit>/F →
 * ../../blobs/<id>, one more ../ per folder), refs, gc and the registry file. */
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "hub/hub.h"
#include "test.h"

static void test_ref(void) {
  hub_ref r;
  herr err = {0};
  CHECK(hub_ref_parse("Qwen/Qwen3-0.6B", &r, &err) == 0);
  CHECK_EQ_STR(r.repo, "Qwen/Qwen3-0.6B");
  CHECK_EQ_STR(r.revision, "main");
  CHECK_EQ_STR(r.quant, "");
  CHECK(hub_ref_parse("unsloth/Qwen3-0.6B-GGUF@v1.0:q4_k_m", &r, &err) == 0);
  CHECK_EQ_STR(r.repo, "unsloth/Qwen3-0.6B-GGUF");
  CHECK_EQ_STR(r.revision, "v1.0");
  CHECK_EQ_STR(r.quant, "q4_k_m");
  CHECK(hub_ref_parse("org/name@refs/pr/1", &r, &err) == 0);
  CHECK_EQ_STR(r.revision, "refs/pr/1");
  char s[600];
  hub_ref_format(&r, s, sizeof s);
  CHECK_EQ_STR(s, "org/name@refs/pr/1");
  const char *bad[] = {"name", "a/b/c", "/abs", "../x", "org/", "org/..", "org/name@", "org/name:", "org/name:Q4 K",
                       "org/name@a..b", "org/na me"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err.msg[0] = 0;
    CHECK_MSG(hub_ref_parse(bad[i], &r, &err) == HEARTH_EINVAL && err.msg[0], "%s", bad[i]);
  }
}

#define SHA "65369bfd8c72f06674bc1f78946ae684825257e9ff76ae53662785707055bab8"
#define BLOB "0123456789abcdef0123456789abcdef01234567"

static void test_revision(void) {
  const char *ok = "{\"sha\":\"ABCDEF0123456789abcdef0123456789abcdef01\",\"siblings\":["
                   "{\"rfilename\":\"config.json\",\"size\":714,\"blobId\":\"" BLOB "\"},"
                   "{\"rfilename\":\"model.safetensors\",\"size\":1,\"lfs\":{\"sha256\":\"" SHA "\",\"size\":560488}},"
                   "{\"rfilename\":\"sub/dir/x.txt\"}]}";
  hub_revision r;
  herr err = {0};
  CHECK(hub_revision_parse(ok, strlen(ok), &r, &err) == 0);
  CHECK_EQ_STR(r.commit, "abcdef0123456789abcdef0123456789abcdef01");
  CHECK_EQ_INT(r.n, 3);
  CHECK_EQ_STR(r.files[0].blob_id, BLOB);
  CHECK(r.files[0].sha256 == NULL);
  CHECK_EQ_INT(r.files[1].size, 560488); /* the LFS size */
  CHECK_EQ_STR(r.files[1].sha256, SHA);
  CHECK_EQ_INT(r.files[2].size, -1);
  hub_revision_free(&r);
  const char *bad[] = {
      "[]", "{\"sha\":\"x\",\"siblings\":[]}", "{\"sha\":\"" BLOB "\"}",
      "{\"sha\":\"" BLOB "\",\"siblings\":[{\"rfilename\":\"../x\"}]}",
      "{\"sha\":\"" BLOB "\",\"siblings\":[{\"rfilename\":\"/etc/x\"}]}",
      "{\"sha\":\"" BLOB "\",\"siblings\":[{\"rfilename\":\"a//b\"}]}",
      "{\"sha\":\"" BLOB "\",\"siblings\":[{\"rfilename\":\"a/./b\"}]}",
      "{\"sha\":\"" BLOB "\",\"siblings\":[{\"rfilename\":\"a\\\\b\"}]}",
      "{\"sha\":\"" BLOB "\",\"siblings\":[{\"rfilename\":\"a\"},{\"rfilename\":\"a\"}]}",
      "{\"sha\":\"" BLOB "\",\"siblings\":[{\"rfilename\":\"a\",\"blobId\":\"xyz\"}]}",
      "{\"sha\":\"" BLOB "\",\"siblings\":[{\"rfilename\":\"a\",\"lfs\":{\"sha256\":\"abc\"}}]}",
      "{\"sha\":\"" BLOB "\",\"siblings\":[{\"rfilename\":\"a\",\"size\":-5}]}",
      "{\"sha\":\"" BLOB "\",\"siblings\":[{\"rfilename\":7}]}",
      "not json"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    err.msg[0] = 0;
    CHECK_MSG(hub_revision_parse(bad[i], strlen(bad[i]), &r, &err) != 0 && err.msg[0], "%s", bad[i]);
  }
}

/* The names kept from a listing of these files, joined by spaces. */
static void kept(const char *const *names, size_t n, const hub_select_opts *o, char *out, size_t cap, int *rc) {
  hub_file files[32] = {0};
  for (size_t i = 0; i < n; i++) files[i] = (hub_file){.name = (char *)names[i], .size = 1};
  hub_revision r = {.commit = BLOB, .files = files, .n = n};
  bool keep[32];
  herr err = {0};
  *rc = hub_select(&r, o, keep, &err);
  out[0] = 0;
  for (size_t i = 0; i < n && !*rc; i++)
    if (keep[i]) snprintf(out + strlen(out), cap - strlen(out), "%s%s", out[0] ? " " : "", names[i]);
}

static void test_select(void) {
  const char *st[] = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                      "special_tokens_map.json", "chat_template.jinja", "model-00001-of-00002.safetensors",
                      "model-00002-of-00002.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                      "original/consolidated.00.pth", "original/params.json", "onnx/model.onnx", "README.md",
                      ".gitattributes", "preprocessor_config.json", "modules.json", "1_Pooling/config.json",
                      "model.gguf", "flax_model.msgpack"};
  char out[2048];
  int rc;
  kept(st, 20, &(hub_select_opts){0}, out, sizeof out, &rc);
  CHECK_EQ_INT(rc, 0);
  CHECK_EQ_STR(out, "config.json generation_config.json tokenizer.json tokenizer_config.json special_tokens_map.json "
                    "chat_template.jinja model-00001-of-00002.safetensors model-00002-of-00002.safetensors "
                    "model.safetensors.index.json preprocessor_config.json modules.json 1_Pooling/config.json");
  const char *inc[] = {"original/*"}, *exc[] = {"*.pth"};
  kept(st, 20, &(hub_select_opts){.include = inc, .ninclude = 1}, out, sizeof out, &rc);
  CHECK_EQ_STR(out, "original/consolidated.00.pth original/params.json");
  kept(st, 20, &(hub_select_opts){.include = inc, .ninclude = 1, .exclude = exc, .nexclude = 1}, out, sizeof out, &rc);
  CHECK_EQ_STR(out, "original/params.json");
  kept(st, 20, &(hub_select_opts){.quant = "Q4_K_M"}, out, sizeof out, &rc); /* a tag asks for a GGUF: model.gguf has none */
  CHECK(rc != 0);

  const char *gg[] = {"README.md", "m-Q4_K.gguf", "m-Q4_K_M.gguf", "m-Q8_0.gguf", "m-F16-00001-of-00003.gguf",
                      "m-F16-00002-of-00003.gguf", "m-F16-00003-of-00003.gguf", "mmproj-m-F16.gguf", "config.json"};
  kept(gg, 9, &(hub_select_opts){0}, out, sizeof out, &rc);
  CHECK_EQ_STR(out, "m-Q4_K_M.gguf");
  kept(gg, 9, &(hub_select_opts){.quant = "q4_k"}, out, sizeof out, &rc);
  CHECK_EQ_STR(out, "m-Q4_K.gguf");
  kept(gg, 9, &(hub_select_opts){.quant = "f16"}, out, sizeof out, &rc);
  CHECK_EQ_STR(out, "m-F16-00001-of-00003.gguf m-F16-00002-of-00003.gguf m-F16-00003-of-00003.gguf");
  kept(gg, 9, &(hub_select_opts){.quant = "IQ4_XS"}, out, sizeof out, &rc);
  CHECK(rc == HEARTH_ENOTFOUND);
  const char *one[] = {"x-IQ4_XS.gguf", "README.md"};
  kept(one, 2, &(hub_select_opts){0}, out, sizeof out, &rc);
  CHECK_EQ_STR(out, "x-IQ4_XS.gguf");

  CHECK(hub_name_has_quant("dir/Model.Q5_K_M.gguf", "q5_k_m"));
  CHECK(!hub_name_has_quant("Model-Q5_K_M.gguf", "Q5_K"));
  CHECK(!hub_name_has_quant("Model-IQ4_XS.gguf", "Q4_XS"));
  CHECK(hub_gguf_is_later_shard("a-00002-of-00002.gguf"));
  CHECK(!hub_gguf_is_later_shard("a-00001-of-00002.gguf"));
}

static void test_cache(void) {
  char tmp[] = "/tmp/hearth_hub_XXXXXX";
  if (!mkdtemp(tmp)) return;
  setenv("HF_HUB_CACHE", "/x/hub", 1);
  char *root = hub_cache_root();
  CHECK_EQ_STR(root, "/x/hub");
  free(root);
  unsetenv("HF_HUB_CACHE");
  setenv("HF_HOME", "/y", 1);
  root = hub_cache_root();
  CHECK_EQ_STR(root, "/y/hub");
  free(root);
  unsetenv("HF_HOME");
  setenv("HOME", "/home/u", 1);
  root = hub_cache_root();
  CHECK_EQ_STR(root, "/home/u/.cache/huggingface/hub");
  free(root);

  char *repo = hub_repo_dir(tmp, "Org-A/Name.B");
  char want[200], id[100];
  snprintf(want, sizeof want, "%s/models--Org-A--Name.B", tmp);
  CHECK_EQ_STR(repo, want);
  CHECK(hub_repo_from_dir("models--Org-A--Name.B", id, sizeof id));
  CHECK_EQ_STR(id, "Org-A/Name.B");
  CHECK(!hub_repo_from_dir("datasets--a--b", id, sizeof id));

  herr err = {0};
  char link[300], t[300];
  CHECK(hub_cache_link(repo, BLOB, "config.json", "b1", &err) == 0);
  CHECK(hub_cache_link(repo, BLOB, "a/b/w.pth", SHA, &err) == 0);
  snprintf(link, sizeof link, "%s/snapshots/" BLOB "/config.json", repo);
  ssize_t n = readlink(link, t, sizeof t - 1);
  t[n > 0 ? n : 0] = 0;
  CHECK_EQ_STR(t, "../../blobs/b1");
  snprintf(link, sizeof link, "%s/snapshots/" BLOB "/a/b/w.pth", repo);
  n = readlink(link, t, sizeof t - 1);
  t[n > 0 ? n : 0] = 0;
  CHECK_EQ_STR(t, "../../../../blobs/" SHA);

  CHECK(hub_cache_write_ref(repo, "main", BLOB, &err) == 0);
  CHECK(hub_cache_write_ref(repo, BLOB, BLOB, &err) == 0); /* a commit gets no ref */
  char *text = NULL;
  size_t len;
  snprintf(link, sizeof link, "%s/refs/main", repo);
  CHECK(hfile_read(link, &text, &len, NULL) == 0 && len == 40 && !strcmp(text, BLOB));
  free(text);
  snprintf(link, sizeof link, "%s/refs/" BLOB, repo);
  CHECK(!hfile_exists(link));
  char *commit = NULL;
  CHECK(hub_cache_commit(repo, "main", &commit, &err) == 0 && !strcmp(commit, BLOB));
  free(commit);
  CHECK(hub_cache_commit(repo, BLOB, &commit, &err) == 0);
  free(commit);
  CHECK(hub_cache_commit(repo, "v2", &commit, &err) == HEARTH_ENOTFOUND);

  /* gc: a blob no link names goes, linked ones stay */
  snprintf(link, sizeof link, "%s/blobs", repo);
  mkdir(link, 0755);
  const char *blobs[] = {"b1", SHA, "orphan", "x.incomplete"};
  for (int i = 0; i < 4; i++) {
    snprintf(link, sizeof link, "%s/blobs/%s", repo, blobs[i]);
    FILE *f = fopen(link, "w");
    fputs("1234", f);
    fclose(f);
  }
  int nrm = 0;
  int64_t bytes = 0;
  CHECK(hub_cache_gc_repo(repo, &nrm, &bytes, &err) == 0);
  CHECK_EQ_INT(nrm, 2);
  CHECK_EQ_INT(bytes, 8);
  snprintf(link, sizeof link, "%s/blobs/b1", repo);
  CHECK(hfile_exists(link));
  snprintf(link, sizeof link, "%s/snapshots/" BLOB, repo);
  CHECK_EQ_INT(hub_tree_bytes(link), 8); /* what the snapshot's links point at */

  /* registry */
  setenv("HEARTH_HOME", tmp, 1);
  char *name = NULL;
  CHECK(hub_registry_add(repo, &name, &err) == 0);
  CHECK_EQ_STR(name, "models--Org-A--Name.B");
  free(name);
  CHECK(hub_registry_add(repo, &name, &err) == 0); /* the same path keeps its name */
  CHECK_EQ_STR(name, "models--Org-A--Name.B");
  free(name);
  char *p = hub_registry_lookup("models--Org-A--Name.B");
  CHECK_EQ_STR(p, repo);
  free(p);
  CHECK(hub_registry_remove("models--Org-A--Name.B", &err) == 0);
  CHECK(hub_registry_remove("models--Org-A--Name.B", &err) == HEARTH_ENOTFOUND);
  CHECK(hub_registry_lookup("models--Org-A--Name.B") == NULL);

  CHECK(hub_remove_tree(tmp, &err) == 0);
  CHECK(!hfile_exists(tmp));
  free(repo);
}

int main(void) {
  RUN(test_ref);
  RUN(test_revision);
  RUN(test_select);
  RUN(test_cache);
  fprintf(stderr, "%d checks, %d failed\n", test_checks, test_failures);
  return test_failures ? 1 : 0;
}
