/* sched_alone.h — the reference the scheduler tests compare with: one
 * request decoded plainly (no drafts) and alone, through a scheduler of its
 * own that runs one sequence at a time, with the default prefill chunk. */
#ifndef HEARTH_TESTS_SCHED_ALONE_H
#define HEARTH_TESTS_SCHED_ALONE_H

#include "engine/sched.h"

static inline int sched_run_alone(model *m, const gen_request *req, gen_token_fn fn, void *user, gen_result *res,
                                  herr *err) {
  gen_request r = *req;
  r.spec_tokens = 0; /* plain decoding */
  r.spec_method = NULL;
  sched_config cfg = {.max_batch = 1};
  sched *s = NULL;
  int rc = sched_new(m, NULL, &cfg, &s, err);
  if (rc) return rc;
  rc = sched_run(s, &r, fn, user, res, err);
  sched_free(s);
  return rc;
}

#endif
