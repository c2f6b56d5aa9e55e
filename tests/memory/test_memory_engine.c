/* Tests of the memory pipeline's engine over a hearth model
 * (engine_hearth.h), on the built-in model (models/default): a stage's
 * calls run as one batch and each answer follows the stage's schema; calls
 * of different stages run one at a time; a prompt too long for the context
 * gets no answer while the others do; a batched answer is the one the same
 * call gives alone (greedy); a stage adapter that cannot be loaded fails
 * naming the stage. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/buf.h"
#include "hearth.h"
#include "memory/engine_hearth.h"
#include "memory/stages.h"
#include "test.h"

#define MODEL HEARTH_SOURCE_DIR "/models/default"

static hearth_model *model;

static mem_call call(int stage, const char *prompt) {
  return (mem_call){.stage = stage, .prompt = prompt, .schema = mem_stage_schema(stage),
                    .max_tokens = mem_stage_max_tokens(stage)};
}

static json_t *parsed(const mem_call *c) { return c->answer ? json_loads(c->answer, 0, NULL) : NULL; }

static void check_route_answer(const mem_call *c) {
  json_t *v = parsed(c);
  const char *action = json_string_value(json_object_get(v, "action"));
  CHECK_MSG(action && (!strcmp(action, "create") || !strcmp(action, "patch")), "answer: %s", c->answer ? c->answer : "(none)");
  CHECK(json_is_string(json_object_get(v, "slug")) && json_is_string(json_object_get(v, "title")));
  json_decref(v);
}

static void free_answers(mem_call *c, size_t n) {
  for (size_t i = 0; i < n; i++) free(c[i].answer), c[i].answer = NULL;
}

static void test_one_batch(void) {
  mem_hearth h;
  herr err = {0};
  CHECK(mem_hearth_init(&h, model, MODEL, NULL, &err) == 0);
  mem_engine e = mem_hearth_engine(&h);
  CHECK_EQ_STR(e.id, MODEL);
  mem_call c[3] = {call(MEM_ROUTE, "New facts about Alice: she lives in Lyon."),
                   call(MEM_ROUTE, "New facts about the shed: it is made of cedar."),
                   call(MEM_ROUTE, "New facts about Bergen: it rains there.")};
  CHECK(e.run(e.ctx, c, 3, &err) == 0);
  CHECK_EQ_INT(h.batches, 1);
  CHECK_EQ_INT(h.singles, 0);
  for (int i = 0; i < 3; i++) check_route_answer(&c[i]);
  /* the same call alone gives the same answer */
  mem_call alone = call(MEM_ROUTE, c[1].prompt);
  CHECK(e.run(e.ctx, &alone, 1, &err) == 0);
  CHECK_EQ_STR(alone.answer, c[1].answer);
  free(alone.answer);
  free_answers(c, 3);
}

static void test_mixed_stages_one_at_a_time(void) {
  mem_hearth h;
  herr err = {0};
  CHECK(mem_hearth_init(&h, model, MODEL, NULL, &err) == 0);
  mem_engine e = mem_hearth_engine(&h);
  mem_call c[2] = {call(MEM_ROUTE, "New facts about Alice: she lives in Lyon."),
                   call(MEM_LINK, "Which articles does the article on Alice link to?")};
  CHECK(e.run(e.ctx, c, 2, &err) == 0);
  CHECK_EQ_INT(h.batches, 0);
  CHECK_EQ_INT(h.singles, 2);
  check_route_answer(&c[0]);
  json_t *v = parsed(&c[1]);
  CHECK_MSG(json_is_array(json_object_get(v, "links")), "answer: %s", c[1].answer ? c[1].answer : "(none)");
  json_decref(v);
  free_answers(c, 2);
}

static void test_prompt_too_long(void) {
  mem_hearth h;
  herr err = {0};
  CHECK(mem_hearth_init(&h, model, MODEL, NULL, &err) == 0);
  mem_engine e = mem_hearth_engine(&h);
  hbuf big = {0};
  for (int i = 0; i < 3000; i++) hbuf_puts(&big, "word ");
  mem_call c[2] = {call(MEM_ROUTE, hbuf_str(&big)), call(MEM_ROUTE, "New facts about Alice: she lives in Lyon.")};
  CHECK(e.run(e.ctx, c, 2, &err) == 0);
  CHECK(c[0].answer == NULL);
  check_route_answer(&c[1]);
  CHECK_EQ_INT(h.batches, 1);
  free_answers(c, 2);
  hbuf_free(&big);
}

static void test_bad_adapter(void) {
  mem_hearth h;
  herr err = {0};
  const char *adapters[MEM_STAGES] = {[MEM_WRITE] = "/nonexistent/adapter"};
  CHECK(mem_hearth_init(&h, model, MODEL, adapters, &err) != 0);
  CHECK_MSG(strstr(err.msg, "--stage-adapter write") != NULL, "%s", err.msg);
}

int main(void) {
  hearth_load_opts lo = {.threads = 2};
  herr err = {0};
  if (hearth_model_load(MODEL, &lo, &model, &err)) {
    fprintf(stderr, "cannot load %s: %s\n", MODEL, err.msg);
    return 1;
  }
  RUN(test_one_batch);
  RUN(test_mixed_stages_one_at_a_time);
  RUN(test_prompt_too_long);
  RUN(test_bad_adapter);
  hearth_model_free(model);
  fprintf(stderr, "%d checks, %d failures\n", test_checks, test_failures);
  return test_failures ? 1 : 0;
}
