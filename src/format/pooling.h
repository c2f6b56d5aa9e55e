/* pooling.h — how a sentence-transformers model folder says its embedding is
 * pooled: modules.json (the module pipeline) and the Pooling module's
 * config.json (1_Pooling/config.json in Qwen3-Embedding). A folder without
 * them pools the last token, the form Qwen3-Embedding uses. */
#ifndef HEARTH_FORMAT_POOLING_H
#define HEARTH_FORMAT_POOLING_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

typedef enum pool_mode {
  POOL_LAST = 0,  /* pooling_mode_lasttoken, and the default */
  POOL_MEAN,      /* pooling_mode_mean_tokens */
  POOL_CLS,       /* pooling_mode_cls_token */
  POOL_MAX,       /* pooling_mode_max_tokens */
  POOL_MEAN_SQRT, /* pooling_mode_mean_sqrt_len_tokens: the sum over sqrt(tokens) */
  POOL_WEIGHTED,  /* pooling_mode_weightedmean_tokens: weights 1, 2, ... by position */
  POOL_OTHER      /* several at once (concatenated) */
} pool_mode;

typedef struct pooling_config {
  pool_mode mode;
  char mode_key[64];     /* the config key that set it ("pooling_mode_lasttoken"); "" for the default */
  char unsupported[192]; /* why hearth cannot embed as the folder says (a Dense module, several
                            modes), "" when it can */
} pooling_config;

/* The "path" of the Pooling module in modules.json text (what names the
 * source in messages); pool_path "" when there is none. A module hearth
 * does not run (anything but Transformer, Pooling and Normalize) is written
 * to unsupported (else ""). A path that leaves the folder ("..", "/") is an
 * error. */
int pooling_parse_modules(const char *text, size_t len, const char *what, char *pool_path, size_t path_cap,
                          char *unsupported, size_t unsup_cap, herr *err);
/* A Pooling module's config.json text. */
int pooling_parse_config(const char *text, size_t len, const char *what, pooling_config *out, herr *err);
/* Both, from folder dir (modules.json, else 1_Pooling/config.json); absent
 * files leave the default (last token). */
int pooling_load(const char *dir, pooling_config *out, herr *err);
/* "last token", "mean", "cls", "max", "mean_sqrt_len", "weighted mean", "other". */
const char *pool_mode_name(pool_mode m);

#endif
