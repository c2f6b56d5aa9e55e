#!/usr/bin/env python3
"""The peer for bench_template.c: Python Jinja2 set up as Hugging Face does,
rendering the same 10-turn chat through the same templates (compiled once)."""
import json
import sys
import time

sys.path.insert(0, __import__("os").path.join(__import__("os").path.dirname(__file__), "..", "..", "tools"))
from gen_template_fixtures import make_env  # noqa: E402


def ten_turns():
    m = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(10):
        m.append({"role": "user", "content": f"Question {i}: what is {i} squared, and why does it matter?"})
        m.append({"role": "assistant", "content": f"{i} squared is {i*i}. It matters because squares show up in areas, variances and many formulas."})
    m.append({"role": "user", "content": "Thanks! One more?"})
    return m


def load(path):
    if path.endswith(".jinja"):
        return open(path, encoding="utf-8").read(), "", ""  # as hearth: no tokenizer_config.json beside it
    cfg = json.load(open(path, encoding="utf-8"))
    tok = lambda v: v.get("content", "") if isinstance(v, dict) else (v or "")  # noqa: E731
    return cfg["chat_template"], tok(cfg.get("bos_token")), tok(cfg.get("eos_token"))


def main():
    iters = int(sys.argv[-1])
    env = make_env()
    msgs = ten_turns()
    for arg in sys.argv[1:-1]:
        name, path = arg.split("=", 1)
        src, bos, eos = load(path)
        ctx = dict(messages=msgs, tools=None, documents=None, add_generation_prompt=True, bos_token=bos, eos_token=eos)
        tpl = env.from_string(src)
        t0 = time.perf_counter()
        for _ in range(iters):
            out = tpl.render(**ctx)
        render_us = (time.perf_counter() - t0) / iters * 1e6
        n2 = max(1, iters // 20)
        t0 = time.perf_counter()
        for _ in range(n2):
            env.from_string(src).render(**ctx)
        both_us = (time.perf_counter() - t0) / n2 * 1e6
        print(json.dumps({"template": name, "impl": "jinja2", "render_us": round(render_us, 2),
                          "parse_render_us": round(both_us, 2), "output_bytes": len(out.encode("utf-8"))}))


if __name__ == "__main__":
    main()
