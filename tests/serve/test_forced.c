/* test_forced.c — the grammars of forced tool calls (src/serve/forced.c): for
 * each call syntax, what a model writes after the forced opening is accepted
 * to the end (a call of a listed tool, arguments valid under its schema or
 * named from its properties, the close), and a call of an unlisted tool,
 * arguments off the schema or an unknown parameter are not. */
#include <jansson.h>

#include "structured/grammar.h"
#include "serve/forced.h"
#include "test.h"

/* Whole-token markers after the 256 byte tokens: DeepSeek's (tokens with
 * bytes, as its tokenizer has them) and harmony's / Gemma 4's (special: no
 * bytes, named), then the end token. */
static const char *markers[] = {"<\uff5ctool\u2581sep\uff5c>", "<\uff5ctool\u2581call\u2581begin\uff5c>",
                                "<\uff5ctool\u2581call\u2581end\uff5c>", "<\uff5ctool\u2581calls\u2581end\uff5c>",
                                "<|constrain|>", "<|message|>", "<|call|>", "<tool_call|>", "<|\"|>"};
#define N_MARK ((int)(sizeof markers / sizeof *markers))
#define N_BYTES_MARK 4
#define END_TOK (256 + N_MARK)

static grammar_vocab *bytes_vocab(void) {
  static char b[256];
  const char *p[END_TOK + 1];
  size_t l[END_TOK + 1];
  for (int i = 0; i < 256; i++) b[i] = (char)i, p[i] = &b[i], l[i] = i ? 1 : 0;
  for (int i = 0; i < N_MARK; i++) p[256 + i] = markers[i], l[256 + i] = i < N_BYTES_MARK ? strlen(markers[i]) : 0;
  p[END_TOK] = "", l[END_TOK] = 0;
  grammar_vocab *v = NULL;
  CHECK(grammar_vocab_from_bytes(p, l, END_TOK + 1, &v, NULL) == 0);
  for (int i = N_BYTES_MARK; i < N_MARK; i++) CHECK(grammar_vocab_name(v, 256 + i, markers[i], NULL) == 0);
  return v;
}

/* Feeds text as tokens: each marker as its one token, everything else byte by byte. */
static bool feed(grammar_matcher *m, const char *text) {
  herr e = {0};
  for (size_t i = 0, n = strlen(text); i < n;) {
    int id = (unsigned char)text[i], len = 1;
    for (int k = 0; k < N_MARK; k++)
      if (!strncmp(text + i, markers[k], strlen(markers[k]))) id = 256 + k, len = (int)strlen(markers[k]);
    if (grammar_matcher_accept(m, id, &e)) return false;
    i += (size_t)len;
  }
  return true;
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
    int32_t end = END_TOK;
    if (grammar_matcher_new(gr, v, &end, 1, &m, &e) == 0) ok = feed(m, text) && grammar_matcher_can_end(m);
    else CHECK_MSG(false, "%s: %s", tc_format_name(fmt), e.msg);
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
  /* generic: after `{"tool_calls": [{"name": "`, one call and the close */
  CHECK(takes(TC_GENERIC, NULL, "get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}]}"));
  CHECK(takes(TC_GENERIC, "ping", "{}}]}"));
  CHECK(!takes(TC_GENERIC, NULL, "get_weather\", \"arguments\": {\"town\": \"Paris\"}}]}"));
  CHECK(!takes(TC_GENERIC, NULL, "get_time\", \"arguments\": {}}]}"));
  CHECK(!takes(TC_GENERIC, NULL, "ping\", \"arguments\": {}}]"));
  /* formats without a grammar here say so */
  json_t *t = tools();
  hbuf g = {0};
  CHECK(!serve_forced_grammar(TC_NONE, t, NULL, &g) && g.len == 0);
  CHECK(!serve_forced_grammar(TC_HERMES, NULL, NULL, &g));
  json_decref(t);
}

/* Syntaxes whose markers are tokens of their own. */
static void test_marker_syntaxes(void) {
#define SEP "<\uff5ctool\u2581sep\uff5c>"
#define CB "<\uff5ctool\u2581call\u2581begin\uff5c>"
#define CE "<\uff5ctool\u2581call\u2581end\uff5c>"
#define CSE "<\uff5ctool\u2581calls\u2581end\uff5c>"
  /* deepseek: after `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>`, either generation's form */
  CHECK(takes(TC_DEEPSEEK, NULL, "function" SEP "get_weather\n```json\n{\"city\": \"Paris\"}\n```" CE CSE));
  CHECK(takes(TC_DEEPSEEK, NULL, "get_weather" SEP "{\"city\": \"Paris\", \"days\": 2}" CE CB "ping" SEP "{}" CE CSE));
  CHECK(takes(TC_DEEPSEEK, "ping", "ping" SEP "{}" CE CSE));
  CHECK(!takes(TC_DEEPSEEK, "ping", "ping" SEP "{}" CE CB "ping" SEP "{}" CE CSE)); /* named: one call */
  CHECK(!takes(TC_DEEPSEEK, NULL, "get_weather" SEP "{\"town\": \"Paris\"}" CE CSE));
  CHECK(!takes(TC_DEEPSEEK, NULL, "get_time" SEP "{}" CE CSE));
  /* the markers spelled out in bytes are not the marker tokens */
  {
    json_t *t = tools();
    hbuf g = {0};
    grammar *gr = NULL;
    grammar_vocab *v = bytes_vocab();
    grammar_matcher *m = NULL;
    int32_t end = END_TOK;
    CHECK(serve_forced_grammar(TC_DEEPSEEK, t, "ping", &g) && grammar_compile(hbuf_str(&g), g.len, &gr, NULL) == 0);
    CHECK(gr && grammar_matcher_new(gr, v, &end, 1, &m, NULL) == 0 && feed(m, "ping"));
    CHECK(m && grammar_matcher_allows(m, 256) && !grammar_matcher_allows(m, '<'));
    grammar_matcher_free(m);
    grammar_vocab_free(v);
    grammar_free(gr);
    hbuf_free(&g);
    json_decref(t);
  }
  /* harmony: after `<|channel|>commentary to=functions.` */
  CHECK(takes(TC_HARMONY, NULL, "get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}"));
  CHECK(takes(TC_HARMONY, NULL, "ping<|message|>{}"));
  CHECK(takes(TC_HARMONY, "get_weather", " <|constrain|>json<|message|>{\"city\": \"Oslo\", \"days\": 1}"));
  CHECK(!takes(TC_HARMONY, NULL, "get_weather <|constrain|>json<|message|>{\"days\": 1}"));
  CHECK(!takes(TC_HARMONY, NULL, "get_weather <constrain>json<|message|>{\"city\": \"x\"}"));
  /* gemma4: after `<|tool_call>call:` */
  CHECK(takes(TC_GEMMA4, NULL, "get_weather{city:<|\"|>Paris, \"FR\"<|\"|>,days:3}<tool_call|>"));
  CHECK(takes(TC_GEMMA4, NULL, "ping{}<tool_call|>"));
  CHECK(takes(TC_GEMMA4, "get_weather", "city:<|\"|>Rome<|\"|>}<tool_call|>"));
  CHECK(takes(TC_GEMMA4, NULL, "ping{a:[1,-2.5e3,{b:null}],c:true}<tool_call|>"));
  CHECK(!takes(TC_GEMMA4, NULL, "get_weather{town:<|\"|>Paris<|\"|>}<tool_call|>"));
  CHECK(!takes(TC_GEMMA4, NULL, "get_time{}<tool_call|>"));
  CHECK(!takes(TC_GEMMA4, NULL, "get_weather{city:Paris}<tool_call|>"));
}

int main(void) {
  RUN(test_json_syntaxes);
  RUN(test_marker_syntaxes);
  RUN(test_xml_syntaxes);
  TEST_MAIN_END();
}
