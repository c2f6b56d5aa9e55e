/* test_bench.c — `hearth bench` on the golden llama: --json prints exactly
 * one line with pp_tps, tg_tps, threads and model (positive rates, the
 * thread count asked for); the text form names both tests; bad arguments
 * are usage errors. No timing thresholds. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "test.h"

#define MODEL HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-f32"

/* Runs cmd; stdout into *out (malloc'd). Returns the exit status. */
static int run(const char *cmd, char **out) {
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  size_t k;
  while (buf && (k = fread(buf + n, 1, cap - n - 1, p)) > 0) {
    n += k;
    if (n + 1 == cap) buf = realloc(buf, cap *= 2);
  }
  if (buf) buf[n] = 0;
  int rc = pclose(p);
  *out = buf;
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void test_json(void) {
  char *out = NULL;
  int rc = run("'" HEARTH_BINARY "' bench --model '" MODEL "' -p 16 -n 4 -t 2 --repeat 3 --json 2>/dev/null", &out);
  CHECK_EQ_INT(rc, 0);
  if (!out) return;
  char *nl = strchr(out, '\n');
  CHECK_MSG(nl && nl[1] == 0, "expected exactly one line, got: %s", out);
  json_error_t je;
  json_t *j = json_loads(out, 0, &je);
  CHECK_MSG(j != NULL, "not JSON: %s", out);
  if (j) {
    CHECK_EQ_INT(json_object_size(j), 6);
    CHECK_EQ_STR(json_string_value(json_object_get(j, "kv")), "f32");
    CHECK_EQ_STR(json_string_value(json_object_get(j, "device")), "cpu");
    CHECK(json_number_value(json_object_get(j, "pp_tps")) > 0);
    CHECK(json_number_value(json_object_get(j, "tg_tps")) > 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "threads")), 2);
    CHECK_EQ_STR(json_string_value(json_object_get(j, "model")), MODEL);
    json_decref(j);
  }
  free(out);
}

/* --kv-quant: the cache's format, named in the output, with -d too */
static void test_depth_and_kv(void) {
  char *out = NULL;
  int rc = run("'" HEARTH_BINARY "' bench --model '" MODEL "' -p 0 -n 2 -d 20 --kv-quant 8 --repeat 1 2>/dev/null", &out);
  CHECK_EQ_INT(rc, 0);
  CHECK_MSG(out && strstr(out, "tg2") && strstr(out, "at a context of 20 tokens") && strstr(out, "kv       q8"), "%s", out ? out : "");
  free(out);
  out = NULL;
  rc = run("'" HEARTH_BINARY "' bench --model '" MODEL "' -p 0 -n 2 -d 5 --kv-quant 4 --repeat 1 --json 2>/dev/null", &out);
  CHECK_EQ_INT(rc, 0);
  CHECK_MSG(out && strstr(out, "\"depth\":5") && strstr(out, "\"kv\":\"q4\""), "%s", out ? out : "");
  free(out);
  out = NULL;
  rc = run("'" HEARTH_BINARY "' bench --model '" MODEL "' -p 0 -n 2 --kv-quant 5 2>&1", &out);
  CHECK_EQ_INT(rc, 2);
  CHECK_MSG(out && strstr(out, "--kv-quant must be 8, 4, fp8 or off"), "%s", out ? out : "");
  free(out);
  out = NULL;
  rc = run("'" HEARTH_BINARY "' bench --model '" MODEL "' -p 0 -n 2 -d 5 --kv-quant fp8 --repeat 1 --json 2>/dev/null", &out);
  CHECK_EQ_INT(rc, 0);
  CHECK_MSG(out && strstr(out, "\"kv\":\"fp8\""), "%s", out ? out : "");
  free(out);
}

static void test_text_and_parts(void) {
  char *out = NULL;
  int rc = run("'" HEARTH_BINARY "' bench --model '" MODEL "' -p 8 -n 2 --repeat 1 2>/dev/null", &out);
  CHECK_EQ_INT(rc, 0);
  CHECK_MSG(out && strstr(out, "pp8") && strstr(out, "tg2") && strstr(out, "tokens/s"), "%s", out ? out : "");
  free(out);
  rc = run("'" HEARTH_BINARY "' bench --model '" MODEL "' -p 0 -n 3 --repeat 1 --json 2>/dev/null", &out);
  CHECK_EQ_INT(rc, 0);
  json_t *j = out ? json_loads(out, 0, NULL) : NULL;
  CHECK(j && json_number_value(json_object_get(j, "pp_tps")) == 0 && json_number_value(json_object_get(j, "tg_tps")) > 0);
  json_decref(j);
  free(out);
}

static void test_usage_errors(void) {
  static const char *const bad[] = {"-p x", "-n -1", "-t 0x", "-t -1", "--repeat 0", "-p 0 -n 0", "--bogus"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char cmd[600], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' bench --model '%s' %s 2>/dev/null", HEARTH_BINARY, MODEL, bad[i]);
    CHECK_MSG(run(cmd, &out) == 2, "%s", bad[i]);
    free(out);
  }
  char *out = NULL;
  CHECK_EQ_INT(run("'" HEARTH_BINARY "' bench --model /nonexistent -p 4 -n 1 2>/dev/null", &out), 1);
  free(out);
}

/* --roofline adds the weights' size, the copy bandwidth and generation's share of it. */
static void test_roofline(void) {
  char *out = NULL;
  int rc = run("'" HEARTH_BINARY "' bench --model '" MODEL "' -p 0 -n 4 -t 1 --repeat 1 --roofline --json 2>/dev/null", &out);
  CHECK_EQ_INT(rc, 0);
  json_error_t je;
  json_t *j = out ? json_loads(out, 0, &je) : NULL;
  CHECK_MSG(j != NULL, "not JSON: %s", out ? out : "");
  if (j) {
    double w = json_number_value(json_object_get(j, "weights_gb")), bw = json_number_value(json_object_get(j, "copy_gbs")),
           share = json_number_value(json_object_get(j, "tg_roofline")), tg = json_number_value(json_object_get(j, "tg_tps"));
    CHECK(w > 0 && bw > 0 && tg > 0);
    CHECK_NEAR(share, w * tg / bw, 1e-6 * (share > 1 ? share : 1));
    json_decref(j);
  }
  free(out);
}

/* --profile: the timed generation steps broken down by op. The golden llama
 * (2 layers, hidden 64, kv width 32, FFN 128, vocab 512, untied) runs per
 * step q, k, v, o, gate, up, down per layer and the output matrix once, and
 * attention once per layer; the op times and the rest add up to the step. */
static void test_profile(void) {
  char *out = NULL;
  int rc = run("'" HEARTH_BINARY "' bench --model '" MODEL "' -p 0 -n 3 -t 2 --repeat 1 --profile --json 2>/dev/null", &out);
  CHECK_EQ_INT(rc, 0);
  json_t *j = out ? json_loads(out, 0, NULL) : NULL;
  json_t *pr = json_object_get(j, "tg_profile"), *ops = json_object_get(pr, "ops");
  CHECK_MSG(json_is_array(ops), "%s", out ? out : "");
  if (json_is_array(ops)) {
    double matmuls = 0, attn = 0, head = 0, sum = 0;
    int shapes = 0;
    size_t i;
    json_t *o;
    json_array_foreach(ops, i, o) {
      const char *op = json_string_value(json_object_get(o, "op"));
      double calls = json_number_value(json_object_get(o, "calls_per_step")), ms = json_number_value(json_object_get(o, "ms_per_step"));
      int64_t rows = json_integer_value(json_object_get(o, "rows")), cols = json_integer_value(json_object_get(o, "cols"));
      CHECK(ms >= 0);
      sum += ms;
      if (op && !strcmp(op, "matmul")) {
        matmuls += calls, shapes++;
        CHECK(json_number_value(json_object_get(o, "gbs")) >= 0);
        if (rows == 512 && cols == 64) head += calls;
        if (rows == 32) CHECK_NEAR(calls, 4, 1e-9); /* k and v of both layers */
      } else if (op && !strcmp(op, "attention")) {
        attn += calls;
      }
    }
    CHECK_NEAR(matmuls, 7 * 2 + 1, 1e-9);
    CHECK_NEAR(attn, 2, 1e-9);
    CHECK_NEAR(head, 1, 1e-9);
    CHECK_EQ_INT(shapes, 5); /* 64x64 (q, o), 32x64 (k, v), 128x64 (gate, up), 64x128 (down), 512x64 */
    double step = json_number_value(json_object_get(pr, "step_ms")), rest = json_number_value(json_object_get(pr, "rest_ms"));
    CHECK(rest >= 0);
    CHECK_NEAR(sum + rest, step, 1e-6 * (step > 1 ? step : 1));
    CHECK_NEAR(step, 1e3 / json_number_value(json_object_get(j, "tg_tps")), 1e-6 * (step > 1 ? step : 1));
  }
  json_decref(j);
  free(out);
  rc = run("'" HEARTH_BINARY "' bench --model '" MODEL "' -p 0 -n 2 --repeat 1 --profile 2>/dev/null", &out);
  CHECK_EQ_INT(rc, 0);
  CHECK_MSG(out && strstr(out, "profile  one generation step") && strstr(out, "attention") && strstr(out, "rest"), "%s", out ? out : "");
  free(out);
  CHECK_EQ_INT(run("'" HEARTH_BINARY "' bench --model '" MODEL "' -p 4 -n 0 --profile 2>/dev/null", &out), 2);
  free(out);
}

/* A device that is not there is a clear failure, a misspelt one a usage error. */
static void test_devices(void) {
  char *out = NULL;
  int rc = run("'" HEARTH_BINARY "' bench --model '" MODEL "' -p 4 -n 0 --repeat 1 --device cpu 2>&1", &out);
  CHECK_EQ_INT(rc, 0);
  free(out);
  rc = run("HEARTH_NO_SUCH=1 '" HEARTH_BINARY "' bench --model '" MODEL "' -p 4 -n 0 --repeat 1 --device cuda:0 2>&1", &out);
  if (rc == 0) {
    fprintf(stderr, "  (a GPU is usable here: the missing-device case is not checked)\n");
  } else {
    CHECK_EQ_INT(rc, 1);
    CHECK_MSG(out && strstr(out, "cuda"), "%s", out ? out : "");
  }
  free(out);
  rc = run("'" HEARTH_BINARY "' bench --model '" MODEL "' -p 4 -n 1 --repeat 1 --f32-as-bf16 --json 2>&1", &out);
  CHECK_EQ_INT(rc, 0);
  free(out);
  rc = run("'" HEARTH_BINARY "' bench --model '" MODEL "' --device tpu 2>&1", &out);
  CHECK_EQ_INT(rc, 2);
  CHECK_MSG(out && strstr(out, "--device"), "%s", out ? out : "");
  free(out);
  rc = run("'" HEARTH_BINARY "' tokenize --device cuda hello 2>&1", &out);
  CHECK(rc != 0);
  free(out);
}

int main(void) {
  RUN(test_json);
  RUN(test_roofline);
  RUN(test_profile);
  RUN(test_devices);
  RUN(test_text_and_parts);
  RUN(test_depth_and_kv);
  RUN(test_usage_errors);
  TEST_MAIN_END();
}
