/* search.c — a wiki's articles ranked by embeddings, with an index kept
 * beside the wiki and updated incrementally (search.h says what and how).
 * Owns: reading articles (front matter's title, the body cut into chunks),
 * the index file, ranking, and the memory_search tool's call and text.
 * Knows no model: vectors come from the caller's embedder. */
#include "memory/search.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/dict.h"
#include "base/file.h"
#include "base/hash.h"
#include "base/log.h"

static const char index_magic[8] = {'H', 'M', 'E', 'M', 'I', 'D', 'X', 0};

typedef struct ms_chunk {
  uint32_t off, len; /* bytes of the article's file */
} ms_chunk;

typedef struct ms_article {
  char *slug;       /* owned */
  char *title;      /* owned */
  uint64_t hash;    /* of the file's bytes */
  char *text;       /* owned: the file as last read (NULL until read) */
  size_t text_len;
  ms_chunk *chunks; /* owned */
  int nchunks;
  float *vecs;      /* owned: nchunks × dim */
  bool seen;        /* found in the wiki by the update running */
  bool pending;     /* to embed */
} ms_article;

struct memsearch {
  char *dir;        /* owned */
  char *idx_dir;    /* owned: dir/.hearth-memory */
  char *idx_path;   /* owned */
  memsearch_embedder emb;
  char *identity;   /* owned copy of emb.identity */
  ms_article *arts; /* owned */
  int n, cap;
  bool loaded;      /* the index file was read (or found unusable) */
  bool rebuild;     /* what was read is not to be trusted: everything is embedded */
  pthread_mutex_t mu;
};

const char *memsearch_pool_name(int pool) {
  return pool == MEMSEARCH_POOL_WORDS ? "words" : pool == MEMSEARCH_POOL_TEXT ? "text" : "?";
}

uint64_t memsearch_hash(const void *p, size_t n) {
  const unsigned char *b = p;
  uint64_t h = 0x6d656d6f7279ull ^ (uint64_t)n;
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, b, 8);
    h = hmix64(h ^ w) + HMIX64_GAMMA;
    b += 8;
    n -= 8;
  }
  uint64_t w = 0;
  memcpy(&w, b, n);
  return hmix64(h ^ w ^ ((uint64_t)n << 56));
}

static void article_free(ms_article *a) {
  free(a->slug);
  free(a->title);
  free(a->text);
  free(a->chunks);
  free(a->vecs);
  memset(a, 0, sizeof *a);
}

static void articles_clear(memsearch *s) {
  for (int i = 0; i < s->n; i++) article_free(&s->arts[i]);
  s->n = 0;
}

int memsearch_open(const char *dir, const memsearch_embedder *emb, memsearch **out, herr *err) {
  *out = NULL;
  if (!emb || !emb->embed || emb->dim <= 0 || !emb->identity ||
      (emb->pool != MEMSEARCH_POOL_WORDS && emb->pool != MEMSEARCH_POOL_TEXT))
    return herr_set(err, HEARTH_EINVAL, "memory search: no embedder");
  struct stat st;
  if (stat(dir, &st) || !S_ISDIR(st.st_mode)) return herr_set(err, HEARTH_ENOTFOUND, "%s: no such wiki folder", dir);
  memsearch *s = calloc(1, sizeof *s);
  if (!s) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  s->dir = strdup(dir);
  s->idx_dir = hpath_join(dir, MEMSEARCH_INDEX_DIR);
  s->idx_path = s->idx_dir ? hpath_join(s->idx_dir, MEMSEARCH_INDEX_NAME) : NULL;
  s->identity = strdup(emb->identity);
  s->emb = *emb;
  s->emb.identity = s->identity;
  if (s->emb.batch <= 0) s->emb.batch = 32;
  pthread_mutex_init(&s->mu, NULL);
  if (!s->dir || !s->idx_path || !s->identity) {
    memsearch_close(s);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  *out = s;
  return 0;
}

memsearch_pool memsearch_pool_of(const memsearch *s) { return s->emb.pool; }

void memsearch_close(memsearch *s) {
  if (!s) return;
  articles_clear(s);
  free(s->arts);
  free(s->dir);
  free(s->idx_dir);
  free(s->idx_path);
  free(s->identity);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* ---- the index file ---- */

typedef struct reader {
  const unsigned char *p, *end;
  bool bad;
} reader;

static void rd(reader *r, void *out, size_t n) {
  if (r->bad || (size_t)(r->end - r->p) < n) {
    r->bad = true;
    memset(out, 0, n);
    return;
  }
  memcpy(out, r->p, n);
  r->p += n;
}

static uint32_t rd_u32(reader *r) {
  uint32_t v;
  rd(r, &v, 4);
  return v;
}

/* A length-prefixed string (malloc'd), NULL when bad. */
static char *rd_str(reader *r, uint32_t max) {
  uint32_t n = rd_u32(r);
  if (r->bad || n > max || (size_t)(r->end - r->p) < n) {
    r->bad = true;
    return NULL;
  }
  char *s = malloc((size_t)n + 1);
  if (!s) {
    r->bad = true;
    return NULL;
  }
  memcpy(s, r->p, n);
  s[n] = 0;
  r->p += n;
  return s;
}

static bool ms_append(memsearch *s, ms_article **out) {
  if (s->n == s->cap) {
    int cap = s->cap ? s->cap * 2 : 16;
    ms_article *a = realloc(s->arts, sizeof *a * (size_t)cap);
    if (!a) return false;
    s->arts = a;
    s->cap = cap;
  }
  *out = &s->arts[s->n++];
  memset(*out, 0, sizeof **out);
  return true;
}

/* Reads the index into s->arts. Why it cannot be used goes to *why (then
 * everything is embedded again); only running out of memory is an error. */
static int index_read(memsearch *s, char *why, size_t cap, herr *err) {
  why[0] = 0;
  char *data = NULL;
  size_t len = 0;
  herr rerr = {0};
  if (!hfile_exists(s->idx_path)) {
    snprintf(why, cap, "no index yet");
    return 0;
  }
  if (hfile_read(s->idx_path, &data, &len, &rerr)) {
    snprintf(why, cap, "%s", rerr.msg);
    return 0;
  }
  reader r = {(const unsigned char *)data, (const unsigned char *)data + len, false};
  char magic[8];
  rd(&r, magic, 8);
  uint64_t sum = 0;
  if (len >= 16) memcpy(&sum, data + len - 8, 8);
  if (r.bad || memcmp(magic, index_magic, 8) || len < 16 || sum != memsearch_hash(data, len - 8)) {
    snprintf(why, cap, "%s is damaged or not an index", s->idx_path);
    free(data);
    return 0;
  }
  r.end -= 8;
  uint32_t version = rd_u32(&r), dim = rd_u32(&r), chunk_chars = rd_u32(&r), pool = rd_u32(&r);
  char *ident = rd_str(&r, 4096);
  if (!r.bad && version != MEMSEARCH_INDEX_VERSION) snprintf(why, cap, "index version %u, not %u", version, MEMSEARCH_INDEX_VERSION);
  else if (!r.bad && (int)dim != s->emb.dim) snprintf(why, cap, "vectors of %u values, not %d", dim, s->emb.dim);
  else if (!r.bad && chunk_chars != MEMSEARCH_CHUNK_CHARS) snprintf(why, cap, "chunks of %u bytes, not %d", chunk_chars, MEMSEARCH_CHUNK_CHARS);
  else if (!r.bad && pool != (uint32_t)s->emb.pool) snprintf(why, cap, "vectors pooled %s, not %s", memsearch_pool_name((int)pool), memsearch_pool_name(s->emb.pool));
  else if (!r.bad && strcmp(ident, s->identity)) snprintf(why, cap, "another embedding model (%.200s)", ident);
  free(ident);
  if (why[0] || r.bad) {
    if (!why[0]) snprintf(why, cap, "%s is damaged", s->idx_path);
    free(data);
    return 0;
  }
  uint32_t narts = rd_u32(&r);
  for (uint32_t i = 0; i < narts && !r.bad; i++) {
    ms_article *a;
    if (!ms_append(s, &a)) {
      free(data);
      return herr_set(err, HEARTH_ENOMEM, "out of memory");
    }
    a->slug = rd_str(&r, 4096);
    rd(&r, &a->hash, 8);
    a->title = rd_str(&r, 1 << 16);
    uint32_t nc = rd_u32(&r);
    if (r.bad || nc > (1u << 20) || (size_t)(r.end - r.p) / (8 + 4 * (size_t)dim) < nc) {
      r.bad = true;
      break;
    }
    a->nchunks = (int)nc;
    a->chunks = calloc(nc ? nc : 1, sizeof *a->chunks);
    a->vecs = malloc(sizeof(float) * (nc ? nc : 1) * dim);
    if (!a->chunks || !a->vecs) {
      free(data);
      return herr_set(err, HEARTH_ENOMEM, "out of memory");
    }
    for (uint32_t c = 0; c < nc; c++) {
      a->chunks[c].off = rd_u32(&r);
      a->chunks[c].len = rd_u32(&r);
      rd(&r, a->vecs + (size_t)c * dim, sizeof(float) * dim);
    }
  }
  if (!r.bad && r.p != r.end) r.bad = true;
  free(data);
  if (r.bad) {
    articles_clear(s);
    snprintf(why, cap, "%s is damaged", s->idx_path);
  }
  return 0;
}

static void put_u32(hbuf *b, uint32_t v) { hbuf_append(b, &v, 4); }
static void put_str(hbuf *b, const char *s) {
  put_u32(b, (uint32_t)strlen(s));
  hbuf_append(b, s, strlen(s));
}

/* Writes the index whole to a temporary file, then renames it over the old one. */
static int index_write(memsearch *s, herr *err) {
  hbuf b = {0};
  hbuf_append(&b, index_magic, 8);
  put_u32(&b, MEMSEARCH_INDEX_VERSION);
  put_u32(&b, (uint32_t)s->emb.dim);
  put_u32(&b, MEMSEARCH_CHUNK_CHARS);
  put_u32(&b, (uint32_t)s->emb.pool);
  put_str(&b, s->identity);
  put_u32(&b, (uint32_t)s->n);
  for (int i = 0; i < s->n; i++) {
    const ms_article *a = &s->arts[i];
    put_str(&b, a->slug);
    hbuf_append(&b, &a->hash, 8);
    put_str(&b, a->title);
    put_u32(&b, (uint32_t)a->nchunks);
    for (int c = 0; c < a->nchunks; c++) {
      put_u32(&b, a->chunks[c].off);
      put_u32(&b, a->chunks[c].len);
      hbuf_append(&b, a->vecs + (size_t)c * s->emb.dim, sizeof(float) * (size_t)s->emb.dim);
    }
  }
  uint64_t sum = memsearch_hash(b.data, b.len);
  hbuf_append(&b, &sum, 8);
  if (b.oom) {
    hbuf_free(&b);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  if (mkdir(s->idx_dir, 0755) && errno != EEXIST) {
    hbuf_free(&b);
    return herr_set(err, HEARTH_EIO, "%s: %s", s->idx_dir, strerror(errno));
  }
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", s->idx_path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  int rc = 0;
  if (!f) {
    rc = herr_set(err, HEARTH_EIO, "%s: %s", tmp, strerror(errno));
  } else {
    bool ok = fwrite(b.data, 1, b.len, f) == b.len;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, s->idx_path)) {
      rc = herr_set(err, HEARTH_EIO, "%s: %s", s->idx_path, strerror(errno));
      unlink(tmp);
    }
  }
  hbuf_free(&b);
  return rc;
}

/* ---- articles ---- */

/* The end of the line starting at p (its '\n' or the end). */
static const char *line_end(const char *p, const char *end) {
  const char *e = memchr(p, '\n', (size_t)(end - p));
  return e ? e : end;
}

/* The front matter's title and where the body starts. No front matter: the
 * title is the slug and the body is the whole file. *title malloc'd. */
static int front_matter(const char *text, size_t len, const char *slug, char **title, size_t *body) {
  const char *p = text, *end = text + len;
  *body = 0;
  *title = NULL;
  if (len >= 4 && !strncmp(p, "---", 3) && (p[3] == '\n' || p[3] == '\r')) {
    const char *q = line_end(p, end);
    while (q < end) {
      const char *ls = q + 1, *le = line_end(ls, end);
      size_t n = (size_t)(le - ls);
      if (n && ls[n - 1] == '\r') n--;
      if (n == 3 && !strncmp(ls, "---", 3)) {
        *body = (size_t)(le < end ? le + 1 - text : len);
        break;
      }
      if (!*title && n > 6 && !strncmp(ls, "title:", 6)) {
        const char *v = ls + 6, *ve = ls + n;
        while (v < ve && (*v == ' ' || *v == '\t')) v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
        if (ve - v >= 2 && (*v == '"' || *v == '\'') && ve[-1] == *v) v++, ve--;
        *title = strndup(v, (size_t)(ve - v));
        if (!*title) return HEARTH_ENOMEM;
      }
      q = le;
    }
  }
  if (!*title || !(*title)[0]) {
    free(*title);
    *title = strdup(slug);
  }
  return *title ? 0 : HEARTH_ENOMEM;
}

static bool blank_line(const char *p, const char *e) {
  for (; p < e; p++)
    if (*p != ' ' && *p != '\t' && *p != '\r') return false;
  return true;
}

/* Cuts body [from, len) of text into chunks of at most MEMSEARCH_CHUNK_CHARS
 * bytes: whole paragraphs while they fit, a longer paragraph at its last
 * sentence end (else space) before the limit. At least one chunk (maybe empty). */
static int chunk_body(const char *text, size_t from, size_t len, ms_chunk **out, int *nout) {
  ms_chunk *cs = NULL;
  int n = 0, cap = 0;
  size_t limit = MEMSEARCH_CHUNK_CHARS;
  size_t start = from, cur_start = 0, cur_end = 0; /* the chunk being filled: [cur_start, cur_end) */
  bool open = false;
  const char *end = text + len;
#define EMIT(a, b)                                                      \
  do {                                                                  \
    if (n == cap) {                                                     \
      int nc = cap ? cap * 2 : 8;                                       \
      ms_chunk *g = realloc(cs, sizeof *g * (size_t)nc);                \
      if (!g) {                                                         \
        free(cs);                                                       \
        return HEARTH_ENOMEM;                                           \
      }                                                                 \
      cs = g, cap = nc;                                                 \
    }                                                                   \
    cs[n++] = (ms_chunk){(uint32_t)(a), (uint32_t)((b) - (a))};         \
  } while (0)
  while (start < len) {
    /* the next paragraph: [ps, pe), lines up to a blank line */
    const char *p = text + start;
    while (p < end) { /* skip blank lines */
      const char *le = line_end(p, end);
      if (!blank_line(p, le)) break;
      p = le < end ? le + 1 : end;
    }
    if (p >= end) break;
    const char *ps = p, *pe = p;
    while (p < end) {
      const char *le = line_end(p, end);
      if (blank_line(p, le)) break;
      pe = le;
      p = le < end ? le + 1 : end;
    }
    start = (size_t)(p - text);
    size_t a = (size_t)(ps - text), b = (size_t)(pe - text);
    if (open && b - cur_start <= limit) { /* the paragraph joins the chunk */
      cur_end = b;
      continue;
    }
    if (open) {
      EMIT(cur_start, cur_end);
      open = false;
    }
    while (b - a > limit) { /* a long paragraph: cut at a sentence end, else a space */
      size_t cut = 0;
      for (size_t i = a + limit; i > a + limit / 2 && !cut; i--)
        if ((text[i - 1] == '.' || text[i - 1] == '!' || text[i - 1] == '?') && (text[i] == ' ' || text[i] == '\n'))
          cut = i;
      for (size_t i = a + limit; i > a + limit / 4 && !cut; i--)
        if (text[i] == ' ' || text[i] == '\n') cut = i;
      if (!cut) { /* no space: cut at the limit, backing off to a UTF-8 sequence's start */
        cut = a + limit;
        while (cut > a + 1 && ((unsigned char)text[cut] & 0xC0) == 0x80) cut--;
      }
      EMIT(a, cut);
      a = cut;
      while (a < b && (text[a] == ' ' || text[a] == '\n')) a++;
    }
    if (a < b) cur_start = a, cur_end = b, open = true;
  }
  if (open) EMIT(cur_start, cur_end);
  if (n == 0) EMIT(from, from);
#undef EMIT
  *out = cs;
  *nout = n;
  return 0;
}

/* The text a chunk is embedded as: the title, a blank line, the chunk with
 * [[slug]] links written as their words ([[a-b]] → "a b", [[a|label]] → label). */
static void chunk_text(const ms_article *a, const ms_chunk *c, hbuf *out) {
  hbuf_puts(out, a->title);
  hbuf_puts(out, "\n\n");
  const char *p = a->text + c->off, *end = p + c->len;
  while (p < end) {
    if (end - p >= 4 && p[0] == '[' && p[1] == '[') {
      const char *close = NULL;
      for (const char *q = p + 2; q + 1 < end && *q != '\n'; q++)
        if (q[0] == ']' && q[1] == ']') {
          close = q;
          break;
        }
      if (close) {
        const char *s = p + 2, *bar = memchr(s, '|', (size_t)(close - s));
        if (bar) s = bar + 1;
        for (; s < close; s++) hbuf_putc(out, (bar || (*s != '-' && *s != '_')) ? *s : ' ');
        p = close + 2;
        continue;
      }
    }
    hbuf_putc(out, *p++);
  }
}

static bool is_article_name(const char *name) {
  size_t n = strlen(name);
  return n > 3 && name[0] != '.' && !strcmp(name + n - 3, ".md") && strcmp(name, "index.md");
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int cmp_articles(const void *a, const void *b) {
  return strcmp(((const ms_article *)a)->slug, ((const ms_article *)b)->slug);
}

/* The article called slug, through `by_slug` (slug → index in s->arts); NULL when none. */
static ms_article *article_find(memsearch *s, const hdict *by_slug, const char *slug) {
  int64_t i;
  return hdict_gets(by_slug, slug, &i) && i < s->n ? &s->arts[i] : NULL;
}

/* The wiki's article file names, sorted (*names malloc'd, each too). */
static int list_articles(const char *dir, char ***names, int *n, herr *err) {
  *names = NULL;
  *n = 0;
  DIR *d = opendir(dir);
  if (!d) return herr_set(err, HEARTH_EIO, "%s: %s", dir, strerror(errno));
  char **v = NULL;
  int cnt = 0, cap = 0, rc = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (!is_article_name(de->d_name)) continue;
    char *path = hpath_join(dir, de->d_name);
    struct stat st;
    bool regular = path && !stat(path, &st) && S_ISREG(st.st_mode);
    free(path);
    if (!regular) continue;
    if (cnt == cap) {
      int nc = cap ? cap * 2 : 64;
      char **g = realloc(v, sizeof *g * (size_t)nc);
      if (!g) {
        rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
        break;
      }
      v = g, cap = nc;
    }
    if (!(v[cnt] = strdup(de->d_name))) {
      rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
      break;
    }
    cnt++;
  }
  closedir(d);
  if (rc) {
    for (int i = 0; i < cnt; i++) free(v[i]);
    free(v);
    return rc;
  }
  if (cnt > 1) qsort(v, (size_t)cnt, sizeof *v, cmp_names);
  *names = v;
  *n = cnt;
  return 0;
}

/* A batch of chunk texts on its way to the embedder, and where each vector goes. */
typedef struct batch {
  char **texts; /* owned, each too */
  float **dest; /* borrowed: the articles' vectors */
  float *out;   /* owned: n × dim */
  int n, cap;
} batch;

static int batch_flush(memsearch *s, batch *b, int *chunks_done, herr *err) {
  int rc = b->n ? s->emb.embed(s->emb.ctx, (const char *const *)b->texts, b->n, b->out, err) : 0;
  for (int k = 0; k < b->n; k++) {
    if (!rc) memcpy(b->dest[k], b->out + (size_t)k * s->emb.dim, sizeof(float) * (size_t)s->emb.dim);
    free(b->texts[k]);
    b->texts[k] = NULL;
  }
  if (!rc) *chunks_done += b->n;
  b->n = 0;
  return rc;
}

/* ---- word pooling ----
 * Under MEMSEARCH_POOL_WORDS a text's vector is the normalised sum of its
 * words' vectors, each word (a run of ASCII letters and digits or non-ASCII
 * bytes, 3 bytes or more, ASCII lower-cased, at most WORD_MAX bytes kept,
 * English function words left out) embedded alone as " word". Each distinct word is embedded once per
 * update (a bank of them), so the cost is the wiki's vocabulary. */

#define WORD_MAX 48
#define WORD_BATCH 256

typedef struct wordbank {
  hdict index;     /* word → its row */
  float *vecs;     /* owned: rows × dim (rows embedded so far: done) */
  char **texts;    /* owned: " word" of each row */
  int rows, cap, done;
} wordbank;

static void bank_free(wordbank *b) {
  hdict_free(&b->index);
  for (int i = 0; i < b->rows; i++) free(b->texts[i]);
  free(b->texts);
  free(b->vecs);
  memset(b, 0, sizeof *b);
}

static bool word_byte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c >= 0x80;
}

/* English function words, which say nothing of what a text is about and
 * would pull every pooled vector toward the same place: left out. */
static const char *const stop_words[] = {
    "about", "after", "again", "all", "also", "and", "any", "are", "because", "been", "before", "being", "both",
    "but", "can", "could", "did", "does", "doing", "down", "during", "each", "few", "for", "from", "further", "had",
    "has", "have", "having", "her", "here", "hers", "herself", "him", "himself", "his", "how", "into", "its",
    "itself", "just", "more", "most", "myself", "nor", "not", "now", "off", "once", "only", "other", "our", "ours",
    "out", "over", "own", "same", "she", "should", "some", "such", "than", "that", "the", "their", "theirs", "them",
    "themselves", "then", "there", "these", "they", "this", "those", "through", "too", "under", "until", "very",
    "was", "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you",
    "your", "yours", "yourself",
};

static bool stop_word(const char *w, size_t n) {
  if (n > 10) return false;
  for (size_t i = 0; i < sizeof stop_words / sizeof stop_words[0]; i++)
    if (strlen(stop_words[i]) == n && !memcmp(stop_words[i], w, n)) return true;
  return false;
}

/* The next word of [*p, end) lower-cased into w (NUL-terminated, its length returned; 0: none
 * left); *p moves past it. Stop words are skipped. */
static size_t next_word(const char **p, const char *end, char *w) {
  for (;;) {
    while (*p < end && !word_byte((unsigned char)**p)) (*p)++;
    if (*p >= end) return 0;
    const char *s = *p;
    while (*p < end && word_byte((unsigned char)**p)) (*p)++;
    size_t n = (size_t)(*p - s);
    if (n < 3) continue;
    if (n > WORD_MAX) { /* kept whole up to WORD_MAX, not cutting a UTF-8 sequence */
      n = WORD_MAX;
      while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    }
    for (size_t i = 0; i < n; i++) w[i] = (char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] | 0x20 : s[i]);
    w[n] = 0;
    if (stop_word(w, n)) continue;
    return n;
  }
}

/* Registers every word of text in the bank. */
static int bank_add_text(wordbank *b, const char *text, size_t len, int dim) {
  const char *p = text, *end = text + len;
  char w[WORD_MAX + 1];
  size_t n;
  while ((n = next_word(&p, end, w))) {
    int64_t row;
    if (hdict_get(&b->index, w, n, &row)) continue;
    if (b->rows == b->cap) {
      int cap = b->cap ? b->cap * 2 : 256;
      char **t = realloc(b->texts, sizeof *t * (size_t)cap);
      if (!t) return HEARTH_ENOMEM;
      b->texts = t;
      float *v = realloc(b->vecs, sizeof(float) * (size_t)dim * (size_t)cap);
      if (!v) return HEARTH_ENOMEM;
      b->vecs = v;
      b->cap = cap;
    }
    char *t = malloc(n + 2);
    if (!t) return HEARTH_ENOMEM;
    t[0] = ' ';
    memcpy(t + 1, w, n + 1);
    if (!hdict_put(&b->index, w, n, b->rows)) {
      free(t);
      return HEARTH_ENOMEM;
    }
    b->texts[b->rows++] = t;
  }
  return 0;
}

/* Embeds the bank's words not embedded yet. */
static int bank_embed(memsearch *s, wordbank *b, int *words_done, herr *err) {
  while (b->done < b->rows) {
    int n = b->rows - b->done < WORD_BATCH ? b->rows - b->done : WORD_BATCH;
    int rc = s->emb.embed(s->emb.ctx, (const char *const *)b->texts + b->done, n,
                          b->vecs + (size_t)b->done * s->emb.dim, err);
    if (rc) return rc;
    b->done += n;
    if (words_done) *words_done += n;
  }
  return 0;
}

/* out = the normalised sum of text's words' vectors; false (out untouched) when it has none. */
static bool bank_mean(const wordbank *b, const char *text, size_t len, int dim, float *out) {
  const char *p = text, *end = text + len;
  char w[WORD_MAX + 1];
  size_t n;
  double *sum = calloc((size_t)dim, sizeof *sum);
  bool any = false;
  while (sum && (n = next_word(&p, end, w))) {
    int64_t row;
    if (!hdict_get(&b->index, w, n, &row) || row >= b->done) continue;
    const float *v = b->vecs + (size_t)row * dim;
    for (int d = 0; d < dim; d++) sum[d] += v[d];
    any = true;
  }
  double norm = 0;
  for (int d = 0; any && d < dim; d++) norm += sum[d] * sum[d];
  if (any && norm > 0) {
    double inv = 1 / sqrt(norm);
    for (int d = 0; d < dim; d++) out[d] = (float)(sum[d] * inv);
  }
  free(sum);
  return any && norm > 0;
}

/* Embeds the chunks of every pending article: as whole texts a batch at a
 * time, or (word pooling) through a bank of their words; a chunk without
 * words is embedded whole either way. */
static int embed_pending(memsearch *s, memsearch_stats *st, herr *err) {
  batch b = {.cap = s->emb.batch};
  b.texts = calloc((size_t)b.cap, sizeof *b.texts);
  b.dest = calloc((size_t)b.cap, sizeof *b.dest);
  b.out = malloc(sizeof(float) * (size_t)s->emb.dim * (size_t)b.cap);
  wordbank bank = {0};
  hdict_init(&bank.index);
  bool words = s->emb.pool == MEMSEARCH_POOL_WORDS;
  int rc = !b.texts || !b.dest || !b.out ? herr_set(err, HEARTH_ENOMEM, "out of memory") : 0;
  for (int i = 0; words && i < s->n && !rc; i++) { /* the words first, all embedded at once */
    ms_article *a = &s->arts[i];
    for (int c = 0; a->pending && c < a->nchunks && !rc; c++) {
      hbuf t = {0};
      chunk_text(a, &a->chunks[c], &t);
      if (t.oom || bank_add_text(&bank, t.data ? t.data : "", t.len, s->emb.dim))
        rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
      hbuf_free(&t);
    }
  }
  if (!rc && words) rc = bank_embed(s, &bank, &st->words_embedded, err);
  for (int i = 0; i < s->n && !rc; i++) {
    ms_article *a = &s->arts[i];
    for (int c = 0; a->pending && c < a->nchunks && !rc; c++) {
      hbuf t = {0};
      chunk_text(a, &a->chunks[c], &t);
      if (t.oom) {
        hbuf_free(&t);
        rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
        break;
      }
      float *dest = a->vecs + (size_t)c * s->emb.dim;
      if (words && bank_mean(&bank, t.data ? t.data : "", t.len, s->emb.dim, dest)) {
        hbuf_free(&t);
        st->chunks_embedded++;
        continue;
      }
      b.texts[b.n] = hbuf_take(&t);
      b.dest[b.n++] = dest;
      if (b.n == b.cap) rc = batch_flush(s, &b, &st->chunks_embedded, err);
    }
  }
  if (!rc) rc = batch_flush(s, &b, &st->chunks_embedded, err);
  for (int k = 0; b.texts && k < b.n; k++) free(b.texts[k]);
  free(b.texts);
  free(b.dest);
  free(b.out);
  bank_free(&bank);
  return rc;
}

/* The query's vector, pooled as the chunks' are. */
static int embed_query(memsearch *s, const char *query, float *q, herr *err) {
  if (s->emb.pool == MEMSEARCH_POOL_WORDS) {
    wordbank bank = {0};
    hdict_init(&bank.index);
    int rc = bank_add_text(&bank, query, strlen(query), s->emb.dim) ? herr_set(err, HEARTH_ENOMEM, "out of memory") : 0;
    if (!rc) rc = bank_embed(s, &bank, NULL, err);
    bool any = !rc && bank_mean(&bank, query, strlen(query), s->emb.dim, q);
    bank_free(&bank);
    if (rc || any) return rc;
  }
  const char *texts[1] = {query};
  return s->emb.embed(s->emb.ctx, texts, 1, q, err);
}

/* Reads article `name` into a (a new entry or one whose text is gone). */
static int article_read(memsearch *s, const char *name, ms_article *a, herr *err) {
  char *path = hpath_join(s->dir, name);
  if (!path) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  char *text = NULL;
  size_t len = 0;
  int rc = hfile_read(path, &text, &len, err);
  free(path);
  if (rc) return rc;
  if (len > UINT32_MAX / 2) {
    free(text);
    return herr_set(err, HEARTH_ELIMIT, "%s/%s: %zu bytes is too long an article", s->dir, name, len);
  }
  free(a->text);
  a->text = text;
  a->text_len = len;
  return 0;
}

static int update_locked(memsearch *s, memsearch_stats *st, herr *err) {
  memset(st, 0, sizeof *st);
  if (!s->loaded) {
    char why[512];
    int rc = index_read(s, why, sizeof why, err);
    if (rc) {
      articles_clear(s);
      return rc;
    }
    s->loaded = true;
    if (why[0]) {
      articles_clear(s);
      s->rebuild = true;
      if (strcmp(why, "no index yet")) HLOG_WARN("memory search: %s: rebuilding the index (%s)", s->dir, why);
    }
  }
  if (s->rebuild) st->rebuilt = true;
  char **names = NULL;
  int nnames = 0;
  int rc = list_articles(s->dir, &names, &nnames, err);
  if (rc) return rc;
  hdict by_slug;
  hdict_init(&by_slug);
  for (int i = 0; i < s->n; i++) {
    s->arts[i].seen = s->arts[i].pending = false;
    if (!rc && !hdict_put(&by_slug, s->arts[i].slug, strlen(s->arts[i].slug), i))
      rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  bool changed = s->rebuild;
  for (int i = 0; i < nnames && !rc; i++) {
    char slug[4096];
    snprintf(slug, sizeof slug, "%.*s", (int)strlen(names[i]) - 3, names[i]);
    ms_article tmp = {0}, *a = article_find(s, &by_slug, slug);
    if ((rc = article_read(s, names[i], &tmp, err))) {
      if (rc == HEARTH_EIO || rc == HEARTH_ENOTFOUND) { /* gone since the listing, or unreadable: left out */
        HLOG_WARN("memory search: %s", err->msg);
        herr_clear(err);
        rc = 0;
      }
      free(tmp.text);
      continue;
    }
    uint64_t h = memsearch_hash(tmp.text, tmp.text_len);
    if (a && a->hash == h) { /* unchanged: its vectors stay */
      free(a->text);
      a->text = tmp.text;
      a->text_len = tmp.text_len;
      a->seen = true;
      continue;
    }
    if (!a) {
      if (!ms_append(s, &a)) {
        free(tmp.text);
        rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
        break;
      }
      if (!(a->slug = strdup(slug))) {
        free(tmp.text);
        rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
        break;
      }
    }
    free(a->text);
    free(a->title);
    free(a->chunks);
    free(a->vecs);
    a->title = NULL, a->chunks = NULL, a->vecs = NULL;
    a->text = tmp.text;
    a->text_len = tmp.text_len;
    a->hash = h;
    a->seen = a->pending = true;
    size_t body = 0;
    if ((rc = front_matter(a->text, a->text_len, slug, &a->title, &body)) ||
        (rc = chunk_body(a->text, body, a->text_len, &a->chunks, &a->nchunks)) ||
        !(a->vecs = malloc(sizeof(float) * (size_t)s->emb.dim * (size_t)a->nchunks))) {
      rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
      break;
    }
    st->embedded++;
    changed = true;
  }
  for (int i = 0; i < nnames; i++) free(names[i]);
  free(names);
  hdict_free(&by_slug);
  if (rc) {
    /* half-made entries must not be trusted by a later update */
    for (int i = 0; i < s->n; i++)
      if (s->arts[i].pending) s->arts[i].hash = 0;
    return rc;
  }
  /* deleted articles */
  int w = 0;
  for (int i = 0; i < s->n; i++) {
    if (!s->arts[i].seen) {
      article_free(&s->arts[i]);
      st->removed++;
      changed = true;
      continue;
    }
    if (w != i) s->arts[w] = s->arts[i];
    w++;
  }
  s->n = w;
  if (s->n > 1) qsort(s->arts, (size_t)s->n, sizeof *s->arts, cmp_articles);
  if ((rc = embed_pending(s, st, err))) {
    for (int i = 0; i < s->n; i++)
      if (s->arts[i].pending) s->arts[i].hash = 0; /* embedded again next time */
    return herr_wrap(err, "memory search: embedding %s", s->dir);
  }
  for (int i = 0; i < s->n; i++) s->arts[i].pending = false;
  st->articles = s->n;
  if (changed || !hfile_exists(s->idx_path)) { /* a wiki that cannot take the index is still searched */
    herr werr = {0};
    if (index_write(s, &werr)) HLOG_WARN("memory search: the index is not kept: %s", werr.msg);
    else st->written = true;
  }
  s->rebuild = false;
  return 0;
}

int memsearch_update(memsearch *s, memsearch_stats *st, herr *err) {
  memsearch_stats local;
  pthread_mutex_lock(&s->mu);
  int rc = update_locked(s, st ? st : &local, err);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/* ---- ranking ---- */

typedef struct ranked {
  int art, chunk;
  float score;
  const char *slug;
} ranked;

static int cmp_ranked(const void *a, const void *b) {
  const ranked *x = a, *y = b;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  return strcmp(x->slug, y->slug);
}

/* The chunk's text with whitespace runs made one space, trimmed. */
static char *snippet_of(const ms_article *a, const ms_chunk *c) {
  hbuf b = {0};
  bool space = false;
  for (uint32_t i = 0; a->text && i < c->len && c->off + i < a->text_len; i++) {
    char ch = a->text[c->off + i];
    if (ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r') {
      space = b.len > 0;
      continue;
    }
    if (space) hbuf_putc(&b, ' ');
    space = false;
    hbuf_putc(&b, ch);
  }
  if (b.oom) {
    hbuf_free(&b);
    return NULL;
  }
  char *s = hbuf_take(&b);
  return s ? s : strdup("");
}

static int query_locked(memsearch *s, const char *query, int k, memsearch_hit **hits, int *n, herr *err) {
  int dim = s->emb.dim;
  float *q = malloc(sizeof(float) * (size_t)dim);
  ranked *r = calloc((size_t)(s->n ? s->n : 1), sizeof *r);
  if (!q || !r) {
    free(q), free(r);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  int rc = embed_query(s, query, q, err);
  if (rc) {
    free(q), free(r);
    return herr_wrap(err, "memory search: embedding the query");
  }
  for (int i = 0; i < s->n; i++) {
    const ms_article *a = &s->arts[i];
    r[i] = (ranked){i, 0, -INFINITY, a->slug};
    for (int c = 0; c < a->nchunks; c++) {
      const float *v = a->vecs + (size_t)c * dim;
      double dot = 0;
      for (int d = 0; d < dim; d++) dot += (double)q[d] * v[d];
      if ((float)dot > r[i].score) r[i].score = (float)dot, r[i].chunk = c;
    }
  }
  free(q);
  if (s->n > 1) qsort(r, (size_t)s->n, sizeof *r, cmp_ranked);
  int m = s->n < k ? s->n : k;
  memsearch_hit *h = calloc((size_t)(m ? m : 1), sizeof *h);
  if (!h) {
    free(r);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  for (int i = 0; i < m; i++) {
    const ms_article *a = &s->arts[r[i].art];
    h[i].slug = strdup(a->slug);
    h[i].title = strdup(a->title);
    h[i].snippet = snippet_of(a, &a->chunks[r[i].chunk]);
    h[i].score = r[i].score;
    if (!h[i].slug || !h[i].title || !h[i].snippet) {
      memsearch_hits_free(h, i + 1);
      free(r);
      return herr_set(err, HEARTH_ENOMEM, "out of memory");
    }
  }
  free(r);
  *hits = h;
  *n = m;
  return 0;
}

int memsearch_query(memsearch *s, const char *query, int k, memsearch_hit **hits, int *n, herr *err) {
  *hits = NULL;
  *n = 0;
  if (!query || !query[0]) return herr_set(err, HEARTH_EINVAL, "memory search: the query is empty");
  if (k < 1 || k > MEMSEARCH_MAX_K) return herr_set(err, HEARTH_EINVAL, "memory search: k must be 1 to %d, not %d", MEMSEARCH_MAX_K, k);
  pthread_mutex_lock(&s->mu);
  int rc = query_locked(s, query, k, hits, n, err);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

void memsearch_hits_free(memsearch_hit *hits, int n) {
  for (int i = 0; hits && i < n; i++) {
    free(hits[i].slug);
    free(hits[i].title);
    free(hits[i].snippet);
  }
  free(hits);
}

/* ---- the memory_search tool ---- */

const char memsearch_tool_description[] =
    "Search the long-term memory: a wiki of notes written from earlier conversations and documents. "
    "Returns the articles that best match the query, best first, each with its [[slug]], title and the "
    "passage that matched. Use it before answering about people, projects, decisions or facts that may "
    "have been recorded.";

const char memsearch_tool_parameters[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"query\":{\"type\":\"string\",\"description\":\"what to look for, in a few words\"},"
    "\"k\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":10,\"description\":\"how many articles (default 3)\"}},"
    "\"required\":[\"query\"]}";

char *memsearch_tool_json(void) {
  json_t *params = json_loads(memsearch_tool_parameters, 0, NULL);
  json_t *t = params ? json_pack("{s:s, s:{s:s, s:s, s:o}}", "type", "function", "function", "name", MEMSEARCH_TOOL_NAME,
                                 "description", memsearch_tool_description, "parameters", params)
                     : NULL;
  char *s = t ? json_dumps(t, JSON_COMPACT) : NULL;
  json_decref(t);
  return s;
}

int memsearch_tool_call(memsearch *s, const char *args_json, int max_bytes, char **result, herr *err) {
  *result = NULL;
  json_t *args = args_json ? json_loads(args_json, 0, NULL) : NULL;
  const char *query = json_string_value(json_object_get(args, "query"));
  json_t *kj = json_object_get(args, "k");
  int k = MEMSEARCH_TOOL_K;
  if (json_is_integer(kj) && json_integer_value(kj) >= 1) k = json_integer_value(kj) > 10 ? 10 : (int)json_integer_value(kj);
  if (!query || !query[0]) {
    json_decref(args);
    return herr_set(err, HEARTH_EINVAL, "memory_search: the arguments have no \"query\" string");
  }
  memsearch_hit *hits = NULL;
  int n = 0;
  int rc = memsearch_update(s, NULL, err);
  if (!rc) rc = memsearch_query(s, query, k, &hits, &n, err);
  if (rc) {
    json_decref(args);
    return rc;
  }
  hbuf b = {0};
  if (n == 0) hbuf_puts(&b, "The memory wiki has no articles yet.");
  else hbuf_printf(&b, "%d article%s of the memory wiki for \"%s\", best first:\n", n, n == 1 ? "" : "s", query);
  if (max_bytes <= 0) max_bytes = 4096;
  for (int i = 0; i < n; i++) {
    const char *snip = hits[i].snippet;
    size_t len = strlen(snip);
    hbuf_printf(&b, "\n[[%s]] %s (score %.3f)\n", hits[i].slug, hits[i].title, (double)hits[i].score);
    /* each hit's share of max_bytes, at least 80 bytes of snippet */
    long share = (long)max_bytes / n - (long)strlen(hits[i].slug) - (long)strlen(hits[i].title) - 24;
    size_t cap = share < 80 ? 80 : (size_t)share;
    if (len > cap) { /* cut, not inside a UTF-8 sequence */
      len = cap;
      while (len > 0 && ((unsigned char)snip[len] & 0xC0) == 0x80) len--;
      hbuf_append(&b, snip, len);
      hbuf_puts(&b, "…\n");
    } else {
      hbuf_printf(&b, "%s\n", snip);
    }
  }
  memsearch_hits_free(hits, n);
  json_decref(args);
  if (b.oom) {
    hbuf_free(&b);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  *result = hbuf_take(&b);
  return 0;
}
