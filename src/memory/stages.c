/* stages.c — what the stages share (stages.h): their names, schemas and
 * answer limits, asking the engine for one batch, reading answers, and the
 * word likeness that picks articles to show the model. Each stage's own
 * work is in stage_<name>.c. */
#include "memory/stages.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/buf.h"
#include "base/log.h"

static const struct {
  const char *name;
  long max_tokens;
  const char *schema;
} stages[MEM_STAGES] = {
    {"segment", 256,
     "{\"type\":\"object\",\"properties\":{\"segments\":{\"type\":\"array\",\"minItems\":1,\"maxItems\":8,\"items\":"
     "{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":80},"
     "\"first\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":9999},\"last\":{\"type\":\"integer\",\"minimum\":1,"
     "\"maximum\":9999}},\"required\":[\"title\",\"first\",\"last\"]}}},\"required\":[\"segments\"]}"},
    {"extract", 384,
     "{\"type\":\"object\",\"properties\":{\"entities\":{\"type\":\"array\",\"maxItems\":8,\"items\":{\"type\":"
     "\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":60},\"kind\":{\"enum\":"
     "[\"person\",\"project\",\"place\",\"organization\",\"topic\",\"thing\"]},\"facts\":{\"type\":\"array\","
     "\"minItems\":1,\"maxItems\":6,\"items\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":200}}},"
     "\"required\":[\"name\",\"kind\",\"facts\"]}}},\"required\":[\"entities\"]}"},
    {"route", 96,
     "{\"type\":\"object\",\"properties\":{\"action\":{\"enum\":[\"create\",\"patch\"]},\"slug\":{\"type\":\"string\","
     "\"maxLength\":80},\"title\":{\"type\":\"string\",\"maxLength\":80}},\"required\":[\"action\",\"slug\",\"title\"]}"},
    {"write", 512,
     "{\"type\":\"object\",\"properties\":{\"body\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":4000}},"
     "\"required\":[\"body\"]}"},
    {"reconcile", 640,
     "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"same\":{\"const\":false}},\"required\":[\"same\"]},"
     "{\"type\":\"object\",\"properties\":{\"same\":{\"const\":true},\"title\":{\"type\":\"string\",\"minLength\":1,"
     "\"maxLength\":80},\"body\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":6000}},"
     "\"required\":[\"same\",\"title\",\"body\"]}]}"},
    {"link", 128,
     "{\"type\":\"object\",\"properties\":{\"links\":{\"type\":\"array\",\"maxItems\":8,\"items\":{\"type\":"
     "\"string\",\"minLength\":1,\"maxLength\":80}}},\"required\":[\"links\"]}"},
};

const char *mem_stage_name(int stage) { return stage >= 0 && stage < MEM_STAGES ? stages[stage].name : "?"; }

int mem_stage_parse(const char *name) {
  if (!strcmp(name, "chunk")) return MEM_SEGMENT;
  for (int s = 0; s < MEM_STAGES; s++)
    if (!strcmp(name, stages[s].name)) return s;
  return -1;
}

const char *mem_stage_schema(int stage) { return stages[stage].schema; }
long mem_stage_max_tokens(int stage) { return stages[stage].max_tokens; }

/* The answer's text as a JSON object, or NULL. */
static json_t *answer_object(const char *text) {
  if (!text) return NULL;
  json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);
  if (json_is_object(v)) return v;
  json_decref(v);
  return NULL;
}

int mem_stage_ask(mem_run *r, int stage, const mem_ask *asks, size_t n, json_t **answers, herr *err) {
  for (size_t i = 0; i < n; i++) answers[i] = NULL;
  if (!n) return 0;
  mem_call *calls = calloc(n, sizeof *calls);
  char **prompts = calloc(n, sizeof *prompts);
  int rc = calls && prompts ? 0 : herr_set(err, HEARTH_ENOMEM, "out of memory");
  for (size_t i = 0; !rc && i < n; i++) {
    prompts[i] = mem_prompt_fill(r->prompts.text[asks[i].tmpl], asks[i].keys, asks[i].values, (size_t)asks[i].n);
    if (!prompts[i]) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    calls[i] = (mem_call){.stage = stage, .prompt = prompts[i], .schema = stages[stage].schema,
                          .max_tokens = stages[stage].max_tokens};
  }
  if (!rc) rc = r->eng->run(r->eng->ctx, calls, n, err);
  for (size_t i = 0; !rc && i < n; i++) {
    if (!(answers[i] = answer_object(calls[i].answer))) {
      r->rep->fallbacks++;
      HLOG_WARN("memory: %s: answer %zu of %zu unusable, the stage goes on without it", stages[stage].name, i + 1, n);
    }
  }
  if (!rc) r->rep->calls += (int)n;
  for (size_t i = 0; i < n; i++) {
    if (calls) free(calls[i].answer);
    if (prompts) free(prompts[i]);
  }
  free(calls);
  free(prompts);
  return rc;
}

char *mem_answer_str(const json_t *answer, const char *key) {
  return mem_trimmed(json_string_value(json_object_get(answer, key)));
}

char *mem_trimmed(const char *s) {
  if (!s) return NULL;
  while (isspace((unsigned char)*s)) s++;
  size_t n = strlen(s);
  while (n && isspace((unsigned char)s[n - 1])) n--;
  return n ? strndup(s, n) : NULL;
}

json_t *mem_summary_copy(const json_t *result) {
  json_t *s = json_deep_copy(json_object_get(result, "summary"));
  return json_is_object(s) ? s : (json_decref(s), json_object());
}

json_t *mem_changes_result(const mem_run *r, json_t *summary) {
  json_t *out = mem_wiki_changes(&r->wiki);
  if (out) json_object_set(out, "summary", summary);
  return out;
}

void mem_summary_add(json_t *summary, const char *key, json_t *s) {
  json_t *arr = json_object_get(summary, key);
  if (!json_is_array(arr)) {
    arr = json_array();
    json_object_set_new(summary, key, arr);
  }
  for (size_t i = 0; i < json_array_size(arr); i++)
    if (json_equal(json_array_get(arr, i), s)) {
      json_decref(s);
      return;
    }
  json_array_append_new(arr, s);
}

/* ---- word likeness ---- */

static const char *small_words[] = {"the", "a", "an", "of", "and", "or", "in", "on", "for", "to", "with", "at", "by", "is"};

/* The distinct lowercased words of s (letters, digits, UTF-8), small words left out; n of them. */
static size_t words(const char *s, char w[][32], size_t max) {
  size_t n = 0;
  while (s && *s && n < max) {
    while (*s && !isalnum((unsigned char)*s) && (unsigned char)*s < 0x80) s++;
    size_t k = 0;
    char cur[32];
    while (*s && (isalnum((unsigned char)*s) || (unsigned char)*s >= 0x80)) {
      if (k < sizeof cur - 1) cur[k++] = (char)tolower((unsigned char)*s);
      s++;
    }
    cur[k] = 0;
    bool skip = !k;
    for (size_t i = 0; !skip && i < sizeof small_words / sizeof small_words[0]; i++) skip = !strcmp(cur, small_words[i]);
    for (size_t i = 0; !skip && i < n; i++) skip = !strcmp(cur, w[i]);
    if (!skip) memcpy(w[n++], cur, k + 1);
  }
  return n;
}

double mem_words_alike(const char *a, const char *b) {
  char wa[64][32], wb[64][32];
  size_t na = words(a, wa, 64), nb = words(b, wb, 64), shared = 0;
  for (size_t i = 0; i < na; i++)
    for (size_t j = 0; j < nb; j++)
      if (!strcmp(wa[i], wb[j])) shared++;
  return na + nb > shared ? (double)shared / (double)(na + nb - shared) : 0.0;
}

/* How many of title's words appear in text (a cheap relevance for the menu). */
static int mentions(const char *title, const char *text) {
  char w[16][32];
  size_t n = words(title, w, 16);
  int hits = 0;
  for (size_t i = 0; i < n; i++) hits += text && strcasestr(text, w[i]) != NULL;
  return hits;
}

char *mem_article_menu(const mem_wiki *w, const char *text, const char *skip, size_t max) {
  hbuf b = {0};
  size_t shown = 0;
  /* best first: by mentions, from the most down to none */
  for (int want = 16; want >= 0 && shown < max; want--)
    for (size_t i = 0; i < w->n && shown < max; i++) {
      if (skip && !strcmp(w->v[i].slug, skip)) continue;
      int m = mentions(w->v[i].title, text);
      if (m > 16) m = 16;
      if (m != want) continue;
      hbuf_printf(&b, "- %s: %s\n", w->v[i].slug, w->v[i].title);
      shown++;
    }
  if (!shown) hbuf_puts(&b, "(none yet)\n");
  if (b.oom) {
    hbuf_free(&b);
    return NULL;
  }
  return hbuf_take(&b);
}
