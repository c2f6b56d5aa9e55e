#!/usr/bin/env bash
# The load generator (bench/serve_load) against hearth serving the built-in
# model: a closed-loop and an open-loop run with a shared prefix report every
# request, the exact token counts asked for, prefix-cache hits for the shared
# prefix, and ordered latency percentiles.
#   test_serve_load.sh HEARTH SERVE_LOAD MODEL_DIR
set -euo pipefail
hearth=$1 load=$2 model=$3
tmp=$(mktemp -d)
"$hearth" serve --model "$model" --port 0 --threads 2 2>"$tmp/log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 300); do grep -q "listening on" "$tmp/log" && break; sleep 0.1; done
url=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$tmp/log" | head -1)
[ -n "$url" ] || { echo "FAIL: the server did not start"; cat "$tmp/log"; exit 1; }
"$load" --url "$url" --concurrency 3 --requests 7 --input 20 --output 9 >"$tmp/closed.json"
"$load" --url "$url" --rate 50 --requests 6 --input 40 --output 5 --shared-prefix 32 --shared-frac 1 --seed 3 >"$tmp/open.json"
# an unreachable server: every request fails, exit status 1
if "$load" --url http://127.0.0.1:1 --concurrency 1 --requests 2 --input 4 --output 2 >"$tmp/dead.json"; then
  echo "FAIL: a run where every request failed exited 0"; exit 1
fi
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
c = json.load(open(d + "/closed.json"))
o = json.load(open(d + "/open.json"))
dead = json.load(open(d + "/dead.json"))
def check(r, n, i, out):
    assert r["errors"] == 0, r
    assert r["prompt_tokens"] == n * i and r["output_tokens"] == n * out, r
    for k in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        s = r[k]
        assert 0 <= s["p50"] <= s["p90"] <= s["p99"], (k, s)
    assert r["ttft_ms"]["p99"] <= r["e2e_ms"]["p99"] and r["output_tok_s"] > 0, r
check(c, 7, 20, 9)
assert c["mode"] == "closed" and c["concurrency"] == 3 and c["cached_tokens"] == 0, c
check(o, 6, 40, 5)
# every request after the first shares 32 tokens: two full 16-token blocks each, at least once cached
assert o["mode"] == "open" and o["cached_tokens"] >= 32, o
assert dead["errors"] == 2 and "first_error" in dead, dead
print("serve_load: closed", c["output_tok_s"], "tok/s; open", o["output_tok_s"], "tok/s; cached", o["cached_tokens"])
PY
