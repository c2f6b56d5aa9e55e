#!/usr/bin/env bash
# The batch benchmark: the same N completions (random token-id prompts of
# IN tokens, OUT tokens out, greedy, ignore_eos) run two ways on one machine,
# one after the other, each ROUNDS times alternately:
#   - offline: `hearth batch IN.jsonl -o OUT.jsonl` (the OpenAI Batch API's
#     lines: {"custom_id", "method", "url": "/v1/completions", "body"});
#   - served: `hearth serve` driven by bench/serve_load with N requests at N
#     concurrent (every request sent at once, streamed, as a client would
#     send a batch over HTTP).
# Prints output tokens/s of each run and the median ratio offline / served.
#
#   bench/batch/run.sh [--model DIR] [--build DIR] [-n N] [--input L] [--output L]
#                      [--rounds R] [--concurrency C] [--device D] [--out DIR]
#
# --concurrency: `hearth batch`'s rows in flight and the server's --max-batch
# (default 256): the same scheduler limit both ways.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
model="$root/models/default" build="$root/build" n=1000 in=128 outl=128 rounds=3 conc=256 device="" out="$root/build/batch_bench"
while [ $# -gt 0 ]; do
  case $1 in
    --model) model=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    -n) n=$2; shift 2 ;;
    --input) in=$2; shift 2 ;;
    --output) outl=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --concurrency) conc=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) sed -n '2,17p' "$0" >&2; exit 2 ;;
  esac
done
h=$build/hearth load=$build/serve_load
[ -x "$load" ] || { echo "no $load: build with libcurl's headers (tools/setup.sh --bench, then make build)" >&2; exit 1; }
mkdir -p "$out"
# the lines: prompts as serve_load draws them (random ids in [10, 1000)), one seed
python3 - "$n" "$in" "$outl" >"$out/in.jsonl" <<'PY'
import json, random, sys
n, L, O = map(int, sys.argv[1:4])
r = random.Random(1)
for i in range(n):
    body = {"prompt": [r.randrange(10, 1000) for _ in range(L)], "max_tokens": O, "ignore_eos": True, "temperature": 0}
    print(json.dumps({"custom_id": "r%d" % i, "method": "POST", "url": "/v1/completions", "body": body}))
PY
offline() {
  rm -f "$out/out.jsonl"
  local t0 t1
  t0=$(date +%s.%N)
  "$h" batch "$out/in.jsonl" -o "$out/out.jsonl" --model "$model" --concurrency "$conc" ${device:+--device "$device"} 2>"$out/batch.log"
  t1=$(date +%s.%N)
  python3 - "$out/out.jsonl" "$t0" "$t1" "$n" <<'PY'
import json, sys
toks, ok = 0, 0
for line in open(sys.argv[1]):
    o = json.loads(line)
    b = (o.get("response") or {}).get("body") or {}
    if b.get("usage"):
        toks += b["usage"]["completion_tokens"]; ok += 1
if ok != int(sys.argv[4]):
    sys.exit("hearth batch answered %d of %s rows" % (ok, sys.argv[4]))
print("%.1f" % (toks / (float(sys.argv[3]) - float(sys.argv[2]))))
PY
}
served() {
  "$h" serve --model "$model" --port 0 --max-batch "$conc" --max-connections-per-address $((n + 64)) ${device:+--device "$device"} 2>"$out/serve.log" &
  local pid=$! url=""
  for _ in $(seq 1200); do grep -q "listening on" "$out/serve.log" && break; kill -0 $pid || break; sleep 0.1; done
  url=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$out/serve.log" | head -1)
  [ -n "$url" ] || { echo "the server did not start" >&2; cat "$out/serve.log" >&2; return 1; }
  local t0 t1
  t0=$(date +%s.%N)
  "$load" --url "$url" --concurrency "$n" --requests "$n" --input "$in" --output "$outl" --seed 1 --timeout 3600 >"$out/load.json"
  t1=$(date +%s.%N)
  kill -TERM $pid; wait $pid 2>/dev/null || true
  # the server's start is outside the timed span, as the batch's model load is not (see the note)
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["errors"] and sys.exit("serve_load: %d errors: %s" % (d["errors"], d.get("first_error"))); print("%.1f" % d["output_tok_s"])' "$out/load.json"
}
echo "# hearth batch vs hearth serve + serve_load: $n prompts, $in in / $outl out, concurrency $conc, $(nproc) CPUs"
echo "| round | hearth batch tok/s | serve (HTTP, $n concurrent) tok/s | ratio |"
echo "|---|---|---|---|"
ratios=()
for r in $(seq "$rounds"); do
  a=$(offline) b=$(served)
  q=$(python3 -c "print('%.2f' % ($a / $b))")
  ratios+=("$q")
  echo "| $r | $a | $b | $q |"
done
echo "median ratio: $(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}')"
