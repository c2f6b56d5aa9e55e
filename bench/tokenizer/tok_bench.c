/* tok_bench.c — encode throughput of hearth's tokenizer: loads a tokenizer
 * (folder, tokenizer.json or .gguf), encodes every line of a text file
 * (add_special off) for a few rounds on one thread, and prints one JSON line:
 * load seconds, MB/s over the best round, and the token count (to compare
 * with the peer's). Built by bench/tokenizer/build.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "tokenizer/tokenizer.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: tok_bench TOKENIZER TEXTFILE [ROUNDS]\n");
    return 2;
  }
  int rounds = argc > 3 ? atoi(argv[3]) : 3;
  herr e = {0};
  char *text;
  size_t len;
  if (hfile_read(argv[2], &text, &len, &e)) {
    fprintf(stderr, "%s\n", e.msg);
    return 1;
  }
  double t0 = now();
  tokenizer *t;
  if (tokenizer_load(argv[1], &t, &e)) {
    fprintf(stderr, "%s\n", e.msg);
    return 1;
  }
  double load = now() - t0, best = 1e30;
  size_t tokens = 0;
  for (int r = 0; r < rounds; r++) {
    tokens = 0;
    double s = now();
    for (char *p = text, *end = text + len; p < end;) {
      char *nl = memchr(p, '\n', (size_t)(end - p));
      size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
      int32_t *ids;
      size_t m;
      if (tokenizer_encode(t, p, n, false, true, &ids, &m, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
      }
      tokens += m;
      free(ids);
      p += n + 1;
    }
    double d = now() - s;
    if (d < best) best = d;
  }
  printf("{\"impl\":\"hearth\",\"tokenizer\":\"%s\",\"load_s\":%.3f,\"bytes\":%zu,\"tokens\":%zu,\"mb_per_s\":%.2f}\n", argv[1],
         load, len, tokens, len / best / 1e6);
  tokenizer_free(t);
  free(text);
  return 0;
}
