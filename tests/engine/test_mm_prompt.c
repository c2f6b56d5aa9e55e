/* test_mm_prompt.c — prompts holding images through the public API and the
 * scheduler, on the tiny Gemma 4 with a vision tower (tests/fixtures/mm,
 * made by tools/gen_mm_golden.py): the rendered chat's placeholder expanded
 * to the processor's text and token count; the same greedy tokens whether
 * the prompt is fed whole or in chunks of 7 tokens (a chunk never ends
 * inside the image's bidirectional span), and whether it comes from the
 * prefix cache or not; transformers' greedy answer when the prompt tokens
 * agree; a second request with the same image reuses its blocks, one with
 * another image of as many soft tokens does not; media errors name the
 * medium; a model without a tower for a kind says so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/buf.h"
#include "base/file.h"
#include "hearth.h"
#include "test.h"

#define MM HEARTH_SOURCE_DIR "/tests/fixtures/mm/gemma4_vision-f32"

static json_t *golden;

typedef struct collected {
  int32_t ids[64];
  int n;
} collected;

static int collect(void *user, const char *text, size_t len, const hearth_token *tok) {
  (void)text, (void)len;
  collected *c = user;
  if (tok && c->n < 64) c->ids[c->n++] = tok->id;
  return 0;
}

static char *rendered_prompt(hearth_model *m, const char *question) {
  char msgs[512];
  snprintf(msgs, sizeof msgs, "[{\"role\":\"user\",\"content\":[{\"type\":\"image\"},{\"type\":\"text\",\"text\":\"%s\"}]}]",
           question);
  char *text = NULL;
  hearth_error err = {0};
  CHECK_MSG(hearth_chat_render(m, msgs, NULL, true, NULL, &text, &err) == 0, "%s", err.msg);
  return text;
}

/* Greedy tokens for the prompt with image `file`; result in *res. */
static int run(hearth_model *m, const char *text, const char *file, int n, collected *out, hearth_gen_result *res,
               hearth_error *err) {
  hearth_media md = {.kind = HEARTH_MEDIA_IMAGE, .url = file, .name = "the image"};
  hearth_prompt p = {.text = text, .media = &md, .n_media = 1};
  hearth_gen_params g;
  hearth_gen_params_init(&g);
  g.max_tokens = n;
  g.temperature = 0;
  memset(out, 0, sizeof *out);
  return hearth_generate(m, &p, &g, collect, out, res, err);
}

static void test_chunks_and_cache(void) {
  const json_t *p = json_object_get(json_object_get(golden, "prompts"), "p_img");
  const char *question = json_string_value(json_array_get(json_object_get(p, "texts"), 0));
  const json_t *ids = json_object_get(p, "ids"), *greedy = json_object_get(p, "greedy");
  int64_t bos = json_integer_value(json_object_get(json_object_get(golden, "token_ids"), "bos"));
  bool double_bos = json_integer_value(json_array_get(ids, 0)) == bos && json_integer_value(json_array_get(ids, 1)) == bos;
  int n = (int)json_array_size(greedy);
  collected whole, chunked, cached, other;
  hearth_gen_result r1, r2, r3, r4;
  hearth_error err = {0};
  /* whole: one chunk of up to 512 */
  hearth_load_opts o = {.threads = 2, .allow_local_media = true};
  hearth_model *m = NULL;
  CHECK_MSG(hearth_model_load(MM, &o, &m, &err) == 0, "%s", err.msg);
  if (!m) return;
  CHECK_EQ_STR(hearth_media_placeholder(m, HEARTH_MEDIA_IMAGE), "<|image|>");
  CHECK(hearth_media_placeholder(m, HEARTH_MEDIA_AUDIO) == NULL);
  char *text = rendered_prompt(m, question);
  CHECK_MSG(run(m, text, MM "/img_a.png", n, &whole, &r1, &err) == 0, "%s", err.msg);
  CHECK_EQ_INT(r1.prompt_tokens, (int64_t)json_array_size(ids) - (double_bos ? 1 : 0));
  CHECK_EQ_INT(whole.n, n);
  if (!double_bos)
    for (int i = 0; i < n && i < whole.n; i++) CHECK_EQ_INT(whole.ids[i], json_integer_value(json_array_get(greedy, (size_t)i)));
  /* again: from the prefix cache (everything but the last block), the same tokens */
  CHECK_MSG(run(m, text, MM "/img_a.png", n, &cached, &r2, &err) == 0, "%s", err.msg);
  CHECK_MSG(r2.cached_tokens >= r1.prompt_tokens - 16, "%lld of %lld tokens cached", (long long)r2.cached_tokens,
            (long long)r1.prompt_tokens);
  CHECK(cached.n == whole.n && !memcmp(cached.ids, whole.ids, sizeof(int32_t) * (size_t)whole.n));
  /* another image, as many soft tokens: only the text before it may come from the cache */
  CHECK_MSG(run(m, text, MM "/img_a.jpg", n, &other, &r3, &err) == 0, "%s", err.msg);
  CHECK_EQ_INT(r3.prompt_tokens, r1.prompt_tokens);
  CHECK_MSG(r3.cached_tokens < 16, "%lld tokens cached for a different image", (long long)r3.cached_tokens);
  /* errors name the medium */
  hearth_media bad = {.kind = HEARTH_MEDIA_IMAGE, .data = "not an image", .len = 12, .name = "messages[0].content[0]"};
  hearth_prompt bp = {.text = text, .media = &bad, .n_media = 1};
  CHECK(hearth_generate(m, &bp, NULL, NULL, NULL, NULL, &err) == HEARTH_EINVAL);
  CHECK_EQ_STR(err.field, "messages[0].content[0]");
  CHECK_MSG(!strncmp(err.msg, "messages[0].content[0]: not an image", 36), "%s", err.msg);
  bad = (hearth_media){.kind = HEARTH_MEDIA_AUDIO, .url = MM "/img_a.png", .name = "clip"};
  CHECK(hearth_generate(m, &bp, NULL, NULL, NULL, NULL, &err) == HEARTH_EINVAL);
  CHECK_MSG(strstr(err.msg, "has no audio tower"), "%s", err.msg);
  /* two images for one placeholder; none for a placeholder */
  hearth_media two[2] = {{.kind = HEARTH_MEDIA_IMAGE, .url = MM "/img_a.png"}, {.kind = HEARTH_MEDIA_IMAGE, .url = MM "/img_b.png"}};
  bp = (hearth_prompt){.text = text, .media = two, .n_media = 2};
  CHECK(hearth_generate(m, &bp, NULL, NULL, NULL, NULL, &err) == HEARTH_EINVAL);
  CHECK_MSG(strstr(err.msg, "no place"), "%s", err.msg);
  bp = (hearth_prompt){.text = "no placeholder here", .media = two, .n_media = 1};
  CHECK(hearth_generate(m, &bp, NULL, NULL, NULL, NULL, &err) == HEARTH_EINVAL);
  hearth_model_free(m);
  /* fed in chunks of 7: the image's span is taken whole, the rest in 7s; the same tokens */
  o.prefill_chunk = 7;
  CHECK_MSG(hearth_model_load(MM, &o, &m, &err) == 0, "%s", err.msg);
  if (m) {
    CHECK_MSG(run(m, text, MM "/img_a.png", n, &chunked, &r4, &err) == 0, "%s", err.msg);
    CHECK(chunked.n == whole.n && !memcmp(chunked.ids, whole.ids, sizeof(int32_t) * (size_t)whole.n));
    hearth_model_free(m);
  }
  hearth_free(text);
}

/* A text-only model takes no media. */
static void test_text_model(void) {
  hearth_load_opts o = {.threads = 2};
  hearth_model *m = NULL;
  hearth_error err = {0};
  CHECK_MSG(hearth_model_load(HEARTH_SOURCE_DIR "/tests/fixtures/golden/qwen3-f32", &o, &m, &err) == 0, "%s", err.msg);
  if (!m) return;
  for (int k = 0; k < 3; k++) CHECK(hearth_media_placeholder(m, (hearth_media_kind)k) == NULL);
  hearth_media md = {.kind = HEARTH_MEDIA_IMAGE, .data = "x", .len = 1};
  hearth_prompt p = {.ids = (const int32_t[]){1, 2}, .n_ids = 2, .media = &md, .n_media = 1};
  CHECK(hearth_generate(m, &p, NULL, NULL, NULL, NULL, &err) == HEARTH_EINVAL);
  hearth_model_free(m);
}

int main(void) {
  json_error_t je;
  golden = json_load_file(MM "/golden.json", 0, &je);
  CHECK_MSG(golden != NULL, "%s", je.text);
  if (golden) {
    RUN(test_chunks_and_cache);
    RUN(test_text_model);
    json_decref(golden);
  }
  TEST_MAIN_END();
}
