/* Unit tests for base/trace: the Chrome trace-event JSON sink — valid JSON
 * (read back with jansson), well-formed events, strings escaped, the file
 * loadable before it is closed, the byte cap, concurrent writers. */
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/trace.h"
#include "test.h"

static void temp_path(char *path, size_t cap, const char *name) {
  snprintf(path, cap, "/tmp/hearth_trace_%ld_%s.json", (long)getpid(), name);
}

static json_t *load(const char *path) {
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  if (!j) fprintf(stderr, "%s: %s (line %d)\n", path, je.text, je.line);
  return j;
}

/* The file as it is now, with "]" appended: what a viewer reads of a trace
 * whose process died. */
static json_t *load_unfinished(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 2, f);
  fclose(f);
  if (n > 0 && buf[n - 1] == ']') return NULL; /* it must not be closed yet */
  buf[n++] = ']';
  json_error_t je;
  json_t *j = json_loadb(buf, n, 0, &je);
  if (!j) fprintf(stderr, "%s unfinished: %s\n", path, je.text);
  return j;
}

static const char *str_of(const json_t *ev, const char *key) { return json_string_value(json_object_get(ev, key)); }
static double num_of(const json_t *ev, const char *key) { return json_number_value(json_object_get(ev, key)); }

/* Every event has ph, name, pid and tid; X has numeric ts and dur >= 0; i has ts and scope. */
static void check_well_formed(const json_t *arr) {
  CHECK(json_is_array(arr));
  size_t i;
  json_t *ev;
  json_array_foreach(arr, i, ev) {
    CHECK(json_is_object(ev));
    const char *ph = str_of(ev, "ph");
    CHECK_MSG(ph && (!strcmp(ph, "X") || !strcmp(ph, "i") || !strcmp(ph, "M")), "event %zu ph %s", i, ph ? ph : "-");
    CHECK(str_of(ev, "name") != NULL);
    CHECK(json_is_integer(json_object_get(ev, "pid")));
    CHECK(json_is_integer(json_object_get(ev, "tid")));
    if (ph && !strcmp(ph, "X")) {
      CHECK(json_is_number(json_object_get(ev, "ts")));
      CHECK(json_is_number(json_object_get(ev, "dur")) && num_of(ev, "dur") >= 0);
    }
    if (ph && !strcmp(ph, "i")) {
      CHECK(json_is_number(json_object_get(ev, "ts")));
      CHECK(str_of(ev, "s") != NULL);
    }
    if (ph && !strcmp(ph, "M")) CHECK(json_is_object(json_object_get(ev, "args")));
  }
}

static void test_events(void) {
  char path[256];
  temp_path(path, sizeof path, "events");
  herr e = {0};
  htrace *t = NULL;
  CHECK_EQ_INT(htrace_open(path, 0, &t, &e), 0);
  if (!t) return;
  htrace_track(t, 7, "req \"chatcmpl-1\"", 3);
  double a = htrace_now();
  const char weird[] = "q\"b\\s\n\t\x01 caf\xc3\xa9 bad\xff end";
  htrace_complete(t, 7, "prefill", "request", a + 0.001, 0.002,
                  (htrace_arg[]){HTRACE_INT("tokens", 128), HTRACE_INT("neg", -5), HTRACE_STR("label", weird)}, 3);
  htrace_complete(t, 7, "request", "request", a, 0.010, (htrace_arg[]){HTRACE_STR("finish", "stop")}, 1);
  htrace_instant(t, 7, "preempted", "request", a + 0.005, NULL, 0);
  htrace_complete(t, 1, "step", "engine", a, 0, NULL, 0);

  /* before close: the file lacks only its closing bracket */
  json_t *early = load_unfinished(path);
  CHECK(early != NULL);
  if (early) CHECK_EQ_INT(json_array_size(early), 7);
  json_decref(early);
  CHECK(htrace_bytes(t) > 0);
  CHECK_EQ_INT(htrace_dropped(t), 0);
  htrace_close(t);

  json_t *arr = load(path);
  CHECK(arr != NULL);
  if (!arr) return;
  check_well_formed(arr);
  CHECK_EQ_INT(json_array_size(arr), 7);
  json_t *proc = json_array_get(arr, 0);
  CHECK_EQ_STR(str_of(proc, "name"), "process_name");
  CHECK_EQ_STR(str_of(json_object_get(proc, "args"), "name"), "hearth");
  CHECK_EQ_INT(json_integer_value(json_object_get(proc, "pid")), getpid());
  json_t *name = json_array_get(arr, 1), *sort = json_array_get(arr, 2);
  CHECK_EQ_STR(str_of(name, "name"), "thread_name");
  CHECK_EQ_STR(str_of(json_object_get(name, "args"), "name"), "req \"chatcmpl-1\"");
  CHECK_EQ_INT(json_integer_value(json_object_get(name, "tid")), 7);
  CHECK_EQ_STR(str_of(sort, "name"), "thread_sort_index");
  CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(sort, "args"), "sort_index")), 3);

  json_t *pre = json_array_get(arr, 3), *req = json_array_get(arr, 4);
  CHECK_EQ_STR(str_of(pre, "ph"), "X");
  CHECK_EQ_STR(str_of(pre, "name"), "prefill");
  CHECK_EQ_STR(str_of(pre, "cat"), "request");
  json_t *args = json_object_get(pre, "args");
  CHECK_EQ_INT(json_integer_value(json_object_get(args, "tokens")), 128);
  CHECK_EQ_INT(json_integer_value(json_object_get(args, "neg")), -5);
  /* escaped and read back: the invalid byte became U+FFFD, the rest is as given */
  CHECK_EQ_STR(str_of(args, "label"), "q\"b\\s\n\t\x01 caf\xc3\xa9 bad\xef\xbf\xbd end");
  /* seconds → microseconds since open: the child's span lies in its parent's */
  CHECK_NEAR(num_of(pre, "dur"), 2000.0, 0.01);
  CHECK_NEAR(num_of(req, "dur"), 10000.0, 0.01);
  CHECK_NEAR(num_of(pre, "ts") - num_of(req, "ts"), 1000.0, 0.01);
  CHECK(num_of(pre, "ts") >= num_of(req, "ts"));
  CHECK(num_of(pre, "ts") + num_of(pre, "dur") <= num_of(req, "ts") + num_of(req, "dur"));
  CHECK(num_of(req, "ts") >= 0);
  json_t *inst = json_array_get(arr, 5);
  CHECK_EQ_STR(str_of(inst, "ph"), "i");
  CHECK_EQ_STR(str_of(inst, "s"), "t");
  CHECK(json_object_get(inst, "dur") == NULL);
  CHECK(json_object_get(inst, "args") == NULL);
  CHECK_EQ_INT(num_of(json_array_get(arr, 6), "dur"), 0);
  json_decref(arr);
  unlink(path);
}

static void test_cap(void) {
  char path[256];
  temp_path(path, sizeof path, "cap");
  herr e = {0};
  htrace *t = NULL;
  const int64_t cap = 2000;
  CHECK_EQ_INT(htrace_open(path, cap, &t, &e), 0);
  if (!t) return;
  double a = htrace_now();
  const int n = 200;
  for (int i = 0; i < n; i++)
    htrace_complete(t, 2, "decode", "request", a + i * 1e-3, 1e-4, (htrace_arg[]){HTRACE_INT("i", i)}, 1);
  int64_t bytes = htrace_bytes(t), dropped = htrace_dropped(t);
  CHECK(bytes <= cap);
  CHECK(bytes > cap / 2); /* it filled up to near the cap, not stopped early */
  CHECK(dropped > 0);
  htrace_close(t);
  struct stat st;
  CHECK_EQ_INT(stat(path, &st), 0);
  CHECK_MSG(st.st_size <= cap + 5, "%lld bytes", (long long)st.st_size); /* "[\n" and "\n]\n" */
  json_t *arr = load(path);
  CHECK(arr != NULL);
  if (!arr) return;
  check_well_formed(arr);
  /* every event written is whole; those written plus those dropped are all of them */
  CHECK_EQ_INT((int64_t)json_array_size(arr) + dropped, n + 1);
  /* the first ones were kept, in order */
  for (size_t i = 1; i < json_array_size(arr); i++)
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(json_array_get(arr, i), "args"), "i")),
                 (int64_t)i - 1);
  json_decref(arr);
  unlink(path);
}

typedef struct writer {
  htrace *t;
  int tid;
  int n;
} writer;

static void *write_many(void *arg) {
  writer *w = arg;
  htrace_track(w->t, w->tid, "writer", w->tid);
  for (int i = 0; i < w->n; i++) {
    double a = htrace_now();
    htrace_complete(w->t, w->tid, "work", "test", a, htrace_now() - a,
                    (htrace_arg[]){HTRACE_INT("seq", i), HTRACE_STR("who", "a \"quoted\" writer")}, 2);
    if (i % 10 == 0) htrace_instant(w->t, w->tid, "tick", "test", htrace_now(), NULL, 0);
  }
  return NULL;
}

static void test_concurrent(void) {
  char path[256];
  temp_path(path, sizeof path, "threads");
  herr e = {0};
  htrace *t = NULL;
  CHECK_EQ_INT(htrace_open(path, 0, &t, &e), 0);
  if (!t) return;
  enum { N_THREADS = 8, N_EVENTS = 500 };
  pthread_t th[N_THREADS];
  writer w[N_THREADS];
  for (int i = 0; i < N_THREADS; i++) {
    w[i] = (writer){.t = t, .tid = 10 + i, .n = N_EVENTS};
    pthread_create(&th[i], NULL, write_many, &w[i]);
  }
  for (int i = 0; i < N_THREADS; i++) pthread_join(th[i], NULL);
  CHECK_EQ_INT(htrace_dropped(t), 0);
  htrace_close(t);
  json_t *arr = load(path);
  CHECK(arr != NULL);
  if (!arr) return;
  check_well_formed(arr);
  /* each writer's events all arrived, whole, in its own order and time order */
  int count[N_THREADS] = {0}, ticks[N_THREADS] = {0}, names[N_THREADS] = {0};
  double last_ts[N_THREADS];
  for (int i = 0; i < N_THREADS; i++) last_ts[i] = -1;
  size_t i;
  json_t *ev;
  json_array_foreach(arr, i, ev) {
    int64_t tid = json_integer_value(json_object_get(ev, "tid"));
    if (tid < 10) continue;
    int k = (int)(tid - 10);
    CHECK(k < N_THREADS);
    if (k >= N_THREADS) continue;
    const char *ph = str_of(ev, "ph");
    if (!strcmp(ph, "M")) {
      names[k]++;
      continue;
    }
    if (!strcmp(ph, "i")) {
      ticks[k]++;
      continue;
    }
    json_t *args = json_object_get(ev, "args");
    CHECK_EQ_INT(json_integer_value(json_object_get(args, "seq")), count[k]);
    CHECK_EQ_STR(str_of(args, "who"), "a \"quoted\" writer");
    CHECK(num_of(ev, "ts") >= last_ts[k]);
    last_ts[k] = num_of(ev, "ts");
    count[k]++;
  }
  for (int k = 0; k < N_THREADS; k++) {
    CHECK_EQ_INT(count[k], N_EVENTS);
    CHECK_EQ_INT(ticks[k], N_EVENTS / 10);
    CHECK_EQ_INT(names[k], 2);
  }
  json_decref(arr);
  unlink(path);
}

static void test_errors(void) {
  herr e = {0};
  htrace *t = (htrace *)1;
  CHECK_EQ_INT(htrace_open("/nonexistent-dir/trace.json", 0, &t, &e), HEARTH_EIO);
  CHECK(t == NULL);
  CHECK(strstr(e.msg, "/nonexistent-dir/trace.json") != NULL);
  CHECK_EQ_INT(htrace_open("", 0, &t, &e), HEARTH_EINVAL);
  /* a NULL sink takes every call and does nothing */
  htrace_track(NULL, 1, "x", 0);
  htrace_complete(NULL, 1, "x", "y", 0, 1, NULL, 0);
  htrace_instant(NULL, 1, "x", "y", 0, NULL, 0);
  CHECK_EQ_INT(htrace_bytes(NULL), 0);
  CHECK_EQ_INT(htrace_dropped(NULL), 0);
  htrace_close(NULL);
}

int main(void) {
  RUN(test_events);
  RUN(test_cap);
  RUN(test_concurrent);
  RUN(test_errors);
  TEST_MAIN_END();
}
