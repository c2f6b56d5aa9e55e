/* builtin.c — the chat templates hearth ships by name (src/chat/templates/
 * NAME.jinja, built in by cmake/embed_templates.cmake): well-known formats under
 * the names llama.cpp's --chat-template gives them, each written to render as its
 * models' own template does (tools/gen_named_templates.py checks that). Also
 * the choice between such a name and a template file. Knows nothing of models. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "chat/chat.h"
#include "chat_templates.h"

#define N_BUILTIN (sizeof chat_builtin_table / sizeof chat_builtin_table[0])

const char *chat_builtin_template(const char *name) {
  for (size_t i = 0; name && i < N_BUILTIN; i++)
    if (strcmp(chat_builtin_table[i].name, name) == 0) return chat_builtin_table[i].source;
  return NULL;
}

size_t chat_builtin_count(void) { return N_BUILTIN; }

const char *chat_builtin_name(size_t i) { return i < N_BUILTIN ? chat_builtin_table[i].name : NULL; }

void chat_builtin_names(char *buf, size_t size) {
  size_t used = 0;
  if (!size) return;
  buf[0] = 0;
  for (size_t i = 0; i < N_BUILTIN && used < size; i++) {
    int n = snprintf(buf + used, size - used, "%s%s", i ? ", " : "", chat_builtin_table[i].name);
    if (n < 0) break;
    used += (size_t)n;
  }
}

int chat_template_use(chat_template *t, const char *name_or_file, herr *err) {
  const char *src = chat_builtin_template(name_or_file);
  if (!src) {
    if (!hfile_exists(name_or_file) && !strchr(name_or_file, '/')) {
      char names[256];
      chat_builtin_names(names, sizeof names);
      return herr_set(err, HEARTH_EINVAL, "chat template '%s': no such file, and not a built-in template (%s)",
                      name_or_file, names);
    }
    return chat_template_replace(t, name_or_file, err);
  }
  size_t n = strlen(name_or_file) + 32;
  char *source = strdup(src), *origin = malloc(n), *bos = t->bos ? NULL : strdup(""), *eos = t->eos ? NULL : strdup("");
  if (!source || !origin || (!t->bos && !bos) || (!t->eos && !eos)) {
    free(source), free(origin), free(bos), free(eos);
    return herr_set(err, HEARTH_ENOMEM, "out of memory");
  }
  snprintf(origin, n, "built-in chat template %s", name_or_file);
  free(t->source);
  free(t->origin);
  t->source = source;
  t->origin = origin;
  if (bos) t->bos = bos;
  if (eos) t->eos = eos;
  return 0;
}
