#!/usr/bin/env python3
"""gen_gguf_fuzz_seeds.py — writes the seed inputs of the GGUF fuzz targets:
tests/fuzz/seeds/gguf/ (small GGUF files: every value type, tensors, vocab-only
files) and tests/fuzz/seeds/gguf_vocab/ (a mode byte followed by text, or 0xf0+
followed by a GGUF whose vocabulary is loaded). Deterministic; run from the
repository root:  python3 tools/gen_gguf_fuzz_seeds.py
"""
import os
import struct

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)


def s(x):
    b = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


def kv(key, typ, val):
    out = s(key) + struct.pack("<I", typ)
    fmt = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
           BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
    if typ == STR:
        return out + s(val)
    if typ == ARR:
        et, items = val
        out += struct.pack("<IQ", et, len(items))
        for it in items:
            out += s(it) if et == STR else struct.pack(fmt[et], it)
        return out
    return out + struct.pack(fmt[typ], val)


def gguf(kvs, tensors=(), version=3, align=32):
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k in kvs:
        out += k
    data = b""
    for name, dims, typ, nbytes in tensors:
        while len(data) % align:
            data += b"\0"
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", typ, len(data))
        data += bytes((i * 7) & 255 for i in range(nbytes))
    if tensors:
        while len(out) % align:
            out += b"\0"
    return out + data


def spm_vocab(extra=()):
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + ["\u2581", "\u2581a", "ab", "b", "a"]
    types = [2, 3, 3] + [6] * 256 + [1] * 5
    scores = [0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0]
    return [kv("tokenizer.ggml.model", STR, "llama"),
            kv("tokenizer.ggml.tokens", ARR, (STR, toks)),
            kv("tokenizer.ggml.scores", ARR, (F32, scores)),
            kv("tokenizer.ggml.token_type", ARR, (I32, types))] + list(extra)


def bpe_vocab(pre):
    bytes_ = [chr(c) for c in range(0x21, 0x7f)] + ["\u0120", "\u010a"]
    toks = bytes_ + ["\u0120a", "ab", "<|endoftext|>"]
    types = [1] * (len(toks) - 1) + [3]
    return [kv("tokenizer.ggml.model", STR, "gpt2"), kv("tokenizer.ggml.pre", STR, pre),
            kv("tokenizer.ggml.tokens", ARR, (STR, toks)),
            kv("tokenizer.ggml.token_type", ARR, (I32, types)),
            kv("tokenizer.ggml.merges", ARR, (STR, ["\u0120 a", "a b"]))]


def gemma4_vocab():
    toks = ["<pad>", "<eos>", "<bos>"] + ["<0x%02X>" % b for b in range(256)] + ["\u2581", "a", "b", "\u2581a", "ab", "\n", "\n\n"]
    types = [3, 3, 3] + [6] * 256 + [1] * 7
    return [kv("tokenizer.ggml.model", STR, "gemma4"),
            kv("tokenizer.ggml.tokens", ARR, (STR, toks)),
            kv("tokenizer.ggml.token_type", ARR, (I32, types)),
            kv("tokenizer.ggml.merges", ARR, (STR, ["\u2581 a", "a b", "\n \n"])),
            kv("tokenizer.ggml.bos_token_id", U32, 2), kv("tokenizer.ggml.eos_token_id", U32, 1)]


def ugm_vocab():
    toks = ["<pad>", "</s>", "<unk>", "\u2581", "\u2581a", "b", "\u2581ab", "c", "<x>"]
    return [kv("tokenizer.ggml.model", STR, "t5"),
            kv("tokenizer.ggml.tokens", ARR, (STR, toks)),
            kv("tokenizer.ggml.scores", ARR, (F32, [0.0, 0.0, 0.0, -2.0, -2.0, -2.0, -3.0, -3.0, 0.0])),
            kv("tokenizer.ggml.token_type", ARR, (I32, [3, 3, 2, 1, 1, 1, 1, 1, 4])),
            kv("tokenizer.ggml.add_space_prefix", BOOL, True),
            kv("tokenizer.ggml.remove_extra_whitespaces", BOOL, True)]


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fuzz", "seeds")
    g = os.path.join(root, "gguf")
    v = os.path.join(root, "gguf_vocab")
    os.makedirs(g, exist_ok=True)
    os.makedirs(v, exist_ok=True)
    every = [kv("a.u8", U8, 7), kv("a.i8", I8, -7), kv("a.u16", U16, 600), kv("a.i16", I16, -600),
             kv("a.u32", U32, 70000), kv("a.i32", I32, -70000), kv("a.f32", F32, 0.5), kv("a.bool", BOOL, True),
             kv("a.str", STR, "h\u00e9llo"), kv("a.u64", U64, 1 << 40), kv("a.i64", I64, -(1 << 40)),
             kv("a.f64", F64, 2.5), kv("a.arr", ARR, (I16, [1, -2, 3])), kv("a.strs", ARR, (STR, ["x", "", "yz"]))]
    tensors = [("t.f32", [4, 2], 0, 32), ("t.q4_0", [32, 2], 2, 36), ("t.q6_k", [256], 14, 210)]
    files = {
        "every_type.gguf": gguf(every),
        "tensors.gguf": gguf([kv("general.architecture", STR, "llama")], tensors),
        "tensors_v2_align64.gguf": gguf([kv("general.alignment", U32, 64)], tensors, version=2, align=64),
        "vocab_spm.gguf": gguf(spm_vocab([kv("tokenizer.ggml.add_bos_token", BOOL, True)])),
        "vocab_bpe.gguf": gguf(bpe_vocab("gpt-2")),
        "truncated.gguf": gguf(every)[:57],
    }
    for name, data in files.items():
        with open(os.path.join(g, name), "wb") as f:
            f.write(data)
    texts = {
        "spm_hello": (0, "Hello world"),
        "bpe_mixed": (1, " Hello, World! 1234567  \n\n\t caf\u00e9 \u4f60\u597d 's 'll"),
        "deepseek_llm": (2, "\u00b5 \u1e00 \uff21 \u3000\u3002 123 \u4e00\u9fa5 trailing   "),
        "deepseek_coder": (3, "def f(x):\r\n    return x**2 # \u0440\u0443\u0441"),
        "falcon": (4, "a+b=c^2 | `x` ~ $5 1234"),
        "bert": (5, "Hello, W\u00f6rld! \u4e2d\u6587 \u00e9"),
        "starcoder_special": (6 + 8 * 2, "x<|endoftext|>y 12"),
        "phi3_special": (7 + 8 * 2, "<|user|> hi <|end|>\n<|assistant|>"),
        "invalid_utf8": (1, "\udcff"),
    }
    for name, (mode, text) in texts.items():
        b = text.encode("utf-8", "surrogateescape")
        with open(os.path.join(v, name), "wb") as f:
            f.write(bytes([mode]) + b)
    with open(os.path.join(v, "gguf_spm"), "wb") as f:
        f.write(bytes([0xf1]) + gguf(spm_vocab()))
    with open(os.path.join(v, "gguf_bpe"), "wb") as f:
        f.write(bytes([0xf3]) + gguf(bpe_vocab("qwen2")))
    with open(os.path.join(v, "gguf_ugm"), "wb") as f:
        f.write(bytes([0xf7]) + gguf(ugm_vocab()))
    with open(os.path.join(v, "gguf_gemma4"), "wb") as f:
        f.write(bytes([0xf2]) + gguf(gemma4_vocab()))
    with open(os.path.join(g, "vocab_ugm.gguf"), "wb") as f:
        f.write(gguf(ugm_vocab()))


if __name__ == "__main__":
    main()
