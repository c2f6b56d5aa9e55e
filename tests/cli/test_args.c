/* The command line's shared rules, checked on the built binary: every verb
 * parses ints, thread counts and id lists alike (bad values exit 2 with a
 * message), ids outside the vocabulary are errors, --system needs --chat,
 * `hearth help [VERB]`, inspect's default model and --model, GGUF files as
 * models in every verb, configs with absurd values refused, convert's
 * summary line (and its progress on a terminal), the chat session's
 * /help, and serve's start-up failures (a KV pool it cannot have, a KV
 * store that is a file) as exit 1 with the reason. */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "test.h"

#define GGUF_TINY HEARTH_TINY_GGUF
#define DEFAULT_MODEL HEARTH_SOURCE_DIR "/models/default"
#define LLAMA_F32 HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-f32" /* max_position_embeddings 128 */

static char tmpdir[] = "/tmp/hearth_args_cli_XXXXXX";

typedef struct run_result {
  int status; /* exit status, or -1 when it did not exit normally */
  char *out;  /* owned */
  char *err;  /* owned */
} run_result;

static char *slurp(const char *path) {
  char *s = NULL;
  size_t n;
  if (hfile_read(path, &s, &n, NULL)) return strdup("");
  return s;
}

/* Runs HEARTH_BINARY with args (NULL-terminated); stdin from stdin_text (may be NULL).
 * With err_tty, stderr is a pseudo-terminal whose output lands in .err. */
static run_result run_opts(const char *const *args, const char *stdin_text, bool err_tty) {
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
  int master = -1;
  char *slave = NULL;
  if (err_tty) {
    master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) || unlockpt(master) || !(slave = ptsname(master))) return r;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    int in = open(inp, O_RDONLY);
    int o = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int e = err_tty ? open(slave, O_RDWR | O_NOCTTY) : open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || o < 0 || e < 0) _exit(126);
    dup2(in, 0);
    dup2(o, 1);
    dup2(e, 2);
    execv(argv[0], argv);
    _exit(127);
  }
  hbuf tty = {0};
  if (err_tty) {
    /* read until the child has exited and the terminal has nothing more */
    char buf[4096];
    for (;;) {
      ssize_t got = read(master, buf, sizeof buf);
      if (got <= 0) break; /* EIO once the child closed its side */
      hbuf_append(&tty, buf, (size_t)got);
    }
  }
  int st = 0;
  if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st)) r.status = WEXITSTATUS(st);
  r.out = slurp(outp);
  if (err_tty) {
    r.err = tty.data ? hbuf_take(&tty) : strdup("");
    close(master);
  } else {
    r.err = slurp(errp);
  }
  hbuf_free(&tty);
  return r;
}

static run_result run_hearth(const char *const *args, const char *stdin_text) { return run_opts(args, stdin_text, false); }

static void run_free(run_result *r) {
  free(r->out);
  free(r->err);
}

#define RUN_ARGS(stdin_text, ...) run_hearth((const char *const[]){__VA_ARGS__, NULL}, stdin_text)

/* A bad value exits 2 and names the option. */
static void expect_usage(run_result r, const char *needle, const char *what) {
  CHECK_MSG(r.status == 2, "%s: exit %d: %s", what, r.status, r.err);
  CHECK_MSG(strstr(r.err, needle) != NULL, "%s: stderr lacks '%s': %s", what, needle, r.err);
  run_free(&r);
}

static void test_threads_everywhere(void) {
  /* every verb that loads a model refuses a bad --threads the same way */
  static const char *verbs[] = {"logits", "generate", "chat", "serve", "bench"};
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) {
    expect_usage(RUN_ARGS(NULL, verbs[i], "--threads", "abc"), "--threads must be a thread count", verbs[i]);
    expect_usage(RUN_ARGS(NULL, verbs[i], "--threads=-2"), "--threads must be a thread count", verbs[i]);
  }
  expect_usage(RUN_ARGS(NULL, "bench", "-t", "4x"), "-t must be a thread count", "bench -t");
  /* generate and chat take it */
  run_result r = RUN_ARGS(NULL, "generate", "--threads", "1", "--ids", "1,2", "-n", "2", "--temp", "0", "--print-ids");
  CHECK_MSG(r.status == 0, "generate --threads 1: %d %s", r.status, r.err);
  run_free(&r);
  r = RUN_ARGS("", "chat", "--threads", "2");
  CHECK_MSG(r.status == 0, "chat --threads 2: %d %s", r.status, r.err);
  run_free(&r);
}

static void test_numbers(void) {
  expect_usage(RUN_ARGS(NULL, "generate", "--ids", "1", "-n", "12x"), "-n must be a whole number", "generate -n 12x");
  expect_usage(RUN_ARGS(NULL, "generate", "--ids", "1", "--temp", "hot"), "--temp must be a number", "generate --temp");
  expect_usage(RUN_ARGS(NULL, "chat", "--top-k", "1.5"), "--top-k must be a whole number", "chat --top-k 1.5");
  expect_usage(RUN_ARGS(NULL, "chat", "--seed", "x"), "--seed must be a whole number", "chat --seed x");
  expect_usage(RUN_ARGS(NULL, "serve", "--port", "70000"), "--port must be a whole number", "serve --port");
  expect_usage(RUN_ARGS(NULL, "bench", "-p", "-3"), "-p must be a whole number", "bench -p -3");
  expect_usage(RUN_ARGS(NULL, "convert", "a", "b", "--group-size", "64abc"), "--group-size", "convert --group-size");
}

static void test_ids_lists(void) {
  /* commas, spaces or both, in logits and generate alike */
  run_result a = RUN_ARGS(NULL, "logits", "--ids", "1,2,3");
  run_result b = RUN_ARGS(NULL, "logits", "--ids", "1 2 3");
  run_result c = RUN_ARGS(NULL, "logits", "--ids", "1, 2 ,3");
  CHECK_MSG(a.status == 0 && b.status == 0 && c.status == 0, "%d %d %d: %s %s", a.status, b.status, c.status, b.err, c.err);
  CHECK(strcmp(a.out, b.out) == 0 && strcmp(a.out, c.out) == 0);
  run_free(&a), run_free(&b), run_free(&c);
  a = RUN_ARGS(NULL, "generate", "--ids", "1,2,3", "-n", "3", "--temp", "0", "--print-ids");
  b = RUN_ARGS(NULL, "generate", "--ids", "1 2 3", "-n", "3", "--temp", "0", "--print-ids");
  CHECK_MSG(a.status == 0 && b.status == 0, "%s %s", a.err, b.err);
  CHECK_EQ_STR(a.out, b.out);
  run_free(&a), run_free(&b);
  static const char *bad[] = {"", "1,,2", "1,", "x", "1 -2", "1;2", "99999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    expect_usage(RUN_ARGS(NULL, "logits", "--ids", bad[i]), "--ids must be token ids", bad[i]);
    expect_usage(RUN_ARGS(NULL, "generate", "--ids", bad[i]), "--ids must be token ids", bad[i]);
  }
  /* ids outside the vocabulary (4096 in the built-in model) are errors everywhere */
  a = RUN_ARGS(NULL, "detokenize", "99999");
  CHECK_MSG(a.status == 1 && strstr(a.err, "outside the vocabulary") && !a.out[0], "detokenize 99999: %d %s", a.status,
            a.err);
  run_free(&a);
  a = RUN_ARGS(NULL, "detokenize", "1", "4096");
  CHECK_MSG(a.status == 1 && strstr(a.err, "4096"), "detokenize 4096: %d %s", a.status, a.err);
  run_free(&a);
  a = RUN_ARGS(NULL, "detokenize", "1", "4095");
  CHECK_MSG(a.status == 0, "detokenize 4095: %d %s", a.status, a.err);
  run_free(&a);
  char batch[700];
  snprintf(batch, sizeof batch, "%s/batch.json", tmpdir);
  FILE *f = fopen(batch, "w");
  if (f) fputs("[[1, 2], [5000]]", f), fclose(f);
  a = RUN_ARGS(NULL, "detokenize", "--batch", batch);
  CHECK_MSG(a.status == 1 && strstr(a.err, "outside the vocabulary"), "detokenize --batch: %d %s", a.status, a.err);
  run_free(&a);
  a = RUN_ARGS(NULL, "logits", "--ids", "1,99999");
  CHECK_MSG(a.status == 1 && strstr(a.err, "outside the vocabulary"), "logits 99999: %d %s", a.status, a.err);
  run_free(&a);
}

/* serve allocates its KV pool and opens its KV store before it listens: either
 * failing exits 1 with the reason (rather than a server whose every request fails). */
static void test_serve_startup(void) {
  run_result r = RUN_ARGS(NULL, "serve", "--port", "0", "--kv-cache-mem", "100000G");
  CHECK_MSG(r.status == 1, "serve --kv-cache-mem 100000G: exit %d: %s", r.status, r.err);
  CHECK_MSG(strstr(r.err, "KV cache") && strstr(r.err, "more than this machine"), "%s", r.err);
  run_free(&r);
  char file[600];
  snprintf(file, sizeof file, "%s/kvstore-file", tmpdir);
  FILE *f = fopen(file, "w");
  if (f) fclose(f);
  r = RUN_ARGS(NULL, "serve", "--port", "0", "--kv-store", file);
  CHECK_MSG(r.status == 1, "serve --kv-store FILE: exit %d: %s", r.status, r.err);
  CHECK_MSG(strstr(r.err, "not a folder") != NULL, "%s", r.err);
  run_free(&r);
  unlink(file);
}

/* fit says a context beyond the model's does not fit and what the model's is;
 * the help texts: -n's default on -n's line, tokenize's --model optional. */
static void test_fit_and_help_texts(void) {
  run_result r = RUN_ARGS(NULL, "fit", "--ctx", "4096", "--no-bandwidth");
  CHECK_MSG(r.status == 0, "fit: %d %s", r.status, r.err);
  CHECK_MSG(strstr(r.out, "fits         no: a context of 4096 tokens is more than the model's 1024"), "%s", r.out);
  run_free(&r);
  r = RUN_ARGS(NULL, "fit", "--ctx", "512", "--no-bandwidth");
  CHECK_MSG(strstr(r.out, "fits         yes") && strstr(r.out, "context 1024 tokens"), "%s", r.out);
  run_free(&r);
  r = RUN_ARGS(NULL, "generate", "--help");
  CHECK_MSG(strstr(r.out, "-n, --max-tokens N  tokens to generate (default 128"), "%s", r.out);
  const char *seed = strstr(r.out, "--seed S");
  const char *eol = seed ? strchr(seed, '\n') : NULL;
  CHECK_MSG(eol && strncmp(eol + 1, "  --", 4) == 0, "the line after --seed: %s", eol ? eol + 1 : "(none)");
  run_free(&r);
  r = RUN_ARGS(NULL, "chat", "--help");
  CHECK_MSG(strstr(r.out, "-n, --max-tokens N  tokens of each reply (default: up to the context"), "%s", r.out);
  run_free(&r);
  /* serve's help comes from its option table: the connection limits are in it and parse */
  r = RUN_ARGS(NULL, "serve", "--help");
  static const char *const serve_flags[] = {"--max-connections N", "--max-connections-per-address N",
                                            "--idle-timeout SECONDS", "--header-timeout SECONDS",
                                            "--body-timeout SECONDS", "--max-body BYTES", "--served-model-name NAME]..."};
  for (size_t k = 0; k < sizeof serve_flags / sizeof *serve_flags; k++)
    CHECK_MSG(strstr(r.out, serve_flags[k]) != NULL, "serve --help lacks %s", serve_flags[k]);
  run_free(&r);
  expect_usage(RUN_ARGS(NULL, "serve", "--max-connections", "0"), "--max-connections must be a whole number", "serve --max-connections 0");
  expect_usage(RUN_ARGS(NULL, "serve", "--idle-timeout", "x"), "--idle-timeout must be a whole number", "serve --idle-timeout x");
  expect_usage(RUN_ARGS(NULL, "serve", "--body-timeout=0"), "--body-timeout must be a whole number", "serve --body-timeout=0");
  expect_usage(RUN_ARGS(NULL, "serve", "--max-connections", "10", "--max-connections-per-address", "11"),
               "is more than --max-connections", "serve per-address over the total");
  expect_usage(RUN_ARGS(NULL, "serve", "--max-conections", "10"), "unknown option '--max-conections'", "serve typo");
  static const char *verbs[] = {"tokenize", "detokenize"};
  for (int i = 0; i < 2; i++) {
    r = RUN_ARGS(NULL, verbs[i], "--help");
    CHECK_MSG(strstr(r.out, "[--model PATH]") && !strstr(r.out, "tokenize --model PATH"), "%s", r.out);
    run_free(&r);
  }
}

/* --ctx-size / -c caps the context below the model's: generation stops
 * there, a request past it is refused, and a value above the model's own
 * context is refused naming both numbers. */
static void test_ctx_size(void) {
  run_result r = RUN_ARGS(NULL, "generate", "--model", LLAMA_F32, "--ids", "1,2,3", "-n", "-1", "-c", "16",
                          "--ignore-eos", "--temp", "0", "--print-ids", "--stats");
  CHECK_MSG(r.status == 0, "generate -c 16: %d %s", r.status, r.err);
  CHECK_MSG(strstr(r.err, "[length:") && strstr(r.err, "generated 13 tokens"), "generate -c 16: %s", r.err);
  run_free(&r);
  r = RUN_ARGS(NULL, "generate", "--model", LLAMA_F32, "--ids", "1,2,3", "-n", "-1", "--ctx-size=20", "--ignore-eos",
               "--temp", "0", "--print-ids", "--stats");
  CHECK_MSG(r.status == 0 && strstr(r.err, "generated 17 tokens"), "generate --ctx-size=20: %d %s", r.status, r.err);
  run_free(&r);
  r = RUN_ARGS(NULL, "generate", "--model", LLAMA_F32, "--ids", "1,2,3", "-n", "40", "-c", "16", "--ignore-eos",
               "--temp", "0", "--print-ids");
  CHECK_MSG(r.status == 1 && strstr(r.err, "context_length_exceeded"), "generate -n 40 -c 16: %d %s", r.status, r.err);
  run_free(&r);
  static const char *verbs[] = {"generate", "logits"};
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) {
    r = RUN_ARGS(NULL, verbs[i], "--model", LLAMA_F32, "--ids", "1,2,3", "-c", "100000");
    CHECK_MSG(r.status == 1 && strstr(r.err, "100000") && strstr(r.err, "128"), "%s -c 100000: %d %s", verbs[i],
              r.status, r.err);
    run_free(&r);
  }
  expect_usage(RUN_ARGS(NULL, "generate", "--ids", "1", "-c", "0"), "--ctx-size must be a token count", "-c 0");
  expect_usage(RUN_ARGS(NULL, "serve", "--ctx-size", "lots"), "--ctx-size must be a token count", "serve --ctx-size");
  r = RUN_ARGS(NULL, "--help");
  CHECK_MSG(r.status == 0 && strstr(r.out, "--ctx-size N, -c N"), "--help lacks --ctx-size: %s", r.out);
  run_free(&r);
}

/* Reads "prompt N tokens" out of --stats' line; -1 when absent. */
static long prompt_tokens(const char *err) {
  const char *p = strstr(err, "prompt ");
  return p ? strtol(p + 7, NULL, 10) : -1;
}

/* --chat-template-file renders generate --chat's prompt with the given
 * template; a missing file or one that does not parse is refused naming it. */
static void test_chat_template_file(void) {
  char tpl[600], bad[600];
  snprintf(tpl, sizeof tpl, "%s/plain.jinja", tmpdir);
  snprintf(bad, sizeof bad, "%s/bad.jinja", tmpdir);
  FILE *f = fopen(tpl, "w");
  if (f) fputs("{{ messages[-1]['content'] }}", f), fclose(f);
  f = fopen(bad, "w");
  if (f) fputs("{% for m in messages %}", f), fclose(f);
  run_result a = RUN_ARGS(NULL, "generate", "--chat", "--prompt", "hello there", "-n", "1", "--temp", "0", "--stats");
  run_result b = RUN_ARGS(NULL, "generate", "--chat", "--prompt", "hello there", "-n", "1", "--temp", "0", "--stats",
                          "--chat-template-file", tpl);
  run_result c = RUN_ARGS(NULL, "generate", "--prompt", "hello there", "-n", "1", "--temp", "0", "--stats");
  CHECK_MSG(a.status == 0 && b.status == 0 && c.status == 0, "%d %d %d: %s %s", a.status, b.status, c.status, b.err,
            c.err);
  long pa = prompt_tokens(a.err), pb = prompt_tokens(b.err), pc = prompt_tokens(c.err);
  /* the file renders the bare text: the raw prompt's tokens (which may add BOS), fewer than the model's template */
  CHECK_MSG(pb > 0 && (pb == pc || pb + 1 == pc) && pa > pc, "prompt tokens: model's template %ld, the file's %ld, raw %ld",
            pa, pb, pc);
  run_free(&a);
  run_free(&b);
  run_free(&c);
  a = RUN_ARGS(NULL, "generate", "--chat", "--prompt", "hi", "-n", "1", "--chat-template-file", "/nonexistent/t.jinja");
  CHECK_MSG(a.status == 1 && strstr(a.err, "chat template file") && strstr(a.err, "/nonexistent/t.jinja"), "%d %s",
            a.status, a.err);
  run_free(&a);
  a = RUN_ARGS("", "chat", "--chat-template-file", bad);
  CHECK_MSG(a.status == 1 && strstr(a.err, "bad.jinja"), "chat with a bad template: %d %s", a.status, a.err);
  run_free(&a);
  expect_usage(RUN_ARGS(NULL, "logits", "--ids", "1", "--chat-template-file", tpl), "unknown", "logits --chat-template-file");
  /* --chat-template takes a file too */
  a = RUN_ARGS(NULL, "generate", "--chat", "--prompt", "hello there", "-n", "1", "--temp", "0", "--stats",
               "--chat-template", tpl);
  CHECK_MSG(a.status == 0 && prompt_tokens(a.err) == pb, "--chat-template FILE: %d %s", a.status, a.err);
  run_free(&a);
  unlink(tpl);
  unlink(bad);
}

/* --chat-template NAME renders with a template hearth ships; an unknown name is
 * refused listing the names; it and --chat-template-file exclude each other. */
static void test_chat_template_name(void) {
  char msgs[600];
  snprintf(msgs, sizeof msgs, "%s/msgs.json", tmpdir);
  FILE *f = fopen(msgs, "w");
  if (f) fputs("[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"}]", f), fclose(f);
  run_result r = RUN_ARGS(NULL, "template", "--model", DEFAULT_MODEL, "--messages", msgs, "--chat-template", "chatml");
  CHECK_MSG(r.status == 0, "template --chat-template chatml: %d %s", r.status, r.err);
  CHECK_EQ_STR(r.out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  run_free(&r);
  r = RUN_ARGS(NULL, "template", "--model", DEFAULT_MODEL, "--messages", msgs, "--chat-template", "gemma",
               "--no-generation-prompt");
  CHECK_MSG(r.status == 0 && strstr(r.out, "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n") &&
                !strstr(r.out, "<start_of_turn>model"),
            "template --chat-template gemma: %d %s %s", r.status, r.out, r.err);
  run_free(&r);
  run_result a = RUN_ARGS(NULL, "generate", "--chat", "--prompt", "hello there", "-n", "1", "--temp", "0", "--stats");
  run_result b = RUN_ARGS(NULL, "generate", "--chat", "--prompt", "hello there", "-n", "1", "--temp", "0", "--stats",
                          "--chat-template", "llama3");
  CHECK_MSG(a.status == 0 && b.status == 0 && prompt_tokens(b.err) > 0 && prompt_tokens(b.err) != prompt_tokens(a.err),
            "generate --chat-template llama3: %d %d %s", a.status, b.status, b.err);
  run_free(&a);
  run_free(&b);
  r = RUN_ARGS(NULL, "generate", "--chat", "--prompt", "hi", "-n", "1", "--chat-template", "chatml3");
  CHECK_MSG(r.status == 1 && strstr(r.err, "'chatml3'") && strstr(r.err, "chatml, deepseek3, gemma, llama3, mistral-v7, phi3"),
            "unknown name: %d %s", r.status, r.err);
  run_free(&r);
  r = RUN_ARGS(NULL, "template", "--model", DEFAULT_MODEL, "--messages", msgs, "--chat-template", "chatml3");
  CHECK_MSG(r.status == 1 && strstr(r.err, "not a built-in template"), "template unknown name: %d %s", r.status, r.err);
  run_free(&r);
  expect_usage(RUN_ARGS(NULL, "generate", "--chat", "--prompt", "hi", "--chat-template", "chatml", "--chat-template-file", msgs),
               "give one", "both template options");
  expect_usage(RUN_ARGS(NULL, "logits", "--ids", "1", "--chat-template", "chatml"), "unknown", "logits --chat-template");
  r = RUN_ARGS(NULL, "template", "--help");
  CHECK_MSG(r.status == 0 && strstr(r.out, "mistral-v7"), "template --help names the templates: %s", r.out);
  run_free(&r);
  unlink(msgs);
}

static void test_system_needs_chat(void) {
  expect_usage(RUN_ARGS(NULL, "generate", "--system", "be brief", "--prompt", "hi"), "--system needs --chat",
               "generate --system");
  run_result r = RUN_ARGS(NULL, "generate", "--system", "be brief", "--chat", "--prompt", "hi", "-n", "2");
  CHECK_MSG(r.status == 0, "generate --chat --system: %d %s", r.status, r.err);
  run_free(&r);
}

static void test_help_and_inspect(void) {
  run_result r = RUN_ARGS(NULL, "help");
  CHECK_MSG(r.status == 0 && strstr(r.out, "verbs:") && strstr(r.out, "generate"), "help: %d %s", r.status, r.err);
  run_free(&r);
  static const char *verbs[] = {"generate", "chat", "inspect", "logits", "serve", "convert", "tokenize", "help"};
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) {
    r = RUN_ARGS(NULL, "help", verbs[i]);
    CHECK_MSG(r.status == 0 && strstr(r.out, "usage: hearth"), "help %s: %d %s", verbs[i], r.status, r.err);
    run_free(&r);
  }
  r = RUN_ARGS(NULL, "help", "nope");
  CHECK_MSG(r.status == 2 && strstr(r.err, "unknown verb 'nope'"), "help nope: %d %s", r.status, r.err);
  run_free(&r);
  /* inspect: the built-in model by default, and --model like every verb */
  r = RUN_ARGS(NULL, "inspect", "--json");
  CHECK_MSG(r.status == 0 && strstr(r.out, "\"model_type\""), "inspect: %d %s", r.status, r.err);
  run_result m = RUN_ARGS(NULL, "inspect", "--model", DEFAULT_MODEL, "--json");
  CHECK_MSG(m.status == 0, "inspect --model: %d %s", m.status, m.err);
  CHECK_EQ_STR(m.out, r.out);
  run_free(&r), run_free(&m);
  expect_usage(RUN_ARGS(NULL, "inspect", "--model", DEFAULT_MODEL, DEFAULT_MODEL), "one PATH only", "inspect two paths");
}

static void test_gguf_in_every_verb(void) {
  CHECK_MSG(hfile_exists(GGUF_TINY), "%s is missing (ctest's fixtures.tiny_gguf writes it)", GGUF_TINY);
  if (!hfile_exists(GGUF_TINY)) return;
  const char *want = "23329 30286 10349 423 7465 23542 6765 2458\n"; /* tools/ref_llama_gguf.py, as in model/test_gguf.c */
  run_result r = RUN_ARGS(NULL, "generate", "--model", GGUF_TINY, "--ids", "1,15043,3186", "-n", "8", "--temp", "0",
                          "--print-ids", "--ignore-eos");
  CHECK_MSG(r.status == 0, "generate gguf: %s", r.err);
  CHECK_EQ_STR(r.out, want);
  run_free(&r);
  r = RUN_ARGS(NULL, "generate", "--model", GGUF_TINY, "--prompt", "Hello world", "-n", "8", "--print-ids",
               "--ignore-eos", "--threads", "1");
  CHECK_MSG(r.status == 0, "generate gguf text: %s", r.err);
  CHECK_EQ_STR(r.out, want);
  run_free(&r);
  /* the file has no chat template: chats render as chatml, with a warning that says so */
  r = RUN_ARGS(NULL, "generate", "--model", GGUF_TINY, "--chat", "--prompt", "hi", "-n", "2", "--ignore-eos", "--stats");
  CHECK_MSG(r.status == 0 && strstr(r.err, "no chat template") && strstr(r.err, "chatml"), "chat gguf: %d %s", r.status,
            r.err);
  long fallback = prompt_tokens(r.err);
  run_free(&r);
  r = RUN_ARGS(NULL, "generate", "--model", GGUF_TINY, "--chat", "--prompt", "hi", "-n", "2", "--ignore-eos", "--stats",
               "--chat-template", "chatml");
  CHECK_MSG(r.status == 0 && !strstr(r.err, "no chat template") && prompt_tokens(r.err) == fallback && fallback > 2,
            "chat gguf, chatml named: %d %s", r.status, r.err);
  run_free(&r);
  /* serve loads it too: an unusable port fails after the model loaded */
  r = RUN_ARGS(NULL, "serve", "--model", GGUF_TINY, "--host", "256.0.0.1", "--port", "1");
  CHECK_MSG(r.status == 1 && !strstr(r.err, "not a model folder"), "serve gguf: %d %s", r.status, r.err);
  run_free(&r);
  r = RUN_ARGS(NULL, "inspect", "--model", GGUF_TINY);
  CHECK_MSG(r.status == 0 && strstr(r.out, "llama"), "inspect gguf: %d %s", r.status, r.err);
  run_free(&r);
}

static void test_absurd_config(void) {
  char dir[700], path[800];
  snprintf(dir, sizeof dir, "%s/huge", tmpdir);
  mkdir(dir, 0755);
  static const char *files[] = {"model.safetensors", "tokenizer.json", "tokenizer_config.json"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char from[700];
    snprintf(from, sizeof from, "%s/%s", DEFAULT_MODEL, files[i]);
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    if (symlink(from, path)) perror(path);
  }
  char *cfg = NULL;
  size_t len;
  CHECK(hfile_read(DEFAULT_MODEL "/config.json", &cfg, &len, NULL) == 0);
  char *at = cfg ? strstr(cfg, "\"max_position_embeddings\": 1024") : NULL;
  CHECK(at != NULL);
  if (!at) return free(cfg);
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  if (f) {
    fprintf(f, "%.*s\"max_position_embeddings\": 1e12%s", (int)(at - cfg), cfg, at + strlen("\"max_position_embeddings\": 1024"));
    fclose(f);
  }
  free(cfg);
  static const char *verbs[] = {"generate", "logits", "bench"};
  for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++) {
    run_result r = !strcmp(verbs[i], "bench") ? RUN_ARGS(NULL, "bench", "--model", dir, "-p", "1", "-n", "1")
                                              : RUN_ARGS(NULL, verbs[i], "--model", dir, "--ids", "1,2", "-n", "-1");
    if (!strcmp(verbs[i], "logits")) {
      run_free(&r);
      r = RUN_ARGS(NULL, "logits", "--model", dir, "--ids", "1,2");
    }
    CHECK_MSG(r.status == 1 && strstr(r.err, "max_position_embeddings"), "%s: %d %s", verbs[i], r.status, r.err);
    run_free(&r);
  }
}

static void test_convert_reports(void) {
  CHECK_MSG(hfile_exists(GGUF_TINY), "%s is missing (ctest's fixtures.tiny_gguf writes it)", GGUF_TINY);
  if (!hfile_exists(GGUF_TINY)) return;
  char dst[700];
  snprintf(dst, sizeof dst, "%s/out.gguf", tmpdir);
  /* not a terminal: the summary line only */
  run_result r = RUN_ARGS(NULL, "convert", GGUF_TINY, dst, "--quant", "f16");
  CHECK_MSG(r.status == 0, "convert: %s", r.err);
  CHECK_MSG(strstr(r.err, "wrote") && strstr(r.err, "12 tensors") && !strstr(r.err, "\r"), "%s", r.err);
  run_free(&r);
  /* on a terminal: progress lines (tensor k of n, bytes, rate), then the summary */
  r = run_opts((const char *const[]){"convert", GGUF_TINY, dst, "--quant", "f16", NULL}, NULL, true);
  CHECK_MSG(r.status == 0, "convert on a tty: %s", r.err);
  CHECK_MSG(strstr(r.err, "tensor 12 of 12") && strstr(r.err, "/s") && strstr(r.err, "\r") && strstr(r.err, "wrote"), "%s",
            r.err);
  run_free(&r);
}

static void test_chat_commands(void) {
  /* /help lists the commands and is not sent to the model; nor is an unknown command */
  run_result r = RUN_ARGS("/help\n/nonsense\n/quit\n", "chat", "--temp", "0", "-n", "4");
  CHECK_MSG(r.status == 0, "chat: %d %s", r.status, r.err);
  CHECK_MSG(strstr(r.err, "/reset") && strstr(r.err, "/quit") && strstr(r.err, "/help"), "%s", r.err);
  CHECK_MSG(strstr(r.err, "unknown command '/nonsense'"), "%s", r.err);
  CHECK_MSG(r.out[0] == 0, "something was sent to the model: '%s'", r.out);
  run_free(&r);
  /* an ordinary line still gets a reply */
  r = RUN_ARGS("hello\n", "chat", "--temp", "0", "-n", "4");
  CHECK_MSG(r.status == 0 && r.out[0], "chat reply: %d '%s' %s", r.status, r.out, r.err);
  run_free(&r);
}

/* Reads the terminal until `want` has appeared `times` times in all it printed (30 s at most). */
static bool tty_wait(int master, hbuf *seen, const char *want, int times) {
  for (int waited = 0; waited < 30000;) {
    int n = 0;
    for (const char *p = hbuf_str(seen); (p = strstr(p, want)); p += strlen(want)) n++;
    if (n >= times) return true;
    struct pollfd pf = {.fd = master, .events = POLLIN};
    if (poll(&pf, 1, 100) <= 0) {
      waited += 100;
      continue;
    }
    char buf[4096];
    ssize_t got = read(master, buf, sizeof buf);
    if (got <= 0) return false;
    hbuf_append(seen, buf, (size_t)got);
  }
  return false;
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
  return n;
}

/* `hearth chat` on a terminal edits lines and keeps their history (libedit):
 * the up arrow brings the last line back, Ctrl-A goes to the line's start.
 * Commands are used so that nothing depends on the model's replies; a plain
 * line reader would send the escape sequences to the model instead. */
static void test_chat_line_editing(void) {
  int master = posix_openpt(O_RDWR | O_NOCTTY);
  char *slave = NULL;
  if (master < 0 || grantpt(master) || unlockpt(master) || !(slave = ptsname(master))) {
    CHECK_MSG(false, "no pseudo-terminal");
    return;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    setsid();
    int t = open(slave, O_RDWR);
    if (t < 0) _exit(126);
    dup2(t, 0);
    dup2(t, 1);
    dup2(t, 2);
    setenv("TERM", "xterm", 1);
    execl(HEARTH_BINARY, HEARTH_BINARY, "chat", "--temp", "0", "-n", "4", (char *)NULL);
    _exit(127);
  }
  hbuf seen = {0};
  static const char *const lines[] = {"/nonsense\r", "\x1b[A\r", "nonsense2\x01/\r", "/quit\r"};
  bool ok = true;
  for (int i = 0; ok && i < 4; i++) {
    ok = tty_wait(master, &seen, "> ", i + 1);
    CHECK_MSG(ok, "prompt %d never came: %s", i + 1, hbuf_str(&seen));
    if (ok) CHECK(write(master, lines[i], strlen(lines[i])) == (ssize_t)strlen(lines[i]));
  }
  tty_wait(master, &seen, "\x01never", 1); /* the rest, until the child closes the terminal */
  int st = 0;
  if (!ok) kill(pid, SIGKILL);
  CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
  const char *out = hbuf_str(&seen);
#ifdef HEARTH_HAVE_LIBEDIT
  CHECK_MSG(count_of(out, "unknown command '/nonsense'") == 2, "the up arrow did not bring the line back: %s", out);
  CHECK_MSG(count_of(out, "unknown command '/nonsense2'") == 1, "Ctrl-A did not edit the line: %s", out);
#else
  CHECK_MSG(count_of(out, "unknown command '/nonsense'") == 1, "%s", out);
#endif
  hbuf_free(&seen);
  close(master);
}

int main(void) {
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  RUN(test_threads_everywhere);
  RUN(test_numbers);
  RUN(test_ids_lists);
  RUN(test_system_needs_chat);
  RUN(test_ctx_size);
  RUN(test_chat_template_file);
  RUN(test_chat_template_name);
  RUN(test_serve_startup);
  RUN(test_fit_and_help_texts);
  RUN(test_help_and_inspect);
  RUN(test_gguf_in_every_verb);
  RUN(test_absurd_config);
  RUN(test_convert_reports);
  RUN(test_chat_commands);
  RUN(test_chat_line_editing);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
  fprintf(stderr, "%d checks, %d failures\n", test_checks, test_failures);
  return test_failures ? 1 : 0;
}
