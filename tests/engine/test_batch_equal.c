/* test_batch_equal.c — a batch of greedy decodes equals the same decodes
 * run one at a time, token for token, on the golden models of several
 * families (dense, sliding-window, mixture of experts, hybrid recurrent,
 * latent attention), with prompts and output lengths that differ within
 * the batch, and on llama-f32 under the LoRA fixtures' adapters (one, the
 * other, both stacked and none, mixed in one batch). Runs through the public
 * batch call, hearth_generate_batch; each item's text is compared with what
 * a lone hearth_generate of it streams, and its token count with the lone
 * run's. The golden folders hold no tokenizer: each is copied
 * with the built-in model's (its ids cover the 512-token vocabularies). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "hearth.h"
#include "test.h"

#define GOLDEN HEARTH_SOURCE_DIR "/tests/fixtures/golden/"
#define LORA HEARTH_SOURCE_DIR "/tests/fixtures/lora/llama-f32/"
#define DEFAULT_MODEL HEARTH_SOURCE_DIR "/models/default/"

enum { N = 7, MAX_PROMPT = 40 };

/* The golden folder name with the built-in tokenizer beside its files, in a fresh temporary folder. */
static int with_tokenizer(const char *name, char *dir, size_t cap) {
  snprintf(dir, cap, "/tmp/hearth_batch_equal_%d_%s", (int)getpid(), name);
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "rm -rf '%s' && mkdir -p '%s' && cp -r '" GOLDEN "%s'/. '%s'/ && cp '" DEFAULT_MODEL "tokenizer.json' '" DEFAULT_MODEL
           "tokenizer_config.json' '%s'/",
           dir, dir, name, dir, dir);
  return system(cmd);
}

static void remove_dir(const char *dir) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

typedef struct lone_out {
  int n;      /* tokens */
  hbuf text;  /* what the callback streamed */
} lone_out;

static int collect(void *user, const char *text, size_t len, const hearth_token *tok) {
  lone_out *o = user;
  if (tok) o->n++;
  hbuf_append(&o->text, text, len);
  return 0;
}

/* Batch of N items on dir (adapters: NULL, or one name per item) against lone runs. */
static void check_model(const char *label, const char *dir, const char *const *adapters, const char *const *load_names,
                        const char *const *load_paths, int n_load) {
  hearth_error err = {0};
  hearth_model *m = NULL;
  int rc = hearth_model_load(dir, NULL, &m, &err);
  CHECK_MSG(rc == 0, "%s: %s", label, err.msg);
  if (rc) return;
  for (int a = 0; a < n_load; a++) {
    rc = hearth_adapter_load(m, load_names[a], load_paths[a], &err);
    CHECK_MSG(rc == 0, "%s: adapter %s: %s", label, load_names[a], err.msg);
  }
  int32_t prompts[N][MAX_PROMPT];
  hearth_gen_params p[N];
  hearth_batch_item it[N];
  memset(it, 0, sizeof it);
  uint64_t s = 0x9E3779B97F4A7C15ull ^ (uint64_t)strlen(label);
  for (int i = 0; i < N; i++) {
    int len = 2 + (i * 11) % (MAX_PROMPT - 2); /* 2 .. 39 tokens, all different */
    for (int k = 0; k < len; k++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      prompts[i][k] = (int32_t)(3 + (s >> 33) % 500);
    }
    if (i == 3) memcpy(prompts[3], prompts[1], sizeof(int32_t) * (size_t)(2 + 11 % (MAX_PROMPT - 2))); /* a shared prefix */
    hearth_gen_params_init(&p[i]);
    p[i].temperature = 0;
    p[i].ignore_eos = true;
    p[i].max_tokens = 3 + (i * 5) % 11;
    if (adapters) p[i].adapter = adapters[i];
    it[i].params = &p[i];
    it[i].prompt = (hearth_prompt){.ids = prompts[i], .n_ids = (size_t)len};
  }
  rc = hearth_generate_batch(m, it, N, 0, &err);
  CHECK_MSG(rc == 0, "%s: batch: %s", label, err.msg);
  for (int i = 0; i < N && rc == 0; i++) {
    lone_out lone = {0};
    hearth_gen_result r;
    int lr = hearth_generate(m, &it[i].prompt, &p[i], collect, &lone, &r, &err);
    CHECK_MSG(lr == 0, "%s: item %d alone: %s", label, i, err.msg);
    CHECK_MSG(it[i].status == 0, "%s: item %d in the batch: %s", label, i, it[i].error.msg);
    CHECK_EQ_INT(it[i].result.completion_tokens, p[i].max_tokens);
    CHECK_EQ_INT(lone.n, p[i].max_tokens);
    size_t tl = lone.text.len;
    CHECK_MSG(tl > 0, "%s: item %d decodes to no text, so the comparison would say nothing", label, i);
    CHECK_MSG(it[i].text && tl == it[i].len && memcmp(hbuf_str(&lone.text), it[i].text, tl) == 0,
              "%s: item %d (adapter %s): the batch's text differs from the lone run's", label, i,
              adapters && adapters[i] ? adapters[i] : "none");
    hbuf_free(&lone.text);
  }
  /* under an adapter the output is not the base's (the adapters change something) */
  if (adapters) {
    hearth_batch_item base[N];
    hearth_gen_params bp[N];
    memset(base, 0, sizeof base);
    for (int i = 0; i < N; i++) bp[i] = p[i], bp[i].adapter = NULL, base[i].prompt = it[i].prompt, base[i].params = &bp[i];
    CHECK_EQ_INT(hearth_generate_batch(m, base, N, 0, &err), 0);
    int differ = 0;
    for (int i = 0; i < N; i++)
      if (adapters[i] && base[i].text && it[i].text && strcmp(base[i].text, it[i].text)) differ++;
    CHECK_MSG(differ > 0, "%s: no item under an adapter differs from the base model", label);
    hearth_batch_free(base, N);
  }
  hearth_batch_free(it, N);
  hearth_model_free(m);
}

static void test_families(void) {
  static const char *const names[] = {"llama-f32", "gemma3-f32", "qwen3_moe-f32", "qwen3_5-f32", "glm5-f32", "phi3-bf16"};
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
    char dir[512];
    CHECK_MSG(with_tokenizer(names[k], dir, sizeof dir) == 0, "%s: cannot copy the fixture", names[k]);
    check_model(names[k], dir, NULL, NULL, NULL, 0);
    remove_dir(dir);
  }
}

static void test_adapters(void) {
  char dir[512];
  CHECK(with_tokenizer("llama-f32", dir, sizeof dir) == 0);
  static const char *const names[] = {"plain", "rs"}, *const paths[] = {LORA "plain", LORA "rs"};
  static const char *const per_item[N] = {"plain", NULL, "rs", "plain+rs", "plain", NULL, "rs"};
  check_model("llama-f32 + adapters", dir, per_item, names, paths, 2);
  remove_dir(dir);
}

int main(void) {
  RUN(test_families);
  RUN(test_adapters);
  TEST_MAIN_END();
}
