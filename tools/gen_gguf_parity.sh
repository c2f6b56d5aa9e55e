#!/usr/bin/env bash
# gen_gguf_parity.sh — GGUF files as llama.cpp writes them and the logits
# llama.cpp computes from them, for tests/model/test_gguf_parity.c
# (tests/fixtures/gguf_parity/).
#
#   tools/gen_gguf_parity.sh [WORKDIR]     (default .deps/gguf-parity; needs a network once)
#   GGUF_PARITY_OUT=DIR writes the files there instead of the fixtures folder.
#
# 1. llama.cpp's source: the git bundle npm node-llama-cpp@3.21.1 ships
#    (package/llama/gitRelease.bundle), as tools/fetch_test_deps.sh takes it.
# 2. Its converter, convert_hf_to_gguf.py with the gguf-py package of the same
#    source, on tiny golden folders (tests/fixtures/golden/FAMILY-f32: llama,
#    qwen3, mistral, phi3, gemma3, qwen2, qwen3_moe — llama.cpp's qwen3moe —,
#    gemma2 and granite), to f32, f16 and q8_0 files. It runs on Debian's python3-torch
#    (1.13) and python3-numpy, python3-sentencepiece, python3-yaml and
#    python3-tqdm (tools/setup.sh --gguf-parity installs them), with three
#    stand-ins, all in WORKDIR/shim and all only for what Debian lacks:
#      - transformers (not in Debian): a module whose AutoConfig fails, so the
#        converter takes its own fallback and reads config.json as it is (the
#        golden configs are complete: save_pretrained wrote them);
#      - torch's float8 / uint16-64 dtype names (torch >= 2.1): placeholders, so
#        the converter's dtype tables import; no golden tensor has those types;
#      - the GPT-2 BPE vocabulary (qwen3moe's only path) reads the tokenizer
#        through transformers: the folder's SentencePiece model is written
#        instead, as the converter does itself for qwen2 and qwen3.
#    The golden folders have no tokenizer, and the converter needs one: a
#    SentencePiece model of 400 pieces trained on this README, with chat
#    markers as whole pieces (llama.cpp's phi3 vocabulary looks up
#    <|endoftext|>), is written as each folder's tokenizer.model (the converter
#    pads the vocabulary to the model's 512 with [PAD] tokens). The logits
#    compared are of token ids, so the vocabulary only has to load.
# 3. llama.cpp's CPU build of the same release: by default the one npm
#    @node-llama-cpp/linux-x64@3.21.1 ships (node-llama-cpp's CI builds it from
#    the source in the bundle: both name llama.cpp release v0.4.0, in
#    llama/llama.cpp.info.json and bins/linux-x64/_nlcBuildMetadata.json; its CPU
#    backends are modules picked for this CPU at load); LLAMACPP_FROM_SOURCE=1
#    builds libllama from the bundle instead (-DGGML_CUDA=OFF, static, no
#    OpenMP: most of an hour on two cores). tools/llamacpp_logits.c linked to it
#    writes every position's logits of the golden's second prompt (40 tokens,
#    longer than the sliding windows) from one decode, one thread, an f32 KV
#    cache, no flash attention. qwen3_moe (no sliding window) takes the first
#    prompt (20 tokens): on the second, two experts of layer 0 at position 19
#    are 4e-4 apart in router logit (7e-5 with f16 weights), so rounding the
#    activations (llama.cpp's f16 and 8-bit dot products) picks either one;
#    on the first the closest choice is 0.016 apart in every type.
#    Beside them, llama256: a random llama 256 wide (rows long enough for the
#    K-quants' 256-value blocks), quantized by llama.cpp itself to q4_0, q5_0,
#    q5_1, iq4_nl, q2_k, q3_k_m, q4_k_m, q5_k_m, q6_k and iq4_xs.
#    Not converted here (the converter and CPU build of this release, on the
#    golden folders): qwen3_5 — with --no-mtp (the folder has no MTP block) it
#    converts, but llama.cpp's qwen35 takes the DeltaNet value head as wide as
#    the key head (ssm.state_size) and the golden's are 8 and 16, so
#    blk.0.attn_qkv.weight has 96 rows where it expects 128; qwen3_5_moe — the
#    converter writes full_attention_interval 4 when config.json has no such
#    key and reads no layer_types, so the golden's full-attention layer 1 is
#    taken as a DeltaNet layer (blk.1.ssm_conv1d.weight missing); gemma4 and
#    glm_moe_dsa need a tokenizer.json / transformers' tokenizer (with the
#    SentencePiece vocabulary written instead, gemma4 converts and runs, and
#    glm_moe_dsa aborts in ggml_mul_mat building llama.cpp's glm-dsa graph).
# 4. Out: FAMILY-TYPE.gguf, FAMILY-TYPE.logits (float32 LE [position][vocab])
#    and manifest.json (the source's commit, each file's ids; a family the
#    converter or llama.cpp refuses is recorded there with the reason).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(realpath -m "${1:-$root/.deps/gguf-parity}")
out=$(realpath -m "${GGUF_PARITY_OUT:-$root/tests/fixtures/gguf_parity}")
families=(llama qwen3 mistral phi3 gemma3 qwen2 qwen3_moe gemma2 granite)
types=(f32 f16 q8_0)
py=/usr/bin/python3   # Debian's, where python3-torch is

"$root/tools/setup.sh" --gguf-parity
mkdir -p "$work" "$out"

# 1. the source
lc=$work/llama.cpp
if [ ! -f "$lc/convert_hf_to_gguf.py" ]; then
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent node-llama-cpp@3.21.1 >/dev/null && tar xzf ./*.tgz package/llama/gitRelease.bundle)
  rm -rf "$lc"
  git clone -q "$tmp/package/llama/gitRelease.bundle" "$lc" 2>/dev/null
  rm -rf "$tmp"
fi
commit=$(git -C "$lc" rev-parse HEAD)

# 2. the stand-ins and the vocabulary
mkdir -p "$work/shim/transformers"
cat >"$work/shim/transformers/__init__.py" <<'EOF'
# Stand-in for transformers (not in Debian): the converter falls back to reading config.json.
class AutoConfig:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        raise OSError("transformers is not installed: config.json is read as it is")


class AutoTokenizer:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        raise ImportError("transformers is not installed")
EOF
cat >"$work/shim/run_convert.py" <<'EOF'
# Runs convert_hf_to_gguf.py (argv[1]) on Debian's torch 1.13: names of dtypes it
# lacks become placeholders, so the converter's tables import.
import os, runpy, sys
import torch
class _Absent:
    def __init__(self, name): self.name = name
    def __repr__(self): return "torch." + self.name + " (absent in torch " + torch.__version__ + ")"
for name in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "uint16", "uint32", "uint64"):
    if not hasattr(torch, name):
        setattr(torch, name, _Absent(name))
script = os.path.abspath(sys.argv[1])
sys.path.insert(0, os.path.dirname(script))
sys.argv = sys.argv[1:]
# The GPT-2 BPE vocabulary (qwen3moe's only one) needs transformers' tokenizer: the folder's
# SentencePiece model is written instead, as the converter does for qwen2 and qwen3.
from conversion import base
def _sentencepiece_instead(self):
    self._set_vocab_sentencepiece()
base.TextModel._set_vocab_gpt2 = _sentencepiece_instead
runpy.run_path(script, run_name="__main__")
EOF
"$py" - "$root/README.md" "$work/tokenizer" <<'EOF'
import sys, sentencepiece as spm
spm.SentencePieceTrainer.train(input=sys.argv[1], model_prefix=sys.argv[2], vocab_size=400, model_type="unigram",
                               num_threads=1, character_coverage=1.0, hard_vocab_limit=False,
                               normalization_rule_name="identity", minloglevel=2,
                               user_defined_symbols=["<|endoftext|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>",
                                                     "<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>"])
EOF

# 3. llama.cpp's CPU library and the logits program
if [ ! -f "$work/llamacpp_logits" ] || [ "$root/tools/llamacpp_logits.c" -nt "$work/llamacpp_logits" ]; then
  if [ "${LLAMACPP_FROM_SOURCE:-0}" = 1 ]; then
    launcher=()
    command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
    cmake -S "$lc" -B "$lc/build-cpu" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF "${launcher[@]}" >"$work/cmake.log"
    cmake --build "$lc/build-cpu" -j "$(nproc)" --target llama >"$work/build.log"
    lib() { find "$lc/build-cpu" -name "lib$1.a" | head -n 1; }
    cc -O2 -o "$work/llamacpp_logits" "$root/tools/llamacpp_logits.c" -I"$lc/include" -I"$lc/ggml/include" \
      "$(lib llama)" "$(lib ggml)" "$(lib ggml-cpu)" "$(lib ggml-base)" -lstdc++ -lm -lpthread
    : >"$work/backends"
  else
    bins=$work/prebuilt/package/bins/linux-x64
    if [ ! -f "$bins/_nlcBuildMetadata.json" ]; then
      rm -rf "$work/prebuilt" && mkdir -p "$work/prebuilt"
      (cd "$work/prebuilt" && npm pack --silent @node-llama-cpp/linux-x64@3.21.1 >/dev/null && tar xzf ./*.tgz)
    fi
    grep -q '"gpu":false' "$bins/_nlcBuildMetadata.json" || { echo "$bins: not a CPU build" >&2; exit 1; }
    cc -O2 -o "$work/llamacpp_logits" "$root/tools/llamacpp_logits.c" -I"$lc/include" -I"$lc/ggml/include" \
      "$bins"/libllama.v*.so "$bins"/libggml.v*.so "$bins/libggml-base.so" -Wl,-rpath,"$bins"
    echo "$bins" >"$work/backends"
  fi
fi
export LLAMACPP_BACKENDS
LLAMACPP_BACKENDS=$(cat "$work/backends")

# 4. convert, compute, record
rm -f "$out"/*.gguf "$out"/*.logits
manifest=$work/manifest.lines
: >"$manifest"
for fam in "${families[@]}"; do
  src=$root/tests/fixtures/golden/$fam-f32
  dir=$work/hf/$fam
  rm -rf "$dir" && mkdir -p "$dir" && cp "$src"/config.json "$src"/model.safetensors "$dir"/
  [ -f "$src/generation_config.json" ] && cp "$src/generation_config.json" "$dir"/
  cp "$work/tokenizer.model" "$dir/tokenizer.model"
  prompt=1
  [ "$fam" = qwen3_moe ] && prompt=0 # the second prompt meets a near-tie of two experts (see the header)
  ids=$("$py" -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompts"][int(sys.argv[2])])))' \
    "$src/golden.json" "$prompt")
  for t in "${types[@]}"; do
    name=$fam-$t
    if ! PYTHONPATH=$work/shim "$py" "$work/shim/run_convert.py" "$lc/convert_hf_to_gguf.py" "$dir" --outtype "$t" \
         --outfile "$out/$name.gguf" >"$work/$name.convert.log" 2>&1; then
      why=$(grep -E 'Error|error' "$work/$name.convert.log" | tail -n 1)
      printf '%s\t%s\t%s\tconvert_hf_to_gguf.py: %s\n' "$fam" "$t" "$ids" "$why" >>"$manifest"
      rm -f "$out/$name.gguf"
      continue
    fi
    if ! "$work/llamacpp_logits" "$out/$name.gguf" "$ids" "$out/$name.logits" 2>"$work/$name.logits.log"; then
      printf '%s\t%s\t%s\tllama.cpp: %s\n' "$fam" "$t" "$ids" "$(tail -n 1 "$work/$name.logits.log")" >>"$manifest"
      rm -f "$out/$name.logits"
      continue
    fi
    printf '%s\t%s\t%s\t\n' "$fam" "$t" "$ids" >>"$manifest"
  done
done
# The block types of llama.cpp's quantized files, which need rows of 256 (the golden models' are 64
# wide): a random llama 256 wide (one layer, tied embeddings, written here with numpy as
# save_pretrained lays it out), converted to f32 and quantized by llama.cpp's own quantizer
# (llama_model_quantize, what llama-quantize runs), each type against llama.cpp's logits.
dir=$work/hf/llama256
rm -rf "$dir" && mkdir -p "$dir" && cp "$work/tokenizer.model" "$dir/"
"$py" - "$dir" <<'EOF'
import json, struct, sys
import numpy as np
d = sys.argv[1]
H, F, V, heads, kv = 256, 256, 512, 4, 2
hd = H // heads
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": F,
       "num_hidden_layers": 1, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
       "vocab_size": V, "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
       "tie_word_embeddings": True, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
json.dump(cfg, open(d + "/config.json", "w"), indent=1)
rng = np.random.default_rng(256)
def mat(r, c, s): return (rng.standard_normal((r, c)) * s).astype(np.float32)
def vec(n): return (1 + rng.standard_normal(n) * 0.1).astype(np.float32)
t = {"model.embed_tokens.weight": mat(V, H, 0.1), "model.norm.weight": vec(H)}
p = "model.layers.0."
t.update({p + "input_layernorm.weight": vec(H), p + "post_attention_layernorm.weight": vec(H),
          p + "self_attn.q_proj.weight": mat(heads * hd, H, 0.06), p + "self_attn.k_proj.weight": mat(kv * hd, H, 0.06),
          p + "self_attn.v_proj.weight": mat(kv * hd, H, 0.06), p + "self_attn.o_proj.weight": mat(H, heads * hd, 0.06),
          p + "mlp.gate_proj.weight": mat(F, H, 0.06), p + "mlp.up_proj.weight": mat(F, H, 0.06),
          p + "mlp.down_proj.weight": mat(H, F, 0.06)})
header, off, blobs = {}, 0, []
for name in sorted(t):
    b = t[name].tobytes()
    header[name] = {"dtype": "F32", "shape": list(t[name].shape), "data_offsets": [off, off + len(b)]}
    off += len(b)
    blobs.append(b)
header["__metadata__"] = {"format": "pt"}
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * (-len(h) % 8)
with open(d + "/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
EOF
ids=$("$py" -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["prompts"][1])))' \
  "$root/tests/fixtures/golden/llama-f32/golden.json")
PYTHONPATH=$work/shim "$py" "$work/shim/run_convert.py" "$lc/convert_hf_to_gguf.py" "$dir" --outtype f32 \
  --outfile "$work/llama256-f32.gguf" >"$work/llama256.convert.log" 2>&1
for t in q4_0 q5_0 q5_1 iq4_nl q2_k q3_k_m q4_k_m q5_k_m q6_k iq4_xs; do
  name=llama256-$t
  if ! "$work/llamacpp_logits" --quantize "$work/llama256-f32.gguf" "$out/$name.gguf" "$t" 2>"$work/$name.quantize.log"; then
    printf '%s\t%s\t%s\tllama.cpp: %s\n' llama256 "$t" "$ids" "$(tail -n 1 "$work/$name.quantize.log")" >>"$manifest"
    continue
  fi
  if ! "$work/llamacpp_logits" "$out/$name.gguf" "$ids" "$out/$name.logits" 2>"$work/$name.logits.log"; then
    printf '%s\t%s\t%s\tllama.cpp: %s\n' llama256 "$t" "$ids" "$(tail -n 1 "$work/$name.logits.log")" >>"$manifest"
    rm -f "$out/$name.logits"
    continue
  fi
  printf '%s\t%s\t%s\t\n' llama256 "$t" "$ids" >>"$manifest"
done

how="npm @node-llama-cpp/linux-x64@3.21.1"
[ -z "$LLAMACPP_BACKENDS" ] && how="built from the bundle"
"$py" - "$manifest" "$out/manifest.json" "$commit" "$how" <<'EOF'
import json, os, sys
# What the repository keeps (it travels to the GPU machine, whose working tree is limited): one f32 file
# for the strict check, the layouts llama.cpp writes its own way (gemma2, gemma3, phi3), granite's multipliers and the ones
# whose f32 file is too big to keep (qwen2: biases, qwen3_moe: experts) in f16, q8_0 on two more families,
# five block types of llama256; of each, the logits of the last LOGIT_ROWS positions.
KEEP = {"llama-f32", "gemma2-f16", "gemma3-f16", "phi3-f16", "qwen2-f16", "qwen3_moe-f16", "granite-f16", "qwen3-q8_0", "mistral-q8_0",
        "llama256-q4_0", "llama256-q4_k_m", "llama256-q6_k", "llama256-q2_k", "llama256-iq4_xs"}
LOGIT_ROWS, VOCAB = 10, 512
out = os.path.dirname(sys.argv[2])
files = []
for line in open(sys.argv[1], encoding="utf-8"):
    fam, typ, ids, err = line.rstrip("\n").split("\t")
    name = f"{fam}-{typ}"
    e = {"family": fam, "type": typ, "ids": [int(x) for x in ids.split(",")]}
    if err:
        e["refused"] = err
    elif name not in KEEP:
        for ext in (".gguf", ".logits"):
            os.remove(os.path.join(out, name + ext))
        continue
    else:
        e["gguf"], e["logits"], e["logit_rows"] = name + ".gguf", name + ".logits", LOGIT_ROWS
        path = os.path.join(out, name + ".logits")
        data = open(path, "rb").read()
        open(path, "wb").write(data[len(data) - 4 * VOCAB * LOGIT_ROWS:])
    files.append(e)
doc = {"source": "node-llama-cpp@3.21.1 gitRelease.bundle", "llama_cpp_commit": sys.argv[3],
       "converter": "convert_hf_to_gguf.py (config.json read as it is; Debian torch 1.13)",
       "reference": "llama.cpp CPU build (" + sys.argv[4] + "): one decode, 1 thread, f32 KV cache, no flash attention",
       "golden": "tests/fixtures/golden/FAMILY-f32, prompts[1] (qwen3_moe: prompts[0])", "files": files}
json.dump(doc, open(sys.argv[2], "w"), indent=1)
EOF
ls -la "$out"
