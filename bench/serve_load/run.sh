#!/usr/bin/env bash
# The serving benchmark: bench/serve_load's closed-loop sweep over
# concurrency for fixed input/output lengths, a shared-prefix mix and an
# open-loop (Poisson) sweep, against one server; results as JSON lines, then
# the plot (bench/serve_load/plot.sh, where gnuplot is installed).
#
#   bench/serve_load/run.sh [--url URL | --model DIR [--device D]] [--build DIR] [--out DIR] [--quick]
#
# Without --url it starts `hearth serve` on the model (the built-in one by
# default) on a free port and stops it at the end. --quick: fewer points
# (concurrency 1, 8, 32; one shape), for a CPU. Results: OUT/results.jsonl
# (one object per point, labelled "IN/OUT", "shared" or "poisson").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
url="" model="$root/models/default" device="" build="$root/build" out="$root/build/serve_load" quick=0
while [ $# -gt 0 ]; do
  case $1 in
    --url) url=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    *) echo "usage: $0 [--url URL | --model DIR [--device D]] [--build DIR] [--out DIR] [--quick]" >&2; exit 2 ;;
  esac
done
load=$build/serve_load
[ -x "$load" ] || { echo "no $load: build with libcurl's headers (tools/setup.sh --bench, then make build)" >&2; exit 1; }
mkdir -p "$out"
res=$out/results.jsonl
: >"$res"
pid=""
if [ -z "$url" ]; then
  "$build/hearth" serve --model "$model" --port 0 --max-batch 256 ${device:+--device "$device"} 2>"$out/server.log" &
  pid=$!
  trap '[ -n "$pid" ] && kill $pid 2>/dev/null; wait 2>/dev/null' EXIT
  for _ in $(seq 1200); do grep -q "listening on" "$out/server.log" && break; kill -0 $pid || break; sleep 0.25; done
  url=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$out/server.log" | head -1)
  [ -n "$url" ] || { echo "the server did not start:" >&2; cat "$out/server.log" >&2; exit 1; }
fi
seed=100
point() { # label args...: each point its own prompts (a new seed), so only the shared mix hits the prefix cache
  local label=$1; shift
  seed=$((seed + 1))
  "$load" --url "$url" --label "$label" --seed $seed --token-events 1 "$@" | tee -a "$res"
}
# warm up (first-use costs: graphs, the first allocations)
"$load" --url "$url" --concurrency 4 --requests 8 --input 64 --output 16 --seed 1 >/dev/null
if [ $quick = 1 ]; then concs="1 8 32"; shapes="128/128"; else concs="1 8 32 64 128 256"; shapes="128/128 1024/128 128/1024"; fi
for shape in $shapes; do
  in=${shape%/*} o=${shape#*/}
  for c in $concs; do
    n=$((c < 8 ? 4 : 2 * c))
    point "$shape" --concurrency "$c" --requests "$n" --input "$in" --output "$o"
  done
done
# a shared-prefix mix: 80 % of the requests open with the same three quarters of their prompt
if [ $quick = 1 ]; then sin=512; else sin=1024; fi
for c in $concs; do
  n=$((c < 8 ? 4 : 2 * c))
  point "shared prefix" --concurrency "$c" --requests "$n" --input $sin --output 128 --shared-prefix $((sin * 3 / 4)) --shared-frac 0.8
done
# open loop: Poisson arrivals at rising rates (128/128)
if [ $quick = 1 ]; then rates="1 4"; else rates="1 4 16 64"; fi
for r in $rates; do
  point poisson --rate "$r" --requests $((r < 4 ? 16 : 8 * r)) --input 128 --output 128
done
echo "results: $res"
