/* test_serve_diffusion.c — a block-diffusion model (DiffusionGemma) through
 * the server over the real engine: a random DiffusionGemma folder made here
 * (the default model's tokenizer and chat template, vocabulary 4096,
 * canvas of 8) is served; GET /v1 lists the denoising method; a chat
 * completion denoises (max_tokens honoured, "length"); so do completions,
 * Anthropic messages and Responses; a streamed one sends its tokens a block
 * at a time and ends with [DONE], with the whole reply's text for the same
 * seed; the same seed gives the same text; a grammar is refused 400; a
 * client that goes away mid-stream cancels the run (/stats counts it
 * cancelled and nothing is left running); and over a model whose blocks take
 * 100000 denoising steps, a client gone before its first block is final —
 * awaiting a whole reply or a stream — stops the run between two denoising
 * steps, no token generated. The numbers themselves are checked against
 * transformers in tests/engine/test_denoise.c. */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "format/safetensors_write.h"
#include "serve/engine.h"
#include "serve/server.h"
#include "serve_harness.h"
#include "test.h"

#define DEFAULT_MODEL HEARTH_SOURCE_DIR "/models/default"

static int g_port;
static char g_root[128];

static char *http(const char *method, const char *path, const char *body) { return http_at(g_port, method, path, NULL, body); }

/* ---- a random DiffusionGemma folder ---- */

enum { V = 4096, D = 32, H = 2, KV = 1, HD = 16, I = 64, E = 4, K = 2, MI = 16, L = 2, CANVAS = 8 };

typedef struct tensors {
  st_writer *w;
  float *bufs[128];
  int n;
  uint32_t x;
} tensors;

/* a tensor of random values: around 1 for norms and scales (ones = 1), else about 1/sqrt(fan-in) */
static void add(tensors *t, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2, int ones) {
  int64_t shape[3] = {d0, d1, d2}, n = d0 * (ndim > 1 ? d1 : 1) * (ndim > 2 ? d2 : 1);
  float *b = malloc(sizeof(float) * (size_t)n);
  float scale = ndim == 1 ? 0.1f : 2.0f / sqrtf((float)shape[ndim - 1]);
  for (int64_t i = 0; i < n; i++) {
    t->x = t->x * 1664525u + 1013904223u;
    float r = (float)(t->x >> 8) / 16777216.0f - 0.5f;
    b[i] = ones ? 1.0f + r * scale : r * scale * 2;
  }
  t->bufs[t->n++] = b;
  st_writer_tensor(t->w, name, ST_F32, ndim, shape, b);
}

static int copy_file(const char *from, const char *to) {
  FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
  if (!a || !b) {
    if (a) fclose(a);
    if (b) fclose(b);
    return -1;
  }
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, a)) > 0) fwrite(buf, 1, n, b);
  fclose(a);
  fclose(b);
  return 0;
}

static int write_model(const char *dir, int steps) {
  mkdir(dir, 0755);
  char path[300];
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  if (!f) return -1;
  fprintf(f,
          "{\"model_type\": \"diffusion_gemma\", \"architectures\": [\"DiffusionGemmaForBlockDiffusion\"], \"canvas_length\": %d,"
          " \"tie_word_embeddings\": true, \"text_config\": {\"model_type\": \"diffusion_gemma_text\", \"vocab_size\": %d,"
          " \"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d,"
          " \"num_key_value_heads\": %d, \"head_dim\": %d, \"sliding_window\": 8,"
          " \"layer_types\": [\"sliding_attention\", \"full_attention\"],"
          " \"per_layer_config\": {\"1\": {\"head_dim\": %d, \"num_key_value_heads\": %d}},"
          " \"num_experts\": %d, \"top_k_experts\": %d, \"moe_intermediate_size\": %d, \"max_position_embeddings\": 4096,"
          " \"bos_token_id\": 0, \"eos_token_id\": 2, \"pad_token_id\": 1, \"hidden_activation\": \"gelu_pytorch_tanh\"}}",
          CANVAS, V, D, I, L, H, KV, HD, HD, KV, E, K, MI);
  fclose(f);
  /* few denoising steps: the test is about serving, not quality (many: cancelled inside a block) */
  snprintf(path, sizeof path, "%s/generation_config.json", dir);
  if (!(f = fopen(path, "w"))) return -1;
  fprintf(f, "{\"max_denoising_steps\": %d, \"t_min\": 0.4, \"t_max\": 0.8, \"sampler_config\": {\"entropy_bound\": 0.5}}",
          steps);
  fclose(f);
  char from[300];
  snprintf(from, sizeof from, "%s/tokenizer.json", DEFAULT_MODEL);
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  if (copy_file(from, path)) return -1;
  snprintf(from, sizeof from, "%s/tokenizer_config.json", DEFAULT_MODEL);
  snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
  if (copy_file(from, path)) return -1;
  tensors t = {.w = st_writer_new(), .x = 12345};
  char name[200];
#define P(fmt, ...) (snprintf(name, sizeof name, "model.decoder." fmt, __VA_ARGS__), name)
  add(&t, "model.decoder.embed_tokens.weight", 2, V, D, 0, 0);
  add(&t, "model.decoder.norm.weight", 1, D, 0, 0, 1);
  add(&t, "model.decoder.self_conditioning.pre_norm.weight", 1, D, 0, 0, 1);
  add(&t, "model.decoder.self_conditioning.gate_proj.weight", 2, I, D, 0, 0);
  add(&t, "model.decoder.self_conditioning.up_proj.weight", 2, I, D, 0, 0);
  add(&t, "model.decoder.self_conditioning.down_proj.weight", 2, D, I, 0, 0);
  for (int l = 0; l < L; l++) {
    static const char *const norms[] = {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                                        "post_feedforward_layernorm", "pre_feedforward_layernorm_2",
                                        "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"};
    for (int i = 0; i < 7; i++) add(&t, P("layers.%d.%s.weight", l, norms[i]), 1, D, 0, 0, 1);
    add(&t, P("layers.%d.self_attn.q_proj.weight", l), 2, H * HD, D, 0, 0);
    add(&t, P("layers.%d.self_attn.k_proj.weight", l), 2, KV * HD, D, 0, 0);
    if (l == 0) add(&t, P("layers.%d.self_attn.v_proj.weight", l), 2, KV * HD, D, 0, 0);
    add(&t, P("layers.%d.self_attn.o_proj.weight", l), 2, D, H * HD, 0, 0);
    add(&t, P("layers.%d.self_attn.q_norm.weight", l), 1, HD, 0, 0, 1);
    add(&t, P("layers.%d.self_attn.k_norm.weight", l), 1, HD, 0, 0, 1);
    add(&t, P("layers.%d.mlp.gate_proj.weight", l), 2, I, D, 0, 0);
    add(&t, P("layers.%d.mlp.up_proj.weight", l), 2, I, D, 0, 0);
    add(&t, P("layers.%d.mlp.down_proj.weight", l), 2, D, I, 0, 0);
    add(&t, P("layers.%d.router.proj.weight", l), 2, E, D, 0, 0);
    add(&t, P("layers.%d.router.scale", l), 1, D, 0, 0, 1);
    add(&t, P("layers.%d.router.per_expert_scale", l), 1, E, 0, 0, 1);
    add(&t, P("layers.%d.experts.gate_up_proj", l), 3, E, 2 * MI, D, 0);
    add(&t, P("layers.%d.experts.down_proj", l), 3, E, D, MI, 0);
  }
#undef P
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  herr err = {0};
  int rc = st_writer_write(t.w, path, NULL, NULL, &err);
  if (rc) fprintf(stderr, "write %s: %s\n", path, err.msg);
  st_writer_free(t.w);
  for (int i = 0; i < t.n; i++) free(t.bufs[i]);
  return rc;
}

/* ---- the tests ---- */

static void test_index(void) {
  char *r = http("GET", "/v1", NULL);
  json_t *j = body_json(r);
  const json_t *methods = json_object_get(json_object_get(j, "capabilities"), "methods");
  CHECK_EQ_INT(json_array_size(methods), 1);
  CHECK_EQ_STR(json_string_value(json_array_get(methods, 0)), "denoising");
  json_decref(j);
  free(r);
}

static char *chat(const char *extra, int *status, int64_t *tokens, const char **finish_out) {
  hbuf b = {0};
  hbuf_printf(&b, "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story\"}],\"ignore_eos\":true%s}", extra);
  char *r = http("POST", "/v1/chat/completions", hbuf_str(&b));
  hbuf_free(&b);
  *status = status_of(r);
  json_t *j = body_json(r);
  free(r);
  const json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
  const char *t = json_string_value(json_object_get(json_object_get(ch, "message"), "content"));
  static char finish[32];
  snprintf(finish, sizeof finish, "%s", json_string_value(json_object_get(ch, "finish_reason")) ?: "");
  if (finish_out) *finish_out = finish;
  if (tokens) *tokens = json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens"));
  char *out = strdup(t ? t : "");
  json_decref(j);
  return out;
}

static void test_chat(void) {
  int st;
  int64_t n;
  const char *finish;
  char *a = chat(",\"max_tokens\":20,\"seed\":7", &st, &n, &finish);
  CHECK_EQ_INT(st, 200);
  CHECK_EQ_INT(n, 20); /* three blocks of 8, cut at max_tokens */
  CHECK_EQ_STR(finish, "length");
  CHECK(strlen(a) > 0);
  char *b = chat(",\"max_tokens\":20,\"seed\":7", &st, &n, NULL);
  CHECK_EQ_STR(a, b); /* the seed fixes the canvases and the samples */
  char *c = chat(",\"max_tokens\":20,\"seed\":8", &st, &n, NULL);
  CHECK(strcmp(a, c) != 0);
  free(a);
  free(b);
  free(c);
  /* a grammar cannot constrain a denoised block */
  char *r = http("POST", "/v1/chat/completions",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":8,"
                 "\"response_format\":{\"type\":\"json_object\"}}");
  CHECK_EQ_INT(status_of(r), 400);
  free(r);
}

/* Streamed: the tokens come a block at a time (events arrive in bursts of the block's tokens; the
 * count is whole blocks until max_tokens), then [DONE]. */
static void test_stream(void) {
  int fd = dial(g_port);
  CHECK(fd >= 0);
  if (fd < 0) return;
  send_request(fd, "POST", "/v1/chat/completions", NULL,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story\"}],\"max_tokens\":24,\"ignore_eos\":true,"
               "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"seed\":3}");
  char *r = read_all(fd);
  CHECK(strstr(r, "data: [DONE]") != NULL);
  CHECK(strstr(r, "\"finish_reason\":\"length\"") != NULL);
  CHECK(strstr(r, "\"completion_tokens\":24") != NULL);
  int chunks = 0;
  for (const char *p = r; (p = strstr(p, "\"content\":\"")); p++) chunks++;
  CHECK(chunks >= 1);
  free(r);
}

/* The other endpoints denoise as well: completions, Anthropic messages, Responses. */
static void test_endpoints(void) {
  static const struct {
    const char *path, *body, *text_key;
  } cases[] = {
      {"/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"ignore_eos\":true,\"seed\":1}", "\"text\""},
      {"/v1/messages", "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":8,\"ignore_eos\":true}",
       "\"output_tokens\":8"},
      {"/v1/responses", "{\"input\":\"hi\",\"max_output_tokens\":8,\"ignore_eos\":true}", "\"output_tokens\":8"},
  };
  char *models = http("GET", "/v1/models", NULL);
  json_t *mj = body_json(models);
  const char *id = json_string_value(json_object_get(json_array_get(json_object_get(mj, "data"), 0), "id"));
  CHECK(id != NULL);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char body[512];
    snprintf(body, sizeof body, cases[i].body, id ? id : "");
    char *r = http("POST", cases[i].path, body);
    CHECK_MSG(status_of(r) == 200 && strstr(r, cases[i].text_key), "%s: %.300s", cases[i].path, r);
    free(r);
  }
  json_decref(mj);
  free(models);
}

/* A streamed reply and a whole one with the same seed: the same text. */
static void test_stream_same_text(void) {
  int st;
  int64_t n;
  char *whole = chat(",\"max_tokens\":16,\"seed\":11", &st, &n, NULL);
  CHECK_EQ_INT(st, 200);
  char *r = http("POST", "/v1/chat/completions",
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a story\"}],\"ignore_eos\":true,\"max_tokens\":16,"
                 "\"seed\":11,\"stream\":true}");
  hbuf text = {0};
  for (const char *p = r; (p = strstr(p, "data: {")); p++) {
    const char *e = strstr(p, "\n\n");
    if (!e) break;
    json_t *j = json_loadb(p + 6, (size_t)(e - p - 6), 0, NULL);
    const char *c = json_string_value(json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta"), "content"));
    if (c) hbuf_puts(&text, c);
    json_decref(j);
  }
  CHECK_EQ_STR(hbuf_str(&text), whole);
  hbuf_free(&text);
  free(r);
  free(whole);
}

static json_t *stats(void) {
  char *r = http("GET", "/stats", NULL);
  json_t *j = body_json(r);
  free(r);
  return j;
}

/* The client goes away mid-stream: the run stops between denoising steps. */
static void test_cancel(void) {
  json_t *j = stats();
  int64_t before = json_integer_value(json_object_get(json_object_get(j, "requests"), "cancelled"));
  json_decref(j);
  int fd = dial(g_port);
  CHECK(fd >= 0);
  if (fd < 0) return;
  send_request(fd, "POST", "/v1/chat/completions", NULL,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me a long story\"}],\"max_tokens\":3000,"
               "\"ignore_eos\":true,\"stream\":true}");
  hbuf got = {0};
  char buf[1024];
  ssize_t n;
  while (!strstr(hbuf_str(&got), "\"content\"") && (n = recv(fd, buf, sizeof buf, 0)) > 0) hbuf_append(&got, buf, (size_t)n);
  CHECK(strstr(hbuf_str(&got), "\"content\"") != NULL); /* the first block came */
  hbuf_free(&got);
  close(fd);
  /* wait until the engine has noticed (each denoising step checks) */
  int64_t cancelled = before, running = 1;
  for (int i = 0; i < 600 && (cancelled == before || running); i++) {
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    j = stats();
    cancelled = json_integer_value(json_object_get(json_object_get(j, "requests"), "cancelled"));
    running = json_integer_value(json_object_get(json_object_get(j, "requests"), "running"));
    json_decref(j);
  }
  CHECK_EQ_INT(cancelled, before + 1);
  CHECK_EQ_INT(running, 0);
}

static int64_t stat_of(const char *group, const char *key) {
  json_t *j = stats();
  int64_t v = json_integer_value(json_object_get(json_object_get(j, group), key));
  json_decref(j);
  return v;
}

/* A server over a model whose blocks take 100000 denoising steps each: a client that goes away
 * before its first block is final — awaiting a whole reply, or a stream — stops its run between
 * two denoising steps: cancelled, with no token generated. */
static char g_slow[200]; /* the folder of the slow model */

static void test_cancel_inside_block(void) {
  const char *dir = g_slow;
  herr err = {0};
  harness h;
  serve_engine_opts eo = {.threads = 2, .max_batch = 8};
  if (harness_start(&h, dir, &eo, NULL, &err)) {
    CHECK_MSG(false, "%s", err.msg);
    return;
  }
  int port = g_port;
  g_port = h.port;
  for (int stream = 0; stream < 2; stream++) {
    int fd = dial(g_port);
    CHECK(fd >= 0);
    if (fd < 0) break;
    send_request(fd, "POST", "/v1/chat/completions", NULL,
                 stream ? "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":8,\"ignore_eos\":true,\"stream\":true}"
                        : "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":8,\"ignore_eos\":true}");
    int64_t running = 0;
    for (int i = 0; i < 600 && !running; i++) { /* until the run has started */
      struct timespec ts = {0, 20 * 1000 * 1000};
      nanosleep(&ts, NULL);
      running = stat_of("requests", "running");
    }
    CHECK_EQ_INT(running, 1);
    struct linger lg = {1, 0}; /* a reset: gone at once */
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
    int64_t cancelled = 0;
    for (int i = 0; i < 600 && (cancelled < stream + 1 || running); i++) {
      struct timespec ts = {0, 50 * 1000 * 1000};
      nanosleep(&ts, NULL);
      cancelled = stat_of("requests", "cancelled");
      running = stat_of("requests", "running");
    }
    CHECK_EQ_INT(cancelled, stream + 1);
    CHECK_EQ_INT(running, 0);
  }
  CHECK_EQ_INT(stat_of("tokens", "generated"), 0); /* no block was ever final */
  CHECK_EQ_INT(stat_of("requests", "finished"), 0);
  harness_stop(&h);
  g_port = port;
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  snprintf(g_root, sizeof g_root, "/tmp/hearth_test_serve_diffusion_%d", (int)getpid());
  mkdir(g_root, 0755);
  char dir[200];
  snprintf(dir, sizeof dir, "%s/model", g_root);
  if (write_model(dir, 4)) {
    fprintf(stderr, "could not write the model folder\n");
    return 1;
  }
  herr err = {0};
  harness h;
  serve_engine_opts eo = {.threads = 2, .max_batch = 8};
  if (harness_start(&h, dir, &eo, NULL, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  g_port = h.port;
  RUN(test_index);
  RUN(test_chat);
  RUN(test_endpoints);
  RUN(test_stream);
  RUN(test_stream_same_text);
  RUN(test_cancel);
  harness_stop(&h);
  snprintf(g_slow, sizeof g_slow, "%s/slow", g_root);
  if (write_model(g_slow, 100000)) {
    fprintf(stderr, "could not write the model folder\n");
    return 1;
  }
  RUN(test_cancel_inside_block);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_root);
  TEST_MAIN_END();
}
