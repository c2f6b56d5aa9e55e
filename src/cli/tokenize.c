/* tokenize.c — the verbs `tokenize` (text -> ids) and `detokenize` (ids ->
 * text) over a model folder, a tokenizer.json or a .gguf. Output is JSON with
 * non-ASCII characters written as UTF-8, not escaped. Uses the internal
 * tokenizer module (tokenizer/tokenizer.h), not hearth.h: the public API
 * tokenizes only with a loaded model, and these verbs take a bare
 * tokenizer.json and never load weights. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "base/json.h"
#include "base/utf8.h"
#include "cli/cli.h"
#include "tokenizer/tokenizer.h"

/* Writes s[0..n) as a JSON string: UTF-8 kept, controls escaped, invalid bytes as U+FFFD. */
static void json_string_out(hbuf *o, const char *s, size_t n) {
  hbuf_putc(o, '"');
  for (size_t i = 0; i < n;) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x80) {
      uint32_t cp;
      int l = utf8_decode(s + i, n - i, &cp);
      if (l) hbuf_append(o, s + i, (size_t)l), i += (size_t)l;
      else hbuf_puts(o, "\xEF\xBF\xBD"), i++;
      continue;
    }
    switch (c) {
      case '"': hbuf_puts(o, "\\\""); break;
      case '\\': hbuf_puts(o, "\\\\"); break;
      case '\n': hbuf_puts(o, "\\n"); break;
      case '\r': hbuf_puts(o, "\\r"); break;
      case '\t': hbuf_puts(o, "\\t"); break;
      case '\b': hbuf_puts(o, "\\b"); break;
      case '\f': hbuf_puts(o, "\\f"); break;
      default:
        if (c < 0x20 || c == 0x7F) hbuf_printf(o, "\\u%04x", c);
        else hbuf_putc(o, (char)c);
    }
    i++;
  }
  hbuf_putc(o, '"');
}

static void ids_out(hbuf *o, const int32_t *ids, size_t n) {
  hbuf_putc(o, '[');
  for (size_t i = 0; i < n; i++) hbuf_printf(o, i ? ",%d" : "%d", ids[i]);
  hbuf_putc(o, ']');
}

static int write_out(hbuf *o) {
  if (o->oom) return cli_fail("out of memory");
  hbuf_putc(o, '\n');
  fwrite(hbuf_str(o), 1, o->len, stdout);
  return fflush(stdout) == 0 ? 0 : cli_fail("cannot write the output");
}

static int read_stdin(char **out, size_t *len) {
  hbuf b = {0};
  char chunk[65536];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, stdin)) > 0) hbuf_append(&b, chunk, n);
  if (b.oom) return cli_fail("out of memory");
  *len = b.len;
  *out = hbuf_take(&b);
  return 0;
}

static int open_model(const char *verb, const char *model, tokenizer **t) {
  if (!model) model = cli_default_model();
  if (!model) return cli_usage_error(verb, "no --model given and no built-in model found");
  herr e = {0};
  if (tokenizer_load(model, t, &e)) return cli_fail("%s", e.msg);
  return 0;
}

static void tokenize_usage(void) {
  printf("usage: hearth tokenize [--model PATH] [--no-special] [--no-parse-special] TEXT...\n"
         "       hearth tokenize [--model PATH] [--no-special] --batch FILE\n\n"
         "Prints the token ids of TEXT (or of stdin when TEXT is '-' or absent) as a JSON array.\n"
         "PATH is a model folder, a tokenizer.json or a .gguf (default: the built-in model). --batch reads a JSON array of\n"
         "strings and prints a JSON array of id arrays. Special tokens (BOS, the post-processor's)\n"
         "are added unless --no-special; special-token text in the input becomes its id unless\n"
         "--no-parse-special.\n");
}

int cli_tokenize(int argc, char **argv) {
  const char *model = NULL, *batch = NULL;
  bool add_special = true, parse_special = true;
  hbuf text = {0};
  int npos = 0, r;
  for (int i = 1; i < argc; i++) {
    if (cli_is_help(argv[i])) {
      tokenize_usage();
      hbuf_free(&text);
      return 0;
    }
    if ((r = cli_opt(argc, argv, &i, "--model", &model)) || (r = cli_opt(argc, argv, &i, "--batch", &batch))) {
      if (r < 0) return hbuf_free(&text), 2;
      continue;
    }
    if (!strcmp(argv[i], "--no-special")) add_special = false;
    else if (!strcmp(argv[i], "--no-parse-special")) parse_special = false;
    else if (argv[i][0] == '-' && argv[i][1] && strcmp(argv[i], "--")) {
      hbuf_free(&text);
      return cli_usage_error("tokenize", "unknown option '%s'", argv[i]);
    } else {
      if (!strcmp(argv[i], "--") && i + 1 < argc) i++;
      if (npos++) hbuf_putc(&text, ' ');
      hbuf_puts(&text, argv[i]);
    }
  }
  tokenizer *t = NULL;
  if ((r = open_model("tokenize", model, &t))) return hbuf_free(&text), r;
  hbuf o = {0};
  herr e = {0};
  int rc = 0;
  if (batch) {
    json_t *arr = hjson_load_file(batch, &e);
    if (!arr) rc = cli_fail("%s", e.msg);
    else if (!json_is_array(arr)) rc = cli_fail("%s: must be a JSON array of strings", batch);
    hbuf_putc(&o, '[');
    for (size_t i = 0; !rc && i < json_array_size(arr); i++) {
      const json_t *s = json_array_get(arr, i);
      if (!json_is_string(s)) {
        rc = cli_fail("%s: element %zu is not a string", batch, i);
        break;
      }
      int32_t *ids = NULL;
      size_t n = 0;
      if (tokenizer_encode(t, json_string_value(s), json_string_length(s), add_special, parse_special, &ids, &n, &e)) {
        rc = cli_fail("%s: element %zu: %s", batch, i, e.msg);
        break;
      }
      if (i) hbuf_putc(&o, ',');
      ids_out(&o, ids, n);
      free(ids);
    }
    hbuf_putc(&o, ']');
    json_decref(arr);
  } else {
    char *in = NULL;
    size_t len = 0;
    bool from_stdin = npos == 0 || (npos == 1 && !strcmp(hbuf_str(&text), "-"));
    if (from_stdin) rc = read_stdin(&in, &len);
    int32_t *ids = NULL;
    size_t n = 0;
    if (!rc && tokenizer_encode(t, from_stdin ? in : hbuf_str(&text), from_stdin ? len : text.len, add_special,
                                parse_special, &ids, &n, &e))
      rc = cli_fail("%s", e.msg);
    if (!rc) ids_out(&o, ids, n);
    free(ids);
    free(in);
  }
  if (!rc) rc = write_out(&o);
  hbuf_free(&o);
  hbuf_free(&text);
  tokenizer_free(t);
  return rc;
}

static void detokenize_usage(void) {
  printf("usage: hearth detokenize [--model PATH] [--skip-special] ID...\n"
         "       hearth detokenize [--model PATH] [--skip-special] --batch FILE\n\n"
         "Prints the text of the token ids as a JSON string (PATH as for tokenize; default: the\n"
         "built-in model). --batch reads a JSON array of id\n"
         "arrays and prints a JSON array of strings. Special tokens are kept unless --skip-special.\n");
}

/* Ids outside the vocabulary are an error, not an empty string. */
static int check_ids(const tokenizer *t, const int32_t *ids, size_t n, herr *e) {
  int32_t V = tokenizer_vocab_size(t);
  for (size_t i = 0; i < n; i++)
    if (ids[i] < 0 || ids[i] >= V)
      return herr_set(e, HEARTH_EINVAL, "token id %d is outside the vocabulary (ids 0 to %d)", (int)ids[i], (int)V - 1);
  return 0;
}

int cli_detokenize(int argc, char **argv) {
  const char *model = NULL, *batch = NULL;
  bool skip = false;
  int32_t *ids = calloc((size_t)argc + 1, sizeof *ids);
  size_t n = 0;
  long long id;
  int r;
  if (!ids) return cli_fail("out of memory");
  for (int i = 1; i < argc; i++) {
    if (cli_is_help(argv[i])) {
      detokenize_usage();
      free(ids);
      return 0;
    }
    if ((r = cli_opt(argc, argv, &i, "--model", &model)) || (r = cli_opt(argc, argv, &i, "--batch", &batch))) {
      if (r < 0) return free(ids), 2;
      continue;
    }
    if (!strcmp(argv[i], "--skip-special")) skip = true;
    else if (cli_parse_int(argv[i], 0, INT32_MAX, &id)) ids[n++] = (int32_t)id;
    else {
      free(ids);
      return cli_usage_error("detokenize", "'%s' is neither an option nor a token id", argv[i]);
    }
  }
  tokenizer *t = NULL;
  if ((r = open_model("detokenize", model, &t))) return free(ids), r;
  hbuf o = {0}, text = {0};
  herr e = {0};
  int rc = 0;
  if (batch) {
    json_t *arr = hjson_load_file(batch, &e);
    if (!arr) rc = cli_fail("%s", e.msg);
    else if (!json_is_array(arr)) rc = cli_fail("%s: must be a JSON array of id arrays", batch);
    hbuf_putc(&o, '[');
    for (size_t i = 0; !rc && i < json_array_size(arr); i++) {
      const json_t *a = json_array_get(arr, i);
      size_t m = json_array_size(a);
      int32_t *v = malloc((m + 1) * sizeof *v);
      if (!json_is_array(a) || !v) rc = cli_fail("%s: element %zu is not an array of ids", batch, i);
      for (size_t k = 0; !rc && k < m; k++) {
        const json_t *x = json_array_get(a, k);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX)
          rc = cli_fail("%s: element %zu, position %zu is not a token id", batch, i, k);
        else v[k] = (int32_t)json_integer_value(x);
      }
      hbuf_clear(&text);
      if (!rc && (check_ids(t, v, m, &e) || tokenizer_decode(t, v, m, skip, &text, &e)))
        rc = cli_fail("%s: element %zu: %s", batch, i, e.msg);
      free(v);
      if (rc) break;
      if (i) hbuf_putc(&o, ',');
      json_string_out(&o, hbuf_str(&text), text.len);
    }
    hbuf_putc(&o, ']');
    json_decref(arr);
  } else {
    if (check_ids(t, ids, n, &e) || tokenizer_decode(t, ids, n, skip, &text, &e)) rc = cli_fail("%s", e.msg);
    else json_string_out(&o, hbuf_str(&text), text.len);
  }
  if (!rc) rc = write_out(&o);
  hbuf_free(&o);
  hbuf_free(&text);
  free(ids);
  tokenizer_free(t);
  return rc;
}
