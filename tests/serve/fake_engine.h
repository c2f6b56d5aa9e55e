/* fake_engine.h — a deterministic stand-in for a model behind serve_engine,
 * for the server's tests: it "generates" a fixed text in 3-byte tokens
 * (greedy) or seeded random words (temperature > 0), holds back stop strings
 * the way the engine does, and counts cancellations. A prompt containing
 * "[slow]" generates 5000 tokens 10 ms apart (for disconnect tests); one
 * containing "[fail]" fails with a server error, "[pause]" waits before
 * the first token until the server has sent a keep-alive comment (when
 * fake_server is set; at most 10 s) or 300 ms. For the chat page's tests, the last user message
 * (not earlier turns) may ask for a fixed Markdown reply ("[markdown]") or a
 * reply full of HTML ("[html]") or GitHub-flavoured Markdown with math ("[gfm]"), paced 10 ms a token by "[slow]", or for
 * one that runs until the context is full ("[long]", 4-byte tokens, so the
 * prompt's count of it matches). fake_context (FAKE_CONTEXT unless set before
 * fake_engine_init) is the context length. Test code only. */
#ifndef HEARTH_TESTS_FAKE_ENGINE_H
#define HEARTH_TESTS_FAKE_ENGINE_H

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/buf.h"
#include "serve/engine.h"
#include "serve/server.h"

#define FAKE_CONTEXT 512
#define FAKE_EOS_AFTER 40
static int64_t fake_context = FAKE_CONTEXT;
static const char fake_greedy_text[] =
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly quick daft "
    "zebras jump! Sphinx of black quartz, judge my vow.";

static const char fake_markdown_text[] =
    "Here is **bold**, *italic* and `inline code`.\n\n"
    "- first item\n- second item\n\n"
    "1. one\n2. two\n\n"
    "```c\nint main(void) { return 0; }\n```\n\n"
    "See [the docs](https://example.com/docs) and [not a link](javascript:alert(1)).";
static const char fake_gfm_text[] =
    "| name | value |\n|---|---:|\n| alpha | 1 |\n| beta | 2 |\n\n"
    "- outer\n  - inner one\n  - inner two\n- [x] done\n- [ ] todo\n\n"
    "Euler: $e^{i\\pi}+1=0$ and ~~old~~.\n\n$$\\int_0^1 x\\,dx = \\frac{1}{2}$$\n";
static const char fake_html_text[] =
    "Careful: <img src=x onerror=\"window.__pwned=1\"> and <b id=\"injected\">not bold</b> "
    "<script>window.__pwned=2</script> [x](javascript:window.__pwned=3) end.";

/* Replies in the Hermes / Qwen tool-call syntax and with a <think> block
 * (the fake model's template is treated as Hermes with reasoning). */
static const char fake_toolcall_text[] =
    "<think>The user wants the weather.</think>Let me check.\n<tool_call>\n{\"name\": \"get_weather\", "
    "\"arguments\": {\"city\": \"Paris \\\"Ville\\\"\", \"days\": 3}}\n</tool_call>";
static const char fake_twocalls_text[] =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\", \"list\": [1, 2]}}\n</tool_call>";
/* [memsearch]: a call of the server's memory_search tool (fake_server --memory-tool 1), then, once its
 * result follows the user's turn, an answer. */
static const char fake_memsearch_text[] =
    "Let me look.\n<tool_call>\n{\"name\": \"memory_search\", \"arguments\": {\"query\": \"sheep\"}}\n</tool_call>";
static const char fake_memanswer_text[] = "The sheep graze in the north field.";
/* Continuations of a forced call's opening (tool_choice named / required). */
static const char fake_args_text[] = "{\"zone\": \"UTC\"}}\n</tool_call>";
static const char fake_anyargs_text[] = "get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
static const char fake_think_text[] = "<think>\nFirst, 2 + 2.\nThat is 4.\n</think>\n\nThe answer is 4.";

static atomic_int fake_cancelled;  /* generations ended by cancellation */
static atomic_int fake_generations; /* generations started */
static atomic_int fake_running;     /* generations in progress */
static atomic_int fake_low_priority; /* generations started with sampling.priority > 0 (batch rows) */
static serve_server *fake_server;   /* the server over this engine, when the test sets it ("[pause]") */

static int fake_render(void *impl, const serve_message *m, int n, const serve_chat_opts *o, char **prompt,
                       herr *err) {
  (void)impl;
  hbuf b = {0};
  if (o && o->tools) { /* the tools' names, as a template would list them */
    hbuf_puts(&b, "<|tools|>");
    size_t i;
    json_t *t;
    json_array_foreach(o->tools, i, t) hbuf_printf(&b, " %s", json_string_value(json_object_get(json_object_get(t, "function"), "name")));
    hbuf_puts(&b, "\n");
  }
  for (int i = 0; i < n; i++) {
    hbuf_printf(&b, "<|%s|>%s", m[i].role, m[i].content);
    if (m[i].extra) { /* tool calls, tool_call_id: shown as JSON */
      char *x = json_dumps(m[i].extra, JSON_COMPACT | JSON_SORT_KEYS);
      if (x) hbuf_printf(&b, " %s", x);
      free(x);
    }
    if (!(o && o->continue_final && i == n - 1)) hbuf_puts(&b, "\n");
  }
  if (!(o && (o->no_generation_prompt || o->continue_final))) hbuf_puts(&b, "<|assistant|>");
  if (o && o->continue_final && n > 0 && !m[n - 1].content[strspn(m[n - 1].content, " \t\n")]) {
    hbuf_free(&b);
    return herr_set(err, HEARTH_EINVAL, "continue_final_message: the final message has no text to continue");
  }
  if (o && o->kwargs && json_is_false(json_object_get(o->kwargs, "enable_thinking"))) hbuf_puts(&b, "<think>\n\n</think>\n\n");
  if (strstr(hbuf_str(&b), "[badtemplate]")) {
    hbuf_free(&b);
    return herr_set(err, HEARTH_EINVAL, "template: raise_exception('no such role')");
  }
  *prompt = hbuf_take(&b);
  return *prompt ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
}

static int fake_count(void *impl, const char *prompt, bool raw, int64_t *n, herr *err) {
  *n = (int64_t)((strlen(prompt) + 3) / 4) + (raw ? 1 : 0);
  return 0;
}

/* Tokens: each byte is id byte + 4; add_special puts BOS (id 1, "<s>") first. */
static int fake_tokenize(void *impl, const char *text, bool add_special, int32_t **ids, size_t *n, herr *err) {
  (void)impl;
  size_t len = strlen(text);
  *ids = malloc(sizeof(int32_t) * (len + 1));
  if (!*ids) return herr_set(err, HEARTH_ENOMEM, "out of memory");
  *n = 0;
  if (add_special) (*ids)[(*n)++] = 1;
  for (size_t i = 0; i < len; i++) (*ids)[(*n)++] = (int32_t)(unsigned char)text[i] + 4;
  return 0;
}

static int fake_detokenize(void *impl, const int32_t *ids, size_t n, char **text, size_t *len, herr *err) {
  (void)impl;
  hbuf b = {0};
  for (size_t i = 0; i < n; i++) {
    if (ids[i] == 1) hbuf_puts(&b, "<s>");
    else if (ids[i] >= 4 && ids[i] < 260) hbuf_putc(&b, (char)(ids[i] - 4));
    else hbuf_printf(&b, "<%d>", (int)ids[i]);
  }
  *len = b.len;
  *text = hbuf_take(&b);
  if (!*text) *text = strdup("");
  return *text ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
}

static uint64_t fake_rng(uint64_t *s) {
  uint64_t x = (*s += 0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* Longest suffix of s[0..n) that is a proper prefix of some stop string. */
static size_t fake_holdback(const char *s, size_t n, const serve_sampling *sp) {
  size_t best = 0;
  for (int k = 0; k < sp->n_stop; k++) {
    size_t L = strlen(sp->stop[k]);
    for (size_t h = L - 1; h > best; h--)
      if (h <= n && memcmp(s + n - h, sp->stop[k], h) == 0) {
        best = h;
        break;
      }
  }
  return best;
}

static int fake_generate_run(const char *prompt, bool raw, const serve_sampling *sp, serve_token_fn fn, void *ctx,
                             volatile int *cancel, serve_result *res, herr *err);

/* The last user message of a rendered chat (all of a raw prompt). */
static const char *fake_last_turn(const char *prompt) {
  const char *last = prompt;
  for (const char *p = prompt; (p = strstr(p, "<|user|>")) != NULL; p++) last = p;
  return last;
}

static int fake_generate(void *impl, const char *prompt, bool raw, const serve_sampling *sp, serve_token_fn fn,
                         void *ctx, volatile int *cancel, serve_result *res, herr *err) {
  atomic_fetch_add(&fake_generations, 1);
  if (sp->priority > 0) atomic_fetch_add(&fake_low_priority, 1);
  atomic_fetch_add(&fake_running, 1);
  int rc = fake_generate_run(prompt, raw, sp, fn, ctx, cancel, res, err);
  atomic_fetch_sub(&fake_running, 1);
  return rc;
}

static int fake_generate_run(const char *prompt, bool raw, const serve_sampling *sp, serve_token_fn fn, void *ctx,
                             volatile int *cancel, serve_result *res, herr *err) {
  void *impl = NULL;
  memset(res, 0, sizeof *res);
  res->stop_index = -1;
  fake_count(impl, prompt, raw, &res->prompt_tokens, err);
  if (strstr(prompt, "[fail]")) return herr_set(err, HEARTH_EINTERNAL, "the fake model failed on purpose");
  bool slow = strstr(prompt, "[slow]") != NULL;
  if (strstr(prompt, "[pause]")) { /* a long "prefill": long enough for a keep-alive comment */
    if (fake_server) {
      uint64_t before = serve_keepalives_sent(fake_server);
      for (int i = 0; i < 1000 && serve_keepalives_sent(fake_server) == before; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
      }
    } else {
      struct timespec ts = {0, 300 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  const char *turn = fake_last_turn(prompt);
  const char *script = strstr(turn, "[markdown]") ? fake_markdown_text
                       : strstr(turn, "[html]")   ? fake_html_text
                       : strstr(turn, "[gfm]")    ? fake_gfm_text
                       : strstr(turn, "[twocalls]") ? fake_twocalls_text
                       : strstr(turn, "[toolcall]") ? fake_toolcall_text
                       : strstr(turn, "[think]")  ? fake_think_text
                       : strstr(turn, "[anyargs]") ? fake_anyargs_text
                       : strstr(turn, "[args]")   ? fake_args_text
                       : strstr(turn, "[memsearch]") ? (strstr(turn, "<|tool|>") ? fake_memanswer_text : fake_memsearch_text)
                                                  : NULL;
  size_t script_len = script ? strlen(script) : 0;
  bool fill = strstr(turn, "[long]") != NULL; /* 4-byte tokens until the context is full */
  int64_t limit = script ? (int64_t)(script_len + 2) / 3 : slow ? 5000 : fill ? INT64_MAX : FAKE_EOS_AFTER;
  int64_t max = sp->max_tokens > 0 ? sp->max_tokens : fake_context - res->prompt_tokens;
  double temp = isnan(sp->temperature) ? 0.0 : sp->temperature;
  /* unseeded: a fresh seed per request (time alone repeats within a second, and a new thread's
   * stack, so &state, is often the last one's) */
  static _Atomic uint64_t fake_requests;
  uint64_t state = sp->has_seed ? sp->seed
                                : ((uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)&state) + ++fake_requests * 0x9E3779B97F4A7C15ull;
  static const char *words[] = {" alpha", " beta", " gamma", " delta", " eps", " zeta", " eta", " theta", " iota",
                                " kappa", " lambda", " mu"};
  hbuf text = {0};
  size_t emitted = 0, gpos = 0;
  bool stopped = false;
  res->finish = SERVE_FINISH_LENGTH;
  serve_top_logprob top[2] = {{"x", 1, -1.5f}, {"y", 1, -2.5f}};
  for (int64_t step = 0;; step++) {
    if (step >= max) break;
    if (step >= limit) {
      res->finish = SERVE_FINISH_STOP; /* "EOS" */
      break;
    }
    if (__atomic_load_n(cancel, __ATOMIC_SEQ_CST)) {
      res->finish = SERVE_FINISH_CANCELLED;
      break;
    }
    char piece[16];
    size_t plen;
    if (script) {
      plen = script_len - gpos < 3 ? script_len - gpos : 3;
      memcpy(piece, script + gpos, plen);
      gpos += plen;
    } else if (temp > 0 && !fill) {
      const char *w = words[fake_rng(&state) % (sizeof words / sizeof words[0])];
      plen = strlen(w);
      memcpy(piece, w, plen);
    } else {
      size_t L = sizeof fake_greedy_text - 1;
      plen = fill ? 4 : 3;
      for (size_t i = 0; i < plen; i++) piece[i] = fake_greedy_text[(gpos + i) % L];
      gpos += plen;
    }
    hbuf_append(&text, piece, plen);
    res->completion_tokens++;
    /* Stop strings: end at the first match; hold back a possible start of one. */
    size_t release = text.len;
    for (int k = 0; k < sp->n_stop; k++) {
      const char *hit = memmem(text.data, text.len, sp->stop[k], strlen(sp->stop[k]));
      if (hit && (size_t)(hit - text.data) < release) {
        release = (size_t)(hit - text.data);
        stopped = true;
        res->stop_index = k;
      }
    }
    if (!stopped) release = text.len - fake_holdback(text.data, text.len, sp);
    if (release < emitted) release = emitted;
    serve_token t = {.text = text.data + emitted, .len = release - emitted, .id = (int32_t)step,
                     .token_text = piece, .token_len = plen, .logprob = -0.5f, .top = top,
                     .ntop = sp->top_logprobs < 2 ? sp->top_logprobs : 2};
    emitted = release;
    if (fn(ctx, &t)) {
      res->finish = SERVE_FINISH_CANCELLED;
      break;
    }
    if (stopped) {
      res->finish = SERVE_FINISH_STOP;
      break;
    }
    if (slow) {
      struct timespec ts = {0, 10 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  if (res->finish != SERVE_FINISH_CANCELLED && !stopped && emitted < text.len) {
    serve_token t = {.flush = true, .text = text.data + emitted, .len = text.len - emitted, .id = -1};
    fn(ctx, &t);
  }
  hbuf_free(&text);
  if (res->finish == SERVE_FINISH_CANCELLED) {
    atomic_fetch_add(&fake_cancelled, 1);
    fprintf(stderr, "fake: generation cancelled after %lld tokens\n", (long long)res->completion_tokens);
    return herr_set(err, HEARTH_ECANCELLED, "cancelled");
  }
  return 0;
}

/* Fill-in-the-middle (fake_engine_fim): the prompt as ids [260] prefix middle [261] suffix [262],
 * after ([263] filename "\n" text) for each chunk of context, bytes as fake_tokenize's. */
static void fake_put_bytes(hbuf *b, const char *s) {
  for (; s && *s; s++) {
    int32_t id = (int32_t)(unsigned char)*s + 4;
    hbuf_append(b, &id, sizeof id);
  }
}

static void fake_put_id(hbuf *b, int32_t id) { hbuf_append(b, &id, sizeof id); }

static int fake_fim_prompt(void *impl, const char *prefix, const char *suffix, const char *prompt,
                           const hearth_fim_chunk *extra, int n_extra, int64_t n_predict, int32_t **ids, size_t *n,
                           herr *err) {
  (void)impl, (void)n_predict;
  hbuf b = {0};
  for (int i = 0; i < n_extra; i++) {
    fake_put_id(&b, 263);
    fake_put_bytes(&b, extra[i].filename ? extra[i].filename : "tmp");
    fake_put_bytes(&b, "\n");
    fake_put_bytes(&b, extra[i].text);
  }
  fake_put_id(&b, 260);
  fake_put_bytes(&b, prefix);
  fake_put_bytes(&b, prompt);
  fake_put_id(&b, 261);
  fake_put_bytes(&b, suffix);
  fake_put_id(&b, 262);
  *n = b.len / sizeof(int32_t);
  *ids = (int32_t *)hbuf_take(&b);
  return *ids ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
}

/* Token-id prompts (fake_engine_fim): decoded and generated from as a raw prompt of that many tokens. */
static int fake_generate_ids(void *impl, const int32_t *ids, size_t n_ids, const serve_sampling *s, serve_token_fn fn,
                             void *ctx, volatile int *cancel, serve_result *res, herr *err) {
  char *text = NULL;
  size_t len = 0;
  if (fake_detokenize(impl, ids, n_ids, &text, &len, err)) return err->code;
  int rc = fake_generate(impl, text, true, s, fn, ctx, cancel, res, err);
  free(text);
  res->prompt_tokens = (int64_t)n_ids;
  return rc;
}

static void fake_engine_init(serve_engine *e) {
  memset(e, 0, sizeof *e);
  e->model_id = "fake-model";
  e->context_length = fake_context;
  e->vocab_size = 1000;
  e->created = 1700000000;
  e->render_chat = fake_render;
  e->tool_format = 1; /* TC_HERMES */
  e->reasoning = true;
  e->count_tokens = fake_count;
  e->tokenize = fake_tokenize;
  e->detokenize = fake_detokenize;
  e->generate = fake_generate;
}

/* The fake with fill-in-the-middle tokens (and so token-id prompts). */
static inline void fake_engine_fim(serve_engine *e) {
  e->fim_prompt = fake_fim_prompt;
  e->generate_ids = fake_generate_ids;
}

#endif
