#!/usr/bin/env bash
# CPU LoRA training speed: `hearth train sft` on a random-weight model in a
# 0.5B shape (Qwen2.5-0.5B's geometry as a llama: hidden 896, 24 layers,
# 14 q / 2 kv heads, FFN 4864, vocabulary 151,936, tied output; bf16).
#
#   bench/cpu/train.sh [BUILD_DIR]        (default BUILD_DIR: build)
#
# 1. makes the model with tools/gen_random_model.py --shape llama-0.5b
#    (plain Python, no torch) into $BENCH_DIR (default .deps/bench-train,
#    git-ignored) unless it is there, with the built-in model's tokenizer
#    beside it (the data's ids then use the first 4,096 of its rows);
# 2. writes $EXAMPLES prompt / completion lines of about $SEQ tokens;
# 3. runs `hearth train sft` for $STEPS steps of $BATCH examples, LoRA rank
#    $RANK on $TARGET, $THREADS threads, and prints its tokens/s (every
#    token of a step, forward and backward, over the steps' time; model
#    loading and the transposed copies the backward uses are not counted),
#    and tokens per CPU-second of the process (the log's "tokens" over
#    "cpu_s"), which a busy machine changes less than the wall-clock rate.
# 4. runs the peer, bench/cpu/train_torch_peer.py (plain torch, LoRA as PEFT
#    defines it, f32, autograd), on the same model with the same steps,
#    sequence length, rank and threads, when a python3 with torch is found
#    ($PEER_PYTHON, else /usr/bin/python3 or python3: Debian's python3-torch);
#    PEFT and transformers themselves are not in Debian 12.
# Environment: STEPS (4), BATCH (1), SEQ (256), RANK (16), TARGET (all-linear), THREADS (2), EXAMPLES (8).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
dir=${BENCH_DIR:-.deps/bench-train}
steps=${STEPS:-4} batch=${BATCH:-1} seq=${SEQ:-256} rank=${RANK:-16} target=${TARGET:-all-linear}
threads=${THREADS:-2} examples=${EXAMPLES:-8}
model=$dir/llama-0.5b
if [ ! -f "$model/config.json" ]; then
  mkdir -p "$model"
  python3 tools/gen_random_model.py "$model" --shape llama-0.5b --dtype bf16
fi
cp models/default/tokenizer.json models/default/tokenizer_config.json "$model/"
data=$dir/train.jsonl
python3 - "$data" "$examples" "$seq" <<'PY'
import json, sys
path, n, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
words = "In the beginning God created the heaven and the earth and the earth was without form and void".split()
with open(path, "w") as f:
    for i in range(n):
        text = " ".join(words[(i + k) % len(words)] for k in range(seq))  # about a token a word, cut to --seq-len
        f.write(json.dumps({"prompt": text[: len(text) // 4], "completion": " " + text[len(text) // 4:]}) + "\n")
PY
out=$dir/out
rm -rf "$out"
echo "hearth train sft --model $model --steps $steps --batch $batch --seq-len $seq --rank $rank --target $target --threads $threads"
/usr/bin/time -v "$build/hearth" train sft --model "$model" --data "$data" --out "$out" --steps "$steps" --batch "$batch" \
  --seq-len "$seq" --rank "$rank" --alpha $((2 * rank)) --target "$target" --threads "$threads" --no-plot 2>&1 |
  grep -E "^sft|^step|tokens/s|Maximum resident|Elapsed" || true
python3 - "$out/log.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
tps = [r["tokens_per_s"] for r in rows]
per_cpu = [r["tokens"] / r["cpu_s"] for r in rows]
med = lambda v: sorted(v)[len(v) // 2]
print("steps %d, tokens/s per step: %s; median %.1f tokens/s, %.2f tokens per CPU-second (every thread's time)"
      % (len(tps), ", ".join("%.1f" % t for t in tps), med(tps), med(per_cpu)))
PY
peer_py=${PEER_PYTHON:-}
if [ -z "$peer_py" ]; then
  for p in /usr/bin/python3 python3; do
    if "$p" -c 'import torch, numpy' 2>/dev/null; then peer_py=$p; break; fi
  done
fi
if [ -n "$peer_py" ]; then
  echo "peer: $peer_py bench/cpu/train_torch_peer.py $model --steps $steps --seq $seq --rank $rank --threads $threads"
  OPENBLAS_NUM_THREADS=$threads "$peer_py" bench/cpu/train_torch_peer.py "$model" --steps "$steps" --seq "$seq" --rank "$rank" --threads "$threads" | tail -1
else
  echo "peer: no python3 with torch here; not compared"
fi
