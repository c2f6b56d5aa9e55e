#!/usr/bin/env python3
"""peer_transformers.py — the Python user's baseline on the same GPU:
transformers' `generate` with a static KV cache, greedy, on a model folder
(the random 8B of tools/gen_random_model.py), batch 1 and batched.

  python3 bench/cuda/peer_transformers.py MODEL [--batches 1,64,256] [--input 128] [--output 128] [--compile]

Each batch size: one untimed warm-up generate, then one timed (CUDA
synchronised around it); prompts are random token ids of --input tokens,
every row generates exactly --output tokens (min_new_tokens). Prints one
JSON line per batch size: output tokens/s and the time per decode step.
--compile lets generate compile the forward (transformers' default for a
static cache); without it the forward runs eagerly.
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--input", type=int, default=128)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    t0 = time.time()
    try:
        m = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, device_map="cuda")
    except (ImportError, ValueError):  # no accelerate: load on the host, then move
        m = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).to("cuda")
    m.eval()
    print(json.dumps({"load_s": round(time.time() - t0, 2), "transformers_model": type(m).__name__}), flush=True)
    g = torch.Generator(device="cpu").manual_seed(0)
    for bs in [int(x) for x in a.batches.split(",")]:
        ids = torch.randint(10, 1000, (bs, a.input), generator=g).cuda()
        mask = torch.ones_like(ids)
        kw = dict(max_new_tokens=a.output, min_new_tokens=a.output, do_sample=False, cache_implementation="static",
                  pad_token_id=0)
        if not a.compile:
            kw["disable_compile"] = True
        try:
            with torch.inference_mode():
                m.generate(input_ids=ids, attention_mask=mask, **kw)  # warm-up
                torch.cuda.synchronize()
                t = time.time()
                out = m.generate(input_ids=ids, attention_mask=mask, **kw)
                torch.cuda.synchronize()
                dt = time.time() - t
            n_out = (out.shape[1] - a.input) * bs
            print(json.dumps({"peer": "transformers generate, static cache" + (", compiled" if a.compile else ", eager"),
                              "batch": bs, "input": a.input, "output": a.output, "seconds": round(dt, 3),
                              "output_tok_s": round(n_out / dt, 1), "ms_per_step": round(1000 * dt / a.output, 2)}),
                  flush=True)
        except Exception as e:  # a batch that does not fit is reported, the rest still run
            print(json.dumps({"batch": bs, "error": str(e)[:300]}), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
