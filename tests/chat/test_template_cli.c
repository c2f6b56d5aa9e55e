/* test_template_cli.c — `hearth template` end to end: renders a model's
 * template over a messages file exactly as the library does (compared with
 * the Jinja2-made fixture for the same conversation), honours
 * --no-generation-prompt / --kwargs / --tools / --chat-template-file, and
 * fails cleanly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/buf.h"
#include "test.h"

static int run(const char *cmd, hbuf *out) {
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) hbuf_append(out, buf, n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

static void test_template_verb(void) {
  char dir[] = "/tmp/hearth_template_cli_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char msgs[512], tools[512], cmd[4096];
  snprintf(msgs, sizeof msgs, "%s/messages.json", dir);
  snprintf(tools, sizeof tools, "%s/tools.json", dir);
  write_file(msgs, "[{\"role\": \"system\", \"content\": \"You are a helpful assistant.\"}, {\"role\": \"user\", \"content\": \"What is 2+2?\"}]");
  write_file(tools, "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\", \"parameters\": {}}}]");
  const char *qwen = HEARTH_DEPS_DIR "/tokenizers/qwen3";

  hbuf out = {0};
  snprintf(cmd, sizeof cmd, "%s template --model %s --messages %s", HEARTH_BINARY, qwen, msgs);
  CHECK_EQ_INT(run(cmd, &out), 0);
  CHECK_EQ_STR(hbuf_str(&out), "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");

  hbuf_clear(&out);
  snprintf(cmd, sizeof cmd, "%s template --model %s/tokenizer_config.json --messages %s --no-generation-prompt", HEARTH_BINARY, qwen, msgs);
  CHECK_EQ_INT(run(cmd, &out), 0);
  CHECK_EQ_STR(hbuf_str(&out), "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n");

  hbuf_clear(&out);
  snprintf(cmd, sizeof cmd, "%s template --model %s --messages %s --kwargs '{\"enable_thinking\": false}'", HEARTH_BINARY, qwen, msgs);
  CHECK_EQ_INT(run(cmd, &out), 0);
  CHECK(strstr(hbuf_str(&out), "<|im_start|>assistant\n<think>\n\n</think>\n\n") != NULL);

  hbuf_clear(&out);
  snprintf(cmd, sizeof cmd, "%s template --model %s --messages %s --tools %s", HEARTH_BINARY, qwen, msgs, tools);
  CHECK_EQ_INT(run(cmd, &out), 0);
  CHECK(strstr(hbuf_str(&out), "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\", \"parameters\": {}}}\n</tools>") != NULL);

  /* a template that raises: non-zero exit, message on stderr */
  hbuf_clear(&out);
  write_file(msgs, "[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"b\"}]");
  snprintf(cmd, sizeof cmd, "%s template --model %s/tokenizers/gemma3 --messages %s 2>&1", HEARTH_BINARY, HEARTH_DEPS_DIR, msgs);
  CHECK_EQ_INT(run(cmd, &out), 1);
  CHECK(strstr(hbuf_str(&out), "Conversation roles must alternate user/assistant/user/assistant/...") != NULL);

  /* --chat-template-file: the file's template, the model's eos_token */
  char tpl[512];
  snprintf(tpl, sizeof tpl, "%s/custom.jinja", dir);
  write_file(tpl, "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                  "{% if add_generation_prompt %}[assistant]{% endif %}{{ eos_token }}");
  write_file(msgs, "[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"U\"}]");
  hbuf_clear(&out);
  snprintf(cmd, sizeof cmd, "%s template --model %s --messages %s --chat-template-file %s", HEARTH_BINARY, qwen, msgs, tpl);
  CHECK_EQ_INT(run(cmd, &out), 0);
  CHECK_EQ_STR(hbuf_str(&out), "[system] S\n[user] U\n[assistant]<|im_end|>");
  hbuf_clear(&out);
  snprintf(cmd, sizeof cmd, "%s template --model %s --messages %s --chat-template-file %s/missing.jinja 2>&1",
           HEARTH_BINARY, qwen, msgs, dir);
  CHECK_EQ_INT(run(cmd, &out), 1);
  CHECK(strstr(hbuf_str(&out), "chat template file") && strstr(hbuf_str(&out), "missing.jinja"));

  hbuf_clear(&out);
  snprintf(cmd, sizeof cmd, "%s template --model %s 2>&1", HEARTH_BINARY, qwen);
  CHECK_EQ_INT(run(cmd, &out), 2);
  unlink(tpl);
  hbuf_free(&out);
  unlink(msgs);
  unlink(tools);
  rmdir(dir);
}

int main(void) {
  test_need_tokenizers();
  RUN(test_template_verb);
  TEST_MAIN_END();
}
