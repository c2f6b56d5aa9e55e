#!/usr/bin/env python3
"""Reference sentence embeddings for hearth's embedding path.

Qwen3-Embedding is a qwen3 decoder read without its head: the embedding of a
sequence is the final hidden state (after the last norm) at its last token,
L2-normalised. This computes that with transformers' AutoModel in float64 on
the golden qwen3 models and writes OUT/<folder>/embedding.json:
  {"inputs": [[ids...], ...], "embeddings": [[floats...], ...]}

Usage: python3 tools/gen_embed_golden.py [GOLDEN_DIR]   (needs torch and transformers)
"""
import json
import os
import sys

import torch
from transformers import AutoModel

INPUTS = [
    [1, 17, 230, 45, 98, 311, 7],
    [1, 400, 5, 5, 5, 77, 123, 250, 301, 12, 9, 88, 64],
    [9],
]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/golden"
    for folder in ("qwen3-f32", "qwen3-bf16"):
        path = os.path.join(root, folder)
        m = AutoModel.from_pretrained(path, dtype=torch.float64, attn_implementation="eager").eval()
        embs = []
        with torch.no_grad():
            for ids in INPUTS:
                h = m(torch.tensor([ids])).last_hidden_state[0, -1]
                embs.append([float(x) for x in torch.nn.functional.normalize(h, dim=0)])
        with open(os.path.join(path, "embedding.json"), "w") as f:
            json.dump({"reference": "AutoModel float64, last token of last_hidden_state, L2-normalised",
                       "inputs": INPUTS, "embeddings": embs}, f)
            f.write("\n")
        print(folder, "ok", embs[0][:4], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
