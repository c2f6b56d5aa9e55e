/* chat.c — `hearth chat`: an interactive conversation on the terminal. Keeps
 * the messages, renders the whole conversation with the model's chat template
 * each turn and streams the reply. Ctrl-C stops a reply, not the session.
 * On a terminal, lines are read with libedit (editing, history); otherwise
 * (or without libedit) plainly, line by line. A line that is one word
 * starting with / is a command of the session, never sent to the model
 * ("//x" sends "/x"). With --memory DIR the model is offered the
 * memory_search tool over a memory wiki: its calls are parsed out of the
 * reply (chat/toolcall.h), run (memory/search.h) and their results fed back
 * until it answers (--memory-always: each turn opens with such a call, as
 * the server's tool_choice forces one). Uses the public API (and jansson to
 * build the messages, base/buf.h's byte buffer), and for --memory
 * chat/toolcall.h, memory/ and serve/forced.h (a forced call's grammar). */
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
#include "chat/toolcall.h"
#include "cli/cli.h"
#include "hearth.h"
#include "memory/search.h"
#include "serve/forced.h"

#define CHAT_TOOL_ROUNDS 4 /* memory_search rounds per turn at most */

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
          "  --memory DIR      offer the model the memory_search tool over the memory wiki DIR\n"
          "                    (hearth memory search ranks the same way); its calls show on stderr\n"
          "  --memory-always   every turn opens with a memory_search call (the model writes the\n"
          "                    query under a grammar of the call's syntax), then the answer\n"
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
  hbuf text;        /* owned: the reply's content so far */
  tc_parser *tc;    /* owned, NULL without --memory: splits tool calls out of the output */
  json_t *calls;    /* owned (with tc): [{"name", "arguments": JSON text}] */
  hbuf args;        /* owned: the open call's arguments */
} reply;

static void show(reply *r, const char *text, size_t len) {
  fwrite(text, 1, len, stdout);
  fflush(stdout);
  hbuf_append(&r->text, text, len);
}

static int on_event(void *user, const tc_event *ev) {
  reply *r = user;
  switch (ev->kind) {
  case TC_TEXT: show(r, ev->text, ev->len); break;
  case TC_REASONING: break;
  case TC_CALL_BEGIN:
    json_array_append_new(r->calls, json_pack("{s:s, s:s}", "name", ev->name, "arguments", "{}"));
    hbuf_clear(&r->args);
    break;
  case TC_CALL_ARGS: hbuf_append(&r->args, ev->text, ev->len); break;
  case TC_CALL_END: {
    json_t *c = json_array_get(r->calls, json_array_size(r->calls) - 1);
    if (c && r->args.len) json_object_set_new(c, "arguments", json_string(hbuf_str(&r->args)));
    hbuf_clear(&r->args);
    break;
  }
  }
  return 0;
}

static int on_token(void *user, const char *text, size_t len, const hearth_token *tok) {
  (void)tok;
  reply *r = user;
  if (r->tc) return len ? tc_parser_feed(r->tc, text, len, on_event, r, NULL) : 0;
  if (len) show(r, text, len);
  return 0;
}

static void reply_free(reply *r) {
  hbuf_free(&r->text);
  hbuf_free(&r->args);
  tc_parser_free(r->tc);
  json_decref(r->calls);
  memset(r, 0, sizeof *r);
}

/* The memory_search tool of --memory, and how the model's template shows tools. */
typedef struct memory_tool {
  memsearch *s;        /* owned */
  char *tools_json;    /* owned: [the tool] */
  tc_format format;    /* the template's call syntax; TC_GENERIC when it has none */
  char *describe;      /* owned, NULL when the template shows tools itself: the tools and the
                        * call shape, put in the system message (as the server does) */
  int calls;           /* calls run in the session */
  int result_bytes;    /* a result's size at most: half as many bytes as the context has tokens, at most 8 KiB */
  char *forced;        /* owned, NULL unless --memory-always: the opening of a memory_search call */
  char *forced_gbnf;   /* owned: the grammar of the rest of that call */
} memory_tool;

static int memory_tool_open(memory_tool *t, const char *dir, hearth_model *m, const hearth_info *info, herr *err) {
  memset(t, 0, sizeof *t);
  int rc = cli_memory_open(dir, m, -1, &t->s, err);
  memsearch_stats st;
  if (!rc) rc = memsearch_update(t->s, &st, err);
  if (rc) return rc;
  if (st.embedded || st.removed)
    fprintf(stderr, "hearth: memory: %d article%s embedded, %d removed (%d in the wiki)\n", st.embedded,
            st.embedded == 1 ? "" : "s", st.removed, st.articles);
  char *one = memsearch_tool_json();
  hbuf b = {0};
  hbuf_printf(&b, "[%s]", one ? one : "");
  if (!one || b.oom) {
    free(one);
    hbuf_free(&b);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  t->tools_json = hbuf_take(&b);
  t->result_bytes = info->context_length / 2 > 8192 ? 8192 : (int)(info->context_length / 2);
  t->format = tc_format_detect(info->chat_template);
  if (t->format == TC_NONE) {
    t->format = TC_GENERIC;
    if (!strstr(info->chat_template, "tools")) { /* the template shows no tools: say them in the system message */
      hbuf d = {0};
      hbuf_printf(&d,
                  "You can call these tools (each with its JSON schema of arguments):\n%s\n"
                  "To call tools, reply with only a JSON object of this shape, the arguments following the tool's "
                  "schema:\n{\"tool_calls\": [{\"name\": \"TOOL_NAME\", \"arguments\": {...}}]}",
                  one);
      t->describe = hbuf_take(&d);
    }
  }
  free(one);
  return 0;
}

/* --memory-always: the opening that makes a reply a memory_search call, and the grammar of its rest. */
static int memory_tool_force(memory_tool *t, herr *err) {
  hbuf open = {0}, g = {0};
  json_t *tools = json_loads(t->tools_json, 0, NULL);
  bool ok = tools && tc_forced_call(t->format, MEMSEARCH_TOOL_NAME, &open) &&
            serve_forced_grammar(t->format, tools, MEMSEARCH_TOOL_NAME, &g) && !open.oom && !g.oom;
  json_decref(tools);
  if (ok) {
    t->forced = hbuf_take(&open);
    t->forced_gbnf = hbuf_take(&g);
  }
  hbuf_free(&open);
  hbuf_free(&g);
  if (!ok || !t->forced || !t->forced_gbnf)
    return herr_set(err, HEARTH_EUNSUPPORTED, "--memory-always: the %s call syntax has no forced call", tc_format_name(t->format));
  return 0;
}

static void memory_tool_close(memory_tool *t) {
  free(t->forced);
  free(t->forced_gbnf);
  memsearch_close(t->s);
  free(t->tools_json);
  free(t->describe);
}

/* The messages a turn is rendered from: with a described tool, the system
 * message holds the description (after the session's own system text). */
static char *render_messages(const json_t *msgs, const memory_tool *t, const char *system) {
  if (!t || !t->describe) return json_dumps(msgs, JSON_COMPACT);
  json_t *copy = json_deep_copy(msgs);
  hbuf b = {0};
  if (system) hbuf_printf(&b, "%s\n\n", system);
  hbuf_puts(&b, t->describe);
  json_t *sys = json_pack("{s:s, s:s%}", "role", "system", "content", hbuf_str(&b), b.len);
  hbuf_free(&b);
  if (system) json_array_set_new(copy, 0, sys);
  else json_array_insert_new(copy, 0, sys);
  char *s = json_dumps(copy, JSON_COMPACT);
  json_decref(copy);
  return s;
}

/* Whether every call of r is memory_search (and there is one). */
static bool only_memory_calls(const reply *r) {
  size_t i;
  json_t *c;
  if (!json_array_size(r->calls)) return false;
  json_array_foreach(r->calls, i, c) if (strcmp(json_string_value(json_object_get(c, "name")), MEMSEARCH_TOOL_NAME)) return false;
  return true;
}

/* Runs r's memory_search calls and appends the assistant's calls and their results to msgs. */
static void run_memory_calls(memory_tool *t, const reply *r, json_t *msgs) {
  json_t *calls = json_array();
  size_t i;
  json_t *c;
  json_array_foreach(r->calls, i, c) {
    char id[32];
    snprintf(id, sizeof id, "call_%d", t->calls + (int)i + 1);
    const char *args = json_string_value(json_object_get(c, "arguments"));
    json_t *obj = json_loads(args ? args : "{}", 0, NULL);
    json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:o}}", "id", id, "type", "function", "function", "name",
                                           MEMSEARCH_TOOL_NAME, "arguments", obj ? obj : json_object()));
  }
  json_array_append_new(msgs, json_pack("{s:s, s:s, s:o}", "role", "assistant", "content", hbuf_str(&r->text),
                                        "tool_calls", calls));
  json_array_foreach(r->calls, i, c) {
    const char *args = json_string_value(json_object_get(c, "arguments"));
    char id[32], *result = NULL;
    snprintf(id, sizeof id, "call_%d", ++t->calls);
    herr err = {0};
    if (memsearch_tool_call(t->s, args ? args : "{}", t->result_bytes, &result, &err)) {
      free(result);
      result = NULL;
    }
    json_t *a = json_loads(args ? args : "{}", 0, NULL);
    const char *q = json_string_value(json_object_get(a, "query"));
    fprintf(stderr, "[memory_search: %s%s]\n", q ? q : "(no query)", result ? "" : " failed");
    json_decref(a);
    hbuf e = {0};
    if (!result) hbuf_printf(&e, "error: %s", err.msg);
    json_t *content = json_string(result ? result : hbuf_str(&e));
    json_array_append_new(msgs, json_pack("{s:s, s:s, s:s, s:o}", "role", "tool", "tool_call_id", id, "name",
                                          MEMSEARCH_TOOL_NAME, "content", content ? content : json_string("")));
    hbuf_free(&e);
    free(result);
  }
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
  const char *model_dir = NULL, *system = NULL, *adapter = NULL, *memory = NULL;
  bool memory_always = false;
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
    } else if ((r = cli_opt(argc, argv, &i, "--memory", &v))) {
      if (r < 0) return 2;
      memory = v;
    } else if (!strcmp(argv[i], "--memory-always")) {
      memory_always = true;
    } else {
      return cli_usage_error("chat", "unknown option '%s'", argv[i]);
    }
  }
  if (memory_always && !memory) return cli_usage_error("chat", "--memory-always goes with --memory DIR");
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
  memory_tool mt_store, *mt = NULL;
  if (memory) {
    if (memory_tool_open(&mt_store, memory, m, &info, &err) || (memory_always && memory_tool_force(&mt_store, &err))) {
      memory_tool_close(&mt_store);
      hearth_model_free(m);
      return cli_fail("chat: --memory %s: %s", memory, err.msg);
    }
    mt = &mt_store;
  }
  bool tty = isatty(0) && isatty(1);
  if (tty) fprintf(stderr, "hearth chat — %s%s%s (/help for commands)\n", info.id, mt ? ", memory " : "", mt ? memory : "");
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
    size_t turn_start = json_array_size(msgs);
    json_array_append_new(msgs, message("user", line));
    /* one turn: the model's replies until one that calls no tool (with --memory, each
     * memory_search call is run and its result given back, up to CHAT_TOOL_ROUNDS rounds) */
    int rc = 0;
    bool failed = false;
    for (int round = 0;; round++) {
      char *msgs_json = render_messages(msgs, mt, system);
      char *prompt = NULL;
      if (!msgs_json || hearth_chat_render(m, msgs_json, mt ? mt->tools_json : NULL, true, NULL, &prompt, &err)) {
        free(msgs_json);
        status = cli_fail("%s", msgs_json ? err.msg : "out of memory");
        failed = true;
        break;
      }
      free(msgs_json);
      reply r;
      memset(&r, 0, sizeof r);
      if (mt) {
        tc_opts to = {.format = mt->format, .tools = round < CHAT_TOOL_ROUNDS};
        r.calls = json_array();
        if (tc_parser_new(&to, &r.tc, &err)) {
          free(prompt);
          reply_free(&r);
          status = cli_fail("%s", err.msg);
          failed = true;
          break;
        }
      }
      /* --memory-always: the turn's first reply opens with the call, written into the prompt and fed
       * to the parser as the reply's start, and goes on under the grammar of its rest */
      hearth_gen_params gp = params;
      if (mt && mt->forced && round == 0) {
        size_t pl = strlen(prompt), fl = strlen(mt->forced);
        char *p2 = realloc(prompt, pl + fl + 1);
        if (!p2) {
          free(prompt);
          reply_free(&r);
          status = cli_fail("out of memory");
          failed = true;
          break;
        }
        memcpy(p2 + pl, mt->forced, fl + 1);
        prompt = p2;
        tc_parser_feed(r.tc, mt->forced, fl, on_event, &r, NULL);
        if (!params.grammar && !params.json_schema) gp.grammar = mt->forced_gbnf;
      }
      hearth_prompt hp = {.text = prompt, .add_special = false};
      gp.cancel = &g_cancel;
      hearth_gen_result res;
      rc = hearth_generate(m, &hp, &gp, on_token, &r, &res, &err);
      free(prompt);
      if (r.tc) tc_parser_finish(r.tc, on_event, &r, NULL);
      if (rc == 0 && mt && only_memory_calls(&r)) {
        if (r.text.len) printf("\n");
        run_memory_calls(mt, &r, msgs);
        reply_free(&r);
        continue;
      }
      printf("\n");
      fflush(stdout);
      if (rc == HEARTH_ECANCELLED) {
        if (tty) fprintf(stderr, "(stopped)\n");
      } else if (rc) {
        reply_free(&r);
        break;
      }
      json_array_append_new(msgs, message("assistant", hbuf_str(&r.text)));
      reply_free(&r);
      break;
    }
    if (failed) break;
    if (rc && rc != HEARTH_ECANCELLED) {
      /* a turn that does not fit is dropped; the session goes on */
      fprintf(stderr, "hearth: %s\n", err.msg);
      while (json_array_size(msgs) > turn_start) json_array_remove(msgs, json_array_size(msgs) - 1);
      if (rc == HEARTH_ELIMIT) continue;
      status = 1;
      break;
    }
  }
  sigaction(SIGINT, &old, NULL);
  free(line);
  json_decref(msgs);
  if (mt) memory_tool_close(mt);
  hearth_model_free(m);
  return status;
}
