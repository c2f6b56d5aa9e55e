/* test_anthropic.c — the Anthropic Messages unit (src/serve/anthropic.c):
 * request bodies into serve_request, every refusal naming its field (in param
 * and at the head of the message), the message object, the stream's events
 * and error objects against Anthropic's documented shapes, written out by
 * hand below. */
#include <jansson.h>
#include <math.h>

#include "serve/anthropic.h"
#include "test.h"

static int parse(const char *body, bool count_only, serve_request *r, serve_fail *f) {
  memset(f, 0, sizeof *f);
  return anth_request_parse(body, strlen(body), count_only, r, f);
}

/* A body that must be refused with 400 invalid_request_error naming `param`. */
static void refused_as(const char *body, bool count_only, const char *param) {
  serve_request r;
  serve_fail f;
  int rc = parse(body, count_only, &r, &f);
  CHECK_MSG(rc == 400, "body %s: rc %d", body, rc);
  CHECK_EQ_INT(f.status, 400);
  CHECK_EQ_STR(f.type, "invalid_request_error");
  CHECK_MSG(strcmp(f.param, param) == 0, "body %s: param '%s', want '%s' (%s)", body, f.param, param, f.message);
  if (param[0]) {
    /* Anthropic's messages lead with the field's path */
    CHECK_MSG(strncmp(f.message, param, strlen(param)) == 0 && f.message[strlen(param)] == ':',
              "body %s: message '%s' does not start with '%s:'", body, f.message, param);
  }
  CHECK(f.message[0] != 0);
  CHECK(r.messages == NULL && r.nmessages == 0 && r.model == NULL && r.sampling.stop == NULL);
}

static void refused(const char *body, const char *param) { refused_as(body, false, param); }

/* Image blocks: the request's media, in order with the text for the template; a turn with one is not merged. */
static void test_images(void) {
  const char *body = "{\"model\":\"m\",\"max_tokens\":8,\"messages\":[{\"role\":\"user\",\"content\":\"first\"},"
                     "{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{\"type\":\"base64\","
                     "\"media_type\":\"image/png\",\"data\":\"iVBO\"}},{\"type\":\"text\",\"text\":\"what?\"},"
                     "{\"type\":\"image\",\"source\":{\"type\":\"url\",\"url\":\"https://x/a.jpg\"}}]}]}";
  serve_request r;
  serve_fail f;
  CHECK_EQ_INT(parse(body, false, &r, &f), 0);
  CHECK_EQ_INT(r.nmessages, 2);
  CHECK_EQ_INT(r.n_media, 2);
  if (r.n_media == 2 && r.nmessages == 2) {
    CHECK_EQ_STR(r.media[0].url, "iVBO");
    CHECK_EQ_STR(r.media[0].name, "messages.1.content.0");
    CHECK_EQ_STR(r.media[1].url, "https://x/a.jpg");
    CHECK_EQ_STR(r.media[1].name, "messages.1.content.2");
    CHECK(r.messages[0].parts == NULL);
    char *parts = r.messages[1].parts ? json_dumps(r.messages[1].parts, JSON_COMPACT) : NULL;
    CHECK_EQ_STR(parts ? parts : "", "[{\"type\":\"image\"},{\"type\":\"text\",\"text\":\"what?\"},{\"type\":\"image\"}]");
    free(parts);
  }
  serve_request_free(&r);
}

static void test_all_fields(void) {
  const char *body =
      "{\"model\":\"claude-x\",\"max_tokens\":64,\"system\":\"be brief\","
      "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi \"},"
      "{\"type\":\"text\",\"text\":\"there\",\"cache_control\":{\"type\":\"ephemeral\"}}]},"
      "{\"role\":\"assistant\",\"content\":\"hello\"},{\"role\":\"user\",\"content\":\"more\"}],"
      "\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,\"stop_sequences\":[\"END\",\"\\n\\nHuman:\"],"
      "\"stream\":true,\"metadata\":{\"user_id\":\"u1\"},\"thinking\":{\"type\":\"disabled\"},\"tools\":[],"
      "\"unknown_field\":{\"ignored\":1}}";
  serve_request r;
  serve_fail f;
  CHECK_EQ_INT(parse(body, false, &r, &f), 0);
  CHECK_EQ_INT(r.kind, SERVE_CHAT);
  CHECK_EQ_STR(r.model, "claude-x");
  CHECK(r.stream);
  CHECK_EQ_INT(r.nmessages, 4);
  CHECK_EQ_STR(r.messages[0].role, "system");
  CHECK_EQ_STR(r.messages[0].content, "be brief");
  CHECK_EQ_STR(r.messages[1].role, "user");
  CHECK_EQ_STR(r.messages[1].content, "hi there");
  CHECK_EQ_STR(r.messages[2].role, "assistant");
  CHECK_EQ_STR(r.messages[2].content, "hello");
  CHECK_EQ_STR(r.messages[3].content, "more");
  CHECK_EQ_INT(r.sampling.max_tokens, 64);
  CHECK_NEAR(r.sampling.temperature, 0.5, 1e-12);
  CHECK_NEAR(r.sampling.top_p, 0.9, 1e-12);
  CHECK_EQ_INT(r.sampling.top_k, 40);
  CHECK_EQ_INT(r.sampling.n_stop, 2);
  CHECK_EQ_STR(r.sampling.stop[0], "END");
  CHECK_EQ_STR(r.sampling.stop[1], "\n\nHuman:");
  /* what Anthropic does not have keeps the model's defaults */
  CHECK(isnan(r.sampling.min_p) && isnan(r.sampling.presence_penalty) && isnan(r.sampling.repetition_penalty));
  CHECK(!r.sampling.has_seed && !r.sampling.logprobs && r.sampling.n_logit_bias == 0);
  serve_request_free(&r);
}

static void test_defaults_and_merging(void) {
  serve_request r;
  serve_fail f;
  /* system as text blocks; consecutive turns of one role become one turn */
  const char *body =
      "{\"model\":\"m\",\"max_tokens\":1,\"system\":[{\"type\":\"text\",\"text\":\"A\"},{\"type\":\"text\",\"text\":\"B\"}],"
      "\"messages\":[{\"role\":\"user\",\"content\":\"one\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"two\"}]},"
      "{\"role\":\"assistant\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"y\"},{\"role\":\"user\",\"content\":[]}]}";
  CHECK_EQ_INT(parse(body, false, &r, &f), 0);
  CHECK_EQ_INT(r.nmessages, 4);
  CHECK_EQ_STR(r.messages[0].role, "system");
  CHECK_EQ_STR(r.messages[0].content, "AB");
  CHECK_EQ_STR(r.messages[1].role, "user");
  CHECK_EQ_STR(r.messages[1].content, "one\n\ntwo");
  CHECK_EQ_STR(r.messages[2].role, "assistant");
  CHECK_EQ_STR(r.messages[2].content, "x\n\ny");
  CHECK_EQ_STR(r.messages[3].content, "");
  CHECK(!r.stream);
  CHECK(isnan(r.sampling.temperature) && isnan(r.sampling.top_p) && r.sampling.top_k == -1);
  CHECK(r.sampling.n_stop == 0 && r.sampling.stop == NULL);
  serve_request_free(&r);
  /* null means absent */
  CHECK_EQ_INT(parse("{\"model\":\"m\",\"max_tokens\":2.0,\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                     "\"system\":null,\"temperature\":null,\"stop_sequences\":null,\"stream\":null}",
                     false, &r, &f),
               0);
  CHECK_EQ_INT(r.nmessages, 1);
  CHECK_EQ_INT(r.sampling.max_tokens, 2);
  serve_request_free(&r);
  /* count_tokens: no max_tokens, and the sampling fields are not read */
  CHECK_EQ_INT(parse("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"temperature\":9}", true, &r, &f), 0);
  CHECK_EQ_INT(r.sampling.max_tokens, -1);
  serve_request_free(&r);
}

/* tool_use / tool_result / thinking turns become the messages templates read:
 * assistant tool_calls (arguments as objects), "tool" messages ahead of the
 * user's text, reasoning_content; tools in the OpenAI shape; tool_choice. */
static void test_tool_turns(void) {
  const char *body =
      "{\"model\":\"m\",\"max_tokens\":8,\"tools\":[{\"name\":\"f\",\"description\":\"d\",\"input_schema\":"
      "{\"type\":\"object\"}}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"f\"},\"thinking\":{\"type\":"
      "\"enabled\",\"budget_tokens\":64},\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
      "\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\",\"signature\":\"\"},{\"type\":\"text\",\"text\":\"ok\"},"
      "{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\",\"input\":{\"a\":1}}]},{\"role\":\"user\",\"content\":"
      "[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":\"42\"},{\"type\":\"tool_result\","
      "\"tool_use_id\":\"t2\",\"is_error\":true,\"content\":[{\"type\":\"text\",\"text\":\"boom\"}]},{\"type\":\"text\","
      "\"text\":\"next\"}]}]}";
  serve_request r;
  serve_fail f;
  CHECK(anth_request_parse(body, strlen(body), false, &r, &f) == 0);
  CHECK_EQ_INT(r.nmessages, 5);
  if (r.nmessages == 5) {
    const char *roles[] = {"user", "assistant", "tool", "tool", "user"};
    for (int i = 0; i < 5; i++) CHECK_EQ_STR(r.messages[i].role, roles[i]);
    CHECK_EQ_STR(r.messages[1].content, "ok");
    json_t *calls = json_object_get(r.messages[1].extra, "tool_calls");
    CHECK(json_array_size(calls) == 1);
    json_t *fn = json_object_get(json_array_get(calls, 0), "function");
    CHECK_EQ_STR(json_string_value(json_object_get(fn, "name")), "f");
    CHECK(json_integer_value(json_object_get(json_object_get(fn, "arguments"), "a")) == 1);
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(calls, 0), "id")), "t1");
    CHECK_EQ_STR(json_string_value(json_object_get(r.messages[1].extra, "reasoning_content")), "hm");
    CHECK_EQ_STR(r.messages[2].content, "42");
    CHECK_EQ_STR(json_string_value(json_object_get(r.messages[2].extra, "tool_call_id")), "t1");
    CHECK_EQ_STR(r.messages[3].content, "Error: boom");
    CHECK_EQ_STR(r.messages[4].content, "next");
  }
  CHECK(json_array_size(r.tools) == 1);
  CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(json_array_get(r.tools, 0), "function"), "name")), "f");
  CHECK_EQ_INT(r.tool_choice, SERVE_TOOLS_NAMED);
  CHECK_EQ_STR(r.tool_name, "f");
  CHECK(json_is_true(json_object_get(r.template_kwargs, "enable_thinking")));
  serve_request_free(&r);
}

static void test_refusals(void) {
  refused("", "");
  refused("{\"model\":", "");
  refused("[]", "");
  refused("\"text\"", "");
#define Q "\"model\":\"m\",\"max_tokens\":8"
#define U "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
  refused("{\"max_tokens\":8," U "}", "model");
  refused("{\"model\":5,\"max_tokens\":8," U "}", "model");
  refused("{\"model\":\"m\"," U "}", "max_tokens");
  refused("{" Q "}", "messages");
  refused("{" Q ",\"messages\":{}}", "messages");
  refused("{" Q ",\"messages\":[]}", "messages");
  refused("{" Q ",\"messages\":[5]}", "messages.0");
  refused("{" Q ",\"messages\":[{\"content\":\"x\"}]}", "messages.0.role");
  refused("{" Q ",\"messages\":[{\"role\":7,\"content\":\"x\"}]}", "messages.0.role");
  refused("{" Q ",\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}", "messages.0.role");
  refused("{" Q ",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages.0.role");
  refused("{" Q ",\"messages\":[{\"role\":\"user\"}]}", "messages.0.content");
  refused("{" Q ",\"messages\":[{\"role\":\"user\",\"content\":null}]}", "messages.0.content");
  refused("{" Q ",\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages.0.content");
  refused("{" Q ",\"messages\":[{\"role\":\"user\",\"content\":{\"type\":\"text\"}}]}", "messages.0.content");
  refused("{" Q ",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":[1]}]}",
          "messages.1.content.0");
  refused("{" Q ",\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]}]}", "messages.0.content.0.type");
  refused("{" Q ",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", "messages.0.content.0.text");
  refused("{" Q ",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":1}]}]}",
          "messages.0.content.0.text");
  /* an image block needs a base64 or url source; in an assistant turn it is refused */
  refused("{" Q ",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"image\","
          "\"source\":{\"type\":\"file\",\"file_id\":\"f\"}}]}]}",
          "messages.0.content.1");
  refused("{" Q ",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"image\","
          "\"source\":{\"type\":\"base64\",\"media_type\":\"image/png\",\"data\":\"AA==\"}}]}]}",
          "messages.1.content.0");
  refused("{" Q ",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"document\",\"source\":{}}]}]}",
          "messages.0.content.0");
  /* tool_use only in assistant turns, tool_result only in user turns, each complete */
  refused("{" Q ",\"messages\":[{\"role\":\"user\",\"content\":"
          "[{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}]}]}",
          "messages.0.content.0");
  refused("{" Q ",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":"
          "[{\"type\":\"tool_result\",\"tool_use_id\":\"t\"}]}]}",
          "messages.1.content.0");
  refused("{" Q ",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":"
          "[{\"type\":\"tool_use\",\"id\":\"t\",\"input\":{}}]}]}",
          "messages.1.content.0");
  refused("{" Q ",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\"}]}]}",
          "messages.0.content.0");
  refused("{" Q ",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t\","
          "\"content\":[{\"type\":\"image\"}]}]}]}",
          "messages.0.content.0.content.0");
  refused("{" Q ",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"hologram\"}]}]}", "messages.0.content.0");
  refused("{" Q "," U ",\"system\":5}", "system");
  refused("{" Q "," U ",\"system\":{\"type\":\"text\",\"text\":\"a\"}}", "system");
  refused("{" Q "," U ",\"system\":[\"a\"]}", "system.0");
  refused("{" Q "," U ",\"system\":[{\"type\":\"image\"}]}", "system.0");
  refused("{" Q "," U ",\"system\":[{\"type\":\"text\",\"text\":false}]}", "system.0.text");
  refused("{\"model\":\"m\",\"max_tokens\":0," U "}", "max_tokens");
  refused("{\"model\":\"m\",\"max_tokens\":\"8\"," U "}", "max_tokens");
  refused("{\"model\":\"m\",\"max_tokens\":2.5," U "}", "max_tokens");
  refused("{\"model\":\"m\",\"max_tokens\":-1," U "}", "max_tokens");
  refused("{" Q "," U ",\"temperature\":\"hot\"}", "temperature");
  refused("{" Q "," U ",\"temperature\":1.5}", "temperature");
  refused("{" Q "," U ",\"temperature\":-0.1}", "temperature");
  refused("{" Q "," U ",\"top_p\":2}", "top_p");
  refused("{" Q "," U ",\"top_p\":[]}", "top_p");
  refused("{" Q "," U ",\"top_k\":-1}", "top_k");
  refused("{" Q "," U ",\"top_k\":1.5}", "top_k");
  refused("{" Q "," U ",\"top_k\":\"4\"}", "top_k");
  refused("{" Q "," U ",\"stop_sequences\":\"END\"}", "stop_sequences");
  refused("{" Q "," U ",\"stop_sequences\":[\"\"]}", "stop_sequences");
  refused("{" Q "," U ",\"stop_sequences\":[3]}", "stop_sequences");
  refused("{" Q "," U ",\"stop_sequences\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\","
          "\"13\",\"14\",\"15\",\"16\",\"17\"]}",
          "stop_sequences");
  refused("{" Q "," U ",\"stream\":\"yes\"}", "stream");
  refused("{" Q "," U ",\"metadata\":\"u1\"}", "metadata");
  refused("{" Q "," U ",\"tools\":{}}", "tools");
  refused("{" Q "," U ",\"tools\":[{\"name\":\"f\"}]}", "tools.0");
  refused("{" Q "," U ",\"tools\":[{\"name\":\"bad name\",\"input_schema\":{\"type\":\"object\"}}]}", "tools.0");
  refused("{" Q "," U ",\"tools\":[{\"type\":\"bash_20250124\",\"name\":\"bash\"}]}", "tools.0");
  refused("{" Q "," U ",\"tool_choice\":{\"type\":\"any\"}}", "tool_choice");
  refused("{" Q "," U ",\"tools\":[{\"name\":\"f\",\"input_schema\":{}}],\"tool_choice\":{\"type\":\"tool\",\"name\":\"g\"}}",
          "tool_choice");
  refused("{" Q "," U ",\"thinking\":{\"type\":\"enabled\"}}", "thinking");
  refused("{" Q "," U ",\"thinking\":true}", "thinking");
  /* count_tokens reads the prompt's fields the same way */
  refused_as("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", true, "model");
  refused_as("{\"model\":\"m\"}", true, "messages");
  refused_as("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\"}]}]}", true,
             "messages.0.content.0");
  refused_as("{\"model\":\"m\"," U ",\"system\":7}", true, "system");
#undef Q
#undef U
}

static void test_errors(void) {
  CHECK_EQ_STR(anth_error_type(400), "invalid_request_error");
  CHECK_EQ_STR(anth_error_type(405), "invalid_request_error");
  CHECK_EQ_STR(anth_error_type(401), "authentication_error");
  CHECK_EQ_STR(anth_error_type(403), "permission_error");
  CHECK_EQ_STR(anth_error_type(404), "not_found_error");
  CHECK_EQ_STR(anth_error_type(413), "request_too_large");
  CHECK_EQ_STR(anth_error_type(429), "rate_limit_error");
  CHECK_EQ_STR(anth_error_type(500), "api_error");
  CHECK_EQ_STR(anth_error_type(503), "api_error");
  CHECK_EQ_STR(anth_error_type(529), "overloaded_error");
  serve_fail f;
  /* the OpenAI-side type ("memory_admission", "server_error") gives way to the status */
  serve_fail_set(&f, 400, "memory_admission", "messages", "memory_admission", "needs \"%s\"", "more");
  char *s = anth_fail_json(&f);
  CHECK_EQ_STR(s, "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"needs \\\"more\\\"\"}}");
  free(s);
  serve_fail_set(&f, 500, "server_error", NULL, NULL, "bad \xff byte");
  s = anth_fail_json(&f);
  CHECK_EQ_STR(s, "{\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"bad \xEF\xBF\xBD byte\"}}");
  free(s);
  hbuf out = {0};
  serve_fail_set(&f, 529, "overloaded_error", NULL, NULL, "Overloaded");
  anth_sse_error(&f, &out);
  CHECK_EQ_STR(hbuf_str(&out), "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\","
                               "\"message\":\"Overloaded\"}}\n\n");
  hbuf_free(&out);
}

static const char *stops[] = {"END", "\n\nHuman:"};

static void fixed(anth_reply *r) {
  anth_reply_init(r, "tiny-llama", 1, stops, 2);
  snprintf(r->id, sizeof r->id, "msg_abc");
}

static serve_token tok(const char *text) {
  serve_token t = {.text = text, .len = strlen(text), .id = 7, .token_text = text, .token_len = strlen(text)};
  return t;
}

#define USAGE(in, out, cached)                                                                                   \
  "{\"input_tokens\":" #in ",\"output_tokens\":" #out ",\"cache_read_input_tokens\":" #cached                   \
  ",\"cache_creation_input_tokens\":0}"

static void test_ids_and_stop_reasons(void) {
  anth_reply a, b;
  anth_reply_init(&a, "m", 1, NULL, 0);
  anth_reply_init(&b, "m", 2, NULL, 0);
  CHECK(strncmp(a.id, "msg_01", 6) == 0 && strlen(a.id) == 28);
  CHECK(strcmp(a.id, b.id) != 0);
  for (const char *p = a.id + 4; *p; p++) CHECK((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z'));
  anth_reply_free(&a);
  anth_reply_free(&b);
  serve_result eos = {.finish = SERVE_FINISH_STOP, .stop_index = -1};
  serve_result len = {.finish = SERVE_FINISH_LENGTH, .stop_index = -1};
  serve_result seq = {.finish = SERVE_FINISH_STOP, .stop_index = 1};
  CHECK_EQ_STR(anth_stop_reason(&eos), "end_turn");
  CHECK_EQ_STR(anth_stop_reason(&len), "max_tokens");
  CHECK_EQ_STR(anth_stop_reason(&seq), "stop_sequence");
}

static void test_whole(void) {
  anth_reply r;
  fixed(&r);
  serve_token t1 = tok("Hel\"lo"), t2 = tok(""), t3 = tok("\n");
  anth_reply_add(&r, &t1);
  anth_reply_add(&r, &t2);
  anth_reply_add(&r, &t3);
  hbuf out = {0};
  /* input_tokens leave out the tokens read from the prefix cache, as Anthropic counts */
  serve_result res = {.finish = SERVE_FINISH_STOP, .stop_index = 1, .prompt_tokens = 20, .completion_tokens = 3,
                      .cached_tokens = 16};
  anth_reply_body(&r, &res, &out);
  CHECK_EQ_STR(hbuf_str(&out), "{\"id\":\"msg_abc\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"tiny-llama\","
                               "\"content\":[{\"type\":\"text\",\"text\":\"Hel\\\"lo\\n\"}],\"stop_reason\":\"stop_sequence\","
                               "\"stop_sequence\":\"\\n\\nHuman:\",\"usage\":" USAGE(4, 3, 16) "}");
  hbuf_clear(&out);
  serve_result eos = {.finish = SERVE_FINISH_STOP, .stop_index = -1, .prompt_tokens = 5, .completion_tokens = 2};
  anth_reply_body(&r, &eos, &out);
  CHECK_EQ_STR(hbuf_str(&out), "{\"id\":\"msg_abc\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"tiny-llama\","
                               "\"content\":[{\"type\":\"text\",\"text\":\"Hel\\\"lo\\n\"}],\"stop_reason\":\"end_turn\","
                               "\"stop_sequence\":null,\"usage\":" USAGE(5, 2, 0) "}");
  hbuf_free(&out);
  anth_reply_free(&r);
  /* an empty answer is one empty text block; a stop index outside the list names none */
  fixed(&r);
  serve_result odd = {.finish = SERVE_FINISH_LENGTH, .stop_index = 5, .prompt_tokens = 1, .completion_tokens = 1};
  anth_reply_body(&r, &odd, &out);
  CHECK_EQ_STR(hbuf_str(&out), "{\"id\":\"msg_abc\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"tiny-llama\","
                               "\"content\":[{\"type\":\"text\",\"text\":\"\"}],\"stop_reason\":\"max_tokens\","
                               "\"stop_sequence\":null,\"usage\":" USAGE(1, 1, 0) "}");
  hbuf_free(&out);
  anth_reply_free(&r);
}

static void test_stream(void) {
  anth_reply r;
  fixed(&r);
  hbuf out = {0};
  anth_sse_start(&r, 12, &out);
  CHECK_EQ_STR(hbuf_str(&out),
               "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_abc\",\"type\":\"message\","
               "\"role\":\"assistant\",\"model\":\"tiny-llama\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,"
               "\"usage\":" USAGE(12, 0, 0) "}}\n\n"
               "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,"
               "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
               "event: ping\ndata: {\"type\":\"ping\"}\n\n");
  hbuf_clear(&out);
  serve_token t = tok("a\xc3");  /* a cut UTF-8 sequence is repaired, never sent as invalid JSON */
  anth_sse_token(&r, &t, &out);
  CHECK_EQ_STR(hbuf_str(&out), "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,"
                               "\"delta\":{\"type\":\"text_delta\",\"text\":\"a\xEF\xBF\xBD\"}}\n\n");
  hbuf_clear(&out);
  serve_token empty = tok("");
  anth_sse_token(&r, &empty, &out); /* a step that released nothing sends nothing */
  CHECK_EQ_INT(out.len, 0);
  serve_result res = {.finish = SERVE_FINISH_STOP, .stop_index = 0, .prompt_tokens = 12, .completion_tokens = 4,
                      .cached_tokens = 0};
  anth_sse_finish(&r, &res, &out);
  CHECK_EQ_STR(hbuf_str(&out),
               "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
               "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"stop_sequence\","
               "\"stop_sequence\":\"END\"},\"usage\":" USAGE(12, 4, 0) "}\n\n"
               "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
  hbuf_clear(&out);
  anth_count_body(42, &out);
  CHECK_EQ_STR(hbuf_str(&out), "{\"input_tokens\":42}");
  hbuf_free(&out);
  anth_reply_free(&r);
}

int main(void) {
  RUN(test_all_fields);
  RUN(test_images);
  RUN(test_defaults_and_merging);
  RUN(test_refusals);
  RUN(test_tool_turns);
  RUN(test_errors);
  RUN(test_ids_and_stop_reasons);
  RUN(test_whole);
  RUN(test_stream);
  TEST_MAIN_END();
}
