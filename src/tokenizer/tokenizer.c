/* tokenizer.c — the public tokenizer: opens a model folder, a tokenizer.json
 * or a .gguf, and dispatches every call to the HF pipeline (hf_tokenizer.c) or
 * the GGUF vocabulary (gguf_vocab.c). Also owns streaming detokenization,
 * which works the same for both: it decodes a short window of recent ids and
 * emits only text that later ids can no longer change. */
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/utf8.h"
#include "base/vec.h"
#include "format/gguf.h"
#include "tokenizer/gguf_vocab.h"
#include "tokenizer/hf_internal.h"
#include "tokenizer/tokenizer.h"

struct tokenizer {
  hf_tokenizer *hf;  /* owned; or */
  gguf_vocab *gv;    /* owned, with */
  gguf_file *gf;     /* owned: the file gv was read from */
};

static bool has_suffix(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

static bool is_gguf_file(const char *path) {
  if (has_suffix(path, ".gguf")) return true;
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  char magic[4] = {0};
  size_t n = fread(magic, 1, 4, f);
  fclose(f);
  return n == 4 && memcmp(magic, "GGUF", 4) == 0;
}

static int load_gguf(const char *path, tokenizer **out, herr *err) {
  tokenizer *t = calloc(1, sizeof *t);
  if (!t) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", path);
  int rc = gguf_open(&t->gf, path, err);
  if (!rc) rc = gguf_vocab_load(t->gf, path, &t->gv, err);
  if (rc) {
    tokenizer_free(t);
    return rc;
  }
  *out = t;
  return 0;
}

int tokenizer_load(const char *path, tokenizer **out, herr *err) {
  *out = NULL;
  if (!path) return herr_set(err, HEARTH_EINVAL, "tokenizer: no path given");
  char *json_path = NULL, *dir = NULL;
  if (hfile_is_dir(path)) {
    json_path = hpath_join(path, "tokenizer.json");
    dir = strdup(path);
    if (json_path && !hfile_exists(json_path)) {
      int rc = herr_set(err, HEARTH_ENOTFOUND, "%s: no tokenizer.json in this folder", path);
      free(json_path);
      free(dir);
      return rc;
    }
  } else {
    if (!hfile_exists(path)) return herr_set(err, HEARTH_ENOTFOUND, "%s: no such file", path);
    if (is_gguf_file(path)) return load_gguf(path, out, err);
    json_path = strdup(path);
    dir = hpath_dir(path);
  }
  if (!json_path || !dir) {
    free(json_path);
    free(dir);
    return herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
  }
  hmmap m = {0};
  int rc = hmmap_open(&m, json_path, err);
  char *cfg = NULL;
  size_t cfg_len = 0;
  if (!rc) {
    char *cfg_path = hpath_join(dir, "tokenizer_config.json");
    if (cfg_path && hfile_exists(cfg_path)) rc = hfile_read(cfg_path, &cfg, &cfg_len, err);
    free(cfg_path);
  }
  if (!rc) rc = tokenizer_load_json((const char *)m.data, m.size, cfg, cfg_len, json_path, out, err);
  hmmap_close(&m);
  free(cfg);
  free(json_path);
  free(dir);
  return rc;
}

int tokenizer_load_json(const char *json, size_t len, const char *config_json, size_t config_len, const char *what,
                        tokenizer **out, herr *err) {
  *out = NULL;
  tokenizer *t = calloc(1, sizeof *t);
  if (!t) return herr_set(err, HEARTH_ENOMEM, "%s: out of memory", what);
  int rc = hf_tokenizer_load(json ? json : "", json ? len : 0, config_json, config_len, what ? what : "tokenizer.json",
                             &t->hf, err);
  if (rc) {
    free(t);
    return rc;
  }
  *out = t;
  return 0;
}

void tokenizer_free(tokenizer *t) {
  if (!t) return;
  hf_tokenizer_free(t->hf);
  if (t->gv) gguf_vocab_free(t->gv);
  if (t->gf) gguf_close(t->gf);
  free(t);
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                     int32_t **ids, size_t *n, herr *err) {
  return tokenizer_encode_ex(t, text, len, add_special, parse_special, NULL, 0, ids, n, err);
}

int tokenizer_encode_ex(const tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                        const int32_t *literal, size_t n_literal, int32_t **ids, size_t *n, herr *err) {
  if (!text && len) return herr_set(err, HEARTH_EINVAL, "tokenize: no text");
  if (!text) text = "";
  if (t->hf) return hf_tokenizer_encode_ex(t->hf, text, len, add_special, parse_special, literal, n_literal, ids, n, err);
  return gguf_vocab_encode_ex(t->gv, text, len, add_special, parse_special, literal, n_literal, ids, n, err);
}

int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, bool skip_special, hbuf *out, herr *err) {
  if (t->hf) return hf_tokenizer_decode(t->hf, ids, n, skip_special, out, err);
  return gguf_vocab_decode(t->gv, ids, n, skip_special, out, err);
}

int tokenizer_token_bytes(const tokenizer *t, int32_t id, hbuf *out, herr *err) {
  int rc;
  if (t->hf) {
    rc = hf_tokenizer_token_bytes(t->hf, id, out, err);
  } else {
    const char *s;
    size_t len;
    rc = gguf_vocab_piece(t->gv, id, false, &s, &len, err);
    if (!rc) hbuf_append(out, s, len);
  }
  if (!rc && out->oom) rc = herr_set(err, HEARTH_ENOMEM, "tokenizer: out of memory");
  return rc;
}

int32_t tokenizer_vocab_size(const tokenizer *t) {
  return t->hf ? hf_tokenizer_vocab_size(t->hf) : gguf_vocab_size(t->gv);
}

const char *tokenizer_id_to_token(const tokenizer *t, int32_t id) {
  return t->hf ? hf_tokenizer_id_to_token(t->hf, id) : gguf_vocab_token(t->gv, id);
}

int32_t tokenizer_token_to_id(const tokenizer *t, const char *token) {
  if (!token) return -1;
  return t->hf ? hf_tokenizer_token_to_id(t->hf, token) : gguf_vocab_find(t->gv, token);
}

bool tokenizer_is_special(const tokenizer *t, int32_t id) {
  return t->hf ? hf_tokenizer_is_special(t->hf, id) : gguf_vocab_is_special(t->gv, id);
}

int32_t tokenizer_bos_id(const tokenizer *t) { return t->hf ? hf_tokenizer_bos(t->hf) : gguf_vocab_bos(t->gv); }
int32_t tokenizer_eos_id(const tokenizer *t) { return t->hf ? hf_tokenizer_eos(t->hf) : gguf_vocab_eos(t->gv); }

/* ---- streaming detokenization ----
 * The window holds the ids since the last slide. `emitted` bytes of the
 * window's decode have been handed out. Text is emitted when the new decode
 * still begins with what was emitted, up to the last character that is not a
 * U+FFFD (a byte sequence later ids may complete), and nothing while the last
 * id is a byte-fallback token "<0xXX>" (HF decodes such a run as a whole:
 * valid UTF-8, or one U+FFFD per byte). When everything is emitted
 * and the window is long, it slides: it keeps a few ids (with at least one that
 * decodes to something) as context, so first-token rules (leading-space
 * stripping) never apply to later ids. */
#define STREAM_CONTEXT 4
#define STREAM_SLIDE 16

struct tokenizer_stream {
  const tokenizer *t; /* borrowed */
  bool skip_special;
  int32_t *ids;       /* owned window */
  size_t n, cap;
  hbuf text;          /* decode of the window */
  size_t emitted;     /* bytes of text already handed out */
};

tokenizer_stream *tokenizer_stream_new(const tokenizer *t, bool skip_special) {
  tokenizer_stream *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->t = t;
  s->skip_special = skip_special;
  return s;
}

void tokenizer_stream_free(tokenizer_stream *s) {
  if (!s) return;
  free(s->ids);
  hbuf_free(&s->text);
  free(s);
}

static size_t stable_end(const char *s, size_t n) {
  while (n >= 3 && memcmp(s + n - 3, "\xEF\xBF\xBD", 3) == 0) n -= 3;
  return utf8_complete_prefix(s, n);
}

static bool visible(const tokenizer_stream *s, int32_t id) {
  if (id < 0 || id >= tokenizer_vocab_size(s->t) || !tokenizer_id_to_token(s->t, id)) return false;
  return !(s->skip_special && tokenizer_is_special(s->t, id));
}

int tokenizer_stream_put(tokenizer_stream *s, int32_t id, hbuf *out, herr *err) {
  if (s->n == s->cap && !HGROW(s->ids, s->cap, s->n + 1)) return herr_set(err, HEARTH_ENOMEM, "detokenize: out of memory");
  s->ids[s->n++] = id;
  hbuf now = {0};
  int rc = tokenizer_decode(s->t, s->ids, s->n, s->skip_special, &now, err);
  if (rc) {
    hbuf_free(&now);
    s->n--;
    return rc;
  }
  const char *p = hbuf_str(&now);
  /* A run of byte-fallback tokens decodes all or nothing: hold it until it ends. */
  const char *tok = tokenizer_id_to_token(s->t, id);
  bool byte_token = tok && strlen(tok) == 6 && !memcmp(tok, "<0x", 3) && tok[5] == '>';
  if (!byte_token && now.len >= s->emitted && memcmp(p, hbuf_str(&s->text), s->emitted) == 0) {
    size_t end = stable_end(p, now.len);
    if (end > s->emitted) {
      hbuf_append(out, p + s->emitted, end - s->emitted);
      s->emitted = end;
    }
  }
  hbuf_free(&s->text);
  s->text = now;
  /* slide the window once it is long and fully emitted */
  if (s->n >= STREAM_SLIDE && s->emitted == s->text.len) {
    size_t keep = STREAM_CONTEXT, vis = 0;
    for (size_t i = s->n - keep; i < s->n; i++) vis += visible(s, s->ids[i]);
    while (!vis && keep < s->n) {
      keep++;
      vis += visible(s, s->ids[s->n - keep]);
    }
    if (vis && keep < s->n) {
      hbuf ctx = {0};
      if (tokenizer_decode(s->t, s->ids + s->n - keep, keep, s->skip_special, &ctx, NULL) == 0 &&
          stable_end(hbuf_str(&ctx), ctx.len) == ctx.len) {
        memmove(s->ids, s->ids + s->n - keep, keep * sizeof *s->ids);
        s->n = keep;
        hbuf_free(&s->text);
        s->text = ctx;
        s->emitted = ctx.len;
      } else {
        hbuf_free(&ctx);
      }
    }
  }
  return out->oom ? herr_set(err, HEARTH_ENOMEM, "detokenize: out of memory") : 0;
}

int tokenizer_stream_flush(tokenizer_stream *s, hbuf *out, herr *err) {
  if (s->text.len > s->emitted) hbuf_append(out, hbuf_str(&s->text) + s->emitted, s->text.len - s->emitted);
  s->emitted = s->text.len;
  return out->oom ? herr_set(err, HEARTH_ENOMEM, "detokenize: out of memory") : 0;
}
