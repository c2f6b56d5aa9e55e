#!/usr/bin/env python3
"""The peer of bench/cpu/train.sh: LoRA training of the same model folder in
plain torch on the CPU, LoRA as PEFT defines it (y = x Wᵀ + alpha / r ·
(x Aᵀ) Bᵀ on every linear projection, A kaiming-uniform, B zeros, the base
frozen), a llama forward written out as in tools/gen_train_torch_ref.py,
autograd, torch.optim.AdamW, the gradient clipped to 1. PEFT itself and
transformers are not installed where this runs (Debian 12 packages neither);
torch is (python3-torch).

The weights are read from the folder's safetensors (bf16 or f32) and kept
as float32: torch's bf16 matmuls on the CPU are slower than its f32 ones.
Each step is one sequence of SEQ random token ids (speed does not depend on
the values), the loss over every position. Prints one JSON line: tokens/s
per step (wall clock) and tokens per CPU-second (time.process_time, every
thread's time).

  /usr/bin/python3 bench/cpu/train_torch_peer.py MODEL_DIR [--steps 4] [--seq 256] [--rank 16] [--threads 2]
"""
import argparse
import json
import math
import os
import struct
import time

import numpy as np
import torch

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def read_weights(folder):
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    out = {}
    for name in files:
        with open(os.path.join(folder, name), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            data = f.read()
        for k, v in header.items():
            if k == "__metadata__":
                continue
            a, b = v["data_offsets"]
            if v["dtype"] == "BF16":
                u = np.frombuffer(data[a:b], dtype=np.uint16).astype(np.uint32) << 16
                arr = u.view(np.float32)
            else:
                arr = np.frombuffer(data[a:b], dtype={"F32": np.float32, "F16": np.float16}[v["dtype"]]).astype(np.float32)
            out[k] = torch.from_numpy(arr.reshape(v["shape"]).copy())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    with open(os.path.join(a.model, "config.json")) as f:
        c = json.load(f)
    w = read_weights(a.model)
    D, H, KV, L = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["num_hidden_layers"]
    hd = c.get("head_dim") or D // H
    eps, theta, V = c["rms_norm_eps"], c.get("rope_theta", 10000.0), c["vocab_size"]
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    scale = 2.0 * a.rank / a.rank  # alpha = 2 r, as train.sh
    lora, params = {}, []
    for l in range(L):
        for t in TARGETS:
            W = w[f"model.layers.{l}.{'self_attn' if t in TARGETS[:4] else 'mlp'}.{t}.weight"]
            A = torch.empty(a.rank, W.shape[1])
            torch.nn.init.kaiming_uniform_(A, a=math.sqrt(5))
            A.requires_grad_()
            B = torch.zeros(W.shape[0], a.rank, requires_grad=True)
            lora[(l, t)] = (W, A, B)
            params += [A, B]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))

    def lin(x, l, t):
        W, A, B = lora[(l, t)]
        return x @ W.T + scale * (x @ A.T) @ B.T

    def norm(x, g):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * g

    def loss_of(ids):
        T = len(ids)
        ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
        cos, sin = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :], torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]

        def rope(x):
            x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
            return x * cos + torch.cat([-x2, x1], -1) * sin

        x = w["model.embed_tokens.weight"][ids]
        for l in range(L):
            p = f"model.layers.{l}."
            h = norm(x, w[p + "input_layernorm.weight"])
            q = rope(lin(h, l, "q_proj").view(T, H, hd)).transpose(0, 1)
            k = rope(lin(h, l, "k_proj").view(T, KV, hd)).repeat_interleave(H // KV, dim=1).transpose(0, 1)
            v = lin(h, l, "v_proj").view(T, KV, hd).repeat_interleave(H // KV, dim=1).transpose(0, 1)
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) if hasattr(
                torch.nn.functional, "scaled_dot_product_attention") else torch.softmax(
                (q @ k.transpose(1, 2)) / math.sqrt(hd) + torch.full((T, T), float("-inf")).triu(1), -1) @ v
            x = x + lin(o.transpose(0, 1).reshape(T, H * hd), l, "o_proj")
            h = norm(x, w[p + "post_attention_layernorm.weight"])
            x = x + lin(torch.nn.functional.silu(lin(h, l, "gate_proj")) * lin(h, l, "up_proj"), l, "down_proj")
        logits = norm(x, w["model.norm.weight"]) @ head.T
        return torch.nn.functional.cross_entropy(logits[:-1], ids[1:])

    opt = torch.optim.AdamW(params, lr=2e-4)
    g = torch.Generator().manual_seed(1)
    rows = []
    for step in range(a.steps):
        ids = torch.randint(0, min(V, 4096), (a.seq,), generator=g)
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad()
        loss = loss_of(ids)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        rows.append({"step": step + 1, "loss": float(loss), "tokens_per_s": a.seq / dt, "tokens_per_cpu_s": a.seq / dc})
        print(json.dumps(rows[-1]), flush=True)
    med = lambda k: sorted(r[k] for r in rows)[len(rows) // 2]
    print(json.dumps({"peer": f"torch {torch.__version__} f32, LoRA as PEFT", "threads": a.threads, "seq": a.seq, "rank": a.rank,
                      "tokens_per_s": med("tokens_per_s"), "tokens_per_cpu_s": med("tokens_per_cpu_s")}))


if __name__ == "__main__":
    main()
