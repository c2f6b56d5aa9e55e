#!/usr/bin/env bash
# `hearth train sft --packing` and `--checkpoint-layers` on the CPU, on the
# random-weight 0.5B-shaped model of bench/cpu/train.sh (made the same way
# into $BENCH_DIR, default .deps/bench-train, unless it is there).
#
#   bench/cpu/train_pack_ckpt.sh [BUILD_DIR]        (default BUILD_DIR: build)
#
# 1. Packing: $SHORT prompt / completion lines of 6 to about 40 tokens, one
#    epoch unpacked (--batch 8) and packed into sequences of $PACK_LEN tokens
#    (--packing --batch 1), alternately $ROUNDS times: tokens/s over the run's
#    steps (train_run's own figure: every token, forward and backward) and
#    tokens per CPU-second (the log's "tokens" over "cpu_s", steadier on a
#    shared machine).
# 2. Checkpoints: one step on one example of $LONG tokens, without
#    checkpoints and with --checkpoint-layers 1 and $CK: the peak resident
#    memory (/usr/bin/time -v), the trainer's own count of the activations it
#    holds, and the step's wall-clock and CPU time.
# Environment: SHORT (64), PACK_LEN (512), LONG (1024), CK (5), ROUNDS (2),
# RANK (16), TARGET (all-linear), THREADS (2).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
dir=${BENCH_DIR:-.deps/bench-train}
short=${SHORT:-64} pack_len=${PACK_LEN:-512} long=${LONG:-1024} ck=${CK:-5} rounds=${ROUNDS:-2}
rank=${RANK:-16} target=${TARGET:-all-linear} threads=${THREADS:-2}
model=$dir/llama-0.5b
if [ ! -f "$model/config.json" ]; then
  mkdir -p "$model"
  python3 tools/gen_random_model.py "$model" --shape llama-0.5b --dtype bf16
fi
cp models/default/tokenizer.json models/default/tokenizer_config.json "$model/"
python3 - "$dir/short.jsonl" "$short" "$dir/long.jsonl" "$long" <<'PY'
import json, sys
words = "In the beginning God created the heaven and the earth and the earth was without form and void".split()
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        n = 4 + (i * 7) % 31  # about a token a word
        text = [words[(i + k) % len(words)] for k in range(n)]
        f.write(json.dumps({"prompt": " ".join(text[:2]), "completion": " " + " ".join(text[2:])}) + "\n")
with open(sys.argv[3], "w") as f:
    n = int(sys.argv[4])
    text = " ".join(words[k % len(words)] for k in range(n))
    f.write(json.dumps({"prompt": text[: len(text) // 4], "completion": " " + text[len(text) // 4:]}) + "\n")
PY
common=(--model "$model" --rank "$rank" --alpha $((2 * rank)) --target "$target" --threads "$threads" --no-plot)
summary() { # LOG: tokens/s over the steps and tokens per CPU-second
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
tok, wall, cpu = sum(r["tokens"] for r in rows), sum(r["tokens"] / r["tokens_per_s"] for r in rows), sum(r["cpu_s"] for r in rows)
print("%d steps, %d tokens: %.1f tokens/s, %.2f tokens per CPU-second, first loss %.4f" % (len(rows), tok, tok / wall, tok / cpu, rows[0]["loss"]))
PY
}
echo "== packing: $short short examples, one epoch"
for round in $(seq "$rounds"); do
  for mode in unpacked packed; do
    out=$dir/out-$mode
    rm -rf "$out"
    if [ $mode = unpacked ]; then args=(--batch 8 --seq-len "$pack_len"); else args=(--packing --batch 1 --seq-len "$pack_len"); fi
    "$build/hearth" train sft "${common[@]}" --data "$dir/short.jsonl" --out "$out" --epochs 1 "${args[@]}" 2>"$dir/$mode.err" ||
      { cat "$dir/$mode.err"; exit 1; }
    grep -h "packed into" "$dir/$mode.err" || true
    echo "round $round $mode: $(summary "$out/log.jsonl")"
  done
done
echo "== checkpoints: one step on one example of $long tokens"
for c in 0 1 "$ck"; do
  out=$dir/out-ck$c
  rm -rf "$out"
  args=()
  [ "$c" != 0 ] && args=(--checkpoint-layers "$c")
  /usr/bin/time -v "$build/hearth" train sft "${common[@]}" --data "$dir/long.jsonl" --out "$out" --steps 1 --batch 1 \
    --seq-len "$long" "${args[@]}" 2>"$dir/ck$c.err" || { cat "$dir/ck$c.err"; exit 1; }
  rss=$(grep "Maximum resident" "$dir/ck$c.err" | awk '{print $NF}')
  acts=$(grep -o "activations of a [0-9]*-token sequence: [0-9.]* MiB" "$dir/ck$c.err" | grep -o "[0-9.]* MiB")
  step=$(python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if '\"loss\"' in l][0]; print('step %.1f s wall, %.1f CPU-s, loss %.6f' % (r['tokens']/r['tokens_per_s'], r['cpu_s'], r['loss']))" "$out/log.jsonl")
  echo "--checkpoint-layers ${c/#0/off}: peak RSS $((rss / 1024)) MiB, activations held $acts, $step"
done
