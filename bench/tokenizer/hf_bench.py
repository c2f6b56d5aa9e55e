#!/usr/bin/env python3
"""Encode throughput of HF tokenizers on one thread, the peer of tok_bench.

  RAYON_NUM_THREADS=1 hf_bench.py TOKENIZER_JSON TEXTFILE [ROUNDS]

Encodes every line (add_special_tokens=False) two ways and prints one JSON
line: `encode_batch` over all lines (Rust loop, no per-call Python cost; one
thread because RAYON_NUM_THREADS=1) and `encode` per line from Python.
MB/s is over the best round; tokens is the total, to compare with hearth's.
"""
import json
import os
import sys
import time

from tokenizers import Tokenizer


def main():
    path, textfile = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    data = open(textfile, "rb").read()
    lines = data.decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    t0 = time.perf_counter()
    tok = Tokenizer.from_file(path)
    load = time.perf_counter() - t0
    best_batch = best_single = 1e30
    tokens = 0
    for _ in range(rounds):
        t = time.perf_counter()
        encs = tok.encode_batch(lines, add_special_tokens=False)
        best_batch = min(best_batch, time.perf_counter() - t)
        tokens = sum(len(e.ids) for e in encs)
        t = time.perf_counter()
        for line in lines:
            tok.encode(line, add_special_tokens=False)
        best_single = min(best_single, time.perf_counter() - t)
    print(json.dumps({"impl": "hf-tokenizers", "tokenizer": path, "rayon_threads": os.environ.get("RAYON_NUM_THREADS"),
                      "load_s": round(load, 3), "bytes": len(data), "tokens": tokens,
                      "mb_per_s_encode_batch": round(len(data) / best_batch / 1e6, 2),
                      "mb_per_s_encode_per_line": round(len(data) / best_single / 1e6, 2)}))


if __name__ == "__main__":
    main()
