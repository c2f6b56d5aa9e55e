#!/usr/bin/env bash
# gpu_verbs.sh — every verb a user types, on every golden model, on a device:
# `generate` (greedy ids from token ids, compared with the CPU's), `serve`
# (a server on the device answering a plain and a streamed completion of
# token-id prompts; the folder is copied with the built-in model's tokenizer,
# since the golden folders hold none) and `bench` (a short prefill and decode).
# Run by tools/gpu_check.sh; prints one line per model and verb and exits
# non-zero if any failed.
#
#   tools/gpu_verbs.sh HEARTH [DEVICE (cuda)] [LOGDIR]
#
# GPU_VERBS_MODELS=GLOB picks golden folders (default: all).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
h=$1 dev=${2:-cuda} logs=${3:-/tmp/gpu_verbs}
mkdir -p "$logs"
fails=0 n=0
say() { printf '%-24s %-9s %-5s %s\n' "$1" "$2" "$3" "$4"; [ "$3" = FAIL ] && fails=$((fails + 1)); n=$((n + 1)); }
for d in "$root"/tests/fixtures/golden/${GPU_VERBS_MODELS:-*}/; do
  m=$(basename "$d")
  [ -f "$d/config.json" ] || continue
  # generate: eight greedy ids from four, the device against the CPU
  want=$("$h" generate --model "$d" --device cpu --temp 0 --seed 1 --print-ids --ignore-eos -n 8 --ids 1,2,3,4 2>"$logs/$m.cpu.err" | tail -n 1)
  got=$("$h" generate --model "$d" --device "$dev" --temp 0 --seed 1 --print-ids --ignore-eos -n 8 --ids 1,2,3,4 2>"$logs/$m.gen.err" | tail -n 1)
  if [ "$(echo "$got" | wc -w)" != 8 ]; then say "$m" generate FAIL "printed '$got' ($(tail -n 1 "$logs/$m.gen.err"))"
  elif [ "$got" != "$want" ]; then say "$m" generate FAIL "ids $got, the CPU's $want"
  else say "$m" generate PASS "$got"; fi
  # bench: a short prefill and decode
  if out=$("$h" bench --model "$d" --device "$dev" -p 32 -n 16 --repeat 1 2>&1) && echo "$out" | grep -q '^tg'; then
    say "$m" bench PASS "$(echo "$out" | grep -E '^(pp|tg)' | awk '{printf "%s %s  ", $1, $2}')"
  else say "$m" bench FAIL "$(echo "$out" | tail -n 1)"; fi
  # serve: a plain and a streamed completion
  if [ "$m" = diffusion_gemma-f32 ]; then say "$m" serve SKIP "denoising models are served through the same code, checked by test_serve_diffusion"; continue; fi
  t=$(mktemp -d)
  cp -r "$d"/. "$t"/ && cp "$root/models/default/tokenizer.json" "$root/models/default/tokenizer_config.json" "$t"/
  "$h" serve --model "$t" --device "$dev" --port 0 2>"$logs/$m.serve.err" &
  sp=$!
  for _ in $(seq 300); do grep -q "listening on" "$logs/$m.serve.err" && break; kill -0 $sp 2>/dev/null || break; sleep 0.1; done
  url=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' "$logs/$m.serve.err" | head -n 1)
  if r=$(python3 - "$url" <<'PY' 2>&1
import json, sys, urllib.request
url = sys.argv[1]
def post(body):
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=60).read().decode()
base = {"prompt": [1, 2, 3, 4], "max_tokens": 8, "temperature": 0, "ignore_eos": True}
plain = json.loads(post(base))
assert plain["usage"]["completion_tokens"] == 8 and plain["choices"][0]["finish_reason"] == "length", plain
events = [json.loads(l[6:]) for l in post(dict(base, stream=True)).splitlines() if l.startswith("data: {")]
text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
assert text == plain["choices"][0]["text"], (text, plain["choices"][0]["text"])
print("8 tokens, plain and streamed alike")
PY
  ); then say "$m" serve PASS "$r"; else say "$m" serve FAIL "$(echo "$r" | tail -n 1) ($(tail -n 1 "$logs/$m.serve.err"))"; fi
  kill -TERM $sp 2>/dev/null; wait $sp 2>/dev/null
  rm -rf "$t"
done
echo "gpu_verbs: $((n - fails)) of $n passed on $dev"
[ $fails = 0 ]
