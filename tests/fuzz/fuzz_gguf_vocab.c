/* fuzz_gguf_vocab — the GGUF-vocabulary tokenizers on arbitrary input.
 * The first byte picks what is fuzzed: text through the suite's
 * vocabularies (SPM, BPE with several pre-tokenizers, WPM), with and without
 * special-token parsing, and the decode of what was encoded; or the whole
 * input as a GGUF whose vocabulary is loaded and used. Nothing may crash,
 * leak or hand out ids outside the vocabulary. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "format/gguf.h"
#include "tokenizer/gguf_vocab.h"

#define SUITE HEARTH_DEPS_DIR "/llama.cpp/vocab/"

static const char *const VOCABS[] = {"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf",      "ggml-vocab-deepseek-llm.gguf",
                                     "ggml-vocab-deepseek-coder.gguf", "ggml-vocab-falcon.gguf", "ggml-vocab-bert-bge.gguf",
                                     "ggml-vocab-starcoder.gguf", "ggml-vocab-phi-3.gguf"};
#define NVOCABS (sizeof VOCABS / sizeof VOCABS[0])

static gguf_file *files[NVOCABS];
static gguf_vocab *vocabs[NVOCABS];

/* Loads vocabulary i on first use (each load is slow under the sanitizers). */
static const gguf_vocab *vocab_at(size_t i) {
  static bool tried[NVOCABS];
  if (!tried[i]) {
    tried[i] = true;
    char path[512];
    snprintf(path, sizeof path, "%s%s", SUITE, VOCABS[i]);
    herr err = {0};
    if (gguf_open(&files[i], path, &err) == 0) gguf_vocab_load(files[i], VOCABS[i], &vocabs[i], &err);
  }
  return vocabs[i];
}

static void exercise(const gguf_vocab *v, const char *text, size_t len, int flags) {
  int32_t *ids = NULL;
  size_t n = 0;
  herr err = {0};
  if (gguf_vocab_encode(v, text, len, flags & 1, (flags >> 1) & 1, &ids, &n, &err) == 0) {
    for (size_t i = 0; i < n; i++)
      if (ids[i] < 0 || ids[i] >= gguf_vocab_size(v)) abort();
    hbuf out = {0};
    if (gguf_vocab_decode(v, ids, n, (flags >> 2) & 1, &out, &err) != 0 && !err.msg[0]) abort();
    hbuf_free(&out);
  } else if (!err.msg[0]) {
    abort();
  }
  free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  unsigned mode = data[0];
  data++, size--;
  if (mode < 0xf0) {
    const gguf_vocab *v = vocab_at(mode % NVOCABS);
    if (!v) return 0;
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    if (size) memcpy(text, data, size);
    exercise(v, text, size, (int)(mode / NVOCABS) & 7);
    free(text);
    return 0;
  }
  unsigned char *copy = malloc(size ? size : 1);
  if (!copy) return 0;
  if (size) memcpy(copy, data, size);
  gguf_file *g = NULL;
  gguf_vocab *v = NULL;
  herr err = {0};
  if (gguf_parse(copy, size, "fuzz.gguf", &g, &err) == 0) {
    if (gguf_vocab_load(g, "fuzz.gguf", &v, &err) == 0) {
      static const char sample[] = " Hello, world! 123  \xc3\xa9\xe4\xbd\xa0 <s>\n\t'll";
      exercise(v, sample, sizeof sample - 1, (int)mode & 7);
    } else if (!err.msg[0]) {
      abort();
    }
  }
  gguf_vocab_free(v);
  gguf_close(g);
  free(copy);
  return 0;
}
