/* data.c — training examples from JSONL (train.h): chat lines rendered
 * through the model's template with the loss on the assistant turns, and
 * prompt / completion lines. Knows nothing of the model's numbers. */
#include <jansson.h>
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

static int from_messages(const json_t *msgs, const char *what, const tokenizer *tok, const chat_template *tm, ex_build *b,
                         herr *err) {
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
    if (strcmp(role, "assistant") != 0) continue;
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
    rc = from_messages(msgs, what, tok, tmpl, &b, err);
  } else if (p || c) {
    if (!json_is_string(p) || !json_is_string(c))
      return herr_set(err, HEARTH_EINVAL, "%s: \"prompt\" and \"completion\" must both be strings", what);
    int32_t eos = tokenizer_eos_id(tok);
    rc = ex_text(&b, tok, json_string_value(p), json_string_length(p), true, false, err);
    if (!rc) rc = ex_text(&b, tok, json_string_value(c), json_string_length(c), false, true, err);
    if (!rc && eos >= 0) rc = ex_push(&b, &eos, 1, true, err);
  } else {
    return herr_set(err, HEARTH_EINVAL, "%s: a line needs \"messages\", or \"prompt\" and \"completion\"", what);
  }
  if (!rc && b.n > seq_len) b.n = seq_len;
  int64_t counted = 0;
  for (int64_t i = 1; !rc && i < b.n; i++) counted += b.loss[i];
  if (!rc && !counted)
    rc = herr_set(err, HEARTH_EINVAL, "%s: no token to learn (empty answer, or cut away by --seq-len %lld)", what, (long long)seq_len);
  if (rc) {
    free(b.ids), free(b.loss);
    return rc;
  }
  b.loss[0] = 0; /* the first token is never predicted */
  out->ids = b.ids, out->loss = b.loss, out->n = b.n;
  return 0;
}

int train_data_load(const char *path, const tokenizer *tok, const chat_template *tmpl, int64_t seq_len, train_set *set,
                    herr *err) {
  if (!tok) return herr_set(err, HEARTH_EINVAL, "%s: the model has no tokenizer to read text with", path);
  char *text = NULL;
  size_t len = 0;
  int rc = hfile_read(path, &text, &len, err);
  if (rc) return rc;
  int64_t line = 0, before = set->n;
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
      if (set->n == set->cap) {
        int64_t cap = set->cap ? set->cap * 2 : 64;
        train_example *ne = realloc(set->ex, (size_t)cap * sizeof *ne);
        if (!ne) {
          json_decref(o);
          rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
          break;
        }
        set->ex = ne, set->cap = cap;
      }
      rc = train_example_from_json(o, what, tok, tmpl, seq_len, &set->ex[set->n], err);
      json_decref(o);
      if (!rc) {
        train_example *x = &set->ex[set->n++];
        set->tokens += x->n;
        for (int64_t i = 0; i < x->n; i++) set->loss_tokens += x->loss[i];
      }
    }
    s = e ? e + 1 : text + len;
  }
  free(text);
  if (!rc && set->n == before) rc = herr_set(err, HEARTH_EINVAL, "%s: no examples", path);
  return rc;
}

void train_set_free(train_set *set) {
  for (int64_t i = 0; set && i < set->n; i++) free(set->ex[i].ids), free(set->ex[i].loss);
  if (set) free(set->ex);
  if (set) memset(set, 0, sizeof *set);
}
