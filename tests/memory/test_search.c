/* Unit tests of memory/search: the index over a wiki with a stand-in
 * embedder (hashed bags of words, so rankings follow shared words and the
 * texts it was handed can be counted), chunks embedded whole or pooled
 * from their words: incremental updates — an unchanged
 * wiki embeds nothing, a touched article is embedded again alone, a deleted
 * one is dropped, another model or a damaged index rebuilds —, chunking of
 * long articles ranked by their best chunk, front matter, and the
 * memory_search tool's call. The wiki is tests/fixtures/memory_wiki copied
 * to a temporary folder. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "memory/search.h"
#include "test.h"

#define WIKI HEARTH_SOURCE_DIR "/tests/fixtures/memory_wiki"
#define DIM 256

static int g_texts;  /* texts the stand-in embedded */
static int g_calls;  /* its calls */

/* Each lower-cased word of 3+ letters adds 1 to a bucket its hash picks; L2-normalised. */
static int fake_embed(void *ctx, const char *const *texts, int n, float *out, herr *err) {
  (void)ctx, (void)err;
  g_calls++;
  for (int i = 0; i < n; i++) {
    g_texts++;
    float *v = out + (size_t)i * DIM;
    memset(v, 0, sizeof(float) * DIM);
    const char *p = texts[i];
    while (*p) {
      while (*p && !((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z'))) p++;
      char w[64];
      int len = 0;
      while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')) {
        if (len < 63) w[len++] = (char)(*p | 0x20);
        p++;
      }
      if (len >= 3) v[memsearch_hash(w, (size_t)len) % DIM] += 1;
    }
    double s = 0;
    for (int d = 0; d < DIM; d++) s += (double)v[d] * v[d];
    if (s == 0) v[0] = 1, s = 1;
    for (int d = 0; d < DIM; d++) v[d] = (float)(v[d] / sqrt(s));
  }
  return 0;
}

static memsearch_embedder embedder(const char *identity) {
  return (memsearch_embedder){.embed = fake_embed, .dim = DIM, .identity = identity, .batch = 4, .pool = MEMSEARCH_POOL_TEXT};
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

/* A temporary copy of the fixture wiki (*.md). */
static char *wiki_copy(void) {
  char tmpl[] = "/tmp/hearth_memwiki_XXXXXX";
  char *dir = mkdtemp(tmpl);
  if (!dir) return NULL;
  DIR *d = opendir(WIKI);
  struct dirent *de;
  while (d && (de = readdir(d))) {
    if (!strstr(de->d_name, ".md")) continue;
    char from[4096], to[4096];
    snprintf(from, sizeof from, "%s/%s", WIKI, de->d_name);
    snprintf(to, sizeof to, "%s/%s", dir, de->d_name);
    hfile_copy(from, to, NULL);
  }
  if (d) closedir(d);
  return strdup(dir);
}

static void wiki_remove(char *dir) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
  free(dir);
}

static const char *best(memsearch *s, const char *query, memsearch_hit **keep) {
  static char slug[256];
  memsearch_hit *h = NULL;
  int n = 0;
  herr err = {0};
  slug[0] = 0;
  if (memsearch_query(s, query, 3, &h, &n, &err)) fprintf(stderr, "query: %s\n", err.msg);
  if (n > 0) snprintf(slug, sizeof slug, "%s", h[0].slug);
  if (keep) *keep = h;
  else memsearch_hits_free(h, n);
  return slug;
}

static void test_incremental(void) {
  char *dir = wiki_copy();
  CHECK(dir != NULL);
  if (!dir) return;
  memsearch_embedder e = embedder("fake-a");
  memsearch *s = NULL;
  herr err = {0};
  memsearch_stats st;
  CHECK_EQ_INT(memsearch_open(dir, &e, &s, &err), 0);
  g_texts = 0;
  CHECK_EQ_INT(memsearch_update(s, &st, &err), 0);
  CHECK_EQ_INT(st.articles, 6); /* index.md is not an article */
  CHECK_EQ_INT(st.embedded, 6);
  CHECK(st.rebuilt);
  CHECK(st.written);
  CHECK_EQ_INT(st.chunks_embedded, g_texts);
  CHECK(st.chunks_embedded > 6); /* house-move is cut in two at least */
  char idx[4200];
  snprintf(idx, sizeof idx, "%s/" MEMSEARCH_INDEX_DIR "/" MEMSEARCH_INDEX_NAME, dir);
  CHECK(hfile_exists(idx));
  /* unchanged: nothing embedded, nothing written */
  g_texts = 0;
  CHECK_EQ_INT(memsearch_update(s, &st, &err), 0);
  CHECK_EQ_INT(st.embedded, 0);
  CHECK_EQ_INT(g_texts, 0);
  CHECK(!st.written);
  CHECK(!st.rebuilt);
  memsearch_close(s);

  /* a new process reads the index: still nothing to embed */
  s = NULL;
  CHECK_EQ_INT(memsearch_open(dir, &e, &s, &err), 0);
  g_texts = 0;
  CHECK_EQ_INT(memsearch_update(s, &st, &err), 0);
  CHECK_EQ_INT(st.embedded, 0);
  CHECK_EQ_INT(g_texts, 0);
  CHECK_EQ_INT(st.articles, 6);
  CHECK_EQ_STR(best(s, "flat tyre puncture inner tube patch", NULL), "bicycle-repair");

  /* one article touched: it alone is embedded again */
  char path[4200];
  snprintf(path, sizeof path, "%s/river-fishing.md", dir);
  char *text = NULL;
  size_t len = 0;
  hfile_read(path, &text, &len, NULL);
  hbuf b = {0};
  hbuf_puts(&b, text ? text : "");
  hbuf_puts(&b, "\nA pike was seen under the bridge in September.\n");
  write_file(path, hbuf_str(&b));
  hbuf_free(&b);
  free(text);
  g_texts = 0;
  CHECK_EQ_INT(memsearch_update(s, &st, &err), 0);
  CHECK_EQ_INT(st.embedded, 1);
  CHECK_EQ_INT(st.chunks_embedded, 1);
  CHECK_EQ_INT(g_texts, 1);
  CHECK(st.written);
  CHECK_EQ_STR(best(s, "pike under the bridge", NULL), "river-fishing");

  /* a file written again with the same bytes is not embedded again */
  snprintf(path, sizeof path, "%s/sheep-flock.md", dir);
  text = NULL;
  hfile_read(path, &text, &len, NULL);
  write_file(path, text ? text : "");
  free(text);
  g_texts = 0;
  CHECK_EQ_INT(memsearch_update(s, &st, &err), 0);
  CHECK_EQ_INT(st.embedded, 0);
  CHECK_EQ_INT(g_texts, 0);

  /* deleted: dropped; a new one: embedded */
  snprintf(path, sizeof path, "%s/bicycle-repair.md", dir);
  unlink(path);
  snprintf(path, sizeof path, "%s/bees.md", dir);
  write_file(path, "---\ntitle: Bees\n---\nThe beehive stands by the orchard; honey is taken in August.\n");
  CHECK_EQ_INT(memsearch_update(s, &st, &err), 0);
  CHECK_EQ_INT(st.removed, 1);
  CHECK_EQ_INT(st.embedded, 1);
  CHECK_EQ_INT(st.articles, 6);
  CHECK(strcmp(best(s, "flat tyre puncture inner tube patch", NULL), "bicycle-repair") != 0);
  CHECK_EQ_STR(best(s, "honey from the beehive", NULL), "bees");
  memsearch_close(s);

  /* another model: everything again */
  memsearch_embedder e2 = embedder("fake-b");
  s = NULL;
  CHECK_EQ_INT(memsearch_open(dir, &e2, &s, &err), 0);
  g_texts = 0;
  CHECK_EQ_INT(memsearch_update(s, &st, &err), 0);
  CHECK(st.rebuilt);
  CHECK_EQ_INT(st.embedded, 6);
  CHECK_EQ_INT(g_texts, st.chunks_embedded);
  memsearch_close(s);

  /* a damaged index: rebuilt, not trusted */
  char *data = NULL;
  hfile_read(idx, &data, &len, NULL);
  if (data && len > 40) {
    data[len / 2] ^= 0x5a;
    FILE *f = fopen(idx, "wb");
    if (f) fwrite(data, 1, len, f), fclose(f);
  }
  free(data);
  s = NULL;
  CHECK_EQ_INT(memsearch_open(dir, &e2, &s, &err), 0);
  CHECK_EQ_INT(memsearch_update(s, &st, &err), 0);
  CHECK(st.rebuilt);
  CHECK_EQ_INT(st.embedded, 6);
  /* a truncated one too */
  CHECK_EQ_INT(truncate(idx, 30), 0);
  memsearch_close(s);
  s = NULL;
  CHECK_EQ_INT(memsearch_open(dir, &e2, &s, &err), 0);
  CHECK_EQ_INT(memsearch_update(s, &st, &err), 0);
  CHECK(st.rebuilt);
  CHECK_EQ_INT(st.embedded, 6);
  memsearch_close(s);
  wiki_remove(dir);
}

static void test_ranking_and_chunks(void) {
  char *dir = wiki_copy();
  if (!dir) return;
  memsearch_embedder e = embedder("fake-a");
  memsearch *s = NULL;
  herr err = {0};
  CHECK_EQ_INT(memsearch_open(dir, &e, &s, &err), 0);
  CHECK_EQ_INT(memsearch_update(s, NULL, &err), 0);
  CHECK_EQ_STR(best(s, "feed the starter with flour and water", NULL), "sourdough-bread");
  CHECK_EQ_STR(best(s, "brown spots on the tomato leaves", NULL), "tomato-garden");
  CHECK_EQ_STR(best(s, "lambs born in March, shorn wool", NULL), "sheep-flock");
  /* a word of house-move's last chunk: that chunk is the snippet */
  memsearch_hit *h = NULL;
  CHECK_EQ_STR(best(s, "chimney sweep, paint bedroom, gate", &h), "house-move");
  if (h) {
    CHECK(strstr(h[0].snippet, "chimney") != NULL);
    CHECK(strstr(h[0].snippet, "lease") == NULL); /* the first chunk's */
    CHECK_EQ_STR(h[0].title, "Moving house");
    CHECK(h[0].score > 0 && h[0].score <= 1.0001f);
    CHECK(!strchr(h[0].snippet, '\n'));
    memsearch_hits_free(h, 3);
  }
  /* k beyond the wiki: all of it, best first */
  int n = 0;
  CHECK_EQ_INT(memsearch_query(s, "river trout", 50, &h, &n, &err), 0);
  CHECK_EQ_INT(n, 6);
  for (int i = 1; i < n; i++) CHECK(h[i - 1].score >= h[i].score);
  memsearch_hits_free(h, n);
  CHECK_EQ_INT(memsearch_query(s, "", 3, &h, &n, &err), HEARTH_EINVAL);
  CHECK_EQ_INT(memsearch_query(s, "x", 0, &h, &n, &err), HEARTH_EINVAL);
  memsearch_close(s);
  wiki_remove(dir);
}

/* Word pooling: each distinct word embedded once per update, the chunks' and
 * the query's vectors their sums; another pooling rebuilds the index. */
static void test_words(void) {
  char *dir = wiki_copy();
  if (!dir) return;
  memsearch_embedder e = embedder("fake-a");
  e.pool = MEMSEARCH_POOL_WORDS;
  memsearch *s = NULL;
  herr err = {0};
  memsearch_stats st;
  CHECK_EQ_INT(memsearch_open(dir, &e, &s, &err), 0);
  g_texts = 0;
  CHECK_EQ_INT(memsearch_update(s, &st, &err), 0);
  CHECK_EQ_INT(st.embedded, 6);
  CHECK(st.words_embedded > 100);
  CHECK_EQ_INT(g_texts, st.words_embedded); /* words only: every chunk has some */
  CHECK(st.chunks_embedded > 6);
  CHECK_EQ_STR(best(s, "feed the starter with flour and water", NULL), "sourdough-bread");
  CHECK_EQ_STR(best(s, "Brown spots on the TOMATO leaves", NULL), "tomato-garden");
  CHECK_EQ_STR(best(s, "flat tyre puncture inner tube patch", NULL), "bicycle-repair");
  /* a query of only short words is embedded whole */
  g_texts = 0;
  memsearch_hit *h = NULL;
  int n = 0;
  CHECK_EQ_INT(memsearch_query(s, "a b", 2, &h, &n, &err), 0);
  CHECK_EQ_INT(g_texts, 1);
  CHECK_EQ_INT(n, 2);
  memsearch_hits_free(h, n);
  memsearch_close(s);
  /* the same wiki pooled from whole texts: rebuilt */
  e.pool = MEMSEARCH_POOL_TEXT;
  s = NULL;
  CHECK_EQ_INT(memsearch_open(dir, &e, &s, &err), 0);
  CHECK_EQ_INT(memsearch_update(s, &st, &err), 0);
  CHECK(st.rebuilt);
  CHECK_EQ_INT(st.embedded, 6);
  CHECK_EQ_INT(st.words_embedded, 0);
  memsearch_close(s);
  wiki_remove(dir);
}

static void test_articles(void) {
  char tmpl[] = "/tmp/hearth_memwiki_XXXXXX";
  char *dir = mkdtemp(tmpl);
  if (!dir) return;
  char path[4200];
  /* no front matter: titled by its slug; CRLF front matter with a quoted title */
  snprintf(path, sizeof path, "%s/plain-note.md", dir);
  write_file(path, "Just a line about owls.\n");
  snprintf(path, sizeof path, "%s/crlf.md", dir);
  write_file(path, "---\r\ntitle: \"Quoted: title\"\r\ncreated: 2026-01-01\r\n---\r\nBody about herons.\r\n");
  /* a long paragraph without blank lines, cut at sentence ends */
  hbuf b = {0};
  hbuf_puts(&b, "---\ntitle: Long\n---\n");
  for (int i = 0; i < 60; i++) hbuf_printf(&b, "Sentence number %d is here. ", i);
  hbuf_puts(&b, "The word zeppelin ends it.");
  snprintf(path, sizeof path, "%s/long.md", dir);
  write_file(path, hbuf_str(&b));
  hbuf_free(&b);
  /* empty body; hidden and non-.md files are not articles; index.md neither */
  snprintf(path, sizeof path, "%s/empty.md", dir);
  write_file(path, "---\ntitle: Empty article\n---\n");
  snprintf(path, sizeof path, "%s/.hidden.md", dir);
  write_file(path, "hidden\n");
  snprintf(path, sizeof path, "%s/notes.txt", dir);
  write_file(path, "not markdown\n");
  snprintf(path, sizeof path, "%s/index.md", dir);
  write_file(path, "- [[plain-note]]\n");
  memsearch_embedder e = embedder("fake-a");
  memsearch *s = NULL;
  herr err = {0};
  memsearch_stats st;
  CHECK_EQ_INT(memsearch_open(dir, &e, &s, &err), 0);
  CHECK_EQ_INT(memsearch_update(s, &st, &err), 0);
  CHECK_EQ_INT(st.articles, 4);
  CHECK(st.chunks_embedded >= 4 + 2); /* long.md: 2000+ bytes in chunks of at most 800 */
  memsearch_hit *h = NULL;
  int n = 0;
  CHECK_EQ_INT(memsearch_query(s, "owls", 4, &h, &n, &err), 0);
  if (n) {
    CHECK_EQ_STR(h[0].slug, "plain-note");
    CHECK_EQ_STR(h[0].title, "plain-note");
  }
  memsearch_hits_free(h, n);
  CHECK_EQ_INT(memsearch_query(s, "herons", 4, &h, &n, &err), 0);
  if (n) CHECK_EQ_STR(h[0].title, "Quoted: title");
  memsearch_hits_free(h, n);
  CHECK_EQ_INT(memsearch_query(s, "zeppelin", 4, &h, &n, &err), 0);
  if (n) {
    CHECK_EQ_STR(h[0].slug, "long");
    CHECK(strstr(h[0].snippet, "zeppelin") != NULL);
    CHECK(strlen(h[0].snippet) <= MEMSEARCH_CHUNK_CHARS);
    CHECK(strstr(h[0].snippet, "number 0 is") == NULL);
  }
  memsearch_hits_free(h, n);
  memsearch_close(s);
  /* an index that cannot be written (its folder's name taken by a file): searched all the same */
  char idx_dir[4200];
  snprintf(idx_dir, sizeof idx_dir, "%s/" MEMSEARCH_INDEX_DIR, dir);
  char rm[4300];
  snprintf(rm, sizeof rm, "rm -rf '%s'", idx_dir);
  CHECK_EQ_INT(system(rm), 0);
  write_file(idx_dir, "not a folder\n");
  s = NULL;
  CHECK_EQ_INT(memsearch_open(dir, &e, &s, &err), 0);
  CHECK_EQ_INT(memsearch_update(s, &st, &err), 0);
  CHECK(!st.written);
  CHECK_EQ_INT(st.embedded, 4);
  CHECK_EQ_INT(memsearch_query(s, "owls", 4, &h, &n, &err), 0);
  if (n) CHECK_EQ_STR(h[0].slug, "plain-note");
  memsearch_hits_free(h, n);
  memsearch_close(s);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK_EQ_INT(system(cmd), 0);
  /* not a folder */
  CHECK_EQ_INT(memsearch_open("/nonexistent/wiki", &e, &s, &err), HEARTH_ENOTFOUND);
}

static void test_tool(void) {
  char *dir = wiki_copy();
  if (!dir) return;
  memsearch_embedder e = embedder("fake-a");
  memsearch *s = NULL;
  herr err = {0};
  CHECK_EQ_INT(memsearch_open(dir, &e, &s, &err), 0);
  char *res = NULL;
  CHECK_EQ_INT(memsearch_tool_call(s, "{\"query\": \"counting the sheep at the fold\"}", 0, &res, &err), 0);
  CHECK(res && strstr(res, "[[sheep-flock]] The sheep flock (score "));
  CHECK(res && strstr(res, "3 articles"));
  free(res);
  res = NULL;
  CHECK_EQ_INT(memsearch_tool_call(s, "{\"query\": \"trout\", \"k\": 1}", 200, &res, &err), 0);
  CHECK(res && strstr(res, "1 article of"));
  CHECK(res && strstr(res, "[[river-fishing]]"));
  CHECK(res && strlen(res) < 300); /* the snippet cut to the size asked */
  free(res);
  res = NULL;
  CHECK_EQ_INT(memsearch_tool_call(s, "{\"q\": \"x\"}", 0, &res, &err), HEARTH_EINVAL);
  CHECK_EQ_INT(memsearch_tool_call(s, "not json", 0, &res, &err), HEARTH_EINVAL);
  CHECK(res == NULL);
  char *tool = memsearch_tool_json();
  json_t *t = tool ? json_loads(tool, 0, NULL) : NULL;
  CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(t, "function"), "name")), "memory_search");
  CHECK(json_is_object(json_object_get(json_object_get(t, "function"), "parameters")));
  json_decref(t);
  free(tool);
  memsearch_close(s);
  wiki_remove(dir);
}

int main(void) {
  RUN(test_incremental);
  RUN(test_ranking_and_chunks);
  RUN(test_words);
  RUN(test_articles);
  RUN(test_tool);
  fprintf(stderr, "%d checks, %d failures\n", test_checks, test_failures);
  return test_failures ? 1 : 0;
}
