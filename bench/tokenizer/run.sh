#!/usr/bin/env bash
# Tokenizer encode throughput: hearth (tok_bench) against HF tokenizers
# (hf_bench.py), one thread each, same text, same machine, same run.
#   bench/tokenizer/run.sh TOK_BENCH DEPS_DIR [OUT_DIR]
# TOK_BENCH: the binary from bench/tokenizer/build.sh; DEPS_DIR: the folder
# holding <name>/tokenizer.json (.deps/tokenizers). The text is the fixture
# corpus (tests/fixtures/tokenizer/corpus.json), one string per line (line
# breaks inside a string become spaces), repeated to about BENCH_MB MB (4).
# BENCH_NAMES picks the tokenizers, BENCH_ROUNDS the rounds (best one counts).
set -euo pipefail
cd "$(dirname "$0")/../.."
bench=$1
deps=$2
out=${3:-/tmp/tokbench}
mkdir -p "$out"
python3 - "$out/text.txt" "${BENCH_MB:-4}" <<'PY'
import json, sys
c = json.load(open("tests/fixtures/tokenizer/corpus.json", encoding="utf-8"))
lines = [s.replace("\r", " ").replace("\n", " ") for s in c]
text = "\n".join(lines) + "\n"
reps = max(1, int(float(sys.argv[2]) * 1e6) // len(text.encode()))
open(sys.argv[1], "w", encoding="utf-8").write(text * reps)
PY
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
rounds=${BENCH_ROUNDS:-3}
pin=${BENCH_CPU:+taskset -c $BENCH_CPU}  # BENCH_CPU: one core for both, one after the other
for name in ${BENCH_NAMES:-qwen3 llama3_1 gemma3 deepseek_v3 gptoss llama2}; do
  [ -f "$deps/$name/tokenizer.json" ] || continue
  $pin "$bench" "$deps/$name/tokenizer.json" "$out/text.txt" "$rounds" | tee -a "$out/results.jsonl"
  $pin python3 bench/tokenizer/hf_bench.py "$deps/$name/tokenizer.json" "$out/text.txt" "$rounds" | tee -a "$out/results.jsonl"
done
