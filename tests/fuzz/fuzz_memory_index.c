/* fuzz_memory_index — memory/search over arbitrary bytes: an input whose
 * first byte is even is an index file (its checksum made right, so the
 * reader goes past it) beside a wiki of one article; an odd one is that
 * article itself (front matter, paragraphs, links). An update must succeed
 * (a bad index is rebuilt, any article is cut into chunks inside it) and a
 * query must rank what the wiki holds, snippets inside the article. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "memory/search.h"

#define DIM 8

static int embed(void *ctx, const char *const *texts, int n, float *out, herr *err) {
  (void)ctx, (void)err;
  for (int i = 0; i < n; i++) {
    uint64_t h = memsearch_hash(texts[i], strlen(texts[i]));
    float *v = out + (size_t)i * DIM;
    for (int d = 0; d < DIM; d++) v[d] = (float)((h >> (d * 8)) & 0xff) + 1;
    double s = 0;
    for (int d = 0; d < DIM; d++) s += (double)v[d] * v[d];
    for (int d = 0; d < DIM; d++) v[d] = (float)(v[d] / __builtin_sqrt(s));
  }
  return 0;
}

static char dir[64], idx_dir[128], idx[192], article[128];

static void put(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  if (n && fwrite(data, 1, n, f) != n) abort();
  fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!dir[0]) {
    snprintf(dir, sizeof dir, "/tmp/fuzz_memory_XXXXXX");
    if (!mkdtemp(dir)) abort();
    snprintf(idx_dir, sizeof idx_dir, "%s/" MEMSEARCH_INDEX_DIR, dir);
    snprintf(idx, sizeof idx, "%s/" MEMSEARCH_INDEX_NAME, idx_dir);
    snprintf(article, sizeof article, "%s/note.md", dir);
    mkdir(idx_dir, 0755);
  }
  if (size == 0) return 0;
  bool as_index = (data[0] & 1) == 0;
  if (as_index) {
    put(article, "---\ntitle: Note\n---\nA short note.\n", 34);
    unsigned char *copy = malloc(size - 1 + 8);
    if (!copy) return 0;
    memcpy(copy, data + 1, size - 1);
    uint64_t sum = memsearch_hash(copy, size - 1);
    memcpy(copy + size - 1, &sum, 8);
    put(idx, copy, size - 1 + 8);
    free(copy);
  } else {
    unlink(idx);
    put(article, data + 1, size - 1);
  }
  memsearch_embedder e = {.embed = embed, .dim = DIM, .identity = "fuzz"};
  memsearch *s = NULL;
  herr err = {0};
  if (memsearch_open(dir, &e, &s, &err)) abort();
  memsearch_stats st;
  if (memsearch_update(s, &st, &err)) abort();
  if (st.articles != 1) abort();
  memsearch_hit *h = NULL;
  int n = 0;
  if (memsearch_query(s, "a note", 3, &h, &n, &err) || n != 1) abort();
  if (!as_index && strlen(h[0].snippet) > size) abort();
  memsearch_hits_free(h, n);
  /* read back what was written: nothing to embed again */
  memsearch_close(s);
  s = NULL;
  if (memsearch_open(dir, &e, &s, &err) || memsearch_update(s, &st, &err)) abort();
  if (st.embedded != 0 || st.rebuilt) abort();
  memsearch_close(s);
  return 0;
}
