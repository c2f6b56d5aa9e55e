#!/usr/bin/env python3
"""gen_random_model.py — a model folder with random weights in a real
model's geometry, for speed measurements (nothing it says is meaningful).

  python3 tools/gen_random_model.py OUT [--shape llama-3.1-8b] [--dtype bf16] [--seed 0]

Writes OUT/config.json and OUT/model-0000N-of-0000M.safetensors (one shard
per 4 layers) plus model.safetensors.index.json. Weights are N(0, 0.02),
norms 1. Uses torch and safetensors (on the GPU machine); generates on the
GPU when one is visible, which makes the 16 GB of an 8B model take seconds.
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file

SHAPES = {
    "llama-3.1-8b": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0, hidden_act="silu",
        tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192)),
    "llama-tiny": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=256, intermediate_size=512,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=1024,
        max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu",
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shape", default="llama-3.1-8b", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cfg = dict(SHAPES[a.shape])
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    cfg["torch_dtype"] = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[a.dtype]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(a.seed)
    D, I, H, KV, hd, V = (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"],
                          cfg["num_key_value_heads"], cfg["head_dim"], cfg["vocab_size"])

    def rnd(*shape):
        return (torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * 0.02).to(dt).cpu()

    def ones(n):
        return torch.ones(n, dtype=dt)

    L = cfg["num_hidden_layers"]
    groups = [list(range(i, min(i + 4, L))) for i in range(0, L, 4)]
    n_shards = len(groups) + 1
    index = {}
    for si, layers in enumerate(groups + [None]):
        t = {}
        if layers is None:
            t["model.embed_tokens.weight"] = rnd(V, D)
            t["model.norm.weight"] = ones(D)
            if not cfg["tie_word_embeddings"]:
                t["lm_head.weight"] = rnd(V, D)
        else:
            for l in layers:
                p = f"model.layers.{l}."
                t[p + "input_layernorm.weight"] = ones(D)
                t[p + "post_attention_layernorm.weight"] = ones(D)
                t[p + "self_attn.q_proj.weight"] = rnd(H * hd, D)
                t[p + "self_attn.k_proj.weight"] = rnd(KV * hd, D)
                t[p + "self_attn.v_proj.weight"] = rnd(KV * hd, D)
                t[p + "self_attn.o_proj.weight"] = rnd(D, H * hd)
                t[p + "mlp.gate_proj.weight"] = rnd(I, D)
                t[p + "mlp.up_proj.weight"] = rnd(I, D)
                t[p + "mlp.down_proj.weight"] = rnd(D, I)
        name = f"model-{si + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file(t, os.path.join(a.out, name), metadata={"format": "pt"})
        for k in t:
            index[k] = name
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": index}, f, indent=1)
    print(f"{a.out}: {a.shape} {a.dtype}, {n_shards} shards")


if __name__ == "__main__":
    main()
