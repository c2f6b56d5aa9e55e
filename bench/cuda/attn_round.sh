#!/usr/bin/env bash
# attn_round.sh — one GPU call for the prompt attention on tensor cores and
# what bounds a decoded token: the op harness (every attention variant and KV
# format against the reference, in both precisions) and the scheduler test on
# the device, generate / bench / serve on a few golden models (greedy ids
# against the CPU's); prefill of 512 / 2,048 tokens and serving (128 in / 128
# out at 256 concurrent, 32 concurrent 1,024-token prompts) with this build
# and an earlier build's CUDA library (OLD_LIB, run by this hearth binary) on
# the same random Llama-3.1-8B-geometry F16 GGUF, both under
# --gpu-precision fast; batch-1 decode with and without the stacked
# projections; serving again with the 8-bit KV cache; then, while
# the call has time, the batch-1 op profiles of bench/cuda/decode_profile.sh.
#
#   bench/cuda/attn_round.sh BUNDLE_DIR OLD_LIB OUT [DIR (/tmp)]
set -uo pipefail
b=$(realpath "$1") oldlib=$(realpath "$2") out=$(realpath -m "$3") d=${4:-/tmp}
root=$(cd "$(dirname "$0")/../.." && pwd) T0=$SECONDS
mkdir -p "$out" "$d"
export LD_LIBRARY_PATH="$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t() { echo "## t=$((SECONDS - T0)) s: $*"; }
for ty in ${GEN_TYPES:-f16 q4_k}; do [ -s "$d/l8b-$ty.gguf" ] || "$b/gen_random_gguf" "$d/l8b-$ty.gguf" "$ty" 8b 32 0 32000 >"$out/gen-$ty.log" 2>&1 & done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
src=$(cat "$b/source_dir")
[ "$src" = "$root" ] || [ -e "$src" ] || { mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"; }
HEARTH_TEST_REQUIRE_CUDA=1 "$b/backend_test_backend_ops" >"$out/ops.log" 2>&1; echo "op harness rc=$?: $(tail -n 1 "$out/ops.log")"
grep -E "^FAIL|^attention" "$out/ops.log" | head -n 30
[ -z "${SCHED:-}" ] || { HEARTH_TEST_DEVICE=cuda "$b/engine_test_sched" >"$out/sched.log" 2>&1; echo "engine_test_sched rc=$?: $(tail -n 1 "$out/sched.log")"; }
GPU_VERBS_MODELS=${GPU_VERBS_MODELS:-"@(llama-f32|qwen3-bf16|gemma3-f32|phi3-f32|mistral-bf16)"} bash -O extglob "$root/tools/gpu_verbs.sh" "$b/hearth" cuda "$out/verbs" >"$out/verbs.log" 2>&1
echo "verbs rc=$?"; cat "$out/verbs.log" | head -n 12
wait
t "files made"
mkdir -p /tmp/oldh && cp "$b/hearth" /tmp/oldh/ && cp "$oldlib" /tmp/oldh/libhearth_cuda.so
f=$d/l8b-f16.gguf
pp() { "$1" bench --model "$f" --device cuda --gpu-precision fast -p "$2" -n 0 --repeat 2 2>&1 | awk -v k="pp$2" '$1 == k {print $2}'; }
echo "| prompt tokens (F16, fast) | pp tok/s, this build | pp tok/s, earlier build |"
echo "|---|---|---|"
for p in 512 2048; do echo "| $p | $(pp "$b/hearth" $p) | $(pp /tmp/oldh/hearth $p) |"; done
t "prefill done"
serve_one() { # label, hearth, extra args...
  local l=$1 h=$2; shift 2
  "$h" serve --model "$f" --device cuda --gpu-precision fast --port 0 --max-batch 256 "$@" 2>"$out/serve-$l.log" &
  local sp=$!
  for _ in $(seq 600); do grep -q "listening on" "$out/serve-$l.log" && break; kill -0 $sp 2>/dev/null || break; sleep 0.2; done
  local url
  url=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$out/serve-$l.log" | head -n 1)
  if [ -n "$url" ]; then
    "$b/serve_load" --url "$url" --concurrency 4 --requests 8 --input 64 --output 16 --seed 1 >/dev/null 2>&1
    "$b/serve_load" --url "$url" --label "$l c256 128/128" --concurrency 256 --requests 512 --input 128 --output 128 \
      --token-events 1 --seed 7 2>>"$out/serve_load.err" | tee -a "$out/serve.jsonl"
    [ -z "${LONG_PROMPTS:-}" ] || "$b/serve_load" --url "$url" --label "$l c32 1024/16" --concurrency 32 --requests 64 \
      --input 1024 --output 16 --token-events 1 --seed 8 2>>"$out/serve_load.err" | tee -a "$out/serve.jsonl"
  fi
  kill -TERM $sp 2>/dev/null; wait $sp 2>/dev/null
  t "served $l"
}
# batch-1 decode with the stacked projections (q / k / v and gate / up as one matrix each) and without
echo "| file | tg128, stacked | tg128, HEARTH_STACK_PROJECTIONS=0 |"
echo "|---|---|---|"
for ty in q4_k f16; do
  tg() { "$b/hearth" bench --model "$d/l8b-$ty.gguf" --device cuda --gpu-precision fast -p 0 -n 128 --repeat 2 2>&1 | awk '$1 == "tg128" {print $2}'; }
  echo "| $ty | $(tg) | $(HEARTH_STACK_PROJECTIONS=0 tg) |"
done
t "stacked decode done"
serve_one new "$b/hearth"
serve_one old /tmp/oldh/hearth
[ -z "${KV8:-}" ] || serve_one new-kv8 "$b/hearth" --kv-quant 8
# what remains of a 10-minute call: the batch-1 decode op profiles (Q4_K first)
if [ $((SECONDS - T0)) -lt "${PROFILE_BEFORE:-420}" ]; then
  TYPES="${PROFILE_TYPES:-q4_k}" bash "$root/bench/cuda/decode_profile.sh" "$b" "$out/prof" "$d"
  t "profiles done"
fi
