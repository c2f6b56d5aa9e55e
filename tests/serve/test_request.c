/* test_request.c — request validation: OpenAI chat and completion bodies into
 * serve_request, and every refusal naming its field (param) with status 400. */
#include <jansson.h>
#include <math.h>

#include "base/buf.h"
#include "serve/request.h"
#include "test.h"

static int parse(const char *body, serve_kind kind, serve_request *r, serve_fail *f) {
  memset(f, 0, sizeof *f);
  return serve_request_parse(body, strlen(body), kind, r, f);
}

/* Parses a body that must be refused; checks the status and the param. */
static void refused(const char *body, serve_kind kind, const char *param) {
  serve_request r;
  serve_fail f;
  int rc = parse(body, kind, &r, &f);
  CHECK_MSG(rc == 400, "body %s: rc %d", body, rc);
  CHECK_EQ_INT(f.status, 400);
  CHECK_EQ_STR(f.type, "invalid_request_error");
  CHECK_MSG(strcmp(f.param, param) == 0, "body %s: param '%s', want '%s' (%s)", body, f.param, param, f.message);
  CHECK(f.message[0] != 0);
  CHECK(r.messages == NULL && r.prompt == NULL && r.sampling.stop == NULL);
}

static void test_chat_all_fields(void) {
  const char *body =
      "{\"model\":\"m1\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
      "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi \"},{\"type\":\"text\",\"text\":\"there\"}]},"
      "{\"role\":\"assistant\",\"content\":null}],"
      "\"max_tokens\":50,\"temperature\":0.5,\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,\"seed\":-7,"
      "\"stop\":[\"END\",\"\\n\\n\"],\"presence_penalty\":0.5,\"frequency_penalty\":-0.5,\"repetition_penalty\":1.1,"
      "\"logit_bias\":{\"15\":-100,\"2000\":3.5},\"logprobs\":true,\"top_logprobs\":3,\"n\":1,\"user\":\"u7\","
      "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"unknown_field\":{\"ignored\":1}}";
  serve_request r;
  serve_fail f;
  CHECK_EQ_INT(parse(body, SERVE_CHAT, &r, &f), 0);
  CHECK_EQ_STR(r.model, "m1");
  CHECK_EQ_INT(r.nmessages, 3);
  CHECK_EQ_STR(r.messages[0].role, "system");
  CHECK_EQ_STR(r.messages[0].content, "be brief");
  CHECK_EQ_STR(r.messages[1].content, "hi there");
  CHECK_EQ_STR(r.messages[2].role, "assistant");
  CHECK_EQ_STR(r.messages[2].content, "");
  const serve_sampling *s = &r.sampling;
  CHECK_EQ_INT(s->max_tokens, 50);
  CHECK_NEAR(s->temperature, 0.5, 0);
  CHECK_NEAR(s->top_p, 0.9, 0);
  CHECK_EQ_INT(s->top_k, 40);
  CHECK_NEAR(s->min_p, 0.05, 0);
  CHECK(s->has_seed);
  CHECK(s->seed == (uint64_t)-7);
  CHECK_EQ_INT(s->n_stop, 2);
  CHECK_EQ_STR(s->stop[0], "END");
  CHECK_EQ_STR(s->stop[1], "\n\n");
  CHECK_NEAR(s->presence_penalty, 0.5, 0);
  CHECK_NEAR(s->frequency_penalty, -0.5, 0);
  CHECK_NEAR(s->repetition_penalty, 1.1, 0);
  CHECK_EQ_INT(s->n_logit_bias, 2);
  CHECK_EQ_INT(s->logit_bias[0].id, 15);
  CHECK_NEAR(s->logit_bias[0].bias, -100, 0);
  CHECK_EQ_INT(s->logit_bias[1].id, 2000);
  CHECK_NEAR(s->logit_bias[1].bias, 3.5, 0);
  CHECK(s->logprobs);
  CHECK_EQ_INT(s->top_logprobs, 3);
  CHECK_EQ_INT(r.n, 1);
  CHECK_EQ_STR(r.user, "u7");
  CHECK(r.stream);
  CHECK(r.include_usage);
  serve_request_free(&r);
  CHECK(r.messages == NULL && r.model == NULL);
  serve_request_free(&r); /* twice is harmless */
}

static void test_chat_defaults(void) {
  serve_request r;
  serve_fail f;
  CHECK_EQ_INT(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":null,\"stop\":\"###\"}",
                     SERVE_CHAT, &r, &f),
               0);
  CHECK(r.model == NULL);
  CHECK(!r.stream && !r.include_usage);
  CHECK_EQ_INT(r.sampling.max_tokens, -1);
  CHECK(isnan(r.sampling.temperature) && isnan(r.sampling.top_p) && isnan(r.sampling.min_p));
  CHECK(isnan(r.sampling.presence_penalty) && isnan(r.sampling.frequency_penalty));
  CHECK(isnan(r.sampling.repetition_penalty));
  CHECK_EQ_INT(r.sampling.top_k, -1);
  CHECK(!r.sampling.has_seed);
  CHECK(!r.sampling.logprobs);
  CHECK_EQ_INT(r.sampling.n_stop, 1);
  CHECK_EQ_STR(r.sampling.stop[0], "###");
  serve_request_free(&r);
  /* max_completion_tokens is the newer name of max_tokens and wins. */
  CHECK_EQ_INT(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":9,"
                     "\"max_completion_tokens\":4,\"seed\":12.0}",
                     SERVE_CHAT, &r, &f),
               0);
  CHECK_EQ_INT(r.sampling.max_tokens, 4);
  CHECK(r.sampling.has_seed && r.sampling.seed == 12);
  serve_request_free(&r);
}

static void test_chat_refusals(void) {
  refused("{\"messages\": [", SERVE_CHAT, "");
  refused("", SERVE_CHAT, "");
  refused("[1,2]", SERVE_CHAT, "");
  refused("{}", SERVE_CHAT, "messages");
  refused("{\"messages\":{}}", SERVE_CHAT, "messages");
  refused("{\"messages\":[]}", SERVE_CHAT, "messages");
  refused("{\"messages\":[3]}", SERVE_CHAT, "messages[0]");
  refused("{\"messages\":[{\"content\":\"x\"}]}", SERVE_CHAT, "messages[0].role");
  refused("{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", SERVE_CHAT, "messages[0].role");
  refused("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":5}]}", SERVE_CHAT,
          "messages[1].content");
  refused("{\"messages\":[{\"role\":\"user\"}]}", SERVE_CHAT, "messages[0].content");
  refused("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
          "{\"type\":\"image_url\",\"image_url\":5}]}]}",
          SERVE_CHAT, "messages[0].content[1]");
  refused("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\",\"input_audio\":{\"format\":\"wav\"}}]}]}",
          SERVE_CHAT, "messages[0].content[0]");
  refused("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"file\",\"file\":{}}]}]}", SERVE_CHAT,
          "messages[0].content[0]");
  refused("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}", SERVE_CHAT,
          "messages[0].content[0]");
#define M "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
  refused(M "\"model\":5}", SERVE_CHAT, "model");
  refused(M "\"temperature\":\"hot\"}", SERVE_CHAT, "temperature");
  refused(M "\"temperature\":2.5}", SERVE_CHAT, "temperature");
  refused(M "\"top_p\":1.5}", SERVE_CHAT, "top_p");
  refused(M "\"top_k\":1.5}", SERVE_CHAT, "top_k");
  refused(M "\"min_p\":-1}", SERVE_CHAT, "min_p");
  refused(M "\"max_tokens\":0}", SERVE_CHAT, "max_tokens");
  refused(M "\"max_tokens\":\"10\"}", SERVE_CHAT, "max_tokens");
  refused(M "\"max_tokens\":2.5}", SERVE_CHAT, "max_tokens");
  refused(M "\"max_completion_tokens\":-3}", SERVE_CHAT, "max_completion_tokens");
  refused(M "\"seed\":1e30}", SERVE_CHAT, "seed");
  refused(M "\"seed\":true}", SERVE_CHAT, "seed");
  refused(M "\"n\":129}", SERVE_CHAT, "n");
  refused(M "\"n\":2,\"best_of\":3}", SERVE_CHAT, "best_of");
  refused(M "\"best_of\":0}", SERVE_CHAT, "best_of");
  refused(M "\"n\":0}", SERVE_CHAT, "n");
  refused(M "\"stream\":\"yes\"}", SERVE_CHAT, "stream");
  refused(M "\"stream_options\":{\"include_usage\":true}}", SERVE_CHAT, "stream_options");
  refused(M "\"stream\":true,\"stream_options\":{\"include_usage\":1}}", SERVE_CHAT, "stream_options.include_usage");
  refused(M "\"stop\":5}", SERVE_CHAT, "stop");
  refused(M "\"stop\":[\"a\",7]}", SERVE_CHAT, "stop");
  refused(M "\"stop\":[\"\"]}", SERVE_CHAT, "stop");
  refused(M "\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\","
            "\"16\",\"17\"]}",
          SERVE_CHAT, "stop");
  refused(M "\"presence_penalty\":3}", SERVE_CHAT, "presence_penalty");
  refused(M "\"frequency_penalty\":-2.5}", SERVE_CHAT, "frequency_penalty");
  refused(M "\"repetition_penalty\":0}", SERVE_CHAT, "repetition_penalty");
  refused(M "\"logit_bias\":[1]}", SERVE_CHAT, "logit_bias");
  refused(M "\"logit_bias\":{\"abc\":1}}", SERVE_CHAT, "logit_bias");
  refused(M "\"logit_bias\":{\"-4\":1}}", SERVE_CHAT, "logit_bias");
  refused(M "\"logit_bias\":{\"4\":101}}", SERVE_CHAT, "logit_bias");
  refused(M "\"logit_bias\":{\"4\":\"x\"}}", SERVE_CHAT, "logit_bias");
  refused(M "\"logprobs\":1}", SERVE_CHAT, "logprobs");
  refused(M "\"top_logprobs\":2}", SERVE_CHAT, "top_logprobs");
  refused(M "\"logprobs\":true,\"top_logprobs\":21}", SERVE_CHAT, "top_logprobs");
  refused(M "\"user\":[]}", SERVE_CHAT, "user");
#undef M
}

/* Tools, tool turns, tool_choice, template kwargs and response_format. */
static void test_chat_tools(void) {
  const char *body =
      "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":null,\"reasoning_content\":"
      "\"hm\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
      "\"{\\\"a\\\": [1, 2]}\"}},{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"not json\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"}],"
      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\",\"parameters\":{\"type\":"
      "\"object\"}}},{\"type\":\"function\",\"function\":{\"name\":\"g\"}}],\"tool_choice\":{\"type\":\"function\","
      "\"function\":{\"name\":\"g\"}},\"parallel_tool_calls\":false,\"reasoning_effort\":\"none\",\"chat_template_kwargs\":"
      "{\"x\":1},\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{\"type\":\"array\"}}}}";
  serve_request r;
  serve_fail f;
  CHECK(parse(body, SERVE_CHAT, &r, &f) == 0);
  CHECK_EQ_INT(r.nmessages, 3);
  if (r.nmessages == 3) {
    CHECK_EQ_STR(r.messages[1].content, "");
    json_t *calls = json_object_get(r.messages[1].extra, "tool_calls");
    CHECK(json_array_size(calls) == 2);
    json_t *a0 = json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments");
    CHECK(json_is_array(json_object_get(a0, "a"))); /* decoded for the template */
    json_t *a1 = json_object_get(json_object_get(json_array_get(calls, 1), "function"), "arguments");
    CHECK_EQ_STR(json_string_value(a1), "not json"); /* kept as it came */
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(calls, 0), "id")), "c1");
    CHECK_EQ_STR(json_string_value(json_object_get(r.messages[1].extra, "reasoning_content")), "hm");
    CHECK_EQ_STR(json_string_value(json_object_get(r.messages[2].extra, "tool_call_id")), "c1");
  }
  CHECK(json_array_size(r.tools) == 2);
  json_t *g = json_object_get(json_array_get(r.tools, 1), "function");
  CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(g, "parameters"), "type")), "object");
  CHECK_EQ_INT(r.tool_choice, SERVE_TOOLS_NAMED);
  CHECK_EQ_STR(r.tool_name, "g");
  CHECK(json_is_false(json_object_get(r.template_kwargs, "enable_thinking")));
  CHECK_EQ_STR(json_string_value(json_object_get(r.template_kwargs, "reasoning_effort")), "none");
  CHECK(json_integer_value(json_object_get(r.template_kwargs, "x")) == 1);
  CHECK_EQ_STR(json_string_value(json_object_get(r.json_schema, "type")), "array");
  serve_request_free(&r);

  const char *M = "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],";
  char b[512];
#define REFUSED(tail, param)                  \
  do {                                        \
    snprintf(b, sizeof b, "%s%s}", M, tail);  \
    refused(b, SERVE_CHAT, param);            \
  } while (0)
  REFUSED("\"tools\":{}", "tools");
  REFUSED("\"tools\":[{\"type\":\"retrieval\"}]", "tools[0]");
  REFUSED("\"tools\":[{\"type\":\"function\",\"function\":{}}]", "tools[0]");
  REFUSED("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]", "tools[0]");
  REFUSED("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]", "tools[0]");
  REFUSED("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]",
          "tools[1]");
  REFUSED("\"tool_choice\":\"required\"", "tool_choice");
  REFUSED("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"always\"", "tool_choice");
  REFUSED("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":{\"type\":\"function\"}",
          "tool_choice");
  REFUSED("\"functions\":[]", "functions");
  REFUSED("\"modalities\":[\"audio\"]", "modalities");
  REFUSED("\"audio\":{\"voice\":\"x\"}", "audio");
  REFUSED("\"reasoning_effort\":\"max\"", "reasoning_effort");
  REFUSED("\"chat_template_kwargs\":[]", "chat_template_kwargs");
  REFUSED("\"response_format\":{\"type\":\"xml\"}", "response_format");
  REFUSED("\"response_format\":{\"type\":\"json_schema\"}", "response_format");
  REFUSED("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\"}}", "response_format");
  REFUSED("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":null}}",
          "response_format");
  REFUSED("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"strnig\"}}}]",
          "tools[0]");
  REFUSED("\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":\"function\",\"function\":"
          "{\"name\":\"g\",\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":7}}}}}]",
          "tools[1]");
  REFUSED("\"response_format\":{\"type\":\"json_object\"},\"grammar\":\"root ::= \\\"a\\\"\"", "grammar");
  REFUSED("\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{}}]}]", "messages[0].tool_calls[0]");
#undef REFUSED
}

/* Media parts: kept in order as the template's parts, and as the request's media with their places. */
static void test_chat_media(void) {
  const char *body = "{\"messages\":[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"s\"}]},"
                     "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                     "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,AAAA\",\"detail\":\"low\"}},"
                     "{\"type\":\"input_audio\",\"input_audio\":{\"data\":\"UklG\",\"format\":\"wav\"}},"
                     "{\"type\":\"text\",\"text\":\"b\"},{\"type\":\"video_url\",\"video_url\":{\"url\":\"https://x/v.mp4\"}},"
                     "{\"type\":\"image_url\",\"image_url\":\"file:///tmp/p.png\"}]}]}";
  serve_request r;
  serve_fail f;
  int rc = serve_request_parse(body, strlen(body), SERVE_CHAT, &r, &f);
  CHECK_MSG(rc == 0, "%s", f.message);
  if (rc) return;
  CHECK_EQ_INT(r.n_media, 4);
  static const hearth_media_kind kinds[] = {HEARTH_MEDIA_IMAGE, HEARTH_MEDIA_AUDIO, HEARTH_MEDIA_VIDEO, HEARTH_MEDIA_IMAGE};
  static const char *const urls[] = {"data:image/png;base64,AAAA", "UklG", "https://x/v.mp4", "file:///tmp/p.png"};
  static const char *const names[] = {"messages[1].content[1]", "messages[1].content[2]", "messages[1].content[4]",
                                      "messages[1].content[5]"};
  for (int i = 0; i < r.n_media && i < 4; i++) {
    CHECK_EQ_INT(r.media[i].kind, kinds[i]);
    CHECK_EQ_STR(r.media[i].url, urls[i]);
    CHECK_EQ_STR(r.media[i].name, names[i]);
  }
  CHECK(r.messages[0].parts == NULL); /* text only: the joined text */
  CHECK_EQ_STR(r.messages[1].content, "ab");
  char *parts = r.messages[1].parts ? json_dumps(r.messages[1].parts, JSON_COMPACT) : NULL;
  CHECK_EQ_STR(parts ? parts : "", "[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"image\"},{\"type\":\"audio\"},"
                                    "{\"type\":\"text\",\"text\":\"b\"},{\"type\":\"video\"},{\"type\":\"image\"}]");
  free(parts);
  serve_request_free(&r);
}

static void test_completion(void) {
  serve_request r;
  serve_fail f;
  CHECK_EQ_INT(parse("{\"prompt\":\"Once\",\"max_tokens\":3,\"logprobs\":2,\"echo\":true}", SERVE_COMPLETION, &r, &f), 0);
  CHECK_EQ_STR(r.prompt, "Once");
  CHECK(r.messages == NULL);
  CHECK(r.echo);
  CHECK(r.sampling.logprobs);
  CHECK_EQ_INT(r.sampling.top_logprobs, 2);
  serve_request_free(&r);
  CHECK_EQ_INT(parse("{\"prompt\":[\"Once upon\"],\"logprobs\":0}", SERVE_COMPLETION, &r, &f), 0);
  CHECK_EQ_STR(r.prompt, "Once upon");
  CHECK(r.sampling.logprobs);
  CHECK_EQ_INT(r.sampling.top_logprobs, 0);
  serve_request_free(&r);
  refused("{}", SERVE_COMPLETION, "prompt");
  refused("{\"prompt\":7}", SERVE_COMPLETION, "prompt");
  /* token ids, bare or as the one element; ignore_eos */
  CHECK_EQ_INT(parse("{\"prompt\":[1,2,3],\"ignore_eos\":true}", SERVE_COMPLETION, &r, &f), 0);
  CHECK(r.n_prompt_ids == 3 && r.prompt_ids[0] == 1 && r.prompt_ids[2] == 3 && r.sampling.ignore_eos);
  serve_request_free(&r);
  CHECK_EQ_INT(parse("{\"prompt\":[[7]]}", SERVE_COMPLETION, &r, &f), 0);
  CHECK(r.n_prompt_ids == 1 && r.prompt_ids[0] == 7 && !r.sampling.ignore_eos);
  serve_request_free(&r);
  refused("{\"prompt\":[]}", SERVE_COMPLETION, "prompt");
  refused("{\"prompt\":[1,\"a\"]}", SERVE_COMPLETION, "prompt");
  refused("{\"prompt\":[1,-2]}", SERVE_COMPLETION, "prompt");
  refused("{\"prompt\":[[1],[2.5]]}", SERVE_COMPLETION, "prompt[1]");
  refused("{\"prompt\":[1],\"echo\":true}", SERVE_COMPLETION, "echo");
  refused("{\"prompt\":\"a\",\"ignore_eos\":1}", SERVE_COMPLETION, "ignore_eos");
  refused("{\"prompt\":\"a\",\"logprobs\":6}", SERVE_COMPLETION, "logprobs");
  refused("{\"prompt\":\"a\",\"logprobs\":true}", SERVE_COMPLETION, "logprobs");
  refused("{\"prompt\":\"a\",\"echo\":1}", SERVE_COMPLETION, "echo");
  /* Chat fields mean nothing here: max_completion_tokens is ignored, messages too. */
  CHECK_EQ_INT(parse("{\"prompt\":\"a\",\"max_completion_tokens\":0,\"messages\":5}", SERVE_COMPLETION, &r, &f), 0);
  CHECK_EQ_INT(r.sampling.max_tokens, -1);
  serve_request_free(&r);
}

/* Prompt arrays and n: one prompt per entry, token-id arrays kept whole, the
 * choices capped, each bad entry named. */
static void test_completion_batch(void) {
  serve_request r;
  serve_fail f;
  CHECK_EQ_INT(parse("{\"prompt\":[\"a\",\"bc\",[5,6]],\"n\":3,\"best_of\":3}", SERVE_COMPLETION, &r, &f), 0);
  CHECK_EQ_INT(r.n_prompts, 3);
  CHECK_EQ_INT(r.n, 3);
  serve_prompt q;
  serve_request_prompt(&r, 0, &q);
  CHECK_EQ_STR(q.text, "a");
  CHECK(q.ids == NULL);
  serve_request_prompt(&r, 1, &q);
  CHECK_EQ_STR(q.text, "bc");
  serve_request_prompt(&r, 2, &q);
  CHECK(q.ids && q.n_ids == 2 && q.ids[0] == 5 && q.ids[1] == 6);
  serve_request_free(&r);
  /* a flat array of ids is one prompt, as OpenAI reads it */
  CHECK_EQ_INT(parse("{\"prompt\":[1,2,3]}", SERVE_COMPLETION, &r, &f), 0);
  CHECK_EQ_INT(r.n_prompts, 1);
  CHECK_EQ_INT((int)r.n_prompt_ids, 3);
  serve_request_free(&r);
  CHECK_EQ_INT(parse("{\"prompt\":\"x\"}", SERVE_COMPLETION, &r, &f), 0);
  CHECK_EQ_INT(r.n_prompts, 1);
  CHECK_EQ_INT(r.n, 1);
  serve_request_free(&r);
  refused("{\"prompt\":[\"a\",5]}", SERVE_COMPLETION, "prompt[1]");
  refused("{\"prompt\":[\"a\",[]]}", SERVE_COMPLETION, "prompt[1]");
  refused("{\"prompt\":[[1],[-1]]}", SERVE_COMPLETION, "prompt[1]");
  refused("{\"prompt\":[\"a\",\"b\"],\"n\":100}", SERVE_COMPLETION, "n");
  /* best_of: at least n, not streamed, prompts × best_of capped */
  CHECK_EQ_INT(parse("{\"prompt\":\"x\",\"n\":2,\"best_of\":5}", SERVE_COMPLETION, &r, &f), 0);
  CHECK_EQ_INT(r.n, 2);
  CHECK_EQ_INT(r.best_of, 5);
  serve_request_free(&r);
  refused("{\"prompt\":\"x\",\"n\":3,\"best_of\":2}", SERVE_COMPLETION, "best_of");
  refused("{\"prompt\":\"x\",\"best_of\":2,\"stream\":true}", SERVE_COMPLETION, "best_of");
  refused("{\"prompt\":[\"a\",\"b\"],\"best_of\":100}", SERVE_COMPLETION, "best_of");
  refused("{\"prompt\":[\"a\",[1]],\"echo\":true}", SERVE_COMPLETION, "echo");
  hbuf b = {0};
  hbuf_puts(&b, "{\"prompt\":[");
  for (int i = 0; i < SERVE_MAX_CHOICES + 1; i++) hbuf_puts(&b, i ? ",\"p\"" : "\"p\"");
  hbuf_puts(&b, "]}");
  refused(hbuf_str(&b), SERVE_COMPLETION, "prompt");
  hbuf_free(&b);
}

static void test_fail_json(void) {
  serve_fail f;
  serve_fail_set(&f, 400, "invalid_request_error", "messages", "context_length_exceeded", "too long: %d", 9);
  char *s = serve_fail_json(&f);
  json_t *j = json_loads(s, 0, NULL);
  CHECK(j != NULL);
  json_t *e = json_object_get(j, "error");
  CHECK_EQ_STR(json_string_value(json_object_get(e, "message")), "too long: 9");
  CHECK_EQ_STR(json_string_value(json_object_get(e, "type")), "invalid_request_error");
  CHECK_EQ_STR(json_string_value(json_object_get(e, "param")), "messages");
  CHECK_EQ_STR(json_string_value(json_object_get(e, "code")), "context_length_exceeded");
  json_decref(j);
  free(s);
  /* No param or code: JSON nulls. A message quoting invalid UTF-8 still makes valid JSON. */
  serve_fail_set(&f, 404, "invalid_request_error", NULL, NULL, "Unknown route: GET /\xff\xfe");
  s = serve_fail_json(&f);
  CHECK(s != NULL);
  j = json_loads(s, 0, NULL);
  CHECK(j != NULL);
  e = json_object_get(j, "error");
  CHECK(json_is_null(json_object_get(e, "param")));
  CHECK(json_is_null(json_object_get(e, "code")));
  CHECK_EQ_STR(json_string_value(json_object_get(e, "message")), "Unknown route: GET /");
  json_decref(j);
  free(s);
}

/* Schemas: a json_schema format needs its schema; tool parameters are checked as
 * that schema is (an unsupported keyword passes, a broken schema does not); nesting
 * is capped at 64 levels. */
static void test_schemas(void) {
  serve_request r;
  serve_fail f;
  const char *nos = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                    "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\"}}}";
  CHECK_EQ_INT(parse(nos, SERVE_CHAT, &r, &f), 400);
  CHECK_MSG(strstr(f.message, "'response_format.json_schema.schema' is required") != NULL, "%s", f.message);
  const char *badtype = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
                        "\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"strnig\"}}}}}]}";
  CHECK_EQ_INT(parse(badtype, SERVE_CHAT, &r, &f), 400);
  CHECK_MSG(strstr(f.message, "tools[0].parameters") && strstr(f.message, "unknown type 'strnig'"), "%s", f.message);
  const char *unsup = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
                      "\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"n\":"
                      "{\"type\":\"integer\",\"multipleOf\":2}}}}}]}";
  CHECK_EQ_INT(parse(unsup, SERVE_CHAT, &r, &f), 0);
  serve_request_free(&r);
  for (int levels = 64; levels <= 1000; levels += 936) {
    hbuf b = {0};
    hbuf_puts(&b, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\","
                  "\"json_schema\":{\"name\":\"n\",\"schema\":");
    for (int i = 1; i < levels; i++) hbuf_puts(&b, "{\"type\":\"object\",\"properties\":{\"a\":");
    hbuf_puts(&b, "{\"type\":\"string\"}");
    for (int i = 1; i < levels; i++) hbuf_puts(&b, "}}");
    hbuf_puts(&b, "}}}");
    int rc = parse(hbuf_str(&b), SERVE_CHAT, &r, &f);
    if (levels == 64) {
      CHECK_MSG(rc == 0, "%s", f.message);
      if (!rc) serve_request_free(&r);
    } else {
      CHECK_EQ_INT(rc, 400);
      CHECK_EQ_STR(f.param, "response_format");
      CHECK_MSG(strstr(f.message, "deeper than 64 levels") != NULL, "%s", f.message);
    }
    hbuf_free(&b);
  }
}

int main(void) {
  RUN(test_chat_all_fields);
  RUN(test_chat_defaults);
  RUN(test_chat_refusals);
  RUN(test_chat_tools);
  RUN(test_chat_media);
  RUN(test_completion);
  RUN(test_completion_batch);
  RUN(test_fail_json);
  RUN(test_schemas);
  TEST_MAIN_END();
}
