/* stage_extract.c — the extract stage: each segment → the entities it tells
 * of (a person, a project, a place, ...) with the facts it gives about each.
 * Entities without a name or facts are left out; a segment whose answer is
 * unusable gives none. */
#include <stdlib.h>
#include <string.h>

#include "memory/stages.h"

/* The answer's usable entities appended to out, each citing source. */
static void add_entities(const json_t *answer, const char *source, json_t *out) {
  const json_t *ents = json_object_get(answer, "entities");
  for (size_t i = 0; i < json_array_size(ents); i++) {
    const json_t *e = json_array_get(ents, i);
    char *name = mem_answer_str(e, "name"), *kind = mem_answer_str(e, "kind");
    json_t *facts = json_array();
    const json_t *fa = json_object_get(e, "facts");
    for (size_t k = 0; k < json_array_size(fa); k++) {
      char *f = mem_trimmed(json_string_value(json_array_get(fa, k)));
      if (f) json_array_append_new(facts, json_string(f));
      free(f);
    }
    if (name && json_array_size(facts))
      json_array_append_new(out, json_pack("{s:s, s:s, s:O, s:s}", "name", name, "kind", kind ? kind : "thing",
                                           "facts", facts, "source", source));
    json_decref(facts);
    free(name);
    free(kind);
  }
}

int mem_stage_extract(mem_run *r, const json_t *in, json_t **out, herr *err) {
  const json_t *segs = json_object_get(in, "segments");
  size_t n = json_array_size(segs);
  mem_ask *asks = calloc(n ? n : 1, sizeof *asks);
  json_t **answers = calloc(n ? n : 1, sizeof *answers);
  int rc = asks && answers ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (size_t i = 0; !rc && i < n; i++) {
    const json_t *s = json_array_get(segs, i);
    asks[i] = (mem_ask){.tmpl = MEM_T_EXTRACT,
                        .keys = {"source", "title", "segment"},
                        .values = {json_string_value(json_object_get(s, "id")),
                                   json_string_value(json_object_get(s, "title")),
                                   json_string_value(json_object_get(s, "text"))},
                        .n = 3};
  }
  if (!rc) rc = mem_stage_ask(r, MEM_EXTRACT, asks, n, answers, err);
  json_t *ents = json_array();
  for (size_t i = 0; !rc && i < n; i++)
    add_entities(answers[i], json_string_value(json_object_get(json_array_get(segs, i), "id")), ents);
  if (!rc) *out = json_pack("{s:o}", "entities", ents);
  else json_decref(ents);
  for (size_t i = 0; answers && i < n; i++) json_decref(answers[i]);
  free(asks);
  free(answers);
  return rc;
}
