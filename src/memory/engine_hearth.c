/* engine_hearth.c — the pipeline's calls run on a hearth model
 * (engine_hearth.h): chat rendering, greedy decoding under a schema and a
 * stage adapter, one batch per stage or one call at a time. Uses only the
 * public API. */
#include "memory/engine_hearth.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

#define MIN_ANSWER_TOKENS 16 /* a prompt that leaves fewer in the context is not run */

int mem_hearth_init(mem_hearth *h, hearth_model *model, const char *model_path, const char *const adapters[MEM_STAGES],
                    herr *err) {
  memset(h, 0, sizeof *h);
  h->model = model;
  hearth_info info;
  hearth_model_info(model, &info);
  h->context = info.context_length;
  size_t used = (size_t)snprintf(h->id, sizeof h->id, "%s", model_path);
  for (int s = 0; s < MEM_STAGES; s++) {
    if (!adapters || !adapters[s]) continue;
    char name[64];
    snprintf(name, sizeof name, "memory-%s", mem_stage_name(s));
    if (hearth_adapter_load(model, name, adapters[s], err)) return herr_wrap(err, "--stage-adapter %s", mem_stage_name(s));
    h->adapter[s] = true;
    if (used < sizeof h->id) used += (size_t)snprintf(h->id + used, sizeof h->id - used, " %s=%s", name, adapters[s]);
  }
  return 0;
}

/* The prompt's ids: the text as a user turn through the chat template (raw with BOS when the model has none). */
static int prompt_ids(mem_hearth *h, const char *text, int32_t **ids, size_t *n, herr *err) {
  json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", text);
  char *js = msgs ? json_dumps(msgs, JSON_COMPACT) : NULL, *rendered = NULL;
  json_decref(msgs);
  if (!js) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  int rc = hearth_chat_render(h->model, js, NULL, true, NULL, &rendered, err);
  free(js);
  if (rc == HEARTH_ENOTFOUND) return hearth_tokenize(h->model, text, strlen(text), true, ids, n, err);
  if (!rc) rc = hearth_tokenize(h->model, rendered, strlen(rendered), false, ids, n, err);
  hearth_free(rendered);
  return rc;
}

/* Item i's prompt and parameters; false when it cannot run (its answer stays NULL). */
static bool prepare(mem_hearth *h, const mem_call *c, hearth_batch_item *it, hearth_gen_params *p, int32_t **ids) {
  herr e = {0};
  size_t n = 0;
  if (prompt_ids(h, c->prompt, ids, &n, &e)) {
    HLOG_WARN("memory: %s: %s", mem_stage_name(c->stage), e.msg);
    return false;
  }
  int64_t room = h->context - (int64_t)n;
  if (room < MIN_ANSWER_TOKENS) {
    HLOG_WARN("memory: %s: a prompt of %zu tokens leaves no room in a context of %lld", mem_stage_name(c->stage), n,
              (long long)h->context);
    return false;
  }
  hearth_gen_params_init(p);
  p->temperature = 0;
  p->max_tokens = c->max_tokens < room ? c->max_tokens : room;
  p->json_schema = c->schema;
  it->prompt = (hearth_prompt){.ids = *ids, .n_ids = n};
  it->params = p;
  return true;
}

static void take_answer(const mem_call *c, hearth_batch_item *it, char **answer) {
  if (it->status == 0 && it->result.finish_reason != HEARTH_FINISH_CANCELLED) {
    *answer = it->text;
    it->text = NULL;
  } else if (it->status) {
    HLOG_WARN("memory: %s: %s", mem_stage_name(c->stage), it->error.msg);
  }
}

static int run_calls(void *ctx, mem_call *calls, size_t n, herr *err) {
  mem_hearth *h = ctx;
  hearth_batch_item *items = calloc(n ? n : 1, sizeof *items);
  hearth_gen_params *params = calloc(n ? n : 1, sizeof *params);
  int32_t **ids = calloc(n ? n : 1, sizeof *ids);
  size_t *which = calloc(n ? n : 1, sizeof *which), m = 0; /* items[k] is calls[which[k]] */
  char names[MEM_STAGES][64];
  int rc = items && params && ids && which ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (int s = 0; s < MEM_STAGES; s++) snprintf(names[s], sizeof names[s], "memory-%s", mem_stage_name(s));
  bool uniform = true;
  for (size_t i = 0; !rc && i < n; i++) {
    if (!prepare(h, &calls[i], &items[m], &params[m], &ids[i])) continue;
    if (h->adapter[calls[i].stage]) params[m].adapter = names[calls[i].stage];
    uniform = uniform && (!m || (calls[which[0]].stage == calls[i].stage && params[0].max_tokens == params[m].max_tokens));
    which[m++] = i;
  }
  if (!rc && uniform) {
    rc = hearth_generate_batch(h->model, items, m, 0, err);
    h->batches += m > 0;
  } else {
    for (size_t k = 0; !rc && k < m; k++) rc = hearth_generate_batch(h->model, &items[k], 1, 1, err);
    h->singles += (int)m;
  }
  for (size_t k = 0; !rc && k < m; k++) take_answer(&calls[which[k]], &items[k], &calls[which[k]].answer);
  if (items) hearth_batch_free(items, m);
  for (size_t i = 0; ids && i < n; i++) hearth_free(ids[i]);
  free(items);
  free(params);
  free(ids);
  free(which);
  return rc;
}

mem_engine mem_hearth_engine(mem_hearth *h) { return (mem_engine){.run = run_calls, .ctx = h, .id = h->id}; }
