/* test_named_templates.c — the chat templates hearth ships by name
 * (src/chat/templates, built in): each renders the conversations of
 * tests/fixtures/templates/named.json byte for byte as Python Jinja2 renders
 * its models' own template (tools/gen_named_templates.py checked the two
 * agree and wrote the text); the names are the fixture's; chat_template_use
 * takes a name, a file, and refuses anything else listing the names. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/json.h"
#include "chat/chat.h"
#include "test.h"

#define NAMED HEARTH_SOURCE_DIR "/tests/fixtures/templates/named.json"

static void test_renders_as_the_models_own(void) {
  herr err = {0};
  json_t *doc = hjson_load_file(NAMED, &err);
  CHECK_MSG(doc != NULL, "%s", err.msg);
  if (!doc) return;
  json_t *names = json_object_get(doc, "names"), *cases = json_object_get(doc, "cases");
  CHECK_EQ_INT((int)json_array_size(names), (int)chat_builtin_count());
  for (size_t i = 0; i < json_array_size(names); i++)
    CHECK_EQ_STR(chat_builtin_name(i), json_string_value(json_array_get(names, i)));
  CHECK(chat_builtin_name(chat_builtin_count()) == NULL);
  CHECK_MSG(json_array_size(cases) >= 6 * 10, "%zu cases", json_array_size(cases));
  size_t i;
  json_t *c;
  json_array_foreach(cases, i, c) {
    const char *name = json_string_value(json_object_get(c, "name"));
    const char *src = chat_builtin_template(name);
    CHECK_MSG(src != NULL, "no built-in template %s", name);
    if (!src) continue;
    hbuf out = {0};
    herr e = {0};
    int rc = chat_render(src, json_object_get(c, "messages"), NULL, json_is_true(json_object_get(c, "add_generation_prompt")),
                         NULL, json_string_value(json_object_get(c, "bos")), json_string_value(json_object_get(c, "eos")),
                         &out, &e);
    CHECK_MSG(rc == 0, "%s case %zu: %s", name, i, e.msg);
    const char *want = json_string_value(json_object_get(c, "output"));
    CHECK_MSG(!rc && out.len == strlen(want) && memcmp(out.data, want, out.len) == 0,
              "%s case %zu:\n  got  %.*s\n  want %s", name, i, (int)out.len, out.data ? out.data : "", want);
    hbuf_free(&out);
  }
  json_decref(doc);
}

static void test_name_or_file(void) {
  herr err = {0};
  chat_template t = {0};
  /* a name: the built-in source, bos/eos kept (none before: "") */
  CHECK_EQ_INT(chat_template_use(&t, "llama3", &err), 0);
  CHECK_EQ_STR(t.source, chat_builtin_template("llama3"));
  CHECK(strstr(t.origin, "llama3") != NULL);
  CHECK_EQ_STR(t.bos, "");
  /* a file, which also works where it is no name */
  char path[] = "/tmp/hearth_named_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd >= 0) {
    CHECK(write(fd, "{{ messages[0]['content'] }}", 28) == 28);
    close(fd);
    CHECK_EQ_INT(chat_template_use(&t, path, &err), 0);
    CHECK_EQ_STR(t.source, "{{ messages[0]['content'] }}");
    CHECK_EQ_STR(t.origin, path);
    unlink(path);
  }
  /* neither: refused, listing every name; t unchanged */
  char *before = strdup(t.source);
  CHECK_EQ_INT(chat_template_use(&t, "chatml2", &err), HEARTH_EINVAL);
  CHECK_MSG(strstr(err.msg, "chatml2") && strstr(err.msg, "chatml, deepseek3, gemma, llama3, mistral-v7, phi3"), "%s",
            err.msg);
  CHECK_EQ_STR(t.source, before);
  free(before);
  /* a path that is not there: the file's error, naming it */
  CHECK(chat_template_use(&t, "/no/such/template.jinja", &err) != 0);
  CHECK(strstr(err.msg, "/no/such/template.jinja") != NULL);
  chat_template_free(&t);
  /* every built-in template parses */
  for (size_t i = 0; i < chat_builtin_count(); i++) {
    jinja_template *jt = NULL;
    const char *src = chat_builtin_template(chat_builtin_name(i));
    CHECK_MSG(jinja_parse(src, strlen(src), chat_builtin_name(i), &jt, &err) == 0, "%s: %s", chat_builtin_name(i), err.msg);
    jinja_free(jt);
  }
}

int main(void) {
  RUN(test_renders_as_the_models_own);
  RUN(test_name_or_file);
  TEST_MAIN_END();
}
