/* search.h — a wiki's articles ranked by embeddings (`hearth memory search`,
 * and the memory_search tool of `hearth chat --memory` / `hearth serve
 * --memory`).
 *
 * A wiki is a folder of Markdown articles DIR/<slug>.md, each opening with
 * front matter (--- title: ..., sources, created, updated ---) and then a body
 * with [[slug]] links; DIR/index.md lists them and is not ranked. Each
 * article is cut into chunks of about MEMSEARCH_CHUNK_CHARS bytes at
 * paragraph (else sentence, else word) boundaries; each chunk, with the
 * article's title before it, gets a vector pooled one of two ways (the
 * query's the same way): its text embedded whole (MEMSEARCH_POOL_TEXT, what
 * an embedding model is made for), or the normalised sum of its words'
 * embeddings, each word embedded alone (MEMSEARCH_POOL_WORDS: a language
 * model's last-token state of a whole passage says little of what the
 * passage is about, of a single word much more). An article scores the best
 * cosine of its chunks against the query's vector.
 *
 * The vectors are kept in DIR/.hearth-memory/search.idx (format below),
 * updated incrementally by memsearch_update: an article whose bytes hash to
 * what the index holds keeps its vectors, a changed or new one is embedded,
 * a deleted one is dropped; another embedding model (identity string), width
 * or chunking rebuilds it all. A damaged or foreign index is rebuilt with a
 * warning.
 *
 * Knows nothing of models: the caller hands in an embedder (a function that
 * embeds texts, its width and an identity naming the model). */
#ifndef HEARTH_MEMORY_SEARCH_H
#define HEARTH_MEMORY_SEARCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define MEMSEARCH_INDEX_DIR ".hearth-memory"
#define MEMSEARCH_INDEX_NAME "search.idx"
#define MEMSEARCH_CHUNK_CHARS 800
#define MEMSEARCH_MAX_K 100

/* The index file, host byte order (another order reads as damaged):
 *   "HMEMIDX\0"  u32 version (1)  u32 dim  u32 chunk_chars  u32 pooling
 *   u32 len + bytes: the embedder's identity
 *   u32 articles, each: u32 len + slug, u64 content hash (memsearch_hash of the file's bytes),
 *       u32 len + title, u32 chunks, each: u32 offset, u32 length (the chunk's bytes in the
 *       file) and dim f32 (its unit vector)
 *   u64 memsearch_hash of every byte before it. */
#define MEMSEARCH_INDEX_VERSION 1u

/* How a text's vector is made from the embedder's (see the file comment). */
typedef enum memsearch_pool { MEMSEARCH_POOL_WORDS = 0, MEMSEARCH_POOL_TEXT = 1 } memsearch_pool;
/* "words", "text". */
const char *memsearch_pool_name(int pool);

/* Embeds n texts into out (n × dim floats, each L2-normalised). */
typedef int (*memsearch_embed_fn)(void *ctx, const char *const *texts, int n, float *out, herr *err);

typedef struct memsearch_embedder {
  memsearch_embed_fn embed;
  void *ctx;                /* borrowed: handed to embed */
  int dim;                  /* the vectors' width */
  const char *identity;     /* borrowed (copied by memsearch_open): names the model; another rebuilds */
  int batch;                /* texts per embed call at most (<= 0: 32; words go 256 at a time) */
  memsearch_pool pool;      /* another pooling than the index's rebuilds it */
} memsearch_embedder;

/* What the last memsearch_update did. */
typedef struct memsearch_stats {
  int articles;        /* ranked articles in the wiki */
  int embedded;        /* articles (re-)embedded: new or changed, or all on a rebuild */
  int chunks_embedded; /* their chunks */
  int words_embedded;  /* distinct words embedded for them (word pooling) */
  int removed;         /* articles dropped from the index (deleted from the wiki) */
  bool rebuilt;        /* the index was missing, damaged or of another model / width / chunking */
  bool written;        /* the index file was written */
} memsearch_stats;

typedef struct memsearch_hit {
  char *slug;     /* owned */
  char *title;    /* owned */
  char *snippet;  /* owned: the best chunk's text, whitespace runs made one space */
  float score;    /* cosine of the best chunk with the query, in [-1, 1] */
} memsearch_hit;

typedef struct memsearch memsearch;

/* Opens the wiki at dir (which must be a folder) for searching with emb;
 * reads nothing yet (memsearch_update does). Thread-safe after this: every
 * call below takes the object's lock. */
int memsearch_open(const char *dir, const memsearch_embedder *emb, memsearch **out, herr *err);
void memsearch_close(memsearch *s);
/* The pooling s was opened with. */
memsearch_pool memsearch_pool_of(const memsearch *s);

/* Brings the index up to date with the wiki (see the file comment) and
 * writes it when anything changed (where it cannot be written, a warning:
 * the wiki is searched all the same). st may be NULL. */
int memsearch_update(memsearch *s, memsearch_stats *st, herr *err);

/* The k (1..MEMSEARCH_MAX_K) best articles for query, best first (ties: by
 * slug), after an update; *hits: memsearch_hits_free. Fewer when the wiki
 * has fewer. */
int memsearch_query(memsearch *s, const char *query, int k, memsearch_hit **hits, int *n, herr *err);
void memsearch_hits_free(memsearch_hit *hits, int n);

/* 64-bit hash of bytes (the content hash of an article and the index's checksum). */
uint64_t memsearch_hash(const void *p, size_t n);

/* ---- the memory_search tool ---- */

#define MEMSEARCH_TOOL_NAME "memory_search"
#define MEMSEARCH_TOOL_K 3
/* The tool's description and its parameters' JSON Schema ({"query": string, "k": integer}). */
extern const char memsearch_tool_description[];
extern const char memsearch_tool_parameters[];
/* The tool as an OpenAI tools array entry (JSON text, malloc'd). */
char *memsearch_tool_json(void);
/* Runs a call: args_json its arguments ({"query": "...", "k": N}, k optional: 1..10,
 * default MEMSEARCH_TOOL_K); the wiki is updated first (it may have changed since).
 * *result (malloc'd) is the tool message's text: the hits, each "[[slug]] Title
 * (score S)" and its snippet, the snippets cut so that the whole is about max_bytes
 * (<= 0: 4096; at least 80 bytes of each): a caller sizes it to the model's context.
 * HEARTH_EINVAL for arguments without a query. */
int memsearch_tool_call(memsearch *s, const char *args_json, int max_bytes, char **result, herr *err);

#endif
