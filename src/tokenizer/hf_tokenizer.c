/* hf_tokenizer.c — a Hugging Face tokenizer.json as one pipeline: added tokens
 * (split out first, as HF's AddedVocabulary does: non-normalized ones on the
 * raw text, normalized ones on the normalized text, honouring single_word /
 * lstrip / rstrip), normalizer, pre-tokenizer, model, post-processor
 * (TemplateProcessing, Roberta, Bert, ByteLevel, Sequence) and decoder.
 * tokenizer_config.json, when given, supplies BOS/EOS and add_bos_token /
 * add_eos_token (which, when present, replace the post-processor with
 * "[bos] $A [eos]" as transformers does). Knows nothing of GGUF. */
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/utf8.h"
#include "base/vec.h"
#include "tokenizer/hf_fastjson.h"
#include "tokenizer/hf_internal.h"

typedef struct added_tok {
  char *content; /* owned */
  size_t len;
  char *decoded; /* owned: the normalized content, which decoding uses (NULL = content) */
  size_t decoded_len;
  int32_t id;
  bool special, normalized, lstrip, rstrip, single_word;
} added_tok;

/* A byte trie over added-token contents; node 0 is the root. */
typedef struct trie {
  hf_u64map edges; /* node << 8 | byte -> child */
  int32_t *tok;    /* node -> added index, -1 (owned) */
  size_t nodes, cap;
  bool first[256];
  bool empty;
} trie;

enum { POST_TEMPLATE, POST_ROBERTA, POST_BERT, POST_BYTELEVEL, POST_SEQUENCE };

typedef struct post_item {
  bool is_seq;
  int32_t *ids; /* owned (special token ids) */
  size_t nids;
} post_item;

typedef struct post {
  int kind;
  post_item *items; /* template single (owned) */
  size_t nitems;
  int32_t cls, sep; /* Roberta / Bert */
  struct post **subs; /* Sequence (owned) */
  size_t nsubs;
} post;

struct hf_tokenizer {
  hf_normalizer *norm;
  hf_pretok *pre;
  hf_model *model;
  hf_decoder *dec;
  post *post;
  added_tok *added; /* owned */
  size_t nadded;
  hdict added_ids;  /* content -> id */
  hf_u64map id_added; /* id -> added index */
  trie raw, normed;
  int32_t bos, eos;
  int32_t vocab_size;
};

/* ---- trie ---- */
static bool trie_node(trie *t) {
  if (t->nodes == t->cap && !HGROW(t->tok, t->cap, t->nodes + 1)) return false;
  t->tok[t->nodes++] = -1;
  return true;
}

static bool trie_add(trie *t, const char *s, size_t n, int32_t index) {
  if (!t->nodes && !trie_node(t)) return false;
  if (n == 0) return true; /* an empty token never matches */
  uint64_t node = 0, child;
  for (size_t i = 0; i < n; i++) {
    uint64_t key = node << 8 | (unsigned char)s[i];
    if (!hf_u64map_get(&t->edges, key, &child)) {
      child = t->nodes;
      if (!trie_node(t) || !hf_u64map_put(&t->edges, key, child)) return false;
    }
    node = child;
  }
  if (t->tok[node] < 0) t->tok[node] = index; /* the first token with this content wins */
  t->first[(unsigned char)s[0]] = true;
  t->empty = false;
  return true;
}

static void trie_free(trie *t) {
  hf_u64map_free(&t->edges);
  free(t->tok);
  memset(t, 0, sizeof *t);
}

/* Longest token starting at s[pos]; returns its end or 0, and the added index. */
static size_t trie_longest(const trie *t, const char *s, size_t n, size_t pos, int32_t *index) {
  uint64_t node = 0, child;
  size_t best = 0;
  for (size_t i = pos; i < n; i++) {
    if (!hf_u64map_get(&t->edges, node << 8 | (unsigned char)s[i], &child)) break;
    node = child;
    if (t->tok[node] >= 0) {
      best = i + 1;
      *index = t->tok[node];
    }
  }
  return best;
}

static size_t prev_char_start(const char *s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
  return i;
}

static bool ends_with_word(const char *s, size_t end) {
  if (end == 0) return false;
  uint32_t c;
  size_t i = prev_char_start(s, end);
  return utf8_decode(s + i, end - i, &c) && hfu_is_word_char(c);
}

static bool starts_with_word(const char *s, size_t n) {
  uint32_t c;
  return n > 0 && utf8_decode(s, n, &c) && hfu_is_word_char(c);
}

/* Splits s[0..n) on the added tokens of trie t into out (HF's find_matches). */
/* Whether id is among the literal ids (tokens never read from the text). */
static bool is_literal(const int32_t *lit, size_t nlit, int32_t id) {
  for (size_t i = 0; i < nlit; i++)
    if (lit[i] == id) return true;
  return false;
}

static bool split_added(const hf_tokenizer *tk, const trie *t, bool parse_special, const int32_t *lit, size_t nlit,
                        const char *s, size_t n, bool at_start, hf_splits *out) {
  size_t start_off = 0;
  if (!t->empty) {
    for (size_t pos = 0; pos < n;) {
      int32_t idx = -1;
      size_t end = t->first[(unsigned char)s[pos]] ? trie_longest(t, s, n, pos, &idx) : 0;
      if (!end) {
        pos++;
        continue;
      }
      const added_tok *a = &tk->added[idx];
      size_t start = pos, stop = end;
      pos = end;
      if (!parse_special && (a->special || is_literal(lit, nlit, a->id))) continue;
      if (a->single_word) {
        bool start_space = start == 0 || !ends_with_word(s, start);
        bool stop_space = stop == n || !starts_with_word(s + stop, n - stop);
        if (!start_space || !stop_space) continue;
      }
      if (a->lstrip) {
        size_t ns = start;
        while (ns > 0) {
          uint32_t c;
          size_t i = prev_char_start(s, ns);
          if (!utf8_decode(s + i, ns - i, &c) || !hfu_is_whitespace(c)) break;
          ns = i;
        }
        start = ns > start_off ? ns : start_off;
      }
      if (a->rstrip) {
        while (stop < n) {
          uint32_t c;
          int l = utf8_decode(s + stop, n - stop, &c);
          if (!l || !hfu_is_whitespace(c)) break;
          stop += (size_t)l;
        }
      }
      if (start_off < start && !hf_splits_push(out, s + start_off, start - start_off, -1, at_start && start_off == 0))
        return false;
      if (!hf_splits_push(out, s + start, stop - start, a->id, false)) return false;
      start_off = stop;
    }
  }
  if (start_off < n && !hf_splits_push(out, s + start_off, n - start_off, -1, at_start && start_off == 0)) return false;
  return true;
}

/* ---- post-processors ---- */
static void post_free(post *p) {
  if (!p) return;
  for (size_t i = 0; i < p->nitems; i++) free(p->items[i].ids);
  free(p->items);
  for (size_t i = 0; i < p->nsubs; i++) post_free(p->subs[i]);
  free(p->subs);
  free(p);
}

static int token_pair_id(const json_t *j, const char *key, int32_t *id, const char *what, herr *err) {
  const json_t *v = json_object_get(j, key);
  if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(json_array_get(v, 1)))
    return herr_set(err, HEARTH_EFORMAT, "%s: post_processor field '%s' must be [token, id]", what, key);
  *id = (int32_t)json_integer_value(json_array_get(v, 1));
  return 0;
}

static int post_parse(const json_t *j, post **out, const char *what, herr *err) {
  *out = NULL;
  if (!j || json_is_null(j)) return 0;
  const char *type = json_string_value(json_object_get(j, "type"));
  if (!type) return herr_set(err, HEARTH_EFORMAT, "%s: post_processor has no 'type'", what);
  post *p = calloc(1, sizeof *p);
  if (!p) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  int rc = 0;
  if (!strcmp(type, "ByteLevel")) p->kind = POST_BYTELEVEL;
  else if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
    p->kind = type[0] == 'R' ? POST_ROBERTA : POST_BERT;
    if (!(rc = token_pair_id(j, "cls", &p->cls, what, err))) rc = token_pair_id(j, "sep", &p->sep, what, err);
  } else if (!strcmp(type, "TemplateProcessing")) {
    p->kind = POST_TEMPLATE;
    const json_t *single = json_object_get(j, "single"), *specials = json_object_get(j, "special_tokens");
    if (!json_is_array(single)) rc = herr_set(err, HEARTH_EFORMAT, "%s: TemplateProcessing needs an array 'single'", what);
    else p->items = calloc(json_array_size(single) + 1, sizeof *p->items);
    for (size_t i = 0; !rc && i < json_array_size(single); i++) {
      const json_t *it = json_array_get(single, i), *v;
      post_item *pi = &p->items[p->nitems];
      if ((v = json_object_get(it, "Sequence"))) {
        pi->is_seq = true;
      } else if ((v = json_object_get(it, "SpecialToken"))) {
        const char *name = json_string_value(json_object_get(v, "id"));
        const json_t *sp = name ? json_object_get(specials, name) : NULL;
        const json_t *ids = json_object_get(sp, "ids");
        if (!json_is_array(ids)) {
          rc = herr_set(err, HEARTH_EFORMAT, "%s: TemplateProcessing special token '%s' is not in special_tokens", what,
                        name ? name : "(no id)");
          break;
        }
        pi->ids = calloc(json_array_size(ids) + 1, sizeof *pi->ids);
        for (size_t k = 0; k < json_array_size(ids); k++) {
          const json_t *x = json_array_get(ids, k);
          if (!json_is_integer(x)) {
            rc = herr_set(err, HEARTH_EFORMAT, "%s: TemplateProcessing special token '%s' has a non-integer id", what, name);
            break;
          }
          pi->ids[pi->nids++] = (int32_t)json_integer_value(x);
        }
      } else {
        rc = herr_set(err, HEARTH_EFORMAT, "%s: TemplateProcessing item %zu is neither Sequence nor SpecialToken", what, i);
      }
      p->nitems++;
    }
  } else if (!strcmp(type, "Sequence")) {
    p->kind = POST_SEQUENCE;
    const json_t *subs = json_object_get(j, "processors");
    if (!json_is_array(subs)) rc = herr_set(err, HEARTH_EFORMAT, "%s: Sequence post_processor needs an array 'processors'", what);
    else p->subs = calloc(json_array_size(subs) + 1, sizeof *p->subs);
    for (size_t i = 0; !rc && i < json_array_size(subs); i++) {
      rc = post_parse(json_array_get(subs, i), &p->subs[p->nsubs], what, err);
      if (!rc && p->subs[p->nsubs]) p->nsubs++;
    }
  } else {
    rc = herr_set(err, HEARTH_EUNSUPPORTED, "%s: unsupported post_processor type '%s'", what, type);
  }
  if (rc) {
    post_free(p);
    return rc;
  }
  *out = p;
  return 0;
}

typedef struct idvec {
  int32_t *v;
  size_t n, cap;
} idvec;

static bool idvec_push(idvec *d, int32_t id) {
  if (d->n == d->cap && !HGROW(d->v, d->cap, d->n + 1)) return false;
  d->v[d->n++] = id;
  return true;
}

static bool post_apply(const post *p, idvec *ids) {
  if (p->kind == POST_BYTELEVEL) return true;
  if (p->kind == POST_SEQUENCE) {
    for (size_t i = 0; i < p->nsubs; i++)
      if (!post_apply(p->subs[i], ids)) return false;
    return true;
  }
  idvec out = {0};
  bool ok = true;
  if (p->kind == POST_TEMPLATE) {
    for (size_t i = 0; ok && i < p->nitems; i++) {
      if (p->items[i].is_seq)
        for (size_t k = 0; ok && k < ids->n; k++) ok = idvec_push(&out, ids->v[k]);
      else
        for (size_t k = 0; ok && k < p->items[i].nids; k++) ok = idvec_push(&out, p->items[i].ids[k]);
    }
  } else {
    ok = idvec_push(&out, p->cls);
    for (size_t k = 0; ok && k < ids->n; k++) ok = idvec_push(&out, ids->v[k]);
    ok = ok && idvec_push(&out, p->sep);
  }
  if (!ok) {
    free(out.v);
    return false;
  }
  free(ids->v);
  *ids = out;
  return true;
}

/* ---- loading ---- */
static const char *config_token(const json_t *cfg, const char *key) {
  const json_t *v = json_object_get(cfg, key);
  if (json_is_string(v)) return json_string_value(v);
  if (json_is_object(v)) return json_string_value(json_object_get(v, "content"));
  return NULL;
}

static int load_added(hf_tokenizer *t, const json_t *arr, const char *what, herr *err) {
  if (!arr || json_is_null(arr)) return 0;
  if (!json_is_array(arr)) return herr_set(err, HEARTH_EFORMAT, "%s: 'added_tokens' must be an array", what);
  size_t n = json_array_size(arr);
  t->added = calloc(n + 1, sizeof *t->added);
  if (!t->added) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  for (size_t i = 0; i < n; i++) {
    const json_t *a = json_array_get(arr, i), *c = json_object_get(a, "content"), *id = json_object_get(a, "id");
    if (!json_is_object(a) || !json_is_string(c))
      return herr_set(err, HEARTH_EFORMAT, "%s: added_tokens[%zu] needs a string 'content'", what, i);
    if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= (1 << 24))
      return herr_set(err, HEARTH_EFORMAT, "%s: added_tokens[%zu] ('%s') needs an integer 'id' in [0, 2^24)", what, i,
                      json_string_value(c));
    added_tok *x = &t->added[t->nadded++];
    x->len = json_string_length(c);
    x->content = malloc(x->len + 1);
    if (!x->content) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
    memcpy(x->content, json_string_value(c), x->len + 1);
    x->id = (int32_t)json_integer_value(id);
    x->special = json_is_true(json_object_get(a, "special"));
    x->normalized = !json_is_false(json_object_get(a, "normalized"));
    x->lstrip = json_is_true(json_object_get(a, "lstrip"));
    x->rstrip = json_is_true(json_object_get(a, "rstrip"));
    x->single_word = json_is_true(json_object_get(a, "single_word"));
    if (!hdict_put(&t->added_ids, x->content, x->len, x->id) ||
        !hf_u64map_put(&t->id_added, (uint64_t)x->id, (uint64_t)(t->nadded - 1)))
      return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
    if (x->id + 1 > t->vocab_size) t->vocab_size = x->id + 1;
  }
  /* HF adds special tokens before the others; the trie keeps the first of equal contents. */
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < t->nadded; i++) {
      added_tok *x = &t->added[i];
      if (x->special != (pass == 0)) continue;
      bool ok;
      if (x->normalized && t->norm) {
        hbuf nb = {0};
        int rc = hf_normalize(t->norm, x->content, x->len, &nb, err);
        if (rc) {
          hbuf_free(&nb);
          return herr_wrap(err, "%s: added token '%s'", what, x->content);
        }
        ok = trie_add(&t->normed, hbuf_str(&nb), nb.len, (int32_t)i);
        x->decoded_len = nb.len;
        x->decoded = hbuf_take(&nb);
        if (!x->decoded) ok = false;
      } else {
        ok = trie_add(x->normalized ? &t->normed : &t->raw, x->content, x->len, (int32_t)i);
      }
      if (!ok) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
    }
  }
  return 0;
}

static int32_t lookup_token(const hf_tokenizer *t, const char *s) {
  int64_t v;
  if (hdict_get(&t->added_ids, s, strlen(s), &v)) return (int32_t)v;
  return hf_model_token_to_id(t->model, s, strlen(s));
}

static int apply_config(hf_tokenizer *t, const char *cfg_json, size_t cfg_len, const char *what, herr *err) {
  if (!cfg_json) return 0;
  char cwhat[300];
  snprintf(cwhat, sizeof cwhat, "%s (tokenizer_config.json)", what);
  json_error_t je; /* reals for integers: configs hold values like 1e30 written as integers */
  json_t *cfg = json_loadb(cfg_json, cfg_len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &je);
  if (!cfg)
    return herr_set(err, HEARTH_EFORMAT, "%s: invalid JSON at line %d column %d: %s", cwhat, je.line, je.column, je.text);
  int rc = 0;
  if (!json_is_object(cfg)) {
    rc = herr_set(err, HEARTH_EFORMAT, "%s: must be a JSON object", cwhat);
    goto out;
  }
  const char *bos = config_token(cfg, "bos_token"), *eos = config_token(cfg, "eos_token");
  int32_t bos_id = bos ? lookup_token(t, bos) : -1, eos_id = eos ? lookup_token(t, eos) : -1;
  if (bos_id >= 0) t->bos = bos_id;
  if (eos_id >= 0) t->eos = eos_id;
  const json_t *ab = json_object_get(cfg, "add_bos_token"), *ae = json_object_get(cfg, "add_eos_token");
  if (json_is_boolean(ab) || json_is_boolean(ae)) {
    bool add_bos = json_is_true(ab) && bos_id >= 0, add_eos = json_is_true(ae) && eos_id >= 0;
    post *p = calloc(1, sizeof *p);
    if (!p || !(p->items = calloc(3, sizeof *p->items))) {
      free(p);
      rc = herr_set(err, HEARTH_ENOMEM, "%s: out of memory", cwhat);
      goto out;
    }
    p->kind = POST_TEMPLATE;
    if (add_bos) {
      p->items[p->nitems].ids = malloc(sizeof(int32_t));
      if (p->items[p->nitems].ids) p->items[p->nitems].ids[0] = bos_id, p->items[p->nitems].nids = 1;
      p->nitems++;
    }
    p->items[p->nitems++].is_seq = true;
    if (add_eos) {
      p->items[p->nitems].ids = malloc(sizeof(int32_t));
      if (p->items[p->nitems].ids) p->items[p->nitems].ids[0] = eos_id, p->items[p->nitems].nids = 1;
      p->nitems++;
    }
    post_free(t->post);
    t->post = p;
  }
out:
  json_decref(cfg);
  return rc;
}

static int32_t template_first_special(const post *p) {
  if (!p) return -1;
  if (p->kind == POST_TEMPLATE && p->nitems && !p->items[0].is_seq && p->items[0].nids) return p->items[0].ids[0];
  if (p->kind == POST_ROBERTA || p->kind == POST_BERT) return p->cls;
  for (size_t i = 0; i < p->nsubs; i++) {
    int32_t id = template_first_special(p->subs[i]);
    if (id >= 0) return id;
  }
  return -1;
}

int hf_tokenizer_load(const char *json, size_t len, const char *config_json, size_t config_len, const char *what,
                      hf_tokenizer **out, herr *err) {
  *out = NULL;
  /* The fast path: vocab and merges straight from the text, the rest through jansson. */
  hf_fast_ranges fr;
  json_t *root = NULL;
  bool fast = hf_fast_split(json, len, &fr) == 0;
  if (fast) {
    root = json_loadb(fr.rest, fr.rest_len, JSON_ALLOW_NUL, NULL);
    if (!root) fast = false; /* the plain parse below names the problem */
  }
  if (!fast) root = hjson_load_buf(json, len, what, err);
  if (!root) {
    free(fr.rest);
    return err ? err->code : HEARTH_EFORMAT;
  }
  hf_tokenizer *t = calloc(1, sizeof *t);
  int rc = 0;
  if (!t) {
    json_decref(root);
    free(fr.rest);
    return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  }
  hdict_init(&t->added_ids);
  t->bos = t->eos = -1;
  if (!json_is_object(root)) rc = herr_set(err, HEARTH_EFORMAT, "%s: tokenizer.json must be a JSON object", what);
  else if (!json_object_get(root, "model")) rc = herr_set(err, HEARTH_EFORMAT, "%s: missing 'model'", what);
  if (!rc) rc = hf_model_parse(json_object_get(root, "model"), fast ? &fr : NULL, &t->model, what, err);
  if (rc == HF_FAST_FALLBACK) { /* something the fast path does not read: start over on the plain path */
    herr_clear(err);
    json_decref(root);
    root = hjson_load_buf(json, len, what, err);
    if (!root) rc = err ? err->code : HEARTH_EFORMAT;
    else rc = hf_model_parse(json_object_get(root, "model"), NULL, &t->model, what, err);
  }
  free(fr.rest);
  fr.rest = NULL;
  if (!rc) rc = hf_normalizer_parse(json_object_get(root, "normalizer"), &t->norm, what, err);
  if (!rc) rc = hf_pretok_parse(json_object_get(root, "pre_tokenizer"), &t->pre, what, err);
  if (!rc) rc = hf_decoder_parse(json_object_get(root, "decoder"), &t->dec, what, err);
  if (!rc) rc = post_parse(json_object_get(root, "post_processor"), &t->post, what, err);
  if (!rc) {
    t->vocab_size = hf_model_vocab_size(t->model);
    rc = load_added(t, json_object_get(root, "added_tokens"), what, err);
  }
  json_decref(root);
  if (!rc) {
    t->bos = template_first_special(t->post);
    rc = apply_config(t, config_json, config_len, what, err);
  }
  if (rc) {
    hf_tokenizer_free(t);
    return rc;
  }
  *out = t;
  return 0;
}

void hf_tokenizer_free(hf_tokenizer *t) {
  if (!t) return;
  hf_normalizer_free(t->norm);
  hf_pretok_free(t->pre);
  hf_model_free(t->model);
  hf_decoder_free(t->dec);
  post_free(t->post);
  for (size_t i = 0; i < t->nadded; i++) free(t->added[i].content), free(t->added[i].decoded);
  free(t->added);
  hdict_free(&t->added_ids);
  hf_u64map_free(&t->id_added);
  trie_free(&t->raw);
  trie_free(&t->normed);
  free(t);
}

/* ---- encode ---- */
int hf_tokenizer_encode(const hf_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                        int32_t **ids_out, size_t *n_out, herr *err) {
  return hf_tokenizer_encode_ex(t, text, len, add_special, parse_special, NULL, 0, ids_out, n_out, err);
}

int hf_tokenizer_encode_ex(const hf_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                           const int32_t *lit, size_t nlit, int32_t **ids_out, size_t *n_out, herr *err) {
  *ids_out = NULL;
  *n_out = 0;
  for (size_t i = 0; i < len;) { /* text must be UTF-8 (HF takes a str) */
    uint32_t c;
    int l = utf8_decode(text + i, len - i, &c);
    if (!l) return herr_set(err, HEARTH_EINVAL, "tokenize: text is not valid UTF-8 at byte %zu", i);
    i += (size_t)l;
  }
  hf_splits raw = {0}, pieces = {0}, pre = {0};
  hbuf nb = {0};
  idvec ids = {0};
  int rc = 0;
  bool ok = split_added(t, &t->raw, parse_special, lit, nlit, text, len, true, &raw);
  for (size_t i = 0; ok && !rc && i < raw.n; i++) {
    const hf_split *sp = &raw.v[i];
    const char *s = hbuf_str(&raw.text) + sp->off;
    if (sp->id >= 0) {
      ok = hf_splits_push(&pieces, s, sp->len, sp->id, false);
      continue;
    }
    if (t->norm) {
      hbuf_clear(&nb);
      rc = hf_normalize(t->norm, s, sp->len, &nb, err);
      if (!rc) ok = split_added(t, &t->normed, parse_special, lit, nlit, hbuf_str(&nb), nb.len, sp->at_start, &pieces);
    } else {
      ok = split_added(t, &t->normed, parse_special, lit, nlit, s, sp->len, sp->at_start, &pieces);
    }
  }
  const hf_splits *words = &pieces;
  if (ok && !rc && t->pre) {
    rc = hf_pretokenize(t->pre, &pieces, &pre, err);
    words = &pre;
  }
  for (size_t i = 0; ok && !rc && i < words->n; i++) {
    const hf_split *sp = &words->v[i];
    if (sp->id >= 0) ok = idvec_push(&ids, sp->id);
    else rc = hf_model_tokenize(t->model, hbuf_str(&words->text) + sp->off, sp->len, &ids.v, &ids.n, &ids.cap, err);
  }
  if (ok && !rc && add_special && t->post) ok = post_apply(t->post, &ids);
  hf_splits_free(&raw);
  hf_splits_free(&pieces);
  hf_splits_free(&pre);
  hbuf_free(&nb);
  if (!rc && !ok) rc = herr_set(err, HEARTH_ENOMEM, "tokenize: out of memory");
  if (rc) {
    free(ids.v);
    return rc;
  }
  if (!ids.v) ids.v = malloc(sizeof(int32_t)); /* never NULL on success */
  if (!ids.v) return herr_set(err, HEARTH_ENOMEM, "tokenize: out of memory");
  *ids_out = ids.v;
  *n_out = ids.n;
  return 0;
}

/* ---- decode ---- */
static const added_tok *added_by_id(const hf_tokenizer *t, int32_t id) {
  uint64_t v;
  return id >= 0 && hf_u64map_get(&t->id_added, (uint64_t)id, &v) ? &t->added[v] : NULL;
}

static const char *token_str(const hf_tokenizer *t, int32_t id, size_t *len) {
  const added_tok *a = added_by_id(t, id);
  if (a) {
    *len = a->decoded ? a->decoded_len : a->len;
    return a->decoded ? a->decoded : a->content;
  }
  return hf_model_id_to_token(t->model, id, len);
}

static bool content_is_special(const hf_tokenizer *t, const char *s, size_t len) {
  int64_t v;
  if (!hdict_get(&t->added_ids, s, len, &v)) return false;
  const added_tok *a = added_by_id(t, (int32_t)v);
  return a && a->special;
}

int hf_tokenizer_decode(const hf_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, hbuf *out, herr *err) {
  hf_strlist toks = {0};
  bool ok = true;
  for (size_t i = 0; ok && i < n; i++) {
    size_t len;
    const char *s = token_str(t, ids[i], &len);
    if (!s) continue; /* unknown ids are dropped, as HF does */
    if (skip_special && content_is_special(t, s, len)) continue;
    ok = hf_strlist_push(&toks, s, len);
  }
  int rc = ok ? 0 : herr_set(err, HEARTH_ENOMEM, "detokenize: out of memory");
  if (!rc) {
    if (t->dec) rc = hf_decode_tokens(t->dec, &toks, out, err);
    else
      for (size_t i = 0; i < toks.n; i++) {
        if (i) hbuf_putc(out, ' ');
        hbuf_append(out, hbuf_str(&toks.data) + toks.off[i], toks.len[i]);
      }
  }
  hf_strlist_free(&toks);
  if (!rc && out->oom) rc = herr_set(err, HEARTH_ENOMEM, "detokenize: out of memory");
  return rc;
}

int hf_tokenizer_token_bytes(const hf_tokenizer *t, int32_t id, hbuf *out, herr *err) {
  size_t len;
  const char *s = token_str(t, id, &len);
  if (!s) return herr_set(err, HEARTH_EINVAL, "tokenizer: id %d is not in the vocabulary", id);
  if (added_by_id(t, id)) {
    hbuf_append(out, s, len);
    return 0;
  }
  if (t->dec) return hf_decode_token_raw(t->dec, s, len, out, err);
  hbuf_putc(out, ' ');
  hbuf_append(out, s, len);
  return 0;
}

int32_t hf_tokenizer_vocab_size(const hf_tokenizer *t) { return t->vocab_size; }

const char *hf_tokenizer_id_to_token(const hf_tokenizer *t, int32_t id) {
  size_t len;
  return token_str(t, id, &len);
}

int32_t hf_tokenizer_token_to_id(const hf_tokenizer *t, const char *tok) { return lookup_token(t, tok); }

bool hf_tokenizer_is_special(const hf_tokenizer *t, int32_t id) {
  const added_tok *a = added_by_id(t, id);
  return a && a->special;
}

int32_t hf_tokenizer_bos(const hf_tokenizer *t) { return t->bos; }
int32_t hf_tokenizer_eos(const hf_tokenizer *t) { return t->eos; }
