#!/usr/bin/env python3
"""Writes the seeds of the fuzz_gguf_model target (tests/fuzz/seeds/gguf_model/):
tiny llama GGUF files (hidden 32, 1 block, vocab 16) with F32, F16, Q8_0 and
Q4_0 tensors, so the fuzzer starts from files model loading accepts.

Usage: python3 tools/gen_gguf_model_seeds.py [OUT_DIR]   (no dependencies)
"""
import os
import random
import struct
import sys

HIDDEN, FFN, HEADS, KV, VOCAB = 32, 64, 4, 2, 16


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, typ, val):
    out = gguf_str(key) + struct.pack("<I", typ)
    if typ == 4:
        out += struct.pack("<I", val)
    elif typ == 6:
        out += struct.pack("<f", val)
    elif typ == 8:
        out += gguf_str(val)
    return out


def half(x):
    return struct.pack("<e", x)


def tensor_bytes(typ, n, rng):
    vals = [rng.uniform(-1, 1) for _ in range(n)]
    if typ == 0:
        return b"".join(struct.pack("<f", v) for v in vals)
    if typ == 1:
        return b"".join(half(v) for v in vals)
    out = b""
    for b in range(n // 32):
        blk = vals[b * 32:(b + 1) * 32]
        amax = max(abs(v) for v in blk) or 1.0
        if typ == 8:  # Q8_0
            d = amax / 127
            out += half(d) + bytes((round(v / d) & 0xFF) for v in blk)
        else:  # Q4_0
            d = amax / 8
            q = [min(15, max(0, round(v / d) + 8)) for v in blk]
            out += half(d) + bytes(q[i] | (q[i + 16] << 4) for i in range(16))
    return out


def write(path, wtype, tied):
    rng = random.Random(7)
    hd = HIDDEN // HEADS
    tensors = [("token_embd.weight", (HIDDEN, VOCAB), wtype), ("output_norm.weight", (HIDDEN,), 0)]
    if not tied:
        tensors.append(("output.weight", (HIDDEN, VOCAB), wtype))
    tensors += [
        ("blk.0.attn_norm.weight", (HIDDEN,), 0), ("blk.0.ffn_norm.weight", (HIDDEN,), 0),
        ("blk.0.attn_q.weight", (HIDDEN, HEADS * hd), wtype), ("blk.0.attn_k.weight", (HIDDEN, KV * hd), wtype),
        ("blk.0.attn_v.weight", (HIDDEN, KV * hd), wtype), ("blk.0.attn_output.weight", (HEADS * hd, HIDDEN), wtype),
        ("blk.0.ffn_gate.weight", (HIDDEN, FFN), wtype), ("blk.0.ffn_up.weight", (HIDDEN, FFN), wtype),
        ("blk.0.ffn_down.weight", (FFN, HIDDEN), wtype),
    ]
    kvs = [kv("general.architecture", 8, "llama"), kv("llama.context_length", 4, 64),
           kv("llama.embedding_length", 4, HIDDEN), kv("llama.block_count", 4, 1),
           kv("llama.feed_forward_length", 4, FFN), kv("llama.attention.head_count", 4, HEADS),
           kv("llama.attention.head_count_kv", 4, KV), kv("llama.rope.dimension_count", 4, hd),
           kv("llama.attention.layer_norm_rms_epsilon", 6, 1e-5), kv("llama.rope.freq_base", 6, 10000.0)]
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    data, infos = b"", b""
    for name, dims, typ in tensors:
        n = 1
        for d in dims:
            n *= d
        infos += gguf_str(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", typ, len(data))
        data += tensor_bytes(typ, n, rng)
        data += b"\0" * (-len(data) % 32)
    blob = head + infos
    blob += b"\0" * (-len(blob) % 32)
    with open(path, "wb") as f:
        f.write(blob + data)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/seeds/gguf_model"
    os.makedirs(out, exist_ok=True)
    write(os.path.join(out, "llama_f32_tied.gguf"), 0, True)
    write(os.path.join(out, "llama_f16.gguf"), 1, False)
    write(os.path.join(out, "llama_q8_0.gguf"), 8, False)
    write(os.path.join(out, "llama_q4_0.gguf"), 2, True)


if __name__ == "__main__":
    main()
