/* test_server_tools.c — the tools the server runs itself (serve/tools.h,
 * `hearth serve --memory`), over a scripted model: a chat that defines no
 * memory_search tool gets one; a reply that calls it has the call run, the
 * result given back in the next prompt and the answer returned with the
 * exchange in "tool_exchange" and both rounds' tokens in usage; a forced
 * call (tool_choice naming it, no tools of the request's own) runs the same
 * way, and so does a stream (one stream of both rounds' text, the server's
 * call not sent, the exchange in a chunk of its own); a request with its own
 * memory_search tool and one of n > 1 are left to the client; a model that
 * keeps calling stops after the rounds allowed, its last calls returned as
 * they are. The other chat protocols, whole and streamed: Anthropic Messages
 * (server_tool_use and memory_search_tool_result blocks in one message,
 * usage.server_tool_use, pause_turn when the rounds ran out, the blocks read
 * back in a later request), Responses (a memory_search_call item done with
 * its output, continued by previous_response_id) and Ollama's /api/chat
 * (the calls kept out of a stream, the exchange in the final object). */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fake_engine.h"
#include "serve/server.h"
#include "test.h"

static int dial(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* POST body to path; the response's body parsed (NULL when not JSON), *status its status. */
static json_t *post(int port, const char *path, const char *body, int *status) {
  *status = 0;
  int fd = dial(port);
  if (fd < 0) return NULL;
  hbuf req = {0};
  hbuf_printf(&req, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
                    "Content-Length: %zu\r\n\r\n%s", path, strlen(body), body);
  size_t off = 0;
  while (off < req.len) {
    ssize_t w = send(fd, req.data + off, req.len - off, MSG_NOSIGNAL);
    if (w <= 0) break;
    off += (size_t)w;
  }
  hbuf_free(&req);
  hbuf resp = {0};
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) hbuf_append(&resp, buf, (size_t)n);
  close(fd);
  sscanf(hbuf_str(&resp), "HTTP/1.1 %d", status);
  const char *b = strstr(hbuf_str(&resp), "\r\n\r\n");
  json_t *j = b ? json_loads(b + 4, 0, NULL) : NULL;
  if (!j && b) fprintf(stderr, "not JSON: %.300s\n", b + 4);
  hbuf_free(&resp);
  return j;
}

/* POST body to path and the raw stream back (caller frees). */
static char *post_stream_to(int port, const char *path, const char *body) {
  int fd = dial(port);
  if (fd < 0) return strdup("");
  hbuf req = {0};
  hbuf_printf(&req, "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                    "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s", path, strlen(body), body);
  if (send(fd, req.data, req.len, MSG_NOSIGNAL) != (ssize_t)req.len) fprintf(stderr, "short send\n");
  hbuf_free(&req);
  hbuf resp = {0};
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) hbuf_append(&resp, buf, (size_t)n);
  close(fd);
  char *out = hbuf_take(&resp);
  return out ? out : strdup("");
}

static char *post_stream(int port, const char *body) { return post_stream_to(port, "/v1/chat/completions", body); }

/* The events of an SSE stream ("event: NAME\ndata: {...}"), each data object with its name as
 * "_event" (an array; the caller frees). */
static json_t *sse_events(const char *sse) {
  json_t *all = json_array();
  const char *name = NULL;
  size_t nlen = 0;
  for (const char *p = sse; *p; p += strcspn(p, "\n"), p += *p == '\n') {
    if (!strncmp(p, "event: ", 7)) {
      name = p + 7;
      nlen = strcspn(name, "\n");
    } else if (!strncmp(p, "data: ", 6)) {
      json_t *d = json_loadb(p + 6, strcspn(p + 6, "\n"), 0, NULL);
      if (!d) continue;
      if (name) json_object_set_new(d, "_event", json_stringn(name, nlen));
      json_array_append_new(all, d);
      name = NULL;
    }
  }
  return all;
}

/* ---- the scripted model ---- */

static char g_prompt[16384];   /* the last prompt it was given */
static atomic_int g_rounds;    /* generations */

/* A prompt ending in a forced call's opening is continued with its arguments; a prompt with a
 * tool result answers from it; a last user turn with [search] (or any turn with [loop]) calls
 * memory_search; anything else answers plainly. */
static int scripted_generate(void *impl, const char *prompt, bool raw, const serve_sampling *sp, serve_token_fn fn,
                             void *ctx, volatile int *cancel, serve_result *res, herr *err) {
  (void)impl, (void)raw, (void)sp, (void)cancel, (void)err;
  atomic_fetch_add(&g_rounds, 1);
  snprintf(g_prompt, sizeof g_prompt, "%s", prompt);
  memset(res, 0, sizeof *res);
  res->stop_index = -1;
  res->prompt_tokens = (int64_t)(strlen(prompt) + 3) / 4;
  hbuf out = {0};
  const char *tool = strstr(prompt, "<|tool|>");
  size_t n = strlen(prompt);
  if (n > 13 && !strcmp(prompt + n - 13, "\"arguments\": ")) {
    hbuf_puts(&out, "{\"query\": \"forced\"}}\n</tool_call>");
  } else if (strstr(prompt, "[loop]") || (!tool && strstr(fake_last_turn(prompt), "[search]"))) {
    hbuf_puts(&out, "Let me look.\n<tool_call>\n{\"name\": \"memory_search\", \"arguments\": {\"query\": \"sheep\"}}\n</tool_call>");
  } else if (tool) {
    const char *r = tool + 8;
    hbuf_printf(&out, "Answer from memory: %.*s", (int)strcspn(r, " \n"), r);
  } else {
    hbuf_puts(&out, "A plain answer.");
  }
  /* in pieces of 5 bytes */
  for (size_t i = 0; i < out.len; i += 5) {
    serve_token t = {.text = out.data + i, .len = out.len - i < 5 ? out.len - i : 5, .id = (int32_t)i,
                     .token_text = out.data + i, .token_len = out.len - i < 5 ? out.len - i : 5};
    res->completion_tokens++;
    if (fn(ctx, &t)) break;
  }
  hbuf_free(&out);
  res->finish = SERVE_FINISH_STOP;
  return 0;
}

/* ---- the tool ---- */

static atomic_int g_runs;
static char g_args[1024];

static int tool_run(void *ctx, const char *args, char **result, herr *err) {
  (void)ctx;
  atomic_fetch_add(&g_runs, 1);
  snprintf(g_args, sizeof g_args, "%s", args);
  json_t *a = json_loads(args, 0, NULL);
  const char *q = json_string_value(json_object_get(a, "query"));
  if (!q) {
    json_decref(a);
    return herr_set(err, HEARTH_EINVAL, "no query");
  }
  hbuf b = {0};
  hbuf_printf(&b, "memory-result-for-%s", q);
  json_decref(a);
  *result = hbuf_take(&b);
  return 0;
}

static serve_engine engine;
static serve_tool tool = {.name = "memory_search", .description = "search the memory wiki",
                          .parameters = "{\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\"}},"
                                        "\"required\":[\"query\"]}",
                          .run = tool_run};

static const char *message_content(json_t *resp) {
  return json_string_value(
      json_object_get(json_object_get(json_array_get(json_object_get(resp, "choices"), 0), "message"), "content"));
}

static const char *finish_reason(json_t *resp) {
  return json_string_value(json_object_get(json_array_get(json_object_get(resp, "choices"), 0), "finish_reason"));
}

/* The content blocks' types of an Anthropic message, joined by spaces. */
static void block_types(json_t *content, char *out, size_t cap) {
  size_t n = 0, i;
  json_t *b;
  out[0] = 0;
  json_array_foreach(content, i, b) n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s%s", i ? " " : "",
                                                          json_string_value(json_object_get(b, "type")));
}

/* Anthropic Messages: the call a server_tool_use block, its result a memory_search_tool_result
 * block, both rounds one message; streamed as the same blocks' events; the rounds running out is
 * pause_turn; the blocks sent back are the conversation's calls and results. */
static void test_anthropic(serve_server *s) {
  int port = serve_port(s), status = 0;
  atomic_store(&g_runs, 0);
  atomic_store(&g_rounds, 0);
  const char *ask = "{\"model\":\"fake-model\",\"max_tokens\":100,\"messages\":[{\"role\":\"user\",\"content\":\"about the flock [search]\"}]}";
  json_t *r = post(port, "/v1/messages", ask, &status);
  CHECK_EQ_INT(status, 200);
  CHECK_EQ_INT(atomic_load(&g_runs), 1);
  CHECK_EQ_INT(atomic_load(&g_rounds), 2);
  CHECK(strstr(g_prompt, "<|tool|>memory-result-for-sheep") != NULL);
  json_t *content = json_object_get(r, "content");
  char types[256];
  block_types(content, types, sizeof types);
  CHECK_EQ_STR(types, "text server_tool_use memory_search_tool_result text");
  json_t *use = json_array_get(content, 1), *res = json_array_get(content, 2);
  CHECK(!strncmp(json_string_value(json_object_get(json_array_get(content, 0), "text")), "Let me look.", 12));
  CHECK(!strncmp(json_string_value(json_object_get(use, "id")), "srvtoolu_01", 11));
  CHECK_EQ_STR(json_string_value(json_object_get(use, "name")), "memory_search");
  CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(use, "input"), "query")), "sheep");
  CHECK_EQ_STR(json_string_value(json_object_get(res, "tool_use_id")), json_string_value(json_object_get(use, "id")));
  CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(json_object_get(res, "content"), 0), "text")),
               "memory-result-for-sheep");
  CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(content, 3), "text")),
               "Answer from memory: memory-result-for-sheep");
  CHECK_EQ_STR(json_string_value(json_object_get(r, "stop_reason")), "end_turn");
  json_t *u = json_object_get(r, "usage");
  CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(u, "server_tool_use"), "memory_search_requests")), 1);
  CHECK(json_integer_value(json_object_get(u, "output_tokens")) >
        (json_int_t)(strlen("Answer from memory: memory-result-for-sheep") + 4) / 5); /* both rounds' tokens */
  CHECK(json_integer_value(json_object_get(u, "input_tokens")) > (json_int_t)(strlen(g_prompt) + 3) / 4);

  /* the message sent back: its blocks are the assistant's call, the tool's result and the answer */
  json_t *next = json_loads(ask, 0, NULL);
  json_t *msgs = json_object_get(next, "messages");
  json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "assistant", "content", content));
  json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", "thanks"));
  char *body = json_dumps(next, JSON_COMPACT);
  json_decref(r);
  atomic_store(&g_runs, 0);
  r = post(port, "/v1/messages", body, &status);
  CHECK_EQ_INT(status, 200);
  CHECK_EQ_INT(atomic_load(&g_runs), 0);
  CHECK(strstr(g_prompt, "<|assistant|>Let me look.") != NULL);
  CHECK(strstr(g_prompt, "\"name\":\"memory_search\"") != NULL);
  CHECK(strstr(g_prompt, "<|tool|>memory-result-for-sheep {\"name\":\"memory_search\",\"tool_call_id\":\"srvtoolu_01") != NULL);
  CHECK(strstr(g_prompt, "<|assistant|>Answer from memory: memory-result-for-sheep\n<|user|>thanks") != NULL);
  free(body);
  json_decref(next);
  json_decref(r);

  /* streamed: the same blocks, in order, one message */
  atomic_store(&g_runs, 0);
  char *sse = post_stream_to(port, "/v1/messages",
                             "{\"model\":\"fake-model\",\"max_tokens\":100,\"stream\":true,"
                             "\"messages\":[{\"role\":\"user\",\"content\":\"[search]\"}]}");
  CHECK_EQ_INT(atomic_load(&g_runs), 1);
  json_t *ev = sse_events(sse);
  hbuf text = {0}, args = {0}, starts = {0};
  int stops = 0, msg_starts = 0, msg_stops = 0, next_index = 0;
  const char *use_id = NULL;
  size_t i;
  json_t *e;
  json_array_foreach(ev, i, e) {
    const char *name = json_string_value(json_object_get(e, "_event"));
    CHECK_EQ_STR(name, json_string_value(json_object_get(e, "type")));
    json_t *d = json_object_get(e, "delta");
    if (!strcmp(name, "message_start")) msg_starts++;
    if (!strcmp(name, "message_stop")) msg_stops++;
    if (!strcmp(name, "content_block_stop")) stops++;
    if (!strcmp(name, "content_block_start")) {
      json_t *b = json_object_get(e, "content_block");
      CHECK_EQ_INT(json_integer_value(json_object_get(e, "index")), next_index++);
      hbuf_printf(&starts, "%s%s", starts.len ? " " : "", json_string_value(json_object_get(b, "type")));
      if (!strcmp(json_string_value(json_object_get(b, "type")), "server_tool_use"))
        use_id = json_string_value(json_object_get(b, "id"));
      if (!strcmp(json_string_value(json_object_get(b, "type")), "memory_search_tool_result")) {
        CHECK_EQ_STR(json_string_value(json_object_get(b, "tool_use_id")), use_id ? use_id : "?");
        CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(json_object_get(b, "content"), 0), "text")),
                     "memory-result-for-sheep");
      }
    }
    if (!strcmp(name, "content_block_delta") && !strcmp(json_string_value(json_object_get(d, "type")), "text_delta"))
      hbuf_puts(&text, json_string_value(json_object_get(d, "text")));
    if (!strcmp(name, "content_block_delta") && !strcmp(json_string_value(json_object_get(d, "type")), "input_json_delta"))
      hbuf_puts(&args, json_string_value(json_object_get(d, "partial_json")));
    if (!strcmp(name, "message_delta")) {
      CHECK_EQ_STR(json_string_value(json_object_get(d, "stop_reason")), "end_turn");
      CHECK_EQ_INT(json_integer_value(json_object_get(
                       json_object_get(json_object_get(e, "usage"), "server_tool_use"), "memory_search_requests")),
                   1);
    }
  }
  CHECK_EQ_STR(hbuf_str(&starts), "text server_tool_use memory_search_tool_result text");
  CHECK_EQ_INT(stops, 4);
  CHECK_EQ_INT(msg_starts, 1);
  CHECK_EQ_INT(msg_stops, 1);
  CHECK(strstr(hbuf_str(&text), "Let me look.") == hbuf_str(&text));
  CHECK(strstr(hbuf_str(&text), "Answer from memory: memory-result-for-sheep") != NULL);
  json_t *a = json_loads(hbuf_str(&args), 0, NULL);
  CHECK_EQ_STR(json_string_value(json_object_get(a, "query")), "sheep");
  json_decref(a);
  hbuf_free(&text);
  hbuf_free(&args);
  hbuf_free(&starts);
  json_decref(ev);
  free(sse);

  /* a model that keeps calling: the rounds allowed (2), then the turn is paused on its last call */
  atomic_store(&g_runs, 0);
  r = post(port, "/v1/messages",
           "{\"model\":\"fake-model\",\"max_tokens\":100,\"messages\":[{\"role\":\"user\",\"content\":\"[loop]\"}]}", &status);
  CHECK_EQ_INT(status, 200);
  CHECK_EQ_INT(atomic_load(&g_runs), 2);
  CHECK_EQ_STR(json_string_value(json_object_get(r, "stop_reason")), "pause_turn");
  block_types(json_object_get(r, "content"), types, sizeof types);
  CHECK_EQ_STR(types, "text server_tool_use memory_search_tool_result text server_tool_use memory_search_tool_result "
                      "text server_tool_use");
  json_decref(r);

  /* the request's own memory_search: a tool_use block, the client's to run */
  atomic_store(&g_runs, 0);
  r = post(port, "/v1/messages",
           "{\"model\":\"fake-model\",\"max_tokens\":100,\"messages\":[{\"role\":\"user\",\"content\":\"[search]\"}],"
           "\"tools\":[{\"name\":\"memory_search\",\"input_schema\":{\"type\":\"object\"}}]}",
           &status);
  CHECK_EQ_INT(status, 200);
  CHECK_EQ_INT(atomic_load(&g_runs), 0);
  CHECK_EQ_STR(json_string_value(json_object_get(r, "stop_reason")), "tool_use");
  block_types(json_object_get(r, "content"), types, sizeof types);
  CHECK_EQ_STR(types, "text tool_use");
  json_decref(r);

  /* count_tokens counts the tool the server adds */
  r = post(port, "/v1/messages/count_tokens",
           "{\"model\":\"fake-model\",\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}", &status);
  CHECK_EQ_INT(status, 200);
  CHECK(json_integer_value(json_object_get(r, "input_tokens")) >
        (json_int_t)(strlen("<|tools|> memory_search\n<|user|>hello\n<|assistant|>") + 3) / 4 - 1);
  json_decref(r);
}

/* An item of a Responses output by type (the k-th of that type). */
static json_t *output_item(json_t *resp, const char *type, int k) {
  size_t i;
  json_t *it;
  json_array_foreach(json_object_get(resp, "output"), i, it) if (!strcmp(json_string_value(json_object_get(it, "type")), type) &&
                                                                  k-- == 0) return it;
  return NULL;
}

/* Responses: a memory_search_call item, completed with its output, between the rounds' messages;
 * streamed as that item's added and done events; previous_response_id continues from it. */
static void test_responses(serve_server *s) {
  int port = serve_port(s), status = 0;
  atomic_store(&g_runs, 0);
  atomic_store(&g_rounds, 0);
  json_t *r = post(port, "/v1/responses", "{\"input\":\"about the flock [search]\"}", &status);
  CHECK_EQ_INT(status, 200);
  CHECK_EQ_INT(atomic_load(&g_runs), 1);
  CHECK_EQ_INT(atomic_load(&g_rounds), 2);
  CHECK_EQ_INT(json_array_size(json_object_get(r, "output")), 3);
  json_t *call = output_item(r, "memory_search_call", 0);
  CHECK(call != NULL);
  CHECK(json_array_get(json_object_get(r, "output"), 1) == call);
  CHECK_EQ_STR(json_string_value(json_object_get(call, "status")), "completed");
  CHECK_EQ_STR(json_string_value(json_object_get(call, "name")), "memory_search");
  CHECK_EQ_STR(json_string_value(json_object_get(call, "output")), "memory-result-for-sheep");
  json_t *args = json_loads(json_string_value(json_object_get(call, "arguments")), 0, NULL);
  CHECK_EQ_STR(json_string_value(json_object_get(args, "query")), "sheep");
  json_decref(args);
  CHECK(output_item(r, "function_call", 0) == NULL);
  json_t *answer = output_item(r, "message", 1);
  CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(json_object_get(answer, "content"), 0), "text")),
               "Answer from memory: memory-result-for-sheep");
  CHECK_EQ_STR(json_string_value(json_object_get(r, "status")), "completed");
  json_t *u = json_object_get(r, "usage");
  CHECK(json_integer_value(json_object_get(u, "input_tokens")) > (json_int_t)(strlen(g_prompt) + 3) / 4);

  /* continued by previous_response_id: the stored call and its result are the conversation's */
  char body[256];
  snprintf(body, sizeof body, "{\"input\":\"thanks\",\"previous_response_id\":\"%s\"}", json_string_value(json_object_get(r, "id")));
  json_decref(r);
  atomic_store(&g_runs, 0);
  r = post(port, "/v1/responses", body, &status);
  CHECK_EQ_INT(status, 200);
  CHECK_EQ_INT(atomic_load(&g_runs), 0);
  CHECK(strstr(g_prompt, "\"name\":\"memory_search\"") != NULL);
  CHECK(strstr(g_prompt, "<|tool|>memory-result-for-sheep {\"name\":\"memory_search\",\"tool_call_id\":\"call_") != NULL);
  CHECK(strstr(g_prompt, "<|assistant|>Answer from memory: memory-result-for-sheep\n<|user|>thanks") != NULL);
  json_decref(r);

  /* streamed */
  atomic_store(&g_runs, 0);
  char *sse = post_stream_to(port, "/v1/responses", "{\"input\":\"[search]\",\"stream\":true}");
  CHECK_EQ_INT(atomic_load(&g_runs), 1);
  json_t *ev = sse_events(sse);
  hbuf text = {0};
  int added = 0, done = 0, completed = 0, fn_events = 0;
  int64_t seq = 0;
  size_t i;
  json_t *e;
  json_array_foreach(ev, i, e) {
    const char *name = json_string_value(json_object_get(e, "_event"));
    CHECK_EQ_INT(json_integer_value(json_object_get(e, "sequence_number")), seq++);
    json_t *item = json_object_get(e, "item");
    bool ours = item && !strcmp(json_string_value(json_object_get(item, "type")), "memory_search_call");
    if (!strcmp(name, "response.output_item.added") && ours) {
      added++;
      CHECK_EQ_STR(json_string_value(json_object_get(item, "status")), "in_progress");
      CHECK_EQ_INT(json_integer_value(json_object_get(e, "output_index")), 1);
    }
    if (!strcmp(name, "response.output_item.done") && ours) {
      done++;
      CHECK_EQ_STR(json_string_value(json_object_get(item, "status")), "completed");
      CHECK_EQ_STR(json_string_value(json_object_get(item, "output")), "memory-result-for-sheep");
    }
    if (!strncmp(name, "response.function_call", 22)) fn_events++;
    if (!strcmp(name, "response.output_text.delta")) hbuf_puts(&text, json_string_value(json_object_get(e, "delta")));
    if (!strcmp(name, "response.completed")) {
      completed++;
      json_t *o = json_object_get(json_object_get(e, "response"), "output");
      CHECK_EQ_INT(json_array_size(o), 3);
      CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(o, 1), "output")), "memory-result-for-sheep");
    }
  }
  CHECK_EQ_INT(added, 1);
  CHECK_EQ_INT(done, 1);
  CHECK_EQ_INT(fn_events, 0);
  CHECK_EQ_INT(completed, 1);
  CHECK(strstr(hbuf_str(&text), "Let me look.") == hbuf_str(&text));
  CHECK(strstr(hbuf_str(&text), "Answer from memory: memory-result-for-sheep") != NULL);
  hbuf_free(&text);
  json_decref(ev);
  free(sse);

  /* the rounds running out: the last call's item ends incomplete, without an output */
  r = post(port, "/v1/responses", "{\"input\":\"[loop]\"}", &status);
  CHECK_EQ_INT(status, 200);
  CHECK_EQ_STR(json_string_value(json_object_get(output_item(r, "memory_search_call", 1), "status")), "completed");
  call = output_item(r, "memory_search_call", 2);
  CHECK_EQ_STR(json_string_value(json_object_get(call, "status")), "incomplete");
  CHECK(json_is_null(json_object_get(call, "output")));
  json_decref(r);
}

/* Ollama's /api/chat: the final message the last round's, the exchange in "tool_exchange"
 * (Ollama's message shapes), the counts of every round; a stream without the server's calls. */
static void test_ollama(serve_server *s) {
  int port = serve_port(s), status = 0;
  atomic_store(&g_runs, 0);
  atomic_store(&g_rounds, 0);
  json_t *r = post(port, "/api/chat",
                   "{\"model\":\"fake-model\",\"stream\":false,\"messages\":[{\"role\":\"user\",\"content\":\"about the flock [search]\"}]}",
                   &status);
  CHECK_EQ_INT(status, 200);
  CHECK_EQ_INT(atomic_load(&g_runs), 1);
  CHECK_EQ_INT(atomic_load(&g_rounds), 2);
  json_t *m = json_object_get(r, "message");
  CHECK_EQ_STR(json_string_value(json_object_get(m, "content")), "Answer from memory: memory-result-for-sheep");
  CHECK(json_object_get(m, "tool_calls") == NULL);
  json_t *ex = json_object_get(r, "tool_exchange");
  CHECK_EQ_INT(json_array_size(ex), 2);
  json_t *am = json_array_get(ex, 0), *tm = json_array_get(ex, 1);
  CHECK_EQ_STR(json_string_value(json_object_get(am, "content")), "Let me look.");
  json_t *fn = json_object_get(json_array_get(json_object_get(am, "tool_calls"), 0), "function");
  CHECK_EQ_STR(json_string_value(json_object_get(fn, "name")), "memory_search");
  CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(fn, "arguments"), "query")), "sheep");
  CHECK_EQ_STR(json_string_value(json_object_get(tm, "role")), "tool");
  CHECK_EQ_STR(json_string_value(json_object_get(tm, "tool_name")), "memory_search");
  CHECK_EQ_STR(json_string_value(json_object_get(tm, "content")), "memory-result-for-sheep");
  CHECK(json_integer_value(json_object_get(r, "prompt_eval_count")) > (json_int_t)(strlen(g_prompt) + 3) / 4);
  CHECK(json_integer_value(json_object_get(r, "eval_count")) >
        (json_int_t)(strlen("Answer from memory: memory-result-for-sheep") + 4) / 5);
  json_decref(r);

  /* streamed */
  atomic_store(&g_runs, 0);
  char *nd = post_stream_to(port, "/api/chat",
                            "{\"model\":\"fake-model\",\"messages\":[{\"role\":\"user\",\"content\":\"[search]\"}]}");
  CHECK_EQ_INT(atomic_load(&g_runs), 1);
  hbuf text = {0};
  int lines = 0, dones = 0, calls = 0;
  for (const char *p = strstr(nd, "\r\n\r\n"); p && *p; p += strcspn(p, "\n"), p += *p == '\n') {
    if (*p != '{') continue;
    json_t *o = json_loadb(p, strcspn(p, "\n"), 0, NULL);
    if (!o) continue;
    lines++;
    json_t *msg = json_object_get(o, "message");
    hbuf_puts(&text, json_string_value(json_object_get(msg, "content")) ? json_string_value(json_object_get(msg, "content")) : "");
    if (json_object_get(msg, "tool_calls")) calls++;
    if (json_is_true(json_object_get(o, "done"))) {
      dones++;
      CHECK_EQ_INT(json_array_size(json_object_get(o, "tool_exchange")), 2);
    }
    json_decref(o);
  }
  CHECK(lines > 2);
  CHECK_EQ_INT(dones, 1);
  CHECK_EQ_INT(calls, 0);
  CHECK(strstr(hbuf_str(&text), "Let me look.") == hbuf_str(&text));
  CHECK(strstr(hbuf_str(&text), "Answer from memory: memory-result-for-sheep") != NULL);
  hbuf_free(&text);
  free(nd);

  /* /api/generate gets no tools */
  atomic_store(&g_runs, 0);
  r = post(port, "/api/generate", "{\"model\":\"fake-model\",\"stream\":false,\"prompt\":\"[search]\"}", &status);
  CHECK_EQ_INT(status, 200);
  CHECK_EQ_INT(atomic_load(&g_runs), 0);
  CHECK(strstr(g_prompt, "<|tools|>") == NULL);
  json_decref(r);
}

static void test_tool_loop(void) {
  serve_server *s = NULL;
  herr err = {0};
  serve_config cfg = {.port = 0, .tools = &tool, .n_tools = 1, .tool_rounds = 2};
  CHECK_EQ_INT(serve_start(&s, &engine, &cfg, &err), 0);
  if (!s) return;
  int port = serve_port(s), status = 0;

  /* GET /v1 names them */
  int fd = dial(port);
  if (fd >= 0) {
    const char *get = "GET /v1 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    CHECK(send(fd, get, strlen(get), MSG_NOSIGNAL) == (ssize_t)strlen(get));
    hbuf resp = {0};
    char buf[4096];
    ssize_t got;
    while ((got = recv(fd, buf, sizeof buf, 0)) > 0) hbuf_append(&resp, buf, (size_t)got);
    close(fd);
    const char *b = strstr(hbuf_str(&resp), "\r\n\r\n");
    json_t *idx = b ? json_loads(b + 4, 0, NULL) : NULL;
    json_t *own = json_object_get(json_object_get(idx, "capabilities"), "server_tools");
    CHECK_EQ_INT(json_array_size(own), 1);
    CHECK_EQ_STR(json_string_value(json_array_get(own, 0)), "memory_search");
    json_decref(idx);
    hbuf_free(&resp);
  }

  /* the model calls memory_search: run, fed back, answered */
  atomic_store(&g_runs, 0);
  atomic_store(&g_rounds, 0);
  json_t *r = post(port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"about the flock [search]\"}]}", &status);
  CHECK_EQ_INT(status, 200);
  CHECK_EQ_INT(atomic_load(&g_runs), 1);
  CHECK_EQ_INT(atomic_load(&g_rounds), 2);
  CHECK_EQ_STR(message_content(r), "Answer from memory: memory-result-for-sheep");
  CHECK_EQ_STR(finish_reason(r), "stop");
  CHECK(strstr(g_prompt, "<|tools|> memory_search") != NULL); /* offered in the template's tools */
  CHECK(strstr(g_prompt, "<|tool|>memory-result-for-sheep") != NULL);
  json_t *ex = json_object_get(r, "tool_exchange");
  CHECK_EQ_INT(json_array_size(ex), 2);
  json_t *am = json_array_get(ex, 0), *tm = json_array_get(ex, 1);
  CHECK_EQ_STR(json_string_value(json_object_get(am, "role")), "assistant");
  CHECK_EQ_STR(json_string_value(json_object_get(am, "content")), "Let me look.");
  json_t *call = json_array_get(json_object_get(am, "tool_calls"), 0);
  CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(call, "function"), "name")), "memory_search");
  json_t *args = json_loads(json_string_value(json_object_get(json_object_get(call, "function"), "arguments")), 0, NULL);
  CHECK_EQ_STR(json_string_value(json_object_get(args, "query")), "sheep");
  json_decref(args);
  CHECK_EQ_STR(json_string_value(json_object_get(tm, "role")), "tool");
  CHECK_EQ_STR(json_string_value(json_object_get(tm, "content")), "memory-result-for-sheep");
  CHECK_EQ_STR(json_string_value(json_object_get(tm, "tool_call_id")), json_string_value(json_object_get(call, "id")));
  json_t *u = json_object_get(r, "usage");
  int64_t pt = json_integer_value(json_object_get(u, "prompt_tokens")), ct = json_integer_value(json_object_get(u, "completion_tokens"));
  CHECK(ct > (int64_t)(strlen("Answer from memory: memory-result-for-sheep") + 4) / 5); /* both rounds' tokens */
  CHECK(pt > (int64_t)(strlen(g_prompt) + 3) / 4);
  CHECK_EQ_INT(json_integer_value(json_object_get(u, "total_tokens")), pt + ct);
  json_decref(r);

  /* no call: one round, no exchange */
  atomic_store(&g_rounds, 0);
  r = post(port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}", &status);
  CHECK_EQ_INT(status, 200);
  CHECK_EQ_STR(message_content(r), "A plain answer.");
  CHECK(json_object_get(r, "tool_exchange") == NULL);
  CHECK_EQ_INT(atomic_load(&g_rounds), 1);
  json_decref(r);

  /* a forced call of the server's tool, though the request has no tools */
  atomic_store(&g_runs, 0);
  r = post(port, "/v1/chat/completions",
           "{\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}],"
           "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"memory_search\"}}}",
           &status);
  CHECK_EQ_INT(status, 200);
  CHECK_EQ_INT(atomic_load(&g_runs), 1);
  CHECK(strstr(g_args, "\"forced\"") != NULL);
  CHECK_EQ_STR(message_content(r), "Answer from memory: memory-result-for-forced");
  CHECK_EQ_INT(json_array_size(json_object_get(r, "tool_exchange")), 2);
  json_decref(r);

  /* the request's own memory_search: the client's to run */
  atomic_store(&g_runs, 0);
  r = post(port, "/v1/chat/completions",
           "{\"messages\":[{\"role\":\"user\",\"content\":\"[search]\"}],\"tools\":[{\"type\":\"function\","
           "\"function\":{\"name\":\"memory_search\",\"parameters\":{\"type\":\"object\"}}}]}",
           &status);
  CHECK_EQ_INT(status, 200);
  CHECK_EQ_INT(atomic_load(&g_runs), 0);
  CHECK_EQ_STR(finish_reason(r), "tool_calls");
  CHECK(json_object_get(r, "tool_exchange") == NULL);
  json_decref(r);

  /* the client's tools beside the server's: a call of the server's still runs */
  atomic_store(&g_runs, 0);
  r = post(port, "/v1/chat/completions",
           "{\"messages\":[{\"role\":\"user\",\"content\":\"[search]\"}],\"tools\":[{\"type\":\"function\","
           "\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\"}}}]}",
           &status);
  CHECK_EQ_INT(status, 200);
  CHECK_EQ_INT(atomic_load(&g_runs), 1);
  CHECK(strstr(g_prompt, "<|tools|> get_weather memory_search") != NULL);
  json_decref(r);

  /* streamed: both rounds' text in one stream, the server's call not sent, one finish, the exchange */
  atomic_store(&g_runs, 0);
  char *sse = post_stream(port, "{\"messages\":[{\"role\":\"user\",\"content\":\"[search]\"}],\"stream\":true,"
                                "\"stream_options\":{\"include_usage\":true}}");
  CHECK_EQ_INT(atomic_load(&g_runs), 1);
  hbuf content = {0};
  int finishes = 0, exchanges = 0, calls = 0, usage = 0;
  const char *last_finish = NULL;
  json_t *keep = json_array();
  for (const char *p = sse; (p = strstr(p, "data: ")); p += 6) {
    if (!strncmp(p + 6, "[DONE]", 6)) break;
    json_t *c = json_loadb(p + 6, strcspn(p + 6, "\n"), 0, NULL);
    if (!c) continue;
    json_array_append_new(keep, c);
    json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
    json_t *delta = json_object_get(ch, "delta");
    if (json_is_string(json_object_get(delta, "content"))) hbuf_puts(&content, json_string_value(json_object_get(delta, "content")));
    if (json_object_get(delta, "tool_calls")) calls++;
    if (json_is_string(json_object_get(ch, "finish_reason"))) finishes++, last_finish = json_string_value(json_object_get(ch, "finish_reason"));
    if (json_object_get(c, "tool_exchange")) {
      exchanges++;
      CHECK_EQ_INT(json_array_size(json_object_get(c, "tool_exchange")), 2);
      CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(json_object_get(c, "tool_exchange"), 0), "content")),
                   "Let me look.");
    }
    if (json_is_object(json_object_get(c, "usage"))) usage++;
  }
  CHECK_EQ_STR(hbuf_str(&content), "Let me look.Answer from memory: memory-result-for-sheep");
  CHECK_EQ_INT(calls, 0);
  CHECK_EQ_INT(finishes, 1);
  CHECK_EQ_STR(last_finish, "stop");
  CHECK_EQ_INT(exchanges, 1);
  CHECK_EQ_INT(usage, 1);
  CHECK(strstr(sse, "data: [DONE]") != NULL);
  json_decref(keep);
  hbuf_free(&content);
  free(sse);

  /* streamed with a client's tool called beside nothing of the server's: the call is sent as usual */
  atomic_store(&g_runs, 0);
  sse = post_stream(port, "{\"messages\":[{\"role\":\"user\",\"content\":\"[search]\"}],\"stream\":true,"
                          "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"memory_search\"}}]}");
  CHECK_EQ_INT(atomic_load(&g_runs), 0);
  CHECK(strstr(sse, "\"tool_calls\"") != NULL);
  CHECK(strstr(sse, "\"finish_reason\":\"tool_calls\"") != NULL);
  free(sse);

  /* n > 1: not offered */
  atomic_store(&g_runs, 0);
  r = post(port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"[search]\"}],\"n\":2}", &status);
  CHECK_EQ_INT(status, 200);
  CHECK_EQ_INT(atomic_load(&g_runs), 0);
  CHECK(strstr(g_prompt, "<|tools|>") == NULL);
  json_decref(r);

  /* a model that keeps calling: tool_rounds (2) rounds, then its calls come back as they are */
  atomic_store(&g_runs, 0);
  atomic_store(&g_rounds, 0);
  r = post(port, "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"[loop]\"}]}", &status);
  CHECK_EQ_INT(status, 200);
  CHECK_EQ_INT(atomic_load(&g_runs), 2);
  CHECK_EQ_INT(atomic_load(&g_rounds), 3);
  CHECK_EQ_STR(finish_reason(r), "tool_calls");
  CHECK_EQ_INT(json_array_size(json_object_get(r, "tool_exchange")), 4);
  json_decref(r);

  test_anthropic(s);
  test_responses(s);
  test_ollama(s);
  serve_stop(s);

  /* a server without tools offers none */
  cfg.n_tools = 0;
  cfg.tools = NULL;
  s = NULL;
  CHECK_EQ_INT(serve_start(&s, &engine, &cfg, &err), 0);
  if (!s) return;
  atomic_store(&g_runs, 0);
  r = post(serve_port(s), "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"[search]\"}]}", &status);
  CHECK_EQ_INT(status, 200);
  CHECK_EQ_INT(atomic_load(&g_runs), 0);
  CHECK(strstr(g_prompt, "<|tools|>") == NULL);
  json_decref(r);
  serve_stop(s);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  fake_engine_init(&engine);
  engine.generate = scripted_generate;
  engine.thread_safe = true;
  RUN(test_tool_loop);
  TEST_MAIN_END();
}
