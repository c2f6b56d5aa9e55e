/* tokenize.c — the /tokenize and /detokenize requests and replies (see
 * tokenize.h): which field holds the text, the defaults of llama.cpp's and
 * vLLM's shapes, ids checked against the vocabulary, a piece that is not
 * UTF-8 given as its bytes. Knows nothing of models or HTTP. */
#include "serve/tokenize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "serve/reply.h"

void tokenize_request_free(tokenize_request *req) {
  free(req->model);
  free(req->content);
  if (req->is_chat) serve_request_free(&req->chat);
  memset(req, 0, sizeof *req);
}

static int oom(serve_fail *f) { return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory"); }

int tokenize_request_parse(const char *body, size_t len, tokenize_request *req, serve_fail *f) {
  memset(req, 0, sizeof *req);
  json_error_t je;
  json_t *root = json_loadb(body, len, 0, &je);
  if (!root) return serve_bad(f, "", "the request body is not valid JSON: %s at line %d column %d", je.text, je.line, je.column);
  int rc = 0;
  if (!json_is_object(root)) {
    rc = serve_bad(f, "", "the request body must be a JSON object");
    goto out;
  }
  json_t *content = serve_json_field(root, "content"), *prompt = serve_json_field(root, "prompt"),
         *messages = serve_json_field(root, "messages");
  if ((content != NULL) + (prompt != NULL) + (messages != NULL) != 1) {
    rc = serve_bad(f, "content", "give exactly one of 'content' (or vLLM's 'prompt'), a string, and 'messages'");
    goto out;
  }
  const char *field = content ? "content" : prompt ? "prompt" : "messages";
  /* llama.cpp adds no special tokens unless asked; vLLM adds them to a prompt, not to rendered messages */
  req->add_special = prompt != NULL;
  if ((rc = serve_json_str(root, "model", &req->model, f)) || (rc = serve_json_bool(root, "with_pieces", &req->with_pieces, f)))
    goto out;
  if (serve_json_field(root, "add_special") && serve_json_field(root, "add_special_tokens")) {
    rc = serve_bad(f, "add_special", "give either 'add_special' or 'add_special_tokens', not both");
    goto out;
  }
  if ((rc = serve_json_bool(root, "add_special", &req->add_special, f)) ||
      (rc = serve_json_bool(root, "add_special_tokens", &req->add_special, f)))
    goto out;
  if (messages) {
    /* the chat completion parser reads messages, tools and template kwargs alike */
    if ((rc = serve_request_parse(body, len, SERVE_CHAT, &req->chat, f))) goto out;
    req->is_chat = true;
  } else {
    json_t *t = content ? content : prompt;
    if (!json_is_string(t)) rc = serve_bad(f, field, "'%s' must be a string", field);
    else if (!(req->content = strdup(json_string_value(t)))) rc = oom(f);
  }
out:
  json_decref(root);
  if (rc) tokenize_request_free(req);
  return rc;
}

int detokenize_request_parse(const char *body, size_t len, int64_t vocab, int32_t **ids, size_t *n, char **model,
                             serve_fail *f) {
  *ids = NULL;
  *n = 0;
  *model = NULL;
  json_error_t je;
  json_t *root = json_loadb(body, len, 0, &je);
  if (!root) return serve_bad(f, "", "the request body is not valid JSON: %s at line %d column %d", je.text, je.line, je.column);
  int rc = 0;
  json_t *tokens = json_is_object(root) ? serve_json_field(root, "tokens") : NULL;
  if (!json_is_object(root)) rc = serve_bad(f, "", "the request body must be a JSON object");
  else if (!tokens) rc = serve_bad(f, "tokens", "'tokens' (an array of token ids) is required");
  else if (!json_is_array(tokens)) rc = serve_bad(f, "tokens", "'tokens' must be an array of token ids");
  else rc = serve_json_str(root, "model", model, f);
  size_t k = rc ? 0 : json_array_size(tokens);
  if (!rc && !(*ids = malloc(sizeof(int32_t) * (k ? k : 1)))) rc = oom(f);
  for (size_t i = 0; i < k && !rc; i++) {
    json_t *v = json_array_get(tokens, i);
    json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
    if (!json_is_integer(v)) rc = serve_bad(f, "tokens", "'tokens[%zu]' is not an integer token id", i);
    else if (id < 0 || id > INT32_MAX || (vocab > 0 && id >= vocab))
      rc = serve_bad(f, "tokens", "'tokens[%zu]' is %lld, outside the vocabulary (0 to %lld)", i, (long long)id,
                     (long long)(vocab > 0 ? vocab - 1 : INT32_MAX));
    else (*ids)[i] = (int32_t)id;
  }
  json_decref(root);
  if (rc) {
    free(*ids), free(*model);
    *ids = NULL, *model = NULL;
    return rc;
  }
  *n = k;
  return 0;
}

static void put_json(json_t *o /* consumed */, hbuf *out) {
  char *js = o ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (js) hbuf_puts(out, js);
  else out->oom = true;
  free(js);
}

void tokenize_reply(const int32_t *ids, size_t n, char *const *pieces, const size_t *plen, int64_t max_model_len,
                    hbuf *out) {
  json_t *toks = json_array();
  for (size_t i = 0; i < n; i++) {
    if (!pieces) {
      json_array_append_new(toks, json_integer(ids[i]));
      continue;
    }
    /* as llama.cpp: the piece as a string when it is UTF-8, else its bytes */
    json_t *piece = pieces[i] && utf8_valid(pieces[i], plen[i]) ? json_stringn(pieces[i], plen[i]) : NULL;
    if (!piece) {
      piece = json_array();
      for (size_t b = 0; pieces[i] && b < plen[i]; b++) json_array_append_new(piece, json_integer((unsigned char)pieces[i][b]));
    }
    json_array_append_new(toks, json_pack("{s:i, s:o}", "id", (int)ids[i], "piece", piece));
  }
  put_json(json_pack("{s:o, s:I, s:I}", "tokens", toks, "count", (json_int_t)n, "max_model_len", (json_int_t)max_model_len),
           out);
}

void detokenize_reply(const char *text, size_t len, hbuf *out) {
  json_t *t = serve_json_text(text, len);
  put_json(json_pack("{s:O, s:o}", "content", t, "prompt", t), out);
}
