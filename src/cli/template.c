/* template.c — `hearth template`: renders a model's chat template over a
 * messages file and prints the prompt. Uses the internal chat module's API
 * (chat/chat.h), not hearth.h: the public API renders only with a loaded
 * model, and this verb never loads weights. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "chat/chat.h"
#include "cli/cli.h"

static void template_usage(FILE *f) {
  char names[256];
  chat_builtin_names(names, sizeof names);
  fprintf(f,
          "usage: hearth template --model PATH --messages FILE [--tools FILE] [--no-generation-prompt]\n"
          "                       [--kwargs JSON]\n\n"
          "Renders the chat template of PATH (a model folder, a tokenizer_config.json or a .jinja file)\n"
          "over the messages in FILE (a JSON list of messages, or an object with \"messages\" and\n"
          "optionally \"tools\"; '-' reads stdin) and prints the prompt exactly, without a newline.\n"
          "  --tools FILE             a JSON list of tool definitions\n"
          "  --no-generation-prompt   render with add_generation_prompt=false\n"
          "  --kwargs JSON            extra template variables, e.g. '{\"enable_thinking\": false}'\n"
          "  --chat-template-file F   render with the Jinja file F instead of PATH's template (PATH's\n"
          "                           bos_token and eos_token kept)\n"
          "  --chat-template NAME|F   render with a template hearth ships (%s)\n"
          "                           or the Jinja file F instead of PATH's\n",
          names);
}

static json_t *load_json_arg(const char *path, herr *err) {
  if (strcmp(path, "-") != 0) return hjson_load_file(path, err);
  json_error_t je;
  json_t *j = json_loadf(stdin, JSON_DECODE_ANY, &je);
  if (!j) herr_set(err, HEARTH_EFORMAT, "stdin:%d:%d: %s", je.line, je.column, je.text);
  return j;
}

int cli_template(int argc, char **argv) {
  const char *model = NULL, *messages_path = NULL, *tools_path = NULL, *kwargs_text = NULL, *tpl_file = NULL,
             *tpl_named = NULL;
  bool add_generation_prompt = true;
  for (int i = 1; i < argc; i++) {
    int r;
    if (cli_is_help(argv[i])) {
      template_usage(stdout);
      return 0;
    }
    if ((r = cli_opt(argc, argv, &i, "--model", &model))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt(argc, argv, &i, "--messages", &messages_path))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt(argc, argv, &i, "--tools", &tools_path))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt(argc, argv, &i, "--kwargs", &kwargs_text))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt(argc, argv, &i, "--chat-template-file", &tpl_file))) {
      if (r < 0) return 2;
    } else if ((r = cli_opt(argc, argv, &i, "--chat-template", &tpl_named))) {
      if (r < 0) return 2;
    } else if (strcmp(argv[i], "--no-generation-prompt") == 0) {
      add_generation_prompt = false;
    } else {
      return cli_usage_error("template", "unknown argument '%s'", argv[i]);
    }
  }
  if (!model) model = cli_default_model();
  if (!model) return cli_usage_error("template", "--model PATH is required");
  if (!messages_path) return cli_usage_error("template", "--messages FILE is required");
  if (tpl_file && tpl_named) return cli_usage_error("template", "--chat-template and --chat-template-file: give one");

  herr err = {0};
  chat_template tpl;
  int rc = chat_template_load(model, &tpl, &err);
  if (rc == HEARTH_ENOTFOUND && (tpl_file || tpl_named)) rc = 0; /* the given one's, with no bos/eos texts */
  if (!rc && tpl_file) rc = chat_template_replace(&tpl, tpl_file, &err);
  else if (!rc && tpl_named) rc = chat_template_use(&tpl, tpl_named, &err);
  if (rc) {
    chat_template_free(&tpl);
    return cli_fail("%s", err.msg);
  }
  int status = 1;
  json_t *msgs = NULL, *tools = NULL, *kwargs = NULL;
  hbuf out = {0};
  msgs = load_json_arg(messages_path, &err);
  if (!msgs) {
    cli_fail("%s", err.msg);
    goto done;
  }
  json_t *messages = msgs;
  if (json_is_object(msgs)) {
    messages = json_object_get(msgs, "messages");
    if (!tools_path && json_object_get(msgs, "tools")) tools = json_incref(json_object_get(msgs, "tools"));
  }
  if (!json_is_array(messages)) {
    cli_fail("%s: expected a JSON list of messages (or an object with \"messages\")", messages_path);
    goto done;
  }
  if (tools_path && !(tools = load_json_arg(tools_path, &err))) {
    cli_fail("%s", err.msg);
    goto done;
  }
  if (kwargs_text) {
    kwargs = hjson_load_buf(kwargs_text, strlen(kwargs_text), "--kwargs", &err);
    if (!kwargs) {
      cli_fail("%s", err.msg);
      goto done;
    }
    if (!json_is_object(kwargs)) {
      cli_fail("--kwargs: expected a JSON object");
      goto done;
    }
  }
  if (chat_render(tpl.source, messages, tools, add_generation_prompt, kwargs, tpl.bos, tpl.eos, &out, &err)) {
    cli_fail("%s: %s", tpl.origin, err.msg);
    goto done;
  }
  fwrite(out.data ? out.data : "", 1, out.len, stdout);
  fflush(stdout);
  status = 0;
done:
  hbuf_free(&out);
  json_decref(msgs);
  json_decref(tools);
  json_decref(kwargs);
  chat_template_free(&tpl);
  return status;
}
