/* embeddings.c — the OpenAI embeddings request (input in its four shapes,
 * encoding_format, dimensions, hearth's instruction) parsed and checked,
 * and its reply written, floats or base64. Knows nothing of models or
 * HTTP; the server routes to it and the engine seam runs it. */
#include "serve/embeddings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void embed_request_free(embed_request *req) {
  for (int i = 0; req->inputs && i < req->n; i++) {
    free(req->inputs[i].text);
    free(req->inputs[i].ids);
  }
  free(req->inputs);
  free(req->model);
  free(req->instruction);
  memset(req, 0, sizeof *req);
}

/* arr: token ids, into in. param: the field for messages. */
static int read_ids(json_t *arr, int64_t vocab, const char *param, serve_embed_input *in, serve_fail *f) {
  size_t n = json_array_size(arr);
  if (n == 0) return serve_bad(f, param, "'%s' is an empty array of token ids: give at least one token", param);
  in->ids = malloc(sizeof(int32_t) * n);
  if (!in->ids) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  for (size_t i = 0; i < n; i++) {
    json_t *v = json_array_get(arr, i);
    if (!json_is_integer(v))
      return serve_bad(f, param, "'%s' must hold only token ids (integers); item %zu is not one", param, i);
    json_int_t id = json_integer_value(v);
    if (id < 0 || id > INT32_MAX || (vocab > 0 && id >= vocab))
      return serve_bad(f, param, "'%s': token id %lld at %zu is outside the vocabulary (0 to %lld)", param, (long long)id, i,
                 (long long)(vocab > 0 ? vocab - 1 : INT32_MAX));
    in->ids[i] = (int32_t)id;
  }
  in->n_ids = n;
  return 0;
}

static int read_text(json_t *v, const char *param, serve_embed_input *in, serve_fail *f) {
  size_t len = json_string_length(v);
  if (len == 0) return serve_bad(f, param, "'%s' is an empty string: there is nothing to embed", param);
  in->text = malloc(len + 1);
  if (!in->text) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  memcpy(in->text, json_string_value(v), len);
  in->text[len] = 0;
  in->len = len;
  return 0;
}

static int parse_input(json_t *input, int64_t vocab, embed_request *req, serve_fail *f) {
  if (!input) return serve_bad(f, "input", "'input' is required: a string, an array of strings, or token ids");
  if (json_is_string(input)) {
    if (!(req->inputs = calloc(1, sizeof *req->inputs))) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
    req->n = 1;
    return read_text(input, "input", &req->inputs[0], f);
  }
  if (!json_is_array(input))
    return serve_bad(f, "input", "'input' must be a string, an array of strings, an array of token ids, or an array of such arrays");
  size_t n = json_array_size(input);
  if (n == 0) return serve_bad(f, "input", "'input' is an empty array: there is nothing to embed");
  json_t *first = json_array_get(input, 0);
  if (json_is_integer(first)) { /* one input of ids */
    if (!(req->inputs = calloc(1, sizeof *req->inputs))) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
    req->n = 1;
    return read_ids(input, vocab, "input", &req->inputs[0], f);
  }
  if (n > EMBED_MAX_INPUTS) return serve_bad(f, "input", "'input' has %zu items; at most %d are allowed", n, EMBED_MAX_INPUTS);
  if (!(req->inputs = calloc(n, sizeof *req->inputs))) return serve_fail_set(f, 500, "server_error", NULL, NULL, "out of memory");
  req->n = (int)n;
  bool strings = json_is_string(first);
  for (size_t i = 0; i < n; i++) {
    json_t *v = json_array_get(input, i);
    char param[32];
    snprintf(param, sizeof param, "input[%zu]", i);
    int rc;
    if (strings && json_is_string(v)) rc = read_text(v, param, &req->inputs[i], f);
    else if (!strings && json_is_array(v)) rc = read_ids(v, vocab, param, &req->inputs[i], f);
    else
      rc = serve_bad(f, param, "'%s' must be %s like the first item of 'input'", param,
               strings ? "a string" : json_is_array(first) ? "an array of token ids" : "a string or an array of token ids");
    if (rc) return rc;
  }
  return 0;
}

int embed_request_parse(const char *body, size_t len, int64_t vocab, embed_request *req, serve_fail *f) {
  memset(req, 0, sizeof *req);
  json_error_t je;
  json_t *root = json_loadb(body, len, 0, &je);
  if (!root) return serve_bad(f, "", "the request body is not valid JSON: %s at line %d column %d", je.text, je.line, je.column);
  int rc = 0;
  char *enc = NULL, *user = NULL;
  int64_t dims = 0;
  if (!json_is_object(root)) {
    rc = serve_bad(f, "", "the request body must be a JSON object");
    goto out;
  }
  if ((rc = serve_json_str(root, "model", &req->model, f)) || (rc = serve_json_str(root, "user", &user, f)) ||
      (rc = serve_json_str(root, "encoding_format", &enc, f)) || (rc = serve_json_str(root, "instruction", &req->instruction, f)) ||
      (rc = serve_json_int(root, "dimensions", 1, INT32_MAX, &dims, f)))
    goto out;
  if (enc && strcmp(enc, "float") && strcmp(enc, "base64")) {
    rc = serve_bad(f, "encoding_format", "'encoding_format' must be 'float' or 'base64', not '%.40s'", enc);
    goto out;
  }
  req->base64 = enc && !strcmp(enc, "base64");
  req->dimensions = (int)dims;
  rc = parse_input(serve_json_field(root, "input"), vocab, req, f);
out:
  free(enc);
  free(user);
  json_decref(root);
  if (rc) embed_request_free(req);
  return rc;
}

void embed_base64(const float *v, size_t n, hbuf *out) {
  static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t nb = n * 4;
  unsigned char *b = malloc(nb ? nb : 1);
  if (!b) {
    out->oom = true;
    return;
  }
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &v[i], 4);
    for (int k = 0; k < 4; k++) b[i * 4 + (size_t)k] = (unsigned char)(u >> (8 * k)); /* little-endian on any host */
  }
  char q[4];
  for (size_t i = 0; i < nb; i += 3) {
    uint32_t x = (uint32_t)b[i] << 16 | (i + 1 < nb ? (uint32_t)b[i + 1] << 8 : 0) | (i + 2 < nb ? b[i + 2] : 0);
    q[0] = tab[x >> 18 & 63];
    q[1] = tab[x >> 12 & 63];
    q[2] = i + 1 < nb ? tab[x >> 6 & 63] : '=';
    q[3] = i + 2 < nb ? tab[x & 63] : '=';
    hbuf_append(out, q, 4);
  }
  free(b);
}

void embed_reply(const embed_request *req, const float *vecs, int dim, const char *model, int64_t prompt_tokens, hbuf *out) {
  hbuf_puts(out, "{\"object\":\"list\",\"data\":[");
  for (int i = 0; i < req->n; i++) {
    const float *v = vecs + (size_t)i * (size_t)dim;
    hbuf_printf(out, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i ? "," : "", i);
    if (req->base64) {
      hbuf_puts(out, "\"");
      embed_base64(v, (size_t)dim, out);
      hbuf_puts(out, "\"");
    } else {
      hbuf_puts(out, "[");
      for (int j = 0; j < dim; j++) hbuf_printf(out, "%s%.9g", j ? "," : "", (double)v[j]);
      hbuf_puts(out, "]");
    }
    hbuf_puts(out, "}");
  }
  json_t *m = json_string(model ? model : "");
  char *ms = m ? json_dumps(m, JSON_ENCODE_ANY) : NULL;
  json_decref(m);
  hbuf_printf(out, "],\"model\":%s,\"usage\":{\"prompt_tokens\":%lld,\"total_tokens\":%lld}}", ms ? ms : "\"\"",
              (long long)prompt_tokens, (long long)prompt_tokens);
  free(ms);
}
