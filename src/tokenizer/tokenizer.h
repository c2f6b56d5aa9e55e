/* tokenizer.h — text ⇄ token ids.
 *
 * One opaque type for every source: a Hugging Face tokenizer.json (with the
 * tokenizer_config.json beside it for BOS/EOS and add_bos/add_eos), or the
 * vocabulary inside a GGUF file (tokenizer.ggml.*). Behaviour matches HF
 * `tokenizers` for the former and llama.cpp for the latter.
 */
#ifndef HEARTH_TOKENIZER_H
#define HEARTH_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"

typedef struct tokenizer tokenizer;
struct gguf_file;

/* PATH: a model folder (tokenizer.json [+ tokenizer_config.json]), a
 * tokenizer.json file, or a .gguf file. */
int tokenizer_load(const char *path, tokenizer **out, herr *err);
/* From a tokenizer.json already in memory; config_json (tokenizer_config.json) may be NULL. */
int tokenizer_load_json(const char *json, size_t len, const char *config_json, size_t config_len,
                        const char *what, tokenizer **out, herr *err);
void tokenizer_free(tokenizer *t);

/* Encodes text[0..len). add_special: as HF's add_special_tokens (post-processor,
 * BOS/EOS). parse_special: special/added tokens written in the text become their
 * ids (HF always does this for added tokens; llama.cpp's parse_special=false
 * does not). *ids is malloc'd; caller frees. */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                     int32_t **ids, size_t *n, herr *err);
/* As tokenizer_encode; without parse_special the tokens literal[0..n_literal) are not read from
 * the text either, whatever their kind: their strings are tokenized as text (llama.cpp's control
 * tokens, which its vocabulary makes of the fill-in-the-middle tokens). */
int tokenizer_encode_ex(const tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                        const int32_t *literal, size_t n_literal, int32_t **ids, size_t *n, herr *err);
/* Appends the decoded text of ids to out. skip_special drops special tokens. */
int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, bool skip_special, hbuf *out, herr *err);

int32_t tokenizer_vocab_size(const tokenizer *t);
/* Appends the bytes token id adds to a text it stands in the middle of: no
 * leading-space removal, no UTF-8 repair (a byte-level token may hold part of
 * a character). What output constraints match tokens against. */
int tokenizer_token_bytes(const tokenizer *t, int32_t id, hbuf *out, herr *err);
/* The token's string as stored in the vocabulary (borrowed), or NULL when out of range. */
const char *tokenizer_id_to_token(const tokenizer *t, int32_t id);
/* -1 when absent. */
int32_t tokenizer_token_to_id(const tokenizer *t, const char *token);
bool tokenizer_is_special(const tokenizer *t, int32_t id);
int32_t tokenizer_bos_id(const tokenizer *t);   /* -1 when none */
int32_t tokenizer_eos_id(const tokenizer *t);   /* -1 when none */

/* Streaming detokenization: feed ids one at a time; each call appends to out
 * only text that is final (never a split UTF-8 sequence), so the pieces
 * concatenate to exactly tokenizer_decode of all ids. */
typedef struct tokenizer_stream tokenizer_stream;
tokenizer_stream *tokenizer_stream_new(const tokenizer *t, bool skip_special);
int tokenizer_stream_put(tokenizer_stream *s, int32_t id, hbuf *out, herr *err);
/* Appends whatever is left (at the end of generation). */
int tokenizer_stream_flush(tokenizer_stream *s, hbuf *out, herr *err);
void tokenizer_stream_free(tokenizer_stream *s);

#endif
