#!/usr/bin/env bash
# decode_profile.sh — where a token's time goes on one GPU: the CUDA op
# profile (HEARTH_CUDA_PROFILE) of batch-1 decode at 1,024 tokens of context
# for each of TYPES (random Llama-3.1-8B-geometry GGUF files, 32k vocabulary,
# made by tools/gen_random_gguf in DIR unless there), of one 2,048-token
# prefill, and Nsight Compute (ncu, when present) on one launch each of the
# prompt-attention kernel, the decode-attention kernel and the Q4_K GEMV.
# Prints the head of each profile; everything is kept under OUT.
#
#   bench/cuda/decode_profile.sh BUNDLE_DIR OUT [DIR (/tmp)]
#
# BUNDLE_DIR: what tools/gpu_check.sh --prepare packs (hearth,
# libhearth_cuda.so, gen_random_gguf, lib/).
set -uo pipefail
b=$(realpath "$1") out=$2 d=${3:-/tmp}
TYPES=${TYPES:-"q4_k q8_0 f16"} P=${P:---gpu-precision fast}
mkdir -p "$out" "$d"
export LD_LIBRARY_PATH="$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for t in $TYPES; do [ -s "$d/l8b-$t.gguf" ] || "$b/gen_random_gguf" "$d/l8b-$t.gguf" "$t" 8b 32 0 32000 >/dev/null & done
wait
# shellcheck disable=SC2086
for t in $TYPES; do
  HEARTH_CUDA_PROFILE="$out/prof-tg-$t.txt" "$b/hearth" bench --model "$d/l8b-$t.gguf" --device cuda $P -p 0 -n 64 -d 1024 \
    --repeat 1 --no-warmup --roofline >"$out/bench-tg-$t.txt" 2>&1
  "$b/hearth" bench --model "$d/l8b-$t.gguf" --device cuda $P -p 512 -n 128 --repeat 1 --roofline >"$out/bench-$t.txt" 2>&1
  echo "== $t: $(grep -E '^(pp|tg)' "$out/bench-$t.txt" | tr '\n' ' ') $(grep -o '[0-9.]*% of the [0-9.]* GB/s[^,;]*' "$out/bench-$t.txt" | head -n 1)"
  head -n 40 "$out/prof-tg-$t.txt"
done
t1=$(echo $TYPES | awk '{print $NF}')
# shellcheck disable=SC2086
HEARTH_CUDA_PROFILE="$out/prof-pp-$t1.txt" "$b/hearth" bench --model "$d/l8b-$t1.gguf" --device cuda $P -p 2048 -n 0 --repeat 1 \
  --no-warmup >"$out/bench-pp-$t1.txt" 2>&1
echo "== prefill 2048, $t1: $(grep -E '^pp' "$out/bench-pp-$t1.txt")"
head -n 25 "$out/prof-pp-$t1.txt"
if command -v ncu >/dev/null; then
  nc() { # name, kernel regex, bench args...
    local n=$1 k=$2; shift 2
    # shellcheck disable=SC2086
    timeout 90 ncu --kernel-name "regex:$k" --launch-skip 3 --launch-count 1 --section SpeedOfLight --section Occupancy \
      --section LaunchStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats \
      "$b/hearth" bench --device cuda $P --repeat 1 --no-warmup "$@" >"$out/ncu-$n.txt" 2>&1
    echo "== ncu $n"; grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Block Limit|Theoretical Occ|Stall|One or More|Executed Ipc" "$out/ncu-$n.txt" | head -n 24
  }
  nc attn-prefill attn_flash --model "$d/l8b-$t1.gguf" -p 2048 -n 0
  nc attn-decode attn_decode --model "$d/l8b-$t1.gguf" -p 0 -n 8 -d 4096
  case " $TYPES " in *" q4_k "*) nc gemv-q4k 'gemv_q4k' --model "$d/l8b-q4_k.gguf" -p 0 -n 8 ;; esac
fi
