/* train.c — `hearth train sft`: a LoRA adapter fine-tuned on the CPU from
 * JSONL data (src/train), written as PEFT writes it so `--adapter`, `hearth
 * fuse` and POST /v1/adapters load it. Parses options, prints progress
 * lines; the training itself is train_sft's. */
#include <string.h>

#include "cli/cli.h"
#include "train/train.h"

static void train_usage(FILE *f) {
  fprintf(f,
          "usage: hearth train sft --data train.jsonl --out DIR [options]\n"
          "\n"
          "Fine-tunes a LoRA adapter on the CPU (supervised: the loss on the answer's tokens only).\n"
          "Data: one JSON object a line, {\"messages\": [...]} (rendered with the model's chat template,\n"
          "the loss on the assistant turns) or {\"prompt\": ..., \"completion\": ...} (the loss on the\n"
          "completion and EOS). The adapter (adapter_config.json + adapter_model.safetensors) loads with\n"
          "--adapter DIR.\n"
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
          "  --weight-decay X     AdamW weight decay (default 0)\n"
          "  --max-grad-norm X    clip the gradient's global norm (default 1; 0: off)\n"
          "  --seed N             the adapter's initialization and the order of examples (default 0)\n"
          "  --eval-every N       steps between evaluations (default: only before and after)\n"
          "  --log FILE           a JSONL line per step: step, loss, lr, grad_norm, tokens_per_s (and eval_loss)\n"
          "  --threads N          CPU threads (default: one per CPU)\n");
}

int cli_train(int argc, char **argv) {
  if (argc < 2 || cli_is_help(argv[1])) {
    train_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (strcmp(argv[1], "sft") != 0)
    return cli_usage_error("train", "'%s' is not a training method (sft is; dpo and orpo are not built yet)", argv[1]);
  train_opts o;
  train_opts_init(&o);
  const char *v = NULL;
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
  o.progress = stderr;
  train_result res;
  herr err = {0};
  if (train_sft(&o, &res, &err)) return cli_fail("train: %s", err.msg);
  return 0;
}
