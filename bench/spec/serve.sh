#!/usr/bin/env bash
# serve.sh — speculative decoding under concurrent load: `hearth serve` on a
# model, plain and with each speculative variant, driven by
# bench/serve_load (greedy streaming completions of random token-id prompts,
# closed loop) at a few concurrencies; prints one line per point with the
# output tok/s and the server's /stats acceptance.
#
#   bench/spec/serve.sh [MODEL] [DRAFT_MODEL] [BUILD]   (defaults: the built-in model, the
#                                                       2-layer copy make_models.py makes, build)
# Environment: SPEC_SERVE_CONCS (default "1 8"), SPEC_SERVE_IO ("64/64"), SPEC_BENCH_DIR.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
D=${SPEC_BENCH_DIR:-/tmp/hearth-spec-bench}
model=${1:-$root/models/default}
draft=${2:-$D/builtin-2l}
build=${3:-$root/build}
[ -d "$D/builtin-2l" ] || python3 "$root/bench/spec/make_models.py" "$D" --builtin "$root/models/default" >/dev/null
io=${SPEC_SERVE_IO:-64/64}
in=${io%/*} out=${io#*/}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
variant() { # label, serve args...
  local label=$1; shift
  "$build/hearth" serve --model "$model" --port 0 --max-batch 64 "$@" 2>"$log" &
  local pid=$!
  for _ in $(seq 400); do grep -q "listening on" "$log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.25; done
  local url
  url=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$log" | head -1)
  if [ -z "$url" ]; then
    kill $pid 2>/dev/null
    wait $pid
    echo "$label: the server did not start (exit status $?)"
    cat "$log"
    return
  fi
  "$build/serve_load" --url "$url" --concurrency 2 --requests 2 --input 16 --output 8 --seed 1 >/dev/null
  for c in ${SPEC_SERVE_CONCS:-1 8}; do
    local r
    r=$("$build/serve_load" --url "$url" --concurrency "$c" --requests $((c < 4 ? 4 : 2 * c)) --input "$in" \
         --output "$out" --seed 7 --label "$label")
    printf '%-22s c=%-3s %s tok/s\n' "$label" "$c" "$(python3 -c 'import json,sys; print(round(json.loads(sys.argv[1])["output_tok_s"],1))' "$r")"
  done
  curl -s "$url/stats" | python3 -c '
import json, sys
sp = json.load(sys.stdin).get("speculative", {})
print("   " + ", ".join("%s: drafted %d accepted %d" % (k, v["drafted"], v["accepted"]) for k, v in sp.items() if v["drafted"]))'
  kill $pid 2>/dev/null
  wait $pid 2>/dev/null
}
variant "plain"
variant "ngram 4" --spec-tokens 4
variant "draft 2-layer 4" --spec-tokens 4 --draft-model "$draft"
