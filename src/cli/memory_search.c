/* memory_search.c — `hearth memory search QUERY --wiki DIR`: a memory wiki's
 * articles ranked by the model's embeddings (src/memory/search.h), the index
 * beside the wiki brought up to date first; and the embedder over a loaded
 * model that `hearth chat --memory` shares (cli_memory_open). Uses the
 * public API, memory/search.h and engine/kv_disk.h (the model's identity:
 * its config and weight files). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/kv_disk.h"
#include "hearth.h"
#include "memory/search.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: hearth memory search QUERY --wiki DIR [--model PATH] [-k N] [--json] [--pooling words|text]\n\n"
          "Ranks the wiki's articles (DIR/<slug>.md, index.md left out) by the cosine of the query's\n"
          "vector with their best chunk's, best first. The vectors are kept in\n"
          "DIR/" MEMSEARCH_INDEX_DIR "/" MEMSEARCH_INDEX_NAME ": only new or changed articles are embedded, deleted\n"
          "ones dropped; another model rebuilds it.\n\n"
          "  --wiki DIR     the wiki folder\n"
          "  --model PATH   the model whose embeddings rank (default: the built-in model)\n"
          "  -k N           articles shown (default 5, at most %d)\n"
          "  --pooling P    a text's vector: words (the sum of its words' embeddings, each word embedded\n"
          "                 alone; the default for a model that generates) or text (the text embedded\n"
          "                 whole; the default for an embedding model without an output head)\n"
          "  --json         {\"query\", \"model\", \"pooling\", \"index\": {articles, embedded, chunks_embedded,\n"
          "                 words_embedded, removed, rebuilt}, \"results\": [{slug, title, score, snippet}]}\n"
          "  --threads N    CPU worker threads (default: one per CPU)\n",
          MEMSEARCH_MAX_K);
}

static int embed_model(void *ctx, const char *const *texts, int n, float *out, herr *err) {
  hearth_model *m = ctx;
  hearth_prompt *in = calloc((size_t)n, sizeof *in);
  if (!in) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (int i = 0; i < n; i++) in[i] = (hearth_prompt){.text = texts[i], .text_len = strlen(texts[i]), .add_special = true};
  int rc = hearth_embed(m, in, (size_t)n, NULL, out, NULL, err);
  free(in);
  return rc;
}

int cli_memory_open(const char *dir, hearth_model *m, int pool, memsearch **out, herr *err) {
  hearth_info info;
  hearth_model_info(m, &info);
  if (!info.can_embed) return herr_set(err, HEARTH_EUNSUPPORTED, "%s: this model gives no embeddings", info.id);
  uint64_t h = 0;
  int rc = kv_disk_model_identity(info.path, NULL, &h, err);
  if (rc) return rc;
  char ident[256];
  snprintf(ident, sizeof ident, "%016llx %d", (unsigned long long)h, (int)info.hidden_size); /* as serve --memory's */
  if (pool < 0) pool = info.can_generate ? MEMSEARCH_POOL_WORDS : MEMSEARCH_POOL_TEXT;
  memsearch_embedder e = {.embed = embed_model, .ctx = m, .dim = info.hidden_size, .identity = ident,
                          .pool = (memsearch_pool)pool};
  return memsearch_open(dir, &e, out, err);
}

/* s as a JSON string literal on stdout. */
static void print_json_string(const char *s) {
  putchar('"');
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') printf("\\%c", *p);
    else if (*p < 0x20) printf("\\u%04x", *p);
    else putchar(*p);
  }
  putchar('"');
}

int cli_memory_search(int argc, char **argv) {
  const char *wiki = NULL, *model_dir = NULL, *query = NULL;
  long long k = 5;
  bool json = false;
  int pool = -1;
  for (int i = 1; i < argc; i++) {
    const char *v = NULL;
    int r;
    if (cli_is_help(argv[i])) {
      usage(stdout);
      return 0;
    }
    if ((r = cli_opt(argc, argv, &i, "--wiki", &v))) {
      if (r < 0) return 2;
      wiki = v;
    } else if ((r = cli_opt(argc, argv, &i, "--model", &v))) {
      if (r < 0) return 2;
      model_dir = v;
    } else if ((r = cli_opt_int("memory search", argc, argv, &i, "-k", 1, MEMSEARCH_MAX_K, &k))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt(argc, argv, &i, "--pooling", &v))) {
      if (r < 0) return 2;
      if (!strcmp(v, "words")) pool = MEMSEARCH_POOL_WORDS;
      else if (!strcmp(v, "text")) pool = MEMSEARCH_POOL_TEXT;
      else return cli_usage_error("memory search", "--pooling is words or text, not '%s'", v);
    } else if (!strcmp(argv[i], "--json")) {
      json = true;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      return cli_usage_error("memory search", "unknown option '%s'", argv[i]);
    } else if (query) {
      return cli_usage_error("memory search", "one QUERY (quote it): '%s' is a second", argv[i]);
    } else {
      query = argv[i];
    }
  }
  if (!query || !query[0]) return cli_usage_error("memory search", "give a QUERY");
  if (!wiki) return cli_usage_error("memory search", "give the wiki folder: --wiki DIR");
  if (!model_dir && !(model_dir = cli_default_model()))
    return cli_fail("no --model given and no built-in model found (models/default)");
  herr err = {0};
  hearth_model *m = NULL;
  hearth_load_opts lo;
  cli_hearth_load_opts(&lo);
  if (hearth_model_load(model_dir, &lo, &m, &err)) return cli_fail("%s", err.msg);
  memsearch *s = NULL;
  memsearch_hit *hits = NULL;
  int n = 0, status = 1;
  memsearch_stats st;
  if (cli_memory_open(wiki, m, pool, &s, &err) || memsearch_update(s, &st, &err) ||
      memsearch_query(s, query, (int)k, &hits, &n, &err)) {
    cli_fail("memory search: %s", err.msg);
    goto done;
  }
  status = 0;
  if (json) {
    hearth_info info;
    hearth_model_info(m, &info);
    printf("{\"query\":");
    print_json_string(query);
    printf(",\"model\":");
    print_json_string(info.id);
    printf(",\"pooling\":\"%s\",\"index\":{\"articles\":%d,\"embedded\":%d,\"chunks_embedded\":%d,\"words_embedded\":%d,"
           "\"removed\":%d,\"rebuilt\":%s},\"results\":[",
           memsearch_pool_name(memsearch_pool_of(s)), st.articles, st.embedded, st.chunks_embedded, st.words_embedded,
           st.removed, st.rebuilt ? "true" : "false");
    for (int i = 0; i < n; i++) {
      printf("%s\n{\"slug\":", i ? "," : "");
      print_json_string(hits[i].slug);
      printf(",\"title\":");
      print_json_string(hits[i].title);
      printf(",\"score\":%.6f,\"snippet\":", (double)hits[i].score);
      print_json_string(hits[i].snippet);
      printf("}");
    }
    printf("\n]}\n");
  } else {
    if (st.embedded || st.removed)
      fprintf(stderr, "hearth: memory: %d article%s embedded, %d removed (%d in the wiki)\n", st.embedded,
              st.embedded == 1 ? "" : "s", st.removed, st.articles);
    if (n == 0) fprintf(stderr, "hearth: memory: the wiki %s has no articles\n", wiki);
    for (int i = 0; i < n; i++) {
      const char *snip = hits[i].snippet;
      int len = (int)strlen(snip);
      if (len > 160) { /* a line's worth, not cutting a UTF-8 sequence */
        len = 160;
        while (len > 0 && ((unsigned char)snip[len] & 0xC0) == 0x80) len--;
      }
      printf("%.3f  %s  %s\n       %.*s%s\n", (double)hits[i].score, hits[i].slug, hits[i].title, len, snip,
             (size_t)len < strlen(snip) ? "…" : "");
    }
  }
done:
  memsearch_hits_free(hits, n);
  memsearch_close(s);
  hearth_model_free(m);
  return status;
}
