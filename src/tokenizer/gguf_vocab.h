/* gguf_vocab.h — tokenization from a GGUF file's vocabulary (tokenizer.ggml.*),
 * matching llama.cpp: llama/SPM (scores, byte fallback), gpt2/BPE (merges and
 * the pre-tokenizer regexes chosen by tokenizer.ggml.pre), gemma4 (BPE over
 * raw UTF-8 with <0xXX> byte tokens), bert/WPM, t5/UGM.
 * tokenizer.c wraps this behind the common tokenizer type. */
#ifndef HEARTH_TOKENIZER_GGUF_VOCAB_H
#define HEARTH_TOKENIZER_GGUF_VOCAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/status.h"

struct gguf_file;
typedef struct gguf_vocab gguf_vocab;

int gguf_vocab_load(const struct gguf_file *g, const char *what, gguf_vocab **out, herr *err);
void gguf_vocab_free(gguf_vocab *v);
/* add_special: BOS/EOS as tokenizer.ggml.add_bos_token / add_eos_token say (llama.cpp's defaults
 * per model type when absent); parse_special: special/control tokens in the text become their ids. */
int gguf_vocab_encode(const gguf_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                      int32_t **ids, size_t *n, herr *err);
/* As gguf_vocab_encode; without parse_special the tokens lit[0..nlit) are not read from the text either. */
int gguf_vocab_encode_ex(const gguf_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                         const int32_t *lit, size_t nlit, int32_t **ids, size_t *n, herr *err);
/* Appends the text of ids (as llama.cpp's detokenize with special tokens rendered unless skip_special). */
int gguf_vocab_decode(const gguf_vocab *v, const int32_t *ids, size_t n, bool skip_special, hbuf *out, herr *err);
int32_t gguf_vocab_size(const gguf_vocab *v);
const char *gguf_vocab_token(const gguf_vocab *v, int32_t id);  /* borrowed; NULL out of range */
int32_t gguf_vocab_find(const gguf_vocab *v, const char *token); /* -1 when absent */
bool gguf_vocab_is_special(const gguf_vocab *v, int32_t id);     /* control / user-defined / unknown tokens */
int32_t gguf_vocab_bos(const gguf_vocab *v);                      /* -1 when none */
int32_t gguf_vocab_eos(const gguf_vocab *v);
bool gguf_vocab_is_eog(const gguf_vocab *v, int32_t id);          /* ends generation (EOS, EOT, <|im_end|>, ...) */
bool gguf_vocab_add_bos(const gguf_vocab *v);                     /* encode with add_special puts BOS first */
bool gguf_vocab_add_eos(const gguf_vocab *v);                     /* ... and EOS last */
const char *gguf_vocab_model(const gguf_vocab *v);                /* tokenizer.ggml.model (borrowed) */
/* The text one token decodes to on its own (no leading-space removal, no clean-up); special
 * (control/unknown) tokens give "" unless special. *s is borrowed. EINVAL for an id out of range. */
int gguf_vocab_piece(const gguf_vocab *v, int32_t id, bool special, const char **s, size_t *len, herr *err);

#endif
