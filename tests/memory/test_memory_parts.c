/* Unit tests of the memory pipeline's parts: the log readers (chat JSONL,
 * JSON message lists, Markdown and text transcripts), articles (front
 * matter parsed and written, slugs), prompt templates (slots filled, the
 * shipped ones loaded and holding their slots) and word likeness. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "memory/article.h"
#include "memory/logs.h"
#include "memory/prompts.h"
#include "memory/stages.h"
#include "test.h"

static void check_turn(const mem_log *l, size_t i, const char *role, const char *text) {
  CHECK_MSG(i < l->n_turns, "turn %zu of %zu", i, l->n_turns);
  if (i >= l->n_turns) return;
  CHECK_EQ_STR(l->turns[i].role, role);
  CHECK_EQ_STR(l->turns[i].text, text);
}

static mem_log parse(const char *name, const char *text) {
  mem_log l;
  herr err = {0};
  int rc = mem_log_parse(name, text, strlen(text), &l, &err);
  CHECK_MSG(rc == 0, "%s: %s", name, err.msg);
  if (rc) memset(&l, 0, sizeof l);
  return l;
}

static void test_jsonl(void) {
  mem_log l = parse("dir/chat.jsonl",
                    "{\"role\":\"user\",\"content\":\"Hello there\"}\n\n"
                    "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Hi!\"},{\"type\":\"image_url\"}]}\n"
                    "{\"messages\":[{\"role\":\"system\",\"content\":\"  Be brief. \"},{\"role\":\"user\",\"content\":\"Q\"}]}\n");
  CHECK_EQ_STR(l.name, "chat.jsonl");
  CHECK_EQ_INT(l.n_turns, 4);
  check_turn(&l, 0, "user", "Hello there");
  check_turn(&l, 1, "assistant", "Hi!");
  check_turn(&l, 2, "system", "Be brief.");
  check_turn(&l, 3, "user", "Q");
  CHECK_EQ_INT(strlen(l.hash), 16);
  mem_log_free(&l);
  /* a broken line names the file and line */
  herr err = {0};
  const char *bad = "{\"role\":\"user\",\"content\":\"a\"}\n{oops\n";
  CHECK(mem_log_parse("x.jsonl", bad, strlen(bad), &l, &err) == HEARTH_EFORMAT);
  CHECK_MSG(strstr(err.msg, "x.jsonl: line 2") != NULL, "%s", err.msg);
}

static void test_anthropic_json(void) {
  mem_log l = parse("claude.json",
                    "{\"system\":\"You help.\",\"messages\":["
                    "{\"role\":\"user\",\"content\":\"Weather in Oslo?\"},"
                    "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Checking.\"},"
                    "{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"weather\",\"input\":{\"city\":\"Oslo\"}}]},"
                    "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":\"-3 C\"}]}]}");
  CHECK_EQ_INT(l.n_turns, 4);
  check_turn(&l, 0, "system", "You help.");
  check_turn(&l, 1, "user", "Weather in Oslo?");
  check_turn(&l, 2, "assistant", "Checking.\n[tool weather: {\"city\":\"Oslo\"}]");
  check_turn(&l, 3, "user", "-3 C");
  mem_log_free(&l);
  l = parse("list.json", "[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"}]");
  CHECK_EQ_INT(l.n_turns, 2);
  check_turn(&l, 1, "assistant", "b");
  mem_log_free(&l);
}

static void test_transcripts(void) {
  mem_log l = parse("talk.md",
                    "# A talk\n\n**User:** I moved to Bergen.\nIt rains a lot.\n\n## Assistant\n\nBergen is rainy indeed.\n"
                    "> Human: Note: bring boots\n");
  CHECK_EQ_INT(l.n_turns, 3);
  check_turn(&l, 0, "user", "I moved to Bergen.\nIt rains a lot.");
  check_turn(&l, 1, "assistant", "Bergen is rainy indeed.");
  check_turn(&l, 2, "user", "Note: bring boots");
  mem_log_free(&l);
  /* no speakers: a paragraph a turn; "Note:" is no speaker */
  l = parse("notes.txt", "First thought.\nStill first.\n\nNote: second.\n");
  CHECK_EQ_INT(l.n_turns, 2);
  check_turn(&l, 0, "text", "First thought.\nStill first.");
  check_turn(&l, 1, "text", "Note: second.");
  mem_log_free(&l);
  /* bytes that are not UTF-8 become U+FFFD */
  l = parse("bad\xff.txt", "caf\xe9 ok\n");
  CHECK_EQ_STR(l.name, "bad\xEF\xBF\xBD.txt");
  check_turn(&l, 0, "text", "caf\xEF\xBF\xBD ok");
  mem_log_free(&l);
  /* a transcript that starts with '[' is still a transcript when named .md */
  l = parse("odd.md", "[draft]\nUser: hi\n");
  CHECK_EQ_INT(l.n_turns, 1);
  check_turn(&l, 0, "user", "hi");
  mem_log_free(&l);
}

static void test_slugs(void) {
  char s[MEM_SLUG_MAX + 1];
  mem_slugify("Alice Smith", s);
  CHECK_EQ_STR(s, "alice-smith");
  mem_slugify("  C++ / Rust: notes! ", s);
  CHECK_EQ_STR(s, "c-rust-notes");
  mem_slugify("Zürich", s);
  CHECK_EQ_STR(s, "zürich");
  mem_slugify("???", s);
  CHECK_EQ_STR(s, "article");
  mem_slugify("Index", s);
  CHECK_EQ_STR(s, "index-article");
  char longer[300];
  memset(longer, 'a', sizeof longer - 1);
  longer[sizeof longer - 1] = 0;
  mem_slugify(longer, s);
  CHECK_EQ_INT(strlen(s), MEM_SLUG_MAX);
}

static void test_article_roundtrip(void) {
  const char *text = "---\ntitle: Alice: the sister\nsources: [a.jsonl#1, b.md#2]\ncreated: 2026-01-02\n"
                     "updated: 2026-01-05\n---\n\n# Alice\n\nSee [[bob]] and [[carol|Carol]].\n";
  mem_article a;
  herr err = {0};
  CHECK(mem_article_parse("alice", text, strlen(text), &a, &err) == 0);
  CHECK_EQ_STR(a.title, "Alice: the sister");
  CHECK_EQ_INT(a.n_sources, 2);
  if (a.n_sources == 2) CHECK_EQ_STR(a.sources[1], "b.md#2");
  CHECK_EQ_STR(a.created, "2026-01-02");
  CHECK_EQ_STR(a.updated, "2026-01-05");
  CHECK_EQ_STR(a.body, "# Alice\n\nSee [[bob]] and [[carol|Carol]].");
  CHECK(mem_body_links(a.body, "bob") && mem_body_links(a.body, "carol") && !mem_body_links(a.body, "bo"));
  char *out = mem_article_format(&a);
  CHECK_EQ_STR(out, text);
  free(out);
  mem_article b;
  json_t *j = mem_article_to_json(&a);
  CHECK(mem_article_from_json(j, &b, &err) == 0);
  out = mem_article_format(&b);
  CHECK_EQ_STR(out, text);
  free(out);
  json_decref(j);
  mem_article_free(&b);
  mem_article_free(&a);
  static const char *bad[] = {"# no front matter\n", "---\nsources: []\n---\nbody\n", "---\ntitle: T\n"};
  for (int i = 0; i < 3; i++) CHECK(mem_article_parse("x", bad[i], strlen(bad[i]), &a, &err) == HEARTH_EFORMAT);
}

static void test_prompts(void) {
  const char *keys[] = {"name", "facts"}, *values[] = {"Alice", "- a\n"};
  char *s = mem_prompt_fill("About {{name}}:\n{{facts}}{{other}} {{name", keys, values, 2);
  CHECK_EQ_STR(s, "About Alice:\n- a\n{{other}} {{name");
  free(s);
  mem_prompts p;
  herr err = {0};
  CHECK_MSG(mem_prompts_load(HEARTH_SOURCE_DIR "/src/memory/prompts", NULL, &p, &err) == 0, "%s", err.msg);
  static const char *slots[MEM_TEMPLATES][3] = {
      {"{{turns}}", "{{count}}", "{{log}}"}, {"{{segment}}", "{{title}}", NULL}, {"{{name}}", "{{facts}}", "{{articles}}"},
      {"{{title}}", "{{facts}}", NULL},      {"{{body}}", "{{facts}}", NULL},    {"{{a_body}}", "{{b_body}}", NULL},
      {"{{body}}", "{{articles}}", NULL}};
  for (int t = 0; t < MEM_TEMPLATES; t++)
    for (int k = 0; k < 3 && slots[t][k]; k++)
      CHECK_MSG(p.text[t] && strstr(p.text[t], slots[t][k]), "%s.txt lacks %s", mem_prompt_name(t), slots[t][k]);
  mem_prompts_free(&p);
  /* an override folder replaces the templates it has, only those */
  char dir[] = "/tmp/hearth_memory_prompts_XXXXXX";
  if (mkdtemp(dir)) {
    char path[100];
    snprintf(path, sizeof path, "%s/link.txt", dir);
    FILE *f = fopen(path, "w");
    if (f) fputs("LINK {{slug}}", f), fclose(f);
    CHECK_MSG(mem_prompts_load(HEARTH_SOURCE_DIR "/src/memory/prompts", dir, &p, &err) == 0, "%s", err.msg);
    CHECK_EQ_STR(p.text[MEM_T_LINK], "LINK {{slug}}");
    CHECK(p.text[MEM_T_ROUTE] && strstr(p.text[MEM_T_ROUTE], "{{articles}}"));
    mem_prompts_free(&p);
    unlink(path);
    rmdir(dir);
  }
  CHECK(mem_prompts_load("/nonexistent", NULL, &p, &err) == HEARTH_ENOTFOUND);
  CHECK_MSG(strstr(err.msg, "segment.txt") != NULL, "%s", err.msg);
}

static void test_words_alike(void) {
  CHECK_NEAR(mem_words_alike("Alice", "Alice Smith"), 0.5, 1e-9);
  CHECK_NEAR(mem_words_alike("The Garden Shed", "garden shed"), 1.0, 1e-9);
  CHECK_NEAR(mem_words_alike("Alice", "Garden shed"), 0.0, 1e-9);
  CHECK_NEAR(mem_words_alike("", ""), 0.0, 1e-9);
}

static void test_stage_names(void) {
  CHECK_EQ_INT(mem_stage_parse("chunk"), MEM_SEGMENT);
  CHECK_EQ_INT(mem_stage_parse("link"), MEM_LINK);
  CHECK_EQ_INT(mem_stage_parse("nope"), -1);
  for (int s = 0; s < MEM_STAGES; s++) {
    CHECK_EQ_INT(mem_stage_parse(mem_stage_name(s)), s);
    json_t *schema = json_loads(mem_stage_schema(s), 0, NULL);
    CHECK_MSG(json_is_object(schema), "%s's schema", mem_stage_name(s));
    json_decref(schema);
  }
}

int main(void) {
  RUN(test_jsonl);
  RUN(test_anthropic_json);
  RUN(test_transcripts);
  RUN(test_slugs);
  RUN(test_article_roundtrip);
  RUN(test_prompts);
  RUN(test_words_alike);
  RUN(test_stage_names);
  fprintf(stderr, "%d checks, %d failures\n", test_checks, test_failures);
  return test_failures ? 1 : 0;
}
