/* generate.c — `hearth generate`: one completion from a prompt (text, a chat
 * turn, or token ids), streamed to stdout. Uses only the public API (and
 * base/buf.h's byte buffer); knows nothing of samplers or models beyond
 * hearth.h. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"
#include "cli/cli.h"
#include "hearth.h"

#define GEN_MAX_STOPS 16

static volatile int g_cancel;

static void on_sigint(int sig) {
  (void)sig;
  g_cancel = 1;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: hearth generate [--model PATH] (--prompt TEXT | --ids ID,ID,...) [options]\n\n"
          "  --model PATH      model folder or .gguf file (default: the built-in model)\n"
          "  --prompt TEXT     prompt text (tokenized with the model's BOS as a raw completion; - reads stdin)\n"
          "  --ids LIST        prompt as token ids, comma or space separated\n"
          "  --chat            render --prompt as one user turn with the chat template\n"
          "  --system TEXT     with --chat: a system message first\n"
          "  --image FILE      an image in the prompt (JPEG, PNG, WebP, GIF, HEIC, AVIF; repeatable): with --chat a part of\n"
          "                    the user turn before its text; else the prompt's placeholders take the media in\n"
          "                    order (written at its start when it has none). Needs a model with a vision tower\n"
          "  --audio FILE      a sound (any format FFmpeg reads; repeatable), as --image, for an audio tower\n"
          "  --video FILE      a video (repeatable), as --image, its frames sampled at the model's rate\n"
          "  -n, --max-tokens N  tokens to generate (default 128, within the context; -1 = up to the context,\n"
          "                    or what the KV cache holds)\n"
          "%s"
          "  --threads N       CPU worker threads (default: one per CPU)\n"
          "  --stop STR        stop string (repeatable, up to %d)\n"
          "  --ignore-eos      keep generating past EOS tokens\n"
          "  --grammar GBNF    the output follows this grammar (llama.cpp's GBNF, start rule root)\n"
          "  --grammar-file F  ... read from a file\n"
          "  --json-schema S   the output is JSON valid under this JSON Schema\n"
          "  --json-schema-file F  ... read from a file\n"
          "  --adapter DIR     run under this PEFT LoRA adapter folder (repeatable: stacked, deltas summed)\n"
          "  --print-ids       print the generated token ids instead of text\n"
          "  --stats           print token counts and speed to stderr\n",
          cli_sampling_help(), GEN_MAX_STOPS);
}

typedef struct gen_out {
  bool ids;        /* print ids, not text */
  bool first;
  bool printed;    /* anything written to stdout */
} gen_out;

static int on_token(void *user, const char *text, size_t len, const hearth_token *tok) {
  gen_out *o = user;
  if (o->ids) {
    if (tok) {
      printf("%s%d", o->first ? "" : " ", (int)tok->id);
      o->first = false;
      o->printed = true;
    }
  } else if (len) {
    fwrite(text, 1, len, stdout);
    o->printed = true;
  }
  fflush(stdout);
  return 0;
}

/* JSON string literal of s (malloc'd). */
static char *json_quote(const char *s) {
  size_t n = strlen(s);
  char *out = malloc(n * 6 + 3);
  if (!out) return NULL;
  char *o = out;
  *o++ = '"';
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') {
      *o++ = '\\';
      *o++ = (char)*p;
    } else if (*p < 0x20) {
      o += sprintf(o, "\\u%04x", *p);
    } else {
      *o++ = (char)*p;
    }
  }
  *o++ = '"';
  *o = 0;
  return out;
}

int cli_generate(int argc, char **argv) {
  const char *model_dir = NULL, *prompt = NULL, *system = NULL;
  const char *stops[GEN_MAX_STOPS];
  int n_stops = 0;
  bool chat = false, print_ids = false, stats = false, n_given = false;
  hearth_gen_params params;
  hearth_gen_params_init(&params);
  params.max_tokens = 128;
  int32_t *ids = NULL;
  size_t n_ids = 0;
  const char *grammar_file = NULL, *schema_file = NULL;
  const char *adapters[4];
  int n_adapters = 0;
  hearth_media media[16];
  int n_media = 0;
  char adapter_spec[64] = "";
  for (int i = 1; i < argc; i++) {
    const char *v = NULL;
    int r;
    if (cli_is_help(argv[i])) {
      usage(stdout);
      free(ids);
      return 0;
    }
#define OPT(name) ((r = cli_opt(argc, argv, &i, name, &v)) != 0)
    if ((r = cli_opt_sampling("generate", argc, argv, &i, &params, &n_given)) ||
        (r = cli_opt_ids("generate", argc, argv, &i, "--ids", &ids, &n_ids))) {
      if (r < 0) return free(ids), 2;
    } else if (OPT("--model")) {
      if (r < 0) return free(ids), 2;
      model_dir = v;
    } else if (OPT("--prompt")) {
      if (r < 0) return free(ids), 2;
      prompt = v;
    } else if (OPT("--system")) {
      if (r < 0) return free(ids), 2;
      system = v;
    } else if (OPT("--image") || OPT("--audio") || OPT("--video")) {
      if (r < 0) return free(ids), 2;
      if (n_media == 16) return free(ids), cli_usage_error("generate", "at most 16 --image / --audio / --video");
      const char *flag = argv[i - 1];
      media[n_media++] = (hearth_media){.kind = !strcmp(flag, "--image")   ? HEARTH_MEDIA_IMAGE
                                                : !strcmp(flag, "--audio") ? HEARTH_MEDIA_AUDIO
                                                                           : HEARTH_MEDIA_VIDEO,
                                        .url = v,
                                        .name = v};
    } else if (OPT("--adapter")) {
      if (r < 0) return free(ids), 2;
      if (n_adapters == 4) return free(ids), cli_usage_error("generate", "at most 4 --adapter");
      adapters[n_adapters++] = v;
    } else if (OPT("--grammar")) {
      if (r < 0) return free(ids), 2;
      params.grammar = v;
    } else if (OPT("--grammar-file")) {
      if (r < 0) return free(ids), 2;
      grammar_file = v;
    } else if (OPT("--json-schema")) {
      if (r < 0) return free(ids), 2;
      params.json_schema = v;
    } else if (OPT("--json-schema-file")) {
      if (r < 0) return free(ids), 2;
      schema_file = v;
    } else if (OPT("--stop")) {
      if (r < 0) return free(ids), 2;
      if (n_stops == GEN_MAX_STOPS) return free(ids), cli_usage_error("generate", "at most %d stop strings", GEN_MAX_STOPS);
      if (!v[0]) return free(ids), cli_usage_error("generate", "a stop string cannot be empty");
      stops[n_stops++] = v;
    } else if (strcmp(argv[i], "--chat") == 0) {
      chat = true;
    } else if (strcmp(argv[i], "--ignore-eos") == 0) {
      params.ignore_eos = true;
    } else if (strcmp(argv[i], "--print-ids") == 0) {
      print_ids = true;
    } else if (strcmp(argv[i], "--stats") == 0) {
      stats = true;
    } else {
      free(ids);
      return cli_usage_error("generate", "unknown option '%s'", argv[i]);
    }
#undef OPT
  }
  const char *usage_err = NULL;
  if (!prompt == !ids) usage_err = "give exactly one of --prompt and --ids";
  else if (chat && !prompt) usage_err = "--chat needs --prompt";
  else if (n_media && !prompt) usage_err = "--image / --audio / --video go with --prompt";
  else if (system && !chat) usage_err = "--system needs --chat (a system message is part of a chat)";
  else if ((params.grammar || grammar_file) + (params.json_schema || schema_file) + (params.grammar && grammar_file) +
               (params.json_schema && schema_file) > 1)
    usage_err = "give one of --grammar, --grammar-file, --json-schema and --json-schema-file";
  if (usage_err) {
    free(ids);
    return cli_usage_error("generate", "%s", usage_err);
  }
  if (!model_dir) {
    model_dir = cli_default_model();
    if (!model_dir) return free(ids), cli_fail("no --model given and no built-in model found (models/default)");
  }
  params.stop = stops;
  params.n_stop = n_stops;

  int status = 1;
  hearth_error err = {0};
  char *constraint = NULL; /* a grammar or schema read from a file */
  if (grammar_file || schema_file) {
    size_t len;
    if (hfile_read(grammar_file ? grammar_file : schema_file, &constraint, &len, &err)) {
      free(ids);
      return cli_fail("%s", err.msg);
    }
    if (grammar_file) params.grammar = constraint;
    else params.json_schema = constraint;
  }
  hearth_model *m = NULL;
  char *rendered = NULL, *messages = NULL, *q_user = NULL, *q_system = NULL;
  char *stdin_text = NULL;
  if (prompt && strcmp(prompt, "-") == 0) {
    hbuf in = {0};
    char chunk[4096];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, stdin)) > 0) hbuf_append(&in, chunk, got);
    if (in.oom) {
      hbuf_free(&in);
      return free(ids), cli_fail("out of memory reading the prompt");
    }
    stdin_text = in.data ? hbuf_take(&in) : strdup("");
    if (!stdin_text) return free(ids), cli_fail("out of memory reading the prompt");
    prompt = stdin_text;
  }
  hearth_load_opts lo;
  cli_hearth_load_opts(&lo);
  lo.allow_local_media = true; /* --image FILE */
  if (hearth_model_load(model_dir, &lo, &m, &err)) {
    cli_fail("%s", err.msg);
    goto out;
  }
  for (int a = 0; a < n_adapters; a++) {
    char name[16];
    snprintf(name, sizeof name, "adapter%d", a);
    if (hearth_adapter_load(m, name, adapters[a], &err)) {
      cli_fail("%s", err.msg);
      goto out;
    }
    snprintf(adapter_spec + strlen(adapter_spec), sizeof adapter_spec - strlen(adapter_spec), "%s%s", a ? "+" : "", name);
  }
  if (n_adapters) params.adapter = adapter_spec;
  hearth_info info;
  hearth_model_info(m, &info);
  hearth_prompt hp = {0};
  if (chat) {
    q_user = json_quote(prompt);
    q_system = system ? json_quote(system) : NULL;
    size_t cap = strlen(q_user ? q_user : "") + strlen(q_system ? q_system : "") + 128 + 24 * (size_t)n_media;
    messages = malloc(cap);
    if (!q_user || (system && !q_system) || !messages) {
      cli_fail("out of memory");
      goto out;
    }
    /* with media, the user turn is parts: each medium, then the text (the template writes their placeholders) */
    hbuf user = {0};
    if (n_media) {
      static const char *const types[] = {"image", "audio", "video"};
      hbuf_puts(&user, "[");
      for (int k = 0; k < n_media; k++) hbuf_printf(&user, "{\"type\":\"%s\"},", types[media[k].kind]);
      hbuf_printf(&user, "{\"type\":\"text\",\"text\":%s}]", q_user);
    } else {
      hbuf_puts(&user, q_user);
    }
    if (user.oom) {
      hbuf_free(&user);
      cli_fail("out of memory");
      goto out;
    }
    if (q_system)
      snprintf(messages, cap, "[{\"role\":\"system\",\"content\":%s},{\"role\":\"user\",\"content\":%s}]", q_system,
               hbuf_str(&user));
    else
      snprintf(messages, cap, "[{\"role\":\"user\",\"content\":%s}]", hbuf_str(&user));
    hbuf_free(&user);
    if (hearth_chat_render(m, messages, NULL, true, NULL, &rendered, &err)) {
      cli_fail("%s", err.msg);
      goto out;
    }
    if (n_media) { /* the engine expands, tokenizes and encodes */
      hp.text = rendered;
      hp.add_special = false;
    } else if (hearth_tokenize(m, rendered, strlen(rendered), false, &ids, &n_ids, &err)) {
      cli_fail("%s", err.msg);
      goto out;
    }
  } else if (n_media) { /* a raw prompt: its placeholders, or the media's at its start */
    bool has = false;
    for (int k = 0; k < n_media; k++) {
      const char *ph = hearth_media_placeholder(m, media[k].kind);
      has = has || (ph && strstr(prompt, ph));
    }
    hbuf t = {0};
    for (int k = 0; k < n_media && !has; k++) {
      const char *ph = hearth_media_placeholder(m, media[k].kind);
      if (ph) hbuf_puts(&t, ph);
    }
    hbuf_puts(&t, prompt);
    if (t.oom || !(rendered = hbuf_take(&t))) {
      hbuf_free(&t);
      cli_fail("out of memory");
      goto out;
    }
    hp.text = rendered;
    hp.add_special = true;
  } else if (!ids && hearth_tokenize(m, prompt, strlen(prompt), true, &ids, &n_ids, &err)) {
    cli_fail("%s", err.msg);
    goto out;
  }
  if (n_media) {
    hp.media = media;
    hp.n_media = n_media;
  } else {
    hp.ids = ids;
    hp.n_ids = n_ids;
  }
  /* the default length stays inside the context */
  if (!n_given && info.context_length > (int64_t)n_ids && info.context_length - (int64_t)n_ids < params.max_tokens)
    params.max_tokens = info.context_length - (int64_t)n_ids;
  gen_out o = {.ids = print_ids || !info.has_tokenizer, .first = true};
  g_cancel = 0;
  params.cancel = &g_cancel;
  struct sigaction sa = {0}, old;
  sa.sa_handler = on_sigint;
  sigaction(SIGINT, &sa, &old);
  hearth_gen_result res;
  int rc = hearth_generate(m, &hp, &params, on_token, &o, &res, &err);
  sigaction(SIGINT, &old, NULL);
  if (o.printed) printf("\n");
  fflush(stdout);
  if (rc && rc != HEARTH_ECANCELLED) {
    cli_fail("%s", err.msg);
    goto out;
  }
  if (stats || rc == HEARTH_ECANCELLED) {
    static const char *reasons[] = {"stop", "length", "cancelled"};
    fprintf(stderr, "[%s: prompt %lld tokens (%.1f tok/s), generated %lld tokens (%.2f tok/s)]\n",
            reasons[res.finish_reason], (long long)res.prompt_tokens,
            res.prefill_seconds > 0 ? res.prompt_tokens / res.prefill_seconds : 0.0, (long long)res.completion_tokens,
            res.decode_seconds > 0 && res.completion_tokens > 1 ? (res.completion_tokens - 1) / res.decode_seconds
                                                                : 0.0);
    hearth_stats hs;
    hearth_get_stats(m, &hs);
    for (int k = 0; k < HEARTH_SPEC_SOURCES; k++)
      if (hs.spec_drafted[k] > 0)
        fprintf(stderr, "[speculative %s: %lld steps, drafted %lld, accepted %lld (%.1f%%), %lld forward steps]\n",
                hearth_spec_source_name(k), (long long)hs.spec_steps[k], (long long)hs.spec_drafted[k],
                (long long)hs.spec_accepted[k], 100.0 * (double)hs.spec_accepted[k] / (double)hs.spec_drafted[k],
                (long long)hs.steps);
  }
  status = rc == HEARTH_ECANCELLED ? 130 : 0;
out:
  hearth_model_free(m);
  free(ids);
  free(rendered);
  free(messages);
  free(q_user);
  free(q_system);
  free(stdin_text);
  free(constraint);
  return status;
}
