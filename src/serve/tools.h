/* tools.h — tools the server runs itself (`hearth serve --memory`:
 * memory_search). A chat request (OpenAI chat, Responses, Anthropic
 * Messages, Ollama's /api/chat: each protocol's tools dialect) that does not
 * define a tool of that name gets it added to its tools; when the model's
 * reply calls only such tools, the server runs them, appends the
 * assistant's calls and the tool results to the conversation and generates
 * again (at most serve_config.tool_rounds rounds), and answers with the
 * final reply, every round's tokens in its usage. How the exchange is shown
 * is each protocol's (server.c's protocol ops round_calls / round_next and
 * the protocol units): OpenAI chat and Ollama add the messages to the
 * response's "tool_exchange" (a stream: every round's text in one stream,
 * the calls of the server's tools not sent); Anthropic shows server_tool_use
 * and NAME_tool_result blocks, Responses NAME_call output items. Knows the
 * request's and reply's shapes; what a tool does is its run function's. */
#ifndef HEARTH_SERVE_TOOLS_H
#define HEARTH_SERVE_TOOLS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "serve/request.h"

/* A tool the server runs. */
typedef struct serve_tool {
  const char *name;        /* a valid tool name: "memory_search" */
  const char *description; /* borrowed */
  const char *parameters;  /* borrowed: its arguments' JSON Schema (JSON text) */
  void *ctx;               /* borrowed: handed to run */
  /* Runs one call: args_json its arguments (a JSON object's text); *result (malloc'd) the tool
   * message's text. A failure's message becomes the result ("error: ..."): the model sees it. */
  int (*run)(void *ctx, const char *args_json, char **result, herr *err);
} serve_tool;

#define SERVE_TOOL_ROUNDS 4 /* rounds of server-run calls per request when the config says 0 */
#define SERVE_MAX_TOOLS 8

/* A request body with the server's tools added to its "tools" in the shape of
 * dialect d (the protocol's: OpenAI's {"type": "function", "function": {...}},
 * Responses' {"type": "function", "name", ...}, Anthropic's {"type": "custom",
 * "name", "input_schema"}), those whose name the request does not define;
 * none for a request of n > 1 choices: *out (malloc'd) the new body and
 * *added the bits (1 << i) of the tools added; *out NULL when none was (or
 * the body is not a JSON object: the parser then says what is wrong). */
int serve_tools_inject(const serve_tool *tools, int n, const serve_tools_dialect *d, const char *body, size_t len,
                       char **out, unsigned *added, herr *err);

/* Whether every call of calls ([{"id","type","function":{"name","arguments"}}], at least
 * one) names a tool of `added`. */
bool serve_tools_all_ours(const serve_tool *tools, int n, unsigned added, const json_t *calls);

/* One round: the assistant message (content may be NULL, the calls) and a tool message per
 * call with what its tool returned, appended to req->messages and, in OpenAI's message
 * shape ({"role": "tool", "tool_call_id", "name", "content"}), to exchange. Nonzero only
 * when out of memory. */
int serve_tools_run(const serve_tool *tools, int n, serve_request *req, const char *content, const json_t *calls,
                    json_t *exchange, herr *err);

#endif
