#!/usr/bin/env bash
# peers.sh — hearth beside llama.cpp's CUDA build on one GPU, in one run, on
# the same random GGUF files in Llama-3.1-8B's geometry (32 layers, hidden
# 4096, 32 / 8 heads of 128, FFN 14336) with a 32,000-token vocabulary
# (tools/gen_random_gguf 8b 32 0 32000; 7.1 B parameters):
#   batch 1, for each of TYPES (f16 q8_0 q4_0 q4_k): `hearth bench -p 512
#   -n 128` in the default precision and with --gpu-precision fast (and the
#   same with OLD, an earlier build's hearth, where given) beside
#   `llama-bench -p 512 -n 128 -ngl 99 -fa 1`;
#   serving, on the F16 file: `llama-batched-bench -npp 128 -ntg 128 -npl
#   1,32,128,256` beside `hearth serve --gpu-precision fast` driven by
#   bench/serve_load at the same concurrencies, 128 in / 128 out.
# Prints Markdown tables last; logs under OUT.
#
#   bench/cuda/peers.sh HEARTH LLAMA_BIN_DIR SERVE_LOAD OUT [OLD_HEARTH]
#
# HEARTH: the hearth binary (libhearth_cuda.so beside it); LLAMA_BIN_DIR: what
# bench/cuda/llamacpp.sh build made; GGUF files are made in $BENCH_DIR
# (default /tmp) by tools/gen_random_gguf (GEN, default beside HEARTH) unless there.
set -uo pipefail
h=$1 ll=$2 sl=$3 out=$4 old=${5:-}
root=$(cd "$(dirname "$0")/../.." && pwd)
d=${BENCH_DIR:-/tmp} TYPES=${TYPES:-"f16 q8_0 q4_0 q4_k"} R=${R:-3} NPL=${NPL:-"1 32 128 256"}
gen=${GEN:-$(dirname "$h")/gen_random_gguf}
mkdir -p "$out"
export LD_LIBRARY_PATH="$ll${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for t in $TYPES; do [ -s "$d/l8b-$t.gguf" ] || "$gen" "$d/l8b-$t.gguf" "$t" 8b 32 0 32000 >/dev/null; done
num() { awk -v k="$1" '$1 == k {print $2}'; }
rows=()
for t in $TYPES; do
  f=$d/l8b-$t.gguf
  a=$("$h" bench --model "$f" --device cuda -p 512 -n 128 --repeat "$R" --roofline 2>&1 | tee "$out/hearth-$t.txt")
  b=$("$h" bench --model "$f" --device cuda --gpu-precision fast -p 512 -n 128 --repeat "$R" 2>&1 | tee "$out/hearth-fast-$t.txt")
  o_pp="" o_tg=""
  if [ -n "$old" ]; then
    c=$("$old" bench --model "$f" --device cuda --gpu-precision fast -p 512 -n 128 --repeat "$R" 2>&1 | tee "$out/old-fast-$t.txt")
    o_pp=$(echo "$c" | num pp512) o_tg=$(echo "$c" | num tg128)
  fi
  l=$("$ll/llama-bench" -m "$f" -p 512 -n 128 -ngl 99 -fa 1 -r "$R" -o csv 2>"$out/llama-$t.err" | tee "$out/llama-$t.csv")
  l_pp=$(echo "$l" | awk -F, 'NR > 1 && $0 ~ /"512","0"/ {gsub(/"/, "", $(NF-1)); print $(NF-1)}' | head -n 1)
  l_tg=$(echo "$l" | awk -F, 'NR > 1 && $0 ~ /"0","128"/ {gsub(/"/, "", $(NF-1)); print $(NF-1)}' | head -n 1)
  roof=$(echo "$a" | grep -o '[0-9.]*% of the [0-9.]* GB/s copy bandwidth' | head -n 1)
  rows+=("| $t | $(echo "$a" | num pp512) | $(echo "$b" | num pp512) | ${o_pp:--} | ${l_pp:-?} | $(echo "$a" | num tg128) | $(echo "$b" | num tg128) | ${o_tg:--} | ${l_tg:-?} | ${roof:-} |")
done
# serving: llama-batched-bench and hearth serve + serve_load, on the F16 file
f=$d/l8b-f16.gguf
npl=$(echo $NPL | tr ' ' ',')
"$ll/llama-batched-bench" -m "$f" -ngl 99 -fa 1 -c $((256 * 256 + 512)) -b 2048 -ub 512 -npp 128 -ntg 128 -npl "$npl" \
  >"$out/batched.txt" 2>"$out/batched.err"
"$h" serve --model "$f" --device cuda --gpu-precision fast --port 0 --max-batch 256 2>"$out/serve.log" &
sp=$!
for _ in $(seq 900); do grep -q "listening on" "$out/serve.log" && break; kill -0 $sp 2>/dev/null || break; sleep 0.2; done
url=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$out/serve.log" | head -n 1)
srows=()
if [ -n "$url" ]; then
  "$sl" --url "$url" --concurrency 4 --requests 8 --input 64 --output 16 --seed 1 >/dev/null 2>&1
  for c in $NPL; do
    n=$((c < 4 ? 4 : 2 * c))
    r=$("$sl" --url "$url" --label "c$c" --concurrency "$c" --requests "$n" --input 128 --output 128 --token-events 1 --seed $((100 + c)) 2>>"$out/serve_load.err" | tee -a "$out/serve.jsonl")
    lb=$(awk -v c="$c" '$1 ~ /^\|/ && $6 == c {print $0}' "$out/batched.txt" | head -n 1)
    srows+=("| $c | $(echo "$r" | python3 -c 'import json,sys; d=json.loads(sys.stdin.readline()); print("%.0f | %.0f / %.0f" % (d.get("output_tok_s", 0), d.get("ttft_ms", {}).get("p50", 0), d.get("itl_ms", {}).get("p50", 0)))' 2>/dev/null || echo "? | ?") | $(echo "$lb" | awk -F'|' '{gsub(/ /, "", $0); print $0}') |")
  done
fi
kill -TERM $sp 2>/dev/null; wait $sp 2>/dev/null
echo
echo "## batch 1 (tokens/s; $(cat "$out/gpu.txt"))"
echo "| file | hearth pp512 | hearth fast pp512 | old fast pp512 | llama.cpp pp512 | hearth tg128 | hearth fast tg128 | old fast tg128 | llama.cpp tg128 | hearth tg share of copy bandwidth (weights) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "## serving 128/128 on F16 (hearth: output tok/s, TTFT / ITL p50 ms; llama-batched-bench row: PP TG B N_KV T_PP S_PP T_TG S_TG T S)"
printf '%s\n' "${srows[@]}"
cat "$out/batched.txt" | grep -E '^\|' | head -n 12
