/* hf_check.h — shared by the tokenizer.json tests: runs a tokenizer over the
 * fixture corpus and compares encode (with and without special tokens),
 * decode (keeping and skipping special tokens) and streaming decode against
 * the expected outputs HF tokenizers produced (tools/gen_tokenizer_fixtures.py). */
#ifndef HEARTH_TESTS_HF_CHECK_H
#define HEARTH_TESTS_HF_CHECK_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "base/utf8.h"
#include "test.h"
#include "tokenizer/tokenizer.h"

#pragma GCC diagnostic ignored "-Wunused-function" /* each test uses some helpers */

#define FIX_DIR HEARTH_SOURCE_DIR "/tests/fixtures/tokenizer/"

static json_t *load_json_file(const char *path) {
  herr e = {0};
  json_t *j = hjson_load_file(path, &e);
  if (!j) fprintf(stderr, "cannot load %s: %s\n", path, e.msg);
  return j;
}

/* Loads a tokenizer.json with no tokenizer_config.json (pure HF tokenizers semantics). */
static tokenizer *load_tokenizer_json_only(const char *path) {
  char *data = NULL;
  size_t len = 0;
  herr e = {0};
  if (hfile_read(path, &data, &len, &e)) {
    fprintf(stderr, "cannot read %s: %s\n", path, e.msg);
    return NULL;
  }
  tokenizer *t = NULL;
  if (tokenizer_load_json(data, len, NULL, 0, path, &t, &e)) fprintf(stderr, "cannot load %s: %s\n", path, e.msg);
  free(data);
  return t;
}

static bool ids_equal(const int32_t *ids, size_t n, const json_t *want) {
  if (!json_is_array(want) || json_array_size(want) != n) return false;
  for (size_t i = 0; i < n; i++)
    if (json_integer_value(json_array_get(want, i)) != ids[i]) return false;
  return true;
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
  fprintf(stderr, "    %s [", label);
  for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, "%s%d", i ? "," : "", ids[i]);
  fprintf(stderr, "%s]\n", n > 40 ? ",..." : "");
}

static void print_want(const json_t *want) {
  fprintf(stderr, "    want [");
  for (size_t i = 0; i < json_array_size(want) && i < 40; i++)
    fprintf(stderr, "%s%lld", i ? "," : "", (long long)json_integer_value(json_array_get(want, i)));
  fprintf(stderr, "%s]\n", json_array_size(want) > 40 ? ",..." : "");
}

/* Mismatch counters for one tokenizer. */
typedef struct hf_tally {
  int enc_special, enc_plain, dec, dec_skip, stream, shown;
} hf_tally;

static int32_t *json_ids(const json_t *a, size_t *n) {
  *n = json_array_size(a);
  int32_t *ids = malloc((*n + 1) * sizeof *ids);
  for (size_t i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(a, i));
  return ids;
}

static void stream_decode(const tokenizer *t, const int32_t *ids, size_t n, bool skip, hbuf *out) {
  tokenizer_stream *s = tokenizer_stream_new(t, skip);
  herr e = {0};
  for (size_t i = 0; i < n; i++) {
    size_t before = out->len;
    CHECK(tokenizer_stream_put(s, ids[i], out, &e) == 0);
    /* never a split UTF-8 sequence in what one step hands out */
    CHECK(utf8_complete_prefix(out->data ? out->data + before : "", out->len - before) == out->len - before);
  }
  CHECK(tokenizer_stream_flush(s, out, &e) == 0);
  tokenizer_stream_free(s);
}

/* Compares one tokenizer against an expected-outputs object on the corpus. */
static void check_against(const char *name, const tokenizer *t, const json_t *corpus, const json_t *exp, hf_tally *tl) {
  const json_t *esp = json_object_get(exp, "encode_special"), *epl = json_object_get(exp, "encode_plain");
  const json_t *dec = json_object_get(exp, "decode"), *decs = json_object_get(exp, "decode_skip");
  size_t n = json_array_size(corpus);
  CHECK_EQ_INT(json_array_size(esp), n);
  for (size_t i = 0; i < n && i < json_array_size(esp); i++) {
    const char *text = json_string_value(json_array_get(corpus, i));
    size_t len = json_string_length(json_array_get(corpus, i));
    int32_t *ids = NULL;
    size_t nids = 0;
    herr e = {0};
    int rc = tokenizer_encode(t, text, len, true, true, &ids, &nids, &e);
    if (rc || !ids_equal(ids, nids, json_array_get(esp, i))) {
      tl->enc_special++;
      if (tl->shown++ < 6) {
        fprintf(stderr, "  %s: encode(add_special) of corpus[%zu] \"%.80s\" differs %s\n", name, i, text, rc ? e.msg : "");
        print_ids("got ", ids, nids);
        print_want(json_array_get(esp, i));
      }
    }
    free(ids);
    ids = NULL;
    rc = tokenizer_encode(t, text, len, false, true, &ids, &nids, &e);
    if (rc || !ids_equal(ids, nids, json_array_get(epl, i))) {
      tl->enc_plain++;
      if (tl->shown++ < 6) {
        fprintf(stderr, "  %s: encode(plain) of corpus[%zu] \"%.80s\" differs %s\n", name, i, text, rc ? e.msg : "");
        print_ids("got ", ids, nids);
        print_want(json_array_get(epl, i));
      }
    }
    free(ids);
    /* decode the expected ids (not ours) so decode is checked on its own */
    int32_t *want_ids = json_ids(json_array_get(esp, i), &nids);
    for (int skip = 0; skip < 2; skip++) {
      const json_t *w = json_array_get(skip ? decs : dec, i);
      if (!w) continue;
      hbuf out = {0};
      rc = tokenizer_decode(t, want_ids, nids, skip, &out, &e);
      bool same = !rc && out.len == json_string_length(w) && memcmp(hbuf_str(&out), json_string_value(w), out.len) == 0;
      if (!same) {
        if (skip) tl->dec_skip++;
        else tl->dec++;
        if (tl->shown++ < 6)
          fprintf(stderr, "  %s: decode(skip=%d) of corpus[%zu] differs:\n    got  \"%s\"\n    want \"%s\"\n", name, skip, i,
                  hbuf_str(&out), json_string_value(w));
      }
      hbuf_free(&out);
      if (!skip || 1) {
        hbuf sout = {0};
        stream_decode(t, want_ids, nids, skip, &sout);
        bool ssame = sout.len == json_string_length(w) && memcmp(hbuf_str(&sout), json_string_value(w), sout.len) == 0;
        if (!ssame) {
          tl->stream++;
          if (tl->shown++ < 6)
            fprintf(stderr, "  %s: stream decode(skip=%d) of corpus[%zu] differs:\n    got  \"%s\"\n    want \"%s\"\n", name,
                    skip, i, hbuf_str(&sout), json_string_value(w));
        }
        hbuf_free(&sout);
      }
    }
    free(want_ids);
  }
  fprintf(stderr, "  %-28s %zu strings: mismatches encode(special) %d, encode(plain) %d, decode %d, decode(skip) %d, stream %d\n",
          name, n, tl->enc_special, tl->enc_plain, tl->dec, tl->dec_skip, tl->stream);
  CHECK_EQ_INT(tl->enc_special, 0);
  CHECK_EQ_INT(tl->enc_plain, 0);
  CHECK_EQ_INT(tl->dec, 0);
  CHECK_EQ_INT(tl->dec_skip, 0);
  CHECK_EQ_INT(tl->stream, 0);
}

#endif
