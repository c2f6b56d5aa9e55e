/* complete.c — the smallest program built against an installed hearth:
 * load a model, render a one-message chat (or take the text as it is when the
 * model has no chat template), and stream a greedy reply to stdout.
 *
 *   make -C examples            (finds hearth through pkg-config)
 *   examples/complete MODEL "Write a haiku about a fireplace." [MAX_TOKENS]
 *
 * MODEL is a Hugging Face model folder or a GGUF file; the built-in model is
 * installed under <prefix>/share/hearth/models/default. */
#include <hearth.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int print_token(void *user, const char *text, size_t len, const hearth_token *tok) {
  (void)user;
  (void)tok;
  fwrite(text, 1, len, stdout);
  fflush(stdout);
  return 0; /* nonzero would cancel */
}

/* The user's text as a JSON string (quotes, backslashes and control bytes escaped). */
static char *json_string(const char *s) {
  size_t n = strlen(s);
  char *out = malloc(6 * n + 3), *o = out;
  if (!out) return NULL;
  *o++ = '"';
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') {
      *o++ = '\\';
      *o++ = (char)*p;
    } else if (*p < 0x20) {
      o += sprintf(o, "\\u%04x", *p);
    } else {
      *o++ = (char)*p;
    }
  }
  *o++ = '"';
  *o = 0;
  return out;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s MODEL PROMPT [MAX_TOKENS]\n", argv[0]);
    return 2;
  }
  hearth_error err = {0};
  hearth_model *model = NULL;
  if (hearth_model_load(argv[1], NULL, &model, &err)) {
    fprintf(stderr, "%s: %s\n", hearth_code_name(err.code), err.msg);
    return 1;
  }

  hearth_info info;
  hearth_model_info(model, &info);
  hearth_prompt prompt = {0};
  char *rendered = NULL;
  if (info.has_chat_template) {
    char *content = json_string(argv[2]);
    size_t cap = strlen(content) + 64;
    char *messages = malloc(cap);
    snprintf(messages, cap, "[{\"role\": \"user\", \"content\": %s}]", content);
    int rc = hearth_chat_render(model, messages, NULL, true, NULL, &rendered, &err);
    free(messages);
    free(content);
    if (rc) {
      fprintf(stderr, "%s: %s\n", hearth_code_name(err.code), err.msg);
      hearth_model_free(model);
      return 1;
    }
    prompt.text = rendered; /* the rendered chat already holds BOS and friends */
  } else {
    prompt.text = argv[2];
    prompt.add_special = true;
  }

  hearth_gen_params params;
  hearth_gen_params_init(&params);
  params.temperature = 0;  /* greedy: the same reply every run */
  params.max_tokens = argc > 3 ? atoll(argv[3]) : 64;

  hearth_gen_result res;
  int rc = hearth_generate(model, &prompt, &params, print_token, NULL, &res, &err);
  if (rc) {
    fprintf(stderr, "\n%s: %s\n", hearth_code_name(err.code), err.msg);
  } else {
    printf("\n");
    fprintf(stderr, "[%lld prompt tokens, %lld generated, %s]\n", (long long)res.prompt_tokens,
            (long long)res.completion_tokens, res.finish_reason == HEARTH_FINISH_LENGTH ? "length" : "stop");
  }
  hearth_free(rendered);
  hearth_model_free(model);
  return rc ? 1 : 0;
}
