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
 * they are. */
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

/* POST body to path and the raw SSE stream back (caller frees). */
static char *post_stream(int port, const char *body) {
  int fd = dial(port);
  if (fd < 0) return strdup("");
  hbuf req = {0};
  hbuf_printf(&req, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                    "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s", strlen(body), body);
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
