/* test_ollama.c — the Ollama API unit (src/serve/ollama.c): /api/chat and
 * /api/generate bodies into serve_request (Ollama's option names mapped onto
 * the sampling fields, format into a grammar, think into the template's
 * variables, images named as sent), every refusal naming its field (bad JSON,
 * unknown and unsupported options, template / context), suffix as
 * fill-in-the-middle, the
 * embeddings bodies, and the replies' NDJSON lines and final object against
 * the shapes in Ollama's API documentation, written out by hand below. */
#include <jansson.h>
#include <math.h>

#include "serve/ollama.h"
#include "test.h"

static int parse(const char *body, bool chat, serve_request *r, oll_request *o, serve_fail *f) {
  memset(f, 0, sizeof *f);
  return oll_request_parse(body, strlen(body), chat, r, o, f);
}

/* A body refused with 400 naming `param` (in param and in the message). */
static void refused(const char *body, bool chat, const char *param) {
  serve_request r;
  oll_request o;
  serve_fail f;
  int rc = parse(body, chat, &r, &o, &f);
  CHECK_MSG(rc == 400, "body %s: rc %d", body, rc);
  CHECK_EQ_INT(f.status, 400);
  CHECK_MSG(strcmp(f.param, param) == 0, "body %s: param '%s', want '%s' (%s)", body, f.param, param, f.message);
  if (param[0]) CHECK_MSG(strstr(f.message, param) != NULL, "body %s: message '%s' does not name %s", body, f.message, param);
  CHECK(r.model == NULL && r.messages == NULL);
  char *j = oll_fail_json(&f);
  json_t *e = j ? json_loads(j, 0, NULL) : NULL;
  CHECK_MSG(json_is_object(e) && json_object_size(e) == 1 && json_is_string(json_object_get(e, "error")),
            "error body %s", j ? j : "(null)");
  CHECK_EQ_STR(json_string_value(json_object_get(e, "error")), f.message);
  json_decref(e);
  free(j);
}

static void test_refusals(void) {
  refused("{\"model\":\"m\",\"prompt\":\"x\"", false, "");          /* bad JSON */
  refused("[1,2]", false, "");                                        /* not an object */
  refused("{\"prompt\":\"x\"}", false, "model");                      /* no model */
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"options\":{\"mirostat\":2}}", false, "options.mirostat");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"options\":{\"bogus\":1}}", false, "options.bogus");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"options\":{\"typical_p\":0.5}}", false, "options.typical_p");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"options\":{\"temperature\":\"hot\"}}", false, "options.temperature");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"options\":{\"top_k\":1.5}}", false, "options.top_k");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"options\":{\"num_predict\":0}}", false, "options.num_predict");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"options\":{\"stop\":[1]}}", false, "options.stop");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"options\":[1]}", false, "options");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"suffix\":3}", false, "suffix");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"suffix\":\"y\",\"raw\":true}", false, "suffix");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"suffix\":\"y\",\"system\":\"s\"}", false, "suffix");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"suffix\":\"y\",\"images\":[\"aGk=\"]}", false, "suffix");
  refused("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"suffix\":\"y\"}", true, "suffix");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"template\":\"{{ .Prompt }}\"}", false, "template");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"context\":[1,2,3]}", false, "context");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"format\":\"yaml\"}", false, "format");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"format\":{\"type\":\"object\",\"properties\":3}}", false, "format");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"think\":\"very\"}", false, "think");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"stream\":\"yes\"}", false, "stream");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"images\":[\"\"]}", false, "images[0]");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"raw\":true,\"images\":[\"aGk=\"]}", false, "images");
  refused("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"images\":[3]}]}", true,
          "messages[0].images[0]");
  refused("{\"model\":\"m\",\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", true, "messages[0].role");
  refused("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":7}]}", true, "messages[0]");
  /* an option at the value that changes nothing is accepted */
  serve_request r;
  oll_request o;
  serve_fail f;
  CHECK_EQ_INT(parse("{\"model\":\"m\",\"prompt\":\"x\",\"options\":{\"mirostat\":0,\"typical_p\":1,\"num_thread\":8,"
                     "\"penalize_newline\":true}}",
                     false, &r, &o, &f),
               0);
  serve_request_free(&r);
}

/* suffix: a fill-in-the-middle completion, the prompt the text before it; an empty
 * prompt with a suffix is still one (not a load request) */
static void test_suffix(void) {
  serve_request r;
  oll_request o;
  serve_fail f;
  CHECK_EQ_INT(parse("{\"model\":\"m\",\"prompt\":\"def add(a, b):\",\"suffix\":\"\\nprint(add(1, 2))\",\"stream\":false}",
                     false, &r, &o, &f),
               0);
  CHECK_EQ_INT(r.kind, SERVE_COMPLETION);
  CHECK(r.fim && !o.load_only && !o.raw);
  CHECK_EQ_STR(r.prompt, "def add(a, b):");
  CHECK_EQ_STR(r.suffix, "\nprint(add(1, 2))");
  serve_request_free(&r);
  CHECK_EQ_INT(parse("{\"model\":\"m\",\"suffix\":\"tail\"}", false, &r, &o, &f), 0);
  CHECK(r.fim && !o.load_only);
  CHECK_EQ_STR(r.prompt, "");
  CHECK_EQ_STR(r.suffix, "tail");
  serve_request_free(&r);
  /* an empty suffix is none: the prompt goes through the chat template as before */
  CHECK_EQ_INT(parse("{\"model\":\"m\",\"prompt\":\"x\",\"suffix\":\"\"}", false, &r, &o, &f), 0);
  CHECK_EQ_INT(r.kind, SERVE_CHAT);
  CHECK(!r.fim);
  serve_request_free(&r);
}

static void test_options(void) {
  serve_request r;
  oll_request o;
  serve_fail f;
  const char *body = "{\"model\":\"m\",\"prompt\":\"Once\",\"raw\":true,\"stream\":false,\"options\":{\"temperature\":0.5,"
                     "\"top_k\":7,\"top_p\":0.9,\"min_p\":0.05,\"num_predict\":12,\"stop\":[\"\\n\",\"END\"],\"seed\":42,"
                     "\"repeat_penalty\":1.3,\"presence_penalty\":0.25,\"frequency_penalty\":-0.5,\"num_ctx\":256}}";
  CHECK_EQ_INT(parse(body, false, &r, &o, &f), 0);
  CHECK_EQ_INT(r.kind, SERVE_COMPLETION); /* raw: the prompt as it is */
  CHECK_EQ_STR(r.prompt, "Once");
  CHECK_EQ_STR(r.model, "m");
  CHECK(!r.stream);
  CHECK(o.raw && !o.chat && !o.load_only);
  CHECK_EQ_INT(o.num_ctx, 256);
  CHECK_NEAR(r.sampling.temperature, 0.5, 0);
  CHECK_EQ_INT(r.sampling.top_k, 7);
  CHECK_NEAR(r.sampling.top_p, 0.9, 0);
  CHECK_NEAR(r.sampling.min_p, 0.05, 0);
  CHECK_EQ_INT(r.sampling.max_tokens, 12);
  CHECK_EQ_INT(r.sampling.n_stop, 2);
  if (r.sampling.n_stop == 2) CHECK_EQ_STR(r.sampling.stop[1], "END");
  CHECK(r.sampling.has_seed && r.sampling.seed == 42);
  CHECK_NEAR(r.sampling.repetition_penalty, 1.3, 0);
  CHECK_NEAR(r.sampling.presence_penalty, 0.25, 0);
  CHECK_NEAR(r.sampling.frequency_penalty, -0.5, 0);
  serve_request_free(&r);

  /* defaults: a stream; Ollama's seed -1 and num_predict -1 mean "unset" */
  CHECK_EQ_INT(parse("{\"model\":\"m\",\"prompt\":\"hi\",\"system\":\"Be brief.\",\"options\":{\"seed\":-1,\"num_predict\":-1}}",
                     false, &r, &o, &f),
               0);
  CHECK(r.stream);
  CHECK(!r.sampling.has_seed);
  CHECK(r.sampling.max_tokens < 0);
  CHECK_EQ_INT(r.kind, SERVE_CHAT); /* templated: system then the prompt as a user turn */
  CHECK_EQ_INT(r.nmessages, 2);
  if (r.nmessages == 2) {
    CHECK_EQ_STR(r.messages[0].role, "system");
    CHECK_EQ_STR(r.messages[0].content, "Be brief.");
    CHECK_EQ_STR(r.messages[1].role, "user");
    CHECK_EQ_STR(r.messages[1].content, "hi");
  }
  serve_request_free(&r);

  /* no prompt / no messages: a load request */
  CHECK_EQ_INT(parse("{\"model\":\"m\"}", false, &r, &o, &f), 0);
  CHECK(o.load_only);
  CHECK_EQ_STR(r.model, "m");
  serve_request_free(&r);
  CHECK_EQ_INT(parse("{\"model\":\"m\",\"messages\":[]}", true, &r, &o, &f), 0);
  CHECK(o.load_only && o.chat);
  serve_request_free(&r);
}

static void test_chat(void) {
  serve_request r;
  oll_request o;
  serve_fail f;
  const char *body =
      "{\"model\":\"m\",\"think\":false,\"format\":\"json\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
      "\"get_weather\",\"description\":\"d\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
      "\"string\"}}}}}],\"messages\":[{\"role\":\"user\",\"content\":\"look\",\"images\":[\"aGk=\",\"aG8=\"]},"
      "{\"role\":\"assistant\",\"content\":\"\",\"thinking\":\"hm\",\"tool_calls\":[{\"function\":{\"name\":"
      "\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}}]},{\"role\":\"tool\",\"content\":\"sunny\",\"tool_name\":"
      "\"get_weather\"}]}";
  CHECK_EQ_INT(parse(body, true, &r, &o, &f), 0);
  CHECK_MSG(f.message[0] == 0, "%s", f.message);
  CHECK_EQ_INT(r.kind, SERVE_CHAT);
  CHECK_EQ_INT(r.nmessages, 3);
  CHECK_EQ_INT(r.n_media, 2);
  if (r.n_media == 2) {
    CHECK_EQ_STR(r.media[0].name, "messages[0].images[0]");
    CHECK_EQ_STR(r.media[1].name, "messages[0].images[1]");
    CHECK_EQ_STR(r.media[1].url, "aG8=");
    CHECK_EQ_INT(r.media[0].kind, HEARTH_MEDIA_IMAGE);
  }
  if (r.nmessages == 3) {
    json_t *calls = json_object_get(r.messages[1].extra, "tool_calls");
    CHECK_EQ_INT((int)json_array_size(calls), 1);
    json_t *fn = json_object_get(json_array_get(calls, 0), "function");
    CHECK_EQ_STR(json_string_value(json_object_get(fn, "name")), "get_weather");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(fn, "arguments"), "city")), "Oslo");
    CHECK_EQ_STR(json_string_value(json_object_get(r.messages[1].extra, "reasoning_content")), "hm");
    CHECK_EQ_STR(json_string_value(json_object_get(r.messages[2].extra, "name")), "get_weather");
    CHECK_EQ_STR(r.messages[2].content, "sunny");
  }
  CHECK_EQ_INT((int)json_array_size(r.tools), 1);
  CHECK(json_is_false(json_object_get(r.template_kwargs, "enable_thinking")));
  CHECK(r.gbnf != NULL && r.sampling.grammar == r.gbnf); /* format "json": any JSON object */
  serve_request_free(&r);

  CHECK_EQ_INT(parse("{\"model\":\"m\",\"think\":\"high\",\"format\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
                     "\"integer\"}},\"required\":[\"a\"]},\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
                     true, &r, &o, &f),
               0);
  CHECK_EQ_STR(json_string_value(json_object_get(r.template_kwargs, "reasoning_effort")), "high");
  CHECK(r.gbnf != NULL);
  serve_request_free(&r);
}

static void test_embed(void) {
  embed_request e;
  serve_fail f;
  const char *b = "{\"model\":\"m\",\"input\":[\"a\",\"bc\"],\"dimensions\":4}";
  CHECK_EQ_INT(oll_embed_parse(b, strlen(b), false, 0, &e, &f), 0);
  CHECK_EQ_INT(e.n, 2);
  CHECK_EQ_INT(e.dimensions, 4);
  CHECK_EQ_STR(e.model, "m");
  float v[8] = {1, 0, 0, 0, 0, 1, 0, 0};
  hbuf out = {0};
  oll_embed_reply(&e, false, v, 4, "m", 3, 0.5, &out);
  json_t *o = json_loads(hbuf_str(&out), 0, NULL);
  CHECK_EQ_STR(json_string_value(json_object_get(o, "model")), "m");
  CHECK_EQ_INT((int)json_array_size(json_object_get(o, "embeddings")), 2);
  CHECK_NEAR(json_number_value(json_array_get(json_array_get(json_object_get(o, "embeddings"), 1), 1)), 1, 0);
  CHECK_EQ_INT((int)json_integer_value(json_object_get(o, "prompt_eval_count")), 3);
  CHECK_EQ_INT((int)json_integer_value(json_object_get(o, "total_duration")), 500000000);
  json_decref(o);
  hbuf_free(&out);
  embed_request_free(&e);

  b = "{\"model\":\"m\",\"prompt\":\"hello\"}";
  CHECK_EQ_INT(oll_embed_parse(b, strlen(b), true, 0, &e, &f), 0);
  CHECK_EQ_INT(e.n, 1);
  oll_embed_reply(&e, true, v, 4, "m", 1, 0.1, &out);
  o = json_loads(hbuf_str(&out), 0, NULL);
  CHECK_EQ_INT((int)json_object_size(o), 1);
  CHECK_EQ_INT((int)json_array_size(json_object_get(o, "embedding")), 4);
  json_decref(o);
  hbuf_free(&out);
  embed_request_free(&e);

  b = "{\"model\":\"m\",\"input\":[\"a\",3]}";
  CHECK_EQ_INT(oll_embed_parse(b, strlen(b), false, 0, &e, &f), 400);
  CHECK_EQ_STR(f.param, "input[1]");
  b = "{\"model\":\"m\",\"input\":\"a\",\"truncate\":true}";
  CHECK_EQ_INT(oll_embed_parse(b, strlen(b), false, 0, &e, &f), 400);
  CHECK_EQ_STR(f.param, "truncate");
  b = "{\"model\":\"m\"}";
  CHECK_EQ_INT(oll_embed_parse(b, strlen(b), true, 0, &e, &f), 400);
  CHECK_EQ_STR(f.param, "prompt");
}

static serve_token tok(const char *s) {
  serve_token t = {.text = s, .len = strlen(s), .id = 1, .token_text = s, .token_len = strlen(s)};
  return t;
}

/* Every line of out, parsed. */
static json_t *lines(const hbuf *out) {
  json_t *a = json_array();
  const char *p = hbuf_str(out);
  while (*p) {
    const char *nl = strchr(p, '\n');
    CHECK_MSG(nl != NULL, "an NDJSON line without its newline: %s", p);
    if (!nl) break;
    json_t *o = json_loadb(p, (size_t)(nl - p), 0, NULL);
    CHECK_MSG(json_is_object(o), "line is not a JSON object: %.*s", (int)(nl - p), p);
    json_array_append_new(a, o ? o : json_null());
    p = nl + 1;
  }
  return a;
}

/* The final object's keys, as Ollama documents them. */
static void final_shape(json_t *o, const char *reason, int prompt, int eval) {
  CHECK(json_is_true(json_object_get(o, "done")));
  CHECK_EQ_STR(json_string_value(json_object_get(o, "done_reason")), reason);
  CHECK_EQ_INT((int)json_integer_value(json_object_get(o, "prompt_eval_count")), prompt);
  CHECK_EQ_INT((int)json_integer_value(json_object_get(o, "eval_count")), eval);
  const char *dur[] = {"total_duration", "load_duration", "prompt_eval_duration", "eval_duration"};
  for (int i = 0; i < 4; i++) CHECK_MSG(json_is_integer(json_object_get(o, dur[i])) &&
                                        json_integer_value(json_object_get(o, dur[i])) >= 0, "%s", dur[i]);
  CHECK(json_integer_value(json_object_get(o, "total_duration")) >=
        json_integer_value(json_object_get(o, "eval_duration")));
  const char *t = json_string_value(json_object_get(o, "created_at"));
  CHECK_MSG(t && strlen(t) == 27 && t[10] == 'T' && t[26] == 'Z', "created_at %s", t ? t : "(none)");
}

static void test_replies(void) {
  serve_result res = {.finish = SERVE_FINISH_STOP, .prompt_tokens = 5, .completion_tokens = 3, .stop_index = -1};
  /* a generate stream: a line per step, an empty step shows nothing, then the final object */
  oll_reply r;
  hbuf out = {0};
  oll_reply_init(&r, false, "m", true, oll_now(), false);
  serve_token a = tok("Hel"), b = tok(""), c = tok("lo");
  oll_stream_token(&r, &a, &out);
  oll_stream_token(&r, &b, &out);
  oll_stream_token(&r, &c, &out);
  oll_stream_finish(&r, &res, &out);
  json_t *l = lines(&out);
  CHECK_EQ_INT((int)json_array_size(l), 3);
  if (json_array_size(l) == 3) {
    json_t *l0 = json_array_get(l, 0), *l2 = json_array_get(l, 2);
    CHECK_EQ_STR(json_string_value(json_object_get(l0, "response")), "Hel");
    CHECK_EQ_STR(json_string_value(json_object_get(l0, "model")), "m");
    CHECK(json_is_false(json_object_get(l0, "done")));
    CHECK_EQ_STR(json_string_value(json_object_get(l2, "response")), "");
    final_shape(l2, "stop", 5, 3);
  }
  json_decref(l);
  hbuf_free(&out);
  oll_reply_free(&r);

  /* a whole chat reply with thinking and a tool call (Hermes syntax), cut by length */
  oll_reply_init(&r, true, "m", false, oll_now(), false);
  tc_opts to = {.format = TC_HERMES, .tools = true, .reasoning = true};
  herr err = {0};
  CHECK_EQ_INT(oll_reply_parse(&r, &to, &err), 0);
  serve_token t1 = tok("<think>why</think>Sure."), t2 = tok("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>");
  oll_reply_add(&r, &t1);
  oll_reply_add(&r, &t2);
  res.finish = SERVE_FINISH_LENGTH;
  oll_reply_body(&r, &res, &out);
  json_t *o = json_loads(hbuf_str(&out), 0, NULL);
  json_t *m = json_object_get(o, "message");
  CHECK_EQ_STR(json_string_value(json_object_get(m, "role")), "assistant");
  CHECK_EQ_STR(json_string_value(json_object_get(m, "content")), "Sure.");
  CHECK_EQ_STR(json_string_value(json_object_get(m, "thinking")), "why");
  json_t *call = json_array_get(json_object_get(m, "tool_calls"), 0);
  CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(call, "function"), "name")), "f");
  CHECK_EQ_INT((int)json_integer_value(json_object_get(json_object_get(json_object_get(call, "function"), "arguments"), "x")), 1);
  final_shape(o, "length", 5, 3);
  json_decref(o);
  hbuf_free(&out);
  oll_reply_free(&r);

  /* a chat stream: the call comes whole in one line, arguments as an object */
  oll_reply_init(&r, true, "m", true, oll_now(), false);
  CHECK_EQ_INT(oll_reply_parse(&r, &to, &err), 0);
  serve_token p1 = tok("<tool_call>\n{\"name\": \"f\", \"argu"), p2 = tok("ments\": {\"x\": 2}}\n</tool_call>");
  oll_stream_token(&r, &p1, &out);
  oll_stream_token(&r, &p2, &out);
  res.finish = SERVE_FINISH_STOP;
  oll_stream_finish(&r, &res, &out);
  l = lines(&out);
  size_t i;
  json_t *x;
  int ncalls = 0;
  json_array_foreach(l, i, x) {
    json_t *calls = json_object_get(json_object_get(x, "message"), "tool_calls");
    if (calls) {
      ncalls++;
      json_t *args = json_object_get(json_object_get(json_array_get(calls, 0), "function"), "arguments");
      CHECK(json_is_object(args) && json_integer_value(json_object_get(args, "x")) == 2);
    }
  }
  CHECK_EQ_INT(ncalls, 1);
  json_decref(l);
  hbuf_free(&out);
  oll_reply_free(&r);

  /* the load answer and an error line */
  oll_load_body(true, "m", "load", &out);
  o = json_loads(hbuf_str(&out), 0, NULL);
  CHECK_EQ_STR(json_string_value(json_object_get(o, "done_reason")), "load");
  CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(o, "message"), "content")), "");
  json_decref(o);
  hbuf_free(&out);
  serve_fail f;
  serve_bad(&f, "x", "broken \"quote\"");
  oll_error_line(&f, &out);
  CHECK_EQ_STR(hbuf_str(&out), "{\"error\":\"broken \\\"quote\\\"\"}\n");
  hbuf_free(&out);
}

/* logprobs: asked for by name, and each sampled token's entry in Ollama's shape — a step whose text
 * is held back sends its entry with the next line. */
static void test_logprobs(void) {
  serve_request r;
  oll_request o;
  serve_fail f;
  CHECK_EQ_INT(parse("{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":true,\"top_logprobs\":3}", false, &r, &o, &f), 0);
  CHECK(r.sampling.logprobs);
  CHECK_EQ_INT(r.sampling.top_logprobs, 3);
  serve_request_free(&r);
  CHECK_EQ_INT(parse("{\"model\":\"m\",\"prompt\":\"x\",\"raw\":true,\"logprobs\":true,\"top_logprobs\":20}", false, &r, &o,
                     &f),
               0);
  CHECK(r.sampling.logprobs && r.sampling.top_logprobs == 20 && r.kind == SERVE_COMPLETION);
  serve_request_free(&r);
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"top_logprobs\":2}", false, "top_logprobs");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":true,\"top_logprobs\":21}", false, "top_logprobs");
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":1}", false, "logprobs");

  oll_reply rep;
  hbuf out = {0};
  oll_reply_init(&rep, true, "m", true, oll_now(), true);
  serve_top_logprob top[2] = {{"A", 1, -0.25f}, {"\xc3\xa9", 2, -1.5f}};
  serve_token held = {.text = "", .len = 0, .id = 5, .token_text = "A", .token_len = 1, .logprob = -0.25f, .top = top, .ntop = 2};
  serve_token shown = {.text = "AB", .len = 2, .id = 6, .token_text = "B", .token_len = 1, .logprob = -0.5f, .top = top, .ntop = 1};
  oll_stream_token(&rep, &held, &out);
  CHECK_EQ_INT((int)out.len, 0); /* nothing shown yet */
  oll_stream_token(&rep, &shown, &out);
  serve_result res = {.finish = SERVE_FINISH_STOP, .prompt_tokens = 2, .completion_tokens = 2, .stop_index = -1};
  oll_stream_finish(&rep, &res, &out);
  json_t *l = lines(&out);
  CHECK_EQ_INT((int)json_array_size(l), 2);
  json_t *lp = json_object_get(json_array_get(l, 0), "logprobs");
  CHECK_EQ_INT((int)json_array_size(lp), 2);
  json_t *e0 = json_array_get(lp, 0), *e1 = json_array_get(lp, 1);
  CHECK_EQ_STR(json_string_value(json_object_get(e0, "token")), "A");
  CHECK_NEAR(json_real_value(json_object_get(e0, "logprob")), -0.25, 1e-6);
  CHECK_EQ_INT((int)json_integer_value(json_array_get(json_object_get(e0, "bytes"), 0)), 'A');
  json_t *alt = json_object_get(e0, "top_logprobs");
  CHECK_EQ_INT((int)json_array_size(alt), 2);
  CHECK_EQ_STR(json_string_value(json_object_get(json_array_get(alt, 1), "token")), "\xc3\xa9");
  CHECK_EQ_INT((int)json_array_size(json_object_get(json_array_get(alt, 1), "bytes")), 2);
  CHECK_EQ_STR(json_string_value(json_object_get(e1, "token")), "B");
  CHECK(json_object_get(json_array_get(l, 1), "logprobs") == NULL); /* the final line: nothing left over */
  json_decref(l);
  hbuf_free(&out);
  oll_reply_free(&rep);
  /* whole: every token's entry in the one object; without logprobs, no key */
  oll_reply_init(&rep, false, "m", false, oll_now(), true);
  oll_reply_add(&rep, &held);
  oll_reply_add(&rep, &shown);
  oll_reply_body(&rep, &res, &out);
  json_t *o2 = json_loads(hbuf_str(&out), 0, NULL);
  CHECK_EQ_INT((int)json_array_size(json_object_get(o2, "logprobs")), 2);
  json_decref(o2);
  hbuf_free(&out);
  oll_reply_free(&rep);
  oll_reply_init(&rep, false, "m", false, oll_now(), false);
  oll_reply_add(&rep, &shown);
  oll_reply_body(&rep, &res, &out);
  CHECK(strstr(hbuf_str(&out), "logprobs") == NULL);
  hbuf_free(&out);
  oll_reply_free(&rep);
}

static void test_keep_alive(void) {
  struct {
    const char *json;
    double want; /* NAN: refused */
  } cases[] = {{"300", 300}, {"0", 0}, {"\"5m\"", 300}, {"\"1h30m\"", 5400}, {"\"90s\"", 90}, {"\"1.5h\"", 5400},
               {"\"250ms\"", 0.25}, {"\"0\"", 0}, {"\"-1\"", 100.0 * 365 * 86400}, {"-5", 100.0 * 365 * 86400},
               {"\"soon\"", NAN}, {"\"5x\"", NAN}, {"\"\"", NAN}, {"\"nan\"", NAN}, {"true", NAN}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    json_t *v = json_loads(cases[i].json, JSON_DECODE_ANY, NULL);
    double t = -7;
    bool ok = oll_keep_alive(v, &t);
    CHECK_MSG(ok == !isnan(cases[i].want), "keep_alive %s: %s", cases[i].json, ok ? "taken" : "refused");
    if (ok && !isnan(cases[i].want)) CHECK_MSG(fabs(t - cases[i].want) < 1e-9, "keep_alive %s: %g, want %g", cases[i].json, t, cases[i].want);
    json_decref(v);
  }
  serve_request r;
  oll_request o;
  serve_fail f;
  CHECK_EQ_INT(parse("{\"model\":\"m\",\"keep_alive\":\"10m\"}", false, &r, &o, &f), 0);
  CHECK(o.load_only && o.keep_alive_s == 600);
  serve_request_free(&r);
  CHECK_EQ_INT(parse("{\"model\":\"m\",\"prompt\":\"x\"}", false, &r, &o, &f), 0);
  CHECK(o.keep_alive_s < 0); /* not given */
  serve_request_free(&r);
  refused("{\"model\":\"m\",\"prompt\":\"x\",\"keep_alive\":\"a while\"}", false, "keep_alive");
}

static void test_models(void) {
  json_t *facts = json_pack("{s:s, s:s, s:s, s:I, s:s, s:I, s:I}", "path", "/m/q.gguf", "format", "gguf", "architecture",
                            "qwen3", "parameters", (json_int_t)596000000, "quantization", "Q4_K", "bytes",
                            (json_int_t)400000000, "modified", (json_int_t)1700000000);
  json_t *m = oll_model_object(facts, "q", false, 0);
  CHECK_EQ_STR(json_string_value(json_object_get(m, "name")), "q");
  CHECK_EQ_STR(json_string_value(json_object_get(m, "model")), "q");
  CHECK_EQ_STR(json_string_value(json_object_get(m, "modified_at")), "2023-11-14T22:13:20.000000Z");
  CHECK_EQ_INT((long long)json_integer_value(json_object_get(m, "size")), 400000000);
  CHECK(json_string_length(json_object_get(m, "digest")) >= 32);
  json_t *d = json_object_get(m, "details");
  CHECK_EQ_STR(json_string_value(json_object_get(d, "format")), "gguf");
  CHECK_EQ_STR(json_string_value(json_object_get(d, "family")), "qwen3");
  CHECK_EQ_STR(json_string_value(json_array_get(json_object_get(d, "families"), 0)), "qwen3");
  CHECK_EQ_STR(json_string_value(json_object_get(d, "parameter_size")), "596M");
  CHECK_EQ_STR(json_string_value(json_object_get(d, "quantization_level")), "Q4_K");
  CHECK(json_object_get(m, "expires_at") == NULL);
  json_decref(m);
  m = oll_model_object(facts, "q", true, 4096);
  CHECK_EQ_INT((int)json_integer_value(json_object_get(m, "context_length")), 4096);
  CHECK(json_is_string(json_object_get(m, "expires_at")));
  json_decref(m);
  json_object_set_new(facts, "parameters", json_integer(8030000000));
  d = oll_details(facts);
  CHECK_EQ_STR(json_string_value(json_object_get(d, "parameter_size")), "8.0B");
  json_decref(d);
  json_decref(facts);
}

int main(void) {
  test_refusals();
  test_options();
  test_suffix();
  test_chat();
  test_embed();
  test_replies();
  test_logprobs();
  test_keep_alive();
  test_models();
  TEST_MAIN_END();
}
