#!/usr/bin/env bash
# CPU decode and prefill, hearth vs llama.cpp, on the same GGUF files.
#
#   bench/cpu/compare.sh [BUILD_DIR]        (default BUILD_DIR: build)
#
# 1. makes random-weight llama GGUFs in Llama-3.2-1B's shape (F16, Q8_0,
#    Q4_0) with tools/gen_random_gguf.c into $BENCH_DIR (default
#    .deps/bench-cpu, git-ignored), unless they are there already; q4_k,
#    q5_k and q6_k files are made from the F16 one by `hearth convert`; a
#    type with "-wild" after it (q8_0-wild, f16-wild) is the same shape with
#    activations that are not tame (tools/gen_random_gguf.c: attention scores
#    spread widely, so softmax produces denormal floats);
# 2. measures the machine's read bandwidth (bench/cpu/membw.c) at 1 and 2 threads;
# 3. for each file and thread count runs `hearth bench` and llama.cpp
#    (bench/cpu/llamacpp_bench.mjs through node-llama-cpp in $NODE_DIR,
#    default .deps/bench-node) alternately, $ROUNDS times each (so that a
#    drift in the shared machine's speed hits both alike): pp$P and tg$N,
#    each run the median of $R repeats after a warm-up, and the table the
#    median over the rounds;
# 4. prints a Markdown table: tokens/s each, hearth / llama.cpp, and decode's
#    fraction of the bandwidth roofline (file bytes per token × tg tokens/s
#    ÷ read bandwidth; the output matrix is the tied embedding, so every
#    byte of the file is read per token).
# Both decode steps compute the new token's logits (the output matrix is
# read every step); LOGITS=0 lets llama.cpp skip them (its step then reads
# about a quarter fewer bytes, and its roofline fraction can exceed 100%).
# Environment: P (512), N (128), R (1), ROUNDS (3), THREADS ("1 2"), TYPES ("f16 q8_0 q4_0"; add q8_0-wild for untame activations),
# SHAPE (1b; "tiny" for a quick check of the script itself), LOGITS (1).
set -euo pipefail
cd "$(dirname "$0")/../.."
b=${1:-build}
P=${P:-512} N=${N:-128} R=${R:-1} ROUNDS=${ROUNDS:-3} THREADS=${THREADS:-"1 2"} TYPES=${TYPES:-"f16 q8_0 q4_0"}
BENCH_DIR=${BENCH_DIR:-.deps/bench-cpu} NODE_DIR=${NODE_DIR:-.deps/bench-node}
mkdir -p "$BENCH_DIR"
cmake --build "$b" --target hearth_cli -j2 >/dev/null
cc -O2 -o "$BENCH_DIR/gen_random_gguf" tools/gen_random_gguf.c -lm
cc -O2 -pthread -o "$BENCH_DIR/membw" bench/cpu/membw.c
for t in f16 $TYPES; do
  f="$BENCH_DIR/llama1b-$t.gguf"
  [ -s "$f" ] && continue
  case $t in
    q4_k|q5_k|q6_k) "$b/hearth" convert "$BENCH_DIR/llama1b-f16.gguf" "$f" --quant "$t" >&2 ;;
    q4_k-wild) [ -s "$BENCH_DIR/llama1b-f16-wild.gguf" ] || "$BENCH_DIR/gen_random_gguf" "$BENCH_DIR/llama1b-f16-wild.gguf" f16 "${SHAPE:-1b}-wild"
      "$b/hearth" convert "$BENCH_DIR/llama1b-f16-wild.gguf" "$f" --quant q4_k >&2 ;;
    *-wild) "$BENCH_DIR/gen_random_gguf" "$f" "${t%-wild}" "${SHAPE:-1b}-wild" ;;
  esac
done
declare -A bw
for th in $THREADS; do bw[$th]=$("$BENCH_DIR/membw" "$th" 5 2>/dev/null); done
[ -e "$BENCH_DIR/node_modules" ] || ln -s "$(realpath "$NODE_DIR")/node_modules" "$BENCH_DIR/node_modules"
cp bench/cpu/llamacpp_bench.mjs "$BENCH_DIR/llamacpp_bench.mjs"   # resolves node-llama-cpp from $BENCH_DIR

echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg); P=$P N=$N R=$R ROUNDS=$ROUNDS LOGITS=${LOGITS:-1}; read bandwidth GB/s: $(for th in $THREADS; do printf '%s thr %s  ' "$th" "${bw[$th]}"; done)"
echo
echo "| file | threads | test | hearth t/s | llama.cpp t/s | hearth / llama.cpp | decode % of roofline (hearth / llama.cpp) |"
echo "|---|---|---|---|---|---|---|"
for t in $TYPES; do
  f="$BENCH_DIR/llama1b-$t.gguf"
  bytes=$(stat -c %s "$f")
  for th in $THREADS; do
    h="" l=""
    for r in $(seq "$ROUNDS"); do
      h="$h$("$b/hearth" bench --model "$f" -p "$P" -n "$N" -t "$th" --repeat "$R" --json)"$'\n'
      l="$l$(node "$BENCH_DIR/llamacpp_bench.mjs" "$f" "$th" "$P" "$N" "$R" | tail -1)"$'\n'
    done
    python3 - "$t" "$th" "$P" "$N" "$bytes" "${bw[$th]}" "$h" "$l" <<'PY'
import json, statistics, sys
t, th, P, N, nbytes, bw = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), float(sys.argv[6])
def med(text):
    runs = [json.loads(x) for x in text.split("\n") if x.strip()]
    return {k: statistics.median(r[k] for r in runs) for k in ("pp_tps", "tg_tps")}
h, l = med(sys.argv[7]), med(sys.argv[8])
roof = lambda tps: 100.0 * nbytes * tps / (bw * 1e9)
print(f"| {t} ({nbytes / 1e9:.2f} GB) | {th} | pp{P} | {h['pp_tps']:.2f} | {l['pp_tps']:.2f} | {h['pp_tps'] / l['pp_tps']:.2f} | |")
print(f"| {t} ({nbytes / 1e9:.2f} GB) | {th} | tg{N} | {h['tg_tps']:.2f} | {l['tg_tps']:.2f} | {h['tg_tps'] / l['tg_tps']:.2f} | {roof(h['tg_tps']):.0f}% / {roof(l['tg_tps']):.0f}% |")
PY
  done
done
echo
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
