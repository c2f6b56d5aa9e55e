/* prompts.c — loading the stages' prompt templates and filling their slots
 * (prompts.h). Knows nothing of what the slots mean. */
#include "memory/prompts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/file.h"

static const char *names[MEM_TEMPLATES] = {"segment", "extract", "route", "write", "patch", "reconcile", "link"};

const char *mem_prompt_name(int t) { return t >= 0 && t < MEM_TEMPLATES ? names[t] : "?"; }

/* dir/<name>.txt when it is there: 1 read, 0 absent, else an error. */
static int read_from(const char *dir, const char *name, char **out, herr *err) {
  if (!dir) return 0;
  char file[64];
  snprintf(file, sizeof file, "%s.txt", name);
  char *path = hpath_join(dir, file);
  size_t len;
  int rc = !path ? herr_set(err, HEARTH_ENOMEM, "out of memory")
           : !hfile_exists(path) ? 0
           : hfile_read(path, out, &len, err) ? err->code : 1;
  free(path);
  return rc;
}

int mem_prompts_load(const char *dir, const char *override, mem_prompts *p, herr *err) {
  memset(p, 0, sizeof *p);
  for (int t = 0; t < MEM_TEMPLATES; t++) {
    int rc = read_from(override, names[t], &p->text[t], err);
    if (rc == 0) rc = read_from(dir, names[t], &p->text[t], err);
    if (rc == 0)
      rc = herr_set(err, HEARTH_ENOTFOUND, "the prompt template %s.txt is in neither %s nor %s", names[t],
                    override ? override : "(no --prompts folder)", dir ? dir : "(no shipped folder)");
    if (rc != 1) {
      mem_prompts_free(p);
      return rc;
    }
  }
  return 0;
}

void mem_prompts_free(mem_prompts *p) {
  for (int t = 0; t < MEM_TEMPLATES; t++) free(p->text[t]);
  memset(p, 0, sizeof *p);
}

char *mem_prompt_fill(const char *tmpl, const char *const *keys, const char *const *values, size_t n) {
  hbuf b = {0};
  for (const char *p = tmpl; *p;) {
    const char *open = strstr(p, "{{"), *close = open ? strstr(open + 2, "}}") : NULL;
    if (!close) {
      hbuf_puts(&b, p);
      break;
    }
    hbuf_append(&b, p, (size_t)(open - p));
    size_t klen = (size_t)(close - open - 2);
    size_t i = 0;
    while (i < n && (strlen(keys[i]) != klen || strncmp(keys[i], open + 2, klen))) i++;
    if (i < n) hbuf_puts(&b, values[i] ? values[i] : "");
    else hbuf_append(&b, open, klen + 4);
    p = close + 2;
  }
  if (b.oom) {
    hbuf_free(&b);
    return NULL;
  }
  return b.data ? hbuf_take(&b) : strdup("");
}
