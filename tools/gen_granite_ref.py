#!/usr/bin/env python3
"""Writes the granite golden folders (granite-f32, granite-bf16) without transformers.

A stand-in for `tools/gen_golden.py OUT --only=granite`, which needs
transformers: that run replaces these folders (and their params.json
entries) and is the reference; this one lets tests/model/test_golden.c
check granite until it has been made. It writes the folders in the layout
gen_golden.py writes (config.json, generation_config.json,
model.safetensors, golden.json, logits_f32.bin; no tokenizer, like every
golden folder) from the `granite` entry of gen_golden.py's ARCHS (read
from that file, so the two cannot drift):

- weights: gen_golden.py's init_weights replayed — one float64 draw of
  torch.randn per parameter from a generator seeded 100 + the entry's index
  in ARCHS, in GraniteForCausalLM's parameter order, stored as float32 and
  rounded from those to bfloat16. Checked first by replaying it for the
  llama entry (seed 100), whose weights must equal the committed
  llama-f32 folder's bit for bit.
- logits: a float64 forward of GraniteForCausalLM as modeling_granite.py
  writes it, on the weights as stored (bf16 upcast), with the float32
  steps of transformers' float64 eager run kept (RMSNorm, RoPE tables and
  the softmax run in float32). The forward is checked first on the llama
  golden folder (the same code with every multiplier neutral and the
  1/sqrt(head_dim) scale) against transformers' logits stored there.

Granite's semantics (transformers' models/granite/modeling_granite.py):
  GraniteModel:        h = embed_tokens(ids) * embedding_multiplier
  GraniteAttention:    softmax(q kᵀ * attention_multiplier + causal mask) v
                       (the scale replaces 1/sqrt(head_dim))
  GraniteDecoderLayer: h = h + self_attn(input_layernorm(h)) * residual_multiplier
                       h = h + mlp(post_attention_layernorm(h)) * residual_multiplier
  GraniteForCausalLM:  logits = lm_head(norm(h)) / logits_scaling
GraniteConfig's default for each of the four is 1.0.

Usage: /usr/bin/python3 tools/gen_granite_ref.py [OUT]   (OUT: tests/fixtures/golden; needs torch and numpy)
"""
import ast
import json
import math
import os
import shutil
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "granite"


def golden_settings():
    """VOCAB, COMMON, PROMPT_LENS, GREEDY_STEPS and ARCHS as gen_golden.py defines them."""
    tree = ast.parse(open(os.path.join(HERE, "gen_golden.py")).read())
    env = {"dict": dict}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("VOCAB", "COMMON", "PROMPT_LENS", "GREEDY_STEPS", "ARCHS"):
                env[name] = eval(compile(ast.Expression(node.value), "gen_golden.py", "eval"), {"__builtins__": {}}, env)
    return env


# ---- safetensors ----

def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        if v["dtype"] == "BF16":
            raw = np.frombuffer(data[a:b], dtype="<u2").astype(np.uint32) << 16
            t = torch.from_numpy(raw.view(np.float32).reshape(v["shape"]).copy())
        else:
            t = torch.from_numpy(np.frombuffer(data[a:b], dtype={"F32": "<f4"}[v["dtype"]]).reshape(v["shape"]).copy())
        out[k] = t
    return out


def write_safetensors(path, tensors, dtype):
    header, blobs, off = {}, [], 0
    for k in sorted(tensors):
        t = tensors[k].detach().contiguous()
        if dtype == "BF16":
            b = t.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
        else:
            b = t.to(torch.float32).numpy().astype("<f4").tobytes()
        header[k] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---- the weights gen_golden.py's init_weights gives ----

def parameter_shapes(c):
    """(name, shape) in the order named_parameters() gives them for LlamaForCausalLM / GraniteForCausalLM
    (a tied head is the embedding's parameter, listed once)."""
    D, I, H, KV, V = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"], c["vocab_size"]
    hd = c.get("head_dim") or D // H
    out = [("model.embed_tokens.weight", (V, D))]
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out += [(p + "self_attn.q_proj.weight", (H * hd, D)), (p + "self_attn.k_proj.weight", (KV * hd, D)),
                (p + "self_attn.v_proj.weight", (KV * hd, D)), (p + "self_attn.o_proj.weight", (D, H * hd)),
                (p + "mlp.gate_proj.weight", (I, D)), (p + "mlp.up_proj.weight", (I, D)), (p + "mlp.down_proj.weight", (D, I)),
                (p + "input_layernorm.weight", (D,)), (p + "post_attention_layernorm.weight", (D,))]
    out.append(("model.norm.weight", (D,)))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, D)))
    return out


def init_weights(c, seed):
    """gen_golden.py's init_weights for a family that is not gemma or qwen3_5, into float32 tensors."""
    g = torch.Generator().manual_seed(seed)
    w = {}
    for name, shape in parameter_shapes(c):
        r = torch.randn(shape, generator=g, dtype=torch.float64)
        if "norm" in name or len(shape) == 1:
            v = 1.0 + r * 0.1
        elif "embed_tokens" in name:
            v = r / math.sqrt(shape[1]) if c["tie_word_embeddings"] else r
        else:
            v = r / math.sqrt(shape[-1])
        w[name] = v.to(torch.float32)
    return w


# ---- the forward ----

def rmsnorm(x, w, eps):
    """LlamaRMSNorm (GraniteRMSNorm is its copy): the normalization in float32, then times the weight."""
    xf = x.to(torch.float32)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * y.to(x.dtype)


def rope_tables(T, hd, theta):
    """LlamaRotaryEmbedding's default RoPE: inverse frequencies, angles, cos and sin in float32."""
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).to(torch.float32) / hd))
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], -1)
    return emb.cos().to(torch.float64), emb.sin().to(torch.float64)


def rotate(x, cos, sin):  # x [T, heads, hd]
    h = x.shape[-1] // 2
    return x * cos[:, None, :] + torch.cat([-x[..., h:], x[..., :h]], -1) * sin[:, None, :]


class Granite:
    def __init__(self, c, w):
        self.c = c
        self.w = {k: v.to(torch.float64) for k, v in w.items()}
        self.H, self.KV = c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c.get("head_dim") or c["hidden_size"] // self.H
        self.eps = c["rms_norm_eps"]
        rp = c.get("rope_parameters") or {}
        self.theta = rp.get("rope_theta", c.get("rope_theta", 10000.0))
        assert rp.get("rope_type", "default") == "default" and not c.get("rope_scaling")
        assert not c.get("attention_bias") and not c.get("mlp_bias") and c["hidden_act"] == "silu"
        if c["model_type"] == "granite":
            self.emb, self.scale = c.get("embedding_multiplier", 1.0), c.get("attention_multiplier", 1.0)
            self.res, self.div = c.get("residual_multiplier", 1.0), c.get("logits_scaling", 1.0)
        else:  # llama: the same forward with Granite's multipliers neutral
            assert c["model_type"] == "llama"
            self.emb, self.scale, self.res, self.div = 1.0, 1.0 / math.sqrt(self.hd), 1.0, 1.0

    def logits(self, ids):
        T, H, KV, hd, w = len(ids), self.H, self.KV, self.hd, self.w
        cos, sin = rope_tables(T, hd, self.theta)
        mask = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), 1)
        x = w["model.embed_tokens.weight"][torch.tensor(ids)] * self.emb
        for l in range(self.c["num_hidden_layers"]):
            p = f"model.layers.{l}."
            h = rmsnorm(x, w[p + "input_layernorm.weight"], self.eps)
            q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, hd)
            k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, KV, hd)
            v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, KV, hd)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin).repeat_interleave(H // KV, dim=1)
            v = v.repeat_interleave(H // KV, dim=1)
            s = torch.einsum("thd,shd->hts", q, k) * self.scale + mask
            a = torch.softmax(s, -1, dtype=torch.float32).to(torch.float64)  # eager attention's float32 softmax
            o = torch.einsum("hts,shd->thd", a, v).reshape(T, H * hd) @ w[p + "self_attn.o_proj.weight"].T
            x = x + o * self.res
            h = rmsnorm(x, w[p + "post_attention_layernorm.weight"], self.eps)
            g, u = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
            x = x + (torch.nn.functional.silu(g) * u) @ w[p + "mlp.down_proj.weight"].T * self.res
        x = rmsnorm(x, w["model.norm.weight"], self.eps)
        head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        return (x @ head.T) / self.div


# ---- the checks of the two replays ----

def check_llama(golden_dir, s):
    folder = os.path.join(golden_dir, "llama-f32")
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    stored = read_safetensors(os.path.join(folder, "model.safetensors"))
    mine = init_weights(c, 100 + list(s["ARCHS"]).index("llama"))
    assert sorted(mine) == sorted(stored), "llama-f32: another set of tensors"
    for k in mine:
        if not torch.equal(mine[k], stored[k]):
            sys.exit(f"llama-f32: {k} is not what init_weights gives: the replay is not gen_golden.py's")
    with open(os.path.join(folder, "golden.json")) as f:
        gold = json.load(f)
    ref = np.fromfile(os.path.join(folder, "logits_f32.bin"), dtype="<f4")
    m, at, worst = Granite(c, stored), 0, 0.0
    with torch.no_grad():
        for ids in gold["prompts"]:
            got = m.logits(ids).to(torch.float32).numpy().ravel()
            worst = max(worst, float(np.abs(got - ref[at:at + got.size]).max()))
            at += got.size
    print(f"llama-f32: weights replayed bit for bit; forward vs transformers' logits: max abs {worst:.3g}")
    if worst > 1e-6 * max(1.0, float(np.abs(ref).max())):
        sys.exit("the forward written here is not transformers' llama")
    return gold["prompts"]


def make_config(s, dtype):
    model_type, over, _ = s["ARCHS"][NAME]
    kw = dict(s["COMMON"])
    kw.update({k: v for k, v in over.items() if not k.startswith("_")})
    theta = kw.pop("rope_theta", 10000.0)
    c = {"architectures": ["GraniteForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "attention_multiplier": 1.0,
         "dtype": {"f32": "float32", "bf16": "bfloat16"}[dtype], "embedding_multiplier": 1.0, "hidden_act": "silu",
         "initializer_range": 0.02, "logits_scaling": 1.0, "mlp_bias": False, "model_type": model_type,
         "residual_multiplier": 1.0, "rope_parameters": {"rope_theta": theta, "rope_type": "default"},
         "tie_word_embeddings": False, "use_cache": True}
    c.update(kw)
    return c


def write_folder(out, s, dtype, w32, prompts):
    folder = os.path.join(out, f"{NAME}-{dtype}")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    c = make_config(s, dtype)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")
    gen = {"_from_model_config": True, "bos_token_id": c["bos_token_id"], "eos_token_id": c["eos_token_id"],
           "output_attentions": False, "output_hidden_states": False, "pad_token_id": c["pad_token_id"], "use_cache": True}
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2, sort_keys=True)
        f.write("\n")
    st = {"f32": "F32", "bf16": "BF16"}[dtype]
    write_safetensors(os.path.join(folder, "model.safetensors"), w32, st)
    w = read_safetensors(os.path.join(folder, "model.safetensors"))  # the weights as stored
    m = Granite(c, w)
    with torch.no_grad():
        logits = np.concatenate([m.logits(p).to(torch.float32).numpy() for p in prompts], axis=0)
        ids, greedy, gaps = list(prompts[0]), [], []
        for _ in range(s["GREEDY_STEPS"]):
            top = torch.topk(m.logits(ids)[-1], 2)
            gaps.append(float(top.values[0] - top.values[1]))
            greedy.append(int(top.indices[0]))
            ids.append(greedy[-1])
        # how much each multiplier moves the logits (each set neutral in turn): the fixture must notice any
        sens = {}
        base = torch.from_numpy(logits)
        for attr, neutral, key in (("emb", 1.0, "embedding_multiplier"), ("scale", 1.0 / math.sqrt(m.hd), "attention_multiplier"),
                                   ("res", 1.0, "residual_multiplier"), ("div", 1.0, "logits_scaling")):
            keep = getattr(m, attr)
            setattr(m, attr, neutral)
            alt = torch.cat([m.logits(p).to(torch.float32) for p in prompts], 0)
            setattr(m, attr, keep)
            sens[key] = float((alt - base).abs().max())
    logits.astype("<f4").tofile(os.path.join(folder, "logits_f32.bin"))
    doc = {
        "name": NAME, "model_type": c["model_type"], "dtype": dtype, "vocab_size": c["vocab_size"],
        "transformers_version": None, "torch_version": torch.__version__,
        "reference": "float64 forward of modeling_granite.py written in tools/gen_granite_ref.py, without transformers, "
                     "on the stored weights (transformers' float32 RMSNorm, RoPE tables and softmax kept); stands in until "
                     "tools/gen_golden.py's transformers run replaces this folder",
        "prompts": prompts, "logits_file": "logits_f32.bin",
        "logits_rows": [len(p) for p in prompts],
        "max_abs_logit": float(np.abs(logits).max()),
        "greedy": {"prompt": 0, "ids": greedy, "top2_gaps": gaps, "min_gap": min(gaps), "near_tie": bool(min(gaps) < 1e-3)},
    }
    with open(os.path.join(folder, "golden.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    nparams = sum(t.numel() for t in w32.values())
    print(f"{NAME}-{dtype}: params {nparams} max|logit| {doc['max_abs_logit']:.3f} min gap {min(gaps):.4g} "
          f"greedy {greedy[:8]}... distinct {len(set(greedy))}; each multiplier made neutral moves the logits by "
          + ", ".join(f"{k} {v:.3g}" for k, v in sens.items()), flush=True)
    return nparams


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "fixtures", "golden")
    golden_dir = os.path.join(HERE, "..", "tests", "fixtures", "golden")
    s = golden_settings()
    rng = np.random.default_rng(1234)  # gen_golden.py's prompts
    prompts = [[int(x) for x in rng.integers(3, s["VOCAB"], size=n)] for n in s["PROMPT_LENS"]]
    if check_llama(golden_dir, s) != prompts:
        sys.exit("the prompts are not gen_golden.py's")
    model_type, over, dtypes = s["ARCHS"][NAME]
    c = make_config(s, "f32")
    w32 = init_weights(c, 100 + list(s["ARCHS"]).index(NAME))
    params = {f"{NAME}-{dt}": write_folder(out, s, dt, w32, prompts) for dt in dtypes}
    path = os.path.join(out, "params.json")
    old = json.load(open(path)) if os.path.exists(path) else {}
    old.update(params)
    with open(path, "w") as f:
        json.dump(old, f, indent=1, sort_keys=True)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
