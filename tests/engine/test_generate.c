/* test_generate.c — generation through the public API (and the scheduler
 * under it) on the golden llama fixture (tests/fixtures/golden/llama-f32,
 * made by tools/gen_golden.py from transformers): greedy ids equal the
 * reference's greedy continuation for any prefill chunking; logprobs equal
 * the reference logits' log-softmax; EOS, max_tokens and the context limit end runs as documented;
 * cancellation returns HEARTH_ECANCELLED and frees everything (ASan);
 * seeded sampling is reproducible; concurrent callers queue.
 *
 * Text: the same model with the byte-level tokenizer of
 * tests/fixtures/engine (tools/gen_engine_fixtures.py, which also computed
 * the expected texts and chat renders with Python): streamed text equals the
 * reference decode, a stop string cuts it where the reference says, chat
 * renders equal Jinja2's. */
#include <jansson.h>
#include <pthread.h>
#include <unistd.h>

#include "base/buf.h"
#include "engine/request.h"
#include "sched_alone.h"
#include "hearth.h"
#include "test.h"

#define FIXTURE HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-f32"

static hearth_model *g_model;
static int32_t g_prompt[64];
static size_t g_n_prompt;
static int32_t g_greedy[64];
static size_t g_n_greedy;
static float *g_last_logits; /* owned: the reference logits after prompt 0 */
static int g_vocab;

static bool load_fixture(void) {
  json_error_t je;
  json_t *g = json_load_file(FIXTURE "/golden.json", 0, &je);
  CHECK_MSG(g != NULL, "golden.json: %s", je.text);
  if (!g) return false;
  json_t *p0 = json_array_get(json_object_get(g, "prompts"), 0);
  json_t *ids = json_object_get(json_object_get(g, "greedy"), "ids");
  g_vocab = (int)json_integer_value(json_object_get(g, "vocab_size"));
  size_t i;
  json_t *v;
  json_array_foreach(p0, i, v) if (i < 64) g_prompt[g_n_prompt++] = (int32_t)json_integer_value(v);
  json_array_foreach(ids, i, v) if (i < 64) g_greedy[g_n_greedy++] = (int32_t)json_integer_value(v);
  json_decref(g);
  /* row n_prompt - 1 of prompt 0 in logits_f32.bin */
  FILE *f = fopen(FIXTURE "/logits_f32.bin", "rb");
  CHECK(f != NULL);
  if (!f) return false;
  g_last_logits = malloc(sizeof(float) * (size_t)g_vocab);
  fseek(f, (long)((g_n_prompt - 1) * (size_t)g_vocab * sizeof(float)), SEEK_SET);
  size_t got = fread(g_last_logits, sizeof(float), (size_t)g_vocab, f);
  fclose(f);
  CHECK_EQ_INT(got, g_vocab);
  CHECK_EQ_INT(g_n_prompt, 20);
  CHECK_EQ_INT(g_n_greedy, 24);
  return got == (size_t)g_vocab && g_n_prompt > 0 && g_n_greedy > 0;
}

/* Collects tokens; optionally cancels after `cancel_after` tokens through a flag or the return value. */
typedef struct collect {
  int32_t ids[256];
  float logprobs[256];
  int n;
  int n_calls_null;
  hearth_top_logprob top0[HEARTH_MAX_TOP_LOGPROBS];
  int n_top0;
  int cancel_after;         /* 0 = never */
  bool cancel_by_return;
  volatile int *flag;
} collect;

static int on_token(void *user, const char *text, size_t len, const hearth_token *tok) {
  collect *c = user;
  (void)text;
  (void)len;
  if (!tok) {
    c->n_calls_null++;
    return 0;
  }
  if (c->n < 256) {
    if (c->n == 0) {
      c->n_top0 = tok->n_top;
      for (int i = 0; i < tok->n_top; i++) c->top0[i] = tok->top[i];
    }
    c->logprobs[c->n] = tok->logprob;
    c->ids[c->n++] = tok->id;
  }
  if (c->cancel_after && c->n == c->cancel_after) {
    if (c->cancel_by_return) return 1;
    *c->flag = 1;
  }
  return 0;
}

static int run(const hearth_gen_params *p, collect *c, hearth_gen_result *res, hearth_error *err) {
  hearth_prompt prompt = {.ids = g_prompt, .n_ids = g_n_prompt};
  return hearth_generate(g_model, &prompt, p, on_token, c, res, err);
}

static void test_info(void) {
  hearth_info info;
  hearth_model_info(g_model, &info);
  CHECK_EQ_STR(info.id, "llama-f32");
  CHECK_EQ_STR(info.model_type, "llama");
  CHECK_EQ_INT(info.vocab_size, 512);
  CHECK_EQ_INT(info.context_length, 128);
  CHECK_EQ_INT(info.n_eos, 1);
  CHECK_EQ_INT(info.eos_ids[0], 2);
  CHECK(!info.has_tokenizer);
  CHECK(!info.has_chat_template);
  int32_t *ids = NULL;
  size_t n = 0;
  hearth_error err = {0};
  CHECK_EQ_INT(hearth_tokenize(g_model, "hi", 2, true, &ids, &n, &err), HEARTH_ENOTFOUND);
  char *text = NULL;
  CHECK_EQ_INT(hearth_chat_render(g_model, "[]", NULL, true, NULL, &text, &err), HEARTH_ENOTFOUND);
}

static void test_greedy_matches_reference(void) {
  int chunks[] = {0, 1, 7, 20};
  for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
    hearth_gen_params p;
    hearth_gen_params_init(&p);
    p.temperature = 0;
    p.max_tokens = (int64_t)g_n_greedy;
    p.prefill_chunk = chunks[k];
    collect c = {0};
    hearth_gen_result res;
    hearth_error err = {0};
    int rc = run(&p, &c, &res, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    CHECK_EQ_INT(c.n, g_n_greedy);
    CHECK_MSG(memcmp(c.ids, g_greedy, sizeof(int32_t) * g_n_greedy) == 0, "chunk %d: greedy ids differ", chunks[k]);
    CHECK_EQ_INT(res.finish_reason, HEARTH_FINISH_LENGTH);
    CHECK_EQ_INT(res.prompt_tokens, 20);
    CHECK_EQ_INT(res.completion_tokens, 24);
    CHECK_EQ_INT(res.stop_index, -1);
    CHECK_EQ_INT(res.stop_token, -1);
  }
  /* the model's defaults (generation_config.json without do_sample) are greedy too */
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.max_tokens = 8;
  collect c = {0};
  hearth_gen_result res;
  hearth_error err = {0};
  CHECK_EQ_INT(run(&p, &c, &res, &err), 0);
  CHECK(memcmp(c.ids, g_greedy, sizeof(int32_t) * 8) == 0);
}

/* The first token's logprob and alternatives equal the reference logits' log-softmax. */
static void test_logprobs(void) {
  double mx = -1e30, z = 0;
  for (int i = 0; i < g_vocab; i++) mx = fmax(mx, g_last_logits[i]);
  for (int i = 0; i < g_vocab; i++) z += exp(g_last_logits[i] - mx);
  double lse = mx + log(z);
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.temperature = 0;
  p.max_tokens = 1;
  p.logprobs = true;
  p.top_logprobs = 3;
  collect c = {0};
  hearth_gen_result res;
  hearth_error err = {0};
  CHECK_EQ_INT(run(&p, &c, &res, &err), 0);
  CHECK_EQ_INT(c.n, 1);
  CHECK_EQ_INT(c.ids[0], g_greedy[0]);
  CHECK_NEAR(c.logprobs[0], g_last_logits[g_greedy[0]] - lse, 1e-3);
  CHECK_EQ_INT(c.n_top0, 3);
  CHECK_EQ_INT(c.top0[0].id, g_greedy[0]);
  for (int i = 0; i < c.n_top0; i++) CHECK_NEAR(c.top0[i].logprob, g_last_logits[c.top0[i].id] - lse, 1e-3);
  for (int i = 1; i < c.n_top0; i++) CHECK(c.top0[i].logprob <= c.top0[i - 1].logprob);
}

/* EOS through the engine loop: the 6th greedy token declared an EOS id ends
 * the run there; ignore_eos runs past it. */
static void test_eos(void) {
  /* through the public API: a logit bias that makes the config's EOS (2) certain */
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.temperature = 0;
  p.max_tokens = 10;
  hearth_logit_bias b = {2, 100.0f};
  p.logit_bias = &b;
  p.n_logit_bias = 1;
  collect c = {0};
  hearth_gen_result res;
  hearth_error err = {0};
  CHECK_EQ_INT(run(&p, &c, &res, &err), 0);
  CHECK_EQ_INT(c.n, 1);
  CHECK_EQ_INT(c.ids[0], 2);
  CHECK_EQ_INT(res.finish_reason, HEARTH_FINISH_STOP);
  CHECK_EQ_INT(res.stop_token, 2);
  CHECK_EQ_INT(res.completion_tokens, 1);
  p.ignore_eos = true;
  memset(&c, 0, sizeof c);
  CHECK_EQ_INT(run(&p, &c, &res, &err), 0);
  CHECK_EQ_INT(c.n, 10);
  CHECK_EQ_INT(res.finish_reason, HEARTH_FINISH_LENGTH);
}

static void test_max_tokens_and_context(void) {
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.temperature = 0;
  p.max_tokens = 3;
  collect c = {0};
  hearth_gen_result res;
  hearth_error err = {0};
  CHECK_EQ_INT(run(&p, &c, &res, &err), 0);
  CHECK_EQ_INT(c.n, 3);
  CHECK_EQ_INT(res.finish_reason, HEARTH_FINISH_LENGTH);
  /* 20 + 109 > 128 */
  p.max_tokens = 109;
  memset(&c, 0, sizeof c);
  CHECK_EQ_INT(run(&p, &c, &res, &err), HEARTH_ELIMIT);
  CHECK(strstr(err.msg, "context_length_exceeded") != NULL);
  CHECK(err.cause == HEARTH_CAUSE_CONTEXT_LENGTH);
  CHECK_EQ_INT(c.n, 0);
  /* unset: up to the context, 108 tokens (EOS made impossible) */
  p.max_tokens = -1;
  hearth_logit_bias b = {2, -100.0f};
  p.logit_bias = &b;
  p.n_logit_bias = 1;
  memset(&c, 0, sizeof c);
  CHECK_EQ_INT(run(&p, &c, &res, &err), 0);
  CHECK_EQ_INT(res.completion_tokens, 108);
  CHECK_EQ_INT(res.finish_reason, HEARTH_FINISH_LENGTH);
  /* max_tokens 0: nothing to do */
  p.max_tokens = 0;
  memset(&c, 0, sizeof c);
  CHECK_EQ_INT(run(&p, &c, &res, &err), 0);
  CHECK_EQ_INT(c.n, 0);
  CHECK_EQ_INT(res.finish_reason, HEARTH_FINISH_LENGTH);
  /* a bad parameter names itself */
  hearth_gen_params_init(&p);
  p.top_p = 2;
  CHECK_EQ_INT(run(&p, &c, &res, &err), HEARTH_EINVAL);
  CHECK(strstr(err.msg, "top_p") != NULL);
  /* a prompt id outside the vocabulary */
  hearth_gen_params_init(&p);
  int32_t bad[2] = {5, 512};
  hearth_prompt prompt = {.ids = bad, .n_ids = 2};
  CHECK_EQ_INT(hearth_generate(g_model, &prompt, &p, NULL, NULL, &res, &err), HEARTH_EINVAL);
  /* stop strings need a tokenizer */
  const char *stops[] = {"x"};
  p.stop = stops;
  p.n_stop = 1;
  CHECK_EQ_INT(run(&p, &c, &res, &err), HEARTH_EINVAL);
}

static void test_cancel(void) {
  volatile int flag = 0;
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.temperature = 0;
  p.max_tokens = 20;
  p.cancel = &flag;
  collect c = {.cancel_after = 3, .flag = &flag};
  hearth_gen_result res;
  hearth_error err = {0};
  CHECK_EQ_INT(run(&p, &c, &res, &err), HEARTH_ECANCELLED);
  CHECK_EQ_INT(c.n, 3);
  CHECK_EQ_INT(res.finish_reason, HEARTH_FINISH_CANCELLED);
  CHECK_EQ_INT(res.completion_tokens, 3);
  /* by the callback's return value */
  flag = 0;
  memset(&c, 0, sizeof c);
  c.cancel_after = 5;
  c.cancel_by_return = true;
  CHECK_EQ_INT(run(&p, &c, &res, &err), HEARTH_ECANCELLED);
  CHECK_EQ_INT(c.n, 5);
  /* set before the start: cancelled in prefill, no token */
  flag = 1;
  memset(&c, 0, sizeof c);
  p.prefill_chunk = 4;
  CHECK_EQ_INT(run(&p, &c, &res, &err), HEARTH_ECANCELLED);
  CHECK_EQ_INT(c.n, 0);
  CHECK_EQ_INT(res.completion_tokens, 0);
  /* the model is still fine afterwards */
  flag = 0;
  memset(&c, 0, sizeof c);
  p.max_tokens = 4;
  CHECK_EQ_INT(run(&p, &c, &res, &err), 0);
  CHECK(memcmp(c.ids, g_greedy, sizeof(int32_t) * 4) == 0);
}

static void sampled(uint64_t seed, collect *c) {
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.temperature = 1.0;
  p.top_k = 0;
  p.has_seed = true;
  p.seed = seed;
  p.max_tokens = 24;
  p.ignore_eos = true;
  hearth_gen_result res;
  hearth_error err = {0};
  memset(c, 0, sizeof *c);
  CHECK_EQ_INT(run(&p, c, &res, &err), 0);
  CHECK_EQ_INT(c->n, 24);
}

static void test_seed(void) {
  collect a, b, d;
  sampled(11, &a);
  sampled(11, &b);
  sampled(12, &d);
  CHECK(memcmp(a.ids, b.ids, sizeof a.ids) == 0);
  CHECK(memcmp(a.ids, d.ids, sizeof a.ids) != 0);
  CHECK(memcmp(a.ids, g_greedy, sizeof(int32_t) * g_n_greedy) != 0); /* it did sample */
}

/* Engine-level EOS: a caller-declared EOS id (the 6th greedy token) ends the run. */
static void test_engine_eos(void) {
  /* the engine API needs the model struct; reach it through a fresh load */
  model *m = NULL;
  herr err = {0};
  CHECK_EQ_INT(model_load(FIXTURE, NULL, &m, &err), 0);
  if (!m) return;
  gen_request r;
  gen_request_init(&r);
  r.prompt = g_prompt;
  r.n_prompt = g_n_prompt;
  r.max_tokens = 24;
  r.sample.greedy = true;
  r.eos_ids[0] = g_greedy[5];
  r.n_eos = 1;
  gen_result res;
  CHECK_EQ_INT(sched_run_alone(m, &r, NULL, NULL, &res, &err), 0);
  /* the first occurrence of that id in the greedy run */
  int first = 0;
  while (g_greedy[first] != g_greedy[5]) first++;
  CHECK_EQ_INT(res.completion_tokens, first + 1);
  CHECK_EQ_INT(res.finish, GEN_FINISH_STOP);
  CHECK_EQ_INT(res.stop_token, g_greedy[5]);
  model_free(m);
}

static void *concurrent_run(void *arg) {
  collect *c = arg;
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.temperature = 0;
  p.max_tokens = (int64_t)g_n_greedy;
  hearth_gen_result res;
  hearth_error err = {0};
  if (run(&p, c, &res, &err)) c->n = -1;
  return NULL;
}

static void test_concurrent_callers(void) {
  collect c[3];
  memset(c, 0, sizeof c);
  pthread_t th[3];
  for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, concurrent_run, &c[i]);
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 3; i++) {
    CHECK_EQ_INT(c[i].n, g_n_greedy);
    CHECK(memcmp(c[i].ids, g_greedy, sizeof(int32_t) * g_n_greedy) == 0);
  }
}

/* ---- text ---------------------------------------------------------------- */

#define ENGINE_FIXTURES HEARTH_SOURCE_DIR "/tests/fixtures/engine"

static char g_text_dir[] = "/tmp/hearth_gen_text_XXXXXX";
static hearth_model *g_text;
static json_t *g_expected;

/* A model folder: the golden model's weights and config, the fixture tokenizer. */
static bool make_text_model(void) {
  if (!mkdtemp(g_text_dir)) return false;
  const char *from[] = {FIXTURE "/config.json", FIXTURE "/generation_config.json", FIXTURE "/model.safetensors",
                        ENGINE_FIXTURES "/tokenizer.json", ENGINE_FIXTURES "/tokenizer_config.json"};
  const char *names[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                         "tokenizer_config.json"};
  for (int i = 0; i < 5; i++) {
    char to[600];
    snprintf(to, sizeof to, "%s/%s", g_text_dir, names[i]);
    if (symlink(from[i], to)) return false;
  }
  json_error_t je;
  g_expected = json_load_file(ENGINE_FIXTURES "/expected.json", 0, &je);
  CHECK_MSG(g_expected != NULL, "expected.json: %s", je.text);
  hearth_error err = {0};
  int rc = hearth_model_load(g_text_dir, NULL, &g_text, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  return rc == 0 && g_expected;
}

static void remove_text_model(void) {
  const char *names[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                         "tokenizer_config.json"};
  for (int i = 0; i < 5; i++) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", g_text_dir, names[i]);
    unlink(p);
  }
  rmdir(g_text_dir);
  hearth_model_free(g_text);
  json_decref(g_expected);
}

static const char *expected_str(const char *key) { return json_string_value(json_object_get(g_expected, key)); }

typedef struct text_out {
  hbuf text;
  int steps, flushes;
  hbuf token_texts; /* each token's own text, concatenated */
} text_out;

static int on_text(void *user, const char *text, size_t len, const hearth_token *tok) {
  text_out *o = user;
  hbuf_append(&o->text, text, len);
  if (tok) {
    o->steps++;
    hbuf_append(&o->token_texts, tok->text, tok->len);
  } else {
    o->flushes++;
  }
  return 0;
}

static void test_text_info(void) {
  hearth_info info;
  hearth_model_info(g_text, &info);
  CHECK(info.has_tokenizer);
  CHECK(info.has_chat_template);
  CHECK_EQ_INT(info.bos_id, 1);
  CHECK_EQ_INT(info.n_eos, 1); /* config 2, generation_config 2, tokenizer "</s>" = 2 */
  CHECK_EQ_INT(info.eos_ids[0], 2);
  char *text = NULL;
  size_t len = 0;
  hearth_error err = {0};
  CHECK_EQ_INT(hearth_detokenize(g_text, g_greedy, g_n_greedy, true, &text, &len, &err), 0);
  CHECK_EQ_STR(text, expected_str("greedy_text"));
  CHECK_EQ_INT(len, strlen(expected_str("greedy_text")));
  hearth_free(text);
}

static void test_text_greedy(void) {
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.temperature = 0;
  p.max_tokens = (int64_t)g_n_greedy;
  text_out o = {0};
  hearth_prompt prompt = {.ids = g_prompt, .n_ids = g_n_prompt};
  hearth_gen_result res;
  hearth_error err = {0};
  int rc = hearth_generate(g_text, &prompt, &p, on_text, &o, &res, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  CHECK_EQ_STR(hbuf_str(&o.text), expected_str("greedy_text"));
  CHECK_EQ_INT(o.steps, g_n_greedy);
  CHECK_EQ_INT(res.finish_reason, HEARTH_FINISH_LENGTH);
  /* each token's own bytes, concatenated and decoded leniently, give the text back */
  CHECK(o.token_texts.len >= 1);
  hbuf_free(&o.text);
  hbuf_free(&o.token_texts);
}

static void test_text_stop(void) {
  const char *stop = expected_str("stop");
  const char *stops[2] = {"never-in-the-output", stop};
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.temperature = 0;
  p.max_tokens = (int64_t)g_n_greedy;
  p.stop = stops;
  p.n_stop = 2;
  text_out o = {0};
  hearth_prompt prompt = {.ids = g_prompt, .n_ids = g_n_prompt};
  hearth_gen_result res;
  hearth_error err = {0};
  int rc = hearth_generate(g_text, &prompt, &p, on_text, &o, &res, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  CHECK_EQ_STR(hbuf_str(&o.text), expected_str("text_before_stop"));
  CHECK_EQ_INT(res.finish_reason, HEARTH_FINISH_STOP);
  CHECK_EQ_INT(res.stop_index, 1);
  CHECK_EQ_INT(res.stop_token, -1);
  CHECK_EQ_INT(res.completion_tokens, json_integer_value(json_object_get(g_expected, "tokens_to_stop")));
  CHECK_EQ_INT(o.flushes, 0);
  hbuf_free(&o.text);
  hbuf_free(&o.token_texts);
}

static void test_text_prompt(void) {
  /* a text prompt goes through the tokenizer: its token count is the prompt's */
  const char *text = "hi there, this is a test";
  int32_t *ids = NULL;
  size_t n = 0;
  hearth_error err = {0};
  CHECK_EQ_INT(hearth_tokenize(g_text, text, strlen(text), false, &ids, &n, &err), 0);
  CHECK(n > 0);
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.temperature = 0;
  p.max_tokens = 4;
  hearth_prompt prompt = {.text = text};
  hearth_gen_result res;
  text_out o = {0};
  CHECK_EQ_INT(hearth_generate(g_text, &prompt, &p, on_text, &o, &res, &err), 0);
  CHECK_EQ_INT(res.prompt_tokens, n);
  /* the same as the ids */
  text_out o2 = {0};
  hearth_prompt prompt2 = {.ids = ids, .n_ids = n};
  hearth_gen_result res2;
  CHECK_EQ_INT(hearth_generate(g_text, &prompt2, &p, on_text, &o2, &res2, &err), 0);
  CHECK_EQ_STR(hbuf_str(&o.text), hbuf_str(&o2.text));
  hearth_free(ids);
  hbuf_free(&o.text);
  hbuf_free(&o.token_texts);
  hbuf_free(&o2.text);
  hbuf_free(&o2.token_texts);
}

static void test_chat_render(void) {
  json_t *renders = json_object_get(g_expected, "chat");
  size_t i;
  json_t *r;
  json_array_foreach(renders, i, r) {
    char *msgs = json_dumps(json_object_get(r, "messages"), JSON_COMPACT);
    json_t *tools_j = json_object_get(r, "tools"), *kw_j = json_object_get(r, "kwargs");
    char *tools = json_is_null(tools_j) ? NULL : json_dumps(tools_j, JSON_COMPACT);
    char *kw = json_is_null(kw_j) ? NULL : json_dumps(kw_j, JSON_COMPACT);
    char *text = NULL;
    hearth_error err = {0};
    int rc = hearth_chat_render(g_text, msgs, tools, json_is_true(json_object_get(r, "add_generation_prompt")), kw,
                                &text, &err);
    CHECK_MSG(rc == 0, "render %zu: %s", i, err.msg);
    if (!rc) CHECK_EQ_STR(text, json_string_value(json_object_get(r, "text")));
    hearth_free(text);
    free(msgs);
    free(tools);
    free(kw);
  }
  /* bad JSON is a clear error */
  char *text = NULL;
  hearth_error err = {0};
  CHECK_EQ_INT(hearth_chat_render(g_text, "[{", NULL, true, NULL, &text, &err), HEARTH_EINVAL);
  CHECK(strstr(err.msg, "messages") != NULL);
  CHECK_EQ_INT(hearth_chat_render(g_text, "{}", NULL, true, NULL, &text, &err), HEARTH_EINVAL);
  CHECK(text == NULL);
}

/* generation_config.json's sampling fields are the defaults: unset params
 * with a seed give the same tokens as the same values passed explicitly; its
 * EOS ids join config.json's. */
static void gen_with(hearth_model *m, const hearth_gen_params *p, collect *c) {
  hearth_prompt prompt = {.ids = g_prompt, .n_ids = g_n_prompt};
  hearth_gen_result res;
  hearth_error err = {0};
  memset(c, 0, sizeof *c);
  int rc = hearth_generate(m, &prompt, p, on_token, c, &res, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
}

static void test_generation_config_defaults(void) {
  char dir[] = "/tmp/hearth_gen_cfg_XXXXXX";
  if (!mkdtemp(dir)) return;
  const char *names[] = {"config.json", "model.safetensors", "generation_config.json"};
  const char *from[] = {FIXTURE "/config.json", FIXTURE "/model.safetensors"};
  char p[600];
  for (int i = 0; i < 2; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    CHECK(symlink(from[i], p) == 0);
  }
  snprintf(p, sizeof p, "%s/generation_config.json", dir);
  FILE *f = fopen(p, "w");
  if (f) {
    fputs("{\"do_sample\": true, \"temperature\": 0.7, \"top_k\": 5, \"top_p\": 0.9, "
          "\"repetition_penalty\": 1.3, \"eos_token_id\": [2, 7]}",
          f);
    fclose(f);
  }
  hearth_model *m = NULL;
  hearth_error err = {0};
  CHECK_EQ_INT(hearth_model_load(dir, NULL, &m, &err), 0);
  if (m) {
    hearth_info info;
    hearth_model_info(m, &info);
    CHECK_EQ_INT(info.n_eos, 2);
    CHECK_EQ_INT(info.eos_ids[0], 2);
    CHECK_EQ_INT(info.eos_ids[1], 7);
    hearth_gen_params dflt, expl, other;
    hearth_gen_params_init(&dflt);
    dflt.has_seed = true;
    dflt.seed = 5;
    dflt.max_tokens = 24;
    dflt.ignore_eos = true;
    expl = dflt;
    expl.temperature = 0.7;
    expl.top_k = 5;
    expl.top_p = 0.9;
    expl.repetition_penalty = 1.3;
    other = expl;
    other.top_k = 0;
    other.top_p = 1;
    other.repetition_penalty = 1;
    collect a, b, c;
    gen_with(m, &dflt, &a);
    gen_with(m, &expl, &b);
    gen_with(m, &other, &c);
    CHECK_EQ_INT(a.n, 24);
    CHECK(memcmp(a.ids, b.ids, sizeof a.ids) == 0);
    CHECK(memcmp(a.ids, c.ids, sizeof a.ids) != 0);
    CHECK(memcmp(a.ids, g_greedy, sizeof(int32_t) * g_n_greedy) != 0); /* do_sample: not greedy */
    /* temperature 0 in the request overrides do_sample */
    hearth_gen_params greedy = dflt;
    greedy.temperature = 0;
    greedy.repetition_penalty = 1;
    gen_with(m, &greedy, &c);
    CHECK(memcmp(c.ids, g_greedy, sizeof(int32_t) * g_n_greedy) == 0);
    hearth_model_free(m);
  }
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    unlink(p);
  }
  rmdir(dir);
}

/* Reading calls (tokenize, detokenize, render) run while generations run. */
typedef struct reader_job {
  int rounds, bad;
} reader_job;

static void *reader_thread(void *arg) {
  reader_job *j = arg;
  const char *msgs = "[{\"role\":\"user\",\"content\":\"hi there\"}]";
  for (int r = 0; r < j->rounds; r++) {
    hearth_error err = {0};
    char *text = NULL;
    if (hearth_chat_render(g_text, msgs, NULL, true, NULL, &text, &err) || !text) {
      j->bad++;
      continue;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    char *back = NULL;
    if (hearth_tokenize(g_text, text, strlen(text), false, &ids, &n, &err) ||
        hearth_detokenize(g_text, ids, n, false, &back, NULL, &err) || strcmp(back, text) != 0)
      j->bad++;
    hearth_free(back);
    hearth_free(ids);
    hearth_free(text);
  }
  return NULL;
}

static void *text_gen_thread(void *arg) {
  text_out *o = arg;
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.temperature = 0;
  p.max_tokens = (int64_t)g_n_greedy;
  hearth_prompt prompt = {.ids = g_prompt, .n_ids = g_n_prompt};
  hearth_gen_result res;
  hearth_error err = {0};
  if (hearth_generate(g_text, &prompt, &p, on_text, o, &res, &err)) o->steps = -1;
  return NULL;
}

static void test_concurrent_readers(void) {
  reader_job jobs[2] = {{30, 0}, {30, 0}};
  text_out outs[2];
  memset(outs, 0, sizeof outs);
  pthread_t th[4];
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, reader_thread, &jobs[i]);
  for (int i = 0; i < 2; i++) pthread_create(&th[2 + i], NULL, text_gen_thread, &outs[i]);
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 2; i++) {
    CHECK_EQ_INT(jobs[i].bad, 0);
    CHECK_EQ_INT(outs[i].steps, g_n_greedy);
    CHECK_EQ_STR(hbuf_str(&outs[i].text), expected_str("greedy_text"));
    hbuf_free(&outs[i].text);
    hbuf_free(&outs[i].token_texts);
  }
}

/* A template that does not parse: the model still loads and generates from
 * ids; rendering reports the parse error. */
static void test_bad_template(void) {
  char dir[] = "/tmp/hearth_gen_badtpl_XXXXXX";
  if (!mkdtemp(dir)) return;
  const char *from[] = {FIXTURE "/config.json", FIXTURE "/generation_config.json", FIXTURE "/model.safetensors",
                        ENGINE_FIXTURES "/tokenizer.json"};
  const char *names[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                         "tokenizer_config.json"};
  char p[600];
  for (int i = 0; i < 4; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    CHECK(symlink(from[i], p) == 0);
  }
  snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
  FILE *f = fopen(p, "w");
  if (f) {
    fputs("{\"eos_token\": \"</s>\", \"chat_template\": \"{% for %}\"}", f);
    fclose(f);
  }
  hearth_model *m = NULL;
  hearth_error err = {0};
  CHECK_EQ_INT(hearth_model_load(dir, NULL, &m, &err), 0);
  if (m) {
    hearth_info info;
    hearth_model_info(m, &info);
    CHECK(info.has_tokenizer);
    CHECK(!info.has_chat_template);
    char *text = NULL;
    int rc = hearth_chat_render(m, "[]", NULL, true, NULL, &text, &err);
    CHECK(rc != 0 && rc != HEARTH_ENOTFOUND);
    CHECK(strstr(err.msg, "tokenizer_config.json") != NULL);
    hearth_gen_params gp;
    hearth_gen_params_init(&gp);
    gp.max_tokens = 2;
    hearth_prompt prompt = {.ids = g_prompt, .n_ids = g_n_prompt};
    hearth_gen_result res;
    CHECK_EQ_INT(hearth_generate(m, &prompt, &gp, NULL, NULL, &res, &err), 0);
    CHECK_EQ_INT(res.completion_tokens, 2);
    hearth_model_free(m);
  }
  for (int i = 0; i < 5; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    unlink(p);
  }
  rmdir(dir);
}

/* A vocabulary and no chat template: chats render as the built-in chatml
 * (hearth_info says so); chat_template names another; an unknown name is
 * refused at load, listing the names. */
static void test_no_template_fallback(void) {
  char dir[] = "/tmp/hearth_gen_notpl_XXXXXX";
  if (!mkdtemp(dir)) return;
  const char *from[] = {FIXTURE "/config.json", FIXTURE "/generation_config.json", FIXTURE "/model.safetensors",
                        ENGINE_FIXTURES "/tokenizer.json"};
  const char *names[] = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"};
  char p[600];
  for (int i = 0; i < 4; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    CHECK(symlink(from[i], p) == 0);
  }
  const char *msgs = "[{\"role\": \"user\", \"content\": \"Hi\"}]";
  hearth_model *m = NULL;
  hearth_error err = {0};
  CHECK_EQ_INT(hearth_model_load(dir, NULL, &m, &err), 0);
  if (m) {
    hearth_info info;
    hearth_model_info(m, &info);
    CHECK(info.has_chat_template && info.chat_template_fallback);
    char *text = NULL;
    CHECK_EQ_INT(hearth_chat_render(m, msgs, NULL, true, NULL, &text, &err), 0);
    CHECK_EQ_STR(text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    hearth_free(text);
    hearth_model_free(m);
  }
  m = NULL;
  CHECK_EQ_INT(hearth_model_load(dir, &(hearth_load_opts){.chat_template = "phi3"}, &m, &err), 0);
  if (m) {
    hearth_info info;
    hearth_model_info(m, &info);
    CHECK(info.has_chat_template && !info.chat_template_fallback);
    char *text = NULL;
    CHECK_EQ_INT(hearth_chat_render(m, msgs, NULL, true, NULL, &text, &err), 0);
    CHECK_EQ_STR(text, "<|user|>\nHi<|end|>\n<|assistant|>\n");
    hearth_free(text);
    hearth_model_free(m);
  }
  m = NULL;
  CHECK_EQ_INT(hearth_model_load(dir, &(hearth_load_opts){.chat_template = "nope"}, &m, &err), HEARTH_EINVAL);
  CHECK_MSG(m == NULL && strstr(err.msg, "chatml, deepseek3, gemma, llama3, mistral-v7, phi3"), "%s", err.msg);
  CHECK_EQ_STR(hearth_chat_template_name(0), "chatml");
  CHECK(hearth_chat_template_name(6) == NULL);
  for (int i = 0; i < 4; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    unlink(p);
  }
  rmdir(dir);
}

int main(void) {
  if (!load_fixture()) TEST_MAIN_END();
  hearth_error err = {0};
  hearth_load_opts opts = {.threads = 2};
  int rc = hearth_model_load(FIXTURE, &opts, &g_model, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (rc) {
    free(g_last_logits);
    TEST_MAIN_END();
  }
  RUN(test_info);
  RUN(test_no_template_fallback);
  RUN(test_greedy_matches_reference);
  RUN(test_logprobs);
  RUN(test_eos);
  RUN(test_max_tokens_and_context);
  RUN(test_cancel);
  RUN(test_seed);
  RUN(test_engine_eos);
  RUN(test_concurrent_callers);
  RUN(test_generation_config_defaults);
  if (make_text_model()) {
    RUN(test_text_info);
    RUN(test_text_greedy);
    RUN(test_text_stop);
    RUN(test_text_prompt);
    RUN(test_chat_render);
    RUN(test_bad_template);
    RUN(test_concurrent_readers);
  }
  remove_text_model();
  hearth_model_free(g_model);
  free(g_last_logits);
  TEST_MAIN_END();
}
