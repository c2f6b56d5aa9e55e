/* test_train.c — `hearth train`: usage errors name what is wrong (no
 * method, an unknown one, missing --data / --out, an unknown target,
 * a data file that is missing or has a bad line, which is named with its
 * line number); a short run on the built-in model from prompt / completion
 * lines with rsLoRA, dropout and three targets writes the adapter's two
 * files with those settings and a JSONL log, prints a progress line per
 * step, writes the same bytes again with the same seed (and others with
 * another); `hearth generate --adapter` runs under what it wrote and
 * `hearth fuse` merges it; the loss curve is drawn to OUT/loss.svg and
 * loss.png when gnuplot is installed, and its absence is said without
 * failing the run. --packing packs the three lines into one sequence and
 * --checkpoint-layers says the activations it keeps; --packing with dpo and
 * a count below 1 are refused. Checkpoints: 6 steps straight and 3 steps, a resume from
 * the step-3 checkpoint (another process) and 3 more give the same adapter
 * bytes, for SFT with dropout (its generator saved) and DPO (its reference
 * recomputed); a bare --resume takes OUT's latest checkpoint and trims the
 * log back to it; a resume with other settings is refused naming the one.
 * --serve: a `hearth serve --adapter-dir` started here loads the adapter when
 * training ends (GET /v1/adapters lists it); an OUT outside the adapter
 * directory is the server's refusal, with the rule in the message. On
 * quantized bases made by `hearth convert` from the golden llama (GGUF
 * Q8_0 and Q4_0, MLX 4-bit, FP8), the trainer's forward equals the model's
 * and a few steps on one example lower its loss: the frozen base's
 * products run through its dequantized weights. */
#include <curl/curl.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/json.h"
#include "engine/kv_cache.h"
#include "model/model.h"
#include "test.h"
#include "train/train.h"

#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden"

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
  expect("ppo --data x --out y", 2, "'ppo' is not a training method");
  expect("dpo --data x --out y --beta 0", 2, "--beta");
  expect("sft --data x --out y --serve localhost:8080", 2, "--serve takes the server's URL");
  expect("sft --out /nonexistent", 2, "--data FILE is required");
  expect("sft --data x", 2, "--out DIR is required");
  expect("sft --data x --out y --target q_proj,lm_head", 2, "'lm_head' is not one of");
  expect("sft --data x --out y --rank 0", 2, "--rank");
  expect("sft --data x --out y --checkpoint-layers 0", 2, "--checkpoint-layers takes a number");
  expect("sft --data x --out y --checkpoint-layers=2x", 2, "--checkpoint-layers takes a number");
  expect("dpo --data x --out y --packing", 1, "--packing is for sft");
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
  /* seeded: the same run again writes the same bytes; another seed does not */
  for (int seed = 5; seed <= 6; seed++) {
    snprintf(cmd, sizeof cmd,
             "'%s' train sft --data '%s' --out '%s/again' --steps 3 --batch 2 --rank 4 --alpha 8 --rslora --dropout 0.1 "
             "--target q,k_proj,down_proj --lr 1e-2 --seed %d --threads 2",
             HEARTH_BINARY, data, tmp, seed);
    CHECK_EQ_INT(run(cmd), 0);
    char p1[500], p2[500];
    snprintf(p1, sizeof p1, "%s/adapter_model.safetensors", out);
    snprintf(p2, sizeof p2, "%s/again/adapter_model.safetensors", tmp);
    char *b1 = NULL, *b2 = NULL;
    size_t n1 = 0, n2 = 0;
    CHECK(hfile_read(p1, &b1, &n1, NULL) == 0 && hfile_read(p2, &b2, &n2, NULL) == 0);
    bool same = b1 && b2 && n1 == n2 && !memcmp(b1, b2, n1);
    CHECK_MSG(same == (seed == 5), "seed %d: the adapter is %s the first run's", seed, same ? "the same as" : "not");
    free(b1), free(b2);
  }
  /* the loss curve, or the note that gnuplot is missing */
  char svg[500], png[500];
  snprintf(svg, sizeof svg, "%s/loss.svg", out);
  snprintf(png, sizeof png, "%s/loss.png", out);
  if (system("command -v gnuplot >/dev/null 2>&1") == 0) {
    char *b1 = NULL, *b2 = NULL;
    size_t n1 = 0, n2 = 0;
    CHECK(hfile_read(svg, &b1, &n1, NULL) == 0 && hfile_read(png, &b2, &n2, NULL) == 0);
    CHECK_MSG(b1 && strstr(b1, "<svg") && strstr(b1, "training loss"), "loss.svg is not the curve");
    CHECK_MSG(b2 && n2 > 8 && !memcmp(b2, "\x89PNG", 4), "loss.png is not a PNG");
    free(b1), free(b2);
  } else {
    fprintf(stderr, "NOT RUN: gnuplot is not installed: the loss curve's files\n");
    snprintf(cmd, sizeof cmd, "'%s' train sft --data '%s' --out '%s/np' --steps 1 --batch 2 --rank 2 --threads 2", HEARTH_BINARY, data, tmp);
    CHECK_EQ_INT(run(cmd), 0);
    e = last_stderr();
    CHECK_MSG(strstr(e, "no loss curve: gnuplot is not installed"), "%s", e);
    free(e);
  }
  /* packing and checkpoints: the three examples in one sequence, the activations said */
  snprintf(cmd, sizeof cmd, "'%s' train sft --data '%s' --out '%s/pk' --steps 2 --batch 1 --rank 2 --threads 2 --no-plot "
           "--packing --seq-len 64 --checkpoint-layers 2", HEARTH_BINARY, data, tmp);
  rc = run(cmd);
  e = last_stderr();
  CHECK_MSG(rc == 0 && strstr(e, "3 examples packed into 1 sequence of up to 64 tokens") && strstr(e, "1 packed sequence (") &&
            strstr(e, "--checkpoint-layers 2") && strstr(e, "step 2/2 loss "), "exit %d: %s", rc, e);
  free(e);
  snprintf(cmd, sizeof cmd, "'%s' generate --adapter '%s' --ids 0,5,10 -n 4 --temp 0 --print-ids > '%s/ids.txt'", HEARTH_BINARY,
           out, tmp);
  rc = run(cmd);
  e = last_stderr();
  CHECK_MSG(rc == 0, "generate --adapter: exit %d: %s", rc, e);
  free(e);
  snprintf(cmd, sizeof cmd, "'%s' fuse '%s/models/default' '%s' '%s/fused'", HEARTH_BINARY, HEARTH_SOURCE_DIR, out, tmp);
  rc = run(cmd);
  e = last_stderr();
  CHECK_MSG(rc == 0 && strstr(e, "24 matrices"), "fuse: exit %d: %s", rc, e); /* 3 targets of 8 layers */
  free(e);
}

static bool same_file(const char *a, const char *b) {
  char *x = NULL, *y = NULL;
  size_t nx = 0, ny = 0;
  bool same = hfile_read(a, &x, &nx, NULL) == 0 && hfile_read(b, &y, &ny, NULL) == 0 && nx == ny && !memcmp(x, y, nx);
  free(x), free(y);
  return same;
}

static int count_steps(const char *log_path) {
  char *log = NULL;
  size_t n = 0;
  int k = 0;
  if (hfile_read(log_path, &log, &n, NULL)) return -1;
  for (char *p = log; (p = strstr(p, "\"loss\":")); p++) k++;
  free(log);
  return k;
}

/* 6 steps straight against 3 + a resume + 3, for one method's options. */
static void resume_case(const char *method, const char *data, const char *opts) {
  char a[400], b[400], cmd[4096], p1[500], p2[500];
  snprintf(a, sizeof a, "%s/%s-straight", tmp, method);
  snprintf(b, sizeof b, "%s/%s-resumed", tmp, method);
  snprintf(cmd, sizeof cmd, "'%s' train %s --data '%s' --out '%s' --steps 6 --save-every 3 %s", HEARTH_BINARY, method, data, a, opts);
  int rc = run(cmd);
  char *e = last_stderr();
  CHECK_MSG(rc == 0, "%s: exit %d: %s", method, rc, e);
  free(e);
  const char *files[] = {"adapter_model.safetensors", "adapter_config.json", "optimizer.safetensors", "trainer_state.json"};
  for (int i = 0; i < 4; i++) {
    snprintf(p1, sizeof p1, "%s/checkpoint-3/%s", a, files[i]);
    CHECK_MSG(hfile_exists(p1), "%s missing", p1);
  }
  snprintf(p1, sizeof p1, "%s/checkpoint-6/adapter_model.safetensors", a);
  snprintf(p2, sizeof p2, "%s/adapter_model.safetensors", a);
  CHECK_MSG(same_file(p1, p2), "%s: the step-6 checkpoint is not the final adapter", method);
  /* another process from the step-3 checkpoint */
  snprintf(cmd, sizeof cmd, "'%s' train %s --data '%s' --out '%s' --steps 6 --resume '%s/checkpoint-3' %s", HEARTH_BINARY, method,
           data, b, a, opts);
  rc = run(cmd);
  e = last_stderr();
  CHECK_MSG(rc == 0 && strstr(e, "resumed from") && strstr(e, "step 4/6") && !strstr(e, "step 3/6"), "%s resume: exit %d: %s", method,
            rc, e);
  free(e);
  snprintf(p1, sizeof p1, "%s/adapter_model.safetensors", b);
  CHECK_MSG(same_file(p1, p2), "%s: 3 steps + resume + 3 steps differ from 6 steps straight", method);
  snprintf(p1, sizeof p1, "%s/log.jsonl", b);
  CHECK_EQ_INT(count_steps(p1), 3);
  /* a bare --resume in OUT takes the latest checkpoint (checkpoint-6 gone: checkpoint-3), trimming the log to it */
  snprintf(cmd, sizeof cmd, "rm -rf '%s/checkpoint-6' && cp '%s/adapter_model.safetensors' '%s/first.safetensors'", a, a, tmp);
  CHECK_EQ_INT(system(cmd), 0);
  snprintf(cmd, sizeof cmd, "'%s' train %s --data '%s' --out '%s' --steps 6 %s --resume", HEARTH_BINARY, method, data, a, opts);
  rc = run(cmd);
  e = last_stderr();
  CHECK_MSG(rc == 0 && strstr(e, "checkpoint-3"), "%s bare resume: exit %d: %s", method, rc, e);
  free(e);
  snprintf(p1, sizeof p1, "%s/first.safetensors", tmp);
  CHECK_MSG(same_file(p1, p2), "%s: the bare resume wrote other bytes", method);
  snprintf(p1, sizeof p1, "%s/log.jsonl", a);
  CHECK_EQ_INT(count_steps(p1), 6);
  /* other settings are refused by name */
  snprintf(cmd, sizeof cmd, "'%s' train %s --data '%s' --out '%s' --steps 7 --resume '%s/checkpoint-3' %s", HEARTH_BINARY, method,
           data, b, a, opts);
  rc = run(cmd);
  e = last_stderr();
  CHECK_MSG(rc == 1 && strstr(e, "steps 6") && strstr(e, "same settings"), "%s: exit %d: %s", method, rc, e);
  free(e);
}

static void test_resume(void) {
  char data[400], pairs[400];
  snprintf(data, sizeof data, "%s/pc.jsonl", tmp); /* test_run's three lines */
  snprintf(pairs, sizeof pairs, "%s/pairs.jsonl", tmp);
  write_file(pairs, "{\"prompt\": \"And God said,\", \"chosen\": \" Let there be light.\", \"rejected\": \" No.\"}\n"
                    "{\"prompt\": [{\"role\": \"user\", \"content\": \"In the beginning\"}], \"chosen\": \"God created\", "
                    "\"rejected\": \"nothing\"}\n"
                    "{\"prompt\": \"The LORD is\", \"chosen\": \" my shepherd.\", \"rejected\": \" far.\"}\n");
  resume_case("sft", data, "--batch 2 --rank 4 --dropout 0.1 --target all-linear --lr 1e-2 --seed 9 --threads 2 --no-plot");
  resume_case("dpo", pairs, "--batch 2 --rank 4 --lr 1e-2 --seed 9 --threads 2 --no-plot --beta 0.2");
}

/* `hearth serve` on the built-in model with --adapter-dir dir; its URL into url. */
static pid_t start_server(const char *dir, char *url, size_t n) {
  char logp[400];
  snprintf(logp, sizeof logp, "%s/serve.log", tmp);
  pid_t pid = fork();
  if (pid == 0) {
    FILE *f = freopen(logp, "w", stderr);
    (void)f;
    dup2(2, 1);
    execl(HEARTH_BINARY, "hearth", "serve", "--port", "0", "--adapter-dir", dir, "--threads", "1", (char *)NULL);
    _exit(127);
  }
  for (int i = 0; pid > 0 && i < 1200; i++) {
    char *log = NULL;
    size_t len = 0;
    if (hfile_read(logp, &log, &len, NULL) == 0) {
      const char *at = strstr(log, "listening on ");
      if (at) {
        at += 13;
        size_t k = strcspn(at, " \r\n");
        snprintf(url, n, "%.*s", (int)k, at);
        free(log);
        return pid;
      }
      free(log);
    }
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) return -1;
    usleep(50000);
  }
  if (pid > 0) kill(pid, SIGKILL), waitpid(pid, NULL, 0);
  return -1;
}

static size_t gather(char *p, size_t size, size_t n, void *ctx) {
  hbuf_append(ctx, p, size * n);
  return size * n;
}

static void test_serve(void) {
  char adir[400], url[200] = "", data[400], cmd[4096];
  snprintf(adir, sizeof adir, "%s/adapters", tmp);
  mkdir(adir, 0755);
  snprintf(data, sizeof data, "%s/pc.jsonl", tmp);
  pid_t pid = start_server(adir, url, sizeof url);
  CHECK_MSG(pid > 0, "hearth serve did not start");
  if (pid <= 0) return;
  snprintf(cmd, sizeof cmd,
           "'%s' train sft --data '%s' --out '%s/mine' --steps 2 --batch 2 --rank 2 --threads 2 --no-plot --serve '%s' --serve-name mine",
           HEARTH_BINARY, data, adir, url);
  int rc = run(cmd);
  char *e = last_stderr();
  CHECK_MSG(rc == 0 && strstr(e, "loaded the adapter as 'mine'"), "--serve: exit %d: %s", rc, e);
  free(e);
  /* the server lists it */
  hbuf reply = {0};
  char lu[300];
  snprintf(lu, sizeof lu, "%s/v1/adapters", url);
  CURL *c = curl_easy_init();
  curl_easy_setopt(c, CURLOPT_URL, lu);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, gather);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &reply);
  CHECK(curl_easy_perform(c) == CURLE_OK);
  curl_easy_cleanup(c);
  CHECK_MSG(strstr(hbuf_str(&reply), "\"mine\""), "GET /v1/adapters: %s", hbuf_str(&reply));
  hbuf_free(&reply);
  /* an OUT outside the server's adapter directory: trained, then refused by the server, the rule said */
  snprintf(cmd, sizeof cmd, "'%s' train sft --data '%s' --out '%s/outside' --steps 1 --batch 2 --rank 2 --threads 2 --no-plot --serve '%s'",
           HEARTH_BINARY, data, tmp, url);
  rc = run(cmd);
  e = last_stderr();
  CHECK_MSG(rc == 1 && strstr(e, "answered 400") && strstr(e, "--adapter-dir"), "outside: exit %d: %s", rc, e);
  free(e);
  kill(pid, SIGTERM);
  waitpid(pid, NULL, 0);
}

/* Every position's logits of ids through the model (exact f32 activations) with a KV cache of its own. */
static int model_logits(const char *dir, const int32_t *ids, int n, float *out) {
  herr err = {0};
  model *m = NULL;
  model_load_opts lo = {.threads = 2, .f32_activations = true};
  if (model_load(dir, &lo, &m, &err)) {
    fprintf(stderr, "%s: %s\n", dir, err.msg);
    return -1;
  }
  model_kv_geometry geo;
  model_kv_geometry_of(m, &geo);
  kv_cache *c = NULL;
  kv_seq *s = NULL;
  int rc = kv_cache_new(&geo, 0, &c, &err) || kv_cache_seq_new(c, &s, &err);
  model_seq sq = {.kv = s, .tokens = ids, .n_tokens = n, .all_logits = true};
  model_batch b = {&sq, 1};
  if (!rc) rc = model_forward(m, &b, out, &err);
  kv_cache_seq_free(s);
  kv_cache_free(c);
  model_free(m);
  return rc;
}

static void test_quantized_bases(void) {
  const char *quants[][2] = {{"q8_0", ".gguf"}, {"q4_0", ".gguf"}, {"mlx4", ""}, {"fp8", ""}};
  for (int qi = 0; qi < 4; qi++) {
    char dst[400], cmd[2048];
    snprintf(dst, sizeof dst, "%s/llama-%s%s", tmp, quants[qi][0], quants[qi][1]);
    snprintf(cmd, sizeof cmd, "'%s' convert '%s/llama-f32' '%s' --quant %s", HEARTH_BINARY, GOLDEN, dst, quants[qi][0]);
    int rc = run(cmd);
    char *e = last_stderr();
    CHECK_MSG(rc == 0, "convert %s: %s", quants[qi][0], e);
    free(e);
    if (rc) continue;
    train_opts o;
    train_opts_init(&o);
    o.model_dir = dst, o.targets = (1u << TT_N) - 1, o.rank = 4, o.threads = 2;
    trainer *t = NULL;
    herr err = {0};
    CHECK_MSG(trainer_new(&o, &t, &err) == 0, "%s: %s", quants[qi][0], err.msg);
    if (!t) continue;
    int32_t ids[10] = {1, 40, 7, 300, 52, 100, 77, 9, 5, 10};
    float *a = malloc(sizeof(float) * 10 * 512), *b = malloc(sizeof(float) * 10 * 512);
    CHECK(trainer_logits(t, ids, 10, a, &err) == 0);
    if (model_logits(dst, ids, 10, b) == 0) {
      double d = 0;
      for (int i = 0; i < 10 * 512; i++) d = fmax(d, fabs((double)a[i] - b[i]));
      CHECK_MSG(d < 1e-3, "%s: the trainer's forward differs from the model's by %.3g", quants[qi][0], d);
    }
    train_example ex = {.ids = ids, .loss = (uint8_t[10]){0, 1, 1, 1, 1, 1, 1, 1, 1, 1}, .n = 10};
    double first = 0, last = 0, gn;
    for (int step = 0; step <= 5; step++) {
      double loss = 0;
      int64_t count = 0;
      CHECK(trainer_loss(t, &ex, step < 5, 1.0f / 9, &loss, &count, &err) == 0);
      if (step == 0) first = loss / 9;
      last = loss / 9;
      if (step < 5) trainer_step(t, 1e-2, &gn);
    }
    CHECK_MSG(last < first - 0.1, "%s: loss %.4f -> %.4f after 5 steps", quants[qi][0], first, last);
    free(a), free(b);
    trainer_free(t);
  }
}

int main(void) {
  snprintf(tmp, sizeof tmp, "/tmp/hearth_test_train_%d", (int)getpid());
  mkdir(tmp, 0755);
  RUN(test_usage);
  RUN(test_run);
  RUN(test_resume);
  RUN(test_serve);
  RUN(test_quantized_bases);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmp);
  TEST_MAIN_END();
}
