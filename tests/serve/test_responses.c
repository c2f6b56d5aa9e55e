/* test_responses.c — the OpenAI Responses unit (src/serve/responses.c):
 * request bodies into serve_request messages (string and item input,
 * instructions, developer role, function calls and their outputs, reasoning
 * items, a stored history first), every refusal naming its field, the
 * response object and the stream's events (order, sequence numbers, item
 * indices, argument deltas joining to the arguments), and the store's
 * count, byte and age limits. */
#include <jansson.h>
#include <unistd.h>

#include "serve/responses.h"
#include "test.h"

static int parse(const char *body, serve_request *r, resp_request *rr, serve_fail *f) {
  memset(f, 0, sizeof *f);
  int rc = resp_request_parse(body, strlen(body), r, rr, f);
  if (!rc && (rc = resp_request_messages(r, rr, NULL, f)) != 0) {
    /* refused at the messages: what parsing made is freed as the server frees it */
    serve_request_free(r);
    resp_request_free(rr);
    memset(r, 0, sizeof *r);
  }
  return rc;
}

static void refused(const char *body, const char *param) {
  serve_request r;
  resp_request rr;
  serve_fail f;
  int rc = parse(body, &r, &rr, &f);
  CHECK_MSG(rc == 400, "body %s: rc %d", body, rc);
  CHECK_MSG(strcmp(f.param, param) == 0, "body %s: param '%s', want '%s' (%s)", body, f.param, param, f.message);
  CHECK(f.message[0] != 0);
  if (!rc) {
    serve_request_free(&r);
    resp_request_free(&rr);
  }
}

static void test_messages(void) {
  serve_request r;
  resp_request rr;
  serve_fail f;
  const char *body =
      "{\"model\":\"m\",\"instructions\":\"Be brief.\",\"max_output_tokens\":32,\"temperature\":0.5,\"store\":false,"
      "\"input\":[{\"role\":\"developer\",\"content\":\"rules\"},"
      "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},{\"type\":\"input_text\",\"text\":\"b\"}]},"
      "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[],\"content\":[{\"type\":\"reasoning_text\",\"text\":\"hmm\"}]},"
      "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"let me\"}]},"
      "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"},"
      "{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"g\",\"arguments\":\"{}\"},"
      "{\"type\":\"function_call_output\",\"call_id\":\"c1\",\"output\":\"one\"},"
      "{\"type\":\"function_call_output\",\"call_id\":\"c2\",\"output\":[{\"type\":\"input_text\",\"text\":\"two\"}]},"
      "{\"role\":\"user\",\"content\":\"next\"}],"
      "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":{\"type\":\"object\"}},{\"type\":\"function\",\"name\":\"g\"}],"
      "\"tool_choice\":{\"type\":\"function\",\"name\":\"g\"},\"reasoning\":{\"effort\":\"none\"}}";
  CHECK_EQ_INT(parse(body, &r, &rr, &f), 0);
  CHECK_EQ_INT(r.nmessages, 7);
  static const char *roles[] = {"system", "system", "user", "assistant", "tool", "tool", "user"};
  static const char *contents[] = {"Be brief.", "rules", "ab", "let me", "one", "two", "next"};
  for (int i = 0; i < r.nmessages && i < 7; i++) {
    CHECK_EQ_STR(r.messages[i].role, roles[i]);
    CHECK_EQ_STR(r.messages[i].content, contents[i]);
  }
  json_t *a = r.messages[3].extra;
  CHECK(json_array_size(json_object_get(a, "tool_calls")) == 2);
  CHECK_EQ_STR(json_string_value(json_object_get(a, "reasoning_content")), "hmm");
  json_t *c0 = json_array_get(json_object_get(a, "tool_calls"), 0);
  CHECK_EQ_STR(json_string_value(json_object_get(c0, "id")), "c1");
  CHECK(json_integer_value(json_object_get(json_object_get(json_object_get(c0, "function"), "arguments"), "x")) == 1);
  CHECK_EQ_STR(json_string_value(json_object_get(r.messages[5].extra, "tool_call_id")), "c2");
  CHECK(r.sampling.max_tokens == 32 && r.sampling.temperature == 0.5);
  CHECK(!rr.store);
  CHECK(r.tool_choice == SERVE_TOOLS_NAMED && !strcmp(r.tool_name, "g"));
  CHECK(json_is_false(json_object_get(r.template_kwargs, "enable_thinking")));
  CHECK_EQ_INT(json_array_size(r.tools), 2);
  serve_request_free(&r);
  resp_request_free(&rr);
  /* a string input is one user message; a history comes first */
  CHECK_EQ_INT(resp_request_parse("{\"input\":\"hi\"}", 14, &r, &rr, &f), 0);
  json_t *hist = json_loads("[{\"type\":\"message\",\"role\":\"user\",\"content\":\"q\"},"
                            "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"a\"}]}]",
                            0, NULL);
  CHECK_EQ_INT(resp_request_messages(&r, &rr, hist, &f), 0);
  CHECK_EQ_INT(r.nmessages, 3);
  CHECK(r.nmessages == 3 && !strcmp(r.messages[1].role, "assistant") && !strcmp(r.messages[2].content, "hi"));
  json_decref(hist);
  serve_request_free(&r);
  resp_request_free(&rr);
}

static void test_refusals(void) {
  refused("{", "");
  refused("[]", "");
  refused("{}", "input");
  refused("{\"input\":5}", "input");
  refused("{\"input\":\"x\",\"model\":3}", "model");
  refused("{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"file_id\":\"x\"}]}]}", "input[0].content[0]");
  refused("{\"input\":[{\"role\":\"assistant\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"x\"}]}]}",
          "input[0].content[0]");
  refused("{\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", "input[0]");
  refused("{\"input\":[{\"type\":\"function_call\",\"name\":\"f\"}]}", "input[0]");
  refused("{\"input\":[{\"type\":\"function_call_output\",\"output\":\"x\"}]}", "input[0]");
  refused("{\"input\":[{\"role\":\"robot\",\"content\":\"x\"}]}", "input[0]");
  refused("{\"input\":[{\"type\":\"wat\"}]}", "input[0]");
  refused("{\"input\":[]}", "input");
  refused("{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0]");
  refused("{\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}", "tools[0]");
  refused("{\"input\":\"x\",\"tool_choice\":\"sometimes\"}", "tool_choice");
  refused("{\"input\":\"x\",\"tool_choice\":\"required\"}", "tool_choice");
  refused("{\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens");
  refused("{\"input\":\"x\",\"temperature\":3}", "temperature");
  refused("{\"input\":\"x\",\"background\":true}", "background");
  refused("{\"input\":\"x\",\"conversation\":\"c\"}", "conversation");
  refused("{\"input\":\"x\",\"reasoning\":{\"effort\":\"max\"}}", "reasoning.effort");
  refused("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"xml\"}}}", "text.format");
  refused("{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"schema\":{\"type\":\"string\",\"pattern\":\"(?!x)\"}}}}",
          "text.format");
  refused("{\"input\":\"x\",\"metadata\":[]}", "metadata");
  refused("{\"input\":\"x\",\"previous_response_id\":5}", "previous_response_id");
}

/* Every SSE event: "event: T" and a data object with type T and the next sequence number. */
static json_t *events_of(const hbuf *b) {
  json_t *all = json_array();
  const char *p = b->data, *end = b->data + b->len;
  while (p && p < end) {
    const char *ev = strstr(p, "event: ");
    if (!ev || ev >= end) break;
    const char *nl = strchr(ev, '\n');
    const char *d = nl ? strstr(nl, "data: ") : NULL;
    const char *dn = d ? strchr(d, '\n') : NULL;
    if (!nl || !d || !dn) break;
    json_t *j = json_loadb(d + 6, (size_t)(dn - d - 6), 0, NULL);
    CHECK(j != NULL);
    if (!j) break;
    CHECK(strncmp(json_string_value(json_object_get(j, "type")), ev + 7, (size_t)(nl - ev - 7)) == 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "sequence_number")), (long long)json_array_size(all));
    json_array_append_new(all, j);
    p = dn + 1;
  }
  return all;
}

static void test_stream_with_calls(void) {
  resp_request rr = {.store = true, .input = json_array(), .echo = json_object()};
  resp_reply r;
  resp_reply_init(&r, "m", 42, &rr);
  tc_opts o = {.format = TC_HERMES, .tools = true, .reasoning = true};
  CHECK_EQ_INT(resp_reply_parse(&r, &o, NULL), 0);
  hbuf b = {0};
  resp_sse_start(&r, &b);
  const char *text = "<think>why</think>Sure. <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": \"a\\\"b\"}}\n</tool_call>";
  for (const char *p = text; *p; p++) { /* byte by byte */
    serve_token t = {.text = p, .len = 1};
    resp_sse_token(&r, &t, &b);
  }
  serve_token fl = {.flush = true};
  resp_sse_token(&r, &fl, &b);
  serve_result res = {.finish = SERVE_FINISH_STOP, .stop_index = -1, .prompt_tokens = 10, .completion_tokens = 20, .cached_tokens = 4};
  resp_sse_finish(&r, &res, &b);
  json_t *ev = events_of(&b);
  size_t n = json_array_size(ev);
  CHECK(n > 10);
  CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(ev, 0), "type")), "response.created");
  CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(ev, n - 1), "type")), "response.completed");
  hbuf args = {0}, reas = {0}, txt = {0};
  size_t i;
  json_t *e;
  json_array_foreach(ev, i, e) {
    const char *t = json_string_value(json_object_get(e, "type"));
    json_t *d = json_object_get(e, "delta");
    if (!strcmp(t, "response.function_call_arguments.delta")) hbuf_puts(&args, json_string_value(d));
    if (!strcmp(t, "response.reasoning_text.delta")) hbuf_puts(&reas, json_string_value(d));
    if (!strcmp(t, "response.output_text.delta")) hbuf_puts(&txt, json_string_value(d));
    if (!strcmp(t, "response.function_call_arguments.done")) {
      CHECK_EQ_STR(json_string_value(json_object_get(e, "arguments")), hbuf_str(&args));
      CHECK_EQ_INT(json_integer_value(json_object_get(e, "output_index")), 2);
    }
  }
  CHECK_EQ_STR(hbuf_str(&reas), "why");
  CHECK_EQ_STR(hbuf_str(&txt), "Sure.");
  json_t *parsed = json_loads(hbuf_str(&args), 0, NULL);
  CHECK(parsed && !strcmp(json_string_value(json_object_get(parsed, "x")), "a\"b"));
  json_decref(parsed);
  json_t *final = json_object_get(json_array_get(ev, n - 1), "response");
  json_t *out = json_object_get(final, "output");
  CHECK_EQ_INT(json_array_size(out), 3);
  CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(out, 0), "type")), "reasoning");
  CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(out, 1), "type")), "message");
  CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(out, 2), "type")), "function_call");
  CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(out, 2), "arguments")), hbuf_str(&args));
  CHECK_EQ_STR(json_string_value(json_object_get(final, "status")), "completed");
  CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(json_object_get(final, "usage"), "input_tokens_details"), "cached_tokens")), 4);
  /* the conversation: input then output */
  json_t *conv = resp_reply_conversation(&r, NULL);
  CHECK_EQ_INT(json_array_size(conv), 3);
  json_decref(conv);
  json_decref(ev);
  hbuf_free(&args), hbuf_free(&reas), hbuf_free(&txt), hbuf_free(&b);
  resp_reply_free(&r);
  resp_request_free(&rr);
}

/* A reply cut by max_output_tokens: the response and the message item it cut are
 * "incomplete" (an item closed before the cut stays "completed"), whole and streamed. */
static void test_incomplete(void) {
  for (int stream = 0; stream < 2; stream++) {
    resp_request rr = {.store = true, .input = json_array(), .echo = json_object()};
    resp_reply r;
    resp_reply_init(&r, "m", 7, &rr);
    tc_opts o = {.format = TC_HERMES, .tools = false, .reasoning = true};
    CHECK_EQ_INT(resp_reply_parse(&r, &o, NULL), 0);
    hbuf b = {0};
    if (stream) resp_sse_start(&r, &b);
    const char *parts[] = {"<think>hm</think>", "The answer", " is"};
    for (int i = 0; i < 3; i++) {
      serve_token t = {.text = parts[i], .len = strlen(parts[i])};
      if (stream) resp_sse_token(&r, &t, &b);
      else resp_reply_add(&r, &t);
    }
    serve_token fl = {.flush = true};
    if (stream) resp_sse_token(&r, &fl, &b);
    else resp_reply_add(&r, &fl);
    serve_result res = {.finish = SERVE_FINISH_LENGTH, .stop_index = -1, .prompt_tokens = 3, .completion_tokens = 3};
    json_t *final, *ev = NULL;
    if (stream) {
      resp_sse_finish(&r, &res, &b);
      ev = events_of(&b);
      size_t n = json_array_size(ev);
      CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(ev, n - 1), "type")), "response.incomplete");
      final = json_incref(json_object_get(json_array_get(ev, n - 1), "response"));
      size_t i;
      json_t *e;
      int done = 0;
      json_array_foreach(ev, i, e) { /* the message's output_item.done says incomplete too */
        if (strcmp(json_string_value(json_object_get(e, "type")), "response.output_item.done")) continue;
        json_t *item = json_object_get(e, "item");
        const char *type = json_string_value(json_object_get(item, "type"));
        CHECK_EQ_STR(json_string_value(json_object_get(item, "status")), !strcmp(type, "message") ? "incomplete" : "completed");
        done++;
      }
      CHECK_EQ_INT(done, 2);
    } else {
      final = resp_reply_object(&r, &res);
    }
    CHECK_EQ_STR(json_string_value(json_object_get(final, "status")), "incomplete");
    json_t *out = json_object_get(final, "output");
    CHECK_EQ_INT(json_array_size(out), 2);
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(out, 0), "type")), "reasoning");
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(out, 0), "status")), "completed");
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(out, 1), "type")), "message");
    CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(out, 1), "status")), "incomplete");
    json_decref(final);
    json_decref(ev);
    hbuf_free(&b);
    resp_reply_free(&r);
    resp_request_free(&rr);
  }
}

static void test_store(void) {
  resp_store *s = NULL;
  CHECK_EQ_INT(resp_store_new(2, 0, 0, &s, NULL), 0);
  json_t *conv = json_array();
  for (int i = 0; i < 3; i++) {
    char id[16];
    snprintf(id, sizeof id, "resp_%d", i);
    json_t *o = json_pack("{s:s, s:i}", "id", id, "n", i);
    resp_store_put(s, o, conv);
    json_decref(o);
  }
  json_t *c = NULL;
  CHECK(resp_store_get(s, "resp_0", NULL) == NULL);
  json_t *g = resp_store_get(s, "resp_2", &c);
  CHECK(g && json_integer_value(json_object_get(g, "n")) == 2 && json_is_array(c));
  json_decref(g), json_decref(c);
  CHECK(resp_store_delete(s, "resp_1") && !resp_store_delete(s, "resp_1"));
  size_t n, bytes;
  resp_store_counts(s, &n, &bytes);
  CHECK_EQ_INT(n, 1);
  resp_store_free(s);
  /* bytes: a big entry pushes the older out; one bigger than the limit is not kept */
  CHECK_EQ_INT(resp_store_new(0, 200, 0, &s, NULL), 0);
  json_t *small = json_pack("{s:s, s:s}", "id", "a", "pad", "0123456789012345678901234567890123456789");
  json_t *mid = json_pack("{s:s, s:s}", "id", "b", "pad", "0123456789012345678901234567890123456789012345678901234567890123456789");
  char pad[201];
  memset(pad, 'x', 200);
  pad[200] = 0;
  json_t *huge = json_pack("{s:s, s:s}", "id", "c", "pad", pad);
  resp_store_put(s, small, conv);
  resp_store_put(s, mid, conv);
  g = resp_store_get(s, "a", NULL);
  CHECK(g != NULL); /* 2 entries fit in 200 bytes */
  json_decref(g);
  resp_store_put(s, mid, conv); /* the same id again replaces it */
  resp_store_counts(s, &n, &bytes);
  CHECK(n == 2 && bytes <= 200);
  resp_store_put(s, huge, conv);
  CHECK(resp_store_get(s, "c", NULL) == NULL);
  json_decref(small), json_decref(mid), json_decref(huge);
  resp_store_free(s);
  /* age */
  CHECK_EQ_INT(resp_store_new(0, 0, 1, &s, NULL), 0);
  json_t *o = json_pack("{s:s}", "id", "old");
  resp_store_put(s, o, conv);
  g = resp_store_get(s, "old", NULL);
  CHECK(g != NULL);
  json_decref(g);
  sleep(2);
  CHECK(resp_store_get(s, "old", NULL) == NULL);
  json_decref(o);
  resp_store_free(s);
  json_decref(conv);
}

int main(void) {
  RUN(test_messages);
  RUN(test_refusals);
  RUN(test_stream_with_calls);
  RUN(test_incomplete);
  RUN(test_store);
  TEST_MAIN_END();
}
