/* forced.c — the grammars of forced tool calls (see forced.h): by the call
 * syntax's grammar kind (chat/toolcall.h tc_syntax), the tool names the
 * opening leaves open, the arguments (JSON under each tool's schema, or named
 * XML parameters) and the call's close. Knows GBNF and the markers inside a
 * call; the JSON syntaxes' keys and closes come from their descriptors. The
 * server compiles and uses what it writes. */
#include "serve/forced.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "structured/grammar.h"
#include "structured/json_schema.h"

/* A GBNF literal of s (as text inside "...") appended to b. */
static void gbnf_text(hbuf *b, const char *s) {
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') hbuf_putc(b, '\\'), hbuf_putc(b, (char)c);
    else if (c == '\n') hbuf_puts(b, "\\n");
    else if (c < 0x20) hbuf_printf(b, "\\x%02X", c);
    else hbuf_putc(b, (char)c);
  }
}

/* The end of every maker below: the grammar g to out when it covers some tool
 * and nothing ran out of memory; g and alts freed. */
static bool grammar_out(int n_tools, hbuf *g, hbuf *alts, hbuf *out) {
  bool ok = n_tools > 0 && !g->oom && !alts->oom;
  if (ok) hbuf_append(out, hbuf_str(g), g->len);
  hbuf_free(g);
  hbuf_free(alts);
  return ok;
}

/* hermes / llama3 / mistral / generic: "NAME\", \"KEY\": " ARGS "}" CLOSE (the syntax's key and close). */
static bool forced_json(const tc_syntax *syn, const json_t *tools, const char *name, hbuf *out) {
  hbuf g = {0}, alts = {0};
  size_t i;
  json_t *t;
  int n = 0;
  json_array_foreach(tools, i, t) {
    json_t *fn = json_object_get(t, "function");
    const char *nm = json_string_value(json_object_get(fn, "name"));
    json_t *params = json_object_get(fn, "parameters");
    if (!nm || (name && strcmp(nm, name))) continue;
    char *schema = params ? json_dumps(params, JSON_COMPACT) : strdup("{\"type\":\"object\"}");
    hbuf one = {0};
    int rc = schema ? json_schema_to_gbnf(schema, strlen(schema), &one, NULL) : -1;
    free(schema);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "t%d-", n);
    if (!rc) rc = grammar_prefix_rules(hbuf_str(&one), one.len, prefix, &g);
    hbuf_free(&one);
    if (rc) continue; /* a schema that cannot be followed: that tool is left out */
    if (n++) hbuf_puts(&alts, " | ");
    if (!name) { /* the name, as the opening left it to the model: its JSON string's inside */
      json_t *lit = json_string(nm);
      char *q = lit ? json_dumps(lit, JSON_ENCODE_ANY) : NULL;
      json_decref(lit);
      if (q) {
        q[strlen(q) - 1] = 0;
        hbuf_putc(&alts, '"');
        gbnf_text(&alts, q + 1);
        hbuf_printf(&alts, "\\\", \\\"%s\\\": \" ", syn->grammar_key);
      }
      free(q);
    }
    hbuf_printf(&alts, "%sroot", prefix);
  }
  if (n) hbuf_printf(&g, "root ::= ( %s ) \"}\"%s\n", hbuf_str(&alts), syn->grammar_close);
  return grammar_out(n, &g, &alts, out);
}

/* The schema's property names as GBNF alternatives ("a" | "b" | ...) into keys; nothing without properties. */
static void prop_names(const json_t *props, hbuf *keys) {
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)props, k, v) {
    hbuf_puts(keys, keys->len ? " | \"" : "\"");
    gbnf_text(keys, k);
    hbuf_putc(keys, '"');
  }
}

/* qwen3_coder / glm: the name, then parameters named from the schema's properties. */
static bool forced_xml(const tc_syntax *syn, const json_t *tools, const char *name, hbuf *out) {
  hbuf g = {0}, alts = {0};
  size_t i;
  json_t *t;
  int n = 0;
  bool coder = syn->coder;
  json_array_foreach(tools, i, t) {
    json_t *fn = json_object_get(t, "function");
    const char *nm = json_string_value(json_object_get(fn, "name"));
    json_t *props = json_object_get(json_object_get(fn, "parameters"), "properties");
    if (!nm || (name && strcmp(nm, name))) continue;
    hbuf keys = {0};
    prop_names(props, &keys);
    if (n++) hbuf_puts(&alts, " | ");
    hbuf_puts(&alts, "( ");
    if (!name) {
      hbuf_putc(&alts, '"');
      gbnf_text(&alts, nm);
      hbuf_puts(&alts, coder ? ">\\n\" " : "\\n\" ");
    }
    if (keys.len) {
      if (coder)
        hbuf_printf(&alts, "( \"<parameter=\" ( %s ) \">\\n\" value \"\\n</parameter>\\n\" )*", hbuf_str(&keys));
      else
        hbuf_printf(&alts, "( \"<arg_key>\" ( %s ) \"</arg_key>\" \"\\n\"? \"<arg_value>\" value \"</arg_value>\" \"\\n\"? )*",
                    hbuf_str(&keys));
    } else {
      hbuf_puts(&alts, "\"\"");
    }
    hbuf_puts(&alts, " )");
    hbuf_free(&keys);
  }
  if (n) {
    hbuf_printf(&g, "root ::= ( %s ) %s\n", hbuf_str(&alts), coder ? "\"</function>\\n</tool_call>\"" : "\"</tool_call>\"");
    /* a value: text that does not start a closing tag */
    hbuf_puts(&g, "value ::= ( [^<] | \"<\" [^/] )*\n");
  }
  return grammar_out(n, &g, &alts, out);
}

/* Each listed tool (or the named one) whose schema compiles: its JSON name
 * literal's inside in *lit (as GBNF text), its arguments' rules prefixed "tN-"
 * into g (root "tN-root"). Calls fn(i, tool name, literal, user) per tool;
 * returns how many. */
typedef void (*tool_fn)(int n, const char *nm, json_t *fn_obj, void *user);

static int each_tool(const json_t *tools, const char *name, tool_fn fn, void *user) {
  size_t i;
  json_t *t;
  int n = 0;
  json_array_foreach(tools, i, t) {
    json_t *fo = json_object_get(t, "function");
    const char *nm = json_string_value(json_object_get(fo, "name"));
    if (!nm || (name && strcmp(nm, name))) continue;
    fn(n++, nm, fo, user);
  }
  return n;
}

typedef struct json_calls {
  hbuf *g, *alts;
  const char *pattern; /* per tool: printf of (name literal, args rule) */
  int n;
} json_calls;

/* The tool's arguments as JSON under its schema, rules "tN-..." into g, and its alternative. */
static void json_call_alt(int n, const char *nm, json_t *fo, void *user) {
  json_calls *c = user;
  json_t *params = json_object_get(fo, "parameters");
  char *schema = params ? json_dumps(params, JSON_COMPACT) : strdup("{\"type\":\"object\"}");
  hbuf one = {0};
  int rc = schema ? json_schema_to_gbnf(schema, strlen(schema), &one, NULL) : -1;
  free(schema);
  char prefix[32];
  snprintf(prefix, sizeof prefix, "t%d-", n);
  if (!rc) rc = grammar_prefix_rules(hbuf_str(&one), one.len, prefix, c->g);
  hbuf_free(&one);
  if (rc) return; /* a schema that cannot be followed: that tool is left out */
  hbuf lit = {0};
  gbnf_text(&lit, nm);
  char rule[40];
  snprintf(rule, sizeof rule, "%sroot", prefix);
  if (c->n++) hbuf_puts(c->alts, " | ");
  hbuf_printf(c->alts, c->pattern, hbuf_str(&lit), rule);
  hbuf_free(&lit);
}

/* deepseek: after `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>`, a call in either
 * generation's form — R1/V3 `function<｜tool▁sep｜>NAME\n```json\nARGS\n```` or
 * V3.1 `NAME<｜tool▁sep｜>ARGS` —, its end, more calls unless one was named,
 * and the calls' end. The markers as whole tokens. */
#define DS_SEP "<\uff5ctool\u2581sep\uff5c>"
#define DS_CALL_BEGIN "<\uff5ctool\u2581call\u2581begin\uff5c>"
#define DS_CALL_END "<\uff5ctool\u2581call\u2581end\uff5c>"
#define DS_CALLS_END "<\uff5ctool\u2581calls\u2581end\uff5c>"

static bool forced_deepseek(const tc_syntax *syn, const json_t *tools, const char *name, hbuf *out) {
  (void)syn;
  hbuf g = {0}, alts = {0};
  json_calls c = {&g, &alts,
                  "( \"function\" " DS_SEP " \"%1$s\\n```json\\n\" %2$s \"\\n```\" | \"%1$s\" " DS_SEP " %2$s )", 0};
  each_tool(tools, name, json_call_alt, &c);
  if (c.n) {
    hbuf_printf(&g, "call ::= ( %s ) " DS_CALL_END "\n", hbuf_str(&alts));
    hbuf_puts(&g, name ? "root ::= call " DS_CALLS_END "\n" : "root ::= call ( " DS_CALL_BEGIN " call )* " DS_CALLS_END "\n");
  }
  return grammar_out(c.n, &g, &alts, out);
}

/* harmony: after `<|channel|>commentary to=functions.`, the name (unless named,
 * then the opening has it), ` <|constrain|>json` (optional), `<|message|>` and
 * the arguments as JSON. The call's end, <|call|>, is one of the model's end
 * tokens, allowed once the arguments are complete. */
static bool forced_harmony(const tc_syntax *syn, const json_t *tools, const char *name, hbuf *out) {
  (void)syn;
  hbuf g = {0}, alts = {0};
  json_calls c = {&g, &alts, name ? "( head %2$s )" : "( \"%1$s\" head %2$s )", 0};
  each_tool(tools, name, json_call_alt, &c);
  if (c.n) {
    hbuf_puts(&g, "head ::= ( \" \" <|constrain|> \"json\" )? <|message|>\n");
    hbuf_printf(&g, "root ::= %s\n", hbuf_str(&alts));
  }
  return grammar_out(c.n, &g, &alts, out);
}

/* gemma4: after `<|tool_call>call:` (and NAME{ when named), the name and `{`,
 * then `key:VALUE` pairs with the keys the tool's schema names (any key
 * without properties), values in Gemma's notation (strings between <|"|>
 * tokens, numbers, true / false / null, {..} and [..] nesting), `}` and
 * <tool_call|>. Value types are not checked against the schema. */
static bool forced_gemma4(const tc_syntax *syn, const json_t *tools, const char *name, hbuf *out) {
  (void)syn;
  hbuf g = {0}, alts = {0};
  size_t i;
  json_t *t;
  int n = 0;
  json_array_foreach(tools, i, t) {
    json_t *fn = json_object_get(t, "function");
    const char *nm = json_string_value(json_object_get(fn, "name"));
    json_t *props = json_object_get(json_object_get(fn, "parameters"), "properties");
    if (!nm || (name && strcmp(nm, name))) continue;
    hbuf keys = {0};
    prop_names(props, &keys);
    const char *key = keys.len ? hbuf_str(&keys) : "okey";
    if (n++) hbuf_puts(&alts, " | ");
    hbuf_puts(&alts, "( ");
    if (!name) {
      hbuf_putc(&alts, '"');
      gbnf_text(&alts, nm);
      hbuf_puts(&alts, "{\" ");
    }
    hbuf_printf(&alts, "( ( %s ) \":\" value ( \",\" ( %s ) \":\" value )* )? )", key, key);
    hbuf_free(&keys);
  }
  if (n) {
    hbuf_printf(&g, "root ::= ( %s ) \"}\" <tool_call|>\n", hbuf_str(&alts));
    hbuf_puts(&g, "value ::= str | num | \"true\" | \"false\" | \"null\" | obj | arr\n"
                  "str ::= <|\"|> [^\\x00]* <|\"|>\n"
                  "num ::= \"-\"? [0-9]+ ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
                  "okey ::= [A-Za-z_] [A-Za-z0-9_]*\n"
                  "obj ::= \"{\" ( okey \":\" value ( \",\" okey \":\" value )* )? \"}\"\n"
                  "arr ::= \"[\" ( value ( \",\" value )* )? \"]\"\n");
  }
  return grammar_out(n, &g, &alts, out);
}

/* The grammar makers, by the syntax's tc_grammar. */
typedef bool (*grammar_maker)(const tc_syntax *syn, const json_t *tools, const char *name, hbuf *out);
static const grammar_maker MAKERS[TC_GRAMMAR_COUNT] = {
    [TC_GRAMMAR_JSON] = forced_json,         [TC_GRAMMAR_XML] = forced_xml,
    [TC_GRAMMAR_DEEPSEEK] = forced_deepseek, [TC_GRAMMAR_HARMONY] = forced_harmony,
    [TC_GRAMMAR_GEMMA4] = forced_gemma4,
};

bool serve_forced_grammar(tc_format f, const json_t *tools, const char *name, hbuf *out) {
  const tc_syntax *syn = tc_syntax_of(f);
  grammar_maker make = MAKERS[syn->grammar];
  return json_is_array(tools) && make && make(syn, tools, name, out);
}
