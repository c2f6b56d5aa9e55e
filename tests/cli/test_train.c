/* test_train.c — `hearth train`: usage errors name what is wrong (no
 * method, dpo / orpo not built, missing --data / --out, an unknown target,
 * a data file that is missing or has a bad line, which is named with its
 * line number); a short run on the built-in model from prompt / completion
 * lines with rsLoRA, dropout and three targets writes the adapter's two
 * files with those settings and a JSONL log, prints a progress line per
 * step, and `hearth generate --adapter` runs under what it wrote. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "base/json.h"
#include "test.h"

static char tmp[256];

static int run(const char *cmd) {
  char full[4096];
  snprintf(full, sizeof full, "%s 2>%s/stderr.txt", cmd, tmp);
  int rc = system(full);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static char *last_stderr(void) {
  char p[300], *s = NULL;
  size_t n;
  snprintf(p, sizeof p, "%s/stderr.txt", tmp);
  if (hfile_read(p, &s, &n, NULL)) return strdup("");
  return s;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (f) fputs(text, f), fclose(f);
}

static void expect(const char *args, int code, const char *needle) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s' train %s", HEARTH_BINARY, args);
  int rc = run(cmd);
  char *e = last_stderr();
  CHECK_MSG(rc == code && strstr(e, needle) != NULL, "hearth train %s: exit %d, stderr: %s", args, rc, e);
  free(e);
}

static void test_usage(void) {
  char args[1024];
  expect("", 2, "usage: hearth train sft");
  expect("dpo --data x --out y", 2, "'dpo' is not a training method");
  expect("sft --out /nonexistent", 2, "--data FILE is required");
  expect("sft --data x", 2, "--out DIR is required");
  expect("sft --data x --out y --target q_proj,lm_head", 2, "'lm_head' is not one of");
  expect("sft --data x --out y --rank 0", 2, "--rank");
  snprintf(args, sizeof args, "sft --data '%s/missing.jsonl' --out '%s/a'", tmp, tmp);
  expect(args, 1, "missing.jsonl");
  char bad[400];
  snprintf(bad, sizeof bad, "%s/bad.jsonl", tmp);
  write_file(bad, "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"a\"}\n");
  snprintf(args, sizeof args, "sft --data '%s' --out '%s/a'", bad, tmp);
  expect(args, 1, "bad.jsonl:2: \"prompt\" and \"completion\" must both be strings");
}

static void test_run(void) {
  char data[400], out[400], logp[400], cmd[4096];
  snprintf(data, sizeof data, "%s/pc.jsonl", tmp);
  snprintf(out, sizeof out, "%s/adapter", tmp);
  snprintf(logp, sizeof logp, "%s/log.jsonl", tmp);
  write_file(data, "{\"prompt\": \"And God said,\", \"completion\": \" Let there be light.\"}\n"
                   "{\"prompt\": \"In the beginning\", \"completion\": \" God created the heaven.\"}\n"
                   "\n"
                   "{\"prompt\": \"The LORD is\", \"completion\": \" my shepherd.\"}\n");
  snprintf(cmd, sizeof cmd,
           "'%s' train sft --data '%s' --out '%s' --log '%s' --steps 3 --batch 2 --rank 4 --alpha 8 --rslora --dropout 0.1 "
           "--target q,k_proj,down_proj --lr 1e-2 --seed 5 --threads 2",
           HEARTH_BINARY, data, out, logp);
  int rc = run(cmd);
  char *e = last_stderr();
  CHECK_MSG(rc == 0, "exit %d: %s", rc, e);
  CHECK_MSG(strstr(e, "3 examples") && strstr(e, "step 1/3 loss ") && strstr(e, "step 3/3 loss ") && strstr(e, "tokens/s"), "%s", e);
  free(e);
  char path[500];
  snprintf(path, sizeof path, "%s/adapter_config.json", out);
  herr err = {0};
  json_t *c = hjson_load_file(path, &err);
  CHECK_MSG(c != NULL, "%s", err.msg);
  if (c) {
    CHECK(json_integer_value(json_object_get(c, "r")) == 4);
    CHECK(json_number_value(json_object_get(c, "lora_alpha")) == 8);
    CHECK(json_is_true(json_object_get(c, "use_rslora")));
    CHECK(json_number_value(json_object_get(c, "lora_dropout")) > 0.09);
    CHECK_EQ_STR(json_string_value(json_object_get(c, "peft_type")), "LORA");
    const json_t *tm = json_object_get(c, "target_modules");
    CHECK(json_array_size(tm) == 3 && !strcmp(json_string_value(json_array_get(tm, 0)), "q_proj") &&
          !strcmp(json_string_value(json_array_get(tm, 2)), "down_proj"));
    json_decref(c);
  }
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", out);
  struct stat sb;
  CHECK(stat(path, &sb) == 0 && sb.st_size > 0);
  char *log = NULL;
  size_t n = 0;
  CHECK(hfile_read(logp, &log, &n, NULL) == 0);
  int lines = 0;
  for (char *p = log; p && *p; p++) lines += *p == '\n';
  CHECK_EQ_INT(lines, 3);
  CHECK(log && strstr(log, "\"step\":3,\"loss\":") != NULL);
  free(log);
  snprintf(cmd, sizeof cmd, "'%s' generate --adapter '%s' --ids 0,5,10 -n 4 --temp 0 --print-ids > '%s/ids.txt'", HEARTH_BINARY,
           out, tmp);
  rc = run(cmd);
  e = last_stderr();
  CHECK_MSG(rc == 0, "generate --adapter: exit %d: %s", rc, e);
  free(e);
}

int main(void) {
  snprintf(tmp, sizeof tmp, "/tmp/hearth_test_train_%d", (int)getpid());
  mkdir(tmp, 0755);
  RUN(test_usage);
  RUN(test_run);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmp);
  TEST_MAIN_END();
}
