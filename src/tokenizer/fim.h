/* fim.h — fill-in-the-middle prompts: a vocabulary's FIM tokens, found by
 * their strings as llama.cpp's vocabulary finds them, and the token layout
 * llama.cpp's server builds for /infill (prefix-suffix-middle, with the
 * repository-level context of Qwen2.5-Coder's paper when the vocabulary has
 * its tokens). */
#ifndef HEARTH_TOKENIZER_FIM_H
#define HEARTH_TOKENIZER_FIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tokenizer/tokenizer.h"

/* A vocabulary's FIM tokens; -1 where it has none. */
typedef struct tokenizer_fim {
  int32_t pre, suf, mid; /* <|fim_prefix|> <|fim_suffix|> <|fim_middle|> and their kin */
  int32_t pad;           /* <|fim_pad|> */
  int32_t rep;           /* <|repo_name|>: the repository's name follows */
  int32_t sep;           /* <|file_sep|>: a file's name and text follow */
} tokenizer_fim;

/* Finds them by their strings (Qwen's <|fim_prefix|>, StarCoder's and
 * Granite's <fim_prefix>, <fim-prefix>, DeepSeek's <｜fim▁begin｜>, CodeLlama's
 * <PRE> / ▁<PRE>, GLM's <|code_prefix|>, and the same for the others). */
void tokenizer_fim_find(const tokenizer *t, tokenizer_fim *out);
/* Whether it can fill: prefix, suffix and middle tokens all present. */
bool tokenizer_fim_ok(const tokenizer_fim *f);

/* One file of context before the prefix (llama.cpp's input_extra). */
typedef struct tokenizer_fim_chunk {
  const char *filename; /* NULL: "tmp" (llama.cpp's default) */
  const char *text;
} tokenizer_fim_chunk;

/* The prompt llama.cpp's format_infill builds, token for token (texts
 * tokenized without special tokens parsed or added, and the FIM tokens'
 * strings in them read as text, as llama.cpp, which makes them control
 * tokens, reads them):
 *   [REP] "myproject\n" ([SEP] filename "\n" text)... [SEP] "filename\n"   (with REP / SEP tokens;
 *        without SEP each chunk is "\n\n--- snippet ---\n\n" text)
 *   [BOS when the tokenizer adds one] PRE prefix prompt SUF suffix MID
 * keeping the last 3·b/4 prefix tokens, the first b/4 − 2 − |prompt| suffix
 * tokens (b = min(2048, n_ctx), llama.cpp's batch), and the last
 * n_ctx − b − 2·n_predict tokens of the context before (n_predict −1: unset).
 * *ids malloc'd. HEARTH_EUNSUPPORTED when the vocabulary has no FIM tokens. */
int tokenizer_fim_prompt(const tokenizer *t, const tokenizer_fim *f, const char *prefix, const char *suffix,
                         const char *prompt, const tokenizer_fim_chunk *extra, int n_extra, int64_t n_ctx,
                         int64_t n_predict, int32_t **ids, size_t *n, herr *err);

#endif
