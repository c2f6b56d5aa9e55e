/* test_templates.c — real chat templates (llama.cpp's and the tokenizer packages'
 * from .deps, fetched by tools/fetch_test_deps.sh, and Gemma 4's
 * in tests/fixtures/templates/gemma4) over the
 * conversations in tests/fixtures/templates/conversations.json must render
 * byte-identically to Python Jinja2 (tests/fixtures/templates/expected.json,
 * made by tools/gen_template_fixtures.py), and fail exactly where Jinja2 raised
 * (with the same message when the template raised it itself). The same
 * templates and models/default's take an assistant turn of only tool calls
 * (content null) and show the call, and continue a final assistant message
 * (continue_final_message) with nothing after its text. */
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

/* Every real template (and models/default's) over a turn of only tool calls
 * with content null, reshaped as the server does; and a final assistant
 * message cut for continuation. */
static void test_calls_and_prefill(void) {
  herr err = {0};
  json_t *expected = hjson_load_file(FIX "expected.json", &err);
  CHECK_MSG(expected != NULL, "%s", err.msg);
  if (!expected) return;
  json_t *templates = json_object_get(expected, "templates");
  size_t nt = json_array_size(templates);
  json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"w\","
                             "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]",
                             0, NULL);
  int as_text = 0, checked = 0, skipped = 0, checked_calls = 0, checked_prefill = 0;
  for (size_t i = 0; i <= nt; i++) {
    char *src, *bos = NULL, *eos = NULL;
    const char *name;
    chat_template dflt = {0};
    if (i < nt) {
      json_t *tpl = json_array_get(templates, i);
      name = json_string_value(json_object_get(tpl, "name"));
      src = template_source(json_string_value(json_object_get(tpl, "file")));
      bos = (char *)json_string_value(json_object_get(tpl, "bos"));
      eos = (char *)json_string_value(json_object_get(tpl, "eos"));
    } else { /* the built-in model's template, which knows no tools */
      name = "models/default";
      CHECK_MSG(chat_template_load(HEARTH_SOURCE_DIR "/models/default", &dflt, &err) == 0, "%s", err.msg);
      src = dflt.source ? strdup(dflt.source) : NULL;
      bos = dflt.bos, eos = dflt.eos;
    }
    CHECK_MSG(src != NULL, "%s: template not found", name);
    if (!src) continue;
    checked++;
    /* a template that cannot render a plain question (one that needs kwargs of its own, or
     * fails on tools as Jinja2 does) is not asked more of it */
    json_t *plain = json_loads("[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]", 0, NULL);
    hbuf out = {0};
    herr e = {0};
    bool with_tools = chat_render(src, plain, tools, true, NULL, bos, eos, &out, &e) == 0;
    hbuf_free(&out);
    bool without = chat_render(src, plain, NULL, true, NULL, bos, eos, &out, &e) == 0;
    hbuf_free(&out);
    json_decref(plain);
    if (!with_tools && !without) skipped++;
    chat_call_shape shape = chat_tool_call_shape(src, bos, eos);
    as_text += shape.calls_as_text && i == nt;
    json_t *msgs = json_loads("[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},{\"role\":\"assistant\",\"content\":null,"
                              "\"tool_calls\":[{\"id\":\"a1b2c3d4e\",\"type\":\"function\",\"function\":{\"name\":"
                              "\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}}]}]",
                              0, NULL);
    chat_apply_call_shape(msgs, shape);
    int rc = with_tools ? chat_render(src, msgs, tools, false, NULL, bos, eos, &out, &e) : 0;
    CHECK_MSG(rc == 0, "%s: a turn of only tool calls: %s", name, e.msg);
    CHECK_MSG(rc || !with_tools || (strstr(hbuf_str(&out), "get_weather") && strstr(hbuf_str(&out), "Paris")),
              "%s: the call is not shown:\n%s", name, hbuf_str(&out));
    checked_calls += with_tools;
    hbuf_free(&out);
    json_decref(msgs);

    /* continue_final_message: the chat without the generation prompt, cut after the final text */
    msgs = json_loads("[{\"role\":\"user\",\"content\":\"Count to five.\"},{\"role\":\"assistant\",\"content\":"
                      "\"One, two,\"}]",
                      0, NULL);
    const json_t *t = without ? NULL : tools;
    rc = with_tools || without ? chat_render(src, msgs, t, false, NULL, bos, eos, &out, &e) : 1;
    CHECK_MSG(rc == 0 || (!with_tools && !without), "%s: a final assistant message: %s", name, e.msg);
    size_t cut = 0;
    if (!rc) {
      checked_prefill++;
      CHECK_MSG(chat_continue_final(hbuf_str(&out), "One, two,", &cut, &e) == 0, "%s: %s", name, e.msg);
      CHECK_MSG(cut >= 9 && !memcmp(hbuf_str(&out) + cut - 9, "One, two,", 9), "%s: cut at %zu of\n%s", name, cut,
                hbuf_str(&out));
      /* what was cut is the template's closing of the turn, never the text */
      CHECK_MSG(strstr(hbuf_str(&out) + cut, "One, two,") == NULL, "%s", name);
    }
    hbuf_free(&out);
    json_decref(msgs);
    free(src);
    chat_template_free(&dflt);
  }
  CHECK_EQ_INT(checked, (int)nt + 1);
  fprintf(stderr, "%d templates: %d took a turn of only tool calls, %d continued a final message, %d render "
                  "no plain question\n", checked, checked_calls, checked_prefill, skipped);
  CHECK(checked_calls >= checked - skipped - 2 && checked_prefill == checked - skipped);
  CHECK_MSG(as_text >= 1, "models/default's template shows no tool calls: its calls should go in as text");
  /* transformers' rules: the stripped text's last occurrence; trailing space kept only when written */
  size_t cut = 0;
  herr e = {0};
  CHECK(chat_continue_final("<u>hi</u><a>Sure </a>", "Sure ", &cut, &e) == 0 && cut == 17);
  CHECK(chat_continue_final("<u>hi</u><a>Sure</a>", "Sure ", &cut, &e) == 0 && cut == 16);
  CHECK(chat_continue_final("<a>x</a><a>x</a>", "x", &cut, &e) == 0 && cut == 12);
  CHECK(chat_continue_final("<a>y</a>", "x", &cut, &e) == HEARTH_EINVAL);
  CHECK(chat_continue_final("<a></a>", "  ", &cut, &e) == HEARTH_EINVAL);
  json_decref(tools);
  json_decref(expected);
}

int main(void) {
  test_need_tokenizers();
  RUN(test_real_templates);
  RUN(test_calls_and_prefill);
  TEST_MAIN_END();
}
