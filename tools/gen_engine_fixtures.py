#!/usr/bin/env python3
"""Generates the text-side fixtures of hearth's generation tests.

The golden llama model (tests/fixtures/golden/llama-f32, vocab 512) has no
tokenizer. This writes a byte-level BPE tokenizer of exactly 512 ids for it,
so generation can be tested on text (streaming detokenization, stop strings,
chat rendering), and the expected results, computed here independently:

  ids 0..2      "<pad>", "<s>", "</s>"  (special; BOS 1, EOS 2 as in config.json)
  ids 3..258    the 256 bytes in GPT-2's byte-to-unicode alphabet
  ids 259..511  merges of two characters of " etaoinshrdlucmf"

Decoding is the ByteLevel decoder: the tokens' characters mapped back to bytes,
then UTF-8 with invalid sequences replaced by U+FFFD (Rust from_utf8_lossy;
Python's errors="replace" substitutes the same maximal subparts).

Outputs (in tests/fixtures/engine/):
  tokenizer.json, tokenizer_config.json   (chat template included)
  expected.json   the greedy continuation's text, a stop string taken from it
                  with the text before it and the token count that completes
                  it, and chat renders from Python Jinja2 (HF's settings)

Usage: python3 tools/gen_engine_fixtures.py   (needs jinja2)
"""
import json
import os

import jinja2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "fixtures", "golden", "llama-f32", "golden.json")
OUT = os.path.join(ROOT, "tests", "fixtures", "engine")

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "{% if m.role == 'system' %}[sys] {{ m.content }}\n"
    "{% else %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if tools %}tools: {{ tools | length }}\n{% endif %}"
    "{% if add_generation_prompt %}<|assistant|>{% if think %}<think>{% endif %}{% endif %}"
)


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
    b2u = bytes_to_unicode()
    u2b = {c: b for b, c in b2u.items()}
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[b2u[b]] = 3 + b
    letters = " etaoinshrdlucmf"
    merges = []
    for a in letters:
        for c in letters:
            if len(vocab) == 512:
                break
            tok = b2u[ord(a)] + b2u[ord(c)]
            vocab[tok] = len(vocab)
            merges.append(f"{b2u[ord(a)]} {b2u[ord(c)]}")
    assert len(vocab) == 512
    id_to_tok = {i: t for t, i in vocab.items()}
    specials = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": True} for i, t in enumerate(["<pad>", "<s>", "</s>"])]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": specials,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    config = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "add_bos_token": False,
              "chat_template": CHAT_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast",
              "model_max_length": 128}

    def decode(ids, skip_special=True):
        chars = "".join(id_to_tok[i] for i in ids if not (skip_special and i < 3))
        return bytes(u2b[c] for c in chars).decode("utf-8", errors="replace")

    golden = json.load(open(GOLDEN))
    greedy = golden["greedy"]["ids"]
    text = decode(greedy)
    # a stop string: the text of two consecutive merge tokens, first found in the output
    stop = None
    for k in range(len(greedy) - 1):
        if greedy[k] >= 259 and greedy[k + 1] >= 259:
            stop = decode(greedy[k:k + 2])
            break
    assert stop
    cut = text.index(stop)
    tokens_to_stop = next(t for t in range(1, len(greedy) + 1) if stop in decode(greedy[:t]))

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    tmpl = env.from_string(CHAT_TEMPLATE)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    renders = [
        {"messages": msgs, "tools": None, "add_generation_prompt": True, "kwargs": None},
        {"messages": msgs[1:], "tools": [{"type": "function", "function": {"name": "f"}}],
         "add_generation_prompt": False, "kwargs": None},
        {"messages": msgs[1:], "tools": None, "add_generation_prompt": True, "kwargs": {"think": True}},
    ]
    for r in renders:
        ctx = dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>", messages=r["messages"],
                   add_generation_prompt=r["add_generation_prompt"])
        if r["tools"] is not None:
            ctx["tools"] = r["tools"]
        ctx.update(r["kwargs"] or {})
        r["text"] = tmpl.render(**ctx)

    expected = {
        "note": "made by tools/gen_engine_fixtures.py",
        "prompt_ids": golden["prompts"][0],
        "greedy_ids": greedy,
        "greedy_text": text,
        "greedy_text_keep_special": decode(greedy, skip_special=False),
        "stop": stop,
        "text_before_stop": text[:cut],
        "tokens_to_stop": tokens_to_stop,
        "chat": renders,
    }
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=1)
    with open(os.path.join(OUT, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
    print(f"greedy text {text!r}; stop {stop!r} after {tokens_to_stop} tokens")


if __name__ == "__main__":
    main()
