/* fuzz_train_data.c — a training data line (train_example_from_json) and a
 * preference line (train_pair_from_json) over arbitrary bytes parsed as
 * JSON, with the built-in model's tokenizer and chat template: each must
 * refuse with a message, or give examples (a pair's two sides) of at least
 * two tokens, at most the sequence length, every id in the vocabulary, the
 * first token unlearned and some token learned. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/json.h"
#include "chat/chat.h"
#include "tokenizer/tokenizer.h"
#include "train/train.h"

static tokenizer *tok;
static chat_template tmpl;

/* A whole example, freed. */
static void check(train_example *ex, int64_t seq_len) {
  if (ex->n < 2 || ex->n > seq_len || ex->loss[0]) abort();
  int learned = 0;
  for (int64_t i = 0; i < ex->n; i++) {
    if (ex->ids[i] < 0 || ex->ids[i] >= tokenizer_vocab_size(tok)) abort();
    learned += ex->loss[i] != 0;
  }
  if (!learned) abort();
  free(ex->ids);
  free(ex->loss);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!tok) {
    herr e = {0};
    const char *dir = HEARTH_SOURCE_DIR "/models/default";
    if (tokenizer_load(dir, &tok, &e) || chat_template_load(dir, &tmpl, &e)) {
      fprintf(stderr, "%s: %s\n", dir, e.msg);
      abort();
    }
  }
  herr err = {0};
  json_t *j = hjson_load_buf((const char *)data, size, "line", &err);
  if (!j) return 0;
  train_example ex;
  const int64_t seq_len = 64;
  if (train_example_from_json(j, "line", tok, &tmpl, seq_len, &ex, &err)) {
    if (!err.msg[0]) abort();
  } else {
    check(&ex, seq_len);
  }
  herr perr = {0};
  train_pair p;
  if (train_pair_from_json(j, "line", tok, &tmpl, seq_len, &p, &perr)) {
    if (!perr.msg[0]) abort();
  } else {
    check(&p.chosen, seq_len);
    check(&p.rejected, seq_len);
  }
  json_decref(j);
  return 0;
}
