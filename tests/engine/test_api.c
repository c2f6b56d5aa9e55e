/* Tests of the public API (include/hearth.h) on what the loaders and the
 * generation entry point must agree on: a GGUF file loads as a model (ids,
 * text, greedy output against the reference ids), hearth_tokenize and
 * hearth_prompt read a length of 0 the same way, configs with absurd values
 * are refused with a message, and max_tokens = -1 stops where the KV cache
 * is full when the stated context is larger; speculative decoding's load
 * options and per-request override, the draft model's vocabulary check,
 * GLM-5 drafting with its multi-token-prediction layer (spec_method "mtp");
 * and a quantized KV cache holds more tokens in the same bytes. */
#include <sys/stat.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/file.h"
#include "engine/method.h"
#include "hearth.h"
#include "test.h"

#define GGUF_TINY HEARTH_TINY_GGUF
#define DEFAULT_MODEL HEARTH_SOURCE_DIR "/models/default"

static char tmpdir[] = "/tmp/hearth_api_XXXXXX";

/* Generated ids, collected by the callback. */
typedef struct ids_out {
  int32_t ids[256];
  int n;
} ids_out;

static int collect_ids(void *user, const char *text, size_t len, const hearth_token *tok) {
  (void)text;
  (void)len;
  ids_out *o = user;
  if (tok && o->n < 256) o->ids[o->n++] = tok->id;
  return 0;
}

static void test_gguf_model(void) {
  CHECK_MSG(hfile_exists(GGUF_TINY), "%s is missing (ctest's fixtures.tiny_gguf writes it)", GGUF_TINY);
  if (!hfile_exists(GGUF_TINY)) return;
  hearth_error err = {0};
  hearth_model *m = NULL;
  int rc = hearth_model_load(GGUF_TINY, NULL, &m, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (rc) return;
  hearth_info info;
  hearth_model_info(m, &info);
  CHECK_EQ_STR(info.id, "llama-2-tiny-random");
  CHECK_EQ_STR(info.model_type, "llama");
  CHECK(info.has_tokenizer);
  CHECK_EQ_INT(info.vocab_size, 32000);
  CHECK_EQ_INT(info.bos_id, 1);
  CHECK_EQ_INT(info.context_length, 4096);

  static const int32_t prompt[] = {1, 15043, 3186};
  static const int32_t want[] = {23329, 30286, 10349, 423, 7465, 23542, 6765, 2458}; /* tools/ref_llama_gguf.py */
  int32_t *ids = NULL;
  size_t n = 0;
  CHECK(hearth_tokenize(m, "Hello world", 0, true, &ids, &n, &err) == 0);
  CHECK_EQ_INT(n, 3);
  for (size_t i = 0; i < n && i < 3; i++) CHECK_EQ_INT(ids[i], prompt[i]);
  hearth_free(ids);

  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.max_tokens = 8;
  p.ignore_eos = true; /* default sampling: greedy (a GGUF file has no generation_config) */
  /* as ids, and as text */
  for (int as_text = 0; as_text < 2; as_text++) {
    hearth_prompt hp = {.ids = as_text ? NULL : prompt, .n_ids = as_text ? 0 : 3, .text = as_text ? "Hello world" : NULL,
                        .add_special = true};
    ids_out o = {.n = 0};
    hearth_gen_result res;
    rc = hearth_generate(m, &hp, &p, collect_ids, &o, &res, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    CHECK_EQ_INT(res.prompt_tokens, 3);
    CHECK_EQ_INT(o.n, 8);
    for (int i = 0; i < o.n && i < 8; i++) CHECK_EQ_INT(o.ids[i], want[i]);
  }
  /* the file carries no chat template: chats render as chatml, as llama.cpp renders them */
  hearth_model_info(m, &info);
  CHECK(info.has_chat_template && info.chat_template_fallback);
  char *text = NULL;
  CHECK_EQ_INT(hearth_chat_render(m, "[{\"role\":\"user\",\"content\":\"hi\"}]", NULL, true, NULL, &text, &err), 0);
  CHECK_EQ_STR(text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  hearth_free(text);
  hearth_model_free(m);

  /* something that is neither a folder nor a .gguf file */
  m = NULL;
  rc = hearth_model_load(DEFAULT_MODEL "/config.json", NULL, &m, &err);
  CHECK(rc != 0 && m == NULL);
  CHECK_MSG(strstr(err.msg, "not a model folder or a .gguf file") != NULL, "%s", err.msg);
}

/* GLM-5 (its fixture holds a multi-token-prediction layer) loaded with spec_method "mtp": greedy
 * ids equal those with speculation off for the request, and hearth_get_stats counts the drafts
 * under source 2, "mtp"; a request naming "draft" on it is refused naming spec_method. */
static void test_mtp(void) {
  static const char *dir = HEARTH_SOURCE_DIR "/tests/fixtures/golden/glm5-f32";
  static const int32_t prompt[] = {5, 16, 27, 38, 49, 60, 71, 82, 93};
  hearth_error err = {0};
  hearth_model *m = NULL;
  hearth_load_opts lo = {.threads = 1, .spec_tokens = 3, .spec_method = "mtp"};
  int rc = hearth_model_load(dir, &lo, &m, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (rc) return;
  int32_t got[2][24];
  for (int b = 0; b < 2; b++) {
    hearth_gen_params p;
    hearth_gen_params_init(&p);
    p.max_tokens = 24;
    p.temperature = 0;
    p.ignore_eos = true;
    p.spec_tokens = b ? -1 : 0;
    hearth_prompt hp = {.ids = prompt, .n_ids = 9};
    ids_out o = {.n = 0};
    hearth_gen_result res;
    CHECK(hearth_generate(m, &hp, &p, collect_ids, &o, &res, &err) == 0);
    CHECK_EQ_INT(o.n, 24);
    for (int i = 0; i < 24; i++) got[b][i] = i < o.n ? o.ids[i] : -1;
  }
  CHECK(memcmp(got[0], got[1], sizeof got[0]) == 0);
  hearth_stats st;
  hearth_get_stats(m, &st);
  CHECK_EQ_STR(hearth_spec_source_name(2), "mtp");
  CHECK(st.spec_drafted[2] > 0 && st.spec_steps[2] > 0);
  CHECK_EQ_INT(st.spec_drafted[0] + st.spec_drafted[1], 0);
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.max_tokens = 4;
  p.spec_method = "draft";
  hearth_prompt hp = {.ids = prompt, .n_ids = 9};
  ids_out o = {.n = 0};
  hearth_gen_result res;
  CHECK_EQ_INT(hearth_generate(m, &hp, &p, collect_ids, &o, &res, &err), HEARTH_EINVAL);
  CHECK_EQ_STR(err.field, "spec_method");
  hearth_model_free(m);
}

/* A mixture of experts loaded with an expert budget (about one expert of
 * the qwen3_moe fixture, whose layers have eight) generates the same ids as
 * without, and hearth_get_stats reports the budget, what is resident (never
 * over it) and the experts read in. */
static void test_expert_budget(void) {
  static const char *dir = HEARTH_SOURCE_DIR "/tests/fixtures/golden/qwen3_moe-f32";
  static const int32_t prompt[] = {5, 6, 7, 8, 9};
  int32_t got[2][8];
  for (int b = 0; b < 2; b++) {
    hearth_error err = {0};
    hearth_model *m = NULL;
    hearth_load_opts lo = {.threads = 1, .expert_budget = b ? 30000 : 0};
    int rc = hearth_model_load(dir, &lo, &m, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return;
    hearth_gen_params p;
    hearth_gen_params_init(&p);
    p.max_tokens = 8;
    p.temperature = 0;
    p.ignore_eos = true;
    hearth_prompt hp = {.ids = prompt, .n_ids = 5};
    ids_out o = {.n = 0};
    hearth_gen_result res;
    CHECK(hearth_generate(m, &hp, &p, collect_ids, &o, &res, &err) == 0);
    CHECK_EQ_INT(o.n, 8);
    for (int i = 0; i < 8; i++) got[b][i] = i < o.n ? o.ids[i] : -1;
    hearth_stats st;
    hearth_get_stats(m, &st);
    CHECK_EQ_INT(st.expert_budget, b ? 30000 : 0);
    if (b) {
      CHECK(st.expert_page_ins > 0);
      CHECK(st.expert_resident_bytes > 0 && st.expert_resident_bytes <= 30000);
    } else {
      CHECK_EQ_INT(st.expert_page_ins, 0);
    }
    hearth_model_free(m);
  }
  CHECK(memcmp(got[0], got[1], sizeof got[0]) == 0);
}

static void test_tokenize_length_zero(void) {
  hearth_error err = {0};
  hearth_model *m = NULL;
  int rc = hearth_model_load(DEFAULT_MODEL, NULL, &m, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (rc) return;
  const char *text = "Hello world, again";
  int32_t *a = NULL, *b = NULL, *c = NULL, *d = NULL;
  size_t na = 0, nb = 0, nc = 0, nd = 0;
  CHECK(hearth_tokenize(m, text, strlen(text), true, &a, &na, &err) == 0);
  CHECK(hearth_tokenize(m, text, 0, true, &b, &nb, &err) == 0); /* 0 with text set: strlen */
  CHECK(na > 2);
  CHECK_EQ_INT(na, nb);
  for (size_t i = 0; i < na && i < nb; i++) CHECK_EQ_INT(a[i], b[i]);
  /* "" and NULL: only what add_special adds */
  CHECK(hearth_tokenize(m, "", 0, true, &c, &nc, &err) == 0);
  CHECK(hearth_tokenize(m, NULL, 0, true, &d, &nd, &err) == 0);
  CHECK_EQ_INT(nc, nd);
  CHECK(nc <= 1);
  /* the prompt reads text_len the same way: both give the same prompt tokens */
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.max_tokens = 1;
  p.temperature = 0;
  hearth_gen_result r1, r2;
  hearth_prompt h1 = {.text = text, .text_len = 0, .add_special = true};
  hearth_prompt h2 = {.text = text, .text_len = strlen(text), .add_special = true};
  CHECK(hearth_generate(m, &h1, &p, NULL, NULL, &r1, &err) == 0);
  CHECK(hearth_generate(m, &h2, &p, NULL, NULL, &r2, &err) == 0);
  CHECK_EQ_INT(r1.prompt_tokens, (long long)na);
  CHECK_EQ_INT(r2.prompt_tokens, (long long)na);
  hearth_free(a), hearth_free(b), hearth_free(c), hearth_free(d);
  hearth_model_free(m);
}

/* A copy of the built-in model (links to its files) with config.json's
 * `key` set to the JSON text `value`. Returns the folder (static). */
static const char *model_with(const char *key, const char *value) {
  static char dir[600];
  static int k;
  snprintf(dir, sizeof dir, "%s/m%d", tmpdir, k++);
  mkdir(dir, 0755);
  static const char *files[] = {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char from[600], to[700];
    snprintf(from, sizeof from, "%s/%s", DEFAULT_MODEL, files[i]);
    snprintf(to, sizeof to, "%s/%s", dir, files[i]);
    if (hfile_exists(from) && symlink(from, to)) perror(to);
  }
  char *cfg = NULL;
  size_t len = 0;
  CHECK(hfile_read(DEFAULT_MODEL "/config.json", &cfg, &len, NULL) == 0);
  hbuf out = {0};
  /* replace the key's value: config.json here is flat and the key present */
  char pat[128];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *at = cfg ? strstr(cfg, pat) : NULL;
  CHECK_MSG(at != NULL, "%s not in config.json", key);
  if (at) {
    const char *v = at + strlen(pat), *end = v;
    while (*end && *end != ',' && *end != '\n' && *end != '}') end++;
    hbuf_append(&out, cfg, (size_t)(v - cfg));
    hbuf_printf(&out, " %s", value);
    hbuf_puts(&out, end);
  }
  char path[700];
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  if (f) {
    fwrite(hbuf_str(&out), 1, out.len, f);
    fclose(f);
  }
  hbuf_free(&out);
  free(cfg);
  return dir;
}

static void expect_refused(const char *key, const char *value, const char *needle) {
  hearth_error err = {0};
  hearth_model *m = NULL;
  int rc = hearth_model_load(model_with(key, value), NULL, &m, &err);
  CHECK_MSG(rc != 0 && m == NULL, "%s = %s was accepted", key, value);
  CHECK_MSG(strstr(err.msg, needle) != NULL, "%s = %s: %s", key, value, err.msg);
  hearth_model_free(m);
}

static void test_absurd_config(void) {
  expect_refused("max_position_embeddings", "1e12", "max_position_embeddings");
  expect_refused("max_position_embeddings", "1000000000000", "max_position_embeddings");
  expect_refused("max_position_embeddings", "-5", "max_position_embeddings");
  expect_refused("rms_norm_eps", "5", "rms_norm_eps");
  /* a large context that is plausible still loads */
  hearth_error err = {0};
  hearth_model *m = NULL;
  int rc = hearth_model_load(model_with("max_position_embeddings", "1048576"), NULL, &m, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  hearth_model_free(m);
}

/* max_tokens = -1 under a context far larger than the KV cache: generation
 * stops when the cache is full (it used to go on without end). */
static void test_unbounded_stops_at_cache(void) {
  hearth_error err = {0};
  hearth_model *m = NULL;
  hearth_load_opts lo = {.kv_cache_bytes = 1, .max_batch = 1}; /* the smallest pool: one block */
  int rc = hearth_model_load(model_with("max_position_embeddings", "1048576"), &lo, &m, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (rc) return;
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  p.temperature = 0;
  p.ignore_eos = true;
  static const int32_t prompt[] = {1, 2, 3};
  hearth_prompt hp = {.ids = prompt, .n_ids = 3};
  hearth_gen_result res;
  rc = hearth_generate(m, &hp, &p, NULL, NULL, &res, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  hearth_stats st;
  hearth_get_stats(m, &st);
  int64_t hold = st.kv_blocks_total * st.kv_block_tokens;
  CHECK(hold > 3);
  CHECK_EQ_INT(res.finish_reason, HEARTH_FINISH_LENGTH);
  CHECK_EQ_INT(res.prompt_tokens + res.completion_tokens, hold);
  hearth_model_free(m);
}

/* Speculative decoding through the API: the model drafting for itself gives
 * the plain greedy ids, a per-request override turns it on and off, and the
 * load refuses a draft of another vocabulary (by size, and token for token),
 * MTP, a draft method without a draft, and a draft with prompt lookup. */
static void test_speculative(void) {
  hearth_error err = {0};
  hearth_model *m = NULL;
  hearth_load_opts lo = {.spec_tokens = 4, .draft_model = DEFAULT_MODEL};
  int rc = hearth_model_load(DEFAULT_MODEL, &lo, &m, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (rc) return;
  hearth_gen_params p;
  hearth_gen_params_init(&p);
  CHECK_EQ_INT(p.spec_tokens, -1);
  p.temperature = 0;
  p.ignore_eos = true;
  p.max_tokens = 30;
  hearth_prompt hp = {.text = "And God said, Let there be light"};
  ids_out a = {0}, b = {0};
  p.spec_tokens = 0;
  CHECK_EQ_INT(hearth_generate(m, &hp, &p, collect_ids, &a, NULL, &err), 0);
  p.spec_tokens = -1;
  CHECK_EQ_INT(hearth_generate(m, &hp, &p, collect_ids, &b, NULL, &err), 0);
  CHECK_EQ_INT(a.n, 30);
  CHECK(a.n == b.n && memcmp(a.ids, b.ids, sizeof(int32_t) * (size_t)a.n) == 0);
  hearth_stats st;
  hearth_get_stats(m, &st);
  CHECK(st.spec_drafted[1] > 0 && st.spec_accepted[1] == st.spec_drafted[1]); /* itself: every draft kept */
  CHECK_EQ_INT(st.spec_drafted[0], 0);
  for (int k = 0; k < HEARTH_SPEC_SOURCES; k++) /* the public names are the engine's */
    CHECK_EQ_STR(hearth_spec_source_name(k), spec_source_name((spec_source)k));
  p.spec_tokens = 17;
  CHECK_EQ_INT(hearth_generate(m, &hp, &p, NULL, NULL, NULL, &err), HEARTH_EINVAL);
  CHECK_EQ_STR(err.field, "spec_tokens");
  hearth_model_free(m);

  /* refusals at load */
  struct {
    hearth_load_opts lo;
    int code;
    const char *msg;
  } bad[] = {
      {{.spec_tokens = 2, .draft_model = HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-f32"}, HEARTH_EINVAL,
       "its vocabulary has 512 tokens but the model's has 4096"},
      {{.spec_tokens = 2, .spec_method = "mtp"}, HEARTH_EUNSUPPORTED, "multi-token-prediction"},
      {{.spec_tokens = 2, .spec_method = "draft"}, HEARTH_EINVAL, "needs a draft model"},
      {{.spec_tokens = 2, .spec_method = "ngram", .draft_model = DEFAULT_MODEL}, HEARTH_EINVAL, "only used"},
      {{.spec_tokens = 2, .spec_method = "medusa"}, HEARTH_EINVAL, "not one of"},
      {{.spec_tokens = 99}, HEARTH_EINVAL, "spec_tokens"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    hearth_error e = {0};
    m = NULL;
    CHECK_EQ_INT(hearth_model_load(DEFAULT_MODEL, &bad[i].lo, &m, &e), bad[i].code);
    CHECK_MSG(strstr(e.msg, bad[i].msg) != NULL, "case %zu: '%s'", i, e.msg);
    hearth_model_free(m);
  }
  /* the same vocabulary size, one token renamed */
  char dir[600];
  snprintf(dir, sizeof dir, "%s/renamed", tmpdir);
  mkdir(dir, 0755);
  static const char *files[] = {"model.safetensors", "config.json", "tokenizer_config.json"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char from[600], to[700];
    snprintf(from, sizeof from, "%s/%s", DEFAULT_MODEL, files[i]);
    snprintf(to, sizeof to, "%s/%s", dir, files[i]);
    if (symlink(from, to)) perror(to);
  }
  char *tj = NULL;
  size_t len = 0;
  CHECK(hfile_read(DEFAULT_MODEL "/tokenizer.json", &tj, &len, NULL) == 0);
  hbuf out = {0};
  for (const char *at = tj; at && *at;) {
    const char *hit = strstr(at, "\"<|end|>\"");
    if (!hit) {
      hbuf_puts(&out, at);
      break;
    }
    hbuf_append(&out, at, (size_t)(hit - at));
    hbuf_puts(&out, "\"<|fin|>\"");
    at = hit + strlen("\"<|end|>\"");
  }
  char path[700];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  FILE *f = fopen(path, "w");
  if (f) {
    fwrite(out.data, 1, out.len, f);
    fclose(f);
  }
  hbuf_free(&out);
  free(tj);
  hearth_load_opts lr = {.spec_tokens = 2, .draft_model = dir};
  hearth_error e = {0};
  m = NULL;
  CHECK_EQ_INT(hearth_model_load(DEFAULT_MODEL, &lr, &m, &e), HEARTH_EINVAL);
  CHECK_MSG(strstr(e.msg, "token 2 is '<|fin|>'") != NULL, "%s", e.msg);
  hearth_model_free(m);
}

/* LoRA adapters through the public API: names checked, listed, picked by
 * hearth_gen_params.adapter ("a", "a+b", "none"), unknown or repeated names
 * refused naming the field, unloaded by name. The model is the llama golden
 * fixture (ids only: it has no tokenizer). */
static int count_tokens(void *user, const char *text, size_t len, const hearth_token *tok) {
  (void)text, (void)len;
  if (tok) *(int *)user += 1;
  return 0;
}

static void test_adapters(void) {
  hearth_model *m = NULL;
  hearth_error err = {0};
  int rc = hearth_model_load(HEARTH_SOURCE_DIR "/tests/fixtures/golden/llama-f32", NULL, &m, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (rc) return;
  const char *plain = HEARTH_SOURCE_DIR "/tests/fixtures/lora/llama-f32/plain", *rs = HEARTH_SOURCE_DIR "/tests/fixtures/lora/llama-f32/rs";
  CHECK(hearth_adapter_load(m, "none", plain, &err) == HEARTH_EINVAL);
  CHECK(hearth_adapter_load(m, "a+b", plain, &err) == HEARTH_EINVAL);
  CHECK(hearth_adapter_load(m, "", plain, &err) == HEARTH_EINVAL);
  CHECK(hearth_adapter_load(m, "x", "/nonexistent", &err) != 0 && strstr(err.msg, "/nonexistent"));
  CHECK_MSG(hearth_adapter_load(m, "plain", plain, &err) == 0, "%s", err.msg);
  CHECK_MSG(hearth_adapter_load(m, "rs.v1", rs, &err) == 0, "%s", err.msg);
  CHECK(hearth_adapter_load(m, "plain", rs, &err) == HEARTH_EINVAL && strstr(err.msg, "already"));
  hearth_adapter_info info[4];
  CHECK_EQ_INT(hearth_adapter_list(m, info, 4), 2);
  CHECK_EQ_STR(info[0].name, "plain");
  CHECK_EQ_INT(info[0].rank, 8);
  CHECK_EQ_INT(info[1].rank, 4);
  CHECK_EQ_INT(info[0].in_use, 0);
  static const int32_t ids[] = {501, 500, 505, 196, 90};
  hearth_prompt p = {.ids = ids, .n_ids = 5};
  const char *ok[] = {NULL, "none", "", "plain", "rs.v1", "plain+rs.v1"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    hearth_gen_params gp;
    hearth_gen_params_init(&gp);
    gp.max_tokens = 3;
    gp.temperature = 0;
    gp.adapter = ok[i];
    int n = 0;
    rc = hearth_generate(m, &p, &gp, count_tokens, &n, NULL, &err);
    CHECK_MSG(rc == 0 && n == 3, "adapter '%s': %s", ok[i] ? ok[i] : "(null)", err.msg);
  }
  const char *bad[] = {"nope", "plain+plain", "plain+", "plain+nope"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    hearth_gen_params gp;
    hearth_gen_params_init(&gp);
    gp.max_tokens = 1;
    gp.adapter = bad[i];
    memset(&err, 0, sizeof err);
    rc = hearth_generate(m, &p, &gp, NULL, NULL, NULL, &err);
    CHECK_MSG(rc != 0 && !strcmp(err.field, "adapter"), "adapter '%s' gave %d (%s)", bad[i], rc, err.msg);
  }
  CHECK_EQ_INT(hearth_adapter_list(m, info, 4), 2);
  CHECK_EQ_INT(info[0].in_use + info[1].in_use, 0); /* every request gave its references back */
  CHECK(hearth_adapter_unload(m, "plain", &err) == 0);
  CHECK(hearth_adapter_unload(m, "plain", &err) == HEARTH_ENOTFOUND);
  CHECK_EQ_INT(hearth_adapter_list(m, NULL, 0), 1);
  hearth_model_free(m); /* with rs.v1 still loaded: freed with the model */
}

/* --kv-quant through the public options: in the same pool bytes an 8-bit or
 * FP8 (4-bit) cache holds 128/36 (128/20) times the tokens within a block's
 * rounding, /stats names the format, greedy generation runs, and a bad
 * per-layer config is refused at load with its file named. */
static void test_kv_quant(void) {
  static const char *modes[] = {"off", "8", "4", "fp8"};
  int64_t blocks[4] = {0};
  for (int i = 0; i < 4; i++) {
    hearth_error err = {0};
    hearth_model *m = NULL;
    hearth_load_opts lo = {.kv_cache_bytes = 8 << 20, .max_batch = 1, .kv_quant = modes[i]};
    int rc = hearth_model_load(DEFAULT_MODEL, &lo, &m, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return;
    hearth_gen_params p;
    hearth_gen_params_init(&p);
    p.temperature = 0;
    p.max_tokens = 8;
    p.ignore_eos = true;
    static const int32_t prompt[] = {1, 2, 3, 4, 5};
    hearth_prompt hp = {.ids = prompt, .n_ids = 5};
    ids_out out = {0};
    hearth_gen_result res;
    rc = hearth_generate(m, &hp, &p, collect_ids, &out, &res, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    CHECK_EQ_INT(out.n, 8);
    hearth_stats st;
    hearth_get_stats(m, &st);
    blocks[i] = st.kv_blocks_total;
    CHECK_MSG(!strcmp(st.kv_format, i == 0 ? "f32" : i == 1 ? "q8" : i == 2 ? "q4" : "fp8"), "format '%s'", st.kv_format);
    CHECK(st.kv_block_bytes > 0 && st.kv_blocks_total == (8 << 20) / st.kv_block_bytes);
    /* GET /fit's answer: the loaded formats, whatever the caller's options say */
    hearth_fit_opts fo = {.no_bandwidth = true, .kv_quant = i == 0 ? "4" : "off"};
    hearth_fit_result fr;
    CHECK_MSG(hearth_model_fit(m, &fo, &fr, &err) == 0, "%s", err.msg);
    CHECK_EQ_STR(fr.kv_format, st.kv_format);
    CHECK_EQ_INT(fr.kv_bytes_per_token * fr.kv_block_tokens, st.kv_block_bytes);
    hearth_model_free(m);
  }
  CHECK_MSG(blocks[1] >= blocks[0] * 128 / 36 - 1 && blocks[1] <= blocks[0] * 128 / 36 + 1, "%lld vs %lld blocks",
            (long long)blocks[1], (long long)blocks[0]);
  CHECK_MSG(blocks[2] >= blocks[0] * 128 / 20 - 1 && blocks[2] <= blocks[0] * 128 / 20 + 1, "%lld vs %lld blocks",
            (long long)blocks[2], (long long)blocks[0]);
  CHECK_EQ_INT(blocks[3], blocks[1]);
  char path[700];
  snprintf(path, sizeof path, "%s/kvq.json", tmpdir);
  FILE *f = fopen(path, "w");
  fputs("{\"layers\": {\"99\": \"8\"}}", f);
  fclose(f);
  hearth_error err = {0};
  hearth_model *m = NULL;
  hearth_load_opts lo = {.kv_quant = "8", .kv_quant_config = path};
  CHECK(hearth_model_load(DEFAULT_MODEL, &lo, &m, &err) != 0 && strstr(err.msg, "kvq.json") && strstr(err.msg, "'99'"));
  CHECK(m == NULL);
}

/* hearth_generate_batch: greedy items of mixed prompts and lengths, each equal
 * to a lone hearth_generate, in their own places; a bad item fails alone. */
static void test_generate_batch(void) {
  hearth_error err = {0};
  hearth_model *m = NULL;
  int rc = hearth_model_load(DEFAULT_MODEL, NULL, &m, &err);
  CHECK_MSG(rc == 0, "%s", err.msg);
  if (rc) return;
  static const char *texts[] = {"Once upon a time", "The sea", "A lighthouse keeper wrote", "Once upon a time", "Hi"};
  enum { N = 6 };
  hearth_gen_params p[N];
  hearth_batch_item it[N];
  memset(it, 0, sizeof it);
  for (int i = 0; i < N; i++) {
    hearth_gen_params_init(&p[i]);
    p[i].temperature = 0;
    p[i].max_tokens = 4 + 3 * (i % 3);
    it[i].params = &p[i];
    if (i < 5) it[i].prompt = (hearth_prompt){.text = texts[i], .add_special = true};
  }
  static const int32_t bad[] = {1, 2000000000};
  it[5].prompt = (hearth_prompt){.ids = bad, .n_ids = 2};
  CHECK_EQ_INT(hearth_generate_batch(m, it, N, 3, &err), 0);
  for (int i = 0; i < 5; i++) {
    hearth_batch_item one = {.prompt = it[i].prompt, .params = &p[i]};
    CHECK_EQ_INT(hearth_generate_batch(m, &one, 1, 1, &err), 0);
    CHECK_MSG(it[i].status == 0, "item %d: %s", i, it[i].error.msg);
    CHECK_MSG(it[i].text && one.text && strcmp(it[i].text, one.text) == 0, "item %d: '%s' vs '%s'", i, it[i].text,
              one.text);
    CHECK_EQ_INT(it[i].result.completion_tokens, one.result.completion_tokens);
    CHECK(it[i].len == strlen(it[i].text));
    hearth_batch_free(&one, 1);
  }
  CHECK(it[5].status != 0 && it[5].error.msg[0]);
  hearth_batch_free(it, N);
  CHECK(it[0].text == NULL);
  CHECK_EQ_INT(hearth_generate_batch(NULL, it, N, 0, &err), HEARTH_EINVAL);
  hearth_model_free(m);
}

int main(void) {
  if (!mkdtemp(tmpdir)) {
    perror("mkdtemp");
    return 1;
  }
  RUN(test_gguf_model);
  RUN(test_tokenize_length_zero);
  RUN(test_expert_budget);
  RUN(test_mtp);
  RUN(test_absurd_config);
  RUN(test_unbounded_stops_at_cache);
  RUN(test_speculative);
  RUN(test_adapters);
  RUN(test_kv_quant);
  RUN(test_generate_batch);
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
  fprintf(stderr, "%d checks, %d failures\n", test_checks, test_failures);
  return test_failures ? 1 : 0;
}
