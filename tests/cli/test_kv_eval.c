/* test_kv_eval.c — `hearth kv-eval` on the golden llama: by default both
 * golden prompts with the 8-bit, the FP8 and the 4-bit cache, one JSON line
 * each, with errors that are positive, below the logits' own size, and
 * larger at FP8 than at 8 bits, larger at 4 bits than at FP8; --kv-quant
 * picks one format (fp8 too); a folder without prompts and no
 * --ids is an error that says so. No timing thresholds. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "test.h"

#define MODEL HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-f32"

static int run(const char *cmd, char **out) {
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  size_t cap = 4096, n = 0, k;
  char *buf = malloc(cap);
  while (buf && (k = fread(buf + n, 1, cap - n - 1, p)) > 0) {
    n += k;
    if (n + 1 == cap) buf = realloc(buf, cap *= 2);
  }
  if (buf) buf[n] = 0;
  int rc = pclose(p);
  *out = buf;
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_default_formats(void) {
  char *out = NULL;
  CHECK_EQ_INT(run("'" HEARTH_BINARY "' kv-eval --model '" MODEL "' -n 8 --json 2>/dev/null", &out), 0);
  if (!out) return;
  int lines = 0;
  double mean[2][3] = {{0}}; /* prompt, [q8, fp8, q4] */
  for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n"), lines++) {
    json_error_t je;
    json_t *j = json_loads(line, 0, &je);
    CHECK_MSG(j != NULL, "not JSON: %s", line);
    if (!j) continue;
    const char *kv = json_string_value(json_object_get(j, "kv"));
    int prompt = (int)json_integer_value(json_object_get(j, "prompt"));
    double mx = json_number_value(json_object_get(j, "max_abs_err")), logit = json_number_value(json_object_get(j, "max_abs_logit"));
    CHECK(kv && (!strcmp(kv, "q8") || !strcmp(kv, "fp8") || !strcmp(kv, "q4")));
    CHECK(prompt == 0 || prompt == 1);
    CHECK_MSG(mx > 0 && mx < logit, "max error %g, max logit %g", mx, logit);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "n_gen")), 8);
    CHECK(json_integer_value(json_object_get(j, "first_divergence")) >= 1);
    if (kv && (prompt == 0 || prompt == 1))
      mean[prompt][!strcmp(kv, "q4") ? 2 : !strcmp(kv, "fp8")] = json_number_value(json_object_get(j, "mean_abs_err"));
    json_decref(j);
  }
  CHECK_EQ_INT(lines, 6);
  for (int k = 0; k < 2; k++)
    CHECK_MSG(mean[k][0] > 0 && mean[k][1] > mean[k][0] && mean[k][2] > mean[k][1], "prompt %d: q8 %g, fp8 %g, q4 %g", k,
              mean[k][0], mean[k][1], mean[k][2]);
  free(out);
}

static void test_one_format_and_errors(void) {
  char *out = NULL;
  CHECK_EQ_INT(run("'" HEARTH_BINARY "' kv-eval --model '" MODEL "' --kv-quant 8 --ids 5,6,7,8 -n 4 2>/dev/null", &out), 0);
  CHECK_MSG(out && strstr(out, "q8") && !strstr(out, "q4") && strstr(out, "max|dlogit|"), "%s", out ? out : "");
  free(out);
  out = NULL;
  CHECK_EQ_INT(run("'" HEARTH_BINARY "' kv-eval --model '" MODEL "' --kv-quant fp8 --ids 5,6,7,8 -n 4 2>/dev/null", &out), 0);
  CHECK_MSG(out && strstr(out, "fp8") && !strstr(out, "q8") && !strstr(out, "q4"), "%s", out ? out : "");
  free(out);
  out = NULL;
  /* no prompt and no golden.json: a usage error that says what to give */
  CHECK_EQ_INT(run("'" HEARTH_BINARY "' kv-eval --model '" HEARTH_SOURCE_DIR "/models/default' 2>&1", &out), 2);
  CHECK_MSG(out && strstr(out, "no prompt: give TEXT or --ids") && strstr(out, "golden.json"), "%s", out ? out : "");
  free(out);
  out = NULL;
  CHECK_EQ_INT(run("'" HEARTH_BINARY "' kv-eval 2>&1", &out), 2);
  CHECK_MSG(out && strstr(out, "no prompt"), "%s", out ? out : "");
  free(out);
  out = NULL;
  /* --model defaults to the built-in model, as in every other verb */
  CHECK_EQ_INT(run("'" HEARTH_BINARY "' kv-eval --kv-quant 8 -n 2 'Hello there' 2>/dev/null", &out), 0);
  CHECK_MSG(out && strstr(out, "default") && strstr(out, "q8"), "%s", out ? out : "");
  free(out);
}

int main(void) {
  RUN(test_default_formats);
  RUN(test_one_format_and_errors);
  TEST_MAIN_END();
}
