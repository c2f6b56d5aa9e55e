/* jinja_eval.h — what the evaluator (jinja_render.c) and the builtins
 * (jinja_builtins.c: filters, tests, methods, globals) share. Internal. */
#ifndef HEARTH_CHAT_JINJA_EVAL_H
#define HEARTH_CHAT_JINJA_EVAL_H

#include "chat/jinja_internal.h"

#define TRY(x)           \
  do {                   \
    int rc_ = (x);       \
    if (rc_) return rc_; \
  } while (0)

typedef struct jscope jscope;
struct jscope {
  jscope *parent; /* borrowed */
  jdict vars;
};

struct jloop {
  jv *items;
  size_t n, i;
  int depth;
};

/* A callable: a macro (macro != NULL), a builtin global, or a bound method. */
struct jfunc {
  const char *name;
  jnode *macro;       /* S_MACRO or S_CALLBLOCK node */
  jscope *closure;
  bool uses_varargs, uses_kwargs;
  jv caller;          /* JV_FUNC when called from a call block */
  int builtin;        /* builtin id when not a macro */
  jv self;            /* bound methods: the object; cycler/joiner: state */
};

typedef struct jargs {
  jv *pos;
  int n;
  const char **kwnames;
  jv *kwvals;
  int nkw;
} jargs;

typedef struct jrender {
  jarena *a;
  const jinja_template *t;
  jinja_limits lim;
  herr *err;
  int line;
  int depth;
  int failed;
  int64_t steps, iterations;
  jv filter_input; /* the body value of a filter block / block set */
  bool folding;    /* evaluating a subtree Jinja2 folds at compile time */
} jrender;

int jr_fail(jrender *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int jr_fail_undef(jrender *r, jv v);
int jr_oom(jrender *r);
int jr_step(jrender *r);
int jr_make_str(jrender *r, const char *s, size_t n, jv *out);
int jr_buf_str(jrender *r, hbuf *b, jv *out); /* frees b */
int jr_to_str(jrender *r, jv v, jv *out);
int jr_str_chars(jrender *r, jv s, jv *out);
size_t jr_cp_len(const char *s, size_t n);
size_t jr_str_cplen(jv s);
jscope *jr_scope(jrender *r, jscope *parent);
jv *jr_lookup(jscope *s, const char *name);
int jr_bind(jrender *r, jscope *s, const char *name, jv v);
int jr_iterate(jrender *r, jv v, jv **items, size_t *n);
int jr_getattr(jrender *r, jv obj, const char *name, jv *out);
int jr_getitem(jrender *r, jv obj, jv key, jv *out);
int jr_binop(jrender *r, int op, jv a, jv b, jv *out);
int jr_contains(jrender *r, jv container, jv item, bool *out);
int jr_compare_op(jrender *r, int op, jv a, jv b, bool *out);
int jr_call(jrender *r, jv callee, jargs *args, jv *out);

/* jinja_builtins.c */
bool jr_has_method(jv obj, const char *name);
int jr_method(jrender *r, jv obj, const char *name, jv *out);
int jr_call_builtin(jrender *r, jfunc *f, jargs *args, jv *out);
int jr_filter(jrender *r, const char *name, jv input, jargs *args, jscope *sc, jv *out);
int jr_test(jrender *r, const char *name, jv x, jargs *args, jscope *sc, bool *out);
int jr_install_globals(jrender *r, jscope *globals);
/* markupsafe.escape: Markup stays as it is; anything else is str()-ed and escaped into Markup. */
int jr_escape(jrender *r, jv v, jv *out);
int jr_percent_format(jrender *r, jv fmt, jv args, jv *out);

#endif
