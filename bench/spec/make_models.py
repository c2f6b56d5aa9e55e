#!/usr/bin/env python3
"""make_models.py — the models of the speculative-decoding benchmark, in pure
Python (no torch or numpy needed), from the built-in model's folder:

  python3 bench/spec/make_models.py OUT [--builtin models/default]

  OUT/builtin-2l/   the built-in model cut to its first 2 of 8 layers (same
                    embeddings, final norm and tokenizer): a small draft of a
                    trained model
  OUT/wide/         a random llama (--wide hidden,intermediate,layers; by
                    default 1024,2816,12: ~290 MB of bf16, the built-in's
                    vocabulary and tokenizer) whose decode reads more weight
                    bytes than the built-in's, as larger models do
  OUT/wide-2l/      its first 2 layers: a draft of it (random weights: what it
                    accepts says nothing about real models)
"""
import argparse
import json
import os
import shutil
import struct


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def write_st(path, tensors):
    """tensors: list of (name, dtype, shape, bytes)."""
    header, off = {}, 0
    for name, dt, shape, b in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, _, b in tensors:
            f.write(b)


def copy_side_files(src, dst):
    for fn in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(src, fn)):
            shutil.copy(os.path.join(src, fn), os.path.join(dst, fn))


def truncate(src, dst, layers):
    os.makedirs(dst, exist_ok=True)
    header, data = read_st(os.path.join(src, "model.safetensors"))
    keep = []
    for name, v in header.items():
        if name == "__metadata__":
            continue
        if name.startswith("model.layers.") and int(name.split(".")[2]) >= layers:
            continue
        a, b = v["data_offsets"]
        keep.append((name, v["dtype"], v["shape"], data[a:b]))
    write_st(os.path.join(dst, "model.safetensors"), keep)
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["num_hidden_layers"] = layers
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    copy_side_files(src, dst)


def random_bf16(n):
    """n bf16 values of magnitude about 2^-7..2^-5 with random signs."""
    lo = os.urandom(n)
    table = bytes(0x3C if i & 1 else 0xBC for i in range(256))
    hi = os.urandom(n).translate(table)
    out = bytearray(2 * n)
    out[0::2] = lo
    out[1::2] = hi
    return bytes(out)


def ones_bf16(n):
    return b"\x80\x3f" * n


def random_llama(src, dst, hidden=1024, inter=2816, layers=12, heads=16, kv_heads=4):
    os.makedirs(dst, exist_ok=True)
    cfg = json.load(open(os.path.join(src, "config.json")))
    vocab = cfg["vocab_size"]
    hd = hidden // heads
    cfg.update(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
               num_key_value_heads=kv_heads, head_dim=hd, tie_word_embeddings=False, max_position_embeddings=4096)
    t = [("model.embed_tokens.weight", "BF16", [vocab, hidden], random_bf16(vocab * hidden))]
    for l in range(layers):
        p = f"model.layers.{l}."
        t += [(p + "input_layernorm.weight", "BF16", [hidden], ones_bf16(hidden)),
              (p + "post_attention_layernorm.weight", "BF16", [hidden], ones_bf16(hidden)),
              (p + "self_attn.q_proj.weight", "BF16", [heads * hd, hidden], random_bf16(heads * hd * hidden)),
              (p + "self_attn.k_proj.weight", "BF16", [kv_heads * hd, hidden], random_bf16(kv_heads * hd * hidden)),
              (p + "self_attn.v_proj.weight", "BF16", [kv_heads * hd, hidden], random_bf16(kv_heads * hd * hidden)),
              (p + "self_attn.o_proj.weight", "BF16", [hidden, heads * hd], random_bf16(heads * hd * hidden)),
              (p + "mlp.gate_proj.weight", "BF16", [inter, hidden], random_bf16(inter * hidden)),
              (p + "mlp.up_proj.weight", "BF16", [inter, hidden], random_bf16(inter * hidden)),
              (p + "mlp.down_proj.weight", "BF16", [hidden, inter], random_bf16(inter * hidden))]
    t += [("model.norm.weight", "BF16", [hidden], ones_bf16(hidden)),
          ("lm_head.weight", "BF16", [vocab, hidden], random_bf16(vocab * hidden))]
    write_st(os.path.join(dst, "model.safetensors"), t)
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)
    copy_side_files(src, dst)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--builtin", default="models/default")
    ap.add_argument("--wide", default="1024,2816,12", help="hidden,intermediate,layers of the random model")
    a = ap.parse_args()
    hidden, inter, layers = (int(x) for x in a.wide.split(","))
    truncate(a.builtin, os.path.join(a.out, "builtin-2l"), 2)
    if not os.path.exists(os.path.join(a.out, "wide", "model.safetensors")):
        random_llama(a.builtin, os.path.join(a.out, "wide"), hidden=hidden, inter=inter, layers=layers,
                     heads=hidden // 64, kv_heads=max(1, hidden // 256))
    truncate(os.path.join(a.out, "wide"), os.path.join(a.out, "wide-2l"), 2)


if __name__ == "__main__":
    main()
