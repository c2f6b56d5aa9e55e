/* bench_template.c — times chat-template rendering: a 10-turn chat through
 * the Llama-3.1 and Qwen3 templates, parsed once and rendered many times,
 * plus parse + render together. Prints one JSON line per template. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "chat/chat.h"
#include "chat/jinja.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static json_t *ten_turns(void) {
  json_t *m = json_array();
  json_array_append_new(m, json_pack("{s:s,s:s}", "role", "system", "content", "You are a helpful assistant."));
  for (int i = 0; i < 10; i++) {
    char q[128], a[256];
    snprintf(q, sizeof q, "Question %d: what is %d squared, and why does it matter?", i, i);
    snprintf(a, sizeof a, "%d squared is %d. It matters because squares show up in areas, variances and many formulas.", i, i * i);
    json_array_append_new(m, json_pack("{s:s,s:s}", "role", "user", "content", q));
    json_array_append_new(m, json_pack("{s:s,s:s}", "role", "assistant", "content", a));
  }
  json_array_append_new(m, json_pack("{s:s,s:s}", "role", "user", "content", "Thanks! One more?"));
  return m;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s NAME=TEMPLATE_PATH... (a .jinja file or tokenizer_config.json) ITERATIONS\n", argv[0]);
    return 2;
  }
  int iters = atoi(argv[argc - 1]);
  json_t *msgs = ten_turns();
  for (int a = 1; a < argc - 1; a++) {
    char *eq = strchr(argv[a], '=');
    if (!eq) continue;
    *eq = 0;
    chat_template tpl;
    herr err = {0};
    if (chat_template_load(eq + 1, &tpl, &err)) {
      fprintf(stderr, "%s\n", err.msg);
      return 1;
    }
    json_t *ctx = chat_context(msgs, NULL, true, NULL, tpl.bos, tpl.eos);
    jinja_limits lim = {.fixed_now = 1721989800};
    jinja_template *t;
    if (jinja_parse(tpl.source, strlen(tpl.source), argv[a], &t, &err)) {
      fprintf(stderr, "%s\n", err.msg);
      return 1;
    }
    hbuf out = {0};
    size_t bytes = 0;
    double t0 = now_s();
    for (int i = 0; i < iters; i++) {
      hbuf_clear(&out);
      if (jinja_render(t, ctx, &lim, &out, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
      }
      bytes = out.len;
    }
    double render_us = (now_s() - t0) / iters * 1e6;
    t0 = now_s();
    for (int i = 0; i < iters; i++) {
      jinja_template *t2;
      jinja_parse(tpl.source, strlen(tpl.source), argv[a], &t2, &err);
      hbuf_clear(&out);
      jinja_render(t2, ctx, &lim, &out, &err);
      jinja_free(t2);
    }
    double both_us = (now_s() - t0) / iters * 1e6;
    printf("{\"template\": \"%s\", \"impl\": \"hearth\", \"render_us\": %.2f, \"parse_render_us\": %.2f, \"output_bytes\": %zu}\n",
           argv[a], render_us, both_us, bytes);
    hbuf_free(&out);
    jinja_free(t);
    json_decref(ctx);
    chat_template_free(&tpl);
  }
  json_decref(msgs);
  return 0;
}
