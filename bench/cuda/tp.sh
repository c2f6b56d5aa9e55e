#!/usr/bin/env bash
# Tensor parallelism on one host with several GPUs (NCCL between them, NVLink
# multicast off): for N = 1, 2, 4, 8 (those the host has GPUs for)
#   1. the golden models split over N GPUs against one GPU and transformers
#      (model_test_tp with HEARTH_TEST_DEVICE=cuda);
#   2. an 8B-shaped random bf16 model (tools/gen_random_model.py): the
#      all-position logits of a prompt split over N GPUs against N = 1 (max
#      abs difference, and the share of positions whose argmax agrees);
#   3. decode and prefill speed at each N (hearth bench -p 512 -n 128);
#   4. serving throughput at each N: bench/serve_load at concurrency 64,
#      512-token prompts, 128 new tokens, against `hearth serve --tp N`.
# Results: OUT/tp.jsonl and the logs beside it.
#
#   bench/cuda/tp.sh [BUILD_DIR] [OUT]      (defaults: build, build/tp)
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
b=${1:-$root/build}
out=${2:-$root/build/tp}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$ngpu" -ge 1 ] || { echo "tp.sh: no GPU" >&2; exit 1; }
m=/tmp/hearth-llama-3.1-8b-bf16
[ -f "$m/config.json" ] || python3 "$root/tools/gen_random_model.py" "$m" --shape llama-3.1-8b --dtype bf16 >"$out/gen.log" 2>&1
ids=$(python3 -c "print(','.join(str((i * 7919) % 120000 + 10) for i in range(64)))")
: >"$out/tp.jsonl"
HEARTH_TEST_DEVICE=cuda HEARTH_TEST_TP_MAX=$ngpu "$b/tests/model_test_tp" >"$out/golden.log" 2>&1
echo "golden models over up to $ngpu GPUs: $(tail -n 1 "$out/golden.log")"
for n in 1 2 4 8; do
  [ "$n" -le "$ngpu" ] || continue
  "$b/hearth" logits --model "$m" --device cuda --tp "$n" --ids "$ids" --all >"$out/logits_$n.json" 2>"$out/logits_$n.log"
  "$b/hearth" bench --model "$m" --device cuda --tp "$n" -p 512 -n 128 --repeat 3 --json >"$out/bench_$n.json" 2>"$out/bench_$n.log"
  port=$((18400 + n))
  "$b/hearth" serve --model "$m" --device cuda --tp "$n" --port "$port" >"$out/serve_$n.log" 2>&1 &
  pid=$!
  for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
  "$b/serve_load" --url "http://127.0.0.1:$port" --concurrency 64 --requests 256 --input 512 --output 128 --vocab 120000 \
    --label "tp$n" >"$out/serve_$n.json" 2>>"$out/serve_$n.log"
  kill "$pid"; wait "$pid" 2>/dev/null
  python3 - "$out" "$n" <<'EOF' >>"$out/tp.jsonl"
import json, sys
out, n = sys.argv[1], int(sys.argv[2])
def rows(k):
    return json.load(open(f"{out}/logits_{k}.json"))["logits"]
a, b = rows(1), rows(n)
diff = max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))
agree = sum(ra.index(max(ra)) == rb.index(max(rb)) for ra, rb in zip(a, b)) / len(a)
bench = json.load(open(f"{out}/bench_{n}.json"))
try:
    serve = json.loads(open(f"{out}/serve_{n}.json").read().splitlines()[-1])
except Exception:
    serve = None
print(json.dumps({"n": n, "logits_max_abs_diff_vs_1": diff, "argmax_agree_vs_1": agree, "bench": bench, "serve": serve}))
EOF
  tail -n 1 "$out/tp.jsonl"
done
