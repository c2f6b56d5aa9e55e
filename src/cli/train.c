/* train.c — `hearth train sft|dpo|orpo`: a LoRA adapter fine-tuned on the
 * CPU from JSONL data (src/train), written as PEFT writes it so `--adapter`,
 * `hearth fuse` and POST /v1/adapters load it. Parses options; the training,
 * its progress, log, checkpoints and loss curve are train_run's. With
 * --serve URL it then asks a running `hearth serve` to load the adapter
 * (POST URL/v1/adapters, libcurl). */
#include <curl/curl.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "cli/cli.h"
#include "train/train.h"

static void train_usage(FILE *f) {
  fprintf(f,
          "usage: hearth train sft|dpo|orpo --data train.jsonl --out DIR [options]\n"
          "\n"
          "Fine-tunes a LoRA adapter on the CPU.\n"
          "  sft   supervised: the loss on the answer's tokens only. Lines {\"messages\": [...]} (rendered with\n"
          "        the model's chat template, the loss on the assistant turns) or {\"prompt\": ..., \"completion\": ...}\n"
          "        (the loss on the completion and EOS).\n"
          "  dpo   preference pairs {\"prompt\", \"chosen\", \"rejected\"} (prompt: a string, or messages rendered\n"
          "        with the chat template; chosen / rejected: strings or assistant messages): DPO's sigmoid loss\n"
          "        against the base model as the reference (its log-probs computed once, before training).\n"
          "  orpo  the same lines: the chosen side's NLL plus --beta times ORPO's odds-ratio term.\n"
          "OUT gets the adapter (adapter_config.json + adapter_model.safetensors, loads with --adapter DIR),\n"
          "log.jsonl (a line per step: step, loss, lr, grad_norm, tokens_per_s; eval_loss lines), the loss\n"
          "curve loss.svg and loss.png (with gnuplot), and checkpoint-STEP/ folders with --save-every.\n"
          "\n"
          "  --model M            the base model (default: the built-in model): a llama, mistral, qwen2,\n"
          "                       qwen3, smollm3, gemma2, gemma3 or phi3 decoder\n"
          "  --data FILE          training JSONL (required)\n"
          "  --eval FILE          evaluation JSONL: its loss before training, every --eval-every steps, at the end\n"
          "  --out DIR            the adapter's folder (required; made when missing)\n"
          "  --steps N            optimizer steps (default: from --epochs)\n"
          "  --epochs E           passes over the data (default 1)\n"
          "  --lr X               peak learning rate (default 2e-4), cosine decay to 0 after the warm-up\n"
          "  --warmup N           warm-up steps (default a tenth of the steps)\n"
          "  --rank R             LoRA rank (default 8)\n"
          "  --alpha A            LoRA alpha (default 16): scale alpha / rank\n"
          "  --rslora             scale alpha / sqrt(rank)\n"
          "  --dropout P          LoRA dropout (default 0)\n"
          "  --target LIST        modules: q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj or all-linear\n"
          "                       (qkv_proj,gate_up_proj where a model fuses them)\n"
          "                       (default q_proj,v_proj)\n"
          "  --batch N            examples per micro-batch (default 4)\n"
          "  --grad-accum N       micro-batches per step (default 1); the loss is averaged over a step's tokens\n"
          "  --seq-len N          examples cut to N tokens (default 512)\n"
          "  --packing            sft: short examples packed into sequences of up to --seq-len tokens (best-fit\n"
          "                       decreasing, none split); attention stays inside each example and its positions\n"
          "                       start at 0, so the loss and gradients are those of the examples one by one;\n"
          "                       --batch then counts packed sequences, and the loss is still per learned token\n"
          "                       over the whole step\n"
          "  --checkpoint-layers [N]\n"
          "                       activation checkpointing: from the forward keep only the input of every N-th\n"
          "                       layer (default 1: each layer's), and recompute the layers' activations from it\n"
          "                       in the backward: the same gradients bit for bit, for less memory and about one\n"
          "                       more forward pass of time\n"
          "  --weight-decay X     AdamW weight decay (default 0)\n"
          "  --max-grad-norm X    clip the gradient's global norm (default 1; 0: off)\n"
          "  --seed N             the adapter's initialization and the order of examples (default 0)\n"
          "  --eval-every N       steps between evaluations (default: only before and after)\n"
          "  --log FILE           the JSONL log (default OUT/log.jsonl)\n"
          "  --beta X             dpo: DPO's beta; orpo: the odds-ratio term's weight lambda (default 0.1)\n"
          "  --save-every N       a checkpoint every N steps: OUT/checkpoint-STEP (adapter, optimizer, data position)\n"
          "  --resume [DIR]       continue from checkpoint DIR (default: OUT's latest) to the same bytes as an\n"
          "                       uninterrupted run; the other options must be the run's own\n"
          "  --serve URL          when done, load the adapter into the `hearth serve` at URL (POST /v1/adapters);\n"
          "                       that server loads only from folders inside its --adapter-dir: OUT must be there\n"
          "  --serve-name NAME    the adapter's name on the server (default: OUT's last component)\n"
          "  --api-key KEY        the server's key (also $HEARTH_API_KEY)\n"
          "  --no-plot            no loss curve\n"
          "  --threads N          CPU threads (default: one per CPU)\n"
          "Progress: one line rewritten in place on a terminal (step, loss, tokens/s, ETA), a line per step otherwise.\n");
}

static size_t gather(char *p, size_t size, size_t n, void *ctx) {
  hbuf_append(ctx, p, size * n);
  return size * n;
}

/* POST URL/v1/adapters {"name", "path"}: the written adapter loaded by a running server. */
static int serve_load(const char *url, const char *name, const char *key, const char *out) {
  char *real = realpath(out, NULL);
  if (!real) return cli_fail("train: --serve: %s: cannot resolve the path", out);
  char base[PATH_MAX];
  snprintf(base, sizeof base, "%s", real);
  size_t bl = strlen(base);
  while (bl > 1 && base[bl - 1] == '/') base[--bl] = 0;
  const char *slash = strrchr(base, '/');
  if (!name) name = slash && slash[1] ? slash + 1 : base;
  hbuf u = {0}, reply = {0};
  size_t ul = strlen(url);
  while (ul && url[ul - 1] == '/') ul--;
  if (ul >= 12 && !strncmp(url + ul - 12, "/v1/adapters", 12)) hbuf_printf(&u, "%.*s", (int)ul, url);
  else if (ul >= 3 && !strncmp(url + ul - 3, "/v1", 3)) hbuf_printf(&u, "%.*s/adapters", (int)ul, url);
  else hbuf_printf(&u, "%.*s/v1/adapters", (int)ul, url);
  json_t *body = json_pack("{s:s,s:s}", "name", name, "path", real);
  char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  CURL *c = curl_easy_init();
  struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
  char auth[600];
  if (key && key[0]) {
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
    h = curl_slist_append(h, auth);
  }
  int rc = 0;
  long status = 0;
  if (!c || !h || !text || u.oom) {
    rc = cli_fail("train: --serve: out of memory");
  } else {
    curl_easy_setopt(c, CURLOPT_URL, hbuf_str(&u));
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, gather);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &reply);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 300L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    CURLcode cc = curl_easy_perform(c);
    if (cc != CURLE_OK) {
      rc = cli_fail("train: --serve: %s: %s (the adapter is in %s)", hbuf_str(&u), curl_easy_strerror(cc), out);
    } else {
      curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
      json_t *r = json_loads(hbuf_str(&reply), 0, NULL);
      const char *msg = json_string_value(json_object_get(json_object_get(r, "error"), "message"));
      if (status != 200)
        rc = cli_fail("train: --serve: the server answered %ld: %s (the adapter is in %s%s)", status, msg ? msg : hbuf_str(&reply),
                      out, status == 400 || status == 403 ? "; the server loads only from folders inside its --adapter-dir" : "");
      else
        fprintf(stderr, "train: the server at %.*s loaded the adapter as '%s'\n", (int)ul, url, name);
      json_decref(r);
    }
  }
  if (c) curl_easy_cleanup(c);
  curl_slist_free_all(h);
  free(text), free(real);
  hbuf_free(&u), hbuf_free(&reply);
  return rc;
}

int cli_train(int argc, char **argv) {
  if (argc < 2 || cli_is_help(argv[1])) {
    train_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  train_opts o;
  train_opts_init(&o);
  if (!strcmp(argv[1], "sft")) o.method = TRAIN_SFT;
  else if (!strcmp(argv[1], "dpo")) o.method = TRAIN_DPO;
  else if (!strcmp(argv[1], "orpo")) o.method = TRAIN_ORPO;
  else return cli_usage_error("train", "'%s' is not a training method (sft, dpo and orpo are)", argv[1]);
  const char *v = NULL, *serve = NULL, *serve_name = NULL, *key = getenv("HEARTH_API_KEY");
  long long n;
  double d;
  for (int i = 2; i < argc; i++) {
    int r;
    if (cli_is_help(argv[i])) {
      train_usage(stdout);
      return 0;
    } else if ((r = cli_opt(argc, argv, &i, "--model", &v))) {
      if (r < 0) return 2;
      o.model_dir = v;
    } else if ((r = cli_opt(argc, argv, &i, "--data", &v))) {
      if (r < 0) return 2;
      o.data = v;
    } else if ((r = cli_opt(argc, argv, &i, "--eval", &v))) {
      if (r < 0) return 2;
      o.eval = v;
    } else if ((r = cli_opt(argc, argv, &i, "--out", &v))) {
      if (r < 0) return 2;
      o.out = v;
    } else if ((r = cli_opt(argc, argv, &i, "--log", &v))) {
      if (r < 0) return 2;
      o.log = v;
    } else if ((r = cli_opt(argc, argv, &i, "--target", &v))) {
      if (r < 0) return 2;
      herr err = {0};
      if (train_targets_parse(v, &o.targets, &err)) return cli_usage_error("train", "%s", err.msg);
    } else if ((r = cli_opt_threads("train", argc, argv, &i, "--threads", &o.threads))) {
      if (r < 0) return 2;
    } else if (!strcmp(argv[i], "--rslora")) {
      o.rslora = true;
    } else if (!strcmp(argv[i], "--no-plot")) {
      o.plot = false;
    } else if (!strcmp(argv[i], "--packing")) {
      o.packing = true;
    } else if (!strcmp(argv[i], "--checkpoint-layers") || !strncmp(argv[i], "--checkpoint-layers=", 20)) {
      const char *nv = argv[i][19] == '=' ? argv[i] + 20 : i + 1 < argc && argv[i + 1][0] >= '0' && argv[i + 1][0] <= '9' ? argv[++i] : "1";
      char *end = NULL;
      long long k = strtoll(nv, &end, 10);
      if (end == nv || *end || k < 1 || k > 1000000)
        return cli_usage_error("train", "--checkpoint-layers takes a number of layers from 1 up, not '%s'", nv);
      o.checkpoint_layers = k;
    } else if (!strcmp(argv[i], "--resume")) {
      o.resume = i + 1 < argc && argv[i + 1][0] != '-' ? argv[++i] : "";
    } else if (!strncmp(argv[i], "--resume=", 9)) {
      o.resume = argv[i] + 9;
    } else if ((r = cli_opt(argc, argv, &i, "--serve", &v))) {
      if (r < 0) return 2;
      serve = v;
    } else if ((r = cli_opt(argc, argv, &i, "--serve-name", &v))) {
      if (r < 0) return 2;
      serve_name = v;
    } else if ((r = cli_opt(argc, argv, &i, "--api-key", &v))) {
      if (r < 0) return 2;
      key = v;
    } else if ((r = cli_opt_double("train", argc, argv, &i, "--beta", 1e-9, 1e6, &d))) {
      if (r < 0) return 2;
      o.beta = d;
    } else if ((r = cli_opt_int("train", argc, argv, &i, "--save-every", 1, 100000000, &n))) {
      if (r < 0) return 2;
      o.save_every = n;
    } else if ((r = cli_opt_int("train", argc, argv, &i, "--steps", 1, 100000000, &n))) {
      if (r < 0) return 2;
      o.steps = n;
    } else if ((r = cli_opt_double("train", argc, argv, &i, "--epochs", 1e-6, 1e6, &d))) {
      if (r < 0) return 2;
      o.epochs = d;
    } else if ((r = cli_opt_double("train", argc, argv, &i, "--lr", 1e-12, 10, &d))) {
      if (r < 0) return 2;
      o.lr = d;
    } else if ((r = cli_opt_int("train", argc, argv, &i, "--warmup", 0, 100000000, &n))) {
      if (r < 0) return 2;
      o.warmup = n;
    } else if ((r = cli_opt_int("train", argc, argv, &i, "--rank", 1, 4096, &n))) {
      if (r < 0) return 2;
      o.rank = n;
    } else if ((r = cli_opt_double("train", argc, argv, &i, "--alpha", 1e-9, 1e9, &d))) {
      if (r < 0) return 2;
      o.alpha = d;
    } else if ((r = cli_opt_double("train", argc, argv, &i, "--dropout", 0, 0.999, &d))) {
      if (r < 0) return 2;
      o.dropout = d;
    } else if ((r = cli_opt_int("train", argc, argv, &i, "--batch", 1, 4096, &n))) {
      if (r < 0) return 2;
      o.batch = n;
    } else if ((r = cli_opt_int("train", argc, argv, &i, "--grad-accum", 1, 4096, &n))) {
      if (r < 0) return 2;
      o.grad_accum = n;
    } else if ((r = cli_opt_int("train", argc, argv, &i, "--seq-len", 2, 1 << 20, &n))) {
      if (r < 0) return 2;
      o.seq_len = n;
    } else if ((r = cli_opt_double("train", argc, argv, &i, "--weight-decay", 0, 10, &d))) {
      if (r < 0) return 2;
      o.weight_decay = d;
    } else if ((r = cli_opt_double("train", argc, argv, &i, "--max-grad-norm", 0, 1e9, &d))) {
      if (r < 0) return 2;
      o.max_grad_norm = d;
    } else if ((r = cli_opt_int("train", argc, argv, &i, "--seed", 0, 0x7fffffffffffffffLL, &n))) {
      if (r < 0) return 2;
      o.seed = (uint64_t)n;
    } else if ((r = cli_opt_int("train", argc, argv, &i, "--eval-every", 0, 100000000, &n))) {
      if (r < 0) return 2;
      o.eval_every = n;
    } else {
      return cli_usage_error("train", "unknown option '%s'", argv[i]);
    }
  }
  if (!o.data) return cli_usage_error("train", "--data FILE is required");
  if (!o.out) return cli_usage_error("train", "--out DIR is required");
  if (o.batch * o.grad_accum > 4096) return cli_usage_error("train", "--batch × --grad-accum must be at most 4096");
  if (!o.model_dir && !(o.model_dir = cli_default_model())) return cli_fail("train: no --model and no built-in model found");
  if (serve && strncmp(serve, "http://", 7) != 0 && strncmp(serve, "https://", 8) != 0)
    return cli_usage_error("train", "--serve takes the server's URL (http://HOST:PORT), not '%s'", serve);
  if (serve_name && !serve_name[0]) return cli_usage_error("train", "--serve-name must not be empty");
  o.progress = stderr;
  train_result res;
  herr err = {0};
  if (train_run(&o, &res, &err)) return cli_fail("train: %s", err.msg);
  if (serve && serve_load(serve, serve_name, key, o.out)) return 1;
  return 0;
}
