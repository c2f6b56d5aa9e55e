/* test_gguf_suite.c — llama.cpp's tokenizer conformance cases against the
 * vocabularies inside the suite's GGUF files: every NAME.gguf that has
 * NAME.gguf.inp / NAME.gguf.out must reproduce every expected id list
 * (encode with add_special=false, parse_special=false, as llama.cpp's
 * test-tokenizer-0). Prints pass/fail counts per vocabulary. Also checks that
 * decoding the expected ids gives back the input, except where llama.cpp's
 * detokenizer is documented not to (see round_trip_expected). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/utf8.h"
#include "format/gguf.h"
#include "test.h"
#include "tokenizer/gguf_vocab.h"

#define SUITE HEARTH_DEPS_DIR "/llama.cpp/vocab"
#define SEP "\n__ggml_vocab_test__\n"

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* Whether llama.cpp's detokenize(tokenize(x)) == x holds for this input:
 * - WPM (bert) lowercases, strips accents and splits words: not reversible;
 * - BPE vocabularies (gpt2, gemma4) with clean_up_tokenization_spaces drop the space in
 *   " ." " ," " ?" " !" " 's" " 'm" " 're" " 've" and around " ' ";
 * - text that is not valid UTF-8 comes back with U+FFFD. */
static bool round_trip_expected(const char *model, const char *text, size_t len) {
  if (strcmp(model, "bert") == 0) return false;
  if (!utf8_valid(text, len)) return false;
  if (strcmp(model, "gpt2") == 0 || strcmp(model, "gemma4") == 0) {
    static const char *const pairs[] = {" .", " ,", " ?", " !", " 's", " 'm", " 're", " 've", " ' "};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
      if (memmem(text, len, pairs[i], strlen(pairs[i]))) return false;
  }
  return true;
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
  fprintf(stderr, "    %s:", label);
  for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
  fprintf(stderr, "\n");
}

static void run_vocab(const char *name, int *total_pass, int *total_fail) {
  char path[1024], inp_path[1100], out_path[1100];
  snprintf(path, sizeof path, "%s/%s", SUITE, name);
  snprintf(inp_path, sizeof inp_path, "%s.inp", path);
  snprintf(out_path, sizeof out_path, "%s.out", path);
  herr err = {0};
  gguf_file *g = NULL;
  gguf_vocab *v = NULL;
  char *inp = NULL, *outs = NULL;
  size_t inp_len = 0, outs_len = 0;
  int pass = 0, fail = 0, rt_pass = 0, rt_fail = 0;
  CHECK_MSG(gguf_open(&g, path, &err) == 0, "%s", err.msg);
  if (!g) return;
  CHECK_MSG(gguf_vocab_load(g, name, &v, &err) == 0, "%s", err.msg);
  CHECK(hfile_read(inp_path, &inp, &inp_len, &err) == 0);
  CHECK(hfile_read(out_path, &outs, &outs_len, &err) == 0);
  if (!v || !inp || !outs) goto done;
  const char *model = gguf_vocab_model(v);
  size_t ip = 0, op = 0;
  int idx = 0;
  while (ip < inp_len) {
    const char *sep = memmem(inp + ip, inp_len - ip, SEP, strlen(SEP));
    if (!sep) break;
    size_t tlen = (size_t)(sep - (inp + ip));
    const char *text = inp + ip;
    ip += tlen + strlen(SEP);
    /* expected line */
    size_t le = op;
    while (le < outs_len && outs[le] != '\n') le++;
    int32_t want[4096];
    size_t nwant = 0;
    for (size_t k = op; k < le && nwant < 4096;) {
      while (k < le && outs[k] == ' ') k++;
      if (k >= le) break;
      want[nwant++] = (int32_t)strtol(outs + k, NULL, 10);
      while (k < le && outs[k] != ' ') k++;
    }
    op = le + 1;
    int32_t *ids = NULL;
    size_t n = 0;
    herr e2 = {0};
    int rc = gguf_vocab_encode(v, text, tlen, false, false, &ids, &n, &e2);
    bool ok = rc == 0 && n == nwant && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    if (ok) {
      pass++;
    } else {
      fail++;
      fprintf(stderr, "  %s case %d FAILED: '%.*s'\n", name, idx, (int)(tlen > 80 ? 80 : tlen), text);
      if (rc) fprintf(stderr, "    error: %s\n", e2.msg);
      print_ids("want", want, nwant);
      print_ids("got ", ids, n);
    }
    if (round_trip_expected(model, text, tlen)) {
      hbuf dec = {0};
      herr e3 = {0};
      bool same = gguf_vocab_decode(v, want, nwant, false, &dec, &e3) == 0 && dec.len == tlen &&
                  (tlen == 0 || memcmp(dec.data, text, tlen) == 0);
      if (same) {
        rt_pass++;
      } else {
        rt_fail++;
        fprintf(stderr, "  %s case %d DECODE mismatch: '%.*s' -> '%s'\n", name, idx, (int)tlen, text, hbuf_str(&dec));
      }
      hbuf_free(&dec);
    }
    free(ids);
    idx++;
  }
  fprintf(stderr, "%-32s encode %d/%d pass, decode round-trip %d/%d pass\n", name, pass, pass + fail, rt_pass, rt_pass + rt_fail);
  CHECK_MSG(fail == 0, "%s: %d encode cases failed", name, fail);
  CHECK_MSG(rt_fail == 0, "%s: %d decode round-trips failed", name, rt_fail);
  CHECK_MSG(pass > 0, "%s: no cases found", name);
  *total_pass += pass;
  *total_fail += fail;
done:
  free(inp);
  free(outs);
  gguf_vocab_free(v);
  gguf_close(g);
}

static void test_suite(void) {
  DIR *d = opendir(SUITE);
  CHECK_MSG(d != NULL, "cannot open %s", SUITE);
  if (!d) return;
  char *names[128];
  size_t nn = 0;
  struct dirent *e;
  while ((e = readdir(d)) && nn < 128) {
    size_t l = strlen(e->d_name);
    if (l > 5 && strcmp(e->d_name + l - 5, ".gguf") == 0) {
      char inp[1024];
      snprintf(inp, sizeof inp, "%s/%s.inp", SUITE, e->d_name);
      char out[1024];
      snprintf(out, sizeof out, "%s/%s.out", SUITE, e->d_name);
      if (hfile_exists(inp) && hfile_exists(out)) names[nn++] = strdup(e->d_name);
    }
  }
  closedir(d);
  qsort(names, nn, sizeof names[0], cmp_str);
  int pass = 0, fail = 0;
  for (size_t i = 0; i < nn; i++) {
    run_vocab(names[i], &pass, &fail);
    free(names[i]);
  }
  fprintf(stderr, "suite: %zu vocabularies, %d/%d cases pass\n", nn, pass, pass + fail);
  CHECK(nn >= 10);
}

int main(void) {
  RUN(test_suite);
  TEST_MAIN_END();
}
