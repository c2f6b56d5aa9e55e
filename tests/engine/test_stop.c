/* test_stop.c — stop strings over streamed pieces: hold-back of partial stops
 * and incomplete UTF-8, stops split over many pieces, overlapping prefixes,
 * several stops, and that every split of a text gives the same output. */
#include "engine/stop.h"
#include "test.h"

typedef struct run_out {
  char text[512];
  int which;
} run_out;

/* Feeds pieces in order; returns the emitted text and which stop matched (-1 none). */
static run_out feed(const char *const *stops, size_t nstops, const char *const *pieces, size_t npieces) {
  run_out r = {{0}, -1};
  stop_matcher *m = NULL;
  herr err = {0};
  int rc = stop_matcher_new(stops, nstops, &m, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (rc) return r;
  hbuf out = {0};
  for (size_t i = 0; i < npieces && r.which < 0; i++) {
    r.which = stop_matcher_put(m, pieces[i], strlen(pieces[i]), &out);
    CHECK(r.which != -2);
  }
  if (r.which < 0) stop_matcher_flush(m, &out);
  snprintf(r.text, sizeof r.text, "%s", hbuf_str(&out));
  hbuf_free(&out);
  stop_matcher_free(m);
  return r;
}

static void test_no_stops(void) {
  const char *pieces[] = {"Hello", ", ", "world"};
  run_out r = feed(NULL, 0, pieces, 3);
  CHECK_EQ_STR(r.text, "Hello, world");
  CHECK_EQ_INT(r.which, -1);
}

static void test_simple(void) {
  const char *stops[] = {"END"};
  const char *pieces[] = {"abc ", "E", "N", "D", " more"};
  run_out r = feed(stops, 1, pieces, 5);
  CHECK_EQ_STR(r.text, "abc ");
  CHECK_EQ_INT(r.which, 0);
}

/* Emission step by step: a held prefix is released when it stops matching. */
static void test_hold_back(void) {
  const char *stops[] = {"</s>"};
  stop_matcher *m = NULL;
  herr err = {0};
  CHECK_EQ_INT(stop_matcher_new(stops, 1, &m, &err), 0);
  hbuf out = {0};
  CHECK_EQ_INT(stop_matcher_put(m, "x <", 3, &out), -1);
  CHECK_EQ_STR(hbuf_str(&out), "x ");
  CHECK_EQ_INT(stop_matcher_held(m), 1);
  CHECK_EQ_INT(stop_matcher_put(m, "/", 1, &out), -1);
  CHECK_EQ_STR(hbuf_str(&out), "x ");
  CHECK_EQ_INT(stop_matcher_put(m, "b>", 2, &out), -1);
  CHECK_EQ_STR(hbuf_str(&out), "x </b>");
  CHECK_EQ_INT(stop_matcher_held(m), 0);
  CHECK_EQ_INT(stop_matcher_put(m, "</", 2, &out), -1);
  CHECK_EQ_INT(stop_matcher_put(m, "s", 1, &out), -1);
  CHECK_EQ_STR(hbuf_str(&out), "x </b>");
  CHECK_EQ_INT(stop_matcher_put(m, ">tail", 5, &out), 0);
  CHECK_EQ_STR(hbuf_str(&out), "x </b>");
  /* after a match, input is ignored */
  CHECK_EQ_INT(stop_matcher_put(m, "more", 4, &out), -1);
  stop_matcher_flush(m, &out);
  CHECK_EQ_STR(hbuf_str(&out), "x </b>");
  hbuf_free(&out);
  stop_matcher_free(m);
}

/* A held tail that never completes is emitted at the end. */
static void test_flush(void) {
  const char *stops[] = {"STOP"};
  const char *pieces[] = {"go ST", "O"};
  run_out r = feed(stops, 1, pieces, 2);
  CHECK_EQ_STR(r.text, "go STO");
  CHECK_EQ_INT(r.which, -1);
}

static void test_split_many_pieces(void) {
  const char *stops[] = {"<|im_end|>"};
  const char *pieces[] = {"The answer is 4.", "<", "|", "im", "_", "end", "|", ">", "\nignored"};
  run_out r = feed(stops, 1, pieces, 9);
  CHECK_EQ_STR(r.text, "The answer is 4.");
  CHECK_EQ_INT(r.which, 0);
}

static void test_overlapping_prefix(void) {
  const char *stops[] = {"abc"};
  const char *p1[] = {"ababc"};
  run_out r = feed(stops, 1, p1, 1);
  CHECK_EQ_STR(r.text, "ab");
  CHECK_EQ_INT(r.which, 0);
  const char *p2[] = {"a", "b", "a", "b", "c"};
  r = feed(stops, 1, p2, 5);
  CHECK_EQ_STR(r.text, "ab");
  CHECK_EQ_INT(r.which, 0);
  const char *p3[] = {"aab", "ab", "abx"};
  r = feed(stops, 1, p3, 3);
  CHECK_EQ_STR(r.text, "aababab" "x");
  CHECK_EQ_INT(r.which, -1);
  /* a stop that overlaps itself */
  const char *stops2[] = {"aaa"};
  const char *p4[] = {"a", "a", "b", "a", "a", "a", "a"};
  r = feed(stops2, 1, p4, 7);
  CHECK_EQ_STR(r.text, "aab");
  CHECK_EQ_INT(r.which, 0);
}

static void test_multiple_stops(void) {
  const char *stops[] = {"World", "lo", "\n\n"};
  const char *p1[] = {"Hel", "lo World"};
  run_out r = feed(stops, 3, p1, 2);
  CHECK_EQ_STR(r.text, "Hel");
  CHECK_EQ_INT(r.which, 1);
  const char *p2[] = {"a\n", "\nb"};
  r = feed(stops, 3, p2, 2);
  CHECK_EQ_STR(r.text, "a");
  CHECK_EQ_INT(r.which, 2);
  /* the stop that completes first wins, as it would in a stream: "ab" before "abcd" */
  const char *stops2[] = {"abcd", "ab"};
  const char *p3[] = {"xabcd"};
  r = feed(stops2, 2, p3, 1);
  CHECK_EQ_STR(r.text, "x");
  CHECK_EQ_INT(r.which, 1);
  /* "bc" completes inside "abcd" before a longer stop could */
  const char *stops4[] = {"abcd", "bc"};
  const char *p4a[] = {"abc", "d"};
  const char *p4b[] = {"abcd"};
  r = feed(stops4, 2, p4a, 2);
  CHECK_EQ_STR(r.text, "a");
  CHECK_EQ_INT(r.which, 1);
  r = feed(stops4, 2, p4b, 1);
  CHECK_EQ_STR(r.text, "a");
  CHECK_EQ_INT(r.which, 1);
  /* ending together: the longer (earlier start) wins, then the listing order */
  const char *stops5[] = {"bc", "abc", "c"};
  const char *p6[] = {"xabc"};
  r = feed(stops5, 3, p6, 1);
  CHECK_EQ_STR(r.text, "x");
  CHECK_EQ_INT(r.which, 1);
  /* the earliest end wins over the listing order */
  const char *stops3[] = {"cd", "bc"};
  const char *p5[] = {"abcd"};
  r = feed(stops3, 2, p5, 1);
  CHECK_EQ_STR(r.text, "a");
  CHECK_EQ_INT(r.which, 1);
}

static void test_utf8(void) {
  /* "é" = C3 A9 arrives split: nothing is emitted until it completes */
  stop_matcher *m = NULL;
  herr err = {0};
  CHECK_EQ_INT(stop_matcher_new(NULL, 0, &m, &err), 0);
  hbuf out = {0};
  CHECK_EQ_INT(stop_matcher_put(m, "caf\xc3", 4, &out), -1);
  CHECK_EQ_STR(hbuf_str(&out), "caf");
  CHECK_EQ_INT(stop_matcher_put(m, "\xa9!", 2, &out), -1);
  CHECK_EQ_STR(hbuf_str(&out), "caf\xc3\xa9!");
  /* a 4-byte emoji in single bytes */
  const char emoji[] = "\xf0\x9f\x98\x80";
  for (int i = 0; i < 3; i++) {
    stop_matcher_put(m, emoji + i, 1, &out);
    CHECK_EQ_STR(hbuf_str(&out), "caf\xc3\xa9!");
  }
  stop_matcher_put(m, emoji + 3, 1, &out);
  CHECK_EQ_STR(hbuf_str(&out), "caf\xc3\xa9!\xf0\x9f\x98\x80");
  hbuf_free(&out);
  stop_matcher_free(m);
  /* a multi-byte stop string, split inside its characters */
  const char *stops[] = {"\xe3\x80\x82\xe3\x80\x82"}; /* "。。" */
  const char *pieces[] = {"\xe6\x97\xa5\xe3", "\x80\x82", "\xe3\x80", "\x82\xe6\x9c\xac"};
  run_out r = feed(stops, 1, pieces, 4);
  CHECK_EQ_STR(r.text, "\xe6\x97\xa5");
  CHECK_EQ_INT(r.which, 0);
  /* a single "。" is released once the next character rules the stop out */
  const char *pieces2[] = {"\xe6\x97\xa5\xe3\x80\x82", "x"};
  r = feed(stops, 1, pieces2, 2);
  CHECK_EQ_STR(r.text, "\xe6\x97\xa5\xe3\x80\x82x");
  CHECK_EQ_INT(r.which, -1);
}

/* Every way of cutting a text into two or three pieces gives the same result
 * as feeding it whole, and no emitted text ever gets retracted. */
static void test_all_splits(void) {
  const char *stops[] = {"<end>", "ende", "\xc3\xa9t\xc3\xa9"};
  const char *text = "une fin <en\xc3\xa9t\xc3\xa9> ende <end> tail";
  size_t n = strlen(text);
  const char *whole[] = {text};
  run_out ref = feed(stops, 3, whole, 1);
  CHECK_EQ_STR(ref.text, "une fin <en");
  CHECK_EQ_INT(ref.which, 2);
  for (size_t a = 0; a <= n; a++) {
    for (size_t b = a; b <= n; b += 3) {
      char p1[128], p2[128], p3[128];
      snprintf(p1, sizeof p1, "%.*s", (int)a, text);
      snprintf(p2, sizeof p2, "%.*s", (int)(b - a), text + a);
      snprintf(p3, sizeof p3, "%s", text + b);
      const char *pieces[] = {p1, p2, p3};
      run_out r = feed(stops, 3, pieces, 3);
      if (strcmp(r.text, ref.text) != 0 || r.which != ref.which) {
        CHECK_MSG(0, "split at %zu,%zu: got \"%s\" (%d)", a, b, r.text, r.which);
        return;
      }
    }
  }
}

static void test_bad_input(void) {
  const char *stops[] = {"ok", ""};
  stop_matcher *m = NULL;
  herr err = {0};
  CHECK_EQ_INT(stop_matcher_new(stops, 2, &m, &err), HEARTH_EINVAL);
  CHECK(m == NULL);
  CHECK(strstr(err.msg, "empty") != NULL);
}

int main(void) {
  RUN(test_no_stops);
  RUN(test_simple);
  RUN(test_hold_back);
  RUN(test_flush);
  RUN(test_split_many_pieces);
  RUN(test_overlapping_prefix);
  RUN(test_multiple_stops);
  RUN(test_utf8);
  RUN(test_all_splits);
  RUN(test_bad_input);
  TEST_MAIN_END();
}
