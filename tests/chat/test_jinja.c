/* test_jinja.c — the Jinja2 engine case by case: every expression / statement
 * case in tests/fixtures/templates/cases.json (outputs and errors recorded from
 * Python Jinja2 by tools/gen_template_fixtures.py), hostile templates stopped
 * by the limits, error line numbers, and the model-folder template loader. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json.h"
#include "chat/chat.h"
#include "chat/jinja.h"
#include "test.h"

#define FIX HEARTH_SOURCE_DIR "/tests/fixtures/templates/"

static int render_str(const char *src, const char *ctx_json, const jinja_limits *lim, hbuf *out, herr *err) {
  jinja_template *t;
  int rc = jinja_parse(src, strlen(src), "t", &t, err);
  if (rc) return rc;
  json_t *ctx = ctx_json ? json_loads(ctx_json, 0, NULL) : NULL;
  rc = jinja_render(t, ctx, lim, out, err);
  json_decref(ctx);
  jinja_free(t);
  return rc;
}

static void test_cases_against_jinja2(void) {
  herr err = {0};
  json_t *doc = hjson_load_file(FIX "cases.json", &err);
  CHECK_MSG(doc != NULL, "%s", err.msg);
  if (!doc) return;
  jinja_limits lim = {.fixed_now = json_integer_value(json_object_get(doc, "now"))};
  json_t *cases = json_object_get(doc, "cases");
  size_t i;
  json_t *c;
  int ok_outputs = 0, ok_errors = 0;
  json_array_foreach(cases, i, c) {
    const char *src = json_string_value(json_object_get(c, "template"));
    jinja_template *t = NULL;
    herr e = {0};
    hbuf out = {0};
    int rc = jinja_parse(src, strlen(src), "case", &t, &e);
    if (!rc) rc = jinja_render(t, json_object_get(c, "context"), &lim, &out, &e);
    json_t *want = json_object_get(c, "output");
    json_t *error = json_object_get(c, "error");
    if (want) {
      CHECK_MSG(rc == 0, "case %zu %s: %s", i, src, e.msg);
      if (rc == 0) {
        bool same = out.len == json_string_length(want) && memcmp(hbuf_str(&out), json_string_value(want), out.len) == 0;
        CHECK_MSG(same, "case %zu %s:\n  got:  [%s]\n  want: [%s]", i, src, hbuf_str(&out), json_string_value(want));
        ok_outputs += same;
      }
    } else {
      CHECK_MSG(rc != 0, "case %zu %s: Jinja2 raised %s (%s) but we rendered [%s]", i, src,
                json_string_value(json_object_get(error, "type")), json_string_value(json_object_get(error, "message")),
                hbuf_str(&out));
      if (rc) {
        ok_errors++;
        const char *type = json_string_value(json_object_get(error, "type"));
        /* messages we reproduce word for word */
        if (!strcmp(type, "TemplateError") || !strcmp(type, "UndefinedError") || !strcmp(type, "SecurityError") ||
            !strcmp(type, "OverflowError")) {
          const char *msg = e.msg + jinja_error_prefix_len(&e);
          CHECK_MSG(!strcmp(msg, json_string_value(json_object_get(error, "message"))), "case %zu %s: '%s' != '%s'", i,
                    src, msg, json_string_value(json_object_get(error, "message")));
        }
      }
    }
    hbuf_free(&out);
    jinja_free(t);
  }
  fprintf(stderr, "%d outputs and %d errors as Jinja2\n", ok_outputs, ok_errors);
  json_decref(doc);
}

/* Seeded random templates (expressions, statements, whitespace control) rendered by Jinja2. */
static void test_random_cases_against_jinja2(void) {
  herr err = {0};
  json_t *doc = hjson_load_file(FIX "random_cases.json", &err);
  CHECK_MSG(doc != NULL, "%s", err.msg);
  if (!doc) return;
  jinja_limits lim = {.fixed_now = json_integer_value(json_object_get(doc, "now"))};
  json_t *ctx = json_object_get(doc, "context"), *cases = json_object_get(doc, "cases");
  size_t i;
  json_t *c;
  int same_outputs = 0, same_errors = 0, shown = 0;
  json_array_foreach(cases, i, c) {
    const char *src = json_string_value(json_object_get(c, "template"));
    jinja_template *t = NULL;
    herr e = {0};
    hbuf out = {0};
    int rc = jinja_parse(src, strlen(src), "random", &t, &e);
    if (!rc) rc = jinja_render(t, ctx, &lim, &out, &e);
    json_t *want = json_object_get(c, "output");
    bool ok;
    if (want) {
      ok = rc == 0 && out.len == json_string_length(want) && memcmp(hbuf_str(&out), json_string_value(want), out.len) == 0;
      same_outputs += ok;
    } else {
      ok = rc != 0;
      same_errors += ok;
    }
    if (!ok && shown++ < 10)
      fprintf(stderr, "random case %zu: %s\n  got:  %s\n  want: %s\n", i, src, rc ? e.msg : hbuf_str(&out),
              want ? json_string_value(want) : json_string_value(json_object_get(json_object_get(c, "error"), "message")));
    CHECK(ok);
    hbuf_free(&out);
    jinja_free(t);
  }
  fprintf(stderr, "%d outputs and %d errors as Jinja2 over %zu random templates\n", same_outputs, same_errors,
          json_array_size(cases));
  json_decref(doc);
}

static void test_hostile_templates(void) {
  hbuf out = {0};
  herr err = {0};
  /* unbounded macro recursion */
  int rc = render_str("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, NULL, &out, &err);
  CHECK_EQ_INT(rc, HEARTH_ELIMIT);
  CHECK(strstr(err.msg, "recursion") != NULL);
  hbuf_clear(&out);
  /* a huge range is refused like the sandbox refuses it */
  rc = render_str("{% for i in range(10**9) %}x{% endfor %}", NULL, NULL, &out, &err);
  CHECK(rc != 0);
  CHECK(strstr(err.msg, "Range too big") != NULL);
  hbuf_clear(&out);
  /* a printf precision of gigabytes (fuzz-found: it overflowed an int, then asked for 3.5 GB) */
  rc = render_str("{{ '%.6666666666f' % 1.5 }}", NULL, NULL, &out, &err);
  CHECK_EQ_INT(rc, HEARTH_ELIMIT);
  CHECK(strstr(err.msg, "precision") != NULL);
  hbuf_clear(&out);
  rc = render_str("{{ '%.3f' % 1.5 }}", NULL, NULL, &out, &err);
  CHECK_EQ_INT(rc, 0);
  CHECK_EQ_STR(hbuf_str(&out), "1.500");
  hbuf_clear(&out);
  /* gigabytes by string multiplication */
  rc = render_str("{{ 'x' * 4000000000 }}", NULL, NULL, &out, &err);
  CHECK_EQ_INT(rc, HEARTH_ELIMIT);
  hbuf_clear(&out);
  rc = render_str("{% set s = 'abcdefgh' * 1000 %}{% for i in range(100000) %}{{ s }}{% endfor %}", NULL, NULL, &out, &err);
  CHECK_EQ_INT(rc, HEARTH_ELIMIT);
  CHECK(strstr(err.msg, "output") != NULL);
  hbuf_clear(&out);
  /* doubling a string in a loop */
  rc = render_str("{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                  NULL, NULL, &out, &err);
  CHECK_EQ_INT(rc, HEARTH_ELIMIT);
  hbuf_clear(&out);
  /* nested loops past the iteration limit */
  jinja_limits lim = {.max_iterations = 1000};
  rc = render_str("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}", NULL, &lim, &out, &err);
  CHECK_EQ_INT(rc, HEARTH_ELIMIT);
  hbuf_clear(&out);
  /* total steps */
  jinja_limits steps = {.max_steps = 10000};
  rc = render_str("{% for i in range(5000) %}{{ i + i }}{% endfor %}", NULL, &steps, &out, &err);
  CHECK_EQ_INT(rc, HEARTH_ELIMIT);
  hbuf_clear(&out);
  /* memory */
  jinja_limits mem = {.max_memory = 1 << 20};
  rc = render_str("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [i] %}{% endfor %}", NULL,
                  &mem, &out, &err);
  CHECK_EQ_INT(rc, HEARTH_ELIMIT);
  hbuf_clear(&out);
  /* deep nesting in the source */
  hbuf deep = {0};
  for (int i = 0; i < 5000; i++) hbuf_puts(&deep, "{% if true %}");
  rc = render_str(hbuf_str(&deep), NULL, NULL, &out, &err);
  CHECK(rc != 0);
  hbuf_clear(&deep);
  hbuf_puts(&deep, "{{ ");
  for (int i = 0; i < 5000; i++) hbuf_puts(&deep, "(");
  rc = render_str(hbuf_str(&deep), NULL, NULL, &out, &err);
  CHECK(rc != 0);
  hbuf_clear(&deep);
  hbuf_puts(&deep, "{{ 1");
  for (int i = 0; i < 5000; i++) hbuf_puts(&deep, " + 1");
  hbuf_puts(&deep, " }}");
  rc = render_str(hbuf_str(&deep), NULL, NULL, &out, &err);
  CHECK_MSG(rc != 0 || strcmp(hbuf_str(&out), "5001") == 0, "%s", err.msg);
  hbuf_free(&deep);
  hbuf_free(&out);
}

static void test_error_lines(void) {
  hbuf out = {0};
  herr err = {0};
  int rc = render_str("line1\n{% if x %}\n{{ raise_exception('boom') }}\n{% endif %}", "{\"x\": true}", NULL, &out, &err);
  CHECK_EQ_INT(rc, HEARTH_EINVAL);
  CHECK_EQ_STR(err.msg, "t:3: boom");
  rc = render_str("a\nb\n{% for x in %}", NULL, NULL, &out, &err);
  CHECK_EQ_INT(rc, HEARTH_EFORMAT);
  CHECK(strncmp(err.msg, "t:3: ", 5) == 0);
  rc = render_str("\n\n\n{{ nope() }}", NULL, NULL, &out, &err);
  CHECK(rc != 0);
  CHECK_EQ_STR(err.msg, "t:4: 'nope' is undefined");
  CHECK_EQ_STR(err.msg + jinja_error_prefix_len(&err), "'nope' is undefined");
  hbuf_free(&out);
}

static void test_dict_order_and_json_values(void) {
  hbuf out = {0};
  herr err = {0};
  int rc = render_str("{% for k in d %}{{ k }}{% endfor %}{{ d|tojson }}{{ f }}{{ big }}",
                      "{\"d\": {\"z\": 1, \"a\": [1.5, null, true], \"m\": {}}, \"f\": 2.0, \"big\": 9007199254740993}",
                      NULL, &out, &err);
  CHECK_EQ_INT(rc, 0);
  CHECK_EQ_STR(hbuf_str(&out), "zam{\"z\": 1, \"a\": [1.5, null, true], \"m\": {}}2.09007199254740993");
  hbuf_free(&out);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

static void test_loader(void) {
  char dir[] = "/tmp/hearth_chat_test_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[512], jinja[512];
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  snprintf(jinja, sizeof jinja, "%s/chat_template.jinja", dir);
  /* a list of named templates: "default" wins; AddedToken bos; huge ints */
  write_file(path, "{\"model_max_length\": 1000000000000000019884624838656,"
                   "\"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<B>\"}, \"eos_token\": \"<E>\","
                   "\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
                   "{\"name\": \"default\", \"template\": \"{{ bos_token }}{{ messages[0].content }}{{ eos_token }}\"}]}");
  chat_template t;
  herr err = {0};
  int rc = chat_template_load(dir, &t, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (!rc) {
    CHECK_EQ_STR(t.bos, "<B>");
    CHECK_EQ_STR(t.eos, "<E>");
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}]", 0, NULL);
    hbuf out = {0};
    rc = chat_render(t.source, msgs, NULL, true, NULL, t.bos, t.eos, &out, &err);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_STR(hbuf_str(&out), "<B>hi<E>");
    hbuf_free(&out);
    json_decref(msgs);
    chat_template_free(&t);
  }
  /* chat_template.jinja in the folder wins */
  write_file(jinja, "J{{ add_generation_prompt }}{{ tools }}{{ enable_thinking }}\n");
  rc = chat_template_load(dir, &t, &err);
  CHECK_EQ_INT(rc, 0);
  if (!rc) {
    json_t *kw = json_loads("{\"enable_thinking\": false}", 0, NULL);
    hbuf out = {0};
    rc = chat_render(t.source, NULL, NULL, false, kw, t.bos, t.eos, &out, &err);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_STR(hbuf_str(&out), "JFalseNoneFalse");
    hbuf_free(&out);
    json_decref(kw);
    chat_template_free(&t);
  }
  /* a .jinja path directly */
  rc = chat_template_load(jinja, &t, &err);
  CHECK_EQ_INT(rc, 0);
  if (!rc) chat_template_free(&t);
  /* no template */
  unlink(jinja);
  write_file(path, "{\"eos_token\": \"x\"}");
  rc = chat_template_load(dir, &t, &err);
  CHECK_EQ_INT(rc, HEARTH_ENOTFOUND);
  unlink(path);
  rmdir(dir);
}

int main(void) {
  RUN(test_cases_against_jinja2);
  RUN(test_random_cases_against_jinja2);
  RUN(test_hostile_templates);
  RUN(test_error_lines);
  RUN(test_dict_order_and_json_values);
  RUN(test_loader);
  TEST_MAIN_END();
}
