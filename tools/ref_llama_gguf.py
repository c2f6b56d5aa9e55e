#!/usr/bin/env python3
"""A reference llama forward over a small F16 / F32 GGUF file, in plain Python
(no numpy), with llama.cpp's conventions: the q / k rows stay as the file holds
them (permuted by llama.cpp's converter) and RoPE turns adjacent pairs
(llama.cpp's "norm" mode), RMS norm, SwiGLU, causal attention with grouped KV
heads. Prints the greedy continuation of a prompt of token ids, with each step's
margin between the best and the second-best logit.

The tests' tiny llama (tools/gen_random_gguf.c ... llama2-tiny) is checked
against what this prints: tests/model/test_gguf.c and tests/cli/test_args.c.

usage: tools/ref_llama_gguf.py FILE.gguf [--ids 1,15043,3186] [-n 8]
"""
import argparse
import math
import struct

SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def read_gguf(path):
    with open(path, "rb") as f:
        d = f.read()
    at = 0

    def take(fmt):
        nonlocal at
        v = struct.unpack_from("<" + fmt, d, at)
        at += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string():
        nonlocal at
        n = take("Q")
        s = d[at:at + n].decode("utf-8", "replace")
        at += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(SCALAR[t])

    assert d[:4] == b"GGUF", "not a GGUF file"
    at = 4
    take("I")
    nt, nkv = take("Q"), take("Q")
    kv = {}
    for _ in range(nkv):
        k = string()
        kv[k] = value(take("I"))
    infos = []
    for _ in range(nt):
        name = string()
        dims = [take("Q") for _ in range(take("I"))]
        infos.append((name, dims, take("I"), take("Q")))
    align = kv.get("general.alignment", 32)
    base = (at + align - 1) // align * align
    tensors = {}
    for name, dims, t, off in infos:
        n = math.prod(dims)
        if t == 0:
            vals = struct.unpack_from("<%df" % n, d, base + off)
        elif t == 1:
            vals = struct.unpack_from("<%de" % n, d, base + off)
        else:
            raise SystemExit(f"{name}: type {t} is not F32 or F16")
        cols = dims[0]
        tensors[name] = [list(vals[r * cols:(r + 1) * cols]) for r in range(n // cols)] if len(dims) > 1 else list(vals)
    return kv, tensors


def matvec(w, x):
    return [sum(a * b for a, b in zip(row, x)) for row in w]


def rmsnorm(x, g, eps):
    s = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v * s * gi for v, gi in zip(x, g)]


def rope(v, pos, hd, base):
    out = list(v)
    for h in range(len(v) // hd):
        for i in range(hd // 2):
            th = pos * base ** (-2.0 * i / hd)
            c, s = math.cos(th), math.sin(th)
            a, b = v[h * hd + 2 * i], v[h * hd + 2 * i + 1]
            out[h * hd + 2 * i] = a * c - b * s
            out[h * hd + 2 * i + 1] = a * s + b * c
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--ids", default="1,15043,3186")
    ap.add_argument("-n", type=int, default=8)
    args = ap.parse_args()
    kv, T = read_gguf(args.file)
    arch = kv["general.architecture"]
    L, nh = kv[arch + ".block_count"], kv[arch + ".attention.head_count"]
    nkv = kv.get(arch + ".attention.head_count_kv", nh)
    eps = kv[arch + ".attention.layer_norm_rms_epsilon"]
    base = kv.get(arch + ".rope.freq_base", 10000.0)
    hd = kv[arch + ".embedding_length"] // nh
    out_w = T.get("output.weight", T["token_embd.weight"])
    keys = [[] for _ in range(L)]
    vals = [[] for _ in range(L)]

    def step(tok, pos):
        x = list(T["token_embd.weight"][tok])
        for l in range(L):
            p = f"blk.{l}."
            h = rmsnorm(x, T[p + "attn_norm.weight"], eps)
            q = rope(matvec(T[p + "attn_q.weight"], h), pos, hd, base)
            keys[l].append(rope(matvec(T[p + "attn_k.weight"], h), pos, hd, base))
            vals[l].append(matvec(T[p + "attn_v.weight"], h))
            att = []
            for hh in range(nh):
                g = hh // (nh // nkv)
                sc = [sum(q[hh * hd + i] * k[g * hd + i] for i in range(hd)) / math.sqrt(hd) for k in keys[l]]
                m = max(sc)
                e = [math.exp(s - m) for s in sc]
                z = sum(e)
                att += [sum(e[j] / z * vals[l][j][g * hd + i] for j in range(len(e))) for i in range(hd)]
            x = [a + b for a, b in zip(x, matvec(T[p + "attn_output.weight"], att))]
            h = rmsnorm(x, T[p + "ffn_norm.weight"], eps)
            gt, up = matvec(T[p + "ffn_gate.weight"], h), matvec(T[p + "ffn_up.weight"], h)
            a = [g / (1.0 + math.exp(-g)) * u for g, u in zip(gt, up)]
            x = [a_ + b for a_, b in zip(x, matvec(T[p + "ffn_down.weight"], a))]
        return matvec(out_w, rmsnorm(x, T["output_norm.weight"], eps))

    ids = [int(t) for t in args.ids.split(",")]
    for pos, t in enumerate(ids):
        logits = step(t, pos)
    out = []
    for i in range(args.n):
        order = sorted(range(len(logits)), key=lambda j: -logits[j])
        out.append(order[0])
        print(f"step {i}: {order[0]} (margin {logits[order[0]] - logits[order[1]]:.3g})")
        logits = step(order[0], len(ids) + i)
    print(" ".join(map(str, out)))


if __name__ == "__main__":
    main()
