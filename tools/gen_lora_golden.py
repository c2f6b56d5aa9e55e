#!/usr/bin/env python3
"""Generates hearth's LoRA fixtures with peft and transformers.

Bases: the committed tiny golden models tests/fixtures/golden/llama-f32 and
qwen3-f32 (made by tools/gen_golden.py). On each, two random PEFT adapters
made with peft.LoraConfig / get_peft_model and saved with save_pretrained:

  plain  r=8, lora_alpha=16, attention q/k/v/o (on qwen3 only layer 1, through
         layers_to_transform)
  rs     r=4, lora_alpha=8, use_rslora (scale alpha/sqrt(r)), MLP gate/up/down
         (on qwen3 named by a regex string, PEFT's other target_modules form)

On the tiny Qwen3-MoE golden model (qwen3_moe-f32), adapters on the experts:

  experts     r=4, lora_alpha=8, q_proj through target_modules and the fused
              3-D expert parameters mlp.experts.gate_up_proj / down_proj
              through target_parameters (PEFT's ParamWrapper: lora_A / lora_B
              hold every expert's rank-r factors side by side)
  per_expert  r=4, lora_alpha=8, use_rslora, the older form: one Linear
              adapter per expert (mlp.experts.N.gate_proj / up_proj /
              down_proj), written here directly since transformers 5.17 keeps
              the experts fused in memory; its reference merges each expert's
              delta into the fused gate_up_proj rows (gate first) / down_proj

The experts' reference merges with PEFT's own merge_and_unload in float64.

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

Usage: python3 tools/gen_lora_golden.py OUT [BASES_DIR [BASE,...]]
       (BASES_DIR: tests/fixtures/golden; the third argument limits the run
       to those bases; needs torch, transformers, peft)
"""
import json
import math
import os
import shutil
import sys
import traceback

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
EXPERT_PARAMS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
MOE_ADAPTERS = {
    "qwen3_moe-f32": {
        "experts": dict(r=4, lora_alpha=8, target_modules=["q_proj"], target_parameters=EXPERT_PARAMS),
        "per_expert": dict(r=4, lora_alpha=8, use_rslora=True, per_expert=True),
    },
}
CASES = [["plain"], ["rs"], ["plain", "rs"]]
MOE_CASES = [["experts"], ["per_expert"], ["experts", "per_expert"]]


def load(folder, dtype):
    # eager experts: the grouped matmul of a fused MoE layer takes no float64
    try:
        m = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager",
                                                 experts_implementation="eager")
    except (TypeError, ValueError):
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


def make_per_expert_adapter(base_folder, out, kw, seed):
    """A PEFT folder with one LoRA per expert Linear (the pre-fusion naming)."""
    from safetensors.torch import save_file
    m = load(base_folder, torch.float32)
    cfg = m.config
    r = kw["r"]
    g = torch.Generator().manual_seed(seed)
    H, I = cfg.hidden_size, cfg.moe_intermediate_size
    tensors = {}
    n_experts = getattr(cfg, "num_experts", None) or cfg.num_local_experts
    for L in range(cfg.num_hidden_layers):
        for e in range(n_experts):
            for proj, (fin, fout) in (("gate_proj", (H, I)), ("up_proj", (H, I)), ("down_proj", (I, H))):
                base = f"base_model.model.model.layers.{L}.mlp.experts.{e}.{proj}"
                tensors[base + ".lora_A.weight"] = (torch.randn((r, fin), generator=g, dtype=torch.float64) / math.sqrt(fin)).float()
                tensors[base + ".lora_B.weight"] = (torch.randn((fout, r), generator=g, dtype=torch.float64) * 0.2 / math.sqrt(r)).float()
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    save_file(tensors, os.path.join(out, "adapter_model.safetensors"), metadata={"format": "pt"})
    doc = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": kw["lora_alpha"],
           "use_rslora": kw.get("use_rslora", False), "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
           "target_modules": ["gate_proj", "up_proj", "down_proj"], "target_parameters": None,
           "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {},
           "modules_to_save": None, "use_dora": False, "lora_bias": False, "base_model_name_or_path": base_folder,
           "peft_version": peft.__version__, "inference_mode": True}
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


def describe_adapter(d):
    from safetensors.torch import load_file
    with open(os.path.join(d, "adapter_config.json")) as f:
        cfg = json.load(f)
    print(f"adapter {d}: target_modules {cfg.get('target_modules')} target_parameters {cfg.get('target_parameters')}"
          f" r {cfg.get('r')} alpha {cfg.get('lora_alpha')}", flush=True)
    t = load_file(os.path.join(d, "adapter_model.safetensors"))
    for k in sorted(t):
        if ".layers.0." in k and ".experts." in k and (".experts.0." in k or ".experts.1." not in k):
            print("  ", k, tuple(t[k].shape), flush=True)


def moe_merged_logits(base_folder, adapter_dirs, prompts):
    """float64 forward with every adapter merged: PEFT's merge for PEFT-made
    folders, the experts' fused rows by hand for the per-expert folder."""
    m = load(base_folder, torch.float64)
    for d in adapter_dirs:
        with open(os.path.join(d, "adapter_config.json")) as f:
            cfg = json.load(f)
        if cfg.get("target_parameters"):
            pm = PeftModel.from_pretrained(m, d)
            pm = pm.double()
            m = pm.merge_and_unload()
            continue
        from safetensors.torch import load_file
        t = load_file(os.path.join(d, "adapter_model.safetensors"))
        r = cfg["r"]
        scale = cfg["lora_alpha"] / math.sqrt(r) if cfg.get("use_rslora") else cfg["lora_alpha"] / r
        I = m.config.moe_intermediate_size
        with torch.no_grad():
            for k, a in t.items():
                if ".lora_A." not in k:
                    continue
                b = t[k.replace(".lora_A.", ".lora_B.")]
                delta = scale * (b.double() @ a.double())
                parts = k.split(".")
                L, e, proj = int(parts[4]), int(parts[7]), parts[8]
                ex = m.model.layers[L].mlp.experts
                if proj == "gate_proj":
                    ex.gate_up_proj[e, :I, :] += delta
                elif proj == "up_proj":
                    ex.gate_up_proj[e, I:, :] += delta
                else:
                    ex.down_proj[e] += delta
    m.eval()
    with torch.no_grad():
        rows = [m(torch.tensor([p])).logits[0].numpy() for p in prompts]
    return np.concatenate(rows, axis=0)


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


def main_moe(out, bases, only):
    for seed, (base, adapters) in enumerate(MOE_ADAPTERS.items()):
        if only and base not in only:
            continue
        base_folder = os.path.join(bases, base)
        with open(os.path.join(base_folder, "golden.json")) as f:
            prompts = json.load(f)["prompts"]
        folder = os.path.join(out, base)
        os.makedirs(folder, exist_ok=True)
        m = load(base_folder, torch.float32)
        ex = m.model.layers[0].mlp.experts
        print(f"{base}: experts class {type(ex).__name__} gate_up_proj {tuple(ex.gate_up_proj.shape)}"
              f" down_proj {tuple(ex.down_proj.shape)}", flush=True)
        made = set()
        for i, (name, kw) in enumerate(adapters.items()):
            d = os.path.join(folder, name)
            kw = dict(kw)
            try:
                if kw.pop("per_expert", False):
                    make_per_expert_adapter(base_folder, d, kw, 2000 + 10 * seed + i)
                else:
                    make_adapter(base_folder, d, kw, 2000 + 10 * seed + i)
            except Exception:
                traceback.print_exc()
                continue
            made.add(name)
            describe_adapter(d)
        base_ref = moe_merged_logits(base_folder, [], prompts)
        doc = {"base": base, "peft_version": peft.__version__, "transformers_version": transformers.__version__,
               "torch_version": torch.__version__,
               "reference": "float64 forward of the base with each adapter merged: PEFT's merge_and_unload for "
                            "target_parameters adapters, each expert's scale * B @ A into the fused expert weights "
                            "for per-expert adapters",
               "prompts": prompts, "logits_rows": [len(p) for p in prompts], "cases": []}
        for case in MOE_CASES:
            if not made.issuperset(case):
                continue
            dirs = [os.path.join(folder, a) for a in case]
            ref = moe_merged_logits(base_folder, dirs, prompts)
            fname = "logits_" + "+".join(case) + ".bin"
            ref.astype("<f4").tofile(os.path.join(folder, fname))
            c = {"adapters": case, "logits_file": fname, "max_abs_logit": float(np.abs(ref).max()),
                 "max_abs_change_from_base": float(np.abs(ref - base_ref).max())}
            if case == ["experts"]:
                c["peft_f32_vs_reference"] = float(np.abs(peft_logits(base_folder, dirs[0], prompts) - ref).max())
            doc["cases"].append(c)
            print(f"{base} {'+'.join(case)}: max|logit| {c['max_abs_logit']:.3f} change {c['max_abs_change_from_base']:.3f}"
                  f" peft diff {c.get('peft_f32_vs_reference', float('nan')):.3g}", flush=True)
        with open(os.path.join(folder, "golden.json"), "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/lora"
    bases = sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/golden"
    only = sys.argv[3].split(",") if len(sys.argv) > 3 else None
    os.makedirs(out, exist_ok=True)
    main_moe(out, bases, only)
    for seed, (base, adapters) in enumerate(ADAPTERS.items()):
        if only and base not in only:
            continue
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
