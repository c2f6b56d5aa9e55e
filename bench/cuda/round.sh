#!/usr/bin/env bash
# round.sh — one GPU call that checks and measures, phase by phase, inside a
# time limit (each phase runs only while enough of the call is left, and
# every log lands under OUT as it is written, so a call stopped at its limit
# still returns what it did):
#   1. the op harness on the device (every kernel against the CPU reference),
#      and `generate` / `bench` / `serve` on every golden model
#      (tools/gpu_verbs.sh); the trainer's adapters loaded in PEFT
#      (tools/check_peft_load.sh) and PEFT's own training reference
#      (tools/gen_train_ref.py; SKIP_PEFT=1 skips both) — while llama.cpp's
#      CUDA build runs beside them (bench/cuda/llamacpp.sh build, where
#      LLAMA_SRC names its tarball);
#   2. batch 1 on random Llama-3.1-8B-geometry GGUF files (TYPES):
#      `hearth bench -p 512 -n 128` under --gpu-precision fast, and
#      `llama-bench -p 512 -n 128 -ngl 99 -fa 1` on the same file;
#   3. serving 128 in / 128 out at 256 concurrent on the F16 file:
#      `hearth serve` + bench/serve_load beside `llama-batched-bench`.
# Prints Markdown rows as it goes; summary.md under OUT holds them all.
#
#   bench/cuda/round.sh BUNDLE_DIR OUT [DIR (/tmp)]
#
# Environment: LIMIT (seconds the call may take, default 570), TYPES
# (default "f16 q8_0 q4_k q4_0"), LLAMA_SRC (the trimmed llama.cpp tarball),
# VERBS_MODELS (a glob of golden folders; default all), SKIP_OPS=1, SKIP_VERBS=1, OPS_TIMEOUT and
# VERBS_TIMEOUT (seconds; 200 and 240),
# SUMMARY (where the Markdown summary goes; default OUT/summary.md), PROFILE_TYPES (the files whose
# batch-1 decode gets a CUDA op profile; default q8_0, "" for none).
set -uo pipefail
b=$(realpath "$1") out=$(realpath -m "$2") d=${3:-/tmp}
root=$(cd "$(dirname "$0")/../.." && pwd) T0=$SECONDS LIMIT=${LIMIT:-570}
TYPES=${TYPES:-"f16 q8_0 q4_k q4_0"}
mkdir -p "$out" "$d"
export LD_LIBRARY_PATH="$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
sum=${SUMMARY:-$out/summary.md}
say() { echo "$*" | tee -a "$sum"; }
left() { echo $((LIMIT - (SECONDS - T0))); }
t() { say "<!-- t=$((SECONDS - T0)) s: $* -->"; }
say "# $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
src=$(cat "$b/source_dir")
[ "$src" = "$root" ] || [ -e "$src" ] || { mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"; }
ll=""
if [ -x "$d/llama/bin/llama-bench" ]; then
  ll=$d/llama/bin # built by an earlier call on this machine
elif [ -n "${LLAMA_SRC:-}" ] && [ -f "$LLAMA_SRC" ]; then
  setsid nice -n 5 bash "$root/bench/cuda/llamacpp.sh" build "$LLAMA_SRC" "$d/llama" >"$out/llama-build.log" 2>&1 &
  llpid=$!
  ll=$d/llama/bin
fi
for ty in $TYPES; do [ -s "$d/l8b-$ty.gguf" ] || "$b/gen_random_gguf" "$d/l8b-$ty.gguf" "$ty" 8b 32 0 32000 >"$out/gen-$ty.log" 2>&1 & done

# 1. correctness
if [ -z "${SKIP_OPS:-}" ]; then
  HEARTH_TEST_REQUIRE_CUDA=1 timeout "${OPS_TIMEOUT:-200}" "$b/backend_test_backend_ops" >"$out/ops.log" 2>&1
  say "op harness rc=$?: $(tail -n 1 "$out/ops.log")"
  grep -E "FAIL" "$out/ops.log" | head -n 20 | tee -a "$sum"
fi
if [ -z "${SKIP_VERBS:-}" ]; then
  GPU_VERBS_MODELS=${VERBS_MODELS:-*} timeout "${VERBS_TIMEOUT:-240}" bash -O extglob "$root/tools/gpu_verbs.sh" "$b/hearth" cuda "$out/verbs" >"$out/verbs.log" 2>&1
  say "verbs rc=$?: $(grep -c PASS "$out/verbs.log") PASS, $(grep -c FAIL "$out/verbs.log") FAIL"
  grep FAIL "$out/verbs.log" | head -n 20 | tee -a "$sum"
fi
# the trainer's adapters in PEFT, and PEFT's own training reference (host work: torch, transformers, peft are here)
if [ -z "${SKIP_PEFT:-}" ]; then
  timeout 120 bash "$root/tools/check_peft_load.sh" "$b/hearth" "$out/peft" >"$out/peft.log" 2>&1
  say "peft load rc=$?: $(tail -n 1 "$out/peft.log")"
  grep FAIL "$out/peft.log" | head -n 8 | tee -a "$sum"
  timeout 120 python3 "$root/tools/gen_train_ref.py" "$out/train_ref" >"$out/train_ref.log" 2>&1
  say "PEFT training reference rc=$?: $(tail -n 1 "$out/train_ref.log") (commit $out/train_ref/llama-f32 as tests/fixtures/train/llama-f32)"
fi
t "correctness done"
pending=$(jobs -p | grep -v "^${llpid:-x}$")
[ -z "$pending" ] || wait $pending 2>/dev/null
t "files made"

# 2. batch 1, hearth then llama.cpp on each file
num() { awk -v k="$1" '$1 == k {print $2}'; }
rows=()
for ty in $TYPES; do
  [ "$(left)" -gt 200 ] || break
  f=$d/l8b-$ty.gguf
  a=$("$b/hearth" bench --model "$f" --device cuda --gpu-precision fast -p 512 -n 128 --repeat 2 --roofline 2>&1 | tee "$out/hearth-$ty.txt")
  roof=$(echo "$a" | grep -o '[0-9.]*% of the [0-9.]* GB/s copy bandwidth' | head -n 1)
  rows+=("$ty|$(echo "$a" | num pp512)|$(echo "$a" | num tg128)|${roof:-}")
  say "<!-- hearth $ty: $(echo "$a" | num pp512) / $(echo "$a" | num tg128) -->"
done
t "hearth batch 1 done"
# the Q4_K GEMV that reads straight from global memory, beside the staged one measured above
if [ -s "$d/l8b-q4_k.gguf" ] && [ "$(left)" -gt 240 ]; then
  a=$(HEARTH_CUDA_Q4K=direct "$b/hearth" bench --model "$d/l8b-q4_k.gguf" --device cuda --gpu-precision fast -p 0 -n 128 \
    --repeat 2 --roofline 2>&1 | tee "$out/hearth-q4_k-direct.txt")
  say "<!-- hearth q4_k with HEARTH_CUDA_Q4K=direct: tg128 $(echo "$a" | num tg128); $(echo "$a" | grep -o '[0-9.]*% of the [0-9.]* GB/s copy bandwidth' | head -n 1) -->"
fi
# where a decoded token's time goes: the CUDA op profile (device time per op, idle gaps) of batch 1 at 512 of context
for ty in ${PROFILE_TYPES-q8_0}; do
  [ -s "$d/l8b-$ty.gguf" ] && [ "$(left)" -gt 220 ] || continue
  HEARTH_CUDA_PROFILE="$out/prof-tg-$ty.txt" timeout 60 "$b/hearth" bench --model "$d/l8b-$ty.gguf" --device cuda --gpu-precision fast \
    -p 0 -n 32 -d 512 --repeat 1 --no-warmup >"$out/prof-bench-$ty.txt" 2>&1
  say "<!-- op profile, $ty batch 1: -->"; head -n 30 "$out/prof-tg-$ty.txt" | sed 's/^/    /' | tee -a "$sum" >/dev/null
done
t "profiled"
if [ -n "$ll" ]; then
  while [ ! -x "$ll/llama-bench" ] && kill -0 "$llpid" 2>/dev/null && [ "$(left)" -gt 150 ]; do sleep 5; done
  t "llama.cpp: $(ls "$ll" 2>/dev/null | tr '\n' ' ')"
fi
say ""
say "| file | hearth pp512 | llama.cpp pp512 | hearth tg128 | llama.cpp tg128 | hearth tg: share of copy bandwidth |"
say "|---|---|---|---|---|---|"
for r in "${rows[@]}"; do
  IFS='|' read -r ty hpp htg roof <<<"$r"
  lpp="" ltg=""
  if [ -x "$ll/llama-bench" ] && [ "$(left)" -gt 100 ]; then
    l=$(LD_LIBRARY_PATH="$ll:$LD_LIBRARY_PATH" "$ll/llama-bench" -m "$d/l8b-$ty.gguf" -p 512 -n 128 -ngl 99 -fa 1 -r 2 -o csv 2>"$out/llama-$ty.err" | tee "$out/llama-$ty.csv")
    lpp=$(echo "$l" | awk -F, 'NR > 1 && $0 ~ /"512","0"/ {gsub(/"/, "", $(NF-1)); print $(NF-1)}' | head -n 1)
    ltg=$(echo "$l" | awk -F, 'NR > 1 && $0 ~ /"0","128"/ {gsub(/"/, "", $(NF-1)); print $(NF-1)}' | head -n 1)
  fi
  say "| $ty | $hpp | ${lpp:--} | $htg | ${ltg:--} | $roof |"
done
t "batch 1 done"

# 3. serving on the F16 file
f=$d/l8b-f16.gguf
if [ -s "$f" ] && [ "$(left)" -gt 90 ]; then
  "$b/hearth" serve --model "$f" --device cuda --gpu-precision fast --port 0 --max-batch 256 2>"$out/serve.log" &
  sp=$!
  for _ in $(seq 600); do grep -q "listening on" "$out/serve.log" && break; kill -0 $sp 2>/dev/null || break; sleep 0.2; done
  url=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$out/serve.log" | head -n 1)
  if [ -n "$url" ]; then
    "$b/serve_load" --url "$url" --concurrency 4 --requests 8 --input 64 --output 16 --seed 1 >/dev/null 2>&1
    r=$(timeout $(($(left) - 40)) "$b/serve_load" --url "$url" --label "c256" --concurrency 256 --requests 512 --input 128 --output 128 \
      --token-events 1 --seed 7 2>>"$out/serve_load.err" | tee -a "$out/serve.jsonl")
    say "hearth serve c256 128/128: $r"
  fi
  kill -TERM $sp 2>/dev/null; wait $sp 2>/dev/null
  t "hearth served"
  if [ -x "$ll/llama-batched-bench" ] && [ "$(left)" -gt 45 ]; then
    LD_LIBRARY_PATH="$ll:$LD_LIBRARY_PATH" timeout $(($(left) - 10)) "$ll/llama-batched-bench" -m "$f" -ngl 99 -fa 1 \
      -c $((256 * 256 + 512)) -b 2048 -ub 512 -npp 128 -ntg 128 -npl 256 >"$out/batched.txt" 2>"$out/batched.err"
    say "llama-batched-bench npl 256: $(grep -E '^\|' "$out/batched.txt" | tail -n 1)"
  fi
fi
t "end"
