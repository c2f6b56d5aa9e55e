#!/usr/bin/env python3
"""Generates the reference for hearth's LoRA trainer with peft and torch.

Base: the committed tiny golden model tests/fixtures/golden/llama-f32 (made
by tools/gen_golden.py), loaded in float64. A PEFT adapter (r=4,
lora_alpha=8, every linear projection of the decoder, dropout 0) whose
lora_A and lora_B are both filled with seeded random values (PEFT starts B
at zero, which would leave A without gradient), saved with save_pretrained
as the starting point. One batch: the golden prompts, the loss on the
tokens of their second halves only (labels -100 elsewhere), the mean over
those tokens of the whole batch (the normalization hearth's trainer uses:
the summed token losses divided by their count). Recorded:

  the loss;
  every LoRA parameter's gradient (float64);
  the adapter after 3 steps of torch.optim.AdamW (lr 1e-3, betas 0.9 /
  0.999, eps 1e-8, weight decay 0.5: large enough for its share of the step to show) on the same batch, the gradient's
  global norm clipped to 1 (torch.nn.utils.clip_grad_norm_), the learning
  rate of step k (from 0) peak * 0.5 * (1 + cos(pi * k / 3)) — transformers'
  cosine schedule without warm-up, as hearth's train_lr_at gives it.

OUT/llama-f32/:
  adapter_init/          adapter_config.json + adapter_model.safetensors as PEFT saves them from the float64 run
                         (values rounded to float32 first, so the file holds exactly the starting point)
  grads.safetensors      float64 gradients under the adapter's tensor names
  adapter_step3/         the adapter after 3 steps (rounded to float32)
  golden.json            versions, the batch (ids, learned flags), the loss, the optimizer's settings, the grad norms

Usage: python3 tools/gen_train_ref.py OUT [BASES_DIR]
       (BASES_DIR: tests/fixtures/golden; needs torch, transformers, peft, safetensors)
"""
import json
import math
import os
import shutil
import sys

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LR, BETAS, EPS, WD, CLIP, STEPS = 1e-3, (0.9, 0.999), 1e-8, 0.5, 1.0, 3


def lora_params(pm):
    return [(n, p) for n, p in pm.named_parameters() if "lora_" in n]


def file_name(n):
    # PEFT's module path in memory -> its name in adapter_model.safetensors
    return n.replace(".default", "")


def main():
    out = sys.argv[1]
    bases = sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/golden"
    folder = os.path.join(bases, "llama-f32")
    with open(os.path.join(folder, "golden.json")) as f:
        prompts = json.load(f)["prompts"][:2]
    dst = os.path.join(out, "llama-f32")
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(dst)

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager")
    model.train()
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", target_modules=TARGETS)
    pm = get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(36)
    with torch.no_grad():
        for n, p in lora_params(pm):
            scale = 1.0 / math.sqrt(p.shape[1]) * (0.2 if "lora_B" in n else 1.0)
            # rounded to float32 so that the saved starting point is exactly what was run
            p.copy_((torch.randn(p.shape, generator=g, dtype=torch.float64) * scale).float().double())
    pm.save_pretrained(os.path.join(dst, "adapter_init"))

    # the batch: each prompt a sequence of its own (no padding), labels on the second half
    seqs, flags = [], []
    for ids in prompts:
        half = len(ids) // 2
        seqs.append(ids)
        flags.append([0] * half + [1] * (len(ids) - half))

    def batch_loss():
        total, count = 0.0, 0
        for ids, fl in zip(seqs, flags):
            x = torch.tensor([ids])
            logits = pm(input_ids=x).logits[0].double()
            logp = torch.log_softmax(logits[:-1], dim=-1)
            tgt = torch.tensor(ids[1:])
            mask = torch.tensor(fl[1:], dtype=torch.bool)
            total = total - logp[torch.arange(len(ids) - 1), tgt][mask].sum()
            count += int(mask.sum())
        return total / count

    params = [p for _, p in lora_params(pm)]
    loss = batch_loss()
    loss.backward()
    grads = {file_name(n): p.grad.detach().clone() for n, p in lora_params(pm)}
    save_file({k: v.contiguous() for k, v in grads.items()}, os.path.join(dst, "grads.safetensors"))
    loss0 = float(loss)

    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    norms = []
    for k in range(STEPS):
        opt.zero_grad()
        l = batch_loss()
        l.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, CLIP)))
        for group in opt.param_groups:
            group["lr"] = LR * 0.5 * (1 + math.cos(math.pi * k / STEPS))
        opt.step()
    with torch.no_grad():
        for p in params:
            p.copy_(p.float().double())
    pm.save_pretrained(os.path.join(dst, "adapter_step3"))

    doc = {
        "base": "llama-f32",
        "peft_version": peft.__version__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "sequences": seqs,
        "learned": flags,
        "loss": loss0,
        "optimizer": {"lr": LR, "betas": BETAS, "eps": EPS, "weight_decay": WD, "max_grad_norm": CLIP, "steps": STEPS,
                      "schedule": "cosine, no warm-up"},
        "grad_norms": norms,
    }
    with open(os.path.join(dst, "golden.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
