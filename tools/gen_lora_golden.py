#!/usr/bin/env python3
"""Generates hearth's LoRA fixtures with peft and transformers.

Bases: the committed tiny golden models tests/fixtures/golden/llama-f32 and
qwen3-f32 (made by tools/gen_golden.py). On each, two random PEFT adapters
made with peft.LoraConfig / get_peft_model and saved with save_pretrained:

  plain  r=8, lora_alpha=16, attention q/k/v/o (on qwen3 only layer 1, through
         layers_to_transform)
  rs     r=4, lora_alpha=8, use_rslora (scale alpha/sqrt(r)), MLP gate/up/down
         (on qwen3 named by a regex string, PEFT's other target_modules form)

lora_A and lora_B are both filled with random values (PEFT starts B at zero,
which would make every adapter a no-op). Reference logits are computed in
float64: each adapter's delta scale * B @ A merged into a float64 copy of the
base weights, then the base model's forward; the same for both adapters
stacked (both deltas summed). PEFT's own forward (float32) is run too and its
largest difference from the merged reference recorded, so the merge is
checked against PEFT's semantics.

Per base, OUT/<base>/:
  plain/, rs/            adapter_config.json + adapter_model.safetensors
  golden.json            base folder, prompts, per case: adapters, logits file,
                         max |logit|, PEFT-vs-merged difference
  logits_<case>.bin      float32 little-endian [prompt][position][vocab]

Usage: python3 tools/gen_lora_golden.py OUT [BASES_DIR]
       (BASES_DIR: tests/fixtures/golden; needs torch, transformers, peft)
"""
import json
import math
import os
import shutil
import sys

import numpy as np
import peft
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]

# base -> adapter name -> LoraConfig arguments
ADAPTERS = {
    "llama-f32": {
        "plain": dict(r=8, lora_alpha=16, target_modules=ATTN),
        "rs": dict(r=4, lora_alpha=8, use_rslora=True, target_modules=MLP),
    },
    "qwen3-f32": {
        "plain": dict(r=8, lora_alpha=16, target_modules=ATTN, layers_to_transform=[1]),
        "rs": dict(r=4, lora_alpha=8, use_rslora=True, target_modules=r".*\.mlp\.(gate_proj|up_proj|down_proj)"),
    },
}
CASES = [["plain"], ["rs"], ["plain", "rs"]]


def load(folder, dtype):
    m = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager")
    m.eval()
    return m


def make_adapter(base_folder, out, kw, seed):
    model = load(base_folder, torch.float32)
    cfg = LoraConfig(lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", **kw)
    pm = get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_A" in name:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) / math.sqrt(p.shape[1]))
            elif "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.2 / math.sqrt(p.shape[1]))
    shutil.rmtree(out, ignore_errors=True)
    pm.save_pretrained(out)
    return pm


def deltas(adapter_dir):
    """{module path: float64 delta} from a saved adapter, as PEFT scales it."""
    from safetensors.torch import load_file
    with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
        cfg = json.load(f)
    t = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    out = {}
    for k, a in t.items():
        if ".lora_A." not in k:
            continue
        mod = k.split(".lora_A.")[0]
        b = t[k.replace(".lora_A.", ".lora_B.")]
        r = a.shape[0]
        alpha = cfg["lora_alpha"]
        scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
        path = mod[len("base_model.model."):]
        out[path] = scale * (b.to(torch.float64) @ a.to(torch.float64))
    return out


def merged_logits(base_folder, adapter_dirs, prompts):
    m = load(base_folder, torch.float64)
    params = dict(m.named_parameters())
    with torch.no_grad():
        for d in adapter_dirs:
            for path, delta in deltas(d).items():
                params[path + ".weight"].add_(delta)
        rows = [m(torch.tensor([p])).logits[0].numpy() for p in prompts]
    return np.concatenate(rows, axis=0)


def peft_logits(base_folder, adapter_dir, prompts):
    m = load(base_folder, torch.float32)
    pm = PeftModel.from_pretrained(m, adapter_dir)
    pm.eval()
    with torch.no_grad():
        rows = [pm(torch.tensor([p])).logits[0].double().numpy() for p in prompts]
    return np.concatenate(rows, axis=0)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/lora"
    bases = sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/golden"
    os.makedirs(out, exist_ok=True)
    for seed, (base, adapters) in enumerate(ADAPTERS.items()):
        base_folder = os.path.join(bases, base)
        with open(os.path.join(base_folder, "golden.json")) as f:
            prompts = json.load(f)["prompts"]
        folder = os.path.join(out, base)
        os.makedirs(folder, exist_ok=True)
        for i, (name, kw) in enumerate(adapters.items()):
            make_adapter(base_folder, os.path.join(folder, name), kw, 1000 + 10 * seed + i)
        base_ref = merged_logits(base_folder, [], prompts)
        doc = {"base": base, "peft_version": peft.__version__, "transformers_version": transformers.__version__,
               "torch_version": torch.__version__,
               "reference": "float64 forward of the base with each adapter's scale * B @ A merged into its weights",
               "prompts": prompts, "logits_rows": [len(p) for p in prompts], "cases": []}
        for case in CASES:
            dirs = [os.path.join(folder, a) for a in case]
            ref = merged_logits(base_folder, dirs, prompts)
            fname = "logits_" + "+".join(case) + ".bin"
            ref.astype("<f4").tofile(os.path.join(folder, fname))
            c = {"adapters": case, "logits_file": fname, "max_abs_logit": float(np.abs(ref).max()),
                 "max_abs_change_from_base": float(np.abs(ref - base_ref).max())}
            if len(case) == 1:
                c["peft_f32_vs_reference"] = float(np.abs(peft_logits(base_folder, dirs[0], prompts) - ref).max())
            doc["cases"].append(c)
            print(f"{base} {'+'.join(case)}: max|logit| {c['max_abs_logit']:.3f} change {c['max_abs_change_from_base']:.3f}"
                  f" peft diff {c.get('peft_f32_vs_reference', float('nan')):.3g}", flush=True)
        with open(os.path.join(folder, "golden.json"), "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
