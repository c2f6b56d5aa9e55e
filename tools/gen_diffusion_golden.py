#!/usr/bin/env python3
"""Generates hearth's DiffusionGemma golden fixtures with transformers.

A tiny random-weight DiffusionGemmaForBlockDiffusion (hidden 64, vocab 512,
3 layers: two sliding, one full with wide heads and keys as values, MoE beside
the dense MLP, a tiny vision tower text prompts never use, canvas of 8 tokens)
saved with save_pretrained in float32 into OUT/diffusion_gemma-f32/, then
reference outputs computed in float64 on the weights as stored:

  decoder cases   the encoder over a prompt, then one decoder pass over a given
                  canvas: logits without self-conditioning, and with given
                  self-conditioning logits (prompts of 6 and 20 tokens: the
                  second exceeds the sliding window of 8)
  generations     whole generate() runs (block diffusion, 3 blocks of 8) with
                  the random draws recorded: every torch.randint value (the
                  initial canvas and each renoise) and, for every
                  torch.multinomial draw, a uniform u in [0, 1): the sample is
                  the first index whose cumulative probability exceeds
                  u * (sum of probabilities) (the reference sampler is replaced
                  by exactly that, so a reimplementation given the same draws
                  follows the same steps). Per step: the argmax canvas and the
                  next canvas, so a mismatch is found at its first step. (With
                  random weights, self-conditioning spreads rounding
                  differences from step to step; its down_proj is scaled to a
                  tenth so that rounding-sized differences no longer part a
                  run; tests/engine/test_denoise.c says how it checks.)

Per folder:
  config.json, model.safetensors   the model
  golden.json                      cases, generations, offsets into the .bin
  logits_f32.bin                   float32 little-endian arrays named in golden.json

Usage: python3 tools/gen_diffusion_golden.py OUT   (needs torch and transformers)
"""
import json
import math
import os
import sys

import numpy as np
import torch
import transformers
from transformers.cache_utils import DynamicCache
from transformers.models.diffusion_gemma import modeling_diffusion_gemma as mdg
from transformers.models.diffusion_gemma import generation_diffusion_gemma as gdg

_randint, _multinomial = torch.randint, torch.multinomial

VOCAB = 512
CANVAS = 8
WINDOW = 8


def make_config():
    text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                num_global_key_value_heads=1, sliding_window=WINDOW,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                num_experts=4, top_k_experts=2, moe_intermediate_size=16, max_position_embeddings=128,
                pad_token_id=0, bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-6)
    vision = dict(model_type="gemma4_vision", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=8, patch_size=4,
                  position_embedding_size=16)
    return mdg.DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=CANVAS,
                                    tie_word_embeddings=True)


def init_weights(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if "norm" in name or (p.dim() == 1 and not name.endswith("bias")):
                p.copy_(1.0 + r * 0.1)
            elif name.endswith("bias"):
                p.copy_(r * 0.2)
            elif "embed_tokens" in name:
                p.copy_(r * 0.3)  # tied head under a softcap of 30: logits well inside the cap
            else:
                p.copy_(r / math.sqrt(p.shape[-1]))
            if "self_conditioning.down_proj" in name:
                # A smaller self-conditioning signal keeps the random model from amplifying
                # float32 rounding (1e-7) through the steps: with it at full size, runs part
                # within a few steps; at a tenth, none of test_denoise's noisy twins part.
                p.mul_(0.1)
        scalars = [b for name, b in model.named_buffers() if name.endswith("layer_scalar")]
        for i, b in enumerate(scalars):
            b.copy_(torch.tensor([0.7 + 0.2 * (i % 3)], dtype=b.dtype))


class Bin:
    def __init__(self):
        self.parts, self.off = [], 0

    def add(self, arr):
        a = np.ascontiguousarray(np.asarray(arr, dtype=np.float32))
        rec = dict(offset=self.off, shape=list(a.shape))
        self.parts.append(a.tobytes())
        self.off += a.size
        return rec  # offset in floats


def decoder_case(model, prompt, canvas, sc_logits):
    cache = DynamicCache(config=model.config.get_text_config())
    p = torch.tensor([prompt])
    pos = torch.arange(len(prompt), len(prompt) + CANVAS).unsqueeze(0)
    with torch.no_grad():
        out = model(input_ids=p, past_key_values=cache, decoder_input_ids=torch.tensor([canvas]),
                    self_conditioning_logits=None if sc_logits is None else torch.tensor(sc_logits)[None].double(),
                    decoder_position_ids=pos)
    kv_lens = [int(cache.layers[i].keys.shape[-2]) for i in range(len(cache.layers))]
    return out.logits[0].float().numpy(), kv_lens


class Draws:
    """Replaces torch.randint / torch.multinomial during generate() and records them."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)
        self.ints, self.uniforms, self.margin = [], [], 1.0

    def randint(self, low=0, high=None, size=None, **kw):
        t = _randint(low, high, size, generator=self.g)
        self.ints.extend(int(x) for x in t.flatten())
        return t.to(kw.get("device") or "cpu")

    def multinomial(self, probs, num_samples=1, **kw):
        assert num_samples == 1
        p = probs.double()
        u = torch.rand(p.shape[0], generator=self.g, dtype=torch.float64)
        cdf = p.cumsum(-1)
        target = u * cdf[:, -1]
        idx = torch.searchsorted(cdf, target[:, None], right=True).squeeze(-1).clamp(max=p.shape[1] - 1)
        for r in range(p.shape[0]):
            i = int(idx[r])
            lo = float(cdf[r, i - 1]) if i > 0 else 0.0
            hi = float(cdf[r, i])
            self.margin = min(self.margin, (float(target[r]) - lo) / float(cdf[r, -1]),
                              (hi - float(target[r])) / float(cdf[r, -1]))
        self.uniforms.extend(float(x) for x in u)
        return idx[:, None]


def generate(model, prompt, seed, **gen_kwargs):
    d = Draws(seed)
    trace = []
    orig_step = model._denoising_step

    def step(*a, **kw):
        res = orig_step(*a, **kw)
        new_canvas, argmax, _, finished = res
        trace.append(dict(step=int(kw["cur_step"]), argmax=argmax[0].tolist(), next=new_canvas[0].tolist(),
                          finished=bool(finished[0])))
        return res

    torch.randint, torch.multinomial = d.randint, d.multinomial
    model._denoising_step = step
    try:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), **gen_kwargs)
    finally:
        torch.randint, torch.multinomial = _randint, _multinomial
        del model._denoising_step
    seq = out.sequences[0].tolist()
    # steps per block: the trace restarts at max_denoising_steps
    blocks, cur = [], 0
    for t in trace:
        if t["step"] == gen_kwargs["max_denoising_steps"] and cur:
            blocks.append(cur)
            cur = 0
        cur += 1
    blocks.append(cur)
    return dict(prompt=prompt, params={k: (v.entropy_bound if k == "sampler_config" else v)
                                       for k, v in gen_kwargs.items()},
                sequence=seq, output=seq[len(prompt):], steps_per_block=blocks, canvas_draws=d.ints,
                uniforms=d.uniforms, min_uniform_margin=d.margin, trace=trace)


def main():
    out_root = sys.argv[1]
    torch.manual_seed(0)
    cfg = make_config()
    print("transformers", transformers.__version__, "torch", torch.__version__)
    model = mdg.DiffusionGemmaForBlockDiffusion(cfg).eval()
    init_weights(model, 2026)
    enc = model.model.encoder.language_model.layers[0].self_attn.q_proj.weight
    dec = model.model.decoder.layers[0].self_attn.q_proj.weight
    print("encoder/decoder tied:", enc.data_ptr() == dec.data_ptr(),
          "head tied:", model.lm_head.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr())
    folder = os.path.join(out_root, "diffusion_gemma-f32")
    os.makedirs(folder, exist_ok=True)
    model.float().save_pretrained(folder)
    from safetensors import safe_open
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        for k in sorted(f.keys()):
            if "vision" not in k:
                print("tensor", k, tuple(f.get_slice(k).get_shape()))
    # the reference in float64 on the weights as stored
    model = mdg.DiffusionGemmaForBlockDiffusion.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager",
                                                                experts_implementation="eager").eval()
    print(model.config)
    if not isinstance(model.generation_config, gdg.DiffusionGemmaGenerationConfig):
        model.generation_config = gdg.DiffusionGemmaGenerationConfig()
    with open(os.path.join(folder, "config.json")) as f:
        print(f.read())

    b = Bin()
    rng = np.random.default_rng(7)
    cases = []
    for plen in (6, 20):
        prompt = [1] + [int(x) for x in rng.integers(3, VOCAB, plen - 1)]
        canvas = [int(x) for x in rng.integers(0, VOCAB, CANVAS)]
        logits, kv_lens = decoder_case(model, prompt, canvas, None)
        sc = logits * 1.7 + rng.standard_normal(logits.shape).astype(np.float32)
        logits_sc, _ = decoder_case(model, prompt, canvas, sc)
        cases.append(dict(prompt=prompt, canvas=canvas, kv_lens_after_encoder=kv_lens,
                          logits=b.add(logits), self_conditioning=b.add(sc), logits_sc=b.add(logits_sc),
                          argmax=[int(x) for x in logits.argmax(-1)],
                          argmax_sc=[int(x) for x in logits_sc.argmax(-1)],
                          max_abs=float(np.abs(logits).max())))
        print("case", plen, "kv", kv_lens, "argmax", cases[-1]["argmax"], "sc", cases[-1]["argmax_sc"])

    gens = []

    def save():
        with open(os.path.join(folder, "logits_f32.bin"), "wb") as f:
            for p in b.parts:
                f.write(p)
        with open(os.path.join(folder, "golden.json"), "w") as f:
            json.dump(dict(vocab=VOCAB, canvas_length=CANVAS, decoder_cases=cases, generations=gens), f)

    save()  # the decoder cases, even if a generation below fails
    prompt = [1] + [int(x) for x in rng.integers(3, VOCAB, 9)]
    base = dict(max_new_tokens=3 * CANVAS, max_denoising_steps=10, t_min=0.4, t_max=0.8,
                stability_threshold=1, confidence_threshold=0.005, pad_token_id=0)
    g1 = generate(model, prompt, 11, sampler_config=gdg.EntropyBoundSamplerConfig(entropy_bound=0.5), **base)
    gens.append(dict(name="plain", **g1))
    print("plain", g1["output"], g1["steps_per_block"], "margin", g1["min_uniform_margin"])
    # an end-of-sequence token inside the second block: the run stops there, the rest is pad
    eos = g1["output"][CANVAS + 3]
    g2 = generate(model, prompt, 11, sampler_config=gdg.EntropyBoundSamplerConfig(entropy_bound=0.5),
                  eos_token_id=eos, **base)
    gens.append(dict(name="eos", **g2))
    print("eos", eos, g2["output"], g2["steps_per_block"])
    # the stable-and-confident stop: a threshold loose enough to fire before the last step
    for thr in (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0):
        kw = dict(base, confidence_threshold=thr)
        g3 = generate(model, prompt, 12, sampler_config=gdg.EntropyBoundSamplerConfig(entropy_bound=1.0), **kw)
        print("early", thr, g3["output"], g3["steps_per_block"])
        if any(s < 10 for s in g3["steps_per_block"]) and g3["steps_per_block"][0] > 1:
            break
    gens.append(dict(name="early_stop", **g3))
    save()
    print("done", os.listdir(folder))


if __name__ == "__main__":
    main()
