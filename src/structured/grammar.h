/* grammar.h — output that follows a grammar.
 *
 * Grammars are written in GBNF, the notation of llama.cpp's `grammars/`:
 *
 *   root   ::= object                  # a rule; `root` is where matching starts
 *   object ::= "{" ws pair ("," ws pair)* "}"
 *   pair   ::= [a-z]+ ":" ws ("true" | "false")
 *   ws     ::= [ \t\n]*
 *
 * Literals "..." and character classes [...] / [^...] (escapes \n \r \t \\
 * \" \] \xHH \uHHHH \UHHHHHHHH), `.` (any character), rule names, groups,
 * alternatives `|`, and the postfix operators * + ? {m} {m,} {m,n}; `#`
 * comments. A rule runs until the next `name ::=`. Characters are Unicode
 * code points; the text is UTF-8. A token terminal matches one whole token:
 * `<[123]>` by id, or `<|tool_call|>` by its text, brackets included — the
 * text a token adds, or a special token's name (grammar_vocab_name). Special
 * tokens (tool-call markers) have no bytes and are reachable only so; a
 * terminal naming a token no vocabulary has is refused when a matcher is made.
 *
 * grammar_compile checks the text (every rule defined, no left recursion,
 * bounded repetition counts) and gives an immutable grammar. A matcher runs
 * it as a pushdown automaton over the output's bytes: for the text so far it
 * gives the set of tokens that may come next as a bitmask over the
 * vocabulary (walking a trie of the tokens' bytes), and advances by the token
 * chosen. Automaton states (sets of parse stacks) are interned, their byte
 * transitions and token masks cached, so a state seen before costs a lookup:
 * inside a JSON string the state does not change from token to token. End
 * tokens (EOS) are allowed exactly where the grammar may end.
 */
#ifndef HEARTH_STRUCTURED_GRAMMAR_H
#define HEARTH_STRUCTURED_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"

typedef struct grammar grammar;

/* Compiles GBNF text (start rule "root"). HEARTH_EINVAL with a message naming
 * the line and the problem. */
int grammar_compile(const char *text, size_t len, grammar **out, herr *err);
void grammar_free(grammar *g);
/* Appends GBNF text with every rule name prefixed (literals, classes,
 * repetition counts and comments untouched), so grammars can be combined without clashes. -1 when
 * out of memory. */
int grammar_prefix_rules(const char *text, size_t len, const char *prefix, hbuf *out);
size_t grammar_rule_count(const grammar *g);

/* The vocabulary as bytes: what each token adds to the text when it follows
 * other text. Special tokens are left out (they never match a grammar; end
 * tokens are handled apart). Immutable once made; shared by matchers. */
typedef struct grammar_vocab grammar_vocab;
/* Token i is bytes[i][0..lens[i]); lens[i] == 0 leaves it out. */
int grammar_vocab_from_bytes(const char *const *bytes, const size_t *lens, int32_t n, grammar_vocab **out, herr *err);
void grammar_vocab_free(grammar_vocab *v);
int32_t grammar_vocab_size(const grammar_vocab *v);
/* Names token id by text (a special token's), for the grammar's <text> terminals. */
int grammar_vocab_name(grammar_vocab *v, int32_t id, const char *text, herr *err);

typedef struct grammar_matcher grammar_matcher;

/* A matcher at the start of g. end_ids: the tokens that end generation, allowed
 * where the grammar may end. g and v are borrowed and must outlive it. */
int grammar_matcher_new(const grammar *g, const grammar_vocab *v, const int32_t *end_ids, int n_end,
                        grammar_matcher **out, herr *err);
void grammar_matcher_free(grammar_matcher *m);

/* The tokens allowed next: a bitmask of grammar_vocab_size bits (bit id of
 * word id / 64), owned by the matcher and valid until its next call. *n_allowed
 * (may be NULL) counts them; 0 means the grammar cannot go on (never happens
 * when an end token exists and the text so far is complete). */
int grammar_matcher_mask(grammar_matcher *m, const uint64_t **mask, int32_t *n_allowed, herr *err);
/* The fewest characters the text still needs to be a complete sentence (0 when it may end). */
uint32_t grammar_matcher_distance(grammar_matcher *m);
/* As grammar_matcher_mask, for a request with tokens_left tokens still to
 * come (this one and the end token included): tokens after which the text
 * could no longer be completed in time (counting one character per token) are
 * left out, so a document cut short by max_tokens still ends complete. When
 * nothing fits, only tokens that bring an end closer; when none does, the full
 * mask. The full mask's cached bound on how far one token can lead makes this
 * free while the budget is large. */
int grammar_matcher_mask_budget(grammar_matcher *m, int64_t tokens_left, const uint64_t **mask, int32_t *n_allowed,
                                herr *err);
/* Whether id is allowed next, without computing the whole mask. */
bool grammar_matcher_allows(grammar_matcher *m, int32_t id);
/* Advances by id. HEARTH_EINVAL (state unchanged) when id is not allowed. An
 * end token moves the matcher to its finished state. */
int grammar_matcher_accept(grammar_matcher *m, int32_t id, herr *err);
/* The text so far is a complete sentence of the grammar. */
bool grammar_matcher_can_end(const grammar_matcher *m);
/* Advances by raw text (tests, forced prefixes). HEARTH_EINVAL when it does not fit. */
int grammar_matcher_accept_text(grammar_matcher *m, const char *s, size_t n, herr *err);

#endif
