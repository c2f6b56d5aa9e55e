/* toolcall.h — tool calls and reasoning parsed out of a model's generated
 * text, per model family, as it streams.
 *
 * A tc_parser takes the generated text in pieces of any size (a split may
 * fall inside a UTF-8 sequence or a marker) and reports events: content text,
 * reasoning text, and for each tool call its name, then pieces of its
 * arguments' JSON, then its end. Text that may be the start of a marker is
 * held back until it is known not to be one. The same bytes give the same
 * concatenated events whatever the split.
 *
 * Formats (exact syntax as parsed):
 *   hermes       <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call> (the key may also be
 *                "parameters", the keys may come in any order; arguments given as a JSON string that
 *                holds an object are accepted). Several objects may follow each other inside one block.
 *                The body of a <tool_call> block may also be qwen3_coder's <function=...> or glm's
 *                NAME\n<arg_key>... form: all three <tool_call> families accept all three bodies.
 *   qwen3_coder  <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>;
 *                a bare <function=NAME>... without <tool_call> is accepted too. One newline after
 *                <parameter=P> and one before </parameter> are not part of the value; a missing
 *                </parameter> is tolerated before "\n<parameter=" and "\n</function>".
 *   glm          <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call>
 *                (GLM-4.5/4.6; 4.7's form without the newlines too); values are stripped of
 *                surrounding whitespace.
 *   llama3       a reply that starts with {"name": NAME, "parameters": {...}} ("arguments" too),
 *                further calls after ';' or whitespace; <|python_tag|> followed by such an object.
 *                <|python_tag|> followed by anything else (a built-in tool's code) is dropped and
 *                the code kept as content.
 *   mistral      [TOOL_CALLS][{"name": NAME, "arguments": {...}}, ...] (also one bare object), and
 *                [TOOL_CALLS]NAME[ARGS]{...} (with an optional [CALL_ID]ID before [ARGS]);
 *                reasoning [THINK]...[/THINK].
 *   gemma4       <|tool_call>call:NAME{key:VALUE,...}<tool_call|> where a string is <|"|>...<|"|>,
 *                objects {k:v,...} and arrays [v,...] nest, and bare values are numbers, true,
 *                false, null (none/nil too); anything else bare is a string. Reasoning is the
 *                thought channel <|channel>thought\n...<channel|> (the "thought\n" label dropped).
 *   deepseek     <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```
 *                <｜tool▁call▁end｜>...<｜tool▁calls▁end｜> (R1 / V3), and V3.1's
 *                <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>; a call without the
 *                outer <｜tool▁calls▁begin｜> is accepted.
 *   harmony      messages <|start|>assistant<|channel|>C ... <|message|>BODY<|end|> (the reply may
 *                start at <|channel|>): C = analysis → reasoning, final or commentary → content, a
 *                header with to=functions.NAME (or any to=RECIPIENT) → a call whose body is the
 *                arguments' JSON, ended by <|call|>. <|return|> ends the reply.
 *   generic      {"tool_calls": [{"name": NAME, "arguments": {...}}, ...]} (also written
 *                {"tool_calls":[...]}), llama.cpp's generic shape, for templates with no call
 *                syntax of their own: the server describes the tools and this shape to the model and,
 *                for a forced call, holds it to it with a grammar. Reasoning as none.
 *   none         no call syntax; <think>...</think> reasoning only.
 * Reasoning for hermes, qwen3_coder, glm, deepseek, generic and none is <think>...</think>.
 *
 * Arguments: for JSON formats the model's own JSON is passed on as it arrives (raw control
 * characters inside its strings are escaped); for qwen3_coder, glm and gemma4 the JSON is
 * built: {"k": v, "k2": v2} where a value that is valid JSON (number, true, false, null,
 * object, array, string) is kept as that JSON and anything else becomes a string. A value
 * whose first character cannot start JSON is streamed as a string while it arrives; others
 * are sent when complete. The concatenated TC_CALL_ARGS of an ended call is always one valid
 * JSON object text (valid UTF-8; integers of at most 18 digits, so jansson reads it with
 * default flags).
 *
 * Whitespace: content and reasoning are trimmed at both ends; whitespace just before a call
 * is dropped (so a reply that is only calls has content ""), as is whitespace between calls.
 *
 * Malformed calls: a start marker followed by something that cannot be a call (a body that
 * is not JSON where JSON is due, invalid JSON, a name with spaces, more than 64 KiB before the
 * name and arguments start) is given back as content, marker included, when nothing of the
 * call was reported yet. Once TC_CALL_BEGIN was sent, an error in the arguments ends the call:
 * the arguments are completed to valid JSON from the last point where that was possible
 * (closing an open string and the open objects/arrays; a key without its value is left out)
 * and TC_CALL_END is sent; the rest of the broken call up to its end marker is dropped (for
 * formats without an end marker it becomes content again).
 *
 * Cut off (finish() inside a call): a call whose name is complete is ended, its arguments
 * completed as above ("{}" when none had started; a value being read is taken as it stands);
 * a call whose name is not yet complete is given back as content.
 *
 * Dropped, never reported: end-of-turn specials — <|eot_id|> <|eom_id|> <|im_end|> <|endoftext|>
 * <|end_of_text|> <end_of_turn> <turn|> <｜end▁of▁sentence｜> and, outside harmony (where they
 * are structure), <|end|> <|return|> <|call|>; also </s> (mistral, none), <eos> and
 * <|tool_response> (gemma4, none). With tools=false call markers are plain text; with
 * reasoning=false reasoning markers are plain text (harmony's analysis channel then becomes
 * content, its headers are still removed). */
#ifndef HEARTH_CHAT_TOOLCALL_H
#define HEARTH_CHAT_TOOLCALL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"
#include "base/status.h"

typedef enum tc_format {
  TC_NONE = 0,    /* no tool-call syntax known: all output is text (reasoning still parsed) */
  TC_HERMES,      /* Hermes 2/3, Qwen2.5, Qwen3 */
  TC_QWEN3_CODER, /* Qwen3-Coder, Qwen3.5 */
  TC_LLAMA3,      /* Llama 3.1/3.2/3.3 JSON calls */
  TC_MISTRAL,     /* [TOOL_CALLS] in both generations */
  TC_GEMMA4,      /* <|tool_call>call:NAME{...}<tool_call|> */
  TC_DEEPSEEK,    /* DeepSeek R1/V3/V3.1 */
  TC_GLM,         /* GLM-4.5+ <arg_key>/<arg_value> */
  TC_HARMONY,     /* gpt-oss channels */
  TC_GENERIC,     /* {"tool_calls": [{"name": ..., "arguments": {...}}]}: for templates without a syntax */
} tc_format;
#define TC_FORMAT_COUNT 10

/* How a forced call's rest is held to its syntax: which grammar serve/forced.c writes
 * (it knows GBNF and JSON Schema, which this module does not). */
typedef enum tc_grammar {
  TC_GRAMMAR_NONE = 0,  /* none: the forced opening alone */
  TC_GRAMMAR_JSON,      /* NAME, then the arguments as JSON under the tool's schema, then grammar_close */
  TC_GRAMMAR_XML,       /* NAME, then parameters named from the schema's properties (qwen3_coder's or glm's tags) */
  TC_GRAMMAR_DEEPSEEK,  /* either generation's call form, its markers as whole tokens */
  TC_GRAMMAR_HARMONY,   /* the recipient's name, <|constrain|>json?, <|message|>, JSON under the schema */
  TC_GRAMMAR_GEMMA4,    /* NAME{key:VALUE,...} in Gemma's notation */
} tc_grammar;
#define TC_GRAMMAR_COUNT 6

/* A marker the parser watches for, with its meaning (the parser's own id). */
typedef struct tc_marker {
  const char *text;
  int id;
} tc_marker;

/* One tool-call syntax: everything the parser, the forcing (serve/forced.c)
 * and the server know of a format, in one place. */
typedef struct tc_syntax {
  tc_format format;
  const char *name;              /* tc_format_name */
  /* the parser */
  tc_marker calls[2];            /* what opens calls in text (with tools); text NULL: unused */
  const char *think_open;        /* opens reasoning in text; NULL: nothing does (llama3; harmony's channels) */
  const char *think_close;       /* ends it */
  const char *const *drops;      /* end-of-turn markers dropped beside the common ones (NULL-ended) */
  bool channels;                 /* harmony: the reply is channels of messages; <|end|>, <|call|>,
                                  * <|return|> are structure */
  bool bare_json;                /* llama3: a reply that starts with '{' is a call */
  bool calls_object;             /* generic: the calls' array sits in an object, whose '}' follows it */
  bool thought_label;            /* gemma4: a thought channel starts with the label "thought\n", dropped */
  /* the forcing (tool_choice required / named) */
  const char *forced_open;       /* opens the reply as a call; NULL: no forcing */
  const char *forced_named;      /* after it for a named function: printf of the name; NULL: nothing */
  tc_grammar grammar;            /* how the rest is held to the syntax */
  const char *grammar_key;       /* JSON: the arguments' key the opening leaves for a picked name */
  const char *grammar_close;     /* JSON: GBNF after the call object's '}' */
  bool coder;                    /* XML: qwen3_coder's <function=NAME>/<parameter=P> (else glm's) */
  /* the server */
  bool special_markers;          /* its markers are special tokens the decoded text must keep */
  bool special_call_markers;     /* ... its call markers are, when tools are offered */
  bool server_describes;         /* the template has no syntax of its own: the server tells the model the
                                  * tools and the call's shape (generic) */
} tc_syntax;

/* The syntax of format f (TC_NONE's for an unknown one); never NULL. */
const tc_syntax *tc_syntax_of(tc_format f);

/* Picks the format from a chat template's source (the call syntax its tool section emits or
 * mentions); TC_NONE when none matches or src is NULL (never TC_GENERIC: the caller chooses it). A template with Llama 3 headers and no
 * other call syntax is TC_LLAMA3; functionary, firefunction and Command-R templates are TC_NONE. */
tc_format tc_format_detect(const char *template_src);
/* "none", "hermes", "qwen3_coder", "llama3", "mistral", "gemma4", "deepseek", "glm", "harmony", "generic". */
const char *tc_format_name(tc_format f);
/* The format of a name tc_format_name gives; -1 when unknown. */
int tc_format_from_name(const char *name);
/* Whether a rendered prompt ends inside an open reasoning block (ends with "<think>" or
 * "[THINK]", trailing whitespace aside), so the parser must start in reasoning. */
bool tc_prompt_opens_reasoning(const char *prompt, size_t len);

/* The text that, put at the start of the reply (appended to the prompt and fed
 * to the parser first), makes the reply a call in format f: of the function
 * `name`, or of one the model picks when name is NULL (the model goes on from
 * the name or the arguments; deepseek's opening stops before the name, whose
 * form differs between its generations). Appended to out; false for none.
 * name must be a valid tool name. */
bool tc_forced_call(tc_format f, const char *name, hbuf *out);

typedef enum tc_event_kind { TC_TEXT, TC_REASONING, TC_CALL_BEGIN, TC_CALL_ARGS, TC_CALL_END } tc_event_kind;
typedef struct tc_event {
  tc_event_kind kind;
  int index;        /* TC_CALL_*: the call's index in this reply, from 0 */
  const char *name; /* TC_CALL_BEGIN: the function's name, NUL-terminated, borrowed for the callback */
  const char *text; /* TC_TEXT / TC_REASONING: a delta; TC_CALL_ARGS: a piece of the arguments' JSON (borrowed) */
  size_t len;
} tc_event;
/* Nonzero: stop; feed/finish return that value and the parser reports nothing more. */
typedef int (*tc_event_fn)(void *ctx, const tc_event *ev);

typedef struct tc_opts {
  tc_format format;
  bool tools;        /* the request offered tools: parse calls (false: tool syntax is just text) */
  bool reasoning;    /* split reasoning (think tags, the family's reasoning channel) into TC_REASONING */
  bool in_reasoning; /* start inside a reasoning block (tc_prompt_opens_reasoning); needs reasoning */
} tc_opts;

typedef struct tc_parser tc_parser;
/* HEARTH_EINVAL for an unknown format. *out: tc_parser_free. */
int tc_parser_new(const tc_opts *o, tc_parser **out, herr *err);
/* Feeds the next piece of generated text. Events go to fn (may be NULL). Returns 0, the
 * callback's nonzero value, or HEARTH_ENOMEM. TC_TEXT/TC_REASONING/TC_CALL_ARGS pieces never
 * end inside a UTF-8 sequence that later bytes could complete (until finish). */
int tc_parser_feed(tc_parser *p, const char *s, size_t n, tc_event_fn fn, void *ctx, herr *err);
/* End of generation: ends or gives back a call in progress, flushes what was held back. */
int tc_parser_finish(tc_parser *p, tc_event_fn fn, void *ctx, herr *err);
int tc_parser_calls(const tc_parser *p); /* calls ended so far */
void tc_parser_free(tc_parser *p);

/* Whole-text convenience: *content (malloc'd, "" if none), *reasoning (malloc'd, NULL when
 * there was none), *calls: a new JSON array of {"name": str, "arguments": str} (each arguments
 * a JSON object's text). Any of the outputs may be NULL when not wanted. */
int tc_parse_all(const tc_opts *o, const char *text, size_t len, char **content, char **reasoning, json_t **calls,
                 herr *err);



#endif
