#!/usr/bin/env bash
# profile_round.sh — one call on a GPU machine that measures what
# docs/BENCHMARKS.md's "The 256-row step profiled" section reports: the
# CUDA op harness and the scheduler test on the device, an 8B-shaped random
# bf16 model and its FP8 twin (tools/gen_random_model.py --dtype fp8),
# serving at 256 concurrent 128/128 and 32 concurrent 1,024-token prompts
# with the op profile (HEARTH_CUDA_PROFILE) and the engine trace
# (bench/cuda/trace_summary.py), FP8 decode against its byte roofline and
# prefill, Q4_K decode (tools/gen_random_gguf q4_k 8b) with this build's
# GEMV and a reference build's, decode at 1k and 32k of context, and the
# transformers peer (bench/cuda/peer_transformers.py).
#
#   BUNDLE=bundle.tar.xz bench/cuda/profile_round.sh OUT
#
# BUNDLE (default ./bundle.tar.xz) holds new/ (hearth,
# libhearth_cuda.so, backend_test_backend_ops, engine_test_sched built from
# this tree), old/ (hearth, libhearth_cuda.so, gen_random_gguf of the build
# compared against), serve_load and lib/ (the host libraries the GPU machine
# lacks; see tools/gpu_check.sh --prepare) and source_dir (the path the
# tests were built in: they read their fixtures there).
set -x
O=$1; root=$(cd "$(dirname "$0")/../.." && pwd); here=$root/bench/cuda; T0=$SECONDS
bundle=$(realpath "${BUNDLE:-bundle.tar.xz}"); mkdir -p "$O"; O=$(realpath "$O"); cd "$here"
t() { echo "## t=$((SECONDS - T0)) s: $*"; }
B=/tmp/hearth-bundle; rm -rf $B; mkdir -p $B && tar xJf "$bundle" -C $B
export LD_LIBRARY_PATH=$B/lib:${LD_LIBRARY_PATH:-}
src=$(cat $B/source_dir 2>/dev/null || echo "$root")
[ -e "$src" ] || { mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"; }
HEARTH_TEST_REQUIRE_CUDA=1 $B/new/backend_test_backend_ops > $O/ops_new.log 2>&1; echo "op harness rc=$?"
grep -E "^(matmul fp8|attention)|checks|FAIL" $O/ops_new.log | head -20
HEARTH_TEST_DEVICE=cuda $B/new/engine_test_sched > $O/sched_new.log 2>&1; echo "engine_test_sched rc=$?"; tail -1 $O/sched_new.log
M=/tmp/m8b; F=/tmp/m8b-fp8
python3 $root/tools/gen_random_model.py $M --shape llama-3.1-8b --dtype bf16 > $O/gen.log 2>&1 &
$B/old/gen_random_gguf /tmp/q4k8b.gguf q4_k 8b > $O/gen_q4k.log 2>&1 &
wait
cp $root/models/default/tokenizer.json $root/models/default/tokenizer_config.json $M/
t "bf16 + q4_k made"
serve_start() { # log, model, args...
  local log=$1 m=$2; shift 2
  $B/new/hearth serve --model $m --device cuda --port 0 --max-batch 256 "$@" 2>$log &
  SP=$!
  for _ in $(seq 600); do grep -q "listening on" $log && break; kill -0 $SP || break; sleep 0.2; done
  URL=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' $log | head -1)
  t "server up at $URL"
}
serve_stop() { kill -TERM $SP; for _ in $(seq 150); do kill -0 $SP 2>/dev/null || break; sleep 0.2; done; kill -9 $SP 2>/dev/null; t "server stopped"; }
load() { local l=$1; shift; $B/serve_load --url $URL --label "$l" --token-events 1 "$@" | tee -a $O/serve.jsonl; }
# 1. bf16 fast serving (unprofiled)
serve_start $O/serve_bf16.log $M --gpu-precision fast
$B/serve_load --url $URL --concurrency 4 --requests 8 --input 64 --output 16 --seed 1 >/dev/null
load "bf16 fast 128/128 c256" --seed 101 --concurrency 256 --requests 512 --input 128 --output 128
load "bf16 fast ttft 1024 c32" --seed 102 --concurrency 32 --requests 64 --input 1024 --output 16
serve_stop
python3 $root/tools/gen_random_model.py $F --shape llama-3.1-8b --dtype fp8 > $O/gen_fp8.log 2>&1
cp $root/models/default/tokenizer.json $root/models/default/tokenizer_config.json $F/
t "fp8 made"
# 2. FP8 fast serving with the op profile
HEARTH_CUDA_PROFILE=$O/prof_serve_fp8.txt serve_start $O/serve_fp8.log $F --gpu-precision fast
$B/serve_load --url $URL --concurrency 4 --requests 8 --input 64 --output 16 --seed 1 >/dev/null
load "fp8 fast 128/128 c256 (profiled)" --seed 103 --concurrency 256 --requests 512 --input 128 --output 128
load "fp8 fast ttft 1024 c32 (profiled)" --seed 104 --concurrency 32 --requests 64 --input 1024 --output 16
serve_stop
head -30 $O/prof_serve_fp8.txt
# 3. the peer
timeout 60 python3 peer_transformers.py $M --batches 1,64 2>$O/peer.err | tee $O/peer.jsonl
tail -2 $O/peer.err
t "peer done"
# 4. batch-1 decode: FP8 and Q4_K against their byte rooflines (new and old Q4_K GEMV); prefill with tensor-core attention
$B/new/hearth bench --model $F --device cuda --gpu-precision fast -p 512 -n 128 --repeat 3 --roofline 2>&1 | tee $O/bench_fp8.txt
for v in new old; do
  echo "== q4_k $v" >> $O/bench_q4k.txt
  $B/$v/hearth bench --model /tmp/q4k8b.gguf --device cuda -p 0 -n 128 --repeat 3 --roofline >> $O/bench_q4k.txt 2>&1
done
cat $O/bench_q4k.txt
$B/new/hearth bench --model $M --device cuda --gpu-precision fast -p 4096 -n 0 --repeat 2 2>&1 | grep -E "^pp" | sed 's/^/bf16 fast: /' | tee -a $O/bench_fp8.txt
t "benches"
# 5. long-context decode at batch 1 (f32 KV)
for d in 1024 32768; do
  echo "== depth $d" >> $O/bench_depth.txt
  $B/new/hearth bench --model $M --device cuda --gpu-precision fast -p 0 -n 64 -d $d --repeat 2 --no-warmup 2>&1 | grep -E "^tg|kv " | tee -a $O/bench_depth.txt
  t "depth $d"
done
echo "== depth 32768 kv q8" >> $O/bench_depth.txt
$B/new/hearth bench --model $M --device cuda --gpu-precision fast --kv-quant 8 -p 0 -n 64 -d 32768 --repeat 2 --no-warmup 2>&1 | grep -E "^tg|kv " | tee -a $O/bench_depth.txt
t "all done"
