#!/usr/bin/env python3
"""Checks the chat templates hearth ships by name (src/chat/templates/NAME.jinja)
against the models' own templates, and writes what they render as
tests/fixtures/templates/named.json for tests/chat/test_named_templates.c.

Each named template is a short equivalent written for hearth, not a copy. Its
reference is the published template of a model that uses the format:

  chatml      OpenHermes 2.5 Mistral 7B   llama.cpp tests/test-chat-template.cpp
  llama3      Meta Llama 3 Instruct       .deps/tokenizers/llama3_1/tokenizer_config.json
  gemma       Google Gemma 3 (it)         .deps/tokenizers/gemma3/tokenizer_config.json
  mistral-v7  Mistral Large 2411          llama.cpp tests/test-chat-template.cpp
  phi3        Microsoft Phi-3.5 mini      .deps/llama.cpp/templates/microsoft-Phi-3.5-mini-instruct.jinja
  deepseek3   DeepSeek V3                 .deps/tokenizers/deepseek_v3/tokenizer_config.json

Both are rendered with Python Jinja2 set up as Hugging Face's
apply_chat_template sets it up (tools/gen_template_fixtures.py's make_env) over
the conversations below, with add_generation_prompt true and false and the
model's BOS / EOS texts; any difference stops the script. The rendering is
written out, so the C test checks hearth's Jinja engine gives the same text.
Tool calls are outside what the named templates write: plain turns only.

usage: tools/gen_named_templates.py LLAMA_CPP_SOURCE [--deps .deps]
       (LLAMA_CPP_SOURCE: a checkout of the llama.cpp source in npm node-llama-cpp@3.21.1's
        gitRelease.bundle, e.g. the one tools/gen_gguf_parity.sh makes in .deps/gguf-parity/llama.cpp)
"""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_template_fixtures import make_env, render  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONVERSATIONS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "You are a helpful assistant"}, {"role": "user", "content": "Hello"}],
    [  # llama.cpp's test-chat-template conversation
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there"},
        {"role": "user", "content": "Who are you"},
        {"role": "assistant", "content": "   I am an assistant   "},
        {"role": "user", "content": "Another question"},
    ],
    [{"role": "user", "content": "  Two lines,\nspaces around  "}, {"role": "assistant", "content": "\nOK.\n"}],
    [
        {"role": "user", "content": "Write a haiku about C."},
        {"role": "assistant", "content": "Pointers in the dark"},
        {"role": "user", "content": "Another, with \"quotes\" and {braces} and ünïcödé 漢字."},
    ],
]


def test_case_template(cpp, name):
    """A template string of llama.cpp's test-chat-template.cpp, by its test case's name."""
    m = re.search(r'/\* \.name= \*/ "' + re.escape(name) + r'",\s*/\* \.template_str= \*/ ("(?:[^"\\]|\\.)*")', cpp)
    if not m:
        sys.exit(f"no test case named {name!r} in test-chat-template.cpp")
    return json.loads(m.group(1))


def tokenizer_template(deps, name):
    with open(os.path.join(deps, "tokenizers", name, "tokenizer_config.json"), encoding="utf-8") as f:
        return json.load(f)["chat_template"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("llama_cpp")
    ap.add_argument("--deps", default=os.path.join(ROOT, ".deps"))
    args = ap.parse_args()
    with open(os.path.join(args.llama_cpp, "tests", "test-chat-template.cpp"), encoding="utf-8") as f:
        cpp = f.read()
    with open(os.path.join(args.deps, "llama.cpp", "templates", "microsoft-Phi-3.5-mini-instruct.jinja"),
              encoding="utf-8") as f:
        phi3 = f.read()
    refs = {  # name -> (reference source, bos, eos)
        "chatml": (test_case_template(cpp, "teknium/OpenHermes-2.5-Mistral-7B"), "", ""),
        "llama3": (tokenizer_template(args.deps, "llama3_1"), "<|begin_of_text|>", "<|eot_id|>"),
        "gemma": (tokenizer_template(args.deps, "gemma3"), "<bos>", "<end_of_turn>"),
        "mistral-v7": (test_case_template(cpp, "mistralai/Mistral-Large-Instruct-2411 (mistralai 'v7' template)"),
                       "<s>", "</s>"),
        "phi3": (phi3, "<s>", "<|endoftext|>"),
        "deepseek3": (tokenizer_template(args.deps, "deepseek_v3"), "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    }
    tdir = os.path.join(ROOT, "src", "chat", "templates")
    shipped = sorted(f[:-6] for f in os.listdir(tdir) if f.endswith(".jinja"))
    if shipped != sorted(refs):
        sys.exit(f"src/chat/templates has {shipped}, references for {sorted(refs)}")
    env = make_env()
    cases, bad = [], 0
    for name in shipped:
        with open(os.path.join(tdir, name + ".jinja"), encoding="utf-8") as f:
            mine = f.read()
        ref, bos, eos = refs[name]
        for conv in CONVERSATIONS:
            for gen in (True, False):
                ctx = {"messages": conv, "add_generation_prompt": gen, "bos_token": bos, "eos_token": eos}
                want, got = render(env, ref, ctx), render(env, mine, ctx)
                if want != got:
                    bad += 1
                    print(f"{name}, gen={gen}, {conv}:\n  reference {want}\n  shipped   {got}", file=sys.stderr)
                    continue
                if "error" in want:
                    sys.exit(f"{name}: the reference refuses {conv}: {want['error']}")
                cases.append({"name": name, "bos": bos, "eos": eos, "messages": conv, "add_generation_prompt": gen,
                              "output": want["output"]})
    if bad:
        sys.exit(f"{bad} renderings differ from the reference")
    out = os.path.join(ROOT, "tests", "fixtures", "templates", "named.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"names": shipped, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{out}: {len(cases)} renderings of {len(shipped)} templates, each equal to its model's own")


if __name__ == "__main__":
    main()
