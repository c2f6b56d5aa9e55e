#!/usr/bin/env python3
"""gen_random_model.py — a model folder with random weights in a real
model's geometry, for speed measurements (nothing it says is meaningful).

  python3 tools/gen_random_model.py OUT [--shape llama-3.1-8b] [--dtype bf16|f16|f32|fp8] [--seed 0]

Writes OUT/config.json and OUT/model-0000N-of-0000M.safetensors (one shard
per 4 layers) plus model.safetensors.index.json. Weights are N(0, 0.02),
norms 1. Uses torch and safetensors (on the GPU machine); generates on the
GPU when one is visible, which makes the 16 GB of an 8B model take seconds.
Without torch (bf16 or f32 only), plain Python writes the files: the weights
repeat one block of 65,536 random values, which is all a speed run needs.
--sparse writes only the headers and leaves the tensors as file holes (all
zero; bf16 or f32, without torch): instant, for speed runs where the values
do not matter (a GPU's matmuls) and for `hearth fit`, which reads no weights.
--dtype fp8 (torch only) writes every matrix but the embedding as FP8 E4M3
with one f32 scale per row beside it (NAME_scale [rows, 1], as `hearth
convert --quant fp8` does), the rest bf16.
"""
import argparse
import json
import os
import random
import struct

try:
    import torch
    from safetensors.torch import save_file
except ImportError:
    torch = None


class Raw:
    """A tensor as little-endian bytes (the plain-Python path); data None: nbytes of zeros, left as a hole."""

    def __init__(self, data, shape, dtype, nbytes=None):
        self.data, self.shape, self.dtype = data, shape, dtype
        self.nbytes = len(data) if data is not None else nbytes


def save_raw(tensors, path):
    header, off = {}, 0
    for k, v in tensors.items():
        header[k] = {"dtype": v.dtype, "shape": list(v.shape), "data_offsets": [off, off + v.nbytes]}
        off += v.nbytes
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        if all(v.data is None for v in tensors.values()):
            f.truncate(8 + len(h) + off)
            return
        for v in tensors.values():
            f.write(v.data)


def sparse_maker(dtype):
    """rnd / ones / zeros of --sparse: every tensor zero, as a hole in the file."""
    es, name = (4, "F32") if dtype == "f32" else (2, "BF16")

    def make(*shape):
        n = es
        for d in shape:
            n *= d
        return Raw(None, shape, name, n)

    return make, make, make


def raw_maker(dtype, seed):
    """rnd / ones / zeros of the plain-Python path."""
    rng = random.Random(seed)
    vals = [rng.gauss(0.0, 0.02) for _ in range(65536)]
    f32 = struct.pack("<65536f", *vals)
    block = f32 if dtype == "f32" else b"".join(f32[i + 2:i + 4] for i in range(0, len(f32), 4))
    es, name = (4, "F32") if dtype == "f32" else (2, "BF16")
    one = struct.pack("<f", 1.0)
    one = one if dtype == "f32" else one[2:4]

    def count(shape):
        n = 1
        for d in shape:
            n *= d
        return n

    def rnd(*shape):
        n = count(shape) * es
        return Raw((block * (n // len(block) + 1))[:n], shape, name)

    def ones(n):
        return Raw(one * n, (n,), name)

    def zeros(n):
        return Raw(bytes(n * es), (n,), name)

    return rnd, ones, zeros

SHAPES = {
    "llama-3.1-8b": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0, hidden_act="silu",
        tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192)),
    # a Qwen3.5-shaped hybrid (3 of 4 layers Gated DeltaNet) and a dense peer of
    # the same width, depth and MLP (every layer full attention, 8 KV heads)
    "qwen3.5-2b": dict(
        architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=2048, intermediate_size=6144,
        num_hidden_layers=24, num_attention_heads=8, num_key_value_heads=2, head_dim=256, vocab_size=151936,
        max_position_embeddings=65536, rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False,
        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
        linear_num_value_heads=16, full_attention_interval=4,
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25),
        bos_token_id=1, eos_token_id=2),
    "dense-2b": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=2048, intermediate_size=6144,
        num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
        max_position_embeddings=65536, rms_norm_eps=1e-6, rope_theta=1000000.0, hidden_act="silu",
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    # the same pair scaled down for CPU runs
    "qwen3.5-tiny": dict(
        architectures=["Qwen3_5ForCausalLM"], model_type="qwen3_5_text", hidden_size=512, intermediate_size=1536,
        num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, head_dim=128, vocab_size=32000,
        max_position_embeddings=65536, rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False,
        linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=4,
        linear_num_value_heads=8, full_attention_interval=4,
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25),
        bos_token_id=1, eos_token_id=2),
    "dense-tiny": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=512, intermediate_size=1536,
        num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=64, vocab_size=32000,
        max_position_embeddings=65536, rms_norm_eps=1e-6, rope_theta=1000000.0, hidden_act="silu",
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
    "smollm2-360m": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=960, intermediate_size=2560,
        num_hidden_layers=32, num_attention_heads=15, num_key_value_heads=5, head_dim=64, vocab_size=49152,
        max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0, hidden_act="silu",
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2),
    # Qwen2.5-0.5B's geometry as a llama (no q/k/v biases): the CPU training benchmark's model
    "llama-0.5b": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=896, intermediate_size=4864,
        num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, head_dim=64, vocab_size=151936,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0, hidden_act="silu",
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2),
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
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32", "fp8"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sparse", action="store_true", help="zero tensors as file holes (bf16 / f32, no torch)")
    a = ap.parse_args()
    use_torch = torch is not None and not a.sparse
    cfg = dict(SHAPES[a.shape])
    if not use_torch and a.dtype in ("f16", "fp8"):
        raise SystemExit(f"gen_random_model: {a.dtype} needs torch")
    fp8 = a.dtype == "fp8"
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32, "fp8": torch.bfloat16}[a.dtype] if use_torch else None
    cfg["torch_dtype"] = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "fp8": "bfloat16"}[a.dtype]
    if fp8:
        cfg["quantization_config"] = dict(quant_method="fbgemm_fp8", activation_scale_ub=1200.0,
                                          modules_to_not_convert=["model.embed_tokens"])
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    D, I, H, KV, hd, V = (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"],
                          cfg["num_key_value_heads"], cfg["head_dim"], cfg["vocab_size"])

    if use_torch:
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        g = torch.Generator(device=dev).manual_seed(a.seed)

        def rnd(*shape):
            return (torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * 0.02).to(dt).cpu()

        def ones(n):
            return torch.ones(n, dtype=dt)

        def zeros(n):
            return torch.zeros(n, dtype=dt)
    else:
        rnd, ones, zeros = sparse_maker(a.dtype) if a.sparse else raw_maker(a.dtype, a.seed)

    hybrid = cfg["model_type"] == "qwen3_5_text"

    L = cfg["num_hidden_layers"]
    groups = [list(range(i, min(i + 4, L))) for i in range(0, L, 4)]
    n_shards = len(groups) + 1
    index = {}
    for si, layers in enumerate(groups + [None]):
        t = {}
        if layers is None:
            t["model.embed_tokens.weight"] = rnd(V, D)
            t["model.norm.weight"] = zeros(D) if hybrid else ones(D)
            if not cfg["tie_word_embeddings"]:
                t["lm_head.weight"] = rnd(V, D)
        else:
            for l in layers:
                p = f"model.layers.{l}."
                t[p + "input_layernorm.weight"] = ones(D)
                t[p + "post_attention_layernorm.weight"] = ones(D)
                t[p + "mlp.gate_proj.weight"] = rnd(I, D)
                t[p + "mlp.up_proj.weight"] = rnd(I, D)
                t[p + "mlp.down_proj.weight"] = rnd(D, I)
                if hybrid:
                    # Qwen3.5: norms scale by (1 + w), so zeros; the gated norm by w
                    t[p + "input_layernorm.weight"] = zeros(D)
                    t[p + "post_attention_layernorm.weight"] = zeros(D)
                    if (l + 1) % cfg["full_attention_interval"]:
                        nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
                        dk, dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
                        la = p + "linear_attn."
                        t[la + "in_proj_qkv.weight"] = rnd(2 * nk * dk + nv * dv, D)
                        t[la + "in_proj_z.weight"] = rnd(nv * dv, D)
                        t[la + "in_proj_a.weight"] = rnd(nv, D)
                        t[la + "in_proj_b.weight"] = rnd(nv, D)
                        t[la + "conv1d.weight"] = rnd(2 * nk * dk + nv * dv, 1, K)
                        t[la + "A_log"] = zeros(nv)
                        t[la + "dt_bias"] = ones(nv)
                        t[la + "norm.weight"] = ones(dv)
                        t[la + "out_proj.weight"] = rnd(D, nv * dv)
                        continue
                    t[p + "self_attn.q_proj.weight"] = rnd(2 * H * hd, D)
                    t[p + "self_attn.k_proj.weight"] = rnd(KV * hd, D)
                    t[p + "self_attn.v_proj.weight"] = rnd(KV * hd, D)
                    t[p + "self_attn.o_proj.weight"] = rnd(D, H * hd)
                    t[p + "self_attn.q_norm.weight"] = zeros(hd)
                    t[p + "self_attn.k_norm.weight"] = zeros(hd)
                    continue
                t[p + "self_attn.q_proj.weight"] = rnd(H * hd, D)
                t[p + "self_attn.k_proj.weight"] = rnd(KV * hd, D)
                t[p + "self_attn.v_proj.weight"] = rnd(KV * hd, D)
                t[p + "self_attn.o_proj.weight"] = rnd(D, H * hd)
        if fp8:  # matrices but the embedding: E4M3 with a scale per row
            for k in [k for k in t if t[k].dim() == 2 and "embed_tokens" not in k]:
                x = t[k].to(dev).float()
                sc = x.abs().amax(dim=1, keepdim=True) / 448.0
                t[k] = (x / torch.where(sc > 0, sc, torch.ones_like(sc))).to(torch.float8_e4m3fn).cpu()
                t[k + "_scale"] = sc.cpu()
        name = f"model-{si + 1:05d}-of-{n_shards:05d}.safetensors"
        if use_torch:
            save_file(t, os.path.join(a.out, name), metadata={"format": "pt"})
        else:
            save_raw(t, os.path.join(a.out, name))
        for k in t:
            index[k] = name
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": index}, f, indent=1)
    print(f"{a.out}: {a.shape} {a.dtype}{' (sparse: zeros)' if a.sparse else ''}, {n_shards} shards")


if __name__ == "__main__":
    main()
