/* mm_prompt.h — a prompt holding images, sound or video made ready for the
 * scheduler: each medium decoded (media/), prepared as the model's processor
 * does (model/mm.h), its placeholder in the text expanded to the tower's
 * markers and soft tokens, the whole text tokenized, each medium encoded, and
 * per token what model_seq carries — the embedding row of each soft token, the
 * bidirectional span it belongs to, multimodal RoPE positions — plus the keys
 * the prefix cache hashes (a soft token's key comes from its medium's content
 * hash, so the same image hits and a different one with as many tokens does
 * not). Errors name the medium (hearth_media.name) as the message's prefix and
 * the error's field. */
#ifndef HEARTH_ENGINE_MM_PROMPT_H
#define HEARTH_ENGINE_MM_PROMPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hearth.h"
#include "model/mm.h"
#include "tokenizer/tokenizer.h"

typedef struct mm_prompt {
  int32_t *ids;               /* owned: n tokens */
  size_t n;
  const float **embeds;       /* owned: n entries, NULL for text tokens (rows point into enc) */
  int32_t *bidir_last;        /* owned, NULL when no medium is bidirectional: n entries */
  int32_t *positions3;        /* owned, NULL without multimodal RoPE: 3 per token */
  int64_t pos_delta;          /* with positions3: a token after the prompt at row r has position r + pos_delta */
  int32_t *keys;              /* owned: n prefix-cache keys (the ids, soft tokens replaced) */
  mm_embeds *enc;             /* owned: n_enc encoded media */
  int n_enc;
} mm_prompt;

/* Where media bytes may come from, and how many. */
typedef struct mm_prompt_opts {
  bool allow_local, allow_remote;
  bool allow_private_hosts;   /* remote media may be on non-public addresses */
  size_t max_bytes;           /* 0: the default */
} mm_prompt_opts;

/* The placeholder of kind k for m (NULL: m has no tower for it). */
const char *mm_prompt_placeholder(const model *m, media_kind k);

/* model_name names the model in "model X has no vision tower". */
int mm_prompt_build(model *m, const char *model_name, const tokenizer *tok, const char *text, size_t len, bool add_special,
                    const hearth_media *media, int n_media, const mm_prompt_opts *o, mm_prompt *out, herr *err);
void mm_prompt_free(mm_prompt *p);

#endif
