/* test_templates.c — real chat templates (llama.cpp's and the tokenizer packages'
 * from .deps, fetched by tools/fetch_test_deps.sh, and Gemma 4's
 * in tests/fixtures/templates/gemma4) over the
 * conversations in tests/fixtures/templates/conversations.json must render
 * byte-identically to Python Jinja2 (tests/fixtures/templates/expected.json,
 * made by tools/gen_template_fixtures.py), and fail exactly where Jinja2 raised
 * (with the same message when the template raised it itself). */
#include <jansson.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "chat/chat.h"
#include "chat/jinja.h"
#include "test.h"

#define FIX HEARTH_SOURCE_DIR "/tests/fixtures/templates/"

static char *template_source(const char *file) {
  char path[4096];
  herr err = {0};
  if (!strncmp(file, "llama.cpp:", 10)) { /* llama.cpp's models/templates */
    snprintf(path, sizeof path, "%s/llama.cpp/%s", HEARTH_DEPS_DIR, file + 10);
    char *src;
    size_t len;
    if (hfile_read(path, &src, &len, &err)) return NULL;
    return src;
  }
  if (!strncmp(file, "fixture:", 8)) { /* a template kept beside the fixtures (see its README) */
    snprintf(path, sizeof path, "%s%s", FIX, file + 8);
    char *src;
    size_t len;
    if (hfile_read(path, &src, &len, &err)) return NULL;
    return src;
  }
  if (!strncmp(file, "deps:", 5)) {
    snprintf(path, sizeof path, "%s/%s", HEARTH_DEPS_DIR, file + 5);
    chat_template t;
    if (chat_template_load(path, &t, &err)) return NULL;
    char *src = strdup(t.source);
    chat_template_free(&t);
    return src;
  }
  return NULL;
}

static void test_real_templates(void) {
  herr err = {0};
  json_t *expected = hjson_load_file(FIX "expected.json", &err);
  json_t *convs = hjson_load_file(FIX "conversations.json", &err);
  CHECK_MSG(expected && convs, "%s", err.msg);
  if (!expected || !convs) return;
  json_t *templates = json_object_get(expected, "templates"), *cases = json_object_get(expected, "cases");
  size_t nt = json_array_size(templates), nc = json_array_size(cases);
  jinja_template **parsed = calloc(nt, sizeof *parsed);
  char **outputs = calloc(nc, sizeof *outputs); /* expected outputs, rebuilt */
  jinja_limits lim = {.fixed_now = json_integer_value(json_object_get(expected, "now"))};
  int missing = 0, rendered = 0, raised = 0, failures_before = test_failures;
  for (size_t i = 0; i < nt; i++) {
    const char *file = json_string_value(json_object_get(json_array_get(templates, i), "file"));
    char *src = template_source(file);
    if (!src) {
      fprintf(stderr, "template %s not found\n", file);
      missing++;
      continue;
    }
    herr e = {0};
    int rc = jinja_parse(src, strlen(src), file, &parsed[i], &e);
    CHECK_MSG(rc == 0, "%s", e.msg);
    free(src);
  }
  CHECK_MSG(missing == 0, "%d templates not found (run tools/fetch_test_deps.sh?)", missing);
  for (size_t k = 0; k < nc; k++) {
    json_t *c = json_array_get(cases, k);
    size_t ti = (size_t)json_integer_value(json_object_get(c, "t"));
    json_t *tpl = json_array_get(templates, ti);
    json_t *conv = json_array_get(convs, (size_t)json_integer_value(json_object_get(c, "c")));
    json_t *tail = json_object_get(c, "tail");
    if (tail) {
      hbuf b = {0};
      json_t *base = json_object_get(c, "base");
      if (base) hbuf_append(&b, outputs[json_integer_value(base)], (size_t)json_integer_value(json_object_get(c, "keep")));
      hbuf_append(&b, json_string_value(tail), json_string_length(tail));
      outputs[k] = hbuf_take(&b);
    }
    if (!parsed[ti]) continue;
    json_t *ctx = chat_context(json_object_get(conv, "messages"), json_object_get(conv, "tools"),
                               json_is_true(json_object_get(c, "g")), json_object_get(conv, "kwargs"),
                               json_string_value(json_object_get(tpl, "bos")), json_string_value(json_object_get(tpl, "eos")));
    hbuf out = {0};
    herr e = {0};
    int rc = jinja_render(parsed[ti], ctx, &lim, &out, &e);
    const char *tname = json_string_value(json_object_get(tpl, "name"));
    const char *cname = json_string_value(json_object_get(conv, "name"));
    json_t *error = json_object_get(c, "error");
    if (error) {
      raised++;
      CHECK_MSG(rc != 0, "%s / %s (g=%d): Jinja2 raised %s: %s, we rendered:\n%s", tname, cname,
                json_is_true(json_object_get(c, "g")), json_string_value(json_object_get(error, "type")),
                json_string_value(json_object_get(error, "message")), hbuf_str(&out));
      if (rc && !strcmp(json_string_value(json_object_get(error, "type")), "TemplateError")) {
        const char *msg = e.msg + jinja_error_prefix_len(&e);
        CHECK_MSG(!strcmp(msg, json_string_value(json_object_get(error, "message"))), "%s / %s: message '%s' != '%s'",
                  tname, cname, msg, json_string_value(json_object_get(error, "message")));
      }
    } else {
      rendered++;
      CHECK_MSG(rc == 0, "%s / %s (g=%d): %s", tname, cname, json_is_true(json_object_get(c, "g")), e.msg);
      if (rc == 0) {
        bool same = out.len == strlen(outputs[k]) && memcmp(hbuf_str(&out), outputs[k], out.len) == 0;
        if (!same) {
          size_t at = 0;
          while (at < out.len && out.data[at] == outputs[k][at]) at++;
          CHECK_MSG(same, "%s / %s (g=%d): differs at byte %zu\n--- got:\n%s\n--- want:\n%s\n---", tname, cname,
                    json_is_true(json_object_get(c, "g")), at, hbuf_str(&out), outputs[k]);
        } else {
          CHECK(same);
        }
      }
    }
    if (test_failures - failures_before > 30) {
      fprintf(stderr, "too many failures; stopping\n");
      k = nc;
    }
    hbuf_free(&out);
    json_decref(ctx);
  }
  fprintf(stderr, "%zu templates, %d renders compared byte for byte, %d expected errors\n", nt, rendered, raised);
  for (size_t i = 0; i < nt; i++) jinja_free(parsed[i]);
  for (size_t k = 0; k < nc; k++) free(outputs[k]);
  free(parsed);
  free(outputs);
  json_decref(expected);
  json_decref(convs);
}

int main(void) {
  test_need_tokenizers();
  RUN(test_real_templates);
  TEST_MAIN_END();
}
