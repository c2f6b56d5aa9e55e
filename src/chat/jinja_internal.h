/* jinja_internal.h — what the Jinja2 engine's files share: the arena, the
 * value model (Python's types as templates observe them), tokens and the
 * syntax tree. Not for use outside src/chat/jinja_*.c. */
#ifndef HEARTH_CHAT_JINJA_INTERNAL_H
#define HEARTH_CHAT_JINJA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"
#include "chat/jinja.h"

/* ---- arena: every value of a render and every node of a template lives in one ---- */
typedef struct jarena_chunk jarena_chunk;
typedef struct jarena {
  jarena_chunk *head; /* owned list */
  size_t used, limit; /* bytes handed out; 0 limit = unlimited */
  bool over;          /* the limit was hit */
} jarena;

void *jarena_alloc(jarena *a, size_t n); /* zeroed; NULL when over the limit or out of memory */
char *jarena_strdup(jarena *a, const char *s, size_t n);
void jarena_free(jarena *a);

/* ---- values ---- */
typedef enum jtype {
  JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_NS, JV_FUNC, JV_LOOP
} jtype;

/* Lazy Python objects templates can observe: generators (map, select, ...),
 * reversed(list), dict.items()/keys()/values(). Held as lists, printed and
 * refused (len, tojson, indexing) as Python does. */
enum jview { VIEW_NONE, VIEW_GENERATOR, VIEW_REVITER, VIEW_ITEMS, VIEW_KEYS, VIEW_VALUES };

typedef struct jstr { size_t len; char data[]; } jstr; /* NUL-terminated */
typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jfunc jfunc;
typedef struct jloop jloop;

typedef struct jv {
  uint8_t t;
  bool tuple;  /* JV_LIST: a tuple (prints with parentheses) */
  bool markup;  /* JV_STR: a markupsafe.Markup (|safe, |escape): `+` escapes the other side */
  uint8_t view; /* JV_LIST: a Python iterator or dict view (jview) rather than a list */
  union {
    bool b;
    int64_t i;
    double f;
    jstr *s;
    jlist *l;
    jdict *d; /* JV_DICT and JV_NS */
    jfunc *fn;
    jloop *loop;
    const char *hint; /* JV_UNDEF: the UndefinedError message when used */
  };
} jv;

struct jlist {
  size_t n, cap;
  jv *items;
  const char *error; /* a generator whose source could not be iterated: raised when it is */
  size_t consumed;   /* generators / iterators: items already taken (Python iterates them once) */
};
struct jdict { size_t n, cap; jv *keys; jv *vals; };

/* ---- tokens ---- */
typedef enum jtok {
  T_EOF, T_DATA, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP
} jtok;

typedef struct jtoken {
  uint8_t type;
  int line;
  const char *s; /* T_DATA / T_STRING: processed bytes (arena); others: source bytes */
  size_t len;
  int64_t i;
  double f;
} jtoken;

/* ---- syntax tree ---- */
typedef enum jnode_kind {
  /* expressions */
  E_CONST, E_NAME, E_LIST, E_TUPLE, E_DICT, E_GETATTR, E_GETITEM, E_SLICE, E_CALL, E_FILTER, E_TEST,
  E_BIN, E_NEG, E_POS, E_NOT, E_AND, E_OR, E_COND, E_COMPARE, E_CONCAT, E_NSREF, E_FILTER_INPUT,
  /* statements */
  S_DATA, S_OUTPUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_CALLBLOCK, S_FILTERBLOCK, S_BREAK,
  S_CONTINUE, S_WITH, S_SCOPE
} jnode_kind;

typedef enum jop {
  OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
  OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN
} jop;

typedef struct jnode jnode;
struct jnode {
  uint8_t kind, op;
  bool flag;           /* S_FOR / E_NSREF targets: a tuple of names */
  bool konst;          /* an expression Jinja2's compiler may fold to a constant (jinja_mark_constants) */
  bool konst_known;
  int line;
  jnode *a, *b, *c, *d;
  jnode **list; int n;   /* items / positional args / body / operands */
  jnode **list2; int n2; /* dict values / keyword arg values / else body / defaults */
  const char **names; int nnames; /* keyword names / parameters / targets */
  uint8_t *ops;          /* E_COMPARE operators (n-1 of them) */
  const char *str; size_t slen; /* names, data */
  jv lit;                /* E_CONST */
};

struct jinja_template {
  jarena arena;  /* owns every node and string */
  jnode *body;
  char *name;    /* owned */
};

/* Lexes src into tokens (*toks malloc'd, freed by the caller; their strings live in the arena). Returns 0 or HEARTH_EFORMAT with "<line>: msg" in err. */
int jinja_lex(jarena *a, const char *src, size_t len, jtoken **toks, size_t *ntoks, herr *err, int *err_line);

/* Marks the expressions Jinja2 would fold at compile time (jnode.konst), once
 * after parsing so that rendering never writes to the tree (jinja_render.c). */
void jinja_mark_constants(jnode *n, int depth);

/* Filter / test names the engine implements (jinja_builtins.c). */
bool jinja_known_filter(const char *name);
bool jinja_known_test(const char *name);

/* ---- value helpers (jinja_value.c) ---- */
jv jv_undef(const char *hint);
jv jv_none(void);
jv jv_bool(bool b);
jv jv_int(int64_t i);
jv jv_float(double f);
jv jv_str(jarena *a, const char *s, size_t n); /* JV_UNDEF with hint NULL on arena exhaustion: check jarena.over */
jv jv_cstr(jarena *a, const char *s);
jv jv_list(jarena *a, size_t cap);
jv jv_dict(jarena *a, size_t cap);
bool jlist_push(jarena *a, jlist *l, jv v);
bool jdict_set(jarena *a, jdict *d, jv key, jv val);
jv *jdict_get(const jdict *d, jv key);
jv *jdict_gets(const jdict *d, const char *key);
bool jv_truthy(jv v);
bool jv_equal(jv a, jv b);
/* Python ordering: 0 and *cmp set, or -1 when the types cannot be ordered. */
int jv_compare(jv a, jv b, int *cmp);
bool jv_is_number(jv v);
double jv_as_double(jv v);
const char *jv_type_name(jv v); /* Python's name: 'str', 'int', 'dict', 'NoneType', ... */
/* str(v) appended to b. */
void jv_to_str(hbuf *b, jv v);
/* repr(v) appended to b. */
void jv_repr(hbuf *b, jv v);
void jv_float_repr(hbuf *b, double f);
/* json.dumps(v, ensure_ascii, indent (<0 none), separators (NULL: default), sort_keys). Returns
 * false and sets *bad to the offending value's type name when it is not serializable. */
bool jv_to_json(hbuf *b, jv v, bool ensure_ascii, int indent, const char *item_sep, const char *key_sep,
                bool sort_keys, const char **bad, int depth);
/* Converts jansson into values (objects keep their order). */
jv jv_from_json(jarena *a, const json_t *j, int depth);

#endif
