/* test_reply.c — response bodies and SSE chunks against OpenAI's documented
 * shapes, written out by hand below (field order as OpenAI sends it), plus
 * UTF-8 repair of engine output. */
#include <jansson.h>

#include "serve/reply.h"
#include "test.h"

#define FP "\"system_fingerprint\":\"hearth-" HEARTH_VERSION "\""

static void fixed(serve_reply *r, serve_kind kind, bool logprobs) {
  serve_reply_init(r, kind, "tiny-llama", 1700000000, 1, logprobs);
  snprintf(r->id, sizeof r->id, "%s", kind == SERVE_CHAT ? "chatcmpl-abc" : "cmpl-abc");
}

static serve_token tok(const char *text) {
  serve_token t = {.text = text, .len = strlen(text), .id = 7, .token_text = text, .token_len = strlen(text),
                   .logprob = -0.25f};
  return t;
}

static void test_ids(void) {
  serve_reply a, b;
  serve_reply_init(&a, SERVE_CHAT, "m", 1700000000, 1, false);
  serve_reply_init(&b, SERVE_COMPLETION, "m", 1700000000, 2, false);
  CHECK(strncmp(a.id, "chatcmpl-", 9) == 0 && strlen(a.id) > 20);
  CHECK(strncmp(b.id, "cmpl-", 5) == 0 && strlen(b.id) > 16);
  CHECK(strcmp(a.id + 9, b.id + 5) != 0);
  serve_reply_free(&a);
  serve_reply_free(&b);
}

static void test_chat_stream(void) {
  serve_reply r;
  fixed(&r, SERVE_CHAT, false);
  hbuf out = {0};
  serve_sse_start(&r, &out);
  CHECK_EQ_STR(hbuf_str(&out), "data: {\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
                               "\"model\":\"tiny-llama\"," FP ",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
                               "\"content\":\"\",\"refusal\":null},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
  hbuf_clear(&out);
  serve_token t = tok("Hel\"lo\n");
  serve_sse_token(&r, &t, &out);
  CHECK_EQ_STR(hbuf_str(&out), "data: {\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
                               "\"model\":\"tiny-llama\"," FP ",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
                               "\"Hel\\\"lo\\n\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n");
  hbuf_clear(&out);
  /* A step that released nothing (held back) sends nothing. */
  serve_token empty = tok("");
  serve_sse_token(&r, &empty, &out);
  CHECK_EQ_INT(out.len, 0);
  serve_sse_finish(&r, SERVE_FINISH_LENGTH, &out);
  CHECK_EQ_STR(hbuf_str(&out), "data: {\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
                               "\"model\":\"tiny-llama\"," FP ",\"choices\":[{\"index\":0,\"delta\":{},"
                               "\"logprobs\":null,\"finish_reason\":\"length\"}]}\n\n");
  hbuf_clear(&out);
  serve_result res = {.finish = SERVE_FINISH_STOP, .prompt_tokens = 11, .completion_tokens = 2};
  serve_sse_usage(&r, &res, &out);
  CHECK_EQ_STR(hbuf_str(&out), "data: {\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
                               "\"model\":\"tiny-llama\"," FP ",\"choices\":[],\"usage\":{\"prompt_tokens\":11,"
                               "\"completion_tokens\":2,\"total_tokens\":13,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n");
  hbuf_clear(&out);
  serve_sse_done(&out);
  CHECK_EQ_STR(hbuf_str(&out), "data: [DONE]\n\n");
  hbuf_free(&out);
  serve_reply_free(&r);
}

static void test_chat_stream_usage_null(void) {
  serve_reply r;
  fixed(&r, SERVE_CHAT, false);
  r.usage_null = true; /* stream_options.include_usage: every chunk says "usage": null */
  hbuf out = {0};
  serve_token t = tok("a");
  serve_sse_token(&r, &t, &out);
  CHECK_EQ_STR(hbuf_str(&out), "data: {\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
                               "\"model\":\"tiny-llama\"," FP ",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},"
                               "\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n");
  hbuf_free(&out);
  serve_reply_free(&r);
}

static void test_completion_stream(void) {
  serve_reply r;
  fixed(&r, SERVE_COMPLETION, false);
  hbuf out = {0};
  serve_sse_start(&r, &out); /* completions have no role chunk */
  CHECK_EQ_INT(out.len, 0);
  serve_token t = tok(" upon");
  serve_sse_token(&r, &t, &out);
  CHECK_EQ_STR(hbuf_str(&out), "data: {\"id\":\"cmpl-abc\",\"object\":\"text_completion\",\"created\":1700000000,"
                               "\"model\":\"tiny-llama\"," FP ",\"choices\":[{\"index\":0,\"text\":\" upon\","
                               "\"logprobs\":null,\"finish_reason\":null}]}\n\n");
  hbuf_clear(&out);
  serve_sse_finish(&r, SERVE_FINISH_STOP, &out);
  CHECK_EQ_STR(hbuf_str(&out), "data: {\"id\":\"cmpl-abc\",\"object\":\"text_completion\",\"created\":1700000000,"
                               "\"model\":\"tiny-llama\"," FP ",\"choices\":[{\"index\":0,\"text\":\"\","
                               "\"logprobs\":null,\"finish_reason\":\"stop\"}]}\n\n");
  hbuf_free(&out);
  serve_reply_free(&r);
}

static void test_chat_whole(void) {
  serve_reply r;
  fixed(&r, SERVE_CHAT, true);
  serve_top_logprob top[2] = {{"Hi", 2, -0.25f}, {"Yo", 2, -2.0f}};
  serve_token a = tok("Hi");
  a.top = top;
  a.ntop = 2;
  serve_token b = tok("!");
  b.logprob = -1.5f;
  serve_reply_add(&r, &a);
  serve_reply_add(&r, &b);
  serve_result res = {.finish = SERVE_FINISH_STOP, .prompt_tokens = 5, .completion_tokens = 2};
  hbuf out = {0};
  serve_reply_body(&r, &res, &out);
  CHECK_EQ_STR(hbuf_str(&out),
               "{\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion\",\"created\":1700000000,\"model\":\"tiny-llama\"," FP
               ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"Hi!\",\"refusal\":null},"
               "\"logprobs\":{\"content\":[{\"token\":\"Hi\",\"logprob\":-0.25,\"bytes\":[72,105],\"top_logprobs\":["
               "{\"token\":\"Hi\",\"logprob\":-0.25,\"bytes\":[72,105]},{\"token\":\"Yo\",\"logprob\":-2.0,\"bytes\":[89,111]}]},"
               "{\"token\":\"!\",\"logprob\":-1.5,\"bytes\":[33],\"top_logprobs\":[]}],\"refusal\":null},"
               "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
  hbuf_free(&out);
  serve_reply_free(&r);
}

static void test_completion_whole_logprobs(void) {
  serve_reply r;
  fixed(&r, SERVE_COMPLETION, true);
  serve_top_logprob top[1] = {{" a", 2, -0.5f}};
  serve_token a = tok(" a");
  a.top = top;
  a.ntop = 1;
  a.logprob = -0.5f;
  serve_token b = tok(" b");
  b.logprob = -INFINITY; /* still a JSON number */
  serve_reply_add(&r, &a);
  serve_reply_add(&r, &b);
  serve_result res = {.finish = SERVE_FINISH_LENGTH, .prompt_tokens = 3, .completion_tokens = 2};
  hbuf out = {0};
  serve_reply_body(&r, &res, &out);
  CHECK_EQ_STR(hbuf_str(&out),
               "{\"id\":\"cmpl-abc\",\"object\":\"text_completion\",\"created\":1700000000,\"model\":\"tiny-llama\"," FP
               ",\"choices\":[{\"index\":0,\"text\":\" a b\",\"logprobs\":{\"tokens\":[\" a\",\" b\"],"
               "\"token_logprobs\":[-0.5,-9999.0],\"top_logprobs\":[{\" a\":-0.5},{}],\"text_offset\":[0,2]},"
               "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
  hbuf_free(&out);
  serve_reply_free(&r);
}

static void test_utf8_clean(void) {
  hbuf b = {0};
  serve_utf8_clean("h\xc3\xa9llo \xe2\x82\xac", 10, &b);
  CHECK_EQ_STR(hbuf_str(&b), "h\xc3\xa9llo \xe2\x82\xac");
  hbuf_clear(&b);
  serve_utf8_clean("a\xff" "b\xe2\x82", 5, &b); /* a stray byte, a truncated euro sign */
  CHECK_EQ_STR(hbuf_str(&b), "a\xef\xbf\xbd" "b\xef\xbf\xbd\xef\xbf\xbd");
  hbuf_clear(&b);
  serve_utf8_clean("\xed\xa0\x80", 3, &b); /* a surrogate is not UTF-8 */
  CHECK_EQ_STR(hbuf_str(&b), "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
  hbuf_free(&b);
  /* Invalid bytes in a token still produce valid JSON; bytes keep the raw values. */
  serve_reply r;
  fixed(&r, SERVE_CHAT, true);
  serve_token t = tok("\xe2\x82");
  hbuf out = {0};
  serve_sse_token(&r, &t, &out);
  CHECK(strncmp(hbuf_str(&out), "data: ", 6) == 0);
  json_t *j = json_loads(hbuf_str(&out) + 6, 0, NULL);
  CHECK(j != NULL);
  json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
  CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(choice, "delta"), "content")),
               "\xef\xbf\xbd\xef\xbf\xbd");
  json_t *e = json_array_get(json_object_get(json_object_get(choice, "logprobs"), "content"), 0);
  CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(e, "bytes"), 0)), 0xe2);
  CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(e, "bytes"), 1)), 0x82);
  json_decref(j);
  hbuf_free(&out);
  serve_reply_free(&r);
}

static void test_sse_error(void) {
  serve_fail f;
  serve_fail_set(&f, 500, "server_error", NULL, NULL, "boom");
  hbuf out = {0};
  serve_sse_error(&f, &out);
  CHECK_EQ_STR(hbuf_str(&out),
               "data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\",\"param\":null,\"code\":null}}\n\n");
  hbuf_free(&out);
}

/* Several choices in one body: each at its index, the usage as summed by the caller. */
static void test_body_choices(void) {
  serve_reply a, b;
  fixed(&a, SERVE_COMPLETION, false);
  fixed(&b, SERVE_COMPLETION, false);
  b.index = 1;
  serve_token t = tok("hi");
  serve_reply_add(&a, &t);
  t = tok("yo");
  serve_reply_add(&b, &t);
  serve_reply *r[2] = {&a, &b};
  serve_result res[2] = {{.finish = SERVE_FINISH_LENGTH, .prompt_tokens = 3, .completion_tokens = 1},
                         {.finish = SERVE_FINISH_STOP, .prompt_tokens = 3, .completion_tokens = 1}};
  serve_result usage = {.prompt_tokens = 3, .completion_tokens = 2};
  hbuf out = {0};
  serve_reply_body_n(r, res, 2, &usage, &out);
  CHECK_EQ_STR(hbuf_str(&out), "{\"id\":\"cmpl-abc\",\"object\":\"text_completion\",\"created\":1700000000,"
                               "\"model\":\"tiny-llama\"," FP ",\"choices\":[{\"index\":0,\"text\":\"hi\",\"logprobs\":null,"
                               "\"finish_reason\":\"length\"},{\"index\":1,\"text\":\"yo\",\"logprobs\":null,"
                               "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,"
                               "\"total_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":0}}}");
  hbuf_clear(&out);
  serve_sse_finish(&b, SERVE_FINISH_STOP, &out);
  CHECK(strstr(hbuf_str(&out), "\"choices\":[{\"index\":1,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"stop\"}]"));
  hbuf_free(&out);
  serve_reply_free(&a);
  serve_reply_free(&b);
}

int main(void) {
  RUN(test_body_choices);
  RUN(test_ids);
  RUN(test_chat_stream);
  RUN(test_chat_stream_usage_null);
  RUN(test_completion_stream);
  RUN(test_chat_whole);
  RUN(test_completion_whole_logprobs);
  RUN(test_utf8_clean);
  RUN(test_sse_error);
  TEST_MAIN_END();
}
