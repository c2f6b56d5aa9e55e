/* mask_bench — what structured output costs per token with a real vocabulary:
 * loads a tokenizer (a model folder or tokenizer.json), compiles a JSON
 * Schema, tokenizes a document valid under it, and walks the matcher over
 * its tokens, timing the mask at every step — the first visit of each state
 * (a trie walk) and the steps that find it cached — and the masking of a
 * logits row of the vocabulary's size.
 *
 * usage: mask_bench TOKENIZER SCHEMA_JSON DOCUMENT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/buf.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"
#include "tokenizer/tokenizer.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: mask_bench TOKENIZER SCHEMA_JSON DOCUMENT\n");
    return 2;
  }
  herr e = {0};
  tokenizer *t = NULL;
  if (tokenizer_load(argv[1], &t, &e)) return fprintf(stderr, "%s\n", e.msg), 1;
  int32_t n = tokenizer_vocab_size(t);
  double t0 = now();
  hbuf all = {0};
  size_t *off = malloc(sizeof *off * (size_t)(n + 1)), *lens = malloc(sizeof *lens * (size_t)n);
  const char **ptrs = malloc(sizeof *ptrs * (size_t)n);
  for (int32_t i = 0; i < n; i++) {
    off[i] = all.len;
    if (!tokenizer_is_special(t, i) && tokenizer_id_to_token(t, i)) tokenizer_token_bytes(t, i, &all, NULL);
    lens[i] = all.len - off[i];
  }
  for (int32_t i = 0; i < n; i++) ptrs[i] = all.data + off[i];
  grammar_vocab *v = NULL;
  if (grammar_vocab_from_bytes(ptrs, lens, n, &v, &e)) return fprintf(stderr, "%s\n", e.msg), 1;
  double t_vocab = now() - t0;
  hbuf g = {0};
  if (json_schema_to_gbnf(argv[2], strlen(argv[2]), &g, &e)) return fprintf(stderr, "%s\n", e.msg), 1;
  grammar *gr = NULL;
  if (grammar_compile(hbuf_str(&g), g.len, &gr, &e)) return fprintf(stderr, "%s\n", e.msg), 1;
  int32_t *ids = NULL;
  size_t n_ids = 0;
  if (tokenizer_encode(t, argv[3], strlen(argv[3]), false, false, &ids, &n_ids, &e)) return fprintf(stderr, "%s\n", e.msg), 1;
  int32_t end = tokenizer_eos_id(t) >= 0 ? tokenizer_eos_id(t) : 0;
  grammar_matcher *m = NULL;
  if (grammar_matcher_new(gr, v, &end, 1, &m, &e)) return fprintf(stderr, "%s\n", e.msg), 1;
  float *row = malloc(sizeof *row * (size_t)n);
  double worst = 0, total = 0, apply = 0;
  for (size_t k = 0; k < n_ids; k++) {
    const uint64_t *mask;
    int32_t allowed;
    double a = now();
    if (grammar_matcher_mask(m, &mask, &allowed, &e)) return fprintf(stderr, "%s\n", e.msg), 1;
    double b = now();
    for (int32_t i = 0; i < n; i++) row[i] = (mask[i >> 6] >> (i & 63) & 1) ? row[i] : -1e30f;
    apply += now() - b;
    total += b - a;
    if (b - a > worst) worst = b - a;
    if (grammar_matcher_accept(m, ids[k], &e)) return fprintf(stderr, "token %zu: %s\n", k, e.msg), 1;
  }
  printf("vocab %d tokens: trie %.1f ms; %zu document tokens: mask %.3f ms/token (worst %.2f ms), "
         "masking a row %.3f ms/token\n",
         n, t_vocab * 1e3, n_ids, total * 1e3 / (double)n_ids, worst * 1e3, apply * 1e3 / (double)n_ids);
  return 0;
}
