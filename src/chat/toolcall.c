/* toolcall.c — tool calls and reasoning out of generated text, per model
 * family, streaming (see toolcall.h for the formats and the rules).
 *
 * Owns: a byte-at-a-time state machine per parser. Scanning states hold the
 * bytes that may begin one of their markers (`pend`) and release the first
 * byte once they cannot; bytes released or pushed back are processed again
 * from `replay`, so a state may hand a byte to the next one. A call keeps the
 * raw bytes since its start marker until its TC_CALL_BEGIN is sent, to give
 * them back as content when the call turns out malformed. JSON arguments go
 * through a validating incremental JSON reader (`jv`): bytes are released
 * only at points where closing brackets (and a quote) complete them to valid
 * JSON, so a call cut anywhere still ends with a valid object.
 *
 * Refuses to know: tokens (it sees decoded text), tool schemas, HTTP. */
#include "chat/toolcall.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/utf8.h"

#define JV_DEPTH 128
#define RAW_LIMIT (64 * 1024) /* bytes of a call kept before its TC_CALL_BEGIN */
#define NAME_LIMIT 256
#define HEADER_LIMIT 1024

/* ---------------------------------------------------------------------------
 * jv: an incremental JSON validator, one byte at a time. */

enum { J_VAL, J_OBJ0, J_KEY, J_COLON, J_ARR0, J_AFTER, J_STR, J_NUM, J_LIT, J_DONE, J_ERR };
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
enum { JV_OK = 0, JV_DONE = 1, JV_CTRL = 2, JV_ERR = -1 };

typedef struct jv {
  unsigned char stack[JV_DEPTH]; /* '{' or '[' per open container */
  int depth;
  unsigned char st;
  bool key;              /* J_STR: an object key */
  unsigned char esc;     /* J_STR: 0, 1 after '\', 2..5 inside \uXXXX */
  bool want_low;         /* J_STR: a high surrogate escape wants its low half */
  unsigned char u8need;  /* J_STR: continuation bytes still due */
  unsigned char u8lo, u8hi;
  unsigned hex;
  unsigned char num;     /* J_NUM: N_* */
  bool frac;             /* J_NUM: has a fraction or exponent */
  int ndig, exp;
  bool expneg;
  const char *lit;
  int litpos;
} jv;

static void jv_init(jv *j) { memset(j, 0, sizeof *j); }
static bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static int jv_after_value(jv *j) {
  if (j->depth == 0) {
    j->st = J_DONE;
    return JV_DONE;
  }
  j->st = J_AFTER;
  return JV_OK;
}

static int jv_err(jv *j) {
  j->st = J_ERR;
  return JV_ERR;
}

static int jv_pop(jv *j, unsigned char open) {
  if (j->depth == 0 || j->stack[j->depth - 1] != open) return jv_err(j);
  j->depth--;
  return jv_after_value(j);
}

static int jv_push(jv *j, unsigned char open) {
  if (j->depth >= JV_DEPTH) return jv_err(j);
  j->stack[j->depth++] = open;
  j->st = open == '{' ? J_OBJ0 : J_ARR0;
  return JV_OK;
}

static int jv_value(jv *j, unsigned char c) {
  switch (c) {
    case '{': case '[': return jv_push(j, c);
    case '"': j->st = J_STR; j->key = false; j->esc = 0; j->want_low = false; j->u8need = 0; return JV_OK;
    case 't': j->lit = "true"; break;
    case 'f': j->lit = "false"; break;
    case 'n': j->lit = "null"; break;
    default:
      if (c == '-' || (c >= '0' && c <= '9')) {
        j->st = J_NUM;
        j->num = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        j->ndig = c >= '1' && c <= '9';
        j->frac = false;
        j->exp = 0;
        j->expneg = false;
        return JV_OK;
      }
      return jv_err(j);
  }
  j->st = J_LIT;
  j->litpos = 1;
  return JV_OK;
}

/* Leading byte of a UTF-8 sequence: its length (0: invalid) and the range of its second byte. */
static int u8_lead(unsigned char c, unsigned char *lo, unsigned char *hi) {
  *lo = 0x80;
  *hi = 0xBF;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c == 0xE0) { *lo = 0xA0; return 3; }
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return 3;
  if (c == 0xED) { *hi = 0x9F; return 3; }
  if (c == 0xF0) { *lo = 0x90; return 4; }
  if (c >= 0xF1 && c <= 0xF3) return 4;
  if (c == 0xF4) { *hi = 0x8F; return 4; }
  return 0;
}

static int hexval(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static int jv_str(jv *j, unsigned char c) {
  if (j->u8need) {
    if (c < j->u8lo || c > j->u8hi) return jv_err(j);
    j->u8lo = 0x80;
    j->u8hi = 0xBF;
    j->u8need--;
    return JV_OK;
  }
  if (j->esc == 1) {
    if (c == 'u') {
      j->esc = 2;
      j->hex = 0;
      return JV_OK;
    }
    if (j->want_low || !c || !strchr("\"\\/bfnrt", c)) return jv_err(j);
    j->esc = 0;
    return JV_OK;
  }
  if (j->esc >= 2) {
    int v = hexval(c);
    if (v < 0) return jv_err(j);
    j->hex = j->hex * 16 + (unsigned)v;
    if (++j->esc < 6) return JV_OK;
    j->esc = 0;
    unsigned cp = j->hex;
    if (j->want_low) {
      if (cp < 0xDC00 || cp > 0xDFFF) return jv_err(j);
      j->want_low = false;
    } else if (cp >= 0xD800 && cp <= 0xDBFF) {
      j->want_low = true;
    } else if ((cp >= 0xDC00 && cp <= 0xDFFF) || cp == 0) {
      return jv_err(j);
    }
    return JV_OK;
  }
  if (j->want_low) {
    if (c != '\\') return jv_err(j);
    j->esc = 1;
    return JV_OK;
  }
  if (c == '"') {
    if (j->key) {
      j->st = J_COLON;
      return JV_OK;
    }
    return jv_after_value(j);
  }
  if (c == '\\') {
    j->esc = 1;
    return JV_OK;
  }
  if (c < 0x20) return JV_CTRL;
  if (c < 0x80) return JV_OK;
  int n = u8_lead(c, &j->u8lo, &j->u8hi);
  if (n < 2) return jv_err(j);
  j->u8need = (unsigned char)(n - 1);
  return JV_OK;
}

/* 1: the number ended before c (process c again). */
static int jv_num(jv *j, unsigned char c) {
  bool digit = c >= '0' && c <= '9';
  switch (j->num) {
    case N_MINUS:
      if (!digit) return jv_err(j);
      j->num = c == '0' ? N_ZERO : N_INT;
      j->ndig = c != '0';
      return JV_OK;
    case N_ZERO:
    case N_INT:
      if (digit && j->num == N_INT) {
        if (++j->ndig > 400) return jv_err(j);
        return JV_OK;
      }
      if (c == '.') { j->num = N_DOT; j->frac = true; return JV_OK; }
      if (c == 'e' || c == 'E') { j->num = N_E; j->frac = true; return JV_OK; }
      break;
    case N_DOT:
      if (!digit) return jv_err(j);
      j->num = N_FRAC;
      return JV_OK;
    case N_FRAC:
      if (digit) return JV_OK;
      if (c == 'e' || c == 'E') { j->num = N_E; return JV_OK; }
      break;
    case N_E:
      if (c == '+' || c == '-') { j->expneg = c == '-'; j->num = N_ESIGN; return JV_OK; }
      if (!digit) return jv_err(j);
      j->num = N_EXP;
      j->exp = c - '0';
      return JV_OK;
    case N_ESIGN:
      if (!digit) return jv_err(j);
      j->num = N_EXP;
      j->exp = c - '0';
      return JV_OK;
    case N_EXP:
      if (digit) {
        if (j->exp < 100000) j->exp = j->exp * 10 + (c - '0');
        return JV_OK;
      }
      break;
  }
  /* the number ends here: refuse what jansson cannot hold with default flags */
  if (!j->frac && j->ndig > 18) return jv_err(j);
  if (j->ndig + (j->expneg ? -j->exp : j->exp) > 300) return jv_err(j);
  return jv_after_value(j) == JV_DONE ? 2 : 1;
}

static int jv_put(jv *j, unsigned char c) {
  for (;;) {
    switch (j->st) {
      case J_STR: return jv_str(j, c);
      case J_NUM: {
        int r = jv_num(j, c);
        if (r == 1) continue;
        if (r == 2) return jv_err(j); /* a top-level number: not something we read */
        return r;
      }
      case J_LIT:
        if (c != (unsigned char)j->lit[j->litpos]) return jv_err(j);
        if (!j->lit[++j->litpos]) return jv_after_value(j);
        return JV_OK;
      case J_VAL:
      case J_ARR0:
        if (is_ws(c)) return JV_OK;
        if (j->st == J_ARR0 && c == ']') return jv_pop(j, '[');
        return jv_value(j, c);
      case J_OBJ0:
      case J_KEY:
        if (is_ws(c)) return JV_OK;
        if (j->st == J_OBJ0 && c == '}') return jv_pop(j, '{');
        if (c != '"') return jv_err(j);
        j->st = J_STR;
        j->key = true;
        j->esc = 0;
        j->want_low = false;
        j->u8need = 0;
        return JV_OK;
      case J_COLON:
        if (is_ws(c)) return JV_OK;
        if (c != ':') return jv_err(j);
        j->st = J_VAL;
        return JV_OK;
      case J_AFTER:
        if (is_ws(c)) return JV_OK;
        if (c == ',') {
          j->st = j->stack[j->depth - 1] == '{' ? J_KEY : J_VAL;
          return JV_OK;
        }
        if (c == '}') return jv_pop(j, '{');
        if (c == ']') return jv_pop(j, '[');
        return jv_err(j);
      default: return jv_err(j);
    }
  }
}

/* Whether the text so far plus closing brackets (and a quote when inside a value string) is valid JSON. */
static bool jv_safe(const jv *j) {
  switch (j->st) {
    case J_AFTER: case J_OBJ0: case J_ARR0: return true;
    case J_STR: return !j->key && !j->esc && !j->u8need && !j->want_low;
    default: return false;
  }
}

/* ---------------------------------------------------------------------------
 * JSON string escaping with UTF-8 repair. */

static void esc_ascii(hbuf *b, unsigned char c) {
  switch (c) {
    case '"': hbuf_puts(b, "\\\""); return;
    case '\\': hbuf_puts(b, "\\\\"); return;
    case '\n': hbuf_puts(b, "\\n"); return;
    case '\r': hbuf_puts(b, "\\r"); return;
    case '\t': hbuf_puts(b, "\\t"); return;
    case '\b': hbuf_puts(b, "\\b"); return;
    case '\f': hbuf_puts(b, "\\f"); return;
    case 0: hbuf_puts(b, "\xEF\xBF\xBD"); return; /* jansson refuses \u0000 */
    default:
      if (c < 0x20) hbuf_printf(b, "\\u%04x", c);
      else hbuf_putc(b, (char)c);
  }
}

/* A UTF-8 sequence being assembled while a string streams. */
typedef struct u8s {
  unsigned char b[4];
  int n, need;
  unsigned char lo, hi;
} u8s;

static const char REPLACEMENT[] = "\xEF\xBF\xBD";

static void u8s_put(u8s *u, unsigned char c, hbuf *out) {
  if (u->n) {
    if (c >= u->lo && c <= u->hi) {
      u->b[u->n++] = c;
      u->lo = 0x80;
      u->hi = 0xBF;
      if (u->n == u->need) {
        hbuf_append(out, u->b, (size_t)u->n);
        u->n = 0;
      }
      return;
    }
    hbuf_puts(out, REPLACEMENT);
    u->n = 0;
  }
  int need = u8_lead(c, &u->lo, &u->hi);
  if (need == 1) esc_ascii(out, c);
  else if (need == 0) hbuf_puts(out, REPLACEMENT);
  else {
    u->b[0] = c;
    u->n = 1;
    u->need = need;
  }
}

static void u8s_end(u8s *u, hbuf *out) {
  if (u->n) hbuf_puts(out, REPLACEMENT);
  u->n = 0;
}

/* s as a quoted JSON string. */
static void json_quote(hbuf *b, const char *s, size_t n) {
  u8s u = {0};
  hbuf_putc(b, '"');
  for (size_t i = 0; i < n; i++) u8s_put(&u, (unsigned char)s[i], b);
  u8s_end(&u, b);
  hbuf_putc(b, '"');
}

/* ---------------------------------------------------------------------------
 * Markers. */

enum {
  MK_DROP, MK_THINK, MK_THINK_END, MK_TC, MK_TC_END, MK_FUNC, MK_FUNC_END, MK_NL_FUNC_END, MK_PARAM, MK_NL_PARAM,
  MK_PARAM_END, MK_ARG_KEY, MK_ARG_KEY_END, MK_ARG_VAL, MK_ARG_VAL_END, MK_PYTAG, MK_MI_CALLS, MK_MI_ARGS, MK_GEN_CALLS,
  MK_MI_CALL_ID, MK_DS_CALLS, MK_DS_CALLS_END, MK_DS_CALL, MK_DS_CALL_END, MK_DS_SEP, MK_G_CALL, MK_G_CALL_END,
  MK_G_STR, MK_H_START, MK_H_CHANNEL, MK_H_MESSAGE, MK_H_CONSTRAIN, MK_H_END, MK_H_CALL, MK_H_RETURN,
};

typedef struct mk {
  const char *s;
  int id;
} mk;

static const char *const DROP_COMMON[] = {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|endoftext|>",
                                          "<|end_of_text|>", "<end_of_turn>", "<turn|>",
                                          "<｜end▁of▁sentence｜>"};
#define DS_CALLS_BEGIN "<｜tool▁calls▁begin｜>"
#define DS_CALLS_END "<｜tool▁calls▁end｜>"
#define DS_CALL_BEGIN "<｜tool▁call▁begin｜>"
#define DS_CALL_END "<｜tool▁call▁end｜>"
#define DS_SEP "<｜tool▁sep｜>"

/* ---------------------------------------------------------------------------
 * The syntaxes: one descriptor per format (toolcall.h), read by the parser
 * below, by serve/forced.c and by the server. */

#define TURN_ENDS "<|end|>", "<|return|>", "<|call|>" /* structure in harmony, dropped elsewhere */
static const char *const DROPS_PLAIN[] = {TURN_ENDS, NULL};
static const char *const DROPS_NONE[] = {TURN_ENDS, "</s>", "<eos>", "<|tool_response>", NULL};
static const char *const DROPS_MISTRAL[] = {TURN_ENDS, "</s>", NULL};
static const char *const DROPS_GEMMA4[] = {TURN_ENDS, "<eos>", "<|tool_response>", NULL};
static const char *const DROPS_HARMONY[] = {NULL};

static const tc_syntax SYNTAXES[TC_FORMAT_COUNT] = {
    [TC_NONE] = {.format = TC_NONE, .name = "none", .think_open = "<think>", .think_close = "</think>",
                 .drops = DROPS_NONE},
    [TC_HERMES] = {.format = TC_HERMES, .name = "hermes", .calls = {{"<tool_call>", MK_TC}},
                   .think_open = "<think>", .think_close = "</think>", .drops = DROPS_PLAIN,
                   .forced_open = "<tool_call>\n{\"name\": \"", .forced_named = "%s\", \"arguments\": ",
                   .grammar = TC_GRAMMAR_JSON, .grammar_key = "arguments", .grammar_close = " \"\\n</tool_call>\""},
    [TC_QWEN3_CODER] = {.format = TC_QWEN3_CODER, .name = "qwen3_coder",
                        .calls = {{"<tool_call>", MK_TC}, {"<function=", MK_FUNC}}, .think_open = "<think>",
                        .think_close = "</think>", .drops = DROPS_PLAIN, .forced_open = "<tool_call>\n<function=",
                        .forced_named = "%s>\n", .grammar = TC_GRAMMAR_XML, .coder = true},
    [TC_LLAMA3] = {.format = TC_LLAMA3, .name = "llama3", .calls = {{"<|python_tag|>", MK_PYTAG}},
                   .think_close = "</think>", .drops = DROPS_PLAIN, .bare_json = true,
                   .forced_open = "{\"name\": \"", .forced_named = "%s\", \"parameters\": ",
                   .grammar = TC_GRAMMAR_JSON, .grammar_key = "parameters", .grammar_close = "",
                   .special_call_markers = true},
    [TC_MISTRAL] = {.format = TC_MISTRAL, .name = "mistral", .calls = {{"[TOOL_CALLS]", MK_MI_CALLS}},
                    .think_open = "[THINK]", .think_close = "[/THINK]", .drops = DROPS_MISTRAL,
                    .forced_open = "[TOOL_CALLS][{\"name\": \"", .forced_named = "%s\", \"arguments\": ",
                    .grammar = TC_GRAMMAR_JSON, .grammar_key = "arguments", .grammar_close = " \"]\"",
                    .special_call_markers = true},
    [TC_GEMMA4] = {.format = TC_GEMMA4, .name = "gemma4", .calls = {{"<|tool_call>", MK_G_CALL}},
                   .think_open = "<|channel>", .think_close = "<channel|>", .drops = DROPS_GEMMA4,
                   .thought_label = true, .forced_open = "<|tool_call>call:", .forced_named = "%s{",
                   .grammar = TC_GRAMMAR_GEMMA4, .special_markers = true},
    [TC_DEEPSEEK] = {.format = TC_DEEPSEEK, .name = "deepseek",
                     .calls = {{DS_CALLS_BEGIN, MK_DS_CALLS}, {DS_CALL_BEGIN, MK_DS_CALL}}, .think_open = "<think>",
                     .think_close = "</think>", .drops = DROPS_PLAIN, .forced_open = DS_CALLS_BEGIN DS_CALL_BEGIN,
                     .grammar = TC_GRAMMAR_DEEPSEEK, .special_call_markers = true},
    [TC_GLM] = {.format = TC_GLM, .name = "glm", .calls = {{"<tool_call>", MK_TC}}, .think_open = "<think>",
                .think_close = "</think>", .drops = DROPS_PLAIN, .forced_open = "<tool_call>", .forced_named = "%s\n",
                .grammar = TC_GRAMMAR_XML, .special_call_markers = true},
    [TC_HARMONY] = {.format = TC_HARMONY, .name = "harmony", .think_close = "</think>", .drops = DROPS_HARMONY,
                    .channels = true, .forced_open = "<|channel|>commentary to=functions.", .forced_named = "%s",
                    .grammar = TC_GRAMMAR_HARMONY, .special_markers = true},
    [TC_GENERIC] = {.format = TC_GENERIC, .name = "generic",
                    .calls = {{"{\"tool_calls\": [", MK_GEN_CALLS}, {"{\"tool_calls\":[", MK_GEN_CALLS}},
                    .think_open = "<think>", .think_close = "</think>", .drops = DROPS_NONE, .calls_object = true,
                    .forced_open = "{\"tool_calls\": [{\"name\": \"", .forced_named = "%s\", \"arguments\": ",
                    .grammar = TC_GRAMMAR_JSON, .grammar_key = "arguments", .grammar_close = " \"]}\"",
                    .server_describes = true},
};

const tc_syntax *tc_syntax_of(tc_format f) { return &SYNTAXES[(unsigned)f < TC_FORMAT_COUNT ? f : TC_NONE]; }

/* ---------------------------------------------------------------------------
 * The parser. */

enum {
  S_TEXT, S_REASON,
  S_TCB, S_JOBJ, S_TC_TAIL,                                   /* <tool_call> bodies, JSON call objects */
  S_QC_NAME, S_QC_PARAMS, S_QC_PNAME, S_QC_VALUE, S_QC_END,   /* qwen3_coder */
  S_GLM_NAME, S_GLM_ARGS, S_GLM_KEY, S_GLM_VSTART, S_GLM_VALUE,
  S_PYTAG, S_L3_AFTER,
  S_MI_START, S_MI_ARR, S_MI_ARR_AFTER, S_MI_NAME, S_MI_CALLID,
  S_GEN_END,                                                  /* generic: the '}' after the calls' ']' */
  S_ARGS,                                                     /* a standalone JSON arguments object */
  S_DS_CALLS, S_DS_HEAD, S_DS_SEP, S_DS_NAME, S_DS_FENCE, S_DS_TAIL,
  S_G_CALL, S_G_ARGS, S_G_TAIL,
  S_H_OUT, S_H_HDR, S_H_MSG, S_H_SKIP,
  S_SKIP,                                                     /* drop bytes until skip_mk, then skip_to */
};

enum { CK_JSON, CK_SYN, CK_GEMMA };                /* how a call's arguments are made */
enum { V_START, V_BUF, V_STR };                    /* synthesized value modes */
enum { F_OTHER, F_NAME, F_ARGS };                  /* JSON call object fields */
enum { G_KEYWAIT, G_KEY, G_VALWAIT, G_STR, G_BARE }; /* gemma argument reader */

typedef struct sink {
  hbuf ws; /* whitespace held until something follows it */
  bool started;
} sink;

struct tc_parser {
  tc_opts o;
  const tc_syntax *syn;   /* o.format's */
  int st;
  hbuf pend;              /* bytes that may still become a marker of the state */
  hbuf rp;                /* bytes to process again before new input, from rp_pos */
  size_t rp_pos;
  /* events */
  tc_event_fn fn;
  void *ctx;
  int stop;
  int out_kind;
  hbuf out;               /* a TEXT / REASONING / ARGS run not yet reported */
  sink text, reason;
  bool reply_start;       /* nothing but whitespace reported yet (llama3's bare JSON calls) */
  bool ws_after_call;     /* no content since the last call ended: held whitespace is dropped at the end */
  int label_pos;          /* gemma4: bytes of "thought\n" matched at a thought channel's start; -1 past it */
  bool any_reasoning;
  /* the call in progress */
  bool in_call, begun, raw_added;
  hbuf raw;               /* bytes since the start marker, until TC_CALL_BEGIN */
  size_t raw_mark;        /* bytes of raw given back verbatim (the marker), the rest is processed again */
  int gb_state;           /* state that takes given-back bytes */
  int ncalls;
  int ckind;
  hbuf name;
  int after;              /* state after the call */
  int rec_state, rec_mk;  /* after a broken call: skip to rec_mk (-1: none), then rec_state */
  int skip_mk, skip_to;
  bool name_done;         /* name complete (cut-off calls with a name are ended) */
  /* JSON */
  jv j;
  int jbase;
  bool in_args, args_done, args_seen, safe_str;
  hbuf apend;             /* argument bytes not yet released */
  int field;
  bool cap_key, cap_name, cap_argstr;
  hbuf key, cap;
  int mi_array;           /* mistral: inside [TOOL_CALLS][...]; generic: inside {"tool_calls": [...] */
  /* synthesized arguments */
  int nfields, vmode;
  bool glm_strip, nl_skipped;
  hbuf val, vtrail;
  u8s u8;
  bool name_ws;           /* glm: whitespace after the name */
  /* gemma4 */
  unsigned char gstack[JV_DEPTH];
  int gcount[JV_DEPTH];
  int gdepth, gs;
  /* harmony */
  hbuf hdr;
  int hkind;              /* TC_TEXT or TC_REASONING */
};

/* --- events --- */

static void out_flush(tc_parser *p, bool all) {
  if (p->stop || !p->out.len) return;
  size_t n = p->out.len;
  if (!all) n = utf8_complete_prefix(p->out.data, n);
  if (!n) return;
  tc_event ev = {.kind = (tc_event_kind)p->out_kind, .index = p->ncalls, .text = p->out.data, .len = n};
  int rc = p->fn ? p->fn(p->ctx, &ev) : 0;
  memmove(p->out.data, p->out.data + n, p->out.len - n);
  p->out.len -= n;
  p->out.data[p->out.len] = 0;
  if (rc) p->stop = rc;
}

static void emit(tc_parser *p, int kind, const char *s, size_t n) {
  if (p->stop || !n) return;
  if (p->out_kind != kind) out_flush(p, true);
  p->out_kind = kind;
  hbuf_append(&p->out, s, n);
  if (kind == TC_REASONING) p->any_reasoning = true;
}

static void emit_event(tc_parser *p, int kind, const char *name) {
  out_flush(p, true);
  if (p->stop) return;
  tc_event ev = {.kind = (tc_event_kind)kind, .index = p->ncalls, .name = name, .text = "", .len = 0};
  int rc = p->fn ? p->fn(p->ctx, &ev) : 0;
  if (rc) p->stop = rc;
}

static void args_emit(tc_parser *p, const char *s, size_t n) { emit(p, TC_CALL_ARGS, s, n); }
static void args_emit_buf(tc_parser *p, hbuf *b) {
  args_emit(p, b->data, b->len);
  hbuf_clear(b);
}

static void sink_put(tc_parser *p, sink *s, int kind, unsigned char c) {
  if (is_ws(c)) {
    if (s->started) hbuf_putc(&s->ws, (char)c);
    return;
  }
  if (s->ws.len) {
    emit(p, kind, s->ws.data, s->ws.len);
    hbuf_clear(&s->ws);
  }
  char ch = (char)c;
  emit(p, kind, &ch, 1);
  s->started = true;
  if (kind == TC_TEXT) p->reply_start = p->ws_after_call = false;
}

static void sink_puts(tc_parser *p, sink *s, int kind, const char *str, size_t n) {
  for (size_t i = 0; i < n; i++) sink_put(p, s, kind, (unsigned char)str[i]);
}

static void text_put(tc_parser *p, unsigned char c) { sink_put(p, &p->text, TC_TEXT, c); }

static const char LABEL[] = "thought\n";

static void reason_put(tc_parser *p, unsigned char c) {
  if (p->label_pos >= 0) {
    if (c == (unsigned char)LABEL[p->label_pos]) {
      if (!LABEL[++p->label_pos]) p->label_pos = -1;
      return;
    }
    int n = p->label_pos;
    p->label_pos = -1;
    sink_puts(p, &p->reason, TC_REASONING, LABEL, (size_t)n);
  }
  sink_put(p, &p->reason, TC_REASONING, c);
}

static void reason_end(tc_parser *p) {
  if (p->label_pos > 0) sink_puts(p, &p->reason, TC_REASONING, LABEL, (size_t)p->label_pos);
  p->label_pos = -1;
  hbuf_clear(&p->reason.ws);
  /* the answer after a reasoning block starts at its first visible character */
  p->text.started = false;
  hbuf_clear(&p->text.ws);
}

/* --- replay --- */

static void replay_front(tc_parser *p, const char *a, size_t na, const char *b, size_t nb) {
  size_t k = na + nb;
  if (!k) return;
  if (p->rp_pos >= k) {
    p->rp_pos -= k;
    memcpy(p->rp.data + p->rp_pos, a, na);
    if (nb) memcpy(p->rp.data + p->rp_pos + na, b, nb);
    return;
  }
  hbuf n = {0};
  size_t rest = p->rp.len - p->rp_pos, head = 64;
  hbuf_reserve(&n, head + k + rest);
  if (n.oom) {
    p->rp.oom = true;
    return;
  }
  n.len = head;
  hbuf_append(&n, a, na);
  hbuf_append(&n, b, nb);
  hbuf_append(&n, p->rp.data ? p->rp.data + p->rp_pos : "", rest);
  hbuf_free(&p->rp);
  p->rp = n;
  p->rp_pos = head;
}

/* Processes c again in the state now current. */
static void reprocess(tc_parser *p, unsigned char c) {
  if (p->raw_added && p->raw.len) p->raw.len--;
  p->raw_added = false;
  char ch = (char)c;
  replay_front(p, &ch, 1, NULL, 0);
}

/* --- calls --- */

static void call_start(tc_parser *p, const char *marker, size_t n, int gb_state) {
  p->in_call = true;
  p->begun = false;
  p->raw_added = false;
  hbuf_clear(&p->raw);
  hbuf_append(&p->raw, marker, n);
  p->raw_mark = n;
  p->gb_state = gb_state;
  hbuf_clear(&p->name);
  p->name_done = false;
  p->rec_state = S_TEXT;
  p->rec_mk = -1;
  p->in_args = p->args_done = p->args_seen = false;
  hbuf_clear(&p->apend);
}

static void give_back(tc_parser *p) {
  hbuf rest = {0};
  hbuf_append(&rest, p->raw.data ? p->raw.data + p->raw_mark : "", p->raw.len - p->raw_mark);
  hbuf_append(&rest, p->pend.data ? p->pend.data : "", p->pend.len);
  hbuf_clear(&p->pend);
  p->in_call = false;
  p->raw_added = false;
  p->reply_start = false;
  p->st = p->gb_state;
  if (p->st == S_H_MSG) p->hkind = TC_TEXT;
  if (p->raw_mark) sink_puts(p, &p->text, TC_TEXT, p->raw.data, p->raw_mark);
  hbuf_clear(&p->raw);
  replay_front(p, rest.data ? rest.data : "", rest.len, NULL, 0);
  if (rest.oom) p->rp.oom = true;
  hbuf_free(&rest);
}

static void begin_call(tc_parser *p) {
  hbuf_clear(&p->text.ws);
  hbuf_putc(&p->name, 0);
  p->name.len--;
  emit_event(p, TC_CALL_BEGIN, p->name.data ? p->name.data : "");
  p->begun = true;
  p->name_done = true;
  hbuf_clear(&p->raw);
  p->raw_added = false;
}

static void end_call(tc_parser *p) {
  emit_event(p, TC_CALL_END, NULL);
  p->ws_after_call = true; /* whitespace that only trails a call is not content */
  p->ncalls++;
  p->in_call = p->begun = false;
  p->in_args = false;
}

/* Completes the arguments of a begun call and ends it. */
static void syn_value_end(tc_parser *p);
static void gemma_close_all(tc_parser *p);

static void close_call(tc_parser *p) {
  if (p->ckind == CK_JSON) {
    if (p->in_args && !p->args_done) {
      hbuf_clear(&p->apend);
      if (p->safe_str) args_emit(p, "\"", 1);
      for (int d = p->j.depth; d > p->jbase; d--) args_emit(p, p->j.stack[d - 1] == '{' ? "}" : "]", 1);
    } else if (!p->args_seen) {
      args_emit(p, "{}", 2);
    } else if (p->apend.len) {
      args_emit_buf(p, &p->apend);
    }
  } else if (p->ckind == CK_SYN) {
    if (p->st == S_QC_VALUE || p->st == S_GLM_VALUE) syn_value_end(p);
    args_emit(p, "}", 1);
  } else {
    gemma_close_all(p);
  }
  end_call(p);
}

/* The call cannot go on: give it back, or end it and recover. c (when >= 0) is processed again. */
static void fail(tc_parser *p, int c) {
  if (p->in_call && !p->begun) {
    give_back(p);
    return;
  }
  if (p->in_call) close_call(p);
  p->in_call = false;
  if (p->rec_mk >= 0) {
    p->st = S_SKIP;
    p->skip_mk = p->rec_mk;
    p->skip_to = p->rec_state;
  } else {
    p->st = p->rec_state;
  }
  if (c >= 0) reprocess(p, (unsigned char)c);
}

/* --- JSON call objects: {"name": ..., "arguments": {...}} --- */

static void jobj_start(tc_parser *p, int after, int rec_state, int rec_mk) {
  if (!p->in_call) call_start(p, "", 0, S_TEXT);
  jv_init(&p->j);
  p->ckind = CK_JSON;
  p->st = S_JOBJ;
  p->after = after;
  p->rec_state = rec_state;
  p->rec_mk = rec_mk;
  p->field = F_OTHER;
  p->cap_key = p->cap_name = p->cap_argstr = false;
  p->in_args = p->args_done = p->args_seen = false;
  p->jbase = 1;
  hbuf_clear(&p->apend);
  hbuf_clear(&p->name);
  p->name_done = false;
}

/* A JSON string's raw inside (between the quotes) decoded; false when invalid. */
static bool json_unquote(const char *s, size_t n, hbuf *out) {
  hbuf q = {0};
  hbuf_putc(&q, '"');
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x20) esc_ascii(&q, c);
    else hbuf_putc(&q, (char)c);
  }
  hbuf_putc(&q, '"');
  bool ok = false;
  if (!q.oom) {
    json_t *v = json_loadb(q.data, q.len, JSON_DECODE_ANY, NULL);
    if (json_is_string(v)) {
      hbuf_clear(out);
      hbuf_append(out, json_string_value(v), json_string_length(v));
      ok = true;
    }
    json_decref(v);
  }
  hbuf_free(&q);
  return ok;
}

static bool name_ok(const hbuf *n) {
  if (!n->len || n->len > NAME_LIMIT || memchr(n->data, 0, n->len)) return false;
  return utf8_valid(n->data, n->len);
}

static void jobj_done(tc_parser *p) {
  if (!p->name_done) {
    fail(p, -1);
    return;
  }
  if (!p->begun) begin_call(p);
  if (!p->args_seen) args_emit(p, "{}", 2);
  else if (p->apend.len) args_emit_buf(p, &p->apend);
  end_call(p);
  p->st = p->after;
}

static void args_release(tc_parser *p) {
  if (!p->begun) return;
  args_emit_buf(p, &p->apend);
  p->safe_str = p->j.st == J_STR;
}

/* One byte of a JSON arguments object (outer object or standalone), already through jv. */
static void args_byte(tc_parser *p, unsigned char c, int r, int pst) {
  if (pst == J_NUM && p->j.st != J_NUM && p->begun) { /* a number ended just before c */
    args_emit_buf(p, &p->apend);
    p->safe_str = false;
  }
  if (r == JV_CTRL) esc_ascii(&p->apend, c);
  else hbuf_putc(&p->apend, (char)c);
  if (p->j.depth == p->jbase && (p->j.st == J_AFTER || p->j.st == J_DONE)) {
    p->in_args = false;
    p->args_done = true;
    p->safe_str = false;
    if (p->begun) args_emit_buf(p, &p->apend);
  } else if (jv_safe(&p->j)) {
    args_release(p);
  }
}

static void jobj_put(tc_parser *p, unsigned char c) {
  int pst = p->j.st, pd = p->j.depth;
  int r = jv_put(&p->j, c);
  if (r == JV_ERR) {
    fail(p, c);
    return;
  }
  if (p->in_args) {
    args_byte(p, c, r, pst);
    return;
  }
  if (p->cap_key) {
    if (p->j.st == J_STR) {
      hbuf_putc(&p->key, (char)c);
    } else {
      p->cap_key = false;
      if (p->key.len == 4 && !memcmp(p->key.data, "name", 4)) p->field = F_NAME;
      else if ((p->key.len == 9 && !memcmp(p->key.data, "arguments", 9)) ||
               (p->key.len == 10 && !memcmp(p->key.data, "parameters", 10)))
        p->field = F_ARGS;
      else p->field = F_OTHER;
    }
  } else if (p->cap_name || p->cap_argstr) {
    if (p->j.st == J_STR) {
      hbuf_putc(&p->cap, (char)c);
    } else if (p->cap_name) {
      p->cap_name = false;
      if (!json_unquote(p->cap.data, p->cap.len, &p->name) || !name_ok(&p->name)) {
        fail(p, -1);
        return;
      }
      p->name_done = true;
    } else {
      p->cap_argstr = false;
      hbuf s = {0};
      json_t *v = NULL;
      if (json_unquote(p->cap.data, p->cap.len, &s)) v = json_loadb(s.data ? s.data : "", s.len, 0, NULL);
      hbuf_free(&s);
      char *d = json_is_object(v) ? json_dumps(v, 0) : NULL;
      json_decref(v);
      if (!d) {
        fail(p, -1);
        return;
      }
      hbuf_clear(&p->apend);
      hbuf_puts(&p->apend, d);
      free(d);
      p->args_done = true;
      if (p->begun) args_emit_buf(p, &p->apend);
    }
  } else if ((pst == J_OBJ0 || pst == J_KEY) && pd == 1 && p->j.st == J_STR) {
    p->cap_key = true;
    hbuf_clear(&p->key);
  } else if (pst == J_VAL && pd == 1 && p->j.st != J_VAL) {
    if (p->field == F_NAME && !p->name_done) {
      if (c != '"') {
        fail(p, -1);
        return;
      }
      p->cap_name = true;
      hbuf_clear(&p->cap);
    } else if (p->field == F_ARGS && !p->args_seen) {
      p->args_seen = true;
      if (c == '"') {
        p->cap_argstr = true;
        hbuf_clear(&p->cap);
      } else if (c == '{') {
        p->in_args = true;
        p->safe_str = false;
        hbuf_clear(&p->apend);
        hbuf_putc(&p->apend, '{');
        if (p->name_done) {
          begin_call(p);
          args_release(p);
        }
      } else {
        fail(p, -1);
        return;
      }
    }
  }
  if (r == JV_DONE) jobj_done(p);
}

/* --- standalone JSON arguments (mistral [ARGS], deepseek, harmony) --- */

static void sargs_start(tc_parser *p, int after, int rec_state, int rec_mk) {
  p->ckind = CK_JSON;
  p->st = S_ARGS;
  p->after = after;
  p->rec_state = rec_state;
  p->rec_mk = rec_mk;
  p->in_args = p->args_done = p->args_seen = false;
  p->name_done = true;
  p->jbase = 0;
  jv_init(&p->j);
  hbuf_clear(&p->apend);
}

static void sargs_put(tc_parser *p, unsigned char c) {
  if (!p->in_args) {
    if (is_ws(c)) return;
    if (c != '{') {
      fail(p, c);
      return;
    }
    p->in_args = p->args_seen = true;
    p->safe_str = false;
    begin_call(p);
  }
  int pst = p->j.st;
  int r = jv_put(&p->j, c);
  if (r == JV_ERR) {
    fail(p, c);
    return;
  }
  args_byte(p, c, r, pst);
  if (p->args_done) {
    end_call(p);
    p->st = p->after;
  }
}

/* --- synthesized arguments (qwen3_coder, glm) --- */

static void syn_begin(tc_parser *p) {
  p->ckind = CK_SYN;
  p->nfields = 0;
  begin_call(p);
  args_emit(p, "{", 1);
}

static void syn_key_prefix(tc_parser *p, hbuf *b) {
  if (p->nfields) hbuf_puts(b, ", ");
  const char *k = p->key.data ? p->key.data : "";
  size_t n = p->key.len;
  while (n && is_ws((unsigned char)k[0])) k++, n--;
  while (n && is_ws((unsigned char)k[n - 1])) n--;
  json_quote(b, k, n);
  hbuf_puts(b, ": ");
}

static void syn_value_start(tc_parser *p, bool glm) {
  p->vmode = V_START;
  p->glm_strip = glm;
  p->nl_skipped = false;
  hbuf_clear(&p->val);
  hbuf_clear(&p->vtrail);
  memset(&p->u8, 0, sizeof p->u8);
}

static void syn_str_flush_trail(tc_parser *p) {
  hbuf b = {0};
  for (size_t i = 0; i < p->vtrail.len; i++) u8s_put(&p->u8, (unsigned char)p->vtrail.data[i], &b);
  hbuf_clear(&p->vtrail);
  args_emit_buf(p, &b);
  hbuf_free(&b);
}

static void syn_value_put(tc_parser *p, unsigned char c) {
  if (p->vmode == V_START) {
    if (p->glm_strip ? is_ws(c) : (c == '\n' && !p->nl_skipped)) {
      p->nl_skipped = true;
      return;
    }
    if (c && strchr("{[\"-0123456789tfn", c)) {
      p->vmode = V_BUF;
    } else {
      p->vmode = V_STR;
      hbuf b = {0};
      syn_key_prefix(p, &b);
      hbuf_putc(&b, '"');
      args_emit_buf(p, &b);
      hbuf_free(&b);
    }
  }
  if (p->vmode == V_BUF) {
    hbuf_putc(&p->val, (char)c);
    return;
  }
  /* V_STR: trailing whitespace (glm) or one trailing newline (qwen3_coder) is held back */
  if (p->glm_strip ? is_ws(c) : c == '\n') {
    if (!p->glm_strip && p->vtrail.len) syn_str_flush_trail(p);
    hbuf_putc(&p->vtrail, (char)c);
    return;
  }
  if (p->vtrail.len) syn_str_flush_trail(p);
  hbuf b = {0};
  u8s_put(&p->u8, c, &b);
  args_emit_buf(p, &b);
  hbuf_free(&b);
}

/* A bare or buffered value as JSON: its own text (trimmed) when it is valid JSON (for gemma4
 * only a number, true, false or null; none/nil are null), else a string. */
static void value_json(hbuf *b, const char *s, size_t n, bool gemma) {
  while (n && is_ws((unsigned char)s[0])) s++, n--;
  while (n && is_ws((unsigned char)s[n - 1])) n--;
  json_t *v = n ? json_loadb(s, n, JSON_DECODE_ANY, NULL) : NULL;
  bool keep = v && (!gemma || json_is_number(v) || json_is_boolean(v) || json_is_null(v));
  json_decref(v);
  if (keep) {
    hbuf_append(b, s, n);
    return;
  }
  if (gemma && n >= 3 && n <= 4) {
    char low[5] = {0};
    for (size_t i = 0; i < n; i++) low[i] = (char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] + 32 : s[i]);
    if (!strcmp(low, "none") || !strcmp(low, "nil")) {
      hbuf_puts(b, "null");
      return;
    }
  }
  json_quote(b, s, n);
}

static void syn_value_end(tc_parser *p) {
  hbuf b = {0};
  if (p->vmode == V_STR) {
    hbuf_clear(&p->vtrail);
    u8s_end(&p->u8, &b);
    hbuf_putc(&b, '"');
  } else {
    syn_key_prefix(p, &b);
    size_t n = p->val.len;
    if (p->glm_strip) {
      while (n && is_ws((unsigned char)p->val.data[n - 1])) n--;
    } else if (n && p->val.data[n - 1] == '\n') {
      n--;
    }
    value_json(&b, p->val.data ? p->val.data : "", n, false);
  }
  args_emit_buf(p, &b);
  hbuf_free(&b);
  p->nfields++;
  hbuf_clear(&p->key);
}

/* --- gemma4 arguments --- */

static void gemma_prefix(tc_parser *p, hbuf *b) {
  int d = p->gdepth - 1;
  if (p->gcount[d]++) hbuf_puts(b, ", ");
  if (p->gstack[d] == '{') {
    const char *k = p->key.data ? p->key.data : "";
    size_t n = p->key.len;
    while (n && is_ws((unsigned char)k[0])) k++, n--;
    while (n && is_ws((unsigned char)k[n - 1])) n--;
    json_quote(b, k, n);
    hbuf_puts(b, ": ");
  }
}

static void gemma_bare_end(tc_parser *p) {
  hbuf b = {0};
  const char *s = p->val.data ? p->val.data : "";
  size_t n = p->val.len;
  while (n && is_ws((unsigned char)s[0])) s++, n--;
  while (n && is_ws((unsigned char)s[n - 1])) n--;
  gemma_prefix(p, &b);
  value_json(&b, s, n, true);
  args_emit_buf(p, &b);
  hbuf_free(&b);
  hbuf_clear(&p->val);
}

static void gemma_close_all(tc_parser *p) {
  hbuf b = {0};
  if (p->gs == G_STR) {
    u8s_end(&p->u8, &b);
    hbuf_putc(&b, '"');
  }
  args_emit_buf(p, &b);
  if (p->gs == G_BARE) gemma_bare_end(p);
  p->gs = G_KEYWAIT;
  for (; p->gdepth > 0; p->gdepth--) args_emit(p, p->gstack[p->gdepth - 1] == '{' ? "}" : "]", 1);
  hbuf_free(&b);
}

static void gemma_open(tc_parser *p, unsigned char c) {
  hbuf b = {0};
  if (p->gdepth) gemma_prefix(p, &b);
  hbuf_putc(&b, (char)c);
  args_emit_buf(p, &b);
  hbuf_free(&b);
  p->gstack[p->gdepth] = c;
  p->gcount[p->gdepth] = 0;
  p->gdepth++;
  p->gs = c == '{' ? G_KEYWAIT : G_VALWAIT;
}

static void gemma_after_value(tc_parser *p) { p->gs = p->gstack[p->gdepth - 1] == '{' ? G_KEYWAIT : G_VALWAIT; }

/* A closing bracket: 1 when the top object closed (the call's arguments are complete). */
static int gemma_close(tc_parser *p, unsigned char c) {
  unsigned char want = c == '}' ? '{' : '[';
  if (p->gstack[p->gdepth - 1] != want) return -1;
  args_emit(p, c == '}' ? "}" : "]", 1);
  p->gdepth--;
  if (!p->gdepth) return 1;
  gemma_after_value(p);
  return 0;
}

static void gemma_done(tc_parser *p) {
  end_call(p);
  p->st = S_G_TAIL;
}

static void gemma_put(tc_parser *p, unsigned char c) {
  switch (p->gs) {
    case G_KEYWAIT:
      if (is_ws(c) || c == ',') return;
      if (c == '}') {
        int r = gemma_close(p, c);
        if (r == 1) gemma_done(p);
        return;
      }
      hbuf_clear(&p->key);
      p->gs = G_KEY;
      /* fall through */
    case G_KEY:
      if (c == ':') {
        p->gs = G_VALWAIT;
        return;
      }
      if (p->key.len < NAME_LIMIT) hbuf_putc(&p->key, (char)c);
      return;
    case G_VALWAIT:
      if (is_ws(c) || (c == ',' && p->gstack[p->gdepth - 1] == '[')) return;
      if (c == '{' || c == '[') {
        if (p->gdepth >= JV_DEPTH) {
          fail(p, -1);
          return;
        }
        gemma_open(p, c);
        return;
      }
      if (c == ']' || c == '}') {
        int r = gemma_close(p, c);
        if (r < 0) fail(p, -1);
        else if (r == 1) gemma_done(p);
        return;
      }
      p->gs = G_BARE;
      hbuf_clear(&p->val);
      /* fall through */
    case G_BARE:
      if (c == ',' || c == '}' || c == ']') {
        gemma_bare_end(p);
        gemma_after_value(p);
        if (c != ',') {
          int r = gemma_close(p, c);
          if (r < 0) fail(p, -1);
          else if (r == 1) gemma_done(p);
        }
        return;
      }
      hbuf_putc(&p->val, (char)c);
      return;
    case G_STR: {
      hbuf b = {0};
      u8s_put(&p->u8, c, &b);
      args_emit_buf(p, &b);
      hbuf_free(&b);
      return;
    }
  }
}

static void gemma_str_marker(tc_parser *p) {
  if (p->gs == G_STR) {
    hbuf b = {0};
    u8s_end(&p->u8, &b);
    hbuf_putc(&b, '"');
    args_emit_buf(p, &b);
    hbuf_free(&b);
    gemma_after_value(p);
  } else if (p->gs == G_VALWAIT) {
    hbuf b = {0};
    gemma_prefix(p, &b);
    hbuf_putc(&b, '"');
    args_emit_buf(p, &b);
    hbuf_free(&b);
    memset(&p->u8, 0, sizeof p->u8);
    p->gs = G_STR;
  } else if (p->gs == G_BARE) {
    hbuf_puts(&p->val, "<|\"|>");
  }
  /* in a key: a quoted key, the quotes dropped */
}

/* --- harmony headers --- */

static void harmony_header(tc_parser *p) {
  const char *h = p->hdr.data ? p->hdr.data : "";
  char channel[32] = {0};
  const char *ch = strstr(h, "<|channel|>");
  if (ch) {
    ch += strlen("<|channel|>");
    while (is_ws((unsigned char)*ch)) ch++;
    size_t i = 0;
    while (ch[i] && !is_ws((unsigned char)ch[i]) && ch[i] != '<' && i < sizeof channel - 1) channel[i] = ch[i], i++;
  }
  const char *to = strstr(h, "to=");
  if (to && p->o.tools) {
    to += 3;
    size_t n = 0;
    while (to[n] && !is_ws((unsigned char)to[n]) && to[n] != '<') n++;
    if (n > 10 && !strncmp(to, "functions.", 10)) to += 10, n -= 10;
    call_start(p, "", 0, S_H_MSG);
    hbuf_append(&p->name, to, n);
    if (!name_ok(&p->name)) {
      p->in_call = false;
      p->st = S_H_MSG;
      p->hkind = TC_TEXT;
      return;
    }
    sargs_start(p, S_H_SKIP, S_H_SKIP, -1);
    return;
  }
  p->st = S_H_MSG;
  p->hkind = (!strcmp(channel, "analysis") && p->o.reasoning) ? TC_REASONING : TC_TEXT;
}

/* --- markers per state --- */

static int add(mk *m, int n, const char *s, int id) {
  m[n].s = s;
  m[n].id = id;
  return n + 1;
}

static int add_drops(const tc_parser *p, mk *m, int n) {
  for (size_t i = 0; i < sizeof DROP_COMMON / sizeof DROP_COMMON[0]; i++) n = add(m, n, DROP_COMMON[i], MK_DROP);
  for (const char *const *d = p->syn->drops; *d; d++) n = add(m, n, *d, MK_DROP);
  return n;
}

static int state_markers(const tc_parser *p, mk *m) {
  int n = 0;
  bool t = p->o.tools;
  switch (p->st) {
    case S_TEXT:
      n = add_drops(p, m, n);
      if (p->o.reasoning && p->syn->think_open) n = add(m, n, p->syn->think_open, MK_THINK);
      for (int k = 0; t && k < 2 && p->syn->calls[k].text; k++) n = add(m, n, p->syn->calls[k].text, p->syn->calls[k].id);
      return n;
    case S_REASON:
      n = add_drops(p, m, n);
      return add(m, n, p->syn->think_close, MK_THINK_END);
    case S_TCB: n = add(m, n, "<function=", MK_FUNC); return add(m, n, "</tool_call>", MK_TC_END);
    case S_TC_TAIL:
    case S_QC_END: n = add_drops(p, m, n); return add(m, n, "</tool_call>", MK_TC_END);
    case S_QC_PARAMS:
      n = add(m, n, "<parameter=", MK_PARAM);
      n = add(m, n, "</function>", MK_FUNC_END);
      return add(m, n, "</tool_call>", MK_TC_END);
    case S_QC_VALUE:
      n = add(m, n, "</parameter>", MK_PARAM_END);
      n = add(m, n, "\n<parameter=", MK_NL_PARAM);
      return add(m, n, "\n</function>", MK_NL_FUNC_END);
    case S_GLM_ARGS: n = add(m, n, "<arg_key>", MK_ARG_KEY); return add(m, n, "</tool_call>", MK_TC_END);
    case S_GLM_KEY: return add(m, n, "</arg_key>", MK_ARG_KEY_END);
    case S_GLM_VSTART: return add(m, n, "<arg_value>", MK_ARG_VAL);
    case S_GLM_VALUE: return add(m, n, "</arg_value>", MK_ARG_VAL_END);
    case S_L3_AFTER: n = add_drops(p, m, n); return add(m, n, "<|python_tag|>", MK_PYTAG);
    case S_MI_ARR_AFTER:
    case S_GEN_END: return add_drops(p, m, n);
    case S_MI_NAME: n = add(m, n, "[ARGS]", MK_MI_ARGS); return add(m, n, "[CALL_ID]", MK_MI_CALL_ID);
    case S_MI_CALLID: return add(m, n, "[ARGS]", MK_MI_ARGS);
    case S_DS_CALLS:
      n = add_drops(p, m, n);
      n = add(m, n, DS_CALL_BEGIN, MK_DS_CALL);
      return add(m, n, DS_CALLS_END, MK_DS_CALLS_END);
    case S_DS_HEAD: return add(m, n, DS_SEP, MK_DS_SEP);
    case S_DS_TAIL:
      n = add_drops(p, m, n);
      n = add(m, n, DS_CALL_END, MK_DS_CALL_END);
      return add(m, n, DS_CALLS_END, MK_DS_CALLS_END);
    case S_G_CALL: return add(m, n, "<tool_call|>", MK_G_CALL_END);
    case S_G_ARGS: n = add(m, n, "<|\"|>", MK_G_STR); return add(m, n, "<tool_call|>", MK_G_CALL_END);
    case S_G_TAIL: n = add_drops(p, m, n); return add(m, n, "<tool_call|>", MK_G_CALL_END);
    case S_H_OUT:
    case S_H_MSG:
    case S_H_SKIP:
      n = add_drops(p, m, n);
      n = add(m, n, "<|start|>", MK_H_START);
      n = add(m, n, "<|channel|>", MK_H_CHANNEL);
      n = add(m, n, "<|end|>", MK_H_END);
      n = add(m, n, "<|call|>", MK_H_CALL);
      return add(m, n, "<|return|>", MK_H_RETURN);
    case S_H_HDR:
      n = add(m, n, "<|message|>", MK_H_MESSAGE);
      n = add(m, n, "<|channel|>", MK_H_CHANNEL);
      n = add(m, n, "<|constrain|>", MK_H_CONSTRAIN);
      return add(m, n, "<|start|>", MK_H_START);
    case S_SKIP: {
      static const struct { int id; const char *s; } skips[] = {
          {MK_TC_END, "</tool_call>"}, {MK_DS_CALL_END, DS_CALL_END}, {MK_G_CALL_END, "<tool_call|>"}};
      for (size_t i = 0; i < sizeof skips / sizeof skips[0]; i++)
        if (skips[i].id == p->skip_mk) return add(m, n, skips[i].s, skips[i].id);
      return n;
    }
    case S_ARGS:
      if (p->syn->channels) {
        n = add(m, n, "<|call|>", MK_H_CALL);
        n = add(m, n, "<|end|>", MK_H_END);
        n = add(m, n, "<|return|>", MK_H_RETURN);
      }
      return n;
    default: return n;
  }
}

/* --- bytes and markers per state --- */

static bool name_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
         c == '.' || c == ':' || c >= 0x80;
}

static void trim_name(hbuf *n) {
  size_t s = 0, e = n->len;
  while (s < e && is_ws((unsigned char)n->data[s])) s++;
  while (e > s && is_ws((unsigned char)n->data[e - 1])) e--;
  if (s) memmove(n->data, n->data + s, e - s);
  n->len = e - s;
  if (n->data) n->data[n->len] = 0;
}

static void on_byte(tc_parser *p, unsigned char c) {
  p->raw_added = false;
  if (p->in_call && !p->begun) {
    hbuf_putc(&p->raw, (char)c);
    p->raw_added = true;
    if (p->raw.len > RAW_LIMIT) {
      fail(p, -1);
      return;
    }
  }
  switch (p->st) {
    case S_TEXT:
      if (p->syn->bare_json && p->o.tools && p->reply_start && c == '{') {
        p->reply_start = false;
        call_start(p, "", 0, S_TEXT);
        jobj_start(p, S_L3_AFTER, S_TEXT, -1);
        reprocess(p, c);
        return;
      }
      text_put(p, c);
      return;
    case S_REASON: reason_put(p, c); return;
    case S_TCB:
      if (is_ws(c)) return;
      if (c == '{') {
        jobj_start(p, S_TC_TAIL, S_TEXT, MK_TC_END);
        reprocess(p, c);
      } else if (name_char(c)) {
        p->st = S_GLM_NAME;
        p->name_ws = false;
        hbuf_clear(&p->name);
        hbuf_putc(&p->name, (char)c);
      } else {
        fail(p, -1);
      }
      return;
    case S_JOBJ: jobj_put(p, c); return;
    case S_TC_TAIL:
      if (is_ws(c)) return;
      if (c == '{') {
        jobj_start(p, S_TC_TAIL, S_TEXT, MK_TC_END);
        reprocess(p, c);
        return;
      }
      p->st = S_TEXT;
      reprocess(p, c);
      return;
    case S_QC_NAME:
      if (c == '>') {
        trim_name(&p->name);
        if (!name_ok(&p->name)) {
          fail(p, -1);
          return;
        }
        syn_begin(p);
        p->st = S_QC_PARAMS;
        return;
      }
      if (c == '\n' || c == '<' || p->name.len >= NAME_LIMIT) {
        fail(p, -1);
        return;
      }
      hbuf_putc(&p->name, (char)c);
      return;
    case S_QC_PARAMS: return; /* stray bytes between parameters */
    case S_QC_PNAME:
      if (c == '>') {
        syn_value_start(p, false);
        p->st = S_QC_VALUE;
        return;
      }
      if (p->key.len < NAME_LIMIT) hbuf_putc(&p->key, (char)c);
      return;
    case S_QC_VALUE:
    case S_GLM_VALUE: syn_value_put(p, c); return;
    case S_QC_END:
    case S_G_TAIL:
      if (is_ws(c)) return;
      p->st = S_TEXT;
      reprocess(p, c);
      return;
    case S_GLM_NAME:
      if (c == '\n' || c == '<') {
        trim_name(&p->name);
        if (!name_ok(&p->name)) {
          fail(p, -1);
          return;
        }
        syn_begin(p);
        p->st = S_GLM_ARGS;
        if (c == '<') reprocess(p, c);
        return;
      }
      if (c == ' ' || c == '\t' || c == '\r') {
        p->name_ws = true;
        return;
      }
      if (p->name_ws || !name_char(c) || p->name.len >= NAME_LIMIT) {
        fail(p, -1);
        return;
      }
      hbuf_putc(&p->name, (char)c);
      return;
    case S_GLM_ARGS: return; /* stray bytes between arguments */
    case S_GLM_KEY:
      if (p->key.len < NAME_LIMIT) hbuf_putc(&p->key, (char)c);
      return;
    case S_GLM_VSTART:
      if (is_ws(c)) return;
      hbuf_clear(&p->key); /* a key without its value */
      p->st = S_GLM_ARGS;
      return;
    case S_PYTAG:
      if (is_ws(c)) return;
      if (c == '{') {
        jobj_start(p, S_L3_AFTER, S_TEXT, -1);
        reprocess(p, c);
        return;
      }
      p->in_call = false; /* a built-in tool's code: the tag is dropped, the code is content */
      p->st = S_TEXT;
      reprocess(p, c);
      return;
    case S_L3_AFTER:
      if (is_ws(c) || c == ';') return;
      if (c == '{') {
        jobj_start(p, S_L3_AFTER, S_TEXT, -1);
        reprocess(p, c);
        return;
      }
      p->st = S_TEXT;
      reprocess(p, c);
      return;
    case S_MI_START:
      if (is_ws(c)) return;
      if (c == '[') {
        p->mi_array = 1;
        p->st = S_MI_ARR;
      } else if (c == '{') {
        jobj_start(p, S_TEXT, S_TEXT, -1);
        reprocess(p, c);
      } else if (name_char(c)) {
        hbuf_clear(&p->name);
        hbuf_putc(&p->name, (char)c);
        p->st = S_MI_NAME;
      } else {
        fail(p, -1);
      }
      return;
    case S_MI_ARR:
      if (is_ws(c)) return;
      if (c == '{') {
        jobj_start(p, S_MI_ARR_AFTER, S_TEXT, -1);
        reprocess(p, c);
      } else if (c == ']' && p->in_call) {
        p->in_call = false; /* an empty list */
        p->st = p->syn->calls_object ? S_GEN_END : S_TEXT;
      } else if (p->in_call) {
        fail(p, -1);
      } else {
        p->st = S_TEXT;
        reprocess(p, c);
      }
      return;
    case S_MI_ARR_AFTER:
      if (is_ws(c)) return;
      if (c == ',') p->st = S_MI_ARR;
      else if (c == ']') p->st = p->syn->calls_object ? S_GEN_END : S_TEXT;
      else {
        p->st = S_TEXT;
        reprocess(p, c);
      }
      return;
    case S_GEN_END: /* the object around the calls' list closes */
      if (is_ws(c)) return;
      p->st = S_TEXT;
      if (c != '}') reprocess(p, c);
      return;
    case S_MI_NAME:
      if (!name_char(c) || p->name.len >= NAME_LIMIT) {
        fail(p, -1);
        return;
      }
      hbuf_putc(&p->name, (char)c);
      return;
    case S_MI_CALLID:
      if (p->raw.len > NAME_LIMIT * 2) fail(p, -1);
      return;
    case S_ARGS: sargs_put(p, c); return;
    case S_DS_CALLS:
      if (is_ws(c)) return;
      if (p->in_call) {
        fail(p, -1);
        return;
      }
      p->st = S_TEXT;
      reprocess(p, c);
      return;
    case S_DS_HEAD:
      if (p->hdr.len >= NAME_LIMIT) {
        fail(p, -1);
        return;
      }
      hbuf_putc(&p->hdr, (char)c);
      return;
    case S_DS_SEP:
      if (is_ws(c) && !p->name.len) return;
      if (c == '{') { /* V3.1: the name came before the separator */
        hbuf_clear(&p->name);
        hbuf_append(&p->name, p->hdr.data ? p->hdr.data : "", p->hdr.len);
        trim_name(&p->name);
        if (!name_ok(&p->name)) {
          fail(p, -1);
          return;
        }
        sargs_start(p, S_DS_TAIL, S_DS_CALLS, MK_DS_CALL_END);
        reprocess(p, c);
        return;
      }
      hbuf_clear(&p->name);
      p->st = S_DS_NAME;
      /* fall through */
    case S_DS_NAME:
      if (c == '\n' || c == '{') {
        trim_name(&p->name);
        if (!name_ok(&p->name)) {
          fail(p, -1);
          return;
        }
        p->name_done = true;
        p->st = S_DS_FENCE;
        if (c == '{') reprocess(p, c);
        return;
      }
      if (p->name.len >= NAME_LIMIT) {
        fail(p, -1);
        return;
      }
      hbuf_putc(&p->name, (char)c);
      return;
    case S_DS_FENCE:
      if (is_ws(c) || (c && strchr("`json", c))) return;
      if (c == '{') {
        sargs_start(p, S_DS_TAIL, S_DS_CALLS, MK_DS_CALL_END);
        reprocess(p, c);
        return;
      }
      fail(p, -1);
      return;
    case S_DS_TAIL: /* the closing fence */
      if (is_ws(c) || c == '`') return;
      p->st = S_TEXT;
      reprocess(p, c);
      return;
    case S_G_CALL:
      if (c == '{') {
        size_t s = 0;
        if (p->hdr.len >= 5 && !memcmp(p->hdr.data, "call:", 5)) s = 5;
        hbuf_clear(&p->name);
        hbuf_append(&p->name, p->hdr.data ? p->hdr.data + s : "", p->hdr.len - s);
        trim_name(&p->name);
        if (!name_ok(&p->name)) {
          fail(p, -1);
          return;
        }
        p->ckind = CK_GEMMA;
        p->rec_state = S_TEXT;
        p->rec_mk = MK_G_CALL_END;
        begin_call(p);
        p->gdepth = 0;
        gemma_open(p, '{');
        p->st = S_G_ARGS;
        return;
      }
      if (p->hdr.len >= NAME_LIMIT || c == '\n') {
        fail(p, -1);
        return;
      }
      hbuf_putc(&p->hdr, (char)c);
      return;
    case S_G_ARGS: gemma_put(p, c); return;
    case S_H_OUT: text_put(p, c); return;
    case S_H_HDR:
      if (p->hdr.len < HEADER_LIMIT) hbuf_putc(&p->hdr, (char)c);
      return;
    case S_H_MSG:
      if (p->hkind == TC_REASONING) reason_put(p, c);
      else text_put(p, c);
      return;
    case S_H_SKIP:
    case S_SKIP: return;
  }
}

static void harmony_to_header(tc_parser *p, const char *init) {
  if (p->st == S_H_MSG && p->hkind == TC_REASONING) reason_end(p);
  hbuf_clear(&p->hdr);
  hbuf_puts(&p->hdr, init);
  p->st = S_H_HDR;
}

static void on_marker(tc_parser *p, int id, const char *s, size_t n) {
  p->raw_added = false;
  if (p->in_call && !p->begun) hbuf_append(&p->raw, s, n);
  if (id == MK_DROP) return;
  switch (p->st) {
    case S_TEXT:
      switch (id) {
        case MK_THINK:
          p->st = S_REASON;
          p->label_pos = p->syn->thought_label ? 0 : -1;
          return;
        case MK_TC: call_start(p, s, n, S_TEXT); p->st = S_TCB; return;
        case MK_FUNC:
          call_start(p, s, n, S_TEXT);
          p->rec_mk = -1;
          p->after = S_TEXT;
          p->st = S_QC_NAME;
          return;
        case MK_PYTAG: call_start(p, "", 0, S_TEXT); p->reply_start = false; p->st = S_PYTAG; return;
        case MK_MI_CALLS: call_start(p, s, n, S_TEXT); p->mi_array = 0; p->st = S_MI_START; return;
        case MK_GEN_CALLS: call_start(p, s, n, S_TEXT); p->mi_array = 1; p->st = S_MI_ARR; return;
        case MK_DS_CALLS: call_start(p, s, n, S_TEXT); p->st = S_DS_CALLS; return;
        case MK_DS_CALL: call_start(p, s, n, S_TEXT); hbuf_clear(&p->hdr); p->st = S_DS_HEAD; return;
        case MK_G_CALL: call_start(p, s, n, S_TEXT); hbuf_clear(&p->hdr); p->st = S_G_CALL; return;
      }
      return;
    case S_REASON:
      reason_end(p);
      p->st = S_TEXT;
      return;
    case S_TCB:
      if (id == MK_FUNC) {
        p->after = S_QC_END;
        p->st = S_QC_NAME;
      } else {
        fail(p, -1);
      }
      return;
    case S_TC_TAIL:
    case S_QC_END: p->st = S_TEXT; return;
    case S_QC_PARAMS:
      if (id == MK_PARAM) {
        hbuf_clear(&p->key);
        p->st = S_QC_PNAME;
      } else {
        args_emit(p, "}", 1);
        end_call(p);
        p->st = id == MK_FUNC_END ? p->after : S_TEXT;
      }
      return;
    case S_QC_VALUE:
      syn_value_end(p);
      if (id == MK_PARAM_END) p->st = S_QC_PARAMS;
      else if (id == MK_NL_PARAM) p->st = S_QC_PNAME;
      else {
        args_emit(p, "}", 1);
        end_call(p);
        p->st = p->after;
      }
      return;
    case S_GLM_ARGS:
      if (id == MK_ARG_KEY) {
        hbuf_clear(&p->key);
        p->st = S_GLM_KEY;
      } else {
        args_emit(p, "}", 1);
        end_call(p);
        p->st = S_TEXT;
      }
      return;
    case S_GLM_KEY: p->st = S_GLM_VSTART; return;
    case S_GLM_VSTART:
      syn_value_start(p, true);
      p->st = S_GLM_VALUE;
      return;
    case S_GLM_VALUE:
      syn_value_end(p);
      p->st = S_GLM_ARGS;
      return;
    case S_L3_AFTER: call_start(p, "", 0, S_TEXT); p->st = S_PYTAG; return;
    case S_MI_NAME:
      if (!name_ok(&p->name)) {
        fail(p, -1);
        return;
      }
      p->name_done = true;
      if (id == MK_MI_CALL_ID) p->st = S_MI_CALLID;
      else sargs_start(p, S_TEXT, S_TEXT, -1);
      return;
    case S_MI_CALLID: sargs_start(p, S_TEXT, S_TEXT, -1); return;
    case S_DS_CALLS:
      if (id == MK_DS_CALL) {
        if (!p->in_call) call_start(p, s, n, S_TEXT);
        hbuf_clear(&p->hdr);
        p->st = S_DS_HEAD;
      } else {
        p->in_call = false;
        p->st = S_TEXT;
      }
      return;
    case S_DS_HEAD:
      hbuf_clear(&p->name);
      p->st = S_DS_SEP;
      return;
    case S_DS_TAIL: p->st = id == MK_DS_CALL_END ? S_DS_CALLS : S_TEXT; return;
    case S_G_CALL: fail(p, -1); return;
    case S_G_ARGS:
      if (id == MK_G_STR) {
        gemma_str_marker(p);
      } else { /* the end marker before the arguments closed */
        gemma_close_all(p);
        end_call(p);
        p->st = S_TEXT;
      }
      return;
    case S_G_TAIL: p->st = S_TEXT; return;
    case S_H_OUT:
    case S_H_MSG:
    case S_H_SKIP:
      if (id == MK_H_START) harmony_to_header(p, "");
      else if (id == MK_H_CHANNEL) harmony_to_header(p, "<|channel|>");
      else {
        if (p->st == S_H_MSG && p->hkind == TC_REASONING) reason_end(p);
        p->st = S_H_OUT;
      }
      return;
    case S_H_HDR:
      if (id == MK_H_MESSAGE) harmony_header(p);
      else if (id == MK_H_START) hbuf_clear(&p->hdr);
      else if (p->hdr.len < HEADER_LIMIT) hbuf_append(&p->hdr, s, n);
      return;
    case S_ARGS: /* harmony: the message ended inside the arguments */
      if (p->in_call && !p->begun) {
        fail(p, -1);
        return;
      }
      close_call(p);
      p->st = S_H_OUT;
      return;
    case S_SKIP: p->st = p->skip_to; return;
  }
}

/* One byte through the state's marker matcher. */
static void step(tc_parser *p, unsigned char c) {
  mk m[40];
  int n = state_markers(p, m);
  if (!n) {
    on_byte(p, c);
    return;
  }
  if (!p->pend.len) {
    bool may = false;
    for (int i = 0; i < n && !may; i++) may = (unsigned char)m[i].s[0] == c;
    if (!may) {
      on_byte(p, c);
      return;
    }
  }
  hbuf_putc(&p->pend, (char)c);
  if (p->pend.oom) return;
  bool prefix = false;
  for (int i = 0; i < n; i++) {
    size_t l = strlen(m[i].s);
    if (p->pend.len > l || memcmp(m[i].s, p->pend.data, p->pend.len)) continue;
    if (p->pend.len == l) {
      hbuf_clear(&p->pend);
      on_marker(p, m[i].id, m[i].s, l);
      return;
    }
    prefix = true;
  }
  if (prefix) return;
  unsigned char b0 = (unsigned char)p->pend.data[0];
  char rest[64];
  size_t nr = p->pend.len - 1;
  if (nr > sizeof rest) nr = sizeof rest; /* markers are shorter than this */
  memcpy(rest, p->pend.data + 1, nr);
  hbuf_clear(&p->pend);
  replay_front(p, rest, nr, NULL, 0);
  on_byte(p, b0);
}

static bool oom(const tc_parser *p) {
  return p->pend.oom || p->rp.oom || p->out.oom || p->raw.oom || p->apend.oom || p->name.oom || p->text.ws.oom ||
         p->reason.ws.oom || p->key.oom || p->cap.oom || p->val.oom || p->vtrail.oom || p->hdr.oom;
}

static int run(tc_parser *p, const char *s, size_t n) {
  size_t i = 0;
  while (!p->stop && !oom(p)) {
    unsigned char c;
    if (p->rp_pos < p->rp.len) c = (unsigned char)p->rp.data[p->rp_pos++];
    else if (i < n) c = (unsigned char)s[i++];
    else break;
    step(p, c);
  }
  if (p->rp_pos >= p->rp.len) {
    hbuf_clear(&p->rp);
    p->rp_pos = 0;
  }
  return oom(p) ? HEARTH_ENOMEM : 0;
}

/* ---------------------------------------------------------------------------
 * Public API. */

const char *tc_format_name(tc_format f) { return (unsigned)f < TC_FORMAT_COUNT ? SYNTAXES[f].name : "unknown"; }

int tc_format_from_name(const char *name) {
  for (int i = 0; name && i < TC_FORMAT_COUNT; i++)
    if (!strcmp(name, SYNTAXES[i].name)) return i;
  return -1;
}

tc_format tc_format_detect(const char *t) {
  if (!t) return TC_NONE;
  if (strstr(t, "<|channel|>") && (strstr(t, "<|message|>") || strstr(t, "to=functions"))) return TC_HARMONY;
  if (strstr(t, "<|tool_call>") || strstr(t, "<|\"|>")) return TC_GEMMA4;
  if (strstr(t, "tool▁calls▁begin") || strstr(t, "tool▁call▁begin")) return TC_DEEPSEEK;
  if (strstr(t, "<arg_key>")) return TC_GLM;
  if (strstr(t, "<parameter=") || (strstr(t, "<function=") && strstr(t, "<tool_call>"))) return TC_QWEN3_CODER;
  if (strstr(t, "<tool_call>")) return TC_HERMES;
  if (strstr(t, "[TOOL_CALLS]")) return TC_MISTRAL;
  /* Llama 3 derivatives with call syntaxes of their own */
  if (strstr(t, "<function=") || strstr(t, "functools") || strstr(t, ">>>")) return TC_NONE;
  if (strstr(t, "<|python_tag|>") || strstr(t, "<|start_header_id|>")) return TC_LLAMA3;
  return TC_NONE;
}

bool tc_prompt_opens_reasoning(const char *prompt, size_t len) {
  if (!prompt) return false;
  while (len && is_ws((unsigned char)prompt[len - 1])) len--;
  static const char *const opens[] = {"<think>", "[THINK]"};
  for (size_t i = 0; i < sizeof opens / sizeof opens[0]; i++) {
    size_t l = strlen(opens[i]);
    if (len >= l && !memcmp(prompt + len - l, opens[i], l)) return true;
  }
  return false;
}

int tc_parser_new(const tc_opts *o, tc_parser **out, herr *err) {
  *out = NULL;
  if (!o || (unsigned)o->format >= TC_FORMAT_COUNT)
    return herr_set(err, HEARTH_EINVAL, "tool-call parser: unknown format %d", o ? (int)o->format : -1);
  tc_parser *p = calloc(1, sizeof *p);
  if (!p) return herr_set(err, HEARTH_ENOMEM, "tool-call parser: out of memory");
  p->o = *o;
  p->syn = tc_syntax_of(o->format);
  p->out_kind = TC_TEXT;
  p->reply_start = true;
  p->label_pos = -1;
  /* plain text keeps its whitespace; after a reasoning block or a call
   * (and in harmony's channels) the leading whitespace is dropped */
  p->text.started = !p->syn->channels && !(o->in_reasoning && o->reasoning);
  if (p->syn->channels) {
    p->st = S_H_OUT;
  } else if (o->in_reasoning && o->reasoning) {
    p->st = S_REASON;
  } else {
    p->st = S_TEXT;
  }
  *out = p;
  return 0;
}

static int result(tc_parser *p, int rc, herr *err) {
  if (rc) return herr_set(err, rc, "tool-call parser: out of memory");
  return p->stop;
}

int tc_parser_feed(tc_parser *p, const char *s, size_t n, tc_event_fn fn, void *ctx, herr *err) {
  if (p->stop) return p->stop;
  p->fn = fn;
  p->ctx = ctx;
  int rc = run(p, s, n);
  if (!rc) out_flush(p, false);
  return result(p, rc, err);
}

/* Cut off inside a call: end it when its name is complete, else give it back. */
static void cut_call(tc_parser *p) {
  if (p->begun) {
    close_call(p);
    hbuf_clear(&p->pend);
    return;
  }
  bool json = p->st == S_JOBJ || p->st == S_ARGS || p->st == S_DS_FENCE || p->st == S_MI_CALLID;
  if (json && p->name_done && (!p->args_seen || p->args_done)) {
    p->ckind = CK_JSON;
    p->in_args = false;
    begin_call(p);
    close_call(p);
    hbuf_clear(&p->pend);
    return;
  }
  give_back(p);
}

int tc_parser_finish(tc_parser *p, tc_event_fn fn, void *ctx, herr *err) {
  if (p->stop) return p->stop;
  p->fn = fn;
  p->ctx = ctx;
  int rc;
  for (;;) {
    if ((rc = run(p, NULL, 0))) return result(p, rc, err);
    if (p->stop) return p->stop;
    if (!p->in_call) break;
    cut_call(p);
  }
  /* held bytes that did not become a marker */
  hbuf held = {0};
  hbuf_append(&held, p->pend.data ? p->pend.data : "", p->pend.len);
  hbuf_clear(&p->pend);
  for (size_t i = 0; i < held.len; i++) {
    unsigned char c = (unsigned char)held.data[i];
    if (p->st == S_TEXT || p->st == S_H_OUT || (p->st == S_H_MSG && p->hkind == TC_TEXT)) text_put(p, c);
    else if (p->st == S_REASON || p->st == S_H_MSG) reason_put(p, c);
  }
  hbuf_free(&held);
  /* trailing whitespace of the content is kept, unless a call came after it */
  if (p->text.started && !p->ws_after_call && p->text.ws.len) {
    emit(p, TC_TEXT, p->text.ws.data, p->text.ws.len);
    hbuf_clear(&p->text.ws);
  }
  if (p->label_pos > 0) reason_end(p);
  out_flush(p, true);
  return result(p, oom(p) ? HEARTH_ENOMEM : 0, err);
}

int tc_parser_calls(const tc_parser *p) { return p ? p->ncalls : 0; }

void tc_parser_free(tc_parser *p) {
  if (!p) return;
  hbuf *bufs[] = {&p->pend, &p->rp,  &p->out, &p->text.ws, &p->reason.ws, &p->raw,    &p->name,
                  &p->apend, &p->key, &p->cap, &p->val,     &p->vtrail,    &p->hdr};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) hbuf_free(bufs[i]);
  free(p);
}

/* --- tc_parse_all --- */

typedef struct collect {
  hbuf content, reasoning, args;
  bool any_reasoning;
  json_t *calls;
  json_t *cur;
  bool oom;
} collect;

static int collect_event(void *ctx, const tc_event *ev) {
  collect *c = ctx;
  switch (ev->kind) {
    case TC_TEXT: hbuf_append(&c->content, ev->text, ev->len); break;
    case TC_REASONING:
      c->any_reasoning = true;
      hbuf_append(&c->reasoning, ev->text, ev->len);
      break;
    case TC_CALL_BEGIN:
      json_decref(c->cur);
      c->cur = json_object();
      hbuf_clear(&c->args);
      if (!c->cur || json_object_set_new(c->cur, "name", json_string(ev->name))) c->oom = true;
      break;
    case TC_CALL_ARGS: hbuf_append(&c->args, ev->text, ev->len); break;
    case TC_CALL_END:
      if (!c->cur || json_object_set_new(c->cur, "arguments", json_stringn(hbuf_str(&c->args), c->args.len)) ||
          json_array_append_new(c->calls, c->cur))
        c->oom = true;
      c->cur = NULL;
      break;
  }
  return 0;
}

int tc_parse_all(const tc_opts *o, const char *text, size_t len, char **content, char **reasoning, json_t **calls,
                 herr *err) {
  if (content) *content = NULL;
  if (reasoning) *reasoning = NULL;
  if (calls) *calls = NULL;
  tc_parser *p;
  int rc = tc_parser_new(o, &p, err);
  if (rc) return rc;
  collect c = {.calls = json_array()};
  if (!c.calls) rc = herr_set(err, HEARTH_ENOMEM, "tool-call parser: out of memory");
  if (!rc) rc = tc_parser_feed(p, text, len, collect_event, &c, err);
  if (!rc) rc = tc_parser_finish(p, collect_event, &c, err);
  tc_parser_free(p);
  json_decref(c.cur);
  if (!rc && (c.oom || c.content.oom || c.reasoning.oom || c.args.oom))
    rc = herr_set(err, HEARTH_ENOMEM, "tool-call parser: out of memory");
  if (!rc) {
    if (content && !(*content = hbuf_take(&c.content))) rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    if (!rc && reasoning && c.any_reasoning && !(*reasoning = hbuf_take(&c.reasoning)))
      rc = herr_set(err, HEARTH_ENOMEM, "out of memory");
    if (!rc && calls) {
      *calls = c.calls;
      c.calls = NULL;
    }
  }
  if (rc && content) {
    free(*content);
    *content = NULL;
  }
  if (rc && reasoning) {
    free(*reasoning);
    *reasoning = NULL;
  }
  hbuf_free(&c.content);
  hbuf_free(&c.reasoning);
  hbuf_free(&c.args);
  json_decref(c.calls);
  return rc;
}

/* --- forced calls --- */

bool tc_forced_call(tc_format f, const char *name, hbuf *out) {
  const tc_syntax *syn = tc_syntax_of(f);
  if (!syn->forced_open) return false;
  hbuf_puts(out, syn->forced_open);
  if (name && syn->forced_named) hbuf_printf(out, syn->forced_named, name);
  return true;
}

