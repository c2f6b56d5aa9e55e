/* tools.h — tools the server runs itself (`hearth serve --memory`:
 * memory_search). A chat request that does not define a tool of that name
 * gets it added to its tools; when the model's reply calls only such tools,
 * the server runs them, appends the assistant's calls and the tool results
 * to the conversation and generates again (at most serve_config.tool_rounds
 * rounds), and answers with the final reply, the added messages in the
 * response's "tool_exchange" and every round's tokens in its usage (a
 * stream: the rounds' text in one stream, the calls of the server's tools
 * not sent, one finish chunk, the exchange in a chunk of its own before the
 * usage chunk; server.c's OpenAI chat protocol ops and tool_round). Knows
 * the request's and reply's shapes; what a tool does is its run function's. */
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

/* The OpenAI chat request body with the server's tools added to its "tools"
 * (those whose name the request does not define; none for a request of
 * n > 1 choices): *out (malloc'd) the new body and *added the bits (1 << i) of
 * the tools added; *out NULL when none was (or the body is not a JSON
 * object: the parser then says what is wrong). */
int serve_tools_inject(const serve_tool *tools, int n, const char *body, size_t len, char **out, unsigned *added,
                       herr *err);

/* Whether every call of calls ([{"id","type","function":{"name","arguments"}}], at least
 * one) names a tool of `added`. */
bool serve_tools_all_ours(const serve_tool *tools, int n, unsigned added, const json_t *calls);

/* One round: the assistant message (content, reasoning may be NULL, the calls) and a tool
 * message per call with what its tool returned, appended to req->messages and, in
 * OpenAI's message shape, to exchange. Nonzero only when out of memory. */
int serve_tools_run(const serve_tool *tools, int n, serve_request *req, const char *content, const json_t *calls,
                    json_t *exchange, herr *err);

#endif
