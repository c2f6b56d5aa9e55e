#!/usr/bin/env bash
# CPU decode and prefill of a mixture-of-experts model, hearth vs llama.cpp,
# on the same GGUF files, against the active-bytes roofline.
#
#   bench/cpu/moe.sh [BUILD_DIR]        (default BUILD_DIR: build)
#
# 1. makes random-weight qwen3moe GGUFs in Qwen3-30B-A3B's geometry (hidden
#    2048, 32 q / 4 kv heads of 128, 8 of $EXPERTS experts of FFN 768 per
#    token) with $LAYERS layers and a $VOCAB-token vocabulary (defaults 4,
#    128, 32000: see tools/gen_random_gguf.c), one per type in $TYPES, into
#    $BENCH_DIR (default .deps/bench-cpu, git-ignored), unless they are there;
# 2. prints `hearth inspect` of each (total and active parameters) and the
#    bytes a decoded token reads: every non-expert matrix and vector once
#    (attention, norms, router, output head), one row of the token
#    embedding, and experts_used / experts of each layer's expert stacks;
# 3. measures the machine's read bandwidth (bench/cpu/membw.c) at each
#    thread count;
# 4. for each file and thread count runs `hearth bench` and llama.cpp
#    (bench/cpu/llamacpp_bench.mjs through node-llama-cpp in $NODE_DIR,
#    default .deps/bench-node) alternately, $ROUNDS times each, pp$P and tg$N
#    (each the median of $R repeats after a warm-up), and prints the median
#    over the rounds, hearth / llama.cpp, and decode's fraction of the
#    active-bytes roofline (active bytes × tg tokens/s ÷ read bandwidth).
# Environment: P (128), N (64), R (1), ROUNDS (3), THREADS ("1 2"),
# TYPES ("q8_0 q4_0"), SHAPE (a3b; moe-tiny for a quick check of the script),
# LAYERS, EXPERTS, VOCAB (the shape's defaults when empty), HEARTH_ONLY=1
# skips llama.cpp.
set -euo pipefail
cd "$(dirname "$0")/../.."
b=${1:-build}
P=${P:-128} N=${N:-64} R=${R:-1} ROUNDS=${ROUNDS:-3} THREADS=${THREADS:-"1 2"} TYPES=${TYPES:-"q8_0 q4_0"}
SHAPE=${SHAPE:-a3b} LAYERS=${LAYERS:-} EXPERTS=${EXPERTS:-} VOCAB=${VOCAB:-} HEARTH_ONLY=${HEARTH_ONLY:-}
BENCH_DIR=${BENCH_DIR:-.deps/bench-cpu} NODE_DIR=${NODE_DIR:-.deps/bench-node}
mkdir -p "$BENCH_DIR"
cmake --build "$b" --target hearth_cli -j2 >/dev/null
cc -O2 -o "$BENCH_DIR/gen_random_gguf" tools/gen_random_gguf.c -lm
cc -O2 -pthread -o "$BENCH_DIR/membw" bench/cpu/membw.c
# positional overrides for the generator: LAYERS [EXPERTS [VOCAB]] (an empty one keeps the shape's value)
tag=$SHAPE over=()
if [ -n "$LAYERS$EXPERTS$VOCAB" ]; then
  defaults=$(case $SHAPE in a3b) echo "4 128 32000" ;; moe-tiny) echo "2 16 1024" ;; *) echo "unknown SHAPE $SHAPE" >&2; exit 2 ;; esac)
  read -r dl de dv <<<"$defaults"
  over=("${LAYERS:-$dl}" "${EXPERTS:-$de}" "${VOCAB:-$dv}")
  tag="$SHAPE-l${over[0]}-e${over[1]}-v${over[2]}"
fi
file_of() { echo "$BENCH_DIR/qwen3moe-$tag-$1.gguf"; }
for t in $TYPES; do
  f=$(file_of "$t")
  [ -s "$f" ] || "$BENCH_DIR/gen_random_gguf" "$f" "$t" "$SHAPE" "${over[@]}"
done

# Bytes a decoded token reads, from the file's tensor table: "active total".
active_bytes() {
  python3 - "$1" <<'PY'
import struct, sys
f = open(sys.argv[1], "rb")
def u32(): return struct.unpack("<I", f.read(4))[0]
def u64(): return struct.unpack("<Q", f.read(8))[0]
def s(): return f.read(u64()).decode()
size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # bytes of GGUF value types
def val(t):
    if t == 8: return s()
    if t == 9:
        et, n = u32(), u64()
        return [val(et) for _ in range(n)] if et in (8, 9) else f.read(size[et] * n) and None
    raw = f.read(size[t])
    return struct.unpack({4: "<I", 5: "<i", 6: "<f", 10: "<Q", 11: "<q"}.get(t, "<%dB" % size[t]), raw)[0]
assert f.read(4) == b"GGUF" and u32() == 3
nt, nkv = u64(), u64()
kv = {}
for _ in range(nkv):
    k = s(); kv[k] = val(u32())
arch = kv["general.architecture"]
used, experts = kv[arch + ".expert_used_count"], kv[arch + ".expert_count"]
per32 = {0: 128, 1: 64, 2: 18, 8: 34}  # F32, F16, Q4_0, Q8_0: bytes per 32 values
active = total = 0
for _ in range(nt):
    name = s(); nd = u32(); dims = [u64() for _ in range(nd)]; ty = u32(); u64()
    n = 1
    for d in dims: n *= d
    nbytes = n * per32[ty] // 32
    total += nbytes
    if "_exps." in name: active += nbytes * used // experts
    elif name == "token_embd.weight": active += nbytes // dims[1]
    else: active += nbytes
print(active, total)
PY
}

declare -A bw act
for th in $THREADS; do bw[$th]=$("$BENCH_DIR/membw" "$th" 5 2>/dev/null); done
if [ -z "$HEARTH_ONLY" ]; then
  [ -e "$BENCH_DIR/node_modules" ] || ln -s "$(realpath "$NODE_DIR")/node_modules" "$BENCH_DIR/node_modules"
  cp bench/cpu/llamacpp_bench.mjs "$BENCH_DIR/llamacpp_bench.mjs"   # resolves node-llama-cpp from $BENCH_DIR
fi

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg); P=$P N=$N R=$R ROUNDS=$ROUNDS; read bandwidth GB/s: $(for th in $THREADS; do printf '%s thr %s  ' "$th" "${bw[$th]}"; done)"
for t in $TYPES; do
  f=$(file_of "$t")
  act[$t]=$(active_bytes "$f")
  echo "#"
  "$b/hearth" inspect "$f" | sed -n '1,5p' | sed 's/^/# /'
  read -r a tot <<<"${act[$t]}"
  echo "# bytes read per decoded token: $a ($(python3 -c "print(f'{$a / 1e6:.1f} MB, {100 * $a / $tot:.1f}% of the file')"))"
done
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
echo
echo "| file | threads | test | hearth t/s | llama.cpp t/s | hearth / llama.cpp | decode % of active-bytes roofline (hearth / llama.cpp) |"
echo "|---|---|---|---|---|---|---|"
for t in $TYPES; do
  f=$(file_of "$t")
  read -r a tot <<<"${act[$t]}"
  for th in $THREADS; do
    h="" l=""
    for r in $(seq "$ROUNDS"); do
      h="$h$("$b/hearth" bench --model "$f" -p "$P" -n "$N" -t "$th" --repeat "$R" --json)"$'\n'
      [ -n "$HEARTH_ONLY" ] || l="$l$(node "$BENCH_DIR/llamacpp_bench.mjs" "$f" "$th" "$P" "$N" "$R" | tail -1)"$'\n'
    done
    python3 - "$t" "$th" "$P" "$N" "$a" "$tot" "${bw[$th]}" "$h" "$l" "$raw" <<'PY'
import json, statistics, sys
t, th, P, N = sys.argv[1:5]
active, total, bw = int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
def med(text):
    runs = [json.loads(x) for x in text.split("\n") if x.strip()]
    return {k: statistics.median(r[k] for r in runs) for k in ("pp_tps", "tg_tps")} if runs else None
h, l = med(sys.argv[8]), med(sys.argv[9])
roof = lambda tps: 100.0 * active * tps / (bw * 1e9)
lv = lambda k: f"{l[k]:.2f}" if l else "-"
ratio = lambda k: f"{h[k] / l[k]:.2f}" if l else "-"
name = f"{t} ({total / 1e9:.2f} GB, {active / 1e6:.0f} MB active)"
print(f"| {name} | {th} | pp{P} | {h['pp_tps']:.2f} | {lv('pp_tps')} | {ratio('pp_tps')} | |")
lroof = "%.0f%%" % roof(l["tg_tps"]) if l else "-"
rounds = lambda text: " ".join("%.0f/%.0f" % (r["pp_tps"], r["tg_tps"]) for r in map(json.loads, filter(str.strip, text.split("\n"))))
with open(sys.argv[10], "a") as raw:
    print(f"# {t} {th} thr, pp/tg per round: hearth {rounds(sys.argv[8])}; llama.cpp {rounds(sys.argv[9]) or '-'}", file=raw)
print(f"| {name} | {th} | tg{N} | {h['tg_tps']:.2f} | {lv('tg_tps')} | {ratio('tg_tps')} | {roof(h['tg_tps']):.0f}% / {lroof} |")
PY
  done
done
echo
cat "$raw"
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
