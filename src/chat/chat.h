/* chat.h — chat rendering: a model's chat template (from its folder) applied
 * to messages the way Hugging Face's apply_chat_template does, through the
 * Jinja2 engine in jinja.h. */
#ifndef HEARTH_CHAT_CHAT_H
#define HEARTH_CHAT_CHAT_H

#include <jansson.h>
#include <stdbool.h>

#include "base/buf.h"
#include "base/status.h"
#include "chat/jinja.h"

/* A model's template and the special-token strings templates print. */
typedef struct chat_template {
  char *source; /* owned: the Jinja source */
  char *bos;    /* owned: bos_token ("" when the model has none) */
  char *eos;    /* owned: eos_token ("" when none) */
  char *origin; /* owned: the file the template came from (for messages) */
} chat_template;

/* Finds a model's chat template. path is a model folder, a tokenizer_config.json,
 * or a .jinja file. In a folder, chat_template.jinja wins over tokenizer_config.json's
 * `chat_template` (a string, or a list of {name, template} where "default" is used),
 * then chat_template.json. bos/eos come from tokenizer_config.json next to it
 * (strings or AddedToken objects with `content`). */
int chat_template_load(const char *path, chat_template *out, herr *err);
/* Replaces t's Jinja source with the text of file (a chat template given in
 * place of the model's); origin becomes file, bos/eos stay (or become "" when
 * t had none). A file that cannot be read, or is empty, is an error naming it;
 * t is unchanged then. */
int chat_template_replace(chat_template *t, const char *file, herr *err);
void chat_template_free(chat_template *t);

/* The chat templates hearth ships (builtin.c; src/chat/templates/NAME.jinja):
 * well-known formats by the names llama.cpp's --chat-template gives them —
 * chatml, deepseek3, gemma, llama3, mistral-v7, phi3 — each rendering plain
 * turns as its models' own template does. chat_builtin_template: the Jinja
 * source, NULL for an unknown name. chat_builtin_names: the names, sorted,
 * ", "-separated, into buf (cut at size). */
const char *chat_builtin_template(const char *name);
size_t chat_builtin_count(void);
const char *chat_builtin_name(size_t i);
void chat_builtin_names(char *buf, size_t size);
/* Replaces t's Jinja source with a built-in template when name_or_file is one's
 * name (origin "built-in chat template NAME"), else with the file's text
 * (chat_template_replace). A value that is neither a name nor an existing
 * file (and has no '/') is an error listing the names. bos/eos as in
 * chat_template_replace; t is unchanged on error. */
int chat_template_use(chat_template *t, const char *name_or_file, herr *err);

/* The context apply_chat_template renders with: messages, tools (null when
 * absent), documents (null), add_generation_prompt, bos_token, eos_token, then
 * every key of extra_kwargs (which win). messages/tools/extra are borrowed and
 * may be NULL. Returns a new reference (NULL on out of memory). */
json_t *chat_context(const json_t *messages, const json_t *tools, bool add_generation_prompt,
                     const json_t *extra_kwargs, const char *bos, const char *eos);

/* Parses template_src and renders the chat appended to out. lim may be NULL. */
int chat_render_with(const char *template_src, const json_t *messages, const json_t *tools,
                     bool add_generation_prompt, const json_t *extra_kwargs, const char *bos, const char *eos,
                     const jinja_limits *lim, hbuf *out, herr *err);
int chat_render(const char *template_src, const json_t *messages, const json_t *tools /*nullable*/,
                bool add_generation_prompt, const json_t *extra_kwargs, const char *bos, const char *eos, hbuf *out,
                herr *err);

/* How a template wants an assistant turn that only calls tools, found by
 * rendering a probe conversation: content null (as OpenAI clients send it) or
 * "" — some templates write the calls only for null, others fail on null —
 * and arguments as an object (what most templates pass to tojson) or as a
 * JSON string (what DeepSeek's concatenate). The first of (null, object),
 * ("", object), (null, string), ("", string) whose rendering shows the call's
 * name and argument. When none does (a template that knows no tool calls,
 * like models/default's), calls_as_text: the calls are written into the
 * turn's content as JSON text, {"tool_calls": [{"name", "arguments"}]} (the
 * generic form llama.cpp uses), so the conversation still renders and the
 * model still sees what it called. */
typedef struct chat_call_shape {
  bool empty_content; /* "" instead of null */
  bool string_args;   /* arguments as a JSON string */
  bool calls_as_text; /* the template shows no calls: they go into content as JSON text */
} chat_call_shape;
chat_call_shape chat_tool_call_shape(const char *template_src, const char *bos, const char *eos);
/* Reshapes messages (an array, changed in place) for the template: assistant
 * turns of only tool calls get null or "" content, their arguments objects or
 * strings (with Python's json.dumps separators). */
void chat_apply_call_shape(json_t *messages, chat_call_shape shape);

/* Where a chat rendered without the generation prompt must be cut so the model
 * continues its final message (continue_final_message, as transformers'
 * apply_chat_template does it): just after the last occurrence of the final
 * message's text (stripped of surrounding whitespace; its trailing whitespace
 * kept when the template kept it), so closing tokens after it are dropped.
 * final_text: the final message's text (for content parts, the last text
 * part). *cut: the length to keep. HEARTH_EINVAL when the final message has
 * no text or the template did not write it. */
int chat_continue_final(const char *rendered, const char *final_text, size_t *cut, herr *err);

#endif
