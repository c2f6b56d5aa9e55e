/* test_prompt_logprobs.c — hearth_prompt_logprobs on the built-in model: each
 * prompt token's log-probability and alternatives equal what hearth_signal
 * reports for the prompt cut before that token (a separate path: one logits
 * row per call, through the prefix cache), also after the same prompt's
 * blocks were cached by a generation; the first token has none. */
#include <math.h>
#include <stdint.h>

#include "hearth.h"
#include "test.h"

#define DEFAULT_MODEL HEARTH_SOURCE_DIR "/models/default"

static void test_against_signal(void) {
  hearth_model *m = NULL;
  hearth_error err = {0};
  int rc = hearth_model_load(DEFAULT_MODEL, NULL, &m, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (rc) return;
  const char *text = "And God said, Let there be light: and there was light. And God saw the light, that it was good: "
                     "and God divided the light from the darkness.";
  int32_t *ids = NULL;
  size_t n = 0;
  CHECK_EQ_INT(hearth_tokenize(m, text, strlen(text), true, &ids, &n, &err), 0);
  CHECK(n > 32);
  /* a generation first, so the prompt's blocks are in the prefix cache */
  hearth_gen_params gp;
  hearth_gen_params_init(&gp);
  gp.max_tokens = 4;
  gp.temperature = 0;
  hearth_prompt hp = {.ids = ids, .n_ids = n};
  CHECK_EQ_INT(hearth_generate(m, &hp, &gp, NULL, NULL, NULL, &err), 0);
  hearth_prompt_logprob *lp = calloc(n, sizeof *lp);
  CHECK_EQ_INT(hearth_prompt_logprobs(m, ids, n, 3, NULL, lp, &err), 0);
  CHECK(isnan(lp[0].logprob));
  CHECK_EQ_INT(lp[0].n_top, 0);
  int checked = 0;
  for (size_t i = 1; i < n; i++) {
    CHECK_EQ_INT(lp[i].id, ids[i]);
    hearth_signal_result sig;
    hearth_prompt pre = {.ids = ids, .n_ids = i};
    CHECK_EQ_INT(hearth_signal(m, &pre, 10, 3, NULL, &sig, &err), 0);
    CHECK_EQ_INT(lp[i].n_top, 3);
    for (int k = 0; k < 3 && k < sig.n_top; k++) {
      CHECK_EQ_INT(lp[i].top_ids[k], sig.top_ids[k]);
      CHECK_NEAR(lp[i].top_logprobs[k], sig.top_logprobs[k], 1e-4);
      if (sig.top_ids[k] == ids[i]) CHECK_NEAR(lp[i].logprob, sig.top_logprobs[k], 1e-4);
    }
    CHECK(lp[i].logprob <= lp[i].top_logprobs[0] + 1e-6);
    CHECK(lp[i].logprob < 0 && isfinite(lp[i].logprob));
    checked++;
  }
  CHECK_EQ_INT(checked, (long long)n - 1);
  /* bad arguments */
  CHECK_EQ_INT(hearth_prompt_logprobs(m, ids, n, 21, NULL, lp, &err), HEARTH_EINVAL);
  CHECK_EQ_INT(hearth_prompt_logprobs(m, ids, 0, 1, NULL, lp, &err), HEARTH_EINVAL);
  int32_t bad[2] = {1, 1 << 30};
  CHECK(hearth_prompt_logprobs(m, bad, 2, 1, NULL, lp, &err) != 0);
  free(lp);
  hearth_free(ids);
  hearth_model_free(m);
}

int main(void) {
  RUN(test_against_signal);
  TEST_MAIN_END();
}
