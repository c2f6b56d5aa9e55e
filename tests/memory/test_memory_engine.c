/* Tests of the memory pipeline's engine over a hearth model
 * (engine_hearth.h), on the built-in model (models/default): a stage's
 * calls run as one batch and each answer follows the stage's schema; calls
 * of different stages run one at a time; a prompt too long for the context
 * gets no answer while the others do; a batched answer is the one the same
 * call gives alone (greedy); a stage's LoRA adapter (one the test writes,
 * large enough to move the output) is loaded as "memory-<stage>" and runs
 * that stage's calls only; one that cannot be loaded fails naming the stage. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include <sys/stat.h>
#include <unistd.h>

#include "base/buf.h"
#include "format/safetensors_write.h"
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

/* A PEFT adapter on every layer's o_proj of the built-in model (8 layers, 256 wide), rank 4, large random weights. */
static void write_adapter(const char *dir) {
  mkdir(dir, 0755);
  char path[700];
  snprintf(path, sizeof path, "%s/adapter_config.json", dir);
  FILE *f = fopen(path, "w");
  if (!f) return;
  fputs("{\"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"o_proj\"]}", f);
  fclose(f);
  enum { LAYERS = 8, R = 4, W = 256 };
  static float a[LAYERS][R * W], b[LAYERS][W * R];
  uint32_t x = 12345u;
  st_writer *w = st_writer_new();
  for (int l = 0; l < LAYERS; l++) {
    for (int i = 0; i < R * W; i++) x = x * 1664525u + 1013904223u, a[l][i] = 4.0f * ((float)(x >> 8) / 16777216.0f - 0.5f);
    for (int i = 0; i < W * R; i++) x = x * 1664525u + 1013904223u, b[l][i] = 4.0f * ((float)(x >> 8) / 16777216.0f - 0.5f);
    char na[200], nb[200];
    snprintf(na, sizeof na, "base_model.model.model.layers.%d.self_attn.o_proj.lora_A.weight", l);
    snprintf(nb, sizeof nb, "base_model.model.model.layers.%d.self_attn.o_proj.lora_B.weight", l);
    st_writer_tensor(w, na, ST_F32, 2, (int64_t[]){R, W}, a[l]);
    st_writer_tensor(w, nb, ST_F32, 2, (int64_t[]){W, R}, b[l]);
  }
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  herr err = {0};
  CHECK_MSG(st_writer_write(w, path, NULL, NULL, &err) == 0, "%s", err.msg);
  st_writer_free(w);
}

static void test_stage_adapter(void) {
  char dir[] = "/tmp/hearth_memory_adapter_XXXXXX";
  if (!mkdtemp(dir)) return;
  write_adapter(dir);
  mem_hearth base, tuned;
  herr err = {0};
  const char *adapters[MEM_STAGES] = {[MEM_ROUTE] = dir};
  CHECK(mem_hearth_init(&base, model, MODEL, NULL, &err) == 0);
  int rc = mem_hearth_init(&tuned, model, MODEL, adapters, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (rc) return;
  hearth_adapter_info info[4];
  CHECK_EQ_INT(hearth_adapter_list(model, info, 4), 1);
  CHECK_EQ_STR(info[0].name, "memory-route");
  CHECK(strstr(tuned.id, "memory-route=") != NULL && strcmp(tuned.id, base.id));
  mem_engine eb = mem_hearth_engine(&base), et = mem_hearth_engine(&tuned);
  const char *prompt = "New facts about Alice: she lives in Lyon and works as a nurse.";
  mem_call plain[2] = {call(MEM_ROUTE, prompt), call(MEM_LINK, prompt)}, under[2] = {call(MEM_ROUTE, prompt), call(MEM_LINK, prompt)};
  CHECK(eb.run(eb.ctx, plain, 2, &err) == 0 && et.run(et.ctx, under, 2, &err) == 0);
  CHECK_MSG(plain[0].answer && under[0].answer && strcmp(plain[0].answer, under[0].answer),
            "route under the adapter: %s; without: %s", under[0].answer ? under[0].answer : "(none)",
            plain[0].answer ? plain[0].answer : "(none)");
  check_route_answer(&under[0]);
  CHECK_EQ_STR(under[1].answer, plain[1].answer); /* link has no adapter */
  free_answers(plain, 2);
  free_answers(under, 2);
  hearth_adapter_unload(model, "memory-route", &err);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
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
  RUN(test_stage_adapter);
  RUN(test_bad_adapter);
  hearth_model_free(model);
  fprintf(stderr, "%d checks, %d failures\n", test_checks, test_failures);
  return test_failures ? 1 : 0;
}
