/* chat.c — `hearth chat`: an interactive conversation on the terminal. Keeps
 * the messages, renders the whole conversation with the model's chat template
 * each turn and streams the reply. Ctrl-C stops a reply, not the session.
 * Uses only the public API (and jansson to build the messages). */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/buf.h"
#include "cli/cli.h"
#include "hearth.h"

static volatile int g_cancel;

static void on_sigint(int sig) {
  (void)sig;
  g_cancel = 1;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: hearth chat [--model DIR] [options]\n\n"
          "  --model DIR       model folder (default: the built-in model)\n"
          "  --system TEXT     a system message\n"
          "  -n, --max-tokens N  most tokens per reply (default: up to the context)\n"
          "  --temp T  --top-p P  --top-k K  --min-p P  --seed S\n\n"
          "In the session: /reset forgets the conversation, /quit (or end of input) leaves.\n");
}

typedef struct reply {
  hbuf text;  /* owned: the reply so far */
} reply;

static int on_token(void *user, const char *text, size_t len, const hearth_token *tok) {
  (void)tok;
  reply *r = user;
  if (len) {
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    hbuf_append(&r->text, text, len);
  }
  return 0;
}

static bool parse_num(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end || errno) return false;
  *out = v;
  return true;
}

static json_t *message(const char *role, const char *content) {
  return json_pack("{s:s, s:s}", "role", role, "content", content);
}

/* Starts the conversation over: empty, or just the system message. */
static int reset(json_t *msgs, const char *system) {
  json_array_clear(msgs);
  if (system) return json_array_append_new(msgs, message("system", system));
  return 0;
}

int cli_chat(int argc, char **argv) {
  const char *model_dir = NULL, *system = NULL;
  hearth_gen_params params;
  hearth_gen_params_init(&params);
  for (int i = 1; i < argc; i++) {
    const char *v = NULL;
    int r;
    double d;
    if (cli_is_help(argv[i])) {
      usage(stdout);
      return 0;
    }
#define OPT(name) ((r = cli_opt(argc, argv, &i, name, &v)) != 0)
    if (OPT("--model")) {
      if (r < 0) return 2;
      model_dir = v;
    } else if (OPT("--system")) {
      if (r < 0) return 2;
      system = v;
    } else if (OPT("-n") || OPT("--max-tokens")) {
      if (r < 0) return 2;
      if (!parse_num(v, &d) || d < -1 || d != (int64_t)d) return cli_usage_error("chat", "bad token count '%s'", v);
      params.max_tokens = (int64_t)d;
    } else if (OPT("--temp") || OPT("--temperature")) {
      if (r < 0) return 2;
      if (!parse_num(v, &d)) return cli_usage_error("chat", "bad temperature '%s'", v);
      params.temperature = d;
    } else if (OPT("--top-p")) {
      if (r < 0) return 2;
      if (!parse_num(v, &d)) return cli_usage_error("chat", "bad top-p '%s'", v);
      params.top_p = d;
    } else if (OPT("--top-k")) {
      if (r < 0) return 2;
      if (!parse_num(v, &d) || d < 0) return cli_usage_error("chat", "bad top-k '%s'", v);
      params.top_k = (int64_t)d;
    } else if (OPT("--min-p")) {
      if (r < 0) return 2;
      if (!parse_num(v, &d)) return cli_usage_error("chat", "bad min-p '%s'", v);
      params.min_p = d;
    } else if (OPT("--seed")) {
      if (r < 0) return 2;
      if (!parse_num(v, &d)) return cli_usage_error("chat", "bad seed '%s'", v);
      params.has_seed = true;
      params.seed = (uint64_t)(int64_t)d;
    } else {
      return cli_usage_error("chat", "unknown option '%s'", argv[i]);
    }
#undef OPT
  }
  if (!model_dir) {
    model_dir = cli_default_model();
    if (!model_dir) return cli_fail("no --model given and no built-in model found (models/default)");
  }
  hearth_error err = {0};
  hearth_model *m = NULL;
  const cli_load *cl = cli_load_opts();
  hearth_load_opts lo = {.device = cl->device, .gpu_memory_fraction = cl->gpu_memory_fraction, .cpu_level = cl->cpu_level,
                         .mmap = cl->mmap, .f32_activations = cl->f32_activations, .f32_as_bf16 = cl->f32_as_bf16};
  if (hearth_model_load(model_dir, &lo, &m, &err)) return cli_fail("%s", err.msg);
  hearth_info info;
  hearth_model_info(m, &info);
  if (!info.has_chat_template) {
    hearth_model_free(m);
    return cli_fail("%s: the model has no chat template; use hearth generate", model_dir);
  }
  bool tty = isatty(0) && isatty(1);
  if (tty) fprintf(stderr, "hearth chat — %s (/reset, /quit)\n", info.id);
  json_t *msgs = json_array();
  reset(msgs, system);
  char *line = NULL;
  size_t line_cap = 0;
  int status = 0;
  struct sigaction sa = {0}, old;
  sa.sa_handler = on_sigint;
  sigaction(SIGINT, &sa, &old);
  for (;;) {
    if (tty) {
      printf("> ");
      fflush(stdout);
    }
    g_cancel = 0;
    ssize_t n = getline(&line, &line_cap, stdin);
    if (n < 0) {
      if (errno == EINTR && g_cancel) {
        clearerr(stdin);
        printf("\n");
        continue;
      }
      break;
    }
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
    if (n == 0) continue;
    if (strcmp(line, "/quit") == 0 || strcmp(line, "/exit") == 0 || strcmp(line, "/bye") == 0) break;
    if (strcmp(line, "/reset") == 0) {
      reset(msgs, system);
      if (tty) fprintf(stderr, "(conversation cleared)\n");
      continue;
    }
    json_array_append_new(msgs, message("user", line));
    char *msgs_json = json_dumps(msgs, JSON_COMPACT);
    char *prompt = NULL;
    if (!msgs_json || hearth_chat_render(m, msgs_json, NULL, true, NULL, &prompt, &err)) {
      free(msgs_json);
      status = cli_fail("%s", msgs_json ? err.msg : "out of memory");
      break;
    }
    free(msgs_json);
    reply r = {{0}};
    hearth_prompt hp = {.text = prompt, .add_special = false};
    params.cancel = &g_cancel;
    hearth_gen_result res;
    int rc = hearth_generate(m, &hp, &params, on_token, &r, &res, &err);
    free(prompt);
    printf("\n");
    fflush(stdout);
    if (rc == HEARTH_ECANCELLED) {
      if (tty) fprintf(stderr, "(stopped)\n");
    } else if (rc) {
      hbuf_free(&r.text);
      /* a turn that does not fit is dropped; the session goes on */
      fprintf(stderr, "hearth: %s\n", err.msg);
      json_array_remove(msgs, json_array_size(msgs) - 1);
      if (rc == HEARTH_ELIMIT) continue;
      status = 1;
      break;
    }
    json_array_append_new(msgs, message("assistant", hbuf_str(&r.text)));
    hbuf_free(&r.text);
  }
  sigaction(SIGINT, &old, NULL);
  free(line);
  json_decref(msgs);
  hearth_model_free(m);
  return status;
}
