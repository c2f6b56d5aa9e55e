#!/usr/bin/env bash
# kernels_round.sh — one short GPU call for the matmul kernels: the op harness
# (every format's GEMV and GEMM paths against the reference, the f16
# tensor-core path in both precisions, the integer GEMVs), `generate`,
# `bench` and `serve` on some golden models (tools/gpu_verbs.sh), and
# pp512 / tg128 on random Llama-3.1-8B-geometry GGUF files (32k vocabulary)
# with this build in both precisions beside an earlier build's CUDA library
# (OLD_LIB: its libhearth_cuda.so, run by this hearth binary).
#
#   OLD_LIB=old/libhearth_cuda.so bench/cuda/kernels_round.sh BUNDLE_DIR OUT
set -uo pipefail
b=$1 out=$2 root=$(cd "$(dirname "$0")/../.." && pwd)
TYPES=${TYPES:-"f16 q8_0 q4_k"} R=${R:-1}
mkdir -p "$out"
export LD_LIBRARY_PATH="$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
(for t in $TYPES; do [ -s /tmp/l8b-$t.gguf ] || "$b/gen_random_gguf" /tmp/l8b-$t.gguf $t 8b 32 0 32000; done >"$out/gen.log" 2>&1) &
gen=$!
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
src=$(cat "$b/source_dir")
[ "$src" = "$root" ] || [ -e "$src" ] || { mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"; }
HEARTH_TEST_REQUIRE_CUDA=1 "$b/backend_test_backend_ops" >"$out/ops.log" 2>&1; echo "op harness rc=$?: $(tail -n 1 "$out/ops.log")"
grep -E "^FAIL|^(matmul|op) " "$out/ops.log" | head -n 40
GPU_VERBS_MODELS=${GPU_VERBS_MODELS:-"@(qwen3_5*|llama-f32|gemma4-f32|glm5-f32)"} bash -O extglob "$root/tools/gpu_verbs.sh" "$b/hearth" cuda "$out/verbs" >"$out/verbs.log" 2>&1
echo "verbs rc=$?"; grep -v " PASS " "$out/verbs.log" | head -n 20
wait $gen
old=""
if [ -n "${OLD_LIB:-}" ]; then mkdir -p /tmp/oldh && cp "$b/hearth" /tmp/oldh/ && cp "$OLD_LIB" /tmp/oldh/ && old=/tmp/oldh/hearth; fi
echo "| file | pp512 exact | pp512 fast | pp512 fast, earlier build | tg128 exact | tg128 fast | tg128 fast, earlier build |"
echo "|---|---|---|---|---|---|---|"
for t in $TYPES; do
  f=/tmp/l8b-$t.gguf
  a=$("$b/hearth" bench --model $f --device cuda -p 512 -n 128 --repeat $R 2>&1 | tee "$out/bench-$t.txt")
  c=$("$b/hearth" bench --model $f --device cuda --gpu-precision fast -p 512 -n 128 --repeat $R --roofline 2>&1 | tee "$out/bench-fast-$t.txt")
  o="- -"
  [ -z "$old" ] || o=$("$old" bench --model $f --device cuda --gpu-precision fast -p 512 -n 128 --repeat $R 2>&1 | tee "$out/bench-old-$t.txt" | awk '/^pp512|^tg128/ {printf "%s ", $2}')
  v() { echo "$1" | awk -v k=$2 '$1 == k {print $2}'; }
  echo "| $t | $(v "$a" pp512) | $(v "$c" pp512) | $(echo $o | cut -d' ' -f1) | $(v "$a" tg128) | $(v "$c" tg128) | $(echo $o | cut -d' ' -f2) |"
  grep roofline "$out/bench-fast-$t.txt" | head -n 1
done
