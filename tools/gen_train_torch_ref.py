#!/usr/bin/env python3
"""Generates a reference for hearth's LoRA trainer with torch's autograd alone.

Where PEFT and transformers cannot be installed (tools/gen_train_ref.py needs
them), this writes the same kind of reference from a llama forward written
out here in float64 torch, with LoRA as PEFT defines it (y = x Wᵀ +
alpha / r · (x Aᵀ) Bᵀ on each chosen projection, dropout 0):

Base: the committed tiny golden model tests/fixtures/golden/llama-f32 (its
safetensors read here without transformers). The forward is checked first
against the golden float64 logits that transformers computed for its
prompts (tests/fixtures/golden/llama-f32/logits_f32.bin): the script stops
if they differ by more than 1e-5, so the forward is transformers' llama.

An adapter (r=4, lora_alpha=8, every linear projection), lora_A and lora_B
both seeded random values rounded to float32. One batch: the golden
prompts, the loss on their second halves (the summed token losses over
their count). Recorded: the loss, every LoRA parameter's gradient
(float64), and the adapter after 3 steps of torch.optim.AdamW (lr 1e-3,
betas 0.9 / 0.999, eps 1e-8, weight decay 0.5: large enough for its share of the step to show), the gradient's global norm
clipped to 1 (torch.nn.utils.clip_grad_norm_), the learning rate of step k
peak · 0.5 · (1 + cos(pi k / 3)) (transformers' cosine schedule without
warm-up).

OUT/llama-f32-torch/:
  adapter_init/          adapter_config.json + adapter_model.safetensors (F32)
  grads.safetensors      F64 gradients under the adapter's tensor names
  adapter_step3/         adapter_model.safetensors (F32, rounded from the float64 run)
  golden.json            versions, the batch (ids, learned flags), the loss, the optimizer's settings, the grad norms

The preference losses, from the same adapter_init, on two pairs cut from the
golden prompts (a prompt, a chosen and a rejected completion; the learned
flags on the completions): the reference model is the base alone (no
adapter). DPO as TRL's DPOTrainer's default (sigmoid loss, beta 0.1, summed
log-probs, the mean over the pairs); ORPO as TRL's ORPOTrainer (the chosen
sides' NLL over their learned tokens minus beta 0.1 times the mean of
log σ(log-odds ratio) over the pairs, the log-odds of mean per-token
log-probs).

OUT/llama-f32-torch-pref/:
  adapter_init/            the same adapter as above
  grads_dpo.safetensors    F64 gradients of the DPO loss
  grads_orpo.safetensors   F64 gradients of the ORPO loss
  golden.json              the pairs (ids, learned flags), beta, the reference's and the policy's summed log-probs,
                           the two losses

Usage: python3 tools/gen_train_torch_ref.py OUT [BASES_DIR]
       (BASES_DIR: tests/fixtures/golden; needs torch and numpy — Debian's python3-torch; run it
       with /usr/bin/python3 where another python3, without Debian's packages, comes first on PATH)
"""
import json
import math
import os
import shutil
import struct
import sys

import numpy as np
import torch

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
R, ALPHA = 4, 8.0
LR, BETAS, EPS, WD, CLIP, STEPS = 1e-3, (0.9, 0.999), 1e-8, 0.5, 1.0, 3


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        dt = {"F32": np.float32, "F64": np.float64}[v["dtype"]]
        a, b = v["data_offsets"]
        out[k] = torch.from_numpy(np.frombuffer(data[a:b], dtype=dt).reshape(v["shape"]).astype(np.float64))
    return out


def write_safetensors(path, tensors, dtype):
    header, blobs, off = {}, [], 0
    for k in sorted(tensors):
        arr = tensors[k].detach().numpy().astype(np.float32 if dtype == "F32" else np.float64)
        b = arr.tobytes()
        header[k] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def module_name(l, t):
    return f"base_model.model.model.layers.{l}.{'self_attn' if t in TARGETS[:4] else 'mlp'}.{t}"


class Llama:
    def __init__(self, folder):
        with open(os.path.join(folder, "config.json")) as f:
            c = json.load(f)
        assert c["model_type"] == "llama" and c.get("rope_parameters", {}).get("rope_type", "default") == "default"
        self.c = c
        self.w = read_safetensors(os.path.join(folder, "model.safetensors"))
        self.H, self.KV = c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c.get("head_dim") or c["hidden_size"] // self.H
        self.eps = c["rms_norm_eps"]
        self.theta = c["rope_parameters"]["rope_theta"]
        self.L = c["num_hidden_layers"]
        self.lora = {}  # module name -> (A, B)
        self.scale = ALPHA / R

    def norm(self, x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * w

    def rope(self, x):  # x [T, heads, hd], rotate-half
        T, hd = x.shape[0], self.hd
        inv = 1.0 / (self.theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        cos, sin = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :], torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def lin(self, x, l, t, block):
        y = x @ self.w[f"model.layers.{l}.{block}.{t}.weight"].T
        if module_name(l, t) in self.lora:
            a, b = self.lora[module_name(l, t)]
            y = y + self.scale * (x @ a.T) @ b.T
        return y

    def logits(self, ids):
        T, H, KV, hd = len(ids), self.H, self.KV, self.hd
        x = self.w["model.embed_tokens.weight"][torch.tensor(ids)]
        mask = torch.full((T, T), float("-inf")).triu(1)
        for l in range(self.L):
            p = f"model.layers.{l}."
            h = self.norm(x, self.w[p + "input_layernorm.weight"])
            q = self.rope(self.lin(h, l, "q_proj", "self_attn").view(T, H, hd))
            k = self.rope(self.lin(h, l, "k_proj", "self_attn").view(T, KV, hd)).repeat_interleave(H // KV, dim=1)
            v = self.lin(h, l, "v_proj", "self_attn").view(T, KV, hd).repeat_interleave(H // KV, dim=1)
            s = torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd) + mask
            o = torch.einsum("hts,shd->thd", torch.softmax(s, -1), v).reshape(T, H * hd)
            x = x + self.lin(o, l, "o_proj", "self_attn")
            h = self.norm(x, self.w[p + "post_attention_layernorm.weight"])
            g = self.lin(h, l, "gate_proj", "mlp")
            x = x + self.lin(torch.nn.functional.silu(g) * self.lin(h, l, "up_proj", "mlp"), l, "down_proj", "mlp")
        x = self.norm(x, self.w["model.norm.weight"])
        head = self.w["lm_head.weight"] if "lm_head.weight" in self.w else self.w["model.embed_tokens.weight"]
        return x @ head.T


def main():
    torch.set_default_dtype(torch.float64)
    out = sys.argv[1]
    bases = sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/golden"
    folder = os.path.join(bases, "llama-f32")
    with open(os.path.join(folder, "golden.json")) as f:
        gold = json.load(f)
    m = Llama(folder)
    V = m.c["vocab_size"]
    ref = np.fromfile(os.path.join(folder, gold["logits_file"]), dtype=np.float32)
    at, worst = 0, 0.0
    for ids in gold["prompts"]:
        with torch.no_grad():
            got = m.logits(ids).numpy().ravel()
        worst = max(worst, float(np.abs(got - ref[at : at + got.size]).max()))
        at += got.size
    print(f"forward vs transformers' golden logits: {worst:.3g}")
    if worst > 1e-5:
        sys.exit("the forward written here is not transformers' llama")

    dst = os.path.join(out, "llama-f32-torch")
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(os.path.join(dst, "adapter_init"))
    os.makedirs(os.path.join(dst, "adapter_step3"))
    D, I = m.c["hidden_size"], m.c["intermediate_size"]
    dims = {"q_proj": (D, m.H * m.hd), "k_proj": (D, m.KV * m.hd), "v_proj": (D, m.KV * m.hd), "o_proj": (m.H * m.hd, D),
            "gate_proj": (D, I), "up_proj": (D, I), "down_proj": (I, D)}
    g = torch.Generator().manual_seed(36)
    params = []
    for l in range(m.L):
        for t in TARGETS:
            fin, fout = dims[t]
            a = (torch.randn((R, fin), generator=g) / math.sqrt(fin)).float().double().requires_grad_()
            b = (torch.randn((fout, R), generator=g) * 0.2 / math.sqrt(fin)).float().double().requires_grad_()
            m.lora[module_name(l, t)] = (a, b)
            params += [a, b]

    def tensors(fn):
        res = {}
        for name, (a, b) in m.lora.items():
            res[name + ".lora_A.weight"], res[name + ".lora_B.weight"] = fn(a), fn(b)
        return res

    write_safetensors(os.path.join(dst, "adapter_init", "adapter_model.safetensors"), tensors(lambda p: p), "F32")
    init = {name: (a.detach().clone(), b.detach().clone()) for name, (a, b) in m.lora.items()}
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": R, "lora_alpha": ALPHA, "use_rslora": False, "lora_dropout": 0.0,
           "bias": "none", "fan_in_fan_out": False, "target_modules": TARGETS, "layers_to_transform": None,
           "rank_pattern": {}, "alpha_pattern": {}, "modules_to_save": None, "use_dora": False, "inference_mode": True}
    with open(os.path.join(dst, "adapter_init", "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    seqs = gold["prompts"][:2]
    flags = [[0] * (len(s) // 2) + [1] * (len(s) - len(s) // 2) for s in seqs]

    def batch_loss():
        total, count = 0.0, 0
        for ids, fl in zip(seqs, flags):
            logp = torch.log_softmax(m.logits(ids)[:-1], -1)
            tgt = torch.tensor(ids[1:])
            mask = torch.tensor(fl[1:], dtype=torch.bool)
            total = total - logp[torch.arange(len(ids) - 1), tgt][mask].sum()
            count += int(mask.sum())
        return total / count

    loss = batch_loss()
    loss.backward()
    write_safetensors(os.path.join(dst, "grads.safetensors"), tensors(lambda p: p.grad), "F64")
    loss0 = float(loss)
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    norms = []
    for k in range(STEPS):
        opt.zero_grad()
        batch_loss().backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, CLIP)))
        for group in opt.param_groups:
            group["lr"] = LR * 0.5 * (1 + math.cos(math.pi * k / STEPS))
        opt.step()
    write_safetensors(os.path.join(dst, "adapter_step3", "adapter_model.safetensors"), tensors(lambda p: p), "F32")
    with open(os.path.join(dst, "adapter_step3", "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    doc = {"base": "llama-f32", "reference": "float64 torch autograd of the llama forward written in tools/gen_train_torch_ref.py "
           "(checked against transformers' golden logits), LoRA as PEFT defines it", "torch_version": torch.__version__,
           "forward_vs_golden": worst, "sequences": seqs, "learned": flags, "loss": loss0,
           "optimizer": {"lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WD, "max_grad_norm": CLIP, "steps": STEPS,
                         "schedule": "cosine, no warm-up"},
           "grad_norms": norms}
    with open(os.path.join(dst, "golden.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"loss {loss0:.9f}, grad norms {norms}; wrote {dst}")
    preference(m, init, gold, cfg, out, worst)


def preference(m, init, gold, cfg, out, worst):
    """DPO's and ORPO's losses and gradients on two pairs, from the adapter `init`."""
    dst = os.path.join(out, "llama-f32-torch-pref")
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(os.path.join(dst, "adapter_init"))
    p0, p1 = gold["prompts"][0], gold["prompts"][1]
    raw = [(p0[:10], p0[10:], p1[20:30]), (p1[:20], p1[20:], p0[10:] + p1[30:35])]
    pairs = []
    for prompt, chosen, rejected in raw:
        pairs.append({"chosen": prompt + chosen, "chosen_learned": [0] * len(prompt) + [1] * len(chosen),
                      "rejected": prompt + rejected, "rejected_learned": [0] * len(prompt) + [1] * len(rejected)})

    def logp(ids, fl):  # summed log-prob of the learned tokens, and their count
        lp = torch.log_softmax(m.logits(ids)[:-1], -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        mask = torch.tensor(fl[1:], dtype=torch.bool)
        return lp[mask].sum(), int(mask.sum())

    m.lora = {}
    with torch.no_grad():
        ref = [(float(logp(p["chosen"], p["chosen_learned"])[0]), float(logp(p["rejected"], p["rejected_learned"])[0])) for p in pairs]
    beta = 0.1
    doc = {"base": "llama-f32", "reference": "float64 torch autograd (tools/gen_train_torch_ref.py), the llama forward checked "
           "against transformers' golden logits; DPO as TRL's DPOTrainer (sigmoid), ORPO as TRL's ORPOTrainer",
           "torch_version": torch.__version__, "forward_vs_golden": worst, "beta": beta, "pairs": pairs,
           "ref_logps": ref}
    for method in ("dpo", "orpo"):
        m.lora = {name: (a.clone().requires_grad_(), b.clone().requires_grad_()) for name, (a, b) in init.items()}
        sides = [(logp(p["chosen"], p["chosen_learned"]), logp(p["rejected"], p["rejected_learned"])) for p in pairs]
        if method == "dpo":
            z = torch.stack([(c[0] - r[0]) - (rc - rr) for (c, r), (rc, rr) in zip(sides, ref)])
            loss = torch.nn.functional.softplus(-beta * z).mean()  # −log σ(β z)
        else:
            nll = -sum(c[0] for c, _ in sides) / sum(c[1] for c, _ in sides)
            ac = torch.stack([c[0] / c[1] for c, _ in sides])
            ar = torch.stack([r[0] / r[1] for _, r in sides])
            lo = (ac - ar) - (torch.log1p(-torch.exp(ac)) - torch.log1p(-torch.exp(ar)))
            loss = nll - beta * torch.nn.functional.logsigmoid(lo).mean()
        loss.backward()
        res = {}
        for name, (a, b) in m.lora.items():
            res[name + ".lora_A.weight"], res[name + ".lora_B.weight"] = a.grad, b.grad
        write_safetensors(os.path.join(dst, f"grads_{method}.safetensors"), res, "F64")
        doc[f"{method}_loss"] = float(loss)
        doc[f"{method}_policy_logps"] = [(float(c[0]), float(r[0])) for c, r in sides]
        print(f"{method} loss {float(loss):.9f}")
    tens = {}
    for name, (a, b) in init.items():
        tens[name + ".lora_A.weight"], tens[name + ".lora_B.weight"] = a, b
    write_safetensors(os.path.join(dst, "adapter_init", "adapter_model.safetensors"), tens, "F32")
    with open(os.path.join(dst, "adapter_init", "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(dst, "golden.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {dst}")


if __name__ == "__main__":
    main()
