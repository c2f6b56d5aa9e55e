/* test_forced.c — the grammars of forced tool calls (src/serve/forced.c): for
 * each call syntax, what a model writes after the forced opening is accepted
 * to the end (a call of a listed tool, arguments valid under its schema or
 * named from its properties, the close), and a call of an unlisted tool,
 * arguments off the schema or an unknown parameter are not. */
#include <jansson.h>

#include "engine/grammar.h"
#include "serve/forced.h"
#include "test.h"

static grammar_vocab *bytes_vocab(void) {
  static char b[256];
  const char *p[257];
  size_t l[257];
  for (int i = 0; i < 256; i++) b[i] = (char)i, p[i] = &b[i], l[i] = i ? 1 : 0;
  p[256] = "", l[256] = 0;
  grammar_vocab *v = NULL;
  CHECK(grammar_vocab_from_bytes(p, l, 257, &v, NULL) == 0);
  return v;
}

static json_t *tools(void) {
  return json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"],"
                    "\"additionalProperties\":false}}},"
                    "{\"type\":\"function\",\"function\":{\"name\":\"ping\"}}]",
                    0, NULL);
}

/* Whether the grammar of (fmt, name) takes text to a complete end. */
static bool takes(tc_format fmt, const char *name, const char *text) {
  json_t *t = tools();
  hbuf g = {0};
  bool made = serve_forced_grammar(fmt, t, name, &g);
  CHECK_MSG(made, "%s: no grammar", tc_format_name(fmt));
  grammar *gr = NULL;
  herr e = {0};
  bool ok = false;
  if (made && grammar_compile(hbuf_str(&g), g.len, &gr, &e) == 0) {
    grammar_vocab *v = bytes_vocab();
    grammar_matcher *m = NULL;
    int32_t end = 256;
    if (grammar_matcher_new(gr, v, &end, 1, &m, &e) == 0)
      ok = grammar_matcher_accept_text(m, text, strlen(text), &e) == 0 && grammar_matcher_can_end(m);
    grammar_matcher_free(m);
    grammar_vocab_free(v);
  } else if (made) {
    CHECK_MSG(false, "%s: %s\n%s", tc_format_name(fmt), e.msg, hbuf_str(&g));
  }
  grammar_free(gr);
  hbuf_free(&g);
  json_decref(t);
  return ok;
}

static void test_json_syntaxes(void) {
  /* hermes: after `<tool_call>\n{"name": "` */
  CHECK(takes(TC_HERMES, NULL, "get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>"));
  CHECK(takes(TC_HERMES, NULL, "ping\", \"arguments\": {}}\n</tool_call>"));
  CHECK(!takes(TC_HERMES, NULL, "get_time\", \"arguments\": {}}\n</tool_call>"));       /* not a tool */
  CHECK(!takes(TC_HERMES, NULL, "get_weather\", \"arguments\": {\"days\": 3}}\n</tool_call>")); /* city required */
  CHECK(!takes(TC_HERMES, NULL, "get_weather\", \"arguments\": {\"city\": 5}}\n</tool_call>"));
  /* named: after `..."arguments": ` */
  CHECK(takes(TC_HERMES, "get_weather", "{\"city\":\"Oslo\"}}\n</tool_call>"));
  CHECK(!takes(TC_HERMES, "get_weather", "{\"city\":\"Oslo\",\"x\":1}}\n</tool_call>"));
  /* llama3: "parameters", no close tag */
  CHECK(takes(TC_LLAMA3, NULL, "get_weather\", \"parameters\": {\"city\": \"Rome\"}}"));
  CHECK(!takes(TC_LLAMA3, NULL, "get_weather\", \"arguments\": {\"city\": \"Rome\"}}"));
  /* mistral: after `[TOOL_CALLS][{"name": "`, a list of one call */
  CHECK(takes(TC_MISTRAL, NULL, "get_weather\", \"arguments\": {\"city\": \"Rome\", \"days\": 2}}]"));
  CHECK(!takes(TC_MISTRAL, NULL, "get_weather\", \"arguments\": {\"city\": \"Rome\"}}"));
}

static void test_xml_syntaxes(void) {
  /* qwen3_coder: after `<tool_call>\n<function=` */
  CHECK(takes(TC_QWEN3_CODER, NULL,
              "get_weather>\n<parameter=city>\nParis <b>\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"));
  CHECK(takes(TC_QWEN3_CODER, "get_weather", "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"));
  CHECK(!takes(TC_QWEN3_CODER, NULL, "get_time>\n</function>\n</tool_call>"));
  CHECK(!takes(TC_QWEN3_CODER, NULL, "get_weather>\n<parameter=town>\nParis\n</parameter>\n</function>\n</tool_call>"));
  CHECK(takes(TC_QWEN3_CODER, NULL, "ping>\n</function>\n</tool_call>"));
  /* glm: after `<tool_call>` */
  CHECK(takes(TC_GLM, NULL, "get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"));
  CHECK(takes(TC_GLM, NULL, "get_weather\n<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"));
  CHECK(!takes(TC_GLM, NULL, "get_weather\n<arg_key>town</arg_key><arg_value>Paris</arg_value></tool_call>"));
  /* formats without a grammar here say so */
  json_t *t = tools();
  hbuf g = {0};
  CHECK(!serve_forced_grammar(TC_DEEPSEEK, t, NULL, &g) && g.len == 0);
  CHECK(!serve_forced_grammar(TC_HERMES, NULL, NULL, &g));
  json_decref(t);
}

int main(void) {
  RUN(test_json_syntaxes);
  RUN(test_xml_syntaxes);
  TEST_MAIN_END();
}
