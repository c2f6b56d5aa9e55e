/* test_toolcall.c — tool-call and reasoning parsing per model family: format
 * detection on real chat templates, canned replies fed whole, split at every
 * byte position and byte by byte (the concatenated events must agree), and
 * what malformed and cut-off replies give. */
#include <jansson.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "chat/chat.h"
#include "chat/toolcall.h"
#include "test.h"

/* ---- running a parser over pieces ---- */

typedef struct result {
  hbuf content, reasoning;
  bool any_reasoning;
  json_t *calls; /* [{"name": s, "arguments": s}] */
  hbuf args;
  bool in_call;
  int index;
  int bad; /* event order violations */
} result;

static int on_event(void *ctx, const tc_event *ev) {
  result *r = ctx;
  switch (ev->kind) {
    case TC_TEXT:
      if (r->in_call || !ev->len) r->bad++;
      hbuf_append(&r->content, ev->text, ev->len);
      break;
    case TC_REASONING:
      if (r->in_call || !ev->len) r->bad++;
      r->any_reasoning = true;
      hbuf_append(&r->reasoning, ev->text, ev->len);
      break;
    case TC_CALL_BEGIN:
      if (r->in_call || ev->index != r->index || !ev->name) r->bad++;
      r->in_call = true;
      json_array_append_new(r->calls, json_pack("{s:s}", "name", ev->name ? ev->name : ""));
      hbuf_clear(&r->args);
      break;
    case TC_CALL_ARGS:
      if (!r->in_call || ev->index != r->index || !ev->len) r->bad++;
      hbuf_append(&r->args, ev->text, ev->len);
      break;
    case TC_CALL_END:
      if (!r->in_call || ev->index != r->index) r->bad++;
      r->in_call = false;
      r->index++;
      json_object_set_new(json_array_get(r->calls, json_array_size(r->calls) - 1), "arguments",
                          json_stringn(hbuf_str(&r->args), r->args.len));
      break;
  }
  return 0;
}

static void result_free(result *r) {
  hbuf_free(&r->content);
  hbuf_free(&r->reasoning);
  hbuf_free(&r->args);
  json_decref(r->calls);
}

/* Feeds text in pieces ending at cuts[0..ncuts) (then the rest). */
static void run_pieces(const tc_opts *o, const char *text, size_t len, const size_t *cuts, size_t ncuts, result *r) {
  memset(r, 0, sizeof *r);
  r->calls = json_array();
  tc_parser *p;
  herr err = {0};
  CHECK(tc_parser_new(o, &p, &err) == 0);
  size_t at = 0;
  for (size_t i = 0; i <= ncuts; i++) {
    size_t end = i < ncuts ? cuts[i] : len;
    CHECK(tc_parser_feed(p, text + at, end - at, on_event, r, &err) == 0);
    at = end;
  }
  CHECK(tc_parser_finish(p, on_event, r, &err) == 0);
  if (r->in_call) r->bad++;
  CHECK_EQ_INT(tc_parser_calls(p), (long long)json_array_size(r->calls));
  tc_parser_free(p);
}

static bool same_result(const result *a, const result *b) {
  return a->content.len == b->content.len && !memcmp(hbuf_str(&a->content), hbuf_str(&b->content), a->content.len) &&
         a->reasoning.len == b->reasoning.len &&
         !memcmp(hbuf_str(&a->reasoning), hbuf_str(&b->reasoning), a->reasoning.len) &&
         a->any_reasoning == b->any_reasoning && json_equal(a->calls, b->calls);
}

/* Runs text whole, then split once at every position, then byte by byte: all must agree.
 * Fills *whole. */
static void run_all_splits(const tc_opts *o, const char *text, result *whole, const char *label) {
  size_t len = strlen(text);
  run_pieces(o, text, len, NULL, 0, whole);
  CHECK_MSG(whole->bad == 0, "%s: events out of order", label);
  for (size_t k = 1; k < len; k++) {
    result r;
    run_pieces(o, text, len, &k, 1, &r);
    CHECK_MSG(same_result(whole, &r) && r.bad == 0, "%s: split at %zu differs (content \"%s\" vs \"%s\")", label, k,
              hbuf_str(&r.content), hbuf_str(&whole->content));
    result_free(&r);
  }
  size_t *cuts = malloc(len * sizeof *cuts);
  for (size_t k = 0; k < len; k++) cuts[k] = k + 1;
  result r;
  run_pieces(o, text, len, cuts, len ? len - 1 : 0, &r);
  CHECK_MSG(same_result(whole, &r) && r.bad == 0, "%s: byte-by-byte differs", label);
  result_free(&r);
  free(cuts);
}

/* want_calls: a JSON array of {"name", "arguments": object}; the arguments text must parse
 * (jansson default flags) to an object equal to it. want_reasoning NULL: no reasoning events. */
static void expect(tc_format f, bool tools, bool reasoning, bool in_reasoning, const char *text,
                   const char *want_content, const char *want_reasoning, const char *want_calls) {
  tc_opts o = {.format = f, .tools = tools, .reasoning = reasoning, .in_reasoning = in_reasoning};
  char label[160];
  snprintf(label, sizeof label, "%s: %.100s", tc_format_name(f), text);
  result r;
  run_all_splits(&o, text, &r, label);
  CHECK_MSG(!strcmp(hbuf_str(&r.content), want_content), "%s\n  content: got \"%s\" want \"%s\"", label,
            hbuf_str(&r.content), want_content);
  if (want_reasoning) {
    CHECK_MSG(r.any_reasoning && !strcmp(hbuf_str(&r.reasoning), want_reasoning),
              "%s\n  reasoning: got \"%s\" want \"%s\"", label, hbuf_str(&r.reasoning), want_reasoning);
  } else {
    CHECK_MSG(!r.any_reasoning, "%s\n  unexpected reasoning \"%s\"", label, hbuf_str(&r.reasoning));
  }
  json_error_t je;
  json_t *want = json_loads(want_calls, 0, &je);
  CHECK_MSG(want != NULL, "bad expectation %s: %s", want_calls, je.text);
  size_t n = json_array_size(r.calls);
  CHECK_MSG(n == json_array_size(want), "%s\n  %zu calls, want %zu", label, n, json_array_size(want));
  for (size_t i = 0; i < n && i < json_array_size(want); i++) {
    json_t *got = json_array_get(r.calls, i), *w = json_array_get(want, i);
    const char *name = json_string_value(json_object_get(got, "name"));
    const char *args = json_string_value(json_object_get(got, "arguments"));
    CHECK_MSG(name && !strcmp(name, json_string_value(json_object_get(w, "name"))), "%s\n  call %zu name %s", label,
              i, name ? name : "(null)");
    json_t *a = args ? json_loads(args, 0, &je) : NULL;
    CHECK_MSG(json_is_object(a), "%s\n  call %zu arguments not a JSON object: %s", label, i, args ? args : "(null)");
    CHECK_MSG(a && json_equal(a, json_object_get(w, "arguments")), "%s\n  call %zu arguments %s", label, i,
              args ? args : "(null)");
    json_decref(a);
  }
  json_decref(want);
  result_free(&r);
}

#define T true
#define F false

/* ---- detection ---- */

static char *llama_cpp_template(const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/llama.cpp/templates/%s", HEARTH_DEPS_DIR, name);
  char *src = NULL;
  size_t len;
  herr err = {0};
  if (hfile_read(path, &src, &len, &err)) return NULL;
  return src;
}

static void test_detect_llama_cpp(void) {
  static const struct {
    const char *file;
    tc_format want;
  } cases[] = {
      {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", TC_HERMES},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", TC_HERMES},
      {"Qwen-Qwen2.5-7B-Instruct.jinja", TC_HERMES},
      {"meta-llama-Llama-3.1-8B-Instruct.jinja", TC_LLAMA3},
      {"meta-llama-Llama-3.2-3B-Instruct.jinja", TC_LLAMA3},
      {"meta-llama-Llama-3.3-70B-Instruct.jinja", TC_LLAMA3},
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", TC_MISTRAL},
      {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", TC_DEEPSEEK},
      {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", TC_DEEPSEEK},
      {"llama-cpp-deepseek-r1.jinja", TC_DEEPSEEK},
      {"google-gemma-2-2b-it.jinja", TC_NONE},
      {"microsoft-Phi-3.5-mini-instruct.jinja", TC_NONE},
      {"CohereForAI-c4ai-command-r-plus-tool_use.jinja", TC_NONE},
      {"meetkai-functionary-medium-v3.1.jinja", TC_NONE},
      {"meetkai-functionary-medium-v3.2.jinja", TC_NONE},
      {"fireworks-ai-llama-3-firefunction-v2.jinja", TC_NONE},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *src = llama_cpp_template(cases[i].file);
    CHECK_MSG(src != NULL, "template %s not found", cases[i].file);
    if (!src) continue;
    tc_format got = tc_format_detect(src);
    CHECK_MSG(got == cases[i].want, "%s: detected %s, want %s", cases[i].file, tc_format_name(got),
              tc_format_name(cases[i].want));
    free(src);
  }
}

static void test_detect_deps(void) {
  test_need_tokenizers();
  static const struct {
    const char *name;
    tc_format want;
  } cases[] = {{"qwen3", TC_HERMES}, {"llama3_1", TC_LLAMA3}, {"deepseek_v3", TC_DEEPSEEK}, {"gemma3", TC_NONE}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizers/%s", HEARTH_DEPS_DIR, cases[i].name);
    chat_template t;
    herr err = {0};
    int rc = chat_template_load(path, &t, &err);
    CHECK_MSG(rc == 0, "%s: %s", cases[i].name, err.msg);
    if (rc) continue;
    tc_format got = tc_format_detect(t.source);
    CHECK_MSG(got == cases[i].want, "%s: detected %s, want %s", cases[i].name, tc_format_name(got),
              tc_format_name(cases[i].want));
    chat_template_free(&t);
  }
  /* gpt-oss ships its template apart from tokenizer_config.json: none there */
  char path[4096];
  snprintf(path, sizeof path, "%s/tokenizers/gptoss", HEARTH_DEPS_DIR);
  chat_template t;
  herr err = {0};
  if (chat_template_load(path, &t, &err) == 0) {
    CHECK_EQ_INT(tc_format_detect(t.source), TC_HARMONY);
    chat_template_free(&t);
  }
}

/* ---- round trip through real templates ----
 * A template's own rendering of an assistant tool call (the conversation with
 * the call, minus the same conversation up to the generation prompt) is what
 * a model trained on it writes: the parser of the detected format must read
 * the call back, name and arguments. */
static void roundtrip(const char *what, const char *src, const char *bos, const char *eos) {
  tc_format fmt = tc_format_detect(src);
  json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\","
                             "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
                             "\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}}}]", 0, NULL);
  json_t *user = json_loads("[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]", 0, NULL);
  /* content null beside the calls, as OpenAI clients send it (and as the server renders a turn of only calls) */
  json_t *both = json_loads("[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},{\"role\":\"assistant\",\"content\":null,"
                            "\"tool_calls\":[{\"id\":\"abcdef123\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                            "\"arguments\":{\"city\":\"Paris\",\"days\":3}}}]}]", 0, NULL);
  chat_apply_call_shape(both, chat_tool_call_shape(src, bos, eos)); /* as hearth_chat_render does */
  hbuf p1 = {0}, p2 = {0};
  herr err = {0};
  int rc1 = chat_render(src, user, tools, true, NULL, bos, eos, &p1, &err);
  CHECK_MSG(rc1 == 0, "%s: %s", what, err.msg);
  int rc2 = rc1 ? rc1 : chat_render(src, both, tools, false, NULL, bos, eos, &p2, &err);
  CHECK_MSG(rc2 == 0, "%s: %s", what, err.msg);
  bool opens = !rc1 && tc_prompt_opens_reasoning(p1.data, p1.len);
  /* a generation prompt that opens a reasoning block the history leaves out
   * (DeepSeek-R1's "<think>\n", or "<think>\n</think>" with thinking off): the
   * call follows the prompt without it */
  size_t keep = p1.len;
  if (!rc1 && !(p2.len >= p1.len && memcmp(p1.data, p2.data, p1.len) == 0)) {
    const char *think = strstr(p1.data + (p1.len > 32 ? p1.len - 32 : 0), "<think>");
    if (think) keep = (size_t)(think - p1.data), opens = false;
  }
  bool prefix = !rc1 && !rc2 && p2.len >= keep && memcmp(p1.data, p2.data, keep) == 0;
  CHECK_MSG(prefix, "%s: the conversation with the call does not start with the prompt", what);
  if (prefix) {
    const char *reply = p2.data + keep;
    tc_opts o = {.format = fmt, .tools = true, .reasoning = true, .in_reasoning = opens};
    char *content = NULL;
    json_t *calls = NULL;
    CHECK(tc_parse_all(&o, reply, strlen(reply), &content, NULL, &calls, &err) == 0);
    CHECK_MSG(json_array_size(calls) == 1, "%s (%s): %zu calls in '%s'", what, tc_format_name(fmt), json_array_size(calls),
              reply);
    json_t *c = json_array_get(calls, 0);
    if (c) {
      CHECK_EQ_STR(json_string_value(json_object_get(c, "name")), "get_weather");
      json_t *args = json_loads(json_string_value(json_object_get(c, "arguments")), 0, NULL);
      json_t *want = json_loads("{\"city\":\"Paris\",\"days\":3}", 0, NULL);
      CHECK_MSG(json_equal(args, want), "%s: arguments %s", what, json_string_value(json_object_get(c, "arguments")));
      json_decref(args);
      json_decref(want);
    }
    CHECK_MSG(content && content[strspn(content, " \n")] == 0, "%s: content '%s' besides the call", what, content);
    free(content);
    json_decref(calls);
  }
  hbuf_free(&p1);
  hbuf_free(&p2);
  json_decref(tools);
  json_decref(user);
  json_decref(both);
}

static void test_roundtrip_templates(void) {
  static const char *files[] = {
      "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
      "Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja",
      "meta-llama-Llama-3.3-70B-Instruct.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja",
      "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
      /* (not llama-cpp-deepseek-r1.jinja: it passes a generator to tojson, which Jinja2 refuses too) */
  };
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char *src = llama_cpp_template(files[i]);
    CHECK_MSG(src != NULL, "template %s not found", files[i]);
    if (src) roundtrip(files[i], src, "<s>", "</s>");
    free(src);
  }
  test_need_tokenizers();
  /* (the llama3_1 package's template writes no tool calls; llama.cpp's Llama 3.x ones above do) */
  static const char *deps[] = {"qwen3", "deepseek_v3"};
  for (size_t i = 0; i < sizeof deps / sizeof deps[0]; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizers/%s", HEARTH_DEPS_DIR, deps[i]);
    chat_template t;
    herr err = {0};
    int rc = chat_template_load(path, &t, &err);
    CHECK_MSG(rc == 0, "%s: %s", deps[i], err.msg);
    if (rc) continue;
    roundtrip(deps[i], t.source, t.bos, t.eos);
    chat_template_free(&t);
  }
}

static void test_detect_snippets(void) {
  /* the distinctive parts of templates not kept locally */
  CHECK_EQ_INT(tc_format_detect("{{- '<|start|>assistant<|channel|>commentary to=functions.' + name + "
                                "' <|constrain|>json<|message|>' + args + '<|call|>' }}"),
               TC_HARMONY);
  CHECK_EQ_INT(tc_format_detect("{{- '<|tool_call>call:' + name + '{' }}{{- key + ':<|\"|>' + v + '<|\"|>' }}"),
               TC_GEMMA4);
  CHECK_EQ_INT(tc_format_detect("{{- '<tool_call>\\n<function=' + name + '>\\n' }}{{- '<parameter=' + k + '>\\n' }}"),
               TC_QWEN3_CODER);
  CHECK_EQ_INT(tc_format_detect("{{ '<tool_call>' + tc.name }}{% for k, v in args %}<arg_key>{{ k }}</arg_key>"
                                "<arg_value>{{ v }}</arg_value>{% endfor %}</tool_call>"),
               TC_GLM);
  CHECK_EQ_INT(tc_format_detect("{{ '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + name + '<｜tool▁sep｜>' }}"),
               TC_DEEPSEEK);
  CHECK_EQ_INT(tc_format_detect("{{ '[TOOL_CALLS]' + name + '[ARGS]' + args }}"), TC_MISTRAL);
  CHECK_EQ_INT(tc_format_detect("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"), TC_NONE);
  CHECK_EQ_INT(tc_format_detect(NULL), TC_NONE);
  for (int f = 0; f < TC_FORMAT_COUNT; f++) CHECK_EQ_INT(tc_format_from_name(tc_format_name((tc_format)f)), f);
  CHECK_EQ_INT(tc_format_from_name("nope"), -1);
  CHECK_EQ_STR(tc_format_name(TC_QWEN3_CODER), "qwen3_coder");
}

static void test_prompt_opens_reasoning(void) {
  const char *open = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n";
  const char *closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
  const char *plain = "<|im_start|>assistant\n";
  CHECK(tc_prompt_opens_reasoning(open, strlen(open)));
  CHECK(!tc_prompt_opens_reasoning(closed, strlen(closed)));
  CHECK(!tc_prompt_opens_reasoning(plain, strlen(plain)));
  CHECK(tc_prompt_opens_reasoning("<｜Assistant｜><think>\n", strlen("<｜Assistant｜><think>\n")));
  CHECK(!tc_prompt_opens_reasoning("", 0));
}

/* ---- families ---- */

static void test_hermes(void) {
  tc_format h = TC_HERMES;
  expect(h, T, T, F, "Hello there.", "Hello there.", NULL, "[]");
  expect(h, T, T, F,
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>", "",
         NULL, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}]");
  expect(h, T, T, F,
         "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", "
         "\"arguments\": {\"x\": [1, {\"y\": null}]}}\n</tool_call><|im_end|>",
         "", NULL, "[{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"x\": [1, {\"y\": null}]}}]");
  expect(h, T, T, F, "Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}\n</tool_call>",
         "Let me check.", NULL, "[{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}]");
  /* Qwen3: reasoning, then a call */
  expect(h, T, T, F,
         "<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
         "{\"city\": \"Paris\"}}\n</tool_call>",
         "", "The user wants weather.", "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]");
  /* the prompt opened <think> */
  expect(h, T, T, T, "Short thought.\n</think>\n\nThe answer is 4.", "The answer is 4.", "Short thought.", "[]");
  /* reasoning off: think tags are text */
  expect(h, T, F, F, "<think>x</think>hi", "<think>x</think>hi", NULL, "[]");
  /* tools off: call syntax is text */
  expect(h, F, T, F, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
         "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>", NULL, "[]");
  /* the model's whitespace, raw control characters and escapes inside arguments */
  expect(h, T, T, F,
         "<tool_call>\n  {  \"name\" : \"f\" ,\n \"arguments\" :\n {\n \"s\" : \"caf\xc3\xa9 \\u00e9 a\tb\" , \"n\": "
         "-1.5e3 } }  \n</tool_call>",
         "", NULL, "[{\"name\": \"f\", \"arguments\": {\"s\": \"caf\xc3\xa9 \xc3\xa9 a\\tb\", \"n\": -1500.0}}]");
  /* arguments before the name; arguments as a JSON string; "parameters" */
  expect(h, T, T, F, "<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call>", "", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"a\": 1}}]");
  expect(h, T, T, F, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": [true]}\"}</tool_call>", "", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"a\": [true]}}]");
  expect(h, T, T, F, "<tool_call>{\"name\": \"f\", \"parameters\": {\"a\": 1}}</tool_call>", "", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"a\": 1}}]");
  /* held-back text that was no marker, end-of-turn specials dropped */
  expect(h, T, T, F, "a <tool and <think", "a <tool and <think", NULL, "[]");
  expect(h, T, T, F, "Hi<|im_end|>", "Hi", NULL, "[]");
}

static void test_hermes_malformed(void) {
  tc_format h = TC_HERMES;
  /* not a call: given back as text */
  expect(h, T, T, F, "<tool_call>\nnot json at all\n</tool_call>", "<tool_call>\nnot json at all\n</tool_call>", NULL,
         "[]");
  expect(h, T, T, F, "Use <tool_call> tags.", "Use <tool_call> tags.", NULL, "[]");
  expect(h, T, T, F, "<tool_call>{\"nam\": 1}</tool_call> ok", "<tool_call>{\"nam\": 1}</tool_call> ok", NULL, "[]");
  expect(h, T, T, F, "<tool_call>{\"name\": 7, \"arguments\": {}}</tool_call>",
         "<tool_call>{\"name\": 7, \"arguments\": {}}</tool_call>", NULL, "[]");
  /* invalid JSON once the call began: ended with what was valid, the rest of the block dropped */
  expect(h, T, T, F, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": tru}}</tool_call>after", "after",
         NULL, "[{\"name\": \"f\", \"arguments\": {\"a\": 1}}]");
  expect(h, T, T, F, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"x\"}</tool_call>then", "then", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"a\": \"x\"}}]");
  /* a second call after a malformed first one is still found */
  expect(h, T, T, F,
         "<tool_call>oops!</tool_call>\n<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>",
         "<tool_call>oops!</tool_call>", NULL, "[{\"name\": \"g\", \"arguments\": {}}]");
}

static void test_hermes_cut(void) {
  tc_format h = TC_HERMES;
  expect(h, T, T, F, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par", "", NULL,
         "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par\"}}]");
  expect(h, T, T, F, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, {\"b\": \"c\\u00", "", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"a\": [1, {\"b\": \"c\"}]}}]");
  expect(h, T, T, F, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 12", "", NULL,
         "[{\"name\": \"f\", \"arguments\": {}}]");
  expect(h, T, T, F, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 12, \"b", "", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"a\": 12}}]");
  /* the name is known, the arguments never started */
  expect(h, T, T, F, "<tool_call>\n{\"name\": \"get_weather\", \"argu", "", NULL,
         "[{\"name\": \"get_weather\", \"arguments\": {}}]");
  /* the name is not complete: text */
  expect(h, T, T, F, "Sure <tool_call>\n{\"name\": \"get_w", "Sure <tool_call>\n{\"name\": \"get_w", NULL, "[]");
  expect(h, T, T, F, "Sure <tool_c", "Sure <tool_c", NULL, "[]");
  /* cut in reasoning */
  expect(h, T, T, F, "<think>still thinking", "", "still thinking", "[]");
}

static void test_qwen3_coder(void) {
  tc_format q = TC_QWEN3_CODER;
  expect(q, T, T, F,
         "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
         "</parameter>\n</function>\n</tool_call>",
         "", NULL, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}]");
  expect(q, T, T, F,
         "I'll write it.\n<tool_call>\n<function=write>\n<parameter=code>\ndef f():\n    return \"x\"\n\n</parameter>\n"
         "<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=flag>\ntrue\n</parameter>\n<parameter=arg>\n-rf "
         "/tmp\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=noargs>\n</function>\n</tool_call>",
         "I'll write it.", NULL,
         "[{\"name\": \"write\", \"arguments\": {\"code\": \"def f():\\n    return \\\"x\\\"\\n\", \"opts\": {\"a\": [1, 2]}, "
         "\"flag\": true, \"arg\": \"-rf /tmp\"}}, {\"name\": \"noargs\", \"arguments\": {}}]");
  /* Qwen3.5: reasoning then a call; the JSON body is accepted too */
  expect(q, T, T, T,
         "Need a tool.\n</think>\n\n<tool_call>\n<function=f>\n<parameter=x>\n1.5\n</parameter>\n</function>\n"
         "</tool_call>",
         "", "Need a tool.", "[{\"name\": \"f\", \"arguments\": {\"x\": 1.5}}]");
  expect(q, T, T, F, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>", "", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"x\": 1}}]");
  /* a bare <function=...> and a missing </parameter> */
  expect(q, T, T, F, "<function=f>\n<parameter=a>\nx\n<parameter=b>\ny\n</function>", "", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"a\": \"x\", \"b\": \"y\"}}]");
  /* cut off inside a value, inside the name */
  expect(q, T, T, F, "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", "", NULL,
         "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par\"}}]");
  expect(q, T, T, F, "<tool_call>\n<function=get_weather>\n<parameter=days>\n12\n</param", "", NULL,
         "[{\"name\": \"get_weather\", \"arguments\": {\"days\": 12}}]");
  expect(q, T, T, F, "<tool_call>\n<function=get_wea", "<tool_call>\n<function=get_wea", NULL, "[]");
  /* malformed */
  expect(q, T, T, F, "<tool_call>\n<function=bad name\n>", "<tool_call>\n<function=bad name\n>", NULL, "[]");
  /* invalid UTF-8 in a value still gives valid JSON */
  expect(q, T, T, F, "<function=f>\n<parameter=s>\na\xff" "b\n</parameter>\n</function>", "", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"s\": \"a\xef\xbf\xbd" "b\"}}]");
}

static void test_glm(void) {
  tc_format g = TC_GLM;
  expect(g, T, T, F,
         "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
         "<arg_value>3</arg_value>\n</tool_call>",
         "", NULL, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}]");
  /* GLM-4.7 without newlines, two calls, reasoning before */
  expect(g, T, T, F,
         "<think>Let me look.</think>\nChecking.<tool_call>get_weather<arg_key>city</arg_key><arg_value> New York "
         "</arg_value></tool_call><tool_call>get_time</tool_call>",
         "Checking.", "Let me look.",
         "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"New York\"}}, {\"name\": \"get_time\", \"arguments\": {}}]");
  expect(g, T, T, F, "<tool_call>f\n<arg_key>obj</arg_key>\n<arg_value>{\"k\": [1, \"two\"]}</arg_value>\n</tool_call>",
         "", NULL, "[{\"name\": \"f\", \"arguments\": {\"obj\": {\"k\": [1, \"two\"]}}}]");
  expect(g, T, T, F, "<tool_call>f\n<arg_key>text</arg_key>\n<arg_value>line one\nline \"two\"", "", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"text\": \"line one\\nline \\\"two\\\"\"}}]");
  expect(g, T, T, F, "<tool_call>f\n<arg_key>te", "", NULL, "[{\"name\": \"f\", \"arguments\": {}}]");
  expect(g, T, T, F, "<tool_call>not a call at all", "<tool_call>not a call at all", NULL, "[]");
}

static void test_llama3(void) {
  tc_format l = TC_LLAMA3;
  expect(l, T, F, F, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>", "", NULL,
         "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]");
  expect(l, T, F, F, "  {\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}", "", NULL,
         "[{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"x\": 1}}]");
  expect(l, T, F, F, "<|python_tag|>{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}<|eom_id|>", "", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}]");
  expect(l, T, F, F, "The answer is {x}.", "The answer is {x}.", NULL, "[]");
  expect(l, T, F, F, "{\"answer\": 42}", "{\"answer\": 42}", NULL, "[]");
  expect(l, T, F, F, "{\"name\": 3}", "{\"name\": 3}", NULL, "[]");
  expect(l, T, F, F, "<|python_tag|>brave_search.call(query=\"x\")<|eom_id|>", "brave_search.call(query=\"x\")", NULL,
         "[]");
  expect(l, T, F, F, "{\"name\": \"f\", \"parameters\": {\"a\": [1, 2", "", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"a\": [1]}}]");
  expect(l, T, F, F, "{\"name\": \"f\", \"parameters\": {\"a\": 1}} and then text", "and then text", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"a\": 1}}]");
  expect(l, F, F, F, "{\"name\": \"f\", \"parameters\": {}}", "{\"name\": \"f\", \"parameters\": {}}", NULL, "[]");
}

static void test_mistral(void) {
  tc_format m = TC_MISTRAL;
  expect(m, T, T, F,
         "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"b\", "
         "\"arguments\": {}}]</s>",
         "", NULL, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"b\", \"arguments\": {}}]");
  expect(m, T, T, F, "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]b[ARGS]{}", "Sure.", NULL,
         "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"b\", \"arguments\": {}}]");
  expect(m, T, T, F, "[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{\"a\": 1}", "", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"a\": 1}}]");
  expect(m, T, T, F, "[THINK]Let me see.[/THINK]The answer.", "The answer.", "Let me see.", "[]");
  expect(m, T, T, F, "[TOOL_CALLS] oops, no call", "[TOOL_CALLS] oops, no call", NULL, "[]");
  expect(m, T, T, F, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Pa", "", NULL,
         "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa\"}}]");
  expect(m, T, T, F, "[TOOL_CALLS]get_wea", "[TOOL_CALLS]get_wea", NULL, "[]");
  /* no end marker: what follows the broken JSON is content again */
  expect(m, T, T, F, "[TOOL_CALLS]f[ARGS]{\"a\": nope}", "ope}", NULL, "[{\"name\": \"f\", \"arguments\": {}}]");
  expect(m, T, T, F, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}}, {\"na", "{\"na", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"a\": 1}}]");
}

static void test_gemma4(void) {
  tc_format g = TC_GEMMA4;
  expect(g, T, T, F, "<|tool_call>call:get_weather{location:<|\"|>Paris, France<|\"|>,days:3}<tool_call|>", "", NULL,
         "[{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris, France\", \"days\": 3}}]");
  expect(g, T, T, F,
         "<|tool_call>call:f{opts:{deep:true,tags:[<|\"|>a<|\"|>,<|\"|>b{c}<|\"|>]},n:-1.5,z:none,w:hello}<tool_call|>"
         "<|tool_call>call:g{}<tool_call|><turn|>",
         "", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"opts\": {\"deep\": true, \"tags\": [\"a\", \"b{c}\"]}, \"n\": -1.5, \"z\": "
         "null, \"w\": \"hello\"}}, {\"name\": \"g\", \"arguments\": {}}]");
  expect(g, T, T, F, "<|channel>thought\nLet me think.<channel|>Answer.<turn|>", "Answer.", "Let me think.", "[]");
  expect(g, T, T, F, "Checking.<|tool_call>call:f{a:<|\"|>hel", "Checking.", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"a\": \"hel\"}}]");
  expect(g, T, T, F, "<|tool_call>call:f{a:{b:12", "", NULL, "[{\"name\": \"f\", \"arguments\": {\"a\": {\"b\": 12}}}]");
  expect(g, T, T, F, "<|tool_call>nonsense without brace<tool_call|>", "<|tool_call>nonsense without brace<tool_call|>",
         NULL, "[]");
  expect(g, T, T, F, "<|tool_call>call:f{a:1]<tool_call|>ok", "ok", NULL, "[{\"name\": \"f\", \"arguments\": {\"a\": 1}}]");
  /* a model turn as Gemma 4's chat template writes one (tests/fixtures/templates/gemma4, conversation
   * g4_tool_responses): reasoning, text, a call with nested objects, arrays, a Python None and a bool */
  expect(g, T, T, F,
         "<|channel>thought\nIt is sunny; book it.<channel|>Sunny, booking now."
         "<|tool_call>call:book_trip{cabin:None,dates:{depart:<|\"|>2025-05-01<|\"|>},flexible:true,"
         "tags:[<|\"|>spring<|\"|>,<|\"|>city<|\"|>],travellers:[{age:31,name:<|\"|>Ann<|\"|>}]}<tool_call|><turn|>",
         "Sunny, booking now.", "It is sunny; book it.",
         "[{\"name\": \"book_trip\", \"arguments\": {\"cabin\": null, \"dates\": {\"depart\": \"2025-05-01\"}, "
         "\"flexible\": true, \"tags\": [\"spring\", \"city\"], \"travellers\": [{\"age\": 31, \"name\": \"Ann\"}]}}]");
  expect(g, T, T, F,
         "<|tool_call>call:get_weather{location:<|\"|>Paris, France<|\"|>,unit:<|\"|>celsius<|\"|>}<tool_call|>"
         "<|tool_call>call:calculate{expression:<|\"|>2*3 \"quoted\" {braces}<|\"|>,precision:2.5}<tool_call|>",
         "", NULL,
         "[{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris, France\", \"unit\": \"celsius\"}}, "
         "{\"name\": \"calculate\", \"arguments\": {\"expression\": \"2*3 \\\"quoted\\\" {braces}\", \"precision\": 2.5}}]");
}

#define DSB "<｜tool▁calls▁begin｜>"
#define DSE "<｜tool▁calls▁end｜>"
#define DCB "<｜tool▁call▁begin｜>"
#define DCE "<｜tool▁call▁end｜>"
#define DSEP "<｜tool▁sep｜>"

static void test_deepseek(void) {
  tc_format d = TC_DEEPSEEK;
  expect(d, T, T, F,
         DSB DCB "function" DSEP "get_weather\n```json\n{\"city\": \"Paris\"}\n```" DCE "\n" DCB "function" DSEP
                 "b\n```json\n{}\n```" DCE DSE "<｜end▁of▁sentence｜>",
         "", NULL, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"b\", \"arguments\": {}}]");
  expect(d, T, T, F, "Let me check." DSB DCB "get_weather" DSEP "{\"city\": \"Paris\"}" DCE DSE, "Let me check.", NULL,
         "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]");
  expect(d, T, T, T, "Thinking...\n</think>\n\nThe answer." , "The answer.", "Thinking...", "[]");
  expect(d, T, T, F, "<think>Hmm.</think>" DSB DCB "function" DSEP "f\n```json\n{\"a\": [1, \"x", "", "Hmm.",
         "[{\"name\": \"f\", \"arguments\": {\"a\": [1, \"x\"]}}]");
  expect(d, T, T, F, DSB "garbage", DSB "garbage", NULL, "[]");
  expect(d, T, T, F, DSB DCB "function" DSEP "f\n```json\n{\"a\": bad}\n```" DCE DSE "after", "after", NULL,
         "[{\"name\": \"f\", \"arguments\": {}}]");
}

static void test_harmony(void) {
  tc_format h = TC_HARMONY;
  expect(h, T, T, F,
         "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
         "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
         "", "Need the weather.", "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]");
  expect(h, T, T, F,
         "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>The answer.<|return|>",
         "The answer.", "Think.", "[]");
  expect(h, T, F, F, "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
         "Think.Done.", NULL, "[]");
  expect(h, T, T, F, "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>", "", NULL,
         "[{\"name\": \"f\", \"arguments\": {}}]");
  expect(h, T, T, F, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": \"b", "", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"a\": \"b\"}}]");
  expect(h, T, T, F, "<|channel|>commentary to=functions.f<|message|>not json<|call|>", "not json", NULL, "[]");
  expect(h, F, T, F, "<|channel|>commentary to=functions.f<|message|>{}<|call|>", "{}", NULL, "[]");
}

static void test_none(void) {
  expect(TC_NONE, T, T, F, "<think>r</think>text<tool_call>{}</tool_call></s>", "text<tool_call>{}</tool_call>", "r",
         "[]");
  expect(TC_NONE, T, F, F, "<think>r</think>text", "<think>r</think>text", NULL, "[]");
}

static void test_generic(void) {
  tc_format g = TC_GENERIC;
  expect(g, T, T, F,
         "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"b\", "
         "\"arguments\": {}}]}",
         "", NULL, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"b\", \"arguments\": {}}]");
  expect(g, T, T, F, "Let me look.\n{\"tool_calls\":[{\"arguments\": {\"a\": [1]}, \"name\": \"f\"}]}\n", "Let me look.", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"a\": [1]}}]");
  expect(g, T, T, F, "<think>r</think>{\"tool_calls\": []} done", "done", "r", "[]");
  /* cut off inside the arguments: the call ends with what it had */
  expect(g, T, T, F, "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {\"a\": \"x", "", NULL,
         "[{\"name\": \"f\", \"arguments\": {\"a\": \"x\"}}]");
  /* not calls: plain text; without tools the shape is text too */
  expect(g, T, T, F, "{\"tool_calls\": [nope]}", "{\"tool_calls\": [nope]}", NULL, "[]");
  expect(g, F, T, F, "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {}}]}",
         "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {}}]}", NULL, "[]");
  CHECK_EQ_INT(tc_format_from_name("generic"), TC_GENERIC);
}

/* ---- streaming details ---- */

typedef struct trace {
  hbuf text;
  int calls;
  int stop_at; /* stop (return 7) at this event, -1 never */
  int events;
} trace;

static int on_trace(void *ctx, const tc_event *ev) {
  trace *t = ctx;
  if (ev->kind == TC_TEXT) hbuf_append(&t->text, ev->text, ev->len);
  if (ev->kind == TC_CALL_BEGIN) t->calls++;
  return t->events++ == t->stop_at ? 7 : 0;
}

/* Whitespace: a reply without markers comes back byte for byte; the answer
 * after a reasoning block starts at its first visible character; whitespace
 * around calls is not content. */
static void whitespace_case(tc_format f, bool in_reasoning, const char *in, const char *want, const char *want_reason) {
  tc_opts o = {.format = f, .tools = true, .reasoning = true, .in_reasoning = in_reasoning};
  char *content = NULL, *reasoning = NULL;
  json_t *calls = NULL;
  herr err = {0};
  CHECK(tc_parse_all(&o, in, strlen(in), &content, &reasoning, &calls, &err) == 0);
  CHECK_MSG(content && strcmp(content, want) == 0, "%s: content '%s', want '%s'", in, content ? content : "(null)", want);
  if (want_reason) CHECK_MSG(reasoning && strcmp(reasoning, want_reason) == 0, "%s: reasoning '%s'", in, reasoning ? reasoning : "(null)");
  free(content);
  free(reasoning);
  json_decref(calls);
}

static void test_whitespace(void) {
  whitespace_case(TC_HERMES, false, "  The answer \n", "  The answer \n", NULL);
  whitespace_case(TC_NONE, false, "The ", "The ", NULL);
  whitespace_case(TC_HERMES, false, "<think>\nhm\n</think>\n\nThe answer.\n", "The answer.\n", "hm");
  whitespace_case(TC_HERMES, true, "hm\n</think>\n\n  Yes", "Yes", "hm");
  whitespace_case(TC_HERMES, false, "Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n",
                  "Let me check.", NULL);
  whitespace_case(TC_HERMES, false, "\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n", "", NULL);
  whitespace_case(TC_HERMES, false, "a <tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call> b ", "a b ", NULL);
}

/* A forced opening plus what a model would go on with parses as a call of that name. */
static void forced_case(tc_format f, const char *name, const char *rest) {
  hbuf b = {0};
  CHECK(tc_forced_call(f, name, &b));
  hbuf_puts(&b, rest);
  tc_opts o = {.format = f, .tools = true, .reasoning = true};
  char *content = NULL;
  json_t *calls = NULL;
  herr err = {0};
  CHECK(tc_parse_all(&o, b.data, b.len, &content, NULL, &calls, &err) == 0);
  CHECK_MSG(json_array_size(calls) == 1, "%s: %zu calls from '%s'", tc_format_name(f), json_array_size(calls), hbuf_str(&b));
  json_t *c = json_array_get(calls, 0);
  CHECK_EQ_STR(json_string_value(json_object_get(c, "name")), "get_time");
  json_t *args = json_loads(json_string_value(json_object_get(c, "arguments")) ? json_string_value(json_object_get(c, "arguments")) : "", 0, NULL);
  CHECK_MSG(args && json_integer_value(json_object_get(args, "a")) == 1, "%s: arguments %s", tc_format_name(f),
            json_string_value(json_object_get(c, "arguments")));
  CHECK_EQ_STR(content, "");
  json_decref(args);
  json_decref(calls);
  free(content);
  hbuf_free(&b);
}

static void test_forced_call(void) {
  forced_case(TC_HERMES, "get_time", "{\"a\": 1}}\n</tool_call>");
  forced_case(TC_HERMES, NULL, "get_time\", \"arguments\": {\"a\": 1}}\n</tool_call>");
  forced_case(TC_QWEN3_CODER, "get_time", "<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>");
  forced_case(TC_QWEN3_CODER, NULL, "get_time>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>");
  forced_case(TC_LLAMA3, "get_time", "{\"a\": 1}}");
  forced_case(TC_LLAMA3, NULL, "get_time\", \"parameters\": {\"a\": 1}}");
  forced_case(TC_GLM, "get_time", "<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>");
  forced_case(TC_GEMMA4, "get_time", "a:1}<tool_call|>");
  forced_case(TC_MISTRAL, "get_time", "{\"a\": 1}}]");
  forced_case(TC_MISTRAL, NULL, "get_time\", \"arguments\": {\"a\": 1}}]");
  hbuf b = {0};
  CHECK(!tc_forced_call(TC_NONE, "f", &b));
  CHECK(b.len == 0);
  /* deepseek: either generation's form after the opening; the grammar's end comes before <|call|> in harmony */
  forced_case(TC_DEEPSEEK, "get_time", "get_time<\uff5ctool\u2581sep\uff5c>{\"a\": 1}<\uff5ctool\u2581call\u2581end\uff5c>"
                                       "<\uff5ctool\u2581calls\u2581end\uff5c>");
  forced_case(TC_DEEPSEEK, NULL, "function<\uff5ctool\u2581sep\uff5c>get_time\n```json\n{\"a\": 1}\n```"
                                 "<\uff5ctool\u2581call\u2581end\uff5c><\uff5ctool\u2581calls\u2581end\uff5c>");
  forced_case(TC_HARMONY, "get_time", " <|constrain|>json<|message|>{\"a\": 1}");
  forced_case(TC_HARMONY, NULL, "get_time<|message|>{\"a\": 1}<|call|>");
  /* generic: llama.cpp's {"tool_calls": [...]} for templates without a syntax */
  forced_case(TC_GENERIC, "get_time", "{\"a\": 1}}]}");
  forced_case(TC_GENERIC, NULL, "get_time\", \"arguments\": {\"a\": 1}}]}");
  forced_case(TC_GENERIC, NULL, "get_time\", \"arguments\": {\"a\": 1}}\n]\n}\n");
  hbuf_free(&b);
}

static void test_streaming_holdback(void) {
  tc_opts o = {.format = TC_HERMES, .tools = true, .reasoning = true};
  tc_parser *p;
  herr err = {0};
  trace t = {.stop_at = -1};
  CHECK(tc_parser_new(&o, &p, &err) == 0);
  CHECK(tc_parser_feed(p, "Hello <tool_c", 13, on_trace, &t, &err) == 0);
  CHECK_EQ_STR(hbuf_str(&t.text), "Hello"); /* the space waits, the marker prefix too */
  CHECK(tc_parser_feed(p, "all>\n{\"name\": \"f\", \"arguments\": {}}", 35, on_trace, &t, &err) == 0);
  CHECK_EQ_STR(hbuf_str(&t.text), "Hello");
  CHECK_EQ_INT(t.calls, 1);
  CHECK(tc_parser_feed(p, "</tool_call> caf\xc3", 17, on_trace, &t, &err) == 0);
  CHECK_EQ_STR(hbuf_str(&t.text), "Hello caf"); /* never half a UTF-8 sequence */
  CHECK(tc_parser_feed(p, "\xa9", 1, on_trace, &t, &err) == 0);
  CHECK_EQ_STR(hbuf_str(&t.text), "Hello caf\xc3\xa9");
  CHECK(tc_parser_finish(p, on_trace, &t, &err) == 0);
  CHECK_EQ_INT(tc_parser_calls(p), 1);
  tc_parser_free(p);
  hbuf_free(&t.text);
}

static void test_callback_stop(void) {
  tc_opts o = {.format = TC_HERMES, .tools = true};
  tc_parser *p;
  herr err = {0};
  trace t = {.stop_at = 1};
  CHECK(tc_parser_new(&o, &p, &err) == 0);
  const char *s = "Hi <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
  CHECK_EQ_INT(tc_parser_feed(p, s, strlen(s), on_trace, &t, &err), 7);
  CHECK_EQ_INT(t.events, 2);
  CHECK_EQ_INT(tc_parser_feed(p, "more", 4, on_trace, &t, &err), 7);
  CHECK_EQ_INT(tc_parser_finish(p, on_trace, &t, &err), 7);
  CHECK_EQ_INT(t.events, 2);
  tc_parser_free(p);
  hbuf_free(&t.text);
  tc_opts bad = {.format = (tc_format)99};
  CHECK_EQ_INT(tc_parser_new(&bad, &p, &err), HEARTH_EINVAL);
  CHECK(p == NULL);
}

static void test_parse_all(void) {
  tc_opts o = {.format = TC_HERMES, .tools = true, .reasoning = true};
  const char *s = "<think>r</think>Text.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
  char *content, *reasoning;
  json_t *calls;
  herr err = {0};
  CHECK(tc_parse_all(&o, s, strlen(s), &content, &reasoning, &calls, &err) == 0);
  CHECK_EQ_STR(content, "Text.");
  CHECK_EQ_STR(reasoning, "r");
  CHECK_EQ_INT(json_array_size(calls), 1);
  CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(calls, 0), "name")), "f");
  CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(calls, 0), "arguments")), "{\"a\": 1}");
  free(content);
  free(reasoning);
  json_decref(calls);
  CHECK(tc_parse_all(&o, "plain", 5, &content, &reasoning, &calls, &err) == 0);
  CHECK_EQ_STR(content, "plain");
  CHECK(reasoning == NULL);
  CHECK_EQ_INT(json_array_size(calls), 0);
  free(content);
  json_decref(calls);
}

int main(void) {
  RUN(test_detect_llama_cpp);
  RUN(test_detect_deps);
  RUN(test_detect_snippets);
  RUN(test_prompt_opens_reasoning);
  RUN(test_hermes);
  RUN(test_hermes_malformed);
  RUN(test_hermes_cut);
  RUN(test_qwen3_coder);
  RUN(test_glm);
  RUN(test_llama3);
  RUN(test_mistral);
  RUN(test_gemma4);
  RUN(test_deepseek);
  RUN(test_harmony);
  RUN(test_none);
  RUN(test_generic);
  RUN(test_roundtrip_templates);
  RUN(test_whitespace);
  RUN(test_forced_call);
  RUN(test_streaming_holdback);
  RUN(test_callback_stop);
  RUN(test_parse_all);
  TEST_MAIN_END();
}
