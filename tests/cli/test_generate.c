/* End-to-end tests of `hearth generate` and `hearth chat`: runs the built
 * binary on the golden llama fixture (tests/fixtures/golden/llama-f32, from
 * transformers via tools/gen_golden.py), alone and with the byte-level
 * tokenizer and chat template of tests/fixtures/engine
 * (tools/gen_engine_fixtures.py). Expected ids and texts are the fixtures'
 * references; the chat session is checked against the library API rendering
 * and generating the same conversation. */
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "base/buf.h"
#include "base/file.h"
#include "hearth.h"
#include "test.h"

#define FIXTURE HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-f32"

static char tmpdir[] = "/tmp/hearth_gen_cli_XXXXXX";

typedef struct run_result {
  int status;   /* exit status, or -1 when it did not exit normally */
  char *out;    /* owned */
  char *err;    /* owned */
} run_result;

static char *slurp(const char *path) {
  char *s = NULL;
  size_t n;
  if (hfile_read(path, &s, &n, NULL)) return strdup("");
  return s;
}

/* Runs HEARTH_BINARY with args (NULL-terminated, without argv[0]); stdin from stdin_text (may be NULL). */
static run_result run_hearth(const char *const *args, const char *stdin_text) {
  run_result r = {-1, NULL, NULL};
  char outp[600], errp[600], inp[600];
  snprintf(outp, sizeof outp, "%s/.stdout", tmpdir);
  snprintf(errp, sizeof errp, "%s/.stderr", tmpdir);
  snprintf(inp, sizeof inp, "%s/.stdin", tmpdir);
  FILE *f = fopen(inp, "w");
  if (f) {
    if (stdin_text) fputs(stdin_text, f);
    fclose(f);
  }
  char *argv[40];
  int n = 0;
  argv[n++] = (char *)HEARTH_BINARY;
  for (int i = 0; args[i] && n < 39; i++) argv[n++] = (char *)args[i];
  argv[n] = NULL;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    int in = open(inp, O_RDONLY);
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
  return r;
}

static int collect_text(void *user, const char *text, size_t len, const hearth_token *tok) {
  (void)tok;
  hbuf_append(user, text, len);
  return 0;
}

static void run_free(run_result *r) {
  free(r->out);
  free(r->err);
}

static hbuf g_prompt_ids;   /* "501,500,..." */
static hbuf g_greedy_text;  /* "89 264 ...\n" */

static bool load_fixture(void) {
  json_error_t je;
  json_t *g = json_load_file(FIXTURE "/golden.json", 0, &je);
  CHECK_MSG(g != NULL, "golden.json: %s", je.text);
  if (!g) return false;
  json_t *p0 = json_array_get(json_object_get(g, "prompts"), 0);
  json_t *ids = json_object_get(json_object_get(g, "greedy"), "ids");
  size_t i;
  json_t *v;
  json_array_foreach(p0, i, v) hbuf_printf(&g_prompt_ids, "%s%lld", i ? "," : "", (long long)json_integer_value(v));
  json_array_foreach(ids, i, v) hbuf_printf(&g_greedy_text, "%s%lld", i ? " " : "", (long long)json_integer_value(v));
  hbuf_puts(&g_greedy_text, "\n");
  json_decref(g);
  return g_prompt_ids.len > 0;
}

static void test_greedy_ids(void) {
  const char *args[] = {"generate", "--model", FIXTURE, "--ids", hbuf_str(&g_prompt_ids), "-n", "24", "--temp", "0",
                        NULL};
  run_result r = run_hearth(args, NULL);
  CHECK_EQ_INT(r.status, 0);
  CHECK_EQ_STR(r.out, hbuf_str(&g_greedy_text));
  run_free(&r);
  /* the same with the model's defaults (greedy) and --print-ids, --stats */
  const char *args2[] = {"generate", "--model", FIXTURE, "--ids", hbuf_str(&g_prompt_ids), "--max-tokens=24",
                         "--print-ids", "--stats", NULL};
  r = run_hearth(args2, NULL);
  CHECK_EQ_INT(r.status, 0);
  CHECK_EQ_STR(r.out, hbuf_str(&g_greedy_text));
  CHECK(strstr(r.err, "length") != NULL);
  run_free(&r);
}

/* --spec-tokens: the same greedy text, drafted by prompt lookup and by the
 * model itself as a draft (--stats says how many drafts were accepted). */
static void test_speculative(void) {
  const char *a1[] = {"generate", "--model", FIXTURE, "--ids", hbuf_str(&g_prompt_ids), "-n", "24", "--temp", "0",
                      "--spec-tokens", "3", NULL};
  run_result r = run_hearth(a1, NULL);
  CHECK_EQ_INT(r.status, 0);
  CHECK_EQ_STR(r.out, hbuf_str(&g_greedy_text));
  run_free(&r);
  const char *a2[] = {"generate", "--model", FIXTURE, "--ids", hbuf_str(&g_prompt_ids), "-n", "24", "--temp", "0",
                      "--spec-tokens", "4", "--draft-model", FIXTURE, "--stats", NULL};
  r = run_hearth(a2, NULL);
  CHECK_EQ_INT(r.status, 0);
  CHECK_EQ_STR(r.out, hbuf_str(&g_greedy_text));
  CHECK_MSG(strstr(r.err, "[speculative draft: ") != NULL && strstr(r.err, "(100.0%)") != NULL, "%s", r.err);
  run_free(&r);
  const char *a3[] = {"generate", "--model", FIXTURE, "--ids", "1,2", "--spec-tokens", "17", NULL};
  r = run_hearth(a3, NULL);
  CHECK_EQ_INT(r.status, 2);
  CHECK(strstr(r.err, "--spec-tokens") != NULL);
  run_free(&r);
  const char *a4[] = {"generate", "--model", FIXTURE, "--ids", "1,2", "--spec-method", "lookahead", NULL};
  r = run_hearth(a4, NULL);
  CHECK_EQ_INT(r.status, 2);
  CHECK(strstr(r.err, "--spec-method") != NULL);
  run_free(&r);
  const char *a5[] = {"generate", "--model", FIXTURE, "--ids", "1,2", "--spec-tokens", "2", "--spec-method", "mtp", NULL};
  r = run_hearth(a5, NULL);
  CHECK_EQ_INT(r.status, 1);
  CHECK(strstr(r.err, "multi-token-prediction") != NULL);
  run_free(&r);
}

static void test_seeded(void) {
  const char *args[] = {"generate", "--model", FIXTURE, "--ids", hbuf_str(&g_prompt_ids), "-n", "16", "--temp", "1",
                        "--top-k", "0", "--seed", "99", "--ignore-eos", NULL};
  run_result a = run_hearth(args, NULL), b = run_hearth(args, NULL);
  CHECK_EQ_INT(a.status, 0);
  CHECK_EQ_STR(a.out, b.out);
  CHECK(strcmp(a.out, hbuf_str(&g_greedy_text)) != 0);
  run_free(&a);
  run_free(&b);
}

/* llama.cpp's sampler flags: DRY turns the greedy run, mirostat 2 repeats with its seed, mirostat 1 is refused. */
static void test_sampler_flags(void) {
  const char *dry[] = {"generate", "--model", FIXTURE, "--ids", hbuf_str(&g_prompt_ids), "-n", "24", "--temp", "0",
                       "--print-ids", "--dry-multiplier", "3", "--dry-allowed-length", "0", "--dry-penalty-last-n", "-1",
                       "--dry-sequence-breaker", "none", NULL};
  run_result r = run_hearth(dry, NULL);
  CHECK_EQ_INT(r.status, 0);
  CHECK_MSG(r.out && strcmp(r.out, hbuf_str(&g_greedy_text)) != 0, "DRY left the greedy ids as they were: %s", r.out);
  run_free(&r);
  const char *miro[] = {"generate", "--model", FIXTURE, "--ids", hbuf_str(&g_prompt_ids), "-n", "16", "--temp", "1",
                        "--seed", "5", "--print-ids", "--mirostat", "2", "--mirostat-ent", "3", "--mirostat-lr", "0.2",
                        "--typical-p", "0.9", "--xtc-probability", "0.5", NULL};
  run_result a = run_hearth(miro, NULL), b = run_hearth(miro, NULL);
  CHECK_EQ_INT(a.status, 0);
  CHECK(a.out && b.out && strcmp(a.out, b.out) == 0);
  run_free(&a);
  run_free(&b);
  const char *bad[] = {"generate", "--model", FIXTURE, "--ids", hbuf_str(&g_prompt_ids), "--mirostat", "1", NULL};
  r = run_hearth(bad, NULL);
  CHECK_EQ_INT(r.status, 2);
  CHECK(r.err && strstr(r.err, "--mirostat 1"));
  run_free(&r);
  const char *bad2[] = {"generate", "--model", FIXTURE, "--ids", hbuf_str(&g_prompt_ids), "--dry-base", "0.5", NULL};
  r = run_hearth(bad2, NULL);
  CHECK_EQ_INT(r.status, 2);
  CHECK(r.err && strstr(r.err, "--dry-base"));
  run_free(&r);
}

static void test_errors(void) {
  /* 20 + 200 > 128 */
  const char *a1[] = {"generate", "--model", FIXTURE, "--ids", hbuf_str(&g_prompt_ids), "-n", "200", NULL};
  run_result r = run_hearth(a1, NULL);
  CHECK_EQ_INT(r.status, 1);
  CHECK(strstr(r.err, "context_length_exceeded") != NULL);
  run_free(&r);
  const char *a2[] = {"generate", "--model", FIXTURE, NULL};
  r = run_hearth(a2, NULL);
  CHECK_EQ_INT(r.status, 2);
  run_free(&r);
  const char *a3[] = {"generate", "--model", "/nonexistent/model", "--ids", "1,2", NULL};
  r = run_hearth(a3, NULL);
  CHECK_EQ_INT(r.status, 1);
  CHECK(strstr(r.err, "/nonexistent/model") != NULL);
  run_free(&r);
  const char *a4[] = {"generate", "--model", FIXTURE, "--ids", "1,x", NULL};
  r = run_hearth(a4, NULL);
  CHECK_EQ_INT(r.status, 2);
  run_free(&r);
  const char *a5[] = {"generate", "--model", FIXTURE, "--ids", "1,2", "--top-p", "3", NULL};
  r = run_hearth(a5, NULL); /* out of range: refused by the option parser, before loading */
  CHECK_EQ_INT(r.status, 2);
  CHECK(strstr(r.err, "--top-p") != NULL);
  run_free(&r);
  /* the fixture has no chat template */
  const char *a6[] = {"chat", "--model", FIXTURE, NULL};
  r = run_hearth(a6, "hello\n");
  CHECK_EQ_INT(r.status, 1);
  CHECK(strstr(r.err, "chat template") != NULL);
  run_free(&r);
  const char *a7[] = {"generate", "--help", NULL};
  r = run_hearth(a7, NULL);
  CHECK_EQ_INT(r.status, 0);
  CHECK(strstr(r.out, "--prompt") != NULL);
  run_free(&r);
}

/* ---- with a tokenizer ---- */

#define ENGINE_FIXTURES HEARTH_SOURCE_DIR "/tests/fixtures/engine"
static const char *text_files[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                                   "tokenizer_config.json"};
static char text_dir[700];

static bool make_text_model(void) {
  snprintf(text_dir, sizeof text_dir, "%s/model", tmpdir);
  if (mkdir(text_dir, 0755)) return false;
  const char *from[] = {FIXTURE "/config.json", FIXTURE "/generation_config.json", FIXTURE "/model.safetensors",
                        ENGINE_FIXTURES "/tokenizer.json", ENGINE_FIXTURES "/tokenizer_config.json"};
  for (int i = 0; i < 5; i++) {
    char to[800];
    snprintf(to, sizeof to, "%s/%s", text_dir, text_files[i]);
    if (symlink(from[i], to)) return false;
  }
  return true;
}

static void remove_text_model(void) {
  for (int i = 0; i < 5; i++) {
    char p[800];
    snprintf(p, sizeof p, "%s/%s", text_dir, text_files[i]);
    unlink(p);
  }
  rmdir(text_dir);
}

static void test_text(void) {
  json_error_t je;
  json_t *e = json_load_file(ENGINE_FIXTURES "/expected.json", 0, &je);
  CHECK(e != NULL);
  if (!e) return;
  hbuf want = {0};
  hbuf_printf(&want, "%s\n", json_string_value(json_object_get(e, "greedy_text")));
  const char *a1[] = {"generate", "--model", text_dir, "--ids", hbuf_str(&g_prompt_ids), "-n", "24", "--temp", "0", NULL};
  run_result r = run_hearth(a1, NULL);
  CHECK_EQ_INT(r.status, 0);
  CHECK_EQ_STR(r.out, hbuf_str(&want));
  run_free(&r);
  hbuf_clear(&want);
  hbuf_printf(&want, "%s\n", json_string_value(json_object_get(e, "text_before_stop")));
  const char *a2[] = {"generate", "--model", text_dir, "--ids", hbuf_str(&g_prompt_ids), "-n", "24", "--temp", "0",
                      "--stop", "never", "--stop", json_string_value(json_object_get(e, "stop")), NULL};
  r = run_hearth(a2, NULL);
  CHECK_EQ_INT(r.status, 0);
  CHECK_EQ_STR(r.out, hbuf_str(&want));
  run_free(&r);
  /* --prompt and --chat go through the tokenizer and the template */
  const char *a3[] = {"generate", "--model", text_dir, "--prompt", "hi there", "--chat", "-n", "3", "--temp", "0",
                      "--stats", NULL};
  r = run_hearth(a3, NULL);
  CHECK_EQ_INT(r.status, 0);
  CHECK(strstr(r.err, "length") != NULL);
  run_free(&r);
  /* --prompt - reads the prompt from stdin */
  const char *a4[] = {"generate", "--model", text_dir, "--prompt", "hi there", "-n", "6", "--temp", "0", NULL};
  const char *a5[] = {"generate", "--model", text_dir, "--prompt", "-", "-n", "6", "--temp", "0", NULL};
  r = run_hearth(a4, NULL);
  run_result r2 = run_hearth(a5, "hi there");
  CHECK_EQ_INT(r.status, 0);
  CHECK_EQ_INT(r2.status, 0);
  CHECK(r.out[0] != 0);
  CHECK_EQ_STR(r2.out, r.out);
  run_free(&r);
  run_free(&r2);
  hbuf_free(&want);
  json_decref(e);
}

/* Greedy reply of n tokens to the conversation msgs, through the library. */
static char *api_reply(hearth_model *m, json_t *msgs, int n) {
  char *j = json_dumps(msgs, JSON_COMPACT), *prompt = NULL;
  hearth_error err = {0};
  int rc = hearth_chat_render(m, j, NULL, true, NULL, &prompt, &err);
  free(j);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (rc) return strdup("");
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.temperature = 0;
  p.max_tokens = n;
  hearth_prompt hp = {.text = prompt, .add_special = false};
  hbuf out = {0};
  hearth_gen_result res;
  rc = hearth_generate(m, &hp, &p, collect_text, &out, &res, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  hearth_free(prompt);
  char *s = strdup(hbuf_str(&out));
  hbuf_free(&out);
  return s;
}

static void test_chat_session(void) {
  hearth_model *m = NULL;
  hearth_error err = {0};
  CHECK_EQ_INT(hearth_model_load(text_dir, NULL, &m, &err), 0);
  if (!m) return;
  json_t *msgs = json_array();
  json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", "be brief"));
  json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", "hi there"));
  char *r1 = api_reply(m, msgs, 5);
  json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "assistant", "content", r1));
  json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", "and then?"));
  char *r2 = api_reply(m, msgs, 5);
  hbuf want = {0};
  hbuf_printf(&want, "%s\n%s\n", r1, r2);
  const char *args[] = {"chat", "--model", text_dir, "--system", "be brief", "-n", "5", "--temp", "0", NULL};
  run_result r = run_hearth(args, "hi there\nand then?\n/quit\nnot read\n");
  CHECK_EQ_INT(r.status, 0);
  CHECK_EQ_STR(r.out, hbuf_str(&want));
  run_free(&r);
  /* /reset forgets the first turn: the second reply is then the first one's */
  hbuf_clear(&want);
  hbuf_printf(&want, "%s\n%s\n", r1, r1);
  r = run_hearth(args, "hi there\n/reset\nhi there\n");
  CHECK_EQ_INT(r.status, 0);
  CHECK_EQ_STR(r.out, hbuf_str(&want));
  run_free(&r);
  hbuf_free(&want);
  free(r1);
  free(r2);
  json_decref(msgs);
  hearth_model_free(m);
}

/* --image with --chat: the tiny Gemma 4 with a vision tower (tests/fixtures/mm) answers as
 * transformers does for the same prompt tokens; media a model cannot take, and bad files, fail. */
#define MM_FIXTURE HEARTH_SOURCE_DIR "/tests/fixtures/mm/gemma4_vision-f32"
static void test_media(void) {
  json_error_t je;
  json_t *g = json_load_file(MM_FIXTURE "/golden.json", 0, &je);
  CHECK_MSG(g != NULL, "%s", je.text);
  if (!g) return;
  json_t *p = json_object_get(json_object_get(g, "prompts"), "p_img"), *ids = json_object_get(p, "ids");
  int64_t bos = json_integer_value(json_object_get(json_object_get(g, "token_ids"), "bos"));
  bool double_bos = json_integer_value(json_array_get(ids, 0)) == bos && json_integer_value(json_array_get(ids, 1)) == bos;
  hbuf want = {0};
  size_t i;
  json_t *v;
  json_array_foreach(json_object_get(p, "greedy"), i, v) hbuf_printf(&want, "%s%lld", i ? " " : "", (long long)json_integer_value(v));
  hbuf_puts(&want, "\n");
  char n[16];
  snprintf(n, sizeof n, "%zu", json_array_size(json_object_get(p, "greedy")));
  const char *text = json_string_value(json_array_get(json_object_get(p, "texts"), 0));
  const char *args[] = {"generate", "--model", MM_FIXTURE, "--image", MM_FIXTURE "/img_a.png", "--chat", "--prompt", text,
                        "-n", n, "--temp", "0", "--print-ids", "--stats", NULL};
  run_result r = run_hearth(args, NULL);
  CHECK_MSG(r.status == 0, "%s", r.err);
  if (!double_bos) CHECK_EQ_STR(r.out, hbuf_str(&want));
  char plen[64];
  snprintf(plen, sizeof plen, "prompt %zu tokens", json_array_size(ids) - (double_bos ? 1 : 0));
  CHECK_MSG(strstr(r.err, plen), "%s (want %s)", r.err, plen);
  run_free(&r);
  const char *bad[] = {"generate", "--model", MM_FIXTURE, "--audio", MM_FIXTURE "/img_a.png", "--prompt", "x", "-n", "1", NULL};
  r = run_hearth(bad, NULL);
  CHECK(r.status != 0);
  CHECK_MSG(strstr(r.err, "has no audio tower"), "%s", r.err);
  run_free(&r);
  const char *bad2[] = {"generate", "--model", MM_FIXTURE, "--image", MM_FIXTURE "/golden.json", "--prompt", "x", "-n", "1", NULL};
  r = run_hearth(bad2, NULL);
  CHECK(r.status != 0);
  CHECK_MSG(strstr(r.err, "not an image"), "%s", r.err);
  run_free(&r);
  const char *bad3[] = {"generate", "--model", MM_FIXTURE, "--image", MM_FIXTURE "/img_a.png", "--ids", "1,2", NULL};
  r = run_hearth(bad3, NULL);
  CHECK_EQ_INT(r.status, 2);
  run_free(&r);
  hbuf_free(&want);
  json_decref(g);
}

int main(void) {
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  if (load_fixture()) {
    RUN(test_greedy_ids);
    RUN(test_seeded);
    RUN(test_speculative);
    RUN(test_errors);
    RUN(test_sampler_flags);
    RUN(test_media);
    if (make_text_model()) {
      RUN(test_text);
      RUN(test_chat_session);
    } else {
      CHECK_MSG(0, "could not make the text model folder");
    }
    remove_text_model();
  }
  char p[600];
  const char *names[] = {".stdout", ".stderr", ".stdin"};
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s/%s", tmpdir, names[i]);
    unlink(p);
  }
  rmdir(tmpdir);
  hbuf_free(&g_prompt_ids);
  hbuf_free(&g_greedy_text);
  TEST_MAIN_END();
}
