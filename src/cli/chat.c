/* chat.c — `hearth chat`: an interactive conversation on the terminal. Keeps
 * the messages, renders the whole conversation with the model's chat template
 * each turn and streams the reply. Ctrl-C stops a reply, not the session.
 * On a terminal, lines are read with libedit (editing, history); otherwise
 * (or without libedit) plainly, line by line. A line that is one word
 * starting with / is a command of the session, never sent to the model
 * ("//x" sends "/x"). Uses only the public API (and jansson to build the
 * messages, base/buf.h's byte buffer). */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef HEARTH_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

#include "base/buf.h"
#include "cli/cli.h"
#include "hearth.h"

static volatile int g_cancel;

static void on_sigint(int sig) {
  (void)sig;
  g_cancel = 1;
}

/* The session's commands: /help prints this. */
static const char chat_commands[] =
    "commands:\n"
    "  /help            this list\n"
    "  /reset           forget the conversation (the system message stays)\n"
    "  /quit, /exit, /bye  leave (so does end of input, Ctrl-D)\n"
    "Ctrl-C stops a reply; every other line is sent to the model (//x sends /x).\n";

static void usage(FILE *f) {
  fprintf(f,
          "usage: hearth chat [--model PATH] [options]\n\n"
          "  --model PATH      model folder or .gguf file (default: the built-in model)\n"
          "  --system TEXT     a system message\n"
          "  --adapter DIR     talk under this PEFT LoRA adapter folder\n"
          "  -n, --max-tokens N  tokens of each reply (default: up to the context, or what the KV cache holds)\n"
          "%s"
          "  --threads N       CPU worker threads (default: one per CPU)\n\n"
          "In the session (line editing and history on a terminal):\n%s",
          cli_sampling_help(), chat_commands);
}

/* One line of input without its newline (malloc'd), or NULL at the end of
 * input; *interrupted when Ctrl-C ended the read instead. */
static char *read_line(bool tty, const char *prompt, bool *interrupted) {
  *interrupted = false;
#ifdef HEARTH_HAVE_LIBEDIT
  if (tty) {
    char *l = readline(prompt);
    if (!l && g_cancel) *interrupted = true;
    if (l && *l) add_history(l);
    return l;
  }
#endif
  if (tty) {
    fputs(prompt, stdout);
    fflush(stdout);
  }
  char *line = NULL;
  size_t cap = 0;
  ssize_t n = getline(&line, &cap, stdin);
  if (n < 0) {
    free(line);
    if (errno == EINTR && g_cancel) {
      clearerr(stdin);
      *interrupted = true;
    }
    return NULL;
  }
  while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
  return line;
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
  const char *model_dir = NULL, *system = NULL, *adapter = NULL;
  hearth_gen_params params;
  hearth_gen_params_init(&params);
  for (int i = 1; i < argc; i++) {
    const char *v = NULL;
    int r;
    if (cli_is_help(argv[i])) {
      usage(stdout);
      return 0;
    }
    if ((r = cli_opt_sampling("chat", argc, argv, &i, &params, NULL))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt(argc, argv, &i, "--model", &v))) {
      if (r < 0) return 2;
      model_dir = v;
    } else if ((r = cli_opt(argc, argv, &i, "--system", &v))) {
      if (r < 0) return 2;
      system = v;
    } else if ((r = cli_opt(argc, argv, &i, "--adapter", &v))) {
      if (r < 0) return 2;
      adapter = v;
    } else {
      return cli_usage_error("chat", "unknown option '%s'", argv[i]);
    }
  }
  if (!model_dir) {
    model_dir = cli_default_model();
    if (!model_dir) return cli_fail("no --model given and no built-in model found (models/default)");
  }
  hearth_error err = {0};
  hearth_model *m = NULL;
  hearth_load_opts lo;
  cli_hearth_load_opts(&lo);
  if (hearth_model_load(model_dir, &lo, &m, &err)) return cli_fail("%s", err.msg);
  if (adapter) {
    if (hearth_adapter_load(m, "adapter", adapter, &err)) {
      hearth_model_free(m);
      return cli_fail("%s", err.msg);
    }
    params.adapter = "adapter";
  }
  hearth_info info;
  hearth_model_info(m, &info);
  if (!info.has_chat_template) {
    hearth_model_free(m);
    return cli_fail("%s: the model has no chat template; use hearth generate", model_dir);
  }
  bool tty = isatty(0) && isatty(1);
  if (tty) fprintf(stderr, "hearth chat — %s (/help for commands)\n", info.id);
  json_t *msgs = json_array();
  reset(msgs, system);
  char *line = NULL;
  int status = 0;
  struct sigaction sa = {0}, old;
  sa.sa_handler = on_sigint;
  sigaction(SIGINT, &sa, &old);
  for (;;) {
    g_cancel = 0;
    free(line);
    bool interrupted;
    line = read_line(tty, "> ", &interrupted);
    if (!line) {
      if (interrupted) {
        printf("\n");
        continue;
      }
      break;
    }
    size_t n = strlen(line);
    while (n > 0 && (line[n - 1] == '\r' || line[n - 1] == ' ')) line[--n] = 0;
    if (n == 0) continue;
    if (strcmp(line, "/quit") == 0 || strcmp(line, "/exit") == 0 || strcmp(line, "/bye") == 0) break;
    if (strcmp(line, "/reset") == 0) {
      reset(msgs, system);
      if (tty) fprintf(stderr, "(conversation cleared)\n");
      continue;
    }
    if (strcmp(line, "/help") == 0 || strcmp(line, "/?") == 0) {
      fputs(chat_commands, stderr);
      continue;
    }
    if (line[0] == '/' && line[1] != '/' && !strchr(line, ' ')) {
      fprintf(stderr, "unknown command '%s' (/help lists them; start a line with // to send it as text)\n", line);
      continue;
    }
    if (line[0] == '/' && line[1] == '/') memmove(line, line + 1, n); /* "//x" sends "/x" */
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
