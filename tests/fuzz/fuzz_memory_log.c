/* fuzz_memory_log — the memory pipeline's readers of untrusted text: a log
 * (the first byte picks the name it is read under: .jsonl, .json, .md or
 * .txt) into turns, and an article's front matter and body; each must refuse
 * with a message or give turns / an article whose fields are set, and an
 * article it parses must parse again to the same text once written. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "memory/article.h"
#include "memory/logs.h"

static void check_log(const uint8_t *data, size_t size) {
  static const char *names[] = {"log.jsonl", "log.json", "log.md", "log.txt"};
  mem_log l;
  herr err = {0};
  if (mem_log_parse(names[size ? data[0] % 4 : 0], (const char *)data + (size > 0), size ? size - 1 : 0, &l, &err)) {
    if (!err.msg[0]) abort();
    return;
  }
  for (size_t i = 0; i < l.n_turns; i++)
    if (!l.turns[i].role || !l.turns[i].text || !l.turns[i].text[0]) abort();
  mem_log_free(&l);
}

static void check_article(const uint8_t *data, size_t size) {
  char *text = strndup((const char *)data, size); /* a file's text ends at a NUL */
  if (!text) return;
  mem_article a, b;
  herr err = {0};
  if (mem_article_parse("x", text, strlen(text), &a, &err)) {
    if (!err.msg[0]) abort();
    free(text);
    return;
  }
  char *out = mem_article_format(&a), *again = NULL;
  if (!out || mem_article_parse("x", out, strlen(out), &b, &err)) abort();
  again = mem_article_format(&b);
  if (!again || strcmp(out, again)) abort();
  free(again);
  free(out);
  mem_article_free(&b);
  mem_article_free(&a);
  free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  check_log(data, size);
  check_article(data, size);
  return 0;
}
