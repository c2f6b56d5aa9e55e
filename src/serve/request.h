/* request.h — an OpenAI request body (chat or text completion) parsed and
 * validated into a plain struct, and errors in OpenAI's shape
 * {"error": {"message", "type", "param", "code"}} with their HTTP status. */
#ifndef HEARTH_SERVE_REQUEST_H
#define HEARTH_SERVE_REQUEST_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "serve/engine.h"

typedef enum serve_kind { SERVE_CHAT = 0, SERVE_COMPLETION = 1 } serve_kind;

/* An error answered to the client. */
typedef struct serve_fail {
  int status;       /* HTTP status */
  const char *type; /* static: "invalid_request_error", "authentication_error", ... */
  char param[128];  /* "" when no single field is at fault */
  char code[64];    /* "" when none */
  char message[1024];
} serve_fail;

/* Fills f and returns status. */
int serve_fail_set(serve_fail *f, int status, const char *type, const char *param, const char *code, const char *fmt,
                   ...) __attribute__((format(printf, 6, 7)));
/* The error as a JSON body (malloc'd, caller frees; NULL on out of memory). */
char *serve_fail_json(const serve_fail *f);

/* How the model may call the request's tools. */
typedef enum serve_tool_choice {
  SERVE_TOOLS_AUTO = 0, /* it decides (the default when tools are given) */
  SERVE_TOOLS_NONE,     /* it must not: tool syntax in the output stays text */
  SERVE_TOOLS_REQUIRED, /* at least one call (Anthropic "any") */
  SERVE_TOOLS_NAMED     /* a call of tool_name */
} serve_tool_choice;

/* Choices one request may ask for at most: prompts × n. */
#define SERVE_MAX_CHOICES 128

/* One completion prompt: text, or token ids (text "" then). */
typedef struct serve_prompt {
  char *text;   /* owned by the request */
  int32_t *ids; /* owned by the request; NULL unless token ids */
  size_t n_ids;
} serve_prompt;

typedef struct serve_request {
  serve_kind kind;
  char *model;             /* owned; NULL when absent */
  serve_message *messages; /* owned (chat) */
  int nmessages;
  char *prompt;            /* owned (completion); "" with prompt_ids */
  int32_t *prompt_ids;     /* owned, NULL unless the completion's prompt is token ids */
  size_t n_prompt_ids;
  serve_prompt *prompts;   /* owned (completion): a prompt array's prompts after the first; NULL when one */
  int n_prompts;           /* completion: prompts in the request (prompt / prompt_ids are the first); else 0 */
  bool stream;
  bool include_usage;      /* stream_options.include_usage */
  bool echo;               /* completion: prepend the prompt to the text */
  bool return_token_ids;   /* vLLM's: the reply carries prompt_token_ids and each choice's token_ids */
  /* fill-in-the-middle (completion): `suffix` on /v1/completions (each prompt is the prefix), or
   * POST /infill's fields (the prompt is the middle's start); the prompts become token ids laid
   * out by the engine's fim_prompt before generating */
  bool fim;
  bool infill;             /* POST /infill: answered in llama.cpp's shapes */
  char *suffix;            /* owned; NULL unless fim */
  char *fim_prefix;        /* owned: /infill's input_prefix; NULL on /v1/completions */
  hearth_fim_chunk *fim_extra; /* owned, strings too: /infill's input_extra */
  int n_fim_extra;
  serve_sampling sampling; /* stop and bias arrays owned here */
  int n;                   /* choices per prompt (1..SERVE_MAX_CHOICES); prompts × n at most SERVE_MAX_CHOICES */
  int best_of;             /* completion: continuations made per prompt (>= n; prompts × best_of at most
                            * SERVE_MAX_CHOICES), of which the n of highest cumulative logprob are returned */
  char *user;              /* owned; NULL when absent */
  json_t *tools;           /* owned; NULL when none: [{"type":"function","function":{name, description?, parameters}}] */
  serve_tool_choice tool_choice;
  bool no_generation_prompt;   /* chat: add_generation_prompt false: no generation prompt after the messages
                                * (false, the default of every protocol: the template's generation prompt) */
  bool one_tool_call;          /* chat: parallel_tool_calls false: at most one call in the reply */
  bool continue_final_message; /* chat: the model continues the final message (prefill); no generation prompt */
  char *tool_name;         /* owned: the function tool_choice names (SERVE_TOOLS_NAMED) */
  json_t *template_kwargs; /* owned; NULL when none: chat_template_kwargs, plus reasoning_effort /
                            * enable_thinking as the request set them */
  json_t *json_schema;     /* owned; NULL: free text. response_format json_schema's schema, or for
                            * json_object an empty schema (any JSON object) */
  char *grammar;           /* owned; NULL when none: a GBNF grammar the output must follow (extension) */
  char *gbnf;              /* owned; NULL when free text: the grammar the engine gets (`grammar`, or
                              json_schema compiled); checked to compile; sampling.grammar points here */
  hearth_media *media;     /* owned (url and name strings too): the messages' images, audio and video in
                              document order; each message's parts hold their places */
  int n_media, cap_media;
} serve_request;

/* Parses body[0..len) as a request of `kind`. On failure returns nonzero with
 * f filled (status 400, param naming the field) and leaves *req empty. */
int serve_request_parse(const char *body, size_t len, serve_kind kind, serve_request *req, serve_fail *f);
void serve_request_free(serve_request *req);
/* The i-th prompt of a completion request (0 <= i < n_prompts), borrowed. */
void serve_request_prompt(const serve_request *req, int i, serve_prompt *out);
/* From req's json_schema or grammar: the GBNF the engine gets (req->gbnf,
 * sampling.grammar), compiled once to check it; 400 naming response_format or
 * grammar when the schema or grammar cannot be followed. Nothing when neither. */
int serve_output_grammar(serve_request *req, serve_fail *f);

/* Shared by the protocol parsers (OpenAI here, Anthropic, Responses, embeddings, signal). */

/* A medium of a message: kind and url (a data URL, base64, a path or an http(s) URL: the engine
 * decides what it may fetch), named `where` ("messages[1].content[0]"), appended to r->media and
 * its part ({"type":"image"} / "audio" / "video") to *parts (made when NULL). */
int serve_media_add(serve_request *r, json_t **parts, hearth_media_kind kind, const char *url, const char *where,
                    serve_fail *f);
/* A text part appended to *parts (made when NULL). */
void serve_text_part(json_t **parts, const char *text, size_t len);

/* A 400 invalid_request_error naming param (NULL: none), message from fmt; returns 400. */
int serve_bad(serve_fail *f, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Checks one function tool's name (non-empty, at most 64 of [A-Za-z0-9_.:-])
 * and parameters (a JSON Schema object) and appends it to req->tools in the
 * OpenAI shape the chat templates read. at: the field for messages. */
int serve_tool_add(serve_request *req, const char *name, json_t *description, json_t *parameters, const char *at,
                   serve_fail *f);
/* Whether req->tools has a function of that name. */
bool serve_tool_known(const serve_request *req, const char *name);

/* How a protocol writes its tools and tool_choice, for the one reader of
 * them (serve_tools_parse): where a tool's name, description and schema sit,
 * the tool type it serves, its tool_choice forms, and the words of its
 * refusals (each a printf: of the tool's place, "tools[0]" / "tools.0", where
 * it names one; of the tool_choice's name in unknown_name). Filled once by
 * each protocol: OpenAI chat (serve_tools_openai), Responses, Anthropic. */
typedef struct serve_tools_dialect {
  const char *at;              /* a tool's place, printf of its index: "tools[%zu]" */
  const char *fn;              /* the member holding name, description and schema; NULL: the tool itself */
  const char *schema;          /* the schema's member: "parameters", "input_schema" */
  bool schema_required;
  const char *type;            /* the one tool type served: "function", "custom" */
  bool untyped_ok;             /* a tool without a type is of it (Anthropic's client tools) */
  size_t max;                  /* tools at most; 0: any number */
  bool no_functions;           /* refuse OpenAI's deprecated "functions" */
  bool field_first;            /* a tool's other refusals (serve_tool_add's) begin with its place */
  const char *not_array, *too_many, *no_functions_msg;
  const char *no_type;         /* (at) a tool with no type where one is needed */
  const char *other_type;      /* (at, type) a type it does not serve ("?" when not a string) */
  const char *no_name;         /* (at) */
  const char *no_schema;       /* (at) */
  /* tool_choice: "auto" / "none" / "required" as strings (strings), and as objects
   * {TYPEKEY: word} (words[i] → choices[i], NULL-ended; no words: any object names a function) */
  bool strings;
  const char *const *words;
  const serve_tool_choice *choices;
  const char *name_in;         /* the member holding a named choice's name ("function"); NULL: the object */
  bool no_tools_first;         /* a named choice without tools is refused as no_tools, not unknown_name */
  const char *bad_string;      /* a string that is not one of the three */
  const char *bad_object;      /* an object of no known form (and, without strings, anything else) */
  const char *bad_word;        /* an object whose type is not a word (NULL: bad_object) */
  const char *no_choice_name;  /* a named choice without its name (NULL: bad_object) */
  const char *not_either;      /* neither string nor object (with strings) */
  const char *unknown_name;    /* (name) the named tool is not among the tools */
  const char *no_tools;        /* a call asked for without tools */
} serve_tools_dialect;

/* OpenAI chat's tools: [{"type": "function", "function": {name, description, parameters}}]. */
extern const serve_tools_dialect serve_tools_openai;

/* root's "tools" (into req->tools, OpenAI's shape) and "tool_choice" as dialect d writes them;
 * on failure the status with f filled. */
int serve_tools_parse(json_t *root, serve_request *req, const serve_tools_dialect *d, serve_fail *f);

/* Every sampling field unset: the model's defaults. */
void serve_sampling_defaults(serve_sampling *s);
/* obj[key], or NULL when absent or JSON null (both mean "not given"). */
json_t *serve_json_field(json_t *obj, const char *key);
/* Typed fields: absent or null leaves *out as it is; a wrong type or range
 * returns 400 with f filled, param = key and a message naming it. An integer
 * may be sent as a real with an integral value. */
int serve_json_int(json_t *obj, const char *key, int64_t lo, int64_t hi, int64_t *out, serve_fail *f);
int serve_json_num(json_t *obj, const char *key, double lo, double hi, double *out, serve_fail *f);
int serve_json_bool(json_t *obj, const char *key, bool *out, serve_fail *f);
int serve_json_str(json_t *obj, const char *key, char **out, serve_fail *f); /* *out malloc'd */
/* The request's "adapter" (hearth's extension: a LoRA adapter's name, "a+b", "none") into
 * s->adapter (malloc'd; serve_request_free frees it). */
int serve_json_adapter(json_t *root, serve_sampling *s, serve_fail *f);
/* Stop strings at obj[key] into s->stop / s->n_stop: an array of non-empty
 * strings (at most 16), or one string too when allow_string. */
int serve_json_stop(json_t *obj, const char *key, bool allow_string, serve_sampling *s, serve_fail *f);
/* Speculative decoding for this request into s->spec_tokens: "spec_tokens": N
 * or "speculative": {"tokens": N} (0 = off, at most 16; absent: the server's
 * --spec-tokens), and its draft source into s->spec_method (a static string):
 * "spec_method" or "speculative": {"method": M}, M one of "ngram", "draft",
 * "mtp" (absent: the server's --spec-method). */
int serve_json_spec(json_t *obj, serve_sampling *s, serve_fail *f);
/* llama.cpp's sampler fields, named as its server names them: typical_p,
 * xtc_probability, xtc_threshold, dry_multiplier, dry_base,
 * dry_allowed_length, dry_penalty_last_n, dry_sequence_breakers (an array of
 * at most SERVE_MAX_DRY_BREAKERS non-empty strings, or that array as JSON
 * text; s->dry_sequence_breakers malloc'd, serve_request_free frees it),
 * mirostat (0 or 2; 1 refused by name), mirostat_tau, mirostat_eta. llama.cpp's
 * samplers not run here (top_n_sigma, dynatemp_range, repeat_penalty, n_probs,
 * min_keep, adaptive_target, samplers) pass at their neutral values and are
 * refused by name at any other. */
#define SERVE_MAX_DRY_BREAKERS 16
int serve_json_samplers(json_t *obj, serve_sampling *s, serve_fail *f);
/* Frees what the readers above allocated into s (stop, logit_bias, adapter,
 * DRY breakers) and clears those fields. */
void serve_sampling_free(serve_sampling *s);

#endif
