#!/usr/bin/env bash
# run.sh — speculative decoding against plain decoding, in the same run, on
# one request at a time (greedy, so every variant produces the same tokens):
#
#   bench/spec/run.sh [HEARTH_BINARY] [DEVICE]      (defaults: build/hearth, cpu)
#
# Models (made by make_models.py into $SPEC_BENCH_DIR, default /tmp/hearth-spec-bench):
#   wide-q8     a random llama, hidden 1024, 12 layers, Q8_0 (decode reads ~150 MB a token)
#   wide-2l-q8  its first 2 layers: a draft that, the weights being random, agrees with nothing
#   builtin     the built-in model (trained, 8 layers, hidden 256) and builtin-2l, its first 2 layers
#   hybrid      a random Qwen3.5-shaped hybrid (tools/gen_random_model.py --shape qwen3.5-tiny, bf16;
#               no tokenizer: its prompt is ids), whose recurrent state is rewound after a rejection
# Variants: plain; prompt lookup (ngram) with 4 and 8 drafted tokens; a
# draft model (the target itself: the acceptance upper bound, every draft is
# accepted but drafting costs a full forward; and the 2-layer copy).
# Prints one markdown row per run: tok/s of decode, the speed-up over the
# plain run of the same repeat, forward steps of the target, drafted and
# accepted tokens.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
H=${1:-$root/build/hearth}
DEV=${2:-cpu}
D=${SPEC_BENCH_DIR:-/tmp/hearth-spec-bench}
N=${SPEC_BENCH_TOKENS:-128}
R=${SPEC_BENCH_REPEATS:-2}
python3 "$root/bench/spec/make_models.py" "$D" --builtin "$root/models/default" >/dev/null
[ -f "$D/wide-q8.gguf" ] || "$H" convert "$D/wide" "$D/wide-q8.gguf" --quant q8_0 >/dev/null 2>&1
[ -f "$D/hybrid/config.json" ] || python3 "$root/tools/gen_random_model.py" "$D/hybrid" --shape qwen3.5-tiny --dtype bf16 >/dev/null
[ -f "$D/wide-2l-q8.gguf" ] || "$H" convert "$D/wide-2l" "$D/wide-2l-q8.gguf" --quant q8_0 >/dev/null 2>&1
CAT="The cat sat on the mat. The cat sat on the mat. The cat sat on the mat. The cat sat on the"
HYB="ids:$(for i in 1 2 3 4; do printf '11,22,33,44,55,66,77,88,'; done | sed 's/,$//')"
GEN="And God said, Let there be light: and there was light. And God saw the light, that it was good: and God divided the light from the darkness."
declare -A base
run() { # label, model, prompt, args...
  local label=$1 model=$2 prompt=$3; shift 3
  local out tps spec steps drafted accepted ids
  local pr=(--prompt "$prompt")
  [ "${prompt#ids:}" != "$prompt" ] && pr=(--ids "${prompt#ids:}")
  out=$("$H" generate --device "$DEV" --model "$model" --temp 0 -n "$N" --ignore-eos --stats --print-ids "$@" "${pr[@]}" 2>&1)
  tps=$(sed -n 's/.*generated [0-9]* tokens (\([0-9.]*\) tok\/s).*/\1/p' <<<"$out")
  spec=$(grep '^\[speculative' <<<"$out")
  steps=$(sed -n 's/.*, \([0-9]*\) forward steps.*/\1/p' <<<"$spec")
  drafted=$(sed -n 's/.*drafted \([0-9]*\),.*/\1/p' <<<"$spec")
  accepted=$(sed -n 's/.*accepted \([0-9]*\) (.*/\1/p' <<<"$spec")
  ids=$(head -n 1 <<<"$out" | md5sum | cut -c1-8)
  [ -z "$spec" ] && base[$model]=$tps
  printf '| %s | %s | %s | %sx | %s | %s | %s | %s |\n' "$rep" "$label" "$tps" \
    "$(awk -v a="$tps" -v b="${base[$model]}" 'BEGIN { printf "%.2f", a / b }')" "${steps:-$N}" "${drafted:--}" \
    "${accepted:--}" "$ids"
}
echo "| repeat | variant | decode tok/s | vs plain | target forwards | drafted | accepted | output (md5) |"
echo "|---|---|---|---|---|---|---|---|"
for rep in $(seq 1 "$R"); do
  run "wide-q8 plain" "$D/wide-q8.gguf" "$CAT"
  run "wide-q8 ngram 4" "$D/wide-q8.gguf" "$CAT" --spec-tokens 4
  run "wide-q8 ngram 8" "$D/wide-q8.gguf" "$CAT" --spec-tokens 8
  run "wide-q8 draft itself 4" "$D/wide-q8.gguf" "$CAT" --spec-tokens 4 --draft-model "$D/wide-q8.gguf"
  run "wide-q8 draft 2-layer 4" "$D/wide-q8.gguf" "$CAT" --spec-tokens 4 --draft-model "$D/wide-2l-q8.gguf"
  run "builtin plain" "$root/models/default" "$GEN"
  run "builtin ngram 4" "$root/models/default" "$GEN" --spec-tokens 4
  run "builtin draft itself 4" "$root/models/default" "$GEN" --spec-tokens 4 --draft-model "$root/models/default"
  run "builtin draft 2-layer 4" "$root/models/default" "$GEN" --spec-tokens 4 --draft-model "$D/builtin-2l"
  run "builtin draft 2-layer 2" "$root/models/default" "$GEN" --spec-tokens 2 --draft-model "$D/builtin-2l"
  run "hybrid plain" "$D/hybrid" "$HYB"
  run "hybrid ngram 4" "$D/hybrid" "$HYB" --spec-tokens 4
  run "hybrid draft itself 4" "$D/hybrid" "$HYB" --spec-tokens 4 --draft-model "$D/hybrid"
done
