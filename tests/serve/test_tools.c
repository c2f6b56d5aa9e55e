/* test_tools.c — the one reader of tools and tool_choice (serve_tools_parse)
 * in each protocol's dialect: OpenAI chat's, the Responses API's and
 * Anthropic's shapes read into the OpenAI tools the templates see, the
 * choices, and every refusal with its field and its exact words. */
#include <jansson.h>

#include "serve/anthropic.h"
#include "serve/request.h"
#include "serve/responses.h"
#include "test.h"

enum { OPENAI, RESPONSES, ANTHROPIC };

/* body's tools and tool_choice through protocol p's parser into r (0 or the status, f filled). */
static int parse(int p, const char *fields, serve_request *r, serve_fail *f) {
  char body[2048];
  memset(f, 0, sizeof *f);
  memset(r, 0, sizeof *r);
  if (p == OPENAI) {
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]%s%s}", fields[0] ? "," : "",
             fields);
    return serve_request_parse(body, strlen(body), SERVE_CHAT, r, f);
  }
  if (p == RESPONSES) {
    snprintf(body, sizeof body, "{\"input\":\"x\"%s%s}", fields[0] ? "," : "", fields);
    resp_request rr;
    memset(&rr, 0, sizeof rr);
    int rc = resp_request_parse(body, strlen(body), r, &rr, f);
    resp_request_free(&rr);
    return rc;
  }
  snprintf(body, sizeof body, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]%s%s}",
           fields[0] ? "," : "", fields);
  return anth_request_parse(body, strlen(body), true, r, f);
}

/* fields must be refused by protocol p naming param, with exactly message. */
static void refused(int p, const char *fields, const char *param, const char *message) {
  serve_request r;
  serve_fail f;
  int rc = parse(p, fields, &r, &f);
  CHECK_MSG(rc == 400, "%d %s: rc %d", p, fields, rc);
  CHECK_MSG(!strcmp(f.param, param), "%d %s: param '%s', want '%s'", p, fields, f.param, param);
  CHECK_MSG(!strcmp(f.message, message), "%d %s:\n  message '%s'\n  want    '%s'", p, fields, f.message, message);
  serve_request_free(&r);
}

static void test_openai(void) {
  refused(OPENAI, "\"tools\":{}", "tools", "'tools' must be an array");
  refused(OPENAI, "\"functions\":[]", "functions", "'functions' is the deprecated form of 'tools': send 'tools' instead");
  refused(OPENAI, "\"tools\":[1]", "tools[0]", "'tools[0]' must be an object with a type");
  refused(OPENAI, "\"tools\":[{\"type\":\"code_interpreter\"}]", "tools[0]",
          "'tools[0]' is of type 'code_interpreter': this server calls only function tools");
  refused(OPENAI, "\"tools\":[{\"type\":\"function\"}]", "tools[0]", "'tools[0].function.name' is required");
  refused(OPENAI, "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"bad name\"}}]", "tools[0]",
          "'tools[0]' has the name 'bad name': a tool name is 1 to 64 of a-z, A-Z, 0-9, '_', '-', '.', ':'");
  const char *tools = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}]";
  char b[512];
  snprintf(b, sizeof b, "%s,\"tool_choice\":\"sometimes\"", tools);
  refused(OPENAI, b, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or a function");
  snprintf(b, sizeof b, "%s,\"tool_choice\":3", tools);
  refused(OPENAI, b, "tool_choice", "'tool_choice' must be a string or an object");
  snprintf(b, sizeof b, "%s,\"tool_choice\":{\"type\":\"function\"}", tools);
  refused(OPENAI, b, "tool_choice",
          "'tool_choice' must name a function: {\"type\": \"function\", \"function\": {\"name\": ...}}");
  snprintf(b, sizeof b, "%s,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}", tools);
  refused(OPENAI, b, "tool_choice", "'tool_choice' names 'nope', which is not among 'tools'");
  refused(OPENAI, "\"tool_choice\":\"required\"", "tool_choice",
          "'tool_choice' asks for a tool call, but no 'tools' were given");
  refused(OPENAI, "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}", "tool_choice",
          "'tool_choice' asks for a tool call, but no 'tools' were given");
  serve_request r;
  serve_fail f;
  snprintf(b, sizeof b, "%s,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}", tools);
  CHECK_EQ_INT(parse(OPENAI, b, &r, &f), 0);
  CHECK(r.tool_choice == SERVE_TOOLS_NAMED && r.tool_name && !strcmp(r.tool_name, "f"));
  CHECK_EQ_INT(json_array_size(r.tools), 1);
  serve_request_free(&r);
  snprintf(b, sizeof b, "%s,\"tool_choice\":\"none\"", tools);
  CHECK_EQ_INT(parse(OPENAI, b, &r, &f), 0);
  CHECK(r.tool_choice == SERVE_TOOLS_NONE);
  serve_request_free(&r);
}

static void test_responses(void) {
  refused(RESPONSES, "\"tools\":{}", "tools", "'tools' must be an array");
  refused(RESPONSES, "\"tools\":[{\"type\":\"web_search\"}]", "tools[0]",
          "'tools[0]': tools of type 'web_search' are not supported by this server (function tools only)");
  refused(RESPONSES, "\"tools\":[{\"type\":\"function\"}]", "tools[0]", "'tools[0].name' is required (a string)");
  refused(RESPONSES, "\"tools\":[{\"name\":\"f\"}]", "tools[0]", "'tools[0]' must be an object with a type");
  refused(RESPONSES, "\"tool_choice\":\"x\"", "tool_choice",
          "'tool_choice' must be auto, none, required or {\"type\": \"function\", \"name\"}");
  refused(RESPONSES, "\"tool_choice\":{\"type\":\"function\"}", "tool_choice",
          "'tool_choice' as an object must be {\"type\": \"function\", \"name\"}");
  refused(RESPONSES, "\"tool_choice\":{\"type\":\"function\",\"name\":\"g\"}", "tool_choice",
          "'tool_choice' names 'g', which is not among the tools");
  refused(RESPONSES, "\"tool_choice\":\"required\"", "tool_choice", "'tool_choice' asks for a call but no tools are given");
  refused(RESPONSES, "\"tool_choice\":[]", "tool_choice", "'tool_choice' must be a string or an object");
  serve_request r;
  serve_fail f;
  CHECK_EQ_INT(parse(RESPONSES, "\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":\"required\"", &r, &f), 0);
  CHECK(r.tool_choice == SERVE_TOOLS_REQUIRED);
  /* no parameters: an object schema without properties, in the OpenAI shape */
  json_t *fn = json_object_get(json_array_get(r.tools, 0), "function");
  CHECK_EQ_STR(json_string_value(json_object_get(fn, "name")), "f");
  json_t *want = json_pack("{s:s, s:{}}", "type", "object", "properties");
  CHECK(json_equal(json_object_get(fn, "parameters"), want));
  json_decref(want);
  serve_request_free(&r);
}

static void test_anthropic(void) {
  refused(ANTHROPIC, "\"tools\":{}", "tools", "tools: Input should be an array");
  refused(ANTHROPIC, "\"tools\":[{\"name\":\"t\"}]", "tools.0", "tools.0: input_schema is required (a JSON Schema object)");
  refused(ANTHROPIC, "\"tools\":[{\"type\":\"web_search_20250305\",\"name\":\"w\"}]", "tools.0",
          "tools.0: tools of type 'web_search_20250305' are not supported: this server calls client tools (name, "
          "description, input_schema)");
  refused(ANTHROPIC, "\"tools\":[{\"type\":7,\"name\":\"w\"}]", "tools.0",
          "tools.0: tools of type '?' are not supported: this server calls client tools (name, description, input_schema)");
  refused(ANTHROPIC, "\"tools\":[{\"input_schema\":{}}]", "tools.0", "tools.0: name is required (a string)");
  refused(ANTHROPIC, "\"tools\":[{\"name\":\"bad name\",\"input_schema\":{\"type\":\"object\"}}]", "tools.0",
          "tools.0: 'tools.0' has the name 'bad name': a tool name is 1 to 64 of a-z, A-Z, 0-9, '_', '-', '.', ':'");
  const char *tools = "\"tools\":[{\"name\":\"f\",\"type\":\"custom\",\"input_schema\":{\"type\":\"object\"}}]";
  char b[512];
  refused(ANTHROPIC, "\"tool_choice\":\"auto\"", "tool_choice", "tool_choice: Input should be an object with a type");
  snprintf(b, sizeof b, "%s,\"tool_choice\":{\"type\":\"maybe\"}", tools);
  refused(ANTHROPIC, b, "tool_choice", "tool_choice: type should be 'auto', 'any', 'tool' or 'none'");
  snprintf(b, sizeof b, "%s,\"tool_choice\":{\"type\":\"tool\"}", tools);
  refused(ANTHROPIC, b, "tool_choice", "tool_choice: name is required for type 'tool'");
  snprintf(b, sizeof b, "%s,\"tool_choice\":{\"type\":\"tool\",\"name\":\"nope\"}", tools);
  refused(ANTHROPIC, b, "tool_choice", "tool_choice: 'nope' is not among the tools");
  refused(ANTHROPIC, "\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"}", "tool_choice",
          "tool_choice: 'f' is not among the tools");
  refused(ANTHROPIC, "\"tool_choice\":{\"type\":\"any\"}", "tool_choice", "tool_choice: 'any' needs tools");
  serve_request r;
  serve_fail f;
  snprintf(b, sizeof b, "%s,\"tool_choice\":{\"type\":\"any\"}", tools);
  CHECK_EQ_INT(parse(ANTHROPIC, b, &r, &f), 0);
  CHECK(r.tool_choice == SERVE_TOOLS_REQUIRED);
  CHECK_EQ_INT(json_array_size(r.tools), 1);
  serve_request_free(&r);
  snprintf(b, sizeof b, "%s,\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"}", tools);
  CHECK_EQ_INT(parse(ANTHROPIC, b, &r, &f), 0);
  CHECK(r.tool_choice == SERVE_TOOLS_NAMED && r.tool_name && !strcmp(r.tool_name, "f"));
  serve_request_free(&r);
}

int main(void) {
  RUN(test_openai);
  RUN(test_responses);
  RUN(test_anthropic);
  TEST_MAIN_END();
}
