#!/usr/bin/env python3
"""Writes tests/fixtures/serve/{tokenizer.json,tokenizer_config.json}: a
byte-level BPE tokenizer of exactly 512 tokens (3 specials, 256 bytes, 253
merges learned from the text below) with a plain chat template, so the golden
fixture weights (tests/fixtures/golden/llama-f32, vocab_size 512) can be served
end to end by tests/serve/e2e.test.cjs. Deterministic: same output every run.

usage: tools/gen_serve_tokenizer.py [OUT_DIR]
"""
import collections
import json
import os
import re
import sys

TEXT = """
The lighthouse keeper climbed the stairs every evening and lit the lamp before
the sun went down. Ships passed in the night, and the light turned over the
water until morning. In the winter the storms came from the north, and the
keeper wrote in his book the names of the ships, the weather, and the hours.
A local runtime serves a model on your own machine: one command, one binary,
and a chat page. It streams tokens as they are generated, stops when a stop
string appears, and answers any client that speaks the same protocol.
Numbers 0123456789, punctuation (like this), quotes "and" 'these'; end.
"""

SPECIALS = ["<unk>", "<s>", "</s>"]
VOCAB_SIZE = 512


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "serve")
    os.makedirs(out, exist_ok=True)
    b2u = bytes_to_unicode()
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for b in range(256):
        vocab[b2u[b]] = len(vocab)
    words = re.findall(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+", TEXT)
    pairs = collections.Counter()
    for w in words:
        u = "".join(b2u[b] for b in w.encode())
        for a, b in zip(u, u[1:]):
            pairs[(a, b)] += 1
    merges = []
    # Most frequent first; ties broken by the pair itself so the order is stable.
    for (a, b), _ in sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(vocab) >= VOCAB_SIZE:
            break
        if a + b in vocab:
            continue
        vocab[a + b] = len(vocab)
        merges.append([a, b])
    # Too few pairs in the text: fill with byte pairs of letters in a fixed order.
    letters = [b2u[c] for c in b"etaoinshrdlucmfwypvbgkjqxz"]
    for a in letters:
        for b in letters:
            if len(vocab) >= VOCAB_SIZE:
                break
            if a + b not in vocab:
                vocab[a + b] = len(vocab)
                merges.append([a, b])
    assert len(vocab) == VOCAB_SIZE, len(vocab)
    special = lambda i, s: {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                            "normalized": False, "special": True}
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [special(i, s) for i, s in enumerate(SPECIALS)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=None)
        f.write("\n")
    cfg = {
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
        "chat_template": "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}",
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    print(f"{out}: {len(vocab)} tokens, {len(merges)} merges")


if __name__ == "__main__":
    main()
