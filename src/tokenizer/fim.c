/* fim.c — fill-in-the-middle: a vocabulary's FIM tokens by their strings and
 * llama.cpp's /infill token layout (format_infill in its server), so a prompt
 * hearth builds is the one a model tuned behind llama.cpp expects. Knows
 * nothing of HTTP or of models. */
#include "tokenizer/fim.h"

#include <stdlib.h>
#include <string.h>

#include "base/vec.h"

static int32_t first_of(const tokenizer *t, const char *const *names) {
  for (; *names; names++) {
    int32_t id = tokenizer_token_to_id(t, *names);
    if (id >= 0) return id;
  }
  return -1;
}

void tokenizer_fim_find(const tokenizer *t, tokenizer_fim *out) {
  static const char *const pre[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>",
                                    "<PRE>", "\xe2\x96\x81<PRE>", "<|code_prefix|>", NULL};
  static const char *const suf[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>",
                                    "<SUF>", "\xe2\x96\x81<SUF>", "<|code_suffix|>", NULL};
  static const char *const mid[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>",
                                    "<MID>", "\xe2\x96\x81<MID>", "<|code_middle|>", NULL};
  static const char *const pad[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", NULL};
  static const char *const rep[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL};
  static const char *const sep[] = {"<|file_sep|>", "<|file_separator|>", "<fim-sep>", "<SEP>", NULL};
  out->pre = first_of(t, pre);
  out->suf = first_of(t, suf);
  out->mid = first_of(t, mid);
  out->pad = first_of(t, pad);
  out->rep = first_of(t, rep);
  out->sep = first_of(t, sep);
}

bool tokenizer_fim_ok(const tokenizer_fim *f) { return f->pre >= 0 && f->suf >= 0 && f->mid >= 0; }

typedef struct ids {
  int32_t *v;
  size_t n, cap;
  bool oom;
} ids;

static void push(ids *a, const int32_t *v, size_t n) {
  if (a->oom || n == 0) return;
  if (a->n + n > a->cap && !HGROW(a->v, a->cap, a->n + n)) {
    a->oom = true;
    return;
  }
  memcpy(a->v + a->n, v, n * sizeof *v);
  a->n += n;
}

static void push1(ids *a, int32_t id) { push(a, &id, 1); }

/* text's tokens without special tokens parsed or added (llama.cpp's tokenize(..., false, false)),
 * the FIM tokens' strings read as text too (llama.cpp makes them control tokens) */
static int tok(const tokenizer *t, const tokenizer_fim *f, const char *text, ids *out, herr *err) {
  int32_t lit[6];
  size_t nlit = 0;
  const int32_t all[6] = {f->pre, f->suf, f->mid, f->pad, f->rep, f->sep};
  for (int i = 0; i < 6; i++)
    if (all[i] >= 0) lit[nlit++] = all[i];
  int32_t *v = NULL;
  size_t n = 0;
  int rc = tokenizer_encode_ex(t, text, strlen(text), false, false, lit, nlit, &v, &n, err);
  if (!rc) push(out, v, n);
  free(v);
  return rc;
}

/* Whether the tokenizer puts its BOS before a text when adding special tokens (llama_vocab_get_add_bos). */
static bool adds_bos(const tokenizer *t) {
  int32_t bos = tokenizer_bos_id(t);
  if (bos < 0) return false;
  int32_t *v = NULL;
  size_t n = 0;
  herr e = {0};
  bool yes = tokenizer_encode(t, "a", 1, true, false, &v, &n, &e) == 0 && n > 0 && v[0] == bos;
  free(v);
  return yes;
}

int tokenizer_fim_prompt(const tokenizer *t, const tokenizer_fim *f, const char *prefix, const char *suffix,
                         const char *prompt, const tokenizer_fim_chunk *extra, int n_extra, int64_t n_ctx,
                         int64_t n_predict, int32_t **out, size_t *nout, herr *err) {
  *out = NULL;
  *nout = 0;
  if (!tokenizer_fim_ok(f))
    return herr_set(err, HEARTH_EUNSUPPORTED, "the vocabulary has no fill-in-the-middle tokens (<|fim_prefix|>, "
                                              "<|fim_suffix|>, <|fim_middle|> or their kin)");
  ids pre = {0}, suf = {0}, mid = {0}, ext = {0}, all = {0};
  int rc = 0;
  if ((rc = tok(t, f, prefix ? prefix : "", &pre, err)) || (rc = tok(t, f, suffix ? suffix : "", &suf, err)) ||
      (rc = tok(t, f, prompt ? prompt : "", &mid, err)))
    goto out;
  if (f->rep >= 0) {
    push1(&ext, f->rep);
    if ((rc = tok(t, f, "myproject\n", &ext, err))) goto out;
  }
  for (int i = 0; i < n_extra; i++) {
    if (f->sep >= 0) {
      const char *name = extra[i].filename ? extra[i].filename : "tmp";
      size_t ln = strlen(name);
      char *line = malloc(ln + 2);
      if (!line) {
        rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
        goto out;
      }
      memcpy(line, name, ln);
      memcpy(line + ln, "\n", 2);
      push1(&ext, f->sep);
      rc = tok(t, f, line, &ext, err);
      free(line);
    } else {
      rc = tok(t, f, "\n\n--- snippet ---\n\n", &ext, err);
    }
    if (rc || (rc = tok(t, f, extra[i].text ? extra[i].text : "", &ext, err))) goto out;
  }
  if (f->sep >= 0) {
    push1(&ext, f->sep);
    if ((rc = tok(t, f, "filename\n", &ext, err))) goto out;
  }
  /* what fits, as llama.cpp takes it: prefix 3:1 suffix within a batch, the context before in the rest */
  int64_t batch = n_ctx > 0 && n_ctx < 2048 ? n_ctx : 2048;
  int64_t take_pre = (int64_t)pre.n < 3 * (batch / 4) ? (int64_t)pre.n : 3 * (batch / 4);
  int64_t room = batch / 4 - (2 + (int64_t)mid.n);
  int64_t take_suf = (int64_t)suf.n < (room > 0 ? room : 0) ? (int64_t)suf.n : (room > 0 ? room : 0);
  int64_t left = n_ctx - batch - 2 * n_predict;
  int64_t take_ext = (int64_t)ext.n < (left > 0 ? left : 0) ? (int64_t)ext.n : (left > 0 ? left : 0);
  if (take_ext) push(&all, ext.v + ext.n - take_ext, (size_t)take_ext);
  if (adds_bos(t)) push1(&all, tokenizer_bos_id(t));
  push1(&all, f->pre);
  if (take_pre) push(&all, pre.v + pre.n - take_pre, (size_t)take_pre);
  push(&all, mid.v, mid.n);
  push1(&all, f->suf);
  push(&all, suf.v, (size_t)take_suf);
  push1(&all, f->mid);
  if (pre.oom || suf.oom || mid.oom || ext.oom || all.oom) {
    rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    goto out;
  }
  *out = all.v;
  *nout = all.n;
  all.v = NULL;
out:
  free(pre.v);
  free(suf.v);
  free(mid.v);
  free(ext.v);
  free(all.v);
  return rc;
}
