/* data.c — training examples from JSONL (train.h): chat lines rendered
 * through the model's template with the loss on the assistant turns,
 * prompt / completion lines, preference pairs (prompt, chosen, rejected) as
 * two examples that share the prompt, and short examples packed into
 * sequences (best-fit decreasing). Knows nothing of the model's numbers. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "train/train.h"

/* Renders messages[0..n) (a new array of borrowed items) into out. */
static int render_prefix(const chat_template *tm, const json_t *msgs, size_t n, bool gen, hbuf *out, herr *err) {
  json_t *part = json_array();
  if (!part) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (size_t i = 0; i < n; i++) json_array_append(part, json_array_get(msgs, i));
  hbuf_clear(out);
  int rc = chat_render(tm->source, part, NULL, gen, NULL, tm->bos, tm->eos, out, err);
  json_decref(part);
  if (!rc && out->oom) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
  return rc;
}

typedef struct ex_build {
  int32_t *ids;
  uint8_t *loss;
  int64_t n, cap;
} ex_build;

static int ex_push(ex_build *b, const int32_t *ids, size_t n, bool loss, herr *err) {
  if (!n) return 0;
  if (b->n + (int64_t)n > b->cap) {
    int64_t cap = (b->cap + (int64_t)n) * 2;
    int32_t *ni = realloc(b->ids, (size_t)cap * sizeof *ni);
    if (ni) b->ids = ni;
    uint8_t *nl = realloc(b->loss, (size_t)cap);
    if (nl) b->loss = nl;
    if (!ni || !nl) return herr_set(err, HEARTH_ENOMEM, "out of memory");
    b->cap = cap;
  }
  memcpy(b->ids + b->n, ids, n * sizeof *ids);
  memset(b->loss + b->n, loss ? 1 : 0, n);
  b->n += (int64_t)n;
  return 0;
}

static int ex_text(ex_build *b, const tokenizer *tok, const char *s, size_t len, bool add_special, bool loss, herr *err) {
  if (!len && !add_special) return 0;
  int32_t *ids = NULL;
  size_t n = 0;
  int rc = tokenizer_encode(tok, s, len, add_special, true, &ids, &n, err);
  if (!rc) rc = ex_push(b, ids, n, loss, err);
  free(ids);
  return rc;
}

/* The assistant turns at index learn_from and after are learned; earlier ones are context. */
static int from_messages(const json_t *msgs, size_t learn_from, const char *what, const tokenizer *tok, const chat_template *tm,
                         ex_build *b, herr *err) {
  if (!tm) return herr_set(err, HEARTH_EINVAL, "%s: \"messages\" needs a chat template and the model has none", what);
  size_t n = json_array_size(msgs);
  if (!n) return herr_set(err, HEARTH_EINVAL, "%s: \"messages\" is empty", what);
  for (size_t i = 0; i < n; i++) {
    const json_t *m = json_array_get(msgs, i);
    if (!json_is_object(m) || !json_is_string(json_object_get(m, "role")))
      return herr_set(err, HEARTH_EINVAL, "%s: message %zu has no \"role\" string", what, i);
  }
  hbuf whole = {0}, pre = {0}, full = {0};
  int rc = render_prefix(tm, msgs, n, false, &whole, err);
  size_t at = 0; /* rendered text already tokenized */
  bool any = false;
  for (size_t i = 0; i < n && !rc; i++) {
    const char *role = json_string_value(json_object_get(json_array_get(msgs, i), "role"));
    if (strcmp(role, "assistant") != 0 || i < learn_from) continue;
    if ((rc = render_prefix(tm, msgs, i, true, &pre, err)) || (rc = render_prefix(tm, msgs, i + 1, false, &full, err))) break;
    if (full.len < pre.len || memcmp(full.data, pre.data, pre.len) != 0 || whole.len < full.len ||
        memcmp(whole.data, full.data, full.len) != 0 || pre.len < at) {
      rc = herr_set(err, HEARTH_EINVAL,
                    "%s: the chat template does not render assistant message %zu as an extension of the conversation "
                    "before it (the assistant's tokens cannot be found)", what, i);
      break;
    }
    if ((rc = ex_text(b, tok, whole.data + at, pre.len - at, false, false, err)) ||
        (rc = ex_text(b, tok, whole.data + pre.len, full.len - pre.len, false, true, err)))
      break;
    at = full.len;
    any = true;
  }
  if (!rc && !any) rc = herr_set(err, HEARTH_EINVAL, "%s: no assistant message to learn", what);
  if (!rc) rc = ex_text(b, tok, whole.data + at, whole.len - at, false, false, err);
  hbuf_free(&whole), hbuf_free(&pre), hbuf_free(&full);
  return rc;
}

/* b cut to seq_len, checked to learn something, into out (b's arrays move there or are freed). */
static int finish(ex_build *b, const char *what, int64_t seq_len, train_example *out, herr *err) {
  if (b->n > seq_len) b->n = seq_len;
  int64_t counted = 0;
  for (int64_t i = 1; i < b->n; i++) counted += b->loss[i];
  if (!counted) {
    free(b->ids), free(b->loss);
    return herr_set(err, HEARTH_EINVAL, "%s: no token to learn (empty answer, or cut away by --seq-len %lld)", what, (long long)seq_len);
  }
  b->loss[0] = 0; /* the first token is never predicted */
  out->ids = b->ids, out->loss = b->loss, out->n = b->n;
  return 0;
}

/* A plain prompt and completion: the prompt with the tokenizer's special tokens (BOS), the completion and EOS learned. */
static int from_text(const json_t *p, const json_t *c, const tokenizer *tok, ex_build *b, herr *err) {
  int32_t eos = tokenizer_eos_id(tok);
  int rc = ex_text(b, tok, json_string_value(p), json_string_length(p), true, false, err);
  if (!rc) rc = ex_text(b, tok, json_string_value(c), json_string_length(c), false, true, err);
  if (!rc && eos >= 0) rc = ex_push(b, &eos, 1, true, err);
  return rc;
}

int train_example_from_json(const void *json_obj, const char *what, const tokenizer *tok, const chat_template *tmpl,
                            int64_t seq_len, train_example *out, herr *err) {
  const json_t *o = json_obj;
  memset(out, 0, sizeof *out);
  if (!json_is_object(o)) return herr_set(err, HEARTH_EINVAL, "%s: not a JSON object", what);
  ex_build b = {0};
  const json_t *msgs = json_object_get(o, "messages"), *p = json_object_get(o, "prompt"), *c = json_object_get(o, "completion");
  int rc;
  if (msgs) {
    if (!json_is_array(msgs)) return herr_set(err, HEARTH_EINVAL, "%s: \"messages\" is not an array", what);
    rc = from_messages(msgs, 0, what, tok, tmpl, &b, err);
  } else if (p || c) {
    if (!json_is_string(p) || !json_is_string(c))
      return herr_set(err, HEARTH_EINVAL, "%s: \"prompt\" and \"completion\" must both be strings", what);
    rc = from_text(p, c, tok, &b, err);
  } else {
    return herr_set(err, HEARTH_EINVAL, "%s: a line needs \"messages\", or \"prompt\" and \"completion\"", what);
  }
  if (rc) {
    free(b.ids), free(b.loss);
    return rc;
  }
  return finish(&b, what, seq_len, out, err);
}

/* One side of a pair: prompt (a string, or messages) followed by completion (a string, or assistant messages). */
static int pair_side(const json_t *prompt, const json_t *completion, const char *key, const char *what, const tokenizer *tok,
                     const chat_template *tmpl, int64_t seq_len, train_example *out, herr *err) {
  ex_build b = {0};
  int rc;
  if (json_is_string(prompt)) {
    if (!json_is_string(completion))
      return herr_set(err, HEARTH_EINVAL, "%s: with a string \"prompt\", \"%s\" must be a string", what, key);
    rc = from_text(prompt, completion, tok, &b, err);
  } else {
    json_t *msgs = json_array();
    if (!msgs) return herr_set(err, HEARTH_ENOMEM, "out of memory");
    for (size_t i = 0; i < json_array_size(prompt); i++) json_array_append(msgs, json_array_get(prompt, i));
    if (json_is_string(completion)) {
      json_t *m = json_pack("{s:s,s:O}", "role", "assistant", "content", completion);
      if (m) json_array_append_new(msgs, m);
    } else if (json_is_array(completion) && json_array_size(completion)) {
      for (size_t i = 0; i < json_array_size(completion); i++) json_array_append(msgs, json_array_get(completion, i));
    } else {
      json_decref(msgs);
      return herr_set(err, HEARTH_EINVAL, "%s: \"%s\" must be a string or a non-empty array of assistant messages", what, key);
    }
    char where[600];
    snprintf(where, sizeof where, "%s (%s)", what, key);
    rc = from_messages(msgs, json_array_size(prompt), where, tok, tmpl, &b, err);
    json_decref(msgs);
  }
  if (rc) {
    free(b.ids), free(b.loss);
    return rc;
  }
  char side[600];
  snprintf(side, sizeof side, "%s: \"%s\"", what, key);
  return finish(&b, side, seq_len, out, err);
}

int train_pair_from_json(const void *json_obj, const char *what, const tokenizer *tok, const chat_template *tmpl,
                         int64_t seq_len, train_pair *out, herr *err) {
  const json_t *o = json_obj;
  memset(out, 0, sizeof *out);
  out->ref_chosen = out->ref_rejected = NAN;
  if (!json_is_object(o)) return herr_set(err, HEARTH_EINVAL, "%s: not a JSON object", what);
  const json_t *p = json_object_get(o, "prompt"), *c = json_object_get(o, "chosen"), *r = json_object_get(o, "rejected");
  if (!p || !c || !r)
    return herr_set(err, HEARTH_EINVAL, "%s: a preference line needs \"prompt\", \"chosen\" and \"rejected\"", what);
  if (!json_is_string(p) && !json_is_array(p))
    return herr_set(err, HEARTH_EINVAL, "%s: \"prompt\" must be a string or an array of messages", what);
  int rc = pair_side(p, c, "chosen", what, tok, tmpl, seq_len, &out->chosen, err);
  if (!rc && (rc = pair_side(p, r, "rejected", what, tok, tmpl, seq_len, &out->rejected, err))) {
    free(out->chosen.ids), free(out->chosen.loss);
    memset(&out->chosen, 0, sizeof out->chosen);
  }
  return rc;
}

/* ---- packing ---- */

/* The room left in the open sequences: a max-tree over room values 0..S, leaf r holding r while some sequence
 * has exactly r left (TRL's segment tree), each value's sequences in a first-in first-out queue. */
typedef struct room_tree {
  int64_t *mx; /* [2 · size] */
  int64_t size;
} room_tree;

static void room_set(room_tree *rt, int64_t r, int64_t v) {
  int64_t i = rt->size + r;
  rt->mx[i] = v;
  for (i /= 2; i >= 1; i /= 2) rt->mx[i] = rt->mx[2 * i] > rt->mx[2 * i + 1] ? rt->mx[2 * i] : rt->mx[2 * i + 1];
}

/* The least room >= need that some sequence has, or -1. */
static int64_t room_search(const room_tree *rt, int64_t need) {
  if (rt->mx[1] < need) return -1;
  int64_t i = 1;
  while (i < rt->size) i = rt->mx[2 * i] >= need ? 2 * i : 2 * i + 1;
  return i - rt->size;
}

typedef struct pack_bin {
  int64_t len, first, last; /* tokens; its examples as a list through pack_next (indices into in) */
  int64_t next_same;        /* the next sequence with the same room (-1: none) */
} pack_bin;

/* Example i goes before j: longer, or as long and earlier. */
static bool before(const train_set *in, int64_t i, int64_t j) {
  return in->ex[i].n != in->ex[j].n ? in->ex[i].n > in->ex[j].n : i < j;
}

/* qsort_r is not C17: a merge sort of indices. */
static void sort_idx(int64_t *a, int64_t *tmp, int64_t n, const train_set *in) {
  if (n < 2) return;
  int64_t h = n / 2;
  sort_idx(a, tmp, h, in), sort_idx(a + h, tmp, n - h, in);
  int64_t i = 0, j = h, k = 0;
  while (i < h && j < n) tmp[k++] = before(in, a[j], a[i]) ? a[j++] : a[i++];
  while (i < h) tmp[k++] = a[i++];
  while (j < n) tmp[k++] = a[j++];
  memcpy(a, tmp, (size_t)n * sizeof *a);
}

int train_pack(const train_set *in, int64_t seq_len, train_set *out, herr *err) {
  memset(out, 0, sizeof *out);
  if (seq_len < 1) return herr_set(err, HEARTH_EINVAL, "packing: --seq-len must be positive");
  int64_t n = in->n, size = 1, nb = 0;
  while (size <= seq_len) size *= 2;
  int64_t *order = malloc((size_t)(n ? n : 1) * sizeof *order), *tmp = malloc((size_t)(n ? n : 1) * sizeof *tmp);
  int64_t *next = malloc((size_t)(n ? n : 1) * sizeof *next);
  int64_t *head = malloc((size_t)(seq_len + 1) * sizeof *head), *tail = malloc((size_t)(seq_len + 1) * sizeof *tail);
  pack_bin *bins = malloc((size_t)(n ? n : 1) * sizeof *bins);
  room_tree rt = {calloc((size_t)(2 * size), sizeof(int64_t)), size};
  int rc = 0;
  if (!order || !tmp || !next || !head || !tail || !bins || !rt.mx) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto done;
  }
  for (int64_t i = 0; i < n; i++) order[i] = i;
  sort_idx(order, tmp, n, in);
  for (int64_t r = 0; r <= seq_len; r++) head[r] = tail[r] = -1;
  for (int64_t k = 0; k < n; k++) {
    int64_t e = order[k], len = in->ex[e].n < seq_len ? in->ex[e].n : seq_len;
    int64_t room = room_search(&rt, len), b;
    if (room >= 0) { /* the first sequence with exactly that room */
      b = head[room];
      head[room] = bins[b].next_same;
      if (head[room] < 0) tail[room] = -1, room_set(&rt, room, 0);
      bins[b].len += len;
      next[bins[b].last] = e, bins[b].last = e;
    } else {
      b = nb++;
      bins[b] = (pack_bin){len, e, e, -1};
    }
    next[e] = -1;
    int64_t left = seq_len - bins[b].len;
    bins[b].next_same = -1;
    if (tail[left] >= 0) bins[tail[left]].next_same = b;
    else head[left] = b;
    tail[left] = b;
    if (left > 0) room_set(&rt, left, left);
  }
  out->ex = calloc((size_t)(nb ? nb : 1), sizeof *out->ex);
  if (!out->ex) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto done;
  }
  out->cap = nb;
  for (int64_t b = 0; b < nb; b++) {
    train_example *x = &out->ex[out->n];
    x->ids = malloc((size_t)bins[b].len * sizeof *x->ids);
    x->loss = malloc((size_t)bins[b].len);
    x->pos = malloc((size_t)bins[b].len * sizeof *x->pos);
    if (!x->ids || !x->loss || !x->pos) {
      free(x->ids), free(x->loss), free(x->pos);
      rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
      goto done;
    }
    out->n++;
    for (int64_t e = bins[b].first; e >= 0; e = next[e]) {
      const train_example *y = &in->ex[e];
      int64_t len = y->n < seq_len ? y->n : seq_len;
      memcpy(x->ids + x->n, y->ids, (size_t)len * sizeof *x->ids);
      memcpy(x->loss + x->n, y->loss, (size_t)len);
      x->loss[x->n] = 0; /* an example's first token is never predicted */
      for (int64_t i = 0; i < len; i++) x->pos[x->n + i] = (int32_t)i;
      x->n += len;
    }
    out->tokens += x->n;
    for (int64_t i = 0; i < x->n; i++) out->loss_tokens += x->loss[i];
  }
done:
  if (rc) train_set_free(out);
  free(order), free(tmp), free(next), free(head), free(tail), free(bins), free(rt.mx);
  return rc;
}

/* Calls fn on every non-blank line of a JSONL file, parsed; errors name the file and line. */
typedef int (*line_fn)(void *ctx, const json_t *o, const char *what, herr *err);

static int each_line(const char *path, line_fn fn, void *ctx, herr *err) {
  char *text = NULL;
  size_t len = 0;
  int rc = hfile_read(path, &text, &len, err);
  if (rc) return rc;
  int64_t line = 0;
  char *s = text;
  while (!rc && s < text + len) {
    char *e = memchr(s, '\n', (size_t)(text + len - s));
    size_t n = e ? (size_t)(e - s) : (size_t)(text + len - s);
    line++;
    size_t k = 0;
    while (k < n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r')) k++;
    if (k < n) {
      char what[512];
      snprintf(what, sizeof what, "%s:%lld", path, (long long)line);
      json_error_t je;
      json_t *o = json_loadb(s, n, 0, &je);
      if (!o) {
        rc = herr_set(err, HEARTH_EFORMAT, "%s: not JSON: %s", what, je.text);
        break;
      }
      rc = fn(ctx, o, what, err);
      json_decref(o);
    }
    s = e ? e + 1 : text + len;
  }
  free(text);
  return rc;
}

typedef struct load_ctx {
  const tokenizer *tok;
  const chat_template *tmpl;
  int64_t seq_len;
  void *set;
} load_ctx;

static int example_line(void *ctx, const json_t *o, const char *what, herr *err) {
  load_ctx *c = ctx;
  train_set *set = c->set;
  if (set->n == set->cap) {
    int64_t cap = set->cap ? set->cap * 2 : 64;
    train_example *ne = realloc(set->ex, (size_t)cap * sizeof *ne);
    if (!ne) return herr_set(err, HEARTH_ENOMEM, "out of memory");
    set->ex = ne, set->cap = cap;
  }
  int rc = train_example_from_json(o, what, c->tok, c->tmpl, c->seq_len, &set->ex[set->n], err);
  if (rc) return rc;
  train_example *x = &set->ex[set->n++];
  set->tokens += x->n;
  for (int64_t i = 0; i < x->n; i++) set->loss_tokens += x->loss[i];
  return 0;
}

static int pair_line(void *ctx, const json_t *o, const char *what, herr *err) {
  load_ctx *c = ctx;
  train_pairs *set = c->set;
  if (set->n == set->cap) {
    int64_t cap = set->cap ? set->cap * 2 : 64;
    train_pair *np = realloc(set->p, (size_t)cap * sizeof *np);
    if (!np) return herr_set(err, HEARTH_ENOMEM, "out of memory");
    set->p = np, set->cap = cap;
  }
  int rc = train_pair_from_json(o, what, c->tok, c->tmpl, c->seq_len, &set->p[set->n], err);
  if (rc) return rc;
  train_pair *x = &set->p[set->n++];
  set->tokens += x->chosen.n + x->rejected.n;
  for (int64_t i = 0; i < x->chosen.n; i++) set->chosen_tokens += x->chosen.loss[i];
  return 0;
}

int train_pairs_load(const char *path, const tokenizer *tok, const chat_template *tmpl, int64_t seq_len, train_pairs *set,
                     herr *err) {
  if (!tok) return herr_set(err, HEARTH_EINVAL, "%s: the model has no tokenizer to read text with", path);
  int64_t before = set->n;
  load_ctx c = {tok, tmpl, seq_len, set};
  int rc = each_line(path, pair_line, &c, err);
  if (!rc && set->n == before) rc = herr_set(err, HEARTH_EINVAL, "%s: no examples", path);
  return rc;
}

void train_pairs_free(train_pairs *set) {
  for (int64_t i = 0; set && i < set->n; i++) {
    free(set->p[i].chosen.ids), free(set->p[i].chosen.loss);
    free(set->p[i].rejected.ids), free(set->p[i].rejected.loss);
  }
  if (set) free(set->p);
  if (set) memset(set, 0, sizeof *set);
}

int train_data_load(const char *path, const tokenizer *tok, const chat_template *tmpl, int64_t seq_len, train_set *set,
                    herr *err) {
  if (!tok) return herr_set(err, HEARTH_EINVAL, "%s: the model has no tokenizer to read text with", path);
  int64_t before = set->n;
  load_ctx c = {tok, tmpl, seq_len, set};
  int rc = each_line(path, example_line, &c, err);
  if (!rc && set->n == before) rc = herr_set(err, HEARTH_EINVAL, "%s: no examples", path);
  return rc;
}

void train_set_free(train_set *set) {
  for (int64_t i = 0; set && i < set->n; i++) free(set->ex[i].ids), free(set->ex[i].loss), free(set->ex[i].pos);
  if (set) free(set->ex);
  if (set) memset(set, 0, sizeof *set);
}
