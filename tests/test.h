/* test.h — the unit-test harness: CHECK macros that count failures and print
 * where; a test file defines static test functions and lists them in main via
 * RUN(fn). The process exits 1 when any check failed. */
#ifndef HEARTH_TEST_H
#define HEARTH_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures = 0;
static int test_checks = 0;

#define CHECK(cond)                                                          \
  do {                                                                       \
    test_checks++;                                                           \
    if (!(cond)) {                                                           \
      test_failures++;                                                       \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                        \
  } while (0)

#define CHECK_MSG(cond, ...)                                                 \
  do {                                                                       \
    test_checks++;                                                           \
    if (!(cond)) {                                                           \
      test_failures++;                                                       \
      fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                          \
      fprintf(stderr, "\n");                                                 \
    }                                                                        \
  } while (0)

#define CHECK_EQ_INT(a, b)                                                                   \
  do {                                                                                       \
    long long _a = (long long)(a), _b = (long long)(b);                                      \
    test_checks++;                                                                           \
    if (_a != _b) {                                                                          \
      test_failures++;                                                                       \
      fprintf(stderr, "%s:%d: %s == %s failed: %lld vs %lld\n", __FILE__, __LINE__, #a, #b, _a, _b); \
    }                                                                                        \
  } while (0)

#define CHECK_EQ_STR(a, b)                                                                   \
  do {                                                                                       \
    const char *_a = (a), *_b = (b);                                                         \
    test_checks++;                                                                           \
    if (!_a || !_b || strcmp(_a, _b) != 0) {                                                 \
      test_failures++;                                                                       \
      fprintf(stderr, "%s:%d: %s == %s failed:\n  got:  \"%s\"\n  want: \"%s\"\n", __FILE__, __LINE__, #a, #b, \
              _a ? _a : "(null)", _b ? _b : "(null)");                                       \
    }                                                                                        \
  } while (0)

/* |a-b| <= tol, and NaN never passes. */
#define CHECK_NEAR(a, b, tol)                                                                \
  do {                                                                                       \
    double _a = (double)(a), _b = (double)(b);                                               \
    test_checks++;                                                                           \
    if (!(fabs(_a - _b) <= (tol))) {                                                         \
      test_failures++;                                                                       \
      fprintf(stderr, "%s:%d: %s ~= %s failed: %.9g vs %.9g (tol %g)\n", __FILE__, __LINE__, #a, #b, _a, _b, (double)(tol)); \
    }                                                                                        \
  } while (0)

#define RUN(fn)                                    \
  do {                                             \
    int _before = test_failures;                   \
    fn();                                          \
    fprintf(stderr, "%s %s\n", test_failures == _before ? "ok  " : "FAIL", #fn); \
  } while (0)

/* The device model tests run on: HEARTH_TEST_DEVICE ("cuda", "cuda:1"), NULL = the CPU.
 * tools/gpu_check.sh sets it to run the golden and scheduler tests on a GPU. */
static inline const char *test_device(void) {
  const char *d = getenv("HEARTH_TEST_DEVICE");
  return d && *d ? d : NULL;
}

/* Files tools/fetch_test_deps.sh fetches into .deps/ (the real tokenizers,
 * the npm clients): when one is missing the test fails at once and says what
 * to run, instead of failing check by check. rel is relative to .deps/. */
#ifdef HEARTH_DEPS_DIR
#include <unistd.h>
static inline void test_need_deps(const char *rel) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", HEARTH_DEPS_DIR, rel);
  if (access(path, R_OK) == 0) return;
  fprintf(stderr,
          "FAIL: missing test dependency %s\n"
          "      run tools/fetch_test_deps.sh (make test runs it) to fetch the real tokenizers and npm clients\n",
          path);
  exit(1);
}
/* The six real tokenizers every tokenizer test reads. */
static inline void test_need_tokenizers(void) {
  static const char *names[] = {"qwen3", "gemma3", "llama3_1", "deepseek_v3", "gptoss", "llama2"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char rel[128];
    snprintf(rel, sizeof rel, "tokenizers/%s/tokenizer.json", names[i]);
    test_need_deps(rel);
  }
}
#endif

#define TEST_MAIN_END()                                                            \
  do {                                                                             \
    fprintf(stderr, "%d checks, %d failed\n", test_checks, test_failures);         \
    return test_failures ? 1 : 0;                                                  \
  } while (0)

#endif
