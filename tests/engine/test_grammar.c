/* test_grammar — GBNF compilation (errors name the problem), the matcher on
 * text and on tokens (masks agree with walking each token alone; split UTF-8;
 * end tokens only where the grammar may end), JSON Schema compilation (good
 * instances accepted, bad ones refused), and random walks over the masks that
 * must always give JSON that jansson reads and that has the schema's shape. */
#include <jansson.h>
#include <stdint.h>

#include "base/buf.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"
#include "engine/sample.h"
#include "test.h"

static grammar *compile(const char *text) {
  grammar *g = NULL;
  herr e = {0};
  int rc = grammar_compile(text, strlen(text), &g, &e);
  CHECK_MSG(rc == 0, "%s\n%s", e.msg, text);
  return g;
}

static bool compile_fails(const char *text, const char *needle) {
  grammar *g = NULL;
  herr e = {0};
  int rc = grammar_compile(text, strlen(text), &g, &e);
  grammar_free(g);
  if (rc && needle && !strstr(e.msg, needle)) fprintf(stderr, "message '%s' lacks '%s'\n", e.msg, needle);
  return rc != 0 && (!needle || strstr(e.msg, needle));
}

/* a byte vocabulary: token i < 256 is byte i; then some multi-byte tokens */
static const char *extra_tokens[] = {"{\"", "\":", "\",", "\"}", "true", "false", "null", "ab", "abc", "12", "3.", "\xC3",
                                     "\xA9", "\xC3\xA9", " \"", "\n  ", "[1", ", ", "name", "age", "\"name\"", "0", "-"};
#define N_EXTRA (sizeof extra_tokens / sizeof *extra_tokens)
#define END_ID ((int32_t)(256 + N_EXTRA))

static grammar_vocab *toy_vocab(void) {
  static char bytes[256];
  const char *ptrs[256 + N_EXTRA + 1];
  size_t lens[256 + N_EXTRA + 1];
  for (int i = 0; i < 256; i++) {
    bytes[i] = (char)i;
    ptrs[i] = &bytes[i];
    lens[i] = i ? 1 : 0; /* token 0 stands for a special token: no bytes */
  }
  for (size_t i = 0; i < N_EXTRA; i++) ptrs[256 + i] = extra_tokens[i], lens[256 + i] = strlen(extra_tokens[i]);
  ptrs[END_ID] = "", lens[END_ID] = 0; /* the end token */
  grammar_vocab *v = NULL;
  herr e = {0};
  CHECK(grammar_vocab_from_bytes(ptrs, lens, END_ID + 1, &v, &e) == 0);
  return v;
}

static bool accepts(const grammar *g, const grammar_vocab *v, const char *text, bool complete) {
  grammar_matcher *m = NULL;
  herr e = {0};
  int32_t end = END_ID;
  if (grammar_matcher_new(g, v, &end, 1, &m, &e)) return false;
  bool ok = grammar_matcher_accept_text(m, text, strlen(text), &e) == 0 && (!complete || grammar_matcher_can_end(m));
  grammar_matcher_free(m);
  return ok;
}

static void test_compile_errors(void) {
  CHECK(compile_fails("root ::= foo", "'foo' is used but never defined"));
  CHECK(compile_fails("a ::= \"x\"", "no 'root'"));
  CHECK(compile_fails("root ::= \"x\"\nroot ::= \"y\"", "defined twice"));
  CHECK(compile_fails("root ::= root \"x\" | \"y\"", "left-recursive"));
  CHECK(compile_fails("root ::= a\na ::= b? root\nb ::= \"x\"", "left-recursive"));
  CHECK(compile_fails("root ::= \"abc", "unterminated string"));
  CHECK(compile_fails("root ::= [abc", "unterminated character class"));
  CHECK(compile_fails("root ::= (\"a\"", "expected ')'"));
  CHECK(compile_fails("root ::= \"a\"{3,2}", "n < m"));
  CHECK(compile_fails("root ::= \"a\"{99999}", "above 4096"));
  CHECK(compile_fails("root ::= [z-a]", "backwards"));
  CHECK(compile_fails("root ::= \"\\q\"", "unknown escape"));
  CHECK(compile_fails("root ::= *", "follows nothing"));
  CHECK(compile_fails("::= \"a\"", "expected a rule definition"));
  CHECK(compile_fails("root ::= \"a\" )", "unbalanced"));
  CHECK(compile_fails("root ::= \"\"*", "empty string"));
  CHECK(compile_fails("", "no 'root'"));
  /* the line is named */
  CHECK(compile_fails("root ::= a\n\na ::= \"x\" @", "line 3"));
}

static void test_text_matching(void) {
  grammar_vocab *v = toy_vocab();
  grammar *g = compile(
      "# a comment\n"
      "root ::= greeting (\", \" name)* \"!\"\n"
      "greeting ::= \"hello\" | \"hi\"\n"
      "name ::= [A-Z] [a-z]{1,5}  # capitalised\n");
  CHECK(accepts(g, v, "hi!", true));
  CHECK(accepts(g, v, "hello, Bob, Alice!", true));
  CHECK(!accepts(g, v, "hello, bob!", true));
  CHECK(!accepts(g, v, "hello, Bobbbbb!", true)); /* 6 lowercase letters */
  CHECK(accepts(g, v, "hello, Bo", false));
  CHECK(!accepts(g, v, "hello, Bo", true));
  grammar_free(g);
  /* repetition forms, classes, escapes, any character */
  g = compile("root ::= \"a\"{2} \"b\"{1,} \"c\"{0,2} [^x-z\\n]\n  . \"\\x41\\u00e9\" [\\]\\-]?");
  CHECK(accepts(g, v, "aab0#A\xC3\xA9", true));
  CHECK(accepts(g, v, "aabbbcc0\xE2\x82\xAC" "A\xC3\xA9]", true));
  CHECK(!accepts(g, v, "abb0#A\xC3\xA9", true));
  CHECK(!accepts(g, v, "aabccc0#A\xC3\xA9", true));
  CHECK(!accepts(g, v, "aaby#A\xC3\xA9", true));
  CHECK(!accepts(g, v, "aab\n#A\xC3\xA9", true));
  grammar_free(g);
  /* invalid UTF-8 never matches, not even '.' */
  g = compile("root ::= .*");
  CHECK(accepts(g, v, "\xC3\xA9\xF0\x9F\x98\x80", true));
  CHECK(!accepts(g, v, "\xC3\x28", false));
  CHECK(!accepts(g, v, "\xC0\x80", false));          /* overlong */
  CHECK(!accepts(g, v, "\xED\xA0\x80", false));      /* surrogate */
  CHECK(accepts(g, v, "\xC3", false) && !accepts(g, v, "\xC3", true)); /* pending sequence cannot end */
  grammar_free(g);
  /* nested rules and right recursion deep enough */
  g = compile("root ::= list\nlist ::= \"[\" ( item ( \",\" item )* )? \"]\"\nitem ::= [0-9]+ | list");
  CHECK(accepts(g, v, "[1,[2,[3,[4,[]]]],55]", true));
  CHECK(!accepts(g, v, "[1,[2]", true));
  CHECK(accepts(g, v, "[1,[2]", false));
  hbuf deep = {0};
  for (int i = 0; i < 300; i++) hbuf_putc(&deep, '[');
  for (int i = 0; i < 300; i++) hbuf_putc(&deep, ']');
  CHECK(accepts(g, v, hbuf_str(&deep), true));
  hbuf_free(&deep);
  grammar_free(g);
  grammar_vocab_free(v);
}

/* The mask agrees with walking every token on its own; the end token only where the text may end. */
static void check_mask_consistent(const grammar *g, const grammar_vocab *v, const char *prefix) {
  grammar_matcher *m = NULL;
  herr e = {0};
  int32_t end = END_ID;
  CHECK(grammar_matcher_new(g, v, &end, 1, &m, &e) == 0);
  CHECK(grammar_matcher_accept_text(m, prefix, strlen(prefix), &e) == 0);
  const uint64_t *mask;
  int32_t n_allowed = 0, counted = 0;
  CHECK(grammar_matcher_mask(m, &mask, &n_allowed, &e) == 0);
  for (int32_t id = 0; id <= END_ID; id++) {
    bool in = mask[id / 64] >> (id % 64) & 1;
    counted += in;
    /* a fresh matcher, without the cached mask, decides alone */
    grammar_matcher *m2 = NULL;
    CHECK(grammar_matcher_new(g, v, &end, 1, &m2, &e) == 0);
    CHECK(grammar_matcher_accept_text(m2, prefix, strlen(prefix), &e) == 0);
    bool alone = grammar_matcher_allows(m2, id);
    bool took = grammar_matcher_accept(m2, id, &e) == 0;
    CHECK_MSG(in == alone && alone == took, "prefix '%s' token %d: mask %d, allows %d, accept %d", prefix, id, in, alone, took);
    grammar_matcher_free(m2);
  }
  CHECK_EQ_INT(counted, n_allowed);
  grammar_matcher_free(m);
}

static void test_masks(void) {
  grammar_vocab *v = toy_vocab();
  grammar *g = compile(
      "root ::= \"{\" ws \"\\\"name\\\"\" ws \":\" ws str ws \"}\"\n"
      "str ::= \"\\\"\" [^\"\\\\]* \"\\\"\"\nws ::= [ \\n]*");
  const char *prefixes[] = {"", "{", "{ ", "{\"na", "{\"name\":", "{\"name\": \"", "{\"name\": \"ab\xC3", "{\"name\": \"x\"", "{\"name\":\"x\"}"};
  for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++) check_mask_consistent(g, v, prefixes[i]);
  /* end only after the closing brace; nothing but the end after it */
  grammar_matcher *m = NULL;
  herr e = {0};
  int32_t end = END_ID;
  CHECK(grammar_matcher_new(g, v, &end, 1, &m, &e) == 0);
  CHECK(!grammar_matcher_allows(m, END_ID));
  CHECK(grammar_matcher_accept_text(m, "{\"name\":\"x\"}", 12, &e) == 0);
  const uint64_t *mask;
  int32_t n = 0;
  CHECK(grammar_matcher_mask(m, &mask, &n, &e) == 0);
  CHECK(n >= 1 && (mask[END_ID / 64] >> (END_ID % 64) & 1));
  CHECK(grammar_matcher_accept(m, 'x', &e) != 0);
  CHECK(grammar_matcher_accept(m, END_ID, &e) == 0);
  CHECK(grammar_matcher_accept(m, '{', &e) != 0);
  grammar_matcher_free(m);
  /* a token split inside a UTF-8 character: "\xC3" then "\xA9" */
  CHECK(grammar_matcher_new(g, v, &end, 1, &m, &e) == 0);
  CHECK(grammar_matcher_accept_text(m, "{\"name\":\"", 9, &e) == 0);
  int32_t c3 = -1, a9 = -1;
  for (size_t i = 0; i < N_EXTRA; i++) {
    if (!strcmp(extra_tokens[i], "\xC3")) c3 = 256 + (int32_t)i;
    if (!strcmp(extra_tokens[i], "\xA9")) a9 = 256 + (int32_t)i;
  }
  CHECK(grammar_matcher_allows(m, c3) && !grammar_matcher_allows(m, a9));
  CHECK(grammar_matcher_accept(m, c3, &e) == 0);
  CHECK(grammar_matcher_allows(m, a9) && !grammar_matcher_allows(m, '"') && !grammar_matcher_allows(m, c3));
  CHECK(grammar_matcher_accept(m, a9, &e) == 0);
  CHECK(grammar_matcher_accept(m, '"', &e) == 0);
  grammar_matcher_free(m);
  grammar_free(g);
  grammar_vocab_free(v);
}


/* Token terminals: a special token (no bytes) reachable only through <text> or
 * <[id]>, in the mask exactly where the grammar has it; a normal token named
 * by id matches as a whole token or by its bytes. */
static void test_token_terminals(void) {
  grammar_vocab *v = toy_vocab();
  herr e = {0};
  CHECK(grammar_vocab_name(v, 0, "<|call|>", &e) == 0);
  CHECK(grammar_vocab_name(v, END_ID + 1, "<|x|>", &e) != 0); /* outside the vocabulary */
  grammar *g = compile("root ::= \"f\" ( <|call|> [0-9]+ | \"x\" ) <[0]>? \"!\"\n");
  grammar_matcher *m = NULL;
  int32_t end = END_ID;
  CHECK(grammar_matcher_new(g, v, &end, 1, &m, &e) == 0);
  CHECK(!grammar_matcher_allows(m, 0));
  CHECK(grammar_matcher_accept(m, 'f', &e) == 0);
  const uint64_t *mask;
  int32_t n = 0;
  CHECK(grammar_matcher_mask(m, &mask, &n, &e) == 0);
  CHECK_EQ_INT(n, 2); /* the special token and "x" */
  CHECK((mask[0] & 1) && (mask['x' / 64] >> ('x' % 64) & 1));
  CHECK(grammar_matcher_accept(m, 0, &e) == 0);
  CHECK(!grammar_matcher_allows(m, 0) && grammar_matcher_allows(m, '7') && !grammar_matcher_allows(m, '!'));
  CHECK(grammar_matcher_accept(m, '7', &e) == 0);
  CHECK(grammar_matcher_allows(m, 0) && grammar_matcher_allows(m, '!'));
  CHECK(grammar_matcher_accept(m, 0, &e) == 0);
  CHECK(grammar_matcher_accept(m, 0, &e) != 0);
  CHECK(grammar_matcher_accept(m, '!', &e) == 0);
  CHECK(grammar_matcher_can_end(m));
  CHECK(grammar_matcher_accept(m, END_ID, &e) == 0);
  grammar_matcher_free(m);
  /* a normal token named by id, beside the same bytes spelled out */
  grammar_free(g);
  g = compile("root ::= <[97]> \"b\" | \"a\" \"c\"\n");
  CHECK(grammar_matcher_new(g, v, &end, 1, &m, &e) == 0);
  CHECK(grammar_matcher_accept(m, 'a', &e) == 0);
  CHECK(grammar_matcher_allows(m, 'b') && grammar_matcher_allows(m, 'c'));
  grammar_matcher_free(m);
  /* unknown names and ids are refused when the matcher is made; prefixes leave terminals alone */
  grammar_free(g);
  g = compile("root ::= <|nope|>\n");
  CHECK(grammar_matcher_new(g, v, &end, 1, &m, &e) != 0 && strstr(e.msg, "<|nope|>"));
  grammar_free(g);
  g = compile("root ::= <[99999]>\n");
  CHECK(grammar_matcher_new(g, v, &end, 1, &m, &e) != 0);
  grammar_free(g);
  CHECK(compile_fails("root ::= <>\n", "token terminal"));
  CHECK(compile_fails("root ::= <[12x]>\n", "token terminal"));
  CHECK(compile_fails("root ::= <|open\n", "token terminal"));
  hbuf pre = {0};
  const char *src = "root ::= <|call|> body\nbody ::= \"x\"\n";
  CHECK(grammar_prefix_rules(src, strlen(src), "p-", &pre) == 0);
  CHECK_EQ_STR(hbuf_str(&pre), "p-root ::= <|call|> p-body\np-body ::= \"x\"\n");
  hbuf_free(&pre);
  grammar_vocab_free(v);
}

static grammar *schema_grammar(const char *schema) {
  hbuf gbnf = {0};
  herr e = {0};
  int rc = json_schema_to_gbnf(schema, strlen(schema), &gbnf, &e);
  CHECK_MSG(rc == 0, "%s: %s", schema, e.msg);
  grammar *g = NULL;
  if (!rc) {
    rc = grammar_compile(hbuf_str(&gbnf), gbnf.len, &g, &e);
    CHECK_MSG(rc == 0, "%s\n%s", e.msg, hbuf_str(&gbnf));
  }
  hbuf_free(&gbnf);
  return g;
}

static bool schema_refused(const char *schema, const char *needle) {
  hbuf gbnf = {0};
  herr e = {0};
  int rc = json_schema_to_gbnf(schema, strlen(schema), &gbnf, &e);
  hbuf_free(&gbnf);
  if (rc && !strstr(e.msg, needle)) fprintf(stderr, "message '%s' lacks '%s'\n", e.msg, needle);
  return rc && strstr(e.msg, needle);
}

static const struct {
  const char *schema;
  const char *good[6];
  const char *bad[6];
} schema_cases[] = {
    {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}},\"required\":[\"name\",\"age\"]}",
     {"{\"name\":\"Bo\",\"age\":3}", "{ \"name\": \"a\\\"b\\u00e9\", \"age\": -12 }", "{\n\"name\": \"\",\n\"age\": 0\n}"},
     {"{\"name\":\"Bo\"}", "{\"age\":3,\"name\":\"Bo\"}", "{\"name\":\"Bo\",\"age\":3.5}", "{\"name\":\"Bo\",\"age\":03}",
      "{\"name\":\"Bo\",\"age\":3,\"x\":1}"}},
    /* whitespace is compact JSON's: one space or one newline, no indent, no tabs */
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"}}}}",
     {"{\"a\":[1,2]}", "{ \"a\" : [ 1 , 2 ] }", "{\n\"a\":\n[1,\n2]\n}"},
     {"{\n  \"a\":[1]}", "{\t\"a\":[1]}", "{  \"a\":[1]}", "{\"a\":[1,\n\t2]}", "{\"a\": \n[1]}"}},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"null\"},\"c\":{\"enum\":[\"x\",1,[true]]}}}",
     {"{}", "{\"b\":null}", "{\"a\":true,\"c\":[true]}", "{\"c\":\"x\"}", "{\"a\":false,\"b\":null,\"c\":1}"},
     {"{,}", "{\"c\":\"y\"}", "{\"b\":null,\"a\":true}", "{\"a\":true,}"}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":2,\"maxItems\":3}",
     {"[1,2]", "[1.5, -2e10, 0.25]", "[0,0]"},
     {"[1]", "[1,2,3,4]", "[]", "[1,]", "[01,2]"}},
    {"{\"type\":\"integer\",\"minimum\":-5,\"maximum\":123}",
     {"-5", "0", "99", "123", "-1", "7"},
     {"-6", "124", "200", "1000", "-0", "1.0"}},
    {"{\"type\":\"integer\",\"exclusiveMinimum\":10}",
     {"11", "99", "100000"},
     {"10", "9", "0", "-11"}},
    {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}",
     {"0", "1", "0.5", "1.000", "0.999"},
     {"1.5", "-0.1", "2", "1.01", "1e0"}},
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}",
     {"\"ab\"", "\"abc\"", "\"\\n\\t\""},
     {"\"a\"", "\"abcd\"", "\"\""}},
    {"{\"type\":\"string\",\"pattern\":\"^[A-Z][a-z]+-\\\\d{2,3}$\"}",
     {"\"Ab-12\"", "\"Xyz-999\""},
     {"\"ab-12\"", "\"Ab-1\"", "\"Ab-1234\"", "\"xAb-12\""}},
    {"{\"type\":\"string\",\"format\":\"date\"}", {"\"2024-02-28\"", "\"1999-12-01\""}, {"\"2024-13-01\"", "\"2024-1-01\""}},
    {"{\"type\":\"string\",\"format\":\"uuid\"}", {"\"123e4567-e89b-12d3-a456-426614174000\""}, {"\"123e4567\""}},
    {"{\"type\":[\"string\",\"null\"]}", {"\"x\"", "null"}, {"1", "nul"}},
    {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"array\",\"items\":{\"type\":\"boolean\"}}]}",
     {"5", "[true,false]", "[]"}, {"\"5\"", "[1]"}},
    {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
     {"{\"v\":1,\"next\":null}", "{\"v\":1,\"next\":{\"v\":2,\"next\":{\"v\":3,\"next\":null}}}"},
     {"{\"v\":1}", "{\"v\":1,\"next\":{\"v\":2}}"}},
    {"{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"fixed \\\"q\\\"\"}},\"required\":[\"k\"],\"additionalProperties\":{\"type\":\"integer\"}}",
     {"{\"k\":\"fixed \\\"q\\\"\"}", "{\"k\":\"fixed \\\"q\\\"\",\"z\":3,\"y\":-1}"},
     {"{\"k\":\"fixed\"}", "{\"k\":\"fixed \\\"q\\\"\",\"z\":\"s\"}"}},
    {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"items\":false}",
     {"[\"a\",1]", "[\"a\"]", "[]"}, {"[1,\"a\"]", "[\"a\",1,2]"}},
    {"{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},{\"properties\":{\"b\":{\"type\":\"string\"}},\"required\":[\"b\"]}]}",
     {"{\"a\":1,\"b\":\"x\"}"}, {"{\"a\":1}", "{\"b\":\"x\"}"}},
    {"true", {"{\"any\":[1,{\"x\":null}]}", "\"s\"", "-0.5e-3", "[]"}, {"{", "tru"}},
};

static void test_schemas(void) {
  grammar_vocab *v = toy_vocab();
  for (size_t i = 0; i < sizeof schema_cases / sizeof *schema_cases; i++) {
    grammar *g = schema_grammar(schema_cases[i].schema);
    if (!g) continue;
    for (int k = 0; k < 6 && schema_cases[i].good[k]; k++)
      CHECK_MSG(accepts(g, v, schema_cases[i].good[k], true), "schema %zu should accept %s", i, schema_cases[i].good[k]);
    for (int k = 0; k < 6 && schema_cases[i].bad[k]; k++)
      CHECK_MSG(!accepts(g, v, schema_cases[i].bad[k], true), "schema %zu should refuse %s", i, schema_cases[i].bad[k]);
    grammar_free(g);
  }
  grammar_vocab_free(v);
  CHECK(schema_refused("{\"type\":\"integer\",\"multipleOf\":3}", "multipleOf"));
  CHECK(schema_refused("{\"$ref\":\"https://example.com/s.json\"}", "does not point into this schema"));
  CHECK(schema_refused("{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems"));
  CHECK(schema_refused("{\"type\":\"string\",\"pattern\":\"(?=x)\"}", "pattern"));
  CHECK(schema_refused("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", "pattern"));
  CHECK(schema_refused("{\"type\":\"wat\"}", "unknown type"));
  CHECK(schema_refused("{\"type\":\"object\",\"required\":[\"x\"]}", "required property 'x'"));
  CHECK(schema_refused("false", "admits nothing"));
  CHECK(schema_refused("{", "not JSON"));
  CHECK(schema_refused("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "bounds"));
  /* nesting: 64 levels compile, 65 and 1000 are refused (before any time is spent on them) */
  for (int levels = 64; levels <= 1000; levels = levels == 64 ? 65 : 1000) {
    hbuf deep = {0};
    for (int i = 0; i < levels - 1; i++) hbuf_puts(&deep, "{\"type\":\"array\",\"items\":");
    hbuf_puts(&deep, "{\"type\":\"integer\"}");
    for (int i = 0; i < levels - 1; i++) hbuf_puts(&deep, "}");
    if (levels == 64) {
      grammar *g = schema_grammar(hbuf_str(&deep));
      CHECK(g != NULL);
      grammar_free(g);
    } else {
      CHECK(schema_refused(hbuf_str(&deep), "deeper than 64 levels"));
    }
    hbuf_free(&deep);
    if (levels == 1000) break;
  }
}

/* Random walks: tokens drawn from the mask until the end token; the text must parse as JSON
 * and, for the object schema, have its two required members. */
static void test_random_walks(void) {
  grammar_vocab *v = toy_vocab();
  const char *schema =
      "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},\"age\":{\"type\":\"integer\"},"
      "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},\"maxItems\":3}},\"required\":[\"name\",\"age\"]}";
  grammar *g = schema_grammar(schema);
  sample_rng rng;
  sample_rng_seed(&rng, 7);
  int ended = 0;
  for (int walk = 0; g && walk < 200; walk++) {
    grammar_matcher *m = NULL;
    herr e = {0};
    int32_t end = END_ID;
    CHECK(grammar_matcher_new(g, v, &end, 1, &m, &e) == 0);
    hbuf text = {0};
    bool done = false;
    for (int step = 0; step < 400 && !done; step++) {
      const uint64_t *mask;
      int32_t n = 0;
      if (grammar_matcher_mask(m, &mask, &n, &e) || n == 0) {
        CHECK_MSG(false, "no token allowed after '%s'", hbuf_str(&text));
        break;
      }
      /* prefer the end token once it is allowed, half the time */
      int32_t pick = -1;
      if ((mask[END_ID / 64] >> (END_ID % 64) & 1) && sample_rng_uniform(&rng) < 0.5) pick = END_ID;
      while (pick < 0) {
        int32_t id = (int32_t)(sample_rng_next(&rng) % (uint64_t)(END_ID + 1));
        if (mask[id / 64] >> (id % 64) & 1) pick = id;
      }
      CHECK(grammar_matcher_accept(m, pick, &e) == 0);
      if (pick == END_ID) done = true;
      else if (pick < 256) hbuf_putc(&text, (char)pick);
      else hbuf_append(&text, extra_tokens[pick - 256], strlen(extra_tokens[pick - 256]));
    }
    if (done) {
      ended++;
      json_error_t je;
      json_t *j = json_loadb(hbuf_str(&text), text.len, 0, &je);
      CHECK_MSG(j && json_is_object(j), "not a JSON object: %s (%s)", hbuf_str(&text), je.text);
      CHECK_MSG(j && json_is_string(json_object_get(j, "name")) && json_is_integer(json_object_get(j, "age")),
                "shape: %s", hbuf_str(&text));
      CHECK(!j || json_string_length(json_object_get(j, "name")) <= 6 * 6);
      json_decref(j);
    }
    hbuf_free(&text);
    grammar_matcher_free(m);
  }
  CHECK(ended > 0);
  grammar_free(g);
  grammar_vocab_free(v);
}

static void test_prefix_rules(void) {
  const char *g = "root ::= a{2,3} \"b c\" [x-z]? # note d\na ::= \"q\" | root-x\nroot-x ::= \"{\"";
  hbuf out = {0};
  CHECK(grammar_prefix_rules(g, strlen(g), "p-", &out) == 0);
  CHECK_EQ_STR(hbuf_str(&out),
               "p-root ::= p-a{2,3} \"b c\" [x-z]? # note d\np-a ::= \"q\" | p-root-x\np-root-x ::= \"{\"");
  /* two prefixed grammars combine */
  hbuf both = {0};
  hbuf_puts(&both, "root ::= p-root | q-root\n");
  hbuf_append(&both, hbuf_str(&out), out.len);
  hbuf_putc(&both, '\n');
  CHECK(grammar_prefix_rules(g, strlen(g), "q-", &both) == 0);
  grammar *gr = compile(hbuf_str(&both));
  grammar_vocab *v = toy_vocab();
  CHECK(gr && accepts(gr, v, "qq{b cy", true) && !accepts(gr, v, "qb c", true));
  grammar_free(gr);
  grammar_vocab_free(v);
  hbuf_free(&out);
  hbuf_free(&both);
}

int main(void) {
  RUN(test_compile_errors);
  RUN(test_text_matching);
  RUN(test_masks);
  RUN(test_token_terminals);
  RUN(test_schemas);
  RUN(test_random_walks);
  RUN(test_prefix_rules);
  TEST_MAIN_END();
}
